//! `weft-selftest <check>`: multi-process checks of a weft installation, run under
//! `weftrun` (`weftrun -n 4 --provider shm weft-selftest all`). Each check verifies what it
//! receives and exits non-zero with a message on the first mismatch; the integration test
//! `tests/multiprocess.rs` drives them on `shm` and `tcp;ofi_rxm`.
//!
//! | check | ranks | what |
//! |---|---|---|
//! | `hello` | any | prints rank, size and provider |
//! | `pingpong` | >= 2 | 1000 round trips 0 <-> 1, contents checked |
//! | `multirate` | even | every multirate pattern (pairwise, one-to-many, many-to-one, many-to-many), window 16, 10 iterations |
//! | `wildcard` | >= 2 | rank 0 receives from `Source::Any`/`Tag::Any`; per-source order checked |
//! | `order` | >= 2 | eager and rendezvous messages interleaved on one tag arrive in send order |
//! | `large` | >= 2 | a 64 MiB message 0 -> 1 and back, contents checked |
//! | `alltoall` | >= 2 | every rank sends 64 KiB (rendezvous) to every other at once, 40 rounds, contents checked |
//! | `all` | even, >= 2 | all of the above |
//! | `peer-lost` | 2 | rank 0 kills itself (SIGKILL); rank 1's pending receive and rendezvous send, and a new send and receive, fail with `PeerLost` |
//! | `peer-lost-read` | 2 | rank 0 kills itself while rank 1 reads its 64 MiB message; rank 1's receive fails with `PeerLost` (not a transport error) or, if the read was done first, holds the whole message |
//! | `kill-mid-transfer MS` | 2 | rank 0 streams 64 MiB messages to rank 1, which kills itself (SIGKILL) `MS` ms into the first receive; rank 0's send fails with `PeerLost` within seconds |
//! | `outlive-launcher` | any | prints its pid and waits for a message that never comes; rank 1 ignores SIGTERM first. Once its wait fails (the test kills `weftrun`: `PeerLost`) a rank kills itself (SIGKILL), printing nothing more |
//! | `peer-finished` | 2 | rank 1 sends 8 messages and drops its runtime (a normal finish) while rank 0 has receives posted that only rank 1 could match; rank 0 still gets the 8 messages, then the others, a new receive and a new send fail with `PeerLost` |
//! | `netns` | 2 | a message and 1 MiB each way (the multi-host test) |
//! | `block` | any | prints its pid, then waits for a message that never comes (teardown test) |
//! | `exit-code` | any | rank `r` exits with status `3 * r` after everyone arrived |

use std::time::{Duration, Instant};

use weft::{Communicator, Error, Request, Runtime, Source, Tag};

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

fn pingpong(c: &Communicator) -> Res {
    let me = c.rank();
    for i in 0..1000u64 {
        match me {
            0 => {
                c.send(i.to_le_bytes().to_vec(), 1, 1).map_err(e)?;
                let (b, st) = c.recv(Vec::<u8>::with_capacity(8), 1u32, 2).map_err(e)?;
                check(b[..] == (i + 1).to_le_bytes() && st.source == 1, || format!("pingpong {i}: got {b:?}"))?;
            }
            1 => {
                let (b, _) = c.recv(Vec::<u8>::with_capacity(8), 0u32, 1).map_err(e)?;
                let v = u64::from_le_bytes(b[..8].try_into().map_err(|_| "short message".to_string())?);
                check(v == i, || format!("pingpong: expected {i}, got {v}"))?;
                c.send((v + 1).to_le_bytes().to_vec(), 0, 2).map_err(e)?;
            }
            _ => break,
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
    check(size % 2 == 0, || "multirate needs an even number of ranks".into())?;
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
                    c.recv(Vec::<u8>::with_capacity(1), r, tag(l, 1)).map_err(e)?;
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
                let (b, st) = req.wait().map_err(e)?;
                let want = format!("{pattern}:{l}:{it}:{}", k_of[l]);
                k_of[l] += 1;
                check(b == want.as_bytes() && st.source == ls[l].0, || {
                    format!("multirate: expected {want:?}, got {:?}", String::from_utf8_lossy(&b))
                })?;
                if k_of[l] == w {
                    c.send(&b"a"[..], ls[l].0, tag(l, 2)).map_err(e)?;
                }
            }
            for (l, &(s, r)) in ls.iter().enumerate() {
                if s == me {
                    c.recv(Vec::<u8>::with_capacity(1), r, tag(l, 2)).map_err(e)?;
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
            let (b, st) = c.recv(Vec::<u8>::with_capacity(8), Source::Any, Tag::Any).map_err(e)?;
            let v = u32::from_le_bytes(b[..4].try_into().map_err(|_| "short".to_string())?);
            let from = st.source as usize;
            check(st.tag == st.source as i32 && v == next[from], || {
                format!("wildcard: from {from} tag {} got {v}, expected {}", st.tag, next[from])
            })?;
            next[from] += 1;
        }
        check(next[1..].iter().all(|&n| n == per), || format!("wildcard: counts {next:?}"))?;
    } else {
        for i in 0..per {
            c.send(i.to_le_bytes().to_vec(), 0, me as i32).map_err(e)?;
        }
    }
    Ok(())
}

fn order(c: &Communicator) -> Res {
    let n = 200u32;
    let size_of = |i: u32| if i % 3 == 2 { 40_000 + i as usize } else { 8 + (i as usize % 100) };
    match c.rank() {
        0 => {
            let mut reqs = Vec::new();
            for i in 0..n {
                let mut v = vec![(i % 251) as u8; size_of(i)];
                v[..4].copy_from_slice(&i.to_le_bytes());
                reqs.push(c.isend(v, 1, 5).map_err(e)?);
            }
            weft::wait_all(&mut reqs).map_err(e)?;
        }
        1 => {
            for i in 0..n {
                let (b, st) = c.recv(Vec::<u8>::with_capacity(50_000), 0u32, Tag::Any).map_err(e)?;
                let got = u32::from_le_bytes(b[..4].try_into().map_err(|_| "short".to_string())?);
                check(got == i && st.bytes == size_of(i) && b[4..].iter().all(|&x| x == (i % 251) as u8), || {
                    format!("order: message {i} arrived as {got} ({} bytes)", st.bytes)
                })?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn large(c: &Communicator) -> Res {
    let n = 64usize << 20;
    let pattern = |i: usize, salt: usize| (i.wrapping_mul(31) ^ salt) as u8;
    match c.rank() {
        0 => {
            let data: Vec<u8> = (0..n).map(|i| pattern(i, 1)).collect();
            let t0 = Instant::now();
            c.send(data, 1, 9).map_err(e)?;
            let (b, st) = c.recv(Vec::<u8>::with_capacity(n), 1u32, 10).map_err(e)?;
            check(st.bytes == n && b.iter().enumerate().all(|(i, &x)| x == pattern(i, 2)), || "large: reply corrupted".into())?;
            println!("large 64 MiB round trip {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
        }
        1 => {
            let (b, st) = c.recv(Vec::<u8>::with_capacity(n), 0u32, 9).map_err(e)?;
            check(st.bytes == n && b.iter().enumerate().all(|(i, &x)| x == pattern(i, 1)), || "large: message corrupted".into())?;
            let data: Vec<u8> = (0..n).map(|i| pattern(i, 2)).collect();
            c.send(data, 0, 10).map_err(e)?;
        }
        _ => {}
    }
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
            let (b, st) = r.wait().map_err(|err| format!("alltoall round {round}: from {p}: {err}"))?;
            check(st.bytes == ALLTOALL_BYTES && b.iter().all(|&x| x == fill(p, round)), || {
                format!("alltoall round {round}: message from {p} corrupted")
            })?;
        }
        weft::wait_all(&mut sends).map_err(e)?;
    }
    println!("alltoall ok: {ALLTOALL_ROUNDS} rounds of {ALLTOALL_BYTES} B to each of {} ranks", size - 1);
    Ok(())
}

/// `peer-lost-read`: see the table in the module docs.
fn peer_lost_read(rt: &Runtime) -> Res {
    let c = rt.world();
    let n = 64usize << 20;
    match c.rank() {
        0 => {
            let data = vec![0x5au8; n];
            c.recv(Vec::<u8>::with_capacity(1), 1u32, 1).map_err(e)?;
            let _send = c.isend(data, 1, 7).map_err(e)?;
            // Serve the start of rank 1's read, then die with the rest outstanding.
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_millis(5) {
                rt.progress();
            }
            eprintln!("rank 0 killing itself on purpose");
            // SAFETY: as in `peer_lost`.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            unreachable!("SIGKILL returned");
        }
        1 => {
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
            check(t0.elapsed() < Duration::from_secs(20), || format!("PeerLost took {ms} ms"))?;
        }
        _ => {}
    }
    Ok(())
}

fn peer_lost(c: &Communicator) -> Res {
    match c.rank() {
        0 => {
            c.recv(Vec::<u8>::with_capacity(1), 1u32, 1).map_err(e)?;
            eprintln!("rank 0 killing itself on purpose");
            // SAFETY: plain syscalls on this process; SIGKILL cannot be caught (libfabric's
            // SIGABRT handler would turn an abort into a normal exit), like a crashed node.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            unreachable!("SIGKILL returned");
        }
        1 => {
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
        }
        _ => {}
    }
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
        1 => {
            let mut buf = Vec::<u8>::with_capacity(LEN);
            for i in 0..MESSAGES {
                if i == 0 {
                    std::thread::spawn(move || {
                        std::thread::sleep(delay);
                        // SAFETY: plain syscalls on this process (a crash, which nothing
                        // can catch).
                        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                    });
                }
                buf = c.recv(buf, 0u32, 1).map_err(e)?.0;
            }
            Err("rank 1 outlived every message".into())
        }
        _ => Ok(()),
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
        // SAFETY: plain syscalls on this process: it dies without closing anything.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    r.map(|_| ()).map_err(e)
}

/// Messages rank 1 sends before it finishes in `peer-finished`.
const BEFORE_FINISH: u8 = 8;

/// `peer-finished`: see the table in the module docs. Takes the runtime because rank 1
/// drops it.
fn peer_finished(rt: Runtime) -> Res {
    let c = rt.world();
    match c.rank() {
        0 => {
            // Receives only rank 1 could match, posted before it finishes.
            let mut pending = c.irecv(Vec::<u8>::with_capacity(8), 1u32, 99).map_err(e)?;
            let mut any = c.irecv(Vec::<u8>::with_capacity(8), Source::Any, 98).map_err(e)?;
            // No progress meanwhile: rank 1's messages and its finish both arrive before
            // this rank looks, the case where the messages must still come first.
            std::thread::sleep(Duration::from_millis(1500));
            for i in 0..BEFORE_FINISH {
                let (b, st) =
                    c.recv(Vec::<u8>::with_capacity(256), 1u32, 1).map_err(|err| format!("message {i} sent before the finish: {err}"))?;
                check(b == vec![i; 16 << (i % 4)] && st.source == 1, || format!("message {i}: got {} bytes {:?}", b.len(), b.first()))?;
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
        }
        1 => {
            for i in 0..BEFORE_FINISH {
                c.send(vec![i; 16 << (i % 4)], 0, 1).map_err(e)?;
            }
            drop(rt);
            println!("peer-finished: rank 1 finished");
        }
        _ => {}
    }
    Ok(())
}

fn netns(c: &Communicator) -> Res {
    let other = 1 - c.rank();
    let msg = format!("hello from rank {}", c.rank()).into_bytes();
    let r = c.irecv(Vec::<u8>::with_capacity(64), other, 4).map_err(e)?;
    c.send(msg, other, 4).map_err(e)?;
    let (b, _) = r.wait().map_err(e)?;
    check(b == format!("hello from rank {other}").as_bytes(), || "netns: wrong message".into())?;
    let big = vec![c.rank() as u8; 1 << 20];
    let r = c.irecv(Vec::<u8>::with_capacity(1 << 20), other, 5).map_err(e)?;
    c.send(big, other, 5).map_err(e)?;
    let (b, _) = r.wait().map_err(e)?;
    check(b.len() == 1 << 20 && b.iter().all(|&x| x == other as u8), || "netns: 1 MiB message corrupted".into())?;
    println!("netns ok: rank {} exchanged with rank {other}", c.rank());
    Ok(())
}

fn run(what: &str) -> Res {
    let rt = Runtime::builder().build().map_err(|err| format!("cannot start the runtime: {err}"))?;
    if what == "peer-finished" {
        return peer_finished(rt);
    }
    let c = rt.world();
    let c_rank = c.rank();
    let started = Instant::now();
    match what {
        "hello" => {
            println!("rank {} of {} on {}", rt.rank(), rt.size(), rt.config().provider);
            Ok(())
        }
        "pingpong" => pingpong(c),
        "multirate" => multirate(c),
        "wildcard" => wildcard(c),
        "order" => order(c),
        "large" => large(c),
        "alltoall" => alltoall(c),
        "peer-lost" => peer_lost(c),
        "peer-lost-read" => peer_lost_read(&rt),
        "kill-mid-transfer" => {
            let ms = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(300);
            kill_mid_transfer(c, Duration::from_millis(ms))
        }
        "outlive-launcher" => outlive_launcher(c),
        "netns" => netns(c),
        "block" => {
            println!("pid {}", std::process::id());
            c.recv(Vec::<u8>::with_capacity(1), Source::Any, 77).map(|_| ()).map_err(e)
        }
        "exit-code" => Ok(()),
        "all" => {
            pingpong(c)?;
            println!("pingpong ok");
            multirate(c)?;
            wildcard(c)?;
            println!("wildcard ok");
            order(c)?;
            println!("order ok");
            large(c)?;
            println!("large ok");
            Ok(())
        }
        other => Err(format!("unknown check {other:?}")),
    }?;
    // Nobody leaves while a peer may still need it.
    if rt.size() > 1 && !what.starts_with("peer-lost") && what != "kill-mid-transfer" {
        let me = rt.rank();
        for r in 0..rt.size() {
            if r != me {
                c.send(&b"."[..], r, 1_000_000).map_err(e)?;
            }
        }
        for r in 0..rt.size() {
            if r != me {
                c.recv(Vec::<u8>::with_capacity(1), r, 1_000_000).map_err(e)?;
            }
        }
    }
    println!("{what} done in {:.0} ms", started.elapsed().as_secs_f64() * 1e3);
    if what == "exit-code" {
        drop(rt);
        std::process::exit(3 * c_rank as i32);
    }
    Ok(())
}

fn main() {
    let what = std::env::args().nth(1).unwrap_or_else(|| "hello".into());
    if let Err(msg) = run(&what) {
        eprintln!("weft-selftest {what}: FAILED: {msg}");
        std::process::exit(1);
    }
}
