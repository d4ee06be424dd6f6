//! C library streams (`FILE`) on direct files. Fenced unsafe module.
//!
//! A stream that the C library opens itself (`fopen`) or builds on a descriptor
//! (`fdopen`) reads and writes with its internal `read` and `write`, which no
//! interposed function sees: on a direct file, every buffer it flushed went to the
//! kernel, a round trip to the daemon (about 23 µs per 4 KiB on the development VM,
//! so a program writing a file with `fwrite` ran 5-7x slower than on tmpfs). Here a
//! stream on a direct file is a custom stream of the C library (`fopencookie`)
//! whose read, write, seek and close are this library's hooks, so its buffers go
//! to the pool directly, at the description's offset, like a `write` of the
//! program. The C library keeps doing everything else (buffers, `ungetc`,
//! `ftell`, locking, `fflush`); `fileno` names the descriptor.
//!
//! Invariants:
//! - A stream made here has its descriptor in the `FILE`'s `_fileno` field (checked
//!   once per process against the C library's own `fileno`; if the check fails, no
//!   stream is made here and the C library's own streams serve, through the kernel).
//! - Every stream made here is in [`OURS`] until `fclose` or `freopen` takes it out,
//!   before the C library frees it; its descriptor is closed by the close hook, so
//!   the descriptor table drops it after the stream's last flush, never before.
//! - At `exit` the library flushes these streams before it tells the daemon that
//!   the process ends ([`flush_all`]); the C library's own flush at exit comes
//!   later, after that goodbye, and then finds nothing to write.
//! - The buffer is the one glibc would give the file (`st_blksize`), so a program
//!   flushes in the same pieces with and without this library.
//! - The standard streams on direct files are replaced at start ([`adopt_std`]);
//!   they keep glibc's wide-character state. Not when `std::cout` exists already.
//! - Limits: a stream `fopen` or `fdopen` made here is byte-oriented
//!   (wide-character functions fail on it, as on any `fopencookie` stream); a mode
//!   with `,ccs=` is left to the C library; `freopen` gives back glibc's own stream.
#![allow(unsafe_code)]

use crate::real::{self, real, set_errno};
use crate::{hooks, mounts, table};
use libc::{c_char, c_int, c_void, off64_t, size_t, ssize_t, FILE};
use parking_lot::Mutex;
use std::ffi::CStr;
use std::sync::OnceLock;

/// glibc's `cookie_io_functions_t`.
#[repr(C)]
struct CookieIo {
    read: Option<unsafe extern "C" fn(*mut c_void, *mut c_char, size_t) -> ssize_t>,
    write: Option<unsafe extern "C" fn(*mut c_void, *const c_char, size_t) -> ssize_t>,
    seek: Option<unsafe extern "C" fn(*mut c_void, *mut off64_t, c_int) -> c_int>,
    close: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
}
const _: () = assert!(std::mem::size_of::<CookieIo>() == 32);

extern "C" {
    fn fopencookie(cookie: *mut c_void, mode: *const c_char, io: CookieIo) -> *mut FILE;
    /// glibc's standard streams: variables a program may assign, which the C
    /// library's own functions (printf, puts, perror) read at each call.
    static mut stdin: *mut FILE;
    static mut stdout: *mut FILE;
    static mut stderr: *mut FILE;
}

/// Offsets of fields of glibc's `struct _IO_FILE` on x86-64 (its public header,
/// bits/types/struct_FILE.h): `int _fileno` after `_flags` with its padding,
/// eleven buffer pointers, `_markers` and `_chain`; `_wide_data`, which a
/// byte-only stream such as a cookie stream has set to -1; and `int _mode`, the
/// stream's orientation.
const FILENO_AT: usize = 112;
const WIDE_DATA_AT: usize = 160;
const MODE_AT: usize = 192;

/// Streams made here and their buffers (addresses).
static OURS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// How a mode string opens a file, as glibc's `fopen` reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mode {
    /// open(2) flags.
    flags: c_int,
    /// "a" without "+": the stream starts at the end of the file.
    append_only: bool,
    /// The mode `fopencookie` is given ("r", "w", "a", with "+").
    cookie: &'static CStr,
}

/// Parse an `fopen` mode as glibc does (the first letter, then up to six more
/// characters up to a NUL or a comma; unknown letters ignored). `None` for a mode
/// glibc refuses (it then says EINVAL itself) or one that asks for a wide
/// conversion (`,ccs=`), which only the C library's own streams do.
fn parse_mode(m: &[u8]) -> Option<Mode> {
    if m.windows(4).any(|w| w == b"ccs=") {
        return None;
    }
    let (mut acc, mut extra) = match m.first()? {
        b'r' => (libc::O_RDONLY, 0),
        b'w' => (libc::O_WRONLY, libc::O_CREAT | libc::O_TRUNC),
        b'a' => (libc::O_WRONLY, libc::O_CREAT | libc::O_APPEND),
        _ => return None,
    };
    let mut plus = false;
    for &c in m.iter().skip(1).take(6) {
        match c {
            0 | b',' => break,
            b'+' => {
                acc = libc::O_RDWR;
                plus = true;
            }
            b'x' => extra |= libc::O_EXCL,
            b'e' => extra |= libc::O_CLOEXEC,
            _ => {}
        }
    }
    let cookie: &'static CStr = match (m[0], plus) {
        (b'r', false) => c"r",
        (b'r', true) => c"r+",
        (b'w', false) => c"w",
        (b'w', true) => c"w+",
        (b'a', false) => c"a",
        _ => c"a+",
    };
    Some(Mode { flags: acc | extra, append_only: m[0] == b'a' && !plus, cookie })
}

/// May streams be made here? Checked once: not with `FERRITE_STREAMS=0` (the C
/// library's own streams, through the kernel, as before), and a stream's fields are
/// where this library expects them (the C library's `fileno` reads `_fileno` back).
fn supported() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if !cfg!(all(target_arch = "x86_64", target_env = "gnu"))
            || std::env::var_os("FERRITE_STREAMS").is_some_and(|v| v == "0")
        {
            return false;
        }
        let (Some(fileno), Some(fclose)) = (real().fileno, real().fclose) else { return false };
        let none = CookieIo { read: None, write: None, seek: None, close: None };
        // SAFETY: a valid mode string and null callbacks, which glibc allows.
        let fp = unsafe { fopencookie(std::ptr::null_mut(), c"r".as_ptr(), none) };
        if fp.is_null() {
            return false;
        }
        let at = fp.cast::<u8>().wrapping_add(FILENO_AT).cast::<c_int>();
        // SAFETY: `fp` is a live FILE, at least as large as glibc's public
        // `struct _IO_FILE`, whose fields these offsets name.
        let ok = unsafe {
            let before = at.read();
            at.write(7);
            let seen = fileno(fp);
            at.write(before);
            let wide = fp.cast::<u8>().add(WIDE_DATA_AT).cast::<isize>().read();
            let mode = fp.cast::<u8>().add(MODE_AT).cast::<c_int>().read();
            (before == -1 || before == -2) && seen == 7 && wide == -1 && mode == -1
        };
        // SAFETY: our stream; its close callback is null, so nothing is closed.
        unsafe { fclose(fp) };
        ok
    })
}

unsafe extern "C" fn cookie_read(cookie: *mut c_void, buf: *mut c_char, n: size_t) -> ssize_t {
    // SAFETY: the C library hands the stream's buffer of `n` bytes.
    unsafe { hooks::read(cookie as usize as c_int, buf.cast(), n) }
}

unsafe extern "C" fn cookie_write(cookie: *mut c_void, buf: *const c_char, n: size_t) -> ssize_t {
    // All of it, as the C library's own stream writes (a short count is an error
    // to the stream, and 0 says the error; errno stays the write's).
    // SAFETY: the stream's buffer of `n` bytes.
    unsafe { hooks::write_all(cookie as usize as c_int, buf.cast(), n) as ssize_t }
}

unsafe extern "C" fn cookie_seek(cookie: *mut c_void, off: *mut off64_t, whence: c_int) -> c_int {
    // SAFETY: the C library hands a valid position to read and update.
    unsafe {
        let r = hooks::lseek64(cookie as usize as c_int, *off, whence);
        if r < 0 {
            return -1;
        }
        *off = r;
    }
    0
}

unsafe extern "C" fn cookie_close(cookie: *mut c_void) -> c_int {
    // SAFETY: the stream's descriptor, closed once, by its stream.
    unsafe { hooks::close(cookie as usize as c_int) }
}

/// A stream on the direct descriptor `fd` (unbuffered, or with the buffer glibc
/// would give it); null (and errno) if the C library could not make one.
fn make(fd: c_int, mode: &Mode, unbuffered: bool) -> *mut FILE {
    let io = CookieIo {
        read: Some(cookie_read),
        write: Some(cookie_write),
        seek: Some(cookie_seek),
        close: Some(cookie_close),
    };
    // SAFETY: a valid mode string and callbacks that live forever; the cookie is
    // the descriptor's number.
    let fp = unsafe { fopencookie(fd as usize as *mut c_void, mode.cookie.as_ptr(), io) };
    if fp.is_null() {
        return fp;
    }
    // SAFETY: `supported` checked this field of a live stream.
    unsafe { fp.cast::<u8>().add(FILENO_AT).cast::<c_int>().write(fd) };
    if unbuffered {
        // SAFETY: a live stream, before any I/O.
        unsafe { libc::setvbuf(fp, std::ptr::null_mut(), libc::_IONBF, 0) };
        OURS.lock().push((fp as usize, 0));
        return fp;
    }
    // The buffer glibc gives its own stream of this file: st_blksize bytes when
    // that is below BUFSIZ (the mount says 4096), else BUFSIZ. A cookie stream
    // cannot ask (its stat fails) and would take BUFSIZ: the same program would
    // then write in other pieces on and off the library (a forked child flushing
    // what its copy of a buffer holds would write other bytes).
    // SAFETY: a stat buffer for the hook to fill.
    let mut st: libc::stat64 = unsafe { std::mem::zeroed() };
    let size = match unsafe { hooks::fstat64(fd, &mut st) } {
        0 if st.st_blksize > 0 && (st.st_blksize as usize) < BUFSIZ => st.st_blksize as usize,
        _ => BUFSIZ,
    };
    // SAFETY: a new buffer of `size` bytes, handed to the stream before any I/O;
    // glibc never frees a buffer given with setvbuf, `release` does after fclose.
    let buf = unsafe { libc::malloc(size) };
    if !buf.is_null() && unsafe { libc::setvbuf(fp, buf.cast(), libc::_IOFBF, size) } != 0 {
        // SAFETY: not handed to the stream.
        unsafe { libc::free(buf) };
        OURS.lock().push((fp as usize, 0));
        return fp;
    }
    OURS.lock().push((fp as usize, buf as usize));
    fp
}

/// glibc's BUFSIZ.
const BUFSIZ: usize = 8192;

/// fopen: `None` when the C library should open it (not on a mount, a mode left
/// to it, inside a hook); otherwise the stream, or null with errno.
pub fn open(path: *const c_char, mode: *const c_char) -> Option<*mut FILE> {
    if path.is_null() || mode.is_null() || table::inside() {
        return None;
    }
    crate::init();
    if mounts::mounts().is_empty() || !supported() {
        return None;
    }
    // SAFETY: non-null C strings from the caller.
    let (p, m) = unsafe { (CStr::from_ptr(path), CStr::from_ptr(mode)) };
    let mode = parse_mode(m.to_bytes())?;
    {
        let _e = table::enter()?;
        let a = hooks::absolute(libc::AT_FDCWD, p.to_bytes())?;
        // A mount without direct access: the C library's fopen, as before. Whether
        // this process attaches now is the open's to decide (`hooks::open_direct`):
        // a descriptor it leaves to the kernel gets the C library's stream below.
        mounts::for_path(&a)?.may_attach().then_some(())?;
    }
    // SAFETY: the caller's path, and the mode glibc's fopen opens it with.
    let fd = unsafe { hooks::open64(path, mode.flags, 0o666) };
    if fd < 0 {
        return Some(std::ptr::null_mut());
    }
    if !table::is_direct(fd) {
        // A FIFO, a device, a directory, a file read before this process
        // attached (read mode): the C library's stream, through the kernel, where
        // glibc's fopen would start it (its fdopen does not move an O_APPEND
        // descriptor to the end).
        if mode.append_only {
            match real::lseek(fd, 0, libc::SEEK_END) {
                Err(e) if e != libc::ESPIPE => return Some(fail(fd, e)),
                _ => {}
            }
        }
        let Some(fdopen) = real().fdopen else { return Some(fail(fd, libc::ENOSYS)) };
        // SAFETY: our descriptor and the caller's mode.
        let fp = unsafe { fdopen(fd, m.as_ptr()) };
        return Some(if fp.is_null() { fail(fd, real::errno()) } else { fp });
    }
    // SAFETY: our descriptor (glibc's fopen starts an "a" stream at the end).
    if mode.append_only && unsafe { hooks::lseek64(fd, 0, libc::SEEK_END) } < 0 {
        return Some(fail(fd, real::errno()));
    }
    let fp = make(fd, &mode, false);
    Some(if fp.is_null() { fail(fd, libc::ENOMEM) } else { fp })
}

/// Close `fd` and fail with `e`.
fn fail(fd: c_int, e: c_int) -> *mut FILE {
    // SAFETY: our descriptor, not handed out.
    unsafe { hooks::close(fd) };
    set_errno(e);
    std::ptr::null_mut()
}

/// fdopen of a direct descriptor: `None` for any other (the C library's stream);
/// otherwise the stream, or null with errno (the checks of glibc's fdopen).
pub fn fdopen(fd: c_int, mode: *const c_char) -> Option<*mut FILE> {
    if mode.is_null() || table::inside() || !table::is_direct(fd) || !supported() {
        return None;
    }
    // SAFETY: a non-null C string from the caller.
    let mode = parse_mode(unsafe { CStr::from_ptr(mode) }.to_bytes())?;
    // SAFETY: the caller's descriptor.
    let fl = unsafe { hooks::fcntl(fd, libc::F_GETFL, 0) };
    if fl < 0 {
        return Some(std::ptr::null_mut());
    }
    let want = mode.flags & libc::O_ACCMODE;
    let have = fl & libc::O_ACCMODE;
    if (have == libc::O_RDONLY && want != libc::O_RDONLY)
        || (have == libc::O_WRONLY && want != libc::O_WRONLY)
    {
        set_errno(libc::EINVAL);
        return Some(std::ptr::null_mut());
    }
    if mode.flags & libc::O_APPEND != 0 && fl & libc::O_APPEND == 0 {
        // SAFETY: the caller's descriptor.
        if unsafe { hooks::fcntl(fd, libc::F_SETFL, (fl | libc::O_APPEND) as usize) } < 0 {
            return Some(std::ptr::null_mut());
        }
        // SAFETY: as above (glibc moves to the end when it added O_APPEND).
        if mode.append_only && unsafe { hooks::lseek64(fd, 0, libc::SEEK_END) } < 0 {
            return Some(std::ptr::null_mut());
        }
    }
    let fp = make(fd, &mode, false);
    if fp.is_null() {
        set_errno(libc::ENOMEM);
    }
    Some(fp)
}

/// A stream made here, forgotten before glibc closes or reopens it: its buffer,
/// freed once the stream no longer uses it ([`Forgotten::release`]).
pub struct Forgotten(usize);

impl Forgotten {
    /// After glibc's fclose or freopen: the stream's old buffer goes.
    pub fn release(self) {
        // SAFETY: malloc'ed in `make`, no longer the stream's (fclose freed the
        // stream; freopen gave it a buffer of its own), freed once.
        unsafe { libc::free(self.0 as *mut c_void) };
    }
}

/// At start, after the inherited descriptors were taken: `stdin`, `stdout` and
/// `stderr` on direct files (a program's input or output redirected to a file of
/// a mount, `cmd < in > out`) become streams of this library, so their buffers
/// come from and go to the pool too.
/// The C library made its own before any library ran, and writes them with its
/// internal `write`: one round trip per 4 KiB (`seq 1 5000000 > file` took 0.26
/// s under the library, 0.11 s on tmpfs). The variables are replaced, as a program
/// may replace them itself; glibc's functions read them at each call.
///
/// Not in a process whose C++ standard streams were made already: `std::cout`
/// keeps the `stdout` it found when it was made, and `printf` and `cout` output
/// in two buffers would come out reordered. libstdc++ 13 and libc++ make them
/// when their library starts (before this one); older libstdc++ when the
/// program's own static objects are made (after this one), and they then take
/// the new stream. The new stream lends the old
/// one's wide-character state, so a program's first wide call makes it a wide
/// stream as on glibc's own (glibc then writes it with its own functions, through
/// the kernel, at the kernel's offset, which is the truth for an inherited
/// description).
pub fn adopt_std() {
    // Most processes have no standard stream on a direct file: they pay a table
    // look for each, not the check of `supported` or the symbol lookups.
    if table::inside() || !(0..3).any(table::is_direct) || !supported() || cxx_streams_made() {
        return;
    }
    let Some(fileno) = real().fileno else { return };
    for (fd, how, unbuffered) in [(0, b"r", false), (1, b"w", false), (2, b"w", true)] {
        if !table::is_direct(fd) {
            continue;
        }
        // SAFETY: glibc's variables, read and written by this thread at start,
        // before the program's main (as a program may assign them); the stream
        // read is the live one they name.
        unsafe {
            let var: *mut *mut FILE = match fd {
                0 => &raw mut stdin,
                1 => &raw mut stdout,
                _ => &raw mut stderr,
            };
            let old = var.read();
            if old.is_null() || fileno(old) != fd {
                continue;
            }
            libc::fflush(old);
            let wide = old.cast::<u8>().add(WIDE_DATA_AT).cast::<usize>().read();
            let mode = old.cast::<u8>().add(MODE_AT).cast::<c_int>().read();
            if wide == 0 || wide == usize::MAX || mode != 0 {
                continue; // not glibc's fresh standard stream
            }
            let fp = make(fd, &parse_mode(how).expect("a valid mode"), unbuffered);
            if fp.is_null() {
                continue;
            }
            fp.cast::<u8>().add(WIDE_DATA_AT).cast::<usize>().write(wide);
            fp.cast::<u8>().add(MODE_AT).cast::<c_int>().write(0);
            var.write(fp);
        }
    }
}

/// Were this process's C++ standard streams made already (libstdc++'s or
/// libc++'s `std::cout`)? The object is zero until its constructor stores its
/// virtual table pointer, its first word.
fn cxx_streams_made() -> bool {
    [c"_ZSt4cout", c"_ZNSt3__14coutE"].iter().any(|name| {
        // SAFETY: a NUL-terminated symbol name, looked up in the global scope.
        let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
        // SAFETY: `std::cout`, an object of the C++ library larger than a word
        // (static storage: zero before its constructor ran).
        !p.is_null() && unsafe { p.cast::<usize>().read_volatile() } != 0
    })
}

/// `fp` is about to be closed or reopened: `Some` if it was made here (it is then
/// forgotten; its descriptor is closed through the close hook).
pub fn forget(fp: *mut FILE) -> Option<Forgotten> {
    let mut ours = OURS.lock();
    let i = ours.iter().position(|&(p, _)| p == fp as usize)?;
    Some(Forgotten(ours.swap_remove(i).1))
}

/// freopen of a stream made here (glibc's freopen turns it into one of its own,
/// on the same descriptor number, through the kernel). First its buffer goes out
/// through the hooks, and its descriptor leaves the table (glibc then closes it
/// itself, or puts the new file's under its number). glibc's freopen would store
/// through the `_wide_data` of any byte-only stream, which for a cookie stream is
/// -1 (a crash in glibc itself): the stream gets none, as a stream without wide
/// functions has.
/// Returns whether the stream had no wide state of its own (the `after_freopen`
/// argument); a standard stream made here has its predecessor's and keeps it.
pub fn before_freopen(fp: *mut FILE) -> bool {
    // SAFETY: a live stream made here (`forget` just took it out of OURS).
    unsafe {
        libc::fflush(fp);
        let fd = fp.cast::<u8>().add(FILENO_AT).cast::<c_int>().read();
        if let Some(_e) = table::enter() {
            table::set(fd, None);
        }
        let wide = fp.cast::<u8>().add(WIDE_DATA_AT).cast::<usize>();
        if wide.read() != usize::MAX {
            return false;
        }
        wide.write(0);
        true
    }
}

/// After glibc's freopen of a stream made here that had no wide state: it stays
/// byte-oriented (glibc's freopen had made its orientation open again).
pub fn after_freopen(fp: *mut FILE, byte_only: bool) {
    if !fp.is_null() && byte_only {
        // SAFETY: the live stream freopen returned (the same FILE).
        unsafe { fp.cast::<u8>().add(MODE_AT).cast::<c_int>().write(-1) };
    }
}

/// At exit, before the daemon hears the goodbye: write out what the streams made
/// here still buffer (the C library's flush at exit runs later).
pub fn flush_all() {
    let ours = OURS.lock();
    for &(p, _) in ours.iter() {
        // SAFETY: a live stream (fclose takes it out of OURS before freeing it;
        // that waits for this lock).
        unsafe { libc::fflush(p as *mut FILE) };
    }
}

/// In a child after fork: the list's lock, if another thread held it.
pub fn after_fork_child() {
    crate::statics::unlock_after_fork(&OURS);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_open_as_glibc_opens_them() {
        let m = |s: &[u8]| parse_mode(s).map(|m| (m.flags, m.append_only, m.cookie));
        let (c, t, a) = (libc::O_CREAT, libc::O_TRUNC, libc::O_APPEND);
        assert_eq!(m(b"r"), Some((libc::O_RDONLY, false, c"r")));
        assert_eq!(m(b"rb+"), Some((libc::O_RDWR, false, c"r+")));
        assert_eq!(m(b"w"), Some((libc::O_WRONLY | c | t, false, c"w")));
        assert_eq!(
            m(b"wxe"),
            Some((libc::O_WRONLY | c | t | libc::O_EXCL | libc::O_CLOEXEC, false, c"w"))
        );
        assert_eq!(m(b"a"), Some((libc::O_WRONLY | c | a, true, c"a")));
        assert_eq!(m(b"a+"), Some((libc::O_RDWR | c | a, false, c"a+")));
        // After a comma, or past seven characters, nothing counts.
        assert_eq!(m(b"r,+"), Some((libc::O_RDONLY, false, c"r")));
        assert_eq!(m(b"rbbbbbb+"), Some((libc::O_RDONLY, false, c"r")));
        assert_eq!(m(b"w,ccs=UTF-8"), None);
        assert_eq!(m(b"q"), None);
        assert_eq!(m(b""), None);
    }
}
