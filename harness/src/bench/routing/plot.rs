//! `bench/routing.png`: the prefix-cache hit rate of every policy on every workload, as grouped bars, with the
//! oracle's hit rate drawn across each group; below, TTFT at the client (p50 bars, p99 ticks).
//!
//! Drawn with `plotters`' bitmap backend, like the overhead plot. Text needs a TrueType font: DejaVu Sans (or
//! `$LLMROUTE_FONT`) is loaded at run time; without one the chart is drawn without text.

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::policy::Policy;
use super::{Cell, Outcome};
use crate::bench::plot::{err, load_font, FONT};

fn color(p: Policy) -> RGBColor {
    match p {
        Policy::Chwbl(125) => RGBColor(0x9e, 0xc9, 0xe2),
        Policy::Chwbl(175) => RGBColor(0x3a, 0x8f, 0xc8),
        Policy::Chwbl(_) => RGBColor(0x08, 0x45, 0x94),
        Policy::BoundedKeys(_) => RGBColor(0x6a, 0x3d, 0x9a),
        Policy::Replicas(super::policy::Placement::Store, ..) => RGBColor(0x8e, 0x5e, 0xc4),
        Policy::Replicas(super::policy::Placement::BoundedKeys, ..) => RGBColor(0xca, 0xb2, 0xd6),
        Policy::Replicas(super::policy::Placement::Hash, ..) => RGBColor(0xa6, 0xce, 0xe3),
        Policy::LeastRequest => RGBColor(0x9a, 0x9a, 0x9a),
        Policy::SglangCacheAware => RGBColor(0xd6, 0x27, 0x28),
        Policy::SglangRoundRobin => RGBColor(0xf4, 0xa5, 0x82),
        Policy::VllmConsistentHash => RGBColor(0x2c, 0xa0, 0x2c),
        Policy::VllmCacheAware => RGBColor(0xa1, 0xd9, 0x9b),
    }
}

/// A drawing area of the bitmap.
type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;
/// One panel's figure of a cell.
type Figure = fn(&Cell) -> Option<f64>;

/// Draws the chart to `path`: hit rates on top, client TTFT below. Returns whether text could be drawn.
pub fn draw(o: &Outcome, path: &Path) -> Result<bool, String> {
    let text = load_font();
    let groups = o.traces.len().max(1) as u32;
    let root = BitMapBackend::new(path, (260 * groups + 260, 940)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let (plots, legend_area) = root.split_horizontally(260 * groups + 20);
    let (top, bottom) = plots.split_vertically(480);
    let hit = Panel {
        caption: "Prefix-cache hit rate (engine-reported); black line: oracle",
        y_desc: "cached ÷ prompt tokens",
        top: 1.0,
        bar: Cell::hit_rate,
        tick: None,
        oracle: true,
        log: false,
    };
    panel(&top, o, &hit, text)?;
    let p99 = o.cells.iter().filter_map(Cell::ttft_p99_ms).fold(10.0_f64, f64::max);
    let ttft = Panel {
        caption: "TTFT at the client, ms (log scale): bar p50, black tick p99",
        y_desc: "ms",
        top: (p99 * 1.3).log10(),
        bar: Cell::ttft_p50_ms,
        tick: Some(Cell::ttft_p99_ms),
        oracle: false,
        log: true,
    };
    panel(&bottom, o, &ttft, text)?;
    if text {
        legend(&legend_area, &o.measured_policies())?;
    }
    root.present().map_err(err)?;
    Ok(text)
}

/// What one panel shows.
struct Panel {
    caption: &'static str,
    y_desc: &'static str,
    top: f64,
    bar: Figure,
    tick: Option<Figure>,
    oracle: bool,
    /// Plot log10 of the values (from 1 up), with the labels in the values' units.
    log: bool,
}

impl Panel {
    fn y(&self, v: f64) -> f64 {
        if self.log {
            v.max(1.0).log10()
        } else {
            v
        }
    }
}

/// Grouped bars, one group per workload and one bar per policy, with optional ticks and oracle lines.
fn panel(area: &Area, o: &Outcome, spec: &Panel, text: bool) -> Result<(), String> {
    let policies = o.measured_policies();
    let groups = o.traces.len().max(1);
    let mut builder = ChartBuilder::on(area);
    builder
        .margin(16)
        .x_label_area_size(if text { 40 } else { 8 })
        .y_label_area_size(if text { 56 } else { 8 });
    if text {
        builder.caption(spec.caption, (FONT, 20));
    }
    let mut chart = builder
        .build_cartesian_2d(0.0..groups as f64, 0.0..spec.top)
        .map_err(err)?;
    let mut mesh = chart.configure_mesh();
    mesh.disable_x_mesh().x_labels(0).light_line_style(WHITE);
    let log_label = |y: &f64| format!("{:.0}", 10f64.powf(*y));
    let linear_label = |y: &f64| format!("{y:.1}");
    if text {
        mesh.y_desc(spec.y_desc).label_style((FONT, 14));
        if spec.log {
            mesh.y_label_formatter(&log_label);
        } else {
            mesh.y_label_formatter(&linear_label);
        }
    } else {
        mesh.y_labels(0);
    }
    mesh.draw().map_err(err)?;
    let width = 0.8 / policies.len().max(1) as f64;
    for (i, &p) in policies.iter().enumerate() {
        let x = |g: usize| g as f64 + 0.1 + i as f64 * width;
        let cells = || {
            o.traces
                .iter()
                .enumerate()
                .filter_map(move |(g, t)| Some((g, o.cell(t.workload, p)?)))
        };
        let bars = cells().filter_map(|(g, c)| {
            let v = spec.y((spec.bar)(c)?);
            Some(Rectangle::new(
                [(x(g), 0.0), (x(g) + width * 0.9, v)],
                color(p).filled(),
            ))
        });
        chart.draw_series(bars).map_err(err)?;
        if let Some(tick) = spec.tick {
            let ticks = cells().filter_map(|(g, c)| {
                let v = spec.y(tick(c)?);
                Some(PathElement::new(
                    [(x(g), v), (x(g) + width * 0.9, v)],
                    BLACK.stroke_width(2),
                ))
            });
            chart.draw_series(ticks).map_err(err)?;
        }
    }
    if spec.oracle {
        let oracle = o.traces.iter().enumerate().map(|(g, t)| {
            PathElement::new(
                [(g as f64 + 0.05, t.oracle), (g as f64 + 0.95, t.oracle)],
                BLACK.stroke_width(3),
            )
        });
        chart.draw_series(oracle).map_err(err)?;
    }
    if text {
        // The chart maps to the whole bitmap's pixels; the area draws relative to its own corner.
        let (left, top) = area.get_base_pixel();
        for (g, t) in o.traces.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(g as f64 + 0.5, 0.0));
            let (x, y) = (x - left, y - top);
            let style = TextStyle::from((FONT, 16).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
            area.draw(&Text::new(t.workload.id().to_string(), (x, y + 8), style))
                .map_err(err)?;
        }
    }
    Ok(())
}

/// One swatch and label per policy, and the oracle line.
fn legend(area: &Area, policies: &[Policy]) -> Result<(), String> {
    let style = TextStyle::from((FONT, 14).into_font());
    let mut y = 60;
    for &p in policies {
        area.draw(&Rectangle::new([(4, y), (22, y + 14)], color(p).filled()))
            .map_err(err)?;
        area.draw(&Text::new(p.label(), (28, y), style.clone())).map_err(err)?;
        y += 24;
    }
    area.draw(&PathElement::new([(4, y + 7), (22, y + 7)], BLACK.stroke_width(3)))
        .map_err(err)?;
    area.draw(&Text::new("oracle", (28, y), style)).map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::sample;
    use super::*;

    #[test]
    fn draws_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routing.png");
        draw(&sample::outcome(), &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
        assert!(bytes.len() > 1000);
    }
}
