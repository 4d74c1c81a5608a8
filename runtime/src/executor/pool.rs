//! The pool: per-worker deques, the global injector, stealers, and the worker loop.
//!
//! A worker's loop, one *tick* per task (tokio's `multi_thread/worker.rs` is the model):
//!
//! 1. its LIFO slot (the task woken by the task it ran last; at most [`MAX_LIFO_POLLS`] in a
//!    row), then its own deque (FIFO), except every [`INJECT_INTERVAL`] ticks, when the
//!    global injector comes first, so tasks spawned from outside the pool cannot starve
//!    behind tasks that keep rescheduling themselves; the same tick makes one progress
//!    pass, so a busy pool still drains the network;
//! 2. when it has nothing: one non-blocking progress pass ([`Drive::idle_pass`]);
//! 3. then it steals (injector, then the other workers' deques);
//! 4. then it searches for [`SEARCH_BEFORE_PARK`] (crossbeam `Backoff`, then yielding) and
//!    parks (`park.rs`).
//!
//! The pool starts at the first spawn (no threads for a runtime that never spawns) and
//! stops when the last `Runtime` handle drops: the threads are joined and every task not
//! yet complete is cancelled, queued or waiting for a wake (their join handles give
//! [`JoinError::Cancelled`](super::JoinError); `registry.rs`; a queued pool continuation's
//! callback counts down as `Cancelled`).

use std::cell::Cell;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use parking_lot::Mutex;

use super::park::Sleepers;
use super::registry::Registry;
use super::task::{JoinHandle, Task, TaskRef};
use super::Drive;
use crate::loom::sync::atomic::{AtomicBool, Ordering};

/// Every this many ticks a worker looks at the injector first and makes a progress pass
/// (tokio uses 61 too: a prime, so it does not beat in step with periodic workloads).
const INJECT_INTERVAL: u32 = 61;

/// How long an idle worker keeps looking for work (yielding its core between looks) before
/// it parks: a burst of tasks shortly after (the next pieces of a parallel pack, a reply)
/// then costs no wake-up. Only the transition to idle pays it, never a sleeping runtime.
const SEARCH_BEFORE_PARK: Duration = Duration::from_micros(50);

/// The executor state of one runtime (a field of the rank's engine): the pool, once started.
pub(crate) struct Executor {
    /// Worker threads to start.
    workers: usize,
    /// The rank, for the workers' thread names.
    rank: u32,
    /// The pool, created at the first spawn.
    pool: OnceLock<Arc<Pool>>,
    /// Set when the last `Runtime` handle dropped: no new pool may start.
    closed: AtomicBool,
    /// The worker threads, joined at shutdown.
    threads: Mutex<Vec<thread::JoinHandle<()>>>,
}

impl Executor {
    /// An executor of `workers` threads (started at the first spawn) for rank `rank`.
    pub(crate) fn new(workers: usize, rank: u32) -> Self {
        Executor { workers, rank, pool: OnceLock::new(), closed: AtomicBool::new(false), threads: Mutex::new(Vec::new()) }
    }

    /// The pool if it has started and not shut down.
    #[inline]
    pub(crate) fn get(&self) -> Option<&Arc<Pool>> {
        self.pool.get().filter(|p| !p.shutdown.load(Ordering::Acquire))
    }

    /// Worker threads this executor starts (0: tasks run only on threads that wait).
    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    /// The pool, starting it (and its worker threads, which progress through `drive`) on
    /// first use; `None` once the runtime has shut down.
    pub(crate) fn start(&self, drive: impl FnOnce() -> Arc<dyn Drive>) -> Option<&Arc<Pool>> {
        if let Some(p) = self.get() {
            return Some(p);
        }
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let pool = self.pool.get_or_init(|| {
            let n = self.workers;
            let drive = drive();
            let locals: Vec<Worker<TaskRef>> = (0..n).map(|_| Worker::new_fifo()).collect();
            let pool = Arc::new(Pool {
                injector: Injector::new(),
                stealers: locals.iter().map(|w| w.stealer()).collect(),
                sleep: Sleepers::new(n),
                shutdown: AtomicBool::new(false),
                tasks: Registry::new(n),
            });
            let mut threads = self.threads.lock();
            for (index, local) in locals.into_iter().enumerate() {
                let (drive, pool) = (drive.clone(), pool.clone());
                let name = format!("weft-worker-{}.{}", self.rank, index);
                match thread::Builder::new().name(name).spawn(move || worker_main(&*drive, &pool, local, index)) {
                    Ok(h) => threads.push(h),
                    // Out of threads: the pool runs with fewer workers (waiters still help).
                    Err(e) => tracing::warn!("weft: could not start worker thread: {e}"),
                }
            }
            pool
        });
        // SeqCst: pairs with `shutdown` (store `closed`, then look for the pool): either it
        // sees the pool we just started and stops it, or we see `closed` and stop it here.
        if self.closed.load(Ordering::SeqCst) {
            self.shutdown();
            return None;
        }
        (!pool.shutdown.load(Ordering::Acquire)).then_some(pool)
    }

    /// Stops the pool (the last `Runtime` handle dropped): wakes and joins the workers —
    /// unless called on one of them, which then exits on its own — and cancels every task
    /// not complete: queued ones, and those waiting for a wake (which no queue holds; their
    /// futures would leak, and with them whatever they own, such as the rank's state).
    pub(crate) fn shutdown(&self) {
        // SeqCst: see the end of `start`.
        self.closed.store(true, Ordering::SeqCst);
        let Some(pool) = self.pool.get() else { return };
        // SeqCst: pairs with the re-check in `schedule` (a task pushed after the workers
        // drained the injector is cancelled by its pusher).
        pool.shutdown.store(true, Ordering::SeqCst);
        pool.sleep.notify_all();
        let handles = std::mem::take(&mut *self.threads.lock());
        let me = thread::current().id();
        for h in handles {
            if h.thread().id() != me {
                let _ = h.join();
            }
        }
        pool.drain();
        // Outside the registry's locks: dropping a future runs user code. A task being
        // polled (by a thread helping from inside a wait, or by this thread, if a task
        // dropped the last handle) is cancelled by its poller when its poll returns.
        for task in pool.tasks.close() {
            task.shut_down();
        }
    }
}

/// The shared part of the pool.
pub(crate) struct Pool {
    /// Tasks spawned or woken outside the pool's workers.
    injector: Injector<TaskRef>,
    /// The workers' deques, for stealing.
    stealers: Box<[Stealer<TaskRef>]>,
    /// Who sleeps; how to wake one.
    pub(super) sleep: Sleepers,
    /// Set once at shutdown.
    shutdown: AtomicBool,
    /// Every task spawned as a future and not yet complete (cancelled at shutdown); not the
    /// pool continuations' tasks, which a queue always holds (`task.rs`, "Shutdown").
    pub(super) tasks: Registry,
}

/// Why a task is queued (where it goes on a worker's own queues).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hint {
    /// A new task: the back of the deque (stealable at once).
    Spawn,
    /// Woken by another task: the LIFO slot (runs next, warm in cache; tokio's habit).
    Wake,
    /// Woke itself while running (a yield): the back of the deque, behind everyone else.
    Yield,
}

/// Consecutive LIFO-slot polls before the slot's task goes to the back of the deque, so two
/// tasks waking each other cannot starve the rest (tokio uses 3 too).
const MAX_LIFO_POLLS: u32 = 3;

/// A worker's own state, reachable from its thread while it runs.
struct Local {
    /// The pool this thread works for.
    pool: *const Pool,
    /// Its deque.
    worker: Worker<TaskRef>,
    /// The task to run next (not stealable; moved to the deque after `MAX_LIFO_POLLS`).
    lifo: Cell<Option<TaskRef>>,
}

impl Local {
    /// The next task of this worker's own queues, LIFO slot first.
    fn pop(&self) -> Option<TaskRef> {
        self.lifo.take().or_else(|| self.worker.pop())
    }
}

thread_local! {
    /// The running worker's `Local` (null on other threads).
    static LOCAL: Cell<*const Local> = const { Cell::new(std::ptr::null()) };
    /// How many tasks this thread is running from inside waits, one inside the other (0: none;
    /// a worker's own tasks do not count).
    static HELP_DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// The deepest a thread nests tasks run from inside waits (`help`): a task that blocks
/// (`block_on`, a blocking receive) inside a task that blocks, and so on, 32 waits deep on
/// one thread. Each level holds the frames of a poll and a wait (about 2 KiB in a debug
/// build, plus the task's own; a chain of 1,000 plain levels fits a worker's 2 MiB stack),
/// so the bound leaves ample room for the tasks' frames. A wait at this depth runs no
/// task: it sleeps until what it waits for is done by other threads (the pool's workers) —
/// with none, or with all of them waiting at the bound too, it waits forever, as every
/// wait inside a task did before helping could nest.
pub(crate) const MAX_HELP_DEPTH: u32 = 32;

/// Restores the thread's help depth when a helped task returns (or unwinds).
struct Depth(u32);

impl Drop for Depth {
    fn drop(&mut self) {
        HELP_DEPTH.with(|d| d.set(self.0));
    }
}

/// Whether this thread may run one more task from inside a wait (`help`).
pub(super) fn may_help() -> bool {
    HELP_DEPTH.with(|d| d.get()) < MAX_HELP_DEPTH
}

impl Pool {
    /// A pool of `n` workers' queues and sleep states without their threads (tests that
    /// drive a worker's steps on their own thread).
    #[cfg(all(test, not(loom)))]
    pub(super) fn for_tests(n: usize) -> Pool {
        Pool {
            injector: Injector::new(),
            stealers: (0..n).map(|_| Worker::<TaskRef>::new_fifo().stealer()).collect(),
            sleep: Sleepers::new(n),
            shutdown: AtomicBool::new(false),
            tasks: Registry::new(n),
        }
    }

    /// Spawns `future` onto the pool.
    pub(crate) fn spawn<F>(self: &Arc<Self>, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (task, handle) = Task::create(self.clone(), future);
        if self.tasks.insert(&task) {
            self.schedule(task, Hint::Spawn);
        } else {
            // Spawned after shutdown (a race with the last handle's drop): never queued.
            task.cancel();
        }
        handle
    }

    /// Queues a `SCHEDULED` task: on this thread's deque when it is one of our workers (a
    /// task woken by the running one goes to the LIFO slot, to run next), else on the
    /// injector; then wakes a sleeping worker if there is one.
    pub(crate) fn schedule(&self, task: TaskRef, hint: Hint) {
        if self.shutdown.load(Ordering::Acquire) {
            task.cancel();
            return;
        }
        let local = LOCAL.with(|l| l.get());
        // SAFETY: a non-null `LOCAL` points to the `Local` on the stack of this thread's
        // `worker_main`, which outlives every task it runs.
        match unsafe { local.as_ref() } {
            Some(l) if std::ptr::eq(l.pool, self) => {
                if hint == Hint::Wake {
                    match l.lifo.replace(Some(task)) {
                        // The slot was free: this worker runs the task next, nobody to wake.
                        None => return,
                        Some(prev) => l.worker.push(prev),
                    }
                } else {
                    l.worker.push(task);
                }
            }
            _ => {
                self.injector.push(task);
                // SeqCst: pairs with the store in `Executor::shutdown`.
                if self.shutdown.load(Ordering::SeqCst) {
                    self.drain();
                    return;
                }
            }
        }
        self.sleep.notify_one();
    }

    /// Whether any queue has a task (a sleeping worker's re-check).
    pub(super) fn has_work(&self) -> bool {
        !self.injector.is_empty() || self.stealers.iter().any(|s| !s.is_empty())
    }

    /// Whether the pool is shutting down.
    pub(super) fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// One task from the injector (a batch moves to `local` when given).
    fn steal_injector(&self, local: Option<&Worker<TaskRef>>) -> Option<TaskRef> {
        loop {
            let s = match local {
                Some(w) => self.injector.steal_batch_and_pop(w),
                None => self.injector.steal(),
            };
            match s {
                Steal::Success(t) => return Some(t),
                Steal::Empty => return None,
                Steal::Retry => continue,
            }
        }
    }

    /// One task from another worker's deque, starting after `from`.
    fn steal_others(&self, local: Option<&Worker<TaskRef>>, from: usize) -> Option<TaskRef> {
        let n = self.stealers.len();
        for i in 0..n {
            let s = &self.stealers[(from + 1 + i) % n];
            loop {
                let got = match local {
                    Some(w) => s.steal_batch_and_pop(w),
                    None => s.steal(),
                };
                match got {
                    Steal::Success(t) => return Some(t),
                    Steal::Empty => break,
                    Steal::Retry => continue,
                }
            }
        }
        None
    }

    /// Cancels every task left in the injector (shutdown).
    fn drain(&self) {
        while let Some(t) = self.steal_injector(None) {
            t.cancel();
        }
    }
}

/// Runs one queued pool task on a thread that is blocked waiting ([Patinyasakdikul 2019, §4.6.2]: waiting
/// threads steal tasks instead of sleeping). Returns whether it ran one.
///
/// Nests: a task run this way that itself waits helps in turn, up to [`MAX_HELP_DEPTH`]
/// waits deep (beyond, it returns false and the wait sleeps). Without nesting, a task
/// blocking on a task run by a wait (`workers(0)`, or a task waiting on the only worker)
/// waited forever: no other thread would run what it waits for. A wait returns only once
/// the task it runs has finished or is itself waiting, so a task run this way must not wait
/// for what the interrupted wait's caller does afterwards (true of every help-first
/// scheduler; `.await` has no such limits).
pub(crate) fn help(executor: &Executor) -> bool {
    let depth = HELP_DEPTH.with(|d| d.get());
    if depth >= MAX_HELP_DEPTH {
        return false;
    }
    HELP_DEPTH.with(|d| d.set(depth + 1));
    let _restore = Depth(depth);
    run_one(executor)
}

/// Runs one queued task (from the injector, else stolen from a worker) on this thread.
/// Returns whether it found one.
///
/// On one of the pool's workers it takes from its own queues first, and keeps doing so
/// after shutdown, cancelling what it takes: nobody else empties them before the worker
/// leaves its loop, and a task waiting there (a pack's pieces, a task it blocks on) would
/// otherwise keep the worker waiting forever.
pub(super) fn run_one(executor: &Executor) -> bool {
    let Some(pool) = executor.pool.get() else { return false };
    let local = LOCAL.with(|l| l.get());
    // SAFETY: see `Pool::schedule`.
    let own = unsafe { local.as_ref() }.filter(|l| std::ptr::eq(l.pool, Arc::as_ptr(pool))).and_then(|l| l.pop());
    if let Some(t) = own {
        if pool.is_shutdown() {
            t.cancel();
        } else {
            t.run();
        }
        return true;
    }
    if pool.is_shutdown() {
        return false;
    }
    let task = match pool.steal_injector(None) {
        Some(t) => t,
        None => match pool.steal_others(None, 0) {
            Some(t) => t,
            None => return false,
        },
    };
    task.run();
    true
}

/// Whether the calling thread is a worker of `executor`'s pool.
pub(super) fn on_worker_of(executor: &Executor) -> bool {
    let Some(pool) = executor.get() else { return false };
    let local = LOCAL.with(|l| l.get());
    // SAFETY: see `Pool::schedule`.
    unsafe { local.as_ref() }.is_some_and(|l| std::ptr::eq(l.pool, Arc::as_ptr(pool)))
}

/// Clears `LOCAL` when the worker leaves (also on unwind).
struct ResetLocal;

impl Drop for ResetLocal {
    fn drop(&mut self) {
        LOCAL.with(|l| l.set(std::ptr::null()));
    }
}

fn worker_main(drive: &dyn Drive, pool: &Arc<Pool>, worker: Worker<TaskRef>, index: usize) {
    pool.sleep.register(index);
    let local = Local { pool: Arc::as_ptr(pool), worker, lifo: Cell::new(None) };
    LOCAL.with(|l| l.set(&local));
    let _reset = ResetLocal;
    let mut tick: u32 = 0;
    let mut lifo_polls = 0u32;
    loop {
        if pool.is_shutdown() {
            break;
        }
        tick = tick.wrapping_add(1);
        let lifo = local.lifo.take();
        let task = if tick % INJECT_INTERVAL == 0 {
            drive.idle_pass();
            if let Some(t) = lifo {
                local.worker.push(t);
            }
            lifo_polls = 0;
            pool.steal_injector(Some(&local.worker)).or_else(|| local.worker.pop())
        } else if lifo.is_some() && lifo_polls < MAX_LIFO_POLLS {
            lifo_polls += 1;
            lifo
        } else {
            if let Some(t) = lifo {
                local.worker.push(t);
            }
            lifo_polls = 0;
            local.worker.pop().or_else(|| pool.steal_injector(Some(&local.worker)))
        };
        if let Some(t) = task {
            t.run();
            continue;
        }
        // Idle: progress, then steal, spinning a little, then park.
        let mut backoff = weft_sync::IdleBackoff::new();
        let idle_since = Instant::now();
        let found = loop {
            if drive.idle_pass() {
                break None;
            }
            if let Some(t) = pool.steal_injector(Some(&local.worker)).or_else(|| pool.steal_others(Some(&local.worker), index)) {
                break Some(t);
            }
            if pool.is_shutdown() || (backoff.is_completed() && idle_since.elapsed() >= SEARCH_BEFORE_PARK) {
                super::park::park_worker(drive, pool, index);
                break None;
            }
            backoff.snooze();
        };
        if let Some(t) = found {
            t.run();
        }
    }
    // Shutdown: cancel what is left in our queues (and whatever reached the injector).
    while let Some(t) = local.pop() {
        t.cancel();
    }
    pool.drain();
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::mpsc;
    use std::sync::Arc;
    use std::time::Duration;

    use crate::{JoinError, Runtime};

    /// A task waiting in a receive holds the rank's state through its communicator, and the
    /// rank's state holds the task through the receive's waker. Shutdown cancels the task,
    /// which breaks the cycle: once the last handle is gone, the rank's state (transport,
    /// endpoints) is freed. It used to leak.
    #[test]
    fn shutdown_frees_the_rank_state_a_waiting_task_holds() {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let rt = Runtime::builder().env(false).workers(2).build().unwrap();
            let weak = Arc::downgrade(&rt.engine);
            let comm = rt.world().clone();
            let (polled_tx, polled) = mpsc::channel();
            let h = rt.spawn(async move {
                let r = comm.irecv(Vec::<u8>::with_capacity(4), 0u32, 5).unwrap();
                polled_tx.send(()).unwrap();
                r.await.map(|(b, _)| b.len())
            });
            polled.recv().unwrap();
            drop(rt);
            let res = futures::executor::block_on(h);
            let _ = tx.send((res, weak.upgrade().is_none()));
        });
        let (res, freed) = rx.recv_timeout(Duration::from_secs(10)).expect("hang: dropping a runtime with a task waiting in a receive");
        assert_eq!(res, Err(JoinError::Cancelled));
        assert!(freed, "the rank's state is still alive after its runtime and every task are gone");
    }
}
