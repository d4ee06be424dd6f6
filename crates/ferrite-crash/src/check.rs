//! The oracle: recover a crash image, run fsck, compare the visible tree with the
//! model; explore crashes during that recovery; probe that the recovered pool works.
//!
//! Invariants:
//! - A crash image passes only if mount succeeds (or, during mkfs, fails cleanly),
//!   fsck reports no error, every mapped data page matches its checksum, and the
//!   visible tree equals one of the expected model
//!   states exactly (names, types, modes, owners, link counts, sizes, contents,
//!   symlink targets, extended attributes, times, hard-link identity).
//! - A crash during recovery must recover to exactly the tree the uninterrupted
//!   recovery produced.
//! - Nothing here panics on a damaged pool on purpose: panics of the file system are
//!   caught by the caller and reported as failures.

use crate::drive::{lock, Expect};
use crate::exec::live_canon;
use crate::model::{pattern, Canon};
use crate::rng::Rng;
use crate::subset::{self, Subset};
use ferrite_core::sim::{crash_image, FencePoint, InFlight};
use ferrite_core::{AtimeMode, Error, Fs, MountOptions, SimMedium};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};

/// Mount options of every recovery the oracle runs.
pub fn check_mount_options() -> MountOptions {
    // Reads of the checker must not change the times it compares.
    MountOptions { workers: 1, atime: AtimeMode::Off, ..Default::default() }
}

/// Outcome of one passing check.
pub enum Checked {
    /// Mount failed and that was acceptable (crash during mkfs).
    NoFs,
    /// Recovered.
    Fs {
        /// The recovered, mounted pool.
        fs: Box<Fs<SimMedium>>,
        /// Its tree.
        canon: Canon,
        /// What recovery repaired: bit 0 rolled back a journal, bit 1 cut a torn
        /// log, bit 2 freed an orphan (0: nothing).
        repaired: u8,
    },
}

/// Recover `img` and judge it against `exp`.
pub fn check_image(img: Vec<u8>, exp: &Expect) -> Result<Checked, String> {
    let fs = match Fs::mount(SimMedium::from_image(img), &check_mount_options()) {
        Ok(fs) => fs,
        Err(e) if exp.nofs_ok => {
            return match e {
                Error::Foreign(_) | Error::Corrupt(_) => Ok(Checked::NoFs),
                e => Err(format!("mount of a half-made pool failed with an unexpected error: {e}")),
            }
        }
        Err(e) => return Err(format!("mount failed: {e}")),
    };
    let r = fs.fsck().map_err(|e| format!("fsck failed to run: {e}"))?;
    if !r.is_clean() {
        let n = r.errors.len();
        let shown: Vec<&str> = r.errors.iter().take(4).map(String::as_str).collect();
        return Err(format!("fsck found {n} error(s): {}", shown.join("; ")));
    }
    // Every mapped page agrees with its checksum: recovery cut torn data and
    // cleared what uncommitted in-place appends left past the end of a page.
    let d = fs.check_data(&mut |_, _| {}).map_err(|e| format!("data check failed to run: {e}"))?;
    if let Some(f) = d.findings.first() {
        return Err(format!("data check after recovery: {f}"));
    }
    let canon = live_canon(&fs, true).map_err(|e| format!("reading the recovered tree: {e}"))?;
    if !exp.states.iter().any(|s| s.admits(&canon)) {
        let mut why = Vec::new();
        for (i, s) in exp.states.iter().enumerate() {
            let label = match (exp.states.len(), i) {
                (1, _) => "expected".to_string(),
                (2, 0) => "before the operation".to_string(),
                (2, _) => "after the operation".to_string(),
                // Concurrent rounds: the allowed subsets of the operations in flight.
                (_, i) => format!("allowed state {i}"),
            };
            let d = s.diff(&canon).unwrap_or_else(|| "equal".into());
            why.push(format!("vs {label} (model left, recovered right): {d}"));
        }
        return Err(format!("recovered tree is not a state the model allows; {}", why.join("; ")));
    }
    let rep = fs.mount_report();
    let repaired = (rep.journals_rolled_back > 0) as u8
        | ((rep.torn_logs > 0) as u8) << 1
        | ((rep.orphans_freed > 0) as u8) << 2;
    Ok(Checked::Fs { fs: Box::new(fs), canon, repaired })
}

/// One recovery fence point captured while recovering an image.
struct RecPoint {
    durable: Vec<u8>,
    in_flight: Vec<InFlight>,
}

fn recovery_points(img: &[u8]) -> Result<Vec<RecPoint>, String> {
    let pts: Arc<Mutex<Vec<RecPoint>>> = Arc::new(Mutex::new(Vec::new()));
    let m = SimMedium::from_image(img.to_vec());
    let p2 = pts.clone();
    m.set_fence_hook(Some(Box::new(move |p: &FencePoint<'_>| {
        lock(&p2).push(RecPoint { durable: p.durable.to_vec(), in_flight: p.in_flight.to_vec() });
    })));
    let fs = Fs::mount(m, &check_mount_options()).map_err(|e| format!("second recovery: {e}"))?;
    let m = fs.crash();
    m.set_fence_hook(None);
    let v = std::mem::take(&mut *lock(&pts));
    Ok(v)
}

/// A failure found while crashing a recovery.
pub struct RecoveryFailure {
    /// Recovery fence number.
    pub rfence: u64,
    /// Subset at that fence.
    pub rsubset: Subset,
    /// What went wrong.
    pub message: String,
}

/// Crash the recovery of `img` at each of its fence points (structured subsets, at
/// most `max` states) and check that recovering again yields `target`. Returns the
/// number of states checked and the first failure.
pub fn recovery_crashes(
    img: &[u8],
    target: &Arc<Canon>,
    max: usize,
    rng: &mut Rng,
) -> (u64, Option<RecoveryFailure>) {
    let pts = match recovery_points(img) {
        Ok(p) => p,
        Err(e) => {
            let f = RecoveryFailure { rfence: 0, rsubset: Subset::None, message: e };
            return (0, Some(f));
        }
    };
    let exp =
        Expect { nofs_ok: false, states: vec![target.clone()], op: 0, op_desc: String::new() };
    // Every point's own plan, taken round-robin so each point gets its all-out,
    // all-in and single-line subsets before any point gets random ones.
    let plans: Vec<Vec<Subset>> = pts
        .iter()
        .map(|p| {
            let nat =
                subset::natural_count(p.in_flight.len(), subset::lines(&p.in_flight).len(), 6, 4);
            subset::plan(&p.in_flight, nat.min(max as u64) as usize, 6, rng)
        })
        .collect();
    let mut n = 0;
    let longest = plans.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..longest {
        for (i, p) in pts.iter().enumerate() {
            let Some(sub) = plans[i].get(round) else { continue };
            if n as usize >= max {
                return (n, None);
            }
            let img2 = crash_image(&p.durable, sub.select(&p.in_flight));
            n += 1;
            let r = guarded(|| check_image(img2, &exp).map(drop));
            if let Err(message) = r {
                let f = RecoveryFailure { rfence: i as u64, rsubset: sub.clone(), message };
                return (n, Some(f));
            }
        }
    }
    (n, None)
}

/// Re-run recovery of `img`, crash it at recovery fence `rfence` with `rsub`, and
/// recover again; the image of that crash is returned for a verbose check.
pub fn recovery_crash_image(img: &[u8], rfence: u64, rsub: &Subset) -> Result<Vec<u8>, String> {
    let pts = recovery_points(img)?;
    let p = pts
        .get(rfence as usize)
        .ok_or_else(|| format!("recovery has only {} fence points", pts.len()))?;
    let missing = rsub.missing(&p.in_flight);
    if !missing.is_empty() {
        eprintln!("warning: recovery subset names words not in flight in this run: {missing:x?}");
    }
    Ok(crash_image(&p.durable, rsub.select(&p.in_flight)))
}

/// Use the recovered pool: create, write, rename, clean unmount, mount, read back,
/// remove, and check fsck and the tree throughout. ENOSPC skips the probe.
pub fn probe(fs: Fs<SimMedium>, canon: &Canon) -> Result<(), String> {
    let err = |what: &str, e: Error| format!("probe after recovery: {what}: {e}");
    let root = fs.root();
    let data = pattern(77, 0, 9000);
    let run = || -> Result<(), Error> {
        let f = fs.create(root, b".crash-probe", 0o600, 0, 0)?;
        fs.write(f.ino, 0, &data)?;
        fs.write(f.ino, 100, &pattern(78, 100, 50))?;
        let d = fs.mkdir(root, b".crash-probe-dir", 0o700, 0, 0)?;
        fs.rename(root, b".crash-probe", d.ino, b"p", Default::default())
    };
    match run() {
        Ok(()) => {}
        Err(Error::NoSpace) => return Ok(()),
        Err(e) => return Err(err("operations", e)),
    }
    let r = fs.fsck().map_err(|e| err("fsck", e))?;
    if !r.is_clean() {
        return Err(format!("probe after recovery: fsck: {}", r.errors.join("; ")));
    }
    let m = fs.unmount().map_err(|e| err("unmount", e))?;
    // The fixed regions checksum and the metadata replicas are in step with
    // their primaries: recovery settled what the crash left between the copies.
    let (_, found) = ferrite_core::integrity::check_raw(&m);
    if let Some(f) = found.first() {
        return Err(format!("probe after recovery: after a clean unmount: {f}"));
    }
    let fs = Fs::mount(m, &check_mount_options()).map_err(|e| err("remount", e))?;
    if !fs.mount_report().clean {
        return Err("probe after recovery: clean unmount was not seen as clean".into());
    }
    let r = fs.fsck().map_err(|e| err("fsck after remount", e))?;
    if !r.is_clean() {
        return Err(format!("probe after recovery: fsck after remount: {}", r.errors.join("; ")));
    }
    let ino = fs.resolve(b"/.crash-probe-dir/p", false).map_err(|e| err("resolve", e))?;
    let mut want = data.clone();
    want[100..150].copy_from_slice(&pattern(78, 100, 50));
    if fs.read_all(ino).map_err(|e| err("read", e))? != want {
        return Err("probe after recovery: data written after recovery reads back wrong".into());
    }
    let d = fs.resolve(b"/.crash-probe-dir", false).map_err(|e| err("resolve", e))?;
    fs.unlink(d, b"p").map_err(|e| err("unlink", e))?;
    fs.rmdir(root, b".crash-probe-dir").map_err(|e| err("rmdir", e))?;
    let after = live_canon(&fs, false).map_err(|e| format!("probe after recovery: {e}"))?;
    let mut want_tree = canon.without_times();
    let mut after_cmp = after.clone();
    // The root's times changed with the probe; everything else must not have.
    if let (Some(a), Some(b)) = (want_tree.nodes.first_mut(), after_cmp.nodes.first_mut()) {
        a.times = None;
        b.times = None;
    }
    if let Some(d) = want_tree.diff(&after_cmp) {
        return Err(format!("probe after recovery changed the tree: {d}"));
    }
    Ok(())
}

static QUIET: AtomicBool = AtomicBool::new(false);
static RECENT: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HOOK: Once = Once::new();

/// Install (once) a panic hook that records panic messages and stays silent while
/// crash states are being checked.
pub fn install_panic_hook() {
    HOOK.call_once(|| {
        let prev = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = match info.payload().downcast_ref::<&str>() {
                Some(s) => s.to_string(),
                None => info.payload().downcast_ref::<String>().cloned().unwrap_or_default(),
            };
            let loc = info
                .location()
                .map(|l| format!(" at {}:{}", l.file(), l.line()))
                .unwrap_or_default();
            {
                let mut r = lock(&RECENT);
                r.push(format!("{msg}{loc}"));
                let n = r.len();
                if n > 8 {
                    r.drain(..n - 8);
                }
            }
            if !QUIET.load(Ordering::Relaxed) {
                prev(info);
            }
        }));
    });
}

/// Silence (or not) panic output of checks.
pub fn set_quiet(q: bool) {
    QUIET.store(q, Ordering::Relaxed);
}

/// Run `f`, turning a panic into an error naming the panic.
pub fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = match p.downcast_ref::<&str>() {
                Some(s) => s.to_string(),
                None => p.downcast_ref::<String>().cloned().unwrap_or_else(|| "?".into()),
            };
            let recent = lock(&RECENT).iter().rev().take(2).cloned().collect::<Vec<_>>();
            Err(format!("PANIC: {msg} (recent panics: {})", recent.join(" | ")))
        }
    }
}
