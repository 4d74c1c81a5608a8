//! Large collectives in the steady state allocate no large buffers: the blocking forms work
//! in the caller's buffer and their steps take their message buffers from the collectives'
//! pool of scratch buffers, so no call maps fresh memory (whose page faults cost more than
//! the copies of a large message); a persistent one keeps no buffer for a large message.
//! One test in this binary: its allocator counts every
//! thread's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use weft::{Op, Runtime};

/// Allocations at least this large are counted (while armed).
static LARGE: AtomicUsize = AtomicUsize::new(16 << 10);

struct CountLarge;
static LARGE_BYTES: AtomicUsize = AtomicUsize::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);
/// What the first allreduce took.
static ALLREDUCE_BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for CountLarge {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() >= LARGE.load(Ordering::Relaxed) && ARMED.load(Ordering::Relaxed) {
            LARGE_BYTES.fetch_add(l.size(), Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: CountLarge = CountLarge;

#[test]
fn large_collectives_allocate_no_large_buffers_in_the_steady_state() {
    let len = 128 << 10; // 1 MiB of u64

    // First, with the pool still empty: a large blocking allreduce sends from the caller's
    // buffer and receives what only replaces a part of it straight into place, so that
    // between 2 ranks the one scratch buffer each takes is the half it combines from
    // (copying each message in and out of scratch buffers took two more per rank); a
    // large broadcast takes none.
    let pair = Runtime::builder().env(false).build_local(2).unwrap();
    let bufs: Vec<_> = (1..=2u64).map(|r| (vec![r; len], vec![0u64; len])).collect();
    std::thread::scope(|s| {
        for (rt, (send, mut sum)) in pair.iter().zip(bufs) {
            s.spawn(move || {
                let c = rt.world();
                // A large message each way first (no scratch buffer), so that the runtime's
                // own first allocations for a rendezvous are not counted.
                let mut got: Vec<u64> = Vec::with_capacity(len);
                for sender in 0..2 {
                    if c.rank() == sender {
                        c.send(send.clone(), 1 - sender, 5).unwrap();
                    } else {
                        got = c.recv(got, sender, 5).unwrap().0;
                    }
                }
                c.barrier().unwrap();
                if c.rank() == 0 {
                    LARGE_BYTES.store(0, Ordering::Relaxed);
                    ARMED.store(true, Ordering::Relaxed);
                }
                c.barrier().unwrap();
                c.allreduce(&send, &mut sum, Op::Sum).unwrap();
                assert!(sum.iter().all(|&x| x == 3));
                c.barrier().unwrap();
                if c.rank() == 0 {
                    ALLREDUCE_BYTES.store(LARGE_BYTES.swap(0, Ordering::Relaxed), Ordering::Relaxed);
                }
                c.barrier().unwrap();
                // A large broadcast: sent from the root's buffer, received in place.
                c.bcast(&mut sum, 1).unwrap();
                assert!(sum.iter().all(|&x| x == 3));
                c.barrier().unwrap();
                drop(got);
            });
        }
    });
    ARMED.store(false, Ordering::Relaxed);
    let took = ALLREDUCE_BYTES.load(Ordering::Relaxed);
    assert!(took <= 2 * len / 2 * 8, "{took} bytes of scratch buffers in one 1 MiB allreduce between 2 ranks");
    let took = LARGE_BYTES.load(Ordering::Relaxed);
    assert_eq!(took, 0, "bytes of scratch buffers in one 1 MiB bcast between 2 ranks");
    drop(pair);

    let n = 4u32;
    let rts = Runtime::builder().env(false).build_local(n).unwrap();
    // `v`: the `v` forms instead of the others.
    let calls = |rounds: usize, v: bool| {
        std::thread::scope(|s| {
            for rt in &rts {
                s.spawn(move || {
                    let c = rt.world();
                    let me = u64::from(c.rank());
                    let mut data = vec![0u64; len];
                    let send = vec![me + 1; len];
                    let mut sum = vec![0u64; len];
                    let block = vec![me; len / n as usize];
                    let mut gathered = vec![0u64; len];
                    let mut piece = vec![0u64; len / n as usize];
                    let counts = vec![len / n as usize; n as usize];
                    let displs: Vec<usize> = (0..n as usize).map(|r| r * len / n as usize).collect();
                    for round in 0..rounds as u64 {
                        if v {
                            gathered.fill(u64::MAX);
                            c.gatherv(&block, &mut gathered, &counts, &displs, 1).unwrap();
                            if c.rank() == 1 {
                                assert!(gathered.chunks(len / n as usize).enumerate().all(|(r, b)| b.iter().all(|&x| x == r as u64)));
                            }
                            c.scatterv(&gathered, &counts, &displs, &mut piece, 1).unwrap();
                            assert!(piece.iter().all(|&x| x == me));
                            continue;
                        }
                        if c.rank() == 0 {
                            data.fill(round);
                        }
                        c.bcast(&mut data, 0).unwrap();
                        assert!(data.iter().all(|&x| x == round));
                        c.allreduce(&send, &mut sum, Op::Sum).unwrap();
                        assert!(sum.iter().all(|&x| x == u64::from(n * (n + 1) / 2)));
                        c.allgather(&block, &mut gathered).unwrap();
                        assert!(gathered.chunks(len / n as usize).enumerate().all(|(r, b)| b.iter().all(|&x| x == r as u64)));
                    }
                });
            }
        })
    };
    // Fills the pool.
    calls(3, false);
    LARGE_BYTES.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    // The ranks allocate their own buffers (4.5 MiB each, made before the calls).
    calls(10, false);
    ARMED.store(false, Ordering::Relaxed);
    let per_rank_buffers = (len * 4 + 2 * len / n as usize) * 8;
    let extra = LARGE_BYTES.load(Ordering::Relaxed).saturating_sub(n as usize * per_rank_buffers);
    // The pool holds what the warm-up rounds had in flight at once; where the ranks' timing
    // overlaps more steps than then (on a loaded machine, two did), it grows by those
    // steps' buffers (each at most half the message), once each. A call that mapped its
    // buffers afresh would count megabytes a call: 30 calls here.
    assert!(
        extra <= len * 8,
        "{extra} bytes of large allocations in 10 rounds of 1 MiB bcast, allreduce and allgather on {n} ranks, besides the ranks' own buffers"
    );

    // The blocking `gatherv` and `scatterv` work in the caller's buffers: no copy of the
    // whole buffer (1 MiB) on the way in or out. (A block, 256 KiB, may be held for a
    // receive posted after its message came.)
    calls(3, true);
    LARGE.store(len * 8, Ordering::Relaxed);
    LARGE_BYTES.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    calls(10, true);
    ARMED.store(false, Ordering::Relaxed);
    // Of the ranks' own buffers, the four of 1 MiB count.
    let extra = LARGE_BYTES.load(Ordering::Relaxed).saturating_sub(n as usize * 4 * len * 8);
    assert_eq!(extra, 0, "bytes of whole-buffer allocations in 10 rounds of 1 MiB gatherv and scatterv on {n} ranks");
    drop(rts);

    // A persistent broadcast keeps no buffer for a large message, from its init on: the root
    // sends from its buffer, the other rank receives straight into its own. Its starts
    // allocate nothing large.
    let pair = Runtime::builder().env(false).build_local(2).unwrap();
    LARGE.store(16 << 10, Ordering::Relaxed);
    let (init_bytes, start_bytes) = std::thread::scope(|s| {
        let hs: Vec<_> = pair
            .iter()
            .map(|rt| {
                s.spawn(move || {
                    let c = rt.world();
                    let data = vec![u64::from(c.rank()); len];
                    c.barrier().unwrap();
                    if c.rank() == 0 {
                        LARGE_BYTES.store(0, Ordering::Relaxed);
                        ARMED.store(true, Ordering::Relaxed);
                    }
                    c.barrier().unwrap();
                    let mut p = c.bcast_init(data, 0).unwrap();
                    c.barrier().unwrap();
                    let init = (c.rank() == 0).then(|| LARGE_BYTES.swap(0, Ordering::Relaxed));
                    c.barrier().unwrap();
                    for round in 0..6u64 {
                        if c.rank() == 0 {
                            p.buffer_mut().unwrap().fill(round + 7);
                        }
                        p.start().unwrap();
                        p.wait().unwrap();
                        assert!(p.buffer().unwrap().iter().all(|&x| x == round + 7), "rank {}, start {round}", c.rank());
                        if round == 0 {
                            // The first start's rendezvous is not counted.
                            c.barrier().unwrap();
                            if c.rank() == 0 {
                                LARGE_BYTES.store(0, Ordering::Relaxed);
                            }
                            c.barrier().unwrap();
                        }
                    }
                    c.barrier().unwrap();
                    init.map(|i| (i, LARGE_BYTES.load(Ordering::Relaxed)))
                })
            })
            .collect();
        hs.into_iter().filter_map(|h| h.join().unwrap()).next().unwrap()
    });
    ARMED.store(false, Ordering::Relaxed);
    assert_eq!(init_bytes, 0, "bytes of large allocations in a 1 MiB bcast_init between 2 ranks");
    assert_eq!(start_bytes, 0, "bytes of large allocations in 5 starts after the first of a 1 MiB persistent bcast between 2 ranks");
}
