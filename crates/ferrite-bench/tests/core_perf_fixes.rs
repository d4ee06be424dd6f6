//! Regression tests for two ferrite-core performance bugs found by `ferrite bench`.
//!
//! 1. `MmapMedium` counted every flush and non-temporal copy with a locked
//!    `fetch_add` on a shared counter. A locked read-modify-write issued right after
//!    clwb / non-temporal stores waits for them to complete (it orders like a fence),
//!    so every flush became a synchronous write-back (a third of the time of a
//!    `create`). Counting moved to a thread-local tally folded into the shared counters
//!    at the thread's next fence and at thread exit; these tests check the counts stay
//!    exact.
//! 2. `InodeAlloc::alloc` scanned the whole bitmap of a full shard on every allocation
//!    before moving to the next shard (a quarter of the time of a `create` once the
//!    calling thread's shard had filled). Full shards are now skipped by a per-shard
//!    free count; these tests check allocation order and reuse are unchanged.

use ferrite_core::alloc::{Bitmap, InodeAlloc};
use ferrite_core::layout::Geometry;
use ferrite_core::{MapOptions, Medium, MmapMedium};

#[test]
fn persist_counters_exact_across_threads_and_fences() {
    let dir = tempfile::tempdir().unwrap();
    let m =
        MmapMedium::create(&dir.path().join("c.pool"), 1 << 20, &MapOptions::default()).unwrap();
    let base = m.stats().snapshot();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let m = &m;
            s.spawn(move || {
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
            });
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
    a.free(shard0[17]);
    assert_eq!(a.alloc(0).unwrap(), shard0[17]);
    // Exhaustion is ENOSPC, and the free count is right.
    let mut n = 0;
    while a.alloc(1).is_ok() {
        n += 1;
    }
    assert_eq!(n, per - 1);
    assert_eq!(a.free_inodes(), 0);
    a.free(next);
    assert_eq!(a.free_inodes(), 1);
    assert_eq!(a.alloc(0).unwrap(), next);
}
