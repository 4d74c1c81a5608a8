//! Provider discovery: `fi_getinfo` for one provider, `FI_EP_RDM`, with capability fallback.

use std::ffi::{CStr, CString};
use std::fmt;
use std::ptr::{self, NonNull};

use super::error::OfiError;
use super::flags::Caps;
use super::sys;

/// Memory-registration modes weft can handle (`fi_domain_attr::mr_mode` hints): the remote
/// address may be a virtual address, registered memory must be backed by allocated pages, and
/// the provider may choose keys. Not offered: `FI_MR_LOCAL` (weft posts plain buffers with no
/// descriptor), `FI_MR_ENDPOINT`, `FI_MR_RAW`.
const MR_MODE_HINTS: u64 = sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY;

/// One provider configuration (an owned, single `fi_info` entry) for an `FI_EP_RDM` endpoint.
///
/// Obtained by [`Info::query`]; it says which capabilities the provider granted and which of
/// the requested ones it lacks.
pub struct Info {
    /// Owned copy of one `fi_info` (from `fi_dupinfo`), freed with `fi_freeinfo` on drop.
    raw: NonNull<sys::fi_info>,
    /// The capabilities that were asked for; `caps()` may be a subset after fallback.
    requested: Caps,
}

// SAFETY: `Info` owns its `fi_info` allocation exclusively and never mutates it after
// construction; libfabric reads it (fi_fabric/fi_domain/fi_endpoint) without keeping a
// reference, so it can move between and be shared by threads.
unsafe impl Send for Info {}
// SAFETY: see `Send`: all access after construction is read-only.
unsafe impl Sync for Info {}

impl Info {
    /// Queries `provider` (`"shm"`, `"tcp;ofi_rxm"`, `"sockets"`, ...) for an RDM endpoint
    /// with [`Caps::ALL`], falling back to fewer capabilities; see [`Info::query_caps`].
    pub fn query(provider: &str) -> Result<Self, OfiError> {
        Self::query_caps(provider, Caps::ALL)
    }

    /// Queries `provider` for an RDM endpoint with `wanted` capabilities, thread-safe
    /// domain (`FI_THREAD_SAFE`) and no mode bits (weft's contexts are plain `u64`s).
    ///
    /// If no configuration grants all of `wanted`, it retries without `ATOMIC`, then without
    /// `RMA` too, then with `MSG | TAGGED` only; [`Info::missing_caps`] reports what was
    /// dropped. The first configuration returned by libfabric is kept (with
    /// `FI_TCP_IFACE=lo`, the tcp provider lists 127.0.0.1 before ::1).
    ///
    /// Returns the error of the full query when nothing matches; [`OfiError::is_unavailable`]
    /// is then true if the provider is simply not there.
    pub fn query_caps(provider: &str, wanted: Caps) -> Result<Self, OfiError> {
        let candidates = [
            wanted,
            wanted.difference(Caps::ATOMIC),
            wanted.difference(Caps::ATOMIC | Caps::RMA),
            wanted.intersection(Caps::MSG | Caps::TAGGED),
        ];
        let mut first_err = None;
        let mut tried: Vec<Caps> = Vec::new();
        for caps in candidates {
            if caps.is_empty() || tried.contains(&caps) {
                continue;
            }
            tried.push(caps);
            match getinfo(provider, caps) {
                Ok(raw) => return Ok(Self { raw, requested: wanted }),
                Err(e) if e.is_unavailable() => {
                    first_err.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(first_err.unwrap_or_else(|| OfiError::invalid("fi_getinfo", "no capabilities requested")))
    }

    /// Raw pointer for `fi_fabric`/`fi_domain`/`fi_endpoint` (which only read it).
    pub(crate) fn as_ptr(&self) -> *mut sys::fi_info {
        self.raw.as_ptr()
    }

    fn raw(&self) -> &sys::fi_info {
        // SAFETY: `raw` is a valid fi_info owned by self, alive for the borrow.
        unsafe { self.raw.as_ref() }
    }

    fn fabric_attr(&self) -> Option<&sys::fi_fabric_attr> {
        // SAFETY: attribute pointers of a fi_info from fi_getinfo/fi_dupinfo are NULL or point
        // to attributes owned by it, alive (and unmodified) as long as `self`.
        unsafe { self.raw().fabric_attr.as_ref() }
    }

    fn domain_attr(&self) -> Option<&sys::fi_domain_attr> {
        // SAFETY: as in `fabric_attr`.
        unsafe { self.raw().domain_attr.as_ref() }
    }

    fn tx_attr(&self) -> Option<&sys::fi_tx_attr> {
        // SAFETY: as in `fabric_attr`.
        unsafe { self.raw().tx_attr.as_ref() }
    }

    fn ep_attr(&self) -> Option<&sys::fi_ep_attr> {
        // SAFETY: as in `fabric_attr`.
        unsafe { self.raw().ep_attr.as_ref() }
    }

    /// Provider name as libfabric reports it (e.g. `"tcp;ofi_rxm"`).
    pub fn provider(&self) -> String {
        cstr_lossy(self.fabric_attr().map_or(ptr::null(), |a| a.prov_name))
    }

    /// Fabric name (e.g. `"127.0.0.1/32"`, `"shm"`).
    pub fn fabric_name(&self) -> String {
        cstr_lossy(self.fabric_attr().map_or(ptr::null(), |a| a.name))
    }

    /// Domain name (e.g. `"lo"`, `"shm"`).
    pub fn domain_name(&self) -> String {
        cstr_lossy(self.domain_attr().map_or(ptr::null(), |a| a.name))
    }

    /// The capabilities of [`Caps::ALL`] that the chosen configuration grants.
    pub fn caps(&self) -> Caps {
        Caps::from_bits(self.raw().caps).intersection(Caps::ALL)
    }

    /// The capabilities that were asked for.
    pub fn requested_caps(&self) -> Caps {
        self.requested
    }

    /// Requested capabilities the provider lacks (empty when everything was granted).
    pub fn missing_caps(&self) -> Caps {
        self.requested.difference(self.caps())
    }

    /// Largest message `inject` accepts (`tx_attr->inject_size`).
    pub fn inject_size(&self) -> usize {
        self.tx_attr().map_or(0, |a| a.inject_size)
    }

    /// Largest message size (`ep_attr->max_msg_size`).
    pub fn max_msg_size(&self) -> usize {
        self.ep_attr().map_or(0, |a| a.max_msg_size)
    }

    /// `domain_attr->mr_mode` bits.
    pub(crate) fn mr_mode(&self) -> u64 {
        self.domain_attr().map_or(0, |a| u64::try_from(a.mr_mode).unwrap_or(0))
    }

    /// True when RMA targets are addressed by virtual address (`FI_MR_VIRT_ADDR`), false when
    /// by offset from the start of the registration.
    pub fn mr_virt_addr(&self) -> bool {
        self.mr_mode() & sys::FI_MR_VIRT_ADDR != 0
    }

    /// True when the provider picks registration keys (`FI_MR_PROV_KEY`).
    pub fn mr_prov_key(&self) -> bool {
        self.mr_mode() & sys::FI_MR_PROV_KEY != 0
    }
}

impl Clone for Info {
    fn clone(&self) -> Self {
        // SAFETY: `raw` is a valid fi_info; fi_dupinfo deep-copies one entry.
        let dup = unsafe { sys::fi_dupinfo(self.raw.as_ptr()) };
        match NonNull::new(dup) {
            Some(raw) => Self { raw, requested: self.requested },
            None => std::alloc::handle_alloc_error(std::alloc::Layout::new::<sys::fi_info>()),
        }
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        // SAFETY: `raw` came from fi_dupinfo, is owned by self and freed once here.
        unsafe { sys::fi_freeinfo(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Info {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Info")
            .field("provider", &self.provider())
            .field("fabric", &self.fabric_name())
            .field("domain", &self.domain_name())
            .field("caps", &self.caps())
            .field("missing_caps", &self.missing_caps())
            .field("inject_size", &self.inject_size())
            .field("max_msg_size", &self.max_msg_size())
            .field("mr_mode", &format_args!("{:#x}", self.mr_mode()))
            .finish()
    }
}

fn cstr_lossy(ptr: *const std::os::raw::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: non-null strings inside fi_info are NUL-terminated C strings owned by it.
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

/// Hints owned by weft for one `fi_getinfo` call, freed (with their strings) on drop.
struct Hints(NonNull<sys::fi_info>);

impl Drop for Hints {
    fn drop(&mut self) {
        // SAFETY: allocated by fi_dupinfo(NULL); every string in it is malloc'ed (strdup),
        // so fi_freeinfo may free them.
        unsafe { sys::fi_freeinfo(self.0.as_ptr()) }
    }
}

/// One `fi_getinfo` for `provider` with `caps`; returns an owned copy of the first entry.
fn getinfo(provider: &str, caps: Caps) -> Result<NonNull<sys::fi_info>, OfiError> {
    let prov = CString::new(provider).map_err(|_| OfiError::invalid("fi_getinfo", "provider name contains a NUL byte"))?;
    // SAFETY: fi_dupinfo(NULL) is fi_allocinfo: a zeroed fi_info with zeroed attribute structs.
    let raw = NonNull::new(unsafe { sys::fi_dupinfo(ptr::null()) })
        .ok_or_else(|| OfiError::from_code("fi_allocinfo", i64::from(sys::FI_ENOMEM)))?;
    let hints = Hints(raw);
    // SAFETY: `hints` is a fresh, exclusively owned fi_info; its attribute pointers are
    // checked for NULL before use. `prov_name` is malloc'ed by strdup because fi_freeinfo
    // frees it.
    unsafe {
        let h = hints.0.as_ptr();
        let (ep, dom, fab) = ((*h).ep_attr, (*h).domain_attr, (*h).fabric_attr);
        if ep.is_null() || dom.is_null() || fab.is_null() {
            return Err(OfiError::from_code("fi_allocinfo", i64::from(sys::FI_ENOMEM)));
        }
        (*h).caps = caps.bits();
        (*h).mode = 0;
        (*ep).type_ = sys::FI_EP_RDM;
        (*dom).threading = sys::FI_THREAD_SAFE;
        (*dom).mr_mode = MR_MODE_HINTS as i32;
        let name = libc::strdup(prov.as_ptr());
        if name.is_null() {
            return Err(OfiError::from_code("strdup", i64::from(sys::FI_ENOMEM)));
        }
        (*fab).prov_name = name;
    }
    let mut list: *mut sys::fi_info = ptr::null_mut();
    // SAFETY: valid hints, NULL node/service, out-pointer to a local.
    let ret = unsafe { sys::fi_getinfo(sys::WEFT_FI_VERSION, ptr::null(), ptr::null(), 0, hints.0.as_ptr(), &mut list) };
    if ret != 0 {
        return Err(OfiError::from_code("fi_getinfo", i64::from(ret)));
    }
    let Some(list) = NonNull::new(list) else {
        return Err(OfiError::from_code("fi_getinfo", i64::from(sys::FI_ENODATA)));
    };
    // SAFETY: `list` is the head of the list fi_getinfo returned; fi_dupinfo copies the first
    // entry only, then the whole list is freed once.
    let first = unsafe {
        let dup = sys::fi_dupinfo(list.as_ptr());
        sys::fi_freeinfo(list.as_ptr());
        dup
    };
    let first = NonNull::new(first).ok_or_else(|| OfiError::from_code("fi_dupinfo", i64::from(sys::FI_ENOMEM)))?;
    // SAFETY: `first` is a valid, owned fi_info.
    let mode = unsafe { first.as_ref().mode };
    if mode != 0 {
        // SAFETY: owned by us and not shared; freed once.
        unsafe { sys::fi_freeinfo(first.as_ptr()) };
        return Err(OfiError::invalid(
            "fi_getinfo",
            format!("provider {provider} requires mode bits {mode:#x} that weft does not support"),
        ));
    }
    Ok(first)
}
