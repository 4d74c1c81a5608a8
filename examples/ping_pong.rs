//! Ping-pong between two ranks (two threads) on the embedded provider; prints the
//! round-trip latency per message size.
//!
//! `cargo run --release -p weft-examples --example ping_pong`
use std::time::Instant;

use weft::{Runtime, Source, Tag};

fn main() -> Result<(), weft::Error> {
    let ranks = Runtime::builder().build_local(2)?;
    for size in [0usize, 8, 1024, 64 * 1024, 1 << 20] {
        let iters = if size >= 1 << 20 { 50 } else { 2000 };
        let rtt = std::thread::scope(|s| -> Result<f64, weft::Error> {
            let echo = s.spawn(|| -> Result<(), weft::Error> {
                let c = ranks[1].world();
                let mut buf = Vec::<u8>::with_capacity(size);
                for _ in 0..iters {
                    let (b, st) = c.recv(buf, Source::Rank(0), Tag::Is(1))?;
                    assert_eq!(st.bytes, size);
                    buf = c.send(b, 0, 2)?.0;
                }
                Ok(())
            });
            let c = ranks[0].world();
            let mut out = vec![1u8; size];
            let mut inb = Vec::<u8>::with_capacity(size);
            let t0 = Instant::now();
            for _ in 0..iters {
                out = c.send(out, 1, 1)?.0;
                inb = c.recv(inb, 1u32, 2)?.0;
            }
            let el = t0.elapsed().as_secs_f64();
            echo.join().expect("echo thread")?;
            Ok(el / iters as f64)
        })?;
        println!("{size:>8} B  round trip {:>9.2} us", rtt * 1e6);
    }
    Ok(())
}
