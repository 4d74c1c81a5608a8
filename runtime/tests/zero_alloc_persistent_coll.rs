//! Starting persistent collectives allocates nothing in steady state (counting global
//! allocator; a binary of its own, as `zero_alloc_persistent.rs`).

use weft::{Communicator, Op, Persistent, ProgressMode, Runtime};

#[path = "common/counting.rs"]
mod counting;

/// Starts every rank's requests (`start_all`), then tests them until none is active: one
/// thread drives all the ranks, as `zero_alloc_persistent.rs` does (a thread that blocked
/// would park, which is not a start's cost).
fn run<B: Send + 'static>(per_rank: &mut [Vec<Persistent<'_, B>>]) {
    for reqs in per_rank.iter_mut() {
        Persistent::start_all(reqs).unwrap();
    }
    while per_rank.iter().flatten().any(Persistent::is_active) {
        for r in per_rank.iter_mut().flatten().filter(|r| r.is_active()) {
            if let Some(outcome) = r.test() {
                outcome.unwrap();
            }
        }
    }
}

/// The init `f` made on every rank of `cs` at once (it is a collective).
fn init<'c, B: Send + 'static>(
    cs: &'c [Communicator],
    f: impl Fn(&'c Communicator) -> Vec<Persistent<'c, B>> + Sync,
) -> Vec<Vec<Persistent<'c, B>>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = cs.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Three ranks start and finish a persistent barrier, broadcast, reduce and allreduce (the
/// last with point-to-point requests, by `start_all`), and a gather, scatter, allgather,
/// alltoall, scan, exscan and a ring allreduce (a large message) together; once warm,
/// thousands of starts allocate nothing.
#[test]
fn persistent_collective_starts_allocate_nothing() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let rts = Runtime::builder().env(false).progress(mode).cris(1).build_local(3).unwrap();
        let cs: Vec<Communicator> = rts.iter().map(|rt| rt.world().clone()).collect();
        let n = 3u32;
        let mut barriers = init(&cs, |c| vec![c.barrier_init().unwrap()]);
        let mut bcasts = init(&cs, |c| vec![c.bcast_init(vec![0u64; 16], 1).unwrap()]);
        let mut reduces = init(&cs, |c| vec![c.reduce_init(vec![0u64; 16], Op::Sum, 2).unwrap()]);
        let mut sets = init(&cs, |c| {
            let r = c.rank();
            vec![
                c.allreduce_init(vec![0u64; 8], Op::Max).unwrap(),
                c.recv_init(Vec::<u64>::with_capacity(8), (r + n - 1) % n, 3).unwrap(),
                c.send_init(vec![u64::from(r); 8], (r + 1) % n, 3).unwrap(),
            ]
        });
        let mut more = init(&cs, |c| {
            let r = c.rank();
            vec![
                c.gather_init(vec![0u64; if r == 0 { 12 } else { 4 }], 0).unwrap(),
                c.scatter_init(vec![0u64; if r == 1 { 12 } else { 4 }], 1).unwrap(),
                c.allgather_init(vec![0u64; 12]).unwrap(),
                c.alltoall_init(vec![0u64; 12]).unwrap(),
                c.scan_init(vec![0u64; 4], Op::Sum).unwrap(),
                c.exscan_init(vec![0u64; 4], Op::Sum).unwrap(),
                c.allreduce_init(vec![0u64; 256], Op::Sum).unwrap(),
            ]
        });
        let mut round = |i: u64| {
            run(&mut barriers);
            for (r, b) in bcasts.iter_mut().enumerate() {
                b[0].buffer_mut().unwrap().fill(i + r as u64);
            }
            run(&mut bcasts);
            for (r, b) in reduces.iter_mut().chain(sets.iter_mut()).enumerate() {
                b[0].buffer_mut().unwrap().fill(i + r as u64 % 3);
            }
            run(&mut reduces);
            run(&mut sets);
            for r in 0..3 {
                assert_eq!(bcasts[r][0].buffer().unwrap()[0], i + 1);
                assert_eq!(sets[r][0].buffer().unwrap()[0], i + 2);
                assert_eq!(sets[r][1].buffer().unwrap()[0], (r as u64 + 2) % 3);
            }
            assert_eq!(reduces[2][0].buffer().unwrap()[0], 3 * i + 3);
            // The second set, one round in eight (its starts cost more in a debug build).
            if i % 8 != 0 {
                return;
            }
            for (r, m) in more.iter_mut().enumerate() {
                for p in m.iter_mut() {
                    p.buffer_mut().unwrap().fill(i + r as u64);
                }
            }
            run(&mut more);
            assert_eq!(more[0][0].buffer().unwrap()[8], i + 2);
            assert_eq!(more[2][4].buffer().unwrap()[0], 3 * i + 3);
            assert_eq!(more[1][6].buffer().unwrap()[255], 3 * i + 3);
        };
        // Warm the pools and queues past the first trim of the processed-number windows
        // (as `zero_alloc.rs`).
        for i in 0..3000 {
            round(i);
        }
        let allocs = counting::allocations(|| {
            for i in 0..1000 {
                round(i);
            }
        });
        assert_eq!(allocs, 0, "{mode}: allocations in 5,875 steady-state starts of persistent collectives");
    }
}
