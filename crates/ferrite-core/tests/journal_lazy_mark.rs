//! Lazy journal marks (docs/CONSISTENCY.md, step 6): on a pool one process uses, a
//! namespace operation stores its journal's "inactive" mark without flushing it, and
//! the mark reaches media before anything that could let a journaled word come back
//! to its old value is freed: fast GC of a log page, the free of an inode, a clean
//! unmount.

mod common;

use common::*;
use ferrite_core::sim::SimMedium;
use ferrite_core::*;

const MB: u64 = 1 << 20;

/// The journal state words of every shard (primary copies): in the cache, and on
/// media.
fn marks(fs: &Fs<SimMedium>) -> Vec<(u64, u64)> {
    let g = fs.geometry();
    let durable = fs.medium().durable_image();
    (0..g.nshards)
        .map(|s| {
            let off = g.journal_offs(s)[0].expect("primary journal");
            let d = u64::from_le_bytes(durable[off as usize..][..8].try_into().unwrap());
            (fs.medium().load_u64(off), d)
        })
        .collect()
}

/// The shard whose journal the operations so far used (txid > 0).
fn used(fs: &Fs<SimMedium>) -> (u64, u64) {
    let m = marks(fs);
    let used: Vec<_> = m.iter().copied().filter(|&(c, _)| c >> 1 > 0).collect();
    assert_eq!(used.len(), 1, "one thread used one shard: {m:?}");
    used[0]
}

#[test]
fn a_namespace_operation_leaves_its_mark_in_the_cache_with_two_fences() {
    let fs = fresh_sim(64 * MB, 2);
    let n = fences(&fs, || {
        fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap();
    });
    assert_eq!(n, 2, "a create takes two fences");
    let (cached, durable) = used(&fs);
    assert_eq!(cached & 1, 0, "the mark is stored: {cached:#x}");
    assert_eq!(durable, cached | 1, "and not on media: the transaction is active there");
    // An unlink that frees the inode: its own shard's header is rewritten by its
    // begin, and its mark is lazy too (the freed slot's words are not in its records).
    let n = fences(&fs, || fs.unlink(fs.root(), b"f").unwrap());
    assert_eq!(n, 2, "an unlink takes two fences");
    let (cached, durable) = used(&fs);
    assert_eq!((cached & 1, durable & 1), (0, 1), "lazy after the unlink too");
    assert_eq!(cached >> 1, 2, "the unlink was the shard's second transaction");
    // A clean unmount puts every mark on media.
    let m = fs.unmount().unwrap();
    let fs = Fs::mount(m, &MountOptions::default()).unwrap();
    for (cached, durable) in marks(&fs) {
        assert_eq!(cached, durable, "after a clean unmount the media agree");
        assert_eq!(durable & 1, 0, "no journal left active");
    }
    assert_fsck_clean(&fs, "after remount");
}

/// Overwrites of one page kill every WRITE entry but the last, and a chmod kills
/// the SETATTRs of the first log page: fast GC frees that page, which the same log
/// may take again. The link's mark must be on media by then.
fn link_then_free_a_log_page(fs: &Fs<SimMedium>) {
    let g = fs.create(fs.root(), b"g", 0o644, 0, 0).unwrap().ino;
    fs.link(g, fs.root(), b"h").unwrap();
    let (_, durable) = used(fs);
    assert_eq!(durable & 1, 1, "the link's mark is lazy");
    let before = fs.gc_stats().fast_pages.load(std::sync::atomic::Ordering::Relaxed);
    for i in 0..100u8 {
        fs.write(g, 0, &[i; 4096]).unwrap();
    }
    fs.setattr(g, &SetAttr { perm: Some(0o600), ..Default::default() }).unwrap();
    let after = fs.gc_stats().fast_pages.load(std::sync::atomic::Ordering::Relaxed);
    assert!(after > before, "fast GC freed a log page");
}

#[test]
fn fast_gc_settles_the_mark_before_it_frees_a_log_page() {
    let fs = fresh_sim(64 * MB, 1);
    link_then_free_a_log_page(&fs);
    let (cached, durable) = used(&fs);
    assert_eq!(durable, cached, "the mark is on media once a log page was freed");
    assert_eq!(durable & 1, 0);
}

#[test]
fn without_settling_the_mark_stays_active_on_media() {
    // What the crash simulator's `unsettled-journal-mark` fault breaks, seen here
    // directly: the test above fails without the settle.
    let mut fs = fresh_sim(64 * MB, 1);
    fs.set_core_fault(Some(CoreFault::UnsettledMarks));
    link_then_free_a_log_page(&fs);
    let (cached, durable) = used(&fs);
    assert_eq!((cached & 1, durable & 1), (0, 1), "the link is still active on media");
}

#[test]
fn freeing_an_open_unlinked_inode_settles_the_mark() {
    let fs = fresh_sim(64 * MB, 1);
    let x = fs.create(fs.root(), b"x", 0o644, 0, 0).unwrap().ino;
    fs.open(x).unwrap();
    fs.unlink(fs.root(), b"x").unwrap(); // names x's tail: lazy
    let (_, durable) = used(&fs);
    assert_eq!(durable & 1, 1, "the unlink's mark is lazy");
    fs.release(x).unwrap(); // the last close frees x's slot and log
    let (cached, durable) = used(&fs);
    assert_eq!(durable, cached, "settled before the slot was freed");
}
