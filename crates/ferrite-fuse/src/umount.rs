//! Finding and unmounting FerriteFS mounts (`ferrite umount`, signals, stale mounts).
//!
//! Invariants:
//! - Unmounting never kills the daemon: it asks the kernel to detach the mount; the
//!   daemon then sees its session end and writes the clean-unmount checkpoint.
//! - `ferrite umount` returns only once the daemon has released the pool (its lock on
//!   the pool file is gone), so a following mount finds a clean pool; when the pool
//!   cannot be identified it says so instead of waiting.

use ferrite_core::{MapOptions, MmapMedium};
use nix::errno::Errno;
use nix::mount::{umount2, MntFlags};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Mount point.
    pub mountpoint: PathBuf,
    /// File system type (`fuse`, `fuse.ferrite`, ...).
    pub fstype: String,
    /// Source (for FerriteFS: the pool path unless `fsname=` changed it).
    pub source: String,
    /// Device number of the mount (major, minor); the FUSE connection id is the minor.
    pub dev: (u32, u32),
}

fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse mountinfo text.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    let mut v = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else { continue };
        if f.len() < dash + 3 || f.len() < 5 {
            continue;
        }
        let dev = f[2]
            .split_once(':')
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
            .unwrap_or((u32::MAX, u32::MAX));
        v.push(MountEntry {
            dev,
            mountpoint: PathBuf::from(unescape(f[4])),
            fstype: f[dash + 1].to_string(),
            source: unescape(f[dash + 2]),
        });
    }
    v
}

/// Current mounts.
pub fn mounts() -> Vec<MountEntry> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse_mountinfo(&t)).unwrap_or_default()
}

/// An absolute form of `p` without touching the file system below its parent (a dead
/// FUSE mount point cannot be canonicalised).
pub fn absolute(p: &Path) -> PathBuf {
    let abs = if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|c| c.join(p)).unwrap_or_else(|_| p.to_path_buf())
    };
    let (Some(parent), Some(name)) = (abs.parent(), abs.file_name()) else { return abs };
    match parent.canonicalize() {
        Ok(pp) => pp.join(name),
        Err(_) => abs,
    }
}

/// The last FUSE mount at `mp` (canonical form).
pub fn fuse_mount_at(mp: &Path) -> Option<MountEntry> {
    mounts().into_iter().rev().find(|m| m.mountpoint == mp && m.fstype.starts_with("fuse"))
}

/// Ask the kernel to detach the mount at `mp`: a plain unmount, falling back to a
/// lazy one when `lazy` (or busy and `lazy_if_busy`); through fusermount3 when not
/// permitted directly (mounts of ordinary users).
pub fn detach(mp: &Path, lazy: bool) -> Result<(), String> {
    let flags = if lazy { MntFlags::MNT_DETACH } else { MntFlags::empty() };
    match umount2(mp, flags) {
        Ok(()) => Ok(()),
        Err(Errno::EPERM) => {
            let mut c = Command::new("fusermount3");
            c.arg("-u").arg("-q");
            if lazy {
                c.arg("-z");
            }
            let out = c.arg("--").arg(mp).output().map_err(|e| format!("fusermount3: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "fusermount3 -u {}: {}",
                    mp.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        }
        Err(Errno::EBUSY) => Err(format!(
            "{} is busy (files open or a process inside); close them or use --lazy",
            mp.display()
        )),
        Err(e) => Err(format!("unmount {}: {e}", mp.display())),
    }
}

/// The FUSE connection id of the mount at `mp` (its anonymous device's minor number).
pub fn connection_of(mp: &Path) -> Option<u32> {
    let m = fuse_mount_at(mp)?;
    (m.dev.0 == 0).then_some(m.dev.1)
}

/// Abort FUSE connection `conn` through fusectl (/sys/fs/fuse/connections): pending and
/// future requests fail with ENOTCONN and the daemon's session ends. False if fusectl
/// is not mounted or the connection is gone.
pub fn abort_connection(conn: u32) -> bool {
    std::fs::write(format!("/sys/fs/fuse/connections/{conn}/abort"), b"1").is_ok()
}

/// Is the pool file locked by a daemon?
pub fn pool_in_use(pool: &Path) -> bool {
    let ro = MapOptions { read_only: true, ..Default::default() };
    matches!(MmapMedium::open(pool, &ro), Err(ferrite_core::Error::PoolInUse { .. }))
}

/// Wait until no process holds `pool` (the daemon finished its clean unmount).
pub fn wait_released(pool: &Path, timeout: Duration) -> bool {
    let t0 = Instant::now();
    while pool_in_use(pool) {
        if t0.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// Remove a dead FUSE mount (daemon gone: "Transport endpoint is not connected") at
/// `mp`, so a new mount can take its place. Returns whether one was removed.
///
/// The probe reads the directory: a read always reaches the daemon (READDIR), while
/// a `stat` of a dead mount's root may be answered from the kernel's attribute cache
/// (the mount lets the kernel cache attributes for long) and succeed, and so may the
/// open (the mount's directories open without a message to the daemon).
///
/// A probe made while the kernel ends the connection of a daemon killed a moment
/// ago fails with ECONNABORTED (over FUSE over io_uring, whose rings end after the
/// process, ECANCELED) instead of ENOTCONN: the mount is as dead. (A test that
/// restarts a killed daemon failed once here, its new daemon not mounting, the
/// log not kept; a probe meeting one of these errors would explain it, but that
/// was not reproduced.)
pub fn clear_stale(mp: &Path) -> bool {
    let dead = |e: &std::io::Error| {
        matches!(e.raw_os_error(), Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED))
    };
    match answers(mp) {
        Err(e) if dead(&e) => detach(&absolute(mp), true).is_ok(),
        _ => false,
    }
}

/// Does the file system at directory `mp` answer (a read of its first entry)?
pub fn answers(mp: &Path) -> std::io::Result<()> {
    std::fs::read_dir(mp)?.next().transpose().map(|_| ())
}

/// `ferrite umount`: detach, then wait for the daemon to release the pool.
pub fn umount(mp: &Path, lazy: bool, timeout: Duration) -> Result<String, String> {
    let abs = absolute(mp);
    let entry = fuse_mount_at(&abs)
        .ok_or_else(|| format!("{} is not a FUSE mount point", abs.display()))?;
    detach(&abs, lazy)?;
    let pool = PathBuf::from(&entry.source);
    if !pool.is_absolute() || !pool.is_file() {
        return Ok(format!(
            "unmounted {} (source '{}' is not a pool path, not waiting for the daemon)",
            abs.display(),
            entry.source
        ));
    }
    if wait_released(&pool, timeout) {
        Ok(format!("unmounted {} (pool {} released)", abs.display(), pool.display()))
    } else {
        Err(format!(
            "unmounted {}, but the daemon still holds {} after {:?}",
            abs.display(),
            pool.display(),
            timeout
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let t = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
                 90 30 0:52 / /tmp/my\\040mnt rw,nosuid,nodev,relatime shared:1 - fuse /dev/shm/a\\040b.pool rw,user_id=0\n\
                 garbage line\n";
        let m = parse_mountinfo(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[1].mountpoint, PathBuf::from("/tmp/my mnt"));
        assert_eq!(m[1].fstype, "fuse");
        assert_eq!(m[1].source, "/dev/shm/a b.pool");
        assert_eq!(m[1].dev, (0, 52));
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("tail\\04"), "tail\\04");
    }

    #[test]
    fn absolute_paths() {
        let d = tempfile::tempdir().unwrap();
        let canon = d.path().canonicalize().unwrap();
        assert_eq!(absolute(&d.path().join("x")), canon.join("x"));
        assert!(absolute(Path::new("rel")).is_absolute());
    }

    #[test]
    fn umount_of_a_non_mount_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let e = umount(d.path(), false, Duration::from_secs(1)).unwrap_err();
        assert!(e.contains("not a FUSE mount point"), "{e}");
    }
}
