//! Small blocking collectives allocate nothing in the steady state (counting global
//! allocator; a binary of its own, as `zero_alloc.rs`): they run their plan on the calling
//! thread in storage the thread keeps, their messages in scratch buffers it keeps. Only a
//! step that waited long enough to park allocates (the sync object's listener of a
//! `wait_any`), which the timing of the threads decides: the test bounds those.

use std::sync::Barrier;

use weft::{Op, ProgressMode, Runtime};

#[path = "common/counting.rs"]
mod counting;

/// Three ranks, a thread each (the ranks beyond a power of two fold into the allreduce),
/// make `barrier`, `bcast` from every root, `reduce` and `allreduce` of a few elements; once
/// warm, 300 rounds allocate less than once per rank and round (in practice a few times in
/// all, where steps parked), where running them as schedules allocated about twenty times
/// per round.
#[test]
fn small_blocking_collectives_allocate_nothing() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let n = 3u32;
        let rts = Runtime::builder().env(false).progress(mode).cris(1).build_local(n).unwrap();
        let gate = Barrier::new(n as usize);
        let counted = std::thread::scope(|s| {
            let hs: Vec<_> = rts
                .iter()
                .map(|rt| {
                    let gate = &gate;
                    s.spawn(move || {
                        let c = rt.world();
                        let me = u64::from(c.rank());
                        let send = [me + 1; 4];
                        let (mut sum, mut data) = ([0u64; 4], [0u32; 2]);
                        let round = |i: u32, sum: &mut [u64; 4], data: &mut [u32; 2]| {
                            c.barrier().unwrap();
                            let root = i % n;
                            *data = if c.rank() == root { [i, root] } else { [0, 0] };
                            c.bcast(data, root).unwrap();
                            assert_eq!(*data, [i, root]);
                            c.allreduce(&send, sum, Op::Sum).unwrap();
                            assert_eq!(*sum, [u64::from(n * (n + 1) / 2); 4]);
                            c.reduce(&send, sum, Op::Max, root).unwrap();
                            if c.rank() == root {
                                assert_eq!(*sum, [u64::from(n); 4]);
                            }
                        };
                        for i in 0..1500 {
                            round(i, &mut sum, &mut data);
                        }
                        let mut rounds = || {
                            gate.wait();
                            for i in 0..300 {
                                round(i, &mut sum, &mut data);
                            }
                            gate.wait();
                        };
                        if c.rank() == 0 {
                            counting::allocations(&mut rounds)
                        } else {
                            rounds();
                            0
                        }
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
        });
        assert!(
            counted < 300 * n as usize,
            "{mode}: {counted} allocations in 300 rounds of barrier, bcast, allreduce and reduce on {n} ranks"
        );
    }
}
