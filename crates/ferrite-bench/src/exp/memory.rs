//! Memory: the DRAM FerriteFS holds for its indexes, per GiB of file data and per file,
//! measured as anonymous resident memory (RssAnon: heap, not the pool mapping, which
//! is shared memory) in a fresh child process that mounts a prepared pool.
//!
//! Why a child: freed heap memory stays in the allocator's free lists, so a process
//! that built the data set would reuse it and under-report. The child starts clean,
//! reads RssAnon, mounts, loads, and reads it again.
//!
//! Invariants: the parent builds and cleanly unmounts the pool before the child runs
//! (one process owns a pool at a time); the child prints exactly one JSON line.

use super::{pattern, say, Ctx};
use crate::config::fmt_size;
use crate::results::{Sample, TextTable};
use crate::rng::Rng;
use crate::target::{TResult, TargetError};
use ferrite_core::{Fs, MapOptions, MkfsOptions, MmapMedium, MountOptions};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Environment variable that puts the bench binary in child mode.
pub const CHILD_ENV: &str = "FERRITE_BENCH_CHILD";

/// Fields of /proc/self/status in KiB.
pub fn status_kb(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn anon() -> u64 {
    status_kb("RssAnon").unwrap_or(0) * 1024
}

fn files_in(fs: &Fs<MmapMedium>, dir: u64) -> TResult<Vec<u64>> {
    Ok(fs.list_dir(dir)?.into_iter().map(|e| e.ino).collect())
}

/// Child mode: measure the pool named in the environment; print one JSON line.
pub fn child_main() -> i32 {
    let r = (|| -> TResult<serde_json::Value> {
        let pool = std::env::var("FERRITE_BENCH_POOL")
            .map_err(|_| TargetError::Other("no pool".into()))?;
        let mode = std::env::var("FERRITE_BENCH_MODE").unwrap_or_default();
        let m0 = anon();
        let m = MmapMedium::open(Path::new(&pool), &MapOptions::default())?;
        let fs = Fs::mount(m, &MountOptions::default())?;
        let m1 = anon();
        let dirs = files_in(&fs, fs.root())?;
        let v = if mode == "data" {
            // Open every file (not idle) and touch it: the extent index is built.
            let mut b = [0u8; 1];
            for &ino in &dirs {
                fs.open(ino)?;
                fs.read(ino, 0, &mut b)?;
            }
            let m2 = anon();
            serde_json::json!({ "base": m0, "mounted": m1, "loaded": m2 })
        } else {
            // Directory indexes only: the files themselves stay idle.
            let mut files = Vec::new();
            for &d in &dirs {
                files.extend(files_in(&fs, d)?);
            }
            let m2 = anon();
            for &ino in &files {
                fs.getattr(ino)?;
            }
            let m3 = anon();
            let evicted = fs.evict_idle();
            let m4 = anon();
            serde_json::json!({ "base": m0, "mounted": m1, "listed": m2, "stat_all": m3,
                                "evicted": m4, "evicted_inodes": evicted, "files": files.len() })
        };
        let hwm = status_kb("VmHWM").unwrap_or(0) * 1024;
        let shmem = status_kb("RssShmem").unwrap_or(0) * 1024;
        let mut v = v;
        v["vm_hwm"] = hwm.into();
        v["rss_shmem"] = shmem.into();
        fs.unmount()?;
        Ok(v)
    })();
    match r {
        Ok(v) => {
            println!("{v}");
            0
        }
        Err(e) => {
            eprintln!("memory child: {e}");
            1
        }
    }
}

fn spawn_child(pool: &Path, mode: &str) -> TResult<serde_json::Value> {
    // /proc/self/exe still runs this program when its file was replaced by a rebuild
    // during the run (current_exe() would then name a deleted file).
    let exe = if Path::new("/proc/self/exe").exists() {
        std::path::PathBuf::from("/proc/self/exe")
    } else {
        std::env::current_exe().map_err(|e| TargetError::Other(format!("current_exe: {e}")))?
    };
    let out = Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .env(CHILD_ENV, "memory")
        .env("FERRITE_BENCH_POOL", pool)
        .env("FERRITE_BENCH_MODE", mode)
        .output()
        .map_err(|e| TargetError::Other(format!("{}: {e}", exe.display())))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
    let v: serde_json::Value = serde_json::from_str(line).map_err(|_| {
        TargetError::Other(format!(
            "child {} did not report (exit {}): {}",
            exe.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    })?;
    Ok(v)
}

fn num(v: &serde_json::Value, k: &str) -> f64 {
    v.get(k).and_then(|x| x.as_f64()).unwrap_or(f64::NAN)
}

/// Build a data pool: `nfiles` files of `file` bytes, written sequentially in 1 MiB
/// writes, or page by page in random order (`random`: the worst case for extents).
fn build_data(pool: &Path, nfiles: u64, file: u64, random: bool) -> TResult<()> {
    let size = (nfiles * file + nfiles * file / 4 + (64 << 20)).div_ceil(1 << 20) * (1 << 20);
    let m = MmapMedium::create(pool, size, &MapOptions::default())?;
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    let buf = pattern(1 << 20, 4);
    let mut rng = Rng::new(4);
    for i in 0..nfiles {
        let ino = fs.create(fs.root(), format!("f{i}").as_bytes(), 0o644, 0, 0)?.ino;
        if random {
            let pages = file / 4096;
            let mut order: Vec<u64> = (0..pages).collect();
            for k in (1..order.len()).rev() {
                order.swap(k, rng.below(k as u64 + 1) as usize);
            }
            for p in order {
                fs.write(ino, p * 4096, &buf[..4096])?;
            }
        } else {
            let mut off = 0;
            while off < file {
                let n = (file - off).min(buf.len() as u64) as usize;
                fs.write(ino, off, &buf[..n])?;
                off += n as u64;
            }
        }
    }
    fs.unmount()?;
    Ok(())
}

/// Build a small-file pool: `n` files of 1 KiB in directories of 1000.
fn build_files(pool: &Path, n: u64) -> TResult<()> {
    let size = (n * 12 * 1024 + (64 << 20)).div_ceil(1 << 20) * (1 << 20);
    let m = MmapMedium::create(pool, size, &MapOptions::default())?;
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    let buf = pattern(1024, 6);
    let mut dir = 0;
    for i in 0..n {
        if i % 1000 == 0 {
            dir = fs.mkdir(fs.root(), format!("d{}", i / 1000).as_bytes(), 0o755, 0, 0)?.ino;
        }
        let ino = fs.create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0)?.ino;
        fs.write(ino, 0, &buf)?;
    }
    fs.unmount()?;
    Ok(())
}

/// Run the memory experiment.
pub fn run(ctx: &mut Ctx<'_>) -> TResult<()> {
    let cfg = ctx.cfg;
    let pb = ctx.bar("memory", 3);
    let pool = cfg.work_dir.join("memory.pool");
    let nfiles = 16u64;
    let file = (cfg.mem_data / nfiles).div_ceil(1 << 20) * (1 << 20);
    let data = nfiles * file;
    let mut rows: Vec<Vec<String>> = Vec::new();
    let push =
        |res: &mut crate::results::Results, case: &str, value: f64, v: &serde_json::Value| {
            let mut extra = BTreeMap::new();
            if let Some(o) = v.as_object() {
                for (k, x) in o {
                    if let Some(f) = x.as_f64() {
                        extra.insert(k.clone(), f);
                    }
                }
            }
            res.push(Sample {
                experiment: "memory".into(),
                case: case.into(),
                target: "ferrite-lib".into(),
                rep: 0,
                ops: 0,
                bytes: 0,
                secs: 0.0,
                value,
                extra,
            });
        };
    for (case, random) in [("data-sequential", false), ("data-random-4k", true)] {
        pb.set_message(format!("{case}: writing {}", fmt_size(data)));
        let r = build_data(&pool, nfiles, file, random).and_then(|_| spawn_child(&pool, "data"));
        let _ = std::fs::remove_file(&pool);
        match r {
            Ok(v) => {
                let index = num(&v, "loaded") - num(&v, "mounted");
                let pct = index / data as f64 * 100.0;
                push(ctx.res, case, pct, &v);
                rows.push(vec![
                    if random {
                        format!(
                            "{nfiles} files x {}, written 4 KiB at a time in random order",
                            fmt_size(file)
                        )
                    } else {
                        format!(
                            "{nfiles} files x {}, written sequentially in 1 MiB writes",
                            fmt_size(file)
                        )
                    },
                    format!("{:.1} KiB", (num(&v, "mounted") - num(&v, "base")) / 1024.0),
                    format!("{:.1} KiB", index / 1024.0),
                    format!(
                        "{:.3}% of data ({:.0} KiB per GiB)",
                        pct,
                        index / (data as f64 / (1u64 << 30) as f64) / 1024.0
                    ),
                    format!("{:.1} MiB", (num(&v, "vm_hwm") - num(&v, "rss_shmem")) / 1048576.0),
                ]);
            }
            Err(e) => {
                say(&pb, &format!("  memory {case}: {e}"));
                ctx.res.fail("memory", case, "ferrite-lib", &e.to_string());
            }
        }
        pb.inc(1);
    }
    let n = cfg.mem_files as u64;
    pb.set_message(format!("small files: creating {n}"));
    let r = build_files(&pool, n).and_then(|_| spawn_child(&pool, "files"));
    let _ = std::fs::remove_file(&pool);
    match r {
        Ok(v) => {
            let per_idle = (num(&v, "listed") - num(&v, "base")) / n as f64;
            let per_cached = (num(&v, "stat_all") - num(&v, "base")) / n as f64;
            push(ctx.res, "files-idle", per_idle, &v);
            push(ctx.res, "files-cached", per_cached, &v);
            rows.push(vec![
                format!("{n} files of 1 KiB in directories of 1000"),
                format!("{:.1} KiB", (num(&v, "mounted") - num(&v, "base")) / 1024.0),
                format!(
                    "{:.0} B per idle file (directories loaded); {:.0} B per file with its inode cached",
                    per_idle, per_cached
                ),
                format!(
                    "{:.1} MiB per 100k idle files; after evict_idle: {:.0} B per file still resident",
                    per_idle * 1e5 / 1048576.0,
                    (num(&v, "evicted") - num(&v, "base")) / n as f64
                ),
                format!("{:.1} MiB", (num(&v, "vm_hwm") - num(&v, "rss_shmem")) / 1048576.0),
            ]);
        }
        Err(e) => {
            say(&pb, &format!("  memory files: {e}"));
            ctx.res.fail("memory", "files-idle", "ferrite-lib", &e.to_string());
        }
    }
    pb.inc(1);
    pb.finish_and_clear();
    ctx.res.text_tables.push((
        "memory".into(),
        TextTable {
            title:
                "DRAM held by FerriteFS (anonymous RSS of a fresh process, pool mapping excluded)"
                    .into(),
            headers: ["data set", "after mount", "indexes", "share", "peak RSS minus pool pages"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            rows,
            note:
                "Measured in a child process started for the purpose: RssAnon before mount, after \
                   mount, and after the files were opened (data) or their directories listed (idle \
                   files). RSS has page granularity; small configurations are noisy."
                    .into(),
        },
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_status() {
        assert!(status_kb("VmRSS").unwrap() > 0);
        assert!(status_kb("RssAnon").is_some());
        assert!(status_kb("NoSuchField").is_none());
    }
}
