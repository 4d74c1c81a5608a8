//! The runtime's share of one operation in flight (a send or a receive): its completion
//! cell, the buffer area the transport reads or fills, and the buffer of a request dropped
//! in flight. Matching queues hold these, not the user's [`Request`](crate::Request)s.
//!
//! Operations come from a thread-local pool ([Goodell 2010]: thread-local request pools), so
//! a send or receive allocates nothing in steady state. An operation goes back to the pool
//! of the thread that drops it last: the waiting thread for a request waited for, the
//! completing thread for one dropped in flight or whose result went to a continuation. Where
//! one thread posts and others complete, the completers' pools would fill while the poster's
//! ran dry: past [`POOL_MAX`], and when the thread ends, a thread's spares go to a small
//! process-wide queue ([`SHARED_MAX`]), from which a thread whose pool is empty takes before
//! it allocates.

use std::any::Any;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use weft_sync::{CompletionCell, Outcome, Status};

use crate::spares::{SharedSpares, Spares};

use crate::loom::sync::atomic::{fence, AtomicU64, Ordering};

/// The runtime's share of one operation in flight.
pub(crate) struct Operation {
    /// Completion state (weft-sync).
    pub(crate) cell: CompletionCell,
    /// Receive area (receive) or registered source bytes (rendezvous send).
    pub(crate) ptr: *mut u8,
    /// Length of that area in bytes.
    pub(crate) cap: usize,
    /// A message must be a whole number of these bytes.
    pub(crate) elem: usize,
    /// Remote key of the registered send buffer (rendezvous send), else 0.
    pub(crate) key: AtomicU64,
    /// Context of the communicator (for cancel).
    pub(crate) context: u32,
    /// The buffer of a request dropped while in flight: kept alive until completion so the
    /// transport never touches freed memory.
    pub(crate) orphan: Mutex<Option<Box<dyn Any + Send>>>,
    /// On a communicator whose ranks are not the world's: the cell a user's sync object
    /// attaches to, completed with the operation's outcome in ranks there (made on the first
    /// attach; `None` if the operation's own cell was attached already). Kept here, not in
    /// the request, so that a request stays small to move. Beside it a `Weak` of the
    /// operation itself: an operation that has made its relay is never pooled ([`recycle`]
    /// pools none that a `Weak` names), so a pooled one never has to clear it.
    pub(crate) relay: OnceLock<(Option<Arc<Operation>>, Weak<Operation>)>,
}

// SAFETY: `ptr` points into the buffer owned by the request (or its orphan slot), which lives
// at least as long as this `Operation` is in flight; it is written only by the single
// completer before it completes the cell (release) and read by the owner after (acquire).
unsafe impl Send for Operation {}
// SAFETY: as above; shared access goes through the cell's atomics and the orphan mutex.
unsafe impl Sync for Operation {}

impl Default for Operation {
    fn default() -> Self {
        Operation {
            cell: CompletionCell::new(),
            ptr: std::ptr::null_mut(),
            cap: 0,
            elem: 1,
            key: AtomicU64::new(0),
            context: 0,
            orphan: Mutex::new(None),
            relay: OnceLock::new(),
        }
    }
}

#[cfg(test)]
impl Operation {
    /// A fresh operation marked to be held on its owner's reference, as a receive's is.
    pub(crate) fn held() -> Operation {
        let mut op = Operation::default();
        hold(&mut op);
        op
    }
}

/// Pooled requests per thread; beyond this many the extras go to the shared queue.
const POOL_MAX: usize = 1024;

/// Operations the process-wide queue keeps; beyond this many the extras are freed.
const SHARED_MAX: usize = 16384;

/// The process-wide queue of spare operations (module docs).
static SHARED: SharedSpares<Arc<Operation>> = SharedSpares::new(SHARED_MAX);

/// A thread's spare operations.
type Pool = Spares<Arc<Operation>, POOL_MAX>;

thread_local! {
    static POOL: Pool = const { Pool::new(&SHARED) };
}

/// A fresh (or recycled) inner, set up by `init` while still exclusively owned.
#[inline]
pub(crate) fn new_operation(init: impl FnOnce(&mut Operation)) -> Arc<Operation> {
    match pool().map_or_else(|| SHARED.take(), Pool::take) {
        Some(arc) => {
            // SAFETY: `recycle` pools an `Arc` only when it is the sole strong reference and no
            // `Weak` exists (one is made only by an operation that makes a relay), and the pool
            // is thread-local, so nothing else can reach this `Operation` until we hand the
            // `Arc` out: the exclusive borrow is sound. (`Arc::get_mut` would prove the same with a locked compare-exchange on
            // the weak count, once per message.)
            let inner = unsafe { &mut *Arc::as_ptr(&arc).cast_mut() };
            // What may call out (a pending attachment's cancellation, an orphan's drop)
            // first, the plain fields last: `init`, inlined, then overwrites them with no
            // call in between, and the compiler drops the stores it overwrites (a receive
            // sets all four).
            inner.cell.reset();
            *inner.orphan.get_mut() = None;
            // A plain store, like `get_mut` (loom's atomics have no `get_mut`).
            inner.key.store(0, Ordering::Relaxed);
            inner.ptr = std::ptr::null_mut();
            inner.cap = 0;
            inner.elem = 1;
            inner.context = 0;
            debug_assert!(inner.relay.get().is_none(), "an operation with a relay is never pooled");
            init(inner);
            arc
        }
        None => {
            let mut inner = Operation::default();
            init(&mut inner);
            Arc::new(inner)
        }
    }
}

/// Returns an inner to this thread's pool if nobody else holds it.
#[inline(always)]
pub(crate) fn recycle(arc: Arc<Operation>) {
    if arc.cell.is_complete() {
        recycle_completed(arc);
    }
}

/// [`recycle`] for an operation whose completion the caller has seen (acquire), as taking a
/// request's result has: its cell is not tested again.
#[inline(always)]
pub(crate) fn recycle_completed(arc: Arc<Operation>) {
    // `strong_count` loads Relaxed; the Acquire fence below orders our reuse after the
    // accesses of the last other holder (which dropped its reference with a Release
    // decrement), as `Arc`'s own drop does before freeing.
    if Arc::strong_count(&arc) == 1 && Arc::weak_count(&arc) == 0 {
        fence(Ordering::Acquire);
        if let Some(p) = pool() {
            p.keep(arc);
        }
    }
}

/// This thread's pool (`None` while the thread is being torn down). The thread-local access
/// alone is in the closure, so that it inlines where the pool is used (a call per message
/// less on each side).
#[inline(always)]
fn pool() -> Option<&'static Pool> {
    // SAFETY: the pool lives until its own destructor runs, after which `try_with` fails;
    // the reference is used only within the calling function, which runs no destructor of
    // this thread's thread-locals meanwhile.
    POOL.try_with(|p| unsafe { &*(p as *const Pool) }).ok()
}

/// A posted receive's operation as matching holds it: on the request's reference, with no
/// count of its own, so that posting a receive and completing it touch no reference count
/// (a locked add and a locked decrement a message).
///
/// The invariant that keeps it valid: the operation's cell is marked held
/// ([`CompletionCell::mark_held`], by [`hold`] while the request owns it alone), one `Held`
/// at most exists for it (queued in one matching state, then moved into one pair or list),
/// and each `Held` ends in one of three ways:
///
/// * completed ([`complete`](Held::complete), [`complete_ok`](Held::complete_ok)): until its
///   cell is complete the request keeps its reference, or has left it to the holder
///   (`Request`'s drop of a matched receive, a continuation: [`leave`]); the completion says
///   which, and the holder drops the reference it inherited. After `COMPLETE` the holder
///   touches the operation only under a reference of its own, taken before the completion
///   when it has a delivery to make (an attached sync object, a registered waker);
/// * made counted ([`counted`](Held::counted)): a reference of its own taken, for code that
///   keeps operations by `Arc` (a rendezvous read, the receives failed by a lost peer or a
///   freed communicator); an owner that had left gave its reference too, one is dropped;
/// * dropped uncompleted, which makes it counted and drops that: a receive unposted by its
///   request's owner (cancelled, or refused at posting) under the matching lock, or the
///   receives still posted when a matching state goes at shutdown.
///
/// So the operation is alive while a `Held` exists, and an owner that takes a completed
/// result (and pools the operation) has no holder left to race with.
pub(crate) struct Held(NonNull<Operation>);

// SAFETY: a `Held` is a shared reference to a `Sync` operation kept alive by the invariant
// above; moving it between threads is moving that reference.
unsafe impl Send for Held {}
// SAFETY: as above; `&Held` gives `&Operation` only.
unsafe impl Sync for Held {}

/// Marks a receive's operation, still owned by its request alone, to be held on the
/// request's reference once posted (set up in [`new_operation`]'s `init`).
#[inline(always)]
pub(crate) fn hold(op: &mut Operation) {
    op.cell.mark_held();
}

impl Held {
    /// The holder's share of `op` (marked held), on `op`'s reference: no count.
    #[inline(always)]
    pub(crate) fn of(op: &Arc<Operation>) -> Held {
        debug_assert!(op.cell.is_held(), "an operation held without a count is marked so");
        Held(NonNull::from(&**op))
    }

    /// Whether this is `op`'s.
    #[inline]
    pub(crate) fn is(&self, op: &Arc<Operation>) -> bool {
        std::ptr::eq(self.0.as_ptr(), Arc::as_ptr(op))
    }

    /// A counted reference, taken while the owner's (or the one it left) keeps the
    /// operation alive.
    #[inline]
    fn count(&self) -> Arc<Operation> {
        let p = self.0.as_ptr().cast_const();
        // SAFETY: `p` came from an `Arc` (`of`), alive by the type's invariant.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }

    /// The reference the owner left to this holder.
    ///
    /// # Safety
    /// Once per operation, after the cell said the owner left (`complete_held`,
    /// `hold_counted`).
    #[inline]
    unsafe fn inherited(&self) -> Arc<Operation> {
        // SAFETY: per the contract, the owner's reference (an `Arc::into_raw`'s worth) is ours.
        unsafe { Arc::from_raw(self.0.as_ptr().cast_const()) }
    }

    /// Completes the receive with `outcome` (the type's first way out).
    #[inline]
    pub(crate) fn complete(self, outcome: Outcome) {
        let this = ManuallyDrop::new(self);
        let (left, pinned) = this.cell.complete_held(outcome, || this.count());
        this.settle(left, pinned);
    }

    /// [`complete`](Self::complete) with a success, its status written into the cell where it
    /// is made ([`CompletionCell::complete_held`] inlined).
    #[inline(always)]
    pub(crate) fn complete_ok(self, status: Status) {
        let this = ManuallyDrop::new(self);
        let (left, pinned) = this.cell.complete_held(Ok(status), || this.count());
        if left || pinned.is_some() {
            this.settle(left, pinned);
        }
    }

    /// After the completion: drops the references the holder has (the one the owner left,
    /// one taken for a delivery).
    #[cold]
    #[inline(never)]
    fn settle(&self, left: bool, pinned: Option<Arc<Operation>>) {
        if let Some(p) = pinned {
            release(p);
        }
        if left {
            // SAFETY: `complete_held` said the owner left.
            release(unsafe { self.inherited() });
        }
    }

    /// A counted reference for code that keeps operations by `Arc` (the type's second way
    /// out).
    pub(crate) fn counted(self) -> Arc<Operation> {
        let this = ManuallyDrop::new(self);
        let own = this.count();
        if own.cell.hold_counted() {
            // SAFETY: the owner left before the count was taken: its reference is ours too,
            // one more than we keep.
            drop(unsafe { this.inherited() });
        }
        own
    }
}

impl Drop for Held {
    /// The type's third way out, a receive unposted uncompleted: by its owner (a cancel),
    /// who holds its reference, or with the matching state at shutdown, whose receives'
    /// owners may have left them their references. Made counted and dropped, the last
    /// reference goes either way (and with it, at shutdown, an attachment still waiting,
    /// cancelled). Never on the paths of a message.
    #[cold]
    fn drop(&mut self) {
        drop(Held(self.0).counted());
    }
}

impl std::ops::Deref for Held {
    type Target = Operation;
    #[inline(always)]
    fn deref(&self) -> &Operation {
        // SAFETY: alive by the type's invariant.
        unsafe { self.0.as_ref() }
    }
}

/// A reference to a completed operation dropped by the runtime: the buffer of a dropped
/// request goes with the last one, and the operation back to this thread's pool.
pub(crate) fn release(op: Arc<Operation>) {
    if Arc::strong_count(&op) == 1 {
        drop(op.orphan.lock().take());
    }
    recycle(op);
}

/// The request's reference to a pending operation let go (a dropped request whose receive
/// matched, a result handed to a continuation): left to the operation's holder if it holds
/// it on this reference ([`Held`]), dropped otherwise.
pub(crate) fn leave(op: Arc<Operation>) {
    if op.cell.leave() {
        // The holder's now: it drops it when it completes the operation.
        std::mem::forget(op);
    } else {
        release(op);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> Outcome {
        Ok(Status { source: 0, tag: 1, bytes: 0 })
    }

    /// A held receive's holder and its request, in either order: the reference is dropped
    /// once, by whichever lets go last.
    #[test]
    fn a_holder_drops_the_reference_its_request_left_it() {
        // The request leaves first (dropped after its receive matched): the completion drops
        // the operation with it.
        let op = Arc::new(Operation::held());
        let gone = Arc::downgrade(&op);
        let held = Held::of(&op);
        leave(op);
        assert!(gone.upgrade().is_some(), "left to the holder, not dropped");
        held.complete(ok());
        assert!(gone.upgrade().is_none(), "the holder dropped the reference it was left");

        // The completion first: the holder drops nothing, the request its own reference.
        let op = Arc::new(Operation::held());
        let gone = Arc::downgrade(&op);
        Held::of(&op).complete_ok(Status { source: 0, tag: 1, bytes: 0 });
        assert_eq!((Arc::strong_count(&op), op.cell.outcome()), (1, Some(ok())));
        leave(op);
        assert!(gone.upgrade().is_none(), "the request dropped its reference itself");
    }

    /// A holder made counted before or after its request left: one reference each, each
    /// dropped once.
    #[test]
    fn a_counted_holder_keeps_one_reference() {
        let op = Arc::new(Operation::held());
        let gone = Arc::downgrade(&op);
        let held = Held::of(&op);
        leave(op);
        let counted = held.counted();
        assert_eq!(Arc::strong_count(&counted), 1, "the reference left to it dropped");
        counted.cell.complete(ok());
        drop(counted);
        assert!(gone.upgrade().is_none());

        let op = Arc::new(Operation::held());
        let gone = Arc::downgrade(&op);
        let counted = Held::of(&op).counted();
        assert_eq!(Arc::strong_count(&op), 2);
        leave(op);
        assert_eq!(Arc::strong_count(&counted), 1, "the request dropped its own");
        drop(counted);
        assert!(gone.upgrade().is_none());
    }

    /// A holder dropped uncompleted: a cancel's (the request keeps its reference) or a
    /// matching state's at shutdown (the request left it its reference: the operation goes,
    /// with it).
    #[test]
    fn a_holder_dropped_uncompleted_drops_only_what_it_was_left() {
        let op = Arc::new(Operation::held());
        drop(Held::of(&op));
        assert_eq!(Arc::strong_count(&op), 1, "the request's reference stays");
        let gone = Arc::downgrade(&op);
        leave(op);
        assert!(gone.upgrade().is_none(), "the request dropped its reference itself");

        let op = Arc::new(Operation::held());
        let gone = Arc::downgrade(&op);
        let held = Held::of(&op);
        leave(op);
        drop(held);
        assert!(gone.upgrade().is_none(), "the holder dropped the reference it was left");
    }

    /// An operation not held (a send's) is dropped by the request that leaves it.
    #[test]
    fn an_operation_not_held_is_dropped_by_its_request() {
        let op = Arc::new(Operation::default());
        let gone = Arc::downgrade(&op);
        leave(op);
        assert!(gone.upgrade().is_none());
    }
}
