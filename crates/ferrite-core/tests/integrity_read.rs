//! Read verification: a read touching a data block whose checksum does not match
//! fails with `Error::DataCorrupt` (EIO), under `verify=first-touch` (the default:
//! once per block per mount) and `verify=always`; `verify=off` reads as before.

mod common;

use common::*;
use ferrite_core::inspect::ExtentKind;
use ferrite_core::*;

const MB: u64 = 1 << 20;
const PAGE: usize = 4096;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|k| (k as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Pool offset of the data block holding file page `pg` of `ino`.
fn block_of(fs: &Fs<SimMedium>, ino: u64, pg: u64) -> u64 {
    let exts = fs.bmap(ino).unwrap();
    let e = exts
        .iter()
        .find(|e| {
            e.kind == ExtentKind::Data
                && e.file_offset <= pg * 4096
                && pg * 4096 < e.file_offset + e.len
        })
        .unwrap_or_else(|| panic!("page {pg} of inode {ino} is not in a data block: {exts:?}"));
    e.pool_offset + (pg * 4096 - e.file_offset)
}

/// Flip one byte of the medium (a stray store or a poisoned line).
fn damage(fs: &Fs<SimMedium>, off: u64) {
    let mut b = [0u8; 1];
    fs.medium().read(off, &mut b);
    fs.medium().write(off, &[b[0] ^ 0x5a]);
}

fn mount(m: SimMedium, verify: VerifyMode) -> Fs<SimMedium> {
    Fs::mount(m, &MountOptions { verify, ..Default::default() }).unwrap()
}

/// A pool with file "f" of 3 pages written whole, unmounted cleanly.
fn pool() -> (SimMedium, Vec<u8>) {
    let fs = fresh_sim(16 * MB, 1);
    let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let data = pattern(1, 3 * PAGE);
    fs.write(ino, 0, &data).unwrap();
    (fs.unmount().unwrap(), data)
}

fn expect_corrupt(r: Result<usize>, ino: u64, offset: u64, block: u64) {
    match r {
        Err(Error::DataCorrupt { ino: i, offset: o, block: b }) => {
            assert_eq!((i, o, b), (ino, offset, block));
            assert_eq!(Error::DataCorrupt { ino, offset, block }.errno(), libc::EIO);
        }
        other => panic!("expected DataCorrupt at {offset}, got {other:?}"),
    }
}

#[test]
fn a_damaged_block_fails_the_read_and_undamaged_pages_read_fine() {
    let (m, data) = pool();
    let fs = mount(m, VerifyMode::FirstTouch);
    let ino = fs.lookup(fs.root(), b"f").unwrap().ino;
    let blk = block_of(&fs, ino, 1);
    damage(&fs, blk + 1000);
    let mut buf = vec![0u8; PAGE];
    assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), PAGE);
    assert_eq!(buf, data[..PAGE]);
    assert_eq!(fs.read(ino, 2 * 4096, &mut buf).unwrap(), PAGE);
    assert_eq!(buf, data[2 * PAGE..]);
    // A whole-page read, a sub-page read and a read spanning pages all fail.
    expect_corrupt(fs.read(ino, 4096, &mut buf), ino, 4096, blk / 4096);
    expect_corrupt(fs.read(ino, 4096 + 10, &mut buf[..20]), ino, 4096, blk / 4096);
    let mut all = vec![0u8; 3 * PAGE];
    expect_corrupt(fs.read(ino, 0, &mut all), ino, 4096, blk / 4096);
    // A write that rebuilds the page from its old content must not launder it.
    let r = fs.write(ino, 4096 + 100, &[7u8; 3000]);
    assert!(matches!(r, Err(Error::DataCorrupt { .. })), "{r:?}");
    // A whole-page overwrite replaces the damaged block: the page reads again.
    fs.write(ino, 4096, &pattern(9, PAGE)).unwrap();
    assert_eq!(fs.read(ino, 4096, &mut buf).unwrap(), PAGE);
    assert_eq!(buf, pattern(9, PAGE));
}

#[test]
fn first_touch_checks_once_per_mount_and_always_checks_every_read() {
    // First touch: a block read before the damage is not checked again.
    let (m, data) = pool();
    let fs = mount(m, VerifyMode::FirstTouch);
    let ino = fs.lookup(fs.root(), b"f").unwrap().ino;
    let blk = block_of(&fs, ino, 0);
    let mut buf = vec![0u8; PAGE];
    fs.read(ino, 0, &mut buf).unwrap();
    damage(&fs, blk + 5);
    assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), PAGE, "verified once this mount");
    assert_ne!(buf, data[..PAGE]);
    // The next mount checks it again.
    let fs = mount(fs.unmount().unwrap(), VerifyMode::FirstTouch);
    expect_corrupt(fs.read(ino, 0, &mut buf), ino, 0, blk / 4096);

    // Always: the same sequence fails at the second read.
    let (m, _) = pool();
    let fs = mount(m, VerifyMode::Always);
    let blk = block_of(&fs, ino, 0);
    fs.read(ino, 0, &mut buf).unwrap();
    damage(&fs, blk + 5);
    expect_corrupt(fs.read(ino, 0, &mut buf), ino, 0, blk / 4096);

    // Off: damaged bytes come back (the caller chose not to check).
    let (m, data) = pool();
    let fs = mount(m, VerifyMode::Off);
    damage(&fs, block_of(&fs, ino, 2) + 7);
    assert_eq!(fs.read(ino, 2 * 4096, &mut buf).unwrap(), PAGE);
    assert_ne!(buf, data[2 * PAGE..]);
}

#[test]
fn pages_stay_checkable_after_partial_rewrites_gc_and_fallocate() {
    let fs = fresh_sim(64 * MB, 2);
    let ino = fs.create(fs.root(), b"big", 0o644, 0, 0).unwrap().ino;
    // 300 pages: more than one WRITE entry's worth of page checksums.
    let mut data = pattern(3, 300 * PAGE);
    fs.write(ino, 0, &data).unwrap();
    // Replace pages inside the extent: the rest of it must stay checkable.
    let patch = pattern(4, 2 * PAGE);
    fs.write(ino, 10 * 4096, &patch).unwrap();
    data[10 * PAGE..12 * PAGE].copy_from_slice(&patch);
    fs.fallocate(ino, FallocMode::default(), 300 * 4096, 4 * 4096).unwrap();
    data.resize(304 * PAGE, 0);
    fs.compact(ino).unwrap();
    let fs = mount(fs.unmount().unwrap(), VerifyMode::FirstTouch);
    let mut all = vec![0u8; data.len()];
    assert_eq!(fs.read(ino, 0, &mut all).unwrap(), data.len());
    assert!(all == data, "undamaged file reads back");
    let fs = mount(fs.unmount().unwrap(), VerifyMode::FirstTouch);
    for pg in [0u64, 9, 12, 255, 256, 299, 302] {
        let blk = block_of(&fs, ino, pg);
        damage(&fs, blk + 4095);
        let mut buf = vec![0u8; 16];
        expect_corrupt(fs.read(ino, pg * 4096 + 4080, &mut buf), ino, pg * 4096, blk / 4096);
    }
}

#[test]
fn a_page_merged_this_mount_is_not_checked_again_until_the_next_mount() {
    // A merge writes a page's new block and its checksum from one DRAM page, so
    // first-touch marks it verified at its commit (the next merge of the page
    // reads it without a check); the next mount checks it, and `always` at once.
    for mode in [VerifyMode::FirstTouch, VerifyMode::Always] {
        let (m, mut data) = pool();
        let fs = mount(m, mode);
        let ino = fs.lookup(fs.root(), b"f").unwrap().ino;
        let before = block_of(&fs, ino, 1);
        // Distinct 64 B ranges of page 1 until the page merges into a new block.
        let mut k = 0usize;
        while block_of(&fs, ino, 1) == before {
            assert!(k < 2 * MAX_PAGE_OPS, "page 1 never merged");
            let at = PAGE + k * 64;
            let bytes = pattern(k as u8 + 7, 64);
            fs.write(ino, at as u64, &bytes).unwrap();
            data[at..at + 64].copy_from_slice(&bytes);
            k += 1;
        }
        let blk = block_of(&fs, ino, 1);
        damage(&fs, blk + 5);
        let mut buf = vec![0u8; PAGE];
        if mode == VerifyMode::Always {
            expect_corrupt(fs.read(ino, 4096, &mut buf), ino, 4096, blk / 4096);
            continue;
        }
        assert_eq!(fs.read(ino, 4096, &mut buf).unwrap(), PAGE, "merged this mount");
        assert_ne!(buf, data[PAGE..2 * PAGE]);
        let fs = mount(fs.unmount().unwrap(), VerifyMode::FirstTouch);
        expect_corrupt(fs.read(ino, 4096, &mut buf), ino, 4096, blk / 4096);
    }
}
