//! Corrupted-pool campaign: seeded pools with known contents get random damage
//! (bit flips, 8-byte words, zeroed pages, random pages, truncation), then go
//! through the checker (`check_pool`: fsck -n / scrub), a read-write mount and a
//! read of every file (what a user who runs no fsck sees), then what `ferrite fsck
//! --repair` runs (the raw replica repair, a mount, `Fs::repair`, an unmount), a
//! second check and a read of every file again. Requirements: no panic
//! (catch_unwind), no hang (a watchdog per pool), and no file read returning bytes
//! that differ from the known contents (damage is an error, a refused mount or a
//! missing name, never other bytes).
//! FERRITE_CAMPAIGN_POOLS sets the pool count (default 10,000, the figure, about
//! 40 s here).

mod common;
mod integ_util;

use common::Rng;
use ferrite_core::integrity::check_pool;
use ferrite_core::layout::BLOCK;
use ferrite_core::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::Duration;

const POOL: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Damage {
    BitFlips,
    Word,
    ZeroPage,
    RandomPage,
    Truncate,
}

#[derive(Default, Debug)]
struct Outcome {
    /// check_pool reported damage.
    detected: bool,
    /// The read-write mount failed (an error, not a panic).
    mount_failed: bool,
    /// Some read failed with an error (EIO, ENOENT...).
    read_errors: bool,
    /// Paths whose reads returned bytes other than the known contents.
    wrong: Vec<String>,
    /// Repair ran and the check after it was clean.
    repaired_clean: bool,
    /// After repair, every file read back whole.
    all_back: bool,
}

/// Damage `img` in place; returns the kind. Half of the damage aims at blocks in use.
fn damage(img: &mut Vec<u8>, rng: &mut Rng, used: &[u64]) -> Damage {
    let kind = match rng.below(5) {
        0 => Damage::BitFlips,
        1 => Damage::Word,
        2 => Damage::ZeroPage,
        3 => Damage::RandomPage,
        _ => Damage::Truncate,
    };
    let nblocks = img.len() as u64 / BLOCK;
    let block = |rng: &mut Rng| {
        if rng.below(2) == 0 && !used.is_empty() {
            used[rng.below(used.len() as u64) as usize]
        } else {
            rng.below(nblocks)
        }
    };
    match kind {
        Damage::BitFlips => {
            for _ in 0..1 + rng.below(16) {
                let off = block(rng) * BLOCK + rng.below(BLOCK);
                img[off as usize] ^= 1 << rng.below(8);
            }
        }
        Damage::Word => {
            let off = (block(rng) * BLOCK + rng.below(BLOCK / 8) * 8) as usize;
            let v = if rng.below(2) == 0 { 0 } else { rng.next() };
            img[off..off + 8].copy_from_slice(&v.to_le_bytes());
        }
        Damage::ZeroPage => {
            let off = (block(rng) * BLOCK) as usize;
            img[off..off + BLOCK as usize].fill(0);
        }
        Damage::RandomPage => {
            let off = (block(rng) * BLOCK) as usize;
            rng.fill(&mut img[off..off + BLOCK as usize]);
        }
        Damage::Truncate => {
            // To a multiple of 8 bytes: the simulated medium models 8-byte words
            // (a pool file of another length fails the same size check).
            let keep = rng.below(img.len() as u64 / 8) as usize * 8;
            img.truncate(keep.max(8));
        }
    }
    kind
}

fn run_one(img: Vec<u8>, model: &integ_util::Model) -> Outcome {
    let mut o = Outcome::default();
    let (rep, _) = check_pool(SimMedium::from_image(img.clone()), &mut |_, _| {});
    o.detected = !rep.is_clean();
    match Fs::mount(SimMedium::from_image(img.clone()), &MountOptions::default()) {
        Ok(fs) => match integ_util::read_all(&fs, model) {
            Ok(all) => o.read_errors = !all,
            Err(p) => o.wrong.push(p),
        },
        Err(_) => o.mount_failed = true,
    }
    // What `ferrite fsck --repair` runs.
    let m = SimMedium::from_image(img);
    integrity::repair_replicas_raw(&m);
    let Ok(fs) = Fs::mount(m, &MountOptions::default()) else { return o };
    let _ = fs.fsck();
    let _ = fs.check_data(&mut |_, _| {});
    if fs.repair().is_ok() {
        if let Ok(m) = fs.unmount() {
            let (rep, m) = check_pool(SimMedium::from_image(m.current_image()), &mut |_, _| {});
            o.repaired_clean = rep.is_clean();
            if let Some(fs) = m.and_then(|m| Fs::mount(m, &MountOptions::default()).ok()) {
                match integ_util::read_all(&fs, model) {
                    Ok(all) => o.all_back = all,
                    Err(p) => o.wrong.push(format!("after repair: {p}")),
                }
            }
        }
    }
    o
}

#[test]
fn random_damage_never_panics_hangs_or_reads_back_as_good() {
    let pools: u64 =
        std::env::var("FERRITE_CAMPAIGN_POOLS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    let t0 = std::time::Instant::now();
    let mut stats: std::collections::BTreeMap<Damage, [u64; 7]> = Default::default();
    let (mut panics, mut hangs, mut wrong_undetected, mut wrong_detected) = (0, 0, 0, 0);
    let mut failures = Vec::new();
    // A handful of base pools, each damaged many ways.
    let bases: Vec<_> = (0..16).map(|s| integ_util::build(7000 + s, POOL)).collect();
    let used: Vec<Vec<u64>> = bases
        .iter()
        .map(|(img, _)| {
            let fs = Fs::mount(
                SimMedium::from_image(img.clone()),
                &MountOptions { read_only: true, ..Default::default() },
            )
            .unwrap();
            fs.block_owners().iter().flat_map(|r| r.start..r.start + r.len).collect()
        })
        .collect();
    for p in 0..pools {
        let b = (p % bases.len() as u64) as usize;
        let mut rng = Rng(0xC0FFEE ^ p);
        let mut img = bases[b].0.clone();
        let kind = damage(&mut img, &mut rng, &used[b]);
        let model = bases[b].1.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(|| run_one(img, &model)));
            let _ = tx.send(r);
        });
        let s = stats.entry(kind).or_default();
        s[0] += 1;
        match rx.recv_timeout(Duration::from_secs(60)) {
            Err(_) => {
                hangs += 1;
                failures.push(format!("pool {p} ({kind:?}): no answer in 60 s"));
            }
            Ok(Err(e)) => {
                panics += 1;
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("pool {p} ({kind:?}): panic: {msg}"));
            }
            Ok(Ok(o)) => {
                s[1] += o.detected as u64;
                s[2] += o.mount_failed as u64;
                s[3] += o.read_errors as u64;
                s[4] += o.repaired_clean as u64;
                s[6] += o.all_back as u64;
                if !o.wrong.is_empty() {
                    s[5] += 1;
                    if o.detected {
                        // Reported by the checker, yet a read returned other bytes:
                        // still damage returned as good.
                        wrong_detected += 1;
                        failures.push(format!(
                            "pool {p} ({kind:?}): {:?} read back other bytes (the checker \
                             reported the pool)",
                            o.wrong
                        ));
                    } else {
                        wrong_undetected += 1;
                        failures.push(format!(
                            "pool {p} ({kind:?}): {:?} read back other bytes, and the checker \
                             found nothing",
                            o.wrong
                        ));
                    }
                }
            }
        }
    }
    println!(
        "\n{pools} pools in {:.1} s: {panics} panics, {hangs} hangs, {wrong_undetected} reads of \
         other bytes that the checker missed, {wrong_detected} reads of other bytes in pools the \
         checker reported",
        t0.elapsed().as_secs_f64()
    );
    println!(
        "| damage | pools | checker reported | mount refused | some read failed | clean after \
         repair | every file whole after repair | some read returned other bytes |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (k, s) in &stats {
        println!(
            "| {k:?} | {} | {} | {} | {} | {} | {} | {} |",
            s[0], s[1], s[2], s[3], s[4], s[6], s[5]
        );
    }
    assert!(failures.is_empty(), "{} failures: {failures:#?}", failures.len());
}
