//! An inline continuation's callback runs after the progress pass that completed its request
//! has released its locks: it may post sends and receives on the rank — on the very CRI the
//! pass polled — and attach the next continuation, without waiting for a lock its own
//! thread holds, in every progress mode. It runs after a chunk of the pass's batch of
//! frames, not after the whole batch.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use weft::{Communicator, ContinuationRequest, Invoke, ProgressMode, Runtime};

/// Messages each exchange bounces.
const ROUNDS: u64 = 50;

/// Posts a receive of `comm` (from rank 0, tag 1) whose inline callback answers the message
/// on tag 2 and posts the next receive with the next such callback, `left` more times.
fn echo(comm: &Communicator, cr: &Arc<ContinuationRequest>, seen: &Arc<AtomicUsize>, left: u64) {
    let mut r = comm.irecv(Vec::<u64>::with_capacity(1), 0u32, 1).expect("irecv");
    let (c, cr2, seen) = (comm.clone(), cr.clone(), seen.clone());
    cr.attach(&mut r, Invoke::Inline, move |res| {
        let (buf, _) = res.expect("received");
        seen.fetch_add(1, Ordering::Relaxed);
        // A send on the rank that completed the receive, from its progressing thread.
        c.send(buf, 0, 2).expect("send from a callback");
        if left > 1 {
            // A receive posted from the callback, with the next continuation.
            echo(&c, &cr2, &seen, left - 1);
        }
    })
    .expect("attach");
}

/// Rank 0 sends `ROUNDS` messages one at a time, each answered by rank 1's callback; rank 1's
/// one thread waits on the continuation request. One CRI per rank: the callback's send
/// goes out on the CRI whose frame completed the receive.
fn exchange(mode: ProgressMode) -> usize {
    let rts = Runtime::builder().env(false).progress(mode).cris(1).build_local(2).expect("runtime");
    let (a, b) = (rts[0].world(), rts[1].world());
    let cr = Arc::new(rts[1].continuation_request());
    let seen = Arc::new(AtomicUsize::new(0));
    echo(b, &cr, &seen, ROUNDS);
    std::thread::scope(|s| {
        let waiter = s.spawn(|| cr.wait());
        for i in 0..ROUNDS {
            a.send(vec![i], 1, 1).expect("send");
            let (got, _) = a.recv(Vec::<u64>::with_capacity(1), 1u32, 2).expect("answer");
            assert_eq!(got, vec![i]);
        }
        waiter.join().expect("waiter").expect("every callback ran");
    });
    seen.load(Ordering::Relaxed)
}

#[test]
fn inline_callbacks_send_and_receive_on_the_cri_that_completed_them() {
    for mode in [ProgressMode::Concurrent, ProgressMode::Owner, ProgressMode::Global] {
        // Bounded: a callback waiting for its own thread's lock would hang the exchange.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(exchange(mode));
        });
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(n) => assert_eq!(n, ROUNDS as usize, "{mode:?}: every callback ran once"),
            Err(_) => panic!("{mode:?}: an inline callback that posts on its rank did not finish (deadlock)"),
        }
    }
}

/// Frames rank 0 sends before rank 1 progresses: one full batch of a pass (64).
const BATCH: usize = 64;

/// The frames rank 1 had handled when the callback of the first of `BATCH` messages, all
/// waiting in its inbox, ran.
fn handled_before_first_callback(mode: ProgressMode) -> u64 {
    let rts = Runtime::builder().env(false).progress(mode).cris(1).workers(0).build_local(2).expect("runtime");
    let (a, b) = (rts[0].world(), rts[1].world());
    let cr = rts[1].continuation_request();
    let first = Arc::new(AtomicUsize::new(usize::MAX));
    for i in 0..BATCH {
        let mut r = b.irecv(Vec::<u64>::with_capacity(1), 0u32, 1).expect("irecv");
        let (rank, first) = (rts[1].clone(), first.clone());
        cr.attach(&mut r, Invoke::Inline, move |res| {
            assert_eq!(res.expect("received").0, vec![i as u64]);
            if i == 0 {
                first.store(rank.counters().messages_received as usize, Ordering::Relaxed);
            }
        })
        .expect("attach");
    }
    for i in 0..BATCH {
        a.send(vec![i as u64], 1, 1).expect("send");
    }
    cr.wait().expect("every callback ran");
    first.load(Ordering::Relaxed) as u64
}

#[test]
fn an_inline_callback_runs_before_the_rest_of_a_long_batch_is_handled() {
    for mode in [ProgressMode::Concurrent, ProgressMode::Owner, ProgressMode::Global] {
        let handled = handled_before_first_callback(mode);
        assert!(handled >= 1, "{mode:?}: the first callback ran before its frame was counted ({handled})");
        assert!(
            handled < BATCH as u64,
            "{mode:?}: the first message's callback waited for the whole batch of {BATCH} frames ({handled} handled)"
        );
    }
}

/// A pool callback that panics is reported by its continuation request and stops no worker;
/// one still queued when its rank shuts down is dropped unrun and counts as `Cancelled`.
#[test]
fn pool_callbacks_report_panics_and_are_cancelled_at_shutdown() {
    let rts = Runtime::builder().env(false).cris(1).workers(1).build_local(2).expect("runtime");
    let (a, b) = (rts[0].world(), rts[1].world());
    let cr = rts[1].continuation_request();
    let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).expect("irecv");
    cr.attach(&mut r, Invoke::Pool, |_| panic!("a pool callback's own bug")).expect("attach");
    a.send(vec![1u8], 1, 1).expect("send");
    assert_eq!(cr.wait().unwrap_err(), weft::Error::InvalidArgument("continuation callback panicked"));
    let ran = Arc::new(AtomicUsize::new(0));
    let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 2).expect("irecv");
    let counted = ran.clone();
    cr.attach(&mut r, Invoke::Pool, move |res| {
        assert_eq!(res.expect("received").0, vec![2]);
        counted.fetch_add(1, Ordering::Relaxed);
    })
    .expect("attach");
    a.send(vec![2u8], 1, 2).expect("send");
    cr.wait().expect("the pool goes on after a panic");
    assert_eq!(ran.load(Ordering::Relaxed), 1);

    // No worker, and nobody waits on the continuation request: the callback stays queued.
    let rts = Runtime::builder().env(false).cris(1).workers(0).build_local(2).expect("runtime");
    let cr = rts[1].continuation_request();
    {
        let (a, b) = (rts[0].world(), rts[1].world());
        let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).expect("irecv");
        let counted = ran.clone();
        cr.attach(&mut r, Invoke::Pool, move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
        })
        .expect("attach");
        a.send(vec![1u8], 1, 1).expect("send");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !rts[1].progress() {
            assert!(Instant::now() < deadline, "the message never arrived");
        }
    }
    assert_eq!(cr.pending(), 1, "completed, its callback queued on the pool");
    drop(rts);
    assert_eq!(cr.wait().unwrap_err(), weft::Error::Cancelled);
    assert_eq!(ran.load(Ordering::Relaxed), 1, "the queued callback never ran");
}
