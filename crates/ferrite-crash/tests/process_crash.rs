//! Real process crashes: a child runs a seeded workload on a pool file in /dev/shm
//! and acknowledges each operation over a pipe; the parent SIGKILLs it at a random
//! moment, recovers the pool, runs fsck and checks that the tree is the model state
//! after the last acknowledged operation or the one after it. Several seeds.

use ferrite_crash::process::run_process_crashes;
use std::path::Path;

#[test]
fn sigkill_at_random_moments_loses_nothing_acknowledged() {
    let exe = Path::new(env!("CARGO_BIN_EXE_ferrite-crashtest"));
    let dir =
        if Path::new("/dev/shm").is_dir() { Path::new("/dev/shm") } else { Path::new("/tmp") };
    let runs = run_process_crashes(exe, &[], 16, 11, 1500, dir);
    let fails: Vec<String> = runs
        .iter()
        .filter_map(|r| r.failure.as_ref().map(|f| format!("seed {}: {f}", r.seed)))
        .collect();
    for r in &runs {
        eprintln!(
            "seed {} acked {}/{} finished {} next-op-landed {}",
            r.seed, r.acked, r.ops, r.finished, r.next_op_landed
        );
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
    let mid = runs.iter().filter(|r| !r.finished && !r.before_ready && r.acked > 0).count();
    assert!(mid >= 8, "only {mid} of {} kills landed in the middle of the workload", runs.len());
}
