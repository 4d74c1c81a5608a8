//! Element types of RMA atomics and the operations on them, and the lanes of a 64-bit word
//! (the unit of the transports' atomics).

use std::mem::size_of;

use weft_transport::RmaOp;

use crate::buffer::Primitive;

/// An accumulate or fetch-and-op operation (`MPI_Op` of one-sided operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `old + operand` (integers wrap).
    Sum,
    /// `old * operand` (integers wrap).
    Prod,
    /// The smaller of the two (floats: `f64::min`).
    Min,
    /// The larger of the two (floats: `f64::max`).
    Max,
    /// Bitwise and (integers only).
    BitAnd,
    /// Bitwise or (integers only).
    BitOr,
    /// Bitwise exclusive or (integers only).
    BitXor,
    /// `operand` (`MPI_REPLACE`).
    Replace,
    /// `old`: reads only (`MPI_NO_OP`).
    NoOp,
}

mod sealed {
    pub trait Sealed {}
}

/// A type RMA atomics work on: every integer up to 64 bits, `f32`, `f64`.
pub trait AtomicElement: Primitive + sealed::Sealed {
    /// `op(old, operand)`, or `None` if `op` does not apply to the type (bitwise on floats).
    fn combine(old: Self, operand: Self, op: Op) -> Option<Self>;
    /// The transport's native 64-bit atomic doing `op` on this type, if there is one.
    fn native(op: Op) -> Option<RmaOp>;
}

macro_rules! integer {
    ($($t:ty => $native:expr),*) => { $(
        impl sealed::Sealed for $t {}
        impl AtomicElement for $t {
            fn combine(old: Self, operand: Self, op: Op) -> Option<Self> {
                Some(match op {
                    Op::Sum => old.wrapping_add(operand),
                    Op::Prod => old.wrapping_mul(operand),
                    Op::Min => old.min(operand),
                    Op::Max => old.max(operand),
                    Op::BitAnd => old & operand,
                    Op::BitOr => old | operand,
                    Op::BitXor => old ^ operand,
                    Op::Replace => operand,
                    Op::NoOp => old,
                })
            }
            fn native(op: Op) -> Option<RmaOp> {
                let native: fn(Op) -> Option<RmaOp> = $native;
                native(op)
            }
        }
    )* };
}

/// Native on an unsigned 64-bit word (the transports' min/max are unsigned).
fn unsigned64(op: Op) -> Option<RmaOp> {
    match op {
        Op::Min => Some(RmaOp::Min),
        Op::Max => Some(RmaOp::Max),
        op => signed64(op),
    }
}

/// Native on a signed 64-bit word (two's complement: sum and bitwise ops are the unsigned
/// ones).
fn signed64(op: Op) -> Option<RmaOp> {
    match op {
        Op::Sum => Some(RmaOp::Sum),
        Op::BitAnd => Some(RmaOp::BitAnd),
        Op::BitOr => Some(RmaOp::BitOr),
        Op::Replace => Some(RmaOp::Swap),
        Op::NoOp => Some(RmaOp::Read),
        _ => None,
    }
}

/// Narrower than a word: always the compare-and-swap loop.
fn none(_: Op) -> Option<RmaOp> {
    None
}

integer!(u8 => none, i8 => none, u16 => none, i16 => none, u32 => none, i32 => none, u64 => unsigned64, i64 => signed64);
#[cfg(target_pointer_width = "64")]
integer!(usize => unsigned64, isize => signed64);
#[cfg(not(target_pointer_width = "64"))]
integer!(usize => none, isize => none);

macro_rules! float {
    ($($t:ty),*) => { $(
        impl sealed::Sealed for $t {}
        impl AtomicElement for $t {
            fn combine(old: Self, operand: Self, op: Op) -> Option<Self> {
                Some(match op {
                    Op::Sum => old + operand,
                    Op::Prod => old * operand,
                    Op::Min => old.min(operand),
                    Op::Max => old.max(operand),
                    Op::Replace => operand,
                    Op::NoOp => old,
                    Op::BitAnd | Op::BitOr | Op::BitXor => return None,
                })
            }
            fn native(op: Op) -> Option<RmaOp> {
                match op {
                    Op::Replace => Some(RmaOp::Swap),
                    Op::NoOp => Some(RmaOp::Read),
                    _ => None,
                }
            }
        }
    )* };
}
float!(f32, f64);

/// The bits of an 8-byte element as a word.
pub(super) fn to_word<T: Primitive>(v: T) -> u64 {
    assert_eq!(size_of::<T>(), 8, "a word-sized element");
    // SAFETY: `T` is 8 bytes without padding (checked, `Primitive`).
    unsafe { std::mem::transmute_copy(&v) }
}

/// An 8-byte element from a word's bits.
pub(super) fn from_word<T: Primitive>(w: u64) -> T {
    assert_eq!(size_of::<T>(), 8, "a word-sized element");
    // SAFETY: 8 bytes, and every bit pattern is a valid `T` (`Primitive`).
    unsafe { std::mem::transmute_copy(&w) }
}

/// The element at byte `lane` of word `w` (as it lies in memory).
pub(super) fn lane<T: Primitive>(w: u64, lane: usize) -> T {
    let bytes = w.to_ne_bytes();
    let field = &bytes[lane..lane + size_of::<T>()];
    // SAFETY: `field` holds `size_of::<T>()` bytes; every bit pattern is a valid `T`.
    unsafe { std::ptr::read_unaligned(field.as_ptr().cast()) }
}

/// Word `w` with the element at byte `lane` replaced by `v`.
pub(super) fn with_lane<T: Primitive>(w: u64, lane: usize, v: T) -> u64 {
    let mut bytes = w.to_ne_bytes();
    let field = &mut bytes[lane..lane + size_of::<T>()];
    // SAFETY: `field` has room for `size_of::<T>()` bytes.
    unsafe { std::ptr::write_unaligned(field.as_mut_ptr().cast(), v) };
    u64::from_ne_bytes(bytes)
}

/// Whether two elements have the same bits.
pub(super) fn same_bits<T: Primitive>(a: T, b: T) -> bool {
    with_lane(0, 0, a) == with_lane(0, 0, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_round_trip_and_leave_the_rest_alone() {
        let w = 0x0807_0605_0403_0201u64;
        let v: u16 = lane(w, 2);
        assert_eq!(v.to_ne_bytes(), w.to_ne_bytes()[2..4]);
        let w2 = with_lane(w, 2, 0xffffu16);
        assert_eq!(lane::<u16>(w2, 2), 0xffff);
        assert_eq!(lane::<u16>(w2, 0), lane::<u16>(w, 0));
        assert_eq!(lane::<u32>(w2, 4), lane::<u32>(w, 4));
        assert!(same_bits(1.5f32, 1.5f32) && !same_bits(0.0f32, -0.0f32));
        assert_eq!(from_word::<f64>(to_word(2.25f64)), 2.25);
    }

    #[test]
    fn operations_per_type() {
        assert_eq!(u8::combine(250, 10, Op::Sum), Some(4));
        assert_eq!(i32::combine(-3, 5, Op::Min), Some(-3));
        assert_eq!(f64::combine(1.5, 2.0, Op::Prod), Some(3.0));
        assert_eq!(f32::combine(1.0, 2.0, Op::BitXor), None);
        assert_eq!(i64::native(Op::Max), None, "the transport's max is unsigned");
        assert_eq!(u64::native(Op::Max), Some(RmaOp::Max));
    }
}
