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
    /// `progressed`, that thread goes round again for what it completed); returns how many
    /// finished. Called by the progress passes with no lock of the rank held.
    pub(crate) fn advance_schedules(&self, progressed: bool) -> usize {
        if self.schedules.count.load(Ordering::Relaxed) == 0 {
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
