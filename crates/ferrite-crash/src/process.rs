//! Real process crashes: a child process runs a seeded workload on a pool file and
//! reports each completed operation over a pipe; the parent SIGKILLs it at a random
//! moment, recovers the pool, runs fsck and checks the tree.
//!
//! Invariants:
//! - The child prints `done K` only after operation K returned, and starts operation
//!   K+1 only after that line is written, so after the kill the pool must hold the
//!   model state after the last acknowledged operation or after the one following it.
//! - The parent regenerates the same operations from the seed with the model alone
//!   (the child checks every outcome against the model and stops with `mismatch` if
//!   they disagree), so the parent needs nothing from the child but the count.
//! - A plain file mapping survives a process kill with every store that was made, so
//!   these crashes are prefixes of the store stream: the complement of the simulator,
//!   which explores reorderings at fences.

use crate::drive::UUID;
use crate::exec::{exec, live_canon, Handles};
use crate::gen::{Gen, GenConfig};
use crate::model::{Canon, Model, Op};
use crate::rng::Rng;
use ferrite_core::{AtimeMode, Fs, MapOptions, MkfsOptions, MmapMedium, MountOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Pool size of a process-crash run.
pub const POOL_BYTES: u64 = 16 << 20;

/// Generator limits of process-crash workloads (no simulated crash operations).
pub fn gen_config() -> GenConfig {
    GenConfig { crash_remount: false, ..GenConfig::default() }
}

/// The child: format `pool`, run `ops` generated operations, report each on stdout.
/// Exit code 0 when all ran, 3 on a disagreement with the model, 2 on setup errors.
pub fn child_main(pool: &Path, seed: u64, ops: usize) -> i32 {
    let mut out = std::io::stdout().lock();
    let m = match MmapMedium::create(pool, POOL_BYTES, &MapOptions::default()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("child: create {}: {e}", pool.display());
            return 2;
        }
    };
    let mkfs = MkfsOptions { shards: 1, uuid: Some(UUID), ..Default::default() };
    let mut fs = match Fs::mkfs(m, &mkfs) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("child: mkfs: {e}");
            return 2;
        }
    };
    fs.set_atime_mode(AtimeMode::Off); // the model has no access times of reads
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    let mut g = Gen::new(seed, gen_config());
    let mut model = Model::new();
    let mut handles = Handles::new();
    for k in 1..=ops {
        let op = g.next(&model);
        let live = match &op {
            Op::Remount => {
                handles.clear();
                let m = match fs.unmount() {
                    Ok(m) => m,
                    Err(e) => {
                        let _ = writeln!(out, "mismatch {k}: unmount: {e}");
                        return 3;
                    }
                };
                match Fs::mount(m, &MountOptions { atime: AtimeMode::Off, ..Default::default() }) {
                    Ok(f) => {
                        fs = f;
                        Ok(())
                    }
                    Err(e) => {
                        let _ = writeln!(out, "mismatch {k}: mount: {e}");
                        return 3;
                    }
                }
            }
            _ => exec(&fs, &op, &mut handles),
        };
        let pred = model.apply(&op);
        let agree = match (&live, pred) {
            (Ok(()), Ok(())) => true,
            (Err(e), Err(p)) => e.errno() == p,
            _ => false,
        };
        if !agree {
            let _ = writeln!(out, "mismatch {k}: {op}: fs {live:?}, model {pred:?}");
            let _ = out.flush();
            return 3;
        }
        let _ = writeln!(out, "done {k}");
        let _ = out.flush();
    }
    match fs.unmount() {
        Ok(_) => {
            let _ = writeln!(out, "finished");
            0
        }
        Err(e) => {
            let _ = writeln!(out, "mismatch end: unmount: {e}");
            3
        }
    }
}

/// Model states after `a` and `a + 1` generated operations (without times).
pub fn model_states(seed: u64, a: usize) -> (Canon, Canon) {
    let mut g = Gen::new(seed, gen_config());
    let mut m = Model::new();
    let mut before = m.canon(false);
    for _ in 0..=a {
        before = m.canon(false);
        let op = g.next(&m);
        let _ = m.apply(&op);
    }
    (before, m.canon(false))
}

/// One process-crash run.
#[derive(Clone, Debug)]
pub struct ProcessRun {
    /// Seed.
    pub seed: u64,
    /// Last acknowledged operation.
    pub acked: usize,
    /// Operations in the workload.
    pub ops: usize,
    /// The child finished before the kill.
    pub finished: bool,
    /// Killed before mkfs completed.
    pub before_ready: bool,
    /// Recovered state equals the one after the unacknowledged next operation.
    pub next_op_landed: bool,
    /// Failure.
    pub failure: Option<String>,
}

/// Run `runs` kills. `exe` and `prefix` re-execute a binary whose `crashtest`
/// arguments accept `--child-pool/--child-seed/--child-ops`.
pub fn run_process_crashes(
    exe: &Path,
    prefix: &[String],
    runs: u64,
    seed: u64,
    ops: usize,
    dir: &Path,
) -> Vec<ProcessRun> {
    let mut out = Vec::new();
    for r in 0..runs {
        let s = seed.wrapping_mul(1000).wrapping_add(r);
        let mut rng = Rng::derive(s, 0x6b1);
        let target = rng.below(ops as u64 + 1) as usize;
        let delay = Duration::from_micros(rng.below(3000));
        let pool = dir.join(format!("ferrite-crash-{}-{s}.pool", std::process::id()));
        out.push(one_run(exe, prefix, s, ops, target, delay, &pool));
        let _ = std::fs::remove_file(&pool);
    }
    out
}

fn one_run(
    exe: &Path,
    prefix: &[String],
    seed: u64,
    ops: usize,
    target: usize,
    delay: Duration,
    pool: &PathBuf,
) -> ProcessRun {
    let mut run = ProcessRun {
        seed,
        acked: 0,
        ops,
        finished: false,
        before_ready: false,
        next_op_landed: false,
        failure: None,
    };
    let child = Command::new(exe)
        .args(prefix)
        .arg("--child-pool")
        .arg(pool)
        .arg("--child-seed")
        .arg(seed.to_string())
        .arg("--child-ops")
        .arg(ops.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            run.failure = Some(format!("spawn {}: {e}", exe.display()));
            return run;
        }
    };
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            match line {
                Ok(l) => {
                    if tx.send(l).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    let mut lines = Vec::new();
    let t0 = Instant::now();
    let mut ready = false;
    // Wait for the target acknowledgement (or the end), then kill after a delay.
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(l) => {
                let hit = l == "ready" && target == 0
                    || l.strip_prefix("done ").and_then(|n| n.parse::<usize>().ok())
                        == Some(target);
                ready |= l == "ready";
                lines.push(l);
                if hit {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if t0.elapsed() > Duration::from_secs(60) {
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    std::thread::sleep(delay);
    let _ = child.kill();
    let status = child.wait();
    let _ = reader.join();
    lines.extend(rx.try_iter());
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut stderr);
    }
    ready |= lines.iter().any(|l| l == "ready");
    if let Some(m) = lines.iter().find(|l| l.starts_with("mismatch")) {
        run.failure = Some(format!("child disagrees with the model: {m}"));
        return run;
    }
    if !ready && status.as_ref().map(|s| s.success()).unwrap_or(false) {
        run.failure = Some(format!("child exited without starting: {stderr}"));
        return run;
    }
    run.finished = lines.iter().any(|l| l == "finished");
    run.acked = lines
        .iter()
        .filter_map(|l| l.strip_prefix("done ").and_then(|n| n.parse().ok()))
        .max()
        .unwrap_or(0);
    run.before_ready = !ready;
    // Recover and judge.
    let m = match MmapMedium::open(pool, &MapOptions::default()) {
        Ok(m) => m,
        Err(e) if run.before_ready => {
            let _ = e;
            return run;
        }
        Err(e) => {
            run.failure = Some(format!("open pool after kill: {e}"));
            return run;
        }
    };
    let fs = match Fs::mount(m, &MountOptions { atime: AtimeMode::Off, ..Default::default() }) {
        Ok(f) => f,
        Err(e) => {
            if !run.before_ready {
                run.failure = Some(format!("mount after kill (acked {}): {e}", run.acked));
            }
            return run;
        }
    };
    let r = match fs.fsck() {
        Ok(r) => r,
        Err(e) => {
            run.failure = Some(format!("fsck after kill: {e}"));
            return run;
        }
    };
    if !r.is_clean() {
        run.failure =
            Some(format!("fsck after kill (acked {}): {}", run.acked, r.errors.join("; ")));
        return run;
    }
    let got = match live_canon(&fs, false) {
        Ok(c) => c,
        Err(e) => {
            run.failure = Some(format!("reading the recovered tree: {e}"));
            return run;
        }
    };
    let (a, b) = if run.before_ready {
        let e = Model::new().canon(false);
        (e.clone(), e)
    } else if run.finished {
        let (_, last) = model_states(seed, ops - 1);
        (last.clone(), last)
    } else {
        model_states(seed, run.acked)
    };
    if got == a {
        return run;
    }
    if got == b {
        run.next_op_landed = true;
        return run;
    }
    run.failure = Some(format!(
        "after the kill (acked {}) the tree is neither state: vs acked: {}; vs next: {}",
        run.acked,
        a.diff(&got).unwrap_or_default(),
        b.diff(&got).unwrap_or_default()
    ));
    let _ = fs.unmount();
    run
}
