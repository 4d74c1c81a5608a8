//! Large collectives in the steady state allocate no large buffers: the blocking forms work
//! in the caller's buffer and their steps take their message buffers from the collectives'
//! pool of scratch buffers, so no call maps fresh memory (whose page faults cost more than
//! the copies of a large message). One test in this binary: its allocator counts every
//! thread's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use weft::{Op, Runtime};

/// Allocations at least this large are counted.
const LARGE: usize = 16 << 10;

struct CountLarge;
static LARGE_BYTES: AtomicUsize = AtomicUsize::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for CountLarge {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if l.size() >= LARGE && ARMED.load(Ordering::Relaxed) {
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
    let n = 4u32;
    let len = 128 << 10; // 1 MiB of u64
    let rts = Runtime::builder().env(false).build_local(n).unwrap();
    let calls = |rounds: usize| {
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
                    for round in 0..rounds as u64 {
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
    calls(3);
    LARGE_BYTES.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    // The ranks allocate their own buffers (4.25 MiB each, made before the calls).
    calls(10);
    ARMED.store(false, Ordering::Relaxed);
    let per_rank_buffers = (len * 4 + len / n as usize) * 8;
    let extra = LARGE_BYTES.load(Ordering::Relaxed).saturating_sub(n as usize * per_rank_buffers);
    assert_eq!(
        extra, 0,
        "bytes of large allocations in 10 rounds of 1 MiB bcast, allreduce and allgather on {n} ranks, besides the ranks' own buffers"
    );
}
