//! What writes, truncates and chowns take away (`ferrite_core::privs`), as Linux's
//! `file_remove_privs`: set-user-id, and set-group-id where group-executable, when
//! the writer lacks CAP_FSETID (asked only of a file with such a bit); a
//! `security.capability` attribute always. The removal is committed with the write:
//! at every crash point the file is wholly before (bits and old data) or wholly after.

mod common;

use common::*;
use ferrite_core::privs::SECURITY_CAPABILITY;
use ferrite_core::*;
use std::cell::Cell;

const MB: u64 = 1 << 20;

fn file(fs: &Fs<SimMedium>, name: &[u8], perm: u32) -> u64 {
    let ino = fs.create(fs.root(), name, 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, b"0123456789").unwrap();
    fs.setattr(ino, &SetAttr { perm: Some(perm), ..Default::default() }).unwrap();
    ino
}

fn perm(fs: &Fs<SimMedium>, ino: u64) -> u32 {
    fs.getattr(ino).unwrap().perm
}

#[test]
fn writes_clear_set_id_bits_only_for_writers_without_cap_fsetid() {
    let mut fs = fresh_sim(16 * MB, 1);
    let cases = [
        (0o4755, 0o755),
        (0o2755, 0o755),
        (0o6775, 0o775),
        // Set-group-id without group execute (mandatory locking) stays.
        (0o2745, 0o2745),
        (0o6745, 0o2745),
        (0o1777, 0o1777),
    ];
    let mut inos = Vec::new();
    for (k, &(before, after)) in cases.iter().enumerate() {
        let f = file(&fs, format!("f{k}").as_bytes(), before);
        // A privileged writer (Fs::write) keeps every bit.
        fs.write(f, 0, b"x").unwrap();
        assert_eq!(perm(&fs, f), before, "{before:o}: kept by a privileged write");
        fs.write_as(f, 3, b"yy", || true).unwrap();
        assert_eq!(perm(&fs, f), after, "{before:o}: after an unprivileged write");
        assert_eq!(fs.read_all(f).unwrap(), b"x12yy56789");
        inos.push((f, after));
    }
    // Appends as well.
    let f = file(&fs, b"app", 0o4711);
    fs.append_as(f, b"!", || true).unwrap();
    assert_eq!(perm(&fs, f), 0o711);
    inos.push((f, 0o711));
    // Durable: the same after a power loss.
    fs = remount(fs, Remount::CrashDurable);
    for (f, after) in inos {
        assert_eq!(perm(&fs, f), after, "after recovery");
    }
}

#[test]
fn the_capability_question_is_asked_only_of_files_with_set_id_bits() {
    let fs = fresh_sim(16 * MB, 1);
    let asked = Cell::new(0);
    let plain = file(&fs, b"plain", 0o755);
    let sgid_nox = file(&fs, b"nox", 0o2644);
    for f in [plain, sgid_nox] {
        fs.write_as(f, 0, b"a", || {
            asked.set(asked.get() + 1);
            true
        })
        .unwrap();
    }
    assert_eq!(asked.get(), 0, "no bit to clear, no question");
    let suid = file(&fs, b"suid", 0o4755);
    fs.write_as(suid, 0, b"a", || {
        asked.set(asked.get() + 1);
        false
    })
    .unwrap();
    assert_eq!(asked.get(), 1);
    assert_eq!(perm(&fs, suid), 0o4755, "the writer has CAP_FSETID");
}

#[test]
fn truncate_clears_set_id_bits_when_asked_and_chown_always() {
    let fs = fresh_sim(16 * MB, 1);
    let f = file(&fs, b"t", 0o6755);
    fs.setattr(f, &SetAttr { size: Some(4), ..Default::default() }).unwrap();
    assert_eq!(perm(&fs, f), 0o6755, "a truncate by a CAP_FSETID caller");
    let ch = SetAttr { size: Some(2), ..Default::default() };
    fs.setattr_as(f, &ch, || true).unwrap();
    assert_eq!(perm(&fs, f), 0o755);
    assert_eq!(fs.getattr(f).unwrap().size, 2);
    let plain = file(&fs, b"p", 0o755);
    let ch = SetAttr { size: Some(1), ..Default::default() };
    fs.setattr_as(plain, &ch, || panic!("not asked without a bit")).unwrap();
    // An explicit mode wins over the clearing (chmod and truncate in one setattr).
    let g = file(&fs, b"g", 0o4755);
    let ch = SetAttr { size: Some(0), perm: Some(0o4700), ..Default::default() };
    fs.setattr_as(g, &ch, || panic!("not asked with a mode")).unwrap();
    assert_eq!(perm(&fs, g), 0o4700);
    // An empty change is chown(-1, -1): it clears for a caller that says so.
    fs.setattr_as(g, &SetAttr::default(), || true).unwrap();
    assert_eq!(perm(&fs, g), 0o700);
    // chown clears both (group-executable) for any caller.
    fs.setattr(g, &SetAttr { perm: Some(0o6750), ..Default::default() }).unwrap();
    fs.setattr(g, &SetAttr { uid: Some(5), ..Default::default() }).unwrap();
    assert_eq!(perm(&fs, g), 0o750);
}

#[test]
fn file_capabilities_go_on_write_truncate_and_chown() {
    let fs = fresh_sim(16 * MB, 1);
    let cap = [1u8, 0, 0, 2, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let has = |f: u64| fs.getxattr(f, SECURITY_CAPABILITY).is_ok();
    let steps: [(&str, &dyn Fn(u64)); 4] = [
        ("write", &|f| assert_eq!(fs.write(f, 0, b"z").unwrap(), 1)),
        ("append", &|f| assert!(fs.append(f, b"z").unwrap() > 0)),
        ("truncate", &|f| {
            fs.setattr(f, &SetAttr { size: Some(1), ..Default::default() }).unwrap();
        }),
        ("chown", &|f| {
            fs.setattr(f, &SetAttr { gid: Some(9), ..Default::default() }).unwrap();
        }),
    ];
    for (k, (what, step)) in steps.iter().enumerate() {
        let f = file(&fs, format!("c{k}").as_bytes(), 0o755);
        fs.setxattr(f, SECURITY_CAPABILITY, &cap, XattrSet::Any).unwrap();
        fs.setxattr(f, b"user.keep", b"v", XattrSet::Any).unwrap();
        // A chmod, a read or a touch keeps them.
        fs.setattr(f, &SetAttr { perm: Some(0o750), ..Default::default() }).unwrap();
        assert!(has(f), "{what}: kept by chmod");
        step(f);
        assert!(!has(f), "{what}: capability removed");
        assert_eq!(fs.getxattr(f, b"user.keep").unwrap(), b"v", "{what}: others stay");
    }
    // A directory's chown keeps its attributes (no file capabilities on directories
    // in Linux's sense, and chown of a directory clears nothing).
    let d = fs.mkdir(fs.root(), b"d", 0o2755, 0, 0).unwrap().ino;
    fs.setattr(d, &SetAttr { uid: Some(3), ..Default::default() }).unwrap();
    assert_eq!(perm(&fs, d), 0o2755);
    assert_fsck_clean(&fs, "after the capability removals");
}

#[test]
fn a_write_that_clears_bits_is_one_operation_at_every_crash_point() {
    let fs = fresh_sim(16 * MB, 1);
    let f = file(&fs, b"f", 0o6755);
    let cap = [1u8, 0, 0, 2, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    fs.setxattr(f, SECURITY_CAPABILITY, &cap, XattrSet::Any).unwrap();
    let old = fs.read_all(f).unwrap();
    let data = Rng(4).bytes(3 * 4096 + 100);
    let (r, points) = record_fences(&fs, || fs.write_as(f, 50, &data, || true));
    r.unwrap();
    let mut new = old.clone();
    new.resize(50 + data.len(), 0);
    new[50..].copy_from_slice(&data);
    assert!(fs.read_all(f).unwrap() == new);
    assert_eq!(points.len(), 1, "one fence for the write and what it clears");
    let mut seen = std::collections::BTreeSet::new();
    for_each_crash_image(&points, 60, 6, |k, c| {
        let got = c.read_all(f).unwrap();
        let (p, cap_kept) = (c.getattr(f).unwrap().perm, c.getxattr(f, SECURITY_CAPABILITY));
        if got == old {
            assert_eq!((p, cap_kept.is_ok()), (0o6755, true), "crash {k}: before");
        } else {
            assert!(got == new, "crash {k}: neither before nor after");
            assert_eq!((p, cap_kept.is_ok()), (0o755, false), "crash {k}: after");
        }
        seen.insert(got == new);
        assert_fsck_clean(&c, "after a crash inside a privilege-clearing write");
    });
    assert_eq!(seen.len(), 2, "both outcomes reached");
}

#[test]
fn fallocate_clears_like_a_write() {
    let fs = fresh_sim(16 * MB, 1);
    let keep = FallocMode {
        keep_size: false,
        punch_hole: false,
        zero_range: false,
        shift: None,
        unshare: false,
    };
    let f = file(&fs, b"f", 0o6755);
    fs.fallocate(f, keep, 0, 8192).unwrap();
    assert_eq!(perm(&fs, f), 0o6755, "a caller with CAP_FSETID");
    fs.fallocate_as(f, keep, 0, 16_384, || true).unwrap();
    assert_eq!(perm(&fs, f), 0o755);
    assert_eq!(fs.getattr(f).unwrap().size, 16_384);
    // An invalid call changes nothing.
    let g = file(&fs, b"g", 0o4755);
    assert!(fs.fallocate_as(g, keep, 0, 0, || true).is_err());
    assert_eq!(perm(&fs, g), 0o4755);
}

/// What a process makes without the kernel (`Fs::setattr_owned`,
/// `Fs::set_mode_acl_owned`, the preload library's fchmod / fchown / futimens /
/// fsetxattr of a mode-only ACL): the owner's own changes, judged under the lock
/// against the attributes there; anything else is `None` and changes nothing.
#[test]
fn an_owners_changes_are_made_and_the_rest_left_to_the_kernel() {
    use ferrite_core::privs::Caller;
    let mut fs = fresh_sim(16 * MB, 1);
    let ino = fs.create(fs.root(), b"o", 0o644, 1000, 100).unwrap().ino;
    let me = Caller { uid: 1000, gid: 100 };
    let ch = |perm, uid, gid| SetAttr { perm, uid, gid, ..Default::default() };
    let t = Ts { sec: 77, nsec: 9 };
    let times = SetAttr { mtime: Some(SetTime::At(t)), ..Default::default() };
    let a = fs.setattr_owned(ino, &times, me, || true).unwrap().expect("the owner's");
    assert_eq!(a.mtime, t);
    let a = fs.setattr_owned(ino, &ch(Some(0o2750), Some(1000), None), me, || true).unwrap();
    assert_eq!(a.expect("the owner's").perm, 0o2750);
    // Another caller, another owner, a foreign group: nothing changes.
    let other = Caller { uid: 0, gid: 0 };
    assert!(fs.setattr_owned(ino, &ch(Some(0o600), None, None), other, || true).unwrap().is_none());
    assert!(fs.setattr_owned(ino, &ch(None, Some(0), None), me, || true).unwrap().is_none());
    assert!(fs.setattr_owned(ino, &ch(None, None, Some(5)), me, || true).unwrap().is_none());
    assert_eq!(perm(&fs, ino), 0o2750);
    // A mode-only ACL (user rw-, group r--, other ---) is a chmod that keeps
    // set-group-id; one with a named user is the kernel's.
    let acl = |e: &[(u16, u16, u32)]| {
        e.iter().fold(2u32.to_le_bytes().to_vec(), |mut v, &(tag, p, id)| {
            v.extend(tag.to_le_bytes());
            v.extend(p.to_le_bytes());
            v.extend(id.to_le_bytes());
            v
        })
    };
    let m = u32::MAX;
    let mode_only = acl(&[(1, 6, m), (4, 4, m), (0x20, 0, m)]);
    assert!(fs.set_mode_acl_owned(ino, &mode_only, me).unwrap().is_some());
    assert_eq!(perm(&fs, ino), 0o2640);
    assert!(fs.getxattr(ino, ferrite_core::acl::ACCESS).is_err(), "not stored");
    assert!(fs.set_mode_acl_owned(ino, &mode_only, other).unwrap().is_none());
    let named = acl(&[(1, 6, m), (2, 6, 7), (4, 4, m), (0x10, 6, m), (0x20, 0, m)]);
    assert!(fs.set_mode_acl_owned(ino, &named, me).unwrap().is_none());
    // With an access ACL stored, a chmod is the kernel's (it caches the ACL).
    fs.setxattr(ino, ferrite_core::acl::ACCESS, &named, XattrSet::Any).unwrap();
    assert!(fs.setattr_owned(ino, &ch(Some(0o600), None, None), me, || true).unwrap().is_none());
    assert!(fs.setattr_owned(ino, &times, me, || true).unwrap().is_some());
    fs = remount(fs, Remount::CrashDurable);
    let a = fs.getattr(ino).unwrap();
    assert_eq!((a.perm, a.mtime, a.uid, a.gid), (0o2660, t, 1000, 100), "after recovery");
}
