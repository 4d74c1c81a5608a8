//! Hierarchical MCS (Chabbi, Fagan and Mellor-Crummey, PPoPP'15; [Amer 2019, §2.3] and refs
//! [11, 12]): one MCS queue per group of the memory hierarchy; the lock is passed between
//! neighbours (threads of the same leaf group) up to `threshold` times before it goes up a
//! level, which amortizes the expensive remote hand-offs.
//!
//! Levels come from [`Topology`] (hwloc or sysfs, see there). A thread enters at the leaf of the CPU it
//! runs on when it calls `lock` (or of the CPU given by [`McsNode::with_cpu`]); the node
//! remembers the leaf for `unlock`, so a thread migrating while it holds the lock is fine.
//!
//! # State words
//!
//! Each group (tree node) holds a `tail` (as [`super::Mcs`]) and a `qnode`, the group's own
//! node in its parent's queue. The `status` of a queued node:
//!
//! | `status` | meaning |
//! |---|---|
//! | `WAIT` (`u64::MAX`) | queued, waiting |
//! | `ACQUIRE_PARENT` (`u64::MAX - 1`) | lock of this level passed, but the parent was released: acquire it |
//! | `1..=threshold` | lock passed within the level; the value counts the hand-offs of this cohort |
//!
//! Invariant: the holder's leaf group and every ancestor up to the root are held, each by the
//! `qnode` of the group below (the leaf by the holder's own node).
//!
//! # Memory ordering
//!
//! Every level is an MCS queue and uses the orderings of [`super::Mcs`] (`swap(AcqRel)`,
//! `next` Release/Acquire, hand-off `status` Release/Acquire, emptying CAS Release). A thread
//! handed `ACQUIRE_PARENT` synchronizes with the releaser's Release store, which came after
//! the releaser finished releasing the parent with the group's `qnode`; so the `qnode` is free
//! when the new head reuses it.

use std::pin::Pin;
use std::ptr;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::mcs::{QNode, ACQUIRE_PARENT, COHORT_START, WAIT};
use super::topology::{current_cpu, Topology};
use super::{RawLock, RawTimedLock};
use crate::lock::McsNode;
use crate::loom::sync::atomic::{AtomicPtr, Ordering};

/// Default number of hand-offs within a level before passing the lock up ([Amer 2019, §2.3]:
/// the knob trading locality for fairness). The runtime's path locks take
/// `WEFT_LOCK_HMCS_THRESHOLD` instead when it is set ([`super::LockOptions::apply_env`]).
pub const DEFAULT_HMCS_THRESHOLD: u64 = 64;

/// Marks the root in `HNode::parent`.
const ROOT: usize = usize::MAX;

/// One group of the hierarchy.
#[derive(Debug)]
struct HNode {
    /// Last node queued at this group, null when free.
    tail: AtomicPtr<QNode>,
    /// Index of the parent group, [`ROOT`] for the root.
    parent: usize,
    /// This group's node in the parent's queue (unused at the root).
    qnode: QNode,
}

/// Hierarchical MCS lock. Node: [`McsNode`].
#[derive(Debug)]
pub struct Hmcs {
    /// All groups, leaves first, root last; each on its own cache line. Boxed: nodes of
    /// other threads point into it while queued, and it never moves.
    groups: Box<[CachePadded<HNode>]>,
    /// Leaf group index per CPU id.
    leaf_of_cpu: Box<[usize]>,
    /// Hand-offs within a level before going up (`1..=2^32`).
    threshold: u64,
}

impl Default for Hmcs {
    fn default() -> Self {
        Hmcs::new()
    }
}

impl Hmcs {
    /// A lock over this machine's topology ([`Topology::detect`]) with
    /// [`DEFAULT_HMCS_THRESHOLD`].
    pub fn new() -> Self {
        Hmcs::with_topology(&Topology::detect(), DEFAULT_HMCS_THRESHOLD)
    }

    /// A lock over `topo`, passing the lock at most `threshold` times within a level before
    /// releasing the level above (clamped to `1..=2^32`; 1 makes every level FIFO).
    pub fn with_topology(topo: &Topology, threshold: u64) -> Self {
        let depth = topo.depth();
        // Index of the first group of each level.
        let mut base = Vec::with_capacity(depth);
        let mut n = 0;
        for l in 0..depth {
            base.push(n);
            n += topo.groups(l);
        }
        let mut parent = vec![ROOT; n];
        for cpu in 0..topo.cpus() {
            for l in 0..depth - 1 {
                parent[base[l] + topo.group_of(l, cpu)] = base[l + 1] + topo.group_of(l + 1, cpu);
            }
        }
        let groups = parent
            .into_iter()
            .map(|p| CachePadded::new(HNode { tail: AtomicPtr::new(ptr::null_mut()), parent: p, qnode: QNode::new() }))
            .collect();
        let leaf_of_cpu = (0..topo.cpus()).map(|c| base[0] + topo.group_of(0, c)).collect();
        Hmcs { groups, leaf_of_cpu, threshold: threshold.clamp(1, 1 << 32) }
    }

    /// Number of levels, root included.
    pub fn depth(&self) -> usize {
        let mut d = 1;
        let mut g = self.leaf_of_cpu[0];
        while self.groups[g].parent != ROOT {
            g = self.groups[g].parent;
            d += 1;
        }
        d
    }

    /// The hand-off threshold per level.
    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    #[inline]
    fn leaf_for(&self, node: &McsNode) -> usize {
        let cpu = match node.cpu.get() {
            usize::MAX => current_cpu(),
            c => c,
        };
        self.leaf_of_cpu[cpu % self.leaf_of_cpu.len()]
    }

    #[inline]
    fn init(q: &QNode) {
        q.next.store(ptr::null_mut(), Ordering::Relaxed);
        q.status.store(WAIT, Ordering::Relaxed);
    }

    /// Acquires group `g` with `q` (and its ancestors unless handed the lock in-cohort).
    fn acquire(&self, g: usize, q: &QNode) {
        let h = &self.groups[g];
        Self::init(q);
        // AcqRel: as `Mcs::lock` (publish `q`; sync with an emptying release).
        let pred = h.tail.swap(q.as_ptr(), Ordering::AcqRel);
        if !pred.is_null() {
            // SAFETY: `pred` came from the swap that enqueued our initialized `q`.
            let s = unsafe { q.link_and_wait(pred) };
            if h.parent == ROOT || s < ACQUIRE_PARENT {
                // Root: plain MCS hand-off. Otherwise passed within the cohort: the
                // ancestors are still held by this group's `qnode`.
                return;
            }
        } else if h.parent == ROOT {
            return;
        }
        // First of a cohort (empty queue, or told to acquire the parent).
        q.status.store(COHORT_START, Ordering::Relaxed);
        self.acquire(h.parent, &h.qnode);
    }

    /// Tries to acquire group `g` and all ancestors without waiting; undoes on failure.
    fn try_acquire(&self, g: usize, q: &QNode) -> bool {
        let h = &self.groups[g];
        if !h.tail.load(Ordering::Relaxed).is_null() {
            return false;
        }
        Self::init(q);
        // AcqRel: as the swap in `acquire`.
        if h.tail.compare_exchange(ptr::null_mut(), q.as_ptr(), Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return false;
        }
        if h.parent == ROOT {
            return true;
        }
        q.status.store(COHORT_START, Ordering::Relaxed);
        if self.try_acquire(h.parent, &h.qnode) {
            return true;
        }
        // We head this level but could not get the parent: whoever queued behind us must
        // acquire the parent itself.
        // SAFETY: `q` heads the queue of `h.tail` (our CAS succeeded).
        unsafe { q.release_to(&h.tail, ACQUIRE_PARENT) };
        false
    }

    /// Releases group `g` held by `q` (and ancestors when the cohort ends).
    ///
    /// # Safety
    ///
    /// `q` heads the queue of group `g` and the invariant of the module docs holds.
    unsafe fn release(&self, g: usize, q: &QNode) {
        let h = &self.groups[g];
        if h.parent == ROOT {
            // SAFETY: `q` heads the root queue (caller contract).
            unsafe { q.release_to(&h.tail, COHORT_START) };
            return;
        }
        // Relaxed: our own node's status, written by us or read with Acquire when handed.
        let cur = q.status.load(Ordering::Relaxed);
        if cur < self.threshold {
            // Acquire: as in `QNode::release_to`.
            let succ = q.next.load(Ordering::Acquire);
            if !succ.is_null() {
                // SAFETY: a linked successor waits for this store and cannot leave before it.
                // Release: hand over the critical section, ancestors stay held.
                unsafe { &*succ }.status.store(cur + 1, Ordering::Release);
                return;
            }
        }
        // SAFETY: by the invariant, `h.qnode` heads the parent's queue.
        unsafe { self.release(h.parent, &h.qnode) };
        // SAFETY: `q` heads this group's queue (caller contract).
        unsafe { q.release_to(&h.tail, ACQUIRE_PARENT) };
    }
}

// SAFETY: every level is an MCS queue (one head at a time); the holder of the whole lock is the
// head of its leaf whose ancestors are held by their groups' `qnode`s (module invariant), so
// two threads can hold the lock only if two heads existed in one queue. In-cohort hand-off
// transfers the held ancestors with the leaf. Orderings as `Mcs`. The caller's node is not
// touched after `busy` is cleared in `unlock`.
unsafe impl RawLock for Hmcs {
    type Node = McsNode;

    #[inline]
    fn lock(&self, node: Pin<&McsNode>) {
        let n = node.get_ref();
        super::claim(&n.busy);
        let leaf = self.leaf_for(n);
        n.leaf.set(leaf);
        self.acquire(leaf, &n.q);
    }

    #[inline]
    fn try_lock(&self, node: Pin<&McsNode>) -> bool {
        let n = node.get_ref();
        super::claim(&n.busy);
        let leaf = self.leaf_for(n);
        n.leaf.set(leaf);
        let ok = self.try_acquire(leaf, &n.q);
        if !ok {
            n.busy.set(false);
        }
        ok
    }

    #[inline]
    unsafe fn unlock(&self, node: Pin<&McsNode>) {
        let n = node.get_ref();
        // SAFETY: the caller holds the lock with `node` (trait contract), entered at `n.leaf`.
        unsafe { self.release(n.leaf.get(), &n.q) };
        n.busy.set(false);
    }

    /// `false` only when a node is linked behind the holder's node or behind one of the
    /// `qnode`s its path holds: that waiter will be handed the lock (in-cohort or through the
    /// level above).
    fn no_waiters(&self, node: Pin<&McsNode>) -> bool {
        if !node.q.next.load(Ordering::Relaxed).is_null() {
            return false;
        }
        let mut g = node.leaf.get();
        while self.groups[g].parent != ROOT {
            if !self.groups[g].qnode.next.load(Ordering::Relaxed).is_null() {
                return false;
            }
            g = self.groups[g].parent;
        }
        true
    }
}

// SAFETY: polls `try_lock`, which acquires exactly as `lock` does.
unsafe impl RawTimedLock for Hmcs {
    fn try_lock_for(&self, node: Pin<&McsNode>, timeout: Duration) -> bool {
        super::poll_try_lock_for(self, node, timeout)
    }
}

super::flat_priority!(Hmcs);
