//! Nonblocking collectives in flight: each is a schedule of point-to-point steps
//! (`crate::nbc` builds them), advanced by the progress passes of any thread of the rank, as
//! MPICH advances its NBC schedules from its progress engine.
//!
//! A schedule is advanced outside every lock of the rank (it posts sends and receives, which
//! take CRI and matching locks), at the end of a pass, never inside one: the pass functions
//! call [`Engine::advance_schedules`] after they released their locks. One thread at a time
//! advances the rank's schedules (it takes the whole list out of its mutex, a leaf lock, and
//! puts back what is unfinished), so a schedule needs no lock of its own. A pass that ends
//! while another thread advances (or one nested in an advance: a send that waits for room in
//! a full inbox) may have completed a step of a schedule that thread polled already: it
//! asks that thread to go round again, under the same mutex the thread takes to finish, so
//! a completed step does not wait for a later pass (unless that thread has gone round
//! [`MAX_ROUNDS`] times: then the next pass to end takes it).

use parking_lot::Mutex;

use super::Engine;
use crate::loom::sync::atomic::{AtomicUsize, Ordering};

/// One collective in flight.
pub(crate) trait Schedule: Send {
    /// Takes every step it can without blocking; `true` once it has finished (and completed
    /// its request, unless [`finish`](Self::finish) does).
    fn advance(&mut self) -> bool;

    /// Called once after [`advance`](Self::advance) returned `true`, with no lock of the
    /// rank held: a schedule that is started again and again (a persistent collective,
    /// `crate::persistent_coll`) goes back to its owner here, so that no start allocates.
    fn finish(self: Box<Self>) {}
}

/// The rank's schedules in flight.
pub(crate) struct Schedules {
    state: Mutex<State>,
    /// How many schedules are in flight (relaxed: a pass skips the list while it is 0; a
    /// schedule is advanced once by the thread that starts it, so none waits on a stale 0).
    count: AtomicUsize,
}

/// What the schedules' mutex guards.
struct State {
    /// Unfinished schedules not being advanced right now.
    list: Vec<Box<dyn Schedule>>,
    /// A thread is advancing the schedules it took out.
    busy: bool,
    /// A pass ended while they were being advanced: poll them all once more.
    again: bool,
}

/// Rounds one call of [`Engine::advance_schedules`] makes at most.
const MAX_ROUNDS: u32 = 4;

/// An idle pass (one that handled no frame and sent nothing deferred) advances the
/// schedules only every this many idle passes of its thread: the steps' requests complete in
/// the passes that handle their frames (which advance the schedules at once, on whichever
/// thread), so an idle pass finds nothing to take, and taking the list out and putting it
/// back, and testing every schedule's requests, would cost a waiter's every pass about as
/// much as the pass itself. What completes a request outside a pass (a peer found lost)
/// waits a few idle passes more.
const IDLE_ADVANCE_EVERY: u32 = 8;

thread_local! {
    /// This thread's idle passes since its last one that advanced the schedules.
    static IDLE_SINCE_ADVANCE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether an idle pass of this thread advances the schedules ([`IDLE_ADVANCE_EVERY`]).
fn idle_turn() -> bool {
    IDLE_SINCE_ADVANCE
        .try_with(|c| {
            let v = c.get() + 1;
            let turn = v >= IDLE_ADVANCE_EVERY;
            c.set(if turn { 0 } else { v });
            turn
        })
        .unwrap_or(true)
}

impl Schedules {
    pub(crate) fn new() -> Self {
        Schedules { state: Mutex::new(State { list: Vec::new(), busy: false, again: false }), count: AtomicUsize::new(0) }
    }
}

impl Engine {
    /// Advances `s` once and, unless it finished, keeps it for the passes to advance.
    pub(crate) fn start_schedule(&self, mut s: Box<dyn Schedule>) {
        if s.advance() {
            s.finish();
        } else {
            self.schedules.count.fetch_add(1, Ordering::Relaxed);
            self.schedules.state.lock().list.push(s);
        }
    }

    /// Advances every schedule in flight, unless another thread is (then, if this pass
    /// `progressed`, that thread goes round again for what it completed), or this pass did
    /// not progress and it is not its thread's turn ([`IDLE_ADVANCE_EVERY`]); returns how
    /// many finished. Called by the progress passes with no lock of the rank held.
    pub(crate) fn advance_schedules(&self, progressed: bool) -> usize {
        if self.schedules.count.load(Ordering::Relaxed) == 0 || (!progressed && !idle_turn()) {
            return 0;
        }
        let mut mine = {
            let mut st = self.schedules.state.lock();
            if st.busy {
                st.again |= progressed;
                return 0;
            }
            st.busy = true;
            std::mem::take(&mut st.list)
        };
        let mut finished = 0;
        for round in 1.. {
            let mut i = 0;
            while i < mine.len() {
                if mine[i].advance() {
                    mine.remove(i).finish();
                    finished += 1;
                } else {
                    i += 1;
                }
            }
            let mut st = self.schedules.state.lock();
            // Those started meanwhile join the next round, or the list.
            mine.append(&mut st.list);
            // Bounded: passes of other threads that keep progressing do not keep this one
            // here; the next pass to end polls what is left.
            if round < MAX_ROUNDS && std::mem::take(&mut st.again) {
                continue;
            }
            st.list = mine;
            st.busy = false;
            break;
        }
        if finished > 0 {
            self.schedules.count.fetch_sub(finished, Ordering::Relaxed);
        }
        finished
    }

    /// Drops the schedules in flight (their requests fail): they hold the rank's state
    /// through their communicators, so a rank whose last handle goes with collectives
    /// unfinished would otherwise never be dropped.
    pub(crate) fn drop_schedules(&self) {
        let gone = std::mem::take(&mut self.schedules.state.lock().list);
        self.schedules.count.fetch_sub(gone.len(), Ordering::Relaxed);
        drop(gone);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::Arc;

    use super::{Schedule, IDLE_ADVANCE_EVERY};
    use crate::Runtime;

    /// A schedule that counts its advances and finishes once told.
    struct Counting {
        advances: Arc<AtomicU32>,
        done: Arc<AtomicBool>,
    }

    impl Schedule for Counting {
        fn advance(&mut self) -> bool {
            self.advances.fetch_add(1, Ordering::Relaxed);
            self.done.load(Ordering::Relaxed)
        }
    }

    /// Progress passes that find nothing to do advance a schedule in flight only every
    /// `IDLE_ADVANCE_EVERY`th time, not at every pass; it still finishes.
    #[test]
    fn idle_passes_leave_the_schedules_mostly_alone() {
        let rts = Runtime::builder().env(false).build_local(1).unwrap();
        let engine = rts[0].world().engine();
        let (advances, done) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicBool::new(false)));
        engine.start_schedule(Box::new(Counting { advances: advances.clone(), done: done.clone() }));
        assert_eq!(advances.load(Ordering::Relaxed), 1, "advanced once as it starts");
        let passes = 8 * IDLE_ADVANCE_EVERY;
        for _ in 0..passes {
            assert!(!engine.progress_once().progressed());
        }
        let idle = advances.load(Ordering::Relaxed) - 1;
        assert!((passes / IDLE_ADVANCE_EVERY - 1..=passes / IDLE_ADVANCE_EVERY).contains(&idle), "{idle} advances in {passes} idle passes");
        done.store(true, Ordering::Relaxed);
        for _ in 0..2 * IDLE_ADVANCE_EVERY {
            let _ = engine.progress_once();
        }
        assert_eq!(engine.schedules.count.load(Ordering::Relaxed), 0, "the schedule finished");
    }
}
