//! Stress: many threads query ONE sync object while two producers attach and complete a
//! large number of operations.
//!
//! * 9 consumers (3 `query`, 3 `query_bulk`, 3 `wait_any`), oversubscribing small machines on
//!   purpose, take events from one object.
//! * 2 producers attach cells in batches and complete the *other* producer's cells. Each
//!   producer hands its batch to the other before attaching it, so attach races completion on
//!   the same cells (both the "completer delivers" and "attach delivers" paths run).
//! * Every completion carries a unique `u64`; a bitset checks each arrives exactly once, and
//!   that its outcome is the one its completer gave (the data and status are not mixed up).
//!
//! Memory stays bounded: at most `4 * BATCH` cells are attached and not yet complete at any
//! moment, and producers wait while more than `MAX_QUEUED` events sit in the queue.
//!
//! The number of completions is `WEFT_STRESS_COMPLETIONS`, by default 1,000,000 in every
//! build (measured on the 2-core machine: release 0.16-0.27 s, debug 0.37 s). The test fails
//! with a message after 60 s instead of hanging.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::{Duration, Instant};

use weft_sync::{Attach, Completion, CompletionCell, Status, SyncObject};

/// Cells per producer batch; two producers with two batches each in flight keep at most
/// `4 * BATCH` = 10,000 attached-and-pending cells.
const BATCH: usize = 2_500;
/// Producers wait while the queue holds more events than this.
const MAX_QUEUED: usize = 20_000;
const CONSUMERS_PER_KIND: usize = 3;
const DEADLINE: Duration = Duration::from_secs(60);

struct Op(Arc<CompletionCell>);

// SAFETY: the producer that completes a cell holds its own `Arc` clone until it has
// completed it, and each cell is completed exactly once.
unsafe impl Attach for Op {
    fn completion_cell(&self) -> &CompletionCell {
        &self.0
    }
}

fn completions() -> u64 {
    let default = 1_000_000;
    match std::env::var("WEFT_STRESS_COMPLETIONS") {
        Ok(v) => v.trim().parse().expect("WEFT_STRESS_COMPLETIONS must be a number"),
        Err(_) => default,
    }
}

/// The outcome the completer gives operation `id`, so consumers can check the pairing.
fn outcome_of(id: u64) -> Status {
    Status { source: (id % 7) as u32, tag: (id % 1_000) as i32, bytes: id as usize }
}

/// What the consumers share.
struct Shared {
    n: u64,
    /// One bit per completion id.
    seen: Vec<AtomicU64>,
    /// Events taken, all consumers together.
    received: AtomicUsize,
    /// Events that were out of range, duplicated or carried the wrong outcome.
    bad: AtomicUsize,
    first_bad: std::sync::Mutex<Option<String>>,
}

impl Shared {
    fn record(&self, c: Completion<u64>) {
        let id = c.data;
        let problem = if id >= self.n {
            Some(format!("id {id} out of range"))
        } else if c.outcome != Ok(outcome_of(id)) {
            Some(format!("id {id} carries outcome {:?}", c.outcome))
        } else {
            let bit = 1u64 << (id % 64);
            let prev = self.seen[(id / 64) as usize].fetch_or(bit, Ordering::Relaxed);
            (prev & bit != 0).then(|| format!("id {id} delivered twice"))
        };
        if let Some(p) = problem {
            self.bad.fetch_add(1, Ordering::Relaxed);
            self.first_bad.lock().unwrap().get_or_insert(p);
        }
        self.received.fetch_add(1, Ordering::Relaxed);
    }

    fn finished(&self) -> bool {
        self.received.load(Ordering::Relaxed) as u64 >= self.n
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Query,
    QueryBulk,
    WaitAny,
}

fn consume(kind: Kind, sync: &SyncObject<u64>, shared: &Shared, stop: &dyn Fn() -> bool) {
    let mut buf = Vec::with_capacity(64);
    while !shared.finished() && !stop() {
        let got = match kind {
            Kind::Query => match sync.query() {
                Some(c) => {
                    shared.record(c);
                    true
                }
                None => false,
            },
            Kind::QueryBulk => {
                let n = sync.query_bulk(&mut buf, 64);
                for c in buf.drain(..) {
                    shared.record(c);
                }
                n > 0
            }
            // `None` also happens between batches (nothing attached for a moment).
            Kind::WaitAny => match sync.wait_any() {
                Some(c) => {
                    shared.record(c);
                    true
                }
                None => false,
            },
        };
        if !got {
            thread::yield_now();
        }
    }
}

/// The ids producer `p` of 2 owns, split into `batches` batches (some may be empty).
fn batch_ids(n: u64, p: u64, batches: u64, k: u64) -> std::ops::Range<u64> {
    let (start, end) = (n * p / 2, n * (p + 1) / 2);
    let len = end - start;
    start + len * k / batches..start + len * (k + 1) / batches
}

type Batch = Vec<(u64, Arc<CompletionCell>)>;

fn produce(
    p: u64,
    sync: &SyncObject<u64>,
    n: u64,
    to_peer: mpsc::Sender<Batch>,
    from_peer: mpsc::Receiver<Batch>,
    stop: &dyn Fn() -> bool,
) {
    let batches = (n / 2).div_ceil(BATCH as u64).max(1);
    for k in 0..batches {
        // Backpressure: do not let the queue grow without bound if consumers fall behind.
        while sync.probe() > MAX_QUEUED && !stop() {
            thread::yield_now();
        }
        if stop() {
            return;
        }
        let batch: Batch = batch_ids(n, p, batches, k).map(|id| (id, Arc::new(CompletionCell::new()))).collect();
        // Hand the cells to the peer first: it may complete them before, during or after we
        // attach them.
        let mut ops: Vec<(u64, Op)> = batch.iter().map(|(id, c)| (*id, Op(c.clone()))).collect();
        to_peer.send(batch).expect("peer producer gone");
        for (id, op) in &mut ops {
            sync.attach(op, *id).expect("fresh cell already attached");
        }
        drop(ops);
        // Complete the peer's batch, in an order unlike attach order.
        let theirs = from_peer.recv().expect("peer producer gone");
        let (evens, odds): (Vec<_>, Vec<_>) = theirs.into_iter().partition(|(id, _)| id % 2 == 0);
        for (id, cell) in odds.into_iter().rev().chain(evens) {
            assert!(cell.complete(Ok(outcome_of(id))), "cell {id} completed twice");
        }
    }
}

#[test]
fn one_object_many_queriers_two_producers() {
    let n = completions();
    let start = Instant::now();
    let sync = SyncObject::<u64>::new();
    let shared = Arc::new(Shared {
        n,
        seen: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        received: AtomicUsize::new(0),
        bad: AtomicUsize::new(0),
        first_bad: std::sync::Mutex::new(None),
    });
    let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel::<String>();

    let mut handles = Vec::new();
    let kinds = [Kind::Query, Kind::QueryBulk, Kind::WaitAny];
    for (i, kind) in kinds.iter().cycle().take(kinds.len() * CONSUMERS_PER_KIND).enumerate() {
        let (sync, shared, timed_out, done) = (sync.clone(), shared.clone(), timed_out.clone(), done_tx.clone());
        let kind = *kind;
        handles.push(thread::spawn(move || {
            consume(kind, &sync, &shared, &|| timed_out.load(Ordering::Relaxed));
            let _ = done.send(format!("consumer {i} ({kind:?})"));
        }));
    }
    let (tx0, rx1) = mpsc::channel();
    let (tx1, rx0) = mpsc::channel();
    for (p, tx, rx) in [(0u64, tx0, rx0), (1, tx1, rx1)] {
        let (sync, timed_out, done) = (sync.clone(), timed_out.clone(), done_tx.clone());
        handles.push(thread::spawn(move || {
            produce(p, &sync, n, tx, rx, &|| timed_out.load(Ordering::Relaxed));
            let _ = done.send(format!("producer {p}"));
        }));
    }
    drop(done_tx);

    // Wait for every thread, but not forever: a lost wakeup leaves a consumer parked.
    let mut finished = Vec::new();
    while finished.len() < handles.len() {
        let left = DEADLINE.saturating_sub(start.elapsed());
        match done_rx.recv_timeout(left) {
            Ok(who) => finished.push(who),
            Err(_) => {
                timed_out.store(true, Ordering::Relaxed);
                sync.signal(); // let parked consumers see the stop flag
                panic!(
                    "stress test still running after {DEADLINE:?}: {} of {n} completions received, \
                     size {} probe {}; threads finished: {finished:?}",
                    shared.received.load(Ordering::Relaxed),
                    sync.size(),
                    sync.probe()
                );
            }
        }
    }
    for h in handles {
        h.join().unwrap();
    }
    let elapsed = start.elapsed();

    assert_eq!(shared.bad.load(Ordering::Relaxed), 0, "first problem: {:?}", shared.first_bad.lock().unwrap());
    assert_eq!(shared.received.load(Ordering::Relaxed) as u64, n, "extra or missing events");
    let missing: u64 = (0..n).filter(|id| shared.seen[(id / 64) as usize].load(Ordering::Relaxed) & (1 << (id % 64)) == 0).count() as u64;
    assert_eq!(missing, 0, "{missing} completions never arrived");
    assert!(sync.query().is_none(), "an extra event is left in the queue");
    assert_eq!((sync.size(), sync.probe()), (0, 0));
    println!("stress: {n} completions through one sync object in {elapsed:.2?}");
}
