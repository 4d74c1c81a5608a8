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
