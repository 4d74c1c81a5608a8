//! Steady-state eager sends and receives allocate nothing on the libfabric `shm` provider
//! (counting global allocator over every thread, the ofi watcher included). libfabric itself
//! allocates with the C allocator, which this does not see: the test checks weft's side of
//! the path (frames, payload pools, requests, staging).
#![cfg(feature = "ofi")]

use weft::{ProgressMode, Runtime};

#[path = "common/counting.rs"]
mod counting;

/// parking_lot creates its global table, and a thread's parking data, at the first contended
/// lock (the ofi watcher's try-lock can meet a runtime thread on a CRI): a one-time cost per
/// process and thread, paid here before measuring.
fn warm_parking_lot() {
    let m = std::sync::Arc::new(parking_lot::Mutex::new(()));
    let m2 = m.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let g = m2.lock();
        tx.send(()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        drop(g);
    });
    rx.recv().unwrap();
    drop(m.lock()); // this thread parks
    t.join().unwrap();
}

#[test]
fn eager_steady_state_allocates_nothing_on_shm() {
    warm_parking_lot();
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let rts = Runtime::builder().env(false).provider(weft::Provider::Shm).progress(mode).cris(1).build_local(2).unwrap();
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
        let n = counting::allocations_after_warming(5000, 10_000, || round(&mut sbuf, &mut tiny, &mut rbuf));
        assert_eq!(n, 0, "{mode}: allocations in 20,000 steady-state eager messages");
    }
}
