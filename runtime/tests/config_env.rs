//! The `WEFT_*` variables of the modes and sizes — `WEFT_PROGRESS`, `WEFT_ASSIGNMENT`,
//! `WEFT_MATCHING`, `WEFT_CRIS`, `WEFT_EAGER_THRESHOLD`, `WEFT_INBOX`: each one overrides
//! the builder's setting (as MCA parameters override Open MPI's defaults) in the resolved
//! configuration and in the runtimes built, is ignored with `env(false)`, and a bad value
//! fails the build with `InvalidArgument` naming the variable, as a bad MCA parameter does.
//! (One test in this binary: it sets process environment variables, which tests running in
//! parallel threads would race on.)

use weft::{Assignment, Config, Error, MatchingMode, ProgressMode, Runtime};

/// The variables this file covers.
const VARS: [&str; 6] = ["WEFT_PROGRESS", "WEFT_ASSIGNMENT", "WEFT_MATCHING", "WEFT_CRIS", "WEFT_EAGER_THRESHOLD", "WEFT_INBOX"];

/// A builder whose every covered setting differs from what the variables set below.
fn builder() -> weft::Builder {
    Runtime::builder()
        .progress(ProgressMode::Global)
        .assignment(Assignment::RoundRobin)
        .matching(MatchingMode::Global)
        .cris(2)
        .eager_threshold(1000)
        .inbox_capacity(64)
}

/// The configuration `builder()` asks for.
fn asked() -> Config {
    builder().env(false).resolve().unwrap()
}

/// Two ranks built with the environment, checked to agree on the configuration and to carry
/// a message each way.
fn built() -> Vec<Runtime> {
    let rts = builder().build_local(2).unwrap();
    assert_eq!(rts[0].config(), rts[1].config());
    std::thread::scope(|s| {
        s.spawn(|| {
            let (m, _) = rts[1].world().recv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
            rts[1].world().send(m, 0, 2).unwrap();
        });
        rts[0].world().send(vec![42u8], 1, 1).unwrap();
        assert_eq!(rts[0].world().recv(Vec::<u8>::with_capacity(1), 1u32, 2).unwrap().0, vec![42]);
    });
    rts
}

/// Asserts that the environment as it is now fails the build with `InvalidArgument` naming
/// `var` (resolving, and building ranks: an error, not a panic), and that the builder without
/// the environment still builds.
fn refused(var: &str, value: &str) {
    match builder().resolve() {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(var), "{var}={value:?}: the error does not name the variable: {m}"),
        other => panic!("{var}={value:?}: expected InvalidArgument, got {other:?}"),
    }
    match builder().build_local(2) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains(var), "{var}={value:?}: {m}"),
        other => panic!("{var}={value:?}: expected InvalidArgument from build_local, got {:?}", other.map(|r| r.len())),
    }
    assert!(builder().env(false).build_local(1).is_ok(), "{var}={value:?}");
}

#[test]
fn weft_variables_override_the_builder_and_bad_values_fail() {
    for v in VARS {
        std::env::remove_var(v);
    }
    let asked = asked();
    assert_eq!(builder().resolve().unwrap(), asked, "nothing set: the builder's settings");

    // Each variable overrides its setting, and only it; `env(false)` ignores it.
    type Set = fn(&mut Config);
    let cases: [(&str, &str, Set); 7] = [
        ("WEFT_PROGRESS", "owner", |c| c.progress = ProgressMode::Owner),
        ("WEFT_PROGRESS", " Concurrent ", |c| c.progress = ProgressMode::Concurrent),
        ("WEFT_ASSIGNMENT", "dedicated", |c| c.assignment = Assignment::Dedicated),
        ("WEFT_MATCHING", "per-comm", |c| c.matching = MatchingMode::PerComm),
        ("WEFT_CRIS", "3", |c| c.cris = 3),
        ("WEFT_EAGER_THRESHOLD", "100", |c| c.eager_threshold = 100),
        ("WEFT_INBOX", " 4 ", |c| c.inbox_capacity = 4),
    ];
    for (var, value, set) in cases {
        std::env::set_var(var, value);
        let mut want = asked.clone();
        set(&mut want);
        assert_ne!(want, asked, "{var}: the case must change something");
        assert_eq!(builder().resolve().unwrap(), want, "{var}={value:?} overrides the builder");
        assert_eq!(builder().env(false).resolve().unwrap(), asked, "{var}={value:?} is ignored with env(false)");
        let rts = built();
        assert_eq!(rts[0].config(), &want, "{var}={value:?}: the runtime built");
        std::env::remove_var(var);
    }
    // A blank variable is unset.
    for v in VARS {
        std::env::set_var(v, "  ");
    }
    assert_eq!(builder().resolve().unwrap(), asked, "blank variables");
    for v in VARS {
        std::env::remove_var(v);
    }

    // The sizes take effect, not only the configuration. CRIs: the index a thread may pin.
    std::env::set_var("WEFT_CRIS", "3");
    let rts = built();
    assert!(rts[0].pin_cri(2).is_ok() && matches!(rts[0].pin_cri(3), Err(Error::InvalidArgument(_))));
    std::env::remove_var("WEFT_CRIS");
    assert!(builder().build_local(1).unwrap()[0].pin_cri(2).is_err(), "the builder's 2 CRIs");
    // Eager threshold: a 1000-byte send to a rank with no receive posted completes inside
    // `isend` when eager (the builder's 1000), not when it goes by rendezvous (100).
    for (value, eager) in [(Some("100"), false), (None, true)] {
        match value {
            Some(v) => std::env::set_var("WEFT_EAGER_THRESHOLD", v),
            None => std::env::remove_var("WEFT_EAGER_THRESHOLD"),
        }
        let rts = built();
        let r = rts[0].world().isend(vec![7u8; 1000], 1, 3).unwrap();
        assert_eq!(r.is_complete(), eager, "WEFT_EAGER_THRESHOLD={value:?}");
        assert_eq!(rts[1].world().recv(Vec::<u8>::with_capacity(1000), 0u32, 3).unwrap().0, vec![7u8; 1000]);
        r.wait().unwrap();
    }
    // Inbox: 20 frames to a rank that does not receive (10 per CRI inbox under round-robin
    // assignment) are pushed back by inboxes of 4, not by the builder's 64.
    for (value, pushed_back) in [(Some("4"), true), (None, false)] {
        match value {
            Some(v) => std::env::set_var("WEFT_INBOX", v),
            None => std::env::remove_var("WEFT_INBOX"),
        }
        let rts = built();
        let mut sends: Vec<_> = (0..20u8).map(|i| rts[0].world().isend(vec![i], 1, 4).unwrap()).collect();
        assert_eq!(rts[0].counters().flow_control_waits > 0, pushed_back, "WEFT_INBOX={value:?}: {:?}", rts[0].counters());
        std::thread::scope(|s| {
            s.spawn(|| {
                for i in 0..20u8 {
                    assert_eq!(rts[1].world().recv(Vec::<u8>::with_capacity(1), 0u32, 4).unwrap().0, vec![i]);
                }
            });
            weft::wait_all(&mut sends).unwrap();
        });
    }
    std::env::remove_var("WEFT_INBOX");

    // Bad values fail the build, naming the variable: malformed, out of range, or so large
    // that building would panic or exhaust memory (an inbox of `usize::MAX / 4` frames).
    let bad: [(&str, &[&str]); 6] = [
        ("WEFT_PROGRESS", &["fast", "owner2", "1"]),
        ("WEFT_ASSIGNMENT", &["random", "round_robin"]),
        ("WEFT_MATCHING", &["per-thread", "none"]),
        ("WEFT_CRIS", &["0", "-1", "two", "1025", "99999999999999999999999"]),
        ("WEFT_EAGER_THRESHOLD", &["-5", "16k", "67108865", "18446744073709551615"]),
        ("WEFT_INBOX", &["0", "x", "1048577", "4611686018427387903", "18446744073709551615"]),
    ];
    for (var, values) in bad {
        for value in values {
            std::env::set_var(var, value);
            refused(var, value);
        }
        std::env::remove_var(var);
    }
    // Each size within its bound, but too many inbox frames per rank together.
    std::env::set_var("WEFT_CRIS", "1024");
    std::env::set_var("WEFT_INBOX", "1048576");
    refused("WEFT_INBOX", "1048576 with WEFT_CRIS=1024");
    std::env::remove_var("WEFT_CRIS");
    std::env::remove_var("WEFT_INBOX");
    // A value that is not UTF-8 is a bad value, not an unset variable.
    #[cfg(unix)]
    for var in VARS {
        use std::os::unix::ffi::OsStrExt;
        std::env::set_var(var, std::ffi::OsStr::from_bytes(b"\xff4"));
        refused(var, "\\xff4");
        std::env::remove_var(var);
    }
    // The switches: the on and off spellings in any case; anything else is an error naming
    // the variable (it was taken for "off").
    type Get = fn(&Config) -> bool;
    let switches: [(&str, Get); 4] = [
        ("WEFT_MATCH_TIMING", |c| c.match_timing),
        ("WEFT_LOCK_STATS", |c| c.lock_stats),
        ("WEFT_LOCK_TIMING", |c| c.lock_timing),
        ("WEFT_PER_THREAD_ORDER", |c| c.per_thread_order),
    ];
    for (var, get) in switches {
        for (value, want) in [("1", true), ("on", true), (" TRUE ", true), ("yes", true), ("0", false), ("off", false), ("No", false)] {
            std::env::set_var(var, value);
            let c = Runtime::builder().assignment(Assignment::Dedicated).resolve().unwrap();
            assert_eq!(get(&c), want, "{var}={value:?}");
        }
        for value in ["2", "enable", "o n", "-1"] {
            std::env::set_var(var, value);
            refused(var, value);
        }
        std::env::remove_var(var);
    }
    for value in ["infiniband", "sm", "1"] {
        std::env::set_var("WEFT_PROVIDER", value);
        refused("WEFT_PROVIDER", value);
    }
    std::env::remove_var("WEFT_PROVIDER");
    // The simulated machine levels: both variables or neither, well-formed.
    std::env::set_var("WEFT_SIM_LEVELS", "4,2");
    std::env::set_var("WEFT_LEVEL_COST_NS", " 100, 1000");
    assert_eq!(builder().resolve().unwrap().level_cost, weft::LevelCost::new(&[4, 2], &[100, 1000]).unwrap());
    for (levels, costs) in [("4,2", "100"), ("4,x", "1,2"), ("0", "5"), ("2", "")] {
        std::env::set_var("WEFT_SIM_LEVELS", levels);
        std::env::set_var("WEFT_LEVEL_COST_NS", costs);
        assert!(matches!(builder().resolve(), Err(Error::InvalidArgument(_))), "{levels:?} {costs:?}");
    }
    std::env::remove_var("WEFT_SIM_LEVELS");
    std::env::remove_var("WEFT_LEVEL_COST_NS");
    assert_eq!(builder().resolve().unwrap(), asked, "every variable removed again");
}
