//! The results of a run: every sample, the tables and plots the experiments declare,
//! target status and the performance goals. Serialised whole to `results.json`.
//!
//! Invariants:
//! - A sample is one measured repetition (warm-ups are never stored).
//! - A table cell is the [`Summary`] of the samples with the same
//!   (experiment, case, target); no number appears in a table that is not derived
//!   from samples of this run.
//! - A cell that could not be measured carries the reason in `failures`, never a value.

use crate::stats::Summary;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

/// One measured repetition.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Experiment id (`micro`, `append`, ...).
    pub experiment: String,
    /// Case within the experiment (`randwrite/4 KiB/t1`).
    pub case: String,
    /// Target name.
    pub target: String,
    /// Repetition index (0-based, warm-up excluded); an interval index for time series.
    pub rep: usize,
    /// Operations done.
    pub ops: u64,
    /// User bytes moved.
    pub bytes: u64,
    /// Elapsed seconds.
    pub secs: f64,
    /// The metric the experiment's table shows (unit in the table).
    pub value: f64,
    /// Further numbers (ops/s, latency, persistence counters, ...).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, f64>,
}

impl Sample {
    /// A repetition measured as one number (no operation or byte counts).
    pub fn value(experiment: &str, case: &str, target: &str, rep: usize, value: f64) -> Sample {
        Sample {
            experiment: experiment.into(),
            case: case.into(),
            target: target.into(),
            rep,
            ops: 0,
            bytes: 0,
            secs: 0.0,
            value,
            extra: BTreeMap::new(),
        }
    }
}

/// A row of a table: label and the case it shows.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Row label.
    pub label: String,
    /// Case key.
    pub case: String,
}

/// A table of summaries: rows are cases, columns are targets.
#[derive(Clone, Debug, Serialize)]
pub struct Table {
    /// Experiment the cases belong to.
    pub experiment: String,
    /// Title.
    pub title: String,
    /// Unit of the values.
    pub unit: String,
    /// Larger is better (throughput) or not (time).
    pub higher_is_better: bool,
    /// Text under the table.
    pub note: String,
    /// Rows.
    pub rows: Vec<Row>,
}

/// A free-form table (recovery, memory, write amplification, GC summary).
#[derive(Clone, Debug, Serialize)]
pub struct TextTable {
    /// Title.
    pub title: String,
    /// Header.
    pub headers: Vec<String>,
    /// Rows of cells.
    pub rows: Vec<Vec<String>>,
    /// Text under the table.
    pub note: String,
}

/// A series of a plot.
#[derive(Clone, Debug, Serialize)]
pub struct Series {
    /// Legend.
    pub name: String,
    /// Points (x, y).
    pub points: Vec<(f64, f64)>,
}

/// A plot.
#[derive(Clone, Debug, Serialize)]
pub struct Plot {
    /// File stem under `plots/`.
    pub id: String,
    /// Title.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// Logarithmic x.
    pub log_x: bool,
    /// Logarithmic y.
    pub log_y: bool,
    /// Category names for a bar chart (x = index); empty for line plots.
    pub categories: Vec<String>,
    /// Series.
    pub series: Vec<Series>,
}

/// One performance goal of the project, checked on this run's numbers.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    /// What is promised.
    pub goal: String,
    /// What was measured (ratio or amount, with the numbers it came from).
    pub measured: String,
    /// Pass, miss, or not measured.
    pub status: GoalStatus,
}

/// Outcome of a goal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum GoalStatus {
    /// Met.
    Pass,
    /// Missed.
    Miss,
    /// Not measured in this run (target or experiment not run).
    NotMeasured,
}

impl GoalStatus {
    /// Table text.
    pub fn text(self) -> &'static str {
        match self {
            GoalStatus::Pass => "pass",
            GoalStatus::Miss => "**MISS**",
            GoalStatus::NotMeasured => "not measured",
        }
    }
}

/// A target and whether it took part.
#[derive(Clone, Debug, Serialize)]
pub struct TargetStatus {
    /// Name.
    pub name: String,
    /// Description, or why it was skipped.
    pub detail: String,
    /// Took part.
    pub used: bool,
}

/// Everything a run produced.
#[derive(Debug, Default, Serialize)]
pub struct Results {
    /// Command line.
    pub command: String,
    /// UTC start time.
    pub started: String,
    /// Seconds the run took.
    pub elapsed_secs: f64,
    /// Machine facts.
    pub machine: BTreeMap<String, String>,
    /// Resolved configuration.
    pub config: serde_json::Value,
    /// Targets.
    pub targets: Vec<TargetStatus>,
    /// Kind of each target that took part (for ratio columns).
    pub target_kinds: Vec<(String, crate::target::Kind)>,
    /// Experiments run, in order, with their error if they failed.
    pub experiments: Vec<(String, Option<String>)>,
    /// Samples.
    pub samples: Vec<Sample>,
    /// Cells that could not be measured: (experiment, case, target, reason).
    pub failures: Vec<(String, String, String, String)>,
    /// Tables.
    pub tables: Vec<Table>,
    /// Free-form tables, keyed by experiment.
    pub text_tables: Vec<(String, TextTable)>,
    /// Plots, keyed by experiment.
    pub plots: Vec<(String, Plot)>,
    /// Goals.
    pub goals: Vec<Goal>,
    /// Notes printed in the report.
    pub notes: Vec<String>,
    #[serde(skip)]
    pub(crate) cache: HashMap<(String, String, String), Summary>,
}

impl Results {
    /// Record a sample.
    pub fn push(&mut self, s: Sample) {
        self.cache.clear();
        self.samples.push(s);
    }

    /// Record a cell that could not be measured.
    pub fn fail(&mut self, exp: &str, case: &str, target: &str, why: &str) {
        self.failures.push((exp.into(), case.into(), target.into(), why.into()));
    }

    fn build_cache(&mut self) {
        if !self.cache.is_empty() || self.samples.is_empty() {
            return;
        }
        let mut groups: HashMap<(String, String, String), Vec<f64>> = HashMap::new();
        for s in &self.samples {
            groups
                .entry((s.experiment.clone(), s.case.clone(), s.target.clone()))
                .or_default()
                .push(s.value);
        }
        self.cache =
            groups.into_iter().filter_map(|(k, v)| Summary::of(&v).map(|s| (k, s))).collect();
    }

    /// Summary of one cell.
    pub fn summary(&mut self, exp: &str, case: &str, target: &str) -> Option<Summary> {
        self.build_cache();
        self.cache.get(&(exp.to_string(), case.to_string(), target.to_string())).copied()
    }

    /// Median of an `extra` field over the samples of one cell.
    pub fn extra_median(&self, exp: &str, case: &str, target: &str, key: &str) -> Option<f64> {
        self.extra_summary(exp, case, target, key).map(|s| s.median)
    }

    /// Summary of an `extra` field over the samples of one cell that have it.
    pub fn extra_summary(&self, exp: &str, case: &str, target: &str, key: &str) -> Option<Summary> {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.experiment == exp && s.case == case && s.target == target)
            .filter_map(|s| s.extra.get(key).copied())
            .collect();
        Summary::of(&v)
    }

    /// Targets (in first-seen order) with at least one sample in `exp`.
    pub fn targets_in(&self, exp: &str) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for s in self.samples.iter().filter(|s| s.experiment == exp) {
            if !v.contains(&s.target) {
                v.push(s.target.clone());
            }
        }
        v
    }

    /// The failure reason of a cell, if it failed.
    pub fn failure(&self, exp: &str, case: &str, target: &str) -> Option<&str> {
        self.failures
            .iter()
            .find(|f| f.0 == exp && f.1 == case && f.2 == target)
            .map(|f| f.3.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(case: &str, target: &str, v: f64) -> Sample {
        Sample {
            experiment: "e".into(),
            case: case.into(),
            target: target.into(),
            rep: 0,
            ops: 1,
            bytes: 1,
            secs: 1.0,
            value: v,
            extra: [("k".to_string(), v * 2.0)].into_iter().collect(),
        }
    }

    #[test]
    fn summaries_group_by_cell() {
        let mut r = Results::default();
        r.push(s("a", "x", 1.0));
        r.push(s("a", "x", 3.0));
        r.push(s("a", "y", 10.0));
        assert_eq!(r.summary("e", "a", "x").unwrap().median, 2.0);
        assert_eq!(r.summary("e", "a", "y").unwrap().n, 1);
        assert!(r.summary("e", "b", "x").is_none());
        r.push(s("a", "x", 5.0));
        assert_eq!(r.summary("e", "a", "x").unwrap().median, 3.0);
        assert_eq!(r.extra_median("e", "a", "x", "k"), Some(6.0));
        assert_eq!(r.targets_in("e"), vec!["x", "y"]);
        r.fail("e", "a", "z", "boom");
        assert_eq!(r.failure("e", "a", "z"), Some("boom"));
    }
}
