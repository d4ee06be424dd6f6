//! The direct-client workloads: every crash state of every party's fences passes,
//! parties really interleave inside operations, clients die inside their
//! operations, a run is a function of its seed, and a fence dropped on a client's thread only is
//! detected.

use ferrite_crash::drive::Fault;
use ferrite_crash::explore::{self, run_suite, Config};
use ferrite_crash::workloads;

const CLIENTS: &str = "client-handover,client-death,client-revoke,client-gc,client-parallel";

#[test]
fn client_workloads_pass_and_interleave() {
    let ws = workloads::select(CLIENTS, 1).unwrap();
    assert_eq!(ws.len(), 5);
    for w in &ws {
        let d = explore::survey(w, None).unwrap_or_else(|f| panic!("{}: {}", w.name, f.message));
        let fences: Vec<u64> = d.thread_fences.clone();
        assert!(fences[0] > 0, "{}: the daemon fenced", w.name);
        assert!(fences[1..].iter().any(|&n| n > 0), "{}: a client fenced: {fences:?}", w.name);
        if w.name == "client-parallel" || w.name == "client-gc" {
            assert!(d.switches > 10, "{}: parties switch inside operations", w.name);
        }
    }
    let cfg = Config { states: 6000, ..Config::default() };
    let rep = run_suite(&ws, &cfg, None, &mut |_| {});
    for w in &rep.workloads {
        assert!(w.functional.is_none(), "{}: {:?}", w.name, w.functional);
        if let Some(f) = w.tally.failures.first() {
            panic!("{}: {}\n  replay: {}", w.name, f.message, f.replay_spec());
        }
        assert!(w.tally.states > 100, "{}: {} states", w.name, w.tally.states);
    }
}

#[test]
fn a_client_run_is_a_function_of_its_seed() {
    let w = &workloads::select("client-parallel", 1).unwrap()[0];
    let a = explore::survey(w, None).unwrap();
    let b = explore::survey(w, None).unwrap();
    let key = |d: &ferrite_crash::drive::Driven| {
        d.survey.iter().map(|p| (p.fence, p.op, p.words)).collect::<Vec<_>>()
    };
    assert_eq!(key(&a), key(&b));
    assert_eq!(a.switches, b.switches);
    let w2 = &workloads::select("client-parallel", 2).unwrap()[0];
    let c = explore::survey(w2, None).unwrap();
    assert_ne!(key(&a), key(&c), "another seed, another interleaving");
}

#[test]
fn every_dying_client_dies_inside_its_operation() {
    for seed in 1..=10 {
        let w = &workloads::select("client-death", seed).unwrap()[0];
        let d = explore::survey(w, None).unwrap();
        assert_eq!(d.deaths, 4, "seed {seed}: {}", w.about);
    }
}

#[test]
fn a_fence_dropped_on_a_clients_thread_is_detected() {
    let ws = workloads::select("client-parallel", 1).unwrap();
    let d = explore::survey(&ws[0], None).unwrap();
    let cfg = Config { states: 400, stop_on_failure: true, ..Config::default() };
    let mut detected = 0;
    for t in 2..=3u32 {
        let n = d.thread_fences[t as usize - 1];
        for k in (0..n).step_by(3) {
            let f = Some(Fault::SkipThreadFence(t, k));
            let sv = match explore::survey(&ws[0], f) {
                Ok(s) => s,
                Err(_) => {
                    detected += 1;
                    continue;
                }
            };
            let r = explore::explore_workload(&ws[0], &sv.survey, cfg.states, &cfg, f);
            detected += (r.tally.failure_count > 0 || r.functional.is_some()) as usize;
        }
    }
    assert!(detected > 0, "no dropped client fence was detected");
}
