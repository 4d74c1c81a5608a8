//! `weft-bench partitioned`: one message of `--sizes` bytes that `--threads` threads of rank
//! 0 fill, a slice each, received by rank 1 (MPI 4.0 ch. 4), three ways:
//!
//! * `partitioned`: a partitioned send of `threads` partitions, each sent by its thread as
//!   soon as it is filled (`psend_init` / `precv_init`);
//! * `separate`: each thread sends its slice as a message of its own (`threads` receives);
//! * `join`: the threads fill one buffer, are joined, and one send carries it.
//!
//! Columns: `mode,threads,bytes,rounds,receive_us` (`receive_us`: the mean time from the
//! round's start, when the receives are posted and the threads start filling, to the
//! receiver's completion of the whole message).

use std::sync::Barrier;
use std::time::{Duration, Instant};

use weft::{Communicator, Runtime};

use crate::plot::Chart;
use crate::report::{parse_list, Output, PlotTo, Table};

/// Options of `weft-bench partitioned`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Modes to sweep (comma list of `partitioned`, `separate`, `join`).
    #[arg(long, default_value = "partitioned,separate,join")]
    mode: String,
    /// Sending threads to sweep (comma list; each fills one slice).
    #[arg(short = 't', long, default_value = "1,2,4,8")]
    threads: String,
    /// Message sizes in bytes to sweep (comma list; each a multiple of every thread count).
    #[arg(short = 's', long, default_value = "1024,65536,1048576,16777216")]
    sizes: String,
    /// Rounds per configuration.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
}

/// Fills a slice as a thread's share of the work (every byte written once).
fn fill(slice: &mut [u8], round: usize) {
    for (i, x) in slice.iter_mut().enumerate() {
        *x = (i + round) as u8;
    }
}

/// Checks what arrived: slice by slice, as `fill` wrote it.
fn check(buf: &[u8], per: usize, round: usize) -> Result<(), String> {
    match buf.chunks(per.max(1)).all(|c| c.iter().enumerate().all(|(i, &x)| x == (i + round) as u8)) {
        true => Ok(()),
        false => Err(format!("round {round}: the message arrived damaged")),
    }
}

/// One round's receive side: posts, meets the sender at `start`, and returns the time to
/// completion.
fn receive(mode: &str, b: &Communicator, threads: usize, bytes: usize, round: usize, start: &Barrier) -> Result<Duration, String> {
    let per = bytes / threads;
    let e = |e: weft::Error| e.to_string();
    match mode {
        "partitioned" => {
            let mut r = b.precv_init(vec![0u8; bytes], threads, 0, 1).map_err(e)?;
            r.start().map_err(e)?;
            start.wait();
            let t0 = Instant::now();
            r.wait().map_err(e)?;
            let took = t0.elapsed();
            check(r.buffer().ok_or("the partitioned receive still holds its buffer")?, per, round)?;
            Ok(took)
        }
        "separate" => {
            let mut rs =
                (0..threads).map(|t| b.irecv(Vec::<u8>::with_capacity(per), 0u32, t as i32)).collect::<Result<Vec<_>, _>>().map_err(e)?;
            start.wait();
            let t0 = Instant::now();
            weft::wait_all(&mut rs).map_err(e)?;
            let took = t0.elapsed();
            for mut r in rs {
                let (v, _) = r.take().unwrap_or(Err(weft::Error::Cancelled)).map_err(e)?;
                check(&v, per, round)?;
            }
            Ok(took)
        }
        _ => {
            let r = b.irecv(Vec::<u8>::with_capacity(bytes), 0u32, 1).map_err(e)?;
            start.wait();
            let t0 = Instant::now();
            let (v, _) = r.wait().map_err(e)?;
            let took = t0.elapsed();
            check(&v, per, round)?;
            Ok(took)
        }
    }
}

/// One round's send side: meets the receiver at `start`, then fills and sends.
fn send(mode: &str, a: &Communicator, threads: usize, bytes: usize, round: usize, start: &Barrier) -> Result<(), String> {
    let per = bytes / threads;
    let e = |e: weft::Error| e.to_string();
    match mode {
        "partitioned" => {
            let mut s = a.psend_init(vec![0u8; bytes], threads, 1, 1).map_err(e)?;
            s.start().map_err(e)?;
            let parts = s.partitions().map_err(e)?;
            start.wait();
            std::thread::scope(|sc| {
                let hs: Vec<_> = parts
                    .into_iter()
                    .map(|mut p| {
                        sc.spawn(move || {
                            fill(p.as_mut_slice(), round);
                            p.ready()
                        })
                    })
                    .collect();
                hs.into_iter().try_for_each(|h| h.join().expect("a filling thread panicked"))
            })
            .map_err(e)?;
            s.wait().map_err(e)
        }
        "separate" => {
            start.wait();
            std::thread::scope(|sc| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        sc.spawn(move || {
                            let mut v = vec![0u8; per];
                            fill(&mut v, round);
                            a.send(v, 1, t as i32).map(|_| ())
                        })
                    })
                    .collect();
                hs.into_iter().try_for_each(|h| h.join().expect("a sending thread panicked"))
            })
            .map_err(e)
        }
        _ => {
            let mut v = vec![0u8; bytes];
            start.wait();
            std::thread::scope(|sc| {
                for c in v.chunks_mut(per.max(1)) {
                    sc.spawn(move || fill(c, round));
                }
            });
            a.send(v, 1, 1).map(|_| ()).map_err(e)
        }
    }
}

/// One configuration: the mean receive time in microseconds.
fn measure(mode: &str, threads: usize, bytes: usize, rounds: usize) -> Result<f64, String> {
    let rts = Runtime::builder().build_local(2).map_err(|e| e.to_string())?;
    let (a, b) = (rts[0].world(), rts[1].world());
    let start = Barrier::new(2);
    let mut total = Duration::ZERO;
    for round in 0..rounds {
        let (sent, took) = std::thread::scope(|s| {
            let r = s.spawn(|| receive(mode, b, threads, bytes, round, &start));
            let sent = send(mode, a, threads, bytes, round, &start);
            (sent, r.join().expect("the receiving thread panicked"))
        });
        sent?;
        total += took?;
    }
    Ok(total.as_secs_f64() * 1e6 / rounds as f64)
}

pub fn run(args: &Args) -> Result<(), String> {
    let modes: Vec<String> = parse_list(&args.mode)?;
    let threads: Vec<usize> = parse_list(&args.threads)?;
    let sizes: Vec<usize> = parse_list(&args.sizes)?;
    if threads.contains(&0) || args.rounds == 0 {
        return Err("threads and rounds must be at least 1".into());
    }
    if let Some(m) = modes.iter().find(|m| !matches!(m.as_str(), "partitioned" | "separate" | "join")) {
        return Err(format!("unknown mode {m:?} (partitioned, separate, join)"));
    }
    if let Some((s, t)) = sizes.iter().flat_map(|&s| threads.iter().map(move |&t| (s, t))).find(|&(s, t)| s % t != 0) {
        return Err(format!("size {s} is not a multiple of {t} threads"));
    }
    let mut table = Table::new(&["mode", "threads", "bytes", "rounds", "receive_us"], &args.out);
    table.progress(modes.len() * threads.len() * sizes.len());
    table.print_header();
    for m in &modes {
        for &t in &threads {
            for &s in &sizes {
                table.step(|| format!("{m}, {t} threads, {s} bytes"));
                let us = measure(m, t, s, args.rounds)?;
                table.row(vec![m.clone(), t.to_string(), s.to_string(), args.rounds.to_string(), format!("{us:.1}")]);
            }
        }
    }
    let chart = Chart::new("partitioned: one message filled by T threads, 2 ranks in one process", "bytes", "message size (bytes)")
        .y("receive_us", "")
        .y_axis("time to complete on the receiver (µs)", 1.0)
        .series("mode", "{}")
        .panels("threads", "{} threads")
        .log_x()
        .log_y();
    table.finish_with_plot(&chart, &args.plot)
}
