//! Transport-level RMA through `Transport` (register_window, put, get, fetch-and-op, CAS,
//! flush) on every provider: embedded always, shm and tcp;ofi_rxm with feature `ofi`.

use weft_transport::embedded::{fabric, EmbeddedOptions};
use weft_transport::{Error, RmaOp, Transport};

fn check(name: &str, ranks: Vec<Transport>) {
    let (a, b) = (&ranks[0], &ranks[1]);
    let mut window = vec![0u64; 4];
    // SAFETY: `window` outlives the registration (deregistered below) and this test reads it
    // only after the operations completed (flushed / blocking).
    let w = unsafe { b.register_window(window.as_mut_ptr().cast(), 32) }.unwrap();
    assert_eq!((w.rank, w.len), (1, 32));
    let value = 0x0102_0304_0506_0708u64.to_le_bytes();
    // SAFETY: `value` lives until the flush.
    unsafe { a.put(0, &w, 0, &value) }.unwrap();
    a.flush(0).unwrap();
    let mut back = [0u8; 8];
    // SAFETY: `back` is untouched until the flush.
    unsafe { a.get(0, &w, 0, &mut back) }.unwrap();
    a.flush(0).unwrap();
    assert_eq!(back, value, "{name}: get after put");
    assert_eq!(a.fetch_op(0, &w, 8, RmaOp::Sum, 5).unwrap(), 0, "{name}");
    assert_eq!(a.fetch_op(0, &w, 8, RmaOp::Sum, 7).unwrap(), 5, "{name}");
    assert_eq!(a.fetch_op(0, &w, 8, RmaOp::Max, 3).unwrap(), 12, "{name}");
    assert_eq!(a.compare_swap(0, &w, 16, 0, 42).unwrap(), 0, "{name}");
    assert_eq!(a.compare_swap(0, &w, 16, 0, 43).unwrap(), 42, "{name}: CAS must not swap on mismatch");
    assert_eq!(a.fetch_op(0, &w, 24, RmaOp::Swap, 9).unwrap(), 0, "{name}");
    assert_eq!(a.fetch_op(0, &w, 24, RmaOp::Read, 0).unwrap(), 9, "{name}");
    assert!(a.fetch_op(0, &w, 32, RmaOp::Sum, 1).is_err(), "{name}: out of bounds must fail");
    b.deregister(w.key);
    assert_eq!(window, vec![0x0102_0304_0506_0708, 12, 42, 9], "{name}");
}

#[test]
fn rma_on_the_embedded_provider() {
    let eps = fabric(EmbeddedOptions { ranks: 2, ..EmbeddedOptions::default() }).unwrap();
    let ranks: Vec<Transport> = eps.into_iter().map(Transport::Embedded).collect();
    check("embedded", ranks);
    // A rendezvous registration is read-only to peers; an unknown key is an error.
    let eps = fabric(EmbeddedOptions { ranks: 2, ..EmbeddedOptions::default() }).unwrap();
    let ranks: Vec<Transport> = eps.into_iter().map(Transport::Embedded).collect();
    let data = [0u8; 16];
    // SAFETY: `data` outlives the registration and is not modified.
    let key = unsafe { ranks[1].register(data.as_ptr(), 16) }.unwrap();
    let ro = weft_transport::RemoteWindow { rank: 1, key, base: 0, len: 16 };
    // SAFETY: the put fails before touching memory; `[1]` lives across the call.
    assert!(matches!(unsafe { ranks[0].put(0, &ro, 0, &[1]) }, Err(Error::InvalidArgument(_))));
    let bad = weft_transport::RemoteWindow { key: 999, ..ro };
    assert!(ranks[0].fetch_op(0, &bad, 0, RmaOp::Sum, 1).is_err());
}

#[cfg(feature = "ofi")]
#[test]
fn rma_on_libfabric() {
    std::env::set_var("FI_TCP_IFACE", "lo");
    std::env::set_var("FI_SOCKETS_IFACE", "lo");
    for p in ["shm", "tcp;ofi_rxm"] {
        let opts = weft_transport::ofi_provider::OfiOptions { provider: p.into(), cris: 1, ..Default::default() };
        let ranks: Vec<Transport> = weft_transport::ofi_provider::world(&opts, 2).unwrap().into_iter().map(Transport::Ofi).collect();
        check(p, ranks);
    }
}
