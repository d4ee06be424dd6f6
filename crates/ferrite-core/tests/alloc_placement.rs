//! Block placement: log pages come from the top of the free space, file data from
//! the bottom, so a file written in order (small appends included) lies in
//! consecutive blocks, and log GC maps each such run with one entry. Before this, log pages took the lowest
//! free blocks like data: a file built from 256-byte appends had one run and one
//! live WRITE entry per page, and every thorough GC rewrote all of them (a quarter
//! of a 256-byte append's time in a perf profile of `examples/write_profile`).
mod common;
use common::*;
use ferrite_core::inspect::{ExtentKind, MapExtent};
use ferrite_core::*;

const PG: u64 = 4096;

fn data_extents(fs: &Fs<SimMedium>, ino: u64) -> Vec<MapExtent> {
    fs.bmap(ino).unwrap().into_iter().filter(|e| e.kind == ExtentKind::Data).collect()
}

/// Do the extents lie back to back in the pool, in file order?
fn consecutive(ext: &[MapExtent]) -> bool {
    ext.windows(2).all(|w| {
        w[0].file_offset + w[0].len == w[1].file_offset
            && w[0].pool_offset + w[0].len == w[1].pool_offset
    })
}

#[test]
fn small_appends_lie_in_one_run_that_gc_maps_with_one_entry() {
    let fs = fresh_sim(64 << 20, 2);
    let f = fs.create(fs.root(), b"log", 0o644, 0, 0).unwrap().ino;
    let pages = 96u64;
    let mut want = Vec::new();
    for k in 0..pages * PG / 256 {
        let rec = pattern(k, 0, 256);
        assert_eq!(fs.append(f, &rec).unwrap(), k * 256);
        want.extend_from_slice(&rec);
    }
    let ext = data_extents(&fs, f);
    assert_eq!(ext.iter().map(|e| e.len).sum::<u64>(), pages * PG);
    assert!(consecutive(&ext), "appended pages in consecutive blocks: {ext:?}");
    // Log pages were taken from the top: above every data block.
    let owners = fs.block_owners();
    let top_data = owners.iter().filter(|r| r.owner == "data").map(|r| r.start + r.len).max();
    let low_log = owners.iter().filter(|r| r.owner == "log" && r.ino == Some(f)).map(|r| r.start);
    assert!(low_log.min().unwrap() >= top_data.unwrap(), "logs apart from data: {owners:?}");
    fs.compact(f).unwrap();
    let ext = data_extents(&fs, f);
    assert_eq!(ext.len(), 1, "one run after GC: {ext:?}");
    assert_eq!(fs.log_pages(f).unwrap(), 1, "one entry for the run, one log page");
    let mut got = vec![0u8; want.len()];
    assert_eq!(fs.read(f, 0, &mut got).unwrap(), want.len());
    assert!(got == want, "content after GC");
    // An overwrite in the middle splits the run and frees exactly its page.
    let free = fs.statfs().bfree;
    fs.write(f, 40 * PG, &pattern(9, 0, PG as usize)).unwrap();
    assert_eq!(data_extents(&fs, f).len(), 3);
    assert_eq!(fs.statfs().bfree, free, "one block in, one block out");
    want[40 * PG as usize..41 * PG as usize].copy_from_slice(&pattern(9, 0, PG as usize));
    fs.compact(f).unwrap();
    fs.read(f, 0, &mut got).unwrap();
    assert!(got == want, "content after the overwrite and GC");
    assert_fsck_clean(&fs, "after placed appends");
    // The merged entries carry every page's checksum: recovery replays them and
    // reads verify after a crash and after a clean remount.
    let mut fs = fs;
    for how in [Remount::CrashDurable, Remount::Clean] {
        fs = remount(fs, how);
        let mut got = vec![0u8; want.len()];
        fs.read(f, 0, &mut got).unwrap();
        assert!(got == want, "content after {how:?}");
        assert!(data_extents(&fs, f).len() <= 3, "runs after {how:?}");
    }
}
