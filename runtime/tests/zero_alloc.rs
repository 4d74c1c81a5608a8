//! Steady-state eager sends and receives allocate nothing (counting global allocator).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use weft::{ProgressMode, Runtime};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
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
static GLOBAL: Counting = Counting;

#[test]
fn eager_steady_state_allocates_nothing() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let rts = Runtime::builder().env(false).progress(mode).cris(1).build_local(2).unwrap();
        let (c0, c1) = (rts[0].world(), rts[1].world());
        let mut sbuf = vec![3u8; 100]; // pooled-buffer path
        let mut tiny = vec![1u8; 8]; // inline path
        let mut rbuf = Vec::<u8>::with_capacity(100);
        let round = |sbuf: &mut Vec<u8>, tiny: &mut Vec<u8>, rbuf: &mut Vec<u8>| {
            let r = c1.irecv(std::mem::take(rbuf), 0u32, 1).unwrap();
            let s = c0.isend(std::mem::take(sbuf), 1, 1).unwrap();
            *sbuf = s.wait().unwrap().0;
            let (b, st) = r.wait().unwrap();
            assert_eq!(st.bytes, 100);
            *rbuf = b;
            let s = c0.isend(std::mem::take(tiny), 1, 2).unwrap(); // unexpected first
            let r = c1.irecv(std::mem::take(rbuf), 0u32, 2).unwrap();
            *tiny = s.wait().unwrap().0;
            *rbuf = r.wait().unwrap().0;
        };
        // Warm the pools and queues: 10,000 messages, past the first trim of the
        // communicator's processed-number windows (partitioned matching), which sizes the
        // windows of every tag partition once.
        for _ in 0..5000 {
            round(&mut sbuf, &mut tiny, &mut rbuf);
        }
        ALLOCS.store(0, Ordering::Relaxed);
        ARMED.store(true, Ordering::Relaxed);
        for _ in 0..10_000 {
            round(&mut sbuf, &mut tiny, &mut rbuf);
        }
        ARMED.store(false, Ordering::Relaxed);
        assert_eq!(ALLOCS.load(Ordering::Relaxed), 0, "{mode}: allocations in 20,000 steady-state eager messages");
    }
}
