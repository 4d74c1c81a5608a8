//! Helpers shared by the integration test binaries (each includes this with `mod common;`)
//! and the runtime's unit tests of faults (`src/rendezvous_faults.rs`, by `#[path]`).

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

/// Runs `scenario` on a thread of its own and returns its result, failing with `what` if
/// it takes longer than `secs`: a hang is reported as a failure instead of stopping the
/// suite (the stuck thread is left behind). A panic in the scenario is resumed here.
pub(crate) fn within<T: Send + 'static>(secs: u64, what: &str, scenario: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    let t = std::thread::spawn(move || {
        let _ = tx.send(scenario());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(RecvTimeoutError::Timeout) => panic!("hang: {what} (not done after {secs} s)"),
        Err(RecvTimeoutError::Disconnected) => match t.join() {
            Err(p) => std::panic::resume_unwind(p),
            Ok(()) => unreachable!("the scenario thread ended without a result or a panic"),
        },
    }
}
