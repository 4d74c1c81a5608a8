//! Point-to-point semantics on the embedded provider, in every progress mode (the suite is
//! shared with `p2p_ofi.rs`).

/// The builder every test of the suite starts from.
fn builder() -> weft::Builder {
    weft::Runtime::builder().env(false)
}

mod common;
mod p2p_suite;

/// Without the `ofi` feature, asking for a libfabric provider is a clear error, by builder
/// or by environment variable, never a panic.
#[cfg(not(feature = "ofi"))]
#[test]
fn libfabric_providers_need_the_ofi_feature() {
    for p in [weft::Provider::Shm, weft::Provider::OfiShm, weft::Provider::Tcp] {
        let err = weft::Runtime::builder().env(false).provider(p).build_local(2).unwrap_err();
        assert!(matches!(err, weft::Error::InvalidArgument(m) if m.contains("`ofi`")), "{err}");
    }
    assert!("carrier-pigeon".parse::<weft::Provider>().is_err());
    assert_eq!("tcp;ofi_rxm".parse::<weft::Provider>().unwrap(), weft::Provider::Tcp);
}

/// A wait longer than the park limit (50 ms) wakes by the safety net, which is counted; the
/// message still arrives. The message leaves 150 ms after the receiver first parked (on a
/// loaded machine its spins and yields before the park may take longer than a fixed delay).
#[test]
fn long_waits_count_park_timeouts() {
    let rts = builder().progress(weft::ProgressMode::Owner).cris(2).eager_threshold(4096).build_local(2).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            let t0 = std::time::Instant::now();
            while rts[1].counters().parks == 0 && t0.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            std::thread::sleep(std::time::Duration::from_millis(150));
            rts[0].world().send(vec![5u8], 1, 0).unwrap();
        });
        let (b, _) = rts[1].world().recv(Vec::<u8>::with_capacity(1), 0u32, 0).unwrap();
        assert_eq!(b, vec![5]);
    });
    let c = rts[1].counters();
    assert!(c.park_timeouts >= 1 && c.parks >= 1, "{c:?}");
    // Without pool workers every park ends one way or the other.
    assert_eq!(c.parks, c.wakes + c.park_timeouts, "{c:?}");
}

/// With per-thread order under dedicated assignment each sender thread's CRI is its ordering
/// channel: threads of one rank sending to one peer on one communicator keep their own order
/// and no frame waits in the out-of-sequence queue (one shared sequence per source makes
/// frames that travel through different CRIs wait for each other). Round-robin keeps one
/// sequence per source.
#[test]
fn dedicated_cris_are_ordering_channels() {
    use weft::{Assignment, Source, Tag};
    for asg in [Assignment::Dedicated, Assignment::RoundRobin] {
        let rts = builder().progress(weft::ProgressMode::Owner).assignment(asg).per_thread_order(true).cris(3).build_local(2).unwrap();
        std::thread::scope(|s| {
            for t in 0..3i32 {
                let c = rts[0].world();
                s.spawn(move || {
                    for i in 0..300u32 {
                        c.send(vec![t as u32, i], 1, t).unwrap();
                    }
                });
            }
            let c = rts[1].world();
            let mut next = [0u32; 3];
            for _ in 0..900 {
                let (b, st) = c.recv(Vec::<u32>::with_capacity(2), Source::Any, Tag::Any).unwrap();
                let t = st.tag as usize;
                assert_eq!(b, vec![t as u32, next[t]], "{asg}: a thread's messages overtook each other");
                next[t] += 1;
            }
        });
        if asg == Assignment::Dedicated {
            assert_eq!(rts[1].counters().out_of_sequence, 0, "dedicated channels need no reordering");
        }
    }
}

/// Sends queued behind the full inbox of a rank that then goes away fail with `PeerLost`
/// when the sender next waits — they neither hang nor vanish — and the ones that went out
/// before complete normally.
#[test]
fn deferred_sends_to_a_lost_peer_fail() {
    for mode in [weft::ProgressMode::Global, weft::ProgressMode::Owner, weft::ProgressMode::Concurrent] {
        let mut rts = builder().progress(mode).cris(1).inbox_capacity(4).build_local(2).unwrap();
        let gone = rts.pop().unwrap();
        let a = rts[0].world();
        let mut sends: Vec<_> = (0..40u32).map(|i| a.isend(vec![i], 1, 5).unwrap()).collect();
        assert!(rts[0].counters().flow_control_waits > 0, "{mode}: nothing was queued");
        drop(gone);
        let t0 = std::time::Instant::now();
        let _ = weft::wait_all(&mut sends);
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{mode}: waited {:?}", t0.elapsed());
        let (mut ok, mut lost) = (0, 0);
        for r in sends.iter_mut() {
            match r.take().unwrap() {
                Ok(_) => ok += 1,
                Err(weft::Error::PeerLost { rank: 1 }) => lost += 1,
                Err(e) => panic!("{mode}: {e}"),
            }
        }
        assert!(ok >= 1 && lost >= 1 && ok + lost == 40, "{mode}: {ok} sent, {lost} lost");
    }
}

/// Each destination keeps its own queue of deferred frames: while ten destinations stay
/// full, frames queued for an eleventh that drains still go out, in order (one shared
/// queue scanned past a handful of full destinations starved it), and the stalled ones go
/// out once their ranks receive.
#[test]
fn deferred_frames_to_a_draining_rank_pass_stalled_ones() {
    let rts = builder().progress(weft::ProgressMode::Concurrent).cris(1).inbox_capacity(4).build_local(12).unwrap();
    let a = rts[0].world();
    let mut stalled = Vec::new();
    for dst in 1..=10u32 {
        for i in 0..8u8 {
            stalled.push(a.isend(vec![i], dst, 1).unwrap());
        }
    }
    let mut live: Vec<_> = (0..8u8).map(|i| a.isend(vec![i], 11, 2).unwrap()).collect();
    // One thread drives both ranks (each `test` is a progress step of its own rank), so a
    // starved send fails the deadline instead of hanging a receiving thread.
    let c = rts[11].world();
    let mut recvs: Vec<_> = (0..8).map(|_| c.irecv(Vec::<u8>::with_capacity(1), 0u32, 2).unwrap()).collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        // Test every request (no short circuit: each test is a progress step).
        let mut done = true;
        for r in live.iter_mut().chain(recvs.iter_mut()) {
            done &= r.test();
        }
        if done {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "frames to a draining rank starve behind full ones");
    }
    for (i, r) in recvs.iter_mut().enumerate() {
        assert_eq!(r.take().unwrap().unwrap().0, vec![i as u8], "frames to one destination keep their order");
    }
    for r in live.iter_mut() {
        r.take().unwrap().unwrap();
    }
    std::thread::scope(|s| {
        for rt in &rts[1..=10] {
            s.spawn(move || {
                for i in 0..8u8 {
                    let (m, _) = rt.world().recv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
                    assert_eq!(m, vec![i]);
                }
            });
        }
        weft::wait_all(&mut stalled).unwrap();
    });
}

/// More `dup` + `free` cycles than the context table has slots (2048 pairs): ids are
/// given back, so the loop never runs out.
#[test]
fn dup_free_loops_never_run_out_of_context_ids() {
    let rts = builder().cris(2).build_local(2).unwrap();
    std::thread::scope(|s| {
        for (r, rt) in rts.iter().enumerate() {
            s.spawn(move || {
                let peer = 1 - r as u32;
                for i in 0..2500u32 {
                    let c = rt.world().dup().unwrap();
                    assert!(c.context_id() & 0xfff < 4, "slot {:#x}", c.context_id());
                    if r == 0 {
                        c.send(i.to_le_bytes().to_vec(), peer, 0).unwrap();
                    } else {
                        let (m, _) = c.recv(Vec::<u8>::with_capacity(4), peer, 0).unwrap();
                        assert_eq!(m, i.to_le_bytes());
                    }
                    c.free();
                }
            });
        }
    });
}

/// An eager send the transport takes at once completes inside `isend` without a request
/// inner: it still behaves as a completed request everywhere — `test`, `outcome`, `take`
/// (once), `wait_any` / `wait_some`, `.await`, and attached to a sync object it delivers its
/// data with the send's status.
#[test]
fn sends_completed_inside_isend_are_whole_requests() {
    let rts = builder().build_local(2).unwrap();
    let (a, b) = (rts[0].world(), rts[1].world());
    let status = |s: weft::Status| (s.source, s.tag, s.bytes);

    let mut r = a.isend(vec![1u8, 2, 3], 1, 5).unwrap();
    assert!(r.is_complete() && r.test());
    assert_eq!(r.outcome().map(|o| status(o.unwrap())), Some((1, 5, 3)));
    let (buf, st) = r.take().unwrap().unwrap();
    assert_eq!((buf, status(st)), (vec![1, 2, 3], (1, 5, 3)));
    assert!(r.take().is_none(), "taken once");

    let mut reqs = vec![a.isend(vec![9u8], 1, 6).unwrap(), a.isend(vec![8u8; 2], 1, 7).unwrap()];
    assert_eq!(weft::wait_any(&mut reqs), Some(0));
    let mut done = Vec::new();
    assert_eq!(weft::wait_some(&mut reqs, &mut done), 2);
    assert_eq!(done, vec![0, 1]);
    assert!(weft::wait_all(&mut reqs).is_ok());

    let (buf, st) = futures::executor::block_on(a.isend(vec![4u8; 4], 1, 8).unwrap()).unwrap();
    assert_eq!((buf.len(), status(st)), (4, (1, 8, 4)));

    let sync = rts[0].sync_object::<&str>();
    let mut r = a.isend(vec![7u8; 7], 1, 9).unwrap();
    sync.attach(&mut r, "sent").unwrap();
    let c = sync.query().expect("an attached completed send delivers at once");
    assert_eq!((c.data, status(c.outcome.unwrap())), ("sent", (1, 9, 7)));
    assert_eq!(r.take().map(|x| x.unwrap().0.len()), Some(7));
    drop(r);

    // Everything arrived, in order.
    for (tag, len) in [(5, 3), (6, 1), (7, 2), (8, 4), (9, 7)] {
        let (buf, st) = b.recv(Vec::<u8>::with_capacity(8), 0u32, tag).unwrap();
        assert_eq!((buf.len(), st.tag), (len, tag));
    }
}

/// A peer lost around the switch of a tag-partitioned communicator to one order (its first
/// `Tag::Any` receive), before it or after it: what the peer sent before it went is still
/// delivered, in its send order, through the switch; receives that only it could match
/// fail with `PeerLost`, whether posted in a tag partition before the switch or after it;
/// a live peer's messages still arrive, and once no peer is left a `Source::Any` receive
/// fails too; nothing hangs.
#[test]
fn peer_lost_around_the_switch() {
    use std::time::{Duration, Instant};
    use weft::{Error, Source, Tag};
    const SENT: u32 = 40;
    for lost_first in [true, false] {
        for mode in [weft::ProgressMode::Global, weft::ProgressMode::Owner, weft::ProgressMode::Concurrent] {
            let what = format!("{mode}, lost {}", if lost_first { "before the switch" } else { "after it" });
            let mut rts = builder().progress(mode).cris(2).assignment(weft::Assignment::RoundRobin).build_local(3).unwrap();
            let mut gone = rts.pop();
            let mut other = rts.pop();
            let g = gone.as_ref().unwrap().world();
            // Eight tags: several partitions, each with frames of its own.
            for i in 0..SENT {
                g.send(vec![i], 0, (i % 8) as i32).unwrap();
            }
            let a = rts[0].world();
            // Receives only rank 2 could match, posted in their tag partitions.
            let mut pending: Vec<_> = [100, 101].iter().map(|&t| a.irecv(Vec::<u32>::with_capacity(1), 2u32, t).unwrap()).collect();
            // Everything rank 2 sent has reached rank 0's matching (unexpected).
            let deadline = Instant::now() + Duration::from_secs(10);
            while rts[0].counters().unexpected < u64::from(SENT) {
                assert!(Instant::now() < deadline, "{what}: messages not delivered");
                let _ = a.iprobe(1u32, 999).unwrap();
            }
            if lost_first {
                drop(gone.take());
            }
            // The switch: every message of rank 2, in its send order.
            for i in 0..SENT {
                let (b, st) = a.recv(Vec::<u32>::with_capacity(1), 2u32, Tag::Any).unwrap();
                assert_eq!((b, st.tag), (vec![i], (i % 8) as i32), "{what}");
            }
            drop(gone.take());
            let t0 = Instant::now();
            let _ = weft::wait_all(&mut pending);
            for r in pending.iter_mut() {
                assert!(matches!(r.take(), Some(Err(Error::PeerLost { rank: 2 }))), "{what}: a receive posted before the switch");
            }
            // Posted after the loss was handled: refused at once, not left to wait.
            let late = |tag: Tag| match a.irecv(Vec::<u32>::with_capacity(1), 2u32, tag) {
                Err(e) => Err(e),
                Ok(mut r) => {
                    while !r.test() {
                        assert!(t0.elapsed() < Duration::from_secs(10), "{what}: a receive from the lost rank ({tag:?}) waits");
                    }
                    r.wait()
                }
            };
            for tag in [Tag::Is(7), Tag::Any] {
                let r = late(tag);
                assert!(matches!(r, Err(Error::PeerLost { rank: 2 })), "{what}: a receive posted after the loss: {r:?}");
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{what}: PeerLost took {:?}", t0.elapsed());
            other.as_ref().unwrap().world().send(vec![77u32], 0, 3).unwrap();
            let (b, st) = a.recv(Vec::<u32>::with_capacity(1), Source::Any, Tag::Any).unwrap();
            assert_eq!((b, st.source), (vec![77], 1), "{what}");
            // No peer left: a `Source::Any` receive has nobody to wait for.
            drop(other.take());
            let t0 = Instant::now();
            let r = a.irecv(Vec::<u32>::with_capacity(1), Source::Any, Tag::Any).and_then(|mut r| {
                while !r.test() {
                    assert!(t0.elapsed() < Duration::from_secs(10), "{what}: a Source::Any receive with no peer left waits");
                }
                r.wait()
            });
            assert!(matches!(r, Err(Error::PeerLost { rank: 1 })), "{what}: {r:?}");
        }
    }
}

/// A world of more ranks than the machine's memory holds is refused with `InvalidArgument`
/// before anything is allocated (a failed allocation would abort the process): every rank
/// keeps state per other rank, so a million ranks in one process need ~140 TB. The repro's
/// 20,000 ranks (~54 GB) are refused on any machine with less memory than that. A world
/// that fits still builds and carries a message from its last rank to its first.
#[test]
fn a_world_larger_than_memory_is_refused() {
    for ranks in [1u32 << 20, 20_000] {
        match builder().cris(1).inbox_capacity(1).build_local(ranks) {
            Err(weft::Error::InvalidArgument(m)) => assert!(m.contains("memory"), "{ranks} ranks: {m}"),
            Ok(v) => assert!(ranks == 20_000 && v.len() == 20_000, "{ranks} ranks built"),
            Err(e) => panic!("{ranks} ranks: expected InvalidArgument, got {e}"),
        }
    }
    let rts = builder().cris(1).inbox_capacity(4).build_local(1000).unwrap();
    rts[999].world().send(vec![9u8], 0, 1).unwrap();
    assert_eq!(rts[0].world().recv(Vec::<u8>::with_capacity(1), 999u32, 1).unwrap().0, vec![9]);
}

/// Sizes no runtime can have are errors that name the setting, from `build_local`, never a
/// panic ("capacity overflow", arithmetic overflow) or an allocation no machine can make:
/// an inbox above `Config::MAX_INBOX_CAPACITY` frames, a CRI count outside
/// `1..=Config::MAX_CRIS`, more inbox frames per rank than `Config::MAX_RANK_INBOX_FRAMES`,
/// an eager threshold above `Config::MAX_EAGER_THRESHOLD`, and a world of `u32::MAX` ranks.
/// The largest accepted values build and carry messages.
#[test]
fn absurd_sizes_are_errors_not_panics() {
    use weft::Config;
    fn refused(b: weft::Builder, ranks: u32, what: &str) {
        match b.build_local(ranks) {
            Err(weft::Error::InvalidArgument(m)) => assert!(m.contains(what), "{what}: {m}"),
            other => panic!("{what}: expected InvalidArgument, got {:?}", other.map(|r| r.len())),
        }
    }
    for n in [0, Config::MAX_INBOX_CAPACITY + 1, usize::MAX / 4, usize::MAX] {
        refused(builder().cris(1).inbox_capacity(n), 2, "Builder::inbox_capacity");
    }
    for n in [0, Config::MAX_CRIS + 1, usize::MAX] {
        refused(builder().cris(n), 2, "Builder::cris");
    }
    refused(builder().cris(Config::MAX_CRIS).inbox_capacity(Config::MAX_INBOX_CAPACITY), 2, "Builder::inbox_capacity");
    for n in [Config::MAX_EAGER_THRESHOLD + 1, usize::MAX] {
        refused(builder().cris(1).eager_threshold(n), 2, "Builder::eager_threshold");
    }
    refused(builder().cris(1).inbox_capacity(4), u32::MAX, "ranks");
    refused(builder().cris(1), 0, "rank");

    // The limits themselves are accepted: a rank of one CRI with the largest inbox (it
    // sends to itself), and the largest eager threshold (a message far above the default
    // one still completes inside `isend`, before any receive is posted).
    let rts = builder().cris(1).inbox_capacity(Config::MAX_INBOX_CAPACITY).build_local(1).unwrap();
    assert_eq!(rts[0].config().inbox_capacity, Config::MAX_INBOX_CAPACITY);
    rts[0].world().send(vec![1u8, 2], 0, 3).unwrap();
    assert_eq!(rts[0].world().recv(Vec::<u8>::with_capacity(2), 0u32, 3).unwrap().0, vec![1, 2]);
    drop(rts);
    for threshold in [0, Config::MAX_EAGER_THRESHOLD] {
        let rts = builder().cris(1).eager_threshold(threshold).build_local(2).unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let r = a.isend(data.clone(), 1, 4).unwrap();
        assert_eq!(r.is_complete(), threshold > 0, "eager threshold {threshold}");
        let (m, st) = b.recv(Vec::<u8>::with_capacity(data.len()), 0u32, 4).unwrap();
        assert_eq!((m, st.bytes), (data, 100_000));
        r.wait().unwrap();
    }
}

/// A yield window longer than a wait can last (up to `Duration::MAX`) is a wait that yields
/// until the park limit, not an overflow of `Instant + Duration` inside the wait. Rounds of a
/// late send repeat until the receiver has parked (it may find the message without parking
/// when its thread starts late), so the parking wait is exercised.
#[test]
fn a_huge_yield_window_is_a_long_yield() {
    for window in [std::time::Duration::from_secs(3600), std::time::Duration::MAX] {
        let rts = builder().progress(weft::ProgressMode::Owner).cris(1).yield_window(window).build_local(2).unwrap();
        for round in 0u8.. {
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(std::time::Duration::from_millis(80));
                    rts[0].world().send(vec![round], 1, 0).unwrap();
                });
                let (b, _) = rts[1].world().recv(Vec::<u8>::with_capacity(1), 0u32, 0).unwrap();
                assert_eq!(b, vec![round]);
            });
            let c = rts[1].counters();
            if c.parks >= 1 {
                break;
            }
            assert!(round < 20, "{window:?}: the receiver never parked: {c:?}");
        }
    }
}

/// Drives rank `rt` alone until it has received `n` more frames than `before` (no receive
/// posted), failing the test after 10 s.
fn progress_until_received(rt: &weft::Runtime, before: u64, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rt.counters().messages_received < before + n {
        assert!(std::time::Instant::now() < deadline, "frames not delivered within 10 s");
        rt.progress();
    }
}

/// The snapshot's `out_of_sequence` and `unexpected`. One sender thread sends 30 messages
/// of one tag through CRIs taken round-robin, before the receiver looks: they wait at its
/// three CRIs in rotation, and a progress pass drains one CRI's batch before the next, so
/// of the first batch at most one frame is the next in sequence and the others wait
/// (`out_of_sequence`). No receive is posted yet, so every one of the 30 arrivals is
/// `unexpected`, each counted once; the receives then get them in send order. On a
/// communicator that allows overtaking the same traffic is matched as it comes: nothing
/// waits, nothing is out of sequence.
#[test]
fn out_of_sequence_and_unexpected_arrivals_are_counted() {
    use weft::{Assignment, ProgressMode};
    const N: u32 = 30;
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let rts = builder().progress(mode).assignment(Assignment::RoundRobin).cris(3).build_local(2).unwrap();
        for overtaking in [false, true] {
            let (c0, c1) = std::thread::scope(|s| {
                let h = s.spawn(|| rts[1].world().dup_with(overtaking).unwrap());
                (rts[0].world().dup_with(overtaking).unwrap(), h.join().unwrap())
            });
            let before = rts[1].counters();
            let mut sends: Vec<_> = (0..N).map(|i| c0.isend(vec![i], 1, 5).unwrap()).collect();
            weft::wait_all(&mut sends).unwrap();
            progress_until_received(&rts[1], before.messages_received, u64::from(N));
            let after = rts[1].counters();
            let what = format!("{mode}, overtaking {overtaking}");
            assert_eq!(after.unexpected - before.unexpected, u64::from(N), "{what}: {after:?}");
            let early = after.out_of_sequence - before.out_of_sequence;
            if overtaking {
                assert_eq!(early, 0, "{what}: overtaking skips the sequence check");
            } else {
                assert!(early >= u64::from(N) / 3 - 1, "{what}: only {early} frames out of sequence");
            }
            let mut got: Vec<u32> = (0..N).map(|_| c1.recv(Vec::<u32>::with_capacity(1), 0u32, 5).unwrap().0[0]).collect();
            if overtaking {
                got.sort_unstable();
            }
            assert_eq!(got, (0..N).collect::<Vec<_>>(), "{what}");
            assert_eq!(rts[1].counters().unexpected, after.unexpected, "{what}: receiving queued messages is not an arrival");
        }
    }
}

/// `match_nanos` counts time in matching only with match timing on
/// (`Builder::match_timing`): after the same traffic it is positive with it, zero without.
#[test]
fn match_time_is_counted_only_with_match_timing() {
    for on in [false, true] {
        let rts = builder().match_timing(on).cris(2).build_local(2).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..200u32 {
                    rts[0].world().send(vec![i], 1, 3).unwrap();
                }
            });
            for i in 0..200u32 {
                assert_eq!(rts[1].world().recv(Vec::<u32>::with_capacity(1), 0u32, 3).unwrap().0, vec![i]);
            }
        });
        let c = rts[1].counters();
        assert!(c.messages_received >= 200, "{c:?}");
        if on {
            assert!(c.match_nanos > 0, "match timing on: {c:?}");
        } else {
            assert_eq!(c.match_nanos, 0, "match timing off: {c:?}");
        }
    }
}
