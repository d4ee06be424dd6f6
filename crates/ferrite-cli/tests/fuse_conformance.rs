//! Differential conformance: the same seeded random sequences of system calls run
//! against a tmpfs directory (the reference for POSIX behaviour) and against a
//! FerriteFS mount, comparing every return value, errno and stat field.
//!
//! Compared exactly: results and errnos of every call, bytes read, file offsets, st_mode,
//! st_nlink, st_uid, st_gid, st_size (not for directories), st_rdev, st_blksize,
//! readlink targets, directory listings with d_type, extended attributes, and times set
//! explicitly with utimensat or futimens. The descriptor calls fchmod, fchown and
//! futimens are generated beside their path forms: under the preload library an
//! owner's changes through a descriptor it writes are made in the pool, not by the
//! kernel (a broken time there failed seeds 1 and 3 at once). Compared for ordering
//! only: inode numbers (the same paths must share an inode on both sides: hard
//! links) and mtime/ctime (when tmpfs shows a time move forward or back, the mount
//! must show the same direction).
//!
//! Documented exceptions (docs/FUSE.md): directory st_size and st_blocks differ by
//! design (tmpfs counts 20 bytes per entry and whole pages); atime is not compared
//! (reads the kernel answers from its page cache never reach the daemon); lseek on directory descriptors is the file system
//! type's own (tmpfs refuses SEEK_END, FUSE accepts any offset); FIFOs and sockets are
//! generated (opens are O_NONBLOCK, so a FIFO never waits; a FIFO's times are not
//! compared: the kernel stamps them at pipe writes without telling a FUSE daemon), device
//! nodes are not (/dev/shm is nodev; tests/fuse_special.rs compares them); extended attribute values are limited to 3,777 bytes (values
//! stay below that here); the kernel does permission checks for both
//! (`default_permissions`): the root runs pass them all, the run as uid 1000
//! (`random_syscall_sequences_match_tmpfs_as_another_user`) meets them.
//!
//! Set FERRITE_CONFORMANCE_SEEDS=a..b and FERRITE_CONFORMANCE_OPS=n for longer runs,
//! FERRITE_CONFORMANCE_TRACE=1 to stat every object after every call (pinpoints time
//! differences), FERRITE_CONFORMANCE_KEEP_GOING=1 to report every failing seed.

mod fuse_util;

use fuse_util::{env_range, Mount, Rng};
use rustix::fs::{
    self as rfs, AtFlags, FallocateFlags, Mode, OFlags, RenameFlags, SeekFrom, Timespec,
    Timestamps, XattrFlags, CWD,
};
use rustix::io::Errno;
use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

const SLOTS: usize = 6;
const TOP: &[&str] = &["f0", "f1", "d0", "d1", "l0"];
const XNAMES: &[&str] = &[
    "user.a",
    "user.bb",
    "user.a-much-longer-attribute-name",
    "trusted.t",
    "security.s",
    "bogus.ns",
    "user.",
];

/// Bytes shown by length in failure reports.
#[derive(Clone)]
struct Bytes(Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "<{} bytes>", self.0.len())
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// One call. FChmod, FChown and FUtimens are fchmod, fchown and futimens of a slot's
/// descriptor (the preload library makes an owner's changes on a file it writes in
/// the pool).
#[derive(Clone, Debug)]
enum Op {
    Open { slot: usize, path: String, flags: u32, mode: u32 },
    Close { slot: usize },
    Pwrite { slot: usize, off: u64, data: Bytes },
    Write { slot: usize, data: Bytes },
    Pread { slot: usize, off: u64, len: usize },
    Read { slot: usize, len: usize },
    Seek { slot: usize, whence: u8, off: i64 },
    Ftruncate { slot: usize, len: u64 },
    Fstat { slot: usize },
    Fsync { slot: usize },
    Fallocate { slot: usize, mode: u32, off: u64, len: u64 },
    CopyRange { src: usize, dst: usize, off_in: u64, off_out: u64, len: usize },
    Stat { path: String, follow: bool },
    Rename { a: String, b: String, flags: u32 },
    Link { a: String, b: String },
    Unlink { path: String },
    Rmdir { path: String },
    Mkdir { path: String, mode: u32 },
    Symlink { target: String, path: String },
    Mknod { path: String, mode: u32 },
    Readlink { path: String },
    Chmod { path: String, mode: u32 },
    FChmod { slot: usize, mode: u32 },
    FChown { slot: usize, uid: Option<u32>, gid: Option<u32> },
    FUtimens { slot: usize, atime: Option<(i64, i64)>, mtime: Option<(i64, i64)> },
    Chown { path: String, uid: Option<u32>, gid: Option<u32>, follow: bool },
    Utimens { path: String, atime: Option<(i64, i64)>, mtime: Option<(i64, i64)>, follow: bool },
    SetX { path: String, name: String, value: Bytes, flags: u32, follow: bool },
    GetX { path: String, name: String, size: usize },
    ListX { path: String },
    RemoveX { path: String, name: String },
    Readdir { path: String },
}

fn gen_path(r: &mut Rng) -> String {
    if r.pct(3) {
        return r
            .pick(&["", ".", "d0/.", "d0/..", "d0/d1/..", "f0/x", "l0/f0", "d1/l0/f1"])
            .to_string();
    }
    let depth = r.below(100);
    let depth = if depth < 55 {
        0
    } else if depth < 90 {
        1
    } else {
        2
    };
    let mut v: Vec<&str> = Vec::new();
    for _ in 0..depth {
        v.push(*r.pick(&["d0", "d0", "d1", "d1", "l0", "f0"]));
    }
    v.push(*r.pick(TOP));
    v.join("/")
}

fn gen_op(r: &mut Rng) -> Op {
    let slot = r.below(SLOTS as u64) as usize;
    let k = r.below(1000);
    match k {
        0..=119 => {
            let acc = *r.pick(&[0u32, 1, 2]);
            let mut flags = acc;
            for (p, f) in [
                (55, OFlags::CREATE.bits()),
                (15, OFlags::EXCL.bits()),
                (15, OFlags::TRUNC.bits()),
                (15, OFlags::APPEND.bits()),
                (5, OFlags::DIRECTORY.bits()),
                (5, OFlags::NOFOLLOW.bits()),
            ] {
                if r.pct(p) {
                    flags |= f;
                }
            }
            let mode = *r.pick(&[0o644u32, 0o600, 0o755, 0o4755, 0o2644, 0o000, 0o7777]);
            Op::Open { slot, path: gen_path(r), flags, mode }
        }
        120..=159 => Op::Close { slot },
        160..=279 => {
            let off = if r.pct(50) { r.below(70_000) } else { r.below(9000) };
            let len = *r
                .pick(&[1usize, 7, 100, 2047, 2048, 2049, 4095, 4096, 4097, 8191, 12_289, 40_000]);
            Op::Pwrite { slot, off, data: Bytes(r.bytes(len)) }
        }
        280..=329 => {
            // (0: an empty write moves no O_APPEND offset; the preload library's did.)
            let len = *r.pick(&[0usize, 1, 33, 1000, 4096, 5000]);
            Op::Write { slot, data: Bytes(r.bytes(len)) }
        }
        330..=429 => Op::Pread {
            slot,
            off: r.below(80_000),
            len: *r.pick(&[1usize, 100, 4096, 10_000, 100_000]),
        },
        430..=459 => Op::Read { slot, len: *r.pick(&[0usize, 10, 4096, 65_536]) },
        460..=484 => {
            Op::Seek { slot, whence: r.below(3) as u8, off: r.below(20_000) as i64 - 5000 }
        }
        485..=534 => Op::Ftruncate {
            slot,
            len: *r.pick(&[0u64, 1, 4095, 4096, 4097, 10_000, 65_537, 200_000]),
        },
        535..=559 => Op::Fstat { slot },
        560..=569 => Op::Fsync { slot },
        570..=594 => {
            let mode = *r.pick(&[
                0u32,
                FallocateFlags::KEEP_SIZE.bits(),
                FallocateFlags::PUNCH_HOLE.bits() | FallocateFlags::KEEP_SIZE.bits(),
                FallocateFlags::PUNCH_HOLE.bits(),
                // tmpfs and the kernel's FUSE client both refuse collapse (under the
                // preload library the core does it, as ext4: not compared there, see
                // `run`). tmpfs has no zero range, which the mount does
                // (tests/fuse_fallocate.rs), so it is not generated.
                FallocateFlags::COLLAPSE_RANGE.bits(),
            ]);
            Op::Fallocate {
                slot,
                mode,
                off: r.below(50_000),
                len: *r.pick(&[0u64, 1, 4096, 9000, 30_000]),
            }
        }
        595..=614 => Op::CopyRange {
            src: slot,
            dst: r.below(SLOTS as u64) as usize,
            off_in: r.below(30_000),
            off_out: r.below(30_000),
            len: *r.pick(&[0usize, 1, 4096, 10_000, 100_000]),
        },
        615..=689 => Op::Stat { path: gen_path(r), follow: r.pct(50) },
        690..=739 => Op::Rename {
            a: gen_path(r),
            b: gen_path(r),
            flags: *r.pick(&[
                0u32,
                0,
                0,
                RenameFlags::NOREPLACE.bits(),
                RenameFlags::EXCHANGE.bits(),
                3,
            ]),
        },
        740..=764 => Op::Link { a: gen_path(r), b: gen_path(r) },
        765..=804 => Op::Unlink { path: gen_path(r) },
        805..=824 => Op::Rmdir { path: gen_path(r) },
        825..=864 => {
            Op::Mkdir { path: gen_path(r), mode: *r.pick(&[0o755u32, 0o700, 0o2775, 0o1777]) }
        }
        880..=884 => Op::Mknod {
            path: gen_path(r),
            // FIFOs and sockets (the kernel runs both on either side; opens are
            // O_NONBLOCK so a FIFO never waits for its other end). Device nodes are
            // in tests/fuse_special.rs: /dev/shm is nodev, the mount is not.
            mode: *r.pick(&[libc::S_IFIFO | 0o644, libc::S_IFSOCK | 0o755, libc::S_IFIFO | 0o4600]),
        },
        865..=879 => Op::Symlink {
            target: r
                .pick(&[
                    "f0",
                    "f1",
                    "d0",
                    "d0/f1",
                    "nothere",
                    "l0",
                    "../f0",
                    "a/very/long/target/that/does/not/exist",
                ])
                .to_string(),
            path: gen_path(r),
        },
        885..=894 => Op::Readlink { path: gen_path(r) },
        895..=914 if r.pct(40) => Op::FChmod { slot, mode: r.below(0o10000) as u32 },
        895..=914 => Op::Chmod { path: gen_path(r), mode: r.below(0o10000) as u32 },
        915..=929 => {
            let uid = if r.pct(70) { Some(*r.pick(&[0u32, 1000, 65534])) } else { None };
            let gid = if r.pct(70) { Some(*r.pick(&[0u32, 100, 1000])) } else { None };
            if r.pct(40) {
                Op::FChown { slot, uid, gid }
            } else {
                Op::Chown { path: gen_path(r), uid, gid, follow: r.pct(70) }
            }
        }
        930..=944 => {
            let t = |r: &mut Rng| -> Option<(i64, i64)> {
                match r.below(4) {
                    0 => None,
                    1 => Some((0, rfs::UTIME_NOW)),
                    _ => Some((r.below(2_000_000_000) as i64, r.below(1_000_000_000) as i64)),
                }
            };
            let (atime, mtime) = (t(r), t(r));
            if r.pct(40) {
                Op::FUtimens { slot, atime, mtime }
            } else {
                Op::Utimens { path: gen_path(r), atime, mtime, follow: r.pct(80) }
            }
        }
        945..=964 => {
            let len = *r.pick(&[0usize, 1, 10, 200, 1500]);
            Op::SetX {
                path: gen_path(r),
                name: r.pick(XNAMES).to_string(),
                value: Bytes(r.bytes(len)),
                flags: *r.pick(&[0u32, 0, XattrFlags::CREATE.bits(), XattrFlags::REPLACE.bits()]),
                follow: r.pct(85),
            }
        }
        965..=979 => Op::GetX {
            path: gen_path(r),
            name: r.pick(XNAMES).to_string(),
            size: *r.pick(&[0usize, 1, 5, 64_000]),
        },
        980..=984 => Op::ListX { path: gen_path(r) },
        985..=992 => Op::RemoveX { path: gen_path(r), name: r.pick(XNAMES).to_string() },
        _ => Op::Readdir { path: gen_path(r) },
    }
}

struct Side {
    root: PathBuf,
    fds: Vec<Option<OwnedFd>>,
}

/// What an operation returned on one side.
struct Outcome {
    text: String,
    stat: Option<rfs::Stat>,
}

fn e(err: Errno) -> String {
    format!("E{}", err.raw_os_error())
}

fn hash(b: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &x in b {
        h = (h ^ x as u64).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// "ok", and whether each time set explicitly reads back exactly from `s`.
fn times_read_back(atime: Option<(i64, i64)>, mtime: Option<(i64, i64)>, s: &rfs::Stat) -> String {
    let mut out = String::from("ok");
    if let Some((sec, ns)) = atime.filter(|t| t.1 != rfs::UTIME_NOW) {
        let same = s.st_atime == sec && s.st_atime_nsec == ns;
        out += if same { " a-same" } else { " a-DIFF" };
    }
    if let Some((sec, ns)) = mtime.filter(|t| t.1 != rfs::UTIME_NOW) {
        let same = s.st_mtime == sec && s.st_mtime_nsec == ns;
        out += if same { " m-same" } else { " m-DIFF" };
    }
    out
}

fn ts(t: Option<(i64, i64)>) -> Timespec {
    match t {
        None => Timespec { tv_sec: 0, tv_nsec: rfs::UTIME_OMIT },
        Some((s, n)) => Timespec { tv_sec: s, tv_nsec: n as _ },
    }
}

impl Side {
    fn p(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    fn run(&mut self, op: &Op) -> Outcome {
        let mut stat = None;
        let text = match op {
            Op::Open { slot, path, flags, mode } => {
                self.fds[*slot] = None;
                match rfs::openat(
                    CWD,
                    self.p(path),
                    OFlags::from_bits_retain(*flags) | OFlags::CLOEXEC | OFlags::NONBLOCK,
                    Mode::from_bits_retain(*mode),
                ) {
                    Ok(fd) => {
                        stat = rfs::fstat(&fd).ok();
                        self.fds[*slot] = Some(fd);
                        "ok".into()
                    }
                    Err(x) => e(x),
                }
            }
            Op::Close { slot } => {
                self.fds[*slot] = None;
                "ok".into()
            }
            Op::Fstat { slot } => match &self.fds[*slot] {
                None => "closed".into(),
                Some(fd) => match rfs::fstat(fd) {
                    Ok(s) => {
                        stat = Some(s);
                        "ok".into()
                    }
                    Err(x) => e(x),
                },
            },
            Op::Pwrite { slot, off, data } => {
                self.with_fd(*slot, |fd| rustix::io::pwrite(fd, data, *off).map(|n| n.to_string()))
            }
            Op::Write { slot, data } => {
                self.with_fd(*slot, |fd| rustix::io::write(fd, data).map(|n| n.to_string()))
            }
            Op::Pread { slot, off, len } => self.with_fd(*slot, |fd| {
                let mut b = vec![0u8; *len];
                rustix::io::pread(fd, &mut b[..], *off).map(|n| format!("{n}:{:x}", hash(&b[..n])))
            }),
            Op::Read { slot, len } => self.with_fd(*slot, |fd| {
                let mut b = vec![0u8; *len];
                rustix::io::read(fd, &mut b[..]).map(|n| format!("{n}:{:x}", hash(&b[..n])))
            }),
            Op::Seek { slot, whence, off } => self.with_fd(*slot, |fd| {
                // lseek on a directory is the file system type's own business (tmpfs
                // refuses SEEK_END, FUSE directories take any offset): not compared.
                if rfs::fstat(fd).is_ok_and(|s| s.st_mode & libc::S_IFMT == libc::S_IFDIR) {
                    return Ok("dir".into());
                }
                let w = match whence {
                    0 => SeekFrom::Start(*off as u64),
                    1 => SeekFrom::Current(*off),
                    _ => SeekFrom::End(*off),
                };
                rfs::seek(fd, w).map(|p| p.to_string())
            }),
            Op::Ftruncate { slot, len } => {
                self.with_fd(*slot, |fd| rfs::ftruncate(fd, *len).map(|()| "ok".into()))
            }
            Op::Fsync { slot } => self.with_fd(*slot, |fd| rfs::fsync(fd).map(|()| "ok".into())),
            Op::Fallocate { slot, mode, .. }
                if *mode & FallocateFlags::COLLAPSE_RANGE.bits() != 0
                    && std::env::var_os("FT_DIRECT").is_some()
                    && self.fds[*slot].is_some() =>
            {
                // A preloaded process gets collapse range from the core (ext4's
                // rules, tests/fallocate_shift.rs and fuse_fsx), tmpfs has none.
                "collapse: not compared under the preload library".into()
            }
            Op::Fallocate { slot, mode, off, len } => self.with_fd(*slot, |fd| {
                rfs::fallocate(fd, FallocateFlags::from_bits_retain(*mode), *off, *len)
                    .map(|()| "ok".into())
            }),
            Op::CopyRange { src, dst, off_in, off_out, len } => {
                match (&self.fds[*src], &self.fds[*dst]) {
                    (Some(a), Some(b)) => {
                        // Through the C library (rustix makes this system call itself,
                        // which a preload library cannot see).
                        let (mut i, mut o) = (*off_in as i64, *off_out as i64);
                        use std::os::fd::AsRawFd;
                        // SAFETY: two open descriptors and two live offsets.
                        let n = unsafe {
                            libc::copy_file_range(
                                a.as_raw_fd(),
                                &mut i,
                                b.as_raw_fd(),
                                &mut o,
                                *len,
                                0,
                            )
                        };
                        if n < 0 {
                            e(Errno::from_raw_os_error(
                                std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
                            ))
                        } else {
                            format!("{n} {i} {o}")
                        }
                    }
                    _ => "closed".into(),
                }
            }
            Op::Stat { path, follow } => {
                let fl = if *follow { AtFlags::empty() } else { AtFlags::SYMLINK_NOFOLLOW };
                match rfs::statat(CWD, self.p(path), fl) {
                    Ok(s) => {
                        stat = Some(s);
                        "ok".into()
                    }
                    Err(x) => e(x),
                }
            }
            Op::Rename { a, b, flags } => res(rfs::renameat_with(
                CWD,
                self.p(a),
                CWD,
                self.p(b),
                RenameFlags::from_bits_retain(*flags),
            )),
            Op::Link { a, b } => res(rfs::linkat(CWD, self.p(a), CWD, self.p(b), AtFlags::empty())),
            Op::Unlink { path } => res(rfs::unlinkat(CWD, self.p(path), AtFlags::empty())),
            Op::Rmdir { path } => res(rfs::unlinkat(CWD, self.p(path), AtFlags::REMOVEDIR)),
            Op::Mkdir { path, mode } => {
                res(rfs::mkdirat(CWD, self.p(path), Mode::from_bits_retain(*mode)))
            }
            Op::Symlink { target, path } => res(rfs::symlinkat(target.as_str(), CWD, self.p(path))),
            Op::Mknod { path, mode } => {
                let t = rfs::FileType::from_raw_mode(*mode);
                let perm = Mode::from_raw_mode(*mode & 0o7777);
                res(rfs::mknodat(CWD, self.p(path), t, perm, 0))
            }
            Op::Readlink { path } => match rfs::readlinkat(CWD, self.p(path), Vec::new()) {
                Ok(t) => format!("-> {:?}", t),
                Err(x) => e(x),
            },
            Op::Chmod { path, mode } => res(rfs::chmodat(
                CWD,
                self.p(path),
                Mode::from_bits_retain(*mode),
                AtFlags::empty(),
            )),
            Op::Chown { path, uid, gid, follow } => {
                let fl = if *follow { AtFlags::empty() } else { AtFlags::SYMLINK_NOFOLLOW };
                let u = uid.map(rustix::fs::Uid::from_raw);
                let g = gid.map(rustix::fs::Gid::from_raw);
                match rfs::chownat(CWD, self.p(path), u, g, fl) {
                    Ok(()) => {
                        stat = rfs::statat(CWD, self.p(path), fl).ok();
                        "ok".into()
                    }
                    Err(x) => e(x),
                }
            }
            Op::Utimens { path, atime, mtime, follow } => {
                let fl = if *follow { AtFlags::empty() } else { AtFlags::SYMLINK_NOFOLLOW };
                let t = Timestamps { last_access: ts(*atime), last_modification: ts(*mtime) };
                match rfs::utimensat(CWD, self.p(path), &t, fl) {
                    // Explicitly set times must read back exactly.
                    Ok(()) => match rfs::statat(CWD, self.p(path), fl) {
                        Ok(s) => times_read_back(*atime, *mtime, stat.insert(s)),
                        Err(x) => e(x),
                    },
                    Err(x) => e(x),
                }
            }
            Op::FChmod { slot, mode } => self.with_fd(*slot, |fd| {
                rfs::fchmod(fd, Mode::from_bits_retain(*mode))?;
                stat = Some(rfs::fstat(fd)?);
                Ok("ok".into())
            }),
            Op::FChown { slot, uid, gid } => self.with_fd(*slot, |fd| {
                let u = uid.map(rustix::fs::Uid::from_raw);
                let g = gid.map(rustix::fs::Gid::from_raw);
                rfs::fchown(fd, u, g)?;
                stat = Some(rfs::fstat(fd)?);
                Ok("ok".into())
            }),
            Op::FUtimens { slot, atime, mtime } => self.with_fd(*slot, |fd| {
                let t = Timestamps { last_access: ts(*atime), last_modification: ts(*mtime) };
                rfs::futimens(fd, &t)?;
                Ok(times_read_back(*atime, *mtime, stat.insert(rfs::fstat(fd)?)))
            }),
            Op::SetX { path, name, value, flags, follow } => {
                let f = XattrFlags::from_bits_retain(*flags);
                if *follow {
                    res(rfs::setxattr(self.p(path), name.as_str(), value, f))
                } else {
                    res(rfs::lsetxattr(self.p(path), name.as_str(), value, f))
                }
            }
            Op::GetX { path, name, size } => {
                let mut b = vec![0u8; *size];
                match rfs::getxattr(self.p(path), name.as_str(), &mut b[..]) {
                    Ok(n) => format!("{n}:{:x}", hash(&b[..n.min(b.len())])),
                    Err(x) => e(x),
                }
            }
            Op::ListX { path } => {
                let mut b = vec![0u8; 4096];
                match rfs::listxattr(self.p(path), &mut b[..]) {
                    Ok(n) => {
                        let mut names: Vec<&[u8]> =
                            b[..n].split(|&c| c == 0).filter(|s| !s.is_empty()).collect();
                        names.sort();
                        format!(
                            "{:?}",
                            names.iter().map(|s| String::from_utf8_lossy(s)).collect::<Vec<_>>()
                        )
                    }
                    Err(x) => e(x),
                }
            }
            Op::RemoveX { path, name } => res(rfs::removexattr(self.p(path), name.as_str())),
            Op::Readdir { path } => match std::fs::read_dir(self.p(path)) {
                Ok(it) => {
                    let mut v: Vec<String> = it
                        .map(|d| {
                            let d = d.expect("dirent");
                            let t = d
                                .file_type()
                                .map(|t| {
                                    if t.is_dir() {
                                        'd'
                                    } else if t.is_symlink() {
                                        'l'
                                    } else if t.is_fifo() {
                                        'p'
                                    } else if t.is_socket() {
                                        's'
                                    } else {
                                        'f'
                                    }
                                })
                                .unwrap_or('?');
                            format!("{}:{t}", d.file_name().to_string_lossy())
                        })
                        .collect();
                    v.sort();
                    v.join(",")
                }
                Err(x) => format!("E{}", x.raw_os_error().unwrap_or(0)),
            },
        };
        Outcome { text, stat }
    }

    fn with_fd(
        &self,
        slot: usize,
        f: impl FnOnce(&OwnedFd) -> rustix::io::Result<String>,
    ) -> String {
        match &self.fds[slot] {
            None => "closed".into(),
            Some(fd) => match f(fd) {
                Ok(s) => s,
                Err(x) => e(x),
            },
        }
    }
}

fn res(r: rustix::io::Result<()>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(x) => e(x),
    }
}

fn stat_text(s: &rfs::Stat) -> String {
    let dir = s.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let size = if dir { "-".to_string() } else { s.st_size.to_string() };
    format!(
        "mode={:o} nlink={} uid={} gid={} size={size} rdev={} blksize={}",
        s.st_mode, s.st_nlink, s.st_uid, s.st_gid, s.st_rdev, s.st_blksize
    )
}

fn sign(new: (i64, u64), old: (i64, u64)) -> i32 {
    match new.cmp(&old) {
        std::cmp::Ordering::Less => -1,
        std::cmp::Ordering::Equal => 0,
        std::cmp::Ordering::Greater => 1,
    }
}

/// (mtime, ctime) as (seconds, nanoseconds) pairs.
type Times = ((i64, u64), (i64, u64));

/// Inode correspondence and time history, for ordering-only comparisons.
#[derive(Default)]
struct History {
    /// reference inode → mount inode
    fwd: HashMap<u64, u64>,
    /// reference inode → last (mtime, ctime) seen on (reference, mount)
    times: HashMap<u64, [Times; 2]>,
}

impl History {
    fn compare(&mut self, r: &rfs::Stat, m: &rfs::Stat) -> Result<(), String> {
        let (ri, mi) = (r.st_ino, m.st_ino);
        match self.fwd.get(&ri) {
            Some(&prev) if prev != mi => {
                return Err(format!("reference inode {ri} was mount inode {prev}, now {mi}"));
            }
            _ => {
                self.fwd.insert(ri, mi);
            }
        }
        if r.st_mode & libc::S_IFMT == libc::S_IFIFO {
            // A write to a FIFO stamps its times in the kernel's inode only: FUSE sends
            // no request for it (docs/FUSE.md), so the daemon never sees it.
            return Ok(());
        }
        // (The nanosecond fields' type depends on rustix's backend.)
        #[allow(clippy::unnecessary_cast)]
        let t = |s: &rfs::Stat| -> Times {
            (
                (s.st_mtime as i64, s.st_mtime_nsec as u64),
                (s.st_ctime as i64, s.st_ctime_nsec as u64),
            )
        };
        let now = [t(r), t(m)];
        if let Some(old) = self.times.insert(ri, now) {
            for (k, name) in [(0usize, "mtime"), (1, "ctime")] {
                let pick = |x: &Times| if k == 0 { x.0 } else { x.1 };
                let rs = sign(pick(&now[0]), pick(&old[0]));
                let ms = sign(pick(&now[1]), pick(&old[1]));
                if rs != 0 && rs != ms {
                    return Err(format!("{name} moved {rs:+} on tmpfs but {ms:+} on the mount"));
                }
            }
        }
        Ok(())
    }
}

/// Whole-tree description: structure, attributes, contents, xattrs, link groups.
fn tree(root: &Path) -> (BTreeMap<String, String>, Vec<Vec<String>>) {
    let mut out = BTreeMap::new();
    let mut groups: HashMap<u64, Vec<String>> = HashMap::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let p = if rel.is_empty() { root.to_path_buf() } else { root.join(&rel) };
        let s = match rfs::statat(CWD, &p, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) => s,
            // A sequence may remove its own root (rmdir of "" or "d0/.." once it is
            // empty); both sides must then have lost it.
            Err(Errno::NOENT) if rel.is_empty() => {
                out.insert(rel, "absent".to_string());
                continue;
            }
            Err(e) => panic!("lstat {}: {e}", p.display()),
        };
        let mut d = stat_text(&s);
        let fmt = s.st_mode & libc::S_IFMT;
        if fmt == libc::S_IFREG {
            d += &format!(" data={:x}", hash(&std::fs::read(&p).expect("read")));
        } else if fmt == libc::S_IFLNK {
            d += &format!(" -> {:?}", std::fs::read_link(&p).expect("readlink"));
        } else if fmt == libc::S_IFDIR {
            let mut names: Vec<String> = std::fs::read_dir(&p)
                .expect("readdir")
                .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            for n in names {
                stack.push(if rel.is_empty() { n } else { format!("{rel}/{n}") });
            }
        }
        let mut b = vec![0u8; 65536];
        if let Ok(n) = rfs::llistxattr(&p, &mut b[..]) {
            let mut names: Vec<Vec<u8>> =
                b[..n].split(|&c| c == 0).filter(|x| !x.is_empty()).map(|x| x.to_vec()).collect();
            names.sort();
            for name in names {
                let mut v = vec![0u8; 65536];
                let k = rfs::lgetxattr(&p, name.as_slice(), &mut v[..]).expect("lgetxattr");
                d += &format!(" x[{}]={:x}", String::from_utf8_lossy(&name), hash(&v[..k]));
            }
        }
        if fmt != libc::S_IFDIR {
            groups.entry(s.st_ino as u64).or_default().push(rel.clone());
        }
        out.insert(rel, d);
    }
    let mut g: Vec<Vec<String>> = groups
        .into_values()
        .filter(|v| v.len() > 1)
        .map(|mut v| {
            v.sort();
            v
        })
        .collect();
    g.sort();
    (out, g)
}

fn compare_trees(a: &Path, b: &Path) -> Result<(), String> {
    let (ta, ga) = tree(a);
    let (tb, gb) = tree(b);
    for (k, v) in &ta {
        match tb.get(k) {
            None => return Err(format!("/{k} exists only on tmpfs: {v}")),
            Some(w) if w != v => return Err(format!("/{k} differs:\n  tmpfs: {v}\n  mount: {w}")),
            _ => {}
        }
    }
    if let Some(k) = tb.keys().find(|k| !ta.contains_key(*k)) {
        return Err(format!("/{k} exists only on the mount: {}", tb[k]));
    }
    if ga != gb {
        return Err(format!("hard-link groups differ:\n  tmpfs: {ga:?}\n  mount: {gb:?}"));
    }
    Ok(())
}

fn run_seed(seed: u64, ops: usize, ref_root: &Path, mnt_root: &Path) -> Result<(), String> {
    let name = format!("seed{seed}");
    let mut a = Side { root: ref_root.join(&name), fds: (0..SLOTS).map(|_| None).collect() };
    let mut b = Side { root: mnt_root.join(&name), fds: (0..SLOTS).map(|_| None).collect() };
    for s in [&a, &b] {
        std::fs::create_dir(&s.root).map_err(|e| e.to_string())?;
        rfs::chmodat(CWD, &s.root, Mode::from_bits_retain(0o755), AtFlags::empty())
            .map_err(|e| e.to_string())?;
    }
    let mut rng = Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5eed);
    let mut hist = History::default();
    let mut recent: Vec<String> = Vec::new();
    let trace = std::env::var_os("FERRITE_CONFORMANCE_TRACE").is_some();
    // A user other than root may not read every directory the sequence locks up.
    let trees = std::env::var_os("FT_NO_TREES").is_none();
    for i in 0..ops {
        let op = gen_op(&mut rng);
        let ra = a.run(&op);
        let rb = b.run(&op);
        let mut line = format!("#{i} {op:?}");
        line.truncate(220);
        recent.push(format!("{line} -> {}", ra.text));
        if recent.len() > 40 {
            recent.remove(0);
        }
        let fail = |msg: String| {
            Err(format!(
                "seed {seed}, op {i}: {msg}\nlast operations (tmpfs result):\n  {}",
                recent.join("\n  ")
            ))
        };
        if ra.text != rb.text {
            return fail(format!("tmpfs returned {:?}, the mount {:?}", ra.text, rb.text));
        }
        match (&ra.stat, &rb.stat) {
            (Some(x), Some(y)) => {
                let (sx, sy) = (stat_text(x), stat_text(y));
                if sx != sy {
                    return fail(format!("stat differs:\n  tmpfs: {sx}\n  mount: {sy}"));
                }
                if let Err(m) = hist.compare(x, y) {
                    return fail(m);
                }
            }
            (None, None) => {}
            _ => return fail("stat on one side only".into()),
        }
        if trace {
            // Localise time differences: observe every object after every operation.
            for d in ["", "d0/", "d1/", "d0/d0/", "d0/d1/", "d1/d0/", "d1/d1/"] {
                for n in TOP {
                    let p = format!("{d}{n}");
                    let x = rfs::statat(CWD, a.p(&p), AtFlags::SYMLINK_NOFOLLOW);
                    let y = rfs::statat(CWD, b.p(&p), AtFlags::SYMLINK_NOFOLLOW);
                    if let (Ok(x), Ok(y)) = (x, y) {
                        if let Err(m) = hist.compare(&x, &y) {
                            return fail(format!("{p}: {m}"));
                        }
                    }
                }
            }
        }
        if i % 250 == 249 && trees {
            if let Err(m) = compare_trees(&a.root, &b.root) {
                return fail(m);
            }
        }
    }
    drop(a.fds);
    drop(b.fds);
    if !trees {
        return Ok(()); // the caller compares them (as root: see as_another_user)
    }
    compare_trees(&a.root, &b.root).map_err(|m| format!("seed {seed}, final tree: {m}"))
}

#[test]
fn random_syscall_sequences_match_tmpfs() {
    // Over FUSE over io_uring where CI's kernel offers it (the module switch is on).
    sequences_match_tmpfs("conformance", "", env_range("FERRITE_CONFORMANCE_SEEDS", 1..13));
}

/// The same sequences over `/dev/fuse` reads and writes (`-o nouring`), fewer seeds:
/// the transport must not change a single result. (Seeds 8 to 12: among them, one
/// whose copy_file_range reaches the daemon, which the request check below needs.)
#[test]
fn random_syscall_sequences_match_tmpfs_over_dev_fuse() {
    sequences_match_tmpfs("conformance-classic", "nouring", 8..13);
}

fn sequences_match_tmpfs(tag: &str, opts: &str, seeds: std::ops::Range<u64>) {
    let ops: usize =
        std::env::var("FERRITE_CONFORMANCE_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2500);
    let mut m = Mount::new(tag, "512M", opts);
    let tmp =
        tempfile::Builder::new().prefix("ferrite-ref").tempdir_in("/dev/shm").expect("tmpfs dir");
    let fstype = rfs::statfs(tmp.path()).expect("statfs").f_type;
    assert_eq!(fstype as u64, 0x0102_1994, "/dev/shm must be tmpfs (the reference)");
    let mut failures = Vec::new();
    for seed in seeds {
        if let Err(msg) = run_seed(seed, ops, tmp.path(), &m.mnt) {
            failures.push(msg);
            if std::env::var_os("FERRITE_CONFORMANCE_KEEP_GOING").is_none() {
                break;
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} differences from tmpfs:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    m.umount();
    for kind in [
        "lookup",
        "getattr",
        "setattr",
        "readlink",
        "mkdir",
        "unlink",
        "rmdir",
        "symlink",
        "rename",
        "link",
        "open",
        "create",
        "read",
        "write",
        "release",
        "fsync",
        "opendir",
        "readdirplus",
        "setxattr",
        "getxattr",
        "listxattr",
        "removexattr",
        "fallocate",
        "copy_file_range",
    ] {
        assert!(m.served(kind) > 0, "no {kind} request reached the daemon\n{}", m.log_text());
    }
    let (_, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "fsck after the sequences: {:?}", fsck.errors);
}

/// The same sequences with the preload library in the test process (this binary run
/// again with LD_PRELOAD): file data is then read and written directly through the
/// pool, everything else through the mount, and the results must still be tmpfs's.
#[test]
fn random_syscall_sequences_match_tmpfs_with_the_preload_library() {
    let seeds = env_range("FERRITE_CONFORMANCE_SEEDS", 1..9);
    let mut m = Mount::new("conformance-direct", "512M", "");
    let tmp =
        tempfile::Builder::new().prefix("ferrite-ref").tempdir_in("/dev/shm").expect("tmpfs dir");
    let stats = m.scratch().join("stats");
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["child_conformance", "--exact", "--ignored", "--nocapture", "-q"])
        .env("LD_PRELOAD", fuse_util::preload_lib())
        .env("FT_DIRECT", "1")
        .env("FERRITE_DIRECT_STATS", &stats)
        .env("FT_MNT", &m.mnt)
        .env("FT_REF", tmp.path())
        .env("FERRITE_CONFORMANCE_SEEDS", format!("{}..{}", seeds.start, seeds.end))
        .output()
        .expect("run the preloaded child");
    assert!(
        out.status.success(),
        "preloaded sequences differ from tmpfs:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let s = fuse_util::direct_stats(&stats);
    assert_eq!(s.len(), 1, "{s:?}");
    assert!(s[0].direct > 1000, "the data calls went direct: {s:?}");
    m.umount();
    let (_, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "fsck after the preloaded sequences: {:?}", fsck.errors);
}

/// The same sequences run by another user (uid and gid 1000, no supplementary
/// groups) on a mount with allow_other: permission bits now decide (root passes every
/// check), chown to other owners and trusted.* xattrs are refused, set-id bits are
/// cleared as the kernel and core decide, on both sides alike. The trees are compared
/// afterwards as root (the user may have locked itself out of directories).
#[test]
fn random_syscall_sequences_match_tmpfs_as_another_user() {
    as_another_user("conformance-user", false);
}

/// The same as another user with the preload library, whose group may open the
/// pool file (the trust model of docs/DIRECT-ACCESS.md): the user's writes go
/// directly to the pool, so the core (not the kernel) clears set-id bits and file
/// capabilities for a writer without CAP_FSETID, and must decide as the kernel does.
#[test]
fn random_syscall_sequences_match_tmpfs_as_another_user_with_the_preload_library() {
    as_another_user("conformance-user-direct", true);
}

fn as_another_user(tag: &str, preload: bool) {
    use std::os::unix::fs::PermissionsExt;
    let seeds = env_range("FERRITE_CONFORMANCE_SEEDS", 1..7);
    let mut m = Mount::new(tag, "512M", "allow_other");
    let stats = m.scratch().join("stats");
    if preload {
        // The pool file to group 1000, read-write: its members may attach.
        std::os::unix::fs::chown(&m.pool, None, Some(1000)).unwrap();
        std::fs::set_permissions(&m.pool, std::fs::Permissions::from_mode(0o660)).unwrap();
        std::fs::set_permissions(m.scratch(), std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let tmp =
        tempfile::Builder::new().prefix("ferrite-ref").tempdir_in("/dev/shm").expect("tmpfs dir");
    let open = std::fs::Permissions::from_mode(0o777);
    std::fs::set_permissions(tmp.path(), open.clone()).unwrap();
    std::fs::set_permissions(&m.mnt, open).unwrap();
    let parent = m.mnt.parent().unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut child = std::process::Command::new("setpriv");
    child
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", "--"])
        .arg(std::env::current_exe().expect("test binary"))
        .args(["child_conformance", "--exact", "--ignored", "--nocapture", "-q"])
        .env("FT_MNT", &m.mnt)
        .env("FT_REF", tmp.path())
        .env("FT_NO_TREES", "1")
        .env("FERRITE_CONFORMANCE_SEEDS", format!("{}..{}", seeds.start, seeds.end));
    if preload {
        child
            .env("LD_PRELOAD", fuse_util::preload_lib())
            .env("FT_DIRECT", "1")
            .env("FERRITE_DIRECT_STATS", &stats);
    }
    let out =
        child.output().expect("run the child as another user (setpriv: scripts/install-deps.sh)");
    assert!(
        out.status.success(),
        "sequences as uid 1000 differ from tmpfs:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for seed in seeds.clone() {
        let name = format!("seed{seed}");
        let (a, b) = (tmp.path().join(&name), m.mnt.join(&name));
        compare_trees(&a, &b)
            .unwrap_or_else(|e| panic!("seed {seed} as uid 1000, final tree: {e}"));
        let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&b).unwrap());
        assert_eq!(owner, 1000, "the sequences ran as uid 1000");
    }
    if preload {
        let s = fuse_util::direct_stats(&stats);
        let enough = 100 * (seeds.end - seeds.start);
        assert!(s.iter().any(|x| x.direct > enough), "the data calls went direct: {s:?}");
    }
    m.umount();
    let (_, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "fsck after the sequences as another user: {:?}", fsck.errors);
}

#[test]
#[ignore = "run by random_syscall_sequences_match_tmpfs_with_the_preload_library"]
fn child_conformance() {
    let seeds = env_range("FERRITE_CONFORMANCE_SEEDS", 1..2);
    let ops: usize =
        std::env::var("FERRITE_CONFORMANCE_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2500);
    let mnt = PathBuf::from(std::env::var_os("FT_MNT").expect("FT_MNT"));
    let reference = PathBuf::from(std::env::var_os("FT_REF").expect("FT_REF"));
    for seed in seeds {
        if let Err(msg) = run_seed(seed, ops, &reference, &mnt) {
            panic!("seed {seed}: {msg}");
        }
    }
}

#[test]
fn names_and_paths_at_the_limits() {
    let m = Mount::new("limits", "64M", "");
    let tmp =
        tempfile::Builder::new().prefix("ferrite-ref").tempdir_in("/dev/shm").expect("tmpfs dir");
    let check = |f: &dyn Fn(&Path) -> String| {
        let a = f(tmp.path());
        let b = f(&m.mnt);
        assert_eq!(a, b, "tmpfs vs mount");
    };
    let n255 = "n".repeat(255);
    let n256 = "n".repeat(256);
    check(&|r| res(rfs::mkdirat(CWD, r.join(&n255), Mode::from_bits_retain(0o755))));
    check(&|r| res(rfs::mkdirat(CWD, r.join(&n256), Mode::from_bits_retain(0o755))));
    check(&|r| match rfs::openat(
        CWD,
        r.join(&n256),
        OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_bits_retain(0o644),
    ) {
        Ok(_) => "ok".into(),
        Err(x) => e(x),
    });
    let t4095 = "t".repeat(4095);
    let t4096 = "t".repeat(4096);
    check(&|r| res(rfs::symlinkat(t4095.as_str(), CWD, r.join("s1"))));
    check(&|r| res(rfs::symlinkat(t4096.as_str(), CWD, r.join("s2"))));
    check(&|r| {
        format!("{:?}", rfs::readlinkat(CWD, r.join("s1"), Vec::new()).map(|v| v.as_bytes().len()))
    });
    check(&|r| res(rfs::setxattr(r.join(&n255), "user.", b"v", XattrFlags::empty())));
    check(&|r| {
        res(rfs::setxattr(
            r.join(&n255),
            format!("user.{}", "x".repeat(250)).as_str(),
            b"v",
            XattrFlags::empty(),
        ))
    });
    check(&|r| {
        res(rfs::setxattr(
            r.join(&n255),
            format!("user.{}", "x".repeat(251)).as_str(),
            b"v",
            XattrFlags::empty(),
        ))
    });
    check(&|r| res(rfs::setxattr(r.join(&n255), "", b"v", XattrFlags::empty())));
    check(&|r| {
        let big = vec![7u8; 3000];
        res(rfs::setxattr(r.join(&n255), "user.big", &big, XattrFlags::empty()))
    });
    // Deep trees, walked with directory descriptors (no path length limit applies).
    check(&|r| {
        let mut dir = rfs::openat(
            CWD,
            r,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .expect("root");
        let mut out = String::new();
        for i in 0..60 {
            let name = format!("{i:02}{}", "d".repeat(58));
            out += &res(rfs::mkdirat(&dir, name.as_str(), Mode::from_bits_retain(0o755)));
            dir = rfs::openat(
                &dir,
                name.as_str(),
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .expect("subdir");
        }
        out += &format!(" {:?}", rfs::fstat(&dir).map(|s| s.st_nlink));
        out
    });
    compare_trees(tmp.path(), &m.mnt).unwrap();
    drop(m);
}

#[test]
fn odd_names_round_trip() {
    let m = Mount::new("oddnames", "64M", "");
    for name in [
        "with space",
        "tab\there",
        "new\nline",
        "üñïçødé",
        "-dash",
        "#hash",
        "a\\b",
        "...",
        " ",
        "\u{1}x",
    ] {
        std::fs::write(m.mnt.join(name), name.as_bytes()).unwrap();
        assert_eq!(std::fs::read(m.mnt.join(name)).unwrap(), name.as_bytes());
    }
    let mut names: Vec<Vec<u8>> = std::fs::read_dir(&m.mnt)
        .unwrap()
        .map(|d| d.unwrap().file_name().as_bytes().to_vec())
        .collect();
    names.sort();
    assert_eq!(names.len(), 10);
    let bad = std::ffi::OsStr::from_bytes(b"\xff\xfe raw bytes");
    std::fs::write(m.mnt.join(bad), b"x").unwrap();
    assert!(m.mnt.join(bad).exists());
}

/// Regression (core bug found by the differential test): `Fs::fallocate` returned
/// without committing anything when there was nothing to allocate (all pages present,
/// size unchanged) or nothing to punch (hole beyond EOF), so mtime and ctime stayed put;
/// tmpfs (and ext4) mark the file modified on every successful fallocate.
#[test]
fn fallocate_always_marks_the_file_modified() {
    let m = Mount::new("falloc-times", "64M", "");
    let tmp =
        tempfile::Builder::new().prefix("ferrite-ref").tempdir_in("/dev/shm").expect("tmpfs dir");
    for root in [tmp.path(), m.mnt.as_path()] {
        let f = rfs::openat(
            CWD,
            root.join("f"),
            OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_bits_retain(0o644),
        )
        .unwrap();
        rustix::io::pwrite(&f, &[1u8; 8192], 0).unwrap();
        let old = Timestamps {
            last_access: Timespec { tv_sec: 1000, tv_nsec: 0 },
            last_modification: Timespec { tv_sec: 1000, tv_nsec: 0 },
        };
        for (mode, off, len) in [
            (FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, 100_000, 10),
            (FallocateFlags::KEEP_SIZE, 0, 8192),
            (FallocateFlags::empty(), 0, 4096),
        ] {
            rfs::futimens(&f, &old).unwrap();
            let before = rfs::fstat(&f).unwrap();
            rfs::fallocate(&f, mode, off, len).unwrap();
            let after = rfs::fstat(&f).unwrap();
            assert!(after.st_mtime > 1000, "{mode:?} on {}: mtime not updated", root.display());
            assert!(
                (after.st_ctime, after.st_ctime_nsec) > (before.st_ctime, before.st_ctime_nsec),
                "{mode:?} on {}: ctime not updated",
                root.display()
            );
        }
    }
}

/// Regression (core bug found by the differential test): `rmdir` and a rename over a
/// directory freed the directory at once even while it was open, so `fstat`/`fsync` on
/// its descriptor failed with ENOENT (and its inode number could be reused under the
/// kernel). Like files, an open directory now outlives its last name until released.
#[test]
fn removed_open_directory_stays_valid_until_closed() {
    let m = Mount::new("rmdir-open", "64M", "");
    let tmp =
        tempfile::Builder::new().prefix("ferrite-ref").tempdir_in("/dev/shm").expect("tmpfs dir");
    let mut results = Vec::new();
    for root in [tmp.path(), m.mnt.as_path()] {
        let mut out = Vec::new();
        for how in ["rmdir", "rename-over"] {
            let d = root.join(format!("victim-{how}"));
            rfs::mkdirat(CWD, &d, Mode::from_bits_retain(0o755)).unwrap();
            let fd = rfs::openat(
                CWD,
                &d,
                OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .unwrap();
            if how == "rmdir" {
                rfs::unlinkat(CWD, &d, AtFlags::REMOVEDIR).unwrap();
            } else {
                let other = root.join("other");
                rfs::mkdirat(CWD, &other, Mode::from_bits_retain(0o700)).unwrap();
                rfs::renameat(CWD, &other, CWD, &d).unwrap();
            }
            let st = rfs::fstat(&fd).map(|s| (s.st_mode, s.st_nlink));
            out.push(format!("{how}: fstat {st:?} fsync {:?}", rfs::fsync(&fd)));
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 512];
            let mut it = rfs::RawDir::new(&fd, &mut buf);
            out.push(format!(
                "{how}: getdents {:?}",
                it.next().map(|r| r.map(|e| e.file_name().to_owned()))
            ));
        }
        results.push(out);
    }
    assert_eq!(results[0], results[1], "tmpfs vs mount");
    assert!(results[1][0].contains("Ok((16877, 0))"), "{:?}", results[1]);
    drop(m);
}

/// The kernel caches entries, negative entries, attributes and directory listings of
/// the mount for long (docs/FUSE.md, "Kernel caches"); this catches a cache that goes
/// stale. Each case first makes the kernel cache what is about to change (a `stat`, a
/// failed `stat`, an open descriptor, a listing of the tree), changes it from another
/// process (coreutils, so through the kernel but not through this process's calls)
/// or another descriptor, and looks again; tmpfs is the reference. Inode numbers are
/// compared as "same object as before" only.
#[test]
fn cached_names_and_attributes_never_go_stale() {
    let mut m = Mount::new("staleness", "64M", "");
    let tmp =
        tempfile::Builder::new().prefix("ferrite-ref").tempdir_in("/dev/shm").expect("tmpfs dir");
    let sh = |root: &Path, script: &str| {
        let st = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(root)
            .status()
            .expect("run sh");
        assert!(st.success(), "{script} in {}", root.display());
    };
    let look = |p: &Path| -> String {
        match rfs::lstat(p) {
            Ok(s) => stat_text(&s),
            Err(x) => e(x),
        }
    };
    let ino = |p: &Path| rfs::lstat(p).map(|s| s.st_ino).unwrap_or(0);
    // Every name under `root` with its type, as a listing (getdents) reports them:
    // the kernel keeps a directory's listing in its page cache (FUSE.md), so each
    // step below lists the tree once before and once after another process changes it.
    fn listing(root: &Path) -> String {
        fn walk(d: &Path, rel: &str, out: &mut Vec<String>) {
            for e in std::fs::read_dir(d).expect("read_dir") {
                let e = e.expect("entry");
                let t = e.file_type().expect("d_type");
                let name = format!("{rel}{}", e.file_name().to_string_lossy());
                let kind = if t.is_dir() {
                    'd'
                } else if t.is_symlink() {
                    'l'
                } else {
                    'f'
                };
                out.push(format!("{name}:{kind}"));
                if t.is_dir() {
                    walk(&e.path(), &format!("{name}/"), out);
                }
            }
        }
        let mut out = Vec::new();
        walk(root, "", &mut out);
        out.sort();
        out.join(" ")
    }
    let mut results = Vec::new();
    for root in [tmp.path(), m.mnt.as_path()] {
        let mut out = Vec::new();
        let p = |n: &str| root.join(n);
        let step = |out: &mut Vec<String>, script: &str| {
            out.push(format!("before {script}: {}", listing(root)));
            sh(root, script);
            out.push(format!("after {script}: {}", listing(root)));
        };
        // Rename over a cached name: the name now leads to the other object.
        std::fs::write(p("x"), b"old").unwrap();
        std::fs::write(p("y"), b"new contents").unwrap();
        let old_x = rfs::open(p("x"), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        let y_ino = ino(&p("y"));
        out.push(format!("before rename: x {} y {}", look(&p("x")), look(&p("y"))));
        step(&mut out, "mv y x");
        out.push(format!(
            "after rename: x {} same-as-y {} y {} content {:?} old x fstat nlink {:?}",
            look(&p("x")),
            ino(&p("x")) == y_ino,
            look(&p("y")),
            std::fs::read(p("x")).map(String::from_utf8),
            rfs::fstat(&old_x).map(|s| s.st_nlink)
        ));
        // Link count after link and unlink by another process.
        std::fs::write(p("f"), b"f").unwrap();
        let f = rfs::open(p("f"), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        out.push(format!("f {} fd nlink {:?}", look(&p("f")), rfs::fstat(&f).map(|s| s.st_nlink)));
        step(&mut out, "ln f g");
        out.push(format!(
            "after ln: f {} fd nlink {:?}",
            look(&p("f")),
            rfs::fstat(&f).map(|s| s.st_nlink)
        ));
        step(&mut out, "rm g");
        out.push(format!(
            "after rm: f {} g {} fd nlink {:?}",
            look(&p("f")),
            look(&p("g")),
            rfs::fstat(&f).map(|s| s.st_nlink)
        ));
        // Size after a write through another descriptor, and by another process.
        let a = rfs::open(
            p("s"),
            OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC,
            Mode::from_bits_retain(0o644),
        )
        .unwrap();
        out.push(format!("s {} fd size {:?}", look(&p("s")), rfs::fstat(&a).map(|s| s.st_size)));
        let b = rfs::open(p("s"), OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty()).unwrap();
        rustix::io::pwrite(&b, &[5u8; 1000], 3000).unwrap();
        out.push(format!(
            "after pwrite: s {} fd size {:?}",
            look(&p("s")),
            rfs::fstat(&a).map(|s| s.st_size)
        ));
        step(&mut out, "printf 12345 >> s");
        out.push(format!(
            "after append: s {} fd size {:?}",
            look(&p("s")),
            rfs::fstat(&a).map(|s| s.st_size)
        ));
        step(&mut out, "truncate -s 10 s && chmod 600 s");
        out.push(format!(
            "after truncate, chmod: s {} fd {:?}",
            look(&p("s")),
            rfs::fstat(&a).map(|s| (s.st_size, s.st_mode))
        ));
        // A name removed and made again as another type (and a cached failed lookup).
        std::fs::write(p("n"), b"n").unwrap();
        out.push(format!("n {} m {}", look(&p("n")), look(&p("m"))));
        step(&mut out, "rm n && mkdir n && touch m");
        out.push(format!("n {} m {}", look(&p("n")), look(&p("m"))));
        step(&mut out, "rmdir n && ln -s target n && rm m");
        out.push(format!(
            "n {} -> {:?} m {}",
            look(&p("n")),
            std::fs::read_link(p("n")),
            look(&p("m"))
        ));
        step(&mut out, "rm n && mkdir -p n/sub && echo hi > n/sub/file");
        out.push(format!("n {} n/sub/file {}", look(&p("n")), look(&p("n/sub/file"))));
        step(&mut out, "rm -r n && echo plain > n");
        out.push(format!(
            "n {} n/sub/file {} content {:?}",
            look(&p("n")),
            look(&p("n/sub/file")),
            std::fs::read(p("n")).map(String::from_utf8)
        ));
        // Directory link counts as subdirectories come and go from another process.
        std::fs::create_dir(p("d")).unwrap();
        out.push(format!("d {}", look(&p("d"))));
        step(&mut out, "mkdir d/e d/e2 && mv d/e2 .");
        out.push(format!("d {} e2 {}", look(&p("d")), look(&p("e2"))));
        results.push(out);
    }
    for (a, b) in results[0].iter().zip(&results[1]) {
        assert_eq!(a, b, "tmpfs vs mount");
    }
    assert_eq!(results[0].len(), results[1].len());
    m.umount();
}

/// Listings come from the kernel's cache: the mount answers OPENDIR with ENOSYS
/// (FUSE_NO_OPENDIR_SUPPORT), and the kernel then opens every directory with
/// FOPEN_CACHE_DIR, keeps the listing in the directory's page cache and checks it at
/// each new listing against the directory's change count and mtime. Fifty listings
/// of an unchanged directory of 100 files cost the requests of the first one only
/// (without the cache: at least two per listing, 100 or more).
#[test]
fn listings_of_an_unchanged_directory_come_from_the_kernel_cache() {
    let mut m = Mount::new("listing-cache", "64M", "");
    let d = m.path("d");
    std::fs::create_dir(&d).unwrap();
    for i in 0..100 {
        std::fs::write(d.join(format!("file-{i:03}")), b"x").unwrap();
    }
    for _ in 0..50 {
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 100);
    }
    // A change shows at the next listing (the staleness test checks it against tmpfs).
    std::fs::remove_file(d.join("file-000")).unwrap();
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), 99);
    m.umount();
    let asked = m.served("readdir") + m.served("readdirplus");
    assert!(asked >= 2, "no listing reached the daemon\n{}", m.log_text());
    assert!(asked <= 30, "{asked} listing requests for 51 listings\n{}", m.log_text());
}

/// lseek's SEEK_DATA and SEEK_HOLE on the mount answer as tmpfs does (page
/// granularity) for written pages, embedded small writes, a punched page, a hole
/// made by extending with ftruncate, and offsets at and past the end. (Before, the
/// mount had no lseek: the kernel reported every byte below the size as data.)
/// Ranges reserved with fallocate are not compared: FerriteFS zeroes and maps them,
/// so they count as data, where tmpfs and ext4 report unwritten space as holes.
///
/// Regression (CI, 2026-11-30): its final `ferrite umount` once failed with EBUSY.
/// Its file was opened without O_CLOEXEC, so a child that another test of this
/// binary spawned meanwhile (a `ferrite mount` daemon, `setpriv`, `sh`) could
/// inherit the descriptor and keep the file open on this mount. Every open in this
/// file now sets O_CLOEXEC, as std's opens do.
#[test]
fn seek_data_and_hole_match_tmpfs() {
    let mut m = Mount::new("seekhole", "64M", "");
    let tmp =
        tempfile::Builder::new().prefix("ferrite-ref").tempdir_in("/dev/shm").expect("tmpfs dir");
    const P: u64 = 4096;
    let answers = |dir: &Path| -> Vec<String> {
        let fd = rfs::open(
            dir.join("sparse"),
            OFlags::CREATE | OFlags::RDWR | OFlags::TRUNC | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .expect("open");
        rustix::io::pwrite(&fd, &[1u8; 4096], 0).unwrap();
        rustix::io::pwrite(&fd, b"small", 5 * P + 10).unwrap();
        rustix::io::pwrite(&fd, &[2u8; 3 * 4096], 9 * P).unwrap();
        rfs::ftruncate(&fd, 20 * P + 100).unwrap();
        let punch = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        rfs::fallocate(&fd, punch, 10 * P, P).unwrap();
        let mut out = Vec::new();
        for off in (0..22 * P).step_by(1000) {
            for (name, w) in [("data", SeekFrom::Data(off)), ("hole", SeekFrom::Hole(off))] {
                let r = rfs::seek(&fd, w).map(|p| p.to_string()).unwrap_or_else(e);
                out.push(format!("{name} {off}: {r}"));
            }
        }
        out
    };
    let want = answers(tmp.path());
    let got = answers(&m.mnt);
    let diff: Vec<_> = want.iter().zip(&got).filter(|(a, b)| a != b).collect();
    assert!(diff.is_empty(), "tmpfs vs mount: {diff:#?}");
    m.umount();
}

/// The cross-user cases the random runs cannot reach (there, every file has one
/// owner): root prepares a sticky directory holding root's files and a set-group-id
/// directory of another group, on tmpfs and on the mount; then uid 1000 runs the
/// same script on both (`child_sticky`) and the transcripts must match line by line:
/// the sticky rule (no unlink, rename or replace of another user's entry, the
/// user's own entries free), set-group-id inheritance of group and of the bit by
/// subdirectories, chmod dropping S_ISGID for a group the user is not in, and chown
/// and writes clearing set-id bits.
#[test]
fn sticky_and_setgid_directories_across_users_match_tmpfs() {
    use std::os::unix::fs::{chown, PermissionsExt};
    let mut m = Mount::new("conformance-sticky", "256M", "allow_other");
    let tmp =
        tempfile::Builder::new().prefix("ferrite-ref").tempdir_in("/dev/shm").expect("tmpfs dir");
    let mode = |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m));
    let parent = m.mnt.parent().unwrap().to_path_buf();
    mode(&parent, 0o755).unwrap();
    for root in [tmp.path(), m.mnt.as_path()] {
        mode(root, 0o755).unwrap();
        let shared = root.join("shared");
        std::fs::create_dir(&shared).unwrap();
        mode(&shared, 0o1777).unwrap();
        std::fs::write(shared.join("root-file"), b"root's").unwrap();
        std::fs::write(shared.join("open-file"), b"anyone may write").unwrap();
        mode(&shared.join("open-file"), 0o666).unwrap();
        std::fs::create_dir(shared.join("root-dir")).unwrap();
        let grp = root.join("grp");
        std::fs::create_dir(&grp).unwrap();
        chown(&grp, Some(0), Some(1234)).unwrap();
        mode(&grp, 0o2777).unwrap();
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=1000", "--regid=1000", "--clear-groups", "--"])
        .arg(std::env::current_exe().expect("test binary"))
        .args(["child_sticky", "--exact", "--ignored", "--nocapture", "-q"])
        .env("FT_MNT", &m.mnt)
        .env("FT_REF", tmp.path())
        .output()
        .expect("run the child as another user (setpriv: scripts/install-deps.sh)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the script as uid 1000 differs:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The script ran and met the rules (not every call failed for another reason).
    for want in ["unlink shared/root-file: E1", "unlink shared/mine2: ok", "gid 1234"] {
        assert!(text.contains(want), "{want:?} missing from the transcript:\n{text}");
    }
    compare_trees(tmp.path(), &m.mnt).unwrap_or_else(|e| panic!("final trees: {e}"));
    if std::env::var_os("FERRITE_CONFORMANCE_TRACE").is_some() {
        println!("{text}");
    }
    m.umount();
    let (_, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
}

/// The script of `sticky_and_setgid_directories_across_users_match_tmpfs`, run on
/// one root; returns its transcript.
fn sticky_script(root: &Path) -> Vec<String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let p = |rel: &str| root.join(rel);
    let res = |r: std::io::Result<()>| match r {
        Ok(()) => "ok".to_string(),
        Err(err) => e(Errno::from_io_error(&err).unwrap_or(Errno::IO)),
    };
    let stat = |rel: &str| match std::fs::symlink_metadata(p(rel)) {
        Ok(md) => format!("{rel} mode {:o} uid {} gid {}", md.mode(), md.uid(), md.gid()),
        Err(err) => format!("{rel}: {}", e(Errno::from_io_error(&err).unwrap_or(Errno::IO))),
    };
    let chmod = |rel: &str, m: u32| {
        res(std::fs::set_permissions(p(rel), std::fs::Permissions::from_mode(m)))
    };
    let mut t = Vec::new();
    t.push(format!("create shared/mine: {}", res(std::fs::write(p("shared/mine"), b"mine"))));
    t.push(format!(
        "unlink shared/root-file: {}",
        res(std::fs::remove_file(p("shared/root-file")))
    ));
    t.push(format!(
        "rename shared/root-file -> shared/x: {}",
        res(std::fs::rename(p("shared/root-file"), p("shared/x")))
    ));
    t.push(format!(
        "rename shared/mine over shared/root-file: {}",
        res(std::fs::rename(p("shared/mine"), p("shared/root-file")))
    ));
    t.push(format!(
        "rename shared/mine -> shared/mine2: {}",
        res(std::fs::rename(p("shared/mine"), p("shared/mine2")))
    ));
    t.push(format!("rmdir shared/root-dir: {}", res(std::fs::remove_dir(p("shared/root-dir")))));
    t.push(format!(
        "write shared/open-file: {}",
        res(std::fs::write(p("shared/open-file"), b"written by 1000"))
    ));
    t.push(format!(
        "unlink shared/open-file: {}",
        res(std::fs::remove_file(p("shared/open-file")))
    ));
    t.push(format!("mkdir shared/mydir: {}", res(std::fs::create_dir(p("shared/mydir")))));
    t.push(format!("rmdir shared/mydir: {}", res(std::fs::remove_dir(p("shared/mydir")))));
    t.push(format!("unlink shared/mine2: {}", res(std::fs::remove_file(p("shared/mine2")))));
    // Set-group-id directory of group 1234 (the user is not in it).
    t.push(format!("create grp/f: {}", res(std::fs::write(p("grp/f"), b"f"))));
    t.push(stat("grp/f"));
    t.push(format!("mkdir grp/d: {}", res(std::fs::create_dir(p("grp/d")))));
    t.push(stat("grp/d"));
    t.push(format!("chmod grp/f 2755: {}", chmod("grp/f", 0o2755)));
    t.push(stat("grp/f"));
    // Set-user-id on the user's own file, then chown to its own group and a write:
    // each clears what Linux clears.
    t.push(format!("create shared/suid: {}", res(std::fs::write(p("shared/suid"), b"x"))));
    t.push(format!("chmod shared/suid 6755: {}", chmod("shared/suid", 0o6755)));
    t.push(stat("shared/suid"));
    let own = std::os::unix::fs::chown(p("shared/suid"), None, Some(1000));
    t.push(format!("chown shared/suid :1000: {}", res(own)));
    t.push(stat("shared/suid"));
    t.push(format!("chmod shared/suid 4755: {}", chmod("shared/suid", 0o4755)));
    let w = std::fs::OpenOptions::new()
        .write(true)
        .open(p("shared/suid"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"y"));
    t.push(format!("write shared/suid: {}", res(w)));
    t.push(stat("shared/suid"));
    t.push(format!(
        "chown shared/suid 0: {}",
        res(std::os::unix::fs::chown(p("shared/suid"), Some(0), None))
    ));
    t
}

#[test]
#[ignore = "run by sticky_and_setgid_directories_across_users_match_tmpfs as uid 1000"]
fn child_sticky() {
    let mnt = PathBuf::from(std::env::var_os("FT_MNT").expect("FT_MNT"));
    let reference = PathBuf::from(std::env::var_os("FT_REF").expect("FT_REF"));
    let (want, got) = (sticky_script(&reference), sticky_script(&mnt));
    for (a, b) in want.iter().zip(&got) {
        println!("{a}");
        assert_eq!(a, b, "tmpfs (left) and the mount (right) differ");
    }
    assert_eq!(want.len(), got.len());
}
