//! SVG line charts over training steps, for run and study reports: one
//! line per series, with markers at the points or a shaded ± std band.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

/// One point of a series: step, value and its spread (0: none drawn).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Point {
    /// The training step.
    pub step: f64,
    /// The value (a mean over seeds, for studies).
    pub mean: f64,
    /// Its standard deviation over seeds.
    pub std: f64,
}

impl Point {
    /// A point without spread.
    pub fn at(step: f64, mean: f64) -> Self {
        Self {
            step,
            mean,
            std: 0.0,
        }
    }
}

/// A labelled series.
pub type Series = (String, Vec<Point>);

/// How a chart looks.
#[derive(Debug, Clone, Copy)]
pub enum Style {
    /// Lines with a marker at each point; the y range fits the data.
    Markers,
    /// Lines with a shaded ± std band; the y range includes 0.
    Bands,
}

/// The y range of a chart, padded by 5%.
fn y_range(series: &[Series], style: Style) -> (f64, f64) {
    let points = series.iter().flat_map(|(_, p)| p);
    let (mut lo, mut hi) = points.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
        (lo.min(p.mean - p.std), hi.max(p.mean + p.std))
    });
    if let Style::Bands = style {
        lo = lo.min(0.0);
    }
    if hi - lo < 1e-9 {
        lo -= 0.5;
        hi += 0.5;
    }
    let pad = (hi - lo) * 0.05;
    (lo - pad, hi + pad)
}

/// Draw `series` as an SVG chart at `path` (whole or not at all: through a
/// temporary file and a rename); nothing is written when every series is
/// empty.
pub fn chart(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[Series],
    style: Style,
) -> anyhow::Result<()> {
    let x_max = series
        .iter()
        .flat_map(|(_, p)| p)
        .map(|p| p.step)
        .fold(1.0, f64::max);
    draw(path, title, ("step", 0.0..x_max), y_label, series, style)
}

/// [`chart`] over another x axis (`x_label`; `Point::step` is the x value):
/// the range spans the points, with a margin of a tenth on each side.
pub fn chart_over(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
    style: Style,
) -> anyhow::Result<()> {
    let xs = series.iter().flat_map(|(_, p)| p).map(|p| p.step);
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    let pad = ((hi - lo) * 0.1).max(0.5);
    draw(
        path,
        title,
        (x_label, lo - pad..hi + pad),
        y_label,
        series,
        style,
    )
}

/// Draw the chart of [`chart`] with the x axis `x_label` over `x_range`.
fn draw(
    path: &Path,
    title: &str,
    (x_label, x_range): (&str, std::ops::Range<f64>),
    y_label: &str,
    series: &[Series],
    style: Style,
) -> anyhow::Result<()> {
    let err = |e: &dyn std::fmt::Display| anyhow!("{}: {e}", path.display());
    if series.iter().all(|(_, p)| p.is_empty()) {
        return Ok(());
    }
    let (y_min, y_max) = y_range(series, style);
    let mut svg = String::new();
    let root = SVGBackend::with_string(&mut svg, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(x_range, y_min..y_max)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        if points.iter().any(|p| p.std > 0.0) {
            let mut band: Vec<(f64, f64)> =
                points.iter().map(|p| (p.step, p.mean + p.std)).collect();
            band.extend(points.iter().rev().map(|p| (p.step, p.mean - p.std)));
            chart
                .draw_series(std::iter::once(Polygon::new(
                    band,
                    color.mix(0.15).filled(),
                )))
                .map_err(|e| err(&e))?;
        }
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| (p.step, p.mean)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        if let Style::Markers = style {
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|p| Circle::new((p.step, p.mean), 3, color.filled())),
                )
                .map_err(|e| err(&e))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    drop(chart);
    drop(root);
    mappa_core::fs::write_atomic(path, svg.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charts_are_svg_and_empty_series_write_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.svg");
        chart(&path, "t", "y", &[("empty".into(), vec![])], Style::Markers).unwrap();
        assert!(!path.exists());
        let series = vec![(
            "a".to_string(),
            vec![
                Point::at(0.0, 0.1),
                Point {
                    step: 1.0,
                    mean: 0.2,
                    std: 0.05,
                },
            ],
        )];
        for style in [Style::Markers, Style::Bands] {
            chart(&path, "t", "y", &series, style).unwrap();
            let svg = std::fs::read_to_string(&path).unwrap();
            assert!(
                svg.starts_with("<svg") && svg.contains("<polyline"),
                "{svg}"
            );
        }
        assert!(y_range(&series, Style::Bands).0 < 0.0, "bands include 0");
    }
}
