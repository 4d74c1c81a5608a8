//! The collectives suite (`coll_suite/`) on the embedded provider.

/// The builder every test of the suite starts from.
fn builder() -> weft::Builder {
    weft::Runtime::builder().env(false)
}

mod coll_suite;
mod common;

use common::within;
use weft::{Op, ProgressMode};

/// A rank blocked in a receive still takes its steps of a nonblocking collective it started
/// (the receive's sender waits for that collective first), in every progress mode, and
/// threads of a rank each waiting on collectives of their own communicator all finish.
#[test]
fn nonblocking_collectives_progress_while_their_rank_waits_elsewhere_in_every_mode() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        within(60, &format!("{mode:?}: collective steps taken by a rank blocked in a receive"), move || {
            let rts = builder().progress(mode).cris(2).build_local(4).unwrap();
            std::thread::scope(|s| {
                for rt in &rts {
                    s.spawn(move || {
                        let w = rt.world();
                        let r = w.rank();
                        let dups = [w.dup().unwrap(), w.dup().unwrap()];
                        let req = w.iallreduce(vec![u64::from(r) + 1; 3], Op::Sum).unwrap();
                        if r == 0 {
                            // Rank 3 sends only once its allreduce is done, which needs rank
                            // 0's later steps.
                            let (v, _) = w.recv(Vec::<u64>::with_capacity(3), 3u32, 1).unwrap();
                            assert_eq!(v, vec![10; 3]);
                            assert_eq!(req.wait().unwrap().0, vec![10; 3]);
                        } else {
                            let (v, _) = req.wait().unwrap();
                            if r == 3 {
                                w.send(v, 0, 1).unwrap();
                            }
                        }
                        std::thread::scope(|s| {
                            for (t, c) in dups.iter().enumerate() {
                                s.spawn(move || {
                                    for i in 0..20u64 {
                                        let v = c.iallreduce(vec![i + t as u64], Op::Max).unwrap().wait().unwrap().0;
                                        assert_eq!(v, vec![i + t as u64]);
                                        c.ibarrier().unwrap().wait().unwrap();
                                    }
                                });
                            }
                        });
                        w.barrier().unwrap();
                    });
                }
            });
        });
    }
}

/// Collective requests attach to a sync object like receives: each completion comes out of
/// it once, with its data, and the requests then hold their results.
#[test]
fn collective_requests_complete_through_a_sync_object() {
    within(60, "collectives attached to a sync object", || {
        let rts = builder().build_local(3).unwrap();
        std::thread::scope(|s| {
            for rt in &rts {
                s.spawn(move || {
                    let c = rt.world();
                    let r = u64::from(c.rank());
                    let sync = rt.sync_object::<usize>();
                    let mut reqs = [c.iallreduce(vec![r + 1], Op::Sum).unwrap(), c.ibcast(vec![r; 2], 2).unwrap()];
                    for (i, q) in reqs.iter_mut().enumerate() {
                        sync.attach(q, i).unwrap();
                    }
                    let mut seen: Vec<usize> = (0..2).map(|_| sync.wait_any().expect("a completion").data).collect();
                    seen.sort_unstable();
                    assert_eq!(seen, [0, 1]);
                    assert_eq!(reqs[0].take().unwrap().unwrap().0, vec![6]);
                    assert_eq!(reqs[1].take().unwrap().unwrap().0, vec![2, 2]);
                });
            }
        });
    });
}

/// On a power of two of ranks, a large allreduce takes Rabenseifner's algorithm (`2 log2 n`
/// messages per rank, where the ring sends `2 (n-1)`) and a large reduce the reduce-scatter
/// and gather (`log2 n` messages per rank, and one more from each rank but the root), while
/// a small allreduce of integers takes one exchange among all ranks (`n - 1` messages per
/// rank) and a small reduce the binomial tree: counted in messages sent.
#[test]
fn large_reductions_on_a_power_of_two_take_the_reduce_scatter() {
    within(60, "messages per allreduce and reduce", || {
        let n = 4u32;
        let rts = builder().build_local(n).unwrap();
        let sent = |len: usize, reduce: bool| -> u64 {
            std::thread::scope(|s| {
                let hs: Vec<_> = rts
                    .iter()
                    .map(|rt| {
                        s.spawn(move || {
                            let c = rt.world();
                            c.barrier().unwrap();
                            let before = rt.counters().messages_sent;
                            let (x, mut y) = (vec![1i64; len], vec![0i64; len]);
                            if reduce {
                                c.reduce(&x, &mut y, Op::Sum, 1).unwrap();
                            } else {
                                c.allreduce(&x, &mut y, Op::Sum).unwrap();
                            }
                            let after = rt.counters().messages_sent;
                            if !reduce || c.rank() == 1 {
                                assert!(y.iter().all(|&v| v == i64::from(n)), "rank {}: reduced {}", c.rank(), y[0]);
                            }
                            c.barrier().unwrap();
                            after - before
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum()
            })
        };
        let long = weft::ALLREDUCE_LONG_BYTES.max(weft::REDUCE_LONG_BYTES) / 8 * 4;
        // One exchange: n - 1 messages per rank (recursive doubling: log2 n).
        assert_eq!(sent(1, false), 4 * 3);
        // Rabenseifner: 2 log2 n per rank (the ring would send 2 (n-1) = 6).
        assert_eq!(sent(long, false), 4 * 4);
        // Binomial: one message from each rank but the root.
        assert_eq!(sent(1, true), 3);
        // Reduce-scatter (log2 n per rank), then the gather (one from each rank but the root).
        assert_eq!(sent(long, true), 4 * 2 + 3);
    });
}
