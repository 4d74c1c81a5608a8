//! Faults in the middle of a rendezvous on the embedded provider, in every progress mode: a
//! rank fails in process (its transport closes, as when its process dies: peers' sends and
//! reads to it fail, its registrations are withdrawn) between the `Rts` and the match,
//! during the receiver's read, or as the receiver before its `Fin`. The survivor gets the
//! whole message or `PeerLost`, never a short or garbled `Ok`, and never waits for ever (each
//! scenario is bounded). The failed rank's runtime is dropped afterwards on a thread of its
//! own (its drop waits a bounded while for a `Fin` that cannot come), joined at the end.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{Error, ProgressMode, Runtime};

// The integration tests' bound on a scenario (`within`), one helper for both.
#[path = "../tests/common/mod.rs"]
pub(crate) mod common;
use common::within;

const MODES: [ProgressMode; 3] = [ProgressMode::Concurrent, ProgressMode::Owner, ProgressMode::Global];

/// The rendezvous message (well above the eager threshold; its copy takes a while).
const BIG: usize = 16 << 20;

fn big() -> Vec<u8> {
    (0..BIG).map(|i| (i % 251) as u8).collect()
}

fn pair(mode: ProgressMode) -> Vec<Runtime> {
    Runtime::builder().env(false).progress(mode).cris(1).eager_threshold(4096).build_local(2).unwrap()
}

/// Probes on `rt`'s world until the `Rts` of (`from`, `tag`) is queued there.
fn until_rts_arrived(rt: &Runtime, from: u32, tag: i32) {
    let t0 = Instant::now();
    while rt.world().iprobe(from, tag).unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the Rts never arrived");
    }
}

/// After the loss of `lost`, `rt` can neither receive from it nor send to it.
fn lost_for_good(rt: &Runtime, lost: u32, what: &str) {
    let c = rt.world();
    assert_eq!(c.recv(Vec::<u8>::with_capacity(8), lost, 3).map(|_| ()), Err(Error::PeerLost { rank: lost }), "{what}: a later receive");
    assert_eq!(c.send(vec![1u8], lost, 3).map(|_| ()), Err(Error::PeerLost { rank: lost }), "{what}: a later send");
}

/// Drops `rt` on a thread of its own (a failed rank's drop may wait for a `Fin`).
fn drop_later(rt: Runtime) -> JoinHandle<()> {
    std::thread::spawn(move || drop(rt))
}

/// A closer thread: fails rank `failing` (closes its transport) as soon as rank `reader`
/// has a rendezvous read in flight — recorded before the copy starts, so the close lands
/// during it or just after — or, should the thread miss the read (a copy of a few
/// milliseconds on a loaded machine), once `done` is set. Returns whether it saw the read.
fn fail_during_read(rts: Arc<Vec<Runtime>>, reader: usize, failing: usize, done: Arc<AtomicBool>) -> JoinHandle<bool> {
    std::thread::spawn(move || {
        let mut saw = false;
        // Relaxed: a flag that only ends the watch.
        while !saw && !done.load(Ordering::Relaxed) {
            saw = rts[reader].engine.reads_pending();
        }
        rts[failing].engine.transport.close();
        if !saw {
            eprintln!("the close came after the read");
        }
        saw
    })
}

/// The sender fails after its `Rts` reached the receiver and before the receive is posted:
/// the receive, matched with the `Rts`, reads from a rank that is gone and fails with
/// `PeerLost` — never an `Ok` over bytes that were not read.
#[test]
fn sender_lost_between_its_rts_and_the_match_fails_the_receive() {
    let mut drops = Vec::new();
    for mode in MODES {
        let what = format!("{mode:?}: sender lost after its Rts");
        let rts = pair(mode);
        let rts = within(30, &what.clone(), move || {
            drop(rts[0].world().isend(big(), 1, 7).unwrap());
            until_rts_arrived(&rts[1], 0, 7);
            rts[0].engine.transport.close();
            let got = rts[1].world().recv(Vec::<u8>::with_capacity(BIG), 0u32, 7);
            assert_eq!(got.map(|(b, st)| (b.len(), st.bytes)), Err(Error::PeerLost { rank: 0 }), "{what}");
            lost_for_good(&rts[1], 0, &what);
            rts
        });
        drops.extend(rts.into_iter().map(drop_later));
    }
    for d in drops {
        d.join().unwrap();
    }
}

/// The sender fails while the receiver copies its message: the receive gets all of it
/// (the copy holds the sender's registration, which the failure withdraws only after it)
/// or `PeerLost` (the failure came first), never part of it; the sender is then lost for
/// good.
#[test]
fn sender_lost_during_the_read_gives_the_whole_message_or_peer_lost() {
    let mut drops = Vec::new();
    for mode in MODES {
        let what = format!("{mode:?}: sender lost during the read");
        let rts = Arc::new(pair(mode));
        let rts = within(30, &what.clone(), move || {
            let want = big();
            let recv = rts[1].world().irecv(Vec::<u8>::with_capacity(BIG), 0u32, 7).unwrap();
            let done = Arc::new(AtomicBool::new(false));
            let closer = fail_during_read(rts.clone(), 1, 0, done.clone());
            drop(rts[0].world().isend(want.clone(), 1, 7).unwrap());
            let got = recv.wait();
            done.store(true, Ordering::Relaxed);
            closer.join().unwrap();
            match got {
                Ok((got, st)) => {
                    assert_eq!((st.source, st.bytes, got.len()), (0, BIG, BIG), "{what}");
                    assert!(got == want, "{what}: an Ok receive with wrong bytes");
                }
                Err(e) => assert_eq!(e, Error::PeerLost { rank: 0 }, "{what}"),
            }
            lost_for_good(&rts[1], 0, &what);
            rts
        });
        drops.extend(Arc::try_unwrap(rts).unwrap().into_iter().map(drop_later));
    }
    for d in drops {
        d.join().unwrap();
    }
}

/// The receiver goes before its `Fin`: dropped with the `Rts` queued, unreceived, or failed
/// while it reads. The sender's send ends — `PeerLost`, or `Ok` where the `Fin` left
/// before the failure — and never waits for ever; a read that was under way still fills
/// the receive whole.
#[test]
fn receiver_gone_before_its_fin_ends_the_send() {
    let mut drops = Vec::new();
    for mode in MODES {
        let what = format!("{mode:?}: receiver dropped with the Rts queued");
        let mut rts = pair(mode);
        let r0 = within(30, &what.clone(), move || {
            let r1 = rts.pop().unwrap();
            let r0 = rts.pop().unwrap();
            {
                let send = r0.world().isend(big(), 1, 7).unwrap();
                until_rts_arrived(&r1, 0, 7);
                let dropped = drop_later(r1);
                assert_eq!(send.wait().map(|_| ()), Err(Error::PeerLost { rank: 1 }), "{what}");
                dropped.join().unwrap();
            }
            lost_for_good(&r0, 1, &what);
            r0
        });
        drops.push(drop_later(r0));

        let what = format!("{mode:?}: receiver failed during its read");
        let rts = Arc::new(pair(mode));
        let read_whole = Arc::new(AtomicBool::new(false));
        let whole = read_whole.clone();
        let inner = what.clone();
        let rts = within(30, &what, move || {
            let what = inner;
            let want = big();
            let done = Arc::new(AtomicBool::new(false));
            let closer = fail_during_read(rts.clone(), 1, 1, done.clone());
            std::thread::scope(|s| {
                // The receiver waits (and so progresses) on a thread of its own. Its own read
                // is from a live sender: it completes, whole.
                let receiver = s.spawn(|| {
                    let got = rts[1].world().recv(Vec::<u8>::with_capacity(BIG), 0u32, 7);
                    done.store(true, Ordering::Relaxed);
                    got
                });
                match rts[0].world().send(want.clone(), 1, 7) {
                    Ok((_, st)) => assert_eq!((st.source, st.bytes), (1, BIG), "{what}"),
                    Err(e) => assert_eq!(e, Error::PeerLost { rank: 1 }, "{what}"),
                }
                let (got, st) = receiver.join().unwrap().unwrap_or_else(|e| panic!("{what}: the failed rank's own receive: {e}"));
                whole.store(got == want && st.bytes == BIG, Ordering::Relaxed);
            });
            closer.join().unwrap();
            lost_for_good(&rts[0], 1, &what);
            rts
        });
        assert!(read_whole.load(Ordering::Relaxed), "{what}: a receive with wrong bytes");
        drops.extend(Arc::try_unwrap(rts).unwrap().into_iter().map(drop_later));
    }
    for d in drops {
        d.join().unwrap();
    }
}
