//! The Markdown report: machine and command, targets, the goals table, then one table
//! per experiment (targets as columns, ratios of each FerriteFS target to tmpfs and to
//! the hardware limit) with its plots, failures, and the method.
//!
//! Invariants: every number printed comes from `Results` (samples of this run); a
//! cell without samples prints its failure reason or "—", never zero.

use crate::results::{GoalStatus, Results, Table};
use crate::stats::Summary;
use crate::target::Kind;
use std::fmt::Write;

/// `YYYY-MM-DDTHH-MM-SSZ` for a time (UTC), usable as a directory name.
pub fn utc_stamp(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}T{:02}-{:02}-{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// A number with about three significant digits.
pub fn num(v: f64) -> String {
    let a = v.abs();
    if !v.is_finite() {
        "—".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else if a >= 0.01 {
        format!("{v:.3}")
    } else if a == 0.0 {
        "0".into()
    } else {
        format!("{v:.2e}")
    }
}

/// A ratio: `2.31x`.
pub fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() && b.is_finite() {
        let r = a / b;
        if r >= 100.0 {
            format!("{r:.0}x")
        } else if r >= 10.0 {
            format!("{r:.1}x")
        } else {
            format!("{r:.2}x")
        }
    } else {
        "—".into()
    }
}

fn cell(s: Option<Summary>) -> String {
    match s {
        Some(s) if s.n > 1 => format!("{} ±{:.0}%", num(s.median), s.spread_pct()),
        Some(s) => num(s.median),
        None => "—".into(),
    }
}

fn kind_of(res: &Results, name: &str) -> Option<Kind> {
    res.target_kinds.iter().find(|(n, _)| n == name).map(|(_, k)| *k)
}

fn table_md(res: &mut Results, t: &Table, out: &mut String) {
    let order: Vec<String> =
        res.targets.iter().filter(|s| s.used).map(|s| s.name.clone()).collect();
    let cols: Vec<String> = order
        .into_iter()
        .filter(|c| {
            t.rows.iter().any(|r| {
                res.samples
                    .iter()
                    .any(|s| s.experiment == t.experiment && s.case == r.case && &s.target == c)
                    || res.failure(&t.experiment, &r.case, c).is_some()
            })
        })
        .collect();
    let ferrite: Vec<String> =
        cols.iter().filter(|c| kind_of(res, c) == Some(Kind::Ferrite)).cloned().collect();
    let peers: Vec<String> = ["tmpfs", "hw-ntstore"]
        .iter()
        .filter(|p| cols.iter().any(|c| c == *p))
        .map(|p| p.to_string())
        .collect();
    let _ = writeln!(out, "### {}\n", t.title);
    let mut head = format!("| {} ({}) |", "case", t.unit);
    let mut sep = "|---|".to_string();
    for c in &cols {
        let _ = write!(head, " {c} |");
        sep.push_str("---:|");
    }
    for f in &ferrite {
        for p in &peers {
            let _ = write!(head, " {f} ÷ {p} |");
            sep.push_str("---:|");
        }
    }
    let _ = writeln!(out, "{head}\n{sep}");
    for r in &t.rows {
        let mut line = format!("| {} |", r.label);
        for c in &cols {
            let s = res.summary(&t.experiment, &r.case, c);
            let txt = match (s, res.failure(&t.experiment, &r.case, c)) {
                (Some(s), _) => cell(Some(s)),
                (None, Some(why)) if why.contains("not supported") => "n/a".into(),
                (None, Some(_)) => "failed".into(),
                (None, None) => "—".into(),
            };
            let _ = write!(line, " {txt} |");
        }
        for f in &ferrite {
            for p in &peers {
                let a = res.summary(&t.experiment, &r.case, f);
                let b = res.summary(&t.experiment, &r.case, p);
                let txt = match (a, b) {
                    (Some(a), Some(b)) if t.higher_is_better => ratio(a.median, b.median),
                    (Some(a), Some(b)) => ratio(b.median, a.median),
                    _ => "—".into(),
                };
                let _ = write!(line, " {txt} |");
            }
        }
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out);
    if !t.note.is_empty() {
        let _ = writeln!(out, "{}\n", t.note);
    }
}

/// Experiment titles, in report order.
pub const SECTIONS: [(&str, &str); 11] = [
    ("micro", "fio-style micro benchmarks"),
    ("append", "Appends with a sync after each (FLEX, Figure 5)"),
    ("mmap", "Stores into mapped files (DAX through the direct target; FLEX, Figure 5)"),
    ("wa", "Write amplification and fences (counted in software)"),
    ("meta", "Metadata"),
    ("filebench", "Filebench-style personalities"),
    ("programs", "Real programs: fio and sqlite3"),
    ("real-work", "Real work: cp, tar, git, find, stat, rm"),
    ("recovery", "Recovery"),
    ("gc", "GC under pressure"),
    ("memory", "Memory"),
];

/// Render the whole report.
pub fn markdown(res: &mut Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# FerriteFS benchmark report\n");
    let _ = writeln!(out, "Produced by:\n\n    {}\n", res.command);
    let _ = writeln!(
        out,
        "Started {} (UTC), took {:.1} minutes.\n",
        res.started,
        res.elapsed_secs / 60.0
    );
    let _ = writeln!(out, "| machine | |\n|---|---|");
    for (k, v) in &res.machine {
        let _ = writeln!(out, "| {k} | {v} |");
    }
    let _ = writeln!(out, "\n## Targets\n\n| target | what it is |\n|---|---|");
    for t in &res.targets {
        let d = if t.used { t.detail.clone() } else { format!("**skipped**: {}", t.detail) };
        let _ = writeln!(out, "| {} | {} |", t.name, d);
    }
    let _ = writeln!(out, "\n## Performance goals\n");
    let _ =
        writeln!(out, "Ratios of medians measured in this run; a goal is never a timed test.\n");
    let _ = writeln!(out, "| goal | measured | result |\n|---|---|---|");
    for g in &res.goals {
        let _ = writeln!(out, "| {} | {} | {} |", g.goal, g.measured, g.status.text());
    }
    let misses = res.goals.iter().filter(|g| g.status == GoalStatus::Miss).count();
    if misses > 0 {
        let _ = writeln!(
            out,
            "\nFerriteFS misses {misses} of {} goals in this run (marked **MISS** above).",
            res.goals.len()
        );
    }
    let _ = writeln!(out);
    for (id, title) in SECTIONS {
        let tables: Vec<Table> =
            res.tables.iter().filter(|t| t.experiment == id).cloned().collect();
        let texts: Vec<_> =
            res.text_tables.iter().filter(|t| t.0 == id).map(|t| t.1.clone()).collect();
        let plots: Vec<_> = res.plots.iter().filter(|p| p.0 == id).map(|p| p.1.clone()).collect();
        let status = res.experiments.iter().find(|e| e.0 == id).cloned();
        if tables.is_empty() && texts.is_empty() && status.is_none() {
            continue;
        }
        let _ = writeln!(out, "## {title}\n");
        if let Some((_, Some(err))) = status {
            let _ = writeln!(out, "**The experiment failed:** {err}\n");
        }
        for t in &tables {
            table_md(res, t, &mut out);
        }
        for t in &texts {
            let _ = writeln!(out, "### {}\n", t.title);
            let _ = writeln!(out, "| {} |", t.headers.join(" | "));
            let _ = writeln!(out, "|{}", "---|".repeat(t.headers.len()));
            for r in &t.rows {
                let _ = writeln!(out, "| {} |", r.join(" | "));
            }
            let _ = writeln!(out);
            if !t.note.is_empty() {
                let _ = writeln!(out, "{}\n", t.note);
            }
        }
        for p in &plots {
            let _ = writeln!(out, "![{}](plots/{}.svg)\n", p.title, p.id);
        }
    }
    if !res.failures.is_empty() {
        let _ = writeln!(
            out,
            "## Cells not measured\n\n| experiment | case | target | why |\n|---|---|---|---|"
        );
        for (e, c, t, w) in &res.failures {
            let _ =
                writeln!(out, "| {e} | {c} | {t} | {} |", w.replace('|', "/").replace('\n', " "));
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "## Method\n");
    for n in &res.notes {
        let _ = writeln!(out, "- {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_and_numbers() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(951_782_400 + 3661);
        assert_eq!(utc_stamp(t), "2000-02-29T01-01-01Z");
        assert_eq!(utc_stamp(std::time::UNIX_EPOCH), "1970-01-01T00-00-00Z");
        assert_eq!(num(1234.4), "1234");
        assert_eq!(num(12.34), "12.3");
        assert_eq!(num(0.5), "0.500");
        assert_eq!(num(f64::NAN), "—");
        assert_eq!(ratio(10.0, 4.0), "2.50x");
        assert_eq!(ratio(1.0, 0.0), "—");
    }
}
