//! Communicator creation: `dup`, `split` and `create_group`, and the context id allocation
//! they share ([Dinan 2012]), which many threads of a rank may run at once, on overlapping
//! groups, without deadlock.
//!
//! Each rank keeps a mask of free context id pairs (`engine/ids.rs`). The members of the new
//! communicator reduce their masks with a bitwise AND over a *group allreduce* (recursive
//! doubling over the members, `coll.rs`) on the parent's collective context (so its traffic
//! never meets user messages, `Tag::Any` included), keyed by a tag (the user's for `create_group`, reserved negative ones for `dup` and `split`), and
//! take the first pair set in the result. Among the threads of one rank the mask is owned by
//! one thread at a time; a thread that does not own it contributes zeros, which fails the
//! attempt everywhere, and tries again. The thread with the lowest `<parent context id, tag>`
//! gets the mask first, so the highest-priority attempt always completes ([Dinan 2012,
//! Listing 1.1]).
//!
//! The first allreduce runs on the eager segment of the mask (its first
//! [`EAGER_PAIRS`] pairs) and is the synchronizing step that [Dinan 2012, §3.1] puts before the
//! loop: no thread holds the base mask while it waits for members that have not yet called
//! (the hold-and-wait of their Fig. 1). Uncontended, that one allreduce finds an id ([Dinan
//! 2012, Listing 1.2]); otherwise the loop over the base segment follows.
//!
//! The same allreduce carries, per pair, the highest generation each member has had in it
//! (the new communicator takes the maximum, so frames still in flight for an earlier one are
//! recognised as stale), the assertion bits (every member must pass the same), and whether
//! each member owned its mask (every member did and the AND is empty: the ids are used up).
//!
//! [`EAGER_PAIRS`]: crate::engine::ids::EAGER_PAIRS

use weft_sync::Error;

use crate::comm::{Assertions, Communicator};
use crate::engine::ids::{first_set, EAGER_PAIRS, MASK_WORDS, PAIRS};
use crate::engine::{MAX_GENERATIONS, SLOT_BITS};
use crate::group::Group;
use crate::loom::sync::atomic::Ordering;

/// Collective-context tag of `dup`'s allocation.
const TAG_DUP: i32 = -1;
/// Collective-context tag of `split`'s allocation.
const TAG_SPLIT: i32 = -2;
/// Collective-context tag of `split`'s exchange of colors and keys.
const TAG_SPLIT_EXCHANGE: i32 = -3;

/// Words of the eager segment.
const EAGER_WORDS: usize = EAGER_PAIRS / 32;

/// Words before the mask in an allocation's allreduce: whether the member owned its mask,
/// the assertion bits, their complement (all reduced with AND).
const HEAD: usize = 3;

/// What one allocation attempt reduces: `[owned, bits, !bits, mask words.., generations..]`.
fn reduce_alloc(a: &[u32], b: &[u32], words: usize) -> Vec<u32> {
    a.iter().zip(b).enumerate().map(|(i, (&x, &y))| if i < HEAD + words { x & y } else { x.max(y) }).collect()
}

impl Communicator {
    /// A context id for a new communicator of the world ranks `members` (which hold this
    /// rank), agreed with them over this communicator's collective context with `tag`
    /// ([Dinan 2012, Listing 1.1 with Listing 1.2 in place of its barrier]). The pair is
    /// taken from this rank's mask.
    fn allocate_context(&self, members: &[u32], tag: i32, assertions: Assertions) -> Result<u32, Error> {
        let s = &**self.engine();
        s.collect_retired(false);
        let bits = u32::from(assertions.allow_overtaking) | u32::from(assertions.no_any_tag) << 1;
        let key = (self.context_id(), tag);

        // The eager segment: the synchronizing step, and in the common case the only one.
        let (own, local) = {
            let mut ids = s.contexts.ids.lock();
            ids.allreduces += 1;
            if ids.eager_in_use || !s.config.eager_context_ids {
                (false, vec![0; EAGER_WORDS])
            } else {
                ids.eager_in_use = true;
                (true, ids.segment(0..EAGER_WORDS))
            }
        };
        let result = self.alloc_round(members, tag, own, bits, local, 0);
        let mut ids = s.contexts.ids.lock();
        if own {
            ids.eager_in_use = false;
        }
        let r = result?;
        if r[1] != bits || r[2] != !bits & 3 {
            return Err(Error::InvalidArgument("communicator creation: the ranks passed different assertions"));
        }
        if own {
            if let Some(p) = first_set(&r[HEAD..HEAD + EAGER_WORDS]) {
                ids.take(p);
                return Ok(r[HEAD + EAGER_WORDS + p] << SLOT_BITS | (2 * p) as u32);
            }
        }
        drop(ids);

        // The base segment ([Dinan 2012, Listing 1.1], its line 23 as §5 modifies it).
        let base = EAGER_WORDS..MASK_WORDS;
        loop {
            let (own, local) = {
                let mut ids = s.contexts.ids.lock();
                ids.allreduces += 1;
                if ids.lowest.map_or(true, |l| key < l) {
                    ids.lowest = Some(key);
                }
                if !ids.in_use && ids.lowest == Some(key) {
                    ids.in_use = true;
                    (true, ids.segment(base.clone()))
                } else {
                    (false, vec![0; base.len()])
                }
            };
            let result = self.alloc_round(members, tag, own, bits, local, EAGER_PAIRS);
            let mut ids = s.contexts.ids.lock();
            if own {
                ids.in_use = false;
            }
            let r = match result {
                Ok(r) => r,
                Err(e) => {
                    if ids.lowest == Some(key) {
                        ids.lowest = None;
                    }
                    return Err(e);
                }
            };
            if own {
                let words = base.len();
                if let Some(i) = first_set(&r[HEAD..HEAD + words]) {
                    let p = EAGER_PAIRS + i;
                    ids.take(p);
                    if ids.lowest == Some(key) {
                        ids.lowest = None;
                    }
                    return Ok(r[HEAD + words + i] << SLOT_BITS | (2 * p) as u32);
                }
                if r[0] == 1 {
                    // Every member owned its mask and no pair is free on all of them.
                    if ids.lowest == Some(key) {
                        ids.lowest = None;
                    }
                    return Err(Error::InvalidArgument("out of context ids: every id is taken by a communicator not freed on some member"));
                }
            }
            drop(ids);
            std::thread::yield_now();
        }
    }

    /// One allocation allreduce over the pairs from `first` covered by `local` (this rank's
    /// free bits there, or zeros if it does not own that part of the mask); returns the
    /// reduced `[owned, bits, !bits, mask.., generation per pair..]`.
    fn alloc_round(&self, members: &[u32], tag: i32, own: bool, bits: u32, mut local: Vec<u32>, first: usize) -> Result<Vec<u32>, Error> {
        let s = &**self.engine();
        let words = local.len();
        let mut gens = vec![0u32; words * 32];
        if own {
            for (i, g) in gens.iter_mut().enumerate() {
                let slot = 2 * (first + i);
                // Relaxed: written by this rank's own `install`s, which happened before.
                let gen =
                    s.contexts.generations[slot].load(Ordering::Relaxed).max(s.contexts.generations[slot + 1].load(Ordering::Relaxed));
                if gen >= MAX_GENERATIONS {
                    // Every generation of the pair used up: never free again.
                    local[i / 32] &= !(1 << (i % 32));
                }
                *g = gen;
            }
        }
        let mut value = Vec::with_capacity(HEAD + words + gens.len());
        value.extend([u32::from(own), bits, !bits & 3]);
        value.extend(local);
        value.extend(gens);
        debug_assert!(first + words * 32 <= PAIRS);
        self.reduce_over(members, tag, value, move |a, b| reduce_alloc(a, b, words))
    }

    /// The communicator of `group` (a subset of this one's, with this rank), with a context id
    /// agreed among all of this communicator's ranks (`dup`).
    pub(crate) fn create_with(&self, group: Group, assertions: Assertions) -> Result<Communicator, Error> {
        let members = self.group().world_ranks().clone();
        let context = self.allocate_context(&members, TAG_DUP, assertions)?;
        self.create_on(context, Ok(group), assertions)
    }

    /// The communicator of `group` on the freshly allocated `context`; if it cannot be
    /// made, the context's pair goes back to this rank's mask.
    fn create_on(&self, context: u32, group: Result<Group, Error>, assertions: Assertions) -> Result<Communicator, Error> {
        let made = group.and_then(|g| Communicator::create(self.engine(), context, g, assertions));
        if made.is_err() {
            self.engine().contexts.ids.lock().give_back(crate::engine::slot_of(context) / 2);
        }
        made
    }

    /// Splits the communicator by `color` (`MPI_Comm_split`; collective over every rank):
    /// the ranks that pass the same `Some(color)` form a new communicator, ordered by `key`
    /// and then by their rank here; a rank passing `None` (`MPI_UNDEFINED`) gets `None`. The
    /// new communicators inherit the assertions.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>, Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        let n = self.size() as usize;
        let members = self.group().world_ranks().clone();
        // Every rank writes its own `[present, color, key]`; OR gathers them everywhere.
        let mut mine = vec![0u32; 3 * n];
        let me = self.rank() as usize;
        if let Some(c) = color {
            mine[3 * me..3 * me + 3].copy_from_slice(&[1, c, key as u32]);
        }
        let all = self.reduce_over(&members, TAG_SPLIT_EXCHANGE, mine, |a, b| a.iter().zip(b).map(|(x, y)| x | y).collect())?;
        // One id for every color: the new groups are disjoint, and each holds this pair.
        let assertions = self.assertions();
        let context = self.allocate_context(&members, TAG_SPLIT, assertions)?;
        let Some(color) = color else {
            self.engine().contexts.ids.lock().give_back(crate::engine::slot_of(context) / 2);
            return Ok(None);
        };
        let mut same: Vec<(i32, u32)> =
            (0..n).filter(|&r| all[3 * r] == 1 && all[3 * r + 1] == color).map(|r| (all[3 * r + 2] as i32, r as u32)).collect();
        same.sort_unstable();
        let ranks: Vec<u32> = same.into_iter().map(|(_, r)| r).collect();
        self.create_on(context, self.group().incl(&ranks), assertions).map(Some)
    }

    /// A communicator of `group`'s members (`MPI_Comm_create_group`): collective over the
    /// group only, which every member passes alike, with a `tag` that tells apart creations
    /// running at once on this communicator (from different threads). Each of `group`'s
    /// members must be a rank of this communicator, and the caller one of them. The new
    /// communicator has no assertions.
    pub fn create_group(&self, group: &Group, tag: i32) -> Result<Communicator, Error> {
        if self.is_freed() {
            return Err(Error::CommFreed);
        }
        let max = self.engine().config.max_tag;
        if !(0..=max).contains(&tag) {
            return Err(Error::InvalidTag { tag, max });
        }
        if group.me() != self.world_of(self.rank()) {
            return Err(Error::InvalidArgument("create_group: a group of another runtime"));
        }
        if group.rank().is_none() {
            return Err(Error::InvalidArgument("create_group: the calling rank is not in the group"));
        }
        let mine = self.group();
        if group.world_ranks().iter().any(|w| !mine.world_ranks().contains(w)) {
            return Err(Error::InvalidArgument("create_group: a member of the group is not in the communicator"));
        }
        let context = self.allocate_context(group.world_ranks(), tag, Assertions::default())?;
        self.create_on(context, Ok(group.clone()), Assertions::default())
    }

    /// Group allreduces this rank ran in communicator creations so far (one per creation
    /// when the eager allocation succeeds, [Dinan 2012, Listing 1.2]).
    pub fn creation_allreduces(&self) -> u64 {
        self.engine().contexts.ids.lock().allreduces
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::engine::{slot_of, CommState};
    use crate::{Error, Runtime};

    /// A creation that fails after its context id was allocated (here: a slot of the pair
    /// found occupied) gives the pair back to the mask, and leaves neither of its contexts
    /// installed.
    #[test]
    fn a_creation_that_fails_after_allocation_gives_its_id_back() {
        let rt = Runtime::builder().env(false).build_local(1).unwrap().remove(0);
        let w = rt.world();
        let s = w.engine().clone();
        let next = w.dup().unwrap();
        let ctx = next.context_id();
        let pair = slot_of(ctx) / 2;
        next.free();
        // The pair is free again in the mask; occupy one of its slots behind the mask's back.
        for taken in [ctx, ctx + 1] {
            assert!(s.contexts.ids.lock().is_free(pair));
            let squatter = Arc::new(CommState::new(&s, taken, 1, false, false, false));
            s.install(squatter.clone()).unwrap();
            assert_eq!(w.dup().unwrap_err(), Error::InvalidArgument("context id already in use"));
            assert!(s.contexts.ids.lock().is_free(pair), "slot {taken} occupied: the pair was not given back");
            s.retire(&squatter);
            // Neither slot is left installed: a creation on the pair now succeeds.
            let again = w.dup().unwrap();
            assert_eq!(slot_of(again.context_id()) / 2, pair);
            again.free();
        }
    }
}
