//! Derived datatypes: contiguous, vector and indexed layouts of primitive elements, packed
//! into a contiguous buffer for sending and unpacked on receipt (`MPI_Type_contiguous`,
//! `MPI_Type_vector`, `MPI_Type_indexed`, `MPI_Pack`, `MPI_Unpack`).
//!
//! Sizes and displacements count *elements* of `T`, not bytes. A datatype describes one
//! layout starting at element 0 of a buffer: its *size* is the number of elements it
//! selects, its *extent* the number of elements it spans (the buffer must be at least that
//! long). Blocks never overlap (checked at construction), so unpacking is well defined and
//! may run in parallel.
//!
//! Large packs (at least the runtime's pack threshold, 256 KiB by default) are split into
//! pool tasks by block ranges ([Patinyasakdikul 2019, §4.6.2]): the calling thread packs the first piece,
//! idle workers and waiting threads steal the rest.
//!
//! ```
//! use weft::Datatype;
//! // Every other element of a 3x4 row-major matrix's first column... a column: 3 blocks of
//! // 1 element, 4 apart.
//! let column = Datatype::<f64>::vector(3, 1, 4).unwrap();
//! let m: Vec<f64> = (0..12).map(f64::from).collect();
//! let mut packed = vec![0.0; column.size()];
//! column.pack(&m, &mut packed).unwrap();
//! assert_eq!(packed, [0.0, 4.0, 8.0]);
//! let mut back = vec![0.0; 12];
//! column.unpack(&packed, &mut back).unwrap();
//! assert_eq!((back[4], back[5]), (4.0, 0.0));
//! ```

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use weft_sync::{Error, Status};

use crate::buffer::Primitive;
use crate::comm::Communicator;
use crate::engine::Engine;
use crate::matching::{Source, Tag};
use crate::request::Request;

/// The layout, in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Layout {
    /// `count` consecutive elements.
    Contiguous { count: usize },
    /// `count` blocks of `blocklen` elements, block `i` starting at `i * stride`.
    Vector { count: usize, blocklen: usize, stride: usize },
    /// Blocks `(displacement, length)` in the order given (empty blocks dropped), and the
    /// packed offset of each block (prefix sums of the lengths).
    Indexed { blocks: Arc<[(usize, usize)]>, packed_at: Arc<[usize]> },
}

/// A layout of `T` elements in a buffer: which elements a send packs, or where a receive
/// unpacks to. Cheap to clone.
#[derive(Clone, PartialEq, Eq)]
pub struct Datatype<T: Primitive> {
    layout: Layout,
    /// Elements selected.
    size: usize,
    /// Elements spanned, from element 0.
    extent: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T: Primitive> fmt::Debug for Datatype<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Datatype");
        match &self.layout {
            Layout::Contiguous { count } => d.field("contiguous", count),
            Layout::Vector { count, blocklen, stride } => d.field("vector", &(count, blocklen, stride)),
            Layout::Indexed { blocks, .. } => d.field("indexed_blocks", &blocks.len()),
        };
        d.field("elem", &std::any::type_name::<T>()).field("size", &self.size).field("extent", &self.extent).finish()
    }
}

const OVERFLOW: Error = Error::InvalidArgument("datatype size overflows usize");

/// The most bytes a datatype may span: what a Rust slice can hold (`isize::MAX`). A larger
/// layout could never describe a real buffer, and keeping below it makes
/// [`Datatype::size_bytes`] and [`Datatype::extent_bytes`] plain multiplications that cannot
/// overflow.
const MAX_BYTES: usize = isize::MAX as usize;

const TOO_LARGE: Error = Error::InvalidArgument("datatype spans more than isize::MAX bytes");

impl<T: Primitive> Datatype<T> {
    /// `count` consecutive elements (`MPI_Type_contiguous`). Fails if they span more than
    /// `isize::MAX` bytes (as [`vector`](Self::vector) and [`indexed`](Self::indexed) do).
    pub fn contiguous(count: usize) -> Result<Self, Error> {
        Self::bytes_fit(count)?;
        Ok(Datatype { layout: Layout::Contiguous { count }, size: count, extent: count, _elem: PhantomData })
    }

    /// `count` blocks of `blocklen` elements whose starts are `stride` elements apart
    /// (`MPI_Type_vector`). Blocks may not overlap: `stride >= blocklen` unless there is at
    /// most one block.
    pub fn vector(count: usize, blocklen: usize, stride: usize) -> Result<Self, Error> {
        if count > 1 && stride < blocklen {
            return Err(Error::InvalidArgument("vector datatype: stride smaller than block length (overlapping blocks)"));
        }
        let size = count.checked_mul(blocklen).ok_or(OVERFLOW)?;
        let extent = if count == 0 || blocklen == 0 {
            0
        } else {
            (count - 1).checked_mul(stride).and_then(|x| x.checked_add(blocklen)).ok_or(OVERFLOW)?
        };
        Self::bytes_fit(extent)?;
        Ok(Datatype { layout: Layout::Vector { count, blocklen, stride }, size, extent, _elem: PhantomData })
    }

    /// Blocks of `blocklens[i]` elements at displacements `displs[i]` (`MPI_Type_indexed`),
    /// packed in the order given. The two slices must have the same length and the blocks
    /// may not overlap.
    pub fn indexed(blocklens: &[usize], displs: &[usize]) -> Result<Self, Error> {
        if blocklens.len() != displs.len() {
            return Err(Error::InvalidArgument("indexed datatype: block lengths and displacements differ in number"));
        }
        let mut blocks = Vec::with_capacity(blocklens.len());
        let mut packed_at = Vec::with_capacity(blocklens.len());
        let (mut size, mut extent) = (0usize, 0usize);
        for (&len, &at) in blocklens.iter().zip(displs) {
            if len == 0 {
                continue;
            }
            let end = at.checked_add(len).ok_or(OVERFLOW)?;
            extent = extent.max(end);
            packed_at.push(size);
            size = size.checked_add(len).ok_or(OVERFLOW)?;
            blocks.push((at, len));
        }
        Self::bytes_fit(extent)?;
        let mut sorted = blocks.clone();
        sorted.sort_unstable();
        if sorted.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            return Err(Error::InvalidArgument("indexed datatype: blocks overlap"));
        }
        Ok(Datatype { layout: Layout::Indexed { blocks: blocks.into(), packed_at: packed_at.into() }, size, extent, _elem: PhantomData })
    }

    /// Checks that `elems` elements (a layout's extent, which is at least its size: blocks
    /// never overlap) span at most [`MAX_BYTES`]. Every constructor calls it, so the byte
    /// sizes of a datatype never overflow.
    fn bytes_fit(elems: usize) -> Result<(), Error> {
        match elems.checked_mul(std::mem::size_of::<T>()) {
            Some(b) if b <= MAX_BYTES => Ok(()),
            Some(_) => Err(TOO_LARGE),
            None => Err(OVERFLOW),
        }
    }

    /// Elements selected (the packed length).
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes selected (the packed size, `MPI_Type_size`).
    pub fn size_bytes(&self) -> usize {
        // Cannot overflow: `size <= extent`, whose bytes the constructors checked.
        self.size * std::mem::size_of::<T>()
    }

    /// Elements spanned from element 0: a buffer must be at least this long.
    pub fn extent(&self) -> usize {
        self.extent
    }

    /// Bytes spanned (`MPI_Type_get_extent` with a lower bound of 0).
    pub fn extent_bytes(&self) -> usize {
        // Cannot overflow: checked by every constructor (`bytes_fit`).
        self.extent * std::mem::size_of::<T>()
    }

    /// Number of contiguous blocks (the units packing is split by).
    fn units(&self) -> usize {
        match &self.layout {
            Layout::Contiguous { count } => *count,
            Layout::Vector { count, blocklen, .. } => {
                if *blocklen == 0 {
                    0
                } else {
                    *count
                }
            }
            Layout::Indexed { blocks, .. } => blocks.len(),
        }
    }

    /// Calls `f(buffer offset, packed offset, length)` for units `lo..hi`, in packed order.
    #[inline]
    fn for_units(&self, lo: usize, hi: usize, mut f: impl FnMut(usize, usize, usize)) {
        match &self.layout {
            Layout::Contiguous { .. } => {
                if hi > lo {
                    f(lo, lo, hi - lo)
                }
            }
            Layout::Vector { blocklen, stride, .. } => {
                for b in lo..hi {
                    f(b * stride, b * blocklen, *blocklen)
                }
            }
            Layout::Indexed { blocks, packed_at } => {
                for b in lo..hi {
                    f(blocks[b].0, packed_at[b], blocks[b].1)
                }
            }
        }
    }

    fn check_pack(&self, src: usize, dst: usize) -> Result<(), Error> {
        if src < self.extent {
            return Err(Error::InvalidArgument("pack: source buffer shorter than the datatype's extent"));
        }
        if dst < self.size {
            return Err(Error::InvalidArgument("pack: destination shorter than the datatype's size"));
        }
        Ok(())
    }

    fn check_unpack(&self, src: usize, dst: usize) -> Result<(), Error> {
        if dst < self.extent {
            return Err(Error::InvalidArgument("unpack: destination buffer shorter than the datatype's extent"));
        }
        if src > self.size {
            let e = std::mem::size_of::<T>();
            return Err(Error::Truncated { message_len: src * e, buffer_len: self.size * e });
        }
        Ok(())
    }

    /// Copies the selected elements of `src` into the first [`size`](Self::size) elements of
    /// `dst` (`MPI_Pack`), on this thread. Returns the elements written.
    pub fn pack(&self, src: &[T], dst: &mut [T]) -> Result<usize, Error> {
        self.check_pack(src.len(), dst.len())?;
        // SAFETY: checked above: every unit lies inside `src` (extent) and `dst` (size).
        unsafe { self.pack_units(src.as_ptr(), dst.as_mut_ptr(), 0, self.units()) };
        Ok(self.size)
    }

    /// Packs `src` into a new vector of [`size`](Self::size) elements.
    pub fn pack_to_vec(&self, src: &[T]) -> Result<Vec<T>, Error> {
        self.check_pack(src.len(), self.size)?;
        let mut v = Vec::with_capacity(self.size);
        // SAFETY: the capacity holds `size` elements and `src` spans the extent; every
        // element of `0..size` is written (units cover the packed range exactly), so the
        // length may be set after.
        unsafe {
            self.pack_units(src.as_ptr(), v.as_mut_ptr(), 0, self.units());
            v.set_len(self.size);
        }
        Ok(v)
    }

    /// Copies packed elements `src` into their places in `dst` (`MPI_Unpack`), on this
    /// thread. `src` may be shorter than the size (a partial message): its elements fill the
    /// layout in order. Returns the elements read.
    pub fn unpack(&self, src: &[T], dst: &mut [T]) -> Result<usize, Error> {
        self.check_unpack(src.len(), dst.len())?;
        // SAFETY: checked above: `dst` spans the extent and `src.len() <= size`.
        unsafe { self.unpack_prefix(src.as_ptr(), src.len(), dst.as_mut_ptr()) };
        Ok(src.len())
    }

    /// # Safety
    /// `src` must be valid for reads over the extent and `dst` for writes over the packed
    /// offsets of units `lo..hi`; no other thread writes those ranges meanwhile.
    unsafe fn pack_units(&self, src: *const T, dst: *mut T, lo: usize, hi: usize) {
        self.for_units(lo, hi, |at, packed, len| {
            // SAFETY: per the contract (units lie inside both buffers; src and dst are
            // distinct buffers).
            unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(packed), len) }
        });
    }

    /// # Safety
    /// `src` valid for reads over the packed offsets of units `lo..hi`, `dst` for writes
    /// over their buffer offsets, written by no other thread meanwhile.
    unsafe fn unpack_units(&self, src: *const T, dst: *mut T, lo: usize, hi: usize) {
        self.for_units(lo, hi, |at, packed, len| {
            // SAFETY: per the contract.
            unsafe { std::ptr::copy_nonoverlapping(src.add(packed), dst.add(at), len) }
        });
    }

    /// # Safety
    /// `src` valid for `n <= size` reads, `dst` for writes over the extent.
    unsafe fn unpack_prefix(&self, src: *const T, n: usize, dst: *mut T) {
        if n == self.size {
            // SAFETY: per the contract.
            return unsafe { self.unpack_units(src, dst, 0, self.units()) };
        }
        let mut left = n;
        self.for_units(0, self.units(), |at, packed, len| {
            let take = len.min(left);
            if take > 0 {
                // SAFETY: `packed + take <= n` (units are in packed order) and the block
                // lies inside the extent.
                unsafe { std::ptr::copy_nonoverlapping(src.add(packed), dst.add(at), take) };
                left -= take;
            }
        });
    }

    /// How many pieces a parallel pack of this type uses on `engine`'s pool.
    fn pieces(&self, engine: &Engine) -> usize {
        let threshold = engine.config.pack_threshold.max(1);
        if engine.config.workers == 0 || self.size_bytes() < threshold {
            return 1;
        }
        let threads = engine.config.workers + 1;
        // A few pieces per thread for balance, each about the threshold or more.
        let by_size = (self.size_bytes() / threshold).max(2);
        (threads * 4).min(by_size).min(self.units()).max(1)
    }
}

/// A raw pointer shared by the pieces of one parallel pack (each writes a disjoint range).
#[derive(Clone, Copy)]
struct SharedPtr<T>(*mut T);
// SAFETY: the pieces write disjoint ranges (packed offsets for pack; non-overlapping blocks,
// checked at construction, for unpack) and the caller waits for all of them.
unsafe impl<T: Send> Sync for SharedPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Send for SharedPtr<T> {}

/// [`Datatype::pack`], split into pool tasks when large (see `Runtime::pack`).
pub(crate) fn pack_parallel<T: Primitive>(engine: &Arc<Engine>, ty: &Datatype<T>, src: &[T], dst: &mut [T]) -> Result<usize, Error> {
    ty.check_pack(src.len(), dst.len())?;
    // SAFETY: checked above.
    unsafe { pack_raw(engine, ty, src.as_ptr(), dst.as_mut_ptr()) };
    Ok(ty.size)
}

/// # Safety
/// `src` spans the extent, `dst` holds `size` elements, and nobody else touches `dst`.
unsafe fn pack_raw<T: Primitive>(engine: &Arc<Engine>, ty: &Datatype<T>, src: *const T, dst: *mut T) {
    let pieces = ty.pieces(engine);
    let units = ty.units();
    let (s, d) = (SharedPtr(src as *mut T), SharedPtr(dst));
    let work = move |i: usize| {
        let (lo, hi) = (units * i / pieces, units * (i + 1) / pieces);
        let (s, d) = (s, d);
        // SAFETY: per `pack_raw`'s contract; pieces cover disjoint unit ranges.
        unsafe { ty.pack_units(s.0, d.0, lo, hi) }
    };
    crate::executor::split(&engine.executor, || engine.clone(), pieces, &work);
}

/// [`Datatype::unpack`], split into pool tasks when large and complete.
pub(crate) fn unpack_parallel<T: Primitive>(engine: &Arc<Engine>, ty: &Datatype<T>, src: &[T], dst: &mut [T]) -> Result<usize, Error> {
    ty.check_unpack(src.len(), dst.len())?;
    if src.len() < ty.size {
        return ty.unpack(src, dst);
    }
    let pieces = ty.pieces(engine);
    let units = ty.units();
    let (s, d) = (SharedPtr(src.as_ptr() as *mut T), SharedPtr(dst.as_mut_ptr()));
    let work = move |i: usize| {
        let (lo, hi) = (units * i / pieces, units * (i + 1) / pieces);
        let (s, d) = (s, d);
        // SAFETY: checked above; blocks do not overlap, so pieces write disjoint ranges.
        unsafe { ty.unpack_units(s.0, d.0, lo, hi) }
    };
    crate::executor::split(&engine.executor, || engine.clone(), pieces, &work);
    Ok(src.len())
}

impl Communicator {
    /// Starts sending the elements of `data` that `ty` selects (`MPI_Isend` with a derived
    /// datatype). They are packed at once (in parallel on the pool when large), so `data` is
    /// free again when this returns; the request resolves to the packed buffer and the
    /// status. Messages above the eager threshold go by rendezvous as usual.
    pub fn isend_typed<T: Primitive>(&self, data: &[T], ty: &Datatype<T>, dest: u32, tag: i32) -> Result<Request<'_, Vec<T>>, Error> {
        ty.check_pack(data.len(), ty.size)?;
        let mut packed = Vec::with_capacity(ty.size);
        // SAFETY: `data` spans the extent and the capacity holds `size` elements, all of
        // which the pack writes before the length is set.
        unsafe {
            pack_raw(self.engine(), ty, data.as_ptr(), packed.as_mut_ptr());
            packed.set_len(ty.size);
        }
        self.isend(packed, dest, tag)
    }

    /// Starts receiving a message into the places of `data` that `ty` selects
    /// (`MPI_Irecv` with a derived datatype). The packed message lands in a buffer of the
    /// type's size and is unpacked into `data` on completion; a longer message fails with
    /// [`Error::Truncated`], a shorter one fills the layout's first elements.
    pub fn irecv_typed<'a, T: Primitive>(
        &'a self,
        data: &'a mut [T],
        ty: &Datatype<T>,
        source: impl Into<Source>,
        tag: impl Into<Tag>,
    ) -> Result<TypedRecv<'a, T>, Error> {
        ty.check_unpack(0, data.len())?;
        let req = self.irecv(Vec::<T>::with_capacity(ty.size), source, tag)?;
        Ok(TypedRecv { req: Some(req), data, ty: ty.clone(), consumed: std::sync::OnceLock::new() })
    }

    /// Sends with a datatype and waits.
    pub fn send_typed<T: Primitive>(&self, data: &[T], ty: &Datatype<T>, dest: u32, tag: i32) -> Result<Status, Error> {
        self.isend_typed(data, ty, dest, tag)?.wait().map(|(_, st)| st)
    }

    /// Receives with a datatype and waits.
    pub fn recv_typed<T: Primitive>(
        &self,
        data: &mut [T],
        ty: &Datatype<T>,
        source: impl Into<Source>,
        tag: impl Into<Tag>,
    ) -> Result<Status, Error> {
        self.irecv_typed(data, ty, source, tag)?.wait()
    }
}

/// A receive with a datatype in flight ([`Communicator::irecv_typed`]): a `Future` giving
/// the [`Status`] once the message is unpacked into the user's buffer. It can be attached to
/// a [`SyncObject`](crate::SyncObject) like a [`Request`]; after its completion is queued,
/// [`wait`](Self::wait) unpacks at once. Dropping it before completion cancels the receive
/// (the user's buffer is never written after the drop).
pub struct TypedRecv<'a, T: Primitive> {
    /// The receive of the packed message; `None` once consumed.
    req: Option<Request<'a, Vec<T>>>,
    /// Where the message is unpacked.
    data: &'a mut [T],
    /// The layout of `data`.
    ty: Datatype<T>,
    /// The completed cell a sync object gets once the receive was consumed.
    consumed: std::sync::OnceLock<std::sync::Arc<crate::operation::Operation>>,
}

impl<T: Primitive> fmt::Debug for TypedRecv<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TypedRecv").field("request", &self.req).field("datatype", &self.ty).finish()
    }
}

impl<T: Primitive> TypedRecv<'_, T> {
    fn finish(&mut self, res: Result<(Vec<T>, Status), Error>, engine: &Arc<Engine>) -> Result<Status, Error> {
        let (packed, st) = res?;
        unpack_parallel(engine, &self.ty, &packed, self.data)?;
        Ok(st)
    }

    /// Blocks until the message has arrived and is unpacked (`MPI_Wait`).
    pub fn wait(mut self) -> Result<Status, Error> {
        let req = self.req.take().ok_or(Error::InvalidArgument("typed receive already consumed"))?;
        let engine = req.communicator().engine().clone();
        let res = req.wait();
        self.finish(res, &engine)
    }

    /// Makes one step of progress; `true` once the message has arrived (then
    /// [`wait`](Self::wait) or `.await` returns at once).
    pub fn test(&mut self) -> bool {
        self.req.as_mut().map_or(true, |r| r.test())
    }
}

// SAFETY: delegates to the request, whose cell lives as long as the runtime needs it.
unsafe impl<T: Primitive> weft_sync::Attach for TypedRecv<'_, T> {
    fn completion_cell(&self) -> &weft_sync::CompletionCell {
        match &self.req {
            Some(r) => r.completion_cell(),
            None => crate::request::consumed_cell(&self.consumed),
        }
    }
}

impl<T: Primitive> Future for TypedRecv<'_, T> {
    type Output = Result<Status, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Some(req) = this.req.as_mut() else {
            return Poll::Ready(Err(Error::InvalidArgument("typed receive polled after completion")));
        };
        match Pin::new(&mut *req).poll(cx) {
            Poll::Ready(res) => {
                let engine = req.communicator().engine().clone();
                this.req = None;
                Poll::Ready(this.finish(res, &engine))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
