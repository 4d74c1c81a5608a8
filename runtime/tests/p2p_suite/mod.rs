// Point-to-point semantics, in every progress mode. Included by `p2p.rs` (embedded
// provider) and `p2p_ofi.rs` (libfabric shm and tcp), which each define `builder()`.

use std::time::{Duration, Instant};

use weft::{Assignment, Error, MatchingMode, ProgressMode, Runtime, Source, Tag};

const MODES: [ProgressMode; 3] = [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent];

fn world(n: u32, mode: ProgressMode) -> Vec<Runtime> {
    super::builder().progress(mode).cris(2).eager_threshold(4096).build_local(n).unwrap()
}

#[test]
fn ping_pong_every_mode() {
    for mode in MODES {
        let rts = world(2, mode);
        std::thread::scope(|s| {
            s.spawn(|| {
                let c = rts[0].world();
                for i in 0..200u32 {
                    c.send(i.to_le_bytes().to_vec(), 1, 3).unwrap();
                    let (b, st) = c.recv(Vec::<u8>::with_capacity(4), 1u32, 4).unwrap();
                    assert_eq!(u32::from_le_bytes(b[..4].try_into().unwrap()), i + 1);
                    assert_eq!((st.source, st.tag, st.bytes), (1, 4, 4));
                }
            });
            s.spawn(|| {
                let c = rts[1].world();
                for _ in 0..200u32 {
                    let (b, _) = c.recv(Vec::<u8>::with_capacity(4), 0u32, 3).unwrap();
                    let v = u32::from_le_bytes(b[..4].try_into().unwrap());
                    c.send((v + 1).to_le_bytes().to_vec(), 0, 4).unwrap();
                }
            });
        });
    }
}

#[test]
fn every_size_up_to_64_mib() {
    let rts = world(2, ProgressMode::Owner);
    let sizes = [0usize, 1, 31, 32, 33, 4095, 4096, 4097, 1 << 20, 64 << 20];
    std::thread::scope(|s| {
        s.spawn(|| {
            for &n in &sizes {
                let data: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
                rts[0].world().send(data, 1, 9).unwrap();
            }
        });
        s.spawn(|| {
            for &n in &sizes {
                let (b, st) = rts[1].world().recv(Vec::<u8>::with_capacity(n), 0u32, 9).unwrap();
                assert_eq!(st.bytes, n);
                assert_eq!(b.len(), n);
                assert!(b.iter().enumerate().all(|(i, &x)| x == (i * 7 + n) as u8), "payload of {n} bytes corrupted");
            }
        });
    });
}

#[test]
fn fifo_order_per_source_and_wildcards() {
    for mode in MODES {
        let rts = world(3, mode);
        std::thread::scope(|s| {
            for src in 0..2u32 {
                let rts = &rts;
                s.spawn(move || {
                    for i in 0..300u32 {
                        rts[src as usize].world().send(vec![src, i], 2, (i % 3) as i32).unwrap();
                    }
                });
            }
            s.spawn(|| {
                let mut next = [0u32; 2];
                for _ in 0..600 {
                    let (b, st) = rts[2].world().recv(Vec::<u32>::with_capacity(2), Source::Any, Tag::Any).unwrap();
                    assert_eq!(b[0], st.source);
                    assert_eq!(b[1], next[st.source as usize], "messages from one source overtook each other");
                    assert_eq!(st.tag, (b[1] % 3) as i32);
                    next[st.source as usize] += 1;
                }
            });
        });
    }
}

#[test]
fn unexpected_then_posted_and_tag_selection() {
    let rts = world(2, ProgressMode::Concurrent);
    let c0 = rts[0].world();
    let c1 = rts[1].world();
    c0.send(b"first".to_vec(), 1, 1).unwrap();
    c0.send(b"second".to_vec(), 1, 2).unwrap();
    // Let the frames arrive unexpected.
    let t0 = Instant::now();
    while c1.iprobe(Source::Any, 2).unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
    let (b, _) = c1.recv(Vec::<u8>::with_capacity(16), 0u32, 2).unwrap();
    assert_eq!(&b, b"second");
    let (b, _) = c1.recv(Vec::<u8>::with_capacity(16), 0u32, 1).unwrap();
    assert_eq!(&b, b"first");
    assert!(rts[1].counters().unexpected >= 2);
}

#[test]
fn errors_are_typed_and_lose_nothing() {
    let rts = world(2, ProgressMode::Owner);
    let (c0, c1) = (rts[0].world(), rts[1].world());
    assert_eq!(c0.isend(vec![1u8], 5, 0).unwrap_err(), Error::RankOutOfRange { rank: 5, size: 2 });
    assert!(matches!(c0.isend(vec![1u8], 1, -1).unwrap_err(), Error::InvalidTag { tag: -1, .. }));
    assert!(matches!(c1.irecv(Vec::<u8>::new(), 0u32, -3).unwrap_err(), Error::InvalidTag { tag: -3, .. }));
    let small = super::builder().max_tag(10).build().unwrap();
    assert_eq!(small.world().isend(vec![0u8], 0, 11).unwrap_err(), Error::InvalidTag { tag: 11, max: 10 });
    // Truncation, eager and rendezvous: both sizes reported, next message still arrives.
    for n in [100usize, 100_000] {
        let s = c0.isend(vec![1u8; n], 1, 5).unwrap();
        let e = c1.recv(Vec::<u8>::with_capacity(10), 0u32, 5).unwrap_err();
        assert_eq!(e, Error::Truncated { message_len: n, buffer_len: 10 });
        s.wait().unwrap();
    }
    c0.send(vec![9u8; 3], 1, 5).unwrap();
    assert_eq!(c1.recv(Vec::<u8>::with_capacity(10), 0u32, 5).unwrap().0, vec![9, 9, 9]);
    // Typed receive of a non-multiple length.
    c0.send(vec![1u8; 5], 1, 6).unwrap();
    assert!(matches!(c1.recv(Vec::<u32>::with_capacity(4), 0u32, 6).unwrap_err(), Error::Misaligned { elem_size: 4, message_len: 5 }));
    // A freed communicator.
    let d0 = c0.clone();
    let pending = std::thread::scope(|s| {
        let h = s.spawn(|| c1.dup().unwrap());
        let dup0 = c0.dup().unwrap();
        let dup1 = h.join().unwrap();
        let r = dup1.irecv(Vec::<u8>::with_capacity(1), 0u32, 0).unwrap();
        dup1.clone().free();
        let out = r.wait();
        assert_eq!(dup1.isend(vec![0u8], 0, 0).unwrap_err(), Error::CommFreed);
        drop(dup0);
        out
    });
    assert_eq!(pending.unwrap_err(), Error::CommFreed);
    drop(d0);
}

#[test]
fn dup_isolates_and_overtaking_flag() {
    let rts = world(2, ProgressMode::Owner);
    let (a, b) = std::thread::scope(|s| {
        let h = s.spawn(|| rts[1].world().dup_with(true).unwrap());
        (rts[0].world().dup_with(true).unwrap(), h.join().unwrap())
    });
    assert_eq!(a.context_id(), b.context_id());
    assert_ne!(a.context_id(), rts[0].world().context_id());
    assert!(a.allows_overtaking());
    a.send(b"dup".to_vec(), 1, 0).unwrap();
    rts[0].world().send(b"world".to_vec(), 1, 0).unwrap();
    assert_eq!(rts[1].world().recv(Vec::<u8>::with_capacity(8), 0u32, 0).unwrap().0, b"world");
    assert_eq!(b.recv(Vec::<u8>::with_capacity(8), 0u32, 0).unwrap().0, b"dup");
}

#[test]
fn many_threads_one_rank_all_configurations() {
    for mode in MODES {
        for asg in [Assignment::RoundRobin, Assignment::Dedicated] {
            for mm in [MatchingMode::PerComm, MatchingMode::Global] {
                let rts = super::builder().progress(mode).assignment(asg).matching(mm).cris(3).build_local(2).unwrap();
                std::thread::scope(|s| {
                    for t in 0..4i32 {
                        let rts = &rts;
                        s.spawn(move || send_all(rts[0].world(), 1, (0..64).map(|i| (vec![i as u8; 8], t))));
                        s.spawn(move || {
                            let c = rts[1].world();
                            let mut reqs: Vec<_> = (0..64).map(|_| c.irecv(Vec::<u8>::with_capacity(8), 0u32, t).unwrap()).collect();
                            weft::wait_all(&mut reqs).unwrap();
                            for (i, r) in reqs.iter_mut().enumerate() {
                                assert_eq!(r.take().unwrap().unwrap().0, vec![i as u8; 8], "{mode} {asg} {mm}");
                            }
                        });
                    }
                });
            }
        }
    }
}

#[test]
fn flow_control_bounds_the_inbox() {
    // A 4-frame inbox and 2,000 messages sent before any receive is posted: the sender is
    // pushed back, nothing is lost, order holds.
    let rts = super::builder().cris(1).inbox_capacity(4).build_local(2).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..2000u32 {
                rts[0].world().send(vec![i], 1, 0).unwrap();
            }
        });
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            for i in 0..2000u32 {
                let (v, _) = rts[1].world().recv(Vec::<u32>::with_capacity(1), 0u32, 0).unwrap();
                assert_eq!(v, vec![i]);
            }
        });
    });
    assert!(rts[0].counters().flow_control_waits > 0);
}

/// A nonblocking send never blocks (`MPI_Isend`): one thread isends far more than the
/// destination's inbox holds to a rank nobody progresses yet, then drives both ranks itself.
/// (Before deferred sends this waited on flow control forever.)
#[test]
fn isend_never_blocks_on_a_full_inbox() {
    for mode in MODES {
        let rts = super::builder().progress(mode).cris(1).inbox_capacity(4).build_local(2).unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        let n = 600u32;
        let mut sends: Vec<_> = (0..n).map(|i| a.isend(vec![i], 1, 7).unwrap()).collect();
        let mut recvs: Vec<_> = (0..n).map(|_| b.irecv(Vec::<u32>::with_capacity(1), 0u32, Tag::Any).unwrap()).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !(sends.iter().all(|r| r.is_complete()) && recvs.iter().all(|r| r.is_complete())) {
            assert!(Instant::now() < deadline, "{mode}: not complete within 30 s");
            rts[0].progress();
            rts[1].progress();
        }
        for (i, r) in recvs.iter_mut().enumerate() {
            let (v, st) = r.take().unwrap().unwrap();
            assert_eq!((v, st.tag), (vec![i as u32], 7), "{mode}: in order");
        }
        for r in sends.iter_mut() {
            assert_eq!(r.take().unwrap().unwrap().1.bytes, 4, "{mode}");
        }
        assert_eq!(rts[0].counters().messages_sent, u64::from(n), "{mode}: deferred frames are counted once");
        if rts[0].config().provider == weft::Provider::Embedded {
            assert!(rts[0].counters().flow_control_waits > 0, "{mode}: the inbox never filled");
        }
    }
}

/// Sends dropped while deferred behind a full inbox still go out, in order, when the
/// sending rank next makes progress.
#[test]
fn dropped_deferred_sends_still_arrive() {
    for mode in MODES {
        let rts = super::builder().progress(mode).cris(1).inbox_capacity(4).build_local(2).unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        for i in 0..200u32 {
            drop(a.isend(vec![i], 1, 8).unwrap());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..200u32 {
            let mut r = b.irecv(Vec::<u32>::with_capacity(1), 0u32, 8).unwrap();
            while !r.test() {
                assert!(Instant::now() < deadline, "{mode}: message {i} not received within 30 s");
                rts[0].progress();
            }
            assert_eq!(r.take().unwrap().unwrap().0, vec![i], "{mode}");
        }
    }
}

/// Receives `n` messages of `len` bytes from `source` with `tag` on `c` (payload `i` as the
/// first byte of message `i`), driving only the receiving rank, and fails the test after
/// `secs` seconds.
fn recv_in_order_within(c: &weft::Communicator, source: u32, tag: i32, n: u32, secs: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    for i in 0..n {
        let mut r = c.irecv(Vec::<u8>::with_capacity(8), source, tag).unwrap();
        while !r.test() {
            assert!(Instant::now() < deadline, "{what}: message {i} not received within {secs} s");
        }
        let (m, _) = r.take().unwrap().unwrap();
        assert_eq!(m.first(), Some(&(i as u8)), "{what}: in order");
    }
}

/// Frames deferred behind a full inbox go out while every thread of the sending rank does
/// something else: nobody has to poll for them. The only thread here drives the receiving
/// rank alone.
#[test]
fn deferred_sends_go_out_while_the_sender_does_other_work() {
    for mode in MODES {
        let rts = super::builder().progress(mode).cris(1).inbox_capacity(4).build_local(2).unwrap();
        let mut sends: Vec<_> = (0..40u8).map(|i| rts[0].world().isend(vec![i], 1, 6).unwrap()).collect();
        recv_in_order_within(rts[1].world(), 0, 6, 40, 10, &format!("{mode}: deferred sends of an idle rank"));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sends.iter().all(|r| r.is_complete()) {
            assert!(Instant::now() < deadline, "{mode}: received sends not completed within 10 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        weft::wait_all(&mut sends).unwrap();
    }
}

/// A rendezvous receive whose `Fin` is refused by the sender's full inbox, after which the
/// receiving rank stops calling weft (its thread blocks on something else): the sender's
/// wait still returns — the deferred `Fin` goes out when the sender drains its inbox. Rank
/// 2 fills rank 0's inbox first and then makes no progress either; its deferred messages
/// still reach rank 0.
#[test]
fn a_deferred_fin_goes_out_while_the_receiver_does_other_work() {
    use std::sync::mpsc;
    const FLOOD: u8 = 64;
    const LEN: usize = 64 << 10;
    for mode in MODES {
        let rts = super::builder().progress(mode).cris(1).inbox_capacity(4).eager_threshold(4096).build_local(3).unwrap();
        // Rank 2 fills rank 0's inbox; the rest waits in rank 2's deferred queue.
        let mut flood: Vec<_> = (0..FLOOD).map(|i| rts[2].world().isend(vec![i], 0, 1).unwrap()).collect();
        // Rank 1 receives the message (its `Fin` finds rank 0's inbox full), then blocks
        // outside weft until released. The threads are not scoped: a hang fails the test
        // below instead of stopping the suite (a stuck thread is left behind).
        let (got_tx, got_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let r1 = rts[1].clone();
        let receiver = std::thread::spawn(move || {
            let got = r1.world().recv(Vec::<u8>::with_capacity(LEN), 0u32, 2).map(|(b, st)| (b.len(), st.bytes));
            let _ = got_tx.send(got);
            let _ = release_rx.recv_timeout(Duration::from_secs(60));
        });
        // Rank 0 waits for its send only once rank 1 has received (and deferred its `Fin`):
        // until then no thread of rank 0 calls weft, and on libfabric's tcp the receiver's
        // read of rank 0's buffer is served by rank 0's watcher.
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (done_tx, done_rx) = mpsc::channel();
        let r0 = rts[0].clone();
        std::thread::spawn(move || {
            let send = r0.world().isend(vec![7u8; LEN], 1, 2).unwrap();
            let _ = go_rx.recv_timeout(Duration::from_secs(30));
            let _ = done_tx.send(send.wait().map(|(_, st)| st.bytes));
        });
        let got = got_rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("{mode}: rank 1 did not receive within 30 s"));
        assert_eq!(got, Ok((LEN, LEN)), "{mode}");
        let _ = go_tx.send(());
        let sent = done_rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| {
            panic!("{mode}: rank 0's rendezvous send did not complete within 10 s while rank 1 does other work (its deferred Fin was not sent)")
        });
        assert_eq!(sent, Ok(LEN), "{mode}");
        recv_in_order_within(rts[0].world(), 2, 1, u32::from(FLOOD), 10, &format!("{mode}: deferred sends of an idle rank"));
        release_tx.send(()).unwrap();
        receiver.join().unwrap();
        weft::wait_all(&mut flood).unwrap();
    }
}

/// `Concurrent` with dedicated CRIs and crossed pairs: each sender is bound to the CRI of
/// the *other* pair's receiver, so every frame arrives on a CRI that a thread waiting on
/// another communicator attends. Both pairs still finish (the attending thread matches the
/// frames for the other, and the Algorithm 4 walk reaches attended CRIs every few idle
/// passes), in order.
#[test]
fn crossed_cris_still_progress() {
    let rts = super::builder().progress(ProgressMode::Concurrent).assignment(Assignment::Dedicated).cris(2).build_local(2).unwrap();
    let comms: Vec<(weft::Communicator, weft::Communicator)> = (0..2)
        .map(|_| {
            std::thread::scope(|s| {
                let h = s.spawn(|| rts[1].world().dup().unwrap());
                (rts[0].world().dup().unwrap(), h.join().unwrap())
            })
        })
        .collect();
    let n = 3000u32;
    std::thread::scope(|s| {
        for (pair, (a, b)) in comms.iter().enumerate() {
            let (rt0, rt1) = (&rts[0], &rts[1]);
            s.spawn(move || {
                rt0.pin_cri(1 - pair).unwrap();
                for i in 0..n {
                    a.send(vec![i], 1, 1).unwrap();
                }
            });
            s.spawn(move || {
                rt1.pin_cri(pair).unwrap();
                let deadline = Instant::now() + Duration::from_secs(60);
                for i in 0..n {
                    let (v, _) = b.recv(Vec::<u32>::with_capacity(1), 0u32, 1).unwrap();
                    assert_eq!(v, vec![i], "pair {pair}");
                    assert!(Instant::now() < deadline, "pair {pair}: too slow");
                }
            });
        }
    });
}

#[test]
fn sync_object_collects_receives() {
    let rts = world(2, ProgressMode::Owner);
    let sync = rts[1].sync_object::<usize>();
    let c1 = rts[1].world();
    let mut reqs: Vec<_> = (0..10).map(|i| c1.irecv(Vec::<u8>::with_capacity(4), 0u32, i).unwrap()).collect();
    for (i, r) in reqs.iter_mut().enumerate() {
        sync.attach(r, i).unwrap();
    }
    assert_eq!(sync.size(), 10);
    assert!(sync.query().is_none());
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in (0..10).rev() {
                rts[0].world().send(vec![i as u8], 1, i).unwrap();
            }
        });
        let mut seen = [false; 10];
        for _ in 0..10 {
            let c = sync.wait_any().unwrap();
            assert_eq!(c.outcome.unwrap().tag as usize, c.data);
            seen[c.data] = true;
        }
        assert!(seen.iter().all(|&x| x));
    });
    for (i, r) in reqs.iter_mut().enumerate() {
        assert_eq!(r.take().unwrap().unwrap().0, vec![i as u8]);
    }
}

#[test]
fn async_requests_in_tokio() {
    let rts = world(2, ProgressMode::Owner);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().unwrap();
    let c0 = rts[0].world().clone();
    let c1 = rts[1].world().clone();
    // The first frame to a peer may be refused while `tcp;ofi_rxm` connects (the send is
    // deferred, and only the doorbell wakes its task): once a hang, now a failure.
    let test = async move {
        let recv = tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..100 {
                let (b, st) = c1.irecv(Vec::<u8>::with_capacity(64), 0u32, 1).unwrap().await.unwrap();
                assert_eq!((st.source, st.tag, st.bytes), (0, 1, b.len()));
                got.push(b);
            }
            got
        });
        let send = tokio::spawn(async move {
            for i in 0..100usize {
                let (_, st) = c0.isend(vec![i as u8; i % 64], 1, 1).unwrap().await.unwrap();
                assert_eq!((st.source, st.tag, st.bytes), (1, 1, i % 64));
            }
        });
        send.await.unwrap();
        // Every message whole and in send order (its length and every byte name it).
        let want: Vec<Vec<u8>> = (0..100usize).map(|i| vec![i as u8; i % 64]).collect();
        assert_eq!(recv.await.unwrap(), want);
    };
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), test).await.expect("async requests did not complete within 30 s") });
}

/// An async receive of a rendezvous message, awaited on a single-threaded executor: the
/// read the receive starts goes on after the task returned `Pending` (libfabric: nothing
/// else runs on the receiving rank), and its end wakes the task.
#[test]
fn async_rendezvous_receive_wakes_its_task() {
    const BYTES: usize = 16 << 20;
    for mode in MODES {
        let rts = world(2, mode);
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        std::thread::scope(|s| {
            // Bounded, as the receive is: a send whose `Fin` never comes must not hold the
            // scope (and the test) for ever.
            s.spawn(|| {
                let mut send = a.isend(vec![3u8; BYTES], 1, 8).unwrap();
                let t0 = Instant::now();
                while !send.test() && t0.elapsed() < Duration::from_secs(30) {
                    std::thread::yield_now();
                }
            });
            let got = rt.block_on(async {
                let recv = b.irecv(Vec::<u8>::with_capacity(BYTES), 0u32, 8).unwrap();
                tokio::time::timeout(Duration::from_secs(30), recv).await
            });
            let (buf, st) = got.unwrap_or_else(|_| panic!("{mode}: rendezvous receive not woken within 30 s")).unwrap();
            assert_eq!(st.bytes, BYTES, "{mode}");
            assert!(buf.iter().all(|&x| x == 3), "{mode}: bytes corrupted");
        });
    }
}

/// Sends refused by a full inbox are deferred; an async task awaiting them is woken when
/// the destination drains its inbox, though no thread of the sending rank makes progress
/// meanwhile (the sender's task is parked in the executor before the receiver starts).
#[test]
fn deferred_sends_wake_async_senders() {
    for mode in MODES {
        let rts = super::builder().progress(mode).cris(1).inbox_capacity(4).build_local(2).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_time().build().unwrap();
        let (a, b) = (rts[0].world().clone(), rts[1].world().clone());
        let n = 64u32;
        rt.block_on(async move {
            let send = tokio::spawn(async move {
                let reqs: Vec<_> = (0..n).map(|i| a.isend(vec![i], 1, 9).unwrap()).collect();
                for r in reqs {
                    assert_eq!(r.await.unwrap().1.bytes, 4);
                }
            });
            tokio::time::sleep(Duration::from_millis(100)).await;
            let recv = tokio::spawn(async move {
                for i in 0..n {
                    let (v, st) = b.irecv(Vec::<u32>::with_capacity(1), 0u32, 9).unwrap().await.unwrap();
                    assert_eq!((v, st.tag), (vec![i], 9), "in order");
                }
            });
            let both = async {
                send.await.unwrap();
                recv.await.unwrap();
            };
            tokio::time::timeout(Duration::from_secs(30), both)
                .await
                .unwrap_or_else(|_| panic!("{mode}: deferred sends never woke their task"));
        });
        if rts[0].config().provider == weft::Provider::Embedded {
            assert!(rts[0].counters().flow_control_waits > 0, "{mode}: the inbox never filled");
        }
    }
}

#[test]
fn dropped_requests_are_safe() {
    let rts = world(2, ProgressMode::Owner);
    let (c0, c1) = (rts[0].world(), rts[1].world());
    // A receive dropped before matching is cancelled; the message goes to the next receive.
    drop(c1.irecv(Vec::<u8>::with_capacity(8), 0u32, 0).unwrap());
    c0.send(b"x".to_vec(), 1, 0).unwrap();
    assert_eq!(c1.recv(Vec::<u8>::with_capacity(8), 0u32, 0).unwrap().0, b"x");
    // A rendezvous send dropped in flight: the buffer stays alive until the receiver reads it.
    drop(c0.isend(vec![5u8; 1 << 20], 1, 1).unwrap());
    let (b, _) = c1.recv(Vec::<u8>::with_capacity(1 << 20), 0u32, 1).unwrap();
    assert!(b.iter().all(|&x| x == 5));
}

/// Posts, on rank 1, the receive of a rendezvous message of `len` bytes from rank 0 once
/// its `Rts` has arrived: the receive matches where it is posted, and its read of the
/// sender's buffer starts there (on libfabric without the same-host lane it is still in
/// flight when `irecv` returns).
fn matched_rendezvous_receive(rts: &[Runtime], len: usize, tag: i32) -> (weft::Request<'_, Vec<u8>>, weft::Request<'_, Vec<u8>>) {
    let (a, b) = (rts[0].world(), rts[1].world());
    let send = a.isend((0..len).map(|i| (i % 251) as u8).collect::<Vec<u8>>(), 1, tag).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while b.iprobe(0u32, tag).unwrap().is_none() {
        assert!(Instant::now() < deadline, "the Rts never arrived");
    }
    (send, b.irecv(Vec::<u8>::with_capacity(len), 0u32, tag).unwrap())
}

/// Waits for `send` on a thread of rank 0 alone (rank 1 makes no progress meanwhile) and
/// returns its outcome, or `None` after 10 s — rank 1 is then progressed, so the stuck
/// send ends and the test fails instead of hanging.
fn send_finishes_alone(rts: &[Runtime], send: weft::Request<'_, Vec<u8>>) -> Option<Result<usize, Error>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let waiter = s.spawn(move || {
            let _ = tx.send(send.wait().map(|(_, st)| st.bytes));
        });
        let got = rx.recv_timeout(Duration::from_secs(10)).ok();
        while !waiter.is_finished() {
            rts[1].progress();
        }
        got
    })
}

/// A rendezvous receive dropped while its read of the sender's buffer is in flight: the
/// read still ends into the buffer the runtime keeps, and its `Fin` goes out though no
/// thread of the receiving rank calls weft again (its courier finishes the read), so the
/// sender's wait returns (it used to wait for the `Fin` for ever where reads are
/// asynchronous: libfabric without the same-host lane).
#[test]
fn a_receive_dropped_during_its_rendezvous_read_lets_the_send_finish() {
    const LEN: usize = 1 << 20;
    for mode in MODES {
        let rts = super::builder().progress(mode).cris(1).eager_threshold(4096).build_local(2).unwrap();
        let (send, recv) = matched_rendezvous_receive(&rts, LEN, 3);
        drop(recv);
        let got = send_finishes_alone(&rts, send);
        assert_eq!(got, Some(Ok(LEN)), "{mode}: the send of a receive dropped during its read (None: not done within 10 s)");
    }
}

/// A rendezvous receive that has matched cannot be cancelled, not even while its read is
/// in flight (MPI: a matched receive completes): `cancel` says `false`, the receive
/// completes with the whole message and the send finishes.
#[test]
fn a_matched_rendezvous_receive_is_not_cancelled() {
    const LEN: usize = 1 << 20;
    for mode in MODES {
        let rts = super::builder().progress(mode).cris(1).eager_threshold(4096).build_local(2).unwrap();
        let (send, mut recv) = matched_rendezvous_receive(&rts, LEN, 4);
        assert!(!recv.cancel(), "{mode}: a matched receive was cancelled");
        let (got, st) = recv.wait().unwrap();
        assert!(!st.cancelled(), "{mode}");
        assert_eq!((got.len(), st.bytes), (LEN, LEN), "{mode}");
        assert!(got.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8), "{mode}: payload corrupted");
        assert_eq!(send_finishes_alone(&rts, send), Some(Ok(LEN)), "{mode}");
    }
}

#[test]
fn send_to_self_eager_and_rendezvous() {
    let rts = super::builder().eager_threshold(4096).build_local(1).unwrap();
    let c = rts[0].world();
    for n in [0usize, 8, 4096, 100_000] {
        let data: Vec<u8> = (0..n).map(|i| (i % 253) as u8).collect();
        let r = c.irecv(Vec::<u8>::with_capacity(n), 0u32, 3).unwrap();
        let s = c.isend(data.clone(), 0, 3).unwrap();
        let (b, st) = r.wait().unwrap();
        s.wait().unwrap();
        assert_eq!(st.bytes, n);
        assert!(b == data, "self message of {n} bytes corrupted");
    }
}

/// MPI's rule across specific and wildcard receives: a message matches the earliest posted
/// receive that fits, whichever kind it is.
#[test]
fn earliest_posted_receive_wins_across_wildcards() {
    for mode in MODES {
        let rts = world(2, mode);
        let (a, b) = (rts[0].world(), rts[1].world());
        let cap = || Vec::<u32>::with_capacity(1);
        // specific, wildcard-source, any-any, specific, wildcard-tag — all fit (0, 5).
        let r0 = b.irecv(cap(), 0u32, 5).unwrap();
        let r1 = b.irecv(cap(), Source::Any, 5).unwrap();
        let r2 = b.irecv(cap(), Source::Any, Tag::Any).unwrap();
        let r3 = b.irecv(cap(), 0u32, 5).unwrap();
        let r4 = b.irecv(cap(), 0u32, Tag::Any).unwrap();
        // A receive for another tag is not disturbed by any of them.
        let other = b.irecv(cap(), 0u32, 6).unwrap();
        for i in 0..5u32 {
            a.send(vec![i], 1, 5).unwrap();
        }
        a.send(vec![99], 1, 6).unwrap();
        for (i, r) in [r0, r1, r2, r3, r4].into_iter().enumerate() {
            assert_eq!(r.wait().unwrap().0, vec![i as u32], "{mode}: receive {i} got the wrong message");
        }
        assert_eq!(other.wait().unwrap().0, vec![99]);
        // A wildcard posted before a specific receive takes the first message.
        let w = b.irecv(cap(), Source::Any, Tag::Any).unwrap();
        let s = b.irecv(cap(), 0u32, 7).unwrap();
        a.send(vec![1], 1, 7).unwrap();
        a.send(vec![2], 1, 7).unwrap();
        assert_eq!(w.wait().unwrap().0, vec![1], "{mode}");
        assert_eq!(s.wait().unwrap().0, vec![2], "{mode}");
        // Cancelled (dropped) receives of both kinds leave the others intact.
        let d1 = b.irecv(cap(), 0u32, 8).unwrap();
        let d2 = b.irecv(cap(), Source::Any, 8).unwrap();
        let keep = b.irecv(cap(), 0u32, 8).unwrap();
        drop(d1);
        drop(d2);
        a.send(vec![3], 1, 8).unwrap();
        assert_eq!(keep.wait().unwrap().0, vec![3], "{mode}");
    }
}

/// Many distinct tags: bins are pruned, nothing is lost.
#[test]
fn many_distinct_tags() {
    let rts = world(2, ProgressMode::Owner);
    let (a, b) = (rts[0].world(), rts[1].world());
    for round in 0..3 {
        let mut reqs: Vec<_> = (0..1500).map(|t| b.irecv(Vec::<u32>::with_capacity(1), 0u32, round * 10_000 + t).unwrap()).collect();
        // Another thread sends.
        std::thread::scope(|s| {
            s.spawn(|| {
                for t in (0..1500).rev() {
                    a.send(vec![t as u32], 1, round * 10_000 + t).unwrap();
                }
            });
            weft::wait_all(&mut reqs).unwrap();
        });
        for (t, r) in reqs.iter_mut().enumerate() {
            assert_eq!(r.take().unwrap().unwrap().0, vec![t as u32]);
        }
    }
}

/// Both ranks' `dup` of the world, run concurrently (it is collective).
fn dup_both(rts: &[Runtime]) -> (weft::Communicator, weft::Communicator) {
    std::thread::scope(|s| {
        let h = s.spawn(|| rts[1].world().dup().unwrap());
        (rts[0].world().dup().unwrap(), h.join().unwrap())
    })
}

/// A freed communicator gives its context id back: `dup` + `free` in a loop keeps reusing
/// one slot, each time with a new id, and every new communicator works. Frames still in
/// flight for the freed one (an eager message and a rendezvous announcement sent after the
/// receiver freed it) never reach the communicator that reuses its slot, and the
/// rendezvous sender is released instead of waiting forever.
#[test]
fn freed_context_ids_are_reused_and_stale_frames_dropped() {
    for mode in MODES {
        let rts = world(2, mode);
        let mut ids = std::collections::HashSet::new();
        let mut prev = dup_both(&rts);
        for i in 0..60u32 {
            let (a, b) = prev;
            // The receiver frees first, then tells the sender, which sends into the void.
            b.free();
            rts[1].world().send(vec![0u8], 0, 90).unwrap();
            rts[0].world().recv(Vec::<u8>::with_capacity(1), 1u32, 90).unwrap();
            a.isend(vec![0xEEu8; 8], 1, 1).unwrap().wait().unwrap();
            let big = a.isend(vec![0xEEu8; 10_000], 1, 1).unwrap();
            a.clone().free();
            // The next pair takes the same slot (both ranks freed it).
            let (c, d) = dup_both(&rts);
            assert_eq!(c.context_id(), d.context_id());
            assert!(ids.insert(c.context_id()), "{mode}: context id {:#x} handed out twice", c.context_id());
            assert_eq!(c.context_id() & 0xfff, a.context_id() & 0xfff, "{mode}: the freed slot is reused");
            c.send(i.to_le_bytes().to_vec(), 1, 1).unwrap();
            let (m, st) = d.recv(Vec::<u8>::with_capacity(16), Source::Any, Tag::Any).unwrap();
            assert_eq!(
                (m.as_slice(), st.source, st.tag),
                (&i.to_le_bytes()[..], 0, 1),
                "{mode}: a stale frame reached the new communicator"
            );
            assert_eq!(d.iprobe(Source::Any, Tag::Any).unwrap(), None, "{mode}");
            // Released by the receiver dropping the stale announcement (its `Fin`).
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut big = big;
            while !big.test() {
                assert!(Instant::now() < deadline, "{mode}: the rendezvous send into a freed communicator hangs");
                // Rank 1 progresses (a pass over its CRIs) so it handles the stale `Rts`.
                let _ = rts[1].world().iprobe(Source::Any, Tag::Any);
            }
            drop(big);
            drop(a);
            prev = (c, d);
        }
    }
}

/// Freeing a stale handle (a clone of a communicator already freed through another handle)
/// is a no-op: it does not give back the context slot that a later `dup` agreed on again,
/// so the communicator now in the slot keeps working and the next `dup` still finds a slot
/// free on every rank (before, the stale free released the live communicator's claim, and
/// the next `dup` failed on every rank with "context id already in use").
#[test]
fn freeing_a_stale_clone_keeps_the_slot_of_its_successor() {
    for mode in MODES {
        let rts = world(2, mode);
        let (x0, x1) = dup_both(&rts);
        let (stale0, stale1) = (x0.clone(), x1.clone());
        x0.free();
        x1.free();
        let (y0, y1) = dup_both(&rts);
        assert_eq!(y0.context_id() & 0xfff, stale0.context_id() & 0xfff, "{mode}: y reuses the freed slot");
        stale0.free();
        stale1.free();
        let (z0, z1) = std::thread::scope(|s| {
            let h = s.spawn(|| rts[1].world().dup());
            (rts[0].world().dup(), h.join().unwrap())
        });
        let (z0, z1) =
            (z0.unwrap_or_else(|e| panic!("{mode}: dup on rank 0: {e}")), z1.unwrap_or_else(|e| panic!("{mode}: dup on rank 1: {e}")));
        assert_eq!(z0.context_id(), z1.context_id());
        assert_ne!(z0.context_id() & 0xfff, y0.context_id() & 0xfff, "{mode}: z took the slot y still holds");
        // y still carries messages, and so does z.
        y0.send(vec![7u8, 8], 1, 5).unwrap();
        let (m, st) = y1.recv(Vec::<u8>::with_capacity(2), 0u32, 5).unwrap();
        assert_eq!((m, st.source, st.tag), (vec![7, 8], 0, 5), "{mode}");
        z1.send(vec![9u8], 0, 6).unwrap();
        assert_eq!(z0.recv(Vec::<u8>::with_capacity(1), 1u32, 6).unwrap().0, vec![9], "{mode}");
    }
}

fn dup_assert(rts: &[Runtime], a: weft::Assertions) -> (weft::Communicator, weft::Communicator) {
    std::thread::scope(|s| {
        let h = s.spawn(|| rts[1].world().dup_with_assertions(a).unwrap());
        (rts[0].world().dup_with_assertions(a).unwrap(), h.join().unwrap())
    })
}

/// `no_any_tag` (MPI 4.0 `mpi_assert_no_any_tag`): `Tag::Any` receives and probes are
/// refused and lose nothing, `dup` inherits the assertion, and with many threads and tags
/// on one communicator — every progress mode, both CRI assignments (and per-thread order),
/// both matching modes — messages of one (source, tag) still match in send order, `Source::Any` receives of a
/// tag take that tag's messages in order, and unexpected messages wait in their partition.
#[test]
fn no_any_tag_orders_per_tag_and_refuses_wildcard_tags() {
    let a = weft::Assertions { no_any_tag: true, ..Default::default() };
    let rts = world(2, ProgressMode::Concurrent);
    let (c0, c1) = dup_assert(&rts, a);
    assert_eq!(c0.assertions(), a);
    assert!(matches!(c1.irecv(Vec::<u8>::with_capacity(1), 0u32, Tag::Any), Err(Error::InvalidArgument(_))));
    assert!(matches!(c1.iprobe(Source::Any, Tag::Any), Err(Error::InvalidArgument(_))));
    assert!(matches!(c1.iprobe(0u32, -1), Err(Error::InvalidTag { .. })));
    // Nothing was lost by the refusals: a message sent before them is still there.
    c0.send(vec![1u8], 1, 77).unwrap();
    let st = (0..1000).find_map(|_| c1.iprobe(0u32, 77).unwrap()).expect("probe by tag finds it");
    assert_eq!((st.tag, st.bytes), (77, 1));
    assert_eq!(c1.recv(Vec::<u8>::with_capacity(1), Source::Any, 77).unwrap().0, vec![1]);
    let (d0, d1) = std::thread::scope(|s| {
        let h = s.spawn(|| c1.dup().unwrap());
        (c0.dup().unwrap(), h.join().unwrap())
    });
    assert_eq!(d1.assertions(), a, "dup inherits");
    assert!(d0.irecv(Vec::<u8>::with_capacity(1), 1u32, Tag::Any).is_err());
    let (o0, _o1) = {
        let b = weft::Assertions { allow_overtaking: true, ..a };
        dup_assert(&rts, b)
    };
    assert!(o0.allows_overtaking() && o0.assertions().no_any_tag);
    // Ranks that pass different assertions both get an error (no hang), and the
    // communicator they dup from still works.
    let (e0, e1) = std::thread::scope(|s| {
        let h = s.spawn(|| rts[1].world().dup_with_assertions(weft::Assertions::default()));
        (rts[0].world().dup_with_assertions(a), h.join().unwrap())
    });
    assert!(matches!(e0, Err(Error::InvalidArgument(_))) && matches!(e1, Err(Error::InvalidArgument(_))), "{e0:?} {e1:?}");
    let (f0, f1) = dup_assert(&rts, a);
    f0.send(vec![5u8], 1, 3).unwrap();
    assert_eq!(f1.recv(Vec::<u8>::with_capacity(1), 0u32, 3).unwrap().0, vec![5]);
    drop((rts, c0, c1, d0, d1, o0, f0, f1));

    for mode in MODES {
        for (asg, per_thread) in [(Assignment::RoundRobin, false), (Assignment::Dedicated, false), (Assignment::Dedicated, true)] {
            for mm in [MatchingMode::PerComm, MatchingMode::Global] {
                let rts = super::builder()
                    .progress(mode)
                    .assignment(asg)
                    .per_thread_order(per_thread)
                    .matching(mm)
                    .cris(3)
                    .build_local(2)
                    .unwrap();
                let (c0, c1) = dup_assert(&rts, a);
                let before = rts[1].counters().messages_received;
                const PER: u32 = 150;
                std::thread::scope(|s| {
                    // Four sender threads; each sends on two tags, interleaved.
                    for t in 0..4i32 {
                        let c0 = &c0;
                        s.spawn(move || send_all(c0, 1, (0..PER).flat_map(|i| [t, t + 16].map(|tag| (i.to_le_bytes().to_vec(), tag)))));
                    }
                    // One receiver thread per tag; half with Source::Any. Receives posted late
                    // (after a pause) find unexpected messages in their partition.
                    for tag in (0..4i32).chain(16..20) {
                        let c1 = &c1;
                        s.spawn(move || {
                            if tag % 2 == 0 {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            for i in 0..PER {
                                let src = if tag >= 16 { Source::Any } else { Source::Rank(0) };
                                let (b, st) = c1.recv(Vec::<u8>::with_capacity(4), src, tag).unwrap();
                                assert_eq!(
                                    u32::from_le_bytes(b[..4].try_into().unwrap()),
                                    i,
                                    "{mode} {asg} {per_thread} {mm}: tag {tag} out of order"
                                );
                                assert_eq!((st.source, st.tag), (0, tag));
                            }
                        });
                    }
                });
                let n = rts[1].counters();
                assert_eq!(n.messages_received - before, u64::from(PER) * 8, "{mode} {asg} {per_thread} {mm}");
            }
        }
    }
}

/// On a `no_any_tag` communicator, receives in several tag partitions are each cancelled by
/// dropping them, failed with `CommFreed` by `free`, and messages still queued are dropped.
#[test]
fn no_any_tag_cancel_and_free_reach_every_partition() {
    let a = weft::Assertions { no_any_tag: true, ..Default::default() };
    for mode in MODES {
        let rts = world(2, mode);
        let (c0, c1) = dup_assert(&rts, a);
        // Dropping unmatched receives in many partitions cancels them: later messages on
        // those tags go to the receives posted after.
        for tag in 0..32 {
            drop(c1.irecv(Vec::<u8>::with_capacity(1), 0u32, tag).unwrap());
        }
        for tag in 0..32 {
            c0.send(vec![tag as u8], 1, tag).unwrap();
        }
        for tag in (0..32).rev() {
            assert_eq!(c1.recv(Vec::<u8>::with_capacity(1), 0u32, tag).unwrap().0, vec![tag as u8], "{mode}");
        }
        // Pending receives in every partition fail with CommFreed at free; an unexpected
        // message is dropped with the queues.
        c0.send(vec![9u8], 1, 1000).unwrap();
        while c1.iprobe(0u32, 1000).unwrap().is_none() {}
        let mut pending: Vec<_> = (0..32).map(|tag| c1.irecv(Vec::<u8>::with_capacity(1), 0u32, tag).unwrap()).collect();
        c1.clone().free();
        for r in pending.iter_mut() {
            assert!(matches!(r.take(), Some(Err(Error::CommFreed))), "{mode}");
        }
        assert!(matches!(c1.iprobe(0u32, 1000), Err(Error::CommFreed)));
    }
}

/// One progress pass takes a batch of frames off a CRI and matches consecutive frames of
/// one matching state (communicator and tag partition) under one lock acquisition. A batch
/// that mixes communicators, tag partitions and wildcard-capable communicators, all of it
/// unexpected, must still keep each (communicator, tag)'s messages in send order, deliver
/// every payload intact and let `Source::Any` / `Tag::Any` receives take the earliest one.
#[test]
fn mixed_batches_keep_order_per_communicator_and_tag() {
    for mode in MODES {
        let rts = world(2, mode);
        let (p0, p1) = dup_assert(&rts, weft::Assertions { no_any_tag: true, ..Default::default() });
        let (q0, q1) = dup_both(&rts);
        let (w0, w1) = (rts[0].world(), rts[1].world());
        let comms0 = [&p0, &q0, w0];
        let comms1 = [&p1, &q1, w1];
        const TAGS: i32 = 5;
        const ROUNDS: u32 = 6;
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                // Every message goes out before the receiver looks: they reach its CRIs
                // interleaved (communicator, tag, communicator, ...) and wait there. (Sends
                // a full inbox refused go out later, while the receiver progresses.)
                let mut sends = Vec::new();
                for r in 0..ROUNDS {
                    for t in 0..TAGS {
                        for (ci, c) in comms0.iter().enumerate() {
                            let v = [ci as u8, t as u8, r as u8];
                            sends.push(c.isend(v.to_vec(), 1, t).unwrap());
                        }
                    }
                }
                barrier.wait();
                weft::wait_all(&mut sends).unwrap();
            });
            s.spawn(|| {
                barrier.wait();
                // The world communicator first takes its earliest message with wildcards:
                // round 0, tag 0.
                let (b, st) = recv_within(comms1[2], Source::Any, Tag::Any);
                assert_eq!((b.as_slice(), st.tag), (&[2u8, 0, 0][..], 0), "{mode}: wildcard receive took a later message");
                // Then each (communicator, tag) in an order unlike the sends': reversed tags,
                // communicators back to front; rounds must come in send order.
                for t in (0..TAGS).rev() {
                    for (ci, c) in comms1.iter().enumerate().rev() {
                        let first = if ci == 2 && t == 0 { 1 } else { 0 };
                        for r in first..ROUNDS {
                            let (b, st) = recv_within(c, Source::Rank(0), Tag::Is(t));
                            assert_eq!(
                                b.as_slice(),
                                &[ci as u8, t as u8, r as u8][..],
                                "{mode}: communicator {ci} tag {t} out of order or corrupted"
                            );
                            assert_eq!((st.source, st.tag, st.bytes), (0, t, 3), "{mode}");
                        }
                    }
                }
                for c in comms1 {
                    assert_eq!(
                        c.iprobe(Source::Any, if c.assertions().no_any_tag { Tag::Is(0) } else { Tag::Any }).unwrap(),
                        None,
                        "{mode}: a message left over"
                    );
                }
            });
        });
    }
}

/// Sends every `(payload, tag)` of `msgs` to `dest` without waiting, in order, then waits
/// for them all (a sender thread of the tests below).
fn send_all(c: &weft::Communicator, dest: u32, msgs: impl IntoIterator<Item = (Vec<u8>, i32)>) {
    let mut reqs: Vec<_> = msgs.into_iter().map(|(b, tag)| c.isend(b, dest, tag).unwrap()).collect();
    weft::wait_all(&mut reqs).unwrap();
}

/// A 3-byte receive that fails the test instead of hanging when its message went astray.
fn recv_within(c: &weft::Communicator, source: Source, tag: Tag) -> (Vec<u8>, weft::Status) {
    recv_bytes_within(c, 3, source, tag)
}

/// [`recv_within`] of up to `cap` bytes.
fn recv_bytes_within(c: &weft::Communicator, cap: usize, source: Source, tag: Tag) -> (Vec<u8>, weft::Status) {
    let mut r = c.irecv(Vec::<u8>::with_capacity(cap), source, tag).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !r.test() {
        assert!(Instant::now() < deadline, "no message for {source:?} {tag:?} within 10 s: delivered to the wrong queue?");
    }
    r.wait().unwrap()
}

/// A communicator without assertions is matched per tag partition until its first
/// `Tag::Any` receive; from then on one order over every tag. One sender's messages cycle
/// over five tags (five partitions), spread over several CRIs (round-robin: they arrive out
/// of order, so partitions run ahead of each other); the receiver first takes some of one
/// tag, then everything else with `Tag::Any`, which must come in send order — including the
/// messages that partitions had already queued as unexpected above a gap.
#[test]
fn wildcard_tag_after_partitioned_traffic_keeps_send_order() {
    const N: u32 = 400;
    const TAGS: u32 = 5;
    for mode in MODES {
        for asg in [Assignment::RoundRobin, Assignment::Dedicated] {
            for mm in [MatchingMode::PerComm, MatchingMode::Global] {
                let rts = super::builder().progress(mode).assignment(asg).matching(mm).cris(3).build_local(2).unwrap();
                let (c0, c1) = dup_both(&rts);
                std::thread::scope(|s| {
                    s.spawn(|| {
                        send_all(&c0, 1, (0..N).map(|i| (i.to_le_bytes().to_vec(), (i % TAGS) as i32)));
                    });
                    let val = |b: &[u8]| u32::from_le_bytes(b[..4].try_into().unwrap());
                    // The first 10 messages of tag 3, by tag.
                    for k in 0..10 {
                        let (b, st) = c1.recv(Vec::<u8>::with_capacity(4), 0u32, 3).unwrap();
                        assert_eq!((val(&b), st.tag), (3 + TAGS * k, 3), "{mode} {asg} {mm}: tag 3 out of order");
                    }
                    // Let the partitions run ahead (frames queue as unexpected), then switch.
                    std::thread::sleep(Duration::from_millis(5));
                    let mut expect = (0..N).filter(|&i| !(i % TAGS == 3 && i < 3 + TAGS * 10));
                    for _ in 0..N - 10 {
                        let src = if mode == ProgressMode::Owner { Source::Any } else { Source::Rank(0) };
                        let (b, st) = c1.recv(Vec::<u8>::with_capacity(4), src, Tag::Any).unwrap();
                        let want = expect.next().unwrap();
                        assert_eq!((val(&b), st.tag as u32), (want, want % TAGS), "{mode} {asg} {mm}: Tag::Any out of send order");
                    }
                });
                assert_eq!(c1.iprobe(Source::Any, Tag::Any).unwrap(), None);
            }
        }
    }
}

/// Around the switch to one order: `iprobe(Tag::Any)` reports the earliest message of two
/// queued in different partitions; receives posted before the switch keep their place
/// (an earlier specific receive beats a later `Tag::Any` one); a receive posted before
/// the switch can still be cancelled after it (its message goes to the next receive); and
/// `free` fails receives posted after it.
#[test]
fn receives_and_probes_around_the_switch() {
    for mode in MODES {
        let rts = world(2, mode);
        // Tags 1 and 2 lie in different partitions.
        let (c0, c1) = dup_both(&rts);
        c0.send(vec![1u8], 1, 1).unwrap();
        c0.send(vec![2u8], 1, 2).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while c1.iprobe(0u32, 2).unwrap().is_none() || c1.iprobe(0u32, 1).unwrap().is_none() {
            assert!(Instant::now() < deadline, "{mode}: messages not delivered");
        }
        let st = c1.iprobe(Source::Any, Tag::Any).unwrap().expect("two messages queued");
        assert_eq!(st.tag, 1, "{mode}: iprobe(Tag::Any) must report the first message sent");
        assert_eq!(recv_within(&c1, Source::Any, Tag::Any).0, vec![1]);
        assert_eq!(recv_within(&c1, Source::Rank(0), Tag::Any).0, vec![2]);

        let (d0, d1) = dup_both(&rts);
        let r1 = d1.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
        let r2 = d1.irecv(Vec::<u8>::with_capacity(1), Source::Any, 2).unwrap();
        let gone = d1.irecv(Vec::<u8>::with_capacity(1), 0u32, 9).unwrap();
        let any = d1.irecv(Vec::<u8>::with_capacity(1), 0u32, Tag::Any).unwrap(); // switches
        drop(gone);
        for (v, tag) in [(20u8, 2), (21, 2), (10, 1), (90, 9)] {
            d0.send(vec![v], 1, tag).unwrap();
        }
        assert_eq!(r2.wait().unwrap().0, vec![20], "{mode}");
        assert_eq!(any.wait().unwrap().0, vec![21], "{mode}: the Tag::Any receive took a message of an earlier receive");
        assert_eq!(r1.wait().unwrap().0, vec![10], "{mode}");
        assert_eq!(recv_within(&d1, Source::Any, Tag::Any).0, vec![90], "{mode}: the cancelled receive's message was lost");
        let mut pending = d1.irecv(Vec::<u8>::with_capacity(1), 0u32, 5).unwrap();
        d1.clone().free();
        assert!(matches!(pending.take(), Some(Err(Error::CommFreed))), "{mode}");
    }
}

/// Several sender threads, each on tags of its own in several partitions; the receiver
/// takes a few by tag while every partition runs on its own, then the rest by `Tag::Any`:
/// each thread's messages still come in its send order, and none is lost or duplicated.
#[test]
fn many_senders_then_wildcard_tag() {
    const PER: u32 = 200;
    const THREADS: u32 = 3;
    for mode in MODES {
        let rts = super::builder().progress(mode).assignment(Assignment::RoundRobin).cris(3).build_local(2).unwrap();
        let (c0, c1) = dup_both(&rts);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let c0 = &c0;
                s.spawn(move || {
                    send_all(c0, 1, (0..PER).map(|i| ([t, i].iter().flat_map(|x| x.to_le_bytes()).collect(), (t * 2 + i % 2) as i32)));
                });
            }
            let mut next = [0u32; THREADS as usize];
            let mut take = |b: &[u8], tag: i32| {
                let (t, i) = (u32::from_le_bytes(b[..4].try_into().unwrap()), u32::from_le_bytes(b[4..8].try_into().unwrap()));
                assert_eq!(tag as u32, t * 2 + i % 2);
                assert!(i >= next[t as usize], "{mode}: thread {t}'s message {i} after {}", next[t as usize]);
                next[t as usize] = i + 1;
            };
            // By tag: thread t's even messages, while its odd ones queue in another partition.
            for t in 0..THREADS {
                for _ in 0..10 {
                    let (b, st) = c1.recv(Vec::<u8>::with_capacity(8), 0u32, (t * 2) as i32).unwrap();
                    let i = u32::from_le_bytes(b[4..8].try_into().unwrap());
                    assert_eq!(i % 2, 0);
                    let _ = st;
                }
            }
            // Then everything else by Tag::Any: per thread in send order, skipping the ones taken.
            let mut seen = 0;
            let mut by_thread = vec![Vec::new(); THREADS as usize];
            while seen < THREADS * PER - THREADS * 10 {
                let (b, st) = c1.recv(Vec::<u8>::with_capacity(8), Source::Any, Tag::Any).unwrap();
                let t = u32::from_le_bytes(b[..4].try_into().unwrap());
                by_thread[t as usize].push(u32::from_le_bytes(b[4..8].try_into().unwrap()));
                take(&b, st.tag);
                seen += 1;
            }
            for (t, got) in by_thread.iter().enumerate() {
                let want: Vec<u32> = (0..PER).filter(|&i| !(i % 2 == 0 && i < 20)).collect();
                assert_eq!(got, &want, "{mode}: thread {t}'s messages by Tag::Any");
            }
        });
    }
}

/// `Bytes` out, `BytesMut` in, at eager and rendezvous sizes (the threshold is 4096): what
/// arrives has the length and content sent. The sender sends views into one buffer
/// (`Bytes::slice`, at an odd offset), the receiver reuses one `BytesMut` for every
/// message, largest first, so each receive must replace what the last one left.
/// [`recv_within`] of a `u32`: the value and its status.
fn recv_u32_within(c: &weft::Communicator, source: Source, tag: Tag) -> (u32, weft::Status) {
    let (b, st) = recv_bytes_within(c, 4, source, tag);
    (u32::from_le_bytes(b[..4].try_into().unwrap()), st)
}

/// A rank matches each (source, tag partition) in a state of its own until its first
/// `Source::Any` receive or probe with a tag, which lays the states out by tag. Three
/// senders each stream one tag to one receiver; the receiver takes some of each by source
/// (its states by source run apart, the rest queue as unexpected), has receives posted by
/// source and tag before the move, then takes the rest with `Source::Any`: each source's
/// messages in its send order, none lost; a receive posted before the move still beats a
/// later wildcard one for its message, and one cancelled after the move leaves its message
/// to the next receive.
#[test]
fn source_wildcard_after_traffic_by_source_keeps_send_order() {
    const N: u32 = 200;
    const SENDERS: u32 = 3;
    for mode in MODES {
        for asg in [Assignment::RoundRobin, Assignment::Dedicated] {
            for mm in [MatchingMode::PerComm, MatchingMode::Global] {
                let rts = super::builder().progress(mode).assignment(asg).matching(mm).cris(3).build_local(SENDERS + 1).unwrap();
                // Set when the senders may go on (a flag with a deadline, not a barrier: a
                // receiver that fails does not leave them waiting).
                let phase = std::sync::atomic::AtomicBool::new(false);
                let wait_phase = |phase: &std::sync::atomic::AtomicBool| {
                    let deadline = Instant::now() + Duration::from_secs(20);
                    while !phase.load(std::sync::atomic::Ordering::Acquire) && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                };
                let c = rts[SENDERS as usize].world();
                let what = format!("{mode} {asg} {mm}");
                std::thread::scope(|s| {
                    for r in 0..SENDERS {
                        let (w, phase, wait_phase) = (rts[r as usize].world(), &phase, &wait_phase);
                        s.spawn(move || {
                            send_all(w, SENDERS, (0..N).map(|i| (i.to_le_bytes().to_vec(), 7)));
                            wait_phase(phase);
                            if r == 2 {
                                send_all(w, SENDERS, [90u32, 91].map(|v| (v.to_le_bytes().to_vec(), 9)));
                            }
                            if r == 0 {
                                send_all(w, SENDERS, [(110u32.to_le_bytes().to_vec(), 11)]);
                            }
                        });
                    }
                    // Before the move: the first ten of each source by source, and two
                    // receives left posted.
                    for r in 0..SENDERS {
                        for k in 0..10 {
                            assert_eq!(recv_u32_within(c, Source::Rank(r), Tag::Is(7)).0, k, "{what}: source {r} out of order");
                        }
                    }
                    let early = c.irecv(Vec::<u8>::with_capacity(4), 2u32, 9).unwrap();
                    let cancelled = c.irecv(Vec::<u8>::with_capacity(4), 0u32, 11).unwrap();
                    // The rest queue as unexpected, in their states by source.
                    std::thread::sleep(Duration::from_millis(5));
                    let late = c.irecv(Vec::<u8>::with_capacity(4), Source::Any, 9).unwrap(); // moves
                    drop(cancelled);
                    let mut next = [10u32; SENDERS as usize];
                    for _ in 0..SENDERS * (N - 10) {
                        let (v, st) = recv_u32_within(c, Source::Any, Tag::Is(7));
                        assert_eq!(v, next[st.source as usize], "{what}: source {} out of order after the move", st.source);
                        next[st.source as usize] += 1;
                    }
                    phase.store(true, std::sync::atomic::Ordering::Release);
                    let val = |b: Vec<u8>| u32::from_le_bytes(b[..4].try_into().unwrap());
                    assert_eq!(val(early.wait().unwrap().0), 90, "{what}: a receive posted before the move lost its place");
                    assert_eq!(val(late.wait().unwrap().0), 91, "{what}");
                    assert_eq!(recv_u32_within(c, Source::Rank(0), Tag::Is(11)).0, 110, "{what}: the cancelled receive's message was lost");
                });
                assert_eq!(c.iprobe(Source::Any, Tag::Any).unwrap(), None, "{what}: messages left over");
            }
        }
    }
}

/// Threads of one rank that each receive from a peer of their own under one tag (matched
/// in states of their own), while two other threads of the rank receive from any source
/// under a second tag: the move to the layout by tag happens amid their posts and the
/// arrivals (the two racing to make it), and every message still comes once, in its
/// source's send order (a thread's receives from one source come in it).
#[test]
fn threads_by_source_meet_a_source_wildcard_midway() {
    const N: u32 = 300;
    const PEERS: u32 = 3;
    for mode in MODES {
        for asg in [Assignment::RoundRobin, Assignment::Dedicated] {
            let rts = super::builder().progress(mode).assignment(asg).cris(PEERS as usize + 1).build_local(PEERS + 1).unwrap();
            let c = rts[0].world();
            let what = format!("{mode} {asg}");
            // Tag-7 messages received so far: the wildcard threads start midway.
            let taken = std::sync::atomic::AtomicU32::new(0);
            std::thread::scope(|s| {
                for p in 1..=PEERS {
                    let w = rts[p as usize].world();
                    // Every tenth message under tag 8 (the wildcard thread's).
                    s.spawn(move || send_all(w, 0, (0..N).map(|i| (i.to_le_bytes().to_vec(), if i % 10 == 9 { 8 } else { 7 }))));
                    let (what, taken) = (&what, &taken);
                    s.spawn(move || {
                        for i in (0..N).filter(|i| i % 10 != 9) {
                            let (v, st) = recv_u32_within(c, Source::Rank(p), Tag::Is(7));
                            assert_eq!((v, st.source), (i, p), "{what}: peer {p}'s messages out of order");
                            taken.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                    });
                }
                let (what, taken) = (&what, &taken);
                let wild: Vec<_> = (0..2)
                    .map(|_| {
                        s.spawn(move || {
                            let deadline = Instant::now() + Duration::from_secs(10);
                            while taken.load(std::sync::atomic::Ordering::Relaxed) < PEERS * N / 4 && Instant::now() < deadline {
                                std::thread::yield_now();
                            }
                            let mut got = vec![Vec::new(); PEERS as usize + 1];
                            for _ in 0..PEERS * N / 20 {
                                let (v, st) = recv_u32_within(c, Source::Any, Tag::Is(8));
                                let mine = &mut got[st.source as usize];
                                assert!(mine.last().is_none_or(|&l| l < v), "{what}: peer {}'s tag-8 messages out of order", st.source);
                                mine.push(v);
                            }
                            got
                        })
                    })
                    .collect();
                let mut all: Vec<Vec<u32>> = vec![Vec::new(); PEERS as usize + 1];
                for h in wild {
                    for (p, got) in h.join().unwrap().into_iter().enumerate() {
                        all[p].extend(got);
                    }
                }
                for p in 1..=PEERS {
                    all[p as usize].sort_unstable();
                    assert_eq!(all[p as usize], (0..N).filter(|i| i % 10 == 9).collect::<Vec<_>>(), "{what}: peer {p}'s tag-8 messages");
                }
            });
            assert_eq!(c.iprobe(Source::Any, Tag::Any).unwrap(), None, "{what}: messages left over");
        }
    }
}

#[test]
fn bytes_buffers_round_trip() {
    use bytes::{Bytes, BytesMut};
    const SIZES: [usize; 6] = [100_000, 4097, 4096, 33, 1, 0];
    let payload = |n: usize| (0..n).map(move |i| (i * 7 + n) as u8);
    for mode in MODES {
        let rts = world(2, mode);
        std::thread::scope(|s| {
            s.spawn(|| {
                let c = rts[0].world();
                let all = Bytes::from((0..SIZES.len()).flat_map(|k| std::iter::once(0xAB).chain(payload(SIZES[k]))).collect::<Vec<u8>>());
                let mut at = 0;
                for n in SIZES {
                    let view = all.slice(at + 1..at + 1 + n);
                    at += 1 + n;
                    let (back, st) = c.send(view.clone(), 1, 11).unwrap();
                    assert_eq!((back, st.bytes), (view, n), "{mode}: the sent buffer comes back");
                }
            });
            s.spawn(|| {
                let c = rts[1].world();
                let mut buf = BytesMut::with_capacity(SIZES[0]);
                for n in SIZES {
                    let (b, st) = c.recv(buf, 0u32, 11).unwrap();
                    assert_eq!((st.bytes, b.len()), (n, n), "{mode}: length of a {n}-byte message");
                    assert!(b.iter().copied().eq(payload(n)), "{mode}: a {n}-byte message corrupted");
                    buf = b;
                }
            });
        });
    }
}

/// The typed-slice calls: `send_slice` of u8, i32, f64 and u64, `recv_into` a longer slice,
/// eager and rendezvous (the largest count is over 4096 bytes for every type): the status
/// gives the bytes sent, the front of the slice holds the elements sent and the rest is
/// left alone.
#[test]
fn typed_slices_round_trip() {
    fn round_trip<T: weft::Primitive + PartialEq + std::fmt::Debug>(rts: &[Runtime], what: &str, make: fn(usize) -> T, spare: T) {
        const COUNTS: [usize; 4] = [0, 1, 37, 5000];
        std::thread::scope(|s| {
            s.spawn(|| {
                for n in COUNTS {
                    let data: Vec<T> = (0..n).map(make).collect();
                    let st = rts[0].world().send_slice(&data, 1, 12).unwrap();
                    assert_eq!(st.bytes, std::mem::size_of_val(data.as_slice()), "{what}");
                }
            });
            s.spawn(|| {
                for n in COUNTS {
                    let mut into = vec![spare; n + 3];
                    let st = rts[1].world().recv_into(&mut into, 0u32, 12).unwrap();
                    assert_eq!((st.source, st.tag, st.bytes), (0, 12, n * std::mem::size_of::<T>()), "{what}: {n} elements");
                    let want: Vec<T> = (0..n).map(make).collect();
                    assert_eq!(&into[..n], &want[..], "{what}: {n} elements corrupted");
                    assert_eq!(&into[n..], &[spare; 3][..], "{what}: written past the message");
                }
            });
        });
    }
    for mode in MODES {
        let rts = world(2, mode);
        round_trip::<u8>(&rts, &format!("{mode} u8"), |i| (i * 31) as u8, 0xEE);
        round_trip::<i32>(&rts, &format!("{mode} i32"), |i| i as i32 * -7919, i32::MIN);
        round_trip::<f64>(&rts, &format!("{mode} f64"), |i| i as f64 * -0.75 + 1e-3, f64::MAX);
        round_trip::<u64>(&rts, &format!("{mode} u64"), |i| (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15), u64::MAX);
    }
}

/// A typed receive of a message whose length is not a whole number of elements fails with
/// `Misaligned` (both sizes given), eager and rendezvous, whether it receives into a slice
/// (`recv_into`) or a `Vec`; the sender is released, and the next message still arrives.
#[test]
fn typed_receives_of_misaligned_messages_fail() {
    for mode in MODES {
        let rts = world(2, mode);
        std::thread::scope(|s| {
            s.spawn(|| {
                let c = rts[0].world();
                for n in [5usize, 8003] {
                    c.send_slice(&vec![1u8; n], 1, 13).unwrap();
                    c.send_slice(&vec![2u8; n], 1, 13).unwrap();
                    c.send_slice(&[7i32, -7], 1, 13).unwrap();
                }
            });
            s.spawn(|| {
                let c = rts[1].world();
                for n in [5usize, 8003] {
                    let mut into = [0i32; 4000];
                    let e = c.recv_into(&mut into, 0u32, 13).unwrap_err();
                    assert_eq!(e, Error::Misaligned { elem_size: 4, message_len: n }, "{mode}: recv_into, {n} bytes");
                    assert!(into.iter().all(|&x| x == 0), "{mode}: a failed receive wrote into the slice");
                    let e = c.recv(Vec::<f64>::with_capacity(2000), 0u32, 13).unwrap_err();
                    assert_eq!(e, Error::Misaligned { elem_size: 8, message_len: n }, "{mode}: Vec<f64>, {n} bytes");
                    let mut two = [0i32; 2];
                    assert_eq!(c.recv_into(&mut two, 0u32, 13).unwrap().bytes, 8, "{mode}");
                    assert_eq!(two, [7, -7], "{mode}: the message after a misaligned one");
                }
            });
        });
    }
}

/// An overtaking communicator (three ranks; two senders of two threads each, eight tags,
/// some messages rendezvous-sized, CRIs round-robin so frames reach the receiver out of
/// order) still delivers every message exactly once: receives by specific source and tag,
/// `Source::Any` with a tag, a source with `Tag::Any`, then `Source::Any` / `Tag::Any` for
/// the rest, each get a message that fits them, and together exactly the messages sent.
#[test]
fn overtaking_communicator_delivers_every_message_once() {
    use std::collections::HashSet;
    const THREADS: u32 = 2;
    const PER: u32 = 240;
    const TAGS: u32 = 8;
    // Every 40th message is 8 KiB: rendezvous.
    let len = |i: u32| if i % 40 == 39 { 2048 } else { 3 };
    for mode in MODES {
        let rts = super::builder().progress(mode).assignment(Assignment::RoundRobin).cris(3).eager_threshold(4096).build_local(3).unwrap();
        let comms: Vec<weft::Communicator> = std::thread::scope(|s| {
            let hs: Vec<_> = rts.iter().map(|rt| s.spawn(move || rt.world().dup_with(true).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(comms.iter().all(|c| c.allows_overtaking()));
        std::thread::scope(|s| {
            for src in 0..2u32 {
                for t in 0..THREADS {
                    let c = &comms[src as usize];
                    s.spawn(move || {
                        let mut reqs: Vec<_> = (0..PER)
                            .map(|i| {
                                let mut m = vec![0u32; len(i) as usize];
                                m[..3].copy_from_slice(&[src, t, i]);
                                c.isend(m, 2, (i % TAGS) as i32).unwrap()
                            })
                            .collect();
                        weft::wait_all(&mut reqs).unwrap();
                    });
                }
            }
            let c = &comms[2];
            let mut seen = HashSet::new();
            let mut take = |source: Source, tag: Tag, count: u32| {
                for _ in 0..count {
                    let mut r = c.irecv(Vec::<u32>::with_capacity(2048), source, tag).unwrap();
                    let deadline = Instant::now() + Duration::from_secs(30);
                    while !r.test() {
                        assert!(Instant::now() < deadline, "{mode}: no message for {source:?} {tag:?} within 30 s");
                    }
                    let (m, st) = r.wait().unwrap();
                    let (src, t, i) = (m[0], m[1], m[2]);
                    assert_eq!((st.source, st.tag, m.len()), (src, (i % TAGS) as i32, len(i) as usize), "{mode}: status or length");
                    assert!(matches!(source, Source::Any) || source == Source::Rank(src), "{mode}: {source:?} got a message of {src}");
                    assert!(matches!(tag, Tag::Any) || tag == Tag::Is(st.tag), "{mode}: {tag:?} got tag {}", st.tag);
                    assert!(seen.insert((src, t, i)), "{mode}: message {i} of rank {src} thread {t} delivered twice");
                }
            };
            take(Source::Rank(0), Tag::Is(1), 30);
            take(Source::Rank(1), Tag::Is(2), 30);
            take(Source::Any, Tag::Is(3), 30);
            take(Source::Rank(0), Tag::Any, 30);
            take(Source::Any, Tag::Any, 2 * THREADS * PER - 120);
            let all: HashSet<_> = (0..2).flat_map(|src| (0..THREADS).flat_map(move |t| (0..PER).map(move |i| (src, t, i)))).collect();
            assert_eq!(seen, all, "{mode}: messages lost");
        });
        assert_eq!(comms[2].iprobe(Source::Any, Tag::Any).unwrap(), None, "{mode}: a message left over");
    }
}

/// One sender thread, one tag, frames spread over three CRIs (round-robin), so they can
/// reach the receiver out of order: a communicator without overtaking delivers them in
/// send order; one that allows overtaking need not, but every `Source::Any` / `Tag::Any`
/// receive completes and together they get exactly the messages sent.
#[test]
fn overtaking_may_reorder_one_tag_but_loses_nothing() {
    const N: u32 = 600;
    for mode in MODES {
        let rts = super::builder().progress(mode).assignment(Assignment::RoundRobin).cris(3).build_local(2).unwrap();
        for overtaking in [false, true] {
            let (c0, c1) = std::thread::scope(|s| {
                let h = s.spawn(|| rts[1].world().dup_with(overtaking).unwrap());
                (rts[0].world().dup_with(overtaking).unwrap(), h.join().unwrap())
            });
            let got: Vec<u32> = std::thread::scope(|s| {
                s.spawn(|| send_all(&c0, 1, (0..N).map(|i| (i.to_le_bytes().to_vec(), 4))));
                (0..N)
                    .map(|_| {
                        let (b, st) = c1.recv(Vec::<u8>::with_capacity(4), Source::Any, Tag::Any).unwrap();
                        assert_eq!((st.source, st.tag, st.bytes), (0, 4, 4), "{mode}");
                        u32::from_le_bytes(b[..4].try_into().unwrap())
                    })
                    .collect()
            });
            let in_order: Vec<u32> = (0..N).collect();
            if overtaking {
                let mut sorted = got.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, in_order, "{mode}, overtaking: messages lost or duplicated");
            } else {
                assert_eq!(got, in_order, "{mode}: without overtaking, one tag's messages come in send order");
            }
            assert_eq!(c1.iprobe(Source::Any, Tag::Any).unwrap(), None, "{mode}: a message left over");
        }
    }
}

/// A peer that finishes normally (drops its runtime) while this rank has receives posted
/// that only it could match: everything it sent before is still received — though this
/// rank had not looked before the finish — and then those receives (a named one, and a
/// `Source::Any` one with no peer left), a new receive and a new send fail with `PeerLost`
/// instead of waiting forever. The messages used to fail with `PeerLost` (embedded) and
/// the receives to wait forever (libfabric).
#[test]
fn a_finished_peer_delivers_what_it_sent_then_fails_what_only_it_could_match() {
    for mode in MODES {
        let mut rts = world(2, mode);
        let gone = rts.pop().unwrap();
        let a = rts[0].world();
        let mut pending = a.irecv(Vec::<u32>::with_capacity(1), 1u32, 99).unwrap();
        let mut any = a.irecv(Vec::<u32>::with_capacity(1), Source::Any, 98).unwrap();
        // Inline, pooled and near-threshold eager payloads.
        let sizes = [1usize, 16, 100, 1000];
        for (i, &n) in sizes.iter().enumerate() {
            gone.world().send(vec![i as u32; n], 0, 1).unwrap();
        }
        drop(gone);
        for (i, &n) in sizes.iter().enumerate() {
            // A probe sees the messages it sent before it finished, not its absence.
            let t0 = Instant::now();
            loop {
                match a.iprobe(1u32, 1) {
                    Ok(Some(st)) => break assert_eq!((st.source, st.bytes), (1, 4 * n), "{mode}"),
                    Ok(None) => assert!(t0.elapsed() < Duration::from_secs(10), "{mode}: message {i} never probed"),
                    Err(err) => panic!("{mode}: probe of message {i}, sent before the finish: {err}"),
                }
            }
            match a.recv(Vec::<u32>::with_capacity(1000), 1u32, 1) {
                Ok((b, st)) => assert_eq!((b, st.source), (vec![i as u32; n], 1), "{mode}"),
                Err(err) => panic!("{mode}: message {i}, sent before the finish: {err}"),
            }
        }
        let t0 = Instant::now();
        while !(pending.test() && any.test()) {
            assert!(t0.elapsed() < Duration::from_secs(10), "{mode}: receives from the finished rank still pending after 10 s");
        }
        assert!(matches!(pending.take(), Some(Err(Error::PeerLost { rank: 1 }))), "{mode}");
        assert!(matches!(any.take(), Some(Err(Error::PeerLost { rank: 1 }))), "{mode}: Source::Any with no peer left");
        let late = a.recv(Vec::<u32>::with_capacity(1), 1u32, Tag::Any);
        assert!(matches!(late, Err(Error::PeerLost { rank: 1 })), "{mode}: new receive: {late:?}");
        let send = a.send(vec![7u32], 1, 3);
        assert!(matches!(send, Err(Error::PeerLost { rank: 1 })), "{mode}: new send: {send:?}");
        // Probes: nothing will ever come from the rank (they returned `Ok(None)` for ever).
        assert_eq!(a.iprobe(1u32, Tag::Any), Err(Error::PeerLost { rank: 1 }), "{mode}");
        assert_eq!(a.iprobe(Source::Any, 5), Err(Error::PeerLost { rank: 1 }), "{mode}: Source::Any with no peer left");
    }
}

/// A rank that drops its runtime with a rendezvous send still pending (its request dropped
/// too, between two eager sends): the receiver, receiving meanwhile, gets all three
/// messages whole. Closing at once had withdrawn the registered buffer the receiver reads
/// from, and the large message failed with `PeerLost` — lost, though everything a
/// finished rank sent arrives.
#[test]
fn a_finished_peers_pending_rendezvous_send_still_arrives() {
    for mode in MODES {
        let mut rts = world(2, mode);
        let (r1, r0) = (rts.pop().unwrap(), rts.pop().unwrap());
        let big: Vec<u8> = (0..1u32 << 20).map(|i| (i % 253) as u8).collect();
        {
            let a = r0.world();
            drop(a.isend(vec![9u8; 100], 1, 2).unwrap());
            drop(a.isend(big.clone(), 1, 1).unwrap());
            drop(a.isend(vec![8u8; 100], 1, 3).unwrap());
        }
        // The drop waits for the receiver to read the large message; the receiver posts its
        // receives while it does.
        let dropper = std::thread::spawn(move || drop(r0));
        let b = r1.world();
        for (tag, want) in [(2, vec![9u8; 100]), (1, big.clone()), (3, vec![8u8; 100])] {
            match b.recv(Vec::<u8>::with_capacity(1 << 20), 0u32, tag) {
                Ok((got, st)) => {
                    assert_eq!(st.bytes, want.len(), "{mode}: tag {tag}");
                    assert!(got == want, "{mode}: tag {tag}: wrong bytes");
                }
                Err(err) => panic!("{mode}: message with tag {tag}, sent before the finish: {err}"),
            }
        }
        dropper.join().unwrap();
    }
}

/// A probe names ranks as a receive does: one outside the communicator is
/// `RankOutOfRange` from `iprobe` as from `irecv` (it used to be `Ok(None)`: a message that
/// could never come, polled for ever); a world of no ranks is an error on every provider
/// (libfabric used to return an empty `Ok`).
#[test]
fn probes_and_local_worlds_refuse_what_receives_and_worlds_refuse() {
    let rts = world(2, ProgressMode::Owner);
    let c = rts[0].world();
    for r in [2u32, 99, u32::MAX] {
        assert_eq!(c.iprobe(Source::Rank(r), Tag::Any), Err(Error::RankOutOfRange { rank: r, size: 2 }));
        assert_eq!(c.iprobe(r, 3), Err(Error::RankOutOfRange { rank: r, size: 2 }));
        assert_eq!(c.irecv(Vec::<u8>::with_capacity(1), r, 3).map(|_| ()).unwrap_err(), Error::RankOutOfRange { rank: r, size: 2 });
    }
    assert_eq!(c.iprobe(Source::Rank(1), Tag::Any), Ok(None));
    match super::builder().build_local(0) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("at least 1 rank"), "{m}"),
        other => panic!("build_local(0): expected InvalidArgument, got {:?}", other.map(|v| v.len())),
    }
}

/// Every rank sends a rendezvous-size message to every other rank at once, a few rounds, in
/// every progress mode: each receiver reads its messages from the senders' memory while
/// those senders read theirs from it. A receive that waited for its read inside progress,
/// holding the CRI lock, left every rank waiting for a read only another waiting rank's
/// progress could serve (libfabric: a hang in about half of the runs at 6-8 ranks).
#[test]
fn all_to_all_rendezvous_completes() {
    const RANKS: u32 = 6;
    const ROUNDS: u32 = 4;
    const BYTES: usize = 64 << 10;
    for mode in MODES {
        let rts = world(RANKS, mode);
        crate::common::within(60, &format!("{mode}: all-to-all of {BYTES}-byte messages"), move || {
            std::thread::scope(|s| {
                for rt in &rts {
                    s.spawn(move || {
                        let c = rt.world();
                        let me = c.rank();
                        let fill = |from: u32, round: u32| (from * 31 + round) as u8;
                        for round in 0..ROUNDS {
                            let mut recvs: Vec<_> = (0..RANKS)
                                .filter(|&p| p != me)
                                .map(|p| (p, c.irecv(Vec::<u8>::with_capacity(BYTES), p, 5).unwrap()))
                                .collect();
                            let mut sends: Vec<_> =
                                (1..RANKS).map(|k| c.isend(vec![fill(me, round); BYTES], (me + k) % RANKS, 5).unwrap()).collect();
                            for (p, r) in recvs.drain(..) {
                                let (b, st) = r.wait().unwrap_or_else(|e| panic!("{mode}: rank {me} from {p}: {e}"));
                                assert_eq!((st.source, st.bytes), (p, BYTES), "{mode}");
                                assert!(b.iter().all(|&x| x == fill(p, round)), "{mode}: rank {me}: bytes from {p} corrupted");
                            }
                            weft::wait_all(&mut sends).unwrap();
                        }
                    });
                }
            });
        });
    }
}

/// One `poll` of a pending receive makes a bounded amount of progress and returns, even
/// while frames keep arriving (libfabric says frames may come for a while after any
/// traffic): it must not hold its executor's worker for as long as the traffic lasts. While
/// progress work remains the task is woken to be polled again.
#[test]
fn one_poll_returns_while_frames_keep_arriving() {
    use std::future::Future;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};

    struct Counting(AtomicUsize);
    impl Wake for Counting {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
    /// The sender's frames: one a millisecond, for at most this long.
    const SENDING: Duration = Duration::from_secs(2);
    for mode in MODES {
        let rts = world(2, mode);
        let stop = AtomicBool::new(false);
        let sent = std::thread::scope(|s| {
            let sender = s.spawn(|| {
                let c = rts[1].world();
                let until = Instant::now() + SENDING;
                let mut n = 0u32;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    c.send(n.to_le_bytes().to_vec(), 0, 7).unwrap();
                    n += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                n
            });
            let c = rts[0].world();
            // Traffic flows before the poll.
            c.recv(Vec::<u8>::with_capacity(4), 1u32, 7).unwrap();
            let mut r = c.irecv(Vec::<u8>::with_capacity(4), Source::Any, 9).unwrap();
            let wakes = Arc::new(Counting(AtomicUsize::new(0)));
            let waker = Waker::from(wakes.clone());
            let polled = std::pin::Pin::new(&mut r).poll(&mut Context::from_waker(&waker));
            let sending = !sender.is_finished();
            // Pending, the task is woken again: by itself while work remains, else by the
            // next frame.
            let woken_by = Instant::now() + Duration::from_secs(1);
            while wakes.0.load(Ordering::Relaxed) == 0 && Instant::now() < woken_by {
                std::thread::sleep(Duration::from_millis(1));
            }
            stop.store(true, Ordering::Relaxed);
            assert!(polled.is_pending(), "{mode}: nobody sends tag 9");
            assert!(sending, "{mode}: one poll returned only once the sender stopped");
            assert!(wakes.0.load(Ordering::Relaxed) > 0, "{mode}: the pending receive was never woken while frames came");
            drop(r);
            sender.join().unwrap()
        });
        // The frames polled meanwhile, received in order.
        let c = rts[0].world();
        for _ in 1..sent {
            c.recv(Vec::<u8>::with_capacity(4), 1u32, 7).unwrap();
        }
    }
}

/// Tests every request of `reqs` until all are complete; fails the test after `secs` seconds.
fn complete_within<B: Send + 'static>(reqs: &mut [weft::Request<'_, B>], secs: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        // Every request tested on each pass, not only up to the first incomplete one.
        let mut all = true;
        for r in reqs.iter_mut() {
            all &= r.test();
        }
        if all {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not complete within {secs} s");
    }
}

/// `isend_into` and `irecv_into` append their requests to the caller's vectors (growing
/// from none), each at its place: eager sends gone at once, sends queued behind a full
/// inbox, rendezvous sends in flight, receives; an argument error leaves the vector as it
/// was and the requests in it valid.
#[test]
fn requests_written_into_arrays() {
    let size = |i: usize| [0usize, 100, 8192][i % 3];
    let payload = |i: usize| (0..size(i)).map(|k| (k + 3 * i) as u8).collect::<Vec<u8>>();
    let n = 48;
    for mode in MODES {
        let rts = super::builder().progress(mode).cris(2).eager_threshold(4096).inbox_capacity(8).build_local(2).unwrap();
        let (posted, all_posted) = std::sync::mpsc::channel::<()>();
        let rts = &rts;
        std::thread::scope(|s| {
            s.spawn(move || {
                let a = rts[0].world();
                let mut sends = Vec::new();
                for i in 0..n {
                    a.isend_into(&mut sends, payload(i), 1, i as i32).unwrap();
                    assert_eq!(sends.len(), i + 1);
                }
                assert_eq!(a.isend_into(&mut sends, vec![1u8], 2, 0), Err(Error::RankOutOfRange { rank: 2, size: 2 }));
                assert_eq!(a.isend_into(&mut sends, vec![1u8], 1, -1).unwrap_err(), Error::InvalidTag { tag: -1, max: i32::MAX });
                assert_eq!(sends.len(), n);
                posted.send(()).unwrap();
                complete_within(&mut sends, 20, &format!("{mode}: sends"));
                for (i, r) in sends.iter_mut().enumerate() {
                    let (b, st) = r.take().expect("complete").unwrap();
                    assert_eq!(b, payload(i), "send {i} gave back another buffer");
                    assert_eq!((st.source, st.tag, st.bytes), (1, i as i32, size(i)));
                }
            });
            s.spawn(move || {
                let b = rts[1].world();
                let mut recvs = Vec::new();
                for i in 0..n {
                    b.irecv_into(&mut recvs, Vec::<u8>::with_capacity(size(i)), 0u32, i as i32).unwrap();
                }
                assert!(matches!(b.irecv_into(&mut recvs, Vec::new(), 5u32, 0), Err(Error::RankOutOfRange { .. })));
                assert!(matches!(b.irecv_into(&mut recvs, Vec::new(), 0u32, -2), Err(Error::InvalidTag { .. })));
                assert_eq!(recvs.len(), n);
                // Nothing drains the inbox of 8 frames until every send is posted: the later
                // eager sends are queued, and their requests pending.
                all_posted.recv_timeout(Duration::from_secs(20)).expect("the sends are posted");
                complete_within(&mut recvs, 20, &format!("{mode}: receives"));
                for (i, r) in recvs.iter_mut().enumerate() {
                    let (got, st) = r.take().expect("complete").unwrap();
                    assert_eq!((st.source, st.tag, st.bytes), (0, i as i32, size(i)), "receive {i}");
                    assert_eq!(got, payload(i), "receive {i}'s payload");
                }
            });
        });
        if rts[0].config().provider == weft::Provider::Embedded {
            assert!(rts[0].counters().flow_control_waits > 0, "{mode}: no send was held back by the full inbox");
        }
    }
}
