//! The collectives on any communicator, blocking and nonblocking. Each is a schedule of
//! point-to-point steps (`nbc.rs`): a nonblocking one (`ibcast`, ...) is a [`Request`] like a
//! receive, which the rank's progress completes; a blocking one starts the same schedule and
//! waits for it — except the small blocking `barrier` and `reduce`, every blocking `bcast`,
//! `allreduce` and `allreduce_with`, and
//! the blocking `gather`, `scatter`, `allgather` and `alltoall` (and their `v` forms), whose
//! steps the calling thread posts and waits for itself, with no schedule or future
//! (`Communicator::run_direct`, `nbc.rs`). Their messages travel on the
//! communicator's collective context under tags of the collective's sequence number, so they
//! never match a user receive (`Tag::Any` included) nor each other's.
//!
//! # Algorithms and their thresholds
//!
//! Chosen by message size and number of ranks as MPICH chooses them (its defaults):
//!
//! | collective | small | large |
//! |---|---|---|
//! | `barrier` | dissemination: `ceil(log2 n)` rounds (on 2 ranks its one step, which the blocking form takes by the 2-rank allreduce's path with empty messages) | — |
//! | `bcast` | binomial tree (on 2 ranks its one message, which the blocking form of up to [`ALLREDUCE_EXCHANGE_BYTES`] sends from the root's data and receives into the other's directly, by the 2-rank allreduce's path) | from [`BCAST_LONG_BYTES`] and [`BCAST_LONG_RANKS`] ranks: the binomial tree pipelined in segments of [`BCAST_SEGMENT_BYTES`] ([Pjesivac-Grbovic 2007]); from [`BCAST_SCATTER_RANKS`] ranks, binomial scatter of `n` blocks, then a ring allgather (van de Geijn; MPICH's `scatter_ring_allgather`) |
//! | `allreduce` | recursive doubling, ranks beyond a power of two folded in first; on 3 to [`ALLREDUCE_EXCHANGE_RANKS`] ranks and up to [`ALLREDUCE_EXCHANGE_BYTES`]: one exchange, every rank's data to every other at once, each rank combining all of them in rank order (one round of waiting instead of `log2 n`: on a host with fewer cores than ranks each round costs every rank a turn on a core) | from [`ALLREDUCE_LONG_BYTES`] with a predefined op and at least `n` elements: Rabenseifner's: a reduce-scatter by recursive halving, then an allgather by recursive doubling (`2 log2 p` steps over the largest power of two `p` of ranks, each rank beyond it folding its vector into a partner first and getting the result back at the end), sending about `2 (p-1)/p` times the data per rank, against `log2 p` times |
//! | `reduce` | binomial tree | from [`REDUCE_LONG_BYTES`] with a predefined op, at least `n` elements and a power of two of ranks: a reduce-scatter by recursive halving, then a binomial gather of the reduced blocks ([Thakur 2005]) |
//! | `gather`, `scatter` (and `v`) | the root exchanges with every rank at once | — |
//! | `allgather` (and `v`) | ring | — |
//! | `alltoall` (and `v`) | every pair at once, receives posted first | — |
//! | `scan`, `exscan` | recursive doubling | — |
//!
//! The blocking, nonblocking and persistent allreduce choose alike (`allreduce_into`). Every
//! rank of a small one combines the `n` contributions in rank order, `((x0 op x1) op x2)
//! ...`, the sequential result, the same bit for bit on every rank, for floats too (an
//! [exact](Reducible::EXACT) type's, whose result no order changes, each as it lands). A user
//! reduction (`allreduce_with`) need not be commutative: it takes the exchange where a
//! predefined op does, and recursive doubling, which combines in rank order, at every
//! larger size.
//!
//! Every algorithm but the small nonblocking broadcast (which shares one copy of the data
//! among a node's children) is a plan of steps (`coll_steps.rs`), one copy for the blocking,
//! nonblocking and persistent (`persistent_coll.rs`) forms.
//!
//! # Buffers
//!
//! A blocking collective works in the caller's buffer, a nonblocking one in its request's:
//! neither copies the user's data in or out. What a step sends, and what it receives before
//! reducing or copying it into place, lives in scratch buffers the process keeps between
//! collectives (`nbc::Scratch`), so that a large message does not map fresh memory (and
//! fault on each of its pages) on every call. A collective run on the calling thread sends
//! a large message from the caller's buffer itself, and receives one that only replaces a
//! part of it straight into that part (`nbc::LEND_MIN_BYTES`): only what it combines goes
//! through a scratch buffer.
//!
//! # Errors
//!
//! Bad arguments found on the calling rank (a root out of range, buffers of the wrong
//! length) are refused before anything is sent. A rank that finds, during the collective,
//! that another passed a different length or count fails with
//! `InvalidArgument`, and a peer lost during a collective fails it with `PeerLost`; either
//! way the failing rank tells every other member, so that none of them waits forever for a
//! message that will not come (`nbc.rs`).

use std::ops::Range;

use std::sync::Arc;

use weft_sync::Error;

use crate::buffer::Primitive;
use crate::coll_steps::{
    allgather_into, allgather_steps, allreduce_long_into, alltoall_into, alltoall_steps, barrier_into, barrier_steps, bcast_into,
    bcast_long_into, bcast_long_steps, gather_into, gather_steps, reduce_exchange_into, reduce_long_steps, reduce_over_into,
    reduce_over_steps, reduce_steps, reduce_tree_into, scan_steps, scatter_into, scatter_steps, Steps as StepPlan,
};
use crate::comm::Communicator;
use crate::nbc::{DirectPlan, In, Out, Sched, Scratch, Steps, MISMATCH};
use crate::request::Request;

/// `bcast` messages of at least this many bytes go by scatter and allgather (MPICH's
/// `MPIR_CVAR_BCAST_SHORT_MSG_SIZE`)...
pub const BCAST_LONG_BYTES: usize = 12288;
/// ... on at least this many ranks (MPICH's `MPIR_CVAR_BCAST_MIN_PROCS`).
pub const BCAST_LONG_RANKS: u32 = 8;
/// Long `bcast` messages on fewer than this many ranks go down the binomial tree pipelined
/// in segments of [`BCAST_SEGMENT_BYTES`]; from this many ranks on, by scatter and
/// allgather, which sends the root's data out about twice where the tree sends it once per
/// level (MPICH's choice at every size, for networks; on one host of 2 cores the pipelined
/// tree took 0.42-0.97x its time at 8 ranks, median 0.54, 64 KiB to 4 MiB).
pub const BCAST_SCATTER_RANKS: u32 = 16;
/// The segments of the pipelined broadcast: 512 KiB (1 MiB at 8 ranks on 2 cores: 0.41-0.49
/// ms, against 0.44-0.59 with segments of 256 KiB and 0.53-0.67 with 128 KiB).
pub const BCAST_SEGMENT_BYTES: usize = 512 << 10;

/// [`BCAST_SEGMENT_BYTES`] in elements of `T`.
pub(crate) fn bcast_segment<T>() -> usize {
    (BCAST_SEGMENT_BYTES / std::mem::size_of::<T>().max(1)).max(1)
}
/// `allreduce` messages of at least this many bytes (and at least one element per rank) go
/// by Rabenseifner's reduce-scatter and allgather, the ranks beyond a power of two folded in
/// first (MPICH's `MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE`).
pub const ALLREDUCE_LONG_BYTES: usize = 2048;
/// `reduce` messages of at least this many bytes (and at least one element per rank) go by
/// reduce-scatter and gather on a power of two of ranks (MPICH's
/// `MPIR_CVAR_REDUCE_SHORT_MSG_SIZE`).
pub const REDUCE_LONG_BYTES: usize = 2048;

/// Whether a broadcast of `bytes` on `n` ranks goes by scatter and allgather.
pub(crate) fn bcast_is_long(bytes: usize, n: u32) -> bool {
    bytes >= BCAST_LONG_BYTES && n >= BCAST_LONG_RANKS
}

/// Whether a blocking broadcast of `bytes` on `n` ranks sends its one message straight
/// (`Communicator::bcast_pair_direct`): on 2 ranks, some bytes and up to
/// [`ALLREDUCE_EXCHANGE_BYTES`] (never long on 2 ranks: [`BCAST_LONG_RANKS`]). The message
/// is the plan's ([`bcast_into`]), so a rank taking it meets one running the plan.
pub(crate) fn bcast_is_pair_direct(bytes: usize, n: u32) -> bool {
    n == 2 && bytes > 0 && bytes <= ALLREDUCE_EXCHANGE_BYTES
}

/// Whether a blocking broadcast of `bytes` on `n` ranks walks its binomial tree straight
/// (`Communicator::bcast_tree_direct`): on more than 2 ranks, some bytes and up to
/// [`ALLREDUCE_EXCHANGE_BYTES`] (never long: [`BCAST_LONG_BYTES`] is above). Its messages
/// are the plan's ([`bcast_into`]), so a rank taking it meets one running the plan.
pub(crate) fn bcast_is_tree_direct(bytes: usize, n: u32) -> bool {
    n > 2 && bytes > 0 && bytes <= ALLREDUCE_EXCHANGE_BYTES
}

/// Whether an allreduce (with a predefined op) of `len` elements, `bytes` in all, on `n`
/// ranks goes by reduce-scatter and allgather.
pub(crate) fn allreduce_is_long(bytes: usize, len: usize, n: u32) -> bool {
    bytes >= ALLREDUCE_LONG_BYTES && len >= n as usize && n > 1
}

/// A small `allreduce` (blocking, nonblocking or persistent, of any type and op) on up to
/// this many ranks goes by one exchange of every rank's data with every other's, each rank
/// combining them all in rank order (`reduce_exchange_into`) ...
pub const ALLREDUCE_EXCHANGE_RANKS: u32 = 8;
/// ... of at most this many bytes.
pub const ALLREDUCE_EXCHANGE_BYTES: usize = 256;

/// Whether an allreduce of `bytes` on `n` ranks goes by one exchange among all ranks rather
/// than recursive doubling. Every rank decides alike (from the call's arguments and the
/// communicator's size only).
pub(crate) fn allreduce_is_exchange(bytes: usize, n: u32) -> bool {
    n > 2 && n <= ALLREDUCE_EXCHANGE_RANKS && bytes <= ALLREDUCE_EXCHANGE_BYTES
}

/// Whether a blocking allreduce of `bytes` (some) on `n` ranks with an op of `kind` runs
/// its exchange straight from the members' list (`Communicator::allreduce_exchange_direct`),
/// with no stored plan: one exchange whose messages combine into the caller's data as they
/// land, on 2 ranks (where it is recursive doubling's one step) or on up to
/// [`ALLREDUCE_EXCHANGE_RANKS`] with an exact op. The messages are those of the plan
/// ([`allreduce_into`]), so a rank taking it meets one running the plan.
pub(crate) fn allreduce_is_exchange_direct(bytes: usize, n: u32, kind: OpKind) -> bool {
    bytes > 0 && (n == 2 && bytes <= ALLREDUCE_EXCHANGE_BYTES || kind == OpKind::Exact && allreduce_is_exchange(bytes, n))
}

/// What an allreduce's plan may rely on of its op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OpKind {
    /// A predefined op on an [exact](Reducible::EXACT) type: any order and grouping of the
    /// operands gives the same result.
    Exact,
    /// A predefined op on floats: commutative, its result depends on the order.
    Commutative,
    /// A user's op: associative only, its operands in rank order.
    User,
}

impl OpKind {
    /// The kind of a predefined op on `T`.
    pub(crate) fn of<T: Reducible>() -> OpKind {
        if T::EXACT {
            OpKind::Exact
        } else {
            OpKind::Commutative
        }
    }
}

/// The plan of an allreduce of `len` elements, `bytes` in all, on `comm` with an op of
/// `kind`, written into `s` (cleared): the one choice of the blocking, nonblocking and
/// persistent forms. One exchange ([`allreduce_is_exchange`]; an exact op combines each
/// contribution as it lands, the others all of them in rank order once all came), else
/// Rabenseifner's for a predefined op ([`allreduce_is_long`]), else recursive doubling.
pub(crate) fn allreduce_into(s: &mut StepPlan, comm: &Communicator, len: usize, bytes: usize, kind: OpKind) -> Result<(), Error> {
    let (members, me, n) = (comm.world_ranks(), comm.world_of(comm.rank()), comm.size());
    if allreduce_is_exchange(bytes, n) {
        reduce_exchange_into(s, members, me, len, kind != OpKind::Exact)
    } else if kind != OpKind::User && allreduce_is_long(bytes, len, n) {
        allreduce_long_into(s, comm, len);
        Ok(())
    } else {
        reduce_over_into(s, members, me, len)
    }
}

/// Whether a reduction (with a predefined op) of `len` elements, `bytes` in all, on `n`
/// ranks goes by reduce-scatter and gather.
pub(crate) fn reduce_is_long(bytes: usize, len: usize, n: u32) -> bool {
    bytes >= REDUCE_LONG_BYTES && len >= n as usize && n > 1 && n.is_power_of_two()
}

/// A predefined reduction (`MPI_Op`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// `MPI_SUM` (integers wrap).
    Sum,
    /// `MPI_PROD` (integers wrap).
    Prod,
    /// `MPI_MIN`.
    Min,
    /// `MPI_MAX`.
    Max,
    /// `MPI_BAND` (integers only).
    BAnd,
    /// `MPI_BOR` (integers only).
    BOr,
    /// `MPI_BXOR` (integers only).
    BXor,
}

/// An element type the predefined [`Op`]s reduce.
pub trait Reducible: Primitive {
    /// `op(a, b)`; `None` where `op` is not defined for the type (bitwise on floats).
    fn apply(op: Op, a: Self, b: Self) -> Option<Self>;

    /// Whether every op gives the same result whatever the order and grouping of its
    /// operands (integers: their arithmetic wraps), so that a reduction may combine them
    /// in any order and every rank still gets the sequential result. Not floats.
    const EXACT: bool = false;
}

macro_rules! reducible_int {
    ($($t:ty),*) => { $(
        impl Reducible for $t {
            const EXACT: bool = true;

            #[inline]
            fn apply(op: Op, a: Self, b: Self) -> Option<Self> {
                Some(match op {
                    Op::Sum => a.wrapping_add(b),
                    Op::Prod => a.wrapping_mul(b),
                    Op::Min => a.min(b),
                    Op::Max => a.max(b),
                    Op::BAnd => a & b,
                    Op::BOr => a | b,
                    Op::BXor => a ^ b,
                })
            }
        }
    )* };
}
reducible_int!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize);

macro_rules! reducible_float {
    ($($t:ty),*) => { $(
        impl Reducible for $t {
            #[inline]
            fn apply(op: Op, a: Self, b: Self) -> Option<Self> {
                match op {
                    Op::Sum => Some(a + b),
                    Op::Prod => Some(a * b),
                    Op::Min => Some(a.min(b)),
                    Op::Max => Some(a.max(b)),
                    Op::BAnd | Op::BOr | Op::BXor => None,
                }
            }
        }
    )* };
}
reducible_float!(f32, f64);

/// An error naming `what` if `op` is not defined for `T` (bitwise on floats; told by an
/// element of the data, `sample`).
pub(crate) fn check_op<T: Reducible>(op: Op, sample: Option<&T>, what: &'static str) -> Result<(), Error> {
    match sample {
        Some(&x) if T::apply(op, x, x).is_none() => Err(Error::InvalidArgument(what)),
        _ => Ok(()),
    }
}

/// `op` applied elementwise into `ours`: `op(theirs, ours)` if `theirs_first`, else
/// `op(ours, theirs)` (`op` checked for the type). The op is chosen once, outside the loop,
/// so that each loop is one operation over two slices, which the compiler vectorizes.
#[inline]
pub(crate) fn combine<T: Reducible>(op: Op, ours: &mut [T], theirs: &[T], theirs_first: bool) {
    /// The loop of one op.
    #[inline(always)]
    fn each<T: Reducible>(ours: &mut [T], theirs: &[T], theirs_first: bool, op: Op) {
        let f = |a, b| T::apply(op, a, b).expect("op checked for the type");
        if theirs_first {
            ours.iter_mut().zip(theirs).for_each(|(a, &t)| *a = f(t, *a));
        } else {
            ours.iter_mut().zip(theirs).for_each(|(a, &t)| *a = f(*a, t));
        }
    }
    match op {
        Op::Sum => each(ours, theirs, theirs_first, Op::Sum),
        Op::Prod => each(ours, theirs, theirs_first, Op::Prod),
        Op::Min => each(ours, theirs, theirs_first, Op::Min),
        Op::Max => each(ours, theirs, theirs_first, Op::Max),
        Op::BAnd => each(ours, theirs, theirs_first, Op::BAnd),
        Op::BOr => each(ours, theirs, theirs_first, Op::BOr),
        Op::BXor => each(ours, theirs, theirs_first, Op::BXor),
    }
}

/// A collective's steps working in place in a buffer (`start_in`, `run_in_place`).
pub(crate) trait InPlace<T>: for<'a, 'c> FnOnce(&'a Sched<'c>, &'a mut [T]) -> Steps<'a> + Send + 'static {}

impl<T, F: for<'a, 'c> FnOnce(&'a Sched<'c>, &'a mut [T]) -> Steps<'a> + Send + 'static> InPlace<T> for F {}

/// `f` as the steps of a collective in place (a closure passed here gets the signature,
/// for every lifetime, that [`InPlace`] asks for).
fn in_place<T, F: for<'a, 'c> FnOnce(&'a Sched<'c>, &'a mut [T]) -> Steps<'a> + Send + 'static>(f: F) -> F {
    f
}

/// Block `i` of `n` nearly equal blocks of `len` elements (the last ones may be shorter or
/// empty).
pub(crate) fn block(len: usize, n: u32, i: u32) -> Range<usize> {
    let per = len.div_ceil(n as usize);
    (i as usize * per).min(len)..((i as usize + 1) * per).min(len)
}

/// Blocks `counts[r]` long at `displs[r]` of a buffer of `len` elements, one per rank, or an
/// error naming `what` if the lists are not one per rank or a block leaves the buffer.
pub(crate) fn blocks(counts: &[usize], displs: &[usize], n: u32, len: usize, what: &'static str) -> Result<Vec<Range<usize>>, Error> {
    if counts.len() != n as usize || displs.len() != n as usize {
        return Err(Error::InvalidArgument(what));
    }
    counts
        .iter()
        .zip(displs)
        .map(|(&c, &d)| match d.checked_add(c) {
            Some(end) if end <= len => Ok(d..end),
            _ => Err(Error::InvalidArgument(what)),
        })
        .collect()
}

/// The user reduction `f` as a step's combination: `f(theirs, ours)` elementwise if
/// `theirs_first`, else `f(ours, theirs)`.
fn user_combine<T: Copy>(f: impl Fn(T, T) -> T + Send + Sync + 'static) -> impl Fn(&mut [T], &[T], bool) + Send + 'static {
    move |ours, theirs, theirs_first| {
        for (a, &t) in ours.iter_mut().zip(theirs) {
            *a = if theirs_first { f(t, *a) } else { f(*a, t) };
        }
    }
}

/// Blocks `a..b` (`a < b`) of `blocks`, which follow each other, as one range.
pub(crate) fn span(blocks: &[Range<usize>], a: u32, b: u32) -> Range<usize> {
    blocks[a as usize].start..blocks[b as usize - 1].end
}

/// `n` blocks of `len` elements, one after the other.
pub(crate) fn even(len: usize, n: u32) -> Vec<Range<usize>> {
    (0..n as usize).map(|r| r * len..(r + 1) * len).collect()
}

impl Sched<'_> {
    /// The world rank of rank `v` counted from `root`.
    fn at(&self, v: u32, root: u32) -> u32 {
        let n = self.comm.size();
        self.comm.world_of((v + root) % n)
    }

    /// Dissemination barrier ([`barrier_steps`]).
    async fn barrier(&self) -> Result<(), Error> {
        self.run_steps::<u8>(&barrier_steps(self.comm), Vec::new(), |a, _| a.to_vec()).await.map(drop)
    }

    /// Binomial-tree broadcast of `data` from `root`.
    async fn bcast_binomial<T: Primitive>(&self, data: &mut [T], root: u32) -> Result<(), Error> {
        let n = self.comm.size();
        let vr = (self.comm.rank() + n - root) % n;
        let mut mask = 1u32;
        while mask < n {
            if vr & mask != 0 {
                let got = self.recv::<T>(self.at(vr - mask, root), data.len()).await?;
                data.copy_from_slice(&got);
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        let children: Vec<u32> = std::iter::successors(Some(mask), |m| Some(m >> 1))
            .take_while(|&m| m > 0)
            .filter(|&m| vr + m < n)
            .map(|m| self.at(vr + m, root))
            .collect();
        if children.is_empty() {
            return Ok(());
        }
        // One copy of the data, shared by the sends to every child.
        let shared = Arc::new(Scratch::copy_of(data));
        self.exchange::<T>(None, children.into_iter().map(|w| (w, shared.clone())).collect()).await.map(drop)
    }

    /// Reduces `value` over the world ranks `members` (this rank among them; each passes the
    /// same list and length): every member gets `f(f(v0, v1), ...)` over the members' values
    /// in list order (`f(lower, upper)` combines the values of two adjacent runs of
    /// members), by recursive doubling ([`reduce_over_steps`]).
    pub(crate) async fn reduce_over<T: Primitive>(
        &self,
        members: &[u32],
        value: Vec<T>,
        f: impl Fn(&[T], &[T]) -> Vec<T>,
    ) -> Result<Vec<T>, Error> {
        let steps = reduce_over_steps(members, self.comm.world_of(self.comm.rank()), value.len())?;
        self.run_steps(&steps, value, f).await
    }

    /// [`reduce_over`](Self::reduce_over) of `data`, in place.
    async fn reduce_over_in<T: Primitive>(&self, members: &[u32], data: &mut [T], f: impl Fn(&[T], &[T]) -> Vec<T>) -> Result<(), Error> {
        let v = self.reduce_over(members, data.to_vec(), f).await?;
        data.copy_from_slice(&v);
        Ok(())
    }

    /// Gathers `send` of every rank into `blocks[r]` of `recv` of `root` ([`gather_steps`];
    /// `recv` and `blocks` are read at the root only).
    async fn gather<T: Primitive>(&self, send: &[T], recv: &mut [T], blocks: &[Range<usize>], root: u32) -> Result<(), Error> {
        let plan = gather_steps(self.comm, root, blocks, send.len());
        if self.comm.rank() != root {
            // The plan only reads it.
            return self.run_in(&plan, &mut Scratch::copy_of(send), |_, _, _| {}).await;
        }
        recv[blocks[root as usize].clone()].copy_from_slice(send);
        self.run_in(&plan, recv, |_, _, _| {}).await
    }

    /// Scatters `blocks[r]` of `send` of `root` into `recv` of rank `r` ([`scatter_steps`];
    /// `send` and `blocks` are read at the root only).
    async fn scatter<T: Primitive>(&self, send: &[T], blocks: &[Range<usize>], recv: &mut [T], root: u32) -> Result<(), Error> {
        let plan = scatter_steps(self.comm, root, blocks, recv.len());
        if self.comm.rank() != root {
            return self.run_in(&plan, recv, |_, _, _| {}).await;
        }
        // The plan only reads it.
        self.run_in(&plan, &mut Scratch::copy_of(send), |_, _, _| {}).await?;
        recv.copy_from_slice(&send[blocks[root as usize].clone()]);
        Ok(())
    }

    /// Sends `send[sblocks[r]]` to every rank `r` and receives `rblocks[r]` of `recv` from it,
    /// all at once ([`alltoall_steps`]): in `recv` itself where both lay their blocks out
    /// alike, else in one buffer of both.
    async fn alltoall<T: Primitive>(
        &self,
        send: &[T],
        sblocks: &[Range<usize>],
        recv: &mut [T],
        rblocks: &[Range<usize>],
    ) -> Result<(), Error> {
        let me = self.comm.rank() as usize;
        if sblocks[me].len() != rblocks[me].len() {
            return Err(MISMATCH);
        }
        if sblocks == rblocks && send.len() == recv.len() {
            recv.copy_from_slice(send);
            return self.run_in(&alltoall_steps(self.comm, sblocks, rblocks), recv, |_, _, _| {}).await;
        }
        // What this rank sends, then what it receives.
        let at = send.len();
        let mut work = [send, &*recv].concat();
        let shifted: Vec<Range<usize>> = rblocks.iter().map(|b| b.start + at..b.end + at).collect();
        self.run_in(&alltoall_steps(self.comm, sblocks, &shifted), &mut work, |_, _, _| {}).await?;
        recv.copy_from_slice(&work[at..]);
        recv[rblocks[me].clone()].copy_from_slice(&send[sblocks[me].clone()]);
        Ok(())
    }

    /// The prefix reduction of `data` with `op` (checked for the type) into `data`
    /// ([`scan_steps`]), `inclusive` (`scan`) or not (`exscan`, rank 0's data left as it
    /// is).
    async fn prefix<T: Reducible>(&self, data: &mut [T], op: Op, inclusive: bool) -> Result<(), Error> {
        let len = data.len();
        // The result so far, then the reduction over this rank's block of ranks.
        let mut work = [&*data, &*data].concat();
        self.run_in(&scan_steps(self.comm, len, inclusive), &mut work, |ours, theirs, tf| combine(op, ours, theirs, tf)).await?;
        data.copy_from_slice(&work[..len]);
        Ok(())
    }
}

/// Boxes a collective's steps: for [`Communicator::start_collective`] (`|s| ...`, given
/// the schedule) or [`Communicator::start_in`] (`|s, work| ...`, and the buffer to work in).
macro_rules! steps {
    (|$s:ident| $body:expr) => {
        move |$s: &Sched<'_>| -> crate::nbc::Steps<'_> { Box::pin(async move { $body }) }
    };
    (|$s:ident, $w:ident| $body:expr) => {
        in_place(move |$s: &Sched<'_>, $w: &mut [_]| -> crate::nbc::Steps<'_> { Box::pin(async move { $body }) })
    };
}

impl Communicator {
    /// Starts a collective whose result is `buf` as `steps` leave it: they work in `buf`
    /// itself, in place (`nbc::Out`).
    fn start_in<T: Primitive>(&self, buf: Vec<T>, steps: impl InPlace<T>) -> Result<Request<'_, Vec<T>>, Error> {
        self.start_in_tagged(None, buf, steps)
    }

    /// [`start_in`](Self::start_in), under a fixed tag if given
    /// ([`Communicator::start_collective`]).
    fn start_in_tagged<T: Primitive>(
        &self,
        fixed: Option<i32>,
        mut buf: Vec<T>,
        steps: impl InPlace<T>,
    ) -> Result<Request<'_, Vec<T>>, Error> {
        let bytes = std::mem::size_of_val(buf.as_slice());
        let out = Out::of(&mut buf);
        self.start_collective(
            buf,
            bytes,
            fixed,
            // SAFETY: the only call for this schedule; the request keeps `buf` until its
            // steps are over.
            steps!(|s| steps(s, unsafe { out.slice() }).await),
        )
    }

    /// A rooted `v` form's blocks: at `root` (checked), those of `counts` and `displs` in its
    /// buffer of `lens.0` elements, the root's own `lens.1` long, else `what`; elsewhere none
    /// (not read).
    fn root_blocks(
        &self,
        root: u32,
        counts: &[usize],
        displs: &[usize],
        lens: (usize, usize),
        what: &'static str,
    ) -> Result<Vec<Range<usize>>, Error> {
        self.check_root(root)?;
        if self.rank() != root {
            return Ok(Vec::new());
        }
        let b = blocks(counts, displs, self.size(), lens.0, what)?;
        if b[root as usize].len() != lens.1 {
            return Err(Error::InvalidArgument(what));
        }
        Ok(b)
    }

    pub(crate) fn check_root(&self, root: u32) -> Result<(), Error> {
        if root >= self.size() {
            return Err(Error::RankOutOfRange { rank: root, size: self.size() });
        }
        Ok(())
    }

    /// Starts a barrier (`MPI_Ibarrier`): the request completes once every rank of the
    /// communicator has started it.
    pub fn ibarrier(&self) -> Result<Request<'_, ()>, Error> {
        self.start_collective((), 0, None, steps!(|s| s.barrier().await))
    }

    /// Blocks until every rank of the communicator has called it (`MPI_Barrier`).
    pub fn barrier(&self) -> Result<(), Error> {
        if self.size() == 2 {
            // The dissemination's one step on two members is an exchange of empty messages
            // under the call's tag: the two-member allreduce's path sends and receives them.
            return self.allreduce_exchange_direct::<u8>(&mut [], |_, _, _| {});
        }
        let plan = |s: &mut StepPlan| {
            barrier_into(s, self);
            Ok(())
        };
        self.run_direct::<u8>(&mut [], DirectPlan::Barrier, plan, |_, _, _| {})
    }

    /// Starts broadcasting `data` of rank `root` to every rank (`MPI_Ibcast`): the request
    /// gives `data` back, holding the root's elements. Every rank passes the same length and
    /// root.
    pub fn ibcast<T: Primitive>(&self, data: Vec<T>, root: u32) -> Result<Request<'_, Vec<T>>, Error> {
        let steps = self.bcast_steps(&data, root)?;
        self.start_in(data, steps)
    }

    /// The steps of a broadcast of `data` from `root` (checked).
    fn bcast_steps<T: Primitive>(&self, data: &[T], root: u32) -> Result<impl InPlace<T>, Error> {
        self.check_root(root)?;
        let long = bcast_is_long(std::mem::size_of_val(data), self.size());
        Ok(steps!(|s, work| if long {
            s.run_in(&bcast_long_steps(s.comm, root, work.len(), bcast_segment::<T>()), work, |_, _, _| {}).await
        } else {
            s.bcast_binomial(work, root).await
        }))
    }

    /// Copies `data` of rank `root` into `data` of every rank (`MPI_Bcast`). Every rank
    /// passes the same length and root.
    pub fn bcast<T: Primitive>(&self, data: &mut [T], root: u32) -> Result<(), Error> {
        self.check_root(root)?;
        if bcast_is_pair_direct(std::mem::size_of_val(data), self.size()) {
            return self.bcast_pair_direct(data, root);
        }
        if bcast_is_tree_direct(std::mem::size_of_val(data), self.size()) {
            return self.bcast_tree_direct(data, root);
        }
        let len = data.len();
        let long = bcast_is_long(std::mem::size_of_val(data), self.size());
        let plan = |s: &mut StepPlan| {
            if long {
                bcast_long_into(s, self, root, len, bcast_segment::<T>());
            } else {
                bcast_into(s, self, root, len);
            }
            Ok(())
        };
        // The plan is a function of the length, size in bytes and root (the members fixed).
        self.run_direct(data, DirectPlan::Bcast { len, bytes: std::mem::size_of_val(data), root }, plan, |_, _, _| {})
    }

    /// Starts reducing `data` elementwise over every rank with `op` into `data` of rank
    /// `root` (`MPI_Ireduce`); the other ranks get theirs back as it was. Every rank passes
    /// the same length, op and root.
    pub fn ireduce<T: Reducible>(&self, data: Vec<T>, op: Op, root: u32) -> Result<Request<'_, Vec<T>>, Error> {
        let steps = self.reduce_steps(&data, op, root, true)?;
        self.start_in(data, steps)
    }

    /// The steps of a reduction of `data` with `op` into `root` (checked).
    ///
    /// Large messages on a power of two of ranks take the reduce-scatter, which leaves a
    /// rank's buffer holding partial reductions: with `keep`, the other ranks' buffers are
    /// kept as they were (the steps work in a copy).
    fn reduce_steps<T: Reducible>(&self, data: &[T], op: Op, root: u32, keep: bool) -> Result<impl InPlace<T>, Error> {
        self.check_root(root)?;
        check_op(op, data.first(), "reduce: a bitwise op on floating-point elements")?;
        let large = reduce_is_long(std::mem::size_of_val(data), data.len(), self.size());
        // The binomial tree too combines the children's data into a rank's own.
        let copy = keep && self.rank() != root;
        let plan = move |s: &Sched<'_>, len| if large { reduce_long_steps(s.comm, root, len) } else { reduce_steps(s.comm, root, len) };
        let f = move |ours: &mut [T], theirs: &[T], tf| combine(op, ours, theirs, tf);
        Ok(steps!(|s, work| if copy {
            s.run_in(&plan(s, work.len()), &mut Scratch::copy_of(work), f).await
        } else {
            s.run_in(&plan(s, work.len()), work, f).await
        }))
    }

    /// Reduces `send` elementwise over every rank with `op` into `recv` of rank `root`
    /// (`MPI_Reduce`). `recv` is read only at the root, where it has the length of `send`.
    /// Every rank passes the same length, op and root.
    pub fn reduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: Op, root: u32) -> Result<(), Error> {
        self.check_root(root)?;
        if self.rank() == root && recv.len() != send.len() {
            return Err(Error::InvalidArgument("reduce: the root's receive buffer differs in length from the send buffer"));
        }
        if std::mem::size_of_val(send) < REDUCE_LONG_BYTES {
            check_op(op, send.first(), "reduce: a bitwise op on floating-point elements")?;
            let plan = |s: &mut StepPlan| {
                reduce_tree_into(s, self, root, send.len());
                Ok(())
            };
            let f = |ours: &mut [T], theirs: &[T], first| combine(op, ours, theirs, first);
            let what = DirectPlan::Reduce { len: send.len(), root };
            if self.rank() == root {
                recv.copy_from_slice(send);
                return self.run_direct(recv, what, plan, f);
            }
            // Left as it was: the steps work in a copy.
            return self.run_direct(&mut Scratch::copy_of(send), what, plan, f);
        }
        let steps = self.reduce_steps(send, op, root, false)?;
        if self.rank() == root {
            recv.copy_from_slice(send);
            self.run_in_place(recv, None, steps)
        } else {
            // Left as it was: the steps work in a copy.
            self.run_in_place(&mut send.to_vec(), None, steps)
        }
    }

    /// Starts reducing `data` elementwise over every rank with `op` into `data` of every rank
    /// (`MPI_Iallreduce`). Every rank passes the same length and op; a bitwise op on floats
    /// is an error.
    pub fn iallreduce<T: Reducible>(&self, data: Vec<T>, op: Op) -> Result<Request<'_, Vec<T>>, Error> {
        check_op(op, data.first(), "allreduce: a bitwise op on floating-point elements")?;
        let steps =
            self.allreduce_steps(&data, OpKind::of::<T>(), move |ours: &mut [T], theirs: &[T], tf| combine(op, ours, theirs, tf))?;
        self.start_in(data, steps)
    }

    /// The steps of an allreduce of `data` ([`allreduce_into`]) with an op of `kind`,
    /// `combine(ours, theirs, theirs_first)` reducing.
    fn allreduce_steps<T: Primitive>(
        &self,
        data: &[T],
        kind: OpKind,
        combine: impl Fn(&mut [T], &[T], bool) + Send + 'static,
    ) -> Result<impl InPlace<T>, Error> {
        let mut plan = StepPlan::default();
        allreduce_into(&mut plan, self, data.len(), std::mem::size_of_val(data), kind)?;
        Ok(steps!(|s, work| s.run_over(&plan, work, combine).await))
    }

    /// Reduces `send` elementwise over every rank with `op` into `recv` of every rank
    /// (`MPI_Allreduce`). Every rank passes the same lengths and op; a bitwise op on floats
    /// is an error.
    pub fn allreduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<(), Error> {
        check_op(op, send.first(), "allreduce: a bitwise op on floating-point elements")?;
        self.allreduce_direct(send, recv, OpKind::of::<T>(), |ours, theirs, first| combine(op, ours, theirs, first))
    }

    /// The blocking allreduce of `send` into `recv` ([`allreduce_into`]) with an op of
    /// `kind`, `combine(ours, theirs, theirs_first)` reducing, on the calling thread.
    fn allreduce_direct<T: Primitive>(
        &self,
        send: &[T],
        recv: &mut [T],
        kind: OpKind,
        combine: impl Fn(&mut [T], &[T], bool),
    ) -> Result<(), Error> {
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument("allreduce: send and receive buffers of different lengths"));
        }
        recv.copy_from_slice(send);
        let (len, bytes) = (send.len(), std::mem::size_of_val(send));
        if allreduce_is_exchange_direct(bytes, self.size(), kind) {
            return self.allreduce_exchange_direct(recv, combine);
        }
        let plan = |s: &mut StepPlan| allreduce_into(s, self, len, bytes, kind);
        // The plan is a function of these (the members fixed).
        self.run_direct(recv, DirectPlan::Allreduce { len, bytes, kind }, plan, combine)
    }

    /// [`iallreduce`](Self::iallreduce) with a user reduction `f(a, b)`, which must be
    /// associative; operands always come in rank order (`a` from the lower ranks), so it need
    /// not be commutative. The algorithm is the predefined ops' but for large messages (one
    /// exchange, each rank applying `f` over every rank's data in rank order, for small
    /// ones; recursive doubling, which keeps the order, for the others).
    pub fn iallreduce_with<T: Primitive>(
        &self,
        data: Vec<T>,
        f: impl Fn(T, T) -> T + Send + Sync + 'static,
    ) -> Result<Request<'_, Vec<T>>, Error> {
        let steps = self.allreduce_steps(&data, OpKind::User, user_combine(f))?;
        self.start_in(data, steps)
    }

    /// [`allreduce`](Self::allreduce) with a user reduction `f(a, b)`, which must be
    /// associative; operands always come in rank order (`a` from the lower ranks), so it need
    /// not be commutative. As [`iallreduce_with`](Self::iallreduce_with): one exchange for
    /// small messages, else recursive doubling (`log2` of the largest power of two not above
    /// the size in exchanges, plus two messages for each rank beyond it).
    pub fn allreduce_with<T: Primitive>(
        &self,
        send: &[T],
        recv: &mut [T],
        f: impl Fn(T, T) -> T + Send + Sync + 'static,
    ) -> Result<(), Error> {
        self.allreduce_direct(send, recv, OpKind::User, user_combine(f))
    }

    /// Reduces `value` over the world ranks `members` (this rank among them) on the
    /// collective context with the fixed `tag` and waits ([`Sched::reduce_over`]).
    pub(crate) fn reduce_over<T: Primitive>(
        &self,
        members: &[u32],
        tag: i32,
        value: Vec<T>,
        f: impl Fn(&[T], &[T]) -> Vec<T> + Send + Sync + 'static,
    ) -> Result<Vec<T>, Error> {
        self.ireduce_over(Some(tag), members.into(), value, f)?.wait().map(|(v, _)| v)
    }

    /// Starts [`Sched::reduce_over`] of `value` over `members`, under the fixed tag if given.
    fn ireduce_over<T: Primitive>(
        &self,
        fixed: Option<i32>,
        members: std::sync::Arc<[u32]>,
        value: Vec<T>,
        f: impl Fn(&[T], &[T]) -> Vec<T> + Send + Sync + 'static,
    ) -> Result<Request<'_, Vec<T>>, Error> {
        self.start_in_tagged(fixed, value, steps!(|s, work| s.reduce_over_in(&members, work, f).await))
    }

    /// Starts gathering `send` of every rank into `recv` of rank `root`, rank `r`'s at
    /// `r * send.len()` (`MPI_Igather`). `recv` is read only at the root, where it holds
    /// `size * send.len()` elements; the request gives it back.
    pub fn igather<T: Primitive>(&self, send: &[T], recv: Vec<T>, root: u32) -> Result<Request<'_, Vec<T>>, Error> {
        let blocks = self.gather_blocks(send, recv.len(), root)?;
        self.gatherv_blocks(send, recv, blocks, root)
    }

    /// A gather's blocks of the root's receive buffer of `len` elements (checked there).
    fn gather_blocks<T>(&self, send: &[T], len: usize, root: u32) -> Result<Vec<Range<usize>>, Error> {
        self.check_root(root)?;
        if self.rank() == root && len != self.size() as usize * send.len() {
            return Err(Error::InvalidArgument("gather: the root's receive buffer is not size x the send buffer"));
        }
        Ok(even(send.len(), self.size()))
    }

    /// Gathers `send` of every rank into `recv` of rank `root`, rank `r`'s at
    /// `r * send.len()` (`MPI_Gather`). `recv` is read only at the root, where it holds
    /// `size * send.len()` elements.
    pub fn gather<T: Primitive>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<(), Error> {
        let blocks = self.gather_blocks(send, recv.len(), root)?;
        self.gather_in(send, recv, blocks, root, DirectPlan::Gather { len: send.len(), root })
    }

    /// The blocking gather of `send` into `blocks` of `recv` (both read at the root only),
    /// in the caller's buffers, on the calling thread ([`gather_steps`]; `what` says when
    /// its plan may be reused).
    fn gather_in<T: Primitive>(
        &self,
        send: &[T],
        recv: &mut [T],
        blocks: Vec<Range<usize>>,
        root: u32,
        what: DirectPlan,
    ) -> Result<(), Error> {
        let plan = |s: &mut StepPlan| {
            gather_into(s, self, root, &blocks, send.len());
            Ok(())
        };
        if self.rank() != root {
            // The plan only reads it.
            return self.run_direct(&mut Scratch::copy_of(send), what, plan, |_, _, _| {});
        }
        recv[blocks[root as usize].clone()].copy_from_slice(send);
        self.run_direct(recv, what, plan, |_, _, _| {})
    }

    /// Starts gathering `send` of every rank `r` into `recv[displs[r]..][..counts[r]]` of rank
    /// `root` (`MPI_Igatherv`). `recv`, `counts` and `displs` are read only at the root, where
    /// `counts[r]` is the length rank `r` passes.
    pub fn igatherv<T: Primitive>(
        &self,
        send: &[T],
        recv: Vec<T>,
        counts: &[usize],
        displs: &[usize],
        root: u32,
    ) -> Result<Request<'_, Vec<T>>, Error> {
        let blocks = self.gatherv_of(send, recv.len(), counts, displs, root)?;
        self.gatherv_blocks(send, recv, blocks, root)
    }

    /// A `gatherv`'s blocks of the root's receive buffer of `len` elements (checked there).
    fn gatherv_of<T>(&self, send: &[T], len: usize, counts: &[usize], displs: &[usize], root: u32) -> Result<Vec<Range<usize>>, Error> {
        self.root_blocks(
            root,
            counts,
            displs,
            (len, send.len()),
            "gatherv: counts and displacements do not fit the receive buffer, or the root's own count its send buffer",
        )
    }

    /// Gathers as [`igatherv`](Self::igatherv) and waits (`MPI_Gatherv`), in the caller's
    /// buffers.
    pub fn gatherv<T: Primitive>(&self, send: &[T], recv: &mut [T], counts: &[usize], displs: &[usize], root: u32) -> Result<(), Error> {
        let blocks = self.gatherv_of(send, recv.len(), counts, displs, root)?;
        self.gather_in(send, recv, blocks, root, DirectPlan::Once)
    }

    /// The gather of `send` into `blocks` of `recv` (both read at the root only).
    fn gatherv_blocks<T: Primitive>(
        &self,
        send: &[T],
        recv: Vec<T>,
        blocks: Vec<Range<usize>>,
        root: u32,
    ) -> Result<Request<'_, Vec<T>>, Error> {
        let send = send.to_vec();
        self.start_in(recv, steps!(|s, work| s.gather(&send, work, &blocks, root).await))
    }

    /// Starts scattering `send` of rank `root` (`size * recv.len()` elements there; read only
    /// there): rank `r` gets the block at `r * recv.len()` into `recv` (`MPI_Iscatter`).
    pub fn iscatter<T: Primitive>(&self, send: &[T], recv: Vec<T>, root: u32) -> Result<Request<'_, Vec<T>>, Error> {
        let blocks = self.scatter_blocks(send, recv.len(), root)?;
        self.scatterv_blocks(send, blocks, recv, root)
    }

    /// A scatter's blocks of the root's send buffer (checked there), `len` elements each.
    fn scatter_blocks<T>(&self, send: &[T], len: usize, root: u32) -> Result<Vec<Range<usize>>, Error> {
        self.check_root(root)?;
        if self.rank() == root && send.len() != self.size() as usize * len {
            return Err(Error::InvalidArgument("scatter: the root's send buffer is not size x the receive buffer"));
        }
        Ok(even(len, self.size()))
    }

    /// Scatters `send` of rank `root` (`size * recv.len()` elements there; read only there):
    /// rank `r` gets the block at `r * recv.len()` into `recv` (`MPI_Scatter`).
    pub fn scatter<T: Primitive>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<(), Error> {
        let blocks = self.scatter_blocks(send, recv.len(), root)?;
        self.scatter_in(send, blocks, recv, root, DirectPlan::Scatter { len: recv.len(), root })
    }

    /// The blocking scatter of `blocks` of `send` (both read at the root only) into `recv`,
    /// in the caller's buffers, on the calling thread ([`scatter_steps`]; `what` says when
    /// its plan may be reused).
    fn scatter_in<T: Primitive>(
        &self,
        send: &[T],
        blocks: Vec<Range<usize>>,
        recv: &mut [T],
        root: u32,
        what: DirectPlan,
    ) -> Result<(), Error> {
        let own = recv.len();
        let plan = |s: &mut StepPlan| {
            scatter_into(s, self, root, &blocks, own);
            Ok(())
        };
        if self.rank() != root {
            return self.run_direct(recv, what, plan, |_, _, _| {});
        }
        // The plan only reads it.
        self.run_direct(&mut Scratch::copy_of(send), what, plan, |_, _, _| {})?;
        recv.copy_from_slice(&send[blocks[root as usize].clone()]);
        Ok(())
    }

    /// Starts scattering `send[displs[r]..][..counts[r]]` of rank `root` into `recv` of every
    /// rank `r`, whose length is `counts[r]` (`MPI_Iscatterv`). `send`, `counts` and `displs`
    /// are read only at the root.
    pub fn iscatterv<T: Primitive>(
        &self,
        send: &[T],
        counts: &[usize],
        displs: &[usize],
        recv: Vec<T>,
        root: u32,
    ) -> Result<Request<'_, Vec<T>>, Error> {
        let blocks = self.scatterv_of(send, counts, displs, recv.len(), root)?;
        self.scatterv_blocks(send, blocks, recv, root)
    }

    /// A `scatterv`'s blocks of the root's send buffer (checked there), whose own is `len`
    /// elements.
    fn scatterv_of<T>(&self, send: &[T], counts: &[usize], displs: &[usize], len: usize, root: u32) -> Result<Vec<Range<usize>>, Error> {
        self.root_blocks(
            root,
            counts,
            displs,
            (send.len(), len),
            "scatterv: counts and displacements do not fit the send buffer, or the root's own count its receive buffer",
        )
    }

    /// Scatters as [`iscatterv`](Self::iscatterv) and waits (`MPI_Scatterv`), in the
    /// caller's buffers.
    pub fn scatterv<T: Primitive>(&self, send: &[T], counts: &[usize], displs: &[usize], recv: &mut [T], root: u32) -> Result<(), Error> {
        let blocks = self.scatterv_of(send, counts, displs, recv.len(), root)?;
        self.scatter_in(send, blocks, recv, root, DirectPlan::Once)
    }

    /// The scatter of `blocks` of `send` (both read at the root only) into `recv`.
    fn scatterv_blocks<T: Primitive>(
        &self,
        send: &[T],
        blocks: Vec<Range<usize>>,
        recv: Vec<T>,
        root: u32,
    ) -> Result<Request<'_, Vec<T>>, Error> {
        let send = if self.rank() == root { send.to_vec() } else { Vec::new() };
        self.start_in(recv, steps!(|s, work| s.scatter(&send, &blocks, work, root).await))
    }

    /// Starts gathering `send` of every rank into `recv` of every rank, rank `r`'s at
    /// `r * send.len()` (`MPI_Iallgather`). `recv` holds `size * send.len()` elements.
    pub fn iallgather<T: Primitive>(&self, send: &[T], recv: Vec<T>) -> Result<Request<'_, Vec<T>>, Error> {
        if recv.len() != self.size() as usize * send.len() {
            return Err(Error::InvalidArgument("allgather: the receive buffer is not size x the send buffer"));
        }
        self.allgatherv_blocks(send, recv, even(send.len(), self.size()))
    }

    /// Gathers `send` of every rank into `recv` of every rank, rank `r`'s at
    /// `r * send.len()` (`MPI_Allgather`; a ring of `size - 1` steps). `recv` holds
    /// `size * send.len()` elements.
    pub fn allgather<T: Primitive>(&self, send: &[T], recv: &mut [T]) -> Result<(), Error> {
        if recv.len() != self.size() as usize * send.len() {
            return Err(Error::InvalidArgument("allgather: the receive buffer is not size x the send buffer"));
        }
        self.allgather_in(send, recv, even(send.len(), self.size()), DirectPlan::Allgather { len: send.len() })
    }

    /// The blocking allgather of `send` into `blocks` of `recv`, in the caller's buffer, on
    /// the calling thread ([`allgather_steps`]; `what` says when its plan may be reused).
    fn allgather_in<T: Primitive>(&self, send: &[T], recv: &mut [T], blocks: Vec<Range<usize>>, what: DirectPlan) -> Result<(), Error> {
        recv[blocks[self.rank() as usize].clone()].copy_from_slice(send);
        let plan = |s: &mut StepPlan| {
            allgather_into(s, self, &blocks);
            Ok(())
        };
        self.run_direct(recv, what, plan, |_, _, _| {})
    }

    /// Starts gathering `send` of every rank `r` into `recv[displs[r]..][..counts[r]]` of every
    /// rank (`MPI_Iallgatherv`); `counts[r]` is the length rank `r` passes.
    pub fn iallgatherv<T: Primitive>(
        &self,
        send: &[T],
        recv: Vec<T>,
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Request<'_, Vec<T>>, Error> {
        let b = self.allgatherv_of(send, recv.len(), counts, displs)?;
        self.allgatherv_blocks(send, recv, b)
    }

    /// Gathers as [`iallgatherv`](Self::iallgatherv) and waits (`MPI_Allgatherv`), in the
    /// caller's buffer.
    pub fn allgatherv<T: Primitive>(&self, send: &[T], recv: &mut [T], counts: &[usize], displs: &[usize]) -> Result<(), Error> {
        let b = self.allgatherv_of(send, recv.len(), counts, displs)?;
        self.allgather_in(send, recv, b, DirectPlan::Once)
    }

    /// An `allgatherv`'s blocks of the receive buffer of `len` elements (checked).
    fn allgatherv_of<T>(&self, send: &[T], len: usize, counts: &[usize], displs: &[usize]) -> Result<Vec<Range<usize>>, Error> {
        let b = blocks(counts, displs, self.size(), len, "allgatherv: counts and displacements do not fit the receive buffer")?;
        if b[self.rank() as usize].len() != send.len() {
            return Err(Error::InvalidArgument("allgatherv: the send buffer differs from this rank's count"));
        }
        Ok(b)
    }

    /// The ring allgather of `send` into `blocks` of `recv`.
    fn allgatherv_blocks<T: Primitive>(
        &self,
        send: &[T],
        mut recv: Vec<T>,
        blocks: Vec<Range<usize>>,
    ) -> Result<Request<'_, Vec<T>>, Error> {
        recv[blocks[self.rank() as usize].clone()].copy_from_slice(send);
        self.start_in(recv, steps!(|s, work| s.run_in(&allgather_steps(s.comm, &blocks), work, |_, _, _| {}).await))
    }

    /// Starts sending block `r` of `send` to rank `r` and receiving rank `r`'s block for this
    /// rank into block `r` of `recv`, for every rank `r` (`MPI_Ialltoall`). Both hold `size`
    /// blocks of one length.
    pub fn ialltoall<T: Primitive>(&self, send: &[T], recv: Vec<T>) -> Result<Request<'_, Vec<T>>, Error> {
        let blocks = self.alltoall_blocks(send, recv.len())?;
        self.alltoallv_blocks(send, blocks.clone(), recv, blocks)
    }

    /// An `alltoall`'s blocks of buffers of `send.len()` and `len` elements (checked).
    fn alltoall_blocks<T>(&self, send: &[T], len: usize) -> Result<Vec<Range<usize>>, Error> {
        let n = self.size() as usize;
        if send.len() % n != 0 || len != send.len() {
            return Err(Error::InvalidArgument("alltoall: buffers not of size blocks of one length, or of different lengths"));
        }
        Ok(even(send.len() / n, self.size()))
    }

    /// Exchanges as [`ialltoall`](Self::ialltoall) and waits (`MPI_Alltoall`), in the
    /// caller's buffers.
    pub fn alltoall<T: Primitive>(&self, send: &[T], recv: &mut [T]) -> Result<(), Error> {
        let blocks = self.alltoall_blocks(send, recv.len())?;
        self.alltoall_in(send, blocks.clone(), recv, blocks, DirectPlan::Alltoall { len: send.len() })
    }

    /// The blocking exchange of `sblocks` of `send` for `rblocks` of `recv`, in the caller's
    /// buffers: on the calling thread in `recv` itself where both lay their blocks out alike
    /// ([`alltoall_steps`]; `what` says when its plan may be reused), else as a schedule.
    fn alltoall_in<T: Primitive>(
        &self,
        send: &[T],
        sblocks: Vec<Range<usize>>,
        recv: &mut [T],
        rblocks: Vec<Range<usize>>,
        what: DirectPlan,
    ) -> Result<(), Error> {
        if sblocks == rblocks && send.len() == recv.len() {
            recv.copy_from_slice(send);
            let plan = |s: &mut StepPlan| {
                alltoall_into(s, self, &sblocks, &rblocks);
                Ok(())
            };
            return self.run_direct(recv, what, plan, |_, _, _| {});
        }
        let send = In::of(send);
        // SAFETY: `send` stays borrowed until `run_in_place` returned.
        self.run_in_place(recv, None, steps!(|s, work| s.alltoall(unsafe { send.slice() }, &sblocks, work, &rblocks).await))
    }

    /// Starts sending `send[sdispls[r]..][..scounts[r]]` to every rank `r` and receiving its
    /// block for this rank into `recv[rdispls[r]..][..rcounts[r]]` (`MPI_Ialltoallv`); rank
    /// `r`'s `scounts` entry for this rank equals this rank's `rcounts[r]`.
    pub fn ialltoallv<T: Primitive>(
        &self,
        send: &[T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: Vec<T>,
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<Request<'_, Vec<T>>, Error> {
        let (sb, rb) = self.alltoallv_of((send.len(), scounts, sdispls), (recv.len(), rcounts, rdispls))?;
        self.alltoallv_blocks(send, sb, recv, rb)
    }

    /// An `alltoallv`'s blocks of its send and receive buffers, each given as its length,
    /// counts and displacements (checked).
    #[allow(clippy::type_complexity)]
    fn alltoallv_of(
        &self,
        (slen, scounts, sdispls): (usize, &[usize], &[usize]),
        (rlen, rcounts, rdispls): (usize, &[usize], &[usize]),
    ) -> Result<(Vec<Range<usize>>, Vec<Range<usize>>), Error> {
        let n = self.size();
        let sb = blocks(scounts, sdispls, n, slen, "alltoallv: send counts and displacements do not fit the send buffer")?;
        let rb = blocks(rcounts, rdispls, n, rlen, "alltoallv: receive counts and displacements do not fit the receive buffer")?;
        Ok((sb, rb))
    }

    /// Exchanges as [`ialltoallv`](Self::ialltoallv) and waits (`MPI_Alltoallv`).
    pub fn alltoallv<T: Primitive>(
        &self,
        send: &[T],
        scounts: &[usize],
        sdispls: &[usize],
        recv: &mut [T],
        rcounts: &[usize],
        rdispls: &[usize],
    ) -> Result<(), Error> {
        let (sb, rb) = self.alltoallv_of((send.len(), scounts, sdispls), (recv.len(), rcounts, rdispls))?;
        self.alltoall_in(send, sb, recv, rb, DirectPlan::Once)
    }

    /// The exchange of `sblocks` of `send` for `rblocks` of `recv`.
    fn alltoallv_blocks<T: Primitive>(
        &self,
        send: &[T],
        sblocks: Vec<Range<usize>>,
        recv: Vec<T>,
        rblocks: Vec<Range<usize>>,
    ) -> Result<Request<'_, Vec<T>>, Error> {
        let send = send.to_vec();
        self.start_in(recv, steps!(|s, work| s.alltoall(&send, &sblocks, work, &rblocks).await))
    }

    /// Starts an inclusive prefix reduction (`MPI_Iscan`): `data` of rank `r` becomes `data`
    /// of ranks `0..=r` reduced elementwise with `op`, in rank order.
    pub fn iscan<T: Reducible>(&self, data: Vec<T>, op: Op) -> Result<Request<'_, Vec<T>>, Error> {
        self.prefix(data, op, true)
    }

    /// Starts an exclusive prefix reduction (`MPI_Iexscan`): `data` of rank `r > 0` becomes
    /// `data` of ranks `0..r` reduced elementwise with `op`, in rank order; rank 0's is left
    /// as it is (MPI leaves it undefined).
    pub fn iexscan<T: Reducible>(&self, data: Vec<T>, op: Op) -> Result<Request<'_, Vec<T>>, Error> {
        self.prefix(data, op, false)
    }

    /// [`iscan`](Self::iscan) (`inclusive`) or [`iexscan`](Self::iexscan).
    fn prefix<T: Reducible>(&self, data: Vec<T>, op: Op, inclusive: bool) -> Result<Request<'_, Vec<T>>, Error> {
        let steps = prefix_steps(&data, op, inclusive)?;
        self.start_in(data, steps)
    }

    /// Inclusive prefix reduction (`MPI_Scan`): `recv` of rank `r` is `send` of ranks
    /// `0..=r` reduced elementwise with `op`, in rank order. Every rank passes the same
    /// lengths and op.
    pub fn scan<T: Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<(), Error> {
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument("scan: send and receive buffers of different lengths"));
        }
        let steps = prefix_steps(send, op, true)?;
        recv.copy_from_slice(send);
        self.run_in_place(recv, None, steps)
    }

    /// Exclusive prefix reduction (`MPI_Exscan`): `recv` of rank `r > 0` is `send` of ranks
    /// `0..r` reduced elementwise with `op`, in rank order; rank 0's `recv` is left as it
    /// is (MPI leaves it undefined). Every rank passes the same lengths and op.
    pub fn exscan<T: Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<(), Error> {
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument("scan: send and receive buffers of different lengths"));
        }
        let steps = prefix_steps(send, op, false)?;
        if self.rank() == 0 {
            // Left as it is: the steps work in a copy.
            return self.run_in_place(&mut Scratch::copy_of(send), None, steps);
        }
        recv.copy_from_slice(send);
        self.run_in_place(recv, None, steps)
    }
}

/// The steps of a prefix reduction of `data` with `op`, `inclusive` (`scan`) or not
/// (`exscan`).
fn prefix_steps<T: Reducible>(data: &[T], op: Op, inclusive: bool) -> Result<impl InPlace<T>, Error> {
    check_op(op, data.first(), "scan: a bitwise op on floating-point elements")?;
    Ok(steps!(|s, work| s.prefix(work, op, inclusive).await))
}

#[cfg(test)]
mod tests {
    use super::{combine, Op, Reducible};

    /// `combine` of every op, in both orders, element by element as `apply` gives it
    /// (a loop per op, chosen outside it, must pick the right op and order).
    fn combines_as_apply<T: Reducible + std::fmt::Debug + PartialEq>(ours: &[T], theirs: &[T], ops: &[Op]) {
        for &op in ops {
            for theirs_first in [false, true] {
                let mut got = ours.to_vec();
                combine(op, &mut got, theirs, theirs_first);
                let want: Vec<T> = ours
                    .iter()
                    .zip(theirs)
                    .map(|(&a, &t)| if theirs_first { T::apply(op, t, a) } else { T::apply(op, a, t) }.unwrap())
                    .collect();
                assert_eq!(got, want, "{op:?}, theirs first: {theirs_first}");
            }
        }
    }

    #[test]
    fn combine_matches_apply_for_every_op_and_order() {
        let all = [Op::Sum, Op::Prod, Op::Min, Op::Max, Op::BAnd, Op::BOr, Op::BXor];
        let a: Vec<i64> = (0..37).map(|i| i * 7 - 100).collect();
        let b: Vec<i64> = (0..37).map(|i| 50 - i * 3).collect();
        combines_as_apply(&a, &b, &all);
        let a: Vec<u8> = (0..37u8).map(|i| i.wrapping_mul(13)).collect();
        let b: Vec<u8> = (0..37u8).map(|i| 255 - i * 5).collect();
        combines_as_apply(&a, &b, &all);
        // Floats: order matters for sums of values of very different magnitudes.
        let a: Vec<f64> = (0..37).map(|i| f64::from(i) * 1e16 - 3.5).collect();
        let b: Vec<f64> = (0..37).map(|i| 0.25 - f64::from(i)).collect();
        combines_as_apply(&a, &b, &[Op::Sum, Op::Prod, Op::Min, Op::Max]);
    }
}
