//! The collectives' algorithms as plans of steps, one plan per rank, in world ranks: each
//! step sends the working data to some ranks and receives at most one message, posted at
//! once, and then replaces or combines the working data with what it received. A
//! persistent collective fixes its plan at init and runs it again at every start
//! (`persistent_coll.rs`); a small blocking barrier, broadcast, reduce or allreduce writes
//! its plan into storage the thread keeps and runs it on the calling thread
//! (`Communicator::run_direct`, `nbc.rs`); the nonblocking barrier and recursive-doubling reduction (small
//! allreduces, communicator creation) run theirs as the steps of their schedule
//! ([`Sched::run_steps`], `nbc.rs`), while the nonblocking binomial broadcast and reduce
//! run the same trees in place in the caller's buffer (`coll.rs`), which a plan's working
//! copy would cost them at large sizes.
//!
//! The plans here: a dissemination barrier, a binomial-tree broadcast and reduce, and a
//! recursive doubling reduction over any list of members (the allreduce's, and communicator
//! creation's, `create.rs`).

use std::ops::Range;

use weft_sync::Error;

use crate::buffer::Primitive;
use crate::comm::Communicator;
use crate::nbc::{Sched, MISMATCH};

/// What a step does with the message it received, once its sends and receive completed.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Then {
    /// Nothing (a barrier's empty message).
    Nothing,
    /// It becomes the working data.
    Replace,
    /// It is combined into the working data: `f(theirs, ours)` if `theirs_first`, else
    /// `f(ours, theirs)`.
    Combine { theirs_first: bool },
}

/// One step: sends of the working data to some world ranks and at most one receive, posted
/// at once; the next step starts when they all completed.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    /// Into [`Steps::to`].
    pub(crate) sends: Range<usize>,
    pub(crate) recv: Option<u32>,
    pub(crate) then: Then,
}

/// A collective's steps on one rank, in world ranks.
#[derive(Default, Debug)]
pub(crate) struct Steps {
    pub(crate) steps: Vec<Step>,
    /// The destinations of every step's sends.
    pub(crate) to: Vec<u32>,
}

impl Steps {
    fn push(&mut self, to: impl IntoIterator<Item = u32>, recv: Option<u32>, then: Then) {
        let start = self.to.len();
        self.to.extend(to);
        self.steps.push(Step { sends: start..self.to.len(), recv, then });
    }

    /// No step left, the storage kept for the next plan.
    pub(crate) fn clear(&mut self) {
        self.steps.clear();
        self.to.clear();
    }

    /// The most sends of one step.
    pub(crate) fn widest(&self) -> usize {
        self.steps.iter().map(|s| s.sends.len()).max().unwrap_or(0)
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

/// The plan `fill` writes into a new [`Steps`].
fn plan(fill: impl FnOnce(&mut Steps)) -> Steps {
    let mut s = Steps::default();
    fill(&mut s);
    s
}

/// Dissemination barrier: round `k` signals the rank `2^k` ahead and hears from the one
/// `2^k` behind.
pub(crate) fn barrier_steps(comm: &Communicator) -> Steps {
    plan(|s| barrier_into(s, comm))
}

/// [`barrier_steps`] appended to `s`.
pub(crate) fn barrier_into(s: &mut Steps, comm: &Communicator) {
    let (n, me) = (comm.size(), comm.rank());
    let mut d = 1;
    while d < n {
        s.push([at(comm, me + d, 0)], Some(at(comm, me + n - d, 0)), Then::Nothing);
        d <<= 1;
    }
}

/// Binomial-tree broadcast from `root`: the data from the parent, then to every child at
/// once.
pub(crate) fn bcast_steps(comm: &Communicator, root: u32) -> Steps {
    plan(|s| bcast_into(s, comm, root))
}

/// [`bcast_steps`] appended to `s`.
pub(crate) fn bcast_into(s: &mut Steps, comm: &Communicator, root: u32) {
    let n = comm.size();
    let (vr, parent) = binomial(comm, root);
    if parent < n {
        s.push([], Some(at(comm, vr - parent, root)), Then::Replace);
    }
    let children = (0..parent.trailing_zeros()).rev().map(|b| 1 << b).filter(|&m| vr + m < n).map(|m| at(comm, vr + m, root));
    if children.clone().next().is_some() {
        s.push(children, None, Then::Nothing);
    }
}

/// Binomial-tree reduction into `root`: each child's partial result combined in (`f(ours,
/// theirs)`, the child holding the higher ranks), then ours to the parent.
pub(crate) fn reduce_steps(comm: &Communicator, root: u32) -> Steps {
    plan(|s| reduce_tree_into(s, comm, root))
}

/// [`reduce_steps`] appended to `s`.
pub(crate) fn reduce_tree_into(s: &mut Steps, comm: &Communicator, root: u32) {
    let n = comm.size();
    let (vr, parent) = binomial(comm, root);
    for b in 0..parent.trailing_zeros() {
        if vr + (1 << b) < n {
            s.push([], Some(at(comm, vr + (1 << b), root)), Then::Combine { theirs_first: false });
        }
    }
    if parent < n {
        s.push([at(comm, vr - parent, root)], None, Then::Nothing);
    }
}

/// Reduction over the world ranks `members` (this rank, world rank `me_world`, among them):
/// every member ends with `f(f(v0, v1), ...)` over the members' values in list order.
/// Recursive doubling over the largest power of two of members, the members beyond it folded
/// in first (MPICH's short-message allreduce).
pub(crate) fn reduce_over_steps(members: &[u32], me_world: u32) -> Result<Steps, Error> {
    let mut s = Steps::default();
    reduce_over_into(&mut s, members, me_world)?;
    Ok(s)
}

/// [`reduce_over_steps`] appended to `s`.
pub(crate) fn reduce_over_into(s: &mut Steps, members: &[u32], me_world: u32) -> Result<(), Error> {
    let me =
        members.iter().position(|&w| w == me_world).ok_or(Error::InvalidArgument("a reduction over members without this rank"))? as u32;
    let n = members.len() as u32;
    let w = |i: u32| members[i as usize];
    let pof2 = 1u32 << (31 - n.leading_zeros());
    let rem = n - pof2;
    // Fold: among the first `2 * rem` members, each even one hands its data to the odd one
    // after it and waits for the result.
    let newrank = if me < 2 * rem {
        if me % 2 == 0 {
            s.push([w(me + 1)], None, Then::Nothing);
            None
        } else {
            s.push([], Some(w(me - 1)), Then::Combine { theirs_first: true });
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
            s.push([w(dst)], Some(w(dst)), Then::Combine { theirs_first: dst < me });
            mask <<= 1;
        }
    }
    if me < 2 * rem {
        if me % 2 == 1 {
            s.push([w(me - 1)], None, Then::Nothing);
        } else {
            s.push([], Some(w(me + 1)), Then::Replace);
        }
    }
    Ok(())
}

impl Sched<'_> {
    /// Runs `steps` as steps of this schedule over `work` (each receive as long as it) and
    /// returns the working data they leave; `f` combines. A message of another length than
    /// the data is [`MISMATCH`].
    pub(crate) async fn run_steps<T: Primitive>(
        &self,
        steps: &Steps,
        mut work: Vec<T>,
        f: impl Fn(&[T], &[T]) -> Vec<T>,
    ) -> Result<Vec<T>, Error> {
        let len = work.len();
        for step in &steps.steps {
            let to = steps.to[step.sends.clone()].iter().map(|&w| (w, work.clone())).collect();
            let Some(got) = self.exchange(step.recv.map(|w| (w, len)), to).await? else { continue };
            if got.len() != len {
                return Err(MISMATCH);
            }
            work = match step.then {
                Then::Nothing => work,
                Then::Replace => got.to_vec(),
                Then::Combine { theirs_first: true } => f(&got, &work),
                Then::Combine { theirs_first: false } => f(&work, &got),
            };
        }
        Ok(work)
    }
}
