//! Regression: a crash during recovery left a finished transaction's slot
//! replicas stale with its journal already idle.
//!
//! Bug (found by the crash simulator's crashes during recovery, workload
//! `random-0`, on the first version of the metadata replicas): a finished
//! transaction's words can reach media without their replicas (both are stored in
//! the apply's fence window). `journal::recover` rewrote those replicas and marked
//! the journal inactive in one fence window; a crash there could keep "inactive"
//! and the stale replicas, and the next recovery, seeing a created inode's slot
//! more than one step from its valid replica, restored the replica: the new name
//! pointed at a free inode. Fix: recovery fences the rewritten replicas before it
//! marks the journal inactive (ferrite-core `journal.rs`).

use ferrite_core::journal::{self, Record};
use ferrite_core::layout::{replica_of, Geometry, InodeSlot, BLOCK};
use ferrite_core::sim::{crash_image, FencePoint, InFlight};
use ferrite_core::{replica, Medium, SimMedium};
use std::sync::{Arc, Mutex};

type Points = Arc<Mutex<Vec<(Vec<u8>, Vec<InFlight>)>>>;

#[test]
fn a_finished_transactions_replicas_are_durable_before_its_journal_is_idle() {
    let g = Geometry::compute(256, 1, 64).unwrap();
    assert!(g.replicas);
    let m = SimMedium::new(256 * BLOCK);
    let (dir, new) = (1u64, 7u64);
    let d = InodeSlot {
        state: 1,
        head: 100 * BLOCK,
        tail: 100 * BLOCK + 64,
        ftype: 2,
        ..Default::default()
    };
    let n = InodeSlot {
        state: 0,
        head: 101 * BLOCK,
        tail: 101 * BLOCK + 96,
        ftype: 1,
        ..Default::default()
    };
    for (ino, s) in [(dir, d), (new, n)] {
        m.write(g.slot_off(ino), &s.encode());
        m.flush(g.slot_off(ino), 64);
    }
    replica::sync_slot(&m, &g, dir);
    m.fence();
    // A create: the new inode's state 0 -> 1 and the directory's tail, journaled;
    // the words reach media, their replicas do not, the journal stays active.
    let recs = [
        Record { addr: g.slot_off(new), old: 0, new: 1 },
        Record { addr: g.slot_off(dir) + 16, old: d.tail, new: d.tail + 56 },
    ];
    journal::begin(&m, &g, 0, 3, &recs);
    m.fence();
    for r in &recs {
        m.store_u64(r.addr, r.new);
        m.flush(r.addr, 8);
    }
    m.fence();
    let finished = m.durable_image();

    let r = SimMedium::from_image(finished);
    let pts: Points = Arc::default();
    let p2 = pts.clone();
    r.set_fence_hook(Some(Box::new(move |p: &FencePoint<'_>| {
        p2.lock().unwrap().push((p.durable.to_vec(), p.in_flight.to_vec()));
    })));
    assert_eq!(journal::recover(&r, &g, 0).unwrap(), journal::JournalOutcome::Finished);
    r.fence();
    let pts = pts.lock().unwrap();
    let mut checked = 0;
    for (durable, inf) in pts.iter() {
        assert!(inf.len() <= 16, "few words in flight during recovery");
        for mask in 0u64..1 << inf.len() {
            let chosen = inf.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, f)| f);
            let img = SimMedium::from_image(crash_image(durable, chosen));
            let (_, active, _) = journal::read(&img, &g, 0);
            if active {
                continue; // the next recovery recovers the transaction again
            }
            for ino in [dir, new] {
                let want = replica_of(&replica::read_primary(&img, &g, ino));
                let have = replica::read_replica(&img, &g, ino).unwrap();
                assert_eq!(
                    have, want,
                    "inode {ino}: journal idle, replica stale (subset {mask:#b})"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 1, "some crash states had the journal idle");
}
