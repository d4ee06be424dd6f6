//! `ferrite_open` takes what open(2) takes: every combination of access mode,
//! O_CREAT, O_EXCL, O_TRUNC and O_APPEND, on a missing and on an existing file, gives
//! the result open(2) gives on tmpfs (success, or the same errno), the same size
//! after the open, and the same size after a write through the descriptor; for a
//! handle attached to a mount and for a pool the process opened alone.
//!
//! Regressions: an attached handle opened its kernel descriptor through std's
//! `OpenOptions`, which refuses O_TRUNC with O_APPEND, and O_CREAT or O_TRUNC with
//! O_RDONLY, with an error that has no errno, so such opens failed with EIO (found
//! by a C benchmark loop that opened its log with O_CREAT | O_RDWR | O_TRUNC |
//! O_APPEND); and a pool's own `Fs::open_path` ignored O_TRUNC with O_RDONLY, which
//! Linux's open(2) truncates.

mod fuse_util;

use ferrite::ffi;
use fuse_util::*;
use std::ffi::CString;
use std::path::Path;

/// What an open (and a write after it) gave: the errno of a failed open, or the size
/// after the open and after writing "xy" (the write's errno when it failed).
#[derive(Debug, PartialEq, Eq)]
enum Outcome {
    Failed(i32),
    Opened { size: u64, after_write: Result<u64, i32> },
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// open(2) and write(2) on a kernel file system.
fn kernel(path: &Path, flags: i32) -> Outcome {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), flags, 0o644) };
    if fd < 0 {
        return Outcome::Failed(errno());
    }
    let size = std::fs::metadata(path).expect("stat").len();
    // SAFETY: a live descriptor and a 2-byte buffer.
    let w = unsafe { libc::write(fd, b"xy".as_ptr().cast(), 2) };
    let after_write =
        if w < 0 { Err(errno()) } else { Ok(std::fs::metadata(path).expect("stat").len()) };
    // SAFETY: our descriptor.
    unsafe { libc::close(fd) };
    Outcome::Opened { size, after_write }
}

/// `ferrite_open` and `ferrite_write` through handle `f`; `name` as the C API names it.
fn capi(f: *mut ffi::ferrite, name: &str, flags: i32) -> Outcome {
    let c = CString::new(name).expect("name");
    let size = |fd| {
        let mut st = std::mem::MaybeUninit::<ferrite::ferrite_stat>::zeroed();
        // SAFETY: a live handle and descriptor, and room for the attributes.
        assert_eq!(unsafe { ffi::ferrite_fstat(f, fd, st.as_mut_ptr()) }, 0, "fstat");
        // SAFETY: filled by the successful call.
        unsafe { st.assume_init() }.size
    };
    // SAFETY: a live handle and a NUL-terminated path.
    let fd = unsafe { ffi::ferrite_open(f, c.as_ptr(), flags, 0o644) };
    if fd < 0 {
        return Outcome::Failed(errno());
    }
    let before = size(fd);
    // SAFETY: a live handle and descriptor, a 2-byte buffer.
    let w = unsafe { ffi::ferrite_write(f, fd, b"xy".as_ptr().cast(), 2) };
    let after_write = if w < 0 { Err(errno()) } else { Ok(size(fd)) };
    // SAFETY: our descriptor.
    assert_eq!(unsafe { ffi::ferrite_close(f, fd) }, 0, "close");
    Outcome::Opened { size: before, after_write }
}

/// Every combination, on `f` (files named `/{prefix}N`), against open(2) in `model`.
fn same_as_open(f: *mut ffi::ferrite, prefix: &str, model: &Path) {
    let mut cases = 0;
    for acc in [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR] {
        for bits in 0..16 {
            let extra = [libc::O_CREAT, libc::O_EXCL, libc::O_TRUNC, libc::O_APPEND]
                .iter()
                .enumerate()
                .filter(|(i, _)| bits & (1 << i) != 0)
                .fold(0, |a, (_, b)| a | b);
            for exists in [false, true] {
                cases += 1;
                let name = format!("{prefix}{cases}");
                let kpath = model.join(&name);
                let cname = format!("/{name}");
                if exists {
                    std::fs::write(&kpath, b"abcdef").expect("model file");
                    let c = CString::new(cname.as_str()).expect("name");
                    let flags = libc::O_CREAT | libc::O_WRONLY;
                    // SAFETY: a live handle and a NUL-terminated path.
                    let fd = unsafe { ffi::ferrite_open(f, c.as_ptr(), flags, 0o644) };
                    assert!(fd >= 0, "creating {cname}: errno {}", errno());
                    // SAFETY: a live handle and descriptor, a 6-byte buffer.
                    let w = unsafe { ffi::ferrite_write(f, fd, b"abcdef".as_ptr().cast(), 6) };
                    assert_eq!(w, 6, "writing {cname}");
                    // SAFETY: our descriptor.
                    assert_eq!(unsafe { ffi::ferrite_close(f, fd) }, 0);
                }
                let flags = acc | extra;
                let want = kernel(&kpath, flags);
                let got = capi(f, &cname, flags);
                assert_eq!(
                    got,
                    want,
                    "flags {flags:#o} on a {} file: C API (left) against open(2) on tmpfs",
                    if exists { "existing" } else { "missing" }
                );
            }
        }
    }
    assert_eq!(cases, 96);
}

#[test]
fn ferrite_open_takes_every_flag_combination_open_takes() {
    let model = tempfile::tempdir_in("/dev/shm").expect("model dir");
    // A pool of the process's own.
    let pool = format!("/dev/shm/{}.pool", unique("capi-flags"));
    let cpool = CString::new(pool.as_str()).expect("pool");
    // SAFETY: a NUL-terminated path.
    let f = unsafe { ffi::ferrite_open_pool(cpool.as_ptr(), 64 << 20) };
    assert!(!f.is_null(), "ferrite_open_pool: errno {}", errno());
    same_as_open(f, "own", model.path());
    // SAFETY: the handle, released once.
    assert_eq!(unsafe { ffi::ferrite_release(f) }, 0);
    let _ = std::fs::remove_file(&pool);

    // A client of a mount.
    let m = Mount::new("capi-flags", "64M", "");
    let cm = CString::new(m.mnt.as_os_str().as_encoded_bytes()).expect("mount");
    // SAFETY: a NUL-terminated path.
    let f = unsafe { ffi::ferrite_attach(cm.as_ptr()) };
    assert!(!f.is_null(), "ferrite_attach: errno {}", errno());
    same_as_open(f, "attached", model.path());
    // SAFETY: the handle, released once.
    assert_eq!(unsafe { ffi::ferrite_release(f) }, 0);
}
