//! Blocking collectives on any communicator: `barrier` (dissemination), `bcast` and `reduce`
//! (binomial trees), `allreduce` (recursive doubling, ranks beyond a power of two folded in
//! first, as MPICH does for short messages), `gather` and `scatter` (the root exchanges with
//! each rank), `allgather` (ring), `scan` and `exscan` (recursive doubling). Their messages travel on the communicator's collective
//! context under reserved negative tags, so they never match a user receive, `Tag::Any`
//! included. Each collective's sends are posted after its receive, so large messages (by
//! rendezvous) cannot wait on each other.

use weft_sync::Error;

use crate::buffer::Primitive;
use crate::comm::Communicator;
use crate::matching::{Source, Tag};

/// Collective-context tag of round `k` of `barrier` is `TAG_BARRIER - k`.
const TAG_BARRIER: i32 = -16;
/// Collective-context tag of `bcast`.
const TAG_BCAST: i32 = -48;
/// Collective-context tag of `allreduce`.
const TAG_ALLREDUCE: i32 = -49;
/// Collective-context tag of `reduce`.
const TAG_REDUCE: i32 = -50;
/// Collective-context tag of `gather`.
const TAG_GATHER: i32 = -51;
/// Collective-context tag of `scatter`.
const TAG_SCATTER: i32 = -52;
/// Collective-context tag of `allgather`.
const TAG_ALLGATHER: i32 = -53;
/// Collective-context tag of `scan` and `exscan`.
const TAG_SCAN: i32 = -54;

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
}

macro_rules! reducible_int {
    ($($t:ty),*) => { $(
        impl Reducible for $t {
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

impl Communicator {
    fn check_collective(&self) -> Result<(), Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        Ok(())
    }

    /// Receives `len` elements from world rank `from` on the collective context, posting the
    /// receive before the sends of `to` (world ranks and their data) go out. A lost peer is
    /// named by its rank in this communicator.
    fn exchange<T: Primitive>(&self, tag: i32, from: Option<(u32, usize)>, to: &[(u32, Vec<T>)]) -> Result<Option<Vec<T>>, Error> {
        let coll = self.coll_state();
        let rx = match from {
            Some((w, len)) => Some((
                self.irecv_on(coll, Vec::<T>::with_capacity(len), Source::Rank(w), Tag::Is(tag)).map_err(|e| self.local_error(e))?,
                len,
            )),
            None => None,
        };
        let sends = to
            .iter()
            .map(|(w, v)| self.isend_on(coll, v.clone(), *w, tag))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.local_error(e))?;
        let got = match rx {
            Some((rx, len)) => {
                let (v, _) = rx.wait()?;
                if v.len() != len {
                    return Err(Error::InvalidArgument("collective: a rank passed a different length"));
                }
                Some(v)
            }
            None => None,
        };
        for s in sends {
            s.wait()?;
        }
        Ok(got)
    }

    /// Blocks until every rank of the communicator has called it (`MPI_Barrier`;
    /// dissemination: `ceil(log2 size)` rounds, round `k` signalling the rank `2^k` ahead).
    pub fn barrier(&self) -> Result<(), Error> {
        self.check_collective()?;
        let (n, me) = (self.size(), self.rank());
        let mut k = 0;
        while 1u32 << k < n {
            let d = 1 << k;
            let (from, to) = (self.world_of((me + n - d) % n), self.world_of((me + d) % n));
            self.exchange::<u8>(TAG_BARRIER - k, Some((from, 0)), &[(to, Vec::new())])?;
            k += 1;
        }
        Ok(())
    }

    /// Copies `data` of rank `root` into `data` of every rank (`MPI_Bcast`; binomial tree).
    /// Every rank passes the same length and root.
    pub fn bcast<T: Primitive>(&self, data: &mut [T], root: u32) -> Result<(), Error> {
        self.check_collective()?;
        let n = self.size();
        if root >= n {
            return Err(Error::RankOutOfRange { rank: root, size: n });
        }
        let vr = (self.rank() + n - root) % n;
        let mut mask = 1u32;
        while mask < n {
            if vr & mask != 0 {
                let from = self.world_of((vr - mask + root) % n);
                let v = self.exchange::<T>(TAG_BCAST, Some((from, data.len())), &[])?.expect("a receive was posted");
                data.copy_from_slice(&v);
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        let mut to = Vec::new();
        while mask > 0 {
            if vr + mask < n {
                to.push((self.world_of((vr + mask + root) % n), data.to_vec()));
            }
            mask >>= 1;
        }
        self.exchange::<T>(TAG_BCAST, None, &to)?;
        Ok(())
    }

    /// Checks that `root` is a rank here.
    fn check_root(&self, root: u32) -> Result<(), Error> {
        self.check_collective()?;
        if root >= self.size() {
            return Err(Error::RankOutOfRange { rank: root, size: self.size() });
        }
        Ok(())
    }

    /// Reduces `send` elementwise over every rank with `op` into `recv` of rank `root`
    /// (`MPI_Reduce`; binomial tree). `recv` is read only at the root, where it has the
    /// length of `send`. Every rank passes the same length, op and root.
    pub fn reduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: Op, root: u32) -> Result<(), Error> {
        self.check_root(root)?;
        if send.first().is_some_and(|&x| T::apply(op, x, x).is_none()) {
            return Err(Error::InvalidArgument("reduce: a bitwise op on floating-point elements"));
        }
        let (n, me, len) = (self.size(), self.rank(), send.len());
        if me == root && recv.len() != len {
            return Err(Error::InvalidArgument("reduce: the root's receive buffer differs in length from the send buffer"));
        }
        let vr = (me + n - root) % n;
        let at = |v: u32| self.world_of((v + root) % n);
        let mut buf = send.to_vec();
        let mut mask = 1u32;
        while mask < n {
            if vr & mask != 0 {
                self.exchange(TAG_REDUCE, None, &[(at(vr - mask), buf)])?;
                return Ok(());
            }
            if vr + mask < n {
                let theirs = self.exchange::<T>(TAG_REDUCE, Some((at(vr + mask), len)), &[])?.expect("a receive was posted");
                buf = buf.iter().zip(&theirs).map(|(&a, &b)| T::apply(op, a, b).expect("op checked for the type")).collect();
            }
            mask <<= 1;
        }
        recv.copy_from_slice(&buf);
        Ok(())
    }

    /// Gathers `send` of every rank into `recv` of rank `root`, rank `r`'s at
    /// `r * send.len()` (`MPI_Gather`). `recv` is read only at the root, where it holds
    /// `size * send.len()` elements.
    pub fn gather<T: Primitive>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<(), Error> {
        self.check_root(root)?;
        let (n, me, len) = (self.size(), self.rank(), send.len());
        if me != root {
            self.exchange(TAG_GATHER, None, &[(self.world_of(root), send.to_vec())])?;
            return Ok(());
        }
        if recv.len() != n as usize * len {
            return Err(Error::InvalidArgument("gather: the root's receive buffer is not size x the send buffer"));
        }
        for r in 0..n {
            let block = &mut recv[r as usize * len..(r as usize + 1) * len];
            if r == me {
                block.copy_from_slice(send);
            } else {
                block.copy_from_slice(&self.exchange::<T>(TAG_GATHER, Some((self.world_of(r), len)), &[])?.expect("a receive was posted"));
            }
        }
        Ok(())
    }

    /// Scatters `send` of rank `root` (`size * recv.len()` elements there; read only there):
    /// rank `r` gets the block at `r * recv.len()` into `recv` (`MPI_Scatter`).
    pub fn scatter<T: Primitive>(&self, send: &[T], recv: &mut [T], root: u32) -> Result<(), Error> {
        self.check_root(root)?;
        let (n, me, len) = (self.size(), self.rank(), recv.len());
        if me != root {
            let v = self.exchange::<T>(TAG_SCATTER, Some((self.world_of(root), len)), &[])?.expect("a receive was posted");
            recv.copy_from_slice(&v);
            return Ok(());
        }
        if send.len() != n as usize * len {
            return Err(Error::InvalidArgument("scatter: the root's send buffer is not size x the receive buffer"));
        }
        let to: Vec<(u32, Vec<T>)> =
            (0..n).filter(|&r| r != me).map(|r| (self.world_of(r), send[r as usize * len..(r as usize + 1) * len].to_vec())).collect();
        self.exchange(TAG_SCATTER, None, &to)?;
        recv.copy_from_slice(&send[me as usize * len..(me as usize + 1) * len]);
        Ok(())
    }

    /// Gathers `send` of every rank into `recv` of every rank, rank `r`'s at
    /// `r * send.len()` (`MPI_Allgather`; a ring of `size - 1` steps). `recv` holds
    /// `size * send.len()` elements.
    pub fn allgather<T: Primitive>(&self, send: &[T], recv: &mut [T]) -> Result<(), Error> {
        self.check_collective()?;
        let (n, me, len) = (self.size(), self.rank(), send.len());
        if recv.len() != n as usize * len {
            return Err(Error::InvalidArgument("allgather: the receive buffer is not size x the send buffer"));
        }
        let block = |r: u32| r as usize * len..(r as usize + 1) * len;
        recv[block(me)].copy_from_slice(send);
        let (left, right) = (self.world_of((me + n - 1) % n), self.world_of((me + 1) % n));
        for step in 0..n - 1 {
            let (out, inc) = ((me + n - step) % n, (me + n - step - 1) % n);
            let got =
                self.exchange::<T>(TAG_ALLGATHER, Some((left, len)), &[(right, recv[block(out)].to_vec())])?.expect("a receive was posted");
            recv[block(inc)].copy_from_slice(&got);
        }
        Ok(())
    }

    /// Inclusive prefix reduction (`MPI_Scan`): `recv` of rank `r` is `send` of ranks
    /// `0..=r` reduced elementwise with `op`, in rank order. Every rank passes the same
    /// lengths and op.
    pub fn scan<T: Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<(), Error> {
        let below = self.prefix(send, recv.len(), op)?;
        let f = |a, b| T::apply(op, a, b).expect("op checked for the type");
        match below {
            Some(b) => recv.iter_mut().zip(b.iter().zip(send)).for_each(|(o, (&x, &y))| *o = f(x, y)),
            None => recv.copy_from_slice(send),
        }
        Ok(())
    }

    /// Exclusive prefix reduction (`MPI_Exscan`): `recv` of rank `r > 0` is `send` of ranks
    /// `0..r` reduced elementwise with `op`, in rank order; rank 0's `recv` is left as it
    /// is (MPI leaves it undefined). Every rank passes the same lengths and op.
    pub fn exscan<T: Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<(), Error> {
        if let Some(b) = self.prefix(send, recv.len(), op)? {
            recv.copy_from_slice(&b);
        }
        Ok(())
    }

    /// The reduction of `send` over the ranks below this one (`None` at rank 0), by recursive
    /// doubling: each step trades the reduction of a block of ranks with the partner's.
    fn prefix<T: Reducible>(&self, send: &[T], recv_len: usize, op: Op) -> Result<Option<Vec<T>>, Error> {
        self.check_collective()?;
        if send.len() != recv_len {
            return Err(Error::InvalidArgument("scan: send and receive buffers of different lengths"));
        }
        if send.first().is_some_and(|&x| T::apply(op, x, x).is_none()) {
            return Err(Error::InvalidArgument("scan: a bitwise op on floating-point elements"));
        }
        let f =
            |a: &[T], b: &[T]| -> Vec<T> { a.iter().zip(b).map(|(&x, &y)| T::apply(op, x, y).expect("op checked for the type")).collect() };
        let (n, me, len) = (self.size(), self.rank(), send.len());
        // `block`: the reduction over this rank's block of the current step; `below`: over
        // the ranks below this one seen so far.
        let mut block = send.to_vec();
        let mut below: Option<Vec<T>> = None;
        let mut mask = 1u32;
        while mask < n {
            let partner = me ^ mask;
            if partner < n {
                let w = self.world_of(partner);
                let theirs = self.exchange::<T>(TAG_SCAN, Some((w, len)), &[(w, block.clone())])?.expect("a receive was posted");
                if partner < me {
                    below = Some(match below {
                        Some(b) => f(&theirs, &b),
                        None => theirs.clone(),
                    });
                    block = f(&theirs, &block);
                } else {
                    block = f(&block, &theirs);
                }
            }
            mask <<= 1;
        }
        Ok(below)
    }

    /// Reduces `send` elementwise over every rank with `op` into `recv` of every rank
    /// (`MPI_Allreduce`). Every rank passes the same lengths and op; a bitwise op on floats
    /// is an error.
    pub fn allreduce<T: Reducible>(&self, send: &[T], recv: &mut [T], op: Op) -> Result<(), Error> {
        if let Some(&x) = send.first() {
            if T::apply(op, x, x).is_none() {
                return Err(Error::InvalidArgument("allreduce: a bitwise op on floating-point elements"));
            }
        }
        self.allreduce_with(send, recv, |a, b| T::apply(op, a, b).expect("op checked for the type"))
    }

    /// [`allreduce`](Self::allreduce) with a user reduction `f(a, b)`, which must be
    /// associative; operands always come in rank order (`a` from the lower ranks), so it need
    /// not be commutative. Recursive doubling: `log2` of the largest power of two not above
    /// the size in exchanges, plus two messages for each rank beyond it.
    pub fn allreduce_with<T: Primitive>(&self, send: &[T], recv: &mut [T], f: impl Fn(T, T) -> T) -> Result<(), Error> {
        self.check_collective()?;
        if send.len() != recv.len() {
            return Err(Error::InvalidArgument("allreduce: send and receive buffers of different lengths"));
        }
        let members = self.group().world_ranks().clone();
        let buf = self.reduce_over(&members, TAG_ALLREDUCE, send.to_vec(), |lower, upper| {
            lower.iter().zip(upper).map(|(&a, &b)| f(a, b)).collect()
        })?;
        recv.copy_from_slice(&buf);
        Ok(())
    }

    /// Reduces `value` over the world ranks `members` (this rank among them; each passes the
    /// same list and length) on the collective context with `tag`: every member gets
    /// `f(f(v0, v1), ...)` over the members' values in list order (`f(lower, upper)` combines
    /// the values of two adjacent runs of members). Recursive doubling over the largest power
    /// of two of members, the members beyond it folded in first (MPICH's short-message
    /// allreduce).
    pub(crate) fn reduce_over<T: Primitive>(
        &self,
        members: &[u32],
        tag: i32,
        value: Vec<T>,
        f: impl Fn(&[T], &[T]) -> Vec<T>,
    ) -> Result<Vec<T>, Error> {
        let me_world = self.world_of(self.rank());
        let me =
            members.iter().position(|&w| w == me_world).ok_or(Error::InvalidArgument("a reduction over members without this rank"))? as u32;
        let (n, len) = (members.len() as u32, value.len());
        let w = |i: u32| members[i as usize];
        let pof2 = 1u32 << (31 - n.leading_zeros());
        let rem = n - pof2;
        let mut buf = value;
        // Fold: among the first `2 * rem` members, each even one hands its data to the odd
        // one after it and waits for the result.
        let newrank = if me < 2 * rem {
            if me % 2 == 0 {
                self.exchange(tag, None, &[(w(me + 1), buf.clone())])?;
                None
            } else {
                let lower = self.exchange::<T>(tag, Some((w(me - 1), len)), &[])?.expect("a receive was posted");
                buf = f(&lower, &buf);
                Some(me / 2)
            }
        } else {
            Some(me - rem)
        };
        if let Some(nr) = newrank {
            let mut mask = 1;
            while mask < pof2 {
                let partner = nr ^ mask;
                let dst = if partner < rem { partner * 2 + 1 } else { partner + rem };
                let theirs = self.exchange::<T>(tag, Some((w(dst), len)), &[(w(dst), buf.clone())])?.expect("a receive was posted");
                buf = if dst < me { f(&theirs, &buf) } else { f(&buf, &theirs) };
                mask <<= 1;
            }
        }
        if me < 2 * rem {
            if me % 2 == 1 {
                self.exchange(tag, None, &[(w(me - 1), buf.clone())])?;
            } else {
                buf = self.exchange::<T>(tag, Some((w(me + 1), len)), &[])?.expect("a receive was posted");
            }
        }
        Ok(buf)
    }
}
