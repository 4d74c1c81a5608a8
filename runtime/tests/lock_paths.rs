//! The runtime's path locks: every protocol on every path carries real traffic in
//! every progress mode, the per-path counters see it, and bad names are errors.

use weft::lock::{FlatKind, LockKind, LockOptions, LockPath, LockStatsSnapshot};
use weft::{MatchingMode, ProgressMode, Request, Runtime};

const MODES: [ProgressMode; 3] = [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent];

/// 4 sender threads on rank 0, 4 receiver threads on rank 1 (oversubscribed on small
/// machines), 64 tagged messages each; checks content and order.
fn traffic(rts: &[Runtime], what: &str) {
    std::thread::scope(|s| {
        for t in 0..4i32 {
            s.spawn(move || {
                let c = rts[0].world();
                let mut reqs: Vec<Request<'_, Vec<u8>>> = (0..64).map(|i| c.isend(vec![i as u8; 16], 1, t).unwrap()).collect();
                weft::wait_all(&mut reqs).unwrap();
            });
            s.spawn(move || {
                let c = rts[1].world();
                let mut reqs: Vec<_> = (0..64).map(|_| c.irecv(Vec::<u8>::with_capacity(16), 0u32, t).unwrap()).collect();
                weft::wait_all(&mut reqs).unwrap();
                for (i, r) in reqs.iter_mut().enumerate() {
                    assert_eq!(r.take().unwrap().unwrap().0, vec![i as u8; 16], "{what}");
                }
            });
        }
    });
}

fn kinds() -> Vec<LockKind> {
    let mut v: Vec<LockKind> = FlatKind::ALL.iter().map(|&k| LockKind::Flat(k)).collect();
    v.extend([LockKind::P_HMCS_MCS, LockKind::P_MCS_MCS, LockKind::P_TICKET_TICKET]);
    v
}

#[test]
fn every_protocol_on_every_path_in_every_mode() {
    for kind in kinds() {
        for mode in MODES {
            let rts = Runtime::builder()
                .env(false)
                .progress(mode)
                .cris(2)
                .lock(LockPath::Progress, kind)
                .lock(LockPath::Cri, kind)
                .lock(LockPath::Matching, kind)
                .lock_stats(true)
                .build_local(2)
                .unwrap();
            assert_eq!(rts[0].config().locks.cri, kind);
            traffic(&rts, &format!("{kind} {mode}"));
            let c = rts[1].counters();
            assert_eq!(c.messages_received, 4 * 64, "{kind} {mode}");
            // Every frame was polled under a CRI lock (progress path) and matched under a
            // matching lock (progress path, always productive; one acquisition per batch of
            // arrivals of one communicator); each receive was posted under it (main path).
            assert!(c.cri_lock.productive >= 1, "{kind} {mode}: {c:?}");
            assert!(c.matching_lock.productive >= 1, "{kind} {mode}: {c:?}");
            assert!(c.matching_lock.acquisitions > 4 * 64, "{kind} {mode}: posts + arrivals: {c:?}");
            let sent = rts[0].counters();
            assert!(sent.cri_lock.acquisitions >= 4 * 64, "{kind} {mode}: one CRI acquisition per send: {sent:?}");
            if mode == ProgressMode::Global {
                // Posting and progress both went through the one critical section.
                assert!(sent.progress_lock.acquisitions >= 4 * 64, "{kind}: {sent:?}");
                assert!(c.progress_lock.acquisitions >= 4 * 64, "{kind}: {c:?}");
                assert!(c.progress_lock.productive >= 1, "{kind}: {c:?}");
            } else {
                assert_eq!(sent.progress_lock.acquisitions, 0, "{kind} {mode}: no global lock outside Global mode");
            }
        }
    }
}

#[test]
fn global_matching_lock_is_counted() {
    let rts = Runtime::builder()
        .env(false)
        .progress(ProgressMode::Owner)
        .matching(MatchingMode::Global)
        .lock(LockPath::Matching, LockKind::Flat(FlatKind::Mcs))
        .lock_stats(true)
        .build_local(2)
        .unwrap();
    traffic(&rts, "global matching");
    let c = rts[1].counters();
    assert!(c.matching_lock.acquisitions > 4 * 64 && c.matching_lock.productive >= 1, "posts + arrivals: {c:?}");
}

/// Lock statistics are kept only when asked for (an acquisition then writes no counter):
/// off by default, every path's counts stay zero while messages flow; on, every path counts,
/// under the default protocol (`tas_park`), `parking_lot` and a queue lock alike.
#[test]
fn lock_counts_only_when_asked() {
    for kind in [LockKind::Flat(FlatKind::TasPark), LockKind::Flat(FlatKind::ParkingLot), LockKind::Flat(FlatKind::Mcs)] {
        for stats in [None, Some(false), Some(true)] {
            let mut b =
                Runtime::builder().env(false).progress(ProgressMode::Global).lock(LockPath::Cri, kind).lock(LockPath::Matching, kind);
            if let Some(on) = stats {
                b = b.lock_stats(on);
            }
            let rts = b.build_local(2).unwrap();
            assert_eq!(rts[0].config().lock_stats, stats == Some(true));
            traffic(&rts, &format!("{kind} lock_stats {stats:?}"));
            let c = rts[1].counters();
            assert_eq!(c.messages_received, 4 * 64, "{kind} {stats:?}: the message counts are kept either way");
            let paths = [c.progress_lock, c.cri_lock, c.matching_lock];
            if stats == Some(true) {
                assert!(paths.iter().all(|p| p.acquisitions > 0 && p.productive > 0), "{kind}: {c:?}");
            } else {
                assert!(paths.iter().all(|p| *p == LockStatsSnapshot::default()), "{kind} {stats:?}: {c:?}");
            }
        }
    }
}

#[test]
fn lock_timing_measures_time_held() {
    let rts = Runtime::builder().env(false).progress(ProgressMode::Global).lock_timing(true).build_local(2).unwrap();
    traffic(&rts, "timed");
    let c = rts[1].counters();
    assert!(c.progress_lock.held_ns > 0 && c.cri_lock.held_ns > 0, "{c:?}");
    let untimed = Runtime::builder().env(false).progress(ProgressMode::Global).build_local(2).unwrap();
    traffic(&untimed, "untimed");
    assert_eq!(untimed[1].counters().progress_lock.held_ns, 0);
}

#[test]
fn lock_names_from_the_environment() {
    // One test touches these variables (tests run in threads of one process).
    std::env::set_var("WEFT_LOCK_PROGRESS", "p-hmcs-mcs");
    std::env::set_var("WEFT_LOCK_CRI", "ticket");
    let c = Runtime::builder().resolve().unwrap();
    assert_eq!(c.locks.progress, LockKind::P_HMCS_MCS);
    assert_eq!(c.locks.cri, LockKind::Flat(FlatKind::Ticket));
    std::env::set_var("WEFT_LOCK_MATCHING", "mcs-but-faster");
    let err = Runtime::builder().resolve().unwrap_err();
    assert!(err.to_string().contains("WEFT_LOCK_MATCHING"), "{err}");
    assert!(Runtime::builder().build().is_err());
    // The builder alone, without the environment, is unaffected.
    assert!(Runtime::builder().env(false).build().is_ok());
    for v in ["WEFT_LOCK_PROGRESS", "WEFT_LOCK_CRI", "WEFT_LOCK_MATCHING"] {
        std::env::remove_var(v);
    }

    // The HMCS hand-off threshold.
    std::env::set_var(LockOptions::HMCS_THRESHOLD_VAR, " 8 ");
    let mut opts = LockOptions::default();
    opts.apply_env().unwrap();
    assert_eq!(opts.hmcs_threshold, 8);
    assert!(Runtime::builder().lock(LockPath::Progress, LockKind::P_HMCS_MCS).build().is_ok());
    for bad in ["0", "-3", "many", "4294967297"] {
        std::env::set_var(LockOptions::HMCS_THRESHOLD_VAR, bad);
        let mut opts = LockOptions::default();
        let err = opts.apply_env().unwrap_err();
        assert!(matches!(err, weft::Error::InvalidArgument(_)), "{bad}: {err:?}");
        assert!(err.to_string().contains("WEFT_LOCK_HMCS_THRESHOLD"), "{err}");
        assert_eq!(opts.hmcs_threshold, weft::lock::DEFAULT_HMCS_THRESHOLD);
        let Err(err) = Runtime::builder().build() else { panic!("{bad}: a bad threshold must fail the build") };
        assert!(err.to_string().contains("WEFT_LOCK_HMCS_THRESHOLD"), "{err}");
        assert!(Runtime::builder().env(false).build().is_ok());
    }
    std::env::remove_var(LockOptions::HMCS_THRESHOLD_VAR);
}
