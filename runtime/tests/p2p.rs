//! Point-to-point semantics on the embedded provider, in every progress mode (the suite is
//! shared with `p2p_ofi.rs`).

/// The builder every test of the suite starts from.
fn builder() -> weft::Builder {
    weft::Runtime::builder().env(false)
}

mod p2p_suite;

/// Without the `ofi` feature, asking for a libfabric provider is a clear error, by builder
/// or by environment variable, never a panic.
#[cfg(not(feature = "ofi"))]
#[test]
fn libfabric_providers_need_the_ofi_feature() {
    for p in [weft::Provider::Shm, weft::Provider::Tcp] {
        let err = weft::Runtime::builder().env(false).provider(p).build_local(2).unwrap_err();
        assert!(matches!(err, weft::Error::InvalidArgument(m) if m.contains("`ofi`")), "{err}");
    }
    assert!("carrier-pigeon".parse::<weft::Provider>().is_err());
    assert_eq!("tcp;ofi_rxm".parse::<weft::Provider>().unwrap(), weft::Provider::Tcp);
}

/// A wait longer than the park limit (50 ms) wakes by the safety net, which is counted; the
/// message still arrives.
#[test]
fn long_waits_count_park_timeouts() {
    let rts = builder().progress(weft::ProgressMode::Owner).cris(2).eager_threshold(4096).build_local(2).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(150));
            rts[0].world().send(vec![5u8], 1, 0).unwrap();
        });
        let (b, _) = rts[1].world().recv(Vec::<u8>::with_capacity(1), 0u32, 0).unwrap();
        assert_eq!(b, vec![5]);
    });
    let c = rts[1].counters();
    assert!(c.park_timeouts >= 1 && c.parks >= 1, "{c:?}");
}
