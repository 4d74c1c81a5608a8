//! The courier: the rank's own thread that sends the frames full inboxes refused when no
//! thread of the rank makes progress.
//!
//! A frame a full destination refused waits in the rank's deferred queue
//! (`Engine::defer`), and any progress pass of the rank sends it once the destination has
//! room (`Engine::flush_deferred`). A rank whose threads all do something else meanwhile —
//! compute, sleep, wait on a `std::sync::Barrier` — makes no pass; a deferred `Fin` would
//! then hold the peer's rendezvous send forever, and a deferred eager frame the peer's
//! receive. The courier makes those passes instead, so nobody has to poll for the queued
//! frames:
//!
//! * **Started lazily**, by the rank's first deferral (`Engine::summon_courier`): a runtime
//!   that never defers a frame starts no thread, and `build_local(n)` starts none up front.
//!   The start runs where that deferral happens, which may be under a CRI lock (a `Fin`
//!   deferred while matching): one thread spawn per runtime, the only time it blocks.
//! * **Waits parked while there is work** ([`Engine::courier_work`]): it registers for the
//!   next ring of room at the rank's doorbell (`Doorbell::register_room`: rung by the
//!   embedded receiver that drains a full inbox, by the libfabric watcher after refusals,
//!   and on a lost peer), makes one pass (register -> retry -> park, so a ring between the
//!   two is not lost), and parks until the ring or a timeout that doubles from [`MIN_NAP`]
//!   to [`MAX_NAP`] while passes send nothing: a missed ring costs latency, never a hang.
//! * **Parks until the next deferral when there is none** (the thread stays; parked, it
//!   costs nothing): `summon_courier` unparks it. Keeping it is simpler than exiting and
//!   restarting (no race between an exit and a deferral) and costs one idle thread per rank
//!   that ever deferred.
//! * **One pass** is the rare-events pass of progress, `Engine::flush_deferred` (deferred
//!   frames in order per destination, newly lost peers), through the same try paths an idle
//!   pool worker uses: the deferred queue by try-lock (another thread flushing is as
//!   good), and in `Global` mode inside the progress lock's try path (Algorithm 1 keeps
//!   every send inside its critical section). A newly lost peer is handled as in every
//!   pass (`deliver_arrived` waits for each CRI lock in turn, held by others for one poll
//!   batch at most). It runs no user code: completing a request only wakes its waiter or
//!   queues its sync object's event.
//! * **Does not keep the rank alive**: it holds a `Weak<Engine>`, upgraded for one pass at a
//!   time, never while parked. Like the executor's pool it lives as long as the `Runtime`
//!   handles (communicators and requests keep the rank's state, not its threads): the last
//!   handle's drop stops it and joins it (`Courier::stop`, from the runtime's `ExecGuard`),
//!   while that handle still holds the state, so the state is never dropped on the courier.
//!   A pass is bounded (try-locks, one flush), and so is the join.
//!
//! What counts as work is [`Engine::courier_work`], one small function: deferred frames,
//! the rendezvous reads in flight once one of them fills a receive its owner dropped
//! (`reads.rs`: nobody waits for it, and its sender waits for the `Fin` the read's end
//! sends), and a lost peer no pass has handled yet (a deferred frame to it fails, and the
//! frames it sent are still to be delivered). Any other work that only needs a pass of
//! `flush_deferred` to finish (operations it drives in flight) belongs there too, with
//! `summon_courier` called when it starts.

use std::sync::{Arc, OnceLock, Weak};
use std::task::Waker;
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::ProgressMode;
use crate::engine::Engine;
use crate::executor::Unpark;
use crate::loom::sync::atomic::{AtomicBool, Ordering};

/// First timeout of a park while frames wait: a pass that sent nothing waits for the next
/// ring of room, or this long, whichever comes first.
const MIN_NAP: Duration = Duration::from_millis(1);

/// Longest timeout of a park while frames wait (the doubling stops here): the latest a
/// courier retries after a ring of room it missed.
const MAX_NAP: Duration = Duration::from_millis(50);

/// The courier of one rank (a field of `Engine`): its thread, once started.
pub(crate) struct Courier {
    /// The rank's state, for the thread (never upgraded here).
    engine: Weak<Engine>,
    /// The thread, once the first deferral started it; `None` inside if it could not start
    /// or the runtime stopped before it did (no thread will start then).
    thread: OnceLock<Option<Thread>>,
    /// The thread's handle, taken and joined by `stop`.
    handle: Mutex<Option<JoinHandle<()>>>,
    /// Set by `stop`: the thread exits at its next look.
    stopping: AtomicBool,
}

impl Courier {
    /// The courier of the rank whose state `engine` will name; nothing starts yet.
    pub(crate) fn new(engine: Weak<Engine>) -> Self {
        Courier { engine, thread: OnceLock::new(), handle: Mutex::new(None), stopping: AtomicBool::new(false) }
    }

    /// Whether the thread has started (and not failed to).
    #[cfg(test)]
    pub(crate) fn is_started(&self) -> bool {
        self.thread.get().is_some_and(Option::is_some)
    }

    /// Starts the thread at the first call; wakes it at every call. Called after the work
    /// is published (`Engine::courier_work` sees it): a thread that looked before parks
    /// with this call's unpark pending and looks again at once.
    pub(crate) fn summon(&self, rank: u32) {
        let thread = self.thread.get_or_init(|| self.start(rank));
        if let Some(t) = thread {
            t.unpark();
        }
    }

    #[cold]
    fn start(&self, rank: u32) -> Option<Thread> {
        // Acquire: pairs with `stop`; no thread starts once the runtime stopped.
        if self.stopping.load(Ordering::Acquire) {
            return None;
        }
        let engine = self.engine.clone();
        tracing::debug!(rank, "courier starts: frames wait behind a full inbox");
        match std::thread::Builder::new().name(format!("weft-courier-{rank}")).spawn(move || run(&engine)) {
            Ok(h) => {
                let t = h.thread().clone();
                *self.handle.lock() = Some(h);
                Some(t)
            }
            Err(e) => {
                // Out of threads: deferred frames go out with the rank's own progress, as
                // they do between the courier's passes.
                tracing::warn!("weft: could not start the courier thread of rank {rank}: {e}");
                None
            }
        }
    }

    /// Stops the thread and joins it (the last `Runtime` handle dropped, or the rank's state
    /// is dropped): bounded by one pass. No thread starts afterwards. Called on the courier
    /// itself (only if its own reference to the state were the last), it does not join.
    pub(crate) fn stop(&self) {
        // Release: pairs with the loads in `start` and the thread's loop.
        self.stopping.store(true, Ordering::Release);
        // Waits for a start in progress, or makes sure none comes.
        let Some(thread) = self.thread.get_or_init(|| None) else { return };
        thread.unpark();
        let handle = self.handle.lock().take();
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }

    fn is_stopping(&self) -> bool {
        // Acquire: pairs with `stop`.
        self.stopping.load(Ordering::Acquire)
    }
}

/// The courier thread's loop (see the module docs).
fn run(engine: &Weak<Engine>) {
    // One waker for every registration: the doorbell keeps it once (`will_wake`).
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut nap = MIN_NAP;
    loop {
        let Some(s) = engine.upgrade() else { return };
        if s.courier.is_stopping() {
            return;
        }
        if !s.courier_work() {
            drop(s);
            // Until the next deferral (or the stop) unparks us; a spurious wake-up looks
            // again.
            std::thread::park();
            nap = MIN_NAP;
            continue;
        }
        // Register, then retry: room rung after the registration wakes the park below;
        // room that came before it is found by this pass.
        s.transport.doorbell().register_room(&waker);
        let sent = s.courier_pass();
        drop(s);
        if sent > 0 {
            nap = MIN_NAP;
        }
        std::thread::park_timeout(nap);
        if sent == 0 {
            nap = (nap * 2).min(MAX_NAP);
        }
    }
}

impl Engine {
    /// Whether the rank has work that only a progress pass finishes and that its courier
    /// does when no thread of the rank makes one: frames deferred behind full inboxes,
    /// rendezvous reads whose receives were dropped (their `Fin`s hold the senders), and a
    /// lost peer no pass has handled yet. The last matters where a deferred frame's send
    /// fails because its destination is lost: the pass that sent it may have looked for
    /// losses just before the loss was counted, and without it, the courier would park with
    /// the frames that peer sent undelivered and the receives that needed it unfailed. The
    /// loss rings the doorbell after it is counted, which wakes the courier registered for
    /// room before that pass.
    #[inline]
    pub(crate) fn courier_work(&self) -> bool {
        // Acquire: pairs with the store in `defer` (the queue behind the flag).
        self.outbox.pending.load(Ordering::Acquire) || self.reads_unattended() || self.loss_unhandled()
    }

    /// Starts the rank's courier at the first call and wakes it (see the module docs); call
    /// it after publishing the work `courier_work` looks for, holding no lock a pass takes
    /// (the deferred queue's).
    pub(crate) fn summon_courier(&self) {
        self.courier.summon(self.transport.rank());
    }

    /// One pass of the courier: `flush_deferred` through the try paths (module docs).
    /// Returns how many frames went out or requests failed; 0 if the pass could not run.
    /// The callbacks it completes (a loss delivers the frames that arrived) run after its
    /// locks are released (`deferred.rs`).
    fn courier_pass(&self) -> usize {
        crate::deferred::pass(|| match self.config.progress {
            ProgressMode::Global => self
                .progress_lock
                .try_low(|_| {
                    let n = self.flush_deferred();
                    (n, n > 0)
                })
                .unwrap_or(0),
            ProgressMode::Owner | ProgressMode::Concurrent => self.flush_deferred(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use crate::Runtime;

    /// No courier starts before a rank defers a frame — not for a world of many ranks, nor
    /// for traffic that never fills an inbox; the first deferral starts the deferring rank's
    /// alone, which sends the frames without the sender's progress; dropping the runtime
    /// stops it and frees the rank's state (the courier keeps no reference to it).
    #[test]
    fn started_by_the_first_deferral_and_stopped_with_the_runtime() {
        let many = Runtime::builder().env(false).cris(1).inbox_capacity(4).build_local(512).unwrap();
        assert!(many.iter().all(|rt| !rt.engine.courier.is_started()), "a courier started up front");
        drop(many);

        let rts = Runtime::builder().env(false).cris(1).inbox_capacity(4).build_local(2).unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        a.send(vec![1u8], 1, 1).unwrap();
        assert_eq!(b.recv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap().0, vec![1]);
        assert!(!rts[0].engine.courier.is_started(), "started without a deferral");

        let mut sends: Vec<_> = (0..12u8).map(|i| a.isend(vec![i], 1, 2).unwrap()).collect();
        assert!(rts[0].engine.courier.is_started(), "the deferral started no courier");
        assert!(!rts[1].engine.courier.is_started(), "a rank that deferred nothing has a courier");
        // Only rank 1 is driven: the deferred frames are the courier's to send.
        let deadline = Instant::now() + Duration::from_secs(10);
        for i in 0..12u8 {
            let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 2).unwrap();
            while !r.test() {
                assert!(Instant::now() < deadline, "deferred frame {i} not sent within 10 s");
            }
            assert_eq!(r.take().unwrap().unwrap().0, vec![i]);
        }
        crate::wait_all(&mut sends).unwrap();
        drop(sends);

        let state = Arc::downgrade(&rts[0].engine);
        drop(rts);
        assert!(state.upgrade().is_none(), "the rank's state outlived its runtime");
    }

    /// A lost peer that no pass has handled is the courier's work, until a pass handles it
    /// (delivering what the peer sent, failing what needed it). A courier whose deferred
    /// frame failed because its destination was lost, in a pass that had looked for losses
    /// just before the loss was counted, otherwise parked for good with the loss unhandled:
    /// the receive of the frame the lost peer had sent never completed.
    #[test]
    fn a_loss_no_pass_handled_is_the_couriers_work() {
        let rts = Runtime::builder().env(false).cris(1).build_local(3).unwrap();
        let (a, b) = (rts[0].world(), rts[1].world());
        let mut r = b.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
        a.send(vec![7u8], 1, 1).unwrap();
        assert!(!rts[1].engine.courier_work(), "work without a deferral or a loss");
        rts[0].engine.transport.close();
        assert!(rts[1].engine.courier_work(), "a loss no pass handled is not the courier's work");
        assert!(rts[2].engine.courier_work(), "every rank that saw the loss has it to handle");
        // The pass the courier makes: what the lost peer sent is delivered.
        crate::deferred::pass(|| rts[1].engine.flush_deferred());
        assert!(!rts[1].engine.courier_work(), "the handled loss is still work");
        assert!(r.test(), "the frame the lost peer sent was not delivered by the pass");
        assert_eq!(r.take().unwrap().unwrap().0, vec![7]);
    }
}
