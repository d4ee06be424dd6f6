//! `ferrite mount` / `ferrite umount` end to end: mounting, the ways a mount ends
//! (ferrite umount, SIGINT, SIGTERM, fusermount3 -u, umount(8) through the mount(8)
//! helper form), standard options, and what the kernel sees through the mount
//! (fresh attributes, open-unlinked files, lookup counts releasing space).

mod fuse_util;

use fuse_util::{is_mounted, run, wait_for, Mount};
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

fn statfs_free(p: &std::path::Path) -> u64 {
    let s = rustix::fs::statvfs(p).expect("statvfs");
    s.f_bfree * s.f_frsize
}

#[test]
fn mount_use_umount_remount() {
    let mut m = Mount::new("basic", "256M", "");
    let a = m.path("a.txt");
    fs::write(&a, b"hello ferrite\n").unwrap();
    fs::create_dir_all(m.path("d/e/f")).unwrap();
    fs::hard_link(&a, m.path("d/a-link")).unwrap();
    std::os::unix::fs::symlink("../a.txt", m.path("d/sym")).unwrap();
    // The kernel must never show stale attributes: link count, size, mode, times.
    assert_eq!(fs::metadata(&a).unwrap().nlink(), 2, "link count right after link");
    let before = fs::metadata(&a).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    fs::OpenOptions::new().append(true).open(&a).unwrap().write_all(b"more\n").unwrap();
    let after = fs::metadata(&a).unwrap();
    assert_eq!(after.len(), 19, "size right after an append");
    assert!(after.mtime_nsec() != before.mtime_nsec() || after.mtime() > before.mtime());
    fs::set_permissions(&a, fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::metadata(m.path("d/a-link")).unwrap().mode() & 0o7777,
        0o600,
        "mode via the other link"
    );
    fs::OpenOptions::new().write(true).open(&a).unwrap().set_len(3).unwrap();
    assert_eq!(
        fs::metadata(m.path("d/a-link")).unwrap().len(),
        3,
        "size after truncate via other link"
    );
    fs::rename(m.path("d/a-link"), m.path("d/e/moved")).unwrap();
    assert_eq!(fs::read(m.path("d/e/moved")).unwrap(), b"hel");
    assert_eq!(fs::read_link(m.path("d/sym")).unwrap().to_str(), Some("../a.txt"));
    assert_eq!(fs::read(m.path("d/sym")).unwrap(), b"hel");
    fs::remove_file(m.path("d/e/moved")).unwrap();
    assert_eq!(fs::metadata(&a).unwrap().nlink(), 1, "link count after unlink of the other link");
    let big: Vec<u8> =
        (0..(9 << 20)).map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    fs::write(m.path("d/big"), &big).unwrap();
    assert_eq!(fs::read(m.path("d/big")).unwrap(), big, "9 MiB in one write, read back");
    m.umount();
    let (report, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "fsck: {:?}", fsck.errors);
    assert!(report.clean, "a clean unmount writes the checkpoint");
    m.mount("");
    assert_eq!(fs::read(m.path("a.txt")).unwrap(), b"hel");
    assert_eq!(fs::read(m.path("d/big")).unwrap(), big);
    assert!(m.path("d/e/f").is_dir());
    m.umount();
}

fn signal_ends_mount_cleanly(sig: rustix::process::Signal, tag: &str) {
    let mut m = Mount::foreground(tag, "64M", "");
    fs::write(m.path("x"), b"before the signal").unwrap();
    m.signal(sig);
    assert_eq!(m.wait_child(90), Some(0), "daemon exit code after {sig:?}\n{}", m.log_text());
    assert!(!is_mounted(&m.mnt), "mount gone after {sig:?}");
    let (report, fsck) = m.check_pool();
    assert!(report.clean, "{sig:?} must end with a clean unmount (checkpoint)");
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
}

#[test]
fn sigterm_unmounts_cleanly() {
    signal_ends_mount_cleanly(rustix::process::Signal::TERM, "sigterm");
}

#[test]
fn sigint_unmounts_cleanly() {
    signal_ends_mount_cleanly(rustix::process::Signal::INT, "sigint");
}

#[test]
fn sigterm_with_a_busy_mount_detaches_lazily() {
    let mut m = Mount::foreground("busy", "64M", "");
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("held"))
        .unwrap();
    f.write_all(b"still open").unwrap();
    m.signal(rustix::process::Signal::TERM);
    assert!(wait_for(60, || !is_mounted(&m.mnt)), "detached although a file is open");
    // The open file keeps the session alive until it is closed.
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still open");
    drop(f);
    assert_eq!(m.wait_child(90), Some(0), "{}", m.log_text());
    assert!(m.check_pool().0.clean);
}

/// A second signal does not wait for busy files: it aborts the connection (fusectl) or
/// exits without a checkpoint; either way the pool is consistent afterwards.
#[test]
fn second_signal_ends_a_busy_mount() {
    let mut m = Mount::foreground("twosignals", "64M", "");
    let f = fs::File::create(m.path("held")).unwrap();
    m.signal(rustix::process::Signal::TERM);
    assert!(wait_for(60, || !is_mounted(&m.mnt)), "first signal: lazy detach");
    std::thread::sleep(std::time::Duration::from_millis(100));
    m.signal(rustix::process::Signal::TERM);
    let code = m.wait_child(90);
    assert!(matches!(code, Some(0) | Some(1) | Some(130)), "exit {code:?}\n{}", m.log_text());
    drop(f);
    let (_, fsck) = m.check_pool();
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
}

#[test]
fn fusermount3_u_unmounts_cleanly() {
    let m = Mount::new("fusermount", "64M", "");
    fs::write(m.path("f"), b"x").unwrap();
    run(Command::new("fusermount3").arg("-u").arg(&m.mnt));
    assert!(!is_mounted(&m.mnt));
    assert!(
        wait_for(90, || !ferrite_fuse::umount::pool_in_use(&m.pool)),
        "daemon did not release the pool"
    );
    let (report, fsck) = m.check_pool();
    assert!(report.clean && fsck.is_clean());
}

/// Process group and session of process `pid`, from /proc (fields 5 and 6).
fn group_and_session(pid: u32) -> (u32, u32) {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    (f[2].parse().unwrap(), f[3].parse().unwrap())
}

/// Regression: the daemon of a mount without `-f` called setsid. A new session is a
/// new scheduler autogroup (on by default), and every round trip between the
/// programs using the mount (in the caller's session) and the daemon crossed
/// groups: `cp -a` of /usr/include/linux onto the mount took 0.50-0.53 s against
/// 0.20-0.23 s with the daemon in the shell's session (alternated, a 2-CPU VM).
/// The daemon now stays in the caller's session, in a process group of its own
/// (out of the caller's job: terminal signals and a hangup's SIGHUP do not reach it).
#[test]
fn the_daemon_stays_in_the_callers_session_in_a_group_of_its_own() {
    let m = Mount::unmounted("session", "64M");
    run(Command::new(fuse_util::ferrite()).args(["mkfs", "--size", "64M"]).arg(&m.pool));
    run(Command::new(fuse_util::ferrite()).arg("mount").arg(&m.pool).arg(&m.mnt));
    assert!(is_mounted(&m.mnt));
    let pool = m.pool.to_string_lossy().into_owned();
    let daemon = fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
            args.contains(&b"mount".as_slice()) && args.contains(&pool.as_bytes())
        })
        .expect("the daemon's process");
    let (group, session) = group_and_session(daemon);
    let (my_group, my_session) = group_and_session(std::process::id());
    assert_eq!(session, my_session, "the daemon left the caller's session");
    assert_eq!(group, daemon, "the daemon leads a process group of its own");
    assert_ne!(group, my_group);
    run(Command::new(fuse_util::ferrite()).arg("umount").arg(&m.mnt));
    let (report, fsck) = m.check_pool();
    assert!(report.clean && fsck.is_clean());
}

/// mount(8) → mount.fuse3 → `ferrite SOURCE MOUNTPOINT -o OPTS` (the form fstab uses).
#[test]
fn mount_helper_forms() {
    let m = Mount::unmounted("helper", "64M");
    run(Command::new(fuse_util::ferrite()).args(["mkfs", "--size", "64M"]).arg(&m.pool));
    // `mount -t fuse ferrite#POOL` (mount(8) passes no PATH to helpers: absolute path).
    let src = format!("{}#{}", fuse_util::ferrite(), m.pool.display());
    run(Command::new("mount")
        .args(["-t", "fuse", &src])
        .arg(&m.mnt)
        .args(["-o", "rw,noatime,allow_other"]));
    assert!(is_mounted(&m.mnt));
    fs::write(m.path("via-mount8"), b"1").unwrap();
    run(Command::new("umount").arg(&m.mnt));
    assert!(wait_for(90, || !ferrite_fuse::umount::pool_in_use(&m.pool)));
    // `-t fuse.ferrite`: mount.fuse3 runs `ferrite` from the default PATH (mount(8)
    // passes none). Install a link in /usr/local/bin for the test when it is missing.
    let std_path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    let found = || {
        Command::new("sh")
            .args(["-c", "command -v ferrite"])
            .env("PATH", std_path)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    struct Unlink(Option<std::path::PathBuf>);
    impl Drop for Unlink {
        fn drop(&mut self) {
            if let Some(p) = &self.0 {
                let _ = fs::remove_file(p);
            }
        }
    }
    let mut link = Unlink(None);
    if !found() {
        let p = std::path::PathBuf::from("/usr/local/bin/ferrite");
        if std::os::unix::fs::symlink(fuse_util::ferrite(), &p).is_ok() {
            link.0 = Some(p);
        }
    }
    if found() {
        run(Command::new("mount")
            .args(["-t", "fuse.ferrite"])
            .arg(&m.pool)
            .arg(&m.mnt)
            .args(["-o", "rw,dev,suid"]));
    } else {
        // No standard directory is writable: call the helper mount(8) would call.
        let dir = std::path::Path::new(fuse_util::ferrite()).parent().unwrap().to_path_buf();
        run(Command::new("mount.fuse3")
            .arg(&m.pool)
            .arg(&m.mnt)
            .args(["-t", "fuse.ferrite", "-o", "rw,dev,suid"])
            .env("PATH", format!("{}:{std_path}", dir.display())));
    }
    drop(link);
    assert!(is_mounted(&m.mnt));
    assert_eq!(fs::read(m.path("via-mount8")).unwrap(), b"1");
    run(Command::new(fuse_util::ferrite()).arg("umount").arg(&m.mnt));
    let (report, fsck) = m.check_pool();
    assert!(report.clean && fsck.is_clean());
}

#[test]
fn read_only_mount_refuses_changes() {
    let mut m = Mount::new("ro", "64M", "");
    fs::write(m.path("kept"), b"data").unwrap();
    m.umount();
    m.mount("ro");
    assert_eq!(fs::read(m.path("kept")).unwrap(), b"data");
    let e = fs::write(m.path("new"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = fs::OpenOptions::new().write(true).open(m.path("kept")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS));
    m.umount();
}

#[test]
fn bad_invocations_are_clear_errors() {
    let m = Mount::unmounted("bad", "64M");
    let out =
        Command::new(fuse_util::ferrite()).arg("mount").arg(&m.pool).arg(&m.mnt).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not exist") && err.contains("--create"), "{err}");
    let out = Command::new(fuse_util::ferrite())
        .args(["mount", "-o", "frobnicate"])
        .arg(&m.pool)
        .arg(&m.mnt)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mount option 'frobnicate'"));
    let out = Command::new(fuse_util::ferrite()).arg("umount").arg(&m.mnt).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a FUSE mount point"));
    // A live mount point is not mounted over.
    let m2 = Mount::new("busy-mp", "64M", "");
    let out = Command::new(fuse_util::ferrite())
        .arg("mount")
        .arg(&m.pool)
        .arg(&m2.mnt)
        .args(["--create", "64M"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already mounted"));
    drop(m2);
    // A pool already served by a daemon cannot be mounted twice.
    let mut m = Mount::new("twice", "64M", "");
    let other = m.scratch();
    let out =
        Command::new(fuse_util::ferrite()).arg("mount").arg(&m.pool).arg(&other).output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    m.umount();
}

#[test]
fn open_unlinked_file_stays_usable_and_space_comes_back() {
    let mut m = Mount::new("unlinked", "128M", "");
    let free0 = statfs_free(&m.mnt);
    let p = m.path("doomed");
    let mut f =
        fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    let data = vec![0x5au8; 8 << 20];
    f.write_all(&data).unwrap();
    fs::remove_file(&p).unwrap();
    assert!(!p.exists());
    assert_eq!(f.metadata().unwrap().nlink(), 0);
    f.write_all(b"tail").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), data.len() + 4);
    assert!(statfs_free(&m.mnt) + (8 << 20) <= free0 + (1 << 20), "space held while open");
    drop(f);
    // The kernel's release and forget drop the last pins: the core frees the inode.
    assert!(
        wait_for(60, || statfs_free(&m.mnt) + (1 << 20) >= free0),
        "space not returned: {} < {free0}",
        statfs_free(&m.mnt)
    );
    m.umount();
    assert!(m.check_pool().1.is_clean());
}

#[test]
fn lookup_counts_survive_cache_eviction() {
    let mut m = Mount::new("forget", "128M", "");
    let free0 = statfs_free(&m.mnt);
    fs::create_dir(m.path("many")).unwrap();
    for i in 0..600 {
        fs::write(m.path(&format!("many/f{i:04}")), vec![i as u8; 5000]).unwrap();
    }
    // readdirplus and lookups hand the kernel hundreds of entries...
    let n = fs::read_dir(m.path("many"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().metadata().unwrap().len() == 5000)
        .count();
    assert_eq!(n, 600);
    // ...which it forgets when its caches are dropped (FORGET / BATCH_FORGET).
    fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
    for i in 0..600 {
        assert_eq!(fs::read(m.path(&format!("many/f{i:04}"))).unwrap(), vec![i as u8; 5000]);
    }
    fs::remove_dir_all(m.path("many")).unwrap();
    fs::write("/proc/sys/vm/drop_caches", b"2").unwrap();
    assert!(
        wait_for(60, || statfs_free(&m.mnt) + (64 << 10) >= free0),
        "space of removed files not returned: {} < {free0}",
        statfs_free(&m.mnt)
    );
    m.umount();
    // The kernel did use readdirplus and did forget what it had looked up.
    assert!(m.served("readdirplus") > 0, "{}", m.log_text());
    assert!(m.served("forget") >= 600, "{}", m.log_text());
    let (report, fsck) = m.check_pool();
    assert!(report.clean && fsck.is_clean(), "{:?}", fsck.errors);
}

#[test]
fn readdir_of_a_large_directory_is_complete() {
    let mut m = Mount::new("bigdir", "128M", "");
    let d = m.path("d");
    fs::create_dir(&d).unwrap();
    let mut want: Vec<String> =
        (0..3000).map(|i| format!("entry-with-a-longish-name-{i:05}")).collect();
    for n in &want {
        fs::File::create(d.join(n)).unwrap();
    }
    // Remove some while listing in pieces: cookies must stay valid.
    let mut got: Vec<String> =
        fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    for n in want.iter().step_by(3) {
        fs::remove_file(d.join(n)).unwrap();
    }
    let left = fs::read_dir(&d).unwrap().count();
    assert_eq!(left, 2000);
    assert_eq!(fs::metadata(&d).unwrap().nlink(), 2);
    m.umount();
}

#[test]
fn full_pool_says_enospc_and_recovers_space() {
    let mut m = Mount::new("full", "16M", "");
    let mut f = fs::File::create(m.path("fill")).unwrap();
    let chunk = vec![0xa5u8; 1 << 20];
    let err = loop {
        if let Err(e) = f.write_all(&chunk) {
            break e;
        }
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    drop(f);
    let len = fs::metadata(m.path("fill")).unwrap().len();
    assert!(len > 8 << 20, "only {len} bytes fit in a 16 MiB pool");
    fs::remove_file(m.path("fill")).unwrap();
    assert!(wait_for(60, || statfs_free(&m.mnt) > 12 << 20), "space not returned");
    fs::write(m.path("after"), vec![1u8; 4 << 20]).unwrap();
    m.umount();
    let (report, fsck) = m.check_pool();
    assert!(report.clean && fsck.is_clean(), "{:?}", fsck.errors);
}

#[test]
fn standard_options_reach_the_kernel() {
    let m =
        Mount::new("opts", "64M", "allow_other,default_permissions,fsname=my-ferrite,noexec,nodev");
    let line = fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(m.mnt.to_str().unwrap()))
        .expect("mount listed")
        .to_string();
    let f: Vec<&str> = line.split(' ').collect();
    assert_eq!(f[0], "my-ferrite", "{line}");
    assert!(f[2].starts_with("fuse"), "{line}");
    for o in ["allow_other", "default_permissions", "noexec", "nodev"] {
        assert!(f[3].split(',').any(|x| x == o), "{o} missing: {line}");
    }
    // With a custom fsname `ferrite umount` cannot find the pool, and says so.
    let out =
        Command::new(fuse_util::ferrite()).args(["umount", "-v"]).arg(&m.mnt).output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not waiting"));
}

/// Bug: after a panic inside a request handler the daemon kept committing on DRAM
/// state the panic may have left half-updated. Now the request fails with EIO, the
/// pool turns read-only (writes EROFS, reads go on), the log says why, and the next
/// mount recovers from the logs. The panic is injected in mkdir (debug builds read
/// FERRITE_TEST_PANIC_IN).
#[test]
fn a_panic_in_a_request_turns_the_mount_read_only() {
    let mut m = Mount::unmounted("panic", "64M");
    m.mount_with_env("", &[("FERRITE_TEST_PANIC_IN", "mkdir")]);
    std::fs::write(m.path("before"), b"kept").unwrap();
    let e = std::fs::create_dir(m.path("d")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let e = std::fs::write(m.path("after"), b"x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    let e = std::fs::OpenOptions::new().append(true).open(m.path("before")).and_then(|mut f| {
        use std::io::Write;
        f.write_all(b"more")
    });
    assert_eq!(e.unwrap_err().raw_os_error(), Some(libc::EROFS));
    assert_eq!(std::fs::read(m.path("before")).unwrap(), b"kept");
    let log = m.log_text();
    assert!(log.contains("read-only from now on"), "{log}");
    m.umount();
    let (report, fsck) = m.check_pool();
    assert!(!report.clean, "the poisoned session must not write a clean checkpoint");
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
}

/// The access time of `p` in seconds.
fn atime_of(p: &std::path::Path) -> i64 {
    use std::os::unix::fs::MetadataExt;
    fs::metadata(p).unwrap().atime()
}

/// Set `p`'s access time to `sec` (modification time now).
fn set_old_atime(p: &std::path::Path, sec: i64) {
    let f = fs::File::open(p).unwrap();
    let t = fs::FileTimes::new()
        .set_accessed(std::time::UNIX_EPOCH + std::time::Duration::from_secs(sec as u64))
        .set_modified(std::time::SystemTime::now());
    f.set_times(t).unwrap();
}

#[test]
fn reads_update_access_times_as_the_atime_option_says() {
    // The kernel keeps no access times for a FUSE mount: the core does (relatime by
    // default), so a read that reaches the daemon updates one whose access time is
    // older than its modification time; `noatime` never does, and the updated time
    // survives a remount.
    let mut m = Mount::new("atime", "64M", "direct_io");
    let f = m.path("f");
    fs::write(&f, b"data").unwrap();
    set_old_atime(&f, 1000);
    assert_eq!(atime_of(&f), 1000);
    assert_eq!(fs::read(&f).unwrap(), b"data");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let a = atime_of(&f);
    assert!(a > now.as_secs() as i64 - 3600, "relatime: a read after a change updates ({a})");
    m.umount();
    m.mount("direct_io");
    assert_eq!(atime_of(&f), a, "persisted (at release)");
    m.umount();
    m.mount("direct_io,noatime");
    set_old_atime(&f, 1000);
    assert_eq!(fs::read(&f).unwrap(), b"data");
    assert_eq!(atime_of(&f), 1000, "noatime");
    m.umount();
}
