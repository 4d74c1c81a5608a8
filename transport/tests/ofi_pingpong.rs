//! Ping-pong latency over the weft libfabric layer, two endpoints in one process, one thread
//! alternating between them (no second core needed). Ignored by default; run with
//!
//! ```text
//! cargo test --release -p weft-transport --features ofi --test ofi_pingpong -- --ignored --nocapture
//! ```
//!
//! It verifies every payload, and prints the one-way latency (round trip / 2) per size.
#![cfg(feature = "ofi")]

mod ofi_common;

use std::time::{Duration, Instant};

use ofi_common::{pair, pattern, Pair, Which, DEADLINE};

const ITERS: usize = 20_000;
const WARMUP: usize = 1_000;

/// One message from `from` to the other side, whose receive is already posted (ctx 1 on B,
/// 2 on A): inject when the size allows, else send and wait for the send completion too.
fn hop(p: &mut Pair, from: Which, data: &[u8], tag: u64) {
    let (to_side, rctx) = match from {
        Which::A => (Which::B, 1),
        Which::B => (Which::A, 2),
    };
    let dest = match from {
        Which::A => p.to_b,
        Which::B => p.to_a,
    };
    let inject = data.len() <= p.a.ep.inject_size();
    if inject {
        p.post_retry("tinject", |p| {
            let ep = match from {
                Which::A => &p.a.ep,
                Which::B => &p.b.ep,
            };
            ep.tinject(data, dest, tag).expect("tinject")
        });
    } else {
        p.post_retry("tsend", |p| {
            let ep = match from {
                Which::A => &p.a.ep,
                Which::B => &p.b.ep,
            };
            // SAFETY: `data` outlives the send-completion wait just below.
            unsafe { ep.tsend(data, None, dest, tag, 3) }.expect("tsend")
        });
    }
    let c = p.wait_ok(to_side, rctx, "ping-pong receive");
    assert_eq!(c.len, data.len());
    if !inject {
        p.wait_ok(from, 3, "ping-pong send");
    }
}

fn run(provider: &str, size: usize) -> Option<Duration> {
    let mut p = pair(provider)?;
    let data = pattern(size, 1);
    let mut buf_a = vec![0u8; size];
    let mut buf_b = vec![0u8; size];
    let start = Instant::now();
    let mut timed_from = None;
    for i in 0..WARMUP + ITERS {
        if i == WARMUP {
            timed_from = Some(Instant::now());
        }
        assert!(start.elapsed() < DEADLINE * 6, "ping-pong on {provider} too slow");
        // Post both receives for this round trip first.
        p.post_retry("trecv b", |p| {
            // SAFETY: `buf_b` is not touched until its completion is read in `hop`.
            unsafe { p.b.ep.trecv(&mut buf_b, None, None, 10, 0, 1) }.expect("trecv")
        });
        p.post_retry("trecv a", |p| {
            // SAFETY: `buf_a` is not touched until its completion is read in `hop`.
            unsafe { p.a.ep.trecv(&mut buf_a, None, None, 11, 0, 2) }.expect("trecv")
        });
        hop(&mut p, Which::A, &data, 10);
        hop(&mut p, Which::B, &data, 11);
        if i % 4096 == 0 {
            assert!(buf_a == data && buf_b == data, "payload mismatch at iteration {i}");
        }
    }
    let elapsed = timed_from.expect("warm-up ran").elapsed();
    assert!(buf_a == data && buf_b == data, "payload mismatch");
    Some(elapsed / (2 * ITERS as u32))
}

#[test]
#[ignore = "latency measurement; run with --ignored --nocapture (release)"]
fn one_way_latency() {
    let only = std::env::var("WEFT_PINGPONG_PROVIDER").ok();
    for provider in ["shm", "tcp;ofi_rxm"].into_iter().filter(|p| only.as_deref().map_or(true, |o| o == *p)) {
        for size in [8usize, 64, 1024, 16384] {
            if let Some(lat) = run(provider, size) {
                println!("LATENCY {provider:<12} {size:>6} B  one-way {:>8.2} us  ({ITERS} round trips)", lat.as_secs_f64() * 1e6);
            }
        }
    }
}
