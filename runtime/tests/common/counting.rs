//! A global allocator that counts allocations, on every thread, while armed (and tells
//! when one watched allocation is freed): the
//! zero-allocation tests include it with `#[path = "common/counting.rs"] mod counting;`. A
//! binary that includes it holds one counting test, as the test harness's own threads
//! allocate while another test would be counting.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

struct Counting;
static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static ARMED: AtomicBool = AtomicBool::new(false);
/// The smallest allocation counted, in bytes.
static MIN_SIZE: AtomicUsize = AtomicUsize::new(0);
/// Whether only the allocations of the threads that set [`HERE`] count.
static ONLY_HERE: AtomicBool = AtomicBool::new(false);

/// The address of the allocation [`watch`] looks out for (0: none), and whether it was
/// freed since.
static WATCHED: AtomicUsize = AtomicUsize::new(0);
static WATCHED_FREED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set on the thread that counts with [`allocations_on_this_thread`].
    static HERE: Cell<bool> = const { Cell::new(false) };
}

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if ARMED.load(Ordering::Relaxed)
            && l.size() >= MIN_SIZE.load(Ordering::Relaxed)
            && (!ONLY_HERE.load(Ordering::Relaxed) || HERE.try_with(Cell::get).unwrap_or(false))
        {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as ours.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if p as usize == WATCHED.load(Ordering::Relaxed) {
            WATCHED_FREED.store(true, Ordering::Release);
        }
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The allocations made (by any thread) while `f` runs.
#[allow(dead_code)] // Not every test binary that includes this module counts all sizes.
pub(crate) fn allocations(f: impl FnOnce()) -> usize {
    allocations_of_at_least(0, f)
}

/// The allocations of at least `bytes` made (by any thread) while `f` runs.
#[allow(dead_code)] // Not every test binary that includes this module counts by size.
pub(crate) fn allocations_of_at_least(bytes: usize, f: impl FnOnce()) -> usize {
    MIN_SIZE.store(bytes, Ordering::Relaxed);
    ALLOCS.store(0, Ordering::Relaxed);
    ARMED.store(true, Ordering::Relaxed);
    f();
    ARMED.store(false, Ordering::Relaxed);
    ALLOCS.load(Ordering::Relaxed)
}

/// The allocations made by the calling thread while `f` runs (others' are not counted:
/// the runtime's own threads, which park and wake at times the load decides, allocate in
/// ways a test of the caller's path must not see).
#[allow(dead_code)] // Not every test binary that includes this module counts one thread.
pub(crate) fn allocations_on_this_thread(f: impl FnOnce()) -> usize {
    HERE.with(|h| h.set(true));
    ONLY_HERE.store(true, Ordering::Relaxed);
    let n = allocations(f);
    ONLY_HERE.store(false, Ordering::Relaxed);
    HERE.with(|h| h.set(false));
    n
}

/// The allocations (by any thread) of `counted` calls of `round`, made after `warm` calls
/// that bring the pools and queues to their steady state.
#[allow(dead_code)] // Not every test binary that includes this module warms rounds.
pub(crate) fn allocations_after_warming(warm: usize, counted: usize, mut round: impl FnMut()) -> usize {
    for _ in 0..warm {
        round();
    }
    allocations(|| (0..counted).for_each(|_| round()))
}

/// [`allocations_after_warming`], counting the calling thread's allocations only (see
/// [`allocations_on_this_thread`]).
#[allow(dead_code)] // Not every test binary that includes this module warms rounds.
pub(crate) fn allocations_on_this_thread_after_warming(warm: usize, counted: usize, mut round: impl FnMut()) -> usize {
    for _ in 0..warm {
        round();
    }
    allocations_on_this_thread(|| (0..counted).for_each(|_| round()))
}

/// Looks out for the free of the allocation at `p` (one at a time): [`freed`] says whether
/// it happened since.
#[allow(dead_code)] // Not every test binary that includes this module watches a free.
pub(crate) fn watch<T>(p: *const T) {
    WATCHED_FREED.store(false, Ordering::Relaxed);
    WATCHED.store(p as usize, Ordering::Relaxed);
}

/// Whether the allocation given to [`watch`] was freed since.
#[allow(dead_code)] // Not every test binary that includes this module watches a free.
pub(crate) fn freed() -> bool {
    WATCHED_FREED.load(Ordering::Acquire)
}
