//! `Endpoint`: one `FI_EP_RDM` endpoint bundled with its completion queue, a shared address
//! vector, and optional RMA completion counters.
//!
//! # Buffer lifetimes
//!
//! libfabric reads and writes the buffers of a posted operation asynchronously, until the
//! operation's completion is read from the CQ. The borrow checker cannot see that, so every
//! post that keeps a buffer (`send`, `recv`, `tsend`, `trecv`, `write`, `read`, atomics) is an
//! `unsafe fn` whose contract is: the buffer stays valid, and is not accessed by Rust code
//! (not read, for receive-like operations; not written, for send-like operations), until the
//! operation's completion (or completion error) has been read, or the endpoint is dropped.
//! The runtime layer above owns buffer pools and upholds this; the `inject` calls copy the
//! data before returning and are safe.

use std::ffi::c_void;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use super::av::{AddressVector, FiAddr, MAX_ADDR_LEN};
use super::cq::{CompletionQueue, Counter};
use super::error::{check, OfiError, Post};
use super::fabric::Domain;
use super::mr::{MemoryRegion, RemoteRegion};
use super::sys;

/// Options of [`Endpoint::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Completion queue size (entries).
    pub cq_size: usize,
    /// Ask for an `FI_WAIT_FD` wait object on the CQ (ignored when the provider has none).
    pub wait_fd: bool,
    /// Bind a completion counter for the endpoint's RMA and atomic operations.
    pub rma_counter: bool,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self { cq_size: 1024, wait_fd: true, rma_counter: true }
    }
}

/// Operation of [`Endpoint::fetch_atomic_u64`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchOp {
    /// `FI_SUM`: add the operand; fetch the old value.
    Sum,
    /// `FI_ATOMIC_READ`: fetch the value (operand ignored).
    Read,
    /// `FI_ATOMIC_WRITE`: store the operand; fetch the old value (swap).
    Swap,
    /// `FI_BOR`: bitwise or.
    BitOr,
    /// `FI_BAND`: bitwise and.
    BitAnd,
    /// `FI_MIN`.
    Min,
    /// `FI_MAX`.
    Max,
}

impl FetchOp {
    fn raw(self) -> sys::fi_op {
        match self {
            FetchOp::Sum => sys::FI_SUM,
            FetchOp::Read => sys::FI_ATOMIC_READ,
            FetchOp::Swap => sys::FI_ATOMIC_WRITE,
            FetchOp::BitOr => sys::FI_BOR,
            FetchOp::BitAnd => sys::FI_BAND,
            FetchOp::Min => sys::FI_MIN,
            FetchOp::Max => sys::FI_MAX,
        }
    }
}

/// An enabled RDM endpoint with its CQ (tagged format), shared AV and optional RMA counter.
///
/// Drop order: the endpoint is closed first (in `Drop`), then the counter and CQ, then the
/// references to the AV and domain are released.
pub struct Endpoint {
    /// The endpoint object; closed first in `Drop`.
    raw: NonNull<sys::fid_ep>,
    /// Own address (`fi_getname`), what peers insert into their AV.
    name: Vec<u8>,
    /// Largest `inject` size.
    inject_size: usize,
    /// Largest message size.
    max_msg_size: usize,
    /// Completion queue bound for transmit and receive.
    cq: CompletionQueue,
    /// Counter bound for `FI_READ | FI_WRITE` (RMA/atomic initiator completions).
    counter: Option<Counter>,
    /// Address vector bound to the endpoint (shared with other endpoints of the domain).
    av: Arc<AddressVector>,
    /// Parent domain.
    domain: Arc<Domain>,
}

// SAFETY: every object belongs to a `FI_THREAD_SAFE` domain, so libfabric allows any thread
// to post and poll concurrently; `name` is immutable after construction.
unsafe impl Send for Endpoint {}
// SAFETY: see `Send`.
unsafe impl Sync for Endpoint {}

/// Closes the endpoint if construction fails half-way.
struct EpGuard(NonNull<sys::fid_ep>);

impl Drop for EpGuard {
    fn drop(&mut self) {
        // SAFETY: valid endpoint, closed once (the guard is forgotten on success).
        let _ = unsafe { sys::weft_fi_close(&mut (*self.0.as_ptr()).fid) };
    }
}

impl Endpoint {
    /// Opens an RDM endpoint on `domain`, binds its own CQ (and counter) and the shared `av`,
    /// enables it and reads its name.
    pub fn open(domain: &Arc<Domain>, av: &Arc<AddressVector>, config: &EndpointConfig) -> Result<Self, OfiError> {
        if !Arc::ptr_eq(av.domain(), domain) {
            return Err(OfiError::invalid("fi_ep_bind", "address vector belongs to another domain"));
        }
        // Objects are created before the endpoint so a failure drops (closes) them alone.
        let cq = CompletionQueue::open(domain, config.cq_size, config.wait_fd)?;
        let counter =
            if config.rma_counter && domain.info().caps().contains(super::Caps::RMA) { Some(Counter::open(domain)?) } else { None };
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain and its info; out-pointer to a local; no context.
        check("fi_endpoint", unsafe { sys::weft_fi_endpoint(domain.as_ptr(), domain.info().as_ptr(), &mut raw, ptr::null_mut()) })?;
        let raw = NonNull::new(raw).ok_or_else(|| OfiError::invalid("fi_endpoint", "NULL ep"))?;
        let guard = EpGuard(raw);
        // SAFETY: valid endpoint; valid AV of the same domain, which outlives the endpoint
        // (Arc'ed in the Endpoint built below).
        check("fi_ep_bind(av)", unsafe { sys::weft_fi_ep_bind(raw.as_ptr(), av.fid(), 0) })?;
        // SAFETY: valid endpoint; valid CQ of the same domain, owned by the Endpoint built
        // below and closed after it.
        check("fi_ep_bind(cq)", unsafe { sys::weft_fi_ep_bind(raw.as_ptr(), cq.fid(), sys::FI_TRANSMIT | sys::FI_RECV) })?;
        if let Some(c) = &counter {
            // SAFETY: as for the CQ: valid counter owned by the Endpoint, closed after it.
            check("fi_ep_bind(cntr)", unsafe { sys::weft_fi_ep_bind(raw.as_ptr(), c.fid(), sys::FI_READ | sys::FI_WRITE) })?;
        }
        // SAFETY: valid endpoint with AV and CQ bound.
        check("fi_enable", unsafe { sys::weft_fi_enable(raw.as_ptr()) })?;

        let mut name = vec![0u8; MAX_ADDR_LEN];
        let mut len = name.len();
        // SAFETY: valid enabled endpoint; `name` has `len` writable bytes.
        check("fi_getname", unsafe { sys::weft_fi_getname(&mut (*raw.as_ptr()).fid, name.as_mut_ptr().cast(), &mut len) })?;
        if len > name.len() {
            return Err(OfiError::invalid("fi_getname", format!("address of {len} bytes")));
        }
        name.truncate(len);
        std::mem::forget(guard);
        let info = domain.info();
        Ok(Self {
            raw,
            name,
            inject_size: info.inject_size(),
            max_msg_size: info.max_msg_size(),
            cq,
            counter,
            av: Arc::clone(av),
            domain: Arc::clone(domain),
        })
    }

    /// This endpoint's address bytes (`fi_getname`), to give to peers for `av.insert`.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The endpoint's completion queue.
    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The RMA/atomic completion counter, when configured and supported.
    pub fn rma_counter(&self) -> Option<&Counter> {
        self.counter.as_ref()
    }

    /// The address vector the endpoint resolves `FiAddr`s with.
    pub fn av(&self) -> &Arc<AddressVector> {
        &self.av
    }

    /// The parent domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// Largest message [`Endpoint::inject`]/[`Endpoint::tinject`] accept.
    pub fn inject_size(&self) -> usize {
        self.inject_size
    }

    /// Largest message size.
    pub fn max_msg_size(&self) -> usize {
        self.max_msg_size
    }

    fn ep(&self) -> *mut sys::fid_ep {
        self.raw.as_ptr()
    }

    /// Descriptor for a local buffer: `mr.desc()` after checking the buffer lies inside it.
    fn desc(op: &'static str, mr: Option<&MemoryRegion>, buf: *const u8, len: usize) -> Result<*mut c_void, OfiError> {
        match mr {
            None => Ok(ptr::null_mut()),
            Some(mr) if mr.contains(buf, len) => Ok(mr.desc()),
            Some(_) => Err(OfiError::invalid(op, "buffer is not inside the given memory region")),
        }
    }

    fn check_len(&self, op: &'static str, len: usize) -> Result<(), OfiError> {
        if len > self.max_msg_size {
            return Err(OfiError::invalid(op, format!("{len} bytes exceed max_msg_size {}", self.max_msg_size)));
        }
        Ok(())
    }

    fn check_inject(&self, op: &'static str, len: usize) -> Result<(), OfiError> {
        if len > self.inject_size {
            return Err(OfiError::invalid(op, format!("{len} bytes exceed inject_size {}", self.inject_size)));
        }
        Ok(())
    }

    /// Sends `buf` (at most [`Endpoint::inject_size`] bytes) untagged; the data is copied,
    /// and no completion is generated.
    pub fn inject(&self, buf: &[u8], dest: FiAddr) -> Result<Post, OfiError> {
        self.check_inject("fi_inject", buf.len())?;
        // SAFETY: valid endpoint; fi_inject copies `buf` before returning.
        let ret = unsafe { sys::weft_fi_inject(self.ep(), buf.as_ptr().cast(), buf.len(), dest.raw()) };
        Post::from_ret("fi_inject", ret)
    }

    /// Sends `buf` (at most [`Endpoint::inject_size`] bytes) with `tag`; the data is copied,
    /// and no completion is generated.
    pub fn tinject(&self, buf: &[u8], dest: FiAddr, tag: u64) -> Result<Post, OfiError> {
        self.check_inject("fi_tinject", buf.len())?;
        // SAFETY: valid endpoint; fi_tinject copies `buf` before returning.
        let ret = unsafe { sys::weft_fi_tinject(self.ep(), buf.as_ptr().cast(), buf.len(), dest.raw(), tag) };
        Post::from_ret("fi_tinject", ret)
    }

    /// Posts an untagged send of `buf` to `dest`; `ctx` comes back in its completion.
    /// `mr`, when given, must contain `buf` (its descriptor is passed).
    ///
    /// # Safety
    ///
    /// `buf` must stay valid and unmodified until this operation's completion has been read
    /// from [`Endpoint::cq`] (see the module docs).
    pub unsafe fn send(&self, buf: &[u8], mr: Option<&MemoryRegion>, dest: FiAddr, ctx: u64) -> Result<Post, OfiError> {
        self.check_len("fi_send", buf.len())?;
        let desc = Self::desc("fi_send", mr, buf.as_ptr(), buf.len())?;
        // SAFETY: valid endpoint; buffer lifetime per this function's contract.
        let ret = unsafe { sys::weft_fi_send(self.ep(), buf.as_ptr().cast(), buf.len(), desc, dest.raw(), ctx as *mut c_void) };
        Post::from_ret("fi_send", ret)
    }

    /// Posts an untagged receive into `buf` from `src` (`None`: any source).
    ///
    /// # Safety
    ///
    /// `buf` must stay valid and not be accessed until this operation's completion (or
    /// completion error) has been read from [`Endpoint::cq`] (see the module docs).
    pub unsafe fn recv(&self, buf: &mut [u8], mr: Option<&MemoryRegion>, src: Option<FiAddr>, ctx: u64) -> Result<Post, OfiError> {
        let desc = Self::desc("fi_recv", mr, buf.as_ptr(), buf.len())?;
        let src = src.unwrap_or(FiAddr::UNSPEC);
        // SAFETY: valid endpoint; buffer lifetime per this function's contract.
        let ret = unsafe { sys::weft_fi_recv(self.ep(), buf.as_mut_ptr().cast(), buf.len(), desc, src.raw(), ctx as *mut c_void) };
        Post::from_ret("fi_recv", ret)
    }

    /// Posts a tagged send of `buf` to `dest` with `tag`.
    ///
    /// # Safety
    ///
    /// As [`Endpoint::send`].
    pub unsafe fn tsend(&self, buf: &[u8], mr: Option<&MemoryRegion>, dest: FiAddr, tag: u64, ctx: u64) -> Result<Post, OfiError> {
        self.check_len("fi_tsend", buf.len())?;
        let desc = Self::desc("fi_tsend", mr, buf.as_ptr(), buf.len())?;
        // SAFETY: valid endpoint; buffer lifetime per this function's contract.
        let ret = unsafe { sys::weft_fi_tsend(self.ep(), buf.as_ptr().cast(), buf.len(), desc, dest.raw(), tag, ctx as *mut c_void) };
        Post::from_ret("fi_tsend", ret)
    }

    /// Posts a tagged receive into `buf`, matching tags equal to `tag` in the bits not set in
    /// `ignore`, from `src` (`None`: any source).
    ///
    /// # Safety
    ///
    /// As [`Endpoint::recv`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn trecv(
        &self,
        buf: &mut [u8],
        mr: Option<&MemoryRegion>,
        src: Option<FiAddr>,
        tag: u64,
        ignore: u64,
        ctx: u64,
    ) -> Result<Post, OfiError> {
        let desc = Self::desc("fi_trecv", mr, buf.as_ptr(), buf.len())?;
        let src = src.unwrap_or(FiAddr::UNSPEC);
        // SAFETY: valid endpoint; buffer lifetime per this function's contract.
        let ret =
            unsafe { sys::weft_fi_trecv(self.ep(), buf.as_mut_ptr().cast(), buf.len(), desc, src.raw(), tag, ignore, ctx as *mut c_void) };
        Post::from_ret("fi_trecv", ret)
    }

    /// RMA write of `local` to `remote` at `offset` on peer `dest`. With `delivered`, its
    /// completion waits until the target has applied the data (`FI_DELIVERY_COMPLETE`, through
    /// `fi_writemsg`); without, it is the endpoint's default (on `tcp`, once the data is
    /// handed to the socket).
    ///
    /// # Safety
    ///
    /// As [`Endpoint::send`] for `local`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write(
        &self,
        local: &[u8],
        local_mr: Option<&MemoryRegion>,
        dest: FiAddr,
        remote: &RemoteRegion,
        offset: u64,
        ctx: u64,
        delivered: bool,
    ) -> Result<Post, OfiError> {
        self.check_len("fi_write", local.len())?;
        let desc = Self::desc("fi_write", local_mr, local.as_ptr(), local.len())?;
        let addr = remote.addr("fi_write", offset, local.len())?;
        let write = if delivered { sys::weft_fi_write_delivered } else { sys::weft_fi_write };
        // SAFETY: valid endpoint; local buffer lifetime per this function's contract; the
        // remote range was checked against the region's length.
        let ret = unsafe { write(self.ep(), local.as_ptr().cast(), local.len(), desc, dest.raw(), addr, remote.key, ctx as *mut c_void) };
        Post::from_ret("fi_write", ret)
    }

    /// RMA read of `local.len()` bytes from `remote` at `offset` on peer `src` into `local`.
    ///
    /// # Safety
    ///
    /// As [`Endpoint::recv`] for `local`.
    pub unsafe fn read(
        &self,
        local: &mut [u8],
        local_mr: Option<&MemoryRegion>,
        src: FiAddr,
        remote: &RemoteRegion,
        offset: u64,
        ctx: u64,
    ) -> Result<Post, OfiError> {
        self.check_len("fi_read", local.len())?;
        let desc = Self::desc("fi_read", local_mr, local.as_ptr(), local.len())?;
        let addr = remote.addr("fi_read", offset, local.len())?;
        // SAFETY: valid endpoint; local buffer lifetime per this function's contract; remote
        // range checked.
        let ret = unsafe {
            sys::weft_fi_read(self.ep(), local.as_mut_ptr().cast(), local.len(), desc, src.raw(), addr, remote.key, ctx as *mut c_void)
        };
        Post::from_ret("fi_read", ret)
    }

    /// Atomic fetch-and-`op` on the `u64` at `offset` of `remote` on `dest`: `result` receives
    /// the old value. The target must be 8-byte aligned (checked here under
    /// `FI_MR_VIRT_ADDR`; with offset addressing the caller, which knows the owner's
    /// alignment, checks).
    ///
    /// # Safety
    ///
    /// `operand` and `result` must stay valid, `result` not accessed and `operand` not
    /// modified, until the completion has been read (see the module docs).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn fetch_atomic_u64(
        &self,
        op: FetchOp,
        operand: &u64,
        result: &mut u64,
        dest: FiAddr,
        remote: &RemoteRegion,
        offset: u64,
        ctx: u64,
    ) -> Result<Post, OfiError> {
        let addr = remote.addr("fi_fetch_atomic", offset, 8)?;
        // Under `FI_MR_VIRT_ADDR` (base not 0) `addr` is the target's address; with offset
        // addressing (base 0) the target's alignment is its owner's to know.
        if remote.base != 0 && addr % 8 != 0 {
            return Err(OfiError::invalid("fi_fetch_atomic", "target is not 8-byte aligned"));
        }
        // SAFETY: valid endpoint; one u64 operand/result, lifetimes per this function's
        // contract; no descriptors (weft does not use FI_MR_LOCAL).
        let ret = unsafe {
            sys::weft_fi_fetch_atomic(
                self.ep(),
                (operand as *const u64).cast(),
                1,
                ptr::null_mut(),
                (result as *mut u64).cast(),
                ptr::null_mut(),
                dest.raw(),
                addr,
                remote.key,
                sys::FI_UINT64,
                op.raw(),
                ctx as *mut c_void,
            )
        };
        Post::from_ret("fi_fetch_atomic", ret)
    }

    /// Atomic compare-and-swap (`FI_CSWAP`) on the `u64` at `offset` of `remote` on `dest`:
    /// stores `swap` if the value equals `compare`; `result` receives the old value.
    ///
    /// # Safety
    ///
    /// As [`Endpoint::fetch_atomic_u64`], for `compare`, `swap` and `result`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn compare_swap_u64(
        &self,
        compare: &u64,
        swap: &u64,
        result: &mut u64,
        dest: FiAddr,
        remote: &RemoteRegion,
        offset: u64,
        ctx: u64,
    ) -> Result<Post, OfiError> {
        let addr = remote.addr("fi_compare_atomic", offset, 8)?;
        // Under `FI_MR_VIRT_ADDR` (base not 0) `addr` is the target's address; with offset
        // addressing (base 0) the target's alignment is its owner's to know.
        if remote.base != 0 && addr % 8 != 0 {
            return Err(OfiError::invalid("fi_compare_atomic", "target is not 8-byte aligned"));
        }
        // SAFETY: valid endpoint; one u64 each, lifetimes per this function's contract.
        let ret = unsafe {
            sys::weft_fi_compare_atomic(
                self.ep(),
                (swap as *const u64).cast(),
                1,
                ptr::null_mut(),
                (compare as *const u64).cast(),
                ptr::null_mut(),
                (result as *mut u64).cast(),
                ptr::null_mut(),
                dest.raw(),
                addr,
                remote.key,
                sys::FI_UINT64,
                sys::FI_CSWAP,
                ctx as *mut c_void,
            )
        };
        Post::from_ret("fi_compare_atomic", ret)
    }

    /// Whether the provider supports `op` as a fetching atomic on `u64` (`fi_fetch_atomicvalid`).
    pub fn fetch_atomic_valid(&self, op: FetchOp) -> bool {
        let mut count = 0usize;
        // SAFETY: valid endpoint; out-pointer to a local.
        let ret = unsafe { sys::weft_fi_fetch_atomicvalid(self.ep(), sys::FI_UINT64, op.raw(), &mut count) };
        ret == 0 && count >= 1
    }

    /// Whether the provider supports `FI_CSWAP` on `u64` (`fi_compare_atomicvalid`).
    pub fn compare_swap_valid(&self) -> bool {
        let mut count = 0usize;
        // SAFETY: valid endpoint; out-pointer to a local.
        let ret = unsafe { sys::weft_fi_compare_atomicvalid(self.ep(), sys::FI_UINT64, sys::FI_CSWAP, &mut count) };
        ret == 0 && count >= 1
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // SAFETY: valid endpoint, closed exactly once, before its CQ, counter, AV and domain
        // (fields, dropped after this).
        let _ = unsafe { sys::weft_fi_close(&mut (*self.raw.as_ptr()).fid) };
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("name_len", &self.name.len())
            .field("inject_size", &self.inject_size)
            .field("cq", &self.cq)
            .finish_non_exhaustive()
    }
}
