//! Appends with a sync after each (the FLEX paper's Figure 5 experiment, Xu et al.,
//! ASPLOS '19): "append and extend" grows a file by each write; "circular append"
//! rewrites a preallocated region in order, wrapping around.
//!
//! Invariants: the extend file is recreated (empty) before each repetition, outside
//! the measured phase; the circular region is written in full before it is measured.

use super::{io_sample, parallel, pattern, prefill, say, timed_ops, Ctx, Phase};
use crate::config::{fmt_size, Config};
use crate::results::{Plot, Row, Series, Table};
use crate::target::{TResult, Target};
use std::time::Duration;

/// The two append modes.
pub const MODES: [&str; 2] = ["extend", "circular"];

/// Case key.
pub fn case_key(mode: &str, size: u64) -> String {
    format!("{mode}/{}", fmt_size(size))
}

/// One repetition of `mode` appends of `size` bytes (shared with `mmap`).
pub(crate) fn run_cell(
    t: &dyn Target,
    mode: &str,
    size: u64,
    cfg: &Config,
    cap: Duration,
) -> TResult<Phase> {
    let ops = cfg.ops_for(size);
    let buf = pattern(size as usize, 3);
    let region = cfg.circ_region / size * size;
    let h =
        if mode == "extend" { t.create("a/extend", true)? } else { t.open("a/circular", false)? };
    let ph = parallel(1, |_, gate| {
        timed_ops(gate, ops, cap, 8, size, |i| {
            if mode == "extend" {
                t.append(&h, &buf)?;
            } else {
                t.write_at(&h, (i * size) % region, &buf)?;
            }
            t.fsync(&h)
        })
    });
    t.close(h)?;
    ph
}

/// Run the append experiment.
pub fn run(ctx: &mut Ctx<'_>) -> TResult<()> {
    let cfg = ctx.cfg;
    let cases: Vec<(&str, u64)> =
        MODES.iter().flat_map(|&m| cfg.append_sizes.iter().map(move |&s| (m, s))).collect();
    let pb = ctx.bar("append", (cases.len() * ctx.targets.len()) as u64);
    for t in ctx.targets.iter_mut() {
        t.reset()?;
        t.mkdir("a")?;
    }
    let cap = Duration::from_secs_f64(cfg.rep_secs);
    let warm = Duration::from_secs_f64(cfg.rep_secs / 4.0);
    for &(mode, size) in &cases {
        let key = case_key(mode, size);
        pb.set_message(key.clone());
        let mut live = Vec::new();
        for (i, t) in ctx.targets.iter().enumerate() {
            let r = if mode == "circular" {
                prefill(t.as_ref(), "a/circular", cfg.circ_region)
            } else {
                Ok(())
            };
            match r {
                Ok(()) => live.push(i),
                Err(e) => {
                    ctx.res.fail("append", &key, t.name(), &format!("setup: {e}"));
                    pb.inc(1);
                }
            }
        }
        for rep in 0..=cfg.reps {
            let mut still = Vec::new();
            for &i in &live {
                let t = ctx.targets[i].as_ref();
                let before = t.persist_counters();
                match run_cell(t, mode, size, cfg, if rep == 0 { warm } else { cap }) {
                    Ok(ph) => {
                        still.push(i);
                        if rep > 0 {
                            let s = io_sample("append", &key, t, rep - 1, ph, 1, before);
                            ctx.res.push(s);
                        }
                    }
                    Err(e) => {
                        say(&pb, &format!("  append {key} on {}: {e}", t.name()));
                        ctx.res.fail("append", &key, t.name(), &e.to_string());
                        pb.inc(1);
                    }
                }
            }
            live = still;
        }
        pb.inc(live.len() as u64);
    }
    pb.finish_and_clear();
    for mode in MODES {
        ctx.res.tables.push(Table {
            experiment: "append".into(),
            title: if mode == "extend" {
                "Append and extend, fsync after each append".into()
            } else {
                format!(
                    "Circular append in a {} region, fsync after each write",
                    fmt_size(cfg.circ_region)
                )
            },
            unit: "MB/s".into(),
            higher_is_better: true,
            note: format!(
                "One thread; up to {} appends or {:.2} s per repetition.",
                cfg.max_ops, cfg.rep_secs
            ),
            rows: cfg
                .append_sizes
                .iter()
                .map(|&s| Row { label: fmt_size(s), case: case_key(mode, s) })
                .collect(),
        });
    }
    let targets = ctx.res.targets_in("append");
    for mode in MODES {
        let series = targets
            .iter()
            .map(|t| Series {
                name: t.clone(),
                points: cfg
                    .append_sizes
                    .iter()
                    .filter_map(|&s| {
                        ctx.res
                            .summary("append", &case_key(mode, s), t)
                            .map(|x| (s as f64, x.median / s as f64 * 1e6))
                    })
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        ctx.res.plots.push((
            "append".into(),
            Plot {
                id: format!("append-{mode}-vs-size"),
                title: format!("{mode} append + fsync: operations per second"),
                x_label: "append size (bytes)".into(),
                y_label: "appends/s".into(),
                log_x: true,
                log_y: true,
                categories: vec![],
                series,
            },
        ));
    }
    Ok(())
}
