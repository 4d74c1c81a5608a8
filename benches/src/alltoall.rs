//! `weft-bench alltoall`: the all-to-all exchange an MPI user writes first, timed per round
//! in real processes (`weftrun -n N` on `shm` or `tcp`).
//!
//! Every rank posts a receive from every other rank, sends `-s` bytes to every other rank
//! (`isend`, one request each) and waits for all of them (`wait_all`); that is one round.
//! Above the eager threshold (16 KiB by default) every message is a rendezvous: the
//! receiver reads the sender's buffer once matched, so all ranks serve each other's reads
//! while they wait for their own, the pattern that must never deadlock. Each payload
//! carries its source and round, checked on arrival.
//!
//! The time per round is rank 0's wall time over `-r` rounds (after `--warmup` rounds, all
//! ranks released together by a barrier) divided by the rounds; medians over `--runs`
//! runs. Every run is a fresh job under `weftrun --timeout`: a hang fails the benchmark
//! with the job's output instead of stalling it.
//!
//! `--openmpi` runs the same rounds written against MPI (`benches/peers/alltoall.c`,
//! `MPI_Isend`/`MPI_Irecv`/`MPI_Waitall`, built with `mpicc`; Debian `openmpi-bin
//! libopenmpi-dev`) under `mpirun` with one process per rank — `btl=self,vader` for shm,
//! `btl=self,tcp` on `lo` for tcp, `pml=ob1`, `--oversubscribe --bind-to none` — alternating
//! with weft's runs; `ratio` is the median of each pair's weft/Open MPI ratio.

use std::time::Instant;

use clap::Args as ClapArgs;
use weft::{Provider, Runtime, Source};

use crate::mpi_peer::{Flavor, Peer};
use crate::multirate::cross_barrier;
use crate::plot::Chart;
use crate::report::{median, parse_list, Output, PlotTo, Table};

/// Tag of the exchange's messages.
const DATA_TAG: i32 = 1;

/// Options of `weft-bench alltoall`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Providers: shm, tcp.
    #[arg(long, default_value = "shm,tcp")]
    provider: String,
    /// Ranks (processes) per job.
    #[arg(short = 'n', long = "ranks", default_value = "2,4,8")]
    ranks: String,
    /// Bytes each rank sends to each other rank per round.
    #[arg(short = 's', long = "size", default_value = "65536")]
    size: String,
    /// Timed rounds per run (at a microsecond a round, a run of 50 would time mostly its
    /// start).
    #[arg(short = 'r', long = "rounds", default_value_t = 500)]
    rounds: usize,
    /// Untimed rounds before the timed ones: more than the 8 slots of a ring of large frames
    /// between two ranks on one host, whose first use in a job faults their pages in.
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    /// Runs (jobs) per configuration; the median is reported.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Seconds a job may take before weftrun stops it (a hang fails the benchmark).
    #[arg(long, default_value_t = 120)]
    timeout: u64,
    /// Also run the same rounds with Open MPI (mpicc, mpirun), alternating with weft's runs.
    #[arg(long)]
    openmpi: bool,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
    /// Internal: one rank of a launched job.
    #[arg(long, hide = true)]
    rank_worker: bool,
}

/// Runs the sweep (or, with `--rank-worker`, one rank of a job).
pub fn run(a: &Args) -> Result<(), String> {
    let providers: Vec<Provider> = a.provider.split(',').map(|p| p.parse().map_err(|e| format!("{e}"))).collect::<Result<_, _>>()?;
    let ranks: Vec<u32> = parse_list(&a.ranks)?;
    let sizes: Vec<usize> = parse_list(&a.size)?;
    if a.rounds == 0 || a.runs == 0 || providers.is_empty() || providers.contains(&Provider::Embedded) {
        return Err("rounds and runs must be positive; providers are shm and tcp".into());
    }
    if ranks.iter().any(|&n| n < 2) || sizes.is_empty() {
        return Err("every job needs at least 2 ranks, and a size is needed".into());
    }
    if a.rank_worker {
        return worker(sizes[0], a.rounds, a.warmup);
    }
    let peer = if a.openmpi { Some(Peer::build(Flavor::OpenMpi, "alltoall-mpi", include_str!("../peers/alltoall.c"))?) } else { None };
    let mut table =
        Table::new(&["provider", "ranks", "size", "round_us", "min_us", "max_us", "rank_gbps", "ompi_round_us", "ratio"], &a.out);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    a.out.note(&format!(
        "# weft-bench alltoall: isend/irecv to every other rank + wait_all per round, rounds={} warmup={} runs={} (median) cores={cores}",
        a.rounds, a.warmup, a.runs,
    ));
    table.progress(providers.len() * ranks.len() * sizes.len() * a.runs);
    table.print_header();
    for &p in &providers {
        for &n in &ranks {
            for &size in &sizes {
                let (mut us, mut ompi) = (Vec::with_capacity(a.runs), Vec::with_capacity(a.runs));
                for run in 0..a.runs {
                    table.step(|| format!("{p}, {n} ranks, {size} B, run {}", run + 1));
                    us.push(launch(a, p, n, size)?);
                    if let Some(peer) = &peer {
                        ompi.push(peer.run(
                            n as usize,
                            p,
                            a.timeout,
                            &[size.to_string(), a.rounds.to_string(), a.warmup.to_string()],
                            "ROUND_US",
                        )?);
                    }
                }
                // Each pair of runs was taken back to back: their ratio cancels the machine's
                // slow phases.
                let pairs: Vec<f64> = us.iter().zip(&ompi).map(|(w, o)| w / o).collect();
                let (ompi_cell, ratio_cell) = if ompi.is_empty() {
                    ("-".to_string(), "-".to_string())
                } else {
                    (format!("{:.1}", median(&ompi)), format!("{:.2}", median(&pairs)))
                };
                let med = median(&us);
                let min = us.iter().copied().fold(f64::INFINITY, f64::min);
                let max = us.iter().copied().fold(0.0, f64::max);
                // What one rank receives per second: (n - 1) messages of `size` a round.
                let gbps = (n as f64 - 1.0) * size as f64 / (med * 1e-6) / 1e9;
                table.row(vec![
                    p.to_string(),
                    n.to_string(),
                    size.to_string(),
                    format!("{med:.1}"),
                    format!("{min:.1}"),
                    format!("{max:.1}"),
                    format!("{gbps:.2}"),
                    ompi_cell,
                    ratio_cell,
                ]);
            }
        }
    }
    table.finish_with_plot(&chart(cores), &a.plot)
}

/// The sweep's chart: time per round against size, weft and Open MPI, a line per job size,
/// a panel per provider.
pub(crate) fn chart(cores: usize) -> Chart {
    Chart::new(
        format!("alltoall: isend/irecv to every rank + wait_all, one process per rank, {cores} cores"),
        "size",
        "bytes to each rank per round",
    )
    .y("round_us", "weft")
    .y("ompi_round_us", "Open MPI")
    .y_axis("time per round (µs)", 1.0)
    .series("ranks", "{} ranks")
    .panels("provider", "provider {}")
    .log_x()
    .log_y()
}

/// One job of `n` ranks through `weftrun`; returns rank 0's time per round in µs.
fn launch(a: &Args, p: Provider, n: u32, size: usize) -> Result<f64, String> {
    let args = ["alltoall", "--rank-worker", "--provider", &p.to_string(), "-n", &n.to_string(), "-s", &size.to_string()]
        .into_iter()
        .map(String::from)
        .chain(["-r".into(), a.rounds.to_string(), "--warmup".into(), a.warmup.to_string()])
        .collect::<Vec<_>>();
    crate::report::weftrun_job(p, n, a.timeout, &args, &format!("all-to-all ({size} B)"), "ROUND_US")
}

/// The first and last bytes of the message `src` sends in `round`.
fn stamp(src: u32, round: usize) -> [u8; 2] {
    [src as u8, round as u8]
}

/// One rank of a job: `warmup` then `rounds` timed rounds; rank 0 prints the time per round.
fn worker(size: usize, rounds: usize, warmup: usize) -> Result<(), String> {
    let e = |e: weft::Error| e.to_string();
    let rt = Runtime::builder().build().map_err(e)?;
    let (me, n) = (rt.rank(), rt.size());
    let c = rt.world();
    let size = size.max(2);
    // Buffers travel with their requests and come back with them: no allocation per round.
    let mut send_bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; size]).collect();
    let mut recv_bufs: Vec<Vec<u8>> = (0..n).map(|_| Vec::with_capacity(size)).collect();
    let mut start = Instant::now();
    for round in 0..warmup + rounds {
        if round == warmup {
            cross_barrier(c)?;
            start = Instant::now();
        }
        // The receives first, then the sends, all waited for at once (`MPI_Waitall` over
        // both, as the MPI version does).
        let mut reqs = Vec::with_capacity(2 * n as usize);
        for peer in (0..n).filter(|&p| p != me) {
            let buf = std::mem::take(&mut recv_bufs[peer as usize]);
            reqs.push(c.irecv(buf, Source::Rank(peer), DATA_TAG).map_err(e)?);
        }
        // Destinations start after this rank, so not every rank sends to rank 0 first.
        for step in 1..n {
            let peer = (me + step) % n;
            let mut buf = std::mem::take(&mut send_bufs[peer as usize]);
            let [first, last] = stamp(me, round);
            buf[0] = first;
            buf[size - 1] = last;
            reqs.push(c.isend(buf, peer, DATA_TAG).map_err(e)?);
        }
        weft::wait_all(&mut reqs).map_err(e)?;
        let (recvs, sends) = reqs.split_at_mut(n as usize - 1);
        for (peer, r) in (0..n).filter(|&p| p != me).zip(recvs) {
            let (buf, st) = r.take().ok_or("receive not complete after wait_all")?.map_err(e)?;
            if st.source != peer || buf.len() != size || [buf[0], buf[size - 1]] != stamp(peer, round) {
                return Err(format!("rank {me} round {round}: wrong message from {peer}: {st:?}, {} bytes", buf.len()));
            }
            recv_bufs[peer as usize] = buf;
        }
        for (step, r) in (1..n).zip(sends) {
            send_bufs[((me + step) % n) as usize] = r.take().ok_or("send not complete after wait_all")?.map_err(e)?.0;
        }
    }
    let elapsed = start.elapsed();
    cross_barrier(c)?;
    if me == 0 {
        println!("ROUND_US {:.3}", elapsed.as_secs_f64() * 1e6 / rounds as f64);
    }
    Ok(())
}
