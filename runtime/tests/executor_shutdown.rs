//! Pool shutdown and idle cost (own test binary, one test: they count the threads and CPU
//! time of the whole process), and the `WEFT_WORKERS` variable.

use std::time::{Duration, Instant};

use weft::{JoinError, Runtime};

/// Names of this process's threads (Linux).
fn worker_threads() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return 0 };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
        .filter(|c| c.starts_with("weft-worker"))
        .count()
}

fn cpu_seconds() -> f64 {
    // SAFETY: `getrusage` writes the struct it is given; zeroed is a valid `rusage`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(rc, 0);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[test]
fn shutdown_and_idle() {
    // 0. The worker count: builder, environment, bad values (here, in a one-test binary,
    //    because it sets an environment variable).
    let rt = Runtime::builder().env(false).workers(3).build().unwrap();
    assert_eq!(rt.config().workers, 3);
    drop(rt);
    assert!(Runtime::builder().env(false).workers(100_000).build().is_err());
    let mut c = weft::Config::default();
    std::env::set_var("WEFT_WORKERS", "notanumber");
    assert!(c.apply_env().is_err());
    std::env::set_var("WEFT_WORKERS", "2");
    c.apply_env().unwrap();
    std::env::remove_var("WEFT_WORKERS");
    assert_eq!(c.workers, 2);

    // 1. Idle: a 2-worker runtime (pool started) that has nothing to do uses < 2% of a core.
    {
        let ranks = Runtime::builder().env(false).workers(2).build_local(2).unwrap();
        for r in &ranks {
            assert_eq!(r.block_on(r.spawn(async { 1 })).unwrap(), 1);
        }
        std::thread::sleep(Duration::from_millis(300));
        let (c0, w0) = (cpu_seconds(), Instant::now());
        std::thread::sleep(Duration::from_secs(3));
        let used = (cpu_seconds() - c0) / w0.elapsed().as_secs_f64();
        eprintln!("idle: {:.3}% of a core (2 ranks x 2 workers)", used * 100.0);
        assert!(used < 0.02, "idle runtime used {:.2}% of a core", used * 100.0);
        // Idle workers still wake for network activity: a message between two pool tasks.
        let (a, b) = (ranks[0].world().clone(), ranks[1].world().clone());
        let r = ranks[1].spawn(async move { b.irecv(Vec::<u8>::with_capacity(8), 0u32, 0).unwrap().await.unwrap().0 });
        ranks[0].block_on(async move { a.isend(b"ok".to_vec(), 1, 0).unwrap().await.unwrap() });
        assert_eq!(ranks[1].block_on(r).unwrap(), b"ok");
    }
    // 2. Dropping the last handle joins the workers: none left.
    let t0 = Instant::now();
    while worker_threads() > 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(worker_threads(), 0, "worker threads leaked");

    // 3. Tasks still queued at shutdown are cancelled, not leaked or run half-way.
    let rt = Runtime::builder().env(false).workers(1).build().unwrap();
    let gate = std::sync::Arc::new(std::sync::Barrier::new(2));
    let g2 = gate.clone();
    // Occupy the only worker until after the runtime is dropped... briefly.
    let blocker = rt.spawn(async move {
        g2.wait();
        std::thread::sleep(Duration::from_millis(100));
    });
    gate.wait();
    let queued = rt.spawn(async { 7 });
    drop(rt);
    let res = futures::executor::block_on(queued);
    assert!(matches!(res, Err(JoinError::Cancelled) | Ok(7)), "{res:?}");
    assert!(futures::executor::block_on(blocker).is_ok());
    assert_eq!(worker_threads(), 0);

    // 4. Dropping the runtime while a task waits for a message that never comes: no hang, no
    //    thread left (the pending task is dropped with the rank's state).
    {
        let ranks = Runtime::builder().env(false).workers(2).build_local(2).unwrap();
        let c1 = ranks[1].world().clone();
        let waiting = ranks[1].spawn(async move { c1.irecv(Vec::<u8>::with_capacity(8), 0u32, 5).unwrap().await.map(|(b, _)| b.len()) });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!waiting.is_finished());
        let t0 = Instant::now();
        drop(ranks);
        assert!(t0.elapsed() < Duration::from_secs(5));
        drop(waiting);
    }
    let t0 = Instant::now();
    while worker_threads() > 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(worker_threads(), 0, "worker threads left after dropping a runtime with a waiting task");
}
