//! The C API's logic in safe code: a handle is either a direct-access client of a
//! mounted pool (namespace through the mount, data through the core in this
//! process) or a pool this process opened exclusively (everything through the core).
//! Paths are inside the pool ("/a/b", or "a/b" from its root). Errors are errno
//! values; the `ffi` module turns them into -1 and errno.
//!
//! Invariants:
//! - An open file of an attached handle keeps its kernel descriptor (opened through
//!   the mount, with the O_DIRECT marker the daemon counts as a direct opener), so
//!   the daemon keeps the inode alive while it is open.
//! - Writes go through that kernel descriptor while the table says the kernel's page
//!   cache holds the file (plain openers), as the preload library does.
//! - Every table of the handle is behind its own lock: a handle may be used from
//!   several threads.

use ferrite_core::privs::self_lacks_cap_fsetid;
use ferrite_core::{
    encode_rdev, FallocMode, FileType, Fs, MapOptions, MkfsOptions, MmapMedium, NewNode, OpenFlags,
    SetAttr, SlashCall,
};
use ferrite_direct::Client;
use parking_lot::Mutex;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

/// An errno.
pub type R<T> = Result<T, i32>;

fn e(err: ferrite_core::Error) -> i32 {
    err.errno()
}

/// The process's file mode creation mask, which a pool opened alone applies to
/// the files and directories it makes, as the kernel does (from /proc/self/status:
/// umask(2) can only read it by changing it, which other threads would see; 022,
/// the usual mask, when /proc is not there).
fn umask() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        .unwrap_or(0o022)
}

fn io(err: std::io::Error) -> i32 {
    err.raw_os_error().unwrap_or(libc::EIO)
}

/// Where a handle's pool is.
pub enum Backend {
    /// A direct-access client of a mount.
    Client(Client),
    /// A pool this process opened exclusively.
    Pool(Box<Fs<MmapMedium>>),
}

/// An open file.
pub struct OpenFile {
    ino: u64,
    readable: bool,
    writable: bool,
    append: bool,
    pos: Mutex<u64>,
    /// Attached handles: the descriptor opened through the mount.
    kernel: Option<std::fs::File>,
}

/// File attributes as the C API reports them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ferrite_stat {
    /// Inode number.
    pub ino: u64,
    /// Type and permission bits (st_mode).
    pub mode: u32,
    /// Links.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// Access time, seconds.
    pub atime_sec: i64,
    /// Modification time, seconds.
    pub mtime_sec: i64,
    /// Change time, seconds.
    pub ctime_sec: i64,
    /// Access time, nanoseconds.
    pub atime_nsec: u32,
    /// Modification time, nanoseconds.
    pub mtime_nsec: u32,
    /// Change time, nanoseconds.
    pub ctime_nsec: u32,
    /// Device number of a character or block device (0 otherwise), in the
    /// kernel's 32-bit encoding: major `(rdev >> 8) & 0xfff`, minor
    /// `(rdev & 0xff) | ((rdev >> 12) & 0xfff00)`.
    pub rdev: u32,
}

impl From<&ferrite_core::Attr> for ferrite_stat {
    fn from(a: &ferrite_core::Attr) -> Self {
        ferrite_stat {
            ino: a.ino,
            mode: a.mode(),
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            size: a.size,
            blocks: a.blocks,
            atime_sec: a.atime.sec,
            mtime_sec: a.mtime.sec,
            ctime_sec: a.ctime.sec,
            atime_nsec: a.atime.nsec,
            mtime_nsec: a.mtime.nsec,
            ctime_nsec: a.ctime.nsec,
            rdev: a.rdev,
        }
    }
}

/// One FerriteFS handle.
pub struct Handle {
    backend: Backend,
    files: Mutex<Vec<Option<Arc<OpenFile>>>>,
}

/// The path inside the pool, without leading slashes ("" is the root).
fn rel(path: &[u8]) -> R<&[u8]> {
    if path.is_empty() {
        return Err(libc::ENOENT);
    }
    let mut p = path;
    while p.first() == Some(&b'/') {
        p = &p[1..];
    }
    Ok(p)
}

fn core_path(path: &[u8]) -> R<Vec<u8>> {
    let r = rel(path)?;
    let mut v = Vec::with_capacity(r.len() + 1);
    v.push(b'/');
    v.extend_from_slice(r);
    Ok(v)
}

impl Handle {
    /// A direct-access client of the mount at `mount`.
    pub fn attach(mount: &[u8]) -> R<Handle> {
        let mp = PathBuf::from(std::ffi::OsStr::from_bytes(mount));
        let c = Client::attach(&mp).map_err(|err| match err {
            ferrite_direct::AttachError::NoAccess(_) => libc::EACCES,
            ferrite_direct::AttachError::NotOffered(_) => libc::ENOTSUP,
            ferrite_direct::AttachError::Failed(_) => libc::EIO,
        })?;
        Ok(Handle { backend: Backend::Client(c), files: Mutex::new(Vec::new()) })
    }

    /// The pool file `pool`, opened by this process alone; formatted with
    /// `create_size` bytes when it does not exist and `create_size` is not 0.
    pub fn open_pool(pool: &[u8], create_size: u64) -> R<Handle> {
        let p = PathBuf::from(std::ffi::OsStr::from_bytes(pool));
        let fs = if !p.exists() && create_size > 0 {
            let m = MmapMedium::create(&p, create_size / 4096 * 4096, &MapOptions::default())
                .map_err(e)?;
            Fs::mkfs(m, &MkfsOptions::default()).map_err(e)?
        } else {
            let m = MmapMedium::open(&p, &MapOptions::default()).map_err(e)?;
            Fs::mount(m, &Default::default()).map_err(e)?
        };
        Ok(Handle { backend: Backend::Pool(Box::new(fs)), files: Mutex::new(Vec::new()) })
    }

    /// End the handle: a client detaches (its blocks back to the daemon), an
    /// exclusive pool is unmounted cleanly.
    pub fn close(self) -> R<()> {
        self.files.lock().clear();
        match self.backend {
            Backend::Client(c) => {
                c.detach();
                Ok(())
            }
            Backend::Pool(fs) => fs.unmount().map(|_| ()).map_err(e),
        }
    }

    fn fs(&self) -> &Fs<MmapMedium> {
        match &self.backend {
            Backend::Client(c) => c.fs(),
            Backend::Pool(fs) => fs,
        }
    }

    fn mount_path(&self, path: &[u8]) -> R<Option<PathBuf>> {
        match &self.backend {
            Backend::Client(c) => Ok(Some(c.mount().join(std::ffi::OsStr::from_bytes(rel(path)?)))),
            Backend::Pool(_) => Ok(None),
        }
    }

    fn file(&self, fd: i32) -> R<Arc<OpenFile>> {
        let files = self.files.lock();
        usize::try_from(fd).ok().and_then(|i| files.get(i).cloned().flatten()).ok_or(libc::EBADF)
    }

    fn add(&self, f: OpenFile) -> i32 {
        let mut files = self.files.lock();
        let f = Some(Arc::new(f));
        match files.iter().position(|x| x.is_none()) {
            Some(i) => {
                files[i] = f;
                i as i32
            }
            None => {
                files.push(f);
                (files.len() - 1) as i32
            }
        }
    }

    /// open(2): flags and mode as open(2)'s.
    pub fn open(&self, path: &[u8], flags: i32, mode: u32) -> R<i32> {
        let acc = flags & libc::O_ACCMODE;
        let (readable, writable) = (acc != libc::O_WRONLY, acc != libc::O_RDONLY);
        let append = flags & libc::O_APPEND != 0;
        if let Some(mp) = self.mount_path(path)? {
            // The caller's flags go to open(2) as they are (with O_DIRECT: data the
            // kernel writes skips the page cache). Not through std's OpenOptions:
            // it refuses O_TRUNC with O_APPEND, which open(2) takes, with an error
            // that has no errno (the caller saw EIO).
            // O_NONBLOCK for the open itself: a FIFO must not block it (one opened
            // for writing with no reader fails ENXIO, as this call promises for
            // special files); a regular file's descriptor gets the caller's flags back.
            use rustix::fs::OFlags;
            let oflags = OFlags::from_bits_retain(flags as u32)
                | OFlags::DIRECT
                | OFlags::CLOEXEC
                | OFlags::NONBLOCK;
            let fd = rustix::fs::open(&mp, oflags, rustix::fs::Mode::from_raw_mode(mode))
                .map_err(|x| x.raw_os_error())?;
            let f = std::fs::File::from(fd);
            let st = rustix::fs::statx(
                &f,
                "",
                rustix::fs::AtFlags::EMPTY_PATH | rustix::fs::AtFlags::STATX_DONT_SYNC,
                rustix::fs::StatxFlags::TYPE | rustix::fs::StatxFlags::INO,
            )
            .map_err(|x| x.raw_os_error())?;
            match u32::from(st.stx_mode) & libc::S_IFMT {
                libc::S_IFREG => {}
                libc::S_IFDIR => return Err(libc::EISDIR),
                _ => return Err(libc::ENXIO),
            }
            if flags & libc::O_NONBLOCK == 0 {
                let fl = rustix::fs::fcntl_getfl(&f).map_err(|x| x.raw_os_error())?;
                rustix::fs::fcntl_setfl(&f, fl - OFlags::NONBLOCK).map_err(|x| x.raw_os_error())?;
            }
            let pos = if append { f.metadata().map(|m| m.len()).unwrap_or(0) } else { 0 };
            return Ok(self.add(OpenFile {
                ino: st.stx_ino,
                readable,
                writable,
                append,
                pos: Mutex::new(pos),
                kernel: Some(f),
            }));
        }
        let fl = OpenFlags {
            create: flags & libc::O_CREAT != 0,
            excl: flags & libc::O_EXCL != 0,
            truncate: flags & libc::O_TRUNC != 0,
            directory: flags & libc::O_DIRECTORY != 0,
            nofollow: flags & libc::O_NOFOLLOW != 0,
            write: writable,
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        };
        // (The mask is read only when the call may create.)
        let perm = if fl.create { mode & 0o7777 & !umask() } else { 0 };
        let a = self.fs().open_path(&core_path(path)?, fl, perm).map_err(e)?;
        if a.ftype != FileType::Regular {
            let _ = self.fs().release(a.ino);
            return Err(libc::EISDIR);
        }
        Ok(self.add(OpenFile {
            ino: a.ino,
            readable,
            writable,
            append,
            pos: Mutex::new(0),
            kernel: None,
        }))
    }

    /// close(2).
    pub fn close_fd(&self, fd: i32) -> R<()> {
        let f = {
            let mut files = self.files.lock();
            let slot =
                usize::try_from(fd).ok().and_then(|i| files.get_mut(i)).ok_or(libc::EBADF)?;
            slot.take().ok_or(libc::EBADF)?
        };
        if f.kernel.is_none() {
            self.fs().release(f.ino).map_err(e)?;
        }
        Ok(())
    }

    /// The kernel descriptor to write through, when the page cache holds the file.
    fn through_kernel<'a>(&self, f: &'a OpenFile) -> Option<&'a std::fs::File> {
        match (&self.backend, &f.kernel) {
            (Backend::Client(c), Some(k)) if !c.may_write_direct(f.ino) => Some(k),
            _ => None,
        }
    }

    /// A shared mapping of `len` bytes of open file `fd` from `off` (a multiple of
    /// 4096): the file's pool blocks in this process (DAX). `prot` as mmap(2)'s.
    pub fn mmap(&self, fd: i32, len: usize, prot: i32, off: i64) -> R<usize> {
        let f = self.file(fd)?;
        if len == 0 || off < 0 || off % 4096 != 0 {
            return Err(libc::EINVAL);
        }
        if !f.readable || prot & libc::PROT_WRITE != 0 && (!f.writable || f.append) {
            return Err(libc::EACCES);
        }
        if let Backend::Client(c) = &self.backend {
            if !c.may_write_direct(f.ino) {
                // The kernel's page cache holds the file (a plain process has it
                // open or mapped): stores here would not reach it.
                return Err(libc::EBUSY);
            }
        }
        let keep = f.kernel.as_ref().map(std::os::fd::AsFd::as_fd);
        let flags = libc::MAP_SHARED;
        self.fs().mmap_file(f.ino, 0, len, prot, flags, off as u64, keep).map_err(e)
    }

    /// An atomic mapping of `len` bytes of open file `fd` from `off`: a private
    /// copy whose changed pages `persist` commits as one atomic update.
    pub fn mmap_atomic(&self, fd: i32, len: usize, prot: i32, off: i64) -> R<usize> {
        let f = self.file(fd)?;
        if off < 0 {
            return Err(libc::EINVAL);
        }
        if !f.readable || prot & libc::PROT_WRITE != 0 && (!f.writable || f.append) {
            return Err(libc::EACCES);
        }
        self.fs().mmap_atomic(f.ino, len, prot, off as u64).map_err(e)
    }

    /// Set the NUMA placement policy of open file `fd`: its new data goes to node
    /// `node`, or to the writer's node when `node` is negative (the default).
    pub fn set_numa_node(&self, fd: i32, node: i32) -> R<()> {
        let f = self.file(fd)?;
        let v = if node < 0 { "local".to_string() } else { node.to_string() };
        let name = std::str::from_utf8(ferrite_core::numa::POLICY_XATTR).expect("ascii");
        match &f.kernel {
            // Through the mount: the daemon checks and commits it like any xattr.
            Some(k) => {
                rustix::fs::fsetxattr(k, name, v.as_bytes(), rustix::fs::XattrFlags::empty())
                    .map_err(|x| x.raw_os_error())
            }
            None => self
                .fs()
                .setxattr(f.ino, name.as_bytes(), v.as_bytes(), Default::default())
                .map_err(e),
        }
    }

    /// A persistent buffer of `len` bytes: pool blocks mapped into the process.
    pub fn buf_alloc(&self, len: usize) -> R<usize> {
        self.fs().buf_map(len).map_err(e)
    }

    /// pwrite(2) of `len` bytes of a persistent buffer at `addr`: whole pages that
    /// line up with file pages are adopted by reference, the rest copied.
    pub fn buf_write(&self, fd: i32, addr: usize, len: usize, off: i64) -> R<usize> {
        let f = self.file(fd)?;
        if !f.writable {
            return Err(libc::EBADF);
        }
        if off < 0 {
            return Err(libc::EINVAL);
        }
        if let Some(k) = self.through_kernel(&f) {
            // The kernel's page cache holds the file: a plain write through it.
            let data = self.fs().buf_bytes(addr, len).map_err(e)?;
            k.write_all_at(&data, off as u64).map_err(io)?;
            return Ok(len);
        }
        self.fs().buf_write(f.ino, off as u64, addr, len).map_err(e)
    }

    /// Free the persistent buffer at `addr`.
    pub fn buf_free(&self, addr: usize) -> R<()> {
        self.fs().buf_unmap(addr).map_err(e)
    }

    /// munmap(2) of (part of) a mapping of `mmap`; EINVAL for a range that meets
    /// none.
    pub fn munmap(&self, addr: usize, len: usize) -> R<()> {
        self.fs().munmap_file(addr, len).ok_or(libc::EINVAL)?.map_err(e)
    }

    /// Make stores to `[addr, addr + len)` of mappings of `mmap` durable (of an
    /// atomic mapping: commit its changed pages atomically); EINVAL when the range
    /// is not all inside such mappings (their part is persisted).
    pub fn persist(&self, addr: usize, len: usize) -> R<()> {
        if let Some(r) = self.fs().persist_atomic(addr, len) {
            return r.map_err(e);
        }
        match self.fs().persist_mapped(addr, len) {
            Some(true) => Ok(()),
            _ => Err(libc::EINVAL),
        }
    }

    /// pread(2).
    pub fn pread(&self, fd: i32, buf: &mut [u8], off: i64) -> R<usize> {
        let f = self.file(fd)?;
        if !f.readable {
            return Err(libc::EBADF);
        }
        if off < 0 {
            return Err(libc::EINVAL);
        }
        self.fs().read(f.ino, off as u64, buf).map_err(e)
    }

    /// pwrite(2) (an O_APPEND file appends, as on Linux).
    pub fn pwrite(&self, fd: i32, data: &[u8], off: i64) -> R<usize> {
        let f = self.file(fd)?;
        if !f.writable {
            return Err(libc::EBADF);
        }
        if off < 0 {
            return Err(libc::EINVAL);
        }
        self.write_at(&f, data, Some(off as u64)).map(|(n, _)| n)
    }

    /// Write at `off`, or append; returns the count and where it ended.
    fn write_at(&self, f: &OpenFile, data: &[u8], off: Option<u64>) -> R<(usize, u64)> {
        if data.is_empty() {
            // As write(2): nothing written, and an O_APPEND descriptor's offset
            // does not move to the end.
            return Ok((0, off.unwrap_or(0)));
        }
        if let Some(k) = self.through_kernel(f) {
            if f.append {
                use std::io::{Seek, Write};
                let mut k = k;
                let n = k.write(data).map_err(io)?;
                let end = k.stream_position().map_err(io)?;
                return Ok((n, end));
            }
            let at = off.unwrap_or(0);
            let n = k.write_at(data, at).map_err(io)?;
            return Ok((n, at + n as u64));
        }
        if f.append {
            let at = self.fs().append_as(f.ino, data, self_lacks_cap_fsetid).map_err(e)?;
            return Ok((data.len(), at + data.len() as u64));
        }
        let at = off.unwrap_or(0);
        self.fs().write_as(f.ino, at, data, self_lacks_cap_fsetid).map_err(e)?;
        Ok((data.len(), at + data.len() as u64))
    }

    /// read(2).
    pub fn read(&self, fd: i32, buf: &mut [u8]) -> R<usize> {
        let f = self.file(fd)?;
        if !f.readable {
            return Err(libc::EBADF);
        }
        let mut p = f.pos.lock();
        let n = self.fs().read(f.ino, *p, buf).map_err(e)?;
        *p += n as u64;
        Ok(n)
    }

    /// write(2).
    pub fn write(&self, fd: i32, data: &[u8]) -> R<usize> {
        let f = self.file(fd)?;
        if !f.writable {
            return Err(libc::EBADF);
        }
        let mut p = f.pos.lock();
        let (n, end) = self.write_at(&f, data, Some(*p))?;
        *p = end;
        Ok(n)
    }

    /// lseek(2) (SEEK_SET, SEEK_CUR, SEEK_END, and SEEK_DATA / SEEK_HOLE at page
    /// granularity, as tmpfs).
    pub fn lseek(&self, fd: i32, off: i64, whence: i32) -> R<i64> {
        let f = self.file(fd)?;
        let mut p = f.pos.lock();
        let new = match whence {
            libc::SEEK_SET => off,
            libc::SEEK_CUR => (*p as i64).checked_add(off).ok_or(libc::EOVERFLOW)?,
            libc::SEEK_END => {
                let size = self.fs().getattr(f.ino).map_err(e)?.size as i64;
                size.checked_add(off).ok_or(libc::EOVERFLOW)?
            }
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                // A negative offset is past no data: ENXIO, as tmpfs and ext4 say.
                if off < 0 {
                    return Err(libc::ENXIO);
                }
                let hole = whence == libc::SEEK_HOLE;
                self.fs().seek_data(f.ino, off as u64, hole).map_err(e)? as i64
            }
            _ => return Err(libc::EINVAL),
        };
        if new < 0 {
            return Err(libc::EINVAL);
        }
        *p = new as u64;
        Ok(new)
    }

    /// fsync(2): every operation was durable when it returned.
    pub fn fsync(&self, fd: i32) -> R<()> {
        let f = self.file(fd)?;
        if let Some(k) = &f.kernel {
            if self.through_kernel(&f).is_some() {
                k.sync_all().map_err(io)?;
            }
        }
        Ok(())
    }

    /// ftruncate(2).
    pub fn ftruncate(&self, fd: i32, len: i64) -> R<()> {
        let f = self.file(fd)?;
        if !f.writable || len < 0 {
            return Err(libc::EINVAL);
        }
        if let Some(k) = self.through_kernel(&f) {
            return k.set_len(len as u64).map_err(io);
        }
        let ch = SetAttr { size: Some(len as u64), ..Default::default() };
        self.fs().setattr_as(f.ino, &ch, self_lacks_cap_fsetid).map(|_| ()).map_err(e)
    }

    /// fallocate(2): every mode the core does (allocate, KEEP_SIZE, PUNCH_HOLE,
    /// ZERO_RANGE, COLLAPSE_RANGE, INSERT_RANGE), with fallocate(2)'s errors.
    pub fn fallocate(&self, fd: i32, mode: i32, off: i64, len: i64) -> R<()> {
        let f = self.file(fd)?;
        if off < 0 || len <= 0 {
            return Err(libc::EINVAL);
        }
        let m = FallocMode::from_flags(mode).map_err(e)?;
        if !f.writable {
            return Err(libc::EBADF);
        }
        if let Some(k) = self.through_kernel(&f) {
            let flags = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
            return rustix::fs::fallocate(k, flags, off as u64, len as u64)
                .map_err(|x| x.raw_os_error());
        }
        let (off, len) = (off as u64, len as u64);
        self.fs().fallocate_as(f.ino, m, off, len, self_lacks_cap_fsetid).map_err(e)
    }

    /// FICLONERANGE: make `len` bytes of `dst_fd` from `off_out` share the data of
    /// `src_fd` from `off_in` (`len` 0: to the source's end), a reflink, durable
    /// and atomic when it returns; Linux's rules and errors (EINVAL for unaligned
    /// ranges or overlap in one file, EBADF for access modes, EBUSY while the
    /// destination is DAX-mapped).
    pub fn clone_range(
        &self,
        src_fd: i32,
        off_in: i64,
        dst_fd: i32,
        off_out: i64,
        len: i64,
    ) -> R<()> {
        let (s, d) = (self.file(src_fd)?, self.file(dst_fd)?);
        if !s.readable || !d.writable || d.append {
            return Err(libc::EBADF);
        }
        if off_in < 0 || off_out < 0 || len < 0 {
            return Err(libc::EINVAL);
        }
        if self.through_kernel(&d).is_some() {
            // Page-cache users of the destination: the kernel's FUSE client has no
            // reflinks.
            return Err(libc::EOPNOTSUPP);
        }
        let (a, b, n) = (off_in as u64, off_out as u64, len as u64);
        self.fs()
            .clone_range_as(s.ino, a, d.ino, b, n, self_lacks_cap_fsetid)
            .map(|_| ())
            .map_err(e)
    }

    /// fstat(2).
    pub fn fstat(&self, fd: i32) -> R<ferrite_stat> {
        let f = self.file(fd)?;
        self.fs().getattr(f.ino).map(|a| (&a).into()).map_err(e)
    }

    /// stat(2) of a path (symlinks followed).
    pub fn stat(&self, path: &[u8]) -> R<ferrite_stat> {
        if let Some(mp) = self.mount_path(path)? {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(&mp).map_err(io)?;
            return Ok(ferrite_stat {
                ino: m.ino(),
                mode: m.mode(),
                nlink: m.nlink() as u32,
                uid: m.uid(),
                gid: m.gid(),
                size: m.size(),
                blocks: m.blocks(),
                atime_sec: m.atime(),
                mtime_sec: m.mtime(),
                ctime_sec: m.ctime(),
                atime_nsec: m.atime_nsec() as u32,
                mtime_nsec: m.mtime_nsec() as u32,
                ctime_nsec: m.ctime_nsec() as u32,
                rdev: encode_rdev(rustix::fs::major(m.rdev()), rustix::fs::minor(m.rdev())),
            });
        }
        self.fs().stat_path(&core_path(path)?).map(|a| (&a).into()).map_err(e)
    }

    /// mkdir(2).
    pub fn mkdir(&self, path: &[u8], mode: u32) -> R<()> {
        if let Some(mp) = self.mount_path(path)? {
            use std::os::unix::fs::DirBuilderExt;
            return std::fs::DirBuilder::new().mode(mode).create(&mp).map_err(io);
        }
        let fs = self.fs();
        let cp = core_path(path)?;
        let (p, name) = fs.resolve_parent(&cp).map_err(e)?;
        let (uid, gid) = (rustix::process::geteuid(), rustix::process::getegid());
        let perm = mode & 0o7777 & !umask();
        fs.mkdir(p, name, perm, uid.as_raw(), gid.as_raw()).map(|_| ()).map_err(e)
    }

    /// mknod(2): a FIFO, socket, device node (`dev` as makedev gives it) or
    /// regular file; the process's umask applies, as it does to mkdir and to
    /// ferrite_open's O_CREAT.
    pub fn mknod(&self, path: &[u8], mode: u32, dev: u64) -> R<()> {
        let t =
            FileType::from_mode(if mode & libc::S_IFMT == 0 { mode | libc::S_IFREG } else { mode });
        let t = t.ok_or(libc::EINVAL)?;
        if let Some(mp) = self.mount_path(path)? {
            use rustix::fs::FileType as H;
            let ht = match t {
                FileType::Regular => H::RegularFile,
                FileType::Fifo => H::Fifo,
                FileType::CharDevice => H::CharacterDevice,
                FileType::BlockDevice => H::BlockDevice,
                FileType::Socket => H::Socket,
                _ => return Err(libc::EINVAL),
            };
            let perm = rustix::fs::Mode::from_raw_mode(mode & 0o7777);
            return rustix::fs::mknodat(rustix::fs::CWD, &mp, ht, perm, dev)
                .map_err(|x| x.raw_os_error());
        }
        let fs = self.fs();
        let cp = core_path(path)?;
        let (parent, name) = fs.resolve_parent(&cp).map_err(e)?;
        fs.check_slash(&cp, parent, name, SlashCall::Make).map_err(e)?;
        let (uid, gid) = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
        let node = NewNode { parent, name, dir: false, uid, gid };
        let rdev = encode_rdev(rustix::fs::major(dev), rustix::fs::minor(dev));
        fs.mknod(node, t, mode & 0o7777 & !umask(), rdev, 0).map(|_| ()).map_err(e)
    }

    /// unlink(2).
    pub fn unlink(&self, path: &[u8]) -> R<()> {
        if let Some(mp) = self.mount_path(path)? {
            return std::fs::remove_file(&mp).map_err(io);
        }
        let fs = self.fs();
        let cp = core_path(path)?;
        let (p, name) = fs.resolve_parent(&cp).map_err(e)?;
        fs.check_slash(&cp, p, name, SlashCall::Unlink).map_err(e)?;
        fs.unlink(p, name).map_err(e)
    }

    /// rmdir(2).
    pub fn rmdir(&self, path: &[u8]) -> R<()> {
        if let Some(mp) = self.mount_path(path)? {
            return std::fs::remove_dir(&mp).map_err(io);
        }
        let fs = self.fs();
        let cp = core_path(path)?;
        let (p, name) = fs.resolve_parent(&cp).map_err(e)?;
        fs.rmdir(p, name).map_err(e)
    }

    /// rename(2).
    pub fn rename(&self, from: &[u8], to: &[u8]) -> R<()> {
        if let (Some(a), Some(b)) = (self.mount_path(from)?, self.mount_path(to)?) {
            return std::fs::rename(&a, &b).map_err(io);
        }
        let fs = self.fs();
        let (a, b) = (core_path(from)?, core_path(to)?);
        let (sp, sn) = fs.resolve_parent(&a).map_err(e)?;
        let (dp, dn) = fs.resolve_parent(&b).map_err(e)?;
        fs.check_rename_slash(&a, &b, sp, sn, dn).map_err(e)?;
        fs.rename(sp, sn, dp, dn, Default::default()).map_err(e)
    }

    /// The entries of a directory (without "." and ".."): (name, inode, d_type).
    pub fn readdir(&self, path: &[u8]) -> R<Vec<(Vec<u8>, u64, u8)>> {
        if let Some(mp) = self.mount_path(path)? {
            use std::os::unix::fs::{DirEntryExt, FileTypeExt};
            let mut v = Vec::new();
            for ent in std::fs::read_dir(&mp).map_err(io)? {
                let ent = ent.map_err(io)?;
                let t = ent.file_type().map_err(io)?;
                let dt = if t.is_dir() {
                    libc::DT_DIR
                } else if t.is_symlink() {
                    libc::DT_LNK
                } else if t.is_fifo() {
                    libc::DT_FIFO
                } else if t.is_socket() {
                    libc::DT_SOCK
                } else if t.is_char_device() {
                    libc::DT_CHR
                } else if t.is_block_device() {
                    libc::DT_BLK
                } else {
                    libc::DT_REG
                };
                v.push((ent.file_name().as_bytes().to_vec(), ent.ino(), dt));
            }
            return Ok(v);
        }
        let fs = self.fs();
        let ino = fs.resolve(&core_path(path)?, true).map_err(e)?;
        let list = fs.list_dir(ino).map_err(e)?;
        Ok(list
            .into_iter()
            .map(|d| {
                let dt = match d.ftype {
                    FileType::Directory => libc::DT_DIR,
                    FileType::Symlink => libc::DT_LNK,
                    FileType::Regular => libc::DT_REG,
                    FileType::Fifo => libc::DT_FIFO,
                    FileType::CharDevice => libc::DT_CHR,
                    FileType::BlockDevice => libc::DT_BLK,
                    FileType::Socket => libc::DT_SOCK,
                };
                (d.name, d.ino, dt)
            })
            .collect())
    }
}
