//! `weft-bench partitioned`: one message of `--sizes` bytes that `--threads` threads of rank
//! 0 fill, a slice each, received by rank 1 (MPI 4.0 ch. 4), three ways:
//!
//! * `partitioned`: a partitioned send of `threads` partitions, each sent by its thread as
//!   soon as it is filled (one `psend_init` / `precv_init` pair, started each round);
//! * `separate`: each thread sends its slice as a message of its own (`threads` receives);
//! * `join`: the threads fill one buffer, are joined, and one send carries it.
//!
//! Every mode keeps its buffers from round to round (a persistent pair, or the buffers the
//! sends and receives give back), so that no round maps fresh memory, and a first round
//! that is not timed warms them up. Ranks are two in this process, on each of `--provider`
//! (a pair of its own per mode). The modes' rounds alternate (round `r` runs every mode
//! once, starting with a different one each round), so that a change in the machine's load
//! meets them all alike.
//!
//! Columns: `mode,provider,threads,bytes,rounds,receive_us,median_us` (the mean and the
//! median time from the round's start, when the receives are posted and the threads start
//! filling, to the receiver's completion of the whole message).

use std::sync::Barrier;
use std::time::{Duration, Instant};

use weft::{Communicator, PartitionedRecv, PartitionedSend, Provider, Runtime};

use crate::plot::Chart;
use crate::report::{parse_list, Output, PlotTo, Table};

/// Options of `weft-bench partitioned`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Modes to sweep (comma list of `partitioned`, `separate`, `join`).
    #[arg(long, default_value = "partitioned,separate,join")]
    mode: String,
    /// Providers to sweep (comma list of `embedded`, `shm`, `tcp`; two ranks in this process).
    #[arg(long, default_value = "embedded")]
    provider: String,
    /// Sending threads to sweep (comma list; each fills one slice).
    #[arg(short = 't', long, default_value = "1,2,4,8")]
    threads: String,
    /// Message sizes in bytes to sweep (comma list; each a multiple of every thread count).
    #[arg(short = 's', long, default_value = "1024,65536,1048576,16777216")]
    sizes: String,
    /// Timed rounds per configuration (after one that is not timed).
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

/// The receiving side of one configuration, kept from round to round.
enum Receiver<'c> {
    Partitioned(Box<PartitionedRecv<'c, u8>>),
    /// The buffers of the `threads` receives (given back by each round's receives).
    Separate(Vec<Vec<u8>>),
    Join(Vec<u8>),
}

/// The sending side of one configuration, kept from round to round.
enum Sender<'c> {
    Partitioned(Box<PartitionedSend<'c, u8>>),
    /// Each thread's slice (given back by its send).
    Separate(Vec<Vec<u8>>),
    Join(Vec<u8>),
}

fn err(e: weft::Error) -> String {
    e.to_string()
}

impl<'c> Receiver<'c> {
    fn new(mode: &str, b: &'c Communicator, threads: usize, bytes: usize) -> Result<Self, String> {
        Ok(match mode {
            "partitioned" => Receiver::Partitioned(Box::new(b.precv_init(vec![0u8; bytes], threads, 0, 1).map_err(err)?)),
            "separate" => Receiver::Separate((0..threads).map(|_| Vec::with_capacity(bytes / threads)).collect()),
            _ => Receiver::Join(Vec::with_capacity(bytes)),
        })
    }

    /// One round of slices of `per` bytes: posts, meets the sender at `start`, and returns
    /// the time to completion.
    fn round(&mut self, b: &Communicator, per: usize, round: usize, start: &Barrier) -> Result<Duration, String> {
        match self {
            Receiver::Partitioned(r) => {
                r.start().map_err(err)?;
                start.wait();
                let t0 = Instant::now();
                r.wait().map_err(err)?;
                let took = t0.elapsed();
                check(r.buffer().ok_or("the partitioned receive still holds its buffer")?, per, round)?;
                Ok(took)
            }
            Receiver::Separate(bufs) => {
                let mut rs = bufs
                    .drain(..)
                    .enumerate()
                    .map(|(t, mut v)| {
                        v.clear();
                        b.irecv(v, 0u32, t as i32)
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(err)?;
                start.wait();
                let t0 = Instant::now();
                weft::wait_all(&mut rs).map_err(err)?;
                let took = t0.elapsed();
                for mut r in rs {
                    let (v, _) = r.take().unwrap_or(Err(weft::Error::Cancelled)).map_err(err)?;
                    check(&v, per, round)?;
                    bufs.push(v);
                }
                Ok(took)
            }
            Receiver::Join(buf) => {
                let mut v = std::mem::take(buf);
                v.clear();
                let r = b.irecv(v, 0u32, 1).map_err(err)?;
                start.wait();
                let t0 = Instant::now();
                let (v, _) = r.wait().map_err(err)?;
                let took = t0.elapsed();
                check(&v, per, round)?;
                *buf = v;
                Ok(took)
            }
        }
    }
}

impl<'c> Sender<'c> {
    fn new(mode: &str, a: &'c Communicator, threads: usize, bytes: usize) -> Result<Self, String> {
        Ok(match mode {
            "partitioned" => Sender::Partitioned(Box::new(a.psend_init(vec![0u8; bytes], threads, 1, 1).map_err(err)?)),
            "separate" => Sender::Separate((0..threads).map(|_| vec![0u8; bytes / threads]).collect()),
            _ => Sender::Join(vec![0u8; bytes]),
        })
    }

    /// One round: meets the receiver at `start`, then fills and sends.
    fn round(&mut self, a: &Communicator, threads: usize, round: usize, start: &Barrier) -> Result<(), String> {
        match self {
            Sender::Partitioned(s) => {
                s.start().map_err(err)?;
                let parts = s.partitions().map_err(err)?;
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
                .map_err(err)?;
                s.wait().map_err(err)
            }
            Sender::Separate(slices) => {
                start.wait();
                std::thread::scope(|sc| {
                    let hs: Vec<_> = slices
                        .iter_mut()
                        .enumerate()
                        .map(|(t, slot)| {
                            sc.spawn(move || {
                                let mut v = std::mem::take(slot);
                                fill(&mut v, round);
                                *slot = a.send(v, 1, t as i32)?.0;
                                Ok(())
                            })
                        })
                        .collect();
                    hs.into_iter().try_for_each(|h| h.join().expect("a sending thread panicked"))
                })
                .map_err(err)
            }
            Sender::Join(buf) => {
                let per = buf.len() / threads;
                let mut v = std::mem::take(buf);
                start.wait();
                std::thread::scope(|sc| {
                    for c in v.chunks_mut(per.max(1)) {
                        sc.spawn(move || fill(c, round));
                    }
                });
                *buf = a.send(v, 1, 1).map_err(err)?.0;
                Ok(())
            }
        }
    }
}

/// One configuration, every mode of `modes` with rounds alternating: per mode the mean and
/// the median receive time in microseconds over `rounds` timed rounds.
fn measure(modes: &[String], provider: Provider, threads: usize, bytes: usize, rounds: usize) -> Result<Vec<(f64, f64)>, String> {
    let worlds = modes.iter().map(|_| Runtime::builder().provider(provider).build_local(2).map_err(err)).collect::<Result<Vec<_>, _>>()?;
    let mut sides = modes
        .iter()
        .zip(&worlds)
        .map(|(m, rts)| Ok((Sender::new(m, rts[0].world(), threads, bytes)?, Receiver::new(m, rts[1].world(), threads, bytes)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let start = Barrier::new(2);
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); modes.len()];
    for round in 0..=rounds {
        for k in 0..modes.len() {
            let j = (k + round) % modes.len();
            let (a, b) = (worlds[j][0].world(), worlds[j][1].world());
            let (sender, receiver) = &mut sides[j];
            let (sent, took) = std::thread::scope(|s| {
                let r = s.spawn(|| receiver.round(b, bytes / threads, round, &start));
                let sent = sender.round(a, threads, round, &start);
                (sent, r.join().expect("the receiving thread panicked"))
            });
            sent?;
            let took = took?;
            if round > 0 {
                times[j].push(took);
            }
        }
    }
    Ok(times
        .into_iter()
        .map(|mut t| {
            t.sort_unstable();
            let us = |d: Duration| d.as_secs_f64() * 1e6;
            let mean = t.iter().map(|&d| us(d)).sum::<f64>() / rounds as f64;
            let median = match t.len() % 2 {
                1 => us(t[t.len() / 2]),
                _ => (us(t[t.len() / 2 - 1]) + us(t[t.len() / 2])) / 2.0,
            };
            (mean, median)
        })
        .collect())
}

pub fn run(args: &Args) -> Result<(), String> {
    let modes: Vec<String> = parse_list(&args.mode)?;
    let providers: Vec<Provider> = parse_list(&args.provider)?;
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
    let mut table = Table::new(&["mode", "provider", "threads", "bytes", "rounds", "receive_us", "median_us"], &args.out);
    table.progress(providers.len() * threads.len() * sizes.len());
    table.print_header();
    for &p in &providers {
        for &t in &threads {
            for &s in &sizes {
                table.step(|| format!("{p}, {t} threads, {s} bytes"));
                for (m, (mean, median)) in modes.iter().zip(measure(&modes, p, t, s, args.rounds)?) {
                    let row = [m.clone(), p.to_string(), t.to_string(), s.to_string(), args.rounds.to_string()];
                    table.row(row.into_iter().chain([format!("{mean:.1}"), format!("{median:.1}")]).collect());
                }
            }
        }
    }
    let chart = Chart::new("partitioned: one message filled by T threads, 2 ranks in one process", "bytes", "message size (bytes)")
        .y("median_us", "")
        .y_axis("time to complete on the receiver (µs)", 1.0)
        .series("mode", "{}")
        .series("provider", "{}")
        .panels("threads", "{} threads")
        .log_x()
        .log_y();
    table.finish_with_plot(&chart, &args.plot)
}
