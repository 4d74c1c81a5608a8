//! Distributed locks over one-sided windows ([`crate::rma`]): the seed's D-MCS queue lock
//! [Schmid 2016, Listings 2-3] and the foMPI-style spin lock it is compared with
//! [Schmid 2016, §5] (one word, compare-and-swap).
//!
//! Both are collective to create (each allocates a window on every rank of the
//! communicator) and mutual exclusion holds between ranks and between the threads of one
//! rank: a rank takes part in the distributed protocol with one thread at a time (a local
//! mutex orders its threads first, since the protocol keeps one queue node per rank).
//!
//! A waiting rank polls with backoff (spinning a little, then yielding, then sleeping up to
//! [`MAX_SLEEP`]), so many waiting ranks in one process leave the cores to the holder; each
//! poll is a one-sided get or atomic, which on libfabric also makes the transport's
//! progress, so the waiter's own window keeps being served.

use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use weft_sync::Error;

use crate::comm::Communicator;
use crate::rma::{Op, Window};

/// The longest a waiting rank sleeps between two polls.
pub const MAX_SLEEP: Duration = Duration::from_micros(100);

/// Polls with backoff: spins, then yields, then sleeps (doubling up to [`MAX_SLEEP`]).
struct Backoff(u32);

impl Backoff {
    fn snooze(&mut self) {
        self.0 += 1;
        match self.0 {
            0..=8 => std::hint::spin_loop(),
            9..=24 => std::thread::yield_now(),
            n => std::thread::sleep(Duration::from_micros(1 << (n - 24).min(7)).min(MAX_SLEEP)),
        }
    }
}

/// `rank + 1`: the encoding of a rank in a lock word (0 is "nobody", the paper's `∅`).
fn node(rank: u32) -> u64 {
    u64::from(rank) + 1
}

mod sealed {
    /// A distributed lock's release (what a [`Guard`](super::Guard) calls).
    pub trait Release {
        /// Releases the lock this rank holds.
        fn release(&self) -> Result<(), weft_sync::Error>;
    }
}
use sealed::Release;

/// Holds a distributed lock and this rank's local mutex of it; releases both when dropped
/// (or by [`unlock`](Self::unlock), which reports a failure: a lost successor, say).
#[must_use = "the lock is released when the guard is dropped"]
pub struct Guard<'a, L: Release> {
    lock: &'a L,
    _local: MutexGuard<'a, ()>,
    held: bool,
}

/// Holds a [`DMcs`].
pub type DMcsGuard<'a> = Guard<'a, DMcs>;

/// Holds a [`SpinLock`].
pub type SpinGuard<'a> = Guard<'a, SpinLock>;

impl<'a, L: Release> Guard<'a, L> {
    fn new(lock: &'a L, local: MutexGuard<'a, ()>) -> Self {
        Guard { lock, _local: local, held: true }
    }

    /// Releases the lock, reporting a failure.
    pub fn unlock(mut self) -> Result<(), Error> {
        self.held = false;
        self.lock.release()
    }
}

impl<L: Release + std::fmt::Debug> std::fmt::Debug for Guard<'_, L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("lock", self.lock).finish()
    }
}

impl<L: Release> Drop for Guard<'_, L> {
    fn drop(&mut self) {
        if self.held {
            // A failure here has no one to report it to; `unlock` reports it.
            let _ = self.lock.release();
        }
    }
}

/// Offsets of D-MCS's variables in each rank's part of its window [Schmid 2016, §2.4.1].
const NEXT: usize = 0;
const WAIT: usize = 1;
const TAIL: usize = 2;

/// The D-MCS lock [Schmid 2016, §2.4]: ranks that wait form a queue; each spins on a flag
/// in its own part of the window, and the holder hands the lock to its successor with one
/// put. Rank `tail_rank` holds the queue's tail.
pub struct DMcs {
    window: Window<'static, u64>,
    tail_rank: u32,
    local: Mutex<()>,
}

impl std::fmt::Debug for DMcs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DMcs").field("rank", &self.window.rank()).field("tail_rank", &self.tail_rank).finish()
    }
}

impl DMcs {
    /// Creates the lock on every rank of `comm` (collective), its queue tail on
    /// `tail_rank`.
    pub fn new(comm: &Communicator, tail_rank: u32) -> Result<Self, Error> {
        if tail_rank >= comm.size() {
            return Err(Error::RankOutOfRange { rank: tail_rank, size: comm.size() });
        }
        Ok(DMcs { window: comm.window(3)?, tail_rank, local: Mutex::new(()) })
    }

    /// Acquires the lock [Schmid 2016, Listing 2], waiting as long as it takes.
    pub fn lock(&self) -> Result<DMcsGuard<'_>, Error> {
        let local = self.local.lock();
        let w = &self.window;
        let p = w.rank();
        // Prepare the local fields, complete before anyone can see this rank in the queue.
        w.put(p, NEXT, &[0])?;
        w.put(p, WAIT, &[1])?;
        w.flush(p)?;
        // Enter the tail of the queue and get the predecessor.
        let pred = w.fetch_and_op(self.tail_rank, TAIL, node(p), Op::Replace)?;
        if pred != 0 {
            // Make the predecessor see us, then spin locally until it hands the lock over.
            let pred = (pred - 1) as u32;
            w.put(pred, NEXT, &[node(p)])?;
            w.flush(pred)?;
            let mut backoff = Backoff(0);
            let mut waiting = [1u64];
            loop {
                w.get(p, WAIT, &mut waiting)?;
                if waiting[0] == 0 {
                    break;
                }
                backoff.snooze();
            }
        }
        Ok(Guard::new(self, local))
    }

    /// Acquires the lock if nobody holds it or waits for it: one compare-and-swap of the
    /// tail (`None` when taken).
    pub fn try_lock(&self) -> Result<Option<DMcsGuard<'_>>, Error> {
        let Some(local) = self.local.try_lock() else { return Ok(None) };
        let w = &self.window;
        let p = w.rank();
        w.put(p, NEXT, &[0])?;
        w.flush(p)?;
        if w.compare_and_swap(self.tail_rank, TAIL, 0, node(p))? != 0 {
            return Ok(None);
        }
        Ok(Some(Guard::new(self, local)))
    }
}

impl Release for DMcs {
    /// Releases the lock [Schmid 2016, Listing 3].
    fn release(&self) -> Result<(), Error> {
        let w = &self.window;
        let p = w.rank();
        let mut succ = [0u64];
        w.get(p, NEXT, &mut succ)?;
        if succ[0] == 0 {
            // Still the tail? Then the queue is empty and the lock free.
            if w.compare_and_swap(self.tail_rank, TAIL, node(p), 0)? == node(p) {
                return Ok(());
            }
            // A rank has swapped itself into the tail: wait until it has told us.
            let mut backoff = Backoff(0);
            loop {
                w.get(p, NEXT, &mut succ)?;
                if succ[0] != 0 {
                    break;
                }
                backoff.snooze();
            }
        }
        // Hand the lock to the successor.
        let succ = (succ[0] - 1) as u32;
        w.put(succ, WAIT, &[0])?;
        w.flush(succ)
    }
}

/// The foMPI-style spin lock [Schmid 2016, §5] (foMPI-Spin): one word on `home`,
/// acquired by compare-and-swap from "free" to the acquirer, released by an atomic swap
/// back; waiters poll the word with backoff.
pub struct SpinLock {
    window: Window<'static, u64>,
    home: u32,
    local: Mutex<()>,
}

impl std::fmt::Debug for SpinLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpinLock").field("rank", &self.window.rank()).field("home", &self.home).finish()
    }
}

impl SpinLock {
    /// Creates the lock on every rank of `comm` (collective), its word on `home`.
    pub fn new(comm: &Communicator, home: u32) -> Result<Self, Error> {
        if home >= comm.size() {
            return Err(Error::RankOutOfRange { rank: home, size: comm.size() });
        }
        Ok(SpinLock { window: comm.window(1)?, home, local: Mutex::new(()) })
    }

    fn attempt(&self) -> Result<bool, Error> {
        Ok(self.window.compare_and_swap(self.home, 0, 0, node(self.window.rank()))? == 0)
    }

    /// Acquires the lock, polling until the word is free.
    pub fn lock(&self) -> Result<SpinGuard<'_>, Error> {
        let local = self.local.lock();
        let mut backoff = Backoff(0);
        while !self.attempt()? {
            backoff.snooze();
        }
        Ok(Guard::new(self, local))
    }

    /// Acquires the lock if it is free (one compare-and-swap).
    pub fn try_lock(&self) -> Result<Option<SpinGuard<'_>>, Error> {
        let Some(local) = self.local.try_lock() else { return Ok(None) };
        Ok(self.attempt()?.then(|| Guard::new(self, local)))
    }
}

impl Release for SpinLock {
    fn release(&self) -> Result<(), Error> {
        self.window.fetch_and_op(self.home, 0, 0, Op::Replace).map(|_| ())
    }
}
