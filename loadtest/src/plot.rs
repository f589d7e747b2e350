//! `kvindex-policies --plot out.png`: one picture of the policy comparison, hit rate on the left
//! and TTFT p50/p99 on the right, one horizontal bar per policy so long policy names stay
//! readable.
//!
//! Text is rendered by plotters' `ab_glyph` backend from a font compiled into the binary
//! (`epaint_default_fonts`' Ubuntu Light), not looked up on the system, so the plot has its
//! labels on a bare CI machine too.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use crate::driver::PolicyReport;

const WIDTH: u32 = 1400;
/// Grows with the number of policies so bars keep a readable height.
const HEIGHT_PER_POLICY: u32 = 44;
const MIN_HEIGHT: u32 = 420;
const FONT: &str = "sans-serif";
const HIT_COLOR: RGBColor = RGBColor(46, 117, 182);
const P50_COLOR: RGBColor = RGBColor(112, 173, 71);
const P99_COLOR: RGBColor = RGBColor(237, 125, 49);

/// Registers the embedded font under the family name every style below uses, once.
fn register_font() -> Result<(), String> {
    static REGISTERED: OnceLock<Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            for style in [FontStyle::Normal, FontStyle::Bold, FontStyle::Italic, FontStyle::Oblique] {
                plotters::style::register_font(FONT, style, epaint_default_fonts::UBUNTU_LIGHT)
                    .map_err(|_| "the embedded font could not be parsed".to_string())?;
            }
            Ok(())
        })
        .clone()
}

/// Draws `reports` into a PNG at `path`, with `title` above both panels.
pub fn write_png(path: &Path, title: &str, reports: &[PolicyReport]) -> Result<(), String> {
    if reports.is_empty() {
        return Err("nothing to plot".into());
    }
    register_font()?;
    let count = reports.len();
    let height = (HEIGHT_PER_POLICY * count as u32 + 160).max(MIN_HEIGHT);
    let root = BitMapBackend::new(path, (WIDTH, height)).into_drawing_area();
    let error = |e: DrawingAreaErrorKind<_>| format!("plot {}: {e}", path.display());
    root.fill(&WHITE).map_err(error)?;
    let root = root.titled(title, (FONT, 24)).map_err(error)?;
    let (left, right) = root.split_horizontally(WIDTH / 2);
    // A segmented range `0..n` has n + 1 segments (the last one past the end): `0..count - 1`
    // gives exactly one per policy. A single policy keeps `0..1` (an empty row above it).
    let rows = 0..(count - 1).max(1);
    // Policies top to bottom in the order given: the first one gets the highest segment.
    let row = |index: usize| count - 1 - index;
    let label = |value: &SegmentValue<usize>| match value {
        SegmentValue::CenterOf(segment) if *segment < count => reports[count - 1 - segment].policy.clone(),
        _ => String::new(),
    };

    let mut hit_chart = ChartBuilder::on(&left)
        .caption("hit rate (cached / prompt tokens)", (FONT, 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(190)
        .build_cartesian_2d(0.0..1.0f64, rows.clone().into_segmented())
        .map_err(error)?;
    hit_chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(count)
        .y_label_formatter(&label)
        .x_labels(6)
        .x_label_formatter(&|x| format!("{x:.1}"))
        .label_style((FONT, 14))
        .draw()
        .map_err(error)?;
    hit_chart
        .draw_series(reports.iter().enumerate().map(|(index, report)| {
            let mut bar = Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(row(index))),
                    (report.hit_rate.clamp(0.0, 1.0), SegmentValue::Exact(row(index) + 1)),
                ],
                HIT_COLOR.filled(),
            );
            bar.set_margin(6, 6, 0, 0);
            bar
        }))
        .map_err(error)?;
    hit_chart
        .draw_series(reports.iter().enumerate().map(|(index, report)| {
            Text::new(
                format!(" {:.3}", report.hit_rate),
                (report.hit_rate.clamp(0.0, 0.86), SegmentValue::CenterOf(row(index))),
                (FONT, 14).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
            )
        }))
        .map_err(error)?;

    let slowest =
        reports.iter().map(|r| r.ttft_p99_s.max(r.ttft_p50_s)).filter(|t| t.is_finite()).fold(0.0f64, f64::max);
    // Headroom on the right for the legend.
    let x_max = if slowest > 0.0 { slowest * 1.4 } else { 1.0 };
    let mut ttft_chart = ChartBuilder::on(&right)
        .caption("TTFT p50 / p99 (simulated seconds)", (FONT, 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(190)
        .build_cartesian_2d(0.0..x_max, rows.clone().into_segmented())
        .map_err(error)?;
    ttft_chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(count)
        .y_label_formatter(&label)
        .x_labels(6)
        .x_label_formatter(&|x| format!("{x:.2} s"))
        .label_style((FONT, 14))
        .draw()
        .map_err(error)?;
    // Each policy's segment holds two thin bars: p50 in the upper half, p99 in the lower.
    let segment_px = ttft_chart.plotting_area().dim_in_pixel().1 / count as u32;
    let half = segment_px / 2;
    for (quantile, color, upper) in [("p50", P50_COLOR, true), ("p99", P99_COLOR, false)] {
        ttft_chart
            .draw_series(reports.iter().enumerate().map(|(index, report)| {
                let value = if upper { report.ttft_p50_s } else { report.ttft_p99_s };
                let mut bar = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(row(index))),
                        (value.clamp(0.0, x_max), SegmentValue::Exact(row(index) + 1)),
                    ],
                    color.filled(),
                );
                if upper {
                    bar.set_margin(4, half, 0, 0);
                } else {
                    bar.set_margin(half, 4, 0, 0);
                }
                bar
            }))
            .map_err(error)?
            .label(quantile)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    ttft_chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font((FONT, 14))
        .draw()
        .map_err(error)?;
    root.present().map_err(error)?;
    Ok(())
}
