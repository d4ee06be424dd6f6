//! Metadata replicas (format version 5): a damaged page of the inode table, a
//! damaged journal or checkpoint copy loses nothing, on a cleanly unmounted pool
//! (fsck restores before mounting) and on a crashed one (recovery restores); a
//! write pays nothing for them (the replica's tail catches up at the clean unmount).

mod common;

use common::*;
use ferrite_core::integrity::{check_pool, check_raw, repair_replicas_raw};
use ferrite_core::layout::{Geometry, BLOCK};
use ferrite_core::*;

const MB: u64 = 1 << 20;

/// A pool with directory /d holding 200 files (so its slot's damage would orphan
/// them all), and the expected contents.
fn populated(replicas: bool) -> (Fs<SimMedium>, Vec<(String, Vec<u8>)>) {
    let opts = MkfsOptions { shards: 2, replicas, ..Default::default() };
    let fs = Fs::mkfs(SimMedium::new(16 * MB), &opts).unwrap();
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let mut want = Vec::new();
    for k in 0..200u32 {
        let name = format!("f{k}");
        let f = fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let data: Vec<u8> = (0..(k * 37 % 5000)).map(|i| (i ^ k) as u8).collect();
        fs.write(f, 0, &data).unwrap();
        want.push((format!("/d/{name}"), data));
    }
    (fs, want)
}

fn reads_back(fs: &Fs<SimMedium>, want: &[(String, Vec<u8>)]) {
    for (path, data) in want {
        let ino = fs.resolve(path.as_bytes(), false).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(fs.read_all(ino).unwrap() == *data, "{path} reads back otherwise");
    }
}

/// Zero the inode-table block holding `ino`'s slot (64 slots: the root's and /d's).
fn zero_slot_block(m: &SimMedium, geo: &Geometry, ino: u64) {
    let blk = geo.slot_off(ino) / BLOCK * BLOCK;
    m.write(blk, &[0u8; BLOCK as usize]);
}

#[test]
fn a_zeroed_inode_table_page_is_restored_from_the_replica() {
    // Cleanly unmounted: the mount reads slots lazily, so fsck's raw repair
    // restores them first.
    let (fs, want) = populated(true);
    let d = fs.resolve(b"/d", false).unwrap();
    let geo = *fs.geometry();
    let m = fs.unmount().unwrap();
    zero_slot_block(&m, &geo, d);
    let (_, found) = check_raw(&m);
    assert!(found.iter().any(|f| f.ino == Some(d) && f.what.contains("replica")), "{found:?}");
    let done = repair_replicas_raw(&m);
    assert!(done.iter().any(|x| x == &format!("inode {d}: slot restored from its replica")));
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    reads_back(&fs, &want);
    assert_fsck_clean(&fs, "after the raw repair");
    let (rep, _) = check_pool(fs.unmount().unwrap(), &mut |_, _| {});
    assert!(rep.is_clean(), "{:?}", rep.findings);

    // Crashed: recovery restores every slot that no longer validates; the files'
    // replica tails are behind (their writes came after their creates), so their
    // tails are found by walking their logs on.
    let (fs, want) = populated(true);
    let geo = *fs.geometry();
    let m = fs.crash();
    zero_slot_block(&m, &geo, d);
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    reads_back(&fs, &want);
    assert_fsck_clean(&fs, "after recovery");

    // Without replicas the same damage loses the directory and what it names.
    let (fs, _) = populated(false);
    let m = fs.unmount().unwrap();
    zero_slot_block(&m, &geo, d);
    assert!(repair_replicas_raw(&m).is_empty());
    let fs = Fs::mount(m, &MountOptions::default());
    assert!(fs.is_err() || fs.unwrap().resolve(b"/d/f7", false).is_err());
}

#[test]
fn a_damaged_replica_is_rewritten_from_its_primary() {
    let (fs, want) = populated(true);
    let geo = *fs.geometry();
    let m = fs.unmount().unwrap();
    let r = geo.ritable_start().unwrap() * BLOCK;
    m.write(r, &[0xa5u8; BLOCK as usize]);
    let (_, found) = check_raw(&m);
    assert!(found.iter().filter(|f| f.what.contains("replica is damaged")).count() >= 64);
    let done = repair_replicas_raw(&m);
    assert!(done.iter().filter(|x| x.contains("replica rewritten")).count() >= 64, "{done:?}");
    assert!(check_raw(&m).1.is_empty());
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    reads_back(&fs, &want);
}

#[test]
fn a_damaged_checkpoint_copy_is_outvoted_and_rewritten() {
    let (fs, want) = populated(true);
    let geo = *fs.geometry();
    let m = fs.unmount().unwrap();
    let [c0, _] = geo.ckpt_starts();
    m.write(c0.unwrap() * BLOCK + 20, &[0xffu8; 8]);
    assert!(check_raw(&m).1.iter().any(|f| f.what.starts_with("copy 0")));
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    let r = fs.mount_report();
    assert!(r.clean && r.checkpoint_copy == 1 && r.inodes_scanned == 0, "{r:?}");
    reads_back(&fs, &want);
    let m = fs.unmount().unwrap();
    assert!(check_raw(&m).1.is_empty(), "the unmount rewrote both copies");
}

#[test]
fn an_active_journal_with_a_damaged_copy_is_rolled_back_from_the_other() {
    // A rename interrupted after its journal's fence, half applied, and then the
    // primary journal copy damaged: the replica still undoes it.
    let (fs, want) = populated(true);
    let d = fs.resolve(b"/d", false).unwrap();
    let before = fs.medium().current_image();
    let fences_before = fs.medium().fence_count();
    fs.rename(d, b"f3", fs.root(), b"moved", Default::default()).unwrap();
    let fences = fs.medium().fence_count() - fences_before;
    assert_eq!(fences, 2, "a journaled rename takes two fences");
    let geo = *fs.geometry();
    let after = fs.crash().current_image();
    // Find the shard whose journal holds the rename; rebuild "begin fenced, one
    // word applied" from the images: the journal copies and one record's word new,
    // everything else old.
    let s = (0..geo.nshards)
        .find(|&s| {
            let j = geo.journal_offs(s)[0].unwrap() as usize;
            before[j..j + 512] != after[j..j + 512]
        })
        .expect("a journal changed");
    let mut img = before.clone();
    for j in geo.journal_offs(s).into_iter().flatten() {
        let j = j as usize;
        img[j..j + 512].copy_from_slice(&after[j..j + 512]);
        img[j] |= 1; // still active
    }
    // New log entries beyond the old tails are present (written before the fence).
    let data = geo.data_start as usize * BLOCK as usize;
    img[data..].copy_from_slice(&after[data..]);
    let j0 = geo.journal_offs(s)[0].unwrap() as usize;
    let rec = |k: usize, f: usize| {
        let o = j0 + 64 + 24 * k + 8 * f;
        u64::from_le_bytes(after[o..o + 8].try_into().unwrap())
    };
    let (addr, new) = (rec(0, 0) as usize, rec(0, 2));
    img[addr..addr + 8].copy_from_slice(&new.to_le_bytes());
    // Damage the primary copy's records.
    img[j0 + 64 + 3] ^= 0x5a;
    let fs = Fs::mount(SimMedium::from_image(img), &MountOptions::default()).unwrap();
    assert_eq!(fs.mount_report().journals_rolled_back, 1);
    reads_back(&fs, &want);
    assert!(fs.resolve(b"/moved", false).is_err(), "the rename was undone");
    assert_fsck_clean(&fs, "after the rollback");
    let (rep, _) = check_pool(fs.unmount().unwrap(), &mut |_, _| {});
    assert!(rep.is_clean(), "{:?}", rep.findings);
}

/// Bytes written (flushed or non-temporal) and fences of `ops`, run after `setup`
/// on a fresh pool with or without replicas.
fn cost(
    replicas: bool,
    setup: impl Fn(&Fs<SimMedium>),
    ops: impl Fn(&Fs<SimMedium>),
) -> (u64, u64) {
    let opts = MkfsOptions { shards: 1, replicas, ..Default::default() };
    let fs = Fs::mkfs(SimMedium::new(16 * MB), &opts).unwrap();
    setup(&fs);
    let before = fs.medium().stats().snapshot();
    ops(&fs);
    let after = fs.medium().stats().snapshot();
    let written = (after.nt_bytes - before.nt_bytes) + (after.flushed_bytes - before.flushed_bytes);
    (written, after.fences - before.fences)
}

#[test]
fn a_write_stores_nothing_more_with_replicas() {
    let setup = |fs: &Fs<SimMedium>| {
        let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
        fs.write(f, 0, &[1u8; 8192]).unwrap();
    };
    let ops = |fs: &Fs<SimMedium>| {
        let f = fs.resolve(b"/f", false).unwrap();
        for k in 0..100u64 {
            fs.write(f, (k * 64) % 8192, &[k as u8; 64]).unwrap();
        }
    };
    let (plain, plain_f) = cost(false, setup, ops);
    let (rep, rep_f) = cost(true, setup, ops);
    assert_eq!(plain_f, rep_f, "replicas add no fence");
    assert_eq!(rep, plain, "a commit writes nothing to the replicas");
}

#[test]
fn a_create_or_unlink_writes_a_few_lines_more_with_replicas_and_no_fence() {
    let ops = |fs: &Fs<SimMedium>| {
        for k in 0..50 {
            let name = format!("f{k}");
            fs.create(fs.root(), name.as_bytes(), 0o644, 0, 0).unwrap();
            fs.unlink(fs.root(), name.as_bytes()).unwrap();
        }
    };
    let (plain, plain_f) = cost(false, |_| {}, ops);
    let (rep, rep_f) = cost(true, |_| {}, ops);
    assert_eq!(plain_f, rep_f, "replicas add no fence");
    // The journal's records and header twice, and the touched slots' replicas.
    let (plain, rep) = (plain / 100, rep / 100);
    let extra = rep - plain;
    println!("bytes written per create or unlink: {plain} without replicas, {rep} with");
    assert!((64..=320).contains(&extra), "{extra} more bytes per namespace operation");
}
