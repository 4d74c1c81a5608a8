//! `weft-bench idle`: CPU time an idle runtime uses. The pool is started (one task run),
//! then the process sleeps `--seconds`; CPU time (user + system, `getrusage`) over wall time,
//! median of `--runs`.
//!
//! Columns: `ranks,workers,seconds,cpu_percent` (percent of one core).

use std::time::{Duration, Instant};

use crate::report::{median, Output, Table};

/// Options of `weft-bench idle`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Pool workers per rank.
    #[arg(short = 'w', long, default_value_t = 2)]
    workers: usize,
    /// Ranks (each with its own pool).
    #[arg(long, default_value_t = 1)]
    ranks: u32,
    /// Measurement length in seconds (per run).
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    #[command(flatten)]
    out: Output,
}

fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` only writes the struct it is given; all-zero is a valid `rusage`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `RUSAGE_SELF` is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Runs the measurement.
pub fn run(args: &Args) -> Result<(), String> {
    if !(args.seconds > 0.0 && args.seconds < 3600.0) {
        return Err("--seconds must be in (0, 3600)".into());
    }
    let ranks = weft::Runtime::builder().workers(args.workers).build_local(args.ranks).map_err(|e| e.to_string())?;
    for r in &ranks {
        r.block_on(r.spawn(async {})).map_err(|e| e.to_string())?;
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut table = Table::new(&["ranks", "workers", "seconds", "cpu_percent"], &args.out);
    table.progress(args.runs.max(1));
    table.print_header();
    let mut samples = Vec::new();
    let mut walls = Vec::new();
    for run in 0..args.runs.max(1) {
        table.step(|| format!("run {}: {} s asleep", run + 1, args.seconds));
        let (c0, t0) = (cpu_seconds(), Instant::now());
        std::thread::sleep(Duration::from_secs_f64(args.seconds));
        let (cpu, wall) = (cpu_seconds() - c0, t0.elapsed().as_secs_f64());
        samples.push(100.0 * cpu / wall);
        walls.push(wall);
    }
    table.row(vec![args.ranks.to_string(), args.workers.to_string(), format!("{:.3}", median(&walls)), format!("{:.4}", median(&samples))]);
    table.finish();
    Ok(())
}
