//! Damaged pools: mount and fsck must give a clear error (or mount and let fsck
//! report the damage), never panic or loop.
//!
//! Two kinds of tests:
//! - targeted damage with the specific error asserted: zeroed, flipped or foreign
//!   superblocks (random bytes, a real ext4 image), checksum-valid superblocks with
//!   hostile geometry, a truncated or grown pool file, log-page cycles, a journal
//!   record outside the inode table, bad inode slots, damaged log entries;
//! - seeded random damage (bit flips, random words, zeroed lines) in every region of
//!   clean and crashed pools, each mount + fsck + full read-only walk run under
//!   `catch_unwind`; when fsck calls a damaged pool clean, the pool must also take
//!   new operations without panicking. `FERRITE_DAMAGE_SEEDS` raises the seed count.
//!
//! Invariant of the helpers: a pool image is only ever changed by the damage under
//! test; every probe works on its own copy.

mod common;
use common::*;
use ferrite_core::layout::{logptr, InodeSlot, Superblock, BLOCK, MOUNT_STATE_OFF, SB_SIZE};
use ferrite_core::log::LOG_DATA_END;
use ferrite_core::*;
use std::panic::{catch_unwind, AssertUnwindSafe};

const POOL: u64 = 4 << 20;

/// A pool with some of everything: nested directories, inline and copy-on-write
/// file data, sparse files, long logs (overwrites, a big directory), short and long
/// symlinks, hard links, xattrs, an unlinked-but-open file.
fn populate(fs: &Fs<SimMedium>) {
    let root = fs.root();
    let d = fs.mkdir(root, b"dir", 0o755, 1, 1).unwrap().ino;
    let sub = fs.mkdir(d, b"sub", 0o700, 1, 1).unwrap().ino;
    let small = fs.create(d, b"small", 0o644, 1, 1).unwrap().ino;
    fs.write(small, 0, b"hello, pool").unwrap();
    let big = fs.create(sub, b"big", 0o644, 1, 1).unwrap().ino;
    fs.write(big, 0, &pattern(1, 0, 5 * 4096 + 77)).unwrap();
    fs.write(big, 1 << 20, &pattern(2, 1 << 20, 3000)).unwrap();
    let hot = fs.create(root, b"hot", 0o600, 0, 0).unwrap().ino;
    for i in 0..400u64 {
        fs.write(hot, (i * 100) % 8000, &pattern(i, 0, 300)).unwrap();
    }
    for i in 0..300 {
        let n = format!("entry-{i:04}-with-a-longer-name");
        let f = fs.create(d, n.as_bytes(), 0o644, 0, 0).unwrap().ino;
        if i % 3 == 0 {
            fs.unlink(d, n.as_bytes()).unwrap();
        } else if i % 7 == 0 {
            fs.write(f, 0, n.as_bytes()).unwrap();
        }
    }
    fs.symlink(root, b"short", b"dir/small", 0, 0).unwrap();
    fs.symlink(root, b"long", &b"./".repeat(1500), 0, 0).unwrap();
    fs.link(small, root, b"hard").unwrap();
    fs.setxattr(small, b"user.k", b"value", XattrSet::Any).unwrap();
    fs.setxattr(d, b"trusted.big", &[7u8; 3000], XattrSet::Any).unwrap();
    let orphan = fs.create(root, b"orphan", 0o644, 0, 0).unwrap().ino;
    fs.write(orphan, 0, &[1u8; 9000]).unwrap();
    fs.open(orphan).unwrap();
    fs.unlink(root, b"orphan").unwrap();
    assert_fsck_clean(fs, "populated pool");
}

struct Images {
    /// After a clean unmount.
    clean: Vec<u8>,
    /// After a process crash (dirty: mount recovers from the logs).
    dirty: Vec<u8>,
    geo: ferrite_core::layout::Geometry,
    uuid: [u8; 16],
}

fn images() -> Images {
    let fs = fresh_sim(POOL, 4);
    populate(&fs);
    let geo = *fs.geometry();
    let uuid = fs.superblock().uuid;
    let dirty = fs.crash().current_image();
    let fs = Fs::mount(SimMedium::from_image(dirty.clone()), &MountOptions::default()).unwrap();
    assert_fsck_clean(&fs, "recovered populated pool");
    let clean = fs.unmount().unwrap().current_image();
    Images { clean, dirty, geo, uuid }
}

/// Log pages of every in-use inode, in chain order: (ino, pages).
fn log_chains(
    img: &[u8],
    geo: &ferrite_core::layout::Geometry,
    uuid: &[u8; 16],
) -> Vec<(u64, Vec<u64>)> {
    let m = SimMedium::from_image(img.to_vec());
    let mut out = Vec::new();
    for ino in 1..=geo.ninodes {
        let mut b = [0u8; 64];
        m.read(geo.slot_off(ino), &mut b);
        let slot = InodeSlot::decode(&b);
        if !slot.in_use() {
            continue;
        }
        let seed = ferrite_core::log::seed(uuid, ino, slot.state);
        let w = ferrite_core::log::walk(
            &m,
            geo,
            seed,
            logptr::addr(slot.head),
            logptr::addr(slot.tail),
        )
        .expect("undamaged log walks");
        out.push((ino, w.pages));
    }
    out
}

/// Rewrite inode `ino`'s replica slot from its primary, as a commit would: the
/// image then holds a change made through the proper path, not damage.
fn sync_replica(img: &mut [u8], geo: &ferrite_core::layout::Geometry, ino: u64) {
    let p = geo.slot_off(ino) as usize;
    let r = geo.slot_replica_off(ino).expect("replicas") as usize;
    let rep = ferrite_core::layout::replica_of(&img[p..p + 64]);
    img[r..r + 64].copy_from_slice(&rep);
}

/// Damage inode `ino`'s replica slot too (one byte of its copy).
fn damage_replica(img: &mut [u8], geo: &ferrite_core::layout::Geometry, ino: u64) {
    img[geo.slot_replica_off(ino).expect("replicas") as usize + 9] ^= 0x40;
}

fn put_u64(img: &mut [u8], off: u64, v: u64) {
    img[off as usize..off as usize + 8].copy_from_slice(&v.to_le_bytes());
}

fn get_u64(img: &[u8], off: u64) -> u64 {
    u64::from_le_bytes(img[off as usize..off as usize + 8].try_into().unwrap())
}

/// What happened to a damaged image.
#[derive(Debug)]
enum Probe {
    MountErr(Error),
    /// Mounted; fsck's error count.
    Mounted {
        fsck_errors: usize,
    },
}

/// Mount, fsck and read everything reachable (errors are fine, panics are not).
/// When fsck is clean, also run a few mutations and fsck again.
fn probe(img: Vec<u8>) -> Probe {
    let fs = match Fs::mount(
        SimMedium::from_image(img),
        &MountOptions { workers: 2, ..Default::default() },
    ) {
        Ok(fs) => fs,
        Err(e) => return Probe::MountErr(e),
    };
    let r = fs.fsck().expect("fsck runs on a mounted pool");
    walk_everything(&fs);
    if r.is_clean() {
        mutate(&fs);
        let r2 = fs.fsck().expect("fsck");
        assert!(r2.is_clean(), "fsck-clean damaged pool became inconsistent: {:?}", r2.errors);
        let fs =
            Fs::mount(fs.unmount().expect("unmount"), &MountOptions::default()).expect("remount");
        assert_fsck_clean(&fs, "remount of a fsck-clean damaged pool");
    }
    Probe::Mounted { fsck_errors: r.errors.len() }
}

fn walk_everything<M: Medium>(fs: &Fs<M>) {
    let mut stack = vec![fs.root()];
    let mut seen = std::collections::HashSet::new();
    while let Some(d) = stack.pop() {
        if !seen.insert(d) {
            continue;
        }
        let Ok(entries) = fs.list_dir(d) else { continue };
        for e in entries {
            let _ = fs.getattr(e.ino);
            let _ = fs.listxattr(e.ino).map(|names| {
                for n in names {
                    let _ = fs.getxattr(e.ino, &n);
                }
            });
            match e.ftype {
                FileType::Directory => stack.push(e.ino),
                FileType::Symlink => {
                    let _ = fs.readlink(e.ino);
                }
                FileType::Regular => {
                    let size = fs.getattr(e.ino).map(|a| a.size).unwrap_or(0);
                    let mut buf = vec![0u8; 64 << 10];
                    let mut off = 0;
                    while off < size.min(4 << 20) {
                        match fs.read(e.ino, off, &mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => off += n as u64,
                        }
                    }
                }
                _ => {
                    let _ = fs.read(e.ino, 0, &mut [0u8; 16]);
                }
            }
        }
    }
    let _ = fs.statfs();
}

fn mutate<M: Medium>(fs: &Fs<M>) {
    let root = fs.root();
    if let Ok(a) = fs.create(root, b"after-damage", 0o644, 0, 0) {
        let _ = fs.write(a.ino, 0, &[3u8; 10000]);
        let _ = fs.rename(root, b"after-damage", root, b"renamed", RenameFlags::default());
        let _ = fs.unlink(root, b"renamed");
    }
    if let Ok(d) = fs.lookup_ino(root, b"dir") {
        let _ = fs.unlink(d, b"small");
        let _ = fs.mkdir(d, b"newdir", 0o755, 0, 0);
    }
    if let Ok(h) = fs.lookup_ino(root, b"hot") {
        let _ = fs.write(h, 0, &[9u8; 5000]);
        let _ = fs.setattr(h, &SetAttr { size: Some(10), ..Default::default() });
    }
}

#[track_caller]
fn assert_corrupt(r: Result<Fs<SimMedium>>, needle: &str) {
    match r {
        Ok(_) => panic!("mount succeeded; expected a corruption error mentioning {needle:?}"),
        Err(Error::Corrupt(m)) => {
            assert!(m.contains(needle), "Corrupt({m:?}) does not mention {needle:?}")
        }
        Err(e) => panic!("expected Corrupt(..{needle}..), got {e:?}"),
    }
}

fn mount(img: Vec<u8>) -> Result<Fs<SimMedium>> {
    Fs::mount(SimMedium::from_image(img), &MountOptions::default())
}

// ------------------------------------------------------------ superblock damage

#[test]
fn zeroed_primary_superblock_mounts_from_the_replica_and_is_rewritten() {
    let im = images();
    for base in [&im.clean, &im.dirty] {
        let mut img = base.clone();
        img[..SB_SIZE].fill(0);
        let fs = mount(img).expect("replica superblock is used");
        // The report says which copy was used; mount rewrites the damaged one.
        assert_eq!(fs.mount_report().superblock_copy, 1);
        assert_fsck_clean(&fs, "after the primary superblock was rewritten");
        assert_eq!(fs.read_all(fs.resolve(b"/dir/small", true).unwrap()).unwrap(), b"hello, pool");
        let img = fs.unmount().unwrap().current_image();
        assert_eq!(img[..SB_SIZE], img[BLOCK as usize..BLOCK as usize + SB_SIZE]);
    }
}

#[test]
fn both_superblocks_zeroed_or_foreign() {
    let im = images();
    let mut img = im.clean.clone();
    img[..2 * BLOCK as usize].fill(0);
    assert!(matches!(mount(img), Err(Error::Foreign(_))));
    // Random bytes everywhere.
    let mut rng = Rng(77);
    let img = rng.bytes(POOL as usize);
    assert!(matches!(mount(img), Err(Error::Foreign(_))));
    // All zeros, all ones.
    assert!(matches!(mount(vec![0u8; POOL as usize]), Err(Error::Foreign(_))));
    assert!(matches!(mount(vec![0xffu8; POOL as usize]), Err(Error::Foreign(_))));
    // Too small to hold a superblock at all.
    assert!(matches!(mount(vec![0u8; 4096]), Err(Error::Foreign(_))));
    assert!(matches!(mount(Vec::new()), Err(Error::Foreign(_))));
}

#[test]
fn flipped_superblock_bits() {
    let im = images();
    let mut rng = Rng(5);
    for _ in 0..64 {
        let bit = rng.below(SB_SIZE as u64 * 8) as usize;
        // Primary only: the replica is used.
        let mut img = im.clean.clone();
        img[bit / 8] ^= 1 << (bit % 8);
        let fs = mount(img).expect("replica");
        assert_eq!(fs.mount_report().superblock_copy, 1);
        assert_fsck_clean(&fs, "primary superblock rewritten from the replica");
        // Both copies: a clear corruption error naming the superblock.
        let mut img = im.clean.clone();
        img[bit / 8] ^= 1 << (bit % 8);
        img[BLOCK as usize + bit / 8] ^= 1 << (bit % 8);
        match mount(img) {
            Err(Error::Corrupt(m)) => assert!(m.contains("superblock"), "{m}"),
            Err(Error::Foreign(_)) => {
                assert!(bit < 96, "bit {bit}: only magic/version flips are foreign")
            }
            r => panic!("bit {bit}: {:?}", r.map(|_| ())),
        }
    }
}

/// Checksum-valid superblocks whose fields are hostile: a clear error, no panic,
/// no out-of-bounds access.
#[test]
fn hostile_superblock_fields_with_valid_checksums() {
    let im = images();
    let sb = Superblock::decode(&im.clean[..SB_SIZE]).unwrap();
    type Edit = Box<dyn Fn(&mut Superblock)>;
    let edits: Vec<(&str, Edit)> = vec![
        ("nblocks huge", Box::new(|s| s.nblocks = u64::MAX / 2)),
        (
            "nblocks and size huge",
            Box::new(|s| {
                s.nblocks = 1 << 40;
                s.pool_size = 1 << 52;
            }),
        ),
        (
            "nblocks tiny",
            Box::new(|s| {
                s.nblocks = 3;
                s.pool_size = 3 * BLOCK;
            }),
        ),
        ("ninodes huge", Box::new(|s| s.ninodes = u64::MAX - 3)),
        ("ninodes zero", Box::new(|s| s.ninodes = 0)),
        ("ninodes past the pool", Box::new(|s| s.ninodes = s.nblocks * 64 + 64)),
        ("nshards zero", Box::new(|s| s.nshards = 0)),
        ("nshards huge", Box::new(|s| s.nshards = u32::MAX)),
        ("data_start past the end", Box::new(|s| s.data_start = s.nblocks + 5)),
        ("itable_start 0", Box::new(|s| s.itable_start = 0)),
        ("journal overlaps", Box::new(|s| s.journal_blocks = 1 << 40)),
        ("block size", Box::new(|s| s.block_size = 512)),
        ("inode size", Box::new(|s| s.inode_size = 128)),
        ("root inode", Box::new(|s| s.root_ino = 999_999)),
        ("pool size differs", Box::new(|s| s.pool_size += BLOCK)),
        ("version", Box::new(|s| s.version = ferrite_core::layout::VERSION + 1)),
    ];
    for (what, edit) in edits {
        let mut s = sb;
        edit(&mut s);
        let enc = s.encode();
        let mut img = im.clean.clone();
        img[..SB_SIZE].copy_from_slice(&enc);
        img[BLOCK as usize..BLOCK as usize + SB_SIZE].copy_from_slice(&enc);
        let r = catch_unwind(AssertUnwindSafe(|| mount(img).map(|_| ())));
        match r {
            Err(_) => panic!("{what}: mount panicked"),
            Ok(Ok(())) => panic!("{what}: mount accepted a hostile superblock"),
            Ok(Err(e)) => assert!(
                matches!(
                    e,
                    Error::Corrupt(_)
                        | Error::Foreign(_)
                        | Error::Invalid(_)
                        | Error::Version { .. }
                ),
                "{what}: unclear error {e:?}"
            ),
        }
    }
}

/// A real ext4 file system is recognised as foreign.
#[test]
fn ext4_image_is_foreign() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ext4.img");
    std::fs::File::create(&path).unwrap().set_len(8 << 20).unwrap();
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&path)
        .output()
        .or_else(|_| {
            std::process::Command::new("/usr/sbin/mkfs.ext4").args(["-q", "-F"]).arg(&path).output()
        })
        .expect("mkfs.ext4 (package e2fsprogs, see scripts/apt-packages.txt) runs");
    assert!(out.status.success(), "mkfs.ext4: {}", String::from_utf8_lossy(&out.stderr));
    let m = MmapMedium::open(&path, &MapOptions::default()).unwrap();
    match Fs::mount(m, &MountOptions::default()) {
        Err(Error::Foreign(msg)) => assert!(msg.contains("magic"), "{msg}"),
        r => panic!("ext4 image: {:?}", r.map(|_| ())),
    }
    // mkfs over it works, and the result is a FerriteFS pool.
    let m = MmapMedium::open(&path, &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions::default()).unwrap();
    assert_fsck_clean(&fs, "mkfs over ext4");
}

// --------------------------------------------------------------- pool files

#[test]
fn truncated_or_grown_pool_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    {
        let m = MmapMedium::create(&path, POOL, &MapOptions::default()).unwrap();
        let fs = Fs::mkfs(m, &MkfsOptions::default()).unwrap();
        fs.write_file(b"/a", &[5u8; 100_000], 0o644).unwrap();
        drop(fs.unmount().unwrap());
    }
    let open = || MmapMedium::open(&path, &MapOptions::default());
    for (len, what) in
        [(POOL / 2, "truncated"), (POOL - BLOCK, "truncated"), (POOL + BLOCK, "grown")]
    {
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(len).unwrap();
        match Fs::mount(open().unwrap(), &MountOptions::default()) {
            Err(Error::Corrupt(m)) => assert!(m.contains(what), "{len}: {m}"),
            r => panic!("{len}: {:?}", r.map(|_| ())),
        }
    }
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(BLOCK).unwrap();
    assert!(matches!(Fs::mount(open().unwrap(), &MountOptions::default()), Err(Error::Foreign(_))));
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(0).unwrap();
    match open() {
        Err(Error::Corrupt(m)) => assert!(m.contains("length 0"), "{m}"),
        Err(e) => panic!("empty pool file: {e:?}"),
        Ok(m) => assert!(Fs::mount(m, &MountOptions::default()).is_err()),
    }
    // Back to its size (the tail is now zeros): mounts, and fsck or the data shows it.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(POOL).unwrap();
    assert!(matches!(Fs::mount(open().unwrap(), &MountOptions::default()), Err(Error::Foreign(_))));
}

// ------------------------------------------------------------------ log damage

#[test]
fn log_page_cycles_are_reported() {
    let im = images();
    let chains = log_chains(&im.dirty, &im.geo, &im.uuid);
    let (ino, pages) =
        chains.iter().find(|(_, p)| p.len() >= 3).expect("a log of 3+ pages").clone();
    for (from, to) in [(1usize, 0usize), (1, 1), (2, 0)] {
        for (base, dirty) in [(&im.dirty, true), (&im.clean, false)] {
            let mut img = base.clone();
            let chains = log_chains(base, &im.geo, &im.uuid);
            let pages = &chains.iter().find(|(i, _)| *i == ino).unwrap().1;
            put_u64(&mut img, pages[from] + LOG_DATA_END, pages[to]);
            if dirty {
                // Recovery walks every log: the cycle stops the mount.
                assert_corrupt(mount(img), "cycle");
            } else {
                // A clean mount trusts its checkpoint; fsck and the inode report it.
                let fs = mount(img).expect("clean mount does not walk logs");
                let r = fs.fsck().unwrap();
                assert!(r.errors.iter().any(|e| e.contains("cycle")), "{:?}", r.errors);
                assert!(matches!(fs.getattr(ino), Err(Error::Corrupt(_))));
            }
        }
    }
    let _ = pages;
}

#[test]
fn journal_record_outside_the_inode_table() {
    let im = images();
    for (addr, what) in
        [(0u64, "superblock"), (MOUNT_STATE_OFF, "mount word"), (POOL - 8, "last word")]
    {
        for dirty in [true, false] {
            let mut img = if dirty { im.dirty.clone() } else { im.clean.clone() };
            let base = im.geo.journal_off(0);
            let txid = 99u64;
            let recs = [(addr, 1u64, 2u64)];
            let mut b = Vec::new();
            b.extend_from_slice(&txid.to_le_bytes());
            b.extend_from_slice(&(recs.len() as u64).to_le_bytes());
            for (a, o, n) in recs {
                for v in [a, o, n] {
                    b.extend_from_slice(&v.to_le_bytes());
                }
            }
            let csum = crc32c::crc32c(&b);
            put_u64(&mut img, base, (txid << 1) | 1);
            put_u64(&mut img, base + 8, recs.len() as u64);
            img[base as usize + 16..base as usize + 20].copy_from_slice(&csum.to_le_bytes());
            for (k, (a, o, n)) in recs.iter().enumerate() {
                let r = base + 64 + 24 * k as u64;
                put_u64(&mut img, r, *a);
                put_u64(&mut img, r + 8, *o);
                put_u64(&mut img, r + 16, *n);
            }
            if dirty {
                assert_corrupt(mount(img), "outside the inode table");
            } else {
                let fs = mount(img).unwrap();
                let r = fs.fsck().unwrap();
                assert!(
                    r.errors.iter().any(|e| e.contains("journal of shard 0")),
                    "{what}: {:?}",
                    r.errors
                );
            }
        }
    }
}

#[test]
fn bad_inode_slots() {
    let im = images();
    let chains = log_chains(&im.dirty, &im.geo, &im.uuid);
    let ino = chains.iter().find(|(i, _)| *i != 1).unwrap().0;
    let so = im.geo.slot_off(ino);
    let cases: Vec<(&str, u64, u64, &str)> = vec![
        ("unknown type", so + 24, 9, "unknown type"),
        ("head outside the data area", so + 8, 4096, "not a data block"),
        ("tail outside the data area", so + 16, 8, "not inside a log page"),
        ("tail unaligned", so + 16, get_u64(&im.dirty, so + 16) + 3, "not inside a log page"),
    ];
    let want = mount(im.clean.clone()).unwrap().getattr(ino).unwrap();
    for (what, off, val, needle) in cases {
        // Recovery of a crashed pool restores the slot from its replica...
        let mut img = im.dirty.clone();
        put_u64(&mut img, off, val);
        let fs = mount(img.clone()).unwrap_or_else(|e| panic!("{what}: replica not used: {e}"));
        assert_eq!(fs.getattr(ino).unwrap(), want, "{what}: restored inode");
        assert_fsck_clean(&fs, what);
        // ...and refuses the pool as before when the replica is damaged too.
        damage_replica(&mut img, &im.geo, ino);
        match mount(img) {
            Err(Error::Corrupt(m)) => assert!(m.contains(needle), "{what}: {m}"),
            r => panic!("{what}: {:?}", r.map(|_| ())),
        }
        // A clean pool loads inodes lazily from the primary: the damage shows,
        // and the raw repair (`ferrite fsck`) restores the slot before mounting.
        let mut img = im.clean.clone();
        put_u64(&mut img, off, val);
        let fs = mount(img.clone()).unwrap();
        assert!(!fs.fsck().unwrap().is_clean(), "{what}: clean fsck");
        assert!(fs.getattr(ino).is_err(), "{what}: inode still loads");
        drop(fs);
        let m = SimMedium::from_image(img);
        let (_, found) = ferrite_core::integrity::check_raw(&m);
        assert!(
            found.iter().any(|f| f.ino == Some(ino) && f.what.contains("replica")),
            "{what}: {found:?}"
        );
        let done = ferrite_core::integrity::repair_replicas_raw(&m);
        assert_eq!(done, [format!("inode {ino}: slot restored from its replica")], "{what}");
        let fs = Fs::mount(m, &MountOptions::default()).unwrap();
        assert_eq!(fs.getattr(ino).unwrap(), want, "{what}: repaired inode");
        assert_fsck_clean(&fs, what);
    }
    // A free slot marked in use with nothing behind it: its replica says free.
    let free =
        (2..=im.geo.ninodes).find(|&i| get_u64(&im.dirty, im.geo.slot_off(i)) & 1 == 0).unwrap();
    let mut img = im.dirty.clone();
    put_u64(&mut img, im.geo.slot_off(free), 1);
    mount(img.clone()).unwrap();
    damage_replica(&mut img, &im.geo, free);
    assert!(matches!(mount(img), Err(Error::Corrupt(_))));
    // An in-use inode marked free: its names now point at a free inode.
    let mut img = im.clean.clone();
    let st = get_u64(&img, so);
    put_u64(&mut img, so, st + 1);
    let fs = mount(img).unwrap();
    let r = fs.fsck().unwrap();
    assert!(
        r.errors.iter().any(|e| e.contains("free inode") || e.contains("allocator")),
        "{:?}",
        r.errors
    );
}

/// A damaged entry in the middle of a log. On a clean pool nothing can be torn, so
/// fsck and the inode report it; after a crash recovery must not pass it silently:
/// it is counted as a torn log in the mount report.
#[test]
fn damaged_log_entry() {
    let im = images();
    let chains = log_chains(&im.clean, &im.geo, &im.uuid);
    let (ino, pages) = chains.iter().find(|(_, p)| p.len() >= 2).unwrap().clone();
    let mut img = im.clean.clone();
    img[pages[0] as usize + 100] ^= 0x10;
    let fs = mount(img).unwrap();
    let r = fs.fsck().unwrap();
    assert!(!r.is_clean());
    assert!(matches!(fs.getattr(ino), Err(Error::Corrupt(_))));
    drop(fs);
    let chains = log_chains(&im.dirty, &im.geo, &im.uuid);
    let (_, pages) = chains.iter().find(|(i, _)| *i == ino).unwrap().clone();
    let mut img = im.dirty.clone();
    img[pages[0] as usize + 100] ^= 0x10;
    match mount(img) {
        Err(e) => assert!(matches!(e, Error::Corrupt(_)), "{e:?}"),
        Ok(fs) => assert!(
            fs.mount_report().torn_logs >= 1,
            "damage passed silently: {:?}",
            fs.mount_report()
        ),
    }
}

// ------------------------------------------------------------ random damage

#[derive(Clone, Copy, Debug)]
enum Region {
    Superblocks,
    MountWord,
    Journal,
    InodeTable,
    Checkpoint,
    LogPages,
    Anywhere,
}

fn damage(img: &mut [u8], rng: &mut Rng, im: &Images, chains: &[(u64, Vec<u64>)]) -> (Region, u64) {
    let g = &im.geo;
    let region = match rng.below(10) {
        0 => Region::Superblocks,
        1 => Region::MountWord,
        2 => Region::Journal,
        3 | 4 => Region::InodeTable,
        5 => Region::Checkpoint,
        6..=8 => Region::LogPages,
        _ => Region::Anywhere,
    };
    let used_slots: Vec<u64> = chains.iter().map(|(i, _)| *i).collect();
    let log_pages: Vec<u64> = chains.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    let off = match region {
        Region::Superblocks => rng.below(2) * BLOCK + rng.below(SB_SIZE as u64),
        Region::MountWord => MOUNT_STATE_OFF + rng.below(8),
        Region::Journal => g.journal_start * BLOCK + rng.below(g.journal_blocks * BLOCK),
        Region::InodeTable => {
            if rng.below(4) == 0 {
                g.itable_start * BLOCK + rng.below(g.itable_blocks * BLOCK)
            } else {
                g.slot_off(used_slots[rng.below(used_slots.len() as u64) as usize]) + rng.below(32)
            }
        }
        Region::Checkpoint => g.ckpt_start * BLOCK + rng.below(g.ckpt_blocks * BLOCK),
        Region::LogPages => {
            log_pages[rng.below(log_pages.len() as u64) as usize] + rng.below(BLOCK)
        }
        Region::Anywhere => rng.below(img.len() as u64),
    };
    let off = off.min(img.len() as u64 - 64);
    match rng.below(4) {
        0 | 1 => {
            for _ in 0..=rng.below(4) {
                let bit = rng.below(64);
                img[(off + bit / 8) as usize] ^= 1 << (bit % 8);
            }
        }
        2 => {
            let w = off & !7;
            put_u64(img, w, rng.next());
        }
        _ => img[off as usize..off as usize + 64].fill(0),
    }
    (region, off)
}

fn seeds(default: u64) -> u64 {
    std::env::var("FERRITE_DAMAGE_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn random_damage_never_panics() {
    let im = images();
    let chains_clean = log_chains(&im.clean, &im.geo, &im.uuid);
    let chains_dirty = log_chains(&im.dirty, &im.geo, &im.uuid);
    let n = seeds(800);
    let mut panics = Vec::new();
    let (mut mount_errs, mut fsck_errs, mut clean) = (0, 0, 0);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for seed in 0..n {
        let mut rng = Rng(seed * 0x1234_5678 + 1);
        let dirty = seed % 2 == 1;
        let (mut img, chains) = if dirty {
            (im.dirty.clone(), &chains_dirty)
        } else {
            (im.clean.clone(), &chains_clean)
        };
        let mut hits = Vec::new();
        for _ in 0..=rng.below(3) {
            hits.push(damage(&mut img, &mut rng, &im, chains));
        }
        match catch_unwind(AssertUnwindSafe(|| probe(img))) {
            Ok(Probe::MountErr(e)) => {
                if !matches!(e, Error::Corrupt(_) | Error::Foreign(_) | Error::Invalid(_)) {
                    panics.push(format!("seed {seed}: unclear mount error {e:?}"));
                }
                mount_errs += 1;
            }
            Ok(Probe::Mounted { fsck_errors, .. }) if fsck_errors > 0 => fsck_errs += 1,
            Ok(Probe::Mounted { .. }) => clean += 1,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panics.push(format!(
                    "seed {seed} ({}) {hits:?}: {msg}",
                    if dirty { "dirty" } else { "clean" }
                ));
            }
        }
    }
    std::panic::set_hook(hook);
    eprintln!("{n} damaged pools: {mount_errs} refused at mount, {fsck_errs} mounted with fsck errors, {clean} fsck-clean");
    assert!(
        panics.is_empty(),
        "{} of {n} damaged pools panicked:\n{}",
        panics.len(),
        panics.join("\n")
    );
    assert!(mount_errs > 0 && fsck_errs > 0, "the damage should be seen");
}

// ------------------------------------------- checksum-valid hostile entries

/// Append `e`, sealed with a valid checksum and sequence number, to the log of
/// `ino` in `img` (as a buggy or hostile writer could), moving the slot's tail.
fn append_sealed(img: &mut [u8], im: &Images, ino: u64, mut e: ferrite_core::log::EntryBuf) {
    let geo = &im.geo;
    let m = SimMedium::from_image(img.to_vec());
    let so = geo.slot_off(ino);
    let mut b = [0u8; 64];
    m.read(so, &mut b);
    let slot = InodeSlot::decode(&b);
    let seed = ferrite_core::log::seed(&im.uuid, ino, slot.state);
    let w =
        ferrite_core::log::walk(&m, geo, seed, logptr::addr(slot.head), logptr::addr(slot.tail))
            .unwrap();
    let len = e.bytes.len() as u64;
    assert!(w.end % BLOCK + len <= LOG_DATA_END - 16, "room in the tail page");
    e.bytes[5] |= ferrite_core::log::FLAG_TXEND;
    e.bytes[8..16].copy_from_slice(&w.next_seq.to_le_bytes());
    let c = crc32c::crc32c_append(seed, &e.bytes[4..]);
    e.bytes[0..4].copy_from_slice(&c.to_le_bytes());
    img[w.end as usize..(w.end + len) as usize].copy_from_slice(&e.bytes);
    put_u64(img, so + 16, logptr::make(logptr::epoch(slot.tail), w.end + len));
    sync_replica(img, geo, ino);
}

/// Log entries with valid checksums and hostile contents (what a buggy or hostile
/// writer leaves). Regression notes, bugs this found (fixed):
/// - a symlink whose SETATTR claims 2^40 bytes made `readlink` allocate 1 TiB and
///   abort the process (`ops.rs`, `readlink`: a size past SYMLINK_MAX is corruption);
/// - a DENTRY with cookie 2^64 - 1 overflowed the directory's next cookie, a panic in
///   mount's recovery workers (`log.rs`, `decode_body`: cookies outside 3..2^62 are
///   malformed);
/// - fsck called a file of size 2^64 - 1 and an xattr named "bogus" clean (`fsck.rs`).
#[test]
fn checksum_valid_hostile_entries() {
    use ferrite_core::log::{AttrRec, EntryBuf};
    // A pool with small victims: a file, a symlink, a directory, all with room in
    // their tail log page.
    let fs = fresh_sim(POOL, 2);
    populate(&fs);
    let root = fs.root();
    let file = fs.create(root, b"victim", 0o644, 0, 0).unwrap().ino;
    fs.write(file, 0, &[4u8; 5000]).unwrap();
    let link = fs.symlink(root, b"vlink", b"victim", 0, 0).unwrap().ino;
    let dir = fs.mkdir(root, b"vdir", 0o755, 0, 0).unwrap().ino;
    fs.create(dir, b"inside", 0o644, 0, 0).unwrap();
    let geo = *fs.geometry();
    let uuid = fs.superblock().uuid;
    let clean = fs.unmount().unwrap().current_image();
    let im = Images { clean: clean.clone(), dirty: clean.clone(), geo, uuid };
    let other_block = geo.data_start; // the root directory's first log page
    let ts = Ts::default();
    let attr = |mode: u32, size: u64, nlink: u32, parent: u64| AttrRec {
        mode,
        uid: 0,
        gid: 0,
        nlink,
        size,
        parent,
        atime: ts,
        mtime: ts,
        ctime: ts,
        rdev: 0,
    };
    let reg = libc::S_IFREG | 0o644;
    let cases: Vec<(&str, u64, EntryBuf)> = vec![
        (
            "write at the last page index",
            file,
            EntryBuf::write(u64::MAX - 1, other_block + 20, 5, 100, ts, None),
        ),
        (
            "write of a block owned by another inode",
            file,
            EntryBuf::write(0, other_block, 1, 5000, ts, None),
        ),
        ("write past the pool", file, EntryBuf::write(0, geo.nblocks - 1, 4, 5000, ts, None)),
        (
            "inline at the largest offset",
            file,
            EntryBuf::inline(u64::MAX - 200, u64::MAX, ts, &[1; 50]),
        ),
        ("punch to the largest offset", file, EntryBuf::punch(u64::MAX - 5, 100, ts)),
        ("punch of everything", file, EntryBuf::punch(0, u64::MAX, ts)),
        ("file size 2^64 - 1", file, EntryBuf::setattr(&attr(reg, u64::MAX, 1, 0), false)),
        ("file shrunk to 0 with a flag", file, EntryBuf::setattr(&attr(reg, 0, 1, 0), true)),
        (
            "file with a directory mode",
            file,
            EntryBuf::setattr(&attr(libc::S_IFDIR | 0o755, 10, 2, 1), false),
        ),
        ("file with no links", file, EntryBuf::setattr(&attr(reg, 5000, 0, 0), false)),
        (
            "symlink of 2^40 bytes",
            link,
            EntryBuf::setattr(&attr(libc::S_IFLNK | 0o777, 1 << 40, 1, 0), false),
        ),
        (
            "symlink of 0 bytes",
            link,
            EntryBuf::setattr(&attr(libc::S_IFLNK | 0o777, 0, 1, 0), false),
        ),
        (
            "dentry to an inode past the table",
            dir,
            EntryBuf::dentry(geo.ninodes + 10, 99, ts, 1, b"ghost"),
        ),
        ("dentry to the directory itself", dir, EntryBuf::dentry(dir, 99, ts, 2, b"me")),
        ("dentry to the root", dir, EntryBuf::dentry(root, 99, ts, 2, b"up")),
        ("dentry named '..'", dir, EntryBuf::dentry(file, 99, ts, 1, b"..")),
        ("dentry named with a slash", dir, EntryBuf::dentry(file, 99, ts, 1, b"a/b")),
        ("dentry with cookie 0", dir, EntryBuf::dentry(file, 0, ts, 1, b"zero")),
        ("dentry with the largest cookie", dir, EntryBuf::dentry(file, u64::MAX, ts, 1, b"last")),
        ("dentry of a wrong type", dir, EntryBuf::dentry(file, 99, ts, 2, b"typed")),
        ("dentry of an unknown type", dir, EntryBuf::dentry(file, 99, ts, 9, b"typed")),
        (
            "directory whose parent is itself",
            dir,
            EntryBuf::setattr(&attr(libc::S_IFDIR | 0o755, 0, 2, dir), false),
        ),
        (
            "directory whose parent is a file",
            dir,
            EntryBuf::setattr(&attr(libc::S_IFDIR | 0o755, 0, 2, file), false),
        ),
        (
            "directory with 2^32 - 1 links",
            dir,
            EntryBuf::setattr(&attr(libc::S_IFDIR | 0o755, 0, u32::MAX, root), false),
        ),
        (
            "root with no links",
            root,
            EntryBuf::setattr(&attr(libc::S_IFDIR | 0o755, 0, 0, root), false),
        ),
        (
            "root whose parent is a directory",
            root,
            EntryBuf::setattr(&attr(libc::S_IFDIR | 0o755, 0, 3, dir), false),
        ),
        ("xattr with an empty value", file, EntryBuf::xattr(false, b"user.x", b"", ts)),
        ("xattr removal of a missing name", file, EntryBuf::xattr(true, b"user.none", b"", ts)),
        ("xattr in an unknown namespace", file, EntryBuf::xattr(false, b"bogus", b"v", ts)),
    ];
    // Odd but legal entries: no panic is all that is asked. Every other case must be
    // refused at mount or reported by fsck.
    const LEGAL: [&str; 5] = [
        "punch to the largest offset",
        "punch of everything",
        "file shrunk to 0 with a flag",
        "xattr with an empty value",
        "xattr removal of a missing name",
    ];
    let mut panics = Vec::new();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for (what, ino, e) in cases {
        for dirty in [false, true] {
            let mut img = im.clean.clone();
            append_sealed(&mut img, &im, ino, e.clone());
            if dirty {
                // Make the mount recover from the logs instead of the checkpoint.
                let w = get_u64(&img, MOUNT_STATE_OFF);
                put_u64(&mut img, MOUNT_STATE_OFF, w & !1);
            }
            let r = catch_unwind(AssertUnwindSafe(|| probe(img)));
            match r {
                Ok(Probe::MountErr(e)) => {
                    if !matches!(e, Error::Corrupt(_) | Error::Foreign(_)) {
                        panics.push(format!("{what} (dirty={dirty}): unclear mount error {e:?}"));
                    }
                }
                Ok(Probe::Mounted { fsck_errors }) => {
                    if fsck_errors == 0 && !LEGAL.contains(&what) {
                        panics.push(format!("{what} (dirty={dirty}): not detected"));
                    }
                }
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    panics.push(format!("{what} (dirty={dirty}): panic: {msg}"));
                }
            }
        }
    }
    std::panic::set_hook(hook);
    assert!(panics.is_empty(), "{} failures:\n{}", panics.len(), panics.join("\n"));
}
