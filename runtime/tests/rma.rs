//! One-sided windows and the distributed locks on the embedded provider (the suites are
//! shared with `p2p_ofi.rs`), and what only the embedded provider shows in one process: a
//! target that is gone, the locks over three simulated levels at 100,000 acquisitions, and
//! 10,000 tasks waiting for a lock on one thread.

fn builder() -> weft::Builder {
    weft::Runtime::builder().env(false)
}

mod common;
mod dht_suite;
mod dlock_suite;
mod rma_suite;

use weft::rma::{Op, Window};
use weft::Error;

/// Operations on a rank that finished fail with `PeerLost`, without waiting.
#[test]
fn a_lost_target_is_peer_lost() {
    common::within(30, "lost target", || {
        let mut rts = builder().build_local(2).unwrap();
        let r1 = rts.pop().unwrap();
        let r0 = rts.pop().unwrap();
        let t = std::thread::spawn(move || {
            let w: Window<'_, u64> = r1.world().window(4).unwrap();
            drop(w);
            drop(r1);
        });
        let w: Window<'_, u64> = r0.world().window(4).unwrap();
        t.join().unwrap();
        assert_eq!(w.put(1, 0, &[1]), Err(Error::PeerLost { rank: 1 }));
        assert_eq!(w.get(1, 0, &mut [0]), Err(Error::PeerLost { rank: 1 }));
        assert_eq!(w.fetch_and_op(1, 0, 1, Op::Sum), Err(Error::PeerLost { rank: 1 }));
        assert_eq!(w.compare_and_swap(1, 0, 0, 1), Err(Error::PeerLost { rank: 1 }));
        assert_eq!(w.flush(1), Err(Error::PeerLost { rank: 1 }));
        assert_eq!(w.fetch_and_op(0, 0, 1, Op::Sum), Ok(0), "the own part still works");
    });
}

mod three_levels {
    //! The topology-aware locks over three simulated levels (2 ranks per node, 2 nodes per
    //! rack, 8 ranks), many acquisitions: the embedded provider only (fast enough here).

    use std::sync::atomic::{AtomicU64, Ordering};

    use weft::dlock::{Levels, RmaMcs, RmaRw, Thresholds};
    use weft::rma::{Op, Window};

    use crate::common::within;

    const RANKS: u32 = 8;
    const THREADS: u64 = 2;
    /// 8 ranks x 2 threads x 6,250: 100,000 acquisitions per test.
    const ACQUISITIONS: u64 = 6250;

    /// Runs `f` on one thread per rank of `RANKS` in-process ranks, bounded in time.
    fn on_ranks(what: &'static str, f: impl Fn(&weft::Communicator) + Send + Sync + 'static) {
        within(120, what, move || {
            let rts = weft::Runtime::builder().env(false).build_local(RANKS).unwrap();
            std::thread::scope(|s| {
                for rt in &rts {
                    let f = &f;
                    s.spawn(move || f(rt.world()));
                }
            });
        });
    }

    #[test]
    fn rma_mcs_three_levels_counts_exactly() {
        on_ranks("RMA-MCS, three levels", |c| {
            let lock = RmaMcs::new(c, &Levels::simulated(&[2, 2]), &Thresholds { t_l: vec![1, 3, 2], ..Thresholds::default() }).unwrap();
            let w: Window<'_, u64> = c.window(2).unwrap();
            c.barrier().unwrap();
            std::thread::scope(|s| {
                for _ in 0..THREADS {
                    s.spawn(|| {
                        for _ in 0..ACQUISITIONS {
                            let g = lock.lock().unwrap();
                            assert_eq!(w.fetch_and_op(5, 1, 1, Op::Sum).unwrap(), 0, "two holders");
                            let mut v = [0u64];
                            w.get(5, 0, &mut v).unwrap();
                            w.put(5, 0, &[v[0] + 1]).unwrap();
                            w.fetch_and_op(5, 1, u64::MAX, Op::Sum).unwrap();
                            drop(g);
                        }
                    });
                }
            });
            c.barrier().unwrap();
            let mut v = [0u64];
            w.get(5, 0, &mut v).unwrap();
            assert_eq!(v[0], u64::from(RANKS) * THREADS * ACQUISITIONS);
            c.barrier().unwrap();
        });
    }

    #[test]
    fn rma_rw_three_levels_excludes_and_counts_exactly() {
        let writes = std::sync::Arc::new(AtomicU64::new(0));
        on_ranks("RMA-RW, three levels", move |c| {
            let writes = &*writes;
            let t = Thresholds { t_l: vec![2, 2, 3], t_r: 4, t_dc: 4 };
            let lock = RmaRw::new(c, &Levels::simulated(&[2, 2]), &t).unwrap();
            let w: Window<'_, u64> = c.window(3).unwrap();
            c.barrier().unwrap();
            std::thread::scope(|s| {
                for th in 0..THREADS {
                    let (lock, w) = (&lock, &w);
                    s.spawn(move || {
                        for i in 0..ACQUISITIONS {
                            // One in five a write (one in three on even ranks).
                            let every = if c.rank() % 2 == 0 { 3 } else { 5 };
                            if (i + th) % every == 0 {
                                let g = lock.write().unwrap();
                                assert_eq!(w.fetch_and_op(5, 1, 1, Op::Sum).unwrap(), 0, "two writers");
                                assert_eq!(w.fetch_and_op(5, 2, 0, Op::NoOp).unwrap(), 0, "readers beside a writer");
                                let mut v = [0u64];
                                w.get(5, 0, &mut v).unwrap();
                                w.put(5, 0, &[v[0] + 1]).unwrap();
                                w.fetch_and_op(5, 1, u64::MAX, Op::Sum).unwrap();
                                drop(g);
                                writes.fetch_add(1, Ordering::Relaxed);
                            } else {
                                let g = lock.read().unwrap();
                                w.fetch_and_op(5, 2, 1, Op::Sum).unwrap();
                                assert_eq!(w.fetch_and_op(5, 1, 0, Op::NoOp).unwrap(), 0, "a writer beside readers");
                                w.fetch_and_op(5, 2, u64::MAX, Op::Sum).unwrap();
                                drop(g);
                            }
                        }
                    });
                }
            });
            c.barrier().unwrap();
            let mut v = [0u64];
            w.get(5, 0, &mut v).unwrap();
            c.barrier().unwrap();
            assert_eq!(v[0], writes.load(Ordering::Relaxed));
            c.barrier().unwrap();
        });
    }

    /// On one host, [`Levels::hosts`] makes one node of every rank, which splits nothing:
    /// the lock has the machine's level alone.
    #[test]
    fn host_levels_put_in_process_ranks_on_one_node() {
        within(60, "host levels", || {
            let rts = weft::Runtime::builder().env(false).build_local(3).unwrap();
            std::thread::scope(|s| {
                for rt in &rts {
                    s.spawn(move || {
                        let c = rt.world();
                        let lock = RmaMcs::new(c, &Levels::default(), &Thresholds::default()).unwrap();
                        for _ in 0..50 {
                            lock.lock().unwrap().unlock().unwrap();
                        }
                        c.barrier().unwrap();
                        assert!(format!("{lock:?}").contains("levels: 1"), "{lock:?}");
                    });
                }
            });
        });
    }
}

/// 10,000 tokio tasks of one rank, all on one thread, wait for the RMA-RW lock as writers
/// while the other rank's thread takes it too: the tasks park (no thread each), and every
/// one gets in once.
#[test]
fn ten_thousand_tasks_wait_on_one_thread() {
    use std::sync::Arc;
    use weft::dlock::{Levels, RmaRw, Thresholds};
    const TASKS: u64 = 10_000;
    common::within(120, "10,000 waiting tasks", || {
        let rts = builder().build_local(2).unwrap();
        std::thread::scope(|s| {
            for rt in &rts {
                s.spawn(move || {
                    let c = rt.world();
                    let lock = Arc::new(RmaRw::new(c, &Levels::flat(), &Thresholds::default()).unwrap());
                    let w: Arc<Window<'static, u64>> = Arc::new(c.window(1).unwrap());
                    c.barrier().unwrap();
                    if c.rank() == 0 {
                        let tokio = tokio::runtime::Builder::new_current_thread().build().unwrap();
                        tokio.block_on(async {
                            let tasks: Vec<_> = (0..TASKS)
                                .map(|_| {
                                    let (lock, w) = (lock.clone(), w.clone());
                                    tokio::spawn(async move {
                                        let g = lock.write_async().await.unwrap();
                                        let mut v = [0u64];
                                        w.get(1, 0, &mut v).unwrap();
                                        w.put(1, 0, &[v[0] + 1]).unwrap();
                                        g.unlock_async().await.unwrap();
                                    })
                                })
                                .collect();
                            for t in tasks {
                                t.await.unwrap();
                            }
                        });
                    } else {
                        for _ in 0..1000 {
                            let g = lock.write().unwrap();
                            let mut v = [0u64];
                            w.get(1, 0, &mut v).unwrap();
                            w.put(1, 0, &[v[0] + 1]).unwrap();
                            g.unlock().unwrap();
                        }
                    }
                    c.barrier().unwrap();
                    let mut v = [0u64];
                    w.get(1, 0, &mut v).unwrap();
                    assert_eq!(v[0], TASKS + 1000);
                    c.barrier().unwrap();
                });
            }
        });
    });
}
