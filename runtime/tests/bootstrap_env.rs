//! How `Runtime::build` reads a job from the environment before it connects to anything.
//! (One test in this binary: it sets process environment variables, which tests running in
//! parallel threads would race on.)

use std::sync::mpsc;
use std::time::{Duration, Instant};

use weft::{Error, Runtime};

/// The embedded provider asked to join a job of several processes fails at once, naming
/// the problem — before connecting to the job's key-value server, which here is
/// unreachable (connecting first used to retry it for 60 s before failing with a transport
/// error).
#[test]
fn embedded_provider_in_a_job_of_several_fails_before_connecting() {
    for (var, value) in [
        ("WEFT_PROVIDER", "embedded"),
        ("WEFT_RANK", "0"),
        ("WEFT_SIZE", "2"),
        // Port 9 (discard) on loopback: nothing listens; every connect is refused.
        ("WEFT_KVS", "127.0.0.1:9"),
        ("WEFT_TOKEN", "0123"),
    ] {
        std::env::set_var(var, value);
    }
    std::env::remove_var("SLURM_PROCID");
    let (tx, rx) = mpsc::channel();
    let t0 = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(Runtime::builder().build().map(|_| ()));
    });
    let r = rx.recv_timeout(Duration::from_secs(20)).expect("build() still connecting after 20 s");
    match r {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("embedded provider cannot span processes"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
    // A bad job description is still reported as such (read without connecting too).
    std::env::set_var("WEFT_RANK", "2");
    match Runtime::builder().build().map(|_| ()) {
        Err(Error::InvalidArgument(m)) => assert!(m.contains("rank must be below size"), "{m}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // A job of one on the embedded provider still builds.
    for var in ["WEFT_RANK", "WEFT_SIZE", "WEFT_KVS", "WEFT_TOKEN"] {
        std::env::remove_var(var);
    }
    let rt = Runtime::builder().build().unwrap();
    assert_eq!((rt.rank(), rt.size()), (0, 1));
}
