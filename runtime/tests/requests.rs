//! Requests for task runtimes: matched probe (`improbe`/`mprobe`, `Message`), cancel.

use std::sync::mpsc;

use weft::{Error, ProgressMode, Runtime, Source, Tag};

mod common;
use common::within;

const MODES: [ProgressMode; 3] = [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent];

fn local(n: u32, mode: ProgressMode) -> Vec<Runtime> {
    Runtime::builder().env(false).progress(mode).eager_threshold(512).build_local(n).unwrap()
}

/// Two ranks with two pool workers each.
fn with_pool(mode: ProgressMode) -> Vec<Runtime> {
    Runtime::builder().env(false).progress(mode).workers(2).eager_threshold(512).build_local(2).unwrap()
}

/// Waits until `n` messages have been queued as unexpected at `rt` (making progress).
fn wait_queued(rt: &Runtime, n: u64) {
    let c = rt.world();
    let t0 = std::time::Instant::now();
    while rt.counters().unexpected < n {
        let _ = c.iprobe(Source::Any, Tag::Any).unwrap();
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "messages not queued");
    }
}

/// Two threads of one rank probe the same source and tag, in this interleaving: A probes
/// (and sees message 1, one byte), B probes and receives (message 1), A receives. With
/// `iprobe` + `recv`, A receives message 2 (two bytes), not the message it probed; with
/// `mprobe` + `mrecv`, B's probe no longer sees message 1 and A receives exactly it.
#[test]
fn iprobe_then_recv_races_and_mprobe_does_not() {
    within(60, "two threads probing one source", || {
        for mode in MODES {
            let rts = local(2, mode);
            let (a, b) = (rts[0].world(), rts[1].world());
            let b = &b;
            // iprobe + recv.
            a.send(vec![1u8], 1, 5).unwrap();
            a.send(vec![2u8, 2], 1, 5).unwrap();
            let (to_b, at_b) = mpsc::channel::<()>();
            let (to_a, at_a) = mpsc::channel::<()>();
            let (probed, got) = std::thread::scope(|s| {
                let thread_a = s.spawn(move || {
                    let st = loop {
                        if let Some(st) = b.iprobe(0u32, 5).unwrap() {
                            break st;
                        }
                    };
                    to_b.send(()).unwrap();
                    at_a.recv().unwrap();
                    let (got, _) = b.recv(Vec::<u8>::with_capacity(64), 0u32, 5).unwrap();
                    (st.bytes, got)
                });
                at_b.recv().unwrap();
                let st = b.iprobe(0u32, 5).unwrap().expect("message 1 is still queued");
                let (got_b, _) = b.recv(Vec::<u8>::with_capacity(64), 0u32, 5).unwrap();
                assert_eq!((st.bytes, got_b), (1, vec![1]), "{mode}");
                to_a.send(()).unwrap();
                thread_a.join().unwrap()
            });
            assert_eq!(probed, 1, "{mode}");
            assert_eq!(got, vec![2, 2], "{mode}: A received the message after the one it probed");

            // mprobe + mrecv, same interleaving.
            a.send(vec![1u8], 1, 5).unwrap();
            a.send(vec![2u8, 2], 1, 5).unwrap();
            let (to_b, at_b) = mpsc::channel::<()>();
            let (to_a, at_a) = mpsc::channel::<()>();
            let got_a = std::thread::scope(|s| {
                let thread_a = s.spawn(move || {
                    let msg = b.mprobe(0u32, 5).unwrap();
                    to_b.send(()).unwrap();
                    at_a.recv().unwrap();
                    let n = msg.status().bytes;
                    msg.mrecv(Vec::<u8>::with_capacity(n)).unwrap()
                });
                at_b.recv().unwrap();
                let msg = b.mprobe(0u32, 5).unwrap();
                assert_eq!(msg.status().bytes, 2, "{mode}: B's probe saw the message A holds");
                let (got_b, st) = msg.mrecv(Vec::<u8>::with_capacity(2)).unwrap();
                assert_eq!((got_b, st.source, st.tag), (vec![2, 2], 0, 5), "{mode}");
                to_a.send(()).unwrap();
                thread_a.join().unwrap()
            });
            assert_eq!(got_a.0, vec![1], "{mode}: A received exactly the message it probed");
            assert_eq!(got_a.1.bytes, 1, "{mode}");
        }
    });
}

/// Two threads probing one source with `mprobe` and receiving into a buffer sized exactly
/// by the probe, free running, eager and rendezvous messages mixed: every receive gets the
/// message its thread probed (never truncated, never another length), and every message is
/// received once.
#[test]
fn mprobe_gives_each_thread_the_message_it_probed() {
    const ROUNDS: u32 = 150;
    within(120, "two threads mprobing one source", || {
        for mode in MODES {
            let rts = local(2, mode);
            let (a, b) = (rts[0].world(), rts[1].world());
            // Message i: `len(i)` words, each `i`; every fourth one above the eager threshold.
            let len = |i: u32| if i % 4 == 3 { 300 + i as usize % 7 } else { 1 + i as usize % 5 };
            let got = std::thread::scope(|s| {
                s.spawn(|| {
                    for i in 0..2 * ROUNDS {
                        a.send(vec![i; len(i)], 1, 5).unwrap();
                    }
                });
                let receivers: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(|| {
                            (0..ROUNDS)
                                .map(|_| {
                                    let msg = b.mprobe(0u32, Tag::Any).unwrap();
                                    let words = msg.status().bytes / 4;
                                    let (v, st) = msg.mrecv(Vec::<u32>::with_capacity(words)).expect("the probed message fits");
                                    assert_eq!((v.len(), st.bytes), (words, words * 4));
                                    v
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                receivers.into_iter().flat_map(|r| r.join().unwrap()).collect::<Vec<_>>()
            });
            let mut ids: Vec<u32> = got
                .iter()
                .map(|v| {
                    assert!(v.iter().all(|&w| w == v[0]), "{mode}: a message mixed with another");
                    assert_eq!(v.len(), len(v[0]), "{mode}");
                    v[0]
                })
                .collect();
            ids.sort_unstable();
            assert_eq!(ids, (0..2 * ROUNDS).collect::<Vec<_>>(), "{mode}: every message once");
        }
    });
}

/// `improbe` takes the message a receive posted now would match (wildcards included, in
/// send order); a message it took is seen by no probe and no receive; dropping a `Message`
/// discards it (a rendezvous sender's send completes); bad arguments are errors.
#[test]
fn improbe_takes_the_message_out_of_matching() {
    within(60, "improbe semantics", || {
        let rts = local(2, ProgressMode::Owner);
        let (a, b) = (rts[0].world(), rts[1].world());
        assert!(b.improbe(Source::Any, Tag::Any).unwrap().is_none());
        a.send(vec![10u8], 1, 1).unwrap();
        a.send(vec![20u8, 20], 1, 2).unwrap();
        a.send(vec![30u8, 30, 30], 1, 1).unwrap();
        wait_queued(&rts[1], 3);
        // By tag: the first of tag 2, past an earlier message of tag 1.
        let m2 = b.improbe(0u32, 2).unwrap().expect("tag 2 queued");
        assert_eq!((m2.status().source, m2.status().tag, m2.status().bytes), (0, 2, 2));
        assert!(b.iprobe(Source::Any, 2).unwrap().is_none(), "a probed message stays visible");
        // Wildcards: the earliest sent.
        let m1 = b.improbe(Source::Any, Tag::Any).unwrap().expect("queued");
        assert_eq!(m1.status().bytes, 1);
        // A receive posted now does not take the messages held.
        let mut r = b.irecv(Vec::<u8>::with_capacity(8), Source::Any, Tag::Any).unwrap();
        assert!(r.test(), "the receive matched the third message");
        assert_eq!(r.wait().unwrap().0, vec![30, 30, 30]);
        // Truncation is reported by the receive of the message, which consumes it.
        assert_eq!(m1.mrecv(Vec::<u8>::with_capacity(0)).unwrap_err(), Error::Truncated { message_len: 1, buffer_len: 0 });
        let (v, st) = m2.imrecv(Vec::<u8>::with_capacity(2)).wait().unwrap();
        assert_eq!((v, st.tag), (vec![20, 20], 2));
        // A dropped message is discarded; the rendezvous send it announced completes.
        let big = vec![7u8; 4096];
        let mut send = a.isend(big, 1, 3).unwrap();
        let msg = b.mprobe(0u32, 3).unwrap();
        assert_eq!(msg.status().bytes, 4096);
        drop(msg);
        let t0 = std::time::Instant::now();
        while !send.test() {
            let _ = b.iprobe(Source::Any, Tag::Any);
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the send of a dropped message never completed");
        }
        // Its status says nothing was read.
        assert_eq!(send.wait().unwrap().1.bytes, 0);
        assert!(b.iprobe(Source::Any, Tag::Any).unwrap().is_none());
        // Bad arguments, as a receive's.
        assert!(matches!(b.improbe(0u32, -1), Err(Error::InvalidTag { .. })));
        assert_eq!(b.improbe(2u32, 1).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
        assert_eq!(b.mprobe(2u32, 1).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
        let freed = b.clone();
        freed.free();
        assert_eq!(b.improbe(Source::Any, Tag::Any).unwrap_err(), Error::CommFreed);
    });
}

/// With only a gone peer able to send it, a matched probe says so instead of polling for
/// ever: what the peer sent before it finished is still probed and received first.
#[test]
fn mprobe_of_a_gone_peer_fails() {
    within(60, "mprobe of a finished peer", || {
        let mut rts = local(2, ProgressMode::Owner);
        rts[0].world().send(vec![1u8], 1, 4).unwrap();
        drop(rts.remove(0));
        let b = rts[0].world();
        let msg = b.mprobe(0u32, 4).unwrap();
        assert_eq!(msg.mrecv(Vec::<u8>::with_capacity(1)).unwrap().0, vec![1]);
        assert_eq!(b.mprobe(0u32, 4).unwrap_err(), Error::PeerLost { rank: 0 });
        assert_eq!(b.improbe(Source::Any, Tag::Any).unwrap_err(), Error::PeerLost { rank: 0 });
    });
}

/// A pending receive is cancelled: it completes with a cancelled status and its buffer
/// untouched, and the message it would have matched goes to the next receive. A receive
/// that has matched, a send, and a request already cancelled are not cancelled.
#[test]
fn cancel_unposts_a_receive_and_consumes_nothing() {
    within(60, "cancel", || {
        for mode in MODES {
            let rts = local(2, mode);
            let (a, b) = (rts[0].world(), rts[1].world());
            // Specific, wildcard, and in a tag partition other than the first.
            for (source, tag) in [(Source::Rank(0), Tag::Is(3)), (Source::Any, Tag::Any), (Source::Rank(0), Tag::Is(1000))] {
                let mut buf = Vec::<u16>::with_capacity(8);
                buf.extend([9, 9]);
                let mut r = b.irecv(buf, source, tag).unwrap();
                assert!(r.cancel(), "{mode}: a pending receive is cancelled");
                assert!(r.is_complete());
                assert!(!r.cancel(), "{mode}: cancelled twice");
                let (buf, st) = r.wait().unwrap();
                assert!(st.cancelled(), "{mode}");
                assert_eq!(buf, vec![9, 9], "{mode}: a cancelled receive wrote nothing");
                let t = match tag {
                    Tag::Is(t) => t,
                    Tag::Any => 3,
                };
                a.send(vec![t as u16], 1, t).unwrap();
                let (got, st) = b.recv(Vec::<u16>::with_capacity(1), source, tag).unwrap();
                assert_eq!((got, st.cancelled()), (vec![t as u16], false), "{mode}");
            }
            // Matched before the cancel: it completes with its message.
            a.send(vec![4u8], 1, 4).unwrap();
            wait_queued(&rts[1], rts[1].counters().unexpected + 1);
            let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 4).unwrap();
            assert!(!r.cancel(), "{mode}: a matched receive is not cancelled");
            assert_eq!(r.wait().unwrap().0, vec![4], "{mode}");
            // A send is not cancelled; it is delivered.
            let mut s = a.isend(vec![5u8; 2000], 1, 6).unwrap();
            assert!(!s.cancel(), "{mode}: a send is not cancelled");
            let r = b.irecv(Vec::<u8>::with_capacity(2000), 0u32, 6).unwrap();
            // The receive first: one thread drives the rank of the request it waits for.
            assert_eq!(r.wait().unwrap().0, vec![5u8; 2000], "{mode}");
            let (sent, st) = s.wait().unwrap();
            assert!(!st.cancelled() && sent.len() == 2000, "{mode}");
        }
    });
}

/// A receive attached to a sync object and cancelled delivers its cancelled status there.
#[test]
fn a_cancelled_receive_reports_to_its_sync_object() {
    let rt = Runtime::builder().env(false).build().unwrap();
    let c = rt.world();
    let sync = weft::SyncObject::new();
    let mut r = c.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
    sync.attach(&mut r, 17u32).unwrap();
    assert!(r.cancel());
    let done = sync.query().expect("the cancel completed the receive");
    assert_eq!(done.data, 17);
    assert!(done.status().unwrap().cancelled());
}

/// Receives cancelled while the messages they could match arrive: each message is received
/// once, in send order, by a receive that was not cancelled — a cancelled receive never
/// consumed one — and a cancel either unposts (nothing received) or finds the receive
/// matched (its message received). The messages come in bursts, each sent once the
/// receiver has drained the one before and cancelled a receive since, so both outcomes
/// occur whatever the two threads' speeds.
#[test]
fn cancel_racing_arrivals_loses_no_message() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const BURSTS: usize = 8;
    const BURST: usize = 50;
    within(120, "cancel racing arrivals", || {
        for mode in MODES {
            let rts = local(2, mode);
            let (a, b) = (rts[0].world(), rts[1].world());
            let (received, cancelled) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let got = std::thread::scope(|s| {
                s.spawn(|| {
                    for burst in 0..BURSTS {
                        for i in burst * BURST..(burst + 1) * BURST {
                            a.send(vec![i as u32], 1, 2).unwrap();
                        }
                        // Before the next burst (the receiver stops after the last one).
                        let drained = |n| received.load(Ordering::Acquire) == n && cancelled.load(Ordering::Acquire) > burst;
                        while burst + 1 < BURSTS && !drained((burst + 1) * BURST) {
                            std::thread::yield_now();
                        }
                    }
                });
                let mut got = Vec::new();
                let mut spins = 0u32;
                while got.len() < BURSTS * BURST {
                    let mut r = b.irecv(Vec::<u32>::with_capacity(1), 0u32, 2).unwrap();
                    // A varying delay, so some cancels come first and some after the match.
                    for _ in 0..spins % 4 {
                        r.test();
                    }
                    spins += 1;
                    let was = r.cancel();
                    let (v, st) = r.wait().unwrap();
                    assert_eq!(was, st.cancelled(), "{mode}");
                    if was {
                        assert!(v.is_empty(), "{mode}");
                        cancelled.fetch_add(1, Ordering::Release);
                    } else {
                        got.extend(v);
                        received.store(got.len(), Ordering::Release);
                    }
                }
                got
            });
            assert_eq!(got, (0..(BURSTS * BURST) as u32).collect::<Vec<_>>(), "{mode}: every message once, in order");
            assert!(cancelled.load(Ordering::Relaxed) >= BURSTS - 1, "{mode}: a receive cancelled between bursts");
        }
    });
}

/// Persistent sends and receives started many times, eager and rendezvous, one by one and
/// all at once: each start moves the buffer's current contents, each wait gives the buffer
/// back; misuse is an error, not a panic.
#[test]
fn persistent_requests_restart_with_their_buffers() {
    use weft::Persistent;
    within(120, "persistent requests", || {
        for mode in MODES {
            let rts = local(2, mode);
            let (a, b) = (rts[0].world(), rts[1].world());
            // Eager (tag 1) and rendezvous (tag 2, 1000 bytes) at once.
            let mut sends = vec![a.send_init(vec![0u32; 4], 1, 1).unwrap(), a.send_init(vec![0u32; 250], 1, 2).unwrap()];
            let mut recvs = vec![
                b.recv_init(Vec::<u32>::with_capacity(4), 0u32, 1).unwrap(),
                b.recv_init(Vec::with_capacity(250), 0u32, Tag::Any).unwrap(),
            ];
            assert!(recvs[0].wait().is_err() && recvs[0].outcome().is_none(), "{mode}: a wait before the first start");
            for i in 0..20u32 {
                for s in sends.iter_mut() {
                    s.buffer_mut().unwrap().fill(i);
                }
                Persistent::start_all(&mut recvs).unwrap();
                assert_eq!(recvs[1].start(), Err(Error::InvalidArgument("persistent request started while active")));
                assert!(recvs[0].buffer().is_none() && recvs[0].is_active());
                Persistent::start_all(&mut sends).unwrap();
                // Both ranks' requests in one wait: it drives both ranks.
                std::thread::scope(|s| {
                    s.spawn(|| Persistent::wait_all(&mut sends).unwrap());
                    Persistent::wait_all(&mut recvs).unwrap();
                });
                assert_eq!(recvs[0].buffer().unwrap(), &vec![i; 4], "{mode}");
                assert_eq!(recvs[1].buffer().unwrap(), &vec![i; 250], "{mode}");
                assert_eq!(recvs[1].outcome().unwrap().unwrap().tag, 2, "{mode}");
                assert_eq!(sends[1].outcome().unwrap().unwrap().bytes, 1000, "{mode}");
                assert!(!sends[0].is_active() && sends[0].buffer().unwrap().len() == 4);
            }
            // A cancelled start leaves the buffer as it was; the next start gets the message.
            let mut r = recvs.remove(0);
            r.start().unwrap();
            assert!(r.cancel());
            assert!(r.wait().unwrap().cancelled(), "{mode}");
            assert_eq!(r.buffer().unwrap(), &vec![19; 4]);
            r.start().unwrap();
            sends[0].buffer_mut().unwrap().fill(77);
            sends[0].start().unwrap();
            let st = loop {
                if let Some(o) = r.test() {
                    break o.unwrap();
                }
            };
            assert_eq!((st.bytes, r.buffer().unwrap().clone()), (16, vec![77; 4]), "{mode}");
            sends[0].wait().unwrap();
            // Dropping an active receive is safe (it is cancelled), as is dropping an active send.
            r.start().unwrap();
            drop(r);
            let mut s = sends.remove(0);
            s.start().unwrap();
            drop(s);
            assert_eq!(b.recv(Vec::<u32>::with_capacity(4), 0u32, 1).unwrap().0, vec![77; 4], "{mode}");
        }
    });
}

/// Bad arguments are refused once, at `*_init`; a freed communicator fails every start,
/// each one leaving the request inactive with its buffer.
#[test]
fn persistent_requests_check_their_arguments() {
    let rts = local(2, ProgressMode::Owner);
    let c = rts[0].world();
    assert_eq!(c.send_init(vec![1u8], 2, 0).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
    assert!(matches!(c.send_init(vec![1u8], 1, -3), Err(Error::InvalidTag { .. })));
    assert!(matches!(c.recv_init(Vec::<u8>::new(), 5u32, 0), Err(Error::RankOutOfRange { .. })));
    let mut s = c.send_init(vec![1u8], 1, 0).unwrap();
    let mut r = c.recv_init(Vec::<u8>::with_capacity(1), Source::Any, 0).unwrap();
    c.clone().free();
    assert_eq!(s.start(), Err(Error::CommFreed));
    assert_eq!(r.start(), Err(Error::CommFreed));
    assert_eq!(r.start(), Err(Error::CommFreed));
    assert!(!r.is_active() && r.buffer().is_some_and(|b| b.capacity() == 1));
    assert_eq!(s.into_buffer(), Some(vec![1u8]));
    assert!(c.recv_init(Vec::<u8>::new(), Source::Any, 0).is_err());
}

/// A continuation runs once with its request's buffer and status: inline on the thread
/// whose progress completed it (or at once, for a request complete already), or in a pool
/// task, which may wait; the continuation request completes when every callback has run,
/// and is reusable.
#[test]
fn continuations_run_once_inline_or_on_the_pool() {
    use std::sync::{Arc, Mutex};
    use weft::Invoke;
    within(60, "continuations", || {
        for mode in MODES {
            let rts = with_pool(mode);
            let (a, b) = (rts[0].world(), rts[1].world());
            let cr = rts[1].continuation_request();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let record = |what: &'static str| {
                let seen = seen.clone();
                move |res: Result<(Vec<u8>, weft::Status), Error>| {
                    let (buf, st) = res.unwrap();
                    seen.lock().unwrap().push((what, buf, st.source, st.tag, std::thread::current().id()));
                }
            };
            let me = std::thread::current().id();
            // Inline first, before the pool has started: only this thread drives rank 1.
            let mut inline = b.irecv(Vec::<u8>::with_capacity(1000), 0u32, 1).unwrap();
            cr.attach(&mut inline, Invoke::Inline, record("inline")).unwrap();
            assert_eq!(inline.take(), None, "{mode}: the request's result went to its continuation");
            assert_eq!(cr.pending(), 1);
            assert!(!cr.test());
            let rendezvous = a.isend(vec![1u8; 700], 1, 1).unwrap(); // finished by rank 1's progress
            cr.wait().unwrap();
            rendezvous.wait().unwrap();
            let mut pooled = b.irecv(Vec::<u8>::with_capacity(1000), Source::Any, Tag::Any).unwrap();
            let (b2, seen2) = (b.clone(), seen.clone());
            cr.attach(&mut pooled, Invoke::Pool, move |res| {
                // A pool callback may wait (an inline one must not): here for a second message.
                let (more, _) = b2.recv(Vec::<u8>::with_capacity(1), 0u32, 8).unwrap();
                let (buf, st) = res.unwrap();
                seen2.lock().unwrap().push(("pool", [buf, more].concat(), st.source, st.tag, std::thread::current().id()));
            })
            .unwrap();
            a.send(vec![2u8; 3], 1, 9).unwrap();
            a.send(vec![8u8], 1, 8).unwrap();
            cr.wait().unwrap();
            assert_eq!(cr.pending(), 0);
            let seen_now = seen.lock().unwrap().clone();
            assert_eq!(seen_now.len(), 2, "{mode}: each callback once");
            let (what, buf, source, tag, thread) = &seen_now[0];
            assert_eq!((*what, buf.clone(), *source, *tag, *thread), ("inline", vec![1u8; 700], 0, 1, me), "{mode}");
            let (what, buf, _, tag, _) = &seen_now[1];
            assert_eq!((*what, buf.clone(), *tag), ("pool", vec![2, 2, 2, 8], 9), "{mode}");
            // Reusable; a request complete already (an eager send) runs an inline callback
            // at once, on the attaching thread.
            let mut s = a.isend(vec![3u8; 4], 1, 2).unwrap();
            let cr0 = rts[0].continuation_request();
            let done = Arc::new(Mutex::new(None));
            let d = done.clone();
            cr0.attach(&mut s, Invoke::Inline, move |r| *d.lock().unwrap() = Some((r.unwrap().1.bytes, std::thread::current().id())))
                .unwrap();
            assert_eq!(*done.lock().unwrap(), Some((4, me)), "{mode}");
            assert!(cr0.test());
            let mut r = b.irecv(Vec::<u8>::with_capacity(4), 0u32, 2).unwrap();
            cr.attach(&mut r, Invoke::Inline, record("again")).unwrap();
            cr.wait().unwrap();
            assert_eq!(seen.lock().unwrap().last().map(|s| (s.0, s.1.clone())), Some(("again", vec![3u8; 4])), "{mode}");
        }
    });
}

/// `attach_all` runs once with every result in order; `attach_any` once, at the first
/// completion, with its index; a pool callback may communicate (here it answers).
#[test]
fn continuations_of_sets() {
    use std::sync::{Arc, Mutex};
    use weft::Invoke;
    within(60, "continuations of sets", || {
        for mode in MODES {
            let rts = with_pool(mode);
            let (a, b) = (rts[0].world(), rts[1].world());
            let cr = rts[1].continuation_request();
            let all = Arc::new(Mutex::new(None));
            let any = Arc::new(Mutex::new(None));
            let mut recvs: Vec<_> = (0..6).map(|t| b.irecv(Vec::<u32>::with_capacity(200), 0u32, t).unwrap()).collect();
            let al = all.clone();
            cr.attach_all(&mut recvs, Invoke::Pool, move |results| {
                *al.lock().unwrap() = Some(results.into_iter().map(|r| r.unwrap().0).collect::<Vec<_>>());
            })
            .unwrap();
            let mut either: Vec<_> = (10..13).map(|t| b.irecv(Vec::<u32>::with_capacity(1), 0u32, t).unwrap()).collect();
            let an = any.clone();
            cr.attach_any(&mut either, Invoke::Inline, move |i, r| *an.lock().unwrap() = Some((i, r.unwrap().0))).unwrap();
            assert_eq!(cr.pending(), 2);
            // Backwards, half of them rendezvous: the callback still sees the set's order.
            let sends: Vec<_> = (0..6u32).rev().map(|t| a.isend(vec![t; if t % 2 == 0 { 150 } else { 1 }], 1, t as i32).unwrap()).collect();
            a.send(vec![11u32], 1, 11).unwrap();
            cr.wait().unwrap();
            for s in sends {
                s.wait().unwrap();
            }
            let got = all.lock().unwrap().take().expect("the set's callback ran");
            for (t, v) in got.iter().enumerate() {
                assert_eq!(v, &vec![t as u32; if t % 2 == 0 { 150 } else { 1 }], "{mode}");
            }
            assert_eq!(*any.lock().unwrap(), Some((1, vec![11])), "{mode}");
            // The others of the `any` set still complete; their results are dropped.
            a.send(vec![10u32], 1, 10).unwrap();
            a.send(vec![12u32], 1, 12).unwrap();
            // A pool continuation that answers: rank 0 waits for the answer.
            let mut ask = b.irecv(Vec::<u32>::with_capacity(1), 0u32, 20).unwrap();
            let answerer = b.clone();
            cr.attach(&mut ask, Invoke::Pool, move |r| {
                let x = r.unwrap().0[0];
                answerer.send(vec![x + 1], 0, 21).unwrap();
            })
            .unwrap();
            a.send(vec![41u32], 1, 20).unwrap();
            let (answer, _) = std::thread::scope(|s| {
                s.spawn(|| cr.wait().unwrap());
                a.recv(Vec::<u32>::with_capacity(1), 1u32, 21).unwrap()
            });
            assert_eq!(answer, vec![42], "{mode}");
            // An empty set: `all` runs at once, `any` is an error.
            let ran = Arc::new(Mutex::new(false));
            let rn = ran.clone();
            cr.attach_all(&mut Vec::<weft::Request<'_, Vec<u8>>>::new(), Invoke::Inline, move |v| *rn.lock().unwrap() = v.is_empty())
                .unwrap();
            assert!(*ran.lock().unwrap());
            assert!(cr.attach_any(&mut Vec::<weft::Request<'_, Vec<u8>>>::new(), Invoke::Inline, |_, _| {}).is_err());
            assert!(cr.test());
        }
    });
}

/// A request is attached to a sync object or has a continuation, not both: either order is
/// an error, and a refused continuation leaves the request (and every request of a refused
/// set) untouched. A request of another rank, or taken, is refused too. A panicking
/// callback is reported by the continuation request and stops nothing.
#[test]
fn continuations_refuse_sync_objects_and_report_panics() {
    use weft::Invoke;
    let rts = local(2, ProgressMode::Owner);
    let (a, b) = (rts[0].world(), rts[1].world());
    let cr = rts[1].continuation_request();
    let sync = rts[1].sync_object();
    let mut attached = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
    sync.attach(&mut attached, 1u32).unwrap();
    let err = cr.attach(&mut attached, Invoke::Inline, |_| panic!("refused callbacks never run")).unwrap_err();
    assert_eq!(err, Error::InvalidArgument("request attached to a sync object: it cannot also have a continuation"));
    let mut free = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 2).unwrap();
    let mut set = vec![free, attached];
    assert!(cr.attach_all(&mut set, Invoke::Inline, |_| panic!("refused")).is_err());
    assert!(cr.attach_any(&mut set, Invoke::Inline, |_, _| panic!("refused")).is_err());
    assert_eq!(cr.pending(), 0, "nothing registered");
    attached = set.pop().unwrap();
    free = set.pop().unwrap();
    a.send(vec![1u8], 1, 1).unwrap();
    a.send(vec![2u8], 1, 2).unwrap();
    assert_eq!(free.wait().unwrap().0, vec![2], "the refused set's requests still work");
    assert_eq!(sync.wait_any().map(|c| c.data), Some(1));
    assert_eq!(attached.wait().unwrap().0, vec![1]);
    // A continuation first: the sync object gets an error, not the completion.
    let mut cont = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 3).unwrap();
    cr.attach(&mut cont, Invoke::Inline, |r| assert_eq!(r.unwrap().0, vec![3])).unwrap();
    sync.attach(&mut cont, 2u32).unwrap();
    let c = sync.wait_any().unwrap();
    assert!(c.data == 2 && c.outcome.is_err());
    a.send(vec![3u8], 1, 3).unwrap();
    cr.wait().unwrap();
    // Taken, or of another rank.
    assert!(cr.attach(&mut cont, Invoke::Inline, |_| {}).is_err());
    let mut other = a.irecv(Vec::<u8>::with_capacity(1), 1u32, 4).unwrap();
    assert_eq!(
        cr.attach(&mut other, Invoke::Inline, |_| {}).unwrap_err(),
        Error::InvalidArgument("request of another rank than its continuation request")
    );
    // A panic in an inline callback: reported once, progress goes on.
    let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 5).unwrap();
    cr.attach(&mut r, Invoke::Inline, |_| panic!("a callback's own bug")).unwrap();
    a.send(vec![5u8], 1, 5).unwrap();
    assert_eq!(cr.wait().unwrap_err(), Error::InvalidArgument("continuation callback panicked"));
    a.send(vec![6u8], 1, 6).unwrap();
    assert_eq!(b.recv(Vec::<u8>::with_capacity(1), 0u32, 6).unwrap().0, vec![6]);
    assert!(cr.wait().is_ok());
}

/// Without pool workers, the thread that waits for the continuations runs the pool
/// callbacks itself.
#[test]
fn pool_continuations_run_in_the_wait_without_workers() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    within(60, "pool continuations without workers", || {
        for mode in MODES {
            let rts = Runtime::builder().env(false).progress(mode).workers(0).build_local(2).unwrap();
            let (a, b) = (rts[0].world(), rts[1].world());
            let cr = rts[1].continuation_request();
            let ran = Arc::new(AtomicUsize::new(0));
            for t in 0..8 {
                let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, t).unwrap();
                let ran = ran.clone();
                cr.attach(&mut r, weft::Invoke::Pool, move |res| {
                    assert_eq!(res.unwrap().0, vec![t as u8]);
                    ran.fetch_add(1, Ordering::Relaxed);
                })
                .unwrap();
                a.send(vec![t as u8], 1, t).unwrap();
            }
            cr.wait().unwrap();
            assert_eq!(ran.load(Ordering::Relaxed), 8, "{mode}");
        }
    });
}

/// Threads that wait on one continuation request leave the rank's progress to one of them,
/// which runs the inline callbacks; the others sleep instead of polling beside it: of three
/// threads waiting through 2,000 messages, the two that use the least CPU time use less than
/// a quarter of what the third does (`/proc/thread-self/schedstat`: time on a CPU).
#[cfg(target_os = "linux")]
#[test]
fn one_waiter_drives_a_continuation_request_the_others_sleep() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    const N: u64 = 2000;
    /// Nanoseconds this thread has run on a CPU.
    fn cpu_ns() -> u64 {
        let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
        stat.split_whitespace().next().and_then(|t| t.parse().ok()).expect("schedstat's first field")
    }
    within(60, "three threads waiting on one continuation request", || {
        let rts = Runtime::builder().env(false).cris(1).workers(0).build_local(2).unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        let cr = rts[1].continuation_request();
        let ran = Arc::new(AtomicUsize::new(0));
        for i in 0..N {
            let mut r = b.irecv(Vec::<u64>::with_capacity(1), 0u32, 1).unwrap();
            let ran = ran.clone();
            cr.attach(&mut r, weft::Invoke::Inline, move |res| {
                assert_eq!(res.unwrap().0, vec![i]);
                ran.fetch_add(1, Ordering::Relaxed);
            })
            .unwrap();
        }
        let waiting = std::sync::Barrier::new(4);
        let mut cpu: Vec<u64> = std::thread::scope(|s| {
            let waiters: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        waiting.wait();
                        let t0 = cpu_ns();
                        cr.wait().unwrap();
                        cpu_ns() - t0
                    })
                })
                .collect();
            waiting.wait();
            for i in 0..N {
                a.send(vec![i], 1, 1).unwrap();
                if i % 100 == 0 {
                    // Now and then a pause, in which waiters that poll find nothing.
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
            }
            waiters.into_iter().map(|w| w.join().unwrap()).collect()
        });
        assert_eq!(ran.load(Ordering::Relaxed), N as usize);
        cpu.sort_unstable();
        assert!(4 * (cpu[0] + cpu[1]) < cpu[2], "CPU time of the waiters (ns): {cpu:?}");
    });
}

/// A continuation whose request never completes runs with `Cancelled` when the runtime
/// that holds the operation goes away (dropping stays safe).
#[test]
fn a_pending_continuation_runs_cancelled_at_shutdown() {
    use std::sync::{Arc, Mutex};
    let got = Arc::new(Mutex::new(None));
    {
        let rt = Runtime::builder().env(false).build().unwrap();
        let cr = rt.continuation_request();
        let mut r = rt.world().irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
        let g = got.clone();
        cr.attach(&mut r, weft::Invoke::Inline, move |res| *g.lock().unwrap() = Some(res.map(|(b, _)| b))).unwrap();
        assert!(got.lock().unwrap().is_none());
    }
    assert_eq!(*got.lock().unwrap(), Some(Err(Error::Cancelled)));
}

/// Callbacks too large for a continuation record (boxed instead) run as the small ones do,
/// with their captures whole, and every callback's captures are dropped once, run or
/// cancelled at shutdown.
#[test]
fn large_continuations_run_and_every_capture_is_dropped_once() {
    use std::sync::{Arc, Mutex};
    let token = Arc::new(());
    let sums = Arc::new(Mutex::new(Vec::new()));
    {
        let rts = Runtime::builder().env(false).build_local(2).unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        let cr = rts[1].continuation_request();
        for round in 0..3u64 {
            // A large and a small callback, each round: the records are reused.
            let large = [round; 64];
            let (t, s) = (token.clone(), sums.clone());
            let mut r = b.irecv(Vec::<u64>::with_capacity(1), 0u32, 1).unwrap();
            cr.attach(&mut r, weft::Invoke::Inline, move |res| {
                let _held = &t;
                s.lock().unwrap().push(large.iter().sum::<u64>() + res.unwrap().0[0]);
            })
            .unwrap();
            let (t, s) = (token.clone(), sums.clone());
            let mut r = b.irecv(Vec::<u64>::with_capacity(1), 0u32, 2).unwrap();
            cr.attach(&mut r, weft::Invoke::Inline, move |res| {
                let _held = &t;
                s.lock().unwrap().push(res.unwrap().0[0]);
            })
            .unwrap();
            a.send(vec![1000u64], 1, 1).unwrap();
            a.send(vec![round], 1, 2).unwrap();
            cr.wait().unwrap();
        }
        // A large and a small one left pending: cancelled when the ranks shut down.
        let (t, s, large) = (token.clone(), sums.clone(), [5u64; 64]);
        let mut r = b.irecv(Vec::<u64>::with_capacity(1), 0u32, 3).unwrap();
        cr.attach(&mut r, weft::Invoke::Inline, move |res| {
            let _held = &t;
            s.lock().unwrap().push(large[0] + u64::from(res.unwrap_err() == Error::Cancelled));
        })
        .unwrap();
        let (t, s) = (token.clone(), sums.clone());
        let mut r = b.irecv(Vec::<u64>::with_capacity(1), 0u32, 4).unwrap();
        cr.attach(&mut r, weft::Invoke::Inline, move |res| {
            let _held = &t;
            s.lock().unwrap().push(u64::from(res.unwrap_err() == Error::Cancelled));
        })
        .unwrap();
        assert_eq!(Arc::strong_count(&token), 3);
    }
    // The cancelled two in either order.
    let mut sums = sums.lock().unwrap().clone();
    sums[6..].sort_unstable();
    assert_eq!(sums, [1000, 0, 64 + 1000, 1, 128 + 1000, 2, 1, 6]);
    assert_eq!(Arc::strong_count(&token), 1, "a callback's captures were not dropped");
}

/// Partitioned sends filled by many threads at once, round after round (waited for by
/// `wait` or by the futures of `wait_async`), eager and rendezvous partitions: every round's
/// message arrives whole, in place, and a user receive with wildcards never sees a partition.
#[test]
fn partitioned_sends_filled_by_threads() {
    const P: usize = 8;
    within(120, "partitioned sends", || {
        for mode in MODES {
            for per in [16usize, 300] {
                // 16 u32s per partition: eager; 300 (1200 bytes): rendezvous.
                let rts = local(2, mode);
                let (a, b) = (rts[0].world(), rts[1].world());
                let mut wild = b.irecv(Vec::<u8>::with_capacity(8), Source::Any, Tag::Any).unwrap();
                let mut send = a.psend_init(vec![0u32; P * per], P, 1, 7).unwrap();
                let mut recv = b.precv_init(vec![0u32; P * per], P, 0, 7).unwrap();
                for round in 0..5u32 {
                    recv.start().unwrap();
                    send.start().unwrap();
                    // Odd rounds wait through the futures, each run by its rank.
                    let odd = round % 2 == 1;
                    std::thread::scope(|s| {
                        s.spawn(|| match odd {
                            true => rts[1].block_on(recv.wait_async()).unwrap(),
                            false => recv.wait().unwrap(),
                        });
                        std::thread::scope(|fill| {
                            for mut p in send.partitions().unwrap() {
                                fill.spawn(move || {
                                    let v = round * 100 + p.index() as u32;
                                    p.as_mut_slice().fill(v);
                                    p.ready().unwrap();
                                });
                            }
                        });
                        match odd {
                            true => rts[0].block_on(send.wait_async()).unwrap(),
                            false => send.wait().unwrap(),
                        }
                    });
                    let got = recv.buffer().unwrap();
                    for i in 0..P {
                        assert!(
                            got[i * per..(i + 1) * per].iter().all(|&x| x == round * 100 + i as u32),
                            "{mode}: round {round}, partition {i}"
                        );
                    }
                }
                assert!(!wild.test(), "{mode}: a user receive matched a partition");
                assert!(wild.cancel());
            }
        }
    });
}

/// A partition travels as soon as it is ready and the receiver reads it before the others
/// are even filled; misuse is an error, never a hang.
#[test]
fn partitions_arrive_before_the_last_is_ready() {
    within(60, "early partitions", || {
        let rts = local(2, ProgressMode::Owner);
        let (a, b) = (rts[0].world(), rts[1].world());
        let mut send = a.psend_init(vec![0u8; 4 * 100], 4, 1, 0).unwrap();
        let mut recv = b.precv_init(vec![0u8; 4 * 100], 4, 0, 0).unwrap();
        assert_eq!(send.wait(), Err(Error::InvalidArgument("partitioned request not started")));
        assert!(!recv.parrived(0) && recv.partition(0).is_none());
        recv.start().unwrap();
        assert_eq!(recv.start(), Err(Error::InvalidArgument("partitioned request started while active")));
        send.start().unwrap();
        assert!(send.buffer_mut().is_none(), "the buffer is the partitions' while active");
        let mut parts = send.partitions().unwrap();
        let mut second = parts.remove(2);
        let first = parts.remove(0);
        drop(parts); // 1 and 3: dropped unsent, handed out again below
        let mut first = first;
        first.as_mut_slice().fill(1);
        first.ready().unwrap();
        while !recv.parrived(0) {}
        assert_eq!(recv.partition(0).unwrap(), &[1u8; 100][..]);
        assert!(!recv.parrived(1) && recv.partition(1).is_none(), "partition 1 was never sent");
        assert!(recv.buffer().is_none());
        second.as_mut_slice().fill(2);
        second.ready().unwrap();
        assert_eq!(send.wait(), Err(Error::InvalidArgument("a partition was not marked ready")));
        let rest = send.partitions().unwrap();
        assert_eq!(rest.iter().map(|p| p.index()).collect::<Vec<_>>(), vec![1, 3]);
        for mut p in rest {
            let v = p.index() as u8;
            p.as_mut_slice().fill(v);
            p.ready().unwrap();
        }
        send.wait().unwrap();
        recv.wait().unwrap();
        let want: Vec<u8> = (0..4u8).flat_map(|i| [if i == 0 { 1 } else { i }; 100]).collect();
        assert_eq!(recv.buffer().unwrap(), &want[..]);
        send.buffer_mut().unwrap()[0] = 9;
        // Bad arguments.
        assert!(matches!(a.psend_init(vec![0u8; 10], 0, 1, 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(a.psend_init(vec![0u8; 10], 3, 1, 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(a.psend_init(vec![0u8; 10], 2, 1, weft::MAX_PARTITIONED_TAG + 1), Err(Error::InvalidTag { .. })));
        assert!(matches!(b.precv_init(vec![0u8; 10], 2, 5, 0), Err(Error::RankOutOfRange { .. })));
    });
}

/// A send and a receive of different partition counts (the same total bytes): every round
/// arrives whole, and a receive partition has arrived exactly when every send partition
/// overlapping it has — checked as the send's partitions are readied one by one.
#[test]
fn partitioned_with_different_partition_counts() {
    within(120, "different partition counts", || {
        for mode in MODES {
            // (send partitions, receive partitions); 120 u32s (eager) or 2400 (rendezvous
            // partitions, at least 1200 bytes).
            for (ps, pr) in [(4usize, 6usize), (6, 4), (1, 8), (8, 1), (3, 5), (5, 3)] {
                for len in [120usize, 2400] {
                    let rts = local(2, mode);
                    let (a, b) = (rts[0].world(), rts[1].world());
                    let mut send = a.psend_init(vec![0u32; len], ps, 1, 5).unwrap();
                    let mut recv = b.precv_init(vec![0u32; len], pr, 0, 5).unwrap();
                    let (per_s, per_r) = (len / ps, len / pr);
                    for round in 0..3u32 {
                        recv.start().unwrap();
                        send.start().unwrap();
                        let parts = send.partitions().unwrap();
                        for mut p in parts {
                            let j = p.index();
                            p.as_mut_slice().iter_mut().enumerate().for_each(|(k, x)| *x = round * 100_000 + (j * per_s + k) as u32);
                            p.ready().unwrap();
                            // Sent: send partitions 0..=j, the elements below `sent`.
                            let sent = (j + 1) * per_s;
                            for i in 0..pr {
                                let covered = (i + 1) * per_r <= sent;
                                if covered {
                                    let t0 = std::time::Instant::now();
                                    while !recv.parrived(i) {
                                        assert!(t0.elapsed().as_secs() < 20, "{mode}: ({ps}, {pr}): partition {i} never arrived");
                                    }
                                    let want: Vec<u32> = (i * per_r..(i + 1) * per_r).map(|k| round * 100_000 + k as u32).collect();
                                    assert_eq!(recv.partition(i).unwrap(), &want[..], "{mode}: ({ps}, {pr}) round {round}, partition {i}");
                                } else {
                                    assert!(!recv.parrived(i), "{mode}: ({ps}, {pr}): partition {i} arrived before all of it was sent");
                                    assert!(recv.partition(i).is_none());
                                }
                            }
                        }
                        send.wait().unwrap();
                        recv.wait().unwrap();
                        let want: Vec<u32> = (0..len).map(|k| round * 100_000 + k as u32).collect();
                        assert_eq!(recv.buffer().unwrap(), &want[..], "{mode}: ({ps}, {pr}) round {round}");
                    }
                }
            }
        }
    });
}

/// From the second round on, a partition larger than an eager message is written straight
/// into the receive's buffer (the ranks reach each other's memory: in-process ranks, and
/// libfabric's same-host lane) and its message only says that it has arrived: the sending
/// rank receives one frame a round (the receive's clear to write), not a rendezvous `Fin`
/// per partition. Every round still arrives whole, each partition as soon as it is ready.
/// A round whose partitions are ready before the receive starts sends them as messages, and
/// the round after it is written straight again (each clear to write taken by its round).
#[test]
fn partitions_written_straight_into_the_receive_after_the_first_round() {
    const P: usize = 4;
    const PER: usize = 1000; // 4,000 bytes a partition: above the eager threshold of 512
    within(60, "partitions written straight", || {
        #[cfg_attr(not(feature = "ofi"), allow(unused_mut))]
        let mut worlds: Vec<(String, Vec<Runtime>)> = MODES.iter().map(|&m| (format!("{m:?}"), local(2, m))).collect();
        #[cfg(feature = "ofi")]
        worlds
            .push(("shm".into(), Runtime::builder().env(false).provider(weft::Provider::Shm).eager_threshold(512).build_local(2).unwrap()));
        for (what, rts) in &worlds {
            let (a, b) = (rts[0].world(), rts[1].world());
            let mut send = a.psend_init(vec![0u32; P * PER], P, 1, 9).unwrap();
            let mut recv = b.precv_init(vec![0u32; P * PER], P, 0, 9).unwrap();
            let arrive = |recv: &mut weft::PartitionedRecv<'_, u32>, round: u32, i: usize| {
                let t0 = std::time::Instant::now();
                while !recv.parrived(i) {
                    assert!(t0.elapsed().as_secs() < 20, "{what}: round {round}: partition {i} never arrived");
                }
            };
            for round in 0..5u32 {
                let before = rts[0].counters().messages_received;
                // Round 2: every partition ready before the receive starts (no clear yet).
                let ahead = round == 2;
                if ahead {
                    send.start().unwrap();
                    for mut p in send.partitions().unwrap() {
                        let v = round * 100 + p.index() as u32;
                        p.as_mut_slice().fill(v);
                        p.ready().unwrap();
                    }
                    recv.start().unwrap();
                    (0..P).for_each(|i| arrive(&mut recv, round, i));
                } else {
                    recv.start().unwrap();
                    send.start().unwrap();
                }
                for mut p in send.partitions().unwrap() {
                    let i = p.index();
                    p.as_mut_slice().fill(round * 100 + i as u32);
                    p.ready().unwrap();
                    arrive(&mut recv, round, i);
                    assert!(
                        recv.partition(i).unwrap().iter().all(|&x| x == round * 100 + i as u32),
                        "{what}: round {round}, partition {i}"
                    );
                    if i + 1 < P {
                        assert!(!recv.parrived(i + 1), "{what}: round {round}: partition {} arrived before it was ready", i + 1);
                    }
                }
                send.wait().unwrap();
                recv.wait().unwrap();
                let frames = rts[0].counters().messages_received - before;
                if round > 0 && !ahead {
                    assert!(frames <= 1, "{what}: round {round}: the sending rank received {frames} frames, not one clear to write");
                }
                let got = recv.buffer().unwrap();
                assert!((0..P).all(|i| got[i * PER..(i + 1) * PER].iter().all(|&x| x == round * 100 + i as u32)), "{what}: round {round}");
            }
        }
    });
}

/// Partitions of other element types fit when the bytes do: a send of bytes into a receive
/// of `u32`s in fewer partitions, waited for through the futures.
#[test]
fn partitioned_send_and_receive_of_other_element_types() {
    within(60, "partitioned u8 into u32", || {
        let rts = local(2, ProgressMode::Owner);
        let (a, b) = (rts[0].world(), rts[1].world());
        let mut send = a.psend_init(vec![0u8; 64], 8, 1, 2).unwrap();
        let mut recv = b.precv_init(vec![0u32; 16], 2, 0, 2).unwrap();
        for round in 0..2u8 {
            recv.start().unwrap();
            send.start().unwrap();
            for mut p in send.partitions().unwrap() {
                p.as_mut_slice().fill(round + 1);
                p.ready().unwrap();
            }
            std::thread::scope(|s| {
                s.spawn(|| rts[1].block_on(recv.wait_async()).unwrap());
                rts[0].block_on(send.wait_async()).unwrap();
            });
            assert_eq!(recv.buffer().unwrap(), &[u32::from_ne_bytes([round + 1; 4]); 16][..]);
        }
    });
}

/// Layouts that do not fit — other total bytes, or send partitions that are not whole
/// elements of the receive — fail the first round on both sides, and every later start,
/// without a hang (eager and rendezvous partitions).
#[test]
fn partitioned_layouts_that_do_not_fit_are_an_error_on_both_sides() {
    within(60, "partitioned mismatch", || {
        for mode in MODES {
            for scale in [1usize, 100] {
                let rts = local(2, mode);
                let (a, b) = (rts[0].world(), rts[1].world());
                let mut send = a.psend_init(vec![7u8; 40 * scale], 4, 1, 3).unwrap();
                let mut recv = b.precv_init(vec![0u8; 48 * scale], 4, 0, 3).unwrap();
                // Bytes that fit, in partitions of 3 bytes: not whole u32s.
                let mut send2 = a.psend_init(vec![7u8; 12], 4, 1, 4).unwrap();
                let mut recv2 = b.precv_init(vec![0u32; 3], 1, 0, 4).unwrap();
                recv.start().unwrap();
                recv2.start().unwrap();
                send.start().unwrap();
                send2.start().unwrap();
                for p in send.partitions().unwrap().into_iter().chain(send2.partitions().unwrap()) {
                    p.ready().unwrap();
                }
                std::thread::scope(|s| {
                    s.spawn(|| {
                        assert_eq!(recv.wait(), Err(weft::PARTITIONS_MISMATCH), "{mode}");
                        assert_eq!(recv2.wait(), Err(weft::PARTITIONS_MISMATCH), "{mode}");
                    });
                    assert_eq!(send.wait(), Err(weft::PARTITIONS_MISMATCH), "{mode}");
                    assert_eq!(send2.wait(), Err(weft::PARTITIONS_MISMATCH), "{mode}");
                });
                assert_eq!(send.start(), Err(weft::PARTITIONS_MISMATCH));
                assert_eq!(recv.start(), Err(weft::PARTITIONS_MISMATCH));
                assert_eq!(recv.buffer().unwrap(), &vec![0u8; 48 * scale][..], "{mode}: the receive's buffer was written");
            }
        }
    });
}

/// Owned partitions are `'static`: pool tasks fill and ready them, round after round, into
/// a receive of another partition count; a handle out is not handed out again, one dropped
/// unsent is.
#[test]
fn owned_partitions_filled_by_pool_tasks() {
    fn owned<T: Send + 'static>(_: &T) {}
    within(60, "owned partitions in pool tasks", || {
        for mode in MODES {
            let rts = Runtime::builder().env(false).progress(mode).workers(3).build_local(2).unwrap();
            let (a, b) = (rts[0].world(), rts[1].world());
            let mut send = a.psend_init(vec![0u64; 8 * 200], 8, 1, 6).unwrap();
            let mut recv = b.precv_init(vec![0u64; 8 * 200], 5, 0, 6).unwrap();
            for round in 0..4u64 {
                recv.start().unwrap();
                send.start().unwrap();
                let mut parts = send.owned_partitions().unwrap();
                owned(&parts[0]);
                assert_eq!(parts.len(), 8);
                assert!(send.owned_partitions().unwrap().is_empty(), "{mode}: handles out were handed out again");
                assert!(send.partitions().unwrap().is_empty(), "{mode}: handles out were handed out again");
                // One dropped unsent is handed out again.
                drop(parts.remove(5));
                let again = send.owned_partitions().unwrap();
                assert_eq!(again.iter().map(|p| p.index()).collect::<Vec<_>>(), vec![5]);
                let tasks: Vec<_> = parts
                    .into_iter()
                    .chain(again)
                    .map(|mut p| {
                        rts[0].spawn(async move {
                            let i = p.index() as u64;
                            p.as_mut_slice().fill(round * 10 + i);
                            p.ready()
                        })
                    })
                    .collect();
                for t in tasks {
                    rts[0].block_on(t).unwrap().unwrap();
                }
                std::thread::scope(|s| {
                    s.spawn(|| recv.wait().unwrap());
                    send.wait().unwrap();
                });
                let got = recv.buffer().unwrap();
                for i in 0..8 {
                    assert!(
                        got[i * 200..(i + 1) * 200].iter().all(|&x| x == round * 10 + i as u64),
                        "{mode}: round {round}, partition {i}"
                    );
                }
            }
        }
    });
}

/// The continuation request's wait as a future: awaited in tokio (a current-thread runtime
/// and a task of a multi-thread one) and in a task of weft's pool, with inline and pool
/// callbacks whose messages come later from another thread; it resolves only once every
/// callback has run, and to the error of one that panicked.
#[test]
fn continuation_request_awaited_in_tokio_and_in_weft_tasks() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    const N: i32 = 16;
    within(60, "continuation request futures", || {
        for mode in MODES {
            for exec in ["tokio current-thread", "tokio task", "weft task", "weft block_on without workers"] {
                let workers = if exec == "weft block_on without workers" { 0 } else { 2 };
                let rts = Runtime::builder().env(false).progress(mode).workers(workers).build_local(2).unwrap();
                let (a, b) = (rts[0].world(), rts[1].world());
                let cr = Arc::new(rts[1].continuation_request());
                let ran = Arc::new(AtomicUsize::new(0));
                for t in 0..N {
                    let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, t).unwrap();
                    let ran = ran.clone();
                    let invoke = if t % 2 == 0 { weft::Invoke::Inline } else { weft::Invoke::Pool };
                    cr.attach(&mut r, invoke, move |res| {
                        assert_eq!(res.unwrap().0, vec![t as u8]);
                        ran.fetch_add(1, Ordering::SeqCst);
                    })
                    .unwrap();
                }
                std::thread::scope(|s| {
                    s.spawn(|| {
                        for t in 0..N {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                            a.send(vec![t as u8], 1, t).unwrap();
                        }
                    });
                    let res = match exec {
                        "tokio current-thread" => tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(cr.wait_async()),
                        "tokio task" => {
                            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
                            let cr = cr.clone();
                            let task = rt.spawn(async move { cr.wait_async().await });
                            rt.block_on(task).unwrap()
                        }
                        "weft task" => {
                            let cr = cr.clone();
                            rts[1].block_on(rts[1].spawn(async move { cr.wait_async().await })).unwrap()
                        }
                        _ => rts[1].block_on(cr.wait_async()),
                    };
                    res.unwrap();
                    assert_eq!(ran.load(Ordering::SeqCst), N as usize, "{mode}, {exec}: resolved before every callback ran");
                    assert_eq!(cr.pending(), 0);
                });
                // A callback that panics: the future's error.
                let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 99).unwrap();
                cr.attach(&mut r, weft::Invoke::Inline, |_| panic!("a callback that fails")).unwrap();
                a.send(vec![1u8], 1, 99).unwrap();
                let got = tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(cr.wait_async());
                assert!(matches!(got, Err(Error::InvalidArgument(_))), "{mode}, {exec}: {got:?}");
            }
        }
    });
}

/// On a communicator of a subset of the world, the completions a sync object delivers name
/// ranks of that communicator, as the requests' own results do: a receive's source, a
/// sent message's destination, a collective's rank, a persistent receive's source. World
/// ranks 1 and 2 make a communicator where they are ranks 0 and 1.
#[test]
fn sync_object_completions_on_a_subset_communicator_name_its_ranks() {
    within(60, "completions on a subset communicator", || {
        let rts = Runtime::builder().env(false).build_local(3).unwrap();
        std::thread::scope(|s| {
            for rt in &rts {
                s.spawn(move || {
                    let w = rt.world();
                    let Some(sub) = w.split((w.rank() > 0).then_some(0), 0).unwrap() else { return };
                    let me = sub.rank();
                    assert_eq!(me, w.rank() - 1);
                    let sync = rt.sync_object();
                    let mut r = sub.irecv(Vec::<u32>::with_capacity(1), Source::Any, Tag::Is(4)).unwrap();
                    sync.attach(&mut r, 1u32).unwrap();
                    let mut sent = sub.isend(vec![me], 1 - me, 4).unwrap();
                    sync.attach(&mut sent, 2).unwrap();
                    let mut coll = sub.ibarrier().unwrap();
                    sync.attach(&mut coll, 3).unwrap();
                    let mut p = sub.recv_init(Vec::<u32>::with_capacity(1), Source::Any, 6).unwrap();
                    p.start().unwrap();
                    sync.attach(&mut p, 4).unwrap();
                    sub.send(vec![me], 1 - me, 6).unwrap();
                    let mut got = Vec::new();
                    while got.len() < 4 {
                        let c = sync.wait_any().expect("a completion");
                        got.push((c.data, c.status().unwrap().source));
                    }
                    got.sort();
                    // The receive's source and the send's destination are the other member,
                    // the barrier's status this rank: ranks of `sub`, not of the world.
                    assert_eq!(got, vec![(1, 1 - me), (2, 1 - me), (3, me), (4, 1 - me)], "world rank {}", w.rank());
                    // Its result taken, the persistent receive starts again and is waited on.
                    assert_eq!(p.wait().unwrap().source, 1 - me);
                    p.start().unwrap();
                    sub.send(vec![me], 1 - me, 6).unwrap();
                    assert_eq!(p.wait().unwrap().source, 1 - me);
                    // The request's own result agrees.
                    let again = sub.irecv(Vec::<u32>::with_capacity(1), Source::Any, Tag::Is(5)).unwrap();
                    sub.send(vec![me], 1 - me, 5).unwrap();
                    assert_eq!(again.wait().unwrap().1.source, 1 - me);
                });
            }
        });
    });
}
