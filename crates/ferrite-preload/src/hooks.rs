//! The interposed C library functions. Fenced unsafe module: this is where C
//! pointers become Rust slices and errno values become -1 and errno.
//!
//! Invariants:
//! - A hook decides only whether a call is direct; what a direct call does is in
//!   `ops` (safe code). Anything not direct is passed to the C library unchanged.
//! - Buffers from the caller are turned into slices only with the caller's length,
//!   and only when the descriptor is direct (the C library validates the rest).
//! - A panic never crosses into C: it becomes EIO.
//! - Variadic C functions (open, openat, fcntl) are defined with their optional
//!   argument as a fixed one; the x86-64 ABI passes both the same way.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

use crate::ops::{self, Do, Side, R};
use crate::real::{self, real, set_errno};
use crate::table::{self, Desc};
use crate::{mounts, stats};
use ferrite_core::Attr;
use ferrite_direct::Client;
use libc::{c_char, c_int, c_uint, c_void, iovec, mode_t, off64_t, pid_t, size_t, ssize_t, FILE};
use std::ffi::CStr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Status flags a program can see and set on a description.
const STATUS: c_int = libc::O_APPEND
    | libc::O_NONBLOCK
    | libc::O_DIRECT
    | libc::O_NOATIME
    | libc::O_ASYNC
    | libc::O_SYNC
    | libc::O_DSYNC;

macro_rules! forward {
    ($f:ident ( $($a:expr),* ), $fail:expr) => {
        match real().$f {
            // SAFETY: the caller's arguments, passed on unchanged.
            Some(f) => unsafe { f($($a),*) },
            None => {
                set_errno(libc::ENOSYS);
                $fail
            }
        }
    };
}

/// The direct descriptor `fd` and its client, with the hook entered.
fn lookup(fd: c_int) -> Option<(table::Entered, Arc<Desc>, &'static Client)> {
    if table::TRACKED.load(Ordering::Acquire) == 0 {
        return None;
    }
    let e = table::enter()?;
    let d = table::get(fd)?;
    let c = d.mount.client()?;
    if !c.usable() {
        return None; // the kernel answers (ENOTCONN once the mount is gone)
    }
    Some((e, d, c))
}

/// Run a direct operation on `fd`; `None` when `fd` is not direct or the operation
/// goes to the kernel (the caller forwards it).
fn direct<T>(fd: c_int, f: impl FnOnce(&Desc, &'static Client) -> R<Do<T>>) -> Option<R<T>> {
    if table::TRACKED.load(Ordering::Acquire) == 0 {
        return None;
    }
    table::with_desc(fd, |d, cx| {
        let c = d.mount.client().filter(|c| c.usable())?;
        match catch_unwind(AssertUnwindSafe(|| {
            #[cfg(debug_assertions)]
            if injected_panic("direct") {
                panic!("FERRITE_TEST_PRELOAD_PANIC_IN=direct");
            }
            f(d, c)
        })) {
            Ok(Ok(Do::Done(v))) => {
                cx.counters.direct();
                Some(Ok(v))
            }
            Ok(Ok(Do::KernelDone(v))) => {
                cx.counters.kernel();
                Some(Ok(v))
            }
            Ok(Ok(Do::Kernel)) => {
                cx.counters.kernel();
                d.kernel_io.store(true, Ordering::Relaxed);
                None
            }
            Ok(Err(e)) => {
                cx.counters.direct();
                Some(Err(e))
            }
            Err(_) => Some(Err(libc::EIO)),
        }
    })
    .flatten()
}

/// Debug builds only (tests): `FERRITE_TEST_PRELOAD_PANIC_IN=direct` makes every
/// call served directly panic inside its hook, to exercise the unwinding that turns
/// a panic into EIO (the library carries its own unwinder: build.rs).
#[cfg(debug_assertions)]
fn injected_panic(what: &str) -> bool {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    AT.get_or_init(|| std::env::var("FERRITE_TEST_PRELOAD_PANIC_IN").ok()).as_deref() == Some(what)
}

fn ss(r: R<usize>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

fn int(r: R<c_int>) -> c_int {
    match r {
        Ok(n) => n,
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// The caller's buffer of `n` bytes at `p` for read(2), write(2), pread(2) or
/// pwrite(2), as the kernel takes it ([`ferrite_direct::user_len`]: EFAULT, or at
/// most `MAX_RW_COUNT` bytes). `before` is the error Linux finds before a bad
/// buffer, if any (a negative offset, then the descriptor's mode).
///
/// # Safety
/// `p` must point to `n` bytes the caller may read (and, unless only read, write).
unsafe fn user_buf<'a>(p: *const c_void, n: size_t, before: R<()>) -> R<&'a mut [u8]> {
    if n == 0 {
        return Ok(&mut []);
    }
    let Some(n) = ferrite_direct::user_len(p as usize, n) else {
        before?;
        return Err(libc::EFAULT);
    };
    // SAFETY: as the caller promises, within the user address space.
    Ok(unsafe { slice_mut(p as *mut c_void, n) })
}

/// What Linux checks before a buffer: a negative offset (EINVAL), then the
/// descriptor's mode for the call (EBADF).
fn mode_ok(usable: bool, off: i64) -> R<()> {
    if off < 0 {
        Err(libc::EINVAL)
    } else if !usable {
        Err(libc::EBADF)
    } else {
        Ok(())
    }
}

unsafe fn slice<'a>(p: *const c_void, n: size_t) -> &'a [u8] {
    if n == 0 {
        return &[];
    }
    // SAFETY: the caller gives a readable buffer of n bytes (the C contract).
    unsafe { std::slice::from_raw_parts(p as *const u8, n) }
}

unsafe fn slice_mut<'a>(p: *mut c_void, n: size_t) -> &'a mut [u8] {
    if n == 0 {
        return &mut [];
    }
    // SAFETY: the caller gives a writable buffer of n bytes (the C contract).
    unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) }
}

unsafe fn iovs<'a>(iov: *const iovec, cnt: c_int) -> R<&'a [iovec]> {
    if !(0..=libc::UIO_MAXIOV).contains(&cnt) {
        return Err(libc::EINVAL);
    }
    if cnt == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller gives `cnt` iovecs (the C contract).
    Ok(unsafe { std::slice::from_raw_parts(iov, cnt as usize) })
}

fn gather(v: &[iovec]) -> R<Vec<u8>> {
    let total = v.iter().try_fold(0usize, |a, x| a.checked_add(x.iov_len)).ok_or(libc::EINVAL)?;
    if total > isize::MAX as usize {
        return Err(libc::EINVAL);
    }
    let mut buf = Vec::with_capacity(total);
    for x in v {
        // SAFETY: each iovec names a readable buffer of its length.
        buf.extend_from_slice(unsafe { slice(x.iov_base, x.iov_len) });
    }
    Ok(buf)
}

fn scatter(v: &[iovec], data: &[u8]) {
    let mut at = 0;
    for x in v {
        if at >= data.len() {
            break;
        }
        let n = x.iov_len.min(data.len() - at);
        // SAFETY: each iovec names a writable buffer of its length.
        unsafe { slice_mut(x.iov_base, n) }.copy_from_slice(&data[at..at + n]);
        at += n;
    }
}

fn iov_len(v: &[iovec]) -> R<usize> {
    v.iter().try_fold(0usize, |a, x| a.checked_add(x.iov_len)).ok_or(libc::EINVAL)
}

// ------------------------------------------------------------------- open

/// The absolute (not normalised) path `path` names relative to `dirfd`.
pub(crate) fn absolute(dirfd: c_int, path: &[u8]) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    if path.first() == Some(&b'/') {
        return Some(path.to_vec());
    }
    let mut v = if dirfd == libc::AT_FDCWD {
        table::with_ctx(|cx| cx.cwd()).flatten()?
    } else {
        real::fd_path(dirfd)?.as_os_str().as_bytes().to_vec()
    };
    if v.last() != Some(&b'/') {
        v.push(b'/');
    }
    v.extend_from_slice(path);
    Some(v)
}

fn open_at(dirfd: c_int, path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    let plain = || forward!(openat64(dirfd, path, flags, mode), -1);
    if table::inside() {
        return plain();
    }
    crate::init();
    if path.is_null() || mounts::mounts().is_empty() {
        return plain();
    }
    // SAFETY: a non-null C string from the caller.
    let p = unsafe { CStr::from_ptr(path) };
    // A directory or a path handle is never served here (`open_direct` keeps only
    // regular files): no need to name where it is (a readlink of `dirfd` for each
    // directory `find` or `rm -r` opens below another).
    let m = if flags & (libc::O_DIRECTORY | libc::O_PATH) != 0 {
        None
    } else {
        let Some(_e) = table::enter() else { return plain() };
        absolute(dirfd, p.to_bytes()).and_then(|a| mounts::for_path(&a))
    };
    let Some(m) = m else {
        let fd = plain();
        forget_fd(fd);
        return fd;
    };
    let Some(e) = table::enter() else { return plain() };
    let r = catch_unwind(AssertUnwindSafe(|| open_direct(m, dirfd, p, flags, mode as mode_t)));
    drop(e);
    stats::kernel();
    match r {
        Ok(r) => int(r),
        Err(_) => int(Err(libc::EIO)),
    }
}

fn open_direct(
    m: &'static mounts::Mount,
    dirfd: c_int,
    p: &CStr,
    flags: c_int,
    mode: mode_t,
) -> R<c_int> {
    debug_assert!(flags & (libc::O_DIRECTORY | libc::O_PATH) == 0, "open_at keeps these");
    let nofollow = flags & libc::O_NOFOLLOW != 0;
    let mut look = None;
    let client = match m.attached() {
        Some(c) => Some(c),
        None if reads_only(flags) && lazy_attach() && m.may_attach() => {
            let l = real::look_at(dirfd, p, nofollow);
            look = Some(l.map(|(t, _)| t));
            match l {
                Ok((libc::S_IFREG, size)) if attach_for_read(size) => m.client(),
                Ok((libc::S_IFREG, _)) if m.note_lazy_read() + 1 >= LAZY_OPENS => m.client(),
                _ => None,
            }
        }
        None => m.client(),
    };
    let mut marker = client.is_some() && flags & libc::O_DIRECT == 0;
    if marker && !creates_new(flags) {
        // The marker is for regular files. A FIFO's open blocks until its other end
        // opens and only then fails with O_DIRECT, which would leave a writer at the
        // other end without a reader for a moment: look first (from the kernel's
        // caches; a missing name is created as a regular file). An exclusive create
        // needs no look: it makes a new regular file or fails with EEXIST, whatever
        // the name is now; and the look would cost it two round trips to the daemon
        // (FUSE asks again for every name an O_EXCL open finds cached, and the
        // look refreshes the directory's attributes first).
        let t = look.unwrap_or_else(|| real::type_at(dirfd, p, nofollow));
        marker = matches!(t, Ok(libc::S_IFREG) | Err(libc::ENOENT));
    }
    let mut r = real::openat(dirfd, p, if marker { flags | libc::O_DIRECT } else { flags }, mode);
    if marker && r == Err(libc::EINVAL) {
        // A directory or another file the kernel will not open O_DIRECT.
        marker = false;
        r = real::openat(dirfd, p, flags, mode);
    }
    let fd = r?;
    table::set(fd, None);
    if client.is_some() {
        if let Ok(st) = real::statx_cached(fd) {
            let dev = libc::makedev(st.stx_dev_major, st.stx_dev_minor);
            if st.stx_mode as u32 & libc::S_IFMT == libc::S_IFREG && dev == m.dev {
                table::set(
                    fd,
                    Some(Arc::new(Desc {
                        mount: m,
                        ino: st.stx_ino,
                        dev,
                        access: flags & libc::O_ACCMODE,
                        flags: (flags & STATUS).into(),
                        marker,
                        writer_registered: (marker || flags & libc::O_DIRECT != 0)
                            && flags & libc::O_ACCMODE != libc::O_RDONLY,
                        pos: Default::default(),
                        // On a standard descriptor the C library's own stream
                        // writes it through the kernel: the kernel's offset must
                        // be the truth (see `dup_done`).
                        shared: (fd <= 2).into(),
                        kernel_io: false.into(),
                        look: table::KernelLook::of(&st),
                    })),
                );
            }
        }
    }
    Ok(fd)
}

/// A process attaches to a mount (docs/DIRECT-ACCESS.md, "When a process
/// attaches") at its first open for writing, creating or truncating, at its first
/// read-only open of a file of at least `LAZY_BYTES`, or at its `LAZY_OPENS`th
/// read-only open of a regular file; the read-only opens before go through the
/// kernel, as a plain process's. Attaching costs a process about 1 ms (the daemon's
/// handshake, the pool's mapping and pages, the lease keeper, the goodbye); a
/// small file read through the kernel costs a round trip or two (about 20 us
/// each), so `cat`, `head` or `grep` of a few small files is done before an
/// attach would have paid. `FERRITE_LAZY_ATTACH=0` attaches at the first open.
const LAZY_OPENS: u32 = 16;

/// See [`LAZY_OPENS`]: reading a file this large through the mount costs about what
/// attaching does (`cat` of a 512 MiB file took 0.44-0.58 s through the kernel and
/// 0.23-0.31 s directly: about 0.47 ms more per MiB).
const LAZY_BYTES: u64 = 2 << 20;

/// `FERRITE_LAZY_ATTACH` is not `0` (read once).
fn lazy_attach() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::switch_on(&ON, "FERRITE_LAZY_ATTACH")
}

/// Is reading a file of `size` bytes (the kernel's cached size) worth attaching
/// for? Always when `FERRITE_LAZY_ATTACH=0`.
pub(crate) fn attach_for_read(size: u64) -> bool {
    !lazy_attach() || size >= LAZY_BYTES
}

/// An open that neither writes, creates nor truncates.
fn reads_only(flags: c_int) -> bool {
    flags & libc::O_ACCMODE == libc::O_RDONLY && flags & (libc::O_CREAT | libc::O_TRUNC) == 0
}

/// An open that can only make a new regular file (O_CREAT with O_EXCL): whatever
/// the name is now, it either creates one or fails with EEXIST.
fn creates_new(flags: c_int) -> bool {
    flags & (libc::O_CREAT | libc::O_EXCL) == libc::O_CREAT | libc::O_EXCL
}

/// `fd` was just made by a call this library does not track: make sure no stale
/// entry names it.
fn forget_fd(fd: c_int) {
    if fd >= 0 && table::TRACKED.load(Ordering::Acquire) > 0 {
        if let Some(_e) = table::enter() {
            table::set(fd, None);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    open_at(libc::AT_FDCWD, path, flags, mode)
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: c_uint) -> c_int {
    open_at(libc::AT_FDCWD, path, flags, mode)
}

#[no_mangle]
pub unsafe extern "C" fn openat(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    open_at(dirfd, path, flags, mode)
}

#[no_mangle]
pub unsafe extern "C" fn openat64(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    open_at(dirfd, path, flags, mode)
}

#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    open_at(libc::AT_FDCWD, path, flags, 0)
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    open_at(libc::AT_FDCWD, path, flags, 0)
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    open_at(dirfd, path, flags, 0)
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dirfd: c_int, path: *const c_char, flags: c_int) -> c_int {
    open_at(dirfd, path, flags, 0)
}

/// chdir: the kernel's, then every thread's cached working directory is stale.
#[no_mangle]
pub unsafe extern "C" fn chdir(path: *const c_char) -> c_int {
    let r = forward!(chdir(path), -1);
    table::CWD_GEN.fetch_add(1, Ordering::AcqRel);
    r
}

/// fchdir: as [`chdir`].
#[no_mangle]
pub unsafe extern "C" fn fchdir(fd: c_int) -> c_int {
    let r = forward!(fchdir(fd), -1);
    table::CWD_GEN.fetch_add(1, Ordering::AcqRel);
    r
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    open_at(libc::AT_FDCWD, path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode)
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    open_at(libc::AT_FDCWD, path, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, mode)
}

// ---------------------------------------------------------------- temp files

/// mkostemps and its relatives: a template on a mount with direct access is
/// created through [`open_at`] (so the new file is direct, as any other the
/// process creates), by glibc's rule: the six `X` before the `suffix` characters
/// replaced by letters and digits until an exclusive create succeeds, mode 0600,
/// `flags` besides. The C library's own would open it with its internal `open`:
/// a plain kernel open, which keeps every client's writes of the file in the
/// kernel (sed -i, sort's temporary files, perl -i, git). Anything else: the C
/// library's.
fn make_temp(t: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    let plain = || forward!(mkostemps64(t, suffix, flags), -1);
    if t.is_null() || table::inside() {
        return plain();
    }
    crate::init();
    if mounts::mounts().is_empty() {
        return plain();
    }
    // SAFETY: a non-null C string from the caller.
    let name = unsafe { CStr::from_ptr(t) }.to_bytes();
    let on_mount = {
        let Some(_e) = table::enter() else { return plain() };
        absolute(libc::AT_FDCWD, name)
            .and_then(|a| mounts::for_path(&a))
            .is_some_and(|m| m.client().is_some())
    };
    if !on_mount {
        return plain();
    }
    let len = name.len();
    let Ok(suffix) = usize::try_from(suffix) else {
        set_errno(libc::EINVAL); // as glibc: a negative length never fits
        return -1;
    };
    if suffix > len || len - suffix < 6 || &name[len - suffix - 6..len - suffix] != b"XXXXXX" {
        set_errno(libc::EINVAL);
        return -1;
    }
    const LETTERS: &[u8; 62] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let at = len - suffix - 6;
    // glibc tries 62^3 names before it gives up with EEXIST.
    for _ in 0..62 * 62 * 62 {
        let mut r = [0u8; 8];
        if real::random(&mut r).is_err() {
            return plain();
        }
        let mut v = u64::from_ne_bytes(r);
        for i in 0..6 {
            // SAFETY: inside the caller's template (at + 6 <= len).
            unsafe { *t.add(at + i) = LETTERS[(v % 62) as usize] as c_char };
            v /= 62;
        }
        let f = (flags & !libc::O_ACCMODE) | libc::O_RDWR | libc::O_CREAT | libc::O_EXCL;
        let fd = open_at(libc::AT_FDCWD, t, f, 0o600);
        if fd >= 0 || real::errno() != libc::EEXIST {
            return fd;
        }
    }
    set_errno(libc::EEXIST);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn mkstemp(t: *mut c_char) -> c_int {
    make_temp(t, 0, 0)
}

#[no_mangle]
pub unsafe extern "C" fn mkstemp64(t: *mut c_char) -> c_int {
    make_temp(t, 0, 0)
}

#[no_mangle]
pub unsafe extern "C" fn mkostemp(t: *mut c_char, flags: c_int) -> c_int {
    make_temp(t, 0, flags)
}

#[no_mangle]
pub unsafe extern "C" fn mkostemp64(t: *mut c_char, flags: c_int) -> c_int {
    make_temp(t, 0, flags)
}

#[no_mangle]
pub unsafe extern "C" fn mkstemps(t: *mut c_char, suffix: c_int) -> c_int {
    make_temp(t, suffix, 0)
}

#[no_mangle]
pub unsafe extern "C" fn mkstemps64(t: *mut c_char, suffix: c_int) -> c_int {
    make_temp(t, suffix, 0)
}

#[no_mangle]
pub unsafe extern "C" fn mkostemps(t: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    make_temp(t, suffix, flags)
}

#[no_mangle]
pub unsafe extern "C" fn mkostemps64(t: *mut c_char, suffix: c_int, flags: c_int) -> c_int {
    make_temp(t, suffix, flags)
}

// ------------------------------------------------------------------ close/dup

fn is_internal(fd: c_int) -> bool {
    mounts::mounts().iter().any(|m| m.attached().is_some_and(|c| c.fds().contains(&fd)))
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if table::TRACKED.load(Ordering::Acquire) > 0 || mounts::any_attached() {
        if let Some(e) = table::enter() {
            if is_internal(fd) {
                // This library's connection or pool descriptor: not the program's.
                set_errno(libc::EBADF);
                return -1;
            }
            if let Some(d) = table::set(fd, None) {
                stats::kernel();
                // A descriptor that could write: the daemon may act on the file
                // next (git sets its times by path), and would wait for this
                // process's lease on it. (Another descriptor of the file that
                // writes again only takes the lock again.)
                if d.access != libc::O_RDONLY {
                    give_back_lease(&d);
                    if d.marker {
                        // The next stat of it by path: from the pool (see
                        // `table::note_closed_writer`).
                        table::note_closed_writer(d.ino);
                        table::with_ctx(|cx| cx.pool_stat.set(true));
                    }
                }
            }
            drop(e);
        }
    }
    forward!(close(fd), -1)
}

/// After a successful dup of `old` to `new`: `new` shares `old`'s description.
fn dup_done(old: c_int, new: c_int) {
    if new < 0 || table::TRACKED.load(Ordering::Acquire) == 0 {
        return;
    }
    if let Some(_e) = table::enter() {
        let d = table::get(old);
        if let Some(d) = d.as_ref().filter(|_| new <= 2) {
            // A direct description made standard input, output or error: glibc's
            // stream of that number (`stdout` when a shell runs `echo one >&3`)
            // writes it with its internal `write`, which moves the kernel's
            // offset, so that offset is the truth from now on. It was not: the
            // next fork handed the description's stale private offset to the
            // kernel, and a child's output went over what `echo` had written.
            crate::sync_desc(new, d);
        }
        table::set(new, d);
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let r = forward!(dup(fd), -1);
    dup_done(fd, r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old != new && mounts::any_attached() && is_internal(new) {
        set_errno(libc::EBUSY);
        return -1;
    }
    let r = forward!(dup2(old, new), -1);
    if old != new {
        dup_done(old, r);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if mounts::any_attached() && is_internal(new) {
        set_errno(libc::EBUSY);
        return -1;
    }
    let r = forward!(dup3(old, new, flags), -1);
    dup_done(old, r);
    r
}

fn fcntl_any(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let r = forward!(fcntl64(fd, cmd, arg), -1);
            dup_done(fd, r);
            r
        }
        libc::F_GETFL | libc::F_SETFL => {
            let Some((e, d, _)) = lookup(fd) else { return forward!(fcntl64(fd, cmd, arg), -1) };
            drop(e);
            if cmd == libc::F_GETFL {
                let r = forward!(fcntl64(fd, cmd, arg), -1);
                let mine = d.flags.load(Ordering::Relaxed) & libc::O_DIRECT != 0;
                if r >= 0 && d.marker && !mine {
                    return r & !libc::O_DIRECT;
                }
                return r;
            }
            let want = arg as c_int;
            let k = if d.marker { want | libc::O_DIRECT } else { want };
            let r = forward!(fcntl64(fd, cmd, k as usize), -1);
            if r >= 0 {
                let settable = libc::O_APPEND
                    | libc::O_NONBLOCK
                    | libc::O_DIRECT
                    | libc::O_NOATIME
                    | libc::O_ASYNC;
                let old = d.flags.load(Ordering::Relaxed);
                d.flags.store((old & !settable) | (want & settable), Ordering::Relaxed);
            }
            r
        }
        libc::F_GETLK
        | libc::F_SETLK
        | libc::F_SETLKW
        | libc::F_OFD_GETLK
        | libc::F_OFD_SETLK
        | libc::F_OFD_SETLKW => record_lock(fd, cmd, arg as *mut libc::flock),
        _ => forward!(fcntl64(fd, cmd, arg), -1),
    }
}

/// A record lock (F_GETLK, F_SETLK, F_SETLKW and their OFD forms). The kernel
/// takes a range relative to the current offset (SEEK_CUR, as `lockf` makes) from
/// its own offset, and one relative to the end (SEEK_END) from its cached size:
/// for a direct file, the offset may be this library's and the size may predate
/// direct writes, so such a range is given to the kernel from the start of the file
/// (SEEK_SET), computed from the description's offset and the pool's size. The
/// caller's struct gets the kernel's answer back as F_GETLK gives it.
fn record_lock(fd: c_int, cmd: c_int, fl: *mut libc::flock) -> c_int {
    let fwd = |p: *mut libc::flock| forward!(fcntl64(fd, cmd, p as usize), -1);
    if fl.is_null() {
        return fwd(fl);
    }
    // SAFETY: the caller's flock (non-null; EFAULT from the kernel otherwise).
    let mut mine = unsafe { *fl };
    let whence = c_int::from(mine.l_whence);
    if whence != libc::SEEK_CUR && whence != libc::SEEK_END {
        return fwd(fl);
    }
    let Some((e, d, c)) = lookup(fd) else { return fwd(fl) };
    let base =
        if whence == libc::SEEK_CUR { ops::tell(&d, fd) } else { ops::attr(c, &d).map(|a| a.size) };
    drop(e);
    let start = match base.map(|b| (b as i64).checked_add(mine.l_start)) {
        Ok(Some(v)) => v,
        Ok(None) => {
            set_errno(libc::EOVERFLOW);
            return -1;
        }
        Err(err) => {
            set_errno(err);
            return -1;
        }
    };
    mine.l_whence = libc::SEEK_SET as libc::c_short;
    mine.l_start = start;
    let r = fwd(&mut mine);
    let getlk = cmd == libc::F_GETLK || cmd == libc::F_OFD_GETLK;
    if r == 0 && getlk {
        // SAFETY: as above. Linux rewrites the whole struct only for a conflict.
        unsafe {
            if mine.l_type == libc::F_UNLCK as libc::c_short {
                (*fl).l_type = mine.l_type;
            } else {
                *fl = mine;
            }
        }
    }
    r
}

/// lockf(3), as glibc makes it (a record lock from the current offset), through
/// [`record_lock`]: glibc's own calls fcntl inside itself, where this library
/// cannot see it.
#[no_mangle]
pub unsafe extern "C" fn lockf(fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    const F_ULOCK: c_int = 0;
    const F_LOCK: c_int = 1;
    const F_TLOCK: c_int = 2;
    const F_TEST: c_int = 3;
    // SAFETY: a zeroed flock is valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_whence = libc::SEEK_CUR as libc::c_short;
    fl.l_len = len;
    let (ty, op) = match cmd {
        F_TEST => (libc::F_RDLCK, libc::F_GETLK),
        F_ULOCK => (libc::F_UNLCK, libc::F_SETLK),
        F_LOCK => (libc::F_WRLCK, libc::F_SETLKW),
        F_TLOCK => (libc::F_WRLCK, libc::F_SETLK),
        _ => {
            set_errno(libc::EINVAL);
            return -1;
        }
    };
    fl.l_type = ty as libc::c_short;
    let r = record_lock(fd, op, &mut fl);
    if cmd != F_TEST || r < 0 {
        return r;
    }
    // SAFETY: getpid cannot fail.
    if fl.l_type == libc::F_UNLCK as libc::c_short || fl.l_pid == unsafe { libc::getpid() } {
        0
    } else {
        set_errno(libc::EACCES);
        -1
    }
}

#[no_mangle]
pub unsafe extern "C" fn lockf64(fd: c_int, cmd: c_int, len: off64_t) -> c_int {
    unsafe { lockf(fd, cmd, len) }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_any(fd, cmd, arg)
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_any(fd, cmd, arg)
}

/// Close `[first, last]` except this library's own descriptors.
fn close_span(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let internal: Vec<c_uint> = {
        let Some(_e) = table::enter() else { return forward!(close_range(first, last, flags), -1) };
        if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
            for (fd, _) in table::all() {
                if (first..=last).contains(&(fd as c_uint)) {
                    table::set(fd, None);
                }
            }
        }
        let mut v: Vec<c_uint> = mounts::mounts()
            .iter()
            .filter_map(|m| m.attached())
            .flat_map(|c| c.fds())
            .map(|fd| fd as c_uint)
            .filter(|fd| (first..=last).contains(fd))
            .collect();
        v.sort_unstable();
        v
    };
    let mut lo = first;
    for fd in internal {
        if fd > lo {
            let r = forward!(close_range(lo, fd - 1, flags), -1);
            if r < 0 {
                return r;
            }
        }
        lo = fd + 1;
    }
    if lo <= last && lo >= first {
        return forward!(close_range(lo, last, flags), -1);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if first > last {
        set_errno(libc::EINVAL);
        return -1;
    }
    close_span(first, last, flags)
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    if low >= 0 {
        let _ = close_span(low as c_uint, c_uint::MAX, 0);
    }
}

// ------------------------------------------------------------------- data

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's buffer of n bytes.
    let b = |d: &Desc| unsafe { user_buf(buf, n, mode_ok(d.readable(), 0)) };
    match direct(fd, |d, c| ops::read(c, d, fd, b(d)?)) {
        Some(r) => ss(r),
        None => forward!(read(fd, buf, n), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    // SAFETY: the caller's buffer of n bytes (only read).
    let b = |d: &Desc| unsafe { user_buf(buf, n, mode_ok(d.writable(), 0)) };
    match direct(fd, |d, c| ops::write(c, d, fd, b(d)?)) {
        Some(r) => ss(r),
        None => forward!(write(fd, buf, n), -1),
    }
}

/// Write all `n` bytes at `buf` with [`write`], as a C library stream does;
/// the count written (short only at an error, whose errno stays set).
///
/// # Safety
/// `buf` points to `n` readable bytes.
pub(crate) unsafe fn write_all(fd: c_int, buf: *const c_void, n: size_t) -> size_t {
    let mut done = 0;
    while done < n {
        // SAFETY: the rest of the caller's n bytes.
        let r = unsafe { write(fd, buf.cast::<u8>().add(done).cast(), n - done) };
        if r <= 0 {
            break;
        }
        done += r as usize;
    }
    done
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    // SAFETY: the caller's buffer of n bytes.
    let b = |d: &Desc| unsafe { user_buf(buf, n, mode_ok(d.readable(), off)) };
    match direct(fd, |d, c| ops::pread(c, d, b(d)?, off)) {
        Some(r) => ss(r),
        None => forward!(pread64(fd, buf, n, off), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn pread64(fd: c_int, buf: *mut c_void, n: size_t, off: off64_t) -> ssize_t {
    unsafe { pread(fd, buf, n, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(fd: c_int, buf: *const c_void, n: size_t, off: off64_t) -> ssize_t {
    // SAFETY: the caller's buffer of n bytes (only read).
    let b = |d: &Desc| unsafe { user_buf(buf, n, mode_ok(d.writable(), off)) };
    match direct(fd, |d, c| ops::pwrite(c, d, b(d)?, off)) {
        Some(r) => ss(r),
        None => forward!(pwrite64(fd, buf, n, off), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    off: off64_t,
) -> ssize_t {
    unsafe { pwrite(fd, buf, n, off) }
}

fn readv_at(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: Option<off64_t>,
    flags: c_int,
) -> Option<R<usize>> {
    direct(fd, |d, c| {
        // SAFETY: the caller's iovec array.
        let v = unsafe { iovs(iov, cnt) }?;
        // As Linux: the mode, then an empty read succeeds, then the flags.
        if !d.readable() {
            return Err(libc::EBADF);
        }
        let len = iov_len(v)?;
        if len == 0 {
            return Ok(Do::Done(0));
        }
        ops::rw_flags(flags)?;
        // (Linux moves at most MAX_RW_COUNT bytes per call.)
        let mut buf = vec![0u8; len.min(ferrite_direct::MAX_RW_COUNT)];
        let r = match off {
            Some(o) if o != -1 => ops::pread(c, d, &mut buf, o)?,
            _ => ops::read(c, d, fd, &mut buf)?,
        };
        Ok(match r {
            Do::Done(n) => {
                scatter(v, &buf[..n]);
                Do::Done(n)
            }
            Do::KernelDone(n) => {
                scatter(v, &buf[..n]);
                Do::KernelDone(n)
            }
            Do::Kernel => Do::Kernel,
        })
    })
}

fn writev_at(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: Option<off64_t>,
    flags: c_int,
) -> Option<R<usize>> {
    direct(fd, |d, c| {
        // SAFETY: the caller's iovec array.
        let v = unsafe { iovs(iov, cnt) }?;
        let data = gather(v)?;
        // As Linux: the mode, then an empty write succeeds, then the flags.
        if !d.writable() {
            return Err(libc::EBADF);
        }
        if data.is_empty() {
            return Ok(Do::Done(0));
        }
        let append = ops::rw_flags(flags)?.unwrap_or_else(|| d.append());
        match off {
            Some(o) if o != -1 => ops::pwrite_mode(c, d, &data, o, append),
            _ => ops::write_mode(c, d, fd, &data, append),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    match readv_at(fd, iov, cnt, None, 0) {
        Some(r) => ss(r),
        None => forward!(readv(fd, iov, cnt), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, cnt: c_int) -> ssize_t {
    match writev_at(fd, iov, cnt, None, 0) {
        Some(r) => ss(r),
        None => forward!(writev(fd, iov, cnt), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn preadv(fd: c_int, iov: *const iovec, cnt: c_int, off: off64_t) -> ssize_t {
    if off < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    match readv_at(fd, iov, cnt, Some(off), 0) {
        Some(r) => ss(r),
        None => forward!(preadv64(fd, iov, cnt, off), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    unsafe { preadv(fd, iov, cnt, off) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    if off < 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    match writev_at(fd, iov, cnt, Some(off), 0) {
        Some(r) => ss(r),
        None => forward!(pwritev64(fd, iov, cnt, off), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
) -> ssize_t {
    unsafe { pwritev(fd, iov, cnt, off) }
}

#[no_mangle]
pub unsafe extern "C" fn preadv2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    // An offset below -1 (the descriptor's) before anything else, as Linux.
    if off < -1 {
        set_errno(libc::EINVAL);
        return -1;
    }
    match readv_at(fd, iov, cnt, Some(off), flags) {
        Some(r) => ss(r),
        None => forward!(preadv64v2(fd, iov, cnt, off, flags), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn preadv64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    unsafe { preadv2(fd, iov, cnt, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    // An offset below -1 (the descriptor's) before anything else, as Linux.
    if off < -1 {
        set_errno(libc::EINVAL);
        return -1;
    }
    match writev_at(fd, iov, cnt, Some(off), flags) {
        Some(r) => ss(r),
        None => forward!(pwritev64v2(fd, iov, cnt, off, flags), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64v2(
    fd: c_int,
    iov: *const iovec,
    cnt: c_int,
    off: off64_t,
    flags: c_int,
) -> ssize_t {
    unsafe { pwritev2(fd, iov, cnt, off, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    match direct(fd, |d, c| ops::lseek(c, d, fd, off, whence)) {
        Some(Ok(n)) => n,
        Some(Err(e)) => {
            set_errno(e);
            -1
        }
        None => forward!(lseek64(fd, off, whence), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, off: off64_t, whence: c_int) -> off64_t {
    unsafe { lseek(fd, off, whence) }
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    match direct(fd, |d, _| ops::sync(d)) {
        Some(r) => int(r),
        None => forward!(fsync(fd), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    match direct(fd, |d, _| ops::sync(d)) {
        Some(r) => int(r),
        None => forward!(fdatasync(fd), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn sync_file_range(
    fd: c_int,
    off: off64_t,
    n: off64_t,
    flags: c_uint,
) -> c_int {
    match direct(fd, |d, _| ops::sync(d)) {
        Some(r) => int(r),
        None => forward!(sync_file_range(fd, off, n, flags), -1),
    }
}

// ------------------------------------------- calls the daemon serves on a fd

/// Before a call on `fd` that the daemon serves (times, mode, owner, extended
/// attributes): give back this process's lease on the file, which the daemon
/// would wait for until the lease keeper's next tick (up to 2 ms; `cp -a` sets
/// each copy's times and mode through its descriptor right after writing it).
fn yield_lease(fd: c_int) {
    if table::TRACKED.load(Ordering::Acquire) == 0 {
        return;
    }
    if let Some(_e) = table::enter() {
        if let Some(d) = table::get(fd) {
            give_back_lease(&d);
        }
    }
}

/// Give back this process's lease on `d`'s file, if it holds one.
fn give_back_lease(d: &Desc) {
    if let Some(c) = d.mount.attached() {
        // A hint only: a panic here must not unwind into the program.
        let _ = catch_unwind(AssertUnwindSafe(|| c.fs().give_back_lease(d.ino)));
    }
}

/// A change of `fd`'s file served here (`f`: the pool's when the core can judge
/// it) or else by `kernel`, after this process gives its lease back (the daemon
/// makes that change, under the file's lock).
fn owned_or_kernel(
    fd: c_int,
    f: impl FnOnce(&Desc, &'static Client) -> R<Do<i32>>,
    kernel: impl FnOnce() -> c_int,
) -> c_int {
    match direct(fd, f) {
        Some(r) => int(r),
        None => {
            yield_lease(fd);
            kernel()
        }
    }
}

/// A change of mode, owner or times on `fd` (`ops::chattr`), else `kernel`.
fn chattr(
    fd: c_int,
    ch: impl FnOnce() -> R<ferrite_core::SetAttr>,
    kernel: impl FnOnce() -> c_int,
) -> c_int {
    owned_or_kernel(fd, |d, c| ops::chattr(c, d, &ch()?), kernel)
}

#[no_mangle]
pub unsafe extern "C" fn futimens(fd: c_int, times: *const libc::timespec) -> c_int {
    let t = if times.is_null() {
        None
    } else {
        // SAFETY: futimens takes two timespecs at a non-null `times`.
        Some(unsafe { [times.read(), times.add(1).read()] })
    };
    let kernel = || forward!(futimens(fd, times), -1);
    // Both UTIME_OMIT: Linux returns 0 before it looks at the descriptor.
    if t.is_some_and(|t| t.iter().all(|t| t.tv_nsec == libc::UTIME_OMIT)) {
        return kernel();
    }
    chattr(fd, || ops::times_change(t), kernel)
}

#[no_mangle]
pub unsafe extern "C" fn fchmod(fd: c_int, mode: libc::mode_t) -> c_int {
    let ch = || Ok(ferrite_core::SetAttr { perm: Some(mode & 0o7777), ..Default::default() });
    chattr(fd, ch, || forward!(fchmod(fd, mode), -1))
}

#[no_mangle]
pub unsafe extern "C" fn fchown(fd: c_int, uid: libc::uid_t, gid: libc::gid_t) -> c_int {
    let id = |v: u32| (v != u32::MAX).then_some(v);
    let ch = || Ok(ferrite_core::SetAttr { uid: id(uid), gid: id(gid), ..Default::default() });
    chattr(fd, ch, || forward!(fchown(fd, uid, gid), -1))
}

#[no_mangle]
pub unsafe extern "C" fn fsetxattr(
    fd: c_int,
    name: *const c_char,
    value: *const c_void,
    size: usize,
    flags: c_int,
) -> c_int {
    // An access ACL that says no more than a mode, as `cp -a` sets on every copy.
    // SAFETY: fsetxattr takes a C string `name` and `size` bytes at `value`.
    let acl = flags == 0
        && !name.is_null()
        && (size == 0 || !value.is_null())
        && unsafe { CStr::from_ptr(name) }.to_bytes() == ferrite_core::acl::ACCESS;
    let kernel = || forward!(fsetxattr(fd, name, value, size, flags), -1);
    if !acl || size > 4 + 8 * 64 {
        yield_lease(fd);
        return kernel();
    }
    let v = if size == 0 {
        &[][..]
    } else {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }
    };
    owned_or_kernel(fd, |d, c| ops::set_access_acl(c, d, v), kernel)
}

#[no_mangle]
pub unsafe extern "C" fn fremovexattr(fd: c_int, name: *const c_char) -> c_int {
    yield_lease(fd);
    forward!(fremovexattr(fd, name), -1)
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off64_t) -> c_int {
    match direct(fd, |d, c| ops::ftruncate(c, d, fd, len)) {
        Some(r) => int(r),
        None => forward!(ftruncate64(fd, len), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    unsafe { ftruncate(fd, len) }
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    match direct(fd, |d, c| ops::fallocate(c, d, fd, mode, off, len)) {
        Some(r) => int(r),
        None => forward!(fallocate64(fd, mode, off, len), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(fd: c_int, mode: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { fallocate(fd, mode, off, len) }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    // Returns the error number; errno is left alone.
    match direct(fd, |d, c| ops::fallocate(c, d, fd, 0, off, len)) {
        Some(Ok(_)) => 0,
        Some(Err(e)) => e,
        None => forward!(posix_fallocate64(fd, off, len), libc::ENOSYS),
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, off: off64_t, len: off64_t) -> c_int {
    unsafe { posix_fallocate(fd, off, len) }
}

// ------------------------------------------------------------------- stat

fn fill_stat(dev: u64, a: &ferrite_core::Attr, st: &mut libc::stat64) {
    // SAFETY: zeroed stat64 is valid.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = dev;
    st.st_ino = a.ino;
    st.st_mode = a.mode();
    st.st_nlink = a.nlink as _;
    st.st_uid = a.uid;
    st.st_gid = a.gid;
    let (major, minor) = a.rdev_parts();
    st.st_rdev = libc::makedev(major, minor);
    st.st_size = a.size as i64;
    st.st_blksize = 4096;
    st.st_blocks = a.blocks as i64;
    st.st_atime = a.atime.sec;
    st.st_atime_nsec = a.atime.nsec as i64;
    st.st_mtime = a.mtime.sec;
    st.st_mtime_nsec = a.mtime.nsec as i64;
    st.st_ctime = a.ctime.sec;
    st.st_ctime_nsec = a.ctime.nsec as i64;
}

fn fstat_direct(fd: c_int, st: *mut libc::stat64) -> Option<c_int> {
    if st.is_null() {
        return None;
    }
    let r = direct(fd, |d, c| {
        let a = ops::attr(c, d)?;
        // SAFETY: the caller's stat buffer (checked non-null).
        fill_stat(d.dev, &a, unsafe { &mut *st });
        Ok(Do::Done(0))
    })?;
    Some(int(r))
}

#[no_mangle]
pub unsafe extern "C" fn fstat(fd: c_int, st: *mut libc::stat64) -> c_int {
    match fstat_direct(fd, st) {
        Some(r) => r,
        None => forward!(fstat64(fd, st), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fstat64(fd: c_int, st: *mut libc::stat64) -> c_int {
    unsafe { fstat(fd, st) }
}

unsafe fn empty_path(path: *const c_char, flags: c_int) -> bool {
    // SAFETY: a non-null C string from the caller.
    flags & libc::AT_EMPTY_PATH != 0 && (path.is_null() || unsafe { *path } == 0)
}

#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's path.
    if unsafe { empty_path(path, flags) } {
        if let Some(r) = fstat_direct(dirfd, st) {
            return r;
        }
    } else if !st.is_null() {
        if let Some((dev, a, _)) = stat_path_pool(dirfd, path, flags) {
            // SAFETY: the caller's stat buffer (checked non-null).
            fill_stat(dev, &a, unsafe { &mut *st });
            return 0;
        }
        let r = forward!(fstatat64(dirfd, path, st, flags), -1);
        if r == 0 {
            // SAFETY: filled by the kernel (checked non-null).
            let s = unsafe { &*st };
            note_kernel_stat(s.st_dev, s.st_ino, s.st_mode);
        }
        return r;
    }
    forward!(fstatat64(dirfd, path, st, flags), -1)
}

/// stat(2): the C library's `stat` calls its internal `fstatat`, which this
/// library cannot see, so it is defined here.
#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { fstatat(libc::AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { fstatat(libc::AT_FDCWD, path, st, 0) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { fstatat(libc::AT_FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, st: *mut libc::stat64) -> c_int {
    unsafe { fstatat(libc::AT_FDCWD, path, st, libc::AT_SYMLINK_NOFOLLOW) }
}

#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { fstatat(dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn newfstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat64,
    flags: c_int,
) -> c_int {
    unsafe { fstatat(dirfd, path, st, flags) }
}

#[no_mangle]
pub unsafe extern "C" fn statx(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mask: c_uint,
    stx: *mut libc::statx,
) -> c_int {
    // SAFETY: the caller's path.
    if !stx.is_null() && unsafe { empty_path(path, flags) } {
        let r = direct(dirfd, |d, c| {
            let a = ops::attr(c, d)?;
            // SAFETY: the caller's statx buffer (checked non-null).
            fill_statx(d.dev, &a, &d.look, unsafe { &mut *stx });
            Ok(Do::Done(0))
        });
        if let Some(r) = r {
            return int(r);
        }
    } else if !stx.is_null() {
        if let Some((dev, a, look)) = stat_path_pool(dirfd, path, flags) {
            // SAFETY: the caller's statx buffer (checked non-null).
            fill_statx(dev, &a, &look, unsafe { &mut *stx });
            return 0;
        }
        let r = forward!(statx(dirfd, path, flags, mask, stx), -1);
        // SAFETY: filled by the kernel (checked non-null).
        let s = unsafe { &*stx };
        if r == 0 && s.stx_mask & (libc::STATX_TYPE | libc::STATX_INO) != 0 {
            let dev = libc::makedev(s.stx_dev_major, s.stx_dev_minor);
            note_kernel_stat(dev, s.stx_ino, s.stx_mode as u32);
        }
        return r;
    }
    forward!(statx(dirfd, path, flags, mask, stx), -1)
}

/// A statx from the pool's attributes `a`, and the kernel's `look` for what only
/// the kernel knows.
fn fill_statx(dev: u64, a: &ferrite_core::Attr, look: &table::KernelLook, s: &mut libc::statx) {
    // SAFETY: zeroed statx is valid.
    *s = unsafe { std::mem::zeroed() };
    s.stx_mask = libc::STATX_BASIC_STATS | look.mask;
    s.stx_attributes = look.attributes;
    s.stx_attributes_mask = look.attributes_mask;
    s.stx_mnt_id = look.mnt_id;
    s.stx_blksize = 4096;
    s.stx_nlink = a.nlink;
    s.stx_uid = a.uid;
    s.stx_gid = a.gid;
    s.stx_mode = a.mode() as u16;
    s.stx_ino = a.ino;
    s.stx_size = a.size;
    s.stx_blocks = a.blocks;
    let ts = |t: ferrite_core::Ts| {
        // SAFETY: zeroed statx_timestamp is valid (its padding included).
        let mut x: libc::statx_timestamp = unsafe { std::mem::zeroed() };
        x.tv_sec = t.sec;
        x.tv_nsec = t.nsec;
        x
    };
    s.stx_atime = ts(a.atime);
    s.stx_mtime = ts(a.mtime);
    s.stx_ctime = ts(a.ctime);
    s.stx_dev_major = libc::major(dev);
    s.stx_dev_minor = libc::minor(dev);
}

/// The attributes of the regular file at `path` (`AT_*` `flags`) when it lies on
/// a mount whose pool this process has attached, with its device number; `None`
/// sends the call to the kernel as before.
///
/// The kernel walks the path from its caches without asking the daemon for the
/// file's attributes (AT_STATX_DONT_SYNC: the walk itself, and every error, is the
/// kernel's as usual), and the attributes come from the pool, where they are never
/// stale. A file a direct-access client writes has its attributes sent with no
/// time-to-live and dropped from the kernel's cache at the writer's release, so the
/// kernel's next stat of it asks the daemon, a round trip (about 14 us on this
/// machine type, where a stat from the caches takes 2). A file no client has open
/// for writing ([`ferrite_core::share::WRITERS`]) and this process has not loaded
/// is left to the kernel, whose attributes of it are current then.
///
/// Which goes first is guessed per thread from its last stat by path: a look first
/// (this) after a file the pool served, the kernel first otherwise, and
/// [`note_kernel_stat`] tells from the kernel's answer whether the pool would have
/// served it. Either order answers correctly (the daemon's answers are caught up
/// with every client's commits); the guess only saves calls. A walk over a tree
/// (find, git status, a build's stats) made two system calls per entry, the look
/// and the kernel's stat, at 1.8 times the plain mount's time; it makes one now.
/// A stat of a file a client writes, after kernel-served ones, pays the round
/// trip a plain process would.
fn stat_path_pool(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
) -> Option<(u64, Attr, table::KernelLook)> {
    let first = table::with_ctx(|cx| cx.pool_stat.get()).unwrap_or(false);
    if !first {
        return None;
    }
    let r = path_attr(dirfd, path, flags);
    if r.is_none() {
        table::with_ctx(|cx| cx.pool_stat.set(false));
    }
    r
}

/// The kernel answered a stat by path with this file: would the pool have served
/// it (a regular file of an attached mount that this process loaded, or that a
/// client has open for writing)? Then the thread's next stat by path looks first.
fn note_kernel_stat(dev: u64, ino: u64, mode: u32) {
    if mode & libc::S_IFMT != libc::S_IFREG || ino >= ferrite_direct::ALT_NODE_BASE {
        return;
    }
    // A file of no attached mount (most stats of most programs) enters nothing.
    let Some(c) = mounts::attached_for_dev(dev) else { return };
    let Some(_e) = table::enter() else { return };
    let served = c.usable() && pool_serves(c, ino);
    if served {
        table::with_ctx(|cx| cx.pool_stat.set(true));
    }
}

/// Does the pool answer a stat by path of regular file `ino` (one this process
/// loaded, one a client has open for writing, or one this process lately closed
/// for writing), rather than the kernel?
fn pool_serves(c: &Client, ino: u64) -> bool {
    c.fs().is_loaded(ino) || c.party().writers_open(ino) || table::closed_writer(ino)
}

/// The look: the file's type, inode and device from the kernel's caches, then its
/// attributes from the pool when the pool serves it (see [`stat_path_pool`]).
fn path_attr(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
) -> Option<(u64, Attr, table::KernelLook)> {
    if path.is_null() || table::inside() || flags & libc::AT_STATX_FORCE_SYNC != 0 {
        return None;
    }
    crate::init();
    if mounts::mounts().is_empty() {
        return None;
    }
    // SAFETY: a non-null C string from the caller.
    let p = unsafe { CStr::from_ptr(path) };
    // An absolute path names its mount; a relative one is looked at (this is only
    // reached after a stat the pool served), and the device found tells the mount.
    let absolute = p.to_bytes().first() == Some(&b'/');
    if absolute && mounts::for_path(p.to_bytes()).is_none() {
        return None;
    }
    let _e = table::enter()?;
    let st = real::statx_at_cached(dirfd, p, flags & libc::AT_SYMLINK_NOFOLLOW).ok()?;
    let dev = libc::makedev(st.stx_dev_major, st.stx_dev_minor);
    if st.stx_mode as u32 & libc::S_IFMT != libc::S_IFREG {
        return None; // only regular files change under the kernel's cache
    }
    let c = mounts::attached_for_dev(dev).filter(|c| c.usable())?;
    if st.stx_ino >= ferrite_direct::ALT_NODE_BASE {
        return None;
    }
    if !pool_serves(c, st.stx_ino) {
        // No client writes it, so the kernel's attributes are current (or dropped
        // at the last writer's release, and asked for again): let the kernel answer
        // rather than load the inode here (a walk of its log and an index that a
        // tree walk would build for every file, at twice the plain mount's time).
        return None;
    }
    let a = c.fs().getattr(st.stx_ino).ok()?;
    if a.ftype != ferrite_core::FileType::Regular {
        return None;
    }
    stats::direct();
    Some((dev, a, table::KernelLook::of(&st)))
}

// ------------------------------------------------------------------ copies

/// A descriptor this library serves, with its client (None: the kernel's).
type DirectSide = Option<(Arc<Desc>, &'static Client)>;

/// The source and destination of a copy, with this library entered; None when it
/// tracks nothing or is already inside itself (the call goes to the kernel).
fn two_sides(fd_in: c_int, fd_out: c_int) -> Option<(table::Entered, DirectSide, DirectSide)> {
    if table::TRACKED.load(Ordering::Acquire) == 0 {
        return None;
    }
    let e = table::enter()?;
    Some((e, side(fd_in), side(fd_out)))
}

fn side(fd: c_int) -> DirectSide {
    let d = table::get(fd)?;
    let c = d.mount.client()?;
    c.usable().then_some((d, c))
}

/// ioctl: FICLONE and FICLONERANGE between two direct files of one pool are
/// reflinks in the core (the kernel's FUSE client refuses them); every other
/// request, and every other pair of descriptors, goes to the C library unchanged.
/// (Defined with one integer argument, as the C library's variadic one is called.)
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: libc::Ioctl, arg: usize) -> c_int {
    let fwd = || forward!(ioctl(fd, request, arg), -1);
    if request == libc::FIONREAD && table::TRACKED.load(Ordering::Acquire) != 0 {
        // The bytes left after the offset, as Linux computes them for a regular
        // file (from this library's offset and the pool's size: the kernel's are
        // stale for a direct file).
        let left = |d: &Desc, c: &'static Client| {
            Ok(Do::Done(ops::attr(c, d)?.size as i64 - ops::tell(d, fd)? as i64))
        };
        match direct(fd, left) {
            Some(Ok(n)) if arg != 0 => {
                // SAFETY: FIONREAD's argument is the caller's int.
                unsafe { std::ptr::write_unaligned(arg as *mut c_int, n as c_int) };
                return 0;
            }
            Some(Ok(_)) => {
                set_errno(libc::EFAULT);
                return -1;
            }
            Some(Err(err)) => {
                set_errno(err);
                return -1;
            }
            None => return fwd(),
        }
    }
    let clone = request == libc::FICLONE || request == libc::FICLONERANGE;
    if !clone || table::TRACKED.load(Ordering::Acquire) == 0 {
        return fwd();
    }
    let (src_fd, off_in, len, off_out) = if request == libc::FICLONE {
        (arg as c_int, 0, 0, 0)
    } else {
        if arg == 0 {
            set_errno(libc::EFAULT);
            return -1;
        }
        // SAFETY: FICLONERANGE's argument is the caller's `struct file_clone_range`.
        let r = unsafe { std::ptr::read_unaligned(arg as *const libc::file_clone_range) };
        if r.src_offset > i64::MAX as u64 || r.dest_offset > i64::MAX as u64 {
            set_errno(libc::EINVAL);
            return -1;
        }
        (r.src_fd as c_int, r.src_offset, r.src_length, r.dest_offset)
    };
    let Some(e) = table::enter() else { return fwd() };
    let (Some((s, c)), Some((d, c2))) = (side(src_fd), side(fd)) else {
        // A kernel side: the kernel answers (EXDEV across file systems,
        // EOPNOTSUPP from the mount).
        drop(e);
        return fwd();
    };
    if !std::ptr::eq(c, c2) {
        set_errno(libc::EXDEV);
        return -1;
    }
    let r = catch_unwind(AssertUnwindSafe(|| ops::clone(c, &s, &d, off_in, len, off_out)))
        .unwrap_or(Err(libc::EIO));
    match r {
        Ok(Do::Done(_)) | Ok(Do::KernelDone(_)) => {
            stats::direct();
            0
        }
        Ok(Do::Kernel) => {
            drop(e);
            fwd()
        }
        Err(x) => {
            set_errno(x);
            -1
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn copy_file_range(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    let fwd = || forward!(copy_file_range(fd_in, off_in, fd_out, off_out, len, flags), -1);
    let Some((e, a, b)) = two_sides(fd_in, fd_out) else { return fwd() };
    if a.is_none() || b.is_none() {
        // Not between two direct files: the kernel checks and copies (through the
        // daemon), once it knows the direct side's current size. Between file
        // systems it copies nothing (EXDEV: FUSE copies only within its mount), so
        // the size need not be asked for: `cp` tries this for every file before it
        // reads and writes, and paid a round trip to the daemon each time.
        let dev = |s: &DirectSide, fd| match s {
            Some((d, _)) => Some(d.dev),
            None => real::dev_of(fd),
        };
        if dev(&a, fd_in).zip(dev(&b, fd_out)).is_none_or(|(x, y)| x == y) {
            for (side, fd) in [(&a, fd_in), (&b, fd_out)] {
                if let Some((d, _)) = side {
                    d.kernel_io.store(true, Ordering::Relaxed);
                    real::refresh_kernel_attrs(fd);
                    stats::kernel();
                }
            }
        }
        drop(e);
        let sides = [(&a, fd_in, off_in.is_null()), (&b, fd_out, off_out.is_null())];
        return with_kernel_offsets(&sides, fwd);
    }
    if flags != 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's optional offsets.
    let (mut oi, mut oo) = unsafe {
        (
            (!off_in.is_null()).then(|| (*off_in).max(0) as u64),
            (!off_out.is_null()).then(|| (*off_out).max(0) as u64),
        )
    };
    // The kernel's checks, in its order: access modes, offsets that wrap, then
    // negative offsets.
    let readable = a.as_ref().is_none_or(|(d, _)| d.readable());
    let writable = b.as_ref().is_none_or(|(d, _)| d.writable() && !d.append());
    if !readable || !writable {
        set_errno(libc::EBADF);
        return -1;
    }
    // (Linux adds the count to the offsets as unsigned numbers: a negative offset
    // wraps unless the count is 0.)
    // SAFETY: the caller's offsets, read where non-null.
    let (ri, ro) =
        unsafe { ((!off_in.is_null()).then(|| *off_in), (!off_out.is_null()).then(|| *off_out)) };
    let wraps = |o: Option<i64>| o.is_some_and(|o| (o as u64).checked_add(len as u64).is_none());
    if wraps(ri) || wraps(ro) {
        set_errno(libc::EOVERFLOW);
        return -1;
    }
    if ri.is_some_and(|o| o < 0) || ro.is_some_and(|o| o < 0) {
        set_errno(libc::EINVAL);
        return -1;
    }
    let src = match &a {
        Some((d, c)) => Side::Direct(c, d, fd_in),
        None => Side::Kernel(fd_in),
    };
    let dst = match &b {
        Some((d, c)) => Side::Direct(c, d, fd_out),
        None => Side::Kernel(fd_out),
    };
    // Both files are direct, maybe one file (the kernel's cached size of a file
    // this process writes directly can be stale, so the kernel could not be asked
    // to copy inside it). An offset the call was not given is the description's
    // own: read now, and set after to where the copy ended.
    let r = catch_unwind(AssertUnwindSafe(|| {
        let at = |s: &DirectSide, fd, o: Option<u64>| match (o, s) {
            (Some(v), _) => Ok(v),
            (None, Some((d, _))) => ops::tell(d, fd),
            (None, None) => Ok(real::lseek(fd, 0, libc::SEEK_CUR)? as u64),
        };
        let (mut pi, mut po) = (at(&a, fd_in, oi)?, at(&b, fd_out, oo)?);
        if let (Some((x, c)), Some((y, _))) = (&a, &b) {
            if x.ino == y.ino {
                // Within one file, as Linux: the count cut at the end of file, then
                // overlapping ranges are EINVAL.
                let size = ops::attr(c, x)?.size;
                let count = if pi >= size { 0 } else { (len as u64).min(size - pi) };
                if po < pi + count && pi < po + count {
                    return Err(libc::EINVAL);
                }
            }
        }
        let n = ops::copy(&src, Some(&mut pi), &dst, Some(&mut po), len)?;
        for (side, fd, given, end) in [(&a, fd_in, oi, pi), (&b, fd_out, oo, po)] {
            match (given, side) {
                (Some(_), _) => {}
                (None, Some((d, _))) => ops::set_pos(d, fd, end)?,
                (None, None) => _ = real::lseek(fd, end as i64, libc::SEEK_SET)?,
            }
        }
        oi = oi.map(|_| pi);
        oo = oo.map(|_| po);
        Ok(n)
    }))
    .unwrap_or(Err(libc::EIO));
    if r.is_ok() {
        // SAFETY: the caller's offsets, non-null where written.
        unsafe {
            if let Some(v) = oi {
                *off_in = v as off64_t;
            }
            if let Some(v) = oo {
                *off_out = v as off64_t;
            }
        }
    }
    stats::direct();
    ss(r)
}

/// splice: the kernel moves the bytes, from and to its page cache. For a direct
/// file, the file's writes go through the kernel from then on (as for a mapping
/// through the kernel: its page cache holds the file), the kernel is made to ask
/// the daemon for the size (which direct writes leave stale), and a private
/// description's offset is handed to the kernel for the call and taken back after.
#[no_mangle]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut off64_t,
    fd_out: c_int,
    off_out: *mut off64_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    let fwd = || forward!(splice(fd_in, off_in, fd_out, off_out, len, flags), -1);
    let Some((e, a, b)) = two_sides(fd_in, fd_out) else { return fwd() };
    if a.is_none() && b.is_none() {
        drop(e);
        return fwd();
    }
    for (s, fd) in [(&a, fd_in), (&b, fd_out)] {
        if let Some((d, c)) = s {
            c.note_kernel_mapping(d.ino);
            d.kernel_io.store(true, Ordering::Relaxed);
            real::refresh_kernel_attrs(fd);
            stats::kernel();
        }
    }
    drop(e);
    let sides = [(&a, fd_in, off_in.is_null()), (&b, fd_out, off_out.is_null())];
    with_kernel_offsets(&sides, fwd)
}

/// Runs `f`, a call forwarded to the kernel that uses and moves the offsets of
/// the descriptors in `sides` whose flag is set (those the call was given no
/// offset for). A private description's offset lives here, not in the kernel: the
/// kernel's is set from it before the call and read back after, under its lock
/// (taken in address order).
fn with_kernel_offsets(
    sides: &[(&DirectSide, c_int, bool)],
    f: impl FnOnce() -> ssize_t,
) -> ssize_t {
    let mut private: Vec<(&Arc<Desc>, c_int)> = sides
        .iter()
        .filter(|(_, _, moves)| *moves)
        .filter_map(|(s, fd, _)| s.as_ref().map(|(d, _)| (d, *fd)))
        .filter(|(d, _)| !d.shared.load(Ordering::Acquire))
        .collect();
    private.sort_by_key(|(d, _)| Arc::as_ptr(d));
    private.dedup_by_key(|(d, _)| Arc::as_ptr(d));
    let mut held = Vec::with_capacity(private.len());
    for (d, fd) in private {
        // Shared since the filter: the kernel's offset is the truth already.
        let Some(p) = d.private_pos() else { continue };
        if real::lseek(fd, *p as i64, libc::SEEK_SET).is_ok() {
            held.push((p, fd));
        }
    }
    let r = f();
    let err = real::errno();
    for (mut p, fd) in held {
        if let Ok(v) = real::lseek(fd, 0, libc::SEEK_CUR) {
            *p = v as u64;
        }
    }
    set_errno(err);
    r
}

/// What a descriptor may do: (read, write, O_APPEND); from the table for a
/// direct one, from the kernel for another (an O_PATH descriptor does neither).
fn access_of(s: &DirectSide, fd: c_int) -> R<(bool, bool, bool)> {
    if let Some((d, _)) = s {
        return Ok((d.readable(), d.writable(), d.append()));
    }
    let fl = real::fcntl(fd, libc::F_GETFL, 0)?;
    if fl & libc::O_PATH != 0 {
        return Ok((false, false, false));
    }
    let acc = fl & libc::O_ACCMODE;
    Ok((acc != libc::O_WRONLY, acc != libc::O_RDONLY, fl & libc::O_APPEND != 0))
}

#[no_mangle]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    off: *mut off64_t,
    count: size_t,
) -> ssize_t {
    let fwd = || forward!(sendfile64(out_fd, in_fd, off, count), -1);
    let Some((e, a, b)) = two_sides(in_fd, out_fd) else { return fwd() };
    if a.is_none() && b.is_none() {
        drop(e);
        return fwd();
    }
    // SAFETY: the caller's optional offset.
    let mut oi = unsafe { (!off.is_null()).then(|| *off) };
    // Linux's checks, in its order (before anything moves): the source's mode, its
    // offset, the destination's mode, and no appending destination.
    let (Ok((readable, _, _)), Ok((_, writable, append))) =
        (access_of(&a, in_fd), access_of(&b, out_fd))
    else {
        set_errno(libc::EBADF);
        return -1;
    };
    let refuse = if !readable {
        Some(libc::EBADF)
    } else if oi.is_some_and(|o| o < 0) {
        Some(libc::EINVAL)
    } else if !writable {
        Some(libc::EBADF)
    } else if append {
        Some(libc::EINVAL)
    } else {
        None
    };
    if let Some(err) = refuse {
        set_errno(err);
        return -1;
    }
    let mut ou = oi.map(|o| o as u64);
    let src = match &a {
        Some((d, c)) => Side::Direct(c, d, in_fd),
        None => Side::Kernel(in_fd),
    };
    let dst = match &b {
        Some((d, c)) => Side::Direct(c, d, out_fd),
        None => Side::Kernel(out_fd),
    };
    // One description on both sides, at its own offset: Linux reads and writes at
    // that offset and moves it once. Read at the offset given, write at (and move)
    // the description's, which starts there.
    let one = matches!((&a, &b), (Some((x, _)), Some((y, _))) if Arc::ptr_eq(x, y));
    let mut at = match (&a, ou) {
        (Some((d, _)), None) if one => match ops::tell(d, in_fd) {
            Ok(p) => Some(p),
            Err(err) => {
                set_errno(err);
                return -1;
            }
        },
        _ => None,
    };
    let from = if at.is_some() { at.as_mut() } else { ou.as_mut() };
    let r = catch_unwind(AssertUnwindSafe(|| ops::copy(&src, from, &dst, None, count)))
        .unwrap_or(Err(libc::EIO));
    if let (Ok(_), Some(v)) = (&r, ou) {
        oi = Some(v as off64_t);
        // SAFETY: non-null (oi was Some only then).
        unsafe { *off = oi.expect("set") };
    }
    stats::direct();
    ss(r)
}

#[no_mangle]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    off: *mut off64_t,
    count: size_t,
) -> ssize_t {
    unsafe { sendfile(out_fd, in_fd, off, count) }
}

// ------------------------------------------------------------------- mmap

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    if flags & libc::MAP_ANONYMOUS == 0 {
        // DAX for a shared mapping, a copy for a small private one.
        let call = ops::MapCall { addr: addr as usize, len, prot, flags, off };
        let served = |d: &Desc, c: &'static Client| ops::mmap(c, d, fd, call);
        match direct(fd, served) {
            Some(Ok(p)) => return p as *mut c_void,
            Some(Err(e)) => {
                set_errno(e);
                return libc::MAP_FAILED;
            }
            None => {}
        }
    }
    // A mapping through the kernel, shared (DAX off or refused) or private: its
    // pages come from the kernel's page cache.
    if flags & libc::MAP_ANONYMOUS == 0 {
        if let Some((e, d, c)) = lookup(fd) {
            // The kernel's page cache now holds the file for this mapping: every
            // client writes it through the kernel until its last handle closes.
            c.note_kernel_mapping(d.ino);
            d.kernel_io.store(true, Ordering::Relaxed);
            drop(e);
            // (Counted by `direct` above, which sent it here.)
            // The kernel's size of the file predates the direct writes: have it ask
            // the daemon again, or the mapping would fault (SIGBUS) past its old end.
            real::refresh_kernel_attrs(fd);
        }
    }
    forward!(mmap64(addr, len, prot, flags, fd, off), libc::MAP_FAILED)
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off64_t,
) -> *mut c_void {
    unsafe { mmap(addr, len, prot, flags, fd, off) }
}

/// The first answer of `f` from an attached client's DAX mappings, when this
/// process made any and the call does not come from this library.
fn dax_maps<T>(f: impl FnMut(&'static Client) -> Option<T>) -> Option<T> {
    if !ops::DAX_USED.load(Ordering::Acquire) {
        return None;
    }
    let _e = table::enter()?;
    dax_maps_unguarded(f)
}

/// [`dax_maps`] without entering the hook: for calls this library never makes
/// itself and whose work takes no lock a forked child could inherit held (the
/// registry of DAX mappings is the parent's alone).
fn dax_maps_unguarded<T>(f: impl FnMut(&'static Client) -> Option<T>) -> Option<T> {
    if !ops::DAX_USED.load(Ordering::Acquire) {
        return None;
    }
    catch_unwind(AssertUnwindSafe(|| crate::mounts::find_attached(f))).ok().flatten()
}

#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    match dax_maps(|c| c.fs().munmap_file(addr as usize, len)) {
        Some(r) => int(r.map(|_| 0).map_err(|e| e.errno())),
        None => forward!(munmap(addr, len), -1),
    }
}

#[no_mangle]
pub unsafe extern "C" fn msync(addr: *mut c_void, len: size_t, flags: c_int) -> c_int {
    let known = libc::MS_ASYNC | libc::MS_SYNC | libc::MS_INVALIDATE;
    let both = libc::MS_ASYNC | libc::MS_SYNC;
    let valid = (addr as usize).is_multiple_of(4096) && flags & !known == 0 && flags & both != both;
    // Stores through DAX mappings are made durable here, with flushes and a
    // fence; a range that also covers other mappings goes to the kernel after.
    if valid && dax_maps_unguarded(|c| c.fs().persist_mapped(addr as usize, len)) == Some(true) {
        stats::direct();
        return 0;
    }
    forward!(msync(addr, len, flags), -1)
}

#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let o = old as usize;
    let r = dax_maps(|c| {
        if !c.fs().is_file_mapped(o, old_len) {
            return None;
        }
        if flags & !libc::MREMAP_MAYMOVE != 0 {
            return Some(Err(libc::EINVAL)); // fixed or kept places: not for DAX
        }
        let may_move = flags & libc::MREMAP_MAYMOVE != 0;
        Some(match c.fs().mremap_file(o, old_len, new_len, may_move) {
            None => Err(libc::EINVAL), // meets a DAX mapping but starts none
            Some(Ok(p)) => Ok(p),
            Some(Err(ferrite_core::Error::NoSpace)) => Err(libc::ENOMEM),
            Some(Err(e)) => Err(e.errno()),
        })
    });
    match r {
        Some(Ok(p)) => p as *mut c_void,
        Some(Err(e)) => {
            set_errno(e);
            libc::MAP_FAILED
        }
        None => forward!(mremap(old, old_len, new_len, flags, new_addr), libc::MAP_FAILED),
    }
}

// ------------------------------------------------------------------- stdio

/// fopen: a file of a mount with direct access gets a stream whose buffers go to
/// the pool directly (see `streams`); any other, the C library's.
#[no_mangle]
pub unsafe extern "C" fn fopen(path: *const c_char, mode: *const c_char) -> *mut FILE {
    match crate::streams::open(path, mode) {
        Some(fp) => fp,
        None => forward!(fopen64(path, mode), std::ptr::null_mut()),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fopen64(path: *const c_char, mode: *const c_char) -> *mut FILE {
    unsafe { fopen(path, mode) }
}

#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const c_char) -> *mut FILE {
    if let Some(fp) = crate::streams::fdopen(fd, mode) {
        return fp;
    }
    if let Some((e, d, _)) = lookup(fd) {
        // The stream reads and writes through the kernel at the kernel's offset.
        crate::sync_desc(fd, &d);
        drop(e);
    }
    forward!(fdopen(fd, mode), std::ptr::null_mut())
}

fn stream_gone(fp: *mut FILE) {
    if fp.is_null() || table::TRACKED.load(Ordering::Acquire) == 0 {
        return;
    }
    let fd = forward!(fileno(fp), -1);
    if fd >= 0 {
        if let Some(_e) = table::enter() {
            table::set(fd, None);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fclose(fp: *mut FILE) -> c_int {
    let ours = crate::streams::forget(fp);
    if ours.is_none() {
        stream_gone(fp);
    }
    let r = forward!(fclose(fp), libc::EOF);
    if let Some(f) = ours {
        f.release();
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn freopen(
    path: *const c_char,
    mode: *const c_char,
    fp: *mut FILE,
) -> *mut FILE {
    let ours = crate::streams::forget(fp);
    let byte_only = match ours {
        Some(_) => crate::streams::before_freopen(fp),
        None => {
            stream_gone(fp);
            false
        }
    };
    let r = forward!(freopen64(path, mode, fp), std::ptr::null_mut());
    if let Some(f) = ours {
        crate::streams::after_freopen(r, byte_only);
        f.release();
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn freopen64(
    path: *const c_char,
    mode: *const c_char,
    fp: *mut FILE,
) -> *mut FILE {
    unsafe { freopen(path, mode, fp) }
}

// ------------------------------------------------------- descriptors passed on

/// The direct descriptors a message passes to another process (SCM_RIGHTS) are
/// shared from now on: their offsets go to the kernel first. The receiver shares
/// the description and uses the kernel's offset, which was stale for a private
/// one (a child's write to a descriptor its parent sent went over the parent's
/// first bytes).
///
/// # Safety
/// `m` is null or a message header whose control buffer the caller made.
unsafe fn share_passed(m: *const libc::msghdr) {
    if m.is_null() || table::TRACKED.load(Ordering::Acquire) == 0 {
        return;
    }
    let Some(_e) = table::enter() else { return };
    // SAFETY: the caller's header and its control buffer of msg_controllen bytes,
    // walked with the C library's macros, which stay inside it.
    unsafe {
        let mut h = libc::CMSG_FIRSTHDR(m);
        while !h.is_null() {
            if (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(h);
                let bytes =
                    ((*h).cmsg_len as usize).saturating_sub(data.offset_from(h.cast()) as usize);
                for i in 0..bytes / std::mem::size_of::<c_int>() {
                    let fd = data.cast::<c_int>().add(i).read_unaligned();
                    if let Some(d) = table::get(fd) {
                        crate::sync_desc(fd, &d);
                    }
                }
            }
            h = libc::CMSG_NXTHDR(m, h);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, m: *const libc::msghdr, flags: c_int) -> ssize_t {
    // SAFETY: the caller's message.
    unsafe { share_passed(m) };
    forward!(sendmsg(fd, m, flags), -1)
}

#[no_mangle]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    v: *mut libc::mmsghdr,
    n: c_uint,
    flags: c_int,
) -> c_int {
    if !v.is_null() {
        for i in 0..n as usize {
            // SAFETY: the caller's array of n messages.
            unsafe { share_passed(&(*v.add(i)).msg_hdr) };
        }
    }
    forward!(sendmmsg(fd, v, n, flags), -1)
}

// ------------------------------------------------------------ new processes

/// Before a new program image that inherits this process's descriptors (spawn,
/// exec): offsets to the kernel for the descriptors it inherits (those without
/// close-on-exec).
fn before_new_process() {
    if table::TRACKED.load(Ordering::Acquire) > 0 {
        if let Some(_e) = table::enter() {
            crate::sync_inherited();
        }
    }
}

/// Before an exec: each attached client says goodbye, as at exit. Its connection
/// closes with this image, and without the goodbye the daemon counted every exec
/// of an attached process as a client's death (and said so in its log). If the
/// exec fails, the process goes on through the kernel once the daemon has resolved
/// the client, as other threads do after the goodbye at exit: so every direct
/// descriptor's offset goes to the kernel first, not only the inherited ones'
/// ([`before_new_process`]).
fn before_exec() {
    let Some(_e) = table::enter() else { return };
    goodbye();
}

/// Every direct descriptor's offset to the kernel, then each attached client's
/// goodbye (at exit and before an exec). Other threads may go on past it: once the
/// daemon has resolved the client their calls go to the kernel, whose offset must
/// then be the truth (a thread logging while `main` returned wrote its last
/// records over the first ones, about once in five runs). Inside a hook.
fn goodbye() {
    crate::sync_all();
    for m in mounts::mounts() {
        if let Some(c) = m.attached() {
            c.exiting();
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn vfork() -> pid_t {
    // A vfork child would run on this frame; fork is what a vfork-then-exec
    // program needs, and keeps this library's state consistent (the fork handlers
    // give every direct description's offset to the kernel).
    forward!(fork(), -1)
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn_file_actions_adddup2(
    fa: *mut c_void,
    fd: c_int,
    newfd: c_int,
) -> c_int {
    // The spawned program gets `fd`'s description whatever its close-on-exec flag.
    if let Some((e, d, _)) = lookup(fd) {
        crate::sync_desc(fd, &d);
        drop(e);
    }
    forward!(posix_spawn_file_actions_adddup2(fa, fd, newfd), libc::ENOSYS)
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut pid_t,
    path: *const c_char,
    fa: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    before_new_process();
    forward!(posix_spawn(pid, path, fa, attr, argv, envp), libc::ENOSYS)
}

#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut pid_t,
    file: *const c_char,
    fa: *const c_void,
    attr: *const c_void,
    argv: *const *mut c_char,
    envp: *const *mut c_char,
) -> c_int {
    before_new_process();
    forward!(posix_spawnp(pid, file, fa, attr, argv, envp), libc::ENOSYS)
}

#[no_mangle]
pub unsafe extern "C" fn system(cmd: *const c_char) -> c_int {
    before_new_process();
    forward!(system(cmd), -1)
}

#[no_mangle]
pub unsafe extern "C" fn popen(cmd: *const c_char, mode: *const c_char) -> *mut FILE {
    before_new_process();
    forward!(popen(cmd, mode), std::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    forward!(execve(path, argv, envp), -1)
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    forward!(execv(path, argv), -1)
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    before_exec();
    forward!(execvp(file, argv), -1)
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    forward!(execvpe(file, argv, envp), -1)
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    before_exec();
    forward!(fexecve(fd, argv, envp), -1)
}

// ------------------------------------------------------------- process life

pub(crate) extern "C" fn at_fork_prepare() {
    maps_to_kernel_before_fork();
    // From here the gate is closed: a call this thread makes on its way (the debug
    // report of `sync_desc` is a write) must go straight to the C library, or it
    // would wait at the gate for its own fork.
    let _inside = table::inside_guard();
    table::fork_prepare();
    crate::sync_all();
}

/// Before a fork, this process's DAX mappings go to the kernel (each file opened
/// again by the path /proc/self/map_files gives for its keeping mapping, if that
/// is still the file): a child does
/// not inherit DAX mappings (their pins are the parent's, so they carry
/// MADV_DONTFORK), and would get SIGSEGV touching one; kernel mappings it inherits
/// as Linux gives them. A file that cannot be opened again (unlinked, or its
/// permissions changed) keeps its DAX mapping, which the child then lacks.
fn maps_to_kernel_before_fork() {
    if !ops::DAX_USED.load(Ordering::Acquire) || table::inside() {
        return;
    }
    let Some(_e) = table::enter() else { return };
    for m in mounts::mounts() {
        let Some(c) = m.attached() else { continue };
        for (ino, keep) in c.fs().mapped_files() {
            let link = format!("/proc/self/map_files/{keep:x}-{:x}", keep + 4096);
            if let Ok(path) = std::fs::read_link(&link) {
                let _ = ops::hand_maps_to_kernel(c, ino, path.as_os_str().as_encoded_bytes());
            }
        }
    }
}

pub(crate) extern "C" fn at_fork_parent() {
    table::fork_done(false);
}

pub(crate) extern "C" fn at_fork_child() {
    table::fork_done(true);
    // What follows closes descriptors: those calls must go straight to the C library.
    let _inside = table::inside_guard();
    exit_reset();
    mounts::after_fork_child();
    stats::reset_after_fork();
    crate::streams::after_fork_child();
}

static EXITED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A forked child has its own exit report to write.
pub(crate) fn exit_reset() {
    EXITED.store(false, Ordering::Release);
}

/// exit (not `_exit`, which drops what streams buffer): the streams made here
/// write out their buffers while the client is still attached.
extern "C" fn at_exit_flushing() {
    crate::streams::flush_all();
    at_exit();
}

pub(crate) extern "C" fn at_exit() {
    if EXITED.swap(true, Ordering::AcqRel) {
        return;
    }
    let _e = table::enter();
    if let Some(path) = std::env::var_os("FERRITE_DIRECT_STATS") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = f.write_all(stats::line().as_bytes());
        }
    }
    goodbye();
}

#[no_mangle]
pub unsafe extern "C" fn _exit(code: c_int) -> ! {
    // Programs that end their worker processes with _exit (fio does) still report.
    at_exit();
    // SAFETY: ends the process; nothing runs after it.
    unsafe { libc::syscall(libc::SYS_exit_group, code) };
    unreachable!("exit_group returned")
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(code: c_int) -> ! {
    // SAFETY: same as _exit.
    unsafe { _exit(code) }
}

/// Register the fork and exit handlers.
pub(crate) fn register_handlers() {
    // SAFETY: plain registrations of extern "C" functions that live forever.
    unsafe {
        libc::pthread_atfork(Some(at_fork_prepare), Some(at_fork_parent), Some(at_fork_child));
        libc::atexit(at_exit_flushing);
    }
}

// ------------------------------------------------------------------ signals

/// sigaction: a program's handler of an asynchronous signal runs after a hook of
/// this library, never inside one (see `signals`).
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    match real().sigaction {
        // SAFETY: the caller's arguments, as for sigaction(2).
        Some(f) => unsafe { crate::signals::sigaction(f, sig, act, old) },
        None => {
            set_errno(libc::ENOSYS);
            -1
        }
    }
}

/// signal: the C library's calls its internal sigaction, which this library cannot
/// see, so it is defined here (BSD semantics, as the C library's).
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    match real().sigaction {
        // SAFETY: as signal(2).
        Some(f) => unsafe { crate::signals::signal(f, sig, handler) },
        None => {
            set_errno(libc::ENOSYS);
            libc::SIG_ERR
        }
    }
}

/// bsd_signal: the same as [`signal`].
#[no_mangle]
pub unsafe extern "C" fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    unsafe { signal(sig, handler) }
}
