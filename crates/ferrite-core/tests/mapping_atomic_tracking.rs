//! An atomic mapping's commit asks the kernel which pages were stored to (userfaultfd
//! write protection and `PAGEMAP_SCAN`, Linux 6.7+) instead of comparing every page,
//! while that is cheaper; these tests check that no store is ever missed: against a
//! model of the file through tracked and comparing commits, and with another thread
//! storing while commits run.
#![allow(unsafe_code)]

use ferrite_core::*;

const PG: usize = 4096;
const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

fn shm_pool(size: u64) -> (tempfile::TempDir, Fs<MmapMedium>) {
    let dir = tempfile::Builder::new().prefix("ferrite-track").tempdir_in("/dev/shm").unwrap();
    let m = MmapMedium::create(&dir.path().join("pool"), size, &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions { shards: 2, ..Default::default() }).unwrap();
    (dir, fs)
}

fn slice<'a>(addr: usize, len: usize) -> &'a mut [u8] {
    // SAFETY: the tests only name ranges of live mappings they made.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

/// A file of `pages` pages, and an atomic mapping of all of it.
fn mapped(fs: &Fs<MmapMedium>, pages: usize) -> (u64, usize, Vec<u8>) {
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let content: Vec<u8> = (0..pages * PG).map(|i| (i * 13 % 251) as u8).collect();
    fs.write(f, 0, &content).unwrap();
    let a = fs.mmap_atomic(f, pages * PG, RW, 0).unwrap();
    (f, a, content)
}

/// A mapping starts comparing; a commit that finds few pages changed turns
/// tracking on for the next.
fn tracking_on(fs: &Fs<MmapMedium>, a: usize, pages: usize) {
    assert_eq!(fs.atomic_tracked(a), Some(false), "a new mapping compares");
    fs.persist_atomic(a, pages * PG).unwrap().unwrap();
    fs.persist_atomic(a, pages * PG).unwrap().unwrap();
    assert_eq!(
        fs.atomic_tracked(a),
        Some(true),
        "this kernel (6.7+) tracks stores; set FERRITE_WRITE_TRACKING=0 only to compare"
    );
}

/// Random stores and commits of random page ranges, checked after each commit
/// against a model: the file holds, for each page committed, the mapping's bytes
/// at that commit, and its old bytes elsewhere. Rounds that store to many pages
/// turn tracking off and rounds that store to few turn it back on; the test
/// insists on seeing both.
#[test]
fn tracked_and_comparing_commits_match_a_model() {
    let (_d, fs) = shm_pool(128 << 20);
    let pages = 256;
    let (f, a, mut model) = mapped(&fs, pages);
    tracking_on(&fs, a, pages);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut rnd = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    let (mut tracked_rounds, mut comparing_rounds) = (0, 0);
    for round in 0..400 {
        let tracked = fs.atomic_tracked(a).unwrap();
        if tracked {
            tracked_rounds += 1;
        } else {
            comparing_rounds += 1;
        }
        // Mostly a few pages; every 25th round a third of the mapping.
        let stores = if round % 25 == 24 { pages / 3 } else { 1 + rnd(4) };
        for _ in 0..stores {
            let off = rnd(pages * PG - 8);
            let v = (round as u64 + 1).wrapping_mul(0x0101_0101_0101_0101) ^ off as u64;
            slice(a + off, 8).copy_from_slice(&v.to_le_bytes());
        }
        // Sometimes a store of the bytes a page already has (no change to commit).
        if round % 7 == 3 {
            let at = (a + rnd(pages) * PG) as *mut u64;
            // SAFETY: an aligned load and store of the live mapping (volatile: a
            // plain store of the value just loaded is optimized away).
            unsafe { std::ptr::write_volatile(at, std::ptr::read_volatile(at)) };
        }
        // Commit the whole mapping, or a range of pages of it.
        let (p0, p1) = if round % 3 == 0 {
            let p0 = rnd(pages);
            (p0, (p0 + 1 + rnd(pages - p0)).min(pages))
        } else {
            (0, pages)
        };
        fs.persist_atomic(a + p0 * PG, (p1 - p0) * PG).unwrap().unwrap();
        model[p0 * PG..p1 * PG].copy_from_slice(&slice(a + p0 * PG, (p1 - p0) * PG)[..]);
        assert!(fs.read_all(f).unwrap() == model, "round {round} (tracked: {tracked})");
    }
    assert!(tracked_rounds > 100 && comparing_rounds > 0, "{tracked_rounds} / {comparing_rounds}");
    // What was never committed: stores after the last commit.
    fs.munmap_file(a, pages * PG).unwrap().unwrap();
    assert_eq!(fs.open_count(f), 0);
    assert!(fs.fsck().unwrap().is_clean());
}

/// A thread keeps storing while the main thread commits; once it stops, one more
/// commit must leave the file equal to the mapping. A store that landed between a
/// scan and the protection it restored, and was reported by neither that scan nor
/// the next, would be missing.
#[test]
fn stores_racing_commits_are_never_lost() {
    let (_d, fs) = shm_pool(128 << 20);
    let pages = 128;
    let (f, a, _) = mapped(&fs, pages);
    tracking_on(&fs, a, pages);
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let stop = &stop;
        s.spawn(move || {
            let mut x = 12345u64;
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                // A few pages only, so that tracking stays on.
                let p = (x % 6) as usize * 17;
                let off = p * PG + (x >> 32) as usize % (PG / 8) * 8;
                n += 1;
                // SAFETY: an aligned 8-byte store into the live mapping.
                unsafe { std::ptr::write_volatile((a + off) as *mut u64, n) };
            }
        });
        for _ in 0..3000 {
            fs.persist_atomic(a, pages * PG).unwrap().unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(fs.atomic_tracked(a), Some(true), "few pages stored to: tracking stayed on");
    fs.persist_atomic(a, pages * PG).unwrap().unwrap();
    assert!(fs.read_all(f).unwrap()[..] == slice(a, pages * PG)[..], "a store was lost");
    fs.munmap_file(a, pages * PG).unwrap().unwrap();
}

/// Small and read-only atomic mappings compare (tracking would cost more than it
/// saves, or nothing can change).
#[test]
fn small_and_read_only_mappings_compare() {
    let (_d, fs) = shm_pool(64 << 20);
    let (f, a, _) = mapped(&fs, 8);
    assert_eq!(fs.atomic_tracked(a), Some(false));
    slice(a + PG, 3).copy_from_slice(b"abc");
    fs.persist_atomic(a, 8 * PG).unwrap().unwrap();
    assert_eq!(&fs.read_all(f).unwrap()[PG..PG + 3], b"abc");
    let r = fs.mmap_atomic(f, 8 * PG, libc::PROT_READ, 0).unwrap();
    assert_eq!(fs.atomic_tracked(r), Some(false));
    fs.munmap_file(r, 8 * PG).unwrap().unwrap();
    fs.munmap_file(a, 8 * PG).unwrap().unwrap();
    assert_eq!(fs.atomic_tracked(a), None, "unmapped");
}

/// A program that stores the bytes its pages already hold into every page looks
/// unchanged to the comparison (which would turn tracking on) and stored-to to the
/// kernel (which turns it off). Regression: without the doubling wait, tracking
/// was turned on again after each comparison, and every second commit paid a
/// fault per page (about 7x the comparison's time for a 1 MiB mapping).
#[test]
fn storing_unchanged_bytes_everywhere_does_not_flip_tracking_at_each_commit() {
    let (_d, fs) = shm_pool(64 << 20);
    let pages = 256;
    let (f, a, content) = mapped(&fs, pages);
    tracking_on(&fs, a, pages);
    let mut tracked = 0;
    for _ in 0..300 {
        if fs.atomic_tracked(a).unwrap() {
            tracked += 1;
        }
        for p in 0..pages {
            let at = (a + p * PG) as *mut u64;
            // SAFETY: an aligned 8-byte load and store of the live mapping
            // (volatile: a plain store of the value just loaded is optimized away).
            unsafe { std::ptr::write_volatile(at, std::ptr::read_volatile(at)) };
        }
        fs.persist_atomic(a, pages * PG).unwrap().unwrap();
    }
    // Attempts after 1, 2, 4, ... 128 waits fit in 300 commits: 8 or 9 of them.
    assert!((1..=12).contains(&tracked), "{tracked} tracked commits of 300");
    assert!(fs.read_all(f).unwrap() == content, "nothing changed");
    fs.munmap_file(a, pages * PG).unwrap().unwrap();
}

/// A tracked commit that fails (here EBUSY: the file is DAX-mapped, its blocks may
/// not move) has protected its pages again; the next commit must still find them.
/// Regression: it kept tracking, no later scan reported the pages, and the store
/// was never committed.
#[test]
fn a_failed_tracked_commit_leaves_its_pages_for_the_next() {
    let (_d, fs) = shm_pool(64 << 20);
    let pages = 64;
    let (f, a, mut model) = mapped(&fs, pages);
    tracking_on(&fs, a, pages);
    slice(a + 5 * PG + 8, 4).copy_from_slice(b"kept");
    fs.dax_pin(f, 0, PG as u64).unwrap();
    let busy = fs.persist_atomic(a, pages * PG).unwrap();
    assert_eq!(busy.err().map(|e| e.errno()), Some(libc::EBUSY), "the file is DAX-mapped");
    fs.dax_unpin(f).unwrap();
    fs.persist_atomic(a, pages * PG).unwrap().unwrap();
    model[5 * PG + 8..5 * PG + 12].copy_from_slice(b"kept");
    assert!(fs.read_all(f).unwrap() == model, "the store reached the file");
    fs.munmap_file(a, pages * PG).unwrap().unwrap();
}
