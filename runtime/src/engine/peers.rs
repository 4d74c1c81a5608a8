//! Peers that are lost (died) or finished (dropped their runtime), and the rendezvous sends
//! that wait for a peer's `Fin`.

use std::sync::Arc;

use parking_lot::Mutex;
use weft_sync::Error;

use super::Engine;
use crate::loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use crate::matching::Source;
use crate::operation::Operation;

/// Most polls of one CRI (of up to `POLL_BATCH` (`frames.rs`) frames each) that [`Engine::deliver_arrived`]
/// makes before a loss is acted on: enough for every frame a peer can have in flight, few
/// enough that live peers' traffic cannot hold a loss back for long.
const DELIVER_POLLS: usize = 1024;

/// How long [`Engine::deliver_arrived`] tries, in all, to take CRI locks that other threads
/// hold before it acts on a loss without the frames behind them. A holder keeps a CRI lock
/// for one poll batch, or — while the transport's state lock of that CRI is held by a thread
/// caught inside libfabric — for the transport's bounded wait for it (0.5 s,
/// `weft_transport::ofi_provider::STUCK_AFTER`); longer than that, the holder is itself
/// caught inside libfabric, and may hold the lock for good.
const DELIVER_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Peer-loss bookkeeping (a rare path): the transport's loss epoch last handled, which
/// peers are gone, and the rendezvous sends waiting for a `Fin`, which fail with `PeerLost`
/// if their destination is lost (a `Fin` from a dead process never comes).
///
/// A peer is *gone* once it is lost (died) or finished (dropped its runtime) — the
/// transport says so by `is_alive` — **and** every frame of it that had reached this rank
/// then has been delivered into matching ([`Engine::fail_lost`]). Receives are judged by
/// `gone`, not by the transport's flag, which changes first: a receive posted in between
/// stays posted and is matched by those frames or failed with the rest.
pub(crate) struct PeerWatch {
    /// `transport.lost_epoch()` when losses were last handled.
    seen: AtomicU64,
    /// Per rank: gone (see above). Set only by `fail_lost`.
    gone: Box<[AtomicBool]>,
    /// Some rank is gone: the receive path's one load while none is.
    any_gone: AtomicBool,
    /// Every rendezvous send not finished yet, by the cookie its `Rts` carried: `(cookie,
    /// destination, request)`. The cookie is a number, never an address: a `Fin` is looked
    /// up here, so a stale, duplicated or forged one finds nothing instead of naming memory.
    pub(super) rendezvous: Mutex<Vec<(u64, u32, Arc<Operation>)>>,
    /// Next cookie (0 is never used).
    next_cookie: AtomicU64,
}

impl PeerWatch {
    /// Bookkeeping for a world of `size` ranks, none gone.
    pub(crate) fn new(size: u32) -> Self {
        PeerWatch {
            seen: AtomicU64::new(0),
            gone: (0..size).map(|_| AtomicBool::new(false)).collect(),
            any_gone: AtomicBool::new(false),
            rendezvous: Mutex::new(Vec::new()),
            next_cookie: AtomicU64::new(0),
        }
    }

    /// Whether rank `r` is gone (see [`PeerWatch`]).
    #[inline]
    fn is_gone(&self, r: u32) -> bool {
        // Acquire: pairs with the Release store in `mark_gone`, made after the rank's last
        // frames were delivered into matching.
        self.gone.get(r as usize).is_some_and(|g| g.load(Ordering::Acquire))
    }

    /// Whether some rank is gone: the receive path's one load while none is.
    #[inline]
    fn any_gone(&self) -> bool {
        // Acquire: pairs with the Release store in `mark_gone` (the flags it set before).
        self.any_gone.load(Ordering::Acquire)
    }

    /// Marks `ranks` gone, once every frame of theirs that reached this rank was delivered
    /// into matching (`fail_lost`): a receive that sees a rank gone (`any_gone`, then
    /// `is_gone`) also sees those frames, in the unexpected queue. The loom model at the
    /// bottom checks it.
    fn mark_gone(&self, ranks: &[u32]) {
        for &r in ranks {
            // Release: the frames delivered before are seen with the flag.
            self.gone[r as usize].store(true, Ordering::Release);
        }
        if !ranks.is_empty() {
            // Release: as above, for `any_gone`, the first load of a receive.
            self.any_gone.store(true, Ordering::Release);
        }
    }
}

impl Engine {
    /// Whether a rendezvous send of this rank still waits for its `Fin`.
    pub(crate) fn rendezvous_pending(&self) -> bool {
        !self.peers.rendezvous.lock().is_empty()
    }

    /// Remembers a rendezvous send until its `Fin` (or its destination's loss); returns the
    /// cookie its `Rts` carries.
    pub(crate) fn track_rendezvous(&self, dest: u32, req: &Arc<Operation>) -> u64 {
        let cookie = self.peers.next_cookie.fetch_add(1, Ordering::Relaxed) + 1;
        self.peers.rendezvous.lock().push((cookie, dest, req.clone()));
        cookie
    }

    /// Forgets the rendezvous send of `cookie` — only if its destination is `from`, when
    /// given (a `Fin` must come from the rank the `Rts` went to) — and returns its request
    /// (whoever removes it completes it).
    pub(crate) fn untrack_rendezvous(&self, cookie: u64, from: Option<u32>) -> Option<Arc<Operation>> {
        let mut list = self.peers.rendezvous.lock();
        let i = list.iter().position(|&(c, d, _)| c == cookie && from.map_or(true, |f| f == d))?;
        Some(list.swap_remove(i).2)
    }

    /// When the transport reports newly lost (or finished) peers: delivers the frames that
    /// reached this rank, then fails every posted receive that can no longer match and every
    /// rendezvous send to a gone rank with `PeerLost`. One load and a compare when nothing
    /// changed.
    ///
    /// Everything a finished peer sent is delivered first: it finished after its frames left
    /// it, and they are in this rank's queues by the time the finish is known (the
    /// bootstrap's `FINISHED` comes through the key-value server, after the peer's `BYE`).
    /// A peer that died may have had frames still on their way, which are not waited for
    /// (as with MPI, delivery of messages around a failure is not guaranteed).
    pub(crate) fn handle_lost(&self) -> usize {
        let epoch = self.transport.lost_epoch();
        let seen = self.peers.seen.load(Ordering::Relaxed);
        if epoch == seen {
            return 0;
        }
        self.fail_lost(seen, epoch)
    }

    /// Whether the transport reported a lost (or finished) peer that no pass has handled
    /// yet ([`handle_lost`](Self::handle_lost) not run since): work for the rank's courier.
    #[inline]
    pub(crate) fn loss_unhandled(&self) -> bool {
        self.transport.lost_epoch() != self.peers.seen.load(Ordering::Relaxed)
    }

    /// Which ranks a receive can still be matched by: `(alive(r), any peer alive, the first
    /// lost rank)` — what [`fail_lost`](Self::fail_lost) fails receives by, and what
    /// `Source::Any` reports as its lost rank.
    fn liveness(&self) -> (impl Fn(u32) -> bool + '_, bool, u32) {
        let (me, size) = (self.transport.rank(), self.transport.size());
        let alive = move |r: u32| r == me || !self.peers.is_gone(r);
        let first_lost = (0..size).find(|&r| !alive(r)).unwrap_or(me);
        let any_alive = (0..size).any(|r| r != me && alive(r)) || size == 1;
        (alive, any_alive, first_lost)
    }

    /// The rank a receive from `source` would wait for in vain — `source` itself once it is
    /// lost, or for `Source::Any` the first lost rank once no peer is left — or `None` while
    /// a live peer can still match it. One load while no peer was ever lost.
    ///
    /// A receive posted after [`handle_lost`](Self::handle_lost) ran for a loss is not
    /// failed by it: `irecv` asks this under the matching lock, after looking in the
    /// unexpected queue (what the peer sent before it went is delivered there before the
    /// rank counts as gone). A loss handled after that check finds the posted receive
    /// (`fail_lost` marks the rank gone before it visits the state under the same lock).
    #[inline]
    pub(crate) fn lost_source(&self, source: Source) -> Option<u32> {
        if !self.peers.any_gone() {
            return None;
        }
        self.lost_source_slow(source)
    }

    /// [`lost_source`](Self::lost_source) once some peer was lost: one load for a named
    /// source, and for `Source::Any` a scan that stops at the first live peer (every
    /// receive after a loss pays it, so not the whole of [`liveness`](Self::liveness)).
    #[cold]
    fn lost_source_slow(&self, source: Source) -> Option<u32> {
        let me = self.transport.rank();
        match source {
            Source::Rank(r) => (r != me && self.peers.is_gone(r)).then_some(r),
            Source::Any => {
                let size = self.transport.size();
                if size == 1 || (0..size).any(|r| r != me && !self.peers.is_gone(r)) {
                    return None;
                }
                Some(self.liveness().2)
            }
        }
    }

    #[cold]
    fn fail_lost(&self, seen: u64, epoch: u64) -> usize {
        // One thread handles each change.
        if self.peers.seen.compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Relaxed).is_err() {
            return 0;
        }
        // The ranks the transport has given up on: read before the delivery below, so that
        // every frame of theirs that reached this rank is delivered by it. (One lost during
        // it changes the epoch again and is handled by the next pass.)
        let me = self.transport.rank();
        let newly: Vec<u32> =
            (0..self.transport.size()).filter(|&r| r != me && !self.transport.is_alive(r) && !self.peers.is_gone(r)).collect();
        let delivered = self.deliver_arrived();
        self.peers.mark_gone(&newly);
        let (alive, any_alive, first_lost) = self.liveness();
        let mut failed = Vec::new();
        {
            let _gate = self.contexts.gate.read();
            for comm in self.installed() {
                // Every state, again if the layout moved on meanwhile (receives may have
                // moved from a state not visited yet).
                self.any_matching_state(comm, |m| {
                    m.fail_lost(&alive, any_alive, &mut failed);
                    false
                });
            }
        }
        let n = failed.len();
        for (req, source) in failed {
            let rank = match source {
                Source::Rank(r) => r,
                Source::Any => first_lost,
            };
            req.cell.complete(Err(Error::PeerLost { rank }));
        }
        let sends: Vec<(u64, u32, Arc<Operation>)> = {
            let mut list = self.peers.rendezvous.lock();
            let (dead, live): (Vec<_>, Vec<_>) = list.drain(..).partition(|(_, d, _)| !alive(*d));
            *list = live;
            dead
        };
        let m = sends.len();
        for (_, dest, req) in sends {
            // Untracked: a late `Fin` finds nothing.
            self.transport.deregister(req.key.load(Ordering::Relaxed));
            req.cell.complete(Err(Error::PeerLost { rank: dest }));
            req.orphan.lock().take();
        }
        tracing::debug!(
            rank = me,
            lost = ?newly,
            frames_delivered = delivered,
            receives_failed = n,
            sends_failed = m,
            "peers lost or finished: acted on"
        );
        delivered + n + m
    }

    /// Delivers every frame that has reached this rank into matching, CRI by CRI under the
    /// CRI's lock, before a loss is acted on; returns how many. Each CRI is polled until two
    /// polls in a row find nothing — the first empty poll lets the transport re-post the
    /// receive buffers a provider may be holding frames back for, the second finds the
    /// queue empty with every buffer posted — or [`DELIVER_POLLS`] polls were made.
    ///
    /// Holding each CRI lock in turn is also a barrier: a thread that took frames from a
    /// CRI before the loss was learnt delivers them under that lock, so they are in matching
    /// once this has held it. It waits for the locks (even on paths that otherwise only
    /// try them, such as an idle pool worker's): a loss is rare, and a holder keeps a CRI
    /// lock for one poll batch. Never called with a CRI lock held (`flush_deferred` runs
    /// outside them), and always inside a pass (`deferred.rs`): the callbacks of the
    /// receives it completes run once the pass let go of the CRI locks.
    ///
    /// Bounded whatever the transport does: the locks are tried until [`DELIVER_WAIT`] has
    /// passed (then once each), never waited for — a thread caught inside libfabric (a
    /// lock a dead `shm` peer held, see `weft_transport::ofi_provider`) holds its CRI lock
    /// for good, and the loss must still be acted on: frames behind a lock not taken are
    /// not delivered first (as frames still on their way from a dead peer are not). A poll
    /// of a CRI whose transport state is held that way finds nothing after a bounded wait.
    #[cold]
    fn deliver_arrived(&self) -> usize {
        debug_assert!(crate::deferred::inside_pass(), "frames delivered outside a pass: their callbacks would run under the CRI locks");
        let deadline = std::time::Instant::now() + DELIVER_WAIT;
        let mut total = 0;
        for k in 0..self.cris.len() {
            let (mut polls, mut empty) = (0, 0);
            while polls < DELIVER_POLLS && empty < 2 {
                let Some(n) = self.cris[k].lock.try_low(|c| self.progress_cri(k, c)) else {
                    if std::time::Instant::now() > deadline {
                        break;
                    }
                    std::thread::yield_now();
                    continue;
                };
                polls += 1;
                total += n;
                empty = if n == 0 { empty + 1 } else { 0 };
            }
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use weft_transport::{Frame, FrameKind, Header, Payload};

    use crate::{Error, ProgressMode, Runtime};

    /// Runs `scenario` on a thread of its own and returns its result, failing with `what`
    /// if it takes longer than `secs` (the stuck thread is left behind).
    fn within<T: Send + 'static>(secs: u64, what: &str, scenario: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        let t = std::thread::spawn(move || {
            let _ = tx.send(scenario());
        });
        match rx.recv_timeout(Duration::from_secs(secs)) {
            Ok(v) => v,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("hang: {what} (not done after {secs} s)"),
            Err(mpsc::RecvTimeoutError::Disconnected) => match t.join() {
                Err(p) => std::panic::resume_unwind(p),
                Ok(()) => unreachable!("the scenario ended without a result or a panic"),
            },
        }
    }

    const MODES: [ProgressMode; 3] = [ProgressMode::Concurrent, ProgressMode::Owner, ProgressMode::Global];

    /// A loss is acted on while another thread keeps a CRI lock for good (as a thread caught
    /// inside libfabric while it polls that CRI does): the receive that only the lost peer
    /// could match fails with `PeerLost` within about `DELIVER_WAIT`, in every progress
    /// mode, instead of waiting for that lock for ever.
    #[test]
    fn a_loss_is_acted_on_while_a_thread_keeps_a_cri_lock() {
        for mode in MODES {
            let rts = Runtime::builder().env(false).progress(mode).cris(1).build_local(2).unwrap();
            let (res, took) = within(20, &format!("{mode:?}: a receive from a lost peer while a CRI lock is kept"), move || {
                let b = rts[1].world();
                let recv = b.irecv(Vec::<u8>::with_capacity(8), 0u32, 5).unwrap();
                let (held_tx, held) = mpsc::channel();
                let (release, wait) = mpsc::channel::<()>();
                let engine = rts[1].engine.clone();
                let holder = std::thread::spawn(move || {
                    engine.cris[0].lock.high(|_| {
                        let _ = held_tx.send(());
                        let _ = wait.recv();
                    })
                });
                held.recv().unwrap();
                let t0 = Instant::now();
                // Rank 0 finishes: what only it could match fails.
                rts[0].engine.transport.close();
                let res = recv.wait().map(|_| ());
                let took = t0.elapsed();
                drop(release);
                holder.join().unwrap();
                (res, took)
            });
            assert_eq!(res, Err(Error::PeerLost { rank: 0 }), "{mode:?}");
            assert!(took < Duration::from_secs(10), "{mode:?}: took {took:?}");
        }
    }

    /// A receive completed by a thread's last check before it sleeps (`work_before_sleep`:
    /// frames deferred, so it flushes them, and a peer was lost meanwhile, so it delivers
    /// the frames that arrived first, here one from a live peer that came while another
    /// thread held the CRI's lock) runs its inline callback after the check let go of its
    /// locks, so the callback may post on that CRI, in every progress mode; run under the
    /// CRI's lock, it waited for good for the lock its own thread held.
    #[test]
    fn a_callback_completed_by_the_check_before_sleep_may_post() {
        for mode in MODES {
            let rts = Runtime::builder().env(false).progress(mode).cris(1).inbox_capacity(2).build_local(3).unwrap();
            let (engine, seen) = (rts[1].engine.clone(), rts[1].engine.transport.lost_epoch());
            // No courier: the sleeping thread's check is what handles the loss.
            engine.courier.stop();
            let b = rts[1].world().clone();
            let cr = rts[1].continuation_request();
            let (tx, posted) = mpsc::channel();
            let mut r = b.irecv(Vec::<u8>::with_capacity(1), 2u32, 1).unwrap();
            let c = b.clone();
            cr.attach(&mut r, crate::Invoke::Inline, move |res| {
                // A send on the CRI whose frame completed the receive (to this rank itself).
                let sent = c.isend(res.map(|(buf, _)| buf).unwrap_or_default(), 1, 2).map(drop);
                let _ = tx.send(sent);
            })
            .unwrap();
            // Rank 0's inbox full (nobody progresses rank 0): rank 1's third frame is deferred.
            let sends: Vec<_> = (0..3u8).map(|i| b.isend(vec![i], 0, 3).unwrap()).collect();
            assert!(engine.outbox.pending.load(crate::loom::sync::atomic::Ordering::Acquire), "{mode:?}: nothing deferred");
            let (held_tx, held) = mpsc::channel();
            let (release, wait) = mpsc::channel::<()>();
            let e = engine.clone();
            let holder = std::thread::spawn(move || {
                e.cris[0].lock.high(|_| {
                    let _ = held_tx.send(());
                    let _ = wait.recv();
                })
            });
            held.recv().unwrap();
            rts[0].engine.transport.close();
            let e = engine.clone();
            let sleeper = std::thread::spawn(move || e.work_before_sleep());
            // The check has taken the loss and waits for the CRI's lock: rank 2's frame
            // arrives behind it, then the lock is let go.
            let deadline = Instant::now() + Duration::from_secs(5);
            while engine.peers.seen.load(crate::loom::sync::atomic::Ordering::Acquire) == seen {
                assert!(Instant::now() < deadline, "{mode:?}: the check did not take the loss");
                std::thread::yield_now();
            }
            rts[2].world().send(vec![9u8], 1, 1).unwrap();
            drop(release);
            holder.join().unwrap();
            let got = posted.recv_timeout(Duration::from_secs(10));
            if got.is_err() {
                // The check is stuck: leave the ranks behind rather than join it.
                std::mem::forget((rts, cr, sends, sleeper, engine));
                panic!("{mode:?}: the callback did not post (it waited for its own thread's lock)");
            }
            assert!(got.unwrap().is_ok(), "{mode:?}: the callback's send");
            sleeper.join().unwrap();
            drop(sends);
        }
    }

    /// Two `shm` ranks of one CRI in `mode`; `None` (said on stderr) where shm cannot open.
    #[cfg(feature = "ofi")]
    fn shm_pair(mode: ProgressMode) -> Option<Vec<Runtime>> {
        match Runtime::builder().env(false).provider(crate::Provider::Shm).progress(mode).cris(1).build_local(2) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("skipped: shm not available here ({e})");
                None
            }
        }
    }

    /// A CRI wedged the way a dead `shm` peer wedges one: the peer held the spin lock of
    /// this rank's CRI region when it was killed, so the next thread that progresses the
    /// CRI — the waiter itself, or the transport's watcher — is caught spinning inside
    /// `fi_cq_read`. Once the peer is lost (a few milliseconds into the wait), the receive
    /// and the rendezvous send that need it fail with `PeerLost` within seconds, in every
    /// progress mode, and the runtimes drop (the waiter used to spin for ever).
    #[cfg(feature = "ofi")]
    #[test]
    fn a_loss_is_acted_on_when_a_dead_peer_wedged_a_cri() {
        for mode in MODES {
            let Some(rts) = shm_pair(mode) else { return };
            let res = within(30, &format!("{mode:?}: requests on a lost peer that wedged a CRI"), move || {
                let b = rts[1].world();
                let recv = b.irecv(Vec::<u8>::with_capacity(8), 0u32, 5).unwrap();
                let send = b.isend(vec![1u8; 100_000], 0, 6).unwrap();
                let weft_transport::Transport::Ofi(t) = &rts[1].engine.transport else { unreachable!("an shm runtime") };
                if !t.wedge_cri_as_a_dead_peer(0) {
                    return None;
                }
                let t0 = Instant::now();
                let notifier = t.loss_notifier();
                let monitor = std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    notifier.died(0);
                });
                let (recv, send) = (recv.wait().map(|_| ()), send.wait().map(|_| ()));
                let took = t0.elapsed();
                monitor.join().unwrap();
                drop(rts);
                Some((recv, send, took))
            });
            let Some((recv, send, took)) = res else {
                eprintln!("skipped: this libfabric's shm region layout is not known to weft");
                return;
            };
            assert_eq!(recv, Err(Error::PeerLost { rank: 0 }), "{mode:?}: the receive");
            assert_eq!(send, Err(Error::PeerLost { rank: 0 }), "{mode:?}: the rendezvous send");
            assert!(took < Duration::from_secs(10), "{mode:?}: took {took:?}");
        }
    }

    /// A loss is acted on while a thread holds a libfabric CRI's transport state as one
    /// caught inside `fi_cq_read` does (spinning on a lock a dead `shm` peer held): the
    /// receive and the rendezvous send that need the lost peer fail with `PeerLost` within
    /// seconds, in every progress mode (they used to wait for that state for ever), and the
    /// runtimes still drop.
    #[cfg(feature = "ofi")]
    #[test]
    fn a_loss_is_acted_on_while_a_cri_is_stuck_in_libfabric() {
        for mode in MODES {
            let Some(rts) = shm_pair(mode) else { return };
            let (recv, send, took) = within(20, &format!("{mode:?}: requests on a lost peer while a CRI is stuck"), move || {
                let b = rts[1].world();
                let recv = b.irecv(Vec::<u8>::with_capacity(8), 0u32, 5).unwrap();
                // Above the eager threshold: a rendezvous send, waiting for rank 0's `Fin`.
                let send = b.isend(vec![1u8; 100_000], 0, 6).unwrap();
                let weft_transport::Transport::Ofi(t) = &rts[1].engine.transport else { unreachable!("an shm runtime") };
                let hold = t.hold_cri_state(0);
                let t0 = Instant::now();
                t.mark_lost(0);
                let (recv, send) = (recv.wait().map(|_| ()), send.wait().map(|_| ()));
                let took = t0.elapsed();
                drop(hold);
                drop(rts);
                (recv, send, took)
            });
            assert_eq!(recv, Err(Error::PeerLost { rank: 0 }), "{mode:?}: the receive");
            assert_eq!(send, Err(Error::PeerLost { rank: 0 }), "{mode:?}: the rendezvous send");
            assert!(took < Duration::from_secs(10), "{mode:?}: took {took:?}");
        }
    }

    fn fin(cookie: u64, source: u32) -> Frame {
        let header = Header {
            kind: FrameKind::Fin,
            src_cri: 0,
            context: 0,
            source,
            tag: 3,
            seq: 0,
            gseq: 0,
            chan: 0,
            len: 0,
            cookie,
            key: 0,
            addr: 0,
        };
        Frame { header, payload: Payload::Empty }
    }

    /// A `Fin` names its send by a cookie that is looked up, never dereferenced: unknown
    /// cookies and a `Fin` from the wrong rank are ignored, and the real one still
    /// completes the send.
    #[test]
    fn forged_or_stale_fin_is_ignored() {
        let rts = Runtime::builder().env(false).eager_threshold(1024).build_local(2).unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        let engine = &rts[0].engine;
        engine.handle_fin(fin(0, 1));
        engine.handle_fin(fin(u64::MAX, 1));
        let send = a.isend(vec![7u8; 100_000], 1, 3).unwrap();
        let cookie = engine.peers.rendezvous.lock()[0].0;
        // Right cookie, wrong rank: not the receiver's answer.
        engine.handle_fin(fin(cookie, 0));
        assert!(!send.is_complete(), "a Fin from the wrong rank completed the send");
        let (got, st) = b.recv(Vec::<u8>::with_capacity(100_000), 0u32, 3).unwrap();
        assert_eq!((got.len(), st.bytes), (100_000, 100_000));
        assert!(got.iter().all(|&x| x == 7));
        let (_, st) = send.wait().unwrap();
        assert_eq!(st.bytes, 100_000);
        // A duplicate of the real Fin after completion finds nothing.
        engine.handle_fin(fin(cookie, 1));
        assert!(engine.peers.rendezvous.lock().is_empty());
    }
}

#[cfg(all(test, loom))]
mod model {
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    use super::PeerWatch;

    /// Ranks 1 and 2 of three are lost. One thread does what `fail_lost` does: delivers
    /// each lost rank's last frame (a write into a plain cell, standing for the unexpected
    /// queue), then marks both gone. Another receives as `lost_source` judges: once it sees
    /// a rank gone it reads that rank's frame, which must be there — and loom fails the
    /// model on the read if it is not ordered after the write (a data race).
    #[test]
    fn a_receive_that_sees_a_loss_sees_the_frames_delivered_before() {
        loom::model(|| {
            let watch = Arc::new(PeerWatch::new(3));
            let queues: Arc<[UnsafeCell<u32>; 2]> = Arc::new([UnsafeCell::new(0), UnsafeCell::new(0)]);
            let (w, q) = (watch.clone(), queues.clone());
            let loss = thread::spawn(move || {
                for (r, cell) in [1u32, 2].into_iter().zip(q.iter()) {
                    // SAFETY: the receiving thread reads a cell only after the flag below.
                    cell.with_mut(|f| unsafe { *f = r });
                }
                w.mark_gone(&[1, 2]);
            });
            if watch.any_gone() {
                for (r, cell) in [1u32, 2].into_iter().zip(queues.iter()) {
                    if watch.is_gone(r) {
                        // SAFETY: loom checks that the write above happened before this read.
                        assert_eq!(cell.with(|f| unsafe { *f }), r, "rank {r} gone, its frame not delivered");
                    }
                }
            }
            loss.join().unwrap();
            assert!(watch.any_gone() && watch.is_gone(1) && watch.is_gone(2));
        });
    }
}
