//! Waiting in a spin loop; a plain yield to loom's scheduler under `cfg(loom)` so that models
//! terminate.
//!
//! Two shapes:
//!
//! - [`SpinWait::new`] (TAS, timed polling): `crossbeam_utils::Backoff` exponential backoff,
//!   which spreads out retries on a *shared* word.
//! - [`SpinWait::local`] (MCS/CLH/HMCS queue nodes, ticket turns): the waiter reads a word
//!   only its hand-off writes, so there is no contention to back off from, and every pause
//!   between reads delays the hand-off. It checks after every `spin_loop` hint for
//!   [`LOCAL_SPINS`] rounds. Measured on the 2-core dev machine, exponential backoff here cost
//!   ~600 ns per two-thread hand-off.
//!
//! Both yield (`thread::yield_now`) on every round past their spin limit. The locks of this
//! module other than [`TasPark`](super::TasPark) (which sleeps once its backoff is done,
//! [`SpinWait::done`]) and the system baselines never park; yielding keeps oversubscribed runs (more threads than cores, e.g. 16
//! threads on 2 cores) moving: a FIFO lock handed to a descheduled waiter costs a scheduler
//! round, not a time slice of spinning.

/// Rounds a [`SpinWait::local`] waiter spins (one `spin_loop` hint each) before yielding.
#[cfg(not(loom))]
pub(crate) const LOCAL_SPINS: u32 = 64;

/// One waiter's backoff state.
#[derive(Debug)]
pub(crate) struct SpinWait {
    /// Exponential backoff (`None`: local spinning).
    #[cfg(not(loom))]
    backoff: Option<crossbeam_utils::Backoff>,
    /// Local spinning: rounds so far.
    #[cfg(not(loom))]
    spins: std::cell::Cell<u32>,
}

impl SpinWait {
    /// Exponential backoff, for retries on a shared word.
    #[inline]
    pub(crate) fn new() -> Self {
        SpinWait {
            #[cfg(not(loom))]
            backoff: Some(crossbeam_utils::Backoff::new()),
            #[cfg(not(loom))]
            spins: std::cell::Cell::new(0),
        }
    }

    /// Check-every-round spinning, for a word only the hand-off writes.
    #[inline]
    pub(crate) fn local() -> Self {
        SpinWait {
            #[cfg(not(loom))]
            backoff: None,
            #[cfg(not(loom))]
            spins: std::cell::Cell::new(0),
        }
    }

    /// Whether a [`SpinWait::new`] waiter has backed off as far as spinning and yielding
    /// go, and should sleep instead ([`TasPark`](super::TasPark)); at once under loom.
    #[inline]
    pub(crate) fn done(&self) -> bool {
        #[cfg(not(loom))]
        return self.backoff.as_ref().map_or(true, crossbeam_utils::Backoff::is_completed);
        #[cfg(loom)]
        return true;
    }

    /// Waits one round: a backoff step, a single `spin_loop` hint, or a yield past the
    /// spin limit.
    #[inline]
    pub(crate) fn wait(&self) {
        #[cfg(not(loom))]
        match &self.backoff {
            Some(b) => b.snooze(),
            None => {
                let n = self.spins.get();
                if n < LOCAL_SPINS {
                    self.spins.set(n + 1);
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
        #[cfg(loom)]
        crate::loom::thread::yield_now();
    }
}
