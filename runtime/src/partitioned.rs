//! Partitioned point-to-point (MPI 4.0 ch. 4): one message in `P` partitions that many
//! threads fill at once. [`Communicator::psend_init`] / [`Communicator::precv_init`] make
//! persistent requests; after [`start`](PartitionedSend::start) the sender hands out one
//! [`Partition`] per part ([`partitions`](PartitionedSend::partitions)), which a thread
//! fills and marks [`ready`](Partition::ready) (`MPI_Pready`); each partition travels as soon
//! as it is ready, not after the last one, and the receiver may read a partition as soon as
//! it has arrived ([`PartitionedRecv::parrived`], [`PartitionedRecv::partition`]).
//! [`owned_partitions`](PartitionedSend::owned_partitions) hands out [`OwnedPartition`]s
//! instead, `'static`, to move into pool tasks ([`Runtime::spawn`](crate::Runtime::spawn)):
//! each holds the operation's state (an `Arc`) and its range of the buffer.
//!
//! Partition `i` is a message of its own, on the communicator's collective context (never
//! matched by a user receive) under a tag made of the user's tag and `i`: it takes the eager
//! or the rendezvous path by its own size, and a receive posted at `start` lands it in place.
//! One operation per (communicator, peer, tag) is active at a time.
//!
//! From the second round on, a partition larger than an eager message is written straight
//! into the receive's buffer where the transport reaches the receiver's memory (the
//! embedded provider; libfabric's same-host lane, `process_vm_writev`), by the thread that
//! marks it ready, and its message is empty: it only says that the partition has arrived.
//! The receive lends its buffer for that: its layout message names the buffer's address,
//! and each start sends the send a *clear to write* naming the round; a partition readied
//! before that round's clear has arrived travels as a message, as in the first round. So no
//! partition needs a registration, a rendezvous read or a `Fin`, the copies run on the
//! filling threads (side by side, not one after another on the receiver's), and the
//! receiver handles one small message per partition. A receive dropped in a round leaves
//! that round's receives posted: its buffer is freed once every partition's message of the
//! round has arrived (each is sent after its write) or the sender is lost, and kept for good
//! if the communicator is freed or the runtime shut down before that (the send may still
//! write into it).
//!
//! The two sides may name different numbers of partitions, as MPI 4.0 allows, when their
//! messages have the same total bytes: the receive follows the send's partitions (a receive
//! per send partition, each into its place), and its partition `i` has arrived once every
//! send partition overlapping it has. Each side learns the other's layout once, in its first
//! round: the first start of each sends the peer a small message of its layout (the send its
//! partitions and total bytes, the receive its total bytes and element size), and until the
//! send's has arrived the receive posts nothing else (a partition that arrives meanwhile
//! waits in the unexpected queue, or for its rendezvous). Layouts that do not fit — other
//! totals, or send partitions that are not whole elements of the receive — fail the first
//! round's wait on both sides with [`PARTITIONS_MISMATCH`] and every later start; the
//! receive takes the send's partitions of that round and drops them, so neither side hangs.
//! A first-round send's wait therefore needs the receive started.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use weft_sync::Error;

use crate::buffer::{Primitive, RecvBuf, SendBuf};
use crate::comm::Communicator;
use crate::matching::{Source, Tag};
use crate::request::{unbound, Request};

/// Partitions of one operation at the most (the partition index takes 15 bits of the tag).
pub const MAX_PARTITIONS: usize = 1 << 15;
/// The largest tag of a partitioned operation (15 bits of the tag).
pub const MAX_PARTITIONED_TAG: i32 = (1 << 15) - 1;

/// The error of a partitioned send and receive whose layouts do not fit (other total bytes,
/// or send partitions that are not whole elements of the receive).
pub const PARTITIONS_MISMATCH: Error =
    Error::InvalidArgument("partitioned send and receive differ in total bytes, or a send partition is not whole receive elements");

/// The control messages of an operation (their kind in [`control_tag`]): the send's layout,
/// the receive's layout, the receive's clear to write of a round.
const SEND_LAYOUT: i32 = 0;
const RECV_LAYOUT: i32 = 1;
const CLEAR_TO_WRITE: i32 = 2;

/// The collective-context tag of control message `kind` of an operation with `tag`: above
/// the partitions' tags (`part_tag`), far below the collectives'.
fn control_tag(tag: i32, kind: i32) -> i32 {
    i32::MIN + (1 << 30) + ((tag << 2) | kind)
}

/// Whether a send of `parts` partitions, `send_bytes` in all, fits a receive of `recv_bytes`
/// of elements of `elem` bytes (both sides check the same).
fn layouts_fit(parts: u64, send_bytes: u64, recv_bytes: u64, elem: u64) -> Result<(), Error> {
    let per = send_bytes.checked_div(parts).unwrap_or(u64::MAX);
    if send_bytes == recv_bytes && parts > 0 && send_bytes % parts == 0 && elem > 0 && per % elem == 0 {
        Ok(())
    } else {
        Err(PARTITIONS_MISMATCH)
    }
}

/// The collective-context tag of partition `i` of an operation with `tag`: from `i32::MIN`
/// to `i32::MIN + 2^30`, far below the small negative tags of the collectives and of
/// communicator creation.
fn part_tag(tag: i32, i: usize) -> i32 {
    i32::MIN + ((tag << 15) | i as i32)
}

/// The buffer of a partitioned operation: the elements of a `Vec`, shared by the operation
/// and the sends or receives of its partitions in flight (each reads or fills only its own
/// range), so that it outlives them all, whoever is dropped first.
struct Shared<T> {
    ptr: *mut T,
    len: usize,
    cap: usize,
}

// SAFETY: the elements are `Primitive` (plain data); the accesses through the pointer are to
// disjoint ranges per partition, handed out one at a time (see `Partition`).
unsafe impl<T: Primitive> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T: Primitive> Sync for Shared<T> {}

impl<T> Shared<T> {
    fn new(v: Vec<T>) -> Arc<Self> {
        let mut v = std::mem::ManuallyDrop::new(v);
        Arc::new(Shared { ptr: v.as_mut_ptr(), len: v.len(), cap: v.capacity() })
    }
}

impl<T> Drop for Shared<T> {
    fn drop(&mut self) {
        // SAFETY: the parts of the `Vec` taken apart in `new`, put back together once.
        drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.cap) });
    }
}

/// Partition `range` of a shared buffer, as the bytes a send reads or a receive fills.
struct Part<T> {
    buf: Arc<Shared<T>>,
    start: usize,
    len: usize,
}

impl<T: Primitive> Part<T> {
    fn bytes(&self) -> (*mut u8, usize) {
        // SAFETY: `start + len <= buf.len` (checked when the partitions are cut).
        (unsafe { self.buf.ptr.add(self.start) }.cast(), self.len * std::mem::size_of::<T>())
    }
}

// SAFETY: the bytes are the partition's range of the shared allocation, which the `Arc`
// keeps alive (and in place) as long as this value; the range is not written while its send
// is in flight (the `Partition` handle that could write it was consumed by `ready`).
unsafe impl<T: Primitive> SendBuf for Part<T> {
    fn as_bytes(&self) -> &[u8] {
        let (p, n) = self.bytes();
        // SAFETY: see the impl's comment.
        unsafe { std::slice::from_raw_parts(p, n) }
    }
}

// SAFETY: the receive area is the partition's range, kept alive by the `Arc` and read by
// nobody until the receive completes (`PartitionedRecv::partition` checks completion).
unsafe impl<T: Primitive> RecvBuf for Part<T> {
    fn elem_size(&self) -> usize {
        std::mem::size_of::<T>().max(1)
    }
    fn spare(&mut self) -> (*mut u8, usize) {
        self.bytes()
    }
    unsafe fn filled(&mut self, _bytes: usize) {}
}

/// Checks a partitioned operation's arguments: `(elements per partition)`.
fn check_parts(len: usize, partitions: usize, tag: i32) -> Result<usize, Error> {
    if partitions == 0 || partitions > MAX_PARTITIONS {
        return Err(Error::InvalidArgument("partitions must be 1 to MAX_PARTITIONS"));
    }
    if len % partitions != 0 {
        return Err(Error::InvalidArgument("the buffer's length is not a whole number of partitions"));
    }
    if !(0..=MAX_PARTITIONED_TAG).contains(&tag) {
        return Err(Error::InvalidTag { tag, max: MAX_PARTITIONED_TAG });
    }
    Ok(len / partitions)
}

/// What a start of either side posts: the peer (a world rank), the tag, the partitions.
struct Plan {
    peer: u32,
    tag: i32,
    partitions: usize,
    per: usize,
}

/// The error of a start while active.
const ACTIVE: Error = Error::InvalidArgument("partitioned request started while active");
/// The error of a wait, a `partitions` or a `ready` while not started.
const INACTIVE: Error = Error::InvalidArgument("partitioned request not started");

/// A partitioned send (`MPI_Psend_init`): see the module docs.
///
/// ```
/// use weft::Runtime;
/// let ranks = Runtime::builder().env(false).build_local(2).unwrap();
/// let (a, b) = (ranks[0].world(), ranks[1].world());
/// let mut send = a.psend_init(vec![0u64; 4 * 256], 4, 1, 3).unwrap();
/// let mut recv = b.precv_init(vec![0u64; 4 * 256], 4, 0, 3).unwrap();
/// recv.start().unwrap();
/// send.start().unwrap();
/// std::thread::scope(|s| {
///     for mut p in send.partitions().unwrap() {
///         s.spawn(move || {
///             let i = p.index() as u64;
///             p.as_mut_slice().fill(i);
///             p.ready().unwrap();
///         });
///     }
/// });
/// recv.wait().unwrap();
/// send.wait().unwrap();
/// assert_eq!(recv.buffer().unwrap()[3 * 256], 3);
/// ```
pub struct PartitionedSend<'c, T: Primitive> {
    comm: &'c Communicator,
    plan: Plan,
    buf: Arc<Shared<T>>,
    /// Per partition, its send once ready (this round), shared with the handles.
    state: Arc<SendState<T>>,
    /// Started and not yet waited for.
    active: bool,
    /// The receive's layout message (`[total bytes, element size]`), posted at the first
    /// start, until the first wait checks it.
    layout: Option<Request<'c, Vec<u64>>>,
    /// Whether the receive's layout was checked (and fits).
    checked: bool,
    /// Layouts that do not fit: the error of every later start.
    failed: Option<Error>,
}

/// What a partitioned send shares with its partitions' handles: per partition its send once
/// ready, where this round's partitions may be written straight, and the communicator the
/// sends borrow.
struct SendState<T: Primitive> {
    /// The sends borrow `comm` (below): they come first, so they are dropped before it.
    slots: Vec<Slot<T>>,
    /// The receives of the receive's clears to write (borrowing `comm`, as the sends).
    clear: Mutex<Clears>,
    /// The receive's buffer address, from its layout message (0: not known yet).
    peer_buf: AtomicU64,
    /// This round's number, from 1 (a clear to write names the round it is for).
    round: AtomicU64,
    /// Where this round's partitions are written straight: the receive's buffer once this
    /// round's clear to write has arrived (0: not yet, or not at all: they are sent).
    direct: AtomicU64,
    /// The largest message sent eager (a partition up to it travels in one frame).
    eager: usize,
    /// In the `Arc`: its address never changes.
    comm: Communicator,
}

/// The receives of a partitioned send's clears to write.
struct Clears {
    /// This round's, until it arrives and is taken.
    now: Option<Request<'static, Vec<u64>>>,
    /// Those of earlier rounds that ended before theirs arrived: still posted, so that each
    /// takes its own round's clear (receives match in order) and none is left for a later
    /// round to take.
    late: Vec<Request<'static, Vec<u64>>>,
}

impl<T: Primitive> SendState<T> {
    /// Writes `part` straight into the receive's buffer if this round allows it (its clear
    /// to write has arrived, the partition is larger than an eager message and the
    /// transport reaches the receiver's memory): whether it did.
    fn write_direct(&self, dest: u32, part: &Part<T>) -> bool {
        let bytes = part.as_bytes();
        if bytes.len() <= self.eager {
            return false;
        }
        let to = self.clear_to_write();
        if to == 0 {
            return false;
        }
        let at = to + (part.start * std::mem::size_of::<T>()) as u64;
        // SAFETY: the receive lent its whole buffer, at `to`, for this round when it sent the
        // round's clear to write; it reads this partition's range only once the partition's
        // message (sent after this write) has arrived, and no other partition's write
        // reaches that range. A receive dropped in the round frees the buffer only once
        // every partition's message of the round has arrived, or this rank is lost to it.
        matches!(unsafe { self.comm.engine().transport.write_direct(dest, at, bytes) }, Some(Ok(())))
    }

    /// Where this round's partitions are written straight (0: not, or not yet): the
    /// round's clear to write, taken if it has arrived, else after one step of progress.
    fn clear_to_write(&self) -> u64 {
        if let Some(to) = self.take_clear() {
            return to;
        }
        // With no lock held: what the step completes may ready a partition of this send.
        let _ = self.comm.engine().progress_once();
        self.take_clear().unwrap_or(0)
    }

    /// The round's clear to write once known (where partitions go, 0 if not straight);
    /// `None` while it has not arrived. Threads that ask at once wait for the one that
    /// takes it: one that went on without it would send its partition as a message though
    /// the clear is there.
    fn take_clear(&self) -> Option<u64> {
        // Acquire: pairs with the release below (the clear was received before).
        let to = self.direct.load(Ordering::Acquire);
        if to != 0 {
            return Some(to);
        }
        let mut clear = self.clear.lock().unwrap_or_else(|e| e.into_inner());
        // Taken by another thread meanwhile (stored under the lock).
        let to = self.direct.load(Ordering::Relaxed);
        if to != 0 {
            return Some(to);
        }
        let Some(r) = clear.now.as_mut() else { return Some(0) };
        if !r.is_complete() {
            return None;
        }
        let round = self.round.load(Ordering::Relaxed);
        let to = match r.take() {
            Some(Ok((v, _))) if v[..] == [round] => self.peer_buf.load(Ordering::Relaxed),
            _ => 0,
        };
        clear.now = None;
        self.direct.store(to, Ordering::Release);
        Some(to)
    }
}

/// One partition's place in a [`SendState`].
struct Slot<T: Primitive> {
    /// Its send, once ready (this round).
    sent: Mutex<Option<Request<'static, Part<T>>>>,
    /// A handle to it is out (handed out, not yet ready nor dropped): it is not handed out
    /// again, so no two handles reach one range.
    out: AtomicBool,
}

impl<T: Primitive> Slot<T> {
    fn sent(&self) -> MutexGuard<'_, Option<Request<'static, Part<T>>>> {
        self.sent.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A partition handed out, borrowed ([`Partition`]) or owned ([`OwnedPartition`]).
struct Handle<T: Primitive> {
    index: usize,
    tag: i32,
    dest: u32,
    /// `None` once sent.
    part: Option<Part<T>>,
    state: Arc<SendState<T>>,
}

impl<T: Primitive> Handle<T> {
    fn as_mut_slice(&mut self) -> &mut [T] {
        let part = self.part.as_ref().expect("a handle's range until it is sent");
        // SAFETY: this handle alone reaches the range (its slot is marked out) until `ready`
        // consumes it.
        unsafe { std::slice::from_raw_parts_mut(part.buf.ptr.add(part.start), part.len) }
    }

    fn ready(mut self) -> Result<(), Error> {
        let mut part = self.part.take().expect("a handle's range until it is sent");
        let st = &*self.state;
        let c = &st.comm;
        let slot = &st.slots[self.index];
        if st.write_direct(self.dest, &part) {
            // In the receive's buffer already: an empty message says it has arrived.
            part.len = 0;
        }
        let req = match c.isend_on(c.coll_state(), part, self.dest, part_tag(self.tag, self.index)) {
            Ok(req) => req,
            Err(e) => {
                // Unsent: handed out again.
                slot.out.store(false, Ordering::Release);
                return Err(c.local_error(e));
            }
        };
        // SAFETY: `req` borrows `st.comm`, in the `Arc` with the slots, which are dropped
        // before it; a send taken out of a slot is dropped while its `PartitionedSend` (which
        // holds the `Arc`) lives.
        *slot.sent() = Some(unsafe { unbound(req) });
        slot.out.store(false, Ordering::Release);
        Ok(())
    }
}

impl<T: Primitive> Drop for Handle<T> {
    fn drop(&mut self) {
        // Dropped unsent (or its send failed): handed out again.
        if self.part.is_some() {
            self.state.slots[self.index].out.store(false, Ordering::Release);
        }
    }
}

/// One partition of an active [`PartitionedSend`]: fill it, then mark it
/// [`ready`](Self::ready). Partitions are disjoint, so each may go to a thread of its own.
pub struct Partition<'a, 'c, T: Primitive> {
    handle: Handle<T>,
    _send: PhantomData<&'a mut PartitionedSend<'c, T>>,
}

/// One partition of an active [`PartitionedSend`], owned (`'static`): to move into a pool
/// task or another thread that outlives the borrow of the send. Fill it, then mark it
/// [`ready`](Self::ready); dropped unsent, it is handed out again.
///
/// ```
/// use weft::Runtime;
/// let ranks = Runtime::builder().env(false).workers(2).build_local(2).unwrap();
/// let (a, b) = (ranks[0].world(), ranks[1].world());
/// let mut send = a.psend_init(vec![0u32; 4 * 64], 4, 1, 3).unwrap();
/// // The receive may cut the message otherwise: two partitions of 128 elements.
/// let mut recv = b.precv_init(vec![0u32; 4 * 64], 2, 0, 3).unwrap();
/// recv.start().unwrap();
/// send.start().unwrap();
/// let tasks: Vec<_> = send
///     .owned_partitions()
///     .unwrap()
///     .into_iter()
///     .map(|mut p| {
///         ranks[0].spawn(async move {
///             let i = p.index() as u32;
///             p.as_mut_slice().fill(i);
///             p.ready()
///         })
///     })
///     .collect();
/// for t in tasks {
///     ranks[0].block_on(t).unwrap().unwrap();
/// }
/// send.wait().unwrap();
/// recv.wait().unwrap();
/// assert_eq!(recv.buffer().unwrap()[3 * 64], 3);
/// ```
pub struct OwnedPartition<T: Primitive> {
    handle: Handle<T>,
}

impl<T: Primitive> std::fmt::Debug for PartitionedSend<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedSend").field("partitions", &self.plan.partitions).field("active", &self.active).finish()
    }
}

impl<T: Primitive> std::fmt::Debug for Partition<'_, '_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition").field("index", &self.handle.index).finish()
    }
}

impl<T: Primitive> std::fmt::Debug for OwnedPartition<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnedPartition").field("index", &self.handle.index).finish()
    }
}

impl<T: Primitive> std::fmt::Debug for PartitionedRecv<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedRecv").field("partitions", &self.plan.partitions).field("active", &!self.recvs.is_empty()).finish()
    }
}

impl Communicator {
    /// A partitioned send of `buf` in `partitions` equal parts to `dest` with `tag`
    /// (`MPI_Psend_init`), inactive. `tag` is at most [`MAX_PARTITIONED_TAG`], `partitions`
    /// at most [`MAX_PARTITIONS`] and divides `buf.len()`.
    pub fn psend_init<T: Primitive>(&self, buf: Vec<T>, partitions: usize, dest: u32, tag: i32) -> Result<PartitionedSend<'_, T>, Error> {
        let plan = self.plan(dest, buf.len(), partitions, tag)?;
        let slots = (0..partitions).map(|_| Slot { sent: Mutex::new(None), out: AtomicBool::new(false) }).collect();
        let state = Arc::new(SendState {
            slots,
            clear: Mutex::new(Clears { now: None, late: Vec::new() }),
            peer_buf: AtomicU64::new(0),
            round: AtomicU64::new(0),
            direct: AtomicU64::new(0),
            eager: self.engine().config.eager_threshold,
            comm: self.clone(),
        });
        Ok(PartitionedSend { comm: self, plan, buf: Shared::new(buf), state, active: false, layout: None, checked: false, failed: None })
    }

    /// A partitioned receive into `buf` in `partitions` equal parts from `source` with `tag`
    /// (`MPI_Precv_init`), inactive; the sender may name another number of partitions, of
    /// the same total bytes (see the module docs). No wildcards, as in MPI.
    pub fn precv_init<T: Primitive>(&self, buf: Vec<T>, partitions: usize, source: u32, tag: i32) -> Result<PartitionedRecv<'_, T>, Error> {
        let plan = self.plan(source, buf.len(), partitions, tag)?;
        Ok(PartitionedRecv {
            comm: self,
            plan,
            buf: Shared::new(buf),
            recvs: Vec::with_capacity(partitions),
            active: false,
            sender: None,
            layout: None,
            failed: None,
            dropped: Vec::new(),
            rounds: 0,
        })
    }

    /// Checks a partitioned operation's arguments (`len` elements) and plans it.
    fn plan(&self, peer: u32, len: usize, partitions: usize, tag: i32) -> Result<Plan, Error> {
        self.check(peer, 0)?;
        let per = check_parts(len, partitions, tag)?;
        Ok(Plan { peer: self.world_of(peer), tag, partitions, per })
    }
}

impl<'c, T: Primitive> PartitionedSend<'c, T> {
    /// Starts a round (`MPI_Start`): no partition is ready yet. An error if active, or if
    /// the first round found that the receive's layout does not fit.
    pub fn start(&mut self) -> Result<(), Error> {
        if self.active {
            return Err(ACTIVE);
        }
        if self.comm.is_freed() {
            return Err(Error::CommFreed);
        }
        if let Some(e) = self.failed {
            return Err(e);
        }
        if !self.checked && self.layout.is_none() {
            let c = self.comm;
            let (peer, tag) = (self.plan.peer, self.plan.tag);
            let mine = vec![self.plan.partitions as u64, (self.buf.len * std::mem::size_of::<T>()) as u64];
            // Not kept: a send dropped in flight finishes on its own.
            c.isend_on(c.coll_state(), mine, peer, control_tag(tag, SEND_LAYOUT)).map_err(|e| c.local_error(e))?;
            let theirs =
                c.irecv_on(c.coll_state(), Vec::<u64>::with_capacity(3), Source::Rank(peer), Tag::Is(control_tag(tag, RECV_LAYOUT)));
            self.layout = Some(theirs.map_err(|e| c.local_error(e))?);
        }
        self.post_clear()?;
        self.active = true;
        Ok(())
    }

    /// Posts the receive of this round's clear to write (every round, the first too, as the
    /// receive sends one at every start) and counts the round.
    fn post_clear(&mut self) -> Result<(), Error> {
        let st = &*self.state;
        let c = &st.comm;
        let (peer, tag) = (self.plan.peer, self.plan.tag);
        let mut clear = st.clear.lock().unwrap_or_else(|e| e.into_inner());
        let r = c.irecv_on(c.coll_state(), Vec::<u64>::with_capacity(1), Source::Rank(peer), Tag::Is(control_tag(tag, CLEAR_TO_WRITE)));
        let r = r.map_err(|e| c.local_error(e))?;
        clear.late.retain(|r| !r.is_complete());
        if let Some(old) = clear.now.take().filter(|r| !r.is_complete()) {
            clear.late.push(old);
        }
        // SAFETY: `r` borrows `st.comm`, in the `Arc` with `clear`, which is dropped before it.
        clear.now = Some(unsafe { unbound(r) });
        st.direct.store(0, Ordering::Relaxed);
        st.round.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Checks the receive's layout, once it has arrived (`got`).
    fn check_layout(&mut self, got: Result<(Vec<u64>, weft_sync::Status), Error>) -> Result<(), Error> {
        self.layout = None;
        let (v, _) = got?;
        let (parts, bytes) = (self.plan.partitions as u64, (self.buf.len * std::mem::size_of::<T>()) as u64);
        let fit = match v[..] {
            [total, elem, buf] => layouts_fit(parts, bytes, total, elem).map(|()| self.state.peer_buf.store(buf, Ordering::Relaxed)),
            _ => Err(PARTITIONS_MISMATCH),
        };
        match fit {
            Ok(()) => self.checked = true,
            Err(e) => self.failed = Some(e),
        }
        fit
    }

    /// The partitions of this round not yet marked ready, in index order (all of them after
    /// `start`; a handle dropped unsent is handed out again): each is filled and marked
    /// ready, by any thread. An error if not started.
    pub fn partitions(&mut self) -> Result<Vec<Partition<'_, 'c, T>>, Error> {
        Ok(self.handles()?.map(|handle| Partition { handle, _send: PhantomData }).collect())
    }

    /// [`partitions`](Self::partitions), owned: `'static` handles to move into pool tasks
    /// (those still out, owned and not yet ready, are not handed out again). An error if not
    /// started.
    pub fn owned_partitions(&mut self) -> Result<Vec<OwnedPartition<T>>, Error> {
        Ok(self.handles()?.map(|handle| OwnedPartition { handle }).collect())
    }

    /// Handles to the partitions of this round neither ready nor out, each marked out.
    fn handles(&mut self) -> Result<impl Iterator<Item = Handle<T>> + '_, Error> {
        if !self.active {
            return Err(INACTIVE);
        }
        let Plan { peer, tag, per, .. } = self.plan;
        // The round's clear to write, if it is here already: taken once, not by every thread.
        self.state.clear_to_write();
        let (buf, state) = (&self.buf, &self.state);
        Ok(state.slots.iter().enumerate().filter(|(_, slot)| slot.sent().is_none() && !slot.out.swap(true, Ordering::AcqRel)).map(
            move |(index, _)| Handle {
                index,
                tag,
                dest: peer,
                part: Some(Part { buf: buf.clone(), start: index * per, len: per }),
                state: state.clone(),
            },
        ))
    }

    /// Blocks until every partition was sent (`MPI_Wait`) and makes the request inactive:
    /// the first error among the partitions' sends. An error, and nothing waited for, if a
    /// partition of this round was not marked ready (its handle dropped unsent: get it again
    /// from [`partitions`](Self::partitions)).
    ///
    /// The first round's wait also waits for the receive's layout: an error
    /// ([`PARTITIONS_MISMATCH`]) if it does not fit, once the partitions' sends are done.
    pub fn wait(&mut self) -> Result<(), Error> {
        let mut sends = self.finish_round()?;
        let fit = match self.layout.take() {
            Some(mut l) => {
                crate::wait::wait_all(std::slice::from_mut(&mut l)).ok();
                self.check_layout(l.take().unwrap_or(Err(PARTITIONS_MISMATCH)))
            }
            None => Ok(()),
        };
        fit.and(crate::wait::wait_all(&mut sends))
    }

    /// [`wait`](Self::wait) as a future, for a task: resolves when every partition was sent.
    /// Dropped before that, it still ends the round (the sends finish in the background).
    pub async fn wait_async(&mut self) -> Result<(), Error> {
        let sends = self.finish_round()?;
        let fit = match self.layout.as_mut() {
            Some(l) => {
                let got = l.await;
                self.check_layout(got)
            }
            None => Ok(()),
        };
        fit.and(first_error(sends).await)
    }

    /// Ends the round: its sends, once every partition is ready (else an error, and the
    /// round goes on).
    fn finish_round(&mut self) -> Result<Vec<Request<'static, Part<T>>>, Error> {
        if !self.active {
            return Err(INACTIVE);
        }
        if self.state.slots.iter().any(|s| s.sent().is_none()) {
            return Err(Error::InvalidArgument("a partition was not marked ready"));
        }
        self.active = false;
        Ok(self.state.slots.iter().filter_map(|s| s.sent().take()).collect())
    }

    /// The whole buffer, while inactive (to fill it from one thread); `None` while active
    /// or while a send of the buffer is still in flight (a round whose wait failed).
    pub fn buffer_mut(&mut self) -> Option<&mut [T]> {
        if self.active {
            return None;
        }
        // Unique: no partition handle and no send in flight reaches the buffer.
        let b = Arc::get_mut(&mut self.buf)?;
        // SAFETY: the allocation of `len` elements, reached by nothing else.
        Some(unsafe { std::slice::from_raw_parts_mut(b.ptr, b.len) })
    }
}

/// The methods of a partition handle (a [`Handle`] in field `handle`).
macro_rules! partition_methods {
    () => {
        /// The partition's index.
        pub fn index(&self) -> usize {
            self.handle.index
        }

        /// The partition's elements, to fill.
        pub fn as_mut_slice(&mut self) -> &mut [T] {
            self.handle.as_mut_slice()
        }

        /// Marks the partition ready (`MPI_Pready`): it is sent now, whatever the other
        /// partitions' state.
        pub fn ready(self) -> Result<(), Error> {
            self.handle.ready()
        }
    };
}

impl<T: Primitive> Partition<'_, '_, T> {
    partition_methods!();
}

impl<T: Primitive> OwnedPartition<T> {
    partition_methods!();
}

/// A partitioned receive (`MPI_Precv_init`): see the module docs.
pub struct PartitionedRecv<'c, T: Primitive> {
    comm: &'c Communicator,
    plan: Plan,
    buf: Arc<Shared<T>>,
    /// The receives of the send's partitions this round (empty while inactive, and in the
    /// first round until the send's layout has arrived).
    recvs: Vec<Request<'c, Part<T>>>,
    /// Started and not yet waited for.
    active: bool,
    /// The send's layout, once known: its partitions, and elements of `T` in each.
    sender: Option<(usize, usize)>,
    /// The send's layout message (`[partitions, total bytes]`), posted at the first start.
    layout: Option<Request<'c, Vec<u64>>>,
    /// Layouts that do not fit: the error of the first round and every later start.
    failed: Option<Error>,
    /// The first round's partitions of a send that does not fit, taken and dropped.
    dropped: Vec<Request<'c, Vec<u8>>>,
    /// Rounds started (a clear to write names its round).
    rounds: u64,
}

impl<T: Primitive> Drop for PartitionedRecv<'_, T> {
    fn drop(&mut self) {
        // Dropped in a round: the send may still write partitions straight into the buffer
        // (lent to it for the round by the clear to write). The round's receives stay
        // posted, each holding its share of the buffer until its partition's message
        // arrives, which the send sends after the partition's write: once all have, no
        // write of the round is left. A receive that cannot say so keeps the buffer.
        if !self.active {
            return;
        }
        for r in &mut self.recvs {
            if r.can_continue().is_err() {
                // Its result taken (arrived), or awaited by a dropped `wait_async` (kept).
                if !r.is_complete() {
                    std::mem::forget(self.buf.clone());
                }
                continue;
            }
            let lent = Lent(Some(self.buf.clone()));
            // Checked above; refused all the same, `lent` keeps the buffer.
            let _ = r.continue_with(move |res| lent.end(&res));
        }
    }
}

/// One share of a dropped receive's buffer, held until its partition of the round has
/// arrived or its sender is lost; dropped otherwise (the communicator freed or the runtime
/// shut down first: the send may still write), it keeps the buffer for good.
struct Lent<T>(Option<Arc<Shared<T>>>);

impl<T> Lent<T> {
    /// The share's partition ended with `res`: the buffer is given back where no write of
    /// the round can follow.
    fn end<B>(mut self, res: &Result<B, Error>) {
        if matches!(res, Ok(_) | Err(Error::PeerLost { .. })) {
            self.0 = None;
        }
    }
}

impl<T> Drop for Lent<T> {
    fn drop(&mut self) {
        if let Some(buf) = self.0.take() {
            std::mem::forget(buf);
        }
    }
}

impl<'c, T: Primitive> PartitionedRecv<'c, T> {
    /// Starts a round (`MPI_Start`): posts the receive of every partition of the send, each
    /// into its place in the buffer (in the first round, once the send's layout has
    /// arrived). An error if active, or if the first round found that the send's layout does
    /// not fit.
    pub fn start(&mut self) -> Result<(), Error> {
        if self.active {
            return Err(ACTIVE);
        }
        if let Some(e) = self.failed {
            return Err(e);
        }
        let c = self.comm;
        let Plan { peer, tag, .. } = self.plan;
        if self.sender.is_none() && self.layout.is_none() {
            if c.is_freed() {
                return Err(Error::CommFreed);
            }
            let (bytes, elem) = ((self.buf.len * std::mem::size_of::<T>()) as u64, std::mem::size_of::<T>() as u64);
            let mine = vec![bytes, elem, self.buf.ptr as u64];
            // Not kept: a send dropped in flight finishes on its own.
            c.isend_on(c.coll_state(), mine, peer, control_tag(tag, RECV_LAYOUT)).map_err(|e| c.local_error(e))?;
            let theirs =
                c.irecv_on(c.coll_state(), Vec::<u64>::with_capacity(2), Source::Rank(peer), Tag::Is(control_tag(tag, SEND_LAYOUT)));
            self.layout = Some(theirs.map_err(|e| c.local_error(e))?);
        }
        if let Some((parts, per)) = self.sender {
            self.post(parts, per)?;
        }
        // The buffer is the send's to write from here until the round's wait: the clear to
        // write of this round. Not kept, as the layout.
        let clear = c.isend_on(c.coll_state(), vec![self.rounds + 1], peer, control_tag(tag, CLEAR_TO_WRITE));
        if let Err(e) = clear {
            // Dropping the receives posted cancels them: the round did not start.
            self.recvs.clear();
            return Err(c.local_error(e));
        }
        self.rounds += 1;
        self.active = true;
        self.learn_if_arrived();
        Ok(())
    }

    /// Posts the receives of the send's `parts` partitions of `per` elements.
    fn post(&mut self, parts: usize, per: usize) -> Result<(), Error> {
        let Plan { peer, tag, .. } = self.plan;
        for i in 0..parts {
            let part = Part { buf: self.buf.clone(), start: i * per, len: per };
            match self.comm.irecv_on(self.comm.coll_state(), part, Source::Rank(peer), Tag::Is(part_tag(tag, i))) {
                Ok(r) => self.recvs.push(r),
                Err(e) => {
                    // Dropping the receives posted cancels them: the round did not start.
                    self.recvs.clear();
                    return Err(self.comm.local_error(e));
                }
            }
        }
        Ok(())
    }

    /// Takes the send's layout if it has arrived (one step of progress if not).
    fn learn_if_arrived(&mut self) {
        if self.layout.as_mut().is_some_and(Request::test) {
            let got = self.layout.take().and_then(|mut l| l.take()).unwrap_or(Err(PARTITIONS_MISMATCH));
            self.learn(got);
        }
    }

    /// Learns the send's layout (`got`): posts this round's receives of its partitions, or,
    /// if it does not fit, receives of them to drop.
    fn learn(&mut self, got: Result<(Vec<u64>, weft_sync::Status), Error>) {
        self.layout = None;
        let (v, _) = match got {
            Ok(got) => got,
            Err(e) => {
                self.failed = Some(e);
                return;
            }
        };
        let [parts, bytes] = v[..] else {
            self.failed = Some(PARTITIONS_MISMATCH);
            return;
        };
        let size = std::mem::size_of::<T>() as u64;
        if let Err(e) = layouts_fit(parts, bytes, (self.buf.len as u64) * size, size) {
            self.failed = Some(e);
            let Plan { peer, tag, .. } = self.plan;
            let per = usize::try_from(bytes / parts.max(1)).unwrap_or(0);
            for i in 0..usize::try_from(parts).unwrap_or(0).min(MAX_PARTITIONS) {
                let (c, drop_into) = (self.comm, Vec::<u8>::with_capacity(per));
                if let Ok(r) = c.irecv_on(c.coll_state(), drop_into, Source::Rank(peer), Tag::Is(part_tag(tag, i))) {
                    self.dropped.push(r);
                }
            }
            return;
        }
        let (parts, per) = (parts as usize, (bytes / parts / size) as usize);
        self.sender = Some((parts, per));
        if let Err(e) = self.post(parts, per) {
            self.failed = Some(e);
        }
    }

    /// The send partitions that overlap partition `i` of this receive (`None` out of range or
    /// before the send's layout is known).
    fn overlapping(&self, i: usize) -> Option<std::ops::Range<usize>> {
        let (_, per_send) = self.sender?;
        let per = self.plan.per;
        if i >= self.plan.partitions {
            return None;
        }
        if per == 0 || per_send == 0 {
            return Some(0..0);
        }
        Some(i * per / per_send..((i + 1) * per).div_ceil(per_send))
    }

    /// Whether partition `i` has arrived (`MPI_Parrived`): every partition of the send that
    /// overlaps it has; makes one step of progress if not. `false` while inactive, for an
    /// index out of range, or when the layouts do not fit.
    pub fn parrived(&mut self, i: usize) -> bool {
        if !self.active {
            return false;
        }
        self.learn_if_arrived();
        if self.failed.is_some() || self.recvs.is_empty() {
            return false;
        }
        self.overlapping(i).is_some_and(|r| self.recvs[r].iter_mut().all(Request::test))
    }

    /// Partition `i`'s elements once it has arrived (`None` before, while inactive, out of
    /// range, or if a receive of it failed: [`wait`](Self::wait) says why).
    pub fn partition(&self, i: usize) -> Option<&[T]> {
        if !self.active || self.failed.is_some() || self.recvs.is_empty() {
            return None;
        }
        let sends = self.overlapping(i)?;
        self.recvs[sends].iter().all(|r| matches!(r.outcome(), Some(Ok(_)))).then(|| {
            let per = self.plan.per;
            // SAFETY: the receives of this range completed (acquire in `outcome`) and nothing
            // writes it again this round.
            unsafe { std::slice::from_raw_parts(self.buf.ptr.add(i * per), per) }
        })
    }

    /// Blocks until every partition has arrived (`MPI_Wait`) and makes the request
    /// inactive: the first error among the partitions' receives, or
    /// [`PARTITIONS_MISMATCH`] (once the send's partitions were dropped). An error if not
    /// started.
    pub fn wait(&mut self) -> Result<(), Error> {
        if !self.active {
            return Err(INACTIVE);
        }
        if let Some(mut l) = self.layout.take() {
            crate::wait::wait_all(std::slice::from_mut(&mut l)).ok();
            self.learn(l.take().unwrap_or(Err(PARTITIONS_MISMATCH)));
        }
        let res = match self.failed {
            Some(e) => {
                crate::wait::wait_all(&mut self.dropped).ok();
                Err(e)
            }
            None => crate::wait::wait_all(&mut self.recvs),
        };
        self.end_round();
        res
    }

    /// [`wait`](Self::wait) as a future, for a task: resolves when every partition has
    /// arrived. Dropped before that, the round goes on (a later wait finishes it).
    pub async fn wait_async(&mut self) -> Result<(), Error> {
        if !self.active {
            return Err(INACTIVE);
        }
        if let Some(l) = self.layout.as_mut() {
            let got = l.await;
            self.learn(got);
        }
        let res = match self.failed {
            Some(e) => {
                first_error(self.dropped.iter_mut().filter(|r| r.is_live())).await.ok();
                Err(e)
            }
            None => first_error(self.recvs.iter_mut().filter(|r| r.is_live())).await,
        };
        self.end_round();
        res
    }

    fn end_round(&mut self) {
        self.recvs.clear();
        self.dropped.clear();
        self.active = false;
    }

    /// The whole buffer, while inactive (the last round's message); `None` while active or
    /// while a receive into it is still in flight (a start that failed part way).
    pub fn buffer(&self) -> Option<&[T]> {
        // SAFETY: inactive and the only holder of the allocation: nothing writes it.
        (!self.active && Arc::strong_count(&self.buf) == 1).then(|| unsafe { std::slice::from_raw_parts(self.buf.ptr, self.buf.len) })
    }
}

/// Awaits every request of `reqs` in turn: the first error among them.
async fn first_error<B: Send + 'static, F: std::future::Future<Output = Result<(B, weft_sync::Status), Error>>>(
    reqs: impl IntoIterator<Item = F>,
) -> Result<(), Error> {
    let mut first = Ok(());
    for r in reqs {
        if let Err(e) = r.await {
            first = first.and(Err(e));
        }
    }
    first
}
