//! A continuation in the steady state allocates nothing: its callback (with the receive's
//! buffer) goes into a spare record, given back when the callback runs; the count it adds
//! to its continuation request is a count of the request's sync object, with no operation
//! behind it (`SyncObject::count_one`); the receive's operation, which nothing holds once
//! its result went to the callback, goes back to the pool of the thread that completed it;
//! a wait for the callbacks allocates nothing (counting global allocator). Both where the
//! attaching thread completes its continuations and where another thread does (the records
//! then come back through the other thread's spares). A continuation of a set of requests
//! (`attach_all`, `attach_any`) allocates nothing either: the set's shared state, with room
//! for its callback and its results, is a reused spare too, given back when the results are
//! dropped. A pool continuation's callback runs as a task of the rank's pool that is reused
//! too, not spawned for it.

use std::sync::{Arc, Barrier, Mutex};

use weft::{ContinuationRequest, Invoke, Runtime};

#[path = "common/counting.rs"]
mod counting;

/// Where a round's callback puts the receive buffer back.
type Slot = Arc<Mutex<Option<Vec<u64>>>>;

/// Attaches an inline continuation to a receive of `b` that checks the message is `i` and
/// gives its buffer back to `back`, then sends `i` from `a`.
fn attach_and_send(a: &weft::Communicator, b: &weft::Communicator, cr: &ContinuationRequest, back: &Slot, sbuf: &mut Vec<u64>, i: u64) {
    let rbuf = back.lock().unwrap().take().expect("the callback gave the buffer back");
    let mut r = b.irecv(rbuf, 0u32, 1).unwrap();
    let slot = back.clone();
    cr.attach(&mut r, Invoke::Inline, move |res| {
        let (buf, _) = res.expect("received");
        assert_eq!(buf[0], i);
        *slot.lock().unwrap() = Some(buf);
    })
    .unwrap();
    sbuf[0] = i;
    *sbuf = a.send(std::mem::take(sbuf), 1, 1).unwrap().0;
}

/// The allocations of 1,000 rounds, after 2,000 that fill the spares and pools.
fn steady(mut round: impl FnMut(u64)) -> usize {
    (0..2000).for_each(&mut round);
    counting::allocations(|| (0..1000).for_each(round))
}

#[test]
fn a_continuation_allocates_nothing_in_the_steady_state() {
    let rts = Runtime::builder().env(false).cris(1).build_local(2).unwrap();
    let (a, b) = (rts[0].world(), rts[1].world());
    let cr = rts[1].continuation_request();
    let back: Slot = Arc::new(Mutex::new(Some(Vec::with_capacity(1))));
    let mut sbuf = vec![0u64; 1];

    // The attaching thread completes its continuations (its wait drives the progress).
    let round = |i: u64| {
        attach_and_send(a, b, &cr, &back, &mut sbuf, i);
        cr.wait().unwrap();
    };
    let n = steady(round);
    // A few where a queue of the runtime grows once.
    assert!(n <= 16, "{n} allocations in 1,000 continuations completed by their attaching thread");

    // Another thread completes them: this one attaches and sends, that one waits (and so
    // drives the progress that runs the callbacks), a round at a time.
    const WARM: u64 = 2000;
    const COUNTED: u64 = 1000;
    let (attached, completed) = (Barrier::new(2), Barrier::new(2));
    std::thread::scope(|s| {
        s.spawn(|| {
            for _ in 0..WARM + COUNTED {
                attached.wait();
                cr.wait().unwrap();
                completed.wait();
            }
        });
        let mut round = |i: u64| {
            attach_and_send(a, b, &cr, &back, &mut sbuf, i);
            attached.wait();
            completed.wait();
        };
        for i in 0..WARM {
            round(i);
        }
        let n = counting::allocations(|| {
            for i in 0..COUNTED {
                round(i);
            }
        });
        assert!(n <= 16, "{n} allocations in 1,000 continuations completed by another thread");
    });

    // Sets: every result of three receives, then the first of two.
    type Bufs = Arc<Mutex<[Option<Vec<u64>>; 3]>>;
    let bufs: Bufs = Arc::new(Mutex::new(std::array::from_fn(|_| Some(Vec::with_capacity(1)))));
    let round = |i: u64| {
        let mut all = {
            let mut kept = bufs.lock().unwrap();
            std::array::from_fn::<_, 3, _>(|t| {
                b.irecv(kept[t].take().expect("the callback gave the buffers back"), 0u32, 10 + t as i32).unwrap()
            })
        };
        let kept = bufs.clone();
        cr.attach_all(&mut all, Invoke::Inline, move |results| {
            assert_eq!(results.len(), 3);
            let mut kept = kept.lock().unwrap();
            for (t, r) in results.into_iter().enumerate() {
                let (buf, _) = r.expect("received");
                assert_eq!(buf[0], i + t as u64);
                kept[t] = Some(buf);
            }
        })
        .unwrap();
        for t in 0..3 {
            sbuf[0] = i + t;
            sbuf = a.send(std::mem::take(&mut sbuf), 1, 10 + t as i32).unwrap().0;
        }
        let rbuf = back.lock().unwrap().take().expect("the callback gave the buffer back");
        // The second receive of the `any` set takes an empty message into an empty buffer
        // (which holds no allocation), after the first ran the callback.
        let mut any = [b.irecv(rbuf, 0u32, 20).unwrap(), b.irecv(Vec::new(), 0u32, 21).unwrap()];
        let slot = back.clone();
        cr.attach_any(&mut any, Invoke::Inline, move |which, res| {
            assert_eq!(which, 0, "the first message is the first receive's");
            let (buf, _) = res.expect("received");
            assert_eq!(buf[0], i);
            *slot.lock().unwrap() = Some(buf);
        })
        .unwrap();
        sbuf[0] = i;
        sbuf = a.send(std::mem::take(&mut sbuf), 1, 20).unwrap().0;
        cr.wait().unwrap();
        a.send(Vec::<u64>::new(), 1, 21).unwrap();
    };
    let n = steady(round);
    assert!(n <= 16, "{n} allocations in 1,000 rounds of an `attach_all` and an `attach_any`");

    // Pool continuations, 100 at a time: each callback runs as a reused task of the pool's
    // worker, not a task spawned for it.
    let rts = Runtime::builder().env(false).cris(1).workers(1).build_local(2).unwrap();
    let (a, b) = (rts[0].world(), rts[1].world());
    let cr = rts[1].continuation_request();
    let bufs: Arc<Mutex<Vec<Vec<u64>>>> = Arc::new(Mutex::new((0..100).map(|_| Vec::with_capacity(1)).collect()));
    let on_pool = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut round = |i: u64| {
        for t in 0..100 {
            let rbuf = bufs.lock().unwrap().pop().expect("the callbacks gave the buffers back");
            let mut r = b.irecv(rbuf, 0u32, 1).unwrap();
            let (kept, on_pool) = (bufs.clone(), on_pool.clone());
            cr.attach(&mut r, Invoke::Pool, move |res| {
                let (buf, _) = res.expect("received");
                assert_eq!(buf[0], i * 100 + t);
                if std::thread::current().name().is_some_and(|n| n.starts_with("weft-worker")) {
                    on_pool.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                kept.lock().unwrap().push(buf);
            })
            .unwrap();
        }
        for t in 0..100 {
            sbuf[0] = i * 100 + t;
            sbuf = a.send(std::mem::take(&mut sbuf), 1, 1).unwrap().0;
        }
        cr.wait().unwrap();
    };
    (0..200).for_each(&mut round);
    let n = counting::allocations(|| (0..100).for_each(round));
    // Tasks queued from outside the pool go through its injector, a list of blocks of 63
    // (crossbeam-deque), and the spare tasks and records cross between the waiting thread
    // and the worker in batches (`spares.rs`), whose flow depends on which of the two ran
    // the callbacks: a few hundred allocations, where a task spawned per callback made one
    // per callback at least (10,000).
    assert!(n <= 10_000 / 10, "{n} allocations in 100 rounds of 100 pool continuations");
    assert!(on_pool.load(std::sync::atomic::Ordering::Relaxed) > 0, "no pool callback ran on the pool's worker");
}
