//! Blocking waits: test requests while progress completes them, then attach what is still
//! pending to the thread's sync object and wait on it ([Patinyasakdikul 2019, Alg. 2]), in the
//! runtime's progress mode; waits over the requests of several in-process ranks poll them all.

use std::cell::RefCell;
use std::sync::Arc;

use weft_sync::{Attach, Progress, SyncObject};

use super::concurrent::{Attend, ConcurrentWait};
use super::owner::OwnerWait;
use crate::config::ProgressMode;
use crate::engine::Engine;

/// What a blocking wait needs of a request (`Request` implements it, above this layer).
pub(crate) trait Waitable: Attach {
    /// The cell the operation itself completes, which a wait attaches to (a request's
    /// [`Attach::completion_cell`] may be another, for the user's sync objects).
    fn own_cell(&self) -> &weft_sync::CompletionCell {
        self.completion_cell()
    }
    /// Whether the operation has completed.
    fn is_complete(&self) -> bool;
    /// `None` while the operation is pending; once it has completed, whether it may have
    /// failed (`false` only where it is known not to have: succeeded, or its result taken).
    /// One look at the operation's state for both. By default every completed operation may
    /// have failed, which sends the caller of [`wait_all_walked`] to look at each outcome.
    fn settled(&self) -> Option<bool> {
        self.is_complete().then_some(true)
    }
    /// Whether the completion of this complete request went to a sync object already (an
    /// attach of it would be refused). By default a look at its own cell; a request that
    /// makes its cell on demand answers without making it.
    fn delivery_spent(&self) -> bool {
        !self.own_cell().attachable()
    }
    /// Whether the request still holds its operation (not yet taken by a wait).
    fn is_live(&self) -> bool;
    /// The rank the request belongs to.
    fn engine(&self) -> &Arc<Engine>;
    /// The context id of its communicator.
    fn context_id(&self) -> u32;
    /// Its tag partition.
    fn part(&self) -> usize;
}

/// Idle progress passes `wait_all` makes while testing requests directly, before it
/// attaches them to the thread's sync object.
const TEST_SPINS: u32 = 16;

/// The same while no thread on the machine waits for a core
/// (`IdleBackoff::may_spin_long`): about 0.1-0.2 ms of idle passes.
const LONG_TEST_SPINS: u32 = 2048;

/// Index of the first request from `from` on that has not completed (`reqs.len()` if none);
/// `failed` is set if one of the completed requests passed over may have failed.
#[inline]
fn first_pending<R: Waitable>(reqs: &[R], mut from: usize, failed: &mut bool) -> usize {
    let mut any = false;
    while let Some(f) = reqs.get(from).and_then(Waitable::settled) {
        any |= f;
        from += 1;
    }
    *failed |= any;
    from
}

thread_local! {
    /// Sync objects for this thread's blocking waits (Algorithm 2's SYNC_INIT, made once and
    /// reused): one per nesting level. A wait takes one and gives it back empty; a pool task
    /// that a waiting thread runs instead of sleeping (`help`), and that itself waits, takes
    /// another, so it waits for its own requests only, not for those of the wait it runs in.
    static WAIT_SYNCS: RefCell<Vec<SyncObject<usize>>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with one of this thread's wait sync objects, which nothing is attached to; `f`
/// must leave it so (every attachment completed or detached, every event taken).
fn with_wait_sync<R>(f: impl FnOnce(&SyncObject<usize>) -> R) -> R {
    let sync = WAIT_SYNCS.try_with(|p| p.borrow_mut().pop()).ok().flatten().unwrap_or_default();
    let r = f(&sync);
    debug_assert!(sync.size() == 0 && sync.probe() == 0, "a wait left its sync object in use");
    let _ = WAIT_SYNCS.try_with(move |p| p.borrow_mut().push(sync));
    r
}

/// What a blocking wait waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Want {
    /// Every request complete (`MPI_Waitall`).
    All,
    /// One request complete and not yet taken (`MPI_Waitany`).
    Any,
}

/// Index of a request that completed and was not taken yet.
fn first_done<R: Waitable>(reqs: &[R]) -> Option<usize> {
    reqs.iter().position(|r| r.is_live() && r.is_complete())
}

/// Whether `want` holds for `reqs`, and for [`Want::Any`] the index of a completed request
/// (`None` if every one was taken). `first`, the first request not known complete, only
/// moves forward: requests mostly complete in the order they were posted, so checking
/// them all costs O(1) per completion. For [`Want::All`], `walk` records whether a request
/// passed over failed.
fn satisfied<R: Waitable>(reqs: &[R], want: Want, first: &mut usize, walk: &mut Walk) -> (bool, Option<usize>) {
    match want {
        Want::All => {
            *first = first_pending(reqs, *first, &mut walk.failed);
            (*first == reqs.len(), None)
        }
        Want::Any => match first_done(reqs) {
            Some(i) => (true, Some(i)),
            None => (!reqs.iter().any(|r| r.is_live()), None),
        },
    }
}

/// Blocks until every request in `reqs` has completed, in the runtime's progress mode.
pub(crate) fn wait_all<R: Waitable>(engine: &Engine, reqs: &mut [R]) {
    wait(engine, reqs, Want::All);
}

/// What a wait's own tests of the requests saw ([`Want::All`]): whether one of them failed,
/// as [`first_pending`] passed over it. A wait that ends with every request seen complete
/// there knows without a second look whether one failed (`MPI_Waitall`'s error): the
/// common wait, which tests each request once anyway, then reads each outcome once.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Walk {
    /// A request passed over had failed.
    failed: bool,
    /// Some requests completed while attached to the wait's sync object, unseen by the
    /// walk.
    unseen: bool,
}

impl Walk {
    /// Whether no request failed, if the walk saw them all (`None`: look at each).
    pub(crate) fn none_failed(self) -> Option<bool> {
        (!self.unseen).then_some(!self.failed)
    }
}

/// [`wait`] with [`Want::All`], telling what its tests saw ([`Walk`]).
pub(crate) fn wait_all_walked<R: Waitable>(engine: &Engine, reqs: &mut [R]) -> Walk {
    let mut walk = Walk::default();
    wait_walked(engine, reqs, Want::All, &mut walk);
    walk
}

/// The ranks `reqs` belong to, if more than one (in-process ranks of `build_local`).
fn ranks_of<R: Waitable>(reqs: &[R]) -> Option<Vec<&Engine>> {
    let first = reqs.first()?.engine();
    if reqs.iter().all(|r| Arc::ptr_eq(r.engine(), first)) {
        return None;
    }
    let mut ranks: Vec<&Engine> = Vec::new();
    for r in reqs {
        let s = &**r.engine();
        if !ranks.iter().any(|k| std::ptr::eq(*k, s)) {
            ranks.push(s);
        }
    }
    Some(ranks)
}

/// Blocks until `want` holds for `reqs`, in the runtime's progress mode, driving `engine`
/// (the first request's rank). Returns, for [`Want::Any`], the index of a completed request
/// not yet taken (`None` if every request was taken already); for [`Want::All`], `None`.
///
/// Requests of several in-process ranks: `engine`'s progress alone may never complete the
/// others'. A wait that has not ended after its first idle passes looks (once: a scan of
/// the requests, which the common wait that ends at once does not pay) and, if they span
/// ranks, goes on in [`wait_polling`], driving every one of them.
pub(crate) fn wait<R: Waitable>(engine: &Engine, reqs: &mut [R], want: Want) -> Option<usize> {
    wait_walked(engine, reqs, want, &mut Walk::default())
}

/// [`wait`], recording in `walk` what its tests of the requests saw.
fn wait_walked<R: Waitable>(engine: &Engine, reqs: &mut [R], want: Want, walk: &mut Walk) -> Option<usize> {
    let mut first = 0;
    if let (true, found) = satisfied(reqs, want, &mut first, walk) {
        return found;
    }
    match engine.config.progress {
        ProgressMode::Global => {
            // Algorithm 1.
            let mut idle = 0;
            loop {
                if let (true, found) = satisfied(reqs, want, &mut first, walk) {
                    return found;
                }
                if engine.progress_global() == 0 {
                    idle += 1;
                    if idle == TEST_SPINS {
                        if let Some(ranks) = ranks_of(reqs) {
                            return wait_polling_walked(&ranks, reqs, want, walk);
                        }
                    }
                    // Nothing to progress: run a pool task rather than only yield ([Patinyasakdikul 2019,
                    // §4.6.2]), as the other modes' waiters do before they park — with no
                    // pool workers, a task this wait depends on runs nowhere else.
                    if !crate::executor::help(&engine.executor) {
                        std::thread::yield_now();
                    }
                }
            }
        }
        ProgressMode::Owner | ProgressMode::Concurrent => {
            // While progress keeps completing requests (or for a few idle passes), test them
            // directly: attaching costs two atomic updates per request and completing an
            // attached one two more, which a wait that never sleeps does not need. What is
            // still pending then is attached (Algorithm 2 from there on). In `Owner` mode the
            // token, once taken, is kept through both phases (taking and releasing it per
            // pass would wake a parked waiter per release); a thread that cannot take it
            // makes no progress here and attaches at once.
            let owner_mode = engine.config.progress == ProgressMode::Owner;
            let me = crate::engine::thread_token();
            let lead = &reqs[first.min(reqs.len() - 1)];
            let attend = (!owner_mode && engine.config.assignment == crate::config::Assignment::Dedicated)
                .then(|| Attend::new(engine, lead.context_id(), lead.part()));
            let mut idle = 0;
            let mut spin = weft_sync::IdleBackoff::new();
            let pause = engine.config.idle_pause;
            let mut limit = TEST_SPINS;
            let mut found = None;
            let mut done = false;
            loop {
                if idle >= limit {
                    // With a core for every runnable thread on the machine (a rank per core
                    // polling, as in a ping-pong), attaching and the sync-object wait's yields
                    // would only lengthen a wait that is about to end: test on, up to
                    // `LONG_TEST_SPINS` idle passes.
                    if limit == TEST_SPINS && spin.may_spin_long() {
                        limit = LONG_TEST_SPINS;
                    } else {
                        break;
                    }
                }
                (done, found) = satisfied(reqs, want, &mut first, walk);
                if done {
                    break;
                }
                let progressed = if owner_mode {
                    if !engine.owner.own_or_take(me) {
                        break;
                    }
                    engine.progress_all() > 0
                } else {
                    engine.progress_concurrent() > 0
                };
                if progressed {
                    idle = 0;
                } else {
                    idle += 1;
                    // Between idle polls: see `Config::idle_pause`; with every core
                    // already spinning, the thread whose frames we wait for needs ours.
                    if spin.may_spin() {
                        for _ in 0..pause {
                            std::hint::spin_loop();
                        }
                    } else {
                        std::thread::yield_now();
                    }
                }
            }
            // `spin` keeps its slot through the sync-object wait below, whose own backoff then
            // spins only with a second, free slot (or, with a one-slot budget, on this one).
            let spanned = if done { None } else { ranks_of(reqs) };
            if let Some(ranks) = spanned {
                found = wait_polling_walked(&ranks, reqs, want, walk);
            } else if !done {
                // Algorithm 2: attach what is pending, then wait on the sync object.
                let owner_wait = OwnerWait { engine, me };
                let concurrent_wait = ConcurrentWait { engine, attend: attend.as_ref() };
                let hook: &dyn Progress = if owner_mode { &owner_wait } else { &concurrent_wait };
                found = with_wait_sync(|sync| match want {
                    Want::All => {
                        wait_attached_all(sync, hook, engine, reqs, &mut first, walk);
                        None
                    }
                    Want::Any => wait_attached(sync, hook, engine, &mut reqs[first..], want).map(|i| first + i),
                });
                if owner_mode && !engine.owner.is(me) {
                    // We may have been the waiter a hand-off woke, and left without
                    // taking ownership (our requests were done): pass it on, or a
                    // parked waiter would wait with no owner (`OwnerToken::leave`).
                    engine.owner.leave(me);
                }
            }
            if owner_mode && engine.owner.is(me) {
                engine.release_ownership();
            }
            found
        }
    }
}

/// A request as a wait attaches it: by the cell its operation completes.
struct Own<'r, R>(&'r R);

// SAFETY: the request's own cell, which lives as long as the request's operation (the
// request's `Attach` contract).
unsafe impl<R: Waitable> Attach for Own<'_, R> {
    fn completion_cell(&self) -> &weft_sync::CompletionCell {
        self.0.own_cell()
    }
}

/// Rounds of [`wait_attached_all`] that attach one request, before it attaches every one
/// still pending: a wait wakes at most this many times more than one that attached them all.
const ONE_BY_ONE_ROUNDS: u32 = 4;

/// Algorithm 2's second half for [`Want::All`], with `reqs[*first]` pending: attaches the
/// last request still pending alone and waits on `sync` until it completes, then tests the
/// requests again (the walk moves `first` on and records a failure it passes, as the test
/// loop's does), up to [`ONE_BY_ONE_ROUNDS`] times; then attaches every one still pending
/// ([`wait_attached`]; `walk` then looks at each outcome again). Requests mostly complete
/// in the order they were posted (always, from one source with one tag), so the last one's
/// completion is the end of the wait: one attachment per wait, where attaching every
/// pending request cost the waiter four atomic updates per request, and the completion of
/// each an indirect call and two more (a receiver that runs out of frames for a moment,
/// as one waiting for a window of messages does at its start, attached the whole window).
/// A request attached to a sync object of the user's cannot be attached here: the wait
/// then attaches every one ([`wait_attached`] tests that one between passes).
fn wait_attached_all<R: Waitable>(
    sync: &SyncObject<usize>,
    hook: &dyn Progress,
    engine: &Engine,
    reqs: &mut [R],
    first: &mut usize,
    walk: &mut Walk,
) {
    let mut end = reqs.len();
    for _ in 0..ONE_BY_ONE_ROUNDS {
        // Every request from `end` on is complete; `reqs[*first]` is not.
        while end > *first + 1 && reqs[end - 1].is_complete() {
            end -= 1;
        }
        let last = &mut reqs[end - 1];
        if sync.attach_counted(&mut Own(&*last)).is_err() {
            break;
        }
        let _ = sync.wait_all_with(hook);
        // Drained: its completion is the user's again (see `wait_attached`).
        last.own_cell().forget_delivery();
        if satisfied(reqs, Want::All, first, walk).0 {
            return;
        }
    }
    wait_attached(sync, hook, engine, &mut reqs[*first..], Want::All);
    walk.unseen = true;
}

/// Algorithm 2's second half: attaches the pending requests of `reqs` to `sync` and waits on
/// it, driving `hook`. Returns, for [`Want::Any`], the index (in `reqs`) of a completed
/// request. `sync` is left empty.
///
/// A request already attached to a sync object of the user's cannot be attached here; the
/// wait then tests it between progress passes instead ([`wait_polling`]'s loop).
fn wait_attached<R: Waitable>(sync: &SyncObject<usize>, hook: &dyn Progress, engine: &Engine, reqs: &mut [R], want: Want) -> Option<usize> {
    // Requests in the attached range whose completion this wait does not take (rare: no
    // allocation unless there is one): pending ones attached elsewhere, and, for
    // `Want::All`, complete ones whose completion went to a sync object before the wait.
    // The end of the attached range.
    let mut foreign: Vec<usize> = Vec::new();
    let mut elsewhere = false;
    let mut attached = 0;
    let found = match want {
        Want::All => {
            for (i, r) in reqs.iter_mut().enumerate() {
                if r.is_complete() {
                    if r.delivery_spent() {
                        foreign.push(i);
                    }
                } else {
                    attached = i + 1;
                    if sync.attach_counted(&mut Own(&*r)).is_err() {
                        foreign.push(i);
                        elsewhere = true;
                    }
                }
            }
            let _ = sync.wait_all_with(hook);
            if elsewhere {
                wait_polling(&[engine], reqs, Want::All);
            }
            None
        }
        Want::Any => {
            // A request that completed between the caller's last test and here is the
            // answer: attaching stops there. (Skipping it and waiting for the others
            // waited for ever when none of them completes: the skipped completion was
            // never looked at again.)
            let mut done = None;
            for (i, r) in reqs.iter_mut().enumerate() {
                if !r.is_live() {
                    continue;
                }
                if r.is_complete() {
                    done = Some(i);
                    break;
                }
                attached = i + 1;
                if sync.attach(&mut Own(&*r), i).is_err() {
                    foreign.push(i);
                    elsewhere = true;
                }
            }
            let found = if done.is_some() {
                done
            } else if elsewhere {
                // One of them completes outside our object: test every one.
                wait_polling(&[engine], reqs, Want::Any)
            } else {
                // Nothing attached means every request was taken already.
                sync.wait_any_with(hook).map(|c| c.data).or_else(|| first_done(reqs))
            };
            // Take the others back (those that completed meanwhile leave an event).
            for r in reqs.iter_mut() {
                if r.is_live() {
                    let _ = sync.detach(&mut Own(&*r));
                }
            }
            // A request completed by another thread while we detached it is reported as
            // `AlreadyComplete` as soon as its cell is marked complete, before the completer
            // has queued its event: drained now, the object would hand that event to this
            // thread's next wait as its answer. The object counts an attachment until its
            // event is queued, so once the count is zero (every request here is detached or
            // complete: it drops within the completers' delivery, with no progress needed)
            // the queue holds every event of this wait.
            if sync.size() != 0 {
                let _ = sync.wait_all();
            }
            while sync.query().is_some() {}
            found.or_else(|| first_done(reqs))
        }
    };
    // The completions our object took (and that are drained now) are the user's again: a
    // sync object they attach a request to after this wait gets its completion. Only those:
    // one that went to a user's object before the wait stays spent there.
    // (`delivery_spent` first: a request with nothing delivered has nothing to forget, and a
    // sent one then makes no cell.)
    for (i, r) in reqs[..attached].iter_mut().enumerate() {
        if r.is_live() && r.delivery_spent() && !foreign.contains(&i) {
            r.own_cell().forget_delivery();
        }
    }
    found
}

/// Waits for `want` by testing `reqs` between progress passes of every rank in `ranks`, and
/// sleeping (up to 1 ms at a time, never burning a core for long) while none of them has
/// anything to do. For waits that one rank's sync object cannot serve: requests of several
/// in-process ranks at once (one rank's progress alone would never complete the others'),
/// or a request attached to a sync object of the user's.
pub(crate) fn wait_polling<R: Waitable>(ranks: &[&Engine], reqs: &[R], want: Want) -> Option<usize> {
    wait_polling_walked(ranks, reqs, want, &mut Walk::default())
}

/// [`wait_polling`], recording in `walk` what its tests saw.
fn wait_polling_walked<R: Waitable>(ranks: &[&Engine], reqs: &[R], want: Want, walk: &mut Walk) -> Option<usize> {
    let mut idle = weft_sync::IdleBackoff::new();
    let mut nap = std::time::Duration::from_micros(20);
    let mut first = 0;
    loop {
        if let (true, found) = satisfied(reqs, want, &mut first, walk) {
            return found;
        }
        let mut progressed = false;
        for s in ranks {
            progressed |= s.progress_once().progressed();
        }
        if !progressed {
            // As the other waits do when idle: a pool task of one of the ranks.
            progressed = ranks.iter().any(|s| crate::executor::help(&s.executor));
        }
        if progressed {
            idle.reset();
            nap = std::time::Duration::from_micros(20);
        } else if !idle.is_completed() {
            idle.snooze();
        } else {
            std::thread::sleep(nap);
            nap = (nap * 2).min(std::time::Duration::from_millis(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    use crate::request::Request;
    use crate::{ProgressMode, Runtime, Source};

    /// A request that counts how often a wait takes its cell to attach it (or to forget a
    /// delivery).
    struct Counting<'r, 'c>(Request<'c, Vec<u8>>, &'r AtomicUsize);

    // SAFETY: the request's own.
    unsafe impl Attach for Counting<'_, '_> {
        fn completion_cell(&self) -> &weft_sync::CompletionCell {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.completion_cell()
        }
    }

    impl Waitable for Counting<'_, '_> {
        fn own_cell(&self) -> &weft_sync::CompletionCell {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.own_cell()
        }
        fn is_complete(&self) -> bool {
            self.0.is_complete()
        }
        fn settled(&self) -> Option<bool> {
            Waitable::settled(&self.0)
        }
        fn is_live(&self) -> bool {
            self.0.is_live()
        }
        fn engine(&self) -> &Arc<Engine> {
            Waitable::engine(&self.0)
        }
        fn context_id(&self) -> u32 {
            Waitable::context_id(&self.0)
        }
        fn part(&self) -> usize {
            Waitable::part(&self.0)
        }
    }

    /// A `wait_all` that parks for a window of receives completing in the order they were
    /// posted attaches the last one only, not every one (each attachment and its delivery
    /// cost the waiter atomic updates per message); the results are all there after it.
    #[test]
    fn wait_all_attaches_the_last_pending_request_only() {
        for mode in [ProgressMode::Owner, ProgressMode::Concurrent] {
            let ranks = Runtime::builder().env(false).progress(mode).workers(0).build_local(2).unwrap();
            let (a, b) = (ranks[0].world(), ranks[1].world());
            let cells = AtomicUsize::new(0);
            let mut reqs: Vec<_> = (0..32).map(|_| Counting(b.irecv(Vec::<u8>::with_capacity(1), 0u32, 4).unwrap(), &cells)).collect();
            let walk = std::thread::scope(|s| {
                s.spawn(|| {
                    // Late: the wait has attached and parked.
                    std::thread::sleep(Duration::from_millis(50));
                    for i in 0..32u8 {
                        a.send(vec![i], 1, 4).unwrap();
                    }
                });
                let engine = reqs[0].engine().clone();
                wait_all_walked(&engine, &mut reqs)
            });
            let cells = cells.load(Ordering::Relaxed);
            assert!(cells <= 2, "{mode:?}: the wait took {cells} cells to attach, not the last request's alone");
            assert_eq!(walk.none_failed(), Some(true), "{mode:?}: the wait's own tests saw every request");
            for (i, r) in reqs.iter_mut().enumerate() {
                assert_eq!(r.0.take().unwrap().unwrap().0, vec![i as u8], "{mode:?}");
            }
        }
    }

    /// A request of a `wait_any` that completes between the wait's last test and its attach
    /// (another thread's progress matched it) is the wait's answer. The wait skipped it and
    /// waited for the other requests only: with a receive that nothing matches among them,
    /// for ever (2 ranks x 4 threads in `Concurrent` mode hung in about one run of four).
    /// Here the receive is complete before `wait_attached` starts; the guard matches the
    /// other receive after a generous limit, so the broken wait fails instead of hanging.
    #[test]
    fn a_request_completed_before_the_attach_is_the_answer() {
        for mode in [ProgressMode::Owner, ProgressMode::Concurrent] {
            let rt = Runtime::builder().env(false).progress(mode).build().unwrap();
            let comm = rt.world();
            let data = comm.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
            let never = comm.irecv(Vec::<u8>::with_capacity(1), Source::Any, 2).unwrap();
            comm.send(vec![7u8], 0, 1).unwrap();
            while !data.is_complete() {
                let _ = rt.progress();
            }
            let mut reqs = [data, never];
            let (stop, stopped) = mpsc::channel::<()>();
            let found = std::thread::scope(|s| {
                s.spawn(move || {
                    if stopped.recv_timeout(Duration::from_secs(20)).is_err() {
                        comm.send(vec![0u8], 0, 2).unwrap();
                    }
                });
                let engine = reqs[0].engine().clone();
                let hook = ConcurrentWait { engine: &engine, attend: None };
                let found = with_wait_sync(|sync| wait_attached(sync, &hook, &engine, &mut reqs, Want::Any));
                let _ = stop.send(());
                found
            });
            assert_eq!(found, Some(0), "{mode:?}: the completed receive is the answer, not the one matched later");
            let [mut data, _never] = reqs;
            assert_eq!(data.take().unwrap().unwrap().0, vec![7u8]);
        }
    }

    /// A request whose completion went to a sync object of the user's before a wait, and
    /// that the wait passes over as complete, stays delivered: the wait gives back only the
    /// completions its own object took. (The fallback of `wait_attached_all` forgot every
    /// delivery in the range it attached, and the user's next attach of that request then
    /// queued its completion a second time.) Here `wait_attached` waits for a receive that
    /// another thread's send completes, with the delivered request before it.
    #[test]
    fn a_wait_gives_back_only_the_deliveries_it_took() {
        for mode in [ProgressMode::Owner, ProgressMode::Concurrent] {
            let rt = Runtime::builder().env(false).progress(mode).workers(0).build().unwrap();
            let comm = rt.world();
            let user = SyncObject::<u32>::new();
            let mut delivered = comm.irecv(Vec::<u8>::with_capacity(1), 0u32, 1).unwrap();
            comm.send(vec![1u8], 0, 1).unwrap();
            while !delivered.is_complete() {
                let _ = rt.progress();
            }
            user.attach(&mut delivered, 7).unwrap();
            assert_eq!(user.query().map(|c| c.data), Some(7));
            let pending = comm.irecv(Vec::<u8>::with_capacity(1), 0u32, 2).unwrap();
            let mut reqs = [delivered, pending];
            std::thread::scope(|s| {
                s.spawn(|| {
                    std::thread::sleep(Duration::from_millis(20));
                    comm.send(vec![2u8], 0, 2).unwrap();
                });
                let engine = reqs[0].engine().clone();
                let hook = ConcurrentWait { engine: &engine, attend: None };
                with_wait_sync(|sync| wait_attached(sync, &hook, &engine, &mut reqs, Want::All));
            });
            let [mut delivered, mut pending] = reqs;
            assert!(user.attach(&mut delivered, 8).is_err(), "{mode:?}: a completion the user's object took was given back");
            assert!(user.query().is_none(), "{mode:?}: a completion was queued twice");
            // The one the wait took is the user's again.
            user.attach(&mut pending, 9).unwrap();
            assert_eq!(user.query().map(|c| c.data), Some(9), "{mode:?}");
            assert_eq!(delivered.take().unwrap().unwrap().0, vec![1u8]);
            assert_eq!(pending.take().unwrap().unwrap().0, vec![2u8]);
        }
    }
}
