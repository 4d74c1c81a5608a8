//! Helpers of the `weft-bench` integration tests.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs `weft-bench` with `args`; `None` if it was still running after `limit` (then killed).
pub fn run_within(args: &[&str], limit: Duration) -> Option<Output> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_weft-bench"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start weft-bench");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("poll weft-bench").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(child.wait_with_output().expect("weft-bench output"))
}
