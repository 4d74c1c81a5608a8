//! `weft-bench startup`: how long a job takes to start, at 2 to 64 ranks, under `weftrun` and
//! under `mpirun` (PMIx bootstrap, feature `pmix`), beside an MPI library's own `MPI_Init`.
//!
//! Each rank of a job times `Runtime::builder().build()` followed by a barrier on the world
//! (every rank has joined and can reach every other) and prints it; `init_ms` is the
//! slowest rank's time, `job_ms` the job's wall time from starting the launcher to its exit
//! (process creation, start-up, teardown), `cpu_ms` the mean over the ranks of the CPU time
//! each process used until then (user and system, from `exec` on: loading the libraries
//! included), which other work on the machine barely changes: ranks x `cpu_ms` / cores is
//! the least a job's start can take on an oversubscribed machine. `load_ms` is the part of
//! `cpu_ms` spent before `main`: the dynamic loader and the constructors of the libraries
//! (for weft, libfabric's and those it links). With `--peer openmpi` the same is measured for
//! `MPI_Init` + `MPI_Barrier` of the project's C program (`benches/peers/startup.c`) under
//! Open MPI's `mpirun`. Medians of `--runs`; every configuration above 2 ranks is
//! oversubscribed on a 2-core machine, which is what the numbers show there.
//!
//! Under PMIx a rank publishes its addresses with `PMIx_Put`/`PMIx_Commit` and reads every
//! other's after one `PMIx_Fence` with data collection (transport `pmix.rs`): launcher
//! `mpirun`. Launcher `mpirun-lazy` runs the same job with `WEFT_PMIX_EXCHANGE=lazy`: no
//! fence, one `PMIx_Get` per peer that waits for the peer to publish (a direct modex).

use std::process::{Command, Stdio};
use std::time::Instant;

use clap::Args as ClapArgs;
use weft::{Provider, Runtime};

use crate::mpi_peer::{Flavor, Peer};
use crate::report::{median, parse_list, Output, PlotTo, Table};

/// Options of `weft-bench startup`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Ranks per job.
    #[arg(short = 'n', long = "ranks", default_value = "2,4,8,16,32,64")]
    ranks: String,
    /// Launchers: weftrun, mpirun (PMIx, fence exchange), mpirun-lazy (PMIx, `WEFT_PMIX_EXCHANGE=lazy`);
    /// the mpirun ones need weft-bench built with feature `pmix`.
    #[arg(long, default_value = "weftrun")]
    launcher: String,
    /// Provider of the jobs: shm or tcp.
    #[arg(long, default_value = "shm")]
    provider: String,
    /// Jobs per configuration; the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds a job may take.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Also time an MPI library's `MPI_Init` + `MPI_Barrier` (`openmpi`).
    #[arg(long)]
    peer: Option<String>,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
    /// Internal: one rank of a job.
    #[arg(long, hide = true)]
    rank_worker: bool,
}

/// What a rank prints: its rank and its start-up time in µs.
const KEY: &str = "STARTUP_US";

/// CPU time (user and system) this process has used, in µs.
fn cpu_us() -> f64 {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `ru` is a writable rusage; RUSAGE_SELF is always valid.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr()) } != 0 {
        return f64::NAN;
    }
    // SAFETY: getrusage succeeded and filled it.
    let ru = unsafe { ru.assume_init() };
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// One rank: time the runtime's start and a barrier, print it, the CPU time used and the
/// part of it used before `main`.
fn rank_worker() -> Result<(), String> {
    let loaded = cpu_us();
    let t0 = Instant::now();
    let rt = Runtime::builder().build().map_err(|e| e.to_string())?;
    rt.world().barrier().map_err(|e| e.to_string())?;
    let us = t0.elapsed().as_secs_f64() * 1e6;
    println!("{KEY} {} {us:.0} {:.0} {loaded:.0}", rt.rank(), cpu_us());
    // Nobody leaves while a peer may still be starting.
    rt.world().barrier().map_err(|e| e.to_string())?;
    Ok(())
}

/// What a job's ranks reported: the slowest rank's start and the means over the ranks of
/// the CPU time in all and before `main`, in µs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reported {
    slowest_us: f64,
    cpu_us: f64,
    load_us: f64,
}

/// What the ranks reported in `stdout` (lines `[r] STARTUP_US r us cpu_us load_us` or
/// `STARTUP_US r us cpu_us load_us`), if every one of `ranks` did.
fn reported(stdout: &str, ranks: usize) -> Option<Reported> {
    let mut seen = vec![None; ranks];
    for l in stdout.lines() {
        let Some(rest) = l.split_once(KEY).map(|(_, r)| r.trim()) else { continue };
        let mut it = rest.split_whitespace();
        let mut num = || it.next().and_then(|v| v.parse::<f64>().ok());
        let (Some(r), Some(us), Some(cpu), Some(load)) = (num(), num(), num(), num()) else { continue };
        if let Some(slot) = seen.get_mut(r as usize) {
            *slot = Some((us, cpu, load));
        }
    }
    let seen = seen.into_iter().collect::<Option<Vec<_>>>()?;
    let mean = |f: fn(&(f64, f64, f64)) -> f64| seen.iter().map(f).sum::<f64>() / ranks as f64;
    Some(Reported { slowest_us: seen.iter().fold(0.0f64, |m, v| m.max(v.0)), cpu_us: mean(|v| v.1), load_us: mean(|v| v.2) })
}

/// One job of `n` ranks: what its ranks reported and the job's wall time in ms.
fn job(launcher: &str, n: usize, provider: Provider, timeout: u64) -> Result<(Reported, f64), String> {
    let (exe, weftrun) = crate::report::self_and_weftrun()?;
    let mut cmd = match launcher {
        "weftrun" => {
            let mut c = Command::new(&weftrun);
            c.args(["-n", &n.to_string(), "--provider", &provider.to_string(), "--timeout", &timeout.to_string()]);
            c
        }
        "mpirun" | "mpirun-lazy" => {
            let mut c = Command::new("timeout");
            c.arg(timeout.to_string())
                .args(["mpirun.openmpi", "--oversubscribe", "--bind-to", "none", "-np", &n.to_string()])
                .args(["-x", "WEFT_PROVIDER", "-x", "FI_TCP_IFACE", "-x", "WEFT_PMIX_EXCHANGE"])
                .env("WEFT_PROVIDER", provider.to_string())
                .env("WEFT_PMIX_EXCHANGE", if launcher == "mpirun-lazy" { "lazy" } else { "fence" })
                .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                .env("OMPI_MCA_oob_tcp_if_include", "lo");
            if std::env::var_os("LD_LIBRARY_PATH").is_some() {
                // Ranks load the libraries weftrun's would (another libfabric, say).
                c.args(["-x", "LD_LIBRARY_PATH"]);
            }
            c
        }
        o => return Err(format!("unknown launcher {o:?} (weftrun, mpirun, mpirun-lazy)")),
    };
    cmd.arg(&exe).args(["startup", "--rank-worker"]).env("FI_TCP_IFACE", "lo").stdin(Stdio::null());
    let t0 = Instant::now();
    let out = cmd.output().map_err(|e| format!("{launcher}: {e}"))?;
    let wall = t0.elapsed().as_secs_f64() * 1e3;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{launcher} job of {n} ranks failed ({}):\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    let r = reported(&stdout, n).ok_or_else(|| format!("not every rank of the {launcher} job reported its start:\n{stdout}"))?;
    Ok((r, wall))
}

/// Runs the sweep.
pub fn run(a: &Args) -> Result<(), String> {
    if a.rank_worker {
        return rank_worker();
    }
    let ranks: Vec<usize> = parse_list(&a.ranks)?;
    let launchers: Vec<String> = a.launcher.split(',').map(|s| s.trim().to_string()).collect();
    let provider: Provider = a.provider.parse().map_err(|e: weft::Error| e.to_string())?;
    if provider == Provider::Embedded || ranks.contains(&0) || a.runs == 0 {
        return Err("startup runs jobs of 1 or more ranks on shm or tcp, at least once".into());
    }
    if launchers.iter().any(|l| l.starts_with("mpirun")) && !cfg!(feature = "pmix") {
        return Err("--launcher mpirun (and mpirun-lazy) needs weft-bench built with feature `pmix` (PMIx bootstrap)".into());
    }
    let peer = match &a.peer {
        Some(f) => Some(Peer::build(f.parse::<Flavor>()?, "startup-mpi", include_str!("../peers/startup.c"))?),
        None => None,
    };
    let mut table = Table::new(&["launcher", "ranks", "provider", "init_ms", "job_ms", "cpu_ms", "load_ms"], &a.out);
    a.out.note(&format!(
        "# weft-bench startup: build() + barrier on every rank (the slowest), the job's wall time, CPU time per rank until then and before main; runs={} (median) cores={}",
        a.runs,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    ));
    let rows = launchers.len() + usize::from(peer.is_some());
    table.progress(rows * ranks.len() * a.runs);
    table.print_header();
    for &n in &ranks {
        for launcher in &launchers {
            let mut runs = Vec::new();
            for run in 0..a.runs {
                table.step(|| format!("{launcher}, {n} ranks, run {}", run + 1));
                runs.push(job(launcher, n, provider, a.timeout)?);
            }
            table.row(row(launcher.clone(), n, provider, &runs));
        }
        if let Some(peer) = &peer {
            let mut runs = Vec::new();
            for run in 0..a.runs {
                table.step(|| format!("{}, {n} ranks, run {}", peer.flavor().name(), run + 1));
                let t0 = Instant::now();
                let v = peer.run_keys(n, provider, a.timeout, &[], &["STARTUP_MAX_US", "STARTUP_CPU_US", "STARTUP_LOAD_US"])?;
                let wall = t0.elapsed().as_secs_f64() * 1e3;
                runs.push((Reported { slowest_us: v[0], cpu_us: v[1], load_us: v[2] }, wall));
            }
            table.row(row(format!("{} mpirun", peer.flavor().name()), n, provider, &runs));
        }
    }
    let chart = crate::plot::Chart::new("startup: slowest rank's start (build + barrier)".to_string(), "ranks", "ranks")
        .y("init_ms", "")
        .y_axis("start-up (ms)", 1.0)
        .series("launcher", "{}")
        .log2_x();
    table.finish_with_plot(&chart, &a.plot)
}

/// A row of the table: medians of the runs (what the ranks reported, the job's wall time).
fn row(launcher: String, n: usize, provider: Provider, runs: &[(Reported, f64)]) -> Vec<String> {
    let ms = |f: fn(&(Reported, f64)) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    vec![
        launcher,
        n.to_string(),
        provider.to_string(),
        format!("{:.1}", ms(|r| r.0.slowest_us / 1e3)),
        format!("{:.0}", ms(|r| r.1)),
        format!("{:.0}", ms(|r| r.0.cpu_us / 1e3)),
        format!("{:.0}", ms(|r| r.0.load_us / 1e3)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_rank_is_read_from_either_launchers_output() {
        let weftrun = "[1] STARTUP_US 1 2500 90 10\n[0] STARTUP_US 0 1200 110 14\n[0] other\n";
        assert_eq!(reported(weftrun, 2), Some(Reported { slowest_us: 2500.0, cpu_us: 100.0, load_us: 12.0 }));
        assert_eq!(reported("STARTUP_US 0 10 1 1\nSTARTUP_US 2 30 1 1\n", 3), None, "rank 1 missing");
        assert_eq!(reported("STARTUP_US 0 10 1 1\nSTARTUP_US 1 x 1 1\n", 2), None);
        assert_eq!(reported("STARTUP_US 0 10 1 1\nSTARTUP_US 1 20 1\n", 2), None, "no CPU time before main");
    }
}
