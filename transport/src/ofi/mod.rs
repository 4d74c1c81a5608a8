//! libfabric provider, low level: a small `-sys` binding ([`sys`](self) is private) and a
//! safe layer, one file per mechanism.
//!
//! | file          | mechanism                                                        |
//! |---------------|------------------------------------------------------------------|
//! | `info.rs`     | `fi_getinfo` for one provider, `FI_EP_RDM`, capability fallback  |
//! | `fabric.rs`   | `Fabric`, `Domain` (parents; children hold `Arc`s of them)       |
//! | `av.rs`       | `AddressVector` (`FI_AV_TABLE`), `FiAddr`                        |
//! | `cq.rs`       | `CompletionQueue` (tagged format, errors, wait fd), `Counter`    |
//! | `mr.rs`       | `MemoryRegion`, `RemoteRegion`                                   |
//! | `endpoint.rs` | `Endpoint`: post sends/receives/RMA/atomics                      |
//! | `error.rs`    | `OfiError`, `Post` (`Posted` / `WouldBlock`)                     |
//! | `shm_lock.rs` | `ShmRegionLock`: an `shm` region's lock, left held by the dead   |
//!
//! All FFI `unsafe` of weft lives in this module. See `docs/OFI.md` for the providers that
//! work and how to test.
//!
//! ```no_run
//! use weft_transport::ofi::{AddressVector, Domain, Endpoint, EndpointConfig, Info};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let info = Info::query("tcp;ofi_rxm")?;
//! println!("missing caps: {:?}", info.missing_caps());
//! let domain = Domain::open_with_fabric(&info)?;
//! let av = AddressVector::open(&domain, 16)?;
//! let a = Endpoint::open(&domain, &av, &EndpointConfig::default())?;
//! let b = Endpoint::open(&domain, &av, &EndpointConfig::default())?;
//! let b_addr = av.insert(b.name())?;
//! a.tinject(b"hi", b_addr, 7)?;
//! # Ok(()) }
//! ```

mod av;
mod cq;
mod endpoint;
mod error;
mod fabric;
mod flags;
mod info;
mod mr;
mod shm_lock;
mod sys;

pub use av::{AddressVector, FiAddr, MAX_ADDR_LEN};
pub use cq::{CompletionError, CompletionQueue, Counter, CqEntry, CqError, TryWait, WaitOutcome};
pub use endpoint::{Endpoint, EndpointConfig, FetchOp};
pub use error::{OfiError, Post};
pub use fabric::{Domain, Fabric};
pub use flags::{Caps, CompletionFlags, MrAccess};
pub use info::Info;
pub use mr::{MemoryRegion, RemoteRegion};
pub use shm_lock::{ShmRegionLock, REGION_VERSION};

/// libfabric error numbers callers may want to match in [`OfiError::code`].
pub mod errno {
    /// Truncated receive (message larger than the posted buffer).
    pub const FI_ETRUNC: i32 = super::sys::FI_ETRUNC as i32;
    /// Operation canceled.
    pub const FI_ECANCELED: i32 = super::sys::FI_ECANCELED;
    /// No data / no matching provider.
    pub const FI_ENODATA: i32 = super::sys::FI_ENODATA;
    /// Try again.
    pub const FI_EAGAIN: i32 = super::sys::FI_EAGAIN;
    /// Invalid argument (also weft's own argument checks).
    pub const FI_EINVAL: i32 = super::sys::FI_EINVAL;
    /// Operation not supported.
    pub const FI_EOPNOTSUPP: i32 = super::sys::FI_EOPNOTSUPP;
    /// Function not implemented.
    pub const FI_ENOSYS: i32 = super::sys::FI_ENOSYS;
}
