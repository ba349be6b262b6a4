//! An SVG line chart of identities over capture time, written by hand: one step line per
//! identity mode, axes with round ticks, a legend.

use std::fmt::Write as _;

use crate::engine::IdentityMode;
use crate::timeseries::Series;

const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

fn colour(mode: IdentityMode) -> &'static str {
    match mode {
        IdentityMode::Selector => "#1f77b4",
        IdentityMode::PerIp => "#d62728",
    }
}

/// A round step (1, 2 or 5 × 10^k) giving at most about `ticks` intervals up to `max`.
fn nice_step(max: f64, ticks: f64) -> f64 {
    let raw = (max / ticks).max(1e-9);
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    step.max(1.0)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The chart as an SVG document.
pub fn svg(title: &str, series: &[Series]) -> String {
    let t_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let y_top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let x_step = nice_step(t_max, 8.0);
    let y_step = nice_step(y_top, 6.0);
    let x_max = (t_max / x_step).ceil() * x_step;
    let y_max = (y_top / y_step).ceil() * y_step;
    let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x = |t: f64| LEFT + t / x_max * pw;
    let y = |v: f64| TOP + ph - v / y_max * ph;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    // Grid and ticks.
    let mut v = 0.0;
    while v <= y_max + 1e-9 {
        let yy = y(v);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{v}</text>"##,
            WIDTH - RIGHT,
            LEFT - 6.0,
            yy + 4.0
        );
        v += y_step;
    }
    let mut t = 0.0;
    while t <= x_max + 1e-9 {
        let xx = x(t);
        let _ = writeln!(
            out,
            r##"<line x1="{xx:.1}" y1="{TOP}" x2="{xx:.1}" y2="{:.1}" stroke="#f0f0f0"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{t}</text>"##,
            TOP + ph,
            TOP + ph + 16.0
        );
        t += x_step;
    }
    let _ = writeln!(
        out,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">capture time (s)</text>"#,
        LEFT + pw / 2.0,
        HEIGHT - 10.0
    );
    let _ = writeln!(
        out,
        r#"<text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">identities alive</text>"#,
        TOP + ph / 2.0
    );
    // One step line per run.
    for (i, s) in series.iter().enumerate() {
        let mut path = String::new();
        let mut last: Option<f64> = None;
        for &(t, v) in &s.points {
            let (xx, yy) = (x(t as f64), y(v as f64));
            match last {
                None => {
                    let _ = write!(path, "M{xx:.1},{yy:.1}");
                }
                Some(prev) => {
                    let _ = write!(path, " L{xx:.1},{prev:.1} L{xx:.1},{yy:.1}");
                }
            }
            last = Some(yy);
        }
        let colour = colour(s.mode);
        let _ = writeln!(
            out,
            r#"<path d="{path}" fill="none" stroke="{colour}" stroke-width="1.8"/>"#
        );
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let end = s.points.last().map_or(0, |p| p.1);
        let _ = writeln!(
            out,
            r#"<line x1="{:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{colour}" stroke-width="3"/><text x="{:.1}" y="{:.1}">{} (end: {end})</text>"#,
            LEFT + 12.0,
            LEFT + 36.0,
            LEFT + 42.0,
            ly + 4.0,
            s.mode.name()
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_step(97.0, 8.0), 20.0);
        assert_eq!(nice_step(3.0, 8.0), 1.0);
        assert_eq!(nice_step(12_000.0, 6.0), 2000.0);
    }

    #[test]
    fn every_series_is_drawn_and_text_is_escaped() {
        let mut a = Series::new(IdentityMode::Selector);
        let mut b = Series::new(IdentityMode::PerIp);
        for t in 0..10 {
            a.push(t, 3);
            b.push(t, 3 + t as usize * 10);
        }
        let svg = svg("a<b & c", &[a, b]);
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<path ").count(), 2);
        assert!(svg.contains("a&lt;b &amp; c"));
        assert!(svg.contains("per-ip (end: 93)"));
    }
}
