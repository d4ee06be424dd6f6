//! Regression tests for two ferrite-core performance bugs found by `ferrite bench`.
//!
//! 1. `MmapMedium` counted every flush and non-temporal copy with a locked
//!    `fetch_add` on a shared counter. A locked read-modify-write issued right after
//!    clwb / non-temporal stores waits for them to complete (it orders like a fence),
//!    so every flush became a synchronous write-back (a third of the time of a
//!    `create`). Counting moved to a thread-local tally folded into the shared counters
//!    at the thread's next fence and at thread exit; these tests check the counts stay
//!    exact.
//! 3. Crash recovery claimed every data block of every extent with one atomic
//!    operation per block, so recovery time grew with the data, not the metadata
//!    (4x the data with the same files and log entries took 2.2x as long). Extents
//!    are now claimed a 64-bit word at a time (`AtomicBitmap::claim_range`); these
//!    tests check that overlaps are still found, at the right block.
//! 2. `InodeAlloc::alloc` scanned the whole bitmap of a full shard on every allocation
//!    before moving to the next shard (a quarter of the time of a `create` once the
//!    calling thread's shard had filled). Full shards are now skipped by a per-shard
//!    free count; these tests check allocation order and reuse are unchanged.

use ferrite_core::alloc::{AtomicBitmap, Bitmap, InodeAlloc};
use ferrite_core::layout::Geometry;
use ferrite_core::{MapOptions, Medium, MmapMedium};

#[test]
fn persist_counters_exact_across_threads_and_fences() {
    let dir = tempfile::tempdir().unwrap();
    let m =
        MmapMedium::create(&dir.path().join("c.pool"), 1 << 20, &MapOptions::default()).unwrap();
    let base = m.stats().snapshot();
    // The handles are joined explicitly: a scope's implicit join returns once each
    // closure is done, which can be before the thread's exit-time fold ran (this
    // test failed once in CI with one thread's last flush missing); `join` waits
    // for the whole thread.
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for t in 0..4u64 {
            let m = &m;
            handles.push(s.spawn(move || {
                for i in 0..100u64 {
                    let off = (t * 100 + i) * 256;
                    m.write(off, &[1u8; 100]);
                    m.flush(off, 100); // 2 lines
                    m.write_nt(off + 128, &[2u8; 64]);
                    if i % 10 == 9 {
                        m.fence();
                    }
                }
                // The last writes are after the last fence: folded at thread exit.
                m.flush(t * 64, 1);
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
    });
    let s = m.stats().snapshot();
    assert_eq!(s.flushed_bytes - base.flushed_bytes, 4 * (100 * 128 + 64));
    assert_eq!(s.nt_bytes - base.nt_bytes, 4 * 100 * 64);
    assert_eq!(s.fences - base.fences, 40);
    // The same thread switching between two media keeps both exact.
    let m2 =
        MmapMedium::create(&dir.path().join("d.pool"), 1 << 20, &MapOptions::default()).unwrap();
    let (a0, b0) = (m.stats().snapshot(), m2.stats().snapshot());
    m.flush(0, 64);
    m2.flush(0, 128);
    m.flush(64, 64);
    m.fence();
    m2.fence();
    assert_eq!(m.stats().snapshot().flushed_bytes - a0.flushed_bytes, 128);
    assert_eq!(m2.stats().snapshot().flushed_bytes - b0.flushed_bytes, 128);
}

#[test]
fn inode_allocator_skips_full_shards_and_reuses_freed_slots() {
    let geo = Geometry::compute(4096, 2, 256).unwrap();
    let mut used = Bitmap::new(geo.ninodes);
    used.set(0); // root
    let a = InodeAlloc::from_used(&geo, &used);
    let per = geo.ninodes / 2;
    let mut shard0 = Vec::new();
    // Shard 0 holds odd inode numbers (ino = local * 2 + 0 + 1); root took the first.
    for _ in 0..per - 1 {
        let ino = a.alloc(0).unwrap();
        assert_eq!(geo.ino_shard(ino), 0, "inode {ino} should come from shard 0");
        shard0.push(ino);
    }
    // Shard 0 is full: the next allocations come from shard 1.
    let next = a.alloc(0).unwrap();
    assert_eq!(geo.ino_shard(next), 1);
    // A freed slot in shard 0 is found again.
    a.free(shard0[17]).unwrap();
    assert_eq!(a.alloc(0).unwrap(), shard0[17]);
    // Exhaustion is ENOSPC, and the free count is right.
    let mut n = 0;
    while a.alloc(1).is_ok() {
        n += 1;
    }
    assert_eq!(n, per - 1);
    assert_eq!(a.free_inodes(), 0);
    a.free(next).unwrap();
    assert_eq!(a.free_inodes(), 1);
    assert_eq!(a.alloc(0).unwrap(), next);
}

#[test]
fn claim_range_sets_exactly_the_range_and_reports_the_first_overlap() {
    let b = AtomicBitmap::new(1000);
    assert_eq!(b.claim_range(3, 5), Ok(()));
    assert_eq!(b.claim_range(60, 200), Ok(())); // crosses words, whole middle words
    assert_eq!(b.claim_range(999, 1), Ok(()));
    assert_eq!(b.claim_range(0, 0), Ok(()));
    // Exactly the claimed bits are set (claim() returns false for a set bit, and
    // sets the others as it goes).
    let set: Vec<u64> = (0..1000u64).filter(|&i| !b.claim(i)).collect();
    let want: Vec<u64> = (3..8).chain(60..260).chain(999..1000).collect();
    assert_eq!(set, want);
    // Every bit is set now: overlaps name their first already-claimed bit.
    assert_eq!(b.claim_range(0, 4), Err(0));
    let c = AtomicBitmap::new(1000);
    c.claim_range(100, 100).unwrap();
    assert_eq!(c.claim_range(64, 64), Err(100));
    assert_eq!(c.claim_range(199, 2), Err(199));
    assert_eq!(c.claim_range(150, 1), Err(150));
    // A failed claim may have set bits of its own range (recovery stops there anyway).
    let d = AtomicBitmap::new(1000);
    d.claim_range(100, 100).unwrap();
    assert_eq!(d.claim_range(200, 800), Ok(()));
}

#[test]
fn recovery_after_crash_still_finds_every_block_and_file() {
    use ferrite_core::{Fs, MkfsOptions, MountOptions};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.pool");
    let m = MmapMedium::create(&path, 64 << 20, &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions::default()).unwrap();
    let data = vec![9u8; 3 << 20];
    for i in 0..5u32 {
        let ino = fs.create(fs.root(), format!("f{i}").as_bytes(), 0o644, 0, 0).unwrap().ino;
        fs.write(ino, 0, &data[..(i as usize + 1) * 300_000]).unwrap();
    }
    let used = fs.statfs().bfree;
    let fs = Fs::mount(fs.crash(), &MountOptions::default()).unwrap();
    assert!(!fs.mount_report().clean);
    assert_eq!(fs.statfs().bfree, used, "recovery must claim exactly the blocks in use");
    assert!(fs.fsck().unwrap().is_clean());
    for i in 0..5u32 {
        let ino = fs.lookup_ino(fs.root(), format!("f{i}").as_bytes()).unwrap();
        assert_eq!(fs.getattr(ino).unwrap().size, (i as u64 + 1) * 300_000);
    }
    fs.unmount().unwrap();
}
