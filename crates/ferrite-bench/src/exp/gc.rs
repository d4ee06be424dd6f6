//! GC under pressure (NOVA's Figure 6, scaled): a small file system filled to 95% with
//! fileserver-sized files, then an overwrite-heavy load for a fixed time, with the
//! write throughput sampled over time. FerriteFS must keep going (no ENOSPC) while
//! the live data fits; its log GC reclaims the log pages the overwrites kill.
//!
//! Load: each operation picks a random file; 90% overwrite a random 16 KiB block of
//! it, 10% delete it and write it again at the same size (live data stays constant).
//!
//! Invariants: a file is claimed by one thread at a time; ENOSPC is counted (and the
//! operation skipped), any other error ends the run for that target.

use super::{pattern, say, Ctx};
use crate::config::fmt_size;
use crate::results::{Plot, Sample, Series, TextTable};
use crate::rng::Rng;
use crate::stats::Summary;
use crate::target::{is_nospace, TResult, Target, TargetError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const BLK: u64 = 16 * 1024;

fn path(i: usize) -> String {
    format!("g/d{}/f{i}", i / 1000)
}

/// Fill to `frac` of capacity; returns the file sizes.
fn fill(t: &dyn Target, frac: f64) -> TResult<Vec<u64>> {
    t.mkdir("g")?;
    let buf = pattern(256 * 1024, 1);
    let mut rng = Rng::new(95);
    let mut sizes = Vec::new();
    loop {
        let u = t.usage()?;
        if u.used as f64 >= frac * u.total as f64 {
            return Ok(sizes);
        }
        // Check the space every few files (statfs of ext4 forks a process).
        for _ in 0..8 {
            let i = sizes.len();
            if i % 1000 == 0 {
                t.mkdir(&format!("g/d{}", i / 1000))?;
            }
            let size = rng.around(128 * 1024).div_ceil(BLK) * BLK;
            let h = t.create(&path(i), false)?;
            let mut off = 0;
            let mut r = Ok(());
            while off < size {
                let n = (size - off).min(buf.len() as u64) as usize;
                r = t.write_at(&h, off, &buf[..n]);
                if r.is_err() {
                    break;
                }
                off += n as u64;
            }
            t.close(h)?;
            if let Err(e) = r {
                if is_nospace(&e) {
                    t.unlink(&path(i))?;
                    return Ok(sizes);
                }
                return Err(e);
            }
            sizes.push(size);
        }
    }
}

struct RunOut {
    intervals: Vec<(f64, f64)>, // (t end, MB/s)
    enospc: u64,
}

fn load(
    t: &dyn Target,
    sizes: &[u64],
    threads: usize,
    secs: f64,
    interval: f64,
) -> TResult<RunOut> {
    let busy: Vec<AtomicBool> = sizes.iter().map(|_| AtomicBool::new(false)).collect();
    let bytes = AtomicU64::new(0);
    let enospc = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let buf = pattern(256 * 1024, 2);
    let t0 = Instant::now();
    let (intervals, errs) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|tid| {
                let (busy, bytes, enospc, stop, buf) = (&busy, &bytes, &enospc, &stop, &buf);
                s.spawn(move || -> TResult<()> {
                    let mut rng = Rng::new(0x6c ^ tid as u64);
                    while !stop.load(Ordering::Relaxed) {
                        let i = rng.below(sizes.len() as u64) as usize;
                        if busy[i].swap(true, Ordering::AcqRel) {
                            continue;
                        }
                        let size = sizes[i];
                        let r = if rng.below(10) == 0 {
                            (|| -> TResult<u64> {
                                t.unlink(&path(i))?;
                                let h = t.create(&path(i), false)?;
                                let mut off = 0;
                                let mut r = Ok(());
                                while off < size {
                                    let n = (size - off).min(buf.len() as u64) as usize;
                                    r = t.write_at(&h, off, &buf[..n]);
                                    if r.is_err() {
                                        break;
                                    }
                                    off += n as u64;
                                }
                                t.close(h)?;
                                r.map(|_| off)
                            })()
                        } else {
                            (|| -> TResult<u64> {
                                let h = t.open(&path(i), false)?;
                                let off = rng.below(size / BLK) * BLK;
                                let r = t.write_at(&h, off, &buf[..BLK as usize]);
                                t.close(h)?;
                                r.map(|_| BLK)
                            })()
                        };
                        busy[i].store(false, Ordering::Release);
                        match r {
                            Ok(n) => {
                                bytes.fetch_add(n, Ordering::Relaxed);
                            }
                            Err(e) if is_nospace(&e) => {
                                enospc.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => {
                                stop.store(true, Ordering::Relaxed);
                                return Err(e);
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        let mut intervals = Vec::new();
        let mut last_b = 0;
        let mut last_t = 0.0;
        let mut k = 1;
        while !stop.load(Ordering::Relaxed) {
            let due = Duration::from_secs_f64(interval * k as f64);
            let now = t0.elapsed();
            if now < due {
                std::thread::sleep((due - now).min(Duration::from_millis(20)));
                continue;
            }
            let b = bytes.load(Ordering::Relaxed);
            let tt = now.as_secs_f64();
            intervals.push((tt, (b - last_b) as f64 / 1e6 / (tt - last_t)));
            last_b = b;
            last_t = tt;
            k += 1;
            if tt >= secs {
                stop.store(true, Ordering::Relaxed);
            }
        }
        let errs: Vec<TargetError> = workers
            .into_iter()
            .filter_map(|w| match w.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e),
                Err(_) => Some(TargetError::Other("GC load thread panicked".into())),
            })
            .collect();
        (intervals, errs)
    });
    if let Some(e) = errs.into_iter().next() {
        return Err(e);
    }
    Ok(RunOut { intervals, enospc: enospc.load(Ordering::Relaxed) })
}

/// Run the GC experiment on the given bounded-capacity targets.
pub fn run(
    ctx: &mut Ctx<'_>,
    targets: Vec<Box<dyn Target>>,
    skipped: &[(String, String)],
) -> TResult<()> {
    let cfg = ctx.cfg;
    let threads = cfg.threads.iter().copied().max().unwrap_or(1);
    let pb = ctx.bar("gc", targets.len() as u64);
    let interval = (cfg.gc_secs / 30.0).max(0.1);
    let mut rows = Vec::new();
    let mut series = Vec::new();
    for (name, why) in skipped {
        rows.push(vec![
            name.clone(),
            format!("skipped: {why}"),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
            "".into(),
        ]);
    }
    for t in &targets {
        let t = t.as_ref();
        pb.set_message(format!("filling {} to 95%", t.name()));
        let r = (|| -> TResult<()> {
            let sizes = fill(t, 0.95)?;
            let u0 = t.usage()?;
            let g0 = t.gc_counters();
            pb.set_message(format!("overwrite load on {} for {:.0} s", t.name(), cfg.gc_secs));
            let out = load(t, &sizes, threads, cfg.gc_secs, interval)?;
            let u1 = t.usage()?;
            let g1 = t.gc_counters();
            let mut pts = Vec::new();
            for (k, &(tt, mbs)) in out.intervals.iter().enumerate() {
                let mut extra = BTreeMap::new();
                extra.insert("t_secs".into(), tt);
                ctx.res.push(Sample {
                    experiment: "gc".into(),
                    case: "interval".into(),
                    target: t.name().into(),
                    rep: k,
                    ops: 0,
                    bytes: 0,
                    secs: interval,
                    value: mbs,
                    extra,
                });
                pts.push((tt, mbs));
            }
            let v: Vec<f64> = out.intervals.iter().map(|x| x.1).collect();
            let s = Summary::of(&v).ok_or_else(|| TargetError::Other("no intervals".into()))?;
            let fifth = (v.len() / 5).max(1);
            let first: f64 = v[..fifth].iter().sum::<f64>() / fifth as f64;
            let last: f64 = v[v.len() - fifth..].iter().sum::<f64>() / fifth as f64;
            let mut extra = BTreeMap::new();
            extra.insert("enospc".into(), out.enospc as f64);
            extra.insert("util_start".into(), u0.used as f64 / u0.total as f64);
            extra.insert("util_end".into(), u1.used as f64 / u1.total as f64);
            extra.insert("files".into(), sizes.len() as f64);
            let gc_txt = match (g0, g1) {
                (Some(a), Some(b)) => {
                    extra.insert("fast_gc_pages".into(), (b.0 - a.0) as f64);
                    extra.insert("thorough_gc_runs".into(), (b.1 - a.1) as f64);
                    extra.insert("thorough_gc_pages".into(), (b.2 - a.2) as f64);
                    format!(
                        "{} pages fast, {} thorough runs ({} pages)",
                        b.0 - a.0,
                        b.1 - a.1,
                        b.2 - a.2
                    )
                }
                _ => "n/a".into(),
            };
            ctx.res.push(Sample {
                experiment: "gc".into(),
                case: "summary".into(),
                target: t.name().into(),
                rep: 0,
                ops: 0,
                bytes: 0,
                secs: cfg.gc_secs,
                value: s.median,
                extra,
            });
            rows.push(vec![
                t.name().into(),
                fmt_size(u0.total),
                format!(
                    "{:.1}% → {:.1}%",
                    100.0 * u0.used as f64 / u0.total as f64,
                    100.0 * u1.used as f64 / u1.total as f64
                ),
                sizes.len().to_string(),
                format!("{:.0}", s.median),
                format!("{:.0}", s.min),
                format!("{:.2}", last / first.max(1e-9)),
                out.enospc.to_string(),
                gc_txt,
            ]);
            series.push(Series { name: t.name().into(), points: pts });
            Ok(())
        })();
        if let Err(e) = r {
            say(&pb, &format!("  gc on {}: {e}", t.name()));
            ctx.res.fail("gc", "interval", t.name(), &e.to_string());
            rows.push(vec![
                t.name().into(),
                format!("failed: {e}"),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
            ]);
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    ctx.res.text_tables.push((
        "gc".into(),
        TextTable {
            title: format!("GC under pressure: 95% full, overwrite-heavy load for {:.0} s, {threads} threads", cfg.gc_secs),
            headers: [
                "target",
                "capacity",
                "utilisation start → end",
                "files",
                "median MB/s",
                "slowest interval MB/s",
                "last fifth / first fifth",
                "ENOSPC errors",
                "log GC",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            rows,
            note: format!(
                "Throughput sampled every {interval:.2} s. 90% of operations overwrite a 16 KiB block of a \
                 random ~128 KiB file, 10% delete a file and write it again at the same size; no fsync."
            ),
        },
    ));
    ctx.res.plots.push((
        "gc".into(),
        Plot {
            id: "gc-over-time".into(),
            title: "Overwrite throughput at 95% utilisation".into(),
            x_label: "seconds".into(),
            y_label: "MB/s".into(),
            log_x: false,
            log_y: false,
            categories: vec![],
            series,
        },
    ));
    Ok(())
}
