//! Modes and sizes of a runtime, chosen by the builder and overridden by `WEFT_*` variables
//! (as MCA parameters override Open MPI's defaults), so benchmarks sweep without recompiling.

use std::fmt;
use std::str::FromStr;

use crate::lock::{FlatKind, LockKind, LockPath};
use weft_sync::Error;
pub use weft_transport::embedded::LevelCost;
pub use weft_transport::Provider;

/// How waiting threads drive progress ([Patinyasakdikul 2019] ch. 4-5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProgressMode {
    /// [Patinyasakdikul 2019, Alg. 1]: every waiter loops over its requests and enters progress under
    /// one lock. The baseline that MPI libraries ship.
    Global,
    /// [Patinyasakdikul 2019, Alg. 2]: one waiter owns progress, the others park on their sync objects
    /// until their own requests complete; ownership passes to the next waiter.
    Owner,
    /// [Patinyasakdikul 2019, Alg. 3-4]: waiters progress CRIs under try-lock, their dedicated CRI
    /// first and then the others. The default: in the multirate sweeps it matches or beats
    /// `Owner` in every thread-mode row, threads hand nothing to an owner (fewer context
    /// switches when oversubscribed), and the shm ping-pong is faster (docs/BENCHMARKS.md).
    Concurrent,
}

/// How a thread is given a CRI ([Patinyasakdikul 2019, §5.3.3], Algorithm 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Assignment {
    /// A different CRI for every call, first come first served.
    RoundRobin,
    /// A CRI per thread, fixed at its first call (thread-local).
    Dedicated,
}

/// Where matching happens ([Patinyasakdikul 2019, §5.3.5]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatchingMode {
    /// A queue pair and lock per communicator: communicators match concurrently.
    PerComm,
    /// One lock over every communicator's queues, as in MPICH; for comparison.
    Global,
}

macro_rules! named_enum {
    ($t:ty, $what:literal, $var:literal, $( $name:literal => $v:expr ),+ $(,)?) => {
        impl $t {
            /// The error of a bad value in the variable that sets this mode, naming it.
            const ENV_ERROR: Error = Error::InvalidArgument(concat!($var, " must be one of:", $( " ", $name, )+));
        }
        impl FromStr for $t {
            type Err = Error;
            fn from_str(s: &str) -> Result<Self, Error> {
                match s.trim().to_ascii_lowercase().as_str() {
                    $( $name => Ok($v), )+
                    _ => Err(Error::InvalidArgument(concat!("unknown ", $what, " (expected one of:", $( " ", $name, )+ ")"))),
                }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                $( if *self == $v { return f.write_str($name); } )+
                Ok(())
            }
        }
    };
}

named_enum!(ProgressMode, "progress mode", "WEFT_PROGRESS", "global" => ProgressMode::Global, "owner" => ProgressMode::Owner, "concurrent" => ProgressMode::Concurrent);
named_enum!(Assignment, "CRI assignment", "WEFT_ASSIGNMENT", "round-robin" => Assignment::RoundRobin, "dedicated" => Assignment::Dedicated);
named_enum!(MatchingMode, "matching mode", "WEFT_MATCHING", "per-comm" => MatchingMode::PerComm, "global" => MatchingMode::Global);

macro_rules! lock_help {
    ($var:literal) => {
        concat!(
            "unknown lock protocol in ",
            $var,
            " (expected tas, ticket, mcs, clh, hmcs, std, parking_lot, tas_park, or p-X-Y such as p-hmcs-mcs)"
        )
    };
}
const LOCK_HELP_PROGRESS: &str = lock_help!("WEFT_LOCK_PROGRESS");
const LOCK_HELP_CRI: &str = lock_help!("WEFT_LOCK_CRI");
const LOCK_HELP_MATCHING: &str = lock_help!("WEFT_LOCK_MATCHING");

/// The resolved configuration of a runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Progress mode (`WEFT_PROGRESS`).
    pub progress: ProgressMode,
    /// CRI assignment (`WEFT_ASSIGNMENT`).
    pub assignment: Assignment,
    /// Matching mode (`WEFT_MATCHING`).
    pub matching: MatchingMode,
    /// CRIs per rank (`WEFT_CRIS`).
    pub cris: usize,
    /// Largest message sent eagerly; larger ones use rendezvous (`WEFT_EAGER_THRESHOLD`).
    pub eager_threshold: usize,
    /// Frames a CRI inbox holds before senders are pushed back (`WEFT_INBOX`).
    pub inbox_capacity: usize,
    /// Largest tag accepted (`MPI_TAG_UB`).
    pub max_tag: i32,
    /// Communicator creation tries the eager segment of the context id mask first
    /// ([Dinan 2012, Listing 1.2]); off, its first allreduce is only the synchronizing step
    /// and every creation allocates from the base segment (the paper's baseline).
    pub eager_context_ids: bool,
    /// Measure time spent in matching (two clock reads per match; `WEFT_MATCH_TIMING=1`).
    pub match_timing: bool,
    /// Worker threads of the executor pool (`WEFT_WORKERS`; 0 = no pool threads: spawned
    /// tasks run only on threads that block in `block_on` or wait on requests).
    pub workers: usize,
    /// Packs of at least this many bytes are split into pool tasks
    /// (`WEFT_PACK_THRESHOLD`; [Patinyasakdikul 2019, §4.6.2]).
    pub pack_threshold: usize,
    /// Which provider moves frames (`WEFT_PROVIDER=embedded|shm|tcp`).
    pub provider: Provider,
    /// A simulated machine hierarchy on the embedded provider: ranks per node, nodes per
    /// rack, ..., and the delay added to each RMA operation that crosses a level
    /// (`WEFT_SIM_LEVELS=4,2` with `WEFT_LEVEL_COST_NS=100,1000`; see [`LevelCost`]). None by
    /// default; refused on libfabric, whose levels are the machine's own.
    pub level_cost: LevelCost,
    /// On libfabric (`shm`, `tcp`): carry small frames between ranks of one host through
    /// rings in shared memory, libfabric carrying larger frames, rendezvous reads and RMA
    /// (`WEFT_SAME_HOST_LANE`; default on). Off, every frame goes through libfabric's own
    /// provider, for comparison. Each rank may choose on its own.
    pub same_host_lane: bool,
    /// Order messages per sending *thread* instead of per source rank
    /// (`WEFT_PER_THREAD_ORDER=1`; needs `Assignment::Dedicated`). MPI orders the sends of one
    /// thread; sends of distinct threads are logically concurrent. With this on, each thread's
    /// dedicated CRI is its own ordering channel, so frames of different threads never wait
    /// for each other in the out-of-sequence queue ([Patinyasakdikul 2019, §5.4.4]). Off by default: an
    /// async task that moves between threads (weft's pool, tokio) between two sends to the
    /// same peer could see them overtake each other.
    ///
    /// Every rank must choose the same: it decides how senders number their messages — per
    /// thread channel, or per tag partition plus a count over all tags (partitioned
    /// matching, README) — and a receiver that expects the other numbering would leave
    /// receives waiting. Checked at start: a job whose ranks differ (here, the CRI count or
    /// the eager threshold) fails to build with `Error::InvalidArgument` naming the setting
    /// (the values travel with the address exchange); ranks made by `build_local` share one
    /// configuration.
    pub per_thread_order: bool,
    /// How long a blocked waiter yields its core, watching for its notification, before it
    /// sleeps in the kernel (`WEFT_YIELD_US`, microseconds; default 50 us). [Patinyasakdikul 2019, §4.4]:
    /// waiters "wait peacefully, yielding the usage of CPU core". A notification in this
    /// window costs the notifier no futex wake and the waiter no wake-up latency.
    pub yield_window: std::time::Duration,
    /// `PAUSE` instructions a waiter spends between two progress passes that found nothing
    /// (`WEFT_IDLE_PAUSE`; default 1). A pass on libfabric reads the CQ, which on `shm` takes
    /// the spin lock of this rank's shared region that a sender needs to deliver, so a
    /// longer pause can help the sender — on a 2-vCPU Intel VM 8 took the one-way `shm`
    /// ping-pong from 0.90 to 0.86 us; on a 2-vCPU AMD EPYC VM 8 made it 0.555 us against
    /// 0.485 with 0 or 1 (`PAUSE` lasts a different number of cycles on each), and on the
    /// embedded provider 8 cost ~10% of the 1-pair multirate. A thread that finds every core
    /// already spinning yields instead (`weft_sync::IdleBackoff`).
    pub idle_pause: u32,
    /// Lock protocol of each path (`WEFT_LOCK_PROGRESS`, `WEFT_LOCK_CRI`, `WEFT_LOCK_MATCHING`).
    pub locks: Locks,
    /// Count each path lock's acquisitions, contended acquisitions and productive vs
    /// unproductive ones ([`Snapshot`](crate::Snapshot)'s `progress_lock`, `cri_lock`,
    /// `matching_lock`; `WEFT_LOCK_STATS=1`). Off, an acquisition writes no counter.
    pub lock_stats: bool,
    /// Measure how long each path lock is held (two clock reads per acquisition;
    /// `WEFT_LOCK_TIMING=1`); turns the lock counts on too.
    pub lock_timing: bool,
}

/// Longest idle pause accepted (about 100 µs on current cores: longer only delays waiters).
const MAX_IDLE_PAUSE: u32 = 4096;

/// The lock protocol of each runtime path ([Amer 2019, §4]: no single protocol suits every path).
///
/// The main path (posting a send, posting a receive) acquires with high priority, the
/// progress path (polling a CRI, matching an arrival) with low priority; the two classes only
/// differ for the priority kinds `p-X-Y`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Locks {
    /// The one critical section of [`ProgressMode::Global`] (posting and progress), as
    /// MPICH's global lock. Default `p-mcs-mcs`.
    pub progress: LockKind,
    /// Each CRI's lock (sending on it, polling it). Default `tas_park` ([`TasPark`]).
    ///
    /// [`TasPark`]: crate::lock::TasPark
    pub cri: LockKind,
    /// Each matching engine's lock (one per communicator, or the one of
    /// [`MatchingMode::Global`]). Default `tas_park`.
    pub matching: LockKind,
}

impl Default for Locks {
    fn default() -> Self {
        Locks { progress: LockKind::P_MCS_MCS, cri: LockKind::Flat(FlatKind::TasPark), matching: LockKind::Flat(FlatKind::TasPark) }
    }
}

impl Locks {
    /// The protocol of `path`.
    pub fn get(&self, path: LockPath) -> LockKind {
        match path {
            LockPath::Progress => self.progress,
            LockPath::Cri => self.cri,
            LockPath::Matching => self.matching,
        }
    }

    /// Sets the protocol of `path`.
    pub fn set(&mut self, path: LockPath, kind: LockKind) {
        match path {
            LockPath::Progress => self.progress = kind,
            LockPath::Cri => self.cri = kind,
            LockPath::Matching => self.matching = kind,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            progress: ProgressMode::Concurrent,
            assignment: Assignment::Dedicated,
            matching: MatchingMode::PerComm,
            cris: std::thread::available_parallelism().map_or(1, |n| n.get()),
            eager_threshold: 16 * 1024,
            inbox_capacity: 1024,
            max_tag: i32::MAX,
            eager_context_ids: true,
            match_timing: false,
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            pack_threshold: 256 * 1024,
            provider: Provider::Embedded,
            level_cost: LevelCost::default(),
            per_thread_order: false,
            same_host_lane: true,
            yield_window: std::time::Duration::from_micros(50),
            idle_pause: 1,
            locks: Locks::default(),
            lock_stats: false,
            lock_timing: false,
        }
    }
}

impl Config {
    /// Applies `WEFT_*` environment overrides; a malformed value is an error, not ignored.
    pub fn apply_env(&mut self) -> Result<(), Error> {
        /// The value of `WEFT_*` variable `$name` (`None`: unset or blank); one that is not
        /// UTF-8 is a bad value, not an unset one (an MCA parameter with a bad value fails).
        macro_rules! var {
            ($name:literal) => {
                match std::env::var($name) {
                    Ok(v) if v.trim().is_empty() => None,
                    Ok(v) => Some(v),
                    Err(std::env::VarError::NotPresent) => None,
                    Err(std::env::VarError::NotUnicode(_)) => return Err(Error::InvalidArgument(concat!($name, " is not valid UTF-8"))),
                }
            };
        }
        fn num(name: &'static str, v: &str) -> Result<usize, Error> {
            v.trim().parse::<usize>().map_err(|_| Error::InvalidArgument(name))
        }
        // A switch: a value that is neither on nor off is an error (as a bad MCA parameter
        // is), not silently "off".
        fn switch(name: &'static str, v: &str) -> Result<bool, Error> {
            match v.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(Error::InvalidArgument(name)),
            }
        }
        if let Some(v) = var!("WEFT_PROGRESS") {
            self.progress = v.parse().map_err(|_| ProgressMode::ENV_ERROR)?;
        }
        if let Some(v) = var!("WEFT_ASSIGNMENT") {
            self.assignment = v.parse().map_err(|_| Assignment::ENV_ERROR)?;
        }
        if let Some(v) = var!("WEFT_MATCHING") {
            self.matching = v.parse().map_err(|_| MatchingMode::ENV_ERROR)?;
        }
        if let Some(v) = var!("WEFT_CRIS") {
            self.cris = num("WEFT_CRIS must be an integer in 1..=1024", &v)?;
        }
        if let Some(v) = var!("WEFT_EAGER_THRESHOLD") {
            self.eager_threshold = num("WEFT_EAGER_THRESHOLD must be a byte count of at most 64 MiB", &v)?;
        }
        if let Some(v) = var!("WEFT_INBOX") {
            self.inbox_capacity = num("WEFT_INBOX must be an integer in 1..=1048576", &v)?;
        }
        if let Some(v) = var!("WEFT_WORKERS") {
            self.workers = num("WEFT_WORKERS must be a worker count", &v)?;
        }
        if let Some(v) = var!("WEFT_PACK_THRESHOLD") {
            self.pack_threshold = num("WEFT_PACK_THRESHOLD must be a byte count", &v)?;
        }
        if let Some(v) = var!("WEFT_PROVIDER") {
            self.provider =
                v.parse().map_err(|_| Error::InvalidArgument("unknown provider in WEFT_PROVIDER (expected one of: embedded shm tcp)"))?;
        }
        match (var!("WEFT_SIM_LEVELS"), var!("WEFT_LEVEL_COST_NS")) {
            (None, None) => {}
            (Some(sizes), Some(costs)) => {
                const BAD: &str = "WEFT_SIM_LEVELS and WEFT_LEVEL_COST_NS must be comma lists of integers (ranks per node, nodes per rack, ...; nanoseconds per crossing)";
                let sizes: Vec<u32> =
                    sizes.split(',').map(|v| v.trim().parse().map_err(|_| Error::InvalidArgument(BAD))).collect::<Result<_, _>>()?;
                let costs: Vec<u64> =
                    costs.split(',').map(|v| v.trim().parse().map_err(|_| Error::InvalidArgument(BAD))).collect::<Result<_, _>>()?;
                self.level_cost = LevelCost::new(&sizes, &costs)?;
            }
            _ => return Err(Error::InvalidArgument("WEFT_SIM_LEVELS and WEFT_LEVEL_COST_NS are set together or not at all")),
        }
        if let Some(v) = var!("WEFT_MATCH_TIMING") {
            self.match_timing = switch("WEFT_MATCH_TIMING must be 1/true/yes/on or 0/false/no/off", &v)?;
        }
        for path in [LockPath::Progress, LockPath::Cri, LockPath::Matching] {
            let kind = path.kind_from_env().map_err(|_| {
                Error::InvalidArgument(match path {
                    LockPath::Progress => LOCK_HELP_PROGRESS,
                    LockPath::Cri => LOCK_HELP_CRI,
                    LockPath::Matching => LOCK_HELP_MATCHING,
                })
            })?;
            if let Some(kind) = kind {
                self.locks.set(path, kind);
            }
        }
        if let Some(v) = var!("WEFT_YIELD_US") {
            let us = num("WEFT_YIELD_US must be a number of microseconds", &v)?;
            self.yield_window = std::time::Duration::from_micros(us as u64);
        }
        if let Some(v) = var!("WEFT_IDLE_PAUSE") {
            self.idle_pause = u32::try_from(num("WEFT_IDLE_PAUSE must be a count of PAUSE instructions", &v)?)
                .map_err(|_| Error::InvalidArgument("WEFT_IDLE_PAUSE must be a count of PAUSE instructions"))?;
        }
        if let Some(v) = var!("WEFT_PER_THREAD_ORDER") {
            self.per_thread_order = switch("WEFT_PER_THREAD_ORDER must be 1/true/yes/on or 0/false/no/off", &v)?;
        }
        if let Some(v) = var!("WEFT_SAME_HOST_LANE") {
            self.same_host_lane = switch("WEFT_SAME_HOST_LANE must be 1/true/yes/on or 0/false/no/off", &v)?;
        }
        if let Some(v) = var!("WEFT_LOCK_STATS") {
            self.lock_stats = switch("WEFT_LOCK_STATS must be 1/true/yes/on or 0/false/no/off", &v)?;
        }
        if let Some(v) = var!("WEFT_LOCK_TIMING") {
            self.lock_timing = switch("WEFT_LOCK_TIMING must be 1/true/yes/on or 0/false/no/off", &v)?;
        }
        self.validate()
    }

    /// Most CRIs per rank (`WEFT_CRIS`, [`Builder::cris`](crate::Builder::cris)).
    pub const MAX_CRIS: usize = 1024;

    /// Most frames one CRI inbox holds (`WEFT_INBOX`,
    /// [`Builder::inbox_capacity`](crate::Builder::inbox_capacity)): 2^20 (see
    /// `weft_transport::embedded::MAX_INBOX_CAPACITY`). The libfabric providers post at most
    /// 256 receive buffers per CRI whatever it is.
    pub const MAX_INBOX_CAPACITY: usize = weft_transport::embedded::MAX_INBOX_CAPACITY;

    /// Most inbox frames of one rank on the embedded provider, over its CRIs (CRIs x inbox
    /// capacity): 2^22, 512 MiB of inbox slots (a slot is a 128-byte line on x86-64).
    pub const MAX_RANK_INBOX_FRAMES: usize = 1 << 22;

    /// Largest eager threshold (`WEFT_EAGER_THRESHOLD`,
    /// [`Builder::eager_threshold`](crate::Builder::eager_threshold)) on the embedded
    /// provider: 64 MiB, the capacity its pooled eager buffers are allocated with. The
    /// libfabric providers take at most 1 MiB.
    pub const MAX_EAGER_THRESHOLD: usize = weft_transport::embedded::MAX_EAGER_CAPACITY;

    /// Checks the sizes; an error names the setting (builder method and variable).
    pub fn validate(&self) -> Result<(), Error> {
        // The messages below spell these limits out.
        const _: () = assert!(
            Config::MAX_CRIS == 1024
                && Config::MAX_INBOX_CAPACITY == 1_048_576
                && Config::MAX_RANK_INBOX_FRAMES == 4_194_304
                && Config::MAX_EAGER_THRESHOLD == 64 << 20
        );
        if self.cris == 0 || self.cris > Self::MAX_CRIS {
            return Err(Error::InvalidArgument("CRI count (WEFT_CRIS / Builder::cris) must be in 1..=1024"));
        }
        if self.inbox_capacity == 0 || self.inbox_capacity > Self::MAX_INBOX_CAPACITY {
            return Err(Error::InvalidArgument("inbox capacity (WEFT_INBOX / Builder::inbox_capacity) must be in 1..=1048576 frames"));
        }
        // Both factors are bounded above: the product fits a `usize`.
        if self.provider == Provider::Embedded && self.cris * self.inbox_capacity > Self::MAX_RANK_INBOX_FRAMES {
            return Err(Error::InvalidArgument(
                "the embedded provider holds at most 4194304 inbox frames per rank: CRI count x inbox capacity \
                 (WEFT_CRIS x WEFT_INBOX / Builder::cris x Builder::inbox_capacity) is more",
            ));
        }
        if self.eager_threshold > Self::MAX_EAGER_THRESHOLD {
            return Err(Error::InvalidArgument("eager threshold (WEFT_EAGER_THRESHOLD / Builder::eager_threshold) must be at most 64 MiB"));
        }
        if self.workers > 1024 {
            return Err(Error::InvalidArgument("worker count must be in 0..=1024"));
        }
        if self.max_tag < 0 {
            return Err(Error::InvalidArgument("max tag must be non-negative"));
        }
        if self.idle_pause > MAX_IDLE_PAUSE {
            return Err(Error::InvalidArgument("idle pause must be in 0..=4096 PAUSE instructions"));
        }
        self.provider.check_available()?;
        if self.provider != Provider::Embedded && self.level_cost != LevelCost::default() {
            return Err(Error::InvalidArgument(
                "simulated machine levels (WEFT_SIM_LEVELS / Builder::level_cost) need the embedded provider",
            ));
        }
        if self.provider != Provider::Embedded && self.eager_threshold > 1 << 20 {
            return Err(Error::InvalidArgument(
                "the libfabric providers take an eager threshold (WEFT_EAGER_THRESHOLD / Builder::eager_threshold) of at most 1 MiB",
            ));
        }
        Ok(())
    }
}
