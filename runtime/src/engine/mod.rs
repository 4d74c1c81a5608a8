//! The engine: one rank's state and the mechanisms that act on it, below the progress
//! modes and the public API. `README.md` lists each component, what it owns, what guards it
//! and the lock order.
//!
//! * `cris.rs` — the CRIs and which one a thread uses ([Patinyasakdikul 2019, Alg. 3]).
//! * `contexts.rs` — the context table (communicator states by context id), their matching
//!   states and locks, creation, retirement and collection ([Goodell 2010, §V-B]).
//! * `frames.rs` — received frames into completed operations (eager and rendezvous).
//! * `ids.rs` — the mask of free context ids and the variables its allocation shares ([Dinan 2012]).
//! * `reads.rs` — rendezvous reads in flight.
//! * `outbox.rs` — frames a full inbox refused, sent by later passes; the rare-events pass.
//! * `peers.rs` — lost and finished peers, rendezvous sends waiting for their `Fin`.
//! * `courier.rs` — the thread that sends the outbox when no thread of the rank progresses.
//! * `schedules.rs` — nonblocking collectives in flight, advanced after progress passes.

use std::sync::Arc;

use crossbeam_utils::CachePadded;
use weft_transport::Transport;

use crate::config::{Config, ProgressMode};
use crate::lock::owner::OwnerToken;
use crate::lock::path::PathLock;
use crate::lock::LockOptions;
use crate::loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

mod contexts;
mod courier;
mod cris;
mod frames;
pub(crate) mod ids;
pub(crate) mod outbox;
mod peers;
mod reads;
mod schedules;

#[cfg(test)]
pub(crate) use contexts::COLLECT_AFTER;
pub(crate) use contexts::{slot_of, CommState, ContextTable, Layout, MAX_GENERATIONS, SLOT_BITS, TAG_PARTS};
pub(crate) use courier::Courier;
pub(crate) use cris::{pin_cri, thread_token, Cri, CriLocal};
pub(crate) use outbox::{Outbox, SendOutcome};
pub(crate) use peers::PeerWatch;
pub(crate) use reads::RendezvousReads;
pub(crate) use schedules::{Schedule, Schedules};

/// Rare-path counters shared by the rank.
#[derive(Debug, Default)]
pub(crate) struct RankCounters {
    pub(crate) parks: AtomicU64,
    pub(crate) wakes: AtomicU64,
    pub(crate) park_timeouts: AtomicU64,
    pub(crate) flow_control_waits: AtomicU64,
    /// Eager and `Rts` frames sent from the deferred queue (not under a CRI lock).
    pub(crate) deferred_sent: AtomicU64,
}

/// One rank's state, shared by every handle of the rank (runtime, communicators, requests,
/// pool workers, courier). Its parts and the locks that guard them: `README.md`.
pub(crate) struct Engine {
    /// Unique id (thread-local CRI assignment is keyed by it).
    pub(crate) id: u64,
    /// Resolved configuration.
    pub(crate) config: Config,
    /// The transport endpoint of this rank.
    pub(crate) transport: Transport,
    /// This rank's CRIs.
    pub(crate) cris: Box<[CachePadded<Cri>]>,
    /// Round-robin CRI counter ([Patinyasakdikul 2019, Alg. 3], GET-INSTANCE-ID-ROUND-ROBIN).
    pub(crate) rr: CachePadded<AtomicUsize>,
    /// Communicator states by context id, their generations, early frames, freed states
    /// (`contexts.rs`).
    pub(crate) contexts: ContextTable,
    /// The critical section of `ProgressMode::Global` ([Patinyasakdikul 2019, Alg. 1]; posting enters
    /// it with high priority, progress with low priority, as MPICH's global lock).
    pub(crate) progress_lock: CachePadded<PathLock<()>>,
    /// Topology and options for the path locks created later (communicators' matching).
    pub(crate) lock_options: LockOptions,
    /// Progress owner of `ProgressMode::Owner` and its hand-off.
    pub(crate) owner: CachePadded<OwnerToken>,
    /// Frames a full inbox refused, sent by later progress passes (`outbox.rs`).
    pub(crate) outbox: Outbox,
    /// Rare-path counters (parks, wakes, hand-offs).
    pub(crate) counters: RankCounters,
    /// The work-stealing pool (started at the first spawn).
    pub(crate) executor: crate::executor::Executor,
    /// Lost-peer bookkeeping (which peers are gone, rendezvous sends in flight, loss epoch
    /// handled).
    pub(crate) peers: PeerWatch,
    /// The thread that sends deferred frames when no thread of the rank progresses (started
    /// by the first deferral; `courier.rs`).
    pub(crate) courier: Courier,
    /// Rendezvous reads in flight and the receives they fill. Declared after `transport`:
    /// dropped after it, so a buffer a read given up on still targets outlives the
    /// endpoints.
    pub(crate) reads: RendezvousReads,
    /// Nonblocking collectives in flight (`schedules.rs`).
    pub(crate) schedules: Schedules,
    /// The windows whose peers' `WindowEnd` notices this rank marks: the API's one-sided
    /// module's registry (`rma/ends.rs`), which handles those frames (`frames.rs`).
    pub(crate) window_ends: Box<dyn WindowEnds>,
}

/// What the engine does with a peer's `WindowEnd` frame, given it by the layer that owns
/// windows (installed with the engine by `runtime.rs`): the engine hands the frame on
/// without naming that layer.
pub(crate) trait WindowEnds: std::any::Any + Send + Sync {
    /// World rank `source` ended its part `serial` of a window on communicator `context`.
    fn ended(&self, source: u32, context: u32, serial: u64);
    /// The registry itself, for the layer that installed it.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// How long dropping a runtime keeps trying to send frames still deferred behind a full
/// inbox (sends whose requests were dropped before they went out).
const DRAIN_DEFERRED: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a dropped runtime waits for the receivers of its pending rendezvous sends to
/// read them (see `Drop for Engine`).
const DRAIN_RENDEZVOUS: std::time::Duration = std::time::Duration::from_secs(5);

impl Drop for Engine {
    fn drop(&mut self) {
        // Stopped by the last `Runtime` handle already (`ExecGuard`), unless the state
        // outlived none: no pass may race the teardown below.
        self.courier.stop();
        // A request dropped in flight leaves its deferred frame to progress; send what is
        // left while the peers still drain their inboxes (bounded: a peer may be gone).
        let deadline = std::time::Instant::now() + DRAIN_DEFERRED;
        while self.outbox.pending.load(Ordering::Acquire) && std::time::Instant::now() < deadline {
            // This is the last reference: no other thread progresses, and a pass over every
            // CRI (which flushes the queue first) needs no progress mode's permission.
            if self.progress_all() == 0 {
                std::thread::yield_now();
            }
        }
        // A rendezvous send still waiting for its `Fin` (its request dropped, or never
        // waited for) has its data read by the receiver straight from the registered
        // buffer: closing now would fail that receive with `PeerLost` — a message lost,
        // though every message a finished rank sent must arrive. Progress until the `Fin`s
        // are in (bounded: a receiver may never post the receive, or be gone, which
        // `fail_lost` reports by failing the send). Likewise for this rank's own reads in
        // flight (receives dropped after they matched): their senders wait for the `Fin`.
        // A read still in flight after that is given up: its buffer is freed only after the
        // transport's endpoints (field order).
        let deadline = std::time::Instant::now() + DRAIN_RENDEZVOUS;
        while (self.rendezvous_pending() || self.reads_pending()) && std::time::Instant::now() < deadline {
            if self.progress_all() == 0 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
        self.transport.close();
        for slot in self.contexts.slots.iter() {
            // (Retired states drop with `retired`.)
            let p = slot.swap(std::ptr::null_mut(), Ordering::AcqRel);
            if !p.is_null() {
                // SAFETY: every non-null slot holds an `Arc::into_raw` reference owned by
                // the table, released exactly once here.
                drop(unsafe { Arc::from_raw(p) });
            }
        }
    }
}

/// [`Engine::main_path`] for the steps every message takes (posting a send's frame, posting
/// a receive): `$step` (a closure) is expanded once per branch, so outside `Global` mode it
/// runs inline in its caller's frame. Through `main_path` the one closure serves both
/// branches, too large for the inliner to copy into either: its captures were stored, passed
/// and loaded again, and it was called out of line, about 40 instructions a message on each
/// of `isend` and `irecv`.
macro_rules! main_path_inline {
    ($engine:expr, $step:expr) => {
        match $engine.config.progress {
            $crate::config::ProgressMode::Global => $engine.progress_lock.high(|_| ($step)()),
            _ => ($step)(),
        }
    };
}
pub(crate) use main_path_inline;

impl Engine {
    /// Runs a main-path step (posting) inside `Global` mode's critical section, with high
    /// priority; in the other modes the step's own (CRI or matching) lock suffices. The
    /// per-message steps use [`main_path_inline!`] instead.
    #[inline]
    pub(crate) fn main_path<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.config.progress {
            ProgressMode::Global => self.progress_lock.high(|_| f()),
            _ => f(),
        }
    }

    /// Progresses every CRI that has frames (the owner's and the global lock holder's pass),
    /// then, outside `Global` mode (whose caller holds the progress lock and advances them
    /// after it), the collectives in flight.
    /// The callbacks it completes run after the CRI locks are released (`deferred.rs`).
    pub(crate) fn progress_all(&self) -> usize {
        crate::deferred::pass(|| {
            let mut n = self.flush_deferred();
            for k in 0..self.cris.len() {
                if self.transport.has_frames(k) {
                    n += self.cris[k].lock.low(|c| self.progress_cri(k, c));
                }
            }
            if self.config.progress != ProgressMode::Global {
                n += self.advance_schedules(n > 0);
            }
            n
        })
    }
}
