//! A persistent collective whose start failed keeps the buffers of the messages that start
//! left in flight: the starts after it allocate no message buffer (counting global allocator,
//! allocations of a block's size only; a binary of its own, as `zero_alloc.rs`).

use std::time::{Duration, Instant};

use weft::{Communicator, Error, Persistent, Runtime, Source, Tag};

#[path = "common/counting.rs"]
mod counting;

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
