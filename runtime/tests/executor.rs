//! The work-stealing executor: spawn/join, panics, fairness, requests inside the pool in
//! every progress mode, waiters that run pool tasks, tokio interop.

mod common;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use common::within;
use weft::{JoinError, ProgressMode, Runtime, Source, Tag};

fn rt(workers: usize) -> Runtime {
    Runtime::builder().env(false).workers(workers).cris(2).build().unwrap()
}

/// A future that is ready at once (or panics in its poll) and panics when dropped.
struct PanicOnDrop {
    /// Panic in `poll` too.
    poll_panics: bool,
}

impl Future for PanicOnDrop {
    type Output = u32;
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<u32> {
        if self.poll_panics {
            panic!("poll panics");
        }
        Poll::Ready(5)
    }
}

impl Drop for PanicOnDrop {
    fn drop(&mut self) {
        panic!("drop panics");
    }
}

/// Yields once (wakes itself and returns `Pending` the first time).
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[test]
fn spawn_and_join_many() {
    let rt = rt(2);
    let handles: Vec<_> = (0..10_000u64).map(|i| rt.spawn(async move { i * 2 })).collect();
    let sum = rt.block_on(async {
        let mut s = 0;
        for h in handles {
            s += h.await.unwrap();
        }
        s
    });
    assert_eq!(sum, (0..10_000u64).map(|i| i * 2).sum::<u64>());
}

#[test]
fn tasks_spawn_tasks_and_yield() {
    let rt = rt(2);
    let rt2 = rt.clone();
    let total = rt.block_on(rt.spawn(async move {
        let mut hs = Vec::new();
        for i in 0..100usize {
            hs.push(rt2.spawn(async move {
                for _ in 0..10 {
                    YieldNow(false).await;
                }
                i
            }));
        }
        let mut t = 0;
        for h in hs {
            t += h.await.unwrap();
        }
        t
    }));
    assert_eq!(total.unwrap(), 4950);
}

#[test]
fn a_panic_is_a_join_error() {
    let rt = rt(1);
    let h = rt.spawn(async {
        if std::hint::black_box(true) {
            panic!("boom in a task");
        }
        1
    });
    match rt.block_on(h) {
        Err(JoinError::Panicked(m)) => assert!(m.contains("boom in a task"), "{m}"),
        other => panic!("expected a panic error, got {other:?}"),
    }
    // The worker survived.
    assert_eq!(rt.block_on(rt.spawn(async { 5 })).unwrap(), 5);
}

#[test]
fn a_panic_in_a_futures_drop_is_a_join_error_and_the_worker_survives() {
    // The future is dropped where its poll is caught (as tokio's harness does): a panic in
    // its `Drop` completes the task with that panic (the output, ready just before, is lost)
    // instead of unwinding through the worker, which used to die and leave the join handle
    // pending forever (and with one worker, the pool dead).
    let (ready, both, after) = within(20, "a task whose future panics in Drop", || {
        let rt = rt(1);
        let ready = rt.block_on(rt.spawn(PanicOnDrop { poll_panics: false }));
        // A panic in the poll and another in the drop: the poll's is reported.
        let both = futures::executor::block_on(rt.spawn(PanicOnDrop { poll_panics: true }));
        // The only worker still runs tasks.
        let after: Vec<_> = (0..10).map(|i| rt.spawn(async move { i })).collect();
        let after: Vec<_> = after.into_iter().map(|h| rt.block_on(h)).collect();
        (ready, both, after)
    });
    assert_eq!(ready, Err(JoinError::Panicked("drop panics".into())));
    assert_eq!(both, Err(JoinError::Panicked("poll panics".into())));
    assert_eq!(after, (0..10).map(Ok).collect::<Vec<_>>());
}

/// An output that panics when dropped.
struct PanicOnDropOutput;

impl Drop for PanicOnDropOutput {
    fn drop(&mut self) {
        panic!("output drop panics");
    }
}

#[test]
fn a_panic_in_the_drop_of_an_output_nobody_joins_leaves_the_worker_alive() {
    // The join handle is dropped first, so the output is dropped on the worker that
    // completes the task: its panic used to unwind through the worker and kill it (with
    // one worker, the pool: tasks spawned afterwards never ran).
    let after = within(20, "a task whose unjoined output panics in Drop", || {
        let rt = rt(1);
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        drop(rt.spawn(async move {
            d.store(true, Ordering::Release);
            PanicOnDropOutput
        }));
        while !done.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        // Joined from outside the pool (`futures`' executor runs no pool task): only the
        // worker can run these.
        let after: Vec<_> = (0..10).map(|i| rt.spawn(async move { i })).collect();
        after.into_iter().map(futures::executor::block_on).collect::<Vec<_>>()
    });
    assert_eq!(after, (0..10).map(Ok).collect::<Vec<_>>());
}

#[test]
fn a_panic_in_the_drop_of_a_cancelled_task_is_a_join_error() {
    // Tasks still queued at shutdown are cancelled by dropping their futures; a panic there
    // completes that task with the panic and the other cancellations still happen (it used
    // to unwind out of the worker's or the dropping thread's cancel loop).
    let (panicked, cancelled, blocker) = within(20, "cancelling a task whose future panics in Drop", || {
        let rt = rt(1);
        let gate = Arc::new(std::sync::Barrier::new(2));
        let g2 = gate.clone();
        // Occupies the only worker until after the runtime is dropped, so the tasks below
        // stay queued.
        let blocker = rt.spawn(async move {
            g2.wait();
            std::thread::sleep(Duration::from_millis(200));
        });
        gate.wait();
        let panicky = rt.spawn(PanicOnDrop { poll_panics: false });
        let plain = rt.spawn(async { 7 });
        drop(rt);
        let b = futures::executor::block_on(blocker);
        (futures::executor::block_on(panicky), futures::executor::block_on(plain), b)
    });
    assert_eq!(panicked, Err(JoinError::Panicked("drop panics".into())));
    assert_eq!(cancelled, Err(JoinError::Cancelled));
    assert_eq!(blocker, Ok(()));
}

/// Sets its flag when dropped (tells whether a task's future was dropped).
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn a_task_waiting_for_a_wake_is_cancelled_at_shutdown() {
    // A task that waits for a wake sits in no queue; shutdown used to cancel only queued
    // tasks, so its join handle never resolved (though `spawn` promises a `JoinError`) and
    // its future was never dropped.
    let (res, dropped_by_shutdown) = within(10, "the join handle of a waiting task after shutdown", || {
        let rt = rt(2);
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        let (polled_tx, polled) = mpsc::channel();
        let h = rt.spawn(async move {
            let _flag = flag;
            polled_tx.send(()).unwrap();
            futures::future::pending::<()>().await
        });
        polled.recv().unwrap();
        drop(rt);
        let dropped_by_shutdown = dropped.load(Ordering::SeqCst);
        (futures::executor::block_on(h), dropped_by_shutdown)
    });
    assert_eq!(res, Err(JoinError::Cancelled));
    assert!(dropped_by_shutdown, "the future is dropped by the shutdown");
}

#[test]
fn a_task_waiting_for_a_message_is_dropped_at_shutdown() {
    // The task owns a communicator and waits in a posted receive whose waker sits in the
    // rank's matching queues: task -> communicator -> rank state -> waker -> task, a cycle
    // only cancelling the task breaks. Its future (and what it owns) used to leak.
    let dropped_by_shutdown = within(10, "dropping a runtime with a task waiting for a message", || {
        let rt = rt(2);
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        let comm = rt.world().clone();
        let (polled_tx, polled) = mpsc::channel();
        let h = rt.spawn(async move {
            let _flag = flag;
            let r = comm.irecv(Vec::<u8>::with_capacity(4), 0u32, 5).unwrap();
            polled_tx.send(()).unwrap();
            r.await.map(|(b, _)| b.len())
        });
        polled.recv().unwrap();
        drop(rt);
        drop(h);
        dropped.load(Ordering::SeqCst)
    });
    assert!(dropped_by_shutdown, "the task's future (its communicator and receive) was not dropped");
}

#[test]
fn a_task_polled_by_a_helping_thread_during_shutdown_is_cancelled_by_it() {
    // No workers: a thread blocked in a receive runs the task (helping) when shutdown comes.
    // The shutdown cannot touch a future being polled; it marks the task, and the helping
    // thread cancels it when the poll returns `Pending`.
    let (res, dropped_during_poll, dropped_after) = within(10, "cancelling a task that a helping thread is polling", || {
        let rt = rt(0);
        let dropped = Arc::new(AtomicBool::new(false));
        let flag = DropFlag(dropped.clone());
        let (polling_tx, polling) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let h = rt.spawn(async move {
            let _flag = flag;
            polling_tx.send(()).unwrap();
            // Stay in this poll until the runtime has been dropped.
            go_rx.recv().unwrap();
            futures::future::pending::<()>().await
        });
        let (c, helper_comm) = (rt.world().clone(), rt.world().clone());
        let helper = std::thread::spawn(move || helper_comm.recv(Vec::<u8>::with_capacity(4), 0u32, 1).map(|(b, _)| b));
        polling.recv().unwrap();
        drop(rt);
        let dropped_during_poll = dropped.load(Ordering::SeqCst);
        go.send(()).unwrap();
        let res = futures::executor::block_on(h);
        let dropped_after = dropped.load(Ordering::SeqCst);
        // Release the helping thread.
        c.send(vec![1u8], 0, 1).unwrap();
        assert_eq!(helper.join().unwrap().unwrap(), [1]);
        (res, dropped_during_poll, dropped_after)
    });
    assert!(!dropped_during_poll, "a future was dropped while being polled");
    assert_eq!(res, Err(JoinError::Cancelled));
    assert!(dropped_after);
}

#[test]
fn no_starvation_by_a_self_waking_task() {
    // One worker; a task that wakes itself forever until another task sets a flag. The
    // other task must still get to run (local FIFO + injector every 61 ticks).
    let rt = rt(1);
    let flag = Arc::new(AtomicBool::new(false));
    let spins = Arc::new(AtomicUsize::new(0));
    let (f2, s2) = (flag.clone(), spins.clone());
    let hog = rt.spawn(async move {
        while !f2.load(Ordering::Acquire) {
            s2.fetch_add(1, Ordering::Relaxed);
            YieldNow(false).await;
        }
    });
    // Let the hog occupy the worker first.
    let t0 = Instant::now();
    while spins.load(Ordering::Relaxed) < 100 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::yield_now();
    }
    let f3 = flag.clone();
    let setter = rt.spawn(async move { f3.store(true, Ordering::Release) });
    let start = Instant::now();
    rt.block_on(async {
        setter.await.unwrap();
        hog.await.unwrap();
    });
    // Starvation would never end: the bound is a generous hang guard.
    assert!(start.elapsed() < Duration::from_secs(60), "starved for {:?}", start.elapsed());
}

#[test]
fn requests_inside_the_pool_every_mode() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let ranks = Runtime::builder().env(false).progress(mode).workers(2).cris(2).eager_threshold(1024).build_local(2).unwrap();
        let (c0, c1) = (ranks[0].world().clone(), ranks[1].world().clone());
        const N: usize = 200;
        let recv = ranks[1].spawn(async move {
            let mut total = 0usize;
            for i in 0..N {
                let (b, st) = c1.irecv(Vec::<u8>::with_capacity(4096), 0u32, Tag::Any).unwrap().await.unwrap();
                assert_eq!(st.tag as usize, i % 7);
                total += b.len();
            }
            total
        });
        let send = ranks[0].spawn(async move {
            for i in 0..N {
                // Some above the eager threshold (rendezvous).
                c0.isend(vec![7u8; (i * 37) % 3000], 1, (i % 7) as i32).unwrap().await.unwrap();
            }
        });
        let t0 = Instant::now();
        ranks[0].block_on(send).unwrap();
        let total = ranks[1].block_on(recv).unwrap();
        assert_eq!(total, (0..N).map(|i| (i * 37) % 3000).sum::<usize>(), "{mode}");
        assert!(t0.elapsed() < Duration::from_secs(120), "{mode}: hang guard: {:?}", t0.elapsed());
    }
}

#[test]
fn owner_mode_waiter_runs_pool_tasks() {
    // No pool threads: the only way the spawned send runs is the blocked receiver helping
    // ([Patinyasakdikul 2019, §4.6.2]), and it returns once its own receive is complete.
    let ranks = Runtime::builder().env(false).progress(ProgressMode::Owner).workers(0).cris(1).build_local(2).unwrap();
    let c0 = ranks[0].world().clone();
    std::thread::scope(|s| {
        s.spawn(|| {
            let c1 = ranks[1].world();
            let (b, _) = c1.recv(Vec::<u32>::with_capacity(4), 0u32, 1).unwrap();
            c1.send(vec![b[0] + 1], 0, 2).unwrap();
        });
        let sender = c0.clone();
        let h = ranks[0].spawn(async move {
            sender.isend(vec![41u32], 1, 1).unwrap().await.unwrap();
        });
        let (b, st) = c0.recv(Vec::<u32>::with_capacity(4), Source::Rank(1), Tag::Is(2)).unwrap();
        assert_eq!((b[0], st.source), (42, 1));
        assert!(h.is_finished());
    });
}

#[test]
fn sync_object_and_requests_in_tokio() {
    let ranks = Runtime::builder().env(false).progress(ProgressMode::Owner).workers(0).build_local(2).unwrap();
    let tokio_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    let (c0, c1) = (ranks[0].world().clone(), ranks[1].world().clone());
    let sync = ranks[1].sync_object::<usize>();
    const N: usize = 64;
    let got = tokio_rt.block_on(async move {
        let mut reqs = Vec::new();
        for i in 0..N {
            let mut r = c1.irecv(Vec::<u64>::with_capacity(1), 0u32, i as i32).unwrap();
            sync.attach(&mut r, i).unwrap();
            reqs.push(r);
        }
        let sender = tokio::spawn(async move {
            for i in (0..N).rev() {
                c0.isend(vec![i as u64], 1, i as i32).unwrap().await.unwrap();
            }
        });
        let mut seen = 0usize;
        while let Some(c) = sync.next().await {
            assert_eq!(c.outcome.unwrap().tag as usize, c.data);
            seen += 1;
        }
        sender.await.unwrap();
        for (i, r) in reqs.iter_mut().enumerate() {
            assert_eq!(r.take().unwrap().unwrap().0, vec![i as u64]);
        }
        seen
    });
    assert_eq!(got, N);
}

#[test]
fn block_on_inside_a_task_does_not_deadlock() {
    // One worker: the task blocks it in `block_on`, so it must run the inner task itself.
    let rt = rt(1);
    let rt2 = rt.clone();
    let h = rt.spawn(async move {
        let inner = rt2.spawn(async { 3 });
        rt2.block_on(inner).unwrap() + 1
    });
    assert_eq!(rt.block_on(h).unwrap(), 4);
}

#[test]
fn nested_block_on_without_workers() {
    // `workers(0)`: the thread in the outer `block_on` runs the task, whose own `block_on`
    // must run the inner task in turn (nested helping; it used to refuse to nest and wait
    // forever, since no other thread runs tasks).
    let got = within(10, "nested block_on with workers(0)", || {
        let rt = rt(0);
        let rt2 = rt.clone();
        let h = rt.spawn(async move {
            let inner = rt2.spawn(async { 41 });
            rt2.block_on(inner).unwrap() + 1
        });
        rt.block_on(h)
    });
    assert_eq!(got, Ok(42));
}

#[test]
fn nested_block_on_two_levels_on_one_worker() {
    // The only worker runs a task that blocks on a task that blocks on a third; the outer
    // wait is on a plain executor, which runs nothing.
    let got = within(10, "two nested block_on on one worker", || {
        let rt = rt(1);
        let rt2 = rt.clone();
        let h = rt.spawn(async move {
            let rt3 = rt2.clone();
            let b = rt2.spawn(async move {
                let c = rt3.spawn(async { 40 });
                rt3.block_on(c).unwrap() + 1
            });
            rt2.block_on(b).unwrap() + 1
        });
        futures::executor::block_on(h)
    });
    assert_eq!(got, Ok(42));
}

/// Spawns a chain of `levels` tasks, each blocking (`block_on`) on the next, and returns
/// the first one's output, `levels`.
fn blocking_chain(rt: &Runtime, levels: u32) -> weft::JoinHandle<u32> {
    let rt2 = rt.clone();
    rt.spawn(async move {
        if levels == 1 {
            1
        } else {
            rt2.block_on(blocking_chain(&rt2, levels - 1)).unwrap() + 1
        }
    })
}

#[test]
fn nested_block_on_as_deep_as_documented() {
    // `Runtime::spawn` documents 32 levels of waits nested inside tasks on one thread: a
    // chain of 33 tasks (the first one run by the worker, 32 nested waits) on one worker,
    // with the default thread stack.
    let got = within(20, "32 nested block_on on one worker", || {
        let rt = rt(1);
        futures::executor::block_on(blocking_chain(&rt, 33))
    });
    assert_eq!(got, Ok(33));
}

#[test]
fn a_blocking_receive_inside_a_helped_task_without_workers() {
    // `workers(0)`: the thread in `block_on` runs a task that makes a blocking receive whose
    // message another task sends; the receive's wait runs that task (nested helping). In
    // `Global` mode too: its waiters yielded without running tasks, and waited forever.
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let got = within(10, &format!("a blocking receive inside a helped task, {mode}"), move || {
            let rt = Runtime::builder().env(false).progress(mode).workers(0).cris(2).build().unwrap();
            let (c1, c2) = (rt.world().clone(), rt.world().clone());
            let rt2 = rt.clone();
            let h = rt.spawn(async move {
                drop(rt2.spawn(async move {
                    c2.send(vec![1u8, 2, 3], 0, 1).unwrap();
                }));
                c1.recv(Vec::<u8>::with_capacity(8), 0u32, 1).map(|(b, _)| b)
            });
            rt.block_on(h).map(|r| r.ok())
        });
        assert_eq!(got, Ok(Some(vec![1, 2, 3])), "{mode}");
    }
}

#[test]
fn stampede_chain_of_wakes_across_workers() {
    // 5,000 tasks, each waiting for the previous one's message: every hand-off is a wake
    // from one task (maybe on another worker) to the next.
    let rt = rt(3);
    let (first_tx, mut rx) = futures::channel::oneshot::channel::<u64>();
    let mut handles = Vec::new();
    for _ in 0..5_000 {
        let (tx, next_rx) = futures::channel::oneshot::channel::<u64>();
        let prev = std::mem::replace(&mut rx, next_rx);
        handles.push(rt.spawn(async move {
            let v = prev.await.expect("sender alive");
            tx.send(v + 1).expect("receiver alive");
        }));
    }
    first_tx.send(0).unwrap();
    let last = rt.block_on(rx).unwrap();
    assert_eq!(last, 5_000);
    for h in handles {
        assert!(rt.block_on(h).is_ok());
    }
}

#[test]
fn no_starvation_by_two_tasks_waking_each_other() {
    // One worker; two tasks hand a turn back and forth (each wake goes to the LIFO slot)
    // until a third task, queued behind them, sets a flag. The LIFO slot is bounded, so the
    // third task runs.
    use futures::task::AtomicWaker;
    struct Turn {
        turn: AtomicUsize,
        wakers: [AtomicWaker; 2],
        stop: AtomicBool,
    }
    let rt = rt(1);
    let t = Arc::new(Turn { turn: AtomicUsize::new(0), wakers: Default::default(), stop: AtomicBool::new(false) });
    let side = |me: usize, t: Arc<Turn>| async move {
        let mut rounds = 0u64;
        while !t.stop.load(Ordering::Acquire) {
            std::future::poll_fn(|cx| {
                if t.turn.load(Ordering::Acquire) % 2 == me || t.stop.load(Ordering::Acquire) {
                    return Poll::Ready(());
                }
                t.wakers[me].register(cx.waker());
                if t.turn.load(Ordering::Acquire) % 2 == me || t.stop.load(Ordering::Acquire) {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            t.turn.fetch_add(1, Ordering::AcqRel);
            t.wakers[1 - me].wake();
            rounds += 1;
        }
        t.wakers[1 - me].wake();
        rounds
    };
    let a = rt.spawn(side(0, t.clone()));
    let b = rt.spawn(side(1, t.clone()));
    let t0 = Instant::now();
    while t.turn.load(Ordering::Relaxed) < 1000 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::yield_now();
    }
    let t2 = t.clone();
    let stopper = rt.spawn(async move { t2.stop.store(true, Ordering::Release) });
    rt.block_on(async {
        stopper.await.unwrap();
        assert!(a.await.unwrap() + b.await.unwrap() >= 1000);
    });
    assert!(t0.elapsed() < Duration::from_secs(60), "hang guard: {:?}", t0.elapsed());
}

#[test]
fn all_to_all_tasks_every_mode() {
    // 3 ranks x 2 workers, 6 tasks per rank, each exchanging messages with every other
    // rank's same-numbered task: wakes cross ranks, workers and progress paths.
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let ranks = Runtime::builder().env(false).progress(mode).workers(2).cris(2).eager_threshold(512).build_local(3).unwrap();
        let t0 = Instant::now();
        let mut handles = Vec::new();
        for rt in &ranks {
            for task in 0..6i32 {
                let comm = rt.world().clone();
                handles.push((
                    rt.clone(),
                    rt.spawn(async move {
                        let me = comm.rank();
                        let mut got = 0u64;
                        for round in 0..30u32 {
                            let mut recvs = Vec::new();
                            for peer in (0..3).filter(|&p| p != me) {
                                recvs.push(comm.irecv(Vec::<u32>::with_capacity(256), peer, task).unwrap());
                            }
                            let mut sends = Vec::new();
                            for peer in (0..3).filter(|&p| p != me) {
                                // Every 5th round above the eager threshold (rendezvous).
                                let n = if round % 5 == 0 { 200 } else { 4 };
                                sends.push(comm.isend(vec![me * 1000 + round; n], peer, task).unwrap());
                            }
                            for r in recvs {
                                let (v, st) = r.await.unwrap();
                                assert_eq!(v[0], st.source * 1000 + round);
                                got += 1;
                            }
                            for s in sends {
                                s.await.unwrap();
                            }
                        }
                        got
                    }),
                ));
            }
        }
        for (rt, h) in handles {
            assert_eq!(rt.block_on(h).unwrap(), 60, "{mode}");
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{mode}: {:?}", t0.elapsed());
    }
}
