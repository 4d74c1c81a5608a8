//! Starting persistent requests allocates nothing in steady state (counting global
//! allocator; a binary of its own, as `zero_alloc.rs`, so no other test counts meanwhile).

use weft::{Persistent, ProgressMode, Runtime};

#[path = "common/counting.rs"]
mod counting;

/// Starting and waiting for persistent eager sends and receives (one at a time, and a set
/// with `start_all` / `wait_all`, its messages unexpected first) allocates nothing once warm.
#[test]
fn persistent_starts_allocate_nothing() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        let rts = Runtime::builder().env(false).progress(mode).cris(1).build_local(2).unwrap();
        let (c0, c1) = (rts[0].world(), rts[1].world());
        let mut send = c0.send_init(vec![3u8; 100], 1, 1).unwrap();
        let mut recv = c1.recv_init(Vec::<u8>::with_capacity(100), 0u32, 1).unwrap();
        let mut sends: Vec<_> = (0..4).map(|t| c0.send_init(vec![t as u8; 8], 1, 10 + t).unwrap()).collect();
        let mut recvs: Vec<_> = (0..4).map(|t| c1.recv_init(Vec::<u8>::with_capacity(8), 0u32, 10 + t).unwrap()).collect();
        let round = || {
            recv.start().unwrap();
            send.start().unwrap();
            send.wait().unwrap();
            assert_eq!(recv.wait().unwrap().bytes, 100);
            Persistent::start_all(&mut sends).unwrap();
            Persistent::start_all(&mut recvs).unwrap();
            Persistent::wait_all(&mut sends).unwrap();
            Persistent::wait_all(&mut recvs).unwrap();
        };
        // Warm the pools and queues past the first trim of the processed-number windows
        // (as `zero_alloc.rs`).
        let n = counting::allocations_after_warming(2000, 2000, round);
        assert_eq!(n, 0, "{mode}: allocations in 10,000 steady-state persistent starts");
        assert_eq!(recvs[3].buffer().unwrap(), &vec![3u8; 8]);
    }
}
