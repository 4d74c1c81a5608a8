//! One-sided windows on the embedded provider (the suite is shared with `p2p_ofi.rs`), and
//! what only the embedded provider can show in one process: a target that is gone.

fn builder() -> weft::Builder {
    weft::Runtime::builder().env(false)
}

mod common;
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
