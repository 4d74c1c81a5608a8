//! Blocking collectives against a sequential reference, at odd and power-of-two sizes, on
//! the world and on communicators over a subset of the ranks, each bounded in time.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use common::within;
use weft::{Communicator, Error, Op, Runtime, Source, Tag};

const SIZES: [u32; 6] = [1, 2, 3, 4, 5, 8];

/// Runs `f(rank, world)` on one thread per rank of a local world of `n` and returns the
/// results by rank.
fn on_world<T: Send>(n: u32, f: impl Fn(u32, &Communicator) -> T + Sync) -> Vec<T> {
    let rts = Runtime::builder().build_local(n).unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = rts
            .iter()
            .enumerate()
            .map(|(r, rt)| {
                let f = &f;
                s.spawn(move || f(r as u32, rt.world()))
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

#[test]
fn collectives_refuse_bad_input() {
    within(60, "bad collective input", || {
        let rts = Runtime::builder().build_local(2).unwrap();
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
        let rts = Runtime::builder().build_local(2).unwrap();
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
        let rts = Runtime::builder().build_local(1).unwrap();
        assert!(matches!(rts[0].world().scan(&[1u8, 2], &mut [0u8], Op::Sum), Err(Error::InvalidArgument(_))));
        assert!(matches!(rts[0].world().exscan(&[1f32], &mut [0f32], Op::BOr), Err(Error::InvalidArgument(_))));
    });
}
