//! Runtimes side by side in one process, in every progress mode: two worlds whose tasks
//! block on each other's messages (thread-local state of one runtime must not steer the
//! other's waits), and ranks without pool threads (`workers(0)`) talking across ranks with
//! async requests only. Every scenario runs on a thread of its own and fails after a
//! generous bound instead of hanging the suite.

mod common;

use common::within;
use weft::{Assignment, ProgressMode, Runtime};

const MODES: [ProgressMode; 3] = [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent];

/// Two worlds of two ranks each: a task of world A blocks on a message of world B and
/// forwards it on A, a task of B does the same the other way, and one thread then waits
/// on a receive of each world at once, with the same tag in both: each world gets its own
/// message. With pool workers the tasks run on them; without (`workers(0)`), on the thread
/// that waits for them, nested inside its wait.
#[test]
fn two_worlds_in_one_process_whose_tasks_block_on_each_other() {
    for mode in MODES {
        for workers in [0, 1] {
            for assignment in [Assignment::Dedicated, Assignment::RoundRobin] {
                let what = format!("{mode:?}, {workers} workers, {assignment:?}");
                within(60, &what.clone(), move || {
                    let build = || {
                        Runtime::builder().env(false).progress(mode).workers(workers).assignment(assignment).cris(2).build_local(2).unwrap()
                    };
                    let (a, b) = (build(), build());
                    let (b1, a0) = (b[1].world().clone(), a[0].world().clone());
                    let a_task = a[0].spawn(async move {
                        let (m, st) = b1.recv(Vec::<u8>::with_capacity(16), 0u32, 1).unwrap();
                        assert_eq!((st.source, st.tag), (0, 1));
                        a0.send(m, 1, 2).unwrap();
                    });
                    let (a1, b0) = (a[1].world().clone(), b[0].world().clone());
                    let b_task = b[0].spawn(async move {
                        let (m, st) = a1.recv(Vec::<u8>::with_capacity(16), 0u32, 3).unwrap();
                        assert_eq!((st.source, st.tag), (0, 3));
                        b0.send(m, 1, 4).unwrap();
                    });
                    b[0].world().send(b"from b".to_vec(), 1, 1).unwrap();
                    a[0].block_on(a_task).unwrap();
                    assert_eq!(a[1].world().recv(Vec::<u8>::with_capacity(16), 0u32, 2).unwrap().0, b"from b", "{what}");
                    a[0].world().send(b"from a".to_vec(), 1, 3).unwrap();
                    b[0].block_on(b_task).unwrap();
                    assert_eq!(b[1].world().recv(Vec::<u8>::with_capacity(16), 0u32, 4).unwrap().0, b"from a", "{what}");
                    // One thread, a receive in each world, one tag.
                    let ra = a[1].world().irecv(Vec::<u8>::with_capacity(1), 0u32, 5).unwrap();
                    let rb = b[1].world().irecv(Vec::<u8>::with_capacity(1), 0u32, 5).unwrap();
                    b[0].world().send(vec![2u8], 1, 5).unwrap();
                    a[0].world().send(vec![1u8], 1, 5).unwrap();
                    assert_eq!(rb.wait().unwrap().0, vec![2u8], "{what}");
                    assert_eq!(ra.wait().unwrap().0, vec![1u8], "{what}");
                });
            }
        }
    }
}

/// Message `i` of the ping-pong: its length crosses the 256-byte eager threshold.
fn ball(i: usize) -> Vec<u8> {
    (0..(i * 53) % 1000).map(|k| (k + i) as u8).collect()
}

/// `workers(0)`: no pool threads, so each rank's task runs only on the thread in that rank's
/// `block_on`; the two ranks play 60 rounds of ping-pong with async requests (eager and
/// rendezvous), each side's future driving its own rank's progress, in every mode.
#[test]
fn workers_0_ranks_talk_across_ranks_with_async_requests_in_every_mode() {
    for mode in MODES {
        within(60, &format!("{mode:?}"), move || {
            let ranks = Runtime::builder().env(false).progress(mode).workers(0).eager_threshold(256).build_local(2).unwrap();
            const ROUNDS: usize = 60;
            let c1 = ranks[1].world().clone();
            let server = ranks[1].spawn(async move {
                for i in 0..ROUNDS {
                    let (m, st) = c1.irecv(Vec::<u8>::with_capacity(1000), 0u32, (i % 5) as i32).unwrap().await.unwrap();
                    assert_eq!((st.source, m.len()), (0, ball(i).len()));
                    let back: Vec<u8> = m.iter().rev().copied().collect();
                    c1.isend(back, 0, 100).unwrap().await.unwrap();
                }
            });
            let c0 = ranks[0].world().clone();
            let client = ranks[0].spawn(async move {
                for i in 0..ROUNDS {
                    let reply = c0.irecv(Vec::<u8>::with_capacity(1000), 1u32, 100).unwrap();
                    c0.isend(ball(i), 1, (i % 5) as i32).unwrap().await.unwrap();
                    let (m, _) = reply.await.unwrap();
                    let want: Vec<u8> = ball(i).into_iter().rev().collect();
                    assert_eq!(m, want, "round {i}");
                }
            });
            std::thread::scope(|s| {
                s.spawn(|| ranks[1].block_on(server).unwrap());
                ranks[0].block_on(client).unwrap();
            });
        });
    }
}
