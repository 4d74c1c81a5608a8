//! Matching (path step 5): sequence numbers per (source, communicator), an out-of-sequence
//! queue for early arrivals, the unexpected queue, and FIFO pairing of posted receives with
//! arrived frames.
//!
//! MPI's rule: messages from one source on one communicator match in the order they were
//! sent. Senders number them; a frame that arrives ahead of its turn (two sender threads
//! racing, or frames spread over several CRIs) waits in the out-of-sequence queue until the
//! gap closes (seed 003 §5.4.4 counts these). A communicator created with overtaking allowed
//! skips the check. The engine itself is single-threaded: the caller holds the communicator's
//! matching lock (`PerComm`) or the global one (`Global`).

use std::collections::VecDeque;
use std::sync::Arc;

use weft_transport::{Frame, FrameKind};

use crate::request::ReqInner;

/// Wildcard-able source of a receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// Any rank (`MPI_ANY_SOURCE`).
    Any,
    /// This rank.
    Rank(u32),
}

/// Wildcard-able tag of a receive.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tag {
    /// Any tag (`MPI_ANY_TAG`).
    Any,
    /// This tag.
    Is(i32),
}

impl From<u32> for Source {
    fn from(r: u32) -> Self {
        Source::Rank(r)
    }
}

impl From<i32> for Tag {
    fn from(t: i32) -> Self {
        Tag::Is(t)
    }
}

#[inline]
fn fits(source: Source, tag: Tag, from: u32, t: i32) -> bool {
    (match source {
        Source::Any => true,
        Source::Rank(r) => r == from,
    }) && (match tag {
        Tag::Any => true,
        Tag::Is(x) => x == t,
    })
}

/// A posted receive waiting for its message.
pub(crate) struct Posted {
    source: Source,
    tag: Tag,
    pub(crate) req: Arc<ReqInner>,
}

/// A frame paired with the receive it completes; finished outside the lock.
pub(crate) struct Matched {
    pub(crate) req: Arc<ReqInner>,
    pub(crate) frame: Frame,
}

/// Per-communicator counters, written under the matching lock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MatchCounters {
    pub(crate) unexpected: u64,
    pub(crate) out_of_sequence: u64,
    pub(crate) match_nanos: u64,
}

/// The queues of one communicator on one rank.
pub(crate) struct MatchState {
    /// Next sequence number expected from each source.
    expected: Vec<u32>,
    /// Posted receives in post order.
    posted: VecDeque<Posted>,
    /// In-sequence frames nobody has asked for yet, in arrival order.
    unexpected: VecDeque<Frame>,
    /// Frames that arrived before their turn.
    early: Vec<Frame>,
    /// Whether the sequence check is skipped (overtaking allowed).
    overtaking: bool,
    /// Counters.
    pub(crate) counters: MatchCounters,
}

impl MatchState {
    pub(crate) fn new(size: u32, overtaking: bool) -> Self {
        MatchState {
            expected: vec![0; size as usize],
            posted: VecDeque::new(),
            unexpected: VecDeque::new(),
            early: Vec::new(),
            overtaking,
            counters: MatchCounters::default(),
        }
    }

    /// A frame arrived: pair it (and any early frames it unblocks) with posted receives.
    /// Matches are appended to `out`; unmatched frames are queued.
    pub(crate) fn arrive(&mut self, frame: Frame, out: &mut Vec<Matched>) {
        if self.overtaking {
            self.pair(frame, out);
            return;
        }
        let src = frame.header.source as usize;
        let Some(exp) = self.expected.get_mut(src) else {
            // A source outside the communicator: the frame is malformed; drop it.
            return;
        };
        if frame.header.seq != *exp {
            self.counters.out_of_sequence += 1;
            self.early.push(frame);
            return;
        }
        *exp = exp.wrapping_add(1);
        self.pair(frame, out);
        // The gap may have closed for frames that came early from this source.
        while !self.early.is_empty() {
            let want = self.expected[src];
            let Some(i) = self.early.iter().position(|f| f.header.source as usize == src && f.header.seq == want) else {
                break;
            };
            let f = self.early.swap_remove(i);
            self.expected[src] = want.wrapping_add(1);
            self.pair(f, out);
        }
    }

    fn pair(&mut self, frame: Frame, out: &mut Vec<Matched>) {
        let (from, tag) = (frame.header.source, frame.header.tag);
        if let Some(i) = self.posted.iter().position(|p| fits(p.source, p.tag, from, tag)) {
            let p = self.posted.remove(i).expect("index in range");
            out.push(Matched { req: p.req, frame });
        } else {
            self.counters.unexpected += 1;
            self.unexpected.push_back(frame);
        }
    }

    /// A receive is posted: take the first fitting unexpected frame, or queue the receive.
    pub(crate) fn post(&mut self, source: Source, tag: Tag, req: &Arc<ReqInner>) -> Option<Frame> {
        if let Some(i) = self.unexpected.iter().position(|f| fits(source, tag, f.header.source, f.header.tag)) {
            return self.unexpected.remove(i);
        }
        self.posted.push_back(Posted { source, tag, req: req.clone() });
        None
    }

    /// Removes a posted receive that has not matched (cancel). Returns whether it was there.
    pub(crate) fn cancel(&mut self, req: &Arc<ReqInner>) -> bool {
        if let Some(i) = self.posted.iter().position(|p| Arc::ptr_eq(&p.req, req)) {
            self.posted.remove(i);
            true
        } else {
            false
        }
    }

    /// Removes the posted receives that can no longer match because their source is lost
    /// (`alive(r)` false), or — for `Source::Any` — because no peer is left (`any_alive`
    /// false). They are appended to `out` with their source, to be failed outside the lock.
    pub(crate) fn fail_lost(&mut self, alive: impl Fn(u32) -> bool, any_alive: bool, out: &mut Vec<(Arc<ReqInner>, Source)>) {
        let mut i = 0;
        while i < self.posted.len() {
            let dead = match self.posted[i].source {
                Source::Rank(r) => !alive(r),
                Source::Any => !any_alive,
            };
            if dead {
                let p = self.posted.remove(i).expect("index in range");
                out.push((p.req, p.source));
            } else {
                i += 1;
            }
        }
    }

    /// Probes for an unexpected frame without taking it: `(source, tag, bytes)`.
    pub(crate) fn probe(&self, source: Source, tag: Tag) -> Option<(u32, i32, usize)> {
        self.unexpected
            .iter()
            .find(|f| fits(source, tag, f.header.source, f.header.tag))
            .map(|f| (f.header.source, f.header.tag, message_len(f)))
    }

    /// Empties the queues (communicator freed / runtime shut down): the posted receives are
    /// returned so the caller can fail them; the frames are handed to `drop_frame`.
    pub(crate) fn drain(&mut self, mut drop_frame: impl FnMut(Frame)) -> Vec<Arc<ReqInner>> {
        for f in self.unexpected.drain(..).chain(self.early.drain(..)) {
            drop_frame(f);
        }
        self.posted.drain(..).map(|p| p.req).collect()
    }
}

/// Length of the message a frame carries or announces.
pub(crate) fn message_len(f: &Frame) -> usize {
    match f.header.kind {
        FrameKind::Rts => f.header.len as usize,
        _ => f.payload.as_slice().len(),
    }
}
