//! Flow control with more senders than inbox slots: seven in-process ranks send to one
//! whose inbox holds two frames, eager and rendezvous messages interleaved, all started at
//! once, in every progress mode; the receiver takes them with `Source::Any`/`Tag::Any` and
//! each source's messages must come whole and in send order. Bounded: a hang fails.

mod common;

use common::within;
use weft::{wait_all, ProgressMode, Runtime, Source, Tag};

/// Messages per sender.
const PER: u32 = 60;

/// Message `i` of rank `from`: every third above the 64-byte eager threshold.
fn message(from: u32, i: u32) -> Vec<u8> {
    let len = if i % 3 == 2 { 200 + i as usize } else { 8 + (i as usize % 20) };
    let mut v = vec![(from * 7 + i) as u8; len];
    v[..4].copy_from_slice(&from.to_le_bytes());
    v[4..8].copy_from_slice(&i.to_le_bytes());
    v
}

#[test]
fn more_senders_than_inbox_slots_lose_and_reorder_nothing() {
    for mode in [ProgressMode::Global, ProgressMode::Owner, ProgressMode::Concurrent] {
        within(120, &format!("{mode:?}"), move || {
            let ranks = Runtime::builder().env(false).progress(mode).cris(1).inbox_capacity(2).eager_threshold(64).build_local(8).unwrap();
            let n = ranks.len() as u32;
            std::thread::scope(|s| {
                for rt in &ranks[1..] {
                    s.spawn(move || {
                        let c = rt.world();
                        let mut sends: Vec<_> = (0..PER).map(|i| c.isend(message(c.rank(), i), 0, 3).unwrap()).collect();
                        wait_all(&mut sends).unwrap();
                    });
                }
                let c = ranks[0].world();
                let mut next = vec![0u32; n as usize];
                for _ in 0..PER * (n - 1) {
                    let (got, st) = c.recv(Vec::<u8>::with_capacity(300), Source::Any, Tag::Any).unwrap();
                    let from = st.source;
                    assert!((1..n).contains(&from), "{mode:?}: a message from rank {from}");
                    let i = next[from as usize];
                    assert_eq!(got, message(from, i), "{mode:?}: message {i} of rank {from}");
                    assert_eq!((st.tag, st.bytes), (3, got.len()));
                    next[from as usize] += 1;
                }
                assert!(next[1..].iter().all(|&k| k == PER), "{mode:?}: {next:?}");
            });
        });
    }
}
