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

use crate::exec::{exec, live_canon, sync_from_live, Handles};
use crate::model::{Canon, Model, Op};
use crate::workloads::Workload;
use ferrite_core::sim::{FenceHook, FencePoint, InFlight, SimFault};
use ferrite_core::{CoreFault, Fs, MkfsOptions, MountOptions, SimMedium};
use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};

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
    /// A core persist-order fault.
    Core(CoreFault),
}

impl Fault {
    /// Reproducer form.
    pub fn spec(&self) -> String {
        match self {
            Fault::SkipFlush(n) => format!("skip-flush:{n}"),
            Fault::SkipFence(n) => format!("skip-fence:{n}"),
            Fault::Core(CoreFault::TailBeforeData) => "tail-before-data".into(),
            Fault::Core(CoreFault::JournalOutOfOrder) => "journal-out-of-order".into(),
            Fault::Core(CoreFault::EarlyGc) => "early-gc".into(),
            Fault::Core(CoreFault::UncheckedData) => "unchecked-data".into(),
        }
    }

    /// Parse [`Fault::spec`] output.
    pub fn parse(s: &str) -> Result<Fault, String> {
        let n = |t: &str| t.parse::<u64>().map_err(|_| format!("bad fault index '{t}'"));
        Ok(match s.split_once(':') {
            Some(("skip-flush", t)) => Fault::SkipFlush(n(t)?),
            Some(("skip-fence", t)) => Fault::SkipFence(n(t)?),
            None if s == "tail-before-data" => Fault::Core(CoreFault::TailBeforeData),
            None if s == "journal-out-of-order" => Fault::Core(CoreFault::JournalOutOfOrder),
            None if s == "early-gc" => Fault::Core(CoreFault::EarlyGc),
            None if s == "unchecked-data" => Fault::Core(CoreFault::UncheckedData),
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
    /// Operation in flight.
    pub op: usize,
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

struct HookState {
    op: usize,
    fence: u64,
    capture: Capture,
    recs: Vec<FenceRec>,
    survey: Vec<SurveyPoint>,
}

fn make_hook(st: Arc<Mutex<HookState>>) -> FenceHook {
    Box::new(move |p: &FencePoint<'_>| {
        let mut s = lock(&st);
        let fence = s.fence;
        s.fence += 1;
        let op = s.op;
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
    let fail = |op: usize, message: String| Functional { op, message };
    let st = Arc::new(Mutex::new(HookState {
        op: 0,
        fence: 0,
        capture,
        recs: Vec::new(),
        survey: Vec::new(),
    }));
    let mkfs = MkfsOptions { shards: 1, inodes: w.inodes, uuid: Some(UUID), ..Default::default() };
    let opts =
        MountOptions { fault: fault.and_then(Fault::core), workers: 1, ..Default::default() };
    let m = SimMedium::new(w.pool);
    if w.mkfs_points {
        m.set_fence_hook(Some(make_hook(st.clone())));
    }
    let mut fs = Fs::mkfs(m, &mkfs).map_err(|e| fail(0, format!("mkfs: {e}")))?;
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
        let mut next = model.clone();
        let pred = next.apply(op);
        match (&live, pred) {
            (Ok(()), Ok(())) => model = next,
            (Err(e), Err(p)) if e.errno() == p => {}
            (Err(ferrite_core::Error::NoSpace), _) if w.nospc => {}
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
    // The pseudo fence point after the last operation: whatever is still in flight.
    let n = w.ops.len();
    let end_fence = {
        let mut s = lock(&st);
        s.op = n + 1;
        let f = s.fence;
        s.fence += 1;
        let inf = fs.medium().in_flight();
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
                        durable: Arc::new(fs.medium().durable_image()),
                        in_flight: Arc::new(inf),
                    };
                    s.recs.push(rec);
                }
            }
        }
        f
    };
    let recs = std::mem::take(&mut lock(&st).recs);
    let last = states[n].clone();
    let exp = Arc::new(Expect {
        nofs_ok: false,
        states: vec![last],
        op: n + 1,
        op_desc: "after the last operation".into(),
    });
    sink(recs, exp);
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

fn finish(
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
    }
}
