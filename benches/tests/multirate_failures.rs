//! A worker that fails ends a `weft-bench multirate` run with its error and status 2,
//! instead of leaving the other workers (and the coordinator) waiting for it forever.

use std::time::Duration;

mod common;
use common::run_within;

/// A sender and a receiver failing at their first measured iteration, in thread and process
/// mode: their partners are then waiting inside weft for messages that never come, and the
/// coordinator at the end barrier. With `-t 2` the workers are senders 0 and 1, then
/// receivers 0 and 1.
#[test]
fn a_failing_worker_ends_the_run_with_its_error() {
    for (mode, worker, role) in [("thread", 0, "sender 0"), ("thread", 3, "receiver 1"), ("process", 2, "receiver 0")] {
        let w = worker.to_string();
        let args = ["multirate", "--mode", mode, "-t", "2", "-i", "20", "--runs", "1", "--bind", "none", "--fail-worker", &w];
        let out = run_within(&args, Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{mode} mode, {role} failing: the run hung (killed after 60 s)"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{mode} mode, {role} failing: {:?}\n{stderr}", out.status);
        assert!(
            stderr.contains("injected failure (--fail-worker)") && stderr.contains(role),
            "{mode} mode, {role} failing: the error is not reported:\n{stderr}"
        );
    }
}
