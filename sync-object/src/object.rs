//! `SyncObject<T>`: the `MPIX_Sync` of [Patinyasakdikul 2019, App. B] as a Rust type.
//!
//! A sync object is a completion counter plus a completion queue ([Patinyasakdikul 2019, §4.6.1], Fig. 4.5).
//! Requests are attached with user data; when one completes, its data and [`Status`] are
//! pushed onto the queue and the counter drops. Any number of threads may query the same
//! object at once — the point of the extension, since MPI forbids concurrent tests of one
//! request.
//!
//! # Lifetime
//!
//! Each attachment owns a clone of the object's `Arc`, released by the completer after it has
//! notified waiters. A waiter may therefore drop the object the moment it sees the counter
//! reach zero without the completer touching freed memory (STYLE habit 6).
//!
//! # Memory ordering
//!
//! `pending` is incremented before the attach CAS publishes the attachment (so a completer's
//! decrement can never underflow it) and decremented with `AcqRel` after the completion is in
//! the queue: a waiter that sees `pending == 0` with acquire also sees every queued item.
//! `ready` mirrors the queue length and is only written under the queue lock; lock-free
//! readers use it as an O(1) hint (`probe`, the empty fast path of `query`). Lost wakeups are
//! excluded by event-listener's check -> listen -> re-check -> wait protocol: every state
//! change is made before the matching `notify`, and [`Signal`] orders the two sides with
//! `SeqCst` fences (its notify is one fence and one load while nobody listens).

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::ptr::NonNull;
use std::task::{Context, Poll};

use crossbeam_utils::CachePadded;
use futures_core::Stream;

use crate::cell::{put_data, take_data, AttachRace, Attachment, CompletionCell, DataSlot};
use crate::loom::sync::atomic::{AtomicUsize, Ordering};
use crate::loom::sync::{Arc, Mutex};
use crate::signal::{Signal, SignalListener};
use crate::status::{Error, Outcome, Status};
use crate::wait::{block_until, drive_poll, Driven, Progress};

/// A request that can be attached to a [`SyncObject`].
///
/// # Safety
///
/// The implementor promises that the cell returned by `completion_cell` stays alive, and is
/// completed at most once, until it has completed or been detached: the runtime holds its
/// own reference to the cell while the operation is in flight. Dropping the last handle of
/// a pending request must not free the cell (its `Drop` would cancel the attachment, which is
/// sound but reports `Cancelled` instead of the real outcome).
pub unsafe trait Attach {
    /// The request's completion cell.
    fn completion_cell(&self) -> &CompletionCell;
}

/// One completion event: the data given at attach time, and how the operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion<T> {
    /// The user's completion data.
    pub data: T,
    /// The operation's status, or its error.
    pub outcome: Outcome,
}

impl<T> Completion<T> {
    /// The status, if the operation succeeded.
    pub fn status(&self) -> Result<Status, Error> {
        self.outcome
    }
}

/// Why an attach was refused; the data is handed back.
#[derive(Debug, PartialEq, Eq)]
pub enum AttachError<T> {
    /// The request is already attached to a sync object (this one or another), or it was
    /// and its completion has already been delivered there.
    AlreadyAttached(T),
}

impl<T: fmt::Debug> fmt::Display for AttachError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("request already attached to a sync object")
    }
}

impl<T: fmt::Debug> std::error::Error for AttachError<T> {}

/// What [`SyncObject::detach`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Detached<T> {
    /// The request was detached before completing; here is its data (`None` for a counted
    /// attachment). No completion event will be generated for it.
    Detached(Option<T>),
    /// The request had already completed. If it was attached to this object, its
    /// completion event is (or is about to be) in the queue, or was counted; a completed
    /// request cannot tell which object (if any) its completion went to, so this is also
    /// the answer for one attached elsewhere or never attached.
    ///
    /// "About to be": the answer comes as soon as the completer has marked the request
    /// complete, and the completer queues the event after that. The object still counts
    /// the attachment ([`size`](SyncObject::size)) until the event is queued, so a caller
    /// that detaches everything and then empties the object must first wait for the count
    /// to reach zero ([`wait_all`](SyncObject::wait_all)), or an event may arrive after it.
    AlreadyComplete,
    /// The request is not attached to this object.
    NotAttached,
}

/// The queue and the first error of a counted completion.
struct Queue<T> {
    /// Completion events, first come first served.
    items: VecDeque<Completion<T>>,
    /// The first error among counted completions (they queue no event), reported by
    /// `wait_all`.
    first_error: Option<Error>,
}

/// Shared state of a sync object.
struct Inner<T> {
    /// Attached and not yet complete (`MPIX_Sync_size`).
    pending: CachePadded<AtomicUsize>,
    /// Completion events in the queue (`MPIX_Sync_probe`); written under the queue lock.
    ready: CachePadded<AtomicUsize>,
    /// The completion queue ("this queue is protected for thread-safety", [Patinyasakdikul 2019, §4.6.1]).
    queue: Mutex<Queue<T>>,
    /// Notified (one more listener) per queued event, and all when `pending` reaches zero.
    data_event: Signal,
    /// Notified (all) when `pending` reaches zero or on `signal`.
    drained_event: Signal,
    /// How a blocked waiter drives progress (given by the runtime), if anything.
    progress: Option<std::sync::Arc<dyn Progress>>,
}

/// A thread synchronization object with a completion queue (`MPIX_Sync`).
///
/// Cloning gives another handle to the same object.
///
/// # Examples
///
/// ```
/// use weft_sync::{CompletionCell, SyncObject, Attach, Status};
///
/// // A stand-in for a runtime request: anything that owns a completion cell.
/// struct Op(std::sync::Arc<CompletionCell>);
/// unsafe impl Attach for Op {
///     fn completion_cell(&self) -> &CompletionCell { &self.0 }
/// }
///
/// let sync = SyncObject::new();
/// let mut op = Op(std::sync::Arc::new(CompletionCell::new()));
/// let cell = op.0.clone(); // the "transport" side
/// sync.attach(&mut op, "hello").unwrap();
/// assert_eq!(sync.size(), 1);
/// assert!(sync.query().is_none()); // MPIX_SYNC_EMPTY
///
/// cell.complete(Ok(Status { source: 0, tag: 7, bytes: 5 }));
/// let c = sync.query().unwrap();
/// assert_eq!((c.data, c.outcome.unwrap().tag), ("hello", 7));
/// assert_eq!(sync.size(), 0);
/// ```
pub struct SyncObject<T> {
    inner: Arc<Inner<T>>,
}

impl<T> Clone for SyncObject<T> {
    fn clone(&self) -> Self {
        SyncObject { inner: self.inner.clone() }
    }
}

impl<T> fmt::Debug for SyncObject<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncObject").field("size", &self.size()).field("probe", &self.probe()).finish()
    }
}

impl<T> SyncObject<T> {
    /// Number of attached operations not yet complete (`MPIX_Sync_size`). O(1).
    #[inline]
    pub fn size(&self) -> usize {
        self.inner.pending.load(Ordering::Acquire)
    }

    /// Number of completion events waiting in the queue (`MPIX_Sync_probe`). O(1).
    #[inline]
    pub fn probe(&self) -> usize {
        self.inner.ready.load(Ordering::Acquire)
    }
}

impl<T: Send + 'static> Default for SyncObject<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + 'static> SyncObject<T> {
    /// A sync object with no progress hook: blocking waits park until another thread (or the
    /// runtime's pool) completes the attached operations (`MPIX_Sync_init`).
    pub fn new() -> Self {
        Self::build(None)
    }

    /// A sync object whose blocking waits and futures drive `progress` (the runtime gives
    /// its own; see `weft::Runtime::sync_object`).
    pub fn with_progress(progress: std::sync::Arc<dyn Progress>) -> Self {
        Self::build(Some(progress))
    }

    fn build(progress: Option<std::sync::Arc<dyn Progress>>) -> Self {
        SyncObject {
            inner: Arc::new(Inner {
                pending: CachePadded::new(AtomicUsize::new(0)),
                ready: CachePadded::new(AtomicUsize::new(0)),
                queue: Mutex::new(Queue { items: VecDeque::new(), first_error: None }),
                data_event: Signal::new(),
                drained_event: Signal::new(),
                progress,
            }),
        }
    }

    /// Attaches `request` with completion `data` (`MPIX_Sync_attach`).
    ///
    /// When the request completes its data and status are queued here, and the request is
    /// detached automatically. A request that has already completed is queued at once,
    /// unless its completion was already delivered to a sync object: a completion is
    /// delivered once, so that attach is refused ([`AttachError::AlreadyAttached`]) until
    /// the cell is [`reset`](CompletionCell::reset).
    pub fn attach<R: Attach + ?Sized>(&self, request: &mut R, data: T) -> Result<(), AttachError<T>> {
        match self.attach_inner(request.completion_cell(), Some(data)) {
            Ok(()) => Ok(()),
            Err(d) => Err(AttachError::AlreadyAttached(d.expect("data given back"))),
        }
    }

    /// Attaches `request` without completion data (`MPIX_SYNC_NO_COMPLETION_DATA`): its
    /// completion is counted (`size` drops, `wait_all` returns) but queues no event. An
    /// error is remembered and reported by the next `wait_all`.
    pub fn attach_counted<R: Attach + ?Sized>(&self, request: &mut R) -> Result<(), AttachError<()>> {
        self.attach_inner(request.completion_cell(), None).map_err(|_| AttachError::AlreadyAttached(()))
    }

    fn attach_inner(&self, cell: &CompletionCell, data: Option<T>) -> Result<(), Option<T>> {
        let with_data = data.is_some();
        let slot = match data {
            Some(d) => put_data(d),
            None => DataSlot::uninit(),
        };
        // Counted before publishing, so the completer's decrement cannot underflow.
        count_one(&self.inner);
        let att = Attachment { sink: Arc::into_raw(self.inner.clone()).cast(), deliver: deliver::<T>, data: slot, with_data };
        match cell.try_attach(att) {
            AttachRace::Attached => Ok(()),
            AttachRace::AlreadyComplete(mut att, outcome) => {
                // The completer finished first: deliver here, exactly as it would have.
                // SAFETY: the attachment was built above for `deliver::<T>` and never reached
                // the cell's reader, so this is its one consumption.
                unsafe { deliver::<T>(att.sink, &mut att.data, att.with_data, outcome) };
                Ok(())
            }
            AttachRace::AlreadyAttached(mut att) => {
                // Undo: release the Arc, the count and give the data back.
                // SAFETY: `sink` came from `Arc::into_raw` above and was never shared.
                drop(unsafe { Arc::from_raw(att.sink.cast::<Inner<T>>()) });
                // SAFETY: the slot holds the data put above (when `with_data`).
                let data = with_data.then(|| unsafe { take_data::<T>(&mut att.data) });
                // The count is taken back like a detach does it, waking waiters when it
                // reaches zero: a waiter may have seen the increment above (`size() == 1`)
                // and parked, and nothing else would wake it.
                self.finish_one();
                Err(data)
            }
        }
    }

    /// Detaches `request` (`MPIX_Sync_detach`). See [`Detached`] for the outcomes.
    pub fn detach<R: Attach + ?Sized>(&self, request: &mut R) -> Detached<T> {
        let cell = request.completion_cell();
        let own: *const () = Arc::as_ptr(&self.inner).cast();
        match cell.attached_sink() {
            None if cell.is_complete() => return Detached::AlreadyComplete,
            None => return Detached::NotAttached,
            Some(sink) if sink != own => return Detached::NotAttached,
            Some(_) => {}
        }
        match cell.try_detach() {
            None => Detached::AlreadyComplete,
            Some(mut att) => {
                // SAFETY: `sink` is this object's `Arc::into_raw`, owned by the attachment we
                // just took back.
                drop(unsafe { Arc::from_raw(att.sink.cast::<Inner<T>>()) });
                let data = att.with_data.then(|| {
                    // SAFETY: the attachment was built by `attach_inner::<T>` with data.
                    unsafe { take_data::<T>(&mut att.data) }
                });
                self.finish_one();
                Detached::Detached(data)
            }
        }
    }

    /// Takes one completion event, or `None` if the queue is empty (`MPIX_SYNC_EMPTY`); like
    /// `MPI_Testany`. O(1) and lock-free when empty. Drives no progress.
    #[inline]
    pub fn query(&self) -> Option<Completion<T>> {
        // Acquire: pairs with the release of the queue lock that wrote `ready`.
        if self.inner.ready.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.query_slow()
    }

    #[cold]
    fn query_slow(&self) -> Option<Completion<T>> {
        let mut q = crate::loom::lock(&self.inner.queue);
        let item = q.items.pop_front();
        self.inner.ready.store(q.items.len(), Ordering::Release);
        item
    }

    /// Moves up to `max` completion events into `out` and returns how many
    /// (`MPIX_Sync_query_bulk`, like `MPI_Testsome`). One lock for the whole batch.
    pub fn query_bulk(&self, out: &mut Vec<Completion<T>>, max: usize) -> usize {
        if max == 0 || self.inner.ready.load(Ordering::Acquire) == 0 {
            return 0;
        }
        let mut q = crate::loom::lock(&self.inner.queue);
        let n = max.min(q.items.len());
        out.extend(q.items.drain(..n));
        self.inner.ready.store(q.items.len(), Ordering::Release);
        n
    }

    /// Blocks until every attached operation has completed (`MPIX_Sync_waitall`), driving
    /// the object's progress hook meanwhile. Completion events stay queued. Returns the
    /// first error of a counted attachment since the last call, if any.
    pub fn wait_all(&self) -> Result<(), Error> {
        let hook = self.inner.progress.as_deref();
        block_until(hook, || self.size() == 0, &self.inner.drained_event);
        crate::loom::lock(&self.inner.queue).first_error.take().map_or(Ok(()), Err)
    }

    /// Like [`wait_all`](Self::wait_all) but drives `progress` instead of the object's hook.
    pub fn wait_all_with(&self, progress: &dyn Progress) -> Result<(), Error> {
        block_until(Some(progress), || self.size() == 0, &self.inner.drained_event);
        crate::loom::lock(&self.inner.queue).first_error.take().map_or(Ok(()), Err)
    }

    /// [`wait_all_with`](Self::wait_all_with) as a future: resolves once every attached
    /// operation has completed, to the first error of a counted attachment since the last
    /// wait, driving `progress` (its `poll_progress`) while pending, so it makes progress
    /// inside any executor. Completion events stay queued. Cancel-safe: dropped, it takes
    /// nothing.
    pub fn drained_with<'a>(&'a self, progress: &'a dyn Progress) -> Drained<'a, T> {
        Drained { sync: self, progress, listener: None }
    }

    /// Blocks until a completion event is available and takes it; `None` once nothing is
    /// queued and nothing attached remains (like `MPI_Waitany` returning `MPI_UNDEFINED`).
    pub fn wait_any(&self) -> Option<Completion<T>> {
        self.wait_any_hooked(self.inner.progress.as_deref())
    }

    /// Like [`wait_any`](Self::wait_any) but drives `progress` instead of the object's hook.
    pub fn wait_any_with(&self, progress: &dyn Progress) -> Option<Completion<T>> {
        self.wait_any_hooked(Some(progress))
    }

    fn wait_any_hooked(&self, hook: Option<&dyn Progress>) -> Option<Completion<T>> {
        let mut got = None;
        block_until(
            hook,
            || {
                got = self.query();
                got.is_some() || (self.size() == 0 && self.probe() == 0)
            },
            &self.inner.data_event,
        );
        if got.is_none() {
            // `size` reached zero: one last look, the final event may have raced the check.
            got = self.query();
        }
        got
    }

    /// Wakes every thread blocked on this object without a completion (`SYNC_SIGNAL`); they
    /// re-check their condition and, with a runtime hook, may take over progress.
    pub fn signal(&self) {
        self.inner.data_event.notify(usize::MAX);
        self.inner.drained_event.notify(usize::MAX);
    }

    /// The next completion event; resolves to `None` when nothing is queued or attached.
    /// Drives the progress hook while pending, so it makes progress inside any executor.
    pub fn next(&self) -> Next<'_, T> {
        Next { stream: self.completions() }
    }

    /// A `Stream` of completion events, ending when nothing is queued or attached.
    pub fn completions(&self) -> Completions<'_, T> {
        Completions { sync: self, listener: None }
    }

    /// Counts one operation that has no completion cell (`MPIX_SYNC_NO_COMPLETION_DATA`
    /// without a request): `size` grows by one until the returned [`Counted`] is completed,
    /// or dropped (then it counts as `Cancelled`). Costs what a counted attachment's
    /// completion costs, without the cell to attach (a runtime's own counts: one per
    /// continuation of a continuation request).
    ///
    /// The count takes no reference of its own to the object: the object lives as long as
    /// anything is pending on it ([`count_one`](fn@count_one)), so a count costs one atomic
    /// operation on the object at each end.
    pub fn count_one(&self) -> Counted<T> {
        count_one(&self.inner);
        Counted { inner: NonNull::new(Arc::as_ptr(&self.inner).cast_mut()) }
    }

    /// Counts one completed or detached attachment and wakes whoever waits on it.
    fn finish_one(&self) {
        // SAFETY: the handle keeps the object alive.
        unsafe { finish_one(Arc::as_ptr(&self.inner)) };
    }
}

/// One operation counted on a sync object without a completion cell
/// ([`SyncObject::count_one`]).
#[must_use = "dropped, it counts as cancelled"]
pub struct Counted<T> {
    /// The object counted on (`None` once completed), kept alive by its pending count.
    inner: Option<NonNull<Inner<T>>>,
}

// SAFETY: a count reaches its object as an `Arc<Inner<T>>` would (it is kept alive by the
// object's count of pending operations instead), and `Inner<T>` is `Send` and `Sync` for a
// `T: Send`.
unsafe impl<T: Send> Send for Counted<T> {}
// SAFETY: as above; a shared count gives access to nothing.
unsafe impl<T: Send> Sync for Counted<T> {}

impl<T> fmt::Debug for Counted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counted").field("pending", &self.inner.is_some()).finish()
    }
}

impl<T> Counted<T> {
    /// Completes the operation with `outcome`: the object's count drops (waking its waiters
    /// when it reaches zero), and an error is reported by the next `wait_all`.
    pub fn complete(self, outcome: Outcome) {
        // Not dropped: its drop would count the operation again, as cancelled.
        let mut this = std::mem::ManuallyDrop::new(self);
        if let Some(inner) = this.inner.take() {
            // SAFETY: counted, so the object lives until `finish_counted` counts it.
            unsafe { finish_counted(inner.as_ptr(), outcome) };
        }
    }
}

impl<T> Drop for Counted<T> {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            // SAFETY: as in `complete`.
            unsafe { finish_counted(inner.as_ptr(), Err(Error::Cancelled)) };
        }
    }
}

/// Records a counted completion's error, if any, then counts it.
///
/// # Safety
/// `inner` is an `Arc`'s pointer (`Arc::as_ptr`) to an object with this completion counted
/// pending; it may be gone once this returns.
unsafe fn finish_counted<T>(inner: *const Inner<T>, outcome: Outcome) {
    if let Err(e) = outcome {
        // A counted completion touches the queue only to record an error.
        // SAFETY: live while the completion is pending (contract).
        crate::loom::lock(&unsafe { &*inner }.queue).first_error.get_or_insert(e);
    }
    // SAFETY: as above.
    unsafe { finish_one(inner) };
}

/// Counts one pending completion (an attachment or a [`Counted`]). While anything is
/// pending, the count holds one strong reference to the object, taken by the count's first
/// (from zero) and given back by [`finish_one`] at its last: so an attachment or count
/// outlives every handle of the object without a reference of its own.
fn count_one<T>(inner: &Arc<Inner<T>>) {
    if inner.pending.fetch_add(1, Ordering::Relaxed) == 0 {
        // SAFETY: `inner` is a live `Arc` (the caller's handle); the reference is the
        // count's, given back by the `finish_one` that brings it back to zero.
        unsafe { Arc::increment_strong_count(Arc::as_ptr(inner)) };
    }
}

/// Counts one completion and wakes whoever waits on it; the object may be gone after it,
/// unless the caller holds a reference of its own ([`count_one`]).
///
/// # Safety
/// `inner` is an `Arc`'s pointer (`Arc::as_ptr`) to an object with this completion counted
/// pending.
unsafe fn finish_one<T>(inner: *const Inner<T>) {
    // SAFETY: live until the count's reference is given back below (contract); not
    // touched after.
    let inner_ref = unsafe { &*inner };
    // AcqRel: release publishes the queued item to a waiter that sees the new count;
    // acquire orders us after earlier completers (only the count's last writer notifies
    // drained waiters).
    let prev = inner_ref.pending.fetch_sub(1, Ordering::AcqRel);
    debug_assert!(prev > 0, "sync object count underflow");
    if prev == 1 {
        inner_ref.drained_event.notify(usize::MAX);
        inner_ref.data_event.notify(usize::MAX);
        // SAFETY: the count's reference (`count_one`), given back as the count reaches zero;
        // the object is not touched after.
        unsafe { Arc::decrement_strong_count(inner) };
    }
}

/// The type-erased completion path stored in each attachment.
///
/// # Safety
/// `sink` must be an `Arc::into_raw` of `Inner<T>` owned by the caller, and `data` must hold
/// a `T` stored by `put_data::<T>` when `with_data`; both are consumed.
unsafe fn deliver<T: Send + 'static>(sink: *const (), data: *mut DataSlot, with_data: bool, outcome: Outcome) {
    // SAFETY: per the contract, `sink` is an owned `Arc<Inner<T>>`.
    let inner = unsafe { Arc::from_raw(sink.cast::<Inner<T>>()) };
    if with_data {
        // SAFETY: per the contract, the slot holds a `T`.
        let data = unsafe { take_data::<T>(data) };
        let mut q = crate::loom::lock(&inner.queue);
        q.items.push_back(Completion { data, outcome });
        inner.ready.store(q.items.len(), Ordering::Release);
        drop(q);
        inner.data_event.notify_additional(1);
        // SAFETY: `inner` is held here.
        unsafe { finish_one(Arc::as_ptr(&inner)) };
    } else {
        // SAFETY: as above.
        unsafe { finish_counted(Arc::as_ptr(&inner), outcome) };
    }
    // `inner` (the attachment's Arc) is released only now, after every notification.
    drop(inner);
}

/// Future of [`SyncObject::next`].
#[derive(Debug)]
#[must_use = "futures do nothing unless polled"]
pub struct Next<'a, T> {
    stream: Completions<'a, T>,
}

impl<T: Send + 'static> Future for Next<'_, T> {
    type Output = Option<Completion<T>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.stream).poll_next(cx)
    }
}

/// Future of [`SyncObject::drained_with`].
#[must_use = "futures do nothing unless polled"]
pub struct Drained<'a, T> {
    sync: &'a SyncObject<T>,
    progress: &'a dyn Progress,
    listener: Option<SignalListener<'a>>,
}

impl<T> fmt::Debug for Drained<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drained").field("sync", self.sync).finish()
    }
}

impl<T> Future for Drained<'_, T> {
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let (sync, progress) = (this.sync, this.progress);
        loop {
            match drive_poll(cx, || sync.size() == 0, |cx| progress.poll_progress(cx)) {
                Driven::Done => {
                    this.listener = None;
                    return Poll::Ready(crate::loom::lock(&sync.inner.queue).first_error.take().map_or(Ok(()), Err));
                }
                Driven::Yielded => return Poll::Pending,
                Driven::Idle => {}
            }
            match this.listener.as_mut() {
                None => {
                    // Listen, then loop to re-check: the order that loses no wakeup.
                    this.listener = Some(this.sync.inner.drained_event.listen());
                }
                Some(l) => match Pin::new(l).poll(cx) {
                    Poll::Ready(()) => this.listener = None,
                    Poll::Pending => return Poll::Pending,
                },
            }
        }
    }
}

/// Stream of [`SyncObject::completions`].
#[must_use = "streams do nothing unless polled"]
pub struct Completions<'a, T> {
    sync: &'a SyncObject<T>,
    listener: Option<SignalListener<'a>>,
}

impl<T> fmt::Debug for Completions<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completions").field("sync", self.sync).finish()
    }
}

impl<T: Send + 'static> Stream for Completions<'_, T> {
    type Item = Completion<T>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let sync = this.sync;
        loop {
            // A completion taken, or none left to come (then `got` stays `None`).
            let mut got = None;
            let mut done = || {
                got = sync.query();
                got.is_some() || (sync.size() == 0 && sync.probe() == 0)
            };
            let driven = match sync.inner.progress.as_deref() {
                Some(p) => drive_poll(cx, done, |cx| p.poll_progress(cx)),
                None if done() => Driven::Done,
                None => Driven::Idle,
            };
            match driven {
                Driven::Done => {
                    this.listener = None;
                    return Poll::Ready(got);
                }
                Driven::Yielded => return Poll::Pending,
                Driven::Idle => {}
            }
            match this.listener.as_mut() {
                None => {
                    // Listen, then loop to re-check: the order that loses no wakeup.
                    this.listener = Some(this.sync.inner.data_event.listen());
                }
                Some(l) => match Pin::new(l).poll(cx) {
                    Poll::Ready(()) => this.listener = None,
                    Poll::Pending => return Poll::Pending,
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts take no reference of their own to the object: only the pending count does,
    /// one for all of them, and it keeps the object alive after its last handle is gone.
    #[test]
    fn counts_share_one_reference_that_outlives_the_handles() {
        let sync = SyncObject::<u32>::new();
        let counts: Vec<Counted<u32>> = (0..3).map(|_| sync.count_one()).collect();
        assert_eq!(Arc::strong_count(&sync.inner), 2, "the handle's and the pending count's");
        let weak = Arc::downgrade(&sync.inner);
        drop(sync);
        assert_eq!(weak.strong_count(), 1, "the pending count keeps the object");
        for c in counts {
            c.complete(Ok(Status::default()));
        }
        assert_eq!(weak.strong_count(), 0, "the last count gave the reference back");
    }
}
