//! Frames: the unit a provider moves between CRIs (header + payload).

use std::fmt;

/// What a frame carries: a message (`Eager`, `Rts`) or a protocol frame (the kinds from
/// `Fin` on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum FrameKind {
    /// A whole message (at most the eager threshold) in the payload.
    Eager = 0,
    /// Ready-to-send of a rendezvous: `len` is the message length, `key` names the sender's
    /// registered buffer and `cookie` the sender's request.
    Rts = 1,
    /// Rendezvous done: the receiver has read the data; `cookie` echoes the RTS cookie.
    Fin = 2,
    /// The sender ended its part of a one-sided window: `context` names the window's
    /// communicator, `cookie` the sender's serial of the part (the runtime's `rma`).
    WindowEnd = 3,
}

/// The envelope of a frame: `(context id, source, tag, sequence)` plus protocol fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Protocol step.
    pub kind: FrameKind,
    /// CRI index of the sender (where replies such as `Fin` go). Read only on an `Rts`: a
    /// provider may leave it out of eager frames (libfabric's compact header does; the
    /// receiver sees 0).
    pub src_cri: u16,
    /// Communicator context id.
    pub context: u32,
    /// Rank of the sender.
    pub source: u32,
    /// Message tag.
    pub tag: i32,
    /// Per (source, communicator, `chan`) sequence number.
    pub seq: u32,
    /// Per (source, communicator, destination) sequence number over every channel, on
    /// communicators whose channels are tag partitions that may have to be ordered against
    /// each other later (the runtime's partitioned matching, switched to one order by the
    /// first `Tag::Any` receive); 0 elsewhere. Carried, never read, by the providers.
    pub gseq: u32,
    /// Ordering channel: frames of one (source, communicator) are matched in `seq` order
    /// within a channel; frames of different channels are logically concurrent (MPI: sends
    /// of distinct threads are unordered). The runtime uses the sender thread's dedicated
    /// CRI as its channel, so the sequence stays in order through that CRI's FIFO inbox.
    pub chan: u16,
    /// Payload length (eager) or message length (rendezvous).
    pub len: u64,
    /// Sender-side request handle for rendezvous (echoed by `Fin`).
    pub cookie: u64,
    /// Remote key of the sender's registered buffer (rendezvous).
    pub key: u64,
    /// Remote address of that buffer as the provider's RMA names it (`Rts` only; filled in
    /// by the provider when the frame is sent: the virtual address under libfabric's
    /// `FI_MR_VIRT_ADDR`, else 0). Senders leave it 0.
    pub addr: u64,
}

impl Header {
    /// The header of an eager frame of `len` bytes on `context`, from `source` with `tag`,
    /// `seq` in its channel 0; no rendezvous fields, no `gseq`.
    pub fn eager(context: u32, source: u32, tag: i32, seq: u32, len: usize) -> Header {
        Header {
            kind: FrameKind::Eager,
            src_cri: 0,
            context,
            source,
            tag,
            seq,
            gseq: 0,
            chan: 0,
            len: len as u64,
            cookie: 0,
            key: 0,
            addr: 0,
        }
    }
}

/// Bytes carried inside the frame itself, without a buffer.
pub const INLINE: usize = 32;

/// A frame's payload.
pub enum Payload {
    /// No bytes.
    Empty,
    /// Up to [`INLINE`] bytes stored in the frame.
    Inline {
        /// Valid length.
        len: u8,
        /// Storage.
        bytes: [u8; INLINE],
    },
    /// A pooled buffer; give it back with `recycle` once consumed.
    Pooled(Vec<u8>),
}

impl Payload {
    /// The payload bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Payload::Empty => &[],
            Payload::Inline { len, bytes } => &bytes[..*len as usize],
            Payload::Pooled(v) => v,
        }
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.as_slice().len())
    }
}

/// A received frame.
#[derive(Debug)]
pub struct Frame {
    /// Envelope.
    pub header: Header,
    /// Bytes (eager only).
    pub payload: Payload,
}

impl Frame {
    /// Appends to `frames` the frame that `write` writes in place, straight into the
    /// vector's spare capacity (no frame-sized move through the stack): what a provider's
    /// `poll_into` does with each frame it takes.
    ///
    /// # Safety
    /// `frames` has spare capacity for one more frame (the caller reserved it), and `write`
    /// initializes the whole frame at the pointer it is given.
    #[inline(always)]
    pub(crate) unsafe fn append_in_place(frames: &mut Vec<Frame>, write: impl FnOnce(*mut Frame)) {
        let len = frames.len();
        debug_assert!(len < frames.capacity(), "append_in_place without spare capacity");
        // SAFETY: slot `len` is spare capacity (contract); it is written before the length
        // counts it.
        unsafe {
            write(frames.as_mut_ptr().add(len));
            frames.set_len(len + 1);
        }
    }
}
