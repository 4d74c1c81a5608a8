//! Criterion benchmarks of the sync object.
fn main() {}
