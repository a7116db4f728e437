//! The figures' one style: the canvas every plot starts from, the legend and the colours they share.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

/// A white SVG canvas of the figures' size at `path`: every figure starts from the same page.
pub(crate) fn svg_root(path: &Path) -> Result<DrawingArea<SVGBackend<'_>, Shift>, String> {
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    Ok(root)
}

/// Draws the legend in the figures' one style and writes the file: the last step of every figure.
pub(crate) fn finish<'a, CT: CoordTranslate>(
    mut chart: ChartContext<'a, SVGBackend<'a>, CT>,
    root: &DrawingArea<SVGBackend<'a>, Shift>,
) -> Result<(), String> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

pub(crate) const COLORS: [RGBColor; 4] =
    [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(214, 39, 40)];
