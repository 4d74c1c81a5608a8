//! One spawned task: a future, its state word, its waker and its [`JoinHandle`].
//!
//! # The state word (`state.rs`, loom-modelled there)
//!
//! | bit | name | meaning |
//! |---|---|---|
//! | 0 | `SCHEDULED` | in a run queue (or about to be pushed); set by a wake, cleared by `run` |
//! | 1 | `RUNNING` | a thread is polling the future |
//! | 2 | `COMPLETE` | the output (or the error) is stored; the future is gone |
//! | 3 | `CANCELLED` | shutdown cancelled it; set only with `RUNNING` held or taken |
//!
//! A wake sets `SCHEDULED`; only the wake that sets it while the task is not `RUNNING` pushes
//! the task, so a task is in at most one queue. A wake during a poll leaves `SCHEDULED` set,
//! and the poller pushes the task again when the poll returns `Pending` (to the back of the
//! queue: a task that keeps waking itself cannot starve the others).
//!
//! # Shutdown
//!
//! Every live task spawned as a future is in the pool's registry (`registry.rs`) from spawn
//! to completion. The one exception is a task that never waits for a wake, a pool
//! continuation's (`PoolCall`, `continuation.rs`): it is queued when made and runs to its
//! end once taken, so it is always in a run queue or running, never only in a waker, and
//! shutdown reaches it where it is: the injector is drained, and a worker leaving its loop
//! cancels what is left in its own queues (`Runnable::cancel`: the callback dropped unrun,
//! counted down as `Cancelled`); one running then runs to its end. It binds no key
//! (`Runnable::bind` does nothing), and spawning it touches no registry lock. At
//! shutdown each registered task left is cancelled (`Runnable::shut_down`): an idle or queued task is
//! claimed (`RUNNING` taken) and its future dropped at once; a task being polled — by a
//! thread helping from inside a wait, or by the very thread shutting down — is marked
//! `CANCELLED`, and its poller cancels it when the poll returns `Pending`. A queue's
//! reference to a claimed task is stale: `start_run` and `claim_for_cancel` refuse it.
//!
//! # Memory ordering
//!
//! The stage (future or output) is touched by the thread that holds `RUNNING`, then by the
//! `JoinHandle` after it sees `COMPLETE`. Setting `RUNNING` is an acquire (it follows the
//! previous poller's release of `RUNNING`); clearing `RUNNING` / setting `COMPLETE` is a
//! release, which publishes the stage to the next poller or to the join handle's acquire.

use std::any::Any;
use std::cell::UnsafeCell;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};

use atomic_waker::AtomicWaker;

use super::pool::{Hint, Pool};
use super::registry::{Key, UNREGISTERED};
use super::state::{AfterPoll, Shutdown, State, Wake as WakeAction};
use crate::loom::sync::atomic::{AtomicUsize, Ordering};

/// A task as the run queues see it.
pub(crate) type TaskRef = Arc<dyn Runnable>;

/// What the pool does with a queued task.
pub(crate) trait Runnable: Send + Sync {
    /// Polls the future once (the task is `SCHEDULED` and in no queue).
    fn run(self: Arc<Self>);
    /// Drops the future without polling it and completes the task with
    /// [`JoinError::Cancelled`], or [`JoinError::Panicked`] if the future's `Drop` panicked
    /// (the pool is shutting down; the task is `SCHEDULED` and in no queue).
    fn cancel(self: Arc<Self>);
    /// Cancels the task at shutdown wherever it is (see the module docs): idle or queued,
    /// here; being polled, by its poller.
    fn shut_down(self: Arc<Self>);
    /// Records the task's key in the pool's registry (`Registry::insert`).
    fn bind(&self, key: Key);
}

/// Why a task gave no output.
#[derive(Clone, PartialEq, Eq)]
pub enum JoinError {
    /// The task panicked; the panic message, when it was a string. A panic in the `Drop`
    /// of the task's future counts too, as in tokio: after a ready poll (the output is then
    /// lost) or when the future is dropped at shutdown.
    Panicked(String),
    /// The runtime shut down before the task finished, or the output was already taken.
    Cancelled,
}

impl fmt::Debug for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for JoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JoinError::Panicked(m) => write!(f, "task panicked: {m}"),
            JoinError::Cancelled => f.write_str("task cancelled (runtime shut down)"),
        }
    }
}

impl std::error::Error for JoinError {}

impl JoinError {
    /// Whether the task panicked.
    pub fn is_panic(&self) -> bool {
        matches!(self, JoinError::Panicked(_))
    }
}

fn panic_message(p: Box<dyn Any + Send>) -> String {
    match p.downcast::<String>() {
        Ok(s) => *s,
        Err(p) => match p.downcast::<&'static str>() {
            Ok(s) => (*s).to_string(),
            Err(_) => "non-string panic payload".to_string(),
        },
    }
}

enum Stage<F: Future> {
    Running(F),
    Finished(Result<F::Output, JoinError>),
    Consumed,
}

/// A spawned future and everything the pool and the join handle share about it (one
/// allocation per task).
pub(crate) struct Task<F: Future> {
    /// The state word (see the module docs).
    state: State,
    /// Where a wake pushes the task.
    pool: Arc<Pool>,
    /// The join handle's waker.
    join: AtomicWaker,
    /// The future, then its output. Guarded by the state word.
    stage: UnsafeCell<Stage<F>>,
    /// Its key in the pool's registry ([`UNREGISTERED`] until registered). Relaxed: written
    /// once under the registry's lock before the task is queued, so the queue's (or the
    /// lock's) ordering publishes it to whoever completes the task.
    key: AtomicUsize,
}

// SAFETY: the stage is accessed by one thread at a time, as the state word decides (module
// docs); the future and its output are `Send`.
unsafe impl<F: Future + Send> Send for Task<F> where F::Output: Send {}
// SAFETY: as above; shared access is through atomics only.
unsafe impl<F: Future + Send> Sync for Task<F> where F::Output: Send {}

impl<F> Task<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// A task, already `SCHEDULED` (the caller pushes it), and its join handle.
    pub(crate) fn create(pool: Arc<Pool>, future: F) -> (TaskRef, JoinHandle<F::Output>) {
        let task = Arc::new(Task {
            state: State::scheduled(),
            pool,
            join: AtomicWaker::new(),
            stage: UnsafeCell::new(Stage::Running(future)),
            key: AtomicUsize::new(UNREGISTERED),
        });
        let handle = JoinHandle { task: task.clone(), _out: PhantomData };
        (task, handle)
    }

    /// Drops the future in place (the caller holds `RUNNING`), catching a panic in its
    /// `Drop`: user code, which must not unwind through a worker (the worker would die and
    /// the join handle would wait forever). The stage is `Consumed` afterwards either way
    /// (an assignment writes the new value on the unwind path too).
    fn drop_future(&self) -> Result<(), Box<dyn Any + Send>> {
        catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: we hold `RUNNING`: exclusive access to the stage. The future is dropped
            // where it lies, as pinning requires.
            unsafe { *self.stage.get() = Stage::Consumed };
        }))
    }

    /// Stores the output and wakes the join handle. The future must be gone already
    /// (`drop_future`): storing drops no user value.
    fn finish(&self, out: Result<F::Output, JoinError>) {
        // SAFETY: we hold `RUNNING` (or own the task exclusively in `cancel`), so nobody
        // else touches the stage until `COMPLETE` is published below.
        unsafe {
            debug_assert!(!matches!(*self.stage.get(), Stage::Running(_)), "finish with the future still in place");
            *self.stage.get() = Stage::Finished(out);
        }
        // A wake racing with this either set `SCHEDULED` before (it pushed nothing: we were
        // `RUNNING`) or sees `COMPLETE` after; either way the bit is dropped here.
        self.state.complete();
        self.join.wake();
        // Done: the registry's reference goes (shutdown has nothing left to cancel here).
        self.pool.tasks.remove(self.key.load(Ordering::Relaxed));
    }

    /// Drops the future and completes the task as cancelled (the caller holds `RUNNING`):
    /// with [`JoinError::Cancelled`], or as tokio does, [`JoinError::Panicked`] if the
    /// future's `Drop` panicked.
    fn finish_cancelled(&self) {
        let out = match self.drop_future() {
            Ok(()) => Err(JoinError::Cancelled),
            Err(p) => Err(JoinError::Panicked(panic_message(p))),
        };
        self.finish(out);
    }
}

impl<F: Future> Drop for Task<F> {
    fn drop(&mut self) {
        // The last reference may go on a worker (the join handle was dropped first: the
        // output is nobody's) or wherever a waker clone ends. The output's — or a future's
        // never run — `Drop` is user code: a panic there must not unwind through a worker
        // (it would die) or through the code that dropped a waker. Caught and dropped, as
        // tokio does when it drops an output nobody joins.
        let stage = std::mem::replace(self.stage.get_mut(), Stage::Consumed);
        let _ = catch_unwind(AssertUnwindSafe(move || drop(stage)));
    }
}

impl<F> Runnable for Task<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn run(self: Arc<Self>) {
        if !self.state.start_run() {
            return;
        }
        // SAFETY: the raw waker borrows `self`'s reference (the vtable's functions treat the
        // pointer as an `Arc<Self>`); it is never dropped (`ManuallyDrop`), so it gives back
        // no reference it did not take, and `self` outlives the poll. Clones take their own.
        let waker = ManuallyDrop::new(unsafe { Waker::from_raw(RawWaker::new(Arc::as_ptr(&self).cast(), &Self::VTABLE)) });
        let mut cx = Context::from_waker(&waker);
        // A ready future is dropped inside the same `catch_unwind` (tokio's harness does the
        // same): a panic in its `Drop` completes the task with that panic, and the output,
        // ready a moment before, is dropped with the unwind.
        let res = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: we hold `RUNNING`: exclusive access to the stage.
            let poll = match unsafe { &mut *self.stage.get() } {
                // SAFETY: the future is never moved while in the stage (the task is
                // heap-allocated and the stage is replaced, not moved, when the future
                // finishes), so pinning it in place is sound.
                Stage::Running(f) => unsafe { Pin::new_unchecked(f) }.poll(&mut cx),
                _ => Poll::Pending,
            };
            if poll.is_ready() {
                // SAFETY: as above; the borrow of the future ended with the poll.
                unsafe { *self.stage.get() = Stage::Consumed };
            }
            poll
        }));
        match res {
            Ok(Poll::Ready(v)) => self.finish(Ok(v)),
            Err(p) => {
                // The poll panicked (or the drop of a ready future did). A panic in the
                // drop of a future whose poll panicked is dropped: the first one is the
                // report.
                let msg = panic_message(p);
                let _ = self.drop_future();
                self.finish(Err(JoinError::Panicked(msg)));
            }
            Ok(Poll::Pending) => match self.state.end_run() {
                AfterPoll::Reschedule => {
                    // Woken while running: that wake left the push to us.
                    // SAFETY: `run` is called by a pool worker (which holds an `Arc<Pool>`) or
                    // by a thread helping through `Engine::executor` (which holds one too), so
                    // the pool outlives this call even if the task is dropped inside it. This
                    // avoids cloning the pool's `Arc` (a shared counter) on every yield.
                    let pool: &Pool = unsafe { &*Arc::as_ptr(&self.pool) };
                    pool.schedule(self, Hint::Yield);
                }
                AfterPoll::Idle => {}
                // The pool shut down during the poll and left the cancellation to us.
                AfterPoll::Cancel => self.finish_cancelled(),
            },
        }
    }

    fn cancel(self: Arc<Self>) {
        if self.state.claim_for_cancel() {
            self.finish_cancelled();
        }
    }

    fn shut_down(self: Arc<Self>) {
        if self.state.shut_down() == Shutdown::Claimed {
            self.finish_cancelled();
        }
    }

    fn bind(&self, key: Key) {
        self.key.store(key, Ordering::Relaxed);
    }
}

/// The waker: a `RawWaker` over the task's `Arc` (as std's `Wake` builds it, but a poll
/// can lend it without touching the reference count).
impl<F> Task<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    const VTABLE: RawWakerVTable = RawWakerVTable::new(Self::clone_waker, Self::wake_waker, Self::wake_by_ref_waker, Self::drop_waker);

    fn wake_by_ref(self: &Arc<Self>) {
        if self.state.wake() == WakeAction::Push {
            self.pool.schedule(self.clone(), Hint::Wake);
        }
    }

    /// # Safety
    /// `p` is `Arc::as_ptr` of a live `Arc<Self>` whose reference the caller holds.
    unsafe fn clone_waker(p: *const ()) -> RawWaker {
        // SAFETY: per the contract, the count is at least one.
        unsafe { Arc::increment_strong_count(p.cast::<Self>()) };
        RawWaker::new(p, &Self::VTABLE)
    }

    /// # Safety
    /// `p` carries one reference (a cloned waker), consumed here.
    unsafe fn wake_waker(p: *const ()) {
        // SAFETY: per the contract.
        let task = unsafe { Arc::from_raw(p.cast::<Self>()) };
        task.wake_by_ref();
    }

    /// # Safety
    /// As `clone_waker`.
    unsafe fn wake_by_ref_waker(p: *const ()) {
        // SAFETY: per the contract; `ManuallyDrop` leaves the caller's reference alone.
        let task = ManuallyDrop::new(unsafe { Arc::from_raw(p.cast::<Self>()) });
        task.wake_by_ref();
    }

    /// # Safety
    /// `p` carries one reference, released here.
    unsafe fn drop_waker(p: *const ()) {
        // SAFETY: per the contract.
        drop(unsafe { Arc::from_raw(p.cast::<Self>()) });
    }
}

/// The join handle's view of a task, without the future's type.
trait Joinable<T>: Send + Sync {
    fn poll_join(&self, cx: &mut Context<'_>) -> Poll<Result<T, JoinError>>;
    fn is_finished(&self) -> bool;
}

impl<F> Joinable<F::Output> for Task<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn poll_join(&self, cx: &mut Context<'_>) -> Poll<Result<F::Output, JoinError>> {
        // Acquire (in `is_complete`): pairs with the release in `finish`.
        if !self.state.is_complete() {
            self.join.register(cx.waker());
            if !self.state.is_complete() {
                return Poll::Pending;
            }
        }
        // SAFETY: `COMPLETE` is set: the pool never touches the stage again, and the join
        // handle (the only other user) is borrowed mutably through `poll`.
        match std::mem::replace(unsafe { &mut *self.stage.get() }, Stage::Consumed) {
            Stage::Finished(out) => Poll::Ready(out),
            _ => Poll::Ready(Err(JoinError::Cancelled)),
        }
    }

    fn is_finished(&self) -> bool {
        self.state.is_complete()
    }
}

/// The output of a spawned task: a `Future` resolving to `Ok(output)`, or to a
/// [`JoinError`] if the task panicked or the runtime shut down first.
///
/// Dropping the handle detaches the task: it keeps running.
pub struct JoinHandle<T> {
    task: Arc<dyn Joinable<T>>,
    _out: PhantomData<fn() -> T>,
}

impl<T> fmt::Debug for JoinHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JoinHandle").field("finished", &self.task.is_finished()).finish()
    }
}

impl<T> JoinHandle<T> {
    /// Whether the task has finished (its output is ready).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Result<T, JoinError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.task.poll_join(cx)
    }
}

// A join handle holds no pinned data.
impl<T> Unpin for JoinHandle<T> {}
