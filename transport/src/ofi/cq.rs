//! Completion queue (`FI_CQ_FORMAT_TAGGED`), its error entries, and its wait object.

use std::ffi::CStr;
use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;
use std::os::raw::c_int;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::Duration;

use super::error::OfiError;
use super::fabric::Domain;
use super::flags::CompletionFlags;
use super::sys;

/// Entries read from libfabric per `fi_cq_read` call.
const CQ_READ_BATCH: usize = 32;

/// One successful completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CqEntry {
    /// The `u64` context given when the operation was posted.
    pub context: u64,
    /// What completed (send, receive, RMA, ...).
    pub flags: CompletionFlags,
    /// Bytes received (receives); 0 or unspecified for other operations.
    pub len: usize,
    /// Tag of a tagged receive.
    pub tag: u64,
    /// Remote CQ data, when `flags` has `REMOTE_CQ_DATA`.
    pub data: u64,
}

/// A failed operation, read from the CQ's error queue (`fi_cq_readerr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletionError {
    /// The `u64` context of the failed operation.
    pub context: u64,
    /// The error (`code` is `FI_ETRUNC`, `FI_ECANCELED`, ...; `text` includes the provider's
    /// explanation where it gives one).
    pub error: OfiError,
    /// Provider-specific error number.
    pub prov_errno: i32,
    /// What failed.
    pub flags: CompletionFlags,
    /// Bytes transferred.
    pub len: usize,
    /// Bytes that did not fit (truncated receives).
    pub olen: usize,
    /// Tag of a tagged receive.
    pub tag: u64,
}

/// Why [`CompletionQueue::read`] returned no completions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CqError {
    /// An operation completed in error (`-FI_EAVAIL`); its entry has been consumed. Reading
    /// again continues with the next completion.
    Completion(CompletionError),
    /// The CQ itself failed.
    Fatal(OfiError),
}

impl fmt::Display for CqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CqError::Completion(e) => write!(f, "operation {:#x} failed: {}", e.context, e.error),
            CqError::Fatal(e) => write!(f, "completion queue failed: {e}"),
        }
    }
}

impl std::error::Error for CqError {}

/// What [`CompletionQueue::try_wait`] allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryWait {
    /// Nothing is pending: it is safe to block on [`CompletionQueue::wait_fd`].
    Block,
    /// Completions (or provider progress) are pending: read the CQ instead of blocking.
    MustPoll,
}

/// Outcome of [`CompletionQueue::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The wait fd became readable, or `fi_trywait` said completions are pending: read the CQ.
    Ready,
    /// The timeout passed first.
    TimedOut,
}

/// A completion queue of format `FI_CQ_FORMAT_TAGGED`, owned by one [`Endpoint`].
///
/// [`Endpoint`]: super::Endpoint
pub struct CompletionQueue {
    /// The CQ object; closed in `Drop`, after the endpoint bound to it.
    raw: NonNull<sys::fid_cq>,
    /// `FI_WAIT_FD` file descriptor (owned by libfabric), when the provider has one.
    wait_fd: Option<RawFd>,
    /// Parent; keeps the domain (and fabric, for `fi_trywait`) open.
    domain: Arc<Domain>,
}

// SAFETY: the domain is `FI_THREAD_SAFE`, so CQ calls may come from any thread concurrently.
unsafe impl Send for CompletionQueue {}
// SAFETY: see `Send`.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// Opens a tagged-format CQ of `size` entries, with an `FI_WAIT_FD` wait object when
    /// `want_fd` is set and the provider supports it (else no wait object).
    pub(crate) fn open(domain: &Arc<Domain>, size: usize, want_fd: bool) -> Result<Self, OfiError> {
        let open = |wait_obj| {
            let mut attr = sys::fi_cq_attr { size, format: sys::FI_CQ_FORMAT_TAGGED, wait_obj, ..Default::default() };
            let mut raw = ptr::null_mut();
            // SAFETY: valid domain and attr; out-pointer to a local; no context.
            let ret = unsafe { sys::weft_fi_cq_open(domain.as_ptr(), &mut attr, &mut raw, ptr::null_mut()) };
            super::error::check("fi_cq_open", ret)?;
            NonNull::new(raw).ok_or_else(|| OfiError::invalid("fi_cq_open", "NULL cq"))
        };
        let (raw, with_fd) = if want_fd {
            match open(sys::FI_WAIT_FD) {
                Ok(raw) => (raw, true),
                Err(_) => (open(sys::FI_WAIT_NONE)?, false),
            }
        } else {
            (open(sys::FI_WAIT_NONE)?, false)
        };
        let mut cq = Self { raw, wait_fd: None, domain: Arc::clone(domain) };
        if with_fd {
            let mut fd: c_int = -1;
            // SAFETY: valid CQ; FI_GETWAIT on an FI_WAIT_FD CQ writes one int.
            let ret = unsafe { sys::weft_fi_control(cq.fid(), sys::FI_GETWAIT as c_int, (&mut fd as *mut c_int).cast()) };
            if ret == 0 && fd >= 0 {
                cq.wait_fd = Some(fd);
            }
        }
        Ok(cq)
    }

    pub(crate) fn fid(&self) -> *mut sys::fid {
        // SAFETY: valid CQ; address of its embedded fid.
        unsafe { &mut (*self.raw.as_ptr()).fid }
    }

    /// Reads up to `out.len()` completions (also driving the provider's progress).
    ///
    /// Returns `Ok(0)` when none is available (`FI_EAGAIN`). When an operation failed
    /// (`-FI_EAVAIL`), reads its error entry and returns it as [`CqError::Completion`].
    pub fn read(&self, out: &mut [CqEntry]) -> Result<usize, CqError> {
        let max = out.len();
        let mut slots = out.iter_mut();
        self.read_each(max, |c| {
            if let Some(o) = slots.next() {
                *o = c;
            }
        })
    }

    /// Reads up to `max` completions (at most 32 per call) and hands each to `f`, in CQ
    /// order; returns how many. Same results as [`read`](Self::read), without a caller
    /// buffer: nothing is zeroed or copied twice, which matters on a path that reads an
    /// empty CQ millions of times a second.
    #[inline]
    pub fn read_each(&self, max: usize, mut f: impl FnMut(CqEntry)) -> Result<usize, CqError> {
        let want = max.min(CQ_READ_BATCH);
        if want == 0 {
            return Ok(0);
        }
        let mut buf = [const { MaybeUninit::<sys::fi_cq_tagged_entry>::uninit() }; CQ_READ_BATCH];
        // SAFETY: valid CQ of format TAGGED; `buf` has room for `want` tagged entries, which
        // libfabric writes before returning their count.
        let ret = unsafe { sys::weft_fi_cq_read(self.raw.as_ptr(), buf.as_mut_ptr().cast(), want) };
        if ret > 0 {
            let n = (ret as usize).min(want);
            for e in &buf[..n] {
                // SAFETY: libfabric initialized the first `ret` entries.
                let e = unsafe { e.assume_init_ref() };
                f(CqEntry {
                    context: e.op_context as u64,
                    flags: CompletionFlags::from_bits(e.flags),
                    len: e.len,
                    tag: e.tag,
                    data: e.data,
                });
            }
            Ok(n)
        } else if ret == 0 || ret == -(sys::FI_EAGAIN as isize) {
            Ok(0)
        } else if ret == -(sys::FI_EAVAIL as isize) {
            Err(self.read_error())
        } else {
            Err(CqError::Fatal(OfiError::from_code("fi_cq_read", ret as i64)))
        }
    }

    #[cold]
    fn read_error(&self) -> CqError {
        let mut e = sys::fi_cq_err_entry::default();
        // SAFETY: valid CQ; `e` is a zeroed entry (err_data_size 0: the provider supplies its
        // own err_data buffer, valid until the next read).
        let ret = unsafe { sys::weft_fi_cq_readerr(self.raw.as_ptr(), &mut e, 0) };
        if ret < 0 {
            return CqError::Fatal(OfiError::from_code("fi_cq_readerr", ret as i64));
        }
        // shm (1.17) reports `-FI_E*` here, others `FI_E*`: normalize to positive.
        let code = i32::try_from(e.err.unsigned_abs()).unwrap_or(i32::MAX);
        let mut text = super::error::strerror(code);
        let mut buf = [0 as std::os::raw::c_char; 256];
        // SAFETY: valid CQ; err_data from the entry just read (still valid); `buf` of its len.
        let prov = unsafe { sys::weft_fi_cq_strerror(self.raw.as_ptr(), e.prov_errno, e.err_data, buf.as_mut_ptr(), buf.len()) };
        if !prov.is_null() {
            // SAFETY: fi_cq_strerror returns a NUL-terminated string (in `buf` or static).
            let prov = unsafe { CStr::from_ptr(prov) }.to_string_lossy();
            if !prov.is_empty() && prov != text {
                text = format!("{text} ({prov})");
            }
        }
        CqError::Completion(CompletionError {
            context: e.op_context as u64,
            error: OfiError { op: "completion", code, text },
            prov_errno: e.prov_errno,
            flags: CompletionFlags::from_bits(e.flags),
            len: e.len,
            olen: e.olen,
            tag: e.tag,
        })
    }

    /// The `FI_WAIT_FD` file descriptor (owned by libfabric; do not close it), when the
    /// provider supports one. Block on it only after [`CompletionQueue::try_wait`] returned
    /// [`TryWait::Block`].
    pub fn wait_fd(&self) -> Option<RawFd> {
        self.wait_fd
    }

    /// `fi_trywait` on this CQ: whether blocking on the wait fd is safe now.
    pub fn try_wait(&self) -> Result<TryWait, OfiError> {
        if self.wait_fd.is_none() {
            return Err(OfiError::invalid("fi_trywait", "CQ has no wait object"));
        }
        let mut fid = self.fid();
        // SAFETY: valid fabric and an array of one valid CQ fid.
        let ret = unsafe { sys::weft_fi_trywait(self.domain.fabric().as_ptr(), &mut fid, 1) };
        match ret {
            0 => Ok(TryWait::Block),
            r if r == -sys::FI_EAGAIN => Ok(TryWait::MustPoll),
            r => Err(OfiError::from_code("fi_trywait", i64::from(r))),
        }
    }

    /// Waits until completions may be available or `timeout` passes: `fi_trywait`, then
    /// `poll(2)` on the wait fd. Errors if the CQ has no wait fd.
    pub fn wait(&self, timeout: Duration) -> Result<WaitOutcome, OfiError> {
        let Some(fd) = self.wait_fd else {
            return Err(OfiError::invalid("CompletionQueue::wait", "CQ has no wait object"));
        };
        if self.try_wait()? == TryWait::MustPoll {
            return Ok(WaitOutcome::Ready);
        }
        let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; `fd` is the CQ's wait fd, open while self lives.
        let ret = unsafe { libc::poll(&mut pfd, 1, ms) };
        match ret {
            0 => Ok(WaitOutcome::TimedOut),
            r if r > 0 => Ok(WaitOutcome::Ready),
            _ => {
                let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                if errno == libc::EINTR {
                    Ok(WaitOutcome::Ready)
                } else {
                    Err(OfiError::from_code("poll", i64::from(errno)))
                }
            }
        }
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: the endpoint bound to this CQ owns it and closes itself first (see
        // `Endpoint`'s drop); the fid is valid and closed once.
        let _ = unsafe { sys::weft_fi_close(self.fid()) };
    }
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue").field("wait_fd", &self.wait_fd).finish()
    }
}

/// A completion counter (`fi_cntr`), counting the endpoint's completed RMA/atomic operations.
pub struct Counter {
    /// The counter object; closed in `Drop`, after the endpoint bound to it.
    raw: NonNull<sys::fid_cntr>,
    /// Parent; keeps the domain open.
    _domain: Arc<Domain>,
}

// SAFETY: the domain is `FI_THREAD_SAFE`, so counter calls may come from any thread.
unsafe impl Send for Counter {}
// SAFETY: see `Send`.
unsafe impl Sync for Counter {}

impl Counter {
    pub(crate) fn open(domain: &Arc<Domain>) -> Result<Self, OfiError> {
        let mut attr = sys::fi_cntr_attr { events: sys::FI_CNTR_EVENTS_COMP, wait_obj: sys::FI_WAIT_UNSPEC, ..Default::default() };
        let mut raw = ptr::null_mut();
        // SAFETY: valid domain and attr; out-pointer to a local; no context.
        let ret = unsafe { sys::weft_fi_cntr_open(domain.as_ptr(), &mut attr, &mut raw, ptr::null_mut()) };
        super::error::check("fi_cntr_open", ret)?;
        let raw = NonNull::new(raw).ok_or_else(|| OfiError::invalid("fi_cntr_open", "NULL cntr"))?;
        Ok(Self { raw, _domain: Arc::clone(domain) })
    }

    pub(crate) fn fid(&self) -> *mut sys::fid {
        // SAFETY: valid counter; address of its embedded fid.
        unsafe { &mut (*self.raw.as_ptr()).fid }
    }

    /// Number of operations completed successfully (`fi_cntr_read`; drives progress).
    pub fn read(&self) -> u64 {
        // SAFETY: valid counter.
        unsafe { sys::weft_fi_cntr_read(self.raw.as_ptr()) }
    }

    /// Number of operations completed in error (`fi_cntr_readerr`).
    pub fn read_err(&self) -> u64 {
        // SAFETY: valid counter.
        unsafe { sys::weft_fi_cntr_readerr(self.raw.as_ptr()) }
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        // SAFETY: the endpoint bound to it closes first; valid fid, closed once.
        let _ = unsafe { sys::weft_fi_close(self.fid()) };
    }
}

impl fmt::Debug for Counter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Counter").field("value", &self.read()).finish()
    }
}
