//! Completion stamps, for benchmarks (off unless a measurement switches them on): while on
//! ([`start`]), every completion delivered to someone waiting for it — an attachment (a sync
//! object, a continuation) or a registered waker (a task awaiting its request) — adds its
//! instant, in nanoseconds after [`epoch`], to one sum, and counts itself. A benchmark that
//! sums the instants its callbacks (or takers, or tasks) saw the completions at gets their
//! mean completion-to-callback latency from the two sums, the same way for every way of
//! learning of a completion. While they are off, a completion delivered to someone waiting
//! pays one relaxed load (in the delivery's out-of-line path); one tested for pays nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);
static SUM: AtomicU64 = AtomicU64::new(0);
static COUNT: AtomicU64 = AtomicU64::new(0);

/// The instant the stamps count from (fixed at the first call).
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds from [`epoch`] to now.
pub fn now_nanos() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// Clears the sums and switches the stamps on (one measurement at a time in a process).
pub fn start() {
    let _ = epoch();
    SUM.store(0, Ordering::Relaxed);
    COUNT.store(0, Ordering::Relaxed);
    ON.store(true, Ordering::SeqCst);
}

/// Switches the stamps off and returns `(completions stamped, sum of their instants in
/// nanoseconds after the epoch)`.
pub fn stop() -> (u64, u64) {
    ON.store(false, Ordering::SeqCst);
    (COUNT.load(Ordering::SeqCst), SUM.load(Ordering::SeqCst))
}

/// Stamps one completion, if the stamps are on.
#[inline]
pub(crate) fn stamp() {
    if ON.load(Ordering::Relaxed) {
        SUM.fetch_add(now_nanos(), Ordering::Relaxed);
        COUNT.fetch_add(1, Ordering::Relaxed);
    }
}
