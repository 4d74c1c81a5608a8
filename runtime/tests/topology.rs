//! The hwloc topology reader (feature `hwloc`): it agrees with sysfs on this machine, backs
//! `Topology::detect`, and an HMCS built over it keeps mutual exclusion.
#![cfg(feature = "hwloc")]
#![cfg(not(loom))]

use std::cell::UnsafeCell;
use std::path::Path;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};

use weft::lock::{DynLock, DynNode, FlatKind, Hmcs, LockKind, LockOptions, McsNode, RawLock, Topology};

/// Every CPU has a group below `groups(level)` at every level, the root has one group, and
/// groups nest: CPUs together at level `l` are together at every coarser level.
fn assert_valid(t: &Topology) {
    assert!(t.cpus() >= 1 && t.depth() >= 1, "{t:?}");
    assert_eq!(t.groups(t.depth() - 1), 1, "{t:?}");
    for l in 0..t.depth() {
        let n = t.groups(l);
        assert!(n >= 1 && n <= t.cpus(), "{t:?}");
        let mut seen = vec![false; n];
        for cpu in 0..t.cpus() {
            let g = t.group_of(l, cpu);
            assert!(g < n, "cpu {cpu} level {l}: {t:?}");
            seen[g] = true;
        }
        assert!(seen.iter().all(|&s| s), "level {l} has an empty group: {t:?}");
        if l + 1 < t.depth() {
            assert!(n > t.groups(l + 1), "levels are strictly coarser upwards: {t:?}");
            for a in 0..t.cpus() {
                for b in 0..t.cpus() {
                    if t.group_of(l, a) == t.group_of(l, b) {
                        assert_eq!(t.group_of(l + 1, a), t.group_of(l + 1, b), "not nested: {t:?}");
                    }
                }
            }
        }
    }
}

/// Whether `a` and `b` put the same CPUs together at their finest level.
fn same_finest_grouping(a: &Topology, b: &Topology) -> bool {
    (0..a.cpus()).all(|x| (0..a.cpus()).all(|y| (a.group_of(0, x) == a.group_of(0, y)) == (b.group_of(0, x) == b.group_of(0, y))))
}

#[test]
fn hwloc_agrees_with_sysfs() {
    let hw = Topology::from_hwloc().expect("hwloc loads this machine's topology");
    assert_valid(&hw);
    let Ok(sys) = Topology::from_sysfs(Path::new("/sys/devices/system/cpu")) else {
        // Not Linux, or sysfs not mounted: nothing to compare with.
        eprintln!("sysfs unreadable; only the hwloc topology was checked: {hw:?}");
        return;
    };
    assert_eq!(hw.cpus(), sys.cpus(), "hwloc {hw:?} vs sysfs {sys:?}");
    assert!(same_finest_grouping(&hw, &sys), "hwloc {hw:?} vs sysfs {sys:?}");
    // Every CPU the process may run on is covered by both (CPU ids are OS ids).
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(hw.cpus() >= online, "{hw:?} covers fewer CPUs than the {online} available");
}

#[test]
fn detect_uses_a_valid_topology_and_is_stable() {
    let t = Topology::detect();
    assert_valid(&t);
    assert_eq!(t, Topology::from_hwloc().expect("hwloc loads"), "detect() prefers hwloc when it loads");
    assert_eq!(Topology::detect(), t);
}

/// Data touched only under the lock.
struct Shared {
    counter: UnsafeCell<u64>,
    inside: AtomicBool,
}

// SAFETY: `counter` is only accessed while holding the lock under test; a broken lock is
// exactly what the test detects.
unsafe impl Sync for Shared {}

/// `threads` threads each take `lock` `iters` times (every third through `try_lock` first),
/// with the node made by `node(t)`; returns the number of completed critical sections.
fn hammer<L: RawLock>(lock: &L, threads: usize, iters: usize, node: impl Fn(usize) -> L::Node + Sync) -> u64 {
    let shared = Shared { counter: UnsafeCell::new(0), inside: AtomicBool::new(false) };
    std::thread::scope(|s| {
        for t in 0..threads {
            let (shared, node) = (&shared, &node);
            s.spawn(move || {
                let n = pin!(node(t));
                let n = n.as_ref();
                for i in 0..iters {
                    if i % 3 != 0 || !lock.try_lock(n) {
                        lock.lock(n);
                    }
                    assert!(!shared.inside.swap(true, Ordering::Relaxed), "two threads inside");
                    // SAFETY: we hold the lock (the property under test).
                    let v = unsafe { *shared.counter.get() };
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                    // SAFETY: as above.
                    unsafe { *shared.counter.get() = v + 1 };
                    shared.inside.store(false, Ordering::Relaxed);
                    // SAFETY: acquired above with `n`.
                    unsafe { lock.unlock(n) };
                }
            });
        }
    });
    // SAFETY: every thread was joined.
    unsafe { *shared.counter.get() }
}

#[test]
fn hmcs_over_hwloc_topology_excludes() {
    let topo = Topology::from_hwloc().expect("hwloc loads");
    for threshold in [1, 4, 64] {
        let lock = Hmcs::with_topology(&topo, threshold);
        assert_eq!(lock.depth(), topo.depth());
        // Threads on their real CPUs, then spread over every leaf of the topology.
        assert_eq!(hammer(&lock, 8, 1000, |_| McsNode::default()), 8000, "threshold {threshold}");
        let cpus = topo.cpus();
        assert_eq!(hammer(&lock, 8, 500, |t| McsNode::with_cpu(t % cpus)), 4000, "threshold {threshold}");
    }
    // Through DynLock, as the runtime builds its path locks.
    let opts = LockOptions { topology: Some(topo), hmcs_threshold: 2 };
    let lock = DynLock::with_options(LockKind::Flat(FlatKind::Hmcs), &opts);
    assert_eq!(hammer(&lock, 6, 800, |_| DynNode::default()), 4800);
}

/// Marker of the child's result line in [`synthetic_machines`].
const CHILD_MARK: &str = "weft-synthetic-topology: ";

/// Run by [`synthetic_machines`] in a child process with `HWLOC_SYNTHETIC` set (hwloc then
/// describes an imaginary machine): prints the topology read, then checks HMCS exclusion with
/// threads entering at every leaf of it.
#[test]
#[ignore = "run by synthetic_machines in a child process with HWLOC_SYNTHETIC set"]
fn synthetic_child() {
    assert!(std::env::var_os("HWLOC_SYNTHETIC").is_some(), "run through synthetic_machines");
    let topo = Topology::from_hwloc().expect("hwloc loads the synthetic topology");
    println!("{CHILD_MARK}{topo:?}");
    assert_valid(&topo);
    let lock = Hmcs::with_topology(&topo, 2);
    let cpus = topo.cpus();
    assert_eq!(hammer(&lock, 8, 500, |t| McsNode::with_cpu(t * 5 % cpus)), 4000);
}

/// hwloc's synthetic machines: levels come out finest first, nested, without duplicates, with
/// NUMA nodes placed by the CPUs they serve (below a package-wide L3, or as the package).
#[test]
fn synthetic_machines() {
    let n = |per: usize, cpus: usize| (0..cpus).map(|c| c / per).collect::<Vec<_>>();
    let cases: [(&str, Topology); 5] = [
        // 2 packages x 2 cores x 2 PUs.
        ("pack:2 core:2 pu:2", Topology::from_levels(8, vec![n(2, 8), n(4, 8)])),
        // A second L3 per package: core, L3, package.
        ("pack:2 l3:2 core:2 pu:2", Topology::from_levels(16, vec![n(2, 16), n(4, 16), n(8, 16)])),
        // Sub-NUMA clusters under a package-wide L3: core, NUMA, package (L3 = package).
        ("pack:2 l3:1 numa:2 core:2 pu:2", Topology::from_levels(16, vec![n(2, 16), n(4, 16), n(8, 16)])),
        // NUMA above packages, one package each: the two coincide.
        ("numa:2 pack:1 core:2 pu:1", Topology::from_levels(4, vec![n(1, 4), n(2, 4)])),
        // One package, per-core L2, shared L3: a single level below the root.
        ("pack:1 l3:1 l2:4 core:1 pu:1", Topology::from_levels(4, vec![n(1, 4)])),
    ];
    let exe = std::env::current_exe().expect("test binary path");
    for (desc, want) in cases {
        let out = std::process::Command::new(&exe)
            .args(["synthetic_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("HWLOC_SYNTHETIC", desc)
            .output()
            .expect("run the child test");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{desc}: child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let got = stdout
            .lines()
            .find_map(|l| l.split_once(CHILD_MARK).map(|(_, r)| r))
            .unwrap_or_else(|| panic!("{desc}: no result in\n{stdout}"));
        assert_eq!(got, format!("{want:?}"), "{desc}");
    }
}
