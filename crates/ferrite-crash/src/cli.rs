//! `ferrite crashtest`: command-line front end of the simulator.
//!
//! Exit codes: 0 all checked states pass (with `--inject`: the fault was detected;
//! with `--replay`: the state passes), 1 failures (with `--inject`: not detected),
//! 2 bad arguments or a run that could not start.

use crate::drive::Fault;
use crate::explore::{self, Config, ReplaySpec, SuiteReport, FAULT_KINDS};
use crate::process;
use crate::workloads::{self, Workload};
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `ferrite crashtest`.
#[derive(clap::Args, Clone, Debug)]
pub struct CrashArgs {
    /// Workload name, a comma-separated list, or "all"; `random:SEED:OPS[:POOL_KIB]`
    /// names a generated workload (see --list-workloads).
    #[arg(long, default_value = "all")]
    pub workload: String,
    /// Seed of random workloads and of crash-state sampling.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Crash states to check across the selected workloads (crashes during
    /// recovery come on top). With --inject: per fault variant.
    #[arg(long, default_value_t = 20_000)]
    pub states: u64,
    /// Inject a fault and report whether the simulator detects it (see --list-faults).
    #[arg(long, value_name = "FAULT")]
    pub inject: Option<String>,
    /// Variants of skip-flush / skip-fence scanned per workload.
    #[arg(long, default_value_t = 24)]
    pub variants: usize,
    /// Print the injectable faults, one per line.
    #[arg(long)]
    pub list_faults: bool,
    /// Print the workloads, one per line.
    #[arg(long)]
    pub list_workloads: bool,
    /// Rebuild and check one crash state from a reproducer.
    #[arg(long, value_name = "SPEC")]
    pub replay: Option<String>,
    /// Checker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Instead of simulating: kill this many child processes at random moments.
    #[arg(long, value_name = "RUNS")]
    pub process: Option<u64>,
    /// Operations per child process (with --process).
    #[arg(long, default_value_t = 2000)]
    pub process_ops: usize,
    /// Directory for child pools (with --process).
    #[arg(long, default_value = "/dev/shm")]
    pub process_dir: PathBuf,
    /// Stop at the first failing crash state.
    #[arg(long)]
    pub stop_on_failure: bool,
    /// The release run: every workload (single-threaded and `mt-*`) with at least
    /// 1,000,000 crash states (1,020,000 planned; more if --states says so).
    #[arg(long)]
    pub release_budget: bool,
    /// Also write a JSON summary of the run to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[arg(long, hide = true)]
    #[doc(hidden)]
    pub child_pool: Option<PathBuf>,
    #[arg(long, hide = true, default_value_t = 0)]
    #[doc(hidden)]
    pub child_seed: u64,
    #[arg(long, hide = true, default_value_t = 0)]
    #[doc(hidden)]
    pub child_ops: usize,
}

/// Workloads scanned by skip-flush / skip-fence when `--workload all`.
pub const SCAN_WORKLOADS: &str = "write-pages,namespace,rename,truncate";

/// Workloads scanned by skip-thread-fence when `--workload all`.
pub const MT_SCAN_WORKLOADS: &str = "mt-private,mt-gc,mt-dir,client-parallel";

/// Crash states `--release-budget` must check at least.
pub const RELEASE_BUDGET: u64 = 1_000_000;

/// The budget it plans: the planner's per-point quotas round down (999,550 of a
/// 1,000,000 budget in the first run), so it plans 2% more.
const RELEASE_PLAN: u64 = RELEASE_BUDGET + RELEASE_BUDGET / 50;

fn config(a: &CrashArgs) -> Config {
    let mut c = Config {
        seed: a.seed,
        states: if a.release_budget { a.states.max(RELEASE_PLAN) } else { a.states },
        stop_on_failure: a.stop_on_failure,
        ..Config::default()
    };
    if a.threads > 0 {
        c.threads = a.threads.min(64);
    }
    c
}

/// Run `ferrite crashtest`; returns the exit code.
pub fn run(a: &CrashArgs) -> i32 {
    if let Some(pool) = &a.child_pool {
        return process::child_main(pool, a.child_seed, a.child_ops);
    }
    if a.list_faults {
        for f in FAULT_KINDS {
            println!("{f}");
        }
        return 0;
    }
    if a.list_workloads {
        for w in workloads::suite(a.seed) {
            println!("{:<16} {}", w.name, w.about);
        }
        return 0;
    }
    if let Some(spec) = &a.replay {
        let spec = match ReplaySpec::parse(spec) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("crashtest: {e}");
                return 2;
            }
        };
        return match explore::replay(&spec, &mut std::io::stdout()) {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(e) => {
                eprintln!("crashtest: {e}");
                2
            }
        };
    }
    if let Some(runs) = a.process {
        return run_process(a, runs);
    }
    if let Some(kind) = &a.inject {
        return run_inject(a, kind);
    }
    let sel = if a.release_budget { "all" } else { a.workload.as_str() };
    let ws = match workloads::select(sel, a.seed) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("crashtest: {e}");
            return 2;
        }
    };
    let cfg = config(a);
    println!(
        "crashtest: {} workload(s), budget {} crash states, seed {}, {} checker thread(s)",
        ws.len(),
        cfg.states,
        cfg.seed,
        cfg.threads
    );
    let rep = explore::run_suite(&ws, &cfg, None, &mut |r| print_workload(r, cfg.seed));
    print_summary(&rep);
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&json_summary(&rep, &cfg)).expect("json");
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("crashtest: cannot write {}: {e}", path.display());
            return 2;
        }
    }
    if rep.failures() == 0 {
        0
    } else {
        1
    }
}

fn print_workload(r: &explore::WorkloadReport, seed: u64) {
    let t = &r.tally;
    println!(
        "  {:<16} ops {:>3}  fences {:>4}  states {:>6}/{:<7} recovery-crash {:>5}  probes {:>4}  failures {:>3}  {:>6.1}s",
        r.name,
        r.ops,
        r.fence_points,
        t.states,
        r.natural,
        t.recovery_states,
        t.probes,
        t.failure_count + r.functional.is_some() as u64,
        r.secs
    );
    for l in &r.leaks {
        println!("    accepted (documented leak of a dead client's reference count): {l}");
    }
    if let Some(f) = &r.functional {
        println!("    FUNCTIONAL FAILURE at op {}: {}", f.op, f.message);
        println!("    reproduce: ferrite crashtest --workload {} --seed {seed} --states 0", r.name);
    }
}

/// The JSON summary of a run (`--json`).
pub fn json_summary(rep: &SuiteReport, cfg: &Config) -> serde_json::Value {
    let total = rep.states() + rep.recovery_states();
    let wl: Vec<serde_json::Value> = rep
        .workloads
        .iter()
        .map(|w| {
            let t = &w.tally;
            serde_json::json!({
                "name": w.name,
                "ops": w.ops,
                "fence_points": w.fence_points,
                "natural": w.natural,
                "planned": w.planned,
                "states": t.states,
                "recovery_states": t.recovery_states,
                "probes": t.probes,
                "failures": t.failure_count + w.functional.is_some() as u64,
                "functional": w.functional.as_ref().map(|f| format!("op {}: {}", f.op, f.message)),
                "replays": t.failures.iter().map(|f| f.replay_spec()).collect::<Vec<_>>(),
                "leaks": w.leaks,
                "secs": w.secs,
            })
        })
        .collect();
    let mut kinds = serde_json::Map::new();
    for k in ["single", "mt", "client"] {
        let of: Vec<_> = rep.workloads.iter().filter(|w| kind_of(&w.name) == k).collect();
        kinds.insert(
            k.into(),
            serde_json::json!({
                "workloads": of.len(),
                "states": of.iter().map(|w| w.tally.states).sum::<u64>(),
                "recovery_states": of.iter().map(|w| w.tally.recovery_states).sum::<u64>(),
                "failures": of
                    .iter()
                    .map(|w| w.tally.failure_count + w.functional.is_some() as u64)
                    .sum::<u64>(),
                "secs": of.iter().map(|w| w.secs).sum::<f64>(),
            }),
        );
    }
    serde_json::json!({
        "seed": cfg.seed,
        "budget": cfg.states,
        "checker_threads": cfg.threads,
        "states": rep.states(),
        "recovery_states": rep.recovery_states(),
        "failures": rep.failures(),
        "secs": rep.secs,
        "states_per_sec": total as f64 / rep.secs.max(1e-9),
        "kinds": kinds,
        "workloads": wl,
    })
}

/// A workload's kind in summaries: `mt` (`mt-*`), `client` (`client-*`) or `single`.
pub fn kind_of(name: &str) -> &'static str {
    if name.starts_with("mt-") {
        "mt"
    } else if name.starts_with("client-") {
        "client"
    } else {
        "single"
    }
}

fn print_summary(rep: &SuiteReport) {
    for k in ["single", "mt", "client"] {
        let of: Vec<_> = rep.workloads.iter().filter(|w| kind_of(&w.name) == k).collect();
        if of.is_empty() {
            continue;
        }
        println!(
            "  {k:<7} {:>3} workload(s)  states {:>8}  recovery-crash {:>7}  failures {:>4}  {:>7.1}s",
            of.len(),
            of.iter().map(|w| w.tally.states).sum::<u64>(),
            of.iter().map(|w| w.tally.recovery_states).sum::<u64>(),
            of.iter().map(|w| w.tally.failure_count + w.functional.is_some() as u64).sum::<u64>(),
            of.iter().map(|w| w.secs).sum::<f64>(),
        );
    }
    let states = rep.states();
    println!(
        "checked {} crash states (+ {} crashes during recovery), {} failure(s), {:.1}s ({:.0} states/s)",
        states,
        rep.recovery_states(),
        rep.failures(),
        rep.secs,
        (states + rep.recovery_states()) as f64 / rep.secs.max(1e-9)
    );
    for w in &rep.workloads {
        for f in &w.tally.failures {
            println!(
                "FAIL {} op {} ({}) fence {}{}: {}",
                f.workload,
                f.op,
                f.op_desc,
                f.fence,
                f.recovery
                    .as_ref()
                    .map(|(rf, _)| format!(" recovery fence {rf}"))
                    .unwrap_or_default(),
                f.message
            );
            println!("  replay: ferrite crashtest --replay '{}'", f.replay_spec());
        }
        if w.tally.failure_count > w.tally.failures.len() as u64 {
            println!(
                "  ({} more failures in {})",
                w.tally.failure_count - w.tally.failures.len() as u64,
                w.name
            );
        }
    }
}

fn run_inject(a: &CrashArgs, kind: &str) -> i32 {
    if a.variants == 0 {
        eprintln!("crashtest: --variants must be at least 1");
        return 2;
    }
    if !FAULT_KINDS.contains(&kind) {
        eprintln!("crashtest: unknown fault '{kind}' (known: {})", FAULT_KINDS.join(", "));
        return 2;
    }
    let sel = if a.workload == "all" && (kind == "skip-flush" || kind == "skip-fence") {
        SCAN_WORKLOADS
    } else if a.workload == "all" && kind == "skip-thread-fence" {
        MT_SCAN_WORKLOADS
    } else if a.workload == "all" && kind == "client-stale-lease" {
        "client-revoke"
    } else if a.workload == "all" && kind == "tail-before-other-data" {
        "client-death"
    } else if a.workload == "all" && kind == "past-tail-kept" {
        "client-death-in-place"
    } else if a.workload == "all" && kind == "gc-referenced-page" {
        "mt-gc,client-gc,gc"
    } else if a.workload == "all" && kind == "tail-before-prev-fence" {
        "mt-shared-file"
    } else if a.workload == "all" && kind == "unsettled-journal-mark" {
        "journal-linger"
    } else {
        a.workload.as_str()
    };
    let ws: Vec<Workload> = match workloads::select(sel, a.seed) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("crashtest: {e}");
            return 2;
        }
    };
    let cfg = config(a);
    let t0 = Instant::now();
    let rep = match explore::inject(kind, &ws, a.variants, &cfg) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("crashtest: {e}");
            return 2;
        }
    };
    for v in &rep.variants {
        let what = match (&v.detected, &v.functional) {
            (Some(f), _) => format!(
                "DETECTED at op {} ({}) fence {}: {}\n      replay: ferrite crashtest --replay '{}'",
                f.op,
                f.op_desc,
                f.fence,
                truncate(&f.message, 160),
                f.replay_spec()
            ),
            (None, Some(func)) => format!("DETECTED as a functional failure at op {}: {}", func.op, func.message),
            (None, None) => format!("not detected ({})", explain(v)),
        };
        println!("  {:<12} {:<22} states {:>5}  {what}", v.workload, v.fault.spec(), v.states);
    }
    let n = rep.detected();
    println!(
        "fault {kind}: detected by {n} of {} variant(s), {:.1}s",
        rep.variants.len(),
        t0.elapsed().as_secs_f64()
    );
    if n > 0 {
        0
    } else {
        1
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.len() <= n {
        s.to_string()
    } else {
        let mut i = n;
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        format!("{}...", &s[..i])
    }
}

/// Why a scanned variant may have gone undetected, from its fault trace.
pub fn explain(v: &explore::Variant) -> String {
    match (&v.fault, &v.trace) {
        (Fault::SkipFlush(_), Some(t)) if !t.fired => "the flush was never reached".into(),
        (Fault::SkipFlush(_), Some(t)) if t.words.is_empty() => {
            "no-op: the skipped flush covered no dirty word".into()
        }
        (Fault::SkipFlush(_), Some(t)) if t.exposed_fences == 0 => {
            "harmless: a later flush wrote the words back before the next fence".into()
        }
        (Fault::SkipFlush(_), Some(t)) => format!(
            "{} word(s) of {} left dirty across {} fence(s) without changing any recovered state",
            t.words.len(),
            v.regions.join(", "),
            t.exposed_fences
        ),
        (Fault::SkipFence(_) | Fault::SkipThreadFence(..), Some(t)) if !t.fired => {
            "the fence was never reached".into()
        }
        (Fault::SkipFence(_) | Fault::SkipThreadFence(..), Some(t)) if t.words.is_empty() => {
            "no-op: nothing was waiting for the skipped fence".into()
        }
        (Fault::SkipFence(_) | Fault::SkipThreadFence(..), Some(t)) => format!(
            "{} word(s) of {} became durable one fence late without visible effect",
            t.words.len(),
            v.regions.join(", ")
        ),
        _ => "no crash state violated the oracle".into(),
    }
}

fn run_process(a: &CrashArgs, runs: u64) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("crashtest: cannot find this program to re-run it: {e}");
            return 2;
        }
    };
    // `ferrite crashtest ...` re-runs itself as `ferrite crashtest --child-...`.
    let prefix: Vec<String> =
        std::env::args().nth(1).filter(|s| s == "crashtest").into_iter().collect();
    let t0 = Instant::now();
    let res =
        process::run_process_crashes(&exe, &prefix, runs, a.seed, a.process_ops, &a.process_dir);
    let mut fails = 0;
    for r in &res {
        if let Some(f) = &r.failure {
            fails += 1;
            println!("FAIL seed {}: {f}", r.seed);
        }
    }
    let mid = res.iter().filter(|r| !r.finished && !r.before_ready).count();
    let landed = res.iter().filter(|r| r.next_op_landed).count();
    println!(
        "process crashes: {} run(s), {} killed mid-workload, {} with the unacknowledged next op durable, {} failure(s), {:.1}s",
        res.len(),
        mid,
        landed,
        fails,
        t0.elapsed().as_secs_f64()
    );
    if fails == 0 {
        0
    } else {
        1
    }
}
