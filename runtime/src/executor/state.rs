//! The state word of a task (`task.rs` has the table of bits and the memory-ordering notes).
//! Kept apart, on `crate::loom` atomics, so the protocol is model-checked on its own
//! (`RUSTFLAGS="--cfg loom" cargo test -p weft --lib --release executor::state`).

use crate::loom::sync::atomic::{AtomicUsize, Ordering};

const SCHEDULED: usize = 1;
const RUNNING: usize = 2;
const COMPLETE: usize = 4;

/// What a wake must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Wake {
    /// The task was idle: the waker pushes it to a run queue.
    Push,
    /// Already queued, running (the poller will push it again), or complete.
    Nothing,
}

/// What the poller does after a `Pending` poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AfterPoll {
    /// Woken while running: the poller pushes it again.
    Reschedule,
    /// Idle until the next wake.
    Idle,
}

/// The state word.
pub(super) struct State(AtomicUsize);

impl State {
    /// A new task, `SCHEDULED` (its spawner pushes it).
    pub(super) fn scheduled() -> Self {
        State(AtomicUsize::new(SCHEDULED))
    }

    /// Sets `SCHEDULED` unless queued or complete; the caller pushes only on `Wake::Push`.
    pub(super) fn wake(&self) -> Wake {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            if s & (SCHEDULED | COMPLETE) != 0 {
                return Wake::Nothing;
            }
            // AcqRel: the waker's writes happen before the poll it causes.
            match self.0.compare_exchange_weak(s, s | SCHEDULED, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) if s & RUNNING == 0 => return Wake::Push,
                Ok(_) => return Wake::Nothing,
                Err(a) => s = a,
            }
        }
    }

    /// `SCHEDULED` -> `RUNNING` (a queued task is taken to be polled). Returns false if the
    /// task is already complete (nothing to poll).
    pub(super) fn start_run(&self) -> bool {
        // Acquire: see the previous poller's writes to the future.
        let prev = self.0.fetch_xor(SCHEDULED | RUNNING, Ordering::Acquire);
        debug_assert_eq!(prev & (SCHEDULED | RUNNING), SCHEDULED, "run of a task that was not queued");
        prev & COMPLETE == 0
    }

    /// Clears `RUNNING` after a `Pending` poll.
    pub(super) fn end_run(&self) -> AfterPoll {
        // Release: publishes the future's state to the next poller.
        let prev = self.0.fetch_and(!RUNNING, Ordering::AcqRel);
        if prev & SCHEDULED != 0 {
            AfterPoll::Reschedule
        } else {
            AfterPoll::Idle
        }
    }

    /// Marks the task complete (from `RUNNING`): no wake pushes it again.
    pub(super) fn complete(&self) {
        // Release: publishes the output to the join handle's acquire.
        self.0.swap(COMPLETE, Ordering::AcqRel);
    }

    /// Claims a queued task for cancellation; false if it is running or complete.
    pub(super) fn claim_for_cancel(&self) -> bool {
        let prev = self.0.fetch_or(RUNNING, Ordering::Acquire);
        prev & (RUNNING | COMPLETE) == 0
    }

    /// Whether the output is stored (acquire: the output is visible after `true`).
    pub(super) fn is_complete(&self) -> bool {
        self.0.load(Ordering::Acquire) & COMPLETE != 0
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::sync::Arc;
    use loom::thread;

    use super::{AfterPoll, State, Wake};

    /// A running task is woken by another thread while its poll returns `Pending`: it is
    /// pushed exactly once (by the waker or by the poller), never lost, never twice.
    #[test]
    fn wake_during_poll_is_pushed_once() {
        loom::model(|| {
            let st = Arc::new(State::scheduled());
            let pushes = Arc::new(AtomicUsize::new(0));
            assert!(st.start_run());
            let (s2, p2) = (st.clone(), pushes.clone());
            let waker = thread::spawn(move || {
                if s2.wake() == Wake::Push {
                    p2.fetch_add(1, Ordering::Relaxed);
                }
            });
            if st.end_run() == AfterPoll::Reschedule {
                pushes.fetch_add(1, Ordering::Relaxed);
            }
            waker.join().unwrap();
            assert_eq!(pushes.load(Ordering::Relaxed), 1);
        });
    }

    /// Two wakers of an idle task: one push.
    #[test]
    fn two_wakers_push_once() {
        loom::model(|| {
            let st = Arc::new(State::scheduled());
            assert!(st.start_run());
            assert_eq!(st.end_run(), AfterPoll::Idle);
            let pushes = Arc::new(AtomicUsize::new(0));
            let ts: Vec<_> = (0..2)
                .map(|_| {
                    let (s, p) = (st.clone(), pushes.clone());
                    thread::spawn(move || {
                        if s.wake() == Wake::Push {
                            p.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            for t in ts {
                t.join().unwrap();
            }
            assert_eq!(pushes.load(Ordering::Relaxed), 1);
        });
    }

    /// A wake racing with completion never pushes a complete task.
    #[test]
    fn wake_racing_completion_pushes_nothing() {
        loom::model(|| {
            let st = Arc::new(State::scheduled());
            assert!(st.start_run());
            let s2 = st.clone();
            let waker = thread::spawn(move || s2.wake());
            st.complete();
            assert_eq!(waker.join().unwrap(), Wake::Nothing);
            assert!(st.is_complete());
            assert!(!st.claim_for_cancel());
        });
    }
}
