//! `weft-bench coll`: the latency of the collectives, per collective, rank count and message
//! size, on the embedded provider (ranks as threads of this process) and on `shm` and `tcp`
//! (ranks as processes, `weftrun -n N`, as `multirate` and `alltoall` run them).
//!
//! Every rank makes `--warmup` calls, then (all ranks released together) `--iters` timed
//! calls of the collective on the world communicator, timing its own; `latency_us` is the
//! largest of the ranks' average times per call (what the slowest rank waited), the median
//! over `--runs` runs. `--bytes` is the message of `bcast`, each rank's block of `allgather`
//! and `alltoall`, and the vector of `reduce` and `allreduce` (64-bit integers, summed; at
//! least one); `barrier` ignores it. The allreduce's result is checked on every call.
//!
//! With `mpicc` and `mpirun` on the `PATH` (Open MPI; `--openmpi no` leaves it out) the same
//! calls are timed in the MPI program `benches/peers/coll.c`, one process per rank, shared
//! memory (`btl=self,vader`) beside the embedded and `shm` rows, `btl=self,tcp` on `lo`
//! beside `tcp`, alternating with weft's runs: `ompi_latency_us`.
//!
//! With `--persistent`, each run also times the collective as a persistent request made once
//! (`allreduce_init` and the others, in place) and started and waited for at every call, the
//! buffer refilled before each start as the blocking call copies its send buffer, alternating
//! with the blocking calls: `persistent_us`, timed as `latency_us` is.
//!
//! Columns: `collective,ranks,bytes,latency_us,provider,ompi_latency_us` (and
//! `persistent_us` with `--persistent`, drawn beside). `--plot FILE.svg`
//! draws latency against message size, a line per collective and rank count (weft's and
//! Open MPI's), a panel per provider.

use std::time::Instant;

use clap::Args as ClapArgs;
use weft::{Communicator, Op, Persistent, Provider, Runtime};

use crate::mpi_peer::{Flavor, Peer};
use crate::multirate::cross_barrier;
use crate::plot::Chart;
use crate::report::{median, parse_list, Output, PlotTo, Table};

/// The collectives timed.
const COLLECTIVES: [&str; 6] = ["barrier", "bcast", "reduce", "allreduce", "allgather", "alltoall"];

/// Options of `weft-bench coll`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Providers: embedded (ranks as threads), shm, tcp (ranks as processes through weftrun).
    #[arg(long, default_value = "embedded,shm")]
    provider: String,
    /// Ranks per job (comma list).
    #[arg(short = 'n', long = "ranks", default_value = "2,4,8")]
    ranks: String,
    /// Message sizes in bytes (comma list).
    #[arg(short = 's', long, default_value = "8,1024,65536,1048576")]
    bytes: String,
    /// Collectives (comma list of barrier, bcast, reduce, allreduce, allgather, alltoall).
    #[arg(short = 'c', long, default_value = "allreduce,bcast")]
    collective: String,
    /// Timed calls per run.
    #[arg(short = 'i', long, default_value_t = 200)]
    iters: usize,
    /// Untimed calls before the timed ones.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Runs per configuration; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds a job may take before it is stopped (a hang fails the benchmark).
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Open MPI beside weft: `auto` (when mpicc and mpirun are found), `yes`, `no`.
    #[arg(long, default_value = "auto")]
    openmpi: String,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
    /// Also time each collective as a persistent request, started and waited for per call
    /// (`persistent_us`).
    #[arg(long)]
    persistent: bool,
    /// Internal: one rank of a launched job.
    #[arg(long, hide = true)]
    rank_worker: bool,
}

/// Runs the sweep (or, with `--rank-worker`, one rank of a job).
pub fn run(a: &Args) -> Result<(), String> {
    let providers: Vec<Provider> = a.provider.split(',').map(|p| p.parse().map_err(|e| format!("{e}"))).collect::<Result<_, _>>()?;
    let ranks: Vec<u32> = parse_list(&a.ranks)?;
    let sizes: Vec<usize> = parse_list(&a.bytes)?;
    let colls: Vec<String> = parse_list(&a.collective)?;
    if let Some(c) = colls.iter().find(|c| !COLLECTIVES.contains(&c.as_str())) {
        return Err(format!("unknown collective {c:?} ({})", COLLECTIVES.join(", ")));
    }
    if a.iters == 0 || a.runs == 0 || providers.is_empty() || ranks.contains(&0) || sizes.is_empty() || colls.is_empty() {
        return Err("iterations, runs and ranks must be positive; a provider, a size and a collective are needed".into());
    }
    if a.rank_worker {
        let rt = Runtime::builder().build().map_err(|e| e.to_string())?;
        let us = time_calls(rt.world(), &colls[0], sizes[0], a.iters, a.warmup, a.persistent)?;
        if rt.rank() == 0 {
            println!("LAT_US {us:.3}");
        }
        return Ok(());
    }
    let peer = match a.openmpi.as_str() {
        "no" => None,
        "yes" => Some(Peer::build(Flavor::OpenMpi, "coll-mpi", include_str!("../peers/coll.c"))?),
        "auto" => Peer::build(Flavor::OpenMpi, "coll-mpi", include_str!("../peers/coll.c")).ok().filter(|_| on_path("mpirun.openmpi")),
        other => return Err(format!("--openmpi {other:?}: auto, yes or no")),
    };
    let columns = ["collective", "ranks", "bytes", "latency_us", "provider", "ompi_latency_us", "persistent_us"];
    let mut table = Table::new(&columns[..columns.len() - usize::from(!a.persistent)], &a.out);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    a.out.note(&format!(
        "# weft-bench coll: slowest rank's average per call, iters={} warmup={} runs={} (median) cores={cores} openmpi={} persistent={}",
        a.iters,
        a.warmup,
        a.runs,
        if peer.is_some() { "yes" } else { "no" },
        if a.persistent { "yes" } else { "no" },
    ));
    table.progress(providers.len() * ranks.len() * sizes.len() * colls.len() * a.runs);
    table.print_header();
    for &p in &providers {
        for c in &colls {
            for &n in &ranks {
                for &bytes in &sizes {
                    let (mut us, mut ompi, mut pers) = (Vec::with_capacity(a.runs), Vec::with_capacity(a.runs), Vec::with_capacity(a.runs));
                    for run in 0..a.runs {
                        table.step(|| format!("{p}, {c}, {n} ranks, {bytes} B, run {}", run + 1));
                        let time = |persistent| match p {
                            Provider::Embedded => embedded(n, c, bytes, a, persistent),
                            _ => launch(a, p, n, c, bytes, persistent),
                        };
                        us.push(time(false)?);
                        if a.persistent {
                            pers.push(time(true)?);
                        }
                        if let Some(peer) = &peer {
                            let args = [c.clone(), bytes.to_string(), a.iters.to_string(), a.warmup.to_string()];
                            ompi.push(peer.run(n as usize, p, a.timeout, &args, "LAT_US")?);
                        }
                    }
                    let ompi_cell = if ompi.is_empty() { "-".to_string() } else { format!("{:.2}", median(&ompi)) };
                    let mut row =
                        vec![c.clone(), n.to_string(), bytes.to_string(), format!("{:.2}", median(&us)), p.to_string(), ompi_cell];
                    if a.persistent {
                        row.push(format!("{:.2}", median(&pers)));
                    }
                    table.row(row);
                }
            }
        }
    }
    let mut chart = Chart::new(format!("coll: latency per call, slowest rank, {cores} cores"), "bytes", "message size (bytes)")
        .y("latency_us", "weft")
        .y("ompi_latency_us", "Open MPI");
    if a.persistent {
        chart = chart.y("persistent_us", "weft persistent");
    }
    let chart = chart
        .y_axis("latency per call (µs)", 1.0)
        .series("collective", "{}")
        .series("ranks", "{} ranks")
        .panels("provider", "provider {}")
        .log_x()
        .log_y();
    table.finish_with_plot(&chart, &a.plot)
}

/// Whether `prog` is an executable on the `PATH`.
fn on_path(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| std::env::split_paths(&paths).any(|d| d.join(prog).is_file()))
}

/// One run on `n` ranks of the embedded provider, a thread each.
fn embedded(n: u32, coll: &str, bytes: usize, a: &Args, persistent: bool) -> Result<f64, String> {
    let rts = Runtime::builder().build_local(n).map_err(|e| e.to_string())?;
    let mut out = std::thread::scope(|s| {
        let hs: Vec<_> = rts.iter().map(|rt| s.spawn(move || time_calls(rt.world(), coll, bytes, a.iters, a.warmup, persistent))).collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect::<Result<Vec<f64>, String>>()
    })?;
    Ok(out.swap_remove(0))
}

/// One job of `n` ranks through `weftrun`; returns its latency in µs.
fn launch(a: &Args, p: Provider, n: u32, coll: &str, bytes: usize, persistent: bool) -> Result<f64, String> {
    let args = ["coll", "--rank-worker", "--provider", &p.to_string(), "-n", &n.to_string(), "-c", coll, "-s", &bytes.to_string()]
        .into_iter()
        .map(String::from)
        .chain(["-i".into(), a.iters.to_string(), "--warmup".into(), a.warmup.to_string()])
        .chain(persistent.then(|| "--persistent".to_string()))
        .collect::<Vec<_>>();
    crate::report::weftrun_job(p, n, a.timeout, &args, &format!("{coll} ({bytes} B)"), "LAT_US")
}

/// `warmup` then `iters` timed calls of `coll` on `c` (with `persistent`, starts and waits of
/// it as a persistent request); every rank returns the slowest rank's average time per call
/// in µs.
fn time_calls(c: &Communicator, coll: &str, bytes: usize, iters: usize, warmup: usize, persistent: bool) -> Result<f64, String> {
    if persistent {
        return time_starts(c, coll, bytes, iters, warmup);
    }
    let e = |e: weft::Error| e.to_string();
    let n = c.size() as usize;
    let elems = (bytes / 8).max(1);
    let (mut a, mut b) = (vec![0u8; n * bytes], vec![0u8; n * bytes]);
    let (x, mut y) = (vec![u64::from(c.rank()) + 1; elems], vec![0u64; elems]);
    timed(c, iters, warmup, || {
        match coll {
            "barrier" => c.barrier().map_err(e)?,
            "bcast" => c.bcast(&mut a[..bytes], 0).map_err(e)?,
            "reduce" => c.reduce(&x, &mut y, Op::Sum, 0).map_err(e)?,
            "allreduce" => {
                c.allreduce(&x, &mut y, Op::Sum).map_err(e)?;
                check_sum(c, y[0])?;
            }
            "allgather" => c.allgather(&a[..bytes], &mut b).map_err(e)?,
            "alltoall" => c.alltoall(&a, &mut b).map_err(e)?,
            other => return Err(format!("unknown collective {other:?}")),
        }
        Ok(())
    })
}

/// [`time_calls`] of `coll` as a persistent request (its in-place form), made once; the
/// buffer of a reduction is refilled before each start, as the blocking call copies its send
/// buffer into the receive buffer.
fn time_starts(c: &Communicator, coll: &str, bytes: usize, iters: usize, warmup: usize) -> Result<f64, String> {
    let e = |e: weft::Error| e.to_string();
    let n = c.size() as usize;
    let elems = (bytes / 8).max(1);
    let mine = u64::from(c.rank()) + 1;
    match coll {
        "barrier" => starts(c, c.barrier_init().map_err(e)?, iters, warmup, |_| Ok(())),
        "bcast" => starts(c, c.bcast_init(vec![0u8; bytes], 0).map_err(e)?, iters, warmup, |_| Ok(())),
        "reduce" => starts(c, c.reduce_init(vec![mine; elems], Op::Sum, 0).map_err(e)?, iters, warmup, |b| {
            b.fill(mine);
            Ok(())
        }),
        "allreduce" => starts(c, c.allreduce_init(vec![mine; elems], Op::Sum).map_err(e)?, iters, warmup, |b| {
            check_sum(c, b[0])?;
            b.fill(mine);
            Ok(())
        }),
        "allgather" => starts(c, c.allgather_init(vec![0u8; n * bytes]).map_err(e)?, iters, warmup, |_| Ok(())),
        "alltoall" => starts(c, c.alltoall_init(vec![0u8; n * bytes]).map_err(e)?, iters, warmup, |_| Ok(())),
        other => Err(format!("unknown collective {other:?}")),
    }
}

/// [`timed`] starts and waits of `p`, `between(buffer)` before each start but the first.
fn starts<B: Send + 'static>(
    c: &Communicator,
    mut p: Persistent<'_, B>,
    iters: usize,
    warmup: usize,
    mut between: impl FnMut(&mut B) -> Result<(), String>,
) -> Result<f64, String> {
    let mut first = true;
    timed(c, iters, warmup, || {
        if !first {
            between(p.buffer_mut().ok_or("a persistent request without its buffer")?)?;
        }
        first = false;
        p.start().map_err(|e| e.to_string())?;
        p.wait().map(drop).map_err(|e| e.to_string())
    })
}

/// An allreduce's sum of every rank's `rank + 1`, checked.
fn check_sum(c: &Communicator, got: u64) -> Result<(), String> {
    let n = u64::from(c.size());
    let want = n * (n + 1) / 2;
    if got != want {
        return Err(format!("rank {}: allreduce gave {got} for {want}", c.rank()));
    }
    Ok(())
}

/// `warmup` untimed then `iters` timed calls of `call` on every rank of `c` (released
/// together); the slowest rank's average time per call in µs.
fn timed(c: &Communicator, iters: usize, warmup: usize, mut call: impl FnMut() -> Result<(), String>) -> Result<f64, String> {
    let mut start = Instant::now();
    for it in 0..warmup + iters {
        if it == warmup {
            cross_barrier(c)?;
            start = Instant::now();
        }
        call()?;
    }
    let mine = start.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let mut worst = [0f64];
    c.allreduce(&[mine], &mut worst, Op::Max).map_err(|e| e.to_string())?;
    Ok(worst[0])
}
