//! Output shared by every `weft-bench` subcommand: a readable table by default, with
//! `--csv` one header line and one row per configuration, with `--markdown` a markdown table
//! once the sweep is done; `--plot FILE.svg` draws the sweep ([`crate::plot`]). While a
//! sweep runs, a progress bar on stderr counts its measurements (drawn only when stderr is a
//! terminal, so never in redirected output, and never on stdout).

use std::cell::Cell;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::plot::Chart;

/// The output options of every sweep.
#[derive(Debug, Default, clap::Args)]
pub struct Output {
    /// CSV output: one header line, then one row per configuration.
    #[arg(long, conflicts_with = "markdown")]
    pub csv: bool,
    /// Markdown output: one table once the sweep is done; columns with the same value in
    /// every row are stated once above it.
    #[arg(long)]
    pub markdown: bool,
}

impl Output {
    /// A line about the run (configuration, machine state): on stdout with the table, on
    /// stderr with `--csv` (stdout is then only CSV), as a plain line with `--markdown`.
    pub fn note(&self, line: &str) {
        if self.csv {
            eprintln!("{line}");
        } else if self.markdown {
            println!("{}\n", line.trim_start_matches('#').trim());
        } else {
            println!("{line}");
        }
    }
}

/// The `--plot` option of the sweeps that draw a chart.
#[derive(Debug, Default, clap::Args)]
pub struct PlotTo {
    /// Also draw the sweep as an SVG line chart into this file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// A result table: fixed columns, rows of already-formatted cells.
#[derive(Debug)]
pub struct Table<'o> {
    out: &'o Output,
    columns: Vec<&'static str>,
    rows: Vec<Vec<String>>,
    bar: Option<ProgressBar>,
    /// A measurement has started (the next step ends it).
    measuring: Cell<bool>,
}

impl<'o> Table<'o> {
    /// A table with these column names (also the CSV header), printed as `out` says.
    pub fn new(columns: &[&'static str], out: &'o Output) -> Self {
        Table { out, columns: columns.to_vec(), rows: Vec::new(), bar: None, measuring: Cell::new(false) }
    }

    /// Shows a progress bar of `steps` measurements on stderr, when stderr is a terminal.
    pub fn progress(&mut self, steps: usize) {
        self.progress_to(steps, ProgressDrawTarget::stderr());
    }

    fn progress_to(&mut self, steps: usize, target: ProgressDrawTarget) {
        let bar = ProgressBar::with_draw_target(Some(steps as u64), target);
        let style = ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg} (about {eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        bar.set_style(style);
        self.bar = Some(bar);
    }

    /// A measurement starts; `what` names its configuration. The bar counts the ones done:
    /// the one before this (if any) is.
    pub fn step(&self, what: impl FnOnce() -> String) {
        if let Some(bar) = &self.bar {
            bar.set_message(what());
            if self.measuring.replace(true) {
                bar.inc(1);
            }
        }
    }

    /// Prints the header line (CSV) or title line (table); nothing for markdown, which is
    /// printed whole by [`Table::finish`].
    pub fn print_header(&self) {
        if self.out.csv {
            self.emit(&self.columns.join(","));
        } else if !self.out.markdown {
            self.emit(&self.format_line(&self.columns.iter().map(|c| c.to_string()).collect::<Vec<_>>()));
        }
    }

    /// Appends one row and prints it (table, CSV); `cells` must have one entry per column.
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.columns.len(), "row width must match the header");
        let line = if self.out.csv {
            Some(cells.join(","))
        } else if self.out.markdown {
            None
        } else {
            Some(self.format_line(&cells))
        };
        if let Some(line) = line {
            self.emit(&line);
        }
        self.rows.push(cells);
    }

    /// Ends the sweep: removes the progress bar and prints the markdown table (`--markdown`).
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.out.markdown {
            print!("{}", self.markdown());
        }
    }

    /// [`Table::finish`], then draws `chart` from the rows into the `--plot` file, if any.
    pub fn finish_with_plot(&self, chart: &Chart, plot: &PlotTo) -> Result<(), String> {
        self.finish();
        match &plot.plot {
            Some(path) => self.plot(chart, path),
            None => Ok(()),
        }
    }

    /// Draws `chart` from the rows into `path` (SVG).
    pub fn plot(&self, chart: &Chart, path: &Path) -> Result<(), String> {
        chart.write_svg(&self.columns, &self.rows, path)
    }

    /// The rows as a markdown table; columns that hold one value in every row become a line
    /// above it (`pattern: pairwise, size: 0, ...`).
    fn markdown(&self) -> String {
        let same = |i: usize| self.rows.len() > 1 && self.rows.iter().all(|r| r[i] == self.rows[0][i]);
        let (fixed, varying): (Vec<usize>, Vec<usize>) = (0..self.columns.len()).partition(|&i| same(i));
        let mut s = String::new();
        if !fixed.is_empty() {
            let cells: Vec<String> = fixed.iter().map(|&i| format!("{}: {}", self.columns[i], self.rows[0][i])).collect();
            let _ = writeln!(s, "{}\n", cells.join(", "));
        }
        let line = |cells: Vec<&str>| format!("| {} |\n", cells.join(" | "));
        s += &line(varying.iter().map(|&i| self.columns[i]).collect());
        s += &line(varying.iter().map(|_| "---").collect());
        for r in &self.rows {
            s += &line(varying.iter().map(|&i| if r[i].is_empty() { "-" } else { r[i].as_str() }).collect());
        }
        s.push('\n');
        s
    }

    /// Prints one line on stdout, with the progress bar (on stderr) out of its way.
    fn emit(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }

    fn format_line(&self, cells: &[String]) -> String {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            let w = self.columns[i].len().max(12);
            let _ = write!(s, "{:>w$} ", c, w = w);
        }
        s
    }
}

/// Median of a non-empty sample (sorts a copy).
pub fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Splits a comma list (`1,2,4`) into values; used by every sweep option.
pub fn parse_list<T: std::str::FromStr>(s: &str) -> Result<Vec<T>, String>
where
    T::Err: std::fmt::Display,
{
    s.split(',').filter(|p| !p.trim().is_empty()).map(|p| p.trim().parse::<T>().map_err(|e| format!("bad list item {p:?}: {e}"))).collect()
}

/// This binary and the `weftrun` beside it (the two are built into one target directory),
/// for the sweeps that run their ranks as real processes.
pub fn self_and_weftrun() -> Result<(PathBuf, PathBuf), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let weftrun = exe.with_file_name("weftrun");
    if !weftrun.exists() {
        return Err(format!(
            "{} not found; build it first: cargo build --release -p weft-launcher --features ofi --bin weftrun",
            weftrun.display()
        ));
    }
    Ok((exe, weftrun))
}

/// Runs this binary as a job of `n` ranks through `weftrun` on provider `p` (stopped after
/// `timeout` seconds), with `args` (the subcommand and its worker options); returns the
/// value of rank 0's `KEY <value>` line. `what` names the job in errors.
pub fn weftrun_job(p: weft::Provider, n: u32, timeout: u64, args: &[String], what: &str, key: &str) -> Result<f64, String> {
    let stdout = weftrun_output(p, n, timeout, args, what)?;
    rank0_value(&stdout, key).ok_or_else(|| format!("no {key} in the {what} job's output:\n{stdout}"))
}

/// Runs this binary as a job as [`weftrun_job`] does; returns the job's standard output
/// (each line prefixed with its rank by `weftrun`).
pub fn weftrun_output(p: weft::Provider, n: u32, timeout: u64, args: &[String], what: &str) -> Result<String, String> {
    let (exe, weftrun) = self_and_weftrun()?;
    let out = std::process::Command::new(&weftrun)
        .args(["-n", &n.to_string(), "--provider", &p.to_string(), "--timeout", &timeout.to_string()])
        .arg(&exe)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("weftrun: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!("{what} job ({p}, {n} ranks) failed ({}):\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    Ok(stdout)
}

/// The value of rank 0's `KEY <value>` line in a job's output.
pub fn rank0_value(stdout: &str, key: &str) -> Option<f64> {
    let prefix = format!("[0] {key} ");
    stdout.lines().find_map(|l| l.strip_prefix(prefix.as_str()).and_then(|v| v.trim().parse::<f64>().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Markdown: the columns that never change are stated once, an empty cell reads `-`.
    #[test]
    fn markdown_folds_constant_columns() {
        let out = Output { csv: false, markdown: true };
        let mut t = Table::new(&["mode", "size", "msg_rate", "ratio"], &out);
        t.rows.push(vec!["thread".into(), "0".into(), "6500000".into(), "1.00".into()]);
        t.rows.push(vec!["process".into(), "0".into(), "6400000".into(), String::new()]);
        assert_eq!(
            t.markdown(),
            "size: 0\n\n| mode | msg_rate | ratio |\n| --- | --- | --- |\n| thread | 6500000 | 1.00 |\n| process | 6400000 | - |\n\n"
        );
    }

    /// The bar counts the measurements done (a step starts one and ends the one before), names
    /// the one running, and is gone when the sweep ends (drawn to a hidden target here: the
    /// test's stderr is no terminal).
    #[test]
    fn progress_counts_steps_and_finishes() {
        let out = Output::default();
        let mut t = Table::new(&["a"], &out);
        t.progress_to(3, ProgressDrawTarget::hidden());
        let bar = t.bar.clone().expect("a bar");
        t.step(|| "step 0".into());
        assert_eq!((bar.position(), bar.message().as_str()), (0, "step 0"), "the first is running, none done");
        t.step(|| "step 1".into());
        t.step(|| "step 2".into());
        assert_eq!((bar.position(), bar.message().as_str()), (2, "step 2"));
        t.finish();
        assert!(bar.is_finished());
    }
}
