//! Every live task of a pool, so shutdown can cancel the ones that sit in no queue (tokio's
//! `OwnedTasks` is the model).
//!
//! A task waiting for a wake is referenced only by its wakers, which may sit in the very
//! state the task keeps alive (a posted receive's waker in the rank's matching queues, the
//! rank's state held by the task's `Communicator`): a cycle nothing else breaks. Draining
//! the queues at shutdown never sees such a task, so its join handle would never resolve
//! and its future — with everything it owns — would leak. The registry holds one reference
//! to every task from spawn to completion; shutdown closes it and cancels what is left.
//! Tasks that never wait for a wake (a pool continuation's) are left out: they are always in
//! a run queue or running, where shutdown reaches them (`task.rs`, "Shutdown").
//!
//! The registry is touched on spawn and on completion only, never per poll: a slab per
//! shard behind a mutex, the shard chosen by the task's address, so workers completing
//! tasks at the same time rarely meet on one lock.

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use super::task::TaskRef;

/// A task's place in the registry: shard and slot, packed as `slot * shards + shard`.
pub(crate) type Key = usize;

/// A key no task has: the task was never registered (spawned after shutdown).
pub(super) const UNREGISTERED: Key = usize::MAX;

/// The live tasks of one pool.
pub(super) struct Registry {
    /// Slabs, one lock each.
    shards: Box<[CachePadded<Mutex<Shard>>]>,
}

/// One slab of tasks.
#[derive(Default)]
struct Shard {
    /// Registered tasks by slot; `None` is a free slot.
    slots: Vec<Option<TaskRef>>,
    /// Free slots, reused before the slab grows.
    free: Vec<usize>,
    /// Set at shutdown: registering fails, removing does nothing (the slots were emptied).
    closed: bool,
}

impl Registry {
    /// A registry for a pool of `workers` threads (a few shards per thread that may
    /// complete tasks, the waiting threads included).
    pub(super) fn new(workers: usize) -> Self {
        let n = ((workers + 1) * 2).next_power_of_two().min(64);
        Registry { shards: (0..n).map(|_| CachePadded::new(Mutex::new(Shard::default()))).collect() }
    }

    /// Registers `task` and tells it its key (`bind`, called under the shard's lock, before
    /// anyone else can complete the task). Returns false if the pool has shut down: the
    /// caller cancels the task instead of queueing it.
    pub(super) fn insert(&self, task: &TaskRef) -> bool {
        let n = self.shards.len();
        // The allocation's address, past the bits every allocation shares (alignment).
        let shard = (std::sync::Arc::as_ptr(task).cast::<u8>() as usize >> 6) % n;
        let mut s = self.shards[shard].lock();
        if s.closed {
            return false;
        }
        let slot = match s.free.pop() {
            Some(i) => i,
            None => {
                s.slots.push(None);
                s.slots.len() - 1
            }
        };
        task.bind(slot * n + shard);
        s.slots[slot] = Some(task.clone());
        true
    }

    /// Forgets the task at `key` (it completed). Nothing happens after shutdown, which
    /// took every task out already.
    pub(super) fn remove(&self, key: Key) {
        if key == UNREGISTERED {
            return;
        }
        let n = self.shards.len();
        let (slot, shard) = (key / n, key % n);
        let removed = {
            let mut s = self.shards[shard].lock();
            if s.closed {
                return;
            }
            let t = s.slots[slot].take();
            debug_assert!(t.is_some(), "a task removed twice");
            s.free.push(slot);
            t
        };
        // Dropped outside the lock (the caller holds another reference, so this frees
        // nothing, but a lock is no place for a drop).
        drop(removed);
    }

    /// Closes the registry (later spawns are cancelled at once) and returns every task
    /// still registered, for the caller to cancel outside the locks.
    pub(super) fn close(&self) -> Vec<TaskRef> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let mut s = shard.lock();
            s.closed = true;
            all.extend(s.slots.drain(..).flatten());
            s.free = Vec::new();
        }
        all
    }
}
