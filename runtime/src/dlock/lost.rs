//! A rank lost while another waits for a distributed lock: the wait ends within seconds,
//! with the lock where the write it waited for landed before the loss, else with
//! `PeerLost` naming the lost rank, on the embedded provider and on libfabric (`shm`), for
//! a thread and a task. A third rank stays alive and idle throughout: a receive from any
//! source (the wake frame's) fails only once no peer is left, so it alone ends nothing.

use std::sync::mpsc;
use std::time::{Duration, Instant};

#[cfg(feature = "ofi")]
use super::queues::Layout;
use super::*;
use crate::{Provider, Runtime};

// The integration tests' bound on a scenario, loaded once for the unit tests.
use crate::rendezvous_faults::common::within;

/// How long the holder keeps the lock before it goes: the waiter parks meanwhile.
const BEFORE_LOSS: Duration = Duration::from_millis(100);

/// The longest a waiter may take to end its wait after the loss.
const NOTICED: Duration = Duration::from_secs(5);

/// Ranks 0-2 make a lock with `make`; rank 1 takes it with `take` (and never releases it),
/// rank 0 then waits for it with `wait`; after [`BEFORE_LOSS`] rank 1 does `last` (if
/// given) and is lost (its transport closes, as when its process dies). Returns what `wait` gave, after
/// checking that it ended within [`NOTICED`] of the loss.
fn holder_lost<L: Send + Sync + 'static>(
    what: &'static str,
    provider: Provider,
    make: fn(&Communicator) -> L,
    take: fn(&L),
    last: Option<fn(&L)>,
    wait: fn(&L) -> Result<(), Error>,
) -> Result<(), Error> {
    within(30, what, move || {
        let rts = Runtime::builder().env(false).provider(provider).cris(1).build_local(3).unwrap();
        let (held_tx, held_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let (outcome, waited) = std::thread::scope(|s| {
            let rts = &rts;
            let waiter = s.spawn(move || {
                let c = rts[0].world();
                let lock = make(c);
                c.barrier().unwrap();
                held_rx.recv().unwrap();
                let outcome = wait(&lock);
                (outcome, Instant::now())
            });
            let idle = s.spawn(move || {
                let c = rts[2].world();
                let lock = make(c);
                c.barrier().unwrap();
                let _ = done_rx.recv();
                drop(lock);
            });
            let c = rts[1].world();
            let lock = make(c);
            c.barrier().unwrap();
            take(&lock);
            held_tx.send(()).unwrap();
            std::thread::sleep(BEFORE_LOSS);
            if let Some(last) = last {
                last(&lock);
            }
            rts[1].engine.transport.close();
            let lost_at = Instant::now();
            let (outcome, at) = waiter.join().unwrap();
            done_tx.send(()).unwrap();
            idle.join().unwrap();
            // The lost rank's guard is never released; its lock goes with the runtime.
            std::mem::forget(lock);
            (outcome, at.saturating_duration_since(lost_at))
        });
        assert!(waited < NOTICED, "{what}: the waiter took {waited:?} after the loss");
        outcome
    })
}

/// The release of a lock the waiter took once its holder was lost: `Ok`, or `PeerLost`
/// naming the holder where the waiter's last atomic on the holder's word (taking its park's
/// mark back) was in flight at the loss. libfabric's `shm` then answers nothing more that
/// the waiter's CRI sends, which refuses one-sided operations from then on, and the test's
/// runtimes have one CRI each (`weft_transport`'s `ofi_provider`, *A one-sided operation
/// to a lost rank*).
#[cfg(feature = "ofi")]
fn released(q: &Queues, unlocked: Result<(), Error>) -> Result<(), Error> {
    match unlocked {
        LOST if q.window.a_cri_refuses() => Ok(()),
        other => other,
    }
}

/// The hand-off's write of rank 0's STATUS at level 1 (Listing 3: passed, the count 1),
/// flushed, without its wake frame: what a releaser lost between the two did. Written once
/// the waiter is queued (the holder's NEXT names it, written after the waiter set its
/// STATUS to wait), as a releaser's is.
#[cfg(feature = "ofi")]
fn passes_without_waking(q: &Queues) {
    let deadline = Instant::now() + NOTICED;
    let mut next = [0u64];
    while next[0] == 0 && Instant::now() < deadline {
        q.window.get(1, Layout::next(0), &mut next).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    q.window.put(0, Layout::status(0), &[1]).unwrap();
    q.window.flush(0).unwrap();
}

fn d_mcs(c: &Communicator) -> DMcs {
    DMcs::new(c, 0).unwrap()
}

#[cfg(feature = "ofi")]
fn rma_mcs(c: &Communicator) -> RmaMcs {
    RmaMcs::new(c, &Levels::flat(), &Thresholds::default()).unwrap()
}

fn rma_rw(c: &Communicator) -> RmaRw {
    RmaRw::new(c, &Levels::flat(), &Thresholds::default()).unwrap()
}

/// In a task of a one-thread tokio runtime on the waiting thread.
fn in_task<F: Future<Output = Result<(), Error>>>(f: F) -> Result<(), Error> {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
}

const LOST: Result<(), Error> = Err(Error::PeerLost { rank: 1 });

/// On the embedded provider (the waiter parks on its word's signal, or polls the central
/// word): a waiter whose holder is lost fails with `PeerLost` instead of waiting for ever.
#[test]
fn a_waiter_whose_holder_is_lost_fails_with_peer_lost() {
    let p = Provider::Embedded;
    let d_mcs_take: fn(&DMcs) = |l| std::mem::forget(l.lock().unwrap());
    let d_mcs_wait: fn(&DMcs) -> Result<(), Error> = |l| l.lock()?.unlock();
    assert_eq!(holder_lost("D-MCS", p, d_mcs, d_mcs_take, None, d_mcs_wait), LOST);
    let task: fn(&DMcs) -> Result<(), Error> = |l| in_task(async { l.lock_async().await?.unlock_async().await });
    assert_eq!(holder_lost("D-MCS, a task", p, d_mcs, d_mcs_take, None, task), LOST);
    let rw_take: fn(&RmaRw) = |l| std::mem::forget(l.write().unwrap());
    let reader: fn(&RmaRw) -> Result<(), Error> = |l| l.read()?.unlock();
    assert_eq!(holder_lost("RMA-RW reader behind a writer", p, rma_rw, rw_take, None, reader), LOST);
    let spin = |c: &Communicator| SpinLock::new(c, 0).unwrap();
    let spin_take: fn(&SpinLock) = |l| std::mem::forget(l.lock().unwrap());
    assert_eq!(holder_lost("spin", p, spin, spin_take, None, |l| l.lock()?.unlock()), LOST);
    let fompi = |c: &Communicator| FompiRw::new(c, 0).unwrap();
    let fompi_take: fn(&FompiRw) = |l| std::mem::forget(l.write().unwrap());
    assert_eq!(holder_lost("foMPI-RW", p, fompi, fompi_take, None, |l| l.write()?.unlock()), LOST);
}

/// On libfabric (`shm`) a queued waiter parks on its hand-off's wake frame: if the holder
/// is lost after its flushed write of the waiter's STATUS and before the frame, the waiter
/// still sees the write and takes the lock; if it is lost before the write, the waiter
/// fails with `PeerLost`. A thread (parked as a blocked receive, it waited for ever) and a
/// task.
#[cfg(feature = "ofi")]
#[test]
fn a_waiter_on_libfabric_sees_a_write_that_landed_before_the_loss() {
    std::env::set_var("FI_TCP_IFACE", "lo");
    std::env::set_var("FI_SOCKETS_IFACE", "lo");
    let p = Provider::Shm;
    let d_mcs_take: fn(&DMcs) = |l| std::mem::forget(l.lock().unwrap());
    let d_mcs_wait: fn(&DMcs) -> Result<(), Error> = |l| l.lock()?.unlock();
    let d_mcs_taken: fn(&DMcs) -> Result<(), Error> = |l| released(&l.q, l.lock()?.unlock());
    let passes: fn(&DMcs) = |l| passes_without_waking(&l.q);
    assert_eq!(holder_lost("D-MCS, passed", p, d_mcs, d_mcs_take, Some(passes), d_mcs_taken), Ok(()));
    assert_eq!(holder_lost("D-MCS, lost", p, d_mcs, d_mcs_take, None, d_mcs_wait), LOST);
    let mcs_take: fn(&RmaMcs) = |l| std::mem::forget(l.lock().unwrap());
    let task: fn(&RmaMcs) -> Result<(), Error> = |l| in_task(async { l.lock_async().await?.unlock_async().await });
    let task_taken: fn(&RmaMcs) -> Result<(), Error> = |l| in_task(async { released(&l.q, l.lock_async().await?.unlock_async().await) });
    let passes: fn(&RmaMcs) = |l| passes_without_waking(&l.q);
    assert_eq!(holder_lost("RMA-MCS task, passed", p, rma_mcs, mcs_take, Some(passes), task_taken), Ok(()));
    assert_eq!(holder_lost("RMA-MCS task, lost", p, rma_mcs, mcs_take, None, task), LOST);
    // Tasks waiting on a watched word park on the one that leads them: its wait ends with
    // the loss, and so do theirs. 100 reader tasks behind the lost writer; a task of the
    // spin lock.
    let rw_take: fn(&RmaRw) = |l| std::mem::forget(l.write().unwrap());
    let readers: fn(&RmaRw) -> Result<(), Error> = |l| {
        in_task(async {
            let all = futures::future::join_all((0..100).map(|_| async { l.read_async().await?.unlock_async().await })).await;
            assert!(all.iter().all(|r| *r == LOST), "every reader task fails: {all:?}");
            all[0]
        })
    };
    assert_eq!(holder_lost("100 RMA-RW reader tasks, lost", p, rma_rw, rw_take, None, readers), LOST);
    let spin = |c: &Communicator| SpinLock::new(c, 0).unwrap();
    let spin_take: fn(&SpinLock) = |l| std::mem::forget(l.lock().unwrap());
    let spin_task: fn(&SpinLock) -> Result<(), Error> = |l| in_task(async { l.lock_async().await?.unlock_async().await });
    assert_eq!(holder_lost("spin, a task", p, spin, spin_take, None, spin_task), LOST);
}
