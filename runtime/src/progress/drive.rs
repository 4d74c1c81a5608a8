//! What the layers that wait without knowing the progress modes call: the executor's idle
//! worker ([`Drive`], implemented here for the rank's [`Engine`]) and a sync object's
//! blocking wait ([`weft_sync::Progress`], the hook of `Runtime::sync_object`).

use std::sync::Arc;
use std::task::Context;

use weft_sync::{Progress, SignalListener, Step};

use super::park::park_or_frames;
use crate::config::ProgressMode;
use crate::engine::Engine;
use crate::executor::Drive;
use crate::loom::sync::atomic::Ordering;

impl Engine {
    /// One non-blocking progress pass for an idle pool worker: never waits for a lock. In
    /// `Owner` mode it takes the owner token only if free (and hands it back: the token
    /// passes between workers and waiters, no thread keeps it); in `Concurrent` mode it
    /// progresses the CRIs it wins by try-lock; in `Global` mode it takes the progress
    /// lock's try path. Returns whether anything was handled.
    pub(crate) fn progress_idle(&self) -> bool {
        // (Rendezvous reads that are over count as frames: `any_frames`.)
        if !self.transport.any_frames() && !self.outbox.pending.load(Ordering::Acquire) {
            return false;
        }
        match self.config.progress {
            // The callbacks the pass completes run after the progress lock (`deferred.rs`).
            ProgressMode::Global => crate::deferred::pass(|| {
                let progressed = self
                    .progress_lock
                    .try_low(|_| {
                        let n = self.progress_all();
                        (n > 0, n > 0)
                    })
                    .unwrap_or(false);
                // After the lock: collectives in flight post.
                self.advance_schedules(progressed) > 0 || progressed
            }),
            ProgressMode::Owner => self.progress_once().progressed(),
            ProgressMode::Concurrent => self.progress_concurrent() > 0,
        }
    }
}

/// The progress hook of sync objects made by `Runtime::sync_object`.
pub(crate) struct Hook {
    pub(crate) engine: Arc<Engine>,
}

impl Progress for Hook {
    fn progress(&self) -> Step {
        if self.engine.progress_once().progressed() {
            Step::Progressed
        } else {
            Step::Idle
        }
    }

    fn park(&self, listener: SignalListener<'_>) {
        park_or_frames(&self.engine, listener);
    }

    fn poll_progress(&self, cx: &mut Context<'_>) -> Step {
        self.engine.poll_progress(cx)
    }
}

/// The progress hook blocked waiters use for sync objects of `engine`'s rank.
pub(crate) fn sync_hook(engine: &Arc<Engine>) -> Arc<dyn Progress> {
    Arc::new(Hook { engine: engine.clone() })
}

impl Drive for Engine {
    fn idle_pass(&self) -> bool {
        self.progress_idle()
    }

    fn listen_scoped(&self, f: &mut dyn FnMut(Option<crate::executor::Listening<'_>>)) {
        // In `Owner` mode a worker listens for the hand-off while someone owns progress (the
        // owner listens to the doorbell itself), else to the doorbell. The hand-off's
        // listener is gone before the doorbell's is made: one left registered would take a
        // hand-off meant for a blocked waiter and sit on it while this worker sleeps.
        if self.config.progress == ProgressMode::Owner
            && self.owner.listen_scoped(|handoff| match handoff {
                Some(l) => {
                    f(self.owner.is_taken().then_some((l, true)));
                    true
                }
                None => false,
            })
        {
            return;
        }
        self.transport.doorbell().listen_scoped(|l| f((!self.work_before_sleep()).then_some((l, false))));
    }

    /// If this worker cannot use the notification — progress is held by someone else, or
    /// there is nothing to progress — it passes it on, so nobody waits out a park limit: the
    /// doorbell notifies one listener, maybe this worker instead of the progress owner; a
    /// hand-off was meant for a parked waiter. A successful `Owner`-mode pass releases
    /// ownership, which notifies the hand-off itself.
    fn heard(&self, handoff: bool) {
        if self.progress_idle() {
            return;
        }
        if handoff {
            // This worker owns nothing here (`progress_idle` hands the token back), so `leave`
            // only passes the hand-off on, and only if the token is still free.
            self.owner.leave(crate::engine::thread_token());
        } else if self.transport.any_frames() {
            self.transport.doorbell().ring();
        }
    }

    fn count_park(&self, wake: bool) {
        let c = if wake { &self.counters.wakes } else { &self.counters.parks };
        c.fetch_add(1, Ordering::Relaxed);
    }
}
