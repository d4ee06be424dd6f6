//! Running a workload on a simulated pool while a fence hook watches every fence.
//!
//! Invariants:
//! - The driver checks the running file system against the model after every
//!   operation (outcome, then the whole visible tree): a disagreement is a
//!   functional failure and ends the run, because crash states of a file system that
//!   is already wrong prove nothing.
//! - Fence points are numbered by the hook across media (a crash-and-recover
//!   operation continues the numbering), so a fence number names one point of a run.
//! - Captured fence points of operation `k` are handed to the sink only after `k`
//!   returned and the model state after `k` is known; the hook never blocks on the
//!   sink, so checking can run on other threads without deadlock.
//! - Concurrent workloads ([`drive_mt`]) run round by round; the model and the live
//!   tree are compared only between rounds, when no operation is in flight. A fence
//!   point inside a round must recover to the state before the round plus every
//!   operation of the round that had returned plus any subset of those in flight
//!   (each all-or-nothing). The operations of a round change one file each and
//!   different files, so those states are built from the trees before and after
//!   the round, file by file.

use crate::exec::{exec, live_canon, sync_from_live, Handles};
use crate::model::{CNode, Canon, Model, Op};
use crate::sched::{RoundTag, Sched};
use crate::workloads::{groupable, names_of, Workload};
use ferrite_core::sim::{
    set_sim_thread, set_wait_hook, step_kind, FenceHook, FencePoint, InFlight, SimFault, Step,
};
use ferrite_core::{AtimeMode, CoreFault, Fs, MkfsOptions, MountOptions, SimMedium};
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Lock ignoring poison: a panicking check must not wedge the run (the panic itself
/// is reported).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Pool identity used by every run (crash images of two runs are comparable).
pub const UUID: [u8; 16] = *b"ferrite-crash-ts";

/// An injected fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Skip the n-th flush of the medium.
    SkipFlush(u64),
    /// Skip the n-th fence of the medium.
    SkipFence(u64),
    /// Skip the n-th fence of one simulated thread only.
    SkipThreadFence(u32, u64),
    /// A core persist-order fault.
    Core(CoreFault),
}

impl Fault {
    /// Reproducer form.
    pub fn spec(&self) -> String {
        match self {
            Fault::SkipFlush(n) => format!("skip-flush:{n}"),
            Fault::SkipFence(n) => format!("skip-fence:{n}"),
            Fault::SkipThreadFence(t, n) => format!("skip-thread-fence:{t}:{n}"),
            Fault::Core(CoreFault::TailBeforeData) => "tail-before-data".into(),
            Fault::Core(CoreFault::JournalOutOfOrder) => "journal-out-of-order".into(),
            Fault::Core(CoreFault::EarlyGc) => "early-gc".into(),
            Fault::Core(CoreFault::UncheckedData) => "unchecked-data".into(),
            Fault::Core(CoreFault::StaleLease) => "client-stale-lease".into(),
            Fault::Core(CoreFault::AdoptUnflushed) => "tail-before-other-data".into(),
            Fault::Core(CoreFault::AdoptKeepsPastTail) => "past-tail-kept".into(),
            Fault::Core(CoreFault::GcReferenced) => "gc-referenced-page".into(),
            Fault::Core(CoreFault::NoFenceWait) => "tail-before-prev-fence".into(),
            Fault::Core(CoreFault::UnsettledMarks) => "unsettled-journal-mark".into(),
        }
    }

    /// Parse [`Fault::spec`] output.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let n = |t: &str| t.parse::<u64>().map_err(|_| format!("bad fault index '{t}'"));
        Ok(match s.split_once(':') {
            Some(("skip-flush", t)) => Fault::SkipFlush(n(t)?),
            Some(("skip-fence", t)) => Fault::SkipFence(n(t)?),
            Some(("skip-thread-fence", t)) => {
                let (a, b) = t.split_once(':').ok_or("skip-thread-fence:THREAD:N")?;
                Fault::SkipThreadFence(n(a)? as u32, n(b)?)
            }
            None if s == "tail-before-data" => Fault::Core(CoreFault::TailBeforeData),
            None if s == "journal-out-of-order" => Fault::Core(CoreFault::JournalOutOfOrder),
            None if s == "early-gc" => Fault::Core(CoreFault::EarlyGc),
            None if s == "unchecked-data" => Fault::Core(CoreFault::UncheckedData),
            None if s == "client-stale-lease" => Fault::Core(CoreFault::StaleLease),
            None if s == "tail-before-other-data" => Fault::Core(CoreFault::AdoptUnflushed),
            None if s == "past-tail-kept" => Fault::Core(CoreFault::AdoptKeepsPastTail),
            None if s == "gc-referenced-page" => Fault::Core(CoreFault::GcReferenced),
            None if s == "tail-before-prev-fence" => Fault::Core(CoreFault::NoFenceWait),
            None if s == "unsettled-journal-mark" => Fault::Core(CoreFault::UnsettledMarks),
            _ => return Err(format!("unknown fault '{s}'")),
        })
    }

    fn core(self) -> Option<CoreFault> {
        match self {
            Fault::Core(c) => Some(c),
            _ => None,
        }
    }

    fn sim(self) -> Option<SimFault> {
        match self {
            Fault::SkipFlush(n) => Some(SimFault::SkipFlush(n)),
            Fault::SkipFence(n) => Some(SimFault::SkipFence(n)),
            Fault::SkipThreadFence(thread, n) => Some(SimFault::SkipThreadFence { thread, n }),
            Fault::Core(_) => None,
        }
    }
}

/// What a fence point must recover to.
#[derive(Debug)]
pub struct Expect {
    /// A failed mount is acceptable (a crash during mkfs: no file system yet).
    pub nofs_ok: bool,
    /// Acceptable trees (with times): before and after the operation in flight.
    pub states: Vec<Arc<Canon>>,
    /// Operation index (0: mkfs / setup; ops are 1-based; len+1: after the last).
    pub op: usize,
    /// The operation, for reports.
    pub op_desc: String,
}

/// A captured fence point.
#[derive(Clone)]
pub struct FenceRec {
    /// Fence number in the run.
    pub fence: u64,
    /// Operation in flight (of the fencing thread, in a concurrent workload).
    pub op: usize,
    /// Simulated thread issuing the fence.
    pub thread: u32,
    /// Concurrent workloads: the round's status at the fence.
    pub tag: Option<RoundTag>,
    /// Bytes certainly on media.
    pub durable: Arc<Vec<u8>>,
    /// Words that may or may not be on media.
    pub in_flight: Arc<Vec<InFlight>>,
}

/// What the survey learns about one fence point.
#[derive(Clone, Copy, Debug)]
pub struct SurveyPoint {
    /// Fence number.
    pub fence: u64,
    /// Operation in flight.
    pub op: usize,
    /// Words in flight.
    pub words: usize,
    /// Cache lines in flight.
    pub lines: usize,
}

/// Which fence points to capture.
#[derive(Clone)]
pub enum Capture {
    /// None: record survey points only.
    Survey,
    /// These fence numbers.
    Some(Arc<HashSet<u64>>),
}

pub(crate) struct HookState {
    pub(crate) op: usize,
    pub(crate) sched: Option<Arc<Sched>>,
    pub(crate) fence: u64,
    pub(crate) capture: Capture,
    pub(crate) recs: Vec<FenceRec>,
    pub(crate) survey: Vec<SurveyPoint>,
}

pub(crate) fn make_hook(st: Arc<Mutex<HookState>>) -> FenceHook {
    Box::new(move |p: &FencePoint<'_>| {
        let mut s = lock(&st);
        let fence = s.fence;
        s.fence += 1;
        let (op, tag) = match &s.sched {
            Some(sc) => match sc.op_of(p.thread) {
                Some(op) if p.thread != 0 => (op, Some(sc.tag())),
                _ => (s.op, None),
            },
            None => (s.op, None),
        };
        match &s.capture {
            Capture::Survey => {
                let lines = crate::subset::lines(p.in_flight).len();
                s.survey.push(SurveyPoint { fence, op, words: p.in_flight.len(), lines });
            }
            Capture::Some(set) => {
                if set.contains(&fence) {
                    let rec = FenceRec {
                        fence,
                        op,
                        thread: p.thread,
                        tag,
                        durable: Arc::new(p.durable.to_vec()),
                        in_flight: Arc::new(p.in_flight.to_vec()),
                    };
                    s.recs.push(rec);
                }
            }
        }
    })
}

/// Result of driving a workload.
pub struct Driven {
    /// Survey points (survey mode).
    pub survey: Vec<SurveyPoint>,
    /// Model states: index 0 after setup, k after op k (with times).
    pub states: Vec<Arc<Canon>>,
    /// Flushes issued by setup (mkfs and mount) on the first medium.
    pub setup_flushes: u64,
    /// Flushes issued by the whole run on the first medium.
    pub total_flushes: u64,
    /// Fences issued by setup on the first medium.
    pub setup_fences: u64,
    /// Fences issued by the whole run on the first medium.
    pub total_fences: u64,
    /// What the injected simulated fault did.
    pub trace: Option<ferrite_core::sim::FaultTrace>,
    /// Number of the pseudo fence point after the last operation.
    pub end_fence: u64,
    /// Geometry of the pool.
    pub geo: Option<ferrite_core::layout::Geometry>,
    /// Concurrent workloads: fences issued by each simulated thread (index t - 1).
    pub thread_fences: Vec<u64>,
    /// Concurrent workloads: token hand-overs between threads at medium steps.
    pub switches: u64,
    /// Concurrent workloads: hand-overs by threads that waited for another thread
    /// of their round (its state or page lock, or its fence).
    pub waits: u64,
    /// Client workloads: clients that died inside an operation.
    pub deaths: u64,
    /// Client workloads: fsck runs of the live daemon (after rounds that leave no
    /// client attached and no cross-process lock held).
    pub live_fscks: u64,
    /// Client workloads: the documented reference-count leaks those runs accepted
    /// (a client died between a commit and a reference's drop, or between a
    /// clone's reference and its commit), one line per block and kind, first seen.
    pub leaks: Vec<String>,
    /// Client workloads: blocks with an extra reference in the coordination table
    /// after each round, as (the round's last step, blocks).
    pub shared: Vec<(usize, u64)>,
}

/// What a pool byte offset holds, for explaining fault traces.
pub fn region(geo: &ferrite_core::layout::Geometry, off: u64) -> String {
    use ferrite_core::layout::{BLOCK, INODE_SLOT, JOURNAL_SIZE, MOUNT_STATE_OFF, SB_SIZE};
    let blk = off / BLOCK;
    if off < SB_SIZE as u64 || (BLOCK..BLOCK + SB_SIZE as u64).contains(&off) {
        return format!("superblock copy {blk}");
    }
    if (MOUNT_STATE_OFF..MOUNT_STATE_OFF + 8).contains(&off) {
        return "mount-state word".into();
    }
    for s in 0..geo.nshards {
        let j = geo.journal_off(s);
        if (j..j + JOURNAL_SIZE).contains(&off) {
            return if off - j < 64 {
                format!("journal {s} header")
            } else {
                format!("journal {s} records")
            };
        }
    }
    if (1..=geo.ninodes).any(|i| (geo.slot_off(i)..geo.slot_off(i) + INODE_SLOT).contains(&off)) {
        let i = (1..=geo.ninodes)
            .find(|&i| (geo.slot_off(i)..geo.slot_off(i) + INODE_SLOT).contains(&off));
        let i = i.expect("slot");
        let field = match off - geo.slot_off(i) {
            0 => "state",
            8 => "head",
            16 => "tail",
            _ => "type",
        };
        return format!("inode {i} slot {field}");
    }
    if geo.is_data_block(blk) {
        return format!("data/log block {blk} (+{:#x})", off % BLOCK);
    }
    format!("metadata block {blk}")
}

/// A failure of the running file system itself (not of a crash state).
#[derive(Clone, Debug)]
pub struct Functional {
    /// Operation index.
    pub op: usize,
    /// Description.
    pub message: String,
}

/// Drive `w` with `fault`, capturing fence points per `capture`. `sink` receives,
/// after each operation, its captured fence points and what they must recover to;
/// it returns false to stop the run early.
pub fn drive(
    w: &Workload,
    fault: Option<Fault>,
    capture: Capture,
    sink: &mut dyn FnMut(Vec<FenceRec>, Arc<Expect>) -> bool,
) -> Result<Driven, Functional> {
    if w.clients.is_some() {
        return crate::clients::drive_clients(w, fault, capture, sink);
    }
    if w.mt.is_some() {
        return drive_mt(w, fault, capture, sink);
    }
    let fail = |op: usize, message: String| Functional { op, message };
    let st = Arc::new(Mutex::new(HookState {
        op: 0,
        sched: None,
        fence: 0,
        capture,
        recs: Vec::new(),
        survey: Vec::new(),
    }));
    let mkfs = MkfsOptions { shards: 1, inodes: w.inodes, uuid: Some(UUID), ..Default::default() };
    let opts = MountOptions {
        fault: fault.and_then(Fault::core),
        workers: 1,
        atime: AtimeMode::Off,
        ..Default::default()
    };
    let m = SimMedium::new(w.pool);
    if w.mkfs_points {
        m.set_fence_hook(Some(make_hook(st.clone())));
    }
    let mut fs = Fs::mkfs(m, &mkfs).map_err(|e| fail(0, format!("mkfs: {e}")))?;
    fs.set_atime_mode(AtimeMode::Off); // the model has no access times of reads
    if opts.fault.is_some() {
        let m = fs.unmount().map_err(|e| fail(0, format!("unmount after mkfs: {e}")))?;
        fs = Fs::mount(m, &opts).map_err(|e| fail(0, format!("mount with fault: {e}")))?;
    }
    if !w.mkfs_points {
        fs.medium().set_fence_hook(Some(make_hook(st.clone())));
    }
    let setup_flushes = fs.medium().flush_count();
    let setup_fences = fs.medium().fence_count();
    if let Some(f) = fault.and_then(Fault::sim) {
        fs.medium().set_fault(Some(f));
    }
    let mut first_medium = true;
    let mut total_flushes = 0;
    let mut total_fences = 0;
    let mut trace = None;
    let mut model = Model::new();
    sync_from_live(&mut model, &fs).map_err(|e| fail(0, e))?;
    let s0 = Arc::new(model.canon(true));
    let live0 = live_canon(&fs, true).map_err(|e| fail(0, e))?;
    if let Some(d) = s0.diff(&live0) {
        return Err(fail(0, format!("fresh file system differs from the model: {d}")));
    }
    let mut states = vec![s0.clone()];
    let recs = std::mem::take(&mut lock(&st).recs);
    let exp = Arc::new(Expect { nofs_ok: true, states: vec![s0], op: 0, op_desc: "mkfs".into() });
    if !sink(recs, exp) {
        return Ok(finish(st, states, setup_flushes, 0, setup_fences, 0, None));
    }
    let mut handles = Handles::new();
    for (i, op) in w.ops.iter().enumerate() {
        let k = i + 1;
        lock(&st).op = k;
        let live: Result<(), ferrite_core::Error> = match op {
            Op::Remount => {
                handles.clear();
                let m = fs.unmount().map_err(|e| fail(k, format!("unmount: {e}")))?;
                fs = Fs::mount(m, &opts)
                    .map_err(|e| fail(k, format!("mount after clean unmount: {e}")))?;
                Ok(())
            }
            Op::CrashRemount => {
                handles.clear();
                let m = fs.crash();
                if first_medium {
                    total_flushes = m.flush_count();
                    total_fences = m.fence_count();
                    trace = fault.and_then(Fault::sim).map(|_| m.fault_trace());
                    first_medium = false;
                }
                let m2 = SimMedium::from_image(m.durable_image());
                m.set_fence_hook(None);
                m2.set_fence_hook(Some(make_hook(st.clone())));
                fs = Fs::mount(m2, &opts)
                    .map_err(|e| fail(k, format!("recovery after crash: {e}")))?;
                Ok(())
            }
            _ => exec(&fs, op, &mut handles),
        };
        check_outcome(k, op, &live, &mut model, w.nospc)?;
        sync_from_live(&mut model, &fs).map_err(|e| fail(k, format!("op {k} ({op}): {e}")))?;
        // Times are copied from the file system, except those the operation set
        // explicitly: those the model knows.
        if let (Op::Utimens { path, atime, mtime }, Ok(())) = (op, &live) {
            let id =
                model.lookup(path).map_err(|e| fail(k, format!("utimens target: errno {e}")))?;
            let got = model.nodes[&id].times.expect("synced");
            if atime.is_some_and(|t| t != got[0]) || mtime.is_some_and(|t| t != got[1]) {
                return Err(fail(k, format!("op {k} ({op}): times are {got:?}")));
            }
        }
        let sk = Arc::new(model.canon(true));
        let live_c = live_canon(&fs, true).map_err(|e| fail(k, format!("op {k} ({op}): {e}")))?;
        if let Some(d) = sk.diff(&live_c) {
            return Err(fail(k, format!("after op {k} ({op}) the file system differs from the model (model left, fs right): {d}")));
        }
        states.push(sk.clone());
        let recs = std::mem::take(&mut lock(&st).recs);
        let exp = Arc::new(Expect {
            nofs_ok: false,
            states: vec![states[k - 1].clone(), sk],
            op: k,
            op_desc: op.to_string(),
        });
        if !sink(recs, exp) {
            return Ok(finish(st, states, setup_flushes, 0, setup_fences, 0, None));
        }
    }
    let end_fence = end_point(&st, fs.medium(), &states[w.ops.len()], w.ops.len(), sink);
    if first_medium {
        total_flushes = fs.medium().flush_count();
        total_fences = fs.medium().fence_count();
        trace = fault.and_then(Fault::sim).map(|_| fs.medium().fault_trace());
    }
    fs.medium().set_fence_hook(None);
    let mut d = finish(st, states, setup_flushes, total_flushes, setup_fences, total_fences, trace);
    d.end_fence = end_fence;
    d.geo = Some(*fs.geometry());
    Ok(d)
}

/// Compare an operation's outcome with the model's prediction and apply it to the
/// model when it succeeded.
pub(crate) fn check_outcome(
    k: usize,
    op: &Op,
    live: &Result<(), ferrite_core::Error>,
    model: &mut Model,
    nospc: bool,
) -> Result<(), Functional> {
    let fail = |op: usize, message: String| Functional { op, message };
    let mut next = model.clone();
    let pred = next.apply(op);
    match (live, pred) {
        (Ok(()), Ok(())) => *model = next,
        (Err(e), Err(p)) if e.errno() == p => {}
        (Err(ferrite_core::Error::NoSpace), _) if nospc => {}
        (l, p) => {
            return Err(fail(
                k,
                format!(
                    "op {k} ({op}): file system returned {}, model expects {}",
                    match l {
                        Ok(()) => "success".to_string(),
                        Err(e) => format!("{e} (errno {})", e.errno()),
                    },
                    match p {
                        Ok(()) => "success".to_string(),
                        Err(e) => format!("errno {e}"),
                    }
                ),
            ))
        }
    }
    Ok(())
}

pub(crate) fn finish(
    st: Arc<Mutex<HookState>>,
    states: Vec<Arc<Canon>>,
    setup_flushes: u64,
    total_flushes: u64,
    setup_fences: u64,
    total_fences: u64,
    trace: Option<ferrite_core::sim::FaultTrace>,
) -> Driven {
    let survey = std::mem::take(&mut lock(&st).survey);
    Driven {
        survey,
        states,
        setup_flushes,
        total_flushes,
        setup_fences,
        total_fences,
        trace,
        end_fence: 0,
        geo: None,
        thread_fences: Vec::new(),
        switches: 0,
        waits: 0,
        deaths: 0,
        live_fscks: 0,
        leaks: Vec::new(),
        shared: Vec::new(),
    }
}

/// How long the token holder may make no progress before the run is declared
/// stalled (a broken round assumption: it waits for a lock another thread of the
/// round holds). Not a timing assertion: a healthy step takes microseconds.
pub(crate) const STALL: Duration = Duration::from_secs(120);

/// `before` with the nodes of `files` taken from `after` (the operations of a round
/// change one file each; the namespace is the same before and after).
pub(crate) fn merge(before: &Canon, after: &Canon, files: &[&str]) -> Result<Canon, String> {
    if before.nodes.len() != after.nodes.len()
        || before.nodes.iter().zip(&after.nodes).any(|(a, b)| a.path != b.path)
    {
        return Err("a round of single-file operations changed the namespace".into());
    }
    let nodes =
        before
            .nodes
            .iter()
            .zip(&after.nodes)
            .map(|(b, a)| {
                if files.iter().any(|f| f.as_bytes() == &a.path[..]) {
                    a.clone()
                } else {
                    b.clone()
                }
            })
            .collect();
    Ok(Canon { nodes })
}

/// Files that several operations of a round change (`files`: the file of each of
/// its single-file operations; see [`crate::workloads::commute`]).
pub(crate) fn shared_files<'a>(files: &[&'a str]) -> Vec<&'a str> {
    let mut shared: Vec<&str> =
        files.iter().copied().filter(|f| files.iter().filter(|g| *g == f).count() > 1).collect();
    shared.sort_unstable();
    shared.dedup();
    shared
}

/// The model's tree before a round (`before`) with the operations of `set` that
/// succeeded (`ok`) applied: the state a crash leaves when exactly those took
/// effect, for operations that commute. Nodes named in `loose` get no times.
pub(crate) fn apply_subset(
    before: &Model,
    set: &[usize],
    ok: &[usize],
    op: &dyn Fn(usize) -> Op,
    loose: &[&str],
) -> Result<Canon, Functional> {
    let mut m = before.clone();
    for &k in set.iter().filter(|&&k| ok.contains(&k)) {
        m.apply(&op(k)).map_err(|e| Functional {
            op: k,
            message: format!("the model refused op {k} of a shared round: errno {e}"),
        })?;
    }
    let mut c = m.canon(true);
    for n in c.nodes.iter_mut() {
        if loose.iter().any(|p| p.as_bytes() == &n.path[..]) {
            n.times = None;
        }
    }
    Ok(c)
}

/// `merged` (the round's state file by file) with each file of `shared` taken
/// from `composed` ([`apply_subset`]), its times left open.
pub(crate) fn with_shared(
    mut merged: Canon,
    composed: &Canon,
    shared: &[&str],
) -> Result<Canon, String> {
    for n in merged.nodes.iter_mut() {
        if shared.iter().any(|f| f.as_bytes() == &n.path[..]) {
            let p = composed.nodes.iter().find(|x| x.path == n.path);
            *n = CNode { times: None, ..p.ok_or("a shared file vanished")?.clone() };
        }
    }
    Ok(merged)
}

/// Drive a concurrent workload (its [`crate::workloads::MtPlan`]): rounds of
/// operations on simulated threads, interleaved at every medium step by the seeded
/// scheduler; otherwise as [`drive`].
pub fn drive_mt(
    w: &Workload,
    fault: Option<Fault>,
    capture: Capture,
    sink: &mut dyn FnMut(Vec<FenceRec>, Arc<Expect>) -> bool,
) -> Result<Driven, Functional> {
    let plan = w.mt.as_ref().expect("concurrent workload");
    let fail = |op: usize, message: String| Functional { op, message };
    if w.ops.iter().any(|o| matches!(o, Op::Remount | Op::CrashRemount)) {
        return Err(fail(0, "a concurrent workload cannot remount".into()));
    }
    let sched = Arc::new(Sched::new(crate::rng::Rng::new(plan.seed)));
    let st = Arc::new(Mutex::new(HookState {
        op: 0,
        sched: Some(sched.clone()),
        fence: 0,
        capture,
        recs: Vec::new(),
        survey: Vec::new(),
    }));
    let mkfs = MkfsOptions { shards: 1, inodes: w.inodes, uuid: Some(UUID), ..Default::default() };
    let opts = MountOptions {
        fault: fault.and_then(Fault::core),
        workers: 1,
        atime: AtimeMode::Off,
        ..Default::default()
    };
    let mut fs =
        Fs::mkfs(SimMedium::new(w.pool), &mkfs).map_err(|e| fail(0, format!("mkfs: {e}")))?;
    fs.set_atime_mode(AtimeMode::Off);
    if opts.fault.is_some() {
        let m = fs.unmount().map_err(|e| fail(0, format!("unmount after mkfs: {e}")))?;
        fs = Fs::mount(m, &opts).map_err(|e| fail(0, format!("mount with fault: {e}")))?;
    }
    let m = fs.medium();
    m.set_global_fence(plan.global_fence);
    m.set_fence_hook(Some(make_hook(st.clone())));
    let setup_flushes = m.flush_count();
    let setup_fences = m.fence_count();
    if let Some(f) = fault.and_then(Fault::sim) {
        m.set_fault(Some(f));
    }
    let sc = sched.clone();
    // A turn of a wait for another thread's fence gives the token away (the thread
    // waited for must run); every other step may keep it.
    m.set_step_hook(Some(Arc::new(move || match step_kind() {
        Step::Wait => sc.wait(),
        _ => sc.step(),
    })));
    let mut model = Model::new();
    sync_from_live(&mut model, &fs).map_err(|e| fail(0, e))?;
    let s0 = Arc::new(model.canon(true));
    let live0 = live_canon(&fs, true).map_err(|e| fail(0, e))?;
    if let Some(d) = s0.diff(&live0) {
        return Err(fail(0, format!("fresh file system differs from the model: {d}")));
    }
    let mut states = vec![s0.clone()];
    let recs = std::mem::take(&mut lock(&st).recs);
    let exp = Arc::new(Expect { nofs_ok: true, states: vec![s0], op: 0, op_desc: "mkfs".into() });
    let stop_early = |st: &Arc<Mutex<HookState>>, states: Vec<Arc<Canon>>| {
        fs_medium_cleanup(&fs);
        Ok(finish(st.clone(), states, setup_flushes, 0, setup_fences, 0, None))
    };
    if !sink(recs, exp) {
        return stop_early(&st, states);
    }
    let handles = Mutex::new(Handles::new());
    for round in &plan.rounds {
        let pairs: Vec<(u32, usize)> = round.iter().map(|&k| (plan.thread_of[k - 1], k)).collect();
        let solo = round.len() == 1;
        let results: Mutex<BTreeMap<usize, Result<(), ferrite_core::Error>>> =
            Mutex::new(BTreeMap::new());
        let panicked: Mutex<Option<(usize, String)>> = Mutex::new(None);
        sched.begin_round(&pairs);
        std::thread::scope(|sc| {
            for &(t, k) in &pairs {
                let (fs, sched, handles, results, panicked) =
                    (&fs, &sched, &handles, &results, &panicked);
                let op = &w.ops[k - 1];
                sc.spawn(move || {
                    set_sim_thread(t);
                    // Waits for a lock another thread of the round holds give the
                    // token away instead of blocking (operations on one file).
                    let s2 = Arc::clone(sched);
                    set_wait_hook(Some(Arc::new(move || s2.wait())));
                    sched.arrive(t);
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        if solo {
                            exec(fs, op, &mut lock(handles))
                        } else {
                            // Grouped operations use no handles.
                            exec(fs, op, &mut Handles::new())
                        }
                    }));
                    match r {
                        Ok(r) => {
                            lock(results).insert(k, r);
                        }
                        Err(p) => {
                            let msg = p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            *lock(panicked) = Some((k, msg));
                        }
                    }
                    set_wait_hook(None);
                    sched.done(t);
                });
            }
            // Watchdog: never hang on a broken round assumption.
            let mut last = (sched.steps.load(std::sync::atomic::Ordering::Relaxed), Instant::now());
            // Polled from 20 us up to 2 ms: a short round ends without waiting long.
            let mut nap = Duration::from_micros(20);
            while sched.live() > 0 {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(2));
                let now = sched.steps.load(std::sync::atomic::Ordering::Relaxed);
                if now != last.0 {
                    last = (now, Instant::now());
                } else if last.1.elapsed() > STALL {
                    eprintln!(
                        "crashtest: workload {} stalled in round {round:?}: a thread of the round \
                         waits for a lock another one holds (see sched.rs); aborting",
                        w.name
                    );
                    std::process::abort();
                }
            }
        });
        if let Some((k, msg)) = lock(&panicked).take() {
            return Err(fail(k, format!("op {k} ({}) panicked: {msg}", w.ops[k - 1])));
        }
        let before = states.last().expect("state 0").clone();
        let model_before = model.clone();
        let results = std::mem::take(&mut *lock(&results));
        let succeeded: Vec<usize> =
            results.iter().filter(|(_, r)| r.is_ok()).map(|(&k, _)| k).collect();
        for &k in round {
            let live = results.get(&k).expect("every operation of the round returned");
            check_outcome(k, &w.ops[k - 1], live, &mut model, w.nospc)?;
        }
        let last_k = *round.last().expect("non-empty round");
        let desc = |k: usize| format!("{} [thread {}]", w.ops[k - 1], plan.thread_of[k - 1]);
        sync_from_live(&mut model, &fs)
            .map_err(|e| fail(last_k, format!("round {round:?}: {e}")))?;
        let after = Arc::new(model.canon(true));
        let live_c =
            live_canon(&fs, true).map_err(|e| fail(last_k, format!("round {round:?}: {e}")))?;
        if let Some(d) = after.diff(&live_c) {
            let ops: Vec<String> = round.iter().map(|&k| desc(k)).collect();
            return Err(fail(last_k, format!("after round {round:?} ({}) the file system differs from the model (model left, fs right): {d}", ops.join("; "))));
        }
        // The state of the round with a subset of its operations applied: a file one
        // operation of the round changed is as before or after the round; a file
        // several changed (writes of disjoint ranges, which commute) is the model's
        // before the round with those of the subset applied, its times left open.
        let round_files: Vec<&str> =
            round.iter().filter_map(|&k| groupable(&w.ops[k - 1])).collect();
        let shared = shared_files(&round_files);
        // Namespace operations in the round (mt-dir): every state is the model's tree
        // before the round with the subset applied, the times of what the round
        // touched (names and their directories) left open.
        let names_round = !solo && round.iter().any(|&k| names_of(&w.ops[k - 1]).is_some());
        let loose: Vec<&str> = round
            .iter()
            .flat_map(|&k| {
                let op = &w.ops[k - 1];
                names_of(op).unwrap_or_else(|| groupable(op).into_iter().collect())
            })
            .flat_map(|p| [p, crate::model::split_path(p).0])
            .collect();
        let op_of = |k: usize| w.ops[k - 1].clone();
        let files = |set: &[usize]| -> Vec<&str> {
            set.iter()
                .filter_map(|&k| groupable(&w.ops[k - 1]))
                .filter(|f| !shared.contains(f))
                .collect()
        };
        let with = |set: &[usize]| -> Result<Arc<Canon>, Functional> {
            if solo {
                return Ok(if set.is_empty() { before.clone() } else { after.clone() });
            }
            if set.len() == round.len() {
                return Ok(after.clone());
            }
            if names_round {
                return apply_subset(&model_before, set, &succeeded, &op_of, &loose).map(Arc::new);
            }
            let c = merge(&before, &after, &files(set)).map_err(|e| fail(last_k, e))?;
            if shared.is_empty() {
                return Ok(Arc::new(c));
            }
            let composed = apply_subset(&model_before, set, &succeeded, &op_of, &[])?;
            with_shared(c, &composed, &shared).map(Arc::new).map_err(|e| fail(last_k, e))
        };
        for (i, _) in round.iter().enumerate() {
            states.push(with(&round[..=i])?);
        }
        let recs = std::mem::take(&mut lock(&st).recs);
        for (tag, op, recs) in group_by_tag(recs) {
            let exp_states = tag_states(&tag, &with)?;
            let op_desc = describe(op, &tag, &desc);
            let exp = Arc::new(Expect { nofs_ok: false, states: exp_states, op, op_desc });
            if !sink(recs, exp) {
                return stop_early(&st, states);
            }
        }
    }
    let end_fence = end_point(&st, fs.medium(), &states[w.ops.len()], w.ops.len(), sink);
    let m = fs.medium();
    let trace = fault.and_then(Fault::sim).map(|_| m.fault_trace());
    let (tf, tfe) = (m.flush_count(), m.fence_count());
    let thread_fences = (1..=plan.threads).map(|t| m.thread_fence_count(t)).collect();
    fs_medium_cleanup(&fs);
    let mut d = finish(st, states, setup_flushes, tf, setup_fences, tfe, trace);
    d.end_fence = end_fence;
    d.geo = Some(*fs.geometry());
    d.thread_fences = thread_fences;
    d.switches = sched.switches.load(std::sync::atomic::Ordering::Relaxed);
    d.waits = sched.waits.load(std::sync::atomic::Ordering::Relaxed);
    Ok(d)
}

/// A round's fence records grouped by (round tag, operation), in order of first
/// appearance.
pub(crate) fn group_by_tag(recs: Vec<FenceRec>) -> Vec<(RoundTag, usize, Vec<FenceRec>)> {
    let mut groups: Vec<(RoundTag, usize, Vec<FenceRec>)> = Vec::new();
    for r in recs {
        let tag = r.tag.clone().unwrap_or_default();
        match groups.iter_mut().find(|g| g.0 == tag && g.1 == r.op) {
            Some(g) => g.2.push(r),
            None => groups.push((tag, r.op, vec![r])),
        }
    }
    groups
}

/// Add `c` to `states` unless an equal state is there.
pub(crate) fn push_distinct(states: &mut Vec<Arc<Canon>>, c: Arc<Canon>) {
    if !states.iter().any(|e| **e == *c) {
        states.push(c);
    }
}

/// Makes the state of a round with a set of its operations applied.
pub(crate) type StateOf<'a> = dyn Fn(&[usize]) -> Result<Arc<Canon>, Functional> + 'a;

/// The distinct states a crash at a fence of `tag` may leave: the operations that
/// had returned, with every subset of those in flight (`with` makes a state of a
/// set of operations).
pub(crate) fn tag_states(
    tag: &RoundTag,
    with: &StateOf<'_>,
) -> Result<Vec<Arc<Canon>>, Functional> {
    let mut states = Vec::new();
    let n = tag.in_flight.len();
    for mask in 0..1u32 << n {
        let mut set = tag.returned.clone();
        set.extend((0..n).filter(|b| mask & 1 << b != 0).map(|b| tag.in_flight[b]));
        push_distinct(&mut states, with(&set)?);
    }
    Ok(states)
}

/// Operation `op` as a failure names it, with the others in flight beside it.
pub(crate) fn describe(op: usize, tag: &RoundTag, desc: &dyn Fn(usize) -> String) -> String {
    let mut d = desc(op);
    let others: Vec<String> =
        tag.in_flight.iter().filter(|&&k| k != op).map(|&k| format!("{k}: {}", desc(k))).collect();
    if !others.is_empty() {
        d.push_str(&format!("; also in flight: {}", others.join(", ")));
    }
    d
}

/// The pseudo fence point after the last operation (whatever is still in flight),
/// recorded and handed to `sink` with the final state as the only expectation.
pub(crate) fn end_point(
    st: &Mutex<HookState>,
    m: &SimMedium,
    last: &Arc<Canon>,
    n: usize,
    sink: &mut dyn FnMut(Vec<FenceRec>, Arc<Expect>) -> bool,
) -> u64 {
    let end_fence = {
        let mut s = lock(st);
        s.op = n + 1;
        let f = s.fence;
        s.fence += 1;
        let inf = m.in_flight();
        match &s.capture {
            Capture::Survey => {
                let lines = crate::subset::lines(&inf).len();
                s.survey.push(SurveyPoint { fence: f, op: n + 1, words: inf.len(), lines });
            }
            Capture::Some(set) => {
                if set.contains(&f) {
                    let rec = FenceRec {
                        fence: f,
                        op: n + 1,
                        thread: 0,
                        tag: None,
                        durable: Arc::new(m.durable_image()),
                        in_flight: Arc::new(inf),
                    };
                    s.recs.push(rec);
                }
            }
        }
        f
    };
    let recs = std::mem::take(&mut lock(st).recs);
    let exp = Arc::new(Expect {
        nofs_ok: false,
        states: vec![last.clone()],
        op: n + 1,
        op_desc: "after the last operation".into(),
    });
    sink(recs, exp);
    end_fence
}

fn fs_medium_cleanup(fs: &Fs<SimMedium>) {
    fs.medium().set_fence_hook(None);
    fs.medium().set_step_hook(None);
}
