//! Providers and Communication Resource Instances (CRIs) for weft.
//!
//! A *provider* opens a fabric for one rank; a *CRI* ([Patinyasakdikul 2019, §5.3.1]) is one endpoint, one
//! inbox / completion queue and their protection: a rank opens `k` of them so that threads
//! can send and progress on different CRIs at once. The runtime (crate `weft`) holds a CRI's
//! lock while it posts or polls on it; the providers themselves keep no lock on that path.
//!
//! * [`embedded`] — the default, pure Rust provider: all ranks in one OS process, each CRI a
//!   bounded lock-free inbox, RMA by direct copy from registered memory.
//! * `ofi` (cargo feature `ofi`) — libfabric through the system library: the low-level
//!   safe layer in `ofi`, the provider the runtime uses in `ofi_provider`.
//!
//! [`Transport`] is what the runtime holds: a static-dispatch enum over the providers, and
//! [`Provider`] names one (`WEFT_PROVIDER=embedded|shm|tcp`). [`bootstrap`] tells a process
//! its rank and size and exchanges fabric addresses (`weftrun`, a PMIx launcher with feature
//! `pmix`, Slurm).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bootstrap;
mod doorbell;
pub mod embedded;
mod frame;
pub(crate) mod loom;
pub mod membarrier;
#[cfg(feature = "ofi")]
pub mod ofi;
#[cfg(feature = "ofi")]
pub mod ofi_provider;
#[cfg(feature = "pmix")]
mod pmix;
mod provider;
mod ring;
#[cfg_attr(not(any(loom, feature = "ofi")), allow(dead_code))]
mod waiter_role;

pub use doorbell::Doorbell;
pub use frame::{Frame, FrameKind, Header, Payload, INLINE};
pub use provider::{Provider, RankWaiter, ReadStart, RemoteWindow, RmaOp, Transport};
pub use weft_sync::Error;

/// Why a send was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The destination's inbox is full (flow control), or the provider cannot take the
    /// frame yet: progress, then retry. Nothing was sent and nothing is lost. The sending
    /// rank's [`Doorbell`] rings room ([`Doorbell::ring_room`]) once a retry may succeed
    /// (the embedded provider: when the destination drains that inbox; libfabric: from the
    /// watcher, while refusals last), so a sender may sleep on the doorbell instead of
    /// polling — after one more try, since that ring may come between its last try and its
    /// sleep.
    WouldBlock,
    /// The destination rank is gone.
    PeerLost,
    /// The frame can never be sent (larger than the provider's eager capacity, or naming
    /// an unregistered rendezvous buffer): a bug in the caller, reported, never retried.
    Invalid(&'static str),
}
