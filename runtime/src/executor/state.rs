//! The state word of a task (`task.rs` has the table of bits and the memory-ordering notes).
//! Kept apart, on `crate::loom` atomics, so the protocol is model-checked on its own
//! (`RUSTFLAGS="--cfg loom" cargo test -p weft --lib --release executor::state`).

use crate::loom::sync::atomic::{AtomicUsize, Ordering};

const SCHEDULED: usize = 1;
const RUNNING: usize = 2;
const COMPLETE: usize = 4;
/// Set at shutdown on a task that is not complete: whoever holds (or takes) `RUNNING` drops
/// the future and completes the task with a cancellation. Only ever set together with
/// `RUNNING` (or while it is held), so a task with this bit is never polled again.
const CANCELLED: usize = 8;

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
    /// The pool shut down during the poll: the poller keeps `RUNNING`, drops the future and
    /// completes the task as cancelled.
    Cancel,
}

/// What a shutdown's cancellation of a live task found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Shutdown {
    /// The task was idle or queued: the caller now holds `RUNNING` and cancels it.
    Claimed,
    /// A thread is polling (or cancelling) it; `CANCELLED` tells the poller to cancel it
    /// when its poll returns `Pending`.
    LeftToPoller,
    /// Already complete.
    Complete,
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
    /// task is complete, or claimed by a shutdown's cancellation while it sat in the queue
    /// (nothing to poll: the queue's reference was stale).
    pub(super) fn start_run(&self) -> bool {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            if s & (RUNNING | COMPLETE) != 0 {
                return false;
            }
            debug_assert!(s & SCHEDULED != 0, "run of a task that was not queued");
            // Acquire: see the previous poller's writes to the future.
            match self.0.compare_exchange_weak(s, (s & !SCHEDULED) | RUNNING, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(a) => s = a,
            }
        }
    }

    /// Clears `RUNNING` after a `Pending` poll, unless the task was cancelled meanwhile
    /// (then `RUNNING` stays with the poller, which cancels it).
    pub(super) fn end_run(&self) -> AfterPoll {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            if s & CANCELLED != 0 {
                return AfterPoll::Cancel;
            }
            // Release: publishes the future's state to the next poller.
            match self.0.compare_exchange_weak(s, s & !RUNNING, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) if s & SCHEDULED != 0 => return AfterPoll::Reschedule,
                Ok(_) => return AfterPoll::Idle,
                Err(a) => s = a,
            }
        }
    }

    /// Marks the task complete (from `RUNNING`): no wake pushes it again.
    pub(super) fn complete(&self) {
        // Release: publishes the output to the join handle's acquire.
        self.0.swap(COMPLETE, Ordering::AcqRel);
    }

    /// Claims a queued task for cancellation (its queue is drained at shutdown); false if a
    /// thread holds it (`RUNNING`: a shutdown's cancellation claimed it first) or it is
    /// complete.
    pub(super) fn claim_for_cancel(&self) -> bool {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            if s & (RUNNING | COMPLETE) != 0 {
                return false;
            }
            // Acquire: the last poller's writes to the future happen before we drop it.
            match self.0.compare_exchange_weak(s, s | RUNNING | CANCELLED, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(a) => s = a,
            }
        }
    }

    /// Cancels a live task at shutdown, wherever it is: idle (waiting for a wake) or queued,
    /// it is claimed; being polled, it is marked for the poller to cancel.
    pub(super) fn shut_down(&self) -> Shutdown {
        let mut s = self.0.load(Ordering::Relaxed);
        loop {
            let (next, outcome) = if s & COMPLETE != 0 {
                return Shutdown::Complete;
            } else if s & RUNNING != 0 {
                (s | CANCELLED, Shutdown::LeftToPoller)
            } else {
                (s | RUNNING | CANCELLED, Shutdown::Claimed)
            };
            // Acquire: as in `claim_for_cancel`. Release (for `LeftToPoller`): nothing to
            // publish, but the flag must not be lost in a race with `end_run`'s exchange,
            // which a read-modify-write guarantees.
            match self.0.compare_exchange_weak(s, next, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return outcome,
                Err(a) => s = a,
            }
        }
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

    use super::{AfterPoll, Shutdown, State, Wake};

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

    /// A thread doing what shutdown does to a task: claim it, and if the claim is its own,
    /// count a cancellation and complete it.
    fn racing_shutdown(st: &Arc<State>, cancels: &Arc<AtomicUsize>) -> thread::JoinHandle<()> {
        let (st, cancels) = (st.clone(), cancels.clone());
        thread::spawn(move || {
            if st.shut_down() == Shutdown::Claimed {
                cancels.fetch_add(1, Ordering::Relaxed);
                st.complete();
            }
        })
    }

    /// A shutdown's cancellation racing a poll that returns `Pending`: exactly one of them
    /// cancels the task (drops the future), and the task is never polled after.
    #[test]
    fn shutdown_racing_a_poll_cancels_once() {
        loom::model(|| {
            let st = Arc::new(State::scheduled());
            let cancels = Arc::new(AtomicUsize::new(0));
            let shutdown = racing_shutdown(&st, &cancels);
            if st.start_run() && st.end_run() == AfterPoll::Cancel {
                cancels.fetch_add(1, Ordering::Relaxed);
                st.complete();
            }
            shutdown.join().unwrap();
            assert_eq!(cancels.load(Ordering::Relaxed), 1);
            assert!(st.is_complete());
            assert!(!st.start_run(), "polled after cancellation");
        });
    }

    /// A shutdown's cancellation racing the drain of the queue the task sits in: one cancel.
    #[test]
    fn shutdown_racing_a_drain_cancels_once() {
        loom::model(|| {
            let st = Arc::new(State::scheduled());
            let cancels = Arc::new(AtomicUsize::new(0));
            let shutdown = racing_shutdown(&st, &cancels);
            if st.claim_for_cancel() {
                cancels.fetch_add(1, Ordering::Relaxed);
                st.complete();
            }
            shutdown.join().unwrap();
            assert_eq!(cancels.load(Ordering::Relaxed), 1);
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
