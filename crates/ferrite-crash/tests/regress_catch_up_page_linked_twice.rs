//! Bug (found reviewing the log chain walk for issue 14): a party catching its DRAM
//! index up with entries another party appended (`Fs::catch_up`) linked the pages
//! it walked into its chain with `LogPages::extend`, whose only guard against a
//! page linked twice was a debug assertion. A corrupt next pointer leading back into
//! the chain (to a page holding validly sealed entries) panicked the party in debug
//! builds and silently corrupted its chain in release builds. Fix: the catch-up
//! links through `LogPages::try_extend`, which refuses a page already linked, and
//! returns a corrupt-log error (`chain.rs`, `sharing.rs`).
//!
//! The test lets the daemon fill a file's first log page and spill into a second,
//! lets a client catch up, then forges an append at the tail whose page switch
//! leads back to the first page (validly sealed), and asks the client to read.

use ferrite_core::layout::{logptr, SLOT_STATE, SLOT_TAIL};
use ferrite_core::log::{self, EntryBuf, LogState};
use ferrite_core::share::HeapRegion;
use ferrite_core::{DaemonGrants, Error, Fs, Medium, MkfsOptions, Party, SimMedium, Table, Ts};
use std::sync::Arc;

type Med = Arc<SimMedium>;

#[test]
fn a_page_linked_back_into_the_chain_is_a_corrupt_log_not_a_panic() {
    let m: Med = Arc::new(SimMedium::new(4 << 20));
    let fs = Fs::mkfs(m.clone(), &MkfsOptions { shards: 1, ..Default::default() }).unwrap();
    let (ni, nb) = (fs.geometry().ninodes, fs.geometry().nblocks);
    let t = Table::create(Box::new(HeapRegion::new(ni, nb)), ni, nb, &fs.superblock().uuid);
    t.alive_word().store(1, std::sync::atomic::Ordering::Release);
    let table = Arc::new(t);
    let d = Arc::new(fs.share_with(Arc::new(Party::daemon(table.clone()))));
    let ino = d.create(d.root(), b"f", 0o644, 0, 0).unwrap().ino;
    // Embedded writes fill the first log page and spill into a second.
    for i in 0..40u64 {
        d.write(ino, i * 100, &[i as u8 + 1; 100]).unwrap();
    }
    let pid = table.claim_party(4242).unwrap();
    let c = Fs::attach(
        m.clone(),
        Arc::new(Party::client(
            table.clone(),
            pid,
            Arc::new(DaemonGrants { daemon: d.clone(), party: pid, cap: 64 }),
        )),
    )
    .unwrap();
    let mut buf = [0u8; 100];
    c.read(ino, 0, &mut buf).unwrap(); // the client's index is now current
    assert_eq!(buf, [1u8; 100]);
    // Forge what a corrupt log could hold: an append at the tail whose page switch
    // leads back to the first page, validly sealed, and a tail after it.
    let geo = *d.geometry();
    let slot = geo.slot_off(ino);
    let (state, tail) = (m.load_u64(slot + SLOT_STATE), m.load_u64(slot + SLOT_TAIL));
    let head = m.load_u64(slot + 8);
    let seed = log::seed(&d.superblock().uuid, ino, state);
    let w = log::walk(&*m, &geo, seed, logptr::addr(head), logptr::addr(tail)).unwrap();
    assert!(w.pages.len() >= 2, "the log spans two pages: {:?}", w.pages);
    let first = w.pages[0];
    assert_ne!(logptr::addr(tail) & !4095, first, "the tail is past the first page");
    let st = LogState { head, tail, next_seq: w.next_seq, pages: Default::default() };
    let mut es = [EntryBuf::inline(0, 4000, Ts::default(), &[9u8; 3900])];
    let a =
        log::append(&*m, &st, seed, &mut es, &mut || Ok(first), &mut log::Pages::new()).unwrap();
    m.store_u64(slot + SLOT_TAIL, a.new_tail);
    // The daemon walks from the head: a cycle, an error.
    // The client catches up from its tail: the first page again, an error too.
    match c.read(ino, 0, &mut buf) {
        Err(Error::Corrupt(msg)) => assert!(msg.contains("twice"), "{msg}"),
        other => panic!("expected a corrupt-log error, got {other:?}"),
    }
}
