//! DAX mappings of files over a real pool file: the program's loads and stores are
//! the file, persisting is flush + fence, unmapping ends the pin, a grown mapping
//! keeps its bytes, and a revoked mapping faults instead of storing to the pool.
#![allow(unsafe_code)]

use ferrite_core::*;

const PG: usize = 4096;

fn shm_pool(size: u64) -> (tempfile::TempDir, std::path::PathBuf, Fs<MmapMedium>) {
    let dir = tempfile::Builder::new().prefix("ferrite-map").tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("pool");
    let m = MmapMedium::create(&path, size, &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions { shards: 2, ..Default::default() }).unwrap();
    (dir, path, fs)
}

fn slice<'a>(addr: usize, len: usize) -> &'a mut [u8] {
    // SAFETY: the tests only name ranges of live mappings they made.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

/// The tests change this process's address space around their mappings (one
/// frees the addresses after a mapping, one blocks them): one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn loads_and_stores_are_the_file() {
    let _s = serial();
    let (_d, path, fs) = shm_pool(64 << 20);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let content: Vec<u8> = (0..3 * PG + 100).map(|i| (i * 7 % 251) as u8).collect();
    fs.write(f, 0, &content).unwrap();
    fs.write(f, 10, b"embedded").unwrap();
    let mut want = content.clone();
    want[10..18].copy_from_slice(b"embedded");
    let a = fs.mmap_file(f, 0, 4 * PG, RW, libc::MAP_SHARED, 0, None).unwrap();
    assert_eq!(&slice(a, want.len())[..], &want[..], "loads see the file");
    assert_eq!(slice(a + want.len(), 4 * PG - want.len()), &vec![0u8; 4 * PG - want.len()][..]);
    slice(a + 5000, 11).copy_from_slice(b"stored here");
    assert_eq!(fs.persist_mapped(a + 5000, 11), Some(true));
    want[5000..5011].copy_from_slice(b"stored here");
    assert_eq!(fs.read_all(f).unwrap(), want, "reads see the stores");
    fs.write(f, PG as u64 * 2, b"write(2) in place").unwrap();
    assert_eq!(&slice(a + 2 * PG, 17)[..], b"write(2) in place", "the mapping sees writes");
    want[2 * PG..2 * PG + 17].copy_from_slice(b"write(2) in place");
    assert_eq!(fs.persist_mapped(0x1000, 10), None, "not a DAX mapping");
    assert_eq!(fs.persist_mapped(a + 4 * PG - 8, 16), Some(false), "runs past the mapping");
    assert_eq!(fs.persist_mapped(a - 8, 8 + 4 * PG), Some(false), "starts before it");
    // Part of it goes: the pin stays; the rest goes: the pin ends.
    fs.munmap_file(a, PG).unwrap().unwrap();
    assert!(fs.dax_pinned(f).unwrap());
    assert!(fs.munmap_file(a, PG).is_none(), "already gone");
    fs.munmap_file(a + PG, 3 * PG).unwrap().unwrap();
    assert!(!fs.dax_pinned(f).unwrap());
    assert_eq!(fs.file_map_count(), 0);
    let m = fs.unmount().unwrap();
    drop(m);
    let fs =
        Fs::mount(MmapMedium::open(&path, &MapOptions::default()).unwrap(), &Default::default())
            .unwrap();
    assert_eq!(fs.read_all(f).unwrap(), want, "the stores are in the pool");
    assert!(fs.fsck().unwrap().is_clean());
}

#[test]
fn a_mapping_grows_with_mremap_and_keeps_its_bytes() {
    let _s = serial();
    let (_d, _path, fs) = shm_pool(64 << 20);
    let f = fs.create(fs.root(), b"log", 0o644, 0, 0).unwrap().ino;
    fs.fallocate(f, FallocMode::default(), 0, 2 * PG as u64).unwrap();
    let a = fs.mmap_file(f, 0, 2 * PG, RW, libc::MAP_SHARED, 0, None).unwrap();
    slice(a + PG + 1, 4).copy_from_slice(b"keep");
    fs.persist_mapped(a, 2 * PG);
    // FLEX's growth: fallocate, then mremap.
    fs.fallocate(f, FallocMode::default(), 0, 8 * PG as u64).unwrap();
    let b = fs.mremap_file(a, 2 * PG, 8 * PG, true).unwrap().unwrap();
    assert_eq!(&slice(b + PG + 1, 4)[..], b"keep");
    slice(b + 7 * PG, 3).copy_from_slice(b"end");
    fs.persist_mapped(b + 7 * PG, 3);
    assert_eq!(&fs.read_all(f).unwrap()[7 * PG..7 * PG + 3], b"end");
    assert_eq!(fs.file_map_count(), 1, "the old mapping went");
    let c = fs.mremap_file(b, 8 * PG, 4 * PG, false).unwrap().unwrap();
    assert_eq!(c, b, "shrinking stays in place");
    fs.munmap_file(c, 4 * PG).unwrap().unwrap();
    assert!(!fs.dax_pinned(f).unwrap());
}

#[test]
fn a_revoked_mapping_faults_instead_of_storing() {
    let _s = serial();
    let (_d, _path, fs) = shm_pool(64 << 20);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[5u8; PG]).unwrap();
    let a = fs.mmap_file(f, 0, PG, RW, libc::MAP_SHARED, 0, None).unwrap();
    fs.revoke_file_maps();
    assert_eq!(fs.file_map_count(), 0);
    // SAFETY: the child only touches the revoked page, then exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let v = unsafe { std::ptr::read_volatile(a as *const u8) };
        unsafe { libc::_exit(v as i32) };
    }
    let mut status = 0;
    // SAFETY: waiting for our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFSIGNALED(status), "the child was not killed: {status:#x}");
    assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
}

#[test]
fn bad_requests_are_errors_and_pin_nothing() {
    let _s = serial();
    let (_d, _path, fs) = shm_pool(64 << 20);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[1u8; PG]).unwrap();
    let bad = |r: Result<usize>| r.unwrap_err().errno();
    assert_eq!(bad(fs.mmap_file(f, 0, PG, RW, libc::MAP_SHARED, 100, None)), libc::EINVAL);
    assert_eq!(bad(fs.mmap_file(f, 0, 0, RW, libc::MAP_SHARED, 0, None)), libc::EINVAL);
    assert_eq!(
        bad(fs.mmap_file(f, 0, PG, RW, libc::MAP_SHARED | libc::MAP_GROWSDOWN, 0, None)),
        libc::EINVAL
    );
    assert_eq!(bad(fs.mmap_file(f, 0, PG, 0x100, libc::MAP_SHARED, 0, None)), libc::EINVAL);
    assert_eq!(bad(fs.mmap_file(fs.root(), 0, PG, RW, libc::MAP_SHARED, 0, None)), libc::EISDIR);
    // MAP_FIXED_NOREPLACE over a mapping that exists: EEXIST, as the kernel.
    let a = fs.mmap_file(f, 0, PG, RW, libc::MAP_SHARED, 0, None).unwrap();
    let r = fs.mmap_file(f, a, PG, RW, libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE, 0, None);
    assert_eq!(bad(r), libc::EEXIST);
    fs.munmap_file(a, PG).unwrap().unwrap();
    assert!(!fs.dax_pinned(f).unwrap(), "no refused request left a pin");
    assert_eq!(fs.open_count(f), 0);
}

/// Lines of /proc/self/maps naming `path`.
fn maps_of(path: &std::path::Path) -> usize {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().filter(|l| l.ends_with(path.to_str().unwrap())).count()
}

#[test]
fn a_kept_descriptor_is_held_while_the_mapping_lives() {
    let _s = serial();
    use std::os::fd::AsFd;
    let (d, _path, fs) = shm_pool(64 << 20);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, &[1u8; 2 * PG]).unwrap();
    let other = d.path().join("held");
    let open =
        || std::fs::File::options().read(true).write(true).create(true).truncate(true).open(&other);
    let h = open().unwrap();
    let a = fs.mmap_file(f, 0, 2 * PG, RW, libc::MAP_SHARED, 0, Some(h.as_fd())).unwrap();
    drop(h);
    assert_eq!(maps_of(&other), 1, "the file is held by a mapping of it");
    fs.munmap_file(a, PG).unwrap().unwrap();
    assert_eq!(maps_of(&other), 1, "held while part of the mapping lives");
    fs.munmap_file(a + PG, PG).unwrap().unwrap();
    assert_eq!(maps_of(&other), 0, "let go with the mapping");
    // A refused request holds nothing.
    let h = open().unwrap();
    assert!(fs.mmap_file(f, 0, PG, RW, libc::MAP_SHARED, 1, Some(h.as_fd())).is_err());
    assert!(fs.mmap_file(fs.root(), 0, PG, RW, libc::MAP_SHARED, 0, Some(h.as_fd())).is_err());
    assert_eq!(maps_of(&other), 0);
}

#[test]
fn growth_maps_the_new_pages_in_place_or_moved() {
    let _s = serial();
    let (_d, _path, fs) = shm_pool(64 << 20);
    let f = fs.create(fs.root(), b"log", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"head").unwrap();
    // Two pages mapped, one past the end of file (inaccessible until it grows),
    // at the start of 8 pages of addresses this test holds.
    // SAFETY: a new inaccessible anonymous range.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8 * PG,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as usize;
    let fixed = libc::MAP_SHARED | libc::MAP_FIXED;
    let a = fs.mmap_file(f, r, 2 * PG, RW, fixed, 0, None).unwrap();
    assert_eq!(a, r);
    slice(a + 100, 5).copy_from_slice(b"first");
    // Grow in place: the addresses after the mapping are free (made so here).
    // SAFETY: the rest of the range reserved above.
    unsafe { libc::munmap((a + 2 * PG) as *mut _, 6 * PG) };
    fs.fallocate(f, FallocMode::default(), 0, 8 * PG as u64).unwrap();
    let b = fs.mremap_file(a, 2 * PG, 8 * PG, false).unwrap().unwrap();
    assert_eq!(b, a, "grown in place");
    slice(b + PG + 1, 6).copy_from_slice(b"second");
    slice(b + 7 * PG, 5).copy_from_slice(b"third");
    assert_eq!(fs.persist_mapped(b, 8 * PG), Some(true));
    let data = fs.read_all(f).unwrap();
    assert_eq!(&data[..4], b"head");
    assert_eq!(&data[100..105], b"first");
    assert_eq!(&data[PG + 1..PG + 7], b"second", "the page past EOF became the file's");
    assert_eq!(&data[7 * PG..7 * PG + 5], b"third");
    // Block the addresses after it: growth moves it, with its bytes.
    // SAFETY: an inaccessible anonymous page right after the mapping.
    let blocker = unsafe {
        libc::mmap(
            (b + 8 * PG) as *mut _,
            PG,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    // (Where something is mapped there already, that blocks it as well.)
    let ours = blocker as usize == b + 8 * PG;
    fs.fallocate(f, FallocMode::default(), 0, 16 * PG as u64).unwrap();
    assert!(matches!(fs.mremap_file(b, 8 * PG, 16 * PG, false), Some(Err(_))), "no room");
    let c = fs.mremap_file(b, 8 * PG, 16 * PG, true).unwrap().unwrap();
    assert_ne!(c, b, "moved");
    assert_eq!(&slice(c + 100, 5)[..], b"first");
    assert_eq!(&slice(c + 7 * PG, 5)[..], b"third");
    slice(c + 15 * PG, 4).copy_from_slice(b"last");
    fs.persist_mapped(c + 15 * PG, 4);
    assert_eq!(&fs.read_all(f).unwrap()[15 * PG..15 * PG + 4], b"last");
    assert!(!fs.is_file_mapped(b, 8 * PG), "the old addresses are not a mapping any more");
    // Shrink, then grow again.
    assert_eq!(fs.mremap_file(c, 16 * PG, 4 * PG, false).unwrap().unwrap(), c);
    let d = fs.mremap_file(c, 4 * PG, 12 * PG, true).unwrap().unwrap();
    assert_eq!(&slice(d + 7 * PG, 5)[..], b"third");
    assert_eq!(fs.file_map_count(), 1);
    fs.munmap_file(d, 12 * PG).unwrap().unwrap();
    assert!(!fs.dax_pinned(f).unwrap(), "one pin per mapping, through every growth");
    assert_eq!(fs.open_count(f), 0);
    assert!(fs.fsck().unwrap().is_clean());
    if ours {
        // SAFETY: the blocker page made above.
        unsafe { libc::munmap(blocker, PG) };
    }
}

#[test]
fn an_atomic_mapping_commits_its_changed_pages_at_persist() {
    let _s = serial();
    let (_d, _path, fs) = shm_pool(64 << 20);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let old: Vec<u8> = (0..4 * PG).map(|i| (i % 199) as u8).collect();
    fs.write(f, 0, &old).unwrap();
    let a = fs.mmap_atomic(f, 4 * PG, RW, 0).unwrap();
    assert_eq!(&slice(a, 4 * PG)[..], &old[..], "the mapping starts as the file");
    slice(a + 10, 5).copy_from_slice(b"first");
    slice(a + 3 * PG + 7, 6).copy_from_slice(b"second");
    assert!(fs.read_all(f).unwrap() == old, "nothing reaches the file before persist");
    fs.persist_atomic(a, 4 * PG).unwrap().unwrap();
    let mut new = old.clone();
    new[10..15].copy_from_slice(b"first");
    new[3 * PG + 7..3 * PG + 13].copy_from_slice(b"second");
    assert!(fs.read_all(f).unwrap() == new, "both pages committed");
    // Another writer's page is not overwritten by pages the mapping did not change.
    fs.write(f, PG as u64, b"other writer").unwrap();
    slice(a + 2 * PG, 5).copy_from_slice(b"third");
    fs.persist_atomic(a + 2 * PG, 5).unwrap().unwrap();
    let got = fs.read_all(f).unwrap();
    assert_eq!(&got[PG..PG + 12], b"other writer");
    assert_eq!(&got[2 * PG..2 * PG + 5], b"third");
    assert_eq!(errno(fs.persist_atomic(a + 3 * PG, 2 * PG).unwrap()), libc::EINVAL);
    assert!(fs.persist_atomic(0x1000, 1).is_none(), "not an atomic mapping");
    assert_eq!(errno(fs.munmap_file(a, PG).unwrap()), libc::EINVAL, "part of it");
    assert_eq!(errno(fs.mmap_atomic(f, 5 * PG, RW, 0)), libc::EINVAL, "past the end");
    fs.munmap_file(a, 4 * PG).unwrap().unwrap();
    assert_eq!(fs.open_count(f), 0, "the mapping's handle went with it");
    assert!(fs.fsck().unwrap().is_clean());
}

fn errno<T>(r: Result<T>) -> i32 {
    r.err().map(|e| e.errno()).unwrap_or(0)
}

/// Two threads write from their own mapped persistent buffers at once (the registry
/// lock is not held across a write's commit): every write lands whole and each
/// buffer keeps working after its pages were adopted.
#[test]
fn buffer_writes_from_two_threads_land_whole() {
    let _s = serial();
    let (_d, _p, fs) = shm_pool(256 << 20);
    let files: Vec<u64> = (0..2)
        .map(|k| fs.create(fs.root(), format!("f{k}").as_bytes(), 0o644, 0, 0).unwrap().ino)
        .collect();
    std::thread::scope(|s| {
        for (k, &f) in files.iter().enumerate() {
            let fs = &fs;
            s.spawn(move || {
                let len = 4 * PG;
                let addr = fs.buf_map(len).unwrap();
                for round in 0..60u8 {
                    slice(addr, len).fill(round ^ (k as u8 * 0x55));
                    fs.buf_write(f, (round as u64 % 8) * len as u64, addr, len).unwrap();
                }
                fs.buf_unmap(addr).unwrap();
            });
        }
    });
    for (k, &f) in files.iter().enumerate() {
        let got = fs.read_all(f).unwrap();
        assert_eq!(got.len(), 8 * 4 * PG);
        for (slot, chunk) in got.chunks(4 * PG).enumerate() {
            // The last round that wrote slot `slot` (rounds 52..60 cover 4..8 and 0..4).
            let round = (52..60u8).find(|r| *r as usize % 8 == slot).unwrap();
            let want = round ^ (k as u8 * 0x55);
            assert!(chunk.iter().all(|&b| b == want), "file {k} slot {slot}");
        }
    }
    let r = fs.fsck().unwrap();
    assert!(r.is_clean(), "{:?}", r.errors);
}
