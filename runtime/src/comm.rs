//! Communicators: point-to-point operations (path steps 1-2), `dup` and `free`.
//!
//! A communicator is a context id plus per-rank matching state. Each communicator uses two
//! contexts: an even one for user messages and the odd one after it for the runtime's own
//! collective traffic (context agreement), so the two never match each other.
//!
//! # Context ids and their reuse
//!
//! A context id is a slot of the context table (its low [`SLOT_BITS`] bits) and the slot's
//! generation (the bits above). `dup`, `split` and `create_group` agree on a slot pair free on
//! every member and on a generation above every one a member has had in that slot
//! (`create.rs`, [Dinan 2012]). `free` gives the slot
//! back at once on its rank; the slot is agreed on again only once every rank has freed it,
//! and frames of the old generation still in flight are then recognised as stale and
//! dropped (an `Rts` still gets its `Fin`, so no sender waits forever) instead of reaching
//! the new communicator. The freed state itself is collected later ([Goodell 2010, §V-B]; see
//! [`Engine::collect_retired`]).
//!
//! [`SLOT_BITS`]: crate::engine::SLOT_BITS

use std::fmt;
use std::sync::Arc;

use weft_sync::{Error, Status};
use weft_transport::{FrameKind, Header};

use crate::buffer::{Primitive, RecvBuf, SendBuf};
use crate::engine::{main_path_inline, slot_of, CommState, Engine, SendOutcome};
use crate::group::Group;
use crate::loom::sync::atomic::{AtomicU32, Ordering};
use crate::matching::{MatchState, Source, Tag};
use crate::operation::{new_operation, Held};
use crate::request::Request;

/// MPI 4.0 communicator assertions (the `mpi_assert_*` info keys), given to
/// [`Communicator::dup_with_assertions`] and inherited by `dup`.
///
/// Each one is a promise by the program that lets weft drop work: a communicator that
/// asserts `no_any_tag` orders and matches messages per tag partition, each under its own
/// lock, so threads that use different tags on one shared communicator no longer contend
/// on one matching lock, one sequence counter per destination and one reorder window per
/// source ([Patinyasakdikul 2019, §5.4.3] found that contention the main cost of multithreaded MPI).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Assertions {
    /// `mpi_assert_allow_overtaking`: messages need not match in the order they were sent.
    pub allow_overtaking: bool,
    /// `mpi_assert_no_any_tag`: no receive or probe on the communicator uses `Tag::Any`
    /// (one that does fails with `Error::InvalidArgument`). Messages of one source and tag
    /// still match in send order.
    pub no_any_tag: bool,
}

/// A communicator: a group of ranks ([`Group`]) and a private matching space.
///
/// Ranks given to and reported by a communicator (destinations, sources, statuses) are
/// ranks of its group; frames name the world ranks they translate to.
///
/// Share it between threads by reference (it is `Sync`); requests borrow it rather than
/// counting a reference per message ([Goodell 2010]).
#[derive(Clone)]
pub struct Communicator {
    engine: Arc<Engine>,
    p2p: Arc<CommState>,
    coll: Arc<CommState>,
    /// The members, by world rank.
    group: Group,
    /// This rank's rank in `group`.
    rank: u32,
    /// World ranks to ranks in `group`.
    of_world: RankMap,
    /// Collectives called on the communicator so far (their sequence numbers, `nbc.rs`).
    coll_seq: Arc<AtomicU32>,
    /// Persistent collectives initialized on the communicator so far (their tags' own
    /// sequence, `nbc.rs`).
    persistent_seq: Arc<AtomicU32>,
}

/// A communicator's translation of world ranks (which frames, statuses and errors name) to
/// ranks of its group; it holds nothing of the runtime.
#[derive(Clone)]
pub(crate) struct RankMap(
    /// Per world rank, its rank in the group (`u32::MAX`: not a member).
    Arc<[u32]>,
    /// Whether every world rank is its own rank in the group (nothing to translate).
    bool,
);

impl RankMap {
    /// The rank in the group of world rank `w` (a member; else `w` unchanged).
    #[inline]
    pub(crate) fn rank(&self, w: u32) -> u32 {
        if self.1 {
            return w;
        }
        match self.0.get(w as usize) {
            Some(&r) if r != u32::MAX => r,
            _ => w,
        }
    }

    /// `e` with a lost peer named by its rank in the group.
    #[inline]
    pub(crate) fn error(&self, e: Error) -> Error {
        match e {
            Error::PeerLost { rank } => Error::PeerLost { rank: self.rank(rank) },
            e => e,
        }
    }

    /// `st` with its source named by its rank in the group.
    #[inline]
    pub(crate) fn status(&self, st: Status) -> Status {
        Status { source: self.rank(st.source), ..st }
    }

    /// An outcome (which names world ranks) with ranks of the group.
    #[inline]
    pub(crate) fn outcome(&self, o: weft_sync::Outcome) -> weft_sync::Outcome {
        o.map(|st| self.status(st)).map_err(|e| self.error(e))
    }
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("context", &self.p2p.context)
            .field("rank", &self.rank())
            .field("size", &self.size())
            .field("overtaking", &self.p2p.overtaking)
            .field("no_any_tag", &self.p2p.no_any_tag())
            .finish()
    }
}

impl Communicator {
    /// The communicator of `group` (which holds this rank) on the context pair at `context`.
    /// Its states are sized by the world (frames name world ranks).
    pub(crate) fn create(engine: &Arc<Engine>, context: u32, group: Group, a: Assertions) -> Result<Self, Error> {
        let world = engine.transport.size();
        let rank = group.rank().ok_or(Error::InvalidArgument("a communicator of a group without the calling rank"))?;
        let mut of_world = vec![u32::MAX; world as usize];
        for (i, &w) in group.world_ranks().iter().enumerate() {
            of_world[w as usize] = i as u32;
        }
        let p2p = Arc::new(CommState::new(engine, context, world, a.allow_overtaking, a.no_any_tag, true));
        let coll = Arc::new(CommState::new(engine, context + 1, world, false, false, false));
        engine.install(p2p.clone())?;
        if let Err(e) = engine.install(coll.clone()) {
            // Not half made: the user context goes again.
            engine.retire(&p2p);
            return Err(e);
        }
        Ok(Communicator {
            engine: engine.clone(),
            p2p,
            coll,
            group,
            rank,
            of_world: RankMap(of_world.clone().into(), of_world.iter().enumerate().all(|(w, &r)| r == w as u32)),
            coll_seq: Arc::new(AtomicU32::new(0)),
            persistent_seq: Arc::new(AtomicU32::new(0)),
        })
    }

    /// The group of the communicator (`MPI_Comm_group`).
    pub fn group(&self) -> Group {
        self.group.clone()
    }

    /// The world rank of rank `r` of this communicator (`r` in range).
    #[inline]
    pub(crate) fn world_of(&self, r: u32) -> u32 {
        self.group.world_ranks()[r as usize]
    }

    /// The world rank of each member, in rank order.
    pub(crate) fn world_ranks(&self) -> &Arc<[u32]> {
        self.group.world_ranks()
    }

    /// The rank in this communicator of world rank `w` (a member; else `w` unchanged).
    pub(crate) fn rank_of_world(&self, w: u32) -> u32 {
        self.of_world.rank(w)
    }

    /// `e` with a lost peer named by its rank here (as `rank_of_world`).
    #[inline]
    pub(crate) fn local_error(&self, e: Error) -> Error {
        self.of_world.error(e)
    }

    /// `st` with its source named by its rank here.
    #[inline]
    pub(crate) fn local_status(&self, st: Status) -> Status {
        self.of_world.status(st)
    }

    /// A request's outcome (which names world ranks) with ranks here.
    #[inline]
    pub(crate) fn local_outcome(&self, o: weft_sync::Outcome) -> weft_sync::Outcome {
        self.of_world.outcome(o)
    }

    /// Whether ranks here differ from world ranks (statuses and errors need translating).
    pub(crate) fn renames_ranks(&self) -> bool {
        !self.of_world.1
    }

    /// The translation of world ranks to ranks here, to keep beyond a borrow.
    pub(crate) fn rank_map(&self) -> RankMap {
        self.of_world.clone()
    }

    /// The collective context's state.
    pub(crate) fn coll_state(&self) -> &CommState {
        &self.coll
    }

    /// The sequence of collectives called on the communicator (`nbc.rs`).
    pub(crate) fn coll_seq(&self) -> &AtomicU32 {
        &self.coll_seq
    }

    /// [`coll_seq`](Self::coll_seq), shared.
    pub(crate) fn coll_seq_arc(&self) -> &Arc<AtomicU32> {
        &self.coll_seq
    }

    /// The sequence of persistent collectives initialized on the communicator (`nbc.rs`).
    pub(crate) fn persistent_seq(&self) -> &AtomicU32 {
        &self.persistent_seq
    }

    /// Whether the communicator was freed (through any handle).
    pub(crate) fn is_freed(&self) -> bool {
        self.p2p.is_freed()
    }

    #[inline]
    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// This rank's rank in the communicator.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    #[inline]
    pub fn size(&self) -> u32 {
        self.group.size()
    }

    /// The context id (for diagnostics).
    pub fn context_id(&self) -> u32 {
        self.p2p.context
    }

    /// Whether messages on this communicator may overtake each other.
    pub fn allows_overtaking(&self) -> bool {
        self.p2p.overtaking
    }

    /// The communicator's assertions (inherited by `dup`).
    pub fn assertions(&self) -> Assertions {
        Assertions { allow_overtaking: self.p2p.overtaking, no_any_tag: self.p2p.no_any_tag() }
    }

    /// A destination rank and tag of a send, on a communicator not freed.
    #[inline]
    pub(crate) fn check(&self, rank: u32, tag: i32) -> Result<(), Error> {
        if self.p2p.is_freed() {
            return Err(Error::CommFreed);
        }
        if rank >= self.size() {
            return Err(Error::RankOutOfRange { rank, size: self.size() });
        }
        let max = self.engine.config.max_tag;
        if !(0..=max).contains(&tag) {
            return Err(Error::InvalidTag { tag, max });
        }
        Ok(())
    }

    /// Starts sending `buf` to `dest` with `tag` (`MPI_Isend`). The request resolves to the
    /// buffer (given back untouched) and the status.
    ///
    /// Messages up to the eager threshold are copied out at once; larger ones go by
    /// rendezvous and the buffer is read in place by the receiver. When the destination's
    /// inbox is full this call makes progress until there is room (flow control).
    // Inlined into the caller, as `irecv`: a request returned from a call is written field
    // by field and read back by the caller's wider loads, which cannot take the values from
    // the store buffer and wait until every store before them has reached the cache, the
    // frame's slot (whose line the receiver's core holds) among them.
    #[inline(always)]
    pub fn isend<B: SendBuf>(&self, buf: B, dest: u32, tag: i32) -> Result<Request<'_, B>, Error> {
        self.check(dest, tag)?;
        self.isend_on(&self.p2p, buf, self.world_of(dest), tag).map_err(|e| self.local_error(e))
    }

    /// [`isend`](Self::isend), appending the request to `reqs` (as `MPI_Isend` writes its
    /// request into the caller's array): on success `reqs` has one more element, on an
    /// error it is unchanged (and `buf` dropped).
    ///
    /// The request is written straight into `reqs`'s storage. `reqs.push(comm.isend(..)?)`
    /// builds it in a temporary and copies it over with 16-byte loads; each spans fields
    /// written by narrower stores, so it cannot take its value from the store buffer and
    /// waits until every older store has reached the cache, among them the frame's slot,
    /// whose line the receiving core holds: a wait of a core-to-core transfer a message
    /// in a loop of sends (docs/BENCHMARKS.md, "Message rate: multirate").
    // Written out here and in `irecv_into`, not through a helper the two share with `isend`
    // and `irecv`: through one (the reservation and the length in a function of their
    // own, the post in another), the compiler built the request in a temporary again
    // (`msgcost --into`: 1,228 instructions a message against 1,182).
    #[inline(always)]
    pub fn isend_into<'c, B: SendBuf>(&'c self, reqs: &mut Vec<Request<'c, B>>, buf: B, dest: u32, tag: i32) -> Result<(), Error> {
        self.check(dest, tag)?;
        reqs.reserve(1);
        let at = reqs.as_mut_ptr().wrapping_add(reqs.len());
        self.post_send(
            &self.p2p,
            buf,
            (self.world_of(dest), tag),
            |e, _| e,
            // SAFETY: `reserve` made room for one element past the length, and nothing
            // touches `reqs` until `set_len` below counts the element written.
            |st, b| unsafe { at.write(Request::sent(self, st, b)) },
            // SAFETY: as above.
            |r| unsafe { at.write(r) },
        )
        .map_err(|e| self.local_error(e))?;
        // SAFETY: the element past the length was written above.
        unsafe { reqs.set_len(reqs.len() + 1) };
        Ok(())
    }

    /// Starts sending on context `st` to world rank `dest`.
    #[inline(always)]
    pub(crate) fn isend_on<B: SendBuf>(&self, st: &CommState, buf: B, dest: u32, tag: i32) -> Result<Request<'_, B>, Error> {
        self.post_send(st, buf, (dest, tag), |e, _| e, |st, b| Request::sent(self, st, b), |r| r)
    }

    /// [`isend_on`](Self::isend_on) for a small collective's step: a send that went at
    /// once hands its buffer and status to `gone` and makes no request (`None`); one still
    /// in flight gives its request.
    #[inline(always)]
    pub(crate) fn isend_or_gone<B: SendBuf>(
        &self,
        st: &CommState,
        buf: B,
        dest: u32,
        tag: i32,
        gone: impl FnOnce(B, Status),
    ) -> Result<Option<Request<'_, B>>, Error> {
        self.post_send(
            st,
            buf,
            (dest, tag),
            |e, _| e,
            |st, b| {
                gone(b, st);
                None
            },
            Some,
        )
    }

    /// [`isend_on`](Self::isend_on), giving the buffer back with the error of a send that
    /// could not be posted (a persistent send keeps it for its next start).
    #[inline]
    pub(crate) fn isend_or_back<B: SendBuf>(&self, st: &CommState, buf: B, dest: u32, tag: i32) -> Result<Request<'_, B>, (Error, B)> {
        self.post_send(st, buf, (dest, tag), |e, b| (e, b), |st, b| Request::sent(self, st, b), |r| r)
    }

    /// Posts a send on context `st` to world rank `dest`; a send that could not be posted
    /// gives its error and buffer to `refused`, one gone at once its status and buffer to `sent`,
    /// one in flight its request to `pending` (`to`: the destination and the tag). The eager
    /// path is inlined into the caller, so that the request is built in the result the
    /// caller returns, not repacked from another; a rendezvous goes out of line.
    #[inline(always)]
    fn post_send<'c, B: SendBuf, E, R>(
        &'c self,
        st: &CommState,
        buf: B,
        (dest, tag): (u32, i32),
        refused: impl FnOnce(Error, B) -> E,
        sent: impl FnOnce(Status, B) -> R,
        pending: impl FnOnce(Request<'c, B>) -> R,
    ) -> Result<R, E> {
        let s = &*self.engine;
        let bytes = buf.as_bytes();
        let len = bytes.len();
        if len > s.config.eager_threshold {
            return self.isend_rendezvous(st, buf, dest, tag).map(pending).map_err(|(e, b)| refused(e, b));
        }
        let k = s.cri_for_thread();
        let header = self.send_header(st, k, dest, tag, len);
        // SAFETY: the bytes belong to `buf`, which the request keeps (or orphans into the
        // inner) until a deferred frame has gone out and completed the inner.
        let posted = match unsafe { s.post_frame(k, dest, header, bytes, || Some(new_operation(|i| i.context = st.context))) } {
            Ok(posted) => posted,
            Err(e) => return Err(refused(e, buf)),
        };
        Ok(match posted {
            SendOutcome::Sent => sent(Status { source: dest, tag, bytes: len }, buf),
            SendOutcome::Deferred(inner) => pending(Request::send(
                self,
                inner.expect("an eager deferral carries its request"),
                buf,
                st.place(Source::Rank(dest), Tag::Is(tag)).part,
            )),
        })
    }

    /// The eager header of the next frame to `dest` with `tag` on context `st`, sent through
    /// CRI `k` (its sequence numbers taken).
    #[inline]
    fn send_header(&self, st: &CommState, k: usize, dest: u32, tag: i32, len: usize) -> Header {
        let (chan, seq, gseq) = st.sequence_numbers(k, dest, tag);
        Header {
            kind: FrameKind::Eager,
            src_cri: k as u16,
            context: st.context,
            source: self.engine.transport.rank(),
            tag,
            seq,
            gseq,
            chan: chan as u16,
            len: len as u64,
            cookie: 0,
            key: 0,
            addr: 0,
        }
    }

    /// [`post_send`](Self::post_send) of a message above the eager threshold: a rendezvous.
    #[inline(never)]
    fn isend_rendezvous<B: SendBuf>(&self, st: &CommState, buf: B, dest: u32, tag: i32) -> Result<Request<'_, B>, (Error, B)> {
        let s = &*self.engine;
        let bytes = buf.as_bytes();
        let len = bytes.len();
        let k = s.cri_for_thread();
        let mut header = self.send_header(st, k, dest, tag, len);
        // SAFETY: the bytes belong to `buf`, which the request keeps (or orphans into the
        // inner) until the `Fin` completes it; `Fin` handling deregisters before completing.
        let key = match unsafe { s.transport.register(bytes.as_ptr(), len) } {
            Ok(key) => key,
            Err(e) => return Err((e, buf)),
        };
        let inner = new_operation(|i| {
            i.context = st.context;
            i.key.store(key, Ordering::Relaxed);
        });
        header.kind = FrameKind::Rts;
        header.key = key;
        header.cookie = s.track_rendezvous(dest, &inner);
        // SAFETY: the frame carries no payload.
        if let Err(e) = unsafe { s.post_frame(k, dest, header, &[], || None) } {
            s.untrack_rendezvous(header.cookie, None);
            s.transport.deregister(key);
            unposted(inner, e);
            return Err((e, buf));
        }
        Ok(Request::send(self, inner, buf, st.place(Source::Rank(dest), Tag::Is(tag)).part))
    }

    /// Starts receiving into `buf`'s capacity from `source` with `tag` (`MPI_Irecv`). The
    /// request resolves to the buffer, its length set to what arrived, and the status.
    ///
    /// A message the source sent before it was lost (or finished: dropped its runtime) is
    /// still received; a receive that only a gone rank could match (`source` gone, or
    /// `Source::Any` with no peer left) fails with [`Error::PeerLost`] — here, if that is
    /// already known, else when it becomes known, as every pending request that needs the
    /// rank does.
    #[inline(always)]
    pub fn irecv<B: RecvBuf>(&self, buf: B, source: impl Into<Source>, tag: impl Into<Tag>) -> Result<Request<'_, B>, Error> {
        let tag = tag.into();
        let source = self.check_recv(source.into(), tag)?;
        self.irecv_here(buf, source, tag)
    }

    /// [`irecv`](Self::irecv), appending the request to `reqs` (as `MPI_Irecv` writes its
    /// request into the caller's array): on success `reqs` has one more element, on an
    /// error it is unchanged (and `buf` dropped). The request is written straight into
    /// `reqs`'s storage, not copied there from a temporary (see
    /// [`isend_into`](Self::isend_into)).
    #[inline(always)]
    pub fn irecv_into<'c, B: RecvBuf>(
        &'c self,
        reqs: &mut Vec<Request<'c, B>>,
        buf: B,
        source: impl Into<Source>,
        tag: impl Into<Tag>,
    ) -> Result<(), Error> {
        let tag = tag.into();
        let source = self.check_recv(source.into(), tag)?;
        reqs.reserve(1);
        let at = reqs.as_mut_ptr().wrapping_add(reqs.len());
        // SAFETY: `reserve` made room for one element past the length, and nothing touches
        // `reqs` until `set_len` below counts the element written.
        self.post_recv(&self.p2p, buf, source, tag, |e, _| self.local_error(e), |r| unsafe { at.write(r) })?;
        // SAFETY: the element past the length was written above.
        unsafe { reqs.set_len(reqs.len() + 1) };
        Ok(())
    }

    /// [`irecv_on`](Self::irecv_on) on the user context, an error naming ranks here: the
    /// request is built in the result `irecv` returns, not moved out of the inner call's
    /// result by an error's translation (72 bytes a receive), and inlined with `irecv`
    /// into the caller (see `isend`).
    #[inline(always)]
    fn irecv_here<B: RecvBuf>(&self, buf: B, source: Source, tag: Tag) -> Result<Request<'_, B>, Error> {
        self.post_recv(&self.p2p, buf, source, tag, |e, _| self.local_error(e), |r| r)
    }

    /// A receive's source and tag, on a communicator not freed: the source as a world rank.
    #[inline]
    pub(crate) fn check_recv(&self, source: Source, tag: Tag) -> Result<Source, Error> {
        let source = match source {
            Source::Rank(r) => {
                self.check(r, 0)?;
                Source::Rank(self.world_of(r))
            }
            Source::Any if self.p2p.is_freed() => return Err(Error::CommFreed),
            Source::Any => Source::Any,
        };
        self.check_recv_tag(tag)?;
        Ok(source)
    }

    /// A receive's or probe's tag: in range, and not `Tag::Any` on a `no_any_tag`
    /// communicator.
    #[inline]
    fn check_recv_tag(&self, tag: Tag) -> Result<(), Error> {
        match tag {
            Tag::Is(t) => {
                let max = self.engine.config.max_tag;
                if !(0..=max).contains(&t) {
                    return Err(Error::InvalidTag { tag: t, max });
                }
            }
            Tag::Any if self.p2p.no_any_tag() => {
                return Err(Error::InvalidArgument("Tag::Any on a communicator that asserts no_any_tag"));
            }
            Tag::Any => {}
        }
        Ok(())
    }

    /// Starts receiving on context `st` from `source` (a world rank).
    pub(crate) fn irecv_on<B: RecvBuf>(&self, st: &CommState, buf: B, source: Source, tag: Tag) -> Result<Request<'_, B>, Error> {
        // The request is built in the result returned, not repacked from another `Result`.
        self.post_recv(st, buf, source, tag, |e, _| e, |r| r)
    }

    /// [`irecv_on`](Self::irecv_on), giving the buffer back with the error of a receive that
    /// could not be posted (a persistent collective keeps it for its next start).
    pub(crate) fn irecv_or_back<B: RecvBuf>(&self, st: &CommState, buf: B, source: Source, tag: Tag) -> Result<Request<'_, B>, (Error, B)> {
        self.post_recv(st, buf, source, tag, |e, b| (e, b), |r| r)
    }

    /// Posts a receive on context `st`; a receive that could not be posted gives its error
    /// and buffer to `refused`, one posted its request to `made` (which builds the
    /// caller's result in place).
    #[inline(always)]
    fn post_recv<'c, B: RecvBuf, E, R>(
        &'c self,
        st: &CommState,
        mut buf: B,
        source: Source,
        tag: Tag,
        refused: impl FnOnce(Error, B) -> E,
        made: impl FnOnce(Request<'c, B>) -> R,
    ) -> Result<R, E> {
        let s = &*self.engine;
        let inner = recv_operation(st.context, &mut buf);
        s.lay_out_for(st, source, tag);
        let at = st.place(source, tag);
        // A frame already here is handed out through `early`, not the return values.
        let mut early = None;
        let posted = main_path_inline!(s, || {
            s.with_matching_of::<_, false>(st, at, source, tag, |m| {
                // Under the matching lock: `free` sets the flag before it drains the queues,
                // so a receive posted here is either refused or drained (failed) by it.
                if st.is_freed() {
                    return Err(Error::CommFreed);
                }
                m.post_into(source, tag, &inner, &mut early);
                if early.is_none() {
                    if let Some(rank) = s.lost_source(source) {
                        // Only a lost peer could match it: not left posted to wait forever.
                        m.cancel(&inner);
                        return Err(Error::PeerLost { rank });
                    }
                }
                Ok(())
            })
        });
        if let Err(e) = posted {
            unposted(inner, e);
            return Err(refused(e, buf));
        }
        if let Some(frame) = early {
            s.finish_match(s.cri_for_thread(), Held::of(&inner), frame);
        }
        Ok(made(Request::recv(self, inner, buf, at.part)))
    }

    /// Sends and waits (`MPI_Send`).
    pub fn send<B: SendBuf>(&self, buf: B, dest: u32, tag: i32) -> Result<(B, Status), Error> {
        self.isend(buf, dest, tag)?.wait()
    }

    /// Receives and waits (`MPI_Recv`).
    pub fn recv<B: RecvBuf>(&self, buf: B, source: impl Into<Source>, tag: impl Into<Tag>) -> Result<(B, Status), Error> {
        self.irecv(buf, source, tag)?.wait()
    }

    /// Sends a slice of primitives and waits (copies it once into an owned buffer for the
    /// duration of the operation).
    pub fn send_slice<T: Primitive>(&self, data: &[T], dest: u32, tag: i32) -> Result<Status, Error> {
        self.send(data.to_vec(), dest, tag).map(|(_, st)| st)
    }

    /// Receives into a slice of primitives and waits; the status gives the bytes received.
    pub fn recv_into<T: Primitive>(&self, data: &mut [T], source: impl Into<Source>, tag: impl Into<Tag>) -> Result<Status, Error> {
        let (buf, st) = self.recv(Vec::<T>::with_capacity(data.len()), source, tag)?;
        data[..buf.len()].copy_from_slice(&buf);
        Ok(st)
    }

    /// Checks for a matching message that has arrived without receiving it (`MPI_Iprobe`):
    /// `(source, tag, bytes)`. Makes one step of progress first. A source or tag that a
    /// receive would refuse is refused here too, and with nothing queued, a source that is
    /// gone (lost or finished; `Source::Any` with no peer left) is [`Error::PeerLost`].
    pub fn iprobe(&self, source: impl Into<Source>, tag: impl Into<Tag>) -> Result<Option<Status>, Error> {
        let found = self.probe_with(source.into(), tag.into(), |m, source, tag| m.probe(source, tag))?;
        Ok(found.map(|(source, tag, bytes)| self.local_status(Status { source, tag, bytes })))
    }

    /// A probe's common part ([`iprobe`](Self::iprobe), `improbe`): checks `source` and `tag`
    /// as a receive would, makes one step of progress, and runs `look` under the matching
    /// lock of the tag's partition with the source as a world rank. With nothing found and
    /// only a gone peer able to send it, [`Error::PeerLost`].
    pub(crate) fn probe_with<R>(
        &self,
        mut source: Source,
        tag: Tag,
        mut look: impl FnMut(&mut MatchState, Source, Tag) -> Option<R>,
    ) -> Result<Option<R>, Error> {
        if self.p2p.is_freed() {
            return Err(Error::CommFreed);
        }
        if let Source::Rank(r) = source {
            // As `irecv`: no rank of this communicator, so never a message from it.
            if r >= self.size() {
                return Err(Error::RankOutOfRange { rank: r, size: self.size() });
            }
            source = Source::Rank(self.world_of(r));
        }
        self.check_recv_tag(tag)?;
        let s = &*self.engine;
        s.lay_out_for(&self.p2p, source, tag);
        let _ = s.progress_once();
        // Read before the probe: a gone peer's frames were all delivered into matching before
        // it was marked gone, so a probe after this sees every one of them.
        let gone = s.lost_source(source);
        match s.main_path(|| s.with_matching_of::<_, false>(&self.p2p, self.p2p.place(source, tag), source, tag, |m| look(m, source, tag)))
        {
            Some(found) => Ok(Some(found)),
            // Nothing queued, and only a gone peer could send it: it never will (a loop of
            // probes would poll for ever), as a receive would say.
            None => match gone {
                Some(rank) => Err(Error::PeerLost { rank: self.rank_of_world(rank) }),
                None => Ok(None),
            },
        }
    }

    /// Duplicates the communicator (`MPI_Comm_dup`; collective: every rank must call it, in
    /// the same order per communicator). The new one has its own context and matching
    /// queues; `overtaking` allows its messages to overtake each other.
    pub fn dup(&self) -> Result<Communicator, Error> {
        self.dup_with_assertions(self.assertions())
    }

    /// [`dup`](Self::dup), choosing whether the new communicator allows overtaking (its
    /// other assertions are inherited).
    pub fn dup_with(&self, overtaking: bool) -> Result<Communicator, Error> {
        self.dup_with_assertions(Assertions { allow_overtaking: overtaking, ..self.assertions() })
    }

    /// [`dup`](Self::dup) with these [`Assertions`] (`MPI_Comm_dup_with_info` with the
    /// `mpi_assert_*` keys). Collective: every rank passes the same assertions.
    pub fn dup_with_assertions(&self, assertions: Assertions) -> Result<Communicator, Error> {
        if self.p2p.is_freed() {
            return Err(Error::CommFreed);
        }
        self.create_with(self.group.clone(), assertions)
    }

    /// Frees the communicator (`MPI_Comm_free`): pending receives fail with `CommFreed`,
    /// queued messages are dropped, and every handle's later operations fail with
    /// `CommFreed`. Not collective here; frames still in flight to it are discarded. Its
    /// matching queues are released now, its context id becomes reusable once every rank
    /// has freed the communicator (a reused id carries a new generation, so frames still in
    /// flight for this one are told apart and dropped), and the rest of its state is
    /// collected by a later `dup` (or with the runtime). Freeing it again through another
    /// handle (a clone) does nothing.
    pub fn free(self) {
        let s = &*self.engine;
        // The user context's flag decides which call frees the communicator: that one call
        // frees both contexts and gives their slot pair back (they were claimed together, in
        // `crate::create`). A call through another handle (a clone) does nothing: by then the
        // slot may have been agreed on again for a new communicator, whose claim is not this
        // handle's to release. AcqRel: the winner sees every earlier use of the state; a
        // loser returns without touching it.
        if !self.p2p.mark_freed() {
            return;
        }
        // Set before the queues are drained below, as the user context's is.
        self.coll.mark_freed();
        for st in [&self.p2p, &self.coll] {
            let mut frames = Vec::new();
            let mut posted = Vec::new();
            for part in 0..s.matching_parts(st) {
                let counters = s.with_matching(st, part, |m| {
                    posted.extend(m.drain(|f| frames.push(f)));
                    let counters = m.counters;
                    // Give the queues' memory back (the state lingers until collected; under
                    // `Global` matching the slot's queues are tagged with the id, so a later
                    // communicator in the slot replaces this empty one).
                    *m = MatchState::new(0, st.order());
                    counters
                });
                let mut c = s.contexts.freed_counters.lock();
                c.0.unexpected += counters.unexpected;
                c.0.out_of_sequence += counters.out_of_sequence;
                c.0.match_nanos += counters.match_nanos;
                crate::lock::path::add(&mut c.1, st.matching[part].stats());
            }
            // Outside the matching lock: releasing an `Rts` sends its `Fin`.
            for f in frames {
                s.release_frame(f);
            }
            for r in posted {
                r.cell.complete(Err(Error::CommFreed));
            }
            s.retire(st);
        }
        s.contexts.ids.lock().give_back(slot_of(self.p2p.context) / 2);
    }

    /// The state of the user context (tests).
    #[cfg(test)]
    pub(crate) fn p2p_state(&self) -> Arc<CommState> {
        self.p2p.clone()
    }

    /// The state of the user context.
    pub(crate) fn p2p(&self) -> &CommState {
        &self.p2p
    }

    /// The state of this communicator's context `ctx` (user or collective).
    pub(crate) fn state_of(&self, ctx: u32) -> Option<&CommState> {
        [&self.p2p, &self.coll].into_iter().find(|st| st.context == ctx).map(|st| &**st)
    }
}

/// An operation that was never posted (its send or receive failed to start): completed
/// with the error, which nothing will read, and given back to the thread's pool, so that
/// failed starts allocate no operation either.
#[cold]
fn unposted(inner: std::sync::Arc<crate::operation::Operation>, e: Error) {
    inner.cell.complete(Err(e));
    crate::operation::recycle(inner);
}

/// A pending receive's operation on context `context`, over `buf`'s receive area, marked to
/// be held on the request's reference once posted ([`Held`]).
pub(crate) fn recv_operation<B: RecvBuf>(context: u32, buf: &mut B) -> std::sync::Arc<crate::operation::Operation> {
    let (ptr, cap) = buf.spare();
    let elem = buf.elem_size();
    new_operation(|i| {
        i.ptr = ptr;
        i.cap = cap;
        i.elem = elem;
        i.context = context;
        crate::operation::hold(i);
    })
}
