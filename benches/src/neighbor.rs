//! `weft-bench neighbor`: the Neighbor Message Rate Benchmark of [Goodell 2010, §VI-B]:
//! what a reference count per message on a shared communicator costs.
//!
//! Rank 0 runs T threads; thread i exchanges messages with rank i + 1, which runs one
//! thread (T + 1 ranks of the embedded provider in this process). Per iteration each thread
//! of rank 0 and its peer post 12 receives and 12 sends of 0 bytes to each other and wait
//! for all 24 (`wait_all`); 10 warm-up iterations, then `--iterations` timed ones. All of
//! rank 0's threads use one communicator: the world (`--comm world`, MPI's predefined
//! object) or one `dup` of it (`--comm dup`, a derived one).
//!
//! Two object-lifetime schemes:
//! - `borrowed`: what weft does. A request borrows its communicator (`Request<'c, B>`):
//!   posting and completing a message touch no counter shared with other threads.
//! - `counted`: the naive scheme the paper measures against. Every request takes a
//!   reference to the shared communicator when posted (`Arc::clone`, one atomic increment
//!   on a cache line every thread of the rank writes) and drops it when completed, as an
//!   MPI library that counts references on the communicator per request does.
//!
//! The two schemes' runs alternate; the rate is the messages rank 0's threads send per
//! second (the paper's "total number of messages sent divided by the elapsed time"), the
//! median of `--runs` runs; `borrowed_over_counted` on the `borrowed` rows is the median
//! of the per-run ratios ([Goodell 2010, Fig. 5]: +31% at 4 threads).
//!
//! Columns: `threads,comm,reference,msg_rate,borrowed_over_counted`.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use weft::{wait_all, Communicator, Request, Runtime};

use crate::plot::Chart;
use crate::report::{median, parse_list, Output, PlotTo, Table};

/// Messages each way per thread and iteration ([Goodell 2010, §VI-B]).
const PER_ITERATION: usize = 12;
/// Untimed iterations before the timed ones ([Goodell 2010, §VI-B]).
const WARMUP: usize = 10;
/// Tag of every message (one peer per thread: the source alone tells them apart).
const TAG: i32 = 7;

/// Options of `weft-bench neighbor`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Threads of rank 0 to sweep (comma list); each has a peer rank of its own.
    #[arg(short = 't', long, default_value = "1,2,4,8")]
    threads: String,
    /// Timed iterations per thread (each: 12 sends and 12 receives, then a wait).
    #[arg(short = 'i', long, default_value_t = 2000)]
    iterations: usize,
    /// Communicators to sweep (comma list of `world`, `dup`).
    #[arg(long, default_value = "world")]
    comm: String,
    /// Object-lifetime schemes to sweep (comma list of `borrowed`, `counted`).
    #[arg(long, default_value = "borrowed,counted")]
    reference: String,
    /// Repetitions (the median is reported); the schemes alternate.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Count lock acquisitions (`Builder::lock_stats`) and print rank 0's matching-lock
    /// acquisitions and contended ones after each run (to stderr, `#` lines).
    #[arg(long)]
    counters: bool,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
}

/// One thread's side: `iterations` rounds with `peer` on `comm`; with `counted`, every
/// request holds a clone of `counted` until its round's wait returns.
fn exchange(comm: &Communicator, counted: Option<&Arc<Communicator>>, peer: u32, iterations: usize) -> Result<(), weft::Error> {
    let mut reqs: Vec<Request<'_, Vec<u8>>> = Vec::with_capacity(2 * PER_ITERATION);
    let mut refs: Vec<Arc<Communicator>> = Vec::with_capacity(2 * PER_ITERATION);
    for _ in 0..iterations {
        for _ in 0..PER_ITERATION {
            refs.extend(counted.map(Arc::clone));
            reqs.push(comm.irecv(Vec::new(), peer, TAG)?);
        }
        for _ in 0..PER_ITERATION {
            refs.extend(counted.map(Arc::clone));
            reqs.push(comm.isend(Vec::new(), peer, TAG)?);
        }
        wait_all(&mut reqs)?;
        reqs.clear();
        refs.clear();
    }
    Ok(())
}

/// One run: T threads on rank 0, a peer rank each; returns rank 0's messages sent per
/// second over the timed iterations.
fn measure(threads: usize, dup: bool, counted: bool, iterations: usize, counters: bool) -> Result<f64, String> {
    let ranks =
        Runtime::builder().env(false).cris(threads).lock_stats(counters).build_local(threads as u32 + 1).map_err(|e| e.to_string())?;
    // The communicator of each rank: its world or one dup (collective: every rank at once).
    let dups: Vec<Option<Communicator>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks.iter().map(|rt| s.spawn(move || dup.then(|| rt.world().dup()).transpose())).collect();
        hs.into_iter().map(|h| h.join().expect("a dup thread panicked")).collect::<Result<_, _>>()
    })
    .map_err(|e| e.to_string())?;
    let comm_of = |r: usize| dups[r].as_ref().unwrap_or_else(|| ranks[r].world());
    // The naive scheme's shared object: rank 0's communicator behind one reference count.
    let shared = counted.then(|| Arc::new(comm_of(0).clone()));
    let start = Barrier::new(2 * threads);
    std::thread::scope(|s| -> Result<f64, String> {
        let mut mine = Vec::with_capacity(threads);
        let mut peers = Vec::with_capacity(threads);
        for i in 0..threads {
            let (comm0, peer_rt, peer_comm) = (comm_of(0), &ranks[i + 1], comm_of(i + 1));
            let (shared, start, rt0) = (shared.as_ref(), &start, &ranks[0]);
            // Thread i of rank 0 and its peer both bind to CRI i, so each one's frames
            // arrive where the other polls (`Runtime::pin_cri`). Rank 0's threads time
            // themselves (a clock on this thread, which shares the cores with them, could
            // start late or stop late).
            mine.push(s.spawn(move || -> Result<(Instant, Instant), weft::Error> {
                rt0.pin_cri(i)?;
                exchange(comm0, shared, i as u32 + 1, WARMUP)?;
                start.wait();
                let t0 = Instant::now();
                exchange(comm0, shared, i as u32 + 1, iterations)?;
                Ok((t0, Instant::now()))
            }));
            peers.push(s.spawn(move || -> Result<(), weft::Error> {
                peer_rt.pin_cri(i)?;
                exchange(peer_comm, None, 0, WARMUP)?;
                start.wait();
                exchange(peer_comm, None, 0, iterations)
            }));
        }
        let joined = |e: Box<dyn std::any::Any + Send>| format!("a neighbor thread panicked: {e:?}");
        let spans = mine.into_iter().map(|h| h.join().map_err(joined)?.map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
        for h in peers {
            h.join().map_err(joined)?.map_err(|e| e.to_string())?;
        }
        if counters {
            let m = ranks[0].counters().matching_lock;
            eprintln!(
                "# counters threads={threads} {} rank 0: matching-lock acquisitions {} contended {} ({:.2}%)",
                if counted { "counted" } else { "borrowed" },
                m.acquisitions,
                m.contended,
                100.0 * m.contended as f64 / m.acquisitions.max(1) as f64
            );
        }
        let first = spans.iter().map(|s| s.0).min().expect("at least one thread");
        let last = spans.iter().map(|s| s.1).max().expect("at least one thread");
        Ok((threads * iterations * PER_ITERATION) as f64 / (last - first).as_secs_f64())
    })
}

pub fn run(args: &Args) -> Result<(), String> {
    let threads: Vec<usize> = parse_list(&args.threads)?;
    let comms: Vec<String> = parse_list(&args.comm)?;
    let schemes: Vec<String> = parse_list(&args.reference)?;
    if threads.contains(&0) || args.iterations == 0 || args.runs == 0 {
        return Err("threads, iterations and runs must be at least 1".into());
    }
    if let Some(c) = comms.iter().find(|c| !matches!(c.as_str(), "world" | "dup")) {
        return Err(format!("unknown communicator {c:?} (world, dup)"));
    }
    if let Some(r) = schemes.iter().find(|r| !matches!(r.as_str(), "borrowed" | "counted")) {
        return Err(format!("unknown reference scheme {r:?} (borrowed, counted)"));
    }
    args.out.note(&format!(
        "# weft-bench neighbor: iterations={} x {PER_ITERATION} messages each way, runs={} (median), cores={}",
        args.iterations,
        args.runs,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));
    let mut table = Table::new(&["threads", "comm", "reference", "msg_rate", "borrowed_over_counted"], &args.out);
    table.progress(threads.len() * comms.len() * args.runs);
    table.print_header();
    for comm in &comms {
        for &t in &threads {
            let mut rates: Vec<Vec<f64>> = vec![Vec::new(); schemes.len()];
            for _ in 0..args.runs {
                table.step(|| format!("{t} threads, {comm}"));
                for (k, scheme) in schemes.iter().enumerate() {
                    rates[k].push(measure(t, comm == "dup", scheme == "counted", args.iterations, args.counters)?);
                }
            }
            let counted = schemes.iter().position(|s| s == "counted");
            for (k, scheme) in schemes.iter().enumerate() {
                let ratio = match counted {
                    Some(c) if scheme == "borrowed" => {
                        let r: Vec<f64> = rates[k].iter().zip(&rates[c]).map(|(b, n)| b / n).collect();
                        format!("{:.2}", median(&r))
                    }
                    _ => "-".into(),
                };
                table.row(vec![t.to_string(), comm.clone(), scheme.clone(), format!("{:.0}", median(&rates[k])), ratio]);
            }
        }
    }
    let chart = Chart::new("neighbor: 0 B messages, 12 each way per iteration, embedded provider", "threads", "threads of rank 0")
        .y("msg_rate", "")
        .y_axis("message rate (M msg/s)", 1e6)
        .series("reference", "{}")
        .series("comm", "{} communicator")
        .log2_x();
    table.finish_with_plot(&chart, &args.plot)
}
