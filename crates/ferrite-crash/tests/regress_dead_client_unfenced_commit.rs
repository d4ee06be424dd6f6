//! Bug (found by `client-death`): a client that died after storing its tail but
//! before its fence left its last operation's entries and copy-on-write data
//! flushed by its own thread and never fenced. The daemon's resolution flushed only
//! the inode slot and the chain's next pointers, so that operation, visible to every
//! party, was not durable: the daemon's next commit to the file could become
//! durable with it missing, and recovery then cut both (the daemon's write, which
//! had returned, was lost). Fix: resolution flushes every page of the log and the
//! data blocks of the last committed operation before its fence (`sharing.rs`,
//! `adopt_inode`); the simulated medium writes a flushed line back whole, so the
//! daemon's flush and fence persist what the dead client flushed.
//!
//! The test kills a client at every medium step of a copy-on-write write, lets the
//! daemon resolve it and write the same file, and checks every crash state; with the
//! data flush disabled (the `tail-before-other-data` fault) states fail.

use ferrite_core::CoreFault;
use ferrite_crash::clients::{client_workload, Step};
use ferrite_crash::drive::Fault;
use ferrite_crash::explore::{run_suite, Config};
use ferrite_crash::model::Op;
use ferrite_crash::workloads::Workload;

fn workloads() -> Vec<Workload> {
    let write = |who: u32, off: u64, len: u64, pat: u8| {
        Step::Op(who, Op::Write { path: "/d".into(), off, len, pat })
    };
    (1..=8)
        .map(|at| {
            client_workload(
                &format!("dead-client-cow-{at}"),
                1,
                false,
                1,
                vec![
                    vec![Step::Op(0, Op::Create { path: "/d".into(), perm: 0o644 })],
                    vec![write(0, 0, 3000, 1)],
                    vec![Step::Attach(1)],
                    vec![write(1, 0, 4096, 2)],
                    vec![Step::Die(
                        1,
                        Op::Write { path: "/d".into(), off: 4096, len: 8192, pat: 3 },
                        at,
                    )],
                    vec![Step::Resolve(1)],
                    vec![write(0, 100, 200, 4)],
                    vec![Step::Op(0, Op::Append { path: "/d".into(), len: 300, pat: 5 })],
                ],
            )
        })
        .collect()
}

#[test]
fn what_a_dead_client_made_visible_is_durable_after_resolution() {
    let cfg = Config { states: 5000, ..Config::default() };
    let rep = run_suite(&workloads(), &cfg, None, &mut |_| {});
    for w in &rep.workloads {
        assert!(w.functional.is_none(), "{}: {:?}", w.name, w.functional);
        if let Some(f) = w.tally.failures.first() {
            panic!("{}: {}\n  replay: {}", w.name, f.message, f.replay_spec());
        }
    }
    assert!(rep.states() > 2500);
}

#[test]
fn without_the_fix_a_crash_state_fails() {
    let cfg = Config { states: 5000, ..Config::default() };
    let fault = Some(Fault::Core(CoreFault::AdoptUnflushed));
    let rep = run_suite(&workloads(), &cfg, fault, &mut |_| {});
    assert!(rep.failures() > 0, "the test cannot fail: no state failed without the fix");
}
