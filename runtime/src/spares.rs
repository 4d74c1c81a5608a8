//! Spare objects kept for reuse, so that a hot path allocates nothing in steady state: a
//! thread's own spares ([`Spares`], a thread-local), and a small process-wide queue
//! ([`SharedSpares`]) that takes a thread's extras past its limit and everything it holds
//! when it ends, and from which a thread whose own spares ran dry takes before allocating
//! ([Goodell 2010]: thread-local request pools). Where one thread makes objects and others
//! drop them, the droppers' spares would fill while the maker's ran dry: the queue carries
//! them across, [`BATCH`] at a time (one shared-queue operation per batch on either side,
//! instead of one per object: a receive completed by a thread that did not post it, say).
//! A thread keeps only as many as it has shown it takes: its limit starts at none and grows
//! by a batch each time it found its own spares empty, up to its `MAX`, so a thread that
//! only gives back (a progress thread completing the others' receives) hoards nothing and
//! hands all on. A thread's first batch becomes its spares, storage and all: a thread that
//! completes a request or two and ends (a waiting thread spawned for a round) allocates
//! nothing for them.
//!
//! Under loom the shared queue keeps nothing: an object made in one model execution must
//! not reach the next.

use std::cell::{Cell, RefCell};

/// Spares a thread hands to the others at once (module docs).
pub(crate) const BATCH: usize = 32;

/// Spares on their way between threads: at most [`BATCH`], in storage for [`BATCH`].
type Batch<T> = Vec<T>;

/// The shared queues of a [`SharedSpares`].
#[cfg(not(loom))]
struct Queues<T> {
    /// Batches of spares (full, but for those of threads that ended).
    batches: crossbeam_queue::ArrayQueue<Batch<T>>,
    /// Emptied batches (their storage), back to the threads that fill them.
    empties: crossbeam_queue::ArrayQueue<Batch<T>>,
}

/// The process-wide queue of spares of one kind (module docs), in batches; a `static`.
pub(crate) struct SharedSpares<T> {
    /// Made at the first use of either, together: a thread's first hand-off (a thread that
    /// ends, say) allocates nothing more than its first miss did.
    #[cfg(not(loom))]
    queues: std::sync::OnceLock<Queues<T>>,
    #[cfg_attr(loom, allow(dead_code))]
    max: usize,
    /// Holds no `T` (nothing is kept under loom), so the queue is a `static` for any `T`.
    #[cfg(loom)]
    _t: std::marker::PhantomData<fn(T) -> T>,
}

impl<T> SharedSpares<T> {
    /// A queue that keeps up to about `max` spares; beyond them the extras are freed.
    pub(crate) const fn new(max: usize) -> Self {
        SharedSpares {
            #[cfg(not(loom))]
            queues: std::sync::OnceLock::new(),
            max,
            #[cfg(loom)]
            _t: std::marker::PhantomData,
        }
    }

    #[cfg(not(loom))]
    fn queues(&self) -> &Queues<T> {
        self.queues.get_or_init(|| {
            let n = self.max.div_ceil(BATCH);
            Queues { batches: crossbeam_queue::ArrayQueue::new(n), empties: crossbeam_queue::ArrayQueue::new(n) }
        })
    }

    #[cfg(not(loom))]
    fn batches(&self) -> &crossbeam_queue::ArrayQueue<Batch<T>> {
        &self.queues().batches
    }

    #[cfg(not(loom))]
    fn empties(&self) -> &crossbeam_queue::ArrayQueue<Batch<T>> {
        &self.queues().empties
    }

    /// One spare of another thread, for a thread whose own spares are gone (being torn
    /// down): taken from a batch, whose rest goes back.
    #[inline(never)]
    pub(crate) fn take(&self) -> Option<T> {
        let mut batch = self.take_batch()?;
        let spare = batch.pop();
        if batch.is_empty() {
            self.give_empty(batch);
        } else {
            self.give_batch(batch);
        }
        spare
    }

    /// A batch of another thread's spares.
    #[inline(never)]
    fn take_batch(&self) -> Option<Batch<T>> {
        #[cfg(not(loom))]
        return self.batches().pop();
        #[cfg(loom)]
        None
    }

    /// Hands a batch to the other threads (freed, with its spares, if the queue is full).
    #[inline(never)]
    fn give_batch(&self, batch: Batch<T>) {
        #[cfg(not(loom))]
        let _ = self.batches().push(batch);
        #[cfg(loom)]
        drop(batch);
    }

    /// Storage for a batch: an emptied one, else new.
    #[inline(never)]
    fn take_empty(&self) -> Batch<T> {
        #[cfg(not(loom))]
        if let Some(b) = self.empties().pop() {
            return b;
        }
        Vec::with_capacity(BATCH)
    }

    /// Gives an emptied batch's storage back to the threads that fill them.
    #[inline(never)]
    fn give_empty(&self, batch: Batch<T>) {
        debug_assert!(batch.is_empty());
        #[cfg(not(loom))]
        let _ = self.empties().push(batch);
        #[cfg(loom)]
        drop(batch);
    }
}

/// A thread's spares of one kind, up to a limit (module docs); a thread-local. A thread
/// that ends hands them to its shared queue (a task runtime's short-lived threads would
/// otherwise take theirs with them).
pub(crate) struct Spares<T: 'static, const MAX: usize> {
    own: RefCell<Vec<T>>,
    /// How many spares this thread keeps (module docs): a batch more each time it found
    /// `own` empty, up to `MAX`.
    keeps: Cell<usize>,
    /// Spares on their way to the other threads, handed over when [`BATCH`] are here.
    out: RefCell<Batch<T>>,
    shared: &'static SharedSpares<T>,
}

impl<T, const MAX: usize> Spares<T, MAX> {
    /// Up to `MAX` spares of this thread; the extras go to `shared`.
    pub(crate) const fn new(shared: &'static SharedSpares<T>) -> Self {
        const { assert!(MAX >= BATCH, "a thread's spares take a whole batch") };
        Spares { own: RefCell::new(Vec::new()), keeps: Cell::new(0), out: RefCell::new(Vec::new()), shared }
    }

    /// One of this thread's spares, else of another thread's (a batch of them).
    #[inline(always)]
    pub(crate) fn take(&self) -> Option<T> {
        // The borrow ends before a refill borrows again.
        let own = self.own.borrow_mut().pop();
        own.or_else(|| self.refill())
    }

    /// The spares this thread keeps now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.own.borrow().len()
    }

    /// Takes a batch of another thread's spares into this thread's (empty) own, and one of
    /// them out. The thread ran out of its own: it keeps a batch more from now on.
    #[inline(never)]
    fn refill(&self) -> Option<T> {
        self.keeps.set((self.keeps.get() + BATCH).min(MAX));
        let mut batch = self.shared.take_batch()?;
        let spare = batch.pop();
        let mut own = self.own.borrow_mut();
        if own.capacity() == 0 {
            // The thread's first refill: the batch, storage and all, becomes its spares. A
            // thread that takes a few and ends (a waiting thread that completes a receive
            // or two) allocates nothing for them, and gives the batch back whole.
            *own = batch;
            return spare;
        }
        if own.capacity() < MAX {
            // Once per thread: room for every spare it keeps.
            let len = own.len();
            own.reserve_exact(MAX - len);
        }
        own.append(&mut batch);
        drop(own);
        self.shared.give_empty(batch);
        spare
    }

    /// Keeps `spare` for this thread, or hands it to the other threads when this thread
    /// has as many as it keeps (module docs).
    #[inline(always)]
    pub(crate) fn keep(&self, spare: T) {
        let mut own = self.own.borrow_mut();
        let len = own.len();
        if len < self.keeps.get() {
            if len == own.capacity() {
                // Once per thread (or once more, when its first refill's batch became its
                // spares): room for every spare it keeps.
                own.reserve_exact(MAX - len);
            }
            // SAFETY: `len < capacity`, so the slot is allocated and uninitialized; the
            // length then covers the value written. (`Vec::push` does the same, but its
            // call is not always inlined into a request's drop: 17 instructions a message.)
            unsafe { write_at(&mut own, len, spare) };
        } else {
            drop(own);
            self.hand_on(spare);
        }
    }

    /// Hands `spare` to the other threads, in this thread's next batch.
    #[inline(always)]
    fn hand_on(&self, spare: T) {
        let mut out = self.out.borrow_mut();
        if out.capacity() == 0 {
            *out = self.shared.take_empty();
        }
        let len = out.len();
        // SAFETY: a batch has room for `BATCH` (`take_empty`) and is handed over when full,
        // so `len < BATCH <= capacity`.
        unsafe { write_at(&mut out, len, spare) };
        if len + 1 == BATCH {
            self.shared.give_batch(std::mem::take(&mut *out));
        }
    }
}

/// Writes `value` at `len`, the end of `v`, and extends `v` over it.
///
/// # Safety
/// `len == v.len() < v.capacity()`.
#[inline(always)]
unsafe fn write_at<T>(v: &mut Vec<T>, len: usize, value: T) {
    debug_assert!(len == v.len() && len < v.capacity());
    // SAFETY: per the contract the slot is allocated and uninitialized; the length then
    // covers the value written.
    unsafe {
        v.as_mut_ptr().add(len).write(value);
        v.set_len(len + 1);
    }
}

impl<T, const MAX: usize> Drop for Spares<T, MAX> {
    fn drop(&mut self) {
        let out = std::mem::take(self.out.get_mut());
        if !out.is_empty() {
            self.shared.give_batch(out);
        }
        let own = self.own.get_mut();
        if own.capacity() == BATCH && !own.is_empty() {
            // A batch it took at its first refill and kept as its own (`refill`).
            self.shared.give_batch(std::mem::take(own));
        }
        while !own.is_empty() {
            let mut batch = self.shared.take_empty();
            batch.extend(own.drain(own.len().saturating_sub(BATCH)..));
            self.shared.give_batch(batch);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    static SHARED: SharedSpares<u32> = SharedSpares::new(256);

    /// A thread that only gives spares back keeps none of them: every one goes on to the
    /// threads that take, a batch at a time; once it took (and found none of its own), it
    /// keeps a batch, and another for each time it ran out, up to its limit.
    #[test]
    fn a_thread_keeps_only_what_it_took() {
        static GIVEN: SharedSpares<u32> = SharedSpares::new(16 * BATCH);
        thread_local! {
            static MINE: Spares<u32, { 4 * BATCH }> = const { Spares::new(&GIVEN) };
        }
        std::thread::spawn(|| {
            MINE.with(|s| {
                for i in 0..2 * BATCH as u32 {
                    s.keep(i);
                }
                assert_eq!(s.own.borrow().len(), 0, "a thread that never took kept spares");
                assert_eq!(GIVEN.batches().len(), 2, "what it gave back went on, in batches");
                // It takes: a batch of the others', then its own until they run out.
                assert!(s.take().is_some());
                assert_eq!(s.own.borrow().capacity(), BATCH, "a first refill allocates nothing: the batch is the storage");
                let taken: Vec<u32> = std::iter::from_fn(|| s.take()).take(BATCH).collect();
                assert_eq!(taken.len(), BATCH);
                assert_eq!(s.keeps.get(), 2 * BATCH, "two refills, a batch each");
                for i in 0..3 * BATCH as u32 {
                    s.keep(i);
                }
                assert_eq!(s.own.borrow().len(), 2 * BATCH, "it keeps what it showed it takes, no more");
            })
        })
        .join()
        .unwrap();
    }

    /// A thread past its limit hands its extras to the others a batch at a time (one
    /// shared-queue operation per [`BATCH`] spares, not one each), and a thread that ran dry
    /// takes a whole batch, which then serves it without the shared queue; what a thread
    /// holds when it ends goes to the shared queue, in batches too.
    #[test]
    fn extras_cross_between_threads_in_batches() {
        thread_local! {
            static MINE: Spares<u32, BATCH> = const { Spares::new(&SHARED) };
        }
        std::thread::spawn(|| {
            MINE.with(|s| {
                // A thread that takes: it keeps up to its limit.
                assert_eq!(s.take(), None);
                for i in 0..BATCH as u32 {
                    s.keep(i);
                }
                for i in 0..BATCH as u32 - 1 {
                    s.keep(100 + i);
                }
                assert_eq!(SHARED.batches().len(), 0, "a batch is handed over once full, not spare by spare");
                s.keep(200);
                assert_eq!(SHARED.batches().len(), 1);
            })
        })
        .join()
        .unwrap();
        let got = std::thread::spawn(|| {
            MINE.with(|s| {
                // The batch handed on, and the one the first thread left when it ended.
                assert_eq!(SHARED.batches().len(), 2);
                let got: Vec<u32> = std::iter::from_fn(|| s.take()).take(BATCH).collect();
                // The batch came whole: the queue was asked once. The thread had no spares
                // yet, so the batch, storage and all, became its own: nothing to give back.
                assert_eq!(SHARED.batches().len(), 1);
                assert_eq!(SHARED.empties().len(), 0, "a first batch's storage is kept");
                got
            })
        })
        .join()
        .unwrap();
        let mut want: Vec<u32> = (100..100 + BATCH as u32 - 1).chain([200]).collect();
        let mut got = got;
        got.sort_unstable();
        want.sort_unstable();
        assert_eq!(got, want);
        // The first thread's own spares went to the queue when it ended: a batch, from
        // which a thread without spares of its own takes one.
        assert!((0..BATCH as u32).contains(&SHARED.take().expect("a spare of the ended thread")));
    }
}
