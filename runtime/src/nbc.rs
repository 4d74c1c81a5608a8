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
//! A schedule that fails (a peer lost, a rank that passed a different length) tells every
//! other member under the sequence number's second tag, where each member's schedule posted
//! a receive when it started: a member waiting for a rank that failed, and not for the lost
//! peer itself, fails too instead of waiting forever.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll, Wake, Waker};

use weft_sync::{Error, Status};

use crate::buffer::Primitive;
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
    notice: Option<Request<'c, Vec<u32>>>,
}

/// Where a nonblocking collective writes its result: the request's buffer, which the request
/// (or the runtime's share of it, if the request is dropped) keeps alive until the schedule
/// completes it.
pub(crate) struct Out<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: the buffer is written only by the schedule, on whichever thread advances it, before
// the request's cell completes (release); its owner reads it after (acquire).
unsafe impl<T: Send> Send for Out<T> {}

impl<T: Primitive> Out<T> {
    pub(crate) fn of(v: &mut Vec<T>) -> Self {
        Out { ptr: v.as_mut_ptr(), len: v.len() }
    }

    /// Copies `from` (as long as the buffer) into the buffer.
    pub(crate) fn write(&self, from: &[T]) {
        assert_eq!(from.len(), self.len, "a collective's result fills its buffer");
        // SAFETY: `ptr` addresses `len` elements of the request's buffer, alive until the
        // request's cell completes, which happens only after this returns; nothing else
        // reads or writes them meanwhile (the owner reads after completion).
        unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), self.ptr, self.len) };
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
    notice: Option<&'r Request<'c, Vec<u32>>>,
}

impl<B: Send + 'static> Future for Done<'_, '_, B> {
    type Output = Result<B, Error>;

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.req.is_complete() {
            let comm = self.req.communicator();
            return Poll::Ready(self.req.take().unwrap_or(Err(CONSUMED)).map(|(b, _)| b).map_err(|e| step_error(comm, e)));
        }
        if self.notice.is_some_and(|n| n.is_complete()) {
            // Read by `Sched::finish`.
            return Poll::Ready(Err(Error::Cancelled));
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

impl<'c> Sched<'c> {
    /// A collective on `comm` under `tag`: the tags of sequence number `seq`, with the receive
    /// for failure notices posted, or a fixed tag without notices.
    fn new(comm: &'c Communicator, tag: CollTag) -> Result<Self, Error> {
        let (tag, notices) = match tag {
            CollTag::Seq(seq) => (seq_tag(seq), comm.size() > 1),
            CollTag::Fixed(t) => (t, false),
        };
        let notice = if notices {
            Some(comm.irecv_on(comm.coll_state(), Vec::<u32>::with_capacity(2), Source::Any, Tag::Is(tag - 1))?)
        } else {
            None
        };
        Ok(Sched { comm, tag, notice })
    }

    /// Waits for `req` as a step of this schedule.
    async fn done<B: Send + 'static>(&self, req: &mut Request<'c, B>) -> Result<B, Error> {
        Done { req, notice: self.notice.as_ref() }.await
    }

    /// Receives from each world rank of `from` its given number of elements on the
    /// collective context, posting every receive before the sends of `to` (world ranks and
    /// their data) go out, so that large messages (by rendezvous) never wait on each other.
    /// A message of another length than expected is [`MISMATCH`].
    pub(crate) async fn exchange_many<T: Primitive>(&self, from: &[(u32, usize)], to: Vec<(u32, Vec<T>)>) -> Result<Vec<Vec<T>>, Error> {
        let (c, tag) = (self.comm, self.tag);
        let coll = c.coll_state();
        let mut rx = from
            .iter()
            .map(|&(w, len)| c.irecv_on(coll, Vec::<T>::with_capacity(len), Source::Rank(w), Tag::Is(tag)))
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
    pub(crate) async fn exchange<T: Primitive>(&self, from: Option<(u32, usize)>, to: Vec<(u32, Vec<T>)>) -> Result<Option<Vec<T>>, Error> {
        let from: Vec<(u32, usize)> = from.into_iter().collect();
        Ok(self.exchange_many(&from, to).await?.pop())
    }

    /// Receives `len` elements from world rank `w`.
    pub(crate) async fn recv<T: Primitive>(&self, w: u32, len: usize) -> Result<Vec<T>, Error> {
        Ok(self.exchange(Some((w, len)), Vec::new()).await?.expect("a receive was posted"))
    }

    /// Sends `v` to world rank `w` (and waits for the send).
    pub(crate) async fn send<T: Primitive>(&self, w: u32, v: Vec<T>) -> Result<(), Error> {
        self.exchange::<T>(None, vec![(w, v)]).await.map(drop)
    }

    /// Sends `v` to world rank `w` while receiving `len` elements from world rank `from`.
    pub(crate) async fn sendrecv<T: Primitive>(&self, w: u32, v: Vec<T>, from: u32, len: usize) -> Result<Vec<T>, Error> {
        Ok(self.exchange(Some((from, len)), vec![(w, v)]).await?.expect("a receive was posted"))
    }

    /// The schedule's outcome: `res`, or the failure another member reported. A failure
    /// of this rank's own is reported to every other member; a notice not used is
    /// cancelled.
    fn finish(mut self, res: Result<(), Error>) -> Result<(), Error> {
        let Some(mut notice) = self.notice.take() else { return res };
        let Err(e) = res else { return Ok(()) };
        if notice.is_complete() {
            return Err(notice_error(self.comm, notice.take(), e));
        }
        drop(notice);
        send_notices(self.comm, self.tag, e);
        Err(e)
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

    /// Starts a nonblocking collective whose result goes into `buf`: `steps` (given the
    /// schedule, borrowing it) runs as the rank progresses; the request completes with
    /// `bytes` in its status when they end. Its messages travel under the tags of the
    /// communicator's next sequence number, or under `fixed`.
    pub(crate) fn start_collective<B: Send + 'static>(
        &self,
        buf: B,
        bytes: usize,
        fixed: Option<i32>,
        steps: impl for<'a> FnOnce(&'a Sched<'a>) -> Steps<'a> + Send + 'static,
    ) -> Result<Request<'_, B>, Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        let tag = match fixed {
            Some(t) => CollTag::Fixed(t),
            None => CollTag::Seq(self.next_seq()),
        };
        let comm = self.clone();
        let all: Steps<'static> = Box::pin(async move {
            let s = Sched::new(&comm, tag)?;
            let res = steps(&s).await;
            s.finish(res)
        });
        let op = new_operation(|i| i.context = self.coll_state().context);
        let status = Status { source: self.world_of(self.rank()), tag: 0, bytes };
        let req = Request::collective(self, op.clone(), buf);
        self.engine().start_schedule(Box::new(Nbc { steps: Some(all), op, status }));
        Ok(req)
    }
}
