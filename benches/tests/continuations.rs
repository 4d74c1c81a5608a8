//! `weft-bench continuations`: a short functional run of every mode (its CSV columns, every
//! completion seen, its chart), and a clear error for an unknown mode.

use std::time::Duration;

mod common;

#[test]
fn every_mode_sees_every_completion() {
    let svg = std::env::temp_dir().join(format!("weft-bench-continuations-{}.svg", std::process::id()));
    let args = ["continuations", "--csv", "-t", "1,2", "-n", "1,50", "--messages", "100", "--plot", svg.to_str().unwrap()];
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench continuations hung (killed after 120 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "mode,threads,in_flight,messages,completions_per_sec,mean_latency_us,completion_to_callback_us");
    assert_eq!(lines.len(), 1 + 4 * 2 * 2, "{stdout}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells[3], "100", "{l:?}");
        assert!(cells[4].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
        assert!(cells[5].parse::<f64>().is_ok_and(|v| v >= 0.0), "{l:?}");
        // Every completion stamped where the receives are attached before they complete (a
        // task may find its receive complete at its first poll, unstamped: `-`); a message
        // completes after its send (the two instants are read a few ns apart: 1 µs of slack).
        if cells[0] == "task" && cells[6] == "-" {
            continue;
        }
        let from_completion: f64 = cells[6].parse().unwrap_or_else(|_| panic!("no completion-to-callback latency: {l:?}"));
        assert!((0.0..=cells[5].parse::<f64>().unwrap() + 1.0).contains(&from_completion), "{l:?}");
    }
    let chart = std::fs::read_to_string(&svg).expect("the plot was written");
    for text in ["<svg", "continuations: send to callback", "receives in flight", "latency"] {
        assert!(chart.contains(text), "{text:?} not in the SVG");
    }
    for legend in ["inline, 1 threads", "pool, 2 threads", "task, 1 threads", "sync, 2 threads"] {
        assert!(chart.lines().any(|l| l.trim() == legend), "no legend text {legend:?} in the SVG");
    }
    let _ = std::fs::remove_file(&svg);
}

#[test]
fn an_unknown_mode_is_an_error() {
    let out = common::run_within(&["continuations", "--mode", "poll"], Duration::from_secs(60)).expect("weft-bench continuations hung");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown mode \"poll\""));
}
