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
//! block of 128 bytes (`RECORD_BYTES`) taken at attach from the attaching thread's spare
//! records and given back, before the callback runs, to the spares of the thread that
//! completes it, as the requests' operations are (`operation.rs`: per-thread spares, and a
//! process-wide queue for the extras of a thread that completes more than it attaches; a
//! thread that only completes continuations keeps none). In the steady state attaching a
//! continuation allocates nothing; a callback too large for a record is boxed.

use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::mem::{ManuallyDrop, MaybeUninit};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use weft_sync::{Counted, Error, Progress, SignalListener, Status, Step, SyncObject};

use crate::engine::Engine;
use crate::loom::sync::atomic::{AtomicBool, Ordering};
use crate::progress::sync_hook;
use crate::request::Request;
use crate::runtime::Runtime;

/// Who runs a continuation's callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invoke {
    /// The thread that completes the operation, at once: the one whose progress pass matched
    /// the message or saw the send finish, inside that pass (or the attaching thread, if the
    /// operation had completed already). The lowest latency and no task, but it holds up
    /// progress while it runs: for **short callbacks only**, which must not block, wait for
    /// requests, or communicate (the pass may hold the rank's locks; use [`Invoke::Pool`]
    /// for that).
    Inline,
    /// A task on the rank's pool ([`Runtime::spawn`]), spawned at completion: the callback
    /// may take its time, communicate and wait.
    Pool,
}

/// Results of a set of requests of buffers `B`, in the order of the set.
pub type Results<B> = Vec<Result<(B, Status), Error>>;

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
    /// `reqs`. Each request is left taken. Checked as [`attach`](Self::attach) for every
    /// request before any is attached: an error leaves them all untouched. An empty set
    /// runs `f` at once.
    pub fn attach_all<B, F>(&self, reqs: &mut [Request<'_, B>], invoke: Invoke, f: F) -> Result<(), Error>
    where
        B: Send + 'static,
        F: FnOnce(Results<B>) + Send + 'static,
    {
        self.check(reqs)?;
        let n = reqs.len();
        let run = self.register(invoke, f);
        if n == 0 {
            run(Vec::new());
            return Ok(());
        }
        struct All<B, R> {
            results: Vec<Option<Result<(B, Status), Error>>>,
            left: usize,
            run: Option<R>,
        }
        let all = Arc::new(Mutex::new(All { results: (0..n).map(|_| None).collect(), left: n, run: Some(run) }));
        for (i, r) in reqs.iter_mut().enumerate() {
            let all = all.clone();
            r.continue_with(move |res| {
                let done = {
                    let mut a = all.lock().unwrap_or_else(|e| e.into_inner());
                    a.results[i] = Some(res);
                    a.left -= 1;
                    if a.left == 0 {
                        let results = a.results.drain(..).map(|r| r.unwrap_or(Err(Error::Cancelled))).collect::<Vec<_>>();
                        a.run.take().map(|run| (run, results))
                    } else {
                        None
                    }
                };
                if let Some((run, results)) = done {
                    run(results);
                }
            })?;
        }
        Ok(())
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
        let first = Arc::new(Mutex::new(Some(run)));
        for (i, r) in reqs.iter_mut().enumerate() {
            let first = first.clone();
            r.continue_with(move |res| {
                let run = first.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(run) = run {
                    run((i, res));
                }
            })?;
        }
        Ok(())
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
    match catch_unwind(AssertUnwindSafe(|| f(value))) {
        Ok(()) => countdown.ran = true,
        // Caught: `countdown` would drop as not panicking any more.
        Err(_) => countdown.count_down(Err(PANICKED)),
    }
}

/// Runs `f(value)` in a task of rank `rank`'s pool, counting it down when the task ends (a
/// task dropped unrun, or a rank gone, counts down as `Cancelled`).
fn spawn_counted<T: Send + 'static>(rank: &Weak<Engine>, countdown: Countdown, f: impl FnOnce(T) + Send + 'static, value: T) {
    let Some(engine) = rank.upgrade() else { return };
    let Some(pool) = engine.executor.start(|| engine.clone()) else { return };
    let task = pool.spawn(async move {
        // The whole guard moves into the task (not only the field set below).
        let mut countdown = countdown;
        f(value);
        countdown.ran = true;
    });
    drop(task);
}

/// Bytes of a continuation record (module docs): room for a callback with the request's
/// buffer and a few words of its own.
const RECORD_BYTES: usize = 128;

/// Spare records a thread keeps; beyond this many the extras go to the shared queue.
const SPARES_MAX: usize = 1024;

/// Records the process-wide queue keeps; beyond this many the extras are freed.
#[cfg(not(loom))]
const SHARED_SPARES_MAX: usize = 16384;

/// The storage of one callback (module docs).
#[repr(C, align(16))]
struct Record(MaybeUninit<[u8; RECORD_BYTES]>);

/// A thread's spare records; a thread that ends hands them to the shared queue.
// Boxes, not records in the vector: a record leaves it as its own allocation, whose address
// a pending continuation holds.
#[allow(clippy::vec_box)]
struct Spares(RefCell<Vec<Box<Record>>>);

impl Drop for Spares {
    fn drop(&mut self) {
        for r in self.0.get_mut().drain(..) {
            give_shared_record(r);
        }
    }
}

thread_local! {
    static SPARES: Spares = const { Spares(RefCell::new(Vec::new())) };
    /// Whether this thread has attached a continuation: only such a thread keeps spares; one
    /// that only completes continuations (a waiter, a pool worker) hands their records
    /// straight to the threads that attach, through the shared queue.
    static ATTACHES: Cell<bool> = const { Cell::new(false) };
}

/// The process-wide queue of spare records. Not under loom: a record made in one model
/// execution must not reach the next.
#[cfg(not(loom))]
fn shared_records() -> &'static crossbeam_queue::ArrayQueue<Box<Record>> {
    static SHARED: std::sync::OnceLock<crossbeam_queue::ArrayQueue<Box<Record>>> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| crossbeam_queue::ArrayQueue::new(SHARED_SPARES_MAX))
}

/// Hands a spare record to the other threads (freed if the queue is full).
#[inline(never)]
fn give_shared_record(r: Box<Record>) {
    #[cfg(not(loom))]
    let _ = shared_records().push(r);
    #[cfg(loom)]
    drop(r);
}

/// A spare record of this thread, else of another, else a new one.
#[inline]
fn take_record() -> Box<Record> {
    let _ = ATTACHES.try_with(|a| a.set(true));
    let local = SPARES.try_with(|s| s.0.borrow_mut().pop()).ok().flatten();
    #[cfg(not(loom))]
    let local = local.or_else(|| shared_records().pop());
    local.unwrap_or_else(|| Box::new(Record(MaybeUninit::uninit())))
}

/// Keeps `r` for this thread's next continuation, or another thread's.
#[inline]
fn give_record(r: Box<Record>) {
    if !ATTACHES.try_with(Cell::get).unwrap_or(false) {
        return give_shared_record(r);
    }
    let kept = SPARES.try_with(|s| {
        let mut s = s.0.borrow_mut();
        if s.len() < SPARES_MAX {
            s.push(r);
            None
        } else {
            Some(r)
        }
    });
    match kept {
        Ok(None) => {}
        Ok(Some(r)) => give_shared_record(r),
        // The thread is being torn down: freed.
        Err(_) => {}
    }
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
    const FITS: bool = std::mem::size_of::<F>() <= RECORD_BYTES && std::mem::align_of::<F>() <= std::mem::align_of::<Record>();

    /// Puts `f` in a record; `F` must fit ([`Self::FITS`]).
    fn new(f: F) -> Self {
        assert!(Self::FITS, "a callback larger than a record");
        let record = NonNull::from(Box::leak(take_record()));
        // SAFETY: the record is ours, and large and aligned enough for an `F` (checked above).
        unsafe { record.cast::<F>().as_ptr().write(f) };
        InRecord { record, _f: PhantomData }
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
            let f = self.record.cast::<F>().as_ptr().read();
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

/// `f`, in a record when it fits (module docs), boxed when not: small enough (two words) for
/// a completion cell's attachment, so that attaching it allocates nothing in the steady
/// state. The record goes back to the spares before `f` runs, so a callback that attaches
/// the next continuation reuses it.
pub(crate) fn in_record<A, F>(f: F) -> impl FnOnce(A) + Send + 'static
where
    A: 'static,
    F: FnOnce(A) + Send + 'static,
{
    enum Held<A, F: FnOnce(A)> {
        Record(InRecord<A, F>),
        Boxed(Box<F>),
    }
    let held = if InRecord::<A, F>::FITS { Held::Record(InRecord::new(f)) } else { Held::Boxed(Box::new(f)) };
    move |a: A| match held {
        Held::Record(r) => r.take()(a),
        Held::Boxed(f) => f(a),
    }
}
