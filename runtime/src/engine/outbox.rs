//! The outbox: frames a full inbox refused (eager sends, `Rts`, `Fin`), queued per
//! destination in posting order and sent by later progress passes — the rank's threads' or
//! its courier's (`courier.rs`) — so a nonblocking send never blocks and nobody has to poll
//! for them. Its flush is also the rare-events pass of progress: newly lost peers
//! (`peers.rs`) and finished rendezvous reads (`reads.rs`).

use std::sync::Arc;

use parking_lot::Mutex;
use weft_sync::{Error, Outcome, Status};
use weft_transport::{FrameKind, Header, SendError};

use super::Engine;
use crate::loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use crate::operation::Operation;

/// Whether [`Engine::post_frame`] sent the frame or queued it.
pub(crate) enum SendOutcome {
    /// Accepted by the transport.
    Sent,
    /// Queued behind a full inbox; sent (and this request completed) by progress.
    Deferred(Option<Arc<Operation>>),
}

/// The outbox of one rank (a part of [`Engine`]).
pub(crate) struct Outbox {
    /// Frames a full inbox refused (eager sends, `Rts`, `Fin`), in posting order, sent by
    /// progress (`Engine::flush_deferred`) — the rank's threads' or its courier's: a
    /// nonblocking send never blocks, and nobody has to poll for the frames.
    pub(crate) queues: Mutex<DeferredQueues>,
    /// `queues` is non-empty: progress checks this flag instead of taking the lock. It
    /// changes only under the lock.
    pub(crate) pending: AtomicBool,
    /// Deferred frames per destination rank: a send to a rank with frames waiting queues
    /// behind them instead of overtaking them.
    pub(crate) per_dst: Box<[AtomicU32]>,
}

impl Outbox {
    /// An empty outbox for a world of `size` ranks.
    pub(crate) fn new(size: u32) -> Self {
        Outbox {
            queues: Mutex::new(DeferredQueues::new(size)),
            pending: AtomicBool::new(false),
            per_dst: (0..size).map(|_| AtomicU32::new(0)).collect(),
        }
    }
}

/// The frames full inboxes refused (`Engine::deferred`), a FIFO per destination: a full
/// destination holds back only its own frames, and a progress pass visits only the
/// destinations that have any.
pub(crate) struct DeferredQueues {
    /// Per destination rank, in posting order (an empty queue allocates nothing).
    by_dst: Vec<std::collections::VecDeque<QueuedFrame>>,
    /// The destinations whose queue is not empty, each once.
    active: Vec<u32>,
}

impl DeferredQueues {
    /// Queues for a world of `size` ranks.
    pub(crate) fn new(size: u32) -> Self {
        DeferredQueues { by_dst: (0..size).map(|_| std::collections::VecDeque::new()).collect(), active: Vec::new() }
    }
}

/// A frame a full inbox refused, waiting in `Engine::deferred`.
pub(crate) struct QueuedFrame {
    pub(crate) dst: u32,
    pub(crate) dst_cri: usize,
    pub(crate) header: Header,
    /// The payload: the sender's buffer, kept alive by its request until `complete`
    /// completes (`post_frame`'s contract); dangling with `len` 0 for control frames.
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
    /// Completed when the frame goes out (an eager send); `None` for `Rts` (its `Fin`
    /// completes it) and control frames.
    pub(crate) complete: Option<Arc<Operation>>,
}

// SAFETY: `ptr` is only read by the progress pass that sends the frame, while the request
// that owns the bytes is still incomplete (see `post_frame`); the bytes never change then.
unsafe impl Send for QueuedFrame {}

impl Engine {
    /// Whether frames to `dst` wait in the deferred queue (a new one must queue behind).
    #[inline]
    pub(crate) fn queued_to(&self, dst: u32) -> bool {
        // Relaxed: the sending thread's own deferrals happened before (program order), and
        // other threads' sends are unordered with ours anyway (MPI orders per thread).
        self.outbox.per_dst.get(dst as usize).is_some_and(|n| n.load(Ordering::Relaxed) > 0)
    }

    /// Queues a refused frame behind the others to its destination. The first frame the
    /// rank holds summons its courier (`courier.rs`), which sends the queue when nobody
    /// else progresses; later ones need no summons — each was refused by its destination
    /// (or queues behind one that was), which rings room when it drains.
    pub(crate) fn defer(&self, d: QueuedFrame) {
        let (d_dst, d_kind) = (d.dst, d.header.kind);
        let mut q = self.outbox.queues.lock();
        let DeferredQueues { by_dst, active } = &mut *q;
        let (Some(queue), Some(n)) = (by_dst.get_mut(d.dst as usize), self.outbox.per_dst.get(d.dst as usize)) else {
            // No such rank (the transport refuses those before any deferral): fail it.
            drop(q);
            if let Some(req) = d.complete {
                req.cell.complete(Err(Error::InvalidArgument("destination rank out of range")));
            }
            return;
        };
        n.fetch_add(1, Ordering::Relaxed);
        if queue.is_empty() {
            active.push(d.dst);
        }
        queue.push_back(d);
        // Release: a progress pass (or the courier) that sees the flag finds the entry under
        // the lock. The flag changes only under the lock: `was` is whether the rank held
        // frames already.
        let was = self.outbox.pending.swap(true, Ordering::Release);
        drop(q);
        tracing::trace!(rank = self.transport.rank(), dst = d_dst, kind = ?d_kind, "frame deferred behind a full inbox");
        if !was {
            self.summon_courier();
        }
    }

    /// Sends a payload-less protocol frame to CRI `cri` of `dst` without blocking: if the
    /// inbox is full (or frames to `dst` wait already), the frame is deferred and sent by
    /// progress.
    pub(crate) fn send_control(&self, dst: u32, cri: usize, mut header: Header) {
        header.source = self.transport.rank();
        if !self.queued_to(dst) {
            match self.transport.send(dst, cri, &header, &[]) {
                Ok(()) | Err(SendError::PeerLost) | Err(SendError::Invalid(_)) => return,
                Err(SendError::WouldBlock) => {}
            }
        }
        self.defer(QueuedFrame { dst, dst_cri: cri, header, ptr: std::ptr::NonNull::dangling().as_ptr(), len: 0, complete: None });
    }

    /// Sends deferred frames (in order per destination; a destination whose inbox is still
    /// full keeps the rest of its frames), handles newly lost peers and reports the
    /// rendezvous reads that are over — the rare events of a progress pass, reached from
    /// every progress mode, wait, future and pool worker. Returns how many frames went out,
    /// requests failed or reads were reported.
    pub(crate) fn flush_deferred(&self) -> usize {
        let lost = self.handle_lost() + self.poll_rendezvous_reads();
        // Acquire: pairs with the store in `defer`; the common case is this one load.
        if !self.outbox.pending.load(Ordering::Acquire) {
            return lost;
        }
        let Some(mut q) = self.outbox.queues.try_lock() else {
            // Another thread is flushing.
            return lost;
        };
        // Requests completed once the lock is released (a completion may wake a waiter or
        // run a sync object's delivery; STYLE habit 6).
        let mut finished: Vec<(Arc<Operation>, Outcome)> = Vec::new();
        let mut done = 0;
        let DeferredQueues { by_dst, active } = &mut *q;
        // Each destination with frames waiting, its frames in posting order until one is
        // refused (the rest keep their order behind it): O(destinations + frames sent).
        active.retain(|&dst| {
            let Some(queue) = by_dst.get_mut(dst as usize) else { return false };
            while let Some(d) = queue.front() {
                // SAFETY: `post_frame`'s contract: the bytes stay valid until `complete` is
                // completed (after the send) or, for payload-less frames, `len` is 0.
                let data = unsafe { std::slice::from_raw_parts(d.ptr, d.len) };
                let res = self.transport.send(d.dst, d.dst_cri, &d.header, data);
                if let Err(SendError::WouldBlock) = res {
                    return true;
                }
                let d = queue.pop_front().expect("front exists");
                if let Some(n) = self.outbox.per_dst.get(dst as usize) {
                    n.fetch_sub(1, Ordering::Relaxed);
                }
                if res.is_ok() && matches!(d.header.kind, FrameKind::Eager | FrameKind::Rts) {
                    self.counters.deferred_sent.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(req) = d.complete {
                    finished.push((
                        req,
                        match res {
                            Ok(()) => Ok(Status { source: d.dst, tag: d.header.tag, bytes: d.len }),
                            Err(SendError::Invalid(what)) => Err(Error::InvalidArgument(what)),
                            Err(_) => Err(Error::PeerLost { rank: d.dst }),
                        },
                    ));
                }
                done += 1;
            }
            false
        });
        self.outbox.pending.store(!active.is_empty(), Ordering::Release);
        drop(q);
        for (req, outcome) in finished {
            req.cell.complete(outcome);
        }
        if done > 0 {
            tracing::trace!(rank = self.transport.rank(), frames = done, "deferred frames sent");
        }
        done + lost
    }
}
