//! FIFOs, sockets and device nodes on the mount, against tmpfs: the same sequence of
//! calls (mkfifo, mknod of character and block devices, bind of a Unix socket, a pipe
//! and a socket used across threads, chmod, chown, link, rename over, O_CREAT|O_EXCL
//! on a special file, unlink, readdir types) runs in a tmpfs directory and on a
//! FerriteFS mount and must give the same transcript; the nodes then survive a
//! remount with their types and device numbers, and the pool is fsck-clean. The
//! daemon stores the nodes; the kernel runs the pipe and the socket.

mod fuse_util;

use fuse_util::Mount;
use rustix::fs::{makedev, mknodat, FileType as H, Mode, CWD};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

fn kind(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    match () {
        _ if t.is_fifo() => "fifo",
        _ if t.is_socket() => "socket",
        _ if t.is_char_device() => "char",
        _ if t.is_block_device() => "block",
        _ if t.is_dir() => "dir",
        _ if t.is_file() => "file",
        _ => "other",
    }
}

fn stat_line(p: &Path) -> String {
    match std::fs::symlink_metadata(p) {
        Ok(m) => {
            let (major, minor) = (rustix::fs::major(m.rdev()), rustix::fs::minor(m.rdev()));
            let mode = m.mode() & 0o7777;
            let (n, u, g, size) = (m.nlink(), m.uid(), m.gid(), m.size());
            format!(
                "{} mode {mode:o} nlink {n} owner {u}:{g} size {size} rdev {major}:{minor}",
                kind(&m)
            )
        }
        Err(e) => format!("error {:?}", e.raw_os_error()),
    }
}

fn res<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => format!("errno {:?}", e.raw_os_error()),
    }
}

/// The calls, and one transcript line each.
fn transcript(dir: &Path) -> Vec<String> {
    let mut t = Vec::new();
    let p = |n: &str| dir.join(n);
    let node = |n: &str, ht: H, dev: u64| {
        res(mknodat(CWD, p(n), ht, Mode::from_raw_mode(0o640), dev).map_err(Into::into))
    };
    t.push(format!("mkfifo: {}", node("fifo", H::Fifo, 0)));
    t.push(format!("mknod c: {}", node("null", H::CharacterDevice, makedev(1, 3))));
    t.push(format!("mknod b: {}", node("loop", H::BlockDevice, makedev(7, 300))));
    t.push(format!("mknod again: {}", node("fifo", H::Socket, 0)));
    let listener = UnixListener::bind(p("sock"));
    let bound = match &listener {
        Ok(_) => "ok".to_string(),
        Err(e) => format!("errno {:?}", e.raw_os_error()),
    };
    t.push(format!("bind: {bound}"));
    for n in ["fifo", "null", "loop", "sock"] {
        t.push(format!("{n}: {}", stat_line(&p(n))));
    }
    // The kernel runs the pipe and the socket on the mount.
    let fifo = p("fifo");
    let w = std::thread::spawn(move || {
        let mut f = std::fs::OpenOptions::new().write(true).open(fifo).unwrap();
        f.write_all(b"through the pipe").unwrap();
    });
    let mut got = String::new();
    std::fs::File::open(p("fifo")).unwrap().read_to_string(&mut got).unwrap();
    w.join().unwrap();
    t.push(format!("fifo read: {got}"));
    if let Ok(l) = listener {
        let sock = p("sock");
        let c = std::thread::spawn(move || {
            let mut s = UnixStream::connect(sock).unwrap();
            s.write_all(b"through the socket").unwrap();
        });
        let (mut s, _) = l.accept().unwrap();
        let mut got = String::new();
        s.read_to_string(&mut got).unwrap();
        c.join().unwrap();
        t.push(format!("socket read: {got}"));
    }
    // O_CREAT|O_EXCL on a special file; O_CREAT without it opens the FIFO.
    let excl = std::fs::OpenOptions::new().write(true).create_new(true).open(p("fifo"));
    t.push(format!("create_new fifo: {}", res(excl)));
    let rw = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(p("fifo"));
    t.push(format!("O_CREAT|O_RDWR fifo: {}", res(rw)));
    t.push(format!(
        "truncate fifo: {}",
        res(std::fs::File::options()
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_TRUNC)
            .open(p("fifo")))
    ));
    // Attributes and names.
    t.push(format!(
        "chmod: {}",
        res(std::fs::set_permissions(
            p("fifo"),
            std::os::unix::fs::PermissionsExt::from_mode(0o1604)
        ))
    ));
    t.push(format!("chown: {}", res(std::os::unix::fs::lchown(p("null"), Some(1000), Some(100)))));
    t.push(format!("link: {}", res(std::fs::hard_link(p("fifo"), p("fifo2")))));
    t.push(format!("rename over: {}", res(std::fs::rename(p("loop"), p("sock")))));
    for n in ["fifo", "fifo2", "null", "loop", "sock"] {
        t.push(format!("{n}: {}", stat_line(&p(n))));
    }
    t.push(format!("unlink: {}", res(std::fs::remove_file(p("fifo2")))));
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let ft = e.file_type().unwrap();
            let k = if ft.is_fifo() {
                "fifo"
            } else if ft.is_char_device() {
                "char"
            } else if ft.is_block_device() {
                "block"
            } else if ft.is_socket() {
                "socket"
            } else {
                "other"
            };
            format!("{} {k}", e.file_name().to_string_lossy())
        })
        .collect();
    names.sort();
    t.push(format!("readdir: {}", names.join(", ")));
    t
}

#[test]
fn special_files_behave_as_on_tmpfs_and_persist() {
    let reference =
        tempfile::Builder::new().prefix("ferrite-special").tempdir_in("/dev/shm").unwrap();
    let want = transcript(reference.path());
    let mut m = Mount::new("special", "64M", "");
    let got = transcript(&m.mnt);
    assert!(want.iter().any(|l| l.starts_with("null: char")), "{want:#?}");
    for (k, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(g, w, "line {} differs\ntmpfs: {want:#?}\nferrite: {got:#?}", k + 1);
    }
    assert_eq!(want.len(), got.len());
    // Types and device numbers survive a remount.
    let before: Vec<_> =
        ["fifo", "null", "sock"].iter().map(|n| stat_line(&m.mnt.join(n))).collect();
    m.umount();
    let (report, fsck) = m.check_pool();
    assert!(report.clean && fsck.is_clean(), "{fsck:?}");
    assert_eq!(fsck.special, 3, "{fsck:?}");
    m.mount("");
    let after: Vec<_> =
        ["fifo", "null", "sock"].iter().map(|n| stat_line(&m.mnt.join(n))).collect();
    assert_eq!(before, after);
    assert!(after[1].contains("rdev 1:3") && after[2].contains("rdev 7:300"), "{after:?}");

    // Under the preload library a FIFO still opens through the kernel (its open
    // blocks until the other end comes, and data flows), beside direct file I/O.
    let script = "echo through-the-preload > fifo & cat fifo > copy; wait; cat copy; cat < copy";
    let out = fuse_util::run(
        std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(&m.mnt)
            .env("LD_PRELOAD", fuse_util::preload_lib())
            .env_remove("FERRITE_MOUNTS"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text, "through-the-preload\nthrough-the-preload\n");
    m.umount();
}
