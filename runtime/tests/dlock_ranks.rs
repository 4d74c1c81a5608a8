//! Many in-process ranks under the distributed locks: 1,024 ranks of the default
//! configuration (CRIs: one per core) fit in 2 GiB while each takes RMA-MCS and RMA-RW.
//! (Each test measures the whole process's peak RSS: one runs per process, the large one
//! only when asked for.)

use weft::dlock::{Levels, RmaMcs, RmaRw, Thresholds};
use weft::rma::{Op, Window};
use weft::Runtime;

mod common;

/// A field of `/proc/self/status` in KiB (`VmHWM`, `VmRSS`).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with(field)).expect("the field");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of KiB")
}

/// `ranks` ranks of the default configuration, each with a thread of its own that runs
/// another (as `weft-bench dlock` does), each take RMA-MCS, then RMA-RW as a writer and
/// as a reader, `rounds` times, counting into a word on rank 0; returns the process's
/// peak RSS in MiB, printing it at each step.
fn ranks_take_the_locks(ranks: u32, rounds: u64) -> u64 {
    let step =
        |what: &str| eprintln!("{ranks} ranks, {what}: RSS {} MiB, peak {} MiB", status_kib("VmRSS:") / 1024, status_kib("VmHWM:") / 1024);
    let rts = Runtime::builder().env(false).build_local(ranks).unwrap();
    step("built");
    std::thread::scope(|s| {
        for rt in &rts {
            s.spawn(move || {
                let c = rt.world();
                let levels = Levels::simulated(&[16, 8]);
                let mcs = RmaMcs::new(c, &levels, &Thresholds::default()).unwrap();
                let rw = RmaRw::new(c, &levels, &Thresholds::default()).unwrap();
                let w: Window<'_, u64> = c.window(1).unwrap();
                c.barrier().unwrap();
                if c.rank() == 0 {
                    step("locks made");
                }
                std::thread::scope(|s| {
                    s.spawn(|| {
                        for _ in 0..rounds {
                            let g = mcs.lock().unwrap();
                            w.fetch_and_op(0, 0, 1, Op::Sum).unwrap();
                            g.unlock().unwrap();
                            let g = rw.write().unwrap();
                            w.fetch_and_op(0, 0, 1, Op::Sum).unwrap();
                            g.unlock().unwrap();
                            let g = rw.read().unwrap();
                            w.get(0, 0, &mut [0]).unwrap();
                            g.unlock().unwrap();
                        }
                    });
                });
                c.barrier().unwrap();
                let mut v = [0u64];
                w.get(0, 0, &mut v).unwrap();
                assert_eq!(v[0], 2 * rounds * u64::from(c.size()));
                c.barrier().unwrap();
            });
        }
    });
    step("done");
    status_kib("VmHWM:") / 1024
}

/// 1,024 ranks in 2 GiB. About 15 s in release on 2 cores, minutes in debug: run with
/// `cargo test --release -p weft --test dlock_ranks -- --ignored`.
#[test]
#[ignore = "a minute or more in debug; run with --release -- --ignored"]
fn a_thousand_ranks_take_the_locks_in_2_gib() {
    let peak = common::within(600, "1,024 ranks", || ranks_take_the_locks(1024, 2));
    assert!(peak < 2048, "1,024 ranks peaked at {peak} MiB");
}

/// 128 ranks in their share of 2 GiB (256 MiB), in CI's time.
#[test]
fn a_hundred_ranks_take_the_locks_in_their_share_of_2_gib() {
    let peak = common::within(120, "128 ranks", || ranks_take_the_locks(128, 2));
    assert!(peak < 256, "128 ranks peaked at {peak} MiB");
}
