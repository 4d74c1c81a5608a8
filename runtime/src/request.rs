//! Requests (path step 1 and 6): the user's handle on an operation in flight.
//!
//! A [`Request`] owns the operation's buffer and shares an [`Operation`] (which owns the
//! `CompletionCell`, `operation.rs`) with the runtime. A request borrows its communicator
//! instead of counting a reference to it on every message ([Goodell 2010]: no shared
//! reference count touched per request).

use std::fmt;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::pin::Pin;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use weft_sync::{Attach, CompletionCell, Error, Outcome, Status};

use crate::buffer::RecvBuf;
use crate::comm::Communicator;
use crate::operation::{leave, new_operation, recycle, recycle_completed, Operation};
use crate::progress;

/// What kind of operation a request tracks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Send,
    Recv,
}

/// A non-blocking operation in flight: `isend` or `irecv`.
///
/// It is a `Future` resolving to the buffer and the [`Status`]; [`wait`](Self::wait) blocks
/// for it, [`test`](Self::test) checks without blocking, and [`wait_all`](crate::wait_all)
/// and friends wait for many. Dropping a request in flight is safe: a receive is cancelled if
/// it has not matched yet, and otherwise the runtime keeps the buffer alive until the
/// transport is done with it.
///
/// # Cancel safety
///
/// A receive that has matched a message owns it, from the match on (which any thread's
/// progress may make, before the request is polled again): dropping the request then
/// discards that message, as `MPI_Request_free` on a matched receive does. So a receive
/// future is **not cancel-safe**: one created inside a `tokio::select!` branch that loses,
/// or under a `timeout` that fires, may take a message with it. Keep the request across
/// iterations and poll it by reference instead (`Request` is `Unpin`) — nothing is lost:
///
/// ```
/// # let ranks = weft::Runtime::builder().env(false).build_local(2).unwrap();
/// # let (a, b) = (ranks[0].world(), ranks[1].world());
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
/// # rt.block_on(async {
/// let mut recv = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 5).unwrap();
/// # a.send(vec![1u8], 1, 5).unwrap();
/// let msg = loop {
///     tokio::select! {
///         r = &mut recv => break r.unwrap().0,
///         // A tick, a shutdown signal, ...: `recv` lives on to the next turn.
///         _ = tokio::time::sleep(std::time::Duration::from_millis(1)) => {}
///     }
/// };
/// assert_eq!(msg, vec![1]);
/// # });
/// ```
///
/// A sync object's [`next`](weft_sync::SyncObject::next) is cancel-safe: an event stays
/// queued until a `next` that completes takes it.
pub struct Request<'c, B: Send + 'static> {
    comm: &'c Communicator,
    /// The operation while the result is still to be taken. Emptied by [`Drop`] itself, as
    /// `buf`: a taken request has no drop glue left to run on its fields.
    inner: ManuallyDrop<Option<Arc<Operation>>>,
    /// The buffer, dropped by [`Drop`] itself (only a request whose result was not taken
    /// has one: a taken request's drop is a few compares, not the fields' drop glue).
    buf: ManuallyDrop<Option<B>>,
    /// A receive's `RecvBuf::filled`, or a sent request's status (see [`Extra`]).
    extra: Extra<B>,
    /// A completed cell for a sent request, made only if someone asks for one (attaching it
    /// to a sync object), or the cell of a request whose result was taken.
    /// Emptied by [`Drop`] itself, as `buf`.
    sent_cell: MadeCell,
    /// Which field of `extra` holds: `filled` for a receive, `status` for a sent request.
    kind: Kind,
    /// Whether `status` is a sent request's result still to be taken.
    sent: bool,
    /// The tag partition of the communicator the operation is matched in (0 unless it
    /// asserts `no_any_tag`): a waiter attends its CRI for this partition.
    part: u16,
}

impl<B: Send + 'static> fmt::Debug for Request<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request").field("kind", &self.kind).field("complete", &self.is_complete()).finish()
    }
}

// SAFETY: the cell stays alive while the request or the runtime holds `inner` (the runtime
// keeps its own `Arc` until it completes the cell), and the runtime completes it once; a
// relay lives in the operation and in the callback that completes it, once.
unsafe impl<B: Send + 'static> Attach for Request<'_, B> {
    /// The cell a sync object attaches to. Statuses and errors name the ranks of the
    /// request's communicator: on one whose ranks are not the world's, a relay cell that the
    /// operation's completion completes with its outcome translated.
    fn completion_cell(&self) -> &CompletionCell {
        match &*self.inner {
            Some(i) if self.comm.renames_ranks() => match &i.relay.get_or_init(|| (self.relay_of(i), Arc::downgrade(i))).0 {
                Some(relay) => &relay.cell,
                None => &i.cell,
            },
            _ => self.own_cell(),
        }
    }
}

impl<B: Send + 'static> Request<'_, B> {
    /// The cell the operation completes (a sent request's made here, completed), which
    /// the runtime's own waits attach to.
    pub(crate) fn own_cell(&self) -> &CompletionCell {
        match (&*self.inner, self.sent) {
            (Some(i), _) => &i.cell,
            (None, true) => {
                let st = self.comm.local_status(self.status());
                &self.sent_cell.get_or_init(|| new_operation(|i| i.cell.reset_completed(Ok(st)))).cell
            }
            (None, false) => &self.sent_cell.get_or_init(consumed_operation).cell,
        }
    }

    /// A relay for `inner`'s completion, its outcome translated to ranks here; `None` if
    /// `inner`'s cell is attached already (the attach to the relay is refused then too).
    fn relay_of(&self, inner: &Arc<Operation>) -> Option<Arc<Operation>> {
        /// The operation's own cell, for the callback to attach to.
        struct Cell<'a>(&'a Operation);
        // SAFETY: the operation's cell, alive while `inner` is.
        unsafe impl Attach for Cell<'_> {
            fn completion_cell(&self) -> &CompletionCell {
                &self.0.cell
            }
        }
        let relay = new_operation(|_| {});
        let (to, ranks) = (relay.clone(), self.comm.rank_map());
        let complete = move |o: Outcome| {
            to.cell.complete(ranks.outcome(o));
        };
        weft_sync::on_complete(&mut Cell(inner), Box::new(complete)).ok().map(|()| relay)
    }
}

/// What a request needs beside its operation, by kind: a receive never completes inside
/// `irecv` and a send fills no buffer, so one word pair serves both (a request is moved on
/// every call that makes, stores or takes one).
#[derive(Clone, Copy)]
union Extra<B> {
    /// For receives (`kind` is [`Kind::Recv`]): sets the buffer's length to the bytes
    /// received (`RecvBuf::filled`).
    filled: unsafe fn(&mut B, usize),
    /// For sends: a send that completed inside `isend` (an eager frame the transport took
    /// at once), while `sent` is set: its status, and no inner — nothing else ever refers
    /// to it, so it needs no pooled `Operation`, no completion cell and no reference count
    /// (about 150 instructions per message).
    status: Status,
}

/// An operation made on first use and kept until taken, in one word (a `OnceLock` of an
/// `Arc` takes two): a sent request's completed cell, or a taken request's.
struct MadeCell(AtomicPtr<Operation>);

impl MadeCell {
    const fn new() -> Self {
        MadeCell(AtomicPtr::new(ptr::null_mut()))
    }

    /// The operation, if made.
    fn get(&self) -> Option<&Operation> {
        // SAFETY: a non-null pointer is an `Arc::into_raw` the slot owns until `take`, which
        // borrows the slot mutably, so the reference cannot outlive it.
        unsafe { self.0.load(Ordering::Acquire).as_ref() }
    }

    /// The operation, made by `make` if not made yet (by this or another thread: a maker
    /// that loses the race recycles its own).
    fn get_or_init(&self, make: impl FnOnce() -> Arc<Operation>) -> &Operation {
        if let Some(op) = self.get() {
            return op;
        }
        let made = Arc::into_raw(make()).cast_mut();
        match self.0.compare_exchange(ptr::null_mut(), made, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: as in `get`: the slot owns `made` now.
            Ok(_) => unsafe { &*made },
            Err(first) => {
                // SAFETY: `made` is the `into_raw` above, not stored.
                recycle(unsafe { Arc::from_raw(made) });
                // SAFETY: as in `get`.
                unsafe { &*first }
            }
        }
    }

    /// Whether the operation was made (no atomic access: the slot is borrowed mutably).
    fn is_made(&mut self) -> bool {
        !self.0.get_mut().is_null()
    }

    /// The operation, if made, the slot left empty.
    fn take(&mut self) -> Option<Arc<Operation>> {
        let p = std::mem::replace(self.0.get_mut(), ptr::null_mut());
        // SAFETY: a non-null pointer is an `Arc::into_raw` the slot owned.
        (!p.is_null()).then(|| unsafe { Arc::from_raw(p) })
    }
}

/// The error of an operation on a request whose result was already taken.
pub(crate) const CONSUMED: Error = Error::InvalidArgument("request already consumed");

/// The error of a continuation for a request attached to a sync object.
pub(crate) const ATTACHED: Error = Error::InvalidArgument("request attached to a sync object: it cannot also have a continuation");

/// Sets a receive buffer's length to what a successful receive wrote (`filled` is `None` for
/// sends); a cancelled receive wrote nothing and its buffer stays untouched.
///
/// # Safety
/// `outcome` must be the outcome of the buffer's completed operation, read after the
/// completion (acquire): the completer wrote `st.bytes` bytes into the spare area and checked
/// them against its length and the element size before completing with `Ok`.
unsafe fn set_filled<B>(filled: Option<unsafe fn(&mut B, usize)>, buf: &mut B, outcome: Outcome) {
    if let (Ok(st), Some(filled)) = (outcome, filled) {
        if !st.cancelled() {
            // SAFETY: per the contract.
            unsafe { filled(buf, st.bytes) };
        }
    }
}

/// A cell, made on first use and kept in `slot`, completed with [`CONSUMED`]: what a request
/// whose result was taken gives a sync object it is attached to (which then reports that
/// error once, as for any completed request). One per request, not one shared by all: a
/// cell delivers its completion once.
pub(crate) fn consumed_cell(slot: &std::sync::OnceLock<Arc<Operation>>) -> &CompletionCell {
    &slot.get_or_init(consumed_operation).cell
}

/// A pooled operation completed with [`CONSUMED`] (see [`consumed_cell`]).
fn consumed_operation() -> Arc<Operation> {
    new_operation(|i| i.cell.reset_completed(Err(CONSUMED)))
}

/// Extends a request's borrow of its communicator to `'static`, for a request kept beside a
/// communicator of its own (a persistent collective's schedule, a partitioned send's state).
///
/// # Safety
/// `r` must borrow a communicator whose address never changes (in a `Box` or an `Arc`) and
/// that outlives the request: the request lives in a field dropped before it, or is dropped
/// while a holder of that `Arc` lives.
pub(crate) unsafe fn unbound<B: Send + 'static>(r: Request<'_, B>) -> Request<'static, B> {
    // SAFETY: per the contract, the communicator outlives the request; only the lifetime
    // changes.
    unsafe { std::mem::transmute::<Request<'_, B>, Request<'static, B>>(r) }
}

impl<'c, B: Send + 'static> Request<'c, B> {
    /// Every field once: `extra` as `kind` says (a receive's `filled` is set by `recv`).
    #[inline]
    fn with(comm: &'c Communicator, inner: Option<Arc<Operation>>, buf: B, extra: Extra<B>, kind: Kind, sent: bool, part: usize) -> Self {
        Request {
            comm,
            inner: ManuallyDrop::new(inner),
            buf: ManuallyDrop::new(Some(buf)),
            extra,
            sent_cell: MadeCell::new(),
            kind,
            sent,
            part: part as u16,
        }
    }

    /// A send's request, its status not yet known.
    fn sending(comm: &'c Communicator, inner: Option<Arc<Operation>>, buf: B, sent: Option<Status>, part: usize) -> Self {
        let extra = Extra { status: sent.unwrap_or_default() };
        Self::with(comm, inner, buf, extra, Kind::Send, sent.is_some(), part)
    }

    pub(crate) fn send(comm: &'c Communicator, inner: Arc<Operation>, buf: B, part: usize) -> Self {
        Self::sending(comm, Some(inner), buf, None, part)
    }

    /// A sent request's status (meaningful while `sent` is set).
    #[inline]
    fn status(&self) -> Status {
        match self.kind {
            // SAFETY: a send's `extra` is its status (`sending`).
            Kind::Send => unsafe { self.extra.status },
            Kind::Recv => Status::default(),
        }
    }

    /// A receive's `RecvBuf::filled`; `None` for a send.
    #[inline]
    fn filled(&self) -> Option<unsafe fn(&mut B, usize)> {
        match self.kind {
            Kind::Send => None,
            // SAFETY: a receive's `extra` is its `filled` (`recv`).
            Kind::Recv => Some(unsafe { self.extra.filled }),
        }
    }

    /// A collective's request: `inner` completes when its schedule ends (`nbc.rs`), which
    /// fills `buf` first. Dropped in flight, it leaves `buf` to `inner` as a send does.
    pub(crate) fn collective(comm: &'c Communicator, inner: Arc<Operation>, buf: B) -> Self {
        Self::sending(comm, Some(inner), buf, None, 0)
    }

    /// A send that completed before `isend` returned, with `status`.
    pub(crate) fn sent(comm: &'c Communicator, status: Status, buf: B) -> Self {
        Self::sending(comm, None, buf, Some(status), 0)
    }

    /// The tag partition the operation is matched in.
    pub(crate) fn part(&self) -> usize {
        usize::from(self.part)
    }

    /// Whether the operation has completed (no progress is made).
    pub fn is_complete(&self) -> bool {
        self.inner.as_ref().map_or(true, |i| i.cell.is_complete())
    }

    /// Makes one step of progress and reports whether the operation has completed
    /// (`MPI_Test`).
    pub fn test(&mut self) -> bool {
        if self.is_complete() {
            return true;
        }
        let _ = self.comm.engine().progress_once();
        self.is_complete()
    }

    /// The communicator this request belongs to.
    pub fn communicator(&self) -> &'c Communicator {
        self.comm
    }

    /// Blocks until complete (`MPI_Wait`) and returns the buffer and status; an error if
    /// the result was already taken ([`take`](Self::take)).
    pub fn wait(mut self) -> Result<(B, Status), Error> {
        if !self.is_complete() {
            progress::wait_all(self.comm.engine(), std::slice::from_mut(&mut self));
        }
        self.take().unwrap_or(Err(CONSUMED))
    }

    /// Takes the result of a completed request; `None` if still pending or already taken.
    /// Inlined where it is called (generic code, once per message on both sides).
    #[inline(always)]
    pub fn take(&mut self) -> Option<Result<(B, Status), Error>> {
        let (buf, outcome) = self.take_parts()?;
        Some(match outcome {
            Ok(st) => Ok((buf, st)),
            Err(e) => Err(e),
        })
    }

    /// [`take`](Self::take), giving the buffer back with a failed outcome too (persistent
    /// requests reuse it).
    #[inline(always)]
    pub(crate) fn take_parts(&mut self) -> Option<(B, Outcome)> {
        let outcome = self.settle()?;
        Some((self.buf.take()?, outcome))
    }

    /// [`take_parts`](Self::take_parts) handing the buffer to `f` where it lies (a
    /// collective's step reads a message in place), then dropping it: no result is moved
    /// out. Nothing is called if pending or already taken.
    #[inline(always)]
    pub(crate) fn take_parts_with(&mut self, f: impl FnOnce(&mut B, Outcome)) {
        if let Some(outcome) = self.settle() {
            if let Some(buf) = self.buf.as_mut() {
                f(buf, outcome);
            }
            drop(self.buf.take());
        }
    }

    /// Settles a completed request where it lies, its buffer left in it: the outcome in
    /// ranks here, a receive's buffer told what it holds, the operation recycled. `None` if
    /// pending or already taken.
    #[inline(always)]
    fn settle(&mut self) -> Option<Outcome> {
        if self.sent {
            self.sent = false;
            if self.sent_cell.is_made() {
                self.recycle_sent_cell();
            }
            let st = self.comm.local_status(self.status());
            return self.buf.is_some().then_some(Ok(st));
        }
        let outcome = self.inner.as_ref()?.cell.outcome()?;
        let inner = self.inner.take()?;
        let outcome = self.comm.local_outcome(outcome);
        let filled = self.filled();
        let buf = self.buf.as_mut()?;
        // SAFETY: `outcome` is the completed cell's, read with acquire by `outcome()`.
        unsafe { set_filled(filled, buf, outcome) };
        recycle_completed(inner);
        Some(outcome)
    }

    /// Gives the cell made for a sent request (or a taken one) back to the pool.
    #[cold]
    #[inline(never)]
    fn recycle_sent_cell(&mut self) {
        if let Some(cell) = self.sent_cell.take() {
            recycle(cell);
        }
    }

    /// Whether [`continue_with`](Self::continue_with) would accept the request: its result
    /// not taken, and not attached to a sync object (nor its completion delivered to one).
    pub(crate) fn can_continue(&self) -> Result<(), Error> {
        let attached = match (&*self.inner, self.sent) {
            (Some(inner), _) => !inner.cell.attachable(),
            (None, true) => self.sent_cell.get().is_some_and(|i| !i.cell.attachable()),
            (None, false) => return Err(CONSUMED),
        };
        if attached {
            return Err(ATTACHED);
        }
        Ok(())
    }

    /// Hands the result to `f`, run once when the operation completes: by the thread that
    /// completes it, or here, now, if it has completed (continuations,
    /// [`crate::continuation`]). The request is left taken. Refused, the request untouched,
    /// if it is attached to a sync object (or its completion went to one) or its result was
    /// taken.
    pub(crate) fn continue_with(&mut self, f: impl FnOnce(Result<(B, Status), Error>) + Send + 'static) -> Result<(), Error> {
        self.can_continue()?;
        if self.inner.is_none() {
            // A send that completed in `isend`: its result is here.
            if let Some((buf, outcome)) = self.take_parts() {
                f(outcome.map(|st| (buf, st)));
            }
            return Ok(());
        };
        let (Some(mut buf), filled, ranks) = (self.buf.take(), self.filled(), self.comm.rank_map()) else { return Err(CONSUMED) };
        // The callback keeps the buffer (the operation's area) until the operation is over,
        // as a dropped request's orphan slot does, and holds nothing of the runtime: an
        // operation dropped pending (the runtime shut down) drops it, running it with
        // `Cancelled`.
        let run = move |outcome: Outcome| {
            let outcome = ranks.outcome(outcome);
            // SAFETY: `outcome` is the cell's, given to its attachment after completion.
            unsafe { set_filled(filled, &mut buf, outcome) };
            f(outcome.map(|st| (buf, st)));
        };
        // The caller's `&mut self` excludes any other attach since the check above.
        weft_sync::on_complete(self, crate::continuation::in_record(run)).map_err(|_| ATTACHED)?;
        if let Some(inner) = self.inner.take() {
            // Pending still, perhaps: a receive's holder may hold it on this reference.
            leave(inner);
        }
        Ok(())
    }

    /// The outcome without consuming the request (`None` while pending).
    pub fn outcome(&self) -> Option<Outcome> {
        match self.sent {
            true => Some(Ok(self.comm.local_status(self.status()))),
            false => self.inner.as_ref().and_then(|i| i.cell.outcome()).map(|o| self.comm.local_outcome(o)),
        }
    }

    /// The error a completed request failed with (`None` while pending, once taken, or on
    /// success): the outcome's check without translating a successful status's rank.
    pub(crate) fn error(&self) -> Option<Error> {
        if self.sent {
            return None;
        }
        match self.inner.as_ref()?.cell.outcome()? {
            Ok(_) => None,
            Err(e) => Some(self.comm.local_error(e)),
        }
    }

    /// Whether the result is still to be taken (pending, or complete and not taken).
    pub(crate) fn is_live(&self) -> bool {
        self.inner.is_some() || self.sent
    }

    /// Cancels the operation if it has not matched a message yet (`MPI_Cancel`), and says
    /// whether it did.
    ///
    /// * A receive still posted is unposted and completes at once: its result is `Ok` with
    ///   the buffer given back untouched and a status for which [`Status::cancelled`] is
    ///   true. It consumed nothing: the message it would have matched goes to a later
    ///   receive. A receive attached to a sync object delivers that status there.
    /// * A receive that has matched (progress on any thread may match it at any time, the
    ///   message then belongs to it) or completed is left alone: `false`, and it completes as
    ///   usual. So is a receive of a message already matched by a probe
    ///   ([`Message::imrecv`](crate::Message::imrecv)). A rendezvous receive (a message
    ///   above the eager threshold) has matched once its read of the sender's buffer has
    ///   started: that read is not stopped, and the receive completes with the whole
    ///   message, its sender with it.
    /// * A send is never cancelled (`false`; it completes as usual). Its frame left with a
    ///   sequence number the receiver orders its messages by (an eager frame in it, a
    ///   rendezvous send's announcement): withdrawing it would need the receiver's
    ///   agreement, a round trip the protocol does not have, and a frame held back for a full
    ///   inbox still fills a number the receiver waits for. MPI 4.0 deprecates cancelling
    ///   sends for the same reasons (§3.8.4).
    ///
    /// Dropping a pending receive cancels it too (without giving the buffer back). Dropping
    /// a matched one discards its message once it is over: a rendezvous read in flight ends
    /// into the buffer the runtime keeps meanwhile, and the sender's request completes —
    /// even if no thread of the receiving rank calls weft again (the rank's courier thread
    /// finishes the read).
    ///
    /// ```
    /// use weft::Runtime;
    /// let rt = Runtime::builder().env(false).build().unwrap();
    /// let comm = rt.world();
    /// let mut r = comm.irecv(Vec::<u8>::with_capacity(4), 0u32, 3).unwrap();
    /// assert!(r.cancel());
    /// let (buf, st) = r.wait().unwrap();
    /// assert!(st.cancelled() && buf.is_empty());
    /// // The message goes to the next receive.
    /// comm.send(vec![7u8], 0, 3).unwrap();
    /// assert_eq!(comm.recv(Vec::<u8>::with_capacity(4), 0u32, 3).unwrap().0, vec![7]);
    /// ```
    pub fn cancel(&mut self) -> bool {
        match &*self.inner {
            Some(inner) if self.unpost(inner) => inner.cell.complete(Ok(Status::CANCELLED)),
            _ => false,
        }
    }

    /// Unposts a pending receive that has not matched; whether it did (never a send).
    fn unpost(&self, inner: &Arc<Operation>) -> bool {
        // The request's own communicator handle keeps the state alive (no table lookup).
        self.kind == Kind::Recv
            && !inner.cell.is_complete()
            && self.comm.state_of(inner.context).is_some_and(|st| self.comm.engine().cancel_recv(st, inner))
    }
}

impl<B: Send + 'static> crate::progress::Waitable for Request<'_, B> {
    fn own_cell(&self) -> &CompletionCell {
        Request::own_cell(self)
    }
    fn is_complete(&self) -> bool {
        Request::is_complete(self)
    }
    /// A sent request, or one whose result was taken, holds no operation: settled, not
    /// failed.
    #[inline]
    fn settled(&self) -> Option<bool> {
        match &*self.inner {
            Some(i) => i.cell.outcome().map(|o| o.is_err()),
            None => Some(false),
        }
    }
    /// A sent request whose cell was never made (nothing attached it) has delivered
    /// nothing: no cell is made to say so.
    fn delivery_spent(&self) -> bool {
        match (&*self.inner, self.sent_cell.get()) {
            (Some(i), _) => !i.cell.attachable(),
            (None, Some(made)) => !made.cell.attachable(),
            (None, None) => false,
        }
    }
    fn is_live(&self) -> bool {
        Request::is_live(self)
    }
    fn engine(&self) -> &Arc<crate::engine::Engine> {
        self.comm.engine()
    }
    fn context_id(&self) -> u32 {
        self.comm.context_id()
    }
    fn part(&self) -> usize {
        Request::part(self)
    }
}

impl<'c, B: RecvBuf> Request<'c, B> {
    pub(crate) fn recv(comm: &'c Communicator, inner: Arc<Operation>, buf: B, part: usize) -> Self {
        let extra = Extra { filled: <B as RecvBuf>::filled };
        Self::with(comm, Some(inner), buf, extra, Kind::Recv, false, part)
    }
}

// The buffer is never pinned structurally: a request is moved freely while pending.
impl<B: Send + 'static> Unpin for Request<'_, B> {}

impl<B: Send + 'static> Future for Request<'_, B> {
    type Output = Result<(B, Status), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if this.sent {
            return Poll::Ready(this.take().expect("a sent request has its result"));
        }
        let Some(inner) = Option::clone(&this.inner) else {
            return Poll::Ready(Err(Error::InvalidArgument("request polled after completion")));
        };
        // A bounded number of passes (`drive_poll`): a `Yielded` end has woken this task,
        // which the executor polls again after its other ready tasks; an `Idle` end left the
        // waker on the doorbell, and the cell's registration below, re-checked, covers a
        // completion by another thread's pass.
        let engine = this.comm.engine();
        match weft_sync::drive_poll(cx, || inner.cell.is_complete(), |cx| engine.poll_progress(cx)) {
            weft_sync::Driven::Done => {
                drop(inner);
                return Poll::Ready(this.take().expect("complete"));
            }
            weft_sync::Driven::Yielded => return Poll::Pending,
            weft_sync::Driven::Idle => {}
        }
        match inner.cell.poll_complete(cx) {
            Poll::Ready(_) => {
                drop(inner);
                Poll::Ready(this.take().expect("complete"))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<B: Send + 'static> Drop for Request<'_, B> {
    /// A request whose result was taken holds nothing of the runtime nor a buffer: dropped
    /// in a few instructions, where it is dropped (`release` is out of line).
    #[inline]
    fn drop(&mut self) {
        if self.inner.is_some() || self.buf.is_some() || self.sent_cell.is_made() {
            self.release();
        }
    }
}

impl<B: Send + 'static> Request<'_, B> {
    /// [`Drop`] of a request that still holds an operation, a buffer or a made cell:
    /// recycles them, and cancels a receive still posted or hands a pending operation the
    /// buffer; drops the buffer otherwise. Leaves `buf` and `sent_cell` empty, so their own
    /// drop has nothing to do.
    #[inline(never)]
    fn release(&mut self) {
        self.recycle_sent_cell();
        let buf = self.buf.take();
        let Some(inner) = self.inner.take() else { return };
        if inner.cell.is_complete() {
            recycle(inner);
            return;
        }
        if self.unpost(&inner) {
            // Unposted before any match: nothing will touch the buffer (dropped after).
            inner.cell.complete(Err(Error::Cancelled));
            return;
        }
        // In flight: hand the buffer to the runtime's share so it outlives the transport's
        // use of it. (An allocation, but only on this abandonment path.)
        if let Some(buf) = buf {
            *inner.orphan.lock() = Some(Box::new(buf));
        }
        if self.kind == Kind::Recv {
            // A matched receive: its rendezvous read, if in flight, must still end (the
            // sender waits for its `Fin`) though nobody waits for it now.
            self.comm.engine().read_abandoned(&inner);
        }
        // Its holder (a matched receive's, held on this reference) drops it with the buffer
        // once it completes, or it is dropped here.
        leave(inner);
    }
}

#[cfg(test)]
mod tests {
    /// A request is moved on every call that makes, stores or takes one: it stays at most
    /// nine words on 64-bit targets (rare-path state lives in its operation).
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_request_stays_small() {
        assert!(std::mem::size_of::<super::Request<'static, Vec<u8>>>() <= 72);
    }

    /// Threads that ask a request's made cell at once all get the same one (a loser of the
    /// race gives its own back), and taking it leaves the slot empty.
    #[test]
    fn a_made_cell_is_made_once() {
        let mut slot = super::MadeCell::new();
        let addrs: Vec<usize> = std::thread::scope(|s| {
            let slot = &slot;
            let askers: Vec<_> =
                (0..4).map(|_| s.spawn(move || std::ptr::from_ref(slot.get_or_init(super::consumed_operation)) as usize)).collect();
            askers.into_iter().map(|a| a.join().unwrap()).collect()
        });
        assert!(addrs.windows(2).all(|w| w[0] == w[1]), "{addrs:?}");
        assert!(slot.is_made());
        let made = slot.take().unwrap();
        assert_eq!(std::sync::Arc::as_ptr(&made) as usize, addrs[0]);
        assert!(!slot.is_made() && slot.take().is_none());
        super::recycle(made);
    }
}
