//! Running a future to completion on the calling thread.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

use super::pool::Executor;
use crate::loom::sync::atomic::{AtomicBool, Ordering};

/// The waker of a `block_on` thread: a flag plus an unpark.
struct BlockOnWaker {
    /// Set by a wake, taken by the blocked thread (spurious unparks are ignored).
    notified: AtomicBool,
    /// The blocked thread.
    thread: Thread,
}

impl Wake for BlockOnWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        // Release: what the waker did before waking is visible after the swap in `block_on`.
        self.notified.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// Polls `future` on this thread until it is ready. The future's own wakers drive it
/// (request and sync-object futures make progress when polled). With no pool workers
/// (`workers(0)`), or when called from inside a task, the thread runs pool tasks between
/// polls, so spawned tasks make progress; a task run so may itself `block_on`, nested up to
/// `MAX_HELP_DEPTH` (`pool.rs`), beyond which this thread only polls its own future.
pub(crate) fn block_on<F: Future>(executor: &Executor, future: F) -> F::Output {
    let mut future = pin!(future);
    let signal = Arc::new(BlockOnWaker { notified: AtomicBool::new(false), thread: std::thread::current() });
    let waker = Waker::from(signal.clone());
    let mut cx = Context::from_waker(&waker);
    // With no workers, or on a worker thread (which would otherwise hold up the tasks in its
    // own deque), this thread runs pool tasks while the future is pending.
    let runs_tasks = executor.workers() == 0 || super::pool::on_worker_of(executor);
    loop {
        if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
        loop {
            // Acquire: pairs with the release in `wake_by_ref`.
            if signal.notified.swap(false, Ordering::Acquire) {
                break;
            }
            if runs_tasks {
                if super::help(executor) {
                    continue;
                }
                // Nothing queued (or nested too deep to run it): a new task is only noticed
                // by looking again.
                std::thread::park_timeout(Duration::from_millis(1));
            } else {
                std::thread::park();
            }
        }
    }
}
