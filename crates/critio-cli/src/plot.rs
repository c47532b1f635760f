//! Latency plots: CCDFs of request latency on log scales, one line per
//! scheme, like paper 000 Figures 6 and 8. A point (x, y) says a fraction y
//! of requests took at least x ms, so the right end of each line is its
//! tail. Written as PNG and SVG with an embedded font (no system fonts
//! needed).

use std::path::{Path, PathBuf};
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const SIZE: (u32, u32) = (960, 640);

/// One line of a plot: a name and (latency in ms, fraction) points.
pub struct Series {
    /// The legend entry.
    pub name: String,
    /// Increasing latency, decreasing fraction.
    pub points: Vec<(f64, f64)>,
}

fn fonts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The font is compiled in and valid; a failure is a bug.
        if register_font("sans-serif", FontStyle::Normal, FONT).is_err() {
            panic!("the embedded font does not load");
        }
    });
}

const COLORS: [RGBColor; 6] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x7f, 0x7f, 0x7f),
];

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    series: &[Series],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(err)?;
    let all = || series.iter().flat_map(|s| s.points.iter());
    let x_min = all()
        .map(|p| p.0)
        .filter(|&x| x > 0.0)
        .fold(f64::MAX, f64::min)
        .min(0.1);
    let x_max = all().map(|p| p.0).fold(1.0, f64::max) * 1.5;
    let y_min = all()
        .map(|p| p.1)
        .filter(|&y| y > 0.0)
        .fold(1.0, f64::min)
        .max(1e-7)
        / 2.0;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(55)
        .y_label_area_size(80)
        .build_cartesian_2d((x_min..x_max).log_scale(), (y_min..1.2).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("request latency (ms, log scale)")
        .y_desc("fraction of requests >= latency (log scale)")
        .axis_desc_style(("sans-serif", 18))
        .label_style(("sans-serif", 15))
        .draw()
        .map_err(err)?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?
            .label(s.name.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 17))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// Writes `stem.png` and `stem.svg`; returns their paths.
pub fn ccdf(stem: &Path, title: &str, series: &[Series]) -> Result<(PathBuf, PathBuf), String> {
    fonts();
    if let Some(dir) = stem.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    draw(
        &BitMapBackend::new(&png, SIZE).into_drawing_area(),
        title,
        series,
    )?;
    draw(
        &SVGBackend::new(&svg, SIZE).into_drawing_area(),
        title,
        series,
    )?;
    Ok((png, svg))
}

/// CCDF points of a latency histogram, in ms.
pub fn ccdf_points(h: &critio::metrics::LatencyHistogram) -> Vec<(f64, f64)> {
    h.ccdf()
        .into_iter()
        .map(|(d, f)| (d.as_secs_f64() * 1e3, f))
        .collect()
}
