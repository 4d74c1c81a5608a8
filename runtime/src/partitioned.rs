//! Partitioned point-to-point (MPI 4.0 ch. 4): one message in `P` partitions that many
//! threads fill at once. [`Communicator::psend_init`] / [`Communicator::precv_init`] make
//! persistent requests; after [`start`](PartitionedSend::start) the sender hands out one
//! [`Partition`] per part ([`partitions`](PartitionedSend::partitions)), which a thread
//! fills and marks [`ready`](Partition::ready) (`MPI_Pready`); each partition travels as soon
//! as it is ready, not after the last one, and the receiver may read a partition as soon as
//! it has arrived ([`PartitionedRecv::parrived`], [`PartitionedRecv::partition`]).
//!
//! Partition `i` is a message of its own, on the communicator's collective context (never
//! matched by a user receive) under a tag made of the user's tag and `i`: it takes the eager
//! or the rendezvous path by its own size, and a receive posted at `start` lands it in place.
//! Both sides name the same number of partitions (MPI allows them to differ; weft does not),
//! and one operation per (communicator, peer, tag) is active at a time.

use std::sync::{Arc, Mutex};

use weft_sync::Error;

use crate::buffer::{Primitive, RecvBuf, SendBuf};
use crate::comm::Communicator;
use crate::matching::{Source, Tag};
use crate::request::Request;

/// Partitions of one operation at the most (the partition index takes 15 bits of the tag).
pub const MAX_PARTITIONS: usize = 1 << 15;
/// The largest tag of a partitioned operation (15 bits of the tag).
pub const MAX_PARTITIONED_TAG: i32 = (1 << 15) - 1;

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
    /// Per partition, its send once ready (this round).
    sends: Vec<Mutex<Option<Request<'c, Part<T>>>>>,
    /// Started and not yet waited for.
    active: bool,
}

/// One partition of an active [`PartitionedSend`]: fill it, then mark it
/// [`ready`](Self::ready). Partitions are disjoint, so each may go to a thread of its own.
pub struct Partition<'a, 'c, T: Primitive> {
    comm: &'c Communicator,
    index: usize,
    tag: i32,
    dest: u32,
    part: Part<T>,
    slot: &'a Mutex<Option<Request<'c, Part<T>>>>,
}

impl<T: Primitive> std::fmt::Debug for PartitionedSend<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedSend").field("partitions", &self.plan.partitions).field("active", &self.active).finish()
    }
}

impl<T: Primitive> std::fmt::Debug for Partition<'_, '_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition").field("index", &self.index).field("len", &self.part.len).finish()
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
        let sends = (0..partitions).map(|_| Mutex::new(None)).collect();
        Ok(PartitionedSend { comm: self, plan, buf: Shared::new(buf), sends, active: false })
    }

    /// A partitioned receive into `buf` in `partitions` equal parts from `source` with `tag`
    /// (`MPI_Precv_init`), inactive; the sender names the same number of partitions. No
    /// wildcards, as in MPI.
    pub fn precv_init<T: Primitive>(&self, buf: Vec<T>, partitions: usize, source: u32, tag: i32) -> Result<PartitionedRecv<'_, T>, Error> {
        let plan = self.plan(source, buf.len(), partitions, tag)?;
        Ok(PartitionedRecv { comm: self, plan, buf: Shared::new(buf), recvs: Vec::with_capacity(partitions) })
    }

    /// Checks a partitioned operation's arguments (`len` elements) and plans it.
    fn plan(&self, peer: u32, len: usize, partitions: usize, tag: i32) -> Result<Plan, Error> {
        self.check(peer, 0)?;
        let per = check_parts(len, partitions, tag)?;
        Ok(Plan { peer: self.world_of(peer), tag, partitions, per })
    }
}

impl<'c, T: Primitive> PartitionedSend<'c, T> {
    /// Starts a round (`MPI_Start`): no partition is ready yet. An error if active.
    pub fn start(&mut self) -> Result<(), Error> {
        if self.active {
            return Err(ACTIVE);
        }
        if self.comm.is_freed() {
            return Err(Error::CommFreed);
        }
        self.active = true;
        Ok(())
    }

    /// The partitions of this round not yet marked ready, in index order (all of them after
    /// `start`; a handle dropped unsent is handed out again): each is filled and marked
    /// ready, by any thread. An error if not started.
    pub fn partitions(&mut self) -> Result<Vec<Partition<'_, 'c, T>>, Error> {
        if !self.active {
            return Err(INACTIVE);
        }
        let Plan { peer, tag, per, .. } = self.plan;
        let comm = self.comm;
        let buf = &self.buf;
        Ok(self
            .sends
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.lock().unwrap_or_else(|e| e.into_inner()).is_none())
            .map(|(index, slot)| Partition {
                comm,
                index,
                tag,
                dest: peer,
                part: Part { buf: buf.clone(), start: index * per, len: per },
                slot,
            })
            .collect())
    }

    /// Blocks until every partition was sent (`MPI_Wait`) and makes the request inactive:
    /// the first error among the partitions' sends. An error, and nothing waited for, if a
    /// partition of this round was not marked ready (its handle dropped unsent: get it again
    /// from [`partitions`](Self::partitions)).
    pub fn wait(&mut self) -> Result<(), Error> {
        let mut sends = self.finish_round()?;
        crate::wait::wait_all(&mut sends)
    }

    /// [`wait`](Self::wait) as a future, for a task: resolves when every partition was sent.
    /// Dropped before that, it still ends the round (the sends finish in the background).
    pub async fn wait_async(&mut self) -> Result<(), Error> {
        let sends = self.finish_round()?;
        first_error(sends).await
    }

    /// Ends the round: its sends, once every partition is ready (else an error, and the
    /// round goes on).
    fn finish_round(&mut self) -> Result<Vec<Request<'c, Part<T>>>, Error> {
        if !self.active {
            return Err(INACTIVE);
        }
        let slot = |s: &Mutex<Option<Request<'c, Part<T>>>>| s.lock().unwrap_or_else(|e| e.into_inner()).take();
        if self.sends.iter().any(|s| s.lock().unwrap_or_else(|e| e.into_inner()).is_none()) {
            return Err(Error::InvalidArgument("a partition was not marked ready"));
        }
        self.active = false;
        Ok(self.sends.iter().filter_map(slot).collect())
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

impl<T: Primitive> Partition<'_, '_, T> {
    /// The partition's index.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The partition's elements, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: this handle alone reaches the range until `ready` consumes it.
        unsafe { std::slice::from_raw_parts_mut(self.part.buf.ptr.add(self.part.start), self.part.len) }
    }

    /// Marks the partition ready (`MPI_Pready`): it is sent now, whatever the other
    /// partitions' state.
    pub fn ready(self) -> Result<(), Error> {
        let tag = part_tag(self.tag, self.index);
        let req = self.comm.isend_on(self.comm.coll_state(), self.part, self.dest, tag).map_err(|e| self.comm.local_error(e))?;
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(req);
        Ok(())
    }
}

/// A partitioned receive (`MPI_Precv_init`): see the module docs.
pub struct PartitionedRecv<'c, T: Primitive> {
    comm: &'c Communicator,
    plan: Plan,
    buf: Arc<Shared<T>>,
    /// The partitions' receives this round (empty while inactive).
    recvs: Vec<Request<'c, Part<T>>>,
}

impl<'c, T: Primitive> PartitionedRecv<'c, T> {
    /// Starts a round (`MPI_Start`): posts the receive of every partition, each into its
    /// place in the buffer. An error if active.
    pub fn start(&mut self) -> Result<(), Error> {
        if !self.recvs.is_empty() {
            return Err(ACTIVE);
        }
        let Plan { peer, tag, partitions, per } = self.plan;
        for i in 0..partitions {
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

    /// Whether partition `i` has arrived (`MPI_Parrived`), making one step of progress if
    /// not; `false` while inactive or for an index out of range.
    pub fn parrived(&mut self, i: usize) -> bool {
        self.recvs.get_mut(i).is_some_and(Request::test)
    }

    /// Partition `i`'s elements once it has arrived (`None` before, while inactive, out of
    /// range, or if its receive failed: [`wait`](Self::wait) says why).
    pub fn partition(&self, i: usize) -> Option<&[T]> {
        let r = self.recvs.get(i)?;
        matches!(r.outcome(), Some(Ok(_))).then(|| {
            let per = self.plan.per;
            // SAFETY: the receive of this range completed (acquire in `outcome`) and nothing
            // writes it again this round.
            unsafe { std::slice::from_raw_parts(self.buf.ptr.add(i * per), per) }
        })
    }

    /// Blocks until every partition has arrived (`MPI_Wait`) and makes the request
    /// inactive: the first error among the partitions' receives. An error if not started.
    pub fn wait(&mut self) -> Result<(), Error> {
        if self.recvs.is_empty() {
            return Err(INACTIVE);
        }
        let res = crate::wait::wait_all(&mut self.recvs);
        self.recvs.clear();
        res
    }

    /// [`wait`](Self::wait) as a future, for a task: resolves when every partition has
    /// arrived. Dropped before that, the round goes on (a later wait finishes it).
    pub async fn wait_async(&mut self) -> Result<(), Error> {
        if self.recvs.is_empty() {
            return Err(INACTIVE);
        }
        let res = first_error(self.recvs.iter_mut().filter(|r| r.is_live())).await;
        self.recvs.clear();
        res
    }

    /// The whole buffer, while inactive (the last round's message); `None` while active or
    /// while a receive into it is still in flight (a start that failed part way).
    pub fn buffer(&self) -> Option<&[T]> {
        // SAFETY: inactive and the only holder of the allocation: nothing writes it.
        (self.recvs.is_empty() && Arc::strong_count(&self.buf) == 1)
            .then(|| unsafe { std::slice::from_raw_parts(self.buf.ptr, self.buf.len) })
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
