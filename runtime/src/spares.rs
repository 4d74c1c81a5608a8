//! Spare objects kept for reuse, so that a hot path allocates nothing in steady state: a
//! thread's own spares ([`Spares`], a thread-local), and a small process-wide queue
//! ([`SharedSpares`]) that takes a thread's extras past its limit and everything it holds
//! when it ends, and from which a thread whose own spares ran dry takes before allocating
//! ([Goodell 2010]: thread-local request pools). Where one thread makes objects and others
//! drop them, the droppers' spares would fill while the maker's ran dry: the queue carries
//! them across.
//!
//! Under loom the shared queue keeps nothing: an object made in one model execution must
//! not reach the next.

use std::cell::RefCell;

/// The process-wide queue of spares of one kind (module docs); a `static`.
pub(crate) struct SharedSpares<T> {
    #[cfg(not(loom))]
    queue: std::sync::OnceLock<crossbeam_queue::ArrayQueue<T>>,
    #[cfg_attr(loom, allow(dead_code))]
    max: usize,
    /// Holds no `T` (nothing is kept under loom), so the queue is a `static` for any `T`.
    #[cfg(loom)]
    _t: std::marker::PhantomData<fn(T) -> T>,
}

impl<T> SharedSpares<T> {
    /// A queue that keeps up to `max` spares; beyond them the extras are freed.
    pub(crate) const fn new(max: usize) -> Self {
        SharedSpares {
            #[cfg(not(loom))]
            queue: std::sync::OnceLock::new(),
            max,
            #[cfg(loom)]
            _t: std::marker::PhantomData,
        }
    }

    #[cfg(not(loom))]
    fn queue(&self) -> &crossbeam_queue::ArrayQueue<T> {
        self.queue.get_or_init(|| crossbeam_queue::ArrayQueue::new(self.max))
    }

    /// A spare of another thread, if the queue has one.
    #[inline(never)]
    pub(crate) fn take(&self) -> Option<T> {
        #[cfg(not(loom))]
        return self.queue().pop();
        #[cfg(loom)]
        None
    }

    /// Hands a spare to the other threads (freed if the queue is full).
    #[inline(never)]
    pub(crate) fn give(&self, spare: T) {
        #[cfg(not(loom))]
        let _ = self.queue().push(spare);
        #[cfg(loom)]
        drop(spare);
    }
}

/// A thread's spares of one kind, up to a limit (module docs); a thread-local. A thread
/// that ends hands them to its shared queue (a task runtime's short-lived threads would
/// otherwise take theirs with them).
pub(crate) struct Spares<T: 'static, const MAX: usize> {
    own: RefCell<Vec<T>>,
    shared: &'static SharedSpares<T>,
}

impl<T, const MAX: usize> Spares<T, MAX> {
    /// Up to `MAX` spares of this thread; the extras go to `shared`.
    pub(crate) const fn new(shared: &'static SharedSpares<T>) -> Self {
        Spares { own: RefCell::new(Vec::new()), shared }
    }

    /// One of this thread's spares, else one of another thread's.
    #[inline(always)]
    pub(crate) fn take(&self) -> Option<T> {
        self.take_own().or_else(|| self.shared.take())
    }

    /// One of this thread's spares.
    #[inline(always)]
    pub(crate) fn take_own(&self) -> Option<T> {
        self.own.borrow_mut().pop()
    }

    /// Keeps `spare` for this thread, or hands it to the other threads when this thread
    /// has its limit.
    #[inline(always)]
    pub(crate) fn keep(&self, spare: T) {
        let mut own = self.own.borrow_mut();
        let len = own.len();
        if len < MAX {
            if len == own.capacity() {
                // Once per thread: room for every spare it keeps.
                own.reserve_exact(MAX - len);
            }
            // SAFETY: `len < capacity`, so the slot is allocated and uninitialized; the
            // length then covers the value written. (`Vec::push` does the same, but its
            // call is not always inlined into a request's drop: 17 instructions a message.)
            unsafe {
                own.as_mut_ptr().add(len).write(spare);
                own.set_len(len + 1);
            }
        } else {
            drop(own);
            self.shared.give(spare);
        }
    }
}

impl<T, const MAX: usize> Drop for Spares<T, MAX> {
    fn drop(&mut self) {
        for spare in self.own.get_mut().drain(..) {
            self.shared.give(spare);
        }
    }
}
