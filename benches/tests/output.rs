//! What `weft-bench` writes: with `--csv` stdout is only CSV (the progress bar and the notes
//! go to stderr), `--markdown` prints one markdown table, `--plot` writes an SVG chart, and a
//! plot that cannot be written is an error with the path, not a panic.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

mod common;

/// Runs `weft-bench`; a run that has not ended after 60 s fails the test (it takes well
/// under a second).
fn weft_bench(args: &[&str]) -> Output {
    common::run_within(args, Duration::from_secs(60)).unwrap_or_else(|| panic!("weft-bench {args:?} hung (killed after 60 s)"))
}

/// A fresh directory for this test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weft-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

const LOCKS: [&str; 9] = ["locks", "-t", "1,2", "-p", "tas,mcs", "--millis", "5", "--runs", "1"];

#[test]
fn csv_stdout_is_only_csv_and_the_plot_is_drawn() {
    let dir = scratch("csv");
    let svg = dir.join("sub/locks.svg");
    let out = weft_bench(&[&LOCKS[..], &["--csv", "--plot", svg.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "bench,protocol,threads,ops_per_sec,latency_ns");
    assert_eq!(lines.len(), 1 + 4, "header and one row per (protocol, threads):\n{stdout}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells.len(), 5, "{l:?}");
        assert!(cells[3].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
    }
    assert!(!stdout.contains('\u{1b}') && !stdout.contains('\r'), "terminal control in the CSV: {stdout:?}");
    let svg = std::fs::read_to_string(&svg).expect("the plot was written, its directory created");
    for text in ["<svg", "locks: 10 random lines of 256 KiB", "threads", "throughput (M acquisitions/s"] {
        assert!(svg.contains(text), "{text:?} not in the SVG");
    }
    for legend in ["tas", "mcs"] {
        assert!(svg.lines().any(|l| l.trim() == legend), "no legend text {legend:?} in the SVG");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn markdown_prints_one_table() {
    let out = weft_bench(&[&LOCKS[..], &["--markdown"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let rows: Vec<&str> = stdout.lines().filter(|l| l.starts_with('|')).collect();
    assert_eq!(rows[0], "| protocol | threads | ops_per_sec | latency_ns |", "{stdout}");
    assert_eq!(rows[1], "| --- | --- | --- | --- |");
    assert_eq!(rows.len(), 2 + 4, "{stdout}");
    assert!(stdout.contains("bench: locks"), "the constant column is stated above the table:\n{stdout}");
}

#[test]
fn an_unwritable_plot_is_an_error() {
    let dir = scratch("bad");
    let file = dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let target = file.join("locks.svg");
    let out = weft_bench(&[&LOCKS[..], &["--csv", "--plot", target.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("a-file"), "the error names the path: {stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under `weftrun` without its internal worker flag, `weft-bench` says so and exits instead
/// of starting a job of its own in every rank.
#[test]
fn started_under_weftrun_it_says_so_and_exits() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft-bench"))
        .args(["multirate", "--provider", "shm", "-t", "1"])
        .env("WEFT_KVS", "127.0.0.1:1")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("start weft-bench");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("started under weftrun"), "{err}");
    assert!(out.stdout.is_empty());
    // The ranks a benchmark starts itself pass (here they fail to join the made-up job,
    // which says something else).
    for worker in ["--rank-worker", "--transport-worker"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_weft-bench"))
            .args(["pingpong", worker, "--provider", "embedded"])
            .env("WEFT_KVS", "127.0.0.1:1")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("start weft-bench");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("started under weftrun"), "{worker}");
    }
}

/// `multirate --mode transport`: process mode's loop through `weft-transport` alone, as a
/// `weftrun` job on `shm`, in the table beside process mode (its ratio to it in the
/// `thread_over_process` column).
#[cfg(feature = "ofi")]
#[test]
fn multirate_transport_mode_runs_beside_process_mode() {
    let args =
        ["multirate", "--provider", "shm", "-t", "1", "--mode", "transport,process", "-i", "5", "--runs", "1", "--bind", "none", "--csv"];
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench multirate hung (killed after 120 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let rows: Vec<Vec<&str>> = stdout.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert_eq!((rows[0][1], rows[1][1]), ("transport", "process"), "{stdout}");
    assert!(rows.iter().all(|r| r[12].parse::<f64>().is_ok_and(|v| v > 0.0)), "{stdout}");
    assert!(rows[0][13].parse::<f64>().is_ok_and(|v| v > 0.0), "transport / process: {stdout}");
}

/// `multirate --peer openmpi --peer-multiple`: the peer's rows of one thread a rank run a
/// second time with `MPI_THREAD_MULTIPLE`, in two columns of their own; rows whose peer runs
/// several threads a rank (`MPI_THREAD_MULTIPLE` anyway) leave them empty. Needs Open MPI
/// (`openmpi-bin libopenmpi-dev`); without its `mpicc` there is no peer to run, and the
/// test says so and checks only that the flag asks for `--peer`.
#[test]
fn multirate_peer_multiple_adds_the_thread_safe_peer() {
    let out = weft_bench(&["multirate", "-t", "1", "-i", "5", "--runs", "1", "--peer-multiple"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--peer <PEER>"), "{out:?}");
    if std::process::Command::new("mpicc.openmpi").arg("--version").output().is_err() {
        eprintln!("mpicc.openmpi not found: the peer's runs are not checked");
        return;
    }
    let dir = scratch("peer-multiple");
    let svg = dir.join("multirate.svg");
    let args = [
        "multirate",
        "-t",
        "1,2",
        "--mode",
        "process,thread",
        "-i",
        "20",
        "--runs",
        "1",
        "--peer",
        "openmpi",
        "--peer-multiple",
        "--csv",
        "--plot",
        svg.to_str().unwrap(),
    ];
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench multirate hung (killed after 120 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines.next().expect("a header").split(',').collect();
    let col = |name: &str| header.iter().position(|&c| c == name).unwrap_or_else(|| panic!("no column {name}: {stdout}"));
    let (mode, pairs, rate, ratio) = (col("mode"), col("pairs"), col("peer_multiple_rate"), col("ratio_multiple"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 4, "{stdout}");
    for r in &rows {
        let one_thread_a_rank = r[mode] == "process" || r[pairs] == "1";
        if one_thread_a_rank {
            assert!(r[rate].parse::<f64>().is_ok_and(|v| v > 0.0), "{r:?}");
            assert!(r[ratio].parse::<f64>().is_ok_and(|v| v > 0.0), "{r:?}");
        } else {
            assert_eq!((r[rate], r[ratio]), ("", ""), "{r:?}");
        }
    }
    let svg = std::fs::read_to_string(&svg).expect("the plot was written");
    assert!(svg.lines().any(|l| l.trim() == "Open MPI, MPI_THREAD_MULTIPLE, process mode"), "no line for the thread-safe peer in the plot");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The transport mode runs real processes: refused on the embedded provider, with a reason.
#[test]
fn multirate_transport_mode_needs_processes() {
    let out = weft_bench(&["multirate", "--mode", "transport", "-t", "1", "-i", "5", "--runs", "1"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--mode transport runs real processes"), "{out:?}");
}

/// `benches/stages.sh` counts the stages of a message in `msgcost --outlined`, where
/// `isend` and `irecv` are called through functions of the benchmark's own, and the loop as
/// multirate builds it in `msgcost --into` (requests written in place): the same loop, each
/// receive's length checked against the size sent, as the inlined one runs.
#[test]
fn msgcost_outlined_runs_the_same_checked_loop() {
    for extra in [&[][..], &["--outlined"][..], &["--outlined", "--late-receives"][..], &["--into"][..], &["--into", "--late-receives"][..]]
    {
        let args =
            [&["msgcost", "--progress", "concurrent", "-s", "0,100", "-w", "16", "-i", "20", "--runs", "1", "--csv"][..], extra].concat();
        let out = weft_bench(&args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8(out.stdout).expect("utf-8");
        let lines: Vec<&str> = stdout.lines().collect();
        let header: Vec<&str> = lines[0].split(',').collect();
        let ns = header.iter().position(|c| *c == "ns_per_message").expect("an ns_per_message column");
        let size = header.iter().position(|c| *c == "size").expect("a size column");
        let rows: Vec<Vec<&str>> = lines[1..].iter().map(|l| l.split(',').collect()).collect();
        assert_eq!(rows.iter().map(|r| r[size]).collect::<Vec<_>>(), ["0", "100"], "{args:?}:\n{stdout}");
        for r in &rows {
            assert!(r[ns].parse::<f64>().is_ok_and(|v| v > 0.0), "{args:?}: {r:?}");
        }
    }
}
