//! A blocked `wait_any` / `wait_all` parks without allocating: its event listener lives on
//! the waiter's stack (counting global allocator, every thread counted while armed; one
//! counting test in this binary, as the harness's own threads allocate).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use weft_sync::{Attach, CompletionCell, Progress, SignalListener, Status, Step, SyncObject};

// The runtime's counting allocator: one for the workspace's zero-allocation tests.
#[path = "../../runtime/tests/common/counting.rs"]
mod counting;

struct Op(Arc<CompletionCell>);
// SAFETY: the Arc keeps the cell alive until it completes.
unsafe impl Attach for Op {
    fn completion_cell(&self) -> &CompletionCell {
        &self.0
    }
}

/// A hook that parks at once and counts the parks it entered.
#[derive(Default)]
struct Parks(AtomicUsize);

impl Progress for Parks {
    fn progress(&self) -> Step {
        Step::Park
    }

    fn park(&self, listener: SignalListener<'_>) {
        self.0.fetch_add(1, Ordering::SeqCst);
        // Bounded so a lost wakeup fails the test instead of hanging it.
        assert!(listener.wait_timeout(Duration::from_secs(10)), "waiter never woken");
    }
}

/// Waits (bounded) until the waiter has entered its `n`th park.
fn parked(hook: &Parks, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while hook.0.load(Ordering::SeqCst) < n {
        assert!(Instant::now() < deadline, "waiter never parked");
        thread::yield_now();
    }
}

#[test]
fn a_parked_wait_allocates_nothing() {
    const WARM: usize = 50;
    const COUNTED: usize = 200;
    let hook = Arc::new(Parks::default());
    let sync = SyncObject::<u64>::with_progress(hook.clone());
    let cells: Arc<Vec<Arc<CompletionCell>>> = Arc::new((0..WARM + COUNTED).map(|_| Arc::new(CompletionCell::new())).collect());
    // Round `i`: the waiter attaches cell `i` and parks until it completes, in `wait_any`
    // (even rounds) or `wait_all` (odd rounds, a counted attachment).
    let waiter = {
        let (sync, cells) = (sync.clone(), cells.clone());
        thread::spawn(move || {
            for (i, cell) in cells.iter().enumerate() {
                let mut op = Op(cell.clone());
                if i % 2 == 0 {
                    sync.attach(&mut op, i as u64).unwrap();
                    assert_eq!(sync.wait_any().expect("an event").data, i as u64);
                } else {
                    sync.attach_counted(&mut op).unwrap();
                    sync.wait_all().unwrap();
                }
            }
        })
    };
    let round = |i: usize| {
        parked(&hook, i + 1);
        cells[i].complete(Ok(Status { source: 0, tag: 0, bytes: 0 }));
    };
    (0..WARM).for_each(round);
    let n = counting::allocations(|| (WARM..WARM + COUNTED).for_each(round));
    waiter.join().unwrap();
    assert!(hook.0.load(Ordering::SeqCst) >= WARM + COUNTED, "the waiter did not park every round");
    assert_eq!(n, 0, "{n} allocations in {COUNTED} parked waits");
}
