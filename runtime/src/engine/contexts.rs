//! The context table: communicator states by context id (one atomic load per frame, no
//! lock), their matching states and locks, frames that arrived before their communicator
//! was created here, and freed states kept until no reader can hold them ([Goodell 2010,
//! §V-B]).
//!
//! A context id is a slot of the table (its low [`SLOT_BITS`] bits) and the slot's
//! generation (the bits above): a slot is reused after its communicator is freed
//! everywhere, and a frame of an earlier generation is recognised as stale instead of
//! being delivered to the communicator that now holds the slot.

use std::sync::Arc;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use weft_sync::Error;
use weft_transport::Frame;

use crate::config::{Assignment, MatchingMode};
use crate::lock::path::{Counting, PathLock};
use crate::loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU8, Ordering};
use crate::matching::{MatchState, Matches, Order, Source, Tag};

use super::Engine;

/// Largest number of live context ids per runtime.
pub(crate) const MAX_CONTEXTS: usize = 1 << SLOT_BITS;

/// Bits of a context id that name its slot in the context table; the bits above count the
/// slot's generations (a slot is reused after its communicator is freed everywhere, and a
/// frame of an earlier generation is recognised as stale instead of being delivered to the
/// communicator that now holds the slot).
pub(crate) const SLOT_BITS: u32 = 12;

/// Generations a slot can go through (the context id is a `u32`).
pub(crate) const MAX_GENERATIONS: u32 = 1 << (32 - SLOT_BITS);

/// Freed communicators kept before a communicator creation collects them ([Goodell 2010, §V-B]:
/// creation functions start a collection when the eligible set exceeds a threshold).
pub(crate) const COLLECT_AFTER: usize = 16;

/// The table slot of context id `ctx`.
#[inline]
pub(crate) fn slot_of(ctx: u32) -> usize {
    ctx as usize & (MAX_CONTEXTS - 1)
}

/// The generation of context id `ctx`.
#[inline]
pub(crate) fn generation_of(ctx: u32) -> u32 {
    ctx >> SLOT_BITS
}

/// The context table of one rank (a part of [`Engine`]).
pub(crate) struct ContextTable {
    /// Communicator state by context slot (one atomic load per frame, no lock); the state's
    /// own `context` tells the generation. A reference taken from here is used only while
    /// holding a CRI lock (frame handling) or `table_gate` for reading (the rare paths):
    /// what [`Engine::collect_retired`] waits out before freeing an unpublished state.
    pub(crate) slots: Box<[AtomicPtr<CommState>]>,
    /// Per slot: one more than the highest generation installed on this rank (0: never
    /// used). A frame for an older generation whose state is gone is stale.
    pub(crate) generations: Box<[AtomicU32]>,
    /// Freed communicators' states, unpublished from `contexts` but possibly still read by
    /// a thread that looked them up before ([Goodell 2010]'s eligible set `G_e`).
    pub(crate) retired: Mutex<Vec<Arc<CommState>>>,
    /// Held for reading by the rare paths that look communicators up outside a CRI lock
    /// (counters, lost peers, early-frame replay); for writing by the collector.
    pub(crate) gate: parking_lot::RwLock<()>,
    /// Matching counters of freed communicators (the snapshot stays monotone).
    pub(crate) freed_counters: Mutex<(crate::matching::MatchCounters, crate::lock::LockStatsSnapshot)>,
    /// Frames that arrived for a context this rank has not created yet (a fast peer).
    pub(crate) early: Mutex<Vec<Frame>>,
    /// The mask of free context id pairs and the allocation's shared variables
    /// ([Dinan 2012, Listing 1.1]).
    pub(crate) ids: Mutex<super::ids::IdMask>,
    /// The single matching lock of `MatchingMode::Global`, with every communicator's queues
    /// by context slot (grown to the highest slot used: a rank in another matching mode, or
    /// with few communicators, pays nothing for the slots it never uses).
    pub(crate) global_match: PathLock<Vec<Option<(u32, MatchState)>>>,
}

impl ContextTable {
    /// An empty table (the world's pair of slots 0 and 1 is taken in `ids`), with the matching lock
    /// of `MatchingMode::Global` built by `global_match`.
    pub(crate) fn new(global_match: PathLock<Vec<Option<(u32, MatchState)>>>) -> Self {
        ContextTable {
            slots: (0..MAX_CONTEXTS).map(|_| AtomicPtr::new(std::ptr::null_mut())).collect(),
            generations: (0..MAX_CONTEXTS).map(|_| AtomicU32::new(0)).collect(),
            retired: Mutex::new(Vec::new()),
            gate: parking_lot::RwLock::new(()),
            freed_counters: Mutex::new(Default::default()),
            early: Mutex::new(Vec::new()),
            ids: Mutex::new(super::ids::IdMask::new()),
            global_match,
        }
    }
}

/// One communicator's state on one rank, reachable from its context id.
pub(crate) struct CommState {
    /// Context id of this state (user or collective).
    pub(crate) context: u32,
    /// Ranks in the communicator.
    pub(crate) size: u32,
    /// Whether messages may overtake each other ([Patinyasakdikul 2019, §5.4.4]).
    pub(crate) overtaking: bool,
    /// Set by `free`; operations then fail with `CommFreed`.
    freed: AtomicBool,
    /// Next sequence number per (ordering channel, destination): row `chan` starts at
    /// counter `chan * seq_stride` (rows padded to whole cache lines, and the lines aligned
    /// to one, so threads on different channels do not share one). On a partitioned
    /// communicator (`switchable`), one more row after the channels': the `gseq` per
    /// destination, over every channel.
    send_seq: Box<[SeqLine]>,
    /// Row length of `send_seq`.
    seq_stride: usize,
    /// Ordering channels: `thread channels x tag partitions`. Thread channels: with
    /// `Config::per_thread_order` under `Assignment::Dedicated`, the CRI count (a thread
    /// always sends through its one CRI, whose inbox is FIFO); else 1 (one sequence per
    /// destination: MPI's per-source order).
    chans: usize,
    /// Tag partitions: 1 (a communicator that allows overtaking, and the collective
    /// context), or [`TAG_PARTS`] (messages of different tags are matched under different
    /// locks, each partition with its own sequence per source).
    parts: usize,
    /// Whether the communicator asserts `no_any_tag` (`Tag::Any` refused: the partitions
    /// never need a common order).
    no_any_tag: bool,
    /// Partitioned without the assertion: senders also number every frame over all
    /// partitions (`gseq`), and the first `Tag::Any` receive or probe at this rank switches
    /// the rank's matching to one order ([`Engine::switch_to_one_order`]).
    ///
    /// [`Engine::switch_to_one_order`]: crate::engine::Engine::switch_to_one_order
    switchable: bool,
    /// How this rank lays the communicator's messages out over its matching states (see
    /// [`Layout`]); changed only forward, under every partition lock. From the start:
    /// [`Layout::BY_SOURCE`] on a partitioned communicator, [`Layout::ONE`] on one with one
    /// state and, under `MatchingMode::Global` (one state per communicator, ordered by
    /// `gseq`), on a switchable one; [`Layout::BY_TAG`] on the others under `Global`.
    layout: AtomicU8,
    /// Matching queues (`MatchingMode::PerComm`), one per partition, each on cache lines of
    /// its own.
    pub(crate) matching: Box<[CachePadded<PathLock<MatchState>>]>,
    /// How the matching states order frames (at creation; a switch turns partition 0 to
    /// `Order::Gseq`).
    order: Order,
}

/// Tag partitions of a partitioned communicator.
pub(crate) const TAG_PARTS: usize = 16;

/// Where a rank matches the messages of a communicator: which of its matching states holds
/// the receives and frames of a (source, tag).
///
/// A sender numbers its frames per tag partition, so a receiver may spread them further as
/// long as every (source, tag partition) stays in one state: a source's frames of one tag
/// partition are one sequence, whatever else shares their state. On a partitioned
/// communicator ([`TAG_PARTS`] states) the layout moves only forward, each step under every
/// partition lock, at most twice per communicator and rank:
///
/// * [`BY_SOURCE`](Layout::BY_SOURCE): state `(tag partition + source) mod TAG_PARTS`. The
///   threads of a rank that each receive from a peer of their own under one tag (a halo
///   exchange, [Goodell 2010, §VI-B]'s neighbour pattern) take different locks, which a
///   partition by tag alone would put under one.
/// * [`BY_TAG`](Layout::BY_TAG): state `tag partition`. A `Source::Any` receive or probe
///   with a tag needs every source of its tag in one state: the first one at this rank
///   moves each source's material by its own offset ([`MatchState::by_tag`]).
/// * [`ONE`](Layout::ONE): state 0, ordered by `gseq` (the first `Tag::Any`,
///   [`MatchState::merge`]); from the start on a communicator with one state.
///
/// Bit 0 says whether the tag partition counts, bit 1 whether the source does: the state is
/// one addition and two masks, no branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout(u8);

impl Layout {
    pub(crate) const BY_SOURCE: Layout = Layout(0b11);
    pub(crate) const BY_TAG: Layout = Layout(0b01);
    pub(crate) const ONE: Layout = Layout(0b00);
}

/// A matching state chosen under a layout read without the partition locks
/// ([`CommState::place`]); [`Engine::with_matching_of`] checks the layout under the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) layout: Layout,
    pub(crate) part: usize,
}

/// The tag partition of `tag` on a partitioned communicator. Fibonacci hashing: tags that
/// differ in low bits (one per thread, say) spread.
#[inline]
fn tag_hash(tag: i32) -> usize {
    ((tag as u32).wrapping_mul(0x9E37_79B9) >> (32 - TAG_PARTS.trailing_zeros())) as usize
}

/// Sequence counters per cache line.
const SEQS_PER_LINE: usize = 16;

/// One cache line of send sequence counters, aligned to a line: a row of
/// `CommState::send_seq` starts on a line of its own.
#[repr(C, align(64))]
struct SeqLine([AtomicU32; SEQS_PER_LINE]);

const _: () = assert!(std::mem::size_of::<SeqLine>() == SEQS_PER_LINE * std::mem::size_of::<AtomicU32>());

impl SeqLine {
    fn new() -> Self {
        SeqLine(std::array::from_fn(|_| AtomicU32::new(0)))
    }
}

impl CommState {
    /// A communicator's state; `partition`: match per tag partition (user contexts; the
    /// collective context, whose few messages never use `Tag::Any`, keeps one state).
    pub(crate) fn new(engine: &Engine, context: u32, size: u32, overtaking: bool, no_any_tag: bool, partition: bool) -> Self {
        let thread_chans = match engine.config.assignment {
            Assignment::Dedicated if engine.config.per_thread_order => engine.config.cris.max(1),
            _ => 1,
        };
        // With per-thread order the thread channels already spare the receiver one order
        // over the sending threads; `Tag::Any` keeps them (no switch to one order there).
        let switchable = partition && !overtaking && !no_any_tag && thread_chans == 1;
        let parts = if no_any_tag || switchable { TAG_PARTS } else { 1 };
        let chans = thread_chans * parts;
        // 16 u32 counters per 64-byte line.
        let seq_stride = (size as usize).div_ceil(SEQS_PER_LINE) * SEQS_PER_LINE;
        let rows = chans + usize::from(switchable);
        let one_state = engine.config.matching == MatchingMode::Global;
        let layout = if parts == 1 || (switchable && one_state) {
            Layout::ONE
        } else if one_state {
            // One state for every communicator (`global_match`): nothing to lay out.
            Layout::BY_TAG
        } else {
            Layout::BY_SOURCE
        };
        let order = if overtaking {
            Order::Overtake
        } else if switchable && one_state {
            Order::Gseq
        } else if switchable {
            Order::Partition
        } else {
            Order::Chan
        };
        CommState {
            context,
            size,
            overtaking,
            freed: AtomicBool::new(false),
            send_seq: (0..rows * seq_stride / SEQS_PER_LINE).map(|_| SeqLine::new()).collect(),
            seq_stride,
            chans,
            parts,
            no_any_tag,
            switchable,
            layout: AtomicU8::new(layout.0),
            order,
            matching: (0..parts)
                .map(|_| {
                    CachePadded::new(PathLock::new(
                        engine.config.locks.matching,
                        &engine.lock_options,
                        Counting::new(engine.config.lock_stats, engine.config.lock_timing),
                        MatchState::new(size, order),
                    ))
                })
                .collect(),
        }
    }

    /// The tag partition a message of `tag` is numbered in by its sender (0 on a
    /// communicator with one partition).
    #[inline]
    pub(crate) fn tag_part(&self, tag: i32) -> usize {
        if self.parts == 1 {
            return 0;
        }
        tag_hash(tag)
    }

    /// [`part_in`](Self::part_in) under the layout of now, with the layout: a hint when read
    /// without a partition lock (see [`layout`](Self::layout)). For a send, `source` is its
    /// destination: a thread's sends to a peer and its receives from it share a state.
    #[inline]
    pub(crate) fn place(&self, source: Source, tag: Tag) -> Place {
        let layout = self.layout();
        Place { layout, part: self.part_in(layout, source, tag) }
    }

    /// The matching state of a receive or probe of `source` (a world rank, or `Any`) and
    /// `tag` under `layout`. `Tag::Any` is matched in state 0 (refused on a `no_any_tag`
    /// communicator, and a switchable one switches to [`Layout::ONE`] first); `Source::Any`
    /// with a tag in the tag's partition (the communicator moves to [`Layout::BY_TAG`]
    /// first).
    #[inline]
    pub(crate) fn part_in(&self, layout: Layout, source: Source, tag: Tag) -> usize {
        let Tag::Is(t) = tag else { return 0 };
        let s = match source {
            Source::Rank(s) => s as usize,
            Source::Any => 0,
        };
        let by_source = usize::from(layout.0 >> 1).wrapping_neg();
        let by_tag = usize::from(layout.0 & 1).wrapping_neg() & (TAG_PARTS - 1);
        (tag_hash(t) + (s & by_source)) & by_tag
    }

    /// The layout of this rank's matching states (see [`Layout`]). A hint when read without
    /// a partition lock; under one it is exact (a change holds every partition lock, and
    /// its release of that lock ordered the store before this load).
    #[inline]
    pub(crate) fn layout(&self) -> Layout {
        Layout(self.layout.load(Ordering::Relaxed))
    }

    /// Whether this rank matches the communicator in one state ([`Layout::ONE`]).
    #[inline]
    pub(crate) fn is_switched(&self) -> bool {
        self.layout() == Layout::ONE
    }

    /// Whether a `Tag::Any` receive or probe must first switch this rank to one order.
    #[inline]
    pub(crate) fn needs_switch(&self) -> bool {
        self.switchable && !self.is_switched()
    }

    /// Whether a receive or probe from `Source::Any` must first move this rank's states to
    /// [`Layout::BY_TAG`].
    #[inline]
    pub(crate) fn needs_by_tag(&self) -> bool {
        self.layout() == Layout::BY_SOURCE
    }

    /// Sets the layout (the caller holds every partition lock; layouts move forward).
    fn set_layout(&self, layout: Layout) {
        debug_assert!(layout.0 < self.layout.load(Ordering::Relaxed));
        self.layout.store(layout.0, Ordering::Release);
    }

    /// How a fresh matching state of this communicator orders frames.
    #[inline]
    pub(crate) fn order(&self) -> Order {
        self.order
    }

    /// Whether receives and probes with `Tag::Any` are refused.
    #[inline]
    pub(crate) fn no_any_tag(&self) -> bool {
        self.no_any_tag
    }

    /// Tag partitions (matching locks under `MatchingMode::PerComm`).
    #[inline]
    pub(crate) fn parts(&self) -> usize {
        self.parts
    }

    /// The ordering channel, sequence number and number over every partition (`gseq`) of
    /// the next frame to `dest` with `tag`, sent through CRI `k`.
    #[inline]
    pub(crate) fn sequence_numbers(&self, k: usize, dest: u32, tag: i32) -> (usize, u32, u32) {
        let st = self;
        // With per-thread order, the thread's dedicated CRI is its ordering channel ([Patinyasakdikul 2019,
        // §5.4.4]: one sequence per source shared by every thread forces frames that travel
        // through different CRIs back into one order, filling the out-of-sequence queue).
        let chan = if st.chans > st.parts { k * st.parts } else { 0 } + st.tag_part(tag);
        let seq = if st.overtaking { 0 } else { st.seq_counter(chan * st.seq_stride + dest as usize).fetch_add(1, Ordering::Relaxed) };
        // The number over every partition, shared by the sending threads (what a
        // communicator with one partition pays for `seq`); MPI orders only the sends of one
        // thread, so the two numbers need not be taken together.
        let gseq = if st.switchable { st.seq_counter(st.chans * st.seq_stride + dest as usize).fetch_add(1, Ordering::Relaxed) } else { 0 };
        (chan, seq, gseq)
    }

    /// Counter `i` of `send_seq` (row-major, rows of `seq_stride`).
    #[inline]
    fn seq_counter(&self, i: usize) -> &AtomicU32 {
        // SAFETY: a `SeqLine` is its 16 counters and nothing else (`repr(C)`, 64 bytes, no
        // padding), so the lines are one contiguous array of counters.
        let all: &[AtomicU32] = unsafe { std::slice::from_raw_parts(self.send_seq.as_ptr().cast(), self.send_seq.len() * SEQS_PER_LINE) };
        &all[i]
    }

    /// Marks the state freed (`Communicator::free`); whether this call did it (a second one
    /// finds it freed already). AcqRel: the winner sees every earlier use of the state; a
    /// loser returns without touching it. Pairs with `is_freed`'s Acquire.
    pub(crate) fn mark_freed(&self) -> bool {
        !self.freed.swap(true, Ordering::AcqRel)
    }

    #[inline]
    pub(crate) fn is_freed(&self) -> bool {
        self.freed.load(Ordering::Acquire)
    }
}

impl Engine {
    /// The communicator state of a context, if created on this rank.
    #[inline]
    pub(crate) fn context(&self, ctx: u32) -> Option<&CommState> {
        let p = self.contexts.slots[slot_of(ctx)].load(Ordering::Acquire);
        if p.is_null() {
            return None;
        }
        // SAFETY: a non-null slot holds an `Arc<CommState>` reference owned by the table;
        // when unpublished it moves to `retired`, and `collect_retired` frees it only after
        // every CRI lock and the table gate have been released once since — every caller
        // holds one of them while it uses the reference (see `contexts`).
        let c = unsafe { &*p };
        (c.context == ctx).then_some(c)
    }

    /// Whether a frame for `ctx`, whose state is not installed, belongs to a freed
    /// communicator (a generation this rank has already had in that slot), not to one this
    /// rank has yet to create.
    pub(crate) fn is_stale(&self, ctx: u32) -> bool {
        // Acquire: pairs with `install`'s Release after publishing: a reader that sees the
        // new generation here also sees the state in the table (checked after this).
        let upto = self.contexts.generations[slot_of(ctx)].load(Ordering::Acquire);
        self.context(ctx).is_none() && generation_of(ctx) < upto
    }

    /// Every installed communicator state. Call it holding `table_gate` for reading.
    pub(crate) fn installed(&self) -> impl Iterator<Item = &CommState> {
        (0..MAX_CONTEXTS).filter_map(move |slot| {
            let p = self.contexts.slots[slot].load(Ordering::Acquire);
            // SAFETY: as in `context`; the caller holds the table gate.
            (!p.is_null()).then(|| unsafe { &*p })
        })
    }

    /// Unpublishes a freed communicator's state (its frames are stale from now on) and
    /// keeps it until a collection; its context slot can then be agreed on again.
    pub(crate) fn retire(&self, state: &Arc<CommState>) {
        let raw = Arc::as_ptr(state).cast_mut();
        let slot = &self.contexts.slots[slot_of(state.context)];
        if slot.compare_exchange(raw, std::ptr::null_mut(), Ordering::AcqRel, Ordering::Acquire).is_ok() {
            // SAFETY: the slot held the table's `Arc::into_raw` reference to this state,
            // which we now own (the exchange unpublished it).
            let owned = unsafe { Arc::from_raw(raw) };
            self.contexts.retired.lock().push(owned);
        }
    }

    /// Frees retired communicator states once no thread can still hold a reference taken
    /// from the table before they were unpublished ([Goodell 2010, §V-B]'s collection, with the
    /// readers' critical sections as the roots): a reader holds a CRI lock or the table
    /// gate while it uses one, so taking each of those once after the unpublishing is a
    /// grace period. Runs at communicator creation when more than [`COLLECT_AFTER`] wait.
    pub(crate) fn collect_retired(&self, force: bool) {
        let batch = {
            let mut r = self.contexts.retired.lock();
            if r.is_empty() || (!force && r.len() <= COLLECT_AFTER) {
                return;
            }
            std::mem::take(&mut *r)
        };
        for cri in self.cris.iter() {
            cri.lock.high(|_| ());
        }
        drop(self.contexts.gate.write());
        drop(batch);
    }

    /// How many matching states `comm` has: one per tag partition under `PerComm`, one
    /// (the global lock's slot, holding every partition's queues) under `Global`.
    #[inline]
    pub(crate) fn matching_parts(&self, comm: &CommState) -> usize {
        match self.config.matching {
            MatchingMode::PerComm => comm.parts(),
            MatchingMode::Global => 1,
        }
    }

    /// Main path: runs `f` on tag partition `part` of a communicator's matching state under
    /// its matching lock, with high priority (posting, probing, cancelling).
    #[inline]
    pub(crate) fn with_matching<R>(&self, comm: &CommState, part: usize, f: impl FnOnce(&mut MatchState) -> R) -> R {
        match self.config.matching {
            MatchingMode::PerComm => comm.matching[part].high(f),
            MatchingMode::Global => self.contexts.global_match.high(|all| f(Self::global_slot(all, comm))),
        }
    }

    /// Progress path: [`with_matching`](Self::with_matching) with low priority, for
    /// arrivals.
    #[inline]
    pub(crate) fn with_matching_low<R>(&self, comm: &CommState, part: usize, f: impl FnOnce(&mut MatchState) -> R) -> R {
        // An arrival is always handled (matched or queued): a productive acquisition.
        match self.config.matching {
            MatchingMode::PerComm => comm.matching[part].low(|m| (f(m), true)),
            MatchingMode::Global => self.contexts.global_match.low(|all| (f(Self::global_slot(all, comm)), true)),
        }
    }

    /// [`with_matching`](Self::with_matching) (with low priority if `LOW`, for arrivals:
    /// [`with_matching_low`](Self::with_matching_low)) on the state where receives and
    /// frames of `source` (a world rank, or `Any`) and `tag` are matched now: `at` (the
    /// caller's [`CommState::place`] of them) if the layout it was chosen under still holds
    /// under its lock (where the layout is exact), else the state of the new layout. `f`
    /// runs once; it is `FnMut` so that it can be lent to one lock and still be there for
    /// the next (a big capture such as a frame belongs outside it, borrowed).
    #[inline]
    pub(crate) fn with_matching_of<R, const LOW: bool>(
        &self,
        comm: &CommState,
        at: Place,
        source: Source,
        tag: Tag,
        mut f: impl FnMut(&mut MatchState) -> R,
    ) -> R {
        if at.layout == Layout::ONE {
            // The last layout: nothing moves on.
            return self.lock_as::<R, LOW>(comm, at.part, f);
        }
        match self.lock_as::<_, LOW>(comm, at.part, |m| (comm.layout() == at.layout).then(|| f(m))) {
            Some(r) => r,
            None => self.matching_moved::<R, LOW>(comm, source, tag, f),
        }
    }

    /// [`with_matching_of`](Self::with_matching_of) once the layout moved on after the
    /// caller chose its state: again under the layout of now (at most twice more: layouts
    /// move forward only). Out of line: a thread that raced a move comes here, at most twice
    /// per communicator and rank.
    #[cold]
    #[inline(never)]
    fn matching_moved<R, const LOW: bool>(&self, comm: &CommState, source: Source, tag: Tag, mut f: impl FnMut(&mut MatchState) -> R) -> R {
        loop {
            let at = comm.place(source, tag);
            if at.layout == Layout::ONE {
                return self.lock_as::<R, LOW>(comm, at.part, f);
            }
            if let Some(r) = self.lock_as::<_, LOW>(comm, at.part, |m| (comm.layout() == at.layout).then(|| f(m))) {
                return r;
            }
        }
    }

    /// Runs `f` on every matching state of `comm` (one lock at a time) until it answers
    /// `true`; whether one did. A pass during which the layout moved on (receives and
    /// frames may have moved from a state not visited yet to one visited) is made again,
    /// under the new layout (state 0 alone under [`Layout::ONE`]).
    pub(crate) fn any_matching_state(&self, comm: &CommState, mut f: impl FnMut(&mut MatchState) -> bool) -> bool {
        loop {
            let layout = comm.layout();
            let n = if layout == Layout::ONE { 1 } else { self.matching_parts(comm) };
            if (0..n).any(|part| self.with_matching(comm, part, &mut f)) {
                return true;
            }
            if comm.layout() == layout {
                return false;
            }
        }
    }

    /// [`with_matching_low`](Self::with_matching_low) if `LOW`, else
    /// [`with_matching`](Self::with_matching).
    #[inline]
    fn lock_as<R, const LOW: bool>(&self, comm: &CommState, part: usize, f: impl FnOnce(&mut MatchState) -> R) -> R {
        if LOW {
            self.with_matching_low(comm, part, f)
        } else {
            self.with_matching(comm, part, f)
        }
    }

    /// Runs `f` with every tag partition of `comm` locked, taken in order (high priority),
    /// if the communicator is still matched per partition (`MatchingMode::PerComm`, not
    /// switched to one order, not freed): the trim of the processed-number windows and the
    /// switch. `None` otherwise.
    fn while_partitioned<R>(&self, comm: &CommState, f: impl FnOnce(&mut [&mut MatchState; TAG_PARTS]) -> R) -> Option<R> {
        fn lock_from<R>(
            locks: &[CachePadded<PathLock<MatchState>>],
            held: &mut [*mut MatchState; TAG_PARTS],
            i: usize,
            f: impl FnOnce(&mut [&mut MatchState; TAG_PARTS]) -> R,
        ) -> R {
            match locks.get(i) {
                Some(lock) => lock.high(|m| {
                    held[i] = m;
                    lock_from(locks, held, i + 1, f)
                }),
                None => {
                    // SAFETY: each pointer comes from a distinct lock held by an enclosing
                    // call of this recursion (so no two alias), valid until that call
                    // returns, after `f`.
                    let mut all: [&mut MatchState; TAG_PARTS] = std::array::from_fn(|j| unsafe { &mut *held[j] });
                    f(&mut all)
                }
            }
        }
        if comm.matching.len() != TAG_PARTS || self.config.matching != MatchingMode::PerComm {
            return None;
        }
        let mut held = [std::ptr::null_mut(); TAG_PARTS];
        // Checked again under every lock: a switch or `free` (which drains the queues; its
        // receives fail) may have come first.
        lock_from(&comm.matching, &mut held, 0, |parts| (!comm.is_switched() && !comm.is_freed()).then(|| f(parts)))
    }

    /// Switches this rank's matching of a partitioned communicator to one order
    /// (`MatchState::merge`), once: the first `Tag::Any` receive or probe, or a partition
    /// whose processed-number window would outgrow its bound. Returns the pairs the merge
    /// made, to be finished outside the locks ([`finish_matches`](Self::finish_matches)).
    #[cold]
    pub(crate) fn switch_to_one_order(&self, comm: &CommState) -> Matches {
        let mut out = Matches::default();
        self.while_partitioned(comm, |parts| {
            MatchState::merge(parts, &mut out);
            comm.set_layout(Layout::ONE);
        });
        out
    }

    /// Moves this rank's matching states of a partitioned communicator from
    /// [`Layout::BY_SOURCE`] to [`Layout::BY_TAG`] (`MatchState::by_tag`), once: the first
    /// `Source::Any` receive or probe with a tag. No pair is made: a source's receives and
    /// frames of one tag partition move together.
    #[cold]
    pub(crate) fn regroup_by_tag(&self, comm: &CommState) {
        self.while_partitioned(comm, |parts| {
            if comm.layout() == Layout::BY_SOURCE {
                MatchState::by_tag(parts);
                comm.set_layout(Layout::BY_TAG);
            }
        });
    }

    /// Before a receive or probe of `source` and `tag` on `comm`: the layout it needs (one
    /// order for `Tag::Any`, states by tag for `Source::Any`), if this rank's states are
    /// not laid out so yet.
    #[inline(always)]
    pub(crate) fn lay_out_for(&self, comm: &CommState, source: Source, tag: Tag) {
        if tag == Tag::Any || source == Source::Any {
            self.lay_out_for_wildcard(comm, source, tag);
        }
    }

    /// [`lay_out_for`](Self::lay_out_for) a wildcard receive or probe.
    #[cold]
    #[inline(never)]
    fn lay_out_for_wildcard(&self, comm: &CommState, source: Source, tag: Tag) {
        if tag == Tag::Any {
            if comm.needs_switch() {
                self.finish_matches(self.main_path(|| self.switch_to_one_order(comm)));
            }
        } else if source == Source::Any && comm.needs_by_tag() {
            self.main_path(|| self.regroup_by_tag(comm));
        }
    }

    /// Advances the processed-number windows of a partitioned communicator
    /// (`MatchState::trim`), which a partition asked for.
    #[cold]
    pub(crate) fn trim_partitions(&self, comm: &CommState) {
        self.while_partitioned(comm, |parts| MatchState::trim(parts));
    }

    /// Releases the frames a matching state dropped under forgotten tags (a failed
    /// collective's, `MatchState::forget`), which it asked for.
    #[cold]
    #[inline(never)]
    pub(crate) fn release_dropped(&self, comm: &CommState, part: usize) {
        for frame in self.with_matching_low(comm, part, MatchState::take_dropped) {
            self.release_frame(frame);
        }
    }

    /// Completes the receives of pairs made under a matching lock (outside it).
    pub(crate) fn finish_matches(&self, mut matched: Matches) {
        let Matches { frames, pairs } = &mut matched;
        for m in pairs.drain(..) {
            self.finish_match_in(0, m.req, &mut frames[m.at]);
        }
    }

    #[inline]
    fn global_slot<'a>(all: &'a mut Vec<Option<(u32, MatchState)>>, comm: &CommState) -> &'a mut MatchState {
        let slot = slot_of(comm.context);
        if slot >= all.len() {
            // Out of line: once per slot at most (slots are handed out lowest first).
            Self::grow_global(all, slot);
        }
        // A slot's queues belong to one generation: a later communicator in the slot starts
        // afresh (`free` leaves an empty state behind, and a pass that looked the freed one
        // up before may still come by).
        let cur = &mut all[slot];
        if !matches!(cur, Some((ctx, _)) if *ctx == comm.context) {
            *cur = Some((comm.context, MatchState::new(comm.size, comm.order())));
        }
        &mut cur.as_mut().expect("just set").1
    }

    #[cold]
    fn grow_global(all: &mut Vec<Option<(u32, MatchState)>>, slot: usize) {
        all.resize_with(slot + 1, || None);
    }

    /// Registers a communicator's state under its context id and replays early frames.
    pub(crate) fn install(&self, state: Arc<CommState>) -> Result<(), Error> {
        let ctx = state.context;
        let slot = slot_of(ctx);
        let raw = Arc::into_raw(state) as *mut CommState;
        if self.contexts.slots[slot].compare_exchange(std::ptr::null_mut(), raw, Ordering::AcqRel, Ordering::Acquire).is_err() {
            // SAFETY: `raw` came from `into_raw` just above and was not published.
            drop(unsafe { Arc::from_raw(raw) });
            return Err(Error::InvalidArgument("context id already in use"));
        }
        // Release, after publishing: see `is_stale`.
        self.contexts.generations[slot].fetch_max(generation_of(ctx) + 1, Ordering::Release);
        let replay: Vec<Frame> = {
            let mut early = self.contexts.early.lock();
            let (mine, rest): (Vec<Frame>, Vec<Frame>) = early.drain(..).partition(|f| f.header.context == ctx);
            *early = rest;
            mine
        };
        if !replay.is_empty() {
            // Outside a CRI lock: the gate keeps the looked-up state alive (`contexts`).
            let _gate = self.contexts.gate.read();
            for f in replay {
                let k = self.cri_for_thread();
                self.handle_frame(k, f);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{Assignment, Runtime};

    /// Every row of send sequence counters starts on a cache line of its own, whatever the
    /// communicator's size: threads sending on different channels never share a line.
    #[test]
    fn send_sequence_rows_start_on_cache_lines() {
        for size in [2, 3, 17] {
            let ranks =
                Runtime::builder().env(false).cris(4).assignment(Assignment::Dedicated).per_thread_order(true).build_local(size).unwrap();
            let st = ranks[0].world().p2p_state();
            assert!(st.chans > 1, "one channel per CRI and tag partition");
            for chan in 0..st.chans {
                let row = st.seq_counter(chan * st.seq_stride) as *const _ as usize;
                assert_eq!(row % 64, 0, "row {chan} of a communicator of {size} ranks");
            }
        }
    }
}
