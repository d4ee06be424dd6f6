//! fio on the mount versus tmpfs, in the same run (ratios, never absolute thresholds).
//! Ignored by default (it measures, it does not check behaviour); run it with an
//! optimised daemon:
//!
//!     cargo test --release -p ferrite-cli --test fuse_bench -- --ignored --nocapture
//!
//! `FERRITE_BENCH_SECS` sets the seconds per fio job (default 10). Jobs: 4 KiB random
//! writes with fsync after each write; 4 KiB random reads with a cold kernel cache
//! (every read reaches the daemon), with a warm one (the kernel answers), and with
//! O_DIRECT (every read reaches the daemon; tmpfs serves O_DIRECT from its pages); the
//! same random writes from 4 jobs.

mod fuse_util;

use fuse_util::{run, Mount};
use std::path::Path;
use std::process::Command;

struct Job {
    name: &'static str,
    args: &'static [&'static str],
}

const JOBS: &[Job] = &[
    Job { name: "randwrite 4k fsync=1", args: &["--rw=randwrite", "--bs=4k", "--fsync=1"] },
    // fio drops the file's cached pages before every pass over it (invalidate=1): on
    // the mount every read reaches the daemon; tmpfs pages are the storage itself.
    Job { name: "randread 4k cold cache", args: &["--rw=randread", "--bs=4k"] },
    Job { name: "randread 4k warm cache", args: &["--rw=randread", "--bs=4k", "--invalidate=0"] },
    Job { name: "randread 4k O_DIRECT", args: &["--rw=randread", "--bs=4k", "--direct=1"] },
    Job {
        name: "randwrite 4k fsync=1, 4 jobs",
        args: &["--rw=randwrite", "--bs=4k", "--fsync=1", "--numjobs=4", "--size=32M"],
    },
];

/// IOPS of one fio job in `dir` (read + write).
fn fio_iops(dir: &Path, job: &Job, secs: u64) -> Option<f64> {
    let mut c = Command::new("fio");
    c.arg("--name=bench")
        .arg(format!("--directory={}", dir.display()))
        .args(["--ioengine=psync", "--size=64M", "--time_based", "--group_reporting"])
        .arg(format!("--runtime={secs}"))
        .args(["--output-format=json"])
        .args(job.args);
    let out = c.output().expect("fio runs");
    if !out.status.success() {
        eprintln!("{} in {}: {}", job.name, dir.display(), String::from_utf8_lossy(&out.stderr));
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("fio json");
    let j = &v["jobs"][0];
    Some(j["read"]["iops"].as_f64().unwrap_or(0.0) + j["write"]["iops"].as_f64().unwrap_or(0.0))
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
fn fio_mount_versus_tmpfs() {
    let secs: u64 =
        std::env::var("FERRITE_BENCH_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(10);
    let mut m = Mount::new("bench", "2G", "");
    let tmp = tempfile::Builder::new().prefix("ferrite-bench").tempdir_in("/dev/shm").unwrap();
    run(Command::new("fio").arg("--version"));
    println!("\n{:<32} {:>14} {:>14} {:>8}", "job", "mount IOPS", "tmpfs IOPS", "ratio");
    let mut measured = 0;
    for job in JOBS {
        let a = fio_iops(&m.mnt, job, secs);
        let b = fio_iops(tmp.path(), job, secs);
        let fmt = |x: Option<f64>| x.map_or("n/a".to_string(), |v| format!("{v:.0}"));
        let ratio = match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
            _ => "n/a".into(),
        };
        println!("{:<32} {:>14} {:>14} {:>8}", job.name, fmt(a), fmt(b), ratio);
        if a.is_some_and(|v| v > 0.0) {
            measured += 1;
        }
        for d in [m.mnt.as_path(), tmp.path()] {
            for e in std::fs::read_dir(d).unwrap() {
                let _ = std::fs::remove_file(e.unwrap().path());
            }
        }
    }
    assert_eq!(measured, JOBS.len(), "every job ran on the mount");
    m.umount();
}
