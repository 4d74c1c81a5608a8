//! A partitioned receive dropped in the middle of a round, after it lent its buffer to the
//! send (the round's clear to write): the buffer stays allocated while the send may still
//! write partitions straight into it, and is freed once every partition's message of the
//! round has arrived, or once the sender is lost (a global allocator watches the free).

use std::time::{Duration, Instant};

use weft::{PartitionedRecv, PartitionedSend, Runtime};

#[path = "common/counting.rs"]
mod counting;

const P: usize = 4;
/// 4,000 bytes a partition: above the eager threshold of 512, so written straight from the
/// second round on.
const PER: usize = 1000;

fn ranks() -> Vec<(String, Vec<Runtime>)> {
    let b = || Runtime::builder().env(false).eager_threshold(512);
    #[cfg_attr(not(feature = "ofi"), allow(unused_mut))]
    let mut worlds = vec![("embedded".to_string(), b().build_local(2).unwrap())];
    #[cfg(feature = "ofi")]
    worlds.push(("shm".into(), b().provider(weft::Provider::Shm).build_local(2).unwrap()));
    worlds
}

/// Steps of progress on `rt` until the watched buffer is freed, within 20 s.
fn until_freed(rt: &Runtime, what: &str) {
    let t0 = Instant::now();
    while !counting::freed() {
        assert!(t0.elapsed() < Duration::from_secs(20), "{what}: the dropped receive's buffer was never freed");
        if !rt.progress() {
            std::thread::yield_now();
        }
    }
}

/// One whole round, then the start of the next with partitions 0 and 1 written straight
/// and arrived: the receive is returned, lending its buffer (watched) to the send.
fn lend<'c>(rts: &'c [Runtime], send: &mut PartitionedSend<'c, u32>, what: &str, tag: i32) -> PartitionedRecv<'c, u32> {
    let buf = vec![0u32; P * PER];
    let at = buf.as_ptr();
    let mut recv = rts[1].world().precv_init(buf, P, 0, tag).unwrap();
    for round in 0..2u32 {
        let before = rts[0].counters().messages_received;
        recv.start().unwrap();
        send.start().unwrap();
        let parts = send.partitions().unwrap();
        let last = if round == 0 { P } else { 2 };
        for mut p in parts.into_iter().take(last) {
            let i = p.index();
            p.as_mut_slice().fill(round * 100 + i as u32);
            p.ready().unwrap();
            let t0 = Instant::now();
            while !recv.parrived(i) {
                assert!(t0.elapsed() < Duration::from_secs(20), "{what}: round {round}: partition {i} never arrived");
            }
        }
        if round == 0 {
            send.wait().unwrap();
            recv.wait().unwrap();
        } else {
            // Only the round's clear to write reached the send: the partitions went straight.
            let frames = rts[0].counters().messages_received - before;
            assert!(frames <= 1, "{what}: the sending rank received {frames} frames, not one clear to write");
        }
    }
    counting::watch(at);
    recv
}

/// One test: the allocator watches one buffer at a time.
#[test]
fn a_receive_dropped_mid_round_frees_its_buffer_once_the_round_has_arrived_or_the_sender_is_lost() {
    for (what, mut rts) in ranks() {
        let mut send = rts[0].world().psend_init(vec![0u32; P * PER], P, 1, 9).unwrap();
        let recv = lend(&rts, &mut send, &what, 9);
        drop(recv);
        assert!(!counting::freed(), "{what}: freed while partitions 2 and 3 may still be written into it");
        // Written straight into the dropped receive's buffer, which is still there.
        for mut p in send.partitions().unwrap() {
            p.as_mut_slice().fill(7);
            p.ready().unwrap();
        }
        send.wait().unwrap();
        until_freed(&rts[1], &what);
        drop(send);

        // Again with another tag, the send dropped with partitions 2 and 3 unsent: the
        // buffer is freed once rank 0 is gone.
        let what = format!("{what}, sender lost");
        let mut send = rts[0].world().psend_init(vec![0u32; P * PER], P, 1, 10).unwrap();
        let recv = lend(&rts, &mut send, &what, 10);
        drop(send);
        drop(recv);
        assert!(!counting::freed(), "{what}: freed while the sender lives");
        drop(rts.remove(0));
        until_freed(&rts[0], &what);
    }
}
