//! Regression tests for core bugs found by the model-based and damage tests. Each
//! test opens with a note on the bug it pins (errno-order bugs are pinned by
//! `errno_linux.rs` instead).

mod common;
use common::*;
use ferrite_core::*;

/// Bug: fsck summed file sizes into `FsckReport::data_bytes` with `+`, so three
/// sparse files near the 2^63 - 1 size limit made fsck panic with an arithmetic
/// overflow (found by `model_ops`). Fixed with a saturating sum in `fsck.rs`.
#[test]
fn fsck_with_three_files_at_the_size_limit() {
    let fs = fresh_sim(4 << 20, 2);
    for name in [&b"x"[..], b"y", b"z"] {
        let f = fs.create(fs.root(), name, 0o644, 0, 0).unwrap().ino;
        fs.setattr(f, &SetAttr { size: Some(i64::MAX as u64), ..Default::default() }).unwrap();
    }
    let r = fs.fsck().unwrap();
    assert!(r.is_clean(), "{:?}", r.errors);
    assert_eq!(r.data_bytes, u64::MAX);
}

/// Bug: on a cleanly unmounted pool whose root inode slot was damaged to read as
/// free, mount returned `Error::NotFound` (ENOENT, as if a path were missing)
/// instead of a corruption error (found by `damage_pools`). Fixed in
/// `recovery.rs` (`Fs::mount`).
#[test]
fn damaged_root_slot_is_a_corruption_error() {
    let fs = fresh_sim(4 << 20, 2);
    let slot = fs.geometry().slot_off(fs.root());
    let mut img = fs.unmount().unwrap().current_image();
    img[slot as usize] ^= 1; // state word: odd (in use) becomes even (free)
    match Fs::mount(SimMedium::from_image(img), &MountOptions::default()) {
        Err(Error::Corrupt(m)) => assert!(m.contains("root"), "{m}"),
        r => panic!("{:?}", r.map(|_| ())),
    }
}
