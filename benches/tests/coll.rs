//! `weft-bench coll`: its CSV columns and one row per (collective, ranks, bytes) on the
//! embedded provider, and its refusals.

use std::time::Duration;

mod common;

/// The CSV lines of a short `weft-bench coll` run on the embedded provider with `args`.
fn csv(args: &[&str]) -> Vec<String> {
    let args = [&["coll", "--csv", "--provider", "embedded"][..], args, &["-i", "3", "--warmup", "1", "--runs", "1", "--openmpi", "no"]];
    let out = common::run_within(&args.concat(), Duration::from_secs(60)).expect("weft-bench coll hung (killed after 60 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8").lines().map(String::from).collect()
}

#[test]
fn csv_has_a_row_per_collective_ranks_and_size() {
    let lines = csv(&["-n", "2,3", "-s", "8,4096", "-c", "allreduce,bcast,alltoall"]);
    let stdout = lines.join("\n");
    assert_eq!(lines[0], "collective,ranks,bytes,latency_us,provider,ompi_latency_us");
    assert_eq!(lines.len(), 1 + 3 * 2 * 2, "{stdout}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells.len(), 6, "{l:?}");
        assert!(["allreduce", "bcast", "alltoall"].contains(&cells[0]), "{l:?}");
        assert!(cells[3].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
        assert_eq!((cells[4], cells[5]), ("embedded", "-"), "{l:?}");
    }
}

#[test]
fn persistent_adds_the_persistent_requests_time_per_call() {
    let lines = csv(&["-n", "3", "-s", "8,4096", "-c", "allreduce,bcast,alltoall", "--persistent"]);
    let stdout = lines.join("\n");
    assert_eq!(lines[0], "collective,ranks,bytes,latency_us,provider,ompi_latency_us,persistent_us");
    assert_eq!(lines.len(), 1 + 3 * 2, "{stdout}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells.len(), 7, "{l:?}");
        assert!(cells[6].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
    }
}

#[test]
fn plot_draws_a_line_per_collective_and_rank_count() {
    let dir = std::env::temp_dir().join(format!("weft-bench-coll-plot-{}", std::process::id()));
    let svg = dir.join("coll.svg");
    let args = ["coll", "--provider", "embedded", "-n", "2,4", "-s", "8,4096", "-c", "allreduce,bcast", "--plot", svg.to_str().unwrap()];
    let out =
        common::run_within(&[&args[..], &["-i", "3", "--warmup", "1", "--runs", "1", "--openmpi", "no"]].concat(), Duration::from_secs(60))
            .expect("weft-bench coll hung (killed after 60 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(&svg).expect("the plot was written");
    for text in ["<svg", "coll: latency per call", "message size (bytes)", "latency per call (µs)", "provider embedded"] {
        assert!(svg.contains(text), "{text:?} not in the SVG");
    }
    for legend in ["allreduce, 2 ranks", "bcast, 4 ranks"] {
        assert!(svg.contains(legend), "no legend {legend:?} in the SVG");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unknown_collective_or_openmpi_choice_is_an_error() {
    for (args, says) in [
        (&["coll", "-c", "allscatter"][..], "unknown collective \"allscatter\""),
        (&["coll", "--provider", "embedded", "--openmpi", "maybe"][..], "--openmpi \"maybe\""),
    ] {
        let out = common::run_within(args, Duration::from_secs(60)).expect("weft-bench coll hung");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
}
