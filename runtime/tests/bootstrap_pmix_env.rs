//! A process whose environment says a PMIx launcher started it (`PMIX_NAMESPACE`,
//! `PMIX_RANK`) while no PMIx server can be reached, or the one named closes the connection
//! or never answers: `Runtime::build` fails within seconds with an error that names the
//! problem, never hangs. (One test in this binary: it sets process environment variables.)

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
    let r = build_within(Duration::from_secs(10));
    if cfg!(feature = "pmix") {
        // PMIx_Init cannot reach the server.
        match r {
            Err(Error::Transport { op, .. }) => assert!(op.contains("PMIx_Init"), "{op}"),
            other => panic!("expected a transport error from PMIx_Init, got {other:?}"),
        }
        // A server that closes every connection at once refuses; one that accepts and never
        // answers the handshake is given WEFT_JOIN_TIMEOUT (PMIx itself would wait for ever).
        // (The one that never answers comes last: its PMIx_Init stays blocked in this process.)
        std::env::set_var("WEFT_JOIN_TIMEOUT", "1");
        for (closes, says) in [(true, "cannot be reached, or refused"), (false, "did not answer within WEFT_JOIN_TIMEOUT")] {
            let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            for uri in ["PMIX_SERVER_URI4", "PMIX_SERVER_URI41"] {
                std::env::set_var(uri, format!("weft-test-nowhere.0;tcp4://{}", server.local_addr().unwrap()));
            }
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stop = done.clone();
            let accept = std::thread::spawn(move || {
                server.set_nonblocking(true).unwrap();
                let mut held = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    match server.accept() {
                        Ok((c, _)) if !closes => held.push(c),
                        Ok(_) => {}
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            });
            let r = build_within(Duration::from_secs(5));
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            accept.join().unwrap();
            match r {
                Err(Error::Transport { op, .. }) => assert!(op.contains("PMIx_Init") && op.contains(says), "{op}"),
                other => panic!("expected a transport error from PMIx_Init, got {other:?}"),
            }
        }
    } else {
        // Each rank would run alone as a job of one: refused, naming the feature.
        match r {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("`pmix` feature"), "{m}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
}

/// `Runtime::builder().build()`, which must end within `limit`.
fn build_within(limit: Duration) -> Result<(), Error> {
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(Runtime::builder().build().map(|_| ()));
    });
    let r = rx.recv_timeout(limit + Duration::from_secs(10)).expect("build() still joining 10 s past its limit");
    assert!(t0.elapsed() < limit, "took {:?}", t0.elapsed());
    r
}
