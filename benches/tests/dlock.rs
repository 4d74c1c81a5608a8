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
        "bench,lock,provider,launch,ranks,threads,tasks,writers_fraction,t_dc,t_l,t_r,levels,level_cost_ns,ops_per_sec,latency_us"
    );
    // 5 benchmarks x (d-mcs, rma-mcs, rma-rw at two T_R, fompi-spin, fompi-rw).
    assert_eq!(lines.len(), 1 + 5 * 6, "{stdout}");
    for l in &lines[1..] {
        let row = Row::new(lines[0], l);
        assert_eq!(row.cells.len(), 15, "{l:?}");
        assert_eq!(
            (row.get("provider"), row.get("launch"), row.get("ranks"), row.get("tasks")),
            ("embedded", "in-process", "3", "0"),
            "{l:?}"
        );
        assert_eq!((row.get("levels"), row.get("level_cost_ns")), ("2", "0"), "the default model: 2 ranks per node, no cost: {l:?}");
        assert!(row.positive("ops_per_sec") && row.positive("latency_us"), "{l:?}");
        let rw = row.get("lock") == "rma-rw" || row.get("lock") == "fompi-rw";
        assert_eq!(row.get("writers_fraction"), if rw { "0.25" } else { "1" }, "{l:?}");
        assert_eq!(row.get("t_r") != "-", row.get("lock") == "rma-rw", "T_R only for RMA-RW: {l:?}");
    }
}

/// One CSV row, its cells looked up by the header's column names.
struct Row<'a> {
    header: Vec<&'a str>,
    cells: Vec<&'a str>,
}

impl<'a> Row<'a> {
    fn new(header: &'a str, line: &'a str) -> Self {
        Row { header: header.split(',').collect(), cells: line.split(',').collect() }
    }

    fn get(&self, name: &str) -> &'a str {
        let i = self.header.iter().position(|h| *h == name).unwrap_or_else(|| panic!("no column {name:?} in {:?}", self.header));
        self.cells[i]
    }

    fn positive(&self, name: &str) -> bool {
        self.get(name).parse::<f64>().is_ok_and(|v| v > 0.0)
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
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    for (l, lock) in lines[1..].iter().zip(["d-mcs", "rma-rw"]) {
        let row = Row::new(lines[0], l);
        assert_eq!((row.get("lock"), row.get("provider"), row.get("launch"), row.get("ranks")), (lock, "shm", "weftrun", "3"), "{l:?}");
        assert!(row.positive("ops_per_sec") && row.positive("latency_us"), "{l:?}");
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
    let header = stdout.lines().next().expect("a header");
    for l in stdout.lines().skip(1) {
        let row = Row::new(header, l);
        assert_eq!((row.get("levels"), row.get("level_cost_ns")), ("1", "500"), "{l:?}");
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("crossing cost per level: [500] ns"), "{}", String::from_utf8_lossy(&out.stderr));
    for bad in [["--levels", "flat", "--level-cost-ns", "100"], ["--levels", "2", "--level-cost-ns", "100,200"]] {
        let out = common::run_within(&[&["dlock", "--ranks", "2", "--ops", "1"][..], &bad[..]].concat(), Duration::from_secs(60))
            .expect("weft-bench dlock hung");
        assert!(!out.status.success(), "{bad:?} was accepted");
        assert!(String::from_utf8_lossy(&out.stderr).contains("level"), "{}", String::from_utf8_lossy(&out.stderr));
    }
}

/// `--tasks`: the waiters of a rank are tasks of its pool (`lock_async`), one row per count.
#[test]
fn tasks_wait_for_the_locks_and_are_counted_in_the_row() {
    let args = ["dlock", "--csv", "--bench", "lb", "--lock", "d-mcs,fompi-spin", "--ranks", "2", "--ops", "5", "--tasks", "0,4"];
    let out = common::run_within(&args, Duration::from_secs(60)).expect("weft-bench dlock hung");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1 + 2 * 2, "{stdout}");
    let tasks: Vec<&str> = lines[1..].iter().map(|l| Row::new(lines[0], l).get("tasks")).collect();
    assert_eq!(tasks, ["0", "4", "0", "4"], "{stdout}");
    for l in &lines[1..] {
        let row = Row::new(lines[0], l);
        assert!(row.positive("ops_per_sec") && row.positive("latency_us"), "{l:?}");
    }
}
