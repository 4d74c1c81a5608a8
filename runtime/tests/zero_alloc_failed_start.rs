//! Failed starts of persistent requests allocate nothing again: a persistent collective
//! whose start failed keeps the buffers of the messages that start left in flight, and a
//! persistent send or receive whose start is refused keeps its buffer (counting global
//! allocator; the two tests count one at a time, one only allocations of a block's size and
//! more, the other only its own thread's, so the harness's start of the other test is never
//! counted).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use weft::{Communicator, Error, Persistent, Runtime, Source, Tag};

#[path = "common/counting.rs"]
mod counting;

/// Held by each test while it runs: the count is global, so the tests count one at a time.
static COUNTING: Mutex<()> = Mutex::new(());

/// Elements of one alltoall block: 4 KiB of `u64`, sent eagerly (so a send to a survivor
/// completes at once, its buffer free again), far above anything else a failed start
/// allocates (its failure notices, 8 bytes each).
const BLOCK: usize = 512;

/// The collective: an alltoall of one block per rank.
fn init(c: &Communicator) -> Persistent<'_, Vec<u64>> {
    c.alltoall_init(vec![0u64; 3 * BLOCK]).unwrap()
}

/// Starts every request of `reqs` and tests them until none is active (bounded), one thread
/// driving all the ranks; each start must fail with `PeerLost` for the rank that left. Then
/// one step of progress on every rank of `cs`, as any later call would make, so that the
/// messages sent between the survivors arrive.
fn fail_once(cs: &[Communicator], reqs: &mut [Persistent<'_, Vec<u64>>], lost: u32) {
    for r in reqs.iter_mut() {
        r.start().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while reqs.iter().any(Persistent::is_active) {
        assert!(Instant::now() < deadline, "a start that waits for a lost rank never failed");
        for r in reqs.iter_mut().filter(|r| r.is_active()) {
            if let Some(outcome) = r.test() {
                assert_eq!(outcome, Err(Error::PeerLost { rank: lost }));
            }
        }
    }
    for c in cs {
        assert_eq!(c.iprobe(Source::Any, Tag::Any), Ok(None));
    }
}

/// Two ranks of three start an alltoall again and again after the third left: each start
/// posts the receive from the survivor, then fails at the receive from the lost rank. The
/// survivor's receive, cancelled, gives its buffer back for the next start.
#[test]
fn starts_after_a_failed_start_allocate_no_message_buffer() {
    let _one_at_a_time = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let mut rts = Runtime::builder().env(false).cris(1).build_local(3).unwrap();
    let last = rts.pop().unwrap();
    let cs: Vec<Communicator> = rts.iter().map(|rt| rt.world().clone()).collect();
    let mut inits: Vec<Persistent<'_, Vec<u64>>> = std::thread::scope(|s| {
        let hs: Vec<_> = cs.iter().map(|c| s.spawn(|| init(c))).collect();
        // The third rank makes its init (a collective), then leaves with its runtime.
        drop(init(last.world()));
        drop(last);
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for _ in 0..10 {
        fail_once(&cs, &mut inits, 2);
    }
    let n = counting::allocations_of_at_least(BLOCK * 8, || {
        for _ in 0..20 {
            fail_once(&cs, &mut inits, 2);
        }
    });
    assert_eq!(n, 0, "message buffers allocated in 40 starts after a failed start");
}

/// Persistent sends and receives to and from a rank that left, beside a pair with a
/// survivor that keeps working: every start to or from the lost rank is refused with
/// `PeerLost` and leaves the request inactive with its buffer (eager and rendezvous sends,
/// a receive), so the next start tries again; once warm, rounds of such refused starts
/// and the survivors' messages allocate nothing at all. (A refused start used to take the
/// buffer with it: later starts failed for want of one.)
#[test]
fn refused_persistent_starts_keep_their_buffers() {
    let _one_at_a_time = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    /// Above the eager threshold (rendezvous).
    const BIG: usize = 64 << 10;
    let mut rts = Runtime::builder().env(false).cris(1).eager_threshold(4096).build_local(3).unwrap();
    drop(rts.pop());
    let (c0, c1) = (rts[0].world(), rts[1].world());
    let mut to_lost = [c0.send_init(vec![1u8; 64], 2, 1).unwrap(), c0.send_init(vec![2u8; BIG], 2, 1).unwrap()];
    let mut from_lost = c0.recv_init(Vec::<u8>::with_capacity(BIG), 2u32, 1).unwrap();
    let mut send = c1.send_init(vec![3u8; BIG], 0, 1).unwrap();
    let mut recv = c0.recv_init(Vec::<u8>::with_capacity(BIG), 1u32, 1).unwrap();
    // Until rank 0 has learnt of the loss (a receive from the lost rank is then refused).
    let deadline = Instant::now() + Duration::from_secs(20);
    while from_lost.start().is_ok() {
        assert!(Instant::now() < deadline, "the loss of rank 2 never became known");
        from_lost.cancel();
        from_lost.wait().unwrap();
        rts[0].progress();
    }
    let round = || {
        recv.start().unwrap();
        send.start().unwrap();
        for p in to_lost.iter_mut() {
            assert_eq!(p.start(), Err(Error::PeerLost { rank: 2 }));
            assert!(!p.is_active() && p.buffer().is_some(), "a refused send start took its buffer");
        }
        assert_eq!(from_lost.start(), Err(Error::PeerLost { rank: 2 }));
        assert!(from_lost.buffer().is_some_and(|b| b.capacity() == BIG), "a refused receive start took its buffer");
        assert_eq!(recv.wait().unwrap().bytes, BIG);
        send.wait().unwrap();
    };
    // The calling thread's: it starts, is refused and waits; the pool's idle workers
    // park and wake as the machine's load has it.
    let n = counting::allocations_on_this_thread_after_warming(50, 200, round);
    assert_eq!(n, 0, "allocations in 200 rounds of refused persistent starts");
    assert_eq!(to_lost[1].buffer().map(Vec::len), Some(BIG));
}
