//! `ferrite bench`: reproduces the source papers' experiments on this machine with
//! FerriteFS and its peers in the same run, and reports ratios, tables and plots.
//!
//! Targets ([`target`]): FerriteFS through the library API, FerriteFS through its
//! FUSE mount, kernel tmpfs, kernel ext4 on a loop device over /dev/shm, and the
//! hardware limit (memcpy, non-temporal copy + fence); optional library targets on
//! emulated slower media ([`emu`]). Experiments ([`exp`]): fio-style micro, appends
//! (FLEX), metadata, filebench personalities, recovery, GC under pressure, memory;
//! write amplification comes from the persistence counters of the micro runs.
//!
//! Output: `results.json` (every sample), `report.md` (one table per experiment,
//! goals first), `plots/*.svg`.
//!
//! Invariants:
//! - Same workload, data sizes and durability request on every target; one warm-up,
//!   then `reps` measured repetitions interleaved across targets; medians and spread.
//! - A target that cannot be set up is skipped with a printed reason; a cell that
//!   fails is reported as failed, never as a number.
//! - Mounts and scratch files this run created are removed at the end, also after a
//!   panic inside an experiment.
#![deny(unsafe_code)] // allowed only in target::mapped (fenced)
#![warn(missing_docs)]

pub mod config;
pub mod emu;
pub mod exp;
pub mod goals;
pub mod plot;
pub mod report;
pub mod results;
pub mod rng;
pub mod stats;
pub mod target;
pub mod xcore;

pub use config::{BenchArgs, Config};

use emu::{CountedMedium, EmuMedium};
use ferrite_core::{MapOptions, MmapMedium};
use results::{Results, TargetStatus};
use std::path::{Path, PathBuf};
use std::time::Instant;
use target::dir::{fs_type, DirTarget};
use target::hw::{HwMode, HwTarget};
use target::lib::{LibTarget, MediumFactory};
use target::{TResult, Target};

/// Name of the FerriteFS library target.
pub const LIB: &str = "ferrite-lib";
/// Name of the direct-access target.
pub const DIRECT: &str = "ferrite-direct";
/// Set in the preloaded re-run of a bench with the direct target: its mount point.
const DIRECT_ENV: &str = "FERRITE_BENCH_DIRECT";
const DIRECT_DESC: &str = "FerriteFS through the preload library (`ferrite run`): names through \
    the FUSE mount, data read and written by this process through its own mapping of the pool; \
    every write durable when it returns, fsync a no-op";

fn open_or_create(p: &Path, n: u64, create: bool) -> ferrite_core::Result<MmapMedium> {
    if create {
        MmapMedium::create(p, n, &MapOptions::default())
    } else {
        MmapMedium::open(p, &MapOptions::default())
    }
}

/// A FerriteFS library target on a new pool (`profile`: emulated media).
pub fn lib_target(
    name: &str,
    pool: PathBuf,
    size: u64,
    profile: Option<emu::Profile>,
) -> TResult<Box<dyn Target>> {
    fn describe<M: CountedMedium>(size: u64, extra: &str, m: &ferrite_core::Fs<M>) -> String {
        format!(
            "FerriteFS library API on a {} pool in /dev/shm{extra}; every operation is durable \
             when it returns ({}), so fsync has nothing to do",
            config::fmt_size(size),
            m.medium().durability().describe()
        )
    }
    match profile {
        None => {
            let make: MediumFactory<MmapMedium> = Box::new(open_or_create);
            let t = LibTarget::new(name, "", pool, size, make)?;
            let fs = t.fs()?;
            let extra =
                format!(" ({} MiB of it mapped in 2 MiB pages)", fs.medium().huge_mapped() >> 20);
            let d = describe(size, &extra, fs);
            Ok(Box::new(t.with_description(d)))
        }
        Some(p) => {
            let extra = format!(
                ", emulated {} media (+{} ns per fence, +{} ns per written line, +{} ns per read)",
                p.name, p.fence_ns, p.line_ns, p.read_ns
            );
            let make: MediumFactory<EmuMedium<MmapMedium>> = Box::new(move |path, n, c| {
                Ok(EmuMedium::new(open_or_create(path, n, c)?, p.clone()))
            });
            let t = LibTarget::new(name, "", pool, size, make)?;
            let d = describe(size, &extra, t.fs()?);
            Ok(Box::new(t.with_description(d)))
        }
    }
}

/// The `ferrite` binary that can serve the FUSE target.
fn ferrite_bin(cfg: &Config) -> Option<PathBuf> {
    if let Some(b) = &cfg.ferrite_bin {
        return Some(b.clone());
    }
    let exe = std::env::current_exe().ok()?;
    if exe.file_name().is_some_and(|n| n == "ferrite") {
        return Some(exe);
    }
    let dir = exe.parent()?;
    // Beside this binary, or one level up (test binaries live in target/*/deps).
    [dir.join("ferrite"), dir.parent()?.join("ferrite")].into_iter().find(|p| p.is_file())
}

struct Built {
    targets: Vec<Box<dyn Target>>,
    status: Vec<TargetStatus>,
}

fn build_targets(cfg: &Config, direct_skip: Option<String>) -> Built {
    let w = &cfg.work_dir;
    let mut targets: Vec<Box<dyn Target>> = Vec::new();
    let mut status = Vec::new();
    let mut add = |name: &str, r: Result<Box<dyn Target>, String>| match r {
        Ok(t) => {
            eprintln!("  {:<22} {}", t.name(), t.describe());
            status.push(TargetStatus { name: t.name().into(), detail: t.describe(), used: true });
            targets.push(t);
        }
        Err(why) => {
            eprintln!("  {name:<22} skipped: {why}");
            status.push(TargetStatus { name: name.into(), detail: why, used: false });
        }
    };
    if cfg.wants("lib") {
        add(
            LIB,
            lib_target(LIB, w.join("lib.pool"), cfg.pool_size, None).map_err(|e| e.to_string()),
        );
        for e in &cfg.emulate {
            let name = format!("{LIB}[{e}]");
            let p = emu::profile(e);
            add(
                &name,
                lib_target(&name, w.join(format!("lib-{e}.pool")), cfg.pool_size, p)
                    .map_err(|e| e.to_string()),
            );
        }
    }
    if cfg.wants("fuse") {
        let r = match ferrite_bin(cfg) {
            Some(bin) => {
                DirTarget::fuse(&bin, w.join("fuse.pool"), w.join("mnt-fuse"), cfg.pool_size)
                    .map(|t| Box::new(t) as Box<dyn Target>)
            }
            None => {
                Err("no `ferrite` binary found (build ferrite-cli, or pass --ferrite-bin)".into())
            }
        };
        add("ferrite-fuse", r);
    }
    if cfg.wants("direct") {
        let r = match (std::env::var_os(DIRECT_ENV), direct_skip) {
            (Some(mnt), _) => DirTarget::borrowed(DIRECT, DIRECT_DESC, PathBuf::from(mnt))
                .map(|t| Box::new(t) as Box<dyn Target>),
            (None, Some(why)) => Err(why),
            (None, None) => Err("runs only in the preloaded re-run".into()),
        };
        add(DIRECT, r);
    }
    if cfg.wants("tmpfs") {
        add("tmpfs", DirTarget::tmpfs(w.join("tmpfs")).map(|t| Box::new(t) as Box<dyn Target>));
    }
    if cfg.wants("ext4") {
        add(
            "ext4",
            DirTarget::ext4(w.join("ext4.img"), w.join("mnt-ext4"), cfg.pool_size)
                .map(|t| Box::new(t) as Box<dyn Target>),
        );
    }
    if cfg.wants("hw") {
        let region = cfg.hw_region();
        for mode in HwMode::ALL {
            let name = mode.name();
            let path = w.join(format!("{name}.map"));
            add(
                name,
                HwTarget::new(path, region, 4, mode)
                    .map(|t| Box::new(t) as Box<dyn Target>)
                    .map_err(|e| e.to_string()),
            );
        }
    }
    Built { targets, status }
}

fn machine(cfg: &Config) -> std::collections::BTreeMap<String, String> {
    let mut m = std::collections::BTreeMap::new();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into());
    m.insert("cpu".into(), cpu);
    m.insert(
        "cores".into(),
        std::thread::available_parallelism()
            .map(|n| n.get().to_string())
            .unwrap_or_else(|_| "?".into()),
    );
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kb| format!("{:.1} GiB", kb as f64 / 1048576.0))
        .unwrap_or_else(|| "?".into());
    m.insert("memory".into(), mem);
    m.insert(
        "kernel".into(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
    );
    let pc = ferrite_core::pmem::config();
    m.insert(
        "persistence".into(),
        format!(
            "flush {:?}, non-temporal stores {} (copies of {} bytes or more), data page \
             checksums {}",
            pc.flush,
            if pc.nt_stores { "on" } else { "off" },
            pc.nt_threshold,
            ferrite_core::log::page_crc_kernel()
        ),
    );
    m.insert(
        "scratch".into(),
        format!("{} ({})", cfg.work_dir.display(), fs_type(&cfg.work_dir).unwrap_or_default()),
    );
    m.insert(
        "build".into(),
        if cfg!(debug_assertions) {
            "debug (numbers are not representative: use a release build)".into()
        } else {
            "release".into()
        },
    );
    if let Ok(o) = std::process::Command::new("git").args(["rev-parse", "--short", "HEAD"]).output()
    {
        if o.status.success() {
            m.insert("commit".into(), String::from_utf8_lossy(&o.stdout).trim().to_string());
        }
    }
    m.insert("preset".into(), cfg.preset.into());
    m.insert("load average at start".into(), loadavg());
    m.insert("cross-core line transfer at start".into(), line_transfer());
    m
}

/// [`xcore::line_transfer_ns`] as a machine fact.
fn line_transfer() -> String {
    xcore::line_transfer_ns().map_or_else(|| "not measured".into(), |ns| format!("{ns:.0} ns"))
}

/// /proc/loadavg's 1, 5 and 15 minute averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn method_notes(cfg: &Config) -> Vec<String> {
    vec![
        format!(
            "Every cell: one warm-up (not recorded), then {} measured repetitions; targets are \
             interleaved within each repetition. Tables show the median and ± half the min–max \
             range as a percentage of the median.",
            cfg.reps
        ),
        "Ratios are of medians from this run. Throughput is bytes (10^6) or operations per second \
         of wall time over all threads of a phase."
            .into(),
        "Durability: every FerriteFS operation is durable and atomic when it returns (one fence \
         per write; fsync then has nothing to do and issues no fence); tmpfs keeps everything in DRAM (fsync does nothing); ext4 commits its journal on \
         fsync, through a loop device to a /dev/shm file. hw-memcpy moves bytes with no flush; \
         hw-ntstore uses non-temporal stores and a fence per fsync; hw-clwb uses plain stores, \
         flushes each written line and fences per fsync (the floor of a program's own stores: \
         a persistent buffer's filling); hw-msync (mmap experiment) flushes every line from \
         the written page's start, as an msync of a DAX mapping must (its address is \
         page-aligned, and no instruction tells which lines changed): the floor of a store \
         + msync."
            .into(),
        "The machine has no persistent memory: pools live in /dev/shm, so stores reach DRAM. \
         Emulation profiles (--emulate) add delays per fence, per written cache line and per read."
            .into(),
        "Pools (library, FUSE, hardware mappings) are pre-faulted: every page is written once \
         before formatting, as on a long-lived pool, so no target pays /dev/shm's first-touch \
         page allocation inside a measurement. Files of the micro workloads are written in full \
         before they are measured, on every target."
            .into(),
        "Write amplification counts what the FerriteFS medium flushes or writes non-temporally; it \
         is a software count, not a DIMM counter."
            .into(),
        "Two-thread rows depend on where the host put the two CPUs: a cache line moves between \
         them in about 40 ns on one last-level cache and 105-168 ns across the chip (EPYC \
         hosts), and a host may move them within seconds. The machine facts give that transfer \
         time at start and end, and the two-writer goal row the median and range of its \
         repetitions' (each measured right after its repetition)."
            .into(),
    ]
}

/// Remove what an interrupted earlier run left in /dev/shm: its mounts (ext4 loop,
/// FUSE) and its scratch directory, when the process that made them is gone.
fn cleanup_stale_runs() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else { return };
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let Some(pid) = name.strip_prefix("ferrite-bench-").and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        let d = dir.to_string_lossy().to_string();
        let mut stuck = false;
        for m in mounts.lines().filter_map(|l| l.split(' ').nth(1)) {
            if m.starts_with(&format!("{d}/")) {
                let ok = std::process::Command::new("umount")
                    .args(["-l", m])
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
                    || std::process::Command::new("fusermount3")
                        .args(["-u", "-z", m])
                        .stderr(std::process::Stdio::null())
                        .status()
                        .is_ok_and(|s| s.success());
                stuck |= !ok;
            }
        }
        if !stuck {
            eprintln!("removing {d} left by an interrupted run (pid {pid})");
            cleanup_work_dir(&dir);
        }
    }
}

fn cleanup_work_dir(dir: &Path) {
    let Ok(s) = std::fs::read_to_string("/proc/mounts") else { return };
    let d = dir.to_string_lossy();
    if s.lines().any(|l| l.split(' ').nth(1).is_some_and(|m| m.starts_with(d.as_ref()))) {
        eprintln!("warning: something is still mounted under {d}; leaving it in place");
        return;
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Run `ferrite bench`; returns the process exit code (0: every experiment ran;
/// 1: an experiment failed; 2: bad arguments or no output).
pub fn run(args: &BenchArgs) -> i32 {
    if std::env::var_os(exp::memory::CHILD_ENV).is_some() {
        return exp::memory::child_main();
    }
    let cfg = match Config::from_args(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferrite bench: {e}");
            return 2;
        }
    };
    let mut direct_skip = None;
    if cfg.wants("direct") && std::env::var_os(DIRECT_ENV).is_none() {
        match rerun_with_direct(&cfg) {
            Ok(code) => return code,
            Err(why) => {
                eprintln!("  {DIRECT:<22} skipped: {why}");
                direct_skip = Some(why);
            }
        }
    }
    let started = Instant::now();
    cleanup_stale_runs();
    if let Err(e) = std::fs::create_dir_all(cfg.out.join("plots")) {
        eprintln!("ferrite bench: {}: {e}", cfg.out.display());
        return 2;
    }
    if let Err(e) = std::fs::create_dir_all(&cfg.work_dir) {
        eprintln!("ferrite bench: {}: {e}", cfg.work_dir.display());
        return 2;
    }
    if fs_type(&cfg.work_dir).as_deref() != Some("tmpfs") {
        eprintln!(
            "warning: {} is not on tmpfs; pools will not behave like memory",
            cfg.work_dir.display()
        );
    }
    if cfg!(debug_assertions) {
        eprintln!("warning: debug build; numbers are not representative (use --release)");
    }
    let busy =
        loadavg().split_whitespace().next().and_then(|l| l.parse::<f64>().ok()).unwrap_or(0.0);
    if busy > 0.5 {
        eprintln!(
            "warning: load average {busy:.1}: other work on this machine will disturb the numbers"
        );
    }
    let mut res = Results {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started: report::utc_stamp(std::time::SystemTime::now()),
        machine: machine(&cfg),
        config: serde_json::to_value(&cfg).unwrap_or_default(),
        notes: method_notes(&cfg),
        ..Default::default()
    };
    eprintln!("ferrite bench ({} preset): targets", cfg.preset);
    let Built { mut targets, status } = build_targets(&cfg, direct_skip);
    res.targets = status;
    res.target_kinds = targets.iter().map(|t| (t.name().to_string(), t.kind())).collect();
    let mut failed = false;
    for e in cfg.experiments.clone() {
        eprintln!("== {e}");
        let t0 = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| -> TResult<()> {
            if e == "gc" {
                return run_gc(&cfg, &mut targets, &mut res);
            }
            let mut ctx = exp::Ctx { cfg: &cfg, targets: &mut targets, res: &mut res };
            match e.as_str() {
                "micro" => exp::micro::run(&mut ctx),
                "append" => exp::append::run(&mut ctx),
                "mmap" => exp::mmap::run(&mut ctx),
                "meta" => exp::meta::run(&mut ctx),
                "filebench" => exp::filebench::run(&mut ctx),
                "programs" => exp::programs::run(&mut ctx),
                "real-work" => exp::realwork::run(&mut ctx),
                "recovery" => exp::recovery::run(&mut ctx),
                "memory" => exp::memory::run(&mut ctx),
                _ => Ok(()),
            }
        }));
        let err = match r {
            Ok(Ok(())) => None,
            Ok(Err(x)) => Some(x.to_string()),
            Err(p) => Some(format!(
                "panicked: {}",
                p.downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default()
            )),
        };
        if let Some(x) = &err {
            eprintln!("   {e} FAILED: {x}");
            failed = true;
        } else {
            eprintln!("   {e} done in {:.1} s", t0.elapsed().as_secs_f64());
        }
        res.experiments.push((e, err));
    }
    drop(targets);
    if let Some(t) = goals::wa_table(&res, &cfg.sizes, &cfg.append_sizes) {
        res.text_tables.push(("wa".into(), t));
        res.experiments.push(("wa".into(), None));
    }
    res.goals = goals::evaluate(&mut res);
    res.machine.insert("load average at end".into(), loadavg());
    res.machine.insert("cross-core line transfer at end".into(), line_transfer());
    res.elapsed_secs = started.elapsed().as_secs_f64();
    let code = match write_outputs(&cfg, &mut res) {
        Ok(()) => {
            if failed {
                1
            } else {
                0
            }
        }
        Err(e) => {
            eprintln!("ferrite bench: {e}");
            2
        }
    };
    cleanup_work_dir(&cfg.work_dir);
    code
}

/// The direct target measures the preload library, which must be loaded when the
/// process starts and its mount exist then: mount a pool with direct access, run
/// this bench again with the library preloaded (every target in that one process,
/// interleaved as always), then unmount. The library only serves that mount
/// (FERRITE_MOUNTS); the FUSE target's mount offers no direct access.
fn rerun_with_direct(cfg: &Config) -> Result<i32, String> {
    let bin = ferrite_bin(cfg).ok_or("no `ferrite` binary found (build ferrite-cli)")?;
    let lib = ferrite_direct::preload_library(&bin)
        .ok_or_else(|| format!("no libferrite_preload.so beside {}", bin.display()))?;
    let w = &cfg.work_dir;
    std::fs::create_dir_all(w).map_err(|e| format!("{}: {e}", w.display()))?;
    let mnt = w.join("mnt-direct");
    let mount = DirTarget::direct_mount(&bin, w.join("direct.pool"), mnt.clone(), cfg.pool_size)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let st = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_PRELOAD", &lib)
        .env("FERRITE_MOUNTS", &mnt)
        .env(DIRECT_ENV, &mnt)
        .env("FERRITE_BENCH_OUT", &cfg.out)
        .status()
        .map_err(|e| format!("re-running with the preload library: {e}"))?;
    drop(mount);
    cleanup_work_dir(w);
    Ok(st.code().unwrap_or(1))
}

fn run_gc(cfg: &Config, targets: &mut Vec<Box<dyn Target>>, res: &mut Results) -> TResult<()> {
    // The GC run needs bounded capacity: its own small library pool and ext4 image.
    let mut gc: Vec<Box<dyn Target>> = Vec::new();
    let mut skipped = Vec::new();
    if cfg.wants("lib") {
        match lib_target(LIB, cfg.work_dir.join("gc.pool"), cfg.gc_pool, None) {
            Ok(t) => gc.push(t),
            Err(e) => skipped.push((LIB.to_string(), e.to_string())),
        }
    }
    if cfg.wants("ext4") {
        match DirTarget::ext4(
            cfg.work_dir.join("gc-ext4.img"),
            cfg.work_dir.join("mnt-gc-ext4"),
            cfg.gc_pool,
        ) {
            Ok(t) => gc.push(Box::new(t)),
            Err(e) => skipped.push(("ext4".to_string(), e)),
        }
    }
    let mut ctx = exp::Ctx { cfg, targets, res };
    exp::gc::run(&mut ctx, gc, &skipped)
}

fn write_outputs(cfg: &Config, res: &mut Results) -> Result<(), String> {
    let plots_dir = cfg.out.join("plots");
    let mut plot_errors = Vec::new();
    for (_, p) in &res.plots {
        if let Err(e) = plot::render(p, &plots_dir) {
            plot_errors.push(e);
        }
    }
    for e in plot_errors {
        res.notes.push(format!("plot not drawn: {e}"));
    }
    let md = report::markdown(res);
    let json = serde_json::to_string_pretty(&res).map_err(|e| e.to_string())?;
    std::fs::write(cfg.out.join("results.json"), json)
        .map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    std::fs::write(cfg.out.join("report.md"), &md)
        .map_err(|e| format!("{}: {e}", cfg.out.display()))?;
    println!("\nPerformance goals ({} preset):\n", cfg.preset);
    println!("| goal | measured | result |\n|---|---|---|");
    for g in &res.goals {
        println!("| {} | {} | {} |", g.goal, g.measured, g.status.text());
    }
    println!(
        "\nReport: {}\nSamples: {}\nPlots: {}",
        cfg.out.join("report.md").display(),
        cfg.out.join("results.json").display(),
        plots_dir.display()
    );
    Ok(())
}
