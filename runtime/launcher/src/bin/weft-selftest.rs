//! `weft-selftest <check>`: multi-process checks of a weft installation, run under
//! `weftrun` (`weftrun -n 4 --provider shm weft-selftest all`); `weft-selftest --help` lists
//! the checks, one line each, with the number of ranks each takes. The integration test
//! `tests/multiprocess.rs` drives them on `shm` and `tcp;ofi_rxm`, under `weftrun` and,
//! with feature `pmix`, under `mpirun` (`mpirun -np 4 -x WEFT_PROVIDER=shm weft-selftest
//! all`: rank and size come from PMIx).
//!
//! * Every check runs on a communicator of its own (`world().dup()`, created by every rank
//!   before the check and freed after it), and the exit handshake on another: no check ever
//!   matches a message of another check, or of a faster rank's goodbye.
//! * A check verifies each message it receives — source, tag, length and contents — and a
//!   mismatch is a failure that names what was expected and what came, never a panic: the
//!   rank prints `weft-selftest CHECK: FAILED on rank R of N: ...` and exits with status 1.
//! * A check run at a number of ranks it does not take refuses on every rank, naming the
//!   numbers it takes, and exits with status 2.
//!
//! | check | ranks | what |
//! |---|---|---|
//! | `hello` | any | prints rank, size and provider, and the ranks on its host where the launcher tells them (PMIx) |
//! | `pingpong` | >= 2 | 1000 round trips in pairs 0-1, 2-3, ... at once (with an odd count the last rank then plays with rank 0), contents checked |
//! | `multirate` | even | every multirate pattern (pairwise, one-to-many, many-to-one, many-to-many) from ranks `0..N/2` to `N/2..N`, window 16, 10 iterations |
//! | `wildcard` | >= 2 | rank 0 receives 50 messages from every other rank with `Source::Any`/`Tag::Any`; per-source order checked |
//! | `fan-in` | >= 2 | every other rank sends 120 messages to rank 0 at once, eager and rendezvous interleaved, half on the check's communicator and half on a `dup` of it; rank 0 receives each communicator's with `Source::Any`/`Tag::Any` in turn: per-source order, contents, and no message on the wrong communicator (more messages in flight than inbox slots: flow control with many senders) |
//! | `order` | >= 2 | every rank sends 200 eager and rendezvous messages, interleaved on one tag, to the next rank on a ring; they arrive in send order |
//! | `large` | >= 2 | every rank sends a 64 MiB message to the next rank on a ring, all at once (at 2 ranks: an exchange), contents checked |
//! | `alltoall` | >= 2 | every rank sends 64 KiB (rendezvous) to every other at once, 40 rounds, contents checked |
//! | `locks [ACQUISITIONS]` | >= 2 | every distributed lock of `weft::dlock` in turn (D-MCS, RMA-MCS, RMA-RW, foMPI-style spin and reader-writer), `--threads` threads per rank (default 2), or with `--tasks N` N tasks per rank on the runtime's pool through `lock_async` (`read_async`, `write_async`), taking it ACQUISITIONS times each (default 100; one in `--write-every` a write for the reader-writer locks, default 4): a writer increments a word on rank 0 non-atomically (get, add, put, flush), a reader reads it twice; words on rank 0 that count the writers and readers inside find any writer beside another holder; the final count is exact; each lock's line gives its time and the job's acquisitions per second |
//! | `lock-ends` | 2 | for every distributed lock, rank 1 takes it, tells rank 0 (which then waits for it, a thread, then a task) and drops its lock at once, after releasing it (rank 0 must get the lock) or with its guard forgotten (rank 0's wait must fail with `dlock::LOCK_ENDED`, within 2 s) |
//! | `comms` | >= 2 | split into halves, `create_group` of the first and last rank, then the blocking collectives on both and persistent ones (a large allreduce, an allgather, a scan, each started twice), and two nonblocking allreduces and an alltoall outstanding at once |
//! | `partitioned` | 2 | rank 0 sends rank 1 a partitioned message of 4 partitions of 64 KiB (above the eager threshold), each filled and marked ready by a thread of its own, in 4 rounds; rank 1 checks every word of every round, and rank 0 tells by the frames it receives per round whether rounds 2 on were written straight into rank 1's buffer (where the transport reaches its memory: the same-host lane) or sent as messages |
//! | `rma` | >= 2 | one-sided windows: every rank puts into the next rank on a ring, adds 500 times to counters on rank 0 (a native 64-bit and an emulated 32-bit atomic) increments a word on rank 0 100 times under the D-MCS lock (`weft::dlock`, get and put), and takes the RMA-RW lock over the ranks' hosts 100 times (one in four a write that increments another word); the slots and the exact counts are checked |
//! | `all` | even | `pingpong`, `multirate`, `wildcard`, `order` and `large` in turn, each on a communicator of its own |
//! | `peer-lost` | 2 | rank 0 kills itself (SIGKILL); rank 1's pending receive and rendezvous send, and a new send and receive, fail with `PeerLost` |
//! | `peer-lost-read` | 2 | rank 0 kills itself while rank 1 reads its 64 MiB message; rank 1's receive fails with `PeerLost` (not a transport error) or, if the read was done first, holds the whole message |
//! | `coll-peer-lost` | >= 2 | the last rank kills itself (SIGKILL) once every rank passed a barrier; the others' small (recursive doubling) and large (ring) allreduces and barrier each fail with `PeerLost` naming it, within seconds |
//! | `kill-mid-transfer MS` | 2 | rank 0 streams 64 MiB messages to rank 1, which kills itself (SIGKILL) `MS` ms into the first receive; rank 0's send fails with `PeerLost` within seconds |
//! | `kill-in-wait-all` | 3 | ranks 0 and 1 block in `wait_all` over rendezvous sends and receives with each other and with rank 2, which kills itself (SIGKILL) once both are about to wait; each survivor's `wait_all` fails with `PeerLost` naming rank 2 within 10 s, the requests with rank 2 fail so, and those between the survivors complete with the whole message (never a partial one) |
//! | `outlive-launcher` | any | prints its pid and waits for a message that never comes; rank 1 ignores SIGTERM first. Once its wait fails (the test kills `weftrun`: `PeerLost`) a rank kills itself (SIGKILL), printing nothing more |
//! | `peer-finished` | 2 | rank 1 sends 8 messages and drops its runtime (a normal finish) while rank 0 has receives posted that only rank 1 could match; rank 0 still gets the 8 messages, then the others, a new receive and a new send fail with `PeerLost` |
//! | `netns` | 2 | a message and 1 MiB each way (the multi-host test) |
//! | `block` | any | prints its pid, then waits for a message that never comes (teardown test) |
//! | `exit-code` | any | rank `r` exits with status `3 * r` after everyone arrived |
//! | `soak [MESSAGES]` | >= 2 | every rank's `--threads` threads send MESSAGES messages of random sizes (0 B to `--max-size`, default 4 MiB), tags and destinations, on a communicator that keeps order and one that allows overtaking; receivers take them with wildcards, and every byte, per-source order and exactly-once delivery are checked; fails after `--seconds`. `--local N` runs N ranks in this process on the embedded provider; `--kill-rank R` kills rank R halfway, and the survivors check that its requests complete or fail with `PeerLost` within 5 s while theirs arrive whole |

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../soak.rs"]
mod soak;

use clap::{Parser, Subcommand};
use weft::dlock::{DMcs, FompiRw, Levels, RmaMcs, RmaRw, SpinLock, Thresholds};
use weft::rma::{Op, Window};
use weft::{Communicator, Error, Request, Runtime, Source, Status, Tag};

/// Multi-process checks of a weft installation, run under weftrun (`weftrun -n 4 --provider
/// shm weft-selftest all`).
#[derive(Debug, Parser)]
#[command(name = "weft-selftest", version, disable_help_subcommand = true, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    check: Check,
}

/// What `--help` says below the list of checks.
const AFTER_HELP: &str = "\
Each check runs on a communicator of its own, and the exit handshake on another. Every message a \
check receives is checked (source, tag, length, contents): a mismatch prints `weft-selftest CHECK: \
FAILED on rank R of N: what was expected and what came` and exits with status 1. A check started \
at a number of ranks it does not take (the bracket before its description) refuses on every rank \
and exits with status 2.";

/// One check. The first line of each doc comment is its line in `--help`, and starts with
/// the number of ranks it takes (`Ranks::tag`; a unit test keeps the two in step).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Subcommand)]
enum Check {
    /// [any ranks] prints rank, size and provider, and the ranks on its host where the launcher tells them (PMIx)
    Hello,
    /// [2+ ranks] 1000 round trips in pairs 0-1, 2-3, ... at once (an odd last rank then plays with rank 0)
    Pingpong,
    /// [even ranks] every multirate pattern from ranks 0..N/2 to N/2..N, window 16, 10 iterations
    Multirate,
    /// [2+ ranks] rank 0 receives 50 messages of every other rank with Source::Any, Tag::Any; per-source order checked
    Wildcard,
    /// [2+ ranks] 200 eager and rendezvous messages on one tag to the next rank on a ring arrive in send order
    Order,
    /// [2+ ranks] every other rank sends rank 0 120 eager and rendezvous messages at once, on two communicators; per-source order checked
    FanIn,
    /// [2+ ranks] a 64 MiB message to the next rank on a ring, every rank at once
    Large,
    /// [2+ ranks] 64 KiB (rendezvous) from every rank to every other at once, 40 rounds
    Alltoall,
    /// [2 ranks] a partitioned message of 4 partitions of 64 KiB from rank 0 to rank 1 in 4 rounds; contents checked, and whether rounds 2 on went straight into the receive's buffer
    Partitioned,
    /// [2+ ranks] one-sided windows: a put on a ring, 500 atomic adds and 100 D-MCS-locked increments per rank on rank 0
    Rma,
    /// [2+ ranks] every distributed lock in turn, THREADS threads (or TASKS tasks, lock_async) per rank each taking it ACQUISITIONS times; exclusion checked, final count exact
    Locks {
        /// Acquisitions of each lock by each thread.
        #[arg(value_name = "ACQUISITIONS", default_value_t = 100)]
        acquisitions: u64,
        /// Threads per rank.
        #[arg(long, default_value_t = 2)]
        threads: u32,
        /// Tasks per rank instead of threads, on the runtime's pool, each taking the locks with `lock_async` (`read_async`, `write_async`).
        #[arg(long, default_value_t = 0)]
        tasks: u32,
        /// Every this many acquisitions of a reader-writer lock, one is a write.
        #[arg(long, default_value_t = 4)]
        write_every: u64,
    },
    /// [2 ranks] rank 1 takes each distributed lock and drops it at once, released (rank 0, waiting, must get it) or not (its wait must fail with LOCK_ENDED)
    LockEnds,
    /// [2+ ranks] split into halves, create_group of the first and last rank, then barrier, bcast, allreduce, allgather, reduce, gather, scatter, persistent allreduce, allgather and scan, and two iallreduces and an ialltoall at once
    Comms,
    /// [even ranks] pingpong, multirate, wildcard, order and large in turn
    All,
    /// [2 ranks] rank 0 kills itself; rank 1's pending and new receives and sends fail with PeerLost
    PeerLost,
    /// [2 ranks] rank 0 kills itself while rank 1 reads its 64 MiB message: PeerLost, or the whole message
    PeerLostRead,
    /// [2+ ranks] the last rank kills itself as the others enter allreduces and a barrier; each fails with PeerLost on every other rank
    CollPeerLost,
    /// [2 ranks] rank 1 kills itself MS ms into a stream of 64 MiB messages; rank 0's send fails with PeerLost
    KillMidTransfer {
        /// Milliseconds into the first receive at which rank 1 kills itself.
        #[arg(value_name = "MS", default_value_t = 300)]
        ms: u64,
    },
    /// [3 ranks] rank 2 kills itself while ranks 0 and 1 wait_all over rendezvous requests with each other and with it
    KillInWaitAll,
    /// [any ranks] prints its pid and waits until weftrun is killed, then kills itself (rank 1 ignores SIGTERM)
    OutliveLauncher,
    /// [2 ranks] rank 1 sends 8 messages and finishes; rank 0 gets them, then PeerLost for the rest
    PeerFinished,
    /// [2 ranks] a message and 1 MiB each way (the two-namespace test)
    Netns,
    /// [any ranks] prints its pid, then waits for a message that never comes
    Block,
    /// [any ranks] rank r exits with status 3 * r after every rank arrived
    ExitCode,
    /// [2+ ranks] random traffic from many threads per rank to every rank, ordered and overtaking, every message checked
    Soak {
        /// Messages each rank sends.
        #[arg(value_name = "MESSAGES", default_value_t = 20_000)]
        messages: u64,
        /// Sender threads per rank (and receiver threads on the ordered communicator).
        #[arg(long, default_value_t = 4)]
        threads: u32,
        /// Largest message in bytes.
        #[arg(long, default_value_t = 4 << 20)]
        max_size: usize,
        /// Time limit; the run fails when it is not done by then.
        #[arg(long, default_value_t = 120)]
        seconds: u64,
        /// Run N ranks in this process over the embedded provider instead of one rank of a
        /// launched job.
        #[arg(long, value_name = "N")]
        local: Option<u32>,
        /// Rank that kills itself halfway through; the survivors check that every request
        /// involving it completes or fails with `PeerLost` within 5 s of its announcement, and
        /// that everything between them arrives whole.
        #[arg(long, value_name = "R")]
        kill_rank: Option<u32>,
    },
}

/// The numbers of ranks a check takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ranks {
    Any,
    AtLeastTwo,
    Even,
    Two,
    Three,
}

impl Ranks {
    fn admits(self, n: u32) -> bool {
        match self {
            Ranks::Any => true,
            Ranks::AtLeastTwo => n >= 2,
            Ranks::Even => n >= 2 && n % 2 == 0,
            Ranks::Two => n == 2,
            Ranks::Three => n == 3,
        }
    }

    /// How `--help` marks it, at the start of the check's line (written out in the doc
    /// comments of [`Check`]; a unit test compares).
    #[cfg(test)]
    fn tag(self) -> &'static str {
        match self {
            Ranks::Any => "[any ranks]",
            Ranks::AtLeastTwo => "[2+ ranks]",
            Ranks::Even => "[even ranks]",
            Ranks::Two => "[2 ranks]",
            Ranks::Three => "[3 ranks]",
        }
    }

    /// In words, for the refusal.
    fn words(self) -> &'static str {
        match self {
            Ranks::Any => "any number of ranks",
            Ranks::AtLeastTwo => "2 or more ranks",
            Ranks::Even => "an even number of ranks (2 or more)",
            Ranks::Two => "exactly 2 ranks",
            Ranks::Three => "exactly 3 ranks",
        }
    }
}

impl Check {
    /// The checks `all` runs, in turn.
    const ALL: [Check; 5] = [Check::Pingpong, Check::Multirate, Check::Wildcard, Check::Order, Check::Large];

    /// Its name on the command line.
    fn name(self) -> &'static str {
        match self {
            Check::Hello => "hello",
            Check::Pingpong => "pingpong",
            Check::Multirate => "multirate",
            Check::Wildcard => "wildcard",
            Check::Order => "order",
            Check::FanIn => "fan-in",
            Check::Large => "large",
            Check::Alltoall => "alltoall",
            Check::Partitioned => "partitioned",
            Check::Rma => "rma",
            Check::Locks { .. } => "locks",
            Check::LockEnds => "lock-ends",
            Check::Comms => "comms",
            Check::All => "all",
            Check::PeerLost => "peer-lost",
            Check::PeerLostRead => "peer-lost-read",
            Check::CollPeerLost => "coll-peer-lost",
            Check::KillMidTransfer { .. } => "kill-mid-transfer",
            Check::KillInWaitAll => "kill-in-wait-all",
            Check::OutliveLauncher => "outlive-launcher",
            Check::PeerFinished => "peer-finished",
            Check::Netns => "netns",
            Check::Block => "block",
            Check::ExitCode => "exit-code",
            Check::Soak { .. } => "soak",
        }
    }

    fn ranks(self) -> Ranks {
        match self {
            Check::Hello | Check::OutliveLauncher | Check::Block | Check::ExitCode => Ranks::Any,
            Check::Pingpong
            | Check::Wildcard
            | Check::Order
            | Check::FanIn
            | Check::Large
            | Check::Alltoall
            | Check::Rma
            | Check::Locks { .. }
            | Check::Comms
            | Check::Soak { .. }
            | Check::CollPeerLost => Ranks::AtLeastTwo,
            Check::Multirate | Check::All => Ranks::Even,
            Check::PeerLost
            | Check::PeerLostRead
            | Check::KillMidTransfer { .. }
            | Check::PeerFinished
            | Check::Netns
            | Check::LockEnds
            | Check::Partitioned => Ranks::Two,
            Check::KillInWaitAll => Ranks::Three,
        }
    }

    /// Whether the ranks wait for each other before they leave (the exit handshake): not
    /// where a rank dies or finishes on purpose, nor where the wait never ends.
    fn says_goodbye(self) -> bool {
        !matches!(
            self,
            Check::PeerLost
                | Check::PeerLostRead
                | Check::CollPeerLost
                | Check::KillMidTransfer { .. }
                | Check::KillInWaitAll
                | Check::PeerFinished
                | Check::OutliveLauncher
                | Check::Block
                | Check::Soak { kill_rank: Some(_), .. }
        )
    }

    /// The checks this one runs, each on a communicator of its own.
    fn steps(self) -> Vec<Check> {
        if self == Check::All {
            Check::ALL.to_vec()
        } else {
            vec![self]
        }
    }
}

/// `lock-ends`: for every lock, in a thread then a task of rank 0, and with rank 1's
/// release and without it, rank 1 takes the lock, tells rank 0, which then waits for it,
/// lets it wait a little, then drops its lock at once. Released, the lock goes to rank 0
/// (whichever of the hand-off and the notice of the end came first); not released, rank
/// 0's wait fails with `LOCK_ENDED` within 2 s.
fn lock_ends(rt: &Runtime, c: &Communicator) -> Res {
    type Wait<L> = fn(&Runtime, &L) -> Result<(), Error>;
    type Hold<L> = fn(&L, &dyn Fn() -> Res) -> Res;
    /// One round: `hold` is rank 1's (it takes the lock, runs the closure, then releases
    /// it or forgets its guard), `wait` rank 0's.
    fn round<L>(
        rt: &Runtime,
        c: &Communicator,
        make: fn(&Communicator) -> Result<L, Error>,
        hold: Hold<L>,
        wait: Wait<L>,
        released: bool,
    ) -> Res {
        let lock = make(c).map_err(e)?;
        c.barrier().map_err(e)?;
        if c.rank() == 1 {
            let r = hold(&lock, &|| {
                c.send(vec![0u8], 0, 31).map_err(e)?;
                c.recv(Vec::<u8>::with_capacity(1), 0, 32).map_err(e)?;
                std::thread::sleep(Duration::from_millis(20));
                Ok(())
            });
            drop(lock);
            return r;
        }
        c.recv(Vec::<u8>::with_capacity(1), 1, 31).map_err(e)?;
        c.send(vec![0u8], 1, 32).map_err(e)?;
        let start = Instant::now();
        let r = wait(rt, &lock);
        let took = start.elapsed();
        if released {
            check(r.is_ok(), || format!("a lock rank 1 released before it dropped it: expected it, got {r:?}"))
        } else {
            check(r == Err(weft::dlock::LOCK_ENDED), || format!("a lock rank 1 dropped holding it: expected LOCK_ENDED, got {r:?}"))?;
            check(took < Duration::from_secs(2), || format!("the wait failed only after {took:?}"))
        }
    }
    macro_rules! every {
        ($lock:ty, $make:expr, $take:ident, $take_async:ident) => {
            for released in [true, false] {
                let hold: Hold<$lock> = if released {
                    |l, f| {
                        let g = l.$take().map_err(e)?;
                        f()?;
                        g.unlock().map_err(e)
                    }
                } else {
                    |l, f| {
                        std::mem::forget(l.$take().map_err(e)?);
                        f()
                    }
                };
                round(rt, c, $make, hold, |_, l| l.$take()?.unlock(), released)?;
                round(rt, c, $make, hold, |rt, l| rt.block_on(async { l.$take_async().await?.unlock_async().await }), released)?;
            }
        };
    }
    every!(DMcs, |c| DMcs::new(c, 0), lock, lock_async);
    every!(RmaMcs, |c| RmaMcs::new(c, &Levels::flat(), &Thresholds::default()), lock, lock_async);
    every!(RmaRw, |c| RmaRw::new(c, &Levels::flat(), &Thresholds::default()), write, write_async);
    every!(RmaRw, |c| RmaRw::new(c, &Levels::flat(), &Thresholds::default()), write, read_async);
    every!(SpinLock, |c| SpinLock::new(c, 0), lock, lock_async);
    every!(FompiRw, |c| FompiRw::new(c, 0), write, read_async);
    c.barrier().map_err(e)?;
    println!("lock-ends ok: rank {} of {}", c.rank(), c.size());
    Ok(())
}

/// What a check finds wrong: what it expected and what came.
type Res = Result<(), String>;

fn e(err: Error) -> String {
    err.to_string()
}

fn check(cond: bool, what: impl FnOnce() -> String) -> Res {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// A few bytes of a message, for a failure: as text when they are printable, else in hex.
fn show(b: &[u8]) -> String {
    const HEAD: usize = 24;
    let head = &b[..b.len().min(HEAD)];
    let more = if b.len() > HEAD { " ..." } else { "" };
    let n = if b.len() == 1 { "1 byte".to_string() } else { format!("{} bytes", b.len()) };
    if !head.is_empty() && head.iter().all(|c| c.is_ascii_graphic() || *c == b' ') {
        format!("{n} {:?}{more}", String::from_utf8_lossy(head))
    } else {
        let hex: Vec<String> = head.iter().map(|x| format!("{x:02x}")).collect();
        format!("{n} [{}{more}]", hex.join(" "))
    }
}

/// The source and tag of a received message (`what` names it) against the expected ones.
fn envelope(what: &dyn Fn() -> String, st: &Status, from: u32, tag: i32) -> Res {
    check(st.source == from && st.tag == tag, || {
        format!(
            "{}: expected a message from rank {from} with tag {tag}, got one from rank {} with tag {} ({} bytes)",
            what(),
            st.source,
            st.tag,
            st.bytes
        )
    })
}

/// A received message (`what` names it) against the expected one: source, tag and every
/// byte.
fn expect(what: impl Fn() -> String, got: &(Vec<u8>, Status), from: u32, tag: i32, want: &[u8]) -> Res {
    let (b, st) = got;
    envelope(&what, st, from, tag)?;
    check(b[..] == *want && st.bytes == want.len(), || format!("{}: expected {}, got {}", what(), show(want), show(b)))
}

/// The next and the previous rank of `me` on the ring `0 -> 1 -> ... -> n-1 -> 0`.
fn ring(me: u32, n: u32) -> (u32, u32) {
    ((me + 1) % n, (me + n - 1) % n)
}

/// Round trips per pair in `pingpong`.
const ROUND_TRIPS: u64 = 1000;

/// Whom `me` plays `pingpong` with among `n` ranks, in order, and whether it serves:
/// ranks `2k` (serving) and `2k + 1`, all pairs at once; with an odd count the last rank
/// then plays with rank 0, which serves.
fn pingpong_partners(me: u32, n: u32) -> Vec<(u32, bool)> {
    let mut p = Vec::new();
    if me % 2 == 1 {
        p.push((me - 1, false));
    } else if me + 1 < n {
        p.push((me + 1, true));
    }
    if n % 2 == 1 && n > 1 {
        if me == 0 {
            p.push((n - 1, true));
        } else if me == n - 1 {
            p.push((0, false));
        }
    }
    p
}

fn pingpong(c: &Communicator) -> Res {
    for (partner, serves) in pingpong_partners(c.rank(), c.size()) {
        for i in 0..ROUND_TRIPS {
            if serves {
                c.send(i.to_le_bytes().to_vec(), partner, 1).map_err(e)?;
                let got = c.recv(Vec::<u8>::with_capacity(8), partner, 2).map_err(e)?;
                expect(|| format!("round trip {i}: the reply of rank {partner}"), &got, partner, 2, &(i + 1).to_le_bytes())?;
            } else {
                let got = c.recv(Vec::<u8>::with_capacity(8), partner, 1).map_err(e)?;
                expect(|| format!("round trip {i}: the ball of rank {partner}"), &got, partner, 1, &i.to_le_bytes())?;
                c.send((i + 1).to_le_bytes().to_vec(), partner, 2).map_err(e)?;
            }
        }
    }
    Ok(())
}

/// Links of a multirate pattern among `t` senders (ranks `0..t`) and `t` receivers
/// (ranks `t..2t`).
fn links(pattern: &str, t: u32) -> Vec<(u32, u32)> {
    match pattern {
        "pairwise" => (0..t).map(|i| (i, t + i)).collect(),
        "one-to-many" => (0..t).map(|j| (0, t + j)).collect(),
        "many-to-one" => (0..t).map(|i| (i, t)).collect(),
        _ => (0..t).flat_map(|i| (0..t).map(move |j| (i, t + j))).collect(),
    }
}

fn multirate(c: &Communicator) -> Res {
    let (me, size) = (c.rank(), c.size());
    let t = size / 2;
    let (w, iterations) = (16usize, 10usize);
    for pattern in ["pairwise", "one-to-many", "many-to-one", "many-to-many"] {
        let ls = links(pattern, t);
        let tag = |l: usize, k: i32| 3 * l as i32 + k;
        for it in 0..iterations {
            // Receivers pre-post, then say ready.
            let mut recvs: Vec<(usize, Request<'_, Vec<u8>>)> = Vec::new();
            for (l, &(s, r)) in ls.iter().enumerate() {
                if r == me {
                    for _ in 0..w {
                        recvs.push((l, c.irecv(Vec::<u8>::with_capacity(64), s, tag(l, 0)).map_err(e)?));
                    }
                    c.send(&b"r"[..], s, tag(l, 1)).map_err(e)?;
                }
            }
            // Senders wait for ready, send the window, wait for the ack.
            for (l, &(s, r)) in ls.iter().enumerate() {
                if s == me {
                    let got = c.recv(Vec::<u8>::with_capacity(1), r, tag(l, 1)).map_err(e)?;
                    expect(|| format!("{pattern} iteration {it}: rank {r}'s ready"), &got, r, tag(l, 1), b"r")?;
                    let mut sends = Vec::with_capacity(w);
                    for k in 0..w {
                        let msg = format!("{pattern}:{l}:{it}:{k}").into_bytes();
                        sends.push(c.isend(msg, r, tag(l, 0)).map_err(e)?);
                    }
                    weft::wait_all(&mut sends).map_err(e)?;
                }
            }
            let mut k_of = vec![0usize; ls.len()];
            for (l, req) in recvs {
                let got = req.wait().map_err(e)?;
                let k = k_of[l];
                let want = format!("{pattern}:{l}:{it}:{k}");
                expect(|| format!("{pattern} iteration {it}: message {k} of link {l}"), &got, ls[l].0, tag(l, 0), want.as_bytes())?;
                k_of[l] += 1;
                if k_of[l] == w {
                    c.send(&b"a"[..], ls[l].0, tag(l, 2)).map_err(e)?;
                }
            }
            for (l, &(s, r)) in ls.iter().enumerate() {
                if s == me {
                    let got = c.recv(Vec::<u8>::with_capacity(1), r, tag(l, 2)).map_err(e)?;
                    expect(|| format!("{pattern} iteration {it}: rank {r}'s ack"), &got, r, tag(l, 2), b"a")?;
                }
            }
        }
        println!("multirate {pattern} ok");
    }
    Ok(())
}

fn wildcard(c: &Communicator) -> Res {
    let (me, size) = (c.rank(), c.size());
    let per = 50u32;
    if me == 0 {
        let mut next = vec![0u32; size as usize];
        for _ in 0..per * (size - 1) {
            let got = c.recv(Vec::<u8>::with_capacity(8), Source::Any, Tag::Any).map_err(e)?;
            let from = got.1.source;
            check(from != 0 && from < size, || {
                format!("a message from rank {from}, which sends none: tag {}, {}", got.1.tag, show(&got.0))
            })?;
            let k = next[from as usize];
            expect(|| format!("message {k} of rank {from}"), &got, from, from as i32, &k.to_le_bytes())?;
            next[from as usize] += 1;
        }
        check(next[1..].iter().all(|&n| n == per), || format!("expected {per} messages of every rank, got {:?}", &next[1..]))?;
    } else {
        for i in 0..per {
            c.send(i.to_le_bytes().to_vec(), 0, me as i32).map_err(e)?;
        }
    }
    Ok(())
}

/// Messages each rank sends in `order`.
const ORDER_MESSAGES: u32 = 200;

/// Message `i` of `order`: every third above the eager threshold; its index in the first 4
/// bytes.
fn order_message(i: u32) -> Vec<u8> {
    let len = if i % 3 == 2 { 40_000 + i as usize } else { 8 + (i as usize % 100) };
    let mut v = vec![(i % 251) as u8; len];
    v[..4].copy_from_slice(&i.to_le_bytes());
    v
}

fn order(c: &Communicator) -> Res {
    let (next, prev) = ring(c.rank(), c.size());
    let mut sends = Vec::new();
    for i in 0..ORDER_MESSAGES {
        sends.push(c.isend(order_message(i), next, 5).map_err(e)?);
    }
    for i in 0..ORDER_MESSAGES {
        let got = c.recv(Vec::<u8>::with_capacity(50_000), prev, Tag::Any).map_err(e)?;
        expect(|| format!("message {i} of rank {prev}"), &got, prev, 5, &order_message(i))?;
    }
    weft::wait_all(&mut sends).map_err(e)
}

/// Messages each other rank sends rank 0 in `fan-in`.
const FAN_IN_MESSAGES: u32 = 120;

/// Message `i` of rank `from` in `fan-in`: every third above the eager threshold; the
/// sender and the index in the first 8 bytes.
fn fan_in_message(from: u32, i: u32) -> Vec<u8> {
    let len = if i % 3 == 1 { 20_000 + i as usize } else { 8 + (i as usize % 50) };
    let mut v = vec![(from * 31 + i) as u8; len];
    v[..4].copy_from_slice(&from.to_le_bytes());
    v[4..8].copy_from_slice(&i.to_le_bytes());
    v
}

/// Every rank but 0 starts all its sends at once (messages of even index on `c`, of odd
/// index on a `dup` of it); rank 0 takes those of `c` first, with wildcards, then those of
/// the dup, so the dup's messages wait unexpected meanwhile and may not be taken by `c`'s
/// receives.
fn fan_in(c: &Communicator) -> Res {
    let (me, size) = (c.rank(), c.size());
    let d = c.dup().map_err(e)?;
    let r = fan_in_on(c, &d, me, size);
    d.free();
    r
}

fn fan_in_on(c: &Communicator, d: &Communicator, me: u32, size: u32) -> Res {
    if me != 0 {
        let mut sends = Vec::new();
        for i in 0..FAN_IN_MESSAGES {
            let on = if i % 2 == 0 { c } else { d };
            sends.push(on.isend(fan_in_message(me, i), 0, 7).map_err(e)?);
        }
        return weft::wait_all(&mut sends).map_err(e);
    }
    for (on, first, name) in [(c, 0, "the check's communicator"), (d, 1, "its dup")] {
        let mut next = vec![first; size as usize];
        for _ in 0..FAN_IN_MESSAGES / 2 * (size - 1) {
            let got = on.recv(Vec::<u8>::with_capacity(21_000), Source::Any, Tag::Any).map_err(e)?;
            let from = got.1.source;
            check(from != 0 && from < size, || format!("on {name}: a message from rank {from}, which sends none: {}", show(&got.0)))?;
            let i = next[from as usize];
            check(i < FAN_IN_MESSAGES, || format!("on {name}: more than {} messages of rank {from}", FAN_IN_MESSAGES / 2))?;
            expect(|| format!("on {name}: message {i} of rank {from}"), &got, from, 7, &fan_in_message(from, i))?;
            next[from as usize] += 2;
        }
    }
    Ok(())
}

/// Bytes of the message of `large`.
const LARGE_BYTES: usize = 64 << 20;

/// Word `k` of rank `from`'s message in `large`: differs from word to word and from rank to
/// rank, so a chunk in the wrong place or from the wrong sender shows.
fn large_word(from: u32, k: usize) -> u64 {
    (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (u64::from(from) + 1).wrapping_mul(0x0101_0101_0101_0101)
}

/// The first word of `got` that is not rank `from`'s message in `large` (`None`: all match).
fn large_mismatch(from: u32, got: &[u64]) -> Option<usize> {
    got.iter().enumerate().position(|(k, &w)| w != large_word(from, k))
}

fn large(c: &Communicator) -> Res {
    let (me, (next, prev)) = (c.rank(), ring(c.rank(), c.size()));
    let words = LARGE_BYTES / 8;
    let data: Vec<u64> = (0..words).map(|k| large_word(me, k)).collect();
    let t0 = Instant::now();
    let recv = c.irecv(Vec::<u64>::with_capacity(words), prev, 9).map_err(e)?;
    let send = c.isend(data, next, 9).map_err(e)?;
    let got = recv.wait();
    let sent = send.wait();
    let (b, st) = got.map_err(|err| format!("receive from rank {prev}: {err}"))?;
    sent.map_err(|err| format!("send to rank {next}: {err}"))?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let what = || format!("the 64 MiB message of rank {prev}");
    envelope(&what, &st, prev, 9)?;
    check(st.bytes == LARGE_BYTES && b.len() == words, || format!("{}: expected {LARGE_BYTES} bytes, got {}", what(), st.bytes))?;
    if let Some(k) = large_mismatch(prev, &b) {
        return Err(format!("{}: word {k} (byte {}) is {:#018x}, expected {:#018x}", what(), 8 * k, b[k], large_word(prev, k)));
    }
    println!("large 64 MiB from rank {prev} in {ms:.1} ms");
    Ok(())
}

/// Rounds of `alltoall`.
const ALLTOALL_ROUNDS: u32 = 40;

/// Bytes every rank sends every other rank per round in `alltoall`: above the eager
/// threshold, so each message is a rendezvous read by its receiver.
const ALLTOALL_BYTES: usize = 64 << 10;

/// `alltoall`: every rank reads from every other rank's memory while they read from its
/// own (a read waited for inside progress left every rank waiting for the others).
fn alltoall(c: &Communicator) -> Res {
    let (me, size) = (c.rank(), c.size());
    let fill = |from: u32, round: u32| (from.wrapping_mul(31) ^ round) as u8;
    for round in 0..ALLTOALL_ROUNDS {
        let mut recvs = Vec::new();
        for p in (0..size).filter(|&p| p != me) {
            recvs.push((p, c.irecv(Vec::<u8>::with_capacity(ALLTOALL_BYTES), p, 6).map_err(e)?));
        }
        let mut sends = Vec::new();
        for k in 1..size {
            sends.push(c.isend(vec![fill(me, round); ALLTOALL_BYTES], (me + k) % size, 6).map_err(e)?);
        }
        for (p, r) in recvs {
            let got = r.wait().map_err(|err| format!("round {round}: from {p}: {err}"))?;
            expect(|| format!("round {round}: the message of rank {p}"), &got, p, 6, &vec![fill(p, round); ALLTOALL_BYTES])?;
        }
        weft::wait_all(&mut sends).map_err(e)?;
    }
    println!("alltoall ok: {ALLTOALL_ROUNDS} rounds of {ALLTOALL_BYTES} B to each of {} ranks", size - 1);
    Ok(())
}

/// Partitions of the message of `partitioned`, and words in each: 64 KiB a partition, above
/// the eager threshold, so that from the second round on it may be written straight.
const PART_COUNT: usize = 4;
const PART_WORDS: usize = 8 << 10;
/// Rounds of `partitioned`.
const PART_ROUNDS: u64 = 4;

/// Word `k` of round `round`'s message in `partitioned`.
fn part_word(round: u64, k: usize) -> u64 {
    (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (round + 1).wrapping_mul(0x0101_0101_0101_0101)
}

/// The frames rank 0 receives in a round of `partitioned` at the most when the round's
/// partitions were written straight: rank 1's go-ahead and its clear to write. Sent as
/// rendezvous messages, each partition adds the frame that ends its rendezvous.
const PART_DIRECT_FRAMES: u64 = 2;

/// `partitioned`: see the table in the module docs. Each round rank 1 starts its receive
/// (which sends the round's clear to write) and then sends rank 0 a go-ahead, so that the
/// clear has arrived before any partition is ready.
fn partitioned(rt: &Runtime, c: &Communicator) -> Res {
    let n = PART_COUNT * PART_WORDS;
    if c.rank() == 1 {
        let mut recv = c.precv_init(vec![0u64; n], PART_COUNT, 0, 1).map_err(e)?;
        for round in 0..PART_ROUNDS {
            recv.start().map_err(e)?;
            c.send(&b"g"[..], 0, 2).map_err(e)?;
            recv.wait().map_err(|err| format!("round {}: {err}", round + 1))?;
            let got = recv.buffer().ok_or("the receive's buffer after its wait")?;
            if let Some(k) = got.iter().enumerate().position(|(k, &w)| w != part_word(round, k)) {
                let want = part_word(round, k);
                return Err(format!(
                    "round {}: word {k} (partition {}) is {:#018x}, expected {want:#018x}",
                    round + 1,
                    k / PART_WORDS,
                    got[k]
                ));
            }
        }
        println!("partitioned ok: {PART_ROUNDS} rounds of {PART_COUNT} partitions of {} KiB received whole", PART_WORDS / 128);
        return Ok(());
    }
    let mut send = c.psend_init(vec![0u64; n], PART_COUNT, 1, 1).map_err(e)?;
    let mut frames = Vec::new();
    for round in 0..PART_ROUNDS {
        let before = rt.counters().messages_received;
        let go = c.recv(Vec::<u8>::with_capacity(1), 1, 2).map_err(e)?;
        expect(|| format!("round {}: the go-ahead", round + 1), &go, 1, 2, b"g")?;
        send.start().map_err(e)?;
        let parts = send.partitions().map_err(e)?;
        std::thread::scope(|s| {
            let filled: Vec<_> = parts
                .into_iter()
                .map(|mut p| {
                    s.spawn(move || {
                        let first = p.index() * PART_WORDS;
                        p.as_mut_slice().iter_mut().enumerate().for_each(|(k, w)| *w = part_word(round, first + k));
                        p.ready()
                    })
                })
                .collect();
            filled.into_iter().try_for_each(|h| h.join().map_err(|_| "a filling thread panicked".to_string())?.map_err(e))
        })?;
        send.wait().map_err(|err| format!("round {}: {err}", round + 1))?;
        frames.push(rt.counters().messages_received - before);
    }
    let later = &frames[1..];
    let how = if later.iter().all(|&f| f <= PART_DIRECT_FRAMES) {
        "written straight"
    } else if later.iter().all(|&f| f > PART_DIRECT_FRAMES) {
        "sent as messages"
    } else {
        return Err(format!("rounds 2 on were written straight only in part: frames received per round {frames:?}"));
    };
    // Through the same-host lane this rank met its peer's process: its waiters now spin only
    // while the machine has a core to spare (the multi-process tests check it).
    let shared = if weft_sync::IdleBackoff::cores_shared() { "yes" } else { "no" };
    println!(
        "partitioned ok: rounds 2-{PART_ROUNDS} {how} (frames received per round {frames:?}; cores shared with peers' processes: {shared})"
    );
    Ok(())
}

/// Atomic adds per rank in `rma`.
const RMA_ADDS: u32 = 500;

/// Increments per rank under the lock in `rma`.
const RMA_LOCKED: u32 = 100;

/// `rma`: see the table in the module docs.
fn rma(c: &Communicator) -> Res {
    let (me, n) = (c.rank(), c.size());
    let (next, prev) = ring(me, n);
    // Word 0: the atomic counter; 1..=n: the ring's slots; n + 1: the locked counter; n + 2:
    // the RMA-RW writers' counter.
    let w: Window<'_, u64> = c.window(n as usize + 3).map_err(e)?;
    let w32: Window<'_, u32> = c.window(2).map_err(e)?;
    w.put(next, me as usize + 1, &[u64::from(me) * 1000 + 7]).map_err(e)?;
    w.flush(next).map_err(e)?;
    for _ in 0..RMA_ADDS {
        w.fetch_and_op(0, 0, 1, Op::Sum).map_err(e)?;
        w32.fetch_and_op(0, 1, 1, Op::Sum).map_err(e)?;
    }
    let lock = DMcs::new(c, n - 1).map_err(e)?;
    let locked = n as usize + 1;
    for _ in 0..RMA_LOCKED {
        let g = lock.lock().map_err(e)?;
        let mut v = [0u64];
        w.get(0, locked, &mut v).map_err(e)?;
        w.put(0, locked, &[v[0] + 1]).map_err(e)?;
        w.flush(0).map_err(e)?;
        g.unlock().map_err(e)?;
    }
    let rw = RmaRw::new(c, &Levels::hosts(), &Thresholds { t_r: 4, ..Thresholds::default() }).map_err(e)?;
    let written = n as usize + 2;
    for i in 0..RMA_LOCKED {
        let mut v = [0u64];
        if i % 4 == 0 {
            let g = rw.write().map_err(e)?;
            w.get(0, written, &mut v).map_err(e)?;
            w.put(0, written, &[v[0] + 1]).map_err(e)?;
            w.flush(0).map_err(e)?;
            g.unlock().map_err(e)?;
        } else {
            let g = rw.read().map_err(e)?;
            w.get(0, written, &mut v).map_err(e)?;
            g.unlock().map_err(e)?;
        }
    }
    // Every rank's operations are complete (flushed, or atomics) before it says goodbye.
    goodbye(c)?;
    let mut mine = vec![0u64; n as usize + 3];
    w.read_local(0, &mut mine).map_err(e)?;
    check(mine[prev as usize + 1] == u64::from(prev) * 1000 + 7, || format!("slot of rank {prev}: got {}", mine[prev as usize + 1]))?;
    if me == 0 {
        let total = n * RMA_ADDS;
        check(mine[0] == u64::from(total), || format!("64-bit counter: expected {total}, got {}", mine[0]))?;
        let mut c32 = [0u32; 2];
        w32.read_local(0, &mut c32).map_err(e)?;
        check(c32 == [0, total], || format!("32-bit counter and its neighbour: expected [0, {total}], got {c32:?}"))?;
        let want = u64::from(n * RMA_LOCKED);
        check(mine[locked] == want, || format!("counter under the lock: expected {want}, got {} (the lock let two in)", mine[locked]))?;
        let want = u64::from(n * RMA_LOCKED.div_ceil(4));
        check(mine[written] == want, || format!("RMA-RW writers' counter: expected {want}, got {} (two writers in)", mine[written]))?;
    }
    drop((lock, rw));
    w.free().map_err(e)?;
    w32.free().map_err(e)?;
    println!("rma ok: {RMA_ADDS} atomic adds, {RMA_LOCKED} locked increments and {RMA_LOCKED} RMA-RW acquisitions from each of {n} ranks, a put on a ring");
    Ok(())
}

/// Words of the `locks` check's window on rank 0, per lock: the count the writers increment,
/// the writers inside and the readers inside.
const LOCK_WORDS: usize = 3;

/// The longest the tasks of a rank take one lock in the `locks` check's tasks mode before
/// the check fails.
const LOCK_TASKS_LIMIT: Duration = Duration::from_secs(60);

/// A lock's critical section in a task: takes `$lock` (an `Arc`) with `$read().await` or
/// `$write().await`, does [`LockWords::inside`], and releases with `unlock_async`.
macro_rules! async_section {
    ($lock:expr, $read:ident, $write:ident) => {{
        let lock = $lock.clone();
        move |w: Arc<Window<'static, u64>>, words: LockWords, write: bool| {
            let lock = lock.clone();
            async move {
                let g = if write { lock.$write().await } else { lock.$read().await }.map_err(e)?;
                let inside = words.inside(&w, write);
                g.unlock_async().await.map_err(e)?;
                inside
            }
        }
    }};
}

/// `locks`: every lock of `weft::dlock` in turn under [`lock_stress`] (threads), or with
/// `tasks` tasks per rank under [`lock_stress_tasks`]; prints each lock's acquisitions and
/// time.
fn locks(rt: &Runtime, c: &Communicator, acquisitions: u64, threads: u32, tasks: u32, write_every: u64) -> Res {
    if threads == 0 || write_every == 0 {
        return Err("locks: --threads and --write-every must be at least 1".into());
    }
    let (levels, t) = (Levels::hosts(), Thresholds { t_r: 4, ..Thresholds::default() });
    let w: Window<'static, u64> = c.window(5 * LOCK_WORDS).map_err(e)?;
    let home = c.size() - 1;
    let dmcs = Arc::new(DMcs::new(c, home).map_err(e)?);
    let mcs = Arc::new(RmaMcs::new(c, &levels, &t).map_err(e)?);
    let rw = Arc::new(RmaRw::new(c, &levels, &t).map_err(e)?);
    let spin = Arc::new(SpinLock::new(c, home).map_err(e)?);
    let frw = Arc::new(FompiRw::new(c, home).map_err(e)?);
    let w = Arc::new(w);
    let mut done = Vec::new();
    let who = if tasks > 0 {
        let p = StressParams { acquisitions, threads: tasks, write_every };
        done.push(lock_stress_tasks(rt, c, &w, (0, "d-mcs"), &p.exclusive(), async_section!(dmcs, lock_async, lock_async))?);
        done.push(lock_stress_tasks(rt, c, &w, (1, "rma-mcs"), &p.exclusive(), async_section!(mcs, lock_async, lock_async))?);
        done.push(lock_stress_tasks(rt, c, &w, (2, "rma-rw"), &p, async_section!(rw, read_async, write_async))?);
        done.push(lock_stress_tasks(rt, c, &w, (3, "fompi-spin"), &p.exclusive(), async_section!(spin, lock_async, lock_async))?);
        done.push(lock_stress_tasks(rt, c, &w, (4, "fompi-rw"), &p, async_section!(frw, read_async, write_async))?);
        format!("{tasks} tasks")
    } else {
        let p = StressParams { acquisitions, threads, write_every };
        done.push(lock_stress(c, &w, (0, "d-mcs"), &p.exclusive(), || dmcs.lock(), || dmcs.lock(), |g| g.unlock())?);
        done.push(lock_stress(c, &w, (1, "rma-mcs"), &p.exclusive(), || mcs.lock(), || mcs.lock(), |g| g.unlock())?);
        done.push(lock_stress(c, &w, (2, "rma-rw"), &p, || rw.read(), || rw.write(), |g| g.unlock())?);
        done.push(lock_stress(c, &w, (3, "fompi-spin"), &p.exclusive(), || spin.lock(), || spin.lock(), |g| g.unlock())?);
        done.push(lock_stress(c, &w, (4, "fompi-rw"), &p, || frw.read(), || frw.write(), |g| g.unlock())?);
        format!("{threads} threads")
    };
    goodbye(c)?;
    drop((dmcs, mcs, rw, spin, frw));
    Arc::into_inner(w).ok_or("locks: a task still holds the window")?.free().map_err(e)?;
    println!("locks ok: rank {} of {}, {who} x {acquisitions} acquisitions of each lock: {}", c.rank(), c.size(), done.join(", "));
    Ok(())
}

/// How [`lock_stress`] takes a lock: `threads` threads (or tasks) per rank, each
/// `acquisitions` times.
#[derive(Clone, Copy)]
struct StressParams {
    acquisitions: u64,
    threads: u32,
    write_every: u64,
}

impl StressParams {
    /// The same for a mutual-exclusion lock: every acquisition writes.
    fn exclusive(&self) -> StressParams {
        StressParams { write_every: 1, ..*self }
    }

    /// Whether acquisition `i` of thread or task `t` on rank `rank` is a write.
    fn writes(&self, i: u64, t: u64, rank: u32) -> bool {
        (i + t + u64::from(rank)) % self.write_every == 0
    }
}

/// The `locks` check's words of one lock on rank 0 (`LOCK_WORDS` from `LOCK_WORDS * slot`),
/// and its name.
#[derive(Clone, Copy)]
struct LockWords {
    count: usize,
    writers: usize,
    readers: usize,
    name: &'static str,
}

impl LockWords {
    fn new((slot, name): (usize, &'static str)) -> Self {
        LockWords { count: LOCK_WORDS * slot, writers: LOCK_WORDS * slot + 1, readers: LOCK_WORDS * slot + 2, name }
    }

    fn fail(&self, what: String) -> String {
        format!("{}: {what}", self.name)
    }

    /// What a holder does inside: a writer raises the writers inside, finds no other holder,
    /// increments the count non-atomically (get, add, put, flush) and lowers the writers; a
    /// reader raises the readers inside, finds no writer and reads the count twice, unchanged.
    fn inside(&self, w: &Window<'_, u64>, write: bool) -> Res {
        if write {
            let others = w.fetch_and_op(0, self.writers, 1, Op::Sum).map_err(e)?;
            let inside = w.fetch_and_op(0, self.readers, 0, Op::NoOp).map_err(e)?;
            if others != 0 || inside != 0 {
                return Err(self.fail(format!("a writer found {others} other writers and {inside} readers inside")));
            }
            let mut v = [0u64];
            w.get(0, self.count, &mut v).map_err(e)?;
            w.put(0, self.count, &[v[0] + 1]).map_err(e)?;
            w.flush(0).map_err(e)?;
            w.fetch_and_op(0, self.writers, u64::MAX, Op::Sum).map_err(e)?;
            return Ok(());
        }
        w.fetch_and_op(0, self.readers, 1, Op::Sum).map_err(e)?;
        let inside = w.fetch_and_op(0, self.writers, 0, Op::NoOp).map_err(e)?;
        let (mut a, mut b) = ([0u64], [0u64]);
        w.get(0, self.count, &mut a).map_err(e)?;
        w.get(0, self.count, &mut b).map_err(e)?;
        w.fetch_and_op(0, self.readers, u64::MAX, Op::Sum).map_err(e)?;
        check(inside == 0 && a == b, || {
            self.fail(format!("a reader found {inside} writers inside, and the count went from {} to {}", a[0], b[0]))
        })
    }

    /// After every rank's holders are done: the count on rank 0 must be the writes of every
    /// rank; returns the lock's line of the summary.
    fn tally(&self, c: &Communicator, w: &Window<'_, u64>, p: &StressParams, writes: u64, took: Duration) -> Result<String, String> {
        let mut all = [0u64];
        c.allreduce(&[writes], &mut all, weft::Op::Sum).map_err(e)?;
        if c.rank() == 0 {
            let mut v = [0u64];
            w.read_local(self.count, &mut v).map_err(e)?;
            check(v[0] == all[0], || {
                self.fail(format!("expected a count of {} writes, found {} (an update was lost: two writers were inside)", all[0], v[0]))
            })?;
        }
        let n = u64::from(p.threads) * p.acquisitions;
        // The job's rate: every rank's acquisitions over this rank's time (the ranks start
        // together at the barrier and their times differ little).
        let rate = (n * u64::from(c.size())) as f64 / took.as_secs_f64().max(1e-9);
        Ok(format!("{} {n} ({writes} writes) in {:.2} s, {rate:.0} acquisitions/s in the job", self.name, took.as_secs_f64()))
    }
}

/// The first failure of several holders (each failure with its time: a failing holder
/// leaves its count in the words, so the others' checks fail after it), or the writes.
fn first_failure(ends: Vec<Result<u64, (Instant, String)>>) -> Result<u64, String> {
    let failed = ends.iter().filter(|r| r.is_err()).count();
    match ends.iter().filter_map(|r| r.as_ref().err()).min_by_key(|(at, _)| *at) {
        Some((_, first)) if failed > 1 => Err(format!("{first} (the first of {failed} holders that failed here)")),
        Some((_, first)) => Err(first.clone()),
        None => Ok(ends.into_iter().map(|r| r.unwrap_or(0)).sum()),
    }
}

/// `p.threads` threads of this rank take a lock `p.acquisitions` times each, every
/// `p.write_every`-th time with `write`, else with `read`, and do [`LockWords::inside`]
/// while they hold it; then [`LockWords::tally`]. `lock` is the lock's slot of words and its
/// name.
fn lock_stress<G>(
    c: &Communicator,
    w: &Window<'_, u64>,
    lock: (usize, &'static str),
    p: &StressParams,
    read: impl Fn() -> Result<G, Error> + Sync,
    write: impl Fn() -> Result<G, Error> + Sync,
    unlock: impl Fn(G) -> Result<(), Error> + Sync,
) -> Result<String, String> {
    let words = LockWords::new(lock);
    c.barrier().map_err(e)?;
    let t0 = Instant::now();
    let writes: Result<u64, String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..u64::from(p.threads))
            .map(|t| {
                let (read, write, unlock) = (&read, &write, &unlock);
                s.spawn(move || -> Result<u64, (Instant, String)> {
                    let run = || -> Result<u64, String> {
                        let mut writes = 0;
                        for i in 0..p.acquisitions {
                            let writing = p.writes(i, t, c.rank());
                            let g = if writing { write() } else { read() }.map_err(e)?;
                            let inside = words.inside(w, writing);
                            unlock(g).map_err(e)?;
                            inside?;
                            writes += u64::from(writing);
                        }
                        Ok(writes)
                    };
                    run().map_err(|m| (Instant::now(), m))
                })
            })
            .collect();
        first_failure(
            hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err((Instant::now(), words.fail("a thread panicked".into()))))).collect(),
        )
    });
    let took = t0.elapsed();
    words.tally(c, w, p, writes?, took)
}

/// [`lock_stress`] with tasks: `p.threads` tasks of this rank on the runtime's pool
/// ([`Runtime::spawn`]) take the lock `p.acquisitions` times each through its `_async`
/// acquire (`section`, made by [`async_section!`]), so that the tasks waiting for it are
/// parked, not their threads; each fails once [`LOCK_TASKS_LIMIT`] passed.
fn lock_stress_tasks<S, F>(
    rt: &Runtime,
    c: &Communicator,
    w: &Arc<Window<'static, u64>>,
    lock: (usize, &'static str),
    p: &StressParams,
    section: S,
) -> Result<String, String>
where
    S: Fn(Arc<Window<'static, u64>>, LockWords, bool) -> F + Clone + Send + 'static,
    F: std::future::Future<Output = Res> + Send,
{
    let words = LockWords::new(lock);
    c.barrier().map_err(e)?;
    let t0 = Instant::now();
    let deadline = t0 + LOCK_TASKS_LIMIT;
    let tasks: Vec<_> = (0..u64::from(p.threads))
        .map(|t| {
            let (section, w, rank, p) = (section.clone(), w.clone(), c.rank(), *p);
            rt.spawn(async move {
                let mut writes = 0;
                for i in 0..p.acquisitions {
                    if Instant::now() > deadline {
                        let m = format!("task {t}: {i} of {} acquisitions after {LOCK_TASKS_LIMIT:?}", p.acquisitions);
                        return Err((Instant::now(), words.fail(m)));
                    }
                    let writing = p.writes(i, t, rank);
                    section(w.clone(), words, writing).await.map_err(|m| (Instant::now(), m))?;
                    writes += u64::from(writing);
                }
                Ok(writes)
            })
        })
        .collect();
    let ends = tasks
        .into_iter()
        .map(|h| rt.block_on(h).unwrap_or_else(|err| Err((Instant::now(), words.fail(format!("a task failed: {err}"))))))
        .collect();
    let writes = first_failure(ends);
    let took = t0.elapsed();
    words.tally(c, w, p, writes?, took)
}

/// `comms`: communicators over a subset of the ranks and the collectives on them, against
/// what each rank computes alone.
fn comms(c: &Communicator) -> Res {
    let (me, n) = (c.rank(), c.size());
    let half = c.split(Some(u32::from(me >= n / 2)), 0).map_err(e)?.ok_or("split gave no communicator")?;
    let lo = n / 2;
    let (members, first) = if me >= lo { (n - lo, lo) } else { (lo, 0) };
    check(half.size() == members && half.rank() == me - first, || format!("split: rank {} of {}", half.rank(), half.size()))?;
    let ends = c.group().incl(&[0, n - 1]).map_err(e)?;
    if ends.rank().is_some() {
        let pair = c.create_group(&ends, 1).map_err(e)?;
        let other = 1 - pair.rank();
        let r = pair.irecv(Vec::<u32>::with_capacity(1), other, 2).map_err(e)?;
        pair.send(vec![me], other, 2).map_err(e)?;
        let (v, st) = r.wait().map_err(e)?;
        check(v == [if me == 0 { n - 1 } else { 0 }] && st.source == other, || format!("create_group: got {v:?} from {}", st.source))?;
        pair.free();
    }
    for comm in [c, &half] {
        comm.barrier().map_err(e)?;
        for root in 0..comm.size() {
            let mut data = if comm.rank() == root { vec![root as u64 + 7; 1000] } else { vec![0; 1000] };
            comm.bcast(&mut data, root).map_err(e)?;
            check(data == vec![root as u64 + 7; 1000], || format!("bcast from {root}: got {:?}", &data[..2]))?;
        }
        let ranks: Vec<u32> =
            comm.group().translate_ranks(&(0..comm.size()).collect::<Vec<_>>(), &c.group()).map_err(e)?.into_iter().flatten().collect();
        for len in [1usize, 32 << 10] {
            let mut sum = vec![0u64; len];
            comm.allreduce(&vec![u64::from(me) + 1; len], &mut sum, weft::Op::Sum).map_err(e)?;
            let want: u64 = ranks.iter().map(|&r| u64::from(r) + 1).sum();
            check(sum.iter().all(|&x| x == want), || format!("allreduce of {len} elements: got {} for {want}", sum[0]))?;
        }
        let mut all = vec![0u32; comm.size() as usize];
        comm.allgather(&[comm.rank() * 3], &mut all).map_err(e)?;
        check(all.iter().enumerate().all(|(i, &x)| x == i as u32 * 3), || format!("allgather: got {all:?}"))?;
        let mut sum = vec![0u64; if comm.rank() == 0 { 1 } else { 0 }];
        comm.reduce(&[u64::from(me)], &mut sum, weft::Op::Sum, 0).map_err(e)?;
        let want: u64 = ranks.iter().map(|&r| u64::from(r)).sum();
        check(comm.rank() != 0 || sum == [want], || format!("reduce to 0: got {sum:?} for {want}"))?;
        let mut gathered = vec![0u32; if comm.rank() == 0 { comm.size() as usize } else { 0 }];
        comm.gather(&[comm.rank() + 100], &mut gathered, 0).map_err(e)?;
        let mut back = [0u32];
        comm.scatter(&gathered, &mut back, 0).map_err(e)?;
        check(back == [comm.rank() + 100], || format!("gather then scatter from 0: got {back:?}"))?;
        persistent(comm, &ranks)?;
    }
    // Nonblocking: two allreduces and an alltoall outstanding at once, waited for last first.
    let a = c.iallreduce(vec![u64::from(me) + 1; 3], weft::Op::Sum).map_err(e)?;
    let b = c.iallreduce(vec![u64::from(me); 40 << 10], weft::Op::Max).map_err(e)?;
    let send: Vec<u32> = (0..n).map(|q| me * 100 + q).collect();
    let x = c.ialltoall(&send, vec![0; n as usize]).map_err(e)?;
    let (x, _) = x.wait().map_err(e)?;
    check(x.iter().enumerate().all(|(q, &v)| v == q as u32 * 100 + me), || format!("ialltoall: got {x:?}"))?;
    let (b, _) = b.wait().map_err(e)?;
    check(b.iter().all(|&v| v == u64::from(n) - 1), || format!("iallreduce max: got {}", b[0]))?;
    let (a, _) = a.wait().map_err(e)?;
    let want = u64::from(n) * u64::from(n + 1) / 2;
    check(a == [want; 3], || format!("iallreduce sum: got {a:?} for {want}"))?;
    half.free();
    println!("comms ok: halves of {members}, collectives on {n} ranks");
    Ok(())
}

/// Persistent collectives on `comm`, whose ranks are the world ranks `ranks`, each started
/// twice: an allreduce of a large message (reduce-scatter and allgather), an allgather and a
/// scan.
fn persistent(comm: &Communicator, ranks: &[u32]) -> Res {
    let (r, size) = (comm.rank(), comm.size());
    let mut sum = comm.allreduce_init(vec![0u64; 32 << 10], weft::Op::Sum).map_err(e)?;
    let mut all = comm.allgather_init(vec![0u32; size as usize]).map_err(e)?;
    let mut scan = comm.scan_init(vec![0u64; 2], weft::Op::Sum).map_err(e)?;
    for k in 0..2u32 {
        sum.buffer_mut().ok_or("allreduce_init: no buffer")?.fill(u64::from(ranks[r as usize] + k));
        all.buffer_mut().ok_or("allgather_init: no buffer")?[r as usize] = r * 3 + k;
        scan.buffer_mut().ok_or("scan_init: no buffer")?.fill(u64::from(r) + 1);
        sum.start().map_err(e)?;
        all.start().map_err(e)?;
        scan.start().map_err(e)?;
        sum.wait().map_err(e)?;
        all.wait().map_err(e)?;
        scan.wait().map_err(e)?;
        let want: u64 = ranks.iter().map(|&w| u64::from(w + k)).sum();
        let got = sum.buffer().ok_or("allreduce_init: no buffer")?;
        check(got.iter().all(|&x| x == want), || format!("allreduce_init, start {k}: got {} for {want}", got[0]))?;
        let got = all.buffer().ok_or("allgather_init: no buffer")?;
        check(got.iter().enumerate().all(|(i, &x)| x == i as u32 * 3 + k), || format!("allgather_init, start {k}: got {got:?}"))?;
        let want = u64::from(r + 1) * u64::from(r + 2) / 2;
        let got = scan.buffer().ok_or("scan_init: no buffer")?;
        check(got == &[want; 2], || format!("scan_init, start {k}: got {got:?} for {want}"))?;
    }
    Ok(())
}

/// Kills this process with SIGKILL, which nothing can catch (libfabric's SIGABRT handler
/// would turn an abort into a normal exit): a crashed node, as far as the peers can tell.
fn die() -> ! {
    // SAFETY: plain syscalls on this process.
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    unreachable!("SIGKILL returned");
}

/// `coll-peer-lost`: the last rank kills itself once every rank has passed a barrier; the
/// others' allreduces (recursive doubling and ring) and barrier each fail with `PeerLost`
/// naming it, on every one of them, within seconds.
fn coll_peer_lost(c: &Communicator) -> Res {
    let (me, n) = (c.rank(), c.size());
    c.barrier().map_err(e)?;
    if me == n - 1 {
        eprintln!("rank {me} killing itself on purpose");
        die()
    }
    let t0 = Instant::now();
    let lost = Err(Error::PeerLost { rank: n - 1 });
    let small = c.allreduce(&[1u32], &mut [0u32], weft::Op::Sum);
    check(small == lost, || format!("small allreduce: expected PeerLost, got {small:?}"))?;
    let long = vec![1u32; 64 << 10];
    let large = c.allreduce(&long, &mut long.clone(), weft::Op::Sum);
    check(large == lost, || format!("large allreduce: expected PeerLost, got {large:?}"))?;
    let bar = c.barrier();
    check(bar == lost, || format!("barrier: expected PeerLost, got {bar:?}"))?;
    let ms = t0.elapsed().as_millis();
    check(t0.elapsed() < Duration::from_secs(20), || format!("PeerLost took {ms} ms"))?;
    // The survivors leave together (through rank 0, point to point): one that left early
    // would be a lost peer to those still in their collectives.
    if me == 0 {
        for r in 1..n - 1 {
            c.recv(Vec::<u8>::with_capacity(1), r, 5).map_err(e)?;
        }
        for r in 1..n - 1 {
            c.send(vec![0u8], r, 5).map_err(e)?;
        }
    } else {
        c.send(vec![0u8], 0, 5).map_err(e)?;
        c.recv(Vec::<u8>::with_capacity(1), 0u32, 5).map_err(e)?;
    }
    println!("coll-peer-lost ok after {ms} ms");
    Ok(())
}

/// `peer-lost-read`: see the table in the module docs.
fn peer_lost_read(rt: &Runtime, c: &Communicator) -> Res {
    let n = 64usize << 20;
    match c.rank() {
        0 => {
            let data = vec![0x5au8; n];
            let go = c.recv(Vec::<u8>::with_capacity(1), 1u32, 1).map_err(e)?;
            expect(|| "rank 1's go".into(), &go, 1, 1, b"!")?;
            let _send = c.isend(data, 1, 7).map_err(e)?;
            // Serve the start of rank 1's read, then die with the rest outstanding.
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(5) {
                rt.progress();
            }
            eprintln!("rank 0 killing itself on purpose");
            die()
        }
        _ => {
            let recv = c.irecv(Vec::<u8>::with_capacity(n), 0u32, 7).map_err(e)?;
            c.send(&b"!"[..], 0, 1).map_err(e)?;
            let t0 = Instant::now();
            let r = recv.wait();
            let ms = t0.elapsed().as_millis();
            match r {
                Err(Error::PeerLost { rank: 0 }) => println!("peer-lost-read ok: PeerLost after {ms} ms"),
                Ok((b, st)) if st.bytes == n && b.iter().all(|&x| x == 0x5a) => {
                    println!("peer-lost-read ok: the read was done before the loss ({ms} ms)")
                }
                other => return Err(format!("receive from the killed sender: expected PeerLost, got {:?}", other.map(|(_, st)| st))),
            }
            check(t0.elapsed() < Duration::from_secs(20), || format!("PeerLost took {ms} ms"))
        }
    }
}

fn peer_lost(c: &Communicator) -> Res {
    match c.rank() {
        0 => {
            let go = c.recv(Vec::<u8>::with_capacity(1), 1u32, 1).map_err(e)?;
            expect(|| "rank 1's go".into(), &go, 1, 1, b"!")?;
            eprintln!("rank 0 killing itself on purpose");
            die()
        }
        _ => {
            let recv = c.irecv(Vec::<u8>::with_capacity(8), 0u32, 99).map_err(e)?;
            let send = c.isend(vec![1u8; 1 << 20], 0, 98).map_err(e)?;
            c.send(&b"!"[..], 0, 1).map_err(e)?;
            let t0 = Instant::now();
            let r = recv.wait();
            check(matches!(r, Err(Error::PeerLost { rank: 0 })), || format!("pending receive: expected PeerLost, got {r:?}"))?;
            let s = send.wait();
            check(matches!(s, Err(Error::PeerLost { rank: 0 })), || format!("pending rendezvous send: expected PeerLost, got {s:?}"))?;
            let again = c.send(vec![0u8; 8], 0, 3);
            check(matches!(again, Err(Error::PeerLost { rank: 0 })), || format!("new send: expected PeerLost, got {again:?}"))?;
            let late = c.recv(Vec::<u8>::with_capacity(8), 0u32, Tag::Any);
            check(matches!(late, Err(Error::PeerLost { rank: 0 })), || format!("new receive: expected PeerLost, got {late:?}"))?;
            let ms = t0.elapsed().as_millis();
            check(t0.elapsed() < Duration::from_secs(10), || format!("PeerLost took {ms} ms"))?;
            println!("peer-lost ok after {ms} ms");
            Ok(())
        }
    }
}

/// Bytes of each message of `kill-in-wait-all` (rendezvous).
const WAIT_ALL_BYTES: usize = 4 << 20;

/// What rank `from` sends the other survivor in `kill-in-wait-all`.
fn wait_all_message(from: u32) -> Vec<u8> {
    (0..WAIT_ALL_BYTES).map(|k| (k / 4093 + from as usize * 101) as u8).collect()
}

/// `kill-in-wait-all`: see the table in the module docs.
fn kill_in_wait_all(c: &Communicator) -> Res {
    let me = c.rank();
    if me == 2 {
        for from in [0u32, 1] {
            let go = c.recv(Vec::<u8>::with_capacity(1), from, 1).map_err(e)?;
            expect(|| format!("rank {from}'s go"), &go, from, 1, b"!")?;
        }
        // Both are about to wait (or waiting): their outcome may not depend on which.
        std::thread::sleep(Duration::from_millis(200));
        eprintln!("rank 2 killing itself on purpose");
        die()
    }
    let other = 1 - me;
    let mut reqs = vec![
        c.irecv(Vec::<u8>::with_capacity(WAIT_ALL_BYTES), other, 5).map_err(e)?,
        c.irecv(Vec::<u8>::with_capacity(WAIT_ALL_BYTES), 2u32, 6).map_err(e)?,
        c.isend(wait_all_message(me), other, 5).map_err(e)?,
        c.isend(vec![9u8; WAIT_ALL_BYTES], 2, 7).map_err(e)?,
    ];
    c.send(&b"!"[..], 2, 1).map_err(e)?;
    let t0 = Instant::now();
    let all = weft::wait_all(&mut reqs);
    let ms = t0.elapsed().as_millis();
    check(matches!(all, Err(Error::PeerLost { rank: 2 })), || format!("wait_all: expected PeerLost of rank 2, got {all:?}"))?;
    check(t0.elapsed() < Duration::from_secs(10), || format!("PeerLost took {ms} ms"))?;
    let mut outcome = |i: usize| reqs[i].take().ok_or_else(|| format!("request {i} not complete after wait_all"));
    let got = outcome(0)?.map_err(|err| format!("the receive from rank {other}: {err}"))?;
    expect(|| format!("the message of rank {other}"), &got, other, 5, &wait_all_message(other))?;
    let from_dead = outcome(1)?;
    check(matches!(from_dead, Err(Error::PeerLost { rank: 2 })), || {
        format!("the receive from rank 2: expected PeerLost, got {from_dead:?}")
    })?;
    outcome(2)?.map_err(|err| format!("the send to rank {other}: {err}"))?;
    let to_dead = outcome(3)?.map(|(_, st)| st);
    check(matches!(to_dead, Err(Error::PeerLost { rank: 2 })), || format!("the send to rank 2: expected PeerLost, got {to_dead:?}"))?;
    println!("kill-in-wait-all ok: PeerLost after {ms} ms");
    Ok(())
}

/// `kill-mid-transfer`: see the table in the module docs.
fn kill_mid_transfer(c: &Communicator, delay: Duration) -> Res {
    const LEN: usize = 64 << 20;
    const MESSAGES: u8 = 100;
    match c.rank() {
        0 => {
            for i in 0..MESSAGES {
                let t0 = Instant::now();
                match c.send(vec![i; LEN], 1, 1) {
                    Ok(_) => {}
                    Err(Error::PeerLost { rank: 1 }) => {
                        let ms = t0.elapsed().as_millis();
                        check(t0.elapsed() < Duration::from_secs(10), || format!("PeerLost took {ms} ms"))?;
                        println!("kill-mid-transfer ok: PeerLost after {ms} ms, in message {i}");
                        return Ok(());
                    }
                    Err(err) => return Err(format!("message {i}: expected PeerLost, got {err:?}")),
                }
            }
            Err(format!("all {MESSAGES} messages went out: rank 1 did not die"))
        }
        _ => {
            let mut buf = Vec::<u8>::with_capacity(LEN);
            for i in 0..MESSAGES {
                if i == 0 {
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        die()
                    });
                }
                buf = c.recv(buf, 0u32, 1).map_err(e)?.0;
            }
            Err("rank 1 outlived every message".into())
        }
    }
}

/// `outlive-launcher`: see the table in the module docs. Nothing is printed once the wait
/// ends: `weftrun`, which forwarded the output, is gone.
fn outlive_launcher(c: &Communicator) -> Res {
    if c.rank() == 1 {
        // SAFETY: ignoring a signal is async-signal-safe and affects only this process
        // (libfabric's own handler, which removes the regions, is replaced).
        unsafe { libc::signal(libc::SIGTERM, libc::SIG_IGN) };
    }
    println!("pid {}", std::process::id());
    let r = c.recv(Vec::<u8>::with_capacity(1), Source::Any, 77);
    if matches!(r, Err(Error::PeerLost { .. })) {
        die();
    }
    r.map(|(b, st)| println!("outlive-launcher: unexpected message from rank {}: {}", st.source, show(&b))).map_err(e)
}

/// Messages rank 1 sends before it finishes in `peer-finished`.
const BEFORE_FINISH: u8 = 8;
/// Tag of the message that lets rank 1 finish in `peer-finished`.
const GO: i32 = 2;

/// `peer-finished`: see the table in the module docs. Takes the runtime and the check's
/// communicator because rank 1 drops them (finishes).
fn peer_finished(rt: Runtime, c: Communicator) -> Res {
    match c.rank() {
        0 => {
            // Receives only rank 1 could match, posted before it finishes.
            let mut pending = c.irecv(Vec::<u8>::with_capacity(8), 1u32, 99).map_err(e)?;
            let mut any = c.irecv(Vec::<u8>::with_capacity(8), Source::Any, 98).map_err(e)?;
            // Rank 1 finishes only once these receives are posted: without this, it could
            // leave while this rank is still completing the `dup` that made `c`, and the
            // receives would fail when posted instead of pending.
            c.send(Vec::<u8>::new(), 1, GO).map_err(e)?;
            // No progress meanwhile: rank 1's messages and its finish both arrive before
            // this rank looks, the case where the messages must still come first.
            std::thread::sleep(Duration::from_millis(1500));
            for i in 0..BEFORE_FINISH {
                let got =
                    c.recv(Vec::<u8>::with_capacity(256), 1u32, 1).map_err(|err| format!("message {i} sent before the finish: {err}"))?;
                expect(|| format!("message {i} sent before the finish"), &got, 1, 1, &vec![i; 16 << (i % 4)])?;
            }
            let t0 = Instant::now();
            while !(pending.test() && any.test()) {
                check(t0.elapsed() < Duration::from_secs(10), || "receives from the finished rank still pending after 10 s".into())?;
                std::thread::sleep(Duration::from_millis(1));
            }
            let r = pending.take();
            check(matches!(r, Some(Err(Error::PeerLost { rank: 1 }))), || format!("pending receive: expected PeerLost, got {r:?}"))?;
            let r = any.take();
            check(matches!(r, Some(Err(Error::PeerLost { rank: 1 }))), || {
                format!("pending Source::Any receive: expected PeerLost, got {r:?}")
            })?;
            let late = c.recv(Vec::<u8>::with_capacity(8), 1u32, Tag::Any);
            check(matches!(late, Err(Error::PeerLost { rank: 1 })), || format!("new receive: expected PeerLost, got {late:?}"))?;
            let send = c.send(vec![0u8; 8], 1, 3);
            check(matches!(send, Err(Error::PeerLost { rank: 1 })), || format!("new send: expected PeerLost, got {send:?}"))?;
            println!("peer-finished ok after {} ms", t0.elapsed().as_millis());
            drop((pending, any));
            c.free();
        }
        _ => {
            c.recv(Vec::<u8>::new(), 0u32, GO).map_err(e)?;
            for i in 0..BEFORE_FINISH {
                c.send(vec![i; 16 << (i % 4)], 0, 1).map_err(e)?;
            }
            drop(c);
            drop(rt);
            println!("peer-finished: rank 1 finished");
        }
    }
    Ok(())
}

fn netns(c: &Communicator) -> Res {
    let other = 1 - c.rank();
    let r = c.irecv(Vec::<u8>::with_capacity(64), other, 4).map_err(e)?;
    c.send(format!("hello from rank {}", c.rank()).into_bytes(), other, 4).map_err(e)?;
    let got = r.wait().map_err(e)?;
    expect(|| format!("the greeting of rank {other}"), &got, other, 4, format!("hello from rank {other}").as_bytes())?;
    let r = c.irecv(Vec::<u8>::with_capacity(1 << 20), other, 5).map_err(e)?;
    c.send(vec![c.rank() as u8; 1 << 20], other, 5).map_err(e)?;
    let got = r.wait().map_err(e)?;
    expect(|| format!("the 1 MiB message of rank {other}"), &got, other, 5, &vec![other as u8; 1 << 20])?;
    println!("netns ok: rank {} exchanged with rank {other}", c.rank());
    Ok(())
}

/// Runs one check (not `all`, which is its steps, nor `peer-finished`, which owns the
/// runtime) on `c`, the check's own communicator.
fn run_step(check: Check, rt: &Runtime, c: &Communicator) -> Res {
    match check {
        Check::Hello => {
            println!("rank {} of {} on {}", rt.rank(), rt.size(), rt.config().provider);
            match rt.host_ranks() {
                Some(h) => println!("host ranks {} (from the launcher)", h.iter().map(u32::to_string).collect::<Vec<_>>().join(",")),
                None => println!("host ranks not told by the launcher"),
            }
            Ok(())
        }
        Check::Pingpong => pingpong(c),
        Check::Multirate => multirate(c),
        Check::Wildcard => wildcard(c),
        Check::Order => order(c),
        Check::FanIn => fan_in(c),
        Check::Large => large(c),
        Check::Alltoall => alltoall(c),
        Check::Partitioned => partitioned(rt, c),
        Check::Rma => rma(c),
        Check::Locks { acquisitions, threads, tasks, write_every } => locks(rt, c, acquisitions, threads, tasks, write_every),
        Check::LockEnds => lock_ends(rt, c),
        Check::Comms => comms(c),
        Check::PeerLost => peer_lost(c),
        Check::PeerLostRead => peer_lost_read(rt, c),
        Check::CollPeerLost => coll_peer_lost(c),
        Check::KillMidTransfer { ms } => kill_mid_transfer(c, Duration::from_millis(ms)),
        Check::KillInWaitAll => kill_in_wait_all(c),
        Check::OutliveLauncher => outlive_launcher(c),
        Check::Netns => netns(c),
        Check::Block => {
            println!("pid {}", std::process::id());
            c.recv(Vec::<u8>::with_capacity(1), Source::Any, 77).map(|_| ()).map_err(e)
        }
        Check::ExitCode => Ok(()),
        Check::Soak { messages, threads, max_size, seconds, kill_rank, .. } => {
            let p = soak::Params { messages, threads, max_size, seconds, kill_rank };
            soak_rank(c, &p)
        }
        Check::All | Check::PeerFinished => Err(format!("{} is not a single step", check.name())),
    }
}

/// The exit handshake, on a communicator of its own: every rank tells every other that it
/// is done and waits to hear the same from each, so nobody leaves while a peer may still
/// need it.
fn goodbye(c: &Communicator) -> Res {
    let me = c.rank();
    for r in (0..c.size()).filter(|&r| r != me) {
        c.send(&b"."[..], r, 0).map_err(e)?;
    }
    for r in (0..c.size()).filter(|&r| r != me) {
        let got = c.recv(Vec::<u8>::with_capacity(1), r, 0).map_err(e)?;
        expect(|| format!("the goodbye of rank {r}"), &got, r, 0, b".")?;
    }
    Ok(())
}

/// Why a rank stops short.
#[derive(Debug)]
struct Failure {
    /// The check that failed (within `all`, the step).
    check: &'static str,
    /// This rank and the job's size, once the runtime runs.
    rank: Option<(u32, u32)>,
    /// Exit status: 1 for a failed check, 2 for a check started at a number of ranks it
    /// does not take.
    status: i32,
    msg: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.status, self.rank) {
            (2, Some((r, n))) => write!(f, "weft-selftest {}: rank {r} of {n}: {}", self.check, self.msg),
            (_, Some((r, n))) => write!(f, "weft-selftest {}: FAILED on rank {r} of {n}: {}", self.check, self.msg),
            (_, None) => write!(f, "weft-selftest {}: FAILED: {}", self.check, self.msg),
        }
    }
}

/// One rank's soak on communicators made from `c`; prints its summary.
fn soak_rank(c: &Communicator, p: &soak::Params) -> Res {
    let (ordered, overtaking, notes) = soak::communicators(c, p).map_err(e)?;
    let t0 = Instant::now();
    let r = soak::soak(&ordered, &overtaking, notes.as_ref(), p);
    ordered.free();
    overtaking.free();
    if let Some(notes) = notes {
        notes.free();
    }
    let s = r?;
    let secs = t0.elapsed().as_secs_f64();
    let lost = match (p.kill_rank, s.lost_after) {
        (Some(dead), Some(after)) => {
            format!(
                "; rank {dead} killed: {} requests with it failed with PeerLost, the last {} ms after its announcement",
                s.lost,
                after.as_millis()
            )
        }
        _ => String::new(),
    };
    println!(
        "soak ok: rank {} of {} sent {} and received {} messages ({:.1} MiB) in {secs:.1} s, {:.0} messages/s received{lost}",
        c.rank(),
        c.size(),
        s.sent,
        s.received,
        s.bytes as f64 / (1 << 20) as f64,
        s.received as f64 / secs
    );
    Ok(())
}

/// `soak --local N`: N ranks of the embedded provider in this process, each on its own
/// threads.
fn soak_local(ranks: u32, p: &soak::Params) -> Result<(), Failure> {
    let fail = |rank: Option<(u32, u32)>, msg: String| Failure { check: "soak", rank, status: 1, msg };
    if ranks < 2 {
        return Err(Failure { status: 2, ..fail(None, "--local takes 2 or more ranks".into()) });
    }
    let rts = Runtime::builder().build_local(ranks).map_err(|err| fail(None, format!("cannot start the runtimes: {err}")))?;
    std::thread::scope(|s| {
        let handles: Vec<_> =
            rts.iter().map(|rt| s.spawn(move || soak_rank(rt.world(), p).map_err(|msg| fail(Some((rt.rank(), ranks)), msg)))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(fail(None, "a rank's thread panicked".into()))))
            .collect::<Result<Vec<()>, Failure>>()
    })?;
    println!("soak done: {ranks} ranks in this process");
    Ok(())
}

/// Runs `check` as this process's part of the job.
fn run(check: Check) -> Result<(), Failure> {
    if let Check::Soak { messages, threads, max_size, seconds, local: Some(n), kill_rank } = check {
        if kill_rank.is_some() {
            let msg = "--kill-rank needs ranks in processes of their own, not --local".into();
            return Err(Failure { check: "soak", rank: None, status: 2, msg });
        }
        return soak_local(n, &soak::Params { messages, threads, max_size, seconds, kill_rank });
    }
    let rt = Runtime::builder().build().map_err(|err| Failure {
        check: check.name(),
        rank: None,
        status: 1,
        msg: format!("cannot start the runtime: {err}"),
    })?;
    let (me, size) = (rt.rank(), rt.size());
    let fail = |step: Check, msg: String| Failure { check: step.name(), rank: Some((me, size)), status: 1, msg };
    if !check.ranks().admits(size) {
        let msg = format!("takes {}; this job has {size}", check.ranks().words());
        return Err(Failure { status: 2, ..fail(check, msg) });
    }
    let own = |step: Check| rt.world().dup().map_err(|err| fail(step, format!("cannot create the check's communicator: {err}")));
    let exit = if check.says_goodbye() { Some(own(check)?) } else { None };
    if check == Check::PeerFinished {
        let c = own(check)?;
        return peer_finished(rt, c).map_err(|msg| fail(check, msg));
    }
    let started = Instant::now();
    for step in check.steps() {
        let c = own(step)?;
        let r = run_step(step, &rt, &c);
        c.free();
        r.map_err(|msg| fail(step, msg))?;
        if check == Check::All {
            println!("{} ok", step.name());
        }
    }
    if let Some(c) = exit {
        goodbye(&c).map_err(|msg| fail(check, format!("exit handshake: {msg}")))?;
        c.free();
    }
    println!("{} done in {:.0} ms", check.name(), started.elapsed().as_secs_f64() * 1e3);
    if check == Check::ExitCode {
        drop(rt);
        std::process::exit(3 * me as i32);
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    if let Err(f) = run(cli.check) {
        eprintln!("{f}");
        std::process::exit(f.status);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn status(source: u32, tag: i32, bytes: usize) -> Status {
        Status { source, tag, bytes }
    }

    /// Rank 0 of `wildcard` at 4 ranks used to slice a 1-byte goodbye as a 4-byte counter
    /// and panic: a message of the wrong length, source, tag or contents is a failure that
    /// says what was expected and what came.
    #[test]
    fn a_wrong_message_is_a_failure_naming_what_came() {
        let what = || "message 3 of rank 2".to_string();
        let want = 3u32.to_le_bytes();
        let short = (b".".to_vec(), status(2, 2, 1));
        let err = expect(what, &short, 2, 2, &want).unwrap_err();
        assert!(err.starts_with("message 3 of rank 2: "), "{err}");
        assert!(err.contains("expected 4 bytes [03 00 00 00]") && err.contains("got 1 byte \".\""), "{err}");
        let wrong_tag = (want.to_vec(), status(2, 1_000_000, 4));
        let err = expect(what, &wrong_tag, 2, 2, &want).unwrap_err();
        assert!(err.contains("expected a message from rank 2 with tag 2, got one from rank 2 with tag 1000000 (4 bytes)"), "{err}");
        let wrong_source = (want.to_vec(), status(1, 2, 4));
        let err = expect(what, &wrong_source, 2, 2, &want).unwrap_err();
        assert!(err.contains("got one from rank 1"), "{err}");
        let wrong_contents = (4u32.to_le_bytes().to_vec(), status(2, 2, 4));
        let err = expect(what, &wrong_contents, 2, 2, &want).unwrap_err();
        assert!(err.contains("expected 4 bytes [03 00 00 00], got 4 bytes [04 00 00 00]"), "{err}");
        let long = (vec![7u8; 100], status(2, 2, 100));
        let err = expect(what, &long, 2, 2, &want).unwrap_err();
        assert!(err.contains("got 100 bytes [07 07") && err.contains(" ...]"), "{err}");
        assert_eq!(expect(what, &(want.to_vec(), status(2, 2, 4)), 2, 2, &want), Ok(()));
    }

    /// A chunk of the 64 MiB message in the wrong place, or the message of another rank,
    /// is found; the right one passes.
    #[test]
    fn large_finds_a_misplaced_word_and_another_ranks_message() {
        let words = 1 << 12;
        let mut m: Vec<u64> = (0..words).map(|k| large_word(3, k)).collect();
        assert_eq!(large_mismatch(3, &m), None);
        assert_eq!(large_mismatch(2, &m), Some(0));
        m.swap(100, 101);
        assert_eq!(large_mismatch(3, &m), Some(100));
    }

    /// At every count from 2 to 9, every rank plays `pingpong` with someone, partners
    /// agree on each other and on who serves, and rank 0 plays at most twice.
    #[test]
    fn pingpong_pairs_every_rank_at_any_count() {
        for n in 2..=9u32 {
            for me in 0..n {
                let mine = pingpong_partners(me, n);
                assert!(!mine.is_empty(), "{n} ranks: rank {me} plays with nobody");
                assert!(mine.len() <= 2 && (me == 0 || mine.len() == 1), "{n} ranks: rank {me}: {mine:?}");
                for &(p, serves) in &mine {
                    assert!(p < n && p != me, "{n} ranks: rank {me} with {p}");
                    assert!(pingpong_partners(p, n).contains(&(me, !serves)), "{n} ranks: {me} and {p} disagree");
                }
            }
        }
    }

    fn every_check() -> Vec<(String, Check, String)> {
        Cli::command()
            .get_subcommands()
            .map(|s| {
                let name = s.get_name().to_string();
                let cli = Cli::try_parse_from(["weft-selftest", &name]).unwrap_or_else(|err| panic!("{name}: {err}"));
                (name, cli.check, s.get_about().map(|a| a.to_string()).unwrap_or_default())
            })
            .collect()
    }

    /// `--help` lists every check, each with one line that starts with the number of ranks
    /// it takes, as the code enforces it; the names are those the failures print.
    #[test]
    fn help_lists_every_check_with_the_ranks_it_takes() {
        let help = Cli::command().render_help().to_string();
        let checks = every_check();
        assert_eq!(checks.len(), 25, "{help}");
        for (name, check, about) in &checks {
            assert_eq!(check.name(), name);
            assert!(about.starts_with(check.ranks().tag()), "{name}: {about:?} should start with {}", check.ranks().tag());
            assert!(!about.contains('\n'), "{name}: more than one line");
            assert!(help.lines().any(|l| l.trim_start().starts_with(name.as_str()) && l.ends_with(about.as_str())), "{name}:\n{help}");
        }
        assert!(help.contains("exits with status 2"), "{help}");
    }

    #[test]
    fn rank_counts_are_admitted_as_documented() {
        let admitted = |r: Ranks| (1..=9).filter(|&n| r.admits(n)).collect::<Vec<u32>>();
        assert_eq!(admitted(Ranks::Any), (1..=9).collect::<Vec<_>>());
        assert_eq!(admitted(Ranks::AtLeastTwo), (2..=9).collect::<Vec<_>>());
        assert_eq!(admitted(Ranks::Even), vec![2, 4, 6, 8]);
        assert_eq!(admitted(Ranks::Two), vec![2]);
        assert_eq!(admitted(Ranks::Three), vec![3]);
        // `all` takes no count one of its steps refuses.
        for n in 1..=9 {
            assert!(!Check::All.ranks().admits(n) || Check::ALL.iter().all(|s| s.ranks().admits(n)), "{n}");
        }
    }

    #[test]
    fn kill_mid_transfer_takes_its_delay() {
        let cli = Cli::try_parse_from(["weft-selftest", "kill-mid-transfer", "150"]).unwrap();
        assert_eq!(cli.check, Check::KillMidTransfer { ms: 150 });
        assert!(Cli::try_parse_from(["weft-selftest", "kill-mid-transfer", "soon"]).is_err());
        assert!(Cli::try_parse_from(["weft-selftest", "no-such-check"]).is_err());
    }
}
