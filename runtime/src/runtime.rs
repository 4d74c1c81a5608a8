//! `Runtime` and its builder: one rank's transport, CRIs, communicator table and progress
//! state. Everything hangs off a `Runtime`; several can live in one process (the embedded
//! provider's process mode runs one per rank).

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use weft_sync::{Error, SyncObject};
use weft_transport::Transport;

use crate::buffer::Primitive;
use crate::comm::Communicator;
use crate::config::{Assignment, Config, MatchingMode, ProgressMode};
use crate::datatype::Datatype;
use crate::engine::{ContextTable, Courier, Cri, CriLocal, Engine, Outbox, PeerWatch, RankCounters, RendezvousReads};
#[allow(unused_imports)] // `JoinError` is named in docs.
use crate::executor::{JoinError, JoinHandle};
use crate::lock::owner::OwnerToken;
use crate::lock::path::{Counting, PathLock};
use crate::lock::{FlatKind, LockOptions, Topology};
use crate::loom::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

/// A weft runtime: one rank.
///
/// Cheap to clone (a handle). Create one with [`Runtime::builder`]; with the embedded
/// provider, [`Builder::build_local`] creates every rank of a world inside this process.
///
/// ```
/// use weft::{Runtime, Source, Tag};
/// let ranks = Runtime::builder().build_local(2).unwrap();
/// let (a, b) = (ranks[0].world(), ranks[1].world());
/// let r = b.irecv(Vec::<u8>::with_capacity(16), Source::Any, Tag::Any).unwrap();
/// a.send(b"hello".to_vec(), 1, 7).unwrap();
/// let (buf, status) = r.wait().unwrap();
/// assert_eq!((&buf[..], status.source, status.tag), (&b"hello"[..], 0, 7));
/// ```
#[derive(Clone)]
pub struct Runtime {
    pub(crate) engine: Arc<Engine>,
    world: Communicator,
    /// Engine by the `Runtime` clones only: the last one stops the pool (held for its
    /// `Drop`).
    #[allow(dead_code)]
    exec: Arc<ExecGuard>,
}

/// Stops the rank's threads — the executor pool, the courier, the distributed locks'
/// stand-in — when the last `Runtime` handle drops (communicators and requests keep the
/// rank's state alive, not its threads).
struct ExecGuard {
    engine: Arc<Engine>,
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        // While this guard still holds the state: the courier's own reference is never the
        // last, so the state is never dropped on it.
        self.engine.courier.stop();
        self.engine.executor.shutdown();
        self.engine.drop_schedules();
        crate::dlock::stop_stand_in(&self.engine);
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime").field("rank", &self.rank()).field("size", &self.size()).field("config", &self.engine.config).finish()
    }
}

impl Runtime {
    /// A builder with the default configuration.
    pub fn builder() -> Builder {
        Builder { config: Config::default(), use_env: true }
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.engine.transport.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> u32 {
        self.engine.transport.size()
    }

    /// The world ranks that run on this rank's host, ascending, this one included, where the
    /// launcher tells them (a PMIx server's `PMIX_LOCAL_PEERS`, under `srun --mpi=pmix` or
    /// `mpirun`); `None` elsewhere (`weftrun`, Slurm without PMIx, in-process worlds), where
    /// ranks compare host identities instead. Where given, the same-host lane reaches only
    /// these ranks and [`Levels::hosts`](crate::dlock::Levels::hosts) groups by them.
    pub fn host_ranks(&self) -> Option<&[u32]> {
        self.engine.transport.host_ranks()
    }

    /// The world communicator (all ranks, context 0).
    pub fn world(&self) -> &Communicator {
        &self.world
    }

    /// The resolved configuration.
    pub fn config(&self) -> &Config {
        &self.engine.config
    }

    /// A sync object whose waits and futures drive this runtime's progress.
    pub fn sync_object<T: Send + 'static>(&self) -> SyncObject<T> {
        SyncObject::with_progress(crate::progress::sync_hook(&self.engine))
    }

    /// Binds the calling thread to CRI `k` of this rank (under `Assignment::Dedicated`; like
    /// MPICH's `MPIX_Stream`, an explicit thread-to-resource mapping). A thread otherwise
    /// gets the next CRI in round-robin order at its first use, so which CRI a thread gets
    /// depends on the order threads first communicate in.
    ///
    /// A thread's sends leave through its CRI and arrive at the peer's CRI of the same
    /// index, where the peer's thread bound to that index progresses them first ([Patinyasakdikul 2019,
    /// Alg. 4]). When thread *i* of one rank talks to thread *i* of another, binding
    /// both to CRI *i* makes every frame arrive where its receiver polls; with first-use
    /// order they may be crossed, and each thread then completes the other's receives.
    /// Other assignments ignore the binding. `k` must be below the rank's CRI count.
    pub fn pin_cri(&self, k: usize) -> Result<(), Error> {
        let n = self.engine.cris.len();
        if k >= n {
            return Err(Error::InvalidArgument("CRI index out of range"));
        }
        crate::engine::pin_cri(self.engine.id, k);
        Ok(())
    }

    /// Makes one step of progress in the configured mode; returns whether anything moved
    /// (`MPIX_Progress`).
    pub fn progress(&self) -> bool {
        self.engine.progress_once().progressed()
    }

    /// Spawns `future` on this runtime's work-stealing pool (started on first use with
    /// [`Builder::workers`] threads) and returns its [`JoinHandle`], itself a future giving
    /// the output, or a [`JoinError`] if the task panicked or the runtime shut down first.
    ///
    /// A task that holds a `Runtime` clone keeps the pool running until the task finishes.
    /// Blocking waits inside a task work (the waiting thread runs other tasks meanwhile,
    /// in every progress mode and in [`block_on`](Self::block_on), and a task it runs may
    /// wait in turn, up to 32 waits nested on one thread), but
    /// `.await` is the better fit: a wait returns only once the task it runs has finished
    /// or waits itself, so a task must not block on something that only a blocked task
    /// will do after its own wait, and beyond 32 nested waits a wait runs no more tasks
    /// (with `workers(0)` it then waits forever).
    ///
    /// ```
    /// let rt = weft::Runtime::builder().workers(2).build().unwrap();
    /// let h = rt.spawn(async { 6 * 7 });
    /// assert_eq!(rt.block_on(h).unwrap(), 42);
    /// ```
    pub fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let pool = self.engine.executor.start(|| self.engine.clone()).expect("a live Runtime handle keeps the pool open");
        pool.spawn(future)
    }

    /// Runs `future` to completion on the calling thread (request and sync-object futures
    /// drive progress when polled). With `workers(0)`, or inside a task, the thread also
    /// runs spawned tasks meanwhile (see [`spawn`](Self::spawn) for how deep that nests).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        crate::executor::block_on(&self.engine.executor, future)
    }

    /// Packs `src` laid out as `ty` into `dst` (see [`Datatype::pack`]); packs of at least
    /// the pack threshold are split into pool tasks, so idle workers and waiting threads
    /// share the copying ([Patinyasakdikul 2019, §4.6.2]). Returns the elements written.
    pub fn pack<T: Primitive>(&self, ty: &Datatype<T>, src: &[T], dst: &mut [T]) -> Result<usize, Error> {
        crate::datatype::pack_parallel(&self.engine, ty, src, dst)
    }

    /// Unpacks `src` (packed elements) into `dst` laid out as `ty`, in parallel like
    /// [`pack`](Self::pack). Returns the elements read.
    pub fn unpack<T: Primitive>(&self, ty: &Datatype<T>, src: &[T], dst: &mut [T]) -> Result<usize, Error> {
        crate::datatype::unpack_parallel(&self.engine, ty, src, dst)
    }

    /// A snapshot of the runtime's counters.
    pub fn counters(&self) -> crate::counters::Snapshot {
        crate::counters::snapshot(&self.engine)
    }
}

/// Configures and creates runtimes.
#[derive(Debug, Clone)]
pub struct Builder {
    config: Config,
    use_env: bool,
}

impl Builder {
    /// Progress mode.
    pub fn progress(mut self, m: ProgressMode) -> Self {
        self.config.progress = m;
        self
    }
    /// CRI assignment.
    pub fn assignment(mut self, a: Assignment) -> Self {
        self.config.assignment = a;
        self
    }
    /// Matching mode.
    pub fn matching(mut self, m: MatchingMode) -> Self {
        self.config.matching = m;
        self
    }
    /// CRIs per rank.
    pub fn cris(mut self, n: usize) -> Self {
        self.config.cris = n;
        self
    }
    /// Eager/rendezvous threshold in bytes.
    pub fn eager_threshold(mut self, bytes: usize) -> Self {
        self.config.eager_threshold = bytes;
        self
    }
    /// Frames each CRI inbox holds (flow control).
    pub fn inbox_capacity(mut self, frames: usize) -> Self {
        self.config.inbox_capacity = frames;
        self
    }
    /// Largest tag accepted.
    pub fn max_tag(mut self, tag: i32) -> Self {
        self.config.max_tag = tag;
        self
    }
    /// Measure time in matching.
    pub fn match_timing(mut self, on: bool) -> Self {
        self.config.match_timing = on;
        self
    }
    /// Worker threads of the executor pool (default: cores; `WEFT_WORKERS`). The pool starts
    /// at the first [`Runtime::spawn`] (or parallel pack) and stops when the last `Runtime`
    /// handle is dropped. With 0 workers, tasks run on threads blocked in
    /// [`Runtime::block_on`] or in a wait.
    pub fn workers(mut self, n: usize) -> Self {
        self.config.workers = n;
        self
    }
    /// Whether communicator creation tries the eager segment of the context id mask first
    /// (default on; off: the base protocol alone, for comparison — [Dinan 2012, Listing 1.2]).
    pub fn eager_context_ids(mut self, on: bool) -> Self {
        self.config.eager_context_ids = on;
        self
    }
    /// Packs of at least this many bytes are split into pool tasks (default 256 KiB;
    /// `WEFT_PACK_THRESHOLD`).
    pub fn pack_threshold(mut self, bytes: usize) -> Self {
        self.config.pack_threshold = bytes;
        self
    }
    /// Provider (`WEFT_PROVIDER` overrides it). `Shm` and `Tcp` need the `ofi` feature.
    pub fn provider(mut self, p: crate::Provider) -> Self {
        self.config.provider = p;
        self
    }
    /// A simulated machine hierarchy whose level crossings delay RMA operations (embedded
    /// provider; see [`LevelCost`](crate::LevelCost); `WEFT_SIM_LEVELS`, `WEFT_LEVEL_COST_NS`).
    pub fn level_cost(mut self, cost: crate::LevelCost) -> Self {
        self.config.level_cost = cost;
        self
    }
    /// How long a blocked waiter yields its core before sleeping in the kernel (see
    /// [`Config::yield_window`]).
    pub fn yield_window(mut self, window: std::time::Duration) -> Self {
        self.config.yield_window = window;
        self
    }
    /// `PAUSE` instructions between two idle progress passes of a waiter (see
    /// [`Config::idle_pause`]).
    pub fn idle_pause(mut self, pauses: u32) -> Self {
        self.config.idle_pause = pauses;
        self
    }
    /// Order messages per sending thread rather than per source rank (see
    /// [`Config::per_thread_order`]; only with `Assignment::Dedicated`).
    pub fn per_thread_order(mut self, on: bool) -> Self {
        self.config.per_thread_order = on;
        self
    }
    /// Same-host lane on libfabric ([`Config::same_host_lane`]; `WEFT_SAME_HOST_LANE`).
    pub fn same_host_lane(mut self, on: bool) -> Self {
        self.config.same_host_lane = on;
        self
    }
    /// Lock protocol of one path (see [`Locks`](crate::Locks)).
    ///
    /// ```
    /// use weft::lock::{LockKind, LockPath};
    /// let rt = weft::Runtime::builder()
    ///     .env(false)
    ///     .lock(LockPath::Progress, LockKind::P_HMCS_MCS)
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(rt.config().locks.progress.to_string(), "p-hmcs-mcs");
    /// ```
    pub fn lock(mut self, path: crate::lock::LockPath, kind: crate::lock::LockKind) -> Self {
        self.config.locks.set(path, kind);
        self
    }
    /// Count each path lock's acquisitions, contended acquisitions and productive vs
    /// unproductive ones, reported by [`Runtime::counters`] (default off: an acquisition
    /// then writes no counter).
    pub fn lock_stats(mut self, on: bool) -> Self {
        self.config.lock_stats = on;
        self
    }
    /// Measure how long each path lock is held (two clock reads per acquisition); counts
    /// as [`lock_stats`](Self::lock_stats) does, too.
    pub fn lock_timing(mut self, on: bool) -> Self {
        self.config.lock_timing = on;
        self
    }
    /// Whether `WEFT_*` variables override the builder (default: yes).
    pub fn env(mut self, on: bool) -> Self {
        self.use_env = on;
        self
    }

    /// The configuration that `build*` would use.
    pub fn resolve(&self) -> Result<Config, Error> {
        let mut c = self.config.clone();
        if self.use_env {
            c.apply_env()?;
        }
        c.validate()?;
        Ok(c)
    }

    /// This process's rank of its job: started by `weftrun`, by a PMIx launcher
    /// (`srun --mpi=pmix`, `mpirun`; feature `pmix`) or under Slurm with `WEFT_KVS` (looked
    /// for in that order), it joins the job through the bootstrap on the configured
    /// provider; started plainly, it is rank 0 of 1.
    pub fn build(self) -> Result<Runtime, Error> {
        let config = self.resolve()?;
        let lock_options = self.lock_options(&config)?;
        let transport = crate::provider::open_process(&config)?;
        Ok(Self::assemble(config, lock_options, vec![transport])?.remove(0))
    }

    /// `ranks` runtimes in this process, rank `i` at index `i`: one embedded fabric, or (with
    /// `Shm`/`Tcp`) `ranks` libfabric ranks that exchange addresses directly.
    ///
    /// Memory grows with `ranks²`: each rank costs about 128 KiB, 128 bytes per other rank
    /// (sequence numbers and queues per destination) and its inboxes (embedded: CRIs x inbox
    /// capacity x 64 bytes; libfabric: up to 384 eager slots per CRI). A world whose estimate
    /// exceeds the memory the system reports available (`MemAvailable`, and the cgroup's
    /// limit) is refused with `Error::InvalidArgument` before anything is allocated: 10,000
    /// ranks of one CRI need about 14 GB.
    pub fn build_local(self, ranks: u32) -> Result<Vec<Runtime>, Error> {
        let config = self.resolve()?;
        let lock_options = self.lock_options(&config)?;
        let endpoints = crate::provider::local(&config, ranks)?;
        Self::assemble(config, lock_options, endpoints)
    }

    /// Options of the runtime's path locks (the machine topology only when a path uses HMCS).
    fn lock_options(&self, config: &Config) -> Result<LockOptions, Error> {
        let hmcs = [config.locks.progress, config.locks.cri, config.locks.matching].iter().any(|k| k.uses(FlatKind::Hmcs));
        let mut lock_options = LockOptions { topology: hmcs.then(Topology::detect), ..LockOptions::default() };
        if self.use_env {
            lock_options.apply_env()?;
        }
        Ok(lock_options)
    }

    fn assemble(config: Config, lock_options: LockOptions, endpoints: Vec<Transport>) -> Result<Vec<Runtime>, Error> {
        // std: a `static` needs a `const fn new`, which loom's atomics lack.
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let lock_counting = Counting::new(config.lock_stats, config.lock_timing);
        endpoints
            .into_iter()
            .map(|ep| {
                let size = ep.size();
                let engine = Arc::new_cyclic(|me| Engine {
                    id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                    cris: (0..config.cris)
                        .map(|_| {
                            let lock = PathLock::new(config.locks.cri, &lock_options, lock_counting, CriLocal::default());
                            CachePadded::new(Cri { lock, attending: AtomicU32::new(0), rma: Default::default() })
                        })
                        .collect(),
                    rr: CachePadded::new(AtomicUsize::new(0)),
                    contexts: ContextTable::new(PathLock::new(config.locks.matching, &lock_options, lock_counting, Vec::new())),
                    progress_lock: CachePadded::new(PathLock::new(config.locks.progress, &lock_options, lock_counting, ())),
                    lock_options: lock_options.clone(),
                    owner: CachePadded::new(OwnerToken::new()),
                    outbox: Outbox::new(size),
                    counters: RankCounters::default(),
                    executor: crate::executor::Executor::new(config.workers, ep.rank()),
                    peers: PeerWatch::new(size),
                    schedules: crate::engine::Schedules::new(),
                    courier: Courier::new(me.clone()),
                    reads: RendezvousReads::new(),
                    window_ends: Box::new(crate::rma::WindowEnds::default()),
                    transport: ep,
                    config: config.clone(),
                });
                let group = crate::group::Group::from_world((0..size).collect(), engine.transport.rank());
                let world = Communicator::create(&engine, 0, group, crate::comm::Assertions::default())?;
                let exec = Arc::new(ExecGuard { engine: engine.clone() });
                Ok(Runtime { engine, world, exec })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::loom::sync::atomic::{AtomicBool, Ordering};
    use crate::{Assignment, Error, Runtime};

    /// Freed communicators' states are collected by later `dup`s ([Goodell 2010]'s threshold),
    /// so a dup/free loop keeps a bounded number of them; a thread that holds a CRI lock
    /// (as frame handling does while it uses a looked-up state) holds a collection back.
    #[test]
    fn freed_communicators_are_collected() {
        let rts = Runtime::builder().env(false).cris(2).build_local(1).unwrap();
        let rt = &rts[0];
        for _ in 0..200 {
            rt.world().dup().unwrap().free();
            assert!(rt.engine.contexts.retired.lock().len() <= 2 * (crate::engine::COLLECT_AFTER + 1));
        }
        let weak = {
            let c = rt.world().dup().unwrap();
            let w = std::sync::Arc::downgrade(&c.p2p_state());
            c.free();
            w
        };
        assert!(weak.upgrade().is_some(), "retired, not yet collected");
        // A reader inside a CRI critical section delays the collection until it leaves.
        let collected = AtomicBool::new(false);
        std::thread::scope(|s| {
            rt.engine.cris[1].lock.high(|_| {
                s.spawn(|| {
                    rt.engine.collect_retired(true);
                    collected.store(true, Ordering::SeqCst);
                });
                // The collector has begun once it took the retired states (it then waits
                // out every CRI lock, ours included, before it frees them).
                let t0 = std::time::Instant::now();
                while !rt.engine.contexts.retired.lock().is_empty() {
                    assert!(t0.elapsed() < std::time::Duration::from_secs(30), "the collector never began");
                    std::thread::yield_now();
                }
                assert!(!collected.load(Ordering::SeqCst), "collected under a reader");
                assert!(weak.upgrade().is_some());
            });
        });
        assert!(collected.load(Ordering::SeqCst));
        assert!(weak.upgrade().is_none(), "collected once no reader remains");
    }

    /// `pin_cri` sets the calling thread's dedicated CRI (per runtime, per thread), rejects
    /// an index out of range, and is ignored under round-robin assignment.
    #[test]
    fn pin_cri_binds_the_calling_thread() {
        let rts = Runtime::builder().env(false).cris(4).assignment(Assignment::Dedicated).build_local(2).unwrap();
        let (a, b) = (&rts[0], &rts[1]);
        assert!(matches!(a.pin_cri(4), Err(Error::InvalidArgument(_))));
        a.pin_cri(3).unwrap();
        assert_eq!(a.engine.cri_for_thread(), 3);
        // Another runtime of the same thread keeps its own choice.
        b.pin_cri(1).unwrap();
        assert_eq!(b.engine.cri_for_thread(), 1);
        assert_eq!(a.engine.cri_for_thread(), 3);
        // Re-pinning replaces the binding; other threads are unaffected.
        a.pin_cri(2).unwrap();
        assert_eq!(a.engine.cri_for_thread(), 2);
        std::thread::scope(|s| {
            s.spawn(|| {
                a.pin_cri(0).unwrap();
                assert_eq!(a.engine.cri_for_thread(), 0);
            });
        });
        assert_eq!(a.engine.cri_for_thread(), 2);
        // A pinned thread's messages still arrive.
        let (buf, st) = std::thread::scope(|s| {
            let r = s.spawn(|| b.world().recv(Vec::<u8>::with_capacity(4), 0, 7));
            a.world().send(vec![1u8, 2, 3], 1, 7).unwrap();
            r.join().unwrap().unwrap()
        });
        assert_eq!((buf, st.bytes), (vec![1, 2, 3], 3));

        let rr = Runtime::builder().env(false).cris(4).assignment(Assignment::RoundRobin).build_local(1).unwrap();
        rr[0].pin_cri(3).unwrap();
        let picks: Vec<usize> = (0..4).map(|_| rr[0].engine.cri_for_thread()).collect();
        assert_eq!(picks.iter().collect::<std::collections::HashSet<_>>().len(), 4, "round-robin ignores the pin: {picks:?}");
    }
}
