//! Fork-join over borrowed data (parallel datatype packing, seed 003 §4.6.2): the caller
//! queues pieces as pool tasks, runs the first itself, then helps with whatever is queued
//! until every piece is done — so idle workers and waiting threads share the copying.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::Thread;
use std::time::Duration;

use crate::runtime::Shared;

/// Counts pieces still running; the last one wakes the caller.
struct Latch {
    /// Pieces not yet finished (or dropped).
    remaining: AtomicUsize,
    /// The caller, parked while it has nothing to help with.
    caller: Thread,
}

/// A piece's claim on the latch: released when the piece ran, panicked or was cancelled.
struct Piece {
    latch: Arc<Latch>,
    /// The work, borrowed from the caller's stack (see the SAFETY note in `split`).
    work: *const (dyn Fn(usize) + Sync),
    index: usize,
}

// SAFETY: `work` is `Sync` and outlives the piece (the caller waits for every piece to drop).
unsafe impl Send for Piece {}

impl Piece {
    fn run(&self) {
        // SAFETY: `split` does not return before this piece is dropped, so the borrow the
        // pointer came from is alive.
        unsafe { (*self.work)(self.index) }
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        let caller = self.latch.caller.clone();
        // Release: the piece's writes happen before the caller's acquire of zero.
        if self.latch.remaining.fetch_sub(1, Ordering::Release) == 1 {
            caller.unpark();
        }
    }
}

/// Runs `work(0..pieces)`, pieces 1.. as pool tasks when the pool is available, and returns
/// when all have run.
pub(crate) fn split(shared: &Arc<Shared>, pieces: usize, work: &(dyn Fn(usize) + Sync)) {
    let pool = if pieces > 1 && shared.config.workers > 0 { shared.executor.start(shared) } else { None };
    let Some(pool) = pool else {
        (0..pieces).for_each(work);
        return;
    };
    let latch = Arc::new(Latch { remaining: AtomicUsize::new(pieces - 1), caller: std::thread::current() });
    // SAFETY: erasing the lifetime is sound because this function waits
    // below until every `Piece` has been dropped, and a piece only dereferences the pointer
    // while it is alive.
    let work_ptr: *const (dyn Fn(usize) + Sync + 'static) =
        unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), *const (dyn Fn(usize) + Sync + 'static)>(work) };
    for index in 1..pieces {
        let piece = Piece { latch: latch.clone(), work: work_ptr, index };
        drop(pool.spawn(async move { piece.run() }));
    }
    // A panic in our piece must not unwind past the pieces still borrowing `work`: wait for
    // them first, then resume it.
    let mine = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(0)));
    // Acquire: pairs with the pieces' release.
    while latch.remaining.load(Ordering::Acquire) != 0 {
        if !super::pool::run_one(shared) {
            std::thread::park_timeout(Duration::from_millis(10));
        }
    }
    if let Err(p) = mine {
        std::panic::resume_unwind(p);
    }
}
