//! copy_file_range in the core (`Fs::copy_range_as`), which the FUSE front end only
//! translates: bytes land as written, short at the source's end, 0 past it, the
//! kernel's errors (overlap within one file, directories, EFBIG), set-id bits
//! cleared by a writer without CAP_FSETID, and the result survives a remount.

mod common;

use common::*;
use ferrite_core::*;

const MB: u64 = 1 << 20;

#[test]
fn copies_match_a_model_and_fail_as_the_kernel_does() {
    let fs = fresh_sim(64 * MB, 1);
    let mut rng = Rng(21);
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    let data = rng.bytes(3 * MB as usize + 777);
    fs.write(a, 0, &data).unwrap();
    // Across files, unaligned, more than one 1 MiB commit, past the destination's end.
    let n = fs.copy_range_as(a, 1001, b, 5000, 2 * MB + 10, || false).unwrap();
    assert_eq!(n, 2 * MB + 10);
    let mut want = vec![0u8; 5000];
    want.extend_from_slice(&data[1001..1001 + n as usize]);
    assert!(fs.read_all(b).unwrap() == want, "copy across files");
    // Short at the source's end, nothing past it.
    let size = data.len() as u64;
    assert_eq!(fs.copy_range_as(a, size - 10, b, 0, 100, || false).unwrap(), 10);
    want[..10].copy_from_slice(&data[data.len() - 10..]);
    assert_eq!(fs.copy_range_as(a, size, b, 0, 100, || false).unwrap(), 0);
    assert_eq!(fs.copy_range_as(a, size + 5, b, 0, 100, || false).unwrap(), 0);
    // Within one file: disjoint ranges work, overlapping ones are EINVAL.
    let mut wa = data.clone();
    assert_eq!(fs.copy_range_as(a, 0, a, 2 * MB, 4096, || false).unwrap(), 4096);
    wa.copy_within(0..4096, 2 * MB as usize);
    assert_eq!(errno(&fs.copy_range_as(a, 0, a, 100, 4096, || false)), libc::EINVAL);
    assert_eq!(errno(&fs.copy_range_as(a, 100, a, 0, 4096, || false)), libc::EINVAL);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    assert_eq!(errno(&fs.copy_range_as(d, 0, b, 0, 10, || false)), libc::EISDIR);
    assert_eq!(errno(&fs.copy_range_as(a, 0, d, 0, 10, || false)), libc::EISDIR);
    let big = i64::MAX as u64 - 5;
    assert_eq!(errno(&fs.copy_range_as(a, 0, b, big, 100, || false)), libc::EFBIG);
    // A writer without CAP_FSETID clears the destination's set-user-id bit.
    fs.setattr(b, &SetAttr { perm: Some(0o4755), ..Default::default() }).unwrap();
    fs.copy_range_as(a, 0, b, 0, 10, || true).unwrap();
    want[..10].copy_from_slice(&data[..10]);
    assert_eq!(fs.getattr(b).unwrap().perm & 0o7777, 0o755);
    let fs = remount(fs, Remount::CrashDurable);
    assert!(fs.read_all(a).unwrap() == wa, "source after remount");
    assert!(fs.read_all(b).unwrap() == want, "destination after remount");
}
