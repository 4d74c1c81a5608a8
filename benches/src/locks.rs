//! `weft-bench locks`: lock acquisition throughput and latency versus thread count ([Amer 2019,
//! Fig. 2(a)]): each iteration acquires one shared lock, touches `--lines` random cache lines of
//! a shared array, and releases. Every protocol of `weft::lock` runs through its `RawLock`
//! (one pinned node per thread, reused), `std::sync::Mutex` and `parking_lot::Mutex` through
//! their guards, all behind one trait ([`BenchLock`]).
//!
//! Each point runs `--millis` ms, `--runs` times; the median is reported. Threads above the
//! core count are oversubscribed (a real case for MPI+threads runtimes, reported as is).
//! `ops_per_sec` counts acquisitions of all threads; `latency_ns` is the mean time one thread
//! spends per acquisition (waiting + critical section), `threads * elapsed / ops`.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use weft::lock::{Clh, DynLock, Hmcs, LockKind, Mcs, Priority, RawLock, Tas, Ticket};

use crate::plot::Chart;
use crate::report::{median, parse_list, Output, PlotTo, Table};

/// Options of `weft-bench locks`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Thread counts to sweep (comma list).
    #[arg(short = 't', long, default_value = "1,2,4,8")]
    threads: String,
    /// Protocols to run (comma list): tas, ticket, mcs, clh, hmcs, p-hmcs-mcs, p-mcs-mcs,
    /// p-ticket-ticket, `dyn-<kind>` (through `DynLock`), std, parking_lot; or `all`.
    #[arg(short = 'p', long, default_value = "all")]
    protocols: String,
    /// Duration of one measurement, in milliseconds.
    #[arg(long, default_value_t = 200)]
    millis: u64,
    /// Repetitions per point (the median is reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Random cache lines touched inside the critical section.
    #[arg(long, default_value_t = 10)]
    lines: usize,
    /// Size of the shared array, in cache lines.
    #[arg(long, default_value_t = 4096)]
    array: usize,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
}

const ALL: &[&str] =
    &["tas", "ticket", "mcs", "clh", "hmcs", "p-hmcs-mcs", "p-mcs-mcs", "p-ticket-ticket", "dyn-mcs", "std", "parking_lot"];

/// One cache line of the shared array.
#[repr(align(64))]
struct Line(AtomicU64);

/// A lock as the benchmark uses it: per-thread state, and "run `f` holding the lock".
trait BenchLock: Sync {
    /// Per-thread state (the pinned node of a queue lock).
    type Local;
    fn local(&self) -> Self::Local;
    fn with(&self, local: &mut Self::Local, f: impl FnOnce());
}

/// A `weft::lock` protocol through its raw API.
struct Raw<L>(L);

impl<L: RawLock> BenchLock for Raw<L> {
    type Local = Pin<Box<L::Node>>;
    fn local(&self) -> Self::Local {
        Box::pin(L::Node::default())
    }
    #[inline]
    fn with(&self, local: &mut Self::Local, f: impl FnOnce()) {
        self.0.lock(local.as_ref());
        f();
        // SAFETY: acquired just above with the same node.
        unsafe { self.0.unlock(local.as_ref()) };
    }
}

impl BenchLock for std::sync::Mutex<()> {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn with(&self, _: &mut (), f: impl FnOnce()) {
        let _g = self.lock().unwrap_or_else(|e| e.into_inner());
        f();
    }
}

impl BenchLock for parking_lot::Mutex<()> {
    type Local = ();
    fn local(&self) {}
    #[inline]
    fn with(&self, _: &mut (), f: impl FnOnce()) {
        let _g = self.lock();
        f();
    }
}

/// One measurement: `threads` threads for `millis`; returns (ops/s, ns per op per thread).
fn measure<B: BenchLock>(lock: &B, threads: usize, args: &Args, data: &[Line]) -> (f64, f64) {
    let stop = AtomicBool::new(false);
    let barrier = Barrier::new(threads + 1);
    let lines = args.lines;
    let (total, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (stop, barrier) = (&stop, &barrier);
                s.spawn(move || {
                    let mut local = lock.local();
                    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ (t as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
                    let mut ops = 0u64;
                    barrier.wait();
                    while !stop.load(Ordering::Relaxed) {
                        lock.with(&mut local, || {
                            for _ in 0..lines {
                                // xorshift64
                                rng ^= rng << 13;
                                rng ^= rng >> 7;
                                rng ^= rng << 17;
                                let l = &data[(rng % data.len() as u64) as usize].0;
                                // Relaxed load + store: plain accesses, ordered by the lock.
                                l.store(l.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
                            }
                        });
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(args.millis));
        stop.store(true, Ordering::Relaxed);
        let elapsed = start.elapsed();
        let total: u64 = handles.into_iter().map(|h| h.join().expect("bench thread panicked")).sum();
        (total, elapsed)
    });
    let secs = elapsed.as_secs_f64();
    let total = total.max(1) as f64;
    (total / secs, secs * 1e9 * threads as f64 / total)
}

fn point<B: BenchLock>(lock: &B, threads: usize, args: &Args, data: &[Line]) -> (f64, f64) {
    let mut tput = Vec::new();
    let mut lat = Vec::new();
    for _ in 0..args.runs.max(1) {
        let (t, l) = measure(lock, threads, args, data);
        tput.push(t);
        lat.push(l);
    }
    (median(&tput), median(&lat))
}

fn run_protocol(name: &str, threads: usize, args: &Args, data: &[Line]) -> Result<(f64, f64), String> {
    Ok(match name {
        "tas" => point(&Raw(Tas::new()), threads, args, data),
        "ticket" => point(&Raw(Ticket::new()), threads, args, data),
        "mcs" => point(&Raw(Mcs::new()), threads, args, data),
        "clh" => point(&Raw(Clh::new()), threads, args, data),
        "hmcs" => point(&Raw(Hmcs::new()), threads, args, data),
        "p-hmcs-mcs" => point(&Raw(Priority::<Hmcs, Mcs>::default()), threads, args, data),
        "p-mcs-mcs" => point(&Raw(Priority::<Mcs, Mcs>::default()), threads, args, data),
        "p-ticket-ticket" => point(&Raw(Priority::<Ticket, Ticket>::default()), threads, args, data),
        "std" => point(&std::sync::Mutex::new(()), threads, args, data),
        "parking_lot" => point(&parking_lot::Mutex::new(()), threads, args, data),
        other => match other.strip_prefix("dyn-") {
            Some(k) => {
                let kind: LockKind = k.parse().map_err(|e| format!("{e}"))?;
                point(&Raw(DynLock::new(kind)), threads, args, data)
            }
            None => return Err(format!("unknown protocol {other:?}; expected one of {}", ALL.join(", "))),
        },
    })
}

/// Runs the sweep and prints it.
pub fn run(args: &Args) -> Result<(), String> {
    let threads: Vec<usize> = parse_list(&args.threads).map_err(|e| format!("locks: -t: {e}"))?;
    let protocols: Vec<String> = if args.protocols.trim() == "all" {
        ALL.iter().map(|s| s.to_string()).collect()
    } else {
        args.protocols.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect()
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let config = format!(
        "# locks: threads={:?} protocols={} millis={} runs={} lines={} array={} lines ({} KiB) cores={} hmcs_levels={}",
        threads,
        protocols.join(","),
        args.millis,
        args.runs,
        args.lines,
        args.array,
        args.array * 64 / 1024,
        cores,
        Hmcs::new().depth(),
    );
    args.out.note(&config);
    let data: Vec<Line> = (0..args.array.max(1)).map(|_| Line(AtomicU64::new(0))).collect();
    let mut table = Table::new(&["bench", "protocol", "threads", "ops_per_sec", "latency_ns"], &args.out);
    table.progress(threads.len() * protocols.len());
    table.print_header();
    let mut results: Vec<(String, usize, f64)> = Vec::new();
    for &t in &threads {
        for p in &protocols {
            table.step(|| format!("{p}, {t} threads"));
            let (ops, lat) = run_protocol(p, t, args, &data).map_err(|e| format!("locks: {e}"))?;
            table.row(vec!["locks".into(), p.clone(), t.to_string(), format!("{ops:.0}"), format!("{lat:.1}")]);
            results.push((p.clone(), t, ops));
        }
    }
    let chart = Chart::new(
        format!("locks: {} random lines of {} KiB per critical section, {cores} cores", args.lines, args.array * 64 / 1024),
        "threads",
        "threads",
    )
    .y("ops_per_sec", "")
    .y_axis("throughput (M acquisitions/s, all threads)", 1e6)
    .series("protocol", "{}")
    .log_y()
    .log2_x();
    table.finish_with_plot(&chart, &args.plot)?;
    if !args.out.csv && !args.out.markdown {
        println!("# throughput relative to parking_lot (same run)");
        for &t in &threads {
            let Some(base) = results.iter().find(|(p, n, _)| p == "parking_lot" && *n == t).map(|r| r.2) else {
                continue;
            };
            let cells: Vec<String> =
                results.iter().filter(|(_, n, _)| *n == t).map(|(p, _, ops)| format!("{p}={:.2}", ops / base)).collect();
            println!("#  t={t}: {}", cells.join(" "));
        }
    }
    Ok(())
}
