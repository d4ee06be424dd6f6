//! The DRAM state of an inode must always equal what a replay of its log rebuilds,
//! and every block must have exactly one owner: long random churns on one file and
//! on one directory (writes of every size, truncates, punches, fallocate past EOF,
//! xattrs, chmods; creates, unlinks, renames, links), with fsck after *every*
//! operation (fsck compares the cached state with a fresh replay) and a crash
//! remount at the end. This is where fast/thorough GC and replay disagreements show
//! first (see `core_regressions.rs`). `FERRITE_CHURN_SEEDS` raises the seed count.

mod common;
use common::*;
use ferrite_core::*;

fn seeds(default: u64) -> u64 {
    std::env::var("FERRITE_CHURN_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[track_caller]
fn fsck_or_dump(fs: &Fs<SimMedium>, seed: u64, step: usize, log: &[String]) {
    let r = fs.fsck().unwrap();
    if !r.is_clean() {
        let tail = &log[log.len().saturating_sub(40)..];
        panic!("seed {seed} step {step}: {:?}\nlast operations:\n{}", r.errors, tail.join("\n"));
    }
}

#[test]
fn one_file_churn_keeps_dram_equal_to_the_log() {
    for seed in 0..seeds(80) {
        let fs = fresh_sim(4 << 20, 1);
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        let mut rng = Rng(seed);
        let mut log = Vec::new();
        let mut content: Vec<u8> = Vec::new();
        for step in 0..300 {
            let op = rng.below(9);
            let off = rng.below(20_000);
            let len = [1, 10, 100, 2000, 2049, 3000, 4096, 9000][rng.below(8) as usize];
            let r = match op {
                0..=2 => {
                    let data = pattern(seed * 1000 + step as u64, off, len);
                    let r = fs.write(f, off, &data).map(|_| ());
                    if r.is_ok() {
                        let end = off as usize + len;
                        if content.len() < end {
                            content.resize(end, 0);
                        }
                        content[off as usize..end].copy_from_slice(&data);
                    }
                    r
                }
                3 => {
                    let size = rng.below(20_000);
                    let r = fs.setattr(f, &SetAttr { size: Some(size), ..Default::default() });
                    if r.is_ok() {
                        content.resize(size as usize, 0);
                    }
                    r.map(|_| ())
                }
                4 => fs
                    .setattr(
                        f,
                        &SetAttr { perm: Some(rng.below(0o777) as u32), ..Default::default() },
                    )
                    .map(|_| ()),
                5 => {
                    let name = format!("user.{}", rng.below(3));
                    fs.setxattr(f, name.as_bytes(), &vec![7; len.min(3000)], XattrSet::Any)
                }
                6 => {
                    let mode = FallocMode {
                        keep_size: true,
                        punch_hole: true,
                        zero_range: false,
                        shift: None,
                        unshare: false,
                    };
                    let r = fs.fallocate(f, mode, off, len as u64);
                    if r.is_ok() {
                        let end = (off as usize + len).min(content.len());
                        if (off as usize) < end {
                            content[off as usize..end].fill(0);
                        }
                    }
                    r
                }
                7 => {
                    let keep = rng.below(2) == 0;
                    let mode = FallocMode {
                        keep_size: keep,
                        punch_hole: false,
                        zero_range: false,
                        shift: None,
                        unshare: false,
                    };
                    let r = fs.fallocate(f, mode, off, len as u64);
                    if r.is_ok() && !keep && content.len() < off as usize + len {
                        content.resize(off as usize + len, 0);
                    }
                    r
                }
                _ => match fs.removexattr(f, format!("user.{}", rng.below(3)).as_bytes()) {
                    Err(Error::NoAttr) => Ok(()),
                    r => r,
                },
            };
            log.push(format!("{step}: op {op} off {off} len {len} -> {r:?}"));
            r.unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            fsck_or_dump(&fs, seed, step, &log);
        }
        assert!(fs.read_all(f).unwrap() == content, "seed {seed}: contents");
        let fs = remount(fs, Remount::CrashCurrent);
        assert!(fs.read_all(f).unwrap() == content, "seed {seed}: contents after a crash");
    }
}

#[test]
fn one_directory_churn_keeps_dram_equal_to_the_log() {
    for seed in 0..seeds(40) {
        let fs = fresh_sim(4 << 20, 1);
        let root = fs.root();
        let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        let mut rng = Rng(seed + 7777);
        let mut log = Vec::new();
        let name = |i: u64| format!("name-{i:03}-{}", "x".repeat((i % 5) as usize * 40));
        for step in 0..400 {
            let (a, b) = (rng.below(40), rng.below(40));
            let op = rng.below(7);
            let r = match op {
                0 | 1 => fs.create(d, name(a).as_bytes(), 0o644, 0, 0).map(|_| ()),
                2 => fs.unlink(d, name(a).as_bytes()),
                3 => {
                    fs.rename(d, name(a).as_bytes(), d, name(b).as_bytes(), RenameFlags::default())
                }
                4 => match fs.lookup_ino(d, name(a).as_bytes()) {
                    Ok(i) => fs.link(i, d, name(b).as_bytes()).map(|_| ()),
                    Err(e) => Err(e),
                },
                5 => fs.mkdir(d, name(a).as_bytes(), 0o755, 0, 0).map(|_| ()),
                _ => fs.rmdir(d, name(a).as_bytes()),
            };
            log.push(format!("{step}: op {op} {a} {b} -> {r:?}"));
            if let Err(e) = &r {
                let expected = matches!(
                    e,
                    Error::NotFound
                        | Error::Exists
                        | Error::IsDir
                        | Error::NotDir
                        | Error::NotEmpty
                        | Error::NotPermitted
                );
                assert!(expected, "seed {seed} step {step}: {e}");
            }
            fsck_or_dump(&fs, seed, step, &log);
        }
        let names: Vec<Vec<u8>> = fs.list_dir(d).unwrap().into_iter().map(|e| e.name).collect();
        let fs = remount(fs, Remount::CrashCurrent);
        let after: Vec<Vec<u8>> = fs.list_dir(d).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, after, "seed {seed}: listing after a crash");
    }
}
