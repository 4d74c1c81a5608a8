//! `CompletionCell`: the per-operation state word.
//!
//! Every weft request owns one cell. The transport side completes it exactly once; the user
//! side either polls it (a `Waker` is registered) or attaches it to a
//! [`SyncObject`](crate::SyncObject), in which case the completion is pushed onto that
//! object's queue instead. Attaching races with completing; the race is resolved with one
//! atomic read-modify-write on the state word ([Patinyasakdikul 2019, §4.6.1]: "the solution is an atomic
//! compare and swap"): whoever comes second sees the other's bit and finishes the job.
//!
//! # State word
//!
//! | bit | name        | set by                       | cleared by            |
//! |-----|-------------|------------------------------|-----------------------|
//! | 0   | `COMPLETE`  | the completer (`fetch_or`)   | `reset` (exclusive)   |
//! | 1   | `ATTACHED`  | `attach` (CAS, not complete; | `detach` (CAS), reset |
//! |     |             | `fetch_or` once complete)    |                       |
//! | 2   | `HAS_WAKER` | `poll` after storing a waker | `reset`               |
//! | 3   | `HELD`      | `mark_held` (exclusive)      | `reset`               |
//! | 4   | `LEFT`      | `leave` (`fetch_or`)         | `reset`               |
//! | 5   | `COUNTED`   | `hold_counted` (`fetch_or`)  | `reset`               |
//!
//! The outcome slot is written by the completer *before* it sets `COMPLETE`; the attachment
//! slot is written by the attacher *before* it sets `ATTACHED`. Each slot is read only by the
//! side that observes the other's bit, so each is written once and read once per cycle.
//!
//! `COMPLETE | ATTACHED` means the completion went to a sync object: either the completer
//! found the attachment, or an attach found the cell complete, delivered it itself and set
//! `ATTACHED` afterwards. A later attach sees both bits and is refused, so one completion is
//! never queued twice (on two objects, or twice on one).
//!
//! # A holder on the owner's share (`HELD`, `LEFT`, `COUNTED`)
//!
//! A runtime may hold a pending operation without a reference count of its own (a posted
//! receive in a matching queue): the owner's reference stands for both, so that posting and
//! completing touch no count. `mark_held` says so before anyone else can see the cell. The
//! owner that lets go of a pending operation (a request dropped after its receive matched,
//! or whose result went to a callback) calls `leave`; the holder completes with
//! [`complete_held`](CompletionCell::complete_held). The two read-modify-writes on the state
//! word decide, whichever comes second seeing the other's bit: an owner that finds the cell
//! complete (or the holder counted, below) drops its reference itself; otherwise the
//! completion finds `LEFT` and the reference is the completer's to drop. A holder that
//! needs a reference of its own (a read that completes later, code that keeps operations
//! counted) takes one and calls `hold_counted`: from then on the owner's reference is its
//! own again (an owner that had left already gave its reference to the holder, which drops
//! one of its two). Completing touches the cell after `COMPLETE` only to deliver to an
//! attachment or a waker; `complete_held` has the holder take a reference for that first
//! (its `pin`), so that an owner who sees `COMPLETE` and recycles the operation never
//! recycles it under a delivery.
//!
//! # Memory ordering
//!
//! * `complete` sets `COMPLETE` with `AcqRel`: the release publishes the outcome to whoever
//!   observes the bit (a poller, an attacher, `outcome()`); the acquire makes the attacher's
//!   attachment (written before its release-CAS) visible when `ATTACHED` was already set.
//! * `attach` CASes `ATTACHED` in with `AcqRel`: release publishes the attachment; on failure
//!   the acquire load sees the completer's outcome.
//! * `poll` sets `HAS_WAKER` with `AcqRel` after storing the waker under the slot's mutex; the
//!   completer takes the waker under the same mutex, so the store is visible to it.

use std::fmt;
use std::mem::{self, MaybeUninit};
use std::task::{Context, Poll, Waker};

use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{AtomicUsize, Ordering};
use crate::loom::sync::Mutex;
use crate::status::{Error, Outcome, Status};

const COMPLETE: usize = 0b001;
const ATTACHED: usize = 0b010;
const HAS_WAKER: usize = 0b100;
const HELD: usize = 0b1000;
const LEFT: usize = 0b1_0000;
const COUNTED: usize = 0b10_0000;

/// Inline storage for a sync object's completion data: a value that fits two words is stored
/// in place, anything larger is boxed. This keeps `attach` free of allocation for the data
/// users actually attach (indices, pointers, `Arc`s, small tuples).
pub(crate) type DataSlot = MaybeUninit<[usize; 2]>;

/// What `complete` calls when the cell is attached. Type-erased so the cell need not be
/// generic over the sync object's data type.
#[derive(Clone, Copy)]
pub(crate) struct Attachment {
    /// `Arc::into_raw` of the sync object's shared state; owned by the attachment.
    pub(crate) sink: *const (),
    /// Delivers (or, with `None`, cancels) the completion and releases `sink`.
    pub(crate) deliver: unsafe fn(sink: *const (), data: *mut DataSlot, with_data: bool, outcome: Outcome),
    /// The user's completion data, meaningful when `with_data`.
    pub(crate) data: DataSlot,
    /// `false` for counted attachments (`MPIX_SYNC_NO_COMPLETION_DATA`).
    pub(crate) with_data: bool,
}

/// Outcome of [`CompletionCell::try_attach`].
pub(crate) enum AttachRace {
    /// The attachment is in place; the completer will deliver it.
    Attached,
    /// The cell had completed first; the attachment is handed back with the outcome so the
    /// attacher delivers it itself.
    AlreadyComplete(Attachment, Outcome),
    /// The cell is already attached (to this or another object).
    AlreadyAttached(Attachment),
}

/// The per-operation completion state shared by a request and the runtime.
///
/// A cell is completed at most once per cycle with [`complete`](Self::complete) and can be
/// recycled with [`reset`](Self::reset) once its owner has exclusive access again.
pub struct CompletionCell {
    /// The state word; see the module docs for the bit table.
    state: AtomicUsize,
    /// Written once by the completer before `COMPLETE` is set.
    outcome: UnsafeCell<Option<Outcome>>,
    /// Written by the attacher before `ATTACHED` is set; read by the completer or detacher.
    attachment: UnsafeCell<MaybeUninit<Attachment>>,
    /// The task (or parked thread) polling this cell directly.
    waker: Mutex<Option<Waker>>,
}

// SAFETY: the `UnsafeCell` slots are each written by one party before a release RMW of the
// state word and read only by the party that observes that bit with acquire ordering (see
// the module docs), so no slot is accessed concurrently from two threads. The raw pointer in
// `Attachment` is an `Arc` of a `Send + Sync` sync object whose data type is `Send`.
unsafe impl Send for CompletionCell {}
// SAFETY: as for `Send`; every `&self` method synchronizes through the state word or mutex.
unsafe impl Sync for CompletionCell {}

impl Default for CompletionCell {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for CompletionCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.state.load(Ordering::Relaxed);
        f.debug_struct("CompletionCell").field("complete", &(s & COMPLETE != 0)).field("attached", &(s & ATTACHED != 0)).finish()
    }
}

impl CompletionCell {
    /// A pending cell.
    pub fn new() -> Self {
        CompletionCell {
            state: AtomicUsize::new(0),
            outcome: UnsafeCell::new(None),
            attachment: UnsafeCell::new(MaybeUninit::uninit()),
            waker: Mutex::new(None),
        }
    }

    /// Whether the operation has completed.
    #[inline]
    pub fn is_complete(&self) -> bool {
        // Acquire: a caller that sees `true` may go on to read the outcome.
        self.state.load(Ordering::Acquire) & COMPLETE != 0
    }

    /// Whether the cell is attached to a sync object and not yet complete.
    #[inline]
    pub fn is_attached(&self) -> bool {
        self.state.load(Ordering::Relaxed) & (ATTACHED | COMPLETE) == ATTACHED
    }

    /// Whether an attach (to a sync object, or a callback, [`on_complete`](crate::on_complete))
    /// would be accepted: the cell is not attached, and its completion was not delivered to
    /// an attachment. Only the owner of the request (who alone may attach) can rely on the
    /// answer staying true.
    #[inline]
    pub fn attachable(&self) -> bool {
        self.state.load(Ordering::Acquire) & ATTACHED == 0
    }

    /// The outcome, once complete.
    #[inline]
    pub fn outcome(&self) -> Option<Outcome> {
        if !self.is_complete() {
            return None;
        }
        // SAFETY: `COMPLETE` was observed with acquire ordering, so the completer's write of
        // the outcome happened before this read and no one writes it again until `reset`,
        // which needs `&mut self`.
        self.outcome.with(|p| unsafe { *p })
    }

    /// Completes the operation: stores `outcome`, then delivers it to the attached sync
    /// object, or wakes the registered waker.
    ///
    /// Returns `false` (and changes nothing) if the cell was already complete: a completion
    /// is delivered exactly once.
    #[inline]
    pub fn complete(&self, outcome: Outcome) -> bool {
        self.complete_in(outcome)
    }

    /// [`complete`](Self::complete) with a success: the status is written into the cell's
    /// slot where it is made, field by field. (An `Outcome` made on the stack on one of
    /// several paths and then copied into the slot is read back, as a whole, from the
    /// stores that just made it: a load that waits for them to retire instead of taking
    /// their values, once per message on the receive side.)
    #[inline]
    pub fn complete_ok(&self, status: Status) -> bool {
        self.complete_in(Ok(status))
    }

    /// [`complete`](Self::complete)'s body, inlined into both.
    #[inline(always)]
    fn complete_in(&self, outcome: Outcome) -> bool {
        // Fast reject of a second completion; the runtime never does this, but a cell must not
        // be corrupted by it either.
        if self.state.load(Ordering::Relaxed) & COMPLETE != 0 {
            return false;
        }
        // SAFETY: only the completer writes `outcome`, and only before setting `COMPLETE`;
        // readers wait for `COMPLETE` (acquire). A racing second completer is excluded by the
        // runtime's single-completer rule; the check above catches sequential misuse.
        self.outcome.with_mut(|p| unsafe { *p = Some(outcome) });
        // AcqRel: release publishes the outcome; acquire sees an attacher's attachment.
        let prev = self.state.fetch_or(COMPLETE, Ordering::AcqRel);
        debug_assert_eq!(prev & COMPLETE, 0, "completion cell completed twice");
        if prev & (ATTACHED | HAS_WAKER) != 0 {
            self.notify(prev);
        }
        true
    }

    /// Marks a cell whose operation a holder keeps on the owner's share (module docs), while
    /// the owner has it exclusively (before the operation is posted).
    #[inline]
    pub fn mark_held(&mut self) {
        crate::loom::with_mut(&mut self.state, |s| *s |= HELD);
    }

    /// Whether [`mark_held`](Self::mark_held) marked the cell (stable until `reset`).
    #[inline]
    pub fn is_held(&self) -> bool {
        self.state.load(Ordering::Relaxed) & HELD != 0
    }

    /// [`complete`](Self::complete) by the holder of a cell marked held (module docs): returns
    /// whether the owner had left, its reference now the caller's, and what `pin` made if
    /// the completion had a delivery to make (called before `COMPLETE` is published, so that
    /// the caller keeps the operation alive across the delivery by a reference of its own).
    /// An already complete cell is left unchanged: `(false, None)`.
    #[inline(always)]
    pub fn complete_held<G>(&self, outcome: Outcome, pin: impl FnOnce() -> G) -> (bool, Option<G>) {
        let mut cur = self.state.load(Ordering::Relaxed);
        if cur & COMPLETE != 0 {
            return (false, None);
        }
        // SAFETY: as in `complete_in`.
        self.outcome.with_mut(|p| unsafe { *p = Some(outcome) });
        let mut pinned = None;
        let mut pin = Some(pin);
        loop {
            if cur & (ATTACHED | HAS_WAKER) != 0 {
                if let Some(pin) = pin.take() {
                    pinned = Some(pin());
                }
            }
            // AcqRel, as `complete_in`; the acquire also orders an owner's use of the
            // operation before it left (`LEFT`) before ours.
            match self.state.compare_exchange_weak(cur, cur | COMPLETE, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(actual) => cur = actual,
            }
        }
        if cur & (ATTACHED | HAS_WAKER) != 0 {
            self.notify(cur);
        }
        (cur & LEFT != 0, pinned)
    }

    /// The owner lets go of a pending operation that it may share with a holder (module
    /// docs): `true` if the holder now has the owner's reference (the cell is marked held,
    /// not complete, and the holder has not counted one of its own), `false` if the owner is
    /// to drop its reference itself.
    #[inline]
    pub fn leave(&self) -> bool {
        if !self.is_held() {
            return false;
        }
        // AcqRel: release orders the owner's last use before the completer's (acquire) drop;
        // acquire, when `COMPLETE` or `COUNTED` is seen, orders the holder's use before ours.
        self.state.fetch_or(LEFT, Ordering::AcqRel) & (COMPLETE | COUNTED) == 0
    }

    /// The holder of a cell marked held has taken a reference of its own, and the owner's
    /// is the owner's again (module docs): `true` if the owner had left already, its
    /// reference given to the caller, which now holds two and drops one.
    #[inline]
    pub fn hold_counted(&self) -> bool {
        // AcqRel: as `leave`, from the other side.
        self.state.fetch_or(COUNTED, Ordering::AcqRel) & LEFT != 0
    }

    /// [`complete`](Self::complete)'s delivery, out of line (a request waited for by testing
    /// has neither): to the attachment if `prev` (the state before `COMPLETE` was set) has
    /// one, and to the registered waker. The outcome is read from its slot (the caller, the
    /// completer, wrote it), not carried across the completion's read-modify-write.
    #[inline(never)]
    fn notify(&self, prev: usize) {
        crate::stamps::stamp();
        // SAFETY: we are the completer and wrote the slot before setting `COMPLETE`; nobody
        // writes it again until `reset` (`&mut self`).
        let outcome = self.outcome.with(|p| unsafe { *p }).unwrap_or(Err(Error::Cancelled));
        if prev & ATTACHED != 0 {
            // SAFETY: `ATTACHED` was set by a release-CAS after the attachment was written,
            // and we observed it with acquire; the attacher no longer touches the slot and a
            // detacher's CAS must now fail because `COMPLETE` is set.
            let mut att = self.attachment.with(|p| unsafe { (*p).assume_init() });
            // SAFETY: the attachment was built by `SyncObject::attach` for its own `deliver`,
            // and this is the one call that consumes it.
            unsafe { (att.deliver)(att.sink, &mut att.data, att.with_data, outcome) };
        }
        if prev & HAS_WAKER != 0 {
            let waker = crate::loom::lock(&self.waker).take();
            if let Some(w) = waker {
                w.wake();
            }
        }
    }

    /// Polls for completion, registering `cx`'s waker if still pending.
    pub fn poll_complete(&self, cx: &mut Context<'_>) -> Poll<Outcome> {
        if let Some(o) = self.outcome() {
            return Poll::Ready(o);
        }
        {
            let mut slot = crate::loom::lock(&self.waker);
            match &*slot {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *slot = Some(cx.waker().clone()),
            }
        }
        // AcqRel: after this RMW either the completer sees `HAS_WAKER` (and takes the waker
        // stored above under the mutex) or we see `COMPLETE` here.
        let prev = self.state.fetch_or(HAS_WAKER, Ordering::AcqRel);
        if prev & COMPLETE != 0 {
            // SAFETY: `COMPLETE` observed with acquire (AcqRel RMW); see `outcome`.
            let o = self.outcome.with(|p| unsafe { *p });
            if let Some(o) = o {
                return Poll::Ready(o);
            }
        }
        Poll::Pending
    }

    /// Attaches `att`, racing with `complete` ([Patinyasakdikul 2019, §4.6.1]).
    ///
    /// The caller must have exclusive attach rights on this cell (it holds `&mut` of the
    /// request that owns it), so no two attachers race each other.
    pub(crate) fn try_attach(&self, att: Attachment) -> AttachRace {
        let mut cur = self.state.load(Ordering::Acquire);
        if cur & COMPLETE != 0 {
            if cur & ATTACHED != 0 {
                // The completion was already delivered to the sync object this cell was
                // attached to; delivering it again would queue the same event twice.
                return AttachRace::AlreadyAttached(att);
            }
            // SAFETY: `COMPLETE` observed with acquire.
            let o = self.outcome.with(|p| unsafe { *p }).unwrap_or(Err(Error::Cancelled));
            self.mark_taken();
            return AttachRace::AlreadyComplete(att, o);
        }
        if cur & ATTACHED != 0 {
            return AttachRace::AlreadyAttached(att);
        }
        // SAFETY: `ATTACHED` is clear, so neither a completer nor a detacher reads the slot,
        // and the caller's exclusive attach rights mean no one else writes it.
        self.attachment.with_mut(|p| unsafe { (*p).write(att) });
        loop {
            // AcqRel: release publishes the attachment; acquire (on failure) sees the outcome.
            match self.state.compare_exchange_weak(cur, cur | ATTACHED, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return AttachRace::Attached,
                Err(actual) => {
                    if actual & COMPLETE != 0 {
                        // The completer won: take the attachment back and deliver it here.
                        // SAFETY: `ATTACHED` never got set, so the slot is still ours.
                        let att = self.attachment.with(|p| unsafe { (*p).assume_init() });
                        // SAFETY: `COMPLETE` observed with acquire.
                        let o = self.outcome.with(|p| unsafe { *p }).unwrap_or(Err(Error::Cancelled));
                        self.mark_taken();
                        return AttachRace::AlreadyComplete(att, o);
                    }
                    cur = actual; // a waker bit changed; retry
                }
            }
        }
    }

    /// Records that an attach took this (complete) cell's completion: sets `ATTACHED` next
    /// to `COMPLETE`, so that a later attach is refused instead of delivering it again.
    fn mark_taken(&self) {
        // Relaxed: the bit is read only by later attachers, who are ordered after us by the
        // exclusive (`&mut`) access to the request that attaching requires; with `COMPLETE`
        // set, no completer or detacher looks at it.
        self.state.fetch_or(ATTACHED, Ordering::Relaxed);
    }

    /// Reads the current attachment's sink pointer, if attached and not complete.
    pub(crate) fn attached_sink(&self) -> Option<*const ()> {
        // Acquire: pairs with the attacher's release-CAS (the slot is initialized).
        if self.state.load(Ordering::Acquire) & (ATTACHED | COMPLETE) != ATTACHED {
            return None;
        }
        // SAFETY: `ATTACHED` observed with acquire; the slot is read-only until detach or
        // complete, and the caller holds the request exclusively (no detach races it).
        Some(self.attachment.with(|p| unsafe { (*p).assume_init_ref().sink }))
    }

    /// Detaches: clears `ATTACHED` if the cell has not completed, handing the attachment
    /// back. Returns `None` if the completion won (it was or is being delivered).
    pub(crate) fn try_detach(&self) -> Option<Attachment> {
        let mut cur = self.state.load(Ordering::Acquire);
        loop {
            if cur & (ATTACHED | COMPLETE) != ATTACHED {
                return None;
            }
            // AcqRel: acquire pairs with the attacher's release (slot initialized); release
            // tells a later completer the slot is no longer to be read.
            match self.state.compare_exchange_weak(cur, cur & !ATTACHED, Ordering::AcqRel, Ordering::Acquire) {
                // SAFETY: we cleared `ATTACHED` while `COMPLETE` was clear, so the completer
                // will not read the slot; it was initialized by the attacher.
                Ok(_) => return Some(self.attachment.with(|p| unsafe { (*p).assume_init() })),
                Err(actual) => cur = actual,
            }
        }
    }

    /// Lets the next attach deliver a completion that a sync object already got: for a
    /// runtime that attached the cell to an object of its own for one blocking wait and has
    /// taken every event from it since. Without this, the request's completion would stay
    /// spent on that internal object, and the user's own attach after the wait would be
    /// refused as already attached. Does nothing while the operation is pending.
    ///
    /// The caller must own the request (its attach rights) and must have emptied the object
    /// the completion went to; a completion delivered to a user's object must not be
    /// re-delivered this way.
    pub fn forget_delivery(&self) {
        // Relaxed: as `mark_taken` — with `COMPLETE` set only attachers read `ATTACHED`, and
        // they are ordered after us by the exclusive access to the request.
        if self.state.load(Ordering::Acquire) & COMPLETE != 0 {
            self.state.fetch_and(!ATTACHED, Ordering::Relaxed);
        }
    }

    /// Makes the cell pending again for reuse (request pools).
    ///
    /// Needs `&mut self`: nobody else may hold the cell, so no atomic instruction is needed.
    /// An attachment still in place (the operation never completed) is cancelled first.
    #[inline]
    pub fn reset(&mut self) {
        let state = crate::loom::with_mut(&mut self.state, |s| std::mem::replace(s, 0));
        self.cancel_attachment(state);
        self.outcome = UnsafeCell::new(None);
        if state & HAS_WAKER != 0 {
            // A waker is stored only before `HAS_WAKER` is set, so without the bit the slot
            // is already empty (the completer or an earlier reset took it).
            *crate::loom::get_mut(&mut self.waker) = None;
        }
    }

    /// Resets the cell straight to complete with `outcome`, for an operation that finished
    /// as it started (an eager send): like `reset` then `complete`, with `&mut self` instead
    /// of atomic read-modify-writes. Nothing is attached or waiting on a cell held this way.
    pub fn reset_completed(&mut self, outcome: Outcome) {
        let state = crate::loom::with_mut(&mut self.state, |s| std::mem::replace(s, COMPLETE));
        self.cancel_attachment(state);
        self.outcome = UnsafeCell::new(Some(outcome));
        if state & HAS_WAKER != 0 {
            *crate::loom::get_mut(&mut self.waker) = None;
        }
    }

    /// Cancels the attachment of a cell in state `state` held exclusively: it was attached
    /// and never completed (the runtime shut down with the operation pending). The test is
    /// inlined into every reset (one per recycled operation); the cancellation, rare, is not.
    #[inline(always)]
    fn cancel_attachment(&mut self, state: usize) {
        if state & (ATTACHED | COMPLETE) == ATTACHED {
            self.deliver_cancel();
        }
    }

    /// [`cancel_attachment`](Self::cancel_attachment)'s delivery, for a cell attached and
    /// never completed.
    #[cold]
    #[inline(never)]
    fn deliver_cancel(&mut self) {
        // SAFETY: the caller saw `ATTACHED` without `COMPLETE`: the attacher initialized the
        // slot, and no completer or detacher can consume it (we hold the cell exclusively).
        let mut att = self.attachment.with(|p| unsafe { (*p).assume_init() });
        // SAFETY: delivering a cancellation consumes the attachment exactly once and
        // releases the sync object.
        unsafe { (att.deliver)(att.sink, &mut att.data, att.with_data, Err(Error::Cancelled)) };
    }
}

impl Drop for CompletionCell {
    fn drop(&mut self) {
        // A cell dropped while attached (the runtime shut down with the operation pending)
        // still settles its sync object: the completion arrives as `Cancelled`.
        let state = crate::loom::with_mut(&mut self.state, |s| *s);
        self.cancel_attachment(state);
    }
}

/// Stores `value` in a data slot, inline when it fits, boxed otherwise.
pub(crate) fn put_data<T>(value: T) -> DataSlot {
    let mut slot = DataSlot::uninit();
    if fits_inline::<T>() {
        // SAFETY: `T` fits the slot's size and alignment (checked by `fits_inline`).
        unsafe { slot.as_mut_ptr().cast::<T>().write(value) };
    } else {
        let raw = Box::into_raw(Box::new(value));
        // SAFETY: a pointer fits the slot.
        unsafe { slot.as_mut_ptr().cast::<*mut T>().write(raw) };
    }
    slot
}

/// Takes the value stored by [`put_data`].
///
/// # Safety
/// `slot` must hold a value stored by `put_data::<T>` that was not taken yet.
pub(crate) unsafe fn take_data<T>(slot: *mut DataSlot) -> T {
    if fits_inline::<T>() {
        // SAFETY: per the contract, the slot holds an inline `T`.
        unsafe { slot.cast::<T>().read() }
    } else {
        // SAFETY: per the contract, the slot holds a `Box<T>` pointer that we now own.
        unsafe { *Box::from_raw(slot.cast::<*mut T>().read()) }
    }
}

const fn fits_inline<T>() -> bool {
    mem::size_of::<T>() <= mem::size_of::<DataSlot>() && mem::align_of::<T>() <= mem::align_of::<DataSlot>()
}
