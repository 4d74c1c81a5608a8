//! `weft-bench spawn`: the executor's task overheads against tokio's multi-thread runtime
//! with the same number of workers, in the same run.
//!
//! * `spawn` — spawn `--tasks` empty tasks from `block_on` and await every join handle.
//! * `yield` — two tasks hand a turn back and forth `--rounds` times (each hand-off is a wake
//!   of the other task plus a `Pending` of this one): wake-to-poll latency. The future code is
//!   the same for both runtimes (`futures::task::AtomicWaker`).
//!
//! Columns: `bench,runtime,workers,tasks,seconds` (median of `--runs`; `tasks` is the task
//! count for `spawn` and the hand-offs for `yield`).

use std::future::poll_fn;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use futures::task::AtomicWaker;

use crate::report::{median, parse_list, Output, Table};

/// Options of `weft-bench spawn`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Empty tasks per `spawn` measurement.
    #[arg(long, default_value_t = 1_000_000)]
    tasks: usize,
    /// Hand-offs per `yield` measurement.
    #[arg(long, default_value_t = 200_000)]
    rounds: usize,
    /// Worker counts to sweep (comma list).
    #[arg(short = 'w', long, default_value = "2")]
    workers: String,
    /// Benchmarks to run (comma list of `spawn`, `yield`).
    #[arg(long, default_value = "spawn,yield")]
    bench: String,
    /// Repetitions (the median is reported); weft and tokio alternate.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[command(flatten)]
    out: Output,
}

/// The two runtimes behind one interface: spawn a future, block on one.
trait Exec {
    fn spawn_all(&self, n: usize) -> f64;
    fn ping_pong(&self, rounds: usize) -> f64;
}

/// The shared state of the yield ping-pong: whose turn it is and each side's waker.
struct Turn {
    turn: AtomicUsize,
    wakers: [AtomicWaker; 2],
}

/// Side `me` of the ping-pong: waits for its turn, passes it on, `rounds / 2` times.
async fn side(t: Arc<Turn>, me: usize, rounds: usize) {
    let mut next = me;
    while next < rounds {
        poll_fn(|cx| {
            if t.turn.load(Ordering::Acquire) == next {
                return Poll::Ready(());
            }
            t.wakers[me].register(cx.waker());
            if t.turn.load(Ordering::Acquire) == next {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        t.turn.store(next + 1, Ordering::Release);
        t.wakers[1 - me].wake();
        next += 2;
    }
}

struct Weft(weft::Runtime);

impl Exec for Weft {
    fn spawn_all(&self, n: usize) -> f64 {
        let rt = &self.0;
        let t0 = Instant::now();
        rt.block_on(async {
            let hs: Vec<_> = (0..n).map(|_| rt.spawn(async {})).collect();
            for h in hs {
                h.await.expect("empty task");
            }
        });
        t0.elapsed().as_secs_f64()
    }
    fn ping_pong(&self, rounds: usize) -> f64 {
        let rt = &self.0;
        let t = Arc::new(Turn { turn: AtomicUsize::new(0), wakers: Default::default() });
        let t0 = Instant::now();
        let a = rt.spawn(side(t.clone(), 0, rounds));
        let b = rt.spawn(side(t, 1, rounds));
        rt.block_on(async {
            a.await.expect("side 0");
            b.await.expect("side 1");
        });
        t0.elapsed().as_secs_f64()
    }
}

struct Tokio(tokio::runtime::Runtime);

impl Exec for Tokio {
    fn spawn_all(&self, n: usize) -> f64 {
        let t0 = Instant::now();
        self.0.block_on(async {
            let hs: Vec<_> = (0..n).map(|_| tokio::spawn(async {})).collect();
            for h in hs {
                h.await.expect("empty task");
            }
        });
        t0.elapsed().as_secs_f64()
    }
    fn ping_pong(&self, rounds: usize) -> f64 {
        let t = Arc::new(Turn { turn: AtomicUsize::new(0), wakers: Default::default() });
        let t0 = Instant::now();
        let a = self.0.spawn(side(t.clone(), 0, rounds));
        let b = self.0.spawn(side(t, 1, rounds));
        self.0.block_on(async {
            a.await.expect("side 0");
            b.await.expect("side 1");
        });
        t0.elapsed().as_secs_f64()
    }
}

/// Runs the sweep.
pub fn run(args: &Args) -> Result<(), String> {
    let workers: Vec<usize> = parse_list(&args.workers)?;
    let benches: Vec<String> = parse_list(&args.bench)?;
    if workers.contains(&0) {
        return Err("worker counts must be at least 1 (tokio needs one)".into());
    }
    if let Some(b) = benches.iter().find(|b| !matches!(b.as_str(), "spawn" | "yield")) {
        return Err(format!("unknown bench {b:?} (spawn, yield)"));
    }
    let runs = args.runs.max(1);
    let mut table = Table::new(&["bench", "runtime", "workers", "tasks", "seconds"], &args.out);
    table.progress(workers.len() * benches.len() * runs);
    table.print_header();
    for &w in &workers {
        let weft_rt = weft::Runtime::builder().workers(w).build().map_err(|e| e.to_string())?;
        let tokio_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(w).build().map_err(|e| e.to_string())?;
        let rts: [(&str, Box<dyn Exec>); 2] = [("weft", Box::new(Weft(weft_rt))), ("tokio", Box::new(Tokio(tokio_rt)))];
        for bench in &benches {
            let n = if bench == "spawn" { args.tasks } else { args.rounds };
            let mut samples = [Vec::new(), Vec::new()];
            // One warm-up each, then alternate so drift hits both alike.
            for (_, rt) in &rts {
                if bench == "spawn" {
                    rt.spawn_all(n / 10 + 1)
                } else {
                    rt.ping_pong(n / 10 + 2)
                };
            }
            for run in 0..runs {
                table.step(|| format!("{bench}, {w} workers, run {}", run + 1));
                for (i, (_, rt)) in rts.iter().enumerate() {
                    samples[i].push(if bench == "spawn" { rt.spawn_all(n) } else { rt.ping_pong(n) });
                }
            }
            for (i, (name, _)) in rts.iter().enumerate() {
                table.row(vec![bench.clone(), name.to_string(), w.to_string(), n.to_string(), format!("{:.6}", median(&samples[i]))]);
            }
        }
    }
    table.finish();
    Ok(())
}
