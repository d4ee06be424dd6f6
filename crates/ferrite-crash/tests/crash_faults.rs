//! Proof that the simulator can fail: every injectable fault kind must be detected
//! (at least one scanned variant fails the oracle), and the reproducer it prints must
//! rebuild a failing state.

use ferrite_crash::explore::{self, Config, FAULT_KINDS};
use ferrite_crash::workloads;
use std::io::Write;

/// Workloads, variants and budget per variant for each fault kind.
fn plan(kind: &str) -> (&'static str, usize, u64) {
    match kind {
        "skip-flush" => ("write-pages,namespace", 8, 600),
        "skip-fence" => ("write-pages,rename", 6, 600),
        "skip-thread-fence" => ("mt-private", 6, 600),
        "tail-before-data" => ("fallocate-reuse", 1, 3000),
        "unchecked-data" => ("write-pages", 1, 3000),
        "journal-out-of-order" => ("rename", 1, 3000),
        "early-gc" => ("gc-reuse", 1, 6000),
        "client-stale-lease" => ("client-revoke", 1, 1000),
        "tail-before-other-data" => ("client-death", 1, 3000),
        "past-tail-kept" => ("client-death-in-place", 1, 3000),
        "gc-referenced-page" => ("mt-gc,client-gc", 1, 1500),
        "tail-before-prev-fence" => ("mt-shared-file", 1, 3000),
        "unsettled-journal-mark" => ("journal-linger", 1, 3000),
        other => panic!("fault kind {other} has no detection test: add it here"),
    }
}

/// Seeds of the workloads a fault kind is scanned over, until one detects it.
/// Skipping the wait for another thread's fence harms only in a schedule where a
/// commit stands between its unlock and its fence while the next one stores its
/// tail; the deterministic schedule follows the seed and the exact sequence of
/// stores, so a change of the commit path's stores can move that race to another
/// seed (streamed tails of copy-on-write writes did, for seed 1).
fn seeds(kind: &str) -> &'static [u64] {
    match kind {
        "tail-before-prev-fence" => &[1, 2, 3],
        _ => &[1],
    }
}

#[test]
fn every_fault_kind_is_detected() {
    let mut undetected = Vec::new();
    for kind in FAULT_KINDS {
        let (sel, variants, states) = plan(kind);
        let mut rep = None;
        for &seed in seeds(kind) {
            let ws = workloads::select(sel, seed).unwrap();
            let cfg = Config { states, seed, ..Config::default() };
            let r = explore::inject(kind, &ws, variants, &cfg).unwrap();
            let found = r.detected() > 0;
            rep = Some(r);
            if found {
                break;
            }
        }
        let rep = rep.expect("every kind has a seed");
        let n = rep.detected();
        // To the process's stderr, so CI logs show it even when the test passes.
        let _ = writeln!(
            std::io::stderr(),
            "crash simulator: fault {kind} detected by {n} of {} variant(s) in {:.1}s",
            rep.variants.len(),
            rep.secs
        );
        for v in &rep.variants {
            eprintln!(
                "  {} {}: {}",
                v.workload,
                v.fault.spec(),
                match (&v.detected, &v.functional) {
                    (Some(f), _) => format!("detected at op {} fence {}", f.op, f.fence),
                    (None, Some(f)) => format!("functional failure at op {}", f.op),
                    (None, None) => ferrite_crash::cli::explain(v),
                }
            );
        }
        if n == 0 {
            undetected.push(kind);
            continue;
        }
        // The reproducer of the first detection rebuilds a failing state.
        if let Some(f) = rep.variants.iter().find_map(|v| v.detected.clone()) {
            let spec = explore::ReplaySpec::parse(&f.replay_spec()).unwrap();
            let mut out = Vec::new();
            let pass = explore::replay(&spec, &mut out).unwrap();
            assert!(
                !pass,
                "{kind}: replay of {} passed:\n{}",
                f.replay_spec(),
                String::from_utf8_lossy(&out)
            );
        }
    }
    assert!(undetected.is_empty(), "faults not detected: {undetected:?}");
}

#[test]
fn skip_flush_scan_reports_harmless_variants_with_a_reason() {
    let ws = workloads::select("truncate", 1).unwrap();
    let cfg = Config { states: 300, ..Config::default() };
    let rep = explore::inject("skip-flush", &ws, 40, &cfg).unwrap();
    assert!(rep.variants.len() >= 20, "the scan covers the workload's flushes");
    assert!(rep.detected() * 2 > rep.variants.len(), "most skipped flushes must be caught");
    for v in rep.variants.iter().filter(|v| v.detected.is_none() && v.functional.is_none()) {
        let t = v.trace.as_ref().expect("skip-flush variants carry a trace");
        assert!(t.fired, "{}: the skipped flush was reached", v.fault.spec());
        eprintln!("undetected {}: {}", v.fault.spec(), ferrite_crash::cli::explain(v));
    }
}
