//! Rendezvous reads in flight on a rank's RMA endpoint (the parent module's *Rendezvous*).
//!
//! A read is *started* (its first chunks posted) and then *advanced* by later passes: each
//! pass reads the RMA endpoint's completion queue (bounded work), posts the chunks that now
//! fit and moves the reads that are over to a `done` queue, which [`Reads::poll`] hands to
//! its caller outside the table's lock. Nothing here waits for a remote: a read from a
//! peer whose own progress is needed to serve it (shm without cross-memory attach,
//! `tcp;ofi_rxm`) never holds up the thread that started it, nor that thread's locks.
//!
//! # The life of one read
//!
//! | state | leaves it when | to |
//! |---|---|---|
//! | posting | every chunk completed | done, `Ok` |
//! | posting | a chunk fails, a post fails, or the peer is marked lost | failed |
//! | failed | its posted chunks completed or failed, or [`DRAIN_LIMIT`] passed ([`LOST_DRAIN`] once the peer is lost) | verdict pending |
//! | verdict pending | the peer is marked lost | done, `PeerLost` |
//! | verdict pending | [`VERDICT_WAIT`] passed since the failure, the peer alive | done, the error |
//!
//! The verdict wait is there because a read from a process that died fails (`ECONNRESET`,
//! `ENOTCONN`, `EIO`) before the job's bootstrap monitor has marked the peer lost (a second
//! or two): the read is then the peer's loss, and reported as such.
//!
//! A read keeps the caller's memory until it is reported: no chunk can still write it then,
//! except after [`DRAIN_LIMIT`] with chunks still posted to a peer that failed (libfabric
//! completes nothing more on a dead connection); their late completions, if any, are told
//! apart by the slot's generation in the operation context and ignored.
//!
//! # Memory ordering
//!
//! `active` and `done` are hints read without the table's lock (is there anything to poll,
//! are finished reads waiting); everything they hint at is read under the lock. A stale
//! `false` delays a read's report by one pass; parked threads are woken by the doorbell the
//! watcher rings after it moved a read to `done` (the doorbell's listen/notify order the
//! flag for a thread that checks after listening).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{transport_error, CTX_KIND, CTX_READ, DRAIN_LIMIT, READS_IN_FLIGHT};
use crate::ofi::{CqError, Endpoint, FiAddr, Post, RemoteRegion};
use crate::Error;

/// Chunk reads posted on the RMA endpoint at once, every read together: at most what its
/// completion queue holds, so no completion is ever dropped for want of room.
pub(super) const CHUNKS_POSTED: usize = 4 * READS_IN_FLIGHT;

/// How long a failed read waits for the verdict on its peer (see the module docs) before
/// it reports its own error.
pub(super) const VERDICT_WAIT: Duration = Duration::from_secs(3);

/// How long a read from a peer known to be lost waits for its posted chunks, counted from
/// its failure: long enough for the passes meanwhile to consume whatever the peer had
/// answered before it died, short enough that the receive fails with `PeerLost` within
/// about a second of the loss (a dead `shm` peer leaves some chunks that never complete).
pub(super) const LOST_DRAIN: Duration = Duration::from_millis(500);

/// Completions one pass reads at most (bounded work per pass).
const PASS_COMPLETIONS: usize = 32;

/// Completions asked for per `fi_cq_read`.
const CQ_BATCH: usize = 16;

/// Finished reads one [`Reads::poll`] hands out at most.
pub(super) const POLL_MAX: usize = 16;

/// Bits of an operation context that carry the slot's generation (above the slot index's
/// 32 bits, below the context kind's byte).
const GEN_MASK: u64 = 0xff_ffff;

/// What one finished read reports: its token and how it ended.
pub(super) type Report = (u64, Result<(), Error>);

/// One read in flight.
struct ReadOp {
    /// The caller's name for it, reported when it is over.
    token: u64,
    /// The rank read from.
    src: u32,
    /// The peer's endpoint the chunks are read from.
    target: FiAddr,
    /// The peer's registered buffer.
    remote: RemoteRegion,
    /// Where the bytes go: `len` bytes the caller lent until the read is reported.
    dst: *mut u8,
    /// Bytes to read.
    len: usize,
    /// Largest single `fi_read`.
    chunk: usize,
    /// Offset of the first byte not yet posted.
    next: usize,
    /// Chunks posted and not completed.
    outstanding: usize,
    /// The first failure, and when it happened.
    failed: Option<(Error, Instant)>,
}

/// One entry of the table: a read, or free; the generation changes each time it is freed.
struct ChunkSlot {
    /// Generation, carried in the context of every chunk posted from this slot.
    gen: u64,
    /// The read using the slot.
    op: Option<ReadOp>,
}

/// The reads of one rank, under `Reads::table`.
struct ReadTable {
    /// Reads by slot (grows to the most reads ever in flight at once, then stays).
    slots: Vec<ChunkSlot>,
    /// Chunks posted and not completed, every read together (at most [`CHUNKS_POSTED`]).
    posted: usize,
    /// Reads that are over, in the order they ended, until a poll reports them.
    done: VecDeque<Report>,
}

/// The rendezvous reads of one rank (see the module docs).
pub(super) struct Reads {
    /// The reads and their completions.
    table: Mutex<ReadTable>,
    /// Reads started and not yet reported (a hint, see *Memory ordering*).
    active: AtomicUsize,
    /// `table.done` is not empty (a hint, see *Memory ordering*).
    finished: AtomicBool,
}

// SAFETY: the raw `dst` pointers are only written through by libfabric and only handed to
// it under the table's lock; the memory belongs to the caller of `start`, which keeps it
// for the read (see `Reads::start`).
unsafe impl Send for Reads {}
// SAFETY: as above; all access to the table goes through its mutex.
unsafe impl Sync for Reads {}

/// Where one rendezvous read comes from and goes to (see [`Reads::start`]).
pub(super) struct ReadFrom {
    /// The caller's name for the read.
    pub(super) token: u64,
    /// The rank read from.
    pub(super) src: u32,
    /// Its endpoint the data is read through.
    pub(super) target: FiAddr,
    /// Its registered buffer.
    pub(super) remote: RemoteRegion,
    /// Largest single `fi_read`.
    pub(super) chunk: usize,
}

impl Reads {
    /// No reads.
    pub(super) fn new() -> Self {
        Reads {
            table: Mutex::new(ReadTable { slots: Vec::new(), posted: 0, done: VecDeque::new() }),
            active: AtomicUsize::new(0),
            finished: AtomicBool::new(false),
        }
    }

    /// Whether reads are in flight or wait to be reported.
    #[inline]
    pub(super) fn any(&self) -> bool {
        // Relaxed: a hint (module docs).
        self.active.load(Ordering::Relaxed) != 0
    }

    /// Whether finished reads wait to be reported.
    #[inline]
    pub(super) fn any_finished(&self) -> bool {
        // Acquire: pairs with the Release store in `advance`, for a thread that checks after
        // listening on the doorbell the watcher rings after it.
        self.finished.load(Ordering::Acquire)
    }

    /// Starts reading `len` bytes into `dst` as `from` says: posts the chunks that fit now.
    /// Its end, success or failure, is reported by a later [`poll`](Self::poll) with
    /// `from.token`.
    ///
    /// # Safety
    /// `dst..dst + len` must be valid for writes, and neither read nor written by anyone
    /// else, until `poll` reported the read (or the endpoint `ep` was closed). `len > 0`.
    pub(super) unsafe fn start(&self, ep: &Endpoint, from: ReadFrom, dst: *mut u8, len: usize) {
        let op = ReadOp {
            token: from.token,
            src: from.src,
            target: from.target,
            remote: from.remote,
            dst,
            len,
            chunk: from.chunk.max(1),
            next: 0,
            outstanding: 0,
            failed: None,
        };
        let mut t = self.table.lock();
        let ReadTable { slots, posted, .. } = &mut *t;
        let i = match slots.iter().position(|s| s.op.is_none()) {
            Some(i) => i,
            None => {
                slots.push(ChunkSlot { gen: 0, op: None });
                slots.len() - 1
            }
        };
        let slot = &mut slots[i];
        let op = slot.op.insert(op);
        // Relaxed: a hint (module docs); the read itself is published by the mutex.
        self.active.fetch_add(1, Ordering::Relaxed);
        post_chunks(ep, posted, i, slot.gen, op, Instant::now());
    }

    /// One pass over the reads (see the module docs) if no other thread is making one;
    /// returns whether finished reads wait to be reported. For the watcher.
    pub(super) fn advance(&self, ep: &Endpoint, alive: impl Fn(u32) -> bool) -> bool {
        if !self.any() {
            return false;
        }
        let Some(mut t) = self.table.try_lock() else { return self.any_finished() };
        self.pass(&mut t, ep, &alive);
        !t.done.is_empty()
    }

    /// One pass over the reads (unless another thread is making one), then hands up to `max`
    /// finished reads (at most [`POLL_MAX`]) to `f`, after the table's lock is released;
    /// returns how many. One load when no read is in flight.
    #[inline]
    pub(super) fn poll(&self, ep: &Endpoint, alive: impl Fn(u32) -> bool, max: usize, f: impl FnMut(u64, Result<(), Error>)) -> usize {
        if !self.any() {
            return 0;
        }
        self.poll_slow(ep, &alive, max, f)
    }

    #[cold]
    fn poll_slow(&self, ep: &Endpoint, alive: &dyn Fn(u32) -> bool, max: usize, mut f: impl FnMut(u64, Result<(), Error>)) -> usize {
        let Some(mut t) = self.table.try_lock() else { return 0 };
        self.pass(&mut t, ep, alive);
        let mut out: [Option<Report>; POLL_MAX] = [None; POLL_MAX];
        let mut n = 0;
        while n < max.min(POLL_MAX) {
            let Some(r) = t.done.pop_front() else { break };
            out[n] = Some(r);
            n += 1;
        }
        // Release: see `any_finished`.
        self.finished.store(!t.done.is_empty(), Ordering::Release);
        drop(t);
        // Relaxed: a hint (module docs).
        self.active.fetch_sub(n, Ordering::Relaxed);
        for (token, outcome) in out.into_iter().flatten() {
            f(token, outcome);
        }
        n
    }

    /// Reads completions, posts chunks, and moves the reads that are over to `done`.
    fn pass(&self, t: &mut ReadTable, ep: &Endpoint, alive: &dyn Fn(u32) -> bool) {
        let now = Instant::now();
        let mut budget = PASS_COMPLETIONS;
        while budget > 0 {
            match ep.cq().read_each(budget.min(CQ_BATCH), |c| t.chunk_done(c.context, None, now)) {
                Ok(n) => {
                    budget = budget.saturating_sub(n);
                    if n < CQ_BATCH {
                        break;
                    }
                }
                Err(CqError::Completion(e)) => {
                    t.chunk_done(e.context, Some(Error::Transport { op: "fi_read", code: e.error.code }), now);
                    budget -= 1;
                }
                Err(CqError::Fatal(e)) => {
                    // Nothing more will complete: every read fails (drained by DRAIN_LIMIT).
                    let err = transport_error(&e);
                    for op in t.slots.iter_mut().filter_map(|s| s.op.as_mut()) {
                        op.failed.get_or_insert((err, now));
                    }
                    break;
                }
            }
        }
        let ReadTable { slots, posted, done } = t;
        let mut room = true;
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(op) = slot.op.as_mut() else { continue };
            if op.failed.is_none() && !alive(op.src) {
                op.failed = Some((Error::PeerLost { rank: op.src }, now));
            }
            if room {
                room = post_chunks(ep, posted, i, slot.gen, op, now);
            }
            let Some(outcome) = op.outcome(now, alive) else { continue };
            // Chunks given up on (DRAIN_LIMIT) no longer count against the CQ's room; their
            // completions, should any come, carry the old generation.
            *posted -= op.outstanding.min(*posted);
            done.push_back((op.token, outcome));
            slot.op = None;
            slot.gen = (slot.gen + 1) & GEN_MASK;
        }
        if !done.is_empty() {
            // Release: see `any_finished`.
            self.finished.store(true, Ordering::Release);
        }
    }
}

impl ReadTable {
    /// A chunk's completion (or failure, `err`) with context `ctx`.
    fn chunk_done(&mut self, ctx: u64, err: Option<Error>, now: Instant) {
        if ctx & CTX_KIND != CTX_READ {
            return;
        }
        let (i, gen) = ((ctx & 0xffff_ffff) as usize, (ctx >> 32) & GEN_MASK);
        let Some(ChunkSlot { gen: g, op: Some(op) }) = self.slots.get_mut(i) else { return };
        if *g != gen || op.outstanding == 0 {
            // A chunk of a read given up on earlier.
            return;
        }
        op.outstanding -= 1;
        self.posted = self.posted.saturating_sub(1);
        if let Some(e) = err {
            op.failed.get_or_insert((e, now));
        }
    }
}

impl ReadOp {
    /// How the read ended, if it has (the table in the module docs).
    fn outcome(&self, now: Instant, alive: &dyn Fn(u32) -> bool) -> Option<Result<(), Error>> {
        let Some((err, at)) = self.failed else {
            return (self.next >= self.len && self.outstanding == 0).then_some(Ok(()));
        };
        let since = now.saturating_duration_since(at);
        // Chunks still posted to a live peer may yet complete (and write): wait for them up
        // to DRAIN_LIMIT. A lost peer answers nothing more; what it answered before it died
        // was in this rank's queues already and is consumed by the passes made meanwhile
        // (the watcher's included, every millisecond at most while reads are in flight).
        let drain = if alive(self.src) { DRAIN_LIMIT } else { LOST_DRAIN };
        if self.outstanding > 0 && since < drain {
            return None;
        }
        if !alive(self.src) {
            return Some(Err(Error::PeerLost { rank: self.src }));
        }
        (since >= VERDICT_WAIT || self.outstanding > 0).then_some(Err(err))
    }
}

/// Posts the chunks of `op` (slot `i`, generation `gen`) that fit: up to [`READS_IN_FLIGHT`]
/// of its own and [`CHUNKS_POSTED`] in all. Returns `false` when the endpoint refused one
/// for now (`FI_EAGAIN`: nothing more is posted this pass).
fn post_chunks(ep: &Endpoint, posted: &mut usize, i: usize, gen: u64, op: &mut ReadOp, now: Instant) -> bool {
    let ctx = CTX_READ | gen << 32 | i as u64;
    while op.failed.is_none() && op.next < op.len && op.outstanding < READS_IN_FLIGHT && *posted < CHUNKS_POSTED {
        let n = op.chunk.min(op.len - op.next);
        // SAFETY: `next..next + n` is inside the `len` bytes at `dst` that `Reads::start`'s
        // caller lent until the read is reported, which it is not before every chunk posted
        // here has completed or failed (or DRAIN_LIMIT passed after a failure).
        let part = unsafe { std::slice::from_raw_parts_mut(op.dst.add(op.next), n) };
        // SAFETY: as above: libfabric may write `part` until the chunk's completion is read.
        match unsafe { ep.read(part, None, op.target, &op.remote, op.next as u64, ctx) } {
            Ok(Post::Posted) => {
                op.outstanding += 1;
                op.next += n;
                *posted += 1;
            }
            Ok(Post::WouldBlock) => return false,
            Err(e) => op.failed = Some((transport_error(&e), now)),
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed read with a chunk still posted: from a live peer it waits out
    /// [`DRAIN_LIMIT`] (the chunk may still write the buffer), from a lost one only
    /// [`LOST_DRAIN`], and then reports `PeerLost` (a dead `shm` peer leaves chunks that never
    /// complete: the receive used to take the full 5 s to fail).
    #[test]
    fn a_read_from_a_lost_peer_gives_up_its_chunks_sooner() {
        let t0 = Instant::now();
        let op = ReadOp {
            token: 1,
            src: 3,
            target: FiAddr::UNSPEC,
            remote: RemoteRegion { base: 0, key: 0, len: 1 << 20 },
            dst: std::ptr::null_mut(),
            len: 1 << 20,
            chunk: 1 << 16,
            next: 1 << 17,
            outstanding: 2,
            failed: Some((Error::Transport { op: "fi_read", code: 5 }, t0)),
        };
        let (alive, lost) = (|_: u32| true, |_: u32| false);
        let after = |d: Duration| t0 + d;
        assert_eq!(op.outcome(after(LOST_DRAIN / 2), &lost), None, "the lost peer's chunks get a moment");
        assert_eq!(op.outcome(after(LOST_DRAIN), &lost), Some(Err(Error::PeerLost { rank: 3 })));
        assert_eq!(op.outcome(after(LOST_DRAIN * 2), &alive), None, "a live peer's chunk may still complete");
        assert_eq!(op.outcome(after(DRAIN_LIMIT), &alive), Some(Err(Error::Transport { op: "fi_read", code: 5 })));
        assert!(LOST_DRAIN * 4 <= DRAIN_LIMIT);
        // Every chunk back, one failed: the verdict wait. A live peer's read reports its own
        // error only after VERDICT_WAIT (a dead sender's connection fails before the job
        // reports the loss); once the peer is lost, `PeerLost` at once.
        let op = ReadOp { outstanding: 0, ..op };
        assert_eq!(op.outcome(after(VERDICT_WAIT / 2), &alive), None, "the verdict is awaited");
        assert_eq!(op.outcome(after(VERDICT_WAIT / 2), &lost), Some(Err(Error::PeerLost { rank: 3 })));
        assert_eq!(op.outcome(after(VERDICT_WAIT), &alive), Some(Err(Error::Transport { op: "fi_read", code: 5 })));
        // No failure: done once every chunk is posted and back.
        let op = ReadOp { failed: None, next: 1 << 20, ..op };
        assert_eq!(op.outcome(after(Duration::ZERO), &lost), Some(Ok(())));
    }
}
