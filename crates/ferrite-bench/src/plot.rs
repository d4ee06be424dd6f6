//! SVG plots in the style of the papers' figures: throughput against size, threads or
//! time (lines with markers), and grouped bars for workloads.
//!
//! Invariants: text is emitted as SVG `<text>` (no font files or fontconfig needed);
//! a plot with no points still renders (axes and a "no data" caption), so every
//! declared plot file exists and is well-formed.

use crate::results::Plot;
use plotters::prelude::*;
use std::path::Path;

const COLORS: [RGBColor; 8] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];

fn range(vals: impl Iterator<Item = f64>, log: bool) -> (f64, f64) {
    let v: Vec<f64> = vals.filter(|x| x.is_finite() && (!log || *x > 0.0)).collect();
    if v.is_empty() {
        return (1.0, 10.0);
    }
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if log {
        (lo / 1.5, hi * 1.5)
    } else {
        let pad = ((hi - lo) * 0.08).max(hi.abs() * 0.05).max(1e-9);
        (if lo >= 0.0 { 0.0 } else { lo - pad }, hi + pad)
    }
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// Binary size label for 2^x bytes: 64, 4K, 1M.
fn size_label(x: f64) -> String {
    let r = x.round();
    if (x - r).abs() > 1e-6 || !(0.0..=62.0).contains(&r) {
        return String::new();
    }
    let b = 1u64 << r as u32;
    if b >= 1 << 30 {
        format!("{}G", b >> 30)
    } else if b >= 1 << 20 {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 {
        format!("{}K", b >> 10)
    } else {
        b.to_string()
    }
}

fn draw_lines(p: &Plot, root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> DrawResult {
    // A logarithmic x axis is drawn as log2(x) on a linear axis with binary labels
    // (I/O sizes read 64, 256, 1K, 4K ... as in the papers' figures).
    let tx = |x: f64| if p.log_x { x.log2() } else { x };
    let series: Vec<(String, Vec<(f64, f64)>)> = p
        .series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .copied()
                .filter(|q| (!p.log_x || q.0 > 0.0) && (!p.log_y || q.1 > 0.0))
                .map(|q| (tx(q.0), q.1))
                .collect();
            (s.name.clone(), pts)
        })
        .collect();
    let (mut x0, mut x1) = range(series.iter().flat_map(|s| s.1.iter().map(|q| q.0)), false);
    if p.log_x {
        let xs: Vec<f64> = series.iter().flat_map(|s| s.1.iter().map(|q| q.0)).collect();
        if !xs.is_empty() {
            x0 = xs.iter().copied().fold(f64::INFINITY, f64::min).floor() - 0.5;
            x1 = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max).ceil() + 0.5;
        }
    }
    let (y0, y1) = range(series.iter().flat_map(|s| s.1.iter().map(|q| q.1)), p.log_y);
    let nx = if p.log_x { ((x1 - x0).round() as usize + 1).max(2) } else { 10 };
    let mut cb = ChartBuilder::on(root);
    cb.caption(&p.title, ("sans-serif", 18)).margin(12).x_label_area_size(40).y_label_area_size(70);
    let xfmt = |v: &f64| if p.log_x { size_label(*v) } else { short(*v) };
    macro_rules! body {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(p.x_label.as_str())
                .y_desc(p.y_label.as_str())
                .x_labels(nx)
                .x_label_formatter(&xfmt)
                .y_label_formatter(&|v| short(*v))
                .draw()?;
            for (k, (name, pts)) in series.iter().enumerate() {
                let c = COLORS[k % COLORS.len()];
                chart
                    .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
                    .label(name.as_str())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                    });
                chart.draw_series(pts.iter().map(|&q| Circle::new(q, 3, c.filled())))?;
            }
            if !series.is_empty() {
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .position(SeriesLabelPosition::UpperLeft)
                    .draw()?;
            }
        }};
    }
    if p.log_y {
        body!(cb.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?)
    } else {
        body!(cb.build_cartesian_2d(x0..x1, y0..y1)?)
    }
    Ok(())
}

fn draw_bars(p: &Plot, root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>) -> DrawResult {
    let ncat = p.categories.len().max(1);
    let nser = p.series.len().max(1);
    let (y0, y1) = range(p.series.iter().flat_map(|s| s.points.iter().map(|q| q.1)), p.log_y);
    let mut cb = ChartBuilder::on(root);
    cb.caption(&p.title, ("sans-serif", 18)).margin(12).x_label_area_size(40).y_label_area_size(70);
    let cats = p.categories.clone();
    let fmt_x = move |v: &f64| {
        let k = v.round();
        if (v - k).abs() < 1e-6 && k >= 0.0 && (k as usize) < cats.len() {
            cats[k as usize].clone()
        } else {
            String::new()
        }
    };
    macro_rules! body {
        ($chart:expr, $base:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(ncat + 1)
                .x_label_formatter(&fmt_x)
                .y_label_formatter(&|v| short(*v))
                .x_desc(p.x_label.as_str())
                .y_desc(p.y_label.as_str())
                .draw()?;
            let w = 0.8 / nser as f64;
            for (k, s) in p.series.iter().enumerate() {
                let c = COLORS[k % COLORS.len()];
                chart
                    .draw_series(s.points.iter().filter(|q| q.1 > 0.0 || !p.log_y).map(
                        |&(x, y)| {
                            let left = x - 0.4 + k as f64 * w;
                            Rectangle::new([(left, $base), (left + w * 0.95, y)], c.filled())
                        },
                    ))?
                    .label(s.name.as_str())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], c.filled())
                    });
            }
            if !p.series.is_empty() {
                chart
                    .configure_series_labels()
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .position(SeriesLabelPosition::UpperRight)
                    .draw()?;
            }
        }};
    }
    let xr = -0.6..(ncat as f64 - 0.4);
    if p.log_y {
        body!(cb.build_cartesian_2d(xr, (y0..y1).log_scale())?, y0)
    } else {
        body!(cb.build_cartesian_2d(xr, y0..y1)?, 0.0)
    }
    Ok(())
}

/// Compact axis numbers with at most three significant digits: 1.5k, 20M, 0.25, 2.
pub fn short(v: f64) -> String {
    fn trim(x: f64) -> String {
        let d = if x.abs() >= 100.0 {
            0
        } else if x.abs() >= 10.0 {
            1
        } else {
            2
        };
        let s = format!("{x:.d$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
    let a = v.abs();
    if a >= 1e9 {
        format!("{}G", trim(v / 1e9))
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", trim(v / 1e3))
    } else if a >= 0.01 || a == 0.0 {
        trim(v)
    } else {
        format!("{v:.1e}")
    }
}

/// Render `p` to `dir/<id>.svg`.
pub fn render(p: &Plot, dir: &Path) -> Result<std::path::PathBuf, String> {
    let path = dir.join(format!("{}.svg", p.id));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 500)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let r = if p.categories.is_empty() { draw_lines(p, &root) } else { draw_bars(p, &root) };
        r.map_err(|e| format!("plot {}: {e}", p.id))?;
        if p.series.iter().all(|s| s.points.is_empty()) {
            root.draw(&Text::new("no data in this run", (330, 250), ("sans-serif", 16)))
                .map_err(|e| e.to_string())?;
        }
        root.present().map_err(|e| e.to_string())?;
    }
    std::fs::write(&path, svg).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::Series;

    fn plot(cats: Vec<String>, log: bool, pts: Vec<(f64, f64)>) -> Plot {
        Plot {
            id: format!("t{}{}", cats.len(), log),
            title: "T".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_x: log && cats.is_empty(),
            log_y: log,
            categories: cats,
            series: vec![
                Series { name: "a".into(), points: pts.clone() },
                Series { name: "b".into(), points: pts },
            ],
        }
    }

    #[test]
    fn renders_lines_bars_and_empty() {
        let dir = tempfile::tempdir().unwrap();
        for p in [
            plot(vec![], true, vec![(64.0, 10.0), (4096.0, 1000.0)]),
            plot(vec![], false, vec![(0.0, 1.0), (2.0, 3.0)]),
            plot(vec!["x".into(), "y".into()], true, vec![(0.0, 10.0), (1.0, 30.0)]),
            plot(vec![], true, vec![]),
        ] {
            let f = render(&p, dir.path()).unwrap();
            let s = std::fs::read_to_string(f).unwrap();
            assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
            assert!(s.contains("<text"));
        }
        assert_eq!(short(1500.0), "1.5k");
        assert_eq!(short(1800.0), "1.8k");
        assert_eq!(short(2e6), "2M");
        assert_eq!(short(0.25), "0.25");
        assert_eq!(short(0.5), "0.5");
        assert_eq!(short(1.5), "1.5");
        assert_eq!(short(64.0), "64");
        assert_eq!(short(262144.0), "262k");
        assert_eq!(size_label(6.0), "64");
        assert_eq!(size_label(12.0), "4K");
        assert_eq!(size_label(20.0), "1M");
        assert_eq!(size_label(7.5), "");
    }
}
