//! FIFOs, sockets and device nodes (format version 3): mknod stores the type and the
//! device number, readdir and getattr report them, they hold no data (read, write and
//! truncate are EINVAL; a path open in the library is ENXIO, since only the kernel runs
//! them), they rename, link and unlink like files, survive every kind of remount, and
//! a mknod is one operation at every crash point of its fences.

mod common;

use common::*;
use ferrite_core::*;

const MB: u64 = 1 << 20;

fn node(parent: u64, name: &[u8]) -> NewNode<'_> {
    NewNode { parent, name, dir: false, uid: 1000, gid: 100 }
}

const KINDS: [(FileType, &[u8], u32); 5] = [
    (FileType::Fifo, b"fifo", 0),
    (FileType::Socket, b"sock", 0),
    (FileType::CharDevice, b"null", 0x103),        // 1:3
    (FileType::BlockDevice, b"loop", 0x0770_0708), // 7:0x7708 (a large minor)
    (FileType::Regular, b"reg", 0),
];

#[test]
fn every_kind_is_stored_with_its_type_and_device_number() {
    let mut fs = fresh_sim(32 * MB, 2);
    let root = fs.root();
    for (t, name, rdev) in KINDS {
        let a = fs.mknod(node(root, name), t, 0o640, rdev, 0o022).unwrap();
        assert_eq!((a.ftype, a.perm, a.rdev, a.size, a.nlink), (t, 0o640, rdev, 0, 1));
        assert_eq!(a.mode() & libc::S_IFMT, t.mode_bits());
        assert_eq!((a.uid, a.gid), (1000, 100));
    }
    // The umask applies (no default ACL here); device numbers split as the kernel's.
    let a = fs.mknod(node(root, b"masked"), FileType::Fifo, 0o666, 0, 0o027).unwrap();
    assert_eq!(a.perm, 0o640);
    let (major, minor) = fs.lookup(root, b"loop").unwrap().rdev_parts();
    assert_eq!((major, minor), (7, 0x7708));
    assert_eq!(encode_rdev(7, 0x7708), 0x0770_0708);
    // A device number on anything but a device node is dropped, as mknod(2) does.
    let a = fs.mknod(node(root, b"fifo2"), FileType::Fifo, 0o600, 0x103, 0).unwrap();
    assert_eq!(a.rdev, 0);

    for how in [Remount::Clean, Remount::CrashCurrent, Remount::CrashDurable] {
        fs = remount(fs, how);
        let listed: Vec<_> =
            fs.list_dir(fs.root()).unwrap().into_iter().map(|d| (d.name, d.ftype)).collect();

        for (t, name, rdev) in KINDS {
            assert!(listed.contains(&(name.to_vec(), t)), "{how:?}: {name:?} in {listed:?}");
            let a = fs.lookup(fs.root(), name).unwrap();
            assert_eq!((a.ftype, a.perm, a.rdev), (t, 0o640, rdev), "{how:?}");
        }
        let r = fs.fsck().unwrap();
        assert_eq!((r.special, r.files), (6, 1), "{how:?}");
    }
}

#[test]
fn special_files_hold_no_data_and_move_like_files() {
    let fs = fresh_sim(32 * MB, 1);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let p = fs.mknod(node(root, b"p"), FileType::Fifo, 0o644, 0, 0).unwrap().ino;
    let mut buf = [0u8; 8];
    assert_eq!(errno(&fs.read(p, 0, &mut buf)), libc::EINVAL);
    assert_eq!(errno(&fs.write(p, 0, b"x")), libc::EINVAL);
    assert_eq!(
        errno(&fs.setattr(p, &SetAttr { size: Some(9), ..Default::default() })),
        libc::EINVAL
    );
    let e = fs.fallocate(p, FallocMode::default(), 0, 4096);
    assert_eq!(errno(&e), libc::EINVAL);
    // Only the kernel runs a FIFO: the library's path open refuses it.
    assert_eq!(errno(&fs.open_path(b"/p", OpenFlags::default(), 0)), libc::ENXIO);
    // Not a directory or symlink by mknod; an existing name is EEXIST.
    let e = fs.mknod(node(root, b"x"), FileType::Directory, 0o755, 0, 0);
    assert_eq!(errno(&e), libc::EINVAL);
    let e = fs.mknod(node(root, b"x"), FileType::Symlink, 0o777, 0, 0);
    assert_eq!(errno(&e), libc::EINVAL);
    assert_eq!(errno(&fs.mknod(node(root, b"p"), FileType::Socket, 0o644, 0, 0)), libc::EEXIST);
    // chmod, chown, xattrs, link, rename (also over another special file), unlink.
    let ch = SetAttr { perm: Some(0o600), uid: Some(7), ..Default::default() };
    assert_eq!(fs.setattr(p, &ch).unwrap().perm, 0o600);
    fs.setxattr(p, b"trusted.t", b"v", XattrSet::Any).unwrap();
    fs.link(p, d, b"p2").unwrap();
    assert_eq!(fs.getattr(p).unwrap().nlink, 2);
    let s = fs.mknod(node(root, b"s"), FileType::Socket, 0o755, 0, 0).unwrap().ino;
    fs.rename(root, b"s", d, b"p2", RenameFlags::default()).unwrap();
    assert_eq!(fs.lookup(d, b"p2").unwrap().ino, s);
    assert_eq!(fs.getattr(p).unwrap().nlink, 1);
    fs.unlink(root, b"p").unwrap();
    assert!(matches!(fs.getattr(p), Err(Error::NotFound)));
    assert_fsck_clean(&fs, "after moving special files");
}

#[test]
fn mknod_is_one_operation_at_every_crash_point() {
    // Every subset of the words in flight at each of mknod's fences: after recovery
    // the node is absent, or present with its type, mode and device number.
    let fs = fresh_sim(16 * MB, 1);
    let root = fs.root();
    let (r, points) =
        record_fences(&fs, || fs.mknod(node(root, b"dev"), FileType::CharDevice, 0o620, 0x0405, 0));
    r.unwrap();
    assert!(!points.is_empty());
    let mut seen = std::collections::BTreeSet::new();
    for_each_crash_image(&points, 48, 11, |k, c| {
        assert_fsck_clean(&c, &format!("crash subset {k}"));
        let state = c.lookup(c.root(), b"dev").ok().map(|a| (a.ftype, a.perm, a.rdev));
        assert!(
            state.is_none() || state == Some((FileType::CharDevice, 0o620, 0x0405)),
            "subset {k}: {state:?}"
        );
        seen.insert(state.is_some());
    });
    assert!(seen.contains(&false), "some crash point loses the uncommitted node");
    let c = Fs::mount(SimMedium::from_image(fs.medium().durable_image()), &Default::default());
    let a = c.unwrap().lookup(root, b"dev").unwrap();
    assert_eq!((a.ftype, a.rdev), (FileType::CharDevice, 0x0405), "durable when mknod returns");
}
