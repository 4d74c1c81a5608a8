//! Behaviour of `CompletionCell` and `SyncObject` (the `MPIX_Sync` of [Patinyasakdikul 2019, App. B]),
//! one property per test. The concurrent protocols are model-checked in `loom_sync.rs` and
//! hammered in `stress.rs`; here each API call is checked for the values it reports.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use futures::task::{noop_waker, ArcWake};
use futures::StreamExt;
use weft_sync::{
    Attach, AttachError, Completion, CompletionCell, Detached, Error, Outcome, Progress, SignalListener, Status, Step, SyncObject,
};

/// A stand-in for a runtime request: the user holds `Op`, the "transport" holds a clone of
/// the cell and completes it.
struct Op(Arc<CompletionCell>);

// SAFETY: the cell is kept alive by the `Arc` (the transport side holds a clone until it
// completes the cell), and each test completes a cell at most once per cycle.
unsafe impl Attach for Op {
    fn completion_cell(&self) -> &CompletionCell {
        &self.0
    }
}

impl Op {
    fn new() -> Op {
        Op(Arc::new(CompletionCell::new()))
    }

    fn cell(&self) -> Arc<CompletionCell> {
        self.0.clone()
    }
}

fn ok(tag: i32) -> Outcome {
    Ok(Status { source: 3, tag, bytes: 8 })
}

/// Counts its drops in a counter owned by the test (no global state, tests run in parallel).
#[derive(Debug)]
struct Tracked<P> {
    id: u64,
    /// Makes the value small (inline in the attachment) or large (boxed).
    _pad: P,
    drops: Arc<AtomicUsize>,
}

impl<P> Drop for Tracked<P> {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn send_and_sync() {
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<CompletionCell>();
    is_send_sync::<SyncObject<u64>>();
    is_send_sync::<SyncObject<String>>();
}

#[test]
fn attach_then_complete() {
    let sync = SyncObject::new();
    let mut op = Op::new();
    let cell = op.cell();
    sync.attach(&mut op, 11u32).unwrap();
    assert!(cell.is_attached());
    assert_eq!((sync.size(), sync.probe()), (1, 0));
    assert!(sync.query().is_none(), "MPIX_SYNC_EMPTY before completion");

    assert!(cell.complete(ok(5)));
    assert!(cell.is_complete());
    assert!(!cell.is_attached(), "a completed cell is detached automatically");
    assert_eq!(cell.outcome(), Some(ok(5)));
    assert_eq!((sync.size(), sync.probe()), (0, 1));

    assert_eq!(sync.query(), Some(Completion { data: 11, outcome: ok(5) }));
    assert_eq!((sync.size(), sync.probe()), (0, 0));
    assert!(sync.query().is_none());
}

#[test]
fn complete_then_attach_is_queued_at_once() {
    let sync = SyncObject::new();
    let mut op = Op::new();
    assert!(op.0.complete(Err(Error::PeerLost { rank: 2 })));
    sync.attach(&mut op, "late").unwrap();
    assert_eq!((sync.size(), sync.probe()), (0, 1));
    let c = sync.query().expect("queued at attach time");
    assert_eq!(c.data, "late");
    assert_eq!(c.status(), Err(Error::PeerLost { rank: 2 }));
    // Nothing left to wait for.
    assert_eq!(sync.wait_all(), Ok(()));
    assert!(sync.wait_any().is_none());
}

#[test]
fn attach_twice_hands_the_data_back() {
    let a = SyncObject::new();
    let b = SyncObject::new();
    let mut op = Op::new();
    a.attach(&mut op, String::from("first")).unwrap();
    assert_eq!(a.attach(&mut op, String::from("again")), Err(AttachError::AlreadyAttached(String::from("again"))));
    assert_eq!(b.attach(&mut op, String::from("other")), Err(AttachError::AlreadyAttached(String::from("other"))));
    assert_eq!(b.attach_counted(&mut op), Err(AttachError::AlreadyAttached(())));
    // The refused attaches left no count behind.
    assert_eq!((a.size(), b.size()), (1, 0));
    assert!(AttachError::AlreadyAttached(1).to_string().contains("already attached"));

    op.0.complete(ok(1));
    assert_eq!(a.query().map(|c| c.data), Some(String::from("first")));
    assert!(b.query().is_none());
    assert_eq!((a.size(), b.size()), (0, 0));
}

#[test]
fn detach_before_completion_returns_data_and_no_event() {
    let sync = SyncObject::new();
    let mut op = Op::new();
    let mut other = Op::new();
    sync.attach(&mut op, 7u64).unwrap();
    sync.attach(&mut other, 8u64).unwrap();
    assert_eq!(sync.size(), 2);

    assert_eq!(sync.detach(&mut op), Detached::Detached(Some(7)));
    assert_eq!(sync.size(), 1);
    assert!(!op.0.is_attached());
    // Detaching again: nothing attached any more.
    assert_eq!(sync.detach(&mut op), Detached::NotAttached);

    // Completing the detached request generates no event.
    assert!(op.0.complete(ok(0)));
    assert_eq!((sync.size(), sync.probe()), (1, 0));
    assert!(sync.query().is_none());

    other.0.complete(ok(1));
    assert_eq!(sync.query().map(|c| c.data), Some(8));
    assert!(sync.query().is_none());
}

#[test]
fn detach_after_completion_is_already_complete() {
    let sync = SyncObject::new();
    let mut op = Op::new();
    sync.attach(&mut op, 1u8).unwrap();
    op.0.complete(ok(0));
    assert_eq!(sync.detach(&mut op), Detached::AlreadyComplete);
    // The event stays queued: detach after completion does not take it away.
    assert_eq!(sync.probe(), 1);
    assert_eq!(sync.query().map(|c| c.data), Some(1));
}

#[test]
fn detach_from_the_wrong_object_is_not_attached() {
    let a = SyncObject::new();
    let b = SyncObject::<i32>::new();
    let mut op = Op::new();
    let mut never = Op::new();
    assert_eq!(a.detach(&mut never), Detached::NotAttached);
    a.attach(&mut op, 5i32).unwrap();
    assert_eq!(b.detach(&mut op), Detached::NotAttached);
    // Still attached to `a`, and still counted there.
    assert!(op.0.is_attached());
    assert_eq!((a.size(), b.size()), (1, 0));
    op.0.complete(ok(2));
    assert_eq!(a.query().map(|c| c.data), Some(5));
}

#[test]
fn counted_attach_counts_but_queues_nothing() {
    let sync = SyncObject::<u32>::new();
    let mut ops: Vec<Op> = (0..3).map(|_| Op::new()).collect();
    for op in &mut ops {
        sync.attach_counted(op).unwrap();
    }
    assert_eq!((sync.size(), sync.probe()), (3, 0));
    ops[0].0.complete(ok(0));
    ops[1].0.complete(ok(1));
    assert_eq!((sync.size(), sync.probe()), (1, 0));
    assert!(sync.query().is_none());
    // A counted attachment detaches with no data.
    assert_eq!(sync.detach(&mut ops[2]), Detached::Detached(None));
    assert_eq!(sync.size(), 0);
    assert_eq!(sync.wait_all(), Ok(()));
    assert!(sync.wait_any().is_none(), "a counted completion is no event");
}

#[test]
fn counted_attach_error_is_reported_by_wait_all_once() {
    let sync = SyncObject::<u32>::new();
    let mut ops: Vec<Op> = (0..3).map(|_| Op::new()).collect();
    for op in &mut ops {
        sync.attach_counted(op).unwrap();
    }
    ops[0].0.complete(ok(0));
    ops[1].0.complete(Err(Error::Truncated { message_len: 9, buffer_len: 4 }));
    ops[2].0.complete(Err(Error::PeerLost { rank: 1 }));
    assert_eq!(sync.probe(), 0);
    // The first error is reported, once.
    assert_eq!(sync.wait_all(), Err(Error::Truncated { message_len: 9, buffer_len: 4 }));
    assert_eq!(sync.wait_all(), Ok(()));
}

/// A count without a cell (`count_one`) is counted like a counted attachment: its error is
/// reported by `wait_all`, and one dropped uncompleted counts as cancelled; a waiter parked
/// on the count is woken by the last one.
#[test]
fn counted_without_a_cell_counts_and_reports_its_error() {
    let sync = SyncObject::<u32>::new();
    let (a, b, c) = (sync.count_one(), sync.count_one(), sync.count_one());
    assert_eq!((sync.size(), sync.probe()), (3, 0));
    a.complete(ok(0));
    b.complete(Err(Error::PeerLost { rank: 2 }));
    assert_eq!(sync.size(), 1);
    let waiter = {
        let sync = sync.clone();
        thread::spawn(move || sync.wait_all())
    };
    drop(c);
    assert_eq!(waiter.join().unwrap(), Err(Error::PeerLost { rank: 2 }));
    assert_eq!(sync.size(), 0);
    let d = sync.count_one();
    drop(d);
    assert_eq!(sync.wait_all(), Err(Error::Cancelled));
    assert!(sync.query().is_none(), "a count queues no event");
}

#[test]
fn errors_of_data_attachments_are_events_not_wait_all_errors() {
    let sync = SyncObject::new();
    let mut op = Op::new();
    sync.attach(&mut op, 'x').unwrap();
    op.0.complete(Err(Error::CommFreed));
    assert_eq!(sync.wait_all(), Ok(()));
    assert_eq!(sync.query(), Some(Completion { data: 'x', outcome: Err(Error::CommFreed) }));
}

#[test]
fn query_bulk_respects_max() {
    let sync = SyncObject::new();
    let mut ops: Vec<Op> = (0..10).map(|_| Op::new()).collect();
    for (i, op) in ops.iter_mut().enumerate() {
        sync.attach(op, i).unwrap();
    }
    let mut out = Vec::new();
    assert_eq!(sync.query_bulk(&mut out, 100), 0, "nothing complete yet");
    for (i, op) in ops.iter().enumerate() {
        op.0.complete(ok(i as i32));
    }
    assert_eq!((sync.size(), sync.probe()), (0, 10));

    assert_eq!(sync.query_bulk(&mut out, 0), 0);
    assert!(out.is_empty());
    assert_eq!(sync.query_bulk(&mut out, 3), 3);
    assert_eq!(sync.probe(), 7);
    // First come, first served, and the outcome travels with the data.
    assert_eq!(out.iter().map(|c| c.data).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(out.iter().all(|c| c.outcome == ok(c.data as i32)));
    // Appends; `max` larger than the queue takes what there is.
    assert_eq!(sync.query_bulk(&mut out, 100), 7);
    assert_eq!(out.iter().map(|c| c.data).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
    assert_eq!(sync.probe(), 0);
    assert_eq!(sync.query_bulk(&mut out, 100), 0);
}

#[test]
fn size_and_probe_track_attach_complete_query() {
    let sync = SyncObject::new();
    assert_eq!((sync.size(), sync.probe()), (0, 0));
    let mut ops: Vec<Op> = (0..5).map(|_| Op::new()).collect();
    for (i, op) in ops.iter_mut().enumerate() {
        sync.attach(op, i).unwrap();
        assert_eq!(sync.size(), i + 1);
    }
    ops[4].0.complete(ok(4));
    ops[1].0.complete(ok(1));
    assert_eq!((sync.size(), sync.probe()), (3, 2));
    assert_eq!(sync.query().map(|c| c.data), Some(4), "queue order is completion order");
    assert_eq!((sync.size(), sync.probe()), (3, 1));
    assert_eq!(sync.detach(&mut ops[0]), Detached::Detached(Some(0)));
    assert_eq!((sync.size(), sync.probe()), (2, 1));
    let dbg = format!("{sync:?}");
    assert!(dbg.contains("size: 2") && dbg.contains("probe: 1"), "{dbg}");
    // A clone is a handle to the same object.
    let clone = sync.clone();
    ops[2].0.complete(ok(2));
    assert_eq!((clone.size(), clone.probe()), (1, 2));
    assert_eq!(clone.query().map(|c| c.data), Some(1));
    assert_eq!(sync.query().map(|c| c.data), Some(2));
}

/// Drives every path that moves user data: inline and boxed, queued, detached, refused,
/// cancelled, and left in the queue when the object is dropped. Each value is dropped once.
fn drop_accounting<P: Default + Send + std::fmt::Debug + 'static>() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut made = 0u64;
    let mut mk = |drops: &Arc<AtomicUsize>| {
        made += 1;
        Tracked { id: made, _pad: P::default(), drops: drops.clone() }
    };
    {
        let sync = SyncObject::new();
        let other = SyncObject::new();
        let mut ops: Vec<Op> = (0..6).map(|_| Op::new()).collect();
        for op in ops.iter_mut() {
            sync.attach(op, mk(&drops)).unwrap();
        }
        // Refused attach: the data comes back and is dropped here.
        let AttachError::AlreadyAttached(back) = other.attach(&mut ops[0], mk(&drops)).unwrap_err();
        assert_eq!(back.id, 7);
        drop(back);
        assert_eq!(drops.load(Ordering::SeqCst), 1);

        // Completed and queried: the user owns (and drops) the data.
        ops[0].0.complete(ok(0));
        let c = sync.query().unwrap();
        assert_eq!(c.data.id, 1);
        drop(c);
        assert_eq!(drops.load(Ordering::SeqCst), 2);

        // Detached: data handed back.
        match sync.detach(&mut ops[1]) {
            Detached::Detached(Some(t)) => assert_eq!(t.id, 2),
            other => panic!("expected the data back, got {other:?}"),
        }
        assert_eq!(drops.load(Ordering::SeqCst), 3);

        // Cancelled by dropping the last handle of the cell: a `Cancelled` event with the data.
        let op = ops.remove(2);
        drop(op);
        let c = sync.query().unwrap();
        assert_eq!((c.data.id, c.outcome), (3, Err(Error::Cancelled)));
        drop(c);
        assert_eq!(drops.load(Ordering::SeqCst), 4);

        // Completed but never queried: dropped with the object.
        ops[2].0.complete(ok(3));
        // Complete-then-attach on the other object: queued there at once.
        let mut late = Op::new();
        late.0.complete(ok(9));
        other.attach(&mut late, mk(&drops)).unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 4);
        drop(other);
        assert_eq!(drops.load(Ordering::SeqCst), 5);

        // ops[3], ops[4] still attached when the object handle goes: the attachments keep the
        // object alive; dropping the cells cancels them, and the events die with the object.
        drop(sync);
        assert_eq!(drops.load(Ordering::SeqCst), 5);
        drop(ops);
    }
    assert_eq!(made, 8);
    assert_eq!(drops.load(Ordering::SeqCst), 8, "every value dropped exactly once");
}

#[test]
fn drop_accounting_inline_data() {
    assert!(std::mem::size_of::<Tracked<()>>() <= 16);
    drop_accounting::<()>();
}

#[test]
fn drop_accounting_boxed_data() {
    assert!(std::mem::size_of::<Tracked<[u64; 8]>>() > 16);
    drop_accounting::<[u64; 8]>();
}

#[test]
fn large_data_round_trips() {
    #[derive(Debug, Clone, PartialEq)]
    struct Big([u64; 16], String);
    let sync = SyncObject::new();
    let mut ops: Vec<Op> = (0..4).map(|_| Op::new()).collect();
    let value = |i: u64| Big(std::array::from_fn(|k| i * 100 + k as u64), format!("op{i}"));
    for (i, op) in ops.iter_mut().enumerate() {
        sync.attach(op, value(i as u64)).unwrap();
    }
    assert_eq!(sync.detach(&mut ops[3]), Detached::Detached(Some(value(3))));
    for op in &ops[..3] {
        op.0.complete(ok(0));
    }
    let mut out = Vec::new();
    assert_eq!(sync.query_bulk(&mut out, 10), 3);
    assert_eq!(out.into_iter().map(|c| c.data).collect::<Vec<_>>(), [value(0), value(1), value(2)]);
}

#[test]
fn object_handle_dropped_before_completion() {
    // The attachment owns the object's shared state; completing after every user handle is
    // gone must not touch freed memory (miri/ASan would see it) and drops the data.
    let drops = Arc::new(AtomicUsize::new(0));
    let mut op = Op::new();
    let cell = op.cell();
    let sync = SyncObject::new();
    sync.attach(&mut op, Tracked { id: 1, _pad: [0u8; 40], drops: drops.clone() }).unwrap();
    drop(sync);
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    assert!(cell.complete(ok(1)));
    assert_eq!(drops.load(Ordering::SeqCst), 1);
}

#[test]
fn dropped_cell_delivers_cancelled() {
    let sync = SyncObject::new();
    let mut op = Op::new();
    sync.attach(&mut op, 42u16).unwrap();
    drop(op);
    assert_eq!(sync.size(), 0);
    assert_eq!(sync.query(), Some(Completion { data: 42, outcome: Err(Error::Cancelled) }));
    assert_eq!(sync.wait_all(), Ok(()));
}

#[test]
fn dropped_counted_cell_reports_cancelled_to_wait_all() {
    let sync = SyncObject::<u8>::new();
    let mut op = Op::new();
    sync.attach_counted(&mut op).unwrap();
    drop(op);
    assert_eq!(sync.wait_all(), Err(Error::Cancelled));
}

#[test]
fn reset_makes_a_cell_reusable() {
    let sync = SyncObject::new();
    let mut cell = CompletionCell::new();
    assert!(cell.complete(ok(1)));
    assert_eq!(cell.outcome(), Some(ok(1)));
    cell.reset();
    assert!(!cell.is_complete());
    assert_eq!(cell.outcome(), None);

    // Reused for an attachment.
    struct Borrowed<'a>(&'a CompletionCell);
    // SAFETY: the cell outlives the borrow and is completed at most once per cycle.
    unsafe impl Attach for Borrowed<'_> {
        fn completion_cell(&self) -> &CompletionCell {
            self.0
        }
    }
    sync.attach(&mut Borrowed(&cell), 1u8).unwrap();
    assert!(cell.complete(ok(2)));
    assert_eq!(sync.query(), Some(Completion { data: 1, outcome: ok(2) }));

    // Reset while attached (the operation never completed) cancels the attachment.
    cell.reset();
    sync.attach(&mut Borrowed(&cell), 2u8).unwrap();
    assert_eq!(sync.size(), 1);
    cell.reset();
    assert_eq!(sync.size(), 0);
    assert_eq!(sync.query(), Some(Completion { data: 2, outcome: Err(Error::Cancelled) }));
    assert!(!cell.is_attached() && !cell.is_complete());

    // And a third cycle completes normally.
    sync.attach(&mut Borrowed(&cell), 3u8).unwrap();
    assert!(cell.complete(ok(3)));
    assert_eq!(sync.query(), Some(Completion { data: 3, outcome: ok(3) }));
}

#[test]
fn complete_twice_returns_false_and_keeps_the_first_outcome() {
    let sync = SyncObject::new();
    let mut op = Op::new();
    sync.attach(&mut op, 0u8).unwrap();
    assert!(op.0.complete(ok(1)));
    assert!(!op.0.complete(Err(Error::Cancelled)));
    assert_eq!(op.0.outcome(), Some(ok(1)));
    assert_eq!(sync.probe(), 1, "the second completion delivered nothing");
    assert_eq!(sync.query().map(|c| c.outcome), Some(ok(1)));
    assert!(sync.query().is_none());
}

/// A waker that counts its wakes.
struct CountingWaker(AtomicUsize);

impl ArcWake for CountingWaker {
    fn wake_by_ref(arc_self: &Arc<Self>) {
        arc_self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[test]
fn poll_complete_with_noop_waker() {
    let cell = CompletionCell::new();
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    assert_eq!(cell.poll_complete(&mut cx), Poll::Pending);
    assert_eq!(cell.poll_complete(&mut cx), Poll::Pending, "re-registering the same waker");
    assert!(cell.complete(ok(4)));
    assert_eq!(cell.poll_complete(&mut cx), Poll::Ready(ok(4)));
}

#[test]
fn poll_complete_wakes_the_latest_waker_once() {
    let cell = CompletionCell::new();
    let first = Arc::new(CountingWaker(AtomicUsize::new(0)));
    let second = Arc::new(CountingWaker(AtomicUsize::new(0)));
    let w1 = futures::task::waker(first.clone());
    let w2 = futures::task::waker(second.clone());
    assert!(cell.poll_complete(&mut Context::from_waker(&w1)).is_pending());
    assert!(cell.poll_complete(&mut Context::from_waker(&w2)).is_pending());
    assert!(cell.complete(Err(Error::PeerLost { rank: 0 })));
    assert_eq!(first.0.load(Ordering::SeqCst), 0, "replaced waker is not woken");
    assert_eq!(second.0.load(Ordering::SeqCst), 1);
    assert_eq!(cell.poll_complete(&mut Context::from_waker(&w2)), Poll::Ready(Err(Error::PeerLost { rank: 0 })));
}

#[test]
fn poll_complete_under_block_on_from_another_thread() {
    let cell = Arc::new(CompletionCell::new());
    let c2 = cell.clone();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(20));
        c2.complete(ok(8))
    });
    let got = block_on(std::future::poll_fn(|cx| cell.poll_complete(cx)));
    assert_eq!(got, ok(8));
    assert!(t.join().unwrap());
}

#[test]
fn attached_and_polled_cell_notifies_both() {
    let sync = SyncObject::new();
    let mut op = Op::new();
    let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
    let w = futures::task::waker(counter.clone());
    assert!(op.0.poll_complete(&mut Context::from_waker(&w)).is_pending());
    sync.attach(&mut op, 1u8).unwrap();
    assert!(op.0.complete(ok(1)));
    assert_eq!(counter.0.load(Ordering::SeqCst), 1);
    assert_eq!(sync.query().map(|c| c.data), Some(1));
}

/// `n` attached operations, completed from another thread after `delay`, in order.
fn complete_later(sync: &SyncObject<u64>, n: u64, delay: Duration) -> thread::JoinHandle<()> {
    let mut cells = Vec::new();
    for i in 0..n {
        let mut op = Op::new();
        cells.push(op.cell());
        sync.attach(&mut op, i).unwrap();
    }
    thread::spawn(move || {
        for (i, c) in cells.iter().enumerate() {
            thread::sleep(delay);
            assert!(c.complete(ok(i as i32)));
        }
    })
}

#[test]
fn next_await_with_completions_from_another_thread() {
    let sync = SyncObject::new();
    let t = complete_later(&sync, 3, Duration::from_millis(5));
    let got = block_on(async {
        let mut got = Vec::new();
        while let Some(c) = sync.next().await {
            assert_eq!(c.outcome, ok(c.data as i32));
            got.push(c.data);
        }
        got
    });
    assert_eq!(got, [0, 1, 2]);
    t.join().unwrap();
    assert!(block_on(sync.next()).is_none());
}

#[test]
fn stream_ends_when_nothing_remains() {
    let sync = SyncObject::new();
    let t = complete_later(&sync, 5, Duration::from_millis(2));
    let got: Vec<u64> = block_on(sync.completions().map(|c| c.data).collect());
    assert_eq!(got, [0, 1, 2, 3, 4]);
    t.join().unwrap();
    assert_eq!((sync.size(), sync.probe()), (0, 0));
    // An empty object's stream is empty.
    let empty = SyncObject::<u8>::new();
    assert_eq!(block_on(empty.completions().count()), 0);
}

#[test]
fn wait_any_takes_events_then_returns_none() {
    let sync = SyncObject::<u64>::new();
    assert!(sync.wait_any().is_none(), "nothing attached");
    let t = complete_later(&sync, 4, Duration::from_millis(3));
    let mut got = Vec::new();
    while let Some(c) = sync.wait_any() {
        got.push(c.data);
    }
    assert_eq!(got, [0, 1, 2, 3]);
    t.join().unwrap();
    assert!(sync.wait_any().is_none());
}

#[test]
fn wait_all_blocks_until_another_thread_completes() {
    let sync = SyncObject::new();
    let start = Instant::now();
    let t = complete_later(&sync, 2, Duration::from_millis(40));
    assert_eq!(sync.wait_all(), Ok(()));
    assert!(start.elapsed() >= Duration::from_millis(80), "returned before the completions");
    assert_eq!((sync.size(), sync.probe()), (0, 2), "events stay queued after wait_all");
    t.join().unwrap();
}

#[test]
fn concurrent_wait_any_waiters_each_get_distinct_events() {
    let sync = SyncObject::new();
    let t = complete_later(&sync, 40, Duration::from_micros(200));
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let s = sync.clone();
            thread::spawn(move || {
                let mut got = Vec::new();
                while let Some(c) = s.wait_any() {
                    got.push(c.data);
                }
                got
            })
        })
        .collect();
    let mut all: Vec<u64> = waiters.into_iter().flat_map(|w| w.join().unwrap()).collect();
    t.join().unwrap();
    all.sort_unstable();
    assert_eq!(all, (0..40).collect::<Vec<_>>());
}

/// A hook whose `park` records that the thread parked, then waits on the listener.
#[derive(Default)]
struct ParkRecorder {
    parks: AtomicUsize,
    in_park: AtomicBool,
}

impl Progress for ParkRecorder {
    fn progress(&self) -> Step {
        Step::Park
    }

    fn park(&self, listener: SignalListener<'_>) {
        self.parks.fetch_add(1, Ordering::SeqCst);
        self.in_park.store(true, Ordering::SeqCst);
        // Bounded so a lost wakeup fails the test instead of hanging it.
        assert!(listener.wait_timeout(Duration::from_secs(10)), "waiter never woken");
        self.in_park.store(false, Ordering::SeqCst);
    }
}

fn wait_for(flag: &AtomicBool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !flag.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "waiter never parked");
        thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn signal_wakes_a_parked_waiter() {
    let hook = Arc::new(ParkRecorder::default());
    let sync = SyncObject::<u8>::with_progress(hook.clone());
    let mut op = Op::new();
    let cell = op.cell();
    sync.attach(&mut op, 0).unwrap();
    let waiter = {
        let s = sync.clone();
        thread::spawn(move || s.wait_all())
    };
    wait_for(&hook.in_park);
    assert_eq!(hook.parks.load(Ordering::SeqCst), 1);
    sync.signal();
    // The signalled waiter re-checks (still one pending), and parks again.
    let deadline = Instant::now() + Duration::from_secs(10);
    while hook.parks.load(Ordering::SeqCst) < 2 {
        assert!(Instant::now() < deadline, "signal did not wake the waiter");
        thread::sleep(Duration::from_millis(1));
    }
    assert!(!waiter.is_finished());
    wait_for(&hook.in_park);
    cell.complete(ok(0));
    assert_eq!(waiter.join().unwrap(), Ok(()));
}

/// Where the kernel has a thread (`/proc/self/task/TID`): its state letter (`S`: asleep)
/// and how often it has given up its core, or `None` once it has exited (Linux).
#[cfg(target_os = "linux")]
fn sched_state(task: &std::path::Path) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(task.join("stat")).ok()?;
    let state = stat[stat.rfind(')')? + 2..].chars().next()?;
    let status = std::fs::read_to_string(task.join("status")).ok()?;
    let switches = status.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?.trim().parse().ok()?;
    Some((state, switches))
}

/// Waits until `task` is asleep having given up its core more than `after` times; returns
/// that count (failing after a generous bound: a hang guard).
#[cfg(target_os = "linux")]
fn asleep_after(task: &std::path::Path, after: u64, what: &str) -> u64 {
    let t0 = Instant::now();
    loop {
        match sched_state(task) {
            Some(('S', n)) if n > after => return n,
            None => panic!("{what}: the waiter exited"),
            _ => {}
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}: not after 10 s ({:?})", sched_state(task));
        thread::yield_now();
    }
}

#[cfg(target_os = "linux")]
#[test]
fn signal_wakes_a_plain_wait_any() {
    // Without a hook the waiter parks on the listener directly; a signal makes it re-check,
    // and it goes back to sleep until the real completion. Its kernel state shows both: it
    // sleeps, wakes on the signal (giving up its core again when it re-parks), and sleeps
    // again, not finished.
    let sync = SyncObject::<u8>::new();
    let mut op = Op::new();
    let cell = op.cell();
    sync.attach(&mut op, 9).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = {
        let s = sync.clone();
        thread::spawn(move || {
            tx.send(std::fs::read_link("/proc/thread-self").unwrap()).unwrap();
            s.wait_any()
        })
    };
    let task = std::path::Path::new("/proc").join(rx.recv().unwrap());
    let parked = asleep_after(&task, 0, "the waiter parks");
    sync.signal();
    asleep_after(&task, parked, "the signalled waiter re-checks and parks again");
    assert!(!waiter.is_finished(), "a signal is not a completion");
    cell.complete(ok(0));
    assert_eq!(waiter.join().unwrap().map(|c| c.data), Some(9));
}

/// A progress engine stand-in: each `progress` call completes one of its cells. It can be told
/// to answer `Park` first, and records what the waiter did.
struct Completer {
    cells: Mutex<Vec<Arc<CompletionCell>>>,
    /// How many calls answer `Park` before completions start.
    park_first: AtomicUsize,
    log: Mutex<Vec<&'static str>>,
}

impl Completer {
    fn new(park_first: usize) -> Arc<Completer> {
        Arc::new(Completer { cells: Mutex::new(Vec::new()), park_first: AtomicUsize::new(park_first), log: Mutex::default() })
    }

    fn log(&self) -> Vec<&'static str> {
        self.log.lock().unwrap().clone()
    }
}

impl Progress for Completer {
    fn progress(&self) -> Step {
        if self.park_first.load(Ordering::SeqCst) > 0 {
            self.park_first.fetch_sub(1, Ordering::SeqCst);
            self.log.lock().unwrap().push("progress:park");
            return Step::Park;
        }
        // Take the cell out before completing it: never run completions under our lock.
        let next = self.cells.lock().unwrap().pop();
        match next {
            Some(c) => {
                c.complete(ok(0));
                self.log.lock().unwrap().push("progress:completed");
                Step::Progressed
            }
            None => {
                self.log.lock().unwrap().push("progress:idle");
                Step::Idle
            }
        }
    }

    fn park(&self, listener: SignalListener<'_>) {
        // A spurious return is allowed: the waiter must re-check and call `progress` again.
        drop(listener);
        self.log.lock().unwrap().push("park");
    }
}

fn attach_to_hook(sync: &SyncObject<u64>, hook: &Completer, n: u64) {
    for i in 0..n {
        let mut op = Op::new();
        hook.cells.lock().unwrap().push(op.cell());
        sync.attach(&mut op, i).unwrap();
    }
}

#[test]
fn wait_all_drives_the_progress_hook() {
    let hook = Completer::new(0);
    let sync = SyncObject::with_progress(hook.clone());
    attach_to_hook(&sync, &hook, 3);
    assert_eq!(sync.wait_all(), Ok(()));
    assert_eq!(hook.log(), ["progress:completed"; 3], "one hook call per completion, then done");
    assert_eq!(sync.probe(), 3);
}

#[test]
fn step_park_leads_to_park() {
    let hook = Completer::new(2);
    let sync = SyncObject::with_progress(hook.clone());
    attach_to_hook(&sync, &hook, 2);
    assert_eq!(sync.wait_all(), Ok(()));
    assert_eq!(hook.log(), ["progress:park", "park", "progress:park", "park", "progress:completed", "progress:completed"]);
}

#[test]
fn step_idle_spins_then_parks() {
    // A hook with nothing to do: the waiter spins a bounded number of `progress` calls, then
    // parks; the completion comes from another thread.
    let hook = Arc::new(IdleThenPark { calls: AtomicUsize::new(0), inner: ParkRecorder::default() });
    let sync = SyncObject::<u64>::with_progress(hook.clone());
    let mut op = Op::new();
    let cell = op.cell();
    sync.attach(&mut op, 0).unwrap();
    let waiter = {
        let s = sync.clone();
        thread::spawn(move || s.wait_all())
    };
    wait_for(&hook.inner.in_park);
    let spins = hook.calls.load(Ordering::SeqCst);
    assert!(spins >= 1, "the hook was not driven before parking");
    assert!(spins < 10_000, "spun {spins} times: waiting must not spin unboundedly");
    cell.complete(ok(0));
    assert_eq!(waiter.join().unwrap(), Ok(()));
    assert_eq!(hook.inner.parks.load(Ordering::SeqCst), 1);
}

struct IdleThenPark {
    calls: AtomicUsize,
    inner: ParkRecorder,
}

impl Progress for IdleThenPark {
    fn progress(&self) -> Step {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Step::Idle
    }

    fn park(&self, listener: SignalListener<'_>) {
        self.inner.park(listener);
    }
}

#[test]
fn wait_all_with_drives_the_given_hook() {
    let sync = SyncObject::new();
    let hook = Completer::new(1);
    attach_to_hook(&sync, &hook, 2);
    assert_eq!(sync.wait_all_with(&*hook), Ok(()));
    assert_eq!(hook.log(), ["progress:park", "park", "progress:completed", "progress:completed"]);
}

#[test]
fn wait_any_and_next_drive_the_hook() {
    let hook = Completer::new(0);
    let sync = SyncObject::with_progress(hook.clone());
    attach_to_hook(&sync, &hook, 3);
    // The hook completes the last-pushed cell first.
    assert_eq!(sync.wait_any().map(|c| c.data), Some(2));
    assert_eq!(block_on(sync.next()).map(|c| c.data), Some(1));
    let rest: Vec<u64> = block_on(sync.completions().map(|c| c.data).collect());
    assert_eq!(rest, [0]);
    assert_eq!(hook.log(), ["progress:completed"; 3]);
}

#[test]
fn a_delivered_completion_is_not_delivered_again() {
    // Completed while attached to `a`: the event went to `a`; attaching the request to `b`
    // (or to `a` again) is refused and queues nothing.
    let a = SyncObject::new();
    let b = SyncObject::new();
    let mut op = Op::new();
    a.attach(&mut op, 1u8).unwrap();
    op.0.complete(ok(1));
    assert_eq!(b.attach(&mut op, 2), Err(AttachError::AlreadyAttached(2)));
    assert_eq!(a.attach(&mut op, 3), Err(AttachError::AlreadyAttached(3)));
    assert_eq!(b.attach_counted(&mut op), Err(AttachError::AlreadyAttached(())));
    assert_eq!((a.size(), a.probe(), b.size(), b.probe()), (0, 1, 0, 0));

    // Completed first, then attached: queued once by that attach, and only by it.
    let mut late = Op::new();
    late.0.complete(ok(2));
    b.attach(&mut late, 4).unwrap();
    assert_eq!(b.attach(&mut late, 5), Err(AttachError::AlreadyAttached(5)));
    assert_eq!(a.attach(&mut late, 6), Err(AttachError::AlreadyAttached(6)));
    assert_eq!((a.probe(), b.probe()), (1, 1));
    assert_eq!(a.query().map(|c| c.data), Some(1));
    assert_eq!(b.query().map(|c| c.data), Some(4));
    assert_eq!(b.detach(&mut late), Detached::AlreadyComplete);
}

#[test]
fn a_refused_attach_wakes_a_waiter_that_saw_its_count() {
    // The refused attach counts itself for a moment; a waiter that saw that count must not
    // be left parked. Many tries make the interleaving likely (the loom model
    // `refused_attach_vs_wait_all` checks it exhaustively).
    let a = SyncObject::new();
    let mut op = Op::new();
    a.attach(&mut op, 0u8).unwrap();
    for _ in 0..200 {
        let b = SyncObject::<u8>::new();
        let waiter = {
            let b = b.clone();
            thread::spawn(move || b.wait_all())
        };
        assert!(b.attach(&mut op, 1).is_err());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !waiter.is_finished() {
            assert!(Instant::now() < deadline, "wait_all stranded by a refused attach");
            thread::yield_now();
        }
        assert_eq!(waiter.join().unwrap(), Ok(()));
    }
    op.0.complete(ok(0));
}

/// A callback ([`weft_sync::on_complete`]) runs once: on the completer's thread when
/// attached first, at once when the cell had completed, with `Cancelled` when the pending
/// cell is dropped; a cell attached to a sync object (or whose completion went to one)
/// refuses it and gives it back, and a cell with a callback refuses a sync object.
#[test]
fn callbacks_run_once_and_exclude_sync_objects() {
    let runs = Arc::new(Mutex::new(Vec::new()));
    let record = |runs: &Arc<Mutex<Vec<(Outcome, thread::ThreadId)>>>| -> weft_sync::Callback {
        let runs = runs.clone();
        Box::new(move |o| runs.lock().unwrap().push((o, thread::current().id())))
    };
    // Attached first: run by the completer, once.
    let mut op = Op::new();
    weft_sync::on_complete(&mut op, record(&runs)).unwrap();
    assert!(!op.0.attachable() && runs.lock().unwrap().is_empty());
    let cell = op.cell();
    let completer = thread::spawn(move || {
        assert!(cell.complete(ok(1)));
        assert!(!cell.complete(ok(2)));
        thread::current().id()
    })
    .join()
    .unwrap();
    assert_eq!(*runs.lock().unwrap(), vec![(ok(1), completer)]);
    assert!(weft_sync::on_complete(&mut op, record(&runs)).is_err(), "a completion delivered to a callback is spent");
    // Complete first: run here, now.
    let mut op = Op::new();
    op.0.complete(ok(3));
    assert!(op.0.attachable());
    weft_sync::on_complete(&mut op, record(&runs)).unwrap();
    assert_eq!(runs.lock().unwrap()[1], (ok(3), thread::current().id()));
    // Dropped pending: run with `Cancelled`.
    let mut op = Op::new();
    weft_sync::on_complete(&mut op, record(&runs)).unwrap();
    drop(op);
    assert_eq!(runs.lock().unwrap()[2].0, Err(Error::Cancelled));
    // A sync object and a callback exclude each other.
    let sync = SyncObject::new();
    let mut op = Op::new();
    sync.attach(&mut op, 1u32).unwrap();
    let back = weft_sync::on_complete(&mut op, record(&runs));
    assert!(back.is_err());
    let mut op2 = Op::new();
    weft_sync::on_complete(&mut op2, record(&runs)).unwrap();
    assert_eq!(sync.attach(&mut op2, 2u32), Err(AttachError::AlreadyAttached(2)));
    op.0.complete(ok(4));
    op2.0.complete(ok(5));
    assert_eq!(sync.query().map(|c| c.data), Some(1));
    assert_eq!(runs.lock().unwrap().len(), 4, "the refused callback never ran; the accepted one ran once");
    assert_eq!(runs.lock().unwrap()[3].0, ok(5));
}

/// A hook that counts its calls and never progresses.
struct CountingIdle(AtomicUsize);

impl Progress for CountingIdle {
    fn progress(&self) -> Step {
        self.0.fetch_add(1, Ordering::SeqCst);
        Step::Idle
    }
}

#[test]
fn drained_with_resolves_once_everything_completed_and_keeps_the_events() {
    let sync = SyncObject::new();
    let hook = CountingIdle(AtomicUsize::new(0));
    let t = complete_later(&sync, 3, Duration::from_millis(5));
    assert_eq!(block_on(sync.drained_with(&hook)), Ok(()));
    assert_eq!(sync.size(), 0);
    assert!(hook.0.load(Ordering::SeqCst) > 0, "the hook was driven");
    assert_eq!(sync.probe(), 3, "the events stay queued");
    t.join().unwrap();
    // A counted attachment's error, reported once.
    let mut op = Op::new();
    sync.attach_counted(&mut op).unwrap();
    let c = op.cell();
    let t = thread::spawn(move || {
        thread::sleep(Duration::from_millis(5));
        c.complete(Err(Error::Cancelled));
    });
    assert_eq!(block_on(sync.drained_with(&hook)), Err(Error::Cancelled));
    assert_eq!(block_on(sync.drained_with(&hook)), Ok(()));
    t.join().unwrap();
}

/// A hook that says `Progressed` to its first `limit` calls (a rank whose traffic never
/// stops), then `Idle`.
struct Busy {
    calls: AtomicUsize,
    limit: usize,
}

impl Progress for Busy {
    fn progress(&self) -> Step {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.limit {
            Step::Progressed
        } else {
            Step::Idle
        }
    }
}

/// One `poll` of a pending wait makes at most `POLL_PASSES` progressing steps, then wakes
/// its task (to be polled again after the executor's other tasks) and returns `Pending`:
/// a hook that keeps progressing does not hold the executor's worker.
#[test]
fn one_poll_of_a_busy_wait_is_bounded_and_wakes_its_task() {
    use std::future::Future;
    let busy = Arc::new(Busy { calls: AtomicUsize::new(0), limit: 100_000 });
    let sync = SyncObject::with_progress(busy.clone());
    let mut op = Op::new();
    sync.attach(&mut op, 1u32).unwrap();
    let wakes = Arc::new(CountingWaker(AtomicUsize::new(0)));
    let waker = futures::task::waker(wakes.clone());
    let mut cx = Context::from_waker(&waker);

    let mut drained = std::pin::pin!(sync.drained_with(&*busy));
    assert!(drained.as_mut().poll(&mut cx).is_pending());
    assert_eq!(busy.calls.load(Ordering::SeqCst), weft_sync::POLL_PASSES as usize, "drained: passes of one poll");
    assert_eq!(wakes.0.load(Ordering::SeqCst), 1, "drained: the task is woken to be polled again");

    let mut completions = sync.completions();
    assert!(completions.poll_next_unpin(&mut cx).is_pending());
    assert_eq!(busy.calls.load(Ordering::SeqCst), 2 * weft_sync::POLL_PASSES as usize, "completions: passes of one poll");
    assert_eq!(wakes.0.load(Ordering::SeqCst), 2, "completions: the task is woken to be polled again");

    op.0.complete(ok(0));
    assert!(drained.as_mut().poll(&mut cx).is_ready());
    assert!(matches!(completions.poll_next_unpin(&mut cx), Poll::Ready(Some(c)) if c.data == 1));
}
