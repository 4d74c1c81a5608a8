// The collectives suite, run on the embedded provider (`collectives.rs`) and on libfabric's
// `shm` and `tcp` (`p2p_ofi.rs`, included there per provider): every collective,
// blocking and nonblocking, against a sequential reference at odd and power-of-two sizes and
// every root, each scenario bounded in time.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::common::within;

use weft::{Communicator, Error, Op, Runtime, Source, Tag};

const SIZES: [u32; 6] = [1, 2, 3, 4, 5, 8];

/// Runs `f(rank, world)` on one thread per rank of a local world of `n` and returns the
/// results by rank.
///
/// Each rank ends with a barrier before the world is dropped: libfabric's `shm` provider,
/// with every rank in one process, touches a closed peer's memory when a send to it (of more
/// than its inject size) is still completing at the sender as that sender closes.
fn on_world<T: Send>(n: u32, f: impl Fn(u32, &Communicator) -> T + Sync) -> Vec<T> {
    let rts = super::builder().build_local(n).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = rts
            .iter()
            .enumerate()
            .map(|(r, rt)| {
                let f = &f;
                s.spawn(move || {
                    let out = f(r as u32, rt.world());
                    rt.world().barrier().unwrap();
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `r`'s input: `len` values that differ by rank and position.
fn input(r: u32, len: usize) -> Vec<i64> {
    (0..len).map(|i| (r as i64 + 1) * 1000 - i as i64 * (r as i64 % 3 + 1)).collect()
}

#[test]
fn allreduce_matches_a_sequential_reference() {
    within(120, "allreduce at sizes 1-8", || {
        for n in SIZES {
            for len in [1usize, 7, 3000] {
                let out = on_world(n, |r, c| {
                    let send = input(r, len);
                    let mut res = Vec::new();
                    for op in [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::BAnd, Op::BOr, Op::BXor] {
                        let mut recv = vec![0i64; len];
                        c.allreduce(&send, &mut recv, op).unwrap();
                        res.push(recv);
                    }
                    let fs: Vec<f64> = send.iter().map(|&x| x as f64 / 7.0).collect();
                    let mut fr = vec![0f64; len];
                    c.allreduce(&fs, &mut fr, Op::Max).unwrap();
                    res.push(fr.iter().map(|&x| (x * 7.0).round() as i64).collect());
                    res
                });
                let all: Vec<Vec<i64>> = (0..n).map(|r| input(r, len)).collect();
                let fold = |f: fn(i64, i64) -> i64| -> Vec<i64> { (0..len).map(|i| all.iter().map(|v| v[i]).reduce(f).unwrap()).collect() };
                let want = [
                    fold(i64::wrapping_add),
                    fold(i64::wrapping_mul),
                    fold(i64::min),
                    fold(i64::max),
                    fold(|a, b| a & b),
                    fold(|a, b| a | b),
                    fold(|a, b| a ^ b),
                    fold(i64::max),
                ];
                for (r, got) in out.iter().enumerate() {
                    assert_eq!(got.as_slice(), &want, "size {n}, {len} elements, rank {r}");
                }
            }
        }
    });
}

/// Rank `r`'s floating-point input: magnitudes far apart, so that the sum's value depends
/// on the order in which it adds.
fn float_input(r: u32, len: usize) -> Vec<f64> {
    (0..len).map(|i| [1e16, 1.0 + i as f64, -1e16, 3.0, 0.5][(r as usize + i) % 5] * if r % 3 == 2 { -1.0 } else { 1.0 }).collect()
}

/// A small allreduce of floats (up to [`weft::ALLREDUCE_EXCHANGE_BYTES`]), blocking,
/// nonblocking, persistent or with a closure, gives every rank the sequential sum in rank
/// order, bit for bit: `((x0 + x1) + x2) + ...`.
#[test]
fn a_small_float_allreduce_is_the_sequential_sum_in_rank_order_on_every_rank() {
    within(60, "small float allreduce at sizes 1-8", || {
        for n in SIZES {
            for len in [5usize, weft::ALLREDUCE_EXCHANGE_BYTES / 8] {
                let out = on_world(n, |r, c| {
                    let send = float_input(r, len);
                    let mut blocking = vec![0f64; len];
                    c.allreduce(&send, &mut blocking, Op::Sum).unwrap();
                    let nonblocking = c.iallreduce(send.clone(), Op::Sum).unwrap().wait().unwrap().0;
                    let mut p = c.allreduce_init(send.clone(), Op::Sum).unwrap();
                    p.start().unwrap();
                    p.wait().unwrap();
                    let persistent = p.buffer().unwrap().clone();
                    let mut with = vec![0f64; len];
                    c.allreduce_with(&send, &mut with, |a, b| a + b).unwrap();
                    let iwith = c.iallreduce_with(send.clone(), |a, b| a + b).unwrap().wait().unwrap().0;
                    [blocking, nonblocking, persistent, with, iwith].map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>())
                });
                let want: Vec<u64> =
                    (0..len).map(|i| (0..n).map(|r| float_input(r, len)[i]).reduce(|a, b| a + b).unwrap().to_bits()).collect();
                for (r, got) in out.iter().enumerate() {
                    for (k, form) in ["blocking", "nonblocking", "persistent", "with", "iwith"].iter().enumerate() {
                        assert_eq!(got[k], want, "size {n}, {len} elements, rank {r}, {form}");
                    }
                }
            }
        }
    });
}

#[test]
fn a_user_reduction_gets_its_operands_in_rank_order() {
    within(60, "allreduce_with a non-commutative op", || {
        for n in SIZES {
            // Concatenating decimal digits: associative, not commutative.
            let out = on_world(n, |r, c| {
                let mut recv = [0u64];
                c.allreduce_with(&[r as u64 + 1], &mut recv, |a, b| a * 10u64.pow(b.ilog10() + 1) + b).unwrap();
                recv[0]
            });
            let want = (1..=n as u64).fold(0, |acc, d| acc * 10 + d);
            assert!(out.iter().all(|&v| v == want), "size {n}: {out:?}");
        }
    });
}

#[test]
fn bcast_from_every_root() {
    within(120, "bcast at sizes 1-8, every root", || {
        for n in SIZES {
            for len in [1usize, 5000] {
                let out = on_world(n, |r, c| {
                    (0..n)
                        .map(|root| {
                            let mut data = if r == root { input(root, len) } else { vec![-1; len] };
                            c.bcast(&mut data, root).unwrap();
                            data
                        })
                        .collect::<Vec<_>>()
                });
                for got in &out {
                    for (root, d) in got.iter().enumerate() {
                        assert_eq!(d, &input(root as u32, len), "size {n}, root {root}");
                    }
                }
            }
        }
    });
}

#[test]
fn nobody_leaves_a_barrier_before_everyone_entered() {
    within(60, "barrier at sizes 1-8", || {
        for n in SIZES {
            let entered = AtomicU32::new(0);
            on_world(n, |r, c| {
                for round in 1..=5 {
                    // Late arrivals: the last rank sleeps before entering.
                    if r == n - 1 {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    entered.fetch_add(1, Ordering::SeqCst);
                    c.barrier().unwrap();
                    assert!(entered.load(Ordering::SeqCst) >= round * n, "size {n}: left round {round} early");
                    c.barrier().unwrap();
                }
            });
        }
    });
}

#[test]
fn collectives_on_a_split_communicator_and_apart_from_user_receives() {
    within(60, "collectives on the halves of 7 ranks", || {
        let out = on_world(7, |r, w| {
            let half = w.split(Some(r % 2), r as i32).unwrap().unwrap();
            // A user receive for anything stays pending through every collective.
            let mut pending = half.irecv(Vec::<u8>::with_capacity(64), Source::Any, Tag::Any).unwrap();
            let mut sum = [0u32];
            half.allreduce(&[r], &mut sum, Op::Sum).unwrap();
            let mut root_rank = [if half.rank() == 0 { r } else { 0 }];
            half.bcast(&mut root_rank, 0).unwrap();
            half.barrier().unwrap();
            assert!(!pending.test(), "a collective message matched a user receive");
            (sum[0], root_rank[0])
        });
        for (r, &(sum, root)) in out.iter().enumerate() {
            assert_eq!((sum, root), if r % 2 == 0 { (12, 0) } else { (9, 1) }, "rank {r}");
        }
    });
}

/// Runs `f` on rank `r` of two (`c`) with a receive for anything posted before it, which no
/// collective message of `f`'s may match: checked after `f` on both ranks, then a user
/// message from each to the other is what it takes.
fn beside_a_user_receive<T>(r: u32, c: &Communicator, f: impl FnOnce() -> T) -> T {
    let n = c.size();
    let mut pending = c.irecv(Vec::<u8>::with_capacity(64), Source::Any, Tag::Any).unwrap();
    let out = f();
    assert!(!pending.test(), "a collective message matched a user receive");
    // Every rank checked before any sends its user message, to the next rank.
    c.barrier().unwrap();
    c.send_slice(&[r as u8], (r + 1) % n, 7).unwrap();
    let (got, st) = pending.wait().unwrap();
    let from = (r + n - 1) % n;
    assert_eq!((got, st.source, st.tag), (vec![from as u8], from, 7), "rank {r}");
    out
}

/// A small allreduce on two ranks (its send and receive tested where they lie) gets the
/// sum, whichever rank comes late or calls the nonblocking form, a barrier between calls
/// (the same path, empty messages) meets the nonblocking barrier, and none of their
/// messages matches a user receive for anything on the same communicator.
#[test]
fn a_two_rank_allreduce_meets_the_nonblocking_form_and_stays_apart_from_user_receives() {
    within(60, "two-rank allreduce against iallreduce, late partners and Tag::Any", || {
        let out = on_world(2, |r, c| {
            beside_a_user_receive(r, c, || {
                let mut sums = Vec::new();
                for k in 0..24u64 {
                    // Every third call one rank comes late (its partner waits past its polls);
                    // every other call one rank takes the nonblocking form.
                    if k % 3 == 2 && u64::from(r) == k % 2 {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                    }
                    let mine = [k * 10 + u64::from(r) + 1, u64::MAX - u64::from(r)];
                    let got = if k % 2 == 1 && u64::from(r) == (k / 2) % 2 {
                        c.iallreduce(mine.to_vec(), Op::Sum).unwrap().wait().unwrap().0
                    } else {
                        let mut recv = [0u64; 2];
                        c.allreduce(&mine, &mut recv, Op::Sum).unwrap();
                        recv.to_vec()
                    };
                    sums.push(got);
                    // A barrier between calls, in its blocking or nonblocking form: one exchange of
                    // empty messages either way, which must meet the other's.
                    if k % 4 == 3 && u64::from(r) == (k / 4) % 2 {
                        c.ibarrier().unwrap().wait().unwrap();
                    } else {
                        c.barrier().unwrap();
                    }
                }
                let mut cat = [0u64];
                c.allreduce_with(&[u64::from(r) + 1], &mut cat, |a, b| a * 10 + b).unwrap();
                (sums, cat[0])
            })
        });
        for (r, (sums, cat)) in out.into_iter().enumerate() {
            for (k, got) in sums.iter().enumerate() {
                let k = k as u64;
                assert_eq!(got, &[2 * k * 10 + 3, (u64::MAX - 1).wrapping_add(u64::MAX)], "rank {r}, call {k}");
            }
            assert_eq!(cat, 12, "rank {r}: the user op's operands in rank order");
        }
    });
}

/// A small broadcast (on two ranks the root's data sent as it lies and received straight
/// into the other's; on more, its binomial tree walked straight: received into the
/// caller's data, sent on from it) delivers the root's data from every root, on a power of
/// two of ranks and not, whichever rank comes late or calls the nonblocking form, and none
/// of its messages matches a user receive.
#[test]
fn a_small_bcast_meets_the_nonblocking_form_and_stays_apart_from_user_receives() {
    for n in [2u32, 3, 4, 5] {
        within(60, "small bcast against ibcast on 2-5 ranks, late partners and Tag::Any", move || {
            let out = on_world(n, |r, c| {
                beside_a_user_receive(r, c, || {
                    let mut got = Vec::new();
                    for k in 0..30u64 {
                        let root = (k % u64::from(n)) as u32;
                        if k % 3 == 2 && u64::from(r) == (k / 3) % u64::from(n) {
                            std::thread::sleep(std::time::Duration::from_millis(2));
                        }
                        // The root's data; the others' buffers hold something else before.
                        let mut data = if r == root { [k * 7 + 1, u64::MAX - k, k] } else { [0, 0, 1] };
                        if k % 4 == 1 && u64::from(r) == (k / 4) % u64::from(n) {
                            let back = c.ibcast(data.to_vec(), root).unwrap().wait().unwrap().0;
                            data.copy_from_slice(&back);
                        } else {
                            c.bcast(&mut data, root).unwrap();
                        }
                        got.push(data);
                    }
                    got
                })
            });
            for (r, got) in out.into_iter().enumerate() {
                for (k, data) in got.iter().enumerate() {
                    let k = k as u64;
                    assert_eq!(data, &[k * 7 + 1, u64::MAX - k, k], "{n} ranks: rank {r}, call {k}");
                }
            }
        });
    }
}

#[test]
fn collectives_refuse_bad_input() {
    within(60, "bad collective input", || {
        let rts = super::builder().build_local(2).unwrap();
        let c = rts[0].world();
        assert_eq!(c.bcast(&mut [0u8], 2).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
        assert!(matches!(c.allreduce(&[1u32, 2], &mut [0u32], Op::Sum), Err(Error::InvalidArgument(_))));
        assert!(matches!(c.allreduce(&[1.0f32], &mut [0f32], Op::BXor), Err(Error::InvalidArgument(_))));
        let d = on_world_dup(&rts);
        d.clone().free();
        assert_eq!(d.barrier().unwrap_err(), Error::CommFreed);
    });
}

fn on_world_dup(rts: &[Runtime]) -> Communicator {
    std::thread::scope(|s| {
        let h = s.spawn(|| rts[1].world().dup().unwrap());
        let d = rts[0].world().dup().unwrap();
        h.join().unwrap();
        d
    })
}

#[test]
fn reduce_gather_scatter_allgather_match_a_sequential_reference() {
    within(120, "reduce, gather, scatter, allgather at sizes 1-8, every root", || {
        for n in SIZES {
            for len in [0usize, 3, 3000] {
                let out = on_world(n, |r, c| {
                    let send = input(r, len);
                    let mut per_root = Vec::new();
                    for root in 0..n {
                        let mut sum = vec![0i64; if r == root { len } else { 0 }];
                        c.reduce(&send, &mut sum, Op::Sum, root).unwrap();
                        let mut all = vec![0i64; if r == root { n as usize * len } else { 0 }];
                        c.gather(&send, &mut all, root).unwrap();
                        // The root scatters what it gathered: each rank gets its own input back.
                        let mut mine = vec![0i64; len];
                        c.scatter(&all, &mut mine, root).unwrap();
                        assert_eq!(mine, send, "size {n}, root {root}: scatter of the gathered blocks");
                        per_root.push((sum, all));
                    }
                    let mut everyone = vec![0i64; n as usize * len];
                    c.allgather(&send, &mut everyone).unwrap();
                    (per_root, everyone)
                });
                let concat: Vec<i64> = (0..n).flat_map(|r| input(r, len)).collect();
                let sum: Vec<i64> = (0..len).map(|i| concat[i..].iter().step_by(len.max(1)).sum()).collect();
                for (r, (per_root, everyone)) in out.iter().enumerate() {
                    assert_eq!(everyone, &concat, "size {n}, {len} elements: allgather at rank {r}");
                    for (root, (s, g)) in per_root.iter().enumerate() {
                        if root == r {
                            assert_eq!((s, g), (&sum, &concat), "size {n}, {len} elements, root {root}");
                        }
                    }
                }
            }
        }
    });
}

#[test]
fn rooted_collectives_refuse_bad_input() {
    within(60, "bad rooted collective input", || {
        let rts = super::builder().build_local(2).unwrap();
        let c = rts[0].world();
        assert_eq!(c.reduce(&[1u8], &mut [0u8], Op::Sum, 5).unwrap_err(), Error::RankOutOfRange { rank: 5, size: 2 });
        assert!(matches!(c.reduce(&[1u8], &mut [], Op::Sum, 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(c.reduce(&[1.0f64], &mut [0.0], Op::BAnd, 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(c.gather(&[1u8], &mut [0u8; 3], 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(c.scatter(&[1u8; 3], &mut [0u8], 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(c.allgather(&[1u8], &mut [0u8; 1]), Err(Error::InvalidArgument(_))));
        assert_eq!(c.gather(&[1u8], &mut [0u8; 2], 2).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
    });
}

#[test]
fn scan_and_exscan_match_prefix_reductions() {
    within(60, "scan and exscan at sizes 1-8", || {
        for n in SIZES {
            for len in [1usize, 3000] {
                let out = on_world(n, |r, c| {
                    let send = input(r, len);
                    let (mut inc, mut exc, mut max) = (vec![0i64; len], vec![-7i64; len], vec![0i64; len]);
                    c.scan(&send, &mut inc, Op::Sum).unwrap();
                    c.exscan(&send, &mut exc, Op::Sum).unwrap();
                    c.scan(&send, &mut max, Op::Max).unwrap();
                    (inc, exc, max)
                });
                let all: Vec<Vec<i64>> = (0..n).map(|q| input(q, len)).collect();
                for (r, (inc, exc, max)) in out.iter().enumerate() {
                    let upto = |k: usize, f: fn(i64, i64) -> i64| -> Vec<i64> {
                        (0..len).map(|i| all[..k].iter().map(|v| v[i]).reduce(f).unwrap()).collect()
                    };
                    assert_eq!(inc, &upto(r + 1, i64::wrapping_add), "size {n}, rank {r}: scan");
                    assert_eq!(max, &upto(r + 1, i64::max), "size {n}, rank {r}: scan max");
                    let want_exc = if r == 0 { vec![-7; len] } else { upto(r, i64::wrapping_add) };
                    assert_eq!(exc, &want_exc, "size {n}, rank {r}: exscan");
                }
            }
        }
        let rts = super::builder().build_local(1).unwrap();
        assert!(matches!(rts[0].world().scan(&[1u8, 2], &mut [0u8], Op::Sum), Err(Error::InvalidArgument(_))));
        assert!(matches!(rts[0].world().exscan(&[1f32], &mut [0f32], Op::BOr), Err(Error::InvalidArgument(_))));
    });
}

/// Sum of the inputs of ranks `0..n`, elementwise.
fn sum_of(n: u32, len: usize) -> Vec<i64> {
    (0..len).map(|i| (0..n).map(|r| input(r, len)[i]).sum()).collect()
}

#[test]
fn nonblocking_collectives_outstanding_at_once_complete_in_any_order() {
    within(120, "ibarrier, ibcast, ireduce, iallreduce outstanding together", || {
        for n in SIZES {
            let out = on_world(n, |r, c| {
                let len = 5;
                // Every root's broadcast and reduction, an allreduce and a barrier, all started
                // before any is waited for.
                let bar = c.ibarrier().unwrap();
                let mut reqs = Vec::new();
                for root in 0..n {
                    let data = if r == root { input(root, len) } else { vec![-1; len] };
                    reqs.push(c.ibcast(data, root).unwrap());
                    reqs.push(c.ireduce(input(r, len), Op::Sum, root).unwrap());
                }
                reqs.push(c.iallreduce(input(r, len), Op::Max).unwrap());
                // Waited for last to first: each completes on its own.
                let mut got: Vec<Vec<i64>> = reqs.into_iter().rev().map(|q| q.wait().unwrap().0).collect();
                got.reverse();
                bar.wait().unwrap();
                got
            });
            for (r, got) in out.iter().enumerate() {
                for root in 0..n as usize {
                    assert_eq!(got[2 * root], input(root as u32, 5), "size {n}, rank {r}: ibcast from {root}");
                    if r == root {
                        assert_eq!(got[2 * root + 1], sum_of(n, 5), "size {n}: ireduce at root {root}");
                    } else {
                        assert_eq!(got[2 * root + 1], input(r as u32, 5), "size {n}, rank {r}: ireduce leaves a non-root's data");
                    }
                }
                let max: Vec<i64> = (0..5).map(|i| (0..n).map(|q| input(q, 5)[i]).max().unwrap()).collect();
                assert_eq!(got[2 * n as usize], max, "size {n}, rank {r}: iallreduce");
            }
        }
    });
}

#[test]
fn nonblocking_collectives_wait_together_with_wait_all_and_receives() {
    within(60, "wait_all over collectives and a receive", || {
        let out = on_world(5, |r, c| {
            // A user message from the next rank, waited for with the collectives.
            let rx = c.irecv(Vec::<i64>::with_capacity(1), (r + 4) % 5, 3).unwrap();
            let mut reqs = vec![
                c.iallreduce(input(r, 300), Op::Sum).unwrap(),
                rx,
                c.iallgather(&[r as i64], vec![0; 5]).unwrap(),
                c.iscan(vec![r as i64 + 1], Op::Sum).unwrap(),
                // Concatenating decimal digits: associative, not commutative.
                c.iallreduce_with(vec![r as i64 + 1], |a, b| a * 10i64.pow(b.ilog10() + 1) + b).unwrap(),
            ];
            c.send(vec![r as i64 * 10], (r + 1) % 5, 3).unwrap();
            weft::wait_all(&mut reqs).unwrap();
            reqs.iter_mut().map(|q| q.take().unwrap().unwrap().0).collect::<Vec<_>>()
        });
        for (r, got) in out.iter().enumerate() {
            assert_eq!(got[0], sum_of(5, 300), "rank {r}");
            assert_eq!(got[1], vec![((r as i64 + 4) % 5) * 10], "rank {r}");
            assert_eq!(got[2], vec![0, 1, 2, 3, 4], "rank {r}");
            assert_eq!(got[3], vec![(1..=r as i64 + 1).sum::<i64>()], "rank {r}");
            assert_eq!(got[4], vec![12345], "rank {r}: iallreduce_with in rank order");
        }
    });
}

#[test]
fn collectives_on_distinct_communicators_from_many_threads() {
    within(120, "4 threads per rank, each on its own communicator", || {
        const THREADS: usize = 4;
        let rts = super::builder().build_local(3).unwrap();
        std::thread::scope(|s| {
            for rt in &rts {
                s.spawn(move || {
                    let comms: Vec<_> = (0..THREADS).map(|_| rt.world().dup().unwrap()).collect();
                    std::thread::scope(|s| {
                        for (t, c) in comms.iter().enumerate() {
                            s.spawn(move || {
                                for i in 0..50i64 {
                                    let v = c.iallreduce(vec![c.rank() as i64 + i, t as i64], Op::Sum).unwrap().wait().unwrap().0;
                                    assert_eq!(v, vec![3 + 3 * i, 3 * t as i64], "thread {t}, round {i}");
                                    let b = c.ibcast(vec![i * 7 + t as i64; 3], (i % 3) as u32).unwrap().wait().unwrap().0;
                                    assert_eq!(b, vec![i * 7 + t as i64; 3]);
                                    c.barrier().unwrap();
                                }
                            });
                        }
                    });
                });
            }
        });
    });
}

#[test]
fn nonblocking_collectives_are_futures_inside_tokio() {
    within(60, "collectives awaited in tokio", || {
        let out = on_world(4, |r, c| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            rt.block_on(async {
                // Two at once on one task, then one after the other.
                let (a, b) = tokio::join!(c.iallreduce(vec![r as u64 + 1], Op::Prod).unwrap(), c.ibcast(vec![r as u64; 2], 2).unwrap());
                c.ibarrier().unwrap().await.unwrap();
                let g = c.igather(&[r as u64], vec![0; if r == 1 { 4 } else { 0 }], 1).unwrap().await.unwrap().0;
                (a.unwrap().0, b.unwrap().0, g)
            })
        });
        for (r, (a, b, g)) in out.into_iter().enumerate() {
            assert_eq!((a, b), (vec![24], vec![2, 2]), "rank {r}");
            assert_eq!(g, if r == 1 { vec![0, 1, 2, 3] } else { vec![] }, "rank {r}");
        }
    });
}

#[test]
fn large_messages_take_the_ring_and_scatter_algorithms_and_agree() {
    within(180, "allreduce and bcast above their thresholds", || {
        let long = weft::ALLREDUCE_LONG_BYTES.max(weft::BCAST_LONG_BYTES) / 8 + 13;
        for n in [2u32, 3, 4, 5, weft::BCAST_LONG_RANKS, weft::BCAST_LONG_RANKS + 1] {
            let out = on_world(n, |r, c| {
                let mut sum = vec![0i64; long];
                c.allreduce(&input(r, long), &mut sum, Op::Sum).unwrap();
                let mut min = vec![0i64; long];
                c.allreduce(&input(r, long), &mut min, Op::Min).unwrap();
                let bc: Vec<Vec<i64>> = (0..n)
                    .map(|root| {
                        let mut d = if r == root { input(root, long) } else { vec![0; long] };
                        c.bcast(&mut d, root).unwrap();
                        d
                    })
                    .collect();
                (sum, min, bc)
            });
            let min: Vec<i64> = (0..long).map(|i| (0..n).map(|q| input(q, long)[i]).min().unwrap()).collect();
            for (r, (s, m, bc)) in out.iter().enumerate() {
                assert_eq!(s, &sum_of(n, long), "size {n}, rank {r}: ring allreduce sum");
                assert_eq!(m, &min, "size {n}, rank {r}: ring allreduce min");
                for (root, d) in bc.iter().enumerate() {
                    assert_eq!(d, &input(root as u32, long), "size {n}, rank {r}: bcast from {root}");
                }
            }
        }
    });
}

#[test]
fn large_bcasts_pipelined_in_segments_agree_at_every_root() {
    within(180, "bcast of two and a half segments, blocking, nonblocking and persistent", || {
        // Two whole segments and half of a third: each rank forwards segments while later
        // ones come in, and the last is short.
        let seg = weft::BCAST_SEGMENT_BYTES / 8;
        let long = 2 * seg + seg / 2;
        for n in [weft::BCAST_LONG_RANKS, weft::BCAST_LONG_RANKS + 1] {
            assert!(n < weft::BCAST_SCATTER_RANKS, "sizes of the pipelined tree");
            bcasts_agree_at_every_root(n, long, true);
        }
    });
}

/// On a world of `n`, a broadcast of `len` elements from every root, blocking, `ibcast` and
/// (with `persistent`) `bcast_init`, leaves the root's data on every rank.
pub(super) fn bcasts_agree_at_every_root(n: u32, len: usize, persistent: bool) {
    let out = on_world(n, |r, c| {
        (0..n)
            .map(|root| {
                let mut d = if r == root { input(root, len) } else { vec![0; len] };
                c.bcast(&mut d, root).unwrap();
                let nb = c.ibcast(if r == root { input(root, len) } else { vec![-1; len] }, root).unwrap().wait().unwrap().0;
                let p = persistent.then(|| {
                    let mut p = c.bcast_init(if r == root { input(root, len) } else { vec![-2; len] }, root).unwrap();
                    p.start().unwrap();
                    p.wait().unwrap();
                    p.buffer().unwrap().clone()
                });
                (d, nb, p)
            })
            .collect::<Vec<_>>()
    });
    for (r, per_root) in out.iter().enumerate() {
        for (root, (d, nb, p)) in per_root.iter().enumerate() {
            let want = input(root as u32, len);
            assert!(d == &want, "size {n}, rank {r}: bcast from {root}");
            assert!(nb == &want, "size {n}, rank {r}: ibcast from {root}");
            assert!(p.as_ref().map_or(true, |p| p == &want), "size {n}, rank {r}: persistent bcast from {root}");
        }
    }
}

#[test]
fn large_reductions_match_a_sequential_reference_at_every_size_and_root() {
    within(180, "reduce and allreduce above their thresholds, sizes 1-8, every root", || {
        let long = weft::REDUCE_LONG_BYTES.max(weft::ALLREDUCE_LONG_BYTES) / 8 + 13;
        for n in SIZES {
            let out = on_world(n, |r, c| {
                let mine = input(r, long);
                let mut all = vec![0i64; long];
                c.allreduce(&mine, &mut all, Op::Max).unwrap();
                let nb = c.iallreduce(mine.clone(), Op::Sum).unwrap().wait().unwrap().0;
                let rooted: Vec<(Vec<i64>, Vec<i64>)> = (0..n)
                    .map(|root| {
                        let mut got = vec![0i64; long];
                        c.reduce(&mine, &mut got, Op::Sum, root).unwrap();
                        // Nonblocking: the other ranks get their data back as it was.
                        let back = c.ireduce(mine.clone(), Op::Min, root).unwrap().wait().unwrap().0;
                        (got, back)
                    })
                    .collect();
                (all, nb, rooted)
            });
            let max: Vec<i64> = (0..long).map(|i| (0..n).map(|q| input(q, long)[i]).max().unwrap()).collect();
            let min: Vec<i64> = (0..long).map(|i| (0..n).map(|q| input(q, long)[i]).min().unwrap()).collect();
            for (r, (all, nb, rooted)) in out.iter().enumerate() {
                assert_eq!(all, &max, "size {n}, rank {r}: allreduce max");
                assert_eq!(nb, &sum_of(n, long), "size {n}, rank {r}: iallreduce sum");
                for (root, (got, back)) in rooted.iter().enumerate() {
                    if r == root {
                        assert_eq!(got, &sum_of(n, long), "size {n}: reduce sum at root {root}");
                        assert_eq!(back, &min, "size {n}: ireduce min at root {root}");
                    } else {
                        assert_eq!(back, &input(r as u32, long), "size {n}, rank {r}: ireduce to {root} changed its data");
                    }
                }
            }
        }
    });
}

/// A large allreduce on a number of ranks that is not a power of two takes Rabenseifner's
/// algorithm, the ranks beyond the largest power of two `p` folded in first (MPICH's): every
/// op agrees with a sequential reduction, and a call sends one message from a rank folded in,
/// `2 log2 p + 1` from its partner and `2 log2 p` from the others (the ring's `2 (n - 1)`
/// each, before).
#[test]
fn large_allreduce_on_any_number_of_ranks_folds_into_rabenseifners() {
    within(120, "large allreduce at 3, 5, 6 and 7 ranks, every op", || {
        let long = weft::ALLREDUCE_LONG_BYTES / 8 + 13;
        type Reduction = fn(i64, i64) -> i64;
        let ops: [(Op, Reduction); 7] = [
            (Op::Sum, i64::wrapping_add),
            (Op::Prod, i64::wrapping_mul),
            (Op::Min, i64::min),
            (Op::Max, i64::max),
            (Op::BAnd, |a, b| a & b),
            (Op::BOr, |a, b| a | b),
            (Op::BXor, |a, b| a ^ b),
        ];
        for n in [3u32, 5, 6, 7] {
            let rts = super::builder().build_local(n).unwrap();
            let out: Vec<(Vec<Vec<i64>>, u64)> = std::thread::scope(|s| {
                let hs: Vec<_> = rts
                    .iter()
                    .map(|rt| {
                        s.spawn(move || {
                            let c = rt.world();
                            let mine = input(c.rank(), long);
                            c.barrier().unwrap();
                            let before = rt.counters().messages_sent;
                            let mut got = Vec::new();
                            for (op, _) in ops {
                                let mut v = vec![0i64; long];
                                c.allreduce(&mine, &mut v, op).unwrap();
                                got.push(v);
                            }
                            let sent = rt.counters().messages_sent - before;
                            c.barrier().unwrap();
                            (got, sent)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let p = 1u32 << (31 - n.leading_zeros());
            let rem = n - p;
            for (r, (got, sent)) in out.iter().enumerate() {
                let r = r as u32;
                for ((op, f), v) in ops.iter().zip(got) {
                    let want: Vec<i64> = (0..long).map(|i| (0..n).map(|q| input(q, long)[i]).reduce(f).unwrap()).collect();
                    assert_eq!(v, &want, "{n} ranks, rank {r}: {op:?}");
                }
                let steps = 2 * u64::from(p.trailing_zeros());
                let per_call = match r {
                    r if r < 2 * rem && r % 2 == 0 => 1,
                    r if r < 2 * rem => steps + 1,
                    _ => steps,
                };
                assert_eq!(*sent, per_call * ops.len() as u64, "{n} ranks, rank {r}: messages sent by {} allreduces", ops.len());
            }
        }
    });
}

/// A thread that runs a collective on the calling thread keeps its plan for the next call of
/// the same collective on the same members only: calls that alternate communicators (a dup,
/// a split of other members), lengths and roots each get the result of their own.
/// An allreduce of another element type and the same length as the last one a rank's thread
/// ran takes its own algorithm (by its size in bytes and whether its type reduces exactly
/// in any order), not the plan kept from that call: ranks 1-3 ran a barrier in between and
/// make their plans afresh, rank 0 would reuse its last one, and the members would then
/// run different algorithms (messages that never come) or combine in another order.
#[test]
fn an_allreduce_of_another_type_of_the_same_length_takes_its_own_algorithm() {
    within(60, "allreduces of the same length and other element types", || {
        let out = on_world(4, |r, c| {
            let rest = c.split((r > 0).then_some(0), r as i32).unwrap();
            let v = u64::from(r) + 1;
            let mut got = Vec::new();
            // One exchange (8 B of integers, combined as they land), then one exchange (8 B
            // of floats, combined in rank order once all came); one exchange (256 B), then
            // Rabenseifner's (2 KiB).
            let mut a = [0u64];
            c.allreduce(&[v], &mut a, Op::Sum).unwrap();
            if let Some(rest) = &rest {
                rest.barrier().unwrap();
            }
            let mut b = [0f64];
            c.allreduce(&[v as f64], &mut b, Op::Sum).unwrap();
            got.push((a[0], b[0] as u64));
            let mut a = vec![0u8; weft::ALLREDUCE_EXCHANGE_BYTES];
            c.allreduce(&vec![v as u8; a.len()], &mut a, Op::Sum).unwrap();
            if let Some(rest) = &rest {
                rest.barrier().unwrap();
            }
            let mut b = vec![0u64; a.len()];
            c.allreduce(&vec![v; b.len()], &mut b, Op::Sum).unwrap();
            assert!(a.iter().all(|&x| x == a[0]) && b.iter().all(|&x| x == b[0]), "rank {r}: {a:?} {b:?}");
            got.push((u64::from(a[0]), b[0]));
            got
        });
        for (r, got) in out.iter().enumerate() {
            assert_eq!(got, &vec![(10, 10), (10, 10)], "rank {r}");
        }
    });
}

/// A broadcast of another element type and the same length as the last one a rank's thread
/// ran takes its own algorithm (by its size in bytes), as an allreduce does (above): on 8
/// ranks, 2,000 bytes go down the binomial tree and 16,000 by scatter and allgather.
#[test]
fn a_bcast_of_another_type_of_the_same_length_takes_its_own_algorithm() {
    within(60, "broadcasts of the same length and other element types", || {
        let len = 2000;
        let out = on_world(8, |r, c| {
            let rest = c.split((r > 0).then_some(0), r as i32).unwrap();
            let mut a = vec![if r == 0 { 7u8 } else { 0 }; len];
            c.bcast(&mut a, 0).unwrap();
            if let Some(rest) = &rest {
                rest.barrier().unwrap();
            }
            let mut b: Vec<u64> = (0..len as u64).map(|i| if r == 0 { i } else { 0 }).collect();
            c.bcast(&mut b, 0).unwrap();
            a.iter().all(|&x| x == 7) && b.iter().enumerate().all(|(i, &x)| x == i as u64)
        });
        assert_eq!(out, vec![true; 8]);
    });
}

#[test]
fn collectives_alternating_communicators_lengths_and_roots_each_get_their_own_result() {
    within(60, "allreduce and bcast alternating communicators, lengths and roots", || {
        let out = on_world(4, |r, c| {
            let half = c.split(Some(r % 2), r as i32).unwrap().unwrap();
            let dup = c.dup().unwrap();
            let comms = [c, &half, &dup, &half, c];
            let mut got = Vec::new();
            // The same collective, length and root in a row on other communicators, then
            // another length or root on the same one.
            for i in 0..4usize {
                let (len, root) = (1 + i % 2, (i / 2) as u32);
                let sums: Vec<Vec<i64>> = comms
                    .iter()
                    .map(|comm| {
                        let mut sum = vec![0i64; len];
                        comm.allreduce(&vec![i64::from(r) + 1; len], &mut sum, Op::Sum).unwrap();
                        sum
                    })
                    .collect();
                for (comm, sum) in comms.iter().zip(sums) {
                    let mut b = vec![i64::from(comm.rank()); len];
                    comm.bcast(&mut b, root).unwrap();
                    got.push((comm.size(), sum, root, b));
                }
            }
            got
        });
        for (r, got) in out.iter().enumerate() {
            for (size, sum, root, b) in got {
                // The world's ranks 1 + 2 + 3 + 4; a half's, those of its parity.
                let want = if *size == 4 {
                    10
                } else if r % 2 == 0 {
                    4
                } else {
                    6
                };
                assert!(sum.iter().all(|&x| x == want), "rank {r}, {size} ranks: allreduce {sum:?}");
                assert!(
                    b.len() == sum.len() && b.iter().all(|&x| x == i64::from(*root)),
                    "rank {r}, {size} ranks: bcast from {root}: {b:?}"
                );
            }
        }
    });
}

#[test]
fn alltoall_and_the_v_forms_match_a_sequential_reference() {
    within(120, "alltoall(v), gatherv, scatterv, allgatherv at sizes 1-8", || {
        for n in SIZES {
            // Rank r contributes r + 1 elements to the v forms; block q of rank r's alltoall
            // input is [100 r + q; 3].
            let counts: Vec<usize> = (0..n as usize).map(|r| r + 1).collect();
            let displs: Vec<usize> = counts.iter().scan(0, |acc, &c| Some(std::mem::replace(acc, *acc + c + 1))).collect();
            let total = displs[n as usize - 1] + counts[n as usize - 1];
            let mine = |r: u32| -> Vec<i64> { (0..=r as i64).map(|i| r as i64 * 10 + i).collect() };
            let out = on_world(n, |r, c| {
                let send: Vec<i64> = (0..n).flat_map(|q| vec![100 * r as i64 + q as i64; 3]).collect();
                let mut a2a = vec![0i64; 3 * n as usize];
                c.alltoall(&send, &mut a2a).unwrap();
                // alltoallv: rank r sends q + 1 elements to rank q, at the v-form layout.
                let sc: Vec<usize> = (0..n as usize).map(|q| q + 1).collect();
                let sd: Vec<usize> = sc.iter().scan(0, |acc, &k| Some(std::mem::replace(acc, *acc + k))).collect();
                let vsend: Vec<i64> = (0..n).flat_map(|q| vec![1000 * r as i64 + q as i64; q as usize + 1]).collect();
                let rc = vec![r as usize + 1; n as usize];
                let rd: Vec<usize> = (0..n as usize).map(|q| q * (r as usize + 1)).collect();
                let mut a2av = vec![0i64; n as usize * (r as usize + 1)];
                c.alltoallv(&vsend, &sc, &sd, &mut a2av, &rc, &rd).unwrap();
                let mut per_root = Vec::new();
                for root in 0..n {
                    let mut g = vec![-1i64; if r == root { total } else { 0 }];
                    c.gatherv(&mine(r), &mut g, &counts, &displs, root).unwrap();
                    // The root scatters what it gathered back: each rank gets its own.
                    let mut back = vec![0i64; r as usize + 1];
                    c.scatterv(&g, &counts, &displs, &mut back, root).unwrap();
                    assert_eq!(back, mine(r), "size {n}, root {root}, rank {r}: scatterv");
                    per_root.push(g);
                }
                let mut ag = vec![-1i64; total];
                c.allgatherv(&mine(r), &mut ag, &counts, &displs).unwrap();
                (a2a, a2av, per_root, ag)
            });
            let mut gathered = vec![-1i64; total];
            for q in 0..n {
                gathered[displs[q as usize]..][..counts[q as usize]].copy_from_slice(&mine(q));
            }
            for (r, (a2a, a2av, per_root, ag)) in out.iter().enumerate() {
                let want: Vec<i64> = (0..n).flat_map(|q| vec![100 * q as i64 + r as i64; 3]).collect();
                assert_eq!(a2a, &want, "size {n}, rank {r}: alltoall");
                let wantv: Vec<i64> = (0..n).flat_map(|q| vec![1000 * q as i64 + r as i64; r + 1]).collect();
                assert_eq!(a2av, &wantv, "size {n}, rank {r}: alltoallv");
                assert_eq!(per_root[r], gathered, "size {n}: gatherv at root {r}");
                assert_eq!(ag, &gathered, "size {n}, rank {r}: allgatherv");
            }
        }
    });
}

#[test]
fn v_forms_and_alltoall_refuse_bad_input() {
    within(60, "bad alltoall and v-form input", || {
        let rts = super::builder().build_local(2).unwrap();
        let c = rts[0].world();
        let bad = |e: Result<(), Error>| matches!(e, Err(Error::InvalidArgument(_)));
        assert!(bad(c.alltoall(&[1u8, 2, 3], &mut [0u8; 3])), "not size blocks");
        assert!(bad(c.alltoall(&[1u8, 2], &mut [0u8; 4])), "different lengths");
        assert!(bad(c.gatherv(&[1u8], &mut [0u8; 2], &[1], &[0, 1], 0)), "a count short");
        assert!(bad(c.gatherv(&[1u8], &mut [0u8; 2], &[1, 2], &[0, 1], 0)), "a block past the end");
        assert!(bad(c.gatherv(&[1u8, 2], &mut [0u8; 2], &[1, 1], &[0, 1], 0)), "the root's own count differs");
        assert!(bad(c.scatterv(&[1u8; 2], &[1, 1], &[0, usize::MAX], &mut [0u8], 0)), "a displacement overflows");
        assert!(bad(c.allgatherv(&[1u8, 2], &mut [0u8; 2], &[1, 1], &[0, 1])), "this rank's count differs");
        assert!(bad(c.alltoallv(&[1u8], &[1, 1], &[0, 1], &mut [0u8; 2], &[1, 1], &[0, 1])), "send blocks past the end");
        assert_eq!(c.scatterv(&[1u8; 2], &[1, 1], &[0, 1], &mut [0u8], 2).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
        assert_eq!(c.igatherv(&[1u8], vec![0; 2], &[1, 1], &[0, 1], 7).unwrap_err(), Error::RankOutOfRange { rank: 7, size: 2 });
        assert_eq!(c.ibcast(vec![0u8], 2).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
    });
}

#[test]
fn ranks_that_pass_different_lengths_all_fail_and_none_hangs() {
    within(60, "mismatched lengths across ranks", || {
        for n in [2u32, 3, 5, 8] {
            let out = on_world(n, |r, c| {
                // Rank 1 passes one element more than the others, to a small and a large
                // allreduce, an alltoallv and a bcast; each fails everywhere.
                let extra = usize::from(r == 1);
                let small = c.allreduce(&vec![1u32; 2 + extra], &mut vec![0u32; 2 + extra], Op::Sum);
                // Floats, whose small allreduce combines in rank order once all came, blocking
                // and nonblocking.
                let floats = c.allreduce(&vec![1f64; 2 + extra], &mut vec![0f64; 2 + extra], Op::Sum);
                let ifloats = c.iallreduce(vec![1f64; 2 + extra], Op::Sum).and_then(|q| q.wait()).map(drop);
                // The ring's threshold in u32s (its blocks stay below libfabric shm's inject
                // size: see `on_world`).
                let long = weft::ALLREDUCE_LONG_BYTES / 4;
                let large = c.allreduce(&vec![1u32; long + extra], &mut vec![0u32; long + extra], Op::Sum);
                let nn = n as usize;
                let sc: Vec<usize> = (0..nn).map(|q| if q == 0 { 1 + extra } else { 1 }).collect();
                let sd: Vec<usize> = sc.iter().scan(0, |a, &k| Some(std::mem::replace(a, *a + k))).collect();
                let a2a = c.alltoallv(&vec![1u8; nn + extra], &sc, &sd, &mut vec![0u8; nn], &vec![1; nn], &(0..nn).collect::<Vec<_>>());
                let bc = c.bcast(&mut vec![0u64; 3 + extra], 0);
                // The communicator still works for collectives that match.
                let mut ok = [0u32];
                c.allreduce(&[1], &mut ok, Op::Sum).unwrap();
                (small, [floats, ifloats], large, a2a, bc, ok[0])
            });
            for (r, (small, floats, large, a2a, bc, ok)) in out.into_iter().enumerate() {
                let mismatch = |e: &Result<(), Error>| matches!(e, Err(Error::InvalidArgument(_)));
                assert!(mismatch(&small) && mismatch(&large), "size {n}, rank {r}: {small:?} {large:?}");
                assert!(floats.iter().all(mismatch), "size {n}, rank {r}: floats {floats:?}");
                // Only rank 0 receives the extra element of the alltoallv (rank 1 may be done
                // before rank 0's notice comes); rank 1 receives a different length in the
                // bcast.
                if r == 0 {
                    assert!(mismatch(&a2a), "size {n}, rank {r}: alltoallv {a2a:?}");
                }
                if r == 1 {
                    assert!(mismatch(&bc), "size {n}: bcast at rank 1 {bc:?}");
                }
                assert_eq!(ok, n, "size {n}, rank {r}");
            }
        }
    });
}

#[test]
fn a_rank_lost_during_a_collective_fails_it_on_every_survivor() {
    within(60, "a rank that leaves during allreduce, barrier and bcast", || {
        for n in [2u32, 3, 4, 5] {
            let mut rts = super::builder().build_local(n).unwrap();
            let last = rts.pop().unwrap();
            let out = std::thread::scope(|s| {
                let hs: Vec<_> = rts
                    .iter()
                    .map(|rt| {
                        s.spawn(move || {
                            let c = rt.world();
                            let small = c.allreduce(&[1u32], &mut [0u32], Op::Sum);
                            // Again, the rank known lost before the call.
                            let again = c.allreduce(&[1u32], &mut [0u32], Op::Sum);
                            // The ring's threshold in u32s.
                            let long = vec![1u32; weft::ALLREDUCE_LONG_BYTES / 4];
                            let large = c.allreduce(&long, &mut long.clone(), Op::Sum);
                            let bar = c.barrier();
                            // A small bcast from rank 0 (its tree walked straight): the lost
                            // rank's parent fails; a rank whose part of the tree is whole
                            // may complete, with the root's data.
                            let mut data = [u64::from(c.rank()) + 10; 3];
                            let bc = c.bcast(&mut data, 0).map(|()| data);
                            ([small, again], large, bar, bc)
                        })
                    })
                    .collect();
                // The last rank leaves while the others are in their collectives.
                std::thread::sleep(std::time::Duration::from_millis(20));
                drop(last);
                hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
            });
            let lost = Err(Error::PeerLost { rank: n - 1 });
            // The lost rank's parent in the binomial tree from rank 0: its lowest set bit cleared.
            let parent = (n - 1) & (n - 2);
            for (r, (small, large, bar, bc)) in out.into_iter().enumerate() {
                assert_eq!((&small, &large, &bar), (&[lost; 2], &lost, &lost), "size {n}, rank {r}");
                match bc {
                    Ok(data) => assert!(r as u32 != parent && data == [10; 3], "size {n}, rank {r}: bcast gave {data:?}"),
                    Err(e) => assert_eq!(Err::<(), _>(e), lost, "size {n}, rank {r}"),
                }
            }
        }
    });
}

#[test]
fn a_collective_request_dropped_in_flight_still_takes_its_steps() {
    within(60, "dropped nonblocking collectives", || {
        let out = on_world(4, |r, c| {
            // Dropped at once: the schedules go on (the others need this rank's part), into
            // buffers the runtime keeps. (A ring allreduce, of blocks below libfabric shm's
            // inject size: see `on_world` on sends still completing at teardown.)
            for _ in 0..3 {
                drop(c.iallreduce(vec![u64::from(r); 300], Op::Sum).unwrap());
                drop(c.ibcast(vec![u64::from(r); 40], 1).unwrap());
            }
            c.iallreduce(vec![u64::from(r)], Op::Sum).unwrap().wait().unwrap().0
        });
        assert!(out.iter().all(|v| v == &vec![6]), "{out:?}");
    });
}

#[test]
fn freeing_a_communicator_fails_its_collectives_in_flight() {
    within(60, "a collective on a communicator freed under it", || {
        let rts = super::builder().build_local(2).unwrap();
        let d = on_world_dup(&rts);
        // Only rank 0 enters: its barrier waits for rank 1 until the communicator goes.
        let req = d.ibarrier().unwrap();
        d.clone().free();
        assert_eq!(req.wait().unwrap_err(), Error::CommFreed);
        assert_eq!(d.ibcast(vec![1u8], 0).unwrap_err(), Error::CommFreed);
    });
}

/// Start `k`'s input of rank `r`: differs by start, rank and position.
fn input_at(k: usize, r: u32, len: usize) -> Vec<i64> {
    input(r, len).into_iter().map(|x| x * (k as i64 + 1) - k as i64).collect()
}

/// Checks a rank's results, in order, against the reference's, saying `what` of a mismatch.
fn assert_results(got: &[Vec<i64>], want: &[Vec<i64>], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: results");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g, w, "{what}, result {i}");
    }
}

#[test]
fn persistent_collectives_match_a_sequential_reference_at_every_start() {
    within(120, "persistent bcast, reduce, allreduce at sizes 1-8, every root", || {
        const STARTS: usize = 3;
        for n in SIZES {
            for len in [1usize, 7, 3000] {
                let out = on_world(n, |r, c| {
                    let mut got = Vec::new();
                    let mut all = c.allreduce_init(vec![0i64; len], Op::Sum).unwrap();
                    let mut max = c.allreduce_init(vec![0i64; len], Op::Max).unwrap();
                    for k in 0..STARTS {
                        all.buffer_mut().unwrap().copy_from_slice(&input_at(k, r, len));
                        max.buffer_mut().unwrap().copy_from_slice(&input_at(k, r, len));
                        all.start().unwrap();
                        max.start().unwrap();
                        assert_eq!(all.wait().unwrap().bytes, len * 8);
                        max.wait().unwrap();
                        got.push(all.buffer().unwrap().clone());
                        got.push(max.buffer().unwrap().clone());
                    }
                    for root in 0..n {
                        let mut b = c.bcast_init(vec![-1i64; len], root).unwrap();
                        let mut s = c.reduce_init(vec![0i64; len], Op::Sum, root).unwrap();
                        for k in 0..STARTS {
                            if r == root {
                                b.buffer_mut().unwrap().copy_from_slice(&input_at(k, root, len));
                            }
                            s.buffer_mut().unwrap().copy_from_slice(&input_at(k, r, len));
                            b.start().unwrap();
                            s.start().unwrap();
                            b.wait().unwrap();
                            s.wait().unwrap();
                            got.push(b.buffer().unwrap().clone());
                            got.push(s.buffer().unwrap().clone());
                        }
                    }
                    got
                });
                for (r, got) in out.iter().enumerate() {
                    let mut want = Vec::new();
                    let fold = |k: usize, f: fn(i64, i64) -> i64| -> Vec<i64> {
                        let all: Vec<Vec<i64>> = (0..n).map(|q| input_at(k, q, len)).collect();
                        (0..len).map(|i| all.iter().map(|v| v[i]).reduce(f).unwrap()).collect()
                    };
                    for k in 0..STARTS {
                        want.push(fold(k, i64::wrapping_add));
                        want.push(fold(k, i64::max));
                    }
                    for root in 0..n {
                        for k in 0..STARTS {
                            want.push(input_at(k, root, len));
                            // The root gets the sum; the others keep their input.
                            want.push(if r as u32 == root { fold(k, i64::wrapping_add) } else { input_at(k, r as u32, len) });
                        }
                    }
                    assert_results(got, &want, &format!("size {n}, {len} elements, rank {r}"));
                }
            }
        }
    });
}

#[test]
fn nobody_leaves_a_persistent_barrier_before_everyone_entered() {
    within(60, "persistent barrier at sizes 1-8", || {
        for n in SIZES {
            let entered = AtomicU32::new(0);
            on_world(n, |r, c| {
                let mut b = c.barrier_init().unwrap();
                for round in 1..=5 {
                    if r == n - 1 {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    entered.fetch_add(1, Ordering::SeqCst);
                    b.start().unwrap();
                    b.wait().unwrap();
                    assert!(entered.load(Ordering::SeqCst) >= round * n, "size {n}: left round {round} early");
                    b.start().unwrap();
                    b.wait().unwrap();
                }
            });
        }
    });
}

/// `start_all` starts persistent collectives and point-to-point requests together, and
/// `wait_all` finishes them; a collective's messages never match the user's receives.
#[test]
fn start_all_mixes_persistent_collectives_and_point_to_point_requests() {
    within(60, "start_all over allreduce_init, send_init and recv_init", || {
        for n in [2u32, 3, 5] {
            let out = on_world(n, |r, c| {
                let (right, left) = ((r + 1) % n, (r + n - 1) % n);
                let mut reqs = vec![
                    c.recv_init(Vec::<u64>::with_capacity(2), Source::Any, Tag::Any).unwrap(),
                    c.allreduce_init(vec![0u64; 2], Op::Sum).unwrap(),
                    c.send_init(vec![0u64; 2], right, 4).unwrap(),
                ];
                let mut got = Vec::new();
                for k in 0..4u64 {
                    reqs[1].buffer_mut().unwrap().fill(u64::from(r) + k);
                    reqs[2].buffer_mut().unwrap().fill(100 * k + u64::from(r));
                    weft::Persistent::start_all(&mut reqs).unwrap();
                    weft::Persistent::wait_all(&mut reqs).unwrap();
                    assert_eq!(reqs[0].outcome().unwrap().unwrap().source, left);
                    got.push((reqs[0].buffer().unwrap().clone(), reqs[1].buffer().unwrap().clone()));
                }
                got
            });
            for (r, got) in out.iter().enumerate() {
                let left = (r as u64 + u64::from(n) - 1) % u64::from(n);
                for (k, (p2p, sum)) in got.iter().enumerate() {
                    let k = k as u64;
                    assert_eq!(p2p, &vec![100 * k + left; 2], "size {n}, rank {r}, start {k}");
                    assert_eq!(sum, &vec![(0..u64::from(n)).map(|q| q + k).sum::<u64>(); 2], "size {n}, rank {r}, start {k}");
                }
            }
        }
    });
}

#[test]
fn persistent_collectives_refuse_bad_input() {
    within(60, "bad persistent collective input", || {
        // Lengths that differ between ranks: an error at init on every rank.
        let out = on_world(3, |r, c| c.allreduce_init(vec![0u32; 2 + (r == 1) as usize], Op::Sum).map(drop));
        assert!(out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_)))), "{out:?}");
        let out = on_world(2, |r, c| c.bcast_init(vec![0u8; 4], r).map(drop));
        assert!(out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_)))), "{out:?}");
        let out = on_world(2, |r, c| c.reduce_init(vec![0u8; 4], if r == 0 { Op::Sum } else { Op::Max }, 0).map(drop));
        assert!(out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_)))), "{out:?}");
        // Refused on the calling rank alone, before anything is sent.
        let rts = super::builder().build_local(2).unwrap();
        let c = rts[0].world();
        assert_eq!(c.bcast_init(vec![0u8], 2).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
        assert!(matches!(c.allreduce_init(vec![1.0f32], Op::BXor), Err(Error::InvalidArgument(_))));
        // A start while active, a wait while inactive, a buffer resized since init.
        on_world(2, |_, c| {
            let mut a = c.allreduce_init(vec![1u8; 3], Op::Max).unwrap();
            assert!(matches!(a.wait(), Err(Error::InvalidArgument(_))));
            a.start().unwrap();
            assert!(matches!(a.start(), Err(Error::InvalidArgument(_))));
            a.wait().unwrap();
            a.buffer_mut().unwrap().push(4);
            assert!(matches!(a.start(), Err(Error::InvalidArgument(_))));
            a.buffer_mut().unwrap().pop();
            a.start().unwrap();
            a.wait().unwrap();
            assert_eq!(a.buffer().unwrap(), &vec![1u8; 3]);
        });
    });
}

/// A persistent collective dropped while active still takes its steps, so the other ranks'
/// starts complete, as a dropped nonblocking collective's do.
#[test]
fn a_persistent_collective_dropped_while_active_still_finishes() {
    within(60, "dropped active allreduce_init", || {
        let out = on_world(3, |r, c| {
            let mut a = c.allreduce_init(vec![u64::from(r) + 1; 4], Op::Sum).unwrap();
            a.start().unwrap();
            if r == 1 {
                drop(a);
                None
            } else {
                a.wait().unwrap();
                a.into_buffer()
            }
        });
        assert_eq!(out, [Some(vec![6; 4]), None, Some(vec![6; 4])]);
    });
}

/// A rank lost during a persistent collective fails its start on every survivor (those that
/// waited for the lost rank, and, through the failure notices, those that waited for a
/// survivor that failed): none hangs. A large broadcast from the lost rank, whose messages
/// would land straight in the survivors' buffers, fails too, and once its wait has returned
/// nothing writes the buffer any more.
#[test]
fn a_rank_lost_during_a_persistent_collective_fails_it_on_every_survivor() {
    /// Elements of the large broadcast: above the size received in place.
    const BIG: usize = 64 << 10;
    within(60, "a rank that leaves during persistent allreduce, barrier and large bcast", || {
        for n in [3u32, 4, 5] {
            let mut rts = super::builder().build_local(n).unwrap();
            let last = rts.pop().unwrap();
            let ready = std::sync::Barrier::new(n as usize);
            let out = std::thread::scope(|s| {
                let ready = &ready;
                let hs: Vec<_> = rts
                    .iter()
                    .map(|rt| {
                        s.spawn(move || {
                            let c = rt.world();
                            let mut sum = c.allreduce_init(vec![1u32], Op::Sum).unwrap();
                            let mut bar = c.barrier_init().unwrap();
                            let mut big = c.bcast_init(vec![c.rank() as u8; BIG], n - 1).unwrap();
                            big.start().unwrap();
                            ready.wait();
                            sum.start().unwrap();
                            let small = sum.wait().map(drop);
                            bar.start().unwrap();
                            let bar = bar.wait().map(drop);
                            let large = big.wait().map(drop);
                            // What the failed start left in the buffer stays as it is.
                            let left = big.buffer().unwrap().to_vec();
                            let until = std::time::Instant::now() + std::time::Duration::from_millis(20);
                            while std::time::Instant::now() < until {
                                let _ = c.iprobe(Source::Any, Tag::Any);
                            }
                            assert!(big.buffer().unwrap() == &left[..], "size {n}, rank {}: written after its failed start", c.rank());
                            (small, bar, large)
                        })
                    })
                    .collect();
                // The last rank makes its inits (collectives), then leaves while the others
                // are in their starts.
                {
                    let c = last.world();
                    let inits = (
                        c.allreduce_init(vec![1u32], Op::Sum).unwrap(),
                        c.barrier_init().unwrap(),
                        c.bcast_init(vec![9u8; BIG], n - 1).unwrap(),
                    );
                    ready.wait();
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    drop(inits);
                }
                drop(last);
                hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
            });
            let lost = Err(Error::PeerLost { rank: n - 1 });
            for (r, (small, bar, large)) in out.into_iter().enumerate() {
                assert_eq!((&small, &bar, &large), (&lost, &lost, &lost), "size {n}, rank {r}");
            }
        }
    });
}

#[test]
fn persistent_gathers_scatters_alltoalls_and_scans_match_a_sequential_reference() {
    within(120, "persistent gather, scatter, allgather, alltoall, scan, exscan at sizes 1-8, every root", || {
        const STARTS: usize = 2;
        for n in SIZES {
            let nn = n as usize;
            // Rank `r`'s block for rank `q` of an alltoall at start `k`.
            let pair = |k: usize, r: u32, q: u32, len: usize| input_at(k, 16 * r + q, len);
            let out = on_world(n, |r, c| {
                let mut got = Vec::new();
                for len in [1usize, 3] {
                    let mut ag = c.allgather_init(vec![0i64; nn * len]).unwrap();
                    let mut a2a = c.alltoall_init(vec![0i64; nn * len]).unwrap();
                    let mut scan = c.scan_init(vec![0i64; len], Op::Sum).unwrap();
                    let mut exscan = c.exscan_init(vec![0i64; len], Op::Sum).unwrap();
                    for k in 0..STARTS {
                        ag.buffer_mut().unwrap()[r as usize * len..][..len].copy_from_slice(&input_at(k, r, len));
                        let sends: Vec<i64> = (0..n).flat_map(|q| pair(k, r, q, len)).collect();
                        a2a.buffer_mut().unwrap().copy_from_slice(&sends);
                        scan.buffer_mut().unwrap().copy_from_slice(&input_at(k, r, len));
                        exscan.buffer_mut().unwrap().copy_from_slice(&input_at(k, r, len));
                        for p in [&mut ag, &mut a2a, &mut scan, &mut exscan] {
                            p.start().unwrap();
                        }
                        for p in [&mut ag, &mut a2a, &mut scan, &mut exscan] {
                            p.wait().unwrap();
                            got.push(p.buffer().unwrap().clone());
                        }
                    }
                    for root in 0..n {
                        let own = if r == root { nn * len } else { len };
                        let mut g = c.gather_init(vec![0i64; own], root).unwrap();
                        let mut s = c.scatter_init(vec![0i64; own], root).unwrap();
                        for k in 0..STARTS {
                            g.buffer_mut().unwrap()[if r == root { r as usize * len } else { 0 }..][..len]
                                .copy_from_slice(&input_at(k, r, len));
                            if r == root {
                                let blocks: Vec<i64> = (0..n).flat_map(|q| input_at(k, 100 + q, len)).collect();
                                s.buffer_mut().unwrap().copy_from_slice(&blocks);
                            }
                            g.start().unwrap();
                            s.start().unwrap();
                            g.wait().unwrap();
                            s.wait().unwrap();
                            got.push(g.buffer().unwrap().clone());
                            got.push(s.buffer().unwrap().clone());
                        }
                    }
                }
                got
            });
            for (r, got) in out.iter().enumerate() {
                let r = r as u32;
                let mut want = Vec::new();
                for len in [1usize, 3] {
                    let sum = |k: usize, ranks: std::ops::Range<u32>| -> Vec<i64> {
                        (0..len).map(|i| ranks.clone().map(|q| input_at(k, q, len)[i]).fold(0i64, i64::wrapping_add)).collect()
                    };
                    for k in 0..STARTS {
                        want.push((0..n).flat_map(|q| input_at(k, q, len)).collect::<Vec<_>>());
                        want.push((0..n).flat_map(|q| pair(k, q, r, len)).collect());
                        want.push(sum(k, 0..r + 1));
                        // Rank 0's exscan buffer is left as it was.
                        want.push(if r == 0 { input_at(k, 0, len) } else { sum(k, 0..r) });
                    }
                    for root in 0..n {
                        for k in 0..STARTS {
                            if r == root {
                                want.push((0..n).flat_map(|q| input_at(k, q, len)).collect());
                                want.push((0..n).flat_map(|q| input_at(k, 100 + q, len)).collect());
                            } else {
                                want.push(input_at(k, r, len));
                                want.push(input_at(k, 100 + r, len));
                            }
                        }
                    }
                }
                assert_results(got, &want, &format!("size {n}, rank {r}"));
            }
        }
    });
}

#[test]
fn persistent_gathers_scatters_alltoalls_and_scans_refuse_bad_input() {
    within(60, "bad persistent gather, scatter, allgather, alltoall, scan input", || {
        // A buffer that is no whole number of blocks on one rank, or blocks of another
        // length: an error at init on every rank.
        let out = on_world(3, |r, c| c.allgather_init(vec![0u32; 3 + (r == 1) as usize]).map(drop));
        assert!(out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_)))), "{out:?}");
        let out = on_world(3, |r, c| c.alltoall_init(vec![0u32; 3 * (1 + (r == 2) as usize)]).map(drop));
        assert!(out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_)))), "{out:?}");
        let out = on_world(3, |r, c| c.gather_init(vec![0u32; if r == 0 { 7 } else { 2 }], 0).map(drop));
        assert!(out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_)))), "{out:?}");
        let out = on_world(3, |r, c| c.scatter_init(vec![0u32; if r == 1 { 6 } else { 3 }], 1).map(drop));
        assert!(out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_)))), "{out:?}");
        let out = on_world(2, |r, c| c.gather_init(vec![0u8; 2], r).map(drop));
        assert!(out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_)))), "{out:?}");
        let out = on_world(2, |r, c| c.exscan_init(vec![0u8; 4], if r == 0 { Op::Sum } else { Op::Prod }).map(drop));
        assert!(out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_)))), "{out:?}");
        // Refused on the calling rank alone, before anything is sent.
        let rts = super::builder().build_local(2).unwrap();
        let c = rts[0].world();
        assert_eq!(c.gather_init(vec![0u8; 2], 2).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
        assert_eq!(c.scatter_init(vec![0u8; 2], 5).unwrap_err(), Error::RankOutOfRange { rank: 5, size: 2 });
        assert!(matches!(c.scan_init(vec![1.0f64], Op::BAnd), Err(Error::InvalidArgument(_))));
    });
}

/// A persistent allreduce, broadcast and reduce of a large message take the algorithm the
/// blocking call takes at that size (Rabenseifner's or the ring's allreduce, the
/// scatter-allgather broadcast, the reduce-scatter-gather reduce), not the small-message
/// trees: each rank sends as many messages per start as per blocking call.
#[test]
fn large_persistent_allreduce_bcast_and_reduce_send_what_the_blocking_ones_send() {
    within(60, "messages of large persistent allreduce, bcast and reduce", || {
        // `(ranks, elements, collective)`: Rabenseifner's, the ring, scatter-allgather,
        // reduce-scatter-gather.
        for (n, len, coll) in [(4u32, 1usize << 12, "allreduce"), (3, 1 << 12, "allreduce"), (8, 1 << 12, "bcast"), (4, 1 << 12, "reduce")]
        {
            let rts = super::builder().build_local(n).unwrap();
            let out: Vec<(u64, u64, Vec<u64>)> = std::thread::scope(|s| {
                let hs: Vec<_> = rts
                    .iter()
                    .map(|rt| {
                        s.spawn(move || {
                            let c = rt.world();
                            let data: Vec<u64> = (0..len as u64).map(|i| i * u64::from(c.rank() + 1)).collect();
                            let mut p = match coll {
                                "bcast" => c.bcast_init(data.clone(), 1),
                                "reduce" => c.reduce_init(data.clone(), Op::Sum, 1),
                                _ => c.allreduce_init(data.clone(), Op::Sum),
                            }
                            .unwrap();
                            let mut res = data.clone();
                            c.barrier().unwrap();
                            let before = rt.counters().messages_sent;
                            match coll {
                                "bcast" => c.bcast(&mut res, 1).unwrap(),
                                "reduce" => c.reduce(&data, &mut res, Op::Sum, 1).unwrap(),
                                _ => c.allreduce(&data, &mut res, Op::Sum).unwrap(),
                            }
                            let blocking = rt.counters().messages_sent - before;
                            c.barrier().unwrap();
                            let before = rt.counters().messages_sent;
                            p.start().unwrap();
                            p.wait().unwrap();
                            let persistent = rt.counters().messages_sent - before;
                            c.barrier().unwrap();
                            assert_eq!(p.buffer().unwrap(), &res);
                            (blocking, persistent, res)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (r, (blocking, persistent, _)) in out.iter().enumerate() {
                assert_eq!(persistent, blocking, "{n} ranks, {len} elements, {coll}, rank {r}: messages sent");
            }
        }
    });
}

/// Rank `r`'s count in the `v` tests (zero for some), and displacements that put the blocks
/// in reverse rank order with a gap of one element after each.
fn v_layout(n: u32) -> (Vec<usize>, Vec<usize>, usize) {
    let counts: Vec<usize> = (0..n).map(|r| (r as usize * 2 + 1) % 4).collect();
    let mut displs = vec![0; n as usize];
    let mut at = 0;
    for r in (0..n as usize).rev() {
        displs[r] = at;
        at += counts[r] + 1;
    }
    (counts, displs, at)
}

#[test]
fn persistent_v_forms_match_a_sequential_reference() {
    within(120, "persistent gatherv, scatterv, allgatherv, alltoallv at sizes 1-8, every root", || {
        const STARTS: usize = 2;
        for n in SIZES {
            let (counts, displs, total) = v_layout(n);
            // The alltoallv's count between ranks `a` and `b` (the same both ways), and its layout
            // on rank `r`: blocks one after the other.
            let pc = |a: u32, b: u32| ((a + b) % 3) as usize;
            let pair_layout = |r: u32| -> (Vec<usize>, Vec<usize>) {
                let c: Vec<usize> = (0..n).map(|q| pc(r, q)).collect();
                let d = c.iter().scan(0, |at, &x| Some(std::mem::replace(at, *at + x))).collect();
                (c, d)
            };
            let out = on_world(n, |r, c| {
                let mut got = Vec::new();
                let mine = counts[r as usize];
                let (ac, ad) = pair_layout(r);
                let mut ag = c.allgatherv_init(vec![-1i64; total], &counts, &displs).unwrap();
                let mut a2a = c.alltoallv_init(vec![0i64; ac.iter().sum()], &ac, &ad).unwrap();
                for k in 0..STARTS {
                    ag.buffer_mut().unwrap()[displs[r as usize]..][..mine].copy_from_slice(&input_at(k, r, mine));
                    for q in 0..n {
                        a2a.buffer_mut().unwrap()[ad[q as usize]..][..ac[q as usize]].copy_from_slice(&input_at(
                            k,
                            16 * r + q,
                            ac[q as usize],
                        ));
                    }
                    ag.start().unwrap();
                    a2a.start().unwrap();
                    ag.wait().unwrap();
                    a2a.wait().unwrap();
                    got.push(ag.buffer().unwrap().clone());
                    got.push(a2a.buffer().unwrap().clone());
                }
                for root in 0..n {
                    let own = if r == root { total } else { mine };
                    let mut g = c.gatherv_init(vec![-1i64; own], &counts, &displs, root).unwrap();
                    let mut s = c.scatterv_init(vec![-1i64; own], &counts, &displs, root).unwrap();
                    for k in 0..STARTS {
                        g.buffer_mut().unwrap()[if r == root { displs[r as usize] } else { 0 }..][..mine]
                            .copy_from_slice(&input_at(k, r, mine));
                        if r == root {
                            for q in 0..n as usize {
                                s.buffer_mut().unwrap()[displs[q]..][..counts[q]].copy_from_slice(&input_at(k, 100 + q as u32, counts[q]));
                            }
                        }
                        g.start().unwrap();
                        s.start().unwrap();
                        g.wait().unwrap();
                        s.wait().unwrap();
                        got.push(g.buffer().unwrap().clone());
                        got.push(s.buffer().unwrap().clone());
                    }
                }
                got
            });
            // Every rank's blocks in the layout, from `block(q)`, the gaps as `gap`.
            let laid = |block: &dyn Fn(u32) -> Vec<i64>, gap: i64| -> Vec<i64> {
                let mut v = vec![gap; total];
                for q in 0..n {
                    v[displs[q as usize]..][..counts[q as usize]].copy_from_slice(&block(q));
                }
                v
            };
            for (r, got) in out.iter().enumerate() {
                let r = r as u32;
                let mine = counts[r as usize];
                let (ac, _) = pair_layout(r);
                let mut want = Vec::new();
                for k in 0..STARTS {
                    want.push(laid(&|q| input_at(k, q, counts[q as usize]), -1));
                    want.push((0..n).flat_map(|q| input_at(k, 16 * q + r, ac[q as usize])).collect::<Vec<_>>());
                }
                for root in 0..n {
                    for k in 0..STARTS {
                        if r == root {
                            want.push(laid(&|q| input_at(k, q, counts[q as usize]), -1));
                            want.push(laid(&|q| input_at(k, 100 + q, counts[q as usize]), -1));
                        } else {
                            want.push(input_at(k, r, mine));
                            want.push(input_at(k, 100 + r, mine));
                        }
                    }
                }
                assert_results(got, &want, &format!("size {n}, rank {r}"));
            }
        }
    });
}

#[test]
fn persistent_v_forms_refuse_counts_that_disagree() {
    within(60, "bad persistent gatherv, scatterv, allgatherv, alltoallv input", || {
        let all_fail = |out: &[Result<(), Error>]| out.iter().all(|e| matches!(e, Err(Error::InvalidArgument(_))));
        // A rank whose length is not the root's count for it.
        let out = on_world(3, |r, c| {
            c.gatherv_init(vec![0u8; if r == 0 { 6 } else { 1 + (r == 2) as usize }], &[2, 1, 1], &[0, 2, 4], 0).map(drop)
        });
        assert!(all_fail(&out), "{out:?}");
        // Blocks that leave the root's buffer.
        let out = on_world(3, |r, c| c.scatterv_init(vec![0u8; if r == 1 { 3 } else { 1 }], &[1, 1, 1], &[0, 1, 3], 1).map(drop));
        assert!(all_fail(&out), "{out:?}");
        // Counts that differ between ranks.
        let out = on_world(3, |r, c| c.allgatherv_init(vec![0u8; 4], &[1, 1, 1 + (r == 1) as usize], &[0, 1, 2]).map(drop));
        assert!(all_fail(&out), "{out:?}");
        // Rank 0 sends rank 1 two elements, rank 1 expects one.
        let out = on_world(2, |r, c| c.alltoallv_init(vec![0u8; 3], &[1, 2 - r as usize], &[0, 1]).map(drop));
        assert!(all_fail(&out), "{out:?}");
    });
}
