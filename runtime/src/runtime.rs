//! `Runtime` and its builder: one rank's transport, CRIs, communicator table and progress
//! state. Everything hangs off a `Runtime`; several can live in one process (the embedded
//! provider's process mode runs one per rank).

use std::fmt;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use weft_sync::{Error, Progress, SyncObject};
use weft_transport::{Frame, Transport};

use std::future::Future;

use crate::buffer::Primitive;
use crate::comm::{CommState, Communicator, TAG_PARTS};
use crate::config::{Assignment, Config, MatchingMode, ProgressMode};
use crate::counters::{Counters, CriCounters};
use crate::datatype::Datatype;
#[allow(unused_imports)] // `JoinError` is named in docs.
use crate::executor::{JoinError, JoinHandle};
use crate::lock::{FlatKind, LockOptions, Topology};
use crate::matching::{MatchState, Matched};
use crate::owner::OwnerToken;
use crate::paths::PathLock;

/// Largest number of live context ids per runtime.
pub(crate) const MAX_CONTEXTS: usize = 1 << SLOT_BITS;

/// Bits of a context id that name its slot in the context table; the bits above count the
/// slot's generations (a slot is reused after its communicator is freed everywhere, and a
/// frame of an earlier generation is recognised as stale instead of being delivered to the
/// communicator that now holds the slot).
pub(crate) const SLOT_BITS: u32 = 12;

/// Generations a slot can go through (the context id is a `u32`).
pub(crate) const MAX_GENERATIONS: u32 = 1 << (32 - SLOT_BITS);

/// Freed communicators kept before a communicator creation collects them ([Goodell 2010, §V-B]:
/// creation functions start a collection when the eligible set exceeds a threshold).
const COLLECT_AFTER: usize = 16;

/// The table slot of context id `ctx`.
#[inline]
pub(crate) fn slot_of(ctx: u32) -> usize {
    ctx as usize & (MAX_CONTEXTS - 1)
}

/// The generation of context id `ctx`.
#[inline]
pub(crate) fn generation_of(ctx: u32) -> u32 {
    ctx >> SLOT_BITS
}

/// One CRI as the runtime sees it: the lock that serializes posting and polling on it.
pub(crate) struct Cri {
    /// Held while sending on (high priority) or progressing (low priority) this CRI; guards
    /// its message counters and a progress pass's scratch lists.
    pub(crate) lock: PathLock<CriLocal>,
    /// 1 + the context id a thread dedicated to this CRI waits on while it polls the CRI
    /// in a `Concurrent` wait right now (0: nobody); waiters on other communicators leave
    /// the CRI's frames to it (see `Shared::progress_concurrent`).
    pub(crate) attending: AtomicU32,
}

/// What a CRI's lock guards.
#[derive(Default)]
pub(crate) struct CriLocal {
    /// Messages sent and received through the CRI.
    pub(crate) counters: CriCounters,
    /// Scratch lists of a progress pass on the CRI (kept empty between passes, reused, so a
    /// pass allocates nothing): the frames drained from it, and the matches found for
    /// them. The CRI's, not the thread's: no thread-local lookup per pass, and a pass nested
    /// inside another (on another CRI) has lists of its own.
    pub(crate) frames: Vec<Frame>,
    pub(crate) matched: Vec<Matched>,
}

/// Runtime state shared by every handle of one rank.
pub(crate) struct Shared {
    /// Unique id (thread-local CRI assignment is keyed by it).
    pub(crate) id: u64,
    /// Resolved configuration.
    pub(crate) config: Config,
    /// The transport endpoint of this rank.
    pub(crate) transport: Transport,
    /// This rank's CRIs.
    pub(crate) cris: Box<[CachePadded<Cri>]>,
    /// Round-robin CRI counter ([Patinyasakdikul 2019, Alg. 3], GET-INSTANCE-ID-ROUND-ROBIN).
    pub(crate) rr: CachePadded<AtomicUsize>,
    /// Communicator state by context slot (one atomic load per frame, no lock); the state's
    /// own `context` tells the generation. A reference taken from here is used only while
    /// holding a CRI lock (frame handling) or `table_gate` for reading (the rare paths):
    /// what [`Shared::collect_retired`] waits out before freeing an unpublished state.
    pub(crate) contexts: Box<[AtomicPtr<CommState>]>,
    /// Per slot: one more than the highest generation installed on this rank (0: never
    /// used). A frame for an older generation whose state is gone is stale.
    pub(crate) generations: Box<[AtomicU32]>,
    /// Freed communicators' states, unpublished from `contexts` but possibly still read by
    /// a thread that looked them up before ([Goodell 2010]'s eligible set `G_e`).
    pub(crate) retired: Mutex<Vec<Arc<CommState>>>,
    /// Held for reading by the rare paths that look communicators up outside a CRI lock
    /// (counters, lost peers, early-frame replay); for writing by the collector.
    pub(crate) table_gate: parking_lot::RwLock<()>,
    /// Matching counters of freed communicators (the snapshot stays monotone).
    pub(crate) freed_counters: Mutex<(crate::matching::MatchCounters, crate::lock::LockStatsSnapshot)>,
    /// Frames that arrived for a context this rank has not created yet (a fast peer).
    pub(crate) early_contexts: Mutex<Vec<Frame>>,
    /// Context ids claimed on this rank (dup agreement).
    pub(crate) claimed: Mutex<std::collections::BTreeSet<u32>>,
    /// The single matching lock of `MatchingMode::Global`, with every communicator's queues
    /// by context slot (grown to the highest slot used: a rank in another matching mode, or
    /// with few communicators, pays nothing for the slots it never uses).
    pub(crate) global_match: PathLock<Vec<Option<(u32, MatchState)>>>,
    /// The critical section of `ProgressMode::Global` ([Patinyasakdikul 2019, Alg. 1]; posting enters
    /// it with high priority, progress with low priority, as MPICH's global lock).
    pub(crate) progress_lock: CachePadded<PathLock<()>>,
    /// Topology and options for the path locks created later (communicators' matching).
    pub(crate) lock_options: LockOptions,
    /// Progress owner of `ProgressMode::Owner` and its hand-off.
    pub(crate) owner: CachePadded<OwnerToken>,
    /// Frames a full inbox refused (eager sends, `Rts`, `Fin`), in posting order, sent by
    /// progress (`Shared::flush_deferred`) — the rank's threads' or its courier's: a
    /// nonblocking send never blocks, and nobody has to poll for the frames.
    pub(crate) deferred: Mutex<crate::protocol::DeferredQueues>,
    /// `deferred` is non-empty: progress checks this flag instead of taking the lock. It
    /// changes only under the lock.
    pub(crate) has_deferred: std::sync::atomic::AtomicBool,
    /// Deferred frames per destination rank: a send to a rank with frames waiting queues
    /// behind them instead of overtaking them.
    pub(crate) deferred_to: Box<[AtomicU32]>,
    /// Rare-path counters (parks, wakes, hand-offs).
    pub(crate) counters: Counters,
    /// The work-stealing pool (started at the first spawn).
    pub(crate) executor: crate::executor::Executor,
    /// Lost-peer bookkeeping (which peers are gone, rendezvous sends in flight, loss epoch
    /// handled).
    pub(crate) peers: crate::protocol::PeerWatch,
    /// The thread that sends deferred frames when no thread of the rank progresses (started
    /// by the first deferral; `courier.rs`).
    pub(crate) courier: crate::courier::Courier,
    /// Rendezvous reads in flight and the receives they fill. Declared after `transport`:
    /// dropped after it, so a buffer a read given up on still targets outlives the
    /// endpoints.
    pub(crate) reads: crate::protocol::RendezvousReads,
}

/// How long dropping a runtime keeps trying to send frames still deferred behind a full
/// inbox (sends whose requests were dropped before they went out).
const DRAIN_DEFERRED: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a dropped runtime waits for the receivers of its pending rendezvous sends to
/// read them (see `Drop for Shared`).
const DRAIN_RENDEZVOUS: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for Shared {
    fn drop(&mut self) {
        // Stopped by the last `Runtime` handle already (`ExecGuard`), unless the state
        // outlived none: no pass may race the teardown below.
        self.courier.stop();
        // A request dropped in flight leaves its deferred frame to progress; send what is
        // left while the peers still drain their inboxes (bounded: a peer may be gone).
        let deadline = std::time::Instant::now() + DRAIN_DEFERRED;
        while self.has_deferred.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            // A progress pass flushes the queue itself; flush directly only when it could
            // not run one (another thread owns progress).
            if !self.progress_once() && self.flush_deferred() == 0 {
                std::thread::yield_now();
            }
        }
        // A rendezvous send still waiting for its `Fin` (its request dropped, or never
        // waited for) has its data read by the receiver straight from the registered
        // buffer: closing now would fail that receive with `PeerLost` — a message lost,
        // though every message a finished rank sent must arrive. Progress until the `Fin`s
        // are in (bounded: a receiver may never post the receive, or be gone, which
        // `fail_lost` reports by failing the send). Likewise for this rank's own reads in
        // flight (receives dropped after they matched): their senders wait for the `Fin`.
        // A read still in flight after that is given up: its buffer is freed only after the
        // transport's endpoints (field order).
        let deadline = std::time::Instant::now() + DRAIN_RENDEZVOUS;
        while (self.rendezvous_pending() || self.reads_pending()) && std::time::Instant::now() < deadline {
            if !self.progress_once() && self.poll_rendezvous_reads() == 0 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        self.transport.close();
        for slot in self.contexts.iter() {
            // (Retired states drop with `retired`.)
            let p = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: every non-null slot holds an `Arc::into_raw` reference owned by
                // the table, released exactly once here.
                drop(unsafe { Arc::from_raw(p) });
            }
        }
    }
}

impl Shared {
    /// Runs a main-path step (posting) inside `Global` mode's critical section, with high
    /// priority; in the other modes the step's own (CRI or matching) lock suffices.
    #[inline]
    pub(crate) fn main_path<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.config.progress {
            ProgressMode::Global => self.progress_lock.high(|_| f()),
            _ => f(),
        }
    }

    /// The CRI this thread uses for its next send ([Patinyasakdikul 2019, Alg. 3]).
    #[inline]
    pub(crate) fn cri_for_thread(&self) -> usize {
        let n = self.cris.len();
        if n == 1 {
            return 0;
        }
        match self.config.assignment {
            Assignment::RoundRobin => self.rr.fetch_add(1, Ordering::Relaxed) % n,
            Assignment::Dedicated => crate::cri::dedicated(self.id, || self.rr.fetch_add(1, Ordering::Relaxed) % n),
        }
    }

    /// The communicator state of a context, if created on this rank.
    #[inline]
    pub(crate) fn context(&self, ctx: u32) -> Option<&CommState> {
        let p = self.contexts[slot_of(ctx)].load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-null slot holds an `Arc<CommState>` reference owned by the table;
        // when unpublished it moves to `retired`, and `collect_retired` frees it only after
        // every CRI lock and the table gate have been released once since — every caller
        // holds one of them while it uses the reference (see `contexts`).
        let c = unsafe { &*p };
        (c.context == ctx).then_some(c)
    }

    /// Whether a frame for `ctx`, whose state is not installed, belongs to a freed
    /// communicator (a generation this rank has already had in that slot), not to one this
    /// rank has yet to create.
    pub(crate) fn is_stale(&self, ctx: u32) -> bool {
        // Acquire: pairs with `install`'s Release after publishing: a reader that sees the
        // new generation here also sees the state in the table (checked after this).
        let upto = self.generations[slot_of(ctx)].load(Ordering::Acquire);
        self.context(ctx).is_none() && generation_of(ctx) < upto
    }

    /// Every installed communicator state. Call it holding `table_gate` for reading.
    pub(crate) fn installed(&self) -> impl Iterator<Item = &CommState> {
        (0..MAX_CONTEXTS).filter_map(move |slot| {
            let p = self.contexts[slot].load(Ordering::Acquire);
            // SAFETY: as in `context`; the caller holds the table gate.
            (!p.is_null()).then(|| unsafe { &*p })
        })
    }

    /// Unpublishes a freed communicator's state (its frames are stale from now on) and
    /// keeps it until a collection; its context slot can then be agreed on again.
    pub(crate) fn retire(&self, state: &Arc<CommState>) {
        let raw = Arc::as_ptr(state).cast_mut();
        let slot = &self.contexts[slot_of(state.context)];
        if slot.compare_exchange(raw, std::ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire).is_ok() {
            // SAFETY: the slot held the table's `Arc::into_raw` reference to this state,
            // which we now own (the exchange unpublished it).
            let owned = unsafe { Arc::from_raw(raw) };
            self.retired.lock().push(owned);
        }
    }

    /// Frees retired communicator states once no thread can still hold a reference taken
    /// from the table before they were unpublished ([Goodell 2010, §V-B]'s collection, with the
    /// readers' critical sections as the roots): a reader holds a CRI lock or the table
    /// gate while it uses one, so taking each of those once after the unpublishing is a
    /// grace period. Runs at communicator creation when more than [`COLLECT_AFTER`] wait.
    pub(crate) fn collect_retired(&self, force: bool) {
        let batch = {
            let mut r = self.retired.lock();
            if r.is_empty() || (!force && r.len() <= COLLECT_AFTER) {
                return;
            }
            std::mem::take(&mut *r)
        };
        for cri in self.cris.iter() {
            cri.lock.high(|_| ());
        }
        drop(self.table_gate.write());
        drop(batch);
    }

    /// How many matching states `comm` has: one per tag partition under `PerComm`, one
    /// (the global lock's slot, holding every partition's queues) under `Global`.
    #[inline]
    pub(crate) fn matching_parts(&self, comm: &CommState) -> usize {
        match self.config.matching {
            MatchingMode::PerComm => comm.parts(),
            MatchingMode::Global => 1,
        }
    }

    /// Main path: runs `f` on tag partition `part` of a communicator's matching state under
    /// its matching lock, with high priority (posting, probing, cancelling).
    #[inline]
    pub(crate) fn with_matching<R>(&self, comm: &CommState, part: usize, f: impl FnOnce(&mut MatchState) -> R) -> R {
        match self.config.matching {
            MatchingMode::PerComm => comm.matching[part].high(f),
            MatchingMode::Global => self.global_match.high(|all| f(Self::global_slot(all, comm))),
        }
    }

    /// Progress path: [`with_matching`](Self::with_matching) with low priority, for
    /// arrivals.
    #[inline]
    pub(crate) fn with_matching_low<R>(&self, comm: &CommState, part: usize, f: impl FnOnce(&mut MatchState) -> R) -> R {
        // An arrival is always handled (matched or queued): a productive acquisition.
        match self.config.matching {
            MatchingMode::PerComm => comm.matching[part].low(|m| (f(m), true)),
            MatchingMode::Global => self.global_match.low(|all| (f(Self::global_slot(all, comm)), true)),
        }
    }

    /// [`with_matching`](Self::with_matching) on the state where partition `part`'s
    /// receives and frames are matched now: `part`, or 0 if the communicator switched to one
    /// order after the caller chose `part` (checked under `part`'s lock, where it is exact).
    /// `f` runs once; it is `FnMut` so that it can be lent to the first lock and still be
    /// there for the second (a big capture such as a frame belongs outside it, borrowed).
    #[inline]
    pub(crate) fn with_matching_of<R>(&self, comm: &CommState, part: usize, f: impl FnMut(&mut MatchState) -> R) -> R {
        self.matching_now::<R, false>(comm, part, f)
    }

    /// [`with_matching_of`](Self::with_matching_of) with low priority, for arrivals.
    #[inline]
    pub(crate) fn with_matching_of_low<R>(&self, comm: &CommState, part: usize, f: impl FnMut(&mut MatchState) -> R) -> R {
        self.matching_now::<R, true>(comm, part, f)
    }

    /// The redirect of [`with_matching_of`](Self::with_matching_of), with the priority
    /// chosen at compile time (`LOW`: [`with_matching_low`](Self::with_matching_low)).
    #[inline]
    fn matching_now<R, const LOW: bool>(&self, comm: &CommState, part: usize, mut f: impl FnMut(&mut MatchState) -> R) -> R {
        if part == 0 {
            return self.lock_as::<R, LOW>(comm, 0, f);
        }
        match self.lock_as::<_, LOW>(comm, part, |m| (!comm.is_switched()).then(|| f(m))) {
            Some(r) => r,
            None => self.lock_as::<R, LOW>(comm, 0, f),
        }
    }

    /// [`with_matching_low`](Self::with_matching_low) if `LOW`, else
    /// [`with_matching`](Self::with_matching).
    #[inline]
    fn lock_as<R, const LOW: bool>(&self, comm: &CommState, part: usize, f: impl FnOnce(&mut MatchState) -> R) -> R {
        if LOW {
            self.with_matching_low(comm, part, f)
        } else {
            self.with_matching(comm, part, f)
        }
    }

    /// Runs `f` with every tag partition of `comm` locked, taken in order (high priority),
    /// if the communicator is still matched per partition (`MatchingMode::PerComm`, not
    /// switched to one order, not freed): the trim of the processed-number windows and the
    /// switch. `None` otherwise.
    fn while_partitioned<R>(&self, comm: &CommState, f: impl FnOnce(&mut [&mut MatchState; TAG_PARTS]) -> R) -> Option<R> {
        fn lock_from<R>(
            locks: &[CachePadded<PathLock<MatchState>>],
            held: &mut [*mut MatchState; TAG_PARTS],
            i: usize,
            f: impl FnOnce(&mut [&mut MatchState; TAG_PARTS]) -> R,
        ) -> R {
            match locks.get(i) {
                Some(lock) => lock.high(|m| {
                    held[i] = m;
                    lock_from(locks, held, i + 1, f)
                }),
                None => {
                    // SAFETY: each pointer comes from a distinct lock held by an enclosing
                    // call of this recursion (so no two alias), valid until that call
                    // returns, after `f`.
                    let mut all: [&mut MatchState; TAG_PARTS] = std::array::from_fn(|j| unsafe { &mut *held[j] });
                    f(&mut all)
                }
            }
        }
        if comm.matching.len() != TAG_PARTS || self.config.matching != MatchingMode::PerComm {
            return None;
        }
        let mut held = [std::ptr::null_mut(); TAG_PARTS];
        // Checked again under every lock: a switch or `free` (which drains the queues; its
        // receives fail) may have come first.
        lock_from(&comm.matching, &mut held, 0, |parts| (!comm.is_switched() && !comm.is_freed()).then(|| f(parts)))
    }

    /// Switches this rank's matching of a partitioned communicator to one order
    /// (`MatchState::merge`), once: the first `Tag::Any` receive or probe, or a partition
    /// whose processed-number window would outgrow its bound. Returns the pairs the merge
    /// made, to be finished outside the locks ([`finish_matches`](Self::finish_matches)).
    #[cold]
    pub(crate) fn switch_to_one_order(&self, comm: &CommState) -> Vec<Matched> {
        let mut out = Vec::new();
        self.while_partitioned(comm, |parts| {
            MatchState::merge(parts, &mut out);
            comm.set_switched();
        });
        out
    }

    /// Advances the processed-number windows of a partitioned communicator
    /// (`MatchState::trim`), which a partition asked for.
    #[cold]
    pub(crate) fn trim_partitions(&self, comm: &CommState) {
        self.while_partitioned(comm, |parts| MatchState::trim(parts));
    }

    /// Completes the receives of pairs made under a matching lock (outside it).
    pub(crate) fn finish_matches(&self, matched: Vec<Matched>) {
        for m in matched {
            self.finish_match(0, m.req, m.frame);
        }
    }

    #[inline]
    fn global_slot<'a>(all: &'a mut Vec<Option<(u32, MatchState)>>, comm: &CommState) -> &'a mut MatchState {
        let slot = slot_of(comm.context);
        if slot >= all.len() {
            // Out of line: once per slot at most (slots are handed out lowest first).
            Self::grow_global(all, slot);
        }
        // A slot's queues belong to one generation: a later communicator in the slot starts
        // afresh (`free` leaves an empty state behind, and a pass that looked the freed one
        // up before may still come by).
        let cur = &mut all[slot];
        if !matches!(cur, Some((ctx, _)) if *ctx == comm.context) {
            *cur = Some((comm.context, MatchState::new(comm.size, comm.order())));
        }
        &mut cur.as_mut().expect("just set").1
    }

    #[cold]
    fn grow_global(all: &mut Vec<Option<(u32, MatchState)>>, slot: usize) {
        all.resize_with(slot + 1, || None);
    }

    /// Registers a communicator's state under its context id and replays early frames.
    pub(crate) fn install(&self, state: Arc<CommState>) -> Result<(), Error> {
        let ctx = state.context;
        let slot = slot_of(ctx);
        let raw = Arc::into_raw(state) as *mut CommState;
        if self.contexts[slot].compare_exchange(std::ptr::null_mut(), raw, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // SAFETY: `raw` came from `into_raw` just above and was not published.
            drop(unsafe { Arc::from_raw(raw) });
            return Err(Error::InvalidArgument("context id already in use"));
        }
        // Release, after publishing: see `is_stale`.
        self.generations[slot].fetch_max(generation_of(ctx) + 1, Ordering::Release);
        let replay: Vec<Frame> = {
            let mut early = self.early_contexts.lock();
            let (mine, rest): (Vec<Frame>, Vec<Frame>) = early.drain(..).partition(|f| f.header.context == ctx);
            *early = rest;
            mine
        };
        if !replay.is_empty() {
            // Outside a CRI lock: the gate keeps the looked-up state alive (`contexts`).
            let _gate = self.table_gate.read();
            for f in replay {
                let k = self.cri_for_thread();
                self.handle_frame(k, f);
            }
        }
        Ok(())
    }

    /// The progress hook blocked waiters use for sync objects of this runtime.
    pub(crate) fn hook(self: &Arc<Self>) -> Arc<dyn Progress> {
        Arc::new(crate::progress::Hook { shared: self.clone() })
    }
}

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
    pub(crate) shared: Arc<Shared>,
    world: Communicator,
    /// Shared by the `Runtime` clones only: the last one stops the pool (held for its
    /// `Drop`).
    #[allow(dead_code)]
    exec: Arc<ExecGuard>,
}

/// Stops the rank's threads — the executor pool and the courier — when the last `Runtime`
/// handle drops (communicators and requests keep the rank's state alive, not its threads).
struct ExecGuard {
    shared: Arc<Shared>,
}

impl Drop for ExecGuard {
    fn drop(&mut self) {
        // While this guard still holds the state: the courier's own reference is never the
        // last, so the state is never dropped on it.
        self.shared.courier.stop();
        self.shared.executor.shutdown();
    }
}

impl fmt::Debug for Runtime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Runtime").field("rank", &self.rank()).field("size", &self.size()).field("config", &self.shared.config).finish()
    }
}

impl Runtime {
    /// A builder with the default configuration.
    pub fn builder() -> Builder {
        Builder { config: Config::default(), use_env: true }
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.shared.transport.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> u32 {
        self.shared.transport.size()
    }

    /// The world communicator (all ranks, context 0).
    pub fn world(&self) -> &Communicator {
        &self.world
    }

    /// The resolved configuration.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// A sync object whose waits and futures drive this runtime's progress.
    pub fn sync_object<T: Send + 'static>(&self) -> SyncObject<T> {
        SyncObject::with_progress(self.shared.hook())
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
        let n = self.shared.cris.len();
        if k >= n {
            return Err(Error::InvalidArgument("CRI index out of range"));
        }
        crate::cri::pin(self.shared.id, k);
        Ok(())
    }

    /// Makes one step of progress in the configured mode; returns whether anything moved
    /// (`MPIX_Progress`).
    pub fn progress(&self) -> bool {
        self.shared.progress_once()
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
        let pool = self.shared.executor.start(&self.shared).expect("a live Runtime handle keeps the pool open");
        pool.spawn(future)
    }

    /// Runs `future` to completion on the calling thread (request and sync-object futures
    /// drive progress when polled). With `workers(0)`, or inside a task, the thread also
    /// runs spawned tasks meanwhile (see [`spawn`](Self::spawn) for how deep that nests).
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        crate::executor::block_on(&self.shared, future)
    }

    /// Packs `src` laid out as `ty` into `dst` (see [`Datatype::pack`]); packs of at least
    /// the pack threshold are split into pool tasks, so idle workers and waiting threads
    /// share the copying ([Patinyasakdikul 2019, §4.6.2]). Returns the elements written.
    pub fn pack<T: Primitive>(&self, ty: &Datatype<T>, src: &[T], dst: &mut [T]) -> Result<usize, Error> {
        crate::datatype::pack_parallel(&self.shared, ty, src, dst)
    }

    /// Unpacks `src` (packed elements) into `dst` laid out as `ty`, in parallel like
    /// [`pack`](Self::pack). Returns the elements read.
    pub fn unpack<T: Primitive>(&self, ty: &Datatype<T>, src: &[T], dst: &mut [T]) -> Result<usize, Error> {
        crate::datatype::unpack_parallel(&self.shared, ty, src, dst)
    }

    /// A snapshot of the runtime's counters.
    pub fn counters(&self) -> crate::counters::Snapshot {
        crate::counters::snapshot(&self.shared)
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
    /// Measure how long each path lock is held (two clock reads per acquisition).
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

    /// This process's rank of its job: started by `weftrun` (or under Slurm with
    /// `WEFT_KVS`), it joins the job through the bootstrap on the configured provider;
    /// started plainly, it is rank 0 of 1.
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
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        endpoints
            .into_iter()
            .map(|ep| {
                let size = ep.size();
                let shared = Arc::new_cyclic(|me| Shared {
                    id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                    cris: (0..config.cris)
                        .map(|_| {
                            let lock = PathLock::new(config.locks.cri, &lock_options, config.lock_timing, CriLocal::default());
                            CachePadded::new(Cri { lock, attending: AtomicU32::new(0) })
                        })
                        .collect(),
                    rr: CachePadded::new(AtomicUsize::new(0)),
                    contexts: (0..MAX_CONTEXTS).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
                    generations: (0..MAX_CONTEXTS).map(|_| AtomicU32::new(0)).collect(),
                    retired: Mutex::new(Vec::new()),
                    table_gate: parking_lot::RwLock::new(()),
                    freed_counters: Mutex::new(Default::default()),
                    early_contexts: Mutex::new(Vec::new()),
                    claimed: Mutex::new([0u32, 1].into_iter().collect()),
                    global_match: PathLock::new(config.locks.matching, &lock_options, config.lock_timing, Vec::new()),
                    progress_lock: CachePadded::new(PathLock::new(config.locks.progress, &lock_options, config.lock_timing, ())),
                    lock_options: lock_options.clone(),
                    owner: CachePadded::new(OwnerToken::new()),
                    deferred: Mutex::new(crate::protocol::DeferredQueues::new(size)),
                    has_deferred: std::sync::atomic::AtomicBool::new(false),
                    deferred_to: (0..size).map(|_| AtomicU32::new(0)).collect(),
                    counters: Counters::default(),
                    executor: crate::executor::Executor::new(),
                    peers: crate::protocol::PeerWatch::new(size),
                    courier: crate::courier::Courier::new(me.clone()),
                    reads: crate::protocol::RendezvousReads::new(),
                    transport: ep,
                    config: config.clone(),
                });
                let world = Communicator::create(&shared, 0, size, crate::comm::Assertions::default())?;
                let exec = Arc::new(ExecGuard { shared: shared.clone() });
                Ok(Runtime { shared, world, exec })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
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
            assert!(rt.shared.retired.lock().len() <= 2 * (super::COLLECT_AFTER + 1));
        }
        let weak = {
            let c = rt.world().dup().unwrap();
            let w = std::sync::Arc::downgrade(&c.p2p_state());
            c.free();
            w
        };
        assert!(weak.upgrade().is_some(), "retired, not yet collected");
        // A reader inside a CRI critical section delays the collection until it leaves.
        let collected = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            rt.shared.cris[1].lock.high(|_| {
                s.spawn(|| {
                    rt.shared.collect_retired(true);
                    collected.store(true, std::sync::atomic::Ordering::SeqCst);
                });
                std::thread::sleep(std::time::Duration::from_millis(50));
                assert!(!collected.load(std::sync::atomic::Ordering::SeqCst), "collected under a reader");
                assert!(weak.upgrade().is_some());
            });
        });
        assert!(collected.load(std::sync::atomic::Ordering::SeqCst));
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
        assert_eq!(a.shared.cri_for_thread(), 3);
        // Another runtime of the same thread keeps its own choice.
        b.pin_cri(1).unwrap();
        assert_eq!(b.shared.cri_for_thread(), 1);
        assert_eq!(a.shared.cri_for_thread(), 3);
        // Re-pinning replaces the binding; other threads are unaffected.
        a.pin_cri(2).unwrap();
        assert_eq!(a.shared.cri_for_thread(), 2);
        std::thread::scope(|s| {
            s.spawn(|| {
                a.pin_cri(0).unwrap();
                assert_eq!(a.shared.cri_for_thread(), 0);
            });
        });
        assert_eq!(a.shared.cri_for_thread(), 2);
        // A pinned thread's messages still arrive.
        let (buf, st) = std::thread::scope(|s| {
            let r = s.spawn(|| b.world().recv(Vec::<u8>::with_capacity(4), 0, 7));
            a.world().send(vec![1u8, 2, 3], 1, 7).unwrap();
            r.join().unwrap().unwrap()
        });
        assert_eq!((buf, st.bytes), (vec![1, 2, 3], 3));

        let rr = Runtime::builder().env(false).cris(4).assignment(Assignment::RoundRobin).build_local(1).unwrap();
        rr[0].pin_cri(3).unwrap();
        let picks: Vec<usize> = (0..4).map(|_| rr[0].shared.cri_for_thread()).collect();
        assert_eq!(picks.iter().collect::<std::collections::HashSet<_>>().len(), 4, "round-robin ignores the pin: {picks:?}");
    }
}
