//! CI smoke run: the tiny configuration of every experiment on every available target,
//! checking that the JSON, the Markdown report and the plots are well-formed and that
//! every experiment produced samples for every target that took part. Numbers are not
//! checked (never assert on timing).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn well_formed_svg(p: &Path) -> Result<(), String> {
    let s = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let t = s.trim();
    if !t.starts_with("<svg") || !t.ends_with("</svg>") {
        return Err(format!("{}: not an SVG document", p.display()));
    }
    if s.matches("<text").count() != s.matches("</text>").count() {
        return Err(format!("{}: unbalanced <text> elements", p.display()));
    }
    if !s.contains("<text") {
        return Err(format!("{}: no text (axes, title) rendered", p.display()));
    }
    Ok(())
}

#[test]
fn smoke_run_produces_well_formed_output_for_every_experiment_and_target() {
    let out = tempfile::tempdir().unwrap();
    let work = format!("/dev/shm/ferrite-bench-smoke-{}", std::process::id());
    let st = Command::new(env!("CARGO_BIN_EXE_ferrite-bench"))
        .args(["--smoke", "--no-progress", "--out"])
        .arg(out.path())
        .args(["--work-dir", &work])
        .status()
        .expect("run ferrite-bench");
    assert!(st.success(), "ferrite-bench --smoke failed: {st}");
    assert!(!Path::new(&work).exists(), "scratch directory left behind");

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("results.json")).unwrap())
            .unwrap();
    // Every target is either used or skipped with a reason.
    let targets = json["targets"].as_array().unwrap();
    let mut used = BTreeSet::new();
    for t in targets {
        let name = t["name"].as_str().unwrap().to_string();
        if t["used"].as_bool().unwrap() {
            used.insert(name);
        } else {
            assert!(!t["detail"].as_str().unwrap().is_empty(), "{name} skipped without a reason");
            eprintln!("skipped target {name}: {}", t["detail"]);
        }
    }
    for must in ["ferrite-lib", "tmpfs", "hw-memcpy", "hw-ntstore"] {
        assert!(used.contains(must), "{must} did not take part");
    }
    // Every experiment ran without error.
    for e in json["experiments"].as_array().unwrap() {
        assert!(e[1].is_null(), "experiment {} failed: {}", e[0], e[1]);
    }
    // Samples: finite values; each experiment has samples from the targets it covers.
    let samples = json["samples"].as_array().unwrap();
    let has = |exp: &str, target: &str| {
        samples.iter().any(|s| s["experiment"] == exp && s["target"] == target)
    };
    for s in samples {
        let v = s["value"].as_f64().unwrap();
        assert!(v.is_finite() && v >= 0.0, "bad sample {s}");
    }
    for t in &used {
        if t == "hw-msync" {
            // The mmap experiment's own floor (a store + msync), run there only.
            assert!(has("mmap", t), "no mmap samples for {t}");
            assert!(!has("micro", t) && !has("append", t), "{t} ran beyond mmap");
            continue;
        }
        let hw = t.starts_with("hw-");
        assert!(has("micro", t), "no micro samples for {t}");
        assert!(has("append", t), "no append samples for {t}");
        if !hw {
            assert!(has("meta", t), "no meta samples for {t}");
            assert!(has("filebench", t), "no filebench samples for {t}");
        }
    }
    for exp in ["recovery", "gc", "memory"] {
        assert!(has(exp, "ferrite-lib"), "no {exp} samples");
    }
    if used.contains("ext4") {
        assert!(has("gc", "ext4"), "no gc samples for ext4");
    }
    // Write amplification counters on the library's write cells.
    assert!(samples.iter().any(|s| s["experiment"] == "micro"
        && s["target"] == "ferrite-lib"
        && s["extra"]["fences_per_op"].as_f64().is_some_and(|f| f >= 1.0)));
    // No cell failed on the targets that took part.
    let failures = json["failures"].as_array().unwrap();
    assert!(failures.is_empty(), "cells failed: {failures:?}");
    // Goals: all evaluated (pass or miss), none left unmeasured.
    let goals = json["goals"].as_array().unwrap();
    assert!(goals.len() >= 12);
    for g in goals {
        let needs_peer = g["goal"].as_str().unwrap().contains("ext4") && !used.contains("ext4");
        if !needs_peer {
            assert_ne!(g["status"], "NotMeasured", "goal not measured: {g}");
        }
    }

    // The report has every section, the goals table and links only to existing plots.
    let md = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    for h in [
        "## Performance goals",
        "## fio-style micro benchmarks",
        "## Appends with a sync after each",
        "## Write amplification",
        "## Metadata",
        "## Filebench-style personalities",
        "## Recovery",
        "## GC under pressure",
        "## Memory",
        "## Method",
    ] {
        assert!(md.contains(h), "report lacks {h}");
    }
    let mut links = 0;
    for line in md.lines().filter(|l| l.starts_with("![")) {
        let file = line.split("](").nth(1).unwrap().trim_end_matches(')');
        well_formed_svg(&out.path().join(file)).unwrap();
        links += 1;
    }
    assert!(links >= 8, "only {links} plots linked");
    // Tables are rectangular.
    let mut cols: Option<usize> = None;
    for line in md.lines() {
        if line.starts_with('|') {
            let n = line.matches('|').count();
            if let Some(c) = cols {
                assert_eq!(c, n, "ragged table row: {line}");
            }
            cols = Some(n);
        } else {
            cols = None;
        }
    }
}
