//! Callbacks on completion: the completion of a request runs a function instead of queueing
//! an event on a sync object — the building block of continuations [Schuchart 2021].
//!
//! A callback takes the cell's one attachment, as a sync object does (the same race with the
//! completer, [Patinyasakdikul 2019, §4.6.1]): a request is attached to a sync object or has
//! a callback, never both, and the attempt to do both is refused.

use crate::cell::{put_data, take_data, AttachRace, Attachment, DataSlot};
use crate::object::Attach;
use crate::status::Outcome;

/// A function run once with a completion's outcome.
pub type Callback = Box<dyn FnOnce(Outcome) + Send + 'static>;

/// Why [`on_complete`] refused a callback: the request is attached already (or its
/// completion was delivered to an attachment). The callback is given back, never run.
pub struct Refused<F = Callback>(pub F);

impl<F> std::fmt::Debug for Refused<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Refused(..)")
    }
}

impl<F> std::fmt::Display for Refused<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request already attached to a sync object or a callback")
    }
}

impl<F> std::error::Error for Refused<F> {}

/// Has `f` run once with `request`'s outcome: by the thread that completes it (inside
/// [`CompletionCell::complete`](crate::CompletionCell::complete), so it must be short and
/// must not wait for other completions), or here, now, if the request has completed already.
/// A request dropped (its cell reset or dropped) before it completes runs `f` with
/// `Err(Error::Cancelled)`.
///
/// Refused, with `f` given back, if the request is attached to a sync object or has a
/// callback already, or if its completion was delivered to either
/// ([`attachable`](crate::CompletionCell::attachable) is `false`).
///
/// `f` is stored in the cell's attachment: one of two words or less (a [`Callback`], or a
/// handle to storage the caller reuses) costs no allocation; a larger one is boxed.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use weft_sync::{on_complete, Attach, CompletionCell, Status};
///
/// struct Op(Arc<CompletionCell>);
/// // SAFETY: the cell is kept alive by the Arc until completed.
/// unsafe impl Attach for Op {
///     fn completion_cell(&self) -> &CompletionCell { &self.0 }
/// }
///
/// let mut op = Op(Arc::new(CompletionCell::new()));
/// let seen = Arc::new(Mutex::new(None));
/// let s = seen.clone();
/// on_complete(&mut op, Box::new(move |o| *s.lock().unwrap() = Some(o))).unwrap();
/// assert!(seen.lock().unwrap().is_none());
/// op.0.complete(Ok(Status { source: 1, tag: 2, bytes: 3 }));
/// assert_eq!(seen.lock().unwrap().unwrap().unwrap().tag, 2);
/// ```
pub fn on_complete<R, F>(request: &mut R, f: F) -> Result<(), Refused<F>>
where
    R: Attach + ?Sized,
    F: FnOnce(Outcome) + Send + 'static,
{
    let att = Attachment { sink: std::ptr::null(), deliver: run::<F>, data: put_data(f), with_data: true };
    match request.completion_cell().try_attach(att) {
        AttachRace::Attached => Ok(()),
        AttachRace::AlreadyComplete(mut att, outcome) => {
            // SAFETY: built above for `run`, and handed back: this is its one consumption.
            unsafe { run::<F>(att.sink, &mut att.data, att.with_data, outcome) };
            Ok(())
        }
        AttachRace::AlreadyAttached(mut att) => {
            // SAFETY: the slot holds the callback put above, never taken.
            Err(Refused(unsafe { take_data::<F>(&mut att.data) }))
        }
    }
}

/// The attachment's delivery: runs the callback.
///
/// # Safety
/// `data` must hold an `F` stored by `put_data`, not taken yet; it is consumed.
unsafe fn run<F: FnOnce(Outcome)>(_sink: *const (), data: *mut DataSlot, _with_data: bool, outcome: Outcome) {
    // SAFETY: per the contract.
    let f = unsafe { take_data::<F>(data) };
    f(outcome);
}
