//! Output shared by every `weft-bench` subcommand: a readable table by default, or with
//! `--csv` one header line and one row per configuration.

use std::fmt::Write as _;

/// A result table: fixed columns, rows of already-formatted cells.
#[derive(Debug)]
pub struct Table {
    columns: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column names (also the CSV header).
    pub fn new(columns: &[&'static str]) -> Self {
        Table { columns: columns.to_vec(), rows: Vec::new() }
    }

    /// Appends one row; `cells` must have one entry per column.
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.columns.len(), "row width must match the header");
        self.rows.push(cells);
    }

    /// Prints the header once (CSV) or a title line (table), then nothing else; used by
    /// sweeps that stream their rows as they are measured.
    pub fn print_header(&self, csv: bool) {
        if csv {
            println!("{}", self.columns.join(","));
        } else {
            println!("{}", self.format_line(&self.columns.iter().map(|c| c.to_string()).collect::<Vec<_>>()));
        }
    }

    /// Prints the last row added, in the chosen format.
    pub fn print_last(&self, csv: bool) {
        if let Some(r) = self.rows.last() {
            if csv {
                println!("{}", r.join(","));
            } else {
                println!("{}", self.format_line(r));
            }
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
