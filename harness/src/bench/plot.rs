//! `bench/overhead.png`: requests/s as a ratio to plain Envoy against body size, one panel per concurrency.
//!
//! Drawn with `plotters`' bitmap backend. Text needs a TrueType font: DejaVu Sans (or `$LLMROUTE_FONT`) is
//! loaded at run time through `ab_glyph`, so nothing links against fontconfig. Without a font the chart is
//! drawn without any text, and the results file describes it.

use std::path::Path;

use plotters::coord::combinators::LogCoord;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::overhead::Outcome;
use super::systems::Kind;

const FONT_PATHS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];
/// The family name the loaded font is registered under.
pub(crate) const FONT: &str = "sans-serif";
const SERIES: [(Kind, RGBColor); 4] = [
    (Kind::Llmroute, RGBColor(0x1f, 0x77, 0xb4)),
    (Kind::Native, NATIVE_COLOR),
    (Kind::Sglang, RGBColor(0xd6, 0x27, 0x28)),
    (Kind::Vllm, RGBColor(0x2c, 0xa0, 0x2c)),
];
const NATIVE_COLOR: RGBColor = RGBColor(0x94, 0x67, 0xbd);
/// One system's line: its points, (body KiB, ratio).
type Series = (Kind, RGBColor, Vec<(f64, f64)>);

/// The wasm build's throughput goals, (KiB, minimum ratio), drawn as black crosses; the native build's
/// ([`super::goals::NATIVE_MIN_RATIO`]) as crosses in its colour.
const GOALS: [(f64, f64); 2] = [(4.0, 0.85), (256.0, 0.6)];

/// Draws the chart to `path`. Returns whether text could be drawn.
pub fn draw(outcome: &Outcome, path: &Path) -> Result<bool, String> {
    let text = load_font();
    let width = 560 * outcome.settings.concurrencies.len().max(1) as u32;
    let root = BitMapBackend::new(path, (width, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, outcome.settings.concurrencies.len().max(1)));
    for (panel, &c) in panels.iter().zip(&outcome.settings.concurrencies) {
        panel_chart(panel, outcome, c, text)?;
    }
    root.present().map_err(err)?;
    Ok(text)
}

/// One panel's chart: log-scale KiB across, ratio up.
type Chart<'a, 'b> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<LogCoord<f64>, RangedCoordf64>>;

fn panel_chart(
    area: &DrawingArea<BitMapBackend, Shift>,
    o: &Outcome,
    concurrency: usize,
    text: bool,
) -> Result<(), String> {
    let series: Vec<Series> = SERIES
        .iter()
        .map(|&(kind, color)| (kind, color, points(o, kind, concurrency)))
        .filter(|(_, _, p)| !p.is_empty())
        .collect();
    let top = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|&(_, y)| y))
        .fold(1.2_f64, f64::max)
        * 1.05;
    let mut chart = frame(area, concurrency, top, text)?;
    let baseline = chart
        .draw_series(LineSeries::new([(0.8, 1.0), (1300.0, 1.0)], BLACK.mix(0.5)))
        .map_err(err)?;
    if text {
        baseline
            .label("plain Envoy")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 18, y)], BLACK.mix(0.5)));
    }
    for (kind, color, pts) in &series {
        draw_line(&mut chart, kind.short(), *color, pts, text)?;
    }
    // The throughput goals apply to loaded cases only.
    if concurrency >= 16 {
        let native = super::goals::NATIVE_MIN_RATIO.map(|(size, min)| (size as f64 / 1024.0, min));
        draw_goals(&mut chart, &GOALS, BLACK, "goal (minimum)", text)?;
        draw_goals(&mut chart, &native, NATIVE_COLOR, "native goal (minimum)", text)?;
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// The axes, grid and caption of one panel: body size in KiB on a log scale, 0..`top` up.
fn frame<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    concurrency: usize,
    top: f64,
    text: bool,
) -> Result<Chart<'a, 'b>, String> {
    let labels = if text { (44, 56) } else { (8, 8) };
    let mut builder = ChartBuilder::on(area);
    builder
        .margin(14)
        .x_label_area_size(labels.0)
        .y_label_area_size(labels.1);
    if text {
        builder.caption(format!("req/s ÷ plain Envoy, concurrency {concurrency}"), (FONT, 20));
    }
    let mut chart = builder
        .build_cartesian_2d((0.8_f64..1300.0).log_scale(), 0.0..top)
        .map_err(err)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("body size, KiB (log)")
            .y_desc("× plain Envoy")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .label_style((FONT, 14));
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw().map_err(err)?;
    Ok(chart)
}

/// Goals as crosses in `color`, and their legend entry.
fn draw_goals(chart: &mut Chart, pts: &[(f64, f64)], color: RGBColor, name: &str, text: bool) -> Result<(), String> {
    let goals = chart
        .draw_series(pts.iter().map(|&p| Cross::new(p, 7, color.stroke_width(2))))
        .map_err(err)?;
    if text {
        goals
            .label(name)
            .legend(move |(x, y)| Cross::new((x + 9, y), 5, color.stroke_width(2)));
    }
    Ok(())
}

/// One system's ratios as a line with dots, and its legend entry.
fn draw_line(chart: &mut Chart, name: &str, color: RGBColor, pts: &[(f64, f64)], text: bool) -> Result<(), String> {
    let line = chart
        .draw_series(LineSeries::new(pts.to_vec(), color.stroke_width(2)))
        .map_err(err)?;
    if text {
        line.label(name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
        .map_err(err)?;
    Ok(())
}

/// (body KiB, median ratio) for one system at one concurrency.
fn points(o: &Outcome, kind: Kind, concurrency: usize) -> Vec<(f64, f64)> {
    o.cases
        .iter()
        .filter(|c| c.case.concurrency == concurrency)
        .filter_map(|c| Some((c.case.size as f64 / 1024.0, c.ratio(kind)?)))
        .collect()
}

/// Registers DejaVu Sans (or `$LLMROUTE_FONT`) for text; false when none can be read.
pub(crate) fn load_font() -> bool {
    let custom = std::env::var("LLMROUTE_FONT").ok();
    let candidates = custom.iter().map(String::as_str).chain(FONT_PATHS);
    let Some(bytes) = candidates.into_iter().find_map(|p| std::fs::read(p).ok()) else {
        return false;
    };
    // plotters keeps the font for the life of the process, so it needs 'static bytes; this leaks one font file.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_ok()
}

/// A drawing error, as the plots report it.
pub(crate) fn err(e: impl std::fmt::Display) -> String {
    format!("drawing the plot: {e}")
}

#[cfg(test)]
mod tests {
    use super::super::overhead::sample;
    use super::*;

    #[test]
    fn draws_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("overhead.png");
        draw(&sample::outcome(), &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 1000);
    }
}
