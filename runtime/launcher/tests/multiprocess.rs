//! Multi-process runs through `weftrun` on `shm` and `tcp;ofi_rxm` (the checks themselves
//! live in the `weft-selftest` binary), plus the multi-host test: two network namespaces
//! joined by a veth pair, bootstrapped the Slurm way.
//!
//! Traffic stays on loopback (`FI_TCP_IFACE=lo`, `FI_SOCKETS_IFACE=lo`, KVS on 127.0.0.1),
//! except in the netns test. Every run has a time limit (`weftrun --timeout`, or a kill).
#![cfg(feature = "ofi")]

use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WEFTRUN: &str = env!("CARGO_BIN_EXE_weftrun");
const SELFTEST: &str = env!("CARGO_BIN_EXE_weft-selftest");

/// One job at a time: the machine may have 2 cores.
static SERIAL: Mutex<()> = Mutex::new(());

fn weftrun(n: u32, provider: &str, check: &str) -> (Output, Duration) {
    weftrun_with(n, provider, &["--timeout", "240"], check)
}

/// `weftrun` with options of its own (`--timeout`, `--grace`) before the program.
fn weftrun_with(n: u32, provider: &str, options: &[&str], check: &str) -> (Output, Duration) {
    job(n, provider, options, &[SELFTEST, check])
}

/// A job of `n` ranks of `program` (with its arguments) through `weftrun` with `options`;
/// its output, and how long it took.
fn job(n: u32, provider: &str, options: &[&str], program: &[&str]) -> (Output, Duration) {
    job_with_env(n, provider, options, &[], program)
}

/// [`job`] with environment variables `env` for every rank.
fn job_with_env(n: u32, provider: &str, options: &[&str], env: &[(&str, &str)], program: &[&str]) -> (Output, Duration) {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t0 = Instant::now();
    let out = Command::new(WEFTRUN)
        .args(["-n", &n.to_string(), "--provider", provider])
        .args(options)
        .args(program)
        .envs(env.iter().copied())
        .env("FI_TCP_IFACE", "lo")
        .env("FI_SOCKETS_IFACE", "lo")
        .env_remove("WEFT_PROVIDER")
        .stdin(Stdio::null())
        .output()
        .expect("weftrun starts");
    (out, t0.elapsed())
}

fn text(o: &Output) -> String {
    format!("--- stdout\n{}--- stderr\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// `weft-selftest all` (pingpong, every multirate pattern, wildcard, order, large, each on a
/// communicator of its own) at 2, 4 and 8 ranks. At 4 ranks and more, rank 0's wildcard
/// receives used to match the exit handshake of a faster rank and the check panicked.
fn every_check(provider: &str) {
    for n in [2, 4, 8] {
        let (o, t) = weftrun(n, provider, "all");
        let s = text(&o);
        assert!(o.status.success(), "{n} ranks: weftrun failed on {provider} after {t:?}:\n{s}");
        let patterns = ["pairwise", "one-to-many", "many-to-one", "many-to-many"].map(|p| format!("multirate {p} ok"));
        let lines = ["pingpong ok", "multirate ok", "wildcard ok", "order ok", "large ok", "all done"];
        for r in 0..n {
            for line in patterns.iter().map(String::as_str).chain(lines) {
                assert!(s.contains(&format!("[{r}] {line}")), "{n} ranks: missing {line:?} of rank {r}:\n{s}");
            }
        }
    }
}

#[test]
fn every_check_at_2_4_and_8_ranks_on_shm() {
    every_check("shm");
}

#[test]
fn every_check_at_2_4_and_8_ranks_on_tcp() {
    every_check("tcp");
}

/// The checks that take any number of ranks (2 or more) run at 3, an odd count: pingpong's
/// last rank plays with rank 0, order and large go round a ring of 3.
fn three_ranks(provider: &str) {
    for check in ["hello", "pingpong", "wildcard", "order", "large", "alltoall", "rma", "comms"] {
        let (o, t) = weftrun(3, provider, check);
        let s = text(&o);
        assert!(o.status.success(), "{check} at 3 ranks on {provider} failed after {t:?}:\n{s}");
        for r in 0..3 {
            assert!(s.contains(&format!("[{r}] {check} done")), "{check}: rank {r}:\n{s}");
            if check == "hello" {
                assert!(s.contains(&format!("[{r}] rank {r} of 3 on {provider}")), "{s}");
            }
        }
    }
}

/// Communicators over subsets and the collectives at 4 ranks (a power of two; 3 is above).
fn comms_at_4(provider: &str) {
    each_rank_says(4, provider, &["--timeout", "240"], "comms", "comms ok: halves of 2");
}

/// Runs `check` on `n` ranks through `weftrun` with `options`; it must succeed, every rank
/// printing `line`.
fn each_rank_says(n: u32, provider: &str, options: &[&str], check: &str, line: &str) {
    each_rank_says_with_env(n, provider, options, &[], check, line);
}

/// [`each_rank_says`] with environment variables `env` for every rank.
fn each_rank_says_with_env(n: u32, provider: &str, options: &[&str], env: &[(&str, &str)], check: &str, line: &str) {
    let (o, t) = job_with_env(n, provider, options, env, &[SELFTEST, check]);
    let s = text(&o);
    assert!(o.status.success(), "{check} at {n} ranks on {provider} failed or hung ({options:?}) after {t:?}:\n{s}");
    for r in 0..n {
        assert!(s.contains(&format!("[{r}] {line}")), "rank {r}:\n{s}");
    }
}

/// Every distributed lock across 3 processes, 2 threads each: exclusion checked by every
/// holder, the count of non-atomic increments exact.
#[test]
fn every_distributed_lock_excludes_across_processes_on_shm() {
    each_rank_says(3, "shm", &["--timeout", "120"], "locks", "locks ok: rank");
}

/// Every distributed lock across 3 processes, 4 tasks each on the rank's pool taking it 25
/// times through `lock_async` (`read_async`, `write_async`): the tasks waiting for it are
/// parked (on `shm`, hand-offs to them come as wake frames); exclusion checked by every
/// holder, the count of non-atomic increments exact.
#[test]
fn every_distributed_lock_excludes_tasks_across_processes_on_shm() {
    let (o, t) = job(3, "shm", &["--timeout", "120"], &[SELFTEST, "locks", "--tasks", "4", "25"]);
    let s = text(&o);
    assert!(o.status.success(), "locks with tasks at 3 ranks on shm failed or hung after {t:?}:\n{s}");
    for r in 0..3 {
        assert!(s.contains(&format!("[{r}] locks ok: rank {r} of 3, 4 tasks x 25 acquisitions")), "rank {r}:\n{s}");
    }
}

/// The same at 8 processes of 2 threads each, 2 CRIs per rank, 40 acquisitions per thread:
/// the ranks' threads issue their one-sided operations from two endpoints, and the locks'
/// hand-offs must still be seen in order at each target (RMA-RW let a writer in beside
/// another holder here while each CRI aimed at its own index of the target's endpoints).
#[test]
fn every_distributed_lock_excludes_across_8_processes_of_2_threads_on_shm() {
    locks_of_2_threads_with_2_cris(8, "shm");
}

/// Every lock at `n` processes of 2 threads (the check's default), 2 CRIs per rank, 40
/// acquisitions per thread.
fn locks_of_2_threads_with_2_cris(n: u32, provider: &str) {
    let (o, t) = job_with_env(n, provider, &["--timeout", "120"], &[("WEFT_CRIS", "2")], &[SELFTEST, "locks", "40"]);
    let s = text(&o);
    assert!(o.status.success(), "locks at {n} ranks of 2 threads on {provider} failed or hung after {t:?}:\n{s}");
    for r in 0..n {
        assert!(s.contains(&format!("[{r}] locks ok: rank")), "rank {r}:\n{s}");
    }
}

/// The same on `tcp` at 4 processes of 2 threads, 2 CRIs per rank: two threads of a rank
/// reach a target through two connections, and a flushed put must have been applied there
/// before another thread's later operation is (without `FI_DELIVERY_COMPLETE` a put
/// completed once in the socket, and D-MCS let two writers in at 10^5 acquisitions).
#[test]
fn every_distributed_lock_excludes_across_4_processes_of_2_threads_on_tcp() {
    locks_of_2_threads_with_2_cris(4, "tcp");
}

/// A rank that drops a lock at once after releasing it, or while holding it (its guard
/// forgotten), across 2 processes: the other, waiting for the lock (a thread, a task), gets
/// it in the first case whichever of the hand-off and the notice of the end came first, and
/// fails with `LOCK_ENDED` in the second instead of waiting for ever; every lock.
#[test]
fn a_lock_ended_by_its_holder_fails_its_waiter_across_processes_on_shm() {
    each_rank_says(2, "shm", &["--timeout", "60"], "lock-ends", "lock-ends ok: rank");
}

/// The same on `tcp`.
#[test]
fn a_lock_ended_by_its_holder_fails_its_waiter_across_processes_on_tcp() {
    each_rank_says(2, "tcp", &["--timeout", "60"], "lock-ends", "lock-ends ok: rank");
}

#[test]
fn comms_at_4_ranks_on_shm() {
    comms_at_4("shm");
}

#[test]
fn comms_at_4_ranks_on_tcp() {
    comms_at_4("tcp");
}

#[test]
fn three_ranks_checks_that_take_any_count_on_shm() {
    three_ranks("shm");
}

#[test]
fn three_ranks_checks_that_take_any_count_on_tcp() {
    three_ranks("tcp");
}

/// Several senders at once into one receiver's wildcards at 3, 4 and 8 ranks: every other
/// rank starts 120 sends to rank 0, eager and rendezvous interleaved, half of them on a
/// `dup` of the check's communicator; rank 0 takes each communicator's with `Source::Any`
/// and `Tag::Any` and checks each source's order and every byte. With the smallest inbox
/// (`WEFT_INBOX=1`: 16 posted receive buffers) far more frames are in flight than it holds.
fn fan_in(provider: &str) {
    for n in [3, 4, 8] {
        each_rank_says_with_env(n, provider, &["--timeout", "120"], &[("WEFT_INBOX", "1")], "fan-in", "fan-in done");
    }
}

#[test]
fn fan_in_from_many_senders_at_3_4_and_8_ranks_on_shm() {
    fan_in("shm");
}

#[test]
fn fan_in_from_many_senders_at_3_4_and_8_ranks_on_tcp() {
    fan_in("tcp");
}

/// A partitioned message across 2 processes, 4 rounds: every word arrives, and rounds 2 on
/// go as `how` says (rank 0 counts the frames it receives per round, as the in-process test
/// does): written straight into the receive's buffer where the same-host lane reaches it
/// (`process_vm_writev`), sent as rendezvous messages where it does not; and whether rank 0
/// counts its cores as shared with its peer's process (`shared`: where the lane met it).
fn partitioned(provider: &str, env: &[(&str, &str)], how: &str, shared: &str) {
    let (o, t) = job_with_env(2, provider, &["--timeout", "60"], env, &[SELFTEST, "partitioned"]);
    let s = text(&o);
    assert!(o.status.success(), "partitioned on {provider} {env:?} failed after {t:?}:\n{s}");
    assert!(s.contains("[1] partitioned ok: 4 rounds"), "rank 1's check of the contents:\n{s}");
    assert!(s.contains(&format!("[0] partitioned ok: rounds 2-4 {how}")), "rounds 2 on not {how} on {provider} {env:?}:\n{s}");
    assert!(s.contains(&format!("cores shared with peers' processes: {shared})")), "cores shared not {shared} on {provider} {env:?}:\n{s}");
}

#[test]
fn partitions_written_straight_across_processes_on_shm() {
    partitioned("shm", &[], "written straight", "yes");
}

/// Without the same-host lane nothing reaches the receiver's memory: every round's
/// partitions travel as messages, and arrive whole.
#[test]
fn partitions_sent_as_messages_across_processes_on_tcp_without_the_lane() {
    partitioned("tcp", &[("WEFT_SAME_HOST_LANE", "0")], "sent as messages", "no");
}

/// One-sided windows across processes at 2 and 4 ranks: puts and flushes, native and
/// emulated atomics, increments under the D-MCS lock and the RMA-RW lock (over the hosts);
/// exact counts.
fn rma(provider: &str) {
    for n in [2, 4] {
        let (o, t) = weftrun(n, provider, "rma");
        let s = text(&o);
        assert!(o.status.success(), "rma at {n} ranks on {provider} failed after {t:?}:\n{s}");
        for r in 0..n {
            assert!(s.contains(&format!("[{r}] rma ok")), "rma at {n} ranks: rank {r}:\n{s}");
        }
    }
}

#[test]
fn rma_across_processes_on_shm() {
    rma("shm");
}

#[test]
fn rma_across_processes_on_tcp() {
    rma("tcp");
}

/// A check started at a number of ranks it does not take refuses on every rank, naming the
/// counts it takes, with exit status 2 (nothing runs, nothing hangs).
#[test]
fn a_check_refuses_a_rank_count_it_does_not_take() {
    for (n, check, says) in [
        (3, "peer-lost", "takes exactly 2 ranks; this job has 3"),
        (4, "peer-finished", "takes exactly 2 ranks; this job has 4"),
        (3, "multirate", "takes an even number of ranks (2 or more); this job has 3"),
        (3, "all", "takes an even number of ranks (2 or more); this job has 3"),
        (1, "pingpong", "takes 2 or more ranks; this job has 1"),
    ] {
        let (o, t) = weftrun(n, "shm", check);
        let s = text(&o);
        assert_eq!(o.status.code(), Some(2), "{check} at {n} ranks:\n{s}");
        for r in 0..n {
            assert!(s.contains(&format!("[{r}] weft-selftest {check}: rank {r} of {n}: {says}")), "{check} at {n} ranks: rank {r}:\n{s}");
        }
        assert!(!s.contains("panicked") && !s.contains(" ok"), "{check} at {n} ranks:\n{s}");
        assert!(t < Duration::from_secs(30), "{check} at {n} ranks took {t:?}");
    }
}

/// A message a check does not expect fails the check with what was expected and what came,
/// naming the check and the rank: rank 0 runs `wildcard` and rank 1 `multirate`, whose
/// 1-byte "ready" (tag 1, from rank 1) rank 0's `Source::Any, Tag::Any` receive matches
/// where it expects the 4-byte counter 0. That receive used to slice the message and panic
/// (exit status 101).
#[test]
fn a_message_a_check_does_not_expect_fails_it_without_a_panic() {
    let script = format!("if [ \"$WEFT_RANK\" = 0 ]; then exec {SELFTEST} wildcard; else exec {SELFTEST} multirate; fi");
    let (o, _) = job(2, "shm", &["--timeout", "60"], &["sh", "-c", &script]);
    let s = text(&o);
    assert_eq!(o.status.code(), Some(1), "{s}");
    let says = "[0] weft-selftest wildcard: FAILED on rank 0 of 2: message 0 of rank 1: expected 4 bytes [00 00 00 00], got 1 byte \"r\"";
    assert!(s.contains(says), "{s}");
    assert!(s.contains("[1] weft-selftest multirate: FAILED on rank 1 of 2: peer rank 0 was lost"), "{s}");
    assert!(!s.contains("panicked"), "{s}");
}

/// Runs `check`, in which a rank kills itself, on `n` ranks with `options`: the job ends
/// with that rank's SIGKILL as its worst status (128 + 9) in less than `secs` seconds, and
/// every rank of `survivors` says `CHECK ok` and `CHECK done`.
fn survivors_say_ok(n: u32, provider: &str, options: &[&str], check: &str, survivors: &[u32], secs: u64) {
    let (o, t) = weftrun_with(n, provider, options, check);
    let s = text(&o);
    assert_eq!(o.status.code(), Some(137), "{check} on {provider}:\n{s}");
    for r in survivors {
        for line in ["ok", "done"] {
            assert!(s.contains(&format!("[{r}] {check} {line}")), "{check} on {provider}: rank {r} did not say {line:?}:\n{s}");
        }
    }
    assert!(t < Duration::from_secs(secs), "{check} on {provider}: took {t:?}");
}

fn killed_peer(provider: &str) {
    survivors_say_ok(2, provider, &["--timeout", "240"], "peer-lost", &[1], 60);
}

/// The last of 4 ranks killed as the others enter their collectives: every survivor's
/// allreduces and barrier fail with `PeerLost` (those that do not wait on the killed rank
/// itself hear it from a survivor that does), none hangs.
fn coll_killed_peer(provider: &str) {
    let (o, t) = weftrun_with(4, provider, &["--timeout", "60"], "coll-peer-lost");
    let s = text(&o);
    assert_eq!(o.status.code(), Some(137), "{s}");
    for r in 0..3 {
        assert!(s.contains(&format!("[{r}] coll-peer-lost ok")), "rank {r} did not see PeerLost:\n{s}");
    }
    assert!(t < Duration::from_secs(60), "took {t:?}");
}

#[test]
fn a_rank_killed_during_collectives_fails_them_on_every_survivor_on_shm() {
    coll_killed_peer("shm");
}

#[test]
fn a_rank_killed_during_collectives_fails_them_on_every_survivor_on_tcp() {
    coll_killed_peer("tcp");
}

#[test]
fn killed_peer_fails_pending_requests_on_shm() {
    killed_peer("shm");
}

#[test]
fn killed_peer_fails_pending_requests_on_tcp() {
    killed_peer("tcp");
}

/// `weft-selftest soak` at 3 ranks: 4 threads per rank send 20,000 messages of random sizes
/// (0 B to 4 MiB), destinations and communicators, and every message is checked: contents,
/// per-source order on the ordered communicator, exactly once on the overtaking one.
fn soak(provider: &str) {
    let (o, t) = job(3, provider, &["--timeout", "150"], &[SELFTEST, "soak", "20000", "--seconds", "120"]);
    let s = text(&o);
    assert!(o.status.success(), "soak on {provider} failed or hung after {t:?}:\n{s}");
    for r in 0..3 {
        assert!(s.contains(&format!("[{r}] soak ok: rank {r} of 3 sent 20000 and received ")), "rank {r}:\n{s}");
    }
}

#[test]
fn soak_at_3_ranks_on_shm() {
    soak("shm");
}

#[test]
fn soak_at_3_ranks_on_tcp() {
    soak("tcp");
}

/// The soak with rank 2 killed halfway through its first thread's messages: each survivor's
/// requests with it complete or fail with `PeerLost` within 5 s of its announcement (none
/// hangs), and every message between the survivors arrives whole, once and in order.
fn soak_killed(provider: &str) {
    let args = [SELFTEST, "soak", "20000", "--seconds", "60", "--kill-rank", "2"];
    let (o, t) = job(3, provider, &["--timeout", "90"], &args);
    let s = text(&o);
    assert_eq!(o.status.code(), Some(137), "soak with a killed rank on {provider} after {t:?}:\n{s}");
    for r in 0..2 {
        assert!(s.contains(&format!("[{r}] soak ok: rank {r} of 3 sent 20000 and received ")), "rank {r}:\n{s}");
        assert!(s.contains("rank 2 killed: ") && s.contains(&format!("[{r}] soak done")), "rank {r}:\n{s}");
    }
    assert!(s.contains("weftrun: rank 2 exited with status 137"), "{s}");
}

#[test]
fn soak_with_a_killed_rank_on_shm() {
    soak_killed("shm");
}

#[test]
fn soak_with_a_killed_rank_on_tcp() {
    soak_killed("tcp");
}

/// `--kill-rank` needs ranks in processes of their own.
#[test]
fn soak_refuses_to_kill_a_rank_in_one_process() {
    let out = Command::new(SELFTEST)
        .args(["soak", "100", "--local", "3", "--kill-rank", "1"])
        .env_remove("WEFT_PROVIDER")
        .output()
        .expect("weft-selftest starts");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("--kill-rank needs ranks in processes of their own"), "{}", text(&out));
}

/// The same soak with the ranks in one process on the embedded provider.
#[test]
fn soak_in_one_process_on_the_embedded_provider() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = Command::new(SELFTEST)
        .args(["soak", "50000", "--local", "3", "--seconds", "120"])
        .env_remove("WEFT_PROVIDER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("weft-selftest starts");
    let t0 = Instant::now();
    while child.try_wait().expect("poll").is_none() {
        if t0.elapsed() > Duration::from_secs(150) {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().expect("output");
    let s = text(&o);
    assert!(o.status.success(), "soak --local failed or hung:\n{s}");
    assert!(s.contains("soak done: 3 ranks in this process"), "{s}");
}

/// Eight ranks, each sending a rendezvous-size message to every other at once, round after
/// round: every rank reads from the others' memory while they read from its own. A
/// receiver that waited for its read inside progress, under a CRI lock, served nobody's
/// reads meanwhile, and the job hung in about half of the runs of 20 rounds.
fn all_to_all(provider: &str) {
    each_rank_says(8, provider, &["--timeout", "60"], "alltoall", "alltoall ok");
}

#[test]
fn eight_ranks_all_to_all_rendezvous_on_shm() {
    all_to_all("shm");
}

#[test]
fn eight_ranks_all_to_all_rendezvous_on_tcp() {
    all_to_all("tcp");
}

/// A sender killed while the receiver reads its 64 MiB message: the receive fails with
/// `PeerLost` — the read's own error (`fi_read`: `ECONNRESET`, `ENOTCONN`, `EIO`) comes
/// before the job reports the loss, and used to be returned as a transport error — or, if
/// the read was done before the kill, holds the whole message.
fn killed_sender_mid_read(provider: &str) {
    // A read from a dead process may wait out its chunks (5 s) before it reports: the
    // survivor gets the grace to do so.
    survivors_say_ok(2, provider, &["--grace", "20", "--timeout", "60"], "peer-lost-read", &[1], 30);
}

#[test]
fn killed_sender_fails_the_read_with_peer_lost_on_shm() {
    killed_sender_mid_read("shm");
}

#[test]
fn killed_sender_fails_the_read_with_peer_lost_on_tcp() {
    killed_sender_mid_read("tcp");
}

/// A rank killed (SIGKILL) while 64 MiB messages flow to it (its receive matched, the
/// sender waiting for its `Fin`), at three points of the stream: the sender fails with
/// `PeerLost` within seconds and the job ends. (On `shm` the sender used to spin for ever
/// in about one kill of four: the dead rank had held the spin lock of the sender's region,
/// which the sender's next CQ read takes.)
fn killed_mid_transfer(provider: &str) {
    for delay in ["150", "300", "450"] {
        let (o, t) = job(2, provider, &["--grace", "10", "--timeout", "60"], &[SELFTEST, "kill-mid-transfer", delay]);
        let s = text(&o);
        // The worst status is rank 1's SIGKILL: 128 + 9.
        assert_eq!(o.status.code(), Some(137), "killed after {delay} ms:\n{s}");
        assert!(s.contains("[0] kill-mid-transfer ok"), "killed after {delay} ms: rank 0 did not see PeerLost:\n{s}");
        assert!(t < Duration::from_secs(30), "killed after {delay} ms: took {t:?}:\n{s}");
    }
}

#[test]
fn a_rank_killed_mid_transfer_fails_the_sender_on_shm() {
    killed_mid_transfer("shm");
}

#[test]
fn a_rank_killed_mid_transfer_fails_the_sender_on_tcp() {
    killed_mid_transfer("tcp");
}

/// A rank killed while the two others block in `wait_all` over rendezvous sends and
/// receives with each other and with it: each survivor's wait fails with `PeerLost` of the
/// dead rank within 10 s, the requests with it fail so, and those between the survivors
/// complete whole.
fn killed_in_wait_all(provider: &str) {
    survivors_say_ok(3, provider, &["--grace", "20", "--timeout", "60"], "kill-in-wait-all", &[0, 1], 30);
}

#[test]
fn a_rank_killed_while_others_wait_all_over_mixed_ranks_on_shm() {
    killed_in_wait_all("shm");
}

#[test]
fn a_rank_killed_while_others_wait_all_over_mixed_ranks_on_tcp() {
    killed_in_wait_all("tcp");
}

/// The pids the first `n` ranks of `child` (a `weftrun` with piped stdout) print as they
/// start (`... pid N`), read as they come; fewer if its output ends or 30 s pass first. The
/// reader comes back with them: the caller keeps the pipe open while the job runs.
fn rank_pids(child: &mut std::process::Child, n: usize) -> (Vec<u32>, std::io::BufReader<std::process::ChildStdout>) {
    let mut out = std::io::BufReader::new(child.stdout.take().expect("stdout is piped"));
    let mut pids = Vec::new();
    let t0 = Instant::now();
    while pids.len() < n && t0.elapsed() < Duration::from_secs(30) {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut out, &mut line).unwrap_or(0) == 0 {
            break;
        }
        if let Some(p) = line.split("pid ").nth(1).and_then(|p| p.trim().parse::<u32>().ok()) {
            pids.push(p);
        }
    }
    (pids, out)
}

/// Whether process `pid` still runs (exists and is not a zombie waiting to be reaped).
fn runs(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|st| !st.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])))
}

/// The files of `/dev/shm` named after process `pid` (libfabric's `shm` regions).
fn shm_files_of(pid: u32) -> Vec<String> {
    let prefix = format!("{pid}:");
    std::fs::read_dir("/dev/shm")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).filter(|n| n.starts_with(&prefix)).collect())
        .unwrap_or_default()
}

/// `weftrun` killed with SIGKILL while its ranks run on `shm`: within seconds the
/// ranks are gone and no `/dev/shm` file of theirs is left — rank 0 by SIGTERM (which
/// libfabric's `shm` provider handles by removing its regions), rank 1, which ignores
/// SIGTERM, because it noticed its launcher's end on its exchange connection, removed its
/// regions' names and failed its wait with `PeerLost` (then it kills itself with SIGKILL,
/// closing nothing). Three files per rank used to be left behind.
#[test]
fn killing_weftrun_leaves_no_shm_files_behind() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let mut child = Command::new(WEFTRUN)
        .args(["-n", "2", "--provider", "shm", "--timeout", "60", SELFTEST, "outlive-launcher"])
        .env("FI_TCP_IFACE", "lo")
        .env_remove("WEFT_PROVIDER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (pids, _out) = rank_pids(&mut child, 2);
    if pids.len() < 2 {
        let _ = child.kill();
        let _ = child.wait();
        panic!("ranks did not start: pids {pids:?}");
    }
    assert!(pids.iter().all(|&p| !shm_files_of(p).is_empty()), "the ranks have no shm regions: {pids:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    let t1 = Instant::now();
    while pids.iter().any(|&p| runs(p) || !shm_files_of(p).is_empty()) && t1.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for p in pids {
        assert!(!runs(p), "rank process {p} outlived weftrun by 10 s");
        assert_eq!(shm_files_of(p), Vec::<String>::new(), "shm regions of rank process {p} left behind");
    }
}

/// A rank that exits with status 0 before joining the job fails the others at once, with
/// an error naming it (they used to wait out the exchange's 60 s timeout and fail with
/// "transport error in key-value exchange: code 11").
fn early_clean_exit(provider: &str) {
    let script = format!("if [ \"$WEFT_RANK\" = 1 ]; then exit 0; fi; exec {SELFTEST} hello");
    let (o, t) = job(2, provider, &["--timeout", "60"], &["sh", "-c", &script]);
    let s = text(&o);
    assert_eq!(o.status.code(), Some(1), "{provider}:\n{s}");
    assert!(s.contains("[0] weft-selftest hello: FAILED") && s.contains("peer rank 1 was lost"), "{provider}:\n{s}");
    assert!(s.contains("weftrun: rank 1 exited with status 0 without finishing"), "{provider}:\n{s}");
    // Well under the exchange's 60 s timeout, which the ranks used to wait out.
    assert!(t < Duration::from_secs(30), "{provider}: took {t:?}");
}

#[test]
fn a_rank_that_exits_0_before_joining_fails_the_others_at_once_on_shm() {
    early_clean_exit("shm");
}

#[test]
fn a_rank_that_exits_0_before_joining_fails_the_others_at_once_on_tcp() {
    early_clean_exit("tcp");
}

/// A peer that finished normally (dropped its runtime: `BYE`, then `FINISHED` to the
/// others) while rank 0 had receives posted that only it could match: the messages it sent
/// before finishing are received, then those receives fail with `PeerLost` (they used to
/// wait forever).
fn finished_peer(provider: &str) {
    let (o, t) = weftrun(2, provider, "peer-finished");
    let s = text(&o);
    assert!(o.status.success(), "{provider} after {t:?}:\n{s}");
    assert!(s.contains("[1] peer-finished: rank 1 finished"), "{s}");
    assert!(s.contains("[0] peer-finished ok"), "{s}");
    assert!(t < Duration::from_secs(60), "took {t:?}");
}

#[test]
fn finished_peer_fails_receives_only_it_could_match_on_shm() {
    finished_peer("shm");
}

#[test]
fn finished_peer_fails_receives_only_it_could_match_on_tcp() {
    finished_peer("tcp");
}

#[test]
fn worst_exit_code_is_propagated() {
    let (o, _) = weftrun(3, "shm", "exit-code");
    // Ranks exit with 0, 3 and 6 after a barrier.
    assert_eq!(o.status.code(), Some(6), "{}", text(&o));
}

#[test]
fn sigint_tears_every_rank_down() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut child = Command::new(WEFTRUN)
        .args(["-n", "2", "--provider", "shm", "--timeout", "60", SELFTEST, "block"])
        .env("FI_TCP_IFACE", "lo")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (pids, _out) = rank_pids(&mut child, 2);
    assert_eq!(pids.len(), 2, "ranks did not start");
    // SAFETY: signalling our own child process, which has not been reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(t1.elapsed() < Duration::from_secs(15), "weftrun did not stop after SIGINT");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    for p in pids {
        assert!(!std::path::Path::new(&format!("/proc/{p}")).exists(), "rank process {p} survived");
    }
}

/// `--bind-to core` pins rank i to the i-th allowed CPU, round robin, and the ranks still
/// talk; the default leaves every CPU allowed; a bad binding name is a clear error.
#[test]
fn bind_to_core_pins_each_rank() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let allowed = |o: &Output| -> Vec<(u32, String)> {
        let s = String::from_utf8_lossy(&o.stdout);
        let mut v: Vec<(u32, String)> = s
            .lines()
            .filter_map(|l| {
                let (rank, rest) = l.strip_prefix('[')?.split_once("] ")?;
                Some((rank.parse().ok()?, rest.strip_prefix("Cpus_allowed_list:")?.trim().to_string()))
            })
            .collect();
        v.sort();
        v
    };
    let run = |extra: &[&str]| {
        Command::new(WEFTRUN)
            .args(["-n", "3", "--timeout", "60"])
            .args(extra)
            .args(["sh", "-c", "grep Cpus_allowed_list /proc/self/status"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let free = run(&[]);
    assert!(free.status.success(), "{}", text(&free));
    let everywhere = allowed(&free);
    assert_eq!(everywhere.len(), 3, "{}", text(&free));
    let bound = run(&["--bind-to", "core"]);
    assert!(bound.status.success(), "{}", text(&bound));
    let pinned = allowed(&bound);
    assert_eq!(pinned.len(), 3, "{}", text(&bound));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (rank, cpus) in &pinned {
        assert!(cpus.parse::<usize>().is_ok(), "rank {rank} is pinned to one CPU, not {cpus:?}");
    }
    if cores >= 2 && everywhere[0].1.contains('-') {
        assert_ne!(pinned[0].1, pinned[1].1, "ranks 0 and 1 on different CPUs");
        if cores == 2 {
            assert_eq!(pinned[0].1, pinned[2].1, "round robin: rank 2 shares rank 0's CPU");
        }
    }
    // Bound ranks still run a job.
    let o = Command::new(WEFTRUN)
        .args(["-n", "2", "--provider", "shm", "--bind-to", "core", "--timeout", "120", SELFTEST, "pingpong"])
        .env("FI_TCP_IFACE", "lo")
        .env_remove("WEFT_PROVIDER")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = Command::new(WEFTRUN).args(["-n", "2", "--bind-to", "socket", "true"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn bad_input_is_a_clear_error() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let o = Command::new(WEFTRUN).args(["-n", "2", "--provider", "carrier-pigeon", SELFTEST]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown provider"), "{}", text(&o));
    let o = Command::new(SELFTEST).arg("hello").env("WEFT_PROVIDER", "carrier-pigeon").output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown provider"), "{}", text(&o));
    // A rank with a KVS address but no token.
    let o = Command::new(SELFTEST)
        .arg("hello")
        .envs([("WEFT_RANK", "0"), ("WEFT_SIZE", "2"), ("WEFT_KVS", "127.0.0.1:9"), ("WEFT_PROVIDER", "shm")])
        .env_remove("WEFT_TOKEN")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("WEFT_TOKEN"), "{}", text(&o));
}

/// Arguments weftrun cannot honour (a number of seconds that is not finite, negative or
/// beyond a `Duration`, `-n` out of `1..=1024`) are refused with exit status 2 before any rank
/// starts; `--grace inf` used to start the ranks and then panic (exit 101).
#[test]
fn bad_arguments_exit_2_before_any_rank_starts() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::temp_dir().join(format!("weftrun-bad-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mark = dir.join("started");
    let rank = format!("touch {}", mark.display());
    let cases: &[(&[&str], &str)] = &[
        (&["--grace", "inf"], "--grace"),
        (&["--grace", "1e30"], "--grace"),
        (&["--grace", "1e300"], "--grace"),
        (&["--grace", "-1"], "--grace"),
        (&["--grace", "NaN"], "--grace"),
        (&["--grace", "soon"], "--grace"),
        (&["--timeout", "inf"], "--timeout"),
        (&["--timeout", "1e30"], "--timeout"),
        (&["--timeout", "-0.5"], "--timeout"),
        (&["--timeout", "nan"], "--timeout"),
        (&["-n", "0"], "at least 1 rank"),
        (&["-n", "1025"], "at most 1024"),
        (&["-n", "4294967296"], "at most 1024"),
        (&["-n", "-3"], "--np"),
    ];
    for (extra, says) in cases {
        let mut args: Vec<&str> = extra.to_vec();
        if !args.contains(&"-n") {
            args.extend(["-n", "1"]);
        }
        let o = Command::new(WEFTRUN).args(&args).args(["sh", "-c", &rank]).stdin(Stdio::null()).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{extra:?}:\n{}", text(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(says), "{extra:?} should name {says:?}:\n{}", text(&o));
        assert!(!err.contains("panicked"), "{extra:?}:\n{}", text(&o));
        assert!(!mark.exists(), "{extra:?}: a rank was started");
    }
    // Large but representable values are fine, as are 0 and fractions.
    let o = Command::new(WEFTRUN)
        .args(["-n", "2", "--grace", "1e18", "--timeout", "0", "sh", "-c", &rank])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(mark.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// A forwarding thread that cannot be started (here: address space limited to 400 MB, so
/// thread stacks run out after a few ranks of 1024) stops the job with a clear message and
/// exit status 1; `std::thread::spawn` used to panic (exit 101).
#[test]
fn a_forwarding_thread_that_cannot_start_is_a_clear_error() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let t0 = Instant::now();
    let job = Command::new("sh")
        .args(["-c", &format!("ulimit -v 400000 && exec {WEFTRUN} -n 1024 --timeout 60 sleep 30")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = outputs_within(vec![job], Duration::from_secs(90)).remove(0);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(err.contains("cannot start a thread to forward the output of rank"), "{}", text(&o));
    // The ranks already started were stopped, not waited for.
    assert!(t0.elapsed() < Duration::from_secs(25), "took {:?}", t0.elapsed());
}

#[test]
fn a_plain_process_is_rank_0_of_1() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for p in ["embedded", "shm", "tcp"] {
        let o = Command::new(SELFTEST)
            .arg("hello")
            .env("WEFT_PROVIDER", p)
            .env("FI_TCP_IFACE", "lo")
            .env_remove("WEFT_RANK")
            .env_remove("WEFT_SIZE")
            .env_remove("SLURM_NTASKS")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("rank 0 of 1 on {p}")), "{}", text(&o));
    }
}

/// Rank `rank` of a 2-rank job bootstrapped the Slurm way (`SLURM_PROCID`, task 0 serving
/// the exchange at `kvs`), started from `cmd` with its output captured.
fn slurm_rank(mut cmd: Command, rank: usize, kvs: &str, token: &str, provider: &str, iface: &str) -> Child {
    cmd.envs([
        ("SLURM_PROCID", rank.to_string()),
        ("SLURM_NTASKS", "2".to_string()),
        ("WEFT_KVS", kvs.to_string()),
        ("WEFT_TOKEN", token.to_string()),
        ("WEFT_PROVIDER", provider.to_string()),
        ("FI_TCP_IFACE", iface.to_string()),
    ])
    .env_remove("WEFT_RANK")
    .env_remove("WEFT_SIZE")
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("a rank starts")
}

/// The outputs of `children` once all exited, or after `limit` (those still running are
/// killed).
fn outputs_within(mut children: Vec<Child>, limit: Duration) -> Vec<Output> {
    let deadline = Instant::now() + limit;
    while children.iter_mut().any(|c| c.try_wait().unwrap().is_none()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    children
        .into_iter()
        .map(|mut c| {
            let _ = c.kill();
            c.wait_with_output().unwrap()
        })
        .collect()
}

/// Ranks started with settings that decide how frames are numbered or sized set
/// differently (here `WEFT_PER_THREAD_ORDER` on one rank only, then the eager threshold) fail
/// at start with an error that names the setting — not a job whose receives never match.
/// Bootstrapped the Slurm way on 127.0.0.1, so each rank can get an environment of its own.
#[test]
fn ranks_that_disagree_on_settings_fail_at_start() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let token = weft_transport::bootstrap::random_token().unwrap();
    for (var, one, other, says) in
        [("WEFT_PER_THREAD_ORDER", "0", "1", "per-thread order"), ("WEFT_EAGER_THRESHOLD", "4096", "8192", "eager threshold")]
    {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let kvs = format!("127.0.0.1:{port}");
        let spawn = |rank: usize| {
            let mut cmd = Command::new(SELFTEST);
            cmd.arg("hello").env(var, if rank == 0 { one } else { other });
            slurm_rank(cmd, rank, &kvs, &token, "shm", "lo")
        };
        for (rank, o) in outputs_within(vec![spawn(0), spawn(1)], Duration::from_secs(60)).into_iter().enumerate() {
            assert_eq!(o.status.code(), Some(1), "{var}: rank {rank} did not fail at start:\n{}", text(&o));
            assert!(String::from_utf8_lossy(&o.stderr).contains(says), "{var}: rank {rank}:\n{}", text(&o));
        }
    }
}

/// Two network namespaces joined by a veth pair; removed on drop.
struct Netns {
    names: [String; 2],
}

impl Netns {
    fn ip(args: &[&str]) -> Result<(), String> {
        let o = Command::new("ip").args(args).output().map_err(|e| format!("ip: {e}"))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
        }
    }

    fn create(tag: &str) -> Result<Self, String> {
        let names = [format!("weft-{tag}-a"), format!("weft-{tag}-b")];
        let me = Netns { names: names.clone() };
        let (va, vb) = (format!("wv{tag}a"), format!("wv{tag}b"));
        for n in &names {
            Self::ip(&["netns", "add", n])?;
        }
        Self::ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        for (i, (v, n)) in [(&va, &names[0]), (&vb, &names[1])].into_iter().enumerate() {
            Self::ip(&["link", "set", v, "netns", n])?;
            Self::ip(&["-n", n, "addr", "add", &format!("10.231.{}.{}/24", 77, i + 1), "dev", v])?;
            Self::ip(&["-n", n, "link", "set", v, "up"])?;
            Self::ip(&["-n", n, "link", "set", "lo", "up"])?;
        }
        Ok(me)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting a namespace deletes its end of the veth pair, and so the pair.
        for n in &self.names {
            let _ = Command::new("ip").args(["netns", "del", n]).output();
        }
    }
}

#[test]
fn two_hosts_over_a_veth_pair() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        println!("skipped: the netns test needs root (it creates namespaces and a veth pair)");
        return;
    }
    if Command::new("ip").arg("-V").output().map(|o| !o.status.success()).unwrap_or(true) {
        println!("skipped: the `ip` command (iproute2) is missing");
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tag = format!("{}", std::process::id() % 100_000);
    let ns = match Netns::create(&tag) {
        Ok(ns) => ns,
        Err(e) => {
            println!("skipped: cannot create network namespaces here: {e}");
            return;
        }
    };
    let token = weft_transport::bootstrap::random_token().unwrap();
    // Rank 0 serves the KVS on its veth address (the Slurm bootstrap), rank 1 connects.
    let kvs = "10.231.77.1:47911";
    let spawn = |rank: usize| {
        let dev = format!("wv{tag}{}", if rank == 0 { "a" } else { "b" });
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.names[rank], SELFTEST, "netns"]);
        slurm_rank(cmd, rank, kvs, &token, "tcp", &dev)
    };
    let outs = outputs_within(vec![spawn(0), spawn(1)], Duration::from_secs(120));
    drop(ns);
    for (r, o) in outs.iter().enumerate() {
        let s = text(o);
        assert!(o.status.success(), "rank {r} in its namespace failed:\n{s}");
        assert!(s.contains(&format!("netns ok: rank {r} exchanged with rank {}", 1 - r)), "{s}");
    }
}

/// Jobs started by Open MPI's `mpirun`, which serves PMIx to its ranks: with the `pmix`
/// feature a weft program needs no variable of its own there.
#[cfg(feature = "pmix")]
mod under_mpirun {
    use super::*;

    /// `mpirun` with `args`, as root too, every rank's output tagged `[job,rank]<stdout>:`;
    /// `None` (with the reason printed) where `mpirun` is not installed.
    fn mpirun(provider: &str, args: &[&str]) -> Option<Output> {
        let mut cmd = mpirun_command(provider, args)?;
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        Some(cmd.output().expect("mpirun starts"))
    }

    /// The command [`mpirun`] runs, not started; `None` (with the reason printed) where
    /// `mpirun` is not installed.
    fn mpirun_command(provider: &str, args: &[&str]) -> Option<Command> {
        if Command::new("mpirun").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
            println!("skipped: mpirun is not installed (Debian: openmpi-bin)");
            return None;
        }
        let mut cmd = Command::new("mpirun");
        cmd.args([
            "--oversubscribe",
            "--tag-output",
            "--timeout",
            "240",
            "-x",
            "WEFT_PROVIDER",
            "-x",
            "FI_TCP_IFACE",
            "-x",
            "FI_SOCKETS_IFACE",
        ])
        .args(args)
        .env("WEFT_PROVIDER", provider)
        .env("FI_TCP_IFACE", "lo")
        .env("FI_SOCKETS_IFACE", "lo")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("WEFT_RANK")
        .env_remove("WEFT_SIZE")
        .env_remove("WEFT_KVS")
        .env_remove("WEFT_TOKEN")
        .stdin(Stdio::null());
        Some(cmd)
    }

    /// `weft-selftest all` at 2 and 4 ranks: every rank passes every check.
    fn every_check(provider: &str) {
        for n in [2, 4] {
            let Some(o) = mpirun(provider, &["-np", &n.to_string(), SELFTEST, "all"]) else { return };
            let s = text(&o);
            assert!(o.status.success(), "{n} ranks under mpirun on {provider}:\n{s}");
            let lines = ["pingpong ok", "multirate ok", "wildcard ok", "order ok", "large ok"];
            for r in 0..n {
                for line in lines {
                    assert!(s.contains(&format!(",{r}]<stdout>:{line}")), "{n} ranks: missing {line:?} of rank {r}:\n{s}");
                }
                assert!(s.contains(&format!(",{r}]<stdout>:all done")), "{n} ranks: rank {r} did not finish:\n{s}");
            }
        }
    }

    #[test]
    fn every_check_at_2_and_4_ranks_under_mpirun_on_shm() {
        every_check("shm");
    }

    #[test]
    fn every_check_at_2_and_4_ranks_under_mpirun_on_tcp() {
        every_check("tcp");
    }

    /// Rank, size and the ranks on the host come from PMIx (`PMIX_LOCAL_PEERS`): each rank
    /// says which it is, of a job of 3, and is told all three run on this one host.
    #[test]
    fn ranks_size_and_host_ranks_come_from_pmix() {
        let Some(o) = mpirun("shm", &["-np", "3", SELFTEST, "hello"]) else { return };
        let s = text(&o);
        assert!(o.status.success(), "{s}");
        for r in 0..3 {
            assert!(s.contains(&format!(",{r}]<stdout>:rank {r} of 3 on shm")), "rank {r}:\n{s}");
            assert!(s.contains(&format!(",{r}]<stdout>:host ranks 0,1,2 (from the launcher)")), "rank {r}:\n{s}");
        }
    }

    /// The RMA-RW lock over `Levels::hosts`, which groups ranks by PMIx's host ranks, runs
    /// (the `rma` check); under weftrun nobody tells the host ranks.
    #[test]
    fn the_lock_levels_over_pmix_host_ranks_run_and_weftrun_tells_none() {
        let Some(o) = mpirun("tcp", &["-np", "2", SELFTEST, "rma"]) else { return };
        let s = text(&o);
        assert!(o.status.success(), "{s}");
        for r in 0..2 {
            assert!(s.contains(&format!(",{r}]<stdout>:rma ok")), "rank {r}:\n{s}");
        }
        let (o, _) = weftrun(2, "shm", "hello");
        let s = text(&o);
        assert!(o.status.success() && s.contains("[1] host ranks not told by the launcher"), "{s}");
    }

    /// Ranks started with settings that decide how frames are sized set differently (the
    /// CRI count, one value per application context) fail at start with an error that names
    /// the setting, as under weftrun: the check travels with the addresses PMIx exchanges.
    #[test]
    fn ranks_that_disagree_on_settings_fail_at_start_under_mpirun() {
        let args = ["-x", "WEFT_PROVIDER", "-np", "1", "-x", "WEFT_CRIS=1", SELFTEST, "hello", ":"];
        let args = [&args[..], &["-x", "WEFT_PROVIDER", "-np", "1", "-x", "WEFT_CRIS=2", SELFTEST, "hello"]].concat();
        let Some(o) = mpirun("shm", &args) else { return };
        let s = text(&o);
        assert_eq!(o.status.code(), Some(1), "{s}");
        assert!(s.contains("disagree on the CRI count"), "{s}");
    }

    /// The lazy exchange at 8 ranks, three jobs: a get that Open MPI's server answers
    /// "not found" while the peer is still starting (it used to fail about one job in five,
    /// `PMIx_Get ...: code -46`) is made again until the peer has published.
    #[test]
    fn the_lazy_exchange_waits_for_peers_still_starting() {
        for round in 0..3 {
            let Some(o) = mpirun("shm", &["-x", "WEFT_PMIX_EXCHANGE=lazy", "-np", "8", SELFTEST, "hello"]) else { return };
            let s = text(&o);
            assert!(o.status.success(), "round {round}:\n{s}");
            for r in 0..8 {
                assert!(s.contains(&format!(",{r}]<stdout>:rank {r} of 8 on shm")), "round {round}, rank {r}:\n{s}");
            }
        }
    }

    /// A rank that never joins (here not a weft program at all) fails the others' start
    /// within `WEFT_JOIN_TIMEOUT` with an error that says so, instead of a hang.
    #[test]
    fn a_rank_that_never_joins_fails_the_others_within_the_join_timeout() {
        let t0 = Instant::now();
        let args = ["-x", "WEFT_PROVIDER", "-x", "WEFT_JOIN_TIMEOUT=2", "-np", "1", SELFTEST, "hello", ":", "-np", "1", "sleep", "60"];
        let Some(o) = mpirun("shm", &args) else { return };
        let s = text(&o);
        assert_eq!(o.status.code(), Some(1), "{s}");
        assert!(s.contains("did not join within WEFT_JOIN_TIMEOUT"), "{s}");
        assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}:\n{s}", t0.elapsed());
    }

    /// A process of the job that ends with status 0 before any rank has reached PMIx (here
    /// `true`, which `mpirun` starts within a millisecond, where a weft rank takes some
    /// 100 ms to get there): Open MPI 4.1's `mpirun` neither ends the job nor sends an
    /// event, and the weft rank used to wait in the address fence for all of
    /// `WEFT_JOIN_TIMEOUT`. It reads the job's process table while it waits and fails
    /// within seconds, naming the rank. (Should `true` end after the weft rank reached PMIx
    /// after all, `mpirun` ends the job itself, as quickly.)
    #[test]
    fn a_rank_that_ends_before_the_fence_fails_the_others_within_seconds() {
        let t0 = Instant::now();
        let args = ["-x", "WEFT_PROVIDER", "-x", "WEFT_JOIN_TIMEOUT=60", "-np", "1", SELFTEST, "hello", ":", "-np", "1", "true"];
        let Some(o) = mpirun("shm", &args) else { return };
        let s = text(&o);
        assert!(!o.status.success(), "{s}");
        assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}:\n{s}", t0.elapsed());
        assert!(s.contains("rank 1 of the job ended before it joined") || s.contains("exiting improperly"), "{s}");
    }

    /// The lazy exchange (`WEFT_PMIX_EXCHANGE=lazy`: no fence, one `PMIx_Get` per peer)
    /// starts a job of 4 that passes every check, and a rank that never publishes fails the
    /// others within `WEFT_JOIN_TIMEOUT`, as the fence does; a value that is neither mode is
    /// refused at start.
    #[test]
    fn the_lazy_exchange_starts_a_job_and_bounds_a_rank_that_never_joins() {
        let Some(o) = mpirun("shm", &["-x", "WEFT_PMIX_EXCHANGE=lazy", "-np", "4", SELFTEST, "all"]) else { return };
        let s = text(&o);
        assert!(o.status.success(), "{s}");
        for r in 0..4 {
            assert!(s.contains(&format!(",{r}]<stdout>:all done")), "rank {r} did not finish:\n{s}");
        }
        let t0 = Instant::now();
        let args =
            ["-x", "WEFT_PMIX_EXCHANGE=lazy", "-x", "WEFT_JOIN_TIMEOUT=2", "-np", "1", SELFTEST, "hello", ":", "-np", "1", "sleep", "60"];
        let Some(o) = mpirun("shm", &args) else { return };
        let s = text(&o);
        assert_eq!(o.status.code(), Some(1), "{s}");
        assert!(s.contains("did not publish them within WEFT_JOIN_TIMEOUT"), "{s}");
        assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}:\n{s}", t0.elapsed());
        let Some(o) = mpirun("shm", &["-x", "WEFT_PMIX_EXCHANGE=eager", "-np", "2", SELFTEST, "hello"]) else { return };
        let s = text(&o);
        assert_eq!(o.status.code(), Some(1), "{s}");
        assert!(s.contains("WEFT_PMIX_EXCHANGE must be fence or lazy"), "{s}");
    }

    /// A rank killed mid-job ends the job within seconds with a failure status (mpirun
    /// tears the job down; no survivor is left waiting on the dead rank).
    #[test]
    fn a_killed_rank_ends_the_job_without_a_hang() {
        let t0 = Instant::now();
        let Some(o) = mpirun("shm", &["-np", "2", SELFTEST, "peer-lost"]) else { return };
        let s = text(&o);
        assert!(!o.status.success(), "{s}");
        assert!(s.contains("killing itself on purpose"), "{s}");
        assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}:\n{s}", t0.elapsed());
    }

    /// A rank of the job that is an MPI program, not a weft one, joins the address fence
    /// (its `MPI_Init` fences too) without publishing weft's key: the weft ranks fail at
    /// start with an error naming that rank and the key, within seconds.
    #[test]
    fn a_rank_without_the_address_key_is_named_in_the_error() {
        if Command::new("mpicc").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
            println!("skipped: mpicc is not installed (Debian: libopenmpi-dev)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("weft-mpi-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (src, exe) = (dir.join("init.c"), dir.join("init"));
        std::fs::write(&src, "#include <mpi.h>\nint main(int c, char **v) { MPI_Init(&c, &v); MPI_Finalize(); return 0; }\n").unwrap();
        let cc = Command::new("mpicc").arg("-o").arg(&exe).arg(&src).output().unwrap();
        assert!(cc.status.success(), "mpicc: {}", String::from_utf8_lossy(&cc.stderr));
        let t0 = Instant::now();
        let exe = exe.to_str().unwrap().to_string();
        let args = ["--mca", "orte_abort_on_non_zero_status", "0", "-np", "2", SELFTEST, "hello", ":", "-np", "1", &exe];
        let o = mpirun("shm", &args);
        let _ = std::fs::remove_dir_all(&dir);
        let Some(o) = o else { return };
        let s = text(&o);
        let said = "rank 2's fabric addresses: the key weft.addr is missing";
        assert_eq!(s.matches(said).count(), 2, "{s}");
        assert!(t0.elapsed() < Duration::from_secs(30), "took {:?}:\n{s}", t0.elapsed());
    }

    /// `mpirun` killed with SIGKILL while its ranks wait on `shm` for a message that never
    /// comes: each rank's PMIx client reports the lost connection to its server, which is
    /// `ServerLost` as under weftrun — the rank removes its regions' names and fails its wait
    /// with `PeerLost` (then kills itself) — within seconds. Nothing else would end the
    /// ranks: they waited for ever.
    #[test]
    fn killing_mpirun_fails_the_ranks_waits_and_leaves_no_shm_files_behind() {
        let Some(mut cmd) = mpirun_command("shm", &["-np", "2", SELFTEST, "outlive-launcher"]) else { return };
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("mpirun starts");
        let (pids, _out) = rank_pids(&mut child, 2);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(pids.len(), 2, "ranks did not start: pids {pids:?}");
        let t1 = Instant::now();
        while pids.iter().any(|&p| runs(p) || !shm_files_of(p).is_empty()) && t1.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<u32> = pids.iter().copied().filter(|&p| runs(p)).collect();
        for &p in &left {
            // SAFETY: a plain syscall; `p` is a rank this test started and that still runs.
            unsafe { libc::kill(p as i32, libc::SIGKILL) };
        }
        assert_eq!(left, Vec::<u32>::new(), "rank processes outlived mpirun by 10 s");
        for p in pids {
            assert_eq!(shm_files_of(p), Vec::<String>::new(), "shm regions of rank process {p} left behind");
        }
    }

    /// The embedded provider cannot span processes: a job of 2 on it fails at start on
    /// every rank, saying so (the size is known only once PMIx is joined); a job of 1 runs.
    #[test]
    fn the_embedded_provider_is_refused_in_a_job_of_several() {
        let Some(o) = mpirun("embedded", &["-np", "2", SELFTEST, "hello"]) else { return };
        let s = text(&o);
        assert_eq!(o.status.code(), Some(1), "{s}");
        assert!(s.contains("embedded provider cannot span processes"), "{s}");
        let Some(o) = mpirun("embedded", &["-np", "1", SELFTEST, "hello"]) else { return };
        let s = text(&o);
        assert!(o.status.success(), "{s}");
        assert!(s.contains(",0]<stdout>:rank 0 of 1 on embedded"), "{s}");
    }

    /// The job's exit status is a rank's: rank 1 of 2 exits with 3 after both arrived.
    #[test]
    fn a_rank_exit_code_is_the_job_exit_code() {
        let Some(o) = mpirun("shm", &["-np", "2", SELFTEST, "exit-code"]) else { return };
        assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    }
}

/// Jobs under Slurm's `srun --mpi=pmix` (feature `pmix`): the same PMIx bootstrap as under
/// `mpirun`, through Slurm's PMIx plugin. They skip (saying why) where no Slurm node is up;
/// `.ci/slurm-one-node.sh` starts a one-node cluster on this machine.
#[cfg(feature = "pmix")]
mod under_srun {
    use super::*;

    /// `srun --mpi=pmix -n N -O` (overcommitted: more ranks than cores) with every line
    /// labelled by its rank (`R: `); `None` (with the reason printed) where `srun` has no
    /// node to run on.
    fn srun(n: u32, provider: &str, args: &[&str]) -> Option<Output> {
        let up = Command::new("sinfo").args(["-h", "-o", "%t"]).output();
        if !up.is_ok_and(|o| o.status.success() && ["idle", "mix", "alloc"].iter().any(|s| String::from_utf8_lossy(&o.stdout).contains(s)))
        {
            println!("skipped: no Slurm node is up here (.ci/slurm-one-node.sh starts one)");
            return None;
        }
        let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let out = Command::new("srun")
            .args(["--mpi=pmix", "-O", "-l", "-t", "4", "-n", &n.to_string()])
            .arg(format!("--export=ALL,WEFT_PROVIDER={provider},FI_TCP_IFACE=lo,FI_SOCKETS_IFACE=lo"))
            .args(args)
            .env_remove("WEFT_RANK")
            .env_remove("WEFT_SIZE")
            .env_remove("WEFT_KVS")
            .env_remove("WEFT_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("srun starts");
        Some(out)
    }

    /// `weft-selftest all` at 2 ranks on shm and tcp, with no variable but the provider.
    #[test]
    fn every_check_under_srun_on_shm_and_tcp() {
        for provider in ["shm", "tcp"] {
            let Some(o) = srun(2, provider, &[SELFTEST, "all"]) else { return };
            let s = text(&o);
            assert!(o.status.success(), "{provider}:\n{s}");
            for r in 0..2 {
                for line in ["pingpong ok", "wildcard ok", "order ok", "large ok", "all done"] {
                    assert!(s.contains(&format!("{r}: {line}")), "{provider}: rank {r}: missing {line:?}:\n{s}");
                }
            }
        }
    }

    /// Rank, size and the ranks on the host come from Slurm's PMIx server; a rank's exit
    /// status is the job's.
    #[test]
    fn ranks_size_and_host_ranks_come_from_slurms_pmix_and_the_exit_code_is_the_jobs() {
        let Some(o) = srun(3, "shm", &[SELFTEST, "hello"]) else { return };
        let s = text(&o);
        assert!(o.status.success(), "{s}");
        for r in 0..3 {
            assert!(s.contains(&format!("{r}: rank {r} of 3 on shm")), "rank {r}:\n{s}");
            assert!(s.contains(&format!("{r}: host ranks 0,1,2 (from the launcher)")), "rank {r}:\n{s}");
        }
        let Some(o) = srun(2, "shm", &[SELFTEST, "exit-code"]) else { return };
        assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    }
}
