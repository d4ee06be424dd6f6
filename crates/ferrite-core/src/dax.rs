//! The real medium: a pool file mapped shared into this process.
//!
//! Invariants:
//! - The mapping lives as long as the [`MmapMedium`]; every access is bounds-checked
//!   against its length before any pointer arithmetic.
//! - MAP_SHARED_VALIDATE|MAP_SYNC is tried first (DAX: stores reach persistence
//!   domain on flush+fence); otherwise a plain MAP_SHARED mapping is used and the
//!   durability is reported honestly (see [`Durability`]).
//! - A pool is owned by one process at a time: an exclusive open-file-description
//!   lock on its byte 0 (OFD locks survive the close of other descriptors of the file,
//!   which a daemon receives from its direct-access clients; POSIX locks would not),
//!   plus a POSIX lock on byte 2 that only names the holder's pid to a second opener;
//!   a process-wide registry stops a second open inside the same process.
//! - Direct-access clients of a mount map the pool too ([`MmapMedium::attach`]): each
//!   holds a shared open-file-description lock on byte 1 for as long as it may store
//!   to the pool, and an exclusive open refuses the pool while any is held, so a new
//!   mount never runs beside clients of an earlier one.
//! - In msync-at-commit mode the range stored since the last msync is one
//!   [`DirtyRange`] under one lock, held across the msync: a range noted while
//!   another thread's fence takes it is either in that msync or in the next, and a
//!   fence returns only after every msync that took its stores has finished.
//! - New pool files are created with mode 0600: whoever can open the pool file can
//!   read and write every file in it (it is the access control of direct access).
#![allow(unsafe_code)]

use crate::error::{Error, Result};
use crate::pmem::{self, config, Durability, FlushInstr, Medium, PersistStats};
use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// How to open a pool file.
#[derive(Clone, Debug, Default)]
pub struct MapOptions {
    /// msync the dirty range at every fence (full durability on non-DAX files).
    pub msync_each_commit: bool,
    /// Refuse to run without MAP_SYNC.
    pub require_dax: bool,
    /// Map read-only (no stores allowed; used by `info` and `fsck` without repair).
    pub read_only: bool,
}

fn registry() -> &'static Mutex<HashSet<(u64, u64)>> {
    static R: OnceLock<Mutex<HashSet<(u64, u64)>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashSet::new()))
}

/// A pool file mapped into memory.
pub struct MmapMedium {
    ptr: *mut u8,
    len: u64,
    file: File,
    path: PathBuf,
    key: (u64, u64),
    durability: Durability,
    flush: FlushInstr,
    read_only: bool,
    dirty: DirtyRange,
    stats: Arc<PersistStats>,
    maps: crate::filemap::FileMaps,
}

/// The pool range stored since the last msync (msync-at-commit mode).
///
/// Regression note: it was two atomics (`fetch_min` / `fetch_max`, and two swaps in
/// the fence); a store noted between the fence's two swaps kept its low end but
/// lost its high end, so neither that msync nor the next covered it, and a write
/// returned as durable might not be. One lock now covers the pair and the msync.
#[derive(Default)]
pub struct DirtyRange {
    range: parking_lot::Mutex<Option<(u64, u64)>>,
}

impl DirtyRange {
    /// Bytes `[off, off + len)` were stored.
    pub fn note(&self, off: u64, len: u64) {
        let mut r = self.range.lock();
        *r = Some(match *r {
            Some((lo, hi)) => (lo.min(off), hi.max(off + len)),
            None => (off, off + len),
        });
    }

    /// Take the range and run `sync` on it with the lock held (so a concurrent
    /// caller returns only after this sync finished).
    pub fn sync(&self, sync: impl FnOnce(u64, u64)) {
        let mut r = self.range.lock();
        if let Some((lo, hi)) = r.take() {
            sync(lo, hi);
        }
    }
}

// SAFETY: the mapping is plain shared memory; the core's locking guarantees that
// concurrent accesses touch disjoint ranges (see the Medium contract).
unsafe impl Send for MmapMedium {}
// SAFETY: as above; all interior mutation goes through raw pointer writes on
// disjoint ranges and atomics.
unsafe impl Sync for MmapMedium {}

/// Byte of the pool file the owning process locks exclusively.
const OWNER_BYTE: i64 = 0;
/// Byte of the pool file direct-access clients lock shared.
const CLIENT_BYTE: i64 = 1;
/// Byte of the pool file the owner also locks with a POSIX lock, for its pid.
const PID_BYTE: i64 = 2;

fn flock_on(ty: i32, byte: i64) -> libc::flock {
    // SAFETY: flock is a plain C struct; zeroed is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = ty as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = byte;
    fl.l_len = 1;
    fl
}

/// Is a direct-access client of some mount still attached to this pool file?
fn clients_attached(file: &File) -> bool {
    let mut fl = flock_on(libc::F_WRLCK, CLIENT_BYTE);
    // SAFETY: valid fd and a valid pointer to a flock struct.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) };
    r == 0 && fl.l_type != libc::F_UNLCK as i16
}

fn holder_of(file: &File) -> Option<String> {
    let mut fl = flock_on(libc::F_WRLCK, PID_BYTE);
    // SAFETY: valid fd and a valid pointer to a flock struct.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETLK, &mut fl) };
    if r != 0 || fl.l_type == libc::F_UNLCK as i16 || fl.l_pid <= 0 {
        return None;
    }
    let pid = fl.l_pid;
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    Some(format!("pid {pid} ({comm})"))
}

fn lock_file(file: &File, exclusive: bool) -> std::io::Result<bool> {
    let fl = flock_on(if exclusive { libc::F_WRLCK } else { libc::F_RDLCK }, OWNER_BYTE);
    // SAFETY: valid fd, valid pointer.
    let r = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    if r == 0 {
        if exclusive {
            // Best effort: only tells a second opener who holds the pool.
            let id = flock_on(libc::F_WRLCK, PID_BYTE);
            // SAFETY: valid fd, valid pointer.
            unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLK, &id) };
        }
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EACCES) | Some(libc::EAGAIN) => Ok(false),
        _ => Err(e),
    }
}

impl MmapMedium {
    /// Create (or truncate to) a pool file of `len` bytes and map it.
    pub fn create(path: &Path, len: u64, opts: &MapOptions) -> Result<Self> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let me = Self::lock_and_register(file, path, false)?;
        me.file().set_len(0).map_err(|e| Error::io(path, e))?;
        me.file().set_len(len).map_err(|e| Error::io(path, e))?;
        let m = me.map(len, opts)?;
        m.back().map_err(|e| Error::io(path, e))?;
        Ok(m)
    }

    /// Allocate the backing pages of a new pool file (tmpfs, regular files), so
    /// that stores never hit ENOSPC/SIGBUS from the backing file system later and
    /// first-touch page faults stay cheap. Devices and file systems without
    /// fallocate skip this.
    ///
    /// On a page-cache file whose kernel can collapse file pages (tmpfs, Linux 6.1
    /// and later), each whole 2 MiB of the pool is allocated as one huge page, as a
    /// DAX device maps persistent memory, unless `FERRITE_HUGE=0`: the mapping is
    /// 2 MiB aligned (see [`mmap_aligned`]), so the pool's random blocks cost a
    /// TLB miss per 2 MiB, not per 4 KiB. The first failure to collapse (an older
    /// kernel, a file system without it, no free huge page) ends the attempt, and
    /// the rest is allocated in small pages.
    fn back(&self) -> std::io::Result<()> {
        let fd = self.file.as_raw_fd();
        let fallocate = |off: u64, len: u64| {
            // SAFETY: plain syscall on a descriptor we own.
            let r = unsafe { libc::posix_fallocate(fd, off as libc::off_t, len as libc::off_t) };
            match r {
                0 => Ok(true),
                libc::EOPNOTSUPP | libc::EINVAL | libc::ENODEV => Ok(false),
                r => Err(std::io::Error::from_raw_os_error(r)),
            }
        };
        let mut off = 0u64;
        if self.durability != Durability::Dax && huge_pages_wanted() && !self.read_only {
            while off.is_multiple_of(HUGE) && off + HUGE <= self.len {
                // A collapse needs one page of the range in the page cache.
                if !fallocate(off, 4096)? || !self.collapse(off) {
                    break;
                }
                off += HUGE;
            }
        }
        if off < self.len {
            fallocate(off, self.len - off)?;
        }
        Ok(())
    }

    /// Make the pool's 2 MiB at `off` one huge page (MADV_COLLAPSE): true if it is.
    fn collapse(&self, off: u64) -> bool {
        assert!(off.is_multiple_of(HUGE) && off + HUGE <= self.len);
        // SAFETY: [off, off + HUGE) lies within our mapping and is 2 MiB aligned;
        // the advice moves the range's bytes into a huge page without changing
        // them (pages not yet allocated read as zero, as before).
        let r = unsafe {
            libc::madvise(
                self.ptr.add(off as usize) as *mut libc::c_void,
                HUGE as usize,
                libc::MADV_COLLAPSE,
            )
        };
        r == 0
    }

    /// Bytes of the pool mapped with 2 MiB pages in this process (`ShmemPmdMapped`
    /// and `FilePmdMapped` of its mapping in /proc/self/smaps; 0 if unknown).
    pub fn huge_mapped(&self) -> u64 {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return 0 };
        let start = format!("{:x}-", self.ptr as usize);
        let (mut inside, mut total) = (false, 0);
        for line in smaps.lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            if !first.ends_with(':') {
                // A mapping's first line: its address range, then more.
                inside = first.starts_with(&start);
            } else if inside && (first == "ShmemPmdMapped:" || first == "FilePmdMapped:") {
                let kb = line.split_whitespace().nth(1).and_then(|v| v.parse::<u64>().ok());
                total += kb.unwrap_or(0) << 10;
            }
        }
        total
    }

    /// Open and map an existing pool file.
    pub fn open(path: &Path, opts: &MapOptions) -> Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(!opts.read_only)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        let me = Self::lock_and_register(file, path, opts.read_only)?;
        let len = me.file().metadata().map_err(|e| Error::io(path, e))?.len();
        me.map(len, opts)
    }

    fn lock_and_register(file: File, path: &Path, shared: bool) -> Result<Unmapped> {
        let md = file.metadata().map_err(|e| Error::io(path, e))?;
        if !md.is_file() && !is_block_dev(&md) && !is_char_dev(&md) {
            return Err(Error::Invalid(format!("{} is not a file", path.display())));
        }
        let key = (md.dev(), md.ino());
        {
            let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
            if !reg.insert(key) {
                return Err(Error::PoolInUse {
                    path: path.to_path_buf(),
                    holder: format!("this process (pid {})", std::process::id()),
                });
            }
        }
        let unmapped = Unmapped { file: Some(file), path: path.to_path_buf(), key };
        // A holder that just closed the pool may still hold the lock for a moment
        // through a child of any of its threads that forked and has not yet exec'ed
        // (the child's copy of the descriptor keeps the open file description and
        // its lock until exec closes it): look again for a short while before
        // calling the pool in use.
        let t0 = std::time::Instant::now();
        let mut locked = lock_file(unmapped.file(), !shared);
        while matches!(locked, Ok(false))
            && holder_of(unmapped.file()).is_none()
            && t0.elapsed() < std::time::Duration::from_millis(200)
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
            locked = lock_file(unmapped.file(), !shared);
        }
        match locked {
            Ok(true) if !shared => {
                // Clients of an earlier mount go when they notice its daemon is gone.
                let t0 = std::time::Instant::now();
                while clients_attached(unmapped.file()) {
                    if t0.elapsed() > std::time::Duration::from_secs(5) {
                        return Err(Error::PoolInUse {
                            path: path.to_path_buf(),
                            holder: "direct-access clients of an earlier mount (processes \
                                     started with `ferrite run` that are still running)"
                                .into(),
                        });
                    }
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Ok(unmapped)
            }
            Ok(true) => Ok(unmapped),
            Ok(false) => Err(Error::PoolInUse {
                path: path.to_path_buf(),
                holder: holder_of(unmapped.file()).unwrap_or_else(|| "another process".into()),
            }),
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// Map the pool of a running mount as its direct-access client: no ownership
    /// lock (the daemon has it) but the shared client lock on byte 1, held until
    /// [`MmapMedium::release_client_lock`] or the last close of this description.
    /// The error keeps the kind of the open's failure (permission denied tells that
    /// this process may not have direct access).
    pub fn attach(path: &Path, opts: &MapOptions) -> std::result::Result<Self, std::io::Error> {
        use std::os::unix::fs::OpenOptionsExt;
        let file =
            OpenOptions::new().read(true).write(true).custom_flags(libc::O_CLOEXEC).open(path)?;
        let md = file.metadata()?;
        if !md.is_file() && !is_block_dev(&md) && !is_char_dev(&md) {
            return Err(std::io::Error::other(format!("{} is not a file", path.display())));
        }
        let fl = flock_on(libc::F_RDLCK, CLIENT_BYTE);
        // SAFETY: valid fd, valid pointer.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let unmapped = Unmapped { file: Some(file), path: path.to_path_buf(), key: (0, 0) };
        unmapped.map(md.len(), opts).map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// Drop the client lock taken by [`MmapMedium::attach`] (the mount this client
    /// used is gone and it stores nothing more), so the pool can be mounted again.
    pub fn release_client_lock(&self) {
        let fl = flock_on(libc::F_UNLCK, CLIENT_BYTE);
        // SAFETY: valid fd, valid pointer.
        unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_OFD_SETLK, &fl) };
    }

    /// The pool file (DAX mappings of files map it).
    pub fn pool_file(&self) -> &File {
        &self.file
    }

    /// This process's DAX mappings of files of the pool (`filemap`).
    pub(crate) fn file_maps(&self) -> &crate::filemap::FileMaps {
        &self.maps
    }

    /// Durability needs an msync after stores (the pool is a plain shared mapping
    /// in msync-at-commit mode).
    pub fn msync_mode(&self) -> bool {
        self.durability == Durability::MsyncEachCommit
    }

    /// The pool's mapping is MAP_SYNC (a DAX file): mappings of it may be too.
    pub fn is_dax(&self) -> bool {
        self.durability == Durability::Dax
    }

    /// Prefer memory node `node` for the pool's pages `[off, off + len)` and move
    /// the ones already there (mbind with MPOL_PREFERRED and MPOL_MF_MOVE): the
    /// NUMA striping of a page-cache pool (a DAX device's memory stays where it
    /// is). `off` and `len` are page aligned.
    pub fn bind_node(&self, off: u64, len: u64, node: u32) -> std::io::Result<()> {
        assert!(off.is_multiple_of(4096) && len.is_multiple_of(4096) && off + len <= self.len);
        if node >= 64 {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mask: u64 = 1 << node;
        const MPOL_PREFERRED: libc::c_long = 1;
        const MPOL_MF_MOVE: libc::c_long = 1 << 1;
        // SAFETY: mbind of a range inside this mapping changes where its pages
        // live, not what they hold; the node mask is a live u64 of 64 bits.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                self.ptr.add(off as usize),
                len as usize,
                MPOL_PREFERRED,
                &mask as *const u64,
                64usize,
                MPOL_MF_MOVE,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// The pool file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Take the POSIX lock that names this process as the pool's holder again: the
    /// kernel drops it when the process closes any descriptor of the pool file (a
    /// daemon closes the ones its clients send). Exclusion does not depend on it.
    pub fn renew_holder_lock(&self) {
        if !self.read_only && self.key != (0, 0) {
            let id = flock_on(libc::F_WRLCK, PID_BYTE);
            // SAFETY: valid fd, valid pointer.
            unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_SETLK, &id) };
        }
    }

    /// The pool file's descriptor (sent to a daemon as proof of access).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.file.as_raw_fd()
    }

    /// Move the pool file's descriptor to the lowest free number at or above `min`
    /// (close-on-exec). A direct-access client keeps its descriptors out of the
    /// low numbers a program names itself (`exec 3>file` in a shell).
    pub fn raise_fd(&mut self, min: i32) -> std::io::Result<()> {
        use std::os::fd::FromRawFd;
        // SAFETY: fcntl on a descriptor this medium owns; a new descriptor is
        // returned or -1.
        let fd = unsafe { libc::fcntl(self.file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, min) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just made and is owned by nothing else; the old File
        // (closed when replaced) names the same open file.
        self.file = unsafe { File::from_raw_fd(fd) };
        Ok(())
    }

    /// Identity of the pool file: (device, inode).
    pub fn file_id(&self) -> std::io::Result<(u64, u64)> {
        let md = self.file.metadata()?;
        Ok((md.dev(), md.ino()))
    }

    /// Persistence counters of this mapping. Flushed and non-temporal bytes of a
    /// thread are added at its next fence on this mapping (every operation of the
    /// file system ends with one) and when the thread exits.
    pub fn stats(&self) -> &Arc<PersistStats> {
        &self.stats
    }

    #[inline]
    fn check(&self, off: u64, len: u64) {
        assert!(
            off.checked_add(len).is_some_and(|e| e <= self.len),
            "pool access out of bounds: {off}+{len} > {}",
            self.len
        );
    }

    /// The address of the 8-byte word at `off`, for an atomic store: the pool is
    /// writable, and the word aligned and in bounds.
    #[inline]
    fn store_word(&self, off: u64) -> *mut u8 {
        assert!(!self.read_only, "store to a read-only pool");
        self.check(off, 8);
        assert_eq!(off % 8, 0, "unaligned atomic store");
        // SAFETY: in bounds (checked above), so the offset stays in our mapping.
        unsafe { self.ptr.add(off as usize) }
    }

    #[inline]
    fn note_dirty(&self, off: u64, len: u64) {
        if self.durability == Durability::MsyncEachCommit {
            self.dirty.note(off, len);
        }
    }
}

fn is_block_dev(md: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    md.file_type().is_block_device()
}

fn is_char_dev(md: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    md.file_type().is_char_device()
}

/// 2 MiB: the page size of a PMD mapping on x86-64 (and of arm64 with 4 KiB pages).
const HUGE: u64 = 2 << 20;

/// Is a new pool to be backed by huge pages where the kernel allows (`FERRITE_HUGE`,
/// default on; `0` turns it off, for comparisons)? Asked at each pool creation.
fn huge_pages_wanted() -> bool {
    !matches!(std::env::var("FERRITE_HUGE").as_deref(), Ok("0"))
}

/// mmap `len` bytes of `fd` from offset 0 at a 2 MiB-aligned address, so that the
/// kernel can map whole huge pages of the file (page-cache huge pages, or a DAX
/// device's 2 MiB extents) with one page-table entry each.
fn mmap_aligned(
    len: usize,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: libc::c_int,
) -> std::io::Result<*mut libc::c_void> {
    let huge = HUGE as usize;
    let span = len.saturating_add(huge);
    // SAFETY: an anonymous reservation with no access, placed by the kernel; a
    // failure returns MAP_FAILED, which is checked.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            span,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let base = r as usize;
    let at = base.next_multiple_of(huge);
    // SAFETY: [at, at + len) lies inside the reservation just made, which nothing
    // else uses; MAP_FIXED replaces that part of it with the file.
    let p =
        unsafe { libc::mmap(at as *mut libc::c_void, len, prot, flags | libc::MAP_FIXED, fd, 0) };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        // SAFETY: the whole reservation is ours (a failed MAP_FIXED may have
        // removed part of it, which munmap accepts).
        unsafe { libc::munmap(r, span) };
        return Err(e);
    }
    // The reservation's unused head and tail go back.
    // SAFETY: both ranges are parts of our reservation outside the file mapping.
    unsafe {
        if at > base {
            libc::munmap(r, at - base);
        }
        let end = at + len.next_multiple_of(4096);
        if base + span > end {
            libc::munmap(end as *mut libc::c_void, base + span - end);
        }
    }
    Ok(p)
}

struct Unmapped {
    file: Option<File>,
    path: PathBuf,
    key: (u64, u64),
}

impl Drop for Unmapped {
    fn drop(&mut self) {
        if self.key != (0, 0) {
            let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
            reg.remove(&self.key);
        }
    }
}

impl Unmapped {
    fn file(&self) -> &File {
        self.file.as_ref().expect("file present until mapped")
    }

    fn map(mut self, len: u64, opts: &MapOptions) -> Result<MmapMedium> {
        if len == 0 || len > isize::MAX as u64 {
            return Err(Error::Corrupt(format!("pool file has unusable length {len}")));
        }
        let fd = self.file().as_raw_fd();
        let prot =
            if opts.read_only { libc::PROT_READ } else { libc::PROT_READ | libc::PROT_WRITE };
        let mut durability = Durability::Dax;
        let dax = mmap_aligned(len as usize, prot, libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC, fd);
        let p = match dax {
            Ok(p) if !opts.read_only => p,
            _ => {
                if let Ok(p) = dax {
                    // SAFETY: p/len came from the successful mmap above.
                    unsafe { libc::munmap(p, len as usize) };
                }
                if opts.require_dax && !opts.read_only {
                    return Err(Error::Invalid(format!(
                        "{} does not support MAP_SYNC (not a DAX file)",
                        self.path.display()
                    )));
                }
                durability = if opts.msync_each_commit {
                    Durability::MsyncEachCommit
                } else {
                    Durability::ProcessCrashOnly
                };
                mmap_aligned(len as usize, prot, libc::MAP_SHARED, fd)
                    .map_err(|e| Error::io(&self.path, e))?
            }
        };
        let key = std::mem::take(&mut self.key);
        let file = self.file.take().expect("file present until mapped");
        Ok(MmapMedium {
            ptr: p as *mut u8,
            len,
            file,
            path: self.path.clone(),
            key,
            durability,
            flush: config().flush,
            read_only: opts.read_only,
            dirty: DirtyRange::default(),
            stats: Arc::new(PersistStats::default()),
            maps: Default::default(),
        })
    }
}

impl Drop for MmapMedium {
    fn drop(&mut self) {
        // Mappings of files must not outlive the pins this mount held for them.
        self.maps.revoke_all();
        // SAFETY: ptr/len describe our live mapping; nothing uses it after drop.
        unsafe {
            libc::msync(self.ptr as *mut libc::c_void, self.len as usize, libc::MS_ASYNC);
            libc::munmap(self.ptr as *mut libc::c_void, self.len as usize);
        }
        let mut reg = registry().lock().unwrap_or_else(|p| p.into_inner());
        reg.remove(&self.key);
        let _ = &self.file;
    }
}

/// This thread's flushed and non-temporal byte counts not yet added to a medium's
/// shared counters. A locked read-modify-write (`fetch_add`) issued right after clwb
/// or non-temporal stores waits for them to complete, like a fence; counting every
/// flush that way serialised each write-back. The store path therefore only adds to
/// this thread-local tally, which is folded into the shared counters at the thread's
/// next fence on the same medium, when it moves to another medium, and when the
/// thread exits.
struct Tally {
    /// The medium's counters this tally belongs to (`Arc::as_ptr` of `stats`), or
    /// null: compared on every store, so it is a plain word.
    of: Cell<*const PersistStats>,
    stats: RefCell<Option<Arc<PersistStats>>>,
    flushed: Cell<u64>,
    nt: Cell<u64>,
}

impl Tally {
    fn fold(&self) {
        let (f, n) = (self.flushed.replace(0), self.nt.replace(0));
        if let Some(s) = &*self.stats.borrow() {
            if f > 0 {
                s.flushed_bytes.fetch_add(f, Ordering::Relaxed);
            }
            if n > 0 {
                s.nt_bytes.fetch_add(n, Ordering::Relaxed);
            }
        }
    }

    /// Fold what was counted for another medium, then count for `stats`.
    #[cold]
    fn switch(&self, stats: &Arc<PersistStats>) {
        self.fold();
        self.of.set(Arc::as_ptr(stats));
        *self.stats.borrow_mut() = Some(stats.clone());
    }
}

impl Drop for Tally {
    fn drop(&mut self) {
        self.fold();
    }
}

thread_local! {
    static TALLY: Tally = const {
        Tally {
            of: Cell::new(std::ptr::null()),
            stats: RefCell::new(None),
            flushed: Cell::new(0),
            nt: Cell::new(0),
        }
    };
}

fn tally(stats: &Arc<PersistStats>, flushed: u64, nt: u64) {
    let r = TALLY.try_with(|t| {
        if t.of.get() != Arc::as_ptr(stats) {
            t.switch(stats);
        }
        t.flushed.set(t.flushed.get() + flushed);
        t.nt.set(t.nt.get() + nt);
    });
    if r.is_err() {
        // Thread-local storage is being torn down: count directly.
        stats.flushed_bytes.fetch_add(flushed, Ordering::Relaxed);
        stats.nt_bytes.fetch_add(nt, Ordering::Relaxed);
    }
}

fn fold_tally(stats: &Arc<PersistStats>) {
    let _ = TALLY.try_with(|t| {
        if t.of.get() == Arc::as_ptr(stats) {
            t.fold();
        }
    });
}

impl Medium for MmapMedium {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, dst: &mut [u8]) {
        self.check(off, dst.len() as u64);
        // SAFETY: bounds checked; the source range is inside our mapping and the
        // core guarantees no concurrent writer of this range.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.add(off as usize), dst.as_mut_ptr(), dst.len())
        };
    }

    fn load_u64(&self, off: u64) -> u64 {
        self.check(off, 8);
        assert_eq!(off % 8, 0, "unaligned atomic load");
        // SAFETY: aligned, in bounds; AtomicU64 has the layout of u64.
        let a = unsafe { &*(self.ptr.add(off as usize) as *const AtomicU64) };
        u64::from_le(a.load(Ordering::Acquire))
    }

    fn write(&self, off: u64, src: &[u8]) {
        assert!(!self.read_only, "store to a read-only pool");
        self.check(off, src.len() as u64);
        // SAFETY: bounds checked; ranges written concurrently are disjoint.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(off as usize), src.len())
        };
    }

    fn write_nt(&self, off: u64, src: &[u8]) {
        assert!(!self.read_only, "store to a read-only pool");
        self.check(off, src.len() as u64);
        let cfg = config();
        // SAFETY: bounds checked; destination is our writable mapping.
        unsafe {
            if cfg.nt_stores {
                pmem::copy_nt_raw(self.ptr.add(off as usize), src, self.flush);
            } else {
                let d = self.ptr.add(off as usize);
                std::ptr::copy_nonoverlapping(src.as_ptr(), d, src.len());
                pmem::flush_raw(d, src.len(), self.flush);
            }
        }
        tally(&self.stats, 0, src.len() as u64);
        self.note_dirty(off, src.len() as u64);
    }

    fn write_nt_crc(&self, off: u64, src: &[u8]) -> u32 {
        let cfg = config();
        if !cfg.nt_stores {
            self.write_nt(off, src);
            return pmem::crc32c_page(src);
        }
        assert!(!self.read_only, "store to a read-only pool");
        self.check(off, src.len() as u64);
        // SAFETY: bounds checked; destination is our writable mapping, apart from `src`.
        let crc = unsafe { pmem::copy_nt_crc_raw(self.ptr.add(off as usize), src, self.flush) };
        tally(&self.stats, 0, src.len() as u64);
        self.note_dirty(off, src.len() as u64);
        crc
    }

    fn zero_nt(&self, off: u64, len: u64) {
        assert!(!self.read_only, "store to a read-only pool");
        self.check(off, len);
        // SAFETY: bounds checked.
        unsafe { pmem::zero_nt_raw(self.ptr.add(off as usize), len as usize, self.flush) };
        tally(&self.stats, 0, len);
        self.note_dirty(off, len);
    }

    #[inline]
    fn store_u64(&self, off: u64, val: u64) {
        // SAFETY: aligned and in bounds (`store_word`); AtomicU64 has u64's layout.
        let a = unsafe { &*(self.store_word(off) as *const AtomicU64) };
        a.store(val.to_le(), Ordering::Release);
    }

    fn store_u64_nt(&self, off: u64, val: u64) {
        if !config().nt_stores {
            self.store_u64(off, val);
            self.flush(off, 8);
            return;
        }
        // SAFETY: aligned and in bounds of our writable mapping (`store_word`).
        unsafe { pmem::store_u64_nt_raw(self.store_word(off), val) };
        tally(&self.stats, 0, 8);
        self.note_dirty(off, 8);
    }

    fn flush(&self, off: u64, len: u64) {
        self.check(off, len);
        // SAFETY: bounds checked.
        unsafe { pmem::flush_raw(self.ptr.add(off as usize), len as usize, self.flush) };
        let (s, e) = pmem::line_span(off, len);
        tally(&self.stats, e - s, 0);
        self.note_dirty(off, len);
    }

    fn populate(&self, off: u64, len: u64) {
        const PAGE: u64 = 4096;
        let s = off / PAGE * PAGE;
        let e = (off + len).min(self.len).next_multiple_of(PAGE).min(self.len);
        if self.read_only || s >= e {
            return;
        }
        // SAFETY: [s, e) lies within our mapping and `s` is page aligned; the advice
        // only fills page tables (no byte changes). Kernels before 5.14 answer
        // EINVAL, and the pages then fault in one by one, as without it.
        unsafe {
            libc::madvise(
                self.ptr.add(s as usize) as *mut libc::c_void,
                (e - s) as usize,
                libc::MADV_POPULATE_WRITE,
            )
        };
    }

    fn prefetch(&self, off: u64) {
        if off < self.len {
            // SAFETY: `off` is inside our mapping; a prefetch only hints the cache.
            pmem::prefetch_dram(unsafe { self.ptr.add(off as usize) });
        }
    }

    fn fence(&self) {
        pmem::sfence();
        self.stats.fences.fetch_add(1, Ordering::Relaxed);
        fold_tally(&self.stats);
        if self.durability == Durability::MsyncEachCommit {
            self.dirty.sync(|lo, hi| {
                let page = 4096;
                let s = lo / page * page;
                let e = hi.min(self.len);
                if s < e {
                    // SAFETY: [s, e) lies within our mapping and s is page aligned.
                    unsafe {
                        libc::msync(
                            self.ptr.add(s as usize) as *mut libc::c_void,
                            (e - s) as usize,
                            libc::MS_SYNC,
                        )
                    };
                }
            });
        }
    }

    fn durability(&self) -> Durability {
        self.durability
    }
}

#[cfg(test)]
mod tests {
    use super::DirtyRange;
    use std::sync::Arc;

    /// Regression: with the range kept in two atomics, a range noted between the
    /// fence's two swaps was msynced by neither that fence nor the next one.
    /// Every thread notes a range, then syncs, and must find its range inside a
    /// sync that finished before its own `sync` returned.
    #[test]
    fn a_noted_range_is_synced_before_the_noting_threads_sync_returns() {
        let d = Arc::new(DirtyRange::default());
        let synced = Arc::new(parking_lot::Mutex::new(Vec::<(u64, u64)>::new()));
        let start = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let (d, synced, start) = (d.clone(), synced.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for k in 0..20_000u64 {
                        let off = t * (1 << 40) + k * 64;
                        let from = synced.lock().len();
                        d.note(off, 64);
                        d.sync(|lo, hi| {
                            // An msync takes a while: let other threads note and sync.
                            std::thread::yield_now();
                            synced.lock().push((lo, hi));
                        });
                        let s = synced.lock();
                        assert!(
                            s[from..].iter().any(|&(lo, hi)| lo <= off && off + 64 <= hi),
                            "thread {t}: range at {off} was never synced"
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }
}

#[cfg(test)]
mod huge_tests {
    use super::*;

    /// A new pool is mapped 2 MiB aligned, reads as zeros, has every byte allocated
    /// (no ENOSPC or SIGBUS on a later store), and whatever part of it the kernel
    /// put in huge pages is whole 2 MiB pages; its tail past the last whole 2 MiB
    /// is allocated too.
    #[test]
    fn a_new_pool_is_aligned_allocated_and_zero() {
        // tmpfs where there is one: the pages the kernel may collapse.
        let dir = Path::new("/dev/shm");
        let dir = if dir.is_dir() { dir.to_path_buf() } else { std::env::temp_dir() };
        let path = dir.join(format!("ferrite-huge-{}.pool", std::process::id()));
        let len = 3 * HUGE + 12 * 4096;
        let m = MmapMedium::create(&path, len, &MapOptions::default()).expect("create");
        assert!((m.ptr as usize).is_multiple_of(HUGE as usize), "mapping at {:p}", m.ptr);
        let md = std::fs::metadata(&path).expect("metadata");
        assert!(md.blocks() * 512 >= len, "{} of {len} bytes allocated", md.blocks() * 512);
        let mut buf = vec![1u8; len as usize];
        m.read(0, &mut buf);
        assert!(buf.iter().all(|&b| b == 0), "a new pool reads as zeros");
        m.write(len - 8, &[7; 8]);
        m.write(HUGE - 4, &[9; 8]);
        let mut b = [0u8; 8];
        m.read(HUGE - 4, &mut b);
        assert_eq!(b, [9; 8]);
        let huge = m.huge_mapped();
        assert!(huge.is_multiple_of(HUGE) && huge <= 3 * HUGE, "{huge} bytes in huge pages");
        drop(m);
        // Mapped again: the same bytes, at an aligned address.
        let m = MmapMedium::open(&path, &MapOptions::default()).expect("open");
        assert!((m.ptr as usize).is_multiple_of(HUGE as usize));
        m.read(len - 8, &mut b);
        assert_eq!(b, [7; 8]);
        drop(m);
        std::fs::remove_file(&path).expect("remove");
    }
}
