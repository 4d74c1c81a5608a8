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
//!
//! # Posted receives: bins plus a wildcard list
//!
//! A single FIFO of posted receives makes every arrival scan past all receives posted for
//! other (source, tag) pairs: with T threads each pre-posting w receives on one communicator
//! (multirate without `-c`), that is O(T·w) per message. Instead, fully specified receives
//! live in a bin per (source, tag) and wildcard receives in one list, each receive numbered
//! in post order. An arrival looks at the front of its bin (the earliest specific receive
//! that fits) and at the first fitting wildcard receive, and takes whichever was posted
//! first: exactly MPI's "earliest posted receive that matches", in O(1 + wildcards). Bins
//! keep their capacity, so steady-state matching allocates nothing; empty bins are pruned
//! only when many distinct (source, tag) pairs have been used.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
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
    /// Post order within the communicator (bins and wildcard list interleave by it).
    seq: u64,
    pub(crate) req: Arc<ReqInner>,
}

/// The bin key of a fully specified (source, tag).
#[inline]
fn bin_key(source: u32, tag: i32) -> u64 {
    (u64::from(source) << 32) | u64::from(tag as u32)
}

/// Hasher for bin keys: one multiply-xorshift round (keys are small integers, not
/// attacker-chosen strings, so SipHash's cost buys nothing here).
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u64(&mut self, x: u64) {
        let h = (self.0 ^ x ^ (x >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 32);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// Bins of fully specified posted receives.
type Bins = HashMap<u64, VecDeque<Posted>, BuildHasherDefault<KeyHasher>>;

/// Bins beyond which empty ones are dropped (bounded memory with many distinct tags).
const MAX_IDLE_BINS: usize = 1024;

/// A frame paired with the receive it completes; finished outside the lock.
pub(crate) struct Matched {
    pub(crate) req: Arc<ReqInner>,
    pub(crate) frame: Frame,
}

/// Frames a reorder window holds ahead of the expected one; a frame further ahead (a sender
/// thread descheduled between taking its sequence number and sending) waits in a list.
const REORDER_WINDOW: usize = 4096;

/// The order of one (source, channel): the next sequence number expected, and the frames
/// that arrived ahead of it, each in the slot of its distance from `expected` (slot 0, the
/// expected frame itself, is always empty). O(1) to hold a frame and to release the next;
/// the window keeps its capacity, so a steady reordering allocates nothing.
#[derive(Default)]
struct Reorder {
    expected: u32,
    window: VecDeque<Option<Frame>>,
}

impl Reorder {
    /// Holds `frame`, which is `ahead` (> 0) sequence numbers after `expected`.
    fn hold(&mut self, ahead: usize, frame: Frame) {
        if self.window.len() <= ahead {
            self.window.resize_with(ahead + 1, || None);
        }
        self.window[ahead] = Some(frame);
    }

    /// After `expected` advanced by one: the frame now expected, if it already came.
    fn next(&mut self) -> Option<Frame> {
        // Drop slot 0 (the frame just handled); the old slot 1 becomes slot 0.
        self.window.pop_front();
        match self.window.front_mut() {
            Some(slot) => slot.take(),
            None => None,
        }
    }
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
    /// Per source, per ordering channel (grown when a channel is first seen): the next
    /// sequence number expected and the frames that came ahead of it.
    order: Vec<Vec<Reorder>>,
    /// Fully specified posted receives, by (source, tag), each bin in post order.
    bins: Bins,
    /// Posted receives with `Source::Any` or `Tag::Any`, in post order.
    wild: VecDeque<Posted>,
    /// Next post number.
    post_seq: u64,
    /// In-sequence frames nobody has asked for yet, in arrival order.
    unexpected: VecDeque<Frame>,
    /// Frames that arrived before their turn but too far ahead for a reorder window.
    far: Vec<Frame>,
    /// Whether the sequence check is skipped (overtaking allowed).
    overtaking: bool,
    /// Counters.
    pub(crate) counters: MatchCounters,
}

impl MatchState {
    pub(crate) fn new(size: u32, overtaking: bool) -> Self {
        MatchState {
            order: (0..size).map(|_| Vec::new()).collect(),
            bins: Bins::default(),
            wild: VecDeque::new(),
            post_seq: 0,
            unexpected: VecDeque::new(),
            far: Vec::new(),
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
        let (src, chan) = (frame.header.source as usize, frame.header.chan as usize);
        let Some(chans) = self.order.get_mut(src) else {
            // A source outside the communicator: the frame is malformed; drop it.
            return;
        };
        if chan >= chans.len() {
            chans.resize_with(chan + 1, Reorder::default);
        }
        let ahead = frame.header.seq.wrapping_sub(chans[chan].expected) as usize;
        if ahead != 0 {
            self.counters.out_of_sequence += 1;
            if ahead < REORDER_WINDOW {
                chans[chan].hold(ahead, frame);
            } else {
                self.far.push(frame);
            }
            return;
        }
        // `expected` counts this frame before it is paired; the window still has its (empty)
        // slot 0 until `Reorder::next` drops it.
        let r = &mut chans[chan];
        r.expected = r.expected.wrapping_add(1);
        let held = !r.window.is_empty() || !self.far.is_empty();
        self.pair(frame, out);
        if !held {
            // Nothing came early (the common case): no window to walk, no far list to search.
            return;
        }
        // The gap may have closed for frames that came early on this channel: they wait in
        // sequence order in the window (O(1) each), or, rarely, in the far list.
        loop {
            let r = &mut self.order[src][chan];
            let next = match r.next() {
                Some(f) => f,
                None if self.far.is_empty() => return,
                None => {
                    let want = r.expected;
                    let at = |f: &Frame| f.header.source as usize == src && f.header.chan as usize == chan && f.header.seq == want;
                    match self.far.iter().position(at) {
                        Some(i) => self.far.swap_remove(i),
                        None => return,
                    }
                }
            };
            let r = &mut self.order[src][chan];
            r.expected = r.expected.wrapping_add(1);
            self.pair(next, out);
        }
    }

    fn pair(&mut self, frame: Frame, out: &mut Vec<Matched>) {
        let (from, tag) = (frame.header.source, frame.header.tag);
        let bin = self.bins.get_mut(&bin_key(from, tag)).filter(|b| !b.is_empty());
        let wild = if self.wild.is_empty() { None } else { self.wild.iter().position(|p| fits(p.source, p.tag, from, tag)) };
        // The earliest posted of the two candidates.
        let p = match (bin, wild) {
            (Some(b), Some(i)) if self.wild[i].seq < b[0].seq => self.wild.remove(i),
            (Some(b), _) => b.pop_front(),
            (None, Some(i)) => self.wild.remove(i),
            (None, None) => None,
        };
        match p {
            Some(p) => out.push(Matched { req: p.req, frame }),
            None => {
                self.counters.unexpected += 1;
                self.unexpected.push_back(frame);
            }
        }
    }

    /// A receive is posted: take the first fitting unexpected frame, or queue the receive.
    pub(crate) fn post(&mut self, source: Source, tag: Tag, req: &Arc<ReqInner>) -> Option<Frame> {
        if !self.unexpected.is_empty() {
            if let Some(i) = self.unexpected.iter().position(|f| fits(source, tag, f.header.source, f.header.tag)) {
                return self.unexpected.remove(i);
            }
        }
        let seq = self.post_seq;
        self.post_seq += 1;
        let posted = Posted { source, tag, seq, req: req.clone() };
        match (source, tag) {
            (Source::Rank(r), Tag::Is(t)) => {
                if self.bins.len() >= MAX_IDLE_BINS && !self.bins.contains_key(&bin_key(r, t)) {
                    self.bins.retain(|_, b| !b.is_empty());
                }
                self.bins.entry(bin_key(r, t)).or_default().push_back(posted);
            }
            _ => self.wild.push_back(posted),
        }
        None
    }

    /// Removes a posted receive that has not matched (cancel). Returns whether it was there.
    pub(crate) fn cancel(&mut self, req: &Arc<ReqInner>) -> bool {
        let list = match self.wild.iter().position(|p| Arc::ptr_eq(&p.req, req)) {
            Some(i) => return self.wild.remove(i).is_some(),
            None => self.bins.values_mut().find(|b| b.iter().any(|p| Arc::ptr_eq(&p.req, req))),
        };
        match list {
            Some(b) => {
                b.retain(|p| !Arc::ptr_eq(&p.req, req));
                true
            }
            None => false,
        }
    }

    /// Removes the posted receives that can no longer match because their source is lost
    /// (`alive(r)` false), or — for `Source::Any` — because no peer is left (`any_alive`
    /// false). They are appended to `out` with their source, to be failed outside the lock.
    pub(crate) fn fail_lost(&mut self, alive: impl Fn(u32) -> bool, any_alive: bool, out: &mut Vec<(Arc<ReqInner>, Source)>) {
        let dead = |p: &Posted| match p.source {
            Source::Rank(r) => !alive(r),
            Source::Any => !any_alive,
        };
        let mut lost: Vec<Posted> = Vec::new();
        for list in std::iter::once(&mut self.wild).chain(self.bins.values_mut()) {
            if list.iter().any(&dead) {
                let (gone, keep): (VecDeque<Posted>, VecDeque<Posted>) = list.drain(..).partition(|p| dead(p));
                *list = keep;
                lost.extend(gone);
            }
        }
        lost.sort_by_key(|p| p.seq);
        out.extend(lost.into_iter().map(|p| (p.req, p.source)));
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
        let held = self.order.iter_mut().flatten().flat_map(|r| r.window.drain(..).flatten());
        for f in self.unexpected.drain(..).chain(self.far.drain(..)).chain(held) {
            drop_frame(f);
        }
        let mut posted: Vec<Posted> = self.wild.drain(..).collect();
        for b in self.bins.values_mut() {
            posted.extend(b.drain(..));
        }
        posted.sort_by_key(|p| p.seq);
        posted.into_iter().map(|p| p.req).collect()
    }
}

/// Length of the message a frame carries or announces.
pub(crate) fn message_len(f: &Frame) -> usize {
    match f.header.kind {
        FrameKind::Rts => f.header.len as usize,
        _ => f.payload.as_slice().len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_transport::{Header, Payload};

    fn frame(source: u32, seq: u32) -> Frame {
        let header =
            Header { kind: FrameKind::Eager, src_cri: 0, context: 0, source, tag: 7, seq, chan: 0, len: 0, cookie: 0, key: 0, addr: 0 };
        Frame { header, payload: Payload::Empty }
    }

    fn post_n(m: &mut MatchState, n: usize) -> Vec<Arc<ReqInner>> {
        (0..n)
            .map(|_| {
                let r = Arc::new(ReqInner::default());
                assert!(m.post(Source::Rank(1), Tag::Is(7), &r).is_none());
                r
            })
            .collect()
    }

    /// Frames that arrive in any order are paired with the receives in sequence order,
    /// whether they wait in the reorder window or (far ahead) in the far list.
    #[test]
    fn out_of_sequence_frames_match_in_sequence_order() {
        let far = REORDER_WINDOW as u32 + 5;
        let n = far as usize + 1;
        let mut m = MatchState::new(2, false);
        let reqs = post_n(&mut m, n);
        let mut out = Vec::new();
        // The farthest first, then everything else backwards, then the first.
        m.arrive(frame(1, far), &mut out);
        for seq in (1..far).rev() {
            m.arrive(frame(1, seq), &mut out);
        }
        assert!(out.is_empty(), "nothing may match before sequence 0");
        assert_eq!(m.counters.out_of_sequence, u64::from(far));
        m.arrive(frame(1, 0), &mut out);
        assert_eq!(out.len(), n);
        for (i, (got, req)) in out.iter().zip(&reqs).enumerate() {
            assert_eq!(got.frame.header.seq, i as u32);
            assert!(Arc::ptr_eq(&got.req, req), "sequence {i} paired with the receive posted {i}th");
        }
        assert!(m.far.is_empty());
        // The window keeps working after draining: a gap of one, then its filler.
        let mut out = Vec::new();
        let _more = post_n(&mut m, 2);
        m.arrive(frame(1, far + 2), &mut out);
        assert!(out.is_empty());
        m.arrive(frame(1, far + 1), &mut out);
        assert_eq!(out.iter().map(|x| x.frame.header.seq).collect::<Vec<_>>(), vec![far + 1, far + 2]);
    }

    /// The in-sequence fast path (nothing held) and the walk (something held) agree: frames
    /// of a second source wait in the far list and the window of the first source empties
    /// and refills, and every frame still pairs with the receive posted for its turn.
    #[test]
    fn in_sequence_frames_around_held_ones() {
        let mut m = MatchState::new(3, false);
        let reqs = post_n(&mut m, 8);
        let mut out = Vec::new();
        // Source 2, far ahead: the far list is not empty from here on.
        m.arrive(frame(2, REORDER_WINDOW as u32 + 1), &mut out);
        m.arrive(frame(1, 0), &mut out);
        m.arrive(frame(1, 3), &mut out); // held in the window
        m.arrive(frame(1, 1), &mut out);
        m.arrive(frame(1, 2), &mut out); // releases 3
        m.arrive(frame(1, 4), &mut out); // window empty again: the fast path's test
        m.arrive(frame(1, 6), &mut out);
        m.arrive(frame(1, 5), &mut out);
        m.arrive(frame(1, 7), &mut out);
        let seqs: Vec<u32> = out.iter().map(|x| x.frame.header.seq).collect();
        assert_eq!(seqs, (0..8).collect::<Vec<_>>());
        for (got, req) in out.iter().zip(&reqs) {
            assert!(Arc::ptr_eq(&got.req, req));
        }
        assert_eq!(m.far.len(), 1, "source 2's frame still waits for its turn");
        assert_eq!(m.order[1][0].expected, 8);
    }

    /// Frames held for reordering are handed back by `drain` (freed communicator).
    #[test]
    fn drain_returns_held_frames() {
        let mut m = MatchState::new(2, false);
        let mut out = Vec::new();
        m.arrive(frame(1, 3), &mut out);
        m.arrive(frame(1, REORDER_WINDOW as u32 + 9), &mut out);
        m.arrive(frame(0, 0), &mut out); // in sequence, nobody posted: unexpected
        let mut dropped = Vec::new();
        assert!(m.drain(|f| dropped.push(f.header.seq)).is_empty());
        dropped.sort_unstable();
        assert_eq!(dropped, vec![0, 3, REORDER_WINDOW as u32 + 9]);
    }
}
