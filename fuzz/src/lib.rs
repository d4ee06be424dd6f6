//! The body of the `mount_fsck` fuzz target, in a library so that a stable-toolchain
//! smoke test (`crates/ferrite-core/tests/fuzz_smoke.rs`, in CI) can run it too.
//!
//! Input format (first byte selects the mode):
//! - even first byte: the rest is a raw pool image, zero-padded to at least
//!   256 KiB and to a whole number of 4 KiB blocks (at most 4 MiB is used);
//! - odd first byte: a *recipe*: byte `k`, then `k` four-byte operations run on a
//!   fresh 256 KiB pool, then a flags byte (bit 0: crash instead of unmount, bit 1:
//!   take the durable image rather than the current one), then five-byte damage
//!   records (little-endian u32 offset modulo the image length, XOR byte). This mode
//!   lets the fuzzer reach deep states of valid pools without a corpus.
//!
//! Invariant checked: mounting, fsck, scrub's checks (`check_pool`), repair and
//! reading never panic or hang; a pool that fsck calls clean stays clean through
//! further operations and a remount.

use ferrite_core::{
    Error, FallocMode, FileType, Fs, Medium, MkfsOptions, MountOptions, RenameFlags, SetAttr,
    SimMedium, XattrSet,
};

const MIN_IMAGE: usize = 256 * 1024;
const MAX_IMAGE: usize = 4 << 20;
const NAMES: [&[u8]; 8] = [b"a", b"b", b"c", b"dir", b"x.txt", b"..", b".", b"longer-name"];

/// Run one fuzz input.
pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let img = if mode & 1 == 0 { raw_image(rest) } else { recipe_image(rest) };
    probe(img);
}

fn raw_image(bytes: &[u8]) -> Vec<u8> {
    let mut img = bytes[..bytes.len().min(MAX_IMAGE)].to_vec();
    let len = img.len().max(MIN_IMAGE).div_ceil(4096) * 4096;
    img.resize(len, 0);
    img
}

fn recipe_image(bytes: &[u8]) -> Vec<u8> {
    let fs = match Fs::mkfs(
        SimMedium::new(MIN_IMAGE as u64),
        &MkfsOptions { shards: 1, uuid: Some([7; 16]), ..Default::default() },
    ) {
        Ok(fs) => fs,
        Err(e) => panic!("mkfs of a 256 KiB pool failed: {e}"),
    };
    let (&k, mut rest) = bytes.split_first().unwrap_or((&0, &[]));
    let mut dirs = vec![fs.root()];
    let mut files: Vec<u64> = Vec::new();
    for _ in 0..k {
        if rest.len() < 4 {
            break;
        }
        let (op, tail) = rest.split_at(4);
        rest = tail;
        apply_op(&fs, op, &mut dirs, &mut files);
    }
    let (&flags, damage) = rest.split_first().unwrap_or((&0, &[]));
    let mut img = if flags & 1 == 1 {
        let m = fs.crash();
        if flags & 2 == 2 {
            m.durable_image()
        } else {
            m.current_image()
        }
    } else {
        match fs.unmount() {
            Ok(m) => m.current_image(),
            Err(e) => panic!("unmount of an undamaged pool failed: {e}"),
        }
    };
    let n = img.len();
    for rec in damage.chunks_exact(5) {
        let off = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]) as usize % n;
        img[off] ^= rec[4];
    }
    img
}

fn pick(v: &[u64], i: u8) -> Option<u64> {
    (!v.is_empty()).then(|| v[i as usize % v.len()])
}

fn apply_op(fs: &Fs<SimMedium>, op: &[u8], dirs: &mut Vec<u64>, files: &mut Vec<u64>) {
    let (a, b, c) = (op[1], op[2], op[3]);
    let name = |x: u8| NAMES[x as usize % NAMES.len()];
    let dir = pick(dirs, a).unwrap_or(1);
    match op[0] % 12 {
        0 => {
            if let Ok(at) = fs.create(dir, name(b), 0o644, 0, 0) {
                files.push(at.ino);
            }
        }
        1 => {
            if let Ok(at) = fs.mkdir(dir, name(b), 0o755, 0, 0) {
                dirs.push(at.ino);
            }
        }
        2 => {
            if let Some(f) = pick(files, a) {
                let data = vec![c; c as usize * 33 + 1];
                let _ = fs.write(f, b as u64 * 97, &data);
            }
        }
        3 => {
            let long = vec![b'l'; 3000];
            let t: &[u8] = if c % 2 == 0 { b"a/b" } else { &long };
            let _ = fs.symlink(dir, name(b), t, 0, 0);
        }
        4 => {
            if let (Some(f), Some(d)) = (pick(files, a), pick(dirs, b)) {
                let _ = fs.link(f, d, name(c));
            }
        }
        5 => {
            let _ = fs.unlink(dir, name(b));
            let _ = fs.rmdir(dir, name(c));
        }
        6 => {
            let d2 = pick(dirs, c).unwrap_or(1);
            let flags = RenameFlags { noreplace: c & 1 == 1, exchange: c & 2 == 2 };
            let _ = fs.rename(dir, name(b), d2, name(c >> 2), flags);
        }
        7 => {
            let target = if b % 2 == 0 { dir } else { pick(files, b).unwrap_or(dir) };
            let key: &[u8] = if c % 2 == 0 { b"user.k" } else { b"trusted.t" };
            let _ = fs.setxattr(target, key, &vec![b; c as usize * 11], XattrSet::Any);
        }
        8 => {
            if let Some(f) = pick(files, a) {
                let ch = SetAttr { size: Some(b as u64 * 113), ..Default::default() };
                let _ = fs.setattr(f, &ch);
            }
        }
        9 => {
            if let Some(f) = pick(files, a) {
                // Every mode: plain, keep size, punch, collapse, zero range, insert.
                let flags = [0i32, 1, 3, 8, 16, 32][c as usize % 6];
                if let Ok(mode) = FallocMode::from_flags(flags) {
                    let (off, len) = if flags & 40 != 0 {
                        (b as u64 % 4 * 4096, (c as u64 % 3 + 1) * 4096)
                    } else {
                        (b as u64 * 50, c as u64 * 70 + 1)
                    };
                    let _ = fs.fallocate(f, mode, off, len);
                }
            }
        }
        10 => {
            if let Some(f) = pick(files, a) {
                let _ = fs.open(f);
                if b % 2 == 0 {
                    let _ = fs.unlink(dir, name(c));
                }
            }
        }
        _ => {
            if let Some(f) = pick(files, a) {
                for i in 0..(b as u64 % 64) {
                    let _ = fs.write(f, (i * 40) % 4000, &[c; 40]);
                }
            }
        }
    }
}

fn probe(img: Vec<u8>) {
    // What `ferrite scrub` and `fsck -n` run: never a panic.
    let _ = ferrite_core::integrity::check_pool(SimMedium::from_image(img.clone()), &mut |_, _| {});
    let m = SimMedium::from_image(img);
    // What `ferrite fsck` runs before it mounts: slots restored from their replicas.
    let _ = ferrite_core::integrity::repair_replicas_raw(&m);
    let Ok(fs) = Fs::mount(m, &MountOptions { workers: 1, ..Default::default() }) else {
        return;
    };
    let Ok(report) = fs.fsck() else { return };
    walk(&fs);
    if !report.is_clean() {
        // What `fsck --repair` runs, then the check of its result: never a panic.
        let _ = fs.repair();
        if let Ok(m) = fs.unmount() {
            let img = m.current_image();
            let _ = ferrite_core::integrity::check_pool(SimMedium::from_image(img), &mut |_, _| {});
        }
        return;
    }
    mutate(&fs);
    match fs.fsck() {
        Ok(r) if r.is_clean() => {}
        r => panic!("a fsck-clean pool became inconsistent after operations: {r:?}"),
    }
    let m = match fs.unmount() {
        Ok(m) => m,
        Err(e) => panic!("unmount of a fsck-clean pool failed: {e}"),
    };
    let fs = match Fs::mount(m, &MountOptions::default()) {
        Ok(fs) => fs,
        Err(e) => panic!("remount of a fsck-clean pool failed: {e}"),
    };
    match fs.fsck() {
        Ok(r) if r.is_clean() => {}
        r => panic!("a fsck-clean pool is inconsistent after a remount: {r:?}"),
    }
}

/// Read everything reachable (bounded); errors are fine.
fn walk<M: Medium>(fs: &Fs<M>) {
    let mut stack = vec![fs.root()];
    let mut seen = std::collections::HashSet::new();
    let mut budget = 10_000usize;
    while let Some(d) = stack.pop() {
        if !seen.insert(d) {
            continue;
        }
        let Ok(entries) = fs.list_dir(d) else { continue };
        for e in entries {
            budget = match budget.checked_sub(1) {
                Some(b) => b,
                None => return,
            };
            if let Ok(names) = fs.listxattr(e.ino) {
                for n in names {
                    let _ = fs.getxattr(e.ino, &n);
                }
            }
            match e.ftype {
                FileType::Directory => stack.push(e.ino),
                FileType::Symlink => {
                    let _ = fs.readlink(e.ino);
                }
                FileType::Fifo
                | FileType::CharDevice
                | FileType::BlockDevice
                | FileType::Socket => {}
                FileType::Regular => {
                    let mut buf = vec![0u8; 16 << 10];
                    let mut off = 0u64;
                    while off < (1 << 20) {
                        match fs.read(e.ino, off, &mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => off += n as u64,
                        }
                    }
                }
            }
        }
    }
    let _ = fs.resolve(b"/dir/a/../b", true);
    let _ = fs.statfs();
}

fn mutate<M: Medium>(fs: &Fs<M>) {
    let root = fs.root();
    match fs.create(root, b"fuzz-new", 0o644, 0, 0) {
        Ok(a) => {
            let _ = fs.write(a.ino, 0, &[1u8; 6000]);
            let _ = fs.rename(root, b"fuzz-new", root, b"fuzz-renamed", RenameFlags::default());
            let _ = fs.unlink(root, b"fuzz-renamed");
        }
        Err(Error::NoSpace) | Err(Error::Exists) => {}
        Err(_) => {}
    }
    for name in NAMES {
        if let Ok(i) = fs.lookup_ino(root, name) {
            let _ = fs.write(i, 0, b"overwritten");
            let _ = fs.setattr(i, &SetAttr { size: Some(3), ..Default::default() });
            let _ = fs.unlink(root, name);
            let _ = fs.rmdir(root, name);
        }
    }
}
