//! DAX mappings of files into this process: the address-space side of `mapping`.
//! A file's range is mapped by mapping each run of its (pinned) pool blocks at its
//! place in one reserved range of addresses, straight from the pool file: stores
//! are the file's, with no kernel and no copy on the way. Persisting is cache-line
//! flushes and one fence ([`Fs::persist_mapped`]).
//!
//! Invariants:
//! - Every live mapping in the registry holds exactly one pin ([`Fs::dax_pin`]) of
//!   its file; the pin ends when the last of its pages is unmapped (or replaced by
//!   [`Fs::mremap_file`]). A mapping the program overwrote with `MAP_FIXED` outside
//!   this module keeps its pin until it is unmapped here: pins err on the side of
//!   keeping blocks.
//! - Pages past the end of file at mapping time are reserved without access
//!   (touching one is SIGSEGV; the kernel gives SIGBUS); they are never pool pages.
//! - Mappings are not inherited across fork (MADV_DONTFORK): a child's stores could
//!   outlive the parent's pin.
//! - [`Fs::revoke_file_maps`] replaces every live mapping by inaccessible memory
//!   before the process gives up its right to store to the pool (daemon gone).
//! - Atomic mappings ([`Fs::mmap_atomic`], any medium) are private memory, never
//!   pool pages: each keeps a copy of its range as last committed, and a commit
//!   ([`Fs::persist_atomic`]) writes the pages that differ from it in one
//!   operation ([`Fs::write_pages_atomic`]), then updates the copy.
#![allow(unsafe_code)]

use crate::dax::MmapMedium;
use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::layout::BLOCK;
use crate::pmem;
use std::os::unix::io::AsRawFd;

/// One DAX mapping of a file.
#[derive(Clone, Debug)]
struct FileMap {
    base: usize,
    len: usize,
    ino: u64,
    off: u64,
    prot: i32,
    /// Address ranges still mapped (the program may unmap parts).
    live: Vec<(usize, usize)>,
    /// A mapping that keeps the file's kernel handle open (see [`Fs::mmap_file`]).
    keep: Option<(usize, usize)>,
    /// The pool runs mapped (file page, block, pages), ascending and contiguous
    /// from the mapping's first page; the pages after them are inaccessible.
    runs: crate::DaxRuns,
}

impl FileMap {
    /// Drop the runs (and parts of runs) past `len`.
    fn trim_runs(&mut self) {
        let end = self.off / BLOCK + (self.len as u64).div_ceil(BLOCK);
        self.runs.retain(|&(p, _, _)| p < end);
        if let Some((p, _, n)) = self.runs.last_mut() {
            *n = (*n).min(end - *p);
        }
    }
}

/// Move each mapped run of `m` from `old` to the same place in `new` (mremap
/// with its page tables); on failure, back again.
fn move_runs(old: usize, new: usize, m: &FileMap) -> Result<()> {
    let pg0 = m.off / BLOCK;
    let part = |&(pg, _, n): &(u64, u64, u64)| {
        let at = ((pg - pg0) * BLOCK) as usize;
        (at, ((n * BLOCK) as usize).min(m.len - at))
    };
    for (k, r) in m.runs.iter().enumerate() {
        let (at, bytes) = part(r);
        let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED;
        // SAFETY: a run this registry mapped, to its place in a range this call
        // reserved.
        let p = unsafe { libc::syscall(libc::SYS_mremap, old + at, bytes, bytes, flags, new + at) };
        if p == -1 {
            let e = os_err("move a DAX mapping");
            for r in &m.runs[..k] {
                let (at, bytes) = part(r);
                // SAFETY: back to where it was (unmapped by the move).
                unsafe { libc::syscall(libc::SYS_mremap, new + at, bytes, bytes, flags, old + at) };
            }
            return Err(e);
        }
    }
    Ok(())
}

/// The DAX mappings of this process's mount of a pool.
#[derive(Default)]
pub struct FileMaps {
    maps: parking_lot::Mutex<Vec<FileMap>>,
    /// Persistent buffers mapped into the process: (address, length, buffer id).
    bufs: parking_lot::Mutex<Vec<(usize, usize, u64)>>,
}

/// The atomic mappings of this process's mount of a pool (any medium: they are
/// the process's own memory and commit through the core).
#[derive(Default)]
pub struct AtomicMaps {
    all: parking_lot::Mutex<Vec<std::sync::Arc<AtomicMap>>>,
}

/// An atomic mapping (NOVA's atomic-mmap): the process's private copy of a file
/// range, committed by [`Fs::persist_atomic`] as one atomic update of the pages
/// that changed since the last commit.
struct AtomicMap {
    base: usize,
    len: usize,
    ino: u64,
    off: u64,
    /// What a commit needs to find changed pages; its lock serializes commits.
    state: parking_lot::Mutex<AtomicState>,
}

/// How an atomic mapping finds the pages the program changed: by asking the
/// kernel which pages were stored to (`wtrack`), while that costs less than
/// comparing every page with the shadow; else by comparing.
struct AtomicState {
    /// The range as last committed (or read): what a page is compared with to
    /// know whether the program changed it (also a page the kernel reports as
    /// stored to: a store of the same bytes changes nothing).
    shadow: Vec<u8>,
    /// The kernel's write tracking of the whole mapping, while it is on.
    track: Option<crate::wtrack::Tracker>,
    /// Whether tracking may be turned on (a writable mapping, a kernel that
    /// allowed it, this process's own mapping).
    can_track: bool,
    /// Pages the last comparing commit found changed, and the pages it compared.
    last_compare: (usize, usize),
    /// Commits in the current stretch of tracking.
    tracked_commits: u32,
    /// Qualifying comparing commits still to wait before tracking is tried again,
    /// and the wait set at the next turning off (doubled each time a stretch of
    /// tracking ends early: a program that stores the bytes its pages already
    /// hold looks unchanged to the comparison, but costs a fault per page when
    /// tracked, and must not make the mapping flip between the two).
    wait: (u32, u32),
}

/// Atomic mappings of fewer pages always compare (a few microseconds at most).
const TRACK_MIN_PAGES: usize = 32;
/// A tracked commit that finds more than one page in this many of its range stored
/// to turns tracking off: each such page cost a fault of about a microsecond, and
/// comparing costs about 0.1 us a page (docs/DIRECT-ACCESS.md).
const TRACK_OFF_SHARE: usize = 16;
/// A comparing commit that found at most one page in this many changed turns
/// tracking back on for the next (hysteresis against flapping).
const TRACK_ON_SHARE: usize = 32;
/// A stretch of tracking this many commits long resets the wait before the next.
const TRACK_PAID_OFF: u32 = 16;
/// The longest wait, in qualifying comparing commits, before tracking is tried again.
const TRACK_WAIT_MAX: u32 = 1024;

fn os_err(what: &str) -> Error {
    let err = std::io::Error::last_os_error();
    Error::Io { path: what.into(), err }
}

// The address-space calls are system calls, not the C library's functions: in a
// process with the preload library those are hooks, which would come back here.

/// mmap(2) as a system call; `MAP_FAILED` on failure (errno set).
unsafe fn sys_mmap(addr: usize, len: usize, prot: i32, flags: i32, fd: i32, off: u64) -> usize {
    // SAFETY: the caller's mapping request, as mmap(2) takes it.
    let r = unsafe { libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) };
    if r == -1 {
        libc::MAP_FAILED as usize
    } else {
        r as usize
    }
}

/// munmap(2) as a system call.
unsafe fn sys_munmap(addr: usize, len: usize) -> i64 {
    // SAFETY: the caller's range, as munmap(2) takes it.
    unsafe { libc::syscall(libc::SYS_munmap, addr, len) }
}

fn page_up(n: usize) -> usize {
    n.div_ceil(BLOCK as usize) * BLOCK as usize
}

/// An inaccessible private mapping of one page of `fd`: (address, length).
fn keep_open(fd: i32) -> Result<(usize, usize)> {
    let n = BLOCK as usize;
    // SAFETY: a new mapping wherever the kernel puts it; it replaces nothing.
    let p =
        unsafe { sys_mmap(0, n, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_NORESERVE, fd, 0) };
    if p == libc::MAP_FAILED as usize {
        return Err(os_err("hold the file open for a DAX mapping"));
    }
    Ok((p, n))
}

/// Flags of a shared mapping this module serves (others go to the kernel).
pub const SERVED_FLAGS: i32 = libc::MAP_SHARED
    | libc::MAP_SHARED_VALIDATE
    | libc::MAP_FIXED
    | libc::MAP_FIXED_NOREPLACE
    | libc::MAP_POPULATE
    | libc::MAP_NONBLOCK
    | libc::MAP_SYNC
    | libc::MAP_NORESERVE;

impl FileMaps {
    /// Replace every mapping by inaccessible memory and forget it.
    pub(crate) fn revoke_all(&self) {
        for (a, n, _) in self.bufs.lock().drain(..) {
            // SAFETY: a buffer range this registry mapped and still owns.
            unsafe {
                let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
                sys_mmap(a, n, libc::PROT_NONE, anon, -1, 0)
            };
        }
        let mut maps = self.maps.lock();
        for m in maps.drain(..) {
            if let Some((a, n)) = m.keep {
                // SAFETY: the range handed to this mapping to own.
                unsafe { sys_munmap(a, n) };
            }
            for (a, b) in m.live {
                // SAFETY: a range this registry mapped and still owns.
                unsafe {
                    let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
                    sys_mmap(a, b - a, libc::PROT_NONE, anon, -1, 0)
                };
            }
        }
    }
}

impl Fs<MmapMedium> {
    /// Map `len` bytes of regular file `ino` from `off` with DAX, as `mmap(2)`
    /// with `prot` and `flags` (a shared mapping; `addr` as mmap takes it). The
    /// caller checked the open mode allows `prot`. `keep`: the file's descriptor
    /// through a mount, held open while the mapping lives as a kernel mapping
    /// would hold it (by an inaccessible private mapping of one page of it, which
    /// never reaches the page cache), so an unlinked file stays while mapped.
    #[allow(clippy::too_many_arguments)]
    pub fn mmap_file(
        &self,
        ino: u64,
        addr: usize,
        len: usize,
        prot: i32,
        flags: i32,
        off: u64,
        keep: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<usize> {
        if len == 0 || !off.is_multiple_of(BLOCK) || flags & !SERVED_FLAGS != 0 {
            return Err(Error::invalid("mmap length, offset or flags"));
        }
        if prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) != 0 {
            return Err(Error::invalid("mmap protection"));
        }
        let len = page_up(len);
        let keep = match keep {
            Some(fd) => Some(keep_open(fd.as_raw_fd())?),
            None => None,
        };
        let placed = self.dax_pin(ino, off, len as u64).and_then(|runs| {
            match self.place(addr, len, prot, flags, off, &runs) {
                Ok(b) => Ok((b, runs)),
                Err(e) => {
                    let _ = self.dax_unpin(ino);
                    Err(e)
                }
            }
        });
        let (base, runs) = match placed {
            Ok(b) => b,
            Err(e) => {
                if let Some((a, n)) = keep {
                    // SAFETY: the range made above, owned here.
                    unsafe { sys_munmap(a, n) };
                }
                return Err(e);
            }
        };
        let live = vec![(base, base + len)];
        let m = FileMap { base, len, ino, off, prot, live, keep, runs };
        self.medium().file_maps().maps.lock().push(m);
        Ok(base)
    }

    /// Reserve the addresses and map each run of blocks at its place.
    fn place(
        &self,
        addr: usize,
        len: usize,
        prot: i32,
        flags: i32,
        off: u64,
        runs: &crate::DaxRuns,
    ) -> Result<usize> {
        let fixed = flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE);
        // SAFETY: an anonymous mapping without access; with MAP_FIXED the program
        // asked for exactly this range to be replaced, as mmap(2) would.
        let base = unsafe {
            sys_mmap(
                addr,
                len,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | fixed,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED as usize {
            return Err(os_err("reserve addresses for a DAX mapping"));
        }
        if let Err(e) = self.map_runs(base, len, prot, off, runs) {
            // SAFETY: the range reserved above.
            unsafe { sys_munmap(base, len) };
            return Err(e);
        }
        // SAFETY: advice on the range reserved above.
        unsafe { libc::syscall(libc::SYS_madvise, base, len, libc::MADV_DONTFORK) };
        Ok(base)
    }

    /// Map each run of pool blocks at its place in the range `[base, base + len)`
    /// (reserved by the caller) that maps the file from `off`.
    fn map_runs(
        &self,
        base: usize,
        len: usize,
        prot: i32,
        off: u64,
        runs: &crate::DaxRuns,
    ) -> Result<()> {
        let fd = self.medium().pool_file().as_raw_fd();
        let share = if self.medium().is_dax() {
            libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC
        } else {
            libc::MAP_SHARED
        };
        let pg0 = off / BLOCK;
        for &(pg, blk, n) in runs {
            let at = base + ((pg - pg0) * BLOCK) as usize;
            let bytes = ((n * BLOCK) as usize).min(base + len - at);
            // Populated: the pool's pages are in memory already, so this only
            // builds page-table entries, and stores to new pages (appends) take
            // no fault each.
            let flags = share | libc::MAP_FIXED | libc::MAP_POPULATE;
            // SAFETY: inside the caller's reserved range; the pool range is a
            // pinned block run of the file, inside the pool.
            let p = unsafe { sys_mmap(at, bytes, prot, flags, fd, blk * BLOCK) };
            if p == libc::MAP_FAILED as usize {
                return Err(os_err("map pool blocks"));
            }
        }
        Ok(())
    }

    /// A persistent buffer of `len` bytes (whole pages) mapped into the process
    /// ([`crate::pbuf`]): pool blocks the program fills with stores, then writes
    /// into files with [`Fs::buf_write`]. Its content starts undefined.
    pub fn buf_map(&self, len: usize) -> Result<usize> {
        if len == 0 {
            return Err(Error::invalid("empty buffer"));
        }
        let len = page_up(len);
        let (id, blocks) = self.pbuf_alloc((len as u64) / BLOCK)?;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        // SAFETY: a new inaccessible range wherever the kernel puts it.
        let base = unsafe { sys_mmap(0, len, libc::PROT_NONE, anon, -1, 0) };
        if base == libc::MAP_FAILED as usize {
            let _ = self.pbuf_free(id);
            return Err(os_err("reserve addresses for a buffer"));
        }
        let pages: Vec<(usize, u64)> = blocks.iter().copied().enumerate().collect();
        if let Err(e) = self.map_buffer_pages(base, &pages) {
            // SAFETY: the range reserved above.
            unsafe { sys_munmap(base, len) };
            let _ = self.pbuf_free(id);
            return Err(e);
        }
        // SAFETY: advice on the range reserved above.
        unsafe { libc::syscall(libc::SYS_madvise, base, len, libc::MADV_DONTFORK) };
        self.medium().file_maps().bufs.lock().push((base, len, id));
        Ok(base)
    }

    /// Map buffer pages (page index, block) at their places from `base`, one
    /// mapping per run of consecutive pages in consecutive blocks.
    fn map_buffer_pages(&self, base: usize, pages: &[(usize, u64)]) -> Result<()> {
        let fd = self.medium().pool_file().as_raw_fd();
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let flags = libc::MAP_SHARED | libc::MAP_FIXED | libc::MAP_POPULATE;
        let mut k = 0;
        while k < pages.len() {
            let (p0, b0) = pages[k];
            let mut n = 1;
            while k + n < pages.len() && pages[k + n] == (p0 + n, b0 + n as u64) {
                n += 1;
            }
            let at = base + p0 * BLOCK as usize;
            // SAFETY: inside the buffer's reserved range; the blocks are the
            // buffer's (allocated, named by no log).
            let p = unsafe { sys_mmap(at, n * BLOCK as usize, rw, flags, fd, b0 * BLOCK) };
            if p == libc::MAP_FAILED as usize {
                return Err(os_err("map buffer blocks"));
            }
            k += n;
        }
        Ok(())
    }

    /// Write `len` bytes of a persistent buffer at `addr` into file `ino` at
    /// `off` ([`Fs::pbuf_write`]: whole pages adopted without a copy, one commit);
    /// the buffer's adopted pages are given fresh blocks before this returns.
    pub fn buf_write(&self, ino: u64, off: u64, addr: usize, len: usize) -> Result<usize> {
        // The buffer is checked out under the registry lock, which is then let go:
        // writes from other buffers proceed meanwhile, and the buffer cannot be
        // unmapped until its new pages are mapped (buf_unmap checks it out too).
        let (base, c) = {
            let bufs = self.medium().file_maps().bufs.lock();
            let end = addr.checked_add(len).ok_or_else(|| Error::invalid("buffer range"))?;
            let &(base, _, id) = bufs
                .iter()
                .find(|&&(b, n, _)| b <= addr && end <= b + n)
                .ok_or_else(|| Error::invalid("not inside a persistent buffer"))?;
            (base, self.pbufs.check_out(id)?)
        };
        let replaced = self.pbuf_write_out(ino, off, &c, (addr - base) as u64, len as u64)?;
        self.map_buffer_pages(base, &replaced)?;
        Ok(len)
    }

    /// Unmap and free the persistent buffer at `addr` (its start).
    pub fn buf_unmap(&self, addr: usize) -> Result<()> {
        let (base, len, c) = {
            let mut bufs = self.medium().file_maps().bufs.lock();
            let k = bufs
                .iter()
                .position(|&(b, _, _)| b == addr)
                .ok_or_else(|| Error::invalid("not the start of a persistent buffer"))?;
            // EBUSY while a write from it runs.
            let c = self.pbufs.check_out(bufs[k].2)?;
            let (base, len, _) = bufs.remove(k);
            (base, len, c)
        };
        // SAFETY: the buffer's whole range, which the registry owned (and no write
        // from it runs: checked out).
        unsafe { sys_munmap(base, len) };
        self.pbuf_free_out(&c)
    }

    /// The bytes of `[addr, addr + len)` of a persistent buffer.
    pub fn buf_bytes(&self, addr: usize, len: usize) -> Result<Vec<u8>> {
        let bufs = self.medium().file_maps().bufs.lock();
        let end = addr.checked_add(len).ok_or_else(|| Error::invalid("buffer range"))?;
        if !bufs.iter().any(|&(b, n, _)| b <= addr && end <= b + n) {
            return Err(Error::invalid("not inside a persistent buffer"));
        }
        // SAFETY: inside a live buffer mapping (the registry lock is held).
        Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec())
    }

    /// Does `[addr, addr + len)` meet a DAX mapping of this process?
    pub fn is_file_mapped(&self, addr: usize, len: usize) -> bool {
        let end = addr.saturating_add(len.max(1));
        let maps = self.medium().file_maps().maps.lock();
        maps.iter().any(|m| m.live.iter().any(|&(a, b)| a < end && addr < b))
    }

    /// `munmap(2)` of a range that meets DAX mappings (`None` when it meets none:
    /// the caller unmaps it). A mapping whose last page goes ends its pin.
    pub fn munmap_file(&self, addr: usize, len: usize) -> Option<Result<()>> {
        if !addr.is_multiple_of(BLOCK as usize) || len == 0 {
            return None; // the kernel's EINVAL
        }
        let end = addr.saturating_add(page_up(len));
        if let Some(r) = self.munmap_atomic(addr, end - addr) {
            return Some(r);
        }
        let ended: Vec<u64> = {
            let mut maps = self.medium().file_maps().maps.lock();
            if !maps.iter().any(|m| m.live.iter().any(|&(a, b)| a < end && addr < b)) {
                return None;
            }
            // SAFETY: the program unmaps a range it names, as munmap(2).
            if unsafe { sys_munmap(addr, end - addr) } != 0 {
                return Some(Err(os_err("munmap")));
            }
            let mut ended = Vec::new();
            maps.retain_mut(|m| {
                m.live = m
                    .live
                    .iter()
                    .flat_map(|&(a, b)| {
                        [(a, b.min(addr)), (a.max(end), b)].into_iter().filter(|&(x, y)| x < y)
                    })
                    .collect();
                if m.live.is_empty() {
                    ended.push(m.ino);
                    if let Some((a, n)) = m.keep.take() {
                        // SAFETY: the range handed to this mapping to own.
                        unsafe { sys_munmap(a, n) };
                    }
                }
                !m.live.is_empty()
            });
            ended
        };
        for ino in ended {
            if let Err(e) = self.dax_unpin(ino) {
                return Some(Err(e));
            }
        }
        Some(Ok(()))
    }

    /// `mremap(2)` of a whole DAX mapping at `old` (`None` when `old` starts none).
    /// Shrinking unmaps the tail in place. Growing pins and maps only the pages
    /// not mapped yet (the added range, and pages that were past the end of file
    /// when they were mapped): in place when the addresses after the mapping are
    /// free, else, with `may_move`, at a new place the mapped runs move to with
    /// their page tables (as the kernel's mremap moves a mapping).
    pub fn mremap_file(
        &self,
        old: usize,
        old_len: usize,
        new_len: usize,
        may_move: bool,
    ) -> Option<Result<usize>> {
        let m = {
            let maps = self.medium().file_maps().maps.lock();
            maps.iter().find(|m| m.base == old).cloned()?
        };
        let (old_len, new_len) = (page_up(old_len), page_up(new_len));
        if new_len == 0 || old_len != m.len || m.live != [(m.base, m.base + m.len)] {
            return Some(Err(Error::invalid("mremap of part of a DAX mapping")));
        }
        if new_len <= old_len {
            if new_len < old_len {
                if let Some(Err(e)) = self.munmap_file(old + new_len, old_len - new_len) {
                    return Some(Err(e));
                }
                let mut maps = self.medium().file_maps().maps.lock();
                if let Some(x) = maps.iter_mut().find(|x| x.base == old) {
                    x.len = new_len;
                    x.trim_runs();
                }
            }
            return Some(Ok(old));
        }
        Some(self.grow(m, new_len, may_move))
    }

    fn grow(&self, m: FileMap, new_len: usize, may_move: bool) -> Result<usize> {
        let pg0 = m.off / BLOCK;
        // Pages from `mapped` on are not pool pages yet (past EOF when mapped).
        let mapped = m.runs.last().map_or(pg0, |&(p, _, n)| p + n);
        let end = m.off + new_len as u64;
        let runs = self.dax_pin(m.ino, mapped * BLOCK, end - mapped * BLOCK)?;
        let r = self.grow_pinned(&m, new_len, may_move, &runs);
        // The mapping keeps its one pin; this one only held the new pages.
        let u = self.dax_unpin(m.ino);
        let base = r?;
        u?;
        Ok(base)
    }

    /// The address-space part of [`Fs::mremap_file`]'s growth, with the new
    /// pages pinned (`runs`).
    fn grow_pinned(
        &self,
        m: &FileMap,
        new_len: usize,
        may_move: bool,
        runs: &crate::DaxRuns,
    ) -> Result<usize> {
        let (old, old_len) = (m.base, m.len);
        let mut maps = self.medium().file_maps().maps.lock();
        let Some(x) = maps.iter_mut().find(|x| x.base == old && x.len == old_len) else {
            return Err(Error::invalid("the DAX mapping changed during mremap"));
        };
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let add = new_len - old_len;
        // SAFETY: a new inaccessible mapping right after the old one, only where
        // nothing is mapped (MAP_FIXED_NOREPLACE).
        let ext = unsafe {
            sys_mmap(old + old_len, add, libc::PROT_NONE, anon | libc::MAP_FIXED_NOREPLACE, -1, 0)
        };
        let base = if ext == old + old_len {
            old
        } else {
            if ext != libc::MAP_FAILED as usize {
                // SAFETY: a kernel without MAP_FIXED_NOREPLACE put it elsewhere.
                unsafe { sys_munmap(ext, add) };
            }
            if !may_move {
                return Err(Error::NoSpace); // ENOMEM, as the kernel: no room in place
            }
            // SAFETY: a new inaccessible range wherever the kernel puts it.
            let nb = unsafe { sys_mmap(0, new_len, libc::PROT_NONE, anon, -1, 0) };
            if nb == libc::MAP_FAILED as usize {
                return Err(os_err("reserve addresses for a DAX mapping"));
            }
            if let Err(e) = move_runs(old, nb, m) {
                // SAFETY: the new range, which this call owns.
                unsafe { sys_munmap(nb, new_len) };
                return Err(e);
            }
            // SAFETY: what is left of the old range (its inaccessible pages).
            unsafe { sys_munmap(old, old_len) };
            nb
        };
        let placed = self.map_runs(base, new_len, m.prot, m.off, runs);
        x.base = base;
        x.len = new_len;
        x.live = vec![(base, base + new_len)];
        // On failure the new pages stay inaccessible; the mapping is whole
        // otherwise.
        placed?;
        x.runs.extend_from_slice(runs);
        // SAFETY: advice on the range this mapping owns.
        unsafe { libc::syscall(libc::SYS_madvise, base, new_len, libc::MADV_DONTFORK) };
        Ok(base)
    }

    /// Make stores into `[addr, addr + len)` of DAX mappings durable: cache-line
    /// flushes and one fence (and an msync of the range when the pool needs one
    /// for durability). `None` when the range meets no DAX mapping, else whether
    /// DAX mappings cover all of it (if not, the caller syncs the rest).
    pub fn persist_mapped(&self, addr: usize, len: usize) -> Option<bool> {
        let end = addr.saturating_add(len.max(1));
        let msync = self.medium().msync_mode();
        let flush = pmem::config().flush;
        let covered = {
            // Flushes under the lock (a concurrent munmap cannot pull the pages
            // away); the fence after it. No allocation: one pass to flush, one
            // walk to see whether the parts join up.
            let maps = self.medium().file_maps().maps.lock();
            let parts = || {
                maps.iter()
                    .flat_map(|m| m.live.iter().copied())
                    .filter(|&(a, b)| a < end && addr < b)
                    .map(|(a, b)| (a.max(addr), b.min(end)))
            };
            let mut any = false;
            for (a, b) in parts() {
                any = true;
                // SAFETY: a live DAX range (mapped while the lock is held);
                // flushing lines reads and writes nothing.
                unsafe { pmem::flush_raw(a as *const u8, b - a, flush) };
                if msync {
                    sync_pages(a, b);
                }
            }
            if !any {
                return None;
            }
            let mut at = addr;
            while let Some((_, b)) = parts().find(|&(a, b)| a <= at && at < b) {
                at = b;
            }
            at >= end
        };
        pmem::sfence();
        Some(covered)
    }

    /// Replace every DAX mapping by inaccessible memory (the process may no longer
    /// store to the pool): a later access faults instead of changing blocks that
    /// may belong to others by then. Pins are dropped without a commit.
    pub fn revoke_file_maps(&self) {
        self.medium().file_maps().revoke_all();
    }

    /// Hand this process's DAX mappings of `ino` to the kernel: each live range is
    /// replaced, at the same addresses, by a shared mapping of `fd` (the file
    /// opened through the mount) at the same file offset and protection, whose
    /// pages come from the kernel's page cache (which reads the same blocks through
    /// the daemon); then their pins end. Linux lets a file shrink under its
    /// mappings and a pin does not, so a shrink by the process that holds the only
    /// pins goes this way first. Returns how many mappings were handed over; a
    /// range the kernel would not map is left inaccessible, as a revoked one, and
    /// the first such error is returned once every pin has ended.
    pub fn hand_maps_to_kernel(&self, ino: u64, fd: std::os::fd::RawFd) -> Result<usize> {
        let (taken, failed) = {
            let mut maps = self.medium().file_maps().maps.lock();
            let (mut taken, mut failed) = (0, None);
            maps.retain_mut(|m| {
                if m.ino != ino {
                    return true;
                }
                for &(a, b) in &m.live {
                    let off = m.off + (a - m.base) as u64;
                    let shared = libc::MAP_SHARED | libc::MAP_FIXED;
                    // SAFETY: a range this registry mapped and owns, replaced in place.
                    let p = unsafe { sys_mmap(a, b - a, m.prot, shared, fd, off) };
                    if p == libc::MAP_FAILED as usize {
                        failed.get_or_insert_with(|| os_err("map a DAX range through the kernel"));
                        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
                        // SAFETY: as above; nothing of the pool stays mapped there.
                        unsafe { sys_mmap(a, b - a, libc::PROT_NONE, anon, -1, 0) };
                    }
                }
                if let Some((a, n)) = m.keep.take() {
                    // SAFETY: the range handed to this mapping to own.
                    unsafe { sys_munmap(a, n) };
                }
                taken += 1;
                false
            });
            (taken, failed)
        };
        for _ in 0..taken {
            self.dax_unpin(ino)?;
        }
        failed.map_or(Ok(taken), Err)
    }

    /// The files this process has DAX mappings of: (inode, address of the one-page
    /// mapping that keeps the file open), one per file.
    pub fn mapped_files(&self) -> Vec<(u64, usize)> {
        let maps = self.medium().file_maps().maps.lock();
        let mut v: Vec<(u64, usize)> =
            maps.iter().filter_map(|m| m.keep.map(|(a, _)| (m.ino, a))).collect();
        v.sort_unstable();
        v.dedup_by_key(|(ino, _)| *ino);
        v
    }

    /// Live DAX mappings of this process.
    pub fn file_map_count(&self) -> usize {
        self.medium().file_maps().maps.lock().len()
    }
}

/// Flush `[addr, addr + len)` from the caches and fence (msync it too when `msync`).
/// The range must be mapped; this process's DAX mappings are.
pub fn persist_raw(addr: usize, len: usize, msync: bool) {
    // SAFETY: flushing lines of mapped memory reads nothing and writes nothing.
    unsafe { pmem::flush_raw(addr as *const u8, len, pmem::config().flush) };
    pmem::sfence();
    if msync {
        sync_pages(addr, addr + len);
    }
}

/// msync(MS_SYNC) of the pages of `[a, b)`.
fn sync_pages(a: usize, b: usize) {
    let a0 = a / BLOCK as usize * BLOCK as usize;
    // SAFETY: msync of mapped pages changes no memory.
    unsafe { libc::syscall(libc::SYS_msync, a0, b - a0, libc::MS_SYNC) };
}

/// The pages `[first, last)` of `m` (indexes from its start) that a commit must
/// compare with the shadow: those the kernel saw stored to, while tracking is on
/// (`Some`); all of them otherwise (`None`). Turns tracking off when it costs more
/// than comparing, or fails, and back on when the last comparison found few
/// changes; turning on happens only in a commit of the whole mapping, before its
/// comparison of every page, so a store is either compared then or reported later.
fn candidate_pages(
    m: &AtomicMap,
    st: &mut AtomicState,
    first: usize,
    last: usize,
) -> Option<Vec<usize>> {
    let pg = BLOCK as usize;
    if st.track.as_ref().is_some_and(|t| !t.owned()) {
        // A forked child: the descriptors scan the parent's memory.
        st.track = None;
        st.can_track = false;
    }
    let (changed, compared) = st.last_compare;
    // Only a commit of the whole mapping turns tracking on: the protection covers
    // every page, and a page outside the range changed before it would then never
    // be reported.
    let whole = first == 0 && last * pg == m.len;
    if st.track.is_none()
        && st.can_track
        && whole
        && compared > 0
        && changed * TRACK_ON_SHARE <= compared
    {
        if st.wait.0 > 0 {
            st.wait.0 -= 1;
            return None;
        }
        match crate::wtrack::Tracker::new(m.base, m.len) {
            Ok(t) => {
                st.track = Some(t);
                st.tracked_commits = 0;
            }
            Err(_) => st.can_track = false,
        }
        return None; // compare all once: stores before the protection
    }
    let t = st.track.as_ref()?;
    let mut written = Vec::new();
    let (a, b) = (m.base + first * pg, m.base + last * pg);
    if t.take_written(a, b, &mut written).is_err() {
        // The program remapped part of the range, or the kernel refused: compare
        // from now on.
        st.track = None;
        st.can_track = false;
        return None;
    }
    st.tracked_commits = st.tracked_commits.saturating_add(1);
    if written.len() * TRACK_OFF_SHARE > (last - first).max(TRACK_MIN_PAGES) {
        st.track = None;
        // A long stretch paid off: try again soon. A short one: wait twice as long.
        let next = if st.tracked_commits >= TRACK_PAID_OFF { 1 } else { st.wait.1 };
        st.wait = (next, (next * 2).min(TRACK_WAIT_MAX));
    }
    Some(written.into_iter().map(|p| (p - m.base) / pg).collect())
}

impl<M: crate::pmem::Medium> Fs<M> {
    /// An atomic mapping of `len` bytes of regular file `ino` from `off` (a
    /// multiple of 4096; the range inside the file's pages): the process's private
    /// copy, whose changes [`Fs::persist_atomic`] commits as one atomic update.
    /// `prot`: PROT_READ, optionally PROT_WRITE. Holds an open handle of the file
    /// while it lives.
    pub fn mmap_atomic(&self, ino: u64, len: usize, prot: i32, off: u64) -> Result<usize> {
        if len == 0 || !off.is_multiple_of(BLOCK) {
            return Err(Error::invalid("atomic mapping length or offset"));
        }
        if prot & !(libc::PROT_READ | libc::PROT_WRITE) != 0 || prot & libc::PROT_READ == 0 {
            return Err(Error::invalid("atomic mapping protection"));
        }
        let len = page_up(len);
        self.open(ino)?;
        let r = self.atomic_copy(ino, len, prot, off);
        if r.is_err() {
            let _ = self.release(ino);
        }
        r
    }

    fn atomic_copy(&self, ino: u64, len: usize, prot: i32, off: u64) -> Result<usize> {
        let a = self.getattr(ino)?;
        if a.ftype != crate::FileType::Regular {
            return Err(Error::IsDir);
        }
        if off + len as u64 > a.size.div_ceil(BLOCK) * BLOCK {
            return Err(Error::invalid("atomic mapping past the end of file"));
        }
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let anon = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a new private anonymous mapping wherever the kernel puts it.
        let base = unsafe { sys_mmap(0, len, rw, anon, -1, 0) };
        if base == libc::MAP_FAILED as usize {
            return Err(os_err("atomic mapping"));
        }
        // Small pages only: write tracking reports whole huge pages otherwise.
        // SAFETY: advice on the mapping made above; no byte changes.
        unsafe { libc::syscall(libc::SYS_madvise, base, len, libc::MADV_NOHUGEPAGE) };
        // SAFETY: the mapping made above, `len` bytes, not yet known to anyone.
        let view = unsafe { std::slice::from_raw_parts_mut(base as *mut u8, len) };
        let copied = self.read(ino, off, view).map(|_| view.to_vec());
        let shadow = match copied {
            Ok(v) => v,
            Err(e) => {
                // SAFETY: the mapping made above.
                unsafe { sys_munmap(base, len) };
                return Err(e);
            }
        };
        if prot != rw {
            // SAFETY: protection of the mapping made above.
            unsafe { libc::syscall(libc::SYS_mprotect, base, len, prot) };
        }
        // Comparing at first: tracking is turned on by a commit that found few
        // pages changed (a program that changes most pages never pays its faults).
        let can_track = prot & libc::PROT_WRITE != 0 && len / BLOCK as usize >= TRACK_MIN_PAGES;
        let state = AtomicState {
            shadow,
            can_track,
            track: None,
            last_compare: (0, 0),
            tracked_commits: 0,
            wait: (0, 1),
        };
        let m = AtomicMap { base, len, ino, off, state: parking_lot::Mutex::new(state) };
        self.atomics.all.lock().push(std::sync::Arc::new(m));
        Ok(base)
    }

    /// Commit the pages of `[addr, addr + len)` of an atomic mapping that changed
    /// since its last commit, as one atomic update (all of them or none after a
    /// crash; [`Fs::write_pages_atomic`]). `None` when the range meets no atomic
    /// mapping; EINVAL when it is not inside one.
    pub fn persist_atomic(&self, addr: usize, len: usize) -> Option<Result<()>> {
        let end = addr.saturating_add(len.max(1));
        let m = {
            let all = self.atomics.all.lock();
            let m = all.iter().find(|m| m.base < end && addr < m.base + m.len)?.clone();
            if addr < m.base || end > m.base + m.len {
                return Some(Err(Error::invalid("range not inside one atomic mapping")));
            }
            m
        };
        let mut st = m.state.lock();
        let st = &mut *st;
        let pg = BLOCK as usize;
        let (first, last) = ((addr - m.base) / pg, (end - m.base).div_ceil(pg));
        let candidates = candidate_pages(&m, st, first, last);
        // The program's pages as they are now (a store racing this commit lands in
        // this one or the next).
        let mut dirty: Vec<(u64, Vec<u8>)> = Vec::new();
        for k in candidates.unwrap_or_else(|| (first..last).collect()) {
            // SAFETY: page k of the live mapping (the registry holds it until it
            // is unmapped through `munmap_file`).
            let now = unsafe { std::slice::from_raw_parts((m.base + k * pg) as *const u8, pg) };
            if now != &st.shadow[k * pg..(k + 1) * pg] {
                dirty.push((m.off / BLOCK + k as u64, now.to_vec()));
            }
        }
        if st.track.is_none() {
            st.last_compare = (dirty.len(), last - first);
        }
        let refs: Vec<(u64, &[u8])> = dirty.iter().map(|(p, d)| (*p, &d[..])).collect();
        if let Err(e) = self.write_pages_atomic(m.ino, &refs) {
            // The scan protected these pages again, so no later scan would report
            // them: the next commit compares every page, and finds them.
            st.track = None;
            return Some(Err(e));
        }
        for (p, d) in &dirty {
            let k = (p - m.off / BLOCK) as usize;
            st.shadow[k * pg..(k + 1) * pg].copy_from_slice(d);
        }
        Some(Ok(()))
    }

    /// Is the kernel tracking the stores to the atomic mapping at `addr` (so its
    /// next commit compares only the pages stored to)? `None` when `addr` is in no
    /// atomic mapping.
    pub fn atomic_tracked(&self, addr: usize) -> Option<bool> {
        let all = self.atomics.all.lock();
        let m = all.iter().find(|m| m.base <= addr && addr < m.base + m.len)?;
        let st = m.state.lock();
        Some(st.track.as_ref().is_some_and(|t| t.owned()))
    }

    /// munmap of whole atomic mappings in `[addr, addr + len)`: `None` when it
    /// meets none; EINVAL when it would unmap part of one.
    pub fn munmap_atomic(&self, addr: usize, len: usize) -> Option<Result<()>> {
        let end = addr.saturating_add(page_up(len));
        let gone: Vec<std::sync::Arc<AtomicMap>> = {
            let mut all = self.atomics.all.lock();
            if !all.iter().any(|m| m.base < end && addr < m.base + m.len) {
                return None;
            }
            if all.iter().any(|m| {
                m.base < end && addr < m.base + m.len && (m.base < addr || m.base + m.len > end)
            }) {
                return Some(Err(Error::invalid("unmapping part of an atomic mapping")));
            }
            let (gone, keep) = all.drain(..).partition(|m| m.base < end && addr < m.base + m.len);
            *all = keep;
            gone
        };
        // SAFETY: the program unmaps a range it names, as munmap(2).
        if unsafe { sys_munmap(addr, end - addr) } != 0 {
            return Some(Err(os_err("munmap")));
        }
        for m in gone {
            if let Err(e) = self.release(m.ino) {
                return Some(Err(e));
            }
        }
        Some(Ok(()))
    }
}
