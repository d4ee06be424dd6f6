//! Real programs on every directory target (tmpfs, ext4, the FUSE mount, the mount
//! through the preload library): fio with the psync engine (4 KiB random writes with
//! fsync after each, 64 B appends with fsync after each, 4 KiB random reads) and
//! sqlite3 (WAL journal, inserts in transactions). The direct target runs them in
//! this preloaded process's children, which inherit the library.
//!
//! Invariants: a program that is not installed, or fails, is reported as a failed
//! cell with the reason, never as a number; every target gets the same job, data
//! size and run time; targets are interleaved within each repetition.

use super::{say, Ctx};
use crate::results::{Row, Sample, Table};
use crate::target::{TResult, Target};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

/// One fio job: (case, fio arguments, which side's IOPS).
struct FioJob {
    case: &'static str,
    label: &'static str,
    args: Vec<String>,
    read: bool,
}

fn fio_jobs(size_mb: u64, secs: f64) -> Vec<FioJob> {
    let common = |rw: &str, bs: &str| -> Vec<String> {
        vec![
            "--ioengine=psync".into(),
            format!("--rw={rw}"),
            format!("--bs={bs}"),
            format!("--size={size_mb}m"),
            "--time_based=1".into(),
            format!("--runtime={}ms", (secs * 1000.0) as u64),
            "--ramp_time=0".into(),
            "--numjobs=1".into(),
            "--output-format=json".into(),
        ]
    };
    let mut w = common("randwrite", "4k");
    w.push("--fsync=1".into());
    let mut a = common("write", "64");
    a.extend(["--fsync=1".into(), "--file_append=1".into()]);
    let r = common("randread", "4k");
    vec![
        FioJob {
            case: "fio-randwrite-4k-fsync",
            label: "fio: 4 KiB random write, fsync after each (IOPS)",
            args: w,
            read: false,
        },
        FioJob {
            case: "fio-append-64-fsync",
            label: "fio: 64 B appends, fsync after each (IOPS)",
            args: a,
            read: false,
        },
        FioJob {
            case: "fio-randread-4k",
            label: "fio: 4 KiB random read (IOPS)",
            args: r,
            read: true,
        },
    ]
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// Run one fio job in `dir`; IOPS.
fn fio(dir: &Path, job: &FioJob) -> Result<f64, String> {
    let out = Command::new("fio")
        .arg("--name=bench")
        .arg(format!("--directory={}", dir.display()))
        .args(&job.args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("fio: {e}"))?;
    if !out.status.success() {
        return Err(format!("fio failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("fio output: {e}"))?;
    let side = if job.read { "read" } else { "write" };
    v["jobs"][0][side]["iops"]
        .as_f64()
        .filter(|x| *x > 0.0)
        .ok_or_else(|| "fio reported no IOPS".into())
}

/// sqlite3 in WAL mode: `txs` transactions of `rows` inserts into a new database in
/// `dir`; transactions per second.
fn sqlite(dir: &Path, txs: usize, rows: usize) -> Result<f64, String> {
    let db = dir.join("bench.db");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    let mut sql =
        String::from("PRAGMA journal_mode=WAL;\nCREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT);\n");
    for b in 0..txs {
        sql.push_str("BEGIN;\n");
        for i in 0..rows {
            sql.push_str(&format!(
                "INSERT INTO t(v) VALUES('{b}-{i}-payload-of-some-forty-bytes');\n"
            ));
        }
        sql.push_str("COMMIT;\n");
    }
    let t0 = Instant::now();
    let mut c = Command::new("sqlite3")
        .arg(&db)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("sqlite3: {e}"))?;
    {
        use std::io::Write;
        let mut i = c.stdin.take().ok_or("sqlite3: no stdin")?;
        i.write_all(sql.as_bytes()).map_err(|e| format!("sqlite3: {e}"))?;
    }
    let out = c.wait_with_output().map_err(|e| format!("sqlite3: {e}"))?;
    let secs = t0.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!("sqlite3 failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(txs as f64 / secs)
}

fn sample(case: &str, t: &dyn Target, rep: usize, value: f64) -> Sample {
    Sample::value("programs", case, t.name(), rep, value)
}

/// Run the real-programs experiment.
pub fn run(ctx: &mut Ctx<'_>) -> TResult<()> {
    let cfg = ctx.cfg;
    let size_mb = (cfg.file_size >> 20).clamp(4, 256);
    let secs = (cfg.rep_secs * 4.0).clamp(0.2, 5.0);
    let jobs = fio_jobs(size_mb, secs);
    let txs = (cfg.files / 50).clamp(20, 2000);
    let dirs: Vec<usize> =
        (0..ctx.targets.len()).filter(|&i| ctx.targets[i].dir().is_some()).collect();
    let pb = ctx.bar("programs", (dirs.len() * (jobs.len() + 1) * (cfg.reps + 1)) as u64);
    let (have_fio, have_sqlite) = (have("fio"), have("sqlite3"));
    for &i in &dirs {
        ctx.targets[i].reset()?;
    }
    for rep in 0..=cfg.reps {
        for job in &jobs {
            for &i in &dirs {
                let t = ctx.targets[i].as_ref();
                let dir = t.dir().expect("a directory target");
                let r = if have_fio { fio(dir, job) } else { Err("fio is not installed".into()) };
                match r {
                    Ok(iops) if rep > 0 => ctx.res.push(sample(job.case, t, rep - 1, iops)),
                    Ok(_) => {}
                    Err(e) => {
                        say(&pb, &format!("  {} on {}: {e}", job.case, t.name()));
                        ctx.res.fail("programs", job.case, t.name(), &e);
                    }
                }
                for f in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                    let _ = std::fs::remove_file(f.path());
                }
                pb.inc(1);
            }
        }
        for &i in &dirs {
            let t = ctx.targets[i].as_ref();
            let dir = t.dir().expect("a directory target");
            let r = if have_sqlite {
                sqlite(dir, txs, 10)
            } else {
                Err("sqlite3 is not installed".into())
            };
            match r {
                Ok(v) if rep > 0 => ctx.res.push(sample("sqlite-wal-tx", t, rep - 1, v)),
                Ok(_) => {}
                Err(e) => {
                    say(&pb, &format!("  sqlite on {}: {e}", t.name()));
                    ctx.res.fail("programs", "sqlite-wal-tx", t.name(), &e);
                }
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let mut rows: Vec<Row> =
        jobs.iter().map(|j| Row { label: j.label.into(), case: j.case.into() }).collect();
    rows.push(Row {
        label: format!("sqlite3, WAL, transactions of 10 inserts ({txs} per run): transactions/s"),
        case: "sqlite-wal-tx".into(),
    });
    ctx.res.tables.push(Table {
        experiment: "programs".into(),
        title: "Real programs: fio (psync) and sqlite3".into(),
        unit: "IOPS / transactions per second".into(),
        higher_is_better: true,
        note: format!(
            "fio on a {size_mb} MiB file, {secs:.1} s per job; sqlite3 with its default \
             synchronous=FULL (every commit synced). The direct target runs both through the \
             preload library."
        ),
        rows,
    });
    Ok(())
}
