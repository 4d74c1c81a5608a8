//! Persistent collectives (MPI 4.0 §6.13): [`Communicator::barrier_init`],
//! [`Communicator::bcast_init`], [`Communicator::reduce_init`],
//! [`Communicator::allreduce_init`], [`Communicator::gather_init`],
//! [`Communicator::scatter_init`], [`Communicator::allgather_init`],
//! [`Communicator::alltoall_init`], their `v` forms ([`Communicator::gatherv_init`],
//! [`Communicator::scatterv_init`], [`Communicator::allgatherv_init`],
//! [`Communicator::alltoallv_init`]), [`Communicator::scan_init`] and
//! [`Communicator::exscan_init`] give a [`Persistent`] request like
//! [`send_init`](Communicator::send_init)'s, started and waited for as often as needed, and
//! started together with point-to-point ones by [`Persistent::start_all`].
//!
//! Each works in one buffer, in place (as MPI's with `MPI_IN_PLACE`): the rank's data before
//! a start, its result after the wait. Where MPI's send and receive buffers differ in
//! length, the buffer has the receive buffer's length where the rank receives more than it
//! sends (a gather's root, every rank of an allgather), the send buffer's where it sends
//! more (a scatter's root); the others hold one block.
//!
//! The init call is a collective: every rank of the communicator makes it, in the same order
//! as its other collectives, with the same length, op and root — which it checks with one
//! allreduce (a `v` form first trades the counts: the root scatters its own, the ranks of an
//! alltoall trade theirs), so a rank that passed another length or root gets an error at
//! init on every rank, not a hang at a start. It then fixes the whole schedule (MPICH computes
//! its persistent schedules once too): the steps of the algorithm in world ranks, the
//! buffers of every step's sends and receives, and the tag of the collective's sequence
//! number, which every start reuses. A start hands the schedule to the rank's progress
//! (`engine/schedules.rs`), which takes its steps as their messages complete, and gets the
//! schedule back when it ends (`Schedule::finish`): in steady state a start allocates
//! nothing (`runtime/tests/zero_alloc_persistent_coll.rs`).
//!
//! A start that fails (a peer lost, the communicator freed) tells every other member, as a
//! nonblocking collective does (`nbc.rs`): each start that has waited a while listens for
//! such a notice, so a member that waits for a rank that failed, not for the lost peer
//! itself, fails too instead of waiting forever (a start that ends within a few advances
//! never posts that receive from any source, nor cancels it; one that fails looks for a
//! notice that came before it reports its own error; the first start, and every start after
//! a failed one, posts the receive with its first step). It keeps the buffers of the
//! messages it had posted: a receive is cancelled and a send that has finished gives its
//! copy back at once, one still in flight at the next start (a send or receive refused when
//! posted gives its buffer back too), so the starts after a failure allocate no message
//! buffers either (`runtime/tests/zero_alloc_failed_start.rs`).
//!
//! Starts of one persistent collective reuse its tag: each rank sends to each peer, and
//! receives from it, in the same order at every start, and messages of one source and tag
//! match in order, so a rank that starts again before a slow peer has finished the last start
//! cannot be mistaken for it. Its tags come from a sequence of persistent collectives of their
//! own (`nbc.rs`), apart from the other collectives' sequence numbers: those come round again
//! after 2^20 calls, which a persistent collective may well outlive, and a rank may start it
//! before or after another collective that another rank called in the other order.
//!
//! Algorithms: those of the blocking collectives (`coll.rs`), chosen by size as they are,
//! as plans of steps (`coll_steps.rs`): a dissemination barrier; a binomial-tree broadcast,
//! or for large messages scatter and a ring allgather; a recursive
//! doubling allreduce (the ranks beyond a power of two folded in first), for small messages on
//! up to eight ranks one exchange among all ranks, or for large messages Rabenseifner's (the ranks beyond a power of two folded in first); gather and
//! scatter through the root at once; a ring allgather; every pair of an alltoall at once;
//! recursive doubling prefix reductions; a binomial-tree reduce, or for large messages on a
//! power of two of ranks a reduce-scatter and gather. A start works in the user's buffer
//! itself where the plan allows (its data is the result, or nothing lands on it), else in a
//! working copy (a reduction's other ranks, whose buffers are left as they were; the prefix
//! reductions, which keep a partial result beside the running one). As the blocking calls
//! do (`nbc::LEND_MIN_BYTES`), a large message goes from the working data itself, and one
//! that only replaces a part of the working data which no send of its step reads is
//! received straight into that part: on the same host, a single copy. A start that fails
//! ends only once such a receive has completed or been cancelled; a send cannot be
//! withdrawn, and one still unread when its start fails (its peer failed too, before it
//! posted the receive) may be read until the peer's next start, so that memory is given up
//! (`Run::give_up_lent`): the user gets a copy of the buffer back. Every other message goes
//! through a buffer of the schedule's own, kept from init on.

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use weft_sync::{Error, Status};

use crate::buffer::{Primitive, RecvBuf, SendBuf};
use crate::coll::{allreduce_into, bcast_is_long, blocks, check_op, combine, even, reduce_is_long, Op, OpKind, Reducible};
use crate::coll_steps::{
    allgather_steps, alltoall_steps, barrier_steps, bcast_long_steps, bcast_steps, fold_copies, gather_steps, land, reduce_long_steps,
    reduce_steps, scan_steps, scatter_steps, Outgoing, Steps,
};
use crate::comm::Communicator;
use crate::engine::Schedule;
use crate::matching::{Source, Tag};
use crate::nbc::{in_place_landing, notice_error, send_notices, step_error, Out, LEND_MIN_BYTES, MISMATCH, NOTICE_AFTER_POLLS};
use crate::operation::{new_operation, Operation};
use crate::persistent::{Persistent, Plan};
use crate::request::{unbound, Request};

/// The error of a start after the rank's runtime dropped the schedule (its last `Runtime`
/// handle went while the collective was in flight).
const LOST: Error = Error::InvalidArgument("persistent collective: its schedule was dropped with the runtime");
/// The error of a start whose buffer no longer has the length given at init.
const RESIZED: Error = Error::InvalidArgument("persistent collective: the buffer's length changed since init");

/// A reduction: its op and the elementwise combination for the element type.
type Reducer<T> = (Op, fn(Op, &mut [T], &[T], bool));

/// One persistent collective's schedule on one rank, with every buffer it needs: in the
/// plan's slot while inactive, in the rank's schedules while a start is in flight.
struct Run<T: Primitive> {
    // The requests of the step in flight borrow `comm` (below): they come first, so they are
    // dropped before it.
    sends: Vec<Request<'static, Shared<T>>>,
    recvs: Vec<Request<'static, Inbound<T>>>,
    /// The receive for a failure notice of another member (`nbc.rs`), posted once the start
    /// has been found waiting [`NOTICE_AFTER_POLLS`] times; its buffer between starts.
    notice: Option<Request<'static, Vec<u32>>>,
    notice_buf: Option<Vec<u32>>,
    /// Advances of the start in flight that found its step waiting (none while the
    /// notice's receive is posted).
    waits: u32,
    /// Whether the next start posts the receive for failure notices with its first step:
    /// until a start has ended well, and after every start that failed, so that the notices
    /// of failed starts' members (which may come after this rank's own failure, each start
    /// failing on every member alike) are taken start by start, not left to pile up.
    listens: bool,
    plan: Steps,
    /// The step in flight (or next), and whether its messages are posted.
    at: usize,
    posted: bool,
    /// Whether a receive of the step in flight lands in the working data itself
    /// ([`Inbound::Lent`]): then the start does not end before every receive of the step has
    /// completed, also when it fails.
    lent: bool,
    /// Whether a send of the step in flight was lent a part of the working data
    /// ([`Shared::Lent`]): a start that fails with one still in flight gives that memory up
    /// ([`give_up_lent`](Run::give_up_lent)).
    lends: bool,
    /// The working data, where the start does not work in the user's buffer itself
    /// (`in_place`); the copies for small sends not in flight (each as long as the longest),
    /// the buffers of receives not lent and not in flight (as long as the longest).
    work: Vec<T>,
    in_place: bool,
    spare: Vec<Arc<Vec<T>>>,
    scratch: Vec<Vec<T>>,
    reducer: Option<Reducer<T>>,
    tag: i32,
    /// The start in flight: where its result goes, its request's operation, its status and
    /// its outcome so far.
    out: Option<Out<T>>,
    op: Option<Arc<Operation>>,
    status: Status,
    result: Result<(), Error>,
    /// Where the schedule goes back when a start ends (gone with the persistent request).
    home: Weak<Home<T>>,
    /// Boxed: the requests above borrow it, so its address never changes.
    comm: Box<Communicator>,
}

/// What one send of a step sends: a part of the working data itself, lent to the send, if
/// large ([`LEND_MIN_BYTES`], as the blocking collectives lend theirs: no copy, and on the
/// same host the message is then a single copy); else a copy of the part, which the sends
/// of the same part one after the other share (a binomial broadcast node's children).
enum Shared<T> {
    Copy(Arc<Vec<T>>),
    Lent { at: NonNull<T>, len: usize },
}

// SAFETY: a lent part is only read through this buffer, and stays where it is, unwritten,
// while the send may read it (`SendBuf` below); the copy is an `Arc<Vec<T>>`.
unsafe impl<T: Send + Sync> Send for Shared<T> {}

// SAFETY: a copy: the `Vec`'s heap storage does not move while the `Arc` lives, and nothing
// writes it while a send holds a share: a step fills a copy only when no send holds it
// (`Arc::make_mut`, which copies otherwise). A lent part: nothing writes the working data
// while a send of the step is in flight (a step's landings wait for all its messages, and
// its lent receives lie apart from its sends, `in_place_landing`), and a start that fails
// with such a send in flight gives the memory up for good (`Run::give_up_lent`).
unsafe impl<T: Primitive> SendBuf for Shared<T> {
    fn as_bytes(&self) -> &[u8] {
        match self {
            Shared::Copy(b) => b.as_bytes(),
            // SAFETY: `len` elements of the working data at `at` (above), whose `T:
            // Primitive` bytes are initialized.
            Shared::Lent { at, len } => unsafe { std::slice::from_raw_parts(at.as_ptr().cast(), len * std::mem::size_of::<T>()) },
        }
    }
}

/// Whether send `o` of elements `T` is lent its part of the working data ([`Shared::Lent`]),
/// as the blocking collectives lend theirs.
fn lent_send<T>(o: &Outgoing) -> bool {
    o.at.len() * std::mem::size_of::<T>() >= LEND_MIN_BYTES
}

/// Where a step's receive goes: a buffer of the schedule's own, whose message then lands in
/// the working data (`land`), or, for a large message that only replaces a part of the
/// working data which no send of its step reads ([`in_place_landing`]), that part itself,
/// lent to the receive (no copy out of a buffer of its own; on the same host the message is
/// then a single copy, as the blocking call's).
enum Inbound<T> {
    Own(Vec<T>),
    Lent { at: NonNull<T>, cap: usize, len: usize },
}

// SAFETY: a lent part is written only by the transport, through this buffer, while the
// receive is in flight; the start that lent it does not end (nor the schedule drop, nor the
// next step read or write the part) before the receive has completed (`Run::settled`).
unsafe impl<T: Send> Send for Inbound<T> {}

impl<T: Primitive> Inbound<T> {
    /// The elements received.
    fn len(&self) -> usize {
        match self {
            Inbound::Own(v) => v.len(),
            Inbound::Lent { len, .. } => *len,
        }
    }
}

// SAFETY: an own buffer is a `Vec`'s (as `Vec`'s impl); a lent part is `cap` elements of the
// working data, which stay where they are, untouched by anything else, until the receive
// completed (above).
unsafe impl<T: Primitive> RecvBuf for Inbound<T> {
    fn elem_size(&self) -> usize {
        std::mem::size_of::<T>().max(1)
    }
    fn spare(&mut self) -> (*mut u8, usize) {
        match self {
            Inbound::Own(v) => v.spare(),
            Inbound::Lent { at, cap, .. } => (at.as_ptr().cast(), *cap * std::mem::size_of::<T>()),
        }
    }
    unsafe fn filled(&mut self, bytes: usize) {
        match self {
            // SAFETY: the caller's contract.
            Inbound::Own(v) => unsafe { v.filled(bytes) },
            Inbound::Lent { len, .. } => *len = bytes / std::mem::size_of::<T>().max(1),
        }
    }
}

/// The working data of a start: the user's buffer itself if `in_place`, else `work`.
fn working<'a, T: Primitive>(work: &'a mut [T], out: &'a Option<Out<T>>, in_place: bool) -> &'a mut [T] {
    match out {
        // SAFETY: `out` is the buffer of the request of the start in flight, alive until the
        // schedule completes its operation (`finish`, after the last step); each borrow
        // ends before the next is made (one step posts, or collects, at a time, on the thread
        // advancing the schedule).
        Some(out) if in_place => unsafe { out.slice() },
        _ => work,
    }
}

impl<T: Primitive> Run<T> {
    /// Posts the receives and then the sends of step `self.at` (with the first, while the
    /// starts listen from the outset, the receive for failure notices).
    fn post(&mut self) -> Result<(), Error> {
        let step = self.plan.steps[self.at].clone();
        if self.at == 0 && self.listens && self.notice.is_none() {
            self.post_notice()?;
        }
        let c: &Communicator = &self.comm;
        // The working data by address: once a receive is lent a part of it, the step only
        // reads the parts its sends copy, which no lent receive overlaps (`in_place_landing`).
        let data = NonNull::from(working(&mut self.work, &self.out, self.in_place));
        for inc in &self.plan.recvs[step.recvs.clone()] {
            let b = match in_place_landing(&self.plan, &step, inc, std::mem::size_of::<T>()) {
                Some(at) => {
                    self.lent = true;
                    assert!(at + inc.len <= data.len(), "a landing lies in the working data");
                    // SAFETY: within the working data (checked).
                    Inbound::Lent { at: unsafe { data.cast::<T>().add(at) }, cap: inc.len, len: 0 }
                }
                None => {
                    let mut b = self.scratch.pop().unwrap_or_default();
                    b.clear();
                    b.reserve(inc.len);
                    Inbound::Own(b)
                }
            };
            let r = c.irecv_or_back(c.coll_state(), b, Source::Rank(inc.from), Tag::Is(self.tag)).map_err(|(e, b)| {
                if let Inbound::Own(b) = b {
                    self.scratch.push(b);
                }
                e
            })?;
            // SAFETY: as for `notice`, for `recvs`.
            self.recvs.push(unsafe { unbound(r) });
        }
        // Sends of the same part one after the other share its copy.
        let mut last: Option<(Range<usize>, Arc<Vec<T>>)> = None;
        for o in &self.plan.sends[step.sends] {
            assert!(o.at.end <= data.len(), "a send's part lies in the working data");
            if lent_send::<T>(o) {
                self.lends = true;
                // SAFETY: within the working data (checked); see `Shared`.
                let b = Shared::Lent { at: unsafe { data.cast::<T>().add(o.at.start) }, len: o.at.len() };
                let r = c.isend_on(c.coll_state(), b, o.to, self.tag)?;
                // SAFETY: as for `notice`, for `sends`.
                self.sends.push(unsafe { unbound(r) });
                continue;
            }
            let b = match &last {
                Some((at, b)) if *at == o.at => b.clone(),
                _ => {
                    let mut b = self.spare.pop().unwrap_or_default();
                    // Held by no send (`collect` keeps only the last share): no copy.
                    let v = Arc::make_mut(&mut b);
                    v.clear();
                    // SAFETY: within the working data (checked), alive for the start, and no
                    // receive of the step writes this part (above).
                    v.extend_from_slice(unsafe { std::slice::from_raw_parts(data.cast::<T>().add(o.at.start).as_ptr(), o.at.len()) });
                    last = Some((o.at.clone(), b.clone()));
                    b
                }
            };
            let r = match c.isend_on(c.coll_state(), Shared::Copy(b), o.to, self.tag) {
                Ok(r) => r,
                Err(e) => {
                    // The refused send dropped its share; the copy comes back if nothing else
                    // holds it.
                    if let Some((_, b)) = last.filter(|(_, b)| Arc::strong_count(b) == 1) {
                        self.spare.push(b);
                    }
                    return Err(e);
                }
            };
            // SAFETY: as for `notice`, for `sends`.
            self.sends.push(unsafe { unbound(r) });
        }
        Ok(())
    }

    /// Posts the receive for a failure notice of another member (`nbc.rs`).
    #[cold]
    #[inline(never)]
    fn post_notice(&mut self) -> Result<(), Error> {
        let c: &Communicator = &self.comm;
        let b = self.notice_buf.take().unwrap_or_else(|| Vec::with_capacity(2));
        let r = c.irecv_on(c.coll_state(), b, Source::Any, Tag::Is(self.tag - 1))?;
        // SAFETY: `r` borrows `self.comm`, and `notice` is dropped before it.
        self.notice = Some(unsafe { unbound(r) });
        Ok(())
    }

    /// Takes back the buffers of the messages a failed start left posted (`finish`): a
    /// completed send's copy to the spares (the last of those that shared it), a completed
    /// receive's buffer to the scratch buffers. With `all`, a message still in flight is
    /// dropped (the runtime keeps its buffer until it finishes), else it stays, for the next
    /// start to take back.
    fn reclaim(&mut self, all: bool) {
        // After a start that ended well, nothing (the common case: two empty walks saved).
        if self.sends.is_empty() && self.recvs.is_empty() {
            return;
        }
        let spare = &mut self.spare;
        self.sends.retain_mut(|r| match r.take_parts() {
            Some((Shared::Copy(b), _)) => {
                if Arc::strong_count(&b) == 1 {
                    spare.push(b);
                }
                false
            }
            Some(_) => false,
            None => !all,
        });
        let scratch = &mut self.scratch;
        self.recvs.retain_mut(|r| match r.take_parts() {
            Some((b, _)) => {
                if let Inbound::Own(b) = b {
                    scratch.push(b);
                }
                false
            }
            None => !all,
        });
    }

    /// Whether no receive of the step in flight may still write the working data: none was
    /// lent a part of it, or every one has completed (those not yet matched are cancelled
    /// here; a matched one completes once its message is in, or its sender is lost). A start
    /// that fails ends only then, so that nothing lands in the user's buffer after it has
    /// it back.
    fn settled(&mut self) -> bool {
        if !self.lent {
            return true;
        }
        for r in &mut self.recvs {
            r.cancel();
        }
        self.lent = self.recvs.iter().any(|r| !r.is_complete());
        !self.lent
    }

    /// After a start that failed, or a schedule dropped in flight, with a send lent a part of
    /// the working data still in flight: the send may read that part until its peer takes
    /// the message, drops it or is lost — a member whose own start failed before it posted
    /// the receive takes it only at its next start — so the memory is given up for good,
    /// and stays where it is, unchanged, for as long as the process lives. The schedule's
    /// own working data is leaked (the next start makes new); the user's buffer is swapped
    /// for a copy as the request gives it back ([`CollPlan`]'s `failed`), or, with the
    /// persistent request gone (`home` is `None`), leaked with the operation that holds it:
    /// then `true`. The cost of a failure that leaves such a send behind, not of a start.
    fn give_up_lent(&mut self, home: Option<&Home<T>>) -> bool {
        if !std::mem::take(&mut self.lends) || self.sends.iter().all(Request::is_complete) {
            return false;
        }
        if !self.in_place {
            std::mem::forget(std::mem::take(&mut self.work));
            return false;
        }
        match home {
            Some(home) => {
                home.swap.store(true, Ordering::Release);
                false
            }
            None => true,
        }
    }

    /// Collects step `self.at`, complete: the send buffers back, the received data landed.
    fn collect(&mut self) -> Result<(), Error> {
        let mut res = Ok(());
        for mut r in self.sends.drain(..) {
            if let Some((b, outcome)) = r.take_parts() {
                // The last of the sends that shared a copy gives it back.
                if let Shared::Copy(b) = b {
                    if Arc::strong_count(&b) == 1 {
                        self.spare.push(b);
                    }
                }
                if let Err(e) = outcome {
                    res = res.and(Err(step_error(&self.comm, e)));
                }
            }
        }
        (self.lent, self.lends) = (false, false);
        let recvs = self.plan.steps[self.at].recvs.clone();
        for (mut r, inc) in self.recvs.drain(..).zip(&self.plan.recvs[recvs]) {
            let Some((got, outcome)) = r.take_parts() else { continue };
            drop(r);
            let used = match outcome {
                Err(e) => Err(step_error(&self.comm, e)),
                Ok(_) if got.len() != inc.len => Err(MISMATCH),
                Ok(_) => {
                    // A lent receive landed in place already.
                    if let Inbound::Own(got) = &got {
                        let reducer = self.reducer;
                        let combine = |ours: &mut [T], theirs: &[T], theirs_first| {
                            if let Some((op, f)) = reducer {
                                f(op, ours, theirs, theirs_first);
                            }
                        };
                        land(working(&mut self.work, &self.out, self.in_place), &self.plan.landings[inc.lands.clone()], got, &combine);
                    }
                    Ok(())
                }
            };
            if let Inbound::Own(got) = got {
                self.scratch.push(got);
            }
            res = res.and(used);
        }
        res
    }
}

impl<T: Primitive> Schedule for Run<T> {
    fn advance(&mut self) -> bool {
        while self.result.is_ok() && self.at < self.plan.steps.len() {
            if !self.posted {
                self.posted = true;
                if let Err(e) = self.post() {
                    self.result = Err(self.comm.local_error(e));
                    break;
                }
            }
            if self.notice.as_ref().is_some_and(Request::is_complete) {
                // Another member failed: read by `finish`.
                self.result = Err(Error::Cancelled);
                break;
            }
            if self.recvs.iter().any(|r| !r.is_complete()) || self.sends.iter().any(|r| !r.is_complete()) {
                // A start whose members are all there ends within a few advances and never
                // posts the receive for failure notices, nor cancels it; a notice sent
                // before it is posted waits in matching.
                if self.notice.is_none() {
                    self.waits += 1;
                    if self.waits >= NOTICE_AFTER_POLLS {
                        if let Err(e) = self.post_notice() {
                            self.result = Err(self.comm.local_error(e));
                            break;
                        }
                    }
                }
                return false;
            }
            self.result = self.collect();
            self.at += 1;
            self.posted = false;
        }
        // A failed step's lent receives settle first.
        self.settled()
    }

    fn finish(mut self: Box<Self>) {
        let mut result = std::mem::replace(&mut self.result, Ok(()));
        self.listens = result.is_err();
        if result.is_err() && self.notice.is_none() && self.comm.size() > 1 {
            // A failure: whether another member's notice came already (it is then the
            // start's error, as if the receive had been posted all along).
            let _ = self.post_notice();
        }
        if let Some(mut notice) = self.notice.take() {
            match result {
                // Unposted, its buffer kept for the next start (or taken with the notice
                // that came anyway: another member failed after this one's last step).
                Ok(()) => {
                    notice.cancel();
                    self.notice_buf = notice.take_parts().map(|(b, _)| b);
                }
                Err(e) if notice.is_complete() => result = Err(notice_error(&self.comm, notice.take(), e)),
                Err(e) => {
                    notice.cancel();
                    self.notice_buf = notice.take_parts().map(|(b, _)| b);
                    send_notices(&self.comm, self.tag, e);
                }
            }
        } else if let Err(e) = result {
            send_notices(&self.comm, self.tag, e);
        }
        if let (Ok(()), true, Some((op, f))) = (&result, self.plan.fold, self.reducer) {
            fold_copies(&mut self.work, self.plan.copies, &|ours: &mut [T], theirs: &[T], tf| f(op, ours, theirs, tf));
        }
        let out = self.out.take().filter(|_| self.plan.result && !self.in_place);
        if let (Ok(()), Some(out)) = (&result, out) {
            out.write(&self.work[..self.work.len() / self.plan.copies]);
        }
        // A failed step's other messages: a receive is cancelled, a send finishes on its own;
        // their buffers come back now, or at the next start (`launch`) if still in flight.
        for r in &mut self.recvs {
            r.cancel();
        }
        self.reclaim(false);
        let home = self.home.upgrade();
        let leak = self.give_up_lent(home.as_deref());
        let (op, status) = (self.op.take(), self.status);
        if let Some(home) = home {
            *home.run.lock() = Some(self);
        }
        // Last: whoever waits for the request may start it again at once, and finds the
        // schedule home.
        if let Some(op) = op {
            op.cell.complete(result.map(|()| status));
            if leak {
                // It holds the user's buffer, which a send may still read.
                std::mem::forget(op);
            }
        }
    }
}

impl<T: Primitive> Drop for Run<T> {
    fn drop(&mut self) {
        // Dropped in flight (the rank's last handle went): the start fails, once no receive
        // may still write the user's buffer or the working data.
        if !self.settled() {
            let _ = crate::wait::wait_all(&mut self.recvs);
        }
        let leak = self.op.is_some() && self.give_up_lent(self.home.upgrade().as_deref());
        if let Some(op) = self.op.take() {
            op.cell.complete(Err(Error::Cancelled));
            if leak {
                std::mem::forget(op);
            }
        }
    }
}

/// The most sends, and the most receives, of one step of `plan` that go through a buffer of
/// their own (not lent a part of the working data, [`Shared`], [`Inbound`]), and the longest
/// of each: the buffers a plan keeps from init on.
fn own_buffers<T>(plan: &Steps) -> ((usize, usize), (usize, usize)) {
    let size = std::mem::size_of::<T>();
    let (mut sends, mut recvs) = ((0, 0), (0, 0));
    let most = |(most, longest): (usize, usize), lens: &mut dyn Iterator<Item = usize>| {
        let (n, l) = lens.fold((0, 0), |(n, l), len| (n + 1, l.max(len)));
        (most.max(n), longest.max(l))
    };
    for step in &plan.steps {
        sends = most(sends, &mut plan.sends[step.sends.clone()].iter().filter(|o| !lent_send::<T>(o)).map(|o| o.at.len()));
        let own = plan.recvs[step.recvs.clone()].iter().filter(|inc| in_place_landing(plan, step, inc, size).is_none());
        recvs = most(recvs, &mut own.map(|inc| inc.len));
    }
    (sends, recvs)
}

/// Where a persistent collective's schedule is between starts.
struct Home<T: Primitive> {
    run: Mutex<Option<Box<Run<T>>>>,
    /// A start failed with a send of the user's buffer still in flight: the buffer its
    /// request gives back is swapped for a copy ([`Run::give_up_lent`]).
    swap: AtomicBool,
}

/// A persistent collective of elements `T`: its schedule, home between starts.
struct CollPlan<T: Primitive> {
    home: Arc<Home<T>>,
    len: usize,
}

impl<T: Primitive> CollPlan<T> {
    /// A plan of `plan` over `len` elements under the next sequence number of `comm`.
    fn new(comm: &Communicator, plan: Steps, len: usize, reducer: Option<Reducer<T>>) -> Self {
        let (sends, recvs) = plan.widest();
        let ((own_sends, longest_send), (own_recvs, longest_recv)) = own_buffers::<T>(&plan);
        let home = Arc::new(Home { run: Mutex::new(None), swap: AtomicBool::new(false) });
        let run = Run {
            sends: Vec::with_capacity(sends),
            recvs: Vec::with_capacity(recvs),
            notice: None,
            notice_buf: Some(Vec::with_capacity(2)),
            waits: 0,
            listens: true,
            at: 0,
            posted: false,
            lent: false,
            lends: false,
            work: Vec::with_capacity(if plan.in_place() { 0 } else { len * plan.copies }),
            in_place: false,
            spare: (0..own_sends).map(|_| Arc::new(Vec::with_capacity(longest_send))).collect(),
            scratch: (0..own_recvs).map(|_| Vec::with_capacity(longest_recv)).collect(),
            plan,
            reducer,
            tag: comm.next_persistent_tag(),
            out: None,
            op: None,
            status: Status { source: comm.world_of(comm.rank()), tag: 0, bytes: len * std::mem::size_of::<T>() },
            result: Ok(()),
            home: Arc::downgrade(&home),
            comm: Box::new(comm.clone()),
        };
        *home.run.lock() = Some(Box::new(run));
        CollPlan { home, len }
    }

    /// Whether a start over `len` elements may go ahead.
    fn check_len(&self, comm: &Communicator, len: usize) -> Result<(), Error> {
        if comm.is_freed() {
            Err(Error::CommFreed)
        } else if len != self.len {
            Err(RESIZED)
        } else {
            Ok(())
        }
    }

    /// Starts the schedule over `data`, its result into `out`; the operation its request
    /// completes.
    fn launch(&self, comm: &Communicator, data: &[T], out: Option<Out<T>>) -> Result<Arc<Operation>, Error> {
        self.check_len(comm, data.len())?;
        let mut run = self.home.run.lock().take().ok_or(LOST)?;
        run.reclaim(true);
        let op = new_operation(|i| i.context = comm.coll_state().context);
        run.in_place = out.is_some() && run.plan.in_place();
        run.work.clear();
        if !run.in_place {
            for _ in 0..run.plan.copies {
                run.work.extend_from_slice(data);
            }
        }
        run.at = 0;
        run.waits = 0;
        run.posted = false;
        run.out = out;
        run.op = Some(op.clone());
        comm.engine().start_schedule(run);
        Ok(op)
    }
}

impl<T: Primitive> Plan<Vec<T>> for CollPlan<T> {
    fn check(&self, comm: &Communicator, buf: &Vec<T>) -> Result<(), Error> {
        self.check_len(comm, buf.len())
    }
    fn start<'c>(&self, comm: &'c Communicator, mut buf: Vec<T>) -> Result<Request<'c, Vec<T>>, (Error, Vec<T>)> {
        let out = Out::of(&mut buf);
        match self.launch(comm, &buf, Some(out)) {
            Ok(op) => Ok(Request::collective(comm, op, buf)),
            Err(e) => Err((e, buf)),
        }
    }
    fn failed(&self, buf: &mut Vec<T>) {
        if self.home.swap.swap(false, Ordering::Acquire) {
            // A send of the failed start may still read the buffer: it is given up, and
            // its data goes on in a copy.
            let copy = buf.clone();
            std::mem::forget(std::mem::replace(buf, copy));
        }
    }
}

impl Plan<()> for CollPlan<u8> {
    fn check(&self, comm: &Communicator, (): &()) -> Result<(), Error> {
        self.check_len(comm, 0)
    }
    fn start<'c>(&self, comm: &'c Communicator, (): ()) -> Result<Request<'c, ()>, (Error, ())> {
        self.launch(comm, &[], None).map(|op| Request::collective(comm, op, ())).map_err(|e| (e, ()))
    }
}

/// An op's number in the init's agreement.
fn op_code(op: Op) -> u64 {
    [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::BAnd, Op::BOr, Op::BXor].iter().position(|&o| o == op).map_or(u64::MAX, |i| i as u64)
}

/// The length of each of `n` blocks of one length in `len` elements, if they divide evenly.
fn per_block(len: usize, n: u32) -> Option<usize> {
    (len % n as usize == 0).then(|| len / n as usize)
}

impl Communicator {
    /// A persistent collective over `data`, inactive, each start running `steps`.
    fn coll_init<T: Primitive>(&self, steps: Steps, data: Vec<T>, reducer: Option<Reducer<T>>) -> Persistent<'_, Vec<T>> {
        let plan = CollPlan::new(self, steps, data.len(), reducer);
        Persistent::collective(self, Arc::new(plan), data)
    }

    /// The block length of a rooted init over a buffer of `len` elements (`size` blocks at
    /// `root`, else the error `what`; one elsewhere), agreed with every rank with `root`
    /// ([`agree_blocks`](Self::agree_blocks)).
    fn root_block(&self, len: usize, root: u32, what: &'static str) -> Result<usize, Error> {
        self.check_root(root)?;
        let k = if self.rank() == root { per_block(len, self.size()) } else { Some(len) };
        self.agree_blocks(k, root, 0, what)
    }

    /// Checks that every rank passed the same block length `k` (`None`: this rank's buffer
    /// holds no whole number of blocks, the error `what`), `root` and `op`: the agreement
    /// of [`agree`](Self::agree), which this rank makes even when its own buffer is wrong,
    /// so that every rank fails instead of waiting for it.
    fn agree_blocks(&self, k: Option<usize>, root: u32, op: u64, what: &'static str) -> Result<usize, Error> {
        let agreed = self.agree([k.map_or(u64::MAX, |k| k as u64), u64::from(root), op]);
        let k = k.ok_or(Error::InvalidArgument(what))?;
        agreed.map(|()| k)
    }

    /// Checks that every rank passed the same `values` (a collective: one allreduce).
    fn agree(&self, values: [u64; 3]) -> Result<(), Error> {
        let mine = [values[0], !values[0], values[1], !values[1], values[2], !values[2]];
        let mut most = [0u64; 6];
        self.allreduce(&mine, &mut most, Op::Max)?;
        if most.chunks(2).zip(values).all(|(m, v)| m[0] == v && !m[1] == v) {
            Ok(())
        } else {
            Err(MISMATCH)
        }
    }

    /// A persistent barrier (`MPI_Barrier_init`), inactive: each start completes once every
    /// rank of the communicator has made the same start. A collective call.
    ///
    /// ```
    /// use weft::Runtime;
    /// let ranks = Runtime::builder().env(false).build_local(3).unwrap();
    /// std::thread::scope(|s| {
    ///     for rt in &ranks {
    ///         s.spawn(move || {
    ///             let mut b = rt.world().barrier_init().unwrap();
    ///             for _ in 0..3 {
    ///                 b.start().unwrap();
    ///                 b.wait().unwrap();
    ///             }
    ///         });
    ///     }
    /// });
    /// ```
    pub fn barrier_init(&self) -> Result<Persistent<'_, ()>, Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        let plan = CollPlan::<u8>::new(self, barrier_steps(self), 0, None);
        Ok(Persistent::collective(self, Arc::new(plan), ()))
    }

    /// A persistent broadcast of `data` of rank `root` (`MPI_Bcast_init`), inactive: each
    /// start sends the root's buffer as it is then, and a wait leaves the root's elements
    /// in every rank's buffer. Every rank passes the same length and root (checked here: a
    /// collective call).
    pub fn bcast_init<T: Primitive>(&self, data: Vec<T>, root: u32) -> Result<Persistent<'_, Vec<T>>, Error> {
        self.check_root(root)?;
        self.agree([data.len() as u64, u64::from(root), 0])?;
        let steps = if bcast_is_long(std::mem::size_of_val(data.as_slice()), self.size()) {
            bcast_long_steps(self, root, data.len(), crate::coll::bcast_segment::<T>())
        } else {
            bcast_steps(self, root, data.len())
        };
        Ok(self.coll_init(steps, data, None))
    }

    /// A persistent reduction of `data` with `op` into `data` of rank `root`
    /// (`MPI_Reduce_init`), inactive: each start reduces the buffers as they are then; the
    /// other ranks' buffers are left as they were. Every rank passes the same length, op and
    /// root (checked here: a collective call); a bitwise op on floats is an error.
    pub fn reduce_init<T: Reducible>(&self, data: Vec<T>, op: Op, root: u32) -> Result<Persistent<'_, Vec<T>>, Error> {
        self.check_root(root)?;
        check_op(op, data.first(), "reduce_init: a bitwise op on floating-point elements")?;
        self.agree([data.len() as u64, u64::from(root), op_code(op)])?;
        let steps = if reduce_is_long(std::mem::size_of_val(data.as_slice()), data.len(), self.size()) {
            reduce_long_steps(self, root, data.len())
        } else {
            reduce_steps(self, root, data.len())
        };
        Ok(self.coll_init(steps, data, Some((op, combine::<T>))))
    }

    /// A persistent reduction of `data` with `op` into `data` of every rank
    /// (`MPI_Allreduce_init`), inactive: each start reduces the buffers as they are then.
    /// Every rank passes the same length and op (checked here: a collective call); a bitwise
    /// op on floats is an error.
    ///
    /// ```
    /// use weft::{Op, Persistent, Runtime};
    /// let ranks = Runtime::builder().env(false).build_local(3).unwrap();
    /// std::thread::scope(|s| {
    ///     for rt in &ranks {
    ///         s.spawn(move || {
    ///             let w = rt.world();
    ///             let mut sum = w.allreduce_init(vec![0u64; 2], Op::Sum).unwrap();
    ///             for i in 0..3 {
    ///                 sum.buffer_mut().unwrap().fill(i + u64::from(w.rank()));
    ///                 sum.start().unwrap();
    ///                 sum.wait().unwrap();
    ///                 assert_eq!(sum.buffer().unwrap(), &vec![3 * i + 3; 2]);
    ///             }
    ///         });
    ///     }
    /// });
    /// ```
    pub fn allreduce_init<T: Reducible>(&self, data: Vec<T>, op: Op) -> Result<Persistent<'_, Vec<T>>, Error> {
        check_op(op, data.first(), "allreduce_init: a bitwise op on floating-point elements")?;
        self.agree([data.len() as u64, 0, op_code(op)])?;
        let mut steps = Steps::default();
        allreduce_into(&mut steps, self, data.len(), std::mem::size_of_val(data.as_slice()), OpKind::of::<T>())?;
        Ok(self.coll_init(steps, data, Some((op, combine::<T>))))
    }

    /// A persistent gather into `data` of rank `root` (`MPI_Gather_init`, in place),
    /// inactive: every other rank's `data` holds one block, the root's `size` blocks of that
    /// length, its own at `root * len` in place; each start sends the blocks as they are
    /// then, and a wait leaves rank `r`'s at `r * len` of the root's buffer (the others'
    /// buffers are left as they were). Every rank passes the same block length and root
    /// (checked here: a collective call).
    pub fn gather_init<T: Primitive>(&self, data: Vec<T>, root: u32) -> Result<Persistent<'_, Vec<T>>, Error> {
        let k = self.root_block(data.len(), root, "gather_init: the root's buffer is not size blocks of one length")?;
        Ok(self.coll_init(gather_steps(self, root, &even(k, self.size()), k), data, None))
    }

    /// A persistent scatter of `data` of rank `root` (`MPI_Scatter_init`, in place),
    /// inactive: the root's `data` holds `size` blocks, every other rank's one block of that
    /// length; each start sends the root's blocks as they are then, and a wait leaves block
    /// `r` in rank `r`'s buffer (the root's is left as it was). Every rank passes the same
    /// block length and root (checked here: a collective call).
    pub fn scatter_init<T: Primitive>(&self, data: Vec<T>, root: u32) -> Result<Persistent<'_, Vec<T>>, Error> {
        let k = self.root_block(data.len(), root, "scatter_init: the root's buffer is not size blocks of one length")?;
        Ok(self.coll_init(scatter_steps(self, root, &even(k, self.size()), k), data, None))
    }

    /// A persistent allgather (`MPI_Allgather_init`, in place), inactive: `data` holds
    /// `size` blocks of one length, this rank's own at `rank * len`; each start sends it as
    /// it is then, and a wait leaves every rank's block in place. A ring of `size - 1` steps.
    /// Every rank passes the same length (checked here: a collective call).
    ///
    /// ```
    /// use weft::Runtime;
    /// let ranks = Runtime::builder().env(false).build_local(3).unwrap();
    /// std::thread::scope(|s| {
    ///     for rt in &ranks {
    ///         s.spawn(move || {
    ///             let w = rt.world();
    ///             let mut all = w.allgather_init(vec![0u32; 3]).unwrap();
    ///             for i in 0..3 {
    ///                 all.buffer_mut().unwrap()[w.rank() as usize] = 10 * i + w.rank();
    ///                 all.start().unwrap();
    ///                 all.wait().unwrap();
    ///                 assert_eq!(all.buffer().unwrap(), &vec![10 * i, 10 * i + 1, 10 * i + 2]);
    ///             }
    ///         });
    ///     }
    /// });
    /// ```
    pub fn allgather_init<T: Primitive>(&self, data: Vec<T>) -> Result<Persistent<'_, Vec<T>>, Error> {
        let k = per_block(data.len(), self.size());
        let k = self.agree_blocks(k, 0, 0, "allgather_init: the buffer is not size blocks of one length")?;
        Ok(self.coll_init(allgather_steps(self, &even(k, self.size())), data, None))
    }

    /// A persistent alltoall (`MPI_Alltoall_init`, in place), inactive: `data` holds
    /// `size` blocks of one length; each start sends block `r` as it is then to rank `r`,
    /// and a wait leaves in block `r` the block rank `r` sent this rank (its own block stays
    /// in place). Every rank passes the same length (checked here: a collective call).
    pub fn alltoall_init<T: Primitive>(&self, data: Vec<T>) -> Result<Persistent<'_, Vec<T>>, Error> {
        let k = per_block(data.len(), self.size());
        let k = self.agree_blocks(k, 0, 0, "alltoall_init: the buffer is not size blocks of one length")?;
        Ok(self.coll_init(alltoall_steps(self, &even(k, self.size()), &even(k, self.size())), data, None))
    }

    /// A persistent inclusive prefix reduction (`MPI_Scan_init`, in place), inactive: each
    /// start reduces the buffers as they are then, and a wait leaves in rank `r`'s `data`
    /// that of ranks `0..=r` reduced elementwise with `op`, in rank order. Every rank passes
    /// the same length and op (checked here: a collective call); a bitwise op on floats is an
    /// error.
    pub fn scan_init<T: Reducible>(&self, data: Vec<T>, op: Op) -> Result<Persistent<'_, Vec<T>>, Error> {
        self.prefix_init(data, op, true)
    }

    /// A persistent exclusive prefix reduction (`MPI_Exscan_init`, in place), inactive:
    /// each start reduces the buffers as they are then, and a wait leaves in rank `r > 0`'s
    /// `data` that of ranks `0..r` reduced elementwise with `op`, in rank order; rank 0's is
    /// left as it was (MPI leaves it undefined). Every rank passes the same length and op
    /// (checked here: a collective call); a bitwise op on floats is an error.
    pub fn exscan_init<T: Reducible>(&self, data: Vec<T>, op: Op) -> Result<Persistent<'_, Vec<T>>, Error> {
        self.prefix_init(data, op, false)
    }

    /// [`scan_init`](Self::scan_init) (`inclusive`) or [`exscan_init`](Self::exscan_init).
    fn prefix_init<T: Reducible>(&self, data: Vec<T>, op: Op, inclusive: bool) -> Result<Persistent<'_, Vec<T>>, Error> {
        check_op(op, data.first(), "scan_init: a bitwise op on floating-point elements")?;
        self.agree([data.len() as u64, 0, op_code(op)])?;
        Ok(self.coll_init(scan_steps(self, data.len(), inclusive), data, Some((op, combine::<T>))))
    }

    /// A persistent gather into `data` of rank `root` (`MPI_Gatherv_init`, in place),
    /// inactive: the root's `data` holds rank `r`'s block at `displs[r]`, `counts[r]` long
    /// (its own in place); every other rank's `data` is its block. Each start sends the
    /// blocks as they are then, and a wait leaves them in place in the root's buffer (the
    /// others' are left as they were). `counts` and `displs` are read at the root only; every
    /// rank's length is checked against the root's count for it here (a collective call).
    pub fn gatherv_init<T: Primitive>(
        &self,
        data: Vec<T>,
        counts: &[usize],
        displs: &[usize],
        root: u32,
    ) -> Result<Persistent<'_, Vec<T>>, Error> {
        let what = "gatherv_init: counts and displacements do not fit the root's buffer";
        self.rooted_v_init(data, (counts, displs), root, what, gather_steps)
    }

    /// A persistent scatter of `data` of rank `root` (`MPI_Scatterv_init`, in place),
    /// inactive: the root's `data` holds rank `r`'s block at `displs[r]`, `counts[r]` long;
    /// every other rank's `data` is as long as its block. Each start sends the root's blocks
    /// as they are then, and a wait leaves each rank's in its buffer (the root's is left as
    /// it was). `counts` and `displs` are read at the root only; every rank's length is
    /// checked against the root's count for it here (a collective call).
    pub fn scatterv_init<T: Primitive>(
        &self,
        data: Vec<T>,
        counts: &[usize],
        displs: &[usize],
        root: u32,
    ) -> Result<Persistent<'_, Vec<T>>, Error> {
        let what = "scatterv_init: counts and displacements do not fit the root's buffer";
        self.rooted_v_init(data, (counts, displs), root, what, scatter_steps)
    }

    /// A persistent allgather (`MPI_Allgatherv_init`, in place), inactive: `data` holds
    /// rank `r`'s block at `displs[r]`, `counts[r]` long, this rank's own in place; each start
    /// sends it as it is then, and a wait leaves every rank's block in place. Every rank
    /// passes the same counts (checked here: a collective call); displacements may differ.
    pub fn allgatherv_init<T: Primitive>(&self, data: Vec<T>, counts: &[usize], displs: &[usize]) -> Result<Persistent<'_, Vec<T>>, Error> {
        let b = blocks(counts, displs, self.size(), data.len(), "allgatherv_init: counts and displacements do not fit the buffer");
        // FNV-1a over the counts: every rank's must be the same.
        let hash = counts.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| (h ^ c as u64).wrapping_mul(0x100_0000_01b3));
        let agreed = self.agree([hash, u64::from(b.is_ok()), 0]);
        let b = b?;
        agreed?;
        Ok(self.coll_init(allgather_steps(self, &b), data, None))
    }

    /// A persistent alltoall (`MPI_Alltoallv_init`, in place), inactive: `data` holds the
    /// block for rank `r` at `displs[r]`, `counts[r]` long; each start sends it as it is then
    /// to rank `r`, and a wait leaves in its place the block rank `r` sent this rank (this
    /// rank's own stays in place). Rank `r`'s count for this rank equals this rank's count for
    /// it (checked here: a collective call).
    pub fn alltoallv_init<T: Primitive>(&self, data: Vec<T>, counts: &[usize], displs: &[usize]) -> Result<Persistent<'_, Vec<T>>, Error> {
        let n = self.size() as usize;
        let b = blocks(counts, displs, self.size(), data.len(), "alltoallv_init: counts and displacements do not fit the buffer");
        // Each rank's counts for the others, traded: each must equal the other's for it.
        let mine: Vec<u64> = match &b {
            Ok(_) => counts.iter().map(|&c| c as u64).collect(),
            Err(_) => vec![u64::MAX; n],
        };
        let mut theirs = vec![0u64; n];
        self.alltoall(&mine, &mut theirs)?;
        let agreed = self.agree([u64::from(mine == theirs), 0, 0]);
        let b = b?;
        agreed?;
        if mine != theirs {
            return Err(MISMATCH);
        }
        Ok(self.coll_init(alltoall_steps(self, &b, &b), data, None))
    }

    /// A rooted `v` init over `data`: the plan `steps` makes of the blocks of `layout`
    /// (counts and displacements, read at the root) once checked
    /// ([`rooted_blocks`](Self::rooted_blocks)).
    fn rooted_v_init<T: Primitive>(
        &self,
        data: Vec<T>,
        layout: (&[usize], &[usize]),
        root: u32,
        what: &'static str,
        steps: fn(&Communicator, u32, &[Range<usize>], usize) -> Steps,
    ) -> Result<Persistent<'_, Vec<T>>, Error> {
        let b = self.rooted_blocks(data.len(), layout.0, layout.1, root, what)?;
        Ok(self.coll_init(steps(self, root, &b, data.len()), data, None))
    }

    /// The blocks of a rooted `v` init (`counts` and `displs` of the root's buffer of `len`
    /// elements, else the error `what`; none elsewhere), once every rank's `len` is found to
    /// be the root's count for it: the root scatters its counts (a collective call).
    fn rooted_blocks(
        &self,
        len: usize,
        counts: &[usize],
        displs: &[usize],
        root: u32,
        what: &'static str,
    ) -> Result<Vec<Range<usize>>, Error> {
        self.check_root(root)?;
        let n = self.size() as usize;
        let b = if self.rank() == root { blocks(counts, displs, self.size(), len, what) } else { Ok(Vec::new()) };
        let sent: Vec<u64> = match &b {
            Ok(_) if self.rank() == root => counts.iter().map(|&c| c as u64).collect(),
            _ => vec![u64::MAX; n],
        };
        let mut want = [0u64];
        self.scatter(&sent, &mut want, root)?;
        // At the root, its own block is in place: any count fits.
        let fits = self.rank() == root || want[0] == len as u64;
        let agreed = self.agree([u64::from(root), u64::from(fits && b.is_ok()), 0]);
        let b = b?;
        agreed?;
        if fits {
            Ok(b)
        } else {
            Err(MISMATCH)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use crate::nbc::SEQ_SPAN;
    use crate::{Op, Runtime};

    /// A persistent allreduce that lives while the communicator's other collectives go once
    /// round their span of sequence numbers: its starts (in a different order than a
    /// nonblocking allreduce's on the two ranks, as MPI 4.0 allows) are not mistaken for
    /// that allreduce's messages.
    #[test]
    fn a_persistent_collective_outliving_the_span_keeps_its_messages_apart() {
        let rts = Runtime::builder().env(false).cris(1).build_local(2).unwrap();
        std::thread::scope(|s| {
            for rt in &rts {
                s.spawn(move || {
                    let c = rt.world();
                    let r = u64::from(c.rank());
                    let mut p = c.allreduce_init(vec![r + 1], Op::Sum).unwrap();
                    // As many collectives as the span, less the init's own.
                    c.coll_seq().fetch_add(SEQ_SPAN - 1, Ordering::Relaxed);
                    let n = if r == 0 {
                        p.start().unwrap();
                        c.iallreduce(vec![100 * (r + 1)], Op::Sum).unwrap()
                    } else {
                        let n = c.iallreduce(vec![100 * (r + 1)], Op::Sum).unwrap();
                        p.start().unwrap();
                        n
                    };
                    p.wait().unwrap();
                    let (sum, _) = n.wait().unwrap();
                    assert_eq!(p.buffer().unwrap(), &vec![3]);
                    assert_eq!(sum, vec![300]);
                });
            }
        });
    }
}
