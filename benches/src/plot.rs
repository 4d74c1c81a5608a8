//! The charts of `weft-bench --plot FILE.svg`: one line chart per sweep, drawn from the
//! sweep's own result table (the rows it prints), as SVG in pure Rust (plotters' SVG backend
//! with its built-in text metrics: no font files, no system libraries).
//!
//! A [`Chart`] names the table's columns it reads: one for x, one or more for y (each a set
//! of lines, e.g. weft's time and the peer's time of the same row), the columns whose values
//! tell lines apart (`series`), and optionally a column that splits the chart into panels
//! side by side (e.g. one per provider). Of the series columns only those whose value varies
//! over the rows name a line (and not in a row where the column does not apply, `-`); cells that are not numbers (`-`, empty) are left out.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;

/// Size of one panel (plot and legend), in pixels.
const PANEL: (u32, u32) = (960, 480);

/// Width of the legend beside each panel's plot, in pixels.
const LEGEND: u32 = 250;

/// Lines of one chart: how to read them from a table, and how to draw them.
#[derive(Debug, Clone)]
pub struct Chart {
    title: String,
    x: &'static str,
    x_label: String,
    x_log: Option<f64>,
    ys: Vec<(&'static str, &'static str)>,
    y_label: String,
    y_scale: f64,
    y_log: Option<f64>,
    series: Vec<(&'static str, &'static str)>,
    panel: Option<(&'static str, &'static str)>,
}

impl Chart {
    /// A chart titled `title` (the configuration), x read from column `x` and labelled
    /// `x_label` (with its unit).
    pub fn new(title: impl Into<String>, x: &'static str, x_label: impl Into<String>) -> Self {
        Chart {
            title: title.into(),
            x,
            x_label: x_label.into(),
            x_log: None,
            ys: Vec::new(),
            y_label: String::new(),
            y_scale: 1.0,
            y_log: None,
            series: Vec::new(),
            panel: None,
        }
    }

    /// The y axis: its label (with its unit) and the factor the cells are divided by
    /// (`1e6` draws msg/s as M msg/s).
    pub fn y_axis(mut self, label: impl Into<String>, scale: f64) -> Self {
        self.y_label = label.into();
        self.y_scale = scale;
        self
    }

    /// Lines whose y is column `column`; `name` prefixes their legend entries when the chart
    /// has several y columns (`""` for none).
    pub fn y(mut self, column: &'static str, name: &'static str) -> Self {
        self.ys.push((column, name));
        self
    }

    /// One line per value of `column` (when it varies); `label` is its legend text, `{}`
    /// standing for the value (`"{} ranks"`).
    pub fn series(mut self, column: &'static str, label: &'static str) -> Self {
        self.series.push((column, label));
        self
    }

    /// One panel per value of `column`, captioned by `label` (`{}` for the value).
    pub fn panels(mut self, column: &'static str, label: &'static str) -> Self {
        self.panel = Some((column, label));
        self
    }

    /// Logarithmic x axis, a label at each power of ten (message sizes).
    pub fn log_x(mut self) -> Self {
        self.x_log = Some(10.0);
        self
    }

    /// Logarithmic x axis, a label at each power of two (thread and pair counts).
    pub fn log2_x(mut self) -> Self {
        self.x_log = Some(2.0);
        self
    }

    /// Logarithmic y axis, a label at each power of ten.
    pub fn log_y(mut self) -> Self {
        self.y_log = Some(10.0);
        self
    }

    /// Writes the chart of `rows` (cells under `columns`) to `path` as SVG.
    pub fn write_svg(&self, columns: &[&str], rows: &[Vec<String>], path: &Path) -> Result<(), String> {
        let svg = self.svg(columns, rows)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::write(path, svg).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The chart of `rows` as an SVG document.
    pub fn svg(&self, columns: &[&str], rows: &[Vec<String>]) -> Result<String, String> {
        let panels = self.lines(columns, rows)?;
        if panels.iter().all(|p| p.lines.is_empty()) {
            return Err(format!("plot {:?}: no row has numbers to draw", self.title));
        }
        let mut out = String::new();
        {
            let size = (PANEL.0 * panels.len() as u32, PANEL.1 + 40);
            let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
            self.draw(&root, &panels).map_err(|e| format!("plot {:?}: {e}", self.title))?;
            root.present().map_err(|e| format!("plot {:?}: {e}", self.title))?;
        }
        Ok(out)
    }

    /// Groups the rows into panels and lines (points sorted by x, in axis coordinates).
    fn lines(&self, columns: &[&str], rows: &[Vec<String>]) -> Result<Vec<Panel>, String> {
        let col = |name: &str| columns.iter().position(|c| *c == name).ok_or_else(|| format!("plot: the table has no column {name:?}"));
        let x = col(self.x)?;
        let ys: Vec<(usize, &str)> = self.ys.iter().map(|&(c, n)| col(c).map(|i| (i, n))).collect::<Result<_, _>>()?;
        let series: Vec<(usize, &str)> = self.series.iter().map(|&(c, l)| col(c).map(|i| (i, l))).collect::<Result<_, _>>()?;
        let panel = self.panel.map(|(c, l)| col(c).map(|i| (i, l))).transpose()?;
        // Only series columns whose value changes over the rows name a line.
        let varying: Vec<(usize, &str)> = series.into_iter().filter(|&(i, _)| rows.iter().any(|r| r[i] != rows[0][i])).collect();
        let mut panels: Vec<Panel> = Vec::new();
        for r in rows {
            let caption = panel.map(|(i, l)| l.replace("{}", &r[i])).unwrap_or_default();
            let p = match panels.iter().position(|p| p.caption == caption) {
                Some(p) => p,
                None => {
                    panels.push(Panel { caption, lines: Vec::new() });
                    panels.len() - 1
                }
            };
            let Some(xv) = axis_value(&r[x], 1.0, self.x_log) else { continue };
            for &(yi, name) in &ys {
                let Some(yv) = axis_value(&r[yi], self.y_scale, self.y_log) else { continue };
                let mut parts: Vec<String> = Vec::new();
                if ys.len() > 1 && !name.is_empty() {
                    parts.push(name.to_string());
                }
                // A series column that does not apply to this row (`-`, empty) names nothing.
                parts.extend(varying.iter().filter(|&&(i, _)| !matches!(r[i].as_str(), "-" | "")).map(|&(i, l)| l.replace("{}", &r[i])));
                let label = parts.join(", ");
                let lines = &mut panels[p].lines;
                match lines.iter_mut().find(|l| l.label == label) {
                    Some(l) => l.points.push((xv, yv)),
                    None => lines.push(Line { label, points: vec![(xv, yv)] }),
                }
            }
        }
        for l in panels.iter_mut().flat_map(|p| p.lines.iter_mut()) {
            l.points.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        Ok(panels)
    }

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>, panels: &[Panel]) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let root = root.titled(&self.title, ("sans-serif", 20))?;
        for (area, panel) in root.split_evenly((1, panels.len())).iter().zip(panels) {
            let (w, _) = area.dim_in_pixel();
            let (area, legend) = area.split_horizontally(w.saturating_sub(LEGEND));
            let points = || panel.lines.iter().flat_map(|l| l.points.iter());
            let (xr, yr) = (range(points().map(|p| p.0), self.x_log, false), range(points().map(|p| p.1), self.y_log, true));
            let mut chart = ChartBuilder::on(&area)
                .caption(&panel.caption, ("sans-serif", 16))
                .margin(12)
                .x_label_area_size(48)
                .y_label_area_size(72)
                .build_cartesian_2d(xr.clone(), yr.clone())?;
            let (x_log, y_log) = (self.x_log, self.y_log);
            let fx = move |v: &f64| tick(*v, x_log);
            let fy = move |v: &f64| tick(*v, y_log);
            chart
                .configure_mesh()
                .x_desc(&self.x_label)
                .y_desc(&self.y_label)
                .x_labels(labels(&xr, x_log))
                .y_labels(labels(&yr, y_log))
                .x_label_formatter(&fx)
                .y_label_formatter(&fy)
                .light_line_style(WHITE.mix(0.0))
                .draw()?;
            for (k, line) in panel.lines.iter().enumerate() {
                let color = Palette99::pick(k).to_rgba();
                chart.draw_series(LineSeries::new(line.points.iter().copied(), color.stroke_width(2)))?;
                chart.draw_series(line.points.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
                // The legend: beside the plot, never over it.
                if !line.label.is_empty() {
                    let y = 48 + 20 * k as i32;
                    legend.draw(&PathElement::new(vec![(4, y), (28, y)], color.stroke_width(2)))?;
                    legend.draw(&Circle::new((16, y), 3, color.filled()))?;
                    legend.draw(&Text::new(line.label.as_str(), (36, y - 7), ("sans-serif", 13)))?;
                }
            }
        }
        Ok(())
    }
}

/// One panel: its caption and its lines.
#[derive(Debug)]
struct Panel {
    caption: String,
    lines: Vec<Line>,
}

/// One line: its legend text and its points (axis coordinates).
#[derive(Debug)]
struct Line {
    label: String,
    points: Vec<(f64, f64)>,
}

/// A cell as an axis coordinate: the number divided by `scale`, its logarithm on a log axis
/// (of that base); `None` for a cell that is no number, or not positive on a log axis.
fn axis_value(cell: &str, scale: f64, log: Option<f64>) -> Option<f64> {
    let v = cell.trim().parse::<f64>().ok().filter(|v| v.is_finite())? / scale;
    match log {
        Some(base) if v > 0.0 => Some(v.ln() / base.ln()),
        Some(_) => None,
        None => Some(v),
    }
}

/// The axis range that holds `values` with a margin; a linear y axis starts at 0 when
/// `from_zero` (rates and times are read against zero).
fn range(values: impl Iterator<Item = f64>, log: Option<f64>, from_zero: bool) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !lo.is_finite() {
        return 0.0..1.0;
    }
    if log.is_some() {
        // A tenth of a power of margin, and at least one power in all.
        let (lo, hi) = (lo - 0.1, hi + 0.1);
        let pad = (1.0 - (hi - lo)).max(0.0) / 2.0;
        return (lo - pad)..(hi + pad);
    }
    let lo = if from_zero { lo.min(0.0) } else { lo };
    let span = if hi > lo { hi - lo } else { hi.abs().max(1.0) };
    if from_zero {
        lo..(hi + span * 0.08)
    } else {
        (lo - span * 0.05)..(hi + span * 0.05)
    }
}

/// How many labels an axis gets: one per power on a log axis (plotters then puts them on
/// whole powers), ten on a linear one.
fn labels(r: &std::ops::Range<f64>, log: Option<f64>) -> usize {
    if log.is_some() {
        ((r.end - r.start).floor() as usize + 1).max(2)
    } else {
        10
    }
}

/// A tick label: the value (base^v on a log axis) with three significant digits and an SI
/// suffix (k, M, G).
fn tick(v: f64, log: Option<f64>) -> String {
    let v = log.map_or(v, |base| base.powf(v));
    let (x, suffix) = match v.abs() {
        a if a >= 1e9 => (v / 1e9, "G"),
        a if a >= 1e6 => (v / 1e6, "M"),
        a if a >= 1e3 => (v / 1e3, "k"),
        _ => (v, ""),
    };
    let s = format!(
        "{:.*}",
        if x.abs() >= 100.0 || x == x.round() {
            0
        } else if x.abs() >= 10.0 {
            1
        } else {
            2
        },
        x
    );
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    format!("{s}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(data: &[&[&str]]) -> Vec<Vec<String>> {
        data.iter().map(|r| r.iter().map(|c| c.to_string()).collect()).collect()
    }

    /// The multirate shape: one line per mode, x = pairs, y in M msg/s; the constant column
    /// (`progress`) names no line, and the empty ratio cell is not drawn.
    #[test]
    fn one_line_per_varying_series_value() {
        let columns = ["mode", "progress", "pairs", "msg_rate", "ratio"];
        let r = rows(&[
            &["thread", "concurrent", "1", "6500000", "1.00"],
            &["process", "concurrent", "1", "6400000", ""],
            &["thread", "concurrent", "2", "8100000", "0.96"],
            &["process", "concurrent", "2", "8300000", ""],
        ]);
        let chart = Chart::new("multirate, 2 cores", "pairs", "pairs (T)")
            .y("msg_rate", "")
            .y_axis("message rate (M msg/s)", 1e6)
            .series("mode", "{} mode")
            .series("progress", "{}");
        let panels = chart.lines(&columns, &r).unwrap();
        assert_eq!(panels.len(), 1);
        let labels: Vec<&str> = panels[0].lines.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(labels, ["thread mode", "process mode"]);
        assert_eq!(panels[0].lines[0].points, [(1.0, 6.5), (2.0, 8.1)]);

        let svg = chart.svg(&columns, &r).unwrap();
        for text in ["multirate, 2 cores", "pairs (T)", "message rate (M msg/s)", "thread mode", "process mode"] {
            assert!(svg.contains(text), "{text:?} missing from the SVG");
        }
        let lines = svg.split("<polyline").filter(|p| p.split('>').next().is_some_and(|tag| tag.contains("stroke-width=\"2\""))).count();
        assert_eq!(lines, 2 + 2, "two lines and their two legend marks");
    }

    /// The all-to-all chart: two y columns (weft, the peer) per row, a panel per provider,
    /// log axes; a `-` cell (no peer measured) and a value a log axis cannot show are left out.
    #[test]
    fn panels_several_y_columns_and_log_axes() {
        let columns = ["provider", "ranks", "size", "round_us", "ompi_round_us"];
        let r = rows(&[
            &["shm", "2", "1024", "5.0", "2.0"],
            &["shm", "2", "65536", "20.0", "6.6"],
            &["tcp", "2", "1024", "50.0", "-"],
            &["tcp", "2", "65536", "76.4", "0"],
        ]);
        let chart = crate::alltoall::chart(2);
        let panels = chart.lines(&columns, &r).unwrap();
        let captions: Vec<&str> = panels.iter().map(|p| p.caption.as_str()).collect();
        assert_eq!(captions, ["provider shm", "provider tcp"]);
        let shm: Vec<&str> = panels[0].lines.iter().map(|l| l.label.as_str()).collect();
        assert_eq!(shm, ["weft", "Open MPI"], "ranks is constant: no part of the label");
        assert_eq!(panels[1].lines.len(), 1, "tcp has no Open MPI point");
        let (x, y) = panels[0].lines[0].points[1];
        assert!((x - 65536f64.log10()).abs() < 1e-12 && (y - 20f64.log10()).abs() < 1e-12);
        let svg = chart.svg(&columns, &r).unwrap();
        assert!(svg.contains("provider shm") && svg.contains("provider tcp") && svg.contains("time per round (µs)"));
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let chart = Chart::new("t", "threads", "threads").y("ops", "");
        let err = chart.svg(&["threads", "ops_per_sec"], &rows(&[&["1", "5"]])).unwrap_err();
        assert!(err.contains("no column \"ops\""), "{err}");
        let chart = Chart::new("t", "threads", "threads").y("ops_per_sec", "");
        let err = chart.svg(&["threads", "ops_per_sec"], &rows(&[&["1", "-"]])).unwrap_err();
        assert!(err.contains("no row has numbers"), "{err}");
    }

    #[test]
    fn tick_labels_read_as_numbers() {
        assert_eq!(tick(2.0, Some(10.0)), "100");
        assert_eq!(tick(6.0, Some(10.0)), "1M");
        assert_eq!(tick(3.0, Some(2.0)), "8");
        assert_eq!(tick(3.5e6, None), "3.5M");
        assert_eq!(tick(0.25, None), "0.25");
        assert_eq!(tick(12.5, None), "12.5");
        assert_eq!(tick(65536.0, None), "65.5k");
    }
}
