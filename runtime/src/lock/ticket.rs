//! Ticket lock ([Amer 2019, §2.3]): FIFO through two counters. Also the `filter` of the
//! two-level priority lock ([Amer 2019, §4.1]), where at most two threads compete for it.
//!
//! # State words
//!
//! | word | written by | meaning |
//! |---|---|---|
//! | `next` | every acquirer (`fetch_add`) | the next ticket to hand out |
//! | `serving` | the holder, on release | the ticket that may enter |
//!
//! The lock is free when `next == serving`; `next - serving - 1` threads wait (wrapping
//! arithmetic, so the counters may overflow). Both words share one cache line: a ticket lock
//! is meant for low concurrency, where one line transfer per hand-off beats two.
//!
//! A ticket has no owner: any thread may release the lock, which [`super::Priority`] uses
//! when one high-priority thread takes the filter and a later one releases it.
//!
//! # Memory ordering
//!
//! `next.fetch_add` is `Relaxed`: it only assigns a turn. The waiter's `serving.load(Acquire)`
//! that sees its turn synchronizes-with the previous holder's `serving.store(Release)`.
//! `try_lock` reads `serving` with Acquire (same pairing) and then claims the turn with a
//! `Relaxed` CAS on `next`.

use std::pin::Pin;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::spin::SpinWait;
use super::{RawLock, RawTimedLock};
use crate::loom::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
struct TicketCounters {
    /// Next ticket to hand out.
    next: AtomicUsize,
    /// Ticket allowed in the critical section.
    serving: AtomicUsize,
}

/// FIFO ticket lock. Node: `()`.
#[derive(Debug)]
pub struct Ticket {
    /// Both counters, on one cache line of their own.
    c: CachePadded<TicketCounters>,
}

impl Default for Ticket {
    fn default() -> Self {
        Ticket::new()
    }
}

impl Ticket {
    /// A free lock.
    pub fn new() -> Self {
        Ticket { c: CachePadded::new(TicketCounters { next: AtomicUsize::new(0), serving: AtomicUsize::new(0) }) }
    }

    /// Acquires (no node needed).
    #[inline]
    pub fn acquire(&self) {
        // Relaxed: the ticket number only assigns a turn; synchronization is on `serving`.
        let me = self.c.next.fetch_add(1, Ordering::Relaxed);
        // Acquire: pairs with the Release in `release` of the previous holder.
        if self.c.serving.load(Ordering::Acquire) != me {
            self.wait_turn(me);
        }
    }

    #[cold]
    fn wait_turn(&self, me: usize) {
        let spin = SpinWait::local();
        // Acquire: as in `acquire`.
        while self.c.serving.load(Ordering::Acquire) != me {
            spin.wait();
        }
    }

    /// Acquires if no one holds or waits for the lock.
    #[inline]
    pub fn try_acquire(&self) -> bool {
        // Acquire: if the lock is free, `serving` was last written by the previous holder's
        // Release store; this load makes its critical section visible to us.
        let s = self.c.serving.load(Ordering::Acquire);
        // Relaxed: claiming ticket `s` when `next == s` is the whole acquisition; the data
        // synchronization was done by the Acquire load above.
        self.c.next.compare_exchange(s, s.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// Releases: admits the next ticket.
    ///
    /// # Safety
    ///
    /// The lock is held (by the caller, or by a group the caller acts for, as the
    /// high-priority class in [`super::Priority`]), and this release is the only one for that
    /// acquisition.
    #[inline]
    pub unsafe fn release(&self) {
        // Relaxed: only the holder writes `serving`, and the holder's acquisition
        // happened-after the last write, so this reads the current value.
        let s = self.c.serving.load(Ordering::Relaxed);
        // Release: publish the critical section to the next ticket's Acquire load.
        self.c.serving.store(s.wrapping_add(1), Ordering::Release);
    }

    /// Number of threads waiting (racy; may be stale-low, never invents a waiter).
    #[inline]
    pub fn waiters(&self) -> usize {
        let s = self.c.serving.load(Ordering::Relaxed);
        let n = self.c.next.load(Ordering::Relaxed);
        n.wrapping_sub(s).saturating_sub(1)
    }
}

// SAFETY: tickets are unique (`fetch_add`/CAS on `next`), and only ticket `serving` may enter;
// `serving` advances once per release. Acquire/Release pairing as documented above. No node.
unsafe impl RawLock for Ticket {
    type Node = ();

    #[inline]
    fn lock(&self, _node: Pin<&()>) {
        self.acquire()
    }

    #[inline]
    fn try_lock(&self, _node: Pin<&()>) -> bool {
        self.try_acquire()
    }

    #[inline]
    unsafe fn unlock(&self, _node: Pin<&()>) {
        // SAFETY: the caller holds the lock (trait contract).
        unsafe { self.release() }
    }

    /// `false` only when a later ticket was drawn: that thread will be served. A stale
    /// `next` reads low, so the error is always towards `true`.
    #[inline]
    fn no_waiters(&self, _node: Pin<&()>) -> bool {
        self.waiters() == 0
    }
}

// SAFETY: polls `try_lock`, which acquires exactly as `lock` does.
unsafe impl RawTimedLock for Ticket {
    fn try_lock_for(&self, node: Pin<&()>, timeout: Duration) -> bool {
        super::poll_try_lock_for(self, node, timeout)
    }
}

super::flat_priority!(Ticket);
