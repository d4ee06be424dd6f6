//! The coordination table's memory: a memfd the daemon creates and maps, and sends
//! to each client, which maps it too. One of the two fenced unsafe modules of this
//! crate (the other is `alive`).
//!
//! Invariants:
//! - A mapping lives exactly as long as its [`ShmRegion`]; the slices handed out
//!   borrow the region, so no reference outlives the mapping.
//! - The word area comes first (4-byte aligned by construction: a mapping is page
//!   aligned), the owner bytes follow it; both lie inside the mapping (checked
//!   against the memfd's size before any slice is made).
//! - The memory is only ever accessed through atomics: other processes store to it
//!   concurrently.
#![allow(unsafe_code)]

use ferrite_core::share::{Region, Table};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU8};

/// A mapped coordination table region.
pub struct ShmRegion {
    ptr: *mut u8,
    len: usize,
    words: usize,
    owners: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics.
unsafe impl Send for ShmRegion {}
// SAFETY: as above.
unsafe impl Sync for ShmRegion {}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        // SAFETY: ptr/len came from a successful mmap; nothing borrows the region
        // any more (slices borrow `self`).
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

// SAFETY: the slices are the fixed parts of one mapping that lives as long as the
// region (see the module invariants).
unsafe impl Region for ShmRegion {
    fn words(&self) -> &[AtomicU32] {
        // SAFETY: `words` u32 slots fit in the mapping (checked in `map`), the
        // mapping is page aligned, and AtomicU32 has the layout of u32.
        unsafe { std::slice::from_raw_parts(self.ptr as *const AtomicU32, self.words) }
    }
    fn owners(&self) -> &[AtomicU8] {
        // SAFETY: the owner bytes follow the word area inside the mapping (checked).
        unsafe {
            std::slice::from_raw_parts(self.ptr.add(self.words * 4) as *const AtomicU8, self.owners)
        }
    }
}

/// Take ownership of a descriptor the kernel just gave this process (accept,
/// SCM_RIGHTS).
pub(crate) fn own_fd(fd: std::os::fd::RawFd) -> OwnedFd {
    assert!(fd >= 0, "negative descriptor");
    // SAFETY: the caller got `fd` from the kernel as a new descriptor that nothing
    // else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Bytes of a table for this geometry (words then owner bytes, page rounded).
pub fn table_len(ninodes: u64, nblocks: u64) -> usize {
    let (w, o) = Table::sizes(ninodes, nblocks);
    (w * 4 + o).div_ceil(4096) * 4096
}

/// Create a zeroed memfd for a table (the daemon). Returns the fd and its mapping.
pub fn create(ninodes: u64, nblocks: u64) -> io::Result<(OwnedFd, ShmRegion)> {
    let len = table_len(ninodes, nblocks);
    // SAFETY: a static NUL-terminated name; memfd_create has no other precondition.
    let fd = unsafe { libc::memfd_create(c"ferrite-direct".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a fresh descriptor we now own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain syscall on our descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let r = map(&fd, ninodes, nblocks)?;
    Ok((fd, r))
}

/// Map a table memfd of a pool with this geometry (daemon or client).
pub fn map(fd: &OwnedFd, ninodes: u64, nblocks: u64) -> io::Result<ShmRegion> {
    let (words, owners) = Table::sizes(ninodes, nblocks);
    let need = words * 4 + owners;
    // SAFETY: fstat on a valid descriptor into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let len = st.st_size as usize;
    if len < need {
        return Err(io::Error::other(format!(
            "coordination table is {len} bytes, the pool needs {need}"
        )));
    }
    // SAFETY: mapping a descriptor we hold, length checked against its size.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(ShmRegion { ptr: p as *mut u8, len, words, owners })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn two_mappings_see_the_same_words() {
        let (fd, a) = create(100, 5000).unwrap();
        let b = map(&fd, 100, 5000).unwrap();
        a.words()[7].store(42, Ordering::Release);
        a.owners()[4999].store(9, Ordering::Release);
        assert_eq!(b.words()[7].load(Ordering::Acquire), 42);
        assert_eq!(b.owners()[4999].load(Ordering::Acquire), 9);
        assert!(map(&fd, 100, 1 << 30).is_err(), "a too small table is refused");
    }
}
