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
