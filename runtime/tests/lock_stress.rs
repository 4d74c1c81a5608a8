//! Stress tests of every lock protocol: mutual exclusion under oversubscription (8-16 threads
//! on however many cores), priority-lock starvation freedom, timeouts, names and counters.
//!
//! Mutual exclusion is checked with a non-atomic counter (lost updates show as a wrong total)
//! and an `inside` flag (two holders at once trip the assertion). Sizes are small so that
//! each protocol runs in about a second on 2 cores.
#![cfg(not(loom))]

use std::cell::UnsafeCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use weft::lock::{
    Acquisition, Clh, Counted, DynLock, DynNode, FlatKind, Hmcs, LockKind, LockOptions, LockPath, Mcs, McsNode, Mutex, ParkingLot,
    Priority, RawLock, RawPriorityLock, RawTimedLock, StdLock, Tas, TasPark, Ticket, Topology,
};

/// Data touched only under the lock.
struct Shared {
    counter: UnsafeCell<u64>,
    inside: AtomicBool,
}

// SAFETY: `counter` is only accessed while holding the lock under test; a broken lock is
// exactly what the test detects.
unsafe impl Sync for Shared {}

impl Shared {
    fn new() -> Self {
        Shared { counter: UnsafeCell::new(0), inside: AtomicBool::new(false) }
    }

    /// The critical section: flag, non-atomic read-modify-write with a pause in between.
    fn critical(&self, i: usize) {
        assert!(!self.inside.swap(true, Ordering::Relaxed), "two threads inside the critical section");
        // SAFETY: we hold the lock (that is the property under test).
        let v = unsafe { *self.counter.get() };
        if i % 64 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
        // SAFETY: as above.
        unsafe { *self.counter.get() = v + 1 };
        self.inside.store(false, Ordering::Relaxed);
    }

    fn total(&self) -> u64 {
        // SAFETY: called after every thread was joined.
        unsafe { *self.counter.get() }
    }
}

/// Which acquisition a thread uses.
#[derive(Clone, Copy)]
enum Class {
    High,
    Low,
}

/// `threads` threads, each `iters` acquisitions (every third through `try_lock` first);
/// thread `t` uses `class(t)` and a node made by `node(t)`, reused across its acquisitions.
fn exclusion<L: RawPriorityLock>(
    lock: &L,
    threads: usize,
    iters: usize,
    class: impl Fn(usize) -> Class + Sync,
    node: impl Fn(usize) -> L::Node + Sync,
) {
    let shared = Shared::new();
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let (shared, class, node) = (&shared, &class, &node);
            s.spawn(move || {
                let n = pin!(node(t));
                let n = n.as_ref();
                for i in 0..iters {
                    match class(t) {
                        Class::High => {
                            if i % 3 != 0 || !lock.try_lock_high(n) {
                                lock.lock_high(n);
                            }
                            shared.critical(i);
                            // SAFETY: acquired just above with `n`.
                            unsafe { lock.unlock_high(n) };
                        }
                        Class::Low => {
                            if i % 3 != 0 || !lock.try_lock_low(n) {
                                lock.lock_low(n);
                            }
                            shared.critical(i);
                            // SAFETY: acquired just above with `n`.
                            unsafe { lock.unlock_low(n) };
                        }
                    }
                }
            });
        }
    });
    assert_eq!(shared.total(), (threads * iters) as u64, "lost updates: mutual exclusion broken");
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
}

fn flat<L: RawPriorityLock>(lock: L) {
    exclusion(&lock, 8, 1500, |_| Class::High, |_| L::Node::default());
    exclusion(&lock, 16, 300, |_| Class::High, |_| L::Node::default());
}

fn mixed<L: RawPriorityLock>(lock: L) {
    exclusion(&lock, 8, 1000, |t| if t % 2 == 0 { Class::High } else { Class::Low }, |_| L::Node::default());
    exclusion(&lock, 12, 300, |t| if t % 3 == 0 { Class::Low } else { Class::High }, |_| L::Node::default());
}

#[test]
fn tas_exclusion() {
    flat(Tas::new());
}

#[test]
fn tas_park_exclusion() {
    flat(TasPark::new());
    // The release's fence kept, as where the process did not register for `membarrier`.
    assert!(!TasPark::with_fence(true).is_fenceless());
    flat(TasPark::with_fence(true));
    mixed(TasPark::new());
}

/// CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer for the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// A `TasPark` waiter on a lock held for long sleeps instead of spinning or yielding (with
/// more threads than cores, a spinning waiter takes the holder's core), and the release wakes
/// it: waiting 300 ms costs the waiter a small part of that in CPU time.
#[test]
fn tas_park_waiter_sleeps_and_is_woken() {
    for lock in [TasPark::new(), TasPark::with_fence(true)] {
        let lock = Arc::new(lock);
        lock.lock(pin!(()).as_ref());
        let l2 = lock.clone();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let before = thread_cpu_time();
            l2.lock(pin!(()).as_ref());
            let used = thread_cpu_time() - before;
            // SAFETY: acquired just above.
            unsafe { l2.unlock(pin!(()).as_ref()) };
            let _ = tx.send(used);
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(rx.try_recv().is_err(), "acquired a held lock");
        // SAFETY: acquired above.
        unsafe { lock.unlock(pin!(()).as_ref()) };
        let used = rx.recv_timeout(Duration::from_secs(20)).expect("the waiter was not woken by the release");
        assert!(used < Duration::from_millis(30), "the waiter used {used:?} of CPU time waiting 300 ms");
        assert!(!lock.is_locked());
    }
}

#[test]
fn ticket_exclusion() {
    flat(Ticket::new());
}

#[test]
fn mcs_exclusion() {
    flat(Mcs::new());
}

#[test]
fn clh_exclusion() {
    flat(Clh::new());
}

#[test]
fn hmcs_exclusion_detected_topology() {
    flat(Hmcs::new());
}

/// An emulated 8-CPU, 3-level machine (cores of 2, sockets of 4): threads enter at different
/// leaves through `McsNode::with_cpu`, so cohort passing, going up and `ACQUIRE_PARENT` all
/// happen. Threshold 2 forces frequent level changes; 64 long cohorts.
#[test]
fn hmcs_exclusion_three_levels() {
    let topo = Topology::from_levels(8, vec![vec![0, 0, 1, 1, 2, 2, 3, 3], vec![0, 0, 0, 0, 1, 1, 1, 1]]);
    assert_eq!(topo.depth(), 3);
    for threshold in [1, 2, 64] {
        let lock = Hmcs::with_topology(&topo, threshold);
        assert_eq!(lock.depth(), 3);
        exclusion(&lock, 8, 1000, |_| Class::High, McsNode::with_cpu);
        exclusion(&lock, 16, 300, |_| Class::High, |t| McsNode::with_cpu(t * 3));
    }
}

#[test]
fn std_and_parking_lot_exclusion() {
    flat(StdLock::new());
    flat(ParkingLot::new());
}

#[test]
fn priority_exclusion() {
    mixed(Priority::<Mcs, Mcs>::default());
    mixed(Priority::<Ticket, Ticket>::default());
    mixed(Priority::<Hmcs, Mcs>::default());
    mixed(Priority::<Tas, Clh>::default());
}

#[test]
fn priority_exclusion_three_level_hmcs() {
    let topo = Topology::from_levels(8, vec![vec![0, 0, 1, 1, 2, 2, 3, 3], vec![0, 0, 0, 0, 1, 1, 1, 1]]);
    let lock = DynLock::with_options(LockKind::P_HMCS_MCS, &LockOptions { topology: Some(topo), hmcs_threshold: 2 });
    exclusion(&lock, 12, 400, |t| if t % 3 == 0 { Class::Low } else { Class::High }, DynNode::with_cpu);
}

#[test]
fn dynlock_every_kind_exclusion() {
    let mut kinds: Vec<LockKind> = FlatKind::ALL.iter().map(|&k| LockKind::Flat(k)).collect();
    kinds.extend([LockKind::P_HMCS_MCS, LockKind::P_MCS_MCS, LockKind::P_TICKET_TICKET]);
    kinds.push("p-clh-tas".parse().unwrap());
    kinds.push("p-std-parking_lot".parse().unwrap());
    for k in kinds {
        let lock = DynLock::new(k);
        assert_eq!(lock.kind(), k);
        exclusion(&lock, 8, 300, |t| if t % 2 == 0 { Class::High } else { Class::Low }, |_| DynNode::default());
    }
}

/// The safe `Mutex`, through both the closure API and guards.
#[test]
fn mutex_api_counts_exactly() {
    fn run<L: RawPriorityLock + Default>() {
        let m: Mutex<L, u64> = Mutex::new(0);
        std::thread::scope(|s| {
            for t in 0..8 {
                let m = &m;
                s.spawn(move || {
                    let mut node = pin!(L::Node::default());
                    for i in 0..300 {
                        match (t + i) % 4 {
                            0 => m.with_lock(|v| *v += 1),
                            1 => m.with_lock_low(|v| *v += 1),
                            2 => *m.lock_with(node.as_mut()) += 1,
                            _ => loop {
                                if m.try_with_lock(|v| *v += 1).is_some() {
                                    break;
                                }
                                std::thread::yield_now();
                            },
                        }
                    }
                });
            }
        });
        assert_eq!(m.into_inner(), 8 * 300);
    }
    run::<Tas>();
    run::<Ticket>();
    run::<Mcs>();
    run::<Clh>();
    run::<Hmcs>();
    run::<Priority<Hmcs, Mcs>>();
    run::<ParkingLot>();
    run::<StdLock>();
    run::<TasPark>();
}

#[test]
fn mutex_releases_on_panic() {
    let m: Mutex<Mcs, u32> = Mutex::new(0);
    let r = catch_unwind(AssertUnwindSafe(|| m.with_lock(|_| panic!("inside"))));
    assert!(r.is_err());
    assert_eq!(m.try_with_lock(|v| *v), Some(0), "lock left held after a panic");
}

#[test]
fn node_reuse_while_in_use_panics_without_corrupting() {
    let lock = Mcs::new();
    let node = pin!(McsNode::new());
    lock.lock(node.as_ref());
    let r = catch_unwind(AssertUnwindSafe(|| Mcs::new().lock(node.as_ref())));
    assert!(r.is_err(), "a busy node was accepted by a second lock");
    // SAFETY: acquired above with `node`.
    unsafe { lock.unlock(node.as_ref()) };
    assert!(!lock.is_locked());
}

/// Low-priority waiters get in once high-priority work stops ([Amer 2019, Fig. 5]: the last
/// high-priority holder must reopen the filter).
fn no_starvation<L: RawPriorityLock + 'static>(lock: Arc<L>) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut highs = Vec::new();
    for _ in 0..4 {
        let (lock, stop) = (lock.clone(), stop.clone());
        highs.push(std::thread::spawn(move || {
            let n = pin!(L::Node::default());
            let n = n.as_ref();
            let mut k = 0u64;
            while !stop.load(Ordering::Relaxed) {
                lock.lock_high(n);
                k += 1;
                // SAFETY: acquired just above with `n`.
                unsafe { lock.unlock_high(n) };
            }
            k
        }));
    }
    let (tx, rx) = mpsc::channel();
    for _ in 0..2 {
        let (lock, tx) = (lock.clone(), tx.clone());
        std::thread::spawn(move || {
            let n = pin!(L::Node::default());
            let n = n.as_ref();
            for _ in 0..50 {
                lock.lock_low(n);
                // SAFETY: acquired just above with `n`.
                unsafe { lock.unlock_low(n) };
            }
            let _ = tx.send(());
        });
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let high_total: u64 = highs.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(high_total > 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        rx.recv_timeout(left).expect("low-priority waiters starved after high-priority work stopped");
    }
}

#[test]
fn priority_low_not_starved() {
    no_starvation(Arc::new(Priority::<Mcs, Mcs>::default()));
    no_starvation(Arc::new(Priority::<Hmcs, Mcs>::default()));
    no_starvation(Arc::new(Priority::<Ticket, Ticket>::default()));
    no_starvation(Arc::new(Priority::<Tas, Mcs>::default()));
    no_starvation(Arc::new(DynLock::new(LockKind::P_HMCS_MCS)));
}

/// `try_lock_for` gives up after about the timeout while another thread holds the lock, and
/// succeeds at once when the lock is free.
fn times_out<L: RawTimedLock + 'static>(lock: L) {
    let lock = Arc::new(lock);
    let node = pin!(L::Node::default());
    lock.lock(node.as_ref());
    let l2 = lock.clone();
    let waited = std::thread::spawn(move || {
        let n = pin!(L::Node::default());
        let t = Instant::now();
        let got = l2.try_lock_for(n.as_ref(), Duration::from_millis(60));
        if got {
            // SAFETY: acquired just above with `n`.
            unsafe { l2.unlock(n.as_ref()) };
        }
        (got, t.elapsed())
    })
    .join()
    .unwrap();
    assert!(!waited.0, "acquired a held lock");
    assert!(waited.1 >= Duration::from_millis(60), "gave up early: {:?}", waited.1);
    // A hang guard, not a timing (a loaded machine may deschedule the waiter for long).
    assert!(waited.1 < Duration::from_secs(30), "never gave up: {:?}", waited.1);
    // SAFETY: acquired above with `node`.
    unsafe { lock.unlock(node.as_ref()) };
    let t = Instant::now();
    assert!(lock.try_lock_for(node.as_ref(), Duration::from_secs(60)));
    assert!(t.elapsed() < Duration::from_secs(30), "a free lock taken after {:?}", t.elapsed());
    // SAFETY: acquired just above with `node`.
    unsafe { lock.unlock(node.as_ref()) };
}

#[test]
fn try_lock_for_times_out() {
    times_out(Tas::new());
    times_out(TasPark::new());
    times_out(Ticket::new());
    times_out(Mcs::new());
    times_out(Clh::new());
    times_out(Hmcs::new());
    times_out(ParkingLot::new());
    times_out(StdLock::new());
    times_out(Priority::<Hmcs, Mcs>::default());
    times_out(DynLock::new(LockKind::P_MCS_MCS));
    times_out(DynLock::new(LockKind::Flat(FlatKind::Tas)));
}

/// `try_lock_for(Duration::MAX)` on a held lock waits for the holder (no deadline can be
/// represented that far out; computing one used to panic with "overflow when adding duration
/// to instant") and acquires once the holder releases.
fn waits_without_deadline<L: RawTimedLock + Send + Sync + 'static>(lock: L, what: &str) {
    let lock = Arc::new(lock);
    let node = pin!(L::Node::default());
    lock.lock(node.as_ref());
    let l2 = lock.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let n = pin!(L::Node::default());
        let got = catch_unwind(AssertUnwindSafe(|| l2.try_lock_for(n.as_ref(), Duration::MAX)));
        if let Ok(true) = got {
            // SAFETY: acquired just above with `n`.
            unsafe { l2.unlock(n.as_ref()) };
        }
        let _ = tx.send(got.map_err(|_| ()));
    });
    // Let the waiter reach its slow path before the holder lets go.
    std::thread::sleep(Duration::from_millis(30));
    // SAFETY: acquired above with `node`.
    unsafe { lock.unlock(node.as_ref()) };
    match rx.recv_timeout(Duration::from_secs(20)) {
        Ok(Ok(got)) => assert!(got, "{what}: gave up on an unbounded timeout"),
        Ok(Err(())) => panic!("{what}: try_lock_for(Duration::MAX) panicked"),
        Err(_) => panic!("{what}: try_lock_for(Duration::MAX) did not acquire a released lock in 20 s"),
    }
}

#[test]
fn try_lock_for_duration_max_waits_for_the_holder() {
    waits_without_deadline(Tas::new(), "tas");
    waits_without_deadline(TasPark::new(), "tas_park");
    waits_without_deadline(Ticket::new(), "ticket");
    waits_without_deadline(Mcs::new(), "mcs");
    waits_without_deadline(Clh::new(), "clh");
    waits_without_deadline(Hmcs::new(), "hmcs");
    waits_without_deadline(ParkingLot::new(), "parking_lot");
    waits_without_deadline(StdLock::new(), "std");
    waits_without_deadline(Priority::<Mcs, Mcs>::default(), "p-mcs-mcs");
    waits_without_deadline(Priority::<Hmcs, Mcs>::default(), "p-hmcs-mcs");
    waits_without_deadline(Counted::timed(Priority::<Mcs, Mcs>::default()), "counted p-mcs-mcs");
    let mut kinds: Vec<LockKind> = FlatKind::ALL.iter().map(|&k| LockKind::Flat(k)).collect();
    kinds.extend([LockKind::P_HMCS_MCS, LockKind::P_MCS_MCS, LockKind::P_TICKET_TICKET]);
    for k in kinds {
        waits_without_deadline(DynLock::new(k), &format!("dyn {k}"));
    }
    // And through the safe `Mutex`.
    let m: Arc<Mutex<Tas, u8>> = Arc::new(Mutex::new(7));
    let g = m.lock();
    let m2 = m.clone();
    let t = std::thread::spawn(move || m2.try_with_lock_for(Duration::MAX, |v| *v));
    std::thread::sleep(Duration::from_millis(30));
    drop(g);
    assert_eq!(t.join().expect("Mutex::try_with_lock_for(Duration::MAX) panicked"), Some(7));
}

#[test]
fn mutex_try_with_lock_for() {
    let m: Mutex<Tas, u8> = Mutex::new(7);
    let g = m.lock();
    std::thread::scope(|s| {
        s.spawn(|| assert_eq!(m.try_with_lock_for(Duration::from_millis(20), |v| *v), None));
    });
    drop(g);
    assert_eq!(m.try_with_lock_for(Duration::from_millis(20), |v| *v), Some(7));
}

#[test]
fn lock_kind_names_round_trip() {
    for k in FlatKind::ALL {
        let kind = LockKind::Flat(k);
        assert_eq!(kind.to_string().parse::<LockKind>(), Ok(kind));
        for l in FlatKind::ALL {
            let p = LockKind::Priority { high: k, low: l };
            assert_eq!(p.to_string().parse::<LockKind>(), Ok(p), "{p}");
        }
    }
    assert_eq!(" P-HMCS-MCS ".parse::<LockKind>(), Ok(LockKind::P_HMCS_MCS));
    assert_eq!("parking-lot".parse::<LockKind>(), Ok(LockKind::Flat(FlatKind::ParkingLot)));
    assert_eq!("p-tas-park-mcs".parse::<LockKind>(), Ok(LockKind::Priority { high: FlatKind::TasPark, low: FlatKind::Mcs }));
    assert_eq!("p-parking_lot-mcs".parse::<LockKind>(), Ok(LockKind::Priority { high: FlatKind::ParkingLot, low: FlatKind::Mcs }));
    assert!(LockKind::P_MCS_MCS.is_priority());
}

#[test]
fn lock_kind_parse_errors() {
    for bad in ["", "mcs2", "spin", "p-mcs", "p-mcs-", "p--mcs", "p-mcs-foo", "q-mcs-mcs", "p-p-mcs-mcs-mcs"] {
        let e = bad.parse::<LockKind>().expect_err(bad);
        assert_eq!(e.input(), bad);
        let msg = e.to_string();
        assert!(msg.contains(&format!("{bad:?}")), "{msg}");
        assert!(msg.contains("expected one of tas, ticket, mcs, clh, hmcs, std, parking_lot"), "{msg}");
        assert!(msg.contains("p-hmcs-mcs"), "{msg}");
    }
}

#[test]
fn lock_kind_from_env() {
    // Variables unique to this test: tests of this binary run in parallel.
    let var = "WEFT_LOCK_TEST_FROM_ENV_8317";
    std::env::remove_var(var);
    assert_eq!(LockKind::from_env(var), Ok(None));
    std::env::set_var(var, "p-mcs-mcs");
    assert_eq!(LockKind::from_env(var), Ok(Some(LockKind::P_MCS_MCS)));
    std::env::set_var(var, "fast");
    let e = LockKind::from_env(var).unwrap_err();
    assert!(e.to_string().starts_with(var), "{e}");
    std::env::set_var(var, " ");
    assert_eq!(LockKind::from_env(var), Ok(None));
    std::env::remove_var(var);
    assert_eq!(LockPath::Progress.env_var(), "WEFT_LOCK_PROGRESS");
    assert_eq!(LockPath::Cri.env_var(), "WEFT_LOCK_CRI");
    assert_eq!(LockPath::Matching.env_var(), "WEFT_LOCK_MATCHING");
}

#[test]
fn counted_counts_every_acquisition() {
    let lock = Counted::timed(Priority::<Mcs, Mcs>::default());
    exclusion(&lock, 8, 500, |t| if t % 2 == 0 { Class::High } else { Class::Low }, |_| Default::default());
    let s = lock.stats().snapshot();
    assert_eq!(s.acquisitions, 8 * 500);
    assert!(s.contended <= s.acquisitions);
    assert!(s.held_ns > 0);

    let one = Counted::new(Mcs::new());
    let n = pin!(<Counted<Mcs> as RawLock>::Node::default());
    for i in 0..10 {
        one.lock(n.as_ref());
        one.record_progress(if i < 3 { Acquisition::Productive } else { Acquisition::Unproductive });
        // SAFETY: acquired just above with `n`.
        unsafe { one.unlock(n.as_ref()) };
    }
    let s = one.stats().snapshot();
    assert_eq!((s.acquisitions, s.contended, s.held_ns, s.productive, s.unproductive), (10, 0, 0, 3, 7));
    assert!((s.efficiency() - 0.3).abs() < 1e-9);
}

#[test]
fn counted_sees_contention() {
    let lock = Counted::new(Ticket::new());
    exclusion(&lock, 8, 500, |_| Class::High, |_| Default::default());
    let s = lock.stats().snapshot();
    assert_eq!(s.acquisitions, 8 * 500);
    assert!(s.contended > 0, "8 threads on one lock never contended? {s:?}");
}

#[test]
fn no_waiters_sees_a_linked_successor() {
    let lock = Arc::new(Mcs::new());
    let node = pin!(McsNode::new());
    lock.lock(node.as_ref());
    assert!(lock.no_waiters(node.as_ref()));
    let l2 = lock.clone();
    let waiter = std::thread::spawn(move || {
        let n = pin!(McsNode::new());
        l2.lock(n.as_ref());
        // SAFETY: acquired just above.
        unsafe { l2.unlock(n.as_ref()) };
    });
    let t = Instant::now();
    while lock.no_waiters(node.as_ref()) {
        assert!(t.elapsed() < Duration::from_secs(10), "successor never linked");
        std::thread::yield_now();
    }
    // SAFETY: acquired above with `node`.
    unsafe { lock.unlock(node.as_ref()) };
    waiter.join().unwrap();
}
