//! Nonblocking collectives in flight: each is a schedule of point-to-point steps
//! (`crate::nbc` builds them), advanced by the progress passes of any thread of the rank, as
//! MPICH advances its NBC schedules from its progress engine.
//!
//! A schedule is advanced outside every lock of the rank (it posts sends and receives, which
//! take CRI and matching locks), at the end of a pass, never inside one: the pass functions
//! call [`Engine::advance_schedules`] after they released their locks. Only one thread at a
//! time advances the rank's schedules (it takes the whole list out of its mutex, a leaf
//! lock, and puts back what is unfinished), so a schedule needs no lock of its own; a pass
//! nested in an advance (a send that waits for room in a full inbox) does not advance
//! again.

use std::cell::Cell;

use parking_lot::Mutex;

use super::Engine;
use crate::loom::sync::atomic::{AtomicUsize, Ordering};

/// One collective in flight.
pub(crate) trait Schedule: Send {
    /// Takes every step it can without blocking; `true` once it has finished (and completed
    /// its request).
    fn advance(&mut self) -> bool;
}

/// The rank's schedules in flight.
pub(crate) struct Schedules {
    /// Unfinished schedules not being advanced right now.
    list: Mutex<Vec<Box<dyn Schedule>>>,
    /// How many schedules are in flight (relaxed: a pass skips the list while it is 0; a
    /// schedule is advanced once by the thread that starts it, so none waits on a stale 0).
    count: AtomicUsize,
}

impl Schedules {
    pub(crate) fn new() -> Self {
        Schedules { list: Mutex::new(Vec::new()), count: AtomicUsize::new(0) }
    }
}

thread_local! {
    /// Whether this thread is advancing schedules (a nested pass leaves them alone).
    static ADVANCING: Cell<bool> = const { Cell::new(false) };
}

/// Clears [`ADVANCING`] when dropped (also on unwinding).
struct Advancing;

impl Advancing {
    fn enter() -> Option<Advancing> {
        ADVANCING.with(|a| (!a.replace(true)).then_some(Advancing))
    }
}

impl Drop for Advancing {
    fn drop(&mut self) {
        ADVANCING.with(|a| a.set(false));
    }
}

impl Engine {
    /// Advances `s` once and, unless it finished, keeps it for the passes to advance.
    pub(crate) fn start_schedule(&self, mut s: Box<dyn Schedule>) {
        let finished = {
            let _guard = Advancing::enter();
            s.advance()
        };
        if !finished {
            self.schedules.count.fetch_add(1, Ordering::Relaxed);
            self.schedules.list.lock().push(s);
        }
    }

    /// Advances every schedule in flight that no other thread is advancing; returns how many
    /// finished. Called by the progress passes with no lock of the rank held.
    pub(crate) fn advance_schedules(&self) -> usize {
        if self.schedules.count.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let Some(_guard) = Advancing::enter() else { return 0 };
        let mut mine = std::mem::take(&mut *self.schedules.list.lock());
        let before = mine.len();
        mine.retain_mut(|s| !s.advance());
        let finished = before - mine.len();
        if finished > 0 {
            self.schedules.count.fetch_sub(finished, Ordering::Relaxed);
        }
        if !mine.is_empty() {
            self.schedules.list.lock().append(&mut mine);
        }
        finished
    }

    /// Drops the schedules in flight (their requests are failed by their own drop): they
    /// hold the rank's state through their communicators, so a rank whose last handle goes
    /// with collectives unfinished would otherwise never be dropped.
    pub(crate) fn drop_schedules(&self) {
        let gone = std::mem::take(&mut *self.schedules.list.lock());
        self.schedules.count.fetch_sub(gone.len(), Ordering::Relaxed);
        drop(gone);
    }
}
