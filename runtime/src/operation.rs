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
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use weft_sync::CompletionCell;

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
