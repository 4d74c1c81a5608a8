//! Waiting in a spin loop: `crossbeam_utils::Backoff` (spin, then yield) normally, a plain
//! yield to loom's scheduler under `cfg(loom)` so that models terminate.
//!
//! The locks of this module never park: a waiter spins with exponential backoff and, past
//! crossbeam's spin limit, calls `thread::yield_now` on every round. This keeps oversubscribed
//! runs (more threads than cores, e.g. 16 threads on 2 cores) moving: a FIFO lock handed to a
//! descheduled waiter costs a scheduler round, not a time slice of spinning.

/// One waiter's backoff state.
#[derive(Debug)]
pub(crate) struct SpinWait {
    #[cfg(not(loom))]
    backoff: crossbeam_utils::Backoff,
}

impl SpinWait {
    #[inline]
    pub(crate) fn new() -> Self {
        SpinWait {
            #[cfg(not(loom))]
            backoff: crossbeam_utils::Backoff::new(),
        }
    }

    /// Waits one round: spins `2^step` times, or yields once past the spin limit.
    #[inline]
    pub(crate) fn wait(&self) {
        #[cfg(not(loom))]
        self.backoff.snooze();
        #[cfg(loom)]
        crate::loom::thread::yield_now();
    }
}
