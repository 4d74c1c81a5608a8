//! Dedicated CRI assignment ([Patinyasakdikul 2019, Alg. 3], GET-INSTANCE-ID-DEDICATED): a thread
//! keeps the CRI it was first given, per runtime, in thread-local storage.

use std::cell::{Cell, RefCell};

thread_local! {
    /// `(runtime id, CRI index)` pairs of this thread; a handful at most.
    static DEDICATED: RefCell<Vec<(u64, usize)>> = const { RefCell::new(Vec::new()) };
    /// The pair last looked up (runtime ids start at 1): a thread mostly talks through one
    /// runtime, and a send and each progress pass ask, so the common answer is one
    /// thread-local load instead of a `RefCell` borrow and a scan.
    static LAST: Cell<(u64, usize)> = const { Cell::new((0, 0)) };
}

/// This thread's dedicated CRI in runtime `id`, assigned by `assign` on first use.
#[inline]
pub(crate) fn dedicated(id: u64, assign: impl FnOnce() -> usize) -> usize {
    if let Ok((r, k)) = LAST.try_with(Cell::get) {
        if r == id {
            return k;
        }
    }
    let known = DEDICATED.try_with(|d| d.borrow().iter().find(|(r, _)| *r == id).map(|&(_, k)| k));
    if let Ok(Some(k)) = known {
        let _ = LAST.try_with(|l| l.set((id, k)));
    }
    match known {
        Ok(Some(k)) => k,
        Ok(None) => {
            let k = assign();
            pin(id, k);
            k
        }
        Err(_) => 0,
    }
}

/// Makes `k` this thread's dedicated CRI in runtime `id` (replacing an earlier choice).
pub(crate) fn pin(id: u64, k: usize) {
    let _ = LAST.try_with(|l| l.set((id, k)));
    let _ = DEDICATED.try_with(|d| {
        let mut d = d.borrow_mut();
        match d.iter_mut().find(|(r, _)| *r == id) {
            Some(slot) => slot.1 = k,
            None => d.push((id, k)),
        }
    });
}

/// A token naming the calling thread (non-zero), used for progress ownership.
#[inline]
pub(crate) fn thread_token() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static TOKEN: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    TOKEN.try_with(|t| *t).unwrap_or(u64::MAX)
}
