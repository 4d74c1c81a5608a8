//! `wait_any` over a receive that matches and one that never does, dropped right after: many
//! threads of two in-process ranks do it at once, in every progress mode. Each wait must
//! return the matched receive. A receive that another thread's progress completed between
//! the wait's last test and its attach was skipped, and the wait then waited for the other
//! receive only, for ever (`Concurrent`: about one run in four). The scenario runs on a
//! thread of its own and fails after a generous bound instead of hanging the suite.

mod common;

use common::within;

use weft::{wait_any, Assignment, ProgressMode, Runtime, Source, Tag};

/// Threads per rank.
const THREADS: i32 = 4;
/// Rounds per thread.
const ROUNDS: i32 = 200;

/// One rank's threads: per round a data receive from the peer, an "abort" receive from any
/// source that nothing ever sends, the send the peer's data receive waits for, and a
/// `wait_any` over the two receives, which must report the data receive. Both are dropped
/// (the abort receive cancelled) before the next round.
fn rank_rounds(rt: &Runtime, peer: u32) {
    std::thread::scope(|s| {
        for t in 0..THREADS {
            s.spawn(move || {
                let comm = rt.world();
                for i in 0..ROUNDS {
                    let tag = t * 100_000 + i;
                    let data = comm.irecv(Vec::<u8>::with_capacity(1), Source::Rank(peer), Tag::Is(tag)).unwrap();
                    let abort = comm.irecv(Vec::<u8>::with_capacity(1), Source::Any, Tag::Is(999_999 - t)).unwrap();
                    comm.send(vec![1u8], peer, tag).unwrap();
                    let mut reqs = [data, abort];
                    assert_eq!(wait_any(&mut reqs), Some(0), "thread {t} round {i}: the data receive completes, the abort one never");
                    let [mut data, _abort] = reqs;
                    let (buf, st) = data.take().expect("the data receive completed").unwrap();
                    assert_eq!((buf, st.source, st.tag), (vec![1u8], peer, tag));
                }
            });
        }
    });
}

/// Both ranks' rounds on two in-process ranks built by `builder`, failing as `what` after
/// 120 s.
fn run(builder: weft::Builder, what: &str) {
    within(120, what, move || {
        let ranks = builder.build_local(2).unwrap();
        std::thread::scope(|s| {
            for (me, rt) in ranks.iter().enumerate() {
                s.spawn(move || rank_rounds(rt, 1 - me as u32));
            }
        });
    });
}

#[test]
fn wait_any_with_an_unmatched_receive_returns_the_matched_one_in_every_mode() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        run(Runtime::builder().env(false).progress(mode), &format!("{mode:?}"));
    }
}

#[test]
fn wait_any_with_an_unmatched_receive_under_more_cris_and_round_robin() {
    run(Runtime::builder().env(false).progress(ProgressMode::Concurrent).cris(8), "Concurrent, 8 CRIs");
    run(Runtime::builder().env(false).progress(ProgressMode::Concurrent).assignment(Assignment::RoundRobin), "Concurrent, round robin");
}
