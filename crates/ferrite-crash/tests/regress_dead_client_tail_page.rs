//! Bug (found by `client-death`): when the daemon resolved a dead client, it left
//! the entries the client had written past its committed tail (an operation it
//! never committed) in the tail page. They carry the next sequence numbers of the
//! same inode incarnation, so they validate. The daemon's next commit writes its
//! entries over them in the same fence window as its tail: a crash with the tail
//! durable and the daemon's entries not let recovery read the dead client's
//! entries as committed (a fallocate that never returned came back, 24 KiB).
//! Fix: resolution zeroes the rest of the tail page past the committed tail
//! (`sharing.rs`, `adopt_inode`), before the daemon commits anything to the file.
//!
//! The test kills a client at every medium step of an embedded append and of a
//! fallocate, lets the daemon resolve it and append, and checks every crash state;
//! with the fix disabled (the `tail-before-other-data` fault skips it) states fail.

use ferrite_core::CoreFault;
use ferrite_crash::clients::{client_workload, Step};
use ferrite_crash::drive::Fault;
use ferrite_crash::explore::{run_suite, Config};
use ferrite_crash::model::Op;

fn death(at: u64, dying: Op) -> ferrite_crash::workloads::Workload {
    let create = |p: &str| Step::Op(0, Op::Create { path: p.into(), perm: 0o644 });
    let append =
        |who: u32, len: u64, pat: u8| Step::Op(who, Op::Append { path: "/e".into(), len, pat });
    client_workload(
        &format!("dead-client-{at}"),
        1,
        false,
        1,
        vec![
            vec![create("/e")],
            vec![append(0, 500, 1)],
            vec![Step::Attach(1)],
            vec![append(1, 900, 2)],
            vec![Step::Die(1, dying, at)],
            vec![Step::Resolve(1)],
            vec![append(0, 40, 3)],
            vec![append(0, 10, 4)],
        ],
    )
}

fn workloads() -> Vec<ferrite_crash::workloads::Workload> {
    let mut v = Vec::new();
    for at in 1..=6 {
        v.push(death(at, Op::Append { path: "/e".into(), len: 150, pat: 9 }));
    }
    for at in 1..=8 {
        let f = Op::Fallocate { path: "/e".into(), off: 16384, len: 8192, keep_size: false };
        v.push(death(at, f));
    }
    v
}

#[test]
fn a_dead_clients_uncommitted_entries_never_come_back() {
    let cfg = Config { states: 6000, ..Config::default() };
    let rep = run_suite(&workloads(), &cfg, None, &mut |_| {});
    for w in &rep.workloads {
        assert!(w.functional.is_none(), "{}: {:?}", w.name, w.functional);
        if let Some(f) = w.tally.failures.first() {
            panic!("{}: {}\n  replay: {}", w.name, f.message, f.replay_spec());
        }
    }
    assert!(rep.states() > 3000);
}

#[test]
fn without_the_fix_a_crash_state_fails() {
    let cfg = Config { states: 6000, ..Config::default() };
    let fault = Some(Fault::Core(CoreFault::AdoptUnflushed));
    let rep = run_suite(&workloads(), &cfg, fault, &mut |_| {});
    assert!(rep.failures() > 0, "the test cannot fail: no state failed without the fix");
}
