//! A ping-pong whose receiver completes its posted receives through a sync object
//! (`query_bulk`) versus testing every request — seed 003 Table 4.1 (PaRSEC on
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

/// Takes completed receive `idx`, checks it, answers, reposts.
fn answer<'c>(c: &'c Communicator, reqs: &mut [Request<'c, Vec<u8>>], idx: usize, size: usize) -> Result<(), weft::Error> {
    let (buf, st) = reqs[idx].take().ok_or(weft::Error::Cancelled)??;
    assert!(st.bytes == size && buf.iter().all(|&b| b == idx as u8), "ping payload");
    let mut s = c.isend(vec![idx as u8; size], 0, WINDOW as i32)?;
    let mut idle = Idle(0);
    while !s.test() {
        idle.snooze();
    }
    reqs[idx] = post(c, idx, buf)?;
    Ok(())
}

fn run(size: usize, iters: usize, use_sync: bool) -> Result<f64, weft::Error> {
    let ranks = Runtime::builder().workers(0).build_local(2)?;
    std::thread::scope(|s| {
        let pinger = s.spawn(|| -> Result<f64, weft::Error> {
            let c = ranks[0].world();
            let t0 = Instant::now();
            for i in 0..iters {
                let tag = i % WINDOW;
                let mut r = c.irecv(Vec::<u8>::with_capacity(size), 1u32, WINDOW as i32)?;
                let mut s = c.isend(vec![tag as u8; size], 1, tag as i32)?;
                let mut idle = Idle(0);
                while !s.test() {
                    idle.snooze();
                }
                let mut idle = Idle(0);
                while !r.test() {
                    idle.snooze();
                }
                let (pong, _) = r.take().ok_or(weft::Error::Cancelled)??;
                assert!(pong.len() == size && pong.iter().all(|&b| b == tag as u8), "pong payload");
            }
            Ok(t0.elapsed().as_secs_f64())
        });
        let c = ranks[1].world();
        let mut reqs = (0..WINDOW).map(|t| post(c, t, Vec::with_capacity(size))).collect::<Result<Vec<_>, _>>()?;
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
                    answer(c, &mut reqs, comp.data, size)?;
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
                        answer(c, &mut reqs, idx, size)?;
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
