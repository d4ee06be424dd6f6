//! Directory targets reached through ordinary syscalls: tmpfs, ext4 on a loop device
//! backed by /dev/shm, and the FerriteFS FUSE mount.
//!
//! Invariants:
//! - All I/O goes through `std::fs` (open/pwrite/pread/fsync/rename/unlink/readdir),
//!   which is what an unmodified application does.
//! - A mount this module made is unmounted when its guard drops (also while
//!   unwinding from a panic); an image or pool file it made is removed.
//! - Setup failures are returned as reasons, so the run goes on without the target
//!   and prints why.

use super::{Handle, Kind, TResult, Target, TargetError, Usage};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// What backs a directory target.
enum Backing {
    /// A plain directory (tmpfs under /dev/shm).
    Plain,
    /// ext4 on a loop device over an image file.
    Ext4 { image: PathBuf, size: u64, mounted: bool },
    /// The FerriteFS FUSE mount, served by a child process.
    Fuse { child: Option<Child>, pool: PathBuf },
    /// A mount another process made and removes (the direct target in the
    /// preloaded process: its parent holds the mount).
    Borrowed,
}

/// A directory target.
pub struct DirTarget {
    name: String,
    desc: String,
    kind: Kind,
    root: PathBuf,
    backing: Backing,
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.stdin(Stdio::null()).output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} failed ({}): {}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Whether `mnt` is a mount point in /proc/mounts.
pub fn is_mounted(mnt: &Path) -> bool {
    let Ok(s) = std::fs::read_to_string("/proc/mounts") else { return false };
    let want = mnt.to_string_lossy();
    s.lines().any(|l| l.split(' ').nth(1).is_some_and(|m| m.replace("\\040", " ") == want))
}

/// Capacity and use of the file system holding `path` (via `stat -f`).
pub fn statvfs(path: &Path) -> TResult<Usage> {
    let out = Command::new("stat")
        .args(["-f", "-c", "%S %b %f"])
        .arg(path)
        .output()
        .map_err(|e| TargetError::Other(format!("stat -f: {e}")))?;
    let s = String::from_utf8_lossy(&out.stdout);
    let v: Vec<u64> = s.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    if !out.status.success() || v.len() != 3 {
        return Err(TargetError::Other(format!(
            "stat -f {}: unexpected output {s:?}",
            path.display()
        )));
    }
    Ok(Usage { total: v[0] * v[1], used: v[0] * (v[1] - v[2]) })
}

fn clear_dir(root: &Path) -> TResult<()> {
    for e in std::fs::read_dir(root)? {
        let e = e?;
        let p = e.path();
        if e.file_type()?.is_dir() {
            std::fs::remove_dir_all(&p)?;
        } else {
            std::fs::remove_file(&p)?;
        }
    }
    Ok(())
}

impl DirTarget {
    /// A tmpfs directory (created fresh at `root`).
    pub fn tmpfs(root: PathBuf) -> Result<Self, String> {
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        let u = statvfs(&root).map_err(|e| e.to_string())?;
        let fstype = fs_type(&root);
        if fstype.as_deref() != Some("tmpfs") {
            return Err(format!("{} is on {:?}, not tmpfs", root.display(), fstype));
        }
        let mut t = DirTarget {
            name: "tmpfs".into(),
            desc: format!(
                "kernel tmpfs ({} GiB) through syscalls; fsync is a no-op (no durability)",
                u.total >> 30
            ),
            kind: Kind::Kernel,
            root,
            backing: Backing::Plain,
        };
        t.reset().map_err(|e| e.to_string())?;
        Ok(t)
    }

    /// ext4 on a loop device over a sparse image of `size` bytes at `image`, mounted at
    /// `mnt`. Needs root and loop devices.
    pub fn ext4(image: PathBuf, mnt: PathBuf, size: u64) -> Result<Self, String> {
        if !Path::new("/dev/loop-control").exists() {
            return Err("no loop devices (/dev/loop-control missing)".into());
        }
        std::fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
        let mut t = DirTarget {
            name: "ext4".into(),
            desc: format!(
                "kernel ext4 (data=ordered, {} MiB image on a loop device in /dev/shm); \
                 fsync commits the journal",
                size >> 20
            ),
            kind: Kind::Kernel,
            root: mnt,
            backing: Backing::Ext4 { image, size, mounted: false },
        };
        t.reset().map_err(|e| e.to_string())?;
        Ok(t)
    }

    /// The FerriteFS FUSE mount: formats a pre-faulted pool of `size` bytes at `pool`,
    /// runs `bin mount POOL MNT -f` and waits for the mount to appear.
    pub fn fuse(bin: &Path, pool: PathBuf, mnt: PathBuf, size: u64) -> Result<Self, String> {
        // The mount's default transport follows the fuse module's switch.
        let uring = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring")
            .is_ok_and(|v| matches!(v.trim(), "Y" | "1"));
        let desc = if uring {
            "FerriteFS through its FUSE mount (kernel VFS -> FUSE over io_uring -> \
             `ferrite mount`); fsync reaches the library's fsync"
        } else {
            "FerriteFS through its FUSE mount (kernel VFS -> /dev/fuse -> `ferrite mount`); \
             fsync reaches the library's fsync"
        };
        Self::ferrite_mount("ferrite-fuse", desc, bin, pool, mnt, size, &["-o", "nodirect"])
    }

    /// A mount of `bin` serving the direct target: mounted with direct access
    /// offered; the preloaded process measures it ([`DirTarget::borrowed`]).
    pub fn direct_mount(
        bin: &Path,
        pool: PathBuf,
        mnt: PathBuf,
        size: u64,
    ) -> Result<Self, String> {
        Self::ferrite_mount("ferrite-direct-mount", "", bin, pool, mnt, size, &[])
    }

    /// The direct target: a mount this process did not make, used through the preload
    /// library loaded in this process.
    pub fn borrowed(name: &str, desc: &str, mnt: PathBuf) -> Result<Self, String> {
        if !is_mounted(&mnt) {
            return Err(format!("{} is not mounted", mnt.display()));
        }
        let mut t = DirTarget {
            name: name.into(),
            desc: desc.into(),
            kind: Kind::Ferrite,
            root: mnt,
            backing: Backing::Borrowed,
        };
        t.reset().map_err(|e| e.to_string())?;
        Ok(t)
    }

    fn ferrite_mount(
        name: &str,
        desc: &str,
        bin: &Path,
        pool: PathBuf,
        mnt: PathBuf,
        size: u64,
        opts: &[&str],
    ) -> Result<Self, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("/dev/fuse is missing".into());
        }
        let help = Command::new(bin)
            .args(["mount", "--help"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        if !help.success() {
            return Err(format!("{} has no `mount` subcommand", bin.display()));
        }
        std::fs::create_dir_all(&mnt).map_err(|e| format!("{}: {e}", mnt.display()))?;
        let _ = std::fs::remove_file(&pool);
        {
            use ferrite_core::{Fs, MapOptions, MkfsOptions, MmapMedium};
            let fmt = || -> ferrite_core::Result<()> {
                let m = MmapMedium::create(&pool, size, &MapOptions::default())?;
                super::lib::prefault(&m);
                Fs::mkfs(m, &MkfsOptions::default())?.unmount()?;
                Ok(())
            };
            fmt().map_err(|e| format!("formatting {}: {e}", pool.display()))?;
        }
        let child = Command::new(bin)
            .arg("mount")
            .arg(&pool)
            .arg(&mnt)
            .arg("-f")
            .args(opts)
            // A preloaded bench must not preload its daemons.
            .env_remove("LD_PRELOAD")
            .env_remove("FERRITE_MOUNTS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{}: {e}", bin.display()))?;
        let mut t = DirTarget {
            name: name.into(),
            desc: desc.into(),
            kind: Kind::Ferrite,
            root: mnt.clone(),
            backing: Backing::Fuse { child: Some(child), pool },
        };
        let t0 = Instant::now();
        loop {
            if is_mounted(&mnt) {
                break;
            }
            if let Backing::Fuse { child: Some(c), .. } = &mut t.backing {
                if let Ok(Some(st)) = c.try_wait() {
                    let mut err = String::new();
                    if let Some(mut e) = c.stderr.take() {
                        let _ = e.read_to_string(&mut err);
                    }
                    return Err(format!("`ferrite mount` exited ({st}): {}", err.trim()));
                }
            }
            if t0.elapsed() > Duration::from_secs(20) {
                return Err("the FUSE mount did not appear within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        t.reset().map_err(|e| e.to_string())?;
        Ok(t)
    }

    /// The directory everything lives under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn p(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    fn file(h: &Handle) -> TResult<&File> {
        match h {
            Handle::File { f, .. } => Ok(f),
            _ => Err(TargetError::Other("handle of another target".into())),
        }
    }

    fn ext4_umount(&mut self) {
        if let Backing::Ext4 { mounted, .. } = &mut self.backing {
            if *mounted {
                if run(Command::new("umount").arg(&self.root)).is_err() {
                    // Busy (an open file left by a failed workload): detach lazily.
                    let _ = run(Command::new("umount").arg("-l").arg(&self.root));
                }
                *mounted = false;
            }
        }
    }
}

/// File system type of the mount holding `path` (from `stat -f`).
pub fn fs_type(path: &Path) -> Option<String> {
    let out = Command::new("stat").args(["-f", "-c", "%T"]).arg(path).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

impl Drop for DirTarget {
    fn drop(&mut self) {
        match &mut self.backing {
            Backing::Plain => {
                let _ = std::fs::remove_dir_all(&self.root);
            }
            Backing::Borrowed => {
                let _ = clear_dir(&self.root);
            }
            Backing::Ext4 { image, .. } => {
                let image = image.clone();
                self.ext4_umount();
                let _ = std::fs::remove_file(image);
                let _ = std::fs::remove_dir(&self.root);
            }
            Backing::Fuse { child, pool } => {
                // fusermount3 (fuse3) where installed, else umount(8) (as root).
                let tries: [(&str, &[&str]); 4] = [
                    ("fusermount3", &["-u"]),
                    ("umount", &[]),
                    ("fusermount3", &["-u", "-z"]),
                    ("umount", &["-l"]),
                ];
                for (cmd, args) in tries {
                    if !is_mounted(&self.root) {
                        break;
                    }
                    let _ = run(Command::new(cmd).args(args).arg(&self.root));
                }
                if let Some(mut c) = child.take() {
                    let t0 = Instant::now();
                    while t0.elapsed() < Duration::from_secs(10) {
                        if let Ok(Some(_)) = c.try_wait() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    if let Ok(None) = c.try_wait() {
                        let _ = c.kill();
                        let _ = c.wait();
                    }
                }
                let _ = std::fs::remove_file(&*pool);
                let _ = std::fs::remove_dir(&self.root);
            }
        }
    }
}

impl Target for DirTarget {
    fn name(&self) -> &str {
        &self.name
    }

    fn map_fd<'a>(&self, h: &'a Handle) -> Option<std::os::fd::BorrowedFd<'a>> {
        use std::os::fd::AsFd;
        Self::file(h).ok().map(|f| f.as_fd())
    }

    fn dir(&self) -> Option<&Path> {
        Some(&self.root)
    }

    fn describe(&self) -> String {
        self.desc.clone()
    }

    fn kind(&self) -> Kind {
        self.kind
    }

    fn reset(&mut self) -> TResult<()> {
        match &self.backing {
            Backing::Plain | Backing::Fuse { .. } | Backing::Borrowed => clear_dir(&self.root),
            Backing::Ext4 { image, size, .. } => {
                let (image, size) = (image.clone(), *size);
                self.ext4_umount();
                // A fresh image each time: the memory of the old one goes back to /dev/shm.
                let _ = std::fs::remove_file(&image);
                let f = File::create(&image)?;
                f.set_len(size)?;
                drop(f);
                run(Command::new("mkfs.ext4")
                    .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
                    .arg(&image))
                .map_err(TargetError::Other)?;
                run(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&self.root))
                    .map_err(TargetError::Other)?;
                if let Backing::Ext4 { mounted, .. } = &mut self.backing {
                    *mounted = true;
                }
                clear_dir(&self.root) // lost+found
            }
        }
    }

    fn create(&self, path: &str, append: bool) -> TResult<Handle> {
        use std::os::unix::fs::OpenOptionsExt;
        // std refuses append with truncate; O_APPEND as a raw flag gives the one
        // open(O_CREAT|O_TRUNC|O_APPEND) an application would make.
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(if append { libc::O_APPEND } else { 0 })
            .open(self.p(path))?;
        Ok(Handle::File { f, append })
    }

    fn open(&self, path: &str, append: bool) -> TResult<Handle> {
        let f = OpenOptions::new().read(true).write(true).append(append).open(self.p(path))?;
        Ok(Handle::File { f, append })
    }

    fn close(&self, h: Handle) -> TResult<()> {
        drop(h);
        Ok(())
    }

    fn write_at(&self, h: &Handle, off: u64, data: &[u8]) -> TResult<()> {
        Ok(Self::file(h)?.write_all_at(data, off)?)
    }

    fn append(&self, h: &Handle, data: &[u8]) -> TResult<()> {
        let mut f = Self::file(h)?;
        if !matches!(h, Handle::File { append: true, .. }) {
            // Not opened with O_APPEND: seek to the end first (single writer).
            use std::io::{Seek, SeekFrom};
            f.seek(SeekFrom::End(0))?;
        }
        Ok(f.write_all(data)?)
    }

    fn read_at(&self, h: &Handle, off: u64, buf: &mut [u8]) -> TResult<usize> {
        let f = Self::file(h)?;
        let mut done = 0;
        while done < buf.len() {
            let n = f.read_at(&mut buf[done..], off + done as u64)?;
            if n == 0 {
                break;
            }
            done += n;
        }
        Ok(done)
    }

    fn fsync(&self, h: &Handle) -> TResult<()> {
        Ok(Self::file(h)?.sync_all()?)
    }

    fn size(&self, h: &Handle) -> TResult<u64> {
        Ok(Self::file(h)?.metadata()?.len())
    }

    fn mkdir(&self, path: &str) -> TResult<()> {
        Ok(std::fs::create_dir(self.p(path))?)
    }

    fn stat(&self, path: &str) -> TResult<u64> {
        Ok(std::fs::metadata(self.p(path))?.len())
    }

    fn rename(&self, from: &str, to: &str) -> TResult<()> {
        Ok(std::fs::rename(self.p(from), self.p(to))?)
    }

    fn unlink(&self, path: &str) -> TResult<()> {
        Ok(std::fs::remove_file(self.p(path))?)
    }

    fn rmdir(&self, path: &str) -> TResult<()> {
        Ok(std::fs::remove_dir(self.p(path))?)
    }

    fn readdir_count(&self, path: &str) -> TResult<usize> {
        let mut n = 0;
        for e in std::fs::read_dir(self.p(path))? {
            e?;
            n += 1;
        }
        Ok(n)
    }

    fn usage(&self) -> TResult<Usage> {
        match self.backing {
            Backing::Plain => Err(TargetError::Unsupported("usage of a shared tmpfs")),
            _ => statvfs(&self.root),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tmpfs_target_ops() {
        let root = PathBuf::from(format!("/dev/shm/ferrite-bench-unit-{}", std::process::id()));
        let mut t = match DirTarget::tmpfs(root.clone()) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("skipping: {e}");
                return;
            }
        };
        t.mkdir("d").unwrap();
        let h = t.create("d/a", true).unwrap();
        t.append(&h, b"12").unwrap();
        t.append(&h, b"34").unwrap();
        t.close(h).unwrap();
        assert_eq!(t.stat("d/a").unwrap(), 4);
        let h = t.create("d/f", false).unwrap();
        t.write_at(&h, 0, b"abc").unwrap();
        t.append(&h, b"def").unwrap();
        t.fsync(&h).unwrap();
        let mut b = [0u8; 8];
        assert_eq!(t.read_at(&h, 0, &mut b).unwrap(), 6);
        assert_eq!(&b[..6], b"abcdef");
        t.close(h).unwrap();
        let h = t.open("d/f", true).unwrap();
        t.append(&h, b"gh").unwrap();
        t.close(h).unwrap();
        assert_eq!(t.stat("d/f").unwrap(), 8);
        t.rename("d/f", "d/g").unwrap();
        assert_eq!(t.readdir_count("d").unwrap(), 2);
        t.unlink("d/a").unwrap();
        assert!(matches!(t.stat("d/f"), Err(TargetError::Other(_))));
        t.unlink("d/g").unwrap();
        t.rmdir("d").unwrap();
        t.mkdir("x").unwrap();
        t.reset().unwrap();
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        drop(t);
        assert!(!root.exists());
    }

    #[test]
    fn statvfs_parses() {
        let u = statvfs(Path::new("/")).unwrap();
        assert!(u.total > 0 && u.used <= u.total);
    }
}
