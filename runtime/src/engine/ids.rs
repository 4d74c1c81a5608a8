//! The rank's mask of free context ids and the variables its threads share to allocate from
//! it ([Dinan 2012, Listing 1.1 and 1.2]); the allocation itself, which reduces the mask
//! over a communicator's ranks, is `crate::create`.
//!
//! An id here is a *pair*: pair `p` is the user context slot `2p` and the collective slot
//! `2p + 1` of one communicator. The first [`EAGER_PAIRS`] pairs form the eager segment
//! (Listing 1.2), the rest the base segment (Listing 1.1, line 23 as modified).

use super::contexts::MAX_CONTEXTS;

/// Context id pairs of the table.
pub(crate) const PAIRS: usize = MAX_CONTEXTS / 2;

/// Pairs reserved for eager allocation ([Dinan 2012, §5]: a static split, the first `n`
/// ids).
pub(crate) const EAGER_PAIRS: usize = 64;

/// `u32` words of a mask over `PAIRS` pairs.
pub(crate) const MASK_WORDS: usize = PAIRS / 32;

/// The shared variables of [Dinan 2012, Listing 1.1 and 1.2] for one rank, under one mutex.
pub(crate) struct IdMask {
    /// Bit `p` set: pair `p` is free on this rank.
    free: [u32; MASK_WORDS],
    /// A thread holds the base segment (`mask_in_use`).
    pub(crate) in_use: bool,
    /// A thread holds the eager segment (`eager_mask_in_use`).
    pub(crate) eager_in_use: bool,
    /// The highest priority among the threads in the base loop: the lowest
    /// `<parent context id, tag>` (`lowest_ctx_id`, `lowest_tag`).
    pub(crate) lowest: Option<(u32, i32)>,
    /// Group allreduces this rank's allocations ran (diagnostics, `weft-bench ctxid`).
    pub(crate) allreduces: u64,
}

impl IdMask {
    /// Every pair free but pair 0 (the world's).
    pub(crate) fn new() -> Self {
        let mut free = [u32::MAX; MASK_WORDS];
        free[0] &= !1;
        IdMask { free, in_use: false, eager_in_use: false, lowest: None, allreduces: 0 }
    }

    /// The free bits of the pairs `range` (word aligned), as words.
    pub(crate) fn segment(&self, words: std::ops::Range<usize>) -> Vec<u32> {
        self.free[words].to_vec()
    }

    /// Whether pair `p` is free here.
    pub(crate) fn is_free(&self, p: usize) -> bool {
        self.free[p / 32] & (1 << (p % 32)) != 0
    }

    /// Takes pair `p` (it was free here).
    pub(crate) fn take(&mut self, p: usize) {
        debug_assert!(self.is_free(p), "context id pair {p} taken twice");
        self.free[p / 32] &= !(1 << (p % 32));
    }

    /// Gives pair `p` back (its communicator was freed here).
    pub(crate) fn give_back(&mut self, p: usize) {
        self.free[p / 32] |= 1 << (p % 32);
    }
}

/// The first set bit of `words`, counted from bit 0 of word 0.
pub(crate) fn first_set(words: &[u32]) -> Option<usize> {
    words.iter().enumerate().find(|(_, w)| **w != 0).map(|(i, w)| i * 32 + w.trailing_zeros() as usize)
}
