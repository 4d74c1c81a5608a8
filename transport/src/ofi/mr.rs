//! Memory registration (`fi_mr_reg`): local descriptors and remote keys for RMA and atomics.

use std::alloc::{self, Layout};
use std::ffi::c_void;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::error::{check, OfiError};
use super::fabric::Domain;
use super::flags::MrAccess;
use super::sys;

/// Alignment of buffers allocated by [`MemoryRegion::alloc`] (a page).
const ALLOC_ALIGN: usize = 4096;

/// What a peer needs to target a registration with RMA: base address, key and length.
///
/// Plain data: send it to peers in a message (see [`RemoteRegion::to_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// Remote address of byte 0: the virtual address under `FI_MR_VIRT_ADDR`, else 0.
    pub base: u64,
    /// Registration key.
    pub key: u64,
    /// Length in bytes.
    pub len: u64,
}

impl RemoteRegion {
    /// Encoded size of [`RemoteRegion::to_bytes`].
    pub const ENCODED_LEN: usize = 24;

    /// Little-endian `base, key, len`.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0u8; Self::ENCODED_LEN];
        out[0..8].copy_from_slice(&self.base.to_le_bytes());
        out[8..16].copy_from_slice(&self.key.to_le_bytes());
        out[16..24].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// Decodes [`RemoteRegion::to_bytes`]; `None` when `bytes` has the wrong length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != Self::ENCODED_LEN {
            return None;
        }
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i..i + 8]);
            u64::from_le_bytes(w)
        };
        Some(Self { base: word(0), key: word(8), len: word(16) })
    }

    /// Remote address of `offset` for an access of `len` bytes, checked against the length.
    pub(crate) fn addr(&self, op: &'static str, offset: u64, len: usize) -> Result<u64, OfiError> {
        let end = offset.checked_add(len as u64);
        match end {
            Some(end) if end <= self.len => Ok(self.base.wrapping_add(offset)),
            _ => {
                Err(OfiError::invalid(op, format!("remote access of {len} bytes at offset {offset} exceeds region of {} bytes", self.len)))
            }
        }
    }
}

/// A registered memory region, closed (deregistered) on drop.
///
/// The memory is either owned ([`MemoryRegion::alloc`], page-aligned, zeroed, freed after
/// deregistration) or borrowed ([`MemoryRegion::register`], whose caller keeps it alive).
/// Peers may write it at any time through RMA; its contents are meaningful to the owner once
/// it has learnt (by a message or a completion) that the remote operations are done.
pub struct MemoryRegion {
    /// The registration; closed in `Drop` before the memory is freed.
    raw: NonNull<sys::fid_mr>,
    /// Start of the registered memory.
    ptr: NonNull<u8>,
    /// Length in bytes.
    len: usize,
    /// `Some(layout)` when this region owns (allocated) its memory.
    owned: Option<Layout>,
    /// `fi_mr_key`.
    key: u64,
    /// `fi_mr_desc` (local descriptor; may be NULL for providers that do not need one).
    desc: *mut c_void,
    /// Remote address of byte 0 (see [`RemoteRegion::base`]).
    remote_base: u64,
    /// Parent; keeps the domain open.
    domain: Arc<Domain>,
}

// SAFETY: the registration belongs to a `FI_THREAD_SAFE` domain; the memory is only accessed
// through raw-pointer copies (`read_at`/`write_at`) or by libfabric, and `desc` is an opaque
// token libfabric allows using from any thread.
unsafe impl Send for MemoryRegion {}
// SAFETY: see `Send`.
unsafe impl Sync for MemoryRegion {}

impl MemoryRegion {
    /// Allocates `len` zeroed, page-aligned bytes and registers them with `access`.
    pub fn alloc(domain: &Arc<Domain>, len: usize, access: MrAccess) -> Result<Self, OfiError> {
        if len == 0 {
            return Err(OfiError::invalid("fi_mr_reg", "cannot register 0 bytes"));
        }
        let layout =
            Layout::from_size_align(len, ALLOC_ALIGN).map_err(|_| OfiError::invalid("fi_mr_reg", format!("length {len} too large")))?;
        // SAFETY: layout has non-zero size.
        let mem = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(mem) else {
            return Err(OfiError::from_code("alloc", i64::from(sys::FI_ENOMEM)));
        };
        // SAFETY: `ptr` is a live allocation of `len` bytes owned by the region we build, which
        // deregisters before freeing it.
        let result = unsafe { Self::register_inner(domain, ptr, len, access, Some(layout)) };
        if result.is_err() {
            // SAFETY: allocated above with `layout`; the registration failed, nothing refers
            // to the memory.
            unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
        }
        result
    }

    /// Registers caller-owned memory.
    ///
    /// # Safety
    ///
    /// `ptr..ptr+len` must be valid, writable memory that outlives the returned region and
    /// every RMA operation targeting it, and that Rust code does not access through
    /// references while peers may be writing it.
    pub unsafe fn register(domain: &Arc<Domain>, ptr: NonNull<u8>, len: usize, access: MrAccess) -> Result<Self, OfiError> {
        if len == 0 {
            return Err(OfiError::invalid("fi_mr_reg", "cannot register 0 bytes"));
        }
        // SAFETY: forwarded contract of this function.
        unsafe { Self::register_inner(domain, ptr, len, access, None) }
    }

    /// # Safety
    ///
    /// As [`MemoryRegion::register`]; with `owned`, the memory was allocated with that layout.
    unsafe fn register_inner(
        domain: &Arc<Domain>,
        ptr: NonNull<u8>,
        len: usize,
        access: MrAccess,
        owned: Option<Layout>,
    ) -> Result<Self, OfiError> {
        let info = domain.info();
        let requested_key = if info.mr_prov_key() { 0 } else { domain.next_mr_key() };
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain; memory valid per the caller's contract; out-pointer to a local.
        check("fi_mr_reg", unsafe {
            sys::weft_fi_mr_reg(domain.as_ptr(), ptr.as_ptr().cast(), len, access.bits(), 0, requested_key, 0, &mut raw, ptr::null_mut())
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| OfiError::invalid("fi_mr_reg", "NULL mr"))?;
        // SAFETY: valid registration.
        let (key, desc) = unsafe { (sys::weft_fi_mr_key(raw.as_ptr()), sys::weft_fi_mr_desc(raw.as_ptr())) };
        if key == sys::FI_KEY_NOTAVAIL {
            // SAFETY: valid registration, closed once.
            let _ = unsafe { sys::weft_fi_close(&mut (*raw.as_ptr()).fid) };
            return Err(OfiError::invalid("fi_mr_key", "provider needs FI_MR_RAW keys"));
        }
        let remote_base = if info.mr_virt_addr() { ptr.as_ptr() as u64 } else { 0 };
        Ok(Self { raw, ptr, len, owned, key, desc, remote_base, domain: Arc::clone(domain) })
    }

    /// The address of byte 0 in this process.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Registration key (`fi_mr_key`), what peers pass to target this region.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// Local descriptor (`fi_mr_desc`), passed by weft when posting from/into this region.
    pub fn desc(&self) -> *mut c_void {
        self.desc
    }

    /// What a peer needs to target this region.
    pub fn remote(&self) -> RemoteRegion {
        RemoteRegion { base: self.remote_base, key: self.key, len: self.len as u64 }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty registrations are refused.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Start of the registered memory.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The parent domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// The registered bytes as a shared slice.
    ///
    /// # Safety
    ///
    /// No operation that writes this memory (a receive or RMA read into it, a remote write or
    /// atomic targeting it) may be in flight while the slice is alive.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: valid for `len` bytes while self lives; no concurrent writer per contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The registered bytes as a mutable slice.
    ///
    /// # Safety
    ///
    /// As [`MemoryRegion::as_slice`], and no other slice of this region may be alive, and no
    /// operation may be reading it (a send or RMA write from it, a remote read of it).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice(&self) -> &mut [u8] {
        // SAFETY: valid for `len` bytes; exclusivity per contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn range(&self, op: &'static str, offset: usize, len: usize) -> Result<(), OfiError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(OfiError::invalid(op, format!("{len} bytes at offset {offset} exceed region of {} bytes", self.len))),
        }
    }

    /// Copies `out.len()` bytes at `offset` out of the region.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<(), OfiError> {
        self.range("MemoryRegion::read_at", offset, out.len())?;
        // SAFETY: in bounds (checked); `out` is a distinct Rust buffer; raw copy, no reference
        // into the region is created.
        unsafe { ptr::copy_nonoverlapping(self.ptr.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` into the region at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<(), OfiError> {
        self.range("MemoryRegion::write_at", offset, data.len())?;
        // SAFETY: in bounds (checked); raw copy, no reference into the region is created.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len()) };
        Ok(())
    }

    /// Reads a native-endian `u64` at `offset` (any alignment).
    pub fn load_u64(&self, offset: usize) -> Result<u64, OfiError> {
        let mut w = [0u8; 8];
        self.read_at(offset, &mut w)?;
        Ok(u64::from_ne_bytes(w))
    }

    /// Writes a native-endian `u64` at `offset` (any alignment).
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), OfiError> {
        self.write_at(offset, &value.to_ne_bytes())
    }

    /// Checks that `buf` lies inside this region (for posting with its descriptor).
    pub(crate) fn contains(&self, buf: *const u8, len: usize) -> bool {
        let start = self.ptr.as_ptr() as usize;
        let b = buf as usize;
        b >= start && b.checked_add(len).is_some_and(|end| end <= start + self.len)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: valid registration, closed exactly once, before the memory is freed.
        let _ = unsafe { sys::weft_fi_close(&mut (*self.raw.as_ptr()).fid) };
        if let Some(layout) = self.owned {
            // SAFETY: allocated in `alloc` with this layout; deregistered above.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

impl fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("key", &self.key)
            .field("owned", &self.owned.is_some())
            .finish()
    }
}
