//! Reflinks (`Fs::clone_range`, and copy_file_range's aligned middle): a clone
//! shares blocks instead of copying them, each file keeps its own view after
//! either is written, a block is freed only when its last file drops it, the
//! counts survive clean and crashed remounts (recounted from the logs), a clone is
//! one atomic commit with one fence, and the kernel's rules give its errors.

mod common;

use common::*;
use ferrite_core::*;

const MB: u64 = 1 << 20;
const PG: u64 = 4096;

fn truncate(fs: &Fs<SimMedium>, ino: u64, size: u64) {
    fs.setattr(ino, &SetAttr { size: Some(size), ..Default::default() }).unwrap();
}

fn free(fs: &Fs<SimMedium>) -> u64 {
    fs.statfs().bfree
}

#[test]
fn a_clone_shares_blocks_and_each_file_keeps_its_view() {
    let fs = fresh_sim(64 * MB, 1);
    let mut rng = Rng(7);
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    let data = rng.bytes(256 * PG as usize);
    fs.write(a, 0, &data).unwrap();
    let before = free(&fs);
    let fences = fs.medium().fence_count();
    assert_eq!(fs.clone_range(a, 0, b, 0, 0).unwrap(), data.len() as u64);
    assert_eq!(fs.medium().fence_count() - fences, 1, "a clone is one fence");
    // No data block was allocated (a log page at most).
    assert!(before - free(&fs) <= 1, "clone allocated {} blocks", before - free(&fs));
    assert_eq!(fs.shared_blocks().len(), 256);
    assert!(fs.read_all(b).unwrap() == data);
    assert_eq!(fs.getattr(b).unwrap().size, data.len() as u64);
    assert_fsck_clean(&fs, "after the clone");
    // Writes to either file are private to it.
    fs.write(a, 10 * PG + 5, b"source").unwrap();
    fs.write(b, 20 * PG, &[7u8; PG as usize]).unwrap();
    let mut wa = data.clone();
    wa[(10 * PG + 5) as usize..(10 * PG + 11) as usize].copy_from_slice(b"source");
    let mut wb = data.clone();
    wb[(20 * PG) as usize..(21 * PG) as usize].fill(7);
    assert!(fs.read_all(a).unwrap() == wa);
    assert!(fs.read_all(b).unwrap() == wb);
    // The 6-byte write lives in a's log over the still shared block; the page
    // write gave b a block of its own.
    assert_eq!(fs.shared_blocks().len(), 255);
    assert_fsck_clean(&fs, "after private writes");
    // Dropping one file frees nothing shared; dropping both frees everything.
    let mid = free(&fs);
    fs.unlink(fs.root(), b"a").unwrap();
    assert!(free(&fs) - mid <= 3, "shared blocks were freed with the first file");
    assert!(fs.shared_blocks().is_empty());
    assert!(fs.read_all(b).unwrap() == wb);
    assert_fsck_clean(&fs, "after unlinking the source");
    fs.unlink(fs.root(), b"b").unwrap();
    assert!(free(&fs) >= before + 256 - 2, "blocks leaked: {} of {}", free(&fs), before + 256);
    assert_fsck_clean(&fs, "after unlinking both");
}

#[test]
fn counts_survive_clean_and_crashed_remounts() {
    for how in [Remount::Clean, Remount::CrashCurrent, Remount::CrashDurable] {
        let fs = fresh_sim(64 * MB, 2);
        let mut rng = Rng(11);
        let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
        let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
        let data = rng.bytes(64 * PG as usize + 100);
        fs.write(a, 0, &data).unwrap();
        fs.clone_range(a, 0, b, 0, 0).unwrap();
        fs.clone_range(a, 0, b, 128 * PG, 32 * PG).unwrap();
        fs.clone_range(b, 0, b, 256 * PG, 16 * PG).unwrap();
        let shared = fs.shared_blocks();
        let (wa, wb) = (fs.read_all(a).unwrap(), fs.read_all(b).unwrap());
        let fs = remount(fs, how);
        assert_eq!(fs.shared_blocks(), shared, "{how:?}: counts after remount");
        assert!(fs.mount_report().refs_counted, "{how:?}: the logs were walked");
        assert_eq!(fs.mount_report().shared_blocks, shared.len() as u64);
        assert!(fs.read_all(a).unwrap() == wa && fs.read_all(b).unwrap() == wb, "{how:?}");
        // Frees after the remount still respect the counts.
        truncate(&fs, a, 0);
        truncate(&fs, b, 0);
        assert!(fs.shared_blocks().is_empty(), "{how:?}");
        assert_fsck_clean(&fs, &format!("{how:?}: after truncating both"));
        // A pool without shared blocks mounts from its checkpoint without a walk.
        let fs = remount(fs, Remount::Clean);
        assert!(!fs.mount_report().refs_counted, "{how:?}: walked a pool sharing nothing");
    }
}

#[test]
fn a_clone_is_atomic_at_every_crash_point() {
    let fs = fresh_sim(32 * MB, 1);
    let mut rng = Rng(3);
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    let da = rng.bytes(40 * PG as usize);
    fs.write(a, 0, &da).unwrap();
    // A page of the source whose content lives in its log (copied, not shared),
    // and a hole in the source over data of the destination (punched).
    fs.write(a, 3 * PG + 9, b"inline").unwrap();
    fs.fallocate(
        a,
        FallocMode { keep_size: true, punch_hole: true, ..Default::default() },
        8 * PG,
        2 * PG,
    )
    .unwrap();
    let db = rng.bytes(50 * PG as usize);
    fs.write(b, 0, &db).unwrap();
    let src = fs.read_all(a).unwrap();
    let mut new = db.clone();
    new[4 * 1024..4 * 1024 + 40 * PG as usize].copy_from_slice(&src);
    let ctx = "clone into the middle";
    assert_file_op_atomic(&fs, b, (&db, &new), 99, ctx, || {
        fs.clone_range(a, 0, b, PG, 40 * PG).map(|n| assert_eq!(n, 40 * PG))
    });
    assert_fsck_clean(&fs, ctx);
}

#[test]
fn the_kernel_rules_give_the_errors() {
    let fs = fresh_sim(32 * MB, 1);
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    fs.write(a, 0, &vec![1u8; (4 * PG + 100) as usize]).unwrap();
    fs.write(b, 0, &vec![2u8; (8 * PG) as usize]).unwrap();
    let e = |r: Result<u64>| errno(&r);
    assert_eq!(e(fs.clone_range(a, 1, b, 0, PG)), libc::EINVAL, "unaligned source");
    assert_eq!(e(fs.clone_range(a, 0, b, 7, PG)), libc::EINVAL, "unaligned destination");
    assert_eq!(e(fs.clone_range(a, 0, b, 0, 100)), libc::EINVAL, "unaligned length");
    assert_eq!(e(fs.clone_range(a, 8 * PG, b, 0, PG)), libc::EINVAL, "past the source");
    assert_eq!(e(fs.clone_range(a, 0, a, PG, 2 * PG)), libc::EINVAL, "overlap");
    // The source's unaligned end may not land inside the destination.
    assert_eq!(e(fs.clone_range(a, 0, b, 0, 0)), libc::EINVAL, "EOF block inside");
    assert_eq!(fs.clone_range(b, 8 * PG, a, 0, 0).unwrap(), 0, "empty at EOF");
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    assert_eq!(e(fs.clone_range(d, 0, b, 0, PG)), libc::EISDIR);
    let last = ferrite_core::layout::MAX_FILE_SIZE / PG * PG;
    assert_eq!(e(fs.clone_range(a, 0, b, last, PG)), libc::EFBIG);
    // Nothing above changed either file.
    assert!(fs.read_all(b).unwrap() == vec![2u8; (8 * PG) as usize]);
    assert!(fs.shared_blocks().is_empty());
    // To the source's end, at or past the destination's end: allowed.
    assert_eq!(fs.clone_range(a, 0, b, 8 * PG, 0).unwrap(), 4 * PG + 100);
    assert_eq!(fs.getattr(b).unwrap().size, 12 * PG + 100);
    // Within one file, disjoint.
    assert_eq!(fs.clone_range(b, 0, b, 16 * PG, 2 * PG).unwrap(), 2 * PG);
    assert_fsck_clean(&fs, "after the valid clones");
}

#[test]
fn copy_range_shares_the_pages_that_line_up() {
    let fs = fresh_sim(64 * MB, 1);
    let mut rng = Rng(5);
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    let data = rng.bytes(100 * PG as usize);
    fs.write(a, 0, &data).unwrap();
    // Same offset modulo the page: the 98 whole pages between are shared.
    let n = fs.copy_range_as(a, 100, b, PG + 100, 99 * PG, || false).unwrap();
    assert_eq!(n, 99 * PG);
    assert_eq!(fs.shared_blocks().len(), 98);
    let got = fs.read_all(b).unwrap();
    assert!(got[(PG + 100) as usize..] == data[100..100 + 99 * PG as usize]);
    // Different offsets modulo the page: copied.
    let c = fs.create(fs.root(), b"c", 0o644, 0, 0).unwrap().ino;
    fs.copy_range_as(a, 100, c, 0, 10 * PG, || false).unwrap();
    assert_eq!(fs.shared_blocks().len(), 98);
    assert_fsck_clean(&fs, "after the copies");
}

#[test]
fn unshare_and_dax_pins_give_files_their_own_blocks() {
    let fs = fresh_sim(64 * MB, 1);
    let mut rng = Rng(9);
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    let data = rng.bytes(16 * PG as usize);
    fs.write(a, 0, &data).unwrap();
    fs.clone_range(a, 0, b, 0, 0).unwrap();
    // FALLOC_FL_UNSHARE_RANGE over half of b.
    let unshare = FallocMode::from_flags(libc::FALLOC_FL_UNSHARE_RANGE).unwrap();
    fs.fallocate(b, unshare, 0, 8 * PG).unwrap();
    assert_eq!(fs.shared_blocks().len(), 8);
    assert!(fs.read_all(b).unwrap() == data);
    // A DAX pin of a makes every page of it its own: no mapped block is shared.
    let runs = fs.dax_pin(a, 0, 16 * PG).unwrap();
    assert!(fs.shared_blocks().is_empty());
    let shared_b: Vec<u64> = runs.iter().flat_map(|&(_, blk, n)| blk..blk + n).collect();
    assert_eq!(shared_b.len(), 16);
    // A clone from a pinned file copies; into a pinned file is EBUSY.
    let c = fs.create(fs.root(), b"c", 0o644, 0, 0).unwrap().ino;
    fs.clone_range(a, 0, c, 0, 0).unwrap();
    assert!(fs.shared_blocks().is_empty());
    assert!(fs.read_all(c).unwrap() == data);
    assert_eq!(errno(&fs.clone_range(c, 0, a, 0, PG)), libc::EBUSY);
    fs.dax_unpin(a).unwrap();
    assert_fsck_clean(&fs, "after unshare and pin");
}

/// Random writes, clones, truncates, punches and remounts against an in-memory
/// model of three files; fsck after every step batch.
#[test]
fn random_clones_match_a_model() {
    let mut fs = fresh_sim(64 * MB, 2);
    let mut rng = Rng(0xc10e);
    let names: [&[u8]; 3] = [b"x", b"y", b"z"];
    let mut inos: Vec<u64> =
        names.iter().map(|n| fs.create(fs.root(), n, 0o644, 0, 0).unwrap().ino).collect();
    let mut model: Vec<Vec<u8>> = vec![Vec::new(); 3];
    for step in 0..1200 {
        let f = rng.below(3) as usize;
        match rng.below(12) {
            0..=3 => {
                let off = rng.below(48 * PG);
                let n = 1 + rng.below(3 * PG) as usize;
                let d = rng.bytes(n);
                fs.write(inos[f], off, &d).unwrap();
                let end = off as usize + d.len();
                if model[f].len() < end {
                    model[f].resize(end, 0);
                }
                model[f][off as usize..end].copy_from_slice(&d);
            }
            4..=7 => {
                let g = rng.below(3) as usize;
                let (pi, po) = (rng.below(40), rng.below(40));
                let len = rng.below(12) * PG;
                let r = fs.clone_range(inos[f], pi * PG, inos[g], po * PG, len);
                let mut m = model.clone();
                let ok = model_clone(&mut m, f, pi * PG, g, po * PG, len);
                match (r, ok) {
                    (Ok(n), Some(want)) => {
                        assert_eq!(n, want, "step {step}");
                        model = m;
                    }
                    (Err(e), None) => assert_eq!(e.errno(), libc::EINVAL, "step {step}"),
                    (r, ok) => panic!("step {step}: core {r:?}, model {ok:?}"),
                }
            }
            8 => {
                let size = rng.below(48 * PG);
                truncate(&fs, inos[f], size);
                model[f].resize(size as usize, 0);
            }
            9 => {
                let (off, len) = (rng.below(40 * PG), 1 + rng.below(8 * PG));
                let punch = FallocMode { keep_size: true, punch_hole: true, ..Default::default() };
                fs.fallocate(inos[f], punch, off, len).unwrap();
                let end = ((off + len) as usize).min(model[f].len());
                if (off as usize) < end {
                    model[f][off as usize..end].fill(0);
                }
            }
            10 => {
                fs.unlink(fs.root(), names[f]).unwrap();
                inos[f] = fs.create(fs.root(), names[f], 0o644, 0, 0).unwrap().ino;
                model[f].clear();
            }
            _ => {
                let how = [Remount::Clean, Remount::CrashCurrent, Remount::CrashDurable]
                    [rng.below(3) as usize];
                fs = remount(fs, how);
            }
        }
        for k in 0..3 {
            assert!(fs.read_all(inos[k]).unwrap() == model[k], "step {step}: file {k} differs");
        }
        if step % 50 == 0 {
            assert_fsck_clean(&fs, &format!("step {step}"));
        }
    }
    assert_fsck_clean(&fs, "the end");
}

/// The model of a clone: `None` where the core must say EINVAL.
fn model_clone(
    m: &mut [Vec<u8>],
    f: usize,
    off_in: u64,
    g: usize,
    off_out: u64,
    len: u64,
) -> Option<u64> {
    let ssize = m[f].len() as u64;
    if len == 0 && off_in == ssize {
        return Some(0);
    }
    if off_in >= ssize {
        return None;
    }
    let len = if len == 0 { ssize - off_in } else { len.min(ssize - off_in) };
    let to_eof = off_in + len == ssize;
    if !to_eof && len % PG != 0 {
        return None;
    }
    let bcount = len.next_multiple_of(PG);
    if f == g && off_out < off_in + bcount && off_in < off_out + bcount {
        return None;
    }
    if len % PG != 0 && off_out + len < m[g].len() as u64 {
        return None;
    }
    let src = m[f][off_in as usize..(off_in + len) as usize].to_vec();
    let end = (off_out + len) as usize;
    if m[g].len() < end {
        m[g].resize(end, 0);
    }
    m[g][off_out as usize..end].copy_from_slice(&src);
    Some(len)
}

/// Regression (found in review before it shipped): the first clone walked every
/// page of the range, so a clone of a sparse file of 2^50 bytes would have run for
/// days holding both files' locks (as fallocate once did). The clone and unshare
/// now walk the runs and overlays, bounded by what the pool holds.
#[test]
fn a_clone_of_a_huge_sparse_file_walks_runs_not_pages() {
    let fs = fresh_sim(32 * MB, 1);
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0).unwrap().ino;
    let b = fs.create(fs.root(), b"b", 0o644, 0, 0).unwrap().ino;
    let far = 1u64 << 50;
    fs.write(a, 0, &[1u8; PG as usize]).unwrap();
    fs.write(a, far, &[2u8; PG as usize]).unwrap();
    fs.write(a, far + 3 * PG + 5, b"embedded").unwrap();
    fs.write(b, 7 * PG, &[3u8; PG as usize]).unwrap();
    let size = far + 3 * PG + 13;
    assert_eq!(fs.clone_range(a, 0, b, 0, 0).unwrap(), size);
    assert_eq!(fs.getattr(b).unwrap().size, size);
    assert_eq!(fs.shared_blocks().len(), 2);
    let mut buf = [9u8; 16];
    fs.read(b, 7 * PG, &mut buf).unwrap();
    assert_eq!(buf, [0u8; 16], "the source's hole replaced b's data");
    fs.read(b, far + 3 * PG + 5, &mut buf[..8]).unwrap();
    assert_eq!(&buf[..8], b"embedded");
    let unshare = FallocMode::from_flags(libc::FALLOC_FL_UNSHARE_RANGE | libc::FALLOC_FL_KEEP_SIZE);
    let unshare = unshare.unwrap();
    // Over the whole file it would also allocate 2^50 bytes of holes: ENOSPC, with
    // the file's content as it was.
    assert!(matches!(fs.fallocate(b, unshare, 0, size), Err(Error::NoSpace)));
    fs.fallocate(b, unshare, far, size - far).unwrap();
    fs.fallocate(b, unshare, 0, PG).unwrap();
    assert!(fs.shared_blocks().is_empty());
    fs.read(b, far + 3 * PG + 5, &mut buf[..8]).unwrap();
    assert_eq!(&buf[..8], b"embedded");
    assert_fsck_clean(&fs, "after the sparse clone and unshare");
}
