//! How a distributed lock waits: one protocol, written as `async` code, serves both the
//! blocking calls (`lock`, `read`, `write`) and the async ones (`lock_async`, ...).
//!
//! - [`block_on`] runs a protocol on the calling thread; while it runs, [`Backoff`] waits by
//!   spinning, yielding and sleeping the thread, as a blocking lock does.
//! - Polled by any executor (weft's pool, tokio), [`Backoff`] yields the task a few times,
//!   then parks it on a timer ([`Sleep`]) that one shared thread fires: the thread the task
//!   ran on is free meanwhile (other tasks run, progress goes on), and each wake-up polls the
//!   lock word once more with a one-sided operation.
//! - [`Armed`] waits for words of a window that a peer's write changes (a queue node's
//!   STATUS or NEXT, a reader counter): after a few polls it parks (the thread in
//!   [`block_on`], the task under an executor) until a write to one of the words wakes it,
//!   where the transport signals writes (the embedded provider). Elsewhere (libfabric) it
//!   parks on a *wake frame* ([`Wakes`]): the rank that changed the word sends the waiting
//!   rank an empty message on the lock's own communicator after its change, and the waiter
//!   parks on a receive of it, posted before its check (a task also checks the word every
//!   [`WAKE_CHECK`], a thread every [`WAKE_ALARM`]); the tasks of a rank waiting on one
//!   watched word park on one leader's receive ([`Relay`]); with more than 64 ranks the
//!   words other ranks' atomics change are polled with [`Backoff`]. While tasks are parked
//!   on a queue lock's hand-off frames, a thread of the rank ([`StandIn`]) waits as a
//!   blocked thread does, so the frame's delivery wakes the task whatever executor runs it;
//!   it ends with the rank's last lock, or when the rank's runtime is dropped (a lock
//!   leaked with `mem::forget` keeps no thread).
//! - [`LocalLock`] orders the threads and tasks of one rank that share its queue nodes:
//!   waiters are parked (tasks) or park their thread, and are woken by the release.

use std::cell::Cell;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use event_listener::{Event, EventListener};
use weft_sync::{Counted, SignalListener, Step, SyncObject};

use crate::comm::Communicator;
use crate::matching::Source;
use crate::request::Request;
use crate::rma::{Op, Window};

/// The longest a waiting rank sleeps between two polls.
pub const MAX_SLEEP: Duration = Duration::from_micros(100);

/// The longest a task parked on a wake frame waits before it checks its word
/// again: its safety net, should the rank's progress that completes the receive be late,
/// or the frame never come (its sender lost after its write: the write itself is complete
/// before the frame is sent, so the check finds it). A loss of a rank ends the park at
/// once (the transport rings the rank's doorbell).
pub const WAKE_CHECK: Duration = Duration::from_millis(10);

/// The longest a thread parked on a wake frame waits before it checks its word again
/// (its alarm): what bounds its wait where the frame never comes (its sender lost after
/// the write, which the check then finds; or a rank lost, or one that ended its part of
/// the lock, which the check reports). It waits as a blocked receive does, which a loss
/// ends only once no peer is left. A waiter parked on a word's signal (the embedded
/// provider) checks again after this long too.
pub const WAKE_ALARM: Duration = Duration::from_millis(100);

/// Polls of a word ([`Armed`]) before the waiter parks on the word's signal (the first
/// ones of [`Backoff`]: spins on a thread, yields of a task).
const SPIN_POLLS: u32 = 8;

thread_local! {
    /// Whether this thread runs a protocol in [`block_on`] (waits sleep the thread).
    static BLOCKING: Cell<bool> = const { Cell::new(false) };
    /// [`Backoff`] sleeps begun on this thread, and parks ([`Armed`]) on it.
    static WAITS: Cell<Waits> = const { Cell::new(Waits { sleeps: 0, parks: 0, wakes: 0, checks: 0, frames: 0, passes: 0, delivered: 0 }) };
    /// The earliest [`Sleep`] the protocol in [`block_on`] waits for in its current poll:
    /// the thread parks no longer (a thread's sleep needs no timer thread).
    static WAKE_AT: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// How the waits of the distributed locks on one thread went: [`Backoff`] sleeps (a
/// thread's sleep in [`block_on`], a task's sleep on the timer begun from the thread),
/// parks on a signal or a wake frame ([`Armed`]), the parks a wake frame ended (or, for a
/// task, the leader that received it, [`Wakes::arm_watched`]), the checks of a waited-for
/// word (each one or more one-sided reads or atomics), the wake frames sent, the passes of
/// progress a task parked on a wake frame made itself, woken by something else than its
/// frame's delivery (the doorbell, its check, a nap), and the parks of a task that its
/// frame's delivery by another pass than its own ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Waits {
    pub(crate) sleeps: u64,
    pub(crate) parks: u64,
    pub(crate) wakes: u64,
    pub(crate) checks: u64,
    pub(crate) frames: u64,
    pub(crate) passes: u64,
    pub(crate) delivered: u64,
}

#[cfg(test)]
impl Waits {
    /// The waits since `before`.
    pub(crate) fn since(self, before: Waits) -> Waits {
        Waits {
            sleeps: self.sleeps - before.sleeps,
            parks: self.parks - before.parks,
            wakes: self.wakes - before.wakes,
            checks: self.checks - before.checks,
            frames: self.frames - before.frames,
            passes: self.passes - before.passes,
            delivered: self.delivered - before.delivered,
        }
    }
}

/// The waits on this thread so far.
#[cfg(test)]
pub(crate) fn waits_here() -> Waits {
    WAITS.get()
}

/// Counts one check of a waited-for word ([`Waits::checks`]).
pub(crate) fn checked() {
    count(|w| w.checks += 1);
}

fn count(f: impl FnOnce(&mut Waits)) {
    let mut w = WAITS.get();
    f(&mut w);
    WAITS.set(w);
}

/// How a wait for words of a window waits next (see [`until!`](super::queues)): a waiter
/// *arms* before each check of the words, then, if the check failed, *waits* on what it
/// armed. For the first polls it spins ([`Backoff`]); after that it listens for a write to
/// one of the words, registered before the check, so a write between the check and the park
/// wakes it (no lost wake-up); a write to another word that shares a word's signal only
/// costs a check. Where the transport signals no writes (libfabric: a peer's write raises
/// no event at this rank), it polls with [`Backoff`]: each check is a one-sided read, which
/// also makes the transport's progress.
pub(crate) enum Armed<'a, const N: usize> {
    /// Spin, yield or sleep ([`Backoff::snooze`]).
    Snooze,
    /// Let other tasks run once (the protocols' model: every wait is a step).
    #[cfg_attr(not(test), allow(dead_code))]
    Yield,
    /// Wait, a step at a time, until a wake frame is in the mailbox, and take it, or until
    /// the steps given passed (the protocols' model: a receive of the hand-off's wake
    /// frame, and the waiter's check of its word every [`WAKE_CHECK`]).
    #[cfg(test)]
    #[cfg_attr(loom, allow(dead_code))]
    Mailbox(&'a AtomicU32, u32),
    /// Park until one of the words is written.
    Listen([SignalListener<'a>; N]),
    /// Park until a wake frame arrives (a receive posted before the check), or a task
    /// until a rank is lost or [`WAKE_CHECK`] passed, a thread until [`WAKE_ALARM`] passed.
    /// With the frame's tag, and, for the task that leads its rank's tasks waiting on a
    /// watched word, their [`Relay`] (woken when the frame comes).
    /// With the rank's stand-in where the frame is a queue lock's hand-off ([`StandIn`]).
    Woken(Request<'a, Vec<u8>>, i32, Option<&'a Relay>, Option<&'a StandIn>),
    /// A task waiting on a watched word while another task of its rank leads
    /// ([`Wakes::arm_watched`]): park until the leader's frame comes or it stops leading.
    Relayed(EventListener),
}

/// Arms the next wait for the words `words` (rank, element offset) of `window` after the
/// polls `backoff` counted.
pub(crate) fn arm<'a, const N: usize>(window: &'a Window<'_, u64>, backoff: &Backoff, words: [(u32, usize); N]) -> Armed<'a, N> {
    if backoff.0 < SPIN_POLLS {
        return Armed::Snooze;
    }
    let listeners = words.map(|(rank, offset)| window.watch(rank, offset));
    if listeners.iter().any(Option::is_none) {
        return Armed::Snooze;
    }
    Armed::Listen(listeners.map(|l| l.expect("checked above")))
}

/// Where a lock's window signals no writes (libfabric), how its waiters are woken: by *wake
/// frames*, empty messages on the lock's own communicator (a duplicate of the one it was
/// made on, which no user message can match), tagged with the word waited for.
///
/// - A word one known rank waits for (a queue node's STATUS): its writer, once the write is
///   complete, sends that rank the frame ([`wake`](Self::wake)) if the waiter marked its
///   predecessor's NEXT parked (`Queues::pass`: the write is a put, then an atomic claim of
///   that NEXT; the mark a compare-and-swap of it).
/// - A word that any of several ranks may wait for, changed by atomics (RMA-RW's counters,
///   the foMPI-style locks' word): a *watchers word* at the same rank holds a bit per rank
///   that waits. A waiter sets its rank's bit ([`watch`](Self::watch)) before it checks; a
///   rank that changed the word reads the watchers word after its change and wakes each
///   rank set ([`notify`](Self::notify)). Both are atomics at one rank, complete on return:
///   the check sees the change, or the change's reader sees the bit. The bit is per rank,
///   set while any of its threads and tasks waits there (counted here). With more than 64
///   ranks there is no room for a bit each: those waits poll.
///
/// A waiter posts the frame's receive before each check ([`arm`](Self::arm)), so a frame
/// sent after it is not missed. A frame nobody needs any more (sent for a change its waiter
/// saw first, or to a rank whose waiters left meanwhile) is consumed ([`drain`](Self::drain))
/// when a wait on its word ends: the rank's queue of unexpected messages holds a few of them
/// at most, whatever the number of acquisitions.
///
/// The tasks of a rank waiting on one watched word share one receive ([`Relay`]).
pub(crate) struct Wakes {
    comm: Option<Communicator>,
    /// Per watchers word this rank waits on (by slot), its threads and tasks waiting there.
    waiting: [AtomicU32; SLOTS],
    /// Per slot, the tasks waiting there.
    relays: [Relay; SLOTS],
    /// The thread that progresses while tasks of the rank are parked on wake frames (one
    /// for every lock of the rank).
    stand_in: Arc<StandIn>,
}

/// The tasks of one rank waiting on one watched word: the first of them *leads*: it spins,
/// then parks on the wake frame's receive as a lone task would; the others park on `event`
/// at once, without a receive or a check of their own. The leader wakes them all when its
/// frame comes, and when it stops leading (its check found the word changed, its wait
/// failed, or it was dropped); each of them then checks the word once, and one of those
/// still waiting leads. So a rank's thousands of tasks waiting on a word cost one receive
/// and the leader's checks while they wait, and one check each per change.
pub(crate) struct Relay {
    led: AtomicBool,
    event: Event,
}

impl Relay {
    fn new() -> Self {
        Relay { led: AtomicBool::new(false), event: Event::new() }
    }

    /// Wakes every task parked on the leader.
    fn wake_all(&self) {
        self.event.notify(usize::MAX);
    }
}

/// Watchers words a rank may wait on at once, by what waits: RMA-RW's readers at their
/// counter, its writer at a counter, a releaser for its successor's NEXT; the foMPI-style
/// locks use the first two (the waits for their word to fall, their readers' waits).
pub(crate) const SLOTS: usize = 3;

/// One wait on a watched word ([`Wakes::arm_watched`]): once counted, its rank's bit set
/// in the watchers word, cleared when the last of the rank's waiters there drops this;
/// for a task that leads the rank's tasks waiting there, the lead, handed on when dropped.
pub(crate) struct Watching<'a> {
    wakes: &'a Wakes,
    window: &'a Window<'a, u64>,
    home: u32,
    word: usize,
    slot: usize,
    /// Counted in the rank's waiters of the slot (its bit set).
    counted: bool,
    /// Leads the rank's tasks waiting in the slot.
    leads: bool,
}

impl Wakes {
    /// The wake frames of a lock whose window is `window`, made on `comm` (collective:
    /// duplicates `comm`); `None` where the window signals writes itself.
    pub(crate) fn new(comm: &Communicator, window: &Window<'_, u64>) -> Result<Option<Self>, weft_sync::Error> {
        if window.signals_writes() {
            return Ok(None);
        }
        Ok(Some(Wakes {
            comm: Some(comm.dup()?),
            waiting: std::array::from_fn(|_| AtomicU32::new(0)),
            relays: std::array::from_fn(|_| Relay::new()),
            stand_in: StandIn::of(comm.engine()),
        }))
    }

    fn comm(&self) -> &Communicator {
        self.comm.as_ref().expect("freed only on drop")
    }

    /// Arms the next wait for a word whose change sends a wake frame with tag `tag` after
    /// the polls `backoff` counted: a receive of the frame, posted before the check. `None`
    /// while the waiter still spins, or if the receive cannot be posted (then the wait
    /// polls).
    pub(crate) fn arm<const N: usize>(&self, backoff: &Backoff, tag: usize) -> Option<Armed<'_, N>> {
        if backoff.0 < SPIN_POLLS {
            return None;
        }
        let tag = i32::try_from(tag).ok()?;
        self.comm().irecv(Vec::new(), Source::Any, tag).ok().map(|r| Armed::Woken(r, tag, None, Some(&self.stand_in)))
    }

    /// Consumes the wake frames with tag `tag` that arrived and that no receive took: no wait
    /// of this rank needs them (a wait posts its receive before its check, which sees the
    /// change a frame was sent for). Called when a wait on the word ends.
    pub(crate) fn drain(&self, tag: usize) {
        let Ok(tag) = i32::try_from(tag) else { return };
        // A failure (the communicator freed) leaves nothing to consume.
        while let Ok(Some(frame)) = self.comm().improbe(Source::Any, tag) {
            let _ = frame.mrecv(Vec::<u8>::new());
        }
    }

    /// Wakes the waiter armed at rank `rank` with tag `tag` (after the change it waits for,
    /// complete at its target).
    pub(crate) fn wake(&self, rank: u32, tag: usize) -> Result<(), weft_sync::Error> {
        let tag = i32::try_from(tag).map_err(|_| weft_sync::Error::InvalidArgument("wake frame tag out of range"))?;
        count(|w| w.frames += 1);
        self.comm().send_slice::<u8>(&[], rank, tag).map(drop)
    }

    /// The wake frames queued unreceived at this rank, consumed (tests).
    #[cfg(all(test, feature = "ofi"))]
    pub(crate) fn take_queued(&self) -> usize {
        let mut n = 0;
        while let Ok(Some(frame)) = self.comm().improbe(Source::Any, crate::matching::Tag::Any) {
            let _ = frame.mrecv(Vec::<u8>::new());
            n += 1;
        }
        n
    }

    /// The rank's stand-in (tests).
    #[cfg(all(test, feature = "ofi"))]
    pub(crate) fn stand_in(&self) -> &Arc<StandIn> {
        &self.stand_in
    }

    /// Whether the ranks have a bit each in a watchers word.
    fn watchable(&self) -> bool {
        self.comm().size() <= 64
    }

    /// Counts the wait `w` in its rank's waiters of its slot: the first sets the rank's bit
    /// in the watchers word (a later one may check before it is set, and is then woken by
    /// its own or its leader's check of the word: `WAKE_CHECK`, `WAKE_ALARM`).
    fn count_in(&self, w: &mut Watching<'_>) -> Result<(), weft_sync::Error> {
        if w.counted {
            return Ok(());
        }
        if self.waiting[w.slot].fetch_add(1, Ordering::AcqRel) == 0 {
            let bit = 1u64 << w.window.rank();
            if let Err(e) = w.window.fetch_and_op(w.home, w.word, bit, Op::BitOr) {
                self.waiting[w.slot].fetch_sub(1, Ordering::AcqRel);
                return Err(e);
            }
        }
        w.counted = true;
        Ok(())
    }

    /// Arms the next wait for a word of `home` that other ranks change, whose watchers word
    /// is `word` there (this rank's waiters on it counted in `slot`), the wait's state in
    /// `watching` (kept until the wait ends). A thread, after its first polls, sets its
    /// rank's bit there and posts the wake frame's receive, both before the check. A task
    /// parks on the task that leads its rank's tasks waiting there ([`Relay`]), or leads:
    /// it spins, then waits as a thread does (parked on the receive, its check every
    /// [`WAKE_CHECK`]). `None` while the waiter spins, or where it cannot watch (more than
    /// 64 ranks): the caller arms as it would without.
    pub(crate) fn arm_watched<'a, const N: usize>(
        &'a self,
        window: &'a Window<'a, u64>,
        backoff: &Backoff,
        watching: &mut Option<Watching<'a>>,
        (home, word, slot): (u32, usize, usize),
    ) -> Result<Option<Armed<'a, N>>, weft_sync::Error> {
        if !self.watchable() {
            return Ok(None);
        }
        let w = watching.get_or_insert(Watching { wakes: self, window, home, word, slot, counted: false, leads: false });
        let relay = &self.relays[slot];
        if !BLOCKING.get() && !w.leads {
            // Listening before the look at the lead: a leader that stops after it wakes
            // this task too.
            let listener = relay.event.listen();
            if relay.led.load(Ordering::SeqCst) || relay.led.swap(true, Ordering::SeqCst) {
                self.count_in(w)?;
                return Ok(Some(Armed::Relayed(listener)));
            }
            w.leads = true;
        }
        if backoff.0 < SPIN_POLLS {
            return Ok(None);
        }
        self.count_in(w)?;
        Ok(match self.arm(backoff, word) {
            Some(Armed::Woken(r, tag, _, _)) => Some(Armed::Woken(r, tag, w.leads.then_some(relay), None)),
            armed => armed,
        })
    }

    /// After a change of a word whose watchers word is `word` of `home` (complete there):
    /// wakes every rank watching it.
    pub(crate) fn notify(&self, window: &Window<'_, u64>, home: u32, word: usize) -> Result<(), weft_sync::Error> {
        if !self.watchable() {
            return Ok(());
        }
        let mut mask = window.fetch_and_op(home, word, 0, Op::NoOp)?;
        while mask != 0 {
            let rank = mask.trailing_zeros();
            mask &= mask - 1;
            self.wake(rank, word)?;
        }
        Ok(())
    }
}

impl Drop for Watching<'_> {
    fn drop(&mut self) {
        if self.leads {
            let relay = &self.wakes.relays[self.slot];
            relay.led.store(false, Ordering::SeqCst);
            relay.wake_all();
        }
        if !self.counted {
            return;
        }
        let waiting = &self.wakes.waiting[self.slot];
        if waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
            let bit = 1u64 << self.window.rank();
            // A failure leaves the bit set: it only costs wake frames, consumed below.
            let _ = self.window.fetch_and_op(self.home, self.word, !bit, Op::BitAnd);
            // A waiter that came meanwhile counted on the bit: set it again.
            if waiting.load(Ordering::Acquire) > 0 {
                let _ = self.window.fetch_and_op(self.home, self.word, bit, Op::BitOr);
            }
            // The last waiter of the rank there: the frames sent to it are nobody's.
            self.wakes.drain(self.word);
        }
    }
}

impl Drop for Wakes {
    fn drop(&mut self) {
        if let Some(c) = self.comm.take() {
            c.free();
        }
    }
}

impl<const N: usize> Armed<'_, N> {
    /// Waits as armed (after a check that failed); returns whether a wake frame ended the
    /// wait (the frame taken).
    pub(crate) async fn wait(self, backoff: &mut Backoff) -> bool {
        match self {
            Armed::Snooze => backoff.snooze().await,
            Armed::Yield => {
                backoff.0 = backoff.0.saturating_add(1);
                YieldNow(false).await;
            }
            #[cfg(test)]
            Armed::Mailbox(mailbox, steps) => {
                count(|w| w.parks += 1);
                for _ in 0..steps {
                    if mailbox.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok() {
                        count(|w| w.wakes += 1);
                        return true;
                    }
                    YieldNow(false).await;
                }
            }
            Armed::Listen(listeners) => {
                count(|w| w.parks += 1);
                // No write may come (a rank ended its part of the window: its notice is a
                // message, which this park does not wait for): the check that follows the
                // alarm makes progress first, and fails the wait once a rank ended.
                AnyOf(listeners.map(Some), Sleep::new(WAKE_ALARM)).await;
            }
            Armed::Relayed(listener) => {
                count(|w| w.parks += 1);
                listener.await;
                count(|w| w.wakes += 1);
            }
            Armed::Woken(request, tag, relay, stand_in) => {
                count(|w| w.parks += 1);
                // A thread waits as a blocked receive does (the rank's waiter, woken by the
                // network itself) until the frame or its alarm comes; a task parks on the
                // receive, the rank's doorbell (which a loss rings) and the check's deadline.
                let woken = if BLOCKING.get() {
                    Alarm::wait(request, tag)
                } else {
                    let epoch = request.communicator().engine().transport.lost_epoch();
                    (WakeOrCheck { request, check: Sleep::new(WAKE_CHECK), epoch, yield_until: None, stand_in, parked: None }).await
                };
                if woken {
                    count(|w| w.wakes += 1);
                    // The tasks parked on this leader check the word too.
                    relay.into_iter().for_each(Relay::wake_all);
                }
                return woken;
            }
        }
        false
    }
}

/// Ready with `true` when the wake frame's receive completes, with `false` when the check's
/// time comes first or a rank was lost since `epoch` (the receive is then cancelled by its
/// drop; the check that follows sees a write that landed, and the loss).
///
/// A queue lock's hand-off (`stand_in` given): the task makes one pass of the rank's
/// progress, then parks on the receive's completion, the rank's doorbell (which a loss
/// rings) and the check, counted in the rank's [`StandIn`] while parked: the stand-in waits
/// as a blocked thread of the rank does, so the hand-off's wake frame is delivered while
/// the task sleeps, and the delivery wakes the task, whichever thread of the rank made the
/// pass that delivered it. A task that napped and made a pass of its own after each nap
/// let every hand-off wait for up to two naps.
///
/// A watched word's change (the spin lock's word, RMA-RW's counters, a releaser's NEXT:
/// whoever gets there first may take the lock, no hand-off waits for this task): while the
/// rank's progress goes on, the task yields between passes for the rank's yield window
/// (`WEFT_YIELD_US`) at most, as a blocked thread does, then parks until the receive
/// completes (the rank's watcher rings the doorbell) or the check's time comes, and, while
/// the rank is busy (its watcher then leaves the progress to the rank's waiters), for a nap
/// of [`NAP`], after which it makes a pass again: no thread spins for it.
///
/// The receive is looked at without progress of its own: a receive's poll makes passes for
/// as long as they progress, and a pass counts as progress while the rank saw traffic in
/// the last milliseconds (so that blocked threads spin then), which held the task inside one
/// poll for as long as the traffic lasted, and took the cores from the processes it waited
/// for.
struct WakeOrCheck<'a> {
    request: Request<'a, Vec<u8>>,
    check: Sleep,
    /// The transport's loss epoch when the wait was armed.
    epoch: u64,
    /// Until when passes that made progress are followed by another at once (a watched
    /// word's wait).
    yield_until: Option<Instant>,
    /// The rank's stand-in (a hand-off's wait).
    stand_in: Option<&'a StandIn>,
    /// Once parked: the task's count in the stand-in, if any.
    parked: Option<Option<Counted<()>>>,
}

/// The nap of a task waiting for a watched word's frame while its rank is busy
/// ([`WakeOrCheck`]).
const NAP: Duration = Duration::from_micros(50);

impl Future for WakeOrCheck<'_> {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let this = &mut *self;
        // A failed receive (the communicator freed, say) also ends the park: the check that
        // follows finds what happened.
        if this.request.is_complete() {
            if this.parked.is_some() {
                count(|w| w.delivered += 1);
            }
            return Poll::Ready(true);
        }
        // A receive from any source fails only once no peer is left: a loss ends the park
        // here (the transport rings the doorbell the wait is registered on).
        if this.request.communicator().engine().transport.lost_epoch() != this.epoch {
            return Poll::Ready(false);
        }
        if this.parked.is_some() {
            // Woken while parked by something else than the frame's delivery.
            count(|w| w.passes += 1);
        }
        let engine = this.request.communicator().engine();
        // The pass registers the task on the doorbell when idle.
        let busy = engine.poll_progress(cx) == Step::Progressed;
        if busy && this.request.is_complete() {
            return Poll::Ready(true);
        }
        match (busy, this.stand_in) {
            (true, Some(_)) => engine.transport.doorbell().register(cx.waker()),
            (true, None) => {
                let now = Instant::now();
                if now >= this.check.deadline {
                    return Poll::Ready(false);
                }
                if now < *this.yield_until.get_or_insert(now + engine.config.yield_window) {
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
            // Idle: the next pass that progresses yields again for a window.
            (false, _) => this.yield_until = None,
        }
        if this.request.own_cell().poll_complete(cx).is_ready() {
            return Poll::Ready(true);
        }
        if this.parked.is_none() {
            this.parked = Some(this.stand_in.map(|s| s.stand(engine)));
        }
        if busy && this.stand_in.is_none() {
            // A nap of a future length is never ready at its first poll: the poll only
            // registers the wake-up at its deadline (a `Sleep` dropped stays registered).
            let _ = Pin::new(&mut Sleep::new(NAP)).poll(cx);
        }
        Pin::new(&mut this.check).poll(cx).map(|()| false)
    }
}

/// A thread of a rank that progresses while tasks of the rank are parked on a queue lock's
/// hand-off frames ([`WakeOrCheck`]), so that a hand-off to a parked task waits for no poll of the task's:
/// it waits as a blocked thread of the rank does (progress while the rank is busy, then a
/// park on the doorbell as the rank's waiter, which the network wakes, `Progress::park`),
/// for as long as any task of the rank is parked there (each counted on its sync object),
/// and sleeps otherwise. One per rank, shared by its locks ([`of`](Self::of)); its thread
/// starts at the first park, and ends when the rank's last lock is freed, or at the latest
/// when the rank's runtime is dropped ([`stop_rank`](Self::stop_rank)): a lock that is
/// never dropped (leaked with `mem::forget`) keeps the stand-in, not its thread, nor the
/// thread's hold on the rank's engine (its progress hook).
pub(crate) struct StandIn {
    /// One count per parked task, and whether the thread is to end.
    shared: Arc<(SyncObject<()>, AtomicBool)>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The stand-ins of the ranks with live locks, by engine. An entry is removed when its
/// rank's runtime is dropped ([`StandIn::stop_rank`]), and an engine is not freed while its
/// entry's stand-in lives (its locks hold their communicators), so an address is not reused
/// meanwhile.
static RANKS: Mutex<Vec<(usize, std::sync::Weak<StandIn>)>> = Mutex::new(Vec::new());

impl StandIn {
    /// The stand-in of `engine`'s rank: the one its live locks share, or a new one.
    fn of(engine: &Arc<crate::engine::Engine>) -> Arc<StandIn> {
        let key = Arc::as_ptr(engine) as usize;
        let mut ranks = RANKS.lock().unwrap_or_else(|e| e.into_inner());
        ranks.retain(|(_, s)| s.strong_count() > 0);
        if let Some(s) = ranks.iter().find(|(k, _)| *k == key).and_then(|(_, s)| s.upgrade()) {
            return s;
        }
        let s = Arc::new(StandIn { shared: Arc::default(), thread: Mutex::new(None) });
        ranks.push((key, Arc::downgrade(&s)));
        s
    }

    /// Ends the stand-in of `engine`'s rank, if it has one: its runtime is dropped (its
    /// executor stopped, so no task of the pool is parked). The rank's locks that were
    /// leaked keep their stand-in, which starts no thread any more (a task parked on them
    /// later ends its park by its check).
    pub(crate) fn stop_rank(engine: &Arc<crate::engine::Engine>) {
        let key = Arc::as_ptr(engine) as usize;
        let stand_in = {
            let mut ranks = RANKS.lock().unwrap_or_else(|e| e.into_inner());
            let at = ranks.iter().position(|(k, _)| *k == key);
            at.and_then(|i| ranks.swap_remove(i).1.upgrade())
        };
        if let Some(s) = stand_in {
            s.stop();
        }
    }

    /// Ends the thread, and joins it unless a parked task's count is still held (a task's
    /// future leaked while parked, or still parked under an executor that outlives the
    /// runtime: the thread then ends once the count goes).
    fn stop(&self) {
        self.shared.1.store(true, Ordering::Release);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            t.thread().unpark();
            if self.shared.0.size() == 0 {
                let _ = t.join();
            }
        }
    }

    /// Counts a parked task of `engine`'s rank until the returned count is dropped; starts
    /// the thread, or wakes it.
    fn stand(&self, engine: &Arc<crate::engine::Engine>) -> Counted<()> {
        let counted = self.shared.0.count_one();
        let mut thread = self.thread.lock().unwrap_or_else(|e| e.into_inner());
        match thread.as_ref() {
            Some(t) => t.thread().unpark(),
            // Stopped (its rank's runtime dropped): the task's check ends its park.
            None if self.shared.1.load(Ordering::Acquire) => {}
            None => {
                let (shared, hook) = (self.shared.clone(), crate::progress::sync_hook(engine));
                let run = move || {
                    let (parked, stop) = &*shared;
                    while !stop.load(Ordering::Acquire) {
                        if parked.size() == 0 {
                            std::thread::park();
                        } else {
                            // A count dropped without completion is no error here.
                            let _ = parked.wait_all_with(&*hook);
                        }
                    }
                };
                // Without the thread (none could be started) the task's check still ends its park.
                *thread = std::thread::Builder::new().name("weft-dlock-stand-in".into()).spawn(run).ok();
            }
        }
        counted
    }
}

impl Drop for StandIn {
    /// Ends the thread: the rank's locks are freed, so no task is parked (each borrows one),
    /// unless a parked task's future was leaked (then the thread, waiting for it, is left).
    fn drop(&mut self) {
        self.stop();
    }
}

/// A thread's end of a wait for a wake frame: after [`WAKE_ALARM`] the timer thread sends
/// this rank a frame of one byte with the wake frame's tag (a wake frame is empty), unless
/// the wait ended first. A blocked receive ends only when it matches (a receive from any
/// source fails only once no peer is left), so the alarm is what bounds the wait: the
/// check that follows sees a write whose wake frame never came, or a lost rank.
struct Alarm {
    /// The lock's communicator until the alarm fires (the timer takes it to send) or the
    /// wait ends (the waiter takes it back: the timer's entry keeps no rank alive).
    comm: parking_lot::Mutex<Option<Communicator>>,
    tag: i32,
}

impl Alarm {
    /// Waits for `request` (a wake frame's receive) as a blocked receive does, at most
    /// about [`WAKE_ALARM`]; `true` if the wake frame ended it.
    fn wait(mut request: Request<'_, Vec<u8>>, tag: i32) -> bool {
        let comm = request.communicator();
        let alarm = Arc::new(Alarm { comm: parking_lot::Mutex::new(Some(comm.clone())), tag });
        timer().add(Instant::now() + WAKE_ALARM, Waker::from(alarm.clone()));
        crate::progress::wait_all(comm.engine(), std::slice::from_mut(&mut request));
        // Disarmed. A frame of an alarm that fired after the wake frame came is received by
        // a later wait, which then checks once more.
        drop(alarm.comm.lock().take());
        matches!(request.take(), Some(Ok((frame, _))) if frame.is_empty())
    }
}

impl Wake for Alarm {
    fn wake(self: Arc<Self>) {
        let comm = self.comm.lock().take();
        if let Some(comm) = comm {
            // A failure (the lock freed meanwhile) leaves nothing to wake.
            let _ = comm.send_slice::<u8>(&[1], comm.rank(), self.tag);
        }
    }
}

/// Ready when one of its listeners is notified, or its alarm's time came.
struct AnyOf<'a, const N: usize>([Option<SignalListener<'a>>; N], Sleep);

impl<const N: usize> Future for AnyOf<'_, N> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        for l in self.0.iter_mut().flatten() {
            if Pin::new(l).poll(cx).is_ready() {
                return Poll::Ready(());
            }
        }
        Pin::new(&mut self.1).poll(cx)
    }
}

/// Wakes a thread parked in [`block_on`].
struct Unparker(std::thread::Thread);

impl Wake for Unparker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on this thread (parking it while nothing can go on, until
/// the earliest [`Sleep`] it waits for at most), with [`Backoff`] sleeping the thread
/// instead of parking a task.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    struct Restore(bool, Option<Instant>);
    impl Drop for Restore {
        fn drop(&mut self) {
            BLOCKING.set(self.0);
            WAKE_AT.set(self.1);
        }
    }
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unparker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let _restore = Restore(BLOCKING.replace(true), WAKE_AT.take());
    loop {
        if let Poll::Ready(v) = future.as_mut().poll(&mut cx) {
            return v;
        }
        match WAKE_AT.take() {
            Some(at) => std::thread::park_timeout(at.saturating_duration_since(Instant::now())),
            None => std::thread::park(),
        }
    }
}

/// Waits between two polls of a lock word: spins, then yields, then sleeps, doubling up to
/// [`MAX_SLEEP`]. In [`block_on`] the thread does so; under an executor the task yields,
/// then sleeps on the timer.
pub(crate) struct Backoff(u32);

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff(0)
    }

    /// The polls counted so far (the protocols' model).
    #[cfg(test)]
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn polls(&self) -> u32 {
        self.0
    }

    /// Whether the first polls, which spin (a thread) or yield (a task), are over: the
    /// waiter parks (or sleeps) after its next check.
    pub(crate) fn parking(&self) -> bool {
        self.0 >= SPIN_POLLS
    }

    /// The sleep after `n` polls (none for the first ones).
    fn sleep_after(n: u32) -> Option<Duration> {
        (n > 24).then(|| Duration::from_micros(1 << (n - 24).min(7)).min(MAX_SLEEP))
    }

    pub(crate) async fn snooze(&mut self) {
        self.0 = self.0.saturating_add(1);
        let sleep = Self::sleep_after(self.0);
        if sleep.is_some() {
            count(|w| w.sleeps += 1);
        }
        if BLOCKING.get() {
            match (self.0, sleep) {
                (_, Some(d)) => std::thread::sleep(d),
                (0..=8, None) => std::hint::spin_loop(),
                _ => std::thread::yield_now(),
            }
            return;
        }
        match sleep {
            Some(d) => Sleep::new(d).await,
            None => YieldNow(false).await,
        }
    }
}

/// Returns `Pending` once, waking the task at once: other tasks run first.
struct YieldNow(bool);

impl Future for YieldNow {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            return Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// A task's sleep until `deadline`, fired by the timer thread.
pub(crate) struct Sleep {
    deadline: Instant,
}

impl Sleep {
    pub(crate) fn new(d: Duration) -> Self {
        Sleep { deadline: Instant::now() + d }
    }
}

impl Future for Sleep {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if Instant::now() >= self.deadline {
            return Poll::Ready(());
        }
        // Registered at each poll that finds it early: a spurious wake-up re-arms it. A
        // thread in `block_on` parks until the deadline itself.
        if BLOCKING.get() {
            WAKE_AT.set(Some(WAKE_AT.get().map_or(self.deadline, |at| at.min(self.deadline))));
        } else {
            timer().add(self.deadline, cx.waker().clone());
        }
        Poll::Pending
    }
}

/// One sleeping task: ordered by deadline, earliest first out of the max-heap.
struct Entry {
    at: Instant,
    waker: Waker,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.at.cmp(&self.at)
    }
}

/// The deadlines of sleeping tasks and the thread that fires them.
struct Timer {
    heap: Mutex<BinaryHeap<Entry>>,
    changed: Condvar,
}

fn timer() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let t: &'static Timer = Box::leak(Box::new(Timer { heap: Mutex::new(BinaryHeap::new()), changed: Condvar::new() }));
        std::thread::Builder::new()
            .name("weft-dlock-timer".into())
            .spawn(move || t.run())
            .expect("spawn the distributed locks' timer thread");
        t
    })
}

impl Timer {
    fn add(&self, at: Instant, waker: Waker) {
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = heap.peek().map_or(true, |e| at < e.at);
        heap.push(Entry { at, waker });
        drop(heap);
        if earliest {
            self.changed.notify_one();
        }
    }

    fn run(&self) {
        let mut due = Vec::new();
        let mut heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let now = Instant::now();
            while heap.peek().is_some_and(|e| e.at <= now) {
                due.extend(heap.pop().map(|e| e.waker));
            }
            if !due.is_empty() {
                drop(heap);
                due.drain(..).for_each(Waker::wake);
                heap = self.heap.lock().unwrap_or_else(|e| e.into_inner());
                continue;
            }
            heap = match heap.peek().map(|e| e.at) {
                Some(at) => self.changed.wait_timeout(heap, at - now).unwrap_or_else(|e| e.into_inner()).0,
                None => self.changed.wait(heap).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}

/// A mutex for the threads and tasks of one rank; an async waiter parks its task.
pub(crate) struct LocalLock {
    held: AtomicBool,
    released: Event,
}

/// Holds a [`LocalLock`]; releases it (waking one waiter) when dropped.
pub(crate) struct LocalGuard<'a>(&'a LocalLock);

impl LocalLock {
    pub(crate) fn new() -> Self {
        LocalLock { held: AtomicBool::new(false), released: Event::new() }
    }

    pub(crate) fn try_lock(&self) -> Option<LocalGuard<'_>> {
        self.held.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok().then(|| LocalGuard(self))
    }

    pub(crate) async fn lock(&self) -> LocalGuard<'_> {
        loop {
            if let Some(g) = self.try_lock() {
                return g;
            }
            let listener = self.released.listen();
            // A release between the attempt and `listen` is not missed: try again first.
            if let Some(g) = self.try_lock() {
                return g;
            }
            listener.await;
        }
    }
}

impl Drop for LocalGuard<'_> {
    fn drop(&mut self) {
        self.0.held.store(false, Ordering::Release);
        self.0.released.notify(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_on_sleeps_the_thread_and_an_executor_parks_the_task() {
        // Under block_on, a long backoff sleeps the thread: no timer entry is made.
        block_on(async {
            let mut b = Backoff::new();
            for _ in 0..40 {
                b.snooze().await;
            }
        });
        assert!(!BLOCKING.get(), "the flag is restored");
        // Under tokio, 200 tasks sleep on the timer on one thread.
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let start = Instant::now();
        rt.block_on(async {
            let tasks: Vec<_> = (0..200)
                .map(|_| {
                    tokio::spawn(async {
                        let mut b = Backoff::new();
                        for _ in 0..40 {
                            b.snooze().await;
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
        });
        assert!(start.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn local_lock_excludes_and_wakes_a_parked_task() {
        let lock = Arc::new(LocalLock::new());
        let g = lock.try_lock().unwrap();
        assert!(lock.try_lock().is_none());
        let l2 = lock.clone();
        let t = std::thread::spawn(move || block_on(async { drop(l2.lock().await) }));
        std::thread::sleep(Duration::from_millis(20));
        assert!(!t.is_finished(), "the waiter waits while the lock is held");
        drop(g);
        t.join().unwrap();
        assert!(lock.try_lock().is_some());
    }
}
