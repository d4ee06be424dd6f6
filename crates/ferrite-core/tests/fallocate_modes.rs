//! fallocate's modes in the core: FALLOC_FL_ZERO_RANGE (with and without KEEP_SIZE)
//! zeroes the range and leaves it allocated, in one operation at every crash point;
//! a random mix of writes, zero ranges, punches and truncations matches an in-memory
//! model across remounts; the mode bits map to what is done (unshare is EOPNOTSUPP,
//! as the docs say); a range far past the pool fails at once.

mod common;

use common::*;
use ferrite_core::*;

const MB: u64 = 1 << 20;
const ZERO: FallocMode = FallocMode {
    keep_size: false,
    punch_hole: false,
    zero_range: true,
    shift: None,
    unshare: false,
};
const ZERO_KEEP: FallocMode = FallocMode {
    keep_size: true,
    punch_hole: false,
    zero_range: true,
    shift: None,
    unshare: false,
};

fn file_with(fs: &Fs<SimMedium>, name: &[u8], data: &[u8]) -> u64 {
    let ino = fs.create(fs.root(), name, 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, data).unwrap();
    ino
}

#[test]
fn zero_range_zeroes_and_allocates() {
    let fs = fresh_sim(64 * MB, 1);
    let mut want = Rng(3).bytes(5 * 4096);
    let f = file_with(&fs, b"f", &want);
    // Partial pages at both edges, a whole page between.
    fs.fallocate(f, ZERO, 1000, 9000).unwrap();
    want[1000..10_000].fill(0);
    assert!(fs.read_all(f).unwrap() == want, "zeroed inside");
    assert_eq!(fs.getattr(f).unwrap().size, 5 * 4096);
    // Past the end: the size grows; with KEEP_SIZE it does not, but blocks are
    // allocated (st_blocks) and the range reads as zeros once the file grows.
    fs.fallocate(f, ZERO, 18_000, 10_000).unwrap();
    want.resize(28_000, 0);
    want[18_000..].fill(0);
    assert!(fs.read_all(f).unwrap() == want, "zeroed past the end");
    let before = fs.getattr(f).unwrap();
    fs.fallocate(f, ZERO_KEEP, 28_000, 3 * 4096).unwrap();
    let after = fs.getattr(f).unwrap();
    assert_eq!(after.size, 28_000);
    assert!(after.blocks > before.blocks, "{} -> {}", before.blocks, after.blocks);
    // A sparse file's holes become allocated zeros (SEEK_HOLE moves past them).
    let s = fs.create(fs.root(), b"sparse", 0o644, 0, 0).unwrap().ino;
    fs.setattr(s, &SetAttr { size: Some(64 * 1024), ..Default::default() }).unwrap();
    assert_eq!(fs.seek_data(s, 0, true).unwrap(), 0);
    fs.fallocate(s, ZERO_KEEP, 0, 64 * 1024).unwrap();
    assert_eq!(fs.seek_data(s, 0, true).unwrap(), 64 * 1024);
    assert!(fs.read_all(s).unwrap() == vec![0u8; 64 * 1024], "sparse file zeroed");
    assert_fsck_clean(&fs, "after zero ranges");
}

#[test]
fn mode_bits_map_to_what_is_done() {
    use libc::*;
    let ok = |m: i32| FallocMode::from_flags(m).unwrap();
    assert_eq!(ok(0), FallocMode::default());
    assert_eq!(ok(FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE), ZERO_KEEP);
    assert!(ok(FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).punch_hole);
    assert!(ok(FALLOC_FL_UNSHARE_RANGE).unshare);
    assert!(ok(FALLOC_FL_UNSHARE_RANGE | FALLOC_FL_KEEP_SIZE).keep_size);
    for m in
        [FALLOC_FL_PUNCH_HOLE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE]
    {
        assert_eq!(FallocMode::from_flags(m).unwrap_err().errno(), EOPNOTSUPP, "mode {m:#x}");
    }
    let unshare_zero = FALLOC_FL_UNSHARE_RANGE | FALLOC_FL_ZERO_RANGE;
    assert_eq!(FallocMode::from_flags(unshare_zero).unwrap_err().errno(), EINVAL);
    // A zero range far larger than the pool fails at once and changes nothing.
    let fs = fresh_sim(16 * MB, 1);
    let f = file_with(&fs, b"f", b"kept");
    assert!(matches!(fs.fallocate(f, ZERO, 0, 1 << 50), Err(Error::NoSpace)));
    assert_eq!(fs.read_all(f).unwrap(), b"kept");
}

#[test]
fn random_zero_ranges_match_a_model_across_remounts() {
    let mut fs = fresh_sim(64 * MB, 2);
    let mut rng = Rng(0x5eed);
    let mut model: Vec<u8> = Vec::new();
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    for step in 0..1500 {
        let off = rng.below(96 * 1024);
        let len = 1 + rng.below(20 * 1024);
        match rng.below(10) {
            0..=3 => {
                let d = rng.bytes(len as usize);
                fs.write(f, off, &d).unwrap();
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&d);
            }
            4..=6 => {
                let keep = rng.below(2) == 0;
                fs.fallocate(f, if keep { ZERO_KEEP } else { ZERO }, off, len).unwrap();
                let end = (off + len) as usize;
                if !keep && model.len() < end {
                    model.resize(end, 0);
                }
                let stop = end.min(model.len());
                if (off as usize) < stop {
                    model[off as usize..stop].fill(0);
                }
            }
            7 => {
                let m = FallocMode {
                    keep_size: true,
                    punch_hole: true,
                    zero_range: false,
                    shift: None,
                    unshare: false,
                };
                fs.fallocate(f, m, off, len).unwrap();
                let stop = ((off + len) as usize).min(model.len());
                if (off as usize) < stop {
                    model[off as usize..stop].fill(0);
                }
            }
            8 => {
                let size = rng.below(100 * 1024);
                fs.setattr(f, &SetAttr { size: Some(size), ..Default::default() }).unwrap();
                model.resize(size as usize, 0);
            }
            _ => {
                let how = [Remount::Clean, Remount::CrashCurrent, Remount::CrashDurable];
                fs = remount(fs, how[rng.below(3) as usize]);
            }
        }
        assert_eq!(fs.getattr(f).unwrap().size, model.len() as u64, "step {step}");
        if step % 50 == 0 {
            assert!(fs.read_all(f).unwrap() == model, "step {step}: content differs");
        }
    }
    assert!(fs.read_all(f).unwrap() == model, "content differs at the end");
    assert_fsck_clean(&fs, "after the random run");
}

#[test]
fn zero_range_is_one_operation_at_every_crash_point() {
    let fs = fresh_sim(16 * MB, 1);
    let old = Rng(9).bytes(4 * 4096);
    let f = file_with(&fs, b"f", &old);
    let mut new = old.clone();
    new[100..].fill(0);
    new.resize(20_000, 0);
    assert_file_op_atomic(&fs, f, (&old, &new), 5, "zero range", || {
        fs.fallocate(f, ZERO, 100, 19_900)
    });
}
