//! Steady-state eager sends and receives allocate nothing (counting global allocator).

use weft::{ProgressMode, Runtime};

#[path = "common/counting.rs"]
mod counting;

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
        let n = counting::allocations(|| {
            for _ in 0..10_000 {
                round(&mut sbuf, &mut tiny, &mut rbuf);
            }
        });
        assert_eq!(n, 0, "{mode}: allocations in 20,000 steady-state eager messages");
    }
}
