//! `ferrite_open` takes what open(2) takes: every combination of access mode,
//! O_CREAT, O_EXCL, O_TRUNC and O_APPEND, on a missing and on an existing file, gives
//! the result open(2) gives on tmpfs (success, or the same errno), the same size
//! after the open, and the same size after a write through the descriptor; for a
//! handle attached to a mount and for a pool the process opened alone. And seeded
//! random sequences of descriptor calls (read, write, pread, pwrite, lseek,
//! ftruncate, fstat) through two descriptors of one file give what the same calls
//! give on tmpfs, call by call and byte by byte.
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

/// Run `check` on a handle of a pool this process opens alone ("own"), then on a
/// client of a fresh mount ("attached"), each released after; `model` is a tmpfs
/// directory for the kernel's side, shared by both (names carry the side).
fn on_both_handles(tag: &str, check: impl Fn(*mut ffi::ferrite, &str, &Path)) {
    let model = tempfile::tempdir_in("/dev/shm").expect("model dir");
    // The pool file goes when the test ends, also when it fails.
    struct Rm(String);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let pool = Rm(format!("/dev/shm/{}.pool", unique(tag)));
    let cpool = CString::new(pool.0.as_str()).expect("pool");
    // SAFETY: a NUL-terminated path.
    let f = unsafe { ffi::ferrite_open_pool(cpool.as_ptr(), 64 << 20) };
    assert!(!f.is_null(), "ferrite_open_pool: errno {}", errno());
    check(f, "own", model.path());
    // SAFETY: the handle, released once.
    assert_eq!(unsafe { ffi::ferrite_release(f) }, 0);
    drop(pool);

    let m = Mount::new(tag, "64M", "");
    let cm = CString::new(m.mnt.as_os_str().as_encoded_bytes()).expect("mount");
    // SAFETY: a NUL-terminated path.
    let f = unsafe { ffi::ferrite_attach(cm.as_ptr()) };
    assert!(!f.is_null(), "ferrite_attach: errno {}", errno());
    check(f, "attached", model.path());
    // SAFETY: the handle, released once.
    assert_eq!(unsafe { ffi::ferrite_release(f) }, 0);
}

#[test]
fn ferrite_open_takes_every_flag_combination_open_takes() {
    on_both_handles("capi-flags", same_as_open);
}

/// One call of a random sequence, applied to C API descriptor `d` of handle `f`,
/// or to kernel descriptor `d`; the result as (return value or -errno, bytes read).
#[derive(Clone, Debug)]
enum Call {
    Read(usize),
    Write(Vec<u8>),
    Pread(usize, i64),
    Pwrite(Vec<u8>, i64),
    Lseek(i64, i32),
    Ftruncate(i64),
    Size,
}

/// A call without its data, for a failure message.
fn brief(c: &Call) -> String {
    match c {
        Call::Write(d) => format!("write({})", d.len()),
        Call::Pwrite(d, o) => format!("pwrite({},{o})", d.len()),
        c => format!("{c:?}").to_lowercase(),
    }
}

fn random_call(r: &mut Rng) -> Call {
    let len = |r: &mut Rng| *r.pick(&[0usize, 1, 63, 64, 100, 4095, 4096, 4097, 9000]);
    let off = |r: &mut Rng| *r.pick(&[-1i64, 0, 1, 4095, 4096, 5000, 8191, 20000]);
    match r.below(7) {
        0 => Call::Read(len(r)),
        1 => {
            let n = len(r);
            Call::Write(r.bytes(n))
        }
        2 => Call::Pread(len(r), off(r)),
        3 => {
            let n = len(r);
            Call::Pwrite(r.bytes(n), off(r))
        }
        4 => Call::Lseek(
            off(r),
            *r.pick(&[
                libc::SEEK_SET,
                libc::SEEK_CUR,
                libc::SEEK_END,
                libc::SEEK_DATA,
                libc::SEEK_HOLE,
                7,
            ]),
        ),
        5 => Call::Ftruncate(off(r)),
        _ => Call::Size,
    }
}

type Got = (i64, Vec<u8>);

fn ret(v: i64) -> i64 {
    if v < 0 {
        -i64::from(errno())
    } else {
        v
    }
}

fn on_kernel(fd: i32, c: &Call) -> Got {
    let mut buf = Vec::new();
    // SAFETY: a live descriptor and buffers of the lengths passed.
    let v = unsafe {
        match c {
            Call::Read(n) => {
                buf.resize(*n, 0);
                libc::read(fd, buf.as_mut_ptr().cast(), *n) as i64
            }
            Call::Write(d) => libc::write(fd, d.as_ptr().cast(), d.len()) as i64,
            Call::Pread(n, o) => {
                buf.resize(*n, 0);
                libc::pread(fd, buf.as_mut_ptr().cast(), *n, *o) as i64
            }
            Call::Pwrite(d, o) => libc::pwrite(fd, d.as_ptr().cast(), d.len(), *o) as i64,
            Call::Lseek(o, w) => libc::lseek(fd, *o, *w),
            Call::Ftruncate(l) => i64::from(libc::ftruncate(fd, *l)),
            Call::Size => {
                let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
                let r = libc::fstat(fd, st.as_mut_ptr());
                if r < 0 {
                    i64::from(r)
                } else {
                    st.assume_init().st_size
                }
            }
        }
    };
    let v = ret(v);
    buf.truncate(v.max(0) as usize);
    (v, buf)
}

fn on_capi(f: *mut ffi::ferrite, fd: i32, c: &Call) -> Got {
    let mut buf = Vec::new();
    // SAFETY: a live handle and descriptor, and buffers of the lengths passed.
    let v = unsafe {
        match c {
            Call::Read(n) => {
                buf.resize(*n, 0);
                ffi::ferrite_read(f, fd, buf.as_mut_ptr().cast(), *n) as i64
            }
            Call::Write(d) => ffi::ferrite_write(f, fd, d.as_ptr().cast(), d.len()) as i64,
            Call::Pread(n, o) => {
                buf.resize(*n, 0);
                ffi::ferrite_pread(f, fd, buf.as_mut_ptr().cast(), *n, *o) as i64
            }
            Call::Pwrite(d, o) => ffi::ferrite_pwrite(f, fd, d.as_ptr().cast(), d.len(), *o) as i64,
            Call::Lseek(o, w) => ffi::ferrite_lseek(f, fd, *o, *w),
            Call::Ftruncate(l) => i64::from(ffi::ferrite_ftruncate(f, fd, *l)),
            Call::Size => {
                let mut st = std::mem::MaybeUninit::<ferrite::ferrite_stat>::zeroed();
                let r = ffi::ferrite_fstat(f, fd, st.as_mut_ptr());
                if r < 0 {
                    i64::from(r)
                } else {
                    st.assume_init().size as i64
                }
            }
        }
    };
    let v = ret(v);
    buf.truncate(v.max(0) as usize);
    (v, buf)
}

/// `seeds` random sequences on handle `f` against the kernel in `model`.
fn sequences_match(f: *mut ffi::ferrite, tag: &str, model: &Path, seeds: std::ops::Range<u64>) {
    // Two descriptors each side: one plain read-write, one O_APPEND read-write.
    let modes = [libc::O_RDWR, libc::O_RDWR | libc::O_APPEND];
    for seed in seeds {
        let name = format!("{tag}-seq{seed}");
        let kpath = model.join(&name);
        let cname = CString::new(format!("/{name}")).expect("name");
        let kc = CString::new(kpath.as_os_str().as_encoded_bytes()).expect("path");
        let mut kfd = [0; 2];
        let mut cfd = [0; 2];
        for (i, m) in modes.iter().enumerate() {
            // SAFETY: NUL-terminated paths; descriptors closed below.
            kfd[i] = unsafe { libc::open(kc.as_ptr(), m | libc::O_CREAT, 0o644) };
            cfd[i] = unsafe { ffi::ferrite_open(f, cname.as_ptr(), m | libc::O_CREAT, 0o644) };
            assert!(kfd[i] >= 0 && cfd[i] >= 0, "opening {name}: errno {}", errno());
        }
        let mut r = Rng(seed);
        let mut done = Vec::new();
        for _ in 0..300 {
            let which = r.below(2) as usize;
            let call = random_call(&mut r);
            let want = on_kernel(kfd[which], &call);
            let got = on_capi(f, cfd[which], &call);
            done.push(format!("{which}:{}", brief(&call)));
            assert!(
                got == want,
                "{tag}, seed {seed}: call {} gave {:?}, open(2) on tmpfs {:?} (return value, \
                 bytes read); calls (descriptor:call): {}",
                done.len(),
                (got.0, got.1.len()),
                (want.0, want.1.len()),
                done.join(" ")
            );
        }
        for i in 0..2 {
            // SAFETY: our descriptors.
            unsafe {
                libc::close(kfd[i]);
                ffi::ferrite_close(f, cfd[i]);
            }
        }
    }
}

#[test]
fn random_descriptor_calls_do_what_they_do_on_tmpfs() {
    on_both_handles("capi-seq", |f, side, model| sequences_match(f, side, model, 0..60));
}

/// Paths of the namespace sequences: names, nested names, and the awkward ones
/// (".", "..", trailing slashes, a file used as a directory).
const NS_PATHS: &[&str] = &[
    "a", "b", "d", "e", "d/a", "d/b", "d/e", "d/e/a", "e/a", "a/", "d/", "d/.", "d/..", "a/x",
    "nope/a", ".",
];

#[derive(Clone, Debug)]
enum NsCall {
    Mkdir(&'static str),
    Rmdir(&'static str),
    Unlink(&'static str),
    Rename(&'static str, &'static str),
    Create(&'static str),
    Fifo(&'static str),
    Stat(&'static str),
    List(&'static str),
}

fn random_ns_call(r: &mut Rng) -> NsCall {
    let p = |r: &mut Rng| *r.pick(NS_PATHS);
    match r.below(8) {
        0 => NsCall::Mkdir(p(r)),
        1 => NsCall::Rmdir(p(r)),
        2 => NsCall::Unlink(p(r)),
        3 => NsCall::Rename(p(r), p(r)),
        4 => NsCall::Create(p(r)),
        5 => NsCall::Fifo(p(r)),
        6 => NsCall::Stat(p(r)),
        _ => NsCall::List(p(r)),
    }
}

/// A result as text: "ok", "errno N", a stat's type, permission bits, size and
/// links, or a sorted listing with d_types.
fn ns_kernel(root: &Path, c: &NsCall) -> String {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
    let j = |p: &str| root.join(p);
    let err = |e: std::io::Error| format!("errno {}", e.raw_os_error().unwrap_or(0));
    let unit = |r: std::io::Result<()>| r.map_or_else(err, |()| "ok".to_string());
    match c {
        NsCall::Mkdir(p) => unit(std::fs::DirBuilder::new().mode(0o777).create(j(p))),
        NsCall::Rmdir(p) => unit(std::fs::remove_dir(j(p))),
        NsCall::Unlink(p) => unit(std::fs::remove_file(j(p))),
        NsCall::Rename(a, b) => unit(std::fs::rename(j(a), j(b))),
        NsCall::Create(p) => {
            let c = CString::new(j(p).as_os_str().as_encoded_bytes()).expect("path");
            // (O_NONBLOCK: a FIFO with no reader fails ENXIO instead of blocking.)
            let fl = libc::O_CREAT | libc::O_WRONLY | libc::O_NONBLOCK;
            // SAFETY: a NUL-terminated path; the descriptor is closed at once.
            let fd = unsafe { libc::open(c.as_ptr(), fl, 0o666) };
            if fd < 0 {
                return format!("errno {}", errno());
            }
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
            "ok".into()
        }
        NsCall::Fifo(p) => {
            let r = rustix::fs::mknodat(
                rustix::fs::CWD,
                j(p),
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o666),
                0,
            );
            r.map_or_else(|e| format!("errno {}", e.raw_os_error()), |()| "ok".into())
        }
        NsCall::Stat(p) => match std::fs::metadata(j(p)) {
            Ok(m) => format!("mode {:o} size {} nlink {}", m.mode(), m.size(), m.nlink()),
            Err(e) => err(e),
        },
        NsCall::List(p) => match std::fs::read_dir(j(p)) {
            Ok(rd) => {
                let mut v: Vec<String> = rd
                    .map(|e| {
                        let e = e.expect("entry");
                        let t = e.file_type().expect("type");
                        let k = if t.is_dir() {
                            'd'
                        } else if t.is_symlink() {
                            'l'
                        } else if t.is_fifo() {
                            'p'
                        } else {
                            'f'
                        };
                        format!("{}:{k}", e.file_name().to_string_lossy())
                    })
                    .collect();
                v.sort();
                v.join(",")
            }
            Err(e) => err(e),
        },
    }
}

fn ns_capi(f: *mut ffi::ferrite, prefix: &str, c: &NsCall) -> String {
    let j = |p: &str| CString::new(format!("/{prefix}/{p}")).expect("path");
    let res = |r: i32| if r == 0 { "ok".to_string() } else { format!("errno {}", errno()) };
    // SAFETY: a live handle and NUL-terminated paths throughout.
    unsafe {
        match c {
            NsCall::Mkdir(p) => res(ffi::ferrite_mkdir(f, j(p).as_ptr(), 0o777)),
            NsCall::Rmdir(p) => res(ffi::ferrite_rmdir(f, j(p).as_ptr())),
            NsCall::Unlink(p) => res(ffi::ferrite_unlink(f, j(p).as_ptr())),
            NsCall::Rename(a, b) => res(ffi::ferrite_rename(f, j(a).as_ptr(), j(b).as_ptr())),
            NsCall::Create(p) => {
                let fd = ffi::ferrite_open(f, j(p).as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o666);
                if fd < 0 {
                    return format!("errno {}", errno());
                }
                res(ffi::ferrite_close(f, fd))
            }
            NsCall::Fifo(p) => res(ffi::ferrite_mknod(f, j(p).as_ptr(), libc::S_IFIFO | 0o666, 0)),
            NsCall::Stat(p) => {
                let mut st = std::mem::MaybeUninit::<ferrite::ferrite_stat>::zeroed();
                if ffi::ferrite_stat(f, j(p).as_ptr(), st.as_mut_ptr()) != 0 {
                    return format!("errno {}", errno());
                }
                let st = st.assume_init();
                format!("mode {:o} size {} nlink {}", st.mode, st.size, st.nlink)
            }
            NsCall::List(p) => {
                extern "C" fn add(
                    ctx: *mut libc::c_void,
                    name: *const libc::c_char,
                    _ino: u64,
                    dtype: u8,
                ) -> i32 {
                    // SAFETY: the Vec passed below, and a NUL-terminated name.
                    let (v, n) = unsafe {
                        (&mut *ctx.cast::<Vec<String>>(), std::ffi::CStr::from_ptr(name))
                    };
                    let k = match dtype {
                        libc::DT_DIR => 'd',
                        libc::DT_LNK => 'l',
                        libc::DT_FIFO => 'p',
                        _ => 'f',
                    };
                    v.push(format!("{}:{k}", n.to_string_lossy()));
                    0
                }
                let mut v: Vec<String> = Vec::new();
                let ctx = (&mut v as *mut Vec<String>).cast();
                if ffi::ferrite_readdir(f, j(p).as_ptr(), Some(add), ctx) != 0 {
                    return format!("errno {}", errno());
                }
                v.sort();
                v.join(",")
            }
        }
    }
}

fn namespace_sequences_match(
    f: *mut ffi::ferrite,
    tag: &str,
    model: &Path,
    seeds: std::ops::Range<u64>,
) {
    for seed in seeds {
        let prefix = format!("{tag}-ns{seed}");
        let kroot = model.join(&prefix);
        std::fs::create_dir(&kroot).expect("model root");
        let c = CString::new(format!("/{prefix}")).expect("root");
        // SAFETY: a live handle and a NUL-terminated path.
        assert_eq!(unsafe { ffi::ferrite_mkdir(f, c.as_ptr(), 0o755) }, 0, "root: {}", errno());
        let mut r = Rng(seed);
        let mut done = Vec::new();
        for _ in 0..150 {
            let call = random_ns_call(&mut r);
            let want = ns_kernel(&kroot, &call);
            let got = ns_capi(f, &prefix, &call);
            done.push(format!("{call:?}->{want}"));
            assert!(
                got == want,
                "{tag}, seed {seed}: {call:?} gave {got:?}, the kernel on tmpfs {want:?}; \
                 calls: {}",
                done.join(" ")
            );
        }
    }
}

#[test]
fn namespace_calls_do_what_they_do_on_tmpfs() {
    // A mask that matters for the modes asked (0777 and 0666): both handles apply
    // it as the kernel does. (The other tests of this binary compare no modes.)
    // SAFETY: umask has no memory effects.
    unsafe { libc::umask(0o027) };
    on_both_handles("capi-ns", |f, side, model| namespace_sequences_match(f, side, model, 0..60));
}

/// Regression: a count above `isize::MAX` made the C API build a slice Rust cannot
/// hold (undefined behaviour); read(2) and write(2) fail with EFAULT for a buffer
/// that reaches past the user address space, and so do the C API's calls now. A
/// count above what Linux moves per call (`MAX_RW_COUNT`) still moves what there
/// is, as read(2) does.
#[test]
fn a_count_past_the_address_space_is_efault_as_in_read() {
    on_both_handles("capi-efault", |f, prefix, model| {
        let name = CString::new(format!("/{prefix}-efault")).unwrap();
        let kpath = model.join(format!("{prefix}-efault"));
        let kc = CString::new(kpath.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: NUL-terminated paths; a live handle.
        let (fd, kfd) = unsafe {
            let flags = libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC;
            (
                ffi::ferrite_open(f, name.as_ptr(), flags, 0o644),
                libc::open(kc.as_ptr(), flags, 0o644),
            )
        };
        assert!(fd >= 0 && kfd >= 0, "open: errno {}", errno());
        let mut b = [7u8; 16];
        let p = b.as_mut_ptr().cast::<libc::c_void>();
        // SAFETY (each call): live descriptors; the kernel checks the count before it
        // touches the buffer, and so must the C API.
        let got =
            |what: &str, v: isize| (what.to_string(), if v < 0 { -errno() as isize } else { v });
        let calls = |k: bool| unsafe {
            vec![
                if k {
                    got("write", libc::write(kfd, p, usize::MAX))
                } else {
                    got("write", ffi::ferrite_write(f, fd, p, usize::MAX))
                },
                if k {
                    got("pread", libc::pread(kfd, p, usize::MAX, 0))
                } else {
                    got("pread", ffi::ferrite_pread(f, fd, p, usize::MAX, 0))
                },
                if k {
                    got("write 16", libc::write(kfd, p, 16))
                } else {
                    got("write 16", ffi::ferrite_write(f, fd, p, 16))
                },
                if k {
                    got("pread 3 GiB", libc::pread(kfd, p, 3 << 30, 10))
                } else {
                    got("pread 3 GiB", ffi::ferrite_pread(f, fd, p, 3 << 30, 10))
                },
            ]
        };
        assert_eq!(calls(false), calls(true), "{prefix}: C API against read(2) and write(2)");
        // SAFETY: our descriptors, closed once.
        unsafe {
            ffi::ferrite_close(f, fd);
            libc::close(kfd);
        }
    });
}
