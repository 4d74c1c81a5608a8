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
    /// libfabric `shm` (one node; feature `ofi`), with the same-host lane: frames between
    /// ranks of one host go through weft's own shared-memory rings, libfabric carries the
    /// rest (RMA, and frames the lane is switched off for).
    Shm,
    /// libfabric's `shm` provider alone (`ofi-shm`): every frame through libfabric, no
    /// same-host lane — for comparison with `shm`.
    OfiShm,
    /// libfabric `tcp;ofi_rxm` (across nodes; feature `ofi`).
    Tcp,
}

impl Provider {
    /// The libfabric provider string, for the libfabric providers.
    pub fn ofi_name(self) -> Option<&'static str> {
        match self {
            Provider::Embedded => None,
            Provider::Shm | Provider::OfiShm => Some("shm"),
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
            "ofi-shm" => Ok(Provider::OfiShm),
            "tcp" | "tcp;ofi_rxm" => Ok(Provider::Tcp),
            _ => Err(Error::InvalidArgument("unknown provider (expected one of: embedded shm ofi-shm tcp)")),
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Provider::Embedded => "embedded",
            Provider::Shm => "shm",
            Provider::OfiShm => "ofi-shm",
            Provider::Tcp => "tcp",
        })
    }
}

/// How [`Transport::start_read`] left a rendezvous read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReadStart {
    /// The data is in place: the read is over.
    Done,
    /// Posted; [`Transport::poll_reads`] reports its end with its token.
    InFlight,
}

/// An atomic read-modify-write of a `u64` in a peer's window ([`Transport::fetch_op`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RmaOp {
    /// Add the operand.
    Sum,
    /// Read only (the operand is ignored).
    Read,
    /// Store the operand (swap).
    Swap,
    /// Bitwise or.
    BitOr,
    /// Bitwise and.
    BitAnd,
    /// Minimum (unsigned).
    Min,
    /// Maximum (unsigned).
    Max,
}

#[cfg(feature = "ofi")]
impl RmaOp {
    fn ofi(self) -> crate::ofi::FetchOp {
        use crate::ofi::FetchOp;
        match self {
            RmaOp::Sum => FetchOp::Sum,
            RmaOp::Read => FetchOp::Read,
            RmaOp::Swap => FetchOp::Swap,
            RmaOp::BitOr => FetchOp::BitOr,
            RmaOp::BitAnd => FetchOp::BitAnd,
            RmaOp::Min => FetchOp::Min,
            RmaOp::Max => FetchOp::Max,
        }
    }
}

/// What a peer needs to target a registered RMA window: send it to them in a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteWindow {
    /// The rank that registered it.
    pub rank: u32,
    /// Registration key.
    pub key: u64,
    /// Remote address of byte 0 (libfabric under `FI_MR_VIRT_ADDR`; 0 otherwise).
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
}

#[cfg(feature = "ofi")]
impl RemoteWindow {
    fn ofi(&self) -> crate::ofi_provider::RemoteMem {
        crate::ofi_provider::RemoteMem {
            rank: self.rank,
            region: crate::ofi::RemoteRegion { base: self.base, key: self.key, len: self.len },
        }
    }
}

/// One rank's transport: exactly the operations the runtime uses, dispatched statically.
///
/// Transport-level RMA (`register_window`, `put`, `get`, `fetch_op`, `compare_swap`,
/// `flush`) is posted on a CRI: on libfabric, `put`/`get` are non-blocking and counted on
/// the CRI's completion counter until `flush(cri)`; on the embedded provider every operation
/// is complete when it returns.
#[derive(Debug)]
pub enum Transport {
    /// The in-process provider.
    Embedded(embedded::EmbeddedRank),
    /// libfabric.
    #[cfg(feature = "ofi")]
    Ofi(crate::ofi_provider::OfiRank),
}

/// The rank's waiter role, held ([`Transport::take_waiter`]); given back when dropped.
#[derive(Debug)]
pub struct RankWaiter<'a> {
    #[cfg(feature = "ofi")]
    held: crate::ofi_provider::FdWaiter<'a>,
    /// Without libfabric there is none to hold.
    #[cfg(not(feature = "ofi"))]
    never: std::convert::Infallible,
    #[cfg(not(feature = "ofi"))]
    _rank: std::marker::PhantomData<&'a ()>,
}

impl RankWaiter<'_> {
    /// The waker that ends [`sleep`](Self::sleep): poll the listeners the sleep is to end
    /// for with it.
    #[inline]
    pub fn waker(&self) -> &std::task::Waker {
        #[cfg(feature = "ofi")]
        return self.held.waker();
        #[cfg(not(feature = "ofi"))]
        match self.never {}
    }

    /// Sleeps until the waker is woken, the network has something for the rank, or
    /// `timeout` passes. Returns `false` for the timeout alone; `true` means a progress pass
    /// may find work.
    #[inline]
    pub fn sleep(&self, timeout: std::time::Duration) -> bool {
        #[cfg(feature = "ofi")]
        return self.held.sleep(timeout);
        #[cfg(not(feature = "ofi"))]
        {
            let _ = timeout;
            match self.never {}
        }
    }
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
                if r.provider_name() != "shm" {
                    Provider::Tcp
                } else if r.same_host_lane() {
                    Provider::Shm
                } else {
                    Provider::OfiShm
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

    /// Per rank of the job, a key of the host it runs on (equal on ranks of one host), where
    /// the transport knows it: every embedded rank is in this process, so on one host;
    /// libfabric ranks know each other's hosts from the same-host lane's exchange
    /// (`OfiRank::host_keys`). `None` otherwise; the same on every rank of the job.
    pub fn host_keys(&self) -> Option<Vec<u64>> {
        match self {
            Transport::Embedded(t) => Some(vec![0; t.size() as usize]),
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.host_keys().map(<[u64]>::to_vec),
        }
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
    ///
    /// The header is borrowed, not moved: a header the caller just built is read where it
    /// lies, field by field. Moved, it is copied with 16-byte loads, each spanning fields
    /// written by narrower stores, which cannot take their values from the store buffer and
    /// wait until every older store has reached the cache (the previous frame's slot among
    /// them, whose line the receiving core holds).
    #[inline]
    pub fn send(&self, dst: u32, dst_cri: usize, header: &Header, data: &[u8]) -> Result<(), SendError> {
        dispatch!(self, t => t.send(dst, dst_cri, header, data))
    }

    /// Hands up to `max` received frames of CRI `cri` to `f`; returns how many. `f` runs
    /// while the CRI is held (its inbox's consumer role, or the libfabric CRI's state lock):
    /// it must not send or poll on this rank; collect the frames and handle them after.
    #[inline]
    pub fn poll(&self, cri: usize, max: usize, f: impl FnMut(Frame)) -> usize {
        dispatch!(self, t => t.poll(cri, max, f))
    }

    /// [`poll`](Self::poll) appending the frames to `frames` (each provider writes each
    /// frame straight into the vector).
    #[inline]
    pub fn poll_into(&self, cri: usize, max: usize, frames: &mut Vec<Frame>) -> usize {
        match self {
            Transport::Embedded(t) => t.poll_into(cri, max, frames),
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.poll_into(cri, max, frames),
        }
    }

    /// Whether CRI `cri` has frames waiting.
    #[inline]
    pub fn has_frames(&self, cri: usize) -> bool {
        dispatch!(self, t => t.has_frames(cri))
    }

    /// Whether [`has_frames`](Self::has_frames) costs what a [`poll`](Self::poll) that finds
    /// nothing costs: libfabric's answers by reading the CRI's completion queue under the
    /// CRI's state lock, which `poll` does anyway; the embedded inbox answers with one load.
    /// A caller about to poll a CRI it holds skips the check when this is `true` (one lock
    /// acquisition fewer per received frame).
    #[inline]
    pub fn check_costs_a_poll(&self) -> bool {
        match self {
            Transport::Embedded(_) => false,
            #[cfg(feature = "ofi")]
            Transport::Ofi(_) => true,
        }
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

    /// The rank's waiter role, where the provider has descriptors to sleep on (libfabric)
    /// and no other thread holds it: a thread about to park on the doorbell sleeps through
    /// it instead, woken by the network directly rather than by whoever rings the doorbell
    /// (on libfabric a watcher thread: a second hand-off). `None` on the embedded provider,
    /// whose senders ring the doorbell themselves.
    #[inline]
    pub fn take_waiter(&self) -> Option<RankWaiter<'_>> {
        match self {
            Transport::Embedded(_) => None,
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.take_waiter().map(|held| RankWaiter { held }),
        }
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

    /// Ends this rank's registration `key` of a window, whose own memory, if it has any, is
    /// `memory`. The embedded provider removes the key and frees the memory at once (a
    /// later access fails with `InvalidArgument`); libfabric keeps the registration with the
    /// memory, retired (within a bound, oldest out first), so that a peer's access racing
    /// with the end lands harmlessly rather than making the target's provider refuse the key
    /// (`ofi_provider`'s docs, *A window's end*). Memory the window borrowed (`None`) is
    /// deregistered at once.
    pub fn retire_window(&self, key: u64, memory: Option<Box<[u64]>>) {
        match self {
            Transport::Embedded(t) => {
                t.deregister(key);
                drop(memory);
            }
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.retire_window(key, memory),
        }
    }

    /// Starts the rendezvous read of the sender's buffer that the `Rts` header `h` names
    /// into the `len` bytes at `dst`, without waiting for it: [`ReadStart::Done`] if the
    /// data is in place already (the embedded provider copies at once), else
    /// [`ReadStart::InFlight`], and a later [`poll_reads`](Self::poll_reads) reports its end
    /// with `token`. An error here ends the read (nothing is in flight).
    ///
    /// A read may need the sender's own progress to be served (libfabric), so it is never
    /// waited for where that would hold up progress: the caller starts it and goes on.
    ///
    /// # Safety
    /// `dst..dst + len` must be valid for writes and neither read nor written by anyone else
    /// until the read is over (`Done` or an error returned here, or its token reported by
    /// `poll_reads`), or the transport is dropped; `token` must differ from that of every
    /// other read not yet reported.
    pub unsafe fn start_read(&self, h: &Header, dst: *mut u8, len: usize, token: u64) -> Result<ReadStart, Error> {
        match self {
            Transport::Embedded(t) => {
                let _ = token;
                if len == 0 {
                    return Ok(ReadStart::Done);
                }
                // SAFETY: the caller lends `len` writable bytes at `dst`, used by nobody else.
                let dst = unsafe { std::slice::from_raw_parts_mut(dst, len) };
                t.read(h.source, h.key, 0, dst).map(|()| ReadStart::Done)
            }
            #[cfg(feature = "ofi")]
            // SAFETY: forwarded contract.
            Transport::Ofi(t) => unsafe { t.start_read(h, dst, len, token) },
        }
    }

    /// Copies `data` straight to address `to` of rank `dst`, where this rank reaches that
    /// rank's memory directly: the embedded provider (every rank in this process) or
    /// libfabric's same-host lane (`process_vm_writev`). `None`: it does not, nothing was
    /// written (the caller sends the data as a message instead); `Some(Err(_))`: the copy
    /// failed part way (the peer is lost).
    ///
    /// # Safety
    /// `to..to + data.len()` must be memory rank `dst` lent for this write (in this process,
    /// on the embedded provider) and neither reads nor writes meanwhile.
    pub unsafe fn write_direct(&self, dst: u32, to: u64, data: &[u8]) -> Option<Result<(), Error>> {
        match self {
            Transport::Embedded(t) => {
                if !t.is_alive(dst) {
                    return None;
                }
                // SAFETY: forwarded contract: `to` is an address of this process, lent to us.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to as *mut u8, data.len()) };
                Some(Ok(()))
            }
            #[cfg(feature = "ofi")]
            // SAFETY: forwarded contract.
            Transport::Ofi(t) => unsafe { t.write_direct(dst, to, data) },
        }
    }

    /// Advances the rendezvous reads in flight (bounded work; never waits) and hands up to
    /// `max` of those that are over to `f`: the token given to
    /// [`start_read`](Self::start_read), and `Ok` or the error (`PeerLost` when the peer
    /// is lost). `f` runs after the transport's locks are released. Returns how many; one
    /// atomic load when no read is in flight (the embedded provider: none ever is).
    #[inline]
    pub fn poll_reads(&self, max: usize, f: impl FnMut(u64, Result<(), Error>)) -> usize {
        match self {
            Transport::Embedded(_) => {
                let _ = (max, f);
                0
            }
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.poll_reads(max, f),
        }
    }

    /// Registers `len` bytes at `ptr` as an RMA window peers may read, write and update
    /// atomically.
    ///
    /// # Safety
    /// The memory must stay valid until [`deregister`](Self::deregister) with the returned
    /// key, and the owner must not hold Rust references into it while peers may write it.
    pub unsafe fn register_window(&self, ptr: *mut u8, len: usize) -> Result<RemoteWindow, Error> {
        let rank = self.rank();
        match self {
            Transport::Embedded(t) => {
                // SAFETY: forwarded contract.
                let key = unsafe { t.register_window(ptr, len) };
                Ok(RemoteWindow { rank, key, base: 0, len: len as u64 })
            }
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => {
                // SAFETY: forwarded contract.
                let r = unsafe { t.register_window(ptr, len) }?;
                Ok(RemoteWindow { rank, key: r.key, base: r.base, len: r.len })
            }
        }
    }

    /// RMA write of `data` to `offset` of window `to`, from CRI `cri`.
    ///
    /// # Safety
    /// `data` must stay valid and unmodified until `flush(cri)` returned.
    pub unsafe fn put(&self, cri: usize, to: &RemoteWindow, offset: usize, data: &[u8]) -> Result<(), Error> {
        match self {
            Transport::Embedded(t) => {
                let _ = cri;
                t.put(to.rank, to.key, offset, data)
            }
            #[cfg(feature = "ofi")]
            // SAFETY: forwarded contract.
            Transport::Ofi(t) => unsafe { t.put(cri, &to.ofi(), offset as u64, data) },
        }
    }

    /// RMA read into `out` from `offset` of window `from`, on CRI `cri`.
    ///
    /// # Safety
    /// `out` must stay valid and untouched until `flush(cri)` returned.
    pub unsafe fn get(&self, cri: usize, from: &RemoteWindow, offset: usize, out: &mut [u8]) -> Result<(), Error> {
        match self {
            Transport::Embedded(t) => {
                let _ = cri;
                t.read(from.rank, from.key, offset, out)
            }
            #[cfg(feature = "ofi")]
            // SAFETY: forwarded contract.
            Transport::Ofi(t) => unsafe { t.get(cri, &from.ofi(), offset as u64, out) },
        }
    }

    /// Makes every CRI of this rank reach the one-sided target of each rank of `ranks`
    /// (libfabric: `OfiRank::reach_rma_targets`); nothing on the embedded provider. For
    /// window creation, where every rank progresses.
    pub fn reach_rma_targets(&self, ranks: &[u32]) -> Result<(), Error> {
        match self {
            Transport::Embedded(_) => {
                let _ = ranks;
                Ok(())
            }
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.reach_rma_targets(ranks),
        }
    }

    /// Atomic `op` on the `u64` at `offset` of window `at`; returns the old value. Blocking.
    pub fn fetch_op(&self, cri: usize, at: &RemoteWindow, offset: usize, op: RmaOp, operand: u64) -> Result<u64, Error> {
        match self {
            Transport::Embedded(t) => {
                let _ = cri;
                t.fetch_op(at.rank, at.key, offset, op, operand)
            }
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.fetch_op(cri, &at.ofi(), offset as u64, op.ofi(), operand),
        }
    }

    /// Atomic compare-and-swap on the `u64` at `offset` of window `at`; returns the old
    /// value (the swap happened if it equals `compare`). Blocking.
    pub fn compare_swap(&self, cri: usize, at: &RemoteWindow, offset: usize, compare: u64, swap: u64) -> Result<u64, Error> {
        match self {
            Transport::Embedded(t) => {
                let _ = cri;
                t.compare_swap(at.rank, at.key, offset, compare, swap)
            }
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.compare_swap(cri, &at.ofi(), offset as u64, compare, swap),
        }
    }

    /// The signal notified after an RMA operation wrote the word at `offset` of window
    /// `at` (the embedded provider: the writer notifies it, [`embedded::EmbeddedRank::watch`]);
    /// `None` on libfabric, where a write to this rank's memory raises no event here, and a
    /// waiter polls.
    pub fn watch(&self, at: &RemoteWindow, offset: usize) -> Option<&weft_sync::Signal> {
        match self {
            Transport::Embedded(t) => t.watch(at.rank, at.key, offset),
            #[cfg(feature = "ofi")]
            Transport::Ofi(_) => {
                let _ = (at, offset);
                None
            }
        }
    }

    /// Waits until every `put`/`get` posted on CRI `cri` has completed.
    pub fn flush(&self, cri: usize) -> Result<(), Error> {
        match self {
            Transport::Embedded(_) => {
                let _ = cri;
                Ok(())
            }
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.flush(cri),
        }
    }

    /// Whether CRI `cri` refuses one-sided operations for good: on libfabric's `shm`, once
    /// operations of it to a lost rank were given up (`ofi_provider`, *A one-sided
    /// operation to a lost rank*); never on the embedded provider.
    pub fn rma_blocked(&self, cri: usize) -> bool {
        match self {
            Transport::Embedded(_) => {
                let _ = cri;
                false
            }
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.rma_blocked(cri),
        }
    }

    /// The ranks on this rank's host as the launcher told them (PMIx's `PMIX_LOCAL_PEERS`),
    /// ascending, this one included; `None` where it did not (in-process worlds, `weftrun`,
    /// Slurm without PMIx).
    pub fn host_ranks(&self) -> Option<&[u32]> {
        match self {
            Transport::Embedded(_) => None,
            #[cfg(feature = "ofi")]
            Transport::Ofi(t) => t.host_ranks(),
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
        embedded::EmbeddedRank::control_header(kind, src_cri, source, cookie)
    }
}
