//! `weft-bench ctxid`: its CSV columns, and the deterministic count it reports — one
//! allreduce per uncontended creation with the eager allocation, two with the base protocol
//! alone ([Dinan 2012, Listing 1.2]).

use std::time::Duration;

mod common;

#[test]
fn one_thread_per_rank_costs_one_allreduce_eager_and_two_base() {
    let out = common::run_within(&["ctxid", "--csv", "-t", "1", "-r", "2,3", "--creations", "50"], Duration::from_secs(60))
        .expect("weft-bench ctxid hung (killed after 60 s)");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).expect("utf-8");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "threads,ranks,protocol,creations_per_sec,allreduces_per_creation");
    assert_eq!(lines.len(), 1 + 4, "{stdout}");
    for l in &lines[1..] {
        let cells: Vec<&str> = l.split(',').collect();
        assert!(cells[3].parse::<f64>().is_ok_and(|v| v > 0.0), "{l:?}");
        let want = if cells[2] == "eager" { "1.000" } else { "2.000" };
        assert_eq!(cells[4], want, "{l:?}");
    }
}

#[test]
fn an_unknown_protocol_is_an_error() {
    let out = common::run_within(&["ctxid", "--protocol", "fast"], Duration::from_secs(60)).expect("weft-bench ctxid hung");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown protocol \"fast\""));
}
