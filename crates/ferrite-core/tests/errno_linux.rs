//! Error numbers of every operation, case by case, as Linux returns them.
//!
//! Every expectation here was measured on tmpfs (kernel 6.18) with a C probe calling
//! the path-based system calls; the inode-level call below is the one the FUSE layer
//! or the LD_PRELOAD shim makes for that system call. Where several errors apply at
//! once, Linux's order of checks decides, and so these tests pin the order too.
//!
//! Regression notes (core bugs these tests found, all fixed in `src/ops.rs`):
//! - A name-length or '.'/'..' check ran before the parent-is-a-directory check, so
//!   `mkdir("file/<256 bytes>")`, `unlink("file/.")` and friends gave ENAMETOOLONG /
//!   EISDIR instead of ENOTDIR (`make_node`, `remove`, `lookup_ino`).
//! - `link` of a directory gave EPERM before checking the new name (Linux: EEXIST,
//!   ENAMETOOLONG and ENOTDIR come first).
//! - `rename` checked file/dir type mismatch before ancestry, so `rename("a/b/file",
//!   "a")` gave EISDIR (Linux: ENOTEMPTY) and `rename("a", "a/b/file")` gave ENOTDIR
//!   (Linux: EINVAL); a source of "." with RENAME_NOREPLACE gave EEXIST (Linux:
//!   EBUSY); an overlong new name hid a missing source (Linux: ENOENT first).
//! - `write`/`truncate`/`fallocate` used EFBIG for offsets and sizes beyond
//!   2^63 - 1, which are negative `loff_t` values on Linux: EINVAL (only fallocate's
//!   `offset + len` past the limit is EFBIG); truncate of a directory to a negative
//!   size gave EISDIR (Linux checks the size first); fallocate checked the limit
//!   before the file type.
//! - Extended attributes: a bare namespace prefix ("user.") gave EOPNOTSUPP (Linux:
//!   EINVAL); `user.*` attributes could be set on symlinks (Linux: EPERM, and
//!   ENODATA for a read); the namespace was checked before the inode (Linux: name
//!   length, value size, inode, permission, then namespace).
//! - `setattr` stored times with a nanosecond field of 10^9 or more (Linux: EINVAL).

mod common;
use common::*;
use ferrite_core::*;
use libc::*;

struct T {
    fs: Fs<SimMedium>,
    root: u64,
    d: u64,
    f: u64,
    a: u64,
    b: u64,
    bfile: u64,
}

fn setup() -> T {
    let fs = fresh_sim(8 << 20, 2);
    let root = fs.root();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let f = fs.create(root, b"f", 0o644, 0, 0).unwrap().ino;
    let a = fs.mkdir(root, b"a", 0o755, 0, 0).unwrap().ino;
    let b = fs.mkdir(a, b"b", 0o755, 0, 0).unwrap().ino;
    let bfile = fs.create(b, b"file", 0o644, 0, 0).unwrap().ino;
    T { fs, root, d, f, a, b, bfile }
}

fn long() -> Vec<u8> {
    vec![b'x'; 256]
}

#[track_caller]
fn expect<V: std::fmt::Debug>(what: &str, r: Result<V>, want: i32) {
    let got = errno(&r);
    assert_eq!(got, want, "{what}: got {r:?} (errno {got}), Linux gives {want}");
}

const NR: RenameFlags = RenameFlags { noreplace: false, exchange: false };
const NOREPL: RenameFlags = RenameFlags { noreplace: true, exchange: false };
const EXCH: RenameFlags = RenameFlags { noreplace: false, exchange: true };

#[test]
fn create_mkdir_symlink() {
    let t = setup();
    let fs = &t.fs;
    expect("create f/x", fs.create(t.f, b"x", 0o644, 0, 0), ENOTDIR);
    expect("create d/.", fs.create(t.d, b".", 0o644, 0, 0), EEXIST);
    expect("create d/..", fs.create(t.d, b"..", 0o644, 0, 0), EEXIST);
    expect("create d/<256>", fs.create(t.d, &long(), 0o644, 0, 0), ENAMETOOLONG);
    expect("create f/<256>", fs.create(t.f, &long(), 0o644, 0, 0), ENOTDIR);
    expect("create d (exists)", fs.create(t.root, b"d", 0o644, 0, 0), EEXIST);
    expect("create in a missing inode", fs.create(9999, b"x", 0o644, 0, 0), ENOENT);
    expect("create d/<255>", fs.create(t.d, &[b'y'; 255], 0o644, 0, 0), 0);
    expect("mkdir d/.", fs.mkdir(t.d, b".", 0o755, 0, 0), EEXIST);
    expect("mkdir d/..", fs.mkdir(t.d, b"..", 0o755, 0, 0), EEXIST);
    expect("mkdir f/x", fs.mkdir(t.f, b"x", 0o755, 0, 0), ENOTDIR);
    expect("mkdir f/<256>", fs.mkdir(t.f, &long(), 0o755, 0, 0), ENOTDIR);
    expect("mkdir d/<256>", fs.mkdir(t.d, &long(), 0o755, 0, 0), ENAMETOOLONG);
    expect("mkdir d (exists)", fs.mkdir(t.root, b"d", 0o755, 0, 0), EEXIST);
    expect("mkdir f (exists, a file)", fs.mkdir(t.root, b"f", 0o755, 0, 0), EEXIST);
    expect("symlink ''", fs.symlink(t.root, b"s0", b"", 0, 0), ENOENT);
    expect("symlink '' in a file", fs.symlink(t.f, b"s0", b"", 0, 0), ENOENT);
    expect("symlink 4096", fs.symlink(t.root, b"s1", &[b't'; 4096], 0, 0), ENAMETOOLONG);
    expect("symlink 4095", fs.symlink(t.root, b"s2", &[b't'; 4095], 0, 0), 0);
    expect("symlink f/x", fs.symlink(t.f, b"x", b"t", 0, 0), ENOTDIR);
    expect("symlink d/.", fs.symlink(t.d, b".", b"t", 0, 0), EEXIST);
    expect("symlink d/<256>", fs.symlink(t.d, &long(), b"t", 0, 0), ENAMETOOLONG);
    expect("symlink over f", fs.symlink(t.root, b"f", b"t", 0, 0), EEXIST);
    assert_fsck_clean(fs, "create_mkdir_symlink");
}

#[test]
fn link() {
    let t = setup();
    let fs = &t.fs;
    expect("link d new", fs.link(t.d, t.root, b"dl"), EPERM);
    expect("link d f (existing)", fs.link(t.d, t.root, b"f"), EEXIST);
    expect("link f f/x", fs.link(t.f, t.f, b"x"), ENOTDIR);
    expect("link d f/x", fs.link(t.d, t.f, b"x"), ENOTDIR);
    expect("link f d/.", fs.link(t.f, t.d, b"."), EEXIST);
    expect("link d d/.", fs.link(t.d, t.d, b"."), EEXIST);
    expect("link d d/<256>", fs.link(t.d, t.d, &long()), ENAMETOOLONG);
    expect("link f d/<256>", fs.link(t.f, t.d, &long()), ENAMETOOLONG);
    expect("link missing d/y", fs.link(9999, t.d, b"y"), ENOENT);
    // An unlinked but open file cannot get a name back (linkat AT_EMPTY_PATH).
    let g = fs.create(t.root, b"g", 0o644, 0, 0).unwrap().ino;
    fs.open(g).unwrap();
    fs.unlink(t.root, b"g").unwrap();
    expect("link unlinked-open g", fs.link(g, t.root, b"back"), ENOENT);
    fs.release(g).unwrap();
    expect("link f d/ok", fs.link(t.f, t.d, b"ok"), 0);
    assert_fsck_clean(fs, "link");
}

#[test]
fn unlink_rmdir() {
    let t = setup();
    let fs = &t.fs;
    expect("unlink d/.", fs.unlink(t.d, b"."), EISDIR);
    expect("unlink d/..", fs.unlink(t.d, b".."), EISDIR);
    expect("unlink f/.", fs.unlink(t.f, b"."), ENOTDIR);
    expect("unlink f/x", fs.unlink(t.f, b"x"), ENOTDIR);
    expect("unlink d", fs.unlink(t.root, b"d"), EISDIR);
    expect("unlink d/<256>", fs.unlink(t.d, &long()), ENAMETOOLONG);
    expect("unlink f/<256>", fs.unlink(t.f, &long()), ENOTDIR);
    expect("unlink missing", fs.unlink(t.d, b"nope"), ENOENT);
    expect("rmdir d/.", fs.rmdir(t.d, b"."), EINVAL);
    expect("rmdir d/..", fs.rmdir(t.d, b".."), ENOTEMPTY);
    expect("rmdir f/.", fs.rmdir(t.f, b"."), ENOTDIR);
    expect("rmdir f", fs.rmdir(t.root, b"f"), ENOTDIR);
    expect("rmdir a (not empty)", fs.rmdir(t.root, b"a"), ENOTEMPTY);
    expect("rmdir d/<256>", fs.rmdir(t.d, &long()), ENAMETOOLONG);
    expect("rmdir f/x", fs.rmdir(t.f, b"x"), ENOTDIR);
    expect("rmdir missing", fs.rmdir(t.d, b"nope"), ENOENT);
    expect("rmdir d", fs.rmdir(t.root, b"d"), 0);
    // The removed directory is gone: creating in it is ENOENT.
    expect("create in removed d", fs.create(t.d, b"x", 0o644, 0, 0), ENOENT);
    expect("mkdir in removed d", fs.mkdir(t.d, b"x", 0o755, 0, 0), ENOENT);
    expect("symlink in removed d", fs.symlink(t.d, b"x", b"t", 0, 0), ENOENT);
    expect("link into removed d", fs.link(t.f, t.d, b"x"), ENOENT);
    expect("rename into removed d", fs.rename(t.root, b"f", t.d, b"x", NR), ENOENT);
    assert_fsck_clean(fs, "unlink_rmdir");
}

#[test]
fn rename_errors() {
    let t = setup();
    let fs = &t.fs;
    let (root, d, f, a) = (t.root, t.d, t.f, t.a);
    expect("rename d/. x", fs.rename(d, b".", root, b"x", NR), EBUSY);
    expect("rename d/. x NOREPLACE", fs.rename(d, b".", root, b"x", NOREPL), EBUSY);
    expect("rename d/.. x", fs.rename(d, b"..", root, b"x", NR), EBUSY);
    expect("rename f d/.", fs.rename(root, b"f", d, b".", NR), EBUSY);
    expect("rename f d/. NOREPLACE", fs.rename(root, b"f", d, b".", NOREPL), EEXIST);
    expect("rename f d/. EXCHANGE", fs.rename(root, b"f", d, b".", EXCH), EBUSY);
    expect("rename f d/..", fs.rename(root, b"f", d, b"..", NR), EBUSY);
    let both = RenameFlags { noreplace: true, exchange: true };
    expect("rename NOREPLACE|EXCHANGE", fs.rename(root, b"f", root, b"x", both), EINVAL);
    expect("rename nope d/<256>", fs.rename(root, b"nope", d, &long(), NR), ENOENT);
    expect("rename d/<256> f", fs.rename(d, &long(), root, b"f", NR), ENAMETOOLONG);
    expect("rename f d/<256>", fs.rename(root, b"f", d, &long(), NR), ENAMETOOLONG);
    expect("rename a/b/file a", fs.rename(t.b, b"file", root, b"a", NR), ENOTEMPTY);
    expect("rename a/b/file a EXCHANGE", fs.rename(t.b, b"file", root, b"a", EXCH), EINVAL);
    expect("rename a a/b/file", fs.rename(root, b"a", t.b, b"file", NR), EINVAL);
    expect("rename a a/b/new", fs.rename(root, b"a", t.b, b"new", NR), EINVAL);
    expect("rename a a/new", fs.rename(root, b"a", a, b"new", NR), EINVAL);
    expect("rename a/b a EXCHANGE", fs.rename(a, b"b", root, b"a", EXCH), EINVAL);
    expect("rename a a/b EXCHANGE", fs.rename(root, b"a", a, b"b", EXCH), EINVAL);
    expect("rename a/b a", fs.rename(a, b"b", root, b"a", NR), ENOTEMPTY);
    expect("rename f d (file over dir)", fs.rename(root, b"f", root, b"d", NR), EISDIR);
    expect("rename d f (dir over file)", fs.rename(root, b"d", root, b"f", NR), ENOTDIR);
    expect("rename d a (dir over non-empty)", fs.rename(root, b"d", root, b"a", NR), ENOTEMPTY);
    expect("rename f nope EXCHANGE", fs.rename(root, b"f", root, b"nope", EXCH), ENOENT);
    expect("rename nope f EXCHANGE", fs.rename(root, b"nope", root, b"f", EXCH), ENOENT);
    expect("rename f d NOREPLACE", fs.rename(root, b"f", root, b"d", NOREPL), EEXIST);
    expect("rename nope f NOREPLACE", fs.rename(root, b"nope", root, b"f", NOREPL), ENOENT);
    expect("rename d f/x", fs.rename(root, b"d", f, b"x", NR), ENOTDIR);
    expect("rename f/x d/x", fs.rename(f, b"x", d, b"x", NR), ENOTDIR);
    expect("rename d d NOREPLACE", fs.rename(root, b"d", root, b"d", NOREPL), EEXIST);
    expect("rename d d", fs.rename(root, b"d", root, b"d", NR), 0);
    // Two names of one file: rename is a no-op that keeps both.
    fs.link(f, root, b"f2").unwrap();
    expect("rename f f2 (hard links)", fs.rename(root, b"f", root, b"f2", NR), 0);
    assert_eq!(fs.lookup_ino(root, b"f").unwrap(), f);
    assert_eq!(fs.lookup_ino(root, b"f2").unwrap(), f);
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);
    expect("rename f f2 NOREPLACE", fs.rename(root, b"f", root, b"f2", NOREPL), EEXIST);
    expect("rename f f2 EXCHANGE", fs.rename(root, b"f", root, b"f2", EXCH), 0);
    expect("rename f g NOREPLACE", fs.rename(root, b"f", root, b"g", NOREPL), 0);
    assert_fsck_clean(fs, "rename_errors");
    let _ = t.bfile;
}

#[test]
fn xattr_errors() {
    let t = setup();
    let fs = &t.fs;
    let f = t.f;
    expect("set user.", fs.setxattr(f, b"user.", b"v", XattrSet::Any), EINVAL);
    expect("set trusted.", fs.setxattr(f, b"trusted.", b"v", XattrSet::Any), EINVAL);
    expect("set foo.bar", fs.setxattr(f, b"foo.bar", b"v", XattrSet::Any), EOPNOTSUPP);
    expect("set ''", fs.setxattr(f, b"", b"v", XattrSet::Any), ERANGE);
    expect("set <256>", fs.setxattr(f, &long(), b"v", XattrSet::Any), ERANGE);
    let mut n256 = b"user.".to_vec();
    n256.resize(256, b'y');
    expect("set user.+251", fs.setxattr(f, &n256, b"v", XattrSet::Any), ERANGE);
    expect("set user.+250", fs.setxattr(f, &n256[..255], b"v", XattrSet::Any), 0);
    let sl = fs.symlink(t.root, b"sl", b"f", 0, 0).unwrap().ino;
    expect("set user.a on a symlink", fs.setxattr(sl, b"user.a", b"v", XattrSet::Any), EPERM);
    expect("set trusted.a on a symlink", fs.setxattr(sl, b"trusted.a", b"v", XattrSet::Any), 0);
    expect("get user.a on a symlink", fs.getxattr(sl, b"user.a"), ENODATA);
    expect("remove user.a on a symlink", fs.removexattr(sl, b"user.a"), EPERM);
    expect("set user. on a symlink", fs.setxattr(sl, b"user.", b"v", XattrSet::Any), EPERM);
    expect("get user. on a symlink", fs.getxattr(sl, b"user."), ENODATA);
    expect("remove user. on a symlink", fs.removexattr(sl, b"user."), EPERM);
    expect(
        "set foo.bar on a symlink",
        fs.setxattr(sl, b"foo.bar", b"v", XattrSet::Any),
        EOPNOTSUPP,
    );
    expect("set trusted. on a symlink", fs.setxattr(sl, b"trusted.", b"v", XattrSet::Any), EINVAL);
    expect("remove user.x on a symlink", fs.removexattr(sl, b"user.x"), EPERM);
    expect("remove trusted.x on a symlink", fs.removexattr(sl, b"trusted.x"), ENODATA);
    let big = vec![0u8; 65537];
    expect("set '' on a missing inode", fs.setxattr(9999, b"", b"v", XattrSet::Any), ERANGE);
    expect("set big on a missing inode", fs.setxattr(9999, b"user.a", &big, XattrSet::Any), E2BIG);
    expect(
        "set foo.bar on a missing inode",
        fs.setxattr(9999, b"foo.bar", b"v", XattrSet::Any),
        ENOENT,
    );
    expect("get '' on a missing inode", fs.getxattr(9999, b""), ERANGE);
    expect("set foo.bar big", fs.setxattr(f, b"foo.bar", &big, XattrSet::Any), E2BIG);
    expect("get missing", fs.getxattr(f, b"user.zz"), ENODATA);
    expect("get user.", fs.getxattr(f, b"user."), EINVAL);
    expect("get ''", fs.getxattr(f, b""), ERANGE);
    expect("set user.a", fs.setxattr(f, b"user.a", b"v", XattrSet::Any), 0);
    expect("set CREATE exists", fs.setxattr(f, b"user.a", b"w", XattrSet::Create), EEXIST);
    expect("set REPLACE missing", fs.setxattr(f, b"user.b", b"w", XattrSet::Replace), ENODATA);
    expect("remove missing", fs.removexattr(f, b"user.b"), ENODATA);
    expect("remove user.", fs.removexattr(f, b"user."), EINVAL);
    expect("set empty value", fs.setxattr(f, b"user.e", b"", XattrSet::Any), 0);
    assert_eq!(fs.getxattr(f, b"user.e").unwrap(), b"");
    expect("set user.a on a dir", fs.setxattr(t.d, b"user.a", b"v", XattrSet::Any), 0);
    // Values up to 64 KiB, as Linux (larger than an entry: in data blocks); beyond
    // it, E2BIG.
    let big = vec![1u8; XATTR_SIZE_MAX];
    expect("set XATTR_SIZE_MAX", fs.setxattr(f, b"user.big", &big, XattrSet::Any), 0);
    let big = vec![1u8; XATTR_SIZE_MAX + 1];
    expect("set XATTR_SIZE_MAX + 1", fs.setxattr(f, b"user.big2", &big, XattrSet::Any), E2BIG);
    assert_fsck_clean(fs, "xattr_errors");
}

#[test]
fn write_truncate_fallocate_limits() {
    let t = setup();
    let fs = &t.fs;
    let f = t.f;
    const MAX: u64 = i64::MAX as u64;
    // pwrite: offset + count past 2^63 - 1 is EINVAL (rw_verify_area), a negative
    // offset (here: above 2^63 - 1) is EINVAL even for an empty write.
    expect("write at MAX-10 len 100", fs.write(f, MAX - 10, &[1; 100]), EINVAL);
    expect("write at MAX len 1", fs.write(f, MAX, &[1]), EINVAL);
    expect("write at MAX len 0", fs.write(f, MAX, &[]), 0);
    expect("write at -1", fs.write(f, u64::MAX, &[1]), EINVAL);
    expect("write at -1 len 0", fs.write(f, u64::MAX, &[]), EINVAL);
    expect("write ending at MAX", fs.write(f, MAX - 10, &[7; 10]), 0);
    assert_eq!(fs.getattr(f).unwrap().size, MAX);
    let mut b = [0u8; 20];
    assert_eq!(fs.read(f, MAX - 12, &mut b).unwrap(), 12);
    assert_eq!(&b[..12], &[0, 0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]);
    let trunc = |size| fs.setattr(f, &SetAttr { size: Some(size), ..Default::default() });
    expect("truncate to 0", trunc(0), 0);
    expect("truncate to MAX", trunc(MAX), 0);
    expect("truncate to -1", trunc(u64::MAX), EINVAL);
    expect("truncate to 2^63", trunc(MAX + 1), EINVAL);
    let dtrunc = |size| fs.setattr(t.d, &SetAttr { size: Some(size), ..Default::default() });
    expect("truncate d", dtrunc(0), EISDIR);
    expect("truncate d to -1", dtrunc(u64::MAX), EINVAL);
    expect("truncate to 0 again", trunc(0), 0);
    let keep = FallocMode {
        keep_size: true,
        punch_hole: false,
        zero_range: false,
        shift: None,
        unshare: false,
    };
    let punch = FallocMode {
        keep_size: true,
        punch_hole: true,
        zero_range: false,
        shift: None,
        unshare: false,
    };
    let punch_nokeep = FallocMode {
        keep_size: false,
        punch_hole: true,
        zero_range: false,
        shift: None,
        unshare: false,
    };
    let plain = FallocMode::default();
    expect("fallocate len 0", fs.fallocate(f, plain, 0, 0), EINVAL);
    expect("fallocate PUNCH without KEEP", fs.fallocate(f, punch_nokeep, 0, 10), EOPNOTSUPP);
    expect("fallocate PUNCH without KEEP len 0", fs.fallocate(f, punch_nokeep, 0, 0), EINVAL);
    expect("fallocate off -1", fs.fallocate(f, plain, u64::MAX, 10), EINVAL);
    expect("fallocate len -1", fs.fallocate(f, plain, 0, u64::MAX), EINVAL);
    expect("fallocate overflow", fs.fallocate(f, plain, MAX - 5, 10), EFBIG);
    expect("fallocate dir", fs.fallocate(t.d, plain, 0, 10), EISDIR);
    expect("fallocate dir overflow", fs.fallocate(t.d, plain, MAX - 5, 10), EISDIR);
    expect("fallocate to exactly MAX", fs.fallocate(f, plain, MAX - 5, 5), 0);
    assert_eq!(fs.getattr(f).unwrap().size, MAX);
    expect("truncate to 0", trunc(0), 0);
    expect("fallocate KEEP near MAX", fs.fallocate(f, keep, MAX - 8191, 4096), 0);
    assert_eq!(fs.getattr(f).unwrap().size, 0);
    expect("punch beyond EOF", fs.fallocate(f, punch, 100, 10), 0);
    let mut buf = [0u8; 4];
    expect("read d", fs.read(t.d, 0, &mut buf), EISDIR);
    expect("readlink f", fs.readlink(f), EINVAL);
    expect("readlink d", fs.readlink(t.d), EINVAL);
    expect("release of a file never opened", fs.release(f), EBADF);
    // utimensat: nanoseconds of a second or more are EINVAL; negative times are fine.
    let at = |sec, nsec| Some(SetTime::At(Ts { sec, nsec }));
    let times = |a, m| fs.setattr(f, &SetAttr { atime: a, mtime: m, ..Default::default() });
    expect("utimens nsec 1e9", times(at(5, 1_000_000_000), at(5, 0)), EINVAL);
    expect("utimens mtime nsec 1e9", times(None, at(5, 1_000_000_000)), EINVAL);
    expect("utimens negative", times(at(-5, 0), at(-1, 999_999_999)), 0);
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.atime, a.mtime), (Ts { sec: -5, nsec: 0 }, Ts { sec: -1, nsec: 999_999_999 }));
    assert_fsck_clean(fs, "limits");
}

#[test]
fn symlink_loops_and_path_errors() {
    let t = setup();
    let fs = &t.fs;
    let root = t.root;
    // c0 -> c1 -> ... -> c44 -> c45 (a file): 40 links resolve, 41 are ELOOP.
    for i in 0..45 {
        fs.symlink(root, format!("c{i}").as_bytes(), format!("c{}", i + 1).as_bytes(), 0, 0)
            .unwrap();
    }
    let target = fs.create(root, b"c45", 0o644, 0, 0).unwrap().ino;
    for k in 38..=40u32 {
        let p = format!("/c{}", 45 - k);
        assert_eq!(fs.resolve(p.as_bytes(), true).unwrap(), target, "{k} links");
    }
    for k in 41..=44u32 {
        let p = format!("/c{}", 45 - k);
        expect(&format!("{k} links"), fs.resolve(p.as_bytes(), true), ELOOP);
        // Not following the last component needs no link at all.
        assert!(fs.resolve(p.as_bytes(), false).is_ok());
    }
    fs.symlink(root, b"self", b"self", 0, 0).unwrap();
    expect("self loop", fs.resolve(b"/self", true), ELOOP);
    expect("self loop as a directory", fs.resolve(b"/self/x", false), ELOOP);
    expect("through a file", fs.resolve(b"/f/x", true), ENOTDIR);
    expect("missing", fs.resolve(b"/d/nope", true), ENOENT);
    expect("long component", fs.resolve(&[b"/".as_slice(), &long()].concat(), true), ENAMETOOLONG);
    fs.symlink(root, b"dangling", b"nowhere", 0, 0).unwrap();
    expect("dangling followed", fs.resolve(b"/dangling", true), ENOENT);
    expect("dangling not followed", fs.resolve(b"/dangling", false), 0);
    fs.symlink(t.b, b"up", b"../../d", 0, 0).unwrap();
    assert_eq!(fs.resolve(b"/a/b/up", true).unwrap(), t.d);
    assert_eq!(fs.resolve(b"/a/b/up/..", true).unwrap(), root);
    fs.symlink(root, b"abs", b"/a/b/file", 0, 0).unwrap();
    assert_eq!(fs.resolve(b"/abs", true).unwrap(), t.bfile);
    assert_eq!(fs.resolve(b"/../../a/./b/../b/file", true).unwrap(), t.bfile);
    // A directory's size is tmpfs's: 40 plus 20 per entry; a symlink has no blocks.
    assert_eq!(fs.getattr(t.d).unwrap().size, 40);
    fs.create(t.d, b"x", 0o644, 0, 0).unwrap();
    assert_eq!(fs.getattr(t.d).unwrap().size, 60);
    assert_eq!(fs.getattr(fs.resolve(b"/abs", false).unwrap()).unwrap().blocks, 0);
}
