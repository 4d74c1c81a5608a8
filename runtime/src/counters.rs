//! Software counters ([Patinyasakdikul 2019, §5.4]: out-of-sequence messages, match time; [Amer 2019, §3.2]:
//! productive vs unproductive progress). Per-message counts live beside the lock that
//! already serializes their writers (a CRI's, a communicator's matching lock), so counting
//! adds no shared-counter traffic; only rare events use shared atomics.

use crate::config::MatchingMode;
use crate::engine::Engine;
use crate::lock::path::add;
use crate::lock::LockStatsSnapshot;
use crate::loom::sync::atomic::Ordering;

/// A point-in-time copy of a runtime's counters (`Runtime::counters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Frames sent (eager messages and rendezvous announcements).
    pub messages_sent: u64,
    /// Frames received and handled by progress.
    pub messages_received: u64,
    /// Arrivals that found no posted receive.
    pub unexpected: u64,
    /// Arrivals ahead of their sequence number.
    pub out_of_sequence: u64,
    /// Nanoseconds in matching (only with `match_timing`).
    pub match_nanos: u64,
    /// The path locks' counts below are kept only with lock statistics on
    /// ([`Builder::lock_stats`](crate::Builder::lock_stats) or `lock_timing`); zero otherwise.
    ///
    /// The progress path lock of `Global` mode ([Amer 2019, §3.2]): acquisitions, contended
    /// acquisitions, time held (with lock timing on), and productive vs unproductive passes
    /// of waiters through the progress engine.
    pub progress_lock: LockStatsSnapshot,
    /// Every CRI lock, summed: sends (main path) and polls (progress path; productive when
    /// a frame was handled).
    pub cri_lock: LockStatsSnapshot,
    /// Every matching lock, summed: posts and probes (main path) and arrivals (progress
    /// path, always productive).
    pub matching_lock: LockStatsSnapshot,
    /// Times a waiter parked its thread.
    pub parks: u64,
    /// Parks that ended by a notification (its completion, a frame, a hand-off of
    /// ownership, a task for a pool worker) rather than by the time limit; without pool
    /// workers `parks == wakes + park_timeouts`.
    pub wakes: u64,
    /// Parks that ended by the 50 ms safety limit rather than a notification. Idle waits
    /// (nothing to receive for a while) end this way normally; a count growing while
    /// messages flow would point at a missed notification.
    pub park_timeouts: u64,
    /// Sends refused by a full inbox at least once (flow control: retried with progress,
    /// then queued for progress to send; `isend` does not wait longer than that).
    pub flow_control_waits: u64,
}

/// Reads every counter of `s` (briefly taking each CRI and matching lock).
pub(crate) fn snapshot(s: &Engine) -> Snapshot {
    let mut out = Snapshot::default();
    for cri in s.cris.iter() {
        let c = cri.lock.high(|c| c.counters);
        out.messages_sent += c.sent;
        out.messages_received += c.received;
        add(&mut out.cri_lock, cri.lock.stats());
    }
    // Freed communicators' share, then the live ones'.
    let (freed, freed_lock) = *s.contexts.freed_counters.lock();
    let mut fold = |m: crate::matching::MatchCounters| {
        out.unexpected += m.unexpected;
        out.out_of_sequence += m.out_of_sequence;
        out.match_nanos += m.match_nanos;
    };
    fold(freed);
    {
        let _gate = s.contexts.gate.read();
        for comm in s.installed() {
            for part in 0..s.matching_parts(comm) {
                fold(s.with_matching(comm, part, |m| m.counters));
                if s.config.matching == MatchingMode::PerComm {
                    add(&mut out.matching_lock, comm.matching[part].stats());
                }
            }
        }
    }
    if s.config.matching == MatchingMode::PerComm {
        add(&mut out.matching_lock, freed_lock);
    }
    if s.config.matching == MatchingMode::Global {
        out.matching_lock = s.contexts.global_match.stats();
    }
    out.progress_lock = s.progress_lock.stats();
    out.messages_sent += s.counters.deferred_sent.load(Ordering::Relaxed);
    out.parks = s.counters.parks.load(Ordering::Relaxed);
    out.wakes = s.counters.wakes.load(Ordering::Relaxed);
    out.park_timeouts = s.counters.park_timeouts.load(Ordering::Relaxed);
    out.flow_control_waits = s.counters.flow_control_waits.load(Ordering::Relaxed);
    out
}
