//! Waiting for many requests: `MPI_Waitall`, `MPI_Waitany`, `MPI_Waitsome`.

use weft_sync::Error;

use crate::request::Request;

/// Blocks until every request has completed (`MPI_Waitall`), driving progress in the
/// runtime's mode (seed 003 Algorithm 1 for `Global`, Algorithm 2 otherwise). Returns the
/// first error among them; each request's own result stays available through
/// [`Request::take`].
pub fn wait_all<B: Send + 'static>(reqs: &mut [Request<'_, B>]) -> Result<(), Error> {
    let Some(first) = reqs.first() else { return Ok(()) };
    let shared = first.communicator().shared().clone();
    crate::progress::wait_all(&shared, reqs);
    match reqs.iter().find_map(|r| r.outcome().and_then(|o| o.err())) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Blocks until at least one request not yet taken has completed and returns its index
/// (`MPI_Waitany`); `None` if every request was already taken.
pub fn wait_any<B: Send + 'static>(reqs: &mut [Request<'_, B>]) -> Option<usize> {
    let live = |r: &Request<'_, B>| r.is_live();
    let first = reqs.iter().find(|r| live(r))?;
    let shared = first.communicator().shared().clone();
    let mut idle = weft_sync::IdleBackoff::new();
    loop {
        if let Some(i) = reqs.iter().position(|r| live(r) && r.is_complete()) {
            return Some(i);
        }
        if shared.progress_once() {
            idle.reset();
        } else {
            idle.snooze();
        }
    }
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
