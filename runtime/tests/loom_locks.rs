//! Loom models of the lock protocols: every interleaving of 2-3 threads with 1-2 acquisitions
//! each. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p weft --release --test loom_locks`.
//!
//! Each model increments a `loom::cell::UnsafeCell` under the lock (loom reports concurrent
//! access as a failure) and checks the total; the priority models also check that the lock
//! ends free for both classes (the filter was reopened).
#![cfg(loom)]

use std::pin::pin;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
use loom::thread;

use weft::lock::{Clh, Hmcs, Mcs, McsNode, Priority, RawLock, RawPriorityLock, TasPark, Ticket, Topology};

/// The lock under test and the data it protects.
struct Guarded<L> {
    lock: L,
    value: UnsafeCell<u32>,
}

// SAFETY: `value` is accessed only while holding `lock` (checked by loom).
unsafe impl<L: Sync> Sync for Guarded<L> {}

impl<L: RawPriorityLock> Guarded<L> {
    fn new(lock: L) -> Arc<Self> {
        Arc::new(Guarded { lock, value: UnsafeCell::new(0) })
    }

    /// `n` acquisitions with one node: high priority, or low when `low`; `try_first` tries
    /// `try_lock` before waiting.
    fn bump(&self, node: L::Node, n: usize, low: bool, try_first: bool) {
        let node = pin!(node);
        let node = node.as_ref();
        for _ in 0..n {
            if low {
                if !(try_first && self.lock.try_lock_low(node)) {
                    self.lock.lock_low(node);
                }
            } else if !(try_first && self.lock.try_lock_high(node)) {
                self.lock.lock_high(node);
            }
            // SAFETY: loom checks that no other thread accesses `value` meanwhile.
            self.value.with_mut(|v| unsafe { *v += 1 });
            // SAFETY: acquired just above with `node`, in the same class.
            unsafe {
                if low {
                    self.lock.unlock_low(node)
                } else {
                    self.lock.unlock_high(node)
                }
            }
        }
    }

    fn total(&self) -> u32 {
        // SAFETY: all threads joined.
        self.value.with(|v| unsafe { *v })
    }
}

fn bounded(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(preemptions);
    // Spin-waiting (a yield per round under loom) makes long paths with 2 waiters.
    b.max_branches = 100_000;
    b
}

/// `TasPark`'s release (a store, a fence, a load of the sleepers) against a waiter that
/// announces its sleep and sleeps on the futex (a condition variable here): no waiter sleeps
/// through the release that frees the lock (loom reports a deadlock).
#[test]
fn tas_park_two_threads() {
    loom::model(|| {
        let g = Guarded::new(TasPark::new());
        let g2 = g.clone();
        let t = thread::spawn(move || g2.bump((), 2, false, true));
        g.bump((), 1, false, false);
        t.join().unwrap();
        assert_eq!(g.total(), 3);
    });
}

#[test]
fn tas_park_three_threads() {
    bounded(2).check(|| {
        let g = Guarded::new(TasPark::new());
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let g = g.clone();
                thread::spawn(move || g.bump((), 1, false, false))
            })
            .collect();
        g.bump((), 1, false, false);
        for t in ts {
            t.join().unwrap();
        }
        assert_eq!(g.total(), 3);
    });
}

#[test]
fn ticket_two_threads() {
    loom::model(|| {
        let g = Guarded::new(Ticket::new());
        let g2 = g.clone();
        let t = thread::spawn(move || g2.bump((), 2, false, true));
        g.bump((), 1, false, false);
        t.join().unwrap();
        assert_eq!(g.total(), 3);
        assert_eq!(g.lock.waiters(), 0);
    });
}

#[test]
fn ticket_three_threads() {
    bounded(1).check(|| {
        let g = Guarded::new(Ticket::new());
        let ts: Vec<_> = (0..2)
            .map(|i| {
                let g = g.clone();
                thread::spawn(move || g.bump((), 1, false, i == 0))
            })
            .collect();
        g.bump((), 1, false, false);
        ts.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(g.total(), 3);
    });
}

#[test]
fn mcs_two_threads() {
    loom::model(|| {
        let g = Guarded::new(Mcs::new());
        let g2 = g.clone();
        let t = thread::spawn(move || g2.bump(McsNode::new(), 2, false, false));
        g.bump(McsNode::new(), 1, false, true);
        t.join().unwrap();
        assert_eq!(g.total(), 3);
        assert!(!g.lock.is_locked());
    });
}

#[test]
fn mcs_three_threads() {
    bounded(2).check(|| {
        let g = Guarded::new(Mcs::new());
        let ts: Vec<_> = (0..2)
            .map(|_| {
                let g = g.clone();
                thread::spawn(move || g.bump(McsNode::new(), 1, false, false))
            })
            .collect();
        g.bump(McsNode::new(), 1, false, false);
        ts.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(g.total(), 3);
        assert!(!g.lock.is_locked());
    });
}

#[test]
fn clh_two_threads_recycling_cells() {
    loom::model(|| {
        let g = Guarded::new(Clh::new());
        let g2 = g.clone();
        let t = thread::spawn(move || g2.bump(Default::default(), 2, false, false));
        g.bump(Default::default(), 2, false, true);
        t.join().unwrap();
        assert_eq!(g.total(), 4);
    });
}

#[test]
fn clh_three_threads() {
    bounded(2).check(|| {
        let g = Guarded::new(Clh::new());
        let ts: Vec<_> = (0..2)
            .map(|i| {
                let g = g.clone();
                thread::spawn(move || g.bump(Default::default(), 1, false, i == 0))
            })
            .collect();
        g.bump(Default::default(), 1, false, false);
        ts.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(g.total(), 3);
    });
}

/// Two leaves under one root, threads on different leaves, threshold 1 (every release goes
/// up a level).
#[test]
fn hmcs_two_leaves() {
    bounded(2).check(|| {
        let topo = Topology::from_levels(2, vec![vec![0, 1]]);
        let g = Guarded::new(Hmcs::with_topology(&topo, 1));
        let g2 = g.clone();
        let t = thread::spawn(move || g2.bump(McsNode::with_cpu(1), 1, false, false));
        g.bump(McsNode::with_cpu(0), 1, false, true);
        t.join().unwrap();
        assert_eq!(g.total(), 2);
    });
}

/// A high- and a low-priority thread (TLP with MCS in both classes).
#[test]
fn priority_high_and_low() {
    loom::model(|| {
        let g = Guarded::new(Priority::<Mcs, Mcs>::default());
        let g2 = g.clone();
        let t = thread::spawn(move || g2.bump(Default::default(), 1, true, false));
        g.bump(Default::default(), 2, false, false);
        t.join().unwrap();
        assert_eq!(g.total(), 3);
        // The filter was reopened: a low-priority acquisition succeeds without waiting.
        let n = pin!(<Priority<Mcs, Mcs> as RawLock>::Node::default());
        assert!(g.lock.try_lock_low(n.as_ref()), "filter left closed");
        // SAFETY: acquired just above with `n`.
        unsafe { g.lock.unlock_low(n.as_ref()) };
    });
}

/// Two high-priority threads (the second may go straight) and one low-priority thread.
#[test]
fn priority_two_high_one_low() {
    bounded(1).check(|| {
        let g = Guarded::new(Priority::<Mcs, Mcs>::default());
        let (g2, g3) = (g.clone(), g.clone());
        let hi = thread::spawn(move || g2.bump(Default::default(), 1, false, false));
        let lo = thread::spawn(move || g3.bump(Default::default(), 1, true, false));
        g.bump(Default::default(), 1, false, false);
        hi.join().unwrap();
        lo.join().unwrap();
        assert_eq!(g.total(), 3);
        let n = pin!(<Priority<Mcs, Mcs> as RawLock>::Node::default());
        assert!(g.lock.try_lock_low(n.as_ref()), "filter left closed");
        // SAFETY: acquired just above with `n`.
        unsafe { g.lock.unlock_low(n.as_ref()) };
    });
}
