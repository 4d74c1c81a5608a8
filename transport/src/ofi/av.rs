//! Address vector (`FI_AV_TABLE`): maps peers' endpoint names to `FiAddr` handles.

use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::error::OfiError;
use super::fabric::Domain;
use super::sys;

/// Largest endpoint name weft accepts (libfabric's `FI_NAME_MAX` is 64; shm names are
/// strings up to ~`FI_NAME_MAX`). Names are copied into a zero-padded buffer of this size so
/// the provider never reads past a short caller slice.
pub const MAX_ADDR_LEN: usize = 256;

/// A peer address in an address vector (`fi_addr_t`; an index for `FI_AV_TABLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FiAddr(u64);

impl FiAddr {
    /// `FI_ADDR_UNSPEC`: "any source" for receives.
    pub const UNSPEC: Self = Self(sys::FI_ADDR_UNSPEC_VALUE);

    /// The raw `fi_addr_t`.
    pub const fn raw(self) -> u64 {
        self.0
    }
}

/// An address vector of type `FI_AV_TABLE`, shared by the endpoints of one domain.
pub struct AddressVector {
    /// The AV object; closed in `Drop`, before `domain` is released.
    raw: NonNull<sys::fid_av>,
    /// Parent; keeps the domain open.
    domain: Arc<Domain>,
}

// SAFETY: the domain is `FI_THREAD_SAFE`, so AV calls may come from any thread concurrently.
unsafe impl Send for AddressVector {}
// SAFETY: see `Send`.
unsafe impl Sync for AddressVector {}

impl AddressVector {
    /// Opens an `FI_AV_TABLE` address vector sized for `count` peers (a hint).
    pub fn open(domain: &Arc<Domain>, count: usize) -> Result<Arc<Self>, OfiError> {
        let mut attr = sys::fi_av_attr { type_: sys::FI_AV_TABLE, count, ..Default::default() };
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain and attr; out-pointer to a local; no context.
        let ret = unsafe { sys::weft_fi_av_open(domain.as_ptr(), &mut attr, &mut raw, ptr::null_mut()) };
        super::error::check("fi_av_open", ret)?;
        let raw = NonNull::new(raw).ok_or_else(|| OfiError::invalid("fi_av_open", "NULL av"))?;
        Ok(Arc::new(Self { raw, domain: Arc::clone(domain) }))
    }

    /// Inserts one peer name (the bytes of its `Endpoint::name`) and returns its handle.
    pub fn insert(&self, name: &[u8]) -> Result<FiAddr, OfiError> {
        if name.is_empty() || name.len() > MAX_ADDR_LEN {
            return Err(OfiError::invalid("fi_av_insert", format!("address of {} bytes (expected 1..={MAX_ADDR_LEN})", name.len())));
        }
        let mut padded = [0u8; MAX_ADDR_LEN];
        padded[..name.len()].copy_from_slice(name);
        let mut addr: sys::fi_addr_t = sys::FI_ADDR_UNSPEC_VALUE;
        // SAFETY: valid AV; `padded` holds one address (the provider reads at most its
        // address length, which is below MAX_ADDR_LEN); one output slot; no context.
        let ret = unsafe { sys::weft_fi_av_insert(self.raw.as_ptr(), padded.as_ptr().cast(), 1, &mut addr, 0, ptr::null_mut()) };
        match ret {
            1 if addr != sys::FI_ADDR_NOTAVAIL_VALUE => Ok(FiAddr(addr)),
            r if r < 0 => Err(OfiError::from_code("fi_av_insert", i64::from(r))),
            _ => Err(OfiError::invalid("fi_av_insert", "address was not accepted")),
        }
    }

    /// The parent domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    pub(crate) fn fid(&self) -> *mut sys::fid {
        // SAFETY: valid AV; taking the address of its embedded fid.
        unsafe { &mut (*self.raw.as_ptr()).fid }
    }
}

impl Drop for AddressVector {
    fn drop(&mut self) {
        // SAFETY: endpoints bound to this AV hold an `Arc` of it, so they are closed; the
        // fid is valid and closed once.
        let _ = unsafe { sys::weft_fi_close(self.fid()) };
    }
}

impl fmt::Debug for AddressVector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressVector").finish_non_exhaustive()
    }
}
