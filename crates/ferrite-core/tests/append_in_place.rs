//! In-place appends (format version 7, `log::FLAG_TAIL`): an append of at least
//! `IN_PLACE_MIN` bytes by a file's only writer goes into the last page's block
//! past the end of file, with a one-page WRITE entry whose page checksum takes
//! the rest of the block as zero. Before, such appends were embedded in the log
//! and merged into a new block when their page filled: the data was written
//! twice, a 256 B append's entry was 312 bytes against 72 now, and thorough GC
//! took a tenth of a 256-byte append's time (perf).
mod common;
use common::*;
use ferrite_core::inspect::{ExtentKind, MapExtent};
use ferrite_core::*;

const PG: u64 = 4096;

fn data_extents(fs: &Fs<SimMedium>, ino: u64) -> Vec<MapExtent> {
    fs.bmap(ino).unwrap().into_iter().filter(|e| e.kind == ExtentKind::Data).collect()
}

/// The pool block that holds file page `pg`.
fn block_of(fs: &Fs<SimMedium>, ino: u64, pg: u64) -> u64 {
    let e = data_extents(fs, ino)
        .into_iter()
        .find(|e| (e.file_offset..e.file_offset + e.len).contains(&(pg * PG)))
        .expect("page mapped");
    (e.pool_offset + pg * PG - e.file_offset) / PG
}

/// (flushed bytes, non-temporal bytes, fences) stored by `f`.
fn stores(fs: &Fs<SimMedium>, f: impl FnOnce()) -> (u64, u64, u64) {
    let a = fs.medium().stats().snapshot();
    f();
    let b = fs.medium().stats().snapshot();
    (b.flushed_bytes - a.flushed_bytes, b.nt_bytes - a.nt_bytes, b.fences - a.fences)
}

/// A new file holding one whole page: runs start past a file's first page.
fn file_with_a_page(fs: &Fs<SimMedium>, name: &[u8]) -> (u64, Vec<u8>) {
    let f = fs.create(fs.root(), name, 0o644, 0, 0).unwrap().ino;
    let page = pattern(1000, 0, PG as usize);
    fs.write(f, 0, &page).unwrap();
    (f, page)
}

fn assert_data_clean(fs: &Fs<SimMedium>, ctx: &str) {
    let d = fs.check_data(&mut |_, _| {}).unwrap();
    assert!(d.findings.is_empty(), "{ctx}: {:?}", d.findings);
    assert_eq!(d.pages_unchecked, 0, "{ctx}: every page checksummed");
}

#[test]
fn appends_fill_one_block_per_page_with_one_fence_and_a_small_entry() {
    let fs = fresh_sim(32 << 20, 1);
    let (f, mut want) = file_with_a_page(&fs, b"log");
    let free0 = fs.statfs().bfree;
    let mut page_block = 0;
    for k in 0..3 * PG / 256 {
        let rec = pattern(k, 0, 256);
        let (flushed, nt, fences) = stores(&fs, || {
            assert_eq!(fs.append(f, &rec).unwrap(), PG + k * 256);
        });
        want.extend_from_slice(&rec);
        assert_eq!(fences, 1, "append {k}: one fence");
        if k % 16 != 0 {
            // The bytes, one 72-byte entry and the tail word: no page, no copy
            // of the data into the log.
            assert!(flushed + nt <= 256 + 2 * 64 + 64, "append {k}: {flushed} + {nt} bytes");
        }
        let pg = 1 + k * 256 / PG;
        if k % 16 == 0 {
            page_block = block_of(&fs, f, pg);
        }
        assert_eq!(block_of(&fs, f, pg), page_block, "page {pg} stays in its block");
    }
    assert_eq!(fs.read_all(f).unwrap(), want);
    // Three data blocks; the log pages on top (one page, or a few before GC).
    let used = free0 - fs.statfs().bfree;
    assert!((3..=6).contains(&used), "{used} blocks for 3 pages of appends");
    assert_eq!(data_extents(&fs, f).iter().map(|e| e.len).sum::<u64>(), 4 * PG);
    assert_data_clean(&fs, "after the appends");
    let fs = remount(fs, Remount::Clean);
    assert_eq!(fs.read_all(f).unwrap(), want);
    assert_data_clean(&fs, "after a remount");
}

#[test]
fn a_run_continues_in_its_block_across_gc_and_a_remount() {
    let fs = fresh_sim(32 << 20, 1);
    let (f, mut want) = file_with_a_page(&fs, b"r");
    let mut add = |fs: &Fs<SimMedium>, k: u64| {
        let rec = pattern(k, 0, 200);
        fs.append(f, &rec).unwrap();
        want.extend_from_slice(&rec);
    };
    add(&fs, 1);
    let b = block_of(&fs, f, 1);
    add(&fs, 2);
    fs.compact(f).unwrap();
    // In place: its 200 bytes and entry streamed, no page (an embedded append
    // streams nothing: its entry is cached and flushed).
    let (_, nt, _) = stores(&fs, || add(&fs, 3));
    assert!((200..PG).contains(&nt), "after GC the append is in place ({nt} bytes streamed)");
    assert_eq!(block_of(&fs, f, 1), b);
    let fs = remount(fs, Remount::Clean);
    let (_, nt, _) = stores(&fs, || add(&fs, 4));
    assert!((200..PG).contains(&nt), "after a remount the append is in place ({nt} streamed)");
    assert_eq!(block_of(&fs, f, 1), b);
    assert_eq!(fs.read_all(f).unwrap(), want);
    assert_data_clean(&fs, "after GC and a remount");
}

#[test]
fn recovery_clears_what_an_uncommitted_append_left_past_the_end() {
    let fs = fresh_sim(32 << 20, 1);
    let (f, mut want) = file_with_a_page(&fs, b"c");
    for k in 0..3 {
        let rec = pattern(k, 0, 300);
        fs.append(f, &rec).unwrap();
        want.extend_from_slice(&rec);
    }
    // The stores of a fourth append that crashed before its commit: its bytes
    // reached the block past the end of file, its entry and tail did not.
    let b = block_of(&fs, f, 1);
    fs.medium().write(b * PG + 900, &[0xA5; 300]);
    fs.medium().flush(b * PG + 900, 300);
    fs.medium().fence();
    let fs = remount(fs, Remount::CrashDurable);
    assert_eq!(fs.read_all(f).unwrap(), want);
    assert_data_clean(&fs, "after recovery");
    // Zeros show past the old end, not the torn bytes.
    fs.setattr(f, &SetAttr { size: Some(PG + 2000), ..Default::default() }).unwrap();
    want.resize(PG as usize + 2000, 0);
    assert_eq!(fs.read_all(f).unwrap(), want);
    assert_data_clean(&fs, "after a truncate up");
}

#[test]
fn a_torn_in_place_append_keeps_the_file_before_or_after_it() {
    let fs = fresh_sim(32 << 20, 1);
    let (f, mut first) = file_with_a_page(&fs, b"t");
    first.extend_from_slice(&pattern(1, 0, 1000));
    fs.append(f, &first[PG as usize..]).unwrap();
    let rec = pattern(2, 0, 700);
    let mut new = first.clone();
    new.extend_from_slice(&rec);
    assert_file_op_atomic(&fs, f, (&first, &new), 7, "in-place append", || {
        fs.append(f, &rec).map(drop)
    });
}

#[test]
fn a_reflink_or_a_truncate_ends_the_run() {
    let fs = fresh_sim(32 << 20, 1);
    let (a, page) = file_with_a_page(&fs, b"a");
    let c = fs.create(fs.root(), b"c", 0o644, 0, 0).unwrap().ino;
    fs.append(a, &pattern(1, 0, 1000)).unwrap();
    let b = block_of(&fs, a, 1);
    fs.clone_range(a, 0, c, 0, 0).unwrap();
    assert_eq!(block_of(&fs, c, 1), b, "the clone shares the block");
    // The source's next append may not write into the shared block.
    fs.append(a, &pattern(2, 0, 500)).unwrap();
    let mut want_c = page.clone();
    want_c.extend_from_slice(&pattern(1, 0, 1000));
    assert_eq!(fs.read_all(c).unwrap(), want_c);
    fs.setattr(c, &SetAttr { size: Some(PG + 3000), ..Default::default() }).unwrap();
    want_c.resize(PG as usize + 3000, 0);
    assert_eq!(fs.read_all(c).unwrap(), want_c, "the clone's bytes past its end are zeros");
    let mut want_a = page.clone();
    want_a.extend_from_slice(&pattern(1, 0, 1000));
    want_a.extend_from_slice(&pattern(2, 0, 500));
    assert_eq!(fs.read_all(a).unwrap(), want_a);
    // Truncated down into the run's page, then appended: the bytes between read
    // as the zeros the truncate left.
    let (d, mut want_d) = file_with_a_page(&fs, b"d");
    fs.append(d, &pattern(3, 0, 2000)).unwrap();
    fs.setattr(d, &SetAttr { size: Some(PG + 1500), ..Default::default() }).unwrap();
    fs.setattr(d, &SetAttr { size: Some(PG + 1800), ..Default::default() }).unwrap();
    fs.append(d, &pattern(4, 0, 300)).unwrap();
    want_d.extend_from_slice(&pattern(3, 0, 1500));
    want_d.resize(PG as usize + 1800, 0);
    want_d.extend_from_slice(&pattern(4, 0, 300));
    assert_eq!(fs.read_all(d).unwrap(), want_d);
    assert_data_clean(&fs, "after the clone and truncates");
    assert_fsck_clean(&fs, "after the clone and truncates");
    let fs = remount(fs, Remount::CrashCurrent);
    assert_eq!(fs.read_all(a).unwrap(), want_a);
    assert_eq!(fs.read_all(c).unwrap(), want_c);
    assert_eq!(fs.read_all(d).unwrap(), want_d);
    assert_data_clean(&fs, "after a crash");
}

#[test]
fn an_append_whose_commit_fails_leaves_zeros_past_the_end() {
    // Regression: the bytes of an in-place append whose commit failed (no block for
    // the log's next page) stayed in the block past the end of file, where a later
    // truncate up showed them and the page's checksum no longer matched.
    let fs = fresh_sim(16 << 20, 1);
    let (f, page) = file_with_a_page(&fs, b"f");
    // The log's page nearly full (SETATTR entries), so that the appends need its next.
    for k in 0..30 {
        fs.setattr(f, &SetAttr { perm: Some(0o600 + k % 2), ..Default::default() }).unwrap();
    }
    let mut want = page;
    want.extend_from_slice(&pattern(0, 0, 200));
    fs.append(f, &want[PG as usize..]).unwrap();
    let filler = fs.create(fs.root(), b"filler", 0o644, 0, 0).unwrap().ino;
    let mut off = 0;
    while fs.write(filler, off, &[7u8; PG as usize]).is_ok() {
        off += PG;
    }
    let mut failed = false;
    for k in 1..PG / 200 {
        let rec = pattern(k, 0, 200);
        match fs.append(f, &rec) {
            Ok(_) => want.extend_from_slice(&rec),
            Err(e) => {
                assert_eq!(e.errno(), libc::ENOSPC, "{e}");
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the log ran out of room for its next page");
    assert_eq!(fs.read_all(f).unwrap(), want);
    assert_data_clean(&fs, "after the failed append");
    fs.unlink(fs.root(), b"filler").unwrap();
    fs.setattr(f, &SetAttr { size: Some(2 * PG), ..Default::default() }).unwrap();
    want.resize(2 * PG as usize, 0);
    assert_eq!(fs.read_all(f).unwrap(), want, "zeros past the old end");
}

#[test]
fn appends_that_cross_a_page_end_keep_the_runs_going() {
    // Regression: an append crossing a page end was embedded in the log whole, and
    // every later append to the new page too (no run to continue): records whose
    // size does not divide 4096 went in place only on their first page.
    let fs = fresh_sim(32 << 20, 1);
    let (f, mut want) = file_with_a_page(&fs, b"rec");
    let mut big = 0;
    for k in 0..40u64 {
        let rec = pattern(k, 0, 300);
        let (flushed, nt, fences) = stores(&fs, || {
            fs.append(f, &rec).unwrap();
        });
        assert_eq!(fences, 1, "append {k}: one fence");
        let starts_page = (want.len() as u64 + 300).div_ceil(PG) > (want.len() as u64).div_ceil(PG)
            || (want.len() as u64).is_multiple_of(PG);
        want.extend_from_slice(&rec);
        if starts_page {
            big += 1;
        } else {
            assert!(flushed + nt <= 300 + 2 * 64 + 64, "append {k}: {flushed} + {nt} bytes");
        }
    }
    assert!(big <= 4, "{big} appends wrote more than their bytes and entry");
    assert_eq!(fs.read_all(f).unwrap(), want);
    assert_data_clean(&fs, "after the appends");
    // A crossing append is atomic at every fence.
    let old = want.clone();
    let rec = pattern(99, 0, 4000);
    want.extend_from_slice(&rec);
    assert_file_op_atomic(&fs, f, (&old, &want), 9, "an append across a page end", || {
        fs.append(f, &rec).map(drop)
    });
    let fs = remount(fs, Remount::CrashCurrent);
    assert_eq!(fs.read_all(f).unwrap(), want);
    assert_data_clean(&fs, "after a crash");
}

/// 64-byte records (the minimum) across many pages, through thorough GC and a
/// crash: the data, its checksums and fsck stay clean. (How a run's entries count
/// against their log pages is pinned by a unit test in `index.rs`: fsck's replay
/// uses the same `apply`, so it cannot tell.)
#[test]
fn records_of_64_bytes_stay_whole_through_gc_and_a_crash() {
    let fs = fresh_sim(32 << 20, 1);
    let (f, mut want) = file_with_a_page(&fs, b"small");
    let runs = || fs.gc_stats().thorough_runs.load(std::sync::atomic::Ordering::Relaxed);
    let runs0 = runs();
    for k in 0..1500u64 {
        let rec = pattern(k, 7, 64);
        assert_eq!(fs.append(f, &rec).unwrap(), PG + k * 64);
        want.extend_from_slice(&rec);
    }
    assert!(runs() > runs0, "thorough GC compacted the log of the appends");
    assert_eq!(fs.read_all(f).unwrap(), want);
    assert_fsck_clean(&fs, "after 1,500 appends of 64 bytes");
    assert_data_clean(&fs, "after 1,500 appends of 64 bytes");
    let fs = remount(fs, Remount::CrashDurable);
    assert_eq!(fs.read_all(f).unwrap(), want);
    assert_fsck_clean(&fs, "after a crash");
    assert_data_clean(&fs, "after a crash");
}
