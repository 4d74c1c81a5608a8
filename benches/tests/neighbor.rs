//! `weft-bench neighbor`: its CSV columns and rows, and its errors.

use std::time::Duration;

mod common;

#[test]
fn every_configuration_has_a_rate_and_borrowed_rows_a_ratio() {
    let args = ["neighbor", "--csv", "-t", "1,2", "-i", "20", "--runs", "2", "--comm", "world,dup"];
    let out = common::run_within(&args, Duration::from_secs(60)).expect("weft-bench neighbor hung (killed after 60 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "threads,comm,reference,msg_rate,borrowed_over_counted");
    // 2 thread counts x 2 communicators x 2 schemes.
    assert_eq!(lines.len(), 1 + 8, "{stdout}");
    let mut seen = Vec::new();
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert!(cells[3].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
        match cells[2] {
            "borrowed" => assert!(cells[4].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}"),
            "counted" => assert_eq!(cells[4], "-", "{l:?}"),
            other => panic!("unknown scheme {other:?} in {l:?}"),
        }
        seen.push((cells[0].to_string(), cells[1].to_string(), cells[2].to_string()));
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 8, "a configuration is missing or repeated: {stdout}");
}

#[test]
fn an_unknown_scheme_or_communicator_is_an_error() {
    for (flag, value, says) in
        [("--reference", "weak", "unknown reference scheme \"weak\""), ("--comm", "self", "unknown communicator \"self\"")]
    {
        let out = common::run_within(&["neighbor", flag, value], Duration::from_secs(60)).expect("weft-bench neighbor hung");
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(says), "{}", String::from_utf8_lossy(&out.stderr));
    }
}
