//! The exported C functions: C strings and buffers become slices, errno values
//! become -1 (or NULL) and errno. Fenced unsafe module; the logic is in `api`.
//!
//! Invariants: every pointer is checked for NULL before use (EFAULT rather than a
//! crash for the obvious mistake; other bad pointers are the caller's, as in libc),
//! and a panic never crosses into C (it becomes EIO).
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]

use crate::api::{ferrite_stat, Handle, R};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A FerriteFS handle: a direct-access client of a mounted pool, or a pool the
/// process opened alone.
#[allow(non_camel_case_types)]
pub struct ferrite(Handle);

/// Called by `ferrite_readdir` for each entry; return non-zero to stop.
#[allow(non_camel_case_types)]
pub type ferrite_dirent_fn = Option<
    unsafe extern "C" fn(ctx: *mut c_void, name: *const c_char, ino: u64, dtype: u8) -> c_int,
>;

fn set_errno(e: i32) {
    // SAFETY: this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn guard<T>(fail: T, f: impl FnOnce() -> R<T>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e);
            fail
        }
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}

unsafe fn cstr<'a>(p: *const c_char) -> R<&'a [u8]> {
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: a NUL-terminated string from the caller.
    Ok(unsafe { CStr::from_ptr(p) }.to_bytes())
}

unsafe fn handle<'a>(f: *mut ferrite) -> R<&'a Handle> {
    if f.is_null() {
        return Err(libc::EBADF);
    }
    // SAFETY: a handle from ferrite_attach / ferrite_open_pool, not yet released.
    Ok(unsafe { &(*f).0 })
}

unsafe fn buf_mut<'a>(p: *mut c_void, n: usize) -> R<&'a mut [u8]> {
    if n == 0 {
        return Ok(&mut []);
    }
    let n = ferrite_direct::user_len(p as usize, n).ok_or(libc::EFAULT)?;
    // SAFETY: the caller's writable buffer of n bytes.
    Ok(unsafe { std::slice::from_raw_parts_mut(p as *mut u8, n) })
}

unsafe fn buf<'a>(p: *const c_void, n: usize) -> R<&'a [u8]> {
    if n == 0 {
        return Ok(&[]);
    }
    let n = ferrite_direct::user_len(p as usize, n).ok_or(libc::EFAULT)?;
    // SAFETY: the caller's readable buffer of n bytes.
    Ok(unsafe { std::slice::from_raw_parts(p as *const u8, n) })
}

fn boxed(h: R<Handle>) -> R<*mut ferrite> {
    h.map(|h| Box::into_raw(Box::new(ferrite(h))))
}

/// Attach to the FerriteFS mount at `mount` as a direct-access client: names go
/// through the mount, file data through this process's own mapping of the pool.
/// NULL and errno on failure (EACCES: this process may not open the pool file;
/// ENOTSUP: the mount offers no direct access).
#[no_mangle]
pub unsafe extern "C" fn ferrite_attach(mount: *const c_char) -> *mut ferrite {
    // SAFETY: the caller's C string.
    guard(std::ptr::null_mut(), || boxed(Handle::attach(unsafe { cstr(mount) }?)))
}

/// Open the pool file `pool` in this process alone (no daemon, no mount), formatting
/// it with `create_size` bytes if it does not exist and `create_size` is not 0.
/// NULL and errno on failure (EBUSY: another process holds the pool).
#[no_mangle]
pub unsafe extern "C" fn ferrite_open_pool(pool: *const c_char, create_size: u64) -> *mut ferrite {
    // SAFETY: the caller's C string.
    guard(std::ptr::null_mut(), || boxed(Handle::open_pool(unsafe { cstr(pool) }?, create_size)))
}

/// End a handle: a client detaches; a pool opened alone is unmounted cleanly. Its
/// open files are closed. 0, or -1 and errno.
#[no_mangle]
pub unsafe extern "C" fn ferrite_release(f: *mut ferrite) -> c_int {
    guard(-1, || {
        if f.is_null() {
            return Err(libc::EBADF);
        }
        // SAFETY: a handle from ferrite_attach / ferrite_open_pool, released once.
        let h = unsafe { Box::from_raw(f) };
        h.0.close().map(|()| 0)
    })
}

/// Open a regular file (`flags` and `mode` as open(2), with open(2)'s errors; O_CREAT,
/// O_EXCL, O_TRUNC, O_APPEND and the access mode are understood; the process's
/// umask applies to a file it creates). A directory fails with EISDIR, a FIFO,
/// socket or device with ENXIO (without blocking). A descriptor of this handle, or -1.
#[no_mangle]
pub unsafe extern "C" fn ferrite_open(
    f: *mut ferrite,
    path: *const c_char,
    flags: c_int,
    mode: c_uint,
) -> c_int {
    // SAFETY: the caller's handle and C string.
    guard(-1, || unsafe { handle(f)?.open(cstr(path)?, flags, mode) })
}

/// Close a descriptor.
#[no_mangle]
pub unsafe extern "C" fn ferrite_close(f: *mut ferrite, fd: c_int) -> c_int {
    // SAFETY: the caller's handle.
    guard(-1, || unsafe { handle(f)?.close_fd(fd).map(|()| 0) })
}

/// read(2): bytes read (0 at the end), or -1.
#[no_mangle]
pub unsafe extern "C" fn ferrite_read(
    f: *mut ferrite,
    fd: c_int,
    b: *mut c_void,
    n: usize,
) -> isize {
    // SAFETY: the caller's handle and buffer.
    guard(-1, || unsafe { handle(f)?.read(fd, buf_mut(b, n)?).map(|x| x as isize) })
}

/// write(2): durable when it returns.
#[no_mangle]
pub unsafe extern "C" fn ferrite_write(
    f: *mut ferrite,
    fd: c_int,
    b: *const c_void,
    n: usize,
) -> isize {
    // SAFETY: the caller's handle and buffer.
    guard(-1, || unsafe { handle(f)?.write(fd, buf(b, n)?).map(|x| x as isize) })
}

/// pread(2).
#[no_mangle]
pub unsafe extern "C" fn ferrite_pread(
    f: *mut ferrite,
    fd: c_int,
    b: *mut c_void,
    n: usize,
    off: i64,
) -> isize {
    // SAFETY: the caller's handle and buffer.
    guard(-1, || unsafe { handle(f)?.pread(fd, buf_mut(b, n)?, off).map(|x| x as isize) })
}

/// pwrite(2): durable when it returns.
#[no_mangle]
pub unsafe extern "C" fn ferrite_pwrite(
    f: *mut ferrite,
    fd: c_int,
    b: *const c_void,
    n: usize,
    off: i64,
) -> isize {
    // SAFETY: the caller's handle and buffer.
    guard(-1, || unsafe { handle(f)?.pwrite(fd, buf(b, n)?, off).map(|x| x as isize) })
}

/// lseek(2) with SEEK_SET, SEEK_CUR, SEEK_END, SEEK_DATA or SEEK_HOLE (holes at page
/// granularity, as tmpfs): the new offset, or -1.
#[no_mangle]
pub unsafe extern "C" fn ferrite_lseek(f: *mut ferrite, fd: c_int, off: i64, whence: c_int) -> i64 {
    // SAFETY: the caller's handle.
    guard(-1, || unsafe { handle(f)?.lseek(fd, off, whence) })
}

/// Map `len` bytes of open file `fd` from `off` (a multiple of 4096) into this
/// process, shared: loads and stores are the file's pool blocks, with no kernel
/// on the way (DAX). `prot`: PROT_READ, optionally PROT_WRITE (the file must be
/// open for reading, and for writing without O_APPEND, to store). Stores are
/// durable after `ferrite_persist`. Pages past the end of the file at mapping
/// time fault. While a file is mapped it cannot shrink (EBUSY). The address, or
/// NULL and errno (EACCES, EINVAL, ENOSPC; EBUSY: a plain process holds the file
/// in the kernel's page cache).
#[no_mangle]
pub unsafe extern "C" fn ferrite_mmap(
    f: *mut ferrite,
    fd: c_int,
    len: usize,
    prot: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: the caller's handle.
    guard(std::ptr::null_mut(), || unsafe {
        handle(f)?.mmap(fd, len, prot, off).map(|a| a as *mut c_void)
    })
}

/// Map `len` bytes of open file `fd` from `off` (a multiple of 4096, inside the
/// file's pages) **atomically** (NOVA's atomic-mmap): the process gets its own copy,
/// and `ferrite_persist` of a range of it commits every page of the range changed
/// since the last commit as one atomic update: after a crash the file shows all of
/// those pages or none. Others' writes after the mapping are not seen in it; a
/// commit writes whole changed pages. EBUSY at commit while the file is DAX-mapped.
/// `ferrite_munmap` of the whole mapping ends it. The address, or NULL and errno.
#[no_mangle]
pub unsafe extern "C" fn ferrite_mmap_atomic(
    f: *mut ferrite,
    fd: c_int,
    len: usize,
    prot: c_int,
    off: i64,
) -> *mut c_void {
    // SAFETY: the caller's handle.
    guard(std::ptr::null_mut(), || unsafe {
        handle(f)?.mmap_atomic(fd, len, prot, off).map(|a| a as *mut c_void)
    })
}

/// NUMA placement of open file `fd` (like the ASPLOS '19 paper's ioctl): its new
/// data goes to memory node `node`, or to the writing thread's node when `node` is
/// negative (the default). Stored as the `user.ferrite.numa` attribute. 0, or -1
/// and errno (EINVAL: no such node on this machine).
#[no_mangle]
pub unsafe extern "C" fn ferrite_set_numa_node(f: *mut ferrite, fd: c_int, node: c_int) -> c_int {
    // SAFETY: the caller's handle.
    guard(-1, || unsafe { handle(f)?.set_numa_node(fd, node).map(|()| 0) })
}

/// A persistent buffer of `len` bytes (Libpubl's idea): memory that is pool
/// blocks, for the program to fill with its own stores and then write into files
/// with `ferrite_buf_write`. Its content starts undefined. NULL and errno on
/// failure (ENOSPC).
#[no_mangle]
pub unsafe extern "C" fn ferrite_buf_alloc(f: *mut ferrite, len: usize) -> *mut c_void {
    // SAFETY: the caller's handle.
    guard(std::ptr::null_mut(), || unsafe { handle(f)?.buf_alloc(len).map(|a| a as *mut c_void) })
}

/// pwrite(2) of `len` bytes at `buf` (inside a persistent buffer) into open file
/// `fd` at `off`, durable and atomic when it returns. The buffer's whole pages that
/// fall on whole file pages (`buf` and `off` at the same offset within a page)
/// become the file's without a copy, and the buffer gets fresh memory for them at
/// once (their content undefined); the rest is copied. No need to persist the
/// buffer first. Bytes written, or -1 and errno.
#[no_mangle]
pub unsafe extern "C" fn ferrite_buf_write(
    f: *mut ferrite,
    fd: c_int,
    buf: *const c_void,
    len: usize,
    off: i64,
) -> isize {
    // SAFETY: the caller's handle; the range is checked against its buffers.
    guard(-1, || unsafe { handle(f)?.buf_write(fd, buf as usize, len, off).map(|n| n as isize) })
}

/// Free the persistent buffer that starts at `buf`. 0, or -1 and errno.
#[no_mangle]
pub unsafe extern "C" fn ferrite_buf_free(f: *mut ferrite, buf: *mut c_void) -> c_int {
    // SAFETY: the caller's handle.
    guard(-1, || unsafe { handle(f)?.buf_free(buf as usize).map(|()| 0) })
}

/// Unmap (part of) a mapping of `ferrite_mmap` (the whole of an atomic one); the
/// file may shrink again once none of its mappings is left. 0, or -1 and errno.
#[no_mangle]
pub unsafe extern "C" fn ferrite_munmap(f: *mut ferrite, addr: *mut c_void, len: usize) -> c_int {
    // SAFETY: the caller's handle; the range is only compared and unmapped.
    guard(-1, || unsafe { handle(f)?.munmap(addr as usize, len).map(|()| 0) })
}

/// Make the stores to `[addr, addr + len)` of mappings of `ferrite_mmap` durable
/// (cache-line flushes and one fence: no system call on a DAX or /dev/shm pool);
/// of a mapping of `ferrite_mmap_atomic`, commit its changed pages atomically.
/// Any address and length; 0, or -1 and EINVAL when part of the range is not
/// such a mapping.
#[no_mangle]
pub unsafe extern "C" fn ferrite_persist(
    f: *mut ferrite,
    addr: *const c_void,
    len: usize,
) -> c_int {
    // SAFETY: the caller's handle; the range is flushed only where it is mapped.
    guard(-1, || unsafe { handle(f)?.persist(addr as usize, len).map(|()| 0) })
}

/// fsync(2): every write was durable already; 0.
#[no_mangle]
pub unsafe extern "C" fn ferrite_fsync(f: *mut ferrite, fd: c_int) -> c_int {
    // SAFETY: the caller's handle.
    guard(-1, || unsafe { handle(f)?.fsync(fd).map(|()| 0) })
}

/// ftruncate(2).
#[no_mangle]
pub unsafe extern "C" fn ferrite_ftruncate(f: *mut ferrite, fd: c_int, len: i64) -> c_int {
    // SAFETY: the caller's handle.
    guard(-1, || unsafe { handle(f)?.ftruncate(fd, len).map(|()| 0) })
}

/// fallocate(2) with its mode bits (FALLOC_FL_*): allocation, KEEP_SIZE, PUNCH_HOLE,
/// ZERO_RANGE, COLLAPSE_RANGE and INSERT_RANGE.
#[no_mangle]
pub unsafe extern "C" fn ferrite_fallocate(
    f: *mut ferrite,
    fd: c_int,
    mode: c_int,
    off: i64,
    len: i64,
) -> c_int {
    // SAFETY: the caller's handle.
    guard(-1, || unsafe { handle(f)?.fallocate(fd, mode, off, len).map(|()| 0) })
}

/// FICLONERANGE between two open files of the pool: `len` bytes (0: to the
/// source's end) of `dst_fd` from `off_out` share the blocks of `src_fd` from
/// `off_in`, copy-on-write (a reflink: no data copied), durable and atomic when it
/// returns. Offsets page-aligned; errors as Linux's ioctl.
#[no_mangle]
pub unsafe extern "C" fn ferrite_clone_range(
    f: *mut ferrite,
    src_fd: c_int,
    off_in: i64,
    dst_fd: c_int,
    off_out: i64,
    len: i64,
) -> c_int {
    // SAFETY: the caller's handle.
    guard(-1, || unsafe {
        handle(f)?.clone_range(src_fd, off_in, dst_fd, off_out, len).map(|()| 0)
    })
}

/// fstat(2) into `st`.
#[no_mangle]
pub unsafe extern "C" fn ferrite_fstat(f: *mut ferrite, fd: c_int, st: *mut ferrite_stat) -> c_int {
    guard(-1, || {
        if st.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: the caller's handle and stat buffer.
        unsafe { *st = handle(f)?.fstat(fd)? };
        Ok(0)
    })
}

/// stat(2) of a path inside the pool into `st`.
#[no_mangle]
pub unsafe extern "C" fn ferrite_stat(
    f: *mut ferrite,
    path: *const c_char,
    st: *mut ferrite_stat,
) -> c_int {
    guard(-1, || {
        if st.is_null() {
            return Err(libc::EFAULT);
        }
        // SAFETY: the caller's handle, C string and stat buffer.
        unsafe { *st = handle(f)?.stat(cstr(path)?)? };
        Ok(0)
    })
}

/// mknod(2): a FIFO, socket, character or block device (`dev` as makedev
/// gives it) or a regular file; the process's umask applies. Only a process that
/// opens the node through a mount gets the pipe, socket or device; ferrite_open of
/// one fails with ENXIO.
#[no_mangle]
pub unsafe extern "C" fn ferrite_mknod(
    f: *mut ferrite,
    path: *const c_char,
    mode: c_uint,
    dev: u64,
) -> c_int {
    // SAFETY: the caller's handle and C string.
    guard(-1, || unsafe { handle(f)?.mknod(cstr(path)?, mode, dev).map(|()| 0) })
}

/// mkdir(2) (the process's umask applies).
#[no_mangle]
pub unsafe extern "C" fn ferrite_mkdir(
    f: *mut ferrite,
    path: *const c_char,
    mode: c_uint,
) -> c_int {
    // SAFETY: the caller's handle and C string.
    guard(-1, || unsafe { handle(f)?.mkdir(cstr(path)?, mode).map(|()| 0) })
}

/// unlink(2).
#[no_mangle]
pub unsafe extern "C" fn ferrite_unlink(f: *mut ferrite, path: *const c_char) -> c_int {
    // SAFETY: the caller's handle and C string.
    guard(-1, || unsafe { handle(f)?.unlink(cstr(path)?).map(|()| 0) })
}

/// rmdir(2).
#[no_mangle]
pub unsafe extern "C" fn ferrite_rmdir(f: *mut ferrite, path: *const c_char) -> c_int {
    // SAFETY: the caller's handle and C string.
    guard(-1, || unsafe { handle(f)?.rmdir(cstr(path)?).map(|()| 0) })
}

/// rename(2).
#[no_mangle]
pub unsafe extern "C" fn ferrite_rename(
    f: *mut ferrite,
    from: *const c_char,
    to: *const c_char,
) -> c_int {
    // SAFETY: the caller's handle and C strings.
    guard(-1, || unsafe { handle(f)?.rename(cstr(from)?, cstr(to)?).map(|()| 0) })
}

/// Call `cb` for each entry of a directory (without "." and ".."), with its name,
/// inode and d_type (DT_REG, DT_DIR, DT_LNK); stops early when `cb` returns
/// non-zero. 0, or -1 and errno.
#[no_mangle]
pub unsafe extern "C" fn ferrite_readdir(
    f: *mut ferrite,
    path: *const c_char,
    cb: ferrite_dirent_fn,
    ctx: *mut c_void,
) -> c_int {
    guard(-1, || {
        let cb = cb.ok_or(libc::EFAULT)?;
        // SAFETY: the caller's handle and C string.
        let list = unsafe { handle(f)?.readdir(cstr(path)?)? };
        for (name, ino, dt) in list {
            let Ok(c) = std::ffi::CString::new(name) else { continue };
            // SAFETY: the caller's callback with its own context; the name lives
            // for the call.
            if unsafe { cb(ctx, c.as_ptr(), ino, dt) } != 0 {
                break;
            }
        }
        Ok(0)
    })
}

/// The library's version, a static string.
#[no_mangle]
pub extern "C" fn ferrite_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr() as *const c_char
}
