//! Extended attribute values up to 64 KiB (Linux's XATTR_SIZE_MAX): a value too large
//! for a log entry lives in data blocks named by its XATTR entry. Values of every size
//! read back exactly across remounts and thorough GC; replacing, removing and freeing
//! the inode return the blocks; a damaged block is an error, never a wrong value; a
//! large setxattr is one operation at every crash point; 64 KiB + 1 is E2BIG.

mod common;

use common::*;
use ferrite_core::*;

const MB: u64 = 1 << 20;

fn value(tag: u64, len: usize) -> Vec<u8> {
    Rng(tag).bytes(len)
}

#[test]
fn values_of_every_size_round_trip() {
    let mut fs = fresh_sim(64 * MB, 2);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let free0 = fs.statfs().bfree;
    let sizes = [0usize, 1, XATTR_VALUE_MAX, XATTR_VALUE_MAX + 1, 4096, 4097, 40_000, 65_536];
    for (k, &n) in sizes.iter().enumerate() {
        let name = format!("user.v{k}");
        fs.setxattr(f, name.as_bytes(), &value(k as u64, n), XattrSet::Any).unwrap();
        fs.setxattr(d, name.as_bytes(), &value(100 + k as u64, n), XattrSet::Any).unwrap();
    }
    let too_big = fs.setxattr(f, b"user.big", &vec![1u8; 65_537], XattrSet::Any);
    assert_eq!(errno(&too_big), libc::E2BIG);
    let check = |fs: &Fs<SimMedium>, ctx: &str| {
        for (k, &n) in sizes.iter().enumerate() {
            let name = format!("user.v{k}");
            let got = fs.getxattr(f, name.as_bytes()).unwrap();
            assert!(got == value(k as u64, n), "{ctx}: file value {k} ({n} bytes)");
            let got = fs.getxattr(d, name.as_bytes()).unwrap();
            assert!(got == value(100 + k as u64, n), "{ctx}: dir value {k} ({n} bytes)");
        }
    };
    check(&fs, "as set");
    assert!(fs.statfs().bfree < free0, "large values took blocks");
    for how in [Remount::Clean, Remount::CrashCurrent, Remount::CrashDurable] {
        fs = remount(fs, how);
        check(&fs, &format!("after {how:?}"));
    }
    fs.compact(f).unwrap();
    fs.compact(d).unwrap();
    check(&fs, "after thorough GC");
    assert_fsck_clean(&fs, "after GC");
    // Replacing large by small, removing, and freeing the inode give the blocks back.
    for (k, _) in sizes.iter().enumerate() {
        let name = format!("user.v{k}");
        fs.setxattr(f, name.as_bytes(), b"small", XattrSet::Replace).unwrap();
        fs.removexattr(d, name.as_bytes()).unwrap();
    }
    fs.setxattr(f, b"user.again", &value(7, 30_000), XattrSet::Any).unwrap();
    fs.unlink(fs.root(), b"f").unwrap();
    // Every spilled block came back (f's log page too), and the running allocator
    // agrees with one rebuilt from the logs after a crash.
    let now = fs.statfs().bfree;
    assert!(now > free0, "{now} free blocks, {free0} before the values");
    fs = remount(fs, Remount::CrashDurable);
    assert_eq!(fs.statfs().bfree, now, "allocator rebuilt from the logs");
}

#[test]
fn a_damaged_value_block_is_an_error() {
    let fs = fresh_sim(16 * MB, 1);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let before = fs.statfs().bfree;
    fs.setxattr(f, b"user.big", &value(1, 10_000), XattrSet::Any).unwrap();
    assert_eq!(before - fs.statfs().bfree, 3, "three value blocks");
    // The value's blocks are the file's only data blocks.
    let m = fs.unmount().unwrap();
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    let fsck = fs.fsck().unwrap();
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
    assert_eq!(fsck.data_blocks, 3);
    let m = fs.unmount().unwrap();
    // Find the value's second block by its content, and flip a byte in it.
    let v = value(1, 10_000);
    let at = (0..m.len() / 4096)
        .find(|&b| {
            let mut page = [0u8; 64];
            m.read(b * 4096, &mut page);
            page[..] == v[4096..4096 + 64]
        })
        .expect("the value's second block");
    m.write(at * 4096 + 17, &[v[4096 + 17] ^ 0xff]);
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    assert!(fs.getxattr(f, b"user.big").is_err(), "damage read back as a value");
}

#[test]
fn a_large_setxattr_is_one_operation_at_every_crash_point() {
    let fs = fresh_sim(16 * MB, 1);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let (old, new) = (value(1, 20_000), value(2, 50_000));
    fs.setxattr(f, b"user.x", &old, XattrSet::Any).unwrap();
    let (r, points) = record_fences(&fs, || fs.setxattr(f, b"user.x", &new, XattrSet::Replace));
    r.unwrap();
    assert!(!points.is_empty());
    let mut seen = std::collections::BTreeSet::new();
    for_each_crash_image(&points, 32, 3, |k, c| {
        let got = c.getxattr(f, b"user.x").unwrap();
        assert!(got == old || got == new, "crash subset {k}: neither value");
        seen.insert(got == new);
        assert_fsck_clean(&c, "after a crash inside a large setxattr");
    });
    assert!(seen.contains(&false), "some crash point keeps the old value");
}
