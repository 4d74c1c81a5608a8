//! The rank's waiter role and its hand-over with the watcher thread, as two flags (the
//! libfabric provider's `waiter` module uses it; kept apart from the descriptors so that
//! loom checks it).
//!
//! One parked thread at a time holds the role and sleeps on what wakes the rank; while it
//! does, the watcher leaves those descriptors to it and sleeps on a timer. A watcher that
//! chose such a sleep while the role was taken must not outlive the role in it: the thread
//! that gives the role back ends the sleep.
//!
//! | flag | set by | cleared by |
//! |---|---|---|
//! | `taken` | [`take`](WaiterRole::take) (a thread parks) | [`give_back`](WaiterRole::give_back) |
//! | `naps` | [`nap`](WaiterRole::nap) (the watcher, before a long sleep) | [`woke`](WaiterRole::woke), or `give_back` when it answers `true` |
//!
//! # Memory ordering
//!
//! Dekker-style, a `SeqCst` fence on each side: the watcher's between its store of `naps`
//! and its load of `taken` (`nap`), the giver's between its store of `taken` and its load of
//! `naps` (`give_back`). One of the two sees the other: either the watcher sees the role
//! free and chooses again (covering the descriptors itself), or the giver sees the nap and
//! ends it. The model at the bottom checks that no watcher naps on with the role free.

use crate::loom::sync::atomic::{fence, AtomicBool, Ordering};

/// The two flags of the module docs.
#[derive(Debug, Default)]
pub(crate) struct WaiterRole {
    /// A thread holds the role.
    taken: AtomicBool,
    /// The watcher is in (or about to start) a sleep it chose while the role was taken.
    naps: AtomicBool,
}

impl WaiterRole {
    /// The role free, no nap.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Takes the role if no thread holds it.
    #[inline]
    pub(crate) fn take(&self) -> bool {
        // Acquire: the previous holder's use of the descriptors happened before ours.
        !self.taken.load(Ordering::Relaxed) && self.taken.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Whether a thread holds the role. Relaxed: a hint for the watcher's choice of sleep;
    /// [`nap`](Self::nap) is the checked step.
    #[inline]
    pub(crate) fn is_taken(&self) -> bool {
        self.taken.load(Ordering::Relaxed)
    }

    /// The watcher is about to sleep long, having chosen its sleep by `taken` (what it saw
    /// of the role): `false` if the role changed meanwhile (choose again). Follow with
    /// [`woke`](Self::woke) after the sleep.
    pub(crate) fn nap(&self, taken: bool) -> bool {
        self.naps.store(true, Ordering::Relaxed);
        // SeqCst: the Dekker handshake of the module docs (with the fence in `give_back`).
        fence(Ordering::SeqCst);
        if self.taken.load(Ordering::Relaxed) != taken {
            self.naps.store(false, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// After the watcher's sleep.
    pub(crate) fn woke(&self) {
        self.naps.store(false, Ordering::Relaxed);
    }

    /// Gives the role back. `true`: the watcher naps and must be woken by the caller.
    #[inline]
    pub(crate) fn give_back(&self) -> bool {
        // Release: the next holder's use of the descriptors happens after ours.
        self.taken.store(false, Ordering::Release);
        // SeqCst: the Dekker handshake of the module docs (with the fence in `nap`).
        fence(Ordering::SeqCst);
        self.naps.load(Ordering::Relaxed) && self.naps.swap(false, Ordering::Relaxed)
    }
}

#[cfg(all(test, loom))]
mod model {
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;

    use super::*;

    /// A watcher that chose a long sleep while a thread held the role is woken when the
    /// role is given back, whichever order their steps take: it parks here until woken, so
    /// a lost wake-up is a deadlock loom reports.
    #[test]
    fn a_watcher_never_naps_past_the_role() {
        loom::model(|| {
            let role = Arc::new(WaiterRole::new());
            assert!(role.take());
            let kicked = Arc::new(AtomicBool::new(false));
            let watcher = {
                let (role, kicked) = (role.clone(), kicked.clone());
                loom::thread::spawn(move || {
                    let taken = role.is_taken();
                    if role.nap(taken) {
                        if taken {
                            // Nothing but the giver's kick ends this sleep.
                            while !kicked.load(Ordering::Acquire) {
                                loom::thread::park();
                            }
                        }
                        role.woke();
                    }
                })
            };
            if role.give_back() {
                kicked.store(true, Ordering::Release);
                watcher.thread().unpark();
            }
            watcher.join().unwrap();
            assert!(!role.is_taken());
        });
    }

    /// Two threads race for the role: one gets it.
    #[test]
    fn one_waiter_at_a_time() {
        loom::model(|| {
            let role = Arc::new(WaiterRole::new());
            let other = {
                let role = role.clone();
                loom::thread::spawn(move || role.take())
            };
            let mine = role.take();
            let theirs = other.join().unwrap();
            assert!(mine ^ theirs);
        });
    }
}
