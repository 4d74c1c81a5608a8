//! `weft-bench sync-pingpong`: the receiver of a ping-pong completes its receives through a
//! sync object (`SyncObject::query_bulk`) versus a loop that tests every request — [Patinyasakdikul 2019,
//! §4.6.1], Table 4.1 (PaRSEC's communication thread, `MPIX_Sync` vs `MPI_Test*`).
//!
//! Rank 1 plays a task runtime's communication thread: it keeps `--window` receives posted
//! (one per tag, as PaRSEC keeps persistent receives), and answers each ping with a pong of
//! the same size, then reposts the receive. Rank 0 sends ping `i` on tag `i % window` and
//! waits for the pong. `sync`: the posted receives are attached to one sync object and the
//! thread drains completions with `query_bulk` (one O(1) check when idle). `testloop`: the
//! thread calls `test()` on every posted receive in turn (each `test` of a pending request
//! makes progress, as `MPI_Test` does). Both ranks busy-poll (no thread parks; after 64
//! idle passes a poller yields its core once per pass, the same policy for both styles), so
//! the numbers measure the completion path rather than wake-up latency.
//!
//! Columns: `size,completion,seconds,msg_rate` (median over `--runs` of the time for
//! `--iters` round trips; `msg_rate` counts pings and pongs per second).

use std::time::Instant;

use weft::{Communicator, Request, Runtime, Source, Tag};

use crate::report::{median, parse_list, Output, Table};

/// Options of `weft-bench sync-pingpong`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Message sizes in bytes (comma list).
    #[arg(short = 's', long, default_value = "400,4000,40000,400000")]
    sizes: String,
    /// Round trips per measurement at 400 B (fewer for larger sizes, at least 200).
    #[arg(short = 'i', long, default_value_t = 20_000)]
    iters: usize,
    /// Receives kept posted by the receiver.
    #[arg(short = 'w', long, default_value_t = 32)]
    window: usize,
    /// Completion styles (comma list of `sync`, `testloop`).
    #[arg(long, default_value = "sync,testloop")]
    completion: String,
    /// Repetitions (the median is reported); the styles alternate.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[command(flatten)]
    out: Output,
}

/// One measurement: `iters` round trips of `size` bytes; returns seconds.
fn measure(size: usize, iters: usize, window: usize, sync_style: bool) -> Result<f64, String> {
    let ranks = Runtime::builder().workers(0).build_local(2).map_err(|e| e.to_string())?;
    let pong_tag = window as i32;
    let (r0, r1) = (&ranks[0], &ranks[1]);
    let start = std::sync::Barrier::new(2);
    let res = std::thread::scope(|s| {
        let pinger = s.spawn(|| -> Result<f64, weft::Error> {
            let c = r0.world();
            let mut pong = Vec::<u8>::with_capacity(size);
            let ping = vec![1u8; size];
            start.wait();
            let t0 = Instant::now();
            let mut ping = ping;
            for i in 0..iters {
                // The pinger busy-polls too (as the receiver does), so the measurement is the
                // completion path, not thread wake-up latency.
                let mut recv = c.irecv(pong, 1u32, pong_tag)?;
                let mut send = c.isend(ping, 1, (i % window) as i32)?;
                let mut idle = Idle(0);
                while !send.test() {
                    idle.snooze();
                }
                ping = send.take().ok_or(weft::Error::Cancelled)??.0;
                idle = Idle(0);
                while !recv.test() {
                    idle.snooze();
                }
                let (b, st) = recv.take().ok_or(weft::Error::Cancelled)??;
                debug_assert_eq!(st.bytes, size);
                pong = b;
            }
            Ok(t0.elapsed().as_secs_f64())
        });
        let c = r1.world();
        let reply = vec![2u8; size];
        let mut reqs: Vec<Request<'_, Vec<u8>>> =
            (0..window).map(|t| post(c, t, Vec::with_capacity(size))).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
        let mut reply = Some(reply);
        start.wait();
        let mut done = 0usize;
        if sync_style {
            let sync = r1.sync_object::<usize>();
            for (i, r) in reqs.iter_mut().enumerate() {
                sync.attach(r, i).map_err(|_| "attach failed".to_string())?;
            }
            let mut out = Vec::with_capacity(window);
            let mut idle = Idle(0);
            while done < iters {
                out.clear();
                if sync.query_bulk(&mut out, window) == 0 {
                    if !r1.progress() {
                        idle.snooze();
                    }
                    continue;
                }
                idle = Idle(0);
                for comp in out.drain(..) {
                    answer(c, &mut reqs, comp.data, &mut reply, pong_tag).map_err(|e| e.to_string())?;
                    sync.attach(&mut reqs[comp.data], comp.data).map_err(|_| "attach failed".to_string())?;
                    done += 1;
                }
            }
        } else {
            let mut idle = Idle(0);
            while done < iters {
                let before = done;
                for idx in 0..window {
                    if reqs[idx].test() {
                        answer(c, &mut reqs, idx, &mut reply, pong_tag).map_err(|e| e.to_string())?;
                        done += 1;
                    }
                }
                if done == before {
                    idle.snooze();
                } else {
                    idle = Idle(0);
                }
            }
        }
        let secs = pinger.join().map_err(|_| "pinger panicked".to_string())?.map_err(|e| e.to_string())?;
        Ok::<f64, String>(secs)
    })?;
    Ok(res)
}

/// Busy-poll policy shared by both styles and both ranks: spin, and after a while give the
/// core away once per idle pass (the machine may have fewer cores than spinning threads).
struct Idle(u32);

impl Idle {
    fn snooze(&mut self) {
        self.0 += 1;
        if self.0 > 64 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Posts the receive for `tag`.
fn post(c: &Communicator, tag: usize, buf: Vec<u8>) -> Result<Request<'_, Vec<u8>>, weft::Error> {
    c.irecv(buf, Source::Rank(0), Tag::Is(tag as i32))
}

/// Takes completed receive `idx`, sends the pong, reposts the receive.
fn answer<'c>(
    c: &'c Communicator,
    reqs: &mut [Request<'c, Vec<u8>>],
    idx: usize,
    reply: &mut Option<Vec<u8>>,
    pong_tag: i32,
) -> Result<(), weft::Error> {
    let (buf, _) = reqs[idx].take().ok_or(weft::Error::Cancelled)??;
    let mut send = c.isend(reply.take().unwrap_or_default(), 0, pong_tag)?;
    let mut idle = Idle(0);
    while !send.test() {
        idle.snooze();
    }
    *reply = Some(send.take().ok_or(weft::Error::Cancelled)??.0);
    reqs[idx] = post(c, idx, buf)?;
    Ok(())
}

/// Runs the sweep.
pub fn run(args: &Args) -> Result<(), String> {
    let sizes: Vec<usize> = parse_list(&args.sizes)?;
    let styles: Vec<String> = parse_list(&args.completion)?;
    if let Some(s) = styles.iter().find(|s| !matches!(s.as_str(), "sync" | "testloop")) {
        return Err(format!("unknown completion {s:?} (sync, testloop)"));
    }
    if args.window == 0 || args.window > i32::MAX as usize - 1 {
        return Err("window must be at least 1".into());
    }
    let mut table = Table::new(&["size", "completion", "seconds", "msg_rate"], &args.out);
    table.progress(sizes.len() * args.runs.max(1));
    table.print_header();
    for &size in &sizes {
        let iters = (args.iters as f64 * (400.0 / size.max(400) as f64).sqrt()) as usize;
        let iters = iters.max(200);
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); styles.len()];
        for (i, st) in styles.iter().enumerate() {
            measure(size, iters / 10 + 1, args.window, st == "sync")?; // warm-up
            let _ = i;
        }
        for run in 0..args.runs.max(1) {
            table.step(|| format!("{size} B, run {}", run + 1));
            for (i, st) in styles.iter().enumerate() {
                samples[i].push(measure(size, iters, args.window, st == "sync")?);
            }
        }
        for (i, st) in styles.iter().enumerate() {
            let s = median(&samples[i]);
            table.row(vec![size.to_string(), st.clone(), format!("{s:.6}"), format!("{:.0}", 2.0 * iters as f64 / s)]);
        }
    }
    table.finish();
    Ok(())
}
