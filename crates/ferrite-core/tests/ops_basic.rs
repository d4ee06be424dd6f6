//! Basic behaviour of every operation on a simulated pool, with remounts.

use ferrite_core::*;

fn fresh(size: u64) -> Fs<SimMedium> {
    Fs::mkfs(SimMedium::new(size), &MkfsOptions { shards: 2, ..Default::default() }).unwrap()
}

fn remount(fs: Fs<SimMedium>, clean: bool) -> Fs<SimMedium> {
    let m = if clean { fs.unmount().unwrap() } else { fs.crash() };
    // A crash leaves only what is durable.
    let m = if clean { m } else { SimMedium::from_image(m.durable_image()) };
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    assert_eq!(fs.mount_report().clean, clean);
    let r = fs.fsck().unwrap();
    assert!(r.is_clean(), "{:#?}", r.errors);
    fs
}

#[test]
fn files_dirs_links_and_remount() {
    let fs = fresh(8 << 20);
    let root = fs.root();
    let d = fs.mkdir(root, b"dir", 0o755, 1, 2).unwrap();
    assert_eq!(d.nlink, 2);
    assert_eq!(fs.getattr(root).unwrap().nlink, 3);
    let f = fs.create(d.ino, b"f", 0o644, 1, 2).unwrap();
    assert!(matches!(fs.create(d.ino, b"f", 0o644, 1, 2), Err(Error::Exists)));
    fs.write(f.ino, 0, b"hello").unwrap();
    fs.write(f.ino, 10000, &[7u8; 5000]).unwrap();
    let mut buf = vec![0u8; 20000];
    let n = fs.read(f.ino, 0, &mut buf).unwrap();
    assert_eq!(n, 15000);
    assert_eq!(&buf[..5], b"hello");
    assert!(buf[5..10000].iter().all(|&b| b == 0));
    assert!(buf[10000..15000].iter().all(|&b| b == 7));
    fs.link(f.ino, root, b"hard").unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 2);
    fs.symlink(root, b"sl", b"dir/f", 0, 0).unwrap();
    assert_eq!(fs.resolve(b"/sl", true).unwrap(), f.ino);
    fs.setxattr(f.ino, b"user.k", b"v", XattrSet::Any).unwrap();
    let fs = remount(fs, true);
    assert_eq!(fs.read_all(fs.resolve(b"/hard", true).unwrap()).unwrap().len(), 15000);
    assert_eq!(fs.getxattr(f.ino, b"user.k").unwrap(), b"v");
    let fs = remount(fs, false);
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 2);
    fs.unlink(root, b"hard").unwrap();
    fs.rename(d.ino, b"f", root, b"g", RenameFlags::default()).unwrap();
    assert!(matches!(fs.rmdir(root, b"dir"), Ok(())));
    let fs = remount(fs, false);
    assert_eq!(fs.getattr(fs.resolve(b"/g", true).unwrap()).unwrap().size, 15000);
    assert!(fs.resolve(b"/dir", true).is_err());
}

#[test]
fn overwrite_keeps_log_bounded() {
    let fs = fresh(8 << 20);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap();
    let page = vec![1u8; 4096];
    for i in 0..5000u32 {
        let mut p = page.clone();
        p[0] = i as u8;
        fs.write(f.ino, 0, &p).unwrap();
        fs.write(f.ino, 100, &i.to_le_bytes()).unwrap();
    }
    assert!(fs.log_pages(f.ino).unwrap() <= 4, "log pages {}", fs.log_pages(f.ino).unwrap());
    let fs = remount(fs, false);
    let v = fs.read_all(f.ino).unwrap();
    assert_eq!(&v[100..104], &4999u32.to_le_bytes());
    assert_eq!(v[0], (4999u32) as u8);
}

/// Small appends are embedded in the log; the append that completes a page folds
/// the page's overlays into a data page, so a log compacted after many appends holds
/// one WRITE entry per page and nothing else (before, the last overlays of every
/// page stayed in the log for good: about 1.7 KiB of log per 4 KiB of data).
#[test]
fn appends_leave_no_overlays_behind() {
    let fs = fresh(16 << 20);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let mut want = Vec::new();
    for i in 0..64 * 50u32 {
        let chunk = [i as u8; 64];
        fs.append(f, &chunk).unwrap();
        want.extend_from_slice(&chunk);
    }
    fs.compact(f).unwrap();
    // 50 WRITE entries and a SETATTR fit in two pages.
    assert!(fs.log_pages(f).unwrap() <= 2, "log pages {}", fs.log_pages(f).unwrap());
    let fs = remount(fs, false);
    assert!(fs.read_all(f).unwrap() == want);
}

#[test]
fn create_delete_churn_keeps_dir_log_bounded() {
    let fs = fresh(8 << 20);
    let root = fs.root();
    for i in 0..5000 {
        let name = format!("file{i}");
        fs.create(root, name.as_bytes(), 0o644, 0, 0).unwrap();
        fs.unlink(root, name.as_bytes()).unwrap();
    }
    assert!(fs.log_pages(root).unwrap() <= 6, "{}", fs.log_pages(root).unwrap());
    remount(fs, false);
}

#[test]
fn enospc_then_delete_and_reuse() {
    let fs = fresh(1 << 20);
    let f = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap();
    let chunk = vec![9u8; 64 * 1024];
    let mut off = 0u64;
    loop {
        match fs.write(f.ino, off, &chunk) {
            Ok(_) => off += chunk.len() as u64,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(off > 0);
    let v = fs.read_all(f.ino).unwrap();
    assert_eq!(v.len() as u64, off);
    assert!(v.iter().all(|&b| b == 9));
    // Metadata operations may still fit; data does not.
    if let Ok(b) = fs.create(fs.root(), b"b", 0o644, 0, 0) {
        assert!(matches!(fs.write(b.ino, 0, &chunk), Err(Error::NoSpace)));
        fs.unlink(fs.root(), b"b").unwrap();
    }
    fs.unlink(fs.root(), b"a").unwrap();
    let g = fs.create(fs.root(), b"c", 0o644, 0, 0).unwrap();
    fs.write(g.ino, 0, &chunk).unwrap();
    remount(fs, true);
}

/// Regression: rename into a directory that was removed while open (nlink 0) used to
/// add a name to it; Linux refuses with ENOENT (found by the FUSE differential test's
/// review; the kernel shields FUSE callers, the library must shield the others).
#[test]
fn rename_into_a_removed_open_directory_is_enoent() {
    let fs = fresh(8 << 20);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap();
    fs.create(root, b"f", 0o644, 0, 0).unwrap();
    fs.open(d.ino).unwrap();
    fs.rmdir(root, b"d").unwrap();
    assert!(matches!(
        fs.rename(root, b"f", d.ino, b"g", RenameFlags::default()),
        Err(Error::NotFound)
    ));
    assert!(fs.lookup(root, b"f").is_ok());
    fs.release(d.ino).unwrap();
    remount(fs, true);
}

/// lseek's SEEK_DATA / SEEK_HOLE from the extent map, page granularity (as tmpfs):
/// written pages and embedded small writes are data, never-written pages and
/// punched ones are holes, the end of the file is a hole, ENXIO at or past it.
#[test]
fn seek_data_and_hole_follow_the_extent_map() {
    let fs = fresh(16 << 20);
    let f = fs.create(fs.root(), b"sparse", 0o644, 0, 0).unwrap().ino;
    const P: u64 = 4096;
    fs.write(f, 0, &[1u8; 4096]).unwrap(); // page 0: a copy-on-write page
    fs.write(f, 5 * P + 10, b"small").unwrap(); // page 5: embedded in the log
    fs.write(f, 9 * P, &[2u8; 3 * 4096]).unwrap(); // pages 9-11
    fs.setattr(f, &SetAttr { size: Some(20 * P), ..Default::default() }).unwrap();
    let punch = FallocMode {
        keep_size: true,
        punch_hole: true,
        zero_range: false,
        shift: None,
        unshare: false,
    };
    fs.fallocate(f, punch, 10 * P, P).unwrap(); // page 10 becomes a hole
    let data = |o: u64| fs.seek_data(f, o, false).map_err(|e| e.errno());
    let hole = |o: u64| fs.seek_data(f, o, true).map_err(|e| e.errno());
    assert_eq!(data(0), Ok(0));
    assert_eq!(data(100), Ok(100));
    assert_eq!(hole(0), Ok(P));
    assert_eq!(data(P), Ok(5 * P));
    assert_eq!(hole(5 * P + 3), Ok(6 * P));
    assert_eq!(data(6 * P), Ok(9 * P));
    assert_eq!(hole(9 * P), Ok(10 * P));
    assert_eq!(data(10 * P), Ok(11 * P));
    assert_eq!(hole(11 * P), Ok(12 * P));
    assert_eq!(data(12 * P), Err(libc::ENXIO), "no data after page 11");
    assert_eq!(hole(15 * P), Ok(15 * P));
    assert_eq!(hole(20 * P), Err(libc::ENXIO));
    assert_eq!(data(20 * P), Err(libc::ENXIO));
    // The end of the file is a hole even inside a data page.
    let g = fs.create(fs.root(), b"dense", 0o644, 0, 0).unwrap().ino;
    fs.write(g, 0, &[3u8; 6000]).unwrap();
    assert_eq!(fs.seek_data(g, 0, true).unwrap(), 6000);
    assert!(matches!(fs.seek_data(fs.root(), 0, true), Err(Error::IsDir)));
}
