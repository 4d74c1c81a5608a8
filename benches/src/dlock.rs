//! `weft-bench dlock`: the distributed locks of `weft::dlock` under the seed's benchmarks
//! [Schmid 2016, §5.1], on `--ranks` ranks in this process (embedded provider by default;
//! `shm` and `tcp` with the `ofi` feature) or, with `--launch weftrun`, as that many
//! processes started through `weftrun` (`shm`, `tcp`), `--threads` threads per rank, or,
//! with `--tasks N`, `N` tasks on each of those threads (a one-thread tokio runtime per
//! thread) acquiring with the `_async` calls (`lock_async`, `read_async`, `write_async`,
//! `unlock_async`), so that a rank's tasks wait for the lock side by side:
//!
//! - `lb`: latency of one acquire and release (the `latency_us` column; no work inside);
//! - `ecsb`: empty critical section;
//! - `sob`: one remote memory access inside (a read for a reader, an increment for a writer);
//! - `wcsb`: a shared counter incremented, then 1-4 µs of local work inside;
//! - `warb`: empty critical section, then 1-4 µs of waiting after the release.
//!
//! Each acquisition is a write with probability `--writers` (`F_W`; the mutual-exclusion
//! locks always write and report 1). RMA-MCS and RMA-RW use `--levels` simulated machine
//! levels (ranks per node, then nodes per rack, ...), the same for every row. With
//! `--level-cost-ns` (one cost per level), the embedded provider simulates that machine: an
//! RMA operation between ranks of different nodes (racks, ...) is delayed by the cost of
//! each level it crosses (`weft::LevelCost`); every row and the header note state the model.
//!
//! Columns: `bench,lock,provider,launch,ranks,threads,tasks,writers_fraction,t_dc,t_l,t_r,levels,level_cost_ns,ops_per_sec,latency_us`
//! (`launch`: `in-process` or `weftrun`; `tasks`: per thread, 0 where the threads acquire
//! with the blocking calls; `ops_per_sec`: acquisitions of all ranks per second;
//! `latency_us`: mean time of one acquire plus release (per task with `--tasks`, from its
//! first poll: the time it waited behind its rank's other tasks counts); `t_dc`, `t_l`, `t_r` are `-`
//! where the lock has none; `levels` is `--levels` and `level_cost_ns` the crossing costs,
//! `/`-separated, `0` with no cost, `-` on libfabric). A last note (stderr with `--csv`)
//! states the process's peak RSS (the in-process ranks').

use std::time::{Duration, Instant};

use weft::dlock::{DMcs, FompiRw, Levels, RmaMcs, RmaRw, SpinLock, Thresholds};
use weft::rma::{Op, Window};
use weft::{Communicator, LevelCost, Provider, Runtime};

use crate::report::{rank0_value, weftrun_output};

use crate::plot::Chart;
use crate::report::{parse_list, Output, PlotTo, Table};

/// Options of `weft-bench dlock`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Benchmarks to sweep (comma list of `lb`, `ecsb`, `sob`, `wcsb`, `warb`).
    #[arg(long, default_value = "lb,ecsb,sob")]
    bench: String,
    /// Locks to sweep (comma list of `d-mcs`, `rma-mcs`, `rma-rw`, `fompi-spin`, `fompi-rw`).
    #[arg(long, default_value = "d-mcs,rma-mcs,rma-rw,fompi-spin,fompi-rw")]
    lock: String,
    /// Rank counts to sweep (comma list; ranks are in this process).
    #[arg(short = 'r', long, default_value = "4")]
    ranks: String,
    /// Threads per rank to sweep (comma list).
    #[arg(short = 't', long, default_value = "1")]
    threads: String,
    /// Tasks per thread to sweep (comma list): each of a rank's threads runs that many
    /// tasks, each acquiring `--ops` times with the `_async` calls; 0: the threads acquire
    /// themselves with the blocking calls.
    #[arg(long, default_value = "0")]
    tasks: String,
    /// Providers to sweep (comma list of `embedded`, `shm`, `tcp`).
    #[arg(long, default_value = "embedded")]
    provider: String,
    /// How ranks run (comma list): `in-process` (threads of this process) or `weftrun` (one
    /// process per rank through `weftrun`, on `shm` or `tcp`).
    #[arg(long, default_value = "in-process")]
    launch: String,
    /// Seconds a `weftrun` job may take before it is stopped.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
    /// Fractions of writers `F_W` to sweep for the reader-writer locks (comma list).
    #[arg(long, default_value = "0.002")]
    writers: String,
    /// Simulated machine levels of RMA-MCS and RMA-RW, innermost first (`2` is 2 ranks per
    /// node; `4,2` also 2 nodes per rack; `flat` is one level).
    #[arg(long, default_value = "2")]
    levels: String,
    /// Delay of an RMA operation that crosses each simulated level, in nanoseconds, innermost
    /// first (one per `--levels` size; embedded provider); `0`: no cost.
    #[arg(long, default_value = "0")]
    level_cost_ns: String,
    /// `T_DC` values to sweep (RMA-RW; 0: one counter per node).
    #[arg(long, default_value = "0")]
    t_dc: String,
    /// `T_L,i` values to sweep (RMA-MCS, RMA-RW): each one value for every level, or one
    /// per level, `/`-separated from `T_L,1` (the machine) inward (`1/64/16`: 64 for a
    /// rack, 16 for a node); a shorter list repeats its last value.
    #[arg(long, default_value = "16")]
    t_l: String,
    /// `T_R` values to sweep (RMA-RW).
    #[arg(long, default_value = "1000")]
    t_r: String,
    /// Acquisitions per thread in one measurement.
    #[arg(long, default_value_t = 200)]
    ops: u64,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
    /// Internal: one rank of a launched job (one value of each option).
    #[arg(long, hide = true)]
    rank_worker: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bench {
    Lb,
    Ecsb,
    Sob,
    Wcsb,
    Warb,
}

impl Bench {
    fn name(self) -> &'static str {
        match self {
            Bench::Lb => "lb",
            Bench::Ecsb => "ecsb",
            Bench::Sob => "sob",
            Bench::Wcsb => "wcsb",
            Bench::Warb => "warb",
        }
    }
}

/// Where the ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Launch {
    InProcess,
    Weftrun,
}

impl std::str::FromStr for Launch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "in-process" => Ok(Launch::InProcess),
            "weftrun" => Ok(Launch::Weftrun),
            _ => Err(format!("unknown launch {s:?} (in-process, weftrun)")),
        }
    }
}

impl std::fmt::Display for Launch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Launch::InProcess => "in-process",
            Launch::Weftrun => "weftrun",
        })
    }
}

impl std::str::FromStr for Bench {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "lb" => Bench::Lb,
            "ecsb" => Bench::Ecsb,
            "sob" => Bench::Sob,
            "wcsb" => Bench::Wcsb,
            "warb" => Bench::Warb,
            _ => return Err(format!("unknown benchmark {s:?} (lb, ecsb, sob, wcsb, warb)")),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    DMcs,
    RmaMcs,
    RmaRw,
    FompiSpin,
    FompiRw,
}

impl std::str::FromStr for Kind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "d-mcs" => Kind::DMcs,
            "rma-mcs" => Kind::RmaMcs,
            "rma-rw" => Kind::RmaRw,
            "fompi-spin" => Kind::FompiSpin,
            "fompi-rw" => Kind::FompiRw,
            _ => return Err(format!("unknown lock {s:?} (d-mcs, rma-mcs, rma-rw, fompi-spin, fompi-rw)")),
        })
    }
}

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::DMcs => "d-mcs",
            Kind::RmaMcs => "rma-mcs",
            Kind::RmaRw => "rma-rw",
            Kind::FompiSpin => "fompi-spin",
            Kind::FompiRw => "fompi-rw",
        }
    }

    fn has_readers(self) -> bool {
        matches!(self, Kind::RmaRw | Kind::FompiRw)
    }
}

/// One of the locks, built on one rank.
enum AnyLock {
    DMcs(DMcs),
    RmaMcs(RmaMcs),
    RmaRw(RmaRw),
    Spin(SpinLock),
    FompiRw(FompiRw),
}

impl AnyLock {
    fn new(kind: Kind, comm: &Communicator, levels: &Levels, t: &Thresholds) -> Result<Self, weft::Error> {
        Ok(match kind {
            Kind::DMcs => AnyLock::DMcs(DMcs::new(comm, 0)?),
            Kind::RmaMcs => AnyLock::RmaMcs(RmaMcs::new(comm, levels, t)?),
            Kind::RmaRw => AnyLock::RmaRw(RmaRw::new(comm, levels, t)?),
            Kind::FompiSpin => AnyLock::Spin(SpinLock::new(comm, 0)?),
            Kind::FompiRw => AnyLock::FompiRw(FompiRw::new(comm, 0)?),
        })
    }

    /// As [`cycle`](Self::cycle), with the `_async` calls: the task parks while it waits.
    async fn cycle_async(&self, write: bool, cs: impl FnOnce() -> Result<(), weft::Error>) -> Result<(), weft::Error> {
        // Runs `cs` under the guard, then releases without blocking the thread (a failed
        // `cs` releases by the guard's drop).
        macro_rules! held {
            ($guard:expr) => {{
                let g = $guard;
                cs()?;
                g.unlock_async().await
            }};
        }
        match self {
            AnyLock::DMcs(l) => held!(l.lock_async().await?),
            AnyLock::RmaMcs(l) => held!(l.lock_async().await?),
            AnyLock::Spin(l) => held!(l.lock_async().await?),
            AnyLock::RmaRw(l) => held!(if write { l.write_async().await } else { l.read_async().await }?),
            AnyLock::FompiRw(l) => held!(if write { l.write_async().await } else { l.read_async().await }?),
        }
    }

    /// Acquires (as a writer if `write`), runs `cs`, releases.
    fn cycle(&self, write: bool, cs: impl FnOnce() -> Result<(), weft::Error>) -> Result<(), weft::Error> {
        match self {
            AnyLock::DMcs(l) => l.lock().and_then(|g| cs().and_then(|()| g.unlock())),
            AnyLock::RmaMcs(l) => l.lock().and_then(|g| cs().and_then(|()| g.unlock())),
            AnyLock::Spin(l) => l.lock().and_then(|g| cs().and_then(|()| g.unlock())),
            AnyLock::RmaRw(l) => if write { l.write() } else { l.read() }.and_then(|g| cs().and_then(|()| g.unlock())),
            AnyLock::FompiRw(l) => if write { l.write() } else { l.read() }.and_then(|g| cs().and_then(|()| g.unlock())),
        }
    }
}

/// A `T_L,i` per level, `T_L,1` first (`16`, or `1/64/16`; see `--t-l`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct PerLevel(Vec<u64>);

impl std::str::FromStr for PerLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.split('/').map(|v| v.trim().parse::<u64>().map_err(|e| format!("T_L {s:?}: {e}"))).collect::<Result<Vec<_>, _>>()?;
        Ok(PerLevel(t))
    }
}

impl std::fmt::Display for PerLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t: Vec<String> = self.0.iter().map(u64::to_string).collect();
        f.write_str(&t.join("/"))
    }
}

/// Busy work for `d` (the seed's "local computation").
fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// A small per-thread random sequence (xorshift).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// 1-4 µs.
    fn micros(&mut self) -> Duration {
        Duration::from_nanos(1000 + self.next() % 3000)
    }
}

/// One configuration's measurement.
struct Point {
    bench: Bench,
    kind: Kind,
    provider: Provider,
    launch: Launch,
    ranks: u32,
    threads: usize,
    /// Tasks per thread (0: the threads acquire).
    tasks: usize,
    writers: f64,
    thresholds: Thresholds,
}

impl Point {
    /// Who acquires on each thread: its tasks, or the thread itself.
    fn per_thread(&self) -> usize {
        self.tasks.max(1)
    }
}

/// Acquisitions per second over all ranks, and the mean acquire-plus-release time in µs.
fn measure(p: &Point, levels: &Levels, a: &Args) -> Result<(f64, f64), String> {
    if p.launch == Launch::Weftrun {
        return launch(p, a);
    }
    let cost = if p.provider == Provider::Embedded { parse_cost(&a.levels, &a.level_cost_ns)? } else { LevelCost::default() };
    let rts = Runtime::builder().provider(p.provider).level_cost(cost).build_local(p.ranks).map_err(|e| e.to_string())?;
    let results: Vec<Result<(Duration, Duration), weft::Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = rts.iter().map(|rt| s.spawn(move || rank_run(rt.world(), p, levels, a.ops))).collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    });
    let results = results.into_iter().collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    let slowest = results.iter().map(|r| r.0).max().unwrap_or_default();
    let held = results.iter().map(|r| r.1).sum();
    Ok(rates(p, a.ops, slowest, held))
}

/// Acquisitions per second of the job whose slowest rank took `slowest`, and the mean time
/// of one acquisition from `held`, all threads' time inside acquire plus release together.
fn rates(p: &Point, ops: u64, slowest: Duration, held: Duration) -> (f64, f64) {
    let total = f64::from(p.ranks) * (p.threads * p.per_thread()) as f64 * ops as f64;
    (total / slowest.as_secs_f64().max(1e-9), held.as_secs_f64() / total * 1e6)
}

/// One job of `p.ranks` processes through `weftrun`, each running [`rank_run`].
fn launch(p: &Point, a: &Args) -> Result<(f64, f64), String> {
    let mut args: Vec<String> = ["dlock", "--rank-worker", "--bench", p.bench.name(), "--lock", p.kind.name()].map(String::from).to_vec();
    let t = &p.thresholds;
    for (flag, value) in [
        ("--provider", p.provider.to_string()),
        ("--ranks", p.ranks.to_string()),
        ("--threads", p.threads.to_string()),
        ("--tasks", p.tasks.to_string()),
        ("--writers", p.writers.to_string()),
        ("--levels", a.levels.clone()),
        ("--t-dc", t.t_dc.to_string()),
        ("--t-l", PerLevel(t.t_l.clone()).to_string()),
        ("--t-r", t.t_r.to_string()),
        ("--ops", a.ops.to_string()),
    ] {
        args.push(flag.into());
        args.push(value);
    }
    let what = format!("dlock {} {}", p.bench.name(), p.kind.name());
    let out = weftrun_output(p.provider, p.ranks, a.timeout, &args, &what)?;
    match (rank0_value(&out, "OPS"), rank0_value(&out, "LAT_US")) {
        (Some(ops), Some(lat)) => Ok((ops, lat)),
        _ => Err(format!("no OPS and LAT_US in the {what} job's output:\n{out}")),
    }
}

/// One rank's part of a measurement on `c`: `p.threads` threads each acquire `ops` times.
/// Returns the rank's time from the first barrier's end to the last thread's end, and the
/// time its threads spent in acquire plus critical section plus release together.
fn rank_run(c: &Communicator, p: &Point, levels: &Levels, ops: u64) -> Result<(Duration, Duration), weft::Error> {
    let lock = AnyLock::new(p.kind, c, levels, &p.thresholds)?;
    let w: Window<'_, u64> = c.window(1)?;
    c.barrier()?;
    let t0 = Instant::now();
    let inside: Vec<Result<Duration, weft::Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..p.threads)
            .map(|t| {
                let (lock, w) = (&lock, &w);
                s.spawn(move || {
                    let seed = |k: usize| Rng(0x9e37_79b9_7f4a_7c15 ^ ((u64::from(c.rank()) << 20) | (t as u64 + 1)) ^ ((k as u64) << 40));
                    if p.tasks == 0 {
                        let cycle = |write, work| std::future::ready(lock.cycle(write, || critical_section(p.bench, write, work, w)));
                        return futures::executor::block_on(waiter(seed(0), p, ops, cycle));
                    }
                    let rt = tokio::runtime::Builder::new_current_thread().build().expect("a one-thread tokio runtime");
                    rt.block_on(async {
                        let cycle = |write, work| lock.cycle_async(write, move || critical_section(p.bench, write, work, w));
                        let tasks = (0..p.tasks).map(|k| waiter(seed(k + 1), p, ops, cycle));
                        futures::future::join_all(tasks).await.into_iter().sum()
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a benchmark thread panicked")).collect()
    });
    let elapsed = t0.elapsed();
    c.barrier()?;
    let held = inside.into_iter().sum::<Result<Duration, weft::Error>>()?;
    Ok((elapsed, held))
}

/// One waiter's `ops` acquisitions (a thread's, or a task's), each by `cycle(write, work)`
/// (acquire, [`critical_section`], release); the time spent in them.
async fn waiter<F, C>(mut rng: Rng, p: &Point, ops: u64, cycle: C) -> Result<Duration, weft::Error>
where
    C: Fn(bool, Duration) -> F,
    F: std::future::Future<Output = Result<(), weft::Error>>,
{
    let mut held = Duration::ZERO;
    for _ in 0..ops {
        let write = !p.kind.has_readers() || draws_write(rng.next(), p.writers);
        let work = rng.micros();
        let start = Instant::now();
        cycle(write, work).await?;
        held += start.elapsed();
        if p.bench == Bench::Warb {
            spin_for(work);
        }
    }
    Ok(held)
}

/// What `bench` does inside the lock (a writer's if `write`), with `work` of local work.
fn critical_section(bench: Bench, write: bool, work: Duration, w: &Window<'_, u64>) -> Result<(), weft::Error> {
    match bench {
        Bench::Lb | Bench::Ecsb | Bench::Warb => Ok(()),
        Bench::Sob if write => w.fetch_and_op(0, 0, 1, Op::Sum).map(drop),
        Bench::Sob => w.get(0, 0, &mut [0]),
        Bench::Wcsb => {
            w.fetch_and_op(0, 0, 1, Op::Sum)?;
            spin_for(work);
            Ok(())
        }
    }
}

/// `--rank-worker`: this process is one rank of a `weftrun` job measuring `p`; rank 0
/// prints the job's `OPS` and `LAT_US`.
fn rank_worker(p: &Point, levels: &Levels, ops: u64) -> Result<(), String> {
    let rt = Runtime::builder().build().map_err(|e| e.to_string())?;
    let c = rt.world();
    if c.size() != p.ranks {
        return Err(format!("the job has {} ranks, the measurement {}", c.size(), p.ranks));
    }
    let (elapsed, held) = rank_run(c, p, levels, ops).map_err(|e| e.to_string())?;
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let (mut slowest, mut sum) = ([0u64], [0u64]);
    c.allreduce(&[nanos(elapsed)], &mut slowest, weft::Op::Max).map_err(|e| e.to_string())?;
    c.allreduce(&[nanos(held)], &mut sum, weft::Op::Sum).map_err(|e| e.to_string())?;
    if c.rank() == 0 {
        let (rate, latency) = rates(p, ops, Duration::from_nanos(slowest[0]), Duration::from_nanos(sum[0]));
        println!("OPS {rate:.0}");
        println!("LAT_US {latency:.3}");
    }
    Ok(())
}

/// The columns of the output (module docs).
const COLUMNS: [&str; 15] = [
    "bench",
    "lock",
    "provider",
    "launch",
    "ranks",
    "threads",
    "tasks",
    "writers_fraction",
    "t_dc",
    "t_l",
    "t_r",
    "levels",
    "level_cost_ns",
    "ops_per_sec",
    "latency_us",
];

/// `--levels`: `flat`, or simulated sizes innermost first.
pub(crate) fn parse_levels(s: &str) -> Result<Levels, String> {
    Ok(if s == "flat" { Levels::flat() } else { Levels::simulated(&parse_list::<u32>(s)?) })
}

/// `--levels` with `--level-cost-ns`: the embedded provider's model (none for `0`).
pub(crate) fn parse_cost(levels: &str, costs: &str) -> Result<LevelCost, String> {
    let costs: Vec<u64> = parse_list(costs)?;
    if costs.iter().all(|&c| c == 0) {
        return Ok(LevelCost::default());
    }
    if levels == "flat" {
        return Err("--level-cost-ns needs simulated --levels (sizes, not flat)".into());
    }
    LevelCost::new(&parse_list::<u32>(levels)?, &costs).map_err(|e| format!("--levels / --level-cost-ns: {e}"))
}

/// The sizes and costs of a model, `/`-separated (`0` for none).
pub(crate) fn model_cells(cost: &LevelCost) -> (String, String) {
    let (sizes, costs) = cost.levels();
    let join = |v: Vec<String>| if v.is_empty() { "0".to_string() } else { v.join("/") };
    (join(sizes.iter().map(u32::to_string).collect()), join(costs.iter().map(u64::to_string).collect()))
}

/// Whether `n` draws a write with probability `writers` (`F_W`).
pub(crate) fn draws_write(n: u64, writers: f64) -> bool {
    (n % 1_000_000) as f64 / 1e6 < writers
}

pub fn run(args: &Args) -> Result<(), String> {
    let benches: Vec<Bench> = parse_list(&args.bench)?;
    let kinds: Vec<Kind> = parse_list(&args.lock)?;
    let ranks: Vec<u32> = parse_list(&args.ranks)?;
    let threads: Vec<usize> = parse_list(&args.threads)?;
    let tasks: Vec<usize> = parse_list(&args.tasks)?;
    let providers: Vec<Provider> = parse_list(&args.provider)?;
    let launches: Vec<Launch> = parse_list(&args.launch)?;
    let writers: Vec<f64> = parse_list(&args.writers)?;
    let t_dcs: Vec<u32> = parse_list(&args.t_dc)?;
    let t_ls: Vec<PerLevel> = parse_list(&args.t_l)?;
    let t_rs: Vec<u64> = parse_list(&args.t_r)?;
    let levels = parse_levels(&args.levels)?;
    let cost = parse_cost(&args.levels, &args.level_cost_ns)?;
    if ranks.contains(&0) || threads.contains(&0) || args.ops == 0 {
        return Err("ranks, threads and ops must be at least 1".into());
    }
    if writers.iter().any(|f| !(0.0..=1.0).contains(f)) {
        return Err("a fraction of writers is outside 0..=1".into());
    }
    if launches.contains(&Launch::Weftrun) && providers.contains(&Provider::Embedded) {
        return Err(
            "--launch weftrun runs ranks as processes: --provider shm or tcp (the embedded provider's ranks share one process)".into()
        );
    }
    let mut points = Vec::new();
    for &bench in &benches {
        for &kind in &kinds {
            for (&provider, &launch) in providers.iter().flat_map(|p| launches.iter().map(move |l| (p, l))) {
                for &r in &ranks {
                    for (&t, &tasks) in threads.iter().flat_map(|t| tasks.iter().map(move |k| (t, k))) {
                        let fw: &[f64] = if kind.has_readers() { &writers } else { &[1.0] };
                        let t_dc: &[u32] = if kind == Kind::RmaRw { &t_dcs } else { &[0] };
                        let none = [PerLevel(vec![0])];
                        let t_l: &[PerLevel] = if matches!(kind, Kind::RmaMcs | Kind::RmaRw) { &t_ls } else { &none };
                        let t_r: &[u64] = if kind == Kind::RmaRw { &t_rs } else { &[0] };
                        for &writers in fw {
                            for &t_dc in t_dc {
                                for t_l in t_l {
                                    for &t_r in t_r {
                                        let t_l = t_l.0.iter().map(|&t| t.max(1)).collect();
                                        let thresholds = Thresholds { t_l, t_r: t_r.max(1), t_dc };
                                        points.push(Point {
                                            bench,
                                            kind,
                                            provider,
                                            launch,
                                            ranks: r,
                                            threads: t,
                                            tasks,
                                            writers,
                                            thresholds,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if args.rank_worker {
        let [p] = points.as_slice() else {
            return Err("--rank-worker measures one configuration: one value of each option".into());
        };
        return rank_worker(p, &levels, args.ops);
    }
    let mut table = Table::new(&COLUMNS, &args.out);
    args.out.note(&format!(
        "# levels of RMA-MCS and RMA-RW: {} (simulated, innermost first); simulated RMA cost on the embedded provider: {cost}; {} acquisitions per thread",
        args.levels, args.ops
    ));
    table.progress(points.len());
    table.print_header();
    for p in &points {
        table.step(|| {
            format!("{} {} {} ranks ({}) x {} threads x {} tasks", p.bench.name(), p.kind.name(), p.ranks, p.launch, p.threads, p.tasks)
        });
        let (rate, latency) = measure(p, &levels, args)?;
        let in_process_embedded = p.provider == Provider::Embedded && p.launch == Launch::InProcess;
        let model_cost = if in_process_embedded { model_cells(&cost).1 } else { "-".into() };
        let or_dash = |has: bool, v: String| if has { v } else { "-".into() };
        table.row(vec![
            p.bench.name().into(),
            p.kind.name().into(),
            p.provider.to_string(),
            p.launch.to_string(),
            p.ranks.to_string(),
            p.threads.to_string(),
            p.tasks.to_string(),
            format!("{}", p.writers),
            or_dash(p.kind == Kind::RmaRw, p.thresholds.t_dc.to_string()),
            or_dash(matches!(p.kind, Kind::RmaMcs | Kind::RmaRw), PerLevel(p.thresholds.t_l.clone()).to_string()),
            or_dash(p.kind == Kind::RmaRw, p.thresholds.t_r.to_string()),
            args.levels.replace(',', "/"),
            model_cost,
            format!("{rate:.0}"),
            format!("{latency:.2}"),
        ]);
    }
    table.finish_with_plot(&chart(&args.levels, &cost), &args.plot)?;
    if launches.contains(&Launch::InProcess) {
        match peak_rss_kib() {
            Some(kib) => args
                .out
                .note(&format!("# peak RSS of this process: {:.1} MiB (every in-process point's ranks and locks)", kib as f64 / 1024.0)),
            None => args.out.note("# peak RSS of this process: unknown (no /proc/self/status)"),
        }
    }
    Ok(())
}

/// The process's peak resident set (`VmHWM` of `/proc/self/status`), in KiB.
pub(crate) fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// `--plot`: acquisitions per second over the rank count, one panel per benchmark, one line
/// per lock (and per any other swept column).
fn chart(levels: &str, cost: &LevelCost) -> Chart {
    let model = if cost.is_free() { "no RMA cost".to_string() } else { format!("RMA crossing cost {} ns", model_cells(cost).1) };
    Chart::new(format!("distributed locks (RMA-MCS/RMA-RW levels: {levels}; {model})"), "ranks", "ranks")
        .log2_x()
        .y_axis("acquisitions/s (thousands)", 1e3)
        .y("ops_per_sec", "")
        .series("lock", "{}")
        .series("provider", "{}")
        .series("launch", "{}")
        .series("threads", "{} threads")
        .series("tasks", "{} tasks")
        .series("writers_fraction", "F_W {}")
        .series("t_dc", "T_DC {}")
        .series("t_l", "T_L {}")
        .series("t_r", "T_R {}")
        .panels("bench", "{}")
}

#[cfg(test)]
mod tests {
    /// `--plot`: a panel per benchmark, a line per lock; a threshold a lock has none of
    /// (`-`) is left out of its legend.
    #[test]
    fn plot_draws_a_line_per_lock_and_a_panel_per_bench() {
        let row = |b: &str, l: &str, r: &str, t_l: &str, ops: &str| -> Vec<String> {
            [b, l, "embedded", "in-process", r, "1", "0", "1", "-", t_l, "-", "2", "100", ops, "1.0"]
                .iter()
                .map(|c| c.to_string())
                .collect()
        };
        let rows = [
            row("lb", "d-mcs", "2", "-", "1000"),
            row("lb", "d-mcs", "4", "-", "2000"),
            row("lb", "rma-mcs", "2", "16", "3000"),
            row("ecsb", "rma-mcs", "4", "16", "4000"),
        ];
        let svg = super::chart("2", &weft::LevelCost::new(&[2], &[100]).unwrap()).svg(&super::COLUMNS, &rows).unwrap();
        for text in ["lb", "ecsb", "d-mcs", "rma-mcs, T_L 16", "acquisitions/s (thousands)", "levels: 2", "RMA crossing cost 100 ns"] {
            assert!(svg.contains(text), "{text:?} missing from the SVG");
        }
        assert!(!svg.contains("T_L -"), "a threshold the lock has none of is not in its legend");
    }

    /// `--t-l`: one value for every level, or one per level `/`-separated; written back as
    /// given; a bad value is an error.
    #[test]
    fn locality_thresholds_per_level() {
        let sweep: Vec<super::PerLevel> = crate::report::parse_list("16,1/64/16").unwrap();
        assert_eq!(sweep, [super::PerLevel(vec![16]), super::PerLevel(vec![1, 64, 16])]);
        assert_eq!(sweep[1].to_string(), "1/64/16");
        assert!(crate::report::parse_list::<super::PerLevel>("16/x").is_err());
    }
}
