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

/// Per-communicator counters, written under the matching lock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MatchCounters {
    pub(crate) unexpected: u64,
    pub(crate) out_of_sequence: u64,
    pub(crate) match_nanos: u64,
}

/// The queues of one communicator on one rank.
pub(crate) struct MatchState {
    /// Next sequence number expected from each source, per ordering channel (grown when a
    /// channel is first seen).
    expected: Vec<Vec<u32>>,
    /// Fully specified posted receives, by (source, tag), each bin in post order.
    bins: Bins,
    /// Posted receives with `Source::Any` or `Tag::Any`, in post order.
    wild: VecDeque<Posted>,
    /// Next post number.
    post_seq: u64,
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
            expected: vec![Vec::new(); size as usize],
            bins: Bins::default(),
            wild: VecDeque::new(),
            post_seq: 0,
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
        let (src, chan) = (frame.header.source as usize, frame.header.chan as usize);
        let Some(chans) = self.expected.get_mut(src) else {
            // A source outside the communicator: the frame is malformed; drop it.
            return;
        };
        if chan >= chans.len() {
            chans.resize(chan + 1, 0);
        }
        let exp = &mut chans[chan];
        if frame.header.seq != *exp {
            self.counters.out_of_sequence += 1;
            self.early.push(frame);
            return;
        }
        *exp = exp.wrapping_add(1);
        self.pair(frame, out);
        // The gap may have closed for frames that came early on this channel.
        while !self.early.is_empty() {
            let want = self.expected[src][chan];
            let Some(i) = self.early.iter().position(|f| {
                f.header.source as usize == src && f.header.chan as usize == chan && f.header.seq == want
            }) else {
                break;
            };
            let f = self.early.swap_remove(i);
            self.expected[src][chan] = want.wrapping_add(1);
            self.pair(f, out);
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
        for f in self.unexpected.drain(..).chain(self.early.drain(..)) {
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
