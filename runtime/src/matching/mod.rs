//! Matching (path step 5): sequence numbers per (source, communicator), an out-of-sequence
//! queue for early arrivals, the unexpected queue, and FIFO pairing of posted receives with
//! arrived frames.
//!
//! MPI's rule: messages from one source on one communicator match in the order they were
//! sent. Senders number them; a frame that arrives ahead of its turn (two sender threads
//! racing, or frames spread over several CRIs) waits in the out-of-sequence queue until the
//! gap closes ([Patinyasakdikul 2019, §5.4.4] counts these). A communicator created with overtaking allowed
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
//!
//! # Partitioned matching until the first `Tag::Any`
//!
//! What forces one order over all of a source's messages is `Tag::Any` alone: a receive for
//! one tag only needs the send order among messages of that tag. So a communicator without
//! assertions is matched per *tag partition* ([`Order::Partition`]; each partition a
//! `MatchState` under its own lock, with its own sequence per source), as one that asserts
//! `no_any_tag` is — until the first `Tag::Any` receive or probe on it at this rank, which
//! merges the partitions into one state ordered by the sender's second sequence number, the
//! `gseq` it takes per (communicator, destination) over every tag ([`Order::Gseq`];
//! [`MatchState::merge`]; docs/design-partitioned-matching.md, option (b)).
//!
//! The merge must know which of a source's `gseq`s are still in flight: partition A may have
//! run ahead while a frame of partition B is on its way. Each partition records the `gseq`s
//! it processed (paired or queued as unexpected) in a bitmap window per source, written under
//! its own lock only; the windows of all partitions advance together, now and then, under all
//! the partition locks ([`MatchState::trim`]). At the merge the union of the windows gives,
//! per source, the frontier (the lowest `gseq` not processed) and the numbers above it already
//! processed, which the merged order then skips. Unexpected frames above the frontier are
//! taken back into the order (as if not arrived yet): a `Tag::Any` receive must not take one
//! before the earlier frame still in flight. Frames paired before the merge stay paired: they
//! met receives posted before the first `Tag::Any` one, each for their own tag, in that tag's
//! send order.

use crate::loom::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use weft_transport::{Frame, FrameKind, Payload};

use crate::operation::{Held, Operation};

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
    /// On the request's reference (`Held`).
    pub(crate) req: Held,
}

/// `bin.push_back(posted)` where `bin` is full, out of line (posting's rare path).
#[cold]
#[inline(never)]
fn push_growing(bin: &mut VecDeque<Posted>, posted: Posted) {
    bin.push_back(posted);
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

/// Bins of fully specified posted receives, by (source, tag): the queues in a vector, and
/// the bin used last remembered. A receive is mostly paired with a frame of the (source, tag)
/// of the receive posted before it (a window of receives for one peer and tag, a stream of
/// its messages): one compare then finds the bin, on posting and on pairing. A few bins are
/// found by comparing their keys, and a new key takes over an empty bin: a collective's
/// receives, each under a new tag (its sequence number), use one bin over and over, with no
/// hash to compute and no entry to add. Beyond [`SCAN_BINS`] bins a map of the keys finds
/// them.
#[derive(Default)]
struct Bins {
    /// Each bin's key and its receives in post order.
    list: Vec<(u64, VecDeque<Posted>)>,
    /// Keys to their bin's index in `list`, while `list` holds more than [`SCAN_BINS`] bins
    /// (empty otherwise).
    index: HashMap<u64, usize, BuildHasherDefault<KeyHasher>>,
    /// Index in `list` of the bin used last (any value while `list` is empty).
    last: usize,
    /// Queues of dropped empty bins, kept for new keys: receives under ever new tags then
    /// allocate no queue each.
    spare: Vec<VecDeque<Posted>>,
}

/// Bins found by comparing their keys, without the map.
const SCAN_BINS: usize = 8;

impl Bins {
    /// The index of `key`'s bin, if there is one.
    #[inline]
    fn find(&mut self, key: u64) -> Option<usize> {
        if self.list.get(self.last).is_some_and(|(k, _)| *k == key) {
            return Some(self.last);
        }
        let i = if self.list.len() <= SCAN_BINS { self.list.iter().position(|(k, _)| *k == key)? } else { *self.index.get(&key)? };
        self.last = i;
        Some(i)
    }

    /// `key`'s bin if it is the bin used last (one compare, no search).
    #[inline(always)]
    fn last_mut(&mut self, key: u64) -> Option<&mut VecDeque<Posted>> {
        match self.list.get_mut(self.last) {
            Some((k, b)) if *k == key => Some(b),
            _ => None,
        }
    }

    /// `key`'s bin, if there is one.
    #[inline]
    fn get_mut(&mut self, key: u64) -> Option<&mut VecDeque<Posted>> {
        let i = self.find(key)?;
        Some(&mut self.list[i].1)
    }

    /// `key`'s bin, made empty if there is none: among a few bins, an empty one takes the
    /// new key. Inlined into its one caller, posting (a call per receive less).
    #[inline(always)]
    fn entry(&mut self, key: u64) -> &mut VecDeque<Posted> {
        let i = match self.find(key) {
            Some(i) => i,
            None if self.list.len() > SCAN_BINS => self.insert(key),
            None => match self.list.iter().position(|(_, b)| b.is_empty()) {
                Some(i) => {
                    self.list[i].0 = key;
                    self.last = i;
                    i
                }
                None => self.insert(key),
            },
        };
        &mut self.list[i].1
    }

    /// Adds an empty bin for `key` (not there yet), first dropping the empty ones if there are
    /// many bins; its index.
    #[cold]
    fn insert(&mut self, key: u64) -> usize {
        if self.list.len() >= MAX_IDLE_BINS {
            let spare = &mut self.spare;
            self.list.retain_mut(|(_, b)| {
                if !b.is_empty() {
                    return true;
                }
                if spare.len() < MAX_IDLE_BINS {
                    spare.push(std::mem::take(b));
                }
                false
            });
            self.index.clear();
        }
        let i = self.list.len();
        let queue = self.spare.pop().unwrap_or_default();
        self.list.push((key, queue));
        if self.list.len() > SCAN_BINS {
            if self.index.is_empty() {
                // Past the bins found by comparing (or pruned): the map takes every key.
                self.index.extend(self.list.iter().enumerate().map(|(i, (k, _))| (*k, i)));
            } else {
                self.index.insert(key, i);
            }
        }
        self.last = i;
        i
    }

    /// Every bin.
    fn values_mut(&mut self) -> impl Iterator<Item = &mut VecDeque<Posted>> {
        self.list.iter_mut().map(|(_, b)| b)
    }

    /// Takes every bin out, with its key.
    fn drain(&mut self) -> impl Iterator<Item = (u64, VecDeque<Posted>)> + '_ {
        self.index.clear();
        self.list.drain(..)
    }

    /// Bins held (empty ones included).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.list.len()
    }
}

/// Bins beyond which empty ones are dropped (bounded memory with many distinct tags).
const MAX_IDLE_BINS: usize = 1024;

/// A frame paired with the receive it completes; finished outside the lock. The frame is
/// named by its place in [`Matches::frames`]: it stays where it was put until the receive
/// completes, instead of moving into the pair and out again (104 bytes a move).
pub(crate) struct Matched {
    pub(crate) req: Held,
    pub(crate) at: usize,
}

/// The frames of a matching step and the pairs it made. A frame that arrives is read where
/// it lies in `frames`; one that a matching state keeps (unexpected, early, parked) is taken
/// out, leaving an empty payload behind, and one that pairs stays until its receive is
/// completed, which takes its payload. Frames that come out of a state again (released
/// from the reorder window, or by a merge) are appended.
#[derive(Default)]
pub(crate) struct Matches {
    pub(crate) frames: Vec<Frame>,
    pub(crate) pairs: Vec<Matched>,
}

impl Matches {
    /// Takes frame `at` out (its header stays, its payload is left empty).
    #[inline]
    pub(crate) fn take(&mut self, at: usize) -> Frame {
        let f = &mut self.frames[at];
        Frame { header: f.header, payload: std::mem::replace(&mut f.payload, Payload::Empty) }
    }

    /// The frame of a pair.
    #[cfg(test)]
    pub(crate) fn frame(&self, m: &Matched) -> &Frame {
        &self.frames[m.at]
    }

    /// Empties both lists (capacity kept).
    pub(crate) fn clear(&mut self) {
        self.pairs.clear();
        self.frames.clear();
    }
}

/// Frames a reorder window holds ahead of the expected one; a frame further ahead (a sender
/// thread descheduled between taking its sequence number and sending) waits in a list.
const REORDER_WINDOW: usize = 4096;

/// How a matching state orders the frames of one source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    /// No order: overtaking allowed.
    Overtake,
    /// By `seq` within each ordering channel (`chan`).
    Chan,
    /// One tag partition of a communicator that matches per partition until its first
    /// `Tag::Any`: by `seq` within each channel, recording the `gseq` of every frame
    /// processed for the merge.
    Partition,
    /// By `gseq` per source: one order over every channel.
    Gseq,
}

/// Words (64 numbers each) a partition's processed-number window spans before it asks for
/// a trim ([`MatchState::trim`], all partition locks: once per ~8,000 frames of a source).
const TRIM_WORDS: usize = 128;

/// Words beyond which a window does not grow (1 Mi numbers, 128 KiB; 16 Ki numbers in unit
/// tests): a frame that far
/// ahead of one still in flight is parked and the communicator switches to one order,
/// whose reordering holds frames instead of bits (memory stays bounded by frames held).
const MAX_SEEN_WORDS: usize = if cfg!(test) { 1 << 8 } else { 1 << 14 };

/// A set of sequence numbers of one source as a bitmap window: bit `i` of word `w` is number
/// `base + 64 * w + i` (`base` a multiple of 64; every number below it is in the set).
///
/// The window is `buf[head..]`: dropping front words moves `head`, and the live words are
/// moved back to the start of `buf` only when the window must grow past `buf`'s capacity,
/// so recording a number is a bounds check and an `or` (no ring arithmetic). The buffer
/// grows (doubling) only to the longest window seen — a few words for a source that sends
/// little, about a trim period for a busy one — and a window that stays within it slides
/// through it without allocating.
#[derive(Default)]
struct Seen {
    base: u32,
    buf: Vec<u64>,
    head: usize,
    /// Window length (words) at which to ask for the next trim (0: [`TRIM_WORDS`]).
    trim_at: usize,
}

impl Seen {
    /// `n`'s offset above the base, or `None` below it (wrapping).
    #[inline]
    fn offset(&self, n: u32) -> Option<usize> {
        let off = n.wrapping_sub(self.base);
        (off < 1 << 31).then_some(off as usize)
    }

    /// The window's words, lowest first.
    #[inline]
    fn words(&self) -> &[u64] {
        &self.buf[self.head..]
    }

    /// The window's words, lowest first, for writing.
    #[inline]
    fn words_mut(&mut self) -> &mut [u64] {
        &mut self.buf[self.head..]
    }

    /// Words in the window.
    #[inline]
    fn len(&self) -> usize {
        self.buf.len() - self.head
    }

    /// Extends the window with zero words to `len` words.
    #[cold]
    fn grow(&mut self, len: usize) {
        if self.head + len > self.buf.capacity() && self.head > 0 {
            // Move the window to the start instead of growing the buffer.
            self.buf.drain(..self.head);
            self.head = 0;
        }
        self.buf.resize(self.head + len, 0);
    }

    /// Drops the `n` lowest words (every number in them settled); the base moves up.
    fn drop_front(&mut self, n: usize) {
        let n = n.min(self.len());
        self.head += n;
        self.base = self.base.wrapping_add((n * 64) as u32);
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        }
    }

    #[inline]
    fn contains(&self, n: u32) -> bool {
        match self.offset(n) {
            Some(off) => self.words().get(off / 64).is_some_and(|w| w & (1 << (off % 64)) != 0),
            None => true,
        }
    }

    /// Removes `n` (a number above the base).
    fn remove(&mut self, n: u32) {
        if let Some(off) = self.offset(n) {
            if let Some(w) = self.words_mut().get_mut(off / 64) {
                *w &= !(1 << (off % 64));
            }
        }
    }

    /// The lowest number not in the set.
    fn first_missing(&self) -> u32 {
        let full = self.words().iter().take_while(|&&w| w == !0).count();
        let bit = self.words().get(full).map_or(0, |w| w.trailing_ones());
        self.base.wrapping_add((full * 64) as u32 + bit)
    }

    /// Drops the front words that lie wholly below `n` (the numbers below `n` are settled),
    /// and the whole window once no number at or above `n` is left in it.
    fn forget_below(&mut self, n: u32) {
        if let Some(off) = self.offset(n) {
            self.drop_front(off / 64);
        }
        if self.len() == 1 && self.offset(n).is_some_and(|off| off < 64 && self.words()[0] >> off == 0) {
            self.buf.clear();
            self.head = 0;
        }
    }
}

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
    /// Per source, per ordering channel (both grown when first seen: a communicator's 16 tag
    /// partitions do not each hold a vector per rank up front): the next sequence number
    /// expected and the frames that came ahead of it.
    order: Vec<Vec<Reorder>>,
    /// Ranks in the communicator (a frame from a source at or above it is malformed).
    size: u32,
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
    /// How frames are ordered.
    mode: Order,
    /// Per source, the `gseq`s processed here ([`Order::Partition`]; grown on first use), or
    /// those processed before the merge above the frontier, skipped by the one order
    /// ([`Order::Gseq`] after [`merge`](Self::merge)).
    seen: Vec<Seen>,
    /// In-sequence frames not processed because their `gseq` lies beyond the window
    /// ([`MAX_SEEN_WORDS`]); taken by the merge that this asks for.
    parked: Vec<Frame>,
    /// Work this state asks of its caller once the lock is released.
    due: Due,
    /// Tags no receive will be posted for again (a failed collective's; none on most
    /// states): a frame under one that finds no receive is dropped, not queued.
    forgotten: Option<Box<Forgotten>>,
    /// Frames dropped so, for the caller to release outside the lock ([`Due::Release`]).
    dropped: Vec<Frame>,
    /// Counters.
    pub(crate) counters: MatchCounters,
}

/// Tags whose frames nobody will receive, each until a count of the caller's has moved on
/// by a span from its value when the tag was forgotten (a collective's tags come round
/// again after so many collectives: their frames must then be kept).
struct Forgotten {
    /// The count (the communicator's collectives called).
    count: Arc<AtomicU32>,
    /// How far the count moves before a tag is remembered again.
    span: u32,
    /// The tags and the count when each was forgotten, oldest first.
    tags: VecDeque<(i32, u32)>,
}

/// Tags a state forgets at most at once (the oldest is remembered again past it: its late
/// frames, if any, are then queued as before).
const MAX_FORGOTTEN: usize = 128;

/// Work a partition asks for that needs every partition lock ([`MatchState::take_due`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Due {
    /// Nothing.
    None,
    /// A processed-number window grew long: [`MatchState::trim`].
    Trim,
    /// A window would outgrow its bound: switch to one order ([`MatchState::merge`]).
    Switch,
    /// Frames under forgotten tags were dropped: release them
    /// ([`MatchState::take_dropped`]).
    Release,
}

impl MatchState {
    pub(crate) fn new(size: u32, mode: Order) -> Self {
        MatchState {
            order: Vec::new(),
            size,
            bins: Bins::default(),
            wild: VecDeque::new(),
            post_seq: 0,
            unexpected: VecDeque::new(),
            far: Vec::new(),
            mode,
            seen: Vec::new(),
            parked: Vec::new(),
            due: Due::None,
            forgotten: None,
            dropped: Vec::new(),
            counters: MatchCounters::default(),
        }
    }

    /// The work this state asks for (see [`Due`]), once; the caller does it after releasing
    /// this state's lock.
    #[inline]
    pub(crate) fn take_due(&mut self) -> Due {
        std::mem::replace(&mut self.due, Due::None)
    }

    /// The ordering channel and sequence number of a frame under this state's order.
    #[inline]
    fn key(&self, h: &weft_transport::Header) -> (usize, u32) {
        match self.mode {
            Order::Gseq => (0, h.gseq),
            _ => (h.chan as usize, h.seq),
        }
    }

    /// A frame arrived: pair it (and any early frames it unblocks) with posted receives.
    /// Matches are appended to `out`; unmatched frames are queued.
    pub(crate) fn arrive(&mut self, frame: Frame, out: &mut Matches) {
        out.frames.push(frame);
        self.arrive_at(out.frames.len() - 1, out);
    }

    /// [`arrive`](Self::arrive) for frame `at` of `out.frames`, read where it lies.
    ///
    /// The common arrival — the frame its (source, channel) expects, with nothing held for
    /// reordering — is tested first and changes nothing else before it goes to
    /// [`process`](Self::process); every other arrival goes to
    /// [`arrive_in_order`](Self::arrive_in_order), out of line. So this function needs
    /// only a few registers and no stack frame of its own: the large frame of the rare
    /// paths (reordering, new sources, overtaking) is not set up and torn down per message.
    /// Kept out of line itself: the pass's loop over a run of frames stays small.
    #[inline(never)]
    pub(crate) fn arrive_at(&mut self, at: usize, out: &mut Matches) {
        let header = &out.frames[at].header;
        if self.mode != Order::Overtake && self.far.is_empty() {
            let src = header.source as usize;
            let (chan, seq) = self.key(header);
            let skipping = self.skipping(src);
            if let Some(r) = self.order.get_mut(src).and_then(|chans| chans.get_mut(chan)) {
                if r.expected == seq && r.window.is_empty() && !skipping {
                    r.expected = r.expected.wrapping_add(1);
                    return self.process(at, out);
                }
            }
        }
        self.arrive_in_order(at, out);
    }

    /// [`arrive_at`](Self::arrive_at) for every other arrival: a new source or channel, a
    /// frame out of sequence, frames held that it may release, or no order (overtaking).
    #[inline(never)]
    fn arrive_in_order(&mut self, at: usize, out: &mut Matches) {
        let header = &out.frames[at].header;
        if self.mode == Order::Overtake {
            let (from, tag) = (header.source, header.tag);
            self.pair(at, from, tag, out);
            return;
        }
        let src = header.source as usize;
        let (chan, seq) = self.key(header);
        if src >= self.order.len() {
            if src >= self.size as usize {
                // A source outside the communicator: the frame is malformed; drop it.
                return;
            }
            self.order.resize_with(src + 1, Vec::new);
        }
        let chans = &mut self.order[src];
        if chan >= chans.len() {
            chans.resize_with(chan + 1, Reorder::default);
        }
        let ahead = seq.wrapping_sub(chans[chan].expected) as usize;
        if ahead != 0 {
            self.counters.out_of_sequence += 1;
            let frame = out.take(at);
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
        let held = !r.window.is_empty() || !self.far.is_empty() || self.skipping(src);
        self.process(at, out);
        if !held {
            // Nothing came early (the common case): no window to walk, no far list to search.
            return;
        }
        self.release(src, chan, out);
    }

    /// Whether the one order skips numbers of `src` processed before the merge.
    #[inline]
    fn skipping(&self, src: usize) -> bool {
        self.mode == Order::Gseq && self.seen.get(src).is_some_and(|s| s.len() != 0)
    }

    /// After (`src`, `chan`)'s expected number advanced: processes the frames that came
    /// early and are now in turn, skipping numbers processed before the merge.
    fn release(&mut self, src: usize, chan: usize, out: &mut Matches) {
        // The gap may have closed for frames that came early on this channel: they wait in
        // sequence order in the window (O(1) each), or, rarely, in the far list.
        loop {
            let gseq = self.mode == Order::Gseq;
            let r = &mut self.order[src][chan];
            let next = match r.next() {
                Some(f) => f,
                None => {
                    let want = r.expected;
                    if gseq {
                        if let Some(s) = self.seen.get_mut(src) {
                            if s.contains(want) {
                                // Paired or queued before the merge: not to be seen again.
                                s.forget_below(want);
                                r.expected = want.wrapping_add(1);
                                continue;
                            }
                            s.forget_below(want);
                        }
                    }
                    if self.far.is_empty() {
                        return;
                    }
                    let at = |f: &Frame| f.header.source as usize == src && self.key(&f.header) == (chan, want);
                    match self.far.iter().position(at) {
                        Some(i) => self.far.swap_remove(i),
                        None => return,
                    }
                }
            };
            let r = &mut self.order[src][chan];
            r.expected = r.expected.wrapping_add(1);
            out.frames.push(next);
            self.process(out.frames.len() - 1, out);
        }
    }

    /// A frame in turn: pairs it (recording its `gseq` under [`Order::Partition`]).
    #[inline(never)]
    fn process(&mut self, at: usize, out: &mut Matches) {
        // The header's fields read once (one bounds check).
        let header = &out.frames[at].header;
        let (from, tag, gseq) = (header.source, header.tag, header.gseq);
        if self.mode == Order::Partition && !self.record(from, gseq) {
            return self.park(out.take(at));
        }
        // The common pairing — no wildcard receive posted, and the bin used last (the
        // receive before was for the same source and tag) holds the earliest receive for
        // it — here; every other case out of line, so that this function keeps a small
        // frame (no registers saved for the searches, the queueing of an unexpected frame).
        if self.wild.is_empty() {
            if let Some(p) = self.bins.last_mut(bin_key(from, tag)).and_then(VecDeque::pop_front) {
                out.pairs.push(Matched { req: p.req, at });
                return;
            }
        }
        self.pair_searching(at, from, tag, out);
    }

    /// [`pair`](Self::pair) for what [`process`](Self::process) does not pair itself.
    #[inline(never)]
    fn pair_searching(&mut self, at: usize, from: u32, tag: i32, out: &mut Matches) {
        self.pair(at, from, tag, out);
    }

    /// A frame whose `gseq` lies beyond its window: kept for the switch to one order, which
    /// this asks for.
    #[cold]
    #[inline(never)]
    fn park(&mut self, frame: Frame) {
        self.parked.push(frame);
        self.due = Due::Switch;
    }

    /// Records processed number `gseq` of `src`; `false` if it lies beyond the window's
    /// bound (the frame is then parked and the caller switches the communicator). The
    /// common case — a number inside the window — is one bounds check and an `or`.
    #[inline(always)]
    fn record(&mut self, src: u32, gseq: u32) -> bool {
        if let Some(s) = self.seen.get_mut(src as usize) {
            let off = gseq.wrapping_sub(s.base) as usize;
            if off < 1 << 31 {
                if let Some(word) = s.buf.get_mut(s.head + off / 64) {
                    *word |= 1 << (off % 64);
                    return true;
                }
            }
        }
        self.record_slow(src, gseq)
    }

    /// [`record`](Self::record) for a new source, a window to grow, or a number below the
    /// base.
    #[cold]
    #[inline(never)]
    fn record_slow(&mut self, src: u32, gseq: u32) -> bool {
        let src = src as usize;
        if src >= self.seen.len() {
            self.seen.resize_with(src + 1, Seen::default);
        }
        let s = &mut self.seen[src];
        let Some(off) = s.offset(gseq) else {
            // Below the base, where every number was processed: a malformed frame, paired
            // unrecorded.
            return true;
        };
        let w = off / 64;
        if w >= s.len() {
            if w >= MAX_SEEN_WORDS {
                return false;
            }
            s.grow(w + 1);
            if s.len() >= s.trim_at.max(TRIM_WORDS) && self.due == Due::None {
                self.due = Due::Trim;
            }
        }
        s.words_mut()[w] |= 1 << (off % 64);
        true
    }

    /// Advances the processed-number windows of every partition of a communicator together
    /// (`parts`: all of them, locked by the caller): per source, the words that the union of
    /// the windows fills are settled (every number in them processed somewhere) and dropped.
    /// A window still long after that (a frame long in flight holds the union open) asks for
    /// its next trim at twice its length: the work stays O(1) per frame.
    pub(crate) fn trim(parts: &mut [&mut MatchState]) {
        let sources = parts.iter().map(|p| p.seen.len()).max().unwrap_or(0);
        for p in parts.iter_mut() {
            // Equal lengths: a window created later (by `record`) belongs to a source never
            // trimmed, whose base is 0 in every partition.
            p.seen.resize_with(sources, Seen::default);
            if p.due == Due::Trim {
                p.due = Due::None;
            }
        }
        for src in 0..sources {
            let len = parts.iter().map(|p| p.seen[src].len()).max().unwrap_or(0);
            let union = |w: usize| parts.iter().fold(0u64, |acc, p| acc | p.seen[src].words().get(w).copied().unwrap_or(0));
            let full = (0..len).take_while(|&w| union(w) == !0).count();
            for p in parts.iter_mut() {
                let s = &mut p.seen[src];
                // Every partition's base moves by `full` words, however long its window.
                let n = full.min(s.len());
                s.drop_front(n);
                s.base = s.base.wrapping_add(((full - n) * 64) as u32);
                s.trim_at = (s.len() * 2).max(TRIM_WORDS);
            }
        }
    }

    /// Switches a communicator from per-partition to one order (`parts`: every partition,
    /// locked by the caller; partition 0 becomes the one state, the others stay empty):
    ///
    /// * per source, the frontier is the lowest `gseq` no partition processed; the numbers
    ///   above it that some partition processed are skipped by the one order;
    /// * posted receives are merged: two receives of different partitions never fit one
    ///   frame (each names its tag), so their relative order does not matter, and later
    ///   posts are numbered above all of them;
    /// * unexpected frames below the frontier stay unexpected, in `gseq` order per source;
    ///   those above it, the frames held for reordering and the parked ones go through the
    ///   one order again, as arrivals (pairs they make are appended to `out`).
    pub(crate) fn merge(parts: &mut [&mut MatchState], out: &mut Matches) {
        let Some(size) = parts.first().map(|p| p.size as usize) else { return };
        let sources = parts.iter().map(|p| p.seen.len()).max().unwrap_or(0);
        // Per source: the union of the processed windows (all partitions share each base).
        let mut skip: Vec<Seen> = (0..sources.max(size)).map(|_| Seen::default()).collect();
        for p in parts.iter_mut() {
            for (src, s) in p.seen.drain(..).enumerate() {
                let u = &mut skip[src];
                u.base = s.base;
                if u.len() < s.len() {
                    u.grow(s.len());
                }
                for (a, b) in u.words_mut().iter_mut().zip(s.words()) {
                    *a |= b;
                }
            }
        }
        let frontier: Vec<u32> = skip.iter().map(Seen::first_missing).collect();
        // Everything that goes through the one order again, and the unexpected frames kept.
        let mut again: Vec<Frame> = Vec::new();
        let mut kept: Vec<Frame> = Vec::new();
        let mut wild: Vec<Posted> = Vec::new();
        let mut post_seq = 0;
        for p in parts.iter_mut() {
            for chans in p.order.iter_mut() {
                again.extend(chans.drain(..).flat_map(|r| r.window.into_iter().flatten()));
            }
            again.append(&mut p.far);
            again.append(&mut p.parked);
            for f in p.unexpected.drain(..) {
                let src = f.header.source as usize;
                let below = frontier.get(src).map_or(true, |&fr| f.header.gseq.wrapping_sub(fr) >= 1 << 31);
                if below {
                    kept.push(f);
                } else {
                    // Taken back: it goes through the order again, so it is not skipped.
                    skip[src].remove(f.header.gseq);
                    again.push(f);
                }
            }
            wild.extend(p.wild.drain(..));
            post_seq = post_seq.max(p.post_seq);
            p.mode = Order::Gseq;
            p.due = Due::None;
        }
        let Some((first, rest)) = parts.split_first_mut() else { return };
        for p in rest.iter_mut() {
            for (key, bin) in p.bins.drain() {
                first.bins.entry(key).extend(bin);
            }
        }
        wild.sort_by_key(|p| p.seq);
        first.wild = wild.into();
        first.post_seq = post_seq;
        kept.sort_by_key(|f| f.header.gseq.wrapping_sub(frontier.get(f.header.source as usize).copied().unwrap_or(0)));
        first.unexpected = kept.into();
        // Every source now, not grown on first sight: the one order of a source starts at
        // its frontier, not at 0.
        first.order.resize_with(size, Vec::new);
        for (src, chans) in first.order.iter_mut().enumerate() {
            chans.push(Reorder { expected: frontier.get(src).copied().unwrap_or(0), window: VecDeque::new() });
        }
        for (s, &fr) in skip.iter_mut().zip(&frontier) {
            s.forget_below(fr);
        }
        first.seen = skip;
        // The frontier itself was processed nowhere, so nothing is released before its
        // frame arrives (here, or later).
        for f in again {
            first.arrive(f, out);
        }
    }

    /// Moves a communicator's states from the layout by source to the layout by tag
    /// (`parts`: every state, locked by the caller; see `Layout` in the engine's context
    /// table). State `j` holds of source `s` the tag partition `(j - s) mod n` alone, so all
    /// it holds of `s` — the receives posted for it, its frames in every queue, its
    /// reordering and its processed numbers — moves to state `(j - s) mod n`, together:
    ///
    /// * nothing pairs: a receive and a frame that fit each other were in one state before;
    /// * every order within a source is kept (its frames of one partition come from one
    ///   state, in their order); sources interleave freely, as MPI lets them;
    /// * per source the states' processed-number windows are permuted, so they keep the
    ///   base they share ([`trim`](Self::trim));
    /// * no wildcard receive is posted yet (a `Source::Any` one asks for this move first, a
    ///   `Tag::Any` one for the merge), and later posts are numbered above every receive
    ///   moved.
    pub(crate) fn by_tag(parts: &mut [&mut MatchState]) {
        let n = parts.len();
        // Where state `j`'s material of source `src` goes.
        let target = |j: usize, src: usize| (j + n - src % n) % n;
        let post_seq = parts.iter().map(|p| p.post_seq).max().unwrap_or(0);
        let sources = parts.iter().map(|p| p.order.len().max(p.seen.len())).max().unwrap_or(0);
        for src in (0..sources).filter(|src| src % n != 0) {
            let order: Vec<Vec<Reorder>> = parts.iter_mut().map(|p| p.order.get_mut(src).map(std::mem::take).unwrap_or_default()).collect();
            let seen: Vec<Seen> = parts.iter_mut().map(|p| p.seen.get_mut(src).map(std::mem::take).unwrap_or_default()).collect();
            for (j, (o, w)) in order.into_iter().zip(seen).enumerate() {
                let p = &mut parts[target(j, src)];
                if !o.is_empty() {
                    if p.order.len() <= src {
                        p.order.resize_with(src + 1, Vec::new);
                    }
                    p.order[src] = o;
                }
                if w.base != 0 || !w.buf.is_empty() {
                    if p.seen.len() <= src {
                        p.seen.resize_with(src + 1, Seen::default);
                    }
                    p.seen[src] = w;
                }
            }
        }
        // Receives, and frames in arrival order (those of one source stay in theirs).
        let mut bins: Vec<Vec<(u64, VecDeque<Posted>)>> = (0..n).map(|_| Vec::new()).collect();
        let mut frames: Vec<[Vec<Frame>; 3]> = (0..n).map(|_| Default::default()).collect();
        for (j, p) in parts.iter_mut().enumerate() {
            debug_assert!(p.wild.is_empty(), "a wildcard receive is posted after the move");
            for (key, bin) in p.bins.drain() {
                bins[target(j, (key >> 32) as usize)].push((key, bin));
            }
            let mut keep = |q: usize, f: Frame| {
                let t = target(j, f.header.source as usize);
                if t == j {
                    return Some(f);
                }
                frames[t][q].push(f);
                None
            };
            p.unexpected = std::mem::take(&mut p.unexpected).into_iter().filter_map(|f| keep(0, f)).collect();
            p.far = std::mem::take(&mut p.far).into_iter().filter_map(|f| keep(1, f)).collect();
            p.parked = std::mem::take(&mut p.parked).into_iter().filter_map(|f| keep(2, f)).collect();
        }
        for (p, (bins, [unexpected, far, parked])) in parts.iter_mut().zip(bins.into_iter().zip(frames)) {
            for (key, bin) in bins {
                p.bins.entry(key).extend(bin);
            }
            p.unexpected.extend(unexpected);
            p.far.extend(far);
            p.parked.extend(parked);
            p.post_seq = post_seq;
        }
    }

    /// A frame in turn (frame `at` of `out`, from `from` under `tag`) meets the earliest
    /// posted receive that fits it, or waits as unexpected. Inlined into its callers.
    #[inline(always)]
    fn pair(&mut self, at: usize, from: u32, tag: i32, out: &mut Matches) {
        let bin = self.bins.get_mut(bin_key(from, tag)).filter(|b| !b.is_empty());
        let wild = if self.wild.is_empty() { None } else { self.wild.iter().position(|p| fits(p.source, p.tag, from, tag)) };
        // The earliest posted of the two candidates.
        let p = match (bin, wild) {
            (Some(b), Some(i)) if self.wild[i].seq < b[0].seq => self.wild.remove(i),
            (Some(b), _) => b.pop_front(),
            (None, Some(i)) => self.wild.remove(i),
            (None, None) => None,
        };
        match p {
            Some(p) => out.pairs.push(Matched { req: p.req, at }),
            None if self.forgotten.is_some() && self.is_forgotten(tag) => self.drop_frame(out.take(at)),
            None => {
                self.counters.unexpected += 1;
                self.unexpected.push_back(out.take(at));
            }
        }
    }

    /// Forgets `tags` (nobody will post a receive for them again): the frames queued under
    /// them are appended to `out` (to be released outside the lock), and those that arrive
    /// later and find no receive are dropped, until `count` has moved on by `span` from its
    /// value now. Only the collective context forgets tags (one matching state, never
    /// partitioned: nothing else is [`Due`] there).
    pub(crate) fn forget(&mut self, tags: &[i32], count: &Arc<AtomicU32>, span: u32, out: &mut Vec<Frame>) {
        let f = self
            .forgotten
            .get_or_insert_with(|| Box::new(Forgotten { count: count.clone(), span, tags: VecDeque::with_capacity(tags.len()) }));
        let now = f.count.load(AtomicOrdering::Relaxed);
        for &t in tags {
            if f.tags.len() >= MAX_FORGOTTEN {
                f.tags.pop_front();
            }
            f.tags.push_back((t, now));
        }
        if self.unexpected.iter().any(|fr| tags.contains(&fr.header.tag)) {
            let (gone, kept): (VecDeque<Frame>, VecDeque<Frame>) = self.unexpected.drain(..).partition(|fr| tags.contains(&fr.header.tag));
            self.unexpected = kept;
            out.extend(gone);
        }
    }

    /// Whether frames under `tag` are dropped (forgotten and not yet remembered again).
    #[cold]
    #[inline(never)]
    fn is_forgotten(&mut self, tag: i32) -> bool {
        let Some(f) = self.forgotten.as_deref_mut() else { return false };
        let now = f.count.load(AtomicOrdering::Relaxed);
        f.tags.retain(|&(_, at)| now.wrapping_sub(at) < f.span);
        let hit = f.tags.iter().any(|&(t, _)| t == tag);
        if f.tags.is_empty() {
            self.forgotten = None;
        }
        hit
    }

    /// Keeps a frame under a forgotten tag for the caller to release.
    #[cold]
    #[inline(never)]
    fn drop_frame(&mut self, frame: Frame) {
        debug_assert!(matches!(self.due, Due::None | Due::Release), "a forgetting state is never partitioned");
        self.dropped.push(frame);
        self.due = Due::Release;
    }

    /// The frames dropped under forgotten tags, to release outside the lock.
    pub(crate) fn take_dropped(&mut self) -> Vec<Frame> {
        std::mem::take(&mut self.dropped)
    }

    /// Frames held (unexpected, early or dropped and not yet released).
    #[cfg(test)]
    pub(crate) fn frames_held(&self) -> usize {
        let held: usize = self.order.iter().flatten().map(|r| r.window.iter().flatten().count()).sum();
        self.unexpected.len() + self.far.len() + self.parked.len() + self.dropped.len() + held
    }

    /// [`post_into`](Self::post_into), returning the frame taken.
    #[cfg(test)]
    pub(crate) fn post(&mut self, source: Source, tag: Tag, req: &Arc<Operation>) -> Option<Frame> {
        let mut early = None;
        self.post_into(source, tag, req, &mut early);
        early
    }

    /// A receive is posted: take the first fitting unexpected frame into `early` (empty on
    /// entry; left untouched when there is none: no frame-sized copy on the common path), or
    /// queue the receive.
    ///
    /// The common posting — nothing unexpected, a fully specified receive for the (source,
    /// tag) of the bin used last — is done here, in a function that saves few registers;
    /// every other case goes to [`post_searching`](Self::post_searching), out of line.
    #[inline(never)]
    pub(crate) fn post_into(&mut self, source: Source, tag: Tag, req: &Arc<Operation>, early: &mut Option<Frame>) {
        if let (true, Source::Rank(r), Tag::Is(t)) = (self.unexpected.is_empty(), source, tag) {
            let seq = self.post_seq;
            if let Some(bin) = self.bins.last_mut(bin_key(r, t)) {
                // A bin with room takes the entry with no call on the way (growing is out
                // of line), so its fields are stored straight into the bin, not assembled
                // on the stack by narrow stores around the call and read back by wide
                // loads (a load that waits for those stores to retire).
                let posted = Posted { source, tag, seq, req: Held::of(req) };
                if bin.len() < bin.capacity() {
                    bin.push_back(posted);
                } else {
                    push_growing(bin, posted);
                }
                self.post_seq = seq + 1;
                return;
            }
        }
        self.post_searching(source, tag, req, early);
    }

    /// [`post_into`](Self::post_into) for every other posting.
    #[inline(never)]
    fn post_searching(&mut self, source: Source, tag: Tag, req: &Arc<Operation>, early: &mut Option<Frame>) {
        debug_assert!(early.is_none(), "a receive posted with a frame already in hand");
        if let (Some(f), true) = (self.unexpected.front(), early.is_none()) {
            // Mostly the earliest frame queued fits: looked at first and taken off the front,
            // with no walk set up and none of a removal's moving of the others. `early` is
            // known empty here, so the frame is written into it with no drop of what it held
            // (and no copy through the stack around one).
            if fits(source, tag, f.header.source, f.header.tag) {
                *early = self.unexpected.pop_front();
                return;
            }
            if let Some(i) = self.unexpected.iter().skip(1).position(|f| fits(source, tag, f.header.source, f.header.tag)) {
                *early = self.unexpected.remove(i + 1);
                return;
            }
        }
        let seq = self.post_seq;
        self.post_seq += 1;
        let posted = Posted { source, tag, seq, req: Held::of(req) };
        match (source, tag) {
            (Source::Rank(r), Tag::Is(t)) => self.bins.entry(bin_key(r, t)).push_back(posted),
            _ => self.wild.push_back(posted),
        }
    }

    /// Removes a posted receive that has not matched (cancel). Returns whether it was there.
    /// Only the request's owner cancels, holding the reference that the queue held the
    /// receive on (`Held`): that share ends here, uncompleted.
    pub(crate) fn cancel(&mut self, req: &Arc<Operation>) -> bool {
        let list = match self.wild.iter().position(|p| p.req.is(req)) {
            Some(i) => return self.wild.remove(i).is_some(),
            None => self.bins.values_mut().find(|b| b.iter().any(|p| p.req.is(req))),
        };
        match list {
            Some(b) => {
                b.retain(|p| !p.req.is(req));
                true
            }
            None => false,
        }
    }

    /// Removes the posted receives that can no longer match because their source is lost
    /// (`alive(r)` false), or — for `Source::Any` — because no peer is left (`any_alive`
    /// false). They are appended to `out` with their source, to be failed outside the lock,
    /// each by a reference of its own.
    pub(crate) fn fail_lost(&mut self, alive: impl Fn(u32) -> bool, any_alive: bool, out: &mut Vec<(Arc<Operation>, Source)>) {
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
        out.extend(lost.into_iter().map(|p| (p.req.counted(), p.source)));
    }

    /// Probes for an unexpected frame without taking it: `(source, tag, bytes)`.
    pub(crate) fn probe(&self, source: Source, tag: Tag) -> Option<(u32, i32, usize)> {
        self.unexpected
            .iter()
            .find(|f| fits(source, tag, f.header.source, f.header.tag))
            .map(|f| (f.header.source, f.header.tag, message_len(f)))
    }

    /// Takes the first unexpected frame that fits (`source`, `tag`) out of the queue, as a
    /// receive posted now would, without posting anything when there is none (matched probe,
    /// `MPI_Improbe`): the frame then belongs to the caller, and no receive can match it.
    pub(crate) fn take_unexpected(&mut self, source: Source, tag: Tag) -> Option<Frame> {
        let i = self.unexpected.iter().position(|f| fits(source, tag, f.header.source, f.header.tag))?;
        self.unexpected.remove(i)
    }

    /// Empties the queues (communicator freed / runtime shut down): the posted receives are
    /// returned, each by a reference of its own, so the caller can fail them; the frames are
    /// handed to `drop_frame`.
    pub(crate) fn drain(&mut self, mut drop_frame: impl FnMut(Frame)) -> Vec<Arc<Operation>> {
        let held = self.order.iter_mut().flatten().flat_map(|r| r.window.drain(..).flatten());
        let dropped = self.dropped.drain(..);
        for f in self.unexpected.drain(..).chain(self.far.drain(..)).chain(self.parked.drain(..)).chain(dropped).chain(held) {
            drop_frame(f);
        }
        let mut posted: Vec<Posted> = self.wild.drain(..).collect();
        for b in self.bins.values_mut() {
            posted.extend(b.drain(..));
        }
        posted.sort_by_key(|p| p.seq);
        posted.into_iter().map(|p| p.req.counted()).collect()
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
mod props;

#[cfg(test)]
mod tests {
    use super::*;
    use weft_transport::Header;

    fn frame(source: u32, seq: u32) -> Frame {
        Frame { header: Header::eager(0, source, 7, seq, 0), payload: Payload::Empty }
    }

    fn post_n(m: &mut MatchState, n: usize) -> Vec<Arc<Operation>> {
        (0..n)
            .map(|_| {
                let r = Arc::new(Operation::held());
                assert!(m.post(Source::Rank(1), Tag::Is(7), &r).is_none());
                r
            })
            .collect()
    }

    /// Receives posted after their frames arrived take the earliest queued frame that fits:
    /// the front one when it fits, otherwise the first fitting one further back (a named
    /// source or tag skips other sources' and tags' earlier frames), and a wildcard the
    /// earliest of all in arrival order; frames of one source are taken in their send order.
    #[test]
    fn late_receives_take_the_earliest_fitting_unexpected_frame() {
        let f = |source: u32, tag: i32, seq: u32| Frame { header: Header::eager(0, source, tag, seq, 0), payload: Payload::Empty };
        let mut m = MatchState::new(3, Order::Chan);
        let mut out = Matches::default();
        // Arrival order: (1, 7, #0), (2, 7, #0), (1, 8, #1), (2, 7, #1), (1, 7, #2).
        for fr in [f(1, 7, 0), f(2, 7, 0), f(1, 8, 1), f(2, 7, 1), f(1, 7, 2)] {
            m.arrive(fr, &mut out);
        }
        assert!(out.pairs.is_empty());
        assert_eq!(m.counters.unexpected, 5);
        let r = Arc::new(Operation::held());
        let mut take = |source: Source, tag: Tag| m.post(source, tag, &r).map(|x| (x.header.source, x.header.tag, x.header.seq));
        assert_eq!(take(Source::Rank(2), Tag::Is(7)), Some((2, 7, 0)), "behind the front, skipping source 1's frame");
        assert_eq!(take(Source::Rank(1), Tag::Is(7)), Some((1, 7, 0)), "the front frame");
        assert_eq!(take(Source::Any, Tag::Is(7)), Some((2, 7, 1)), "skipping the other tag's earlier frame");
        assert_eq!(take(Source::Any, Tag::Any), Some((1, 8, 1)), "the earliest left");
        assert_eq!(take(Source::Rank(2), Tag::Any), None, "source 2 has nothing left");
        assert_eq!(take(Source::Rank(1), Tag::Any), Some((1, 7, 2)));
        assert_eq!(m.frames_held(), 0);
        // The receive that found nothing waits for source 2's next frame.
        m.arrive(f(2, 9, 2), &mut out);
        assert_eq!(out.pairs.len(), 1);
        assert!(out.pairs[0].req.is(&r));
    }

    /// Frames that arrive in any order are paired with the receives in sequence order,
    /// whether they wait in the reorder window or (far ahead) in the far list.
    #[test]
    fn out_of_sequence_frames_match_in_sequence_order() {
        let far = REORDER_WINDOW as u32 + 5;
        let n = far as usize + 1;
        let mut m = MatchState::new(2, Order::Chan);
        let reqs = post_n(&mut m, n);
        let mut out = Matches::default();
        // The farthest first, then everything else backwards, then the first.
        m.arrive(frame(1, far), &mut out);
        for seq in (1..far).rev() {
            m.arrive(frame(1, seq), &mut out);
        }
        assert!(out.pairs.is_empty(), "nothing may match before sequence 0");
        assert_eq!(m.counters.out_of_sequence, u64::from(far));
        m.arrive(frame(1, 0), &mut out);
        assert_eq!(out.pairs.len(), n);
        for (i, (got, req)) in out.pairs.iter().zip(&reqs).enumerate() {
            assert_eq!(out.frame(got).header.seq, i as u32);
            assert!(got.req.is(req), "sequence {i} paired with the receive posted {i}th");
        }
        assert!(m.far.is_empty());
        // The window keeps working after draining: a gap of one, then its filler.
        let mut out = Matches::default();
        let _more = post_n(&mut m, 2);
        m.arrive(frame(1, far + 2), &mut out);
        assert!(out.pairs.is_empty());
        m.arrive(frame(1, far + 1), &mut out);
        assert_eq!(out.pairs.iter().map(|x| out.frame(x).header.seq).collect::<Vec<_>>(), vec![far + 1, far + 2]);
    }

    /// The in-sequence fast path (nothing held) and the walk (something held) agree: frames
    /// of a second source wait in the far list and the window of the first source empties
    /// and refills, and every frame still pairs with the receive posted for its turn.
    #[test]
    fn in_sequence_frames_around_held_ones() {
        let mut m = MatchState::new(3, Order::Chan);
        let reqs = post_n(&mut m, 8);
        let mut out = Matches::default();
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
        let seqs: Vec<u32> = out.pairs.iter().map(|x| out.frame(x).header.seq).collect();
        assert_eq!(seqs, (0..8).collect::<Vec<_>>());
        for (got, req) in out.pairs.iter().zip(&reqs) {
            assert!(got.req.is(req));
        }
        assert_eq!(m.far.len(), 1, "source 2's frame still waits for its turn");
        assert_eq!(m.order[1][0].expected, 8);
    }

    /// The bin used last is found without a lookup, and stays right when the bins are
    /// pruned under it: receives posted for one (source, tag) before and after many other
    /// tags came and went still pair in post order, with their own frames only, and the
    /// empty bins are dropped (memory stays bounded).
    #[test]
    fn bins_pair_in_post_order_across_pruning() {
        let mut m = MatchState::new(2, Order::Overtake);
        let mut out = Matches::default();
        let (kept, _) = post(&mut m, Source::Rank(1), Tag::Is(5));
        // Many other tags, each posted and paired: their bins are left empty.
        for t in 0..MAX_IDLE_BINS as i32 + 10 {
            let (r, f) = post(&mut m, Source::Rank(0), Tag::Is(1000 + t));
            assert!(f.is_none());
            m.arrive(gframe(0, 1000 + t, 0, 0), &mut out);
            assert!(out.pairs.pop().expect("paired").req.is(&r));
        }
        assert!(m.bins.len() <= MAX_IDLE_BINS + 1, "empty bins are pruned: {}", m.bins.len());
        // The bin of tag 5 moved when the others were pruned; the one used last is another.
        let (later, _) = post(&mut m, Source::Rank(1), Tag::Is(5));
        let (other, _) = post(&mut m, Source::Rank(1), Tag::Is(6));
        for (tag, want) in [(5, &kept), (6, &other), (5, &later)] {
            m.arrive(gframe(1, tag, 0, 0), &mut out);
            let got = out.pairs.pop().expect("paired");
            assert_eq!(out.frame(&got).header.tag, tag);
            assert!(got.req.is(want), "tag {tag}: the receive posted first");
        }
        m.arrive(gframe(1, 5, 0, 0), &mut out);
        assert!(out.pairs.is_empty(), "no receive left for tag 5");
        assert_eq!(m.unexpected.len(), 1);
    }

    /// Receives posted into the bin used last, past its capacity (the bin grows out of line
    /// while posting), pair with arriving frames in post order.
    #[test]
    fn a_growing_bin_pairs_in_post_order() {
        let mut m = MatchState::new(2, Order::Overtake);
        let mut out = Matches::default();
        let posted: Vec<_> = (0..67).map(|_| post(&mut m, Source::Rank(1), Tag::Is(3)).0).collect();
        for (i, want) in posted.iter().enumerate() {
            m.arrive(gframe(1, 3, 0, 0), &mut out);
            let got = out.pairs.pop().expect("paired");
            assert!(got.req.is(want), "frame {i} pairs with the receive posted {i}th");
        }
        assert_eq!(m.frames_held(), 0);
    }

    /// Receives under ever new tags (a collective's sequence numbers), each paired before
    /// the next is posted, reuse one bin: no bin per tag, no map entry.
    #[test]
    fn new_tags_take_over_an_empty_bin() {
        let mut m = MatchState::new(2, Order::Overtake);
        let mut out = Matches::default();
        for t in 0..100 {
            let (r, f) = post(&mut m, Source::Rank(1), Tag::Is(-2 * t));
            assert!(f.is_none());
            m.arrive(gframe(1, -2 * t, 0, 0), &mut out);
            assert!(out.pairs.pop().expect("paired").req.is(&r));
        }
        assert_eq!(m.bins.len(), 1, "one bin for every tag in turn");
        assert!(m.bins.index.is_empty());
    }

    /// Bins past those found by comparing keys are found through the map, before and after
    /// it takes over, and pair each frame with its own tag's receives in post order.
    #[test]
    fn bins_pair_by_key_past_the_scanned_ones() {
        let mut m = MatchState::new(3, Order::Overtake);
        let mut out = Matches::default();
        let n = 3 * SCAN_BINS as i32;
        let reqs: Vec<Vec<Arc<Operation>>> =
            (0..n).map(|t| (0..2).map(|_| post(&mut m, Source::Rank(t as u32 % 3), Tag::Is(t)).0).collect()).collect();
        assert_eq!(m.bins.len(), n as usize);
        assert_eq!(m.bins.index.len(), n as usize, "the map holds every key once past the scanned bins");
        for round in [0, 1] {
            for t in (0..n).rev() {
                m.arrive(gframe(t as u32 % 3, t, 0, 0), &mut out);
                let got = out.pairs.pop().expect("paired");
                assert!(got.req.is(&reqs[t as usize][round]), "tag {t}, receive {round}");
            }
        }
        m.arrive(gframe(0, 0, 0, 0), &mut out);
        assert!(out.pairs.is_empty() && m.unexpected.len() == 1, "no receive left");
    }

    /// Frames held for reordering are handed back by `drain` (freed communicator).
    #[test]
    fn drain_returns_held_frames() {
        let mut m = MatchState::new(2, Order::Chan);
        let mut out = Matches::default();
        m.arrive(frame(1, 3), &mut out);
        m.arrive(frame(1, REORDER_WINDOW as u32 + 9), &mut out);
        m.arrive(frame(0, 0), &mut out); // in sequence, nobody posted: unexpected
        let mut dropped = Vec::new();
        assert!(m.drain(|f| dropped.push(f.header.seq)).is_empty());
        dropped.sort_unstable();
        assert_eq!(dropped, vec![0, 3, REORDER_WINDOW as u32 + 9]);
    }

    /// Frames under forgotten tags: those queued are handed out at once, those arriving
    /// later without a receive are dropped (and the caller told), others queue as before;
    /// once the count has moved on by the span the tags are kept again.
    #[test]
    fn forgotten_tags_drop_their_frames_until_the_count_moves_on() {
        let mut m = MatchState::new(2, Order::Chan);
        let mut out = Matches::default();
        m.arrive(gframe(1, -8, 0, 0), &mut out);
        m.arrive(gframe(1, -10, 1, 0), &mut out);
        let count = Arc::new(AtomicU32::new(u32::MAX - 1));
        let mut gone = Vec::new();
        m.forget(&[-8, -9], &count, 4, &mut gone);
        assert_eq!(gone.iter().map(|f| f.header.tag).collect::<Vec<_>>(), vec![-8], "the queued frame of the tag goes");
        assert_eq!(m.frames_held(), 1, "the other tag's frame stays");
        // Out of sequence first: held, then dropped once in turn.
        m.arrive(gframe(0, -9, 1, 0), &mut out);
        m.arrive(gframe(0, -8, 0, 0), &mut out);
        assert!(out.pairs.is_empty());
        assert_eq!(m.take_due(), Due::Release);
        assert_eq!(m.take_dropped().len(), 2);
        assert_eq!(m.take_due(), Due::None);
        // A posted receive still takes a frame of a forgotten tag.
        let (r, early) = post(&mut m, Source::Rank(1), Tag::Is(-8));
        assert!(early.is_none());
        m.arrive(gframe(1, -8, 2, 0), &mut out);
        assert!(out.pairs.len() == 1 && out.pairs[0].req.is(&r));
        // The count wraps and moves on by the span: the tag is kept again.
        count.store(2, AtomicOrdering::Relaxed);
        m.arrive(gframe(0, -8, 2, 0), &mut out);
        assert_eq!((m.take_due(), m.frames_held()), (Due::None, 2), "queued once the span has passed");
        assert!(m.forgotten.is_none(), "nothing is forgotten any more");
    }

    fn gframe(source: u32, tag: i32, seq: u32, gseq: u32) -> Frame {
        let header =
            Header { kind: FrameKind::Eager, src_cri: 0, context: 0, source, tag, seq, gseq, chan: 0, len: 0, cookie: 0, key: 0, addr: 0 };
        Frame { header, payload: Payload::Empty }
    }

    fn post(m: &mut MatchState, source: Source, tag: Tag) -> (Arc<Operation>, Option<Frame>) {
        let r = Arc::new(Operation::held());
        let f = m.post(source, tag, &r);
        (r, f)
    }

    /// A partition holds per-source state only for the sources it has heard from (16 of
    /// them per communicator would otherwise each hold a vector per rank), and a window
    /// sized by what the source sent; the merged one order has every source, starting at
    /// its frontier.
    #[test]
    fn per_source_state_grows_on_first_frame() {
        let size = 1000;
        let (mut a, mut b) = (MatchState::new(size, Order::Partition), MatchState::new(size, Order::Partition));
        let mut out = Matches::default();
        assert!(a.order.is_empty() && b.order.is_empty());
        a.arrive(gframe(5, 1, 0, 0), &mut out);
        assert_eq!(a.order.len(), 6);
        assert!(a.seen[5].buf.capacity() < 16, "a source that sent one frame holds a few words, not a trim period");
        a.arrive(gframe(size, 1, 0, 1), &mut out);
        assert_eq!(a.order.len(), 6, "a source outside the communicator is dropped");
        assert_eq!(a.unexpected.len(), 1);
        MatchState::merge(&mut [&mut a, &mut b], &mut out);
        assert_eq!(a.order.len(), size as usize);
        assert_eq!(a.order[5][0].expected, 1, "source 5's one order starts after its gseq 0");
        assert_eq!(a.order[7][0].expected, 0);
        a.arrive(gframe(7, 2, 0, 0), &mut out);
        assert_eq!(a.unexpected.len(), 2, "source 7's first frame is in turn");
    }

    /// Tag partitions of one source: gseq 0, 2, 4 on tag 1 (partition `a`), 1, 3, 5 on tag
    /// 2 (partition `b`), each with its own `seq`.
    fn two_partitions() -> (MatchState, MatchState) {
        (MatchState::new(2, Order::Partition), MatchState::new(2, Order::Partition))
    }

    /// The merge orders a source's frames by `gseq` over every partition: unexpected frames
    /// below the frontier stay first, those above it wait for the frame still in flight (a
    /// `Tag::Any` receive must not take them before it), and frames held for reordering in a
    /// partition take their place in the one order.
    #[test]
    fn merge_orders_by_gseq_across_partitions() {
        let (mut a, mut b) = two_partitions();
        let mut out = Matches::default();
        for (seq, g) in [(0, 0), (1, 2), (2, 4)] {
            a.arrive(gframe(1, 1, seq, g), &mut out);
        }
        b.arrive(gframe(1, 2, 1, 3), &mut out); // seq 0 (gseq 1) still in flight
        assert!(out.pairs.is_empty());
        MatchState::merge(&mut [&mut a, &mut b], &mut out);
        assert!(out.pairs.is_empty(), "nothing was posted");
        let (_, first) = post(&mut a, Source::Any, Tag::Any);
        assert_eq!(first.map(|f| f.header.gseq), Some(0), "the frame below the frontier is unexpected");
        let reqs: Vec<_> = (0..5)
            .map(|_| {
                let (r, f) = post(&mut a, Source::Rank(1), Tag::Any);
                assert!(f.is_none(), "a frame above the frontier was taken before gseq 1 arrived");
                r
            })
            .collect();
        a.arrive(gframe(1, 2, 0, 1), &mut out);
        a.arrive(gframe(1, 2, 2, 5), &mut out);
        assert_eq!(out.pairs.iter().map(|m| out.frame(m).header.gseq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        for (m, r) in out.pairs.iter().zip(&reqs) {
            assert!(m.req.is(r), "receives filled in post order");
        }
        assert!(b.unexpected.is_empty() && b.order.iter().all(|c| c.is_empty()), "partition b handed everything over");
    }

    /// Frames paired before the merge are skipped by the one order, and receives posted
    /// before it (in any partition) precede every receive posted after it.
    #[test]
    fn frames_paired_before_the_merge_are_skipped() {
        let (mut a, mut b) = two_partitions();
        let mut out = Matches::default();
        let (ra, _) = post(&mut a, Source::Rank(1), Tag::Is(1));
        let (rb, _) = post(&mut b, Source::Any, Tag::Is(2));
        a.arrive(gframe(1, 1, 0, 1), &mut out); // gseq 0 (tag 2) still in flight
        assert_eq!(out.pairs.len(), 1);
        assert!(out.pairs[0].req.is(&ra));
        out.clear();
        MatchState::merge(&mut [&mut a, &mut b], &mut out);
        let (rany, f) = post(&mut a, Source::Any, Tag::Any);
        assert!(f.is_none());
        a.arrive(gframe(1, 2, 0, 0), &mut out);
        a.arrive(gframe(1, 1, 1, 2), &mut out);
        let got: Vec<(u32, bool)> = out.pairs.iter().map(|m| (out.frame(m).header.gseq, m.req.is(&rb))).collect();
        assert_eq!(got, vec![(0, true), (2, false)], "gseq 0 to the earlier posted receive, 1 skipped, 2 to Tag::Any");
        assert!(out.pairs[1].req.is(&rany));
        assert!(a.seen[1].len() == 0, "the skipped numbers are forgotten once passed");
    }

    /// The processed-number windows stay short while no frame is long in flight: trims
    /// advance them together. With a hole they grow, asking for trims at doubling lengths
    /// only, until the window reaches its bound: the frame beyond is parked and a switch is
    /// due; after the merge every frame comes in `gseq` order.
    #[test]
    fn windows_are_trimmed_and_bounded() {
        let (mut a, mut b) = two_partitions();
        let mut out = Matches::default();
        let n = 20 * TRIM_WORDS as u32 * 64;
        let mut trims = 0;
        let mut capacity = None;
        for g in 0..n {
            // No frame in flight for long: every trim settles all but the last word.
            let (p, tag) = if g % 2 == 0 { (&mut a, 1) } else { (&mut b, 2) };
            p.arrive(gframe(1, tag, g / 2, g), &mut out);
            assert!(p.post(Source::Rank(1), Tag::Is(tag), &Arc::new(Operation::held())).is_some());
            if p.take_due() == Due::Trim {
                MatchState::trim(&mut [&mut a, &mut b]);
                trims += 1;
            }
            assert!(a.seen[1].len() <= TRIM_WORDS + 1 && b.seen.get(1).map_or(0, |s| s.len()) <= TRIM_WORDS + 1);
            // After the first trim period the window slides through its buffer (moved back
            // to the start when it reaches the end): the steady state allocates nothing.
            if trims > 0 {
                let cap = a.seen[1].buf.capacity();
                assert!(cap <= 4 * TRIM_WORDS, "{cap} words for a window of at most {}", TRIM_WORDS + 1);
                assert_eq!(*capacity.get_or_insert(cap), cap, "the window's buffer grew after the first trim");
            }
        }
        assert!(trims >= 10, "{trims} trims");
        // A hole: gseq n + 1 (partition b's next frame) stays in flight while partition a
        // runs ahead until its window is full.
        let (mut trims, mut g, mut seq_b) = (0, n, n / 2 + 1);
        loop {
            a.arrive(gframe(1, 1, g / 2, g), &mut out);
            match a.take_due() {
                Due::Trim => {
                    MatchState::trim(&mut [&mut a, &mut b]);
                    trims += 1;
                }
                Due::Switch => break,
                Due::None => {}
                Due::Release => unreachable!("no tag is forgotten here"),
            }
            b.arrive(gframe(1, 2, seq_b, g + 3), &mut out); // held behind the hole
            seq_b += 1;
            g += 2;
        }
        assert!(trims <= 4, "{trims} trims while the hole stays open");
        assert!(a.seen[1].base <= n + 1, "a trim settled numbers above the hole");
        assert_eq!(a.parked.len(), 1);
        assert!(out.pairs.is_empty());
        MatchState::merge(&mut [&mut a, &mut b], &mut out);
        assert_eq!(a.unexpected.len(), 1, "only gseq n lies below the frontier");
        a.arrive(gframe(1, 2, n / 2, n + 1), &mut out);
        assert!(out.pairs.is_empty());
        let taken: Vec<u32> = (0..).map_while(|_| post(&mut a, Source::Any, Tag::Any).1).map(|f| f.header.gseq).collect();
        assert_eq!(taken, (n..=g + 1).collect::<Vec<_>>(), "after the hole closed, every frame in gseq order");
    }
}
