//! weft: a runtime for programs in which many threads or async tasks communicate at once.
//!
//! weft moves MPI-style tagged messages between *ranks* without the lock contention that
//! makes multithreaded MPI slow. Its designs come from the research in `docs/REFERENCES.md`: sync
//! objects with completion queues (`MPIX_Sync`), a serialized progress owner, Communication
//! Resource Instances (CRIs) with try-lock and dedicated assignment, and per-communicator
//! matching.
//!
//! # The path of one message
//!
//! 1. A thread calls [`Communicator::isend`]; weft builds a [`Request`] (a `Future`) whose
//!    operation (`operation.rs`) owns a `CompletionCell` (crate `weft-sync`) — `request.rs`.
//! 2. The runtime picks a CRI for the thread (dedicated or round-robin, `engine/cris.rs`),
//!    takes its lock and hands the frame to the transport — `progress/send.rs`
//!    (`post_frame`; a frame a full inbox refuses waits in `engine/outbox.rs`).
//! 3. The transport moves the bytes (embedded provider: a lock-free inbox of the peer's CRI;
//!    libfabric: `fi_inject`/`fi_send` on the CRI's endpoint) — crate `weft-transport`,
//!    chosen in `provider.rs`.
//! 4. Progress — the owner, the global-lock holder, or any thread winning a CRI's try-lock,
//!    per the [`ProgressMode`] — drains inboxes — `progress/`.
//! 5. Matching checks the sequence number, pairs the frame with a posted receive or queues
//!    it as unexpected, copies the payload and completes the cell — `matching/`,
//!    `engine/frames.rs` (`finish_match`; a rendezvous message is read by `engine/reads.rs`).
//! 6. Completing the cell wakes the polling task, or pushes the completion onto the attached
//!    [`SyncObject`]'s queue and wakes its waiters — `weft-sync`.
//!
//! # Where things live
//!
//! The crate is layered; a layer names only the layers below it (`runtime/tests/layers.rs`
//! checks the sources):
//!
//! | layer | files | what |
//! |---|---|---|
//! | API | `runtime.rs`, `comm.rs`, `group.rs`, `create.rs`, `coll.rs`, `coll_steps.rs`, `nbc.rs`, `request.rs`, `wait.rs`, `probe.rs`, `persistent.rs`, `persistent_coll.rs`, `continuation.rs`, `partitioned.rs`, `datatype.rs`, `counters.rs`, `rma/`, `dlock/` | [`Runtime`] and [`Builder`], [`Communicator`] and its [`Group`], communicator creation ([Dinan 2012]), the collectives and their schedules, [`Request`] (and its cancel), the waits, matched probe ([`Message`]), [`Persistent`] requests, continuations ([`ContinuationRequest`], [Schuchart 2021]), partitioned sends and receives, datatypes, [`Snapshot`], one-sided windows ([`rma`]) and the distributed locks over them ([`dlock`]) |
//! | progress | `progress/` | the three [`ProgressMode`]s (`global.rs`, `owner.rs`, `concurrent.rs`), one pass (`mod.rs`), parking (`park.rs`), blocking waits (`wait.rs`), posting a frame (`send.rs`), what the executor and sync objects call (`drive.rs`) |
//! | engine | `engine/` | one rank's state by component — CRIs, the context table, frames into completions, rendezvous reads, the outbox of refused frames, lost peers, the courier, the collectives in flight — with what guards each and the lock order (`engine/README.md`) |
//! | matching, executor | `matching/`, `executor/` | the matching engine of one communicator (over operations, `operation.rs`); the work-stealing pool, which knows the runtime only through its `Drive` trait |
//! | base | `lock/`, `config.rs`, `buffer.rs`, `provider.rs`, `operation.rs`, `loom.rs` | lock protocols, the path locks and the progress owner token; configuration; buffers; the transport's choice; an operation's completion state; the loom facade |
//!
//! # Executor
//!
//! Each runtime has a work-stealing pool (`executor/`: crossbeam-deque worker deques, a
//! global injector, stealers) that starts at the first [`Runtime::spawn`] with
//! [`Builder::workers`] threads (`WEFT_WORKERS`) and stops when the last `Runtime` handle
//! drops. [`JoinHandle`] is a future giving the task's output or a [`JoinError`] (a panic
//! is caught, not an abort). An idle worker first makes a non-blocking progress pass (the
//! owner token's try path in `Owner` mode, CRI try-locks in `Concurrent`, the progress
//! lock's try path in `Global`), then steals, then parks; new tasks or network activity (the
//! transport's doorbell) wake it, so an idle runtime costs ~0% CPU. A thread blocked in a
//! wait runs pool tasks meanwhile ([Patinyasakdikul 2019, §4.6.2]). [`Request`] and [`SyncObject`] futures
//! are executor-agnostic: inside tokio, the first poller that wins progress drives it.
//!
//! # Datatypes
//!
//! [`Datatype`] describes contiguous, vector and indexed layouts of primitive elements;
//! [`Communicator::isend_typed`] packs on send and [`Communicator::irecv_typed`] unpacks on
//! receipt (any size: large messages go by rendezvous). Packs of at least the pack
//! threshold ([`Builder::pack_threshold`], 256 KiB) are split into pool tasks, so idle
//! workers and waiting threads share the copying ([`Runtime::pack`]).
//!
//! ```
//! use weft::{Datatype, Runtime};
//! let rt = Runtime::builder().workers(2).build().unwrap();
//! // Sum of 1000 tasks, each on the pool.
//! let handles: Vec<_> = (0..1000u64).map(|i| rt.spawn(async move { i })).collect();
//! let sum = rt.block_on(async {
//!     let mut s = 0;
//!     for h in handles {
//!         s += h.await.unwrap();
//!     }
//!     s
//! });
//! assert_eq!(sum, 499_500);
//! // A column of a 4x4 matrix, sent to ourselves and unpacked into a row layout.
//! let column = Datatype::<f32>::vector(4, 1, 4).unwrap();
//! let m: Vec<f32> = (0..16).map(|x| x as f32).collect();
//! let comm = rt.world();
//! let mut row = [0f32; 4];
//! let r = comm.irecv_typed(&mut row, &Datatype::contiguous(4).unwrap(), 0u32, 9).unwrap();
//! comm.send_typed(&m, &column, 0, 9).unwrap();
//! r.wait().unwrap();
//! assert_eq!(row, [0.0, 4.0, 8.0, 12.0]);
//! ```
//!
//! # Requests for task runtimes
//!
//! Runtimes that keep thousands of operations in flight get four tools besides
//! [`wait_all`] and sync objects:
//!
//! * Matched probe: [`Communicator::improbe`] / [`Communicator::mprobe`] take the message
//!   they find out of the matching queues into a [`Message`] that only [`Message::mrecv`] /
//!   [`Message::imrecv`] receive — the thread-safe `iprobe` + `recv` (`probe.rs`).
//! * Cancel: [`Request::cancel`] unposts a receive that has not matched; it completes with a
//!   status for which [`Status::cancelled`] is true and consumed no message.
//! * Persistent requests: [`Communicator::send_init`] / [`Communicator::recv_init`],
//!   started again and again without allocating ([`Persistent`], `persistent.rs`), and the
//!   persistent collectives [`Communicator::barrier_init`], [`Communicator::bcast_init`],
//!   [`Communicator::reduce_init`], [`Communicator::allreduce_init`] (MPI 4.0 §6.13,
//!   `persistent_coll.rs`), which [`Persistent::start_all`] starts with the others.
//! * Continuations ([Schuchart 2021], `continuation.rs`): a callback per request or set of
//!   requests, run once at completion by the completing thread ([`Invoke::Inline`]) or on
//!   the pool ([`Invoke::Pool`]), with the results; a [`ContinuationRequest`] completes when
//!   all of its callbacks have run, waited for by a thread or awaited by a task
//!   ([`ContinuationRequest::wait_async`]). A request has a sync object or a continuation, not both.
//! * Partitioned point-to-point (MPI 4.0 ch. 4, `partitioned.rs`):
//!   [`Communicator::psend_init`] / [`Communicator::precv_init`]; threads fill the
//!   [`Partition`]s of a [`PartitionedSend`] (or pool tasks its `'static`
//!   [`OwnedPartition`]s) and mark them ready, each travels at once, and the
//!   [`PartitionedRecv`] — which may cut the message into another number of partitions —
//!   reads each as it arrives.
//!
//! ```
//! use weft::{Invoke, Runtime, Source, Tag};
//! let ranks = Runtime::builder().env(false).build_local(2).unwrap();
//! let (a, b) = (ranks[0].world(), ranks[1].world());
//! a.send(vec![5u8; 3], 1, 1).unwrap();
//! // Sized by the probe, received without a race.
//! let msg = b.mprobe(Source::Any, Tag::Any).unwrap();
//! let n = msg.status().bytes;
//! let (v, _) = msg.mrecv(Vec::<u8>::with_capacity(n)).unwrap();
//! assert_eq!(v, vec![5; 3]);
//! // A continuation answers the next message from the completing thread.
//! let cr = ranks[1].continuation_request();
//! let mut r = b.irecv(Vec::<u8>::with_capacity(8), 0u32, 2).unwrap();
//! cr.attach(&mut r, Invoke::Inline, |res| assert_eq!(res.unwrap().0, b"hi")).unwrap();
//! a.send(b"hi".to_vec(), 1, 2).unwrap();
//! cr.wait().unwrap();
//! ```
//!
//! # Groups, communicator creation and collectives
//!
//! [`Communicator::group`] gives the [`Group`] of a communicator; [`Communicator::split`] and
//! [`Communicator::create_group`] make communicators over a subset of the ranks, numbered in
//! their group. Many threads may create communicators at once: context ids come from a mask
//! reduced over the members, owned by priority, eager first ([Dinan 2012], `create.rs`).
//! The collectives — [`Communicator::barrier`], [`Communicator::bcast`],
//! [`Communicator::reduce`], [`Communicator::allreduce`], [`Communicator::gather`],
//! [`Communicator::scatter`], [`Communicator::allgather`], [`Communicator::alltoall`], the
//! `v` forms ([`Communicator::gatherv`], [`Communicator::scatterv`],
//! [`Communicator::allgatherv`], [`Communicator::alltoallv`]), [`Communicator::scan`],
//! [`Communicator::exscan`] — run on any communicator, on a context of their own, with
//! algorithms chosen by message size (`coll.rs`). Each has a nonblocking form
//! ([`Communicator::ibarrier`], [`Communicator::iallreduce`], ...): a [`Request`] like a
//! receive, whose steps the rank's progress takes (`nbc.rs`, `engine/schedules.rs`); many
//! may be outstanding on one communicator and on several at once. A rank that fails a
//! collective (a lost peer, a different length) tells the others, so none waits forever.
//!
//! ```
//! use weft::{Op, Runtime};
//!
//! let ranks = Runtime::builder().build_local(3).unwrap();
//! std::thread::scope(|s| {
//!     for rt in &ranks {
//!         s.spawn(move || {
//!             let world = rt.world();
//!             // Evens and odds, each ordered by world rank.
//!             let half = world.split(Some(world.rank() % 2), 0).unwrap().unwrap();
//!             let mut sum = [0u32];
//!             half.allreduce(&[world.rank()], &mut sum, Op::Sum).unwrap();
//!             assert_eq!(sum[0], if world.rank() % 2 == 0 { 2 } else { 1 });
//!         });
//!     }
//! });
//! ```
//!
//! # Example
//!
//! ```
//! use weft::{Runtime, Source, Tag};
//!
//! // Two ranks in this process (embedded provider), one thread each.
//! let ranks = Runtime::builder().build_local(2).unwrap();
//! std::thread::scope(|s| {
//!     let (r0, r1) = (&ranks[0], &ranks[1]);
//!     s.spawn(move || {
//!         let comm = r0.world();
//!         comm.send(vec![1u64, 2, 3], 1, 42).unwrap();
//!     });
//!     s.spawn(move || {
//!         let comm = r1.world();
//!         let (v, st) = comm.recv(Vec::<u64>::with_capacity(8), Source::Any, Tag::Is(42)).unwrap();
//!         assert_eq!((v, st.source), (vec![1, 2, 3], 0));
//!     });
//! });
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

mod buffer;
mod coll;
mod coll_steps;
mod comm;
mod config;
mod continuation;
mod counters;
mod create;
mod datatype;
mod deferred;
pub mod dlock;
mod engine;
mod executor;
mod group;
pub mod lock;
pub(crate) mod loom;
mod matching;
mod nbc;
mod operation;
mod partitioned;
mod persistent;
mod persistent_coll;
mod probe;
mod progress;
mod provider;
#[cfg(test)]
mod rendezvous_faults;
mod request;
pub mod rma;
mod runtime;
mod spares;
mod wait;

pub use buffer::{Primitive, RecvBuf, SendBuf};
pub use coll::{
    Op, Reducible, ALLREDUCE_EXCHANGE_BYTES, ALLREDUCE_EXCHANGE_RANKS, ALLREDUCE_LONG_BYTES, BCAST_LONG_BYTES, BCAST_LONG_RANKS,
    BCAST_SCATTER_RANKS, BCAST_SEGMENT_BYTES, REDUCE_LONG_BYTES,
};
pub use comm::{Assertions, Communicator};

pub use config::{Assignment, Config, LevelCost, Locks, MatchingMode, ProgressMode, Provider};
pub use continuation::{ContinuationRequest, Invoke, Results};
pub use counters::Snapshot;
pub use datatype::{Datatype, TypedRecv};
pub use executor::{JoinError, JoinHandle};
pub use group::Group;
pub use matching::{Source, Tag};
pub use partitioned::{
    OwnedPartition, Partition, PartitionedRecv, PartitionedSend, MAX_PARTITIONED_TAG, MAX_PARTITIONS, PARTITIONS_MISMATCH,
};
pub use persistent::Persistent;
pub use probe::Message;
pub use request::Request;
pub use runtime::{Builder, Runtime};
pub use wait::{wait_all, wait_any, wait_some};
pub use weft_sync::{Attach, AttachError, Completion, Detached, Error, Outcome, Status, SyncObject};
