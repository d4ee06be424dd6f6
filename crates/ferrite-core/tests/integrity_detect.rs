//! Detection rate per region: in many seeded pools, damage 1-8 bytes of a used
//! block of one region kind and require `check_pool` (what `ferrite fsck -n` and
//! `ferrite scrub` run) to report it. Bytes that cannot matter (the format never
//! reads them; listed with the reason) must leave every file readable as before.
//! Prints the rate table; FERRITE_DETECT_TRIALS sets the trials per region.
//! Every region with a second copy (superblocks, inode slots and their replicas,
//! journals, checkpoints) must also be repaired by what `ferrite fsck` runs, with
//! every file reading as before.

mod common;
mod integ_util;

use common::Rng;
use ferrite_core::integrity::check_pool;
use ferrite_core::layout::{logptr, Superblock, BLOCK};
use ferrite_core::*;

const POOL: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Superblock,
    InodeSlot,
    LogPage,
    DataBlock,
    Journal,
    Checkpoint,
    SlotReplica,
    JournalReplica,
    CheckpointReplica,
}

const KINDS: [Kind; 9] = [
    Kind::Superblock,
    Kind::InodeSlot,
    Kind::LogPage,
    Kind::DataBlock,
    Kind::Journal,
    Kind::Checkpoint,
    Kind::SlotReplica,
    Kind::JournalReplica,
    Kind::CheckpointReplica,
];

impl Kind {
    /// Has a second copy that repair restores it from (or rewrites it from).
    fn copied(self) -> bool {
        !matches!(self, Kind::LogPage | Kind::DataBlock)
    }
}

/// A damage target: the byte range that may be hit and which of its bytes matter
/// (`None`: all of them), with the reason the others cannot.
struct Target {
    start: u64,
    len: u64,
    matters: Box<dyn Fn(u64, u8) -> bool>,
    unused_reason: &'static str,
    /// Bytes `[0, hot)` hold what matters: most damage lands there.
    hot: u64,
}

fn u64_at(img: &[u8], off: u64) -> u64 {
    u64::from_le_bytes(img[off as usize..off as usize + 8].try_into().unwrap())
}

/// End of the entries a log page holds (the tail's offset in the tail page, the
/// end of the END entry in others), parsed from entry lengths of a clean image.
fn used_end(img: &[u8], page: u64, tail: u64) -> u64 {
    if tail & !(BLOCK - 1) == page {
        return tail - page;
    }
    let mut pos = 0;
    while pos + 16 <= BLOCK - 8 {
        let h = &img[(page + pos) as usize..];
        let len = u16::from_le_bytes([h[6], h[7]]) as u64;
        if len < 16 {
            break;
        }
        if h[4] == 7 {
            return pos + 16;
        }
        pos += len;
    }
    pos
}

fn target(kind: Kind, img: &[u8], rng: &mut Rng) -> Option<Target> {
    let sb = Superblock::decode(&img[..256]).unwrap();
    let geo = sb.geometry();
    let fs = Fs::mount(
        SimMedium::from_image(img.to_vec()),
        &MountOptions { read_only: true, ..Default::default() },
    )
    .unwrap();
    let owners = fs.block_owners();
    let pick = |owner: &str, rng: &mut Rng| {
        let v: Vec<_> = owners.iter().filter(|r| r.owner == owner).collect();
        let r = v[rng.below(v.len() as u64) as usize];
        let k = rng.below(r.len);
        (r.start + k, r.ino, r.file_offset.map(|o| o + k * BLOCK))
    };
    let all = |_: u64, _: u8| true;
    Some(match kind {
        Kind::Superblock => {
            let copy = rng.below(2);
            Target {
                start: copy * BLOCK,
                len: 256,
                matters: Box::new(all),
                unused_reason: "",
                hot: 0,
            }
        }
        Kind::InodeSlot | Kind::SlotReplica => {
            let inos: Vec<u64> =
                owners.iter().filter(|r| r.owner == "log").filter_map(|r| r.ino).collect();
            let ino = inos[rng.below(inos.len() as u64) as usize];
            Target {
                start: if kind == Kind::InodeSlot {
                    geo.slot_off(ino)
                } else {
                    geo.slot_replica_off(ino).unwrap()
                },
                len: 64,
                matters: Box::new(all),
                unused_reason: "",
                hot: 0,
            }
        }
        Kind::LogPage => {
            let (blk, ino, _) = pick("log", rng);
            let tail = logptr::addr(u64_at(img, geo.slot_off(ino.unwrap()) + 16));
            let page = blk * BLOCK;
            let end = used_end(img, page, tail);
            let is_tail = tail & !(BLOCK - 1) == page;
            Target {
                start: page,
                len: BLOCK,
                matters: Box::new(move |o, _| o < end || (!is_tail && o >= BLOCK - 8)),
                unused_reason: "after the last entry of a page (past the tail, or after its END \
                                 entry), or the tail page's next pointer: never read, \
                                 overwritten before use",
                hot: end,
            }
        }
        Kind::DataBlock => {
            let (blk, ino, foff) = pick("data", rng);
            let size = fs.getattr(ino.unwrap()).unwrap().size;
            let foff = foff.unwrap();
            if foff >= size {
                return None; // a page past the size (never happens here)
            }
            let inside = (size - foff).min(BLOCK);
            Target {
                start: blk * BLOCK,
                len: inside,
                matters: Box::new(all),
                unused_reason: "",
                hot: 0,
            }
        }
        Kind::Journal | Kind::JournalReplica => {
            let s = rng.below(geo.nshards as u64) as u32;
            let base = geo.journal_offs(s)[(kind == Kind::JournalReplica) as usize].unwrap();
            let count = u64_at(img, base + 8);
            let live = 64 + 24 * count;
            Target {
                start: base,
                len: 512,
                // With no records, the state word's transaction id is free (ids are
                // only compared inside one journal's checksum); its active bit is not.
                // (The copies are compared too, so these bytes are reported anyway.)
                matters: Box::new(move |o, x| match o {
                    0 if count == 0 => x & 1 != 0,
                    1..8 if count == 0 => false,
                    _ => o < live,
                }),
                unused_reason: "records past the last transaction's count (stale bytes of an \
                                earlier transaction, read by nobody); the transaction id of a \
                                journal without records (any value works)",
                hot: live,
            }
        }
        Kind::Checkpoint | Kind::CheckpointReplica => {
            let k = rng.below(geo.ckpt_blocks);
            let start = geo.ckpt_starts()[(kind == Kind::CheckpointReplica) as usize].unwrap();
            Target {
                start: (start + k) * BLOCK,
                len: BLOCK,
                matters: Box::new(all),
                unused_reason: "",
                hot: 0,
            }
        }
    })
}

#[derive(Default)]
struct Row {
    trials: u64,
    mattered: u64,
    detected: u64,
    unused: u64,
    unused_harmless: u64,
    repaired: u64,
    misses: Vec<String>,
}

/// What `ferrite fsck --repair` runs: the raw replica repair, a read-write mount
/// (crash recovery, superblock twin), `Fs::repair`, an unmount (both checkpoint
/// copies rewritten). Then the pool must check clean and read as `model`.
fn repairs_to_model(img: Vec<u8>, model: &integ_util::Model) -> std::result::Result<(), String> {
    let m = SimMedium::from_image(img);
    integrity::repair_replicas_raw(&m);
    let fs = Fs::mount(m, &MountOptions::default()).map_err(|e| format!("mount: {e}"))?;
    fs.repair().map_err(|e| format!("repair: {e}"))?;
    let m = fs.unmount().map_err(|e| format!("unmount: {e}"))?;
    let (rep, m) = check_pool(m, &mut |_, _| {});
    if !rep.is_clean() {
        return Err(format!("not clean after repair: {:?}", rep.findings));
    }
    let fs = Fs::mount(m.unwrap(), &MountOptions::default()).map_err(|e| format!("{e}"))?;
    match integ_util::read_all(&fs, model) {
        Ok(true) => Ok(()),
        r => Err(format!("files read back otherwise after repair: {r:?}")),
    }
}

#[test]
fn damage_to_every_region_is_detected() {
    let trials: u64 =
        std::env::var("FERRITE_DETECT_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(150);
    let mut rows: Vec<(Kind, Row)> = KINDS.iter().map(|&k| (k, Row::default())).collect();
    for (ki, (kind, row)) in rows.iter_mut().enumerate() {
        let mut t = 0;
        let mut seed = 1000 * ki as u64;
        while t < trials {
            seed += 1;
            let mut rng = Rng(seed);
            let (mut img, model) = integ_util::build(seed, POOL);
            let Some(tg) = target(*kind, &img, &mut rng) else { continue };
            t += 1;
            row.trials += 1;
            if t == 1 || t % 10 == 0 {
                // Control: the undamaged pool is clean (so a report means damage).
                let (rep, _) = check_pool(SimMedium::from_image(img.clone()), &mut |_, _| {});
                assert!(rep.is_clean(), "seed {seed}: undamaged pool: {:#?}", rep.findings);
            }
            let n = (1 + rng.below(8)).min(tg.len);
            let at = if tg.hot >= n && rng.below(4) != 0 {
                rng.below(tg.hot - n + 1)
            } else {
                rng.below(tg.len - n + 1)
            };
            let mut matters = false;
            for o in at..at + n {
                let x = (1 + rng.below(255)) as u8;
                img[(tg.start + o) as usize] ^= x;
                matters |= (tg.matters)(o, x);
            }
            let what = format!("{kind:?} seed {seed}: {n} byte(s) at {:#x}+{at}", tg.start);
            let (rep, _) = check_pool(SimMedium::from_image(img.clone()), &mut |_, _| {});
            let detected = !rep.is_clean();
            if detected && kind.copied() {
                match repairs_to_model(img.clone(), &model) {
                    Ok(()) => row.repaired += 1,
                    Err(e) => row.misses.push(format!("{what}: {e}")),
                }
            }
            if matters {
                row.mattered += 1;
                if detected {
                    row.detected += 1;
                } else {
                    row.misses.push(what);
                }
            } else {
                row.unused += 1;
                // Harmless: the pool mounts and every file reads as before.
                let fs = Fs::mount(SimMedium::from_image(img), &MountOptions::default());
                let ok = fs.is_ok_and(|fs| integ_util::read_all(&fs, &model) == Ok(true));
                if ok {
                    row.unused_harmless += 1;
                } else {
                    row.misses.push(format!("{what}: an 'unused' byte changed what reads back"));
                }
            }
        }
    }
    println!(
        "\n| region | pools | damage hit used bytes | detected | rate | hit only unused bytes \
         (harmless) | repaired from the other copy |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (kind, r) in &rows {
        let repaired = if kind.copied() { r.repaired.to_string() } else { "no copy".into() };
        println!(
            "| {kind:?} | {} | {} | {} | {:.1}% | {} ({}) | {repaired} |",
            r.trials,
            r.mattered,
            r.detected,
            100.0 * r.detected as f64 / r.mattered.max(1) as f64,
            r.unused,
            r.unused_harmless
        );
    }
    for (kind, _) in &rows {
        if let Ok(Some(t)) = std::panic::catch_unwind(|| {
            let (img, _) = integ_util::build(1, POOL);
            target(*kind, &img, &mut Rng(1))
        }) {
            if !t.unused_reason.is_empty() {
                println!("{kind:?}: bytes that cannot matter: {}", t.unused_reason);
            }
        }
    }
    let misses: Vec<&String> = rows.iter().flat_map(|(_, r)| &r.misses).collect();
    assert!(misses.is_empty(), "{} undetected: {misses:#?}", misses.len());
}
