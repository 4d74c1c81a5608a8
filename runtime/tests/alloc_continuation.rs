//! A continuation in the steady state allocates one block: its boxed callback. The count it
//! adds to its continuation request is a count of the request's sync object, with no
//! operation behind it (`SyncObject::count_one`); the receive's operation, which nothing holds once its result went
//! to the callback, goes back to the pool of the thread that completed it; a wait for the
//! callbacks allocates nothing (counting global allocator).

use std::sync::{Arc, Mutex};

use weft::{Invoke, Runtime};

#[path = "common/counting.rs"]
mod counting;

#[test]
fn a_continuation_allocates_only_its_callback() {
    let rts = Runtime::builder().env(false).cris(1).build_local(2).unwrap();
    let (a, b) = (rts[0].world(), rts[1].world());
    let cr = rts[1].continuation_request();
    // The receive buffer goes round: the callback puts it back here.
    let back: Arc<Mutex<Option<Vec<u64>>>> = Arc::new(Mutex::new(Some(Vec::with_capacity(1))));
    let mut sbuf = vec![0u64; 1];
    let mut round = |i: u64| {
        let rbuf = back.lock().unwrap().take().expect("the callback gave the buffer back");
        let mut r = b.irecv(rbuf, 0u32, 1).unwrap();
        let slot = back.clone();
        cr.attach(&mut r, Invoke::Inline, move |res| {
            let (buf, _) = res.expect("received");
            assert_eq!(buf[0], i);
            *slot.lock().unwrap() = Some(buf);
        })
        .unwrap();
        sbuf[0] = i;
        sbuf = a.send(std::mem::take(&mut sbuf), 1, 1).unwrap().0;
        cr.wait().unwrap();
    };
    for i in 0..2000 {
        round(i);
    }
    let n = counting::allocations(|| {
        for i in 0..1000 {
            round(i);
        }
    });
    // One per continuation, and a few where a queue of the runtime grows once.
    assert!(n <= 1000 + 16, "{n} allocations in 1,000 continuations: more than the callback's box each");
}
