//! Progress: who drains the network and when (path step 4), in the three modes, and the
//! blocking waits built on them.
//!
//! * `Global` — [Patinyasakdikul 2019, Alg. 1]: a waiter loops over its requests and, while any is
//!   pending, enters progress under the one progress lock. Never parks (it yields the core
//!   when a pass was unproductive, as Open MPI's `yield_when_idle`). The baseline.
//! * `Owner` — [Patinyasakdikul 2019, Alg. 2]: a waiter attaches its pending requests to its
//!   thread's sync object and waits on it. One waiter at a time owns progress and keeps it
//!   for its whole wait; when the owner is idle it parks on the rank's doorbell (woken by
//!   the next frame); the others park on their sync objects and are woken only when their
//!   own requests complete — or when the owner leaves and hands ownership on.
//! * `Concurrent` — [Patinyasakdikul 2019, Alg. 3-4]: a waiter progresses its dedicated CRI under
//!   try-lock, then the others, so every CRI is eventually progressed even if its thread is
//!   gone; matching runs concurrently per communicator.
//!
//! * `mod.rs` — one pass in the configured mode ([`Pass`]), the async poller's step, the
//!   ownership hand-off.
//! * `global.rs`, `owner.rs`, `concurrent.rs` — the mode's pass and its wait hook.
//! * `park.rs` — parking a waiter on its sync object and the doorbell (one park limit).
//! * `wait.rs` — `wait_all`/`wait_any`/`wait_some` and the request future's wait.
//! * `drive.rs` — what the executor and sync objects call: the idle pass of a pool worker
//!   ([`crate::executor::Drive`]) and the progress hook of a sync object.
//! * `send.rs` — posting a frame, progressing while its destination refuses it.

use std::sync::Arc;
use std::task::Context;

use weft_sync::Step;

use crate::config::ProgressMode;
use crate::engine::Engine;
use crate::loom::sync::atomic::Ordering;

mod concurrent;
mod drive;
mod global;
mod owner;
pub(crate) mod park;
mod send;
mod wait;

pub(crate) use drive::sync_hook;
pub(crate) use wait::{wait, wait_all, wait_all_walked, Waitable, Want};

/// What one progress pass did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub(crate) enum Pass {
    /// It handled this many events: frames received, deferred frames sent, reads reported,
    /// requests failed by a loss.
    Progressed(usize),
    /// It ran and found nothing to do.
    Idle,
    /// It could not run: another thread owns progress (`Owner` mode), whose passes handle
    /// what arrives.
    Elsewhere,
}

impl Pass {
    /// The pass of `n` events (0: idle).
    #[inline]
    fn of(n: usize) -> Pass {
        if n > 0 {
            Pass::Progressed(n)
        } else {
            Pass::Idle
        }
    }

    /// Whether the pass handled anything.
    #[inline]
    pub(crate) fn progressed(self) -> bool {
        matches!(self, Pass::Progressed(_))
    }
}

impl Engine {
    /// One non-blocking pass of progress in the configured mode.
    pub(crate) fn progress_once(&self) -> Pass {
        match self.config.progress {
            ProgressMode::Global => Pass::of(self.progress_global()),
            ProgressMode::Owner => {
                let me = crate::engine::thread_token();
                if self.owner.is(me) {
                    return Pass::of(self.progress_all());
                }
                if !self.owner.try_own(me) {
                    return Pass::Elsewhere;
                }
                let n = self.progress_all();
                self.release_ownership();
                Pass::of(n)
            }
            ProgressMode::Concurrent => Pass::of(self.progress_concurrent()),
        }
    }

    /// A pass over the calling thread's own CRI alone, where `Concurrent` mode's pass would
    /// walk it first: no deferred frames flushed, no other CRI walked and no collective
    /// advanced, for a waiter that expects one frame there and makes full passes
    /// ([`progress_once`](Self::progress_once)) besides. In the other modes, a full pass.
    #[inline]
    pub(crate) fn progress_own(&self) -> Pass {
        if self.config.progress != ProgressMode::Concurrent {
            return self.progress_once();
        }
        let mine = self.cri_for_thread();
        if !self.worth_polling(mine) {
            return Pass::Idle;
        }
        Pass::of(crate::deferred::pass(|| self.cris[mine].lock.try_low(|c| self.progress_cri(mine, c)).unwrap_or(0)))
    }

    /// Gives up ownership and hands it on: one parked waiter is woken to take over, and
    /// idle async pollers are woken in case frames arrived meanwhile.
    pub(crate) fn release_ownership(&self) {
        tracing::trace!(rank = self.transport.rank(), "progress ownership handed on");
        self.owner.release();
        if self.transport.any_frames() {
            self.transport.doorbell().ring_all();
        }
    }

    /// One step for an async poller; when idle, `cx` is woken by the next frame.
    pub(crate) fn poll_progress(&self, cx: &mut Context<'_>) -> Step {
        if self.progress_once().progressed() {
            return Step::Progressed;
        }
        self.transport.doorbell().register(cx.waker());
        if self.work_before_sleep() {
            // A frame came, or room for a deferred one, before the registration: go round
            // again.
            return Step::Progressed;
        }
        Step::Idle
    }

    /// The last check of a poller about to sleep on the doorbell, made after it registered
    /// or listened: frames are waiting, or one more try at the deferred frames sent one. The
    /// transport rings the doorbell for new frames and when a destination that refused a
    /// frame has room again (`SendError::WouldBlock`'s contract), but either ring may have
    /// come between the poller's last pass and its registration; this check sees what it
    /// announced.
    ///
    /// The flush is a pass of its own (`deferred.rs`): a peer lost meanwhile makes it deliver
    /// the frames that arrived (`Engine::deliver_arrived`) under each CRI's lock, and fail
    /// requests under `Global` mode's progress lock; the callbacks those completions run wait
    /// until the locks are released, as a pass's do.
    pub(crate) fn work_before_sleep(&self) -> bool {
        // Acquire: pairs with the store in `defer`. The flush runs under the global critical
        // section in `Global` mode, as every other send.
        self.transport.any_frames()
            || (self.outbox.pending.load(Ordering::Acquire) && crate::deferred::pass(|| self.main_path(|| self.flush_deferred())) > 0)
    }

    /// Unposts a receive that has not matched yet. Returns whether it was unposted.
    pub(crate) fn cancel_recv(&self, comm: &crate::engine::CommState, inner: &Arc<crate::operation::Operation>) -> bool {
        // The receive's source and tag are not kept: look in every state (cancel is rare).
        self.main_path(|| self.any_matching_state(comm, |m| m.cancel(inner)))
    }
}
