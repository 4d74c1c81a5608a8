//! The collectives suite (`coll_suite/`) on the embedded provider.

/// The builder every test of the suite starts from.
fn builder() -> weft::Builder {
    weft::Runtime::builder().env(false)
}

mod coll_suite;
mod common;
