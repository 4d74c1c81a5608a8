//! Steady-state eager sends and receives allocate nothing (counting global allocator), nor
//! does a wait that parks for them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use weft::{ProgressMode, Runtime, Source, Tag};

#[path = "common/counting.rs"]
mod counting;

/// The binary's one test: the count is every thread's, and the test harness allocates on its
/// own threads when it starts a test, so a second test of the binary starting while this one
/// counts would be counted here (on a loaded machine, where the harness's start of the next
/// test can fall into the counted rounds). The cases run one after the other instead.
#[test]
fn steady_state_paths_allocate_nothing() {
    eager_steady_state_allocates_nothing();
    a_wait_parked_over_finished_sends_allocates_nothing();
    late_receives_allocate_nothing();
    requests_written_into_arrays_allocate_nothing();
}

/// Eager sends and receives, posted first and late, in every progress mode, once warm.
fn eager_steady_state_allocates_nothing() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let rts = Runtime::builder().env(false).progress(mode).cris(1).build_local(2).unwrap();
        let (c0, c1) = (rts[0].world(), rts[1].world());
        let mut sbuf = vec![3u8; 100]; // pooled-buffer path
        let mut tiny = vec![1u8; 8]; // inline path
        let mut rbuf = Vec::<u8>::with_capacity(100);
        let round = |sbuf: &mut Vec<u8>, tiny: &mut Vec<u8>, rbuf: &mut Vec<u8>| {
            let r = c1.irecv(std::mem::take(rbuf), 0u32, 1).unwrap();
            let s = c0.isend(std::mem::take(sbuf), 1, 1).unwrap();
            *sbuf = s.wait().unwrap().0;
            let (b, st) = r.wait().unwrap();
            assert_eq!(st.bytes, 100);
            *rbuf = b;
            let s = c0.isend(std::mem::take(tiny), 1, 2).unwrap(); // unexpected first
            let r = c1.irecv(std::mem::take(rbuf), 0u32, 2).unwrap();
            *tiny = s.wait().unwrap().0;
            *rbuf = r.wait().unwrap().0;
        };
        // Warm the pools and queues: 10,000 messages, past the first trim of the
        // communicator's processed-number windows (partitioned matching), which sizes the
        // windows of every tag partition once.
        let n = counting::allocations_after_warming(5000, 10_000, || round(&mut sbuf, &mut tiny, &mut rbuf));
        assert_eq!(n, 0, "{mode}: allocations in 20,000 steady-state eager messages");
    }
}

/// A `wait_all` that has to park (its last request's message comes only once the waiter has
/// parked) over sends that finished in `isend`, before the pending receive, allocates
/// nothing on the waiting thread: the sends hold no operation to attach, the receive is
/// attached to the thread's own sync object, and the wait's lists of requests it does not
/// take stay empty. The sender, another thread, answers each round once the receiving
/// rank's park counter has moved.
fn a_wait_parked_over_finished_sends_allocates_nothing() {
    for mode in [ProgressMode::Owner, ProgressMode::Concurrent] {
        let rts = Runtime::builder().env(false).progress(mode).cris(1).build_local(2).unwrap();
        let (c0, c1) = (rts[0].world(), rts[1].world());
        // The round the waiter is in (0: none yet, `u64::MAX`: the end), and the receiving
        // rank's parks when the sender saw it begin.
        let round = AtomicU64::new(0);
        let seen = AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut done = 0;
                let mut back = Vec::<u8>::with_capacity(16);
                loop {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    let r = loop {
                        match round.load(Ordering::Acquire) {
                            r if r != done => break r,
                            _ => assert!(Instant::now() < deadline, "{mode}: the waiter never began a round"),
                        }
                        std::thread::yield_now();
                    };
                    if r == u64::MAX {
                        return;
                    }
                    // The receiver's two sends of the round, then the message it waits for,
                    // once it has parked.
                    for _ in 0..2 {
                        back = c0.recv(std::mem::take(&mut back), 1u32, 8).unwrap().0;
                    }
                    let before = seen.load(Ordering::Acquire);
                    while rts[1].counters().parks == before {
                        assert!(Instant::now() < deadline, "{mode}: the waiter never parked");
                        std::thread::yield_now();
                    }
                    c0.send(vec![r as u8], 1, 7).unwrap();
                    done = r;
                }
            });
            let mut bufs = [vec![1u8; 8], vec![2u8; 8], Vec::<u8>::with_capacity(8)];
            let one = |n: u64, bufs: &mut [Vec<u8>; 3]| {
                seen.store(rts[1].counters().parks, Ordering::Release);
                let [a, b, rbuf] = bufs;
                let mut reqs = [
                    c1.isend(std::mem::take(a), 0, 8).unwrap(),
                    c1.isend(std::mem::take(b), 0, 8).unwrap(),
                    c1.irecv(std::mem::take(rbuf), 0u32, 7).unwrap(),
                ];
                round.store(n, Ordering::Release);
                weft::wait_all(&mut reqs).unwrap();
                for (buf, r) in bufs.iter_mut().zip(reqs.iter_mut()) {
                    *buf = r.take().expect("complete").unwrap().0;
                }
                assert_eq!(bufs[2], [n as u8]);
            };
            for n in 1..=10 {
                one(n, &mut bufs);
            }
            let parks = rts[1].counters().parks;
            let n = counting::allocations_on_this_thread(|| {
                for n in 11..=60 {
                    one(n, &mut bufs);
                }
            });
            round.store(u64::MAX, Ordering::Release);
            assert!(rts[1].counters().parks >= parks + 50, "{mode}: every counted wait parked");
            assert_eq!(n, 0, "{mode}: allocations in 50 waits parked over finished sends");
        });
    }
}

/// Receives posted after their frames arrived (every frame queued as unexpected, from two
/// sources under two tags, then taken by receives naming its source and tag, in an order
/// that takes some from behind the queue's front, or naming any source) allocate nothing
/// once warm.
fn late_receives_allocate_nothing() {
    const W: usize = 8;
    let rts = Runtime::builder().env(false).cris(1).build_local(3).unwrap();
    let (c0, c1, c2) = (rts[0].world(), rts[1].world(), rts[2].world());
    let mut sbufs: Vec<Vec<u8>> = (0..2 * W).map(|i| vec![i as u8; 8]).collect();
    let mut rbufs: Vec<Vec<u8>> = (0..2 * W).map(|_| Vec::with_capacity(8)).collect();
    let mut sends = Vec::with_capacity(2 * W);
    let mut recvs = Vec::with_capacity(2 * W);
    let round = || {
        for (i, buf) in sbufs.drain(..).enumerate() {
            let (c, tag) = (if i % 2 == 0 { &c0 } else { &c2 }, 1 + (i / 2 % 2) as i32);
            sends.push(c.isend(buf, 1, tag).unwrap());
        }
        let queued = rts[1].counters().unexpected;
        for _ in 0..=2 * W {
            if !rts[1].progress() {
                break;
            }
        }
        assert_eq!(rts[1].counters().unexpected, queued + 2 * W as u64, "every frame queued before its receive");
        // Source 2 first (behind source 0's frames), tag 2 before tag 1, the last ones from
        // any source.
        for (i, buf) in rbufs.drain(..).enumerate() {
            let source = match i {
                _ if i >= 2 * W - 2 => Source::Any,
                _ if i < W => Source::Rank(2),
                _ => Source::Rank(0),
            };
            recvs.push(c1.irecv(buf, source, Tag::Is(2 - (i % 2) as i32)).unwrap());
        }
        weft::wait_all(&mut sends).unwrap();
        weft::wait_all(&mut recvs).unwrap();
        for r in recvs.iter_mut() {
            let (buf, st) = r.take().expect("complete").unwrap();
            assert_eq!(st.bytes, 8);
            rbufs.push(buf);
        }
        for s in sends.iter_mut() {
            sbufs.push(s.take().expect("complete").unwrap().0);
        }
        recvs.clear();
        sends.clear();
    };
    // Warm past the first trim of the processed-number windows (partitioned matching: 8,192
    // numbers a source), which sizes them once.
    let n = counting::allocations_after_warming(1100, 200, round);
    assert_eq!(n, 0, "allocations in 3,200 messages received late");
}

/// Requests written into the caller's arrays (`isend_into`, `irecv_into`) allocate nothing
/// once the arrays have room: the arrays are reused, as a window of a message-rate loop.
fn requests_written_into_arrays_allocate_nothing() {
    let rts = Runtime::builder().env(false).progress(ProgressMode::Concurrent).cris(1).build_local(2).unwrap();
    let (c0, c1) = (rts[0].world(), rts[1].world());
    let mut sbufs: Vec<Vec<u8>> = (0..8).map(|_| vec![5u8; 8]).collect();
    let mut rbufs: Vec<Vec<u8>> = (0..8).map(|_| Vec::with_capacity(8)).collect();
    let mut sends = Vec::with_capacity(8);
    let mut recvs = Vec::with_capacity(8);
    let round = || {
        for b in rbufs.drain(..) {
            c1.irecv_into(&mut recvs, b, 0u32, 4).unwrap();
        }
        for b in sbufs.drain(..) {
            c0.isend_into(&mut sends, b, 1, 4).unwrap();
        }
        weft::wait_all(&mut recvs).unwrap();
        weft::wait_all(&mut sends).unwrap();
        rbufs.extend(recvs.iter_mut().map(|r| r.take().unwrap().unwrap().0));
        sbufs.extend(sends.iter_mut().map(|r| r.take().unwrap().unwrap().0));
        assert!(rbufs.iter().all(|b| b[..] == [5u8; 8]));
        recvs.clear();
        sends.clear();
    };
    let n = counting::allocations_after_warming(2000, 2000, round);
    assert_eq!(n, 0, "allocations in 16,000 messages with their requests written into arrays");
}
