//! Test-and-test-and-set with exponential backoff ([Amer 2019, §2.3], the user-space half of the
//! Pthread mutex protocol, without the futex sleep).
//!
//! # State word
//!
//! | `locked` | meaning |
//! |---|---|
//! | `false` | free |
//! | `true`  | held; waiters (if any) spin reading it, each with its own backoff |
//!
//! Unfair: whoever's atomic swap lands first after a release wins, which favours the thread
//! that just released (it still has the line in its cache) — the behaviour [Amer 2019, §2.3]
//! reports for the Pthread mutex.
//!
//! # Memory ordering
//!
//! The winning `swap(true, Acquire)` synchronizes-with the previous holder's
//! `store(false, Release)`; reads while waiting are `Relaxed` because they only decide when
//! to retry the swap.

use std::pin::Pin;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::spin::SpinWait;
use super::{RawLock, RawTimedLock};
use crate::loom::sync::atomic::{AtomicBool, Ordering};

/// Test-and-set lock with exponential backoff. Node: `()`.
#[derive(Debug)]
pub struct Tas {
    /// `true` while held (see the state table in the module docs).
    locked: CachePadded<AtomicBool>,
}

impl Default for Tas {
    fn default() -> Self {
        Tas::new()
    }
}

impl Tas {
    /// A free lock.
    pub fn new() -> Self {
        Tas { locked: CachePadded::new(AtomicBool::new(false)) }
    }

    /// Whether the lock is held right now (a racy snapshot).
    pub fn is_locked(&self) -> bool {
        self.locked.load(Ordering::Relaxed)
    }

    #[inline]
    fn try_acquire(&self) -> bool {
        // Acquire: on success, see everything the previous holder wrote before its Release.
        !self.locked.load(Ordering::Relaxed) && !self.locked.swap(true, Ordering::Acquire)
    }

    /// Spins until acquired or until `deadline` (if any) passes.
    #[cold]
    fn lock_slow(&self, deadline: Option<Instant>) -> bool {
        let spin = SpinWait::new();
        loop {
            spin.wait();
            if self.try_acquire() {
                return true;
            }
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return false;
                }
            }
        }
    }
}

// SAFETY: `locked` admits one `true` swapper at a time; the Acquire swap pairs with the
// Release store in `unlock`. There is no node, so nothing is referenced after `unlock`.
unsafe impl RawLock for Tas {
    type Node = ();

    #[inline]
    fn lock(&self, _node: Pin<&()>) {
        if !self.try_acquire() {
            self.lock_slow(None);
        }
    }

    #[inline]
    fn try_lock(&self, _node: Pin<&()>) -> bool {
        self.try_acquire()
    }

    #[inline]
    unsafe fn unlock(&self, _node: Pin<&()>) {
        // Release: publish the critical section to the next Acquire swap.
        self.locked.store(false, Ordering::Release);
    }
}

// SAFETY: returns `true` only after a successful Acquire swap, as `lock`.
unsafe impl RawTimedLock for Tas {
    fn try_lock_for(&self, _node: Pin<&()>, timeout: Duration) -> bool {
        // An unrepresentable deadline (a timeout of centuries) means wait like `lock`.
        self.try_acquire() || self.lock_slow(super::deadline_after(timeout))
    }
}

super::flat_priority!(Tas);
