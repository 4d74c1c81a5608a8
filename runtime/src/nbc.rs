//! The machinery of the collectives: a collective is a *schedule* of point-to-point steps on
//! the communicator's collective context, written as an `async` function over a [`Sched`]
//! (its exchanges are awaited in order), as MPICH builds its NBC schedules.
//!
//! A nonblocking collective ([`Communicator::start_collective`]) boxes that future into an
//! `engine::Schedule`: the calling thread takes its first steps, and the progress passes of
//! any thread of the rank take the next ones as the steps' messages complete
//! (`engine/schedules.rs`); no thread is spent per collective. The user's handle is an
//! ordinary [`Request`], completed when the schedule ends, so it is a `Future`, waits with
//! [`wait_all`](crate::wait_all), attaches to a sync object. A blocking collective starts
//! the same schedule and waits for its request.
//!
//! Each collective call on a communicator takes the next number of its sequence, and its
//! messages travel under a tag of that number: collectives outstanding at once on one
//! communicator never take each other's messages, and MPI's rule that every rank calls the
//! collectives of a communicator in the same order makes the numbers agree. (The reductions
//! of communicator creation, whose members may be a subset of the communicator's, use fixed
//! tags instead, `create.rs`, and take no number.)
//!
//! A small blocking collective, and a blocking gather, scatter, allgather or alltoall, skips
//! the schedule ([`Communicator::run_direct`]): the calling thread writes the algorithm's
//! plan of steps (`coll_steps.rs`) into storage it keeps (or keeps the plan of its last call,
//! when that was the same collective on the same members), then posts each step's messages
//! and tests them between progress passes itself, as a blocking receive waits, in scratch
//! buffers it keeps: a schedule's boxed future, its request and
//! operation, its polls on every progress pass and its allocations per step cost a small
//! collective several times the instructions of its messages.
//!
//! A schedule that fails (a peer lost, a rank that passed a different length) tells every
//! other member under the sequence number's second tag, where each member's schedule posted
//! a receive when it started: a member waiting for a rank that failed, and not for the lost
//! peer itself, fails too instead of waiting forever.
//!
//! A collective that failed on a rank, or whose schedule was dropped unfinished, leaves
//! messages no receive will take: its peers' steps and failure notices sent before they
//! learnt of the failure. Each call's tags being new, nothing would ever match them, and
//! after [`SEQ_SPAN`] calls one could match a new call of the same tag. So the rank forgets
//! the failed call's two tags on the collective context
//! ([`Communicator::forget_collective`]): the frames queued under them go at once, and
//! those that arrive later and find no receive are dropped as they come, until the
//! communicator's collectives have moved half the span on. A call that succeeds pays
//! nothing for it but a test of an empty field when a frame arrives before its receive.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, Wake, Waker};

use weft_sync::{Error, Status};

use crate::buffer::{Primitive, RecvBuf, SendBuf};
use crate::coll_steps::{bcast_links, fold_copies, land, Incoming, Landing, Outgoing, Step, Steps as StepPlan, Then};
use crate::comm::Communicator;
use crate::engine::Schedule;
use crate::matching::{Source, Tag};
use crate::operation::{new_operation, Operation};
use crate::request::{Request, CONSUMED};

/// Collective-context tags of sequence number `k`: `TAG_SEQ - 2k` (data) and the one below
/// it (failure notices). Below the fixed tags of communicator creation (`create.rs`).
const TAG_SEQ: i32 = -(1 << 20);
/// Sequence numbers before the tags repeat (far more than can be outstanding at once).
pub(crate) const SEQ_SPAN: u32 = 1 << 20;
/// Tags of the `k`th persistent collective initialized on a communicator: `TAG_PERSISTENT -
/// 2k` and the one below, below every sequence number's. A persistent collective keeps its
/// tags for its whole life, which may span any number of other calls: in a range of their
/// own they cannot meet a later call's, whatever the order of the ranks' starts (which MPI
/// 4.0 leaves free) against their other collectives.
const TAG_PERSISTENT: i32 = TAG_SEQ - 2 * SEQ_SPAN as i32 - (1 << 20);
/// Persistent collectives initialized before their tags repeat: the rest of the negative
/// tags below `TAG_PERSISTENT`, two each.
const PERSISTENT_SPAN: u32 = 1 << 29;

/// The error a rank reports for a collective whose ranks passed different lengths or
/// counts (or that another member failed for that reason).
pub(crate) const MISMATCH: Error = Error::InvalidArgument("collective: the ranks passed different lengths or counts");

/// What a failure notice says: `[kind, world rank]`.
const NOTICE_LOST: u32 = 0;
const NOTICE_FREED: u32 = 1;
const NOTICE_MISMATCH: u32 = 2;

/// Which tags a collective's messages travel under.
#[derive(Clone, Copy, Debug)]
pub(crate) enum CollTag {
    /// Those of the collective's sequence number on the communicator.
    Seq(u32),
    /// This one (communicator creation's reductions, over members that may be a subset of
    /// the communicator, which do not all count its collectives), without failure notices.
    Fixed(i32),
}

/// A collective in progress on one rank: its communicator, its tag, and the receive for a
/// failure notice from another member.
pub(crate) struct Sched<'c> {
    pub(crate) comm: &'c Communicator,
    tag: i32,
    /// Whether the members tell each other of failures (a sequence number's tags, more
    /// than one member).
    notices: bool,
    /// The receive for a failure notice, posted once the schedule has been found waiting
    /// [`NOTICE_AFTER_POLLS`] times.
    notice: std::sync::OnceLock<Request<'c, Vec<u32>>>,
    /// Polls that found a step waiting.
    waits: std::sync::atomic::AtomicU32,
    /// Whether the steps ended well (else, when dropped, the schedule's tags are
    /// forgotten: [`Communicator::forget_collective`]).
    ended_well: bool,
}

/// Polls of a waiting step before the schedule posts its receive for failure notices. A
/// collective that ends quickly (the common case: its members are all there) never posts
/// it, which spares it a receive from any source and its cancellation; a notice sent
/// before is kept by matching until the receive is posted.
pub(crate) const NOTICE_AFTER_POLLS: u32 = 32;

/// The buffer a collective works in, in place: the request's buffer (which the request, or
/// the runtime's share of it if the request is dropped, keeps alive until the schedule
/// completes it), or the caller's slice of a blocking collective (borrowed until its request
/// completed, [`Communicator::run_in_place`]).
pub(crate) struct Out<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the buffer is written only by the schedule, on whichever thread advances it, before
// the request's cell completes (release); its owner reads it after (acquire).
unsafe impl<T: Send> Send for Out<T> {}

impl<T: Primitive> Out<T> {
    pub(crate) fn of(v: &mut [T]) -> Self {
        Out { ptr: v.as_mut_ptr(), len: v.len() }
    }

    /// Copies `from` (as long as the buffer) into the buffer (a persistent collective's
    /// result, kept in its schedule's own working buffer).
    pub(crate) fn write(&self, from: &[T]) {
        assert_eq!(from.len(), self.len, "a collective's result fills its buffer");
        // SAFETY: `ptr` addresses `len` elements of the request's buffer, alive until the
        // request's cell completes, which happens only after this returns; nothing else
        // reads or writes them meanwhile (the owner reads after completion).
        unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), self.ptr, self.len) };
    }

    /// The buffer, for the schedule's steps to work in.
    ///
    /// # Safety
    /// Called by the schedule's steps only, each slice dropped before the next is made and
    /// before the request's cell completes; the transport holds a pointer into it only for
    /// a message of a persistent collective lent a part of it (`persistent_coll.rs`): a
    /// receive completes before the request's cell does, and a send still unread when its
    /// start fails keeps the memory, the request getting a copy back (`Run::give_up_lent`),
    /// so nothing touches the buffer the owner has after completion.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice(&self) -> &mut [T] {
        // SAFETY: `ptr` addresses `len` elements alive until the request's cell completes,
        // which happens only after the steps (and this borrow) are over; nothing else reads
        // or writes them meanwhile (the owner reads after completion).
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

/// The caller's send buffer of a blocking collective, which its steps read in place: borrowed
/// until the collective's request completed ([`Communicator::run_in_place`]).
pub(crate) struct In<T> {
    ptr: *const T,
    len: usize,
}

// SAFETY: only read, by the schedule, on whichever thread advances it, while the caller
// waits with the slice borrowed.
unsafe impl<T: Sync> Send for In<T> {}

impl<T> In<T> {
    pub(crate) fn of(v: &[T]) -> Self {
        In { ptr: v.as_ptr(), len: v.len() }
    }

    /// The buffer.
    ///
    /// # Safety
    /// Called by the steps of a schedule that [`Communicator::run_in_place`] runs while the
    /// slice given to [`of`](Self::of) stays borrowed (until the request completed).
    pub(crate) unsafe fn slice(&self) -> &[T] {
        // SAFETY: per the contract, `len` elements at `ptr` stay alive and unwritten.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Waits out a blocking collective's schedule if the caller unwinds before its request
/// completed (a panic in a continuation or a sync object's delivery run by the wait): the
/// schedule works in the caller's slice, which must outlive it.
struct Outlive<'c> {
    comm: &'c Communicator,
    op: Arc<Operation>,
}

impl Drop for Outlive<'_> {
    fn drop(&mut self) {
        while !self.op.cell.is_complete() {
            let _ = self.comm.engine().progress_once();
        }
    }
}

/// Storage unit of [`Scratch`]: aligned for every [`Primitive`].
type Unit = u128;

/// Scratch buffers at least this large go back to [`POOL`] when dropped (smaller ones cost
/// the allocator little).
const POOL_MIN_BYTES: usize = 16 << 10;

/// Bytes [`POOL`] keeps at most, all buffers together.
const POOL_MAX_BYTES: usize = 64 << 20;

/// Buffers [`POOL`] keeps at most.
const POOL_MAX_BUFFERS: usize = 16;

/// The collectives' spare scratch buffers, kept by the process between collectives.
///
/// A large message's buffer freshly allocated is fresh memory: the allocator maps it (or
/// takes it back from the heap's trimmed top) and every page of it faults on its first
/// write — for 1 MiB, 256 faults, which cost more than the copy itself. A collective
/// step's copies and receives take their buffers from here instead, whose pages are
/// already mapped, as Open MPI's and MPICH's collectives use buffers they keep.
static POOL: parking_lot::Mutex<Vec<Vec<Unit>>> = parking_lot::Mutex::new(Vec::new());

thread_local! {
    /// The thread's spare small scratch buffers (below [`POOL_MIN_BYTES`]): a small
    /// collective's messages take theirs here, without a lock or the allocator.
    static SMALL: std::cell::RefCell<Vec<Vec<Unit>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Small buffers [`SMALL`] keeps at most per thread.
const SMALL_MAX_BUFFERS: usize = 16;

/// A buffer of `T`s for one message of a collective step (what it sends, or what it
/// receives): the smallest spare buffer of [`POOL`] that holds it, given back when dropped
/// (also when the runtime drops it, for a request abandoned in flight).
pub(crate) struct Scratch<T> {
    store: Vec<Unit>,
    /// Elements written (or received).
    len: usize,
    /// Elements a receive accepts at most.
    cap: usize,
    /// Where the elements lie when not in `store`: a part of the caller's data lent to a
    /// large message of a collective run on the calling thread ([`Scratch::lent`]).
    lent: Option<std::ptr::NonNull<u8>>,
    _t: std::marker::PhantomData<T>,
}

// SAFETY: the store is a `Vec`; a lent part of the caller's data is read or written only
// through this buffer while the collective that lent it waits for the request holding it
// (`Direct::settle_in_flight`), whichever thread the transport touches it on.
unsafe impl<T: Send> Send for Scratch<T> {}
// SAFETY: as above; `&Scratch` only reads.
unsafe impl<T: Sync> Sync for Scratch<T> {}

impl<T: Primitive> Scratch<T> {
    /// A buffer for `cap` elements, none written.
    fn with_capacity(cap: usize) -> Self {
        let bytes = cap * std::mem::size_of::<T>();
        let units = bytes.div_ceil(std::mem::size_of::<Unit>());
        let store = if bytes >= POOL_MIN_BYTES {
            let mut pool = POOL.lock();
            // A buffer more than twice as large is left for a larger message.
            let fits = |v: &Vec<Unit>| (units..=2 * units).contains(&v.capacity());
            let best = (0..pool.len()).filter(|&i| fits(&pool[i])).min_by_key(|&i| pool[i].capacity());
            best.map(|i| pool.swap_remove(i))
        } else if units > 0 {
            SMALL
                .try_with(|p| {
                    let mut p = p.try_borrow_mut().ok()?;
                    let i = p.iter().position(|v| v.capacity() >= units)?;
                    Some(p.swap_remove(i))
                })
                .ok()
                .flatten()
        } else {
            None
        };
        // Small ones in a few sizes, so that a spare one fits the next message.
        let fresh = if bytes >= POOL_MIN_BYTES || units == 0 { units } else { units.next_power_of_two().max(4) };
        let store = store.unwrap_or_else(|| Vec::with_capacity(fresh));
        Scratch { store, len: 0, cap, lent: None, _t: std::marker::PhantomData }
    }

    /// A copy of `data`.
    pub(crate) fn copy_of(data: &[T]) -> Self {
        let mut s = Self::with_capacity(data.len());
        // SAFETY: the store holds `cap = data.len()` elements of `T` (`Unit`'s alignment is
        // every primitive's), not overlapping `data`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), s.store.as_mut_ptr().cast::<T>(), data.len()) };
        s.len = data.len();
        s
    }

    /// `data` `k` times over, one copy after the other.
    pub(crate) fn repeated(data: &[T], k: usize) -> Self {
        let mut s = Self::with_capacity(data.len() * k);
        for i in 0..k {
            // SAFETY: the store holds `cap = k * data.len()` elements of `T` (`Unit`'s
            // alignment is every primitive's), not overlapping `data`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), s.store.as_mut_ptr().cast::<T>().add(i * data.len()), data.len()) };
        }
        s.len = data.len() * k;
        s
    }

    /// A receive buffer for `len` elements.
    pub(crate) fn for_recv(len: usize) -> Self {
        Self::with_capacity(len)
    }

    /// A buffer for `cap` elements, none written: the last of `spare` if it holds them (a
    /// small collective's buffers going round its calls without the thread's pool),
    /// else one of the pools'.
    #[inline]
    fn from_spare(spare: &mut Vec<Vec<Unit>>, cap: usize) -> Self {
        let units = (cap * std::mem::size_of::<T>()).div_ceil(std::mem::size_of::<Unit>());
        let store = if units == 0 {
            Vec::new()
        } else if spare.last().is_some_and(|v| v.capacity() >= units) {
            spare.pop().unwrap_or_default()
        } else {
            return Self::with_capacity(cap);
        };
        Scratch { store, len: 0, cap, lent: None, _t: std::marker::PhantomData }
    }

    /// Where the elements lie.
    #[inline]
    fn base(&self) -> *const T {
        match self.lent {
            Some(p) => p.as_ptr().cast_const().cast(),
            None => self.store.as_ptr().cast(),
        }
    }

    /// Where the elements lie, to write them.
    #[inline]
    fn base_mut(&mut self) -> *mut T {
        match self.lent {
            Some(p) => p.as_ptr().cast(),
            None => self.store.as_mut_ptr().cast(),
        }
    }
}

impl Scratch<u8> {
    /// The caller's `bytes` bytes at `at` themselves as the data of a send, no copy.
    ///
    /// # Safety
    /// The bytes stay valid and unwritten until the request holding this buffer completed;
    /// the buffer is dropped before the bytes are freed.
    unsafe fn lent(at: *mut u8, bytes: usize) -> Self {
        Scratch { store: Vec::new(), len: bytes, cap: bytes, lent: std::ptr::NonNull::new(at), _t: std::marker::PhantomData }
    }

    /// The caller's `bytes` bytes at `at` themselves as the place a receive lands in.
    ///
    /// # Safety
    /// As for [`lent`](Scratch::lent), and nothing else reads or writes the bytes until the
    /// receive completed.
    unsafe fn lent_for_recv(at: *mut u8, bytes: usize) -> Self {
        // SAFETY: per the contract, which is `lent`'s and more.
        let mut s = unsafe { Self::lent(at, bytes) };
        s.len = 0;
        s
    }

    /// Whether this is the caller's data ([`lent`](Scratch::lent)).
    fn is_lent(&self) -> bool {
        self.lent.is_some()
    }

    /// [`copy_of`](Scratch::copy_of) `data`, in a buffer [`from_spare`](Scratch::from_spare).
    fn copy_from_spare(spare: &mut Vec<Vec<Unit>>, data: &[u8]) -> Self {
        let mut s = Self::from_spare(spare, data.len());
        // SAFETY: as in `copy_of`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), s.store.as_mut_ptr().cast::<u8>(), data.len()) };
        s.len = data.len();
        s
    }

    /// Moves this small buffer's store into `spare` (bounded) instead of the thread's pool.
    #[inline]
    fn keep_in(&mut self, spare: &mut Vec<Vec<Unit>>) {
        let bytes = self.store.capacity() * std::mem::size_of::<Unit>();
        if (1..POOL_MIN_BYTES).contains(&bytes) && spare.len() < SMALL_MAX_BUFFERS {
            // Left empty: its drop is two compares.
            spare.push(std::mem::take(&mut self.store));
        }
    }
}

impl Scratch<u8> {
    /// The bytes as elements of `T` (the store is aligned for every primitive; a partial
    /// element at the end is left out).
    fn elems<T: Primitive>(&self) -> &[T] {
        // SAFETY: the first `len` bytes were written; `T: Primitive` is plain data of any
        // bit pattern, and the store is aligned for it.
        unsafe { std::slice::from_raw_parts(self.base().cast::<T>(), self.len / std::mem::size_of::<T>().max(1)) }
    }
}

/// The bytes of `data`.
fn bytes_of<T: Primitive>(data: &[T]) -> &[u8] {
    // SAFETY: `T: Primitive` has no padding, so its bytes are initialized.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

impl<T: Primitive> std::ops::Deref for Scratch<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the first `len` elements were written (`copy_of`, `lent`, or a receive's
        // `filled`); the store is aligned for `T`, and a lent part is the caller's `T`s.
        unsafe { std::slice::from_raw_parts(self.base(), self.len) }
    }
}

impl<T: Primitive> std::ops::DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.base_mut(), self.len) }
    }
}

impl<T> Drop for Scratch<T> {
    /// An empty one (no message, or its store kept by [`keep_in`](Scratch::keep_in)) is a
    /// compare; the others go back to a pool.
    #[inline]
    fn drop(&mut self) {
        if self.store.capacity() != 0 {
            self.give_back();
        }
    }
}

impl<T> Scratch<T> {
    /// Gives the store to the thread's pool (small) or the process's (large), or frees it.
    #[inline(never)]
    fn give_back(&mut self) {
        let bytes = self.store.capacity() * std::mem::size_of::<Unit>();
        if (1..POOL_MIN_BYTES).contains(&bytes) {
            let store = std::mem::take(&mut self.store);
            let _ = SMALL.try_with(|p| match p.try_borrow_mut() {
                Ok(mut p) if p.len() < SMALL_MAX_BUFFERS => p.push(store),
                _ => {}
            });
            return;
        }
        if !(POOL_MIN_BYTES..=POOL_MAX_BYTES).contains(&bytes) {
            return;
        }
        let mut pool = POOL.lock();
        pool.push(std::mem::take(&mut self.store));
        // Over the bounds: the smallest buffers go first.
        let total = |p: &Vec<Vec<Unit>>| p.iter().map(|v| v.capacity() * std::mem::size_of::<Unit>()).sum::<usize>();
        while pool.len() > POOL_MAX_BUFFERS || total(&pool) > POOL_MAX_BYTES {
            let smallest = (0..pool.len()).min_by_key(|&i| pool[i].capacity()).expect("the pool is not empty");
            drop(pool.swap_remove(smallest));
        }
    }
}

// SAFETY: the store's heap memory does not move when the `Scratch` moves, and nothing
// writes it while a send borrows it (the schedule owns the buffer and awaits the send); a
// lent part of the caller's data stays unwritten until the send completed (`lent`).
unsafe impl<T: Primitive> SendBuf for Scratch<T> {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: the first `len` elements were written, and `T: Primitive` has no padding.
        unsafe { std::slice::from_raw_parts(self.base().cast::<u8>(), std::mem::size_of_val(&**self)) }
    }
}

// SAFETY: as for `Scratch`: a shared one is never written while shared.
unsafe impl<T: Primitive> SendBuf for Arc<Scratch<T>> {
    fn as_bytes(&self) -> &[u8] {
        (**self).as_bytes()
    }
}

// SAFETY: the receive area is the store's first `cap` elements (heap memory that does not
// move); `filled` sets the length to the elements received.
unsafe impl<T: Primitive> RecvBuf for Scratch<T> {
    fn elem_size(&self) -> usize {
        std::mem::size_of::<T>().max(1)
    }
    fn spare(&mut self) -> (*mut u8, usize) {
        (self.base_mut().cast(), self.cap * std::mem::size_of::<T>())
    }
    unsafe fn filled(&mut self, bytes: usize) {
        self.len = bytes / self.elem_size();
    }
}

/// The waker a schedule is polled with: nothing to wake, as whoever polls a schedule polls
/// it again after the next progress pass (the steps test their requests then).
struct Nobody;

impl Wake for Nobody {
    fn wake(self: Arc<Self>) {}
}

static NOBODY: LazyLock<Waker> = LazyLock::new(|| Waker::from(Arc::new(Nobody)));

/// A future of a collective's steps, borrowing its [`Sched`].
pub(crate) type Steps<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>;

/// Resolves when `req` completes (or a failure notice arrives), without driving progress:
/// whoever polls the schedule does.
struct Done<'r, 'c, B: Send + 'static> {
    req: &'r mut Request<'c, B>,
    sched: &'r Sched<'c>,
}

impl<B: Send + 'static> Future for Done<'_, '_, B> {
    type Output = Result<B, Error>;

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.req.is_complete() {
            let comm = self.req.communicator();
            return Poll::Ready(self.req.take().unwrap_or(Err(CONSUMED)).map(|(b, _)| b).map_err(|e| step_error(comm, e)));
        }
        let s = self.sched;
        if let Some(n) = s.notice.get() {
            if n.is_complete() {
                // Read by `Sched::finish`.
                return Poll::Ready(Err(Error::Cancelled));
            }
        } else if s.notices && s.waits.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1 >= NOTICE_AFTER_POLLS {
            let c = s.comm;
            match c.irecv_on(c.coll_state(), Vec::<u32>::with_capacity(2), Source::Any, Tag::Is(s.tag - 1)) {
                // Only the thread advancing the schedule sets it.
                Ok(r) => drop(s.notice.set(r)),
                Err(e) => return Poll::Ready(Err(e)),
            }
            // A notice already here completed it: read on the next poll.
        }
        Poll::Pending
    }
}

/// The error of a collective's step whose request failed with `e` on `comm`.
pub(crate) fn step_error(comm: &Communicator, e: Error) -> Error {
    match e {
        // The request names a lost peer by its rank here; the schedule works in world
        // ranks (its result goes through its own request's translation).
        Error::PeerLost { rank } => Error::PeerLost { rank: comm.world_of(rank) },
        Error::Truncated { .. } => MISMATCH,
        e => e,
    }
}

/// The data tag of sequence number `seq` (its failure notices travel under the one below).
pub(crate) fn seq_tag(seq: u32) -> i32 {
    TAG_SEQ - 2 * (seq % SEQ_SPAN) as i32
}

/// The data tag of the persistent collective of (persistent) sequence number `seq`; its
/// failure notices go under the tag below.
pub(crate) fn persistent_tag(seq: u32) -> i32 {
    TAG_PERSISTENT - 2 * (seq % PERSISTENT_SPAN) as i32
}

impl<'c> Sched<'c> {
    /// A collective on `comm` under `tag`: the tags of sequence number `seq`, with failure
    /// notices, or a fixed tag without.
    fn new(comm: &'c Communicator, tag: CollTag) -> Self {
        let (tag, notices) = match tag {
            CollTag::Seq(seq) => (seq_tag(seq), comm.size() > 1),
            CollTag::Fixed(t) => (t, false),
        };
        Sched { comm, tag, notices, notice: std::sync::OnceLock::new(), waits: std::sync::atomic::AtomicU32::new(0), ended_well: false }
    }

    /// Waits for `req` as a step of this schedule.
    async fn done<B: Send + 'static>(&self, req: &mut Request<'c, B>) -> Result<B, Error> {
        Done { req, sched: self }.await
    }

    /// Receives from each world rank of `from` its given number of elements on the
    /// collective context, posting every receive before the sends of `to` (world ranks and
    /// their data) go out, so that large messages (by rendezvous) never wait on each other.
    /// A message of another length than expected is [`MISMATCH`].
    pub(crate) async fn exchange_many<T: Primitive>(
        &self,
        from: &[(u32, usize)],
        to: Vec<(u32, impl SendBuf)>,
    ) -> Result<Vec<Scratch<T>>, Error> {
        let (c, tag) = (self.comm, self.tag);
        let coll = c.coll_state();
        let mut rx = from
            .iter()
            .map(|&(w, len)| c.irecv_on(coll, Scratch::<T>::for_recv(len), Source::Rank(w), Tag::Is(tag)))
            .collect::<Result<Vec<_>, _>>()?;
        let mut tx = to.into_iter().map(|(w, v)| c.isend_on(coll, v, w, tag)).collect::<Result<Vec<_>, _>>()?;
        let mut got = Vec::with_capacity(rx.len());
        for (r, &(_, len)) in rx.iter_mut().zip(from) {
            let v = self.done(r).await?;
            if v.len() != len {
                return Err(MISMATCH);
            }
            got.push(v);
        }
        for s in &mut tx {
            self.done(s).await?;
        }
        Ok(got)
    }

    /// [`exchange_many`](Self::exchange_many) with at most one receive.
    pub(crate) async fn exchange<T: Primitive>(
        &self,
        from: Option<(u32, usize)>,
        to: Vec<(u32, impl SendBuf)>,
    ) -> Result<Option<Scratch<T>>, Error> {
        let from: Vec<(u32, usize)> = from.into_iter().collect();
        Ok(self.exchange_many(&from, to).await?.pop())
    }

    /// Receives `len` elements from world rank `w`.
    pub(crate) async fn recv<T: Primitive>(&self, w: u32, len: usize) -> Result<Scratch<T>, Error> {
        Ok(self.exchange(Some((w, len)), Vec::<(u32, Vec<T>)>::new()).await?.expect("a receive was posted"))
    }

    /// The schedule's outcome: `res`, or the failure another member reported. A failure
    /// of this rank's own is reported to every other member; a notice not used is
    /// cancelled.
    fn finish(mut self, res: Result<(), Error>) -> Result<(), Error> {
        self.ended_well = res.is_ok();
        if !self.notices {
            return res;
        }
        let notice = self.notice.take();
        let Err(e) = res else { return Ok(()) };
        if let Some(mut notice) = notice.filter(|n| n.is_complete()) {
            return Err(notice_error(self.comm, notice.take(), e));
        }
        send_notices(self.comm, self.tag, e);
        Err(e)
    }
}

impl Drop for Sched<'_> {
    /// A schedule that failed, or was dropped before its steps ended, forgets its tags (its
    /// steps' requests are gone by now: they borrow it).
    fn drop(&mut self) {
        if self.notices && !self.ended_well {
            self.comm.forget_collective(self.tag);
        }
    }
}

/// The failure of a collective whose step failed with `e` and whose receive for failure
/// notices completed with `got`: the failure another member reported, else `e`.
pub(crate) fn notice_error(comm: &Communicator, got: Option<Result<(Vec<u32>, Status), Error>>, e: Error) -> Error {
    match got {
        Some(Ok((v, _))) if v.len() == 2 && v[0] == NOTICE_LOST => Error::PeerLost { rank: v[1] },
        Some(Ok((v, _))) if v.len() == 2 && v[0] == NOTICE_FREED => Error::CommFreed,
        Some(Ok(_)) => MISMATCH,
        // The notice's own receive failed: the peer it waited for is gone.
        Some(Err(Error::PeerLost { rank })) => Error::PeerLost { rank: comm.world_of(rank) },
        Some(Err(_)) | None => e,
    }
}

/// Tells every other member of `comm` that this rank's collective under data tag `tag`
/// failed with `e` (under the tag below it, where each member's schedule listens).
pub(crate) fn send_notices(comm: &Communicator, tag: i32, e: Error) {
    let what = match e {
        Error::PeerLost { rank } => [NOTICE_LOST, rank],
        Error::CommFreed => [NOTICE_FREED, 0],
        _ => [NOTICE_MISMATCH, 0],
    };
    let me = comm.rank();
    for r in (0..comm.size()).filter(|&r| r != me) {
        // Best effort, not waited for: a member that is gone needs no notice (a send dropped
        // in flight still goes out).
        let _ = comm.isend_on(comm.coll_state(), what.to_vec(), comm.world_of(r), tag - 1);
    }
}

/// A nonblocking collective in flight: its steps and its request's operation.
struct Nbc {
    steps: Option<Steps<'static>>,
    op: Arc<Operation>,
    /// The status its request completes with.
    status: Status,
}

impl Schedule for Nbc {
    fn advance(&mut self) -> bool {
        let Some(steps) = self.steps.as_mut() else { return true };
        match steps.as_mut().poll(&mut Context::from_waker(&NOBODY)) {
            Poll::Pending => false,
            Poll::Ready(res) => {
                // The steps (and their requests) go before the request completes.
                self.steps = None;
                self.op.cell.complete(res.map(|()| self.status));
                true
            }
        }
    }
}

impl Drop for Nbc {
    fn drop(&mut self) {
        // Dropped unfinished: the rank's last handle went.
        if self.steps.take().is_some() {
            self.op.cell.complete(Err(Error::Cancelled));
        }
    }
}

impl Communicator {
    /// The sequence number of the next collective on this communicator.
    pub(crate) fn next_seq(&self) -> u32 {
        self.coll_seq().fetch_add(1, crate::loom::sync::atomic::Ordering::Relaxed)
    }

    /// The data tag of the next persistent collective initialized on this communicator.
    pub(crate) fn next_persistent_tag(&self) -> i32 {
        persistent_tag(self.persistent_seq().fetch_add(1, crate::loom::sync::atomic::Ordering::Relaxed))
    }

    /// Forgets the tags of the failed collective of data tag `tag` (its data and failure
    /// notices) on the collective context: the frames queued under them go now, and those
    /// that come later go as they arrive (a peer's step or notice sent before it learnt of
    /// the failure), until the communicator's collectives have moved half the span of
    /// sequence numbers on, long before the tags come round again. Without this each failed
    /// collective would leave its peers' frames queued until the communicator is freed, and
    /// after `SEQ_SPAN` collectives one could match a new collective of the same tag.
    #[cold]
    #[inline(never)]
    pub(crate) fn forget_collective(&self, tag: i32) {
        let (st, engine) = (self.coll_state(), self.engine());
        let mut frames = Vec::new();
        for part in 0..engine.matching_parts(st) {
            engine.with_matching(st, part, |m| {
                // Under the matching lock: `free` sets the flag before it drains the queues.
                if !st.is_freed() {
                    m.forget(&[tag, tag - 1], self.coll_seq_arc(), SEQ_SPAN / 2, &mut frames);
                }
            });
        }
        // Outside the matching lock: releasing an `Rts` sends its `Fin`.
        for f in frames {
            engine.release_frame(f);
        }
    }

    /// Starts a nonblocking collective whose result goes into `buf`: `steps` (given the
    /// schedule, borrowing it) runs as the rank progresses; the request completes with
    /// `bytes` in its status when they end. Its messages travel under the tags of the
    /// communicator's next sequence number, or under `fixed`.
    pub(crate) fn start_collective<B: Send + 'static>(
        &self,
        buf: B,
        bytes: usize,
        fixed: Option<i32>,
        steps: impl for<'a, 'c> FnOnce(&'a Sched<'c>) -> Steps<'a> + Send + 'static,
    ) -> Result<Request<'_, B>, Error> {
        self.start_schedule_of(buf, bytes, fixed, steps).map(|(req, _)| req)
    }

    /// [`start_collective`](Self::start_collective), also giving the request's operation.
    fn start_schedule_of<B: Send + 'static>(
        &self,
        buf: B,
        bytes: usize,
        fixed: Option<i32>,
        steps: impl for<'a, 'c> FnOnce(&'a Sched<'c>) -> Steps<'a> + Send + 'static,
    ) -> Result<(Request<'_, B>, Arc<Operation>), Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        let tag = match fixed {
            Some(t) => CollTag::Fixed(t),
            None => CollTag::Seq(self.next_seq()),
        };
        let comm = self.clone();
        let all: Steps<'static> = Box::pin(async move {
            let s = Sched::new(&comm, tag);
            let res = steps(&s).await;
            s.finish(res)
        });
        let op = new_operation(|i| i.context = self.coll_state().context);
        let status = Status { source: self.world_of(self.rank()), tag: 0, bytes };
        let req = Request::collective(self, op.clone(), buf);
        self.engine().start_schedule(Box::new(Nbc { steps: Some(all), op: op.clone(), status }));
        Ok((req, op))
    }

    /// Runs a blocking collective in place in `data`, the caller's buffer: `steps` get the
    /// schedule and `data` to work in, and this returns once they ended. No copy of `data`
    /// is made on the way in or out (a nonblocking collective works in its request's buffer
    /// instead).
    pub(crate) fn run_in_place<T: Primitive>(
        &self,
        data: &mut [T],
        fixed: Option<i32>,
        steps: impl for<'a, 'c> FnOnce(&'a Sched<'c>, &'a mut [T]) -> Steps<'a> + Send + 'static,
    ) -> Result<(), Error> {
        let bytes = std::mem::size_of_val(data);
        let out = Out::of(data);
        let (req, op) = self.start_schedule_of((), bytes, fixed, move |s: &Sched<'_>| -> Steps<'_> {
            Box::pin(async move {
                // SAFETY: the only call for this schedule; `data` is borrowed until the
                // request completed (`Outlive` waits it out on an unwind).
                steps(s, unsafe { out.slice() }).await
            })
        })?;
        let _outlive = Outlive { comm: self, op };
        req.wait().map(drop)
    }
}

/// Idle progress passes a step of a collective run on the calling thread
/// ([`Communicator::run_direct`]) makes, testing its messages, before it posts its receive
/// for failure notices and waits as a blocking request waits (attached, parked once idle).
/// A step whose peers are all there completes within them, and the collective then costs
/// no receive from any source and no cancellation.
const DIRECT_POLLS: u32 = 64;

/// A two-member allreduce run on the calling thread of up to this many bytes receives into
/// a buffer on the stack ([`Communicator::pair_direct`]).
const PAIR_BYTES: usize = crate::coll::ALLREDUCE_EXCHANGE_BYTES;

/// Every so many polls of a two-member step ([`Communicator::pair_direct`]) the pass is a
/// full one (the others look at the thread's own CRI alone).
const PAIR_FULL_EVERY: u32 = 8;

/// The one step of a collective on two members that [`Communicator::pair_direct`] runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pair {
    /// An allreduce's exchange: a send of the data and a receive combined into it.
    Exchange,
    /// A broadcast's root: a send of the data.
    Send,
    /// A broadcast's other member: a receive into the data.
    ReceiveInPlace,
}

/// What a collective run on the calling thread keeps between calls, per thread: the last
/// plan and what it was made for, its step's requests and what they gave. The requests are
/// left empty by each call (they borrow the communicator, and never outlive it: see
/// [`Communicator::run_direct`]).
#[derive(Default)]
struct DirectStore {
    steps: StepPlan,
    /// What `steps` is the plan of: the members it was made over (kept, so that the list
    /// is not freed and another allocated at its address), this rank's place among them and
    /// the collective.
    made_for: Option<(Arc<[u32]>, u32, DirectPlan)>,
    reqs: Vec<Request<'static, Scratch<u8>>>,
    got: Vec<Option<(Scratch<u8>, weft_sync::Outcome)>>,
    /// Whether a request of the call holds a part of the caller's data ([`Scratch::lent`]):
    /// then no request is dropped before it completed.
    lent: bool,
    /// Small message buffers that the steps' requests gave back, for the next steps.
    spare: Vec<Vec<Unit>>,
}

/// A collective run on the calling thread, as far as its plan depends on it (beside the
/// communicator's members and this rank among them): a thread that calls the same
/// collective again on the same communicator reuses the plan it made the last time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DirectPlan {
    /// A barrier.
    Barrier,
    /// A broadcast of so many elements, so many bytes, from a root (the algorithm depends on
    /// the bytes).
    Bcast { len: usize, bytes: usize, root: u32 },
    /// A reduction of so many elements into a root.
    Reduce { len: usize, root: u32 },
    /// An allreduce of so many elements, so many bytes, with an op of a kind (the algorithm
    /// depends on all three: a user's op never takes Rabenseifner's, an exact one combines
    /// the exchange's messages as they land).
    Allreduce { len: usize, bytes: usize, kind: crate::coll::OpKind },
    /// A gather of so many elements per rank into a root.
    Gather { len: usize, root: u32 },
    /// A scatter of so many elements per rank from a root.
    Scatter { len: usize, root: u32 },
    /// An allgather of so many elements per rank.
    Allgather { len: usize },
    /// An alltoall of so many elements in all.
    Alltoall { len: usize },
    /// A collective whose plan depends on more (the blocks of a `v` form): made afresh at
    /// every call.
    Once,
}

thread_local! {
    /// The calling thread's [`DirectStore`] (taken by a call; a call nested in another, a
    /// collective of a pool task that a wait runs, makes its own).
    static DIRECT: std::cell::Cell<Option<Box<DirectStore>>> = const { std::cell::Cell::new(None) };
}

/// How a collective run on the calling thread waits between idle passes: the spin slot
/// and the answer of [`may_spin_long`](weft_sync::IdleBackoff::may_spin_long), taken at
/// the first idle pass and kept for the call (sampled every millisecond or two, where a
/// call takes microseconds): one clock read and one slot taken and given back per call, not
/// per step or per idle pass.
#[derive(Default)]
struct Idle {
    backoff: weft_sync::IdleBackoff,
    long: Option<bool>,
}

impl Idle {
    /// Whether to poll on (spin) rather than give the core up.
    #[inline]
    fn may_spin_long(&mut self) -> bool {
        let Idle { backoff, long } = self;
        *long.get_or_insert_with(|| backoff.may_spin_long())
    }

    /// Between two idle passes: with a core for every runnable thread, poll on. Else the
    /// peer the step waits for may be the thread without one: give ours up at once, as Open
    /// MPI's progress loop does when oversubscribed (`mpi_yield_when_idle`).
    #[inline]
    fn pause(&mut self) {
        if self.may_spin_long() {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// What the requests of a collective's step gave, settled one by one: the first failure,
/// and whether a receive's length differed from the plan's (each received message lands
/// until either is found).
#[derive(Default)]
struct Settled {
    failed: Option<Error>,
    mismatch: bool,
}

impl Settled {
    /// Settles one request's result (`expect`: the bytes a receive expects, for a receive):
    /// lands a receive's message with `land` while nothing failed, and keeps its buffer in
    /// `spare`.
    #[inline(always)]
    fn take(
        &mut self,
        b: &mut Scratch<u8>,
        o: weft_sync::Outcome,
        expect: Option<usize>,
        spare: &mut Vec<Vec<Unit>>,
        land: impl FnOnce(&Scratch<u8>),
    ) {
        // Read where it lies (a result is nine words), not moved in or out.
        if let Err(e) = o {
            self.failed.get_or_insert(e);
        } else if let Some(bytes) = expect.filter(|_| self.failed.is_none() && !self.mismatch) {
            if b.len() == bytes {
                land(b);
            } else {
                self.mismatch = true;
            }
        }
        b.keep_in(spare);
    }

    /// The step's outcome: its first failure, else [`MISMATCH`] if a length differed.
    fn outcome(self, comm: &Communicator) -> Result<(), Error> {
        match self {
            Settled { failed: Some(e), .. } => Err(step_error(comm, e)),
            Settled { mismatch: true, .. } => Err(MISMATCH),
            Settled { .. } => Ok(()),
        }
    }
}

/// A collective run on the calling thread: its communicator, data tag, the receive for
/// failure notices once posted, and the thread's storage.
struct Direct<'c> {
    comm: &'c Communicator,
    tag: i32,
    notice: Option<Request<'static, Scratch<u8>>>,
    store: Box<DirectStore>,
}

impl Direct<'_> {
    /// Runs the plan in `store.steps` over `data`, in place (the rank's data as many times
    /// over as the plan's copies); `combine(ours, theirs, theirs_first)` reduces.
    fn run<T: Primitive>(&mut self, data: &mut [T], combine: &impl Fn(&mut [T], &[T], bool)) -> Result<(), Error> {
        let (c, tag) = (self.comm, self.tag);
        let coll = c.coll_state();
        let size = std::mem::size_of::<T>();
        let mut idle = Idle::default();
        for i in 0..self.store.steps.steps.len() {
            let step = self.store.steps.steps[i].clone();
            // Sends first, so that the peers get them a receive's posting earlier (a small
            // collective's messages go eagerly, or by a rendezvous that no send waits for;
            // `got` keeps their order, the receives' after them). A send gone at once (eager,
            // with room in the peer's inbox) is settled here, its buffer kept for the next
            // message, and not waited for.
            let mut settled = Settled::default();
            let mut waited_sends = 0;
            for k in step.sends.clone() {
                let out = &self.store.steps.sends[k];
                let buf = if out.at.len() * size >= LEND_MIN_BYTES {
                    self.store.lent = true;
                    let (at, len) = (data[out.at.clone()].as_mut_ptr().cast::<u8>(), out.at.len() * size);
                    // SAFETY: the caller's data, borrowed for this call, which waits for the
                    // send (also when it fails: `settle_in_flight`); the steps write no part
                    // of the data that a send of theirs holds until it completed (a step's
                    // landings after all its requests completed; a receive lent below only
                    // where no send of its step reads).
                    unsafe { Scratch::lent(at, len) }
                } else {
                    Scratch::copy_from_spare(&mut self.store.spare, bytes_of(&data[out.at.clone()]))
                };
                let spare = &mut self.store.spare;
                let Some(r) = c.isend_or_gone(coll, buf, out.to, tag, |mut b, s| settled.take(&mut b, Ok(s), None, spare, |_| {}))? else {
                    continue;
                };
                waited_sends += 1;
                // SAFETY: dropped before this call returns (`store.reqs` is left empty), while
                // the caller's borrow of `comm` holds.
                self.store.reqs.push(unsafe { crate::request::unbound(r) });
            }
            for k in step.recvs.clone() {
                let inc = &self.store.steps.recvs[k];
                let steps = &self.store.steps;
                let buf = match in_place_landing(steps, &step, inc, size) {
                    Some(at) => {
                        self.store.lent = true;
                        let part = data[at..at + inc.len].as_mut_ptr().cast::<u8>();
                        // SAFETY: as for a lent send: the caller's data, which no send of
                        // this step reads and nothing else touches until the receive
                        // completed, and which this call waits for.
                        unsafe { Scratch::lent_for_recv(part, inc.len * size) }
                    }
                    None => Scratch::<u8>::from_spare(&mut self.store.spare, inc.len * size),
                };
                let r = c.irecv_on(coll, buf, Source::Rank(inc.from), Tag::Is(tag))?;
                // SAFETY: as above.
                self.store.reqs.push(unsafe { crate::request::unbound(r) });
            }
            // Each request's result is settled where it lies when the step ended on the
            // fast path (no list of results to fill and walk), else from `got`.
            let in_place = self.wait_step(&mut idle, DIRECT_POLLS)?;
            let DirectStore { steps, reqs, got, spare, .. } = &mut *self.store;
            settle_step(reqs, got, in_place, |j, b, o| {
                let recv = j.checked_sub(waited_sends).map(|k| &steps.recvs[step.recvs.start + k]);
                settled.take(b, o, recv.map(|inc| inc.len * size), spare, |b| {
                    // A lent receive landed in place.
                    if let Some(inc) = recv.filter(|_| !b.is_lent()) {
                        land(data, &steps.landings[inc.lands.clone()], b.elems(), combine);
                    }
                })
            });
            settled.outcome(c)?;
        }
        if self.store.steps.fold {
            fold_copies(data, self.store.steps.copies, combine);
        }
        Ok(())
    }

    /// One exchange of `data` (small, every member's the same length) with every other
    /// member, each message combined into `data` as it is settled (`combine(ours, theirs,
    /// theirs_first)`): the plan of [`reduce_exchange_into`](crate::coll_steps::reduce_exchange_into)
    /// without copies (and, on two members, of recursive doubling), its messages the same,
    /// walked straight from the members' list. No plan is written, looked up or read, no
    /// step's ranges are cloned, and every send goes from `data` itself (a small send leaves
    /// at once, its bytes copied into the frame; one deferred holds them until it leaves,
    /// and nothing lands in `data` before every request of the step completed): no copy
    /// into a scratch buffer per send.
    #[inline(always)]
    fn exchange<T: Primitive>(&mut self, data: &mut [T], combine: &impl Fn(&mut [T], &[T], bool)) -> Result<(), Error> {
        let (c, tag) = (self.comm, self.tag);
        let coll = c.coll_state();
        let (members, me) = (&**c.world_ranks(), c.rank() as usize);
        let bytes = std::mem::size_of_val(data);
        let mut settled = Settled::default();
        let mut waited_sends = 0;
        let st = &mut *self.store;
        // Sends first, as `run` posts them; one gone at once is settled here.
        let at = data.as_mut_ptr().cast::<u8>();
        for (i, &to) in members.iter().enumerate() {
            if i == me {
                continue;
            }
            st.lent = true;
            // SAFETY: the caller's data, borrowed for this call, which waits for every send
            // (also when it fails: `settle_in_flight`, `st.lent` set); the received messages
            // are combined into it only once the step's requests all completed.
            let buf = unsafe { Scratch::lent(at, bytes) };
            let spare = &mut st.spare;
            let Some(r) = c.isend_or_gone(coll, buf, to, tag, |mut b, s| settled.take(&mut b, Ok(s), None, spare, |_| {}))? else {
                continue;
            };
            waited_sends += 1;
            // SAFETY: dropped before this call returns (`store.reqs` is left empty), while
            // the caller's borrow of `comm` holds.
            st.reqs.push(unsafe { crate::request::unbound(r) });
        }
        for (i, &from) in members.iter().enumerate() {
            if i != me {
                let r = c.irecv_on(coll, Scratch::<u8>::from_spare(&mut st.spare, bytes), Source::Rank(from), Tag::Is(tag))?;
                // SAFETY: as above.
                st.reqs.push(unsafe { crate::request::unbound(r) });
            }
        }
        let in_place = self.wait_step(&mut Idle::default(), DIRECT_POLLS)?;
        let DirectStore { reqs, got, spare, .. } = &mut *self.store;
        settle_step(reqs, got, in_place, |j, b, o| {
            // The receives follow the waited sends, in member order, this rank left out.
            let from = j.checked_sub(waited_sends).map(|k| if k < me { k } else { k + 1 });
            settled.take(b, o, from.map(|_| bytes), spare, |b| {
                combine(data, b.elems(), from.is_some_and(|i| i < me));
            })
        });
        settled.outcome(c)
    }

    /// A small broadcast from `root` (every member's `data` the same length): the plan of
    /// [`bcast_into`](crate::coll_steps::bcast_into), its two steps walked straight from
    /// the binomial tree ([`bcast_links`]). The parent's message is received into `data`
    /// itself, and the children's messages go from it once it has landed: no plan, no copy
    /// into a scratch buffer or out of one.
    #[inline(always)]
    fn bcast<T: Primitive>(&mut self, data: &mut [T], root: u32) -> Result<(), Error> {
        let (c, tag) = (self.comm, self.tag);
        let coll = c.coll_state();
        let bytes = std::mem::size_of_val(data);
        let at = data.as_mut_ptr().cast::<u8>();
        let (parent, children) = bcast_links(c, root);
        let mut idle = Idle::default();
        if let Some(from) = parent {
            let st = &mut *self.store;
            st.lent = true;
            // SAFETY: the caller's data, borrowed for this call, which waits for the receive
            // (also when it fails: `settle_in_flight`, `st.lent` set); nothing reads or
            // writes it before the receive completed.
            let buf = unsafe { Scratch::lent_for_recv(at, bytes) };
            let r = c.irecv_on(coll, buf, Source::Rank(from), Tag::Is(tag))?;
            // SAFETY: dropped before this call returns (`store.reqs` is left empty), while
            // the caller's borrow of `comm` holds.
            st.reqs.push(unsafe { crate::request::unbound(r) });
            let in_place = self.wait_step(&mut idle, DIRECT_POLLS)?;
            let mut settled = Settled::default();
            let DirectStore { reqs, got, spare, .. } = &mut *self.store;
            settle_step(reqs, got, in_place, |_, b, o| settled.take(b, o, Some(bytes), spare, |_| {}));
            settled.outcome(c)?;
        }
        let mut settled = Settled::default();
        let st = &mut *self.store;
        for to in children {
            st.lent = true;
            // SAFETY: as the receive's: the caller's data, which no request writes any more
            // and which this call waits for every send of.
            let buf = unsafe { Scratch::lent(at, bytes) };
            let spare = &mut st.spare;
            let Some(r) = c.isend_or_gone(coll, buf, to, tag, |mut b, s| settled.take(&mut b, Ok(s), None, spare, |_| {}))? else {
                continue;
            };
            // SAFETY: as above.
            st.reqs.push(unsafe { crate::request::unbound(r) });
        }
        if !self.store.reqs.is_empty() {
            let in_place = self.wait_step(&mut idle, DIRECT_POLLS)?;
            let DirectStore { reqs, got, spare, .. } = &mut *self.store;
            settle_step(reqs, got, in_place, |_, b, o| settled.take(b, o, None, spare, |_| {}));
        }
        settled.outcome(c)
    }

    /// Waits for the step's requests (`store.reqs`): first by testing them between progress
    /// passes, which leaves them complete where they lie (`true`), then, still pending after
    /// `polls` passes ([`DIRECT_POLLS`]), with the receive for failure notices posted, as a blocking
    /// wait does, taking their results into `store.got` in their order as they complete
    /// (`false`). `Cancelled` if a notice came.
    fn wait_step(&mut self, idle: &mut Idle, polls: u32) -> Result<bool, Error> {
        let engine = self.comm.engine();
        let st = &mut *self.store;
        if self.notice.is_none() {
            for _ in 0..polls {
                if st.reqs.iter().all(Request::is_complete) {
                    // Left where they lie, for the caller to take.
                    return Ok(true);
                }
                if engine.progress_once().progressed() {
                    continue;
                }
                idle.pause();
            }
            let c = self.comm;
            let r = c.irecv_on(c.coll_state(), Scratch::<u8>::for_recv(8), Source::Any, Tag::Is(self.tag - 1))?;
            // SAFETY: dropped by `finish`, before `run_direct` returns.
            self.notice = Some(unsafe { crate::request::unbound(r) });
        }
        // The spin slot goes back: the blocking wait below takes its own.
        *idle = Idle::default();
        let k = st.reqs.len();
        st.reqs.push(self.notice.take().expect("posted above"));
        st.got.resize_with(k, || None);
        let mut res = Ok(());
        loop {
            for (r, g) in st.reqs.iter_mut().zip(st.got.iter_mut()) {
                if g.is_none() && r.is_complete() {
                    *g = r.take_parts();
                }
            }
            if st.got.iter().all(Option::is_some) {
                break;
            }
            if st.reqs[k].is_complete() {
                // Read by `finish`.
                res = Err(Error::Cancelled);
                break;
            }
            crate::wait::wait_any(&mut st.reqs);
        }
        self.notice = st.reqs.pop();
        if res.is_err() {
            settle_in_flight(&mut st.reqs, st.lent);
        }
        st.reqs.clear();
        res.map(|()| false)
    }

    /// The collective's outcome: `res`, or the failure another member reported; a failure
    /// of this rank's own is reported to every other member. In the communicator's ranks.
    /// Inlined where the collective ran (no copy of this into a call); a receive for
    /// failure notices and a failure go out of line.
    #[inline(always)]
    fn finish(self, res: Result<(), Error>) -> Result<(), Error> {
        let Direct { comm, tag, notice, mut store } = self;
        if res.is_err() {
            settle_in_flight(&mut store.reqs, store.lent);
        }
        store.lent = false;
        store.reqs.clear();
        store.got.clear();
        let _ = DIRECT.try_with(|d| d.set(Some(store)));
        match (res, notice) {
            (Ok(()), None) => Ok(()),
            (res, notice) => Self::finish_noticed(comm, tag, res, notice),
        }
    }

    /// [`finish`](Self::finish) of a collective that posted a receive for failure notices,
    /// or that failed.
    #[cold]
    #[inline(never)]
    fn finish_noticed(
        comm: &Communicator,
        tag: i32,
        res: Result<(), Error>,
        notice: Option<Request<'static, Scratch<u8>>>,
    ) -> Result<(), Error> {
        let Err(e) = res else {
            if let Some(mut n) = notice {
                // Unposted and taken, so that its operation goes back to the pool.
                n.cancel();
                let _ = n.take_parts();
            }
            return Ok(());
        };
        let e = match notice.filter(Request::is_complete) {
            Some(mut n) => {
                let got = n.take().map(|r| r.map(|(b, st)| (b.elems::<u32>().to_vec(), st)));
                notice_error(comm, got, e)
            }
            None => {
                send_notices(comm, tag, e);
                e
            }
        };
        if comm.size() > 1 {
            comm.forget_collective(tag);
        }
        Err(comm.local_error(e))
    }
}

/// Settles a step's requests in their order, `each(j, buffer, outcome)` for the `j`-th: where
/// they lie when the step ended on the fast path (`in_place`), else from `got`
/// ([`Direct::wait_step`]); then empties both lists.
#[inline(always)]
fn settle_step(
    reqs: &mut Vec<Request<'static, Scratch<u8>>>,
    got: &mut Vec<Option<(Scratch<u8>, weft_sync::Outcome)>>,
    in_place: bool,
    mut each: impl FnMut(usize, &mut Scratch<u8>, weft_sync::Outcome),
) {
    let n = if in_place { reqs.len() } else { got.len() };
    for j in 0..n {
        if in_place {
            reqs[j].take_parts_with(|b, o| each(j, b, o));
        } else if let Some((b, o)) = &mut got[j] {
            each(j, b, *o);
        }
    }
    reqs.clear();
    got.clear();
}

/// Messages of a collective run on the calling thread of at least this many bytes are sent
/// from the caller's data itself, and received straight into place where a receive only
/// replaces a part of it (no copy of theirs into a scratch buffer, or out of one; on the
/// same host a large one is then a single copy, the receiver's read of the sender's data).
pub(crate) const LEND_MIN_BYTES: usize = POOL_MIN_BYTES;

/// Where in the data receive `inc` of `step` lands by itself, if it is large enough to be
/// received there directly (as a lent buffer): a single landing that replaces a part no
/// send of the step reads.
/// A small one (the most) is told by its length alone.
#[inline(always)]
pub(crate) fn in_place_landing(steps: &StepPlan, step: &Step, inc: &Incoming, size: usize) -> Option<usize> {
    if inc.len * size < LEND_MIN_BYTES {
        return None;
    }
    let [Landing { at, then: Then::Replace }] = steps.landings[inc.lands.clone()] else { return None };
    let part = at..at + inc.len;
    let apart = |o: &Outgoing| o.at.end <= part.start || part.end <= o.at.start;
    steps.sends[step.sends.clone()].iter().all(apart).then_some(at)
}

/// Before the requests of a failed step are dropped: where one holds a part of the caller's
/// data (`lent`), the receives not yet matched are cancelled and every request is waited
/// for, so that none touches the data after the collective returned. A send completes once
/// its peer took it, dropped it as a failed collective's (its `Fin` then comes too) or was
/// lost; a receive, once cancelled, filled or its peer lost.
#[cold]
fn settle_in_flight(reqs: &mut [Request<'static, Scratch<u8>>], lent: bool) {
    if !lent {
        return;
    }
    for r in reqs.iter_mut() {
        r.cancel();
    }
    let _ = crate::wait::wait_all(reqs);
}

impl Communicator {
    /// Runs a blocking collective on the calling thread, in place in `data`: `plan` writes
    /// this rank's steps (world ranks) into storage the thread keeps (unless the plan there
    /// is already that of `what` on this communicator's members), and each step's
    /// messages are posted and waited for here, directly, under the tags of the
    /// communicator's next sequence number, `combine` reducing as the steps say. No schedule,
    /// no future and, once the thread's storage and scratch buffers are warm, no allocation.
    /// Failures travel as a schedule's do (`finish`): a rank whose step fails tells every
    /// other member, and a step that has waited [`DIRECT_POLLS`] passes listens for such
    /// notices.
    pub(crate) fn run_direct<T: Primitive>(
        &self,
        data: &mut [T],
        what: DirectPlan,
        plan: impl FnOnce(&mut StepPlan) -> Result<(), Error>,
        combine: impl Fn(&mut [T], &[T], bool),
    ) -> Result<(), Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        let mut store = DIRECT.try_with(std::cell::Cell::take).ok().flatten().unwrap_or_default();
        // A plan depends on the members (in world ranks), this rank's place among them and
        // `what`, nothing else.
        let (members, me) = (self.world_ranks(), self.rank());
        let reuse =
            what != DirectPlan::Once && matches!(&store.made_for, Some((m, r, w)) if Arc::ptr_eq(m, members) && (*r, *w) == (me, what));
        if !reuse {
            store.made_for = None;
            store.steps.clear();
            plan(&mut store.steps)?;
            store.made_for = Some((members.clone(), me, what));
        }
        // A plan over more than one copy of the data works in a scratch buffer, which lives
        // until every request that may hold a part of it has settled (`finish`).
        let mut copies = (store.steps.copies > 1).then(|| Scratch::repeated(data, store.steps.copies));
        let mut d = Direct { comm: self, tag: seq_tag(self.next_seq()), notice: None, store };
        let res = match &mut copies {
            None => d.run(data, &combine),
            Some(work) => d.run(work, &combine),
        };
        let res = d.finish(res);
        if let (Ok(()), Some(work)) = (&res, &copies) {
            data.copy_from_slice(&work[..data.len()]);
        }
        res
    }
}

impl Communicator {
    /// A small allreduce on the calling thread by one exchange ([`Direct::exchange`]), in
    /// place in `data`: what [`run_direct`](Self::run_direct) does with the plan of
    /// [`reduce_exchange_into`](crate::coll_steps::reduce_exchange_into) without copies, the
    /// same messages under the same tags, failures told and listened for alike, minus the
    /// plan's storage, lookup and walk. For an allreduce whose messages may combine in any
    /// order, or on two members (its one message combined on the side its rank says).
    pub(crate) fn allreduce_exchange_direct<T: Primitive>(
        &self,
        data: &mut [T],
        combine: impl Fn(&mut [T], &[T], bool),
    ) -> Result<(), Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        if self.size() == 2 && std::mem::size_of_val(data) <= PAIR_BYTES {
            return self.pair_direct(data, Pair::Exchange, &combine);
        }
        let store = DIRECT.try_with(std::cell::Cell::take).ok().flatten().unwrap_or_default();
        let mut d = Direct { comm: self, tag: seq_tag(self.next_seq()), notice: None, store };
        let res = d.exchange(data, &combine);
        d.finish(res)
    }

    /// A small broadcast on more than two members, on the calling thread
    /// ([`Direct::bcast`]): what [`run_direct`](Self::run_direct) does with the plan of
    /// [`bcast_into`](crate::coll_steps::bcast_into), the same messages under the same tag,
    /// failures told and listened for alike, minus the plan's storage, lookup and walk and
    /// the copies of the data into scratch buffers and out of them.
    pub(crate) fn bcast_tree_direct<T: Primitive>(&self, data: &mut [T], root: u32) -> Result<(), Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        let store = DIRECT.try_with(std::cell::Cell::take).ok().flatten().unwrap_or_default();
        let mut d = Direct { comm: self, tag: seq_tag(self.next_seq()), notice: None, store };
        let res = d.bcast(data, root);
        d.finish(res)
    }

    /// A small broadcast on two members, on the calling thread: the plan's one message
    /// ([`bcast_into`](crate::coll_steps::bcast_into)), under the same tag, sent from the
    /// root's `data` itself and received straight into the other's ([`pair_direct`](Self::pair_direct)).
    pub(crate) fn bcast_pair_direct<T: Primitive>(&self, data: &mut [T], root: u32) -> Result<(), Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        let what = if self.rank() == root { Pair::Send } else { Pair::ReceiveInPlace };
        self.pair_direct(data, what, &|_, _, _| {})
    }

    /// A collective's one step on two members ([`Pair`]): an allreduce's exchange
    /// ([`allreduce_exchange_direct`](Self::allreduce_exchange_direct)), or a broadcast's one
    /// message, under the call's tag, with nothing of the thread's storage unless the step
    /// has to wait long or fails. A send goes from `data` itself (a small send leaves at
    /// once, its bytes copied into the frame; one deferred is waited for before `data` is
    /// written); the exchange's receive lands in a buffer on the stack and is combined
    /// into `data`, the broadcast's lands in `data`; the requests are tested where they lie
    /// between progress passes. A step still pending after [`DIRECT_POLLS`] passes, or one
    /// that failed, goes on as the exchange's does ([`pair_rest`](Self::pair_rest)).
    #[inline(always)]
    fn pair_direct<T: Primitive>(&self, data: &mut [T], what: Pair, combine: &impl Fn(&mut [T], &[T], bool)) -> Result<(), Error> {
        let tag = seq_tag(self.next_seq());
        let coll = self.coll_state();
        let me = self.rank() as usize;
        let peer = self.world_ranks()[1 - me];
        let bytes = std::mem::size_of_val(data);
        // What a received message does to `data`: combined in, or nothing (a broadcast's
        // lands in `data` itself, and is not read as a second slice beside it).
        let land = (what == Pair::Exchange).then_some(combine);
        let mut landing = std::mem::MaybeUninit::<[Unit; PAIR_BYTES / std::mem::size_of::<Unit>()]>::uninit();
        // The send goes first: it is what the partner waits for, and the partner's frame,
        // if it comes before the receive is posted, waits in the inbox until this thread's
        // first pass, which follows the posting.
        let send = if what == Pair::ReceiveInPlace {
            None
        } else {
            // SAFETY: `data` is borrowed for this call, which waits for a deferred send
            // before it writes `data` (or returns: `pair_rest`).
            let sbuf = unsafe { Scratch::lent(data.as_mut_ptr().cast::<u8>(), bytes) };
            match self.isend_or_gone(coll, sbuf, peer, tag, |_, _| {}) {
                Ok(s) => s,
                Err(e) => return self.pair_rest(tag, None, None, Err(e), data, land),
            }
        };
        let at = match what {
            Pair::Send => None,
            Pair::Exchange => Some(landing.as_mut_ptr().cast::<u8>()),
            Pair::ReceiveInPlace => Some(data.as_mut_ptr().cast::<u8>()),
        };
        // SAFETY: `landing` and `data` outlive the receive (dropped or returned only after
        // it completed, waited for first where it failed: `pair_rest`), and only the
        // receive writes its place (the broadcast's `data` sends nothing); the bytes are
        // read once it completed with `bytes` of them.
        let recv = match at.map(|at| self.irecv_on(coll, unsafe { Scratch::lent_for_recv(at, bytes) }, Source::Rank(peer), Tag::Is(tag))) {
            None => None,
            Some(Ok(r)) => Some(r),
            Some(Err(e)) => return self.pair_rest(tag, send, None, Err(e), data, land),
        };
        let engine = self.engine();
        // Made at the first idle poll only.
        let mut idle = None;
        let mut polls = 0;
        while !(recv.as_ref().map_or(true, Request::is_complete) && send.as_ref().map_or(true, Request::is_complete)) {
            polls += 1;
            if polls > DIRECT_POLLS {
                return self.pair_rest(tag, send, recv, Ok(()), data, land);
            }
            // The partner's frame lands on this thread's CRI: most polls look there alone,
            // every `PAIR_FULL_EVERY`th (and every one while the send waits to leave) is
            // a full pass.
            let pass = if polls % PAIR_FULL_EVERY != 0 && send.is_none() { engine.progress_own() } else { engine.progress_once() };
            if pass.progressed() {
                continue;
            }
            idle.get_or_insert_with(Idle::default).pause();
        }
        let (mut settled, mut spare) = (Settled::default(), Vec::new());
        if let Some(mut s) = send {
            s.take_parts_with(|b, o| settled.take(b, o, None, &mut spare, |_| {}));
        }
        if let Some(mut r) = recv {
            r.take_parts_with(|b, o| {
                settled.take(b, o, Some(bytes), &mut spare, |b| {
                    if let Some(f) = land {
                        f(data, b.elems(), me == 1);
                    }
                })
            });
        }
        match settled.outcome(self) {
            Ok(()) => Ok(()),
            Err(e) => Direct::finish_noticed(self, tag, Err(e), None),
        }
    }

    /// The rest of a two-member step ([`pair_direct`](Self::pair_direct))
    /// whose requests are still pending after its polls (`res` is `Ok`), or that failed to
    /// post one: the requests go to the thread's storage and the exchange's wait, failure
    /// notices listened for, and the collective's outcome is the exchange's. A received
    /// message is combined into `data` by `land`, or is there already (`None`).
    #[cold]
    #[inline(never)]
    fn pair_rest<T: Primitive>(
        &self,
        tag: i32,
        send: Option<Request<'_, Scratch<u8>>>,
        recv: Option<Request<'_, Scratch<u8>>>,
        res: Result<(), Error>,
        data: &mut [T],
        land: Option<&impl Fn(&mut [T], &[T], bool)>,
    ) -> Result<(), Error> {
        let store = DIRECT.try_with(std::cell::Cell::take).ok().flatten().unwrap_or_default();
        let mut d = Direct { comm: self, tag, notice: None, store };
        // Both buffers are lent: nothing is dropped before it completed.
        d.store.lent = true;
        let waited_sends = usize::from(send.is_some());
        // SAFETY: dropped before this call returns (`finish` leaves `store.reqs` empty), while
        // the caller's borrow of `self` holds.
        d.store.reqs.extend(send.into_iter().chain(recv).map(|r| unsafe { crate::request::unbound(r) }));
        let res = res.and_then(|()| {
            let in_place = d.wait_step(&mut Idle::default(), 0)?;
            let (bytes, theirs_first) = (std::mem::size_of_val(data), self.rank() == 1);
            let mut settled = Settled::default();
            let DirectStore { reqs, got, spare, .. } = &mut *d.store;
            settle_step(reqs, got, in_place, |j, b, o| {
                let recv = j >= waited_sends;
                settled.take(b, o, recv.then_some(bytes), spare, |b| {
                    if let Some(f) = land {
                        f(data, b.elems(), theirs_first);
                    }
                });
            });
            settled.outcome(self)
        });
        d.finish(res)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::{Communicator, Error, Op, Runtime, Source, Tag};

    /// Frames held by the communicator's collective context (queued, early or dropped).
    fn coll_frames(c: &Communicator) -> usize {
        c.engine().with_matching(c.coll_state(), 0, |m| m.frames_held())
    }

    /// Three ranks of four run allreduces (recursive doubling: 0-1 and 2-3, then 0-2 and
    /// 1-3) after the fourth left: rank 2 fails at its first step and tells the others,
    /// rank 0's second step to it is sent all the same, rank 1 fails at its second step and
    /// tells the others too. The frames of those failed calls (rank 0's step, the notices
    /// no receive took) do not stay queued on any survivor, for nonblocking calls and
    /// blocking ones.
    #[test]
    fn failed_collectives_leave_no_frames_queued() {
        let mut rts = Runtime::builder().env(false).cris(1).build_local(4).unwrap();
        drop(rts.pop());
        let cs: Vec<&Communicator> = rts.iter().map(Runtime::world).collect();
        let lost = Err(Error::PeerLost { rank: 3 });
        std::thread::scope(|s| {
            for c in &cs {
                s.spawn(move || {
                    for k in 0..12u32 {
                        let res = if k % 3 == 2 {
                            c.allreduce(&[k], &mut [0], Op::Sum)
                        } else {
                            c.iallreduce(vec![k], Op::Sum).unwrap().wait().map(drop)
                        };
                        assert_eq!(res, lost, "call {k}");
                    }
                });
            }
        });
        // Whatever was still in flight arrives (bounded).
        let deadline = Instant::now() + Duration::from_secs(10);
        while cs.iter().any(|c| coll_frames(c) > 0) && Instant::now() < deadline {
            for c in &cs {
                assert_eq!(c.iprobe(Source::Any, Tag::Any), Ok(None));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(cs.iter().map(|c| coll_frames(c)).collect::<Vec<_>>(), vec![0; 3], "frames of failed collectives queued");
    }
}
