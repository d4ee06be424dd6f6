//! Metadata: create, stat, rename and unlink of many files in private directories
//! (one per thread) and in one shared directory; readdir of a large directory; mkdir
//! of a directory tree.
//!
//! Invariants:
//! - Each repetition works in fresh directories and leaves them removed, so every
//!   repetition starts from the same state; each layout runs one more repetition
//!   first, a warm-up that is not recorded.
//! - No fsync (as in filebench's file-creation flowops); FerriteFS makes each
//!   operation durable anyway, kernel file systems leave it in their caches.
//! - Creates are create-and-close; renames stay within the directory.

use super::{parallel, say, with_metadata, Ctx, Phase};
use crate::results::{Row, Sample, Table};
use crate::target::{TResult, Target};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Per-file phases, in order.
pub const PHASES: [&str; 5] = ["create", "stat", "open", "rename", "unlink"];

/// Directory layouts: (id, threads, shared).
fn layouts(threads: &[usize]) -> Vec<(String, usize, bool)> {
    let mut v = Vec::new();
    for &n in threads {
        if n == 1 {
            v.push(("t1".to_string(), 1, false));
        } else {
            v.push((format!("t{n}-private"), n, false));
            v.push((format!("t{n}-shared"), n, true));
        }
    }
    v
}

fn dir_of(base: &str, shared: bool, tid: usize) -> String {
    if shared {
        format!("{base}/s")
    } else {
        format!("{base}/p{tid}")
    }
}

/// Run the four phases once; returns their measurements.
fn one_rep(
    t: &dyn Target,
    base: &str,
    n: usize,
    threads: usize,
    shared: bool,
) -> TResult<Vec<Phase>> {
    t.mkdir(base)?;
    if shared {
        t.mkdir(&dir_of(base, true, 0))?;
    } else {
        for tid in 0..threads {
            t.mkdir(&dir_of(base, false, tid))?;
        }
    }
    let per = n / threads;
    let mut out = Vec::new();
    for phase in PHASES {
        let ph = parallel(threads, |tid, gate| {
            let d = dir_of(base, shared, tid);
            let names: Vec<(String, String)> =
                (0..per).map(|i| (format!("{d}/f{tid}_{i}"), format!("{d}/g{tid}_{i}"))).collect();
            gate.start();
            for (f, g) in &names {
                match phase {
                    "create" => {
                        let h = t.create(f, false)?;
                        t.close(h)?;
                    }
                    "stat" => {
                        t.stat(f)?;
                    }
                    "open" => {
                        // Open and close an existing file.
                        let h = t.open(f, false)?;
                        t.close(h)?;
                    }
                    "rename" => t.rename(f, g)?,
                    _ => t.unlink(g)?,
                }
            }
            gate.stop();
            Ok((per as u64, 0))
        })?;
        out.push(ph);
    }
    if shared {
        t.rmdir(&dir_of(base, true, 0))?;
    } else {
        for tid in 0..threads {
            t.rmdir(&dir_of(base, false, tid))?;
        }
    }
    t.rmdir(base)?;
    Ok(out)
}

fn sample(case: &str, t: &dyn Target, rep: usize, ph: Phase) -> Sample {
    Sample {
        experiment: "meta".into(),
        case: case.into(),
        target: t.name().into(),
        rep,
        ops: ph.ops,
        bytes: 0,
        secs: ph.secs,
        value: ph.ops_per_sec(),
        extra: BTreeMap::new(),
    }
}

/// Tree of `count` directories, fan-out 10, breadth first: the paths in creation order.
pub fn tree_paths(root: &str, count: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(count);
    let mut level: Vec<String> = vec![root.to_string()];
    while out.len() < count {
        let mut next = Vec::new();
        for parent in &level {
            for k in 0..10 {
                if out.len() == count {
                    break;
                }
                let p = format!("{parent}/d{k}");
                out.push(p.clone());
                next.push(p);
            }
        }
        level = next;
    }
    out
}

/// Run the metadata experiment.
pub fn run(ctx: &mut Ctx<'_>) -> TResult<()> {
    let cfg = ctx.cfg;
    let idx = with_metadata(ctx.targets);
    let lays = layouts(&cfg.threads);
    let n = cfg.files;
    // Every repetition creates and removes all files on every target (the FUSE mount
    // does about ten thousand a second): at most three repetitions, after a warm-up
    // of each layout that is not recorded (as in every other experiment). Without
    // it the first repetition measured a fresh process's heap growth: the library's
    // first 20,000 creates took 3.4-3.6 us each and the next ones 2.0-2.2 us in two
    // of three runs (`profile_op metapath`; 2.9-3.1 us in the third), and perf put
    // 11% of a first round in the kernel zeroing new heap pages.
    let reps = cfg.reps.min(3);
    let pb = ctx.bar("meta", (idx.len() * (reps * (lays.len() + 2) + lays.len())) as u64);
    for &i in &idx {
        ctx.targets[i].reset()?;
    }
    let mut dead: Vec<usize> = Vec::new();
    for (lid, threads, shared) in &lays {
        // Round 0 is the warm-up; repetition r is round r + 1.
        for round in 0..=reps {
            for &i in &idx {
                if dead.contains(&i) {
                    pb.inc(1);
                    continue;
                }
                let t = ctx.targets[i].as_ref();
                let rep = round.checked_sub(1);
                let what = rep.map_or("warm-up".to_string(), |r| format!("rep {r}"));
                pb.set_message(format!("{lid} {what} on {}", t.name()));
                match one_rep(t, &format!("meta-{lid}-{round}"), n, *threads, *shared) {
                    Ok(phases) => {
                        for (ph, name) in phases.into_iter().zip(PHASES) {
                            if let Some(rep) = rep {
                                ctx.res.push(sample(&format!("{name}/{lid}"), t, rep, ph));
                            }
                        }
                    }
                    Err(e) => {
                        say(&pb, &format!("  meta {lid} on {}: {e}", t.name()));
                        for name in PHASES {
                            ctx.res.fail(
                                "meta",
                                &format!("{name}/{lid}"),
                                t.name(),
                                &e.to_string(),
                            );
                        }
                        dead.push(i);
                    }
                }
                pb.inc(1);
            }
        }
        dead.clear();
    }
    // readdir of an n-entry directory, and mkdir of an n/10-directory tree.
    let tree = tree_paths("tree", (n / 10).max(10));
    for &i in &idx {
        let t = ctx.targets[i].as_ref();
        pb.set_message(format!("readdir setup on {}", t.name()));
        let setup = (|| -> TResult<()> {
            t.mkdir("big")?;
            for k in 0..n {
                let h = t.create(&format!("big/entry-{k:07}"), false)?;
                t.close(h)?;
            }
            Ok(())
        })();
        if let Err(e) = setup {
            ctx.res.fail("meta", "readdir", t.name(), &format!("setup: {e}"));
            dead.push(i);
        }
    }
    let cap = Duration::from_secs_f64(cfg.rep_secs.max(0.05));
    for rep in 0..reps {
        for &i in &idx {
            let t = ctx.targets[i].as_ref();
            if !dead.contains(&i) {
                pb.set_message(format!("readdir rep {rep} on {}", t.name()));
                let r = (|| -> TResult<Phase> {
                    let t0 = Instant::now();
                    let mut entries = 0u64;
                    let mut loops = 0;
                    while loops < 1 || (t0.elapsed() < cap && loops < 20) {
                        let c = t.readdir_count("big")?;
                        if c != n {
                            return Err(crate::target::TargetError::Other(format!(
                                "readdir saw {c} entries, expected {n}"
                            )));
                        }
                        entries += c as u64;
                        loops += 1;
                    }
                    Ok(Phase { ops: entries, bytes: 0, secs: t0.elapsed().as_secs_f64() })
                })();
                match r {
                    Ok(ph) => ctx.res.push(sample("readdir", t, rep, ph)),
                    Err(e) => ctx.res.fail("meta", "readdir", t.name(), &e.to_string()),
                }
            }
            pb.inc(1);
            pb.set_message(format!("mkdir tree rep {rep} on {}", t.name()));
            let r = (|| -> TResult<Phase> {
                t.mkdir("tree")?;
                let t0 = Instant::now();
                for p in &tree {
                    t.mkdir(p)?;
                }
                let ph =
                    Phase { ops: tree.len() as u64, bytes: 0, secs: t0.elapsed().as_secs_f64() };
                for p in tree.iter().rev() {
                    t.rmdir(p)?;
                }
                t.rmdir("tree")?;
                Ok(ph)
            })();
            match r {
                Ok(ph) => ctx.res.push(sample("mkdir-tree", t, rep, ph)),
                Err(e) => ctx.res.fail("meta", "mkdir-tree", t.name(), &e.to_string()),
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    let mut rows = Vec::new();
    for name in PHASES {
        for (lid, threads, shared) in &lays {
            let how = if *threads == 1 {
                "1 thread".to_string()
            } else if *shared {
                format!("{threads} threads, one shared directory")
            } else {
                format!("{threads} threads, private directories")
            };
            let what = if name == "open" { "open + close of an existing file" } else { name };
            rows.push(Row { label: format!("{what}, {how}"), case: format!("{name}/{lid}") });
        }
    }
    rows.push(Row { label: format!("readdir of {n} entries (entries/s)"), case: "readdir".into() });
    rows.push(Row {
        label: format!("mkdir of a {}-directory tree, fan-out 10", tree.len()),
        case: "mkdir-tree".into(),
    });
    ctx.res.tables.push(Table {
        experiment: "meta".into(),
        title: format!("Metadata operations on {n} files"),
        unit: "ops/s".into(),
        higher_is_better: true,
        note: format!(
            "{reps} repetitions after a warm-up (readdir and the mkdir tree: {reps}, no warm-up). \
             create = create and close an empty file; no fsync. FerriteFS \
             operations are durable when they return; tmpfs and ext4 keep them in DRAM caches."
        ),
        rows,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_is_breadth_first_with_parents_first() {
        let t = tree_paths("r", 25);
        assert_eq!(t.len(), 25);
        assert_eq!(t[0], "r/d0");
        assert_eq!(t[10], "r/d0/d0");
        for (i, p) in t.iter().enumerate() {
            let parent = &p[..p.rfind('/').unwrap()];
            assert!(parent == "r" || t[..i].iter().any(|q| q == parent), "{p} before its parent");
        }
    }
}
