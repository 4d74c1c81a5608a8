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

/// The blocking, nonblocking and persistent allreduce take one algorithm per size, and a
/// user's op the same but for Rabenseifner's: as many messages each, counted on 3 and 4
/// ranks at the exchange's size (`n - 1` per rank), recursive doubling's and
/// Rabenseifner's.
#[test]
fn blocking_nonblocking_and_persistent_allreduce_send_alike_at_every_size() {
    within(60, "messages per allreduce in its three forms", || {
        for n in [3u32, 4] {
            let rts = builder().build_local(n).unwrap();
            let rabenseifner = weft::ALLREDUCE_LONG_BYTES / 8;
            for len in [1usize, weft::ALLREDUCE_EXCHANGE_BYTES / 8 + 1, rabenseifner] {
                let per_rank: Vec<[u64; 5]> = on_ranks(&rts, |rt| {
                    let c = rt.world();
                    let x = vec![u64::from(c.rank()) + 1; len];
                    let mut p = c.allreduce_init(x.clone(), Op::Sum).unwrap();
                    let sent = |call: &mut dyn FnMut() -> Vec<u64>| {
                        c.barrier().unwrap();
                        let before = rt.counters().messages_sent;
                        let got = call();
                        let after = rt.counters().messages_sent;
                        let want = u64::from(n * (n + 1) / 2);
                        assert!(got.iter().all(|&v| v == want), "rank {}: {} elements, {got:?}", c.rank(), len);
                        after - before
                    };
                    let blocking = sent(&mut || {
                        let mut y = vec![0u64; len];
                        c.allreduce(&x, &mut y, Op::Sum).unwrap();
                        y
                    });
                    let nonblocking = sent(&mut || c.iallreduce(x.clone(), Op::Sum).unwrap().wait().unwrap().0);
                    let persistent = sent(&mut || {
                        p.start().unwrap();
                        p.wait().unwrap();
                        p.buffer().unwrap().clone()
                    });
                    let with = sent(&mut || {
                        let mut y = vec![0u64; len];
                        c.allreduce_with(&x, &mut y, |a, b| a + b).unwrap();
                        y
                    });
                    let iwith = sent(&mut || c.iallreduce_with(x.clone(), |a, b| a + b).unwrap().wait().unwrap().0);
                    c.barrier().unwrap();
                    [blocking, nonblocking, persistent, with, iwith]
                });
                for (r, got) in per_rank.iter().enumerate() {
                    let what = format!("{n} ranks, {len} elements, rank {r}: messages of blocking, nonblocking, persistent, with, iwith");
                    assert_eq!(got[1..3], [got[0]; 2], "{what}: {got:?}");
                    assert_eq!(got[4], got[3], "{what}: {got:?}");
                    if len == 1 {
                        assert_eq!(got[0], u64::from(n - 1), "{what}: one exchange");
                    }
                    if len < rabenseifner {
                        assert_eq!(got[3], got[0], "{what}: a user's op as a predefined one");
                    }
                }
            }
        }
    });
}

/// A persistent allreduce start whose peer is there ends without a receive for failure
/// notices: driven on one thread, each start of each rank takes the matching lock twice (its
/// receive posted, the peer's message handled), not four times (a receive from any source
/// posted and cancelled at every start besides), counted by the lock statistics; only the
/// first start, which listens from the outset, takes it twice more.
#[test]
fn a_persistent_start_that_ends_at_once_posts_no_receive_for_notices() {
    within(30, "matching-lock acquisitions per persistent start", || {
        let rts = builder().lock_stats(true).build_local(2).unwrap();
        let mut ps: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = rts.iter().map(|rt| s.spawn(move || rt.world().allreduce_init(vec![0u64], Op::Sum).unwrap())).collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let taken = || rts.iter().map(|rt| rt.counters().matching_lock.acquisitions).collect::<Vec<_>>();
        let starts = 20u64;
        // What reading the counters takes itself.
        let reading = taken();
        let before = taken();
        for _ in 0..starts {
            for p in ps.iter_mut() {
                p.buffer_mut().unwrap()[0] = 1;
                p.start().unwrap();
            }
            for p in ps.iter_mut() {
                p.wait().unwrap();
                assert_eq!(p.buffer().unwrap(), &[2]);
            }
        }
        let after = taken();
        for r in 0..2 {
            let starting = after[r] - before[r] - (before[r] - reading[r]);
            assert!(starting <= 2 * starts + 4, "rank {r}: {starting} matching-lock acquisitions in {starts} starts");
        }
    });
}

/// A user's op of the same length as the predefined op's allreduce that a rank's thread ran
/// last (Rabenseifner's, which combines out of rank order) takes its own plan, recursive
/// doubling, which keeps the order: a non-commutative op gets its operands in rank order.
#[test]
fn a_user_op_after_a_large_predefined_allreduce_of_its_length_keeps_rank_order() {
    within(60, "allreduce_with after allreduce of one length", || {
        let n = 4u32;
        let rts = builder().build_local(n).unwrap();
        let len = weft::ALLREDUCE_LONG_BYTES / 8;
        let out: Vec<u64> = on_ranks(&rts, |rt| {
            let c = rt.world();
            let x = vec![u64::from(c.rank()) + 1; len];
            let mut y = vec![0u64; len];
            c.allreduce(&x, &mut y, Op::Sum).unwrap();
            // Concatenating decimal digits: associative, not commutative.
            c.allreduce_with(&x, &mut y, |a, b| a * 10u64.pow(b.ilog10() + 1) + b).unwrap();
            assert!(y.iter().all(|&v| v == y[0]), "rank {}: {y:?}", c.rank());
            c.barrier().unwrap();
            y[0]
        });
        assert_eq!(out, vec![1234; n as usize]);
    });
}

/// A small blocking allreduce of an exact type (one exchange walked from the members'
/// list, no stored plan) meets the nonblocking form (the stored plan's exchange, under the
/// same sequence of tags) of the other ranks in the same call: the ranks alternate the two
/// forms call by call, and every call gives every rank the sequential result, at 2, 3, 4
/// and 8 ranks and at 1 to `ALLREDUCE_EXCHANGE_BYTES` bytes, with a user receive of
/// `Tag::Any` posted across them and matching none of their messages.
#[test]
fn a_small_blocking_allreduce_meets_the_planned_exchange_of_the_nonblocking_form() {
    within(60, "small allreduce forms mixed across ranks", || {
        for n in [2u32, 3, 4, 8] {
            let rts = builder().build_local(n).unwrap();
            for len in [1usize, 3, weft::ALLREDUCE_EXCHANGE_BYTES / 8] {
                let input = |r: u32, k: usize| -> Vec<i64> {
                    (0..len).map(|i| (i64::MAX / 3).wrapping_mul(i64::from(r) + 1).wrapping_sub((i * k) as i64)).collect()
                };
                let op = |k: usize| if k % 2 == 0 { Op::Sum } else { Op::Max };
                let want = |k: usize| -> Vec<i64> {
                    let f = if k % 2 == 0 { i64::wrapping_add } else { i64::max };
                    (0..len).map(|i| (0..n).map(|r| input(r, k)[i]).reduce(f).unwrap()).collect()
                };
                let out: Vec<Vec<Vec<i64>>> = on_ranks(&rts, |rt| {
                    let c = rt.world();
                    let r = c.rank();
                    let user = c.irecv(vec![0u8; 8], weft::Source::Any, weft::Tag::Any).unwrap();
                    let got = (0..6)
                        .map(|k| {
                            if (r as usize + k) % 2 == 0 {
                                let mut y = vec![0i64; len];
                                c.allreduce(&input(r, k), &mut y, op(k)).unwrap();
                                y
                            } else {
                                c.iallreduce(input(r, k), op(k)).unwrap().wait().unwrap().0
                            }
                        })
                        .collect();
                    assert!(!user.is_complete(), "rank {r}: a user receive of Tag::Any took a collective's message");
                    drop(user);
                    c.barrier().unwrap();
                    got
                });
                for (r, got) in out.iter().enumerate() {
                    for (k, v) in got.iter().enumerate() {
                        assert_eq!(v, &want(k), "{n} ranks, {len} elements, rank {r}, call {k}");
                    }
                }
            }
        }
    });
}

/// A rank lost during a small blocking allreduce (one exchange walked from the members'
/// list) fails it with `PeerLost` on every survivor, at 2 and 8 ranks, and a call after it
/// fails alike at once rather than wait.
#[test]
fn a_rank_lost_during_a_small_blocking_allreduce_fails_it_on_every_survivor() {
    within(60, "a rank that leaves during a small allreduce", || {
        for n in [2u32, 8] {
            let mut rts = builder().build_local(n).unwrap();
            let last = rts.pop().unwrap();
            let out = std::thread::scope(|s| {
                let calls = s.spawn(|| {
                    on_ranks(&rts, |rt| {
                        let (c, mut y) = (rt.world(), [0u64; 4]);
                        [c.allreduce(&[1u64; 4], &mut y, Op::Sum), c.allreduce(&[1u64; 4], &mut y, Op::Sum)]
                    })
                });
                // The last rank leaves while the others are in their first call.
                std::thread::sleep(std::time::Duration::from_millis(20));
                drop(last);
                calls.join().unwrap()
            });
            let lost = Err(weft::Error::PeerLost { rank: n - 1 });
            for (r, got) in out.iter().enumerate() {
                assert_eq!(got, &[lost, lost], "{n} ranks, rank {r}");
            }
        }
    });
}

/// `f(rank)` on a thread per rank of `rts`, the results by rank.
fn on_ranks<T: Send>(rts: &[weft::Runtime], f: impl Fn(&weft::Runtime) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = rts.iter().map(|rt| s.spawn(|| f(rt))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// From [`weft::BCAST_SCATTER_RANKS`] ranks a long broadcast goes by scatter and ring
/// allgather: every root, blocking and nonblocking, on an uneven length.
#[test]
fn long_bcasts_on_many_ranks_take_scatter_and_allgather_and_agree() {
    within(120, "bcast by scatter and allgather", || {
        coll_suite::bcasts_agree_at_every_root(weft::BCAST_SCATTER_RANKS, weft::BCAST_LONG_BYTES / 8 * 3 + 7, false);
    });
}

/// A persistent collective's large messages go from the user's buffer itself; a start that
/// fails with one still unread (its peer failed before posting the receive, and takes it
/// only at its next start) gives back a copy of the buffer, so that what the user writes
/// into it then does not change what the message carries. A ring allgather of 64 KiB blocks
/// on four ranks, the last lost: rank 2 fails first, its receive from rank 1 cancelled;
/// rank 1's first message to it stays in flight when rank 1's start fails in turn; rank 1
/// then overwrites its buffer, and rank 2's next start takes that message.
#[test]
fn a_message_of_a_failed_persistent_start_carries_the_data_of_its_start() {
    use weft::{Communicator, Error, Persistent, Runtime};
    const BLOCK: usize = 64 << 10;
    within(60, "a failed persistent allgather's message in flight", || {
        let mut rts = Runtime::builder().env(false).build_local(4).unwrap();
        let last = rts.pop().unwrap();
        let cs: Vec<Communicator> = rts.iter().map(|rt| rt.world().clone()).collect();
        let data = |r: usize| {
            let mut d = vec![0u8; 4 * BLOCK];
            d[r * BLOCK..(r + 1) * BLOCK].fill(r as u8 + 1);
            d
        };
        let mut ps: Vec<Persistent<'_, Vec<u8>>> = std::thread::scope(|s| {
            let hs: Vec<_> = cs.iter().enumerate().map(|(r, c)| s.spawn(move || c.allgather_init(data(r)).unwrap())).collect();
            drop(last.world().allgather_init(data(3)).unwrap());
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        drop(last);
        let lost = Err(Error::PeerLost { rank: 3 });
        // Tests the started requests of `ranks` on this thread until each has ended.
        let run = |ps: &mut [Persistent<'_, Vec<u8>>], ranks: &[usize]| {
            for &r in ranks {
                ps[r].start().unwrap();
            }
            let mut left: Vec<usize> = ranks.to_vec();
            while !left.is_empty() {
                left.retain(|&r| match ps[r].test() {
                    Some(outcome) => {
                        assert_eq!(outcome.map(drop), lost, "rank {r}");
                        false
                    }
                    None => true,
                });
            }
        };
        run(&mut ps, &[2]);
        run(&mut ps, &[0, 1]);
        ps[1].buffer_mut().unwrap().fill(0xEE);
        // Rank 2 takes in what came meanwhile (the message waits unmatched).
        for _ in 0..100 {
            assert_eq!(cs[2].iprobe(weft::Source::Any, weft::Tag::Any), Ok(None));
        }
        run(&mut ps, &[2]);
        let got = &ps[2].buffer().unwrap()[BLOCK..2 * BLOCK];
        assert!(got.iter().all(|&x| x == 2), "rank 1's block as rank 2 got it: {:?}", &got[..8]);
    });
}
