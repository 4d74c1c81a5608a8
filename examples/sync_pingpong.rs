//! A ping-pong whose receiver completes its posted receives through a sync object
//! (`query_bulk`) versus testing every request — [Patinyasakdikul 2019, Table 4.1] (PaRSEC on
//! `MPIX_Sync`), at 400 B, 4 KB, 40 KB and 400 KB. The receiver keeps 32 receives posted,
//! one per tag, as a task runtime's communication thread keeps persistent receives.
//! (`weft-bench sync-pingpong` is the measured version with medians and CSV.)
//!
//! `cargo run --release -p weft-examples --example sync_pingpong`
use std::time::Instant;

use weft::{Communicator, Request, Runtime, Source, Tag};

const WINDOW: usize = 32;

/// Busy-polling with a conscience: spin, then give the core away once per idle pass (the
/// machine may have fewer cores than spinning threads). The same for both styles.
struct Idle(u32);

impl Idle {
    fn snooze(&mut self) {
        self.0 = self.0.saturating_add(1);
        if self.0 > 64 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn post(c: &Communicator, tag: usize, buf: Vec<u8>) -> Result<Request<'_, Vec<u8>>, weft::Error> {
    c.irecv(buf, Source::Rank(0), Tag::Is(tag as i32))
}

/// Checks a message: its length and its first and last bytes carry the tag (buffers are
/// reused, so this is cheap and still catches a mismatched or short message).
fn check(buf: &[u8], size: usize, tag: usize) {
    assert!(buf.len() == size && buf[0] == tag as u8 && buf[size - 1] == tag as u8, "payload of tag {tag}");
}

/// Takes completed receive `idx`, checks it, answers (with the ping's bytes), reposts.
fn answer<'c>(
    c: &'c Communicator,
    reqs: &mut [Request<'c, Vec<u8>>],
    idx: usize,
    size: usize,
    spare: &mut Vec<u8>,
) -> Result<(), weft::Error> {
    let (buf, _) = reqs[idx].take().ok_or(weft::Error::Cancelled)??;
    check(&buf, size, idx);
    let mut s = c.isend(buf, 0, WINDOW as i32)?;
    let mut idle = Idle(0);
    while !s.test() {
        idle.snooze();
    }
    let (buf, _) = s.take().ok_or(weft::Error::Cancelled)??;
    reqs[idx] = post(c, idx, std::mem::replace(spare, buf))?;
    Ok(())
}

fn run(size: usize, iters: usize, use_sync: bool) -> Result<f64, weft::Error> {
    let ranks = Runtime::builder().workers(0).build_local(2)?;
    std::thread::scope(|s| {
        let pinger = s.spawn(|| -> Result<f64, weft::Error> {
            let c = ranks[0].world();
            let mut pings: Vec<Vec<u8>> = (0..WINDOW).map(|t| vec![t as u8; size]).collect();
            let mut pong = Vec::with_capacity(size);
            let t0 = Instant::now();
            for i in 0..iters {
                let tag = i % WINDOW;
                let mut r = c.irecv(pong, 1u32, WINDOW as i32)?;
                let mut s = c.isend(std::mem::take(&mut pings[tag]), 1, tag as i32)?;
                let mut idle = Idle(0);
                while !s.test() {
                    idle.snooze();
                }
                pings[tag] = s.take().ok_or(weft::Error::Cancelled)??.0;
                let mut idle = Idle(0);
                while !r.test() {
                    idle.snooze();
                }
                let (p, _) = r.take().ok_or(weft::Error::Cancelled)??;
                check(&p, size, tag);
                pong = p;
            }
            Ok(t0.elapsed().as_secs_f64())
        });
        let c = ranks[1].world();
        let mut reqs = (0..WINDOW).map(|t| post(c, t, Vec::with_capacity(size))).collect::<Result<Vec<_>, _>>()?;
        let mut spare = Vec::with_capacity(size);
        let mut done = 0;
        if use_sync {
            let sync = ranks[1].sync_object::<usize>();
            for (i, r) in reqs.iter_mut().enumerate() {
                sync.attach(r, i).expect("fresh request");
            }
            let mut out = Vec::with_capacity(WINDOW);
            let mut idle = Idle(0);
            while done < iters {
                if sync.query_bulk(&mut out, WINDOW) == 0 {
                    if !ranks[1].progress() {
                        idle.snooze();
                    }
                    continue;
                }
                idle = Idle(0);
                for comp in out.drain(..) {
                    answer(c, &mut reqs, comp.data, size, &mut spare)?;
                    sync.attach(&mut reqs[comp.data], comp.data).expect("reposted request");
                    done += 1;
                }
            }
        } else {
            let mut idle = Idle(0);
            while done < iters {
                let before = done;
                for idx in 0..WINDOW {
                    if reqs[idx].test() {
                        answer(c, &mut reqs, idx, size, &mut spare)?;
                        done += 1;
                    }
                }
                if done == before {
                    idle.snooze();
                } else {
                    idle = Idle(0);
                }
            }
        }
        pinger.join().expect("pinger thread")
    })
}

fn main() -> Result<(), weft::Error> {
    println!("{:>8} {:>14} {:>14} {:>8}", "size", "sync msg/s", "testloop msg/s", "speedup");
    for size in [400, 4_000, 40_000, 400_000] {
        let iters = if size >= 400_000 { 500 } else { 5_000 };
        // Median of 3, alternating (the machine may be shared).
        let (mut s, mut t) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            s.push(run(size, iters, true)?);
            t.push(run(size, iters, false)?);
        }
        s.sort_by(f64::total_cmp);
        t.sort_by(f64::total_cmp);
        let (ts, tt) = (s[1], t[1]);
        let (rs, rt) = (2.0 * iters as f64 / ts, 2.0 * iters as f64 / tt);
        println!("{size:>8} {rs:>14.0} {rt:>14.0} {:>7.2}x", rs / rt);
    }
    Ok(())
}
