//! Which pages of a private mapping the program wrote, asked of the kernel
//! (Linux 6.7+): a userfaultfd registration in asynchronous write-protect mode
//! (`UFFD_FEATURE_WP_ASYNC`: a store to a protected page takes a fault the kernel
//! resolves itself by lifting the protection) and the `PAGEMAP_SCAN` ioctl of
//! `/proc/self/pagemap`, which lists the pages whose protection was lifted and
//! protects them again in the same walk (`PM_SCAN_WP_MATCHING`). An atomic
//! mapping's commit uses it to find its changed pages without comparing every
//! page (`filemap`).
//!
//! Invariants:
//! - A [`Tracker`] exists only for a range the kernel registered and protected
//!   whole: from its creation on, every page stored to is reported by the next
//!   [`Tracker::take_written`] of a range holding it (a store racing a scan is
//!   reported by that scan or the next, never by neither: the scan protects a page
//!   in the same step as it reports it).
//! - Nothing here changes a byte of the mapping; the ioctls only change page
//!   protection bits.
//! - Any refusal (an older kernel, a forbidden `userfaultfd`, a seccomp filter, a
//!   range the program remapped) is an error value: the caller then compares pages
//!   instead, as before this module existed.
//! - The descriptors belong to the process that made them: after a fork, the
//!   child's scans would walk the parent's memory, so [`Tracker::owned`] says no
//!   there and the caller compares.
#![allow(unsafe_code)]

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const UFFD_USER_MODE_ONLY: i32 = 1;
const UFFD_API: u64 = 0xAA;
const UFFD_FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
const UFFD_FEATURE_WP_ASYNC: u64 = 1 << 15;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;

/// `_IOC(dir, 0xAA or 'f', nr, size)` as the kernel's headers compute it.
const fn ioc(dir: u64, ty: u64, nr: u64, size: usize) -> u64 {
    (dir << 30) | ((size as u64) << 16) | (ty << 8) | nr
}
const IOC_READ: u64 = 2;
const IOC_RW: u64 = 3;

#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}
const _: () = assert!(std::mem::size_of::<UffdioApi>() == 24);

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}
const _: () = assert!(std::mem::size_of::<UffdioRange>() == 16);

#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}
const _: () = assert!(std::mem::size_of::<UffdioRegister>() == 32);

#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}
const _: () = assert!(std::mem::size_of::<UffdioWriteprotect>() == 24);

const UFFDIO_API: u64 = ioc(IOC_RW, 0xAA, 0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = ioc(IOC_RW, 0xAA, 0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_UNREGISTER: u64 = ioc(IOC_READ, 0xAA, 0x01, std::mem::size_of::<UffdioRange>());
const UFFDIO_WRITEPROTECT: u64 = ioc(IOC_RW, 0xAA, 0x06, std::mem::size_of::<UffdioWriteprotect>());

/// `struct page_region` of `PAGEMAP_SCAN`'s output.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct PageRegion {
    start: u64,
    end: u64,
    categories: u64,
}
const _: () = assert!(std::mem::size_of::<PageRegion>() == 24);

/// `struct pm_scan_arg`.
#[repr(C)]
#[derive(Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}
const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);

const PAGEMAP_SCAN: u64 = ioc(IOC_RW, b'f' as u64, 16, std::mem::size_of::<PmScanArg>());
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
const PAGE_IS_WRITTEN: u64 = 1 << 1;

const PAGE: usize = 4096;

fn last_err(what: &str) -> std::io::Error {
    let e = std::io::Error::last_os_error();
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// `ioctl(fd, req, arg)`; the error names `what`.
///
/// # Safety
/// `arg` must be the structure `req` reads and writes.
unsafe fn ioctl<T>(fd: &OwnedFd, req: u64, arg: &mut T, what: &str) -> std::io::Result<i64> {
    // SAFETY: forwarded from the caller; `arg` lives across the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg as *mut T) };
    if r < 0 {
        Err(last_err(what))
    } else {
        Ok(r as i64)
    }
}

/// Write tracking of one page-aligned range of this process's private memory.
pub(crate) struct Tracker {
    uffd: OwnedFd,
    pagemap: OwnedFd,
    base: usize,
    len: usize,
    pid: u32,
}

impl Tracker {
    /// Register `[base, base + len)` (page aligned, private anonymous memory of
    /// this process) and protect all of it: from now on, stores to it are seen.
    /// An error when the kernel or the environment does not allow it.
    pub(crate) fn new(base: usize, len: usize) -> std::io::Result<Tracker> {
        assert!(base.is_multiple_of(PAGE) && len.is_multiple_of(PAGE) && len > 0, "range");
        if matches!(std::env::var("FERRITE_WRITE_TRACKING").as_deref(), Ok("0")) {
            return Err(std::io::Error::other("FERRITE_WRITE_TRACKING=0"));
        }
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY;
        // SAFETY: userfaultfd(2) takes flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if fd < 0 {
            return Err(last_err("userfaultfd"));
        }
        // SAFETY: a descriptor the call above made, owned by nobody else.
        let uffd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        // One handshake: asynchronous write protection came with Linux 6.7, after
        // write protection of unpopulated pages (6.5), so a kernel that refuses
        // both has neither.
        let want = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED;
        let mut api = UffdioApi { api: UFFD_API, features: want, ioctls: 0 };
        // SAFETY: UFFDIO_API reads and writes a `struct uffdio_api`.
        unsafe { ioctl(&uffd, UFFDIO_API, &mut api, "UFFDIO_API")? };
        if api.features & UFFD_FEATURE_WP_ASYNC == 0 {
            return Err(std::io::Error::other("no asynchronous write protection"));
        }
        let pagemap = std::fs::File::open("/proc/self/pagemap")
            .map_err(|e| std::io::Error::new(e.kind(), format!("/proc/self/pagemap: {e}")))?;
        let range = UffdioRange { start: base as u64, len: len as u64 };
        let mut reg = UffdioRegister { range, mode: UFFDIO_REGISTER_MODE_WP, ioctls: 0 };
        // SAFETY: UFFDIO_REGISTER reads and writes a `struct uffdio_register`.
        unsafe { ioctl(&uffd, UFFDIO_REGISTER, &mut reg, "UFFDIO_REGISTER")? };
        let t = Tracker { uffd, pagemap: pagemap.into(), base, len, pid: std::process::id() };
        let mut wp = UffdioWriteprotect { range, mode: UFFDIO_WRITEPROTECT_MODE_WP };
        // SAFETY: UFFDIO_WRITEPROTECT reads a `struct uffdio_writeprotect`.
        unsafe { ioctl(&t.uffd, UFFDIO_WRITEPROTECT, &mut wp, "UFFDIO_WRITEPROTECT")? };
        // A first scan proves the kernel scans this range. (A page it reports was
        // stored to since the protection, by another thread: the caller compares
        // every page after turning tracking on.)
        t.take_written(base, base + len, &mut Vec::new())?;
        Ok(t)
    }

    /// Is this the process that made the tracker (not a forked child)?
    pub(crate) fn owned(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Append to `out` the start addresses of the pages of `[a, b)` (page aligned,
    /// inside the tracked range) stored to since they were last reported, and
    /// protect them again.
    pub(crate) fn take_written(
        &self,
        a: usize,
        b: usize,
        out: &mut Vec<usize>,
    ) -> std::io::Result<()> {
        assert!(a.is_multiple_of(PAGE) && b.is_multiple_of(PAGE), "page aligned");
        assert!(self.base <= a && a <= b && b <= self.base + self.len, "inside the range");
        let mut regions = [PageRegion::default(); 32];
        let mut at = a as u64;
        // Each call walks from `at` on; one that fills `regions` stops early and
        // says where (`walk_end`). At most one call per reported region plus one.
        for _ in 0..=(b - a) / PAGE {
            if at >= b as u64 {
                return Ok(());
            }
            let mut arg = PmScanArg {
                size: std::mem::size_of::<PmScanArg>() as u64,
                flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
                start: at,
                end: b as u64,
                vec: regions.as_mut_ptr() as u64,
                vec_len: regions.len() as u64,
                category_mask: PAGE_IS_WRITTEN,
                return_mask: PAGE_IS_WRITTEN,
                ..Default::default()
            };
            // SAFETY: PAGEMAP_SCAN reads `arg` and writes at most `vec_len`
            // regions into `regions`, which outlives the call.
            let n = unsafe { ioctl(&self.pagemap, PAGEMAP_SCAN, &mut arg, "PAGEMAP_SCAN")? };
            let n = usize::try_from(n).unwrap_or(0).min(regions.len());
            for r in &regions[..n] {
                let (s, e) = (r.start.max(at) as usize, (r.end as usize).min(b));
                out.extend((s..e).step_by(PAGE));
            }
            if arg.walk_end <= at {
                return Err(std::io::Error::other("PAGEMAP_SCAN made no progress"));
            }
            at = arg.walk_end;
        }
        Err(std::io::Error::other("PAGEMAP_SCAN did not finish its range"))
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        if !self.owned() {
            return; // a child's copy: the registration is the parent's
        }
        let mut range = UffdioRange { start: self.base as u64, len: self.len as u64 };
        // SAFETY: UFFDIO_UNREGISTER reads a `struct uffdio_range`. Failing (the
        // range unmapped already) leaves nothing to undo; closing the descriptor
        // ends the registration anyway.
        let _ = unsafe { ioctl(&self.uffd, UFFDIO_UNREGISTER, &mut range, "UFFDIO_UNREGISTER") };
    }
}
