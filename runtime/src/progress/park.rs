//! Parking a blocked thread: on its sync object's signal and the rank's doorbell (or an
//! ownership hand-off), yielding first, never longer than [`PARK_LIMIT`] at a time.
//!
//! A thread that parks on the doorbell becomes the rank's *waiter* where the transport has
//! one to give (`Transport::take_waiter`: libfabric) and no other thread holds it: it then
//! sleeps on what wakes the rank itself — the network's descriptors, and a waker its
//! listeners write — instead of on its thread parker behind a watcher thread that would
//! ring the doorbell for it. One hand-off from a frame's arrival to a running thread, as
//! on the embedded provider; the other threads park on the doorbell as before.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use weft_sync::SignalListener;
use weft_transport::RankWaiter;

use super::Pass;
use crate::engine::Engine;
use crate::executor::Unpark;
use crate::loom::sync::atomic::Ordering;

/// Parks on `listener` and the doorbell, unless frames are already waiting.
///
/// A thread the doorbell woke makes one progress pass before it returns: the ring was
/// meant for whoever progresses, and its own wait may be over already (it would then leave
/// without looking at the frames, and the threads still parked were not woken for them).
///
/// The doorbell's listener lives on this frame (`Doorbell::listen_scoped`), as the wait's
/// own does on its caller's: a park allocates nothing.
pub(super) fn park_or_frames(s: &Engine, listener: SignalListener<'_>) {
    s.transport.doorbell().listen_scoped(|bell| {
        if s.work_before_sleep() {
            return;
        }
        s.counters.parks.fetch_add(1, Ordering::Relaxed);
        match park_two(s, listener, Some(bell), Waiter::Take) {
            Woken::Second => {
                let _ = s.progress_once();
            }
            Woken::Network => {
                // The watcher's pass would have rung the doorbell for what woke us: where
                // another thread owns progress, it is that thread's to take.
                if s.progress_once() == Pass::Elsewhere {
                    s.transport.doorbell().ring();
                }
            }
            Woken::First | Woken::Timeout => {}
        }
    });
}

/// Whether a `park_two` may sleep as the rank's waiter (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Waiter {
    /// It may: the thread progresses when the network wakes it (it listens to the doorbell).
    Take,
    /// It may not: a thread that waits for its own completions or a hand-off only.
    Leave,
}

/// Which listener ended a `park_two`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Woken {
    First,
    Second,
    /// Neither: the network, for the rank's waiter (module docs).
    Network,
    /// Neither: the park limit passed.
    Timeout,
}

thread_local! {
    static PARKER: Waker = Waker::from(Arc::new(Unpark(std::thread::current())));
}

/// Longest single park. A safety net, not the wake-up mechanism: every wake-up path is a
/// notification (a destination that refused a frame rings the doorbell when it has room
/// again: `SendError::WouldBlock`'s contract), so a missed notification costs at most this
/// much latency instead of a hang.
pub(crate) const PARK_LIMIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Blocks until either listener fires (or `PARK_LIMIT` passes, counted in
/// `park_timeouts`; callers re-check): yields the core for the configured
/// `yield_window` first (a notification then needs no futex wake), then parks — as the
/// rank's waiter if `waiter` allows and the role is free (module docs), woken by the
/// network too ([`Woken::Network`]).
pub(super) fn park_two(s: &Engine, mut a: SignalListener<'_>, mut b: Option<SignalListener<'_>>, waiter: Waiter) -> Woken {
    use std::future::Future;
    use std::pin::Pin;
    let parker = PARKER.with(|w| w.clone());
    // Taken once the yield window is over, just before the sleep: while the thread yields,
    // the watcher keeps the network's descriptors.
    let mut held: Option<RankWaiter<'_>> = None;
    let mut may_take = waiter == Waiter::Take;
    // The network ended the waiter's last sleep.
    let mut network = false;
    let start = std::time::Instant::now();
    let deadline = start + PARK_LIMIT;
    // At most the park limit: a longer window yields just as long (the wait ends there), and
    // `start + Duration::MAX` would overflow the `Instant`.
    let yield_until = start + s.config.yield_window.min(PARK_LIMIT);
    tracing::trace!(rank = s.transport.rank(), "thread parks");
    let woke = |how: Woken| {
        let counter = if how == Woken::Timeout { &s.counters.park_timeouts } else { &s.counters.wakes };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(rank = s.transport.rank(), woken_by = ?how, parked_us = start.elapsed().as_micros() as u64, "thread unparks");
        how
    };
    loop {
        // The waiter's listeners write its descriptor; other threads are unparked.
        let mut cx = Context::from_waker(held.as_ref().map_or(&parker, RankWaiter::waker));
        if let Poll::Ready(()) = Pin::new(&mut a).poll(&mut cx) {
            return woke(Woken::First);
        }
        if let Some(b) = b.as_mut() {
            if let Poll::Ready(()) = Pin::new(b).poll(&mut cx) {
                return woke(Woken::Second);
            }
        }
        if network {
            return woke(Woken::Network);
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return woke(Woken::Timeout);
        }
        if now < yield_until {
            std::thread::yield_now();
        } else if let Some(w) = &held {
            network = w.sleep(deadline - now);
        } else if let Some(w) = may_take.then(|| s.transport.take_waiter()).flatten() {
            // The listeners are polled again with the waiter's waker before it sleeps.
            held = Some(w);
        } else {
            may_take = false;
            std::thread::park_timeout(deadline - now);
        }
    }
}

#[cfg(all(test, not(loom), not(miri)))]
pub(crate) mod tests {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;
    use std::time::Duration;

    use weft_sync::{Progress, Signal};

    use super::park_or_frames;
    use crate::progress::owner::OwnerWait;
    use crate::{ProgressMode, Runtime};

    /// The allocator of the crate's unit-test binary: the system's, counting the
    /// allocations of a thread while that thread asks it to ([`allocations_here`]) — other
    /// tests run on other threads meanwhile.
    struct PerThread;

    thread_local! {
        /// Whether this thread's allocations are counted, and how many were.
        static COUNTED: Cell<Option<usize>> = const { Cell::new(None) };
    }

    // SAFETY: forwards to the system allocator; the count is a const-initialised
    // thread-local without a destructor (no allocation, usable at any time).
    unsafe impl GlobalAlloc for PerThread {
        unsafe fn alloc(&self, l: Layout) -> *mut u8 {
            let _ = COUNTED.try_with(|c| c.set(c.get().map(|n| n + 1)));
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.alloc(l) }
        }
        unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
            // SAFETY: the caller's contract, forwarded.
            unsafe { System.dealloc(p, l) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: PerThread = PerThread;

    /// The allocations the calling thread makes while `f` runs.
    pub(crate) fn allocations_here(f: impl FnOnce()) -> usize {
        COUNTED.with(|c| c.set(Some(0)));
        f();
        COUNTED.with(|c| c.take()).unwrap_or(0)
    }

    /// A blocked thread's park allocates nothing, in every progress mode: the doorbell's
    /// listener (a thread that parks for frames) and the progress token's hand-off (an
    /// `Owner`-mode waiter that does not own progress) live on its stack, as the wait's own
    /// listener does. (Each listener used to be boxed: one allocation per park.) Each park
    /// here sleeps out the park limit: nothing wakes it.
    #[test]
    fn a_park_allocates_nothing() {
        let signal = Signal::new();
        for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
            let rt = Runtime::builder().env(false).progress(mode).yield_window(Duration::ZERO).build().unwrap();
            let s = &*rt.engine;
            // What a first park makes once (the thread's parker, the events' lists).
            signal.listen_scoped(|l| park_or_frames(s, l));
            let parks = s.counters.parks.load(std::sync::atomic::Ordering::Relaxed);
            let n = allocations_here(|| signal.listen_scoped(|l| park_or_frames(s, l)));
            assert_eq!(s.counters.parks.load(std::sync::atomic::Ordering::Relaxed), parks + 1, "{mode}: did not park");
            assert_eq!(n, 0, "{mode}: allocations in a park on the doorbell");
        }
        // An `Owner`-mode waiter while another thread owns progress: it parks on the hand-off.
        let rt = Runtime::builder().env(false).progress(ProgressMode::Owner).yield_window(Duration::ZERO).build().unwrap();
        let s = &*rt.engine;
        let (owner, me) = (u64::MAX, crate::engine::thread_token());
        assert!(s.owner.own_or_take(owner));
        let wait = OwnerWait { engine: s, me };
        signal.listen_scoped(|l| wait.park(l));
        let parks = s.counters.parks.load(std::sync::atomic::Ordering::Relaxed);
        let n = allocations_here(|| signal.listen_scoped(|l| wait.park(l)));
        assert_eq!(s.counters.parks.load(std::sync::atomic::Ordering::Relaxed), parks + 1, "did not park on the hand-off");
        assert_eq!(n, 0, "allocations in a park on the hand-off");
        s.owner.leave(owner);
    }
}
