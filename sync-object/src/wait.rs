//! Waiting: spin briefly, then park; never burn a core indefinitely.
//!
//! This crate carries no progress logic. A blocked waiter is handed a [`Progress`] hook by
//! the runtime; between checks of its condition it calls [`Progress::progress`], and when
//! that reports nothing to do for a while (or tells it to park) the waiter registers an
//! event-listener on its stack (no allocation) and parks through [`Progress::park`]. The runtime decides there whether the
//! thread waits as the progress owner (woken by network activity), as a plain waiter (woken
//! by its completions or by an ownership hand-off), or runs pool tasks meanwhile.

use std::task::Context;

use crate::signal::{Signal, SignalListener};

/// What one call into the progress hook achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Something moved (a completion, a matched frame): re-check the condition right away.
    Progressed,
    /// Nothing to do right now; the waiter may spin a little more before parking.
    Idle,
    /// The waiter should park now (for example: another thread owns progress).
    Park,
}

/// The runtime's side of a blocked wait.
pub trait Progress: Send + Sync {
    /// Makes one bounded step of progress on behalf of a blocked thread.
    fn progress(&self) -> Step;

    /// Parks the calling thread until `listener` fires or the runtime needs this thread (new
    /// network activity for a progress owner, an ownership hand-off). Spurious returns are
    /// fine: the caller re-checks its condition.
    fn park(&self, listener: SignalListener<'_>) {
        listener.wait();
    }

    /// Makes one bounded step of progress on behalf of an async task. When it returns
    /// anything but `Progressed`, the implementation must arrange for `cx`'s waker to be
    /// woken when more progress may be possible, unless someone else is driving progress.
    fn poll_progress(&self, cx: &mut Context<'_>) -> Step {
        let _ = cx;
        self.progress()
    }
}

/// Spin budget before parking: progress calls that found nothing, with a backoff that
/// yields the core once the spin phase is over (crossbeam's `Backoff`).
#[cfg(not(loom))]
const IDLE_SPINS: u32 = 64;
#[cfg(loom)]
const IDLE_SPINS: u32 = 0;

/// Blocks until `done()` holds, driving `hook` meanwhile and parking on `signal`.
///
/// The protocol that loses no wakeup: check -> listen -> re-check -> park. Each park
/// listens on the stack ([`Signal::listen_scoped`]): waiting allocates nothing.
// Under loom the spin budget is 0, which makes `idle < IDLE_SPINS` always false.
#[cfg_attr(loom, allow(clippy::absurd_extreme_comparisons))]
pub(crate) fn block_until(hook: Option<&dyn Progress>, mut done: impl FnMut() -> bool, signal: &Signal) {
    let mut idle = 0u32;
    let mut backoff = crate::IdleBackoff::new();
    loop {
        if done() {
            return;
        }
        let step = match hook {
            Some(h) => h.progress(),
            None => Step::Idle,
        };
        match step {
            Step::Progressed => {
                idle = 0;
                backoff.reset();
                continue;
            }
            Step::Idle if idle < IDLE_SPINS => {
                idle += 1;
                #[cfg(not(loom))]
                backoff.snooze();
                continue;
            }
            Step::Idle | Step::Park => {}
        }
        let finished = signal.listen_scoped(|listener| {
            if done() {
                return true;
            }
            match hook {
                Some(h) => h.park(listener),
                None => listener.wait(),
            }
            false
        });
        if finished {
            return;
        }
        idle = 0;
        backoff.reset();
    }
}
