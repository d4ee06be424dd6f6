//! The FUSE mounts this process may use directly (FerriteFS ones, found out on first
//! use), read once (the mount points `FERRITE_MOUNTS` lists, or /proc/self/mountinfo),
//! and the attached client of each.
//!
//! Invariants:
//! - A mount's client is attached at most once per process image and then lives as
//!   long as the process (`&'static`): hooks use it without reference counts. After
//!   `fork` the child abandons the parent's clients (their connection and allocator
//!   are the parent's) and attaches its own on first use.
//! - A mount whose attach failed is plain for the rest of the process: its files go
//!   through the kernel, quietly (`FERRITE_DIRECT_DEBUG=1` prints why).

use ferrite_direct::{AttachError, Client};
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU8, Ordering};
use std::sync::OnceLock;

const UNKNOWN: u8 = 0;
const PLAIN: u8 = 1;
const ATTACHED: u8 = 2;

/// One FerriteFS mount.
pub struct Mount {
    /// Mount point (no trailing slash).
    pub path: Vec<u8>,
    /// Device number of the mount (what fstat reports as st_dev).
    pub dev: u64,
    state: AtomicU8,
    attach: Mutex<()>,
    client: AtomicPtr<Client>,
    /// Regular files this process opened for reading only before it attached.
    lazy_reads: AtomicU32,
}

impl Mount {
    /// The attached client, attaching on first use; `None` for a plain mount.
    pub fn client(&self) -> Option<&'static Client> {
        let p = self.client.load(Ordering::Acquire);
        if !p.is_null() {
            return Some(crate::leaked(p));
        }
        if self.state.load(Ordering::Acquire) == PLAIN {
            return None;
        }
        let _g = self.attach.lock();
        if self.state.load(Ordering::Acquire) != UNKNOWN {
            let p = self.client.load(Ordering::Acquire);
            return (!p.is_null()).then(|| crate::leaked(p));
        }
        let mp = PathBuf::from(std::ffi::OsStr::from_bytes_compat(&self.path));
        match Client::attach(&mp) {
            Ok(c) => {
                let p = Box::into_raw(Box::new(c));
                self.client.store(p, Ordering::Release);
                self.state.store(ATTACHED, Ordering::Release);
                Some(crate::leaked(p))
            }
            Err(e) => {
                // No access to the pool is the normal case for processes the pool's
                // permissions leave out: quiet. Anything else is worth a word when
                // asked for.
                let quiet = matches!(e, AttachError::NoAccess(_));
                if debug() || (!quiet && warn()) {
                    eprintln!("ferrite-preload: {}: {e}; using the mount", mp.display());
                }
                self.state.store(PLAIN, Ordering::Release);
                None
            }
        }
    }

    /// Might this process attach (it has not found the mount plain)?
    pub fn may_attach(&self) -> bool {
        self.state.load(Ordering::Acquire) != PLAIN
    }

    /// Count a read-only open made through the kernel before attaching; how many
    /// were made before it.
    pub fn note_lazy_read(&self) -> u32 {
        self.lazy_reads.fetch_add(1, Ordering::Relaxed)
    }

    /// The client, if attached (never attaches).
    pub fn attached(&self) -> Option<&'static Client> {
        let p = self.client.load(Ordering::Acquire);
        (!p.is_null()).then(|| crate::leaked(p))
    }

    /// In a child after fork: forget the parent's client.
    fn reset_after_fork(&self) {
        crate::statics::unlock_after_fork(&self.attach);
        let p = self.client.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            crate::abandon(p);
        }
        self.state.store(UNKNOWN, Ordering::Release);
        self.lazy_reads.store(0, Ordering::Relaxed);
    }
}

trait FromBytes {
    fn from_bytes_compat(b: &[u8]) -> &std::ffi::OsStr;
}
impl FromBytes for std::ffi::OsStr {
    fn from_bytes_compat(b: &[u8]) -> &std::ffi::OsStr {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(b)
    }
}

/// `FERRITE_DIRECT_WARN` is set (attach failures other than access are printed).
fn warn() -> bool {
    std::env::var_os("FERRITE_DIRECT_WARN").is_some_and(|v| v != "0")
}

/// `FERRITE_DIRECT_DEBUG` is set.
pub fn debug() -> bool {
    static D: OnceLock<bool> = OnceLock::new();
    *D.get_or_init(|| std::env::var_os("FERRITE_DIRECT_DEBUG").is_some_and(|v| v != "0"))
}

static MOUNTS: OnceLock<Vec<Mount>> = OnceLock::new();

/// The FerriteFS mounts (read once).
pub fn mounts() -> &'static [Mount] {
    MOUNTS.get_or_init(|| {
        let only: Option<Vec<Vec<u8>>> = std::env::var_os("FERRITE_MOUNTS").map(|v| {
            use std::os::unix::ffi::OsStrExt;
            v.as_bytes()
                .split(|&b| b == b':')
                .filter(|s| !s.is_empty())
                .map(|s| trim_slash(s).to_vec())
                .collect()
        });
        let found = match &only {
            Some(list) => listed(list).unwrap_or_else(|| from_mountinfo(Some(list))),
            None => from_mountinfo(None),
        };
        found
            .into_iter()
            .map(|(path, dev)| Mount {
                path,
                dev,
                state: AtomicU8::new(UNKNOWN),
                attach: Mutex::new(()),
                client: AtomicPtr::new(std::ptr::null_mut()),
                lazy_reads: AtomicU32::new(0),
            })
            .collect()
    })
}

/// The FUSE mounts of /proc/self/mountinfo, those in `only` when given.
fn from_mountinfo(only: Option<&Vec<Vec<u8>>>) -> Vec<(Vec<u8>, u64)> {
    let text = std::fs::read("/proc/self/mountinfo").unwrap_or_default();
    let mut v = parse_mountinfo(&text);
    v.retain(|(p, _)| only.is_none_or(|o| o.iter().any(|x| x == p)));
    v
}

/// The mounts `FERRITE_MOUNTS` lists (as `ferrite run` writes it: canonical mount
/// points), each asked with one cached `statx`: the mount points of them, with
/// their devices. The kernel writes all of mountinfo for a read of it, about
/// 0.1 ms of every preloaded process's start on a 2-CPU VM (estimated from perf's
/// share of samples). None when a path is not
/// plain (relative, `.` or `..`) or the kernel cannot say what a mount point is:
/// mountinfo decides then. A listed mount point that is not FerriteFS answers no
/// at the first attach and stays plain, as a listed FUSE mount of another kind did.
fn listed(list: &[Vec<u8>]) -> Option<Vec<(Vec<u8>, u64)>> {
    let mut out = Vec::new();
    for p in list {
        let plain = p.first() == Some(&b'/')
            && p.split(|&b| b == b'/').skip(1).all(|c| !c.is_empty() && c != b"." && c != b"..")
            || p == b"/";
        if !plain {
            return None;
        }
        let Ok(c) = std::ffi::CString::new(p.clone()) else { return None };
        let Ok(st) = crate::real::statx_at_cached(libc::AT_FDCWD, &c, 0) else {
            continue; // not there: not a mount this process can use
        };
        const ROOT: u64 = libc::STATX_ATTR_MOUNT_ROOT as u64;
        if st.stx_attributes_mask & ROOT == 0 {
            return None; // a kernel before 5.8
        }
        if st.stx_attributes & ROOT != 0 {
            out.push((p.clone(), libc::makedev(st.stx_dev_major, st.stx_dev_minor)));
        }
    }
    Some(out)
}

fn trim_slash(p: &[u8]) -> &[u8] {
    if p.len() > 1 && p.ends_with(b"/") {
        &p[..p.len() - 1]
    } else {
        p
    }
}

/// FerriteFS mounts in a mountinfo text: (mount point, device number).
pub fn parse_mountinfo(text: &[u8]) -> Vec<(Vec<u8>, u64)> {
    let mut out = Vec::new();
    for line in text.split(|&b| b == b'\n') {
        let f: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let Some(sep) = f.iter().position(|x| *x == b"-") else { continue };
        if f.len() < sep + 2 || f.len() < 5 {
            continue;
        }
        // A FerriteFS mount made by `ferrite mount` shows as plain "fuse" (the
        // kernel keeps a subtype only for mounts made through fusermount): every
        // FUSE mount is a candidate, and the first attach asks it (a mount that is
        // not FerriteFS answers no and stays plain).
        let fstype = f[sep + 1];
        if fstype != b"fuse.ferrite" && fstype != b"fuse" {
            continue;
        }
        let Some((maj, min)) = std::str::from_utf8(f[2]).ok().and_then(|s| s.split_once(':'))
        else {
            continue;
        };
        let (Ok(maj), Ok(min)) = (maj.parse::<u32>(), min.parse::<u32>()) else { continue };
        out.push((unescape(f[4]), libc::makedev(maj, min)));
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as \ooo.
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let n = (s[i + 1] - b'0') * 64 + (s[i + 2] - b'0') * 8 + (s[i + 3] - b'0');
            v.push(n);
            i += 4;
        } else {
            v.push(s[i]);
            i += 1;
        }
    }
    v
}

/// The mount holding absolute path `abs` (longest mount point that is a prefix).
pub fn for_path(abs: &[u8]) -> Option<&'static Mount> {
    mounts()
        .iter()
        .filter(|m| {
            abs.starts_with(&m.path)
                && (abs.len() == m.path.len() || abs[m.path.len()] == b'/' || m.path == b"/")
        })
        .max_by_key(|m| m.path.len())
}

/// The attached client of a mount with device number `dev` (never attaches).
pub fn attached_for_dev(dev: u64) -> Option<&'static Client> {
    mounts().iter().filter(|m| m.dev == dev).find_map(|m| m.attached())
}

/// The mount with device number `dev`.
pub fn for_dev(dev: u64) -> Option<&'static Mount> {
    mounts().iter().find(|m| m.dev == dev)
}

/// Is any mount's client attached?
pub fn any_attached() -> bool {
    MOUNTS.get().is_some_and(|ms| ms.iter().any(|m| m.attached().is_some()))
}

/// The first `Some` of `f` over the attached clients.
pub fn find_attached<T>(mut f: impl FnMut(&'static Client) -> Option<T>) -> Option<T> {
    MOUNTS.get()?.iter().find_map(|m| f(m.attached()?))
}

/// In a child after fork.
pub fn after_fork_child() {
    if let Some(ms) = MOUNTS.get() {
        for m in ms {
            m.reset_after_fork();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_ferrite_mounts() {
        let t = b"22 1 0:21 / /proc rw - proc proc rw\n\
                  90 30 0:51 / /mnt/a\\040b rw,nosuid - fuse.ferrite /dev/shm/p rw,user_id=0\n\
                  91 30 0:52 / /mnt/c rw - fuse.other x rw\n\
                  92 30 0:53 / /mnt/d rw - fuse /dev/shm/q rw\n";
        let m = parse_mountinfo(t);
        assert_eq!(
            m,
            vec![
                (b"/mnt/a b".to_vec(), libc::makedev(0, 51)),
                (b"/mnt/d".to_vec(), libc::makedev(0, 53))
            ]
        );
    }

    #[test]
    fn listed_mount_points_are_found_as_mountinfo_finds_them() {
        use std::os::unix::fs::MetadataExt;
        let dev = std::fs::metadata("/proc").unwrap().dev();
        let list = [b"/proc".to_vec(), b"/proc/self".to_vec(), b"/no/such/place".to_vec()];
        // A mount point is kept with its device; a directory inside one, or a
        // missing path, is not a mount point.
        assert_eq!(listed(&list), Some(vec![(b"/proc".to_vec(), dev)]));
        let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(mi.lines().any(|l| l.split(' ').nth(4) == Some("/proc")));
        // Paths that are not plain go to mountinfo.
        for p in ["proc", "/proc/../proc", "/./proc", "//proc"] {
            assert_eq!(listed(&[p.as_bytes().to_vec()]), None, "{p}");
        }
    }
}
