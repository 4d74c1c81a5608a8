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

/// Passes of progress one `poll` of a future makes at most while they keep progressing.
/// A pass that handled frames, or a rank whose transport keeps answering that frames may
/// come (libfabric's, for a few milliseconds after any traffic), says `Progressed` again and
/// again: unbounded, one `poll` would hold its executor's worker for as long as traffic
/// lasts. On libfabric's `shm` a pass of a rank under traffic costs about 135 ns (one `poll`
/// of a pending receive, 8 passes, about 1.1 µs), a trip of a task through tokio's
/// current-thread queue about 110 ns (`yield_now`): 8 passes keep the trip to about a tenth
/// of the time a busy poller spends, and hold the worker's other tasks back about a
/// microsecond.
pub const POLL_PASSES: u32 = 8;

/// How [`drive_poll`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum Driven {
    /// `done()` held.
    Done,
    /// A step was not `Progressed`: the hook registered the task's waker where more progress
    /// will wake it (the [`Progress::poll_progress`] contract). The caller registers on its
    /// own event, re-checks, and returns `Pending`.
    Idle,
    /// [`POLL_PASSES`] steps progressed and `done()` still does not hold: the task's waker
    /// was woken, so the executor polls the future again after its other ready tasks. The
    /// caller returns `Pending`.
    Yielded,
}

/// The progress loop of a pending future's `poll`, cooperative as tokio's own resources
/// are: at most [`POLL_PASSES`] progressing steps of `step`, checking `done()` before each
/// and after the last.
///
/// No wake-up is lost: an `Idle` end leaves the waker registered by the step that found
/// nothing (it registers, then re-checks for work that came before the registration); a
/// `Yielded` end has woken the waker itself (`wake_by_ref`), which the executor honours
/// however the future returns, so the task is polled again while progress work remains.
pub fn drive_poll(cx: &mut Context<'_>, mut done: impl FnMut() -> bool, mut step: impl FnMut(&mut Context<'_>) -> Step) -> Driven {
    for _ in 0..POLL_PASSES {
        if done() {
            return Driven::Done;
        }
        if step(cx) != Step::Progressed {
            return Driven::Idle;
        }
    }
    if done() {
        return Driven::Done;
    }
    cx.waker().wake_by_ref();
    Driven::Yielded
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
