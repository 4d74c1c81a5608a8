//! The process-wide spin budget (`weft_sync::IdleBackoff`: one spinning waiter per core,
//! shared by every runtime of the process) with two runtimes in one process. While other
//! waiters hold every slot, the two worlds' waiters still finish their exchanges (they
//! yield instead of spinning: nobody starves for a slot); and once both worlds' waits —
//! blocking and nested, one world's request awaited inside the other's `block_on` — are
//! over, every slot is free again, exactly: as many waiters as cores may spin at once, and
//! not one more (a slot kept or given back twice by a wait would show here).
//!
//! The only test of its binary: the budget is the process's, and another test's waiters
//! would hold slots meanwhile.

mod common;

use std::sync::mpsc;
use std::sync::Barrier;

use common::within;
use weft::{ProgressMode, Runtime};
use weft_sync::IdleBackoff;

/// Round trips per world.
const ROUNDS: usize = 200;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// How many of `k` waiters, each on a thread of its own and all at once, may spin.
fn spinners_at_once(k: usize) -> usize {
    let barrier = Barrier::new(k);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..k)
            .map(|_| {
                s.spawn(|| {
                    let mut idle = IdleBackoff::new();
                    let got = idle.may_spin();
                    // Every waiter asks while every other holds what it got.
                    barrier.wait();
                    barrier.wait();
                    got
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).filter(|&got| got).count()
    })
}

/// Two worlds (`Owner` and `Concurrent` progress, one pool worker each) in one process: in
/// each, rank 0 and rank 1 play `ROUNDS` round trips of eager and rendezvous messages on
/// threads of their own, and at the end a thread of world A waits, inside A's `block_on`,
/// for a receive of world B.
fn two_worlds_exchange() {
    let build = |mode| Runtime::builder().env(false).progress(mode).workers(1).eager_threshold(512).build_local(2).unwrap();
    let (a, b) = (build(ProgressMode::Owner), build(ProgressMode::Concurrent));
    std::thread::scope(|s| {
        for w in [&a, &b] {
            s.spawn(move || {
                let c = w[1].world();
                for i in 0..ROUNDS {
                    let (m, _) = c.recv(Vec::<u8>::with_capacity(2048), 0u32, 1).unwrap();
                    assert_eq!(m.len(), (i * 37) % 2000, "round {i}");
                    c.send(m, 0, 2).unwrap();
                }
            });
            s.spawn(move || {
                let c = w[0].world();
                for i in 0..ROUNDS {
                    let m: Vec<u8> = (0..(i * 37) % 2000).map(|k| (k + i) as u8).collect();
                    c.send(m.clone(), 1, 1).unwrap();
                    assert_eq!(c.recv(Vec::<u8>::with_capacity(2048), 1u32, 2).unwrap().0, m, "round {i}");
                }
            });
        }
    });
    let nested = b[1].world().irecv(Vec::<u8>::with_capacity(8), 0u32, 9).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| b[0].world().send(vec![9u8; 8], 1, 9).unwrap());
        let (m, st) = a[0].block_on(nested).unwrap();
        assert_eq!((m, st.source), (vec![9u8; 8], 0));
    });
}

#[test]
fn two_runtimes_share_the_spin_budget_without_starving_or_leaking_slots() {
    let n = cores();
    assert_eq!(spinners_at_once(n + 1), n, "before any runtime: one spinner per core");

    // Every slot held by waiters outside both runtimes: the runtimes' waiters yield, and
    // still finish.
    let (release, held) = mpsc::channel::<()>();
    let holders = Barrier::new(n + 1);
    let held = std::sync::Mutex::new(held);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    let mut idle = IdleBackoff::new();
                    let got = idle.may_spin();
                    holders.wait();
                    // Hold the slot until released (the receiver is shared: one message each).
                    let _ = held.lock().unwrap().recv();
                    got
                })
            })
            .collect();
        holders.wait();
        assert_eq!(spinners_at_once(1), 0, "every slot is held");
        within(120, "two worlds' exchanges while every spin slot is held elsewhere", two_worlds_exchange);
        for _ in 0..n {
            release.send(()).unwrap();
        }
        assert!(hs.into_iter().all(|h| h.join().unwrap()), "a holder got no slot");
    });

    // Free slots: the two worlds' waiters take and give back slots concurrently.
    within(120, "two worlds' exchanges with free spin slots", two_worlds_exchange);
    assert_eq!(spinners_at_once(n + 1), n, "after two runtimes' waits: every slot free again, and no more than one per core");
}
