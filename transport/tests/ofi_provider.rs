//! The libfabric provider below the runtime: frames with flow control, rendezvous reads,
//! transport-level RMA (put/get/fetch-and-op/CAS/flush), lost peers — on shm and
//! tcp;ofi_rxm, two ranks in this process.
#![cfg(feature = "ofi")]

use std::time::{Duration, Instant};

use weft_transport::ofi::FetchOp;
use weft_transport::ofi_provider::{world, OfiOptions, OfiRank, Opened, RemoteMem, COMPACT_HEADER, SAME_HOST_SMALL_FRAME};
use weft_transport::{Error, FrameKind, Header, ReadStart, SendError};

const PROVIDERS: [&str; 2] = ["shm", "tcp;ofi_rxm"];
const DEADLINE: Duration = Duration::from_secs(20);

fn loopback() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
    });
}

fn pair(provider: &str, recv_slots: usize) -> Vec<OfiRank> {
    pair_with(provider, recv_slots, true)
}

fn pair_with(provider: &str, recv_slots: usize, same_host_lane: bool) -> Vec<OfiRank> {
    loopback();
    let opts = OfiOptions {
        provider: provider.into(),
        cris: 2,
        eager_capacity: 1024,
        recv_slots,
        send_slots: 8,
        terms: Vec::new(),
        same_host_lane,
    };
    world(&opts, 2).unwrap()
}

fn header(seq: u32, len: usize) -> Header {
    Header { src_cri: 1, ..Header::eager(0, 0, 7, seq, len) }
}

/// A sender faster than its receiver is pushed back, never loses a frame, and never grows
/// memory. Through libfabric alone every frame arrives in order; with the same-host lane,
/// small frames take its ring of small frames and larger ones its ring of large ones, each
/// ring in order (the runtime orders the two by sequence number, as it does frames of
/// several CRIs).
#[test]
fn frames_flow_control_loses_nothing() {
    for p in PROVIDERS {
        for lane in [false, true] {
            let r = pair_with(p, 16, lane);
            assert_eq!(r[0].same_host_peers(), if lane { 2 } else { 0 }, "{p}");
            let hosts = r[1].host_keys();
            assert_eq!(hosts.map(<[u64]>::len), lane.then_some(2), "{p}: both ranks' hosts known with the lane, none without");
            assert!(hosts.map_or(true, |h| h[0] == h[1]), "{p}: one host");
            assert_eq!(r[0].host_keys(), hosts, "{p}: the same on every rank");
            let total = 5000u32;
            let (mut sent, mut got, mut would_block) = (0u32, 0u32, 0u64);
            let mut seen = vec![false; total as usize];
            // The last sequence number seen per path: small frames, large frames.
            let mut last = [None::<u32>; 2];
            let t0 = Instant::now();
            while got < total {
                assert!(t0.elapsed() < DEADLINE, "{p}: stuck at sent {sent} got {got}");
                // The sender pushes as fast as it can; every 64th attempt the receiver polls.
                while sent < total {
                    let data = vec![(sent % 251) as u8; (sent as usize * 13) % 1000];
                    match r[0].send(1, 1, &header(sent, data.len()), &data) {
                        Ok(()) => sent += 1,
                        Err(SendError::WouldBlock) => {
                            would_block += 1;
                            break;
                        }
                        Err(e) => panic!("{p}: {e:?}"),
                    }
                    if sent % 64 == 0 {
                        break;
                    }
                }
                r[1].poll(1, 64, |f| {
                    let seq = f.header.seq;
                    let n = (seq as usize * 13) % 1000;
                    let path = usize::from(lane && COMPACT_HEADER + n > SAME_HOST_SMALL_FRAME);
                    if lane {
                        assert!(last[path].map_or(true, |l| l < seq), "{p}: order on path {path}: {seq} after {:?}", last[path]);
                        last[path] = Some(seq);
                    } else {
                        assert_eq!(seq, got, "{p}: order");
                    }
                    assert!(!std::mem::replace(&mut seen[seq as usize], true), "{p}: frame {seq} twice");
                    assert_eq!(f.payload.as_slice().len(), n);
                    assert!(f.payload.as_slice().iter().all(|&b| b == (seq % 251) as u8));
                    got += 1;
                    r[1].recycle(f.payload);
                });
            }
            println!("{p} (same-host lane {lane}): {total} frames, {would_block} WouldBlock");
            // Nothing arrives on the other CRI, and nothing is left.
            assert_eq!(r[1].poll(0, 64, |_| panic!("frame on the wrong CRI")), 0);
        }
    }
}

/// The lane is each rank's own choice: a rank without it still receives from a rank with
/// it (which sends to it through libfabric), and the other way round.
#[test]
fn a_rank_without_the_same_host_lane_talks_to_one_with_it() {
    loopback();
    for p in PROVIDERS {
        let opts = |same_host_lane| OfiOptions {
            provider: p.into(),
            cris: 1,
            eager_capacity: 1024,
            recv_slots: 16,
            send_slots: 8,
            terms: Vec::new(),
            same_host_lane,
        };
        let opened = [Opened::open(&opts(true), 2).unwrap(), Opened::open(&opts(false), 2).unwrap()];
        let blobs: Vec<Vec<u8>> = opened.iter().map(Opened::address_blob).collect();
        let r: Vec<OfiRank> = opened.into_iter().enumerate().map(|(i, o)| o.connect(i as u32, &blobs).unwrap()).collect();
        assert_eq!((r[0].same_host_peers(), r[1].same_host_peers()), (1, 0), "{p}: rank 0 reaches itself only");
        assert_eq!((r[0].host_keys(), r[1].host_keys()), (None, None), "{p}: rank 1 published no host");
        for (from, to) in [(0usize, 1usize), (1, 0), (0, 0)] {
            for seq in 0..20u32 {
                let data = [seq as u8; 8];
                let t0 = Instant::now();
                while let Err(e) = r[from].send(to as u32, 0, &header(seq, data.len()), &data) {
                    assert!(matches!(e, SendError::WouldBlock) && t0.elapsed() < DEADLINE, "{p}: {e:?}");
                    r[to].poll(0, 0, drop);
                }
            }
            let mut got = Vec::new();
            let t0 = Instant::now();
            while got.len() < 20 {
                assert!(t0.elapsed() < DEADLINE, "{p}: {from} -> {to}: {} of 20 frames", got.len());
                r[to].poll(0, 64, |f| {
                    assert_eq!(f.payload.as_slice(), [f.header.seq as u8; 8]);
                    got.push(f.header.seq);
                });
            }
            assert_eq!(got, (0..20).collect::<Vec<_>>(), "{p}: {from} -> {to}");
        }
    }
}

#[test]
fn oversized_frame_is_refused_not_truncated() {
    for p in PROVIDERS {
        let r = pair(p, 16);
        let big = vec![0u8; 1025];
        assert!(matches!(r[0].send(1, 0, &header(0, big.len()), &big), Err(SendError::Invalid(_))));
    }
}

#[test]
fn rma_put_get_atomics_and_flush() {
    for p in PROVIDERS {
        let r = pair(p, 16);
        let mut window = vec![0u64; 4];
        // SAFETY: `window` outlives the registration (deregistered below) and is only read
        // by this test after the flushes that complete the remote operations.
        let region = unsafe { r[1].register_window(window.as_mut_ptr().cast(), 32) }.unwrap();
        let to = RemoteMem { rank: 1, region };
        let value = 0x1122_3344_5566_7788u64.to_le_bytes();
        // SAFETY: `value` lives until the flush below.
        unsafe { r[0].put(0, &to, 0, &value) }.unwrap();
        r[0].flush(0).unwrap();
        let mut back = [0u8; 8];
        // SAFETY: `back` is untouched until the flush.
        unsafe { r[0].get(1, &to, 0, &mut back) }.unwrap();
        r[0].flush(1).unwrap();
        assert_eq!(back, value, "{p}: get after put");
        assert_eq!(r[0].fetch_op(0, &to, 8, FetchOp::Sum, 5).unwrap(), 0);
        assert_eq!(r[0].fetch_op(0, &to, 8, FetchOp::Sum, 7).unwrap(), 5);
        assert_eq!(r[0].compare_swap(0, &to, 16, 0, 42).unwrap(), 0);
        assert_eq!(r[0].compare_swap(0, &to, 16, 0, 43).unwrap(), 42, "{p}: CAS must fail on mismatch");
        r[1].deregister(region.key);
        assert_eq!(window, vec![0x1122_3344_5566_7788, 12, 42, 0], "{p}");
        // Out of bounds is an error, not a crash.
        assert!(r[0].fetch_op(0, &to, 32, FetchOp::Sum, 1).is_err());
    }
}

/// An atomic in flight to a rank that is lost before it served it: libfabric never
/// completes it (`shm` serves atomics in the target's progress), so its flush fails with
/// `PeerLost` soon after the loss instead of waiting out the flush's deadline. The CRI then
/// serves the live ranks as before on `tcp;ofi_rxm`; on `shm`, whose endpoint reads its
/// answers in order, it refuses at once, and the rank's other CRIs serve them.
#[test]
fn an_atomic_in_flight_to_a_rank_lost_fails_and_the_cri_goes_on() {
    for p in PROVIDERS {
        loopback();
        let opts = OfiOptions {
            provider: p.into(),
            cris: 2,
            eager_capacity: 1024,
            recv_slots: 16,
            send_slots: 8,
            terms: Vec::new(),
            same_host_lane: true,
        };
        let r = world(&opts, 3).unwrap();
        let mut words = [[0u64; 2]; 3];
        let [_, w1, w2] = &mut words;
        // SAFETY: the words outlive their registrations (deregistered below).
        let (k1, k2) = unsafe {
            (r[1].register_window(w1.as_mut_ptr().cast(), 16).unwrap(), r[2].register_window(w2.as_mut_ptr().cast(), 16).unwrap())
        };
        let (to1, to2) = (RemoteMem { rank: 1, region: k1 }, RemoteMem { rank: 2, region: k2 });
        // Both targets reached once, so that what follows waits on nothing but the loss.
        assert_eq!(r[0].compare_swap(0, &to1, 0, 0, 1), Ok(0), "{p}");
        assert_eq!(r[0].compare_swap(0, &to2, 0, 0, 1), Ok(0), "{p}");
        // Rank 1 serves nothing from now on: its RMA endpoint's progress is held, as a
        // killed process's is.
        let hold = r[1].hold_cri_state(0);
        let (outcome, after_loss) = std::thread::scope(|s| {
            let cas = s.spawn(|| {
                let out = r[0].compare_swap(0, &to1, 0, 1, 2);
                (out, Instant::now())
            });
            std::thread::sleep(Duration::from_millis(200));
            assert!(!cas.is_finished(), "{p}: an atomic to a rank that serves nothing completed");
            r[0].mark_lost(1);
            let lost_at = Instant::now();
            let (out, at) = cas.join().unwrap();
            (out, at.saturating_duration_since(lost_at))
        });
        assert_eq!(outcome, Err(Error::PeerLost { rank: 1 }), "{p}");
        assert!(after_loss < Duration::from_secs(5), "{p}: the atomic ended {after_loss:?} after the loss");
        // On `tcp;ofi_rxm` the same CRI goes on with the live rank: its flushes wait for its
        // own operations. On `shm` nothing the endpoint sends completes any more (its
        // answers queue behind the lost rank's): the CRI refuses at once, naming the lost
        // rank, and the rank's other CRI serves the live rank.
        let cri = if p == "shm" {
            let t0 = Instant::now();
            assert_eq!(r[0].compare_swap(0, &to2, 0, 1, 3), Err(Error::PeerLost { rank: 1 }), "{p}");
            assert_eq!(r[0].fetch_op(0, &to2, 8, FetchOp::Sum, 5), Err(Error::PeerLost { rank: 1 }), "{p}");
            assert!(t0.elapsed() < Duration::from_secs(1), "{p}: the refusals took {:?}", t0.elapsed());
            1
        } else {
            0
        };
        assert_eq!(r[0].compare_swap(cri, &to2, 0, 1, 3), Ok(1), "{p}");
        assert_eq!(r[0].fetch_op(cri, &to2, 8, FetchOp::Sum, 5), Ok(0), "{p}");
        let value = 9u64.to_le_bytes();
        // SAFETY: `value` lives until the flush below.
        unsafe { r[0].put(cri, &to2, 8, &value) }.unwrap();
        assert_eq!(r[0].flush(cri), Ok(()), "{p}");
        assert_eq!(r[0].fetch_op(cri, &to2, 8, FetchOp::Read, 0), Ok(9), "{p}");
        drop(hold);
        r[2].deregister(k2.key);
        r[1].deregister(k1.key);
        drop(r);
        assert_eq!(words[2], [3, 9], "{p}");
    }
}

/// A rendezvous read: through libfabric, posted and reported later; through the same-host
/// lane, one copy done when `start_read` returns. Either way the data arrives, and a lost
/// peer fails what comes after at once.
#[test]
fn rendezvous_read_and_lost_peer() {
    for (p, lane) in PROVIDERS.iter().flat_map(|p| [(*p, false), (*p, true)]) {
        let r = pair_with(p, 16, lane);
        let data: Vec<u8> = (0..(3 << 20)).map(|i: usize| (i * 7) as u8).collect();
        // SAFETY: `data` is not modified and outlives the registration.
        let key = unsafe { r[0].register(data.as_ptr(), data.len()) }.unwrap();
        let mut rts = header(0, data.len());
        rts.kind = FrameKind::Rts;
        rts.key = key;
        while let Err(e) = r[0].send(1, 0, &rts, &[]) {
            assert_eq!(e, SendError::WouldBlock);
        }
        let t0 = Instant::now();
        let mut got = None;
        while got.is_none() {
            assert!(t0.elapsed() < DEADLINE);
            r[1].poll(0, 8, |f| got = Some(f.header));
        }
        let h = got.unwrap();
        let mut dst = vec![0u8; data.len()];
        // SAFETY: `dst` is not touched until the read is reported below.
        let started = unsafe { r[1].start_read(&h, dst.as_mut_ptr(), dst.len(), 7) }.unwrap();
        if lane {
            assert_eq!(started, ReadStart::Done, "{p}: a same-host read is one copy");
            assert_eq!(r[1].poll_reads(4, |_, _| panic!("{p}: nothing was in flight")), 0);
        } else {
            assert_eq!(started, ReadStart::InFlight, "{p}");
            let mut reported = None;
            while reported.is_none() {
                assert!(t0.elapsed() < DEADLINE, "{p}: read not reported");
                // The sender's endpoint is served by its own watcher here (it is idle).
                r[1].poll_reads(4, |token, outcome| reported = Some((token, outcome)));
            }
            assert_eq!(reported, Some((7, Ok(()))), "{p}");
        }
        assert!(dst == data, "{p} (lane {lane}): rendezvous data");
        // SAFETY: an empty read touches nothing.
        assert_eq!(unsafe { r[1].start_read(&h, dst.as_mut_ptr(), 0, 8) }, Ok(ReadStart::Done));
        // The same read again, and rank 0 is lost while it is in flight: it ends with
        // `PeerLost`, or (every chunk done first) with the whole message; never with a
        // partial `Ok`.
        let mut again = vec![0u8; data.len()];
        // SAFETY: `again` is not touched until the read is reported below.
        let started = unsafe { r[1].start_read(&h, again.as_mut_ptr(), again.len(), 10) }.unwrap();
        let epoch = r[1].lost_epoch();
        if lane {
            // A same-host read is never in flight: whole when `start_read` returns.
            assert_eq!(started, ReadStart::Done, "{p}");
            assert!(again == data, "{p}: a same-host read reported whole is not");
            r[1].mark_lost(0);
        } else {
            assert_eq!(started, ReadStart::InFlight, "{p}");
            r[1].mark_lost(0);
            let mut reported = None;
            while reported.is_none() {
                assert!(t0.elapsed() < DEADLINE, "{p}: the read from a lost peer was never reported");
                r[1].poll_reads(4, |token, outcome| reported = Some((token, outcome)));
            }
            match reported {
                Some((10, Err(Error::PeerLost { rank: 0 }))) => {}
                Some((10, Ok(()))) => assert!(again == data, "{p}: a read reported whole is not"),
                other => panic!("{p}: the read from a lost peer: {other:?}"),
            }
        }
        assert_ne!(r[1].lost_epoch(), epoch);
        r[0].deregister(key);
        // Rank 0 is lost: everything towards it fails at once.
        assert!(!r[1].is_alive(0));
        assert_eq!(r[1].send(0, 0, &header(1, 0), &[]), Err(SendError::PeerLost));
        // SAFETY: nothing is posted when the read is refused.
        assert!(matches!(unsafe { r[1].start_read(&h, dst.as_mut_ptr(), dst.len(), 9) }, Err(Error::PeerLost { rank: 0 })));
    }
}

#[test]
fn unknown_provider_is_an_error() {
    loopback();
    let opts = OfiOptions { provider: "no-such-provider".into(), ..OfiOptions::default() };
    assert!(matches!(world(&opts, 2), Err(Error::Transport { op: "fi_getinfo", .. })));
    let opts = OfiOptions { cris: 0, ..OfiOptions::default() };
    assert!(matches!(world(&opts, 2), Err(Error::InvalidArgument(_))));
    // A world of no ranks is refused too (it used to be an empty `Ok`).
    for p in PROVIDERS {
        let opts = OfiOptions { provider: p.into(), ..OfiOptions::default() };
        assert!(matches!(world(&opts, 0), Err(Error::InvalidArgument(_))), "{p}");
    }
}
