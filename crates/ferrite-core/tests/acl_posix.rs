//! POSIX ACLs in the core (every front end gets them): an access ACL sets the mode
//! and is stored only when it says more than the mode, chmod rewrites it in the same
//! commit, a default ACL is inherited by what is made in its directory (replacing the
//! umask), bad values are EINVAL, a default ACL on a file is EACCES, and all of it
//! survives a crash at any fence as one operation.

mod common;

use common::*;
use ferrite_core::*;

const MB: u64 = 1 << 20;
const ACCESS: &[u8] = b"system.posix_acl_access";
const DEFAULT: &[u8] = b"system.posix_acl_default";

/// The xattr form of `(tag, perm, id)` entries.
fn acl(es: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(t, p, i) in es {
        v.extend_from_slice(&t.to_le_bytes());
        v.extend_from_slice(&p.to_le_bytes());
        v.extend_from_slice(&i.to_le_bytes());
    }
    v
}

const U: u32 = u32::MAX;

fn named(user_perm: u16, mask: u16) -> Vec<u8> {
    acl(&[(1, 6, U), (2, user_perm, 1000), (4, 4, U), (0x10, mask, U), (0x20, 0, U)])
}

#[test]
fn an_access_acl_sets_the_mode_and_chmod_sets_the_acl() {
    let fs = fresh_sim(64 * MB, 2);
    let f = fs.create(fs.root(), b"f", 0o600, 0, 0).unwrap().ino;
    fs.setxattr(f, ACCESS, &named(4, 4), XattrSet::Any).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o640, "group bits from the mask");
    assert_eq!(fs.getxattr(f, ACCESS).unwrap(), named(4, 4));
    fs.setattr(f, &SetAttr { perm: Some(0o670), ..Default::default() }).unwrap();
    assert_eq!(
        fs.getxattr(f, ACCESS).unwrap(),
        acl(&[(1, 6, U), (2, 4, 1000), (4, 4, U), (0x10, 7, U), (0x20, 0, U)])
    );
    // One that says no more than the mode is not stored, and sets the mode.
    fs.setxattr(f, ACCESS, &acl(&[(1, 7, U), (4, 5, U), (0x20, 1, U)]), XattrSet::Any).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o751);
    assert!(matches!(fs.getxattr(f, ACCESS), Err(Error::NoAttr)));
    assert!(fs.listxattr(f).unwrap().is_empty());
    // Bad values; a default ACL on a file.
    for bad in [acl(&[(1, 7, U), (2, 7, 5), (4, 5, U), (0x20, 1, U)]), vec![2, 0, 0, 0, 1]] {
        assert!(matches!(fs.setxattr(f, ACCESS, &bad, XattrSet::Any), Err(Error::Invalid(_))));
    }
    let e = fs.setxattr(f, DEFAULT, &named(7, 7), XattrSet::Any).unwrap_err();
    assert_eq!(e.errno(), libc::EACCES);
    assert_fsck_clean(&fs, "after ACL changes");
}

#[test]
fn a_default_acl_is_inherited_instead_of_the_umask() {
    let fs = fresh_sim(64 * MB, 2);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    let def = acl(&[(1, 7, U), (2, 7, 1000), (4, 5, U), (0x10, 7, U), (0x20, 5, U)]);
    fs.setxattr(d, DEFAULT, &def, XattrSet::Any).unwrap();
    let node = |name: &'static [u8], dir| NewNode { parent: d, name, dir, uid: 0, gid: 0 };
    let f = fs.make_masked(node(b"f", false), 0o666, 0o077).unwrap();
    assert_eq!(f.perm, 0o664, "the umask is ignored; group bits from the masked mask");
    let fa = fs.getxattr(f.ino, ACCESS).unwrap();
    assert_eq!(fa, acl(&[(1, 6, U), (2, 7, 1000), (4, 5, U), (0x10, 6, U), (0x20, 4, U)]));
    assert!(matches!(fs.getxattr(f.ino, DEFAULT), Err(Error::NoAttr)), "files get no default");
    let sub = fs.make_masked(node(b"s", true), 0o777, 0o077).unwrap();
    assert_eq!(sub.perm, 0o775);
    assert_eq!(fs.getxattr(sub.ino, DEFAULT).unwrap(), def, "directories pass it on");
    // Without a default ACL the umask applies.
    let plain = fs.mkdir(fs.root(), b"p", 0o755, 0, 0).unwrap().ino;
    let g = fs
        .make_masked(
            NewNode { parent: plain, name: b"g", dir: false, uid: 0, gid: 0 },
            0o666,
            0o027,
        )
        .unwrap();
    assert_eq!(g.perm, 0o640);
    assert!(fs.listxattr(g.ino).unwrap().is_empty());
    assert_fsck_clean(&fs, "after inheritance");
}

#[test]
fn chmod_with_an_acl_is_one_operation_at_every_crash_point() {
    // Every subset of the words in flight at chmod's fence: the mode and the ACL's
    // mask are both old or both new.
    let fs = fresh_sim(16 * MB, 1);
    let f = fs.create(fs.root(), b"f", 0o600, 0, 0).unwrap().ino;
    fs.setxattr(f, ACCESS, &named(4, 4), XattrSet::Any).unwrap();
    let ch = SetAttr { perm: Some(0o670), ..Default::default() };
    let (r, points) = record_fences(&fs, || fs.setattr(f, &ch));
    r.unwrap();
    assert_eq!(points.len(), 1, "one fence");
    assert!(!points[0].1.is_empty());
    let mask_of = |c: &Fs<SimMedium>| c.getxattr(f, ACCESS).unwrap()[4 + 3 * 8 + 2];
    let mut seen = std::collections::BTreeSet::new();
    for_each_crash_image(&points, 96, 7, |k, c| {
        let state = (c.getattr(f).unwrap().perm, mask_of(&c));
        assert!(state == (0o640, 4) || state == (0o670, 7), "subset {k}: {state:?}");
        seen.insert(state);
    });
    assert_eq!(seen.len(), 2, "both outcomes occur: {seen:?}");
    let c = Fs::mount(SimMedium::from_image(fs.medium().durable_image()), &Default::default());
    let c = c.unwrap();
    assert_eq!((c.getattr(f).unwrap().perm, mask_of(&c)), (0o670, 7), "durable after the fence");
}
