//! `weft-bench multirate`: the Multirate benchmark of [Patinyasakdikul 2019, §3.5] and Appendix A.
//!
//! One iteration, as in the public multirate: each receiver pre-posts its `w` receives per
//! sender and sends a 1-byte "ready"; each sender waits for its readies, sends `w` messages
//! to each of its receivers and waits for them; each receiver waits for its receives and
//! sends a 1-byte ack, which the sender receives.
//!
//! Patterns (T = pairs): `pairwise` (sender i -> receiver i), `one-to-many` (sender 0 -> all
//! T receivers), `many-to-one` (all T senders -> receiver 0), `many-to-many` (every sender ->
//! every receiver). Thread mode: two ranks, T threads each (senders on rank 0, receivers on
//! rank 1). Process mode: 2T ranks of one thread each, in this OS process on the embedded
//! provider (senders are ranks 0..T, receivers T..2T). The message rate counts data messages
//! per second over the whole run, as the workers time it: from the first one leaving the
//! start barrier to the last one done (a coordinator thread's clock runs late whenever the
//! OS runs it late).
//!
//! The runs of the modes alternate (thread, process, process, thread, ...), and each thread
//! row carries `thread_over_process`, the median of the per-run ratios: a virtual machine's
//! speed drifts over seconds, and a ratio of medians taken seconds apart measured the drift
//! as much as the runtime. The header gives the core-to-core round trip of the moment
//! (the price of every message between threads on different cores).
//!
//! With `--provider shm|tcp` (feature `ofi`) every configuration runs as a real job: the
//! bench re-launches itself through `weftrun` (found next to this binary) — `-n 2T`, one
//! thread each, in process mode; `-n 2`, T threads each, in thread mode — with the hidden
//! `--rank-worker` flag; rank 0 times the run between two cross-process barriers and prints
//! the rate.
//!
//! `--mode transport` (shm, tcp) runs process mode's ranks and loop one layer down, through
//! `weft-transport` alone: frames with weft's eager header sent with `Rank::send` and counted
//! as `Rank::poll` hands them over, no matching, requests or progress engine; on shm, what
//! the same-host lane carries by itself. Its row's `thread_over_process` is transport /
//! process mode, and `--peer` runs the MPI library's process mode beside it.

use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use weft::{Assignment, Communicator, MatchingMode, ProgressMode, Provider, Request, Runtime, Source, Tag};

use crate::mpi_peer::{Flavor, Peer};
use crate::plot::Chart;
use crate::report::{median, parse_list, Output, PlotTo, Table};

/// Options of `weft-bench multirate` (comma lists sweep).
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Patterns: pairwise, one-to-many, many-to-one, many-to-many.
    #[arg(long, default_value = "pairwise")]
    pattern: String,
    /// Modes: thread (2 ranks x T threads), process (2T ranks x 1 thread), hybrid-P (2P
    /// ranks, the T senders in blocks over the first P and the receivers over the others:
    /// [Patinyasakdikul 2019]'s hybrid mode), transport (process mode's ranks through
    /// weft-transport alone, no matching; shm and tcp).
    #[arg(long, default_value = "thread,process")]
    mode: String,
    /// Progress modes: global, owner, concurrent.
    #[arg(long, default_value = "concurrent")]
    progress: String,
    /// CRI assignments: round-robin, dedicated.
    #[arg(long, default_value = "dedicated")]
    assignment: String,
    /// CRIs per rank; `auto` = T in thread mode, 1 in process mode.
    #[arg(long, default_value = "auto")]
    cris: String,
    /// Matching modes: per-comm, global.
    #[arg(long, default_value = "per-comm")]
    matching: String,
    /// Message sizes in bytes.
    #[arg(short = 's', long = "size", default_value = "0")]
    size: String,
    /// Window sizes (messages in flight per pair per iteration).
    #[arg(short = 'w', long = "window", default_value = "128")]
    window: String,
    /// Iterations per run ([Patinyasakdikul 2019, Listing 2] runs 1000: shorter runs on an oversubscribed
    /// machine measure the scheduler's luck more than the runtime).
    #[arg(short = 'i', long = "iterations", default_value = "1000")]
    iterations: usize,
    /// Pairs T.
    #[arg(short = 't', long = "pairs", default_value = "1,2,4,8")]
    pairs: String,
    /// One communicator per pair.
    #[arg(short = 'c', long = "comm-per-pair")]
    comm_per_pair: bool,
    /// Allow overtaking (no message ordering).
    #[arg(short = 'o', long = "overtaking")]
    overtaking: bool,
    /// Assert no `Tag::Any` receive on the communicators (MPI 4.0 `mpi_assert_no_any_tag`):
    /// matching and ordering per tag partition, each under its own lock.
    #[arg(long = "no-any-tag")]
    no_any_tag: bool,
    /// Runs per configuration; the median is reported. The modes' runs alternate, and a
    /// thread row's `thread_over_process` is the median of the per-run ratios.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
    /// Provider: embedded (ranks in this process), shm or tcp (real processes via weftrun).
    #[arg(long, default_value = "embedded")]
    provider: String,
    /// Print the runtime counters of every measured run to stderr (embedded provider).
    #[arg(long)]
    counters: bool,
    /// Waiters' yield window in microseconds before they sleep (`Builder::yield_window`);
    /// the runtime's default when absent.
    #[arg(long)]
    yield_us: Option<u64>,
    /// Thread mode: leave CRI assignment to first use instead of binding worker i of each
    /// rank to CRI i (`Runtime::pin_cri`); pairs may then be crossed.
    #[arg(long)]
    no_pin: bool,
    /// Order messages per sending thread instead of per source rank
    /// (`Builder::per_thread_order`; dedicated CRIs).
    #[arg(long)]
    per_thread_order: bool,
    /// Placement of the workers: `core` binds sender i to the i-th allowed CPU and receiver j
    /// to the (T + j)-th, round robin, in both modes — where `mpirun --bind-to core` puts
    /// process mode's ranks, with thread mode's workers on the cores of the ranks they stand
    /// for ([Patinyasakdikul 2019, App. A]: the benchmark expects its entities bound); `none` leaves
    /// placement to the OS scheduler, whose first placement of the threads the run then
    /// measures.
    #[arg(long, default_value = "core", value_parser = ["core", "none"])]
    bind: String,
    /// Also run the same loop with an MPI library, `openmpi` or `mpich` (the C version in
    /// `benches/peers/multirate.c`, built with its `mpicc`, one process per rank under its
    /// `mpirun`; shared memory, or tcp on `lo` with `--provider tcp`), each of its runs
    /// beside one of weft's: columns `peer`, `peer_rate` and `ratio` (weft / peer, the
    /// median of the per-run ratios). The peer knows no overtaking or `no_any_tag`
    /// assertion; `-c` gives it a communicator per pair too.
    #[arg(long)]
    peer: Option<String>,
    /// With `--peer`: also run the peer's rows of one thread a rank (process mode, and thread
    /// mode at 1 pair) with `MPI_THREAD_MULTIPLE`, which they otherwise run without (they ask
    /// for `MPI_THREAD_SINGLE`), beside the same weft run: what the library's thread safety
    /// costs it, where weft is always thread safe. Columns `peer_multiple_rate` and
    /// `ratio_multiple` (empty in rows whose peer runs several threads a rank, with
    /// `MPI_THREAD_MULTIPLE` anyway).
    #[arg(long, requires = "peer")]
    peer_multiple: bool,
    /// On shm / tcp: the ranks in this process (`Builder::build_local`, as on the embedded
    /// provider) instead of a `weftrun` job: the same transport path without the process
    /// boundary, for comparison.
    #[arg(long)]
    in_process: bool,
    /// On shm / tcp: every frame through libfabric, none through the same-host lane
    /// (`Builder::same_host_lane(false)`), for comparison.
    #[arg(long)]
    no_same_host_lane: bool,
    /// Seconds a peer job may take before it is stopped (a hang fails the benchmark).
    #[arg(long, default_value_t = 300)]
    peer_timeout: u64,
    /// Internal: run one rank of a launched job (one configuration).
    #[arg(long, hide = true)]
    rank_worker: bool,
    /// Internal (tests): worker N of every run (spawn order: senders, then receivers) fails
    /// at its first measured iteration, as a worker whose wait fails would.
    #[arg(long, hide = true)]
    fail_worker: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pattern {
    Pairwise,
    OneToMany,
    ManyToOne,
    ManyToMany,
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "pairwise" => Ok(Pattern::Pairwise),
            "one-to-many" => Ok(Pattern::OneToMany),
            "many-to-one" => Ok(Pattern::ManyToOne),
            "many-to-many" => Ok(Pattern::ManyToMany),
            _ => Err(format!("unknown pattern {s:?} (pairwise, one-to-many, many-to-one, many-to-many)")),
        }
    }
}

impl Pattern {
    fn name(self) -> &'static str {
        match self {
            Pattern::Pairwise => "pairwise",
            Pattern::OneToMany => "one-to-many",
            Pattern::ManyToOne => "many-to-one",
            Pattern::ManyToMany => "many-to-many",
        }
    }

    /// `(sender, receiver)` index pairs that exchange messages.
    fn links(self, t: usize) -> Vec<(usize, usize)> {
        match self {
            Pattern::Pairwise => (0..t).map(|i| (i, i)).collect(),
            Pattern::OneToMany => (0..t).map(|j| (0, j)).collect(),
            Pattern::ManyToOne => (0..t).map(|i| (i, 0)).collect(),
            Pattern::ManyToMany => (0..t).flat_map(|i| (0..t).map(move |j| (i, j))).collect(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// 2 ranks of T threads.
    Thread,
    /// 2T ranks of one thread.
    Process,
    /// [Patinyasakdikul 2019]'s hybrid mode: 2P ranks (P senders' ranks, P receivers'), the
    /// T senders spread over the first P in blocks, the T receivers over the others.
    Hybrid(usize),
    /// Process mode's ranks and loop one layer down, through `weft-transport` alone (frames
    /// with weft's eager header, no matching, requests or progress engine; shm and tcp):
    /// what the transport (on shm, the same-host lane) carries without the runtime.
    Transport,
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(m: &str) -> Result<Self, String> {
        match m.trim() {
            "thread" => Ok(Mode::Thread),
            "process" => Ok(Mode::Process),
            "transport" => Ok(Mode::Transport),
            o => match o.strip_prefix("hybrid-").map(str::parse::<usize>) {
                Some(Ok(p)) if p > 0 => Ok(Mode::Hybrid(p)),
                _ => Err(format!("unknown mode {o:?} (thread, process, hybrid-P with P processes per side, transport)")),
            },
        }
    }
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Thread => "thread".into(),
            Mode::Process => "process".into(),
            Mode::Hybrid(p) => format!("hybrid-{p}"),
            Mode::Transport => "transport".into(),
        }
    }

    /// Ranks per side with `t` pairs.
    fn ranks_per_side(self, t: usize) -> usize {
        match self {
            Mode::Thread => 1,
            Mode::Process | Mode::Transport => t,
            Mode::Hybrid(p) => p.min(t),
        }
    }

    /// Ranks of a job with `t` pairs.
    fn ranks(self, t: usize) -> usize {
        2 * self.ranks_per_side(t)
    }

    /// Whether a rank holds several workers of a side (they then get a CRI each, and with
    /// `-c` a communicator per link).
    fn threaded(self, t: usize) -> bool {
        self.ranks_per_side(t) < t
    }

    /// The rank of sender `i` and its index among the workers of that rank, with `t` pairs.
    fn sender(self, t: usize, i: usize) -> (usize, usize) {
        let per = t.div_ceil(self.ranks_per_side(t));
        (i / per, i % per)
    }

    /// The rank of receiver `j` and its index among the workers of that rank.
    fn receiver(self, t: usize, j: usize) -> (usize, usize) {
        let (r, k) = self.sender(t, j);
        (self.ranks_per_side(t) + r, k)
    }

    /// CRIs per rank for `--cris auto`: one per worker of a rank.
    fn auto_cris(self, t: usize) -> usize {
        t.div_ceil(self.ranks_per_side(t))
    }
}

/// One measured configuration.
#[derive(Clone, Copy, Debug)]
struct Point {
    pattern: Pattern,
    mode: Mode,
    pairs: usize,
    size: usize,
    window: usize,
    progress: ProgressMode,
    assignment: Assignment,
    cris: usize,
    matching: MatchingMode,
}

/// Runs the sweep.
pub fn run(a: &Args) -> Result<(), String> {
    let patterns: Vec<Pattern> = parse_list(&a.pattern)?;
    let modes: Vec<Mode> = a.mode.split(',').map(str::parse).collect::<Result<_, _>>()?;
    let progress: Vec<ProgressMode> = a.progress.split(',').map(|s| s.parse().map_err(|e| format!("{e}"))).collect::<Result<_, _>>()?;
    let assignment: Vec<Assignment> = a.assignment.split(',').map(|s| s.parse().map_err(|e| format!("{e}"))).collect::<Result<_, _>>()?;
    let matching: Vec<MatchingMode> = a.matching.split(',').map(|s| s.parse().map_err(|e| format!("{e}"))).collect::<Result<_, _>>()?;
    let cris: Vec<Option<usize>> = a
        .cris
        .split(',')
        .map(|c| if c.trim() == "auto" { Ok(None) } else { c.trim().parse().map(Some).map_err(|e| format!("bad --cris {c:?}: {e}")) })
        .collect::<Result<_, _>>()?;
    let sizes: Vec<usize> = parse_list(&a.size)?;
    let windows: Vec<usize> = parse_list(&a.window)?;
    let pairs: Vec<usize> = parse_list(&a.pairs)?;
    if pairs.contains(&0) || windows.contains(&0) || a.iterations == 0 || a.runs == 0 {
        return Err("pairs, window, iterations and runs must be positive".into());
    }

    let provider: Provider = a.provider.parse().map_err(|e| format!("{e}"))?;
    let cpus = worker_cpus(a)?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if (provider == Provider::Embedded || a.in_process) && modes.contains(&Mode::Transport) {
        return Err("--mode transport runs real processes: it needs --provider shm, ofi-shm or tcp, without --in-process".into());
    }
    if a.rank_worker {
        let p = Point {
            pattern: patterns[0],
            mode: modes[0],
            pairs: pairs[0],
            size: sizes[0],
            window: windows[0],
            progress: progress[0],
            assignment: assignment[0],
            cris: cris[0].unwrap_or(modes[0].auto_cris(pairs[0])),
            matching: matching[0],
        };
        return match p.mode {
            Mode::Transport => transport_worker(&p, a, provider, &cpus),
            _ => rank_worker(&p, a, provider, &cpus),
        };
    }
    let peer = match &a.peer {
        Some(f) => Some(Peer::build(f.parse::<Flavor>()?, "multirate-mpi", include_str!("../peers/multirate.c"))?),
        None => None,
    };
    let mut columns = vec![
        "pattern",
        "mode",
        "pairs",
        "size",
        "window",
        "progress",
        "assignment",
        "cris",
        "matching",
        "comm_per_pair",
        "overtaking",
        "no_any_tag",
        "msg_rate",
        "thread_over_process",
    ];
    if peer.is_some() {
        columns.extend(["peer", "peer_rate", "ratio"]);
        if a.peer_multiple {
            columns.extend(["peer_multiple_rate", "ratio_multiple"]);
        }
    }
    let mut table = Table::new(&columns, &a.out);
    a.out.note(&format!(
        "# weft-bench multirate: iterations={} runs={} (median) cores={} bind={} provider={provider}{}",
        a.iterations,
        a.runs,
        cores,
        a.bind,
        match (provider, a.no_same_host_lane, a.in_process) {
            (Provider::Embedded, _, _) => "",
            (Provider::OfiShm, _, true) | (_, true, true) => " (ranks in this process; every frame through libfabric)",
            (_, false, true) => " (ranks in this process; same-host lane)",
            (Provider::OfiShm, _, false) | (_, true, false) => " (one process per rank, via weftrun; every frame through libfabric)",
            (_, false, false) => " (one process per rank, via weftrun; same-host lane)",
        }
    ));
    if provider == Provider::Embedded || a.in_process {
        warm_up();
    }
    // The machine's state, beside the configuration: on a VM the cost of moving a cache line
    // between two vCPUs changes with where the host runs them (2-core VM: about 0.1 vs
    // 0.3-0.5 µs), and every message between threads on different cores pays it.
    if let Some(rt) = core_to_core_round_trip() {
        a.out.note(&format!("# core-to-core round trip (two threads bouncing one cache line): {:.0} ns", rt.as_nanos()));
    }
    let configurations =
        patterns.len() * pairs.len() * sizes.len() * windows.len() * progress.len() * assignment.len() * cris.len() * matching.len();
    table.progress(configurations * a.runs * modes.len());
    table.print_header();
    for &pattern in &patterns {
        for &t in &pairs {
            for &size in &sizes {
                for &window in &windows {
                    for &pm in &progress {
                        for &asg in &assignment {
                            for &c in &cris {
                                for &mm in &matching {
                                    let point = |mode: Mode| Point {
                                        pattern,
                                        mode,
                                        pairs: t,
                                        size,
                                        window,
                                        progress: pm,
                                        assignment: asg,
                                        cris: c.unwrap_or(mode.auto_cris(t)),
                                        matching: mm,
                                    };
                                    // The modes' runs alternate (thread, process, process,
                                    // thread, ...): a virtual machine's speed drifts over
                                    // seconds, and runs taken side by side share the drift,
                                    // which the paired ratio then cancels.
                                    let mut rates = vec![Vec::with_capacity(a.runs); modes.len()];
                                    let mut peer_rates = vec![Vec::with_capacity(a.runs); modes.len()];
                                    let mut peer_multiple_rates = vec![Vec::with_capacity(a.runs); modes.len()];
                                    for run in 0..a.runs {
                                        for k in 0..modes.len() {
                                            let m = if run % 2 == 0 { k } else { modes.len() - 1 - k };
                                            let p = point(modes[m]);
                                            // The peer's runs of this point: as the mode needs,
                                            // then (`--peer-multiple`, one thread a rank) with
                                            // `MPI_THREAD_MULTIPLE`.
                                            let mut peers = |peer: &Peer| -> Result<(), String> {
                                                peer_rates[m].push(peer_rate(peer, &p, a, provider, false)?);
                                                if a.peer_multiple && peer_single_threaded(&p) {
                                                    peer_multiple_rates[m].push(peer_rate(peer, &p, a, provider, true)?);
                                                }
                                                Ok(())
                                            };
                                            table.step(|| format!("{} mode, {t} pairs, {pm}, run {}", modes[m].name(), run + 1));
                                            let weft = || {
                                                plausible(cores, || {
                                                    if provider == Provider::Embedded || a.in_process {
                                                        measure(&p, a, provider, &cpus, Faults::of(a))
                                                    } else {
                                                        launch(&p, a, provider)
                                                    }
                                                })
                                            };
                                            match &peer {
                                                // Weft first on even runs, the peer first on
                                                // odd ones: neither always runs on a machine
                                                // the other just warmed.
                                                Some(peer) if run % 2 == 1 => {
                                                    peers(peer)?;
                                                    rates[m].push(weft()?);
                                                }
                                                Some(peer) => {
                                                    rates[m].push(weft()?);
                                                    peers(peer)?;
                                                }
                                                None => rates[m].push(weft()?),
                                            }
                                        }
                                    }
                                    let process = modes.iter().position(|&m| m == Mode::Process);
                                    for (m, &mode) in modes.iter().enumerate() {
                                        let p = point(mode);
                                        // Thread and hybrid rows: the median of the per-run
                                        // ratios to process mode, when the sweep has it.
                                        let ratio = match process {
                                            Some(q) if mode != Mode::Process => {
                                                let r: Vec<f64> = rates[m].iter().zip(&rates[q]).map(|(x, y)| x / y).collect();
                                                format!("{:.2}", median(&r))
                                            }
                                            _ => String::new(),
                                        };
                                        let mut row = vec![
                                            pattern.name().into(),
                                            mode.name(),
                                            t.to_string(),
                                            size.to_string(),
                                            window.to_string(),
                                            pm.to_string(),
                                            asg.to_string(),
                                            p.cris.to_string(),
                                            mm.to_string(),
                                            (a.comm_per_pair as u8).to_string(),
                                            (a.overtaking as u8).to_string(),
                                            (a.no_any_tag as u8).to_string(),
                                            format!("{:.0}", median(&rates[m])),
                                            ratio,
                                        ];
                                        if let Some(peer) = &peer {
                                            let r: Vec<f64> = rates[m].iter().zip(&peer_rates[m]).map(|(x, y)| x / y).collect();
                                            row.push(peer.flavor().name().into());
                                            row.push(format!("{:.0}", median(&peer_rates[m])));
                                            row.push(format!("{:.2}", median(&r)));
                                            if a.peer_multiple {
                                                if peer_multiple_rates[m].is_empty() {
                                                    row.extend([String::new(), String::new()]);
                                                } else {
                                                    let r: Vec<f64> =
                                                        rates[m].iter().zip(&peer_multiple_rates[m]).map(|(x, y)| x / y).collect();
                                                    row.push(format!("{:.0}", median(&peer_multiple_rates[m])));
                                                    row.push(format!("{:.2}", median(&r)));
                                                }
                                            }
                                        }
                                        table.row(row);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let chart = Chart::new(
        format!("multirate: {} B messages, window {}, provider {provider}, bind {}, {cores} cores", a.size, a.window, a.bind),
        "pairs",
        "pairs (T sender-receiver pairs)",
    )
    .y("msg_rate", "weft")
    .y_axis("message rate (M msg/s)", 1e6)
    .series("mode", "{} mode")
    .series("progress", "{}")
    .series("pattern", "{}")
    .series("size", "{} B")
    .series("window", "window {}")
    .series("assignment", "{}")
    .series("matching", "{} matching")
    .log2_x();
    // The MPI peer's rate beside weft's, as lines of their own.
    let chart = match &peer {
        Some(p) => chart.y("peer_rate", p.flavor().title()),
        None => chart,
    };
    // `--peer-multiple`: the peer's one-thread-a-rank rows with `MPI_THREAD_MULTIPLE`.
    let chart = match (&peer, a.peer_multiple) {
        (Some(p), true) => chart.y(
            "peer_multiple_rate",
            match p.flavor() {
                Flavor::OpenMpi => "Open MPI, MPI_THREAD_MULTIPLE",
                Flavor::Mpich => "MPICH, MPI_THREAD_MULTIPLE",
            },
        ),
        _ => chart,
    };
    // `--cris auto` gives thread mode T CRIs and process mode one: no line of its own then.
    let chart = if a.cris == "auto" { chart } else { chart.series("cris", "{} CRIs") };
    table.finish_with_plot(&chart, &a.plot)
}

/// Whether the MPI peer's version of `p` runs one thread a rank (and so asks for
/// `MPI_THREAD_SINGLE` unless told otherwise): every mode where a rank holds one worker.
fn peer_single_threaded(p: &Point) -> bool {
    let mode = if p.mode == Mode::Transport { Mode::Process } else { p.mode };
    !mode.threaded(p.pairs)
}

/// One run of the MPI peer's version of `p` (module docs of [`crate::mpi_peer`]); its rate.
/// Against the embedded provider the peer runs over shared memory. `multiple`: the peer asks
/// for `MPI_THREAD_MULTIPLE` even with one thread a rank.
fn peer_rate(peer: &Peer, p: &Point, a: &Args, provider: Provider, multiple: bool) -> Result<f64, String> {
    if p.pairs > u16::MAX as usize || p.size > i32::MAX as usize || p.window > i32::MAX as usize {
        return Err("--peer: pairs, size or window too large for the C peer".into());
    }
    let ranks = p.mode.ranks(p.pairs);
    // Transport mode stands beside MPI's process mode.
    let mode = if p.mode == Mode::Transport { Mode::Process } else { p.mode };
    let args = [
        p.pattern.name().to_string(),
        mode.name(),
        p.pairs.to_string(),
        p.size.to_string(),
        p.window.to_string(),
        a.iterations.to_string(),
        u8::from(a.comm_per_pair).to_string(),
        if multiple { "multiple" } else { "needed" }.to_string(),
    ];
    peer.run(ranks, if provider == Provider::Tcp { Provider::Tcp } else { Provider::Shm }, a.peer_timeout, &args, "MSG_RATE")
}

/// The least CPU time a message takes through weft, both sides together: about 1,900
/// instructions (`msgcost`, docs/BENCHMARKS.md), over 50 ns even at 6 instructions a cycle
/// at 6 GHz. A rate that leaves less than this per message over all of the machine's cores
/// (2 cores: above 200 M msg/s) was mis-timed, not measured.
const MIN_CPU_PER_MESSAGE: Duration = Duration::from_nanos(10);

/// Runs at most this many times to get one plausible rate.
const ATTEMPTS: usize = 3;

/// The rate of `run`, run again (up to [`ATTEMPTS`] times in all) while it is implausible
/// on `cores` cores (see [`MIN_CPU_PER_MESSAGE`]); each discarded rate is reported, and an
/// error if no run gave a plausible one: a broken clock must not make a row.
fn plausible(cores: usize, mut run: impl FnMut() -> Result<f64, String>) -> Result<f64, String> {
    let limit = cores as f64 / MIN_CPU_PER_MESSAGE.as_secs_f64();
    let mut seen = Vec::with_capacity(ATTEMPTS);
    for _ in 0..ATTEMPTS {
        let rate = run()?;
        // Also catches a zero time (an infinite rate) and NaN.
        if rate > 0.0 && rate <= limit {
            return Ok(rate);
        }
        eprintln!(
            "# multirate: discarded an implausible rate of {rate:.0} msg/s (over {limit:.0} on {cores} cores: mis-timed); running again"
        );
        seen.push(format!("{rate:.0}"));
    }
    Err(format!(
        "multirate: {ATTEMPTS} runs gave implausible rates ({} msg/s, over {limit:.0} on {cores} cores): the timing is broken",
        seen.join(", ")
    ))
}

/// Time for a cache line to travel to another thread and back: two threads alternate a
/// flag, up to 20,000 round trips or 50 ms (a descheduled partner costs a time slice per
/// trip on a busy machine); the fastest of 3 runs, as a preempted thread slows a run by
/// milliseconds. `None` with one core.
fn core_to_core_round_trip() -> Option<Duration> {
    use std::sync::atomic::{AtomicU32, Ordering};
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return None;
    }
    const TRIPS: u32 = 20_000;
    const LIMIT: Duration = Duration::from_millis(50);
    const STOP: u32 = u32::MAX;
    let mut runs: Vec<f64> = (0..3)
        .map(|_| {
            let flag = AtomicU32::new(0);
            std::thread::scope(|s| {
                s.spawn(|| {
                    // Answers every odd value with the next even one, until told to stop.
                    let mut expect = 1;
                    loop {
                        let v = flag.load(Ordering::Acquire);
                        if v == STOP {
                            break;
                        }
                        if v == expect {
                            flag.store(v + 1, Ordering::Release);
                            expect += 2;
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                });
                let t0 = Instant::now();
                let mut trips = 0;
                while trips < TRIPS {
                    flag.store(2 * trips + 1, Ordering::Release);
                    while flag.load(Ordering::Acquire) != 2 * trips + 2 {
                        std::hint::spin_loop();
                    }
                    trips += 1;
                    if trips % 256 == 0 && t0.elapsed() > LIMIT {
                        break;
                    }
                }
                let per_trip = t0.elapsed().as_secs_f64() / f64::from(trips);
                flag.store(STOP, Ordering::Release);
                per_trip
            })
        })
        .collect();
    runs.sort_by(f64::total_cmp);
    Some(Duration::from_secs_f64(runs[0]))
}

/// Keeps every core busy for a moment before the first measurement: on a virtual machine a
/// vCPU that idled (or a core in a deep sleep state) runs the first configuration of a
/// sweep slower than the rest, which showed as a 2x low first row.
fn warm_up() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let until = Instant::now() + Duration::from_millis(300);
    std::thread::scope(|s| {
        for _ in 0..cores {
            s.spawn(|| {
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
            });
        }
    });
}

/// Tags: every (sender, receiver) link has its own data, ready and ack tags.
fn tags(link: usize) -> (i32, i32, i32) {
    let b = 3 * link as i32;
    (b, b + 1, b + 2)
}

/// What one worker does: the links it sends on (as sender) or receives on (as receiver).
struct Role<'a> {
    /// Thread mode: the rank's runtime and the CRI this worker binds itself to.
    pin: Option<(&'a Runtime, usize)>,
    comm_of: Vec<&'a Communicator>,
    /// `(link index, peer rank)` per link of this worker.
    links: Vec<(usize, u32)>,
}

/// The CPUs `--bind core` hands out (see [`run_roles`]); empty with `--bind none`.
fn worker_cpus(a: &Args) -> Result<Vec<usize>, String> {
    if a.bind == "none" {
        return Ok(Vec::new());
    }
    let cpus = weft::lock::allowed_cpus();
    if cpus.is_empty() {
        return Err("--bind core: cannot read this process's CPU affinity (use --bind none)".into());
    }
    Ok(cpus)
}

fn measure(p: &Point, a: &Args, provider: Provider, cpus: &[usize], faults: Faults) -> Result<f64, String> {
    let (iterations, comm_per_pair, overtaking, counters) = (a.iterations, a.comm_per_pair, a.overtaking, a.counters);
    let t = p.pairs;
    let links = p.pattern.links(t);
    let nranks = p.mode.ranks(t) as u32;
    let mut builder = Runtime::builder()
        .env(false)
        .provider(provider)
        .same_host_lane(!a.no_same_host_lane)
        .progress(p.progress)
        .assignment(p.assignment)
        .matching(p.matching)
        .cris(p.cris)
        .per_thread_order(a.per_thread_order)
        .lock_stats(counters);
    if let Some(us) = a.yield_us {
        builder = builder.yield_window(Duration::from_micros(us));
    }
    let runtimes = builder.build_local(nranks).map_err(|e| e.to_string())?;
    // Communicators per rank: world, or dups (collective, so every rank dups in parallel).
    let assertions = weft::Assertions { allow_overtaking: overtaking, no_any_tag: a.no_any_tag };
    let ncomms = if comm_per_pair && p.mode.threaded(t) { links.len() } else { usize::from(comm_per_pair || overtaking || a.no_any_tag) };
    let comms: Vec<Vec<Communicator>> = std::thread::scope(|s| {
        let hs: Vec<_> = runtimes
            .iter()
            .map(|rt| {
                s.spawn(move || -> Result<Vec<Communicator>, String> {
                    (0..ncomms).map(|_| rt.world().dup_with_assertions(assertions).map_err(|e| e.to_string())).collect()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("dup thread")).collect::<Result<_, _>>()
    })?;
    let comm_for = |rank: usize, link: usize| -> &Communicator {
        if ncomms == 0 {
            runtimes[rank].world()
        } else if ncomms == 1 {
            &comms[rank][0]
        } else {
            &comms[rank][link]
        }
    };
    // Rank of sender i / receiver j.
    let srank = |i: usize| p.mode.sender(t, i).0;
    let rrank_of = |j: usize| p.mode.receiver(t, j).0;
    // Several workers per rank: worker k of a rank binds itself to CRI k (mod the CRI
    // count), so the frames of a pair arrive at the CRI its receiver polls
    // (`Runtime::pin_cri`).
    let pin =
        |(rank, k): (usize, usize)| (p.mode.threaded(t) && !a.no_pin).then(|| (&runtimes[rank], k % runtimes[rank].config().cris.max(1)));
    let mut senders: Vec<Role<'_>> =
        (0..t).map(|i| Role { pin: pin(p.mode.sender(t, i)), comm_of: Vec::new(), links: Vec::new() }).collect();
    let mut receivers: Vec<Role<'_>> =
        (0..t).map(|j| Role { pin: pin(p.mode.receiver(t, j)), comm_of: Vec::new(), links: Vec::new() }).collect();
    for (l, &(i, j)) in links.iter().enumerate() {
        senders[i].links.push((l, rrank_of(j) as u32));
        senders[i].comm_of.push(comm_for(srank(i), l));
        receivers[j].links.push((l, srank(i) as u32));
        receivers[j].comm_of.push(comm_for(rrank_of(j), l));
    }
    let workers = senders.iter().filter(|r| !r.links.is_empty()).count() + receivers.iter().filter(|r| !r.links.is_empty()).count();
    let barrier = Barrier::new(workers + 1);
    let warmup = (iterations / 10).clamp(1, 20);
    let (w, size) = (p.window, p.size);
    // One process: its workers' window is the whole run.
    let elapsed = run_roles(&senders, &receivers, cpus, &barrier, (w, size, iterations, warmup), faults, || Ok(Instant::now())).workers;
    let messages = (links.len() * w * iterations) as f64;
    if counters {
        for (r, rt) in runtimes.iter().enumerate() {
            let c = rt.counters();
            eprintln!(
                "# counters {:?} {:?} pairs={} rank {r}: sent {} received {} unexpected {} out_of_sequence {} parks {} wakes {} park_timeouts {} flow_control_waits {} contended cri/matching/progress {}/{}/{}",
                p.mode, p.progress, p.pairs, c.messages_sent, c.messages_received, c.unexpected, c.out_of_sequence, c.parks, c.wakes, c.park_timeouts, c.flow_control_waits,
                c.cri_lock.contended, c.matching_lock.contended, c.progress_lock.contended
            );
        }
    }
    Ok(messages / elapsed.as_secs_f64())
}

/// Runs every role with links on its own thread and times the measured phase: the roles
/// and this thread meet at `barrier` after the warm-up, at the start and at the end; `sync`
/// runs after the warm-up and end meetings (a cross-process barrier in a launched job) and
/// gives an instant before any rank of the job can leave it.
///
/// The workers time themselves: each notes when it leaves the start barrier and when it
/// has finished its measured iterations. This thread shares the cores with them and may
/// run long after the barrier let everyone go (a clock started where it woke missed the
/// work done meanwhile: one sweep reported an impossible 265 M msg/s), or long after they
/// finished.
///
/// A worker that fails (or panics), or a failed `sync`, ends the process through
/// [`fail_run`]: its partners wait inside weft for messages it will never send, which
/// nothing interrupts, so the run cannot be unwound and joined.
///
/// With `cpus` (`--bind core`), sender i runs on `cpus[i % n]` and receiver j on
/// `cpus[(T + j) % n]`: the CPU of rank i, or T + j, in process mode under `mpirun
/// --bind-to core`, and the same CPUs for the threads that stand for those ranks in thread
/// mode ([Patinyasakdikul 2019, App. A] asks for bound entities; unbound, the scheduler's first
/// placement decides a run — two workers started on one core of two stay there while both
/// are busy, and a 1-pair run then measures half the machine).
fn run_roles(
    senders: &[Role<'_>],
    receivers: &[Role<'_>],
    cpus: &[usize],
    barrier: &Barrier,
    (w, size, iterations, warmup): (usize, usize, usize, usize),
    faults: Faults,
    sync: impl Fn() -> Result<Instant, String>,
) -> Timing {
    let phases = &Phases { w, size, iterations, warmup, barrier };
    std::thread::scope(|s| {
        let mut hs = Vec::new();
        let t = senders.len();
        let bind = move |w: usize| -> Result<(), String> {
            match cpus.get(w % cpus.len().max(1)) {
                Some(&cpu) => weft::lock::bind_thread_to_cpu(cpu).map_err(|e| format!("--bind core: CPU {cpu}: {e} (use --bind none)")),
                None => Ok(()),
            }
        };
        // A worker's failure ends the process (see above); `AssertUnwindSafe`: nothing the
        // panicking worker touched is used again.
        let guard =
            |who: String, work: &dyn Fn() -> Result<Window, String>| match std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)) {
                Ok(Ok(window)) => window,
                Ok(Err(e)) => fail_run(&format!("multirate: {who} failed: {e}")),
                Err(_) => fail_run(&format!("multirate: {who} panicked")),
            };
        for (i, role) in senders.iter().enumerate().filter(|(_, r)| !r.links.is_empty()) {
            let strike = faults.strike(hs.len());
            hs.push(s.spawn(move || {
                guard(format!("sender {i}"), &|| {
                    bind(i)?;
                    sender(role, phases, strike)
                })
            }));
        }
        for (j, role) in receivers.iter().enumerate().filter(|(_, r)| !r.links.is_empty()) {
            let strike = faults.strike(hs.len());
            hs.push(s.spawn(move || {
                guard(format!("receiver {j}"), &|| {
                    bind(t + j)?;
                    receiver(role, phases, strike)
                })
            }));
        }
        let sync = || sync().unwrap_or_else(|e| fail_run(&format!("multirate: barrier of the job: {e}")));
        barrier.wait(); // warm-up done here
        let released = sync();
        barrier.wait(); // start
        pause(faults.coordinator_pause);
        barrier.wait(); // end here
        sync();
        let ended = Instant::now();
        // Every worker has passed the end barrier, so none of them fails any more.
        let windows: Vec<Window> = hs.into_iter().map(|h| h.join().unwrap_or_else(|_| fail_run("multirate: a worker panicked"))).collect();
        let first = windows.iter().map(|w| w.start).min().expect("a run has workers");
        let last = windows.iter().map(|w| w.end).max().expect("a run has workers");
        Timing { workers: last - first, job: ended - released }
    })
}

/// When one worker ran its measured iterations: from leaving the start barrier to having
/// completed its last operation.
#[derive(Clone, Copy, Debug)]
struct Window {
    start: Instant,
    end: Instant,
}

/// How long a run's measured phase took.
#[derive(Clone, Copy, Debug)]
struct Timing {
    /// From the first of this process's workers starting its measured iterations to the
    /// last one ending them: every operation of those workers lies in between, whenever
    /// the OS ran which thread. With the embedded provider, all of the run.
    workers: Duration,
    /// From before any rank of a launched job could start (rank 0, before it lets the
    /// start barrier go) to after every rank has ended (the end barrier): the whole job's
    /// exchange, with a barrier's latency (a few µs) at each end.
    job: Duration,
}

/// Ends the process after a worker, or the coordinator, failed mid-run: prints the error
/// as `main` does and exits with `main`'s status 2.
///
/// The run cannot be unwound: the failed thread's partners wait inside weft for messages
/// it will never send (a receive, or a send to an inbox nobody drains), and nothing
/// interrupts such a wait. `_exit` rather than `exit`: no atexit handler or library
/// destructor (libfabric's) runs while those threads are still inside the runtime.
fn fail_run(err: &str) -> ! {
    use std::io::Write;
    eprintln!("weft-bench: {err}");
    let _ = std::io::stdout().flush();
    // SAFETY: `_exit` has no preconditions; it ends the process at once.
    unsafe { libc::_exit(2) }
}

/// What the workers of one run share: the window, the message size, the iteration counts
/// and the barrier that separates the phases.
struct Phases<'b> {
    w: usize,
    size: usize,
    iterations: usize,
    warmup: usize,
    barrier: &'b Barrier,
}

impl Phases<'_> {
    /// Runs `iteration` for the warm-up, then, after the start barrier, for the measured
    /// phase (`strike` fails it at its first measured iteration), meeting the others at the
    /// barrier after each; returns when this worker ran its measured iterations.
    fn run(&self, strike: Strike, mut iteration: impl FnMut() -> Result<(), String>) -> Result<Window, String> {
        for _ in 0..self.warmup {
            iteration()?;
        }
        self.barrier.wait();
        self.barrier.wait();
        let start = Instant::now();
        strike.hit()?;
        for _ in 0..self.iterations {
            iteration()?;
        }
        let window = Window { start, end: Instant::now() };
        self.barrier.wait();
        Ok(window)
    }
}

fn sender(role: &Role<'_>, p: &Phases<'_>, strike: Strike) -> Result<Window, String> {
    let e = |e: weft::Error| e.to_string();
    if let Some((rt, k)) = role.pin {
        rt.pin_cri(k).map_err(e)?;
    }
    let mut bufs: Vec<Vec<u8>> = (0..p.w * role.links.len()).map(|_| vec![7u8; p.size]).collect();
    let mut ctl: Vec<Vec<u8>> = (0..role.links.len()).map(|_| Vec::with_capacity(1)).collect();
    p.run(strike, || {
        // Ready from every receiver.
        let mut readies: Vec<Request<'_, Vec<u8>>> = Vec::with_capacity(role.links.len());
        for (x, &(l, peer)) in role.links.iter().enumerate() {
            role.comm_of[x].irecv_into(&mut readies, ctl.pop().unwrap_or_default(), Source::Rank(peer), Tag::Is(tags(l).1)).map_err(e)?;
        }
        weft::wait_all(&mut readies).map_err(e)?;
        ctl.extend(readies.iter_mut().filter_map(|r| r.take()).filter_map(|r| r.ok()).map(|(b, _)| b));
        // The window.
        let mut reqs: Vec<Request<'_, Vec<u8>>> = Vec::with_capacity(bufs.len());
        for (x, &(l, peer)) in role.links.iter().enumerate() {
            for _ in 0..p.w {
                let b = bufs.pop().unwrap_or_default();
                role.comm_of[x].isend_into(&mut reqs, b, peer, tags(l).0).map_err(e)?;
            }
        }
        weft::wait_all(&mut reqs).map_err(e)?;
        bufs.extend(reqs.iter_mut().filter_map(|r| r.take()).filter_map(|r| r.ok()).map(|(b, _)| b));
        // Acks.
        let mut acks: Vec<Request<'_, Vec<u8>>> = Vec::with_capacity(role.links.len());
        for (x, &(l, peer)) in role.links.iter().enumerate() {
            role.comm_of[x].irecv_into(&mut acks, ctl.pop().unwrap_or_default(), Source::Rank(peer), Tag::Is(tags(l).2)).map_err(e)?;
        }
        weft::wait_all(&mut acks).map_err(e)?;
        ctl.extend(acks.iter_mut().filter_map(|r| r.take()).filter_map(|r| r.ok()).map(|(b, _)| b));
        Ok(())
    })
}

fn receiver(role: &Role<'_>, p: &Phases<'_>, strike: Strike) -> Result<Window, String> {
    let e = |e: weft::Error| e.to_string();
    if let Some((rt, k)) = role.pin {
        rt.pin_cri(k).map_err(e)?;
    }
    let size = p.size;
    let mut bufs: Vec<Vec<u8>> = (0..p.w * role.links.len()).map(|_| Vec::with_capacity(size)).collect();
    p.run(strike, || {
        let mut reqs: Vec<Request<'_, Vec<u8>>> = Vec::with_capacity(bufs.len());
        for (x, &(l, peer)) in role.links.iter().enumerate() {
            for _ in 0..p.w {
                let b = bufs.pop().unwrap_or_else(|| Vec::with_capacity(size));
                role.comm_of[x].irecv_into(&mut reqs, b, Source::Rank(peer), Tag::Is(tags(l).0)).map_err(e)?;
            }
        }
        for (x, &(l, peer)) in role.links.iter().enumerate() {
            role.comm_of[x].send(&b"r"[..], peer, tags(l).1).map_err(e)?;
        }
        weft::wait_all(&mut reqs).map_err(e)?;
        for r in reqs.iter_mut() {
            match r.take() {
                Some(Ok((b, st))) if st.bytes == size => bufs.push(b),
                Some(Ok((_, st))) => return Err(format!("received {} bytes, expected {size}", st.bytes)),
                Some(Err(err)) => return Err(err.to_string()),
                None => return Err("request not complete after wait_all".into()),
            }
        }
        for (x, &(l, peer)) in role.links.iter().enumerate() {
            role.comm_of[x].send(&b"a"[..], peer, tags(l).2).map_err(e)?;
        }
        Ok(())
    })
}

/// Faults a test injects into a run.
#[derive(Clone, Copy, Debug, Default)]
struct Faults {
    /// This worker (spawn order: senders, then receivers) fails at its first measured
    /// iteration (`--fail-worker`).
    fail_worker: Option<usize>,
    /// The coordinator pauses right after the start barrier, as a descheduled thread would
    /// (unit tests).
    coordinator_pause: Duration,
    /// Every worker pauses at its first measured iteration: work the run's time must
    /// include (unit tests).
    worker_pause: Duration,
}

impl Faults {
    /// The faults the command line asks for.
    fn of(a: &Args) -> Self {
        Faults { fail_worker: a.fail_worker, ..Faults::default() }
    }

    /// What worker `k` (spawn order) does at its first measured iteration.
    fn strike(&self, k: usize) -> Strike {
        Strike { fail: self.fail_worker == Some(k), pause: self.worker_pause }
    }
}

/// What one worker does at its first measured iteration, by [`Faults`]: nothing, unless a
/// test asks.
#[derive(Clone, Copy, Debug)]
struct Strike {
    fail: bool,
    pause: Duration,
}

impl Strike {
    fn hit(self) -> Result<(), String> {
        if self.fail {
            return Err("injected failure (--fail-worker)".into());
        }
        pause(self.pause);
        Ok(())
    }
}

/// Sleeps for `d` unless it is zero (no call on the measured path when no test asks).
fn pause(d: Duration) {
    if !d.is_zero() {
        std::thread::sleep(d);
    }
}

/// Tag of the cross-process barrier of launched jobs.
const BARRIER_TAG: i32 = i32::MAX - 7;

/// Everyone sends to rank 0, rank 0 answers everyone. Returns, on rank 0, the instant
/// every rank had arrived and none had left yet (before its first answer): no rank's
/// workers start past the barrier before it. Elsewhere, when the barrier let this rank go.
pub(crate) fn cross_barrier(c: &Communicator) -> Result<Instant, String> {
    let e = |e: weft::Error| e.to_string();
    if c.rank() == 0 {
        for r in 1..c.size() {
            c.recv(Vec::<u8>::with_capacity(1), r, BARRIER_TAG).map_err(e)?;
        }
        let all_in = Instant::now();
        for r in 1..c.size() {
            c.send(&b"b"[..], r, BARRIER_TAG).map_err(e)?;
        }
        Ok(all_in)
    } else {
        c.send(&b"b"[..], 0, BARRIER_TAG).map_err(e)?;
        c.recv(Vec::<u8>::with_capacity(1), 0u32, BARRIER_TAG).map_err(e)?;
        Ok(Instant::now())
    }
}

/// Runs one configuration as a job of real processes through `weftrun`; returns the rate
/// rank 0 measured.
fn launch(p: &Point, a: &Args, provider: Provider) -> Result<f64, String> {
    let mut args: Vec<String> = [
        "multirate",
        "--rank-worker",
        "--provider",
        &provider.to_string(),
        "--pattern",
        p.pattern.name(),
        "--mode",
        &p.mode.name(),
        "-t",
        &p.pairs.to_string(),
        "-s",
        &p.size.to_string(),
        "-w",
        &p.window.to_string(),
        "-i",
        &a.iterations.to_string(),
        "--progress",
        &p.progress.to_string(),
        "--assignment",
        &p.assignment.to_string(),
        "--cris",
        &p.cris.to_string(),
        "--matching",
        &p.matching.to_string(),
        // weftrun leaves the ranks unbound; each rank binds its workers as a local run does.
        "--bind",
        &a.bind,
    ]
    .into_iter()
    .map(String::from)
    .collect();
    let flags = [
        (a.comm_per_pair, "-c"),
        (a.overtaking, "-o"),
        (a.no_any_tag, "--no-any-tag"),
        (a.no_pin, "--no-pin"),
        (a.per_thread_order, "--per-thread-order"),
        (a.no_same_host_lane, "--no-same-host-lane"),
    ];
    args.extend(flags.iter().filter(|(on, _)| *on).map(|(_, f)| f.to_string()));
    if let Some(us) = a.yield_us {
        args.extend(["--yield-us".to_string(), us.to_string()]);
    }
    crate::report::weftrun_job(provider, p.mode.ranks(p.pairs) as u32, 600, &args, "multirate", "RATE")
}

/// One rank of a launched job (`--rank-worker`): this process's senders or receivers.
fn rank_worker(p: &Point, a: &Args, provider: Provider, cpus: &[usize]) -> Result<(), String> {
    let builder = Runtime::builder()
        .env(false)
        .provider(provider)
        .progress(p.progress)
        .assignment(p.assignment)
        .matching(p.matching)
        .cris(p.cris)
        .per_thread_order(a.per_thread_order)
        .same_host_lane(!a.no_same_host_lane);
    let builder = match a.yield_us {
        Some(us) => builder.yield_window(Duration::from_micros(us)),
        None => builder,
    };
    let rt = builder.build().map_err(|e| e.to_string())?;
    let t = p.pairs;
    let want = p.mode.ranks(t) as u32;
    if rt.size() != want {
        return Err(format!("job has {} ranks, this configuration needs {want}", rt.size()));
    }
    let me = rt.rank() as usize;
    let links = p.pattern.links(t);
    let assertions = weft::Assertions { allow_overtaking: a.overtaking, no_any_tag: a.no_any_tag };
    let ncomms =
        if a.comm_per_pair && p.mode.threaded(t) { links.len() } else { usize::from(a.comm_per_pair || a.overtaking || a.no_any_tag) };
    let comms: Vec<Communicator> =
        (0..ncomms).map(|_| rt.world().dup_with_assertions(assertions).map_err(|e| e.to_string())).collect::<Result<_, _>>()?;
    let comm_for = |l: usize| -> &Communicator {
        match ncomms {
            0 => rt.world(),
            1 => &comms[0],
            _ => &comms[l],
        }
    };
    // This process's workers: the senders or receivers the mode puts on this rank (thread
    // mode: every sender on rank 0, every receiver on rank 1; process mode: one each).
    // Several per rank: worker k of the rank binds itself to CRI k (mod the CRI count), as
    // in a local run.
    let pin = |k: usize| (p.mode.threaded(t) && !a.no_pin).then(|| (&rt, k % rt.config().cris.max(1)));
    let mut senders: Vec<Role<'_>> =
        (0..t).map(|i| Role { pin: pin(p.mode.sender(t, i).1), comm_of: Vec::new(), links: Vec::new() }).collect();
    let mut receivers: Vec<Role<'_>> =
        (0..t).map(|j| Role { pin: pin(p.mode.receiver(t, j).1), comm_of: Vec::new(), links: Vec::new() }).collect();
    for (l, &(i, j)) in links.iter().enumerate() {
        let (srank, rrank) = (p.mode.sender(t, i).0, p.mode.receiver(t, j).0);
        if srank == me {
            senders[i].links.push((l, rrank as u32));
            senders[i].comm_of.push(comm_for(l));
        }
        if rrank == me {
            receivers[j].links.push((l, srank as u32));
            receivers[j].comm_of.push(comm_for(l));
        }
    }
    let workers = senders.iter().chain(receivers.iter()).filter(|r| !r.links.is_empty()).count();
    let barrier = Barrier::new(workers + 1);
    let warmup = (a.iterations / 10).clamp(1, 20);
    let (w, size, iterations) = (p.window, p.size, a.iterations);
    let world = rt.world();
    // Each phase boundary is crossed here, then across the job.
    // Rank 0's workers are only part of the job (in process mode, one sender of T): the
    // job's time, from the start barrier's release to the end barrier.
    let elapsed =
        run_roles(&senders, &receivers, cpus, &barrier, (w, size, iterations, warmup), Faults::of(a), || cross_barrier(world)).job;
    cross_barrier(world)?;
    if me == 0 {
        println!("RATE {}", (links.len() * w * iterations) as f64 / elapsed.as_secs_f64());
    }
    Ok(())
}

/// What a frame of a `--mode transport` job is, in its header's tag.
#[cfg(feature = "ofi")]
mod stream {
    pub const DATA: i32 = 0;
    pub const READY: i32 = 1;
    pub const ACK: i32 = 2;
    pub const BARRIER: i32 = 3;
}

/// One rank of a `--mode transport` job (`--rank-worker`): process mode's loop through a
/// `weft-transport` rank alone, one CRI, default options (the same-host lane on shm unless
/// `--no-same-host-lane`). Each receiver sends a 1-byte ready, each sender its window of
/// frames with weft's eager header (`-s` bytes of payload), each receiver acknowledges once
/// it has them all; frames are only counted (by their tag: data, ready, ack, barrier) and
/// their length checked, with no matching, request or progress engine. A refused send (a
/// full ring) polls and retries; a poll that finds nothing yields the core. The rate is timed as [`rank_worker`]'s: on rank 0, from
/// the start barrier's release to the end barrier, here barriers of frames to rank 0 and
/// back.
#[cfg(feature = "ofi")]
fn transport_worker(p: &Point, a: &Args, provider: Provider, cpus: &[usize]) -> Result<(), String> {
    use weft_transport::bootstrap::Job;
    use weft_transport::ofi_provider::{join, OfiOptions};
    use weft_transport::SendError;

    let job = Job::from_env().map_err(|e| e.to_string())?;
    let t = p.pairs;
    if job.size as usize != p.mode.ranks(t) {
        return Err(format!("job has {} ranks, this configuration needs {}", job.size, p.mode.ranks(t)));
    }
    let opts = OfiOptions {
        provider: provider.ofi_name().ok_or("--mode transport needs shm, ofi-shm or tcp")?.to_string(),
        same_host_lane: !a.no_same_host_lane,
        ..OfiOptions::default()
    };
    let rank = join(&opts, job).map_err(|e| e.to_string())?;
    let me = rank.rank();
    let (size, n) = (p.size, rank.size());
    if size > rank.eager_capacity() {
        rank.close();
        return Err(format!("--mode transport sends single frames: at most {} bytes", rank.eager_capacity()));
    }
    // Sender i is rank i, receiver j rank T + j: bound where `run_roles` binds them.
    if let Some(&cpu) = cpus.get(me as usize % cpus.len().max(1)) {
        weft::lock::bind_thread_to_cpu(cpu).map_err(|e| format!("--bind core: CPU {cpu}: {e} (use --bind none)"))?;
    }
    let links = p.pattern.links(t);
    let to: Vec<u32> = links.iter().filter(|l| l.0 == me as usize).map(|l| (t + l.1) as u32).collect();
    let from: Vec<u32> = links.iter().filter(|l| t + l.1 == me as usize).map(|l| l.0 as u32).collect();
    let data = vec![7u8; size];
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut counts = [0u64; 4];
    // Takes what has arrived into `counts`; a data frame of the wrong length is an error.
    // An empty poll yields the core, as the runtime's waiters and an oversubscribed Open MPI
    // (`mpi_yield_when_idle`) do: with more ranks than cores, a rank spinning on its empty
    // rings would take the time slice of the rank it waits for.
    let poll = |counts: &mut [u64; 4]| -> Result<(), String> {
        let mut bad = None;
        let got = rank.poll(0, 64, |f| {
            let k = f.header.tag.clamp(0, 3) as usize;
            if f.header.tag == stream::DATA && f.payload.as_slice().len() != size {
                bad = Some(f.payload.as_slice().len());
            }
            counts[k] += 1;
            rank.recycle(f.payload);
        });
        if got == 0 {
            std::thread::yield_now();
        }
        match bad {
            Some(len) => Err(format!("--mode transport: a data frame of {len} bytes, not {size}")),
            None if Instant::now() > deadline => Err("--mode transport: no progress for 120 s".into()),
            None => Ok(()),
        }
    };
    let frame = |tag: i32, len: usize| crate::pingpong::eager_header(me, tag, len);
    let send = |counts: &mut [u64; 4], dst: u32, tag: i32, bytes: &[u8]| -> Result<(), String> {
        loop {
            match rank.send(dst, 0, &frame(tag, bytes.len()), bytes) {
                Ok(()) => return Ok(()),
                Err(SendError::WouldBlock) => poll(counts)?,
                Err(err) => return Err(format!("--mode transport: send to rank {dst}: {err:?}")),
            }
        }
    };
    // Polls until `counts[tag]` reaches `until`.
    let wait = |counts: &mut [u64; 4], tag: i32, until: u64| -> Result<(), String> {
        while counts[tag as usize] < until {
            poll(counts)?;
        }
        Ok(())
    };
    let (w, iterations) = (p.window as u64, a.iterations as u64);
    let warmup = (iterations / 10).clamp(1, 20);
    let mut round = 0u64;
    // One iteration: the counts are cumulative, so iteration `k` waits for `k + 1` of each.
    let mut iteration = |counts: &mut [u64; 4]| -> Result<(), String> {
        round += 1;
        for &r in &from {
            send(counts, r, stream::READY, b"r")?;
        }
        if !to.is_empty() {
            wait(counts, stream::READY, round * to.len() as u64)?;
            for &r in &to {
                for _ in 0..w {
                    send(counts, r, stream::DATA, &data)?;
                }
            }
        }
        if !from.is_empty() {
            wait(counts, stream::DATA, round * w * from.len() as u64)?;
            for &r in &from {
                send(counts, r, stream::ACK, b"a")?;
            }
        }
        if !to.is_empty() {
            wait(counts, stream::ACK, round * to.len() as u64)?;
        }
        Ok(())
    };
    // Everyone to rank 0, rank 0 to everyone; on rank 0, the instant all had arrived.
    let mut barriers = 0u64;
    let mut barrier = |counts: &mut [u64; 4]| -> Result<Instant, String> {
        barriers += 1;
        if me == 0 {
            wait(counts, stream::BARRIER, barriers * u64::from(n - 1))?;
            let all_in = Instant::now();
            for r in 1..n {
                send(counts, r, stream::BARRIER, b"b")?;
            }
            Ok(all_in)
        } else {
            send(counts, 0, stream::BARRIER, b"b")?;
            wait(counts, stream::BARRIER, barriers)?;
            Ok(Instant::now())
        }
    };
    let r = (|| {
        for _ in 0..warmup {
            iteration(&mut counts)?;
        }
        let released = barrier(&mut counts)?;
        for _ in 0..iterations {
            iteration(&mut counts)?;
        }
        let ended = barrier(&mut counts)?;
        barrier(&mut counts)?;
        if me == 0 {
            println!("RATE {}", (links.len() as u64 * w * iterations) as f64 / (ended - released).as_secs_f64());
        }
        Ok(())
    })();
    rank.close();
    r
}

#[cfg(not(feature = "ofi"))]
fn transport_worker(_p: &Point, _a: &Args, _provider: Provider, _cpus: &[usize]) -> Result<(), String> {
    Err("--mode transport needs the ofi feature".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    fn args(extra: &[&str]) -> Args {
        Cli::parse_from(std::iter::once("multirate").chain(extra.iter().copied())).args
    }

    fn point(mode: Mode, window: usize) -> Point {
        Point {
            pattern: Pattern::Pairwise,
            mode,
            pairs: 1,
            size: 0,
            window,
            progress: ProgressMode::Concurrent,
            assignment: Assignment::Dedicated,
            cris: 1,
            matching: MatchingMode::PerComm,
        }
    }

    /// A run's time spans every worker's measured iterations, however late the coordinator
    /// thread runs: it pauses 500 ms after the start barrier (as a descheduled thread
    /// would), while the workers each spend 50 ms in their measured phase and then finish.
    /// Timed from where the coordinator woke, the run took almost nothing (an impossible
    /// rate); it must take the workers' 50 ms and not the coordinator's pause.
    #[test]
    fn a_late_coordinator_does_not_change_the_time() {
        let (iterations, window) = (4, 8);
        let a = args(&["-i", &iterations.to_string(), "--bind", "none"]);
        let faults = Faults { coordinator_pause: Duration::from_millis(500), worker_pause: Duration::from_millis(50), ..Faults::default() };
        for mode in [Mode::Thread, Mode::Process] {
            let rate = measure(&point(mode, window), &a, Provider::Embedded, &[], faults).unwrap();
            let elapsed = Duration::from_secs_f64((iterations * window) as f64 / rate);
            assert!(elapsed >= faults.worker_pause, "{mode:?}: timed {elapsed:?}; the workers spent over 50 ms");
            assert!(elapsed < faults.coordinator_pause, "{mode:?}: timed {elapsed:?}: the coordinator's pause counted");
        }
    }

    /// Hybrid mode puts the T senders in blocks on the first P ranks and the receivers on
    /// the next P; thread and process mode are its two ends.
    #[test]
    fn hybrid_mode_places_workers_in_blocks() {
        assert_eq!("hybrid-2".parse::<Mode>(), Ok(Mode::Hybrid(2)));
        assert!("hybrid-0".parse::<Mode>().is_err() && "hybrid".parse::<Mode>().is_err() && "threads".parse::<Mode>().is_err());
        let h = Mode::Hybrid(2);
        assert_eq!(h.ranks(4), 4);
        assert_eq!((0..4).map(|i| h.sender(4, i)).collect::<Vec<_>>(), [(0, 0), (0, 1), (1, 0), (1, 1)]);
        assert_eq!((0..4).map(|j| h.receiver(4, j)).collect::<Vec<_>>(), [(2, 0), (2, 1), (3, 0), (3, 1)]);
        assert_eq!((0..3).map(|i| h.sender(3, i).0).collect::<Vec<_>>(), [0, 0, 1], "uneven blocks");
        assert_eq!((h.auto_cris(4), h.threaded(4)), (2, true));
        assert_eq!(Mode::Hybrid(8).ranks(4), 8, "more processes than pairs: process mode");
        assert!(!Mode::Hybrid(8).threaded(4));
        assert_eq!((Mode::Thread.ranks(4), Mode::Thread.receiver(4, 3)), (2, (1, 3)));
        assert_eq!((Mode::Process.ranks(4), Mode::Process.receiver(4, 3)), (8, (7, 0)));
        assert_eq!(Mode::Hybrid(2).name(), "hybrid-2");
    }

    /// The audit's mis-timed 265 M msg/s on 2 cores is discarded and the run repeated; a
    /// plausible rate on a later attempt is kept; three implausible ones (or a zero time)
    /// are an error, never a row.
    #[test]
    fn implausible_rates_are_run_again_then_refused() {
        let script = |rates: &'static [f64]| {
            let mut it = rates.iter();
            move || Ok(*it.next().expect("asked for one run too many"))
        };
        assert_eq!(plausible(2, script(&[7.5e6])), Ok(7.5e6));
        assert_eq!(plausible(2, script(&[265e6, 7.5e6])), Ok(7.5e6));
        assert_eq!(plausible(16, script(&[265e6])), Ok(265e6), "16 cores may do it");
        let err = plausible(2, script(&[265e6, f64::INFINITY, 3e8])).unwrap_err();
        assert!(err.contains("265000000, inf, 300000000") && err.contains("timing is broken"), "{err}");
        // A failed run is an error at once.
        assert_eq!(plausible(2, || Err("boom".to_string())), Err("boom".to_string()));
    }
}
