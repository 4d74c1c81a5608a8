//! [`Transport`]: the provider a runtime holds, as a static-dispatch enum (no virtual call on
//! the message path), and [`Provider`], the name that selects one.

use std::fmt;
use std::str::FromStr;

use crate::doorbell::Doorbell;
use crate::embedded;
use crate::frame::{Frame, Header, Payload};
use crate::{Error, SendError};

/// Which provider moves a runtime's frames (`WEFT_PROVIDER`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Provider {
    /// Every rank in this process (`build_local`); the default.
    #[default]
    Embedded,
    /// libfabric `shm` (one node; feature `ofi`).
    Shm,
    /// libfabric `tcp;ofi_rxm` (across nodes; feature `ofi`).
    Tcp,
}

impl Provider {
    /// The libfabric provider string, for the libfabric providers.
    pub fn ofi_name(self) -> Option<&'static str> {
        match self {
            Provider::Embedded => None,
            Provider::Shm => Some("shm"),
            Provider::Tcp => Some("tcp;ofi_rxm"),
        }
    }

    /// Whether this build can open the provider: libfabric ones need the `ofi` feature.
    pub fn check_available(self) -> Result<(), Error> {
        if self == Provider::Embedded || cfg!(feature = "ofi") {
            Ok(())
        } else {
            Err(Error::InvalidArgument("providers shm and tcp need weft built with the `ofi` cargo feature"))
        }
    }
}

impl FromStr for Provider {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim().to_ascii_lowercase().as_str() {
            "embedded" => Ok(Provider::Embedded),
            "shm" => Ok(Provider::Shm),
            "tcp" | "tcp;ofi_rxm" => Ok(Provider::Tcp),
            _ => Err(Error::InvalidArgument("unknown provider (expected one of: embedded shm tcp)")),
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Provider::Embedded => "embedded",
            Provider::Shm => "shm",
            Provider::Tcp => "tcp",
        })
    }
}

/// One rank's transport: exactly the operations the runtime uses, dispatched statically.
#[derive(Debug)]
pub enum Transport {
    /// The in-process provider.
    Embedded(embedded::Endpoint),
    /// libfabric.
    #[cfg(feature = "ofi")]
    Ofi(crate::ofi_provider::Rank),
}

macro_rules! dispatch {
    ($self:expr, $t:ident => $e:expr) => {
        match $self {
            Transport::Embedded($t) => $e,
            #[cfg(feature = "ofi")]
            Transport::Ofi($t) => $e,
        }
    };
}

impl Transport {
    /// Which provider this is.
    pub fn provider(&self) -> Provider {
        match self {
            Transport::Embedded(_) => Provider::Embedded,
            #[cfg(feature = "ofi")]
            Transport::Ofi(r) => {
                if r.provider_name() == "shm" {
                    Provider::Shm
                } else {
                    Provider::Tcp
                }
            }
        }
    }

    /// This rank.
    #[inline]
    pub fn rank(&self) -> u32 {
        dispatch!(self, t => t.rank())
    }

    /// Number of ranks.
    #[inline]
    pub fn size(&self) -> u32 {
        dispatch!(self, t => t.size())
    }

    /// CRIs of every rank.
    #[inline]
    pub fn num_cris(&self) -> usize {
        dispatch!(self, t => t.num_cris())
    }

    /// Largest eager payload.
    #[inline]
    pub fn eager_capacity(&self) -> usize {
        dispatch!(self, t => t.eager_capacity())
    }

    /// Sends one frame to CRI `dst_cri` of `dst` (see the providers); the payload is copied.
    #[inline]
    pub fn send(&self, dst: u32, dst_cri: usize, header: Header, data: &[u8]) -> Result<(), SendError> {
        dispatch!(self, t => t.send(dst, dst_cri, header, data))
    }

    /// Hands up to `max` received frames of CRI `cri` to `f`; returns how many.
    #[inline]
    pub fn poll(&self, cri: usize, max: usize, f: impl FnMut(Frame)) -> usize {
        dispatch!(self, t => t.poll(cri, max, f))
    }

    /// Whether CRI `cri` has frames waiting.
    #[inline]
    pub fn has_frames(&self, cri: usize) -> bool {
        dispatch!(self, t => t.has_frames(cri))
    }

    /// Whether a progress thread should keep polling instead of parking: frames are waiting
    /// (ofi: or traffic flowed in the last few milliseconds).
    #[inline]
    pub fn any_frames(&self) -> bool {
        dispatch!(self, t => t.any_frames())
    }

    /// Gives a consumed payload back (to the pool of `source`, the rank that sent it, on the
    /// embedded provider; to this rank's pool on libfabric).
    #[inline]
    pub fn recycle(&self, source: u32, payload: Payload) {
        match self {
            Transport::Embedded(t) => t.recycle(source, payload),
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.recycle(payload),
        }
    }

    /// Rung on network activity while threads may be parked.
    #[inline]
    pub fn doorbell(&self) -> &Doorbell {
        dispatch!(self, t => t.doorbell())
    }

    /// Registers `len` bytes at `ptr` for a rendezvous; returns the key to put in the `Rts`.
    ///
    /// # Safety
    /// The memory must stay valid and unmodified until [`deregister`](Self::deregister).
    pub unsafe fn register(&self, ptr: *const u8, len: usize) -> Result<u64, Error> {
        match self {
            // SAFETY: forwarded contract.
            Transport::Embedded(t) => Ok(unsafe { t.register(ptr, len) }),
            #[cfg(feature = "ofi")]
            // SAFETY: forwarded contract.
            Transport::Ofi(t) => unsafe { t.register(ptr, len) },
        }
    }

    /// Removes a registration.
    pub fn deregister(&self, key: u64) {
        dispatch!(self, t => t.deregister(key))
    }

    /// Rendezvous read: fills `dst` from the sender's buffer that the `Rts` header `h` names.
    pub fn read(&self, h: &Header, dst: &mut [u8]) -> Result<(), Error> {
        match self {
            Transport::Embedded(t) => t.read(h.source, h.key, 0, dst),
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.read(h, dst),
        }
    }

    /// Whether rank `r` is not known to be lost.
    #[inline]
    pub fn is_alive(&self, r: u32) -> bool {
        dispatch!(self, t => t.is_alive(r))
    }

    /// Changes whenever a peer is newly lost (the runtime then fails requests needing it).
    #[inline]
    pub fn lost_epoch(&self) -> u64 {
        match self {
            Transport::Embedded(t) => t.lost_epoch(),
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.lost_epoch(),
        }
    }

    /// Closes this rank's side.
    pub fn close(&self) {
        dispatch!(self, t => t.close())
    }

    /// The header of a frame with no payload, for protocol replies.
    pub fn control_header(kind: crate::FrameKind, src_cri: u16, source: u32, cookie: u64) -> Header {
        embedded::Endpoint::control_header(kind, src_cri, source, cookie)
    }
}
