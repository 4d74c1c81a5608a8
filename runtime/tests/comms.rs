//! Groups and communicator creation: communicators over a subset of the ranks (`split`,
//! `create_group`), and context id allocation from many threads at once ([Dinan 2012]):
//! properties 1-5 of its §4 and the scenario of its Fig. 1, each bounded in time.

mod common;

use std::collections::HashSet;

use common::within;
use weft::{Communicator, Error, Runtime, Source, Tag};

fn local(n: u32) -> Vec<Runtime> {
    Runtime::builder().build_local(n).unwrap()
}

/// Runs `f(rank, runtime)` on one thread per rank and returns the results by rank.
fn on_ranks<T: Send>(rts: &[Runtime], f: impl Fn(u32, &Runtime) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let hs: Vec<_> = rts
            .iter()
            .enumerate()
            .map(|(r, rt)| {
                s.spawn({
                    let f = &f;
                    move || f(r as u32, rt)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn create_group_makes_a_communicator_of_the_members_only() {
    within(60, "create_group over ranks 3 and 1 of 4", || {
        let rts = local(4);
        let out = on_ranks(&rts, |r, rt| {
            let world = rt.world();
            let g = world.group().incl(&[3, 1]).unwrap();
            assert_eq!((g.size(), g.rank()), (2, [None, Some(1), None, Some(0)][r as usize]));
            if g.rank().is_none() {
                assert!(matches!(world.create_group(&g, 7), Err(Error::InvalidArgument(_))), "a non-member is refused");
                return None;
            }
            let c = world.create_group(&g, 7).unwrap();
            assert_eq!((c.size(), c.rank()), (2, g.rank().unwrap()));
            assert_eq!(c.group().translate_ranks(&[0, 1], &world.group()).unwrap(), vec![Some(3), Some(1)]);
            let peer = 1 - c.rank();
            // Ranks, sources and statuses are the communicator's, not the world's.
            let rx = c.irecv(Vec::<u32>::with_capacity(1), Source::Any, Tag::Any).unwrap();
            c.send(vec![r], peer, 5).unwrap();
            let (v, st) = rx.wait().unwrap();
            assert_eq!((st.source, st.tag), (peer, 5));
            let (_, st) = c.send(vec![0u8], peer, 6).unwrap();
            assert_eq!(st.source, peer, "a send's status names the destination's rank here");
            let (_, st) = c.recv(Vec::<u8>::with_capacity(1), peer, 6).unwrap();
            assert_eq!(st.source, peer);
            assert_eq!(c.send(vec![0u8], 2, 1).unwrap_err(), Error::RankOutOfRange { rank: 2, size: 2 });
            // A world message does not reach it, nor it the world.
            assert!(c.iprobe(Source::Any, Tag::Any).unwrap().is_none());
            Some((c.context_id(), v[0]))
        });
        assert_eq!(out[1], Some((out[3].unwrap().0, 3)));
        assert_eq!(out[3], Some((out[1].unwrap().0, 1)));
        assert_eq!((out[0], out[2]), (None, None));
    });
}

#[test]
fn create_group_refuses_bad_input() {
    within(60, "create_group with bad input", || {
        let rts = local(3);
        let world = rts[0].world();
        let g = world.group().incl(&[0, 1]).unwrap();
        assert_eq!(world.create_group(&g, -1).unwrap_err(), Error::InvalidTag { tag: -1, max: i32::MAX });
        // A group of a communicator that lacks rank 2 cannot name rank 2's process here.
        let sub_rts = on_ranks(&rts[..2], |_, rt| rt.world().create_group(&rt.world().group().incl(&[0, 1]).unwrap(), 1).unwrap());
        let wide = world.group();
        assert!(matches!(sub_rts[0].create_group(&wide, 2), Err(Error::InvalidArgument(_))));
        // A group made on another rank of this process.
        let other = rts[1].world().group();
        assert!(matches!(world.create_group(&other, 3), Err(Error::InvalidArgument(_))));
    });
}

#[test]
fn split_orders_by_key_and_leaves_undefined_ranks_out() {
    within(60, "split of 5 ranks", || {
        let rts = local(5);
        let out = on_ranks(&rts, |r, rt| {
            let world = rt.world();
            // Rank 4 is undefined; evens and odds, each ordered by descending world rank.
            let color = (r != 4).then_some(r % 2);
            let c = world.split(color, -(r as i32)).unwrap();
            let c = c?;
            let n = c.size();
            // A ring inside the new communicator carries world ranks.
            let rx = c.irecv(Vec::<u32>::with_capacity(1), (c.rank() + n - 1) % n, 0).unwrap();
            c.send(vec![r], (c.rank() + 1) % n, 0).unwrap();
            let from = rx.wait().unwrap().0[0];
            Some((c.rank(), n, from))
        });
        assert_eq!(out[4], None);
        // Evens {0, 2}: 2 first (key -2). Odds {1, 3}: 3 first.
        assert_eq!(out[2], Some((0, 2, 0)));
        assert_eq!(out[0], Some((1, 2, 2)));
        assert_eq!(out[3], Some((0, 2, 1)));
        assert_eq!(out[1], Some((1, 2, 3)));
        // The pair the undefined rank held back is free again: the world still dups.
        let d = on_ranks(&rts, |_, rt| rt.world().dup().unwrap().context_id());
        assert!(d.iter().all(|&c| c == d[0]));
    });
}

#[test]
fn an_uncontended_creation_costs_one_allreduce() {
    within(60, "eager allocation", || {
        let rts = local(3);
        let counts = on_ranks(&rts, |_, rt| {
            let w = rt.world();
            let before = w.creation_allreduces();
            let d = w.dup().unwrap();
            let s = d.split(Some(0), 0).unwrap().unwrap();
            let g = s.create_group(&s.group(), 9).unwrap();
            let after = w.creation_allreduces();
            drop((d, s, g));
            after - before
        });
        // dup, split (its exchange of colors is not an allocation), create_group.
        assert_eq!(counts, vec![3, 3, 3]);
    });
}

/// Property 1 of [Dinan 2012, §4]: for one operation every process selects the same id, and
/// an id is allocated at most once per process; with 4 threads per rank creating at once.
#[test]
fn concurrent_creations_agree_and_never_share_an_id() {
    within(120, "4 threads x 3 ranks creating 25 communicators each", || {
        const THREADS: usize = 4;
        const EACH: usize = 25;
        let rts = local(3);
        let parents: Vec<Vec<Communicator>> = on_ranks(&rts, |_, rt| (0..THREADS).map(|_| rt.world().dup().unwrap()).collect());
        let ids: Vec<Vec<Vec<Communicator>>> = std::thread::scope(|s| {
            let hs: Vec<Vec<_>> = parents
                .iter()
                .map(|ps| ps.iter().map(|p| s.spawn(move || (0..EACH).map(|_| p.dup().unwrap()).collect::<Vec<_>>())).collect())
                .collect();
            hs.into_iter().map(|v| v.into_iter().map(|h| h.join().unwrap()).collect()).collect()
        });
        for t in 0..THREADS {
            for i in 0..EACH {
                let c = ids[0][t][i].context_id();
                assert!(ids.iter().all(|rank| rank[t][i].context_id() == c), "thread {t} creation {i}: the ranks disagree");
            }
        }
        for rank in &ids {
            let slots: HashSet<u32> = rank.iter().flatten().map(|c| c.context_id() & 0xfff).collect();
            assert_eq!(slots.len(), THREADS * EACH, "a context id held twice on one rank");
        }
    });
}

/// [Dinan 2012, Fig. 1]: 2 ranks x 2 threads; thread `t` of rank `t` duplicates its own
/// one-rank communicator (`MPI_COMM_SELF`), then every thread duplicates the communicator of
/// the threads with its number. Without the synchronizing step the one-rank creation waits
/// forever behind a thread holding the mask in an allreduce; property 2: nobody blocks.
#[test]
fn fig1_scenario_does_not_deadlock() {
    within(180, "Fig. 1 scenario, 1,000 repetitions", || {
        let rts = local(2);
        let per_rank: Vec<(Communicator, Vec<Communicator>)> = on_ranks(&rts, |r, rt| {
            let w = rt.world();
            let me = w.create_group(&w.group().incl(&[r]).unwrap(), 1).unwrap();
            (me, (0..2).map(|_| w.dup().unwrap()).collect())
        });
        std::thread::scope(|s| {
            for (r, (me, threads)) in per_rank.iter().enumerate() {
                for (t, tc) in threads.iter().enumerate() {
                    s.spawn(move || {
                        for _ in 0..1000 {
                            if t == r {
                                me.dup().unwrap().free();
                            }
                            tc.dup().unwrap().free();
                        }
                    });
                }
            }
        });
    });
}

/// Overlapping groups at once: on 3 ranks, the ring edge `{e, e+1}` is created by thread 0
/// of rank `e` and thread 1 of rank `e+1`, so each rank creates on its two edges from two
/// threads concurrently, and the three groups overlap pairwise (properties 2-5: every
/// attempt completes; each edge's tag tells its creations apart on the shared parent).
#[test]
fn overlapping_groups_from_two_threads_complete() {
    within(60, "overlapping create_group from 2 threads x 3 ranks, 1,000 repetitions", || {
        let rts = local(3);
        std::thread::scope(|s| {
            for (r, rt) in rts.iter().enumerate() {
                for t in 0..2u32 {
                    s.spawn(move || {
                        let w = rt.world();
                        let edge = (r as u32 + 3 - t) % 3;
                        let g = w.group().incl(&[edge, (edge + 1) % 3]).unwrap();
                        for i in 0..1000 {
                            let c = w.create_group(&g, edge as i32).unwrap();
                            assert_eq!((c.size(), c.rank()), (2, t), "repetition {i}");
                            c.free();
                        }
                    });
                }
            }
        });
    });
}

/// 8 threads per rank creating and freeing in a loop, more often than there are ids: freed
/// ids come back (properties 4 and 5 under contention), and the mask is left usable.
#[test]
fn creating_and_freeing_from_8_threads_reuses_ids() {
    within(300, "8 threads x 2 ranks x 300 dup/free", || {
        let rts = local(2);
        let parents: Vec<Vec<Communicator>> = on_ranks(&rts, |_, rt| (0..8).map(|_| rt.world().dup().unwrap()).collect());
        std::thread::scope(|s| {
            for ps in &parents {
                for p in ps {
                    s.spawn(move || {
                        for _ in 0..300 {
                            let c = p.dup().unwrap();
                            let peer = 1 - c.rank();
                            let rx = c.irecv(Vec::<u8>::with_capacity(1), peer, 0).unwrap();
                            c.send(vec![1u8], peer, 0).unwrap();
                            rx.wait().unwrap();
                            c.free();
                        }
                    });
                }
            }
        });
        // Uncontended again: one allreduce.
        let counts = on_ranks(&rts, |_, rt| {
            let before = rt.world().creation_allreduces();
            rt.world().dup().unwrap();
            rt.world().creation_allreduces() - before
        });
        assert_eq!(counts, vec![1, 1]);
    });
}

#[test]
fn running_out_of_ids_fails_on_every_rank() {
    within(300, "dup until the ids run out", || {
        let rts = local(2);
        let out = on_ranks(&rts, |_, rt| {
            let mut live = Vec::new();
            loop {
                match rt.world().dup() {
                    Ok(c) => live.push(c),
                    Err(e) => break (live.len(), e),
                }
            }
        });
        // Every pair but the world's.
        assert_eq!(out[0].0, 2047);
        assert_eq!(out[1].0, 2047);
        assert!(matches!(out[0].1, Error::InvalidArgument(_)) && matches!(out[1].1, Error::InvalidArgument(_)));
    });
}

/// A peer lost to a communicator over a subset is named by its rank there: world rank 2 is
/// rank 1 of the group `{0, 2}`.
#[test]
fn a_lost_member_is_named_by_its_rank_in_the_communicator() {
    within(60, "a finished member of a two-rank group", || {
        let mut rts = local(3);
        let comms =
            on_ranks(&rts, |r, rt| (r != 1).then(|| rt.world().create_group(&rt.world().group().incl(&[0, 2]).unwrap(), 4).unwrap()));
        let mut comms = comms.into_iter();
        let c = comms.next().unwrap().unwrap();
        let mut pending = c.irecv(Vec::<u8>::with_capacity(1), 1u32, 9).unwrap();
        drop(comms);
        drop(rts.pop());
        let t0 = std::time::Instant::now();
        while !pending.test() {
            assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the receive from the finished member is still pending");
        }
        assert_eq!(pending.take().unwrap().unwrap_err(), Error::PeerLost { rank: 1 });
        assert_eq!(c.send(vec![1u8], 1, 9).unwrap_err(), Error::PeerLost { rank: 1 });
        assert_eq!(c.iprobe(1u32, 9).unwrap_err(), Error::PeerLost { rank: 1 });
        assert_eq!(c.recv(Vec::<u8>::with_capacity(1), 1u32, 9).unwrap_err(), Error::PeerLost { rank: 1 });
    });
}

/// Without the eager segment the first allreduce only synchronizes, and the base protocol
/// allocates: two allreduces per uncontended creation, ids still agreed.
#[test]
fn the_base_protocol_alone_takes_two_allreduces() {
    within(60, "base protocol", || {
        let rts = Runtime::builder().eager_context_ids(false).build_local(3).unwrap();
        let out = on_ranks(&rts, |_, rt| {
            let w = rt.world();
            let before = w.creation_allreduces();
            let d = w.dup().unwrap();
            (w.creation_allreduces() - before, d.context_id())
        });
        assert!(out.iter().all(|&(n, id)| n == 2 && id == out[0].1), "{out:?}");
    });
}
