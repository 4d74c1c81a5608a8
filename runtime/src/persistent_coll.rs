//! Persistent collectives (MPI 4.0 §6.13): [`Communicator::barrier_init`],
//! [`Communicator::bcast_init`], [`Communicator::reduce_init`] and
//! [`Communicator::allreduce_init`] give a [`Persistent`] request like
//! [`send_init`](Communicator::send_init)'s, started and waited for as often as needed, and
//! started together with point-to-point ones by [`Persistent::start_all`].
//!
//! The init call is a collective: every rank of the communicator makes it, in the same order
//! as its other collectives, with the same length, op and root — which it checks with one
//! allreduce, so a rank that passed another length or root gets an error at init on every
//! rank, not a hang at a start. It then fixes the whole schedule (MPICH computes its
//! persistent schedules once too): the steps of the algorithm in world ranks, the buffers of
//! every step's sends and of its receive, and the tag of the collective's sequence number,
//! which every start reuses. A start copies the user's buffer in, hands the schedule to the
//! rank's progress (`engine/schedules.rs`), which takes its steps as their messages complete,
//! and gets the schedule back when it ends (`Schedule::finish`): in steady state a start
//! allocates nothing (`runtime/tests/zero_alloc_persistent_coll.rs`).
//!
//! A start that fails (a peer lost, the communicator freed) tells every other member, as a
//! nonblocking collective does (`nbc.rs`): each start listens for such a notice, so a member
//! that waits for a rank that failed, not for the lost peer itself, fails too instead of
//! waiting forever.
//!
//! Starts of one persistent collective reuse its tag: each rank sends to each peer, and
//! receives from it, in the same order at every start, and messages of one source and tag
//! match in order, so a rank that starts again before a slow peer has finished the last start
//! cannot be mistaken for it.
//!
//! Algorithms: a dissemination barrier, a binomial-tree broadcast and reduce, a recursive
//! doubling allreduce (the ranks beyond a power of two folded in first) — the plans of the
//! nonblocking collectives' small-message algorithms (`coll_steps.rs`), at every size.

use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use weft_sync::{Error, Status};

use crate::buffer::Primitive;
use crate::coll::{check_op, Op, Reducible};
use crate::coll_steps::{barrier_steps, bcast_steps, reduce_over_steps, reduce_steps, Step, Steps, Then};
use crate::comm::Communicator;
use crate::engine::Schedule;
use crate::matching::{Source, Tag};
use crate::nbc::{notice_error, send_notices, seq_tag, step_error, Out, MISMATCH};
use crate::operation::{new_operation, Operation};
use crate::persistent::{Persistent, Plan};
use crate::request::{unbound, Request};

/// The error of a start after the rank's runtime dropped the schedule (its last `Runtime`
/// handle went while the collective was in flight).
const LOST: Error = Error::InvalidArgument("persistent collective: its schedule was dropped with the runtime");
/// The error of a start whose buffer no longer has the length given at init.
const RESIZED: Error = Error::InvalidArgument("persistent collective: the buffer's length changed since init");

/// `op` applied elementwise into `ours`.
fn combine<T: Reducible>(op: Op, ours: &mut [T], theirs: &[T], theirs_first: bool) {
    for (a, &t) in ours.iter_mut().zip(theirs) {
        let v = if theirs_first { T::apply(op, t, *a) } else { T::apply(op, *a, t) };
        *a = v.expect("the op was checked for the element type at init");
    }
}

/// A reduction: its op and the elementwise combination for the element type.
type Reducer<T> = (Op, fn(Op, &mut [T], &[T], bool));

/// One persistent collective's schedule on one rank, with every buffer it needs: in the
/// plan's slot while inactive, in the rank's schedules while a start is in flight.
struct Run<T: Primitive> {
    // The requests of the step in flight borrow `comm` (below): they come first, so they are
    // dropped before it.
    sends: Vec<Request<'static, Vec<T>>>,
    recv: Option<Request<'static, Vec<T>>>,
    /// The receive for a failure notice of another member (`nbc.rs`), posted with the first
    /// step; its buffer between starts.
    notice: Option<Request<'static, Vec<u32>>>,
    notice_buf: Option<Vec<u32>>,
    steps: Box<[Step]>,
    to: Box<[u32]>,
    /// The step in flight (or next), and whether its messages are posted.
    at: usize,
    posted: bool,
    /// The working data, the buffers of sends not in flight, the receive buffer when not in
    /// flight (each as long as the data).
    work: Vec<T>,
    spare: Vec<Vec<T>>,
    scratch: Option<Vec<T>>,
    reducer: Option<Reducer<T>>,
    tag: i32,
    /// Whether the start's result goes into the user's buffer (not at a reduce's non-root).
    write_back: bool,
    /// The start in flight: where its result goes, its request's operation, its status and
    /// its outcome so far.
    out: Option<Out<T>>,
    op: Option<Arc<Operation>>,
    status: Status,
    result: Result<(), Error>,
    /// Where the schedule goes back when a start ends (gone with the persistent request).
    home: Weak<Mutex<Option<Box<Run<T>>>>>,
    /// Boxed: the requests above borrow it, so its address never changes.
    comm: Box<Communicator>,
}

impl<T: Primitive> Run<T> {
    /// Posts the sends and the receive of step `self.at` (with the first, the receive for
    /// failure notices).
    fn post(&mut self) -> Result<(), Error> {
        let step = self.steps[self.at].clone();
        let c: &Communicator = &self.comm;
        if self.at == 0 {
            let b = self.notice_buf.take().unwrap_or_else(|| Vec::with_capacity(2));
            let r = c.irecv_on(c.coll_state(), b, Source::Any, Tag::Is(self.tag - 1))?;
            // SAFETY: `r` borrows `self.comm`, and `notice` is dropped before it.
            self.notice = Some(unsafe { unbound(r) });
        }
        for &w in &self.to[step.sends] {
            let mut b = self.spare.pop().unwrap_or_default();
            b.clear();
            b.extend_from_slice(&self.work);
            let r = c.isend_on(c.coll_state(), b, w, self.tag)?;
            // SAFETY: `r` borrows `self.comm`, and `sends` is dropped before it.
            self.sends.push(unsafe { unbound(r) });
        }
        if let Some(w) = step.recv {
            let b = self.scratch.take().unwrap_or_else(|| Vec::with_capacity(self.work.len()));
            let r = c.irecv_on(c.coll_state(), b, Source::Rank(w), Tag::Is(self.tag))?;
            // SAFETY: as above, for `recv`.
            self.recv = Some(unsafe { unbound(r) });
        }
        Ok(())
    }

    /// Collects step `self.at`, complete: the send buffers back, the received data used.
    fn collect(&mut self) -> Result<(), Error> {
        let mut res = Ok(());
        for mut r in self.sends.drain(..) {
            if let Some((b, outcome)) = r.take_parts() {
                self.spare.push(b);
                if let Err(e) = outcome {
                    res = res.and(Err(step_error(&self.comm, e)));
                }
            }
        }
        let Some(mut r) = self.recv.take() else { return res };
        let Some((got, outcome)) = r.take_parts() else { return res };
        drop(r);
        let used = match outcome {
            Err(e) => Err(step_error(&self.comm, e)),
            Ok(_) if got.len() != self.work.len() => Err(MISMATCH),
            Ok(_) => {
                match (self.steps[self.at].then, self.reducer) {
                    (Then::Replace, _) => self.work.copy_from_slice(&got),
                    (Then::Combine { theirs_first }, Some((op, f))) => f(op, &mut self.work, &got, theirs_first),
                    (Then::Nothing, _) | (Then::Combine { .. }, None) => {}
                }
                Ok(())
            }
        };
        self.scratch = Some(got);
        res.and(used)
    }
}

impl<T: Primitive> Schedule for Run<T> {
    fn advance(&mut self) -> bool {
        while self.result.is_ok() && self.at < self.steps.len() {
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
            if self.recv.as_ref().is_some_and(|r| !r.is_complete()) || self.sends.iter().any(|r| !r.is_complete()) {
                return false;
            }
            self.result = self.collect();
            self.at += 1;
            self.posted = false;
        }
        true
    }

    fn finish(mut self: Box<Self>) {
        let mut result = std::mem::replace(&mut self.result, Ok(()));
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
                    drop(notice);
                    send_notices(&self.comm, self.tag, e);
                }
            }
        }
        let out = self.out.take();
        if let (Ok(()), Some(out)) = (&result, out) {
            out.write(&self.work);
        }
        // A failed step's other messages: a receive is cancelled, a send finishes on its own.
        self.sends.clear();
        self.recv = None;
        let (op, status) = (self.op.take(), self.status);
        if let Some(home) = self.home.upgrade() {
            *home.lock() = Some(self);
        }
        // Last: whoever waits for the request may start it again at once, and finds the
        // schedule home.
        if let Some(op) = op {
            op.cell.complete(result.map(|()| status));
        }
    }
}

impl<T: Primitive> Drop for Run<T> {
    fn drop(&mut self) {
        // Dropped in flight (the rank's last handle went): the start fails.
        if let Some(op) = self.op.take() {
            op.cell.complete(Err(Error::Cancelled));
        }
    }
}

/// A persistent collective of elements `T`: its schedule, home between starts.
struct CollPlan<T: Primitive> {
    home: Arc<Mutex<Option<Box<Run<T>>>>>,
    len: usize,
}

impl<T: Primitive> CollPlan<T> {
    /// A plan of `steps` over `len` elements under the next sequence number of `comm`.
    fn new(comm: &Communicator, steps: Steps, len: usize, reducer: Option<Reducer<T>>, write_back: bool) -> Self {
        let widest = steps.widest();
        let home = Arc::new(Mutex::new(None));
        let run = Run {
            sends: Vec::with_capacity(widest),
            recv: None,
            notice: None,
            notice_buf: Some(Vec::with_capacity(2)),
            steps: steps.steps.into(),
            to: steps.to.into(),
            at: 0,
            posted: false,
            work: Vec::with_capacity(len),
            spare: (0..widest).map(|_| Vec::with_capacity(len)).collect(),
            scratch: Some(Vec::with_capacity(len)),
            reducer,
            tag: seq_tag(comm.next_seq()),
            write_back,
            out: None,
            op: None,
            status: Status { source: comm.world_of(comm.rank()), tag: 0, bytes: len * std::mem::size_of::<T>() },
            result: Ok(()),
            home: Arc::downgrade(&home),
            comm: Box::new(comm.clone()),
        };
        *home.lock() = Some(Box::new(run));
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
        let mut run = self.home.lock().take().ok_or(LOST)?;
        let op = new_operation(|i| i.context = comm.coll_state().context);
        run.work.clear();
        run.work.extend_from_slice(data);
        run.at = 0;
        run.posted = false;
        run.out = out.filter(|_| run.write_back);
        run.op = Some(op.clone());
        comm.engine().start_schedule(run);
        Ok(op)
    }
}

impl<T: Primitive> Plan<Vec<T>> for CollPlan<T> {
    fn check(&self, comm: &Communicator, buf: &Vec<T>) -> Result<(), Error> {
        self.check_len(comm, buf.len())
    }
    fn start<'c>(&self, comm: &'c Communicator, mut buf: Vec<T>) -> Result<Request<'c, Vec<T>>, Error> {
        let out = Out::of(&mut buf);
        let op = self.launch(comm, &buf, Some(out))?;
        Ok(Request::collective(comm, op, buf))
    }
}

impl Plan<()> for CollPlan<u8> {
    fn check(&self, comm: &Communicator, (): &()) -> Result<(), Error> {
        self.check_len(comm, 0)
    }
    fn start<'c>(&self, comm: &'c Communicator, (): ()) -> Result<Request<'c, ()>, Error> {
        let op = self.launch(comm, &[], None)?;
        Ok(Request::collective(comm, op, ()))
    }
}

/// An op's number in the init's agreement.
fn op_code(op: Op) -> u64 {
    [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::BAnd, Op::BOr, Op::BXor].iter().position(|&o| o == op).map_or(u64::MAX, |i| i as u64)
}

impl Communicator {
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
        let plan = CollPlan::<u8>::new(self, barrier_steps(self), 0, None, false);
        Ok(Persistent::collective(self, Arc::new(plan), ()))
    }

    /// A persistent broadcast of `data` of rank `root` (`MPI_Bcast_init`), inactive: each
    /// start sends the root's buffer as it is then, and a wait leaves the root's elements
    /// in every rank's buffer. Every rank passes the same length and root (checked here: a
    /// collective call).
    pub fn bcast_init<T: Primitive>(&self, data: Vec<T>, root: u32) -> Result<Persistent<'_, Vec<T>>, Error> {
        self.check_root(root)?;
        self.agree([data.len() as u64, u64::from(root), 0])?;
        let plan = CollPlan::new(self, bcast_steps(self, root), data.len(), None, true);
        Ok(Persistent::collective(self, Arc::new(plan), data))
    }

    /// A persistent reduction of `data` with `op` into `data` of rank `root`
    /// (`MPI_Reduce_init`), inactive: each start reduces the buffers as they are then; the
    /// other ranks' buffers are left as they were. Every rank passes the same length, op and
    /// root (checked here: a collective call); a bitwise op on floats is an error.
    pub fn reduce_init<T: Reducible>(&self, data: Vec<T>, op: Op, root: u32) -> Result<Persistent<'_, Vec<T>>, Error> {
        self.check_root(root)?;
        check_op(op, data.first(), "reduce_init: a bitwise op on floating-point elements")?;
        self.agree([data.len() as u64, u64::from(root), op_code(op)])?;
        let plan = CollPlan::new(self, reduce_steps(self, root), data.len(), Some((op, combine::<T>)), self.rank() == root);
        Ok(Persistent::collective(self, Arc::new(plan), data))
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
        let steps = reduce_over_steps(self.group().world_ranks(), self.world_of(self.rank()))?;
        let plan = CollPlan::new(self, steps, data.len(), Some((op, combine::<T>)), true);
        Ok(Persistent::collective(self, Arc::new(plan), data))
    }
}
