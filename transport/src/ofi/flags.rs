//! Small bit-set newtypes over libfabric's 64-bit flag words (capabilities, completion
//! flags, memory-region access), so the public API never hands out raw `u64` masks.

use std::fmt;

use super::sys;

macro_rules! flag_set {
    (
        $(#[$meta:meta])*
        $name:ident { $( $(#[$fmeta:meta])* $flag:ident = $value:expr, )* }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(u64);

        impl $name {
            $( $(#[$fmeta])* pub const $flag: Self = Self($value); )*

            /// The empty set.
            pub const fn empty() -> Self {
                Self(0)
            }
            /// Builds a set from libfabric's raw flag word (unknown bits are kept).
            pub const fn from_bits(bits: u64) -> Self {
                Self(bits)
            }
            /// The raw libfabric flag word.
            pub const fn bits(self) -> u64 {
                self.0
            }
            /// True when every flag of `other` is in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }
            /// True when no flag is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }
            /// Flags of `self` that are not in `other`.
            pub const fn difference(self, other: Self) -> Self {
                Self(self.0 & !other.0)
            }
            /// Flags in both.
            pub const fn intersection(self, other: Self) -> Self {
                Self(self.0 & other.0)
            }
        }

        impl std::ops::BitOr for $name {
            type Output = Self;
            fn bitor(self, rhs: Self) -> Self {
                Self(self.0 | rhs.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut rest = self.0;
                let mut first = true;
                write!(f, "{}(", stringify!($name))?;
                $(
                    if $value != 0 && self.0 & $value == $value {
                        if !first { f.write_str(" | ")?; }
                        f.write_str(stringify!($flag))?;
                        first = false;
                        rest &= !$value;
                    }
                )*
                if rest != 0 {
                    if !first { f.write_str(" | ")?; }
                    write!(f, "{rest:#x}")?;
                }
                f.write_str(")")
            }
        }
    };
}

flag_set! {
    /// Capabilities weft asks a provider for (`fi_info::caps`).
    Caps {
        /// `FI_MSG`: untagged send/receive.
        MSG = sys::FI_MSG,
        /// `FI_TAGGED`: tagged send/receive with matching.
        TAGGED = sys::FI_TAGGED,
        /// `FI_RMA`: remote read/write.
        RMA = sys::FI_RMA,
        /// `FI_ATOMIC`: remote atomics (fetch-and-op, compare-and-swap).
        ATOMIC = sys::FI_ATOMIC,
    }
}

impl Caps {
    /// Everything weft uses: `MSG | TAGGED | RMA | ATOMIC`.
    pub const ALL: Self = Self(sys::FI_MSG | sys::FI_TAGGED | sys::FI_RMA | sys::FI_ATOMIC);
}

flag_set! {
    /// Flags of a completion (`fi_cq_tagged_entry::flags`): what kind of operation completed.
    CompletionFlags {
        /// A send (tagged or not) completed.
        SEND = sys::FI_SEND,
        /// A receive completed.
        RECV = sys::FI_RECV,
        /// Untagged message.
        MSG = sys::FI_MSG,
        /// Tagged message.
        TAGGED = sys::FI_TAGGED,
        /// RMA operation.
        RMA = sys::FI_RMA,
        /// Atomic operation.
        ATOMIC = sys::FI_ATOMIC,
        /// Read (RMA read or fetching atomic).
        READ = sys::FI_READ,
        /// Write (RMA write or atomic).
        WRITE = sys::FI_WRITE,
        /// The completion carries remote CQ data.
        REMOTE_CQ_DATA = sys::FI_REMOTE_CQ_DATA,
        /// A multi-receive buffer was released.
        MULTI_RECV = sys::FI_MULTI_RECV,
    }
}

flag_set! {
    /// Access rights of a memory registration (`fi_mr_reg` `access`).
    MrAccess {
        /// Local buffer of a send.
        SEND = sys::FI_SEND,
        /// Local buffer of a receive.
        RECV = sys::FI_RECV,
        /// Local buffer of an RMA read / fetching atomic result.
        READ = sys::FI_READ,
        /// Local buffer of an RMA write / atomic operand.
        WRITE = sys::FI_WRITE,
        /// Peers may read it.
        REMOTE_READ = sys::FI_REMOTE_READ,
        /// Peers may write it (RMA write and atomics).
        REMOTE_WRITE = sys::FI_REMOTE_WRITE,
    }
}

impl MrAccess {
    /// Every access right: local use by any operation and remote read/write.
    pub const ALL: Self = Self(sys::FI_SEND | sys::FI_RECV | sys::FI_READ | sys::FI_WRITE | sys::FI_REMOTE_READ | sys::FI_REMOTE_WRITE);
}
