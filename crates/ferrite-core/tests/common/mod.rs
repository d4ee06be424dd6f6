//! Helpers shared by the integration tests: pool construction, remounts, a seeded
//! random generator (tests must be reproducible from their seed) and errno extraction.
//!
//! Invariant: nothing here hides a failure; every helper panics with the report or
//! error it saw.
#![allow(dead_code)]

use ferrite_core::*;

/// A fresh simulated pool of `size` bytes with `shards` shards.
pub fn fresh_sim(size: u64, shards: u32) -> Fs<SimMedium> {
    Fs::mkfs(SimMedium::new(size), &MkfsOptions { shards, ..Default::default() })
        .expect("mkfs on a simulated pool")
}

/// Fences issued by `f`.
pub fn fences(fs: &Fs<SimMedium>, f: impl FnOnce()) -> u64 {
    let before = fs.medium().fence_count();
    f();
    fs.medium().fence_count() - before
}

/// Assert that fsck finds nothing wrong.
pub fn assert_fsck_clean<M: Medium>(fs: &Fs<M>, ctx: &str) {
    let r = fs.fsck().expect("fsck runs");
    assert!(r.is_clean(), "{ctx}: fsck errors: {:#?}", r.errors);
}

/// How to get from one mount to the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Remount {
    /// Clean unmount, mount from the checkpoint.
    Clean,
    /// Process crash: everything stored is kept (`current_image`).
    CrashCurrent,
    /// Power-loss style crash: only what is durable (`durable_image`).
    CrashDurable,
}

/// Remount a simulated pool the given way; the new mount is fsck-clean.
pub fn remount(fs: Fs<SimMedium>, how: Remount) -> Fs<SimMedium> {
    let m = match how {
        Remount::Clean => fs.unmount().expect("clean unmount"),
        Remount::CrashCurrent => SimMedium::from_image(fs.crash().current_image()),
        Remount::CrashDurable => SimMedium::from_image(fs.crash().durable_image()),
    };
    let fs = Fs::mount(m, &MountOptions::default()).expect("remount");
    assert_eq!(fs.mount_report().clean, how == Remount::Clean, "mount report after {how:?}");
    assert_fsck_clean(&fs, &format!("after {how:?} remount"));
    fs
}

/// Mount the pool file at `path` after its previous holder crashed: the mount is a
/// recovery (not clean) and fsck-clean.
pub fn mount_file_after_crash(path: &std::path::Path, ctx: &str) -> Fs<MmapMedium> {
    let m = MmapMedium::open(path, &MapOptions::default()).expect("open the pool file");
    let fs = Fs::mount(m, &MountOptions::default()).expect("mount after a crash");
    assert!(!fs.mount_report().clean, "{ctx}: mount after a crash used the checkpoint");
    assert_fsck_clean(&fs, ctx);
    fs
}

/// The errno of a result (0 for success).
pub fn errno<T>(r: &Result<T>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.errno(),
    }
}

/// SplitMix64: a small, well-distributed, seedable generator.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// Fill `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.fill(&mut v);
        v
    }
}

/// Deterministic content for file `tag` at byte offset `off` (so readers can check
/// any range without keeping a copy).
pub fn pattern(tag: u64, off: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| {
            let x = off
                .wrapping_add(i)
                .wrapping_mul(0x9e37_79b9)
                .wrapping_add(tag.wrapping_mul(0x85eb_ca6b));
            (x ^ (x >> 13)) as u8
        })
        .collect()
}

/// One fence of a recorded operation: the bytes certainly on media and the words
/// that may or may not be.
pub type FencePointRec = (Vec<u8>, Vec<ferrite_core::sim::InFlight>);

/// Run `op` on `fs`, recording every fence it issues; returns its result and the
/// fence points.
pub fn record_fences<T>(fs: &Fs<SimMedium>, op: impl FnOnce() -> T) -> (T, Vec<FencePointRec>) {
    let points = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = points.clone();
    fs.medium().set_fence_hook(Some(Box::new(move |p| {
        s.lock().unwrap().push((p.durable.to_vec(), p.in_flight.to_vec()));
    })));
    let r = op();
    fs.medium().set_fence_hook(None);
    let points = points.lock().unwrap().clone();
    (r, points)
}

/// Mount `per_point` crash images of each fence point and call `check(k, fs)` on
/// each: subset 0 keeps no word in flight, subset 1 every word, the others a random
/// half (seeded by `seed`).
pub fn for_each_crash_image(
    points: &[FencePointRec],
    per_point: usize,
    seed: u64,
    mut check: impl FnMut(usize, Fs<SimMedium>),
) {
    let mut rng = Rng(seed);
    for (durable, in_flight) in points {
        for k in 0..per_point {
            let chosen: Vec<_> = in_flight
                .iter()
                .filter(|_| match k {
                    0 => false,
                    1 => true,
                    _ => rng.below(2) == 0,
                })
                .collect();
            let img = ferrite_core::sim::crash_image(durable, chosen);
            let c = Fs::mount(SimMedium::from_image(img), &MountOptions::default())
                .unwrap_or_else(|e| panic!("crash subset {k} does not mount: {e}"));
            check(k, c);
        }
    }
}

/// Run `op` on `fs` (it must succeed and leave file `f` holding `new`), then mount
/// crash images of each of its fences (40 per fence, sampled with `seed`): `f` holds
/// `old` or `new` in every image, fsck finds each clean, and some image keeps `old`.
pub fn assert_file_op_atomic(
    fs: &Fs<SimMedium>,
    f: u64,
    (old, new): (&[u8], &[u8]),
    seed: u64,
    ctx: &str,
    op: impl FnOnce() -> Result<()>,
) {
    let (r, points) = record_fences(fs, op);
    r.unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert!(fs.read_all(f).unwrap() == new, "{ctx}: result differs");
    assert!(!points.is_empty(), "{ctx}: no fence");
    let mut seen = std::collections::BTreeSet::new();
    for_each_crash_image(&points, 40, seed, |k, c| {
        let got = c.read_all(f).unwrap();
        assert!(got == old || got == new, "{ctx}: crash subset {k}: neither before nor after");
        seen.insert(got == new);
        assert_fsck_clean(&c, &format!("{ctx}: after a crash"));
    });
    assert!(seen.contains(&false), "{ctx}: some crash point keeps the old content");
}

/// Store `v` into the 8-byte word at `word` (0 state, 8 head, 16 tail) of inode
/// `ino`'s slot and bring its replica in step, durably: a change made as the
/// core makes it (a lost update, a hostile but well-formed slot), not damage the
/// replica would reveal.
#[allow(dead_code)]
pub fn set_slot_word(
    m: &SimMedium,
    geo: &ferrite_core::layout::Geometry,
    ino: u64,
    word: u64,
    v: u64,
) {
    let off = geo.slot_off(ino) + word;
    m.store_u64(off, v);
    m.flush(off, 8);
    ferrite_core::replica::sync_slot(m, geo, ino);
    m.fence();
}
