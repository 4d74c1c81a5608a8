//! The same-host lane: small frames between ranks of one host through rings in shared
//! memory, beside libfabric (the parent module's *Same-host lane*).
//!
//! Every MPI library has such a path (Open MPI's `vader` FIFOs and fast boxes, MPICH's
//! POSIX shared-memory queues): a frame between two processes of one host is a store into
//! memory the receiver polls, with no provider, no completion queue and no system call on
//! the way. libfabric 1.17's `shm` provider gives a 0-byte frame a command queue entry, a
//! lock and a completion; here it is one slot of a ring.
//!
//! # Segments
//!
//! Each rank creates one anonymous segment (`memfd_create`, never a name in `/dev/shm`, so
//! nothing is left behind by a process that dies) holding its *inboxes*: for each of its
//! `k` CRIs, one ring per rank of the job, written only by that rank (and read by this
//! one). The segment is sized for every rank but sparse: a ring nobody writes costs no
//! memory, because a zero-filled slot is a valid free slot (see *Stamps*); the first frame
//! into a ring of small frames brings in all its pages at once ([`populate`]). A peer maps it by
//! taking the file descriptor out of the owner's process (`pidfd_open` + `pidfd_getfd`, the
//! same permission check as `process_vm_readv`, which libfabric's `shm` already needs for
//! its single-copy reads) and checks the segment's random nonce against the one the owner
//! published; any failure leaves that peer on libfabric. Ranks decide they share a host by
//! the kernel's boot id and host name (published beside the endpoint names).
//!
//! One ring per (receiving CRI, sending rank) keeps a process that dies in the middle of a
//! push from blocking anyone but itself: the slot it claimed but never published stops only
//! its own ring (it will send nothing more anyway).
//!
//! # Rings
//!
//! A ring is Vyukov's bounded queue, as the embedded provider's inbox (`ring.rs`), laid out
//! in the segment: a `tail` producers claim positions with (the threads of the one sending
//! process), then `n` slots of a fixed size. The consumer's `head` is not shared: only the
//! receiving process reads a ring, under its CRI's state lock, so it lives there.
//!
//! Each (CRI, sender) has two rings: [`SMALL`] slots of 512 bytes, for protocol frames and
//! small messages (a 0-byte message uses the first line of its slot), and [`BIG_SLOTS`]
//! slots that hold the largest eager frame (up to [`BIG_FRAME_LIMIT`]), so that every eager
//! message between ranks of a host takes the lane with one copy in and one out, and only a
//! few of the large slots stand per sender. A sender's frames in the two rings are not
//! ordered against each other (the runtime's sequence numbers order them).
//!
//! # Stamps
//!
//! A slot's stamp, less the slot's index, is stored: for position `p = i + L * n`, `L * n`
//! means free for the producer of `p`, `L * n + 1` written for the consumer at `p`. Zero,
//! what a fresh segment holds, is "free for lap 0". A producer at tail `t` finding
//! `stored + i + n == t + 1` sees last lap's frame unread: the ring is full, and the send is
//! refused like a full libfabric queue (`SendError::WouldBlock`).
//!
//! # Waking the receiver
//!
//! A rank has two `eventfd`s, both published: its watcher's, and its *waiter*'s (the one
//! parked thread that blocks on the rank's wake-up descriptors itself, the parent module's
//! *Polling, staging and parking*). Before either sleeps it says so in `asleep` in its
//! segment ([`ASLEEP_WATCHER`] or [`ASLEEP_WAITER`]) and looks at its rings once more; a
//! sender that pushed a frame and finds `asleep` set (a `SeqCst` fence between its push and
//! that load, one between the sleeper's store and its look) takes it back to
//! [`AWAKE`] and writes the `eventfd` it names. While the rank is busy nobody sleeps, and a
//! send costs no system call.
//!
//! | `asleep` | set by | taken back by |
//! |---|---|---|
//! | [`AWAKE`] | | |
//! | [`ASLEEP_WATCHER`] | the watcher, from [`AWAKE`] only (a waiter sleeping is not displaced) | a sender, or the watcher after its sleep (from [`ASLEEP_WATCHER`] only) |
//! | [`ASLEEP_WAITER`] | the waiter, from either (it displaces a sleeping watcher, which it wakes when it leaves) | a sender, or the waiter after its sleep (from [`ASLEEP_WAITER`] only) |
//!
//! So the wake-up goes to the thread that is to run next: a frame for a rank whose thread
//! is parked in a wait wakes that thread, with no watcher in between.
//!
//! The fence between a push and the load of `asleep` is the costly half of the handshake:
//! the push's stores miss (the receiver's core holds the slot's line), and a full fence
//! waits for them, so every frame would stall its sender for a round trip between cores.
//! Where the kernel has `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, the handshake is
//! asymmetric instead, as `membarrier(2)` describes: every rank registers its process, and
//! a sleeper, after its store to `asleep`, has the kernel run a full barrier on every CPU
//! that runs a thread of a registered process before it looks at its rings; a sender then
//! needs only a compiler fence between its push and its load of `asleep` (its CPU's barrier,
//! if it is running, comes from the sleeper's call; if it is not, its stores have drained).
//! A segment says in its header ([`SLEEPER_BARRIER`]) whether its owner's sleepers do so; a
//! sender keeps the full fence towards a rank that does not, and where its own process could
//! not register. Where every rank that writes a rank's rings runs in the rank's own process
//! (ranks in one process on `shm`), its sleepers ask for `MEMBARRIER_CMD_PRIVATE_EXPEDITED`
//! instead, where the process registered for it: a barrier on the CPUs of that process
//! alone, which are all the senders' ([`SleeperBarrier`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{compiler_fence, fence, AtomicU32, AtomicU64, Ordering};

use crate::membarrier;

/// The size of a ring's slots and how many it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Class {
    /// Slots (a power of two): frames a sender may have in flight to one CRI in this ring
    /// before it is pushed back.
    pub slots: usize,
    /// Bytes of a slot: the stamp, the frame's length, then the frame (wire header and
    /// payload); a multiple of 64.
    pub slot_bytes: usize,
}

impl Class {
    /// The largest frame a slot holds.
    #[inline]
    pub(super) const fn max_frame(self) -> usize {
        self.slot_bytes - SLOT_DATA
    }

    #[inline]
    const fn ring_bytes(self) -> usize {
        RING_HEADER + self.slots * self.slot_bytes
    }
}

/// The ring of small frames.
pub(super) const SMALL: Class = Class { slots: 128, slot_bytes: 512 };

/// Slots of the ring of large frames.
pub(super) const BIG_SLOTS: usize = 8;

/// The largest frame the ring of large frames takes (a larger eager threshold leaves the
/// frames above this on libfabric): 64 KiB of payload and a wire header.
pub(super) const BIG_FRAME_LIMIT: usize = (64 << 10) + 64;

/// Where a slot's frame bytes begin.
const SLOT_DATA: usize = 16;

/// Bytes in front of a ring's slots: the producers' `tail`, on a line of its own.
const RING_HEADER: usize = 128;

/// Bytes in front of the rings: magic, nonce, `asleep`, [`SLEEPER_BARRIER`].
const SEGMENT_HEADER: usize = 128;

/// `asleep`: nobody of the rank sleeps on the lane (module docs, *Waking the receiver*).
pub(super) const AWAKE: u32 = 0;
/// `asleep`: the watcher sleeps on its `eventfd`.
pub(super) const ASLEEP_WATCHER: u32 = 1;
/// `asleep`: the rank's waiter sleeps on its `eventfd`.
pub(super) const ASLEEP_WAITER: u32 = 2;

/// A segment header's `u32` at this offset: 1 if the owner's sleepers issue
/// `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)` before their last look (module docs,
/// *Waking the receiver*), so that senders of registered processes need no fence.
const SLEEPER_BARRIER: usize = 20;

/// The first word of a segment.
const MAGIC: u64 = u64::from_le_bytes(*b"weftlan1");

/// Largest segment a rank creates (virtual size; untouched rings cost no memory): a job
/// whose rings would need more keeps every frame on libfabric.
const MAX_SEGMENT: usize = 1 << 32;

/// A shared mapping, unmapped when dropped.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics and through
// slots handed over by the stamp protocol.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` shared, read-write.
    fn map(fd: RawFd, len: usize) -> Option<Mapping> {
        // SAFETY: a fresh shared mapping of an fd we hold; checked for failure below.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
        if p == libc::MAP_FAILED {
            return None;
        }
        NonNull::new(p.cast()).map(|ptr| Mapping { ptr, len })
    }

    #[inline]
    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.len && off % 8 == 0);
        // SAFETY: in bounds and 8-aligned (the mapping is page-aligned); the memory lives as
        // long as `self`, and every access to it is atomic or handed over by a stamp.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    #[inline]
    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off + 4 <= self.len && off % 4 == 0);
        // SAFETY: as in `u64_at`.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; no reference into it outlives
        // `self` (they borrow it).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The geometry every rank of a job shares (same CRI count, size and eager threshold).
#[derive(Clone, Copy, Debug)]
struct Layout {
    cris: usize,
    ranks: usize,
    big: Class,
    /// The largest frame the big ring takes (its slots may hold a little more).
    big_frame: usize,
    /// Bytes of a (CRI, sender)'s two rings.
    pair_bytes: usize,
}

impl Layout {
    /// For frames of up to `max_frame` bytes.
    fn new(cris: usize, ranks: usize, max_frame: usize) -> Layout {
        let frame = max_frame.clamp(SMALL.max_frame(), BIG_FRAME_LIMIT);
        let big = Class { slots: BIG_SLOTS, slot_bytes: (SLOT_DATA + frame).next_multiple_of(64) };
        Layout { cris, ranks, big, big_frame: frame, pair_bytes: SMALL.ring_bytes() + big.ring_bytes() }
    }

    fn len(self) -> Option<usize> {
        self.cris.checked_mul(self.ranks)?.checked_mul(self.pair_bytes)?.checked_add(SEGMENT_HEADER).filter(|&n| n <= MAX_SEGMENT)
    }

    /// The ring of `class` CRI `cri` of the segment's owner reads frames of `from` from:
    /// its offset.
    #[inline]
    fn ring(self, cri: usize, from: u32, big: bool) -> usize {
        SEGMENT_HEADER + (cri * self.ranks + from as usize) * self.pair_bytes + if big { SMALL.ring_bytes() } else { 0 }
    }

    #[inline]
    fn class(self, big: bool) -> Class {
        if big {
            self.big
        } else {
            SMALL
        }
    }
}

/// What a rank publishes about its segment (appended to its endpoint names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Published {
    /// Boot id and host name, hashed: equal on ranks of one host.
    pub host: u64,
    /// The owner's process id.
    pub pid: u32,
    /// The segment's descriptor in the owner's process.
    pub memfd: i32,
    /// The owner's watcher `eventfd` in the owner's process.
    pub eventfd: i32,
    /// The owner's waiter `eventfd` in the owner's process.
    pub waiter_eventfd: i32,
    /// Random; also in the segment, to tell it apart from any other descriptor.
    pub nonce: u64,
}

/// Bytes of [`Published`] on the wire (`encode`), after a `u8` saying whether there is one.
pub(super) const PUBLISHED_BYTES: usize = 8 + 4 + 4 + 4 + 4 + 8;

impl Published {
    pub(super) fn encode(this: Option<&Published>, out: &mut Vec<u8>) {
        match this {
            None => out.push(0),
            Some(p) => {
                out.push(1);
                out.extend_from_slice(&p.host.to_le_bytes());
                out.extend_from_slice(&p.pid.to_le_bytes());
                out.extend_from_slice(&p.memfd.to_le_bytes());
                out.extend_from_slice(&p.eventfd.to_le_bytes());
                out.extend_from_slice(&p.waiter_eventfd.to_le_bytes());
                out.extend_from_slice(&p.nonce.to_le_bytes());
            }
        }
    }

    /// Reads what `encode` wrote at the start of `b`; returns it and the bytes used.
    pub(super) fn decode(b: &[u8]) -> Option<(Option<Published>, usize)> {
        match *b.first()? {
            0 => Some((None, 1)),
            1 => {
                let b = b.get(1..1 + PUBLISHED_BYTES)?;
                let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
                let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap_or_default());
                let p = Published {
                    host: u64_at(0),
                    pid: u32_at(8),
                    memfd: u32_at(12) as i32,
                    eventfd: u32_at(16) as i32,
                    waiter_eventfd: u32_at(20) as i32,
                    nonce: u64_at(24),
                };
                Some((Some(p), 1 + PUBLISHED_BYTES))
            }
            _ => None,
        }
    }
}

/// This host's identity: FNV-1a over the kernel's boot id and the host name (ranks with the
/// same boot id share a kernel, and so the memory a segment lives in).
fn host_key() -> Option<u64> {
    let boot = std::fs::read("/proc/sys/kernel/random/boot_id").ok()?;
    let name = std::fs::read("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in boot.iter().chain([0u8].iter()).chain(name.iter()) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    Some(h)
}

fn random_u64() -> u64 {
    let mut v = 0u64;
    // SAFETY: writes at most 8 bytes into `v`.
    let n = unsafe { libc::getrandom((&mut v as *mut u64).cast(), 8, 0) };
    if n == 8 {
        v
    } else {
        // Uniqueness, not secrecy, is what the nonce is for.
        u64::from(std::process::id()).rotate_left(32)
            ^ (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64))
    }
}

/// A duplicate of this process's descriptor `fd`.
pub(super) fn dup(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: duplicates a descriptor of this process; the result is checked.
    owned(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) })
}

/// The system's page size.
fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: `sysconf` has no preconditions.
    *PAGE.get_or_init(|| usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok().filter(|p| p.is_power_of_two()).unwrap_or(4096))
}

/// A fresh non-blocking `eventfd`.
pub(super) fn new_eventfd() -> Option<OwnedFd> {
    // SAFETY: a plain system call; the result is checked.
    owned(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })
}

/// Takes what `fd` (a non-blocking `eventfd` of ours) counted, if anything.
pub(super) fn drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reads at most 8 bytes into `v` from a non-blocking eventfd we hold.
    let _ = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

fn owned(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: `fd` was just returned to us by the kernel and is owned by nobody else.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The descriptor `fd` of process `pid`, duplicated into this one (`pidfd_getfd`; a plain
/// `dup` for this process's own, as for ranks in one process).
fn fd_of(pid: u32, fd: i32) -> Option<OwnedFd> {
    if pid == std::process::id() {
        return dup(fd);
    }
    // SAFETY: plain system calls with integer arguments; results are checked.
    let pidfd = owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) } as RawFd)?;
    // SAFETY: as above.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd() as libc::c_long, fd as libc::c_long, 0 as libc::c_long) } as RawFd)
}

/// Adds one to the eventfd `fd`. A failure (the peer is gone) loses nothing: its watcher
/// wakes on a timer too.
pub(super) fn write_one(fd: RawFd) {
    let one = 1u64;
    // SAFETY: writes 8 bytes from `one` to an eventfd we hold.
    let _ = unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// A peer's segment, mapped: where this rank pushes its frames to that peer.
pub(super) struct Peer {
    seg: Mapping,
    /// The peer's watcher `eventfd`.
    wake: OwnedFd,
    /// The peer's waiter `eventfd`.
    wake_waiter: OwnedFd,
    /// Its process.
    pid: u32,
    /// Whether a push needs no fence before its load of `asleep`: the peer's sleepers issue
    /// `membarrier` and this process is registered for it (module docs, *Waking the
    /// receiver*).
    fenceless: bool,
}

/// This rank's side of the lane: its segment and the peers it reaches through theirs.
pub(super) struct Lane {
    layout: Layout,
    /// This rank.
    rank: u32,
    seg: Mapping,
    /// Kept open for the rank's life: peers take it out of this process when they connect.
    _memfd: OwnedFd,
    /// The watcher sleeps on it.
    eventfd: OwnedFd,
    /// The rank's waiter sleeps on it.
    waiter_eventfd: OwnedFd,
    /// Per rank: its segment, for ranks of this host that could be mapped.
    peers: Box<[Option<Peer>]>,
    /// Per CRI: the ranks whose rings it reads (this host's, as mapped by them).
    readers: Box<[Box<[u32]>]>,
    /// What this rank's sleepers run before their last look (whether they run a barrier is
    /// published in the segment's header, [`SLEEPER_BARRIER`]).
    barrier: SleeperBarrier,
}

/// The barrier a rank's sleepers run between their store to `asleep` and their last look
/// at the rings, beside their own full fence (module docs, *Waking the receiver*).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SleeperBarrier {
    /// None: the process could not register, and senders fence.
    Fence,
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`: every rank that writes this rank's rings runs in
    /// this process, so the CPUs running its threads are all the senders' there may be.
    Private,
    /// `MEMBARRIER_CMD_GLOBAL_EXPEDITED`: senders in other processes.
    Global,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let peers = self.peers.iter().filter(|p| p.is_some()).count();
        f.debug_struct("Lane").field("rank", &self.rank).field("peers", &peers).finish_non_exhaustive()
    }
}

/// A segment created but not yet connected to the peers (`Opened`).
pub(super) struct Prepared {
    layout: Layout,
    seg: Mapping,
    memfd: OwnedFd,
    eventfd: OwnedFd,
    waiter_eventfd: OwnedFd,
    published: Published,
    /// Whether this process is registered for, and this rank's sleepers issue,
    /// `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`.
    barrier: bool,
}

impl Prepared {
    /// Creates this rank's segment for a job of `ranks` ranks with `cris` CRIs each and
    /// frames of up to `max_frame` bytes (bounded by [`BIG_FRAME_LIMIT`]); `None` where the
    /// system refuses (no memfd, too large a job), which leaves every frame on libfabric.
    pub(super) fn create(cris: usize, ranks: u32, max_frame: usize) -> Option<Prepared> {
        let layout = Layout::new(cris, ranks as usize, max_frame);
        let len = layout.len()?;
        // SAFETY: a NUL-terminated name; the result is checked.
        let memfd = owned(unsafe { libc::memfd_create(c"weft-lane".as_ptr(), libc::MFD_CLOEXEC) })?;
        // SAFETY: sizes the file we own (sparse: no memory until written).
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) } != 0 {
            return None;
        }
        let eventfd = new_eventfd()?;
        let waiter_eventfd = new_eventfd()?;
        let seg = Mapping::map(memfd.as_raw_fd(), len)?;
        let nonce = random_u64();
        seg.u64_at(8).store(nonce, Ordering::Relaxed);
        let barrier = membarrier::global_registered();
        seg.u32_at(SLEEPER_BARRIER).store(u32::from(barrier), Ordering::Relaxed);
        seg.u64_at(0).store(MAGIC, Ordering::Release);
        let published = Published {
            host: host_key()?,
            pid: std::process::id(),
            memfd: memfd.as_raw_fd(),
            eventfd: eventfd.as_raw_fd(),
            waiter_eventfd: waiter_eventfd.as_raw_fd(),
            nonce,
        };
        Some(Prepared { layout, seg, memfd, eventfd, waiter_eventfd, published, barrier })
    }

    pub(super) fn published(&self) -> &Published {
        &self.published
    }

    /// Maps the segments of the ranks of this host (`published[r]`, what rank `r`
    /// published, `None` for a rank without a lane). A rank is of this host if its published
    /// host identity is this one's and, where the launcher said which ranks share this host
    /// (`host_ranks`, PMIx's `PMIX_LOCAL_PEERS`), it is one of them.
    pub(super) fn connect(self, rank: u32, published: &[Option<Published>], host_ranks: Option<&[u32]>) -> Lane {
        let len = self.layout.len().unwrap_or(0);
        let here = |r: usize| {
            published[r].filter(|p| p.host == self.published.host && host_ranks.map_or(true, |h| h.binary_search(&(r as u32)).is_ok()))
        };
        let peers: Box<[Option<Peer>]> = (0..published.len())
            .map(|r| {
                let p = here(r)?;
                let fd = fd_of(p.pid, p.memfd)?;
                // SAFETY: `st` is a valid out-pointer for `fstat`.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: as above; a descriptor shorter than the layout is not the segment
                // (mapping past its end would fault on access).
                if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || (st.st_size as u64) < len as u64 {
                    return None;
                }
                let seg = Mapping::map(fd.as_raw_fd(), len)?;
                if seg.u64_at(0).load(Ordering::Acquire) != MAGIC || seg.u64_at(8).load(Ordering::Relaxed) != p.nonce {
                    return None;
                }
                // No fence after a push where the peer's sleepers have this process's CPUs
                // run one for it (module docs, *Waking the receiver*).
                let fenceless = self.barrier && seg.u32_at(SLEEPER_BARRIER).load(Ordering::Relaxed) == 1;
                Some(Peer { seg, wake: fd_of(p.pid, p.eventfd)?, wake_waiter: fd_of(p.pid, p.waiter_eventfd)?, pid: p.pid, fenceless })
            })
            .collect();
        // Every rank of this host with a lane may write this rank's rings (whether this rank
        // could map its segment or not: the permission checks need not agree both ways), so
        // all their rings are read; one that nobody writes costs a load per poll.
        let mine: Box<[u32]> = (0..published.len() as u32).filter(|&r| here(r as usize).is_some()).collect();
        let readers = (0..self.layout.cris).map(|_| mine.clone()).collect();
        // Ranks of other processes share this host's cores: the process's waiters spin only
        // while the machine has a core to spare, and not at first where the host has fewer
        // CPUs than ranks (`IdleBackoff::share_cores`).
        let one_process = mine.iter().all(|&r| published[r as usize].is_some_and(|p| p.pid == std::process::id()));
        if !one_process {
            weft_sync::IdleBackoff::share_cores(mine.len());
        }
        // The segment's header says the sleepers run a barrier wherever this process
        // registered for the global one; with every writer in this process, the private one
        // covers them all, and interrupts no CPU of another process.
        let barrier = match (self.barrier, one_process && membarrier::private_registered()) {
            (false, _) => SleeperBarrier::Fence,
            (true, true) => SleeperBarrier::Private,
            (true, false) => SleeperBarrier::Global,
        };
        Lane {
            layout: self.layout,
            rank,
            seg: self.seg,
            _memfd: self.memfd,
            eventfd: self.eventfd,
            waiter_eventfd: self.waiter_eventfd,
            peers,
            readers,
            barrier,
        }
    }
}

/// Faults in every page of the ring of small frames at `at` in `seg` at once
/// (`MADV_POPULATE_WRITE`), at its first frame: the segment is sparse, so each page of a
/// ring would otherwise cost page faults of its own the first time a frame reaches it (the
/// sender's, which allocates it, then the receiver's). A ring of small frames is 16 pages:
/// between two ranks exchanging a rendezvous of 64 KiB a round (two small frames each way),
/// every fourth round of the first 64 paid those faults, 10-25 µs on a KVM guest where a
/// round takes 8-10. A ring of large frames (half a megabyte, of which a small payload
/// touches a page a slot) faults page by page. The pages are the ring's anyway once it has
/// gone round once; those of rings no frame ever reaches stay unallocated. Where the kernel
/// lacks the advice (before Linux 5.14) the call fails and the pages fault in as before.
/// Out of line: the claim it follows is on every send's path.
#[cold]
#[inline(never)]
fn populate(seg: &Mapping, at: usize, class: Class) {
    if class != SMALL {
        return;
    }
    let page = page_size();
    let start = (at + RING_HEADER) & !(page - 1);
    let end = ((at + SMALL.ring_bytes()).div_ceil(page) * page).min(seg.len);
    // SAFETY: a range of our own mapping (the segment is mapped whole, from a page-aligned
    // address); populating changes no byte of it.
    unsafe { libc::madvise(seg.ptr.as_ptr().add(start).cast(), end - start, libc::MADV_POPULATE_WRITE) };
}

/// A ring in some mapping.
struct Ring<'a> {
    seg: &'a Mapping,
    at: usize,
    class: Class,
}

impl Ring<'_> {
    #[inline]
    fn tail(&self) -> &AtomicU64 {
        self.seg.u64_at(self.at)
    }

    #[inline]
    fn stamp(&self, i: usize) -> &AtomicU64 {
        self.seg.u64_at(self.at + RING_HEADER + i * self.class.slot_bytes)
    }

    #[inline]
    fn slot_ptr(&self, i: usize) -> *mut u8 {
        // SAFETY: in bounds of the mapping (the layout's ring `at` has the class's slots).
        unsafe { self.seg.ptr.as_ptr().add(self.at + RING_HEADER + i * self.class.slot_bytes) }
    }

    #[inline]
    fn slots(&self) -> u64 {
        self.class.slots as u64
    }

    /// Claims the next position: its index in the ring and the position, whose slot is
    /// then the caller's to write until [`publish`](Self::publish). `None`: full.
    #[inline(always)]
    fn claim(&self) -> Option<(usize, u64)> {
        let mask = self.slots() - 1;
        // Relaxed: the tail only allocates positions; the stamp carries the data.
        let mut t = self.tail().load(Ordering::Relaxed);
        loop {
            let i = (t & mask) as usize;
            // Acquire: pairs with the consumer's Release after it read last lap's frame.
            let stamp = self.stamp(i).load(Ordering::Acquire).wrapping_add(i as u64);
            if stamp == t {
                match self.tail().compare_exchange_weak(t, t.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        if t == 0 {
                            // The ring's first frame (one producer claims position 0).
                            populate(self.seg, self.at, self.class);
                        }
                        return Some((i, t));
                    }
                    Err(now) => t = now,
                }
            } else if stamp.wrapping_add(self.slots()) == t.wrapping_add(1) {
                return None;
            } else {
                t = self.tail().load(Ordering::Relaxed);
            }
        }
    }

    /// Publishes the frame of `n` bytes written into the slot of position `t` (index `i`),
    /// claimed by [`claim`](Self::claim).
    #[inline(always)]
    fn publish(&self, i: usize, t: u64, n: usize) {
        // SAFETY: the length word of our slot, 8-aligned.
        unsafe { (*self.slot_ptr(i).add(8).cast::<AtomicU32>()).store(n as u32, Ordering::Relaxed) };
        // Release: publishes the frame to the consumer's Acquire.
        self.stamp(i).store(t.wrapping_add(1).wrapping_sub(i as u64), Ordering::Release);
    }

    /// Whether position `head` holds a frame.
    #[inline(always)]
    fn ready(&self, head: u64) -> bool {
        let i = (head & (self.slots() - 1)) as usize;
        // Acquire: a `true` is followed by the read of the frame.
        self.stamp(i).load(Ordering::Acquire).wrapping_add(i as u64) == head.wrapping_add(1)
    }

    /// The slot of the frame at `head` (which is [`ready`](Self::ready)), whose bytes are
    /// all initialized, and the frame's length; the slot stays the consumer's until
    /// [`free`](Self::free).
    #[inline(always)]
    fn frame_at(&self, head: u64) -> (&[u8], usize) {
        let i = (head & (self.slots() - 1)) as usize;
        let p = self.slot_ptr(i);
        // SAFETY: the stamp said written for `head`; the producer touches the slot no more
        // until we free it, and the consumer is one thread (the CRI's state lock). The length
        // word is ours to read after the Acquire in `ready`; it is clamped to the slot.
        unsafe {
            let max = self.class.max_frame();
            let n = ((*p.add(8).cast::<AtomicU32>()).load(Ordering::Relaxed) as usize).min(max);
            (std::slice::from_raw_parts(p.add(SLOT_DATA), max), n)
        }
    }

    /// Frees the slot of `head` for the next lap, once its frame was read.
    #[inline(always)]
    fn free(&self, head: u64) {
        let i = (head & (self.slots() - 1)) as usize;
        // Release: our read of the frame happens before the next lap's producer writes.
        self.stamp(i).store(head.wrapping_add(self.slots()).wrapping_sub(i as u64), Ordering::Release);
    }
}

/// The consumer's position in each ring a CRI reads (guarded by the CRI's state lock).
#[derive(Debug, Default)]
pub(super) struct Heads {
    /// Per sender of `Lane::readers`, its small ring's then its big ring's.
    heads: Vec<u64>,
    /// Where the next poll starts (round robin over the rings).
    next: usize,
}

/// A slot of a peer's ring claimed for one frame ([`Lane::claim`]): written by the claimer,
/// then published. A claim never published stops its ring (as a sender that dies in the
/// middle of a push does: module docs, *Segments*).
pub(super) struct Claim<'a> {
    peer: &'a Peer,
    ring: Ring<'a>,
    /// The slot's index in the ring.
    i: usize,
    /// The claimed position.
    t: u64,
    /// The frame's length.
    len: usize,
}

impl Claim<'_> {
    /// The frame's bytes, to write.
    #[inline(always)]
    pub(super) fn frame(&mut self) -> &mut [u8] {
        // SAFETY: position `t` is ours (the tail's compare-and-swap) and its slot free (the
        // stamp): nobody reads or writes these bytes until we publish; `len` is at most the
        // class's `max_frame` (`Lane::claim`).
        unsafe { std::slice::from_raw_parts_mut(self.ring.slot_ptr(self.i).add(SLOT_DATA), self.len) }
    }

    /// Hands the frame to the receiver, and wakes it if it sleeps on the lane.
    #[inline(always)]
    pub(super) fn publish(self) {
        self.ring.publish(self.i, self.t, self.len);
        Lane::wake_if_asleep(self.peer);
    }
}

impl Lane {
    /// Ring `k` (of [`Heads::heads`]) of CRI `cri`.
    #[inline]
    fn ring_in(&self, cri: usize, k: usize) -> Ring<'_> {
        let big = k % 2 == 1;
        Ring { seg: &self.seg, at: self.layout.ring(cri, self.readers[cri][k / 2], big), class: self.layout.class(big) }
    }

    /// The largest frame the lane carries.
    #[inline]
    pub(super) fn max_frame(&self) -> usize {
        self.layout.big_frame
    }

    /// Whether frames to `dst` may go through the lane.
    #[inline]
    pub(super) fn reaches(&self, dst: u32) -> bool {
        matches!(self.peers.get(dst as usize), Some(Some(_)))
    }

    /// Ranks (this one included) reached through the lane.
    pub(super) fn peers(&self) -> usize {
        self.peers.iter().filter(|p| p.is_some()).count()
    }

    /// Claims a slot for a frame of `len` bytes to CRI `cri` of `dst`: the caller writes
    /// the frame into [`Claim::frame`], then [`Claim::publish`]es it. `None`: the lane does
    /// not reach `dst`, the frame is larger than [`max_frame`](Self::max_frame), or the ring
    /// is full.
    #[inline(always)]
    pub(super) fn claim(&self, dst: u32, cri: usize, len: usize) -> Option<Claim<'_>> {
        let Some(Some(peer)) = self.peers.get(dst as usize) else { return None };
        if len > self.max_frame() {
            return None;
        }
        let big = len > SMALL.max_frame();
        let ring = Ring { seg: &peer.seg, at: self.layout.ring(cri, self.rank, big), class: self.layout.class(big) };
        let (i, t) = ring.claim()?;
        Some(Claim { peer, ring, i, t, len })
    }

    /// [`claim`](Self::claim), `write` (given the frame's `len` bytes), publish. `false`
    /// where `claim` finds no slot.
    #[cfg(test)]
    fn push(&self, dst: u32, cri: usize, len: usize, write: impl FnOnce(&mut [u8])) -> bool {
        let Some(mut c) = self.claim(dst, cri, len) else { return false };
        write(c.frame());
        c.publish();
        true
    }

    /// After something for `dst` was handed to libfabric (a frame too large for the lane,
    /// an RMA operation, a rendezvous read its progress may serve): wakes `dst`'s watcher if
    /// it sleeps, as a push does. Nothing for a rank the lane does not reach.
    #[inline]
    pub(super) fn nudge(&self, dst: u32) {
        if let Some(Some(peer)) = self.peers.get(dst as usize) {
            Self::wake_if_asleep(peer);
        }
    }

    /// Copies `len` bytes at address `from` in the process of `src` (which the lane
    /// reaches) to `dst`, with `process_vm_readv` (one copy, by the kernel, needing nothing
    /// of the peer; the permission is the one `pidfd_getfd` already had). `None`: the lane
    /// does not reach `src`, or the kernel refused (the caller reads through libfabric
    /// instead); `Some(Err(PeerLost))`: the process is gone.
    ///
    /// # Safety
    /// `dst..dst + len` must be valid for writes and used by nobody else meanwhile.
    pub(super) unsafe fn read(&self, src: u32, from: u64, dst: *mut u8, len: usize) -> Option<Result<(), crate::Error>> {
        // SAFETY: forwarded contract.
        unsafe { self.vm_copy(src, from, dst, len, false) }
    }

    /// Copies `data` to address `to` in the process of `dst` (which the lane reaches), with
    /// `process_vm_writev`: [`read`](Self::read) the other way round. A rank of this
    /// process (ranks of one process on `shm`) is written with a plain copy: the kernel's
    /// costs 10-30 times as much for 128 KiB in cache.
    ///
    /// # Safety
    /// `to..to + data.len()` in `dst`'s process must be memory that process lent for this
    /// write and neither reads nor writes meanwhile.
    pub(super) unsafe fn write(&self, dst: u32, to: u64, data: &[u8]) -> Option<Result<(), crate::Error>> {
        let Some(Some(p)) = self.peers.get(dst as usize) else { return None };
        if p.pid == std::process::id() {
            // SAFETY: forwarded contract: `to` is an address of this process, lent to us.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), to as *mut u8, data.len()) };
            return Some(Ok(()));
        }
        // SAFETY: forwarded contract; `process_vm_writev` only reads the local range.
        unsafe { self.vm_copy(dst, to, data.as_ptr().cast_mut(), data.len(), true) }
    }

    /// `process_vm_readv` (`write` false: `len` bytes at `remote` in `peer`'s process into
    /// `local`) or `process_vm_writev` (the other way), through short transfers.
    unsafe fn vm_copy(&self, peer: u32, remote: u64, local: *mut u8, len: usize, write: bool) -> Option<Result<(), crate::Error>> {
        let Some(Some(p)) = self.peers.get(peer as usize) else { return None };
        let mut done = 0usize;
        while done < len {
            let here = libc::iovec { iov_base: local.wrapping_add(done).cast(), iov_len: len - done };
            let there = libc::iovec { iov_base: (remote as usize + done) as *mut libc::c_void, iov_len: len - done };
            // SAFETY: the local range is the caller's (valid for writes when reading, ours
            // alone); the kernel checks the remote range against the peer's mappings.
            let n = unsafe {
                match write {
                    false => libc::process_vm_readv(p.pid as libc::pid_t, &here, 1, &there, 1, 0),
                    true => libc::process_vm_writev(p.pid as libc::pid_t, &here, 1, &there, 1, 0),
                }
            };
            match n {
                n if n > 0 => done += n as usize,
                0 => return None,
                _ => {
                    return match std::io::Error::last_os_error().raw_os_error() {
                        Some(libc::ESRCH) => Some(Err(crate::Error::PeerLost { rank: peer })),
                        // EPERM, EFAULT (not the peer's address), ENOSYS: the caller goes through libfabric.
                        _ if done == 0 => None,
                        _ => Some(Err(crate::Error::Transport {
                            op: if write { "process_vm_writev" } else { "process_vm_readv" },
                            code: std::io::Error::last_os_error().raw_os_error().unwrap_or(0),
                        })),
                    };
                }
            }
        }
        Some(Ok(()))
    }

    /// Whether the lane reaches every rank of the job: then everything that can wake this
    /// rank's watcher wakes it (pushes and [`nudge`](Self::nudge)s), and its sleeps need no
    /// short timer.
    pub(super) fn reaches_all(&self) -> bool {
        self.peers.iter().all(Option::is_some)
    }

    #[inline(always)]
    fn wake_if_asleep(peer: &Peer) {
        // Orders the push (or post) before the load of `asleep` (module docs, *Waking the
        // receiver*): against a sleeper that runs a barrier on this CPU, the compiler's
        // order is enough; against any other, a full fence.
        if peer.fenceless {
            compiler_fence(Ordering::SeqCst);
        } else {
            fence(Ordering::SeqCst);
        }
        let asleep = peer.seg.u32_at(16);
        if asleep.load(Ordering::Relaxed) != AWAKE {
            match asleep.swap(AWAKE, Ordering::Relaxed) {
                ASLEEP_WATCHER => write_one(peer.wake.as_raw_fd()),
                ASLEEP_WAITER => write_one(peer.wake_waiter.as_raw_fd()),
                _ => {}
            }
        }
    }

    /// New consumer positions for CRI `cri`.
    pub(super) fn heads(&self, cri: usize) -> Heads {
        Heads { heads: vec![0; 2 * self.readers[cri].len()], next: 0 }
    }

    /// Whether a ring of CRI `cri` holds a frame.
    pub(super) fn has_frames(&self, cri: usize, heads: &Heads) -> bool {
        heads.heads.iter().enumerate().any(|(k, &h)| self.ring_in(cri, k).ready(h))
    }

    /// Hands up to `max` frames of CRI `cri` to `read` (the slot, whose bytes are all
    /// initialized, and the frame's length), ring after ring, each drained before the next;
    /// returns how many.
    #[inline(always)]
    pub(super) fn poll(&self, cri: usize, heads: &mut Heads, max: usize, mut read: impl FnMut(&[u8], usize)) -> usize {
        let n_rings = heads.heads.len();
        let mut n = 0;
        let mut idle = 0;
        // Each ring in turn, drained before the next: a look at an empty ring per ring and
        // poll, not per frame.
        while n < max && idle < n_rings {
            let j = heads.next;
            heads.next = if j + 1 == n_rings { 0 } else { j + 1 };
            let ring = self.ring_in(cri, j);
            let mut h = heads.heads[j];
            let before = n;
            while n < max && ring.ready(h) {
                let (slot, len) = ring.frame_at(h);
                read(slot, len);
                ring.free(h);
                h = h.wrapping_add(1);
                n += 1;
            }
            heads.heads[j] = h;
            idle = if n == before { idle + 1 } else { 1 };
        }
        n
    }

    /// Before the watcher sleeps: says so to senders, unless the rank's waiter sleeps on the
    /// lane (then the senders wake the waiter: `false`). Follow with a last look at the rings.
    pub(super) fn fall_asleep(&self) -> bool {
        let asleep = self.seg.u32_at(16);
        // SeqCst (the exchange, or the fence): orders the store before the watcher's last
        // look (module docs, *Waking*).
        let covered = match asleep.compare_exchange(AWAKE, ASLEEP_WATCHER, Ordering::SeqCst, Ordering::Relaxed) {
            Ok(_) | Err(ASLEEP_WATCHER) => true,
            Err(_) => false,
        };
        self.sleeper_barrier();
        covered
    }

    /// After the watcher's sleep: no sender needs to wake it now (a waiter's claim stays).
    /// Its eventfd is drained by its owner.
    pub(super) fn wake_up(&self) {
        let _ = self.seg.u32_at(16).compare_exchange(ASLEEP_WATCHER, AWAKE, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Before the rank's waiter sleeps: says so to senders (a sleeping watcher is displaced).
    /// Follow with a last look at the rings.
    pub(super) fn waiter_falls_asleep(&self) {
        // SeqCst: orders the store before the waiter's last look (module docs, *Waking*).
        self.seg.u32_at(16).swap(ASLEEP_WAITER, Ordering::SeqCst);
        self.sleeper_barrier();
    }

    /// After the waiter's sleep: no sender needs to wake it now (a watcher's claim made
    /// since stays). Its eventfd is drained by its owner.
    pub(super) fn waiter_wakes_up(&self) {
        let _ = self.seg.u32_at(16).compare_exchange(ASLEEP_WAITER, AWAKE, Ordering::Relaxed, Ordering::Relaxed);
    }

    /// Between a sleeper's store to `asleep` and its last look at the rings: a full fence,
    /// and where this rank published it, a barrier on every CPU that runs a thread of a
    /// registered process, which orders the pushes of fenceless senders against that look
    /// (module docs, *Waking the receiver*).
    fn sleeper_barrier(&self) {
        fence(Ordering::SeqCst);
        match self.barrier {
            SleeperBarrier::Fence => {}
            SleeperBarrier::Private => membarrier::private_barrier(),
            SleeperBarrier::Global => membarrier::global_barrier(),
        }
    }

    /// Whether pushes to `dst` go without a fence (module docs, *Waking the receiver*).
    #[cfg(test)]
    fn fenceless_to(&self, dst: u32) -> bool {
        matches!(self.peers.get(dst as usize), Some(Some(p)) if p.fenceless)
    }

    /// The descriptor the watcher sleeps on.
    pub(super) fn wake_fd(&self) -> RawFd {
        self.eventfd.as_raw_fd()
    }

    /// The descriptor the rank's waiter sleeps on.
    pub(super) fn waiter_fd(&self) -> RawFd {
        self.waiter_eventfd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `fd` is readable now.
    fn readable(fd: RawFd) -> bool {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        unsafe { libc::poll(&mut p, 1, 0) == 1 }
    }

    fn pair() -> (Lane, Lane) {
        let a = Prepared::create(2, 2, 1024).expect("memfd");
        let b = Prepared::create(2, 2, 1024).expect("memfd");
        let published = [Some(*a.published()), Some(*b.published())];
        (a.connect(0, &published, None), b.connect(1, &published, None))
    }

    /// A zero-filled segment is a ring of free slots; frames come out in order, a full ring
    /// refuses, and the slots are reused lap after lap.
    #[test]
    fn frames_cross_in_order_and_a_full_ring_refuses() {
        let (a, b) = pair();
        assert!(a.reaches(1) && a.reaches(0) && b.reaches(0));
        assert_eq!(a.peers(), 2);
        let mut heads = b.heads(1);
        for (len, slots) in [(4, SMALL.slots), (1000, BIG_SLOTS)] {
            for lap in 0..3u32 {
                for i in 0..slots as u32 {
                    let v = lap * 1000 + i;
                    assert!(a.push(1, 1, len, |out| out[..4].copy_from_slice(&v.to_le_bytes())));
                }
                assert!(!a.push(1, 1, len, |_| unreachable!("full")), "a full ring refuses");
                assert!(b.has_frames(1, &heads));
                assert!(!b.has_frames(0, &b.heads(0)), "another CRI's rings stay empty");
                let mut got = Vec::new();
                let polled = b.poll(1, &mut heads, usize::MAX, |f, n| {
                    assert_eq!(n, len);
                    got.push(u32::from_le_bytes(f[..4].try_into().unwrap()));
                });
                assert_eq!(polled, slots);
                assert_eq!(got, (0..slots as u32).map(|i| lap * 1000 + i).collect::<Vec<_>>());
                assert!(!b.has_frames(1, &heads));
            }
        }
        assert_eq!(a.max_frame(), 1024, "the big slots hold the largest frame asked for");
        assert!(!a.push(1, 1, 1025, |_| unreachable!("too large")), "a frame larger than a slot is not taken");
    }

    /// The first frame into a ring of small frames brings in all of its pages, the sender
    /// allocating them at once; a ring no frame reached, and a ring of large frames, hold
    /// only what was written.
    #[test]
    fn a_rings_first_frame_brings_in_its_pages() {
        let (a, b) = pair();
        let page = page_size();
        // Pages of `ring` (a ring of `b`'s segment) resident now.
        let resident = |ring: &Ring<'_>| {
            let start = (ring.at + RING_HEADER) & !(page - 1);
            let end = (ring.at + ring.class.ring_bytes()).div_ceil(page) * page;
            let mut vec = vec![0u8; (end - start) / page];
            // SAFETY: a range of the mapping, page-aligned; `vec` has a byte per page.
            let rc = unsafe { libc::mincore(b.seg.ptr.as_ptr().add(start).cast(), end - start, vec.as_mut_ptr()) };
            assert_eq!(rc, 0, "mincore");
            (vec.iter().filter(|&&v| v & 1 == 1).count(), vec.len())
        };
        let ring = |cri: usize, big: bool| Ring { seg: &b.seg, at: b.layout.ring(cri, 0, big), class: b.layout.class(big) };
        assert!(a.push(1, 0, 8, |o| o.fill(1)));
        let (held, pages) = resident(&ring(0, false));
        assert_eq!(held, pages, "every page of the small ring after its first frame");
        assert!(pages >= SMALL.slots * SMALL.slot_bytes / page);
        let (held, _) = resident(&ring(1, false));
        assert!(held <= 2, "a ring no frame reached: {held} pages");
        assert!(a.push(1, 0, 1000, |o| o.fill(1)));
        let (held, pages) = resident(&ring(0, true));
        assert!(held < pages, "a ring of large frames faults page by page: {held} of {pages}");
        let mut heads = b.heads(0);
        assert_eq!(b.poll(0, &mut heads, 10, |f, n| assert!(f[..n].iter().all(|&x| x == 1))), 2);
    }

    /// Two senders into one CRI: each sender's frames in its order, both rings served.
    #[test]
    fn every_sender_has_its_ring() {
        let a = Prepared::create(1, 3, 1024).expect("memfd");
        let b = Prepared::create(1, 3, 1024).expect("memfd");
        let c = Prepared::create(1, 3, 1024).expect("memfd");
        let published = [Some(*a.published()), Some(*b.published()), Some(*c.published())];
        let (a, b, c) = (a.connect(0, &published, None), b.connect(1, &published, None), c.connect(2, &published, None));
        for i in 0..10u8 {
            // Every third frame of each sender is a large one (the other ring).
            let len = if i % 3 == 0 { 900 } else { 1 };
            assert!(a.push(2, 0, len, |o| o[0] = i));
            assert!(b.push(2, 0, len, |o| o[0] = 100 + i));
        }
        let mut heads = c.heads(0);
        let mut got = Vec::new();
        assert_eq!(c.poll(0, &mut heads, 7, |f, _| got.push(f[0])), 7);
        assert_eq!(c.poll(0, &mut heads, 100, |f, _| got.push(f[0])), 13);
        // Per sender and ring, in order; nothing lost.
        for (base, ring) in [(0u8, 0u8), (0, 1), (100, 0), (100, 1)] {
            let seen: Vec<u8> =
                got.iter().copied().filter(|&v| v >= base && v < base + 100 && u8::from((v - base) % 3 == 0) == ring).collect();
            let want: Vec<u8> = (0..10u8).filter(|i| u8::from(i % 3 == 0) == ring).map(|i| base + i).collect();
            assert_eq!(seen, want);
        }
    }

    /// A segment whose nonce does not match what was published is not used, nor one on
    /// another host.
    #[test]
    fn a_wrong_nonce_or_host_leaves_the_peer_on_libfabric() {
        let a = Prepared::create(1, 2, 1024).expect("memfd");
        let b = Prepared::create(1, 2, 1024).expect("memfd");
        let mut wrong = *b.published();
        wrong.nonce ^= 1;
        let mine = *a.published();
        let lane = a.connect(0, &[Some(mine), Some(wrong)], None);
        assert!(lane.reaches(0) && !lane.reaches(1));
        let a = Prepared::create(1, 2, 1024).expect("memfd");
        let mut elsewhere = *b.published();
        elsewhere.host ^= 1;
        let mine = *a.published();
        let lane = a.connect(0, &[Some(mine), Some(elsewhere)], None);
        assert!(!lane.reaches(1));
        let a = Prepared::create(1, 2, 1024).expect("memfd");
        let mine = *a.published();
        let lane = a.connect(0, &[Some(mine), None], None);
        assert!(!lane.reaches(1), "a rank without a lane");
    }

    /// Where the launcher says which ranks share this host, a rank it leaves out is not
    /// reached through the lane, though its host identity matches; one it names is.
    #[test]
    fn the_launchers_host_ranks_bound_the_lane() {
        let make = || {
            [
                Prepared::create(1, 3, 1024).expect("memfd"),
                Prepared::create(1, 3, 1024).expect("memfd"),
                Prepared::create(1, 3, 1024).expect("memfd"),
            ]
        };
        let [a, b, c] = make();
        let published = [Some(*a.published()), Some(*b.published()), Some(*c.published())];
        let lane = a.connect(0, &published, Some(&[0, 2]));
        assert!(lane.reaches(0) && !lane.reaches(1) && lane.reaches(2));
        assert_eq!(lane.peers(), 2);
        let lane = b.connect(1, &published, Some(&[1]));
        assert!(!lane.reaches(0) && lane.reaches(1) && !lane.reaches(2));
        let lane = c.connect(2, &published, None);
        assert!(lane.reaches(0) && lane.reaches(1) && lane.reaches(2), "no word from the launcher: host identities alone");
    }

    /// A sleeping watcher is woken by the first frame, once; frames while awake cost no write.
    #[test]
    fn a_sleeping_watcher_is_woken_once() {
        let (a, b) = pair();
        assert!(a.push(1, 0, 0, |_| ()));
        assert!(!readable(b.wake_fd()), "awake: no wake-up");
        b.fall_asleep();
        assert!(a.push(1, 0, 0, |_| ()));
        assert!(readable(b.wake_fd()));
        b.wake_up();
        drain(b.wake_fd());
        assert!(!readable(b.wake_fd()));
        assert!(a.push(1, 0, 0, |_| ()));
        assert!(!readable(b.wake_fd()));
        let mut heads = b.heads(0);
        assert_eq!(b.poll(0, &mut heads, 10, |_, n| assert_eq!(n, 0)), 3);
    }

    /// A waiter asleep on the lane takes the wake-up from a sleeping watcher: the push
    /// writes the waiter's eventfd, not the watcher's; a watcher does not displace a sleeping
    /// waiter, and the waiter that wakes leaves a watcher's later claim alone.
    #[test]
    fn a_sleeping_waiter_is_woken_not_the_watcher() {
        let (a, b) = pair();
        assert!(b.fall_asleep(), "nobody else sleeps: the watcher covers the lane");
        b.waiter_falls_asleep();
        assert!(!b.fall_asleep(), "a sleeping waiter is not displaced");
        assert!(a.push(1, 0, 0, |_| ()));
        assert!(readable(b.waiter_fd()) && !readable(b.wake_fd()), "the waiter is woken, alone");
        drain(b.waiter_fd());
        b.waiter_falls_asleep();
        b.waiter_wakes_up();
        assert!(b.fall_asleep(), "the waiter gave the lane back");
        b.waiter_wakes_up();
        assert!(a.push(1, 0, 0, |_| ()));
        assert!(readable(b.wake_fd()) && !readable(b.waiter_fd()), "the watcher's claim stayed");
        let mut heads = b.heads(0);
        assert_eq!(b.poll(0, &mut heads, 10, |_, n| assert_eq!(n, 0)), 2);
    }

    /// A push goes without a fence only to a rank whose segment says its sleepers issue
    /// `membarrier`, and only from a process registered for it; a sleeping watcher is woken
    /// by such a push as by any other.
    #[test]
    fn pushes_skip_the_fence_only_where_the_sleeper_runs_the_barrier() {
        let registered = membarrier::global_registered();
        let a = Prepared::create(1, 3, 1024).expect("memfd");
        let b = Prepared::create(1, 3, 1024).expect("memfd");
        let mut c = Prepared::create(1, 3, 1024).expect("memfd");
        assert_eq!(a.seg.u32_at(SLEEPER_BARRIER).load(Ordering::Relaxed), u32::from(registered));
        // `c` stands for a rank whose process could not register: its sleepers fence only.
        c.seg.u32_at(SLEEPER_BARRIER).store(0, Ordering::Relaxed);
        c.barrier = false;
        let published = [Some(*a.published()), Some(*b.published()), Some(*c.published())];
        let (a, b, c) = (a.connect(0, &published, None), b.connect(1, &published, None), c.connect(2, &published, None));
        assert_eq!((a.fenceless_to(1), a.fenceless_to(0)), (registered, registered));
        assert!(!a.fenceless_to(2), "c's sleepers run no barrier for a's pushes");
        assert!(!c.fenceless_to(0), "c's process is not registered: it fences");
        b.fall_asleep();
        assert!(a.push(1, 0, 0, |_| ()));
        assert!(readable(b.wake_fd()), "a fenceless push wakes a sleeping watcher");
        c.fall_asleep();
        assert!(a.push(2, 0, 0, |_| ()));
        assert!(readable(c.wake_fd()));
    }

    /// Where every writer of a rank's rings is of its own process, its sleepers' barrier is
    /// the private one (where the process registered for both), and a sleeper that ran it is
    /// woken by a push.
    #[test]
    fn sleepers_with_writers_of_their_own_process_alone_run_the_private_barrier() {
        let global = membarrier::global_registered();
        let private = membarrier::private_registered();
        let (a, b) = pair();
        let expected = match (global, private) {
            (false, _) => SleeperBarrier::Fence,
            (true, true) => SleeperBarrier::Private,
            (true, false) => SleeperBarrier::Global,
        };
        assert_eq!((a.barrier, b.barrier), (expected, expected));
        b.fall_asleep();
        assert!(a.push(1, 0, 0, |_| ()));
        assert!(readable(b.wake_fd()), "a push wakes a watcher that ran the private barrier");
        b.wake_up();
        drain(b.wake_fd());
        b.waiter_falls_asleep();
        assert!(a.push(1, 0, 0, |_| ()));
        assert!(readable(b.waiter_fd()), "and a waiter that ran it");
    }

    #[test]
    fn published_round_trips() {
        let a = Prepared::create(1, 1, 1024).expect("memfd");
        let mut out = Vec::new();
        Published::encode(Some(a.published()), &mut out);
        Published::encode(None, &mut out);
        let (p, n) = Published::decode(&out).unwrap();
        assert_eq!(p, Some(*a.published()));
        assert_eq!(Published::decode(&out[n..]), Some((None, 1)));
        assert_eq!(Published::decode(&[7]), None);
        assert_eq!(Published::decode(&out[..5]), None);
        assert_eq!(a.published().pid, std::process::id());
    }
}
