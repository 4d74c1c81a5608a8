//! Loom models of the completion-cell and sync-object protocols.
//!
//! Run with (release, or the models take minutes):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p weft-sync --release --test loom_sync
//! ```
//!
//! Each model keeps to two or three threads and one or two cells, so loom can explore every
//! interleaving within the preemption bound (`LOOM_MAX_PREEMPTIONS`, default 3 here). A lost
//! wakeup shows up as loom's "deadlock" failure; a double or missing delivery as an assertion.
#![cfg(loom)]

use std::future::poll_fn;

use loom::sync::Arc;
use loom::thread;
use weft_sync::{Attach, AttachError, Completion, CompletionCell, Detached, Error, Outcome, Status, SyncObject};

/// A request handle: the user side holds `Op`, the "transport" thread a clone of the cell.
struct Op(Arc<CompletionCell>);

// SAFETY: the `Arc` keeps the cell alive; each model completes a cell at most once.
unsafe impl Attach for Op {
    fn completion_cell(&self) -> &CompletionCell {
        &self.0
    }
}

impl Op {
    fn new() -> Op {
        Op(Arc::new(CompletionCell::new()))
    }
}

fn ok(tag: i32) -> Outcome {
    Ok(Status { source: 1, tag, bytes: 0 })
}

/// Runs `f` under loom with the preemption bound of `LOOM_MAX_PREEMPTIONS`, or 3, and prints
/// how many interleavings were explored (visible with `--nocapture`).
fn model<F: Fn() + Sync + Send + 'static>(name: &str, f: F) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    let start = std::time::Instant::now();
    b.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f();
    });
    let n = runs.load(std::sync::atomic::Ordering::Relaxed);
    println!("loom model {name}: {n} iterations in {:.2?} (preemption bound {:?})", start.elapsed(), b.preemption_bound);
    assert!(n > 1, "loom explored a single interleaving: the model has no race in it");
}

/// Drains the queue on one thread once everything has joined.
fn drain<T: Send + 'static>(sync: &SyncObject<T>) -> Vec<Completion<T>> {
    let mut out = Vec::new();
    while let Some(c) = sync.query() {
        out.push(c);
    }
    out
}

/// (a) Attach races complete on one cell: whichever wins, the completion is queued exactly
/// once, with the completer's outcome, and the counters settle at zero.
///
/// The model also checks that loom explored both orders, from what each side sees right
/// after its own call (nobody queries before the joins): the attacher sees an empty queue
/// only if the completer will deliver (attach won the state word), and the completer sees an
/// empty queue only if the attacher will deliver (complete won).
#[test]
fn attach_vs_complete() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let orders = std::sync::Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let seen = orders.clone();
    model("attach_vs_complete", move || {
        let sync = SyncObject::new();
        let mut op = Op::new();
        let cell = op.0.clone();
        let s = sync.clone();
        let completer = thread::spawn(move || {
            assert!(cell.complete(ok(7)));
            s.probe() == 0
        });
        sync.attach(&mut op, 5u32).unwrap();
        let attach_won = sync.probe() == 0;
        let complete_won = completer.join().unwrap();
        assert!(!(attach_won && complete_won));
        if attach_won {
            seen[0].fetch_add(1, Relaxed);
        }
        if complete_won {
            seen[1].fetch_add(1, Relaxed);
        }

        assert_eq!(sync.size(), 0);
        assert_eq!(sync.probe(), 1);
        assert_eq!(drain(&sync), [Completion { data: 5, outcome: ok(7) }]);
        assert_eq!(sync.probe(), 0);
        // Either way the completion is now taken: attaching the cell again is refused.
        let other = SyncObject::new();
        assert_eq!(other.attach(&mut op, 6u32), Err(AttachError::AlreadyAttached(6)));
    });
    let (a, c) = (orders[0].load(Relaxed), orders[1].load(Relaxed));
    println!("  attach won the state word in {a} interleavings, complete won in {c} (others: either)");
    assert!(a > 0 && c > 0, "loom did not explore both orders");
}

/// (a') The same race with data too large to sit inline (the boxed path), and with the
/// attaching thread querying as soon as it has attached.
#[test]
fn attach_vs_complete_boxed_with_query() {
    model("attach_vs_complete_boxed_with_query", || {
        let sync = SyncObject::new();
        let mut op = Op::new();
        let cell = op.0.clone();
        let completer = thread::spawn(move || assert!(cell.complete(ok(1))));
        sync.attach(&mut op, [9u64; 4]).unwrap();
        let early = sync.query();
        completer.join().unwrap();

        let mut got: Vec<_> = early.into_iter().collect();
        got.extend(drain(&sync));
        assert_eq!(got, [Completion { data: [9u64; 4], outcome: ok(1) }]);
        assert_eq!(sync.size(), 0);
    });
}

/// (b) Detach races complete: exactly one of "detached, data handed back, no event" and
/// "already complete, event queued". Both outcomes must be reached by some interleaving.
#[test]
fn detach_vs_complete() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let outcomes = std::sync::Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let seen = outcomes.clone();
    model("detach_vs_complete", move || {
        let sync = SyncObject::new();
        let mut op = Op::new();
        sync.attach(&mut op, 3u8).unwrap();
        let cell = op.0.clone();
        let completer = thread::spawn(move || assert!(cell.complete(ok(2))));
        let detached = sync.detach(&mut op);
        completer.join().unwrap();

        assert_eq!(sync.size(), 0);
        let events = drain(&sync);
        match detached {
            Detached::Detached(data) => {
                assert_eq!(data, Some(3));
                assert!(events.is_empty(), "detached and queued: {events:?}");
                seen[0].fetch_add(1, Relaxed);
            }
            Detached::AlreadyComplete => {
                assert_eq!(events, [Completion { data: 3, outcome: ok(2) }]);
                seen[1].fetch_add(1, Relaxed);
            }
            Detached::NotAttached => panic!("detach lost the attachment"),
        }
    });
    let (d, c) = (outcomes[0].load(Relaxed), outcomes[1].load(Relaxed));
    println!("  detached in {d} interleavings, already complete in {c}");
    assert!(d > 0 && c > 0, "loom did not explore both outcomes");
}

/// (b1) A waiter done with its object detaches a request that completes meanwhile and
/// empties the object for its next use (a runtime's blocking `wait_any`, whose object is
/// reused by the thread's next wait). `Detached::AlreadyComplete` comes as soon as the
/// completer has marked the cell, before it has queued the event; the object counts the
/// attachment until then, so the waiter waits for the count to reach zero (`wait_all`)
/// before draining, and no event arrives after the drain. Loom must reach the interleaving
/// in which the event was not queued yet when the detach answered (a drain at that point,
/// without the wait, misses the event, which the object's next user takes as its own).
#[test]
fn detach_vs_complete_then_empty() {
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    let late = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = late.clone();
    model("detach_vs_complete_then_empty", move || {
        let sync = SyncObject::new();
        let mut op = Op::new();
        sync.attach(&mut op, 3u8).unwrap();
        let cell = op.0.clone();
        let completer = thread::spawn(move || assert!(cell.complete(ok(2))));
        let detached = sync.detach(&mut op);
        let queued_at_detach = sync.probe();
        assert_eq!(sync.wait_all(), Ok(()));
        let events = drain(&sync);
        completer.join().unwrap();

        assert!(drain(&sync).is_empty(), "an event was queued after the object was emptied");
        assert_eq!((sync.size(), sync.probe()), (0, 0));
        match detached {
            Detached::Detached(data) => {
                assert_eq!(data, Some(3));
                assert!(events.is_empty(), "detached and queued: {events:?}");
            }
            Detached::AlreadyComplete => {
                assert_eq!(events, [Completion { data: 3, outcome: ok(2) }]);
                if queued_at_detach == 0 {
                    seen.fetch_add(1, Relaxed);
                }
            }
            Detached::NotAttached => panic!("detach lost the attachment"),
        }
    });
    let n = late.load(Relaxed);
    println!("  already complete with the event not queued yet in {n} interleavings");
    assert!(n > 0, "loom did not explore a detach answered before the event was queued");
}

/// (b') The cell's owner drops it (cancelling the attachment) while the sync object's last
/// user handle is dropped on another thread: the data is dropped once and nothing leaks.
#[test]
fn cancel_vs_object_drop() {
    model("cancel_vs_object_drop", || {
        let data = Arc::new(());
        let sync = SyncObject::new();
        let mut op = Op::new();
        sync.attach(&mut op, data.clone()).unwrap();
        let dropper = thread::spawn(move || drop(sync));
        drop(op);
        dropper.join().unwrap();
        // Loom's `Arc` also reports a leak of the object's shared state at the end.
        assert_eq!(Arc::strong_count(&data), 1, "completion data leaked");
    });
}

/// (b2) A request attached to object A, racing its completion, is attached to object B: the
/// attach must be refused whichever comes first, and the completion delivered once (to A).
/// A completed request whose event went to A is not a fresh completed request.
#[test]
fn reattach_elsewhere_vs_complete() {
    model("reattach_elsewhere_vs_complete", || {
        let a = SyncObject::new();
        let b = SyncObject::new();
        let mut op = Op::new();
        a.attach(&mut op, 1u8).unwrap();
        let cell = op.0.clone();
        // The attach runs on the spawned thread: loom's DPOR looks only at the last access to
        // an atomic, and with the roles the other way round it never lets the completer's
        // `fetch_or` overtake the attacher's load (the completer's own fast-path load hides it).
        let b2 = b.clone();
        let attacher = thread::spawn(move || b2.attach(&mut op, 2u8));
        assert!(cell.complete(ok(0)));
        let refused = attacher.join().unwrap();

        assert_eq!(refused, Err(AttachError::AlreadyAttached(2)));
        assert_eq!(drain(&a), [Completion { data: 1, outcome: ok(0) }]);
        assert!(drain(&b).is_empty(), "the completion was delivered twice");
        assert_eq!((a.size(), b.size()), (0, 0));
    });
}

/// (b3) A refused attach (the request is attached elsewhere) must not strand a thread waiting
/// on the object that refused it: the attempt counts the attachment before its CAS and takes
/// the count back after, and the waiter may have seen that count.
#[test]
fn refused_attach_vs_wait_all() {
    model("refused_attach_vs_wait_all", || {
        let a = SyncObject::new();
        let b = SyncObject::<u8>::new();
        let mut op = Op::new();
        a.attach(&mut op, 1u8).unwrap();
        let b2 = b.clone();
        let attacher = thread::spawn(move || {
            assert!(b2.attach(&mut op, 2).is_err());
            op
        });
        assert_eq!(b.wait_all(), Ok(()));
        let op = attacher.join().unwrap();
        assert_eq!((a.size(), b.size()), (1, 0));
        op.0.complete(ok(0));
        assert_eq!(drain(&a).len(), 1);
    });
}

/// (c) Two threads query concurrently (`query` and `query_bulk`) while a third completes two
/// cells: each completion is taken exactly once.
#[test]
fn concurrent_queries_vs_completions() {
    model("concurrent_queries_vs_completions", || {
        let sync = SyncObject::new();
        let mut cells = Vec::new();
        for i in 0..2u32 {
            let mut op = Op::new();
            cells.push(op.0.clone());
            sync.attach(&mut op, i).unwrap();
        }
        let completer = thread::spawn(move || {
            for c in &cells {
                assert!(c.complete(ok(0)));
            }
        });
        let s = sync.clone();
        let querier = thread::spawn(move || {
            let mut out = Vec::new();
            s.query_bulk(&mut out, 2);
            out
        });
        let mut got: Vec<u32> = sync.query().into_iter().map(|c| c.data).collect();
        got.extend(querier.join().unwrap().into_iter().map(|c| c.data));
        completer.join().unwrap();
        got.extend(drain(&sync).into_iter().map(|c| c.data));

        got.sort_unstable();
        assert_eq!(got, [0, 1], "each completion exactly once");
        assert_eq!((sync.size(), sync.probe()), (0, 0));
    });
}

/// (d) A thread blocks in `wait_all` (no progress hook) while another completes the last
/// attachment: the waiter must be woken (a lost wakeup is a loom deadlock).
#[test]
fn wait_all_vs_complete() {
    model("wait_all_vs_complete", || {
        let sync = SyncObject::<u8>::new();
        let mut op = Op::new();
        sync.attach(&mut op, 1).unwrap();
        let cell = op.0.clone();
        let completer = thread::spawn(move || assert!(cell.complete(ok(0))));
        assert_eq!(sync.wait_all(), Ok(()));
        assert_eq!(sync.size(), 0);
        // `wait_all` returned after the event was queued: it is visible now.
        assert_eq!(sync.query().map(|c| c.data), Some(1));
        completer.join().unwrap();
    });
}

/// (d') `wait_any` against two completions from another thread: both events are taken, then
/// `None`; no wakeup is lost between the per-event notification and the drained one.
#[test]
fn wait_any_vs_completions() {
    model("wait_any_vs_completions", || {
        let sync = SyncObject::new();
        let mut cells = Vec::new();
        for i in 0..2u8 {
            let mut op = Op::new();
            cells.push(op.0.clone());
            sync.attach(&mut op, i).unwrap();
        }
        let completer = thread::spawn(move || {
            for c in &cells {
                assert!(c.complete(ok(0)));
            }
        });
        let mut got = Vec::new();
        while let Some(c) = sync.wait_any() {
            got.push(c.data);
        }
        completer.join().unwrap();
        assert_eq!(got, [0, 1]);
    });
}

/// (d'') `wait_all` against a cell dropped (cancelled) on another thread.
#[test]
fn wait_all_vs_cancel() {
    model("wait_all_vs_cancel", || {
        let sync = SyncObject::<u8>::new();
        let mut op = Op::new();
        sync.attach_counted(&mut op).unwrap();
        let canceller = thread::spawn(move || drop(op));
        assert_eq!(sync.wait_all(), Err(Error::Cancelled));
        canceller.join().unwrap();
    });
}

/// (d''') A count taken ([`SyncObject::count_one`], a continuation attached) while another
/// thread finishes the last one pending (a callback counted down): the pending count holds
/// one reference to the object for all that is pending, taken as the count leaves zero and
/// given back as it returns there, and here it may leave and return twice. The object lives
/// until the last count is finished, also when the waiter drops its handle at once while the
/// finisher still notifies (loom's `Arc` reports a release too many, or a leak); the waiter
/// is woken (a lost wakeup is a loom deadlock) and returns only once both counts finished;
/// each count is counted once: its error is reported by one `wait_all`, the next finds none.
#[test]
fn count_one_vs_last_finish() {
    use loom::sync::atomic::{AtomicBool, Ordering};
    model("count_one_vs_last_finish", || {
        let sync = SyncObject::<()>::new();
        let first = sync.count_one();
        let finisher = thread::spawn(move || first.complete(Err(Error::Cancelled)));
        let second = sync.count_one();
        let finished = Arc::new(AtomicBool::new(false));
        let f = finished.clone();
        let second_finisher = thread::spawn(move || {
            f.store(true, Ordering::Relaxed);
            second.complete(Ok(Status::default()));
        });
        assert_eq!(sync.wait_all(), Err(Error::Cancelled), "the first count's error, once both finished");
        assert!(finished.load(Ordering::Relaxed), "wait_all returned before the second count finished");
        assert_eq!(sync.size(), 0);
        assert_eq!(sync.wait_all(), Ok(()), "an error is reported once");
        drop(sync);
        finisher.join().unwrap();
        second_finisher.join().unwrap();
    });
}

/// (e) Waker registration in `poll_complete` races `complete`: the task is woken (or sees
/// the completion while registering) and reads the completer's outcome.
#[test]
fn poll_complete_vs_complete() {
    model("poll_complete_vs_complete", || {
        let cell = Arc::new(CompletionCell::new());
        let c = cell.clone();
        let completer = thread::spawn(move || assert!(c.complete(Err(Error::PeerLost { rank: 4 }))));
        let got = loom::future::block_on(poll_fn(|cx| cell.poll_complete(cx)));
        assert_eq!(got, Err(Error::PeerLost { rank: 4 }));
        completer.join().unwrap();
    });
}

/// (e') An attached cell that is also polled: the completion reaches the queue and the waker.
#[test]
fn poll_attached_vs_complete() {
    model("poll_attached_vs_complete", || {
        let sync = SyncObject::new();
        let mut op = Op::new();
        sync.attach(&mut op, 8u8).unwrap();
        let c = op.0.clone();
        let completer = thread::spawn(move || assert!(c.complete(ok(3))));
        let got = loom::future::block_on(poll_fn(|cx| op.0.poll_complete(cx)));
        assert_eq!(got, ok(3));
        completer.join().unwrap();
        assert_eq!(drain(&sync), [Completion { data: 8, outcome: ok(3) }]);
    });
}

/// The `next()` future (event-listener registration in a task) against a completion.
#[test]
fn next_vs_complete() {
    model("next_vs_complete", || {
        let sync = SyncObject::new();
        let mut op = Op::new();
        sync.attach(&mut op, 2u8).unwrap();
        let c = op.0.clone();
        let completer = thread::spawn(move || assert!(c.complete(ok(0))));
        let got = loom::future::block_on(sync.next());
        assert_eq!(got.map(|c| c.data), Some(2));
        completer.join().unwrap();
    });
}

/// `Signal`'s skip-when-nobody-listens fast path loses no wake-up: a waiter that checks,
/// listens, re-checks and blocks is always woken by a notifier that sets the flag and then
/// notifies (loom reports a deadlock otherwise), with a second notifier racing on the count.
#[test]
fn signal_listen_vs_notify() {
    use loom::sync::atomic::{AtomicBool, Ordering};
    use weft_sync::Signal;
    model("signal_listen_vs_notify", || {
        let s = Arc::new((Signal::new(), AtomicBool::new(false), AtomicBool::new(false)));
        let n1 = {
            let s = s.clone();
            thread::spawn(move || {
                s.1.store(true, Ordering::Relaxed);
                s.0.notify(1);
            })
        };
        let n2 = {
            let s = s.clone();
            thread::spawn(move || {
                s.2.store(true, Ordering::Relaxed);
                s.0.notify_additional(1);
            })
        };
        // Waits for both flags, one listen / re-check / wait round at a time.
        while !(s.1.load(Ordering::Relaxed) && s.2.load(Ordering::Relaxed)) {
            let l = s.0.listen();
            if s.1.load(Ordering::Relaxed) && s.2.load(Ordering::Relaxed) {
                break;
            }
            l.wait();
        }
        n1.join().unwrap();
        n2.join().unwrap();
    });
}

/// A cell marked held, shared by an owner `Arc` and a holder that has only its address
/// (as matching holds a posted receive: no count of its own).
fn held_cell() -> Arc<CompletionCell> {
    let mut cell = CompletionCell::new();
    cell.mark_held();
    Arc::new(cell)
}

/// The holder's uncounted reference, sent to its thread.
struct Raw(*const CompletionCell);
// SAFETY: the models keep the cell alive by the protocol under test.
unsafe impl Send for Raw {}

impl Raw {
    /// The holder's view of the cell.
    ///
    /// # Safety
    /// The protocol must keep the cell alive (the owner's reference, or one left to us).
    unsafe fn cell(&self) -> &CompletionCell {
        // SAFETY: per the contract.
        unsafe { &*self.0 }
    }

    /// A counted reference of the holder's own, taken while the cell is alive.
    fn count(&self) -> Arc<CompletionCell> {
        // SAFETY: `self.0` came from `Arc::as_ptr`, and the cell is alive (see callers).
        unsafe {
            Arc::increment_strong_count(self.0);
            Arc::from_raw(self.0)
        }
    }

    /// The reference the owner left to the holder.
    fn inherit(&self) -> Arc<CompletionCell> {
        // SAFETY: called once, after the cell said the owner left its reference.
        unsafe { Arc::from_raw(self.0) }
    }
}

/// The owner's side of `leave`: its reference dropped, or given to the holder (forgotten
/// here). An owner that keeps it finds the cell complete with `done`, if given (a holder
/// that had not counted one of its own).
fn let_go(owner: Arc<CompletionCell>, done: Option<Outcome>) {
    if owner.leave() {
        std::mem::forget(owner);
        return;
    }
    if let Some(o) = done {
        assert_eq!(owner.outcome(), Some(o), "the owner keeps its reference only once complete");
    }
    drop(owner);
}

/// (f) An owner lets go of a pending held operation (`leave`) while its holder completes
/// it (`complete_held`): exactly one of the two drops the owner's reference, so the cell is
/// freed once (loom reports a leak otherwise) and never under the other.
#[test]
fn leave_vs_complete_held() {
    model("leave_vs_complete_held", || {
        let owner = held_cell();
        let raw = Raw(Arc::as_ptr(&owner));
        let holder = thread::spawn(move || {
            // SAFETY: the owner's reference keeps the cell alive until it leaves, and then
            // the reference is ours until we drop it below.
            let (left, pinned) = unsafe { raw.cell() }.complete_held(ok(5), || raw.count());
            assert!(pinned.is_none(), "nothing to deliver, nothing pinned");
            if left {
                drop(raw.inherit());
            }
        });
        let_go(owner, Some(ok(5)));
        holder.join().unwrap();
    });
}

/// (g) An owner leaves while its holder takes a count of its own (`hold_counted`, a
/// rendezvous read starting) and completes by it: each reference dropped once.
#[test]
fn leave_vs_hold_counted() {
    model("leave_vs_hold_counted", || {
        let owner = held_cell();
        let raw = Raw(Arc::as_ptr(&owner));
        let holder = thread::spawn(move || {
            let own = raw.count();
            if own.hold_counted() {
                drop(raw.inherit());
            }
            assert!(own.complete(ok(6)));
        });
        let_go(owner, None);
        holder.join().unwrap();
    });
}

/// A waker that checks, when woken, that the cell it waits on was not recycled yet: a wake
/// is a completion's last use of the cell.
struct CheckedWaker(Arc<loom::sync::atomic::AtomicBool>);

impl std::task::Wake for CheckedWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        assert!(!self.0.load(loom::sync::atomic::Ordering::Acquire), "a delivery ran on a recycled cell");
    }
}

/// (h) An owner polls a held cell once (a waker registered), then tests it until complete,
/// while its holder completes it: a delivery to the waker runs under a reference the holder
/// pinned before `COMPLETE`, so an owner that sees the completion and finds itself alone
/// (and recycles the cell) never does so before the delivery's last use of the cell, the
/// wake (checked by the waker).
#[test]
fn poll_vs_complete_held() {
    use loom::sync::atomic::{AtomicBool, Ordering};
    model("poll_vs_complete_held", || {
        let mut owner = held_cell();
        let recycled = Arc::new(AtomicBool::new(false));
        let waker = std::task::Waker::from(std::sync::Arc::new(CheckedWaker(recycled.clone())));
        let raw = Raw(Arc::as_ptr(&owner));
        let holder = thread::spawn(move || {
            // SAFETY: the owner keeps its reference until it sees the completion; after it
            // the holder touches the cell only through what it pinned.
            let (left, pinned) = unsafe { raw.cell() }.complete_held(ok(7), || raw.count());
            assert!(!left);
            drop(pinned);
        });
        let _ = owner.poll_complete(&mut std::task::Context::from_waker(&waker));
        while !owner.is_complete() {
            thread::yield_now();
        }
        assert_eq!(owner.outcome(), Some(ok(7)));
        if let Some(cell) = Arc::get_mut(&mut owner) {
            // Alone: recycled (exclusive access, as the operations' pool takes it).
            recycled.store(true, Ordering::Release);
            cell.reset();
        }
        holder.join().unwrap();
    });
}
