//! Callbacks completed inside a progress pass, run once the pass has let go of its locks.
//!
//! A pass completes operations while it holds a CRI's lock (and, in `Global` mode, the
//! progress lock). A continuation's callback [Schuchart 2021] run there would hold those
//! locks through the user's code: threads that want the CRI meanwhile skip it or wait for
//! it, and a callback that posts a send on that CRI (or, in `Global` mode, posts anything)
//! would wait for a lock its own thread holds. So within a pass ([`pass`]) a callback is not
//! run but linked into the thread's list of deferred callbacks ([`defer`]), through a
//! [`Node`] in its own storage (the continuation's record): no allocation and no bound. The
//! outermost pass of the thread runs the list, in completion order, after its locks are
//! released; a callback run there may itself progress, post and complete (a pass it enters
//! runs what it defers, and what is left of the list, before it returns).

use std::cell::Cell;
use std::ptr::NonNull;

/// The link of a deferred callback, at the start of the storage that holds it.
pub(crate) struct Node {
    /// The callback deferred after this one.
    next: Option<NonNull<Node>>,
    /// Runs the callback this node heads, and frees or recycles its storage.
    run: unsafe fn(NonNull<Node>),
}

impl Node {
    /// A node that runs `run` (with the node itself) when its turn comes.
    pub(crate) fn new(run: unsafe fn(NonNull<Node>)) -> Self {
        Node { next: None, run }
    }
}

/// A thread's passes in progress and its deferred callbacks, oldest first.
struct Deferred {
    /// Passes entered and not yet left (nested: a pass inside a pass, a wait in a callback).
    depth: Cell<usize>,
    head: Cell<Option<NonNull<Node>>>,
    tail: Cell<Option<NonNull<Node>>>,
}

impl Deferred {
    /// The oldest deferred callback, unlinked.
    fn pop(&self) -> Option<NonNull<Node>> {
        let node = self.head.get()?;
        // SAFETY: a linked node is live until it is popped and run (the contract of `defer`).
        let next = unsafe { node.as_ref().next };
        self.head.set(next);
        if next.is_none() {
            self.tail.set(None);
        }
        Some(node)
    }
}

impl Drop for Deferred {
    fn drop(&mut self) {
        // A thread that ends with callbacks deferred (a pass unwound) runs them: each counts
        // its continuation down and gives its storage back.
        while let Some(node) = self.pop() {
            // SAFETY: as in `run_deferred`.
            unsafe { (node.as_ref().run)(node) };
        }
    }
}

thread_local! {
    static DEFERRED: Deferred = const { Deferred { depth: Cell::new(0), head: Cell::new(None), tail: Cell::new(None) } };
}

/// Runs `f`, a progress pass (which may take locks), with the callbacks completed in it
/// deferred until it returned: if this is the thread's outermost pass, they run then, with
/// no lock of the pass held; a nested pass leaves them to the outermost.
#[inline]
pub(crate) fn pass<R>(f: impl FnOnce() -> R) -> R {
    /// Leaves the pass, also when `f` unwinds (the callbacks then wait for the next pass).
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            let _ = DEFERRED.try_with(|d| d.depth.set(d.depth.get() - 1));
        }
    }
    let Ok(outer) = DEFERRED.try_with(|d| d.depth.replace(d.depth.get() + 1)) else {
        // A thread being torn down: nothing is deferred.
        return f();
    };
    let leave = Leave;
    let r = f();
    drop(leave);
    if outer == 0 {
        run_deferred();
    }
    r
}

/// If the calling thread is inside a pass, links `node` behind its deferred callbacks (the
/// outermost pass runs it) and returns `true`; else `false`, and the caller runs it.
///
/// # Safety
/// Deferred, `node` heads storage that stays live, and is touched by nobody else, until its
/// `run` is called (once).
#[inline]
pub(crate) unsafe fn defer(node: NonNull<Node>) -> bool {
    DEFERRED
        .try_with(|d| {
            if d.depth.get() == 0 {
                return false;
            }
            match d.tail.get() {
                // SAFETY: the tail is a live linked node (contract), touched by this thread
                // only.
                Some(tail) => unsafe { (*tail.as_ptr()).next = Some(node) },
                None => d.head.set(Some(node)),
            }
            d.tail.set(Some(node));
            true
        })
        .unwrap_or(false)
}

/// Whether the calling thread has callbacks deferred, waiting for its outermost pass to
/// end: a pass that handles a long batch of frames ends the batch early on this, so that
/// they run after a chunk of it rather than after all of it (`engine/frames.rs`).
#[inline]
pub(crate) fn waiting() -> bool {
    DEFERRED.try_with(|d| d.head.get().is_some()).unwrap_or(false)
}

/// Whether the calling thread is inside a pass, for the assertions of the paths that must be
/// (a thread being torn down, whose passes cannot defer, answers `true`).
pub(crate) fn inside_pass() -> bool {
    DEFERRED.try_with(|d| d.depth.get() > 0).unwrap_or(true)
}

/// Runs the thread's deferred callbacks, oldest first, until none is left (those that the
/// callbacks defer in turn included).
#[inline(never)]
fn run_deferred() {
    while let Some(node) = DEFERRED.try_with(Deferred::pop).ok().flatten() {
        // SAFETY: popped: linked by `defer`, whose contract keeps it live for this one run;
        // no borrow of the list is held while the callback runs.
        unsafe { (node.as_ref().run)(node) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    thread_local! {
        /// What the test callbacks ran, in order.
        static RAN: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    }

    /// A test callback: logs its number; the first (number 0) defers number 100 in turn,
    /// from inside a pass of its own.
    #[repr(C)]
    struct Logged {
        node: Node,
        n: u32,
    }

    /// Defers callback `n` if inside a pass, else runs it now.
    fn complete(n: u32) {
        let node = NonNull::from(Box::leak(Box::new(Logged { node: Node::new(run), n }))).cast::<Node>();
        // SAFETY: a leaked box, freed by `run` once.
        if !unsafe { defer(node) } {
            // SAFETY: as above, not deferred: run here, once.
            unsafe { run(node) };
        }
    }

    /// # Safety
    /// `node` heads a `Logged` leaked by `complete`, run once.
    unsafe fn run(node: NonNull<Node>) {
        // SAFETY: per the contract.
        let Logged { n, .. } = *unsafe { Box::from_raw(node.cast::<Logged>().as_ptr()) };
        RAN.with(|r| r.borrow_mut().push(n));
        if n == 0 {
            pass(|| complete(100));
        }
    }

    fn ran() -> Vec<u32> {
        RAN.with(|r| std::mem::take(&mut *r.borrow_mut()))
    }

    /// Callbacks completed in nested passes run once the outermost has returned, in
    /// completion order, with those they complete in passes of their own; outside a pass one
    /// runs at once.
    #[test]
    fn the_outermost_pass_runs_the_callbacks_in_order() {
        complete(7);
        assert_eq!(ran(), vec![7], "outside a pass: at once");
        let inside = pass(|| {
            complete(0);
            pass(|| complete(1));
            let nested = ran();
            complete(2);
            (nested, ran())
        });
        assert_eq!(inside, (vec![], vec![]), "nothing runs inside a pass");
        assert_eq!(ran(), vec![0, 1, 2, 100]);
        assert!(!inside_pass(), "every pass was left");
    }

    /// A pass that unwinds is left, and its callbacks run with the next pass.
    #[test]
    fn an_unwound_pass_leaves_its_callbacks_to_the_next() {
        let unwound = std::panic::catch_unwind(|| {
            pass(|| {
                complete(3);
                panic!("a pass unwinds");
            })
        });
        assert!(unwound.is_err());
        assert!(!inside_pass());
        assert_eq!(ran(), vec![]);
        pass(|| complete(4));
        assert_eq!(ran(), vec![3, 4]);
    }
}
