//! `weft-bench idle`: CPU time an idle runtime uses, and how long a parked receiver takes
//! to wake. The pool is started (one task run), then the process sleeps `--seconds`; CPU
//! time (user + system, `getrusage`) over wall time, median of `--runs`. Then, with two or
//! more ranks, the wake-up: a thread of rank 1 blocks in `recv` from rank 0 and stays parked
//! for 50 ms (past every spin and yield window, and long enough for libfabric's watcher to
//! fall asleep), then rank 0 sends; `wake_us` is the time from the send to the receiver
//! running again, median of 10.
//!
//! Columns: `provider,ranks,workers,seconds,cpu_percent` (percent of one core), `wake_us`.

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
    /// Provider of the in-process ranks: embedded, or shm / tcp (feature `ofi`).
    #[arg(long, default_value = "embedded")]
    provider: String,
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
    let provider: weft::Provider = args.provider.parse().map_err(|e: weft::Error| e.to_string())?;
    let ranks = weft::Runtime::builder().workers(args.workers).provider(provider).build_local(args.ranks).map_err(|e| e.to_string())?;
    for r in &ranks {
        r.block_on(r.spawn(async {})).map_err(|e| e.to_string())?;
    }
    std::thread::sleep(Duration::from_millis(300));
    let mut table = Table::new(&["provider", "ranks", "workers", "seconds", "cpu_percent", "wake_us"], &args.out);
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
    let wake = if ranks.len() >= 2 { format!("{:.1}", wake_up_us(&ranks)?) } else { "-".into() };
    table.row(vec![
        provider.to_string(),
        args.ranks.to_string(),
        args.workers.to_string(),
        format!("{:.3}", median(&walls)),
        format!("{:.4}", median(&samples)),
        wake,
    ]);
    table.finish();
    Ok(())
}

/// Median over 10 tries of the time from rank 0's send to rank 1's receiver, parked in
/// `recv` for 50 ms before it, running again (module docs).
fn wake_up_us(ranks: &[weft::Runtime]) -> Result<f64, String> {
    const TRIES: usize = 10;
    let e = |e: weft::Error| e.to_string();
    let (w0, w1) = (ranks[0].world(), ranks[1].world());
    let mut samples = Vec::with_capacity(TRIES);
    std::thread::scope(|s| -> Result<(), String> {
        let receiver = s.spawn(move || -> Result<Vec<Instant>, weft::Error> {
            (0..TRIES)
                .map(|_| {
                    w1.recv(Vec::<u8>::new(), weft::Source::Rank(0), weft::Tag::Is(9))?;
                    Ok(Instant::now())
                })
                .collect()
        });
        let mut sent = Vec::with_capacity(TRIES);
        for _ in 0..TRIES {
            std::thread::sleep(Duration::from_millis(50));
            sent.push(Instant::now());
            w0.send(Vec::<u8>::new(), 1, 9).map_err(e)?;
        }
        let woke = receiver.join().map_err(|_| "the receiver panicked".to_string())?.map_err(e)?;
        samples.extend(woke.iter().zip(&sent).map(|(w, s)| w.duration_since(*s).as_secs_f64() * 1e6));
        Ok(())
    })?;
    Ok(median(&samples))
}
