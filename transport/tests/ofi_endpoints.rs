//! Two endpoints in one process, per provider (`shm`, `tcp;ofi_rxm`, `sockets`): tagged
//! messages of several sizes, many small messages in flight with `FI_EAGAIN` handling, RMA
//! and atomics on a registered buffer, a truncation error surfaced from the CQ, the CQ wait
//! fd, and argument checks. A provider missing on the machine is skipped with a message.
#![cfg(feature = "ofi")]

mod ofi_common;

use std::time::{Duration, Instant};

use ofi_common::{pair, pair_with, pattern, Pair, Which, DEADLINE};
use weft_transport::ofi::{errno, Caps, CompletionFlags, EndpointConfig, FetchOp, MemoryRegion, MrAccess, RemoteRegion, WaitOutcome};

const ALL_TAGS: u64 = 0;

fn tagged_sizes(provider: &str) {
    let Some(mut p) = pair(provider) else { return };
    // Plain buffers: 0 B, 8 B, 4 KiB, 1 MiB.
    for (i, &len) in [0usize, 8, 4096, 1 << 20].iter().enumerate() {
        let tag = 0x100 + i as u64;
        let data = pattern(len, i as u8);
        let mut rbuf = vec![0xEEu8; len];
        let (rctx, sctx) = (0x1000 + i as u64, 0x2000 + i as u64);
        p.post_retry("trecv", |p| {
            // SAFETY: `rbuf` lives until the wait below and is not touched before it.
            unsafe { p.b.ep.trecv(&mut rbuf, None, Some(p.to_a), tag, ALL_TAGS, rctx) }.expect("trecv")
        });
        p.post_retry("tsend", |p| {
            // SAFETY: `data` lives, unmodified, until the send completion is read below.
            unsafe { p.a.ep.tsend(&data, None, p.to_b, tag, sctx) }.expect("tsend")
        });
        let s = p.wait_ok(Which::A, sctx, "send completion");
        assert!(s.flags.contains(CompletionFlags::SEND), "send flags {:?}", s.flags);
        let r = p.wait_ok(Which::B, rctx, "receive completion");
        assert!(r.flags.contains(CompletionFlags::RECV | CompletionFlags::TAGGED), "{:?}", r.flags);
        assert_eq!(r.len, len, "received length for {len} B");
        assert_eq!(r.tag, tag);
        assert!(rbuf == data, "payload of {len} B differs");
    }
    // Registered buffers on both sides (1 MiB), passing descriptors.
    let len = 1 << 20;
    let smr = MemoryRegion::alloc(p.a.ep.domain(), len, MrAccess::ALL).expect("register send");
    let rmr = MemoryRegion::alloc(p.b.ep.domain(), len, MrAccess::ALL).expect("register recv");
    let data = pattern(len, 9);
    smr.write_at(0, &data).expect("fill");
    p.post_retry("trecv(mr)", |p| {
        // SAFETY: `rmr` outlives the wait below; nothing reads it until then.
        unsafe { p.b.ep.trecv(rmr.as_mut_slice(), Some(&rmr), None, 77, ALL_TAGS, 1) }.expect("trecv")
    });
    p.post_retry("tsend(mr)", |p| {
        // SAFETY: `smr` outlives the wait below and is not modified until then.
        unsafe { p.a.ep.tsend(smr.as_slice(), Some(&smr), p.to_b, 77, 2) }.expect("tsend")
    });
    p.wait_ok(Which::A, 2, "send(mr) completion");
    let r = p.wait_ok(Which::B, 1, "recv(mr) completion");
    assert_eq!(r.len, len);
    let mut got = vec![0u8; len];
    rmr.read_at(0, &mut got).expect("read back");
    assert!(got == data, "registered 1 MiB payload differs");
    // Inject (no completion for the sender).
    let small = pattern(8.min(p.a.ep.inject_size()), 3);
    let mut rbuf = vec![0u8; small.len()];
    p.post_retry("trecv(inject)", |p| {
        // SAFETY: `rbuf` lives until the wait below and is not touched before it.
        unsafe { p.b.ep.trecv(&mut rbuf, None, None, 5, ALL_TAGS, 3) }.expect("trecv")
    });
    p.post_retry("tinject", |p| p.a.ep.tinject(&small, p.to_b, 5).expect("tinject"));
    let r = p.wait_ok(Which::B, 3, "recv(inject) completion");
    assert_eq!((r.len, r.tag), (small.len(), 5));
    assert_eq!(rbuf, small);
}

fn many_small(provider: &str) {
    // A small CQ so that the provider's queues fill and posts return FI_EAGAIN.
    let config = EndpointConfig { cq_size: 64, ..EndpointConfig::default() };
    let Some(mut p) = pair_with(provider, &config) else {
        return;
    };
    const N: usize = 2000;
    let sends: Vec<[u8; 8]> = (0..N as u64).map(|i| (i * 3 + 1).to_le_bytes()).collect();
    let mut recvs = vec![0u8; N * 8];
    let mut blocked = 0;
    let start = Instant::now();
    for (i, rbuf) in recvs.chunks_mut(8).enumerate() {
        let tag = i as u64;
        blocked += p.post_retry("trecv", |p| {
            // SAFETY: `recvs` lives until all completions are read below and is not read
            // before.
            unsafe { p.b.ep.trecv(rbuf, None, Some(p.to_a), tag, ALL_TAGS, (1 << 32) | tag) }.expect("trecv")
        });
        let sbuf = &sends[i];
        blocked += p.post_retry("tsend", |p| {
            // SAFETY: `sends` lives, unmodified, until all completions are read below.
            unsafe { p.a.ep.tsend(sbuf, None, p.to_b, tag, (2 << 32) | tag) }.expect("tsend")
        });
        p.progress();
    }
    let (mut nsend, mut nrecv) = (0, 0);
    while nsend < N || nrecv < N {
        assert!(start.elapsed() < DEADLINE, "timed out: {nsend} sends, {nrecv} receives of {N}");
        p.progress();
        while let Some(c) = p.a.done.pop_front() {
            let c = c.unwrap_or_else(|e| panic!("send failed: {e:?}"));
            assert_eq!(c.context >> 32, 2);
            nsend += 1;
        }
        while let Some(c) = p.b.done.pop_front() {
            let c = c.unwrap_or_else(|e| panic!("receive failed: {e:?}"));
            assert_eq!(c.context >> 32, 1);
            assert_eq!((c.len, c.tag), (8, c.context & 0xffff_ffff));
            nrecv += 1;
        }
    }
    for (i, r) in recvs.chunks(8).enumerate() {
        assert_eq!(r, &sends[i][..], "message {i}");
    }
    println!("{provider}: {N} messages, FI_EAGAIN handled {blocked} times, {:?}", start.elapsed());
}

fn rma(provider: &str) {
    let Some(mut p) = pair(provider) else { return };
    let missing = p.info.missing_caps();
    if missing.contains(Caps::RMA) {
        println!("SKIP rma: {provider} lacks {missing:?}");
        return;
    }
    let target = MemoryRegion::alloc(p.b.ep.domain(), 4096, MrAccess::ALL).expect("register target");
    let local = MemoryRegion::alloc(p.a.ep.domain(), 4096, MrAccess::ALL).expect("register local");
    // The remote description travels as bytes, as it would in a message.
    let remote = RemoteRegion::from_bytes(&target.remote().to_bytes()).expect("decode");
    assert_eq!(remote, target.remote());

    // Write 64 B at offset 128.
    let data = pattern(64, 1);
    local.write_at(0, &data).expect("fill");
    p.post_retry("write", |p| {
        // SAFETY: `local` outlives the wait below; bytes 0..64 are not modified until then.
        let src = unsafe { &local.as_slice()[..64] };
        // SAFETY: `src` stays valid and unmodified until the write completion is read below.
        unsafe { p.a.ep.write(src, Some(&local), p.to_b, &remote, 128, 10, false) }.expect("write")
    });
    let c = p.wait_ok(Which::A, 10, "write completion");
    assert!(c.flags.contains(CompletionFlags::RMA | CompletionFlags::WRITE), "{:?}", c.flags);
    let mut got = vec![0u8; 64];
    target.read_at(128, &mut got).expect("read target");
    assert_eq!(got, data, "RMA write");

    // Read 256 B from offset 512.
    let data = pattern(256, 2);
    target.write_at(512, &data).expect("fill target");
    p.post_retry("read", |p| {
        // SAFETY: `local` outlives the wait below; bytes 1024..1280 are not accessed until then.
        let dst = unsafe { &mut local.as_mut_slice()[1024..1280] };
        // SAFETY: `dst` stays valid and untouched until the read completion is read below.
        unsafe { p.a.ep.read(dst, Some(&local), p.to_b, &remote, 512, 11) }.expect("read")
    });
    let c = p.wait_ok(Which::A, 11, "read completion");
    assert!(c.flags.contains(CompletionFlags::RMA | CompletionFlags::READ), "{:?}", c.flags);
    let mut got = vec![0u8; 256];
    local.read_at(1024, &mut got).expect("read local");
    assert_eq!(got, data, "RMA read");

    if missing.contains(Caps::ATOMIC) {
        println!("SKIP atomics: {provider} lacks {missing:?}");
        return;
    }
    assert!(p.a.ep.fetch_atomic_valid(FetchOp::Sum), "FI_SUM/u64 not valid on {provider}");
    assert!(p.a.ep.compare_swap_valid(), "FI_CSWAP/u64 not valid on {provider}");
    // Fetch-add: 40 + 2.
    target.store_u64(2048, 40).expect("store");
    let (operand, mut old) = (2u64, 0u64);
    p.post_retry("fetch_add", |p| {
        // SAFETY: `operand` and `old` outlive the wait below and are not touched until then.
        unsafe { p.a.ep.fetch_atomic_u64(FetchOp::Sum, &operand, &mut old, p.to_b, &remote, 2048, 12) }.expect("fetch_atomic")
    });
    let c = p.wait_ok(Which::A, 12, "fetch-add completion");
    assert!(c.flags.contains(CompletionFlags::ATOMIC), "{:?}", c.flags);
    assert_eq!(old, 40, "fetch-add old value");
    assert_eq!(target.load_u64(2048).expect("load"), 42, "fetch-add result");

    // Compare-swap: succeeds (42 -> 7), then fails (compare 1; stays 7).
    for (i, (compare, swap, want_old, want_new)) in [(42u64, 7u64, 42u64, 7u64), (1, 9, 7, 7)].into_iter().enumerate() {
        let mut old = 0u64;
        let ctx = 13 + i as u64;
        p.post_retry("cswap", |p| {
            // SAFETY: `compare`, `swap`, `old` outlive the wait below, untouched until then.
            unsafe { p.a.ep.compare_swap_u64(&compare, &swap, &mut old, p.to_b, &remote, 2048, ctx) }.expect("compare_atomic")
        });
        p.wait_ok(Which::A, ctx, "compare-swap completion");
        assert_eq!(old, want_old, "cswap {i} old value");
        assert_eq!(target.load_u64(2048).expect("load"), want_new, "cswap {i} new value");
    }
    if p.a.ep.rma_counter().is_some() {
        let count = |p: &Pair| p.a.ep.rma_counter().map_or(0, |c| c.read());
        let start = Instant::now();
        while count(&p) < 5 {
            assert!(start.elapsed() < DEADLINE, "RMA counter stuck at {}", count(&p));
            p.progress();
        }
        assert_eq!(p.a.ep.rma_counter().map_or(0, |c| c.read_err()), 0);
        println!("{provider}: RMA counter = {}", count(&p));
    }
}

fn truncation_error(provider: &str) {
    let Some(mut p) = pair(provider) else { return };
    let data = pattern(64, 4);
    let mut small = vec![0u8; 8];
    p.post_retry("trecv(small)", |p| {
        // SAFETY: `small` lives until the wait below and is not touched before it.
        unsafe { p.b.ep.trecv(&mut small, None, None, 42, ALL_TAGS, 20) }.expect("trecv")
    });
    p.post_retry("tsend(64)", |p| {
        // SAFETY: `data` lives, unmodified, until the send completion is read below.
        unsafe { p.a.ep.tsend(&data, None, p.to_b, 42, 21) }.expect("tsend")
    });
    let err = match p.wait(Which::B, 20, "truncated receive") {
        Ok(c) => panic!("expected FI_ETRUNC, got a successful completion {c:?}"),
        Err(e) => e,
    };
    println!("{provider}: truncated receive -> {err:?}");
    assert_eq!(err.error.code, errno::FI_ETRUNC, "{err:?}");
    // shm reports the overflow length; tcp;ofi_rxm (1.17) leaves it 0.
    assert!(err.olen == 56 || err.olen == 0, "overflow length {}", err.olen);
    assert_eq!(err.tag, 42);
    assert!(!err.error.text.is_empty());
    // The sender's side completes (successfully on every provider tried).
    let s = p.wait(Which::A, 21, "send of truncated message");
    println!("{provider}: sender side -> {s:?}");
    if provider.contains("tcp") {
        // libfabric 1.17's tcp provider disables the connection after a truncated receive
        // (ofiwg/libfabric#8274, fixed in later releases): later messages on it never arrive.
        // weft therefore never posts a receive smaller than its largest eager frame.
        println!("{provider}: not checking reuse after truncation (libfabric#8274 in 1.17)");
        return;
    }
    // The endpoint keeps working after the error.
    let mut rbuf = vec![0u8; 64];
    p.post_retry("trecv", |p| {
        // SAFETY: `rbuf` lives until the wait below and is not touched before it.
        unsafe { p.b.ep.trecv(&mut rbuf, None, None, 43, ALL_TAGS, 22) }.expect("trecv")
    });
    p.post_retry("tsend", |p| {
        // SAFETY: as above, for `data`.
        unsafe { p.a.ep.tsend(&data, None, p.to_b, 43, 23) }.expect("tsend")
    });
    p.wait_ok(Which::B, 22, "receive after error");
    p.wait_ok(Which::A, 23, "send after error");
    assert_eq!(rbuf, data);
}

fn wait_fd(provider: &str) {
    let Some(mut p) = pair(provider) else { return };
    let Some(fd) = p.b.ep.cq().wait_fd() else {
        println!("{provider}: no FI_WAIT_FD wait object on the CQ; wait() must refuse");
        assert!(p.b.ep.cq().wait(Duration::from_millis(1)).is_err());
        return;
    };
    println!("{provider}: CQ wait fd {fd}");
    let mut rbuf = vec![0u8; 8];
    p.post_retry("trecv", |p| {
        // SAFETY: `rbuf` lives until the loop below sees its completion.
        unsafe { p.b.ep.trecv(&mut rbuf, None, None, 1, ALL_TAGS, 30) }.expect("trecv")
    });
    // Nothing is coming yet: waiting must time out or report pending provider work, never
    // produce a completion.
    let idle = p.b.ep.cq().wait(Duration::from_millis(20)).expect("wait");
    println!("{provider}: idle wait -> {idle:?}");
    p.post_retry("tinject", |p| p.a.ep.tinject(&7u64.to_le_bytes(), p.to_b, 1).expect("tinject"));
    let start = Instant::now();
    let (mut ready, mut timed_out) = (0, 0);
    loop {
        assert!(start.elapsed() < DEADLINE, "no completion through the wait fd ({ready} ready, {timed_out} timeouts)");
        p.progress();
        if let Some(pos) = p.b.done.iter().position(|c| matches!(c, Ok(c) if c.context == 30)) {
            p.b.done.remove(pos);
            break;
        }
        match p.b.ep.cq().wait(Duration::from_millis(50)).expect("wait") {
            WaitOutcome::Ready => ready += 1,
            WaitOutcome::TimedOut => timed_out += 1,
        }
    }
    println!("{provider}: completion after {ready} ready / {timed_out} timed-out waits");
    assert_eq!(u64::from_le_bytes(rbuf[..8].try_into().expect("8 bytes")), 7);
}

fn bad_input(provider: &str) {
    let Some(p) = pair(provider) else { return };
    assert!(p.av.insert(&[]).is_err(), "empty address accepted");
    assert!(p.av.insert(&[0u8; 4096]).is_err(), "oversized address accepted");
    let big = vec![0u8; p.a.ep.inject_size() + 1];
    let e = p.a.ep.tinject(&big, p.to_b, 0).expect_err("oversized inject accepted");
    assert_eq!(e.code, errno::FI_EINVAL);
    if p.info.caps().contains(Caps::RMA) {
        let mr = MemoryRegion::alloc(p.b.ep.domain(), 64, MrAccess::ALL).expect("register");
        let remote = mr.remote();
        let buf = [0u8; 16];
        // SAFETY: the post is refused before reaching libfabric (out of range).
        let e = unsafe { p.a.ep.write(&buf, None, p.to_b, &remote, 60, 1, false) }.expect_err("out-of-range RMA accepted");
        assert_eq!(e.code, errno::FI_EINVAL);
        let other = MemoryRegion::alloc(p.a.ep.domain(), 64, MrAccess::ALL).expect("register");
        // SAFETY: refused before reaching libfabric (buffer outside `other`).
        let e = unsafe { p.a.ep.tsend(&buf, Some(&other), p.to_b, 0, 1) }.expect_err("buffer outside its MR accepted");
        assert_eq!(e.code, errno::FI_EINVAL);
    }
    assert!(MemoryRegion::alloc(p.a.ep.domain(), 0, MrAccess::ALL).is_err());
    assert_eq!(RemoteRegion::from_bytes(&[1, 2, 3]), None);
    let e = weft_transport::ofi::Info::query("no-such-provider").expect_err("bogus provider");
    assert!(e.is_unavailable(), "{e}");
}

macro_rules! provider_tests {
    ($module:ident, $provider:expr) => {
        mod $module {
            #[test]
            fn tagged_sizes() {
                super::tagged_sizes($provider)
            }
            #[test]
            fn many_small_in_flight() {
                super::many_small($provider)
            }
            #[test]
            fn rma_and_atomics() {
                super::rma($provider)
            }
            #[test]
            fn truncation_is_a_typed_error() {
                super::truncation_error($provider)
            }
            #[test]
            fn cq_wait_fd() {
                super::wait_fd($provider)
            }
            #[test]
            fn bad_input_is_an_error() {
                super::bad_input($provider)
            }
        }
    };
}

provider_tests!(shm, "shm");
provider_tests!(tcp_rxm, "tcp;ofi_rxm");
provider_tests!(sockets, "sockets");

#[test]
fn shm_and_tcp_rxm_are_available() {
    ofi_common::loopback_env();
    for provider in ["shm", "tcp;ofi_rxm"] {
        let info = weft_transport::ofi::Info::query(provider)
            .unwrap_or_else(|e| panic!("{provider} must be available (run .ci/ofi-deps.sh): {e}"));
        println!("{provider}: caps {:?}, missing {:?}", info.caps(), info.missing_caps());
        assert!(info.caps().contains(Caps::TAGGED));
    }
}
