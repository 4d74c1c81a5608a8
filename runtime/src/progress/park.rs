//! Parking a blocked thread: on its sync object's signal and the rank's doorbell (or an
//! ownership hand-off), yielding first, never longer than [`PARK_LIMIT`] at a time.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use weft_sync::SignalListener;

use crate::engine::Engine;
use crate::executor::Unpark;
use crate::loom::sync::atomic::Ordering;

/// Parks on `listener` and the doorbell, unless frames are already waiting.
///
/// A thread the doorbell woke makes one progress pass before it returns: the ring was
/// meant for whoever progresses, and its own wait may be over already (it would then leave
/// without looking at the frames, and the threads still parked were not woken for them).
pub(super) fn park_or_frames(s: &Engine, listener: SignalListener<'_>) {
    let bell = s.transport.doorbell().listen();
    if s.work_before_sleep() {
        return;
    }
    s.counters.parks.fetch_add(1, Ordering::Relaxed);
    if park_two(s, listener, Some(bell)) == Woken::Second {
        let _ = s.progress_once();
    }
}

/// Which listener ended a `park_two`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Woken {
    First,
    Second,
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
/// `yield_window` first (a notification then needs no futex wake), then parks.
pub(super) fn park_two(s: &Engine, mut a: SignalListener<'_>, mut b: Option<SignalListener<'_>>) -> Woken {
    use std::future::Future;
    use std::pin::Pin;
    let waker = PARKER.with(|w| w.clone());
    let start = std::time::Instant::now();
    let deadline = start + PARK_LIMIT;
    // At most the park limit: a longer window yields just as long (the wait ends there), and
    // `start + Duration::MAX` would overflow the `Instant`.
    let yield_until = start + s.config.yield_window.min(PARK_LIMIT);
    let mut cx = Context::from_waker(&waker);
    tracing::trace!(rank = s.transport.rank(), "thread parks");
    let woke = |how: Woken| {
        let counter = if how == Woken::Timeout { &s.counters.park_timeouts } else { &s.counters.wakes };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(rank = s.transport.rank(), woken_by = ?how, parked_us = start.elapsed().as_micros() as u64, "thread unparks");
        how
    };
    loop {
        if let Poll::Ready(()) = Pin::new(&mut a).poll(&mut cx) {
            return woke(Woken::First);
        }
        if let Some(b) = b.as_mut() {
            if let Poll::Ready(()) = Pin::new(b).poll(&mut cx) {
                return woke(Woken::Second);
            }
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return woke(Woken::Timeout);
        }
        if now < yield_until {
            std::thread::yield_now();
        } else {
            std::thread::park_timeout(deadline - now);
        }
    }
}
