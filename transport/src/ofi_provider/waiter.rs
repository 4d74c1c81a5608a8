//! The rank's waiter: the one parked thread at a time that blocks on what wakes the rank —
//! its `eventfd` (which same-host senders write, lane docs *Waking the receiver*, and which
//! its own waker writes, for the doorbell and its sync object) and, where every CQ has one,
//! the CQs' wait fds after `fi_trywait` — instead of on its thread parker behind the
//! watcher (the parent module's *Polling, staging and parking*).
//!
//! # The role
//!
//! | `taken` | meaning |
//! |---|---|
//! | `false` | no thread is the waiter: the watcher sleeps on the lane and the CQ wait fds |
//! | `true` | one thread holds [`Held`]: it sleeps on them; the watcher keeps only its timed duties |
//!
//! A thread takes the role with one compare-and-swap when it parks and gives it back when
//! it wakes; a thread that finds it taken parks on the doorbell as before. The watcher
//! announces a long sleep (`watcher_naps`) before it takes it, then looks at `taken` again;
//! a waiter that gives the role back clears `taken`, then looks at `watcher_naps` and, if
//! set, writes the watcher's `eventfd`, so that the watcher covers the descriptors again at
//! once rather than after its nap.
//!
//! # Memory ordering
//!
//! Dekker-style, a `SeqCst` fence on each side: the watcher's between its store of
//! `watcher_naps` and its load of `taken`, the waiter's between its store of `taken` and its
//! load of `watcher_naps`. One of the two sees the other: either the watcher sees the role
//! free (and covers the descriptors itself), or the waiter sees the nap (and ends it).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};

use super::lane::{self, Lane};

/// An `eventfd` that a [`Waker`] writes.
struct EventFd(OwnedFd);

impl Wake for EventFd {
    fn wake(self: Arc<Self>) {
        lane::write_one(self.0.as_raw_fd());
    }

    fn wake_by_ref(self: &Arc<Self>) {
        lane::write_one(self.0.as_raw_fd());
    }
}

/// The rank's waiter role and the descriptors of its hand-over with the watcher.
pub(super) struct Slot {
    /// A thread holds the role ([`Held`]).
    taken: AtomicBool,
    /// The waiter's `eventfd`: a duplicate of the lane's published one where the rank has a
    /// lane (same-host senders write it), else its own.
    fd: Arc<EventFd>,
    /// Writes `fd`: what the waiter's listeners are polled with.
    waker: Waker,
    /// The watcher's `eventfd`: a duplicate of the lane's where the rank has a lane, else
    /// its own. Written to end the watcher's sleep (a waiter leaving it, `close`).
    watcher_fd: OwnedFd,
    /// The watcher is in (or about to start) a sleep longer than a short nap (module docs).
    watcher_naps: AtomicBool,
}

impl Slot {
    /// The slot of a rank with the same-host lane `lane` (or none). `None` if the system
    /// gives no `eventfd`.
    pub(super) fn new(lane: Option<&Lane>) -> Option<Slot> {
        let (fd, watcher_fd) = match lane {
            Some(l) => (lane::dup(l.waiter_fd())?, lane::dup(l.wake_fd())?),
            None => (lane::new_eventfd()?, lane::new_eventfd()?),
        };
        let fd = Arc::new(EventFd(fd));
        let waker = Waker::from(fd.clone());
        Some(Slot { taken: AtomicBool::new(false), fd, waker, watcher_fd, watcher_naps: AtomicBool::new(false) })
    }

    /// Takes the role if no thread holds it.
    #[inline]
    pub(super) fn take(&self) -> Option<Held<'_>> {
        // Acquire: the previous holder's use of the descriptors happened before.
        (!self.taken.load(Ordering::Relaxed) && self.taken.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok())
            .then_some(Held { slot: self })
    }

    /// Whether a thread holds the role. Relaxed: a hint for the watcher's choice of sleep;
    /// `nap` is the checked handshake.
    pub(super) fn is_taken(&self) -> bool {
        self.taken.load(Ordering::Relaxed)
    }

    /// The watcher's `eventfd`.
    pub(super) fn watcher_fd(&self) -> RawFd {
        self.watcher_fd.as_raw_fd()
    }

    /// Ends the watcher's sleep (`close`).
    pub(super) fn wake_watcher(&self) {
        lane::write_one(self.watcher_fd.as_raw_fd());
    }

    /// The watcher is about to sleep longer than a short nap, having chosen its sleep while
    /// the role was taken (`taken`, what it saw): `false` if that changed meanwhile (then it
    /// chooses again instead). Follow with [`woke`](Self::woke) after the sleep.
    pub(super) fn nap(&self, taken: bool) -> bool {
        self.watcher_naps.store(true, Ordering::Relaxed);
        // SeqCst: the Dekker handshake of the module docs (with the fence in `Held::drop`).
        fence(Ordering::SeqCst);
        if self.taken.load(Ordering::Relaxed) != taken {
            self.watcher_naps.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// After the watcher's sleep: takes back `nap` and drains its `eventfd`.
    pub(super) fn woke(&self) {
        self.watcher_naps.store(false, Ordering::Relaxed);
        lane::drain(self.watcher_fd.as_raw_fd());
    }
}

/// The waiter role, held: the thread that has it sleeps through
/// [`RankInner::waiter_sleep`](super::RankInner::waiter_sleep).
pub(super) struct Held<'a> {
    slot: &'a Slot,
}

impl Held<'_> {
    /// Wakes the holder: the waker its listeners are polled with.
    pub(super) fn waker(&self) -> &Waker {
        &self.slot.waker
    }

    /// The holder's `eventfd`.
    pub(super) fn fd(&self) -> RawFd {
        self.slot.fd.0.as_raw_fd()
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // Release: the next holder's descriptors use happens after ours.
        self.slot.taken.store(false, Ordering::Release);
        // SeqCst: the Dekker handshake of the module docs (with the fence in `nap`).
        fence(Ordering::SeqCst);
        if self.slot.watcher_naps.load(Ordering::Relaxed) && self.slot.watcher_naps.swap(false, Ordering::Relaxed) {
            lane::write_one(self.slot.watcher_fd.as_raw_fd());
        }
    }
}
