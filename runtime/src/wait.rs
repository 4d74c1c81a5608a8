//! Waiting for many requests: `MPI_Waitall`, `MPI_Waitany`, `MPI_Waitsome`.
//!
//! Requests of one rank are waited for in that rank's progress mode ([Patinyasakdikul 2019, Alg. 1]
//! for `Global`, Algorithm 2 otherwise: the pending ones attached to the thread's sync
//! object, the thread parked until they complete). Requests of several in-process ranks
//! (`Builder::build_local`) are waited for by driving every one of those ranks, testing
//! between passes and sleeping briefly while none has work.

use weft_sync::Error;

use crate::progress::{self, Want};
use crate::request::Request;

/// Waits for `want`, in the requests' rank's mode (requests of several ranks: see
/// [`progress::wait`]).
fn wait_for<B: Send + 'static>(reqs: &mut [Request<'_, B>], want: Want) -> Option<usize> {
    let first = reqs.first()?.communicator().engine();
    progress::wait(first, reqs, want)
}

/// Blocks until every request has completed (`MPI_Waitall`). Returns the first error among
/// them; each request's own result stays available through [`Request::take`].
pub fn wait_all<B: Send + 'static>(reqs: &mut [Request<'_, B>]) -> Result<(), Error> {
    let Some(first) = reqs.first() else { return Ok(()) };
    // The wait tests every request as it completes; where it saw them all, it knows
    // whether one failed, and the requests are looked at again only then.
    let engine = first.communicator().engine();
    if progress::wait_all_walked(engine, reqs).none_failed() == Some(true) {
        return Ok(());
    }
    match reqs.iter().find_map(Request::error) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Blocks until at least one request not yet taken has completed and returns its index
/// (`MPI_Waitany`); `None` if every request was already taken.
pub fn wait_any<B: Send + 'static>(reqs: &mut [Request<'_, B>]) -> Option<usize> {
    wait_for(reqs, Want::Any)
}

/// Blocks until at least one request has completed, then puts the indices of every
/// completed (not yet taken) request in `out` and returns how many (`MPI_Waitsome`).
pub fn wait_some<B: Send + 'static>(reqs: &mut [Request<'_, B>], out: &mut Vec<usize>) -> usize {
    out.clear();
    if wait_any(reqs).is_none() {
        return 0;
    }
    out.extend(reqs.iter().enumerate().filter(|(_, r)| r.is_live() && r.is_complete()).map(|(i, _)| i));
    out.len()
}
