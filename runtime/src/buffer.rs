//! Owned message buffers: what `isend` and `irecv` take and give back.
//!
//! A request owns its buffer while the operation is in flight, so the transport never
//! writes into (or reads from) freed memory; the buffer comes back with the completion.

use bytes::{Bytes, BytesMut};

/// Plain-old-data element types that may be sent as raw bytes.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid value, and the type must
/// have no padding.
pub unsafe trait Primitive: Copy + Send + Sync + 'static {}

macro_rules! primitive {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive integer or float: no padding, every bit pattern valid.
        unsafe impl Primitive for $t {}
    )* };
}
primitive!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);

/// A buffer whose bytes can be sent.
///
/// # Safety
/// `as_bytes` must return the same memory for as long as the value lives, even if the value
/// itself is moved (heap storage), and the memory must not change while it is borrowed by an
/// in-flight send.
pub unsafe trait SendBuf: Send + 'static {
    /// The bytes to send.
    fn as_bytes(&self) -> &[u8];
}

/// A buffer that can receive bytes into its spare capacity.
///
/// # Safety
/// `spare` must describe memory that stays valid (and is not otherwise accessed) while the
/// value lives, even if the value is moved; `filled` must accept any byte count up to the
/// spare length that is a multiple of [`elem_size`](Self::elem_size).
pub unsafe trait RecvBuf: Send + 'static {
    /// Size of one element; a message must be a whole number of them.
    fn elem_size(&self) -> usize;
    /// Pointer to and length in bytes of the receive area.
    fn spare(&mut self) -> (*mut u8, usize);
    /// Records that `bytes` bytes were written at the start of the receive area.
    ///
    /// # Safety
    /// Those bytes must have been written, and `bytes` must be a multiple of the element size
    /// no larger than the spare length.
    unsafe fn filled(&mut self, bytes: usize);
}

// SAFETY: a `Vec`'s heap storage does not move when the `Vec` is moved, and the request
// holds the `Vec` without touching it while the send is in flight.
unsafe impl<T: Primitive> SendBuf for Vec<T> {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: `T: Primitive` has no padding, so its bytes are initialized.
        unsafe { std::slice::from_raw_parts(self.as_ptr().cast(), std::mem::size_of_val(self.as_slice())) }
    }
}

// SAFETY: as for `Vec`.
unsafe impl<T: Primitive> SendBuf for Box<[T]> {
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: as for `Vec`.
        unsafe { std::slice::from_raw_parts(self.as_ptr().cast(), std::mem::size_of_val(&**self)) }
    }
}

// SAFETY: `Bytes` is immutable and its storage never moves.
unsafe impl SendBuf for Bytes {
    fn as_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: static data lives forever and never changes.
unsafe impl SendBuf for &'static [u8] {
    fn as_bytes(&self) -> &[u8] {
        self
    }
}

// SAFETY: the receive area is the `Vec`'s whole capacity (heap storage that does not move);
// `filled` sets the length to the elements received.
unsafe impl<T: Primitive> RecvBuf for Vec<T> {
    fn elem_size(&self) -> usize {
        std::mem::size_of::<T>().max(1)
    }
    fn spare(&mut self) -> (*mut u8, usize) {
        (self.as_mut_ptr().cast(), self.capacity() * std::mem::size_of::<T>())
    }
    unsafe fn filled(&mut self, bytes: usize) {
        // SAFETY: per the contract the first `bytes` bytes are written, and `T: Primitive`
        // accepts any bit pattern.
        unsafe { self.set_len(bytes / self.elem_size()) };
    }
}

// SAFETY: as for `Vec<u8>`: `BytesMut`'s storage does not move while we hold it unchanged.
unsafe impl RecvBuf for BytesMut {
    fn elem_size(&self) -> usize {
        1
    }
    fn spare(&mut self) -> (*mut u8, usize) {
        self.clear();
        (self.as_mut_ptr(), self.capacity())
    }
    unsafe fn filled(&mut self, bytes: usize) {
        // SAFETY: the first `bytes` bytes were written.
        unsafe { self.set_len(bytes) };
    }
}
