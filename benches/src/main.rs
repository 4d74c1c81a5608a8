//! `weft-bench`: contended throughput sweeps against baselines.
fn main() {}
