//! Exploring crash states of workloads: survey, budget planning, parallel checking,
//! fault-injection scans and replay of a single crash state.
//!
//! Invariants:
//! - A run is two passes over each workload: a survey (fence points and how many
//!   words are in flight at each) and a capture pass that snapshots the planned fence
//!   points. Both passes are the same deterministic run.
//! - The budget counts crash states of the workloads; crashes during recovery and
//!   post-recovery probes come on top and are reported separately.
//! - Every failure carries a reproducer that `--replay` turns back into the same crash
//!   image (workload, seed, fence, subset, optional recovery fence and subset, fault).

use crate::check::{self, guarded, Checked};
use crate::drive::{drive, lock, Capture, Expect, Fault, FenceRec, Functional, SurveyPoint};
use crate::rng::Rng;
use crate::subset::{self, Subset};
use crate::workloads::Workload;
use ferrite_core::sim::crash_image;
use ferrite_core::CoreFault;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Exploration settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// Seed of random workloads, subset sampling and fence-point sampling.
    pub seed: u64,
    /// Crash states to check across the workloads.
    pub states: u64,
    /// Checker threads.
    pub threads: usize,
    /// Enumerate every subset when at most this many words are in flight.
    pub enum_max: u32,
    /// Random subsets per fence point in a full exploration (beyond the structured ones).
    pub randoms: usize,
    /// Share of the budget spent, on top, crashing recoveries that repaired something.
    pub recovery_share: f64,
    /// Most crash states per explored recovery.
    pub recovery_max: usize,
    /// Most recoveries crashed per fence point.
    pub recoveries_per_point: usize,
    /// Probe (use, unmount, remount) every n-th recovered image (0: never).
    pub probe_every: u64,
    /// Stop at the first failure.
    pub stop_on_failure: bool,
    /// Failures kept in full.
    pub keep_failures: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            seed: 1,
            states: 20_000,
            threads: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2),
            enum_max: 10,
            randoms: 8,
            recovery_share: 0.3,
            recovery_max: 24,
            recoveries_per_point: 4,
            probe_every: 16,
            stop_on_failure: false,
            keep_failures: 20,
        }
    }
}

/// One failing crash state.
#[derive(Clone, Debug)]
pub struct Failure {
    /// Workload.
    pub workload: String,
    /// Seed of the run.
    pub seed: u64,
    /// Fault injected in the run.
    pub fault: Option<Fault>,
    /// Operation in flight (0: mkfs; len+1: after the last).
    pub op: usize,
    /// The operation.
    pub op_desc: String,
    /// Fence number.
    pub fence: u64,
    /// In-flight words that reached media.
    pub subset: Subset,
    /// Crash during recovery: recovery fence and subset.
    pub recovery: Option<(u64, Subset)>,
    /// What went wrong.
    pub message: String,
}

impl Failure {
    /// The `--replay` argument that rebuilds this crash state.
    pub fn replay_spec(&self) -> String {
        let mut s = format!(
            "workload={},seed={},op={},fence={},subset={}",
            self.workload,
            self.seed,
            self.op,
            self.fence,
            self.subset.spec()
        );
        if let Some((rf, rs)) = &self.recovery {
            s.push_str(&format!(",rfence={rf},rsubset={}", rs.spec()));
        }
        if let Some(f) = self.fault {
            s.push_str(&format!(",inject={}", f.spec()));
        }
        s
    }
}

/// Counters of one workload.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Crash states checked.
    pub states: u64,
    /// Crash states checked during recoveries.
    pub recovery_states: u64,
    /// Recoveries explored for crashes.
    pub recoveries_explored: u64,
    /// Recovered images probed.
    pub probes: u64,
    /// Images whose recovery repaired something.
    pub repaired: u64,
    /// Images of a half-made pool that mount refused (crash during mkfs).
    pub nofs: u64,
    /// Failing states.
    pub failure_count: u64,
    /// The first failures in full.
    pub failures: Vec<Failure>,
}

/// Report of one workload.
#[derive(Clone, Debug)]
pub struct WorkloadReport {
    /// Name.
    pub name: String,
    /// Operations.
    pub ops: usize,
    /// Fence points (including the point after the last operation).
    pub fence_points: usize,
    /// Crash states a full exploration would check.
    pub natural: u64,
    /// Crash states planned.
    pub planned: u64,
    /// Counters.
    pub tally: Tally,
    /// Functional failure of the running file system, if any.
    pub functional: Option<Functional>,
    /// Client workloads: the documented reference-count leaks of dead clients the
    /// live daemon's fsck accepted (`Driven::leaks`).
    pub leaks: Vec<String>,
    /// Seconds.
    pub secs: f64,
}

struct WlCtx {
    name: String,
    seed: u64,
    fault: Option<Fault>,
    tally: Mutex<Tally>,
    rec_budget: AtomicI64,
    probe_ctr: AtomicU64,
    pending: AtomicUsize,
}

struct Job {
    ctx: Arc<WlCtx>,
    rec: FenceRec,
    subsets: Vec<Subset>,
    exp: Arc<Expect>,
}

struct Pool {
    tx: Option<SyncSender<Job>>,
    workers: Vec<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Pool {
    fn new(cfg: &Config) -> Pool {
        let (tx, rx) = sync_channel::<Job>(cfg.threads.max(1) * 2);
        let rx = Arc::new(Mutex::new(rx));
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..cfg.threads.max(1))
            .map(|_| {
                let rx: Arc<Mutex<Receiver<Job>>> = rx.clone();
                let cfg = cfg.clone();
                let stop = stop.clone();
                std::thread::spawn(move || loop {
                    let job = lock(&rx).recv();
                    match job {
                        Ok(job) => {
                            process(&job, &cfg, &stop);
                            job.ctx.pending.fetch_sub(1, Ordering::AcqRel);
                        }
                        Err(_) => return,
                    }
                })
            })
            .collect();
        Pool { tx: Some(tx), workers, stop }
    }

    fn send(&self, job: Job) {
        job.ctx.pending.fetch_add(1, Ordering::AcqRel);
        let ctx = job.ctx.clone();
        if self.tx.as_ref().expect("pool open").send(job).is_err() {
            ctx.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn drain(&self, ctx: &WlCtx) {
        while ctx.pending.load(Ordering::Acquire) > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.tx.take();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn record(ctx: &WlCtx, cfg: &Config, stop: &AtomicBool, f: Failure) {
    let mut t = lock(&ctx.tally);
    t.failure_count += 1;
    if t.failures.len() < cfg.keep_failures {
        t.failures.push(f);
    }
    if cfg.stop_on_failure {
        stop.store(true, Ordering::Release);
    }
}

fn process(job: &Job, cfg: &Config, stop: &AtomicBool) {
    let ctx = &job.ctx;
    let rec = &job.rec;
    let mut rng = Rng::derive(ctx.seed, rec.fence ^ 0x5eed);
    let mut explored = 0; // recoveries crashed for this fence point
    let fail = |sub: &Subset, recovery: Option<(u64, Subset)>, message: String| Failure {
        workload: ctx.name.clone(),
        seed: ctx.seed,
        fault: ctx.fault,
        op: job.exp.op,
        op_desc: job.exp.op_desc.clone(),
        fence: rec.fence,
        subset: sub.clone(),
        recovery,
        message,
    };
    for sub in &job.subsets {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let img = crash_image(&rec.durable, sub.select(&rec.in_flight));
        let r = guarded(|| check::check_image(img, &job.exp));
        lock(&ctx.tally).states += 1;
        match r {
            Err(msg) => record(ctx, cfg, stop, fail(sub, None, msg)),
            Ok(Checked::NoFs) => lock(&ctx.tally).nofs += 1,
            Ok(Checked::Fs { fs, canon, repaired }) => {
                if repaired != 0 {
                    lock(&ctx.tally).repaired += 1;
                }
                // Crash the recoveries that repaired something (a few per point).
                if repaired != 0
                    && explored < cfg.recoveries_per_point
                    && ctx.rec_budget.load(Ordering::Acquire) > 0
                {
                    explored += 1;
                    let img = crash_image(&rec.durable, sub.select(&rec.in_flight));
                    let target = Arc::new(canon.clone());
                    let (n, f) = check::recovery_crashes(&img, &target, cfg.recovery_max, &mut rng);
                    ctx.rec_budget.fetch_sub(n as i64, Ordering::AcqRel);
                    {
                        let mut t = lock(&ctx.tally);
                        t.recovery_states += n;
                        t.recoveries_explored += 1;
                    }
                    if let Some(f) = f {
                        record(ctx, cfg, stop, fail(sub, Some((f.rfence, f.rsubset)), f.message));
                    }
                }
                let k = ctx.probe_ctr.fetch_add(1, Ordering::AcqRel);
                if cfg.probe_every > 0 && k.is_multiple_of(cfg.probe_every) {
                    let r = guarded(|| check::probe(*fs, &canon));
                    lock(&ctx.tally).probes += 1;
                    if let Err(msg) = r {
                        record(ctx, cfg, stop, fail(sub, None, msg));
                    }
                }
            }
        }
    }
}

/// Plan quotas (subsets per fence point) for a budget.
pub fn plan_quotas(
    survey: &[SurveyPoint],
    budget: u64,
    cfg: &Config,
    rng: &mut Rng,
) -> HashMap<u64, usize> {
    let nat: Vec<u64> = survey
        .iter()
        .map(|p| subset::natural_count(p.words, p.lines, cfg.enum_max, cfg.randoms))
        .collect();
    let total: u64 = nat.iter().sum();
    let mut q: HashMap<u64, usize> = HashMap::new();
    if total <= budget {
        // Everything, then spend the rest on more random subsets of large points.
        let big: Vec<usize> =
            (0..survey.len()).filter(|&i| survey[i].words > cfg.enum_max as usize).collect();
        let weight: u64 = big.iter().map(|&i| survey[i].words as u64).sum();
        let extra = budget - total;
        for (i, p) in survey.iter().enumerate() {
            let mut n = nat[i];
            if weight > 0 && p.words > cfg.enum_max as usize {
                n += extra * p.words as u64 / weight;
            }
            q.insert(p.fence, n as usize);
        }
        return q;
    }
    let mins: Vec<u64> = nat.iter().map(|&n| n.min(2)).collect();
    let msum: u64 = mins.iter().sum();
    if msum > budget {
        // Seeded sample of fence points, two states each.
        let mut idx: Vec<usize> = (0..survey.len()).collect();
        for i in (1..idx.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            idx.swap(i, j);
        }
        let mut used = 0;
        for i in idx {
            if used + mins[i] > budget {
                continue;
            }
            used += mins[i];
            q.insert(survey[i].fence, mins[i] as usize);
        }
        return q;
    }
    let rest = budget - msum;
    let spread = total - msum;
    for (i, p) in survey.iter().enumerate() {
        let n = mins[i] + (nat[i] - mins[i]) * rest / spread.max(1);
        q.insert(p.fence, n as usize);
    }
    q
}

fn natural(survey: &[SurveyPoint], cfg: &Config) -> u64 {
    survey.iter().map(|p| subset::natural_count(p.words, p.lines, cfg.enum_max, cfg.randoms)).sum()
}

/// Survey a workload (no capture).
pub fn survey(w: &Workload, fault: Option<Fault>) -> Result<crate::drive::Driven, Functional> {
    drive(w, fault, Capture::Survey, &mut |_, _| true)
}

/// Explore one workload with a budget; `sv` is its survey.
pub fn explore_workload(
    w: &Workload,
    sv: &[SurveyPoint],
    budget: u64,
    cfg: &Config,
    fault: Option<Fault>,
) -> WorkloadReport {
    let t0 = Instant::now();
    let mut rng = Rng::derive(cfg.seed, 0xb0d9e7);
    let quotas = Arc::new(plan_quotas(sv, budget, cfg, &mut rng));
    let planned = quotas.values().map(|&n| n as u64).sum();
    let ctx = Arc::new(WlCtx {
        name: w.name.clone(),
        seed: cfg.seed,
        fault,
        tally: Mutex::new(Tally::default()),
        rec_budget: AtomicI64::new((budget as f64 * cfg.recovery_share) as i64),
        probe_ctr: AtomicU64::new(0),
        pending: AtomicUsize::new(0),
    });
    let pool = Pool::new(cfg);
    let keys: HashSet<u64> = quotas.keys().copied().collect();
    let enum_max = cfg.enum_max;
    let seed = cfg.seed;
    let stop = pool.stop.clone();
    let res = drive(w, fault, Capture::Some(Arc::new(keys)), &mut |recs, exp| {
        for rec in recs {
            let quota = quotas.get(&rec.fence).copied().unwrap_or(0);
            if quota == 0 {
                continue;
            }
            let mut r = Rng::derive(seed, rec.fence);
            let subsets = subset::plan(&rec.in_flight, quota, enum_max, &mut r);
            pool.send(Job { ctx: ctx.clone(), rec, subsets, exp: exp.clone() });
        }
        !stop.load(Ordering::Acquire)
    });
    pool.drain(&ctx);
    drop(pool);
    let tally = lock(&ctx.tally).clone();
    let (functional, leaks) = match res {
        Ok(d) => (None, d.leaks),
        Err(f) => (Some(f), Vec::new()),
    };
    WorkloadReport {
        name: w.name.clone(),
        ops: w.ops.len(),
        fence_points: sv.len(),
        natural: natural(sv, cfg),
        planned,
        tally,
        functional,
        leaks,
        secs: t0.elapsed().as_secs_f64(),
    }
}

/// Report of a suite run.
#[derive(Clone, Debug, Default)]
pub struct SuiteReport {
    /// Per workload.
    pub workloads: Vec<WorkloadReport>,
    /// Seconds.
    pub secs: f64,
}

impl SuiteReport {
    /// Crash states checked.
    pub fn states(&self) -> u64 {
        self.workloads.iter().map(|w| w.tally.states).sum()
    }
    /// Crash states checked during recoveries.
    pub fn recovery_states(&self) -> u64 {
        self.workloads.iter().map(|w| w.tally.recovery_states).sum()
    }
    /// Failing crash states plus functional failures.
    pub fn failures(&self) -> u64 {
        self.workloads.iter().map(|w| w.tally.failure_count + w.functional.is_some() as u64).sum()
    }
}

/// Explore `workloads` with `cfg.states` crash states split by their natural sizes.
pub fn run_suite(
    workloads: &[Workload],
    cfg: &Config,
    fault: Option<Fault>,
    progress: &mut dyn FnMut(&WorkloadReport),
) -> SuiteReport {
    check::install_panic_hook();
    check::set_quiet(true);
    let t0 = Instant::now();
    let mut surveys = Vec::new();
    for w in workloads {
        surveys.push(survey(w, fault));
    }
    let nat: Vec<u64> = surveys
        .iter()
        .map(|s| s.as_ref().map(|d| natural(&d.survey, cfg).max(1)).unwrap_or(0))
        .collect();
    let total: u64 = nat.iter().sum::<u64>().max(1);
    let mut rep = SuiteReport::default();
    for (i, w) in workloads.iter().enumerate() {
        let r = match &surveys[i] {
            Err(f) => WorkloadReport {
                name: w.name.clone(),
                ops: w.ops.len(),
                fence_points: 0,
                natural: 0,
                planned: 0,
                tally: Tally::default(),
                functional: Some(f.clone()),
                leaks: Vec::new(),
                secs: 0.0,
            },
            Ok(d) => {
                let budget = (cfg.states as u128 * nat[i] as u128).div_ceil(total as u128) as u64;
                explore_workload(w, &d.survey, budget, cfg, fault)
            }
        };
        progress(&r);
        let stop = cfg.stop_on_failure && (r.tally.failure_count > 0 || r.functional.is_some());
        rep.workloads.push(r);
        if stop {
            break;
        }
    }
    check::set_quiet(false);
    rep.secs = t0.elapsed().as_secs_f64();
    rep
}

/// The injectable fault kinds, as `--inject` names them.
pub const FAULT_KINDS: [&str; 13] = [
    "skip-flush",
    "skip-fence",
    "skip-thread-fence",
    "tail-before-data",
    "journal-out-of-order",
    "early-gc",
    "unchecked-data",
    "client-stale-lease",
    "tail-before-other-data",
    "past-tail-kept",
    "gc-referenced-page",
    "tail-before-prev-fence",
    "unsettled-journal-mark",
];

/// One scanned variant of a fault.
#[derive(Clone, Debug)]
pub struct Variant {
    /// Workload.
    pub workload: String,
    /// The fault.
    pub fault: Fault,
    /// First failure, if detected.
    pub detected: Option<Failure>,
    /// Functional failure (the fault broke the running file system visibly).
    pub functional: Option<Functional>,
    /// Crash states checked.
    pub states: u64,
    /// What a simulated fault did.
    pub trace: Option<ferrite_core::sim::FaultTrace>,
    /// What the words the fault left behind hold.
    pub regions: Vec<String>,
}

/// Report of a fault-injection scan.
#[derive(Clone, Debug)]
pub struct InjectReport {
    /// Fault kind.
    pub kind: String,
    /// Variants run.
    pub variants: Vec<Variant>,
    /// Seconds.
    pub secs: f64,
}

impl InjectReport {
    /// Variants detected.
    pub fn detected(&self) -> usize {
        self.variants.iter().filter(|v| v.detected.is_some() || v.functional.is_some()).count()
    }
}

/// Scan fault `kind` over `workloads`: for skip-flush / skip-fence, up to
/// `variants` flush / fence numbers per workload spread over the operations; for a
/// core fault, one run per workload. Each variant explores with `cfg.states` (per
/// variant) and stops at its first failure.
pub fn inject(
    kind: &str,
    workloads: &[Workload],
    variants: usize,
    cfg: &Config,
) -> Result<InjectReport, String> {
    check::install_panic_hook();
    let t0 = Instant::now();
    let mut cfg = cfg.clone();
    cfg.stop_on_failure = true;
    cfg.probe_every = 0;
    let mut out = Vec::new();
    for w in workloads {
        let base = survey(w, None).map_err(|f| {
            format!("workload {} fails without a fault (op {}): {}", w.name, f.op, f.message)
        })?;
        let faults: Vec<Fault> = match kind {
            "skip-flush" | "skip-fence" => {
                let (a, b) = if kind == "skip-flush" {
                    (base.setup_flushes, base.total_flushes)
                } else {
                    (base.setup_fences, base.total_fences)
                };
                let n = b.saturating_sub(a);
                let pick: Vec<u64> = if n as usize <= variants {
                    (a..b).collect()
                } else {
                    (0..variants as u64).map(|i| a + i * n / variants as u64).collect()
                };
                pick.into_iter()
                    .map(|x| {
                        if kind == "skip-flush" {
                            Fault::SkipFlush(x)
                        } else {
                            Fault::SkipFence(x)
                        }
                    })
                    .collect()
            }
            "skip-thread-fence" => {
                // Every simulated thread's fences, `variants` spread over them.
                let nt = base.thread_fences.len().max(1);
                let per = variants.div_ceil(nt).max(1);
                let mut v = Vec::new();
                for (i, &n) in base.thread_fences.iter().enumerate() {
                    let pick: Vec<u64> = if n as usize <= per {
                        (0..n).collect()
                    } else {
                        (0..per as u64).map(|j| j * n / per as u64).collect()
                    };
                    v.extend(pick.into_iter().map(|x| Fault::SkipThreadFence(i as u32 + 1, x)));
                }
                if v.is_empty() {
                    return Err(format!(
                        "skip-thread-fence needs a concurrent workload (mt-*), not {}",
                        w.name
                    ));
                }
                v
            }
            "tail-before-data" => vec![Fault::Core(CoreFault::TailBeforeData)],
            "journal-out-of-order" => vec![Fault::Core(CoreFault::JournalOutOfOrder)],
            "early-gc" => vec![Fault::Core(CoreFault::EarlyGc)],
            "unchecked-data" => vec![Fault::Core(CoreFault::UncheckedData)],
            "client-stale-lease" => vec![Fault::Core(CoreFault::StaleLease)],
            "tail-before-other-data" => vec![Fault::Core(CoreFault::AdoptUnflushed)],
            "past-tail-kept" => vec![Fault::Core(CoreFault::AdoptKeepsPastTail)],
            "gc-referenced-page" => vec![Fault::Core(CoreFault::GcReferenced)],
            "tail-before-prev-fence" => vec![Fault::Core(CoreFault::NoFenceWait)],
            "unsettled-journal-mark" => vec![Fault::Core(CoreFault::UnsettledMarks)],
            other => return Err(format!("unknown fault '{other}' (see --list-faults)")),
        };
        check::set_quiet(true);
        for f in faults {
            let sv = match survey(w, Some(f)) {
                Ok(d) => d,
                Err(func) => {
                    out.push(Variant {
                        workload: w.name.clone(),
                        fault: f,
                        detected: None,
                        functional: Some(func),
                        states: 0,
                        trace: None,
                        regions: Vec::new(),
                    });
                    continue;
                }
            };
            let r = explore_workload(w, &sv.survey, cfg.states, &cfg, Some(f));
            out.push(Variant {
                workload: w.name.clone(),
                fault: f,
                detected: r.tally.failures.first().cloned(),
                functional: r.functional.clone(),
                states: r.tally.states,
                regions: match (&sv.trace, &sv.geo) {
                    (Some(t), Some(g)) => {
                        let mut v: Vec<String> =
                            t.words.iter().map(|&o| crate::drive::region(g, o)).collect();
                        v.dedup();
                        v
                    }
                    _ => Vec::new(),
                },
                trace: sv.trace,
            });
        }
        check::set_quiet(false);
    }
    Ok(InjectReport { kind: kind.into(), variants: out, secs: t0.elapsed().as_secs_f64() })
}

/// A parsed `--replay` argument.
#[derive(Clone, Debug)]
pub struct ReplaySpec {
    /// Workload.
    pub workload: String,
    /// Seed.
    pub seed: u64,
    /// Operation in flight at the fence (checked when given).
    pub op: Option<usize>,
    /// Fence number.
    pub fence: u64,
    /// Subset.
    pub subset: Subset,
    /// Crash during recovery.
    pub recovery: Option<(u64, Subset)>,
    /// Fault.
    pub fault: Option<Fault>,
}

impl ReplaySpec {
    /// Parse `workload=..,seed=..[,op=..],fence=..,subset=..[,rfence=..,rsubset=..][,inject=..]`.
    pub fn parse(s: &str) -> Result<ReplaySpec, String> {
        let mut kv: HashMap<&str, &str> = HashMap::new();
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("replay spec part '{part}' is not key=value"))?;
            if kv.insert(k.trim(), v.trim()).is_some() {
                return Err(format!("replay spec names '{k}' twice"));
            }
        }
        let get = |k: &str| kv.get(k).copied().ok_or_else(|| format!("replay spec lacks '{k}='"));
        let num = |k: &str| -> Result<u64, String> {
            get(k)?.parse().map_err(|_| format!("replay spec: '{k}' is not a number"))
        };
        for k in kv.keys() {
            if !["workload", "seed", "op", "fence", "subset", "rfence", "rsubset", "inject"]
                .contains(k)
            {
                return Err(format!("replay spec: unknown key '{k}'"));
            }
        }
        let recovery = match (kv.get("rfence"), kv.get("rsubset")) {
            (None, None) => None,
            (Some(_), Some(rs)) => Some((num("rfence")?, Subset::parse(rs)?)),
            _ => return Err("replay spec: rfence and rsubset go together".into()),
        };
        Ok(ReplaySpec {
            workload: get("workload")?.to_string(),
            seed: num("seed")?,
            op: kv.get("op").map(|_| num("op").map(|n| n as usize)).transpose()?,
            fence: num("fence")?,
            subset: Subset::parse(get("subset")?)?,
            recovery,
            fault: kv.get("inject").map(|f| Fault::parse(f)).transpose()?,
        })
    }
}

/// Rebuild one crash state and check it, describing every step on `out`. Returns
/// Ok(true) if the state passes, Ok(false) if it fails, Err if it cannot be rebuilt.
pub fn replay(spec: &ReplaySpec, out: &mut dyn std::io::Write) -> Result<bool, String> {
    check::install_panic_hook();
    let ws = crate::workloads::select(&spec.workload, spec.seed)?;
    let w = &ws[0];
    let mut got: Option<(FenceRec, Arc<Expect>)> = None;
    let target = spec.fence;
    let res =
        drive(w, spec.fault, Capture::Some(Arc::new(HashSet::from([target]))), &mut |recs, exp| {
            if let Some(r) = recs.into_iter().next() {
                got = Some((r, exp));
                return false;
            }
            true
        });
    if let Err(f) = res {
        let _ = writeln!(out, "the workload itself fails at op {}: {}", f.op, f.message);
        return Ok(false);
    }
    let (rec, exp) =
        got.ok_or_else(|| format!("workload {} has no fence point {target}", w.name))?;
    if let Some(op) = spec.op {
        if op != exp.op {
            return Err(format!(
                "fence {target} falls in op {} ({}) in this run, not op {op}: this is not the \
                 run that printed the reproducer (different version or seed)",
                exp.op, exp.op_desc
            ));
        }
    }
    let w_ = |out: &mut dyn std::io::Write, s: String| {
        let _ = writeln!(out, "{s}");
    };
    w_(
        out,
        format!("workload {}: fence {} during op {} ({})", w.name, rec.fence, exp.op, exp.op_desc),
    );
    if w.mt.is_some() {
        w_(out, format!("the fence is simulated thread {}'s", rec.thread));
    }
    let lines = subset::lines(&rec.in_flight);
    w_(out, format!("in flight: {} words in {} cache lines", rec.in_flight.len(), lines.len()));
    let chosen = spec.subset.select(&rec.in_flight);
    let missing = spec.subset.missing(&rec.in_flight);
    if !missing.is_empty() {
        w_(out, format!("warning: subset names words not in flight in this run: {missing:x?}"));
    }
    w_(out, format!("subset {}: {} words reach media", spec.subset.spec(), chosen.len()));
    // Where the words are (from the superblock of the durable image, if any).
    let geo = ferrite_core::recovery::read_superblock(&ferrite_core::SimMedium::from_image(
        rec.durable.to_vec(),
    ))
    .ok()
    .map(|(sb, _)| sb.geometry());
    let inn = |off: u64| chosen.iter().any(|c| c.off == off);
    for l in &lines {
        let ws: Vec<_> = rec.in_flight.iter().filter(|f| f.off / 64 * 64 == *l).collect();
        let n_in = ws.iter().filter(|f| inn(f.off)).count();
        let what = |o: u64| geo.as_ref().map(|g| crate::drive::region(g, o)).unwrap_or_default();
        w_(out, format!("  line {l:#010x} ({}): {} word(s), {n_in} in", what(ws[0].off), ws.len()));
        if rec.in_flight.len() <= 64 {
            for f in ws {
                let tag = if inn(f.off) { "in " } else { "out" };
                w_(out, format!("    {tag} {:#010x} = {:#018x}  {}", f.off, f.val, what(f.off)));
            }
        }
    }
    let mut img = crash_image(&rec.durable, chosen);
    if let Some((rf, rs)) = &spec.recovery {
        w_(out, format!("crashing the recovery at its fence {rf} with subset {}", rs.spec()));
        img = check::recovery_crash_image(&img, *rf, rs)?;
        // The recovery crash must come back to what an uninterrupted recovery gives.
        let first = guarded(|| {
            check::check_image(crash_image(&rec.durable, spec.subset.select(&rec.in_flight)), &exp)
        });
        match first {
            Ok(Checked::Fs { canon, .. }) => {
                let exp2 = Expect {
                    nofs_ok: false,
                    states: vec![Arc::new(canon)],
                    op: exp.op,
                    op_desc: exp.op_desc.clone(),
                };
                return report_check(out, img, &exp2);
            }
            Ok(Checked::NoFs) => w_(out, "the uninterrupted recovery finds no file system".into()),
            Err(e) => w_(out, format!("the uninterrupted recovery already fails: {e}")),
        }
        return Ok(false);
    }
    report_check(out, img, &exp)
}

fn report_check(out: &mut dyn std::io::Write, img: Vec<u8>, exp: &Expect) -> Result<bool, String> {
    match guarded(|| check::check_image(img, exp)) {
        Ok(Checked::NoFs) => {
            let _ = writeln!(out, "PASS: mount refused a half-made pool (crash during mkfs)");
            Ok(true)
        }
        Ok(Checked::Fs { fs, canon, .. }) => {
            let r = fs.mount_report();
            let _ = writeln!(
                out,
                "recovery: journals rolled back {}, torn logs {}, orphans freed {}",
                r.journals_rolled_back, r.torn_logs, r.orphans_freed
            );
            let which = exp.states.iter().position(|s| s.admits(&canon)).unwrap_or(0);
            let _ = writeln!(
                out,
                "PASS: fsck clean, tree equals the model {} the operation",
                if exp.states.len() == 1 {
                    "at"
                } else if which == 0 {
                    "before"
                } else {
                    "after"
                }
            );
            Ok(true)
        }
        Err(e) => {
            let _ = writeln!(out, "FAIL: {e}");
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_spec_roundtrip_and_errors() {
        let f = Failure {
            workload: "rename".into(),
            seed: 3,
            fault: Some(Fault::SkipFlush(41)),
            op: 6,
            op_desc: String::new(),
            fence: 11,
            subset: Subset::Words(vec![0x3050, 0x3090]),
            recovery: Some((1, Subset::LineIn(0x2000))),
            message: String::new(),
        };
        let s = ReplaySpec::parse(&f.replay_spec()).unwrap();
        assert_eq!((s.workload.as_str(), s.seed, s.op, s.fence), ("rename", 3, Some(6), 11));
        assert_eq!(s.subset, f.subset);
        assert_eq!(s.recovery, f.recovery);
        assert_eq!(s.fault, f.fault);
        for bad in [
            "workload=x,seed=1,fence=1",
            "workload=x,seed=1,fence=1,subset=all,bogus=2",
            "workload=x,seed=1,fence=1,subset=all,rfence=1",
            "workload=x,seed=z,fence=1,subset=all",
            "workload=x,seed=1,fence=1,subset=all,inject=nope",
            "workload=x,workload=y,seed=1,fence=1,subset=all",
        ] {
            assert!(ReplaySpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn quotas_fit_the_budget() {
        let sv: Vec<SurveyPoint> = (0..50)
            .map(|i| SurveyPoint { fence: i, op: i as usize, words: (i % 30) as usize, lines: 3 })
            .collect();
        let cfg = Config::default();
        let mut r = Rng::new(1);
        for budget in [20u64, 60, 500, 5000, 50_000] {
            let q = plan_quotas(&sv, budget, &cfg, &mut r);
            let total: u64 = q.values().map(|&n| n as u64).sum();
            assert!(total <= budget + sv.len() as u64, "budget {budget}: planned {total}");
            if budget >= 100 {
                assert_eq!(q.len(), sv.len(), "every fence point gets states");
                assert!(total * 10 >= budget * 9, "budget {budget} mostly used: {total}");
            }
        }
    }
}
