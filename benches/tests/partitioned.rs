//! `weft-bench partitioned`: a short functional run of every mode (its CSV columns, every
//! message checked on arrival, its chart), and a clear error for a size the threads do not
//! divide.

use std::time::Duration;

mod common;

#[test]
fn every_mode_delivers_the_message() {
    let svg = std::env::temp_dir().join(format!("weft-bench-partitioned-{}.svg", std::process::id()));
    let args = ["partitioned", "--csv", "-t", "1,4", "-s", "1024,65536", "--rounds", "3", "--plot", svg.to_str().unwrap()];
    // Three timed rounds after a first: each mode's buffers (and the partitioned pair) are
    // reused, and every round's message is checked with that round's contents.
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench partitioned hung (killed after 120 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "mode,provider,threads,bytes,rounds,receive_us,median_us");
    assert_eq!(lines.len(), 1 + 3 * 2 * 2, "{stdout}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!((cells[1], cells[4]), ("embedded", "3"), "{l:?}");
        assert!(cells[5..].iter().all(|c| c.parse::<f64>().is_ok_and(|v| v > 0.0)), "{l:?}");
    }
    let chart = std::fs::read_to_string(&svg).expect("the plot was written");
    for text in ["<svg", "partitioned: one message filled by T threads", "1 threads", "4 threads", "message size"] {
        assert!(chart.contains(text), "{text:?} not in the SVG");
    }
    for legend in ["partitioned", "separate", "join"] {
        assert!(chart.lines().any(|l| l.trim() == legend), "no legend text {legend:?} in the SVG");
    }
    let _ = std::fs::remove_file(&svg);
}

/// Over libfabric's `shm` (two ranks in this process), where the target is set.
#[cfg(feature = "ofi")]
#[test]
fn partitions_travel_over_shm() {
    let args = ["partitioned", "--csv", "--provider", "shm", "-t", "4", "-s", "1048576", "--rounds", "2"];
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench partitioned hung (killed after 120 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let rows: Vec<Vec<&str>> = stdout.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 3, "{stdout}");
    assert!(rows.iter().all(|r| r[1] == "shm" && r[5].parse::<f64>().is_ok_and(|v| v > 0.0)), "{stdout}");
}

#[test]
fn a_size_the_threads_do_not_divide_is_an_error() {
    let out = common::run_within(&["partitioned", "-t", "3", "-s", "1024"], Duration::from_secs(60)).expect("weft-bench partitioned hung");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a multiple of 3 threads"));
}
