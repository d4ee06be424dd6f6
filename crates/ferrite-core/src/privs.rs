//! What a change to a file's data or owner takes away from it, as Linux's
//! `file_remove_privs` and `chown` do, decided once here for every front end (the
//! FUSE mount, which asks the kernel to leave it to the file system with
//! `FUSE_HANDLE_KILLPRIV_V2`, the preload library and the C API, which the kernel
//! never sees).
//!
//! Invariants:
//! - A write, an append or a truncate removes a `security.capability` attribute
//!   always, and the set-user-id bit, and the set-group-id bit where it means "set
//!   group" (group-executable), when the writer lacks `CAP_FSETID`.
//! - The writer's capabilities are asked for only when the file has such a bit: the
//!   common write pays one test of the mode and of the attribute map's emptiness.
//! - The entries that remove them are committed with the write itself (one atomic
//!   operation, where Linux changes the mode before writing).

use crate::fs::Fs;
use crate::index::InodeState;
use crate::log::{EntryBuf, Ts};
use crate::pmem::Medium;

/// The extended attribute that holds file capabilities.
pub const SECURITY_CAPABILITY: &[u8] = b"security.capability";

/// The mode bits a write by a writer without `CAP_FSETID` clears from `mode`.
pub fn suidgid_to_kill(mode: u32) -> u32 {
    let mut kill = mode & 0o4000;
    if mode & 0o2010 == 0o2010 {
        kill |= 0o2000;
    }
    kill
}

/// Does process `pid` lack `CAP_FSETID` in its effective set? Read from
/// `/proc/PID/status`; a process that cannot be read (gone, or pid 0) is taken
/// to lack it, so the bits are cleared, the safe side.
pub fn lacks_cap_fsetid(pid: u32) -> bool {
    status_lacks_cap_fsetid(&format!("/proc/{pid}/status"))
}

/// Does the calling thread lack `CAP_FSETID`? (For the preload library and the C
/// API, whose writers are the process's own threads.)
pub fn self_lacks_cap_fsetid() -> bool {
    status_lacks_cap_fsetid("/proc/thread-self/status")
}

fn status_lacks_cap_fsetid(path: &str) -> bool {
    const CAP_FSETID: u32 = 4;
    let Ok(s) = std::fs::read_to_string(path) else { return true };
    let eff = s
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    eff.is_none_or(|e| e & (1 << CAP_FSETID) == 0)
}

/// The entry that removes the file's `security.capability` attribute, if it has one.
pub(crate) fn capability_removal(st: &InodeState, now: Ts) -> Option<EntryBuf> {
    let has = !st.xattrs.is_empty() && st.xattrs.contains_key(SECURITY_CAPABILITY);
    has.then(|| EntryBuf::xattr(true, SECURITY_CAPABILITY, &[], now))
}

impl<M: Medium> Fs<M> {
    /// The entries that take privileges away from a locked regular file on a write
    /// or truncate at `now` (none in the common case). `lacks_fsetid` is asked only
    /// when the file has a set-user-id or set-group-id bit to clear.
    pub(crate) fn remove_privs_entries(
        st: &InodeState,
        now: Ts,
        lacks_fsetid: impl FnOnce() -> bool,
        out: &mut impl Extend<EntryBuf>,
    ) {
        let kill = suidgid_to_kill(st.attr.mode);
        if kill != 0 && lacks_fsetid() {
            let (e, _) = Self::setattr_entry(st, |a| {
                a.mode &= !kill;
                a.ctime = now;
            });
            out.extend([e]);
        }
        out.extend(capability_removal(st, now));
    }

    /// The attribute entries of a data change to a locked regular file that
    /// leaves it `size` bytes long at `now` (a write in place, a clone): one
    /// SETATTR of size, mtime, ctime and the set-id bits a writer lacking
    /// `CAP_FSETID` loses, then the capability's removal if it has one.
    pub(crate) fn data_change_entries(
        st: &InodeState,
        size: u64,
        now: Ts,
        lacks_fsetid: impl FnOnce() -> bool,
        out: &mut impl Extend<EntryBuf>,
    ) {
        let kill = suidgid_to_kill(st.attr.mode);
        let kill = if kill != 0 && lacks_fsetid() { kill } else { 0 };
        let (e, _) = Self::setattr_entry(st, |a| {
            a.size = size;
            a.mtime = now;
            a.ctime = now;
            a.mode &= !kill;
        });
        out.extend([e]);
        out.extend(capability_removal(st, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bits_linux_clears() {
        assert_eq!(suidgid_to_kill(0o4755), 0o4000);
        assert_eq!(suidgid_to_kill(0o2755), 0o2000);
        // Set-group-id without group execute is mandatory locking, not "set group".
        assert_eq!(suidgid_to_kill(0o2745), 0);
        assert_eq!(suidgid_to_kill(0o6775), 0o6000);
        assert_eq!(suidgid_to_kill(0o0777), 0);
    }

    #[test]
    fn a_missing_process_lacks_the_capability() {
        assert!(lacks_cap_fsetid(0));
        assert!(lacks_cap_fsetid(u32::MAX));
        // Whatever this test runs as, its own process and thread agree.
        assert_eq!(self_lacks_cap_fsetid(), lacks_cap_fsetid(std::process::id()));
    }
}
