//! Pool shutdown and idle cost (own test binary, one test: they count the threads and CPU
//! time of the whole process), and the `WEFT_WORKERS` variable.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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

/// Waits until `flag` is set (failing after a generous bound: a hang guard).
fn wait_until(flag: &AtomicBool, what: &str) {
    let t0 = Instant::now();
    while !flag.load(Ordering::SeqCst) {
        assert!(t0.elapsed() < Duration::from_secs(30), "{what}: not after 30 s");
        std::thread::yield_now();
    }
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

    // 3. Tasks still queued at shutdown are cancelled, not leaked or run half-way. With no
    //    pool threads a spawned task runs only on a thread that helps (none here): it is
    //    certainly still queued when the last handle drops.
    let rt = Runtime::builder().env(false).workers(0).build().unwrap();
    let queued = rt.spawn(async { 7 });
    drop(rt);
    let res = futures::executor::block_on(queued);
    assert!(matches!(res, Err(JoinError::Cancelled)), "{res:?}");
    //    A task running on the only worker when the last handle drops is not cut short:
    //    the shutdown waits for it (here it ends once the drop has begun).
    let rt = Runtime::builder().env(false).workers(1).build().unwrap();
    let started = Arc::new(AtomicBool::new(false));
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let s2 = started.clone();
    let running = rt.spawn(async move {
        s2.store(true, Ordering::SeqCst);
        wait.recv().unwrap();
        5
    });
    wait_until(&started, "the task starts on the worker");
    let dropper = std::thread::spawn(move || drop(rt));
    go.send(()).unwrap();
    dropper.join().unwrap();
    assert_eq!(futures::executor::block_on(running).unwrap(), 5);
    assert_eq!(worker_threads(), 0);

    // 4. Dropping the runtime while a task waits for a message that never comes: no hang, no
    //    thread left (the pending task is dropped with the rank's state).
    {
        let ranks = Runtime::builder().env(false).workers(2).build_local(2).unwrap();
        let c1 = ranks[1].world().clone();
        let posted = Arc::new(AtomicBool::new(false));
        let p2 = posted.clone();
        let waiting = ranks[1].spawn(async move {
            let r = c1.irecv(Vec::<u8>::with_capacity(8), 0u32, 5).unwrap();
            p2.store(true, Ordering::SeqCst);
            r.await.map(|(b, _)| b.len())
        });
        wait_until(&posted, "the task posts its receive");
        assert!(!waiting.is_finished(), "nothing was sent: the receive cannot have completed");
        // The waiting rank first (its peer still there: no loss fails the receive). A
        // generous hang guard, not a timing: the drop must not wait for the message.
        let [r0, r1]: [Runtime; 2] = ranks.try_into().unwrap();
        let t0 = Instant::now();
        drop(r1);
        assert!(t0.elapsed() < Duration::from_secs(30), "dropping the rank hung for {:?}", t0.elapsed());
        let res = futures::executor::block_on(waiting);
        assert!(matches!(res, Err(JoinError::Cancelled)), "{res:?}");
        drop(r0);
    }
    let t0 = Instant::now();
    while worker_threads() > 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(worker_threads(), 0, "worker threads left after dropping a runtime with a waiting task");
}
