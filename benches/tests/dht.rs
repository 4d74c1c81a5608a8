//! `weft-bench dht`: a short functional run of the hash table under every volume lock on
//! in-process ranks (the numbers are taken elsewhere), its CSV columns, and refused input;
//! `weft-bench dlock --plot` writes its chart.

use std::time::Duration;

mod common;

#[test]
fn every_volume_lock_runs_and_prints_its_row() {
    let args = ["dht", "--csv", "--ranks", "3", "--ops", "50", "--keys", "64", "--access", "one,spread", "--writers", "0.002,0.5"];
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench dht hung (killed after 120 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "lock,provider,ranks,access,writers_fraction,keys,ops_per_rank,seconds,ops_per_sec");
    // 3 locks x 2 accesses x 2 F_W.
    assert_eq!(lines.len(), 1 + 3 * 2 * 2, "{stdout}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert_eq!(cells.len(), 9, "{l:?}");
        assert!(["rma-rw", "fompi-rw", "fompi-spin"].contains(&cells[0]), "{l:?}");
        assert_eq!((cells[1], cells[2], cells[5], cells[6]), ("embedded", "3", "64", "50"), "{l:?}");
        assert!(cells[7].parse::<f64>().is_ok_and(|v| v > 0.0) && cells[8].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
    }
}

#[test]
fn a_lock_without_readers_or_a_bad_access_is_an_error() {
    let out = common::run_within(&["dht", "--lock", "d-mcs"], Duration::from_secs(60)).expect("weft-bench dht hung");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("d-mcs cannot guard a hash table volume"));
    let out = common::run_within(&["dht", "--access", "all"], Duration::from_secs(60)).expect("weft-bench dht hung");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown access \"all\""));
}

#[test]
fn dlock_plot_writes_an_svg() {
    let path = std::env::temp_dir().join(format!("weft-dlock-plot-{}.svg", std::process::id()));
    let p = path.to_str().expect("utf-8 temp path");
    let args = ["dlock", "--csv", "--lock", "d-mcs,rma-rw", "--bench", "lb", "--ranks", "2,3", "--ops", "10", "--plot", p];
    let out = common::run_within(&args, Duration::from_secs(120)).expect("weft-bench dlock hung");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let svg = std::fs::read_to_string(&path).expect("the plot was written");
    let _ = std::fs::remove_file(&path);
    assert!(svg.starts_with("<svg") && svg.contains("d-mcs") && svg.contains("rma-rw"), "{svg:.200}");
}
