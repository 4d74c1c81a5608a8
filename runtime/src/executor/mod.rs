//! The executor: a work-stealing task pool with progress built in (DESIGN "Executor",
//! [Patinyasakdikul 2019, §4.6.2]).
//!
//! * `state.rs` — a task's state word (loom models beside it).
//! * `task.rs` — one spawned future: the waker, [`JoinHandle`] and
//!   [`JoinError`] (a panic in a task, its poll or its future's `Drop`, is caught and
//!   reported, never an abort).
//! * `pool.rs` — the pool: a crossbeam-deque `Worker` per thread, one global `Injector`,
//!   stealers; the worker loop (local queue, the injector every 61 ticks for fairness,
//!   progress when idle, stealing, parking); shutdown when the last `Runtime` handle drops.
//! * `registry.rs` — every live task spawned as a future, so shutdown cancels the ones
//!   waiting for a wake too (a task that never waits for one, a pool continuation's, is left
//!   out: a queue always holds it until it runs; `task.rs`, "Shutdown").
//! * `park.rs` — who sleeps and who wakes them: new tasks unpark one sleeping worker;
//!   network activity (the transport's doorbell) wakes a worker that may progress.
//! * `block_on.rs` — running a future on the calling thread ([`crate::Runtime::block_on`]).
//! * `split.rs` — fork-join of borrowed work (parallel packing): the caller runs pieces
//!   itself and waiting threads steal the rest.
//!
//! Progress in the pool: an idle worker first makes one non-blocking progress pass
//! ([`Drive::idle_pass`]: the owner token's try path, a CRI try-lock, or the progress
//! lock's try path), then steals, then parks. The executor knows nothing of ranks,
//! transports or progress modes: what it needs of them is the [`Drive`] trait, which the
//! progress layer implements for the rank's engine. A user thread blocked in `wait_all` runs pool
//! tasks instead of sleeping (`help`), and returns once its own requests are complete.

mod block_on;
mod park;
mod pool;
mod registry;
mod split;
mod state;
mod task;

use weft_sync::SignalListener;

pub(crate) use block_on::block_on;
pub(crate) use park::Unpark;
pub(crate) use pool::{help, Executor, Hint};
pub(crate) use split::split;
// A task of its own kind outside this module (a pool continuation's, `continuation.rs`):
// one that never waits for a wake, queued with `Pool::schedule`, is always in a run queue or
// running, so shutdown reaches it without the registry (`Runnable::bind` does nothing).
pub(crate) use registry::Key;
pub(crate) use task::Runnable;
pub use task::{JoinError, JoinHandle};

/// What the pool needs from the runtime it serves (the progress layer implements it,
/// `progress/drive.rs`), as weft-sync's `Progress` lets a sync object wait without knowing
/// who progresses.
pub(crate) trait Drive: Send + Sync + 'static {
    /// One non-blocking progress pass, never waiting for a lock; whether anything was
    /// handled.
    fn idle_pass(&self) -> bool;
    /// Listens for the network activity a worker about to park must wake for, then looks
    /// once more for such work that came before it listened, and hands `f` the outcome:
    /// `None` if there is work now, else the listener (on this stack frame: a park
    /// allocates nothing) and whether it is an ownership hand-off (meant for a blocked
    /// waiter) rather than the doorbell.
    fn listen_scoped(&self, f: &mut dyn FnMut(Option<Listening<'_>>));
    /// A parked worker heard its listener (`handoff` as [`listen_scoped`](Self::listen_scoped)
    /// said). The
    /// notification may have been meant for a blocked thread: use it, or pass it on.
    fn heard(&self, handoff: bool);
    /// Counts a park of a worker (`wake`: one ended by a notification).
    fn count_park(&self, wake: bool);
}

/// What [`Drive::listen_scoped`] hands a worker about to park: the listener, and whether it
/// is an ownership hand-off.
pub(crate) type Listening<'a> = (SignalListener<'a>, bool);
