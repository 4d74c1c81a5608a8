//! Posting a frame (path step 2): the CRI's lock, the transport, and — when the destination
//! keeps refusing — progress meanwhile, then the outbox.

use std::sync::Arc;

use weft_sync::Error;
use weft_transport::{Header, SendError};

use crate::engine::outbox::QueuedFrame;
use crate::engine::{main_path_inline, Engine, SendOutcome};
use crate::loom::sync::atomic::Ordering;
use crate::operation::Operation;

/// How long a send retries a refused frame (progressing meanwhile) before it queues the
/// frame and returns: long enough for a provider's transient refusals (`tcp;ofi_rxm` and
/// `shm` refuse while they set up a connection), short enough that a destination nobody
/// drains does not hold a nonblocking send.
const DEFER_AFTER: std::time::Duration = std::time::Duration::from_millis(20);

impl Engine {
    /// Puts one frame from CRI `k` to `dst` without blocking for long (`MPI_Isend`
    /// semantics). When the destination keeps refusing it for [`DEFER_AFTER`] (retried with
    /// progress meanwhile) — or frames to `dst` are already waiting — the frame is queued
    /// and sent by a later progress pass of this rank, in posting order; `make` then gives
    /// the request to complete when it goes out (`None`: nothing to complete, e.g. an
    /// `Rts`, which its `Fin` completes), returned in [`SendOutcome::Deferred`].
    ///
    /// # Safety
    /// `data` must stay valid and unchanged until the frame is sent: if this returns
    /// `SendOutcome::Deferred`, until the request `make` gave completes (the caller's request
    /// keeps the buffer, or orphans it into the request when dropped); without a request,
    /// `data` must be empty.
    #[inline]
    pub(crate) unsafe fn post_frame(
        &self,
        k: usize,
        dst: u32,
        header: Header,
        data: &[u8],
        make: impl FnOnce() -> Option<Arc<Operation>>,
    ) -> Result<SendOutcome, Error> {
        // `k` is one of this rank's CRIs and every rank has as many: the same index at the
        // destination (a compare, not a division, per frame).
        let n = self.transport.num_cris();
        let dst_cri = if k < n { k } else { k % n };
        if !self.queued_to(dst) {
            // Made at the first refusal: a frame taken at once pays for neither.
            let mut backoff: Option<weft_sync::IdleBackoff> = None;
            let mut since: Option<std::time::Instant> = None;
            loop {
                let res = main_path_inline!(self, || {
                    self.cris[k].lock.high(|c| {
                        let r = self.transport.send(dst, dst_cri, &header, data);
                        if r.is_ok() {
                            c.counters.sent += 1;
                        }
                        r
                    })
                });
                match res {
                    Ok(()) => return Ok(SendOutcome::Sent),
                    Err(SendError::PeerLost) => return Err(Error::PeerLost { rank: dst }),
                    Err(SendError::Invalid(what)) => return Err(Error::InvalidArgument(what)),
                    Err(SendError::WouldBlock) => {}
                }
                // Refusals are often transient (a provider setting up the connection on the
                // first frame, a CQ to read): progress and retry for a while, then queue.
                let now = std::time::Instant::now();
                if since.is_none() {
                    self.counters.flow_control_waits.fetch_add(1, Ordering::Relaxed);
                }
                if now.duration_since(*since.get_or_insert(now)) >= DEFER_AFTER {
                    break;
                }
                if !self.progress_once().progressed() {
                    backoff.get_or_insert_with(weft_sync::IdleBackoff::new).snooze();
                }
            }
        }
        let complete = make();
        debug_assert!(complete.is_some() || data.is_empty(), "a deferred payload needs a request that keeps it");
        self.defer(QueuedFrame { dst, dst_cri, header, ptr: data.as_ptr(), len: data.len(), complete: complete.clone() });
        Ok(SendOutcome::Deferred(complete))
    }
}
