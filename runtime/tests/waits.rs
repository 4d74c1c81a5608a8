//! Blocking waits in the corners: a wait nested in a pool task that a waiting thread runs,
//! waits over the requests of several in-process ranks, `wait_any` / `wait_some` parking
//! instead of spinning, requests attached to a sync object of the user's, and requests
//! whose result was already taken. Every scenario runs on a thread of its own and fails
//! after a bound instead of hanging the suite.

mod common;

use std::time::{Duration, Instant};

use common::within;

use weft::{ProgressMode, Runtime, Source};

/// Every progress mode whose waiters park (`Global`, Algorithm 1, never does by design).
const PARKING: [ProgressMode; 2] = [ProgressMode::Owner, ProgressMode::Concurrent];

/// CPU time the calling thread has used so far (Linux: `/proc/thread-self/stat`, clock
/// ticks of 10 ms).
#[cfg(target_os = "linux")]
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// The calling thread's directory in `/proc` (Linux), for another thread to watch.
#[cfg(target_os = "linux")]
fn this_thread() -> std::path::PathBuf {
    std::path::Path::new("/proc").join(std::fs::read_link("/proc/thread-self").unwrap())
}

/// Waits until the thread of `task` (see [`this_thread`]) sleeps in the kernel (state `S`),
/// failing after a generous bound (a hang guard).
#[cfg(target_os = "linux")]
fn wait_asleep(task: &std::path::Path) {
    let t0 = Instant::now();
    let asleep =
        || std::fs::read_to_string(task.join("stat")).is_ok_and(|st| st.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('S')));
    while !asleep() {
        assert!(t0.elapsed() < Duration::from_secs(20), "the thread never slept");
        std::thread::yield_now();
    }
}

/// A thread blocked in a wait runs a pool task instead of sleeping ([Patinyasakdikul 2019, §4.6.2]); when
/// that task itself waits, it waits for its own requests — not for the outer wait's too.
/// Here the outer wait's message is sent only after the task's wait is over, so a task
/// that waited for both would never return (it did: the blocking waits of a thread shared
/// one sync object).
#[cfg(target_os = "linux")]
#[test]
fn a_wait_inside_a_helped_task_waits_for_its_own_requests() {
    for mode in PARKING {
        within(30, &format!("{mode:?}"), move || {
            // No pool workers: the task runs only on a waiting thread.
            let ranks = Runtime::builder().env(false).workers(0).progress(mode).build_local(2).unwrap();
            let (ra, rb) = (ranks[0].clone(), ranks[1].clone());
            let me = this_thread();
            let peer = std::thread::spawn(move || {
                let a = ra.world();
                // Once rank 1's thread sleeps: in its wait, or in the task's it runs.
                wait_asleep(&me);
                a.send(vec![1u8], 1, 1).unwrap();
                let (got, _) = a.recv(Vec::<u8>::with_capacity(1), 1u32, 2).unwrap();
                a.send(vec![3u8], 1, 3).unwrap();
                got
            });
            let rb2 = rb.clone();
            let task = rb.spawn(async move {
                let b = rb2.world();
                let (got, _) = b.recv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
                b.send(vec![2u8], 0, 2).unwrap();
                got
            });
            let (outer, _) = rb.world().recv(Vec::<u8>::with_capacity(1), 0u32, 3).unwrap();
            assert_eq!(outer, vec![3]);
            assert_eq!(peer.join().unwrap(), vec![2]);
            // A task that waited for the outer wait's message too would never have
            // returned (`within` fails it): it returns with its own.
            assert_eq!(rb.block_on(task).unwrap(), vec![1u8], "{mode:?}");
        });
    }
}

/// `wait_all` / `wait_any` over requests of two in-process ranks drive both ranks: a
/// rendezvous receive on one and its send on the other, waited for by one thread (only the
/// first request's rank was progressed, and the wait never returned).
#[test]
fn waits_over_requests_of_two_ranks_drive_both() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        within(30, &format!("{mode:?}"), move || {
            let ranks = Runtime::builder().env(false).progress(mode).eager_threshold(1024).build_local(2).unwrap();
            let (a, b) = (ranks[0].world(), ranks[1].world());
            let payload: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
            // wait_all, the receive first (its rank alone cannot complete the send).
            let r = b.irecv(Vec::<u8>::with_capacity(100_000), 0u32, 1).unwrap();
            let s = a.isend(payload.clone(), 1, 1).unwrap();
            let mut reqs = vec![r, s];
            weft::wait_all(&mut reqs).unwrap();
            let (got, st) = reqs[0].take().unwrap().unwrap();
            assert_eq!((got.len(), st.bytes), (100_000, 100_000));
            assert_eq!(got, payload);
            assert!(reqs[1].take().unwrap().is_ok());
            // wait_any / wait_some until both are taken.
            let r = b.irecv(Vec::<u8>::with_capacity(100_000), 0u32, 2).unwrap();
            let s = a.isend(payload.clone(), 1, 2).unwrap();
            let mut reqs = vec![r, s];
            let mut taken = 0;
            let mut out = Vec::new();
            while taken < 2 {
                if taken == 0 {
                    let i = weft::wait_any(&mut reqs).expect("a live request");
                    assert!(reqs[i].take().unwrap().is_ok());
                    taken += 1;
                } else {
                    assert_eq!(weft::wait_some(&mut reqs, &mut out), 1);
                    assert!(reqs[out[0]].take().unwrap().is_ok());
                    taken += 1;
                }
            }
            assert_eq!(weft::wait_any(&mut reqs), None, "every request taken");
        });
    }
}

/// `wait_any` and `wait_some` park while nothing completes, as `wait_all` does (they used
/// to yield in a loop, a core busy for the whole wait).
#[cfg(target_os = "linux")]
#[test]
fn wait_any_and_wait_some_park() {
    for mode in PARKING {
        for some in [false, true] {
            within(30, &format!("{mode:?}"), move || {
                let ranks = Runtime::builder().env(false).progress(mode).build_local(2).unwrap();
                let (ra, rb) = (ranks[0].clone(), ranks[1].clone());
                let late = Duration::from_millis(600);
                let peer = std::thread::spawn(move || {
                    std::thread::sleep(late);
                    ra.world().send(vec![7u8], 1, 5).unwrap();
                });
                let b = rb.world();
                let mut reqs = vec![
                    b.irecv(Vec::<u8>::with_capacity(1), 0u32, 4).unwrap(),
                    b.irecv(Vec::<u8>::with_capacity(1), Source::Any, 5).unwrap(),
                ];
                let (cpu0, t0) = (thread_cpu(), Instant::now());
                let i = if some {
                    let mut out = Vec::new();
                    assert_eq!(weft::wait_some(&mut reqs, &mut out), 1);
                    out[0]
                } else {
                    weft::wait_any(&mut reqs).unwrap()
                };
                let (cpu, wall) = (thread_cpu() - cpu0, t0.elapsed());
                assert_eq!(i, 1);
                assert_eq!(reqs[1].take().unwrap().unwrap().0, vec![7]);
                assert!(!reqs[0].is_complete(), "the other receive is still posted");
                peer.join().unwrap();
                assert!(wall >= late / 2, "{wall:?}");
                assert!(cpu * 4 < wall, "{mode:?} some={some}: the waiting thread used {cpu:?} of CPU in {wall:?}");
            });
        }
    }
}

/// A request attached to a sync object of the user's can still be waited for on its own
/// (its completion goes to that object; the wait tests it) — it used to panic in `wait`,
/// whose sync object could not attach it and returned at once.
#[test]
fn a_request_attached_elsewhere_can_be_waited_for() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        within(30, &format!("{mode:?}"), move || {
            let ranks = Runtime::builder().env(false).progress(mode).build_local(2).unwrap();
            let (ra, rb) = (ranks[0].clone(), ranks[1].clone());
            let sync = rb.sync_object::<u32>();
            let b = rb.world();
            let mut r = b.irecv(Vec::<u8>::with_capacity(4), 0u32, 9).unwrap();
            sync.attach(&mut r, 42).unwrap();
            let peer = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                ra.world().send(vec![1u8, 2], 1, 9).unwrap();
                ra.world().send(vec![3u8], 1, 10).unwrap();
            });
            let (got, st) = r.wait().unwrap();
            assert_eq!((got, st.tag), (vec![1, 2], 9));
            let ev = sync.query().expect("the attached object got the completion");
            assert_eq!(ev.data, 42);
            // The same through wait_any, with a second request not attached anywhere.
            let mut x = b.irecv(Vec::<u8>::with_capacity(4), 0u32, 10).unwrap();
            sync.attach(&mut x, 43).unwrap();
            let y = b.irecv(Vec::<u8>::with_capacity(4), 0u32, 11).unwrap();
            let mut reqs = vec![x, y];
            assert_eq!(weft::wait_any(&mut reqs), Some(0));
            assert_eq!(reqs[0].take().unwrap().unwrap().0, vec![3]);
            assert_eq!(sync.query().map(|e| e.data), Some(43));
            peer.join().unwrap();
        });
    }
}

/// `wait` after `take` is an error, not a panic; and every taken request attached to a sync
/// object reports "already consumed" there (all of them: they shared one cell, which
/// delivers once, so only the first did).
#[test]
fn taken_requests_give_errors() {
    within(30, "taken", || {
        let ranks = Runtime::builder().env(false).build_local(2).unwrap();
        let (a, b) = (ranks[0].world(), ranks[1].world());
        let sync = ranks[1].sync_object::<u32>();
        let mut taken = Vec::new();
        for i in 0..3 {
            let mut r = b.irecv(Vec::<u8>::with_capacity(4), 0u32, i).unwrap();
            a.send(vec![i as u8], 1, i).unwrap();
            while !r.test() {}
            assert_eq!(r.take().unwrap().unwrap().0, vec![i as u8]);
            assert!(r.take().is_none());
            taken.push(r);
        }
        // A send completed inside `isend`, taken.
        let mut s = a.isend(vec![0u8], 1, 7).unwrap();
        assert!(s.take().unwrap().is_ok());
        b.recv(Vec::<u8>::with_capacity(1), 0u32, 7).unwrap();
        for (i, r) in taken.iter_mut().enumerate() {
            sync.attach(r, i as u32).unwrap();
        }
        sync.attach(&mut s, 9).unwrap();
        let mut seen = Vec::new();
        while let Some(ev) = sync.query() {
            assert!(matches!(ev.outcome, Err(weft::Error::InvalidArgument(_))), "{:?}", ev.outcome);
            seen.push(ev.data);
        }
        seen.sort();
        assert_eq!(seen, vec![0, 1, 2, 9]);
        let err = taken.pop().unwrap().wait().unwrap_err();
        assert!(matches!(err, weft::Error::InvalidArgument(_)), "{err:?}");
        assert!(matches!(s.wait(), Err(weft::Error::InvalidArgument(_))));
        // wait_any over taken requests only: nothing to wait for.
        assert_eq!(weft::wait_any(&mut taken), None);
    });
}

/// A blocking wait lends the requests' completions to a sync object of its own; after it,
/// a completed request the user attaches to their sync object is queued there at once, in
/// every mode (the wait's object had spent the one delivery of the request, and the
/// user's attach was refused as already attached, in `Owner` and `Concurrent` mode).
#[test]
fn requests_completed_inside_a_wait_can_be_attached_after_it() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        within(30, &format!("{mode:?}"), move || {
            let ranks = Runtime::builder().env(false).progress(mode).workers(0).build_local(2).unwrap();
            let (ra, rb) = (ranks[0].clone(), ranks[1].clone());
            let b = rb.world();
            let mut reqs =
                vec![b.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap(), b.irecv(Vec::<u8>::with_capacity(1), 0u32, 2).unwrap()];
            let mut more = vec![b.irecv(Vec::<u8>::with_capacity(1), 0u32, 3).unwrap()];
            let peer = std::thread::spawn(move || {
                // Late: the waits below have attached their requests and parked.
                std::thread::sleep(Duration::from_millis(100));
                for tag in [2, 1, 3] {
                    ra.world().send(vec![tag as u8], 1, tag).unwrap();
                }
            });
            let i = weft::wait_any(&mut reqs).unwrap();
            weft::wait_all(&mut more).unwrap();
            peer.join().unwrap();
            let other = 1 - i;
            while !reqs[other].test() {}
            let sync = rb.sync_object::<usize>();
            sync.attach(&mut reqs[other], other).unwrap();
            sync.attach(&mut more[0], 7).unwrap();
            let mut got: Vec<usize> = std::iter::from_fn(|| sync.query().map(|e| e.data)).collect();
            got.sort();
            assert_eq!(got, vec![other, 7], "{mode:?}");
            assert_eq!(reqs[other].take().unwrap().unwrap().0, vec![other as u8 + 1]);
        });
    }
}

/// The cancel-safe way to receive under `tokio::select!` (`Request` docs): the receive is
/// kept across turns and polled by reference, so a turn won by the timer loses nothing —
/// while rank 1's pool workers match messages into it between polls (the case in which a
/// receive created anew each turn and dropped with its turn lost about one message in ten).
#[test]
fn a_receive_polled_by_reference_in_select_loses_nothing() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let got = within(60, &format!("{mode:?}"), move || {
            let ranks = Runtime::builder().env(false).progress(mode).cris(2).workers(2).build_local(2).unwrap();
            // Rank 1's pool is started: its idle workers make progress passes.
            ranks[1].block_on(ranks[1].spawn(async {})).unwrap();
            let (a, b) = (ranks[0].world().clone(), ranks[1].world().clone());
            let n = 300u32;
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().unwrap();
            rt.block_on(async move {
                let sender = tokio::spawn(async move {
                    for i in 0..n {
                        a.isend(vec![i], 1, 5).unwrap().await.unwrap();
                        tokio::time::sleep(Duration::from_micros(100)).await;
                    }
                });
                let mut got = Vec::new();
                let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
                let mut recv = b.irecv(Vec::<u32>::with_capacity(1), 0u32, 5).unwrap();
                while (got.len() as u32) < n && tokio::time::Instant::now() < deadline {
                    tokio::select! {
                        r = &mut recv => {
                            got.push(r.unwrap().0[0]);
                            recv = b.irecv(Vec::<u32>::with_capacity(1), 0u32, 5).unwrap();
                        }
                        _ = tokio::time::sleep(Duration::from_micros(300)) => {}
                    }
                }
                sender.await.unwrap();
                got
            })
        });
        assert_eq!(got, (0..300).collect::<Vec<u32>>(), "{mode:?}");
    }
}

/// Sets a flag when dropped: stops the threads of a scenario when it ends, by a return or
/// by a panic.
struct StopOnDrop(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// `wait_any` (or `wait_some`, with `some`) over batches of receives on rank 1 while other
/// threads of rank 1 drive its progress all the time, and so complete the receives while
/// the wait attaches, waits and detaches them. For about `budget`, at most `iters` batches.
/// Returns how many batches were received, or the first wrong answer.
fn waits_while_others_progress(mode: ProgressMode, some: bool, iters: usize, budget: Duration) -> Result<usize, String> {
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::sync::Arc;
    const BATCH: usize = 32;
    const HELPERS: usize = 2;
    let ranks = Runtime::builder().env(false).progress(mode).build_local(2).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let helpers: Vec<_> = (0..HELPERS)
        .map(|_| {
            let (r, stop) = (ranks[1].clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    r.progress();
                    std::thread::yield_now();
                }
            })
        })
        .collect();
    // One batch sent per batch posted; the sender stops at the next batch once the receiver
    // is done (or failed).
    let (to_send, sent) = std::sync::mpsc::channel::<()>();
    let sender = {
        let (r, stop) = (ranks[0].clone(), stop.clone());
        std::thread::spawn(move || {
            let c = r.world();
            while sent.recv().is_ok() && !stop.load(Relaxed) {
                let mut w = Vec::with_capacity(BATCH);
                for k in 0..BATCH {
                    w.push(c.isend(vec![k as u8; 8], 1, 5).unwrap());
                    if k % 4 == 0 {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                }
                weft::wait_all(&mut w).unwrap();
            }
        })
    };
    let c = ranks[1].world();
    let start = Instant::now();
    let mut out = Vec::new();
    let mut result = Ok(0);
    'batches: for it in 0..iters {
        if start.elapsed() > budget {
            break;
        }
        let mut reqs: Vec<_> = (0..BATCH).map(|_| c.irecv(Vec::<u8>::with_capacity(8), Source::Any, 5).unwrap()).collect();
        to_send.send(()).unwrap();
        let mut taken = [false; BATCH];
        let mut left = BATCH;
        while left > 0 {
            let n = if some {
                weft::wait_some(&mut reqs, &mut out)
            } else {
                out.clear();
                out.extend(weft::wait_any(&mut reqs));
                out.len()
            };
            if n == 0 {
                let call = if some { "wait_some returned 0" } else { "wait_any returned None" };
                result = Err(format!("batch {it}: {call} with {left} requests not taken"));
                break 'batches;
            }
            for &i in &out {
                if taken[i] {
                    result = Err(format!("batch {it}: index {i} was already taken ({left} left)"));
                    break 'batches;
                }
                if !matches!(reqs[i].take(), Some(Ok(_))) {
                    result = Err(format!("batch {it}: index {i} is not complete ({left} left)"));
                    break 'batches;
                }
                taken[i] = true;
                left -= 1;
            }
        }
        result = Ok(it + 1);
    }
    drop(to_send);
    sender.join().unwrap();
    stop.store(true, Relaxed);
    for h in helpers {
        h.join().unwrap();
    }
    result
}

/// `wait_any` / `wait_some` while other threads of the rank complete the requests: every
/// index returned is of a request complete and not taken, and `wait_some` returns at least
/// one while any is pending. A request completed by another thread while the wait detached
/// it had its event queued on the wait's sync object only after the wait had emptied that
/// object; the next wait of the thread, on the same object, took the stale event as its
/// own answer (an index already taken, or of a request still pending).
#[test]
fn wait_any_and_wait_some_while_other_threads_complete_the_requests() {
    for mode in PARKING {
        for some in [false, true] {
            let what = format!("{mode:?} {}", if some { "wait_some" } else { "wait_any" });
            let batches = within(60, &what, move || waits_while_others_progress(mode, some, 3000, Duration::from_secs(2)));
            match batches {
                Ok(n) => assert!(n > 0, "{what}: no batch done"),
                Err(e) => panic!("{what}: {e}"),
            }
        }
    }
}

/// Rounds of windows of rendezvous sends between the threads of two ranks with two-frame
/// inboxes, each round ending at a `std::sync::Barrier` of every thread: a thread that
/// reached it makes no progress, so a `Fin` a receiver deferred behind the sender's full
/// inbox and never sent before its thread got there left the sender's wait — and with it
/// the barrier — stuck for good. The rank's courier sends it; every round finishes, in
/// every progress mode, with and without pool workers.
#[test]
fn rounds_that_end_at_a_std_barrier_finish_behind_full_inboxes() {
    const SENDERS: usize = 4;
    const RECEIVERS: usize = 2;
    const WINDOW: usize = 16;
    const ROUNDS: usize = 25;
    const LEN: usize = 40_000;
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        for workers in [None, Some(0)] {
            within(60, &format!("{mode:?}, workers {workers:?}: rounds ending at a barrier"), move || {
                let mut b = Runtime::builder().env(false).progress(mode).inbox_capacity(2).eager_threshold(16 << 10);
                if let Some(n) = workers {
                    b = b.workers(n);
                }
                let ranks = b.build_local(2).unwrap();
                if workers.is_some() {
                    // The pool exists (without threads): waits also run its tasks.
                    ranks[0].block_on(ranks[0].spawn(async {})).unwrap();
                }
                let bar = std::sync::Barrier::new(SENDERS + RECEIVERS);
                std::thread::scope(|s| {
                    for t in 0..SENDERS {
                        let (c, bar) = (ranks[0].world(), &bar);
                        s.spawn(move || {
                            for round in 0..ROUNDS {
                                let mut reqs: Vec<_> =
                                    (0..WINDOW).map(|k| c.isend(vec![(round + k) as u8; LEN], 1, t as i32).unwrap()).collect();
                                weft::wait_all(&mut reqs).unwrap();
                                bar.wait();
                            }
                        });
                    }
                    for r in 0..RECEIVERS {
                        let (c, bar) = (ranks[1].world(), &bar);
                        s.spawn(move || {
                            for round in 0..ROUNDS {
                                // Receiver `r` takes the messages of the senders `t % RECEIVERS == r`.
                                let mut reqs: Vec<_> = (0..SENDERS)
                                    .filter(|t| t % RECEIVERS == r)
                                    .flat_map(|t| (0..WINDOW).map(move |_| t))
                                    .map(|t| c.irecv(Vec::<u8>::with_capacity(LEN), 0u32, t as i32).unwrap())
                                    .collect();
                                weft::wait_all(&mut reqs).unwrap();
                                for (i, q) in reqs.iter_mut().enumerate() {
                                    let (m, _) = q.take().unwrap().unwrap();
                                    let k = i % WINDOW;
                                    assert!(
                                        m.len() == LEN && m.iter().all(|&x| x == (round + k) as u8),
                                        "round {round}: message {k} corrupted"
                                    );
                                }
                                bar.wait();
                            }
                        });
                    }
                });
            });
        }
    }
}

/// `wait_all` returns the error of a request that failed, whether the wait's own tests saw
/// every request complete (here, all three frames are in before the wait: a truncated
/// receive among them) or some completed while the wait was parked on its sync object (the
/// truncating message is sent late), and leaves each request's result to `take`.
#[test]
fn wait_all_reports_a_failed_request_seen_or_parked() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        for late in [false, true] {
            within(30, &format!("{mode:?} late={late}"), move || {
                let ranks = Runtime::builder().env(false).progress(mode).build_local(2).unwrap();
                let (ra, rb) = (ranks[0].clone(), ranks[1].clone());
                let b = rb.world();
                let mut reqs: Vec<_> = (0..3).map(|_| b.irecv(Vec::<u8>::with_capacity(4), 0u32, 9).unwrap()).collect();
                let sizes = [2usize, 8, 3];
                let peer = std::thread::spawn(move || {
                    for (i, &n) in sizes.iter().enumerate() {
                        if late && i == 1 {
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        ra.world().send(vec![i as u8; n], 1, 9).unwrap();
                    }
                });
                let peer = if late { Some(peer) } else { peer.join().map(|()| None).unwrap() };
                let err = weft::wait_all(&mut reqs).unwrap_err();
                assert_eq!(err, weft::Error::Truncated { message_len: 8, buffer_len: 4 }, "{mode:?} late={late}");
                assert_eq!(reqs[0].take().unwrap().unwrap().0, vec![0, 0]);
                assert!(reqs[1].take().unwrap().is_err());
                assert_eq!(reqs[2].take().unwrap().unwrap().0, vec![2, 2, 2]);
                // Taken, every request is settled without an error.
                assert_eq!(weft::wait_all(&mut reqs), Ok(()));
                if let Some(peer) = peer {
                    peer.join().unwrap();
                }
            });
        }
    }
}
