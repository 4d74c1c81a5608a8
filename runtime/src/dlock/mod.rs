//! Distributed locks over one-sided windows ([`crate::rma`]), as in [Schmid 2016]:
//!
//! | lock | what | acquire |
//! |---|---|---|
//! | [`DMcs`] | the D-MCS queue lock [Schmid 2016, Listings 2-3] | [`lock`](DMcs::lock) |
//! | [`RmaMcs`] | the topology-aware RMA-MCS: a D-MCS queue per machine element at each level, thresholds `T_L,i` [Schmid 2016, §3.5] | [`lock`](RmaMcs::lock) |
//! | [`RmaRw`] | the topology-aware reader-writer RMA-RW: queues and tree for the writers, a distributed counter for the readers, `T_DC`, `T_L,i`, `T_R`, `T_W` [Schmid 2016, Listings 4-10] | [`read`](RmaRw::read), [`write`](RmaRw::write) |
//! | [`SpinLock`] | the foMPI-style spin lock the seed compares with (one word, compare-and-swap) | [`lock`](SpinLock::lock) |
//! | [`FompiRw`] | the foMPI-style reader-writer lock (one central counter) | [`read`](FompiRw::read), [`write`](FompiRw::write) |
//!
//! On them, [`Dht`] is the seed's distributed hash table [Schmid 2016, §5.3]: a volume of
//! buckets and an overflow heap on every rank, each volume guarded by one of these locks
//! ([`VolumeLock`]), lookups as readers and inserts as writers.
//!
//! Every lock is collective to create (each allocates a window on every rank of the
//! communicator) and has a blocking acquire returning a [`Guard`], an `_async` form
//! (`lock_async().await`, `read_async`, `write_async`) and a `try_` form. Mutual exclusion
//! holds between ranks and between the threads and tasks of one rank: a rank's writers take
//! part in a queue protocol one at a time (a local lock orders them first, since the
//! protocol keeps one queue node per rank and level); readers need no local order.
//!
//! # Waiting
//!
//! A waiting rank reads its own queue word (or a reader counter) with one-sided gets and
//! atomics. In the queue locks (D-MCS, RMA-MCS, RMA-RW, the seed's "spin locally" loops)
//! and at RMA-RW's counters, after a few polls the waiter parks until a write to the word
//! wakes it: on the embedded provider every RMA write notifies the words it wrote, so the
//! predecessor's hand-off (the put of STATUS) wakes its successor at once, and parked ranks
//! take no CPU from the holder. A blocking call parks its thread, an `_async` call its
//! task (the thread runs other tasks meanwhile, on weft's executor
//! ([`crate::Runtime::spawn`]) or tokio alike, and thousands of tasks of one rank can wait
//! on a few threads).
//!
//! On libfabric a peer's write raises no event at the target, so the change a waiter needs
//! comes with a message: each lock has its own communicator (a duplicate of the one it was
//! made on, which no user message can match), and the rank that made the change, once it
//! is complete at its target, sends the waiting rank an empty *wake frame* tagged with the
//! word. The listings' protocols are unchanged; the frames and the words that say who
//! waits are beside them:
//!
//! - a queue node's STATUS (Listings 2, 4, 7: the spin for the hand-off): the rank passing
//!   the level knows its successor and wakes it, if it parked: a waiter about to park marks
//!   the NEXT it linked itself into parked (a compare-and-swap at its predecessor's rank),
//!   and the passer, after its put of STATUS, claims that NEXT with an atomic (on its own
//!   rank's memory unless it inherited the node) that sends the frame only if it found the
//!   mark, so a hand-off its successor saw while still polling costs no frame, and the
//!   hand-off waits for no progress of the successor's process;
//! - a node's NEXT (Listings 3, 5, 8: a releaser waiting for a successor that swapped the
//!   tail to make itself known), the counters (Listing 9, lines 5-9: readers waiting for a
//!   reset; Listing 7 with §3.3.3: a writer waiting for the readers to leave), the
//!   foMPI-style locks' word: the waiter does not know which rank will change the word,
//!   nor that rank who waits, so a *watchers word* beside it at the same rank holds a bit
//!   per waiting rank; the waiter sets its bit before its check, and each change (the
//!   successor's put of NEXT, a reset, a reader's departure or back-off, a release) is
//!   followed by a read of the watchers word and a frame to each rank set. Both are
//!   atomics at one rank, complete on return: the check sees the change, or the change's
//!   reader sees the bit (the foMPI-style readers watch a word of their own, which a
//!   reader's back-off, a change only writers need, leaves alone). A waiter with more
//!   than 64 ranks (no bit for each) polls these words instead: spinning a little, then
//!   yielding, then sleeping up to [`MAX_SLEEP`] (a task on a shared timer), as the
//!   foMPI-style locks do on the embedded provider (the seed's baselines poll).
//!
//! After a few polls the waiter posts the frame's receive before each check of its word,
//! then parks (its thread, or its task) until the frame comes, or [`WAKE_ALARM`] passed
//! (a thread; [`WAKE_CHECK`], or a rank's loss, for a task), and checks its word again.
//! The tasks of one rank waiting on one of the watched words share that receive: the first
//! leads (spins, then parks on the receive); the others park on it at once, with no receive
//! or check of their own, and are woken when its frame comes or it stops leading (its check
//! found the change, or its wait failed): thousands of tasks waiting on a rank cost one
//! receive and the leader's checks while they wait, and one check each per change. A
//! frame nobody received (its change seen first, its waiters gone) is consumed when a wait
//! on its word ends: a rank's queue of unexpected messages holds a few at most.
//! Dropping a [`Guard`] releases on the dropping thread (a release waits, briefly, only for
//! a successor that has entered the queue to make itself known);
//! [`unlock_async`](Guard::unlock_async) releases without blocking the thread, which matters
//! when that successor is a task on the same thread.
//!
//! # Lost ranks
//!
//! A wait whose check of its word failed while a rank of the lock's communicator is gone
//! (its process died, or it finished) fails with [`Error::PeerLost`] naming that rank,
//! within [`WAKE_ALARM`] of the loss or at once (a loss rings every rank's doorbell and
//! the written words' signals): the write it waits for may never come, and a rank cannot
//! tell which ranks ahead of it in a queue, or inside as readers, will write it. A write
//! that landed before its writer went is seen by the check first: a successor whose
//! releaser died between the flushed hand-off and its wake frame takes the lock. The
//! spin lock's word names its holder: a waiter there fails only once that rank is gone.
//! A lock whose rank was lost is not usable after that (its queues may hold the lost
//! rank's place); a rank that finishes while others still use a lock it made counts as
//! lost, as for a window.
//!
//! # Ranks that end their part
//!
//! Dropping a lock ends the rank's part of the lock's window (as dropping a window does,
//! [`crate::rma`], *A window's end*): each peer is told, and its later accesses to that part
//! fail. A rank that drops its lock while it holds it (its guard forgotten with
//! `mem::forget`), or while it waits or is being passed the lock (a future of `lock_async`
//! dropped), or while its node still holds a level others wait on, leaves waiters that no
//! write will ever reach. So a wait whose check failed after this rank learned of such an
//! end (a peer's notice is a message: a waiter past its first polls makes progress before
//! each check, and a parked one checks again at least every [`WAKE_ALARM`]) fails with
//! [`LOCK_ENDED`], as it does with `PeerLost` after a loss: as there, a rank cannot tell
//! which ranks ahead of it in a queue, or inside as readers, will write its word. The
//! spin lock's waiter fails only once the holder its word names ended its part. An access
//! of the protocol to the ended part itself fails with
//! `InvalidArgument("the target rank ended its part of the window")`.
//!
//! A rank that passed the lock (its put of the successor's STATUS, its claim of NEXT) and
//! then at once drops its lock must not make the successor fail, though the notice and the
//! put travel different paths (on `shm` the notice goes through the same-host lane, the
//! put through libfabric RMA; on `tcp` each CRI has its own connection). The order is made
//! at the ending rank: a window's drop first completes every put the rank issued at its
//! target (each flush reads back from each target written through the CRI, which
//! libfabric answers only after the writes before it on that path: on `shm` one command
//! queue per target endpoint, applied in order; on `tcp;ofi_rxm` the puts are delivery
//! complete and the read follows them on their connection; the embedded provider's
//! operations are complete on return), and only then sends its notices; the protocol's
//! puts were flushed the same way already, and its atomics are complete on return. The
//! waiter reads the end marks *before* its check, so a check that follows a notice sees
//! every write its sender made, the hand-off included, and takes the lock; the hand-off's
//! mark of an ended predecessor's NEXT (which fails) reads STATUS instead
//! (`Queues::wait_status`). A lock on which a rank ended its part is not usable after
//! that (a wait of any rank fails): drop a lock only once no rank still uses it (after a
//! barrier, or with a collective free of the program's own).
//!
//! # Machine levels
//!
//! [`Levels`] says which ranks share a machine element: [`Levels::hosts`] (ranks of one
//! host form a node), [`Levels::simulated`] (consecutive ranks: per node, per rack, ...) to
//! simulate a hierarchy with in-process ranks, or [`Levels::flat`].
//!
//! # Example
//!
//! ```
//! use weft::dlock::{Levels, RmaRw, Thresholds};
//! use weft::rma::Window;
//! use weft::Runtime;
//!
//! // Four ranks in this process, simulated as two nodes of two.
//! let ranks = Runtime::builder().build_local(4).unwrap();
//! std::thread::scope(|s| {
//!     for rt in &ranks {
//!         s.spawn(move || {
//!             let c = rt.world();
//!             let lock = RmaRw::new(c, &Levels::simulated(&[2]), &Thresholds::default()).unwrap();
//!             let data: Window<'_, u64> = c.window(1).unwrap();
//!             c.barrier().unwrap();
//!             for _ in 0..10 {
//!                 let w = lock.write().unwrap(); // alone: increment the word on rank 0
//!                 let mut v = [0];
//!                 data.get(0, 0, &mut v).unwrap();
//!                 data.put(0, 0, &[v[0] + 1]).unwrap();
//!                 data.flush(0).unwrap();
//!                 drop(w);
//!                 let r = lock.read().unwrap(); // with other readers
//!                 data.get(0, 0, &mut v).unwrap();
//!                 r.unlock().unwrap();
//!             }
//!             c.barrier().unwrap();
//!             let mut v = [0];
//!             data.get(0, 0, &mut v).unwrap();
//!             assert_eq!(v[0], 40);
//!             c.barrier().unwrap();
//!         });
//!     }
//! });
//! ```

use std::future::Future;
use std::pin::Pin;

use weft_sync::Error;

use crate::comm::Communicator;
use crate::rma::{Op, Window};

mod dht;
mod levels;
#[cfg(test)]
mod lost;
#[cfg(test)]
mod model;
mod queues;
mod wait;

pub use dht::{Dht, DhtConfig, VolumeLock};
pub use levels::Levels;
use queues::{node, Counters, Queues};
use wait::{block_on, Backoff, LocalGuard, LocalLock, Wakes};
pub use wait::{MAX_SLEEP, WAKE_ALARM, WAKE_CHECK};

/// What a wait for a lock gives when a rank ended its part of the lock (dropped it: its
/// window, [`crate::rma`]'s *A window's end*) while the wait could not go on: the holder
/// that dropped its lock without releasing it (its guard forgotten), a rank ahead in a
/// queue, or one whose write the wait needed, will never write (module docs, *Ranks that
/// end their part*).
pub const LOCK_ENDED: Error = Error::InvalidArgument("a rank ended its part of the lock (dropped it) while this rank waited for it");

/// Ends the thread that stands in for the parked tasks of `engine`'s rank (its runtime is
/// dropped), even where a lock of the rank was leaked.
pub(crate) fn stop_stand_in(engine: &std::sync::Arc<crate::engine::Engine>) {
    wait::StandIn::stop_rank(engine);
}

/// A lock's release, under way.
type Releasing<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>;

mod sealed {
    /// How a guard holds its lock.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Mode {
        /// Alone (a writer, or a mutual-exclusion lock).
        Exclusive,
        /// With other readers.
        Shared,
    }

    /// A distributed lock's release (what a [`Guard`](super::Guard) calls).
    pub trait Release: Sync {
        /// Releases the lock this rank holds in `mode`.
        fn release(&self, mode: Mode) -> super::Releasing<'_>;
    }
}
use sealed::{Mode, Release};

/// Holds a distributed lock (and, for a writer, this rank's local lock of it); releases
/// both when dropped, or by [`unlock`](Self::unlock) / [`unlock_async`](Self::unlock_async),
/// which report a failure (a lost successor, say).
#[must_use = "the lock is released when the guard is dropped"]
pub struct Guard<'a, L: Release> {
    lock: &'a L,
    mode: Mode,
    held: bool,
    /// Dropped after the release (fields drop after `Drop::drop`).
    _local: Option<LocalGuard<'a>>,
}

/// Holds a [`DMcs`].
pub type DMcsGuard<'a> = Guard<'a, DMcs>;

/// Holds a [`RmaMcs`].
pub type RmaMcsGuard<'a> = Guard<'a, RmaMcs>;

/// Holds a [`RmaRw`], as a reader or a writer.
pub type RmaRwGuard<'a> = Guard<'a, RmaRw>;

/// Holds a [`SpinLock`].
pub type SpinGuard<'a> = Guard<'a, SpinLock>;

/// Holds a [`FompiRw`], as a reader or a writer.
pub type FompiRwGuard<'a> = Guard<'a, FompiRw>;

impl<'a, L: Release> Guard<'a, L> {
    fn new(lock: &'a L, mode: Mode, local: Option<LocalGuard<'a>>) -> Self {
        Guard { lock, mode, held: true, _local: local }
    }

    /// Whether this guard holds a reader-writer lock as a reader.
    pub fn is_shared(&self) -> bool {
        self.mode == Mode::Shared
    }

    /// Releases the lock, reporting a failure.
    #[inline]
    pub fn unlock(mut self) -> Result<(), Error> {
        self.held = false;
        block_on(self.lock.release(self.mode))
    }

    /// Releases the lock, parking the task (not the thread) while the release waits.
    pub async fn unlock_async(mut self) -> Result<(), Error> {
        self.held = false;
        self.lock.release(self.mode).await
    }
}

impl<L: Release + std::fmt::Debug> std::fmt::Debug for Guard<'_, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("lock", self.lock).field("mode", &self.mode).finish()
    }
}

impl<L: Release> Drop for Guard<'_, L> {
    fn drop(&mut self) {
        if self.held {
            // A failure here has no one to report it to; `unlock` reports it.
            let _ = block_on(self.lock.release(self.mode));
        }
    }
}

/// The thresholds of RMA-MCS and RMA-RW [Schmid 2016, Table 2].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// `T_L,i`, the most passings of the lock among the writers of one element of level
    /// `i` before it leaves the element: `t_l[0]` for level 1 (the machine; RMA-RW only),
    /// `t_l[1]` for level 2, ...; a shorter list repeats its last value. Default `[16]`.
    pub t_l: Vec<u64>,
    /// `T_R`, the most readers that enter one counter consecutively while a writer waits
    /// (RMA-RW). Default 1,000.
    pub t_r: u64,
    /// `T_DC`: one physical reader counter on every `t_dc`-th rank (RMA-RW); 0 (the
    /// default) puts one on each element of the innermost level (one per node, as the seed
    /// advises in §5.4) and one in all with [`Levels::flat`].
    pub t_dc: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { t_l: vec![16], t_r: 1000, t_dc: 0 }
    }
}

impl Thresholds {
    /// `T_L,i` for each of `n` levels.
    fn locality(&self, n: usize) -> Result<Vec<u64>, Error> {
        let last = *self.t_l.last().ok_or(Error::InvalidArgument("no locality threshold T_L,i given"))?;
        let t: Vec<u64> = (0..n).map(|l| self.t_l.get(l).copied().unwrap_or(last)).collect();
        if t.contains(&0) {
            return Err(Error::InvalidArgument("a locality threshold T_L,i is 0"));
        }
        Ok(t)
    }
}

/// Acquires `q` as a writer, first this rank's local lock.
async fn exclusive<'a, L: Release>(q: &'a Queues, lock: &'a L) -> Result<Guard<'a, L>, Error> {
    let local = q.local.lock().await;
    q.writer_acquire().await?;
    Ok(Guard::new(lock, Mode::Exclusive, Some(local)))
}

/// Acquires `q` as a writer if it is free, without waiting.
fn try_exclusive<'a, L: Release>(q: &'a Queues, lock: &'a L) -> Result<Option<Guard<'a, L>>, Error> {
    let Some(local) = q.local.try_lock() else { return Ok(None) };
    Ok(q.try_writer_acquire()?.then(|| Guard::new(lock, Mode::Exclusive, Some(local))))
}

/// A mutual-exclusion lock over [`Queues`]: `lock`, `lock_async`, `try_lock`, `Release`.
macro_rules! queue_lock {
    ($t:ident, $guard:ident) => {
        impl $t {
            /// Acquires the lock, waiting as long as it takes: until it is passed to this
            /// rank, or a wait fails: with `PeerLost` once a rank of the lock is lost, with
            /// [`LOCK_ENDED`] once a rank ended its part of the lock (dropped it; module
            /// docs, *Ranks that end their part*) and the lock did not come.
            pub fn lock(&self) -> Result<$guard<'_>, Error> {
                block_on(self.lock_async())
            }

            /// Acquires the lock, parking the task (not the thread) while it waits; fails
            /// as [`lock`](Self::lock) does.
            pub async fn lock_async(&self) -> Result<$guard<'_>, Error> {
                exclusive(&self.q, self).await
            }

            /// Acquires the lock if nobody holds it or waits for it: one compare-and-swap
            /// of the tail at each level (`None` when taken).
            pub fn try_lock(&self) -> Result<Option<$guard<'_>>, Error> {
                try_exclusive(&self.q, self)
            }
        }

        impl Release for $t {
            fn release(&self, _: Mode) -> Releasing<'_> {
                Box::pin(self.q.writer_release())
            }
        }

        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_tuple(stringify!($t)).field(&self.q).finish()
            }
        }
    };
}

/// The D-MCS lock [Schmid 2016, §2.4]: ranks that wait form a queue; each spins on a word
/// in its own part of the window, and the holder hands the lock to its successor with one
/// put. Rank `tail_rank` holds the queue's tail. It is [`RmaMcs`] over [`Levels::flat`].
pub struct DMcs {
    q: Queues,
}

impl DMcs {
    /// Creates the lock on every rank of `comm` (collective), its queue tail on
    /// `tail_rank`.
    pub fn new(comm: &Communicator, tail_rank: u32) -> Result<Self, Error> {
        if tail_rank >= comm.size() {
            return Err(Error::RankOutOfRange { rank: tail_rank, size: comm.size() });
        }
        let machine = Levels::flat().resolve(comm)?.with_root_tail(tail_rank);
        Ok(DMcs { q: Queues::new(comm, machine, vec![1], None)? })
    }
}

queue_lock!(DMcs, DMcsGuard);

/// The topology-aware RMA-MCS lock [Schmid 2016, §3.5]: at each level a D-MCS queue per
/// machine element (its tail on the element's first rank). A writer enters the queue of its
/// node, then (unless the lock is passed to it within the node) of its rack, ..., up to the
/// machine's; a release passes the lock within the element at a level while fewer than
/// `T_L,i` passings happened there, else releases the level above first.
pub struct RmaMcs {
    q: Queues,
}

impl RmaMcs {
    /// Creates the lock on every rank of `comm` (collective) over `levels`, with the
    /// locality thresholds of `thresholds` (`T_L,1` is not used: level 1 passes without
    /// limit).
    pub fn new(comm: &Communicator, levels: &Levels, thresholds: &Thresholds) -> Result<Self, Error> {
        let machine = levels.resolve(comm)?;
        let t_l = thresholds.locality(machine.depth())?;
        Ok(RmaMcs { q: Queues::new(comm, machine, t_l, None)? })
    }
}

queue_lock!(RmaMcs, RmaMcsGuard);

/// The topology-aware reader-writer lock RMA-RW [Schmid 2016, §3]: writers climb the tree
/// of queues of [`RmaMcs`] and, at level 1, take the lock from the readers by marking every
/// physical counter WRITE; a reader increments only its counter `c(p)` (on rank
/// `p / T_DC * T_DC`). After `T_W = ∏ T_L,i` writer acquisitions at level 1 the lock goes to
/// the readers; after `T_R` readers at one counter while a writer waits, to the writers.
pub struct RmaRw {
    q: Queues,
}

impl RmaRw {
    /// Creates the lock on every rank of `comm` (collective) over `levels`.
    pub fn new(comm: &Communicator, levels: &Levels, thresholds: &Thresholds) -> Result<Self, Error> {
        let machine = levels.resolve(comm)?;
        let n = machine.depth();
        let t_l = thresholds.locality(n)?;
        if thresholds.t_r == 0 || thresholds.t_r >= u64::MAX / 4 {
            return Err(Error::InvalidArgument("the reader threshold T_R is 0 or too large"));
        }
        let t_dc = match thresholds.t_dc {
            0 if n == 1 => comm.size(),
            0 => machine.leaf_size(),
            t if t > comm.size() => return Err(Error::InvalidArgument("the counter spacing T_DC exceeds the communicator's size")),
            t => t,
        };
        let t_w = t_l.iter().fold(1u64, |a, &t| a.saturating_mul(t));
        let counters = Counters { t_dc, t_r: thresholds.t_r as i64, t_w };
        Ok(RmaRw { q: Queues::new(comm, machine, t_l, Some(counters))? })
    }

    /// Acquires the lock as a reader (Listing 9), waiting as long as it takes (a wait
    /// fails with `PeerLost` once a rank of the lock is lost, with [`LOCK_ENDED`] once a
    /// rank ended its part of the lock; module docs, *Ranks that end their part*).
    pub fn read(&self) -> Result<RmaRwGuard<'_>, Error> {
        block_on(self.read_async())
    }

    /// Acquires the lock as a reader, parking the task (not the thread) while it waits.
    pub async fn read_async(&self) -> Result<RmaRwGuard<'_>, Error> {
        self.q.reader_acquire().await?;
        Ok(Guard::new(self, Mode::Shared, None))
    }

    /// Acquires the lock as a reader if no writer holds it and `T_R` is not reached.
    pub fn try_read(&self) -> Result<Option<RmaRwGuard<'_>>, Error> {
        Ok(self.q.try_reader_acquire()?.then(|| Guard::new(self, Mode::Shared, None)))
    }

    /// Acquires the lock as a writer (Listings 4 and 7), waiting as long as it takes (fails
    /// as [`read`](Self::read) does).
    pub fn write(&self) -> Result<RmaRwGuard<'_>, Error> {
        block_on(self.write_async())
    }

    /// Acquires the lock as a writer, parking the task (not the thread) while it waits.
    pub async fn write_async(&self) -> Result<RmaRwGuard<'_>, Error> {
        exclusive(&self.q, self).await
    }

    /// Acquires the lock as a writer if no writer holds it or waits for it and no reader
    /// holds it.
    pub fn try_write(&self) -> Result<Option<RmaRwGuard<'_>>, Error> {
        try_exclusive(&self.q, self)
    }
}

impl Release for RmaRw {
    fn release(&self, mode: Mode) -> Releasing<'_> {
        match mode {
            Mode::Exclusive => Box::pin(self.q.writer_release()),
            Mode::Shared => Box::pin(self.q.reader_release()),
        }
    }
}

impl std::fmt::Debug for RmaRw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmaRw").field("queues", &self.q).field("counters", &self.q.counters).finish()
    }
}

/// The central word of the foMPI-style locks: word 0 of `home`'s part of the window; where
/// the window signals no writes (libfabric), words 1 and 2 there are its watchers words
/// ([`Wakes`]), and a waiter parks on the wake frame of the word's next change that it
/// needs: word 1 for the waits for the word to fall (the spin lock's, a writer's), word 2
/// for the foMPI-style readers' waits for a writer to leave (a reader's back-off, which a
/// waiting writer needs, wakes no reader).
struct Central {
    window: Window<'static, u64>,
    home: u32,
    wakes: Option<Wakes>,
}

/// The watchers word of a [`Central`] word's waits for it to fall, and its slot.
const WATCHERS: (usize, usize) = (1, 0);
/// The watchers word of the foMPI-style readers' waits for a writer to leave, and its slot.
const READERS_WATCHERS: (usize, usize) = (2, 1);

impl Central {
    /// Checks that `home` is a rank of `comm` and makes the window (collective).
    fn new(comm: &Communicator, home: u32) -> Result<Self, Error> {
        if home >= comm.size() {
            return Err(Error::RankOutOfRange { rank: home, size: comm.size() });
        }
        let window = comm.window(3)?;
        let wakes = Wakes::new(comm, &window)?;
        Ok(Central { window, home, wakes })
    }

    /// Makes `attempt` until it succeeds. Between attempts the waiter spins, yields, then
    /// sleeps up to [`MAX_SLEEP`] (the seed's baselines poll; so they do on the embedded
    /// provider), or, where the window signals no writes, parks until the word changes
    /// (each change's maker wakes the watchers, [`changed`](Self::changed)) or
    /// [`WAKE_CHECK`] ([`WAKE_ALARM`] for a thread) passed. Fails with what `gone` says
    /// after a failed attempt (`gone` and `attempt` see the ends of ranks' parts that this
    /// rank's progress, made before each attempt once the waiter may park, handled).
    /// `(word, slot)`: the watchers word of the changes it needs.
    async fn until(
        &self,
        (word, slot): (usize, usize),
        attempt: impl Fn() -> Result<bool, Error>,
        gone: impl Fn() -> Result<(), Error>,
    ) -> Result<(), Error> {
        let mut backoff = Backoff::new();
        let mut watching = None;
        loop {
            let armed: Option<wait::Armed<'_, 1>> = match &self.wakes {
                Some(w) => w.arm_watched(&self.window, &backoff, &mut watching, (self.home, word, slot))?,
                None => None,
            };
            if backoff.parking() {
                // The notices of ranks that ended their part are messages.
                self.window.progress();
            }
            wait::checked();
            if attempt()? {
                return Ok(());
            }
            gone()?;
            match armed {
                Some(armed) => {
                    armed.wait(&mut backoff).await;
                }
                None => backoff.snooze().await,
            }
        }
    }

    /// An atomic update of the word, then the wake of the ranks watching it in `watchers`
    /// (the watchers words of the waits that need the change).
    fn update(&self, operand: u64, op: Op, watchers: &[(usize, usize)]) -> Result<u64, Error> {
        let old = self.window.fetch_and_op(self.home, 0, operand, op)?;
        if let Some(w) = &self.wakes {
            for &(word, _) in watchers {
                w.notify(&self.window, self.home, word)?;
            }
        }
        Ok(old)
    }
}

/// The foMPI-style spin lock [Schmid 2016, §5] (foMPI-Spin): one word on `home`,
/// acquired by compare-and-swap from "free" to the acquirer, released by an atomic swap
/// back; waiters poll the word with backoff (on libfabric, park until it changes).
pub struct SpinLock {
    c: Central,
    local: LocalLock,
}

impl std::fmt::Debug for SpinLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinLock").field("rank", &self.c.window.rank()).field("home", &self.c.home).finish()
    }
}

impl SpinLock {
    /// Creates the lock on every rank of `comm` (collective), its word on `home`.
    pub fn new(comm: &Communicator, home: u32) -> Result<Self, Error> {
        Ok(SpinLock { c: Central::new(comm, home)?, local: LocalLock::new() })
    }

    /// One compare-and-swap: `true` if it took the word; `PeerLost` if the rank that
    /// holds it is gone, [`LOCK_ENDED`] if it ended its part of the lock (either way it
    /// will never release). The end is known once its notice came, which the holder sent
    /// after its release (if it made one) was complete at the word: a second
    /// compare-and-swap, made after the end was seen, finds the word released then, and
    /// the holder's still only if it never released.
    fn attempt(&self) -> Result<bool, Error> {
        let w = &self.c.window;
        match w.compare_and_swap(self.c.home, 0, 0, node(w.rank()))? {
            0 => Ok(true),
            holder => self.held_by(holder),
        }
    }

    /// [`attempt`](Self::attempt) found the word held by `holder` (out of the acquisition's
    /// fast path).
    #[inline(never)]
    fn held_by(&self, holder: u64) -> Result<bool, Error> {
        let w = &self.c.window;
        let rank = (holder - 1) as u32;
        if w.peer_gone(rank) {
            return Err(Error::PeerLost { rank });
        }
        if !w.has_ended(rank) {
            return Ok(false);
        }
        match w.compare_and_swap(self.c.home, 0, 0, node(w.rank()))? {
            0 => Ok(true),
            again if again == holder => Err(LOCK_ENDED),
            _ => Ok(false),
        }
    }

    /// Acquires the lock, polling until the word is free; fails with `PeerLost` once the
    /// rank holding it is lost, with [`LOCK_ENDED`] once that rank ended its part of the
    /// lock (dropped it) without releasing (module docs, *Ranks that end their part*).
    pub fn lock(&self) -> Result<SpinGuard<'_>, Error> {
        block_on(self.lock_async())
    }

    /// Acquires the lock, parking the task (not the thread) between polls; fails as
    /// [`lock`](Self::lock) does.
    pub async fn lock_async(&self) -> Result<SpinGuard<'_>, Error> {
        let local = self.local.lock().await;
        self.c.until(WATCHERS, || self.attempt(), || Ok(())).await?;
        Ok(Guard::new(self, Mode::Exclusive, Some(local)))
    }

    /// Acquires the lock if it is free (one compare-and-swap).
    pub fn try_lock(&self) -> Result<Option<SpinGuard<'_>>, Error> {
        let Some(local) = self.local.try_lock() else { return Ok(None) };
        Ok(self.attempt()?.then(|| Guard::new(self, Mode::Exclusive, Some(local))))
    }
}

impl Release for SpinLock {
    fn release(&self, _: Mode) -> Releasing<'_> {
        Box::pin(std::future::ready(self.c.update(0, Op::Replace, &[WATCHERS]).map(drop)))
    }
}

/// The writer's mark in a [`FompiRw`] word (the low bits count readers).
const WRITER: u64 = 1 << 62;

/// The foMPI-style reader-writer lock [Schmid 2016, §5] (foMPI-RW): one central counter on
/// `home`. A reader adds 1 and enters unless a writer's mark was set (then takes its 1 back
/// and polls); a writer swaps the word from 0 (no readers, no writer) to its mark by
/// compare-and-swap; each release subtracts what it added. Readers get no priority order:
/// a steady stream of readers can keep a writer out.
pub struct FompiRw {
    c: Central,
}

impl std::fmt::Debug for FompiRw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FompiRw").field("rank", &self.c.window.rank()).field("home", &self.c.home).finish()
    }
}

impl FompiRw {
    /// Creates the lock on every rank of `comm` (collective), its counter on `home`.
    pub fn new(comm: &Communicator, home: u32) -> Result<Self, Error> {
        Ok(FompiRw { c: Central::new(comm, home)? })
    }

    fn read_attempt(&self) -> Result<bool, Error> {
        if self.c.window.fetch_and_op(self.c.home, 0, 1, Op::Sum)? & WRITER == 0 {
            return Ok(true);
        }
        // The back-off is a change a waiting writer may need (a waiting reader does not).
        self.c.update(1u64.wrapping_neg(), Op::Sum, &[WATCHERS])?;
        Ok(false)
    }

    fn write_attempt(&self) -> Result<bool, Error> {
        Ok(self.c.window.compare_and_swap(self.c.home, 0, 0, WRITER)? == 0)
    }

    /// Acquires the lock as a reader, waiting as long as it takes (a wait fails with
    /// `PeerLost` once a rank of the lock is lost, with [`LOCK_ENDED`] once a rank ended
    /// its part of the lock; module docs, *Ranks that end their part*).
    pub fn read(&self) -> Result<FompiRwGuard<'_>, Error> {
        block_on(self.read_async())
    }

    /// Acquires the lock as a reader, parking the task (not the thread) between polls.
    pub async fn read_async(&self) -> Result<FompiRwGuard<'_>, Error> {
        self.poll(Self::read_attempt, Mode::Shared).await
    }

    /// Acquires the lock as a reader if no writer holds it (one attempt).
    pub fn try_read(&self) -> Result<Option<FompiRwGuard<'_>>, Error> {
        Ok(self.read_attempt()?.then(|| Guard::new(self, Mode::Shared, None)))
    }

    /// Acquires the lock as a writer, waiting as long as it takes (fails as
    /// [`read`](Self::read) does).
    pub fn write(&self) -> Result<FompiRwGuard<'_>, Error> {
        block_on(self.write_async())
    }

    /// Acquires the lock as a writer, parking the task (not the thread) between polls.
    pub async fn write_async(&self) -> Result<FompiRwGuard<'_>, Error> {
        self.poll(Self::write_attempt, Mode::Exclusive).await
    }

    /// Acquires the lock as a writer if nobody holds it (one compare-and-swap).
    pub fn try_write(&self) -> Result<Option<FompiRwGuard<'_>>, Error> {
        Ok(self.write_attempt()?.then(|| Guard::new(self, Mode::Exclusive, None)))
    }

    /// `PeerLost` once a rank is gone, [`LOCK_ENDED`] once a rank ended its part before an
    /// attempt that failed: the word does not say whether that rank held the lock. (Its
    /// release, if it made one, was complete at the word before its notice of the end
    /// left it: an attempt after the notice came finds it.)
    async fn poll(&self, attempt: fn(&Self) -> Result<bool, Error>, mode: Mode) -> Result<FompiRwGuard<'_>, Error> {
        let ended = std::sync::atomic::AtomicBool::new(false);
        let gone = || match self.c.window.lost_peer() {
            Some(rank) => Err(Error::PeerLost { rank }),
            None if ended.load(std::sync::atomic::Ordering::Relaxed) => Err(LOCK_ENDED),
            None => Ok(()),
        };
        let watch = if mode == Mode::Shared { READERS_WATCHERS } else { WATCHERS };
        let attempt = || {
            // Before the attempt: a rank that ended its part did so after its release.
            ended.store(self.c.window.ended_peer().is_some(), std::sync::atomic::Ordering::Relaxed);
            attempt(self)
        };
        self.c.until(watch, attempt, gone).await?;
        Ok(Guard::new(self, mode, None))
    }
}

impl Release for FompiRw {
    fn release(&self, mode: Mode) -> Releasing<'_> {
        // A reader's leaving matters to the writers; a writer's to the readers as well.
        let (added, watchers): (u64, &[_]) = if mode == Mode::Shared { (1, &[WATCHERS]) } else { (WRITER, &[WATCHERS, READERS_WATCHERS]) };
        Box::pin(std::future::ready(self.c.update(added.wrapping_neg(), Op::Sum, watchers).map(drop)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use super::wait::{waits_here, Waits};
    use super::*;
    #[cfg(feature = "ofi")]
    use crate::rendezvous_faults::common::within;
    use crate::Runtime;

    /// How long the holder keeps the lock while the other rank waits.
    const HOLD: Duration = Duration::from_millis(40);

    /// Rank 1 takes the lock with `take`, rank 0 then waits for it with `wait` (on its own
    /// thread, or as a task of a one-thread tokio runtime) while rank 1 holds it for
    /// [`HOLD`]; returns rank 0's waits and how long it waited. On the embedded provider.
    fn hand_off<L: Release + Send>(
        make: impl Fn(&Communicator) -> L + Sync,
        take: impl Fn(&L) -> Guard<'_, L> + Sync,
        wait: impl Fn(&L) -> Guard<'_, L> + Sync,
    ) -> (Waits, Duration) {
        hand_off_on(crate::Provider::Embedded, make, take, wait)
    }

    /// [`hand_off`] on `provider`.
    fn hand_off_on<L: Release + Send>(
        provider: crate::Provider,
        make: impl Fn(&Communicator) -> L + Sync,
        take: impl Fn(&L) -> Guard<'_, L> + Sync,
        wait: impl Fn(&L) -> Guard<'_, L> + Sync,
    ) -> (Waits, Duration) {
        holder_and_waiter(
            provider,
            make,
            take,
            || std::thread::sleep(HOLD),
            |lock| {
                let t = Instant::now();
                wait(lock).unlock().unwrap();
                t.elapsed()
            },
        )
    }

    /// Ranks 0 and 1 of `provider` make a lock with `make`; rank 1 takes it with `take`,
    /// rank 0 then runs `waiter` on it while rank 1 holds it until `hold` returns. Returns
    /// rank 0's waits in `waiter` and what it gave.
    fn holder_and_waiter<L: Release + Send, R: Send>(
        provider: crate::Provider,
        make: impl Fn(&Communicator) -> L + Sync,
        take: impl Fn(&L) -> Guard<'_, L> + Sync,
        hold: impl FnOnce(),
        waiter: impl Fn(&L) -> R + Sync,
    ) -> (Waits, R) {
        let rts = Runtime::builder().env(false).provider(provider).cris(1).build_local(2).unwrap();
        let (held_tx, held_rx) = mpsc::channel();
        std::thread::scope(|s| {
            let (make, waiter, rts) = (&make, &waiter, &rts);
            let rank0 = s.spawn(move || {
                let c = rts[0].world();
                let lock = make(c);
                c.barrier().unwrap();
                held_rx.recv().unwrap();
                let before = waits_here();
                let out = waiter(&lock);
                let waits = waits_here().since(before);
                c.barrier().unwrap();
                (waits, out)
            });
            let c = rts[1].world();
            let lock = make(c);
            c.barrier().unwrap();
            let g = take(&lock);
            held_tx.send(()).unwrap();
            hold();
            g.unlock().unwrap();
            c.barrier().unwrap();
            rank0.join().unwrap()
        })
    }

    /// A rank waiting in a queue lock (D-MCS, RMA-MCS, an RMA-RW writer behind a writer, an
    /// RMA-RW reader behind a writer) parks on its word and is woken by the hand-off: on the
    /// embedded provider it never sleeps in the backoff, and parks a few times at most,
    /// however long the holder keeps the lock (a polling waiter sleeps hundreds of times in
    /// [`HOLD`]).
    #[test]
    fn a_queued_waiter_parks_and_is_woken_by_the_hand_off() {
        let check = |what: &str, (w, waited): (Waits, Duration)| {
            assert_eq!(w.sleeps, 0, "{what}: the waiter slept in the backoff ({w:?}, waited {waited:?})");
            assert!(w.parks <= 4, "{what}: the waiter woke for nothing ({w:?})");
        };
        let t = Thresholds::default();
        check("D-MCS", hand_off(|c| DMcs::new(c, 1).unwrap(), |l| l.lock().unwrap(), |l| l.lock().unwrap()));
        let nodes = Levels::simulated(&[1]);
        check("RMA-MCS", hand_off(|c| RmaMcs::new(c, &nodes, &t).unwrap(), |l| l.lock().unwrap(), |l| l.lock().unwrap()));
        check("RMA-RW writer", hand_off(|c| RmaRw::new(c, &nodes, &t).unwrap(), |l| l.write().unwrap(), |l| l.write().unwrap()));
        check("RMA-RW reader", hand_off(|c| RmaRw::new(c, &nodes, &t).unwrap(), |l| l.write().unwrap(), |l| l.read().unwrap()));
        // A task: its thread runs a one-thread tokio runtime; no timer sleep is begun.
        fn in_task(l: &DMcs) -> DMcsGuard<'_> {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(l.lock_async()).unwrap()
        }
        check("D-MCS, a task", hand_off(|c| DMcs::new(c, 1).unwrap(), |l| l.lock().unwrap(), in_task));
    }

    /// On libfabric (`shm`), where a peer's write raises no event, a waiting thread parks on
    /// a wake frame: it never sleeps in the backoff, is woken by the frame, and parks a few
    /// times at most (its alarm comes every [`wait::WAKE_ALARM`]); a polling waiter sleeps
    /// hundreds of times in [`HOLD`]. A queued writer behind a writer (the hand-off's frame
    /// to it), a reader behind a writer (the writer's reset of the counter wakes its
    /// watchers), the spin lock and the foMPI-style reader-writer lock (each change of the
    /// word wakes its watchers). A task parks, checking its word every
    /// [`wait::WAKE_CHECK`] as well (the frame or the check ends each park, whichever comes
    /// first).
    #[cfg(feature = "ofi")]
    #[test]
    fn a_waiter_across_libfabric_is_woken_by_a_wake_frame() {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
        // A waiter whose first polls outlasted the hold (a loaded machine) never parked: the
        // hand-off is tried again, up to three times, until it parks.
        let check = |what: &str, run: &dyn Fn() -> (Waits, Duration)| {
            let (w, waited) = (0..3).map(|_| run()).find(|(w, _)| w.parks > 0).unwrap_or_else(run);
            assert_eq!(w.sleeps, 0, "{what}: the waiter slept in the backoff ({w:?}, waited {waited:?})");
            assert!(w.wakes >= 1, "{what}: no wake frame ended a park ({w:?}, waited {waited:?})");
            assert!(w.parks <= 4, "{what}: the waiter woke for nothing ({w:?})");
        };
        let shm = crate::Provider::Shm;
        let t = Thresholds::default();
        check("D-MCS", &|| hand_off_on(shm, |c| DMcs::new(c, 1).unwrap(), |l| l.lock().unwrap(), |l| l.lock().unwrap()));
        let nodes = Levels::simulated(&[1]);
        check("RMA-RW writer", &|| {
            hand_off_on(shm, |c| RmaRw::new(c, &nodes, &t).unwrap(), |l| l.write().unwrap(), |l| l.write().unwrap())
        });
        check("RMA-RW reader", &|| hand_off_on(shm, |c| RmaRw::new(c, &nodes, &t).unwrap(), |l| l.write().unwrap(), |l| l.read().unwrap()));
        check("spin", &|| hand_off_on(shm, |c| SpinLock::new(c, 1).unwrap(), |l| l.lock().unwrap(), |l| l.lock().unwrap()));
        check("foMPI-RW", &|| hand_off_on(shm, |c| FompiRw::new(c, 1).unwrap(), |l| l.read().unwrap(), |l| l.write().unwrap()));
        fn in_task(l: &RmaMcs) -> RmaMcsGuard<'_> {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(l.lock_async()).unwrap()
        }
        let run = || hand_off_on(shm, |c| RmaMcs::new(c, &nodes, &t).unwrap(), |l| l.lock().unwrap(), in_task);
        let (w, waited) = (0..3).map(|_| run()).find(|(w, _)| w.parks > 0).unwrap_or_else(run);
        let most = (HOLD.as_micros() / wait::WAKE_CHECK.as_micros()) as u64 + 4;
        assert_eq!(w.sleeps, 0, "RMA-MCS, a task: it slept in the backoff ({w:?}, waited {waited:?})");
        assert!((1..=most).contains(&w.parks), "RMA-MCS, a task: {w:?}");
    }

    /// A task parked on a wake frame while its rank serves other ranks' traffic (here the
    /// holder's gets of a word at the task's rank and its messages to it, for [`HOLD`])
    /// parks after one pass: it does not poll on for as long as the traffic lasts (which
    /// took the cores from the processes it waited for), neither by passes of its own nor
    /// inside its receive's poll (whose passes count as progress while the rank saw traffic
    /// in the last milliseconds); the rank's stand-in serves the traffic and the hand-off,
    /// whose frame wakes the task. The task's own passes while parked are its checks.
    #[cfg(feature = "ofi")]
    #[test]
    fn a_task_waiting_for_a_frame_does_not_poll_while_its_rank_is_busy() {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
        let run = || {
            within(60, "a task waiting while its rank is busy", || {
                let rts = Runtime::builder().env(false).provider(crate::Provider::Shm).cris(1).build_local(2).unwrap();
                let (held_tx, held_rx) = mpsc::channel();
                std::thread::scope(|s| {
                    let rts = &rts;
                    let rank0 = s.spawn(move || {
                        let c = rts[0].world();
                        let lock = DMcs::new(c, 1).unwrap();
                        let w: crate::rma::Window<'_, u64> = c.window(1).unwrap();
                        c.barrier().unwrap();
                        held_rx.recv().unwrap();
                        let before = waits_here();
                        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
                        rt.block_on(async { lock.lock_async().await.unwrap().unlock_async().await.unwrap() });
                        let waits = waits_here().since(before);
                        c.barrier().unwrap();
                        drop(w);
                        waits
                    });
                    let c = rts[1].world();
                    let lock = DMcs::new(c, 1).unwrap();
                    let w: crate::rma::Window<'_, u64> = c.window(1).unwrap();
                    c.barrier().unwrap();
                    let g = lock.lock().unwrap();
                    held_tx.send(()).unwrap();
                    let start = Instant::now();
                    let mut sent = 0u64;
                    while start.elapsed() < HOLD {
                        w.get(0, 0, &mut [0]).unwrap();
                        // A message every 200 µs or so (fewer than its inbox holds): frames the
                        // task's rank takes in.
                        if start.elapsed().as_micros() as u64 / 200 > sent {
                            c.send_slice(&[0u8], 0, 7).unwrap();
                            sent += 1;
                        }
                    }
                    g.unlock().unwrap();
                    c.barrier().unwrap();
                    rank0.join().unwrap()
                })
            })
        };
        // Whether the hand-off's frame or the task's own check ends the park is timing (the
        // hand-off may land while the task checks its word, more often the busier the
        // machine): `queues::tests::a_hand_off_waits_for_no_progress_of_the_parked_successor`
        // shows the frame's part deterministically.
        let waits = run();
        assert!(waits.parks >= 1, "the task never parked: {waits:?}");
        assert!(waits.passes < 40, "the task polled on while its rank was busy: {waits:?}");
    }

    /// 10,000 tasks of rank 0 read a lock made with `make` whose writer (`write`) is rank 1,
    /// on `shm` (one thread, a one-thread tokio runtime), each with `read`; returns rank
    /// 0's waits and the acquisitions. Rank 1 lets the lock go once every task parked, or
    /// checked 3 times (they poll), or after 60 s, and [`HOLD`] later.
    #[cfg(feature = "ofi")]
    fn ten_thousand_readers<L: Release + Send>(
        make: impl Fn(&Communicator) -> L + Sync,
        write: impl for<'a> Fn(&'a L) -> Guard<'a, L> + Sync,
        read: impl for<'a> Fn(&'a L) -> Pin<Box<dyn Future<Output = Guard<'a, L>> + 'a>> + Sync,
    ) -> (Waits, u64) {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
        let (parked_tx, parked_rx) = mpsc::channel();
        let hold = || {
            parked_rx.recv().unwrap();
            // Held on while they wait: the leader's checks come every WAKE_CHECK.
            std::thread::sleep(HOLD);
        };
        holder_and_waiter(crate::Provider::Shm, make, write, hold, |lock| {
            let before = waits_here();
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let acquired = std::sync::atomic::AtomicU64::new(0);
            rt.block_on(async {
                let readers = futures::future::join_all((0..TASKS).map(|_| async {
                    read(lock).await.unlock_async().await.unwrap();
                    acquired.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }));
                let watch = async {
                    let start = Instant::now();
                    loop {
                        let w = waits_here().since(before);
                        if w.parks >= TASKS || w.checks >= 3 * TASKS || start.elapsed() > Duration::from_secs(60) {
                            parked_tx.send(()).unwrap();
                            return;
                        }
                        wait::Sleep::new(Duration::from_millis(1)).await;
                    }
                };
                futures::join!(readers, watch);
            });
            acquired.into_inner()
        })
    }

    /// Tasks in [`ten_thousand_readers`].
    #[cfg(feature = "ofi")]
    const TASKS: u64 = 10_000;

    /// [`ten_thousand_readers`] parked instead of polling the word: each task checked it
    /// once before it parked and once when the writer's release woke them, the leader a
    /// few times more (a polling task checks it again and again for as long as the writer
    /// holds); all of them acquired.
    #[cfg(feature = "ofi")]
    fn parked_all_along(what: &str, (waits, acquired): (Waits, u64)) {
        assert_eq!(acquired, TASKS, "{what}");
        assert_eq!(waits.sleeps, 0, "{what}: tasks slept in the backoff: {waits:?}");
        assert!(waits.parks >= TASKS, "{what}: tasks did not park: {waits:?}");
        let most = 2 * TASKS + 64 + (HOLD.as_micros() / wait::WAKE_CHECK.as_micros()) as u64;
        assert!(waits.checks <= most, "{what}: tasks polled the word: {waits:?}, at most {most} checks");
    }

    /// [`ten_thousand_readers`] of the reader-writer lock `$make` makes (`write`,
    /// `read_async`), bounded in time; then [`parked_all_along`].
    #[cfg(feature = "ofi")]
    macro_rules! readers_park {
        ($what:expr, $make:expr) => {{
            let run = within(60, $what, || {
                ten_thousand_readers($make, |l| l.write().unwrap(), |l| Box::pin(async move { l.read_async().await.unwrap() }))
            });
            parked_all_along($what, run);
        }};
    }

    /// 10,000 reader tasks of one rank behind another rank's writer of an RMA-RW wait on
    /// libfabric without polling its counter ([`parked_all_along`]): one of them leads on
    /// the wake frame's receive, the others park on it.
    #[cfg(feature = "ofi")]
    #[test]
    fn ten_thousand_tasks_wait_for_a_lock_without_polling() {
        // `T_R` past the readers: none of them resets the counter.
        readers_park!("10,000 RMA-RW reader tasks", |c| {
            RmaRw::new(c, &Levels::flat(), &Thresholds { t_r: 1 << 40, ..Thresholds::default() }).unwrap()
        });
    }

    /// As [`ten_thousand_tasks_wait_for_a_lock_without_polling`], the foMPI-style
    /// reader-writer lock: a reader's back-off (each reader adds 1, finds the writer, takes
    /// it back) wakes the writers only; a wake of the readers by each back-off would make
    /// every parked reader try again, back off and wake them all again, without end.
    #[cfg(feature = "ofi")]
    #[test]
    fn ten_thousand_fompi_readers_wait_without_polling() {
        readers_park!("10,000 foMPI-RW reader tasks", |c| FompiRw::new(c, 1).unwrap());
    }

    /// Wake frames nobody needs (sent for a hand-off its waiter saw while it spun, or to a
    /// rank whose waiter left meanwhile) are consumed: after 2 ranks of 2 threads took a
    /// D-MCS and an RMA-RW 100 times each on `shm`, a few at most are queued at a rank.
    #[cfg(feature = "ofi")]
    #[test]
    fn unclaimed_wake_frames_do_not_pile_up() {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
        let rts = Runtime::builder().env(false).provider(crate::Provider::Shm).cris(1).build_local(2).unwrap();
        let queued: Vec<(usize, usize)> = std::thread::scope(|s| {
            let ranks: Vec<_> = rts
                .iter()
                .map(|rt| {
                    s.spawn(move || {
                        let c = rt.world();
                        let mcs = DMcs::new(c, 0).unwrap();
                        let rw = RmaRw::new(c, &Levels::simulated(&[1]), &Thresholds::default()).unwrap();
                        c.barrier().unwrap();
                        std::thread::scope(|s| {
                            for _ in 0..2 {
                                s.spawn(|| {
                                    for i in 0..50 {
                                        drop(mcs.lock().unwrap());
                                        if i % 4 == 0 {
                                            drop(rw.write().unwrap());
                                        } else {
                                            drop(rw.read().unwrap());
                                        }
                                    }
                                });
                            }
                        });
                        c.barrier().unwrap();
                        // Frames sent before the barrier have arrived by now.
                        std::thread::sleep(Duration::from_millis(20));
                        let queued = (mcs.q.take_queued_wakes(), rw.q.take_queued_wakes());
                        c.barrier().unwrap();
                        queued
                    })
                })
                .collect();
            ranks.into_iter().map(|r| r.join().unwrap()).collect()
        });
        for (rank, &(mcs, rw)) in queued.iter().enumerate() {
            assert!(mcs <= 4 && rw <= 6, "rank {rank}: {mcs} D-MCS and {rw} RMA-RW wake frames queued");
        }
    }
}
