//! The collectives' algorithms as plans of steps, one plan per rank, in world ranks: each
//! step sends parts of the working data to some ranks and receives messages from some
//! others, posted at once; once they all completed, each message received lands in the
//! working data (it replaces a part of it, or is combined into it). A persistent collective
//! fixes its plan at init and runs it again at every start (`persistent_coll.rs`); a small
//! blocking barrier, broadcast, reduce or allreduce, and a blocking gather, scatter,
//! allgather or alltoall, writes its plan into storage the thread keeps and runs it on the
//! calling thread (`Communicator::run_direct`, `nbc.rs`); the other blocking and nonblocking
//! collectives run theirs as the steps of their schedule (`nbc.rs`): the barrier and the
//! recursive-doubling reduction (communicator creation) through [`Sched::run_steps`], the
//! others in place through [`Sched::run_in`]. (The small nonblocking broadcast, `coll.rs`,
//! is written as steps of its own: it shares one copy of the data among a node's
//! children.)
//!
//! The working data is the rank's data once (or twice, for the prefix reductions, which
//! keep the partial result beside the running one); the rank's result is its first copy,
//! where the plan says there is one (not at a reduction's or gather's other ranks).
//!
//! The plans here: a dissemination barrier; a binomial-tree broadcast and reduce; a
//! recursive doubling reduction over any list of members (the allreduce's, and communicator
//! creation's, `create.rs`) and one in a single exchange among all members (a small
//! allreduce); a gather and a scatter through the root; a ring allgather; an
//! alltoall of every pair at once; the recursive doubling prefix reductions; and for large
//! messages, Rabenseifner's allreduce, the scatter-allgather broadcast and
//! the reduce-scatter-gather reduce (MPICH's algorithms, chosen by size in `coll.rs`).

use std::ops::Range;

use weft_sync::Error;

use crate::buffer::Primitive;
use crate::coll::{block, span, BCAST_SCATTER_RANKS};
use crate::comm::Communicator;
use crate::nbc::{Sched, Scratch};

/// What a step does with a message it received, at the message's place in the working
/// data.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Then {
    /// Nothing (a barrier's empty message).
    Nothing,
    /// It replaces that part of the working data.
    Replace,
    /// It is combined into that part: `f(theirs, ours)` if `theirs_first`, else
    /// `f(ours, theirs)`.
    Combine { theirs_first: bool },
}

/// A send of the working data's elements `at` to world rank `to`.
#[derive(Clone, Debug)]
pub(crate) struct Outgoing {
    pub(crate) to: u32,
    pub(crate) at: Range<usize>,
}

/// A receive of `len` elements from world rank `from`, used by the landings `lands` (into
/// [`Steps::landings`]).
#[derive(Clone, Debug)]
pub(crate) struct Incoming {
    pub(crate) from: u32,
    pub(crate) len: usize,
    pub(crate) lands: Range<usize>,
}

/// Where a received message goes: the working data's elements from `at` on, as `then`
/// says.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Landing {
    pub(crate) at: usize,
    pub(crate) then: Then,
}

/// One step: sends and receives posted at once (into [`Steps::sends`] and
/// [`Steps::recvs`]); the next step starts when they all completed.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    pub(crate) sends: Range<usize>,
    pub(crate) recvs: Range<usize>,
}

/// A collective's steps on one rank, in world ranks, over `copies` copies of the rank's
/// data.
#[derive(Debug)]
pub(crate) struct Steps {
    pub(crate) steps: Vec<Step>,
    pub(crate) sends: Vec<Outgoing>,
    pub(crate) recvs: Vec<Incoming>,
    pub(crate) landings: Vec<Landing>,
    /// The working data: the rank's data this many times over.
    pub(crate) copies: usize,
    /// Whether the first copy, once the steps are over, is the rank's result.
    pub(crate) result: bool,
    /// Whether, once the steps are over, the copies are combined into the first in order,
    /// `f(f(c0, c1), c2) ...` ([`fold_copies`]).
    pub(crate) fold: bool,
}

impl Default for Steps {
    fn default() -> Self {
        Steps { steps: Vec::new(), sends: Vec::new(), recvs: Vec::new(), landings: Vec::new(), copies: 1, result: true, fold: false }
    }
}

impl Steps {
    /// Starts the next step.
    fn step(&mut self) -> &mut Self {
        let (s, r) = (self.sends.len(), self.recvs.len());
        self.steps.push(Step { sends: s..s, recvs: r..r });
        self
    }

    /// Adds to the step a send of `at` to world rank `to`.
    fn send(&mut self, to: u32, at: Range<usize>) -> &mut Self {
        self.sends.push(Outgoing { to, at });
        self.steps.last_mut().expect("a step started").sends.end += 1;
        self
    }

    /// Adds to the step a receive from world rank `from` that lands on `at` as `then` says.
    fn recv(&mut self, from: u32, at: Range<usize>, then: Then) -> &mut Self {
        self.recv_to(from, at.len(), &[Landing { at: at.start, then }])
    }

    /// Adds to the step a receive of `len` elements from world rank `from`, landing at each
    /// of `landings`.
    fn recv_to(&mut self, from: u32, len: usize, landings: &[Landing]) -> &mut Self {
        let l = self.landings.len();
        self.landings.extend_from_slice(landings);
        self.recvs.push(Incoming { from, len, lands: l..self.landings.len() });
        self.steps.last_mut().expect("a step started").recvs.end += 1;
        self
    }

    /// Whether the steps may work in the rank's buffer itself: its data once, and it is the
    /// result or nothing lands on it (a reduction's or gather's other ranks must find theirs
    /// as it was).
    pub(crate) fn in_place(&self) -> bool {
        self.copies == 1 && (self.result || self.recvs.is_empty())
    }

    /// The most sends, and the most receives, of one step.
    pub(crate) fn widest(&self) -> (usize, usize) {
        let w = |f: fn(&Step) -> usize| self.steps.iter().map(f).max().unwrap_or(0);
        (w(|s| s.sends.len()), w(|s| s.recvs.len()))
    }

    /// No step left (and one copy, the result): the storage kept for the next plan.
    pub(crate) fn clear(&mut self) {
        self.steps.clear();
        self.sends.clear();
        self.recvs.clear();
        self.landings.clear();
        (self.copies, self.result, self.fold) = (1, true, false);
    }
}

/// World rank of the rank `v` places after `root` on `comm`.
fn at(comm: &Communicator, v: u32, root: u32) -> u32 {
    comm.world_of((v + root) % comm.size())
}

/// This rank's place in a binomial tree of `comm` rooted at `root`: its rank counted from
/// the root, and the lowest bit of it that is set (the bit that leads to its parent), or the
/// first power of two not below the size (the root).
fn binomial(comm: &Communicator, root: u32) -> (u32, u32) {
    let n = comm.size();
    let vr = (comm.rank() + n - root) % n;
    let mut mask = 1u32;
    while mask < n && vr & mask == 0 {
        mask <<= 1;
    }
    (vr, mask)
}

/// Dissemination barrier: round `k` signals the rank `2^k` ahead and hears from the one
/// `2^k` behind.
pub(crate) fn barrier_steps(comm: &Communicator) -> Steps {
    made(|s| barrier_into(s, comm))
}

/// [`barrier_steps`] written into `s` (cleared).
pub(crate) fn barrier_into(s: &mut Steps, comm: &Communicator) {
    let (n, me) = (comm.size(), comm.rank());
    let mut d = 1;
    while d < n {
        s.step().send(at(comm, me + d, 0), 0..0).recv(at(comm, me + n - d, 0), 0..0, Then::Nothing);
        d <<= 1;
    }
}

/// Binomial-tree broadcast of `len` elements from `root`: the data from the parent, then to
/// every child at once.
pub(crate) fn bcast_steps(comm: &Communicator, root: u32, len: usize) -> Steps {
    made(|s| bcast_into(s, comm, root, len))
}

/// [`bcast_steps`] written into `s` (cleared).
pub(crate) fn bcast_into(s: &mut Steps, comm: &Communicator, root: u32, len: usize) {
    let (parent, mut children) = bcast_links(comm, root);
    if let Some(p) = parent {
        s.step().recv(p, 0..len, Then::Replace);
    }
    if let Some(first) = children.next() {
        s.step().send(first, 0..len);
        for w in children {
            s.send(w, 0..len);
        }
    }
}

/// This rank's links in the binomial tree of a broadcast from `root` (world ranks): the
/// parent it receives from (none at the root), then the children it sends to, the farthest
/// first. [`bcast_into`]'s plan and the direct small broadcast
/// (`Communicator::bcast_tree_direct`) both walk it, so their messages are the same.
pub(crate) fn bcast_links(comm: &Communicator, root: u32) -> (Option<u32>, impl Iterator<Item = u32> + '_) {
    let n = comm.size();
    let (vr, parent) = binomial(comm, root);
    let children = (0..parent.trailing_zeros()).rev().map(|b| 1 << b).filter(move |&m| vr + m < n).map(move |m| at(comm, vr + m, root));
    ((parent < n).then(|| at(comm, vr - parent, root)), children)
}

/// Binomial-tree reduction of `len` elements into `root`: each child's partial result
/// combined in (`f(ours, theirs)`, the child holding the higher ranks), then ours to the
/// parent.
pub(crate) fn reduce_steps(comm: &Communicator, root: u32, len: usize) -> Steps {
    made(|s| reduce_tree_into(s, comm, root, len))
}

/// [`reduce_steps`] written into `s` (cleared).
pub(crate) fn reduce_tree_into(s: &mut Steps, comm: &Communicator, root: u32, len: usize) {
    let n = comm.size();
    let (vr, parent) = binomial(comm, root);
    s.result = vr == 0;
    for b in 0..parent.trailing_zeros() {
        if vr + (1 << b) < n {
            s.step().recv(at(comm, vr + (1 << b), root), 0..len, Then::Combine { theirs_first: false });
        }
    }
    if parent < n {
        s.step().send(at(comm, vr - parent, root), 0..len);
    }
}

/// Reduction of `len` elements over the world ranks `members` (this rank, world rank
/// `me_world`, among them): every member ends with `f(f(v0, v1), ...)` over the members'
/// values in list order. Recursive doubling over the largest power of two of members, the
/// members beyond it folded in first (MPICH's short-message allreduce).
pub(crate) fn reduce_over_steps(members: &[u32], me_world: u32, len: usize) -> Result<Steps, Error> {
    let mut s = Steps::default();
    reduce_over_into(&mut s, members, me_world, len)?;
    Ok(s)
}

/// [`reduce_over_steps`] written into `s` (cleared).
pub(crate) fn reduce_over_into(s: &mut Steps, members: &[u32], me_world: u32, len: usize) -> Result<(), Error> {
    let me = place_of(members, me_world)? as u32;
    let n = members.len() as u32;
    let w = |i: u32| members[i as usize];
    let fold = Fold::of(n, me);
    fold.fold_in(s, w, len);
    if let Some(nr) = fold.newrank {
        let mut mask = 1;
        while mask < fold.pof2 {
            let dst = fold.member(nr ^ mask);
            s.step().send(w(dst), 0..len).recv(w(dst), 0..len, Then::Combine { theirs_first: dst < me });
            mask <<= 1;
        }
    }
    fold.fold_out(s, w, len);
    Ok(())
}

/// Reduction of `len` elements over the world ranks `members` (this rank, world rank
/// `me_world`, among them) in one step: every member sends its data to every other. `n - 1`
/// messages each way per member where recursive doubling sends `log2 n`, but one round of
/// waiting instead of `log2 n` (and two more beyond a power of two): where the members
/// share fewer cores than they are, each round costs every member a turn on a core, and the
/// round, not the message, is the cost.
///
/// `in_order`: each member keeps what each sends in a copy of its own (`n` copies of the
/// data, member `i`'s in copy `i`) and, once all came, combines the copies in list order,
/// `f(f(v0, v1), v2) ...` ([`Steps::fold`]): every member combines the same values in the
/// same order, the sequential one, so any op may take it (floats, a user's op that is not
/// commutative) and every member gets the same result, bit for bit. Else each message is
/// combined into the member's own data as it lands, the lower members' first, which gives
/// the sequential result only where the order does not matter ([`Reducible::EXACT`]), with
/// no copies.
///
/// [`Reducible::EXACT`]: crate::coll::Reducible::EXACT
pub(crate) fn reduce_exchange_into(s: &mut Steps, members: &[u32], me_world: u32, len: usize, in_order: bool) -> Result<(), Error> {
    let me = place_of(members, me_world)?;
    let copy = |i: usize| if in_order { i * len..(i + 1) * len } else { 0..len };
    if in_order {
        (s.copies, s.fold) = (members.len(), true);
    }
    s.step();
    for (i, &w) in members.iter().enumerate() {
        if i != me {
            s.send(w, copy(me));
        }
    }
    for (i, &w) in members.iter().enumerate() {
        if i != me {
            let then = if in_order { Then::Replace } else { Then::Combine { theirs_first: i < me } };
            s.recv(w, copy(i), then);
        }
    }
    Ok(())
}

/// The copies of `work` (`copies` of them, one after the other) combined into the first in
/// order: `combine(ours, theirs, theirs_first)` with the first as `ours`, each other in turn
/// as `theirs`, `theirs_first` false ([`Steps::fold`]).
pub(crate) fn fold_copies<T>(work: &mut [T], copies: usize, combine: &impl Fn(&mut [T], &[T], bool)) {
    let len = work.len() / copies.max(1);
    if len == 0 {
        return;
    }
    let (first, rest) = work.split_at_mut(len);
    for theirs in rest.chunks_exact(len) {
        combine(first, theirs, false);
    }
}

/// This rank's place among a reduction's `members` (world ranks), this rank world rank
/// `me_world`.
fn place_of(members: &[u32], me_world: u32) -> Result<usize, Error> {
    members.iter().position(|&w| w == me_world).ok_or(Error::InvalidArgument("a reduction over members without this rank"))
}

/// A reduction's fold of the members beyond the largest power of two of them (MPICH's, for
/// its recursive doubling and Rabenseifner's allreduce on any number of ranks): among the
/// first `2 * rem` members, each even one hands its data to the odd one after it, which
/// combines it in and takes part in the algorithm over `pof2` members in its stead, then
/// hands the result back.
#[derive(Clone, Copy, Debug)]
struct Fold {
    /// This member's place in the list of `n`.
    me: u32,
    /// The largest power of two not above `n`.
    pof2: u32,
    /// `n - pof2`: the members folded into others.
    rem: u32,
    /// This member's place among the `pof2` that run the algorithm (`None` for one folded
    /// in).
    newrank: Option<u32>,
}

impl Fold {
    /// Member `me`'s fold on a list of `n` members.
    fn of(n: u32, me: u32) -> Fold {
        let pof2 = 1u32 << (31 - n.leading_zeros());
        let rem = n - pof2;
        let newrank = match me {
            m if m >= 2 * rem => Some(m - rem),
            m if m % 2 == 1 => Some(m / 2),
            _ => None,
        };
        Fold { me, pof2, rem, newrank }
    }

    /// The member at place `nr` among the `pof2`.
    fn member(&self, nr: u32) -> u32 {
        if nr < self.rem {
            nr * 2 + 1
        } else {
            nr + self.rem
        }
    }

    /// Adds the fold's first step (elements `0..len`; `w` gives a member's world rank).
    fn fold_in(&self, s: &mut Steps, w: impl Fn(u32) -> u32, len: usize) {
        if self.me < 2 * self.rem {
            if self.newrank.is_none() {
                s.step().send(w(self.me + 1), 0..len);
            } else {
                s.step().recv(w(self.me - 1), 0..len, Then::Combine { theirs_first: true });
            }
        }
    }

    /// Adds the fold's last step: the result back to the member folded in.
    fn fold_out(&self, s: &mut Steps, w: impl Fn(u32) -> u32, len: usize) {
        if self.me < 2 * self.rem {
            if self.newrank.is_some() {
                s.step().send(w(self.me - 1), 0..len);
            } else {
                s.step().recv(w(self.me + 1), 0..len, Then::Replace);
            }
        }
    }
}

/// Lands `got`, received, at each of `landings` in `work`; `combine(ours, theirs,
/// theirs_first)` combines.
pub(crate) fn land<T: Primitive>(work: &mut [T], landings: &[Landing], got: &[T], combine: &impl Fn(&mut [T], &[T], bool)) {
    for l in landings {
        let part = &mut work[l.at..l.at + got.len()];
        match l.then {
            Then::Nothing => {}
            Then::Replace => part.copy_from_slice(got),
            Then::Combine { theirs_first } => combine(part, got, theirs_first),
        }
    }
}

impl Sched<'_> {
    /// Runs `steps` over `data` (each receive checked for its length) and returns the
    /// rank's result they leave (`data` itself where the plan has none); `f` combines. A
    /// message of another length than planned is [`MISMATCH`](crate::nbc::MISMATCH).
    pub(crate) async fn run_steps<T: Primitive>(
        &self,
        steps: &Steps,
        data: Vec<T>,
        f: impl Fn(&[T], &[T]) -> Vec<T>,
    ) -> Result<Vec<T>, Error> {
        let len = data.len();
        let kept = (!steps.result).then(|| data.clone());
        let mut work = if steps.copies == 1 { data } else { data.repeat(steps.copies) };
        let combine = |ours: &mut [T], theirs: &[T], theirs_first: bool| {
            let v = if theirs_first { f(theirs, ours) } else { f(ours, theirs) };
            ours.copy_from_slice(&v);
        };
        self.run_in(steps, &mut work, combine).await?;
        Ok(kept.unwrap_or_else(|| {
            work.truncate(len);
            work
        }))
    }

    /// Runs `steps` over `data`, the rank's data once, in place: in a working copy of it as
    /// many times over as the plan says where that is more than once (`nbc::Scratch`), whose
    /// first copy comes back into `data` at the end; `combine(ours, theirs, theirs_first)`
    /// combines.
    pub(crate) async fn run_over<T: Primitive>(
        &self,
        steps: &Steps,
        data: &mut [T],
        combine: impl Fn(&mut [T], &[T], bool),
    ) -> Result<(), Error> {
        if steps.copies == 1 {
            return self.run_in(steps, data, combine).await;
        }
        let mut work = Scratch::repeated(data, steps.copies);
        self.run_in(steps, &mut work, combine).await?;
        data.copy_from_slice(&work[..data.len()]);
        Ok(())
    }

    /// Runs `steps` in `work` itself (the rank's data as many times over as the plan's
    /// copies), each
    /// step's sends from scratch copies (`nbc::Scratch`); `combine(ours, theirs,
    /// theirs_first)` combines. A message of another length than planned is [`MISMATCH`](crate::nbc::MISMATCH).
    pub(crate) async fn run_in<T: Primitive>(
        &self,
        steps: &Steps,
        work: &mut [T],
        combine: impl Fn(&mut [T], &[T], bool),
    ) -> Result<(), Error> {
        for step in &steps.steps {
            let incoming = &steps.recvs[step.recvs.clone()];
            let from: Vec<(u32, usize)> = incoming.iter().map(|i| (i.from, i.len)).collect();
            let to: Vec<(u32, Scratch<T>)> =
                steps.sends[step.sends.clone()].iter().map(|o| (o.to, Scratch::copy_of(&work[o.at.clone()]))).collect();
            let got = self.exchange_many::<T>(&from, to).await?;
            for (inc, got) in incoming.iter().zip(got) {
                land(work, &steps.landings[inc.lands.clone()], &got, &combine);
            }
        }
        if steps.fold {
            fold_copies(work, steps.copies, &combine);
        }
        Ok(())
    }
}

/// `len` elements in one block per rank of `n` ([`block`]).
fn blocks_of(len: usize, n: u32) -> Vec<Range<usize>> {
    (0..n).map(|i| block(len, n, i)).collect()
}

/// Gather into `blocks` of the buffer of `root` (one per rank; its own in place) of
/// every other rank's `own` elements: every other rank sends its data to the root, which
/// receives them all at once. `blocks` is read at the root only.
pub(crate) fn gather_steps(comm: &Communicator, root: u32, blocks: &[Range<usize>], own: usize) -> Steps {
    made(|s| gather_into(s, comm, root, blocks, own))
}

/// [`gather_steps`] written into `s` (cleared).
pub(crate) fn gather_into(s: &mut Steps, comm: &Communicator, root: u32, blocks: &[Range<usize>], own: usize) {
    if comm.rank() != root {
        s.result = false;
        s.step().send(comm.world_of(root), 0..own);
    } else if comm.size() > 1 {
        s.step();
        for (r, b) in others(comm, blocks) {
            s.recv(r, b, Then::Replace);
        }
    }
}

/// The plan `write` writes.
fn made(write: impl FnOnce(&mut Steps)) -> Steps {
    let mut s = Steps::default();
    write(&mut s);
    s
}

/// Scatter of `blocks` of the buffer of `root` (one per rank; its own stays in place):
/// every other rank gets its block, of `own` elements, sent by the root to every rank at
/// once. `blocks` is read at the root only.
pub(crate) fn scatter_steps(comm: &Communicator, root: u32, blocks: &[Range<usize>], own: usize) -> Steps {
    made(|s| scatter_into(s, comm, root, blocks, own))
}

/// [`scatter_steps`] written into `s` (cleared).
pub(crate) fn scatter_into(s: &mut Steps, comm: &Communicator, root: u32, blocks: &[Range<usize>], own: usize) {
    if comm.rank() != root {
        s.step().recv(comm.world_of(root), 0..own, Then::Replace);
        return;
    }
    s.result = false;
    if comm.size() > 1 {
        s.step();
        for (r, b) in others(comm, blocks) {
            s.send(r, b);
        }
    }
}

/// The world rank and block of `blocks` (one per rank) of every rank but this one.
fn others<'a>(comm: &'a Communicator, blocks: &'a [Range<usize>]) -> impl Iterator<Item = (u32, Range<usize>)> + 'a {
    let me = comm.rank() as usize;
    blocks.iter().enumerate().filter(move |&(r, _)| r != me).map(|(r, b)| (comm.world_of(r as u32), b.clone()))
}

/// Adds a ring allgather of `blocks` to `s`, `blocks[v]` for the rank `v` from `root`:
/// that rank starts with block `v`, and in `n - 1` steps each rank passes the block it got
/// last to the next.
fn ring_allgather(s: &mut Steps, comm: &Communicator, blocks: &[Range<usize>], root: u32) {
    let n = comm.size();
    let vr = (comm.rank() + n - root) % n;
    let (left, right) = (at(comm, vr + n - 1, root), at(comm, vr + 1, root));
    for step in 0..n.saturating_sub(1) {
        let out = blocks[((vr + n - step) % n) as usize].clone();
        let inc = blocks[((vr + 2 * n - step - 1) % n) as usize].clone();
        s.step().send(right, out).recv(left, inc, Then::Replace);
    }
}

/// Allgather into `blocks` of every rank's buffer (one per rank, as long on every rank;
/// each rank's own in place at the start): a ring of `size - 1` steps.
pub(crate) fn allgather_steps(comm: &Communicator, blocks: &[Range<usize>]) -> Steps {
    made(|s| allgather_into(s, comm, blocks))
}

/// [`allgather_steps`] written into `s` (cleared).
pub(crate) fn allgather_into(s: &mut Steps, comm: &Communicator, blocks: &[Range<usize>]) {
    ring_allgather(s, comm, blocks, 0);
}

/// Alltoall: `sblocks[r]` (one per rank) goes to rank `r`, and rank `r`'s block for this
/// rank lands on `rblocks[r]` (the same blocks, in place, for the in-place forms; this
/// rank's own is left to the caller), every pair at once, the receives posted first.
pub(crate) fn alltoall_steps(comm: &Communicator, sblocks: &[Range<usize>], rblocks: &[Range<usize>]) -> Steps {
    made(|s| alltoall_into(s, comm, sblocks, rblocks))
}

/// [`alltoall_steps`] written into `s` (cleared).
pub(crate) fn alltoall_into(s: &mut Steps, comm: &Communicator, sblocks: &[Range<usize>], rblocks: &[Range<usize>]) {
    if comm.size() > 1 {
        s.step();
        for (w, b) in others(comm, rblocks) {
            s.recv(w, b, Then::Replace);
        }
        for (w, b) in others(comm, sblocks) {
            s.send(w, b);
        }
    }
}

/// Prefix reduction of `len` elements in rank order, `inclusive` (`scan`) or not
/// (`exscan`, rank 0's data left as it is), by recursive doubling (MPICH's): the working
/// data holds the result so far, then the reduction over this rank's block of ranks of the
/// current step; each step trades the block's with the partner `2^k` away, whose block,
/// if it holds lower ranks, comes first in both.
pub(crate) fn scan_steps(comm: &Communicator, len: usize, inclusive: bool) -> Steps {
    let (n, me) = (comm.size(), comm.rank());
    let mut s = Steps { copies: 2, ..Steps::default() };
    let (result, block) = (0, len);
    let mut below = inclusive;
    let mut mask = 1u32;
    while mask < n {
        let partner = me ^ mask;
        if partner < n {
            let w = comm.world_of(partner);
            s.step().send(w, block..block + len);
            if partner < me {
                let first = if below { Then::Combine { theirs_first: true } } else { Then::Replace };
                let into = [Landing { at: block, then: Then::Combine { theirs_first: true } }, Landing { at: result, then: first }];
                s.recv_to(w, len, &into);
                below = true;
            } else {
                s.recv(w, block..block + len, Then::Combine { theirs_first: false });
            }
        }
        mask <<= 1;
    }
    s
}

/// Allreduce of `len` elements (at least one per rank) with a commutative op for large
/// messages: Rabenseifner's, a reduce-scatter by recursive halving and an allgather by
/// recursive doubling over the largest power of two of ranks, the ranks beyond it folded in
/// first and handed the result at the end ([Thakur 2005]; MPICH's
/// `reduce_scatter_allgather`), written into `s` (empty).
pub(crate) fn allreduce_long_into(s: &mut Steps, comm: &Communicator, len: usize) {
    let fold = Fold::of(comm.size(), comm.rank());
    let w = |v: u32| comm.world_of(v);
    fold.fold_in(s, w, len);
    if let Some(nr) = fold.newrank {
        let blocks = blocks_of(len, fold.pof2);
        let ranks = |v: u32| w(fold.member(v));
        reduce_scatter_halving(s, (fold.pof2, nr), ranks, &blocks);
        allgather_doubling(s, (fold.pof2, nr), ranks, &blocks);
    }
    fold.fold_out(s, w, len);
}

/// Adds a reduce-scatter by recursive halving over a power of two `n` of ranks to `s`, this
/// one `vr` of them (`w(v)` the world rank of rank `v`): rank `v` keeps, at each step, the
/// half of its window of `blocks` on its side of the partner `n / 2^(k+1)` away, sends the
/// other half there and combines what comes back into the half it keeps; it ends with block
/// `v` reduced over every rank.
fn reduce_scatter_halving(s: &mut Steps, (n, vr): (u32, u32), w: impl Fn(u32) -> u32, blocks: &[Range<usize>]) {
    let (mut lo, mut hi) = (0, n);
    let mut mask = n / 2;
    while mask > 0 {
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if vr & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
        let to = w(vr ^ mask);
        s.step().send(to, span(blocks, give.0, give.1)).recv(to, span(blocks, keep.0, keep.1), Then::Combine { theirs_first: true });
        (lo, hi) = keep;
        mask >>= 1;
    }
}

/// Adds an allgather by recursive doubling over a power of two `n` of ranks to `s`, this
/// one `vr` of them (`w(v)` the world rank of rank `v`), after [`reduce_scatter_halving`]:
/// each step trades the window of `blocks` gathered so far with the partner's, the window
/// doubling.
fn allgather_doubling(s: &mut Steps, (n, vr): (u32, u32), w: impl Fn(u32) -> u32, blocks: &[Range<usize>]) {
    let (mut lo, mut hi) = (vr, vr + 1);
    let mut mask = 1;
    while mask < n {
        let theirs = if vr & mask == 0 { (hi, hi + mask) } else { (lo - mask, lo) };
        let to = w(vr ^ mask);
        s.step().send(to, span(blocks, lo, hi)).recv(to, span(blocks, theirs.0, theirs.1), Then::Replace);
        (lo, hi) = (lo.min(theirs.0), hi.max(theirs.1));
        mask <<= 1;
    }
}

/// Broadcast of `len` elements from `root` for large messages, in segments of `seg`
/// elements. On fewer than [`BCAST_SCATTER_RANKS`] ranks, the binomial tree pipelined by
/// segment ([`bcast_pipelined_into`]); from there on, scatter and allgather (van de Geijn;
/// MPICH's `scatter_ring_allgather`, [Thakur 2005]): the root's `n` blocks go down a
/// binomial tree (each subtree gets the blocks of its ranks), then a ring gathers them
/// everywhere.
pub(crate) fn bcast_long_steps(comm: &Communicator, root: u32, len: usize, seg: usize) -> Steps {
    made(|s| bcast_long_into(s, comm, root, len, seg))
}

/// [`bcast_long_steps`] written into `s` (empty).
pub(crate) fn bcast_long_into(s: &mut Steps, comm: &Communicator, root: u32, len: usize, seg: usize) {
    let n = comm.size();
    if n < BCAST_SCATTER_RANKS {
        return bcast_pipelined_into(s, comm, root, len, seg);
    }
    let (vr, parent) = binomial(comm, root);
    // The blocks of ranks `lo..hi` (from the root) as one range.
    let part = |lo: u32, hi: u32| block(len, n, lo).start..block(len, n, hi.min(n) - 1).end;
    if parent < n {
        s.step().recv(at(comm, vr - parent, root), part(vr, vr + parent), Then::Replace);
    }
    let children: Vec<u32> = (0..parent.trailing_zeros()).rev().map(|b| 1 << b).filter(|&m| vr + m < n).collect();
    if !children.is_empty() {
        s.step();
        for m in children {
            s.send(at(comm, vr + m, root), part(vr + m, vr + 2 * m));
        }
    }
    ring_allgather(s, comm, &blocks_of(len, n), root);
}

/// Broadcast of `len` elements from `root` down the binomial tree of [`bcast_into`],
/// pipelined in segments of `seg` elements (as Open MPI's segmented tree broadcasts,
/// [Pjesivac-Grbovic 2007]): step `k` receives segment `k` from the parent while it sends
/// segment `k - 1` to every child, so a rank forwards the first half of a message while the
/// second comes in. Every byte is still copied once into each rank, as in the whole-message
/// tree; on a host the copies of a level overlap those of the next (8 ranks on 2 cores, 1
/// MiB: 0.41-0.51 ms, against 0.66-0.98 by scatter and allgather, 0.60x by the median of
/// alternated runs, and 0.93 down the tree unsegmented).
pub(crate) fn bcast_pipelined_into(s: &mut Steps, comm: &Communicator, root: u32, len: usize, seg: usize) {
    let (parent, children) = bcast_links(comm, root);
    let children: Vec<u32> = children.collect();
    let seg = seg.max(1);
    let segment = |k: usize| k * seg..((k + 1) * seg).min(len);
    let segments = len.div_ceil(seg);
    for k in 0..=segments {
        let from = parent.filter(|_| k < segments);
        let forward = k > 0 && !children.is_empty();
        if from.is_none() && !forward {
            continue;
        }
        s.step();
        if let Some(p) = from {
            s.recv(p, segment(k), Then::Replace);
        }
        if forward {
            for &c in &children {
                s.send(c, segment(k - 1));
            }
        }
    }
}

/// Reduction of `len` elements (at least one per rank) with a commutative op into `root` on
/// a power of two of ranks, for large messages: a reduce-scatter by recursive halving, then
/// a binomial gather of the reduced blocks to the root ([Thakur 2005]; MPICH's
/// `reduce_scatter_gather`). The other ranks' data is left holding partial reductions.
pub(crate) fn reduce_long_steps(comm: &Communicator, root: u32, len: usize) -> Steps {
    let n = comm.size();
    let blocks = blocks_of(len, n);
    let (vr, parent) = binomial(comm, root);
    let mut s = Steps { result: vr == 0, ..Steps::default() };
    reduce_scatter_halving(&mut s, (n, vr), |v| at(comm, v, root), &blocks);
    // Rank `vr` holds blocks `vr..hi`, reduced over every rank.
    let mut hi = vr + 1;
    let mut mask = 1;
    while mask < parent {
        s.step().recv(at(comm, vr + mask, root), span(&blocks, hi, hi + mask), Then::Replace);
        hi += mask;
        mask <<= 1;
    }
    if parent < n {
        s.step().send(at(comm, vr - parent, root), span(&blocks, vr, hi));
    }
    s
}
