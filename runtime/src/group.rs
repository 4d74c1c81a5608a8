//! Groups of ranks (`MPI_Group`): an ordered set of processes, named by their rank in the
//! runtime's world. A communicator's group ([`Communicator::group`]) numbers its members
//! `0..size`; the set operations build the groups that [`Communicator::create_group`]
//! turns into communicators.
//!
//! [`Communicator::group`]: crate::Communicator::group
//! [`Communicator::create_group`]: crate::Communicator::create_group

use std::sync::Arc;

use weft_sync::Error;

/// An ordered set of distinct processes (`MPI_Group`). Rank `i` of the group is the `i`-th
/// process; [`rank`](Self::rank) says where the calling process is, if it is a member.
#[derive(Clone, PartialEq, Eq)]
pub struct Group {
    /// World rank of each member, in group order.
    members: Arc<[u32]>,
    /// World rank of the process that made the group (from its communicator).
    me: u32,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group").field("members", &&*self.members).field("rank", &self.rank()).finish()
    }
}

impl Group {
    /// The group of `members` (world ranks, distinct) seen by world rank `me`.
    pub(crate) fn from_world(members: Arc<[u32]>, me: u32) -> Self {
        Group { members, me }
    }

    /// World rank of each member, in group order.
    #[inline]
    pub(crate) fn world_ranks(&self) -> &Arc<[u32]> {
        &self.members
    }

    /// The world rank of the calling process.
    pub(crate) fn me(&self) -> u32 {
        self.me
    }

    /// Number of members (`MPI_Group_size`).
    #[inline]
    pub fn size(&self) -> u32 {
        self.members.len() as u32
    }

    /// The calling process's rank in the group, `None` if it is not a member
    /// (`MPI_Group_rank`; `MPI_UNDEFINED`).
    pub fn rank(&self) -> Option<u32> {
        self.position(self.me)
    }

    fn position(&self, world: u32) -> Option<u32> {
        self.members.iter().position(|&w| w == world).map(|i| i as u32)
    }

    fn with(&self, members: Vec<u32>) -> Group {
        Group { members: members.into(), me: self.me }
    }

    fn check_rank(&self, rank: u32) -> Result<u32, Error> {
        self.members.get(rank as usize).copied().ok_or(Error::RankOutOfRange { rank, size: self.size() })
    }

    /// The group of the members at `ranks`, in that order (`MPI_Group_incl`). A rank out of
    /// range or named twice is an error.
    pub fn incl(&self, ranks: &[u32]) -> Result<Group, Error> {
        let mut out = Vec::with_capacity(ranks.len());
        for &r in ranks {
            let w = self.check_rank(r)?;
            if out.contains(&w) {
                return Err(Error::InvalidArgument("Group::incl: a rank named twice"));
            }
            out.push(w);
        }
        Ok(self.with(out))
    }

    /// The group without the members at `ranks`, the rest in their order
    /// (`MPI_Group_excl`). A rank out of range or named twice is an error.
    pub fn excl(&self, ranks: &[u32]) -> Result<Group, Error> {
        let mut drop = vec![false; self.members.len()];
        for &r in ranks {
            self.check_rank(r)?;
            if std::mem::replace(&mut drop[r as usize], true) {
                return Err(Error::InvalidArgument("Group::excl: a rank named twice"));
            }
        }
        Ok(self.with(self.members.iter().zip(drop).filter(|(_, d)| !d).map(|(&w, _)| w).collect()))
    }

    /// The members at the ranks of the triplets `(first, last, stride)`, each walked from
    /// `first` towards `last` inclusive (`MPI_Group_range_incl`). A zero stride, a rank out
    /// of range, or a rank named twice is an error.
    pub fn range_incl(&self, ranges: &[(u32, u32, i32)]) -> Result<Group, Error> {
        let mut ranks = Vec::new();
        for &(first, last, stride) in ranges {
            if stride == 0 {
                return Err(Error::InvalidArgument("Group::range_incl: a zero stride"));
            }
            if (stride > 0 && first > last) || (stride < 0 && first < last) {
                return Err(Error::InvalidArgument("Group::range_incl: a stride walking away from the last rank"));
            }
            self.check_rank(first)?;
            self.check_rank(last)?;
            let mut r = i64::from(first);
            while (stride > 0 && r <= i64::from(last)) || (stride < 0 && r >= i64::from(last)) {
                ranks.push(r as u32);
                r += i64::from(stride);
            }
        }
        self.incl(&ranks)
    }

    /// The members of `self`, then those of `other` not in `self` (`MPI_Group_union`).
    pub fn union(&self, other: &Group) -> Group {
        let mut out = self.members.to_vec();
        out.extend(other.members.iter().filter(|w| !self.members.contains(w)));
        self.with(out)
    }

    /// The members of `self` that are also in `other`, in `self`'s order
    /// (`MPI_Group_intersection`).
    pub fn intersection(&self, other: &Group) -> Group {
        self.with(self.members.iter().copied().filter(|w| other.members.contains(w)).collect())
    }

    /// The members of `self` that are not in `other`, in `self`'s order
    /// (`MPI_Group_difference`).
    pub fn difference(&self, other: &Group) -> Group {
        self.with(self.members.iter().copied().filter(|w| !other.members.contains(w)).collect())
    }

    /// For each of `ranks` (ranks of `self`), its rank in `other`, `None` where it is not a
    /// member (`MPI_Group_translate_ranks`). A rank out of range is an error.
    pub fn translate_ranks(&self, ranks: &[u32], other: &Group) -> Result<Vec<Option<u32>>, Error> {
        ranks.iter().map(|&r| self.check_rank(r).map(|w| other.position(w))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(members: &[u32], me: u32) -> Group {
        Group::from_world(members.into(), me)
    }

    #[test]
    fn set_operations_keep_mpi_order() {
        let a = g(&[0, 1, 2, 3, 4, 5], 2);
        let b = a.incl(&[5, 2, 0]).unwrap();
        assert_eq!(&*b.members, &[5, 2, 0]);
        assert_eq!(b.rank(), Some(1));
        assert_eq!(&*a.excl(&[0, 2, 4]).unwrap().members, &[1, 3, 5]);
        assert_eq!(a.excl(&[0, 2, 4]).unwrap().rank(), None);
        assert_eq!(&*a.range_incl(&[(0, 5, 2), (5, 3, -2)]).unwrap().members, &[0, 2, 4, 5, 3]);
        let c = a.incl(&[4, 1]).unwrap();
        assert_eq!(&*b.union(&c).members, &[5, 2, 0, 4, 1]);
        assert_eq!(&*a.intersection(&b).members, &[0, 2, 5]);
        assert_eq!(&*a.difference(&b).members, &[1, 3, 4]);
        assert_eq!(b.translate_ranks(&[0, 1, 2], &c).unwrap(), vec![None, None, None]);
        assert_eq!(a.translate_ranks(&[4, 1, 0], &c).unwrap(), vec![Some(0), Some(1), None]);
        assert_eq!(b.size(), 3);
    }

    #[test]
    fn bad_ranks_are_errors() {
        let a = g(&[0, 1, 2], 0);
        assert_eq!(a.incl(&[3]), Err(Error::RankOutOfRange { rank: 3, size: 3 }));
        assert!(matches!(a.incl(&[1, 1]), Err(Error::InvalidArgument(_))));
        assert!(matches!(a.excl(&[0, 0]), Err(Error::InvalidArgument(_))));
        assert!(matches!(a.range_incl(&[(0, 2, 0)]), Err(Error::InvalidArgument(_))));
        assert!(matches!(a.range_incl(&[(2, 0, 1)]), Err(Error::InvalidArgument(_))));
        assert_eq!(a.range_incl(&[(0, 3, 1)]), Err(Error::RankOutOfRange { rank: 3, size: 3 }));
        assert_eq!(a.translate_ranks(&[7], &a), Err(Error::RankOutOfRange { rank: 7, size: 3 }));
    }
}
