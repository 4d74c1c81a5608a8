//! `ProgressMode::Global` ([Patinyasakdikul 2019, Alg. 1]): every pass under the one progress
//! lock, entered with low priority ([Amer 2019, §4.1]: posting threads go first).

use crate::engine::Engine;

impl Engine {
    /// Algorithm 1's critical section: everything under the progress lock, entered with
    /// low priority ([Amer 2019, §4.1]: posting threads go first).
    /// Collectives in flight are advanced after the lock is released (they post), and the
    /// callbacks the pass completed run then too (`deferred.rs`).
    pub(crate) fn progress_global(&self) -> usize {
        crate::deferred::pass(|| {
            let n = self.progress_lock.low(|_| {
                let n = self.progress_all();
                (n, n > 0)
            });
            n + self.advance_schedules(n > 0)
        })
    }
}
