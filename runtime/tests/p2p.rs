//! Point-to-point semantics on the embedded provider, in every progress mode (the suite is
//! shared with `p2p_ofi.rs`).

/// The builder every test of the suite starts from.
fn builder() -> weft::Builder {
    weft::Runtime::builder().env(false)
}

mod p2p_suite;
