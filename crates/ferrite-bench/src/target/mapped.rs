//! Shared mappings of a target's file, through the C library's `mmap`, `msync`,
//! `mremap`, `munmap` and `fallocate` (so in the preloaded run the preload library
//! serves them: DAX on a FerriteFS mount). Fenced unsafe module: the mapping's
//! memory becomes slices only inside its bounds.
//!
//! Invariants: a [`SharedMap`] owns its range from `mmap` to drop; every store
//! and sync is bounds-checked against its current length (a programmer error
//! otherwise, asserted).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// A mapped range a workload stores into and persists: a shared mapping (msync)
/// or a FerriteFS atomic mapping (an atomic commit of its changed pages).
pub trait Region {
    /// Store `data` at `off` (plain stores).
    fn store(&mut self, off: usize, data: &[u8]);
    /// Persist `[off, off + len)` (msync, or the atomic commit).
    fn persist(&mut self, off: usize, len: usize) -> crate::target::TResult<()>;
}

/// Memory of a mapping someone else owns (an atomic mapping of the library):
/// stores bounds-checked against its length.
pub struct RawRegion {
    addr: usize,
    len: usize,
}

impl RawRegion {
    /// `len` bytes at `addr`, which the caller keeps mapped while this lives.
    pub fn new(addr: usize, len: usize) -> RawRegion {
        RawRegion { addr, len }
    }
    /// Start address.
    pub fn addr(&self) -> usize {
        self.addr
    }
    /// Length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Is it empty?
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Store `data` at `off`.
    pub fn store(&mut self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len, "store past the mapping");
        // SAFETY: inside the mapping, which the owner keeps while this lives.
        let dst =
            unsafe { std::slice::from_raw_parts_mut((self.addr + off) as *mut u8, data.len()) };
        dst.copy_from_slice(data);
    }
}

pub(crate) const PAGE: usize = 4096;

/// A shared read-write mapping of the start of a file.
pub struct SharedMap {
    raw: RawRegion,
}

fn last_err<T>() -> io::Result<T> {
    Err(io::Error::last_os_error())
}

impl SharedMap {
    /// Map the first `len` bytes of `fd` (open read-write) shared.
    pub fn new(fd: BorrowedFd<'_>, len: usize) -> io::Result<SharedMap> {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a new mapping wherever the kernel (or the preload) puts it.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return last_err();
        }
        Ok(SharedMap { raw: RawRegion::new(p as usize, len) })
    }

    /// Mapped length.
    pub fn len(&self) -> usize {
        self.raw.len
    }

    /// Is the mapping empty?
    pub fn is_empty(&self) -> bool {
        self.raw.len == 0
    }

    /// Store `data` at `off` (plain stores: memcpy).
    pub fn store(&mut self, off: usize, data: &[u8]) {
        self.raw.store(off, data)
    }

    /// msync(MS_SYNC) of `[off, off + len)` (from the start of its page).
    pub fn sync(&self, off: usize, len: usize) -> io::Result<()> {
        assert!(off + len <= self.raw.len, "sync past the mapping");
        let a = off / PAGE * PAGE;
        // SAFETY: msync of pages of the live mapping.
        let r = unsafe {
            libc::msync((self.raw.addr + a) as *mut libc::c_void, off + len - a, libc::MS_SYNC)
        };
        if r != 0 {
            return last_err();
        }
        Ok(())
    }

    /// Grow (or shrink) the mapping to `len` bytes, moving it if need be.
    pub fn resize(&mut self, len: usize) -> io::Result<()> {
        // SAFETY: the whole live mapping, which this owns; MREMAP_MAYMOVE lets the
        // kernel (or the preload) place it anew.
        let p = unsafe {
            libc::mremap(
                self.raw.addr as *mut libc::c_void,
                self.raw.len,
                len,
                libc::MREMAP_MAYMOVE,
            )
        };
        if p == libc::MAP_FAILED {
            return last_err();
        }
        self.raw = RawRegion::new(p as usize, len);
        Ok(())
    }
}

impl Region for SharedMap {
    fn store(&mut self, off: usize, data: &[u8]) {
        SharedMap::store(self, off, data)
    }
    fn persist(&mut self, off: usize, len: usize) -> crate::target::TResult<()> {
        Ok(self.sync(off, len)?)
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: the whole live mapping, not used after this.
        unsafe { libc::munmap(self.raw.addr as *mut libc::c_void, self.raw.len) };
    }
}

/// fallocate(2) mode 0 of `[off, off + len)`.
pub fn fallocate(fd: BorrowedFd<'_>, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: a plain system call on the caller's descriptor.
    let r = unsafe { libc::fallocate(fd.as_raw_fd(), 0, off as libc::off_t, len as libc::off_t) };
    if r != 0 {
        return last_err();
    }
    Ok(())
}
