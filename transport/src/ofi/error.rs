//! Errors and posting outcomes of the libfabric layer.

use std::ffi::CStr;
use std::fmt;

use super::sys;

/// A libfabric call failed: which call, its error number (positive `FI_E*`) and
/// `fi_strerror`'s text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfiError {
    /// The libfabric call (or weft check) that failed, e.g. `"fi_getinfo"`.
    pub op: &'static str,
    /// Positive libfabric error number (`FI_ENODATA`, `FI_ETRUNC`, ...).
    pub code: i32,
    /// Human-readable text, from `fi_strerror` or from weft's own check.
    pub text: String,
}

impl OfiError {
    /// Builds the error for `op` returning `ret` (negative or positive error number).
    pub(crate) fn from_code(op: &'static str, ret: i64) -> Self {
        let code = i32::try_from(ret.unsigned_abs()).unwrap_or(i32::MAX);
        Self { op, code, text: strerror(code) }
    }

    /// An error found by weft's own argument checks (no libfabric call was made).
    pub(crate) fn invalid(op: &'static str, text: impl Into<String>) -> Self {
        Self { op, code: sys::FI_EINVAL, text: text.into() }
    }

    /// True when the error says "no provider / no match" (`FI_ENODATA` from `fi_getinfo`):
    /// the provider is not available on this machine, as opposed to a failure.
    pub fn is_unavailable(&self) -> bool {
        self.code == sys::FI_ENODATA
    }
}

impl fmt::Display for OfiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} (error {})", self.op, self.text, self.code)
    }
}

impl std::error::Error for OfiError {}

/// `fi_strerror(code)` as an owned string.
pub(crate) fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror accepts any error number and returns a pointer to a static,
    // NUL-terminated string (never NULL in libfabric 1.x, checked anyway).
    let ptr = unsafe { sys::fi_strerror(code) };
    if ptr.is_null() {
        return format!("libfabric error {code}");
    }
    // SAFETY: non-null, NUL-terminated and static (see above).
    unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned()
}

/// Maps a libfabric `int` return (0 = success, negative = `-FI_E*`) to a `Result`.
pub(crate) fn check(op: &'static str, ret: i32) -> Result<(), OfiError> {
    if ret == 0 {
        Ok(())
    } else {
        Err(OfiError::from_code(op, i64::from(ret)))
    }
}

/// What happened to a post (send, receive, RMA, atomic).
///
/// `WouldBlock` is libfabric's `-FI_EAGAIN`: the provider's queues are full and nothing was
/// posted. The caller must progress the completion queue (read completions) and post again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a post may not have happened: handle Post::WouldBlock"]
pub enum Post {
    /// The operation is queued; its completion will appear on the endpoint's CQ (for
    /// `inject`, no completion is generated and the buffer is already reusable).
    Posted,
    /// Nothing was posted (`FI_EAGAIN`): progress the CQ and retry.
    WouldBlock,
}

impl Post {
    /// Maps the `ssize_t` return of a libfabric data-transfer call.
    pub(crate) fn from_ret(op: &'static str, ret: isize) -> Result<Self, OfiError> {
        if ret == 0 {
            Ok(Post::Posted)
        } else if ret == -(sys::FI_EAGAIN as isize) {
            Ok(Post::WouldBlock)
        } else {
            Err(OfiError::from_code(op, ret as i64))
        }
    }

    /// True for [`Post::Posted`].
    pub fn is_posted(self) -> bool {
        matches!(self, Post::Posted)
    }
}
