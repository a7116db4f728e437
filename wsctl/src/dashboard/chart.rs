//! The dashboard's charts as SVG drawn on the server (plotters, as `wsctl simulate` draws its figures): a line
//! through the points of one series, with a marker on every recorded step so each step can be found, and an
//! optional single point of another kind (the held-out loss).

use plotters::prelude::*;

/// Most markers one chart draws: past this the line still goes through every step, the markers only through
/// every n-th (a long run has a million steps; a page does not need a million circles).
pub const MAX_MARKERS: usize = 5000;

/// One chart's content.
pub struct Chart<'a> {
    /// The caption.
    pub title: &'a str,
    /// The y axis's description.
    pub y: &'a str,
    /// The series, `(step, value)` by step.
    pub points: &'a [(u64, f64)],
    /// A point of another kind, drawn as a cross, with its legend.
    pub extra: Option<((u64, f64), &'a str)>,
}

const BLUE: RGBColor = RGBColor(31, 119, 180);
const ORANGE: RGBColor = RGBColor(255, 127, 14);

/// The SVG text of `chart`, `size` pixels wide and high; an error names what plotters refused.
pub fn svg(chart: &Chart, size: (u32, u32)) -> Result<String, String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        draw(&root, chart)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(out)
}

/// The axes' ranges: every point's, widened where it is a single value.
fn ranges(chart: &Chart) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
    let all = chart.points.iter().copied().chain(chart.extra.map(|(p, _)| p));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in all.filter(|(_, y)| y.is_finite()) {
        (x0, x1, y0, y1) = (x0.min(x as f64), x1.max(x as f64), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        return (0.0..1.0, 0.0..1.0);
    }
    let pad = ((y1 - y0) * 0.05).max(y1.abs() * 0.01).max(1e-9);
    (x0.min(x1 - 1.0)..x1 + 0.5, (y0 - pad)..(y1 + pad))
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, plotters::coord::Shift>, chart: &Chart) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let (xs, ys) = ranges(chart);
    let mut c = ChartBuilder::on(root)
        .caption(chart.title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(xs, ys)
        .map_err(err)?;
    c.configure_mesh().x_desc("step").y_desc(chart.y).draw().map_err(err)?;
    let line = chart.points.iter().filter(|(_, y)| y.is_finite()).map(|&(x, y)| (x as f64, y));
    c.draw_series(LineSeries::new(line, BLUE.stroke_width(1))).map_err(err)?;
    let stride = chart.points.len().div_ceil(MAX_MARKERS).max(1);
    let marks = chart.points.iter().step_by(stride).filter(|(_, y)| y.is_finite());
    c.draw_series(marks.map(|&(x, y)| Circle::new((x as f64, y), 2, BLUE.filled())))
        .map_err(err)?
        .label(chart.y)
        .legend(|(x, y)| Circle::new((x, y), 3, BLUE.filled()));
    if let Some(((x, y), label)) = chart.extra {
        c.draw_series(std::iter::once(Cross::new((x as f64, y), 6, ORANGE.stroke_width(2))))
            .map_err(err)?
            .label(label)
            .legend(|(x, y)| Cross::new((x, y), 4, ORANGE.stroke_width(2)));
    }
    c.configure_series_labels().position(SeriesLabelPosition::UpperRight).border_style(BLACK).draw().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn circles(svg: &str) -> usize {
        svg.matches("<circle").count()
    }

    /// One marker per step (and one in the legend); the held-out point is a cross, not a marker.
    #[test]
    fn every_step_has_a_marker() {
        let points: Vec<(u64, f64)> = (1..=37).map(|s| (s, 2.0 / s as f64)).collect();
        let chart = Chart { title: "loss", y: "loss", points: &points, extra: Some(((37, 0.2), "held-out loss")) };
        let svg = svg(&chart, (600, 300)).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert_eq!(circles(&svg), 37 + 1);
        assert!(svg.contains("held-out loss"));
    }

    #[test]
    fn a_long_run_is_marked_at_most_max_markers_times_and_an_empty_one_still_draws() {
        let points: Vec<(u64, f64)> = (1..=12_001).map(|s| (s, 1.0)).collect();
        let long = svg(&Chart { title: "t", y: "loss", points: &points, extra: None }, (600, 300)).unwrap();
        assert_eq!(circles(&long), 12_001usize.div_ceil(3) + 1);
        let empty = svg(&Chart { title: "t", y: "loss", points: &[], extra: None }, (600, 300)).unwrap();
        assert_eq!(circles(&empty), 1);
    }
}
