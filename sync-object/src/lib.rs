//! Completion cells and sync objects for weft.
//!
//! This crate is the bottom of weft's stack and knows nothing of networks. It provides:
//!
//! * [`CompletionCell`] — the per-operation state word every request owns. The transport
//!   completes it exactly once; a poller is woken, or, if the request was attached to a sync
//!   object, the completion is pushed onto that object's queue. Attach and completion race;
//!   one atomic read-modify-write decides ([Patinyasakdikul 2019, §4.6.1]).
//! * [`SyncObject`] — `MPIX_Sync` of [Patinyasakdikul 2019, App. B]: a completion counter and a
//!   completion queue that many threads may query at once (`query` ≈ `MPI_Testany`,
//!   `query_bulk` ≈ `MPI_Testsome`, `size` and `probe` in O(1), blocking `wait_all` /
//!   `wait_any`, and an async [`next`](SyncObject::next) / [`Stream`](futures_core::Stream)).
//! * [`Progress`] — the hook a runtime gives blocked waiters, so that a waiter can become the
//!   progress owner, park, or run other work ([Patinyasakdikul 2019, Alg. 2]).
//!
//! # Example
//!
//! Four "operations" complete on another thread; the waiting thread collects their data
//! without ever looping over the requests.
//!
//! ```
//! use std::sync::Arc;
//! use weft_sync::{Attach, CompletionCell, Status, SyncObject};
//!
//! struct Op(Arc<CompletionCell>);
//! // SAFETY: the cell is kept alive by the Arc until completed.
//! unsafe impl Attach for Op {
//!     fn completion_cell(&self) -> &CompletionCell { &self.0 }
//! }
//!
//! let sync = SyncObject::new();
//! let mut cells = Vec::new();
//! for i in 0..4u32 {
//!     let mut op = Op(Arc::new(CompletionCell::new()));
//!     cells.push(op.0.clone());
//!     sync.attach(&mut op, i).unwrap();
//! }
//! let t = std::thread::spawn(move || {
//!     for (i, c) in cells.iter().enumerate() {
//!         c.complete(Ok(Status { source: 1, tag: i as i32, bytes: 0 }));
//!     }
//! });
//! sync.wait_all().unwrap();
//! let mut got = Vec::new();
//! sync.query_bulk(&mut got, 16);
//! assert_eq!(got.len(), 4);
//! t.join().unwrap();
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

mod callback;
mod cell;
mod idle;
pub(crate) mod loom;
mod object;
mod signal;
pub mod stamps;
mod status;
mod wait;

pub use callback::{on_complete, Callback, Refused};
pub use cell::CompletionCell;
pub use idle::IdleBackoff;
pub use object::{Attach, AttachError, Completion, Completions, Counted, Detached, Drained, Next, SyncObject};
pub use signal::{Signal, SignalListener};
pub use status::{Error, Outcome, Status};
pub use wait::{drive_poll, Driven, Progress, Step, POLL_PASSES};
