//! POSIX access control lists, as Linux stores them in the extended attributes
//! `system.posix_acl_access` and `system.posix_acl_default` (the kernel's xattr
//! format: a little-endian u32 version 2, then 8-byte entries `tag u16, perm u16,
//! id u32`). The core keeps them as extended attributes and owns the semantics a
//! file system must give them (the kernel enforces them from the attribute):
//!
//! - an access ACL decides the mode's permission bits (owner = USER_OBJ, group =
//!   MASK if present else GROUP_OBJ, other = OTHER); one that says no more than the
//!   mode is not stored (as ext4);
//! - chmod rewrites those entries of a stored access ACL;
//! - a node made in a directory with a default ACL inherits it: the access ACL is
//!   the default masked by the requested mode (the umask is not applied), and a
//!   directory also takes the default ACL.
//!
//! Invariant: every ACL this module returns is valid (`parse` accepts it) and in
//! the canonical order `parse` requires.

use crate::error::{Error, Result};

/// The access ACL's attribute name.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// The default ACL's attribute name.
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// Entries an ACL may hold (the value must fit an extended attribute).
pub const MAX_ENTRIES: usize = 400;

/// One ACL entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Tag (USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER).
    pub tag: u16,
    /// Permission bits (rwx).
    pub perm: u16,
    /// User or group id (USER and GROUP entries).
    pub id: u32,
}

/// A parsed, valid ACL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acl(pub Vec<Entry>);

/// Whether `name` is one of the two ACL attributes.
pub fn is_acl_name(name: &[u8]) -> bool {
    name == ACCESS || name == DEFAULT
}

fn bad(why: &str) -> Error {
    Error::invalid(format!("POSIX ACL: {why}"))
}

/// Parse and validate the xattr form (EINVAL on anything the kernel's
/// `posix_acl_valid` would refuse). An empty value is `None`: no ACL.
pub fn parse(v: &[u8]) -> Result<Option<Acl>> {
    if v.is_empty() {
        return Ok(None);
    }
    if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) {
        return Err(bad("size is not a header and whole entries"));
    }
    if u32::from_le_bytes(v[..4].try_into().expect("4 bytes")) != VERSION {
        return Err(Error::NotSupported("POSIX ACL version"));
    }
    let n = (v.len() - 4) / 8;
    if n > MAX_ENTRIES {
        return Err(bad("too many entries"));
    }
    let mut e = Vec::with_capacity(n);
    // Tags must come in this order, USER and GROUP ids increasing.
    let mut rank = 0u8;
    let mut last_id: Option<u32> = None;
    let (mut user_or_group, mut mask) = (false, false);
    let mut seen = [false; 3]; // USER_OBJ, GROUP_OBJ, OTHER
    for c in v[4..].chunks_exact(8) {
        let tag = u16::from_le_bytes([c[0], c[1]]);
        let perm = u16::from_le_bytes([c[2], c[3]]);
        let id = u32::from_le_bytes([c[4], c[5], c[6], c[7]]);
        if perm & !7 != 0 {
            return Err(bad("permission bits beyond rwx"));
        }
        let r = match tag {
            USER_OBJ => 1,
            USER => 2,
            GROUP_OBJ => 3,
            GROUP => 4,
            MASK => 5,
            OTHER => 6,
            _ => return Err(bad("unknown tag")),
        };
        if r < rank || (r == rank && !matches!(tag, USER | GROUP)) {
            return Err(bad("entries out of order or repeated"));
        }
        if r != rank {
            last_id = None;
        }
        rank = r;
        match tag {
            USER | GROUP => {
                if last_id.is_some_and(|l| id <= l) {
                    return Err(bad("ids out of order or repeated"));
                }
                last_id = Some(id);
                user_or_group = true;
            }
            USER_OBJ => seen[0] = true,
            GROUP_OBJ => seen[1] = true,
            OTHER => seen[2] = true,
            _ => mask = true,
        }
        let id = if matches!(tag, USER | GROUP) { id } else { u32::MAX };
        e.push(Entry { tag, perm, id });
    }
    if seen != [true; 3] {
        return Err(bad("missing owner, group or other entry"));
    }
    if user_or_group && !mask {
        return Err(bad("named entries need a mask entry"));
    }
    Ok(Some(Acl(e)))
}

impl Acl {
    /// The xattr form.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(4 + 8 * self.0.len());
        v.extend_from_slice(&VERSION.to_le_bytes());
        for e in &self.0 {
            v.extend_from_slice(&e.tag.to_le_bytes());
            v.extend_from_slice(&e.perm.to_le_bytes());
            v.extend_from_slice(&e.id.to_le_bytes());
        }
        v
    }

    /// True when the ACL says no more than permission bits (owner, group, other).
    pub fn is_mode_only(&self) -> bool {
        self.0.iter().all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    fn perm_of(&self, tag: u16) -> Option<u32> {
        self.0.iter().find(|e| e.tag == tag).map(|e| e.perm as u32)
    }

    /// `mode` with its permission bits (0o777) as the ACL decides them.
    pub fn apply_to_mode(&self, mode: u32) -> u32 {
        let u = self.perm_of(USER_OBJ).unwrap_or(0);
        let g = self.perm_of(MASK).or(self.perm_of(GROUP_OBJ)).unwrap_or(0);
        let o = self.perm_of(OTHER).unwrap_or(0);
        (mode & !0o777) | (u << 6) | (g << 3) | o
    }

    /// The ACL after chmod to `mode`: owner, mask (or group) and other follow it.
    pub fn chmod(&self, mode: u32) -> Acl {
        let has_mask = self.perm_of(MASK).is_some();
        let mut a = self.clone();
        for e in a.0.iter_mut() {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                MASK => e.perm = ((mode >> 3) & 7) as u16,
                GROUP_OBJ if !has_mask => e.perm = ((mode >> 3) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                _ => {}
            }
        }
        a
    }

    /// Inheritance of a default ACL by a node made with `mode` (Linux's
    /// `posix_acl_create_masq`): the new access ACL (None when it says no more than
    /// the mode) and the mode.
    pub fn create_masq(&self, mode: u32) -> (Option<Acl>, u32) {
        let mut a = self.clone();
        let mut mode = mode;
        let mut group_obj = None;
        let mut mask = None;
        let mut extended = false;
        for (k, e) in a.0.iter_mut().enumerate() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((mode >> 6) & 7) as u16;
                    mode &= ((e.perm as u32) << 6) | !0o700;
                }
                USER | GROUP => extended = true,
                GROUP_OBJ => group_obj = Some(k),
                MASK => {
                    mask = Some(k);
                    extended = true;
                }
                OTHER => {
                    e.perm &= (mode & 7) as u16;
                    mode &= (e.perm as u32) | !0o007;
                }
                _ => {}
            }
        }
        let k = mask.or(group_obj).expect("a valid ACL has a group entry");
        let e = &mut a.0[k];
        e.perm &= ((mode >> 3) & 7) as u16;
        mode &= ((e.perm as u32) << 3) | !0o070;
        (extended.then_some(a), mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(es: &[(u16, u16, u32)]) -> Vec<u8> {
        let a = Acl(es.iter().map(|&(tag, perm, id)| Entry { tag, perm, id }).collect());
        a.encode()
    }

    #[test]
    fn parse_accepts_what_the_kernel_accepts() {
        let base = acl(&[(USER_OBJ, 6, 0), (GROUP_OBJ, 4, 0), (OTHER, 4, 0)]);
        assert!(parse(&base).unwrap().unwrap().is_mode_only());
        let named = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 5, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 5, 0),
            (OTHER, 0, 0),
        ]);
        let a = parse(&named).unwrap().unwrap();
        assert!(!a.is_mode_only());
        assert_eq!(a.apply_to_mode(0o100644), 0o100750);
        assert_eq!(parse(&[]).unwrap(), None);
        // Refused: no mask with a named user, wrong order, bad perm, ragged size.
        for bad in [
            acl(&[(USER_OBJ, 7, 0), (USER, 5, 1000), (GROUP_OBJ, 5, 0), (OTHER, 0, 0)]),
            acl(&[(GROUP_OBJ, 5, 0), (USER_OBJ, 7, 0), (OTHER, 0, 0)]),
            acl(&[(USER_OBJ, 8, 0), (GROUP_OBJ, 5, 0), (OTHER, 0, 0)]),
            acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0)]),
            acl(&[
                (USER_OBJ, 7, 0),
                (USER, 1, 5),
                (USER, 1, 5),
                (GROUP_OBJ, 5, 0),
                (MASK, 7, 0),
                (OTHER, 0, 0),
            ]),
            base[..10].to_vec(),
        ] {
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn chmod_and_inheritance_follow_linux() {
        let named = acl(&[
            (USER_OBJ, 7, 0),
            (USER, 7, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 5, 0),
        ]);
        let a = parse(&named).unwrap().unwrap();
        let c = a.chmod(0o640);
        assert_eq!(c.apply_to_mode(0), 0o640);
        assert_eq!(c.0[1].perm, 7, "named entries stay; the mask limits them");
        assert_eq!(c.0[2].perm, 5, "with a mask, the group entry stays");
        // A file made 0666 under this default: group bits come from the mask.
        let (acc, mode) = a.create_masq(0o100666);
        assert_eq!(mode, 0o100664);
        let acc = acc.unwrap();
        assert_eq!(acc.apply_to_mode(0o100000), mode);
        // A mode-only default gives no access ACL, only bits.
        let plain =
            parse(&acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 0, 0), (OTHER, 0, 0)])).unwrap().unwrap();
        assert_eq!(plain.create_masq(0o40777), (None, 0o40700));
    }
}
