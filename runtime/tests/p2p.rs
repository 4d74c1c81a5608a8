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
