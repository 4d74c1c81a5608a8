//! `weft-bench continuations`: how a task runtime learns that its receives completed, with
//! `--in-flight` receives posted at once on rank 1 and rank 0 sending them their messages
//! (8 bytes each: the send time), `--messages` in all, in four ways ([Schuchart 2021]):
//!
//! * `inline`: a continuation run by the thread whose progress completed the receive;
//! * `pool`: a continuation run as a task of the rank's pool;
//! * `task`: a pool task per receive that awaits the request (`req.await`);
//! * `sync`: the receives attached to a sync object whose completions threads take.
//!
//! `--threads` threads of rank 1 drive it: they wait on the continuation request (`inline`,
//! `pool`), are the pool's workers (`task`; `pool` has as many), or take the sync object's
//! completions (`sync`). Rank 0 sends from the main thread.
//!
//! With `--rate R`, rank 0 sends at most `R` messages a second (each at its time, the first
//! of a round at once): below what the receiving side completes a second, the latency is
//! then the receiving side's own. Unpaced, with many receives in flight, a message also waits
//! behind those of its burst that the sender got ahead with (up to an inbox's worth and the
//! frames queued behind it), so a mode whose waiting threads take cores from the sender
//! shows less of that wait (docs/BENCHMARKS.md).
//!
//! Columns: `mode,threads,in_flight,messages,completions_per_sec,mean_latency_us,
//! completion_to_callback_us` (`completions_per_sec`: messages over the time from the first
//! send to the last completion seen; `mean_latency_us`: from a message's send to its
//! completion seen by the callback, task or thread, so with the message's wait in the
//! transport queue; `completion_to_callback_us`: from the receive's completion, stamped
//! where the runtime completes it for every mode alike (`weft_sync::stamps`), to the same
//! instant seen; `-` where the stamps do not match the messages one for one: a task that
//! finds its receive complete at its first poll registered no waker and is not stamped, and
//! a send of rank 0 that had to wait for room in a full inbox is stamped too).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use weft::{Communicator, Invoke, Request, Runtime, Status};

use crate::plot::Chart;
use crate::report::{parse_list, Output, PlotTo, Table};

/// Options of `weft-bench continuations`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Modes to sweep (comma list of `inline`, `pool`, `task`, `sync`).
    #[arg(long, default_value = "inline,pool,task,sync")]
    mode: String,
    /// Threads of the receiving rank to sweep (comma list).
    #[arg(short = 't', long, default_value = "1,2,4,8")]
    threads: String,
    /// Receives in flight at once to sweep (comma list).
    #[arg(short = 'n', long, default_value = "1,100,10000")]
    in_flight: String,
    /// Messages per configuration (rounded up to whole rounds of `in_flight`).
    #[arg(long, default_value_t = 20_000)]
    messages: usize,
    /// Messages a second rank 0 sends at most (0: as fast as it can).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// Count the receiving rank's lock acquisitions and parks, printed per configuration on
    /// stderr (CRI locks: acquisitions, contended, productive and unproductive polls;
    /// matching locks: acquisitions, contended; parks, wakes), and where the time went: the
    /// receiving threads' CPU time a message and the times they lost their core (involuntary
    /// context switches; not for `task`, whose threads are the pool's), and the sender's
    /// messages a second over its send loops (below the pace: the sender is the limit).
    #[arg(long)]
    lock_stats: bool,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
}

/// What completions record: their count and the sum of their latencies.
struct Seen {
    t0: Instant,
    count: AtomicUsize,
    nanos: AtomicU64,
    /// The instants the completions were seen at, nanoseconds after the stamps' epoch.
    seen_at: AtomicU64,
}

impl Seen {
    /// A message (its send time, nanoseconds after `t0`) seen complete now.
    fn record(&self, buf: &[u64]) {
        let now = self.t0.elapsed().as_nanos() as u64;
        self.nanos.fetch_add(now.saturating_sub(buf.first().copied().unwrap_or(now)), Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.seen_at.fetch_add(weft_sync::stamps::now_nanos(), Ordering::Relaxed);
    }
}

/// CPU time (ns) and involuntary context switches of the calling thread so far.
fn thread_usage() -> (u64, u64) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` only writes the struct it is given; all-zero is a valid `rusage`.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, ru.as_mut_ptr()) } != 0 {
        return (0, 0);
    }
    // SAFETY: zeroed, then filled by `getrusage`.
    let ru = unsafe { ru.assume_init() };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    (ns(ru.ru_utime) + ns(ru.ru_stime), ru.ru_nivcsw as u64)
}

/// What a thread used while it ran `f`, added to `into` (CPU ns, involuntary switches, wall
/// ns), if there is an `into` (`--lock-stats`: else `f` alone, no system call around it).
fn usage_of<R>(into: Option<&[AtomicU64; 3]>, f: impl FnOnce() -> R) -> R {
    let Some(into) = into else { return f() };
    let (cpu, lost) = thread_usage();
    let start = Instant::now();
    let r = f();
    let wall = start.elapsed().as_nanos() as u64;
    let (cpu2, lost2) = thread_usage();
    into[0].fetch_add(cpu2.saturating_sub(cpu), Ordering::Relaxed);
    into[1].fetch_add(lost2.saturating_sub(lost), Ordering::Relaxed);
    into[2].fetch_add(wall, Ordering::Relaxed);
    r
}

/// A receive's result, for the ways that are given one.
type Got = Result<(Vec<u64>, Status), weft::Error>;

/// Posts one round's receives on `comm` (tag 1 from rank 0) the way `mode` says; returns
/// what the round's waiters need.
fn post<'c>(mode: &str, rt: &Runtime, comm: &'c Communicator, n: usize, seen: &Arc<Seen>, cr: &weft::ContinuationRequest) -> Round<'c> {
    let recv = |c: &'c Communicator| c.irecv(Vec::<u64>::with_capacity(1), 0u32, 1).expect("irecv");
    match mode {
        "inline" | "pool" => {
            let invoke = if mode == "inline" { Invoke::Inline } else { Invoke::Pool };
            for _ in 0..n {
                let seen = seen.clone();
                let mut r = recv(comm);
                cr.attach(&mut r, invoke, move |res: Got| seen.record(&res.expect("receive").0)).expect("attach");
            }
            Round::Continuations
        }
        "task" => {
            let posted = Arc::new(AtomicUsize::new(0));
            let handles = (0..n)
                .map(|_| {
                    let (comm, seen, posted) = (rt.world().clone(), seen.clone(), posted.clone());
                    rt.spawn(async move {
                        let r = comm.irecv(Vec::<u64>::with_capacity(1), 0u32, 1).expect("irecv");
                        posted.fetch_add(1, Ordering::Release);
                        let got: Got = r.await;
                        seen.record(&got.expect("receive").0);
                    })
                })
                .collect();
            // Every receive posted before the sends, as in the other modes.
            while posted.load(Ordering::Acquire) < n {
                std::thread::yield_now();
            }
            Round::Tasks(handles)
        }
        _ => {
            let sync = rt.sync_object::<usize>();
            let reqs: Vec<Mutex<Request<'c, Vec<u64>>>> = (0..n)
                .map(|i| {
                    let mut r = recv(comm);
                    sync.attach(&mut r, i).expect("attach");
                    Mutex::new(r)
                })
                .collect();
            Round::Sync(sync, reqs)
        }
    }
}

/// One round's waiters' share.
enum Round<'c> {
    Continuations,
    Tasks(Vec<weft::JoinHandle<()>>),
    Sync(weft::SyncObject<usize>, Vec<Mutex<Request<'c, Vec<u64>>>>),
}

/// What one configuration measured.
struct Measured {
    /// Completions a second.
    rate: f64,
    /// Mean send-to-callback latency, µs.
    latency: f64,
    /// Mean completion-to-callback latency, µs (`None`: some completion was not stamped).
    from_completion: Option<f64>,
}

/// One configuration: completions per second and mean latencies in microseconds.
fn measure(mode: &str, threads: usize, n: usize, messages: usize, rate: f64, lock_stats: bool) -> Result<Measured, String> {
    let workers = if matches!(mode, "pool" | "task") { threads } else { 0 };
    let rts = Runtime::builder().workers(workers).lock_stats(lock_stats).build_local(2).map_err(|e| e.to_string())?;
    let (a, b) = (rts[0].world(), rts[1].world());
    let rounds = messages.div_ceil(n);
    let seen = Arc::new(Seen { t0: Instant::now(), count: AtomicUsize::new(0), nanos: AtomicU64::new(0), seen_at: AtomicU64::new(0) });
    let cr = rts[1].continuation_request();
    let mut first_send = None;
    // The receiving threads' CPU time and lost cores; the sender's time in its send loops.
    let receivers = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];
    let mut sending = std::time::Duration::ZERO;
    weft_sync::stamps::start();
    for _ in 0..rounds {
        let round = post(mode, &rts[1], b, n, &seen, &cr);
        let start = seen.t0.elapsed();
        first_send.get_or_insert(start);
        // Completions the `sync` threads have claimed.
        let taken = AtomicUsize::new(0);
        let (taken, seen, receivers) = (&taken, &seen, lock_stats.then_some(&receivers));
        std::thread::scope(|s| {
            match &round {
                Round::Continuations => {
                    for _ in 0..threads {
                        s.spawn(|| usage_of(receivers, || cr.wait().expect("continuations")));
                    }
                }
                Round::Tasks(_) => {}
                Round::Sync(sync, reqs) => {
                    for _ in 0..threads {
                        s.spawn(move || {
                            usage_of(receivers, || {
                                while taken.fetch_add(1, Ordering::Relaxed) < n {
                                    let c = sync.wait_any().expect("a completion");
                                    let got = reqs[c.data].lock().expect("request").take().expect("complete");
                                    seen.record(&got.expect("receive").0);
                                }
                            })
                        });
                    }
                }
            }
            // Paced: message `i` of the round leaves no earlier than `i / rate` after the first.
            let gap = if rate > 0.0 { 1e9 / rate } else { 0.0 };
            let first = seen.t0.elapsed().as_nanos() as u64;
            let loop_start = Instant::now();
            for i in 0..n {
                let due = first + (i as f64 * gap) as u64;
                let mut now = seen.t0.elapsed().as_nanos() as u64;
                while now < due {
                    std::hint::spin_loop();
                    now = seen.t0.elapsed().as_nanos() as u64;
                }
                a.send(vec![now], 1, 1).expect("send");
            }
            sending += loop_start.elapsed();
        });
        if let Round::Tasks(handles) = round {
            rts[1].block_on(async {
                for h in handles {
                    h.await.expect("a receiving task panicked");
                }
            });
        }
    }
    let secs = (seen.t0.elapsed() - first_send.unwrap_or_default()).as_secs_f64();
    let (stamped, stamps) = weft_sync::stamps::stop();
    if lock_stats {
        let c = rts[1].counters();
        let (cri, m) = (c.cri_lock, c.matching_lock);
        eprintln!(
            "# {mode}, {threads} threads, {n} in flight: cri_lock {} acquired, {} contended, {} productive, {} unproductive; \
             matching_lock {} acquired, {} contended; parks {}, wakes {}",
            cri.acquisitions, cri.contended, cri.productive, cri.unproductive, m.acquisitions, m.contended, c.parks, c.wakes
        );
        let messages = (rounds * n) as f64;
        let [cpu, lost, wall] = receivers.map(|r| r.into_inner());
        if mode != "task" {
            eprintln!(
                "# {mode}, {threads} threads, {n} in flight: receiving threads' CPU {:.3} µs a message, on a core {:.0} % of \
                 their waits, {lost} involuntary switches; sender {:.0} messages a second in its send loops",
                cpu as f64 / messages / 1e3,
                100.0 * cpu as f64 / wall.max(1) as f64,
                messages / sending.as_secs_f64()
            );
        }
    }
    let count = seen.count.load(Ordering::Relaxed);
    if count != rounds * n {
        return Err(format!("{mode}: {count} completions seen of {}", rounds * n));
    }
    let from_completion =
        (stamped == count as u64).then(|| (seen.seen_at.load(Ordering::Relaxed) as f64 - stamps as f64).max(0.0) / count as f64 / 1e3);
    Ok(Measured { rate: count as f64 / secs, latency: seen.nanos.load(Ordering::Relaxed) as f64 / count as f64 / 1e3, from_completion })
}

pub fn run(args: &Args) -> Result<(), String> {
    let modes: Vec<String> = parse_list(&args.mode)?;
    let threads: Vec<usize> = parse_list(&args.threads)?;
    let in_flight: Vec<usize> = parse_list(&args.in_flight)?;
    if threads.contains(&0) || in_flight.contains(&0) || args.messages == 0 {
        return Err("threads, in-flight and messages must be at least 1".into());
    }
    if !(args.rate >= 0.0 && args.rate.is_finite()) {
        return Err(format!("--rate must be a number of messages a second, 0 or more (got {})", args.rate));
    }
    if let Some(m) = modes.iter().find(|m| !matches!(m.as_str(), "inline" | "pool" | "task" | "sync")) {
        return Err(format!("unknown mode {m:?} (inline, pool, task, sync)"));
    }
    let mut table = Table::new(
        &["mode", "threads", "in_flight", "messages", "completions_per_sec", "mean_latency_us", "completion_to_callback_us"],
        &args.out,
    );
    if args.rate > 0.0 {
        args.out.note(&format!("# sender paced at {} messages a second", args.rate));
    }
    table.progress(modes.len() * threads.len() * in_flight.len());
    table.print_header();
    for m in &modes {
        for &t in &threads {
            for &n in &in_flight {
                table.step(|| format!("{m}, {t} threads, {n} in flight"));
                let Measured { rate, latency, from_completion } = measure(m, t, n, args.messages, args.rate, args.lock_stats)?;
                let messages = args.messages.div_ceil(n) * n;
                table.row(vec![
                    m.clone(),
                    t.to_string(),
                    n.to_string(),
                    messages.to_string(),
                    format!("{rate:.0}"),
                    format!("{latency:.2}"),
                    from_completion.map_or_else(|| "-".to_string(), |c| format!("{c:.2}")),
                ]);
            }
        }
    }
    let chart = Chart::new("continuations: send to callback, 2 ranks in one process", "in_flight", "receives in flight")
        .y("mean_latency_us", "")
        .y_axis("mean send-to-callback latency (µs)", 1.0)
        .series("mode", "{}")
        .series("threads", "{} threads")
        .log_x()
        .log_y();
    table.finish_with_plot(&chart, &args.plot)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A paced sender sends no faster than its rate: 20 messages at 5,000 a second take at
    /// least 3.8 ms, so no more than about 5,260 complete a second (`measure` checks that
    /// every completion was seen).
    #[test]
    fn a_paced_sender_keeps_its_rate() {
        for mode in ["inline", "sync"] {
            let paced = measure(mode, 1, 20, 20, 5_000.0, false).expect("paced run").rate;
            assert!(paced <= 5_300.0, "{mode}: {paced:.0} completions a second, paced at 5,000");
        }
    }

    /// A rate that is not a number of messages a second, 0 or more, is refused before
    /// anything runs.
    #[test]
    fn a_bad_rate_is_an_error() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        for rate in ["-1", "nan", "inf"] {
            let cli = <Cli as clap::Parser>::try_parse_from(["continuations", &format!("--rate={rate}")]).expect("parsed");
            let err = run(&cli.args).expect_err(rate);
            assert!(err.contains("--rate must be"), "{rate}: {err}");
        }
    }
}
