//! Summary statistics over repetitions: median, spread, mean, standard deviation.
//!
//! Invariants: a [`Summary`] is only built from at least one finite sample; the median
//! of an even count is the mean of the two middle samples.

use serde::Serialize;

/// Summary of the repetitions of one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Samples.
    pub n: usize,
    /// Median.
    pub median: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Mean.
    pub mean: f64,
    /// Sample standard deviation (0 for one sample).
    pub stddev: f64,
}

impl Summary {
    /// Summarise `xs`; `None` when there is no finite sample.
    pub fn of(xs: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = xs.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Some(Summary { n, median, min: v[0], max: v[n - 1], mean, stddev: var.sqrt() })
    }

    /// Half the min–max range as a percentage of the median.
    pub fn spread_pct(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / 2.0 / self.median.abs() * 100.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_and_spread() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!(s.median, 2.0);
        assert_eq!((s.min, s.max, s.n), (1.0, 3.0, 3));
        assert!((s.spread_pct() - 50.0).abs() < 1e-9);
        let s = Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!((s.stddev - 1.2909944).abs() < 1e-6);
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::NAN]).is_none());
        let one = Summary::of(&[5.0]).unwrap();
        assert_eq!(one.stddev, 0.0);
    }
}
