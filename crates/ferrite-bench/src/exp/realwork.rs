//! Real work, as a new user would try it: the same everyday jobs on every directory
//! target (tmpfs, ext4, the FUSE mount, the mount through the preload library) —
//! `cp -a` of a source tree (`/usr/include`), `tar x` of it, `git clone` of a local
//! repository made from it, `find` over the trees, `stat` of every entry, `rm -rf` —
//! and the single calls they are made of: `stat` of a cached path, `fstat`, and
//! create + close of a new file.
//!
//! Invariants:
//! - The inputs (the tree, its tar archive and a git repository of it) are made once,
//!   outside every timing, in the scratch directory (tmpfs), and read warm by every
//!   target alike; `git clone --no-hardlinks` copies objects on every target.
//! - Jobs run in order on each target (find, stat and rm need the trees of the jobs
//!   before), targets interleaved within each job; the first round is a warm-up and
//!   is not recorded; each round ends with the trees removed.
//! - A program that is missing or fails makes a failed cell with its message, never a
//!   number; values are seconds per job and microseconds per call (lower is better).

use super::{say, Ctx};
use crate::results::{Row, Sample, Table};
use crate::target::{TResult, Target, TargetError};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The jobs, in the order they run: (case, label).
pub const JOBS: [(&str, &str); 7] = [
    ("cp-a", "cp -a of the tree"),
    ("tar-x", "tar x of the tree's archive"),
    ("git-clone", "git clone (--no-hardlinks) of a local repository of the tree"),
    ("tee", "tee of the tree's archive into a file (a C library stream: fopen, fwrite)"),
    ("find", "find over the three trees"),
    ("stat-all", "lstat of every entry of the three trees (a Rust walk)"),
    ("rm-rf", "rm -rf of the three trees"),
];

/// The single calls: (case, label).
pub const CALLS: [(&str, &str); 4] = [
    ("stat-cached", "stat of a path three levels deep, again and again"),
    ("fstat", "fstat of an open file"),
    ("create-close", "create + close of a new file in one directory"),
    ("process", "a process that reads one file (cat), started and waited for"),
];

/// Processes of the `process` call per cell, for `n` calls of the others.
fn processes(n: usize) -> usize {
    (n / 40).clamp(50, 500)
}

/// The inputs every target gets.
struct Inputs {
    tree: PathBuf,
    tar: PathBuf,
    git: PathBuf,
    entries: usize,
}

fn run_cmd(c: &mut Command) -> Result<(), String> {
    let out = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("{:?}: {e}", c.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} failed ({}): {}",
            c.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn count_entries(p: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(p)? {
        let e = e?;
        n += 1;
        if e.file_type()?.is_dir() {
            n += count_entries(&e.path())?;
        }
    }
    Ok(n)
}

/// Copy the source tree into the scratch directory, archive it and commit it to a
/// git repository (untimed).
fn make_inputs(src: &Path, work: &Path) -> Result<Inputs, String> {
    let base = work.join("real-work-inputs");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    let tree = base.join("tree");
    run_cmd(Command::new("cp").arg("-a").arg(src).arg(&tree))?;
    let entries = count_entries(&tree).map_err(|e| format!("{}: {e}", tree.display()))?;
    let tar = base.join("tree.tar");
    run_cmd(Command::new("tar").arg("cf").arg(&tar).arg("-C").arg(&base).arg("tree"))?;
    let git = base.join("repo");
    run_cmd(Command::new("cp").arg("-a").arg(&tree).arg(&git))?;
    let g = |args: &[&str]| {
        run_cmd(
            Command::new("git")
                .arg("-C")
                .arg(&git)
                .args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"])
                .args(args),
        )
    };
    g(&["init", "-q"])?;
    g(&["add", "-A"])?;
    g(&["commit", "-q", "-m", "tree"])?;
    Ok(Inputs { tree, tar, git, entries })
}

/// lstat of every entry under `p`; the number of entries.
fn stat_walk(p: &Path) -> std::io::Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(p)? {
        let path = e?.path();
        let m = std::fs::symlink_metadata(&path)?;
        n += 1;
        if m.is_dir() {
            n += stat_walk(&path)?;
        }
    }
    Ok(n)
}

/// Run job `case` in `dir` (the target's directory); its time in seconds.
fn job(case: &str, dir: &Path, inp: &Inputs) -> Result<f64, String> {
    let trees = [dir.join("cp"), dir.join("tar"), dir.join("git")];
    let t0 = Instant::now();
    match case {
        "cp-a" => run_cmd(Command::new("cp").arg("-a").arg(&inp.tree).arg(&trees[0]))?,
        "tar-x" => {
            std::fs::create_dir(&trees[1]).map_err(|e| format!("mkdir: {e}"))?;
            run_cmd(Command::new("tar").arg("xf").arg(&inp.tar).arg("-C").arg(&trees[1]))?
        }
        "git-clone" => run_cmd(
            Command::new("git")
                .args(["clone", "-q", "--no-hardlinks"])
                .arg(&inp.git)
                .arg(&trees[2]),
        )?,
        "tee" => {
            // Into the copied tree, so that `rm -rf` takes it away with the trees.
            run_cmd(
                Command::new("sh")
                    .args(["-c", "exec tee \"$1\" < \"$2\"", "sh"])
                    .arg(trees[0].join("tee.out"))
                    .arg(&inp.tar),
            )?
        }
        "find" => run_cmd(Command::new("find").args(&trees))?,
        "stat-all" => {
            let mut n = 0;
            for t in &trees {
                n += stat_walk(t).map_err(|e| format!("stat walk: {e}"))?;
            }
            if n < inp.entries * 2 {
                return Err(format!("stat walk saw {n} entries, the copies hold more"));
            }
        }
        "rm-rf" => run_cmd(Command::new("rm").arg("-rf").args(&trees))?,
        _ => return Err(format!("unknown job {case}")),
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// Microseconds per call of `case` in `dir`, `n` calls.
fn calls(case: &str, dir: &Path, n: usize) -> std::io::Result<f64> {
    let d = dir.join("calls/a/b");
    std::fs::create_dir_all(&d)?;
    let f = d.join("f");
    std::fs::write(&f, [7u8; 4096])?;
    let us = match case {
        "stat-cached" => {
            std::fs::metadata(&f)?;
            let t0 = Instant::now();
            for _ in 0..n {
                std::fs::metadata(&f)?;
            }
            t0.elapsed().as_secs_f64() * 1e6 / n as f64
        }
        "fstat" => {
            let h = std::fs::File::open(&f)?;
            h.metadata()?;
            let t0 = Instant::now();
            for _ in 0..n {
                h.metadata()?;
            }
            t0.elapsed().as_secs_f64() * 1e6 / n as f64
        }
        "create-close" => {
            let t0 = Instant::now();
            for i in 0..n {
                drop(std::fs::File::create(d.join(format!("c{i}")))?);
            }
            t0.elapsed().as_secs_f64() * 1e6 / n as f64
        }
        "process" => {
            // What every short program pays on the target: its start (the preload
            // library's attach, for the direct target), one open and read, its end.
            let k = processes(n);
            let t0 = Instant::now();
            for _ in 0..k {
                let st = Command::new("cat").arg(&f).stdout(Stdio::null()).status()?;
                if !st.success() {
                    return Err(std::io::Error::other(format!("cat failed: {st}")));
                }
            }
            t0.elapsed().as_secs_f64() * 1e6 / k as f64
        }
        _ => return Err(std::io::Error::other(format!("unknown call {case}"))),
    };
    std::fs::remove_dir_all(dir.join("calls"))?;
    Ok(us)
}

fn sample(case: &str, t: &dyn Target, rep: usize, value: f64) -> Sample {
    Sample::value("real-work", case, t.name(), rep, value)
}

/// Run the real-work experiment.
pub fn run(ctx: &mut Ctx<'_>) -> TResult<()> {
    let cfg = ctx.cfg;
    let dirs: Vec<usize> =
        (0..ctx.targets.len()).filter(|&i| ctx.targets[i].dir().is_some()).collect();
    let inp = make_inputs(&cfg.real_src, &cfg.work_dir)
        .map_err(|e| TargetError::Other(format!("real-work inputs: {e}")))?;
    let n_calls = (cfg.files * 4).clamp(200, 20_000);
    let pb =
        ctx.bar("real-work", ((JOBS.len() + CALLS.len()) * dirs.len() * (cfg.reps + 1)) as u64);
    for &i in &dirs {
        ctx.targets[i].reset()?;
    }
    for rep in 0..=cfg.reps {
        for (case, _) in JOBS {
            for &i in &dirs {
                let t = ctx.targets[i].as_ref();
                let dir = t.dir().expect("a directory target");
                match job(case, dir, &inp) {
                    Ok(secs) if rep > 0 => ctx.res.push(sample(case, t, rep - 1, secs)),
                    Ok(_) => {}
                    Err(e) => {
                        say(&pb, &format!("  {case} on {}: {e}", t.name()));
                        ctx.res.fail("real-work", case, t.name(), &e);
                        for sub in ["cp", "tar", "git"] {
                            let _ = std::fs::remove_dir_all(dir.join(sub));
                        }
                    }
                }
                pb.inc(1);
            }
        }
        for (case, _) in CALLS {
            for &i in &dirs {
                let t = ctx.targets[i].as_ref();
                let dir = t.dir().expect("a directory target");
                match calls(case, dir, n_calls) {
                    Ok(us) if rep > 0 => ctx.res.push(sample(case, t, rep - 1, us)),
                    Ok(_) => {}
                    Err(e) => {
                        say(&pb, &format!("  {case} on {}: {e}", t.name()));
                        ctx.res.fail("real-work", case, t.name(), &e.to_string());
                    }
                }
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    let _ = std::fs::remove_dir_all(cfg.work_dir.join("real-work-inputs"));
    let src = cfg.real_src.display();
    ctx.res.tables.push(Table {
        experiment: "real-work".into(),
        title: "Real work: everyday jobs on a source tree".into(),
        unit: "seconds".into(),
        higher_is_better: false,
        note: format!(
            "The tree is {src} ({} entries), copied once to the scratch directory with its tar \
             archive and a git repository of it. Ratio columns are the peer's time over \
             FerriteFS's (below 1: FerriteFS is slower).",
            inp.entries
        ),
        rows: JOBS.iter().map(|(c, l)| Row { label: (*l).into(), case: (*c).into() }).collect(),
    });
    ctx.res.tables.push(Table {
        experiment: "real-work".into(),
        title: "Real work: the single calls".into(),
        unit: "µs per call".into(),
        higher_is_better: false,
        note: format!(
            "{n_calls} calls per cell, from this process ({} processes for the last row).",
            processes(n_calls)
        ),
        rows: CALLS.iter().map(|(c, l)| Row { label: (*l).into(), case: (*c).into() }).collect(),
    });
    Ok(())
}
