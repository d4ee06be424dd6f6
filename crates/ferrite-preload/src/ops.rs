//! The data path of direct descriptors, in safe code: each call is one core
//! operation on the process's own mapping of the pool, or a decision to let the
//! kernel do it.
//!
//! Invariants:
//! - The semantics are the kernel's: EBADF for a read of a write-only descriptor
//!   and the reverse, EINVAL for a negative offset, `pwrite` on an O_APPEND
//!   descriptor appends (as Linux does), `write` moves the offset by what it wrote,
//!   an O_APPEND `write` leaves it at the end of what it wrote.
//! - A private description's offset is read and moved under its own mutex; a shared
//!   one's (the kernel's) under the inode's cross-process lock.
//! - While the kernel's page cache may hold the file (plain opens or shared
//!   mappings: the table's flags), writes go through the kernel.

use crate::real;
use crate::table::Desc;
use ferrite_core::privs::self_lacks_cap_fsetid;
use ferrite_core::{FallocMode, SetAttr};
use ferrite_direct::Client;
use std::sync::atomic::Ordering;

/// An errno.
pub type R<T> = Result<T, i32>;

/// pwritev2's RWF_NOAPPEND (Linux 6.9), not in the libc crate.
pub const RWF_NOAPPEND: i32 = 0x20;

/// preadv2's and pwritev2's per-call flags, judged as Linux judges them for a
/// file on tmpfs or on the mount (both answer alike): bits Linux does not know,
/// and RWF_NOWAIT, RWF_ATOMIC and RWF_DONTCACHE, which neither supports, are
/// EOPNOTSUPP, and RWF_APPEND with RWF_NOAPPEND is EINVAL. RWF_HIPRI, RWF_DSYNC and
/// RWF_SYNC change nothing (every write is durable when it returns). What the call
/// makes of O_APPEND: `Some(true)` appends whatever the descriptor says (RWF_APPEND),
/// `Some(false)` writes where asked (RWF_NOAPPEND), `None` as the descriptor says.
/// Linux checks them after the descriptor's mode and after an empty transfer, which
/// succeeds whatever the flags; so must the caller.
pub fn rw_flags(flags: i32) -> R<Option<bool>> {
    let known =
        libc::RWF_HIPRI | libc::RWF_DSYNC | libc::RWF_SYNC | libc::RWF_APPEND | RWF_NOAPPEND;
    if flags & !known != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    match (flags & libc::RWF_APPEND != 0, flags & RWF_NOAPPEND != 0) {
        (true, true) => Err(libc::EINVAL),
        (true, false) => Ok(Some(true)),
        (false, true) => Ok(Some(false)),
        (false, false) => Ok(None),
    }
}

/// What became of a call.
pub enum Do<T> {
    /// Served here.
    Done(T),
    /// Served here, through the kernel descriptor.
    KernelDone(T),
    /// Let the caller forward it to the kernel unchanged.
    Kernel,
}

fn e(err: ferrite_core::Error) -> i32 {
    err.errno()
}

fn writes_direct(d: &Desc, c: &Client) -> bool {
    // A description the daemon did not count as a direct writer (inherited from
    // a plain process, on a `-o direct_io` mount or beside a client's writer)
    // writes directly only while the file's attributes are uncached anyway
    // (`Desc::writer_registered`); a redirection by a plain shell on a
    // `-o direct_io` mount left `stat` saying 0 bytes for a written file.
    let ok = c.may_write_direct(d.ino) && (d.writer_registered || c.party().writers_open(d.ino));
    if !ok {
        d.kernel_io.store(true, Ordering::Relaxed);
    }
    ok
}

/// Run `f` on the shared offset of `fd` under the inode's lock: `f` gets the
/// offset and returns the count it moved it by.
fn with_kernel_pos(
    c: &Client,
    d: &Desc,
    fd: i32,
    f: impl FnOnce(u64) -> R<(usize, u64)>,
) -> R<usize> {
    c.fs()
        .locked(d.ino, || {
            let pos = real::lseek(fd, 0, libc::SEEK_CUR)? as u64;
            let (n, new) = f(pos)?;
            real::lseek(fd, new as i64, libc::SEEK_SET)?;
            Ok(n)
        })
        .map_err(e)?
}

/// pread.
pub fn pread(c: &Client, d: &Desc, buf: &mut [u8], off: i64) -> R<Do<usize>> {
    // A negative offset before the mode, as Linux.
    if off < 0 {
        return Err(libc::EINVAL);
    }
    if !d.readable() {
        return Err(libc::EBADF);
    }
    Ok(Do::Done(c.fs().read(d.ino, off as u64, buf).map_err(e)?))
}

/// read.
pub fn read(c: &Client, d: &Desc, fd: i32, buf: &mut [u8]) -> R<Do<usize>> {
    if !d.readable() {
        return Err(libc::EBADF);
    }
    let fs = c.fs();
    if let Some(mut p) = d.private_pos() {
        let n = fs.read(d.ino, *p, buf).map_err(e)?;
        *p += n as u64;
        return Ok(Do::Done(n));
    }
    let n = with_kernel_pos(c, d, fd, |pos| {
        let n = fs.read(d.ino, pos, buf).map_err(e)?;
        Ok((n, pos + n as u64))
    })?;
    Ok(Do::Done(n))
}

/// pwrite.
pub fn pwrite(c: &Client, d: &Desc, data: &[u8], off: i64) -> R<Do<usize>> {
    pwrite_mode(c, d, data, off, d.append())
}

/// pwrite that appends when `append` says so, whatever the descriptor's O_APPEND
/// (pwritev2's RWF_APPEND and RWF_NOAPPEND).
pub fn pwrite_mode(c: &Client, d: &Desc, data: &[u8], off: i64, append: bool) -> R<Do<usize>> {
    // A negative offset before the mode, as Linux.
    if off < 0 {
        return Err(libc::EINVAL);
    }
    if !d.writable() {
        return Err(libc::EBADF);
    }
    if !writes_direct(d, c) {
        return Ok(Do::Kernel);
    }
    if append {
        c.fs().append_as(d.ino, data, self_lacks_cap_fsetid).map_err(e)?;
    } else {
        c.fs().write_as(d.ino, off as u64, data, self_lacks_cap_fsetid).map_err(e)?;
    }
    Ok(Do::Done(data.len()))
}

/// write.
pub fn write(c: &Client, d: &Desc, fd: i32, data: &[u8]) -> R<Do<usize>> {
    write_mode(c, d, fd, data, d.append())
}

/// write that appends when `append` says so, whatever the descriptor's O_APPEND
/// (pwritev2 at offset -1 with RWF_APPEND or RWF_NOAPPEND); the offset moves as
/// write(2) moves it.
pub fn write_mode(c: &Client, d: &Desc, fd: i32, data: &[u8], append: bool) -> R<Do<usize>> {
    if !d.writable() {
        return Err(libc::EBADF);
    }
    let fs = c.fs();
    let n = data.len();
    if n == 0 {
        // As write(2): nothing written, and an O_APPEND descriptor's offset does
        // not move to the end.
        return Ok(Do::Done(0));
    }
    let Some(mut p) = d.private_pos() else {
        if !writes_direct(d, c) {
            return Ok(Do::Kernel);
        }
        let n = with_kernel_pos(c, d, fd, |pos| {
            let at = if append {
                fs.append_as(d.ino, data, self_lacks_cap_fsetid).map_err(e)?
            } else {
                fs.write_as(d.ino, pos, data, self_lacks_cap_fsetid).map_err(e)?;
                pos
            };
            Ok((n, at + n as u64))
        })?;
        return Ok(Do::Done(n));
    };
    if !writes_direct(d, c) {
        // Through the kernel descriptor, keeping the offset here (per-call flags
        // where the mode is not the descriptor's).
        if append {
            let w = if d.append() {
                real::write(fd, data)?
            } else {
                real::pwritev2(fd, data, -1, libc::RWF_APPEND)?
            };
            *p = real::lseek(fd, 0, libc::SEEK_CUR)? as u64;
            return Ok(Do::KernelDone(w));
        }
        let w = if d.append() {
            real::pwritev2(fd, data, *p as i64, RWF_NOAPPEND)?
        } else {
            real::pwrite(fd, data, *p)?
        };
        *p += w as u64;
        return Ok(Do::KernelDone(w));
    }
    if append {
        let at = fs.append_as(d.ino, data, self_lacks_cap_fsetid).map_err(e)?;
        *p = at + n as u64;
    } else {
        fs.write_as(d.ino, *p, data, self_lacks_cap_fsetid).map_err(e)?;
        *p += n as u64;
    }
    Ok(Do::Done(n))
}

/// The description's offset.
pub fn tell(d: &Desc, fd: i32) -> R<u64> {
    match d.private_pos() {
        Some(p) => Ok(*p),
        None => Ok(real::lseek(fd, 0, libc::SEEK_CUR)? as u64),
    }
}

/// Set the description's offset to `pos`.
pub fn set_pos(d: &Desc, fd: i32, pos: u64) -> R<()> {
    match d.private_pos() {
        Some(mut p) => *p = pos,
        None => {
            real::lseek(fd, pos as i64, libc::SEEK_SET)?;
        }
    }
    Ok(())
}

/// lseek.
pub fn lseek(c: &Client, d: &Desc, fd: i32, off: i64, whence: i32) -> R<Do<i64>> {
    // Whether the description is shared is read under the offset's lock (see
    // `Desc::private_pos`).
    let mut p = d.pos.lock();
    let shared = d.shared.load(Ordering::Acquire);
    if shared && (whence == libc::SEEK_SET || whence == libc::SEEK_CUR) {
        return Ok(Do::Kernel);
    }
    let size = || -> R<i64> { Ok(c.fs().getattr(d.ino).map_err(e)?.size as i64) };
    let new = match whence {
        libc::SEEK_SET => off,
        libc::SEEK_CUR => (*p as i64).checked_add(off).ok_or(libc::EOVERFLOW)?,
        libc::SEEK_END => size()?.checked_add(off).ok_or(libc::EOVERFLOW)?,
        // Holes from the extent map, at page granularity (as tmpfs).
        libc::SEEK_DATA | libc::SEEK_HOLE => {
            // A negative offset is past no data: ENXIO, as tmpfs and ext4 say.
            if off < 0 {
                return Err(libc::ENXIO);
            }
            let hole = whence == libc::SEEK_HOLE;
            c.fs().seek_data(d.ino, off as u64, hole).map_err(e)? as i64
        }
        _ => return Err(libc::EINVAL),
    };
    if new < 0 {
        return Err(libc::EINVAL);
    }
    if shared {
        real::lseek(fd, new, libc::SEEK_SET)?;
    } else {
        *p = new as u64;
    }
    Ok(Do::Done(new))
}

/// fsync, fdatasync, sync_file_range: every direct operation was durable when it
/// returned; only what went through the kernel may need the kernel.
pub fn sync(d: &Desc) -> R<Do<i32>> {
    if d.kernel_io.load(Ordering::Relaxed) {
        return Ok(Do::Kernel);
    }
    Ok(Do::Done(0))
}

/// ftruncate.
pub fn ftruncate(c: &Client, d: &Desc, fd: i32, len: i64) -> R<Do<i32>> {
    if len < 0 {
        return Err(libc::EINVAL);
    }
    if !d.writable() {
        return Err(libc::EINVAL);
    }
    if !writes_direct(d, c) {
        return Ok(Do::Kernel);
    }
    let ch = SetAttr { size: Some(len as u64), ..Default::default() };
    match c.fs().setattr_as(d.ino, &ch, self_lacks_cap_fsetid) {
        Ok(_) => Ok(Do::Done(0)),
        // Linux lets a file shrink under its mappings; a DAX pin does not. This
        // process's own mappings go to the kernel, and the kernel truncates (its
        // page cache too: an access past the new end is SIGBUS, as on Linux).
        // Another process's pin still refuses (EBUSY).
        Err(ferrite_core::Error::DaxMapped) if hand_desc_maps_to_kernel(c, d, fd)? > 0 => {
            Ok(Do::Kernel)
        }
        Err(err) => Err(e(err)),
    }
}

/// fchmod, fchown, futimens on a descriptor this process writes directly: made in
/// the pool when the core can judge the permission without the kernel (the owner's
/// own changes, `ferrite_core::privs::owner_may`), else `Do::Kernel`. The kernel
/// caches no attributes of the file meanwhile (the daemon counts the descriptor
/// as a direct writer, FUSE.md "Kernel caches", rule 1), and it drops what it has
/// when the descriptor is released, so what it answers later is the pool's.
pub fn chattr(c: &Client, d: &Desc, ch: &SetAttr) -> R<Do<i32>> {
    owned(c, d, |caller| c.fs().setattr_owned(d.ino, ch, caller, self_lacks_cap_fsetid))
}

/// fsetxattr of `system.posix_acl_access` (flags 0) on a descriptor this process
/// writes directly: an ACL that says no more than a mode is that chmod, made in
/// the pool when the core can judge it (`Fs::set_mode_acl_owned`), else
/// `Do::Kernel`.
pub fn set_access_acl(c: &Client, d: &Desc, value: &[u8]) -> R<Do<i32>> {
    owned(c, d, |caller| c.fs().set_mode_acl_owned(d.ino, value, caller))
}

/// A change the core makes for the calling thread (`f`, given its file-system
/// ids) on a descriptor the daemon counts as a direct writer, when it can judge
/// it (`Some`); `Do::Kernel` otherwise.
fn owned(
    c: &Client,
    d: &Desc,
    f: impl FnOnce(ferrite_core::privs::Caller) -> ferrite_core::Result<Option<ferrite_core::Attr>>,
) -> R<Do<i32>> {
    if !d.writer_registered || !c.may_write_direct(d.ino) {
        return Ok(Do::Kernel);
    }
    let caller = ferrite_core::privs::Caller { uid: real::fsuid(), gid: real::fsgid() };
    match f(caller).map_err(e)? {
        Some(_) => Ok(Do::Done(0)),
        None => Ok(Do::Kernel),
    }
}

/// futimens's times as a change: NULL is "now" for both, UTIME_OMIT leaves one
/// alone, UTIME_NOW is now; any other nanoseconds outside 0..1e9 are EINVAL.
pub fn times_change(times: Option<[libc::timespec; 2]>) -> R<SetAttr> {
    use ferrite_core::{SetTime, Ts};
    let one = |t: libc::timespec| -> R<Option<SetTime>> {
        match t.tv_nsec {
            libc::UTIME_OMIT => Ok(None),
            libc::UTIME_NOW => Ok(Some(SetTime::Now)),
            ns if (0..1_000_000_000).contains(&ns) => {
                Ok(Some(SetTime::At(Ts { sec: t.tv_sec, nsec: ns as u32 })))
            }
            _ => Err(libc::EINVAL),
        }
    };
    let (atime, mtime) = match times {
        None => (Some(SetTime::Now), Some(SetTime::Now)),
        Some([a, m]) => (one(a)?, one(m)?),
    };
    Ok(SetAttr { atime, mtime, ..Default::default() })
}

/// This process's DAX mappings of `d`'s file (whose descriptor is `fd`), handed
/// to the kernel; see [`hand_maps_to_kernel`].
fn hand_desc_maps_to_kernel(c: &Client, d: &Desc, fd: i32) -> R<usize> {
    d.kernel_io.store(true, Ordering::Relaxed);
    hand_maps_to_kernel(c, d.ino, format!("/proc/self/fd/{fd}").as_bytes())
}

/// This process's DAX mappings of file `ino`, handed to the kernel (see
/// `Fs::hand_maps_to_kernel`) through a descriptor of `path` opened for reading
/// and writing (a caller's own may be write-only), or for reading when that is
/// refused, and checked to be `ino` (a name may be another file's by now). From
/// then on the file's writes go through the kernel, as for any mapping through it.
pub fn hand_maps_to_kernel(c: &Client, ino: u64, path: &[u8]) -> R<usize> {
    let path = std::ffi::CString::new(path).map_err(|_| libc::EINVAL)?;
    let open = |fl| real::openat(libc::AT_FDCWD, &path, fl | libc::O_CLOEXEC, 0);
    let kfd = open(libc::O_RDWR).or_else(|_| open(libc::O_RDONLY))?;
    let r = if real::statx_cached(kfd).map(|st| st.stx_ino) == Ok(ino) {
        c.note_kernel_mapping(ino);
        c.fs().hand_maps_to_kernel(ino, kfd).map_err(e)
    } else {
        Err(libc::ESTALE)
    };
    let _ = real::close(kfd); // the mappings keep the file
    r
}

/// fallocate (the modes the core has; others go to the kernel).
pub fn fallocate(c: &Client, d: &Desc, fd: i32, mode: i32, off: i64, len: i64) -> R<Do<i32>> {
    let Ok(m) = FallocMode::from_flags(mode) else { return Ok(Do::Kernel) };
    if off < 0 || len <= 0 {
        return Err(libc::EINVAL);
    }
    if !d.writable() {
        return Err(libc::EBADF);
    }
    if !writes_direct(d, c) {
        return Ok(Do::Kernel);
    }
    match c.fs().fallocate_as(d.ino, m, off as u64, len as u64, self_lacks_cap_fsetid) {
        Ok(()) => Ok(Do::Done(0)),
        // Punching or zeroing under the process's own DAX mapping: as for a shrink
        // (`ftruncate`), the mappings go to the kernel, which does it (and passes
        // these two modes to the daemon).
        Err(ferrite_core::Error::DaxMapped)
            if mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0
                && hand_desc_maps_to_kernel(c, d, fd)? > 0 =>
        {
            Ok(Do::Kernel)
        }
        Err(err) => Err(e(err)),
    }
}

/// ioctl(FICLONE / FICLONERANGE) from `src` into `dst`, two direct files of one
/// pool: a reflink in the core (`len` 0: to the source's end), which checks the
/// ranges as Linux does. The kernel's descriptor checks first: EBADF for a source
/// not open for reading or a destination not open for writing or in append mode.
pub fn clone(
    c: &Client,
    src: &Desc,
    dst: &Desc,
    off_in: u64,
    len: u64,
    off_out: u64,
) -> R<Do<i32>> {
    if !src.readable() || !dst.writable() || dst.append() {
        return Err(libc::EBADF);
    }
    if !writes_direct(dst, c) {
        return Ok(Do::Kernel);
    }
    c.fs()
        .clone_range_as(src.ino, off_in, dst.ino, off_out, len, self_lacks_cap_fsetid)
        .map_err(e)?;
    Ok(Do::Done(0))
}

/// Attributes for fstat / statx.
pub fn attr(c: &Client, d: &Desc) -> R<ferrite_core::Attr> {
    c.fs().getattr(d.ino).map_err(e)
}

/// A read or a write of one side of a copy.
pub enum Side<'a> {
    /// A direct descriptor.
    Direct(&'a Client, &'a Desc, i32),
    /// A kernel descriptor.
    Kernel(i32),
}

impl Side<'_> {
    /// Read at `off`, or at (and moving) the descriptor's offset.
    pub fn read(&self, buf: &mut [u8], off: Option<u64>) -> R<usize> {
        match (self, off) {
            (Side::Direct(c, d, _), Some(o)) => match pread(c, d, buf, o as i64)? {
                Do::Done(n) | Do::KernelDone(n) => Ok(n),
                Do::Kernel => Err(libc::EIO),
            },
            (Side::Direct(c, d, fd), None) => match read(c, d, *fd, buf)? {
                Do::Done(n) | Do::KernelDone(n) => Ok(n),
                Do::Kernel => Err(libc::EIO),
            },
            (Side::Kernel(fd), Some(o)) => real::pread(*fd, buf, o),
            (Side::Kernel(fd), None) => real::read(*fd, buf),
        }
    }

    /// Write at `off`, or at (and moving) the descriptor's offset.
    pub fn write(&self, data: &[u8], off: Option<u64>) -> R<usize> {
        let kernel = |fd: i32| match off {
            Some(o) => real::pwrite(fd, data, o),
            None => real::write(fd, data),
        };
        match self {
            Side::Direct(c, d, fd) => {
                let r = match off {
                    Some(o) => pwrite(c, d, data, o as i64)?,
                    None => write(c, d, *fd, data)?,
                };
                match r {
                    Do::Done(n) | Do::KernelDone(n) => Ok(n),
                    Do::Kernel => kernel(*fd),
                }
            }
            Side::Kernel(fd) => kernel(*fd),
        }
    }
}

/// copy_file_range / sendfile between sides, at least one direct: a loop of reads
/// and writes through a buffer (no kernel copy of a direct side). `off_in` /
/// `off_out` are advanced when given; otherwise the descriptors' offsets move.
pub fn copy(
    src: &Side<'_>,
    mut off_in: Option<&mut u64>,
    dst: &Side<'_>,
    mut off_out: Option<&mut u64>,
    len: usize,
) -> R<usize> {
    const CHUNK: usize = 1 << 20;
    // Two direct files of one pool at explicit offsets: the core copies, sharing
    // the whole pages that line up (a reflink) instead of copying them.
    if let (Side::Direct(c, s, _), Side::Direct(c2, d, _), Some(oi), Some(oo)) =
        (src, dst, off_in.as_deref_mut(), off_out.as_deref_mut())
    {
        if std::ptr::eq(*c, *c2) && writes_direct(d, c) {
            let n = c
                .fs()
                .copy_range_as(s.ino, *oi, d.ino, *oo, len as u64, self_lacks_cap_fsetid)
                .map_err(e)?;
            *oi += n;
            *oo += n;
            return Ok(n as usize);
        }
    }
    let mut buf = vec![0u8; len.min(CHUNK)];
    let mut done = 0usize;
    while done < len {
        let want = (len - done).min(buf.len());
        let n = src.read(&mut buf[..want], off_in.as_deref().copied())?;
        if n == 0 {
            break;
        }
        let mut w = 0;
        while w < n {
            let at = off_out.as_deref().map(|o| o + w as u64);
            let k = match dst.write(&buf[w..n], at) {
                Ok(k) => k,
                Err(err) if done + w == 0 => return Err(err),
                Err(_) => break,
            };
            if k == 0 {
                break;
            }
            w += k;
        }
        if let Some(o) = off_in.as_deref_mut() {
            *o += w as u64;
        }
        if let Some(o) = off_out.as_deref_mut() {
            *o += w as u64;
        }
        done += w;
        if w < n {
            break;
        }
    }
    Ok(done)
}

/// Any DAX mapping made in this process (the address-space hooks look further
/// only then).
pub static DAX_USED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `FERRITE_DAX=0` turns DAX mappings off (shared mappings go through the kernel).
fn dax_enabled() -> bool {
    static D: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::switch_on(&D, "FERRITE_DAX")
}

/// An `mmap(2)` call's arguments but the descriptor.
#[derive(Clone, Copy, Debug)]
pub struct MapCall {
    /// The address asked for (0: the kernel picks).
    pub addr: usize,
    /// Length in bytes.
    pub len: usize,
    /// PROT_* bits.
    pub prot: i32,
    /// MAP_* flags.
    pub flags: i32,
    /// Offset in the file.
    pub off: i64,
}

/// `FERRITE_COPY_MAPS=0` turns copied private mappings off (they go to the kernel).
fn copy_maps_enabled() -> bool {
    static D: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::switch_on(&D, "FERRITE_COPY_MAPS")
}

/// The largest private mapping made a copy (see [`mmap_private`]).
pub const COPY_MAP_MAX: usize = 1 << 20;

/// `mmap(2)` of a direct descriptor with MAP_PRIVATE, up to [`COPY_MAP_MAX`] bytes
/// within the file's pages, not executable and not at a fixed address: a private
/// anonymous mapping holding a copy of the range (the rest of the last page zero).
/// POSIX leaves unspecified whether a private mapping shows the file's later
/// changes, so a copy made now is one; what differs from the kernel's mapping is
/// that `madvise(MADV_DONTNEED)` zero-fills instead of reading the file again,
/// `mremap` grows it with zeros, and `/proc/self/maps` names no file. Through the
/// kernel such a mapping cost a round trip for the size, a read per fault, and
/// sent every client's writes of the file through the kernel while it was open
/// (its page cache held the file): `git` maps each loose object it reads this way,
/// and its index, and compilers map their inputs. Anything else: `Do::Kernel`.
fn mmap_private(c: &Client, d: &Desc, m: MapCall) -> R<Do<usize>> {
    let MapCall { addr, len, prot, flags, off } = m;
    let served = libc::MAP_PRIVATE
        | libc::MAP_NORESERVE
        | libc::MAP_POPULATE
        | libc::MAP_DENYWRITE
        | libc::MAP_EXECUTABLE;
    let plain = flags & libc::MAP_TYPE == libc::MAP_PRIVATE && flags & !served == 0;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    if !copy_maps_enabled()
        || !plain
        || addr != 0
        || prot & !rw != 0
        || len == 0
        || len > COPY_MAP_MAX
        || off < 0
        || off % 4096 != 0
    {
        return Ok(Do::Kernel);
    }
    if !d.readable() {
        return Err(libc::EACCES);
    }
    if !c.may_write_direct(d.ino) {
        // The kernel's page cache holds the file (a shared mapping through it may
        // have stores the pool has not seen yet): its mapping shows them.
        return Ok(Do::Kernel);
    }
    let size = c.fs().getattr(d.ino).map_err(e)?.size;
    let off = off as u64;
    if off + len as u64 > size.next_multiple_of(4096) {
        return Ok(Do::Kernel); // pages past the end: the kernel's SIGBUS
    }
    let mut m = real::AnonMap::new(len, flags & (libc::MAP_NORESERVE | libc::MAP_POPULATE))?;
    let want = (size - off).min(len as u64) as usize;
    let mut done = 0;
    while done < want {
        let n = c.fs().read(d.ino, off + done as u64, &mut m.bytes()[done..want]).map_err(e)?;
        if n == 0 {
            break; // shrunk meanwhile: the rest reads as zeros
        }
        done += n;
    }
    Ok(Do::Done(m.finish(prot)?))
}

/// `mmap(2)` of a direct descriptor: a shared mapping is the file's pool blocks
/// mapped into the process (DAX) when it can be, with the kernel's checks of the
/// open mode first; a private one a copy ([`mmap_private`]) when it can be;
/// anything else (flags the core does not serve, files the kernel's page cache
/// may hold) goes to the kernel.
pub fn mmap(c: &Client, d: &Desc, fd: i32, m: MapCall) -> R<Do<usize>> {
    use ferrite_core::filemap::SERVED_FLAGS;
    if m.flags & libc::MAP_TYPE == libc::MAP_PRIVATE {
        return mmap_private(c, d, m);
    }
    let MapCall { addr, len, prot, flags, off } = m;
    if !dax_enabled()
        || flags & libc::MAP_SHARED == 0
        || flags & !SERVED_FLAGS != 0
        || !c.may_write_direct(d.ino)
    {
        return Ok(Do::Kernel);
    }
    if len == 0 || off < 0 || off % 4096 != 0 {
        return Err(libc::EINVAL);
    }
    if !d.readable() || prot & libc::PROT_WRITE != 0 && (!d.writable() || d.append()) {
        return Err(libc::EACCES);
    }
    let validate = flags & libc::MAP_SHARED_VALIDATE == libc::MAP_SHARED_VALIDATE;
    if validate && flags & libc::MAP_SYNC != 0 && c.fs().medium().msync_mode() {
        // Stores to this pool are durable only after msync: MAP_SYNC's promise
        // (flushes suffice) would be false.
        return Err(libc::EOPNOTSUPP);
    }
    let keep = real::borrow(fd);
    let p = match c.fs().mmap_file(d.ino, addr, len, prot, flags, off as u64, Some(keep)) {
        Ok(p) => p,
        // A DAX mapping gives the range's holes blocks at once; with no room for
        // them (a large sparse file), the kernel maps the file and fills holes as
        // they are touched, as it would.
        Err(ferrite_core::Error::NoSpace) => return Ok(Do::Kernel),
        Err(err) => return Err(e(err)),
    };
    DAX_USED.store(true, Ordering::Release);
    Ok(Do::Done(p))
}
