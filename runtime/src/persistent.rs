//! Persistent requests (MPI 4.0 §3.9): [`Communicator::send_init`] and
//! [`Communicator::recv_init`] (and the persistent collectives, `persistent_coll.rs`) check
//! their arguments once and keep the buffer; each
//! [`start`](Persistent::start) posts the same operation again, and [`wait`](Persistent::wait)
//! gives the buffer back to the request for the next start.
//!
//! A start is an `isend` / `irecv` without their checks: its operation comes from the
//! thread's pool and the request lives inside the persistent one, so a start allocates
//! nothing in steady state (`runtime/tests/zero_alloc.rs`).

use std::sync::{Arc, OnceLock};

use weft_sync::{Attach, CompletionCell, Error, Outcome, Status};

use crate::buffer::{RecvBuf, SendBuf};
use crate::comm::Communicator;
use crate::matching::{Source, Tag};
use crate::operation::Operation;
use crate::progress::{self, Want};
use crate::request::{consumed_cell, Request};

/// The error of a start on a request that is active already.
const ACTIVE: Error = Error::InvalidArgument("persistent request started while active");
/// The error of a wait on a request that is not active.
const INACTIVE: Error = Error::InvalidArgument("persistent request waited for while not started");

/// How a persistent point-to-point request posts its operation: the buffer back with the
/// error of a post that failed.
type Post<'c, B> = fn(&'c Communicator, B, Op) -> Result<Request<'c, B>, (Error, B)>;

/// What a start posts, its ranks already world ranks.
#[derive(Clone, Copy, Debug)]
enum Op {
    Send {
        dest: u32,
        tag: i32,
    },
    Recv {
        source: Source,
        tag: Tag,
    },
    /// A persistent collective, posted by its plan (`persistent_coll.rs`).
    Coll,
}

/// What a start of a persistent collective posts: its schedule, again (`persistent_coll.rs`).
pub(crate) trait Plan<B: Send + 'static>: Send + Sync {
    /// Checks `buf` for a start on `comm` (before the start takes it).
    fn check(&self, comm: &Communicator, buf: &B) -> Result<(), Error>;
    /// Starts the collective over `buf` on `comm`; its request completes when it ends. A
    /// start that fails gives `buf` back with the error.
    fn start<'c>(&self, comm: &'c Communicator, buf: B) -> Result<Request<'c, B>, (Error, B)>;
    /// Called with the buffer of a start that failed, before the request holds it again: a
    /// collective whose message may still be read from it swaps it for a copy.
    fn failed(&self, _buf: &mut B) {}
}

/// A persistent send or receive (`MPI_Send_init`, `MPI_Recv_init`), or a persistent
/// collective ([`Communicator::allreduce_init`] and the others, `persistent_coll.rs`): one
/// operation started many times.
///
/// Inactive, it holds its buffer ([`buffer`](Self::buffer), [`buffer_mut`](Self::buffer_mut):
/// fill the next message, read the last one); [`start`](Self::start) makes it active and
/// [`wait`](Self::wait) or a [`test`](Self::test) that finds it complete makes it inactive
/// again. Dropping it while active is as safe as dropping a [`Request`]: a receive that has
/// not matched is cancelled, anything else finishes with the runtime keeping the buffer.
///
/// ```
/// use weft::{Persistent, Runtime};
/// let ranks = Runtime::builder().env(false).build_local(2).unwrap();
/// let (a, b) = (ranks[0].world(), ranks[1].world());
/// let mut send = a.send_init(vec![0u32; 4], 1, 7).unwrap();
/// let mut recv = b.recv_init(Vec::<u32>::with_capacity(4), 0u32, 7).unwrap();
/// for i in 0..3 {
///     send.buffer_mut().unwrap().fill(i);
///     Persistent::start_all(std::slice::from_mut(&mut recv)).unwrap();
///     send.start().unwrap();
///     assert_eq!(recv.wait().unwrap().bytes, 16);
///     send.wait().unwrap();
///     assert_eq!(recv.buffer().unwrap(), &vec![i; 4]);
/// }
/// ```
pub struct Persistent<'c, B: Send + 'static> {
    comm: &'c Communicator,
    op: Op,
    /// Posts the operation (an `isend` or `irecv` on the user context, without checks); a
    /// post that fails gives the buffer back.
    post: Post<'c, B>,
    /// The buffer, while inactive.
    buf: Option<B>,
    /// The operation, while active.
    active: Option<Request<'c, B>>,
    /// The outcome of the last start that completed.
    last: Option<Outcome>,
    /// A persistent collective's plan (`Op::Coll`).
    plan: Option<Arc<dyn Plan<B>>>,
    /// What a sync object attached to an inactive request gets (made only then).
    consumed: OnceLock<Arc<Operation>>,
}

impl<B: Send + 'static> std::fmt::Debug for Persistent<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persistent").field("op", &self.op).field("active", &self.is_active()).field("last", &self.last).finish()
    }
}

impl Communicator {
    /// A persistent send of `buf` to `dest` with `tag` (`MPI_Send_init`), inactive: each
    /// [`start`](Persistent::start) sends the buffer as it is then, as
    /// [`isend`](Self::isend) would. The arguments are checked here, once.
    pub fn send_init<B: SendBuf>(&self, buf: B, dest: u32, tag: i32) -> Result<Persistent<'_, B>, Error> {
        self.check(dest, tag)?;
        fn post<'c, B: SendBuf>(comm: &'c Communicator, buf: B, op: Op) -> Result<Request<'c, B>, (Error, B)> {
            match op {
                Op::Send { dest, tag } if !comm.is_freed() => {
                    comm.isend_or_back(comm.p2p(), buf, dest, tag).map_err(|(e, b)| (comm.local_error(e), b))
                }
                Op::Send { .. } => Err((Error::CommFreed, buf)),
                Op::Recv { .. } | Op::Coll => Err((Error::InvalidArgument("a persistent send posted as another operation"), buf)),
            }
        }
        Ok(Persistent::new(self, Op::Send { dest: self.world_of(dest), tag }, post::<B>, buf))
    }

    /// A persistent receive into `buf`'s capacity from `source` with `tag`
    /// (`MPI_Recv_init`), inactive: each [`start`](Persistent::start) posts the receive
    /// as [`irecv`](Self::irecv) would. The arguments are checked here, once.
    pub fn recv_init<B: RecvBuf>(&self, buf: B, source: impl Into<Source>, tag: impl Into<Tag>) -> Result<Persistent<'_, B>, Error> {
        let tag = tag.into();
        let source = self.check_recv(source.into(), tag)?;
        fn post<'c, B: RecvBuf>(comm: &'c Communicator, buf: B, op: Op) -> Result<Request<'c, B>, (Error, B)> {
            match op {
                Op::Recv { source, tag } => comm.irecv_or_back(comm.p2p(), buf, source, tag).map_err(|(e, b)| (comm.local_error(e), b)),
                Op::Send { .. } | Op::Coll => Err((Error::InvalidArgument("a persistent receive posted as another operation"), buf)),
            }
        }
        Ok(Persistent::new(self, Op::Recv { source, tag }, post::<B>, buf))
    }
}

impl<'c, B: Send + 'static> Persistent<'c, B> {
    fn new(comm: &'c Communicator, op: Op, post: Post<'c, B>, buf: B) -> Self {
        Persistent { comm, op, post, buf: Some(buf), active: None, last: None, plan: None, consumed: OnceLock::new() }
    }

    /// A persistent collective over `buf`, each start posting `plan`.
    pub(crate) fn collective(comm: &'c Communicator, plan: Arc<dyn Plan<B>>, buf: B) -> Self {
        fn post<'c, B: Send + 'static>(_: &'c Communicator, buf: B, _: Op) -> Result<Request<'c, B>, (Error, B)> {
            Err((Error::InvalidArgument("a persistent collective posted as a point-to-point operation"), buf))
        }
        let mut p = Self::new(comm, Op::Coll, post::<B>, buf);
        p.plan = Some(plan);
        p
    }

    /// Starts the operation (`MPI_Start`). An error if it is active already. A start that
    /// fails (the peer is gone, the communicator freed, a collective's buffer that changed
    /// length since init) leaves the request inactive with its buffer, untouched: the next
    /// start tries again and allocates nothing more than this one did.
    pub fn start(&mut self) -> Result<(), Error> {
        if self.active.is_some() {
            return Err(ACTIVE);
        }
        // Inactive, a request holds its buffer (a failed start gives it back).
        let Some(buf) = self.buf.take() else { return Err(ACTIVE) };
        if let Some(plan) = &self.plan {
            if let Err(e) = plan.check(self.comm, &buf) {
                self.buf = Some(buf);
                return Err(e);
            }
        }
        let posted = match &self.plan {
            Some(plan) => plan.start(self.comm, buf),
            None => (self.post)(self.comm, buf, self.op),
        };
        match posted {
            Ok(r) => {
                self.active = Some(r);
                Ok(())
            }
            Err((e, buf)) => {
                self.buf = Some(buf);
                Err(e)
            }
        }
    }

    /// Starts every request of `reqs` in order (`MPI_Startall`); at the first that fails,
    /// stops and returns its error (those before it are started).
    pub fn start_all(reqs: &mut [Persistent<'c, B>]) -> Result<(), Error> {
        reqs.iter_mut().try_for_each(Persistent::start)
    }

    /// Whether the request is started and not yet waited for.
    pub fn is_active(&self) -> bool {
        self.active.is_some()
    }

    /// Blocks until the started operation completes (`MPI_Wait`) and makes the request
    /// inactive, its buffer back in it (a receive's length set to what arrived); the status,
    /// or the operation's error. An error if the request is not active.
    pub fn wait(&mut self) -> Result<Status, Error> {
        let Some(r) = self.active.as_mut() else { return Err(INACTIVE) };
        if !r.is_complete() {
            progress::wait_all(self.comm.engine(), std::slice::from_mut(r));
        }
        self.finish().unwrap_or(Err(INACTIVE))
    }

    /// Makes one step of progress if needed and, if the started operation has completed,
    /// makes the request inactive and returns its outcome (`MPI_Test`); `None` while it is
    /// pending or not started.
    pub fn test(&mut self) -> Option<Outcome> {
        if self.active.as_mut()?.test() {
            self.finish()
        } else {
            None
        }
    }

    /// Blocks until every active request of `reqs` has completed (`MPI_Waitall`, inactive
    /// ones ignored) and makes them inactive. Returns the first error among them; each
    /// one's outcome stays available through [`outcome`](Self::outcome).
    pub fn wait_all(reqs: &mut [Persistent<'c, B>]) -> Result<(), Error> {
        if let Some(first) = reqs.first() {
            progress::wait(first.comm.engine(), reqs, Want::All);
        }
        let mut err = None;
        for p in reqs.iter_mut().filter(|p| p.active.is_some()) {
            if let Some(Err(e)) = p.finish() {
                err.get_or_insert(e);
            }
        }
        err.map_or(Ok(()), Err)
    }

    /// Cancels an active receive that has not matched yet (see [`Request::cancel`]): it
    /// completes with a cancelled status and a wait makes it inactive, its buffer untouched.
    pub fn cancel(&mut self) -> bool {
        self.active.as_mut().is_some_and(Request::cancel)
    }

    /// The outcome of the last start that completed (`None` before the first).
    pub fn outcome(&self) -> Option<Outcome> {
        self.last
    }

    /// The buffer, while inactive.
    pub fn buffer(&self) -> Option<&B> {
        self.buf.as_ref()
    }

    /// The buffer, while inactive, to change before the next start.
    pub fn buffer_mut(&mut self) -> Option<&mut B> {
        self.buf.as_mut()
    }

    /// The buffer, if inactive (an active request is dropped, as a [`Request`] is).
    pub fn into_buffer(mut self) -> Option<B> {
        self.buf.take()
    }

    /// A completed active operation's outcome, its buffer back in place.
    fn finish(&mut self) -> Option<Outcome> {
        let (mut buf, outcome) = self.active.as_mut()?.take_parts()?;
        if let (Err(_), Some(plan)) = (outcome, &self.plan) {
            plan.failed(&mut buf);
        }
        self.active = None;
        self.buf = Some(buf);
        self.last = Some(outcome);
        Some(outcome)
    }
}

impl<B: Send + 'static> Drop for Persistent<'_, B> {
    fn drop(&mut self) {
        // A collective that ended but was not waited for: its buffer goes as a wait would
        // give it back (a failed start's may still be read by a send, `Plan::failed`).
        if self.plan.is_some() && self.active.as_ref().is_some_and(Request::is_complete) {
            self.finish();
        }
    }
}

// SAFETY: an active request's cell is its operation's (see `Request`'s impl); an inactive one
// gives a completed cell of its own, kept as long as the request.
unsafe impl<B: Send + 'static> Attach for Persistent<'_, B> {
    fn completion_cell(&self) -> &CompletionCell {
        match &self.active {
            Some(r) => r.completion_cell(),
            None => consumed_cell(&self.consumed),
        }
    }
}

impl<B: Send + 'static> progress::Waitable for Persistent<'_, B> {
    fn own_cell(&self) -> &CompletionCell {
        match &self.active {
            Some(r) => r.own_cell(),
            None => consumed_cell(&self.consumed),
        }
    }
    fn is_complete(&self) -> bool {
        self.active.as_ref().map_or(true, Request::is_complete)
    }
    fn is_live(&self) -> bool {
        self.active.as_ref().is_some_and(Request::is_live)
    }
    fn engine(&self) -> &Arc<crate::engine::Engine> {
        self.comm.engine()
    }
    fn context_id(&self) -> u32 {
        self.comm.context_id()
    }
    fn part(&self) -> usize {
        self.active.as_ref().map_or(0, Request::part)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::matching::{Source, Tag};
    use crate::{Communicator, Error, Persistent, Runtime};

    /// Frames queued, unmatched, in the collective context of `c`'s rank (taken out).
    fn drain_collective_queue(c: &Communicator) -> usize {
        let (s, st) = (c.engine(), c.coll_state());
        let mut n = 0;
        s.any_matching_state(st, |m| {
            while let Some(frame) = m.take_unexpected(Source::Any, Tag::Any) {
                s.transport.recycle(frame.header.source, frame.payload);
                n += 1;
            }
            false
        });
        n
    }

    /// Failed starts of a persistent collective leave frames behind on the survivors: in a
    /// ring allgather of four ranks, the fourth gone, rank 1 sends to rank 2 before either
    /// learns that the start failed, and rank 2, failing at its send to the lost rank,
    /// cancels its receive from rank 1, whose message stays queued. The next start takes it,
    /// in order (its receive from that peer and tag matches the oldest message first): a
    /// carry-over, not a leak — every later start fails too while a member is gone, so no
    /// result is ever made of it. After many failed starts a survivor holds no more such
    /// frames than after one (at most a message and a failure notice of each peer that
    /// sends to it).
    #[test]
    fn failed_starts_carry_over_a_bounded_number_of_frames() {
        let mut rts = Runtime::builder().env(false).cris(1).build_local(4).unwrap();
        let last = rts.pop().unwrap();
        let cs: Vec<Communicator> = rts.iter().map(|rt| rt.world().clone()).collect();
        fn init(c: &Communicator) -> Persistent<'_, Vec<u64>> {
            c.allgather_init(vec![0u64; 4]).unwrap()
        }
        let mut reqs: Vec<Persistent<'_, Vec<u64>>> = std::thread::scope(|s| {
            let hs: Vec<_> = cs.iter().map(|c| s.spawn(|| init(c))).collect();
            drop(init(last.world()));
            drop(last);
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for _ in 0..20 {
            for r in reqs.iter_mut() {
                r.start().unwrap();
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while reqs.iter().any(Persistent::is_active) {
                assert!(Instant::now() < deadline, "a start that waits for a lost rank never failed");
                for r in reqs.iter_mut().filter(|r| r.is_active()) {
                    if let Some(outcome) = r.test() {
                        assert!(matches!(outcome, Err(Error::PeerLost { .. })), "{outcome:?}");
                    }
                }
            }
            for rt in &rts {
                rt.progress();
            }
        }
        for c in &cs {
            let n = drain_collective_queue(c);
            assert!(n <= 2, "rank {}: {n} frames left behind by 20 failed starts", c.rank());
        }
    }
}
