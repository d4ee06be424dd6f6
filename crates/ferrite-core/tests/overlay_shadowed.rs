//! A page whose op list is full first drops the overlays that later ones cover whole
//! (their log entries die), so a range rewritten in place never makes its page merge
//! into a new block, and a page's distinct rewritten lines count towards its merge
//! once each. The page reads the same, before and after a remount and a crash.

mod common;

use common::*;
use ferrite_core::inspect::ExtentKind;
use ferrite_core::*;

const MB: u64 = 1 << 20;

/// (pool bytes written: flushed + streamed, blocks taken) by `f`.
fn cost(fs: &Fs<SimMedium>, f: impl FnOnce()) -> (u64, u64) {
    let (a, free) = (fs.medium().stats().snapshot(), fs.statfs().bfree);
    f();
    let b = fs.medium().stats().snapshot();
    let bytes = (b.flushed_bytes - a.flushed_bytes) + (b.nt_bytes - a.nt_bytes);
    (bytes, free.saturating_sub(fs.statfs().bfree))
}

/// Page `pg`'s data block (pool offset) and how many embedded pieces overlay it.
fn page_map(fs: &Fs<SimMedium>, ino: u64, pg: u64) -> (u64, usize) {
    let (a, b) = (pg * 4096, (pg + 1) * 4096);
    let map = fs.bmap(ino).unwrap();
    let block = map
        .iter()
        .find(|e| e.kind == ExtentKind::Data && e.file_offset <= a && a < e.file_offset + e.len)
        .map(|e| e.pool_offset + (a - e.file_offset))
        .expect("the page is mapped");
    let pieces = map
        .iter()
        .filter(|e| e.kind == ExtentKind::Embedded && a <= e.file_offset && e.file_offset < b)
        .count();
    (block, pieces)
}

fn file(fs: &Fs<SimMedium>, name: &str, pages: u64) -> u64 {
    let ino = fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, &vec![0xa5u8; (pages * 4096) as usize]).unwrap();
    ino
}

#[test]
fn a_range_rewritten_in_place_never_merges_its_page() {
    let fs = fresh_sim(64 * MB, 2);
    let ino = file(&fs, "f", 4);
    let n = 200u64;
    let (block, _) = page_map(&fs, ino, 1);
    let (bytes, blocks) = cost(&fs, || {
        for k in 0..n {
            fs.write(ino, 4096 + 128, &pattern(k, 0, 64)).unwrap();
            fs.fsync(ino, false).unwrap();
        }
    });
    // Without the drop: a merge (a new 4 KiB block and its WRITE entry) every 17th
    // write, 358 pool bytes a write. With it each write is its entry (56 + 64 bytes)
    // and its tail, and fast GC's page unlinks now and then.
    let per_write = bytes / n;
    println!("{per_write} pool bytes and {blocks} blocks for {n} rewrites of one range");
    assert!(per_write < 200, "{per_write} pool bytes a rewrite");
    let (b, pieces) = page_map(&fs, ino, 1);
    assert_eq!(b, block, "the page kept its block");
    assert!(pieces <= MAX_PAGE_OPS, "{pieces} overlays");
    let mut want = vec![0xa5u8; 4 * 4096];
    want[4096 + 128..4096 + 192].copy_from_slice(&pattern(n - 1, 0, 64));
    let read = |fs: &Fs<SimMedium>| {
        let mut got = vec![0u8; want.len()];
        assert_eq!(fs.read(ino, 0, &mut got).unwrap(), got.len());
        got
    };
    assert!(read(&fs) == want, "the latest rewrite reads back");
    let fs = remount(fs, Remount::CrashDurable);
    assert!(read(&fs) == want, "after a crash");
    let fs = remount(fs, Remount::Clean);
    assert!(read(&fs) == want, "after a clean remount");
}

/// Lines rewritten many times do not merge their page; overlays that overlap
/// without covering each other whole read back; a range zeroed inside a page and
/// then overwritten reads the overwrite.
#[test]
fn only_whole_covers_hide_and_distinct_lines_count_towards_a_merge() {
    let fs = fresh_sim(64 * MB, 2);
    let ino = file(&fs, "g", 2);
    let mut model = vec![0xa5u8; 2 * 4096];
    let put = |fs: &Fs<SimMedium>, model: &mut Vec<u8>, off: u64, data: &[u8]| {
        fs.write(ino, off, data).unwrap();
        model[off as usize..off as usize + data.len()].copy_from_slice(data);
    };
    // Eight distinct lines of page 0, each written ten times: 80 embedded writes,
    // which merged the page at every 17th before overlays hid the ones they cover.
    let (bytes, _) = cost(&fs, || {
        for round in 0..10u64 {
            for line in 0..8u64 {
                put(&fs, &mut model, line * 64, &pattern(round * 100 + line, 0, 64));
            }
        }
    });
    // A merge streams a 4 KiB page: about 380 pool bytes a write with one every
    // 17th, as before the drop.
    assert!(bytes / 80 < 200, "{} pool bytes a write: the page merged", bytes / 80);
    let (_, pieces) = page_map(&fs, ino, 0);
    assert!(pieces <= MAX_PAGE_OPS, "{pieces} overlays");
    let mut got = vec![0u8; model.len()];
    fs.read(ino, 0, &mut got).unwrap();
    assert!(got == model, "rewritten lines read back");
    // Partial overlaps: [32, 96) covers neither line 0 nor line 1 whole.
    put(&fs, &mut model, 32, &pattern(7, 32, 64));
    put(&fs, &mut model, 40, &pattern(8, 40, 8));
    fs.read(ino, 0, &mut got).unwrap();
    assert!(got == model, "partial overlaps read back");
    // A zeroed range (a punch inside the page) overwritten whole.
    // FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
    fs.fallocate(ino, FallocMode::from_flags(3).unwrap(), 4096 + 256, 128).unwrap();
    model[4096 + 256..4096 + 384].fill(0);
    put(&fs, &mut model, 4096 + 256, &pattern(9, 0, 128));
    put(&fs, &mut model, 4096 + 300, &pattern(10, 0, 8));
    fs.read(ino, 0, &mut got).unwrap();
    assert!(got == model, "an overwritten punch reads back");
    let fs = remount(fs, Remount::CrashDurable);
    let mut got = vec![0u8; model.len()];
    fs.read(ino, 0, &mut got).unwrap();
    assert!(got == model, "after a crash");
}
