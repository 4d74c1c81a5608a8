//! `Fabric` (`fi_fabric`) and `Domain` (`fi_domain`): the parents of every other object.
//!
//! Children hold an `Arc` of their parent, so a fabric is closed only after its domains, and
//! a domain only after its endpoints, completion queues, address vectors and registrations.

use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::error::{check, OfiError};
use super::info::Info;
use super::sys;

/// An open fabric (`fid_fabric`), closed on drop.
pub struct Fabric {
    /// The fabric object; closed in `Drop`.
    raw: NonNull<sys::fid_fabric>,
    /// Provider name, kept for `Debug`.
    provider: String,
}

// SAFETY: the fabric was opened from a `FI_THREAD_SAFE` configuration (see `Info::query`),
// so libfabric allows calls on it from any thread, concurrently.
unsafe impl Send for Fabric {}
// SAFETY: see `Send`.
unsafe impl Sync for Fabric {}

impl Fabric {
    /// Opens the fabric described by `info`.
    pub fn open(info: &Info) -> Result<Arc<Self>, OfiError> {
        // SAFETY: `info` is a valid fi_info; fabric_attr is checked for NULL.
        let attr = unsafe { (*info.as_ptr()).fabric_attr };
        if attr.is_null() {
            return Err(OfiError::invalid("fi_fabric", "fi_info has no fabric_attr"));
        }
        let mut raw = ptr::null_mut();
        // SAFETY: valid attr from fi_getinfo, out-pointer to a local, no context.
        check("fi_fabric", unsafe { sys::fi_fabric(attr, &mut raw, ptr::null_mut()) })?;
        let raw = NonNull::new(raw).ok_or_else(|| OfiError::invalid("fi_fabric", "NULL fabric"))?;
        Ok(Arc::new(Self { raw, provider: info.provider() }))
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::fid_fabric {
        self.raw.as_ptr()
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // SAFETY: every child holds an `Arc<Fabric>` (through its domain), so none is left;
        // the fid is valid and closed exactly once. A close error cannot be reported from drop.
        let _ = unsafe { sys::weft_fi_close(&mut (*self.raw.as_ptr()).fid) };
    }
}

impl fmt::Debug for Fabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fabric").field("provider", &self.provider).finish()
    }
}

/// An open domain (`fid_domain`): the scope of memory registrations and address vectors.
pub struct Domain {
    /// The domain object; closed in `Drop`, before `fabric` is released.
    raw: NonNull<sys::fid_domain>,
    /// The configuration endpoints of this domain are opened with.
    info: Info,
    /// Next key to request for a registration when the provider does not pick keys.
    next_key: AtomicU64,
    /// Parent; keeps the fabric open while this domain exists.
    fabric: Arc<Fabric>,
}

// SAFETY: opened with `FI_THREAD_SAFE` threading (see `Info::query`); all other fields are
// `Send + Sync`.
unsafe impl Send for Domain {}
// SAFETY: see `Send`.
unsafe impl Sync for Domain {}

impl Domain {
    /// Opens a domain of `fabric` for the configuration `info`.
    pub fn open(fabric: &Arc<Fabric>, info: &Info) -> Result<Arc<Self>, OfiError> {
        let info = info.clone();
        let mut raw = ptr::null_mut();
        // SAFETY: valid fabric and info; out-pointer to a local; no context.
        check("fi_domain", unsafe { sys::weft_fi_domain(fabric.as_ptr(), info.as_ptr(), &mut raw, ptr::null_mut()) })?;
        let raw = NonNull::new(raw).ok_or_else(|| OfiError::invalid("fi_domain", "NULL domain"))?;
        Ok(Arc::new(Self { raw, info, next_key: AtomicU64::new(1), fabric: Arc::clone(fabric) }))
    }

    /// Opens fabric and domain for `info` in one go.
    pub fn open_with_fabric(info: &Info) -> Result<Arc<Self>, OfiError> {
        let fabric = Fabric::open(info)?;
        Self::open(&fabric, info)
    }

    /// The configuration of this domain.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// The parent fabric.
    pub fn fabric(&self) -> &Arc<Fabric> {
        &self.fabric
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::fid_domain {
        self.raw.as_ptr()
    }

    /// A registration key unique within this domain (used when the provider does not pick
    /// keys). `Relaxed`: only uniqueness matters, no other memory is published through it.
    pub(crate) fn next_mr_key(&self) -> u64 {
        self.next_key.fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for Domain {
    fn drop(&mut self) {
        // SAFETY: every child (endpoint, CQ, AV, MR, counter) holds an `Arc<Domain>`, so all
        // are closed; the fid is valid and closed exactly once.
        let _ = unsafe { sys::weft_fi_close(&mut (*self.raw.as_ptr()).fid) };
    }
}

impl fmt::Debug for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Domain").field("info", &self.info).finish()
    }
}
