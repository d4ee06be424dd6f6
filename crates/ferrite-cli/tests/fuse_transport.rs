//! The mount's two transports between the kernel and the daemon: FUSE over io_uring
//! (`-o uring`, the default when the fuse module's `enable_uring` is on; fuser patched
//! in vendor/fuser) and `/dev/fuse` reads and writes (`-o nouring`). The same work
//! must give the same files either way, and the daemon's count of requests served
//! over the ring (`uring=N` in its last log line) tells which transport carried them.

mod fuse_util;

use fuse_util::Mount;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";
const URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";

/// The tests of this file run one at a time: one of them turns io_uring off for the
/// whole machine for a moment.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Namespace and data work of every common kind, checked as it goes; returns how
/// many requests it should at least have made.
fn workload(root: &Path, tag: &str) -> u64 {
    let d = root.join(tag);
    fs::create_dir(&d).unwrap();
    let mut made = 0;
    for i in 0..40u64 {
        let p = d.join(format!("f{i}"));
        let data = pattern(100 + (i as usize * 997) % 9000, i);
        fs::write(&p, &data).unwrap();
        assert_eq!(fs::read(&p).unwrap(), data, "{tag}: f{i}");
        made += 3;
    }
    // One request of the largest size (1 MiB) each way, through the payload buffer.
    let big = pattern(4 << 20, 99);
    let mut f = fs::File::create(d.join("big")).unwrap();
    f.write_all(&big).unwrap();
    drop(f);
    let mut back = Vec::new();
    fs::File::open(d.join("big")).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == big, "{tag}: 4 MiB file differs");
    let f = fs::OpenOptions::new().write(true).open(d.join("big")).unwrap();
    f.write_all_at(b"middle", 3 << 19).unwrap();
    f.set_len(3 << 20).unwrap();
    drop(f);
    let back = fs::read(d.join("big")).unwrap();
    assert_eq!(back.len(), 3 << 20);
    assert_eq!(&back[3 << 19..(3 << 19) + 6], b"middle");
    fs::rename(d.join("f0"), d.join("renamed")).unwrap();
    fs::hard_link(d.join("f1"), d.join("link")).unwrap();
    std::os::unix::fs::symlink("f2", d.join("sym")).unwrap();
    assert_eq!(fs::read_link(d.join("sym")).unwrap(), Path::new("f2"));
    let f3 = d.join("f3");
    rustix::fs::setxattr(&f3, "user.k", b"v1", rustix::fs::XattrFlags::empty()).unwrap();
    let mut v = [0u8; 16];
    let n = rustix::fs::getxattr(&f3, "user.k", &mut v[..]).unwrap();
    assert_eq!(&v[..n], b"v1");
    let mut names: Vec<String> =
        fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names.len(), 40 + 3, "{tag}: {names:?}");
    for n in &names {
        fs::remove_file(d.join(n)).unwrap();
    }
    fs::remove_dir(&d).unwrap();
    made + 50
}

fn uring_available() -> bool {
    Path::new(ENABLE_URING).exists()
}

/// `ferrite mount -o uring` on `m` must fail, saying `why`.
fn refuses_uring(m: &Mount, why: &str) {
    let out = Command::new(fuse_util::ferrite())
        .arg("mount")
        .arg(&m.pool)
        .arg(&m.mnt)
        .args(["--create", "64M", "-o", "uring"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(why), "{err}");
}

#[test]
fn uring_carries_the_requests_and_gives_the_same_files() {
    let _one = one_at_a_time();
    if !uring_available() {
        // A kernel without FUSE over io_uring: `-o uring` must fail with the reason,
        // and mounting without it must still work.
        let mut m = Mount::unmounted("uring-absent", "64M");
        refuses_uring(&m, "io_uring");
        m.mount("");
        workload(&m.mnt, "classic");
        m.umount();
        eprintln!("this kernel has no FUSE over io_uring: checked the refusal only");
        return;
    }
    let mut m = Mount::new("uring", "256M", "uring");
    let made = workload(&m.mnt, "one");
    m.umount();
    let log = m.log_text();
    assert!(log.contains("requests over io_uring"), "{log}");
    let ring = m.served("uring");
    assert!(ring >= made, "{ring} requests over the ring, expected at least {made}\n{log}");
    let (_, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
}

#[test]
fn nouring_keeps_dev_fuse() {
    let _one = one_at_a_time();
    let mut m = Mount::new("nouring", "256M", "nouring");
    workload(&m.mnt, "one");
    m.umount();
    let log = m.log_text();
    assert!(log.contains("requests over /dev/fuse"), "{log}");
    assert_eq!(m.served("uring"), 0, "{log}");
    assert!(m.served("create") >= 40, "{log}");
    // `-s` (one thread) means one thread: /dev/fuse unless -o uring.
    let mut m = Mount::unmounted("single", "64M");
    fuse_util::run(
        Command::new(fuse_util::ferrite())
            .arg("mount")
            .arg(&m.pool)
            .arg(&m.mnt)
            .args(["--create", "64M", "-s", "--log"])
            .arg(&m.log),
    );
    fs::write(m.path("f"), b"one").unwrap();
    m.umount();
    let log = m.log_text();
    assert!(log.contains("1 threads, requests over /dev/fuse"), "{log}");
    assert_eq!(m.served("uring"), 0, "{log}");
}

/// Every CPU's queue, more callers than ring entries (two per queue), and one slow
/// request: all served, nothing lost or mixed up.
#[test]
fn uring_serves_every_cpu_and_more_callers_than_entries() {
    let _one = one_at_a_time();
    if !uring_available() {
        eprintln!("this kernel has no FUSE over io_uring");
        return;
    }
    let mut m = Mount::new("uring-many", "512M", "uring");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mnt = m.mnt.clone();
    let threads: Vec<_> = (0..6)
        .map(|t| {
            let mnt = mnt.clone();
            std::thread::spawn(move || {
                // Pin each caller to a CPU in turn, so every queue gets requests.
                let cpu = t % cpus;
                let mut set = rustix::thread::CpuSet::new();
                set.set(cpu);
                rustix::thread::sched_setaffinity(None, &set).expect("pin a caller");
                for round in 0..3 {
                    workload(&mnt, &format!("t{t}-r{round}"));
                }
            })
        })
        .collect();
    // A slow request beside them: a 64 MiB copy_file_range served in the daemon.
    let src = m.path("src");
    fs::write(&src, pattern(64 << 20, 7)).unwrap();
    let out = fs::File::create(m.path("dst")).unwrap();
    let inp = fs::File::open(&src).unwrap();
    let mut left = 64u64 << 20;
    while left > 0 {
        let n = rustix::fs::copy_file_range(&inp, None, &out, None, left as usize).unwrap();
        assert!(n > 0);
        left -= n as u64;
    }
    drop((inp, out));
    for t in threads {
        t.join().expect("a caller failed");
    }
    assert!(fs::read(&src).unwrap() == fs::read(m.path("dst")).unwrap());
    m.umount();
    assert!(m.served("uring") > 6 * 3 * 100, "{}", m.log_text());
    let (_, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
}

/// Regression: with io_uring turned off for processes (`kernel.io_uring_disabled=2`),
/// the daemon accepted FUSE_OVER_IO_URING at INIT, could not make its rings, and the
/// kernel then held every request for them: the first write on the mount hung. Now
/// the daemon asks only when it can make rings: `-o uring` fails with the reason, and
/// the default mount serves over /dev/fuse.
#[test]
fn an_unusable_io_uring_is_never_asked_for() {
    let _one = one_at_a_time();
    let Ok(was) = fs::read_to_string(URING_DISABLED) else {
        eprintln!("no {URING_DISABLED} on this kernel");
        return;
    };
    struct Restore(String);
    impl Drop for Restore {
        fn drop(&mut self) {
            let _ = fs::write(URING_DISABLED, self.0.trim());
        }
    }
    let _restore = Restore(was);
    fs::write(URING_DISABLED, "2").expect("turn io_uring off (needs root)");
    let mut m = Mount::unmounted("uring-off", "64M");
    refuses_uring(&m, "io_uring is not usable");
    m.mount("");
    // In a thread: the bug made this write hang.
    let (tx, rx) = std::sync::mpsc::channel();
    let f = m.path("f");
    std::thread::spawn(move || {
        fs::write(&f, b"served").unwrap();
        let _ = tx.send(fs::read(&f).unwrap());
    });
    let back = rx.recv_timeout(std::time::Duration::from_secs(30)).expect("the mount hangs");
    assert_eq!(back, b"served");
    m.umount();
    assert!(m.log_text().contains("requests over /dev/fuse"), "{}", m.log_text());
    assert_eq!(m.served("uring"), 0);
}

/// The scheduling policy of each request-serving thread of daemon `pid` (the ring
/// threads `fuse-ring-N` and the classic `fuser-N`): (name, policy number from
/// /proc/PID/task/TID/stat, field 41).
fn serving_policies(pid: i32) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    for t in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        let comm = fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        let comm = comm.trim().to_string();
        if !(comm.starts_with("fuse-ring-") || comm.starts_with("fuser-")) || comm == "fuser-bg" {
            continue;
        }
        let stat = fs::read_to_string(t.path().join("stat")).unwrap_or_default();
        // Fields after the command (which may hold spaces) start at the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        // `rest` starts with field 3 (state): field 41 is its 39th.
        let policy = rest.split_whitespace().nth(38).and_then(|f| f.parse().ok());
        out.push((comm, policy.expect("policy field")));
    }
    out
}

/// Serving threads run under SCHED_IDLE by default (a reply then wakes its caller on
/// the caller's own CPU instead of moving it to an idle one: docs/FUSE.md, "Where a
/// caller wakes"), and under the normal policy with `-o nosched_idle`.
#[test]
fn serving_threads_take_sched_idle_unless_told_not_to() {
    let _one = one_at_a_time();
    const SCHED_OTHER: u32 = 0;
    const SCHED_IDLE: u32 = 5;
    for (opts, want) in [("", SCHED_IDLE), ("nosched_idle", SCHED_OTHER)] {
        let mut m = Mount::foreground(&format!("policy-{want}"), "64M", opts);
        fs::write(m.path("f"), b"x").unwrap();
        let pid = m.pid();
        // The threads set their policy as they start, after the mount is ready.
        let ok = fuse_util::wait_for(20, || {
            let p = serving_policies(pid);
            !p.is_empty() && p.iter().all(|&(_, pol)| pol == want)
        });
        let p = serving_policies(pid);
        assert!(ok, "-o '{opts}': serving threads and policies {p:?}, expected {want}");
        let ring_on = fs::read_to_string(ENABLE_URING).is_ok_and(|v| v.trim() == "Y");
        if ring_on {
            assert!(p.iter().any(|(n, _)| n.starts_with("fuse-ring-")), "{p:?}");
        }
        m.umount();
    }
}
