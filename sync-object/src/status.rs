//! What a completed operation reports: a [`Status`] or an [`Error`].

use std::fmt;

/// The envelope of a completed operation, as `MPI_Status` reports it.
///
/// For a receive, `source` and `tag` are those of the matched message (useful after a
/// wildcard receive) and `bytes` is the payload length. For a send, `source` is the
/// destination rank, `tag` the tag sent, and `bytes` the length sent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Status {
    /// Rank of the peer (the sender for a receive, the destination for a send).
    pub source: u32,
    /// Tag of the message.
    pub tag: i32,
    /// Number of payload bytes moved.
    pub bytes: usize,
}

impl Status {
    /// The status of an operation that was cancelled before it matched anything
    /// (`Request::cancel` in `weft`): no message was received and no byte was written.
    ///
    /// As `MPI_Test_cancelled` is the only thing defined of such a status in MPI, it is told
    /// apart by its fields alone (no field of its own, so `Status` keeps its size and every
    /// literal stays valid): `source` is `u32::MAX` and `tag` is `i32::MIN`, neither of which
    /// a message ever carries (ranks are below the size of the world, tags never negative).
    pub const CANCELLED: Status = Status { source: u32::MAX, tag: i32::MIN, bytes: 0 };

    /// Whether the operation was cancelled instead of completing (`MPI_Test_cancelled`).
    ///
    /// ```
    /// use weft_sync::Status;
    /// assert!(Status::CANCELLED.cancelled());
    /// assert!(!Status { source: 0, tag: 7, bytes: 8 }.cancelled());
    /// ```
    #[inline]
    pub fn cancelled(&self) -> bool {
        *self == Status::CANCELLED
    }
}

/// Every way a weft operation can fail.
///
/// Defined in `weft-sync` because a completion carries it; `weft` re-exports it as
/// `weft::Error`. Each variant is cheap to copy so one failure (a lost peer, say) can be
/// delivered to every pending request it affects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The matched message is longer than the posted receive buffer. Nothing was written
    /// past the buffer; the message is consumed (as `MPI_ERR_TRUNCATE`).
    Truncated {
        /// Length of the incoming message in bytes.
        message_len: usize,
        /// Capacity of the receive buffer in bytes.
        buffer_len: usize,
    },
    /// A rank outside `0..size` was named.
    RankOutOfRange {
        /// The rank given.
        rank: u32,
        /// The size of the communicator.
        size: u32,
    },
    /// A tag below zero or above the runtime's maximum was given.
    InvalidTag {
        /// The tag given.
        tag: i32,
        /// The largest tag allowed.
        max: i32,
    },
    /// The communicator was freed, or the runtime shut down, before or while the
    /// operation was pending.
    CommFreed,
    /// The peer is gone — lost (its process died) or finished (it dropped its runtime) —
    /// and every pending request that needs it fails with this. What a finished peer sent
    /// before it finished is still received first; only requests nothing can match any
    /// more fail.
    PeerLost {
        /// The rank that is gone.
        rank: u32,
    },
    /// The request was cancelled (detached and dropped, or the runtime shut down).
    Cancelled,
    /// An argument was invalid; the text says which.
    InvalidArgument(&'static str),
    /// A typed buffer's length is not a whole number of elements.
    Misaligned {
        /// Size of one element in bytes.
        elem_size: usize,
        /// Length of the incoming message in bytes.
        message_len: usize,
    },
    /// The transport failed; `op` names the call and `code` its error number.
    Transport {
        /// The operation that failed.
        op: &'static str,
        /// The provider's error code.
        code: i32,
    },
    /// A one-sided (RMA) access reaches outside the target's window; nothing was read or
    /// written.
    OutOfWindow {
        /// First element of the access.
        offset: usize,
        /// Number of elements of the access.
        len: usize,
        /// Number of elements in the target's window.
        window: usize,
    },
    /// A one-sided atomic names an element that is not naturally aligned at the target, or
    /// whose aligned 8-byte word is not wholly inside the target's window; nothing was read
    /// or written.
    UnalignedAtomic {
        /// The element named.
        offset: usize,
        /// Size of one element in bytes.
        elem_size: usize,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { message_len, buffer_len } => {
                write!(f, "message of {message_len} bytes truncated: receive buffer holds {buffer_len} bytes")
            }
            Error::RankOutOfRange { rank, size } => {
                write!(f, "rank {rank} out of range for a communicator of size {size}")
            }
            Error::InvalidTag { tag, max } => write!(f, "tag {tag} outside 0..={max}"),
            Error::CommFreed => f.write_str("communicator freed (or runtime shut down)"),
            Error::PeerLost { rank } => write!(f, "peer rank {rank} was lost"),
            Error::Cancelled => f.write_str("operation cancelled"),
            Error::InvalidArgument(what) => write!(f, "invalid argument: {what}"),
            Error::Misaligned { elem_size, message_len } => {
                write!(f, "message of {message_len} bytes is not a whole number of {elem_size}-byte elements")
            }
            Error::Transport { op, code } => write!(f, "transport error in {op}: code {code}"),
            Error::OutOfWindow { offset, len, window } => {
                write!(f, "RMA access of {len} elements at {offset} outside a window of {window} elements")
            }
            Error::UnalignedAtomic { offset, elem_size } => {
                write!(f, "RMA atomic on element {offset} ({elem_size} bytes) is not aligned inside the target window")
            }
        }
    }
}

impl std::error::Error for Error {}

/// The result a completion carries.
pub type Outcome = Result<Status, Error>;
