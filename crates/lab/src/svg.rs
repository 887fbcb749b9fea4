//! Charts as standalone SVG: line charts of rates over time and horizontal
//! bar charts. Plain SVG 1.1 with inline styles, so a chart renders the same
//! embedded in the HTML report, opened alone, or converted to PNG.

use std::fmt::Write;

/// Escapes text for XML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A line in a line chart.
pub struct Line<'a> {
    /// Legend entry.
    pub name: &'a str,
    /// CSS colour.
    pub color: &'a str,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
}

/// A bar in a bar chart.
pub struct Bar<'a> {
    /// Label left of the bar.
    pub label: String,
    /// Length.
    pub value: f64,
    /// CSS colour.
    pub color: &'a str,
    /// Text right of the bar (default: the value).
    pub note: Option<String>,
}

const W: f64 = 720.0;
const FONT: &str = "font-family=\"DejaVu Sans, Liberation Sans, Arial, sans-serif\"";

/// A "nice" step for about `n` ticks over `max`.
fn nice_step(max: f64, n: f64) -> f64 {
    if max <= 0.0 || !max.is_finite() {
        return 1.0;
    }
    let raw = max / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let nice = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else if v.abs() >= 0.1 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// A line chart with axes, ticks and a legend. `id` names the chart in the
/// page (`data-chart`), which tests use to find it.
pub fn line_chart(id: &str, title: &str, x_label: &str, y_label: &str, lines: &[Line]) -> String {
    let h = 300.0;
    let (left, right, top, bottom) = (64.0, 16.0, 40.0, 48.0);
    let pw = W - left - right;
    let ph = h - top - bottom;
    let xmax = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .fold(0.0f64, f64::max)
        .max(1e-3);
    let ymax_raw = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let ystep = nice_step(ymax_raw.max(1e-9), 5.0);
    let ymax = (ymax_raw / ystep).ceil().max(1.0) * ystep;
    let xstep = nice_step(xmax, 8.0);
    let x = |v: f64| left + v / xmax * pw;
    let y = |v: f64| top + ph - v / ymax * ph;
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" data-chart=\"{id}\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" {FONT} font-size=\"12\">"
    );
    let _ = write!(s, "<rect width=\"{W}\" height=\"{h}\" fill=\"#ffffff\"/>");
    let _ = write!(
        s,
        "<text x=\"{left}\" y=\"22\" font-size=\"15\" font-weight=\"bold\" fill=\"#222\">{}</text>",
        esc(title)
    );
    // Grid and y ticks.
    let mut v = 0.0;
    while v <= ymax + ystep / 2.0 {
        let yy = y(v);
        let _ = write!(
            s,
            "<line x1=\"{left}\" y1=\"{yy:.1}\" x2=\"{:.1}\" y2=\"{yy:.1}\" stroke=\"#e4e4e4\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#555\">{}</text>",
            left + pw,
            left - 6.0,
            yy + 4.0,
            fmt_num(v)
        );
        v += ystep;
    }
    let mut v = 0.0;
    while v <= xmax + 1e-9 {
        let xx = x(v);
        let _ = write!(
            s,
            "<line x1=\"{xx:.1}\" y1=\"{:.1}\" x2=\"{xx:.1}\" y2=\"{:.1}\" stroke=\"#999\"/><text x=\"{xx:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
            top + ph,
            top + ph + 5.0,
            top + ph + 18.0,
            fmt_num(v)
        );
        v += xstep;
    }
    let _ = write!(
        s,
        "<line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{:.1}\" stroke=\"#555\"/><line x1=\"{left}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#555\"/>",
        top + ph,
        top + ph,
        left + pw,
        top + ph
    );
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#333\">{}</text>",
        left + pw / 2.0,
        h - 10.0,
        esc(x_label)
    );
    let _ = write!(
        s,
        "<text transform=\"translate(16 {:.1}) rotate(-90)\" text-anchor=\"middle\" fill=\"#333\">{}</text>",
        top + ph / 2.0,
        esc(y_label)
    );
    for (i, l) in lines.iter().enumerate() {
        if l.points.is_empty() {
            continue;
        }
        let pts: Vec<String> = l
            .points
            .iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x(*a), y(*b)))
            .collect();
        let _ = write!(
            s,
            "<polyline class=\"series\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>",
            l.color,
            pts.join(" ")
        );
        // Markers too: a run shorter than two sampling intervals has a
        // single rate, which a line alone would not show.
        if l.points.len() <= 30 {
            for (a, b) in &l.points {
                let _ = write!(
                    s,
                    "<circle class=\"point\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{}\"/>",
                    x(*a),
                    y(*b),
                    l.color
                );
            }
        }
        let lx = left + pw - 170.0;
        let ly = top + 6.0 + i as f64 * 16.0;
        let _ = write!(
            s,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"3\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#333\">{}</text>",
            ly + 4.0,
            l.color,
            lx + 18.0,
            ly + 9.0,
            esc(l.name)
        );
    }
    s.push_str("</svg>");
    s
}

/// A horizontal bar chart; bars share one scale.
pub fn bar_chart(id: &str, title: &str, unit: &str, bars: &[Bar]) -> String {
    let row = 26.0;
    let (left, top) = (250.0, 40.0);
    let h = top + bars.len() as f64 * row + 28.0;
    let pw = W - left - 130.0;
    let max = bars
        .iter()
        .map(|b| b.value)
        .fold(0.0f64, f64::max)
        .max(1e-12);
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" data-chart=\"{id}\" width=\"{W}\" height=\"{h}\" viewBox=\"0 0 {W} {h}\" {FONT} font-size=\"12\">"
    );
    let _ = write!(s, "<rect width=\"{W}\" height=\"{h}\" fill=\"#ffffff\"/>");
    let _ = write!(
        s,
        "<text x=\"16\" y=\"22\" font-size=\"15\" font-weight=\"bold\" fill=\"#222\">{}</text>",
        esc(title)
    );
    for (i, b) in bars.iter().enumerate() {
        let yy = top + i as f64 * row;
        let len = (b.value.max(0.0) / max * pw).max(1.0);
        let note = b
            .note
            .clone()
            .unwrap_or_else(|| format!("{} {unit}", fmt_num(b.value)));
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#333\">{}</text><rect class=\"bar\" x=\"{left}\" y=\"{:.1}\" width=\"{len:.1}\" height=\"18\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#333\">{}</text>",
            left - 8.0,
            yy + 13.0,
            esc(&b.label),
            yy,
            b.color,
            left + len + 6.0,
            yy + 13.0,
            esc(&note)
        );
    }
    s.push_str("</svg>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_step(97.0, 5.0), 20.0);
        assert_eq!(nice_step(0.9, 5.0), 0.2);
        assert_eq!(nice_step(4000.0, 8.0), 500.0);
    }

    #[test]
    fn charts_are_well_formed_and_escaped() {
        let l = line_chart(
            "t",
            "a < b",
            "s",
            "n",
            &[Line {
                name: "x&y",
                color: "#000",
                points: vec![(0.0, 1.0), (1.0, 2.0)],
            }],
        );
        assert!(l.starts_with("<svg") && l.ends_with("</svg>"));
        assert!(l.contains("a &lt; b") && l.contains("x&amp;y"));
        assert!(l.contains("<polyline"));
        let b = bar_chart(
            "b",
            "bars",
            "s",
            &[Bar {
                label: "one".into(),
                value: 2.0,
                color: "#f00",
                note: None,
            }],
        );
        assert!(b.contains("class=\"bar\"") && b.contains("2 s"));
    }
}
