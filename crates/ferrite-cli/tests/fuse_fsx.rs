//! An fsx equivalent (Debian 12 packages neither fsx nor xfstests): bounded random
//! read / write / truncate / mmap read / mmap write / fallocate (allocate, keep size,
//! collapse range, insert range,
//! punch hole, zero range with and without keep size, unshare range) /
//! copy_file_range / FICLONERANGE (reflinks) / fsync / reopen sequences on files of a mounted pool, every result checked against
//! an in-memory model of the file, then the whole file checked again after a remount.
//! Two files are exercised at once, from two threads, to keep several daemon threads
//! busy. `FERRITE_FSX_OPS=n` sets the operations per file (default 4000),
//! `FERRITE_FSX_SEED=s` the seed.
//!
//! The kernel's FUSE client refuses FALLOC_FL_COLLAPSE_RANGE, INSERT_RANGE and
//! UNSHARE_RANGE, and the FICLONERANGE ioctl, itself (EOPNOTSUPP; the request
//! never reaches the daemon), so the run on the mount checks that refusal, and a
//! second run in a process with the preload library, where the core serves
//! fallocate and the ioctl, exercises them among the others.

mod fuse_util;

use fuse_util::{Mount, Rng};
use rustix::fs::{self as rfs, FallocateFlags, Mode, OFlags, CWD};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

const FILE_MAX: u64 = 600 * 1024;
const PAGE: u64 = 4096;

/// Unsafe code of these tests: mapping a file region (and `copy_range` below).
mod map {
    use rustix::mm::{self, MapFlags, MsyncFlags, ProtFlags};
    use std::os::fd::OwnedFd;

    /// Copy `data` into the file at `off` through a shared mapping, msync it.
    /// The caller guarantees `off + data.len()` is within the file size.
    pub fn write(fd: &OwnedFd, off: u64, data: &[u8]) -> rustix::io::Result<()> {
        let start = off / 4096 * 4096;
        let len = (off - start) as usize + data.len();
        // SAFETY: a fresh shared mapping of `len` bytes of a file we hold open, inside
        // its size (checked by the caller), used only in this function and unmapped
        // before returning; nothing else in this process maps the file.
        unsafe {
            let p = mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                start,
            )?;
            let s = std::slice::from_raw_parts_mut(p as *mut u8, len);
            s[(off - start) as usize..].copy_from_slice(data);
            let r = mm::msync(p, len, MsyncFlags::SYNC);
            mm::munmap(p, len)?;
            r
        }
    }

    /// Read `len` bytes at `off` through a shared mapping (within the file size).
    pub fn read(fd: &OwnedFd, off: u64, len: usize) -> rustix::io::Result<Vec<u8>> {
        let start = off / 4096 * 4096;
        let mlen = (off - start) as usize + len;
        // SAFETY: as in `write`; the mapping is only read, then unmapped.
        unsafe {
            let p =
                mm::mmap(std::ptr::null_mut(), mlen, ProtFlags::READ, MapFlags::SHARED, fd, start)?;
            let v =
                std::slice::from_raw_parts(p as *const u8, mlen)[(off - start) as usize..].to_vec();
            mm::munmap(p, mlen)?;
            Ok(v)
        }
    }
}

fn open(p: &Path) -> OwnedFd {
    rfs::openat(
        CWD,
        p,
        OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC,
        Mode::from_bits_retain(0o644),
    )
    .expect("open")
}

fn read_all(fd: &OwnedFd, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len + 17];
    let mut done = 0;
    loop {
        let n = rustix::io::pread(fd, &mut v[done..], done as u64).expect("pread");
        if n == 0 {
            break;
        }
        done += n;
    }
    v.truncate(done);
    v
}

/// copy_file_range through libc's symbol (rustix makes the system call itself,
/// which the preload library could not see).
fn copy_range(fd: &OwnedFd, a: u64, b: u64, len: usize) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let (mut x, mut y) = (a as i64, b as i64);
    // SAFETY: a descriptor we own and two offsets on this stack frame.
    let n =
        unsafe { libc::copy_file_range(fd.as_raw_fd(), &mut x, fd.as_raw_fd(), &mut y, len, 0) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// ioctl(FICLONERANGE) through libc's symbol (so the preload library sees it):
/// `len` bytes (0: to the end of file) from `a` to `b` within one file.
fn clone_range(fd: &OwnedFd, a: u64, len: u64, b: u64) -> Result<(), rustix::io::Errno> {
    use std::os::fd::AsRawFd;
    let arg = libc::file_clone_range {
        src_fd: fd.as_raw_fd() as i64,
        src_offset: a,
        src_length: len,
        dest_offset: b,
    };
    // SAFETY: a descriptor we own and an argument struct on this stack frame.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::FICLONERANGE, &arg) };
    if r < 0 {
        return Err(rustix::io::Errno::from_raw_os_error(
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
        ));
    }
    Ok(())
}

fn first_diff(a: &[u8], b: &[u8]) -> String {
    let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
    format!("lengths {} vs {}, first difference at byte {i}", a.len(), b.len())
}

/// Run `ops` random operations on `path`; returns the model's final contents.
/// `shifts`: collapse and insert ranges are served (else EOPNOTSUPP is expected).
fn fsx(path: &Path, seed: u64, ops: usize, shifts: bool) -> Result<Vec<u8>, String> {
    let mut r = Rng(seed);
    let mut fd = open(path);
    rfs::ftruncate(&fd, 0).map_err(|e| e.to_string())?;
    let mut model: Vec<u8> = Vec::new();
    let mut log: Vec<String> = Vec::new();
    for i in 0..ops {
        let size = model.len() as u64;
        let k = r.below(100);
        let desc;
        match k {
            0..=29 => {
                let off = r.below(FILE_MAX);
                let max = if r.pct(20) { 70_000 } else { 9000 };
                let len = (1 + r.below(max)).min(FILE_MAX - off) as usize;
                let data = r.bytes(len);
                desc = format!("write {off}+{len}");
                let n = rustix::io::pwrite(&fd, &data, off).map_err(|e| format!("{desc}: {e}"))?;
                if n != len {
                    return Err(format!("{desc}: short write {n}"));
                }
                let end = off as usize + len;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[off as usize..end].copy_from_slice(&data);
            }
            30..=49 => {
                let off = r.below(FILE_MAX + 5000);
                let len = 1 + r.below(40_000) as usize;
                desc = format!("read {off}+{len}");
                let mut b = vec![0u8; len];
                let n =
                    rustix::io::pread(&fd, &mut b[..], off).map_err(|e| format!("{desc}: {e}"))?;
                let want = if off >= size {
                    &[][..]
                } else {
                    &model[off as usize..(off as usize + len).min(model.len())]
                };
                if &b[..n] != want {
                    return Err(format!("{desc}: {}", first_diff(&b[..n], want)));
                }
            }
            50..=59 => {
                let n = if r.pct(30) { r.below(PAGE * 3) } else { r.below(FILE_MAX) };
                desc = format!("truncate {n}");
                rfs::ftruncate(&fd, n).map_err(|e| format!("{desc}: {e}"))?;
                model.resize(n as usize, 0);
            }
            60..=69 => {
                let off = r.below(FILE_MAX);
                let len = (1 + r.below(20_000)).min(FILE_MAX - off) as usize;
                let data = r.bytes(len);
                desc = format!("mapwrite {off}+{len}");
                let end = off + len as u64;
                if end > size {
                    rfs::ftruncate(&fd, end).map_err(|e| format!("{desc} (extend): {e}"))?;
                    model.resize(end as usize, 0);
                }
                map::write(&fd, off, &data).map_err(|e| format!("{desc}: {e}"))?;
                model[off as usize..end as usize].copy_from_slice(&data);
            }
            70..=79 => {
                if size == 0 {
                    continue;
                }
                let off = r.below(size);
                let len = (1 + r.below(30_000)).min(size - off) as usize;
                desc = format!("mapread {off}+{len}");
                let got = map::read(&fd, off, len).map_err(|e| format!("{desc}: {e}"))?;
                let want = &model[off as usize..off as usize + len];
                if got != want {
                    return Err(format!("{desc}: {}", first_diff(&got, want)));
                }
            }
            80..=82 => {
                let pages = size.div_ceil(PAGE);
                let insert = r.pct(50);
                let off = r.below(pages + 1) * PAGE;
                let len = (1 + r.below(6)) * PAGE;
                if insert && size + len > FILE_MAX {
                    continue;
                }
                let (mode, what) = if insert {
                    (FallocateFlags::INSERT_RANGE, "insert")
                } else {
                    (FallocateFlags::COLLAPSE_RANGE, "collapse")
                };
                desc = format!("{what} {off}+{len}");
                let got = rfs::fallocate(&fd, mode, off, len);
                let bad = if insert { off >= size } else { off + len >= size };
                let want = if !shifts {
                    Err(rustix::io::Errno::OPNOTSUPP)
                } else if bad {
                    Err(rustix::io::Errno::INVAL)
                } else {
                    Ok(())
                };
                if got != want {
                    return Err(format!("{desc}: {got:?}, expected {want:?}"));
                }
                if want.is_ok() {
                    let (o, l) = (off as usize, len as usize);
                    if insert {
                        let tail = model.split_off(o);
                        model.resize(o + l, 0);
                        model.extend(tail);
                    } else {
                        model.drain(o..o + l);
                    }
                }
            }
            83..=86 => {
                let off = r.below(FILE_MAX);
                let len = 1 + r.below(30_000).min(FILE_MAX - off);
                let mode = *r.pick(&[
                    FallocateFlags::empty(),
                    FallocateFlags::KEEP_SIZE,
                    FallocateFlags::KEEP_SIZE | FallocateFlags::PUNCH_HOLE,
                    FallocateFlags::KEEP_SIZE | FallocateFlags::PUNCH_HOLE,
                    FallocateFlags::ZERO_RANGE,
                    FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE,
                ]);
                desc = format!("fallocate {mode:?} {off}+{len}");
                rfs::fallocate(&fd, mode, off, len).map_err(|e| format!("{desc}: {e}"))?;
                let end = (off + len) as usize;
                let zero = FallocateFlags::PUNCH_HOLE | FallocateFlags::ZERO_RANGE;
                if mode.intersects(zero) {
                    let e = end.min(model.len());
                    if (off as usize) < e {
                        model[off as usize..e].fill(0);
                    }
                }
                if !mode.contains(FallocateFlags::KEEP_SIZE) && end > model.len() {
                    model.resize(end, 0);
                }
            }
            90..=91 => {
                // A reflink of whole pages (or to the end of file) within the file,
                // sometimes unshared again.
                if size < PAGE {
                    continue;
                }
                let pages = size / PAGE;
                let a = r.below(pages) * PAGE;
                let len =
                    if r.pct(25) { 0 } else { (1 + r.below((pages - a / PAGE).min(8))) * PAGE };
                let eff = if len == 0 { size - a } else { len };
                let bcount = eff.next_multiple_of(PAGE);
                let b = r.below(FILE_MAX / PAGE) * PAGE;
                if (b < a + bcount && a < b + bcount) || b + eff > FILE_MAX {
                    continue;
                }
                desc = format!("clone {a}+{len} -> {b}");
                let got = clone_range(&fd, a, len, b);
                let want = if !shifts {
                    Err(rustix::io::Errno::OPNOTSUPP)
                } else if eff % PAGE != 0 && b + eff < size {
                    // The source's partial last page may not land inside the file.
                    Err(rustix::io::Errno::INVAL)
                } else {
                    Ok(())
                };
                if got != want {
                    return Err(format!("{desc}: {got:?}, expected {want:?}"));
                }
                if want.is_ok() {
                    let src = model[a as usize..(a + eff) as usize].to_vec();
                    let end = (b + eff) as usize;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[b as usize..end].copy_from_slice(&src);
                    if r.pct(30) {
                        let got = rfs::fallocate(&fd, FallocateFlags::UNSHARE_RANGE, b, eff);
                        if got.is_err() {
                            return Err(format!("unshare {b}+{eff}: {got:?}"));
                        }
                    }
                }
            }
            87..=89 => {
                if size < 2 {
                    continue;
                }
                let len = 1 + r.below(size / 2);
                let a = r.below(size - len + 1);
                // A destination range not overlapping the source (same-file overlap is
                // EINVAL by definition).
                let before = a >= len;
                let after = a + len <= FILE_MAX;
                let b = match (before, after) {
                    (false, false) => continue,
                    (true, false) => r.below(a - len + 1),
                    (false, true) => a + len + r.below(FILE_MAX - (a + len) + 1),
                    (true, true) if r.pct(50) => r.below(a - len + 1),
                    (true, true) => a + len + r.below(FILE_MAX - (a + len) + 1),
                };
                desc = format!("copy_file_range {a}+{len} -> {b}");
                let n = copy_range(&fd, a, b, len as usize).map_err(|e| format!("{desc}: {e}"))?;
                let src = model[a as usize..(a + n as u64) as usize].to_vec();
                let end = b as usize + n;
                if model.len() < end {
                    model.resize(end, 0);
                }
                model[b as usize..end].copy_from_slice(&src);
            }
            92..=94 => {
                desc = "fsync".into();
                rfs::fsync(&fd).map_err(|e| format!("{desc}: {e}"))?;
            }
            _ => {
                desc = "close and reopen".into();
                drop(fd);
                fd = open(path);
            }
        }
        log.push(format!("#{i} {desc}"));
        if log.len() > 20 {
            log.remove(0);
        }
        let st = rfs::fstat(&fd).map_err(|e| e.to_string())?;
        if st.st_size as usize != model.len() {
            return Err(format!(
                "after #{i} {desc}: size {} but model {}\n{}",
                st.st_size,
                model.len(),
                log.join("\n")
            ));
        }
        if i % 400 == 399 {
            let all = read_all(&fd, model.len());
            if all != model {
                return Err(format!(
                    "after #{i}: full read: {}\n{}",
                    first_diff(&all, &model),
                    log.join("\n")
                ));
            }
        }
    }
    Ok(model)
}

fn fsx_on_a_mount(tag: &str, opts: &str, ops: usize, seed: u64) {
    let mut m = Mount::new(tag, "256M", opts);
    let paths: Vec<PathBuf> = (0..2).map(|k| m.path(&format!("fsx{k}.dat"))).collect();
    let results: Vec<Result<Vec<u8>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = paths
            .iter()
            .enumerate()
            .map(|(k, p)| s.spawn(move || fsx(p, seed + k as u64, ops, false)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("fsx thread")).collect()
    });
    let models: Vec<Vec<u8>> = results
        .into_iter()
        .enumerate()
        .map(|(k, r)| r.unwrap_or_else(|e| panic!("fsx file {k} (seed {}): {e}", seed + k as u64)))
        .collect();
    m.umount();
    for kind in ["read", "write", "setattr", "fallocate", "copy_file_range", "fsync", "release"] {
        assert!(m.served(kind) > 0, "no {kind} request reached the daemon\n{}", m.log_text());
    }
    m.mount(opts);
    for (p, model) in paths.iter().zip(&models) {
        let got = std::fs::read(p).unwrap();
        assert!(got == *model, "{} after remount: {}", p.display(), first_diff(&got, model));
    }
    m.umount();
    let (_, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn fsx_random_io_with_mmap_matches_a_model() {
    let ops = env_or("FERRITE_FSX_OPS", 4000) as usize;
    fsx_on_a_mount("fsx", "", ops, env_or("FERRITE_FSX_SEED", 20_240_601));
}

/// The same with the kernel's writeback cache (`-o writeback_cache`): the kernel
/// buffers writes and sends them later, in page units, with guessed file handles.
#[test]
fn fsx_with_writeback_cache() {
    let ops = env_or("FERRITE_FSX_OPS", 4000) as usize / 2;
    fsx_on_a_mount("fsx-wb", "writeback_cache", ops, env_or("FERRITE_FSX_SEED", 20_240_601) + 100);
}

/// fsx in a process with the preload library (this binary run again): reads,
/// writes, truncations, DAX mappings, every fallocate mode (collapse and insert
/// included) and copy ranges are served by the core in the process; the parent
/// then reads the file through the mount and after a remount.
#[test]
#[ignore = "run by fsx_direct_with_collapse_and_insert in a preloaded child"]
fn child_fsx() {
    let p = PathBuf::from(std::env::var("FT_PATH").unwrap());
    let seed: u64 = std::env::var("FT_SEED").unwrap().parse().unwrap();
    let ops: usize = std::env::var("FT_OPS").unwrap().parse().unwrap();
    let model = fsx(&p, seed, ops, true).unwrap_or_else(|e| panic!("fsx (seed {seed}): {e}"));
    std::fs::write(p.with_extension("model"), model).unwrap();
}

#[test]
fn fsx_direct_with_collapse_and_insert() {
    let ops = env_or("FERRITE_FSX_OPS", 4000) as usize;
    let seed = env_or("FERRITE_FSX_SEED", 20_240_601) + 200;
    let mut m = Mount::new("fsx-direct", "256M", "");
    let p = m.path("fsx.dat");
    let stats = m.scratch().join("stats");
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["child_fsx", "--exact", "--ignored", "--nocapture", "--test-threads=1", "-q"])
        .env("LD_PRELOAD", fuse_util::preload_lib())
        .env_remove("FERRITE_MOUNTS")
        .env("FERRITE_DIRECT_STATS", &stats)
        .env("FT_PATH", &p)
        .env("FT_SEED", seed.to_string())
        .env("FT_OPS", ops.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "preloaded fsx failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let s = fuse_util::direct_stats(&stats);
    assert!(s.iter().any(|x| x.direct > ops as u64 / 2), "served directly: {s:?}");
    let model = std::fs::read(p.with_extension("model")).unwrap();
    let got = std::fs::read(&p).unwrap();
    assert!(got == model, "read through the mount: {}", first_diff(&got, &model));
    m.umount();
    m.mount("");
    let got = std::fs::read(&p).unwrap();
    assert!(got == model, "after remount: {}", first_diff(&got, &model));
    m.umount();
    let (_, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
}
