//! Lock protocols for the communication path ([Amer 2019], Amer et al., *Lock Contention
//! Management in Multithreaded MPI*).
//!
//! weft protects each communication path (progress, a CRI, a matching queue) with a lock whose
//! protocol is chosen per path at start-up. [Amer 2019, §3.4] shows that no single protocol suits
//! every path: a high-throughput protocol (HMCS) helps the main path, where every acquisition
//! issues an operation, but hurts the progress path, where most acquisitions only poll
//! (*unproductive* acquisitions, §3.2). The two-level priority lock of §4.1 ([`Priority`],
//! Fig. 5) combines one protocol per class.
//!
//! # The pieces
//!
//! | item | what it is |
//! |---|---|
//! | [`RawLock`] | the protocol trait: `lock`, `try_lock`, `unsafe unlock`, one *node* per acquisition |
//! | [`RawTimedLock`] | `try_lock_for(Duration)`: give up after a timeout ([Amer 2019, §6.2]) |
//! | [`RawPriorityLock`] | `lock_high` / `lock_low` (plain `lock` for flat protocols) |
//! | [`Mutex`] | the one safe mutex over any [`RawLock`]: closure API and RAII guard |
//! | [`Tas`], [`Ticket`], [`Mcs`], [`Clh`], [`Hmcs`] | the flat protocols of [Amer 2019, §2.3] |
//! | [`TasPark`] | test-and-set released by a plain store, whose waiters sleep (the CRI and matching paths' default) |
//! | [`Priority`] | TLP, [Amer 2019, Fig. 5], named `P-X-Y` (`p-hmcs-mcs`, `p-mcs-mcs`, ...) |
//! | [`StdLock`], [`ParkingLot`] | `std::sync::Mutex` and `parking_lot` as raw locks (baselines) |
//! | [`LockKind`], [`DynLock`] | a protocol by name (`"p-hmcs-mcs"`, `WEFT_LOCK_PROGRESS`), chosen at run time |
//! | [`Counted`], [`LockStats`] | optional per-path counters (acquisitions, contention, productivity) |
//!
//! # Nodes
//!
//! Queue locks (MCS, CLH, HMCS) link one *node* per waiting acquirer into the lock's queue;
//! other threads write into that node while it is queued, so it must stay at one address
//! until the matching `unlock` returns. [`RawLock::Node`] is that node (`()` for TAS and
//! ticket). The trait takes it as `Pin<&Node>`: node types are `!Unpin`, so a pinned node
//! cannot move, and Rust's drop guarantee for pinned values means its memory is not reused
//! before its `Drop` runs. A node's `Drop` aborts the process if the node is still in a lock
//! (the only way to get there is to leak a guard or skip `unlock`), and `lock` panics if the
//! node is already in use. Together this keeps `lock`/`try_lock` safe to call; only `unlock`
//! is `unsafe`, as in `lock_api`.
//!
//! [`Mutex::with_lock`] puts the node on its own stack frame; [`Mutex::lock_with`] takes a node
//! pinned by the caller (`std::pin::pin!`) so that a thread can reuse one node for many
//! acquisitions.
//!
//! # Example
//!
//! ```
//! use weft::lock::{Mcs, Mutex, LockKind, DynLock};
//!
//! let m: Mutex<Mcs, u64> = Mutex::new(0);
//! std::thread::scope(|s| {
//!     for _ in 0..4 {
//!         s.spawn(|| for _ in 0..100 { m.with_lock(|v| *v += 1) });
//!     }
//! });
//! assert_eq!(m.with_lock(|v| *v), 400);
//!
//! // A protocol chosen by name, as the runtime does per path.
//! let kind: LockKind = "p-hmcs-mcs".parse().unwrap();
//! let progress: Mutex<DynLock, Vec<u32>> = Mutex::with_raw(DynLock::new(kind), Vec::new());
//! progress.with_lock(|q| q.push(1)); // high priority (main path)
//! progress.with_lock_low(|q| q.push(2)); // low priority (progress path)
//! assert_eq!(progress.with_lock(|q| q.len()), 2);
//! ```

use std::pin::Pin;
use std::time::Duration;

mod baseline;
mod clh;
mod dynlock;
mod hmcs;
mod mcs;
mod mutex;
pub(crate) mod owner;
pub(crate) mod path;
mod priority;
mod spin;
mod stats;
mod tas;
mod tas_park;
mod ticket;
mod topology;

pub use baseline::{ParkingLot, StdLock, StdNode};
pub use clh::{Clh, ClhNode};
pub use dynlock::{DynLock, DynNode, FlatKind, LockKind, LockOptions, LockPath, ParseLockKindError};
pub use hmcs::{Hmcs, DEFAULT_HMCS_THRESHOLD};
pub use mcs::{Mcs, McsNode};
pub use mutex::{Mutex, MutexGuard};
pub use priority::{Priority, PriorityNode};
pub use stats::{Acquisition, Counted, CountedNode, LockStats, LockStatsSnapshot};
pub use tas::Tas;
pub use tas_park::TasPark;
pub use ticket::Ticket;
pub use topology::{allowed_cpus, bind_thread_to_cpu, bind_to_cpu, Topology};

/// A mutual-exclusion protocol, in the style of `lock_api::RawMutex`, whose acquirers may
/// carry a per-acquisition [`Node`](RawLock::Node).
///
/// `lock` and `try_lock` are safe: the node is pinned and checked (see the module docs,
/// *Nodes*). Releasing is `unsafe` because only the holder may do it.
///
/// # Safety
///
/// An implementation must guarantee mutual exclusion: between a successful `lock`/`try_lock`
/// and the matching `unlock`, no other `lock`/`try_lock` on the same lock succeeds. A
/// successful acquisition must synchronize-with (Acquire) the previous `unlock` (Release), so
/// that data protected by the lock is race-free. After `unlock` returns, the lock must no longer
/// access the node passed to it, and `Node`'s `Drop` must not return while the node is still
/// referenced by the lock (it may abort).
pub unsafe trait RawLock: Send + Sync {
    /// Per-acquisition state: the queue node of MCS/CLH/HMCS, `()` for TAS and ticket.
    type Node: Default;

    /// Acquires the lock, waiting as long as needed.
    ///
    /// # Panics
    ///
    /// If `node` is already in use by another acquisition.
    fn lock(&self, node: Pin<&Self::Node>);

    /// Acquires the lock if that needs no waiting; `true` on success.
    ///
    /// # Panics
    ///
    /// If `node` is already in use by another acquisition.
    fn try_lock(&self, node: Pin<&Self::Node>) -> bool;

    /// Releases the lock.
    ///
    /// # Safety
    ///
    /// The caller holds this lock, acquired through `lock`/`try_lock` (or a
    /// [`RawPriorityLock`]/[`RawTimedLock`] method of the same class) with this same `node`,
    /// and has not released it yet.
    unsafe fn unlock(&self, node: Pin<&Self::Node>);

    /// [Amer 2019, Fig. 5] `nowaiters_high_p`: called by the holder (with the node it acquired
    /// with), `false` means some thread is queued and *will* be handed the lock; `true` means
    /// no waiter was seen. `true` may be wrong (a waiter may be arriving: a "true negative" in
    /// the seed's words) but `false` never is: [`Priority`] keeps its filter closed on `false`
    /// and a wrong `false` would block low-priority threads forever. The default, `true`,
    /// is always allowed.
    #[inline]
    fn no_waiters(&self, node: Pin<&Self::Node>) -> bool {
        let _ = node;
        true
    }
}

/// A lock with an acquisition that gives up after a timeout ([Amer 2019, §6.2]: a non-blocking
/// progress call should return to the application rather than wait for the lock).
///
/// Which protocols implement it, and how:
///
/// | protocol | `try_lock_for` |
/// |---|---|
/// | [`Tas`] | spin with backoff until the deadline: TAS waiters hold no place, so leaving is free |
/// | [`TasPark`] | as [`Tas`] (a bounded wait does not sleep) |
/// | [`Ticket`] | poll `try_lock` (a ticket, once drawn, cannot be given back: leaving would stall every later ticket) |
/// | [`Mcs`], [`Clh`], [`Hmcs`] | poll `try_lock`: succeeds only when the queue is empty |
/// | [`Priority`] | poll the high-priority `try_lock` |
/// | [`ParkingLot`] | parking_lot's own timed lock (parks) |
/// | [`StdLock`] | poll `try_lock` |
///
/// A queue lock cannot simply "stop waiting": its node is linked into the queue, the
/// predecessor will write into it and a successor may already be spinning behind it. Leaving
/// needs an *abortable* variant of the protocol (Scott's MCS-try/CLH-try, or A-HMCS, [Amer 2019]
/// ref. \[10\]) in which a leaving waiter unlinks itself. weft does not implement those yet; the
/// polling version here is sound but does not keep a place in the queue, so under steady
/// contention it can time out even though the lock is being passed around.
///
/// # Safety
///
/// A `true` return means the lock is held exactly as after [`RawLock::lock`] with `node`.
pub unsafe trait RawTimedLock: RawLock {
    /// Tries to acquire the lock until `timeout` has elapsed; `true` if acquired.
    ///
    /// A timeout too long for a deadline to be represented (`Duration::MAX`) waits until the
    /// lock is acquired, as `lock` would.
    fn try_lock_for(&self, node: Pin<&Self::Node>, timeout: Duration) -> bool;
}

/// The two classes of [Amer 2019, §4.1]: high priority for the main path (issuing operations),
/// low priority for the progress path (polling). Flat protocols implement both as plain
/// `lock`.
///
/// # Safety
///
/// `lock_high`/`try_lock_high`/`lock_low`/`try_lock_low` all exclude each other (one holder
/// at a time across both classes) with the same synchronization as [`RawLock`]. For flat
/// protocols the high methods are exactly the [`RawLock`] ones.
pub unsafe trait RawPriorityLock: RawLock {
    /// Acquires with high priority (main path). Same as [`RawLock::lock`].
    #[inline]
    fn lock_high(&self, node: Pin<&Self::Node>) {
        self.lock(node)
    }

    /// Tries to acquire with high priority without waiting.
    #[inline]
    fn try_lock_high(&self, node: Pin<&Self::Node>) -> bool {
        self.try_lock(node)
    }

    /// Releases a high-priority acquisition.
    ///
    /// # Safety
    ///
    /// As [`RawLock::unlock`], for an acquisition made by `lock_high`/`try_lock_high`.
    #[inline]
    unsafe fn unlock_high(&self, node: Pin<&Self::Node>) {
        // SAFETY: forwarded contract: the caller holds the lock with `node`.
        unsafe { self.unlock(node) }
    }

    /// Acquires with low priority (progress path): waits while high-priority threads are
    /// queued.
    fn lock_low(&self, node: Pin<&Self::Node>);

    /// Tries to acquire with low priority without waiting.
    fn try_lock_low(&self, node: Pin<&Self::Node>) -> bool;

    /// Releases a low-priority acquisition.
    ///
    /// # Safety
    ///
    /// As [`RawLock::unlock`], for an acquisition made by `lock_low`/`try_lock_low`.
    unsafe fn unlock_low(&self, node: Pin<&Self::Node>);
}

/// Implements [`RawPriorityLock`] for a flat protocol: low priority is plain `lock`.
macro_rules! flat_priority {
    ($($t:ty),*) => {$(
        // SAFETY: both classes are the protocol's own `lock`/`unlock`, which exclude each
        // other by the `RawLock` contract of the protocol.
        unsafe impl $crate::lock::RawPriorityLock for $t {
            #[inline]
            fn lock_low(&self, node: ::std::pin::Pin<&Self::Node>) {
                $crate::lock::RawLock::lock(self, node)
            }
            #[inline]
            fn try_lock_low(&self, node: ::std::pin::Pin<&Self::Node>) -> bool {
                $crate::lock::RawLock::try_lock(self, node)
            }
            #[inline]
            unsafe fn unlock_low(&self, node: ::std::pin::Pin<&Self::Node>) {
                // SAFETY: forwarded contract: the caller holds the lock with `node`.
                unsafe { $crate::lock::RawLock::unlock(self, node) }
            }
        }
    )*};
}
pub(crate) use flat_priority;

/// Polls `try_lock` with backoff until it succeeds or `timeout` elapses: the sound
/// `try_lock_for` of a protocol whose waiters cannot leave (see [`RawTimedLock`]).
pub(crate) fn poll_try_lock_for<L: RawLock + ?Sized>(lock: &L, node: Pin<&L::Node>, timeout: Duration) -> bool {
    if lock.try_lock(node) {
        return true;
    }
    let deadline = deadline_after(timeout);
    let spin = spin::SpinWait::new();
    loop {
        spin.wait();
        if lock.try_lock(node) {
            return true;
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return false;
        }
    }
}

/// The instant `timeout` from now, or `None` when that is past what `Instant` can represent
/// (`Duration::MAX`, say): a timeout that long is no deadline at all, and `Instant + Duration`
/// would panic on it.
pub(crate) fn deadline_after(timeout: Duration) -> Option<std::time::Instant> {
    std::time::Instant::now().checked_add(timeout)
}

/// Marks a node in use; panics if it already is (one node, one acquisition at a time).
#[inline]
pub(crate) fn claim(busy: &std::cell::Cell<bool>) {
    if busy.replace(true) {
        node_in_use();
    }
}

#[cold]
#[inline(never)]
fn node_in_use() -> ! {
    panic!("weft::lock: a lock node was passed to a second acquisition while still in use")
}

/// Called from a node's `Drop` when the node is still linked into a lock: other threads may
/// still write into it, so the only sound reaction is to stop the process.
#[cold]
#[inline(never)]
pub(crate) fn dropped_in_use() -> ! {
    eprintln!("weft::lock: a lock node was dropped while still in a lock (leaked guard?); aborting");
    std::process::abort()
}
