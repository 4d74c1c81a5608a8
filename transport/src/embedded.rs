//! The embedded provider: every rank lives in this OS process.
//!
//! Each rank opens `k` CRIs; each CRI is a bounded lock-free inbox (an `Inbox`: many
//! producers, one consumer at a time) into which peers push frames. Sending copies the payload into the frame
//! (inline for small payloads, else into a buffer from the *sender's* pool, which the
//! receiver gives back after consuming it), so a send completes locally at once and no
//! allocation happens per message in steady state. A full inbox is flow control: the send is
//! refused with [`SendError::WouldBlock`] and the caller progresses before retrying — a
//! faster sender is slowed down, never loses a message, and never grows memory.
//!
//! RMA reads registered memory directly (all ranks share one address space). Every push
//! rings the destination rank's *doorbell* (an event-listener `Event`), which is how a parked
//! progress owner learns of network activity.
//!
//! Every RMA operation that may change a rank's window memory (put, atomic update, swapped
//! compare-and-swap) notifies, after the write, the [`Signal`] of each word it wrote
//! ([`EmbeddedRank::watch`]): a rank waiting for a word of its window (a distributed lock's
//! queue node) parks on it instead of polling, and is woken by the write.
//!
//! A fabric may simulate a machine hierarchy ([`LevelCost`], [`fabric_with_cost`]): ranks
//! grouped consecutively into nodes, nodes into racks, ..., and a delay added to every RMA
//! operation whose two ranks are in different elements of a level.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use weft_sync::Signal;

use crate::doorbell::Doorbell;
use crate::frame::{Frame, FrameKind, Header, Payload, INLINE};
use crate::loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::ring::Inbox;
use crate::{Error, SendError};

/// Most frames one CRI inbox may hold ([`EmbeddedOptions::inbox_capacity`]): 2^20, 64 MiB
/// of slots (a slot is one 64-byte line). A deeper inbox only delays flow control; a size
/// near `usize::MAX` could not even be counted.
pub const MAX_INBOX_CAPACITY: usize = 1 << 20;

/// Most inbox frames a fabric holds over all its ranks and CRIs (ranks x CRIs x inbox
/// capacity): 2^27, 8 GiB of slots. The check turns a size no machine can allocate (a
/// world of `u32::MAX` ranks) into an error instead of an aborted allocation.
pub const MAX_FABRIC_FRAMES: usize = 1 << 27;

/// Largest [`EmbeddedOptions::eager_capacity`] (64 MiB): the pooled eager buffers are
/// allocated at this capacity, and one of `usize::MAX` bytes cannot be.
pub const MAX_EAGER_CAPACITY: usize = 1 << 26;

// The error messages of `fabric` spell these limits out.
const _: () = assert!(MAX_INBOX_CAPACITY == 1_048_576 && MAX_FABRIC_FRAMES == 1 << 27 && MAX_EAGER_CAPACITY == 64 << 20);

/// Sizes of an embedded fabric.
#[derive(Clone, Copy, Debug)]
pub struct EmbeddedOptions {
    /// Number of ranks.
    pub ranks: u32,
    /// CRIs per rank.
    pub cris: usize,
    /// Frames each CRI inbox holds before senders are pushed back (1 to
    /// [`MAX_INBOX_CAPACITY`]).
    pub inbox_capacity: usize,
    /// Capacity of the eager buffers in the per-rank pools (the eager threshold; at most
    /// [`MAX_EAGER_CAPACITY`]).
    pub eager_capacity: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions { ranks: 1, cris: 1, inbox_capacity: 1024, eager_capacity: 16 * 1024 }
    }
}

/// Most levels of a [`LevelCost`] (nodes, racks, ...).
pub const MAX_SIM_LEVELS: usize = 4;

/// A simulated machine hierarchy with a cost per level crossing, for the RMA operations of
/// an embedded fabric: `sizes[0]` consecutive ranks form a node, `sizes[1]` consecutive
/// nodes a rack, ...; an RMA operation (put, get, atomic) between two ranks in different
/// elements of level `i` (different nodes for `i = 0`, different racks for `i = 1`) is
/// delayed by `cost_ns[i]`, and the delays of every level it crosses add up: with sizes
/// `[4, 2]` and costs `[100, 1000]`, rank 0 reaches rank 3 at no cost, rank 4 (another node
/// of its rack) at 100 ns, rank 8 (another rack) at 1,100 ns. A rank serves the crossing
/// operations that target it one at a time, as a network interface does: an operation
/// ends its cost after the end of the one before it at the same target, so that many ranks
/// hammering one word wait for each other. The issuing thread waits (spinning, yielding
/// for waits over 5 µs) before the access. Messages (frames) are not delayed. The default
/// crosses nothing at no cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LevelCost {
    /// Ranks spanned by one element of each level (the products of the sizes); 0 past the
    /// last level.
    span: [u64; MAX_SIM_LEVELS],
    cost_ns: [u64; MAX_SIM_LEVELS],
    depth: u8,
}

impl LevelCost {
    /// `sizes` innermost first (ranks per node, nodes per rack, ...) and the cost of
    /// crossing each level in nanoseconds; the lists have the same length, at most
    /// [`MAX_SIM_LEVELS`], every size at least 1 and every cost at most 1 s.
    pub fn new(sizes: &[u32], cost_ns: &[u64]) -> Result<Self, Error> {
        if sizes.len() != cost_ns.len() {
            return Err(Error::InvalidArgument("simulated levels: one crossing cost per level size is needed"));
        }
        if sizes.len() > MAX_SIM_LEVELS {
            return Err(Error::InvalidArgument("simulated levels: at most 4 levels"));
        }
        if sizes.contains(&0) {
            return Err(Error::InvalidArgument("simulated levels: a level has 0 elements per parent"));
        }
        if cost_ns.iter().any(|&c| c > 1_000_000_000) {
            return Err(Error::InvalidArgument("simulated levels: a crossing cost is over 1 s"));
        }
        let mut m = LevelCost { depth: sizes.len() as u8, ..LevelCost::default() };
        let mut span = 1u64;
        for (i, (&s, &c)) in sizes.iter().zip(cost_ns).enumerate() {
            span = span.saturating_mul(u64::from(s));
            m.span[i] = span;
            m.cost_ns[i] = c;
        }
        Ok(m)
    }

    /// The sizes and costs given to [`new`](Self::new).
    pub fn levels(&self) -> (Vec<u32>, Vec<u64>) {
        let d = self.depth as usize;
        let sizes = (0..d).map(|i| if i == 0 { self.span[0] } else { self.span[i] / self.span[i - 1].max(1) } as u32).collect();
        (sizes, self.cost_ns[..d].to_vec())
    }

    /// Whether any crossing costs anything.
    pub fn is_free(&self) -> bool {
        self.cost_ns.iter().all(|&c| c == 0)
    }

    /// The delay of an operation between ranks `a` and `b`, in nanoseconds.
    pub fn cost(&self, a: u32, b: u32) -> u64 {
        let (a, b) = (u64::from(a), u64::from(b));
        (0..self.depth as usize).filter(|&i| a / self.span[i] != b / self.span[i]).map(|i| self.cost_ns[i]).sum()
    }
}

impl fmt::Display for LevelCost {
    /// `sizes [4, 2], crossing costs [100, 1000] ns`, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.depth == 0 {
            return f.write_str("none");
        }
        let (sizes, costs) = self.levels();
        write!(
            f,
            "ranks per node, nodes per rack, ...: {sizes:?}; crossing cost per level: {costs:?} ns, served one at a time by the target"
        )
    }
}

/// Watch signals per rank: a word of a window notifies the one its key and index hash to.
const WATCH_SIGNALS: usize = 16;

/// The watch signal of word `word` (byte offset / 8) of window `key`.
#[inline]
fn watch_index(key: u64, word: usize) -> usize {
    (key as usize).wrapping_mul(5).wrapping_add(word) % WATCH_SIGNALS
}

/// One CRI's receive side.
struct CriSlot {
    /// Frames pushed by peers, consumed by whoever holds this CRI.
    inbox: Inbox<Packed>,
}

/// The mark of rank `r` among the producers an inbox refused: one bit per rank modulo 64
/// (ranks sharing a bit are all woken; a spurious wake-up costs one progress pass).
#[inline]
fn refusal_bit(r: u32) -> u64 {
    1 << (r % 64)
}

/// The envelope fields every frame carries (24 bytes).
#[derive(Clone, Copy)]
struct Envelope {
    context: u32,
    source: u32,
    tag: i32,
    seq: u32,
    gseq: u32,
    src_cri: u16,
    chan: u16,
}

/// The least capacity of a new pooled buffer (bytes).
const MIN_POOLED: usize = 256;

/// Payload bytes a slot holds in place ([`Packed::Inline`]); larger payloads go in a pooled
/// buffer. Less than [`INLINE`]: the envelope and these bytes fill the slot's line.
const SLOT_INLINE: usize = 24;

/// A frame as it waits in an inbox slot: 56 bytes, so that a slot with its stamp is one
/// cache line. A [`Frame`] is 104 bytes (the rendezvous fields next to the payload), and a
/// slot of two lines costs a second line transfer between the cores on every frame, each
/// way: streaming 96-byte items through an `Inbox` took 155 ns/item on the 2-core VM,
/// 56-byte items 35 ns (`ring::tests::stream_versus_array_queue`). The rendezvous fields
/// and the payload share the space: a frame with a payload carries none (its `len` is the
/// payload's length), and a frame without one carries them all but `addr`, which only a
/// provider fills in (RMA here needs no address: every rank shares one address space).
enum Packed {
    /// No payload: every header field but `addr`.
    Bare { kind: FrameKind, env: Envelope, len: u64, cookie: u64, key: u64 },
    /// Up to [`SLOT_INLINE`] bytes in the frame.
    Inline { kind: FrameKind, env: Envelope, n: u8, bytes: [u8; SLOT_INLINE] },
    /// A buffer from the sender's pool.
    Pooled { kind: FrameKind, env: Envelope, buf: Vec<u8> },
}

// The point of the type: stamp (8 bytes) + frame in one 64-byte line.
const _: () = assert!(std::mem::size_of::<Packed>() <= 56);

impl Packed {
    /// Whether `h` with `data.len()` payload bytes has a packed form: a frame with a payload
    /// carries no rendezvous fields and its `len` is the payload's, and no sender sets `addr`.
    #[inline]
    fn fits(h: &Header, data_len: usize) -> bool {
        h.addr == 0 && (data_len == 0 || (h.len == data_len as u64 && (h.cookie | h.key) == 0))
    }

    /// Packs `h` with `data` (which [`fits`](Self::fits)); a payload longer than
    /// [`SLOT_INLINE`] is copied into a buffer from `pool`.
    #[inline]
    fn pack(h: &Header, data: &[u8], pool: impl FnOnce() -> Vec<u8>) -> Packed {
        let env = Envelope { context: h.context, source: h.source, tag: h.tag, seq: h.seq, gseq: h.gseq, src_cri: h.src_cri, chan: h.chan };
        let kind = h.kind;
        if data.is_empty() {
            Packed::Bare { kind, env, len: h.len, cookie: h.cookie, key: h.key }
        } else if data.len() <= SLOT_INLINE {
            let mut bytes = [0u8; SLOT_INLINE];
            bytes[..data.len()].copy_from_slice(data);
            Packed::Inline { kind, env, n: data.len() as u8, bytes }
        } else {
            let mut buf = pool();
            buf.clear();
            buf.extend_from_slice(data);
            Packed::Pooled { kind, env, buf }
        }
    }

    /// The frame again, written at `dst`: each form writes its own fields there, where a
    /// returned frame merged the three forms through the stack first.
    ///
    /// # Safety
    /// `dst` is valid for a write of a `Frame` (whatever it held is overwritten, not dropped).
    #[inline]
    unsafe fn unpack_to(self, dst: *mut Frame) {
        let header = |kind: FrameKind, e: &Envelope, len: u64, cookie: u64, key: u64| Header {
            kind,
            src_cri: e.src_cri,
            context: e.context,
            source: e.source,
            tag: e.tag,
            seq: e.seq,
            gseq: e.gseq,
            chan: e.chan,
            len,
            cookie,
            key,
            addr: 0,
        };
        // Each arm writes its own frame (a frame merged from the three arms before one write
        // went through the stack: 15 instructions a message more).
        match self {
            Packed::Bare { kind, env, len, cookie, key } => {
                let frame = Frame { header: header(kind, &env, len, cookie, key), payload: Payload::Empty };
                // SAFETY: the caller's promise.
                unsafe { dst.write(frame) }
            }
            Packed::Inline { kind, env, n, bytes: b } => {
                let mut bytes = [0u8; INLINE];
                bytes[..SLOT_INLINE].copy_from_slice(&b);
                let frame = Frame { header: header(kind, &env, u64::from(n), 0, 0), payload: Payload::Inline { len: n, bytes } };
                // SAFETY: the caller's promise.
                unsafe { dst.write(frame) }
            }
            Packed::Pooled { kind, env, buf } => {
                let frame = Frame { header: header(kind, &env, buf.len() as u64, 0, 0), payload: Payload::Pooled(buf) };
                // SAFETY: the caller's promise.
                unsafe { dst.write(frame) }
            }
        }
    }

    /// The frame again.
    #[inline]
    fn unpack(self) -> Frame {
        let mut frame = std::mem::MaybeUninit::uninit();
        // SAFETY: `unpack_to` writes the whole frame.
        unsafe {
            self.unpack_to(frame.as_mut_ptr());
            frame.assume_init()
        }
    }
}

/// A registered memory region.
#[derive(Clone, Copy)]
struct Region {
    ptr: usize,
    len: usize,
    /// Registered as an RMA window (peers may write it), not as a rendezvous buffer.
    writable: bool,
}

/// Everything peers can reach of one rank.
struct RankSlot {
    /// The rank's CRIs.
    cris: Box<[CachePadded<CriSlot>]>,
    /// Rung on every push into any of this rank's inboxes.
    doorbell: Doorbell,
    /// Cleared when the rank closes; peers then fail with `PeerLost`.
    alive: AtomicBool,
    /// Eager buffers for this rank's sends; receivers give them back here.
    pool: ArrayQueue<Vec<u8>>,
    /// Memory registered for RMA, by key.
    regions: Mutex<HashMap<u64, Region>>,
    /// Next registration key.
    next_key: AtomicU64,
    /// Notified after an RMA operation wrote a word of this rank's windows
    /// ([`EmbeddedRank::watch`]).
    written: [Signal; WATCH_SIGNALS],
    /// When the last simulated crossing operation to this rank ends (nanoseconds since the
    /// fabric's epoch; [`LevelCost`]).
    served_until: CachePadded<std::sync::atomic::AtomicU64>,
}

impl RankSlot {
    /// Region `key` of this rank (`rank`), looked up under its registration lock (`regions`).
    /// A key that is gone because the rank closed meanwhile (a peer checks `alive` before it
    /// takes the lock; `close` clears the flag, then the table) is `PeerLost`, as it would
    /// have been a moment earlier, not an unknown key.
    fn region(&self, regions: &HashMap<u64, Region>, rank: u32, key: u64) -> Result<Region, Error> {
        match regions.get(&key) {
            Some(r) => Ok(*r),
            // Acquire: pairs with `close`'s release (the table was cleared after it).
            None if !self.alive.load(Ordering::Acquire) => Err(Error::PeerLost { rank }),
            None => Err(Error::InvalidArgument("unknown remote memory key")),
        }
    }
}

struct World {
    ranks: Box<[RankSlot]>,
    opts: EmbeddedOptions,
    /// The simulated hierarchy's delays of RMA operations.
    cost: LevelCost,
    /// The origin of the ranks' `served_until`.
    epoch: std::time::Instant,
    /// Bumped by every `close` (a rank lost to its peers).
    lost: AtomicU64,
}

/// Creates the ranks of an embedded fabric; hand one [`EmbeddedRank`] to each rank.
pub fn fabric(opts: EmbeddedOptions) -> Result<Vec<EmbeddedRank>, Error> {
    fabric_with_cost(opts, LevelCost::default())
}

/// [`fabric`], its RMA operations delayed as `cost` says for a simulated machine hierarchy.
pub fn fabric_with_cost(opts: EmbeddedOptions, cost: LevelCost) -> Result<Vec<EmbeddedRank>, Error> {
    if opts.ranks == 0 || opts.cris == 0 || opts.cris > u16::MAX as usize {
        return Err(Error::InvalidArgument("an embedded fabric needs >= 1 rank and 1..=65535 CRIs"));
    }
    if opts.inbox_capacity == 0 || opts.inbox_capacity > MAX_INBOX_CAPACITY {
        return Err(Error::InvalidArgument("inbox capacity must be in 1..=1048576 frames"));
    }
    if opts.eager_capacity > MAX_EAGER_CAPACITY {
        return Err(Error::InvalidArgument("eager capacity must be at most 64 MiB"));
    }
    // Checked: `ranks x cris x inbox_capacity` may not fit a `usize`.
    let frames = (opts.ranks as usize).checked_mul(opts.cris).and_then(|n| n.checked_mul(opts.inbox_capacity));
    if !frames.is_some_and(|n| n <= MAX_FABRIC_FRAMES) {
        return Err(Error::InvalidArgument("an embedded fabric holds at most 2^27 inbox frames: ranks x CRIs x inbox capacity is more"));
    }
    // Bounded by the check above (cris x inbox_capacity <= 2^27).
    let pool_cap = (opts.cris * opts.inbox_capacity * 2).clamp(64, 1 << 16);
    let ranks = (0..opts.ranks)
        .map(|_| RankSlot {
            cris: (0..opts.cris).map(|_| CachePadded::new(CriSlot { inbox: Inbox::new(opts.inbox_capacity) })).collect(),
            doorbell: Doorbell::new(),
            alive: AtomicBool::new(true),
            pool: ArrayQueue::new(pool_cap),
            regions: Mutex::new(HashMap::new()),
            next_key: AtomicU64::new(1),
            written: Default::default(),
            served_until: Default::default(),
        })
        .collect();
    let world = Arc::new(World { ranks, opts, cost, epoch: std::time::Instant::now(), lost: AtomicU64::new(0) });
    Ok((0..opts.ranks).map(|r| EmbeddedRank { world: world.clone(), rank: r }).collect())
}

/// One rank's view of an embedded fabric.
pub struct EmbeddedRank {
    world: Arc<World>,
    rank: u32,
}

impl fmt::Debug for EmbeddedRank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("embedded::EmbeddedRank").field("rank", &self.rank).field("size", &self.size()).finish()
    }
}

impl EmbeddedRank {
    /// This rank.
    #[inline]
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    #[inline]
    pub fn size(&self) -> u32 {
        self.world.opts.ranks
    }

    /// CRIs of every rank.
    #[inline]
    pub fn num_cris(&self) -> usize {
        self.world.opts.cris
    }

    /// The eager capacity: what a pooled buffer grows to when a payload larger than its
    /// first one needs it.
    pub fn eager_capacity(&self) -> usize {
        self.world.opts.eager_capacity
    }

    fn me(&self) -> &RankSlot {
        &self.world.ranks[self.rank as usize]
    }

    /// Sends one frame with `data` as payload to CRI `dst_cri` of rank `dst`. The payload is
    /// copied: the send is complete when this returns `Ok`.
    pub fn send(&self, dst: u32, dst_cri: usize, header: &Header, data: &[u8]) -> Result<(), SendError> {
        let peer = self.world.ranks.get(dst as usize).ok_or(SendError::PeerLost)?;
        // Acquire: pairs with `close`'s release; a closed peer must not get new frames.
        if !peer.alive.load(Ordering::Acquire) {
            return Err(SendError::PeerLost);
        }
        if !Packed::fits(header, data.len()) {
            return Err(SendError::Invalid(
                "a frame with a payload carries no rendezvous fields, its len is the payload's, and no sender sets addr",
            ));
        }
        // A compare instead of `%`: an integer division costs tens of cycles per frame.
        let n = self.world.opts.cris;
        let slot = &peer.cris[if dst_cri < n { dst_cri } else { dst_cri % n }];
        // Packed in the slot the push claims (no copy of the packed frame through the
        // stack), and only then: a refused frame takes no pooled buffer.
        let packed = || {
            Packed::pack(header, data, || {
                let mut buf = self.me().pool.pop().unwrap_or_default();
                if buf.capacity() < data.len() {
                    buf.clear();
                    // A new buffer is made for its first payload (most are small, and a frame in
                    // flight holds its buffer: at the eager capacity each, 1,024 ranks' first
                    // collectives took 580 MB); one that is too small grows once to the eager
                    // capacity, so that the pool's buffers stop growing.
                    let fresh = buf.capacity() == 0;
                    buf.reserve_exact(if fresh { data.len().max(MIN_POOLED) } else { self.world.opts.eager_capacity.max(data.len()) });
                }
                buf
            })
        };
        // A refused frame marks this rank in the inbox, so that whoever drains it rings our
        // doorbell (`poll`): a sender with frames deferred behind a full inbox is woken when
        // there is room, whether it is a parked thread or a pending task.
        match slot.inbox.push_with(packed).or_else(|packed| slot.inbox.refuse_with(refusal_bit(self.rank), packed)) {
            Ok(()) => {
                peer.doorbell.ring();
                Ok(())
            }
            Err(_) => Err(SendError::WouldBlock),
        }
    }

    /// Takes up to `max` frames from CRI `cri`'s inbox, handing each to `f`. Returns how many.
    ///
    /// The caller holds the CRI (its lock, in the runtime): one consumer at a time (a second
    /// concurrent caller gets 0 frames). Having made room, it rings the doorbells of the
    /// ranks this inbox refused (rare; a ring only notifies and schedules, it runs nothing of
    /// the woken side under the caller's lock).
    #[inline]
    pub fn poll(&self, cri: usize, max: usize, mut f: impl FnMut(Frame)) -> usize {
        self.pop(cri, max, |p| f(p.unpack()))
    }

    /// [`poll`](Self::poll) appending the frames to `frames`, each unpacked where it will lie
    /// (room for the batch is made first: nothing is allocated once `frames` has it).
    #[inline]
    pub fn poll_into(&self, cri: usize, max: usize, frames: &mut Vec<Frame>) -> usize {
        frames.reserve(max);
        // SAFETY: `reserve` made room for `max` more and at most `max` values come;
        // `unpack_to` writes a whole frame.
        self.pop(cri, max, |p| unsafe { Frame::append_in_place(frames, |slot| p.unpack_to(slot)) })
    }

    /// Takes up to `max` packed frames from CRI `cri`'s inbox, handing each to `f`, then
    /// rings the ranks the inbox refused (see [`poll`](Self::poll)). Returns how many.
    #[inline(always)]
    fn pop(&self, cri: usize, max: usize, f: impl FnMut(Packed)) -> usize {
        let inbox = &self.me().cris[cri].inbox;
        let n = inbox.pop_batch(max, f);
        if n > 0 {
            let refused = inbox.take_refused();
            if refused != 0 {
                self.wake_refused(refused);
            }
        }
        n
    }

    /// Rings room at the doorbells of the ranks a full inbox refused (`bits`, see
    /// `refusal_bit`): there is room now, and they may have nobody polling.
    #[cold]
    fn wake_refused(&self, bits: u64) {
        for (r, rank) in self.world.ranks.iter().enumerate() {
            if bits & refusal_bit(r as u32) != 0 {
                rank.doorbell.ring_room();
            }
        }
    }

    /// Whether CRI `cri` has frames waiting.
    #[inline]
    pub fn has_frames(&self, cri: usize) -> bool {
        self.me().cris[cri].inbox.has_next()
    }

    /// Whether any CRI of this rank has frames waiting.
    pub fn any_frames(&self) -> bool {
        self.me().cris.iter().any(|c| c.inbox.has_next())
    }

    /// Gives a consumed payload's buffer back to the pool of `source`, the rank that sent it.
    /// Inlined into every caller (the receive path's included, whatever else calls it: an
    /// inline payload's is no work at all).
    #[inline(always)]
    pub fn recycle(&self, source: u32, payload: Payload) {
        if let Payload::Pooled(buf) = payload {
            if let Some(r) = self.world.ranks.get(source as usize) {
                let _ = r.pool.push(buf);
            }
        }
    }

    /// The event rung on every frame pushed to this rank.
    pub fn doorbell(&self) -> &Doorbell {
        &self.me().doorbell
    }

    /// Registers `len` bytes at `ptr` for remote reads; returns the remote key.
    ///
    /// # Safety
    /// The memory must stay valid and unmodified until [`deregister`](Self::deregister) is
    /// called with the returned key.
    pub unsafe fn register(&self, ptr: *const u8, len: usize) -> u64 {
        let key = self.me().next_key.fetch_add(1, Ordering::Relaxed);
        self.me().regions.lock().insert(key, Region { ptr: ptr as usize, len, writable: false });
        key
    }

    /// Removes a registration. Waits for a remote read in progress on it (reads copy under
    /// the registration table's lock).
    pub fn deregister(&self, key: u64) {
        self.me().regions.lock().remove(&key);
    }

    /// RMA read: copies `dst.len()` bytes at `offset` of rank `src`'s region `key` into `dst`.
    pub fn read(&self, src: u32, key: u64, offset: usize, dst: &mut [u8]) -> Result<(), Error> {
        let peer = self.world.ranks.get(src as usize).ok_or(Error::RankOutOfRange { rank: src, size: self.size() })?;
        self.cross(src);
        if !peer.alive.load(Ordering::Acquire) {
            return Err(Error::PeerLost { rank: src });
        }
        let regions = peer.regions.lock();
        let region = peer.region(&regions, src, key)?;
        let end = offset.checked_add(dst.len()).ok_or(Error::InvalidArgument("remote read out of bounds"))?;
        if end > region.len {
            return Err(Error::InvalidArgument("remote read out of bounds"));
        }
        // SAFETY: the region was registered with the promise that `ptr..ptr+len` stays valid
        // until deregistered; deregistration takes the lock we hold, so it cannot happen
        // during the copy, and `offset..end` is inside the region. `dst` is a distinct
        // exclusive borrow, so the ranges do not overlap.
        unsafe { std::ptr::copy_nonoverlapping((region.ptr as *const u8).add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Registers `len` bytes at `ptr` as an RMA window that peers may read, write and
    /// update atomically; returns its key.
    ///
    /// # Safety
    /// The memory must stay valid until [`deregister`](Self::deregister); the owner must
    /// not hold Rust references into it while peers may write it.
    pub unsafe fn register_window(&self, ptr: *mut u8, len: usize) -> u64 {
        let key = self.me().next_key.fetch_add(1, Ordering::Relaxed);
        self.me().regions.lock().insert(key, Region { ptr: ptr as usize, len, writable: true });
        key
    }

    /// Runs `f` on `len` bytes at `offset` of rank `dst`'s region `key` (writable regions
    /// only when `write`), under that rank's registration lock.
    fn with_region<R>(&self, dst: u32, key: u64, offset: usize, len: usize, write: bool, f: impl FnOnce(*mut u8) -> R) -> Result<R, Error> {
        let peer = self.world.ranks.get(dst as usize).ok_or(Error::RankOutOfRange { rank: dst, size: self.size() })?;
        self.cross(dst);
        // Acquire: pairs with `close`'s release.
        if !peer.alive.load(Ordering::Acquire) {
            return Err(Error::PeerLost { rank: dst });
        }
        let regions = peer.regions.lock();
        let region = peer.region(&regions, dst, key)?;
        if write && !region.writable {
            return Err(Error::InvalidArgument("remote region is not a writable RMA window"));
        }
        let end = offset.checked_add(len).ok_or(Error::InvalidArgument("remote access out of bounds"))?;
        if end > region.len {
            return Err(Error::InvalidArgument("remote access out of bounds"));
        }
        // The pointer is only used inside `f`, while the lock keeps the region registered.
        Ok(f((region.ptr + offset) as *mut u8))
    }

    /// Delays an RMA operation to rank `peer` by the simulated cost of the levels it
    /// crosses ([`LevelCost`]; nothing without one).
    #[inline]
    fn cross(&self, peer: u32) {
        let cost = &self.world.cost;
        if cost.depth == 0 {
            return;
        }
        let ns = cost.cost(self.rank, peer);
        let Some(target) = self.world.ranks.get(peer as usize).filter(|_| ns > 0) else { return };
        // The target serves one crossing operation at a time: this one ends `ns` after the
        // later of now and the end of the one before it.
        let epoch = self.world.epoch;
        let now = epoch.elapsed().as_nanos() as u64;
        let order = std::sync::atomic::Ordering::Relaxed;
        let mut seen = target.served_until.load(order);
        let end = loop {
            let end = seen.max(now) + ns;
            match target.served_until.compare_exchange_weak(seen, end, order, order) {
                Ok(_) => break end,
                Err(s) => seen = s,
            }
        };
        loop {
            let left = end.saturating_sub(epoch.elapsed().as_nanos() as u64);
            match left {
                0 => break,
                // A long wait leaves the core to the other ranks' threads.
                1..=5_000 => std::hint::spin_loop(),
                _ => std::thread::yield_now(),
            }
        }
    }

    /// The model of the simulated machine hierarchy this fabric's RMA operations pay for.
    pub fn level_cost(&self) -> &LevelCost {
        &self.world.cost
    }

    /// The signal notified after an RMA operation (of any rank, this one included) wrote
    /// the 8-byte word at `offset` of rank `rank`'s window `key` (a put over it, an atomic
    /// update, a compare-and-swap that swapped); `None` for a rank outside the fabric. A
    /// signal serves several words (16 per rank): a waiter re-checks its word when woken.
    /// Wait as [`Signal`] says: listen, re-check the word, then wait.
    pub fn watch(&self, rank: u32, key: u64, offset: usize) -> Option<&Signal> {
        let slot = self.world.ranks.get(rank as usize)?;
        Some(&slot.written[watch_index(key, offset / 8)])
    }

    /// Notifies the watchers of the words `offset..offset + len` of rank `dst`'s window
    /// `key` (after the write).
    #[inline]
    fn written(&self, dst: u32, key: u64, offset: usize, len: usize) {
        let Some(slot) = self.world.ranks.get(dst as usize) else { return };
        let (first, last) = (offset / 8, (offset + len.max(1) - 1) / 8);
        // Each signal once: a long put notifies every one.
        for w in first..=last.min(first + WATCH_SIGNALS - 1) {
            slot.written[watch_index(key, w)].notify(usize::MAX);
        }
    }

    /// RMA write: copies `data` to `offset` of rank `dst`'s window `key`. Complete on return.
    pub fn put(&self, dst: u32, key: u64, offset: usize, data: &[u8]) -> Result<(), Error> {
        self.with_region(dst, key, offset, data.len(), true, |p| {
            // SAFETY: `p..p+len` lies inside a registered window (checked by `with_region`),
            // kept registered by the lock held during this call; `data` is a distinct borrow.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), p, data.len()) }
        })?;
        self.written(dst, key, offset, data.len());
        Ok(())
    }

    /// Atomic read-modify-write of the `u64` at `offset` of rank `dst`'s window `key`;
    /// returns the old value.
    pub fn fetch_op(&self, dst: u32, key: u64, offset: usize, op: crate::RmaOp, operand: u64) -> Result<u64, Error> {
        let old = self.with_region(dst, key, offset, 8, true, |p| {
            if p as usize % 8 != 0 {
                return Err(Error::InvalidArgument("atomic target is not 8-byte aligned"));
            }
            // SAFETY: 8 aligned bytes inside a registered window (checked above), valid for
            // the whole call; peers access it only through these atomics.
            let a = unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast()) };
            // AcqRel: an RMA atomic orders like a lock word (acquire what it reads, release
            // what it writes).
            let o = std::sync::atomic::Ordering::AcqRel;
            Ok(match op {
                crate::RmaOp::Sum => a.fetch_add(operand, o),
                crate::RmaOp::Read => a.load(std::sync::atomic::Ordering::Acquire),
                crate::RmaOp::Swap => a.swap(operand, o),
                crate::RmaOp::BitOr => a.fetch_or(operand, o),
                crate::RmaOp::BitAnd => a.fetch_and(operand, o),
                crate::RmaOp::Min => a.fetch_min(operand, o),
                crate::RmaOp::Max => a.fetch_max(operand, o),
            })
        })??;
        if op != crate::RmaOp::Read {
            self.written(dst, key, offset, 8);
        }
        Ok(old)
    }

    /// Atomic compare-and-swap of the `u64` at `offset` of rank `dst`'s window `key`;
    /// returns the old value (swapped if it equals `compare`).
    pub fn compare_swap(&self, dst: u32, key: u64, offset: usize, compare: u64, swap: u64) -> Result<u64, Error> {
        let old = self.with_region(dst, key, offset, 8, true, |p| {
            if p as usize % 8 != 0 {
                return Err(Error::InvalidArgument("atomic target is not 8-byte aligned"));
            }
            // SAFETY: as in `fetch_op`.
            let a = unsafe { std::sync::atomic::AtomicU64::from_ptr(p.cast()) };
            // AcqRel / Acquire: as in `fetch_op`.
            Ok(match a.compare_exchange(compare, swap, std::sync::atomic::Ordering::AcqRel, std::sync::atomic::Ordering::Acquire) {
                Ok(v) | Err(v) => v,
            })
        })??;
        if old == compare {
            self.written(dst, key, offset, 8);
        }
        Ok(old)
    }

    /// Whether rank `r` is still open.
    pub fn is_alive(&self, r: u32) -> bool {
        self.world.ranks.get(r as usize).is_some_and(|s| s.alive.load(Ordering::Acquire))
    }

    /// Closes this rank: peers' sends and reads to it fail with `PeerLost` from now on, and
    /// every rank's doorbell is rung so parked peers notice.
    pub fn close(&self) {
        // Release: pairs with the acquire loads in `send`/`read`/`is_alive`.
        if self.me().alive.swap(false, Ordering::AcqRel) {
            // Release: pairs with the acquire load in `lost_epoch`.
            self.world.lost.fetch_add(1, Ordering::Release);
        }
        self.me().regions.lock().clear();
        for r in self.world.ranks.iter() {
            r.doorbell.ring_all();
            // Ranks parked on a word re-check it, and learn of the loss.
            r.written.iter().for_each(|s| s.notify(usize::MAX));
        }
    }

    /// Changes whenever a rank of the fabric closes.
    pub fn lost_epoch(&self) -> u64 {
        // Acquire: pairs with the release increment in `close`.
        self.world.lost.load(Ordering::Acquire)
    }

    /// The header of a frame with no payload, for protocol replies.
    pub fn control_header(kind: FrameKind, src_cri: u16, source: u32, cookie: u64) -> Header {
        Header { kind, src_cri, context: 0, source, tag: 0, seq: 0, gseq: 0, chan: 0, len: 0, cookie, key: 0, addr: 0 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: FrameKind, len: u64, cookie: u64, key: u64, addr: u64) -> Header {
        Header {
            kind,
            src_cri: 3,
            context: 0x1234_5678,
            source: 0,
            tag: -7,
            seq: u32::MAX - 1,
            gseq: 0xfeed_0001,
            chan: 9,
            len,
            cookie,
            key,
            addr,
        }
    }

    /// A read that found its peer alive and then, under the registration lock, no longer
    /// finds the peer's region because the peer closed in between fails with `PeerLost`;
    /// a key the peer never registered is an unknown key.
    #[test]
    fn a_region_gone_with_its_closed_rank_is_peer_lost() {
        let eps = fabric(EmbeddedOptions { ranks: 2, cris: 1, inbox_capacity: 8, eager_capacity: 64 }).unwrap();
        let buf = [7u8; 16];
        // SAFETY: `buf` outlives every read below (the rank is closed before it goes).
        let key = unsafe { eps[0].register(buf.as_ptr(), buf.len()) };
        let slot = &eps[1].world.ranks[0];
        assert!(slot.region(&slot.regions.lock(), 0, key).is_ok());
        assert_eq!(slot.region(&slot.regions.lock(), 0, key + 1).err(), Some(Error::InvalidArgument("unknown remote memory key")));
        // The state a read meets when the close falls between its `alive` check and its lock.
        eps[0].close();
        assert_eq!(slot.region(&slot.regions.lock(), 0, key).err(), Some(Error::PeerLost { rank: 0 }));
        let mut dst = [0u8; 4];
        assert_eq!(eps[1].read(0, key, 0, &mut dst).unwrap_err(), Error::PeerLost { rank: 0 });
    }

    /// Every frame shape comes out of an inbox exactly as it went in: bare frames with all
    /// rendezvous fields, inline and pooled payloads (the slot holds a packed form).
    #[test]
    fn frames_cross_the_inbox_unchanged() {
        let eps = fabric(EmbeddedOptions { ranks: 2, cris: 2, inbox_capacity: 8, eager_capacity: 64 }).unwrap();
        let big: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        let cases: Vec<(Header, Vec<u8>)> = vec![
            (header(FrameKind::Rts, u64::MAX, 0xdead_beef_0000_0001, 42, 0), vec![]),
            (header(FrameKind::Fin, 1 << 40, 7, 0, 0), vec![]),
            (header(FrameKind::Eager, 0, 0, 0, 0), vec![]),
            (header(FrameKind::Eager, 1, 0, 0, 0), vec![0xab]),
            (header(FrameKind::Eager, SLOT_INLINE as u64, 0, 0, 0), (0..SLOT_INLINE as u8).collect()),
            (header(FrameKind::Eager, SLOT_INLINE as u64 + 1, 0, 0, 0), (0..=SLOT_INLINE as u8).collect()),
            (header(FrameKind::Eager, INLINE as u64 + 1, 0, 0, 0), (0..=INLINE as u8).collect()),
            (header(FrameKind::Eager, 200, 0, 0, 0), big),
        ];
        for (h, data) in &cases {
            eps[0].send(1, 1, h, data).unwrap();
            let mut got = Vec::new();
            assert_eq!(eps[1].poll(1, 8, |f| got.push(f)), 1);
            let f = got.pop().unwrap();
            assert_eq!(f.header, *h);
            assert_eq!(f.payload.as_slice(), &data[..]);
            eps[1].recycle(f.header.source, f.payload);
        }
    }

    /// `poll_into` appends what `poll` hands out: every frame shape unchanged, in order,
    /// after the frames already in the vector, at most `max` a call.
    #[test]
    fn poll_into_appends_frames_unchanged() {
        let eps = fabric(EmbeddedOptions { ranks: 2, cris: 1, inbox_capacity: 8, eager_capacity: 64 }).unwrap();
        let cases: Vec<(Header, Vec<u8>)> = vec![
            (header(FrameKind::Rts, u64::MAX, 0xdead_beef_0000_0001, 42, 0), vec![]),
            (header(FrameKind::Eager, 0, 0, 0, 0), vec![]),
            (header(FrameKind::Eager, SLOT_INLINE as u64, 0, 0, 0), (0..SLOT_INLINE as u8).collect()),
            (header(FrameKind::Eager, 200, 0, 0, 0), (0..200u32).map(|i| i as u8).collect()),
        ];
        for (h, data) in &cases {
            eps[0].send(1, 0, h, data).unwrap();
        }
        let already = Frame { header: header(FrameKind::Fin, 0, 0, 0, 0), payload: Payload::Empty };
        let mut got = vec![already];
        assert_eq!(eps[1].poll_into(0, 3, &mut got), 3);
        assert_eq!(eps[1].poll_into(0, 3, &mut got), 1);
        assert_eq!(eps[1].poll_into(0, 3, &mut got), 0);
        assert_eq!(got.len(), 1 + cases.len());
        assert_eq!(got[0].header.kind, FrameKind::Fin);
        for (f, (h, data)) in got.drain(1..).zip(&cases) {
            assert_eq!(f.header, *h);
            assert_eq!(f.payload.as_slice(), &data[..]);
            eps[1].recycle(f.header.source, f.payload);
        }
    }

    /// A frame with a payload has no room for rendezvous fields, and `addr` is the
    /// provider's to fill: refused, not truncated.
    #[test]
    fn payload_with_rendezvous_fields_is_refused() {
        let eps = fabric(EmbeddedOptions { ranks: 2, ..EmbeddedOptions::default() }).unwrap();
        assert!(matches!(eps[0].send(1, 0, &header(FrameKind::Rts, 3, 0, 5, 8), b""), Err(SendError::Invalid(_))));
        for h in [header(FrameKind::Eager, 3, 1, 0, 0), header(FrameKind::Eager, 2, 0, 0, 0), header(FrameKind::Rts, 3, 0, 5, 0)] {
            assert!(matches!(eps[0].send(1, 0, &h, b"abc"), Err(SendError::Invalid(_))));
        }
        assert!(!eps[1].has_frames(0));
    }

    /// Sizes no fabric can have are `InvalidArgument`, never a panic ("capacity overflow"
    /// from an inbox of `usize::MAX / 4` slots, an eager buffer of `usize::MAX` bytes at the
    /// first pooled send) or an allocation no machine can make (a world of `u32::MAX`
    /// ranks, or whose `ranks x CRIs x inbox capacity` overflows a `usize`).
    #[test]
    fn absurd_sizes_are_errors() {
        let refused = |opts: EmbeddedOptions| match fabric(opts) {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("{opts:?}: expected InvalidArgument, got {:?}", other.map(|e| e.len())),
        };
        let small = EmbeddedOptions { ranks: 2, cris: 1, inbox_capacity: 4, eager_capacity: 64 };
        for inbox_capacity in [0, MAX_INBOX_CAPACITY + 1, usize::MAX / 4, usize::MAX] {
            refused(EmbeddedOptions { inbox_capacity, ..small });
        }
        for eager_capacity in [MAX_EAGER_CAPACITY + 1, usize::MAX] {
            refused(EmbeddedOptions { eager_capacity, ..small });
        }
        for cris in [0, u16::MAX as usize + 1] {
            refused(EmbeddedOptions { cris, ..small });
        }
        refused(EmbeddedOptions { ranks: 0, ..small });
        refused(EmbeddedOptions { ranks: u32::MAX, ..small });
        // One more rank than the fabric-wide frame budget allows (nothing is allocated).
        refused(EmbeddedOptions {
            ranks: (MAX_FABRIC_FRAMES / MAX_INBOX_CAPACITY) as u32 + 1,
            inbox_capacity: MAX_INBOX_CAPACITY,
            ..small
        });
        // The product overflows a `usize`.
        refused(EmbeddedOptions { ranks: u32::MAX, cris: u16::MAX as usize, inbox_capacity: MAX_INBOX_CAPACITY, ..small });

        // The largest eager capacity is accepted, and a pooled send allocates its buffer.
        let eps = fabric(EmbeddedOptions { eager_capacity: MAX_EAGER_CAPACITY, ..small }).unwrap();
        let data = [7u8; 100];
        eps[0].send(1, 0, &header(FrameKind::Eager, data.len() as u64, 0, 0, 0), &data).unwrap();
        let mut got = Vec::new();
        assert_eq!(eps[1].poll(0, 4, |f| got.push(f)), 1);
        assert_eq!(got[0].payload.as_slice(), &data[..]);
    }

    /// The inboxes of one rank's CRIs are isolated: a frame sent to CRI `k` is seen and
    /// polled only on CRI `k` of the destination (not on its other CRIs, nor on the sender's
    /// own), and frames of one (sender rank, sender CRI) to one receiving CRI come out in the
    /// order they were sent — also when the senders of every CRI of two ranks push at once
    /// while the receiver polls, with inboxes small enough to refuse them at times.
    #[test]
    fn cri_inboxes_are_isolated_and_fifo_per_cri_pair() {
        const CRIS: usize = 3;
        /// A frame from CRI `src_cri` of rank `source`, addressed to CRI `dst` (in its tag),
        /// numbered `seq` among those of its (sender, receiving CRI) pair.
        fn frame(source: u32, src_cri: usize, dst: usize, seq: u32) -> Header {
            Header { src_cri: src_cri as u16, source, tag: dst as i32, seq, ..header(FrameKind::Eager, 0, 0, 0, 0) }
        }
        let eps = fabric(EmbeddedOptions { ranks: 3, cris: CRIS, inbox_capacity: 8, eager_capacity: 64 }).unwrap();
        let poll_all = |ep: &EmbeddedRank, cri: usize| {
            let mut got = Vec::new();
            ep.poll(cri, usize::MAX, |f| got.push(f.header));
            got
        };

        // One frame at a time, to each CRI in turn: only that CRI has it.
        for dst in [1, 0, 2] {
            eps[0].send(1, dst, &frame(0, 0, dst, 0), &[]).unwrap();
            for other in (0..CRIS).filter(|&c| c != dst) {
                assert!(!eps[1].has_frames(other), "a frame for CRI {dst} shows on CRI {other}");
                assert!(poll_all(&eps[1], other).is_empty(), "a frame for CRI {dst} was polled from CRI {other}");
            }
            assert!(!eps[0].any_frames() && !eps[2].any_frames(), "a frame for rank 1 reached another rank");
            assert!(eps[1].has_frames(dst));
            assert_eq!(poll_all(&eps[1], dst), vec![frame(0, 0, dst, 0)]);
            assert!(!eps[1].any_frames());
        }

        // Interleaved, one thread: every CRI pair keeps its order.
        for seq in 0..2 {
            for src_cri in 0..CRIS {
                for dst in 0..CRIS {
                    eps[0].send(1, dst, &frame(0, src_cri, dst, seq), &[]).unwrap();
                }
            }
        }
        for dst in 0..CRIS {
            let want: Vec<Header> = (0..2).flat_map(|seq| (0..CRIS).map(move |c| frame(0, c, dst, seq))).collect();
            assert_eq!(poll_all(&eps[1], dst), want, "CRI {dst}");
        }

        // Concurrent: a thread per sending CRI of ranks 0 and 2, each sending `N` frames to
        // every CRI of rank 1 in turn, retrying refusals (inbox of 8) while rank 1 polls.
        const N: u32 = 2000;
        let senders = [0u32, 2];
        std::thread::scope(|s| {
            for &rank in &senders {
                for src_cri in 0..CRIS {
                    let ep = &eps[rank as usize];
                    s.spawn(move || {
                        for seq in 0..N {
                            for dst in 0..CRIS {
                                while let Err(e) = ep.send(1, dst, &frame(rank, src_cri, dst, seq), &[]) {
                                    assert!(matches!(e, SendError::WouldBlock), "{e:?}");
                                    std::thread::yield_now();
                                }
                            }
                        }
                    });
                }
            }
            // (source, src_cri, dst) -> the sequence number the pair must show next.
            let mut next: HashMap<(u32, u16, usize), u32> = HashMap::new();
            let mut left = senders.len() * CRIS * CRIS * N as usize;
            while left > 0 {
                for dst in 0..CRIS {
                    eps[1].poll(dst, 16, |f| {
                        let h = f.header;
                        assert_eq!(h.tag, dst as i32, "a frame for CRI {} was polled from CRI {dst}", h.tag);
                        let want = next.entry((h.source, h.src_cri, dst)).or_insert(0);
                        assert_eq!(h.seq, *want, "rank {} CRI {} -> CRI {dst}: out of order", h.source, h.src_cri);
                        *want += 1;
                        left -= 1;
                    });
                }
            }
            assert!(!eps[0].any_frames() && !eps[2].any_frames(), "frames for rank 1 reached a sender");
        });
        assert!(!eps[1].any_frames());
    }

    /// A simulated hierarchy of 2 ranks per node, 2 nodes per rack: an RMA operation pays
    /// the cost of every level it crosses, busy-waited before the access; operations inside
    /// a node and messages pay nothing. Malformed models are errors.
    #[test]
    fn rma_operations_pay_for_the_levels_they_cross() {
        let m = LevelCost::new(&[2, 2], &[3_000_000, 20_000_000]).unwrap();
        assert_eq!(
            [m.cost(0, 1), m.cost(1, 2), m.cost(3, 4), m.cost(4, 7), m.cost(7, 4)],
            [0, 3_000_000, 23_000_000, 3_000_000, 3_000_000]
        );
        assert_eq!(m.levels(), (vec![2, 2], vec![3_000_000, 20_000_000]));
        assert!(m.to_string().contains("[2, 2]") && m.to_string().contains("[3000000, 20000000] ns"), "{m}");
        assert_eq!((LevelCost::default().cost(0, 9), LevelCost::default().to_string()), (0, "none".to_string()));
        for (sizes, costs) in [(&[2u32][..], &[1u64, 2][..]), (&[0], &[1]), (&[1, 1, 1, 1, 1], &[0, 0, 0, 0, 0]), (&[2], &[2_000_000_000])]
        {
            assert!(matches!(LevelCost::new(sizes, costs), Err(Error::InvalidArgument(_))), "{sizes:?} {costs:?}");
        }

        let eps = fabric_with_cost(EmbeddedOptions { ranks: 3, ..EmbeddedOptions::default() }, LevelCost::new(&[2], &[3_000_000]).unwrap())
            .unwrap();
        let mut words = [0u64; 3];
        // SAFETY: `words` outlives the fabric's use of it (deregistered below) and is only
        // reached through the fabric meanwhile.
        let key = unsafe { eps[2].register_window(words.as_mut_ptr().cast(), 24) };
        let t = std::time::Instant::now();
        eps[0].put(2, key, 0, &7u64.to_ne_bytes()).unwrap();
        eps[0].fetch_op(2, key, 8, crate::RmaOp::Sum, 1).unwrap();
        eps[0].compare_swap(2, key, 16, 0, 1).unwrap();
        eps[0].read(2, key, 0, &mut [0u8; 8]).unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(12), "4 operations across the node level: {:?}", t.elapsed());
        assert_eq!((eps[0].level_cost().cost(0, 1), eps[2].level_cost().cost(2, 2)), (0, 0));
        eps[2].deregister(key);
    }

    /// An RMA write notifies the signal of each word it wrote, after the write; a read or
    /// a compare-and-swap that did not swap notifies nothing.
    #[test]
    fn rma_writes_notify_their_words() {
        let eps = fabric(EmbeddedOptions { ranks: 2, ..EmbeddedOptions::default() }).unwrap();
        let mut words = [0u64; 4];
        // SAFETY: as in the test above.
        let key = unsafe { eps[1].register_window(words.as_mut_ptr().cast(), 32) };
        let notified = |op: &dyn Fn()| {
            let l = eps[0].watch(1, key, 24).unwrap().listen();
            op();
            l.wait_timeout(std::time::Duration::ZERO)
        };
        assert!(notified(&|| eps[0].put(1, key, 24, &1u64.to_ne_bytes()).unwrap()));
        assert!(notified(&|| eps[0].put(1, key, 0, &[0u8; 32]).unwrap()), "a put over the word");
        assert!(
            notified(&|| {
                eps[1].fetch_op(1, key, 24, crate::RmaOp::Sum, 1).unwrap();
            }),
            "its owner's own atomic"
        );
        assert!(notified(&|| {
            eps[0].compare_swap(1, key, 24, 1, 5).unwrap();
        }));
        assert!(
            !notified(&|| {
                eps[0].compare_swap(1, key, 24, 1, 6).unwrap();
            }),
            "no swap"
        );
        assert!(
            !notified(&|| {
                eps[0].fetch_op(1, key, 24, crate::RmaOp::Read, 0).unwrap();
            }),
            "a read"
        );
        assert!(eps[0].watch(2, key, 0).is_none(), "no such rank");
        eps[1].deregister(key);
    }

    /// A pooled buffer is made for its first payload, not at the eager capacity (a frame in
    /// flight holds it: thousands of small frames in flight cost their size, not 16 KiB
    /// each); one too small for a later payload grows once to the eager capacity, and the
    /// pool gives it back for the next frames.
    #[test]
    fn pooled_buffers_take_the_memory_their_payload_needs() {
        let eps = fabric(EmbeddedOptions { ranks: 2, eager_capacity: 16 * 1024, ..EmbeddedOptions::default() }).unwrap();
        let capacity_of_next = |len: usize| {
            let data = vec![7u8; len];
            eps[0].send(1, 0, &header(FrameKind::Eager, len as u64, 0, 0, 0), &data).unwrap();
            let mut got = Vec::new();
            eps[1].poll(0, 1, |f| got.push(f));
            let f = got.pop().unwrap();
            assert_eq!(f.payload.as_slice(), &data[..]);
            let cap = match &f.payload {
                Payload::Pooled(buf) => buf.capacity(),
                _ => panic!("{len} bytes: not pooled"),
            };
            eps[1].recycle(f.header.source, f.payload);
            cap
        };
        assert_eq!(capacity_of_next(100), MIN_POOLED, "a small payload's buffer");
        assert_eq!(capacity_of_next(200), MIN_POOLED, "the same buffer, again");
        assert_eq!(capacity_of_next(1000), 16 * 1024, "grown once to the eager capacity");
        assert_eq!(capacity_of_next(100), 16 * 1024, "kept at it");
    }

    /// Crossing operations to one target are served one at a time: two threads that each
    /// issue one at once take two costs together, not one.
    #[test]
    fn a_target_serves_crossing_operations_one_at_a_time() {
        let eps =
            fabric_with_cost(EmbeddedOptions { ranks: 3, ..EmbeddedOptions::default() }, LevelCost::new(&[1], &[20_000_000]).unwrap())
                .unwrap();
        let mut words = [0u64; 1];
        // SAFETY: as in `rma_operations_pay_for_the_levels_they_cross`.
        let key = unsafe { eps[2].register_window(words.as_mut_ptr().cast(), 8) };
        let t = std::time::Instant::now();
        std::thread::scope(|s| {
            for ep in &eps[..2] {
                s.spawn(move || ep.fetch_op(2, key, 0, crate::RmaOp::Sum, 1).unwrap());
            }
        });
        assert!(t.elapsed() >= std::time::Duration::from_millis(40), "served together: {:?}", t.elapsed());
        eps[2].deregister(key);
    }
}
