//! The doorbell: how a parked progress owner (a thread) or an idle async poller (a task)
//! learns that frames arrived, and how a rank with frames refused by a full destination
//! learns that the destination has room again.

use std::fmt;
use std::task::Waker;

use parking_lot::Mutex;
use weft_sync::{Signal, SignalListener};

use crate::loom::sync::atomic::{AtomicBool, Ordering};

/// Rung on every frame pushed to a rank. Threads listen through [`listen`](Self::listen);
/// async tasks register a waker with [`register`](Self::register), woken (and dropped) at the
/// next ring.
///
/// A second channel carries only *room*: [`ring_room`](Self::ring_room) says that a
/// destination which refused a send of this rank may take frames again (and
/// [`ring_all`](Self::ring_all), a lost peer, counts as room too: the refused frames then
/// fail instead). It rings as [`ring`](Self::ring) does and also wakes the wakers registered
/// with [`register_room`](Self::register_room) — a waiter for room alone, which the frames
/// rung for on every push would wake for nothing (and whose wake-up a `ring` to one parked
/// thread would take from a thread waiting for frames).
#[derive(Default)]
pub struct Doorbell {
    /// Parked threads.
    event: Signal,
    /// Async pollers waiting for the next ring.
    wakers: Mutex<Vec<Waker>>,
    /// `wakers` is non-empty: the ring path checks this one flag before taking the lock.
    has_wakers: AtomicBool,
    /// Waiters for the next ring of room (`register_room`), woken and dropped by it.
    room: Mutex<Vec<Waker>>,
    /// `room` is non-empty: `ring_room` checks this one flag before taking the lock.
    has_room: AtomicBool,
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

    /// Wakes every parked thread and task, and the waiters for room (a lost peer: what
    /// was refused by it fails now instead of waiting for room).
    pub fn ring_all(&self) {
        // As in `ring`: `notify` begins with a full fence, which orders the flag loads after
        // what preceded this call; a task registering concurrently re-checks after its own
        // fence (`register`), so checking the flag before taking the lock loses no wake-up.
        self.event.notify(usize::MAX);
        if self.has_wakers.load(Ordering::Relaxed) {
            self.wake_tasks();
        }
        if self.has_room.load(Ordering::Relaxed) {
            Self::wake(&self.room, &self.has_room);
        }
    }

    /// Rings for room: a destination that refused a send of this rank may take frames again.
    /// Wakes what [`ring`](Self::ring) wakes, and every waker registered with
    /// [`register_room`](Self::register_room). Rare (a full inbox drained, a refusal seen):
    /// the fence it costs is off the frame path.
    pub fn ring_room(&self) {
        self.ring();
        // SeqCst: orders what announced the room (the drained inbox, the refusal taken)
        // before the flag load, pairing with the fence in `register_room` (Dekker-style).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.has_room.load(Ordering::Relaxed) {
            Self::wake(&self.room, &self.has_room);
        }
    }

    #[cold]
    fn wake_tasks(&self) {
        Self::wake(&self.wakers, &self.has_wakers);
    }

    /// Takes the wakers of one channel and wakes them outside its lock.
    #[cold]
    fn wake(list: &Mutex<Vec<Waker>>, flag: &AtomicBool) {
        let wakers = {
            let mut w = list.lock();
            flag.store(false, Ordering::Relaxed);
            std::mem::take(&mut *w)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// A listener for the next ring (check -> listen -> re-check -> wait), boxed: one that
    /// outlives the caller's frame. A thread that parks before it returns takes
    /// [`listen_scoped`](Self::listen_scoped).
    pub fn listen(&self) -> SignalListener<'_> {
        self.event.listen()
    }

    /// A listener for the next ring on this stack frame, handed to `f`, which re-checks and
    /// waits (check -> listen -> re-check -> wait): allocates nothing
    /// ([`Signal::listen_scoped`]).
    pub fn listen_scoped<R>(&self, f: impl FnOnce(SignalListener<'_>) -> R) -> R {
        self.event.listen_scoped(f)
    }

    /// Registers `waker` to be woken at the next ring. The caller re-checks for frames
    /// afterwards (a ring may have come before the registration).
    pub fn register(&self, waker: &Waker) {
        Self::add(&self.wakers, &self.has_wakers, waker);
    }

    /// Registers `waker` to be woken at the next ring of room
    /// ([`ring_room`](Self::ring_room) or [`ring_all`](Self::ring_all)), not by frames. The
    /// caller retries its refused sends afterwards (room may have come before the
    /// registration).
    pub fn register_room(&self, waker: &Waker) {
        Self::add(&self.room, &self.has_room, waker);
    }

    /// Adds `waker` to one channel (once) and raises its flag.
    fn add(list: &Mutex<Vec<Waker>>, flag: &AtomicBool, waker: &Waker) {
        let mut w = list.lock();
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
        flag.store(true, Ordering::Relaxed);
        drop(w);
        // Full fence: the flag store must be visible before the caller re-checks (the
        // inboxes, or its refused sends), pairing with the fence of the ring (a Dekker-style
        // handshake).
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}
