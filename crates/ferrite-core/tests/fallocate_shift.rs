//! FALLOC_FL_COLLAPSE_RANGE and FALLOC_FL_INSERT_RANGE in the core: the pages after
//! the range move down or up by its length with one SHIFT entry and one fence (no
//! data copied and nothing per page, pinned by the bytes the medium sees), ext4's
//! errors for bad ranges, a random mix with writes, punches, truncations and log
//! compaction against a model across remounts, and before-or-after at every crash
//! point.

mod common;

use common::*;
use ferrite_core::*;

const MB: u64 = 1 << 20;
const PAGE: u64 = 4096;
const COLLAPSE: FallocMode = FallocMode {
    keep_size: false,
    punch_hole: false,
    zero_range: false,
    shift: Some(Shift::Collapse),
    unshare: false,
};
const INSERT: FallocMode = FallocMode {
    keep_size: false,
    punch_hole: false,
    zero_range: false,
    shift: Some(Shift::Insert),
    unshare: false,
};
const PUNCH: FallocMode = FallocMode {
    keep_size: true,
    punch_hole: true,
    zero_range: false,
    shift: None,
    unshare: false,
};

fn collapse(model: &mut Vec<u8>, off: u64, len: u64) {
    model.drain(off as usize..(off + len) as usize);
}

fn insert(model: &mut Vec<u8>, off: u64, len: u64) {
    let tail = model.split_off(off as usize);
    model.resize((off + len) as usize, 0);
    model.extend(tail);
}

/// A file of whole pages, embedded small writes (page overlays), a hole and a
/// partial last page.
fn mixed_file(fs: &Fs<SimMedium>, name: &[u8], rng: &mut Rng) -> (u64, Vec<u8>) {
    let f = fs.create(fs.root(), name, 0o644, 0, 0).unwrap().ino;
    let mut model = rng.bytes(12 * PAGE as usize);
    fs.write(f, 0, &model).unwrap();
    for (off, len) in [(5000u64, 40usize), (3 * PAGE + 7, 100), (9 * PAGE + 4000, 200)] {
        let d = rng.bytes(len);
        fs.write(f, off, &d).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&d);
    }
    fs.fallocate(f, PUNCH, 6 * PAGE, 2 * PAGE).unwrap();
    model[6 * PAGE as usize..8 * PAGE as usize].fill(0);
    let tail = rng.bytes(1234);
    fs.write(f, 12 * PAGE, &tail).unwrap();
    model.extend(tail);
    assert!(fs.read_all(f).unwrap() == model);
    (f, model)
}

#[test]
fn collapse_and_insert_move_pages_without_copying_them() {
    let fs = fresh_sim(64 * MB, 1);
    let mut rng = Rng(11);
    let (f, mut model) = mixed_file(&fs, b"f", &mut rng);
    fs.fallocate(f, COLLAPSE, 2 * PAGE, 3 * PAGE).unwrap();
    collapse(&mut model, 2 * PAGE, 3 * PAGE);
    assert!(fs.read_all(f).unwrap() == model, "after collapse");
    assert_eq!(fs.getattr(f).unwrap().size, model.len() as u64);
    fs.fallocate(f, INSERT, PAGE, 2 * PAGE).unwrap();
    insert(&mut model, PAGE, 2 * PAGE);
    assert!(fs.read_all(f).unwrap() == model, "after insert");
    // The inserted range is a hole.
    assert_eq!(fs.seek_data(f, PAGE, true).unwrap(), PAGE);
    assert_eq!(fs.seek_data(f, PAGE, false).unwrap(), 3 * PAGE);
    assert_fsck_clean(&fs, "after collapse and insert");

    // A large file: collapsing its first page moves 4,095 pages with one entry:
    // the medium sees a few cache lines, not 16 MiB of data or an entry per page.
    let big = fs.create(fs.root(), b"big", 0o644, 0, 0).unwrap().ino;
    let data = rng.bytes(16 * MB as usize);
    fs.write(big, 0, &data).unwrap();
    let before = fs.medium().stats().snapshot();
    fs.fallocate(big, COLLAPSE, 0, PAGE).unwrap();
    let after = fs.medium().stats().snapshot();
    let written = (after.nt_bytes - before.nt_bytes) + (after.flushed_bytes - before.flushed_bytes);
    assert!(written <= 512, "collapse wrote {written} bytes for a 16 MiB file");
    assert_eq!(after.fences - before.fences, 1, "one fence");
    assert!(fs.read_all(big).unwrap() == data[PAGE as usize..], "big file after collapse");
    let free = fs.statfs().bfree;
    fs.fallocate(big, INSERT, 8 * MB, MB).unwrap();
    let used = free - fs.statfs().bfree;
    assert!(used <= 1, "an insert took {used} blocks (at most a log page)");
    let mut want = data[PAGE as usize..].to_vec();
    insert(&mut want, 8 * MB, MB);
    assert!(fs.read_all(big).unwrap() == want, "big file after insert");
    assert_fsck_clean(&fs, "after moving a large file's pages");
}

#[test]
fn bad_ranges_fail_as_on_ext4_and_change_nothing() {
    let fs = fresh_sim(16 * MB, 1);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let data = Rng(2).bytes(5 * PAGE as usize + 10);
    fs.write(f, 0, &data).unwrap();
    let einval = libc::EINVAL;
    for (mode, off, len, want) in [
        (COLLAPSE, 100, PAGE, einval),      // unaligned offset
        (COLLAPSE, PAGE, 100, einval),      // unaligned length
        (COLLAPSE, PAGE, 5 * PAGE, einval), // reaches EOF
        (COLLAPSE, 6 * PAGE, PAGE, einval), // past EOF
        (INSERT, 6 * PAGE, PAGE, einval),   // at or past EOF
        (INSERT, PAGE, 3, einval),          // unaligned length
        (INSERT, 0, i64::MAX as u64 / PAGE * PAGE, libc::EFBIG), // past the largest file
    ] {
        assert_eq!(errno(&fs.fallocate(f, mode, off, len)), want, "{mode:?} {off}+{len}");
    }
    assert!(fs.read_all(f).unwrap() == data);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    assert_eq!(errno(&fs.fallocate(d, COLLAPSE, 0, PAGE)), libc::EISDIR);
    // The mode bits: exclusive, as vfs_fallocate wants them.
    use libc::*;
    assert_eq!(FallocMode::from_flags(FALLOC_FL_COLLAPSE_RANGE).unwrap(), COLLAPSE);
    assert_eq!(FallocMode::from_flags(FALLOC_FL_INSERT_RANGE).unwrap(), INSERT);
    for m in [
        FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_KEEP_SIZE,
        FALLOC_FL_INSERT_RANGE | FALLOC_FL_KEEP_SIZE,
        FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_ZERO_RANGE,
        FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE,
    ] {
        assert_eq!(FallocMode::from_flags(m).unwrap_err().errno(), EINVAL, "mode {m:#x}");
    }
    assert_fsck_clean(&fs, "after refused shifts");
}

#[test]
fn random_shifts_match_a_model_across_remounts() {
    let mut fs = fresh_sim(64 * MB, 2);
    let mut rng = Rng(0x5_1f7);
    let mut model: Vec<u8> = Vec::new();
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    for step in 0..2000 {
        let size = model.len() as u64;
        let pages = size.div_ceil(PAGE);
        match rng.below(12) {
            0..=3 => {
                let off = rng.below(128 * 1024);
                let len = 1 + if rng.below(3) == 0 { rng.below(30_000) } else { rng.below(300) };
                let d = rng.bytes(len as usize);
                fs.write(f, off, &d).unwrap();
                let end = (off + len) as usize;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&d);
            }
            4 | 5 if pages >= 2 => {
                let off = rng.below(pages - 1) * PAGE;
                let max = (size - 1 - off) / PAGE; // pages that leave data after the range
                if max == 0 {
                    continue;
                }
                let len = (1 + rng.below(max)) * PAGE;
                fs.fallocate(f, COLLAPSE, off, len).unwrap();
                collapse(&mut model, off, len);
            }
            6 | 7 if size > 0 && size < 160 * 1024 => {
                let off = rng.below(pages) * PAGE;
                let len = (1 + rng.below(6)) * PAGE;
                fs.fallocate(f, INSERT, off, len).unwrap();
                insert(&mut model, off, len);
            }
            8 => {
                let off = rng.below(128 * 1024);
                let len = 1 + rng.below(20_000);
                fs.fallocate(f, PUNCH, off, len).unwrap();
                let stop = ((off + len) as usize).min(model.len());
                if (off as usize) < stop {
                    model[off as usize..stop].fill(0);
                }
            }
            9 => {
                let n = rng.below(140 * 1024);
                fs.setattr(f, &SetAttr { size: Some(n), ..Default::default() }).unwrap();
                model.resize(n as usize, 0);
            }
            10 => {
                let how = [Remount::Clean, Remount::CrashCurrent, Remount::CrashDurable];
                fs = remount(fs, how[rng.below(3) as usize]);
            }
            // Thorough GC rewrites the log from the shifted index.
            _ => fs.compact(f).unwrap(),
        }
        assert_eq!(fs.getattr(f).unwrap().size, model.len() as u64, "step {step}");
        if step % 25 == 0 {
            assert!(fs.read_all(f).unwrap() == model, "step {step}: content differs");
        }
    }
    assert!(fs.read_all(f).unwrap() == model, "content differs at the end");
    assert_fsck_clean(&fs, "after the random run");
    let fs = remount(fs, Remount::Clean);
    assert!(fs.read_all(f).unwrap() == model, "content differs after a clean remount");
}

#[test]
fn a_shift_is_one_operation_at_every_crash_point() {
    for shift in [COLLAPSE, INSERT] {
        let fs = fresh_sim(16 * MB, 1);
        let mut rng = Rng(5);
        let (f, old) = mixed_file(&fs, b"f", &mut rng);
        let mut new = old.clone();
        if shift == COLLAPSE {
            collapse(&mut new, PAGE, 4 * PAGE);
        } else {
            insert(&mut new, PAGE, 4 * PAGE);
        }
        let ctx = format!("{shift:?}");
        assert_file_op_atomic(&fs, f, (&old, &new), 7, &ctx, || {
            fs.fallocate(f, shift, PAGE, 4 * PAGE)
        });
    }
}
