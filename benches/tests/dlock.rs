//! `weft-bench dlock`: a short functional run of every lock and benchmark on in-process
//! ranks and, with libfabric, as processes through `weftrun` (the numbers are taken
//! elsewhere), its CSV columns, and refused input.

use std::time::Duration;

mod common;

#[test]
fn every_lock_and_benchmark_runs_and_prints_its_row() {
    let args = ["dlock", "--csv", "--bench", "lb,ecsb,sob,wcsb,warb", "--ranks", "3", "--ops", "20", "--writers", "0.25", "--t-r", "2,8"];
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench dlock hung (killed after 120 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines[0],
        "bench,lock,provider,launch,ranks,threads,writers_fraction,t_dc,t_l,t_r,levels,level_cost_ns,ops_per_sec,latency_us"
    );
    // 5 benchmarks x (d-mcs, rma-mcs, rma-rw at two T_R, fompi-spin, fompi-rw).
    assert_eq!(lines.len(), 1 + 5 * 6, "{stdout}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells.len(), 14, "{l:?}");
        assert_eq!((cells[2], cells[3], cells[4]), ("embedded", "in-process", "3"), "{l:?}");
        assert_eq!((cells[10], cells[11]), ("2", "0"), "the default model: 2 ranks per node, no cost: {l:?}");
        assert!(cells[12].parse::<f64>().is_ok_and(|v| v > 0.0) && cells[13].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
        let rw = cells[1] == "rma-rw" || cells[1] == "fompi-rw";
        assert_eq!(cells[6], if rw { "0.25" } else { "1" }, "{l:?}");
        assert_eq!(cells[9] != "-", cells[1] == "rma-rw", "T_R only for RMA-RW: {l:?}");
    }
}

/// `--launch weftrun`: each rank a process of a `weftrun` job on `shm`; rank 0 reports the
/// job's rate and latency, which land in the row.
#[cfg(feature = "ofi")]
#[test]
fn locks_run_as_processes_through_weftrun() {
    let args = [
        "dlock",
        "--csv",
        "--provider",
        "shm",
        "--launch",
        "weftrun",
        "--bench",
        "sob",
        "--lock",
        "d-mcs,rma-rw",
        "-r",
        "3",
        "--ops",
        "20",
    ];
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench dlock hung (killed after 120 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let rows: Vec<Vec<&str>> = stdout.lines().skip(1).map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for (row, lock) in rows.iter().zip(["d-mcs", "rma-rw"]) {
        assert_eq!((row[1], row[2], row[3], row[4]), (lock, "shm", "weftrun", "3"), "{row:?}");
        assert!(row[12].parse::<f64>().is_ok_and(|v| v > 0.0) && row[13].parse::<f64>().is_ok_and(|v| v > 0.0), "{row:?}");
    }
}

#[test]
fn processes_on_the_embedded_provider_are_refused() {
    let out = common::run_within(&["dlock", "--launch", "weftrun"], Duration::from_secs(60)).expect("weft-bench dlock hung");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--provider shm or tcp"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn an_unknown_lock_is_an_error() {
    let out = common::run_within(&["dlock", "--lock", "ticket"], Duration::from_secs(60)).expect("weft-bench dlock hung");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown lock \"ticket\""));
}

/// `--level-cost-ns`: the rows and the header note state the simulated model; a cost
/// without simulated sizes, or one cost too many, is refused.
#[test]
fn a_simulated_cost_is_stated_with_the_numbers() {
    let args = [
        "dlock",
        "--csv",
        "--bench",
        "lb",
        "--lock",
        "d-mcs,rma-mcs",
        "--ranks",
        "2",
        "--ops",
        "5",
        "--levels",
        "1",
        "--level-cost-ns",
        "500",
    ];
    let out = common::run_within(&args, Duration::from_secs(60)).expect("weft-bench dlock hung");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    for l in stdout.lines().skip(1) {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!((cells[10], cells[11]), ("1", "500"), "{l:?}");
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("crossing cost per level: [500] ns"), "{}", String::from_utf8_lossy(&out.stderr));
    for bad in [["--levels", "flat", "--level-cost-ns", "100"], ["--levels", "2", "--level-cost-ns", "100,200"]] {
        let out = common::run_within(&[&["dlock", "--ranks", "2", "--ops", "1"][..], &bad[..]].concat(), Duration::from_secs(60))
            .expect("weft-bench dlock hung");
        assert!(!out.status.success(), "{bad:?} was accepted");
        assert!(String::from_utf8_lossy(&out.stderr).contains("level"), "{}", String::from_utf8_lossy(&out.stderr));
    }
}
