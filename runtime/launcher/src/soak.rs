//! `weft-selftest soak`: many threads per rank send random traffic to every rank at once and
//! every message is checked.
//!
//! Every sender thread `t` of rank `r` draws its messages from a generator seeded with
//! `(r, t)`: the destination (any rank, itself included), the communicator (one that keeps
//! send order, and one that allows overtaking), and the size (0 B to `--max-size`, most of
//! them small, some above the eager threshold, a few of several MiB: 90% up to 64 B, 9% up
//! to 16 KiB, 0.9% up to 256 KiB, 0.1% up to the largest). Since every rank can
//! replay every generator, each receiver knows exactly what it must get:
//!
//! * on the ordered communicator, receiver thread `u` takes the messages of tag `u` (those of
//!   the sender threads `t = u` of every rank) with `Source::Any`; each must be the next one
//!   that source's thread `u` sent this rank there, in send order (MPI's rule per source,
//!   communicator and tag): its size and every byte are compared with the replayed
//!   schedule, so a lost, duplicated, reordered or corrupted message is found, 0-byte ones
//!   included;
//! * on the overtaking communicator one thread takes everything with `Source::Any` and
//!   `Tag::Any`; order is free there, so each message carries its sender, thread and index
//!   in its first 16 bytes (those messages are at least 16 bytes), is compared byte for byte
//!   with what that index must hold, and must come exactly once.
//!
//! At the end every expected message must have come. The run is bounded: a watchdog fails
//! it after `--seconds`, saying how far each receiver got.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weft::{Communicator, Error, Request, Source, Tag};

/// What a soak run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Params {
    /// Messages each rank sends (over all its sender threads).
    pub(crate) messages: u64,
    /// Sender threads per rank, and receiver threads on the ordered communicator.
    pub(crate) threads: u32,
    /// Largest message.
    pub(crate) max_size: usize,
    /// Time limit of the whole run.
    pub(crate) seconds: u64,
}

/// The bytes carried in front of a message on the overtaking communicator.
const HEADER: usize = 16;

/// Sends a sender thread keeps in flight.
const SEND_WINDOW: usize = 8;

/// Receives a receiver thread keeps posted.
const RECV_WINDOW: usize = 4;

/// A small, fast generator (xorshift64*), the same on every rank.
#[derive(Clone, Debug)]
struct Rng(u64);

impl Rng {
    fn new(rank: u32, thread: u32) -> Rng {
        Rng((u64::from(rank) << 32 | u64::from(thread)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One message of a schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Msg {
    /// Index among its thread's messages.
    k: u64,
    dest: u32,
    /// On the overtaking communicator.
    overtaking: bool,
    len: usize,
}

/// The messages sender thread `t` of rank `r` sends, in order.
fn schedule(p: &Params, ranks: u32, r: u32, t: u32) -> impl Iterator<Item = Msg> {
    let per_thread = p.messages / u64::from(p.threads) + u64::from(u64::from(t) < p.messages % u64::from(p.threads));
    let mut rng = Rng::new(r, t);
    let max = p.max_size;
    (0..per_thread).map(move |k| {
        let dest = rng.below(u64::from(ranks)) as u32;
        let overtaking = rng.below(10) < 3;
        // 90% up to 64 B, 9% up to 16 KiB (eager), 0.9% up to 256 KiB, 0.1% up to the
        // largest: about 4 KiB a message on average.
        let class = rng.below(1000);
        let len = if class < 900 {
            rng.below(65) as usize
        } else if class < 990 {
            rng.below(16 << 10) as usize
        } else if class < 999 {
            rng.below(256 << 10) as usize
        } else {
            rng.below(max as u64 + 1) as usize
        };
        let len = len.min(max);
        // Messages on the overtaking communicator carry who they are.
        let len = if overtaking { len.max(HEADER) } else { len };
        Msg { k, dest, overtaking, len }
    })
}

/// Byte `i` of message `k` of thread `t` of rank `r` (past the header where there is one).
#[inline]
fn byte(r: u32, t: u32, k: u64, i: usize) -> u8 {
    (k.wrapping_mul(31).wrapping_add(i as u64 * 7).wrapping_add(u64::from(r) * 13 + u64::from(t) * 5)) as u8
}

fn fill(r: u32, t: u32, m: &Msg, buf: &mut Vec<u8>) {
    buf.clear();
    buf.extend((0..m.len).map(|i| byte(r, t, m.k, i)));
    if m.overtaking {
        buf[..4].copy_from_slice(&r.to_le_bytes());
        buf[4..8].copy_from_slice(&t.to_le_bytes());
        buf[8..16].copy_from_slice(&m.k.to_le_bytes());
    }
}

/// The first byte of `got` that differs from message `m` of thread `t` of rank `r`.
fn mismatch(r: u32, t: u32, m: &Msg, got: &[u8]) -> Option<usize> {
    let skip = if m.overtaking { HEADER } else { 0 };
    (skip..m.len).find(|&i| got[i] != byte(r, t, m.k, i))
}

/// Counts of one rank's run, for its summary line.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    /// Messages this rank sent.
    pub(crate) sent: u64,
    /// Messages it received.
    pub(crate) received: u64,
    /// Bytes it received.
    pub(crate) bytes: u64,
}

/// This rank's part of the soak: `ordered` keeps send order, `overtaking` allows
/// overtaking; both span the same ranks.
pub(crate) fn soak(ordered: &Communicator, overtaking: &Communicator, p: &Params) -> Result<Summary, String> {
    let (me, n) = (ordered.rank(), ordered.size());
    if !overtaking.allows_overtaking() || overtaking.size() != n || ordered.allows_overtaking() {
        return Err("soak needs an ordered and an overtaking communicator of the same ranks".into());
    }
    if p.threads == 0 || p.threads > 64 || p.max_size > 64 << 20 {
        return Err("soak takes 1..=64 threads and messages of at most 64 MiB".into());
    }
    // What this rank must receive: per ordered tag `u` and source, the messages in order;
    // on the overtaking communicator, how many from each (source, thread).
    let t_n = p.threads as usize;
    let mut expect: Vec<Vec<Vec<Msg>>> = vec![vec![Vec::new(); n as usize]; t_n];
    let mut expect_over = 0u64;
    let mut over_of: Vec<Vec<Vec<Option<Msg>>>> = vec![vec![Vec::new(); t_n]; n as usize];
    for r in 0..n {
        for t in 0..p.threads {
            for m in schedule(p, n, r, t).filter(|m| m.dest == me) {
                if m.overtaking {
                    let slot = &mut over_of[r as usize][t as usize];
                    if slot.len() <= m.k as usize {
                        slot.resize(m.k as usize + 1, None);
                    }
                    slot[m.k as usize] = Some(m);
                    expect_over += 1;
                } else {
                    expect[t as usize][r as usize].push(m);
                }
            }
        }
    }
    let progress: Arc<Vec<AtomicU64>> = Arc::new((0..=t_n).map(|_| AtomicU64::new(0)).collect());
    let wanted: Vec<u64> = expect.iter().map(|per| per.iter().map(|v| v.len() as u64).sum()).chain([expect_over]).collect();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watchdog = {
        let (progress, done, wanted) = (progress.clone(), done.clone(), wanted.clone());
        let limit = Duration::from_secs(p.seconds);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !done.load(Ordering::Acquire) {
                if t0.elapsed() > limit {
                    let got: Vec<String> =
                        progress.iter().zip(&wanted).map(|(g, w)| format!("{}/{w}", g.load(Ordering::Relaxed))).collect();
                    eprintln!(
                        "weft-selftest soak: FAILED on rank {me} of {n}: not done after {} s; received per receiver thread (ordered tags 0.., then overtaking): {}",
                        limit.as_secs(),
                        got.join(" ")
                    );
                    std::process::exit(1);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    };
    let result = std::thread::scope(|s| -> Result<Summary, String> {
        let senders: Vec<_> = (0..p.threads)
            .map(|t| {
                s.spawn(move || -> Result<u64, String> {
                    let mut inflight: std::collections::VecDeque<Request<'_, Vec<u8>>> = Default::default();
                    let mut spare: Vec<Vec<u8>> = Vec::new();
                    let mut sent = 0;
                    for m in schedule(p, n, me, t) {
                        if inflight.len() == SEND_WINDOW {
                            if let Some(r) = inflight.pop_front() {
                                spare.push(r.wait().map_err(|e| format!("a send of thread {t}: {e}"))?.0);
                            }
                        }
                        let mut buf = spare.pop().unwrap_or_default();
                        fill(me, t, &m, &mut buf);
                        let c = if m.overtaking { overtaking } else { ordered };
                        inflight.push_back(c.isend(buf, m.dest, t as i32).map_err(|e| format!("isend to {}: {e}", m.dest))?);
                        sent += 1;
                    }
                    for r in inflight {
                        r.wait().map_err(|e| format!("a send of thread {t}: {e}"))?;
                    }
                    Ok(sent)
                })
            })
            .collect();
        let receivers: Vec<_> = (0..=p.threads)
            .map(|u| {
                let (expect, over_of, progress) = (&expect, &over_of, &progress);
                let want = wanted[u as usize];
                s.spawn(move || -> Result<(u64, u64), String> {
                    let over = u == p.threads;
                    let (c, tag) = if over { (overtaking, Tag::Any) } else { (ordered, Tag::Is(u as i32)) };
                    let mut next = vec![0usize; n as usize];
                    let mut seen: Vec<Vec<Vec<bool>>> =
                        over_of.iter().map(|per| per.iter().map(|v| vec![false; v.len()]).collect()).collect();
                    let post = |buf: Vec<u8>| c.irecv(buf, Source::Any, tag).map_err(|e| format!("irecv: {e}"));
                    let mut posted: std::collections::VecDeque<Request<'_, Vec<u8>>> = Default::default();
                    let mut spare: Vec<Vec<u8>> = Vec::new();
                    let (mut got, mut bytes) = (0u64, 0u64);
                    while got < want {
                        while posted.len() < RECV_WINDOW && got + (posted.len() as u64) < want {
                            let mut buf = spare.pop().unwrap_or_else(|| Vec::with_capacity(p.max_size));
                            buf.clear();
                            posted.push_back(post(buf)?);
                        }
                        let Some(r) = posted.pop_front() else { break };
                        let (buf, st) = r.wait().map_err(|e| format!("receive {got} of {want}: {e}"))?;
                        let src = st.source;
                        if src >= n {
                            return Err(format!("a message from rank {src} of {n}"));
                        }
                        if over {
                            let field = |a: usize, b: usize| buf.get(a..b).map(|w| u64::from_le_bytes({
                                let mut x = [0u8; 8];
                                x[..b - a].copy_from_slice(w);
                                x
                            }));
                            let (r, t, k) = (field(0, 4), field(4, 8), field(8, 16));
                            let (Some(r), Some(t), Some(k)) = (r, t, k) else {
                                return Err(format!("overtaking: a message of {} bytes from rank {src}, too short for its header", buf.len()));
                            };
                            let m = over_of.get(r as usize).and_then(|v| v.get(t as usize)).and_then(|v| v.get(k as usize)).copied().flatten();
                            let Some(m) = m.filter(|_| r == u64::from(src) && st.tag == t as i32) else {
                                return Err(format!("overtaking: unexpected message (rank {r}, thread {t}, index {k}) from rank {src} tag {}", st.tag));
                            };
                            let first = !std::mem::replace(&mut seen[r as usize][t as usize][k as usize], true);
                            if !first {
                                return Err(format!("overtaking: message {k} of rank {r} thread {t} came twice"));
                            }
                            if buf.len() != m.len || mismatch(r as u32, t as u32, &m, &buf).is_some() {
                                return Err(format!("overtaking: message {k} of rank {r} thread {t}: {} bytes, expected {}, first difference at {:?}", buf.len(), m.len, mismatch(r as u32, t as u32, &m, &buf)));
                            }
                        } else {
                            let Some(m) = expect[u as usize][src as usize].get(next[src as usize]) else {
                                return Err(format!("tag {u}: a message from rank {src} after all {} it sent here", next[src as usize]));
                            };
                            if st.tag != u as i32 || buf.len() != m.len {
                                return Err(format!(
                                    "tag {u}: message {} of rank {src} (its index {}): expected {} bytes with tag {u}, got {} bytes with tag {} (lost, duplicated or out of order)",
                                    next[src as usize], m.k, m.len, buf.len(), st.tag
                                ));
                            }
                            if let Some(i) = mismatch(src, u, m, &buf) {
                                return Err(format!("tag {u}: message {} of rank {src} (its index {}): byte {i} differs (reordered or corrupted)", next[src as usize], m.k));
                            }
                            next[src as usize] += 1;
                        }
                        got += 1;
                        bytes += buf.len() as u64;
                        spare.push(buf);
                        progress[u as usize].store(got, Ordering::Relaxed);
                    }
                    Ok((got, bytes))
                })
            })
            .collect();
        let mut summary = Summary::default();
        let mut first_err = None;
        for h in senders {
            match h.join().map_err(|_| "a sender thread panicked".to_string()).and_then(|r| r) {
                Ok(k) => summary.sent += k,
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        for h in receivers {
            match h.join().map_err(|_| "a receiver thread panicked".to_string()).and_then(|r| r) {
                Ok((k, b)) => {
                    summary.received += k;
                    summary.bytes += b;
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(summary),
        }
    });
    done.store(true, Ordering::Release);
    let _ = watchdog.join();
    let summary = result?;
    let want: u64 = wanted.iter().sum();
    if summary.received != want {
        return Err(format!("received {} messages, expected {want}", summary.received));
    }
    Ok(summary)
}

/// The communicators a soak runs on, created from `c` by every rank.
pub(crate) fn communicators(c: &Communicator) -> Result<(Communicator, Communicator), Error> {
    Ok((c.dup_with(false)?, c.dup_with(true)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params { messages: 10_000, threads: 3, max_size: 4 << 20, seconds: 10 };

    /// Every rank replays the same schedule; the mix has every kind of message.
    #[test]
    fn schedules_are_replayable_and_mixed() {
        let a: Vec<Msg> = schedule(&P, 4, 2, 1).collect();
        let b: Vec<Msg> = schedule(&P, 4, 2, 1).collect();
        assert_eq!(a, b);
        assert_ne!(a, schedule(&P, 4, 2, 2).collect::<Vec<_>>());
        let total: usize = (0..3).map(|t| schedule(&P, 4, 2, t).count()).sum();
        assert_eq!(total, 10_000);
        assert!(a.iter().any(|m| m.len == 0 && !m.overtaking));
        assert!(a.iter().any(|m| m.len > 16 << 10) && a.iter().any(|m| m.len > 256 << 10));
        assert!(a.iter().any(|m| m.overtaking) && a.iter().all(|m| !m.overtaking || m.len >= HEADER));
        assert!((0..4).all(|d| a.iter().any(|m| m.dest == d)));
        assert!(a.iter().all(|m| m.len <= P.max_size));
    }

    /// A filled message matches itself; another index, rank or a flipped byte does not.
    #[test]
    fn contents_tell_messages_apart() {
        let m = Msg { k: 5, dest: 0, overtaking: true, len: 100 };
        let mut buf = Vec::new();
        fill(3, 1, &m, &mut buf);
        assert_eq!(mismatch(3, 1, &m, &buf), None);
        assert_eq!(u64::from_le_bytes(buf[8..16].try_into().unwrap()), 5);
        assert!(mismatch(3, 1, &Msg { k: 6, ..m }, &buf).is_some());
        assert!(mismatch(2, 1, &m, &buf).is_some());
        buf[50] ^= 1;
        assert_eq!(mismatch(3, 1, &m, &buf), Some(50));
    }
}
