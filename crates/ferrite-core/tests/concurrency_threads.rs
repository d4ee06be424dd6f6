//! Several threads at once on private and shared files and directories, on a
//! simulated pool and on a pool file in /dev/shm:
//! - writers to disjoint byte ranges of one file (ranges share pages at their edges,
//!   so the page-range lock is exercised), with readers checking that every write is
//!   seen whole (all old or all new bytes, never a mix);
//! - creates, unlinks, renames (inside and across two shared directories), links,
//!   mkdir/rmdir on a small shared name pool (contention), each thread also keeping
//!   private names whose final state it knows exactly;
//! - an evictor dropping idle cached inodes meanwhile (they are rebuilt from logs).
//!
//! Afterwards: fsck clean, every file's bytes as its writer left them, and the same
//! after a crash remount. `FERRITE_CONC_ROUNDS` raises the per-thread operation count.

mod common;
use common::*;
use ferrite_core::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;

const THREADS: usize = 4;

/// Operations per thread (`FERRITE_CONC_ROUNDS` raises it for stress runs).
fn rounds() -> usize {
    std::env::var("FERRITE_CONC_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(400)
}
/// Not page aligned: neighbouring ranges share a page.
const RANGE: u64 = 3 * 4096 + 1000;

fn shm_pool(size: u64) -> (tempfile::TempDir, std::path::PathBuf, Fs<MmapMedium>) {
    let dir = tempfile::Builder::new().prefix("ferrite-conc").tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("pool");
    let m = MmapMedium::create(&path, size, &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions { shards: 4, ..Default::default() }).unwrap();
    (dir, path, fs)
}

/// Disjoint-range writers on one file plus whole-write readers on another.
fn shared_file_writers<M: Medium>(fs: &Fs<M>, rounds: usize) -> Vec<u8> {
    let root = fs.root();
    let shared = fs.create(root, b"shared", 0o644, 0, 0).unwrap().ino;
    let atomic = fs.create(root, b"atomic", 0o644, 0, 0).unwrap().ino;
    const ALEN: usize = 3 * 4096 + 700;
    fs.write(atomic, 0, &[0u8; ALEN]).unwrap();
    let done = AtomicBool::new(false);
    let barrier = Barrier::new(THREADS + 2);
    let ranges: Vec<Vec<u8>> = std::thread::scope(|s| {
        let writers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (barrier, fs) = (&barrier, fs);
                s.spawn(move || {
                    let base = t as u64 * RANGE;
                    let mut mine = vec![0u8; RANGE as usize];
                    let mut rng = Rng(t as u64 + 1);
                    barrier.wait();
                    for round in 0..rounds {
                        let off = rng.below(RANGE);
                        let max = RANGE - off;
                        let len = match rng.below(4) {
                            0 => rng.below(64) + 1,
                            1 => rng.below(2100) + 1,
                            2 => 4096,
                            _ => rng.below(9000) + 1,
                        }
                        .min(max);
                        let data = pattern((t * 100_000 + round) as u64, off, len as usize);
                        fs.write(shared, base + off, &data).unwrap();
                        mine[off as usize..(off + len) as usize].copy_from_slice(&data);
                        if round % 50 == 0 {
                            // Read back my own range: nobody else writes it.
                            let mut b = vec![0u8; RANGE as usize];
                            let n = fs.read(shared, base, &mut b).unwrap();
                            assert!(n as u64 <= RANGE);
                            assert!(
                                b[..n] == mine[..n],
                                "thread {t} round {round}: my range changed"
                            );
                        }
                    }
                    mine
                })
            })
            .collect();
        // One thread rewrites the whole `atomic` file with uniform bytes...
        let atomic_writer = {
            let (barrier, fs, done) = (&barrier, fs, &done);
            s.spawn(move || {
                barrier.wait();
                let mut v = 1u8;
                while !done.load(Ordering::Acquire) {
                    fs.write(atomic, 0, &[v; ALEN]).unwrap();
                    v = v.wrapping_add(1).max(1);
                }
            })
        };
        // ...and this one reads it: every read sees one whole write.
        let reader = {
            let (barrier, fs, done) = (&barrier, fs, &done);
            s.spawn(move || {
                barrier.wait();
                let mut b = vec![0u8; ALEN];
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) || reads < 10 {
                    assert_eq!(fs.read(atomic, 0, &mut b).unwrap(), ALEN);
                    assert!(b.iter().all(|&x| x == b[0]), "torn read of a whole-file write");
                    let mut c = vec![0u8; 5000];
                    let _ =
                        fs.read(shared, reads * 977 % (THREADS as u64 * RANGE), &mut c).unwrap();
                    reads += 1;
                }
                reads
            })
        };
        let results: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
        done.store(true, Ordering::Release);
        let ranges = results
            .into_iter()
            .map(|r| r.unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        atomic_writer.join().unwrap();
        assert!(reader.join().unwrap() >= 10);
        ranges
    });
    let mut want: Vec<u8> = ranges.concat();
    // The file ends where the last written byte is.
    let size = fs.getattr(shared).unwrap().size as usize;
    assert!(size <= want.len());
    want.truncate(size);
    assert!(fs.read_all(shared).unwrap() == want, "shared file contents");
    want
}

/// Shared and private names in two shared directories.
fn shared_dirs<M: Medium>(fs: &Fs<M>, rounds: usize) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let root = fs.root();
    let d1 = fs.mkdir(root, b"d1", 0o755, 0, 0).unwrap().ino;
    let d2 = fs.mkdir(root, b"d2", 0o755, 0, 0).unwrap().ino;
    let dirs = [d1, d2];
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(THREADS + 1);
    let privs = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (barrier, fs) = (&barrier, fs);
                s.spawn(move || {
                    let mut rng = Rng(1000 + t as u64);
                    // Private names (only this thread touches them) in d1: name -> content.
                    let mut mine: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
                    barrier.wait();
                    for round in 0..rounds {
                        let shared = |k: u64| format!("s{}", k % 6).into_bytes();
                        let (a, b) = (rng.below(12), rng.below(12));
                        let (da, db) = (dirs[rng.below(2) as usize], dirs[rng.below(2) as usize]);
                        let r = match rng.below(9) {
                            0 => fs.create(da, &shared(a), 0o644, 0, 0).map(|_| ()),
                            1 => fs.unlink(da, &shared(a)),
                            2 => fs.rename(da, &shared(a), db, &shared(b), RenameFlags::default()),
                            3 => {
                                let f = RenameFlags { exchange: true, noreplace: false };
                                fs.rename(da, &shared(a), db, &shared(b), f)
                            }
                            4 => match fs.lookup_ino(da, &shared(a)) {
                                Ok(i) => fs.link(i, db, &shared(b)).map(|_| ()),
                                Err(e) => Err(e),
                            },
                            5 => fs.mkdir(da, &shared(a + 6), 0o755, 0, 0).map(|_| ()),
                            6 => fs.rmdir(da, &shared(a + 6)),
                            7 => {
                                // Move a shared directory between d1 and d2.
                                fs.rename(
                                    da,
                                    &shared(a + 6),
                                    db,
                                    &shared(b + 6),
                                    RenameFlags::default(),
                                )
                            }
                            _ => {
                                // Private file: create, write, maybe rename or remove.
                                let name = format!("t{t}-{}", rng.below(8)).into_bytes();
                                match mine.get(&name) {
                                    None => {
                                        let data = pattern(
                                            (t * 7919 + round) as u64,
                                            0,
                                            rng.below(6000) as usize,
                                        );
                                        let ino = fs.create(d1, &name, 0o600, 0, 0).unwrap().ino;
                                        fs.write(ino, 0, &data).unwrap();
                                        mine.insert(name, data);
                                    }
                                    Some(_) if rng.below(3) == 0 => {
                                        fs.unlink(d1, &name).unwrap();
                                        mine.remove(&name);
                                    }
                                    Some(data) => {
                                        let ino = fs.lookup_ino(d1, &name).unwrap();
                                        assert!(
                                            fs.read_all(ino).unwrap() == *data,
                                            "private file {name:?}"
                                        );
                                        let extra = pattern(round as u64, data.len() as u64, 100);
                                        fs.write(ino, data.len() as u64, &extra).unwrap();
                                        mine.get_mut(&name).unwrap().extend_from_slice(&extra);
                                    }
                                }
                                Ok(())
                            }
                        };
                        if let Err(e) = r {
                            let fine = matches!(
                                e,
                                Error::NotFound
                                    | Error::Exists
                                    | Error::NotEmpty
                                    | Error::IsDir
                                    | Error::NotDir
                                    | Error::NotPermitted
                                    | Error::Invalid(_)
                            );
                            assert!(fine, "thread {t}: unexpected {e:?}");
                        }
                    }
                    mine
                })
            })
            .collect();
        let evictor = {
            let (barrier, fs, stop) = (&barrier, fs, &stop);
            s.spawn(move || {
                barrier.wait();
                let mut n = 0;
                while !stop.load(Ordering::Acquire) {
                    n += fs.evict_idle();
                    std::thread::yield_now();
                }
                n
            })
        };
        // Join everything before unwrapping: a panicking worker must not leave the
        // evictor spinning (the scope would wait for it forever).
        let results: Vec<_> = workers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Ordering::Release);
        evictor.join().unwrap();
        let mut all = BTreeMap::new();
        for r in results {
            all.extend(r.unwrap_or_else(|p| std::panic::resume_unwind(p)));
        }
        all
    });
    check_private(fs, &privs);
    privs
}

fn check_private<M: Medium>(fs: &Fs<M>, privs: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let d1 = fs.lookup_ino(fs.root(), b"d1").unwrap();
    let mut listed: Vec<Vec<u8>> = fs
        .list_dir(d1)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .filter(|n| n.starts_with(b"t"))
        .collect();
    listed.sort();
    assert_eq!(listed, privs.keys().cloned().collect::<Vec<_>>(), "private names");
    for (name, data) in privs {
        let ino = fs.lookup_ino(d1, name).unwrap();
        assert!(fs.read_all(ino).unwrap() == *data, "private file {name:?}");
    }
}

fn run_all<M: Medium>(fs: &Fs<M>, rounds: usize) -> (Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>) {
    let shared = shared_file_writers(fs, rounds);
    assert_fsck_clean(fs, "after shared-file writers");
    let privs = shared_dirs(fs, rounds);
    assert_fsck_clean(fs, "after shared-directory churn");
    (shared, privs)
}

#[test]
fn threads_on_a_simulated_pool() {
    let fs = fresh_sim(32 << 20, 4);
    let (shared, privs) = run_all(&fs, rounds());
    for how in [Remount::CrashCurrent, Remount::CrashDurable, Remount::Clean] {
        let fs2 = Fs::mount(
            SimMedium::from_image(match how {
                Remount::CrashDurable => fs.medium().durable_image(),
                _ => fs.medium().current_image(),
            }),
            &MountOptions::default(),
        )
        .unwrap();
        assert_fsck_clean(&fs2, &format!("{how:?} image"));
        let f = fs2.lookup_ino(fs2.root(), b"shared").unwrap();
        assert!(fs2.read_all(f).unwrap() == shared, "{how:?}: shared file");
        check_private(&fs2, &privs);
    }
    // The same pool takes a second round after a crash.
    let fs = remount(fs, Remount::CrashCurrent);
    let d = fs.mkdir(fs.root(), b"second", 0o755, 0, 0).unwrap().ino;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let fs = &fs;
            s.spawn(move || {
                for i in 0..200 {
                    let n = format!("{t}-{i}");
                    let f = fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap().ino;
                    fs.write(f, 0, n.as_bytes()).unwrap();
                    if i % 2 == 0 {
                        fs.unlink(d, n.as_bytes()).unwrap();
                    }
                }
            });
        }
    });
    assert_eq!(fs.list_dir(d).unwrap().len(), THREADS * 100);
    assert_fsck_clean(&fs, "second round");
}

#[test]
fn threads_on_a_pool_file_in_dev_shm() {
    let (_dir, path, fs) = shm_pool(32 << 20);
    let (shared, privs) = run_all(&fs, rounds());
    drop(fs.crash());
    let fs = mount_file_after_crash(&path, "pool file after a crash");
    let f = fs.lookup_ino(fs.root(), b"shared").unwrap();
    assert!(fs.read_all(f).unwrap() == shared, "shared file after a crash");
    check_private(&fs, &privs);
}

/// Many threads hammering small overwrites of one page each of one file: fast and
/// thorough GC run under contention.
#[test]
fn concurrent_overwrites_with_gc() {
    let fs = fresh_sim(16 << 20, 4);
    let f = fs.create(fs.root(), b"hot", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &vec![0u8; THREADS * 4096]).unwrap();
    let finals: Vec<Vec<u8>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let fs = &fs;
                s.spawn(move || {
                    let mut page = vec![0u8; 4096];
                    let mut rng = Rng(t as u64 + 50);
                    for i in 0..3000u32 {
                        let off = rng.below(4000) as usize;
                        let len = (rng.below(96) + 1) as usize;
                        let data = pattern(i as u64 + t as u64 * 10_000, off as u64, len);
                        fs.write(f, (t * 4096 + off) as u64, &data).unwrap();
                        page[off..off + len].copy_from_slice(&data);
                        if i % 500 == 0 {
                            let _ = fs.compact(f);
                        }
                    }
                    page
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(fs.read_all(f).unwrap() == finals.concat());
    let pages = fs.log_pages(f).unwrap();
    assert!(pages <= 16, "log of a 4-page file after 12000 small writes: {pages} pages");
    assert_fsck_clean(&fs, "after concurrent overwrites");
    let fs = remount(fs, Remount::CrashDurable);
    assert!(fs.read_all(f).unwrap() == finals.concat());
}
