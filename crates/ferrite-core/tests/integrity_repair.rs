//! `Fs::repair` (what `ferrite fsck --repair` runs): link counts set to the links
//! found and orphans adopted by /lost+found, after a lost update of a directory's
//! log (its tail put back to an earlier commit); a second repair finds nothing.

mod common;

use common::*;
use ferrite_core::integrity::check_pool;
use ferrite_core::*;

/// Run `f`, then put the root's log tail back to where it was before it.
fn lose_root_update(fs: Fs<SimMedium>, f: impl FnOnce(&Fs<SimMedium>)) -> SimMedium {
    let geo = *fs.geometry();
    let old = fs.medium().load_u64(geo.slot_off(1) + 16);
    f(&fs);
    let m = fs.unmount().unwrap();
    set_slot_word(&m, &geo, 1, 16, old);
    m
}

fn repair_until_clean(m: SimMedium) -> (Vec<String>, SimMedium) {
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    let done = fs.repair().unwrap();
    assert_fsck_clean(&fs, "after repair");
    let m = fs.unmount().unwrap();
    let (rep, m) = check_pool(m, &mut |_, _| {});
    assert!(rep.is_clean(), "{:#?}", rep.findings);
    let fs = Fs::mount(m.unwrap(), &MountOptions::default()).unwrap();
    assert!(fs.repair().unwrap().is_empty(), "a second repair does nothing");
    (done, fs.unmount().unwrap())
}

#[test]
fn a_link_count_too_high_is_set_to_the_links_found() {
    let fs = fresh_sim(8 << 20, 1);
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(f, 0, b"kept").unwrap();
    let m = lose_root_update(fs, |fs| {
        fs.link(f, fs.root(), b"g").unwrap();
    });
    let (rep, m) = check_pool(m, &mut |_, _| {});
    assert!(rep.findings.iter().any(|x| x.what.contains("link count")), "{:#?}", rep.findings);
    let (done, m) = repair_until_clean(m.unwrap());
    assert!(done.iter().any(|d| d.contains("link count set to 1")), "{done:?}");
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().nlink, 1);
    let mut b = [0u8; 4];
    fs.read(f, 0, &mut b).unwrap();
    assert_eq!(&b, b"kept");
}

#[test]
fn orphans_are_adopted_by_lost_and_found() {
    let fs = fresh_sim(8 << 20, 1);
    let mut inos = (0, 0);
    let m = lose_root_update(fs, |fs| {
        let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
        let x = fs.create(d, b"x", 0o644, 0, 0).unwrap().ino;
        fs.write(x, 0, b"inside").unwrap();
        let s = fs.symlink(fs.root(), b"s", b"d/x", 0, 0).unwrap().ino;
        inos = (d, s);
    });
    let (d, s) = inos;
    let (rep, m) = check_pool(m, &mut |_, _| {});
    assert!(rep.findings.iter().any(|x| x.what.contains("unreachable")), "{:#?}", rep.findings);
    let (done, m) = repair_until_clean(m.unwrap());
    assert_eq!(done.iter().filter(|d| d.contains("/lost+found/#")).count(), 2, "{done:?}");
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    let x = fs.resolve(format!("/lost+found/#{d}/x").as_bytes(), false).unwrap();
    let mut b = [0u8; 6];
    fs.read(x, 0, &mut b).unwrap();
    assert_eq!(&b, b"inside");
    assert_eq!(
        fs.lookup_ino(fs.resolve(format!("/lost+found/#{d}").as_bytes(), false).unwrap(), b"..")
            .unwrap(),
        fs.resolve(b"/lost+found", false).unwrap()
    );
    assert_eq!(
        fs.readlink(fs.resolve(format!("/lost+found/#{s}").as_bytes(), false).unwrap()).unwrap(),
        b"d/x"
    );
}
