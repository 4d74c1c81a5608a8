//! Received frames into completed operations (path steps 4-5): a CRI's batch of frames is
//! matched per communicator and tag partition under one acquisition of its matching lock,
//! and the receives it pairs are completed outside every lock.
//!
//! * Eager (message <= eager threshold): the payload travels in the frame and is copied
//!   into the receive buffer.
//! * Rendezvous: an `Rts` carries the length, the sender's remote key and a cookie naming
//!   its send; the matched receive starts a read of the data straight into its buffer
//!   (`reads.rs`) and answers `Fin` when it is over, which completes the send
//!   (`peers.rs` keeps the sends waiting for their `Fin`). Memory stays bounded for any
//!   message size.

use weft_sync::{Error, Status};
use weft_transport::{Frame, FrameKind, Header, Payload};

use super::{CriLocal, Engine, Layout};
use crate::matching::{message_len, Due, Matches, Source, Tag};
use crate::operation::Held;

/// Frames taken from one inbox per progress call (bounded work per call).
const POLL_BATCH: usize = 64;

/// Frames of a batch taken and handled first: the batch ends after them if a continuation's
/// callback is waiting for the pass to end (see `progress_cri`).
const CHUNK: usize = 16;

impl Engine {
    /// Drains up to a batch of frames from CRI `k`; the caller holds its lock (`local`).
    /// Returns the number of frames handled and whether that was productive (for the lock's
    /// counters, [Amer 2019, §3.2]).
    ///
    /// The batch's first [`CHUNK`] frames are taken and handled first, and the batch ends
    /// there if that left a callback deferred (`deferred.rs`): a callback runs once its pass
    /// ends, after the locks, so a long batch would hold it back for every frame behind its
    /// own (up to 63), where a thread taking completions from a sync object has it the
    /// moment it is delivered. The frames left stay in the inbox for the next pass (this
    /// thread's, or another's that takes the CRI meanwhile). Otherwise the rest of the
    /// batch is taken at once: two polls of the inbox per full batch, not one per chunk (a
    /// message's instructions as before, `benches/stages.sh`).
    pub(crate) fn progress_cri(&self, k: usize, local: &mut CriLocal) -> (usize, bool) {
        let CriLocal { counters, matches } = local;
        let mut n = self.transport.poll_into(k, CHUNK, &mut matches.frames);
        self.handle_frames(k, matches);
        if n == CHUNK && !crate::deferred::waiting() {
            n += self.transport.poll_into(k, POLL_BATCH - CHUNK, &mut matches.frames);
            self.handle_frames(k, matches);
        }
        counters.received += n as u64;
        (n, n > 0)
    }

    /// Path step 4-5 for one received frame.
    pub(crate) fn handle_frame(&self, k: usize, frame: Frame) {
        let mut matches = Matches { frames: vec![frame], pairs: Vec::new() };
        self.handle_frames(k, &mut matches);
    }

    /// Path steps 4-5 for a batch of received frames (`matches.frames`, in arrival order;
    /// both lists are left empty). Consecutive frames of one matching state (communicator and
    /// tag partition) are matched under one acquisition of its matching lock; receives are
    /// completed after the lock is released. Each frame is read where it lies in the batch:
    /// one that pairs is not moved until its receive takes the payload. Out of line: one copy
    /// for its callers (and the stage `benches/stages.sh` counts by it).
    #[inline(never)]
    fn handle_frames(&self, k: usize, matches: &mut Matches) {
        let n = matches.frames.len();
        let mut i = 0;
        while i < n {
            let first = &matches.frames[i].header;
            if first.kind == FrameKind::Fin {
                let fin = matches.take(i);
                i += 1;
                self.handle_fin(fin);
                continue;
            }
            if first.kind == FrameKind::WindowEnd {
                // A peer ended its part of a window (`rma/ends.rs`).
                let h = matches.take(i).header;
                self.window_ends.ended(h.source, h.context, h.cookie);
                i += 1;
                continue;
            }
            let ctx = first.context;
            let Some(comm) = self.context(ctx) else {
                let frame = matches.take(i);
                i += 1;
                self.unknown_context(k, frame);
                continue;
            };
            let (source, tag) = (first.source, first.tag);
            let at = comm.place(Source::Rank(source), Tag::Is(tag));
            let (layout, part) = (at.layout, at.part);
            // This frame and those right behind it that go to the same matching state, under
            // this layout and every later one: of the same source and tag (a stream, the
            // common case: two compares), or, unless states are laid out by source (where two
            // sources' partitions that share a state now part later), of the same state.
            let run = 1 + matches.frames[i + 1..n]
                .iter()
                .take_while(|f| {
                    let h = &f.header;
                    h.kind < FrameKind::Fin
                        && h.context == ctx
                        && ((h.source == source && h.tag == tag)
                            || (layout != Layout::BY_SOURCE && comm.part_in(layout, Source::Rank(h.source), Tag::Is(h.tag)) == part))
                })
                .count();
            let (from, to) = (i, i + run);
            i = to;
            let timing = self.config.match_timing.then(std::time::Instant::now);
            let due = self.with_matching_of::<_, true>(comm, at, Source::Rank(source), Tag::Is(tag), |m| {
                // Under the matching lock: `free` sets the flag before it drains the queues,
                // so a frame is either refused here or drained (released) by `free`.
                if comm.is_freed() {
                    return None;
                }
                for at in from..to {
                    m.arrive_at(at, matches);
                }
                if let Some(t0) = timing {
                    m.counters.match_nanos += t0.elapsed().as_nanos() as u64;
                }
                Some(m.take_due())
            });
            let Some(due) = due else {
                // Refused (freed communicator): given back outside the lock.
                for at in from..to {
                    let frame = matches.take(at);
                    self.release_frame(frame);
                }
                continue;
            };
            let mut switched = None;
            match due {
                Due::None => {}
                Due::Trim => self.trim_partitions(comm),
                Due::Switch => switched = Some(self.switch_to_one_order(comm)),
                Due::Release => self.release_dropped(comm, part),
            }
            let Matches { frames, pairs } = matches;
            // One match (a frame for a posted receive) is the common case: taken without
            // a `Drain`.
            if pairs.len() == 1 {
                if let Some(m) = pairs.pop() {
                    self.finish_match_in(k, m.req, &mut frames[m.at]);
                }
            } else {
                for m in pairs.drain(..) {
                    self.complete_match(k, m.req, &mut frames[m.at]);
                }
            }
            if let Some(more) = switched {
                self.finish_matches(more);
            }
        }
        matches.clear();
    }

    /// A frame for a context not installed on this rank: stale (its communicator was freed
    /// here: released) or early (a peer already uses a communicator this rank has not
    /// created yet: kept until `install` replays it).
    #[cold]
    fn unknown_context(&self, k: usize, frame: Frame) {
        let ctx = frame.header.context;
        if self.is_stale(ctx) {
            self.release_frame(frame);
            return;
        }
        let mut early = self.contexts.early.lock();
        // Again under the lock: `install` publishes the state before it takes this lock to
        // replay, so either it is visible now or the replay will find the frame.
        if self.context(ctx).is_some() || self.is_stale(ctx) {
            drop(early);
            self.handle_frame(k, frame);
            return;
        }
        early.push(frame);
    }

    /// A `Fin`: the receiver has read a rendezvous send's data; complete the send.
    pub(crate) fn handle_fin(&self, frame: Frame) {
        let Some(req) = self.untrack_rendezvous(frame.header.cookie, Some(frame.header.source)) else {
            // Already failed with `PeerLost` (the peer answered, then died), or not a `Fin`
            // for a send of ours.
            return;
        };
        tracing::trace!(
            rank = self.transport.rank(),
            peer = frame.header.source,
            cookie = frame.header.cookie,
            "rendezvous send finished (Fin)"
        );
        self.transport.deregister(req.key.load(crate::loom::sync::atomic::Ordering::Relaxed));
        req.cell.complete(Ok(Status { source: frame.header.source, tag: frame.header.tag, bytes: frame.header.len as usize }));
        req.orphan.lock().take();
    }

    /// Gives a frame's resources back without delivering it (freed communicator, or a
    /// failed collective's tag).
    pub(crate) fn release_frame(&self, frame: Frame) {
        if frame.header.kind == FrameKind::Rts {
            // The sender waits for a `Fin`; tell it the data was consumed (MPI would hang).
            let fin = Header { kind: FrameKind::Fin, len: 0, ..frame.header };
            self.send_control(frame.header.source, frame.header.src_cri as usize, fin);
        }
        self.transport.recycle(frame.header.source, frame.payload);
    }

    /// Completes receive `req` with `frame` (outside every matching lock).
    pub(crate) fn finish_match(&self, k: usize, req: Held, mut frame: Frame) {
        self.complete_match(k, req, &mut frame);
    }

    /// Completes receive `req` with `frame`, read where it lies (its payload is taken).
    pub(crate) fn finish_match_in(&self, k: usize, req: Held, frame: &mut Frame) {
        self.complete_match(k, req, frame);
    }

    /// [`finish_match_in`](Self::finish_match_in), inlined into the progress pass's loop over
    /// its matches (a call per message less). The common receive, an eager message that fits,
    /// is all it holds: a failed one goes to [`fail_match`](Self::fail_match), out of line,
    /// so that the status of a success is written straight into the cell
    /// (`CompletionCell::complete_ok`), not made on the stack as one `Outcome` of several
    /// paths and copied from there (a load of the stores just made, which waits for them).
    #[inline(always)]
    fn complete_match(&self, _k: usize, req: Held, frame: &mut Frame) {
        // The fields read on every path, not the whole header (a copy per message less).
        let (rts, source, tag) = (frame.header.kind == FrameKind::Rts, frame.header.source, frame.header.tag);
        let len = message_len(frame);
        if len > req.cap {
            let buffer_len = req.cap;
            return self.fail_match(req, frame, Error::Truncated { message_len: len, buffer_len });
        }
        if req.elem > 1 && len % req.elem != 0 {
            let elem_size = req.elem;
            return self.fail_match(req, frame, Error::Misaligned { elem_size, message_len: len });
        }
        if rts {
            // Completed when the read is over, by a later pass (module docs); the read keeps
            // the operation by a reference of its own.
            self.start_rendezvous_read(req.counted(), frame.header, len);
            return;
        }
        if len > 0 {
            // SAFETY: `ptr..ptr+cap` is the receive area owned by the request (or its orphan
            // slot) until the cell completes, `len <= cap`, and the payload is a distinct
            // allocation.
            unsafe { std::ptr::copy_nonoverlapping(frame.payload.as_slice().as_ptr(), req.ptr, len) };
        }
        self.transport.recycle(source, std::mem::replace(&mut frame.payload, Payload::Empty));
        // The holder's last use, unless the request left it its reference (`Held`).
        req.complete_ok(Status { source, tag, bytes: len });
    }

    /// Completes receive `req` with `error`, consuming `frame`: a rendezvous sender is told
    /// its data was consumed (`Fin`), an eager payload goes back.
    #[cold]
    #[inline(never)]
    fn fail_match(&self, req: Held, frame: &mut Frame, error: Error) {
        let source = frame.header.source;
        if frame.header.kind == FrameKind::Rts {
            let fin = Header { kind: FrameKind::Fin, len: message_len(frame) as u64, ..frame.header };
            self.send_control(source, frame.header.src_cri as usize, fin);
        } else {
            self.transport.recycle(source, std::mem::replace(&mut frame.payload, Payload::Empty));
        }
        req.complete(Err(error));
    }
}
