//! Test-and-set whose release is one plain store, with waiters that sleep: the default of
//! the CRI and matching paths.
//!
//! On those paths a lock is nearly always free when taken: a thread posts a send on its own
//! CRI, a receiver posts into and matches on its own matching engine. What an acquisition
//! costs then is its locked instructions, and `parking_lot`'s release is one more of them (a
//! `lock cmpxchg`, which also waits for every store before it, the frame just written into
//! an inbox slot whose line another core holds). A [`Tas`](super::Tas) releases with a
//! plain store, but its waiters spin and yield: with more threads than cores they take the
//! cores from the holder. This protocol releases like `Tas` and parks like a futex mutex.
//!
//! # State
//!
//! | word | values |
//! |---|---|
//! | `locked` | 0 free, 1 held (the futex word waiters sleep on) |
//! | `sleepers` | how many waiters are between announcing their sleep and leaving it |
//!
//! **Acquire**: a compare-exchange of 0 for 1 after a relaxed load saw 0
//! (test-and-test-and-set). A waiter
//! spins with exponential backoff for a few rounds ([`SpinWait::done`]), then announces
//! itself (`sleepers += 1`), takes a full barrier, and sleeps on `locked` while it is 1
//! (`FUTEX_WAIT`, which returns at once if it is not); it leaves (`sleepers -= 1`) and tries
//! again, spinning anew, when woken or not put to sleep.
//!
//! **Release**: `locked.store(0)`, then a load of `sleepers`: a wake (`FUTEX_WAKE`, one
//! waiter) only when it is not 0.
//!
//! # The release's missing fence
//!
//! Release and sleep are a store-buffering handshake: the holder stores `locked`, then loads
//! `sleepers`; a waiter stores `sleepers`, then (inside `FUTEX_WAIT`) loads `locked`. Each
//! side needs a full barrier between its store and its load, or both may read the old value
//! and the waiter sleeps through the release. The release runs on every message; a sleep
//! only when the lock stays taken past the spinning. Where the process registered for
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` (as the embedded doorbell does), the
//! waiter, after its announcement, has the kernel run a full barrier on every CPU running a
//! thread of the process, and the release orders its load after its store with a compiler
//! fence only. Either a releaser's barrier fell after its store, which is then visible to
//! the waiter's `FUTEX_WAIT` (it does not sleep), or it fell before its load, which then
//! sees the announcement (it wakes the waiter; the kernel orders a `FUTEX_WAKE` after the
//! store before it). A descheduled releaser passed a barrier when it left its CPU. Where
//! the process did not register, the release keeps a `SeqCst` fence between its store and
//! its load (as the waiter always has). Under loom there is no such barrier to model: the
//! models check the fenced handshake, with a condition variable for the futex.
//!
//! # Fairness
//!
//! As [`Tas`](super::Tas), none: a releasing thread that comes back at once usually takes
//! the lock again before a woken waiter runs. The paths it guards hold it for a send or a
//! pass over the frames already arrived, and their waiters are few (a CRI's senders, a
//! communicator's receivers and its progress).

use std::pin::Pin;
use std::sync::atomic::compiler_fence;
use std::time::Duration;

use crossbeam_utils::CachePadded;

use super::spin::SpinWait;
use super::{RawLock, RawTimedLock};
use crate::loom::sync::atomic::{fence, AtomicU32, Ordering};

/// Test-and-set that releases with a plain store and parks its waiters. Node: `()`.
#[derive(Debug)]
pub struct TasPark {
    /// The lock word, the waiters' count and the release's choice of fence, on one line:
    /// the release reads the other two right after storing the word.
    words: CachePadded<Words>,
    /// The futex under loom.
    #[cfg(loom)]
    futex: futex::Futex,
}

/// The two words of a [`TasPark`] (module docs, *State*).
#[derive(Debug)]
struct Words {
    /// 0 free, 1 held.
    locked: AtomicU32,
    /// Waiters that announced a sleep and have not left it yet.
    sleepers: AtomicU32,
    /// Whether the release may leave out its fence (module docs): the process registered
    /// for `membarrier`, whose barrier the waiters run.
    fenceless: bool,
}

impl Default for TasPark {
    fn default() -> Self {
        TasPark::new()
    }
}

impl TasPark {
    /// A free lock.
    pub fn new() -> Self {
        TasPark::with_fence(!weft_transport::membarrier::private_registered())
    }

    /// A free lock whose release fences (`true`) or, where the process registered for
    /// `membarrier`, leaves the fence to the waiters' barrier (`false`; a lock asked for
    /// that elsewhere fences anyway).
    pub fn with_fence(fence: bool) -> Self {
        TasPark {
            words: CachePadded::new(Words {
                locked: AtomicU32::new(0),
                sleepers: AtomicU32::new(0),
                fenceless: !fence && weft_transport::membarrier::private_registered(),
            }),
            #[cfg(loom)]
            futex: futex::Futex::default(),
        }
    }

    /// Whether the lock is held right now (a racy snapshot).
    pub fn is_locked(&self) -> bool {
        self.words.locked.load(Ordering::Relaxed) != 0
    }

    /// Whether releases go without a fence (module docs).
    pub fn is_fenceless(&self) -> bool {
        self.words.fenceless
    }

    #[inline]
    fn try_acquire(&self) -> bool {
        // Acquire: on success, see everything the previous holder wrote before its Release.
        // A compare-exchange, not a swap: a failed attempt writes nothing (the same locked
        // instruction on x86), so the lock word's last write is always a holder's.
        let w = &self.words.locked;
        w.load(Ordering::Relaxed) == 0 && w.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Spins, then sleeps, until acquired.
    #[cold]
    #[inline(never)]
    fn lock_slow(&self) {
        loop {
            let spin = SpinWait::new();
            while !spin.done() {
                spin.wait();
                if self.try_acquire() {
                    return;
                }
            }
            self.sleep();
            if self.try_acquire() {
                return;
            }
        }
    }

    /// One sleep on `locked` while it is held (module docs: announce, barrier, wait, leave).
    fn sleep(&self) {
        let w = &*self.words;
        // SeqCst: the announcement and the barrier below order it before the load of
        // `locked` that the futex makes.
        w.sleepers.fetch_add(1, Ordering::SeqCst);
        if w.fenceless {
            weft_transport::membarrier::private_barrier();
        } else {
            fence(Ordering::SeqCst);
        }
        self.futex_wait();
        w.sleepers.fetch_sub(1, Ordering::Relaxed);
    }

    #[cfg(not(loom))]
    fn futex_wait(&self) {
        futex::wait(&self.words.locked, 1);
    }

    #[cfg(loom)]
    fn futex_wait(&self) {
        self.futex.wait(&self.words.locked, 1);
    }

    /// Wakes one sleeper, out of line: the release inlines a load and a branch.
    #[cold]
    #[inline(never)]
    fn wake(&self) {
        #[cfg(not(loom))]
        futex::wake(&self.words.locked);
        #[cfg(loom)]
        self.futex.wake();
    }
}

// SAFETY: `locked` admits one exchange of 0 for 1 at a time; the Acquire exchange pairs with
// the Release store in `unlock`. There is no node, so nothing is referenced after `unlock`.
unsafe impl RawLock for TasPark {
    type Node = ();

    #[inline]
    fn lock(&self, _node: Pin<&()>) {
        if !self.try_acquire() {
            self.lock_slow();
        }
    }

    #[inline]
    fn try_lock(&self, _node: Pin<&()>) -> bool {
        self.try_acquire()
    }

    #[inline]
    unsafe fn unlock(&self, _node: Pin<&()>) {
        let w = &*self.words;
        // Release: publish the critical section to the next Acquire exchange.
        w.locked.store(0, Ordering::Release);
        // The handshake's barrier (module docs): the waiters' `membarrier`, or this fence.
        if w.fenceless {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        // Relaxed: ordered after the store by the barrier above.
        if w.sleepers.load(Ordering::Relaxed) != 0 {
            self.wake();
        }
    }
}

// SAFETY: returns `true` only after a successful Acquire exchange, as `lock`.
unsafe impl RawTimedLock for TasPark {
    /// Polls with backoff until the deadline: a bounded wait does not sleep on the futex
    /// (whose wake-up would then have to be passed on when the waiter gives up).
    fn try_lock_for(&self, node: Pin<&()>, timeout: Duration) -> bool {
        if timeout == Duration::MAX {
            self.lock(node);
            return true;
        }
        super::poll_try_lock_for(self, node, timeout)
    }
}

super::flat_priority!(TasPark);

// One line's worth of padding and nothing after it: a field outside `words` would double the
// lock's size (its alignment is the padding's).
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<TasPark>() == std::mem::size_of::<CachePadded<Words>>());

/// `FUTEX_WAIT` and `FUTEX_WAKE` on a `u32`, private to the process.
#[cfg(not(loom))]
mod futex {
    use std::sync::atomic::AtomicU32;

    /// Sleeps while `*word == expected` (returns at once if it is not; may return
    /// spuriously).
    #[cfg(target_os = "linux")]
    pub(super) fn wait(word: &AtomicU32, expected: u32) {
        // SAFETY: `word` is a live, aligned u32 for the call; no timeout.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                std::ptr::null::<libc::timespec>(),
            );
        }
    }

    /// Wakes one thread sleeping in [`wait`] on `word`.
    #[cfg(target_os = "linux")]
    pub(super) fn wake(word: &AtomicU32) {
        // SAFETY: `word` is a live, aligned u32 for the call.
        unsafe {
            libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1);
        }
    }

    /// Elsewhere: a yield stands for the sleep (a spurious return, which callers allow).
    #[cfg(not(target_os = "linux"))]
    pub(super) fn wait(_: &AtomicU32, _: u32) {
        std::thread::yield_now();
    }

    /// Elsewhere: nobody sleeps.
    #[cfg(not(target_os = "linux"))]
    pub(super) fn wake(_: &AtomicU32) {}
}

/// The futex under loom: the check of the word and the sleep atomic with respect to a
/// wake, as the kernel's.
#[cfg(loom)]
mod futex {
    use crate::loom::sync::atomic::{AtomicU32, Ordering};
    use crate::loom::sync::{Condvar, Mutex};

    #[derive(Debug, Default)]
    pub(super) struct Futex {
        m: Mutex<()>,
        cv: Condvar,
    }

    impl Futex {
        pub(super) fn wait(&self, word: &AtomicU32, expected: u32) {
            let g = self.m.lock().unwrap();
            if word.load(Ordering::SeqCst) == expected {
                drop(self.cv.wait(g).unwrap());
            }
        }

        pub(super) fn wake(&self) {
            let _g = self.m.lock().unwrap();
            self.cv.notify_one();
        }
    }
}
