//! Access times as Linux keeps them: `relatime` by default (a read updates the
//! access time when it is not after the modification or change time, or is a day
//! old), `noatime` and `strictatime` as options. An update lives in DRAM and is
//! persisted lazily: at the last release of the inode, when nobody holds it open,
//! with its next attribute change, and at unmount; a crash before loses it. Also
//! the creation semantics the core owns for every front end: a set-group-id
//! directory's group and bit, and chown's clearing of set-id bits.

mod common;

use common::*;
use ferrite_core::sim::SimMedium;
use ferrite_core::*;

const MB: u64 = 1 << 20;

/// A file with 4 KiB of data, its access time not after its modification time.
fn written(fs: &Fs<SimMedium>, name: &str) -> u64 {
    let ino = fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, &[5u8; 4096]).unwrap();
    let a = fs.getattr(ino).unwrap();
    assert!(a.atime <= a.mtime);
    ino
}

/// What a power cut now leaves, mounted.
fn after_crash(fs: &Fs<SimMedium>) -> Fs<SimMedium> {
    let img = fs.medium().durable_image();
    Fs::mount(SimMedium::from_image(img), &MountOptions { workers: 1, ..Default::default() })
        .expect("mount after a crash")
}

#[test]
fn relatime_updates_once_after_a_change_and_persists_at_release() {
    let fs = fresh_sim(64 * MB, 2);
    let ino = written(&fs, "f");
    let before = fs.getattr(ino).unwrap();
    fs.open(ino).unwrap();
    let mut buf = [0u8; 100];
    // With a handle open, the update is DRAM-only: no fence on the read path.
    assert_eq!(fences(&fs, || assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), 100)), 0);
    let after = fs.getattr(ino).unwrap();
    assert!(after.atime > before.mtime, "{:?} not after {:?}", after.atime, before.mtime);
    assert_eq!((after.mtime, after.ctime), (before.mtime, before.ctime), "only atime moves");
    // A second read finds the access time after the change: nothing to do.
    fs.read(ino, 0, &mut buf).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().atime, after.atime, "relatime: once per change");
    // Not persisted yet: a crash keeps the old access time.
    let crashed = after_crash(&fs);
    assert_eq!(crashed.getattr(ino).unwrap().atime, before.atime);
    drop(crashed);
    // The last release persists it, with one fence.
    assert_eq!(fences(&fs, || fs.release(ino).unwrap()), 1);
    let crashed = after_crash(&fs);
    let got = crashed.getattr(ino).unwrap();
    assert_eq!(got.atime, after.atime);
    assert_eq!((got.mtime, got.ctime), (before.mtime, before.ctime), "ctime untouched");
    assert_fsck_clean(&crashed, "after the release");
    // A new write makes the next read due again.
    fs.write(ino, 0, b"x").unwrap();
    fs.read(ino, 0, &mut buf).unwrap();
    let again = fs.getattr(ino).unwrap();
    assert!(again.atime > again.mtime, "relatime after a new change");
}

#[test]
fn a_read_without_a_handle_persists_at_once() {
    let fs = fresh_sim(64 * MB, 2);
    let ino = written(&fs, "f");
    let mut buf = [0u8; 10];
    assert_eq!(
        fences(&fs, || {
            fs.read(ino, 0, &mut buf).unwrap();
        }),
        1,
        "due: persisted"
    );
    let a = fs.getattr(ino).unwrap().atime;
    assert_eq!(
        fences(&fs, || {
            fs.read(ino, 0, &mut buf).unwrap();
        }),
        0,
        "not due"
    );
    assert_eq!(after_crash(&fs).getattr(ino).unwrap().atime, a);
}

#[test]
fn noatime_never_and_strictatime_always() {
    let fs = fresh_sim(64 * MB, 2);
    let ino = written(&fs, "f");
    let mut buf = [0u8; 10];
    fs.set_atime_mode(AtimeMode::Off);
    let a0 = fs.getattr(ino).unwrap().atime;
    assert_eq!(
        fences(&fs, || {
            fs.read(ino, 0, &mut buf).unwrap();
        }),
        0
    );
    assert_eq!(fs.getattr(ino).unwrap().atime, a0, "noatime");
    fs.set_atime_mode(AtimeMode::Strict);
    fs.open(ino).unwrap();
    fs.read(ino, 0, &mut buf).unwrap();
    let a1 = fs.getattr(ino).unwrap().atime;
    fs.read(ino, 0, &mut buf).unwrap();
    let a2 = fs.getattr(ino).unwrap().atime;
    assert!(a0 < a1 && a1 < a2, "strictatime: every read ({a0:?} {a1:?} {a2:?})");
    fs.release(ino).unwrap();
    assert_eq!(after_crash(&fs).getattr(ino).unwrap().atime, a2);
}

#[test]
fn an_explicit_time_wins_and_an_attribute_change_carries_the_lazy_one() {
    let fs = fresh_sim(64 * MB, 2);
    let ino = written(&fs, "f");
    let mut buf = [0u8; 10];
    fs.open(ino).unwrap();
    fs.read(ino, 0, &mut buf).unwrap();
    let lazy = fs.getattr(ino).unwrap().atime;
    // chmod persists the DRAM access time with it.
    fs.setattr(ino, &SetAttr { perm: Some(0o600), ..Default::default() }).unwrap();
    assert_eq!(after_crash(&fs).getattr(ino).unwrap().atime, lazy);
    // utimensat to an earlier time is what stays.
    let old = Ts { sec: 1000, nsec: 7 };
    fs.read(ino, 0, &mut buf).unwrap();
    fs.setattr(ino, &SetAttr { atime: Some(SetTime::At(old)), ..Default::default() }).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().atime, old);
    fs.release(ino).unwrap();
    assert_eq!(after_crash(&fs).getattr(ino).unwrap().atime, old);
}

#[test]
fn unmount_persists_and_listings_count_as_access() {
    let fs = fresh_sim(64 * MB, 2);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    fs.create(d, b"x", 0o644, 0, 0).unwrap();
    let ino = written(&fs, "f");
    fs.open(ino).unwrap();
    fs.read(ino, 0, &mut [0u8; 4]).unwrap();
    let a = fs.getattr(ino).unwrap().atime;
    let d0 = fs.getattr(d).unwrap();
    assert!(d0.atime <= d0.mtime);
    let n = fs.list_dir(d).unwrap().len();
    assert_eq!(n, 1);
    let d1 = fs.getattr(d).unwrap();
    assert!(d1.atime > d1.mtime, "a listing updates the directory's access time");
    let m = fs.unmount().unwrap();
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    assert_eq!(fs.getattr(ino).unwrap().atime, a, "unmount persisted a held file's atime");
    assert_eq!(fs.getattr(d).unwrap().atime, d1.atime);
}

#[test]
fn a_setgid_directory_hands_down_its_group_and_chown_clears_set_ids() {
    let fs = fresh_sim(64 * MB, 2);
    let d = fs.mkdir(fs.root(), b"g", 0o2775, 0, 50).unwrap();
    assert_eq!(d.perm & 0o2000, 0o2000);
    let f = fs.create(d.ino, b"f", 0o755, 1000, 1000).unwrap();
    assert_eq!((f.uid, f.gid), (1000, 50), "the directory's group");
    assert_eq!(f.perm & 0o2000, 0, "a file does not get the bit");
    let sub = fs.mkdir(d.ino, b"sub", 0o755, 1000, 1000).unwrap();
    assert_eq!((sub.gid, sub.perm & 0o2000), (50, 0o2000), "a subdirectory gets both");
    let l = fs.symlink(d.ino, b"l", b"f", 1000, 1000).unwrap();
    assert_eq!(l.gid, 50);
    // Not in a plain directory.
    let p = fs.create(fs.root(), b"p", 0o644, 1000, 1000).unwrap();
    assert_eq!(p.gid, 1000);
    // chown clears set-user-id, and set-group-id where it is group-executable.
    fs.setattr(f.ino, &SetAttr { perm: Some(0o6755), ..Default::default() }).unwrap();
    let a = fs.setattr(f.ino, &SetAttr { uid: Some(7), ..Default::default() }).unwrap();
    assert_eq!(a.perm, 0o755, "chown of a group-executable set-id file");
    fs.setattr(f.ino, &SetAttr { perm: Some(0o6745), ..Default::default() }).unwrap();
    let a = fs.setattr(f.ino, &SetAttr { gid: Some(8), ..Default::default() }).unwrap();
    assert_eq!(a.perm, 0o2745, "set-group-id without group execute is mandatory locking");
    // A mode given with the owner is taken as it is (the kernel computed it).
    let a = fs
        .setattr(f.ino, &SetAttr { uid: Some(9), perm: Some(0o4755), ..Default::default() })
        .unwrap();
    assert_eq!(a.perm, 0o4755);
    // Directories keep their bits.
    let a = fs.setattr(sub.ino, &SetAttr { uid: Some(9), ..Default::default() }).unwrap();
    assert_eq!(a.perm & 0o2000, 0o2000);
    // The path API takes the caller's owner for O_CREAT.
    let fl = OpenFlags { create: true, write: true, uid: 1234, gid: 99, ..Default::default() };
    let a = fs.open_path(b"/g/made", fl, 0o644).unwrap();
    assert_eq!((a.uid, a.gid), (1234, 50));
    fs.release(a.ino).unwrap();
}

#[test]
fn reads_of_a_full_pool_succeed_when_the_access_time_cannot_be_persisted() {
    // Found by enospc_fill: persisting a read's access time needs log space, and a
    // read of a full pool failed with ENOSPC.
    let fs = fresh_sim(16 * MB, 1);
    let ino = written(&fs, "f");
    let filler = fs.create(fs.root(), b"fill", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![1u8; 64 << 10];
    let mut off = 0;
    while fs.write(filler, off, &chunk).is_ok() {
        off += chunk.len() as u64;
    }
    let mut small = 0;
    while fs.append(filler, &[2u8; 16]).is_ok() {
        small += 1;
        assert!(small < 1_000_000, "appends never fill the pool");
    }
    // Fill the file's own log page: no entry fits anywhere now.
    let mut n = 0;
    while fs.setattr(ino, &SetAttr { perm: Some(0o600 + n % 2), ..Default::default() }).is_ok() {
        n += 1;
        assert!(n < 10_000, "chmods never fill the log");
    }
    let mut buf = [0u8; 4];
    assert_eq!(fs.read(ino, 0, &mut buf).unwrap(), 4, "a read of a full pool");
    fs.open(ino).unwrap();
    fs.read(ino, 0, &mut buf).unwrap();
    fs.release(ino).unwrap();
    let m = fs.unmount().expect("unmount of a full pool");
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    assert_eq!(fs.read_all(ino).unwrap(), vec![5u8; 4096]);
    assert_fsck_clean(&fs, "full pool after reads");
}
