//! Eager and rendezvous protocols (path steps 2-5): putting frames on a CRI, and turning
//! received frames into completed requests.
//!
//! * Eager (message <= eager threshold): the payload travels in the frame; the send
//!   completes when the frame is accepted.
//! * Rendezvous: the sender registers its buffer and sends an `Rts` carrying the length, the
//!   remote key and a cookie naming its request; the receiver, once matched, reads the data
//!   straight into the receive buffer (RMA read) and answers `Fin`, which completes the send.
//!   Memory stays bounded for any message size.

use std::sync::Arc;

use weft_sync::{Error, Outcome, Status};
use weft_transport::{Frame, FrameKind, Header, SendError};

use crate::matching::{message_len, Matched};
use crate::request::ReqInner;
use crate::runtime::Shared;

thread_local! {
    static MATCHED: std::cell::RefCell<Vec<Matched>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Frames taken from one inbox per progress call (bounded work per call).
const POLL_BATCH: usize = 64;

impl Shared {
    /// Sends one frame from CRI `k` to `dst`, waiting out flow control: when the peer's inbox
    /// is full, the CRI is released, progress is made, and the send retried. Never drops the
    /// frame; fails only if the peer is gone.
    pub(crate) fn send_frame(&self, k: usize, dst: u32, header: Header, data: &[u8]) -> Result<(), Error> {
        let dst_cri = k % self.transport.num_cris();
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            let res = {
                let mut g = self.lock_cri(k);
                let r = self.transport.send(dst, dst_cri, header, data);
                if r.is_ok() {
                    g.sent += 1;
                }
                r
            };
            match res {
                Ok(()) => return Ok(()),
                Err(SendError::PeerLost) => return Err(Error::PeerLost { rank: dst }),
                Err(SendError::Invalid(what)) => return Err(Error::InvalidArgument(what)),
                Err(SendError::WouldBlock) => {
                    self.counters.flow_control_waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if !self.progress_once() {
                        backoff.snooze();
                    }
                }
            }
        }
    }

    /// Drains up to a batch of frames from CRI `k`; the caller holds its lock (`counters`).
    /// Returns the number of frames handled.
    pub(crate) fn progress_cri(&self, k: usize, counters: &mut crate::counters::CriCounters) -> usize {
        let n = self.transport.poll(k, POLL_BATCH, |frame| self.handle_frame(k, frame));
        if n > 0 {
            counters.received += n as u64;
            counters.productive += 1;
        } else {
            counters.unproductive += 1;
        }
        n
    }

    /// Path step 4-5: one received frame.
    pub(crate) fn handle_frame(&self, k: usize, frame: Frame) {
        match frame.header.kind {
            FrameKind::Eager | FrameKind::Rts => {
                let Some(comm) = self.context(frame.header.context) else {
                    // A peer already uses a communicator this rank has not created yet.
                    self.early_contexts.lock().push(frame);
                    return;
                };
                if comm.is_freed() {
                    self.release_frame(frame);
                    return;
                }
                // A reused per-thread scratch list: no allocation per frame.
                let mut matched = MATCHED.with(|m| std::mem::take(&mut *m.borrow_mut()));
                let timing = self.config.match_timing.then(std::time::Instant::now);
                self.with_matching(comm, |m| {
                    m.arrive(frame, &mut matched);
                    if let Some(t0) = timing {
                        m.counters.match_nanos += t0.elapsed().as_nanos() as u64;
                    }
                });
                for m in matched.drain(..) {
                    self.finish_match(k, m.req, m.frame);
                }
                MATCHED.with(|m| *m.borrow_mut() = matched);
            }
            FrameKind::Fin => {
                let ptr = frame.header.cookie as usize as *const ReqInner;
                // SAFETY: the cookie is the `Arc::into_raw` this rank put in its `Rts`
                // (`isend`), echoed once by the receiver's `Fin`; taking it back releases
                // that reference exactly once.
                let req = unsafe { Arc::from_raw(ptr) };
                self.transport.deregister(req.key.load(std::sync::atomic::Ordering::Relaxed));
                req.cell.complete(Ok(Status { source: frame.header.source, tag: frame.header.tag, bytes: frame.header.len as usize }));
                req.orphan.lock().take();
            }
        }
    }

    /// Gives a frame's resources back without delivering it (freed communicator).
    pub(crate) fn release_frame(&self, frame: Frame) {
        if frame.header.kind == FrameKind::Rts {
            // The sender waits for a `Fin`; tell it the data was consumed (MPI would hang).
            let fin = Header { kind: FrameKind::Fin, len: 0, ..frame.header };
            self.send_control(frame.header.source, frame.header.src_cri as usize, fin);
        }
        self.transport.recycle(frame.header.source, frame.payload);
    }

    /// Completes receive `req` with `frame` (outside every matching lock).
    pub(crate) fn finish_match(&self, _k: usize, req: Arc<ReqInner>, frame: Frame) {
        let h = frame.header;
        let len = message_len(&frame);
        let outcome: Outcome = if len > req.cap {
            Err(Error::Truncated { message_len: len, buffer_len: req.cap })
        } else if req.elem > 1 && len % req.elem != 0 {
            Err(Error::Misaligned { elem_size: req.elem, message_len: len })
        } else {
            match h.kind {
                FrameKind::Rts => {
                    // SAFETY: `ptr..ptr+cap` is the receive area owned by the request (or its
                    // orphan slot) until the cell completes, and `len <= cap`.
                    let dst = unsafe { std::slice::from_raw_parts_mut(req.ptr, len) };
                    self.transport.read(&h, dst).map(|()| Status { source: h.source, tag: h.tag, bytes: len })
                }
                _ => {
                    let src = frame.payload.as_slice();
                    if len > 0 {
                        // SAFETY: as above; the payload is a distinct allocation.
                        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), req.ptr, len) };
                    }
                    Ok(Status { source: h.source, tag: h.tag, bytes: len })
                }
            }
        };
        if h.kind == FrameKind::Rts {
            let fin = Header { kind: FrameKind::Fin, len: len as u64, ..h };
            self.send_control(h.source, h.src_cri as usize, fin);
        } else {
            self.transport.recycle(h.source, frame.payload);
        }
        req.cell.complete(outcome);
    }

    /// Sends a payload-less protocol frame to CRI `cri` of `dst` without blocking: if the
    /// inbox is full, the frame is deferred and retried by progress.
    pub(crate) fn send_control(&self, dst: u32, cri: usize, mut header: Header) {
        header.source = self.transport.rank();
        match self.transport.send(dst, cri, header, &[]) {
            Ok(()) | Err(SendError::PeerLost) | Err(SendError::Invalid(_)) => {}
            Err(SendError::WouldBlock) => {
                self.deferred.lock().push((dst, cri, header));
                self.has_deferred.store(true, std::sync::atomic::Ordering::Release);
            }
        }
    }

    /// Retries deferred control frames; returns how many went out.
    pub(crate) fn flush_deferred(&self) -> usize {
        // Acquire: pairs with the store after the push; the common case is one load.
        if !self.has_deferred.load(std::sync::atomic::Ordering::Acquire) {
            return 0;
        }
        let mut pending = self.deferred.lock();
        let before = pending.len();
        pending.retain(|&(dst, cri, h)| matches!(self.transport.send(dst, cri, h, &[]), Err(SendError::WouldBlock)));
        self.has_deferred.store(!pending.is_empty(), std::sync::atomic::Ordering::Release);
        before - pending.len()
    }
}
