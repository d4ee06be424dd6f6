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

use crate::fs::{Fs, SetAttr};
use crate::index::InodeState;
use crate::log::{EntryBuf, Ts};
use crate::pmem::Medium;

/// Who makes a change to a file without the kernel (the preload library and the
/// C API): its file-system user and group ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caller {
    /// File-system user id (`setfsuid(-1)`; the effective one unless changed).
    pub uid: u32,
    /// File-system group id.
    pub gid: u32,
}

/// May `caller` change the mode, owner or times of a file whose mode, owner and
/// group are `mode`, `uid` and `gid` (with an access ACL: `acl`) as `ch` says, by
/// rules Linux applies to any caller whatever its supplementary groups and
/// capabilities (`chown_ok`, `chgrp_ok`, `setattr_prepare`)? `false` means only
/// the kernel can tell, not that Linux refuses: the front end then asks it.
///
/// Decided here: the owner may set the times, set the permission bits (not a
/// set-group-id bit unless the file's group is its own), keep the owner, and set
/// the group to the file's or its own. Left to the kernel: any other caller,
/// another owner, a supplementary group, size (a truncate is a write), an empty
/// change (`chown(f, -1, -1)`, the mount's), a file with
/// an access ACL (the kernel caches the ACL that a chmod rewrites), and a chown
/// of a set-group-id file without group execute in a group not the caller's (Linux
/// clears that bit unless the caller is in the group or has `CAP_FSETID`).
pub fn owner_may(caller: Caller, mode: u32, uid: u32, gid: u32, acl: bool, ch: &SetAttr) -> bool {
    // An empty change is chown(file, -1, -1), whose clearing of set-id bits
    // follows the FUSE kernel's request: the mount's path.
    if *ch == SetAttr::default() || ch.size.is_some() || caller.uid != uid {
        return false;
    }
    if ch.uid.is_some_and(|u| u != uid) {
        return false;
    }
    if ch.gid.is_some_and(|g| g != gid && g != caller.gid) {
        return false;
    }
    let new_gid = ch.gid.unwrap_or(gid);
    if let Some(p) = ch.perm {
        if acl || (p & 0o2000 != 0 && new_gid != caller.gid) {
            return false;
        }
    }
    let chown = ch.uid.is_some() || ch.gid.is_some();
    if chown && mode & 0o2010 == 0o2000 && gid != caller.gid {
        return false;
    }
    true
}

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
    has_capability(st).then(|| EntryBuf::xattr(true, SECURITY_CAPABILITY, &[], now))
}

/// Does the file carry a file capability (which a write takes away)?
fn has_capability(st: &InodeState) -> bool {
    !st.xattrs.is_empty() && st.xattrs.contains_key(SECURITY_CAPABILITY)
}

/// Does a write take no privileges from the file ([`Fs::remove_privs_entries`]
/// makes no entry, whoever writes)?
pub(crate) fn write_keeps_privs(st: &InodeState) -> bool {
    suidgid_to_kill(st.attr.mode) == 0 && !has_capability(st)
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
    fn what_an_owner_may_change_without_the_kernel() {
        let me = Caller { uid: 1000, gid: 100 };
        let ch = |perm, uid, gid| SetAttr { perm, uid, gid, ..Default::default() };
        let times = SetAttr { mtime: Some(crate::fs::SetTime::Now), ..Default::default() };
        // The owner: times, permission bits, the same owner, its own group.
        assert!(owner_may(me, 0o644, 1000, 100, false, &times));
        assert!(owner_may(me, 0o644, 1000, 100, false, &ch(Some(0o4755), None, None)));
        assert!(owner_may(me, 0o644, 1000, 100, false, &ch(None, Some(1000), Some(100))));
        assert!(owner_may(me, 0o644, 1000, 50, false, &ch(None, None, Some(100))));
        assert!(owner_may(me, 0o644, 1000, 50, false, &ch(None, None, Some(50))));
        // Set-group-id only in its own group (else supplementary groups decide).
        assert!(owner_may(me, 0o644, 1000, 100, false, &ch(Some(0o2755), None, None)));
        assert!(!owner_may(me, 0o644, 1000, 50, false, &ch(Some(0o2755), None, None)));
        assert!(owner_may(me, 0o644, 1000, 50, false, &ch(Some(0o2755), None, Some(100))));
        // Anyone else, another owner, another group, a size, an ACL: the kernel's.
        assert!(!owner_may(me, 0o644, 0, 100, false, &times));
        assert!(!owner_may(Caller { uid: 0, gid: 0 }, 0o644, 1000, 100, false, &times));
        assert!(!owner_may(me, 0o644, 1000, 100, false, &ch(None, Some(0), None)));
        assert!(!owner_may(me, 0o644, 1000, 100, false, &ch(None, None, Some(7))));
        let size = SetAttr { size: Some(0), ..Default::default() };
        assert!(!owner_may(me, 0o644, 1000, 100, false, &size));
        assert!(!owner_may(me, 0o644, 1000, 100, false, &SetAttr::default()));
        assert!(!owner_may(me, 0o644, 1000, 100, true, &ch(Some(0o600), None, None)));
        assert!(owner_may(me, 0o644, 1000, 100, true, &times));
        // chown of mandatory-locking set-group-id in another group: the kernel's.
        assert!(!owner_may(me, 0o2644, 1000, 50, false, &ch(None, Some(1000), None)));
        assert!(owner_may(me, 0o2654, 1000, 50, false, &ch(None, Some(1000), None)));
        assert!(owner_may(me, 0o2644, 1000, 100, false, &ch(None, Some(1000), None)));
    }

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
