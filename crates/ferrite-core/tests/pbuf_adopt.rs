//! Persistent user buffers (issue 13, Libpubl's idea made zero-copy): a buffer's
//! whole pages that line up with file pages become the file's without a copy, the
//! edges are copied, all in one commit; the buffer gets fresh blocks at once; a
//! crash shows the whole write or none of it, and no buffer outlives a crash or an
//! unmount.
mod common;
use common::*;
use ferrite_core::*;

const MB: u64 = 1 << 20;
const PG: u64 = 4096;

/// Stores of `data` into buffer `id` from byte `at` (the program's plain stores,
/// not flushed).
fn fill(fs: &Fs<SimMedium>, id: u64, at: u64, data: &[u8]) {
    let blocks = fs.pbuf_blocks(id).unwrap();
    for (k, chunk) in data.chunks(1).enumerate() {
        let b = at + k as u64;
        fs.medium().write(blocks[(b / PG) as usize] * PG + b % PG, chunk);
    }
}

fn file(fs: &Fs<SimMedium>, name: &[u8], content: &[u8]) -> u64 {
    let f = fs.create(fs.root(), name, 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, content).unwrap();
    f
}

#[test]
fn aligned_pages_are_adopted_without_a_copy_and_the_buffer_is_fresh() {
    let fs = fresh_sim(64 * MB, 1);
    let old = pattern(1, 0, (20 * PG) as usize);
    let f = file(&fs, b"f", &old);
    let (id, blocks0) = fs.pbuf_alloc(17).unwrap();
    // 16 pages and a bit, at a file offset with the same in-page offset.
    let data = pattern(2, 0, (16 * PG + 700) as usize);
    fill(&fs, id, 300, &data);
    let before = fs.medium().stats().snapshot();
    let replaced = fs.pbuf_write(f, 2 * PG + 300, id, 300, data.len() as u64).unwrap();
    let after = fs.medium().stats().snapshot();
    let mut want = old.clone();
    let at = (2 * PG + 300) as usize;
    want[at..at + data.len()].copy_from_slice(&data);
    assert!(fs.read_all(f).unwrap() == want, "the file has the buffer's bytes");
    // 15 whole pages adopted (pages 3..18 of the file), two edge pages copied.
    assert_eq!(replaced.len(), 15);
    assert!(
        after.nt_bytes - before.nt_bytes <= 2 * PG,
        "copied {} bytes: only the edges may be copied",
        after.nt_bytes - before.nt_bytes
    );
    let blocks1 = fs.pbuf_blocks(id).unwrap();
    for &(k, b) in &replaced {
        assert_ne!(blocks0[k], b, "buffer page {k} got a fresh block");
        assert_eq!(blocks1[k], b);
    }
    // Reusing the buffer changes nothing in the file.
    fill(&fs, id, 0, &vec![0xee; (17 * PG) as usize]);
    assert!(fs.read_all(f).unwrap() == want);
    fs.pbuf_free(id).unwrap();
    assert_fsck_clean(&fs, "after an adopting write");
    let fs = remount(fs, Remount::Clean);
    assert!(fs.read_all(f).unwrap() == want, "and after a remount");
}

#[test]
fn misaligned_or_small_writes_copy_and_errors_change_nothing() {
    let fs = fresh_sim(64 * MB, 1);
    let f = file(&fs, b"f", &pattern(1, 0, (4 * PG) as usize));
    let (id, _) = fs.pbuf_alloc(4).unwrap();
    let data = pattern(3, 0, (3 * PG) as usize);
    fill(&fs, id, 0, &data);
    // Offsets that differ within a page: nothing lines up, all is copied.
    assert!(fs.pbuf_write(f, 100, id, 0, data.len() as u64).unwrap().is_empty());
    let got = fs.read_all(f).unwrap();
    assert!(got[100..100 + data.len()] == data[..]);
    assert_eq!(errno(&fs.pbuf_write(f, 0, id, PG, 4 * PG)), libc::EINVAL, "past the buffer");
    assert_eq!(errno(&fs.pbuf_write(f, 0, 99, 0, 1)), libc::EBADF, "no such buffer");
    assert_eq!(errno(&fs.pbuf_write(fs.root(), 0, id, 0, 1)), libc::EISDIR);
    assert!(fs.read_all(f).unwrap() == got);
    assert_eq!(errno(&fs.pbuf_free(99)), libc::EBADF);
    assert_fsck_clean(&fs, "with a live buffer");
}

#[test]
fn buffers_do_not_outlive_an_unmount_or_a_crash() {
    let fs = fresh_sim(64 * MB, 1);
    let free0 = fs.statfs().bfree;
    let (_id, _) = fs.pbuf_alloc(100).unwrap();
    assert!(fs.statfs().bfree <= free0 - 100);
    let fs = remount(fs, Remount::Clean);
    assert_eq!(fs.statfs().bfree, free0, "a clean unmount frees buffers");
    let (_id, _) = fs.pbuf_alloc(100).unwrap();
    let fs = remount(fs, Remount::CrashDurable);
    assert_eq!(fs.statfs().bfree, free0, "recovery frees buffers");
    assert_fsck_clean(&fs, "after a crash with a live buffer");
}

#[test]
fn a_buffer_write_is_all_or_nothing_at_every_crash_point() {
    let fs = fresh_sim(64 * MB, 1);
    let old = pattern(1, 0, (10 * PG) as usize);
    let f = file(&fs, b"f", &old);
    let (id, _) = fs.pbuf_alloc(9).unwrap();
    let data = pattern(4, 0, (8 * PG + 100) as usize);
    fill(&fs, id, 50, &data);
    let (r, points) = record_fences(&fs, || fs.pbuf_write(f, PG + 50, id, 50, data.len() as u64));
    r.unwrap();
    let mut new = old.clone();
    new[(PG + 50) as usize..(PG + 50) as usize + data.len()].copy_from_slice(&data);
    assert!(fs.read_all(f).unwrap() == new);
    assert_eq!(points.len(), 1, "one fence: checksummed pages, one tail store");
    let mut seen = std::collections::BTreeSet::new();
    for_each_crash_image(&points, 40, 17, |k, c| {
        let got = c.read_all(f).unwrap();
        assert!(got == old || got == new, "crash {k}: neither before nor after the write");
        seen.insert(got == new);
        assert_fsck_clean(&c, "after a crash inside a buffer write");
    });
    assert!(seen.contains(&true) && seen.contains(&false), "both outcomes: {seen:?}");
}

#[test]
fn one_write_at_a_time_per_buffer() {
    // Two writes from one buffer at once would adopt the same blocks into two
    // files; the second gets EBUSY instead.
    let fs = fresh_sim(64 * MB, 2);
    let a = file(&fs, b"a", b"");
    let b = file(&fs, b"b", b"");
    let (id, _) = fs.pbuf_alloc(4).unwrap();
    let busy = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for f in [a, b] {
            let (fs, busy) = (&fs, &busy);
            s.spawn(move || {
                for k in 0..2000u64 {
                    match fs.pbuf_write(f, (k % 8) * 4 * PG, id, 0, 4 * PG) {
                        Ok(_) => {}
                        Err(Error::Busy) => {
                            busy.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) => panic!("buffer write: {e}"),
                    }
                }
            });
        }
    });
    fs.pbuf_free(id).unwrap();
    assert_fsck_clean(&fs, "after concurrent writes from one buffer");
}
