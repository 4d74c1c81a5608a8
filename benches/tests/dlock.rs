//! `weft-bench dlock`: a short functional run of every lock and benchmark on in-process
//! ranks (the numbers are taken elsewhere), its CSV columns, and refused input.

use std::time::Duration;

mod common;

#[test]
fn every_lock_and_benchmark_runs_and_prints_its_row() {
    let args = ["dlock", "--csv", "--bench", "lb,ecsb,sob,wcsb,warb", "--ranks", "3", "--ops", "20", "--writers", "0.25", "--t-r", "2,8"];
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench dlock hung (killed after 120 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "bench,lock,provider,ranks,threads,writers_fraction,t_dc,t_l,t_r,ops_per_sec,latency_us");
    // 5 benchmarks x (d-mcs, rma-mcs, rma-rw at two T_R, fompi-spin, fompi-rw).
    assert_eq!(lines.len(), 1 + 5 * 6, "{stdout}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells.len(), 11, "{l:?}");
        assert_eq!((cells[2], cells[3]), ("embedded", "3"), "{l:?}");
        assert!(cells[9].parse::<f64>().is_ok_and(|v| v > 0.0) && cells[10].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
        let rw = cells[1] == "rma-rw" || cells[1] == "fompi-rw";
        assert_eq!(cells[5], if rw { "0.25" } else { "1" }, "{l:?}");
        assert_eq!(cells[8] != "-", cells[1] == "rma-rw", "T_R only for RMA-RW: {l:?}");
    }
}

#[test]
fn an_unknown_lock_is_an_error() {
    let out = common::run_within(&["dlock", "--lock", "ticket"], Duration::from_secs(60)).expect("weft-bench dlock hung");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown lock \"ticket\""));
}
