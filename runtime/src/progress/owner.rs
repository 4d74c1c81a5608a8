//! `ProgressMode::Owner` ([Patinyasakdikul 2019, Alg. 2]): one waiter owns progress for its
//! whole wait (the token, `lock/owner.rs`); the others park on their sync objects until
//! their own requests complete or ownership is handed to them.

use weft_sync::{Progress, SignalListener, Step};

use super::park::{park_or_frames, park_two, Waiter};
use crate::engine::Engine;
use crate::loom::sync::atomic::Ordering;

/// The hook of an `Owner`-mode wait (Algorithm 2): ownership is kept for the whole wait.
pub(super) struct OwnerWait<'a> {
    pub(super) engine: &'a Engine,
    pub(super) me: u64,
}

impl Progress for OwnerWait<'_> {
    fn progress(&self) -> Step {
        let s = self.engine;
        if s.owner.own_or_take(self.me) {
            if s.progress_all() > 0 {
                Step::Progressed
            } else {
                Step::Idle
            }
        } else {
            Step::Park
        }
    }

    fn park(&self, listener: SignalListener<'_>) {
        let s = self.engine;
        // Run a pool task instead of sleeping ([Patinyasakdikul 2019, §4.6.2]).
        if crate::executor::help(&s.executor) {
            return;
        }
        if s.owner.is(self.me) {
            // The owner sleeps until the next frame (or its own completion).
            park_or_frames(s, listener);
        } else {
            // A plain waiter: its completions, or a hand-off of ownership (listened to on
            // this frame: a park allocates nothing).
            s.owner.listen_scoped(|handoff| {
                if let Some(handoff) = handoff {
                    s.counters.parks.fetch_add(1, Ordering::Relaxed);
                    let _ = park_two(s, listener, Some(handoff), Waiter::Leave);
                }
            });
        }
    }
}
