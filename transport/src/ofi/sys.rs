//! Raw bindings to libfabric 1.x: bindgen output for `rdma/*.h` plus the `weft_fi_*` C shims
//! of `csrc/shim.c` (out-of-line versions of libfabric's `static inline` calls).
//!
//! Generated at build time by `build.rs`; see `docs/OFI.md` for why. Nothing outside
//! `crate::ofi` uses this module.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]

include!(concat!(env!("OUT_DIR"), "/ofi_bindings.rs"));

/// `FI_VERSION(major, minor)` from `fabric.h` (a function-like macro, so bindgen skips it).
pub(crate) const fn fi_version(major: u32, minor: u32) -> u32 {
    (major << 16) | minor
}

/// The API version weft asks for: 1.17, the oldest libfabric weft supports (Debian 12).
pub(crate) const WEFT_FI_VERSION: u32 = fi_version(1, 17);

/// `FI_ADDR_UNSPEC` (`((uint64_t) -1)`, a cast bindgen does not evaluate).
pub(crate) const FI_ADDR_UNSPEC_VALUE: fi_addr_t = u64::MAX;

/// `FI_ADDR_NOTAVAIL` (also `((uint64_t) -1)`): an address that failed to insert.
pub(crate) const FI_ADDR_NOTAVAIL_VALUE: fi_addr_t = u64::MAX;

/// `FI_KEY_NOTAVAIL` (`((uint64_t) -2)`): `fi_mr_key` under `FI_MR_RAW`.
pub(crate) const FI_KEY_NOTAVAIL: u64 = u64::MAX - 1;
