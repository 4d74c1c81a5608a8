//! The thread that stands in for a rank's tasks parked on a queue lock's hand-off
//! (`weft-dlock-stand-in`) ends with the rank's last lock, and, where a lock was leaked with
//! `mem::forget` after a task parked on it, when the rank's runtime is dropped. One test in
//! this process: it counts the process's threads by name.
#![cfg(feature = "ofi")]

use std::sync::mpsc;
use std::time::{Duration, Instant};

use weft::dlock::DMcs;
use weft::Runtime;

/// The process's stand-in threads (`/proc/self/task/*/comm` holds 15 bytes of a name).
fn stand_ins() -> usize {
    let tasks = std::fs::read_dir("/proc/self/task").expect("/proc/self/task");
    tasks.filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok()).filter(|c| c.starts_with("weft-dlock-stan")).count()
}

/// On two ranks on `shm`, rank 0 holds a D-MCS lock until rank 1's task waiting for it
/// (`lock_async` under an executor of its own) parked on the hand-off and the rank's
/// stand-in thread runs, then releases; the task takes the lock and releases it. With
/// `leak`, both ranks then leak the lock. Returns whether the stand-in ran while the task
/// was parked.
fn park_a_task(rts: &[Runtime], leak: bool) -> bool {
    std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let c = rts[1].world();
            let lock = DMcs::new(c, 0).unwrap();
            c.barrier().unwrap();
            c.barrier().unwrap();
            futures::executor::block_on(async {
                let guard = lock.lock_async().await.unwrap();
                guard.unlock_async().await.unwrap();
            });
            c.barrier().unwrap();
            if leak {
                std::mem::forget(lock);
            }
        });
        let c = rts[0].world();
        let lock = DMcs::new(c, 0).unwrap();
        c.barrier().unwrap();
        let guard = lock.lock().unwrap();
        c.barrier().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while stand_ins() == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let stood = stand_ins() > 0;
        guard.unlock().unwrap();
        c.barrier().unwrap();
        if leak {
            std::mem::forget(lock);
        }
        waiter.join().unwrap();
        stood
    })
}

fn ranks() -> Vec<Runtime> {
    Runtime::builder().env(false).provider(weft::Provider::Shm).cris(1).build_local(2).unwrap()
}

#[test]
fn a_leaked_lock_keeps_no_stand_in_past_its_runtime() {
    std::env::set_var("FI_TCP_IFACE", "lo");
    std::env::set_var("FI_SOCKETS_IFACE", "lo");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        // The locks freed: their last one joins the stand-in.
        let rts = ranks();
        let stood = park_a_task(&rts, false);
        let after_locks = stand_ins();
        drop(rts);
        // A lock leaked: the stand-in lives on with it until the runtime is dropped.
        let rts = ranks();
        let stood_leaked = park_a_task(&rts, true);
        let after_leak = stand_ins();
        drop(rts);
        let _ = tx.send((stood, after_locks, stood_leaked, after_leak, stand_ins()));
    });
    let (stood, after_locks, stood_leaked, after_leak, after_runtime) =
        rx.recv_timeout(Duration::from_secs(60)).expect("hang: a task parked on a lock, then the lock and its runtime dropped");
    assert!(stood && stood_leaked, "no stand-in ran while the task was parked");
    assert_eq!(after_locks, 0, "stand-ins left once the locks were freed");
    assert_eq!(after_leak, 1, "the leaked lock's stand-in before its runtime is dropped");
    assert_eq!(after_runtime, 0, "stand-ins left once the runtime with a leaked lock was dropped");
}
