//! The progress-owner token of `ProgressMode::Owner` ([Patinyasakdikul 2019, Alg. 2], §4.4): at most
//! one thread progresses at a time; the others park and are woken by their own completions
//! or by a hand-off when the owner leaves.
//!
//! # Protocol
//!
//! * `try_own(me)`: CAS `0 -> me` (Acquire: the new owner sees what the previous one did).
//! * `release()`: store `0` (Release), then `notify(1)` on the hand-off event: one parked
//!   waiter wakes and tries to take over.
//! * A waiter that cannot own parks only after `listen()` returned a listener **and** the
//!   token was still taken after the listener was registered (check, listen, re-check:
//!   a release between the two checks is seen by the re-check, one after it notifies the
//!   listener).
//! * `leave(me)` when a wait ends: the owner releases; a non-owner that sees the token free
//!   passes a hand-off on (`notify(1)`), because it may have been the waiter a release woke
//!   — leaving without taking ownership would strand the parked ones. (event-listener also
//!   passes on the notification of a listener dropped unused, which covers a waiter woken by
//!   its completion and the hand-off at once; the explicit pass covers one that consumed the
//!   hand-off, e.g. after the 50 ms park limit.)
//!
//! The loom models at the bottom check that no waiter is stranded and the token is free at
//! the end, under every interleaving within a preemption bound (5 with two waiters, 2 with
//! three); they fail, for example, if `listen` skips its re-check. Run them with
//! `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p weft --release --lib owner`.

use weft_sync::{Signal, SignalListener};

use crate::loom::sync::atomic::{AtomicU64, Ordering};

/// Token id meaning "nobody owns progress".
pub(crate) const NOBODY: u64 = 0;

/// The owner token and its hand-off event.
#[derive(Debug)]
pub(crate) struct OwnerToken {
    owner: AtomicU64,
    handoff: Signal,
}

impl OwnerToken {
    pub(crate) fn new() -> Self {
        OwnerToken { owner: AtomicU64::new(NOBODY), handoff: Signal::new() }
    }

    /// Whether `me` owns progress (only `me` can make this true or false, so Relaxed).
    #[inline]
    pub(crate) fn is(&self, me: u64) -> bool {
        self.owner.load(Ordering::Relaxed) == me
    }

    /// Whether someone owns progress right now (a racy snapshot).
    #[inline]
    pub(crate) fn is_taken(&self) -> bool {
        self.owner.load(Ordering::Acquire) != NOBODY
    }

    /// Tries to become the owner.
    #[inline]
    pub(crate) fn try_own(&self, me: u64) -> bool {
        // Acquire: the new owner sees everything the previous owner did under ownership.
        self.owner.compare_exchange(NOBODY, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// `me` owns progress already, or takes it now.
    #[inline]
    pub(crate) fn own_or_take(&self, me: u64) -> bool {
        self.is(me) || self.try_own(me)
    }

    /// Gives up ownership (the caller owns it) and wakes one parked waiter to take over.
    #[inline]
    pub(crate) fn release(&self) {
        // Release: pairs with the next owner's Acquire CAS.
        self.owner.store(NOBODY, Ordering::Release);
        self.handoff.notify(1);
    }

    /// A listener for the next hand-off, or `None` when the token is free (the caller should
    /// try to take it instead of parking).
    #[inline]
    #[cfg(loom)]
    pub(crate) fn listen(&self) -> Option<SignalListener<'_>> {
        let l = self.handoff.listen();
        // `listen` fences (SeqCst) after registering: a release before this load is seen
        // here, one after it notifies `l`.
        self.is_taken().then_some(l)
    }

    /// A listener for the next hand-off on this stack frame, handed to `f` (`None` when
    /// the token is free: the caller should try to take it instead of parking): allocates
    /// nothing.
    #[inline]
    pub(crate) fn listen_scoped<R>(&self, f: impl FnOnce(Option<SignalListener<'_>>) -> R) -> R {
        // The registration fences (SeqCst) before the load: a release before it is seen
        // here, one after it notifies the listener.
        self.handoff.listen_scoped(|l| f(self.is_taken().then_some(l)))
    }

    /// A wait of `me` ends: release if `me` owns progress, else pass a hand-off on if the
    /// token is free (see the module docs).
    #[inline]
    pub(crate) fn leave(&self, me: u64) {
        if self.is(me) {
            self.release();
        } else if !self.is_taken() {
            self.handoff.notify(1);
        }
    }
}

#[cfg(all(test, loom))]
mod model {
    use super::*;
    use loom::sync::{Arc, Mutex};

    /// Operation states in the model's "progress engine".
    const POSTED: u8 = 1;
    const DONE: u8 = 2;

    /// Waiters that each post one operation only an owner's progress can complete; each
    /// waits as `OwnerWait` does (own and progress, or listen / re-check / park on its
    /// completion and the hand-off), and leaves as `wait_all` does. Loom fails the model if
    /// an interleaving strands a waiter (deadlock) or leaves the token taken.
    fn run(waiters: usize, preemptions: Option<usize>) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = preemptions;
        b.check(move || {
            struct World {
                token: OwnerToken,
                ops: Mutex<Vec<u8>>,
                events: Vec<Signal>,
            }
            let w = Arc::new(World {
                token: OwnerToken::new(),
                ops: Mutex::new(vec![0; waiters]),
                events: (0..waiters).map(|_| Signal::new()).collect(),
            });
            let handles: Vec<_> = (0..waiters)
                .map(|i| {
                    let w = w.clone();
                    loom::thread::spawn(move || {
                        let me = i as u64 + 1;
                        // Post: from now on an owner's progress completes it (an owner may
                        // already have finished its own operation and left).
                        w.ops.lock().unwrap()[i] = POSTED;
                        loop {
                            if w.ops.lock().unwrap()[i] == DONE {
                                w.token.leave(me);
                                return;
                            }
                            if w.token.own_or_take(me) {
                                // Progress: complete every posted operation.
                                let mut ops = w.ops.lock().unwrap();
                                for (j, op) in ops.iter_mut().enumerate() {
                                    if *op == POSTED {
                                        *op = DONE;
                                        w.events[j].notify(1);
                                    }
                                }
                                continue;
                            }
                            let mine = w.events[i].listen();
                            if w.ops.lock().unwrap()[i] == DONE {
                                continue;
                            }
                            let Some(handoff) = w.token.listen() else { continue };
                            loom::future::block_on(futures::future::select(mine, handoff));
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            assert!(!w.token.is_taken(), "the last waiter left the token taken");
        });
    }

    #[test]
    fn two_waiters_hand_off() {
        run(2, Some(5));
    }

    #[test]
    fn three_waiters_hand_off() {
        run(3, Some(2));
    }
}
