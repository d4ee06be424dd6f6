//! fio-style micro benchmarks: sequential and random reads and writes of one I/O size,
//! fsync after each write, 1 thread, or 2 threads on private files or one shared file
//! (Zhu et al., Electronics 2021, section 4: fio with fsync=1).
//!
//! Invariants:
//! - Files are written in full before they are measured, so writes are overwrites of
//!   allocated files and reads never hit holes, on every target alike.
//! - Offsets are aligned to the I/O size (fio's default); random offsets come from the
//!   same seeded generator on every target.
//! - A repetition stops after `ops_for(size)` operations per thread or its time cap,
//!   whichever is first; throughput is bytes over the phase's wall time.

use super::{io_sample, parallel, pattern, prefill, say, Ctx, Phase};
use crate::config::{fmt_size, Config};
use crate::results::{Plot, Row, Series, Table};
use crate::rng::Rng;
use crate::target::{TResult, Target, TargetError};
use std::time::Duration;

/// Access pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Sequential writes.
    SeqWrite,
    /// Random writes.
    RandWrite,
    /// Sequential reads.
    SeqRead,
    /// Random reads.
    RandRead,
}

impl Pattern {
    /// All patterns, in table order.
    pub const ALL: [Pattern; 4] =
        [Pattern::RandWrite, Pattern::SeqWrite, Pattern::RandRead, Pattern::SeqRead];

    /// Case prefix.
    pub fn id(self) -> &'static str {
        match self {
            Pattern::SeqWrite => "seqwrite",
            Pattern::RandWrite => "randwrite",
            Pattern::SeqRead => "seqread",
            Pattern::RandRead => "randread",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Pattern::SeqWrite => "Sequential write, fsync after each write",
            Pattern::RandWrite => "Random write, fsync after each write",
            Pattern::SeqRead => "Sequential read",
            Pattern::RandRead => "Random read",
        }
    }

    fn write(self) -> bool {
        matches!(self, Pattern::SeqWrite | Pattern::RandWrite)
    }

    fn random(self) -> bool {
        matches!(self, Pattern::RandWrite | Pattern::RandRead)
    }
}

/// Thread configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threads {
    /// Thread count.
    pub n: usize,
    /// One shared file instead of a file per thread.
    pub shared: bool,
}

impl Threads {
    /// Case suffix: `t1`, `t2-private`, `t2-shared`.
    pub fn id(self) -> String {
        if self.n == 1 {
            "t1".into()
        } else if self.shared {
            format!("t{}-shared", self.n)
        } else {
            format!("t{}-private", self.n)
        }
    }

    fn label(self) -> String {
        if self.n == 1 {
            "1 thread".into()
        } else if self.shared {
            format!("{} threads, shared file", self.n)
        } else {
            format!("{} threads, private files", self.n)
        }
    }
}

/// Case key of a micro cell.
pub fn case_key(p: Pattern, size: u64, th: Threads) -> String {
    format!("{}/{}/{}", p.id(), fmt_size(size), th.id())
}

/// Extra of a multi-threaded sample: the cross-core line transfer time measured right
/// after it, ns ([`crate::xcore::line_transfer_ns`]).
pub const LINE_TRANSFER: &str = "line_transfer_ns";

fn thread_configs(cfg: &Config, size: u64) -> Vec<Threads> {
    let mut v = Vec::new();
    for &n in &cfg.threads {
        if n == 1 {
            v.push(Threads { n: 1, shared: false });
        } else if cfg.t2_sizes.contains(&size) {
            v.push(Threads { n, shared: false });
            v.push(Threads { n, shared: true });
        }
    }
    v
}

fn file_of(th: Threads, tid: usize) -> String {
    if th.shared {
        "m/shared".into()
    } else {
        format!("m/t{tid}")
    }
}

/// One measured run of a cell on one target.
fn run_cell(
    t: &dyn Target,
    p: Pattern,
    size: u64,
    th: Threads,
    cfg: &Config,
    cap: Duration,
    seed: u64,
) -> TResult<Phase> {
    // Files are fixed-size and offsets wrap: the time cap ends a repetition.
    let ops = cfg.max_ops;
    let per = cfg.file_size; // bytes each thread works in
    let slots = per / size;
    parallel(th.n, |tid, gate| {
        let h = t.open(&file_of(th, tid), false)?;
        let mut rng = Rng::new(seed ^ ((tid as u64 + 1) * 0x1000_0001));
        let mut buf =
            if p.write() { pattern(size as usize, tid as u8) } else { vec![0u8; size as usize] };
        let base = if th.shared { tid as u64 * per } else { 0 };
        let all_slots = if th.shared { slots * th.n as u64 } else { slots };
        let t0 = gate.start();
        let mut done = 0u64;
        let mut res = Ok(());
        for i in 0..ops {
            let off =
                if p.random() { rng.below(all_slots) * size } else { base + (i % slots) * size };
            let r = if p.write() {
                t.write_at(&h, off, &buf).and_then(|_| t.fsync(&h))
            } else {
                match t.read_at(&h, off, &mut buf) {
                    Ok(n) if n as u64 == size => Ok(()),
                    Ok(n) => Err(TargetError::Other(format!("short read: {n} of {size} at {off}"))),
                    Err(e) => Err(e),
                }
            };
            if let Err(e) = r {
                res = Err(e);
                break;
            }
            done += 1;
            if i & 7 == 7 && t0.elapsed() >= cap {
                break;
            }
        }
        gate.stop();
        t.close(h)?;
        res.map(|_| (done, done * size))
    })
}

fn setup(t: &dyn Target, th: Threads, cfg: &Config) -> TResult<()> {
    if th.shared {
        prefill(t, "m/shared", cfg.file_size * th.n as u64)
    } else {
        (0..th.n).try_for_each(|tid| prefill(t, &format!("m/t{tid}"), cfg.file_size))
    }
}

/// Run the micro experiment.
pub fn run(ctx: &mut Ctx<'_>) -> TResult<()> {
    let cfg = ctx.cfg;
    let mut cases = Vec::new();
    for p in patterns(cfg) {
        for &size in &cfg.sizes {
            for th in thread_configs(cfg, size) {
                cases.push((p, size, th));
            }
        }
    }
    let pb = ctx.bar("micro", (cases.len() * ctx.targets.len()) as u64);
    for t in ctx.targets.iter_mut() {
        t.reset()?;
        t.mkdir("m")?;
    }
    let cap = Duration::from_secs_f64(cfg.rep_secs);
    let warm = Duration::from_secs_f64(cfg.rep_secs / 4.0);
    for &(p, size, th) in &cases {
        let key = case_key(p, size, th);
        pb.set_message(key.clone());
        let mut live: Vec<usize> = Vec::new();
        for (i, t) in ctx.targets.iter().enumerate() {
            match setup(t.as_ref(), th, cfg) {
                Ok(()) => live.push(i),
                Err(e) => {
                    say(&pb, &format!("  {key} on {}: setup failed: {e}", t.name()));
                    ctx.res.fail("micro", &key, t.name(), &format!("setup: {e}"));
                    pb.inc(1);
                }
            }
        }
        let seed = 0x5eed ^ size;
        for rep in 0..=cfg.reps {
            let mut still = Vec::new();
            for &i in &live {
                let t = ctx.targets[i].as_ref();
                let before = t.persist_counters();
                let r = run_cell(
                    t,
                    p,
                    size,
                    th,
                    cfg,
                    if rep == 0 { warm } else { cap },
                    seed + rep as u64,
                );
                match r {
                    Ok(ph) => {
                        still.push(i);
                        if rep == 0 {
                            continue;
                        }
                        let mut s = io_sample("micro", &key, t, rep - 1, ph, th.n, before);
                        if th.n > 1 {
                            // Where the host had the two CPUs during this repetition
                            // (see `xcore`): its rows follow it.
                            if let Some(ns) = crate::xcore::line_transfer_ns() {
                                s.extra.insert(LINE_TRANSFER.into(), ns);
                            }
                        }
                        ctx.res.push(s);
                    }
                    Err(e) => {
                        say(&pb, &format!("  {key} on {}: {e}", t.name()));
                        ctx.res.fail("micro", &key, t.name(), &e.to_string());
                        pb.inc(1);
                    }
                }
            }
            live = still;
        }
        pb.inc(live.len() as u64);
    }
    pb.finish_and_clear();
    declare(ctx);
    Ok(())
}

fn patterns(cfg: &Config) -> Vec<Pattern> {
    Pattern::ALL.into_iter().filter(|p| cfg.patterns.iter().any(|x| x == p.id())).collect()
}

fn declare(ctx: &mut Ctx<'_>) {
    let cfg = ctx.cfg;
    for p in patterns(cfg) {
        let mut rows = Vec::new();
        for &size in &cfg.sizes {
            for th in thread_configs(cfg, size) {
                rows.push(Row {
                    label: format!("{}, {}", fmt_size(size), th.label()),
                    case: case_key(p, size, th),
                });
            }
        }
        ctx.res.tables.push(Table {
            experiment: "micro".into(),
            title: p.title().into(),
            unit: "MB/s".into(),
            higher_is_better: true,
            note: format!(
                "Each thread works in its own {} region ({} with a shared file); up to {} \
                 operations or {:.2} s per repetition.",
                fmt_size(cfg.file_size),
                "threads cover the whole file randomly, or their own half sequentially",
                cfg.max_ops,
                cfg.rep_secs
            ),
            rows,
        });
    }
    let targets = ctx.res.targets_in("micro");
    for p in patterns(cfg) {
        let th = Threads { n: 1, shared: false };
        let series = targets
            .iter()
            .map(|t| Series {
                name: t.clone(),
                points: cfg
                    .sizes
                    .iter()
                    .filter_map(|&s| {
                        ctx.res
                            .summary("micro", &case_key(p, s, th), t)
                            .map(|x| (s as f64, x.median))
                    })
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        ctx.res.plots.push((
            "micro".into(),
            Plot {
                id: format!("micro-{}-vs-size", p.id()),
                title: format!("{} (1 thread)", p.title()),
                x_label: "I/O size (bytes)".into(),
                y_label: "MB/s".into(),
                log_x: true,
                log_y: true,
                categories: vec![],
                series,
            },
        ));
    }
    let size = 4096;
    if cfg.threads.len() > 1 && cfg.t2_sizes.contains(&size) {
        for p in patterns(cfg).into_iter().filter(|p| p.random()) {
            let mut series = Vec::new();
            for t in &targets {
                for shared in [false, true] {
                    let pts: Vec<(f64, f64)> = cfg
                        .threads
                        .iter()
                        .filter_map(|&n| {
                            let th = Threads { n, shared: shared && n > 1 };
                            ctx.res
                                .summary("micro", &case_key(p, size, th), t)
                                .map(|x| (n as f64, x.median))
                        })
                        .collect();
                    if pts.len() > 1 {
                        let kind = if shared { "shared file" } else { "private files" };
                        series.push(Series { name: format!("{t} ({kind})"), points: pts });
                    }
                }
            }
            ctx.res.plots.push((
                "micro".into(),
                Plot {
                    id: format!("micro-{}-4k-vs-threads", p.id()),
                    title: format!("{}, 4 KiB, vs threads", p.title()),
                    x_label: "threads".into(),
                    y_label: "MB/s".into(),
                    log_x: false,
                    log_y: true,
                    categories: vec![],
                    series,
                },
            ));
        }
    }
}
