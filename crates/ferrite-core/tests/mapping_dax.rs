//! DAX pins (the core side of DAX-mmap): a pinned range's pages are whole blocks
//! without checksums, stores into them are the file's content (and survive a
//! crash once flushed and fenced), writes to a pinned file go in place, and nothing
//! frees a pinned block. Crash images of every fence of a pin and of an in-place
//! write mount to the content before or after.
mod common;
use common::*;
use ferrite_core::*;

const MB: u64 = 1 << 20;
const PG: u64 = 4096;

fn file(fs: &Fs<SimMedium>, name: &[u8]) -> u64 {
    fs.create(fs.root(), name, 0o644, 0, 0).unwrap().ino
}

/// A file mixing copy-on-write pages, data embedded in the log, a hole and a
/// partial last page.
fn mixed(fs: &Fs<SimMedium>) -> (u64, Vec<u8>) {
    let f = file(fs, b"mixed");
    fs.write(f, 0, &pattern(1, 0, 2 * PG as usize)).unwrap();
    fs.write(f, 100, &pattern(2, 100, 60)).unwrap(); // embedded over a block
    fs.write(f, 4 * PG + 10, &pattern(3, 0, 300)).unwrap(); // a hole before it
    fs.write(f, 5 * PG, &pattern(4, 0, 1000)).unwrap(); // partial last page
    let want = fs.read_all(f).unwrap();
    assert_eq!(want.len() as u64, 5 * PG + 1000);
    (f, want)
}

/// The bytes of the file as the runs map them (what a mapping shows).
fn through_runs(fs: &Fs<SimMedium>, runs: &DaxRuns, pages: u64) -> Vec<u8> {
    let mut out = vec![0u8; (pages * PG) as usize];
    let mut covered = 0;
    for &(pg, blk, n) in runs {
        for k in 0..n {
            let at = ((pg + k) * PG) as usize;
            fs.medium().read((blk + k) * PG, &mut out[at..at + PG as usize]);
            covered += 1;
        }
    }
    assert_eq!(covered, pages, "every page below the end of file is mapped");
    out
}

fn store(fs: &Fs<SimMedium>, runs: &DaxRuns, off: u64, data: &[u8]) {
    let pg = off / PG;
    let &(p0, b0, _) = runs.iter().find(|&&(p, _, n)| p <= pg && pg < p + n).unwrap();
    let at = (b0 + pg - p0) * PG + off % PG;
    assert!(off % PG + data.len() as u64 <= PG);
    fs.medium().write(at, data);
    fs.medium().flush(at, data.len() as u64);
    fs.medium().fence();
}

#[test]
fn a_pin_maps_every_page_below_the_end_with_its_content() {
    let fs = fresh_sim(32 * MB, 1);
    let (f, want) = mixed(&fs);
    let runs = fs.dax_pin(f, 0, 8 * PG).unwrap();
    let seen = through_runs(&fs, &runs, 6);
    assert!(seen[..want.len()] == want[..], "the mapping shows the file");
    assert!(seen[want.len()..].iter().all(|&b| b == 0), "past the end of file: zeros");
    assert!(fs.read_all(f).unwrap() == want, "a pin changes no byte");
    assert!(fs.dax_pinned(f).unwrap());
    // A second pin of the same range copies nothing: the pages are DAX pages.
    let again = fs.dax_pin(f, 0, 6 * PG).unwrap();
    assert_eq!(again, runs);
    fs.dax_unpin(f).unwrap();
    fs.dax_unpin(f).unwrap();
    assert!(!fs.dax_pinned(f).unwrap());
    assert_eq!(errno(&fs.dax_unpin(f)), libc::EBADF, "an unpin without a pin");
    assert_fsck_clean(&fs, "after pins");
}

#[test]
fn stores_through_the_mapping_are_the_file_and_survive_a_crash() {
    let fs = fresh_sim(32 * MB, 1);
    let (f, mut want) = mixed(&fs);
    let runs = fs.dax_pin(f, 0, 6 * PG).unwrap();
    store(&fs, &runs, 64, b"through the mapping");
    store(&fs, &runs, 4 * PG + 4000, &[7u8; 96]);
    want[64..83].copy_from_slice(b"through the mapping");
    want[4 * PG as usize + 4000..4 * PG as usize + 4096].fill(7);
    assert!(fs.read_all(f).unwrap() == want, "a read sees the stores");
    // A crash with the mapping live: recovery keeps the pages (no checksum to fail).
    let c = remount(fs, Remount::CrashDurable);
    assert!(c.read_all(f).unwrap() == want, "the stores survive the crash");
    assert!(!c.dax_pinned(f).unwrap(), "pins are not persistent");
    // Normal writes after the pin ends copy on write again, with checksums.
    c.write(f, 0, &[9u8; 4096]).unwrap();
    want[..4096].fill(9);
    assert!(c.read_all(f).unwrap() == want);
    let rep = c.check_data(&mut |_, _| {}).unwrap();
    assert!(rep.findings.is_empty(), "scrub finds nothing wrong: {:?}", rep.findings);
    assert_eq!(rep.pages_unchecked, 5, "the other DAX pages carry no checksum");
}

#[test]
fn writes_to_a_pinned_file_go_in_place_and_nothing_frees_its_blocks() {
    let fs = fresh_sim(32 * MB, 1);
    let (f, mut want) = mixed(&fs);
    let runs = fs.dax_pin(f, 0, 6 * PG).unwrap();
    // In place, in DAX pages (one spanning two pages, one small, one past the end).
    let big = pattern(9, 0, 6000);
    fs.write(f, 3000, &big).unwrap();
    want[3000..9000].copy_from_slice(&big);
    fs.write(f, 5 * PG + 2000, b"grow").unwrap(); // past the end, inside the last page
    want.resize(5 * PG as usize + 2000, 0);
    want.extend_from_slice(b"grow");
    fs.write(f, 8 * PG, b"beyond").unwrap(); // beyond every DAX page: copy-on-write
    want.resize(8 * PG as usize, 0);
    want.extend_from_slice(b"beyond");
    assert!(fs.read_all(f).unwrap() == want);
    assert_eq!(fs.getattr(f).unwrap().size, want.len() as u64);
    assert!(through_runs(&fs, &runs, 6)[..] == want[..6 * PG as usize], "the mapping sees them");
    assert_eq!(fs.dax_pin(f, 0, 6 * PG).unwrap(), runs, "no page moved");
    fs.dax_unpin(f).unwrap();
    // Nothing that would free a pinned block runs.
    let shrink = SetAttr { size: Some(100), ..Default::default() };
    assert!(matches!(fs.setattr(f, &shrink), Err(Error::DaxMapped)));
    let punch = FallocMode {
        keep_size: true,
        punch_hole: true,
        zero_range: false,
        shift: None,
        unshare: false,
    };
    assert!(matches!(fs.fallocate(f, punch, 0, PG), Err(Error::DaxMapped)));
    let zero = FallocMode {
        keep_size: false,
        punch_hole: false,
        zero_range: true,
        shift: None,
        unshare: false,
    };
    assert!(matches!(fs.fallocate(f, zero, 0, PG), Err(Error::DaxMapped)));
    assert_eq!(errno(&fs.setattr(f, &shrink)), libc::EBUSY);
    let grow = SetAttr { size: Some(20 * PG), ..Default::default() };
    fs.setattr(f, &grow).unwrap();
    // An unlinked pinned file lives on until its pin ends.
    fs.unlink(fs.root(), b"mixed").unwrap();
    fs.write(f, 0, b"still here").unwrap();
    assert_eq!(&fs.read_all(f).unwrap()[..10], b"still here");
    fs.dax_unpin(f).unwrap();
    assert_eq!(errno(&fs.getattr(f)), libc::ENOENT, "freed with its last pin");
    assert_fsck_clean(&fs, "after the pinned file's end");
}

#[test]
fn a_pin_is_refused_cleanly() {
    let fs = fresh_sim(32 * MB, 1);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    assert_eq!(errno(&fs.dax_pin(d, 0, PG)), libc::EISDIR);
    let f = file(&fs, b"f");
    assert_eq!(errno(&fs.dax_pin(f, 100, PG)), libc::EINVAL, "unaligned offset");
    assert_eq!(errno(&fs.dax_pin(f, 0, 0)), libc::EINVAL, "empty");
    assert_eq!(errno(&fs.dax_pin(f, 1 << 62, 1 << 62)), libc::EFBIG);
    assert_eq!(errno(&fs.dax_pin(999, 0, PG)), libc::ENOENT);
    assert_eq!(fs.dax_pin(f, 0, PG).unwrap(), vec![], "an empty file has no page to map");
    assert!(!fs.dax_pinned(d).unwrap());
    fs.dax_unpin(f).unwrap();
    assert_eq!(fs.open_count(f), 0, "every refused pin gave its handle back");
}

#[test]
fn a_pin_that_runs_out_of_space_loses_nothing() {
    let fs = fresh_sim(8 * MB, 1);
    let f = file(&fs, b"f");
    let mut n = 0u64;
    // Data embedded in the log: every page needs a block to become a DAX page.
    while fs.write(f, n * PG, b"x").is_ok() {
        n += 1;
    }
    let want = fs.read_all(f).unwrap();
    let r = fs.dax_pin(f, 0, n * PG);
    assert_eq!(errno(&r), libc::ENOSPC);
    assert!(!fs.dax_pinned(f).unwrap(), "a failed pin leaves no pin");
    assert!(fs.read_all(f).unwrap() == want, "nothing lost");
    assert_fsck_clean(&fs, "after a pin that ran out of space");
}

/// Regression: a pin of a sparse file whose holes need more blocks than the pool has
/// gave the holes blocks batch by batch until the allocator ran dry, so the failed
/// pin left the pool full of them (Python's test_mmap mapped a 2 GiB sparse file in a
/// 512 MiB pool: every later write failed with ENOSPC until the file was released).
/// A pin now takes blocks for all of its holes, or none.
#[test]
fn a_pin_too_large_for_the_pool_takes_no_blocks() {
    let fs = fresh_sim(8 * MB, 1);
    let f = file(&fs, b"sparse");
    fs.write(f, 64 * MB, b"tail").unwrap();
    let before = fs.statfs().bfree;
    let r = fs.dax_pin(f, 0, 64 * MB + PG);
    assert_eq!(errno(&r), libc::ENOSPC);
    assert_eq!(fs.statfs().bfree, before, "a failed pin took no blocks");
    assert!(!fs.dax_pinned(f).unwrap(), "a failed pin leaves no pin");
    assert_fsck_clean(&fs, "after a pin too large for the pool");
}

/// Crash images of every fence of a pin (its materializing commit) and of an in-place
/// write: the pin changes no byte; the write is old or new in each of its pages.
#[test]
fn crashes_inside_a_pin_and_an_in_place_write() {
    let fs = fresh_sim(32 * MB, 1);
    let (f, want) = mixed(&fs);
    let (r, points) = record_fences(&fs, || fs.dax_pin(f, 0, 6 * PG));
    let runs = r.unwrap();
    assert_eq!(points.len(), 2, "data fence, then the tail's");
    for_each_crash_image(&points, 20, 11, |k, c| {
        assert!(c.read_all(f).unwrap() == want, "crash {k} inside a pin changed the file");
        assert_fsck_clean(&c, "after a crash inside a pin");
    });
    let data = pattern(5, 0, 5000);
    let (r, points) = record_fences(&fs, || fs.write(f, 2 * PG + 100, &data));
    r.unwrap();
    let mut new = want.clone();
    new[2 * PG as usize + 100..2 * PG as usize + 5100].copy_from_slice(&data);
    assert!(through_runs(&fs, &runs, 6)[..want.len()] == new[..]);
    let mut seen = std::collections::BTreeSet::new();
    for_each_crash_image(&points, 20, 12, |k, c| {
        let got = c.read_all(f).unwrap();
        assert_eq!(got.len(), want.len(), "crash {k}: size");
        // Each byte is old or new (in place: no atomicity across a page's lines).
        for (j, (&g, (&o, &n))) in got.iter().zip(want.iter().zip(&new)).enumerate() {
            assert!(g == o || g == n, "crash {k}: byte {j} is neither old nor new");
        }
        seen.insert(got == new);
        assert_fsck_clean(&c, "after a crash inside an in-place write");
    });
    assert!(seen.contains(&true), "the new content is reached");
}

#[test]
fn a_pinned_file_grows_by_dax_pages_that_later_pins_take_as_they_are() {
    let fs = fresh_sim(32 * MB, 1);
    let f = file(&fs, b"grow");
    fs.write(f, 0, &pattern(1, 0, PG as usize)).unwrap();
    assert_eq!(fs.dax_pin(f, 0, PG).unwrap().len(), 1);
    fs.fallocate(f, FallocMode::default(), 0, 64 * PG).unwrap();
    // The growth's pages need no copy to be mapped: pinning them writes no data.
    let before = fs.medium().stats().snapshot();
    let runs = fs.dax_pin(f, 0, 64 * PG).unwrap();
    let after = fs.medium().stats().snapshot();
    assert_eq!(runs.iter().map(|r| r.2).sum::<u64>(), 64);
    assert!(
        after.nt_bytes - before.nt_bytes < PG,
        "pinning fallocated pages of a pinned file copied {} bytes",
        after.nt_bytes - before.nt_bytes
    );
    // Unpinned, a file's fallocated pages carry checksums: a pin copies them.
    let g = file(&fs, b"plain");
    fs.fallocate(g, FallocMode::default(), 0, 16 * PG).unwrap();
    let before = fs.medium().stats().snapshot();
    fs.dax_pin(g, 0, 16 * PG).unwrap();
    let after = fs.medium().stats().snapshot();
    assert!(after.nt_bytes - before.nt_bytes >= 16 * PG);
    for ino in [f, f, g] {
        fs.dax_unpin(ino).unwrap();
    }
    assert_eq!(fs.read_all(f).unwrap()[..PG as usize], pattern(1, 0, PG as usize)[..]);
    assert_fsck_clean(&fs, "after growth under a pin");
}

#[test]
fn an_atomic_page_write_is_all_or_nothing_at_every_crash_point() {
    let fs = fresh_sim(32 * MB, 1);
    let (f, want) = mixed(&fs);
    let pages: Vec<(u64, Vec<u8>)> =
        [0u64, 1, 3, 5].iter().map(|&pg| (pg, pattern(9 + pg, 0, PG as usize))).collect();
    let refs: Vec<(u64, &[u8])> = pages.iter().map(|(p, d)| (*p, &d[..])).collect();
    let mut new = want.clone();
    for (pg, d) in &pages {
        let at = (*pg * PG) as usize;
        let n = (new.len() - at).min(PG as usize);
        new[at..at + n].copy_from_slice(&d[..n]);
    }
    let (r, points) = record_fences(&fs, || fs.write_pages_atomic(f, &refs));
    r.unwrap();
    assert_eq!(points.len(), 1, "one fence: checksummed pages, one tail store");
    assert!(fs.read_all(f).unwrap() == new);
    let mut seen = std::collections::BTreeSet::new();
    for_each_crash_image(&points, 40, 13, |k, c| {
        let got = c.read_all(f).unwrap();
        assert!(got == want || got == new, "crash {k}: neither before nor after");
        seen.insert(got == new);
        assert_fsck_clean(&c, "after a crash inside an atomic page write");
    });
    assert!(seen.contains(&false) && seen.contains(&true), "both outcomes reached: {seen:?}");
    // Refusals leave the file as it was.
    let page = vec![1u8; PG as usize];
    assert_eq!(errno(&fs.write_pages_atomic(f, &[(6, &page[..])])), libc::EINVAL, "past EOF");
    assert_eq!(
        errno(&fs.write_pages_atomic(f, &[(1, &page[..]), (0, &page[..])])),
        libc::EINVAL,
        "not ascending"
    );
    assert_eq!(errno(&fs.write_pages_atomic(f, &[(0, &page[..10])])), libc::EINVAL);
    fs.dax_pin(f, 0, PG).unwrap();
    assert_eq!(errno(&fs.write_pages_atomic(f, &[(0, &page[..])])), libc::EBUSY, "DAX-mapped");
    fs.dax_unpin(f).unwrap();
    assert!(fs.read_all(f).unwrap() == new);
    assert_fsck_clean(&fs, "after refused atomic writes");
}
