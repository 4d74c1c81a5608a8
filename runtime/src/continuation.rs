//! Continuations [Schuchart 2021]: a callback attached to a request, or to a set of requests,
//! runs once when they complete, with their results (statuses and the buffers given back),
//! instead of a thread waiting or polling for them.
//!
//! A [`ContinuationRequest`] (the proposal's continuation request, `MPIX_Continue_init`)
//! collects continuations: [`attach`](ContinuationRequest::attach) (`MPIX_Continue`),
//! [`attach_all`](ContinuationRequest::attach_all) (`MPIX_Continueall`) and
//! [`attach_any`](ContinuationRequest::attach_any). It is complete when every callback
//! registered on it has run, so a task runtime waits for "all my callbacks done" with one
//! [`wait`](ContinuationRequest::wait), or a task with one
//! [`wait_async`](ContinuationRequest::wait_async) in any executor — or never waits at all
//! and lets the callbacks release its work.
//!
//! A callback takes the request's one attachment (`weft_sync::on_complete`), the slot a
//! sync object would take: a request is attached to a sync object or has a continuation,
//! never both, and the attempt to do both is an error. Each continuation is counted on the
//! continuation request's own sync object (`SyncObject::count_one`: a count with no
//! operation or completion cell behind it, completed after the callback ran), so waiting for them drives progress as every other
//! wait of the rank does, and pending continuations cost no thread.
//!
//! Threads that wait on one continuation request at once all wait for the same thing, the
//! count reaching zero, and the callbacks run on whichever thread completes their requests:
//! one waiter, the *driver*, drives the rank's progress (and so runs the inline callbacks);
//! the others run pool tasks if there are any and otherwise sleep until the count reaches
//! zero or the driver leaves, when one of them takes over. On a machine with fewer cores
//! than threads, waiters that polled beside the driver only took its core and the sender's,
//! and every frame rang a doorbell some of them slept on, to find the driver had the frame.
//!
//! A continuation's callback (with the request's buffer it is given) lives in a *record*, a
//! block with room for 128 bytes of callback (`RECORD_BYTES`) taken at attach from the
//! attaching thread's spare records and given back, before the callback runs, to the spares
//! of the thread that completes it, as the requests' operations are (`operation.rs`:
//! per-thread spares, and a process-wide queue for the extras of a thread that completes
//! more than it attaches, which carries them in batches of 32, a queue operation per batch;
//! a thread that only completes continuations keeps none and hands all on). In the steady state
//! attaching a continuation allocates nothing; a callback too large for a record is boxed
//! (and the box kept in a record). A callback whose request a progress pass completes runs
//! at the end of that pass, once the pass has released the CRI's lock (`deferred.rs`): the
//! record keeps it meanwhile, with the request's outcome, linked into the thread's deferred
//! callbacks, so the callback holds up no other thread that wants the CRI and may post on
//! it. A pool continuation's callback then moves, with the request's result, into a reused
//! task of the pool (`PoolCall`, a spare as records are, with room of its own for the
//! callback): the record goes back before the task is queued, and the completing thread
//! takes one spare, the task.
//!
//! A continuation of a set of requests (`attach_all`, `attach_any`) gives each request a
//! *share* of one *set state*, which holds the set's callback and, for `attach_all`, a slot
//! for each request's result: each share writes its own slot and counts itself off, and the
//! last runs the callback with the slots as its [`Results`] (for `attach_any` the first
//! share takes the callback). Set states are spares as records are, each keeping the
//! storage it grew to, given back with the results (or by the last share of an
//! `attach_any`): in the steady state a set's continuation allocates nothing either.

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::{Arc, Weak};
use std::thread::LocalKey;
use std::time::Duration;

use weft_sync::{Counted, Error, Progress, SignalListener, Status, Step, SyncObject};

use crate::deferred;
use crate::engine::Engine;
use crate::loom::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering};
use crate::progress::sync_hook;
use crate::request::Request;
use crate::runtime::Runtime;
use crate::spares::{SharedSpares, Spares};

/// Who runs a continuation's callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invoke {
    /// The thread that completes the operation: the one whose progress pass matched the
    /// message or saw the send finish, at the end of that pass, once it has released its
    /// locks (or the attaching thread, at once, if the operation had completed already). The
    /// lowest latency and no task, but the thread makes no progress while it runs: for
    /// **short callbacks**, which may post sends and receives and attach continuations, but
    /// must not block or wait for requests (use [`Invoke::Pool`] for that).
    Inline,
    /// A task on the rank's pool ([`Runtime::spawn`]), queued at completion (a reused one,
    /// which keeps the callback itself: none is allocated for it): the callback may take its
    /// time, communicate and wait.
    Pool,
}

/// The error of a continuation attached to a request of another rank.
const OTHER_RANK: Error = Error::InvalidArgument("request of another rank than its continuation request");
/// The error a continuation request reports for a callback that panicked.
const PANICKED: Error = Error::InvalidArgument("continuation callback panicked");

/// A continuation request ([Schuchart 2021], `MPIX_Continue_init`): continuations attached
/// to it run their callbacks when their requests complete, and it is complete when every
/// callback registered on it has run. Made by [`Runtime::continuation_request`]; shared by
/// reference between threads (`Sync`), and reusable: continuations attached after a wait
/// are waited for by the next.
///
/// ```
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use std::sync::Arc;
/// use weft::{Invoke, Runtime};
///
/// let ranks = Runtime::builder().env(false).build_local(2).unwrap();
/// let (a, b) = (ranks[0].world(), ranks[1].world());
/// let cr = ranks[1].continuation_request();
/// let sum = Arc::new(AtomicUsize::new(0));
/// let mut recvs: Vec<_> = (0..4).map(|t| b.irecv(Vec::<u32>::with_capacity(1), 0u32, t).unwrap()).collect();
/// let s = sum.clone();
/// cr.attach_all(&mut recvs, Invoke::Inline, move |results| {
///     let total: u32 = results.into_iter().map(|r| r.unwrap().0[0]).sum();
///     s.store(total as usize, Ordering::Relaxed);
/// })
/// .unwrap();
/// for t in 0..4 {
///     a.send(vec![10 * t as u32], 1, t).unwrap();
/// }
/// cr.wait().unwrap(); // every callback has run
/// assert_eq!(sum.load(Ordering::Relaxed), 60);
/// ```
pub struct ContinuationRequest {
    /// The rank; its pool runs [`Invoke::Pool`] callbacks.
    engine: Arc<Engine>,
    /// The rank's progress, as the waits for the callbacks drive it (made once: a wait
    /// allocates nothing).
    hook: Arc<dyn Progress>,
    /// Counts the callbacks not yet run; its waits drive the rank's progress.
    pending: SyncObject<()>,
    /// Taken by the wait that drives the rank's progress (module docs).
    driven: AtomicBool,
}

/// Longest sleep of a waiter beside the driver: a safety net, not the wake-up mechanism
/// (the count reaching zero and the driver leaving both wake it).
const FOLLOWER_NAP: Duration = Duration::from_millis(50);

impl std::fmt::Debug for ContinuationRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContinuationRequest").field("pending", &self.pending()).finish()
    }
}

impl Runtime {
    /// A continuation request of this rank (`MPIX_Continue_init`): see
    /// [`ContinuationRequest`].
    pub fn continuation_request(&self) -> ContinuationRequest {
        // A sync object without the rank's progress hook: continuations pending in the rank's
        // queues reach it (through their countdowns), and it must not hold the rank in turn,
        // or a rank shut down with continuations pending would never be dropped (nor its
        // callbacks run with `Cancelled`). Its waits are given the hook.
        ContinuationRequest {
            engine: self.engine.clone(),
            hook: sync_hook(&self.engine),
            pending: SyncObject::new(),
            driven: AtomicBool::new(false),
        }
    }
}

/// Completes its callback's count when dropped: `Ok` once the callback returned, else
/// the error of a panic, or `Cancelled` (a pool task dropped unrun: the runtime shut down).
struct Countdown {
    /// The callback's count on the continuation request (`None` once counted down).
    counted: Option<Counted<()>>,
    ran: bool,
}

impl Countdown {
    /// Completes the count with `outcome`, once.
    fn count_down(&mut self, outcome: Result<Status, Error>) {
        if let Some(c) = self.counted.take() {
            c.complete(outcome);
        }
    }
}

impl Drop for Countdown {
    fn drop(&mut self) {
        // Counted down already (an inline callback that ran): nothing to ask.
        if self.counted.is_none() {
            return;
        }
        let outcome = match (self.ran, std::thread::panicking()) {
            (true, _) => Ok(Status::default()),
            (false, true) => Err(PANICKED),
            (false, false) => Err(Error::Cancelled),
        };
        self.count_down(outcome);
    }
}

impl ContinuationRequest {
    /// Attaches a continuation to `req` (`MPIX_Continue`): when it completes, `f` runs once
    /// with its result — the buffer and status, or the error — as `invoke` says; at once if
    /// it has completed already. `req` is left taken (its result went to `f`).
    ///
    /// An error, `req` untouched and `f` dropped unrun, if `req` is attached to a sync
    /// object (or its completion went to one), its result was taken already, or it belongs
    /// to another rank.
    pub fn attach<B, F>(&self, req: &mut Request<'_, B>, invoke: Invoke, f: F) -> Result<(), Error>
    where
        B: Send + 'static,
        F: FnOnce(Result<(B, Status), Error>) + Send + 'static,
    {
        self.check(std::slice::from_ref(req))?;
        let run = self.register(invoke, f);
        req.continue_with(run)
    }

    /// Attaches one continuation to every request of `reqs` (`MPIX_Continueall`): when the
    /// last of them completes, `f` runs once with all their results, in the order of
    /// `reqs` ([`Results`]: an iterator over them, and a slice). Each request is left taken. Checked as [`attach`](Self::attach) for every
    /// request before any is attached: an error leaves them all untouched. An empty set
    /// runs `f` at once.
    pub fn attach_all<B, F>(&self, reqs: &mut [Request<'_, B>], invoke: Invoke, f: F) -> Result<(), Error>
    where
        B: Send + 'static,
        F: FnOnce(Results<B>) + Send + 'static,
    {
        self.check(reqs)?;
        let run = self.register(invoke, f);
        if reqs.is_empty() {
            run(Results::empty());
            return Ok(());
        }
        let set = SetState::with::<_, Slot<B>>(run, reqs.len(), reqs.len());
        attach_shares(reqs, |i| AllShare { set, i, _b: PhantomData })
    }

    /// Attaches one continuation to the set `reqs` that runs when the first of them
    /// completes: `f` gets that request's index in `reqs` and its result. Each request is
    /// left taken; the others go on to complete, and their results are dropped then (a
    /// receive among them still takes the message it matches: for sends, or receives where
    /// one message of several suffices). Checked as [`attach_all`](Self::attach_all); an
    /// empty set is an error.
    pub fn attach_any<B, F>(&self, reqs: &mut [Request<'_, B>], invoke: Invoke, f: F) -> Result<(), Error>
    where
        B: Send + 'static,
        F: FnOnce(usize, Result<(B, Status), Error>) + Send + 'static,
    {
        if reqs.is_empty() {
            return Err(Error::InvalidArgument("a continuation of any request of an empty set"));
        }
        self.check(reqs)?;
        let run = self.register(invoke, move |(i, res)| f(i, res));
        let set = SetState::with::<_, Slot<B>>(run, 0, reqs.len());
        attach_shares(reqs, |i| AnyShare { set, i, _b: PhantomData })
    }

    /// The callbacks registered and not yet run.
    pub fn pending(&self) -> usize {
        self.pending.size()
    }

    /// Makes one step of progress and reports whether every callback registered has run
    /// (`MPI_Test` on the continuation request). A `true` says nothing of the callbacks
    /// attached after it.
    pub fn test(&self) -> bool {
        if self.pending() == 0 {
            return true;
        }
        let _ = self.engine.progress_once();
        self.pending() == 0
    }

    /// Blocks, driving the rank's progress, until every callback registered has run
    /// (`MPI_Wait` on the continuation request); the pool's tasks run meanwhile. An error if
    /// a callback panicked (the panic is caught: it stops neither progress nor the pool), or
    /// never ran because the runtime shut down (`Cancelled`); each such error is reported
    /// once.
    pub fn wait(&self) -> Result<(), Error> {
        self.pending.wait_all_with(&self.helping())
    }

    /// [`wait`](Self::wait) as a future, for a task in any executor (weft's pool, tokio,
    /// ...): resolves once every callback registered has run, to the same result. While
    /// pending, each poll drives the rank's progress and, when that finds nothing, runs a
    /// task of the rank's pool (an [`Invoke::Pool`] callback, say), as a blocking wait does;
    /// then it sleeps until a callback finishes or the network has news. Cancel-safe:
    /// dropped, it changes nothing (the callbacks still run).
    ///
    /// ```
    /// use weft::{Invoke, Runtime};
    /// let ranks = Runtime::builder().env(false).workers(1).build_local(2).unwrap();
    /// let (a, b) = (ranks[0].world(), ranks[1].world());
    /// let cr = ranks[1].continuation_request();
    /// let mut r = b.irecv(Vec::<u8>::with_capacity(2), 0u32, 1).unwrap();
    /// cr.attach(&mut r, Invoke::Pool, |res| assert_eq!(res.unwrap().0, b"ok")).unwrap();
    /// a.send(b"ok".to_vec(), 1, 1).unwrap();
    /// ranks[1].block_on(cr.wait_async()).unwrap();
    /// assert_eq!(cr.pending(), 0);
    /// ```
    pub async fn wait_async(&self) -> Result<(), Error> {
        let helping = self.helping();
        self.pending.drained_with(&helping).await
    }

    /// The progress of one wait for the callbacks.
    fn helping(&self) -> Helping<'_> {
        Helping { rank: &*self.hook, engine: &self.engine, request: self, drives: AtomicBool::new(false) }
    }

    /// Refuses a set of requests of which one is attached to a sync object, taken, or of
    /// another rank: before any is attached, so that a refusal changes nothing.
    fn check<B: Send + 'static>(&self, reqs: &[Request<'_, B>]) -> Result<(), Error> {
        for r in reqs {
            if !Arc::ptr_eq(r.communicator().engine(), &self.engine) {
                return Err(OTHER_RANK);
            }
            r.can_continue()?;
        }
        Ok(())
    }

    /// Counts a callback on this request and wraps `f` to run as `invoke` says and to count
    /// down after it ran.
    fn register<T: Send + 'static>(&self, invoke: Invoke, f: impl FnOnce(T) + Send + 'static) -> impl FnOnce(T) + Send + 'static {
        let countdown = Countdown { counted: Some(self.pending.count_one()), ran: false };
        // Only a pool callback needs the rank (to spawn on): an inline one takes no count of
        // the engine's, a line every thread of the rank reads, at attach nor at completion.
        let rank = (invoke == Invoke::Pool).then(|| Arc::downgrade(&self.engine));
        move |value: T| match rank {
            None => run_counted(countdown, f, value),
            Some(rank) => spawn_counted(&rank, countdown, f, value),
        }
    }
}

/// The progress of a wait for continuations: the driver's (module docs) is the rank's
/// sync-object hook, and when it finds nothing to do, a pool task (an [`Invoke::Pool`]
/// callback, say), so that a wait with no pool workers (`workers(0)`) runs the callbacks it
/// waits for; another waiter's is a pool task, else sleep.
///
/// # Memory ordering
///
/// A waiter beside the driver registers its listener on the count's signal (a `SeqCst`
/// fence, `weft_sync::Signal`) before it reads `driven` to decide to sleep; a driver that
/// leaves clears `driven` before it signals (a `SeqCst` fence, then the listener count). One
/// of the two fences comes first: either the waiter sees `driven` clear and does not sleep,
/// or the driver sees its listener and wakes it.
struct Helping<'a> {
    rank: &'a dyn Progress,
    engine: &'a Engine,
    /// The continuation request waited on (its driver slot and count).
    request: &'a ContinuationRequest,
    /// Whether this wait holds the driver slot (only its own thread or task reads it).
    drives: AtomicBool,
}

impl Helping<'_> {
    /// Whether this wait drives progress: it holds the slot, or takes it now.
    fn drives(&self) -> bool {
        // Relaxed: only this wait writes `drives`.
        if self.drives.load(Ordering::Relaxed) {
            return true;
        }
        // Acquire: pairs with the release of the driver that left.
        let took = !self.request.driven.load(Ordering::Relaxed)
            && self.request.driven.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok();
        if took {
            self.drives.store(true, Ordering::Relaxed);
        }
        took
    }

    /// A step of a waiter beside the driver: a pool task, else sleep.
    fn follow(&self) -> Step {
        if crate::executor::help(&self.engine.executor) {
            Step::Progressed
        } else {
            Step::Park
        }
    }
}

impl Drop for Helping<'_> {
    fn drop(&mut self) {
        // Relaxed: only this wait writes `drives`.
        if self.drives.load(Ordering::Relaxed) {
            // Release: what this driver did is seen by the next. Then the waiters sleeping
            // beside it wake, and one takes over if callbacks remain (memory ordering above).
            self.request.driven.store(false, Ordering::Release);
            self.request.pending.signal();
        }
    }
}

impl Progress for Helping<'_> {
    fn progress(&self) -> Step {
        if !self.drives() {
            return self.follow();
        }
        match self.rank.progress() {
            Step::Progressed => Step::Progressed,
            _ if crate::executor::help(&self.engine.executor) => Step::Progressed,
            step => step,
        }
    }

    fn park(&self, listener: SignalListener<'_>) {
        if self.drives.load(Ordering::Relaxed) {
            self.rank.park(listener);
        } else if self.request.driven.load(Ordering::SeqCst) {
            // SeqCst above: after the listener's registration (memory ordering above). The
            // count reaching zero, or the driver leaving, wakes this waiter.
            let _ = listener.wait_timeout(FOLLOWER_NAP);
        }
        // Else the driver left: back to the caller, whose next step takes over.
    }

    fn poll_progress(&self, cx: &mut std::task::Context<'_>) -> Step {
        if !self.drives() {
            // Someone else drives progress; the count reaching zero or the driver leaving
            // wakes this task through the listener its caller registers.
            return self.follow();
        }
        match self.rank.poll_progress(cx) {
            Step::Progressed => Step::Progressed,
            _ if crate::executor::help(&self.engine.executor) => Step::Progressed,
            step => step,
        }
    }
}

/// Runs `f(value)` here, catching a panic (reported by the continuation request), then
/// counts it down.
fn run_counted<T>(mut countdown: Countdown, f: impl FnOnce(T), value: T) {
    // Counted down here, not by the drop, which would ask whether the thread panics.
    let outcome = match catch_unwind(AssertUnwindSafe(|| f(value))) {
        Ok(()) => Ok(Status::default()),
        // Caught: `countdown` would drop as not panicking any more.
        Err(_) => Err(PANICKED),
    };
    countdown.count_down(outcome);
    // Nothing left to drop: counted down.
    std::mem::forget(countdown);
}

/// Runs `f(value)` on rank `rank`'s pool, counting it down after it ran (dropped unrun at
/// shutdown, or with the rank gone, it counts down as `Cancelled`): in a [`PoolCall`], a
/// reusable task that keeps the callback in its own storage, so that in the steady state a
/// pool continuation allocates nothing, takes one spare (the task) and touches no registry.
fn spawn_counted<T: Send + 'static>(rank: &Weak<Engine>, countdown: Countdown, f: impl FnOnce(T) + Send + 'static, value: T) {
    let Some(engine) = rank.upgrade() else { return };
    let Some(pool) = engine.executor.start(|| engine.clone()) else { return };
    let call = take_spare(&POOL_CALLS, &SHARED_POOL_CALLS).unwrap_or_else(|| Arc::new(PoolCall::new()));
    let callback = move |()| run_counted(countdown, f, value);
    // SAFETY: a spare call is this thread's alone (the task that gave it back let go of it
    // before it ran its callback), and holds none; the queue's push publishes the write to
    // the worker.
    unsafe { call.hold(callback) };
    pool.schedule(call, crate::executor::Hint::Spawn);
}

/// A pool continuation's task (`spawn_counted`): the rank's pool runs it as any task, but it
/// never waits for a wake (its callback is a plain function), so it is always in a run queue
/// or running, and shutdown reaches it there (a queued task is cancelled: the callback
/// dropped unrun). Not in the pool's registry (`executor/task.rs`, "Shutdown"). It keeps its
/// callback in storage of its own (as a record does, `RECORD_BYTES`; a larger callback is
/// boxed), and is given back to the spares when it runs, before its callback does, which
/// then runs from the stack: a callback that attaches the next continuation reuses the task.
struct PoolCall {
    /// The callback, from its scheduling until it runs or is cancelled.
    f: UnsafeCell<Bytes<RECORD_BYTES>>,
    /// Runs (`true`) or drops the callback `f` holds, moved out to the address given; `None`
    /// while the task holds none.
    finish: UnsafeCell<Option<Finish>>,
}

/// Runs (`true`) or drops the callback at the address given, of the type it was made for.
type Finish = unsafe fn(*mut u8, bool);

// SAFETY: `f` and `finish` are written by the thread that schedules the call and then read
// by the one that runs or cancels it, ordered by the run queue; never at once. The callback
// is `Send` (`hold`).
unsafe impl Sync for PoolCall {}

/// A callback moved out of its [`PoolCall`] onto the stack of the thread that runs or drops
/// it.
struct Taken {
    f: Bytes<RECORD_BYTES>,
    finish: Finish,
}

impl Taken {
    /// Runs the callback (`run`), or drops it unrun.
    fn finish(self, run: bool) {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `f` holds the callback `finish` was made for, consumed here once (`this`
        // is not dropped after).
        unsafe { (this.finish)(this.f.0.as_mut_ptr().cast(), run) }
    }
}

impl Drop for Taken {
    /// A callback dropped unrun counts down as `Cancelled` all the same.
    fn drop(&mut self) {
        // SAFETY: as in `finish`; a callback that finished is not dropped.
        unsafe { (self.finish)(self.f.0.as_mut_ptr().cast(), false) }
    }
}

impl PoolCall {
    fn new() -> Self {
        PoolCall { f: UnsafeCell::new(Bytes(MaybeUninit::uninit())), finish: UnsafeCell::new(None) }
    }

    /// Puts `f` in the task (boxed first if it does not fit).
    ///
    /// # Safety
    /// The caller has the task to itself, and it holds no callback.
    unsafe fn hold<F: FnOnce(()) + Send + 'static>(&self, f: F) {
        // SAFETY: the caller's contract.
        unsafe {
            if InRecord::<(), F>::FITS {
                self.put(f);
            } else {
                self.put(Box::new(f));
            }
        }
    }

    /// Puts `f`, which fits the task's storage, in the task.
    ///
    /// # Safety
    /// As [`hold`](Self::hold).
    unsafe fn put<F: FnOnce(()) + Send + 'static>(&self, f: F) {
        /// Runs or drops the `F` at `at`.
        unsafe fn finish<F: FnOnce(())>(at: *mut u8, run: bool) {
            // SAFETY: `at` holds an `F` not taken yet, taken this once (`Taken::finish`).
            let f = unsafe { at.cast::<F>().read() };
            if run {
                f(());
            }
        }
        assert!(InRecord::<(), F>::FITS, "a callback larger than a pool continuation's task");
        // SAFETY: the task is the caller's alone (contract); the storage is large and
        // aligned enough for an `F` (checked above).
        unsafe {
            self.f.get().cast::<F>().write(f);
            *self.finish.get() = Some(finish::<F>);
        }
    }

    /// Moves the callback out and gives the task back to this thread's spares.
    fn take(self: Arc<Self>) -> Option<Taken> {
        // SAFETY: the queue handed this call to this thread alone (struct docs); the bytes of
        // the callback are moved out (a move is a copy of them), once, as `finish` is taken.
        let taken = unsafe { (*self.finish.get()).take().map(|finish| Taken { f: self.f.get().read(), finish }) };
        give_spare(&POOL_CALLS, self);
        taken
    }
}

impl Drop for PoolCall {
    /// A task dropped holding its callback (no queue ran or cancelled it) drops it unrun.
    fn drop(&mut self) {
        if let Some(finish) = self.finish.get_mut().take() {
            // SAFETY: `f` holds the callback `finish` was made for, moved out this once.
            drop(Taken { f: unsafe { self.f.get().read() }, finish });
        }
    }
}

impl crate::executor::Runnable for PoolCall {
    fn run(self: Arc<Self>) {
        if let Some(t) = self.take() {
            // `run_counted` catches a panic of the callback: none reaches the worker.
            t.finish(true);
        }
    }

    fn cancel(self: Arc<Self>) {
        if let Some(t) = self.take() {
            // The callback's countdown, dropped unrun, reports `Cancelled`.
            t.finish(false);
        }
    }

    fn shut_down(self: Arc<Self>) {
        self.cancel();
    }

    fn bind(&self, _key: crate::executor::Key) {}
}

/// Spare pool-continuation tasks a thread keeps.
const POOL_CALLS_MAX: usize = 1024;

/// The process-wide queue of spare pool-continuation tasks.
static SHARED_POOL_CALLS: SharedSpares<Arc<PoolCall>> = SharedSpares::new(SHARED_SPARES_MAX);

thread_local! {
    /// A thread's spare pool-continuation tasks (kept and handed on as its records are).
    static POOL_CALLS: Spares<Arc<PoolCall>, POOL_CALLS_MAX> = const { Spares::new(&SHARED_POOL_CALLS) };
}

/// Bytes of a continuation record's callback (module docs): room for a callback with the
/// request's buffer and a few words of its own.
const RECORD_BYTES: usize = 128;

/// Bytes of a continuation record's argument, kept there while the callback is deferred
/// (`deferred.rs`): a request's outcome.
const ARG_BYTES: usize = 48;

/// Spare records a thread keeps; beyond this many the extras go to the shared queue.
const SPARES_MAX: usize = 1024;

/// Records the process-wide queue keeps; beyond this many the extras are freed.
const SHARED_SPARES_MAX: usize = 16384;

/// Storage of `N` bytes for a value of any alignment up to 16.
#[repr(C, align(16))]
struct Bytes<const N: usize>(MaybeUninit<[u8; N]>);

/// The storage of one callback (module docs): the callback, and while it is deferred (its
/// request completed inside a progress pass) the link that queues it and its argument.
#[repr(C)]
struct Record {
    /// First: a deferred record is linked by its address.
    node: MaybeUninit<deferred::Node>,
    arg: Bytes<ARG_BYTES>,
    f: Bytes<RECORD_BYTES>,
}

// SAFETY: a spare record is plain memory; the link in it is only read by the thread that
// deferred the record, while the record is not a spare.
unsafe impl Send for Record {}

// An outcome, a continuation's usual argument, is deferred in its record.
const _: () = assert!(std::mem::size_of::<weft_sync::Outcome>() <= ARG_BYTES);

/// The process-wide queue of spare records.
static SHARED_RECORDS: SharedSpares<Box<Record>> = SharedSpares::new(SHARED_SPARES_MAX);

thread_local! {
    /// A thread's spare records. Boxes, not records in a vector: a record leaves as its own
    /// allocation, whose address a pending continuation holds.
    /// Only a thread that attaches keeps them (as many as it took, `spares.rs`); one that
    /// only completes continuations (a waiter, a pool worker) hands their records to the
    /// threads that attach, in batches (`spares::BATCH`).
    static SPARES: Spares<Box<Record>, SPARES_MAX> = const { Spares::new(&SHARED_RECORDS) };
    /// A thread's spare set states (as its records).
    static SET_SPARES: Spares<Box<SetState>, SET_SPARES_MAX> = const { Spares::new(&SHARED_SETS) };
}

/// A spare of this thread's `local`, else of another thread's (`shared`).
#[inline]
fn take_spare<T, const MAX: usize>(local: &'static LocalKey<Spares<T, MAX>>, shared: &'static SharedSpares<T>) -> Option<T> {
    local.try_with(Spares::take).unwrap_or_else(|_| shared.take())
}

/// Keeps `spare` for this thread's next continuation (in `local`); a thread that does not
/// attach hands it to the threads that do, in batches (`spares::BATCH`).
#[inline]
fn give_spare<T, const MAX: usize>(local: &'static LocalKey<Spares<T, MAX>>, spare: T) {
    // A thread being torn down frees it.
    let _ = local.try_with(|s| s.keep(spare));
}

/// A spare record of this thread, else of another (a batch of them, else one), else a new
/// one.
#[inline]
fn take_record() -> Box<Record> {
    take_spare(&SPARES, &SHARED_RECORDS).unwrap_or_else(|| {
        Box::new(Record { node: MaybeUninit::uninit(), arg: Bytes(MaybeUninit::uninit()), f: Bytes(MaybeUninit::uninit()) })
    })
}

/// Keeps `r` for this thread's next continuation; a thread that does not attach adds it to
/// its outgoing batch for the threads that do.
#[inline]
fn give_record(r: Box<Record>) {
    give_spare(&SPARES, r);
}

/// A callback `F` of argument `A` in a record of its own (module docs); run or dropped, it
/// gives the record back.
struct InRecord<A, F: FnOnce(A)> {
    /// The record, holding an `F` not yet taken.
    record: NonNull<Record>,
    _f: PhantomData<(fn(A), F)>,
}

// SAFETY: the handle owns the `F` in its record (as a `Box<F>` would); the record itself is
// plain memory.
unsafe impl<A, F: FnOnce(A) + Send> Send for InRecord<A, F> {}

impl<A, F: FnOnce(A)> InRecord<A, F> {
    /// Whether an `F` fits a record.
    const FITS: bool = std::mem::size_of::<F>() <= RECORD_BYTES && std::mem::align_of::<F>() <= 16;

    /// Whether an `A` fits a record's argument (else a deferred callback could not keep it:
    /// it runs at once).
    const ARG_FITS: bool = std::mem::size_of::<A>() <= ARG_BYTES && std::mem::align_of::<A>() <= 16;

    /// Puts `f` in a record; `F` must fit ([`Self::FITS`]).
    fn new(f: F) -> Self {
        assert!(Self::FITS, "a callback larger than a record");
        let record = NonNull::from(Box::leak(take_record()));
        // SAFETY: the record is ours, and large and aligned enough for an `F` (checked above).
        unsafe { Self::f(record).write(f) };
        InRecord { record, _f: PhantomData }
    }

    /// Where `record` keeps its callback.
    fn f(record: NonNull<Record>) -> *mut F {
        // SAFETY: in bounds of the record (a field's address).
        unsafe { std::ptr::addr_of_mut!((*record.as_ptr()).f).cast() }
    }

    /// Where `record` keeps a deferred callback's argument.
    fn arg(record: NonNull<Record>) -> *mut A {
        // SAFETY: in bounds of the record (a field's address).
        unsafe { std::ptr::addr_of_mut!((*record.as_ptr()).arg).cast() }
    }

    /// Runs the callback with `a`: now, or, inside a progress pass, once the pass has let go
    /// of its locks (`deferred.rs`). The record goes back to the spares before the callback
    /// runs, so a callback that attaches the next continuation reuses it.
    #[inline]
    fn call(self, a: A) {
        if !Self::ARG_FITS {
            return self.take()(a);
        }
        let this = ManuallyDrop::new(self);
        let record = this.record;
        // SAFETY: the record is this handle's, which is consumed here (not dropped): it
        // holds the callback, and the argument written here (`ARG_FITS`), until
        // `run_deferred` takes both, once, or, not deferred, `run_deferred` runs now; nobody
        // else touches it until then.
        unsafe {
            Self::arg(record).write(a);
            let node = record.cast::<deferred::Node>();
            node.as_ptr().write(deferred::Node::new(Self::run_deferred));
            if !deferred::defer(node) {
                Self::run_deferred(node);
            }
        }
    }

    /// Runs a callback [`call`](Self::call) has put in its record with its argument.
    ///
    /// # Safety
    /// `node` heads a record that `call` filled for an `InRecord<A, F>`, run this once.
    unsafe fn run_deferred(node: NonNull<deferred::Node>) {
        let record = node.cast::<Record>();
        // SAFETY: the record holds the callback and its argument (contract); it was leaked
        // from a `Box` in `new` and is given back this once.
        let (f, a) = unsafe {
            let (f, a) = (Self::f(record).read(), Self::arg(record).read());
            give_record(Box::from_raw(record.as_ptr()));
            (f, a)
        };
        f(a);
    }

    /// Takes the callback out and gives the record back.
    fn take(self) -> F {
        let this = ManuallyDrop::new(self);
        // SAFETY: `this` is not dropped: its callback is taken this once.
        unsafe { this.take_out() }
    }

    /// Moves the callback out of the record and gives the record back.
    ///
    /// # Safety
    /// Once per handle: the record holds an `F` not taken yet (type invariant) until then,
    /// and the handle must not be used after.
    unsafe fn take_out(&self) -> F {
        // SAFETY: per the contract the record holds an `F` not taken yet; the record was
        // leaked from a `Box` in `new` and is given back this once.
        unsafe {
            let f = Self::f(self.record).read();
            give_record(Box::from_raw(self.record.as_ptr()));
            f
        }
    }
}

impl<A, F: FnOnce(A)> Drop for InRecord<A, F> {
    fn drop(&mut self) {
        // SAFETY: a handle is dropped once, and one whose callback was taken is not dropped.
        drop(unsafe { self.take_out() });
    }
}

/// `f` in a record (module docs), boxed first when it does not fit: small enough (one word)
/// for a completion cell's attachment, so that attaching it allocates nothing in the steady
/// state. Run by a progress pass, it runs after the pass has released its locks
/// ([`InRecord::call`]).
pub(crate) fn in_record<A, F>(f: F) -> impl FnOnce(A) + Send + 'static
where
    A: 'static,
    F: FnOnce(A) + Send + 'static,
{
    enum Held<A, F: FnOnce(A)> {
        Record(InRecord<A, F>),
        Boxed(InRecord<A, Box<F>>),
    }
    let held = if InRecord::<A, F>::FITS { Held::Record(InRecord::new(f)) } else { Held::Boxed(InRecord::new(Box::new(f))) };
    move |a: A| match held {
        Held::Record(r) => r.call(a),
        Held::Boxed(r) => r.call(a),
    }
}

/// Spare set states a thread keeps (each may hold a set's storage of any size: fewer than
/// records).
const SET_SPARES_MAX: usize = 64;

/// Set states the process-wide queue keeps.
const SHARED_SET_SPARES_MAX: usize = 1024;

/// The process-wide queue of spare set states.
static SHARED_SETS: SharedSpares<Box<SetState>> = SharedSpares::new(SHARED_SET_SPARES_MAX);

/// The result of one request of a set.
type Slot<B> = Result<(B, Status), Error>;

/// A block of a set's storage.
#[repr(C, align(16))]
struct Block(MaybeUninit<[u8; 16]>);

/// The state a continuation of a set of requests shares between its requests' callbacks
/// (their *shares*): the set's callback and, for [`attach_all`](ContinuationRequest::attach_all),
/// a slot for each request's result, in storage of its own that a spare state keeps (it only
/// grows), so that in the steady state a set allocates nothing. Taken at attach as records
/// are, and given back by the share that arrives last, or with the [`Results`] its callback
/// got.
///
/// Each share writes its own slot, then counts itself off `left` (release); the last (acquire)
/// reads them all: the slots need no lock.
struct SetState {
    /// The shares not yet arrived.
    left: AtomicUsize,
    /// `attach_all`: a share was dropped unrun (the set's callback will not run);
    /// `attach_any`: a share took the callback.
    flag: AtomicBool,
    /// The slots (results) of the set: its requests for `attach_all`, none for `attach_any`.
    slots: usize,
    /// The set's callback, then its slots (see [`SetState::parts`]).
    storage: Vec<Block>,
    /// The start of `storage`, taken while it was borrowed mutably: the shares write through
    /// it from any thread.
    base: NonNull<Block>,
}

// SAFETY: the callback and slots behind `base` are `Send` (the typed shares that reach them
// require it); the rest is atomics.
unsafe impl Send for SetState {}
// SAFETY: the shares of other threads reach the state together: through its atomics, and
// each through its own slot (the callback goes to one of them, ordered by the atomics).
unsafe impl Sync for SetState {}

impl SetState {
    /// Bytes of storage a callback `R` and `slots` slots of `T` need, aligned anywhere in it.
    const fn bytes<R, T>(slots: usize) -> usize {
        std::mem::size_of::<R>() + std::mem::align_of::<R>() + slots * std::mem::size_of::<T>() + std::mem::align_of::<T>()
    }

    /// A spare state (else a new one) holding `run`, with `slots` slots of `T` and `shares`
    /// shares to arrive; leaked until the last share, or the results, give it back.
    fn with<R, T>(run: R, slots: usize, shares: usize) -> Set<R> {
        let mut s = take_spare(&SET_SPARES, &SHARED_SETS).unwrap_or_else(|| {
            Box::new(SetState {
                left: AtomicUsize::new(0),
                flag: AtomicBool::new(false),
                slots: 0,
                storage: Vec::new(),
                base: NonNull::dangling(),
            })
        });
        let blocks = Self::bytes::<R, T>(slots).div_ceil(std::mem::size_of::<Block>());
        if s.storage.len() < blocks {
            s.storage.resize_with(blocks, || Block(MaybeUninit::uninit()));
        }
        // New atomics: a spare's may be of a model execution past, under loom.
        s.left = AtomicUsize::new(shares);
        s.flag = AtomicBool::new(false);
        s.slots = slots;
        s.base = NonNull::new(s.storage.as_mut_ptr()).expect("a vector's buffer");
        let set = NonNull::from(Box::leak(s));
        // SAFETY: the storage is large enough (above), and nothing else holds the state yet.
        unsafe { Self::parts::<R, T>(set).0.write(run) };
        Set(set, PhantomData)
    }

    /// Where a state of callback `R` and slots of `T` keeps the callback and the first slot.
    ///
    /// # Safety
    /// `set` is a live state made by [`with::<R, T>`](Self::with).
    unsafe fn parts<R, T>(set: NonNull<SetState>) -> (*mut R, *mut T) {
        /// `at`, rounded up to an address aligned for `U`.
        fn aligned<U>(at: *mut u8) -> *mut U {
            let align = std::mem::align_of::<U>();
            at.wrapping_add((align - at as usize % align) % align).cast()
        }
        // SAFETY: the state is live (contract); `base` and the offsets stay within its
        // storage, sized by `bytes::<R, T>`.
        unsafe {
            let run = aligned::<R>((*set.as_ptr()).base.as_ptr().cast());
            (run, aligned::<T>(run.cast::<u8>().add(std::mem::size_of::<R>())))
        }
    }

    /// Counts one share off; whether it was the last (which then sees every share's writes).
    ///
    /// # Safety
    /// `set` is live and the caller's share has not arrived yet.
    unsafe fn arrive(set: NonNull<SetState>) -> bool {
        // SAFETY: live (contract).
        let last = unsafe { set.as_ref() }.left.fetch_sub(1, Ordering::Release) == 1;
        if last {
            // Pairs with every other share's release above.
            fence(Ordering::Acquire);
        }
        last
    }

    /// Gives a state whose shares have all arrived, its callback and slots moved out or
    /// dropped, back to the spares.
    ///
    /// # Safety
    /// Once, after the last share arrived; nothing uses `set` after.
    unsafe fn recycle(set: NonNull<SetState>) {
        // SAFETY: leaked from a `Box` in `with`, and given back this once (contract).
        give_spare(&SET_SPARES, unsafe { Box::from_raw(set.as_ptr()) });
    }
}

/// A set state holding a callback `R`.
struct Set<R>(NonNull<SetState>, PhantomData<fn(R)>);

impl<R> Clone for Set<R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R> Copy for Set<R> {}

/// A request's share of a set's continuation.
trait Share<B>: Send + 'static {
    /// The request completed with `res`.
    fn complete(self, res: Slot<B>);
}

/// Attaches share `share(i)` to request `i` of `reqs`; if one is refused (`reqs` were checked:
/// it does not happen), the shares of it and of the requests after it go as dropped unrun.
fn attach_shares<B: Send + 'static, S: Share<B>>(reqs: &mut [Request<'_, B>], share: impl Fn(usize) -> S) -> Result<(), Error> {
    for (i, r) in reqs.iter_mut().enumerate() {
        let s = share(i);
        if let Err(e) = r.continue_with(move |res| s.complete(res)) {
            (i + 1..reqs.len()).for_each(|i| drop(share(i)));
            return Err(e);
        }
    }
    Ok(())
}

/// Request `i`'s share of an `attach_all` set of callback `R`: completed, it writes its slot,
/// and the last runs the callback with the results; dropped unrun (an operation dropped
/// pending), it writes `Cancelled` and the set's callback is dropped unrun (as each request's
/// own would be).
struct AllShare<B, R: FnOnce(Results<B>)> {
    set: Set<R>,
    i: usize,
    _b: PhantomData<fn(B)>,
}

// SAFETY: a share reaches its slot (of `B`s) and the callback `R`, both `Send`.
unsafe impl<B: Send, R: FnOnce(Results<B>) + Send> Send for AllShare<B, R> {}

impl<B: Send + 'static, R: FnOnce(Results<B>) + Send + 'static> Share<B> for AllShare<B, R> {
    /// Writes the request's result; the last share runs the callback.
    fn complete(self, res: Slot<B>) {
        let this = ManuallyDrop::new(self);
        // SAFETY: the share is consumed here, once.
        unsafe { this.arrive(res) }
    }
}

impl<B, R: FnOnce(Results<B>)> AllShare<B, R> {
    /// # Safety
    /// Once per share.
    unsafe fn arrive(&self, res: Slot<B>) {
        let set = self.set.0;
        // SAFETY: the state lives until every share arrived, and slot `i` is this share's.
        unsafe {
            let (run, slots) = SetState::parts::<R, Slot<B>>(set);
            slots.add(self.i).write(res);
            if !SetState::arrive(set) {
                return;
            }
            let run = run.read();
            let results = Results { set: Some(set), slots, front: 0, len: set.as_ref().slots };
            if set.as_ref().flag.load(Ordering::Relaxed) {
                // A share dropped unrun: the callback drops unrun too, as do the results.
                drop(results);
                drop(run);
            } else {
                run(results);
            }
        }
    }
}

impl<B, R: FnOnce(Results<B>)> Drop for AllShare<B, R> {
    fn drop(&mut self) {
        // SAFETY: live until this share arrives (below, once: `complete` forgets it).
        unsafe {
            self.set.0.as_ref().flag.store(true, Ordering::Relaxed);
            self.arrive(Err(Error::Cancelled));
        }
    }
}

/// Request `i`'s share of an `attach_any` set of callback `R`: the first to complete takes
/// the callback and runs it with its result; the others' results are dropped. The last share
/// to arrive, completed or dropped unrun, drops the callback if none took it.
struct AnyShare<B, R: FnOnce((usize, Slot<B>))> {
    set: Set<R>,
    i: usize,
    _b: PhantomData<fn(B)>,
}

// SAFETY: a share reaches the callback `R`, `Send`.
unsafe impl<B, R: FnOnce((usize, Slot<B>)) + Send> Send for AnyShare<B, R> {}

impl<B: 'static, R: FnOnce((usize, Slot<B>)) + Send + 'static> Share<B> for AnyShare<B, R> {
    /// Runs the callback with `res` if no other share took it first.
    fn complete(self, res: Slot<B>) {
        let this = ManuallyDrop::new(self);
        let set = this.set.0;
        // SAFETY: the state lives until this share arrives (below, once: `this` is not
        // dropped); the flag gives the callback to one share.
        let run = unsafe {
            // Relaxed: only who takes it matters; the callback was written before any share
            // was attached, and the last share sees the flag through `arrive`.
            let taken = set.as_ref().flag.swap(true, Ordering::Relaxed);
            let run = (!taken).then(|| SetState::parts::<R, Slot<B>>(set).0.read());
            Self::arrive(set);
            run
        };
        if let Some(run) = run {
            run((this.i, res));
        }
    }
}

impl<B, R: FnOnce((usize, Slot<B>))> AnyShare<B, R> {
    /// Counts a share off; the last drops the callback if no share took it, and recycles the
    /// state.
    ///
    /// # Safety
    /// Once per share.
    unsafe fn arrive(set: NonNull<SetState>) {
        // SAFETY: live until the last share arrived, which alone goes on.
        unsafe {
            if SetState::arrive(set) {
                if !set.as_ref().flag.load(Ordering::Relaxed) {
                    drop(SetState::parts::<R, Slot<B>>(set).0.read());
                }
                SetState::recycle(set);
            }
        }
    }
}

impl<B, R: FnOnce((usize, Slot<B>))> Drop for AnyShare<B, R> {
    fn drop(&mut self) {
        // SAFETY: once (`complete` forgets the share).
        unsafe { Self::arrive(self.set.0) }
    }
}

/// The results of a set of requests of buffers `B` ([`ContinuationRequest::attach_all`]),
/// in the order of the set: an iterator that yields them by value, and a slice of those not
/// yet taken. They live in the set's storage, reused for a later set once they are dropped
/// (module docs): a set's continuation allocates nothing in the steady state.
pub struct Results<B> {
    /// The set state holding the slots (`None` for an empty set).
    set: Option<NonNull<SetState>>,
    /// The first slot.
    slots: *mut Slot<B>,
    /// The first slot not yet taken.
    front: usize,
    len: usize,
}

// SAFETY: the results own their slots, as a `Vec` of them would.
unsafe impl<B: Send> Send for Results<B> {}
// SAFETY: as above: `&Results` reaches the slots as `&[Slot<B>]`.
unsafe impl<B: Sync> Sync for Results<B> {}

impl<B> Results<B> {
    /// The results of an empty set.
    fn empty() -> Self {
        Results { set: None, slots: NonNull::dangling().as_ptr(), front: 0, len: 0 }
    }

    /// The results not yet taken.
    pub fn len(&self) -> usize {
        self.len - self.front
    }

    /// Whether every result was taken (or the set was empty).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<B> std::ops::Deref for Results<B> {
    type Target = [Result<(B, Status), Error>];
    fn deref(&self) -> &Self::Target {
        // SAFETY: the slots from `front` to `len` hold results not taken.
        unsafe { std::slice::from_raw_parts(self.slots.add(self.front), self.len()) }
    }
}

impl<B> std::ops::DerefMut for Results<B> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        // SAFETY: as in `deref`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.slots.add(self.front), self.len()) }
    }
}

impl<B> Iterator for Results<B> {
    type Item = Result<(B, Status), Error>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.front == self.len {
            return None;
        }
        self.front += 1;
        // SAFETY: slot `front - 1` holds a result not taken, taken now this once.
        Some(unsafe { self.slots.add(self.front - 1).read() })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.len(), Some(self.len()))
    }
}

impl<B> ExactSizeIterator for Results<B> {}

impl<B: std::fmt::Debug> std::fmt::Debug for Results<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<B> Drop for Results<B> {
    fn drop(&mut self) {
        // SAFETY: the results not taken are dropped this once; the state's shares have all
        // arrived, and these results were the last of it in use.
        unsafe {
            std::ptr::drop_in_place::<[Slot<B>]>(&mut **self);
            if let Some(set) = self.set {
                SetState::recycle(set);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A result holding `token`.
    fn ok<T>(token: T) -> Slot<T> {
        Ok((token, Status::default()))
    }

    /// The shares of an `all` set of three tokens: every result reaches the callback in order,
    /// those not taken are dropped with the results; a share dropped unrun drops the callback
    /// and the results instead. Every token and capture is dropped once.
    #[test]
    fn all_shares_run_once_or_drop_everything() {
        let token = Arc::new(());
        let got = Arc::new(Mutex::new(Vec::new()));
        for dropped in [None, Some(0), Some(2)] {
            let (t, g) = (token.clone(), got.clone());
            let run = move |mut results: Results<Arc<()>>| {
                let _held = &t;
                assert_eq!(results.len(), 3);
                let first = results.next().unwrap().unwrap().0;
                g.lock().unwrap().push((Arc::strong_count(&first), results.len()));
            };
            let set = SetState::with::<_, Slot<Arc<()>>>(run, 3, 3);
            // Completed backwards: the slots keep the set's order.
            for i in (0..3).rev() {
                let share = AllShare::<Arc<()>, _> { set, i, _b: PhantomData };
                if dropped == Some(i) {
                    drop(share);
                } else {
                    share.complete(ok(token.clone()));
                }
            }
        }
        // The callback ran once, when no share was dropped, with the three tokens (and its
        // capture's) alive.
        assert_eq!(*got.lock().unwrap(), vec![(5, 2)]);
        assert_eq!(Arc::strong_count(&token), 1, "every token and capture dropped once");
    }

    /// The shares of an `any` set: the first to complete runs the callback, once; a set whose
    /// shares were all dropped drops it unrun.
    #[test]
    fn any_shares_run_the_first_once_or_drop_the_callback() {
        let token = Arc::new(());
        let ran = Arc::new(Mutex::new(Vec::new()));
        for completes in [true, false] {
            let (t, r) = (token.clone(), ran.clone());
            let run = move |(i, res): (usize, Slot<Arc<()>>)| {
                let _held = &t;
                assert!(res.is_ok());
                r.lock().unwrap().push(i);
            };
            let set = SetState::with::<_, Slot<Arc<()>>>(run, 0, 3);
            let share = |i| AnyShare::<Arc<()>, _> { set, i, _b: PhantomData };
            let (s0, s1, s2) = (share(0), share(1), share(2));
            if completes {
                s2.complete(ok(token.clone()));
                s0.complete(ok(token.clone()));
            } else {
                drop(s2);
                drop(s0);
            }
            drop(s1);
        }
        assert_eq!(*ran.lock().unwrap(), vec![2]);
        assert_eq!(Arc::strong_count(&token), 1, "every token and capture dropped once");
    }

    /// A callback and results of any alignment and size fit a spare state's storage, which
    /// grows for a larger set.
    #[test]
    fn set_storage_aligns_and_grows() {
        #[derive(Debug, PartialEq)]
        #[repr(align(64))]
        struct Wide(u64);
        let sums = Arc::new(Mutex::new(Vec::new()));
        for n in [1, 5, 40] {
            let s = sums.clone();
            let big = [n as u64; 20];
            let run = move |results: Results<Wide>| {
                let mut sum = big[0];
                for r in results {
                    let w = r.unwrap().0;
                    assert_eq!(&w as *const Wide as usize % 64, 0);
                    sum += w.0;
                }
                s.lock().unwrap().push(sum);
            };
            let set = SetState::with::<_, Slot<Wide>>(run, n, n);
            for i in 0..n {
                AllShare::<Wide, _> { set, i, _b: PhantomData }.complete(ok(Wide(i as u64)));
            }
        }
        assert_eq!(*sums.lock().unwrap(), vec![1, 5 + 10, 40 + 780]);
    }

    /// A pool continuation's callback waits in its task, not in a record: scheduling one
    /// takes no record from the completing thread's spares (it took one, which went to the
    /// spares of the thread that ran the callback).
    #[test]
    fn a_pool_continuation_takes_no_record() {
        use crate::Runtime;
        use std::time::{Duration, Instant};
        let rts = Runtime::builder().env(false).cris(1).workers(1).build_local(2).unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        let cr = rts[1].continuation_request();
        let records = || SPARES.with(|s| s.len());
        // Inline first: this thread then keeps a record or more.
        for invoke in [Invoke::Inline, Invoke::Pool] {
            a.send(vec![1u8], 1, 1).unwrap();
            let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
            let deadline = Instant::now() + Duration::from_secs(10);
            while !r.test() {
                assert!(Instant::now() < deadline, "the message never arrived");
            }
            let before = records();
            // Complete already: run, or scheduled on the pool, at once by this thread.
            cr.attach(&mut r, invoke, |res| assert_eq!(res.unwrap().0, vec![1])).unwrap();
            if invoke == Invoke::Pool {
                assert!(before > 0);
                assert_eq!(records(), before, "a pool callback took a record");
            }
            cr.wait().unwrap();
        }
    }

    /// A pool callback queued on a worker's own queue (attached by a pool callback running on
    /// that worker to a receive complete already) when its rank shuts down is dropped unrun by
    /// the worker as it leaves, and counts down as `Cancelled`: no registry entry is needed to
    /// reach it. (`tests/continuation_reentry.rs` has one queued on the pool's injector.)
    #[test]
    fn a_pool_callback_on_a_workers_queue_is_cancelled_at_shutdown() {
        use crate::Runtime;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::mpsc;
        use std::time::{Duration, Instant};
        let rts = Runtime::builder().env(false).cris(1).workers(1).build_local(2).unwrap();
        let cr = Arc::new(rts[1].continuation_request());
        let ran = Arc::new(AtomicUsize::new(0));
        let (queued_tx, queued) = mpsc::channel();
        {
            let (a, b) = (rts[0].world(), rts[1].world());
            let mut first = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
            let (comm, engine, c, second_ran) = (b.clone(), rts[1].engine.clone(), cr.clone(), ran.clone());
            cr.attach(&mut first, Invoke::Pool, move |_| {
                let deadline = Instant::now() + Duration::from_secs(10);
                let mut second = comm.irecv(Vec::<u8>::with_capacity(1), 0u32, 2).unwrap();
                while !second.test() && Instant::now() < deadline {}
                // Complete already: queued at once, on this worker's own queue.
                c.attach(&mut second, Invoke::Pool, move |_| {
                    second_ran.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
                queued_tx.send(()).unwrap();
                // Returns once the pool is shutting down (its worker then leaves its loop).
                while engine.executor.get().is_some() && Instant::now() < deadline {
                    std::thread::yield_now();
                }
            })
            .unwrap();
            a.send(vec![2u8], 1, 2).unwrap();
            a.send(vec![1u8], 1, 1).unwrap();
        }
        // This thread completes the first receive (the pool starts with its callback's task).
        let deadline = Instant::now() + Duration::from_secs(10);
        while queued.try_recv().is_err() {
            assert!(Instant::now() < deadline, "the first callback did not run");
            rts[1].progress();
        }
        assert_eq!(cr.pending(), 2, "the first callback runs, the second is queued");
        drop(rts);
        assert_eq!(cr.wait().unwrap_err(), Error::Cancelled);
        assert_eq!(cr.pending(), 0);
        assert_eq!(ran.load(Ordering::Relaxed), 0, "the queued callback never ran");
    }

    /// A receive completed by the rank's courier (a peer lost while the courier sends the
    /// frames deferred behind its full inbox: the frames that peer sent are delivered first)
    /// runs its inline callback after the courier's pass let go of its locks, so the callback
    /// may post on that CRI, in every progress mode; run inside the pass, it waited for good
    /// for the lock its own thread held.
    #[test]
    fn a_callback_completed_by_the_courier_may_post() {
        use crate::{ProgressMode, Runtime};
        use std::sync::mpsc;
        use std::time::Duration;
        for mode in [ProgressMode::Concurrent, ProgressMode::Owner, ProgressMode::Global] {
            let rts = Runtime::builder().env(false).progress(mode).cris(1).inbox_capacity(2).build_local(2).unwrap();
            let (a, b) = (rts[0].world().clone(), rts[1].world().clone());
            let cr = rts[1].continuation_request();
            let (tx, posted) = mpsc::channel();
            let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
            let c = b.clone();
            cr.attach(&mut r, Invoke::Inline, move |res| {
                // A send on the CRI whose frame completed the receive (to this rank itself).
                let sent = c.isend(res.map(|(buf, _)| buf).unwrap_or_default(), 1, 2).map(drop);
                let _ = tx.send(sent);
            })
            .unwrap();
            // Rank 0's inbox full (nobody progresses rank 0): rank 1's third send is deferred
            // (after the 20 ms a refused send is retried) and summons rank 1's courier.
            let sends: Vec<_> = (0..3u8).map(|i| b.isend(vec![i], 0, 3).unwrap()).collect();
            // The frame the callback's receive matches, in rank 1's inbox, then rank 0 is lost.
            a.send(vec![9u8], 1, 1).unwrap();
            rts[0].engine.transport.close();
            let got = posted.recv_timeout(Duration::from_secs(10));
            if got.is_err() {
                // The courier is stuck: leave the ranks behind rather than join it.
                std::mem::forget((rts, cr, sends));
                panic!("{mode:?}: the callback did not post (it waited for its own thread's lock)");
            }
            assert!(got.unwrap().is_ok(), "{mode:?}: the callback's send");
            drop(sends);
        }
    }
}
