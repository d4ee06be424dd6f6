//! The C library's own functions behind the ones this library interposes, found
//! with `dlsym(RTLD_NEXT)`, and safe wrappers for the calls the rest of the crate
//! makes. Fenced unsafe module.
//!
//! Invariants:
//! - Every pointer handed to a real function comes from a live Rust slice or a
//!   NUL-terminated `CStr`; lengths are the slices' lengths.
//! - A symbol this C library lacks is `None`: the hook then answers ENOSYS rather
//!   than calling through a null pointer.
#![allow(unsafe_code)]

use libc::{c_char, c_int, c_uint, c_void, iovec, mode_t, off64_t, pid_t, size_t, ssize_t, FILE};
use std::ffi::CStr;
use std::sync::OnceLock;

macro_rules! reals {
    ($($name:ident : fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// The real functions.
        #[allow(non_snake_case)]
        pub struct Real {
            $(
                #[doc = concat!("The C library's `", stringify!($name), "`.")]
                pub $name: Option<unsafe extern "C" fn($($arg),*) -> $ret>,
            )*
        }

        fn load() -> Real {
            Real {
                $($name: {
                    let name = concat!(stringify!($name), "\0");
                    // SAFETY: a NUL-terminated symbol name; RTLD_NEXT finds the next
                    // definition after this library (the C library's).
                    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) };
                    if p.is_null() {
                        None
                    } else {
                        // SAFETY: the C library's symbol of this name has this signature
                        // (variadic ones are called with their optional integer
                        // argument, which the x86-64 ABI passes like a fixed one).
                        Some(unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p)
                        })
                    }
                },)*
            }
        }
    };
}

reals! {
    openat64: fn(c_int, *const c_char, c_int, c_uint) -> c_int;
    close: fn(c_int) -> c_int;
    read: fn(c_int, *mut c_void, size_t) -> ssize_t;
    write: fn(c_int, *const c_void, size_t) -> ssize_t;
    pread64: fn(c_int, *mut c_void, size_t, off64_t) -> ssize_t;
    pwrite64: fn(c_int, *const c_void, size_t, off64_t) -> ssize_t;
    readv: fn(c_int, *const iovec, c_int) -> ssize_t;
    writev: fn(c_int, *const iovec, c_int) -> ssize_t;
    preadv64: fn(c_int, *const iovec, c_int, off64_t) -> ssize_t;
    pwritev64: fn(c_int, *const iovec, c_int, off64_t) -> ssize_t;
    preadv64v2: fn(c_int, *const iovec, c_int, off64_t, c_int) -> ssize_t;
    pwritev64v2: fn(c_int, *const iovec, c_int, off64_t, c_int) -> ssize_t;
    lseek64: fn(c_int, off64_t, c_int) -> off64_t;
    fsync: fn(c_int) -> c_int;
    fdatasync: fn(c_int) -> c_int;
    sync_file_range: fn(c_int, off64_t, off64_t, c_uint) -> c_int;
    ftruncate64: fn(c_int, off64_t) -> c_int;
    futimens: fn(c_int, *const libc::timespec) -> c_int;
    fchmod: fn(c_int, mode_t) -> c_int;
    fchown: fn(c_int, libc::uid_t, libc::gid_t) -> c_int;
    fsetxattr: fn(c_int, *const c_char, *const c_void, size_t, c_int) -> c_int;
    fremovexattr: fn(c_int, *const c_char) -> c_int;
    fallocate64: fn(c_int, c_int, off64_t, off64_t) -> c_int;
    posix_fallocate64: fn(c_int, off64_t, off64_t) -> c_int;
    dup: fn(c_int) -> c_int;
    dup2: fn(c_int, c_int) -> c_int;
    dup3: fn(c_int, c_int, c_int) -> c_int;
    fcntl64: fn(c_int, c_int, usize) -> c_int;
    fstat64: fn(c_int, *mut libc::stat64) -> c_int;
    fstatat64: fn(c_int, *const c_char, *mut libc::stat64, c_int) -> c_int;
    statx: fn(c_int, *const c_char, c_int, c_uint, *mut libc::statx) -> c_int;
    copy_file_range: fn(c_int, *mut off64_t, c_int, *mut off64_t, size_t, c_uint) -> ssize_t;
    splice: fn(c_int, *mut off64_t, c_int, *mut off64_t, size_t, c_uint) -> ssize_t;
    ioctl: fn(c_int, libc::Ioctl, usize) -> c_int;
    sendfile64: fn(c_int, c_int, *mut off64_t, size_t) -> ssize_t;
    mmap64: fn(*mut c_void, size_t, c_int, c_int, c_int, off64_t) -> *mut c_void;
    munmap: fn(*mut c_void, size_t) -> c_int;
    msync: fn(*mut c_void, size_t, c_int) -> c_int;
    mremap: fn(*mut c_void, size_t, size_t, c_int, *mut c_void) -> *mut c_void;
    fopen64: fn(*const c_char, *const c_char) -> *mut FILE;
    mkostemps64: fn(*mut c_char, c_int, c_int) -> c_int;
    vdprintf: fn(c_int, *const c_char, *mut c_void) -> c_int;
    sendmsg: fn(c_int, *const libc::msghdr, c_int) -> ssize_t;
    sendmmsg: fn(c_int, *mut libc::mmsghdr, c_uint, c_int) -> c_int;
    fdopen: fn(c_int, *const c_char) -> *mut FILE;
    fclose: fn(*mut FILE) -> c_int;
    freopen64: fn(*const c_char, *const c_char, *mut FILE) -> *mut FILE;
    fileno: fn(*mut FILE) -> c_int;
    posix_spawn: fn(*mut pid_t, *const c_char, *const c_void, *const c_void, *const *mut c_char, *const *mut c_char) -> c_int;
    posix_spawnp: fn(*mut pid_t, *const c_char, *const c_void, *const c_void, *const *mut c_char, *const *mut c_char) -> c_int;
    system: fn(*const c_char) -> c_int;
    popen: fn(*const c_char, *const c_char) -> *mut FILE;
    posix_spawn_file_actions_adddup2: fn(*mut c_void, c_int, c_int) -> c_int;
    fork: fn() -> pid_t;
    execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    execv: fn(*const c_char, *const *const c_char) -> c_int;
    execvp: fn(*const c_char, *const *const c_char) -> c_int;
    execvpe: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    fexecve: fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
    close_range: fn(c_uint, c_uint, c_int) -> c_int;
    chdir: fn(*const c_char) -> c_int;
    sigaction: fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int;
    fchdir: fn(c_int) -> c_int;
}

static REAL: OnceLock<Real> = OnceLock::new();

/// The real functions (looked up on first use).
pub fn real() -> &'static Real {
    REAL.get_or_init(load)
}

/// The calling thread's file-system user id (`setfsuid(-1)` changes nothing and
/// returns it).
pub fn fsuid() -> u32 {
    // SAFETY: an invalid id is refused; the call only reads the credentials.
    unsafe { libc::setfsuid(u32::MAX) as u32 }
}

/// The calling thread's file-system group id (as [`fsuid`]).
pub fn fsgid() -> u32 {
    // SAFETY: as in `fsuid`.
    unsafe { libc::setfsgid(u32::MAX) as u32 }
}

/// Fill `buf` from the kernel's random source (getrandom, not blocking).
pub fn random(buf: &mut [u8]) -> Result<(), c_int> {
    // SAFETY: a live buffer of buf.len() bytes.
    let r = unsafe { libc::getrandom(buf.as_mut_ptr().cast(), buf.len(), libc::GRND_NONBLOCK) };
    if r == buf.len() as ssize_t {
        Ok(())
    } else {
        Err(if r < 0 { errno() } else { libc::EIO })
    }
}

/// errno of the calling thread.
pub fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// Set errno of the calling thread.
pub fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
}

/// Result of a call that returns -1 and errno.
fn check(r: c_int) -> Result<c_int, c_int> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

fn check_ss(r: ssize_t) -> Result<usize, c_int> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

macro_rules! need {
    ($f:ident) => {
        match real().$f {
            Some(f) => f,
            None => return Err(libc::ENOSYS),
        }
    };
}

/// The real `openat64`.
pub fn openat(dirfd: c_int, path: &CStr, flags: c_int, mode: mode_t) -> Result<c_int, c_int> {
    let f = need!(openat64);
    // SAFETY: a valid C string; the mode is read only with O_CREAT/O_TMPFILE.
    check(unsafe { f(dirfd, path.as_ptr(), flags, mode) })
}

/// The real `pread64` into `buf`.
pub fn pread(fd: c_int, buf: &mut [u8], off: u64) -> Result<usize, c_int> {
    let f = need!(pread64);
    // SAFETY: buf is a live, writable slice of this length.
    check_ss(unsafe { f(fd, buf.as_mut_ptr() as *mut c_void, buf.len(), off as off64_t) })
}

/// The real `read`.
pub fn read(fd: c_int, buf: &mut [u8]) -> Result<usize, c_int> {
    let f = need!(read);
    // SAFETY: buf is a live, writable slice of this length.
    check_ss(unsafe { f(fd, buf.as_mut_ptr() as *mut c_void, buf.len()) })
}

/// The real `pwrite64` of `buf`.
pub fn pwrite(fd: c_int, buf: &[u8], off: u64) -> Result<usize, c_int> {
    let f = need!(pwrite64);
    // SAFETY: buf is a live slice of this length.
    check_ss(unsafe { f(fd, buf.as_ptr() as *const c_void, buf.len(), off as off64_t) })
}

/// The real `pwritev2` of one buffer at `off` (-1: the descriptor's offset, which
/// moves) with per-call flags `flags`.
pub fn pwritev2(fd: c_int, buf: &[u8], off: i64, flags: c_int) -> Result<usize, c_int> {
    let f = need!(pwritev64v2);
    let iov = iovec { iov_base: buf.as_ptr() as *mut c_void, iov_len: buf.len() };
    // SAFETY: one iovec naming a live slice of its length.
    check_ss(unsafe { f(fd, &iov, 1, off as off64_t, flags) })
}

/// The real `close`.
pub fn close(fd: c_int) -> Result<(), c_int> {
    let f = need!(close);
    // SAFETY: closing a descriptor this crate owns.
    check(unsafe { f(fd) }).map(|_| ())
}

/// The real `write`.
pub fn write(fd: c_int, buf: &[u8]) -> Result<usize, c_int> {
    let f = need!(write);
    // SAFETY: buf is a live slice of this length.
    check_ss(unsafe { f(fd, buf.as_ptr() as *const c_void, buf.len()) })
}

/// The real `lseek64`.
pub fn lseek(fd: c_int, off: i64, whence: c_int) -> Result<i64, c_int> {
    let f = need!(lseek64);
    // SAFETY: plain call.
    let r = unsafe { f(fd, off, whence) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// The real `fcntl64` with an integer argument.
pub fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> Result<c_int, c_int> {
    let f = need!(fcntl64);
    // SAFETY: the commands this crate issues take an integer argument.
    check(unsafe { f(fd, cmd, arg) })
}

/// `statx` of a descriptor from the kernel's cached attributes: no round trip to a
/// FUSE daemon (AT_STATX_DONT_SYNC), only the basic fields.
pub fn statx_cached(fd: c_int) -> Result<libc::statx, c_int> {
    let f = need!(statx);
    crate::stats::look();
    // SAFETY: a zeroed statx is valid; the path is the empty C string.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        f(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE | libc::STATX_INO,
            &mut st,
        )
    };
    check(r).map(|_| st)
}

/// Type, inode and device of `path` from the kernel's caches (a lookup, with
/// AT_STATX_DONT_SYNC: no attributes asked of a FUSE daemon); `flags` may hold
/// AT_SYMLINK_NOFOLLOW.
pub fn statx_at_cached(dirfd: c_int, path: &CStr, flags: c_int) -> Result<libc::statx, c_int> {
    let f = need!(statx);
    crate::stats::look();
    // SAFETY: a zeroed statx is valid; `path` is the caller's C string.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let flags = libc::AT_STATX_DONT_SYNC | flags;
    let r = unsafe { f(dirfd, path.as_ptr(), flags, libc::STATX_TYPE | libc::STATX_INO, &mut st) };
    check(r).map(|_| st)
}

/// The file type (S_IFMT bits) at `path` from the kernel's caches (a lookup, with
/// AT_STATX_DONT_SYNC), following a final symlink unless `nofollow`.
pub fn type_at(dirfd: c_int, path: &CStr, nofollow: bool) -> Result<u32, c_int> {
    look_at(dirfd, path, nofollow).map(|(t, _)| t)
}

/// The file type (S_IFMT bits) and size at `path`, as [`type_at`]: the size is
/// what the kernel holds, which may be older than the file.
pub fn look_at(dirfd: c_int, path: &CStr, nofollow: bool) -> Result<(u32, u64), c_int> {
    let flags = if nofollow { libc::AT_SYMLINK_NOFOLLOW } else { 0 };
    statx_at_cached(dirfd, path, flags).map(|st| (st.stx_mode as u32 & libc::S_IFMT, st.stx_size))
}

/// The device (st_dev) of the file `fd` names, from the kernel's caches.
pub fn dev_of(fd: c_int) -> Option<u64> {
    statx_cached(fd).ok().map(|st| libc::makedev(st.stx_dev_major, st.stx_dev_minor))
}

/// Make the kernel ask the daemon for a file's attributes now (its cached size
/// predates this process's direct writes): `statx` with AT_STATX_FORCE_SYNC.
pub fn refresh_kernel_attrs(fd: c_int) {
    let Some(f) = real().statx else { return };
    // SAFETY: a zeroed statx is valid; the path is the empty C string.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    unsafe {
        f(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_FORCE_SYNC,
            libc::STATX_SIZE,
            &mut st,
        )
    };
}

/// `fd` borrowed for the length of a call the program made with it.
pub fn borrow<'a>(fd: c_int) -> std::os::fd::BorrowedFd<'a> {
    // SAFETY: the program's descriptor, open for the call it passed it to (the
    // borrow does not outlive the hook).
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// Enumerate this process's open descriptors (from /proc/self/fd).
pub fn open_fds() -> Vec<c_int> {
    match std::fs::read_dir("/proc/self/fd") {
        Ok(d) => d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        Err(_) => Vec::new(),
    }
}

/// The path a descriptor refers to (for directory descriptors of `openat`).
pub fn fd_path(fd: c_int) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
}

/// A fresh private anonymous mapping, readable and writable, unmapped when dropped
/// unless [`AnonMap::finish`]ed: what stands in for a small private mapping of a
/// direct file (`ops::mmap_private`).
pub struct AnonMap {
    addr: usize,
    len: usize,
}

impl AnonMap {
    /// `len` bytes anywhere (`extra` flags: MAP_NORESERVE, MAP_POPULATE).
    pub fn new(len: usize, extra: c_int) -> Result<AnonMap, c_int> {
        let f = need!(mmap64);
        let (prot, flags) =
            (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra);
        // SAFETY: a new anonymous mapping at an address the kernel picks.
        let p = unsafe { f(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(errno());
        }
        Ok(AnonMap { addr: p as usize, len })
    }

    /// Its bytes.
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes at `addr` are this mapping's, readable and writable,
        // and borrowed mutably through `self` only.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }

    /// Give it protection `prot` and hand it over (its address).
    pub fn finish(self, prot: c_int) -> Result<usize, c_int> {
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: the whole of this mapping; mprotect changes no byte.
        if prot != rw && unsafe { libc::mprotect(self.addr as *mut c_void, self.len, prot) } != 0 {
            return Err(errno()); // dropped: unmapped
        }
        let addr = self.addr;
        std::mem::forget(self);
        Ok(addr)
    }
}

impl Drop for AnonMap {
    fn drop(&mut self) {
        if let Some(f) = real().munmap {
            // SAFETY: this mapping, never handed out.
            unsafe { f(self.addr as *mut c_void, self.len) };
        }
    }
}
