//! The demo's chart: stacked panels sharing the x axis, each a line chart
//! with axes, ticks and units, a caption and a legend, drawn with
//! [`plotters`] into an RGB buffer and encoded as PNG with the `png` crate.
//!
//! Text is drawn with DejaVu Sans, embedded in the binary
//! (`assets/fonts/DejaVuSans.ttf`, under its own free licence: see
//! `assets/fonts/LICENSE`), so the chart needs no system fonts.

use std::path::Path;
use std::sync::OnceLock;

use plotters::prelude::*;
use plotters::style::FontStyle;

/// An RGB colour.
pub type Rgb = [u8; 3];

/// One line: a name for the legend, a colour and its points.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Line colour.
    pub color: Rgb,
    /// (x, y) points, x increasing.
    pub points: Vec<(f64, f64)>,
}

/// One panel: a title and its lines; panels share the x axis.
pub struct Panel {
    /// Title drawn above the panel.
    pub title: String,
    /// What the y axis measures, with its unit, e.g. `warm rate (%)`.
    pub y_label: String,
    /// The lines.
    pub series: Vec<Series>,
}

/// Width of the chart, pixels.
const WIDTH: u32 = 900;
/// Height of one panel, pixels.
const PANEL_HEIGHT: u32 = 320;
/// The family the embedded font is registered under.
const FONT: &str = "sans-serif";

static FONT_BYTES: &[u8] = include_bytes!("../assets/fonts/DejaVuSans.ttf");

/// Registers the embedded font with plotters once.
fn font() -> std::io::Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, FONT_BYTES).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(std::io::Error::other(
            "the embedded chart font cannot be read",
        ))
    }
}

/// Writes `panels` stacked vertically as a PNG at `path`, the shared x axis
/// labelled `x_label`.
pub fn write_png(path: &Path, panels: &[Panel], x_label: &str) -> std::io::Result<()> {
    font()?;
    let height = PANEL_HEIGHT * panels.len().max(1) as u32;
    let mut rgb = vec![255u8; WIDTH as usize * height as usize * 3];
    draw(&mut rgb, (WIDTH, height), panels, x_label).map_err(std::io::Error::other)?;
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut encoder = png::Encoder::new(file, WIDTH, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(std::io::Error::other)?;
    writer
        .write_image_data(&rgb)
        .map_err(std::io::Error::other)?;
    writer.finish().map_err(std::io::Error::other)
}

type DrawResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

fn draw(rgb: &mut [u8], size: (u32, u32), panels: &[Panel], x_label: &str) -> DrawResult {
    let root = BitMapBackend::with_buffer(rgb, size).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((panels.len().max(1), 1));
    let x_max = panels
        .iter()
        .flat_map(|p| &p.series)
        .flat_map(|s| &s.points)
        .map(|&(x, _)| x)
        .fold(1.0, f64::max);
    for (panel, area) in panels.iter().zip(&areas) {
        let y_max = panel
            .series
            .iter()
            .flat_map(|s| &s.points)
            .map(|&(_, y)| y)
            .fold(0.0, f64::max);
        // Headroom above the highest point, and a visible range when all
        // points are 0.
        let y_top = if y_max > 0.0 { y_max * 1.08 } else { 1.0 };
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, (FONT, 20))
            .margin(12)
            .margin_right(36)
            .x_label_area_size(42)
            .y_label_area_size(64)
            .build_cartesian_2d(0.0..x_max, 0.0..y_top)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(&panel.y_label)
            .x_labels(10)
            .y_labels(6)
            .label_style((FONT, 14))
            .axis_desc_style((FONT, 15))
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| {
                if y_top >= 10.0 {
                    format!("{y:.0}")
                } else {
                    format!("{y:.1}")
                }
            })
            .light_line_style(RGBColor(235, 235, 235))
            .draw()?;
        for s in &panel.series {
            let color = RGBColor(s.color[0], s.color[1], s.color[2]);
            chart
                .draw_series(LineSeries::new(
                    s.points.iter().copied(),
                    color.stroke_width(2),
                ))?
                .label(s.name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_png_with_the_embedded_font() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("chart.png");
        let line = |name: &str, color, k: f64| Series {
            name: name.into(),
            color,
            points: (1..=10)
                .map(|i| (f64::from(i) * 100.0, k * f64::from(i)))
                .collect(),
        };
        let panels = [
            Panel {
                title: "a panel".into(),
                y_label: "value (%)".into(),
                series: vec![
                    line("one", [200, 60, 40], 1.0),
                    line("two", [30, 110, 200], 2.0),
                ],
            },
            Panel {
                title: "all zero".into(),
                y_label: "count".into(),
                series: vec![line("zero", [0, 0, 0], 0.0)],
            },
        ];
        write_png(&path, &panels, "requests").expect("plot");
        let png = std::fs::read(&path).expect("read");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"));
    }
}
