//! Fork-join over borrowed data (parallel datatype packing, [Patinyasakdikul 2019, §4.6.2]): the caller
//! queues pieces as pool tasks, runs the first itself, then helps with whatever is queued
//! until every piece is done — so idle workers and waiting threads share the copying.
//!
//! A queued piece may never run on the pool: the runtime shuts down (the last `Runtime`
//! handle drops on another thread) and cancels it, or it panics. Its task then drops it
//! unrun, and the caller runs it itself once every piece has been dropped. Every piece runs
//! before `split` returns, whatever happens to the pool: a pack never leaves part of its
//! buffer unwritten.

use std::sync::Arc;
use std::thread::Thread;
use std::time::Duration;

use super::pool::Executor;
use super::Drive;
use crate::loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Counts pieces still held by pool tasks; the last one dropped wakes the caller.
struct Latch {
    /// Pieces not yet dropped (run, cancelled or panicked).
    remaining: AtomicUsize,
    /// Per piece (index 0, the caller's, unused): it ran to the end on the pool.
    ran: Box<[AtomicBool]>,
    /// The caller, parked while it has nothing to help with.
    caller: Thread,
}

/// A piece's claim on the latch: released when the piece's task drops it, whether it ran,
/// panicked or was cancelled (the `ran` flag tells which).
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
        // Relaxed: published by the release in `drop`, which follows.
        self.latch.ran[self.index].store(true, Ordering::Relaxed);
    }
}

impl Drop for Piece {
    fn drop(&mut self) {
        let caller = self.latch.caller.clone();
        // Release: the piece's writes (and its `ran` flag) happen before the caller's acquire
        // of zero.
        if self.latch.remaining.fetch_sub(1, Ordering::Release) == 1 {
            caller.unpark();
        }
    }
}

/// Runs `work(0..pieces)`, pieces 1.. as pool tasks when the pool is available, and returns
/// when all have run. A piece the pool did not run to the end (cancelled at shutdown, or
/// panicked) is run again on the calling thread, so a panic in `work` shows here.
///
/// A caller that could not run tasks while it waits (nested [`MAX_HELP_DEPTH`] waits deep
/// already) runs every piece itself: on a worker, its pieces would sit in its own queue.
///
/// [`MAX_HELP_DEPTH`]: super::pool::MAX_HELP_DEPTH
pub(crate) fn split(executor: &Executor, drive: impl FnOnce() -> Arc<dyn Drive>, pieces: usize, work: &(dyn Fn(usize) + Sync)) {
    let pool = if pieces > 1 && executor.workers() > 0 && super::pool::may_help() { executor.start(drive) } else { None };
    let Some(pool) = pool else {
        (0..pieces).for_each(work);
        return;
    };
    let latch = Arc::new(Latch {
        remaining: AtomicUsize::new(pieces - 1),
        ran: (0..pieces).map(|_| AtomicBool::new(false)).collect(),
        caller: std::thread::current(),
    });
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
        // Counted as helping: the tasks run here nest inside the caller's stack.
        if !super::pool::help(executor) {
            std::thread::park_timeout(Duration::from_millis(10));
        }
    }
    if let Err(p) = mine {
        std::panic::resume_unwind(p);
    }
    // Every piece is dropped: what the pool did not run, we run (`work` is ours again).
    for index in 1..pieces {
        // Relaxed: ordered by the acquire of zero above.
        if !latch.ran[index].load(Ordering::Relaxed) {
            work(index);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::loom::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    use super::split;
    use crate::engine::Engine;
    use crate::Runtime;

    /// Runs `scenario` on its own thread; panics naming `what` if it is not done in 10 s.
    fn within<T: Send + 'static>(what: &str, scenario: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let _ = tx.send(scenario());
        });
        match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(v) => v,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("hang: {what}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => std::panic::resume_unwind(t.join().unwrap_err()),
        }
    }

    /// Splits 8 pieces whose first (run by the caller) shuts the pool down, and returns how
    /// often each piece ran.
    fn split_that_shuts_down(engine: &Arc<Engine>) -> Vec<usize> {
        let runs: Vec<AtomicUsize> = (0..8).map(|_| AtomicUsize::new(0)).collect();
        split(&engine.executor, || -> Arc<dyn super::super::Drive> { engine.clone() }, runs.len(), &|i| {
            if i == 0 {
                engine.executor.shutdown();
            }
            runs[i].fetch_add(1, Ordering::Relaxed);
        });
        runs.iter().map(|r| r.load(Ordering::Relaxed)).collect()
    }

    /// Pieces still queued when the pool shuts down are cancelled (dropped unrun); the
    /// caller runs them itself, each exactly once. They used to count as done, and `split`
    /// returned with their part of the work never done.
    #[test]
    fn cancelled_pieces_run_on_the_caller() {
        let runs = within("split whose pieces are cancelled", || {
            let rt = Runtime::builder().env(false).workers(1).build().unwrap();
            let engine = rt.engine.clone();
            // Keep the only worker busy until the pool has shut down, so every piece the
            // caller queues stays in the injector and is cancelled by the shutdown.
            let (started, busy) = mpsc::channel();
            let e2 = engine.clone();
            drop(rt.spawn(async move {
                started.send(()).unwrap();
                while e2.executor.get().is_some() {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }));
            busy.recv().unwrap();
            split_that_shuts_down(&engine)
        });
        assert_eq!(runs, [1; 8], "runs per piece");
    }

    /// The same from a task on the pool's only worker: its pieces sit in the worker's own
    /// queue, which nobody else drains while it waits; the waiting worker cancels them (the
    /// pool is shutting down) and runs them itself. It used to wait for them forever.
    #[test]
    fn pieces_queued_on_a_waiting_worker_run_on_it() {
        let runs = within("split inside a task while the pool shuts down", || {
            let rt = Runtime::builder().env(false).workers(1).build().unwrap();
            let engine = rt.engine.clone();
            let (tx, rx) = mpsc::channel();
            drop(rt.spawn(async move { tx.send(split_that_shuts_down(&engine)).unwrap() }));
            rx.recv().unwrap()
        });
        assert_eq!(runs, [1; 8], "runs per piece");
    }
}
