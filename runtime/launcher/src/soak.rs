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
//!
//! # Killing a rank mid-run (`--kill-rank R`)
//!
//! Rank `R`'s first sender thread, halfway through its schedule, tells every other rank that
//! it is about to die (on a third communicator), waits for each to acknowledge, and kills
//! its process with `SIGKILL`. The survivors receive per source instead of with
//! `Source::Any` (a wildcard receive can still be matched by a live peer, so it does not
//! fail while one is left): the `k`-th receive posted for a source gets that source's
//! `k`-th message there, checked as above. Every request that involves `R` (sends to it,
//! receives from it) either completes, for what `R` did before it died, or fails with
//! `PeerLost` naming `R`, and no later than 5 s after the announcement; everything between
//! the survivors still arrives whole, once and in order.

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
    /// The rank that kills itself halfway through (module docs).
    pub(crate) kill_rank: Option<u32>,
}

/// How long after the announcement of the kill every request involving the killed rank
/// must have completed or failed.
const LOST_WITHIN: Duration = Duration::from_secs(5);

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
    /// Requests involving the killed rank that failed with `PeerLost`.
    pub(crate) lost: u64,
    /// From the announcement of the kill to the last of those failures.
    pub(crate) lost_after: Option<Duration>,
}

/// When this rank learnt of the kill and when it saw the killed rank's requests fail.
#[derive(Debug, Default)]
struct LostClock {
    announced: std::sync::OnceLock<Instant>,
    /// The latest failure, in nanoseconds after the run's start.
    last_failure_ns: AtomicU64,
    failures: AtomicU64,
}

impl LostClock {
    /// Notes a request that failed with `PeerLost` of the killed rank.
    fn failed(&self, t0: Instant) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.last_failure_ns.fetch_max(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// `r`, after recording its error as the run's first failure if none was recorded yet.
fn noted<T>(failure: &std::sync::OnceLock<String>, r: Result<T, String>) -> Result<T, String> {
    if let Err(e) = &r {
        let _ = failure.set(e.clone());
    }
    r
}

/// Whether `e` is the loss of the killed rank `dead` (a failure the run expects).
fn lost(e: &Error, dead: Option<u32>) -> bool {
    matches!(e, Error::PeerLost { rank } if Some(*rank) == dead)
}

/// Rank `dead`'s last act: announce the kill to every other rank on `notes`, wait for each
/// to acknowledge, and kill this process.
fn die_announced(notes: &Communicator) -> Result<(), String> {
    let (me, n) = (notes.rank(), notes.size());
    for r in (0..n).filter(|&r| r != me) {
        notes.send(&b"dying"[..], r, 0).map_err(|e| format!("announcing the kill to rank {r}: {e}"))?;
    }
    for r in (0..n).filter(|&r| r != me) {
        notes.recv(Vec::<u8>::with_capacity(8), r, 1).map_err(|e| format!("the acknowledgement of rank {r}: {e}"))?;
    }
    // SAFETY: a plain syscall on this process.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL returned")
}

/// A survivor's side of the announcement: takes it from `dead`, notes the time, answers.
fn hear_announcement(notes: &Communicator, dead: u32, clock: &LostClock) -> Result<(), String> {
    let (buf, _) = notes.recv(Vec::<u8>::with_capacity(8), dead, 0).map_err(|e| format!("the announcement of rank {dead}'s kill: {e}"))?;
    if buf != b"dying" {
        return Err(format!("rank {dead} announced its kill with {buf:?}"));
    }
    let _ = clock.announced.set(Instant::now());
    notes.send(&b"ok"[..], dead, 1).map_err(|e| format!("acknowledging rank {dead}'s announcement: {e}"))?;
    Ok(())
}

/// A survivor's receiver when a rank is killed: receives from each source separately,
/// `RECV_WINDOW` at a time, until every expected message of a live source came and the
/// killed one has completed or failed. `check(source, k, message)` checks the `k`-th
/// message of `source` taken here. Returns (messages, bytes).
fn receive_per_source(
    c: &Communicator,
    tag: Tag,
    expected: &[u64],
    p: &Params,
    clock: (&LostClock, Instant),
    progress: &AtomicU64,
    mut check: impl FnMut(u32, u64, &[u8], &weft::Status) -> Result<(), String>,
) -> Result<(u64, u64), String> {
    let (n, dead) = (expected.len(), p.kill_rank.unwrap_or(u32::MAX));
    let (mut posted_for, mut taken, mut is_lost) = (vec![0u64; n], vec![0u64; n], vec![false; n]);
    let mut reqs: Vec<Request<'_, Vec<u8>>> = Vec::new();
    let mut meta: Vec<(u32, u64)> = Vec::new();
    let mut spare: Vec<Vec<u8>> = Vec::new();
    let (mut got, mut bytes) = (0u64, 0u64);
    loop {
        for s in 0..n {
            while !is_lost[s] && posted_for[s] < expected[s] && posted_for[s] - taken[s] < RECV_WINDOW as u64 {
                let mut buf = spare.pop().unwrap_or_else(|| Vec::with_capacity(p.max_size));
                buf.clear();
                match c.irecv(buf, s as u32, tag) {
                    Ok(r) => {
                        reqs.push(r);
                        meta.push((s as u32, posted_for[s]));
                        posted_for[s] += 1;
                    }
                    // The killed rank known lost already: a receive from it fails at once.
                    Err(e) if s as u32 == dead && lost(&e, Some(dead)) => {
                        is_lost[s] = true;
                        clock.0.failed(clock.1);
                    }
                    Err(e) => return Err(format!("irecv from rank {s}: {e}")),
                }
            }
        }
        let Some(i) = weft::wait_any(&mut reqs) else { break };
        let (src, k) = meta.swap_remove(i);
        let r = reqs.swap_remove(i).wait();
        let s = src as usize;
        taken[s] += 1;
        match r {
            // After a receive from the killed rank failed, a later one may still succeed: the
            // failed one's rendezvous read found the sender gone, while an eager message it
            // sent after that had already arrived.
            Ok((buf, st)) => {
                check(src, k, &buf, &st)?;
                got += 1;
                bytes += buf.len() as u64;
                spare.push(buf);
                progress.store(got, Ordering::Relaxed);
            }
            Err(e) if src == dead && lost(&e, Some(dead)) => {
                is_lost[s] = true;
                clock.0.failed(clock.1);
            }
            Err(e) => return Err(format!("receive {k} from rank {src}: {e}")),
        }
    }
    match (0..n).find(|&s| !is_lost[s] && taken[s] < expected[s]) {
        Some(s) => Err(format!("{} of {} messages of rank {s} came", taken[s], expected[s])),
        None => Ok((got, bytes)),
    }
}

/// Checks a message taken on the overtaking communicator from `src`: its header names a
/// message of `src` meant for this rank, not seen before, and its bytes are that message's.
fn check_overtaking(over_of: &[Vec<Vec<Option<Msg>>>], seen: &mut [Vec<Vec<bool>>], buf: &[u8], src: u32, tag: i32) -> Result<(), String> {
    let field = |a: usize, b: usize| {
        buf.get(a..b).map(|w| {
            let mut x = [0u8; 8];
            x[..b - a].copy_from_slice(w);
            u64::from_le_bytes(x)
        })
    };
    let (Some(r), Some(t), Some(k)) = (field(0, 4), field(4, 8), field(8, 16)) else {
        return Err(format!("overtaking: a message of {} bytes from rank {src}, too short for its header", buf.len()));
    };
    let m = over_of.get(r as usize).and_then(|v| v.get(t as usize)).and_then(|v| v.get(k as usize)).copied().flatten();
    let Some(m) = m.filter(|_| r == u64::from(src) && tag == t as i32) else {
        return Err(format!("overtaking: unexpected message (rank {r}, thread {t}, index {k}) from rank {src} tag {tag}"));
    };
    if std::mem::replace(&mut seen[r as usize][t as usize][k as usize], true) {
        return Err(format!("overtaking: message {k} of rank {r} thread {t} came twice"));
    }
    if buf.len() != m.len || mismatch(r as u32, t as u32, &m, buf).is_some() {
        return Err(format!(
            "overtaking: message {k} of rank {r} thread {t}: {} bytes, expected {}, first difference at {:?}",
            buf.len(),
            m.len,
            mismatch(r as u32, t as u32, &m, buf)
        ));
    }
    Ok(())
}

/// Checks that `buf`, taken on the ordered communicator with tag `u` as the `i`-th message
/// of `src` there, is message `expect[i]` of thread `u` of `src`.
fn check_ordered(expect: &[Msg], u: u32, src: u32, i: usize, buf: &[u8], tag: i32) -> Result<(), String> {
    let Some(m) = expect.get(i) else {
        return Err(format!("tag {u}: a message from rank {src} after all {i} it sent here"));
    };
    if tag != u as i32 || buf.len() != m.len {
        return Err(format!(
            "tag {u}: message {i} of rank {src} (its index {}): expected {} bytes with tag {u}, got {} bytes with tag {tag} (lost, duplicated or out of order)",
            m.k,
            m.len,
            buf.len()
        ));
    }
    if let Some(b) = mismatch(src, u, m, buf) {
        return Err(format!("tag {u}: message {i} of rank {src} (its index {}): byte {b} differs (reordered or corrupted)", m.k));
    }
    Ok(())
}

/// This rank's part of the soak: `ordered` keeps send order, `overtaking` allows
/// overtaking, `notes` carries the announcement of a kill (`Params::kill_rank`); all span
/// the same ranks.
pub(crate) fn soak(ordered: &Communicator, overtaking: &Communicator, notes: Option<&Communicator>, p: &Params) -> Result<Summary, String> {
    let (me, n) = (ordered.rank(), ordered.size());
    if !overtaking.allows_overtaking() || overtaking.size() != n || ordered.allows_overtaking() {
        return Err("soak needs an ordered and an overtaking communicator of the same ranks".into());
    }
    if p.threads == 0 || p.threads > 64 || p.max_size > 64 << 20 {
        return Err("soak takes 1..=64 threads and messages of at most 64 MiB".into());
    }
    let dead = p.kill_rank;
    let notes = match (dead, notes) {
        (Some(d), _) if d >= n => return Err(format!("--kill-rank {d}: the job has {n} ranks")),
        (Some(_), None) => return Err("a soak that kills a rank needs a communicator for the announcement".into()),
        (Some(_), Some(c)) if c.size() != n => return Err("the announcement communicator spans other ranks".into()),
        (_, notes) => notes,
    };
    // A survivor of a kill receives per source (module docs).
    let per_source = dead.is_some_and(|d| d != me);
    // What this rank must receive: per ordered tag `u` and source, the messages in order;
    // on the overtaking communicator, how many from each (source, thread).
    let t_n = p.threads as usize;
    let mut expect: Vec<Vec<Vec<Msg>>> = vec![vec![Vec::new(); n as usize]; t_n];
    let mut expect_over = vec![0u64; n as usize];
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
                    expect_over[r as usize] += 1;
                } else {
                    expect[t as usize][r as usize].push(m);
                }
            }
        }
    }
    let progress: Arc<Vec<AtomicU64>> = Arc::new((0..=t_n).map(|_| AtomicU64::new(0)).collect());
    let wanted: Vec<u64> = expect.iter().map(|per| per.iter().map(|v| v.len() as u64).sum()).chain([expect_over.iter().sum()]).collect();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The first failure of any thread: the watchdog reports it at once (the others may be
    // waiting for the failed thread's messages, and would hold the run until its limit).
    let failure: Arc<std::sync::OnceLock<String>> = Arc::default();
    let watchdog = {
        let (progress, done, wanted, failure) = (progress.clone(), done.clone(), wanted.clone(), failure.clone());
        let limit = Duration::from_secs(p.seconds);
        std::thread::spawn(move || {
            let t0 = Instant::now();
            while !done.load(Ordering::Acquire) {
                if let Some(e) = failure.get() {
                    eprintln!("weft-selftest soak: FAILED on rank {me} of {n}: {e}");
                    std::process::exit(1);
                }
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
    let (clock, t0) = (LostClock::default(), Instant::now());
    let result = std::thread::scope(|s| -> Result<Summary, String> {
        let clock = &clock;
        let announcement = match (dead, notes) {
            (Some(d), Some(notes)) if d != me => Some(s.spawn(move || hear_announcement(notes, d, clock))),
            _ => None,
        };
        let failure = &failure;
        let senders: Vec<_> = (0..p.threads)
            .map(|t| {
                s.spawn(move || {
                    noted(
                        failure,
                        (|| -> Result<u64, String> {
                            let mut inflight: std::collections::VecDeque<(u32, Request<'_, Vec<u8>>)> = Default::default();
                            let mut spare: Vec<Vec<u8>> = Vec::new();
                            let mut sent = 0;
                            // A send to the killed rank may complete or fail with its loss.
                            let settle = |dest: u32, r: Result<(Vec<u8>, weft::Status), Error>, spare: &mut Vec<Vec<u8>>| match r {
                                Ok((buf, _)) => {
                                    spare.push(buf);
                                    Ok(())
                                }
                                Err(e) if dest != me && lost(&e, dead) => {
                                    clock.failed(t0);
                                    Ok(())
                                }
                                Err(e) => Err(format!("a send of thread {t} to rank {dest}: {e}")),
                            };
                            let total = schedule(p, n, me, t).count();
                            for (i, m) in schedule(p, n, me, t).enumerate() {
                                if t == 0 && dead == Some(me) && i == total / 2 {
                                    die_announced(notes.expect("checked above"))?;
                                }
                                if inflight.len() == SEND_WINDOW {
                                    if let Some((dest, r)) = inflight.pop_front() {
                                        settle(dest, r.wait(), &mut spare)?;
                                    }
                                }
                                let mut buf = spare.pop().unwrap_or_default();
                                fill(me, t, &m, &mut buf);
                                let c = if m.overtaking { overtaking } else { ordered };
                                match c.isend(buf, m.dest, t as i32) {
                                    Ok(r) => inflight.push_back((m.dest, r)),
                                    Err(e) => settle(m.dest, Err(e), &mut spare)?,
                                }
                                sent += 1;
                            }
                            for (dest, r) in inflight {
                                settle(dest, r.wait(), &mut spare)?;
                            }
                            Ok(sent)
                        })(),
                    )
                })
            })
            .collect();
        let receivers: Vec<_> = (0..=p.threads)
            .map(|u| {
                let (expect, over_of, expect_over, progress) = (&expect, &over_of, &expect_over, &progress);
                let want = wanted[u as usize];
                s.spawn(move || {
                    noted(
                        failure,
                        (move || -> Result<(u64, u64), String> {
                            let over = u == p.threads;
                            let (c, tag) = if over { (overtaking, Tag::Any) } else { (ordered, Tag::Is(u as i32)) };
                            let mut seen: Vec<Vec<Vec<bool>>> =
                                over_of.iter().map(|per| per.iter().map(|v| vec![false; v.len()]).collect()).collect();
                            if per_source {
                                let expected: Vec<u64> =
                                    if over { expect_over.clone() } else { expect[u as usize].iter().map(|v| v.len() as u64).collect() };
                                return receive_per_source(c, tag, &expected, p, (clock, t0), &progress[u as usize], |src, k, buf, st| {
                                    if over {
                                        check_overtaking(over_of, &mut seen, buf, src, st.tag)
                                    } else {
                                        check_ordered(&expect[u as usize][src as usize], u, src, k as usize, buf, st.tag)
                                    }
                                });
                            }
                            let mut next = vec![0usize; n as usize];
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
                                    check_overtaking(over_of, &mut seen, &buf, src, st.tag)?;
                                } else {
                                    check_ordered(&expect[u as usize][src as usize], u, src, next[src as usize], &buf, st.tag)?;
                                    next[src as usize] += 1;
                                }
                                got += 1;
                                bytes += buf.len() as u64;
                                spare.push(buf);
                                progress[u as usize].store(got, Ordering::Relaxed);
                            }
                            Ok((got, bytes))
                        })(),
                    )
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
        if let Some(h) = announcement {
            if let Err(e) = h.join().map_err(|_| "the announcement thread panicked".to_string()).and_then(|r| r) {
                first_err.get_or_insert(e);
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(summary),
        }
    });
    done.store(true, Ordering::Release);
    let _ = watchdog.join();
    let mut summary = result?;
    if per_source {
        summary.lost = clock.failures.load(Ordering::Relaxed);
        let announced = *clock.announced.get().ok_or("the killed rank's announcement never came")?;
        let last = t0 + Duration::from_nanos(clock.last_failure_ns.load(Ordering::Relaxed));
        let after = last.saturating_duration_since(announced);
        if after > LOST_WITHIN {
            return Err(format!("a request involving the killed rank failed {after:?} after its announcement (at most {LOST_WITHIN:?})"));
        }
        summary.lost_after = Some(after);
        return Ok(summary);
    }
    let want: u64 = wanted.iter().sum();
    if summary.received != want {
        return Err(format!("received {} messages, expected {want}", summary.received));
    }
    Ok(summary)
}

/// The communicators a soak runs on, created from `c` by every rank: ordered, overtaking,
/// and with `Params::kill_rank` the one for the announcement of the kill.
pub(crate) fn communicators(c: &Communicator, p: &Params) -> Result<(Communicator, Communicator, Option<Communicator>), Error> {
    let notes = if p.kill_rank.is_some() { Some(c.dup()?) } else { None };
    Ok((c.dup_with(false)?, c.dup_with(true)?, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Params = Params { messages: 10_000, threads: 3, max_size: 4 << 20, seconds: 10, kill_rank: None };

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
