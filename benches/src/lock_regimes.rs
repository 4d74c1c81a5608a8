//! `weft-bench lock-regimes`: the runtime-level lock benchmarks of [Amer 2019, §3.4], sweeping
//! the protocol of the progress path (`Global` mode's critical section, which posting enters
//! with high priority and progress with low priority).
//!
//! * `latency` (§3.4.2): a single-threaded *server* rank answers each request with an
//!   acknowledgment of the same size; every thread of the *client* rank sends one request
//!   and waits for its acknowledgment before sending the next. `msg_rate` is round trips per
//!   second over all client threads; `latency_us` the mean round trip of one thread.
//! * `throughput` (§3.4.3): T threads of a *source* rank stream windows of `w` messages to
//!   T threads of a *sink* rank. `msg_rate` is messages per second; `latency_us` the mean
//!   time of one window (send side).
//!
//! `productive_ratio` is the progress-path efficiency of [Amer 2019, §3.2] on the contended rank
//! (the client, the sink): the share of progress-lock acquisitions that handled at least one
//! frame.

use std::sync::Barrier;
use std::time::Instant;

use clap::Args as ClapArgs;
use weft::lock::{LockKind, LockPath};
use weft::{ProgressMode, Request, Runtime, Source, Tag};

use crate::plot::Chart;
use crate::report::{median, parse_list, Output, PlotTo, Table};

/// Options of `weft-bench lock-regimes` (comma lists sweep).
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Regimes: latency, throughput.
    #[arg(long, default_value = "latency,throughput")]
    regime: String,
    /// Protocols on the progress path ([Amer 2019] names).
    #[arg(long, default_value = "tas,ticket,mcs,clh,hmcs,p-hmcs-mcs,p-mcs-mcs,p-mcs-hmcs,parking_lot,std,tas_park")]
    protocol: String,
    /// Client (latency) or source/sink (throughput) threads.
    #[arg(short = 't', long = "threads", default_value = "1,2,4,8")]
    threads: String,
    /// Message size in bytes.
    #[arg(short = 's', long = "size", default_value_t = 8)]
    size: usize,
    /// Round trips per client thread (latency) or windows per thread (throughput).
    #[arg(short = 'i', long = "iterations", default_value_t = 500)]
    iterations: usize,
    /// Messages per window (throughput).
    #[arg(short = 'w', long = "window", default_value_t = 64)]
    window: usize,
    /// Runs per configuration; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Regime {
    Latency,
    Throughput,
}

impl std::str::FromStr for Regime {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "latency" => Ok(Regime::Latency),
            "throughput" => Ok(Regime::Throughput),
            _ => Err(format!("unknown regime {s:?} (latency, throughput)")),
        }
    }
}

impl Regime {
    fn name(self) -> &'static str {
        match self {
            Regime::Latency => "latency",
            Regime::Throughput => "throughput",
        }
    }
}

/// One run's result.
#[derive(Clone, Copy, Debug)]
struct Sample {
    msg_rate: f64,
    latency_us: f64,
    productive_ratio: f64,
}

/// Runs the sweep and prints the table or CSV.
pub fn run(a: &Args) -> Result<(), String> {
    let regimes: Vec<Regime> = parse_list(&a.regime)?;
    let protocols: Vec<LockKind> = parse_list(&a.protocol)?;
    let threads: Vec<usize> = parse_list(&a.threads)?;
    if threads.contains(&0) || a.iterations == 0 || a.window == 0 || a.runs == 0 {
        return Err("threads, iterations, window and runs must be at least 1".into());
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    a.out.note(&format!(
        "# weft-bench lock-regimes: progress=global size={} iterations={} window={} runs={} (median) cores={cores}",
        a.size, a.iterations, a.window, a.runs,
    ));
    let mut table = Table::new(&["regime", "protocol", "threads", "msg_rate", "latency_us", "productive_ratio"], &a.out);
    table.progress(regimes.len() * threads.len() * protocols.len() * a.runs);
    table.print_header();
    for &regime in &regimes {
        for &t in &threads {
            for &kind in &protocols {
                let mut samples = Vec::with_capacity(a.runs);
                for _ in 0..a.runs {
                    table.step(|| format!("{} regime, {kind}, {t} threads", regime.name()));
                    samples.push(measure(regime, kind, t, a)?);
                }
                let m = |f: fn(&Sample) -> f64| median(&samples.iter().map(f).collect::<Vec<_>>());
                table.row(vec![
                    regime.name().into(),
                    kind.to_string(),
                    t.to_string(),
                    format!("{:.0}", m(|s| s.msg_rate)),
                    format!("{:.2}", m(|s| s.latency_us)),
                    format!("{:.3}", m(|s| s.productive_ratio)),
                ]);
            }
        }
    }
    let chart = Chart::new(
        format!("lock-regimes: Global progress lock, {}-byte messages, 2 ranks, {cores} cores", a.size),
        "threads",
        "threads per rank (clients; sources and sinks)",
    )
    .y("msg_rate", "")
    .y_axis("rate (k/s: round trips; messages)", 1e3)
    .series("protocol", "{}")
    .panels("regime", "{} regime")
    .log_y()
    .log2_x();
    table.finish_with_plot(&chart, &a.plot)
}

fn measure(regime: Regime, kind: LockKind, t: usize, a: &Args) -> Result<Sample, String> {
    let rts = Runtime::builder()
        .progress(ProgressMode::Global)
        .lock(LockPath::Progress, kind)
        .cris(t)
        .lock_stats(true)
        .build_local(2)
        .map_err(|e| e.to_string())?;
    let before = rts[1].counters().progress_lock;
    let (elapsed, per_op, ops) = match regime {
        Regime::Latency => latency(&rts, t, a),
        Regime::Throughput => throughput(&rts, t, a),
    }?;
    let after = rts[1].counters().progress_lock;
    let (p, u) = (after.productive - before.productive, after.unproductive - before.unproductive);
    Ok(Sample {
        msg_rate: ops as f64 / elapsed,
        latency_us: per_op * 1e6,
        productive_ratio: if p + u == 0 { 0.0 } else { p as f64 / (p + u) as f64 },
    })
}

/// When one thread started and finished its loop.
type Span = (Instant, Instant);

/// Wall time from the first start to the last finish, and the mean span, in seconds.
fn summarize(spans: &[Span]) -> (f64, f64) {
    let start = spans.iter().map(|s| s.0).min();
    let end = spans.iter().map(|s| s.1).max();
    let wall = match (start, end) {
        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
        _ => 0.0,
    };
    let mean = spans.iter().map(|s| s.1.duration_since(s.0).as_secs_f64()).sum::<f64>() / spans.len().max(1) as f64;
    (wall, mean)
}

/// [Amer 2019, §3.4.2]. Returns (elapsed s, mean round trip s, round trips).
fn latency(rts: &[Runtime], t: usize, a: &Args) -> Result<(f64, f64, usize), String> {
    let (server, client) = (rts[0].world(), rts[1].world());
    let total = t * a.iterations;
    let barrier = Barrier::new(t);
    let size = a.size;
    let res: Result<Vec<Span>, String> = std::thread::scope(|s| {
        let srv = s.spawn(|| -> Result<(), String> {
            let mut buf = Vec::<u8>::with_capacity(size);
            for _ in 0..total {
                let (b, st) = server.recv(buf, Source::Any, Tag::Any).map_err(|e| e.to_string())?;
                let (b, _) = server.send(b, st.source, st.tag).map_err(|e| e.to_string())?;
                buf = b;
            }
            Ok(())
        });
        let clients: Vec<_> = (0..t)
            .map(|i| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Span, String> {
                    let mut msg = vec![7u8; size];
                    let mut ack = Vec::<u8>::with_capacity(size);
                    barrier.wait();
                    let t0 = Instant::now();
                    for _ in 0..a.iterations {
                        // Post the ack receive first so the reply never waits unexpected.
                        let r = client.irecv(ack, 0u32, i as i32).map_err(|e| e.to_string())?;
                        msg = client.send(msg, 0, i as i32).map_err(|e| e.to_string())?.0;
                        ack = r.wait().map_err(|e| e.to_string())?.0;
                    }
                    Ok((t0, Instant::now()))
                })
            })
            .collect();
        let mut spans = Vec::with_capacity(t);
        for c in clients {
            spans.push(c.join().map_err(|_| "client thread panicked".to_string())??);
        }
        srv.join().map_err(|_| "server thread panicked".to_string())??;
        Ok(spans)
    });
    let (elapsed, mean) = summarize(&res?);
    Ok((elapsed, mean / a.iterations as f64, total))
}

/// [Amer 2019, §3.4.3]. Returns (elapsed s, mean window time s, messages).
fn throughput(rts: &[Runtime], t: usize, a: &Args) -> Result<(f64, f64, usize), String> {
    let (source, sink) = (rts[0].world(), rts[1].world());
    let barrier = Barrier::new(2 * t);
    let (w, size) = (a.window, a.size);
    let res: Result<(Vec<Span>, Vec<Span>), String> = std::thread::scope(|s| {
        let sinks: Vec<_> = (0..t)
            .map(|i| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Span, String> {
                    let mut bufs: Vec<Vec<u8>> = (0..w).map(|_| Vec::with_capacity(size)).collect();
                    barrier.wait();
                    let t0 = Instant::now();
                    for _ in 0..a.iterations {
                        let mut reqs: Vec<Request<'_, Vec<u8>>> =
                            bufs.drain(..).map(|b| sink.irecv(b, 0u32, i as i32)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
                        weft::wait_all(&mut reqs).map_err(|e| e.to_string())?;
                        for r in reqs.iter_mut() {
                            bufs.push(r.take().ok_or("receive not complete")?.map_err(|e| e.to_string())?.0);
                        }
                    }
                    Ok((t0, Instant::now()))
                })
            })
            .collect();
        let sources: Vec<_> = (0..t)
            .map(|i| {
                let barrier = &barrier;
                s.spawn(move || -> Result<Span, String> {
                    let mut bufs: Vec<Vec<u8>> = (0..w).map(|_| vec![1u8; size]).collect();
                    barrier.wait();
                    let t0 = Instant::now();
                    for _ in 0..a.iterations {
                        let mut reqs: Vec<Request<'_, Vec<u8>>> =
                            bufs.drain(..).map(|b| source.isend(b, 1, i as i32)).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
                        weft::wait_all(&mut reqs).map_err(|e| e.to_string())?;
                        for r in reqs.iter_mut() {
                            bufs.push(r.take().ok_or("send not complete")?.map_err(|e| e.to_string())?.0);
                        }
                    }
                    Ok((t0, Instant::now()))
                })
            })
            .collect();
        let mut sink_spans = Vec::with_capacity(t);
        for h in sinks {
            sink_spans.push(h.join().map_err(|_| "sink thread panicked".to_string())??);
        }
        let mut source_spans = Vec::with_capacity(t);
        for h in sources {
            source_spans.push(h.join().map_err(|_| "source thread panicked".to_string())??);
        }
        Ok((sink_spans, source_spans))
    });
    let (sinks, sources) = res?;
    let all: Vec<Span> = sinks.iter().chain(&sources).copied().collect();
    let (elapsed, _) = summarize(&all);
    let (_, mean) = summarize(&sources);
    Ok((elapsed, mean / a.iterations as f64, t * a.iterations * w))
}
