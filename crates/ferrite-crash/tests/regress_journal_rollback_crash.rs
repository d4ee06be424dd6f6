//! Regression: a crash during the journal rollback of recovery lost the rollback.
//!
//! Bug (found by the crash simulator's crashes during recovery, workloads `random-*`
//! and `rename`): `journal::recover` set every applied word back to its old value and
//! marked the journal inactive in the same fence window. A crash in that window can
//! persist "inactive" without the rolled-back words; the next recovery then finds an
//! idle journal and a half-applied multi-inode operation (a name pointing at a free
//! inode, an unreachable inode, a wrong link count). Fix: recovery fences the
//! rollback before it marks the journal inactive (ferrite-core `journal.rs`).

use ferrite_core::journal::{self, Record};
use ferrite_core::layout::{Geometry, BLOCK};
use ferrite_core::sim::{crash_image, FencePoint, InFlight};
use ferrite_core::{Medium, SimMedium};
use std::sync::{Arc, Mutex};

type Points = Arc<Mutex<Vec<(Vec<u8>, Vec<InFlight>)>>>;

fn hook(m: &SimMedium) -> Points {
    let pts: Points = Arc::default();
    let p2 = pts.clone();
    m.set_fence_hook(Some(Box::new(move |p: &FencePoint<'_>| {
        p2.lock().unwrap().push((p.durable.to_vec(), p.in_flight.to_vec()));
    })));
    pts
}

#[test]
fn crash_during_rollback_still_rolls_back() {
    let g = Geometry::compute(256, 1, 64).unwrap();
    let m = SimMedium::new(256 * BLOCK);
    let (a, b, c) = (g.slot_off(1) + 16, g.slot_off(2) + 16, g.slot_off(3));
    for (w, v) in [(a, 10), (b, 20), (c, 30)] {
        m.store_u64(w, v);
        m.flush(w, 8);
    }
    m.fence();
    let recs = [
        Record { addr: a, old: 10, new: 11 },
        Record { addr: b, old: 20, new: 21 },
        Record { addr: c, old: 30, new: 31 },
    ];
    journal::begin(&m, &g, 0, 7, &recs);
    m.fence();
    // Crash after two of the three words were applied.
    for (w, v) in [(a, 11), (b, 21)] {
        m.store_u64(w, v);
        m.flush(w, 8);
    }
    m.fence();
    let half = m.durable_image();
    // Recover, watching every fence of the recovery.
    let r = SimMedium::from_image(half);
    let pts = hook(&r);
    assert_eq!(journal::recover(&r, &g, 0).unwrap(), journal::JournalOutcome::RolledBack);
    r.fence();
    let pts = pts.lock().unwrap();
    assert!(!pts.is_empty());
    let mut checked = 0;
    for (durable, inf) in pts.iter() {
        assert!(inf.len() <= 12, "few words in flight during a rollback");
        for mask in 0u64..1 << inf.len() {
            let chosen = inf.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, f)| f);
            let img = SimMedium::from_image(crash_image(durable, chosen));
            journal::recover(&img, &g, 0).unwrap();
            let got = (img.load_u64(a), img.load_u64(b), img.load_u64(c));
            assert_eq!(got, (10, 20, 30), "crash during rollback (subset {mask:#b}) left {got:?}");
            checked += 1;
        }
    }
    assert!(checked >= 4);
}
