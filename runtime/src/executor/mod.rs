//! The executor: a work-stealing task pool with progress built in (DESIGN "Executor", seed
//! 003 §4.6.2).
//!
//! * `state.rs` — a task's state word (loom models beside it).
//! * `task.rs` — one spawned future: the waker, [`JoinHandle`] and
//!   [`JoinError`] (a panic in a task, its poll or its future's `Drop`, is caught and
//!   reported, never an abort).
//! * `pool.rs` — the pool: a crossbeam-deque `Worker` per thread, one global `Injector`,
//!   stealers; the worker loop (local queue, the injector every 61 ticks for fairness,
//!   progress when idle, stealing, parking); shutdown when the last `Runtime` handle drops.
//! * `registry.rs` — every live task, so shutdown cancels the ones waiting for a wake too.
//! * `park.rs` — who sleeps and who wakes them: new tasks unpark one sleeping worker;
//!   network activity (the transport's doorbell) wakes a worker that may progress.
//! * `block_on.rs` — running a future on the calling thread ([`crate::Runtime::block_on`]).
//! * `split.rs` — fork-join of borrowed work (parallel packing): the caller runs pieces
//!   itself and waiting threads steal the rest.
//!
//! Progress in the pool: an idle worker first makes one non-blocking progress pass
//! (`Shared::progress_idle`: the owner token's try path, a CRI try-lock, or the progress
//! lock's try path), then steals, then parks. A user thread blocked in `wait_all` runs pool
//! tasks instead of sleeping (`help`), and returns once its own requests are complete.

mod block_on;
mod park;
mod pool;
mod registry;
mod split;
mod state;
mod task;

pub(crate) use block_on::block_on;
pub(crate) use pool::{help, Executor};
pub(crate) use split::split;
pub use task::{JoinError, JoinHandle};
