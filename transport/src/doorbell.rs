//! The doorbell: how a parked progress owner (a thread) or an idle async poller (a task)
//! learns that frames arrived.

use std::fmt;
use std::task::Waker;

use parking_lot::Mutex;
use weft_sync::{Signal, SignalListener};

use crate::loom::sync::atomic::{AtomicBool, Ordering};

/// Rung on every frame pushed to a rank. Threads listen through [`listen`](Self::listen);
/// async tasks register a waker with [`register`](Self::register), woken (and dropped) at the
/// next ring.
#[derive(Default)]
pub struct Doorbell {
    /// Parked threads.
    event: Signal,
    /// Async pollers waiting for the next ring.
    wakers: Mutex<Vec<Waker>>,
    /// `wakers` is non-empty: the ring path checks this one flag before taking the lock.
    has_wakers: AtomicBool,
}

impl fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Doorbell").finish_non_exhaustive()
    }
}

impl Doorbell {
    /// A silent doorbell.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes one parked thread and every registered task.
    #[inline]
    pub fn ring(&self) {
        // `notify` begins with a full fence (one fence and one load while no thread listens),
        // which also orders the flag load below after the frame push that preceded this ring.
        self.event.notify(1);
        if self.has_wakers.load(Ordering::Relaxed) {
            self.wake_tasks();
        }
    }

    /// Wakes every parked thread and task.
    pub fn ring_all(&self) {
        // As in `ring`: `notify` begins with a full fence, which orders the flag load after
        // what preceded this call; a task registering concurrently re-checks after its own
        // fence (`register`), so checking the flag before taking the lock loses no wake-up.
        self.event.notify(usize::MAX);
        if self.has_wakers.load(Ordering::Relaxed) {
            self.wake_tasks();
        }
    }

    #[cold]
    fn wake_tasks(&self) {
        let wakers = {
            let mut w = self.wakers.lock();
            self.has_wakers.store(false, Ordering::Relaxed);
            std::mem::take(&mut *w)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// A listener for the next ring (check -> listen -> re-check -> wait).
    pub fn listen(&self) -> SignalListener<'_> {
        self.event.listen()
    }

    /// Registers `waker` to be woken at the next ring. The caller re-checks for frames
    /// afterwards (a ring may have come before the registration).
    pub fn register(&self, waker: &Waker) {
        let mut w = self.wakers.lock();
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
        self.has_wakers.store(true, Ordering::Relaxed);
        drop(w);
        // Full fence: the flag store must be visible before the caller re-checks the inboxes,
        // pairing with the fence in `ring` (a Dekker-style handshake).
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}
