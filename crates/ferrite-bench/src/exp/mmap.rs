//! Stores through shared mappings (issue 13's DAX-mmap goals and FLEX's Figure 5,
//! Xu et al., ASPLOS '19): "store" is a 64 B store into a mapped file and an msync
//! of it; "append" appends records of each size to a file with stores into a
//! mapping, grown FLEX's way (fallocate of a large chunk, then mremap), with an
//! msync after each record. On a FerriteFS mount in the preloaded run the mapping
//! is DAX (msync is flushes and a fence); on the kernel's file systems it is the
//! page cache. The hardware targets do the same durable stores with their own
//! copy and fence (the limit), through write + fsync of their regions; one of them,
//! `hw-msync`, is this experiment's own: it flushes from each write's page start,
//! as an msync must (the floor of a store + msync).
//!
//! Invariants: the store file is written in full before it is measured; the
//! append file is recreated (empty) before each repetition, outside the measured
//! phase; a target that can neither map files nor is hardware is not measured.

use super::{io_sample, parallel, pattern, prefill, say, timed_ops, Ctx, Phase};
use crate::config::{fmt_size, Config};
use crate::results::{Plot, Row, Series, Table, TargetStatus};
use crate::target::hw::{HwMode, HwTarget};
use crate::target::mapped::{fallocate, Region, SharedMap};
use crate::target::{Kind, TResult, Target, TargetError};
use std::time::Duration;

/// Bytes per store of the "store" case.
pub const STORE: u64 = 64;
/// The file the "store" case maps.
const STORE_FILE: u64 = 1 << 20;

/// Case key of the store case.
pub fn store_key() -> String {
    format!("store/{}", fmt_size(STORE))
}

/// Dirty pages per commit of the atomic-msync cases.
pub const ATOMIC_PAGES: [u64; 3] = [1, 16, 256];

/// Case key of an atomic-msync case.
pub fn atomic_key(pages: u64) -> String {
    format!("msync/{pages} dirty page{}", if pages == 1 { "" } else { "s" })
}

/// Sizes of the persistent-buffer write cases.
pub const BUF_SIZES: [u64; 2] = [4096, 65536];

/// Case key of a persistent-buffer write size.
pub fn buf_key(size: u64) -> String {
    format!("bufwrite/{}", fmt_size(size))
}

/// One case of the experiment.
#[derive(Clone, Copy)]
enum Case {
    Store,
    Append(u64),
    Msync(u64),
    Buf(u64),
}

/// Case key of an append size.
pub fn append_key(size: u64) -> String {
    format!("append/{}", fmt_size(size))
}

/// Does `case` apply to `t`? Stores and appends: file systems that map files,
/// and the hardware targets (their limit); msync cases: FerriteFS's library
/// targets (atomic mappings) and file systems that map files; buffer writes:
/// every target (plain writes where there are no persistent buffers).
fn applies(t: &dyn Target, case: Case) -> bool {
    let hw = t.kind() == Kind::Hardware;
    match case {
        Case::Store | Case::Append(_) => hw || t.dir().is_some(),
        Case::Msync(_) => !hw,
        // A hardware target writes (and fences) plainly: its flavours side by side
        // are the floors of a buffer write and of a plain one (`hw-msync` is the floor
        // of an msync, not of a write).
        Case::Buf(_) => t.name() != HwMode::FlushFromPage.name(),
    }
}

fn store_cell(t: &dyn Target, cfg: &Config, cap: Duration) -> TResult<Phase> {
    let buf = pattern(STORE as usize, 5);
    let ops = cfg.ops_for(STORE);
    let h = t.open("m/store", false)?;
    // A stride of 67 lines: each store a new page and line, wrapping around.
    let at = |i: u64| (i * STORE * 67) % STORE_FILE;
    let ph = match t.map_fd(&h) {
        Some(fd) => parallel(1, |_, gate| {
            let mut m = SharedMap::new(fd, STORE_FILE as usize)?;
            timed_ops(gate, ops, cap, 64, STORE, |i| {
                m.store(at(i) as usize, &buf);
                Ok(m.sync(at(i) as usize, buf.len())?)
            })
        }),
        None => parallel(1, |_, gate| {
            timed_ops(gate, ops, cap, 64, STORE, |i| {
                t.write_at(&h, at(i), &buf)?;
                t.fsync(&h)
            })
        }),
    };
    t.close(h)?;
    ph
}

/// Runs of [`msync_cell`] so far (its stored values' high half).
static MSYNC_NONCE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Change `pages` pages spread over the mapped store file, then persist all of
/// it at once: an atomic mapping's commit (library targets) or msync of a shared
/// mapping (file systems). Hardware targets have no such case.
fn msync_cell(t: &dyn Target, pages: u64, cfg: &Config, cap: Duration) -> TResult<Phase> {
    let h = t.open("m/store", false)?;
    let len = STORE_FILE as usize;
    let ops = cfg.ops_for(pages * 4096);
    let ph = parallel(1, |_, gate| {
        let mut r: Box<dyn Region + '_> = match t.map_atomic(&h, len) {
            Some(r) => r?,
            None => match t.map_fd(&h) {
                Some(fd) => Box::new(SharedMap::new(fd, len)?),
                None => return Err(TargetError::Unsupported("mapping")),
            },
        };
        let stride = (STORE_FILE / 4096 / pages) as usize * 4096;
        // Values no earlier run stored at the same places: a store of the bytes a
        // page already holds changes nothing, and an atomic commit writes nothing
        // for it (until 2026-11-28 each repetition stored the values of the one
        // before, so the library's cells after the first measured comparisons alone).
        let nonce = MSYNC_NONCE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) << 32;
        timed_ops(gate, ops, cap, 1, pages * 4096, |i| {
            let v = nonce | i;
            for k in 0..pages as usize {
                r.store(k * stride + (i as usize % 500) * 8, &v.to_le_bytes());
            }
            r.persist(0, len)
        })
    });
    t.close(h)?;
    ph
}

/// Writes of `size` bytes, fsync after each, in order over a 32 MiB region: through
/// a persistent buffer on the library targets (filled with stores, written by
/// reference), plain writes elsewhere.
fn buf_cell(t: &dyn Target, size: u64, cfg: &Config, cap: Duration) -> TResult<Phase> {
    let data = pattern(size as usize, 11);
    let ops = cfg.ops_for(size);
    let region = (32u64 << 20) / size * size;
    let h = t.create("m/buf", false)?;
    let ph = parallel(1, |_, gate| {
        timed_ops(gate, ops, cap, 8, size, |i| {
            let off = i * size % region;
            match t.buf_write(&h, off, &data) {
                Some(r) => r,
                None => {
                    t.write_at(&h, off, &data)?;
                    t.fsync(&h)
                }
            }
        })
    });
    t.close(h)?;
    ph
}

fn append_cell(t: &dyn Target, size: u64, cfg: &Config, cap: Duration) -> TResult<Phase> {
    let buf = pattern(size as usize, 9);
    let ops = cfg.ops_for(size);
    let h = t.create("m/append", false)?;
    let ph = match t.map_fd(&h) {
        Some(fd) => {
            // FLEX grows the file by large chunks, each a fallocate and an mremap.
            let chunk = (1u64 << 20).max(16 * size);
            parallel(1, |_, gate| {
                fallocate(fd, 0, chunk)?;
                let mut m = SharedMap::new(fd, chunk as usize)?;
                let mut end = 0usize;
                timed_ops(gate, ops, cap, 8, size, |_| {
                    if end + buf.len() > m.len() {
                        let n = m.len() as u64 + chunk;
                        fallocate(fd, 0, n)?;
                        m.resize(n as usize)?;
                    }
                    m.store(end, &buf);
                    m.sync(end, buf.len())?;
                    end += buf.len();
                    Ok(())
                })
            })
        }
        None => {
            // The hardware targets: their own appends and fence.
            t.close(h)?;
            return super::append::run_cell(t, "extend", size, cfg, cap);
        }
    };
    t.close(h)?;
    ph
}

/// Run the mmap experiment.
pub fn run(ctx: &mut Ctx<'_>) -> TResult<()> {
    let cfg = ctx.cfg;
    let mut cases = vec![(store_key(), Case::Store)];
    cases.extend(cfg.append_sizes.iter().map(|&s| (append_key(s), Case::Append(s))));
    cases.extend(ATOMIC_PAGES.iter().map(|&n| (atomic_key(n), Case::Msync(n))));
    cases.extend(BUF_SIZES.iter().map(|&n| (buf_key(n), Case::Buf(n))));
    // The floor of a store made durable by msync (`hw-msync`), beside the hardware
    // targets: this experiment's own, taken away again at its end.
    let extra = cfg.wants("hw").then(|| {
        let region = cfg.hw_region();
        let mode = HwMode::FlushFromPage;
        HwTarget::new(cfg.work_dir.join(format!("{}.map", mode.name())), region, 4, mode)
    });
    let pushed = match extra {
        Some(Ok(t)) => {
            // Listed with the others (the report's columns and target table).
            let name = t.name().to_string();
            if !ctx.res.targets.iter().any(|s| s.name == name) {
                let detail = t.describe();
                ctx.res.targets.push(TargetStatus { name: name.clone(), detail, used: true });
                ctx.res.target_kinds.push((name, t.kind()));
            }
            ctx.targets.push(Box::new(t));
            true
        }
        Some(Err(e)) => {
            ctx.res.fail("mmap", &store_key(), HwMode::FlushFromPage.name(), &e.to_string());
            false
        }
        None => false,
    };
    let r = run_cases(ctx, &cases);
    if pushed {
        ctx.targets.pop();
    }
    r?;
    push_tables(ctx, &cases);
    flex_plot(ctx);
    Ok(())
}

/// Every case on every target it applies to.
fn run_cases(ctx: &mut Ctx<'_>, cases: &[(String, Case)]) -> TResult<()> {
    let cfg = ctx.cfg;
    let pb = ctx.bar("mmap", (cases.len() * ctx.targets.len()) as u64);
    let mut live: Vec<usize> = Vec::new();
    for (i, t) in ctx.targets.iter_mut().enumerate() {
        if !cases.iter().any(|&(_, c)| applies(t.as_ref(), c)) {
            pb.inc(cases.len() as u64);
            continue;
        }
        t.reset()?;
        let r = t.mkdir("m").and_then(|()| prefill(t.as_ref(), "m/store", STORE_FILE));
        match r {
            Ok(()) => live.push(i),
            Err(e) => {
                ctx.res.fail("mmap", &store_key(), t.name(), &format!("setup: {e}"));
                pb.inc(cases.len() as u64);
            }
        }
    }
    let cap = Duration::from_secs_f64(cfg.rep_secs);
    let warm = Duration::from_secs_f64(cfg.rep_secs / 4.0);
    for (key, case) in cases {
        pb.set_message(key.clone());
        let mut on = live.clone();
        for rep in 0..=cfg.reps {
            let mut still = Vec::new();
            for &i in &on {
                let t = ctx.targets[i].as_ref();
                if !applies(t, *case) {
                    still.push(i);
                    continue;
                }
                let before = t.persist_counters();
                let c = if rep == 0 { warm } else { cap };
                let r = match *case {
                    Case::Store => store_cell(t, cfg, c),
                    Case::Append(size) => append_cell(t, size, cfg, c),
                    Case::Msync(n) => msync_cell(t, n, cfg, c),
                    Case::Buf(n) => buf_cell(t, n, cfg, c),
                };
                match r {
                    Ok(ph) => {
                        still.push(i);
                        if rep > 0 {
                            let mut smp = io_sample("mmap", key, t, rep - 1, ph, 1, before);
                            if let Case::Msync(_) = case {
                                // Time per msync (the table's unit).
                                smp.value = ph.secs / ph.ops.max(1) as f64 * 1e6;
                            }
                            ctx.res.push(smp);
                        }
                    }
                    Err(e) => {
                        say(&pb, &format!("  mmap {key} on {}: {e}", t.name()));
                        ctx.res.fail("mmap", key, t.name(), &e.to_string());
                        pb.inc(1);
                    }
                }
            }
            on = still;
        }
        pb.inc(on.len() as u64);
    }
    pb.finish_and_clear();
    Ok(())
}

/// The experiment's tables.
fn push_tables(ctx: &mut Ctx<'_>, cases: &[(String, Case)]) {
    let cfg = ctx.cfg;
    ctx.res.tables.push(Table {
        experiment: "mmap".into(),
        title: "Stores into a shared mapping, msync after each".into(),
        unit: "MB/s".into(),
        higher_is_better: true,
        note: format!(
            "One thread. store: {} B at a stride of 67 lines in a {} file; append: records \
             appended by stores into a mapping grown by fallocate + mremap (FLEX). The \
             hardware targets store with their own copy and fence; hw-msync flushes from \
             the written page's start, as an msync must. Up to {} operations or {:.2} s \
             per repetition.",
            STORE,
            fmt_size(STORE_FILE),
            cfg.max_ops,
            cfg.rep_secs
        ),
        rows: cases
            .iter()
            .filter(|(_, c)| matches!(c, Case::Store | Case::Append(_)))
            .map(|(k, _)| Row { label: k.clone(), case: k.clone() })
            .collect(),
    });
    ctx.res.tables.push(Table {
        experiment: "mmap".into(),
        title: "msync of a 1 MiB mapping after changing some of its pages".into(),
        unit: "µs per msync".into(),
        higher_is_better: false,
        note: "One thread; 8 bytes changed in each of n pages spread over the mapping, then \
               one msync of all of it. FerriteFS library targets: an atomic mapping, whose \
               msync commits the changed pages as one atomic update (ferrite_mmap_atomic); \
               file systems: a shared mapping and msync (DAX on ferrite-direct)."
            .into(),
        rows: cases
            .iter()
            .filter(|(_, c)| matches!(c, Case::Msync(_)))
            .map(|(k, _)| Row { label: k.clone(), case: k.clone() })
            .collect(),
    });
    ctx.res.tables.push(Table {
        experiment: "mmap".into(),
        title: "Writes from a persistent buffer (by reference) against plain writes".into(),
        unit: "MB/s".into(),
        higher_is_better: true,
        note: "One thread; fsync after each write, in order over a 32 MiB region. FerriteFS \
               library targets: the data is stored into a persistent buffer (pool blocks) \
               and written by reference (ferrite_buf_write: its pages become the file's); \
               every other target: a plain pwrite of the same bytes (the preload library's \
               write path on ferrite-direct)."
            .into(),
        rows: cases
            .iter()
            .filter(|(_, c)| matches!(c, Case::Buf(_)))
            .map(|(k, _)| Row { label: k.clone(), case: k.clone() })
            .collect(),
    });
}

/// FLEX's Figure 5: appends + sync through mappings against write + fsync (from
/// the append experiment, when it ran), MB/s by append size.
fn flex_plot(ctx: &mut Ctx<'_>) {
    let sizes = ctx.cfg.append_sizes.clone();
    let mut series = Vec::new();
    let lines = [("mmap", "mmap + msync"), ("append", "write + fsync")];
    for (exp, how) in lines {
        for t in ctx.res.targets_in(exp) {
            let points: Vec<(f64, f64)> = sizes
                .iter()
                .filter_map(|&s| {
                    let key = if exp == "mmap" {
                        append_key(s)
                    } else {
                        super::append::case_key("extend", s)
                    };
                    ctx.res.summary(exp, &key, &t).map(|x| (s as f64, x.median))
                })
                .collect();
            let hw = t.starts_with("hw-");
            // The hardware targets' appends are the same in both experiments.
            let skip = points.is_empty() || hw && exp == "append";
            if !skip {
                let name = if hw { t.clone() } else { format!("{t} ({how})") };
                series.push(Series { name, points });
            }
        }
    }
    ctx.res.plots.push((
        "mmap".into(),
        Plot {
            id: "flex-append-vs-size".into(),
            title: "Appends with a sync after each: mapped (fallocate + mremap) vs write".into(),
            x_label: "append size (bytes)".into(),
            y_label: "MB/s".into(),
            log_x: true,
            log_y: true,
            categories: vec![],
            series,
        },
    ));
}
