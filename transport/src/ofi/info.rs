//! Provider discovery: `fi_getinfo` for one provider, `FI_EP_RDM`, with capability fallback;
//! the settings libfabric reads when the process's first `fi_getinfo` initializes it.

use std::ffi::{CStr, CString};
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Once;

use super::error::OfiError;
use super::flags::Caps;
use super::sys;

/// Memory-registration modes weft can handle (`fi_domain_attr::mr_mode` hints): the remote
/// address may be a virtual address, registered memory must be backed by allocated pages, and
/// the provider may choose keys. Not offered: `FI_MR_LOCAL` (weft posts plain buffers with no
/// descriptor), `FI_MR_ENDPOINT`, `FI_MR_RAW`.
const MR_MODE_HINTS: u64 = sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY;

/// libfabric settings weft gives a process whose environment leaves them unset, with why.
/// libfabric reads its `FI_*` variables once, as its first `fi_getinfo` initializes every
/// provider, so they are in the environment for that call only ([`with_start_settings`]);
/// a value the user set wins.
///
/// * `FI_OFI_RXM_MSG_RX_SIZE=1024`: the receive buffers `ofi_rxm` posts to the shared receive
///   context of each of its endpoints over `tcp`. Its default, 4,096 buffers of 16 KiB, takes
///   four chunks of its buffer pool (1,024 buffers each), and libfabric zeroes every chunk
///   as it allocates it: 67 MB written and some 20 ms of CPU per endpoint as a rank starts,
///   where one chunk is 17 MB. 1,024 is that one chunk, which rxm allocates whatever the
///   size: fewer buffers would not start faster. rxm still buffers 16 MiB of unexpected
///   messages per endpoint; past that, tcp leaves them in the socket until a buffer is free.
const START_SETTINGS: &[(&str, &str)] = &[("FI_OFI_RXM_MSG_RX_SIZE", "1024")];

/// Runs `first`, the process's first `fi_getinfo`, with the [`START_SETTINGS`] the
/// environment lacks set, then removes those again: the process's environment (and what
/// processes it starts inherit) is left as it was. Later calls run `first` alone.
///
/// Process-wide, as libfabric's own initialization is. The environment changes once per
/// process, around its first `fi_getinfo`; a thread that reads the environment through C's
/// `getenv` at that very moment races with it, as it would with any `setenv`.
fn with_start_settings<R>(first: impl FnOnce() -> R) -> R {
    static STARTED: Once = Once::new();
    let mut set = Vec::new();
    STARTED.call_once(|| {
        for &(name, value) in START_SETTINGS {
            if std::env::var_os(name).is_none() {
                std::env::set_var(name, value);
                set.push(name);
            }
        }
    });
    // A `fi_getinfo` of another thread may initialize libfabric meanwhile: the settings are
    // in place from here, and once `first` returns libfabric has read them, whoever
    // initialized it (it does so once, under its own lock).
    let out = first();
    for name in set {
        std::env::remove_var(name);
    }
    out
}

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
    let ret =
        with_start_settings(|| unsafe { sys::fi_getinfo(sys::WEFT_FI_VERSION, ptr::null(), ptr::null(), 0, hints.0.as_ptr(), &mut list) });
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

#[cfg(test)]
mod tests {
    use std::process::Command;
    use std::sync::Arc;

    use super::*;
    use crate::ofi::{AddressVector, Domain, Endpoint, EndpointConfig};

    /// What the child test prints before its result.
    const CHILD_MARK: &str = "TCP_ENDPOINT_CHILD";

    /// A field of `/proc/self/status` in KiB (`VmHWM`, `VmRSS`).
    fn status_kib(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
        let line = status.lines().find(|l| l.starts_with(field)).expect("field of /proc/self/status");
        line[field.len()..].trim().trim_end_matches("kB").trim().parse().expect("KiB value")
    }

    /// Run by [`a_tcp_endpoint_starts_with_one_chunk_of_rxm_buffers`] in a process of its
    /// own (libfabric reads its settings once per process): opens one `tcp;ofi_rxm` endpoint
    /// and prints how much memory that touched, and whether the environment still names the
    /// setting afterwards.
    #[test]
    #[ignore = "run as a child process by a_tcp_endpoint_starts_with_one_chunk_of_rxm_buffers"]
    fn tcp_endpoint_child() {
        let before = status_kib("VmRSS:");
        let info = match Info::query("tcp;ofi_rxm") {
            Ok(info) => info,
            Err(e) if e.is_unavailable() => {
                println!("{CHILD_MARK} unavailable");
                return;
            }
            Err(e) => panic!("fi_getinfo for tcp;ofi_rxm failed: {e}"),
        };
        let domain: Arc<Domain> = Domain::open_with_fabric(&info).expect("open fabric + domain");
        let av = AddressVector::open(&domain, 4).expect("open av");
        let ep = Endpoint::open(&domain, &av, &EndpointConfig::default()).expect("open endpoint");
        let grown = status_kib("VmHWM:").saturating_sub(before);
        let env = std::env::var("FI_OFI_RXM_MSG_RX_SIZE").unwrap_or_else(|_| "unset".into());
        println!("{CHILD_MARK} {grown} {env}");
        drop(ep);
    }

    /// Runs the child; `(KiB the endpoint touched, FI_OFI_RXM_MSG_RX_SIZE after)`, or
    /// `None` when tcp is not available.
    fn child(msg_rx_size: Option<&str>) -> Option<(u64, String)> {
        let mut cmd = Command::new(std::env::current_exe().expect("test binary path"));
        cmd.args(["ofi::info::tests::tcp_endpoint_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("FI_TCP_IFACE", "lo")
            .env_remove("FI_OFI_RXM_MSG_RX_SIZE");
        if let Some(v) = msg_rx_size {
            cmd.env("FI_OFI_RXM_MSG_RX_SIZE", v);
        }
        let out = cmd.output().expect("run the child test");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let line = stdout.lines().find_map(|l| l.split_once(CHILD_MARK).map(|(_, r)| r.trim())).expect("child's result");
        if line == "unavailable" {
            println!("SKIP: provider tcp;ofi_rxm not available");
            return None;
        }
        let (kib, env) = line.split_once(' ').expect("child's result: KiB and the setting");
        Some((kib.parse().expect("KiB"), env.to_string()))
    }

    /// rxm's default of 4,096 receive buffers per endpoint costs four zeroed chunks of 17 MB
    /// (67 MB) at the start; weft's 1,024 costs one. A user's own setting wins, and the
    /// environment is left as it was.
    #[test]
    fn a_tcp_endpoint_starts_with_one_chunk_of_rxm_buffers() {
        let Some((ours, env)) = child(None) else { return };
        assert_eq!(env, "unset", "the setting stays in the environment after libfabric read it");
        assert!(ours < 40 * 1024, "one tcp endpoint touched {ours} KiB at the start: more than one chunk of rxm buffers");
        let Some((users, env)) = child(Some("4096")) else { return };
        assert_eq!(env, "4096", "the user's setting was changed");
        assert!(
            users > 60 * 1024,
            "with FI_OFI_RXM_MSG_RX_SIZE=4096 one tcp endpoint touched only {users} KiB: the user's setting was not used"
        );
    }
}
