//! One-sided communication: RMA windows with MPI-3 passive-target semantics.
//!
//! [`Communicator::window`] allocates and registers `len` elements per rank (as
//! `MPI_Win_allocate`); [`Communicator::expose`] registers memory the caller already owns
//! (as `MPI_Win_create`). Both are collective: every rank registers its part, then the
//! ranks exchange what a peer needs to target it (key, base address, length, alignment)
//! over the communicator's collective context.
//!
//! # Operations and completion
//!
//! - [`Window::put`] is started on return: the data has been copied out (the caller may
//!   reuse its slice), and it is at the target after the next [`Window::flush`] of the
//!   calling thread. On the embedded provider a put is complete when it returns.
//! - [`Window::get`] and every atomic ([`Window::fetch_and_op`],
//!   [`Window::compare_and_swap`], [`Window::accumulate`], [`Window::get_accumulate`]) are
//!   complete when they return.
//! - [`Window::flush`], [`Window::flush_all`], [`Window::flush_local`] complete the puts the
//!   calling thread issued before the call, and wait for nothing issued after it
//!   ([Amer 2019, §5.2] names the flaw of MPICH's flush, which waits for operations other
//!   threads keep issuing). On libfabric a CRI's one-sided operations are counted by one
//!   completion counter; each CRI has an RMA gate, held while an operation is posted on it
//!   and through a flush of it. A flush therefore waits for exactly the operations posted on
//!   the CRI before it, and a thread that posts meanwhile takes another CRI whose gate is
//!   free (or waits for this one, never the reverse).
//!
//! # Atomics
//!
//! Atomics work on one element of an [`AtomicElement`] type: every integer width up to 64
//! bits, `f32` and `f64` (bitwise operations on floats are refused). The transports offer
//! native atomics on 64-bit words only; a `u64`/`i64` operation the transport has natively
//! (sum, bitwise and/or, replace, read; min/max on `u64`) is one network atomic. Every
//! other width or operation runs as a compare-and-swap loop on the aligned 64-bit word
//! that holds the element: correct against every other atomic on the window, one network
//! round trip more per retry. An element whose aligned word is not wholly inside the
//! target's registered memory (possible only in exposed memory of narrow elements) is
//! refused with [`Error::UnalignedAtomic`]. An atomic is atomic with respect to other
//! atomics on the same element, not to puts or gets (as in MPI). A libfabric provider
//! without RMA atomics at all fails each atomic with [`Error::Transport`] (`op` `"rma"`,
//! `FI_EOPNOTSUPP`); `shm` and `tcp;ofi_rxm` have them.
//!
//! # Errors
//!
//! Each check happens before anything is sent, so a refused operation reads or writes
//! nothing: a rank outside the communicator is [`Error::RankOutOfRange`]; an access past
//! the target's part of the window [`Error::OutOfWindow`]; a window whose communicator was
//! freed [`Error::CommFreed`]; a target that is gone (lost, or finished) [`Error::PeerLost`];
//! a target that ended its part `Error::InvalidArgument("the target rank ended its part of
//! the window")` (below), unless it is known gone since, which is `PeerLost`.
//!
//! An operation already posted to a rank that is lost before it served it never completes
//! in libfabric. The flush that waits for it (an atomic's or a `get`'s own, or
//! [`Window::flush`]) fails with `PeerLost` naming that rank, about 0.1 s after the loss is
//! known, rather than waiting out the transport's 60 s deadline. On libfabric's `shm` the
//! CRI it went through then
//! completes nothing more (its endpoint reads answers in order), so that CRI refuses
//! one-sided operations from then on, with the same error, and the window sends through the
//! rank's other CRIs: a runtime built with one CRI reaches no rank by RMA after such a loss.
//! `weft_transport`'s `ofi_provider` docs, *A one-sided operation to a lost rank*, have the
//! details.
//!
//! # A window's end
//!
//! [`Window::free`] is collective, as `MPI_Win_free`: once it returned on every rank, no
//! rank targets the window any more. Dropping a window ends this rank's part at once, on its
//! own (as does `free` where a peer did not call it: an erroneous program). The rank then
//! tells each peer (a `WindowEnd` frame from the dropping thread's CRI), and every access
//! the peer posts to that part once the notice arrived — in particular after the peer
//! received any message the dropping thread sent after the drop — fails at once with
//! `Error::InvalidArgument("the target rank ended its part of the window")`, writing and
//! reading nothing; messages between the ranks are untouched. Checking the mark is one load
//! of local memory per access.
//!
//! An access that races with the notice (posted before it arrived) still reaches the
//! target. The window's own memory ([`Communicator::window`]) is therefore not freed at
//! once on libfabric: its registration is kept, retired, with the memory, up to 64 MiB a
//! rank (the oldest deregistered and freed first), and a racing access lands there
//! harmlessly (`tcp;ofi_rxm` would otherwise refuse the removed key and shut the whole
//! connection down; `weft_transport`'s `ofi_provider`, *A window's end*). Beyond that
//! bound, and always for memory lent with [`Communicator::expose`] — which goes back to its
//! owner when the window is dropped, and is deregistered then — an access racing with the
//! end is the program's error, as in MPI: end such a window with [`Window::free`] (or drop
//! it only once no peer still targets it, e.g. after a barrier); otherwise the racing
//! access may fail with a transport error, or on `tcp;ofi_rxm` take the connection to that
//! peer down. On the embedded provider a racing access fails with `InvalidArgument`.

use std::marker::PhantomData;
use std::mem::size_of;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;
use weft_sync::Error;
use weft_transport::{RemoteWindow, RmaOp, Transport};

use crate::buffer::Primitive;
use crate::comm::Communicator;

mod element;
mod ends;

pub use element::{AtomicElement, Op};
use ends::EndMarks;
pub(crate) use ends::WindowEnds;
pub(crate) use ends::WINDOW_ENDED;

/// What a peer needs to target one rank's part of a window.
#[derive(Clone, Copy, Debug)]
struct Part {
    /// The registration (its `len` is the registered bytes).
    remote: RemoteWindow,
    /// Address of byte 0 modulo 8 at its owner (for the aligned word of an atomic).
    misalign: usize,
    /// Number of elements.
    len: usize,
    /// Its owner's serial of it (`ends.rs`; 0: nothing registered).
    serial: u64,
}

/// Copies of the data of puts posted on one CRI and not yet flushed (`Cri::rma`).
type Staged = Vec<Box<[u8]>>;

/// How many `u64`s one rank contributes to the descriptor exchange.
const DESCRIPTOR: usize = 8;

/// A window: `len` elements of `T` on every rank, read and written by any rank through
/// one-sided operations (module docs). Created by [`Communicator::window`] or
/// [`Communicator::expose`]; dropping it ends this rank's part (see [`free`](Self::free)
/// for the collective end, and the module docs, *A window's end*).
pub struct Window<'a, T: Primitive> {
    comm: Communicator,
    parts: Vec<Part>,
    /// Per rank: its owner ended its part (its notice came; module docs, *A window's end*).
    ended: EndMarks,
    /// This rank's part: its first byte and whether it was registered (not when empty).
    base: *mut u8,
    registered: bool,
    /// Whether every operation is complete when the transport returns (embedded provider).
    direct: bool,
    /// Per CRI: the ranks this window's puts on it went to since its last flush (guarded
    /// by the CRI's RMA gate as well), which the flush reads back (`flush_cri`).
    unflushed: Box<[parking_lot::Mutex<Vec<u32>>]>,
    /// This rank's part when the window allocated it (8-byte aligned, zeroed, rounded up
    /// to whole words; from `Box::into_raw`, freed in `Drop`); `None` when the caller lent
    /// it for `'a`.
    owned: Option<*mut [u64]>,
    _lent: PhantomData<&'a mut [T]>,
}

// SAFETY: `base` points at this rank's part, which the window owns or borrows mutably for
// `'a`; every access to it goes through the transport (which synchronizes its own
// accesses) or through the window's methods, which take `&self` and copy with the
// transport's own guarantees (see `read_local`). The staged copies of puts belong to the
// engine's CRIs, behind their RMA gates.
unsafe impl<T: Primitive> Send for Window<'_, T> {}
// SAFETY: as for `Send`.
unsafe impl<T: Primitive> Sync for Window<'_, T> {}

impl<T: Primitive> std::fmt::Debug for Window<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window").field("rank", &self.comm.rank()).field("len", &self.len()).finish()
    }
}

impl Communicator {
    /// Allocates and registers a window of `len` zeroed elements of `T` on every rank
    /// (`MPI_Win_allocate`). Collective: every rank of the communicator calls it, in the
    /// same order, with the same `T` (the lengths may differ).
    pub fn window<T: Primitive>(&self, len: usize) -> Result<Window<'static, T>, Error> {
        let bytes = len.checked_mul(size_of::<T>()).ok_or(Error::InvalidArgument("window length overflows"))?;
        let words = Box::into_raw(vec![0u64; bytes.div_ceil(8).max(1)].into_boxed_slice());
        // SAFETY: `words` is owned by the window (or freed by `create` on failure), which
        // deregisters before freeing it; nothing else references it.
        unsafe { Window::create(self, words.cast::<u8>(), len, words.len() * 8, Some(words)) }
    }

    /// Registers `memory`, which the caller owns, as this rank's part of a window
    /// (`MPI_Win_create`); the caller has it back when the window is dropped. Collective, as
    /// [`window`](Self::window).
    pub fn expose<'a, T: Primitive>(&self, memory: &'a mut [T]) -> Result<Window<'a, T>, Error> {
        let (len, bytes) = (memory.len(), size_of_val(memory));
        let base = memory.as_mut_ptr().cast::<u8>();
        // SAFETY: the window borrows `memory` mutably for `'a` and deregisters it on drop.
        unsafe { Window::create(self, base, len, bytes, None) }
    }
}

impl<'a, T: Primitive> Window<'a, T> {
    /// # Safety
    /// `base..base + bytes` must stay valid, and be accessed only through the window, for
    /// the window's lifetime (owned by `memory`, or borrowed for `'a`).
    unsafe fn create(comm: &Communicator, base: *mut u8, len: usize, bytes: usize, owned: Option<*mut [u64]>) -> Result<Self, Error> {
        // SAFETY: forwarded contract.
        let r = unsafe { Self::register(comm, base, len, bytes) };
        match r {
            Ok((parts, ended, registered)) => Ok(Window {
                comm: comm.clone(),
                parts,
                ended,
                base,
                registered,
                direct: matches!(comm.engine().transport, Transport::Embedded(_)),
                unflushed: (0..comm.engine().cris.len()).map(|_| parking_lot::Mutex::new(Vec::new())).collect(),
                owned,
                _lent: PhantomData,
            }),
            Err(e) => {
                if let Some(words) = owned {
                    // SAFETY: from `Box::into_raw`, not registered any more (`register`
                    // deregisters on failure), referenced by nothing else.
                    drop(unsafe { Box::from_raw(words) });
                }
                Err(e)
            }
        }
    }

    /// Registers this rank's part and exchanges the descriptors: the parts of every rank,
    /// their end marks and whether this rank's was registered. On failure nothing stays
    /// registered.
    ///
    /// # Safety
    /// As [`create`](Self::create).
    unsafe fn register(comm: &Communicator, base: *mut u8, len: usize, bytes: usize) -> Result<(Vec<Part>, EndMarks, bool), Error> {
        if comm.is_freed() {
            return Err(Error::CommFreed);
        }
        let ends = comm.engine().window_ends();
        // Notices of peers that end their part before this rank's creation is over are kept.
        ends.begin(comm.context_id());
        // SAFETY: forwarded contract.
        let r = unsafe { Self::exchange(comm, base, len, bytes) };
        match r {
            Ok((parts, registered)) => {
                let serials: Vec<(u32, u64)> = parts.iter().map(|p| (p.remote.rank, p.serial)).collect();
                Ok((parts, ends.finish(comm.context_id(), comm.rank(), &serials), registered))
            }
            Err(e) => {
                ends.abandon(comm.context_id());
                Err(e)
            }
        }
    }

    /// [`register`](Self::register)'s registration and exchange.
    ///
    /// # Safety
    /// As [`create`](Self::create).
    unsafe fn exchange(comm: &Communicator, base: *mut u8, len: usize, bytes: usize) -> Result<(Vec<Part>, bool), Error> {
        let t = &comm.engine().transport;
        let mut failed = None;
        let mine = if bytes == 0 {
            None
        } else {
            // SAFETY: forwarded contract; deregistered in `Drop` (or below on failure).
            match unsafe { t.register_window(base, bytes) } {
                Ok(w) => Some(w),
                Err(e) => {
                    failed = Some(e);
                    None
                }
            }
        };
        let d = mine.unwrap_or(RemoteWindow { rank: comm.world_of(comm.rank()), key: 0, base: 0, len: 0 });
        let serial = if mine.is_some() { comm.engine().window_ends().next_serial() } else { 0 };
        let descriptor =
            [d.key, d.base, d.len, (base as usize % 8) as u64, len as u64, size_of::<T>() as u64, u64::from(failed.is_none()), serial];
        // Every rank takes part even if its registration failed, so none waits forever.
        let mut all = vec![0u64; descriptor.len() * comm.size() as usize];
        let all = match comm.allgather(&descriptor, &mut all) {
            Ok(()) => all,
            Err(e) => {
                if let Some(w) = mine {
                    t.deregister(w.key);
                }
                return Err(e);
            }
        };
        let mut parts = Vec::with_capacity(comm.size() as usize);
        let mut refused = failed.map(Err).unwrap_or(Ok(()));
        for (rank, c) in all.chunks_exact(DESCRIPTOR).enumerate() {
            if c[5] != size_of::<T>() as u64 {
                refused = refused.and(Err(Error::InvalidArgument("window: the ranks gave element types of different sizes")));
            }
            if c[6] == 0 {
                refused = refused.and(Err(Error::InvalidArgument("window: a rank could not register its memory")));
            }
            parts.push(Part {
                // The transport names ranks by their world rank.
                remote: RemoteWindow { rank: comm.world_of(rank as u32), key: c[0], base: c[1], len: c[2] },
                misalign: c[3] as usize,
                len: c[4] as usize,
                serial: c[7],
            });
        }
        if let Err(e) = refused {
            if let Some(w) = mine {
                t.deregister(w.key);
            }
            return Err(e);
        }
        // Every rank progresses now (the allgather just ended): the CRIs reach the ranks'
        // one-sided targets before the first operation of a thread on its own CRI needs them
        // (a failure shows again in that operation).
        let ranks: Vec<u32> = parts.iter().map(|p| p.remote.rank).collect();
        let _ = t.reach_rma_targets(&ranks);
        Ok((parts, mine.is_some()))
    }

    fn transport(&self) -> &Transport {
        &self.comm.engine().transport
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> u32 {
        self.comm.size()
    }

    /// Number of elements in this rank's part.
    pub fn len(&self) -> usize {
        self.parts[self.rank() as usize].len
    }

    /// Whether this rank's part is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of elements in `rank`'s part.
    pub fn len_of(&self, rank: u32) -> Result<usize, Error> {
        self.parts.get(rank as usize).map(|p| p.len).ok_or(Error::RankOutOfRange { rank, size: self.size() })
    }

    /// The part of `rank` for an access of `count` elements at `offset`, and the access's
    /// first byte; every check of the module docs' *Errors*.
    fn target(&self, rank: u32, offset: usize, count: usize) -> Result<(&Part, usize), Error> {
        if self.comm.is_freed() {
            return Err(Error::CommFreed);
        }
        let part = self.parts.get(rank as usize).ok_or(Error::RankOutOfRange { rank, size: self.size() })?;
        // Acquire: pairs with the notice's store (`ends.rs`). A target that ended its part
        // and is gone since is lost: its loss, once known, names it whatever came first.
        if self.ended[rank as usize].load(Ordering::Acquire) {
            return Err(if self.transport().is_alive(part.remote.rank) { WINDOW_ENDED } else { Error::PeerLost { rank } });
        }
        let out = Error::OutOfWindow { offset, len: count, window: part.len };
        if offset.checked_add(count).ok_or(out)? > part.len {
            return Err(out);
        }
        if !self.transport().is_alive(part.remote.rank) {
            return Err(Error::PeerLost { rank });
        }
        Ok((part, offset * size_of::<T>()))
    }

    /// Writes `data` to `offset` of `rank`'s part (`MPI_Put`): started on return (`data`
    /// may be reused), at the target after this thread's next flush.
    pub fn put(&self, rank: u32, offset: usize, data: &[T]) -> Result<(), Error> {
        let (part, at) = self.target(rank, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let t = self.transport();
        if self.direct {
            // SAFETY: the embedded provider has copied `data` when `put` returns.
            return unsafe { t.put(self.comm.engine().cri_for_thread(), &part.remote, at, bytes_of(data)) };
        }
        let copy: Box<[u8]> = bytes_of(data).into();
        let (k, mut staged) = self.gate();
        // SAFETY: `copy` is kept in the CRI's staged copies until a flush of the CRI
        // returned, or with the engine, after the transport; its heap storage does not move
        // with the box.
        unsafe { t.put(k, &part.remote, at, &copy) }.map_err(|e| self.comm.local_error(e))?;
        staged.push(copy);
        let mut targets = self.unflushed[k].lock();
        if !targets.contains(&rank) {
            targets.push(rank);
        }
        Ok(())
    }

    /// Reads `out.len()` elements at `offset` of `rank`'s part into `out` (`MPI_Get`);
    /// complete on return.
    pub fn get(&self, rank: u32, offset: usize, out: &mut [T]) -> Result<(), Error> {
        let (part, at) = self.target(rank, offset, out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        let t = self.transport();
        if self.direct {
            // SAFETY: the embedded provider has copied into `out` when `get` returns.
            return unsafe { t.get(self.comm.engine().cri_for_thread(), &part.remote, at, bytes_of_mut(out)) };
        }
        let mut landing = vec![0u8; size_of_val(out)].into_boxed_slice();
        let (k, mut staged) = self.gate();
        // SAFETY: `landing` is untouched until the flush returned; if the flush fails, the
        // read may still land, so it is kept with the staged copies rather than freed.
        unsafe { t.get(k, &part.remote, at, &mut landing) }.map_err(|e| self.comm.local_error(e))?;
        if let Err(e) = t.flush(k) {
            staged.push(landing);
            return Err(self.comm.local_error(e));
        }
        staged.clear();
        drop(staged);
        bytes_of_mut(out).copy_from_slice(&landing);
        Ok(())
    }

    /// A listener for the next write of any rank to the element at `offset` of `rank`'s
    /// part (a put over it, an atomic update), where the transport raises one: on the
    /// embedded provider the writer notifies after the write; on libfabric `None` (nothing
    /// here learns of a peer's write: a waiter polls). Listen, re-check the element, then
    /// wait: no write after the listen is missed. A listener may also wake for a write to
    /// another element (re-check when woken).
    pub(crate) fn watch(&self, rank: u32, offset: usize) -> Option<weft_sync::SignalListener<'_>> {
        let (part, at) = self.target(rank, offset, 1).ok()?;
        self.transport().watch(&part.remote, at).map(weft_sync::Signal::listen)
    }

    /// The lowest rank of the window whose process is gone (lost, or finished), if any:
    /// one load while no rank of the fabric ever was. What a wait for a peer's write asks
    /// when its check failed (a gone writer writes nothing more).
    pub(crate) fn lost_peer(&self) -> Option<u32> {
        let t = self.transport();
        if t.lost_epoch() == 0 {
            return None;
        }
        let me = self.rank();
        (0..self.size()).find(|&r| r != me && !t.is_alive(self.parts[r as usize].remote.rank))
    }

    /// The lowest rank of the window that ended its part, as far as this rank knows (its
    /// notice handled; module docs, *A window's end*), if any: one load while none did. A
    /// rank ends its part only after the puts it issued through the window are complete at
    /// their targets (`Drop`: a flush, with the read-back of `flush_cri`): a read of a word
    /// made after this returned a rank sees every write that rank made to it.
    pub(crate) fn ended_peer(&self) -> Option<u32> {
        let (any, marks) = self.ended.split_last().expect("a mark per rank, then one for any");
        if !any.load(Ordering::Acquire) {
            return None;
        }
        marks.iter().position(|m| m.load(Ordering::Acquire)).map(|r| r as u32)
    }

    /// Whether `rank` ended its part of the window, as far as this rank knows (as
    /// [`ended_peer`](Self::ended_peer)); `false` for a rank outside the window.
    pub(crate) fn has_ended(&self, rank: u32) -> bool {
        rank < self.size() && self.ended[rank as usize].load(Ordering::Acquire)
    }

    /// One pass of this rank's progress: handles, among others, the peers' notices of the
    /// end of their parts that arrived (what a wait that may park asks before it does).
    pub(crate) fn progress(&self) {
        let _ = self.comm.engine().progress_once();
    }

    /// Whether `rank`'s process is gone (lost, or finished); `false` for a rank outside the
    /// window.
    pub(crate) fn peer_gone(&self, rank: u32) -> bool {
        rank < self.size() && rank != self.rank() && !self.transport().is_alive(self.parts[rank as usize].remote.rank)
    }

    /// Whether one of this rank's CRIs refuses one-sided operations (on libfabric's `shm`,
    /// since operations of it to a lost rank were given up: module docs).
    #[cfg(all(test, feature = "ofi"))]
    pub(crate) fn a_cri_refuses(&self) -> bool {
        (0..self.comm.engine().cris.len()).any(|k| self.transport().rma_blocked(k))
    }

    /// Whether [`watch`](Self::watch) gives listeners: the transport signals writes (the
    /// embedded provider).
    pub(crate) fn signals_writes(&self) -> bool {
        self.direct
    }

    /// Writes `data` into this rank's own part at `offset` (a local store, ordered with
    /// peers' accesses only by the program's synchronization, as in MPI).
    pub fn write_local(&self, offset: usize, data: &[T]) -> Result<(), Error> {
        if self.direct {
            return self.put(self.rank(), offset, data);
        }
        self.local_bounds(offset, data.len())?;
        // SAFETY: in bounds of this rank's part (checked), which the window owns or borrows;
        // peers' accesses reach it through the network interface, not Rust references.
        unsafe { std::ptr::copy_nonoverlapping(bytes_of(data).as_ptr(), self.base.add(offset * size_of::<T>()), size_of_val(data)) };
        Ok(())
    }

    /// Reads this rank's own part at `offset` into `out` (a local load; as
    /// [`write_local`](Self::write_local)).
    pub fn read_local(&self, offset: usize, out: &mut [T]) -> Result<(), Error> {
        if self.direct {
            // Through the transport: it orders the copy with peers' accesses.
            return self.get(self.rank(), offset, out);
        }
        self.local_bounds(offset, out.len())?;
        let n = size_of_val(out);
        // SAFETY: as in `write_local`.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(offset * size_of::<T>()), bytes_of_mut(out).as_mut_ptr(), n) };
        Ok(())
    }

    fn local_bounds(&self, offset: usize, count: usize) -> Result<(), Error> {
        self.target(self.rank(), offset, count).map(|_| ())
    }

    /// Completes every put this thread issued to `rank` before the call (`MPI_Win_flush`);
    /// operations other threads issue meanwhile are not waited for (module docs).
    pub fn flush(&self, rank: u32) -> Result<(), Error> {
        self.target(rank, 0, 0)?;
        self.flush_all()
    }

    /// Completes every put this thread issued before the call, to any rank
    /// (`MPI_Win_flush_all`).
    pub fn flush_all(&self) -> Result<(), Error> {
        if self.comm.is_freed() {
            return Err(Error::CommFreed);
        }
        (0..self.comm.engine().cris.len()).try_for_each(|k| self.flush_cri(k))
    }

    /// Completes locally the puts this thread issued to `rank` (`MPI_Win_flush_local`): the
    /// same as [`flush`](Self::flush) here, since a put's data is copied out when it starts.
    pub fn flush_local(&self, rank: u32) -> Result<(), Error> {
        self.flush(rank)
    }

    /// Flushes CRI `k` under its RMA gate: no operation is posted on it meanwhile, so the
    /// transport's count of operations issued before the flush is exactly those it waits
    /// for, and the staged copies of their puts are then freed.
    fn flush_cri(&self, k: usize) -> Result<(), Error> {
        if self.direct {
            return Ok(());
        }
        let mut staged = self.comm.engine().cris[k].rma.lock();
        let t = self.transport();
        t.flush(k).map_err(|e| self.comm.local_error(e))?;
        // On some providers a put's completion means only that its data left this rank
        // (`tcp;ofi_rxm`: transmit complete), and a later access through another CRI, whose
        // connection is not ordered with this one, could still find the old value. A read
        // of each target through this CRI is answered only after the target applied the
        // writes before it on the same connection: once it is back, the puts are at their
        // targets, as `MPI_Win_flush` promises.
        let mut targets = std::mem::take(&mut *self.unflushed[k].lock());
        // A target that ended its part is not read (an exposed part is deregistered).
        targets.retain(|&r| !self.ended[r as usize].load(Ordering::Acquire));
        if !targets.is_empty() {
            let mut probes = vec![0u8; targets.len()].into_boxed_slice();
            let read_back = targets.iter().enumerate().try_for_each(|(i, &r)| {
                let part = &self.parts[r as usize];
                // SAFETY: one byte of `probes` per read, untouched until the flush below
                // returned; kept with the staged copies if anything fails (a read posted
                // before the failure may still land).
                unsafe { t.get(k, &part.remote, 0, &mut probes[i..i + 1]) }
            });
            if let Err(e) = read_back.and_then(|()| t.flush(k)) {
                staged.push(probes);
                return Err(self.comm.local_error(e));
            }
        }
        staged.clear();
        Ok(())
    }

    /// The RMA gate of a CRI for this thread's next operation (libfabric): its own CRI's
    /// if free, else the first free one after it (a flush in progress on a CRI does not
    /// hold up the others' threads), else its own once free; and that CRI. A CRI that
    /// refuses one-sided operations (on `shm`, after a lost rank's were given up) is passed
    /// over while another is left.
    fn gate(&self) -> (usize, MutexGuard<'_, Staged>) {
        let e = self.comm.engine();
        let t = self.transport();
        let k = e.cri_for_thread();
        let n = e.cris.len();
        let usable = |j: &usize| !t.rma_blocked(*j);
        let order = || (0..n).map(|i| (k + i) % n).filter(usable);
        order().find_map(|j| e.cris[j].rma.try_lock().map(|g| (j, g))).unwrap_or_else(|| {
            let j = order().next().unwrap_or(k);
            (j, e.cris[j].rma.lock())
        })
    }

    /// Runs one transport atomic (which completes before it returns) on a CRI: under its
    /// gate on libfabric (the completion also completes what was posted before on the CRI,
    /// so its staged copies are freed), on this thread's CRI on the embedded provider.
    fn atomic<R>(&self, op: impl FnOnce(&Transport, usize) -> Result<R, Error>) -> Result<R, Error> {
        let t = self.transport();
        if self.direct {
            return op(t, self.comm.engine().cri_for_thread());
        }
        let (k, mut staged) = self.gate();
        let r = op(t, k).map_err(|e| self.comm.local_error(e))?;
        staged.clear();
        Ok(r)
    }

    /// Ends the window collectively (`MPI_Win_free`): completes this thread's puts, waits
    /// until every rank has reached `free` (so no peer targets this rank's part any more),
    /// then ends this rank's part. Dropping a window instead ends it at once; a peer's later
    /// access to this rank then fails (module docs, *A window's end*).
    pub fn free(self) -> Result<(), Error> {
        self.flush_all()?;
        self.comm.barrier()
    }
}

impl<T: AtomicElement> Window<'_, T> {
    /// Applies `op` with `operand` to the element at `offset` of `rank`'s part and returns
    /// its old value, atomically (`MPI_Fetch_and_op`); complete on return.
    pub fn fetch_and_op(&self, rank: u32, offset: usize, operand: T, op: Op) -> Result<T, Error> {
        let (part, at) = self.target(rank, offset, 1)?;
        if T::combine(operand, operand, op).is_none() {
            return Err(Error::InvalidArgument("bitwise RMA operation on a floating-point window"));
        }
        let (word, lane) = self.word_of(part, offset, at)?;
        if let (8, Some(native)) = (size_of::<T>(), T::native(op)) {
            return self.atomic(|t, k| t.fetch_op(k, &part.remote, at, native, element::to_word(operand))).map(element::from_word);
        }
        self.update_in_word(&part.remote, word, lane, |old| T::combine(old, operand, op))
    }

    /// Replaces the element at `offset` of `rank`'s part with `swap` if its bits equal
    /// `compare`'s, atomically (`MPI_Compare_and_swap`); returns the old value (swapped iff
    /// its bits equal `compare`'s: for floats `0.0` and `-0.0` differ).
    pub fn compare_and_swap(&self, rank: u32, offset: usize, compare: T, swap: T) -> Result<T, Error> {
        let (part, at) = self.target(rank, offset, 1)?;
        let (word, lane) = self.word_of(part, offset, at)?;
        if size_of::<T>() == 8 {
            let (c, s) = (element::to_word(compare), element::to_word(swap));
            return self.atomic(|t, k| t.compare_swap(k, &part.remote, at, c, s)).map(element::from_word);
        }
        self.update_in_word(&part.remote, word, lane, |old| element::same_bits(old, compare).then_some(swap))
    }

    /// Atomically replaces the element at byte `lane` of the word at byte `word` of
    /// `remote` with `update(old)` (nothing when `None`) and returns `old`: a
    /// compare-and-swap loop on the whole word, for the widths and operations the transport
    /// has no native atomic for.
    fn update_in_word(&self, remote: &RemoteWindow, word: usize, lane: usize, update: impl Fn(T) -> Option<T>) -> Result<T, Error> {
        let mut cur = self.atomic(|t, k| t.fetch_op(k, remote, word, RmaOp::Read, 0))?;
        loop {
            let old: T = element::lane(cur, lane);
            let next = match update(old) {
                Some(new) => element::with_lane(cur, lane, new),
                None => cur,
            };
            if next == cur {
                // Nothing to change: the atomic read was the operation.
                return Ok(old);
            }
            let seen = self.atomic(|t, k| t.compare_swap(k, remote, word, cur, next))?;
            if seen == cur {
                return Ok(old);
            }
            cur = seen;
        }
    }

    /// Applies `op` element-wise with `data` to `data.len()` elements at `offset` of
    /// `rank`'s part (`MPI_Accumulate`), each element atomically; complete on return.
    pub fn accumulate(&self, rank: u32, offset: usize, data: &[T], op: Op) -> Result<(), Error> {
        self.target(rank, offset, data.len())?;
        data.iter().enumerate().try_for_each(|(i, &v)| self.fetch_and_op(rank, offset + i, v, op).map(|_| ()))
    }

    /// As [`accumulate`](Self::accumulate), writing the old values into `out`
    /// (`MPI_Get_accumulate`; `out` has `data.len()` elements).
    pub fn get_accumulate(&self, rank: u32, offset: usize, data: &[T], op: Op, out: &mut [T]) -> Result<(), Error> {
        if out.len() != data.len() {
            return Err(Error::InvalidArgument("get_accumulate: result and operand lengths differ"));
        }
        self.target(rank, offset, data.len())?;
        for (i, (&v, o)) in data.iter().zip(out.iter_mut()).enumerate() {
            *o = self.fetch_and_op(rank, offset + i, v, op)?;
        }
        Ok(())
    }

    /// The aligned 64-bit word holding the element at `offset` (first byte `at`) of `part`:
    /// its byte offset in the part and the element's byte in it.
    fn word_of(&self, part: &Part, offset: usize, at: usize) -> Result<(usize, usize), Error> {
        let size = size_of::<T>();
        let unaligned = Error::UnalignedAtomic { offset, elem_size: size };
        let address = part.misalign + at;
        if address % size != 0 {
            return Err(unaligned);
        }
        let word_address = address & !7;
        if word_address < part.misalign || word_address - part.misalign + 8 > part.remote.len as usize {
            return Err(unaligned);
        }
        Ok((word_address - part.misalign, address - word_address))
    }
}

impl<T: Primitive> Drop for Window<'_, T> {
    fn drop(&mut self) {
        // This rank's puts through the window complete before it goes (a failure leaves
        // their copies with the CRI, freed with the engine after the transport).
        for k in 0..self.comm.engine().cris.len() {
            let _ = self.flush_cri(k);
        }
        let e = self.comm.engine();
        let me = self.rank();
        e.window_ends().forget(me, self.parts.iter().map(|p| (p.remote.rank, p.serial)));
        // SAFETY: from `Box::into_raw` in `Communicator::window`; this rank holds no other
        // reference, and the transport deregisters it before freeing it.
        let owned = self.owned.take().map(|words| unsafe { Box::from_raw(words) });
        if self.registered {
            // The peers learn of the end (module docs, *A window's end*); the registration
            // is retired with the window's own memory.
            let mine = &self.parts[me as usize];
            for p in self.parts.iter().filter(|p| p.remote.rank != mine.remote.rank) {
                e.tell_window_end(p.remote.rank, self.comm.context_id(), mine.serial);
            }
            self.transport().retire_window(mine.remote.key, owned);
        }
    }
}

fn bytes_of<T: Primitive>(data: &[T]) -> &[u8] {
    // SAFETY: `T: Primitive` has no padding, so its bytes are initialized.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), size_of_val(data)) }
}

fn bytes_of_mut<T: Primitive>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: `T: Primitive` has no padding and every bit pattern is a valid value.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), size_of_val(data)) }
}

#[cfg(all(test, feature = "ofi"))]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Op, Window};
    use crate::rendezvous_faults::common::within;
    use crate::{Error, Provider, Runtime};

    /// An atomic in flight to a rank when it is lost, its target never serving it (on
    /// `shm` a dead process's progress answers nothing): it fails with `PeerLost` naming the
    /// rank in the window's communicator, within a second of the loss instead of the
    /// transport's 60 s flush deadline, and the window goes on with the live ranks through
    /// the rank's other CRI (the first one's later answers queue behind the lost rank's).
    #[test]
    fn an_atomic_in_flight_to_a_lost_rank_fails_and_the_window_goes_on() {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
        let (outcome, after_loss) = within(60, "an atomic in flight to a lost rank", || {
            let rts = &Runtime::builder().env(false).provider(Provider::Shm).cris(2).build_local(3).unwrap();
            let ofi = |world: usize| match &rts[world].engine.transport {
                weft_transport::Transport::Ofi(t) => t,
                _ => unreachable!("an shm runtime"),
            };
            // World ranks 1, 0, 2 are ranks 0, 1, 2 of the window's communicator.
            let key = |world: usize| [1, 0, 2][world];
            let (held, done) = (std::sync::Barrier::new(3), std::sync::Barrier::new(3));
            std::thread::scope(|s| {
                for world in [1, 2] {
                    let (held, done, ofi) = (&held, &done, &ofi);
                    s.spawn(move || {
                        let c = rts[world].world().split(Some(0), key(world)).unwrap().unwrap();
                        let w: Window<'_, u64> = c.window(1).unwrap();
                        // The lost rank serves nothing from here: its RMA endpoint's progress is
                        // held, as a killed process's is.
                        let hold = (world == 1).then(|| ofi(world).hold_cri_state(0));
                        held.wait();
                        done.wait();
                        drop((hold, w));
                    });
                }
                let c = rts[0].world().split(Some(0), key(0)).unwrap().unwrap();
                let w: Window<'_, u64> = c.window(1).unwrap();
                held.wait();
                let (outcome, after_loss) = std::thread::scope(|s2| {
                    let cas = s2.spawn(|| {
                        let out = (w.compare_and_swap(0, 0, 0, 1), Instant::now());
                        // The live rank, from the same thread (whose own CRI now refuses): through
                        // the other CRI.
                        assert_eq!(w.fetch_and_op(2, 0, 5, Op::Sum), Ok(0));
                        assert_eq!(w.compare_and_swap(2, 0, 5, 7), Ok(5));
                        w.put(2, 0, &[9]).unwrap();
                        w.flush(2).unwrap();
                        let mut back = [0u64];
                        w.get(2, 0, &mut back).unwrap();
                        assert_eq!(back, [9]);
                        assert_eq!(w.compare_and_swap(0, 0, 0, 1), Err(Error::PeerLost { rank: 0 }), "the lost rank, refused at once");
                        out
                    });
                    std::thread::sleep(Duration::from_millis(200));
                    assert!(!cas.is_finished(), "an atomic to a rank that serves nothing completed");
                    ofi(0).mark_lost(1);
                    let lost_at = Instant::now();
                    let (out, at) = cas.join().unwrap();
                    (out, at.saturating_duration_since(lost_at))
                });
                done.wait();
                (outcome, after_loss)
            })
        });
        assert_eq!(outcome, Err(Error::PeerLost { rank: 0 }), "named by its rank in the window's communicator");
        assert!(after_loss < Duration::from_secs(1), "the atomic ended {after_loss:?} after the loss");
    }

    /// While a flush holds a CRI's RMA gate, a put goes out on another CRI (its copy is
    /// staged there) instead of adding to what the flush waits for; the next flush frees
    /// the copies.
    #[test]
    fn a_put_during_a_flush_takes_another_cri() {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
        let rts = Runtime::builder().env(false).provider(Provider::Shm).cris(2).build_local(2).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let c = rts[1].world();
                let _w: Window<'_, u64> = c.window(1).unwrap();
                c.recv(Vec::<u8>::with_capacity(1), 0u32, 5).unwrap();
            });
            let c = rts[0].world();
            let w: Window<'_, u64> = c.window(1).unwrap();
            let cris = &c.engine().cris;
            let staged = |k: usize| cris[k].rma.lock().len();
            {
                let _flushing = cris[0].rma.lock();
                for i in 0..4 {
                    w.put(1, 0, &[i]).unwrap();
                }
                assert_eq!(cris[1].rma.try_lock().map(|g| g.len()), Some(4), "every put took the free CRI");
            }
            assert_eq!(staged(0), 0, "nothing was posted behind the held gate");
            w.flush_all().unwrap();
            assert_eq!((staged(0), staged(1)), (0, 0), "the flush freed the copies");
            let mut back = [0u64];
            w.get(1, 0, &mut back).unwrap();
            assert_eq!(back[0], 3);
            c.send(vec![0u8], 1, 5).unwrap();
        });
    }
}
