//! The rank's waiter: the one parked thread at a time that blocks on what wakes the rank —
//! its `eventfd` (which same-host senders write, lane docs *Waking the receiver*, and which
//! its own waker writes, for the doorbell and its sync object) and, where every CQ has one,
//! the CQs' wait fds after `fi_trywait` — instead of on its thread parker behind the
//! watcher (the parent module's *Polling, staging and parking*).
//!
//! The role itself — who holds it, and how the watcher learns to cover the descriptors
//! again when it is given back — is [`WaiterRole`] (with its loom model).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::task::{Wake, Waker};

use super::lane::{self, Lane};
use crate::waiter_role::WaiterRole;

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
    /// Who holds the role; whether the watcher naps meanwhile.
    role: WaiterRole,
    /// The waiter's `eventfd`: a duplicate of the lane's published one where the rank has a
    /// lane (same-host senders write it), else its own.
    fd: Arc<EventFd>,
    /// Writes `fd`: what the waiter's listeners are polled with.
    waker: Waker,
    /// The watcher's `eventfd`: a duplicate of the lane's where the rank has a lane, else
    /// its own. Written to end the watcher's sleep (a waiter leaving it, `close`).
    watcher_fd: OwnedFd,
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
        Some(Slot { role: WaiterRole::new(), fd, waker, watcher_fd })
    }

    /// Takes the role if no thread holds it.
    #[inline]
    pub(super) fn take(&self) -> Option<Held<'_>> {
        self.role.take().then_some(Held { slot: self })
    }

    /// Whether a thread holds the role (a hint: [`nap`](Self::nap) checks).
    pub(super) fn is_taken(&self) -> bool {
        self.role.is_taken()
    }

    /// The watcher's `eventfd`.
    pub(super) fn watcher_fd(&self) -> RawFd {
        self.watcher_fd.as_raw_fd()
    }

    /// Ends the watcher's sleep (`close`, a thread that found the rank quiet while the
    /// watcher slept through its activity).
    pub(super) fn wake_watcher(&self) {
        lane::write_one(self.watcher_fd.as_raw_fd());
    }

    /// The watcher is about to sleep longer than a short nap, having chosen its sleep by
    /// `taken` (what it saw of the role): `false` if that changed meanwhile (then it
    /// chooses again instead). Follow with [`woke`](Self::woke) after the sleep.
    pub(super) fn nap(&self, taken: bool) -> bool {
        self.role.nap(taken)
    }

    /// After the watcher's sleep: takes back `nap` and drains its `eventfd`.
    pub(super) fn woke(&self) {
        self.role.woke();
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
        if self.slot.role.give_back() {
            // The watcher sleeps on a timer, leaving the descriptors to us: it covers them
            // again from now on.
            self.slot.wake_watcher();
        }
    }
}
