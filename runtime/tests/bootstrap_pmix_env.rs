//! A process whose environment says a PMIx launcher started it (`PMIX_NAMESPACE`,
//! `PMIX_RANK`) while no PMIx server can be reached: `Runtime::build` fails at once with an
//! error that names the problem, never hangs. (One test in this binary: it sets process
//! environment variables.)

use std::sync::mpsc;
use std::time::{Duration, Instant};

use weft::{Error, Runtime};

#[test]
fn a_pmix_environment_that_points_nowhere_is_a_clear_error() {
    for var in ["WEFT_RANK", "WEFT_SIZE", "WEFT_KVS", "WEFT_TOKEN", "WEFT_PROVIDER", "SLURM_PROCID", "SLURM_NTASKS"] {
        std::env::remove_var(var);
    }
    std::env::set_var("PMIX_NAMESPACE", "weft-test-nowhere");
    std::env::set_var("PMIX_RANK", "0");
    // Port 9 (discard) on loopback: nothing listens, every connect is refused.
    for uri in ["PMIX_SERVER_URI4", "PMIX_SERVER_URI41"] {
        std::env::set_var(uri, "weft-test-nowhere.0;tcp4://127.0.0.1:9");
    }
    if cfg!(feature = "pmix") {
        // A malformed join timeout is refused before anything is joined.
        std::env::set_var("WEFT_JOIN_TIMEOUT", "soon");
        match Runtime::builder().build().map(|_| ()) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("WEFT_JOIN_TIMEOUT"), "{m}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
        std::env::remove_var("WEFT_JOIN_TIMEOUT");
    }
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(Runtime::builder().build().map(|_| ()));
    });
    let r = rx.recv_timeout(Duration::from_secs(20)).expect("build() still joining after 20 s");
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
    if cfg!(feature = "pmix") {
        // PMIx_Init cannot reach the server.
        match r {
            Err(Error::Transport { op, .. }) => assert!(op.contains("PMIx_Init"), "{op}"),
            other => panic!("expected a transport error from PMIx_Init, got {other:?}"),
        }
    } else {
        // Each rank would run alone as a job of one: refused, naming the feature.
        match r {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("`pmix` feature"), "{m}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}
