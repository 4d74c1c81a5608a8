//! Shared harness of the `ofi_*` integration tests (`mod ofi_common;` in each; a directory,
//! so cargo does not build it as a test target of its own).
#![allow(dead_code)]

use std::collections::VecDeque;
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use weft_transport::ofi::{AddressVector, CompletionError, CqEntry, CqError, Domain, Endpoint, EndpointConfig, FiAddr, Info, Post};

/// Every wait in the tests gives up (panics with a message) after this long.
pub(crate) const DEADLINE: Duration = Duration::from_secs(10);

/// Pins libfabric's IP providers to loopback. Called first by every test, before any
/// libfabric call (libfabric reads these once, at its first `fi_getinfo`).
pub(crate) fn loopback_env() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
    });
}

/// One endpoint plus the completions read from its CQ but not yet claimed.
pub(crate) struct Side {
    pub(crate) ep: Endpoint,
    pub(crate) done: VecDeque<Result<CqEntry, CompletionError>>,
}

/// Two endpoints of one domain sharing one AV, each knowing the other's `FiAddr`.
pub(crate) struct Pair {
    pub(crate) info: Info,
    pub(crate) a: Side,
    pub(crate) b: Side,
    /// `b`'s address (for posts from `a`).
    pub(crate) to_b: FiAddr,
    /// `a`'s address (for posts from `b`).
    pub(crate) to_a: FiAddr,
    pub(crate) av: Arc<AddressVector>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Which {
    A,
    B,
}

/// Opens a pair on `provider`, or prints why not and returns `None` (test skipped).
pub(crate) fn pair(provider: &str) -> Option<Pair> {
    pair_with(provider, &EndpointConfig::default())
}

pub(crate) fn pair_with(provider: &str, config: &EndpointConfig) -> Option<Pair> {
    loopback_env();
    let info = match Info::query(provider) {
        Ok(info) => info,
        Err(e) if e.is_unavailable() => {
            println!("SKIP: provider {provider:?} not available: {e}");
            return None;
        }
        Err(e) => panic!("fi_getinfo for {provider:?} failed: {e}"),
    };
    println!("{provider}: {info:?}");
    let domain = Domain::open_with_fabric(&info).expect("open fabric + domain");
    let av = AddressVector::open(&domain, 8).expect("open av");
    let a = Endpoint::open(&domain, &av, config).expect("open endpoint a");
    let b = Endpoint::open(&domain, &av, config).expect("open endpoint b");
    let to_b = av.insert(b.name()).expect("insert b");
    let to_a = av.insert(a.name()).expect("insert a");
    assert_ne!(to_a, to_b, "two endpoints got the same FiAddr");
    Some(Pair { info, a: Side { ep: a, done: VecDeque::new() }, b: Side { ep: b, done: VecDeque::new() }, to_b, to_a, av })
}

fn progress_side(side: &mut Side) {
    let mut buf = [CqEntry::default(); 16];
    loop {
        match side.ep.cq().read(&mut buf) {
            Ok(0) => return,
            Ok(n) => side.done.extend(buf[..n].iter().copied().map(Ok)),
            Err(CqError::Completion(e)) => side.done.push_back(Err(e)),
            Err(CqError::Fatal(e)) => panic!("CQ failed: {e}"),
        }
    }
}

impl Pair {
    pub(crate) fn side(&mut self, which: Which) -> &mut Side {
        match which {
            Which::A => &mut self.a,
            Which::B => &mut self.b,
        }
    }

    /// Reads both CQs once (drives both endpoints' progress).
    pub(crate) fn progress(&mut self) {
        progress_side(&mut self.a);
        progress_side(&mut self.b);
    }

    /// Waits (progressing both sides) for the completion with `ctx` on `which`.
    pub(crate) fn wait(&mut self, which: Which, ctx: u64, what: &str) -> Result<CqEntry, CompletionError> {
        let start = Instant::now();
        loop {
            let side = self.side(which);
            let pos = side.done.iter().position(|c| match c {
                Ok(c) => c.context == ctx,
                Err(e) => e.context == ctx,
            });
            if let Some(pos) = pos {
                return side.done.remove(pos).expect("position is in range");
            }
            assert!(start.elapsed() < DEADLINE, "timed out after {DEADLINE:?} waiting for {what} (ctx {ctx:#x}) on {which:?}");
            self.progress();
            std::thread::yield_now();
        }
    }

    /// Waits for a successful completion.
    pub(crate) fn wait_ok(&mut self, which: Which, ctx: u64, what: &str) -> CqEntry {
        match self.wait(which, ctx, what) {
            Ok(c) => c,
            Err(e) => panic!("{what} failed: {e:?}"),
        }
    }

    /// Retries `post` (progressing both CQs on `WouldBlock`) until it is posted; returns how
    /// many times it would have blocked.
    pub(crate) fn post_retry(&mut self, what: &str, mut post: impl FnMut(&Pair) -> Post) -> usize {
        let start = Instant::now();
        let mut blocked = 0;
        loop {
            match post(self) {
                Post::Posted => return blocked,
                Post::WouldBlock => {
                    blocked += 1;
                    assert!(start.elapsed() < DEADLINE, "{what}: still FI_EAGAIN after {DEADLINE:?} ({blocked} retries)");
                    self.progress();
                }
            }
        }
    }
}

/// Deterministic test payload.
pub(crate) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}
