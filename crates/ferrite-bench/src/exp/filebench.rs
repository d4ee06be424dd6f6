//! Filebench-style personalities — fileserver, varmail, webserver, webproxy — written
//! as this project's own workload generator, with the file counts, sizes and I/O sizes
//! of the NOVA paper's Table 1 and Zhu et al.'s Table 2, scaled to a 2-core machine.
//!
//! Flow of one loop of each personality (every file operation counts as one op, as in
//! filebench's flowop counters):
//! - fileserver: create, write whole file, close; open, append, close; open, read
//!   whole file, close; delete; stat.
//! - varmail: delete; create, append, fsync, close; open, read whole, append, fsync,
//!   close; open, read whole, close.
//! - webserver: 10 x (open, read whole, close); append to a shared log.
//! - webproxy: delete; create, append, close; 5 x (open, read whole, close); append to
//!   a shared log.
//!
//! Invariants:
//! - A file slot is claimed (compare-and-swap) before use, so two threads never work
//!   on the same file at once, and create/delete keep the slot states true.
//! - The file set is built before any measurement; repetitions run back to back on
//!   the evolving set, as filebench does. The shared log of webserver and webproxy is
//!   truncated after every 32 MiB a thread appends (bounded space on every target).

use super::{pattern, say, with_metadata, Ctx};
use crate::results::{Plot, Row, Sample, Series, Table};
use crate::rng::Rng;
use crate::target::{TResult, Target};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

/// A personality's parameters.
#[derive(Clone, Debug)]
pub struct Personality {
    /// Name.
    pub name: &'static str,
    /// Files at scale 1.0.
    pub nfiles: usize,
    /// Mean directory width.
    pub dirwidth: usize,
    /// Mean file size.
    pub filesize: u64,
    /// Read I/O size.
    pub read_io: u64,
    /// Write / append I/O size.
    pub write_io: u64,
    /// Fraction of files present at start.
    pub prealloc: f64,
}

/// The four personalities.
pub fn personalities() -> Vec<Personality> {
    const K: u64 = 1024;
    vec![
        Personality {
            name: "fileserver",
            nfiles: 10_000,
            dirwidth: 20,
            filesize: 128 * K,
            read_io: 16 * K,
            write_io: 16 * K,
            prealloc: 0.8,
        },
        Personality {
            name: "varmail",
            nfiles: 20_000,
            dirwidth: 1_000_000,
            filesize: 32 * K,
            read_io: 1024 * K,
            write_io: 16 * K,
            prealloc: 0.8,
        },
        Personality {
            name: "webserver",
            nfiles: 10_000,
            dirwidth: 20,
            filesize: 64 * K,
            read_io: 1024 * K,
            write_io: 8 * K,
            prealloc: 1.0,
        },
        Personality {
            name: "webproxy",
            nfiles: 20_000,
            dirwidth: 1_000_000,
            filesize: 32 * K,
            read_io: 1024 * K,
            write_io: 16 * K,
            prealloc: 0.8,
        },
    ]
}

const ABSENT: u8 = 0;
const PRESENT: u8 = 1;
const BUSY: u8 = 2;

struct FileSet {
    p: Personality,
    n: usize,
    slots: Vec<AtomicU8>,
}

impl FileSet {
    fn path(&self, i: usize) -> String {
        let w = self.p.dirwidth;
        if w >= self.n {
            format!("fb/f{i}")
        } else {
            format!("fb/d{}/d{}/f{i}", i / (w * w), (i / w) % w)
        }
    }

    fn dirs(&self) -> Vec<String> {
        let w = self.p.dirwidth;
        let mut v = vec!["fb".to_string()];
        if w < self.n {
            let mut seen = std::collections::BTreeSet::new();
            for i in 0..self.n {
                let a = i / (w * w);
                let b = (i / w) % w;
                if seen.insert((a, usize::MAX)) {
                    v.push(format!("fb/d{a}"));
                }
                if seen.insert((a, b)) {
                    v.push(format!("fb/d{a}/d{b}"));
                }
            }
        }
        v
    }

    fn claim(&self, rng: &mut Rng, want: u8) -> Option<usize> {
        for _ in 0..64 {
            let i = rng.below(self.n as u64) as usize;
            if self.slots[i]
                .compare_exchange(want, BUSY, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                return Some(i);
            }
        }
        None
    }

    fn release(&self, i: usize, state: u8) {
        self.slots[i].store(state, Ordering::Release);
    }
}

struct Counters {
    ops: u64,
    bytes: u64,
    /// Bytes this thread appended to the shared log since it last truncated it.
    log_bytes: u64,
}

/// The shared log is truncated by a thread that has appended this much to it, so a fast
/// target does not fill its file system with log (filebench runs for a minute on disks
/// many times larger than these pools). Same rule on every target; not counted as ops.
const LOG_TRUNCATE: u64 = 32 << 20;

fn read_whole(t: &dyn Target, h: &crate::target::Handle, buf: &mut [u8]) -> TResult<u64> {
    let mut off = 0u64;
    loop {
        let n = t.read_at(h, off, buf)?;
        off += n as u64;
        if n < buf.len() {
            return Ok(off);
        }
    }
}

/// Claim a file in state `want`, run `f` on it, and leave it in `ok` (or `undo` if
/// `f` fails). No file in that state: nothing to do.
fn step(
    fs: &FileSet,
    rng: &mut Rng,
    want: u8,
    ok: u8,
    undo: u8,
    f: impl FnOnce(usize) -> TResult<()>,
) -> TResult<()> {
    let Some(i) = fs.claim(rng, want) else { return Ok(()) };
    match f(i) {
        Ok(()) => {
            fs.release(i, ok);
            Ok(())
        }
        Err(e) => {
            fs.release(i, undo);
            Err(e)
        }
    }
}

/// One loop of a personality. Each step claims its file, and on any error the slot
/// goes back to its previous state before the error is returned.
fn one_loop(
    t: &dyn Target,
    fs: &FileSet,
    rng: &mut Rng,
    c: &mut Counters,
    rbuf: &mut [u8],
    wbuf: &[u8],
    log: Option<&crate::target::Handle>,
) -> TResult<()> {
    let p = &fs.p;
    let wsize = |rng: &mut Rng| rng.around(p.write_io).min(wbuf.len() as u64) as usize;
    let read_step = |i: usize, c: &mut Counters, rbuf: &mut [u8]| -> TResult<()> {
        let h = t.open(&fs.path(i), false)?;
        let n = read_whole(t, &h, rbuf)?;
        t.close(h)?;
        c.ops += 3;
        c.bytes += n;
        Ok(())
    };
    match p.name {
        "fileserver" => {
            let size = rng.around(p.filesize);
            step(fs, rng, ABSENT, PRESENT, ABSENT, |i| {
                let h = t.create(&fs.path(i), false)?;
                let mut off = 0;
                while off < size {
                    let n = (size - off).min(p.write_io) as usize;
                    t.write_at(&h, off, &wbuf[..n])?;
                    off += n as u64;
                }
                t.close(h)?;
                c.ops += 3;
                c.bytes += size;
                Ok(())
            })?;
            let n = wsize(rng);
            step(fs, rng, PRESENT, PRESENT, PRESENT, |i| {
                let h = t.open(&fs.path(i), true)?;
                t.append(&h, &wbuf[..n])?;
                t.close(h)?;
                c.ops += 3;
                c.bytes += n as u64;
                Ok(())
            })?;
            step(fs, rng, PRESENT, PRESENT, PRESENT, |i| read_step(i, c, rbuf))?;
            step(fs, rng, PRESENT, ABSENT, PRESENT, |i| {
                t.unlink(&fs.path(i))?;
                c.ops += 1;
                Ok(())
            })?;
            step(fs, rng, PRESENT, PRESENT, PRESENT, |i| {
                t.stat(&fs.path(i))?;
                c.ops += 1;
                Ok(())
            })?;
        }
        "varmail" => {
            step(fs, rng, PRESENT, ABSENT, PRESENT, |i| {
                t.unlink(&fs.path(i))?;
                c.ops += 1;
                Ok(())
            })?;
            let n = wsize(rng);
            step(fs, rng, ABSENT, PRESENT, ABSENT, |i| {
                let h = t.create(&fs.path(i), true)?;
                t.append(&h, &wbuf[..n])?;
                t.fsync(&h)?;
                t.close(h)?;
                c.ops += 4;
                c.bytes += n as u64;
                Ok(())
            })?;
            let n = wsize(rng);
            step(fs, rng, PRESENT, PRESENT, PRESENT, |i| {
                let h = t.open(&fs.path(i), true)?;
                let r = read_whole(t, &h, rbuf)?;
                t.append(&h, &wbuf[..n])?;
                t.fsync(&h)?;
                t.close(h)?;
                c.ops += 5;
                c.bytes += r + n as u64;
                Ok(())
            })?;
            step(fs, rng, PRESENT, PRESENT, PRESENT, |i| read_step(i, c, rbuf))?;
        }
        "webserver" => {
            for _ in 0..10 {
                step(fs, rng, PRESENT, PRESENT, PRESENT, |i| read_step(i, c, rbuf))?;
            }
        }
        _ => {
            // webproxy
            step(fs, rng, PRESENT, ABSENT, PRESENT, |i| {
                t.unlink(&fs.path(i))?;
                c.ops += 1;
                Ok(())
            })?;
            let n = wsize(rng);
            step(fs, rng, ABSENT, PRESENT, ABSENT, |i| {
                let h = t.create(&fs.path(i), true)?;
                t.append(&h, &wbuf[..n])?;
                t.close(h)?;
                c.ops += 3;
                c.bytes += n as u64;
                Ok(())
            })?;
            for _ in 0..5 {
                step(fs, rng, PRESENT, PRESENT, PRESENT, |i| read_step(i, c, rbuf))?;
            }
        }
    }
    if let Some(h) = log {
        let n = wsize(rng);
        t.append(h, &wbuf[..n])?;
        c.ops += 1;
        c.bytes += n as u64;
        c.log_bytes += n as u64;
        if c.log_bytes >= LOG_TRUNCATE {
            let h = t.create("fb/log", true)?;
            t.close(h)?;
            c.log_bytes = 0;
        }
    }
    Ok(())
}

fn build(t: &dyn Target, fs: &FileSet, seed: u64) -> TResult<()> {
    for d in fs.dirs() {
        t.mkdir(&d)?;
    }
    let wbuf = pattern(fs.p.write_io.max(256 * 1024) as usize, 9);
    let mut rng = Rng::new(seed);
    for i in 0..fs.n {
        if (rng.below(1000) as f64) < fs.p.prealloc * 1000.0 {
            let size = rng.around(fs.p.filesize);
            let h = t.create(&fs.path(i), false)?;
            let mut off = 0;
            while off < size {
                let n = (size - off).min(wbuf.len() as u64) as usize;
                t.write_at(&h, off, &wbuf[..n])?;
                off += n as u64;
            }
            t.close(h)?;
            fs.release(i, PRESENT);
        } else {
            fs.release(i, ABSENT);
        }
    }
    if matches!(fs.p.name, "webserver" | "webproxy") {
        let h = t.create("fb/log", true)?;
        t.close(h)?;
    }
    Ok(())
}

fn run_for(
    t: &dyn Target,
    fs: &FileSet,
    threads: usize,
    dur: Duration,
    seed: u64,
) -> TResult<(u64, u64, f64)> {
    let logged = matches!(fs.p.name, "webserver" | "webproxy");
    let ph = super::parallel(threads, |tid, gate| {
        let log = if logged { Some(t.open("fb/log", true)?) } else { None };
        let mut rng = Rng::new(seed ^ ((tid as u64 + 1) * 0x51ed));
        let mut rbuf = vec![0u8; fs.p.read_io as usize];
        let wbuf = pattern((fs.p.write_io * 2).max(fs.p.filesize.min(1 << 20)) as usize, tid as u8);
        let mut c = Counters { ops: 0, bytes: 0, log_bytes: 0 };
        let t0 = gate.start();
        let mut r = Ok(());
        while t0.elapsed() < dur {
            r = one_loop(t, fs, &mut rng, &mut c, &mut rbuf, &wbuf, log.as_ref());
            if r.is_err() {
                break;
            }
        }
        gate.stop();
        if let Some(h) = log {
            t.close(h)?;
        }
        r.map(|_| (c.ops, c.bytes))
    })?;
    Ok((ph.ops, ph.bytes, ph.secs))
}

/// Run the filebench experiment.
pub fn run(ctx: &mut Ctx<'_>) -> TResult<()> {
    let cfg = ctx.cfg;
    let idx = with_metadata(ctx.targets);
    let threads = cfg.threads.iter().copied().max().unwrap_or(1);
    let pers = personalities();
    let pb = ctx.bar("filebench", (pers.len() * idx.len() * (cfg.fb_reps + 1)) as u64);
    let dur = Duration::from_secs_f64(cfg.duration);
    for p in &pers {
        let n = ((p.nfiles as f64 * cfg.fileset_scale).round() as usize).max(20);
        let mut sets: Vec<(usize, FileSet)> = Vec::new();
        for &i in &idx {
            let fs =
                FileSet { p: p.clone(), n, slots: (0..n).map(|_| AtomicU8::new(ABSENT)).collect() };
            pb.set_message(format!("{}: building {n} files on {}", p.name, ctx.targets[i].name()));
            let r = ctx.targets[i].reset().and_then(|_| build(ctx.targets[i].as_ref(), &fs, 42));
            match r {
                Ok(()) => sets.push((i, fs)),
                Err(e) => {
                    say(&pb, &format!("  {} on {}: {e}", p.name, ctx.targets[i].name()));
                    ctx.res.fail(
                        "filebench",
                        p.name,
                        ctx.targets[i].name(),
                        &format!("file set: {e}"),
                    );
                    pb.inc((cfg.fb_reps + 1) as u64);
                }
            }
        }
        for rep in 0..=cfg.fb_reps {
            let mut keep = Vec::new();
            for (i, fs) in sets.drain(..) {
                let t = ctx.targets[i].as_ref();
                pb.set_message(format!("{} rep {rep} on {}", p.name, t.name()));
                let d = if rep == 0 { dur / 5 } else { dur };
                match run_for(t, &fs, threads, d, 1000 + rep as u64) {
                    Ok((ops, bytes, secs)) => {
                        if rep > 0 {
                            let mut extra = BTreeMap::new();
                            extra.insert("mb_per_sec".into(), bytes as f64 / 1e6 / secs.max(1e-9));
                            ctx.res.push(Sample {
                                experiment: "filebench".into(),
                                case: p.name.into(),
                                target: t.name().into(),
                                rep: rep - 1,
                                ops,
                                bytes,
                                secs,
                                value: ops as f64 / secs.max(1e-9),
                                extra,
                            });
                        }
                        keep.push((i, fs));
                        pb.inc(1);
                    }
                    Err(e) => {
                        say(&pb, &format!("  {} on {}: {e}", p.name, t.name()));
                        ctx.res.fail("filebench", p.name, t.name(), &e.to_string());
                        pb.inc((cfg.fb_reps + 1 - rep) as u64);
                    }
                }
            }
            sets = keep;
        }
    }
    pb.finish_and_clear();
    let scale = |p: &Personality| ((p.nfiles as f64 * cfg.fileset_scale).round() as usize).max(20);
    ctx.res.tables.push(Table {
        experiment: "filebench".into(),
        title: format!("Filebench-style personalities, {threads} threads"),
        unit: "ops/s".into(),
        higher_is_better: true,
        note: format!(
            "{:.1} s per repetition after a {:.1} s warm-up. File sets: {}.",
            cfg.duration,
            cfg.duration / 5.0,
            pers.iter()
                .map(|p| format!(
                    "{} {} files of ~{} KiB (dir width {}, I/O {} KiB read / {} KiB write)",
                    p.name,
                    scale(p),
                    p.filesize / 1024,
                    if p.dirwidth >= scale(p) { "all".to_string() } else { p.dirwidth.to_string() },
                    p.read_io / 1024,
                    p.write_io / 1024
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ),
        rows: pers.iter().map(|p| Row { label: p.name.into(), case: p.name.into() }).collect(),
    });
    let targets = ctx.res.targets_in("filebench");
    let cats: Vec<String> = pers.iter().map(|p| p.name.to_string()).collect();
    let series = targets
        .iter()
        .map(|t| Series {
            name: t.clone(),
            points: cats
                .iter()
                .enumerate()
                .filter_map(|(k, c)| {
                    ctx.res.summary("filebench", c, t).map(|s| (k as f64, s.median))
                })
                .collect(),
        })
        .collect();
    ctx.res.plots.push((
        "filebench".into(),
        Plot {
            id: "filebench".into(),
            title: format!("Filebench-style personalities, {threads} threads"),
            x_label: "personality".into(),
            y_label: "ops/s".into(),
            log_x: false,
            log_y: true,
            categories: cats,
            series,
        },
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_paths_live_in_declared_dirs() {
        for p in personalities() {
            let fs = FileSet {
                p: p.clone(),
                n: 1000,
                slots: (0..1000).map(|_| AtomicU8::new(0)).collect(),
            };
            let dirs = fs.dirs();
            for i in 0..fs.n {
                let path = fs.path(i);
                let parent = &path[..path.rfind('/').unwrap()];
                assert!(dirs.iter().any(|d| d == parent), "{path}");
            }
            // Parents are listed before children.
            for (k, d) in dirs.iter().enumerate().skip(1) {
                let parent = &d[..d.rfind('/').unwrap()];
                assert!(dirs[..k].iter().any(|x| x == parent));
            }
        }
    }

    #[test]
    fn claims_are_exclusive() {
        let p = personalities().remove(0);
        let fs = FileSet { p, n: 4, slots: (0..4).map(|_| AtomicU8::new(PRESENT)).collect() };
        let mut rng = Rng::new(1);
        let mut got = Vec::new();
        while let Some(i) = fs.claim(&mut rng, PRESENT) {
            got.push(i);
        }
        got.sort();
        assert_eq!(got, vec![0, 1, 2, 3]);
        assert!(fs.claim(&mut rng, ABSENT).is_none());
        fs.release(2, ABSENT);
        assert_eq!(fs.claim(&mut rng, ABSENT), Some(2));
    }
}
