//! A small PNG line-chart writer for the demo's report: stacked panels,
//! each with an axis box, y-axis range labels and one line per series, text
//! drawn with an embedded 8×8 bitmap font (`font8x8`) so no system fonts are
//! needed. Encoded with the `png` crate.

use std::path::Path;

use font8x8::UnicodeFonts;

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
    /// The lines.
    pub series: Vec<Series>,
}

struct Canvas {
    w: usize,
    h: usize,
    px: Vec<u8>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Self {
        Canvas {
            w,
            h,
            px: vec![255; w * h * 3],
        }
    }

    fn set(&mut self, x: i64, y: i64, c: Rgb) {
        if x >= 0 && y >= 0 && (x as usize) < self.w && (y as usize) < self.h {
            let i = (y as usize * self.w + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }

    /// A line 2 px thick (Bresenham, doubled vertically).
    fn line(&mut self, (x0, y0): (i64, i64), (x1, y1): (i64, i64), c: Rgb) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.set(x, y, c);
            self.set(x, y + 1, c);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    fn rect(&mut self, x0: i64, y0: i64, x1: i64, y1: i64, c: Rgb) {
        for x in x0..=x1 {
            self.set(x, y0, c);
            self.set(x, y1, c);
        }
        for y in y0..=y1 {
            self.set(x0, y, c);
            self.set(x1, y, c);
        }
    }

    /// Text at (x, y) top-left, each font pixel drawn `scale`×`scale`.
    fn text(&mut self, x: i64, y: i64, s: &str, scale: i64, c: Rgb) {
        for (i, ch) in s.chars().enumerate() {
            let Some(glyph) = font8x8::BASIC_FONTS.get(ch) else {
                continue;
            };
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        for dy in 0..scale {
                            for dx in 0..scale {
                                self.set(
                                    x + (i as i64 * 8 + col) * scale + dx,
                                    y + row as i64 * scale + dy,
                                    c,
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 1000.0 || v == v.trunc() {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// Writes `panels` stacked vertically as a PNG at `path`, with `x_label`
/// under the last panel.
pub fn write_png(path: &Path, panels: &[Panel], x_label: &str) -> std::io::Result<()> {
    let (w, panel_h) = (960usize, 300usize);
    let h = panel_h * panels.len().max(1) + 40;
    let mut cv = Canvas::new(w, h);
    let (left, right) = (90i64, w as i64 - 20);
    let ink = [40, 40, 40];
    let x_max = panels
        .iter()
        .flat_map(|p| p.series.iter().flat_map(|s| s.points.iter().map(|p| p.0)))
        .fold(0.0f64, f64::max)
        .max(1.0);
    for (pi, panel) in panels.iter().enumerate() {
        let top = (pi * panel_h) as i64 + 40;
        let bottom = top + panel_h as i64 - 70;
        cv.text(left, top - 30, &panel.title, 2, ink);
        let ys = panel
            .series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1));
        let (mut lo, mut hi) = ys.fold((f64::MAX, f64::MIN), |(a, b), y| (a.min(y), b.max(y)));
        if lo > hi {
            (lo, hi) = (0.0, 1.0);
        }
        if (hi - lo).abs() < 1e-9 {
            hi = lo + 1.0;
        }
        cv.rect(left, top, right, bottom, ink);
        cv.text(4, top, &fmt_num(hi), 1, ink);
        cv.text(4, bottom - 8, &fmt_num(lo), 1, ink);
        let to_px = |(x, y): (f64, f64)| {
            let px = left + ((x / x_max) * (right - left) as f64) as i64;
            let py = bottom - (((y - lo) / (hi - lo)) * (bottom - top) as f64) as i64;
            (px, py)
        };
        for (si, s) in panel.series.iter().enumerate() {
            for pair in s.points.windows(2) {
                cv.line(to_px(pair[0]), to_px(pair[1]), s.color);
            }
            let ly = bottom + 12 + si as i64 * 14;
            for dx in 0..20 {
                cv.set(left + dx, ly + 4, s.color);
                cv.set(left + dx, ly + 5, s.color);
            }
            cv.text(left + 28, ly, &s.name, 1, ink);
        }
    }
    cv.text(
        right - 8 * x_label.len() as i64,
        h as i64 - 14,
        x_label,
        1,
        ink,
    );
    cv.text(
        left,
        h as i64 - 14,
        &format!("0 .. {}", fmt_num(x_max)),
        1,
        ink,
    );
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, w as u32, h as u32);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut writer = enc.write_header().map_err(std::io::Error::other)?;
    writer
        .write_image_data(&cv.px)
        .map_err(std::io::Error::other)?;
    writer.finish().map_err(std::io::Error::other)
}
