//! Concurrency through the mount: threads race random namespace and data operations
//! on a small shared tree (the same few names, so operations collide). Every call may
//! fail only with an errno a racing POSIX file system can give (ENOENT, EEXIST,
//! ENOTEMPTY, ...), never EIO, EUCLEAN or ENOTCONN; afterwards the tree is walked,
//! the pool unmounts cleanly and fsck finds it consistent.

mod fuse_util;

use fuse_util::{Mount, Rng};
use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

const NAMES: &[&str] = &["a", "b", "c", "d", "e"];

fn pick_path(r: &mut Rng) -> String {
    match r.below(3) {
        0 => r.pick(NAMES).to_string(),
        1 => format!("{}/{}", r.pick(NAMES), r.pick(NAMES)),
        _ => format!("{}/{}/{}", r.pick(NAMES), r.pick(NAMES), r.pick(NAMES)),
    }
}

const ALLOWED: &[i32] = &[
    libc::ENOENT,
    libc::EEXIST,
    libc::ENOTEMPTY,
    libc::ENOTDIR,
    libc::EISDIR,
    libc::EINVAL,
    libc::EPERM,
    libc::ENODATA,
    libc::EBUSY,
    libc::ELOOP,
];

fn ok_or_allowed<T>(what: &str, r: std::io::Result<T>) {
    if let Err(e) = r {
        let code = e.raw_os_error().unwrap_or(0);
        assert!(ALLOWED.contains(&code) || e.kind() == ErrorKind::NotFound, "{what}: {e}");
    }
}

fn worker(root: &Path, seed: u64, ops: usize) {
    let mut r = Rng(seed);
    for _ in 0..ops {
        let p = root.join(pick_path(&mut r));
        let q = root.join(pick_path(&mut r));
        match r.below(14) {
            0 | 1 => ok_or_allowed("mkdir", fs::create_dir(&p)),
            2 => ok_or_allowed("rmdir", fs::remove_dir(&p)),
            3 | 4 => {
                let len = r.below(20_000) as usize;
                let data = r.bytes(len);
                ok_or_allowed(
                    "write",
                    fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(r.pct(50))
                        .mode(0o644)
                        .open(&p)
                        .and_then(|f| {
                            std::os::unix::fs::FileExt::write_all_at(&f, &data, r.below(50_000))
                        }),
                );
            }
            5 => ok_or_allowed("read", fs::read(&p)),
            6 => ok_or_allowed("unlink", fs::remove_file(&p)),
            7 | 8 => ok_or_allowed("rename", fs::rename(&p, &q)),
            9 => ok_or_allowed("link", fs::hard_link(&p, &q)),
            10 => ok_or_allowed("symlink", std::os::unix::fs::symlink("a/b", &p)),
            11 => ok_or_allowed("readdir", fs::read_dir(&p).map(|d| d.count())),
            12 => ok_or_allowed("stat", fs::symlink_metadata(&p)),
            _ => ok_or_allowed(
                "setxattr",
                rustix::fs::setxattr(&p, "user.k", &r.bytes(64), rustix::fs::XattrFlags::empty())
                    .map_err(std::io::Error::from),
            ),
        }
    }
}

fn walk(p: &Path) -> usize {
    let mut n = 1;
    if fs::symlink_metadata(p).unwrap().is_dir() {
        for e in fs::read_dir(p).unwrap() {
            n += walk(&e.unwrap().path());
        }
    } else if fs::symlink_metadata(p).unwrap().is_file() {
        fs::read(p).unwrap();
    }
    n
}

#[test]
fn racing_threads_keep_the_pool_consistent() {
    let ops: usize =
        std::env::var("FERRITE_STRESS_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(3000);
    let mut m = Mount::new("stress", "256M", "");
    let root = m.mnt.clone();
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let root = &root;
            s.spawn(move || worker(root, 0x5157 + t, ops));
        }
    });
    let n = walk(&m.mnt);
    assert!(n >= 1);
    m.umount();
    let (report, fsck) = m.check_pool();
    assert!(report.clean && fsck.is_clean(), "{:?}", fsck.errors);
    m.mount("");
    assert_eq!(walk(&m.mnt), n, "same tree after a remount");
    m.umount();
}
