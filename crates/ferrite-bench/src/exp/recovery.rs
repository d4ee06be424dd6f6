//! Recovery: mount time after a clean unmount and after a crash, for data sets shaped
//! like NOVA's Table 2 (videoserver: few large files, 1 MiB I/O; fileserver: 1 MiB
//! files, 64 KiB I/O; mailserver: 128 KiB files, 16 KiB I/O), scaled to
//! `recovery_data` bytes each, plus a pair with the same files and log entries but 4x
//! the data (does crash recovery scale with metadata or with data?).
//!
//! Invariants:
//! - All data sets use pools of the same size, so the inode table and allocator
//!   scans are the same and only the data set differs.
//! - "Crash" is `Fs::crash` (drop without unmount) after a mount: the next mount
//!   cannot use the checkpoint and rebuilds the allocators from every inode log.
//! - After the last crash recovery every directory holds exactly the files written
//!   (the recovered file system is checked, not only timed).
//! - "Clean, shared" mounts follow a clone of the first file (a reflink): the
//!   checkpoint then records shared blocks and a clean mount walks every log to
//!   count their references (format version 6), as crash recovery does.

use super::{pattern, say, Ctx};
use crate::config::fmt_size;
use crate::results::{Sample, TextTable};
use crate::stats::Summary;
use crate::target::{TResult, TargetError};
use ferrite_core::{Fs, MapOptions, MkfsOptions, MmapMedium, MountOptions};
use std::collections::BTreeMap;
use std::time::Instant;

/// A data set.
#[derive(Clone, Debug)]
pub struct DataSet {
    /// Name.
    pub name: String,
    /// Files.
    pub files: u64,
    /// Bytes per file.
    pub file_size: u64,
    /// Write size.
    pub io: u64,
}

impl DataSet {
    /// Total bytes.
    pub fn bytes(&self) -> u64 {
        self.files * self.file_size
    }
}

/// The data sets for `data` bytes each.
pub fn datasets(data: u64) -> Vec<DataSet> {
    const K: u64 = 1024;
    const M: u64 = 1024 * K;
    let mk = |name: &str, file: u64, io: u64| {
        let file = file.min(data / 2).max(io);
        DataSet {
            name: name.into(),
            files: (data / file).max(1),
            file_size: file,
            io: io.min(file),
        }
    };
    let base = data / 4;
    let f1 = (base / 16).max(64 * K);
    vec![
        mk("videoserver", 128 * M, M),
        mk("fileserver", M, 64 * K),
        mk("mailserver", 128 * K, 16 * K),
        DataSet { name: "same-metadata-1x".into(), files: 16, file_size: f1, io: f1 / 64 },
        DataSet { name: "same-metadata-4x".into(), files: 16, file_size: 4 * f1, io: 4 * f1 / 64 },
    ]
}

fn path_of(i: u64) -> Vec<u8> {
    format!("/d{}/f{i}", i / 1000).into_bytes()
}

struct Built {
    log_pages: u64,
}

fn build(fs: &Fs<MmapMedium>, ds: &DataSet) -> TResult<Built> {
    let buf = pattern(ds.io as usize, 5);
    let mut log_pages = 0u64;
    for d in 0..ds.files.div_ceil(1000) {
        fs.mkdir_all(format!("/d{d}").as_bytes(), 0o755)?;
    }
    for i in 0..ds.files {
        let p = path_of(i);
        let (parent, name) = fs.resolve_parent(&p)?;
        let ino = fs.create(parent, name, 0o644, 0, 0)?.ino;
        let mut off = 0;
        while off < ds.file_size {
            let n = (ds.file_size - off).min(ds.io) as usize;
            fs.write(ino, off, &buf[..n])?;
            off += n as u64;
        }
        log_pages += fs.log_pages(ino)? as u64;
    }
    for d in 0..ds.files.div_ceil(1000) {
        log_pages += fs.log_pages(fs.resolve(format!("/d{d}").as_bytes(), true)?)? as u64;
    }
    Ok(Built { log_pages })
}

fn check(fs: &Fs<MmapMedium>, ds: &DataSet) -> TResult<()> {
    let mut n = 0u64;
    for d in 0..ds.files.div_ceil(1000) {
        let ino = fs.resolve(format!("/d{d}").as_bytes(), true)?;
        n += fs.list_dir(ino)?.len() as u64;
    }
    let last = fs.resolve(&path_of(ds.files - 1), true)?;
    if n != ds.files || fs.getattr(last)?.size != ds.file_size {
        return Err(TargetError::Other(format!(
            "{}: recovered {n} files (expected {}), last file {} bytes",
            ds.name,
            ds.files,
            fs.getattr(last)?.size
        )));
    }
    Ok(())
}

/// Mounts of each kind per data set: at least 15, since a mount takes milliseconds and
/// a shared machine's noise is of the same order (5 repetitions gave 0.6x to 1.7x for
/// the same pair of data sets).
fn mount_reps(reps: usize) -> usize {
    reps.max(15)
}

/// Run the recovery experiment (FerriteFS library only).
pub fn run(ctx: &mut Ctx<'_>) -> TResult<()> {
    let cfg = ctx.cfg;
    let sets = datasets(cfg.recovery_data);
    let pool_size = sets
        .iter()
        .map(|d| d.bytes() + d.bytes() / 5 + d.files * 16 * 1024 + (64 << 20))
        .max()
        .unwrap_or(256 << 20)
        .div_ceil(1 << 20)
        * (1 << 20);
    let pb = ctx.bar("recovery", sets.len() as u64);
    let pool = cfg.work_dir.join("recovery.pool");
    let mut rows = Vec::new();
    for ds in &sets {
        pb.set_message(format!(
            "{}: writing {} in {} files",
            ds.name,
            fmt_size(ds.bytes()),
            ds.files
        ));
        // One sample of mount kind `kind` (milliseconds), with the data set's file count.
        let push = |ctx: &mut Ctx<'_>, kind: &str, rep: usize, v: f64, more: &[(&str, f64)]| {
            let mut extra = BTreeMap::new();
            extra.insert("files".into(), ds.files as f64);
            for &(k, x) in more {
                extra.insert(k.into(), x);
            }
            ctx.res.push(Sample {
                experiment: "recovery".into(),
                case: format!("{}/{kind}", ds.name),
                target: "ferrite-lib".into(),
                rep,
                ops: 1,
                bytes: ds.bytes(),
                secs: v / 1e3,
                value: v,
                extra,
            });
        };
        let r = (|| -> TResult<()> {
            let _ = std::fs::remove_file(&pool);
            let m = MmapMedium::create(&pool, pool_size, &MapOptions::default())?;
            let mut fs = Fs::mkfs(m, &MkfsOptions::default())?;
            let built = build(&fs, ds)?;
            let mut clean = Vec::new();
            let mut crash = Vec::new();
            let mut scanned = 0;
            for rep in 0..mount_reps(cfg.reps) {
                pb.set_message(format!("{}: mounts, rep {rep}", ds.name));
                let m = fs.unmount()?;
                let t0 = Instant::now();
                fs = Fs::mount(m, &MountOptions::default())?;
                let c = t0.elapsed().as_secs_f64() * 1e3;
                if !fs.mount_report().clean {
                    return Err(TargetError::Other("mount after unmount was not clean".into()));
                }
                clean.push(c);
                let m = fs.crash();
                let t0 = Instant::now();
                fs = Fs::mount(m, &MountOptions::default())?;
                let r = t0.elapsed().as_secs_f64() * 1e3;
                if fs.mount_report().clean {
                    return Err(TargetError::Other("mount after crash used the checkpoint".into()));
                }
                scanned = fs.mount_report().inodes_scanned;
                crash.push(r);
                for (kind, v) in [("clean", c), ("crash", r)] {
                    let extra = [
                        ("log_pages", built.log_pages as f64),
                        ("inodes_scanned", scanned as f64),
                        ("pool_bytes", pool_size as f64),
                    ];
                    push(ctx, kind, rep, v, &extra);
                }
            }
            // A reflink of the first file: clean mounts must now count references.
            let src = fs.resolve(&path_of(0), true)?;
            let dst = fs.create(fs.root(), b"shared", 0o644, 0, 0)?.ino;
            fs.clone_range(src, 0, dst, 0, 0)?;
            let mut shared = Vec::new();
            for rep in 0..mount_reps(cfg.reps) {
                pb.set_message(format!("{}: clean mounts with shared blocks, rep {rep}", ds.name));
                let m = fs.unmount()?;
                let t0 = Instant::now();
                fs = Fs::mount(m, &MountOptions::default())?;
                let v = t0.elapsed().as_secs_f64() * 1e3;
                let rpt = fs.mount_report();
                if !rpt.clean || !rpt.refs_counted || rpt.shared_blocks == 0 {
                    return Err(TargetError::Other(format!(
                        "clean mount with shared blocks: {rpt:?}"
                    )));
                }
                shared.push(v);
                push(ctx, "clean-shared", rep, v, &[("shared_blocks", rpt.shared_blocks as f64)]);
            }
            check(&fs, ds)?;
            fs.unmount()?;
            let (Some(cl), Some(cr), Some(sh)) =
                (Summary::of(&clean), Summary::of(&crash), Summary::of(&shared))
            else {
                return Err(TargetError::Other("no repetitions".into()));
            };
            let gb = ds.bytes() as f64 / 1e9;
            rows.push(vec![
                ds.name.clone(),
                ds.files.to_string(),
                fmt_size(ds.file_size),
                fmt_size(ds.io),
                fmt_size(ds.bytes()),
                built.log_pages.to_string(),
                format!("{:.2} ±{:.0}%", cl.median, cl.spread_pct()),
                format!("{:.1} ±{:.0}%", cr.median, cr.spread_pct()),
                format!("{:.1} ±{:.0}%", sh.median, sh.spread_pct()),
                format!("{:.1}", cr.median / gb),
                format!("{:.0}", cr.median / (ds.files as f64 / 1e6)),
                format!("{:.1}", cr.median / (built.log_pages as f64 / 1e3)),
                scanned.to_string(),
            ]);
            Ok(())
        })();
        let _ = std::fs::remove_file(&pool);
        if let Err(e) = r {
            say(&pb, &format!("  recovery {}: {e}", ds.name));
            ctx.res.fail("recovery", &ds.name, "ferrite-lib", &e.to_string());
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    ctx.res.text_tables.push((
        "recovery".into(),
        TextTable {
            title: format!(
                "Mount time after a clean unmount and after a crash (pool {})",
                fmt_size(pool_size)
            ),
            headers: [
                "data set",
                "files",
                "file size",
                "I/O size",
                "data",
                "log pages",
                "clean mount (ms)",
                "crash recovery (ms)",
                "clean mount, shared blocks (ms)",
                "crash ms per GB",
                "crash ms per million files",
                "crash ms per 1000 log pages",
                "inodes scanned",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
            rows,
            note: format!(
                "FerriteFS library only; {} mounts of each kind per data set (medians); recovery \
                 uses one worker per core ({} here). The same-metadata pair has the same files \
                 and log entries, with 4x the data in the second. \"Clean mount, shared \
                 blocks\": after a clone of the first file, a clean mount walks every log to \
                 count references (as crash recovery does).",
                mount_reps(cfg.reps),
                std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
            ),
        },
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datasets_scale() {
        let d = datasets(2 << 30);
        assert_eq!(d[0].files, 16);
        assert_eq!(d[1].files, 2048);
        assert_eq!(d[2].files, 16384);
        assert_eq!(d[3].files, d[4].files);
        assert_eq!(d[4].bytes(), 4 * d[3].bytes());
        assert_eq!(d[3].file_size / d[3].io, d[4].file_size / d[4].io);
        for s in datasets(16 << 20) {
            assert!(s.files >= 1 && s.io >= 1 && s.io <= s.file_size, "{s:?}");
        }
    }
}
