//! ENOSPC: filling a pool with data, with inodes, and with log space through
//! metadata-only operations (directory entries, extended attributes). Each time the
//! error must be ENOSPC, the failed operation must change nothing (contents, sizes,
//! free counts), everything written before must be intact byte for byte, fsck must be
//! clean (also after remounts), and deleting must work on the full pool and make the
//! space reusable.
//!
//! Overwrites are copy-on-write, so on a full pool an overwrite of existing data
//! fails with ENOSPC too (tmpfs would overwrite in place): the tests expect that.

mod common;
use common::*;
use ferrite_core::*;
use std::collections::BTreeMap;

fn snapshot<M: Medium>(fs: &Fs<M>, files: &BTreeMap<Vec<u8>, (u64, Vec<u8>)>, ctx: &str) {
    for (name, (ino, data)) in files {
        let a = fs.getattr(*ino).unwrap_or_else(|e| panic!("{ctx}: {name:?}: {e}"));
        assert_eq!(a.size, data.len() as u64, "{ctx}: size of {name:?}");
        let got = fs.read_all(*ino).unwrap();
        assert!(got == *data, "{ctx}: contents of {name:?} differ");
        assert_eq!(fs.lookup_ino(fs.root(), name).unwrap(), *ino, "{ctx}: name {name:?}");
    }
}

/// Fill `fs` with file data until even one-byte writes fail; returns the files.
fn fill_with_data<M: Medium>(fs: &Fs<M>) -> BTreeMap<Vec<u8>, (u64, Vec<u8>)> {
    let root = fs.root();
    let mut files: BTreeMap<Vec<u8>, (u64, Vec<u8>)> = BTreeMap::new();
    let mut rng = Rng(3);
    let mut chunk = 256 << 10;
    let mut tag = 0u64;
    let mut k = 0;
    while chunk > 0 {
        // A new file now and then (which may itself fail for lack of space).
        if files.is_empty() || rng.below(6) == 0 {
            let name = format!("file{k}").into_bytes();
            k += 1;
            match fs.create(root, &name, 0o644, 0, 0) {
                Ok(a) => {
                    files.insert(name, (a.ino, Vec::new()));
                }
                Err(Error::NoSpace) => {}
                Err(e) => panic!("create: {e}"),
            }
        }
        let names: Vec<Vec<u8>> = files.keys().cloned().collect();
        let name = &names[rng.below(names.len() as u64) as usize];
        let (ino, data) = files.get_mut(name).unwrap();
        let len = (rng.below(chunk as u64) + 1) as usize;
        // Mostly appends, sometimes overwrites and sparse extensions.
        let off = match rng.below(4) {
            0 if !data.is_empty() => rng.below(data.len() as u64),
            1 => data.len() as u64 + rng.below(9000),
            _ => data.len() as u64,
        };
        tag += 1;
        let buf = pattern(tag, off, len);
        let before = fs.statfs();
        match fs.write(*ino, off, &buf) {
            Ok(n) => {
                assert_eq!(n, len);
                let end = off as usize + len;
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[off as usize..end].copy_from_slice(&buf);
            }
            Err(Error::NoSpace) => {
                assert_eq!(Error::NoSpace.errno(), libc::ENOSPC);
                let after = fs.statfs();
                assert_eq!(before.bfree, after.bfree, "a failed write leaked or freed blocks");
                assert_eq!(
                    fs.getattr(*ino).unwrap().size,
                    data.len() as u64,
                    "failed write changed size"
                );
                chunk /= 2;
            }
            Err(e) => panic!("write: {e}"),
        }
    }
    files
}

fn check_full_pool<M: Medium>(fs: Fs<M>, files: &mut BTreeMap<Vec<u8>, (u64, Vec<u8>)>) -> Fs<M> {
    let root = fs.root();
    snapshot(&fs, files, "full pool");
    assert_fsck_clean(&fs, "full pool");
    let s = fs.statfs();
    assert!(s.bavail <= 2, "pool not full: {s:?}");
    // Data writes, overwrites included, are ENOSPC and change nothing.
    let (name, (ino, data)) = files.iter().find(|(_, (_, d))| d.len() > 8192).expect("a big file");
    let before = fs.statfs();
    assert!(
        matches!(fs.write(*ino, 0, &[1u8; 8192]), Err(Error::NoSpace)),
        "overwrite of {name:?}"
    );
    assert!(matches!(fs.write(*ino, data.len() as u64, &[1u8; 100_000]), Err(Error::NoSpace)));
    assert!(matches!(
        fs.fallocate(*ino, FallocMode::default(), data.len() as u64, 1 << 20),
        Err(Error::NoSpace)
    ));
    assert_eq!(fs.statfs(), before);
    snapshot(&fs, files, "after failed writes");
    // Deleting works on the full pool (the reserve) and frees space.
    let victims: Vec<Vec<u8>> = files.keys().take(files.len() / 2 + 1).cloned().collect();
    let mut freed_bytes = 0u64;
    for v in &victims {
        fs.unlink(root, v).unwrap_or_else(|e| panic!("unlink on a full pool: {e}"));
        freed_bytes += files.remove(v).unwrap().1.len() as u64;
    }
    let s2 = fs.statfs();
    assert!(
        s2.bfree > before.bfree + freed_bytes / 4096 / 2,
        "{before:?} -> {s2:?} after freeing {freed_bytes}"
    );
    assert_fsck_clean(&fs, "after deletes");
    snapshot(&fs, files, "after deletes");
    // Reuse: a new file as big as half of what was freed.
    let f = fs.create(root, b"reuse", 0o644, 0, 0).unwrap().ino;
    let data = pattern(999, 0, (freed_bytes / 2) as usize);
    fs.write(f, 0, &data).unwrap();
    files.insert(b"reuse".to_vec(), (f, data));
    snapshot(&fs, files, "after reuse");
    assert_fsck_clean(&fs, "after reuse");
    fs
}

#[test]
fn data_fill_on_a_simulated_pool() {
    let fs = fresh_sim(2 << 20, 2);
    let mut files = fill_with_data(&fs);
    // Survives remounts while full.
    let fs = remount(fs, Remount::CrashCurrent);
    snapshot(&fs, &files, "full pool after a crash");
    let fs = remount(fs, Remount::Clean);
    let fs = check_full_pool(fs, &mut files);
    let fs = remount(fs, Remount::CrashDurable);
    snapshot(&fs, &files, "end after a crash");
    let fs = remount(fs, Remount::Clean);
    snapshot(&fs, &files, "end after a clean remount");
}

#[test]
fn data_fill_on_a_pool_file_in_dev_shm() {
    let dir = tempfile::Builder::new().prefix("ferrite-enospc").tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("pool");
    let m = MmapMedium::create(&path, 3 << 20, &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions { shards: 3, ..Default::default() }).unwrap();
    let mut files = fill_with_data(&fs);
    let fs = check_full_pool(fs, &mut files);
    drop(fs.unmount().unwrap());
    let m = MmapMedium::open(&path, &MapOptions::default()).unwrap();
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    assert!(fs.mount_report().clean);
    snapshot(&fs, &files, "pool file after remount");
    assert_fsck_clean(&fs, "pool file after remount");
    // A crash (the medium dropped without unmount) keeps everything too.
    drop(fs.crash());
    let m = MmapMedium::open(&path, &MapOptions::default()).unwrap();
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    assert!(!fs.mount_report().clean);
    snapshot(&fs, &files, "pool file after a crash");
    assert_fsck_clean(&fs, "pool file after a crash");
}

#[test]
fn inode_exhaustion() {
    let fs = Fs::mkfs(
        SimMedium::new(4 << 20),
        &MkfsOptions { shards: 4, inodes: 64, ..Default::default() },
    )
    .unwrap();
    let root = fs.root();
    let free = fs.statfs().ffree;
    assert_eq!(free, 63);
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let mut made = vec![];
    for i in 0.. {
        let name = format!("f{i}");
        match fs.create(d, name.as_bytes(), 0o644, 0, 0) {
            Ok(a) => {
                fs.write(a.ino, 0, name.as_bytes()).unwrap();
                made.push((name, a.ino));
            }
            Err(e) => {
                assert!(matches!(e, Error::NoSpace), "{e:?}");
                assert_eq!(e.errno(), libc::ENOSPC);
                break;
            }
        }
    }
    assert_eq!(made.len() as u64, free - 1);
    assert_eq!(fs.statfs().ffree, 0);
    for (what, r) in [
        ("mkdir", fs.mkdir(root, b"x", 0o755, 0, 0).map(|_| ())),
        ("symlink", fs.symlink(root, b"y", b"t", 0, 0).map(|_| ())),
        ("create", fs.create(root, b"z", 0o644, 0, 0).map(|_| ())),
    ] {
        assert!(matches!(r, Err(Error::NoSpace)), "{what}: {r:?}");
    }
    // Links need no inode.
    fs.link(made[0].1, root, b"hard").unwrap();
    assert_eq!(fs.list_dir(root).unwrap().len(), 2);
    let fs = remount(fs, Remount::CrashCurrent);
    for (name, ino) in &made {
        assert_eq!(fs.read_all(*ino).unwrap(), name.as_bytes());
    }
    let old_gen = fs.getattr(made[3].1).unwrap().generation;
    fs.unlink(d, b"f3").unwrap();
    assert_eq!(fs.statfs().ffree, 1);
    let a = fs.create(root, b"again", 0o644, 0, 0).unwrap();
    assert_eq!(a.ino, made[3].1, "the freed inode number is reused");
    assert!(a.generation > old_gen, "a reused inode number gets a new generation");
    assert_fsck_clean(&fs, "inodes reused");
}

/// Log space: metadata-only operations whose entries stay live (long directory
/// entries, big extended attributes) fill the pool without any file data.
#[test]
fn log_space_exhaustion_by_metadata() {
    let fs = fresh_sim(1 << 20, 2);
    let root = fs.root();
    let start = fs.statfs();
    let d = fs.mkdir(root, b"names", 0o755, 0, 0).unwrap().ino;
    let x = fs.create(root, b"xattrs", 0o644, 0, 0).unwrap().ino;
    let mut xattrs: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut hard = Vec::new();
    let mut i = 0u64;
    // Alternate: a hard link with a 255-byte name, a 3000-byte xattr.
    let mut links_full = false;
    let mut xattrs_full = false;
    while !(links_full && xattrs_full) {
        i += 1;
        if !links_full {
            let mut name = format!("{i:08}-").into_bytes();
            name.resize(255, b'n');
            let before = fs.statfs();
            match fs.link(x, d, &name) {
                Ok(_) => hard.push(name),
                Err(Error::NoSpace) => {
                    assert_eq!(fs.statfs(), before);
                    links_full = true;
                }
                Err(e) => panic!("link: {e}"),
            }
        }
        if !xattrs_full {
            let name = format!("user.k{i}").into_bytes();
            let value = pattern(i, 0, 3000);
            let before = fs.statfs();
            match fs.setxattr(x, &name, &value, XattrSet::Create) {
                Ok(()) => {
                    xattrs.insert(name, value);
                }
                Err(Error::NoSpace) => {
                    assert_eq!(fs.statfs(), before);
                    assert!(matches!(fs.getxattr(x, &name), Err(Error::NoAttr)));
                    xattrs_full = true;
                }
                Err(e) => panic!("setxattr: {e}"),
            }
        }
    }
    assert!(hard.len() > 50 && xattrs.len() > 50, "{} links, {} xattrs", hard.len(), xattrs.len());
    assert!(fs.statfs().bavail <= 1);
    assert_eq!(fs.getattr(x).unwrap().nlink as usize, hard.len() + 1);
    let check = |fs: &Fs<SimMedium>, ctx: &str| {
        let names: Vec<Vec<u8>> = fs.list_dir(d).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names.len(), hard.len(), "{ctx}");
        let got: BTreeMap<Vec<u8>, Vec<u8>> = fs
            .listxattr(x)
            .unwrap()
            .into_iter()
            .map(|k| (k.clone(), fs.getxattr(x, &k).unwrap()))
            .collect();
        assert!(got == xattrs, "{ctx}: xattrs differ");
        assert_fsck_clean(fs, ctx);
    };
    check(&fs, "full of metadata");
    let fs = remount(fs, Remount::CrashDurable);
    check(&fs, "full of metadata, after a crash");
    let fs = remount(fs, Remount::Clean);
    check(&fs, "full of metadata, after a clean remount");
    // Remove it all (on the full pool), compact, and the space is back.
    for n in &hard {
        fs.unlink(d, n).unwrap_or_else(|e| panic!("unlink on a full pool: {e}"));
    }
    for k in xattrs.keys() {
        fs.removexattr(x, k).unwrap_or_else(|e| panic!("removexattr on a full pool: {e}"));
    }
    fs.compact(d).unwrap();
    fs.compact(x).unwrap();
    let end = fs.statfs();
    assert!(end.bfree + 8 >= start.bfree, "space not reclaimed: {start:?} -> {end:?}");
    assert_fsck_clean(&fs, "emptied");
    // And reusable for data.
    let big = pattern(5, 0, (end.bavail as usize - 16) * 4096);
    fs.write(x, 0, &big).unwrap();
    let fs = remount(fs, Remount::CrashCurrent);
    assert!(fs.read_all(x).unwrap() == big);
}
