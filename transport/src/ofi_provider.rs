//! The libfabric provider (cargo feature `ofi`): one rank per OS process over `FI_EP_RDM`
//! endpoints, built on the safe layer in [`crate::ofi`].
//!
//! # Layout of one rank
//!
//! | object | count | what for |
//! |---|---|---|
//! | domain + address vector (`FI_AV_TABLE`) | 1 | shared by every endpoint of the rank |
//! | CRI endpoint + its CQ + RMA counter | `k` (one per CRI) | eager frames, protocol frames, transport-level RMA |
//! | RMA endpoint + its CQ | 1 | the rendezvous reads (`fi_read`) |
//!
//! The AV holds `size * (k + 1)` addresses: entry `r * (k + 1) + c` is endpoint `c` of rank
//! `r` (`c == k` is the RMA endpoint). Each rank publishes its `k + 1` endpoint names as one
//! blob ([`Opened::address_blob`]) through the bootstrap (or directly, in [`world`]), with
//! its *probe*: a word registered for remote reads for the rank's lifetime, which peers
//! read to reach the rank's RMA target endpoint ([`OfiRank::reach_rma_targets`]).
//!
//! # Eager frames and flow control
//!
//! A frame is a wire header followed by the payload: 24 bytes ([`COMPACT_HEADER`]) for an
//! eager frame that is its whole message, 64 ([`WIRE_HEADER`], every [`Header`] field) for
//! protocol frames — the bytes that cross cores are most of a shm hop. Every
//! CRI keeps `recv_slots` receive buffers posted, each `64 + eager_capacity` bytes — never
//! smaller than the largest frame a peer sends, because `tcp;ofi_rxm` 1.17 stops delivering
//! after a truncated receive (docs/OFI.md). A completed slot is decoded, its payload copied
//! into a pooled buffer (or inline), and the slot is posted again by the next CQ read that
//! finds the CQ empty (or once a quarter of the slots wait): the `fi_recv` that replaces a
//! buffer is then off the latency path of the message that used it.
//!
//! Sending uses `fi_inject` when the frame fits the provider's inject size (no completion,
//! no buffer), else one of `send_slots` per-CRI send buffers, freed by its send completion.
//! There is no credit scheme of our own: `FI_EP_RDM` is reliable, unexpected frames are
//! buffered by the provider within its own bounded resources, and when those (or our send
//! slots) are exhausted the post returns `FI_EAGAIN`, which becomes
//! [`SendError::WouldBlock`]: the runtime progresses and retries. Nothing is dropped and no
//! memory grows with the number of messages.
//!
//! # Same-host lane
//!
//! Frames to a rank of the same host go through rings in shared memory instead of
//! libfabric (`lane.rs`: one segment per rank, two rings per receiving CRI and sending rank
//! — frames of up to [`SAME_HOST_SMALL_FRAME`] bytes, and frames up to the eager threshold
//! (at most 64 KiB) — mapped by the peers through `pidfd_getfd`): a frame is then one slot
//! written and one read, where libfabric's `shm` costs a command entry, its region's spin
//! lock and a completion on each side. Rendezvous reads (libfabric `shm`'s single copy),
//! RMA and eager frames above 64 KiB stay on libfabric, and so do peers on other hosts (with
//! `tcp;ofi_rxm`, one job may use both). `poll` takes a CRI's ring frames first (round
//! robin over the senders), then its CQ's, and while the rings deliver it reads the CQ only
//! every [`LANE_CQ_EVERY`]th poll; `has_frames` looks at the rings first (a load per sending
//! rank). Frames of one sender that take different paths may arrive out of order;
//! the runtime's sequence numbers order them, as they do frames spread over several CRIs. A
//! full ring refuses the send like `FI_EAGAIN`. A rendezvous from a rank the lane reaches is
//! read with one `process_vm_readv` at the sender's address (which its `Rts` carries on
//! every provider), by the receiving thread, without libfabric; where the kernel refuses,
//! through libfabric as before. The rank's waiter (below), or else the watcher, sleeps on
//! an `eventfd` of the lane as well, which the first same-host frame after it fell asleep
//! writes, and so does a same-host peer after it posted anything else for this rank to
//! libfabric (a large frame, an RMA operation, a rendezvous read). So where the lane reaches
//! every rank, the watcher's sleeps on `shm` back off to [`LANE_SLEEP_US`] instead of 1 ms,
//! and an idle rank costs next to no CPU. Frames the watcher finds waiting in the rings
//! make it ring the doorbell, then nap until a thread of the rank takes them (a new frame
//! ends the nap; the naps back off to [`LANE_WAITING_NAP_US`]). Off with
//! [`OfiOptions::same_host_lane`] (`WEFT_SAME_HOST_LANE=0`); each rank chooses for itself.
//!
//! # Polling, staging and parking
//!
//! libfabric has no "peek": the only way to learn whether a CQ holds a completion is to read
//! it. `has_frames` (called by the runtime without the CRI lock) therefore reads the CQ under
//! the CRI's internal mutex and *stages* the receive completions (at most one entry per
//! posted slot, so the staging queue is bounded) for the next `poll`.
//!
//! The first thread of an idle rank to park on the doorbell becomes the rank's *waiter*
//! ([`OfiRank::take_waiter`], the `waiter` module; one at a time): it sleeps on what wakes
//! the rank itself — its `eventfd`, which same-host senders write (lane docs, *Waking the
//! receiver*) and which its own waker writes (the doorbell, its sync object), and the CQ
//! wait fds after `fi_trywait` where every CQ has one (`tcp;ofi_rxm`) — so a frame's arrival
//! wakes the thread that progresses it, with no thread in between. The other parked threads
//! are woken through the rank's [`Doorbell`], rung by a per-rank *watcher* thread, as are
//! async pollers. While the rank is idle, the watcher reads every CRI's CQ (which also
//! drives the provider's progress, so a peer's RMA read of this rank's memory completes while
//! all of this rank's threads sleep) and rings the doorbell when it staged frames; while the
//! rank is active it stays out of the way (progress threads are polling), asleep until the
//! rank may first count as quiet, which the first thread to find it quiet makes sooner
//! (`sleep_while_active`: on a host with more ranks than cores, watchers waking every
//! millisecond left the kernel spreading the busy ranks unevenly). Between passes,
//! while no thread is the waiter, it blocks on the CQ wait fds after `fi_trywait` when every
//! CQ has one — for [`CQ_WAIT_MS`] when the rank goes quiet, doubling while the blocks time
//! out, up to [`IDLE_WAIT_MS`] — else it sleeps, starting at 10 µs when the rank goes quiet
//! and backing off to 1 ms (shm has no wait fd in 1.17), so a wake-up costs at most about
//! the time the rank has been idle. While a thread is the waiter the watcher keeps only what
//! has no descriptor, on its timer: CQs without a wait fd where the lane does not reach every
//! rank, reads in flight, refused sends, stuck CRIs; else a pass every [`IDLE_WAIT_MS`] where
//! the CQs have wait fds, up to [`LANE_SLEEP_US`] on `shm`. The waiter that leaves ends a
//! longer sleep, so the watcher covers the descriptors again at once (`WaiterRole`, with its
//! loom model).
//!
//! On `tcp;ofi_rxm` (libfabric 1.17) a block on the CQ wait fds begun after `fi_trywait`
//! ends for everything a peer needs of this rank's progress, so its timeout is a safety net
//! only: an rxm CQ's wait fd is an epoll set that holds the tcp CQ's own (the connected
//! sockets, with `POLLOUT` while tcp has bytes queued on one: a read response, a delivery
//! acknowledgement) and the descriptors of rxm's connection-management EQ (the listening
//! socket, the sockets of handshakes in progress); `fi_trywait` brings the EQ's part up to
//! date, asks for `POLLOUT` where tcp buffered bytes, and refuses while anything is pending.
//! A peer's connection, its puts, gets and atomics on a window of this rank and its reads of
//! a registered send buffer are therefore served while every thread of the rank sleeps. The
//! one lag is rxm's: it reads its connection events at most every 10 ms while none of its
//! own connections is being set up (`FI_OFI_RXM_CM_PROGRESS_INTERVAL`), and until it does
//! the listening socket stays readable — a block ends early, never late. While the rank has been
//! active in the last few milliseconds ([`OfiRank::any_frames`] then answers `true`)
//! progress threads spin instead of parking, so ping-pong latency is not the watcher's.
//!
//! A send the provider refuses (`SendError::WouldBlock`: no free send slot, or `FI_EAGAIN`
//! while `ofi_rxm` sets up the connection on the first frame to a peer) marks the rank
//! (`send_refused`); the watcher then rings room at the doorbell (`Doorbell::ring_room`) on
//! each of its short-sleep passes (never blocking on the wait fds, which a connection's
//! progress does not signal; backing off from 10 µs to 1 ms while only refusals come) until
//! a pass finds no new refusal. A runtime that queued the frame retries on each ring, so a
//! sender parked on the doorbell — a thread, an async task that nothing else will poll, or
//! the runtime's own thread waiting for room — is not left waiting for a frame that will
//! never come.
//!
//! # Rendezvous
//!
//! The sender registers its buffer (`fi_mr_reg`, `FI_REMOTE_READ`); the `Rts` frame carries
//! the key and — under `FI_MR_VIRT_ADDR` (shm) — the buffer's address in the header's
//! `addr`. The receiver reads it with `fi_read` from its RMA endpoint, in chunks of at most
//! 8 MiB with up to 8 in flight per read (32 for all reads together, within the endpoint's
//! CQ), targeting the sender's CRI endpoint (the one the sender progresses while it waits
//! for the `Fin`).
//!
//! A read never blocks: [`OfiRank::start_read`] posts its first chunks and returns, and
//! [`OfiRank::poll_reads`] — called by the runtime's progress passes, outside its CRI locks —
//! reads the RMA endpoint's completions, posts the rest and reports the reads that are over
//! (the `reads` module). Serving a read may need the sender's own progress on its endpoint
//! (shm without cross-memory attach, `tcp;ofi_rxm`): a rank that waited for its read inside
//! progress would not serve its peers' reads meanwhile, and ranks reading from each other
//! would wait for ever. While every thread of the rank may be parked, the watcher advances
//! the reads and rings the doorbell when one is over. A read that fails while its peer is
//! not (yet) known lost waits a few seconds for the verdict (`reads::VERDICT_WAIT`): the
//! failure of a read from a dead process is reported as the peer's loss.
//!
//! # A window's end
//!
//! A window's registration is not removed when its owner ends its part (drops the window, or
//! frees it while a peer did not): a libfabric access to a removed key is no clear error —
//! `tcp;ofi_rxm` 1.17's target logs `unknown key` (`ofi_mr_map_verify`) and `invalid rma
//! iov received` and shuts the connection down, and the origin's flush waited out its 60 s
//! deadline; on `shm` a fetch-and-op to a removed key never completed. The runtime tells
//! the peers of the end (a `WindowEnd` frame), and accesses they post after it fail before
//! they reach the transport; an access racing with it still reaches the key. So
//! [`OfiRank::retire_window`] keeps the registration, retired, with the window's own memory,
//! up to [`RETIRED_BYTES`] a rank (oldest deregistered and freed first): a racing access
//! lands in memory nobody uses. Beyond the bound, or for memory a window borrowed (which
//! goes back to its owner, deregistered at once), an access racing with the end meets the
//! removed key as above: the runtime's `rma` docs make ending an exposed window while
//! peers still target it the program's error, as `MPI_Win_free` is collective.
//!
//! # Lost peers
//!
//! A peer is marked lost by [`OfiRank::mark_lost`] (the bootstrap's monitor calls it when the
//! job's key-value server reports that the peer's connection closed, or that the peer
//! finished: either way it sends nothing more), or when a post or a completion to it fails.
//! Sends and reads to a lost peer fail with `PeerLost`; [`OfiRank::lost_epoch`] changes so the
//! runtime fails pending requests that need it (after delivering the frames that reached
//! this rank before). When the job's launcher itself is gone (the bootstrap's
//! [`PeerEvent::ServerLost`]: `weftrun` was
//! killed), every peer is marked lost and the rank removes the names of its `shm` regions
//! from `/dev/shm` at once ([`LossNotifier::launcher_lost`]): nothing else would, should the
//! process be killed next.
//!
//! # A one-sided operation to a lost rank
//!
//! A CRI counts its one-sided operations with one libfabric counter, and a flush waits
//! until the count of completions reaches the count posted. libfabric completes no
//! operation whose target died before serving it: on `shm` the target's own progress
//! serves atomics and writes, and a dead process makes none. A flush therefore watches its
//! targets too: each CRI keeps the ranks it sent operations to since its count last came
//! level, and once one of them is lost and the count has not moved for
//! [`LOST_RMA_SETTLED`] (answers a dead rank sent before it died are read meanwhile, and a
//! live target serves what was posted to it), the flush fails with `PeerLost` naming it.
//! The operations still outstanding then are written off: later flushes of the CRI wait
//! for the operations posted after them. An atomic's operands and result slot are kept
//! (never freed) when its flush fails: libfabric may still read or write them.
//!
//! On `tcp;ofi_rxm` the CRI then goes on serving live ranks. An operation to a live rank
//! that took longer than [`LOST_RMA_SETTLED`] to serve is written off with the lost rank's;
//! its late completion counts for a later operation of the CRI, whose flush may then
//! return before that operation completed. On `shm` an endpoint reads the answers to its
//! operations in the order it sent them and stops at the first not yet given (libfabric's
//! `smr_progress_resp`), so nothing it sends later completes: the CRI's later one-sided
//! operations fail at once with `PeerLost` naming the lost rank (the rank's other CRIs, and
//! its frames, which take the same-host lane, are untouched). Without the lane (`ofi-shm`),
//! frames are libfabric sends, and one larger than `shm`'s inject size in flight to a rank
//! when it is lost holds the CRI's later sends the same way: they are delivered, but their
//! completions queue behind its answer, so the CRI's send slots are not freed and run out
//! (with 8 slots, 7 more frames of 8,000 bytes to a live rank went, then none). That case
//! is not handled: after a loss on `ofi-shm`, such a CRI sends nothing more.
//!
//! # A CRI stuck in libfabric
//!
//! libfabric 1.17's `shm` provider guards each endpoint's command queue with a
//! process-shared spin lock that lives in the endpoint's shared-memory region: a peer takes
//! it to queue a command (a send, an RMA request) for the endpoint, and the endpoint's own
//! progress — every `fi_cq_read` — takes it too. A peer killed while it holds that lock
//! leaves it held, and the next thread of this rank that reads the CQ spins in
//! `pthread_spin_lock` inside `fi_cq_read`; the lock records no owner and has no robust
//! mode, so libfabric never recovers. (A thread that sends to the dead peer can be caught
//! the same way on the lock of the peer's region; libfabric 1.18 queues commands lock-free,
//! which removes the common case.) weft bounds what that costs, and undoes it where it can:
//!
//! * A CQ is read only under its CRI's state lock (`CriEndpoint::st`), so one thread per CRI at
//!   most is caught; every other thread waits for that lock at most [`STUCK_AFTER`]
//!   (`RankInner::lock_state`), then counts the CRI *stuck* and, until a holder releases the
//!   lock, does not wait for it at all: `poll` finds no frames, `has_frames` says none, a
//!   send that needs a send slot is refused (`WouldBlock`), the transport-level RMA calls
//!   retry until their deadline. The watcher also counts a CRI stuck whose state lock it
//!   finds held at every pass for [`STUCK_AFTER`] (the caught thread may be the only one
//!   that uses the CRI; once it found the lock held, its passes come every [`CQ_WAIT_MS`]
//!   at most, so that a lock merely taken often is seen free). The runtime's loss handling therefore goes on and fails the
//!   requests that need the lost peer (it waits for its own CRI locks with a deadline too).
//! * When a peer died (the bootstrap reported it `LOST`, not finished, and its pid no
//!   longer runs) — [`STUCK_AFTER`] after the report (the watcher), and again whenever a
//!   CRI is stuck — the spin locks of this rank's CRI regions and of the dead peers' CRI
//!   regions are tried `RELEASE_SAMPLES` times over about 0.1 s; one held at every try — a
//!   live holder keeps it for microseconds — is released ([`ShmRegionLock`], libfabric
//!   1.17's region layout only: with another libfabric nothing is touched). A thread caught
//!   on it (in a CQ read, or a send or read to the dead peer) then takes it and comes back.
//! * [`OfiRank::close`] skips stuck CRIs when it drains sends and waits at most
//!   [`STUCK_AFTER`] for the watcher to stop. A watcher still caught in libfabric is left
//!   behind, and with it everything of the rank it shares (`RankInner`): endpoints, CQs,
//!   address vector, domain, registrations and the slot buffers stay allocated and open
//!   until the process exits — they must outlive a thread still inside libfabric, and
//!   closing an endpoint would take the same lock. Their `shm` region names are removed
//!   from `/dev/shm` then, since no endpoint close will.
//!
//! # Region names
//!
//! libfabric's `shm` provider names each endpoint's region in `/dev/shm`
//! (`<pid>:<uid>:<index>`, 16 MiB each with weft's queue sizes) and removes the name only
//! when the endpoint closes. A name left behind holds its memory until the next reboot, so
//! weft removes them itself wherever an endpoint may not close: at [`OfiRank::close`], when
//! the job's launcher is gone, and when the process exits with ranks still open (a runtime
//! kept to the end, `std::process::exit`, a handle forgotten: an `atexit` hook registered
//! with the first `shm` rank). A process killed by a signal runs none of these; `weftrun`
//! removes its ranks' names when they end and a dead process's at its start, and a process
//! that gets a dead one's pid removes that one's before it opens its own.

use std::collections::{HashMap, VecDeque};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

use crate::bootstrap::PeerEvent;
use crate::doorbell::Doorbell;
use crate::frame::{Frame, FrameKind, Header, Payload, INLINE};
use crate::ofi::{
    AddressVector, CompletionError, CqError, Domain, Endpoint, EndpointConfig, FetchOp, FiAddr, Info, MemoryRegion, MrAccess, OfiError,
    Post, RemoteRegion, ShmRegionLock, TryWait,
};
use crate::{Error, ReadStart, SendError};

mod lane;
mod reads;
mod waiter;

/// Bytes of the full wire header, in front of protocol frames (`Rts`, `Fin`) and of eager
/// frames that carry rendezvous fields.
pub const WIRE_HEADER: usize = 64;

/// Bytes of the compact wire header of an eager frame whose payload is the whole message
/// and which carries no rendezvous fields — every eager message. Its `len` is the bytes
/// that follow, and it leaves out `src_cri` (which only an `Rts` needs). `fi_pingpong` over `shm`
/// here: 0.28-0.29 µs one-way up to 32 bytes, 0.33-0.35 from 36 to 64: an 8-byte message
/// behind this header still costs what 8 bytes cost.
pub const COMPACT_HEADER: usize = 24;

/// Largest frame (wire header and payload) the same-host lane's ring of small frames
/// carries (module docs); larger ones take its ring of large frames.
pub const SAME_HOST_SMALL_FRAME: usize = lane::SMALL.max_frame();

/// Largest frame sent with `fi_inject` (bounded by the provider's inject size too); the
/// frame is assembled on the stack.
const INJECT_MAX: usize = 4096;

/// Frames up to this size are assembled in a small stack buffer.
const SMALL_FRAME: usize = 128;

/// Largest single `fi_read` of a rendezvous.
const READ_CHUNK: usize = 8 << 20;

/// Chunks of one rendezvous read posted at once.
const READS_IN_FLIGHT: usize = 8;

/// How long a rank counts as "active" after its last frame (progress threads spin meanwhile
/// instead of parking), in coarse-clock milliseconds.
const ACTIVE_MS: u64 = 10;

/// Completions `reap` asks for per `fi_cq_read` (up to 8 reads per call).
const REAP_CHUNK: usize = 16;

/// First sleep of the watcher after the rank went quiet (then doubling up to 1 ms).
const MIN_SLEEP_US: u64 = 10;

/// First block of the watcher on the CQs' wait fds (`tcp;ofi_rxm`) after the rank went
/// quiet; each block that times out doubles the next, up to [`IDLE_WAIT_MS`].
const CQ_WAIT_MS: u64 = 10;

/// Longest block of the watcher on the CQs' wait fds, and its longest sleep while the
/// rank's waiter blocks on them instead (module docs, *Polling, staging and parking*): a
/// safety net, as what a peer needs of the rank's progress wakes these blocks, and a bound
/// on how late the watcher first finds a CRI's state lock held (it looks again within
/// [`CQ_WAIT_MS`] from then on, `watch_stuck`).
const IDLE_WAIT_MS: u64 = 250;

/// Descriptors `poll_fds` takes without allocating: a CQ per CRI and an `eventfd`.
const POLL_FDS: usize = 33;

/// Longest sleep of the watcher on a provider without wait fds (`shm`) while the same-host
/// lane reaches every rank (module docs, *Same-host lane*), and while the rank's waiter
/// sleeps on the CQs' wait fds (*Polling, staging and parking*); 1 ms otherwise.
const LANE_SLEEP_US: u64 = 50_000;

/// Longest nap of the watcher between its rings while frames wait in the same-host rings
/// for the rank's threads (a busy or descheduled thread, or one that holds the CRI):
/// each nap from [`MIN_SLEEP_US`] doubles up to this.
const LANE_WAITING_NAP_US: u64 = 1000;

/// While the same-host rings deliver frames, a CRI's poll reads its CQ only every this many
/// polls (`OfiRank::poll`).
const LANE_CQ_EVERY: u32 = 8;

/// How long a failed rendezvous read waits for its other chunks to finish before giving up
/// on them (they target memory the read must not give back while they may still write it).
const DRAIN_LIMIT: Duration = Duration::from_secs(5);

/// How long a thread waits for a CRI's state lock before it counts the CRI as stuck (see
/// the module docs, *A CRI stuck in libfabric*), and how long `close` waits for the watcher
/// to stop. The lock is held for one CQ read or one post, well under a millisecond; a
/// holder that keeps it this long is most likely spinning inside libfabric on a lock a dead
/// peer held. (A holder merely descheduled that long costs one empty poll or one refused
/// send: the CRI counts as stuck only until the lock is taken again.)
pub const STUCK_AFTER: Duration = Duration::from_millis(500);

/// Tries of an `shm` region's spin lock, [`RELEASE_SAMPLE`] apart, that must all find it
/// held before the lock counts as left held by a dead peer and is released (module docs).
const RELEASE_SAMPLES: u32 = 100;

/// Time between two tries of [`RELEASE_SAMPLES`].
const RELEASE_SAMPLE: Duration = Duration::from_millis(1);

/// Context kinds (top byte of the `u64` operation context).
/// The endpoint of a peer that every one-sided operation of this rank targets (its first
/// CRI's), whichever CRI issues it. libfabric's `shm` completes a small write at the
/// initiator once it is queued in the target endpoint's command queue, and the target
/// applies each queue in order: with one queue per target, an operation queued after
/// another — by any thread of any rank that saw the other's effect — is applied after it.
/// Aimed at the issuing CRI's index, two threads' operations landed in two queues, and a
/// put could be applied after a later operation that depended on it (RMA-RW let a writer in
/// beside another holder, 8 processes of 2 threads).
const RMA_TARGET_EP: usize = 0;

/// How long the count of a CRI's completed one-sided operations must stay still, once a
/// rank they went to is lost, before a flush gives up on the rest (module docs, *A
/// one-sided operation to a lost rank*): what a live target takes at most to serve an
/// operation already posted, its progress made by its watcher if its threads are busy.
const LOST_RMA_SETTLED: Duration = Duration::from_millis(100);

/// Bytes of a rank's probe (module docs): one word, of which a reach reads one byte.
const PROBE_LEN: usize = 8;

/// Bytes of the retired windows' registrations a rank keeps (module docs, *A window's
/// end*): beyond it, the oldest are deregistered and freed.
const RETIRED_BYTES: usize = 64 << 20;

/// A rank's retired window registrations, oldest first, with their memory (dropped in that
/// order: deregistered before freed), and their bytes.
#[derive(Default)]
struct Retired {
    kept: VecDeque<(MemoryRegion, Box<[u64]>)>,
    bytes: usize,
}

const CTX_RECV: u64 = 1 << 56;
const CTX_SEND: u64 = 2 << 56;
const CTX_READ: u64 = 3 << 56;
const CTX_KIND: u64 = 0xff << 56;

/// Sizes of a libfabric rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfiOptions {
    /// libfabric provider name: `"shm"` or `"tcp;ofi_rxm"` (or `"sockets"`).
    pub provider: String,
    /// CRIs (endpoints + CQs) per rank.
    pub cris: usize,
    /// Largest eager payload; receive slots are this plus the wire header.
    pub eager_capacity: usize,
    /// Receive buffers kept posted per CRI.
    pub recv_slots: usize,
    /// Send buffers per CRI (for frames above the inject size).
    pub send_slots: usize,
    /// Settings of the layers above that every rank of the job must share (say, how the
    /// runtime numbers its frames), each with the message a rank fails with when a peer's
    /// differs. They travel with the endpoint addresses and are compared in
    /// [`Opened::connect`], as are the CRI count and the eager capacity: a job whose ranks
    /// disagree fails at start with [`Error::InvalidArgument`] instead of truncating or
    /// never matching frames later.
    pub terms: Vec<(u64, &'static str)>,
    /// Carry small frames between ranks of one host through rings in shared memory
    /// (module docs, *Same-host lane*) instead of through libfabric.
    pub same_host_lane: bool,
}

impl Default for OfiOptions {
    fn default() -> Self {
        OfiOptions {
            provider: "shm".into(),
            cris: 1,
            eager_capacity: 16 * 1024,
            recv_slots: 256,
            send_slots: 128,
            terms: Vec::new(),
            same_host_lane: true,
        }
    }
}

impl OfiOptions {
    fn validate(&self) -> Result<(), Error> {
        if self.cris == 0 || self.cris > u16::MAX as usize {
            return Err(Error::InvalidArgument("an ofi rank needs 1..=65535 CRIs"));
        }
        if self.eager_capacity > 1 << 20 {
            return Err(Error::InvalidArgument("the ofi provider's eager threshold is at most 1 MiB"));
        }
        if self.recv_slots == 0 || self.send_slots == 0 || self.recv_slots > 1 << 16 || self.send_slots > 1 << 16 {
            return Err(Error::InvalidArgument("ofi receive/send slots must be in 1..=65536"));
        }
        Ok(())
    }
}

/// Converts a libfabric error into weft's.
pub(crate) fn transport_error(e: &OfiError) -> Error {
    Error::Transport { op: e.op, code: e.code }
}

/// Coarse monotonic milliseconds (`CLOCK_MONOTONIC_COARSE`: a few ns per read).
fn coarse_ms() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer; CLOCK_MONOTONIC_COARSE exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

// ----------------------------------------------------------------------------------------
// Wire format

/// The `N` bytes of `b` at `at` (a fixed-size copy: the reads and writes of one header
/// check its bounds once).
#[inline(always)]
fn le<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut w = [0u8; N];
    w.copy_from_slice(&b[at..at + N]);
    w
}

/// Wire kind byte of a compact eager frame (the full ones use `FrameKind as u8`: 0 to 3).
const COMPACT_EAGER: u8 = 0x80;

/// The wire header length for `h` in front of `data_len` payload bytes: compact for an
/// eager frame that is its whole message and has no rendezvous fields.
#[inline]
fn header_len(h: &Header, data_len: usize) -> usize {
    // One test of the three rendezvous fields together: fewer branches on every send.
    if h.kind == FrameKind::Eager && h.len == data_len as u64 && (h.cookie | h.key | h.addr) == 0 {
        COMPACT_HEADER
    } else {
        WIRE_HEADER
    }
}

/// Writes `h` into the first `header_len(h, ..)` bytes of `out` (`hlen`, which
/// `header_len` chose).
///
/// | bytes | field | bytes | field |
/// |---|---|---|---|
/// | 0 | kind (`0x80`: compact eager) | 20..24 | gseq |
/// | 1 | 0 | 24..26 | src_cri |
/// | 2..4 | chan | 32..40 | len |
/// | 4..8 | context | 40..48 | cookie |
/// | 8..12 | source | 48..56 | key |
/// | 12..16 | tag | 56..64 | addr |
/// | 16..20 | seq | | |
///
/// A compact header ends at byte 24: its `len` is the payload's, the rendezvous fields are
/// zero and `src_cri` is not carried (a receiver needs it only to answer an `Rts`; it reads
/// 0). 24 bytes keep an 8-byte message in 32 bytes on the wire, the size up to which a shm
/// hop costs the same (`fi_pingpong` here: 0.28-0.29 µs one-way up to 32 bytes, 0.33-0.35
/// from 36).
#[inline(always)]
fn encode(h: &Header, hlen: usize, out: &mut [u8]) {
    // The compact part, built in registers and stored at once.
    let mut w = [0u8; COMPACT_HEADER];
    w[0] = if hlen == COMPACT_HEADER { COMPACT_EAGER } else { h.kind as u8 };
    w[2..4].copy_from_slice(&h.chan.to_le_bytes());
    w[4..8].copy_from_slice(&h.context.to_le_bytes());
    w[8..12].copy_from_slice(&h.source.to_le_bytes());
    w[12..16].copy_from_slice(&(h.tag as u32).to_le_bytes());
    w[16..20].copy_from_slice(&h.seq.to_le_bytes());
    w[20..24].copy_from_slice(&h.gseq.to_le_bytes());
    out[..COMPACT_HEADER].copy_from_slice(&w);
    if hlen == WIRE_HEADER {
        let mut x = [0u8; WIRE_HEADER - COMPACT_HEADER];
        x[0..2].copy_from_slice(&h.src_cri.to_le_bytes());
        x[8..16].copy_from_slice(&h.len.to_le_bytes());
        x[16..24].copy_from_slice(&h.cookie.to_le_bytes());
        x[24..32].copy_from_slice(&h.key.to_le_bytes());
        x[32..40].copy_from_slice(&h.addr.to_le_bytes());
        out[COMPACT_HEADER..WIRE_HEADER].copy_from_slice(&x);
    }
}

/// Writes a whole frame into `out`, which is exactly `hlen + data.len()` bytes: the
/// header (`hlen` from [`header_len`]), then the payload.
#[inline(always)]
fn write_frame(h: &Header, hlen: usize, data: &[u8], out: &mut [u8]) {
    encode(h, hlen, out);
    // No `memcpy` call for the empty payloads of 0-byte messages and protocol frames.
    if !data.is_empty() {
        out[hlen..].copy_from_slice(data);
    }
}

/// Reads a header written by [`encode`] and its length; `None` for a malformed frame.
#[inline(always)]
fn decode(b: &[u8]) -> Option<(Header, usize)> {
    let w: [u8; COMPACT_HEADER] = b.get(..COMPACT_HEADER)?.try_into().ok()?;
    let (kind, hlen) = match w[0] {
        0 => (FrameKind::Eager, WIRE_HEADER),
        1 => (FrameKind::Rts, WIRE_HEADER),
        2 => (FrameKind::Fin, WIRE_HEADER),
        3 => (FrameKind::WindowEnd, WIRE_HEADER),
        COMPACT_EAGER => (FrameKind::Eager, COMPACT_HEADER),
        _ => return None,
    };
    let u32_at = |at: usize| u32::from_le_bytes([w[at], w[at + 1], w[at + 2], w[at + 3]]);
    let mut header = Header {
        kind,
        src_cri: 0,
        context: u32_at(4),
        source: u32_at(8),
        tag: u32_at(12) as i32,
        seq: u32_at(16),
        gseq: u32_at(20),
        chan: u16::from_le_bytes([w[2], w[3]]),
        len: (b.len() - COMPACT_HEADER) as u64,
        cookie: 0,
        key: 0,
        addr: 0,
    };
    if hlen == WIRE_HEADER {
        let x: [u8; WIRE_HEADER - COMPACT_HEADER] = b.get(COMPACT_HEADER..WIRE_HEADER)?.try_into().ok()?;
        header.src_cri = u16::from_le_bytes(le(&x, 0));
        header.len = u64::from_le_bytes(le(&x, 8));
        header.cookie = u64::from_le_bytes(le(&x, 16));
        header.key = u64::from_le_bytes(le(&x, 24));
        header.addr = u64::from_le_bytes(le(&x, 32));
    }
    Some((header, hlen))
}

// ----------------------------------------------------------------------------------------
// Buffers handed to libfabric

/// A heap buffer whose bytes libfabric may read or write while operations on it are
/// posted; Rust code touches a slot only while no operation on that slot is posted.
struct RawBuf {
    /// Start of the allocation (a leaked `Box<[u8]>`).
    ptr: NonNull<u8>,
    /// Length in bytes.
    len: usize,
}

// SAFETY: the buffer is plain memory; which thread may touch which slot is decided by the
// owning CRI's mutex and by libfabric's completions (see `Cri`).
unsafe impl Send for RawBuf {}
// SAFETY: see `Send`.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    fn new(len: usize) -> Self {
        let b: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let ptr = NonNull::new(Box::into_raw(b).cast::<u8>()).unwrap_or(NonNull::dangling());
        RawBuf { ptr, len }
    }

    /// Pointer to slot `i` of `size` bytes.
    fn slot(&self, i: usize, size: usize) -> *mut u8 {
        debug_assert!((i + 1) * size <= self.len);
        // SAFETY: `i * size` is inside the allocation (slots are laid out back to back).
        unsafe { self.ptr.as_ptr().add(i * size) }
    }
}

impl Drop for RawBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a `Box<[u8]>` of `len` bytes, freed
        // once here. Its endpoint (declared before it in `Cri`) is already closed, so
        // libfabric no longer uses it.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len)) });
    }
}

/// State of one CRI that posting and polling change; guarded by `CriEndpoint::st`.
struct CriState {
    /// Completed receive slots not yet handed to the runtime: `(slot, bytes)`. At most one
    /// entry per posted slot.
    staged: VecDeque<(u32, u32)>,
    /// Send slots not in use.
    free_send: Vec<u32>,
    /// Destination rank of each send slot in use (to mark it lost if the send fails).
    send_dst: Box<[u32]>,
    /// Receive slots not posted: consumed frames, and re-posts refused with `FI_EAGAIN`;
    /// posted again by `reap` (capacity `recv_slots`: never reallocates).
    repost: Vec<u32>,
    /// Transport-level RMA operations posted on this CRI's counter.
    rma_issued: u64,
    /// Of those, operations to lost ranks that a flush gave up on: libfabric completes
    /// none of them (*A one-sided operation to a lost rank*), so the count a flush waits
    /// for leaves them out.
    rma_written_off: u64,
    /// The ranks targeted since a flush last found every counted operation complete
    /// (each once): where a lost rank may hold operations that will never complete.
    rma_targets: Vec<u32>,
    /// On `shm`, a lost rank whose operations were written off: the endpoint's later
    /// completions queue behind their answers, which never come, so later operations fail
    /// at once with `PeerLost` naming it.
    rma_blocked_by: Option<u32>,
    /// Where this CRI is in each same-host ring it reads.
    heads: lane::Heads,
    /// Polls that found same-host frames (see `OfiRank::poll`).
    lane_polls: u32,
}

/// One CRI: an endpoint with its CQ and counter, its receive and send buffers.
///
/// Field order is drop order: the endpoint (and so its CQ) is closed before the buffers it
/// may still reference are freed.
struct CriEndpoint {
    /// The endpoint; libfabric owns every posted slot of the buffers below.
    ep: Endpoint,
    /// Staging, send slots, reposts. The runtime's CRI lock already serializes most callers;
    /// this one also covers `send_control` (no runtime lock) and the watcher. Injected
    /// frames need none of it and are sent without it.
    st: Mutex<CriState>,
    /// `st.staged` is non-empty (read without the mutex by `has_frames`).
    ready: AtomicBool,
    /// A thread waited [`STUCK_AFTER`] for `st` in vain: its holder is most likely caught
    /// inside libfabric (module docs). Threads then only try `st`, never wait for it; the
    /// next `reap` (whoever holds `st` again) clears it.
    stuck: AtomicBool,
    /// `CriState::rma_blocked_by` is set: the CRI refuses one-sided operations.
    rma_blocked: AtomicBool,
    /// Frames sent and polled through this CRI (see `note_activity`, `recently_active`).
    activity: AtomicU64,
    /// The spin lock of the endpoint's `shm` region (libfabric 1.17 only), to release when
    /// a dead peer left it held (module docs).
    region_lock: Option<ShmRegionLock>,
    /// `recv_slots` receive slots.
    recv_mem: RawBuf,
    /// `send_slots` send slots.
    send_mem: RawBuf,
}

/// A rank's endpoints, opened but not yet connected to the peers.
pub struct Opened {
    /// Options used.
    opts: OfiOptions,
    /// Number of ranks of the job.
    size: u32,
    /// The domain (and, through it, the fabric and info).
    domain: Arc<Domain>,
    /// Shared address vector.
    av: Arc<AddressVector>,
    /// `k` CRI endpoints then the RMA endpoint.
    eps: Vec<Endpoint>,
    /// The rank's probe (module docs); `None` where the provider registers no memory (the
    /// rank then publishes an empty probe, which peers do not reach).
    probe: Option<MemoryRegion>,
    /// This rank's same-host segment, where the system allows one.
    lane: Option<lane::Prepared>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ofi_provider::Opened").field("provider", &self.opts.provider).field("size", &self.size).finish_non_exhaustive()
    }
}

/// Endpoints libfabric 1.17's `shm` provider can address (`SMR_MAX_PEERS`): a rank's address
/// vector holds every rank's `cris + 1` endpoints.
const SHM_MAX_PEERS: usize = 256;

impl Opened {
    /// Opens the domain, AV and `cris + 1` endpoints for a job of `size` ranks.
    pub fn open(opts: &OfiOptions, size: u32) -> Result<Self, Error> {
        opts.validate()?;
        if size == 0 {
            return Err(Error::InvalidArgument("a job needs at least one rank"));
        }
        let info = Info::query(&opts.provider).map_err(|e| transport_error(&e))?;
        if info.provider() == "shm" {
            // Before this process opens any region: files with its pid are a dead process's.
            // And when it exits, whatever regions of its ranks are still open: a rank not
            // dropped (a runtime kept to the end, `process::exit`, a handle forgotten) is
            // never closed, and libfabric leaves the names to the file system.
            static STALE: std::sync::Once = std::sync::Once::new();
            STALE.call_once(|| {
                remove_stale_shm_regions(std::process::id());
                // SAFETY: `atexit` only records the function; a refusal (no room) leaves
                // the names to `weftrun`'s sweep, as a killed process does.
                unsafe { libc::atexit(unlink_regions_at_exit) };
            });
        }
        let per_rank = opts.cris + 1;
        if info.provider() == "shm" && size as usize * per_rank > SHM_MAX_PEERS {
            // libfabric's own check (`fi_av_open` fails with FI_ENOSYS) says nothing of why.
            return Err(Error::InvalidArgument(
                "libfabric's shm provider addresses at most 256 endpoints: ranks x (CRIs + 1) is more; \
                 set fewer CRIs per rank (WEFT_CRIS / Builder::cris; the default is one per core) or use tcp",
            ));
        }
        let domain = Domain::open_with_fabric(&info).map_err(|e| transport_error(&e))?;
        let av = AddressVector::open(&domain, size as usize * per_rank).map_err(|e| transport_error(&e))?;
        let cq_size = opts.recv_slots + opts.send_slots + 64;
        let mut eps = Vec::with_capacity(per_rank);
        for _ in 0..opts.cris {
            let cfg = EndpointConfig { cq_size, wait_fd: true, rma_counter: true };
            eps.push(Endpoint::open(&domain, &av, &cfg).map_err(|e| transport_error(&e))?);
        }
        let cfg = EndpointConfig { cq_size: reads::CHUNKS_POSTED + 16, wait_fd: false, rma_counter: false };
        eps.push(Endpoint::open(&domain, &av, &cfg).map_err(|e| transport_error(&e))?);
        let probe = MemoryRegion::alloc(&domain, PROBE_LEN, MrAccess::REMOTE_READ).ok();
        let lane = if opts.same_host_lane { lane::Prepared::create(opts.cris, size, WIRE_HEADER + opts.eager_capacity) } else { None };
        Ok(Opened { opts: opts.clone(), size, domain, av, eps, probe, lane })
    }

    /// This rank's endpoint names: for each endpoint a little-endian `u16` length and the
    /// bytes, then its probe (module docs). Publish it; [`connect`](Self::connect) takes
    /// every rank's.
    pub fn address_blob(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for v in self.terms() {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for ep in &self.eps {
            out.extend_from_slice(&(ep.name().len() as u16).to_le_bytes());
            out.extend_from_slice(ep.name());
        }
        let probe = self.probe.as_ref().map_or(RemoteRegion { base: 0, key: 0, len: 0 }, MemoryRegion::remote);
        out.extend_from_slice(&probe.to_bytes());
        lane::Published::encode(self.lane.as_ref().map(lane::Prepared::published), &mut out);
        out
    }

    /// What every rank's blob starts with, to be the same everywhere: the CRI count, the
    /// eager capacity, then [`OfiOptions::terms`].
    fn terms(&self) -> impl Iterator<Item = u64> + '_ {
        [self.opts.cris as u64, self.opts.eager_capacity as u64].into_iter().chain(self.opts.terms.iter().map(|t| t.0))
    }

    /// Inserts every rank's endpoints into the AV, posts the receive buffers and starts the
    /// watcher. `blobs[r]` is rank `r`'s [`address_blob`](Self::address_blob).
    ///
    /// Fails with [`Error::InvalidArgument`] if a rank's CRI count, eager capacity or
    /// [`terms`](OfiOptions::terms) differ from this rank's.
    pub fn connect(self, rank: u32, blobs: &[Vec<u8>]) -> Result<OfiRank, Error> {
        self.connect_on_host(rank, blobs, None)
    }

    /// [`connect`](Self::connect), where the launcher said which ranks run on this host
    /// (`host_ranks`, this one included): the same-host lane then reaches only those of
    /// them whose published host identity also matches; [`OfiRank::host_ranks`] tells them.
    pub fn connect_on_host(self, rank: u32, blobs: &[Vec<u8>], host_ranks: Option<&[u32]>) -> Result<OfiRank, Error> {
        if blobs.len() != self.size as usize || rank >= self.size {
            return Err(Error::InvalidArgument("address exchange returned the wrong number of ranks"));
        }
        let mine: Vec<u64> = self.terms().collect();
        let what = |i: usize| {
            match i {
            0 => "the ranks of the job disagree on the CRI count (WEFT_CRIS / Builder::cris)",
            1 => "the ranks of the job disagree on the eager threshold (WEFT_EAGER_THRESHOLD / Builder::eager_threshold): receive buffers would cut a peer's frames",
            _ => self.opts.terms[i - 2].1,
        }
        };
        let per_rank = self.opts.cris + 1;
        let shm = self.domain.info().provider() == "shm";
        let mut peers = Vec::with_capacity(self.size as usize * per_rank);
        // Per rank, the `shm` region names of its CRI endpoints (module docs).
        let mut peer_regions = Vec::with_capacity(if shm { blobs.len() } else { 0 });
        let mut published = Vec::with_capacity(blobs.len());
        let mut probes = Vec::with_capacity(blobs.len());
        for blob in blobs {
            let mut regions = Vec::new();
            if blob.len() < mine.len() * 8 {
                return Err(Error::InvalidArgument("malformed endpoint address from a peer (a different weft version?)"));
            }
            for (i, &v) in mine.iter().enumerate() {
                if u64::from_le_bytes(le(blob, i * 8)) != v {
                    return Err(Error::InvalidArgument(what(i)));
                }
            }
            let mut at = mine.len() * 8;
            for _ in 0..per_rank {
                if at + 2 > blob.len() {
                    return Err(Error::InvalidArgument("malformed endpoint address from a peer (different CRI count?)"));
                }
                let n = usize::from(u16::from_le_bytes(le(blob, at)));
                at += 2;
                let name = blob.get(at..at + n).ok_or(Error::InvalidArgument("malformed endpoint address from a peer"))?;
                at += n;
                peers.push(self.av.insert(name).map_err(|e| transport_error(&e))?);
                if shm && regions.len() < self.opts.cris {
                    regions.extend(region_name_of(name).map(str::to_string));
                }
            }
            if shm {
                peer_regions.push(regions);
            }
            let probe = blob
                .get(at..at + RemoteRegion::ENCODED_LEN)
                .and_then(RemoteRegion::from_bytes)
                .ok_or(Error::InvalidArgument("malformed probe region from a peer (a different weft version?)"))?;
            probes.push(probe);
            at += RemoteRegion::ENCODED_LEN;
            let (p, n) = blob
                .get(at..)
                .and_then(lane::Published::decode)
                .ok_or(Error::InvalidArgument("malformed same-host segment from a peer"))?;
            published.push(p);
            at += n;
            if at != blob.len() {
                return Err(Error::InvalidArgument("endpoint addresses do not match this rank's CRI count"));
            }
        }
        let slot_size = WIRE_HEADER + self.opts.eager_capacity;
        let hosts = published.iter().map(|p| p.as_ref().map(|p| p.host)).collect::<Option<Box<[u64]>>>();
        let lane = self.lane.map(|l| l.connect(rank, &published, host_ranks));
        let mut eps = self.eps;
        let rma_ep = eps.pop().ok_or(Error::InvalidArgument("no RMA endpoint"))?;
        let inject_limit = rma_ep.inject_size().min(INJECT_MAX);
        let max_msg = rma_ep.max_msg_size().max(1);
        let cris: Box<[CachePadded<CriEndpoint>]> = eps
            .into_iter()
            .enumerate()
            .map(|(i, ep)| {
                let region_lock = shm.then(|| shm_region_name(ep.name(), std::process::id()).and_then(ShmRegionLock::open)).flatten();
                CachePadded::new(CriEndpoint {
                    ep,
                    st: Mutex::new(CriState {
                        staged: VecDeque::with_capacity(self.opts.recv_slots),
                        free_send: (0..self.opts.send_slots as u32).rev().collect(),
                        send_dst: vec![0; self.opts.send_slots].into_boxed_slice(),
                        repost: Vec::with_capacity(self.opts.recv_slots),
                        rma_issued: 0,
                        rma_written_off: 0,
                        rma_targets: Vec::new(),
                        rma_blocked_by: None,
                        heads: lane.as_ref().map(|l| l.heads(i)).unwrap_or_default(),
                        lane_polls: 0,
                    }),
                    ready: AtomicBool::new(false),
                    stuck: AtomicBool::new(false),
                    rma_blocked: AtomicBool::new(false),
                    activity: AtomicU64::new(0),
                    region_lock,
                    recv_mem: RawBuf::new(slot_size * self.opts.recv_slots),
                    send_mem: RawBuf::new(slot_size * self.opts.send_slots),
                })
            })
            .collect();
        let inner = Arc::new(RankInner {
            rank,
            size: self.size,
            k: self.opts.cris,
            cris,
            reads: reads::Reads::new(),
            rma_ep,
            peers: peers.into_boxed_slice(),
            alive: (0..self.size).map(|_| AtomicBool::new(true)).collect(),
            lost_epoch: AtomicU64::new(0),
            peer_regions: peer_regions.into_boxed_slice(),
            probes: probes.into_boxed_slice(),
            _probe: self.probe,
            died: (0..self.size).map(|_| AtomicBool::new(false)).collect(),
            deaths: AtomicU64::new(0),
            releasing: Mutex::new(()),
            released_deaths: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            rma_exposed: AtomicBool::new(false),
            rma_reached: Mutex::new(Vec::new()),
            send_refused: AtomicBool::new(false),
            regions: Mutex::new(HashMap::new()),
            retired: Mutex::new(Retired::default()),
            pool: ArrayQueue::new((self.opts.cris * self.opts.recv_slots * 2).clamp(64, 1 << 16)),
            doorbell: Doorbell::new(),
            waiter: waiter::Slot::new(lane.as_ref()).ok_or(Error::InvalidArgument("no eventfd for the rank's waiter"))?,
            eager_capacity: self.opts.eager_capacity,
            slot_size,
            recv_slots: self.opts.recv_slots,
            repost_batch: (self.opts.recv_slots / 4).max(1),
            inject_limit,
            max_msg,
            last_active: AtomicU64::new(coarse_ms()),
            seen_activity: AtomicU64::new(0),
            active_nap: AtomicBool::new(false),
            provider: self.opts.provider.clone(),
            rma_delivered: self.opts.provider != "shm",
            lane,
            hosts,
            virt_addr: self.domain.info().mr_virt_addr(),
            domain: self.domain,
            av: self.av,
            #[cfg(test)]
            stall_watcher: AtomicBool::new(false),
            #[cfg(test)]
            watcher_stalled: AtomicBool::new(false),
            #[cfg(test)]
            watcher_passes: AtomicU64::new(0),
            #[cfg(test)]
            idle_wait_ms: AtomicU64::new(0),
            #[cfg(test)]
            active_nap_ms: AtomicU64::new(0),
            #[cfg(test)]
            rma_refusals: AtomicU64::new(0),
        });
        // event-listener allocates an `Event`'s state at its first use: do it now, not at
        // the first ring in steady state.
        drop(inner.doorbell.listen());
        for cri in inner.cris.iter() {
            let mut st = cri.st.lock();
            for slot in 0..inner.recv_slots as u32 {
                inner.post_recv(cri, &mut st, slot)?;
            }
        }
        let w = inner.clone();
        let watcher = std::thread::Builder::new()
            .name(format!("weft-ofi-watch-{rank}"))
            .spawn(move || w.watch())
            .map_err(|_| Error::InvalidArgument("could not start the ofi watcher thread"))?;
        Ok(OfiRank {
            inner,
            watcher: Mutex::new(Some(watcher)),
            monitor: Mutex::new(None),
            siblings: Mutex::new(Vec::new()),
            host_ranks: host_ranks.map(Into::into),
        })
    }
}

/// This process's rank of the job `job` describes: opens the endpoints, exchanges addresses
/// through the job's KVS, connects, and keeps the KVS connection to learn of lost peers
/// (which then fail with `PeerLost`).
pub fn join(opts: &OfiOptions, mut job: crate::bootstrap::Job) -> Result<OfiRank, Error> {
    let opened = Opened::open(opts, job.size)?;
    let blobs = job.exchange(&opened.address_blob())?;
    let rank = opened.connect_on_host(job.rank, &blobs, job.host_ranks())?;
    let notifier = rank.loss_notifier();
    // A finished peer is gone as a lost one is (it will send nothing more, and sends to it
    // cannot be received); the runtime delivers what it sent before it fails receives.
    rank.set_monitor(job.monitor(move |e| match e {
        PeerEvent::Lost(r) => notifier.died(r),
        PeerEvent::Finished(r) => notifier.lost(r),
        PeerEvent::ServerLost => notifier.launcher_lost(),
    }));
    Ok(rank)
}

/// Creates `n` ranks of one job inside this process (tests, and `build_local`): each rank
/// has its own domain; addresses are exchanged directly. A rank that is closed tells the
/// others directly, as the bootstrap's `FINISHED` does between processes.
pub fn world(opts: &OfiOptions, n: u32) -> Result<Vec<OfiRank>, Error> {
    if n == 0 {
        // As `Opened::open` says for a job of none (which an empty world never calls).
        return Err(Error::InvalidArgument("a job needs at least one rank"));
    }
    let opened = (0..n).map(|_| Opened::open(opts, n)).collect::<Result<Vec<_>, _>>()?;
    let blobs: Vec<Vec<u8>> = opened.iter().map(Opened::address_blob).collect();
    let ranks = opened.into_iter().enumerate().map(|(r, o)| o.connect(r as u32, &blobs)).collect::<Result<Vec<_>, _>>()?;
    for (i, r) in ranks.iter().enumerate() {
        *r.siblings.lock() = ranks.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, o)| o.loss_notifier()).collect();
    }
    Ok(ranks)
}

/// Everything of one rank, shared with its watcher thread.
struct RankInner {
    /// This rank.
    rank: u32,
    /// Ranks of the job.
    size: u32,
    /// CRIs per rank.
    k: usize,
    /// The CRIs.
    cris: Box<[CachePadded<CriEndpoint>]>,
    /// The rendezvous reads in flight on `rma_ep`.
    reads: reads::Reads,
    /// The endpoint rendezvous reads are issued from.
    rma_ep: Endpoint,
    /// `size * (k + 1)` peer addresses.
    peers: Box<[FiAddr]>,
    /// Per rank: not known to be lost.
    alive: Box<[AtomicBool]>,
    /// Bumped on every newly lost peer.
    lost_epoch: AtomicU64,
    /// Per rank, the `shm` region names of its CRI endpoints (empty on other providers):
    /// where a lost peer's spin locks are (module docs).
    peer_regions: Box<[Vec<String>]>,
    /// Per rank, its probe (module docs), which [`OfiRank::reach_rma_targets`] reads.
    probes: Box<[RemoteRegion]>,
    /// This rank's probe, kept registered until the rank is dropped.
    _probe: Option<MemoryRegion>,
    /// Per rank: lost because its process died without finishing (`mark_died`).
    died: Box<[AtomicBool]>,
    /// Peers newly marked in `died` so far.
    deaths: AtomicU64,
    /// Held while releasing spin locks a dead peer left held (one thread at a time).
    releasing: Mutex<()>,
    /// `deaths` when such locks were last looked for.
    released_deaths: AtomicU64,
    /// Set by `close`; the watcher exits.
    closed: AtomicBool,
    /// Registrations of rendezvous send buffers and RMA windows, by key.
    regions: Mutex<HashMap<u64, MemoryRegion>>,
    /// Registrations of windows that ended here, kept with their memory (module docs, *A
    /// window's end*).
    retired: Mutex<Retired>,
    /// A window was registered: peers' one-sided operations may wait in the
    /// [`RMA_TARGET_EP`]'s queue, which only reads of its CQ serve (`serve_rma_target`).
    rma_exposed: AtomicBool,
    /// By rank: whether every CRI of this rank has reached that rank's [`RMA_TARGET_EP`]
    /// ([`OfiRank::reach_rma_targets`]).
    rma_reached: Mutex<Vec<bool>>,
    /// Payload buffers of received frames; given back by `recycle`.
    pool: ArrayQueue<Vec<u8>>,
    /// Rung by the watcher when it staged frames, after refused sends, and on lost peers.
    doorbell: Doorbell,
    /// The rank's waiter role (`waiter` module).
    waiter: waiter::Slot,
    /// A send was refused since the watcher last looked (module docs).
    send_refused: AtomicBool,
    /// Largest eager payload.
    eager_capacity: usize,
    /// Bytes per receive/send slot.
    slot_size: usize,
    /// Receive slots per CRI.
    recv_slots: usize,
    /// Consumed receive slots `reap` lets wait before re-posting them while the CQ is busy.
    repost_batch: usize,
    /// Frames up to this size go out with `fi_inject`.
    inject_limit: usize,
    /// Largest single message / RMA transfer.
    max_msg: usize,
    /// Coarse-clock ms at which activity was last seen (see `recently_active`).
    last_active: AtomicU64,
    /// The sum of the CRIs' `activity` counters when `recently_active` last looked.
    seen_activity: AtomicU64,
    /// Set while the watcher sleeps through the rank's activity (`watch`): the first thread
    /// to find the rank quiet ends that sleep (`any_frames`).
    active_nap: AtomicBool,
    /// libfabric provider name.
    provider: String,
    /// Whether a put completes only once the target applied it (`FI_DELIVERY_COMPLETE`):
    /// off `shm`. `MPI_Win_flush` completes an operation at the target; `tcp;ofi_rxm` 1.17
    /// completes a write once its bytes are in the socket (rxm passes `tcp` no completion
    /// flag, and `tcp` waits for the target's acknowledgement only under
    /// `FI_TRANSMIT_COMPLETE` or `FI_DELIVERY_COMPLETE`), and a later operation of another
    /// thread, through another CRI's connection, could be applied before it: the
    /// distributed locks let two writers in across 4 processes of 2 threads on `tcp`. On
    /// `shm` every one-sided operation of a rank goes into one queue at the target, applied
    /// in order ([`RMA_TARGET_EP`]), so the default completion suffices there.
    rma_delivered: bool,
    /// The same-host lane (module docs), where this rank has one.
    lane: Option<lane::Lane>,
    /// Every rank's host (boot id and host name, hashed, as the same-host lane published
    /// them), when every rank published one.
    hosts: Option<Box<[u64]>>,
    /// Remote memory is addressed by virtual address (`FI_MR_VIRT_ADDR`), not by offset.
    virt_addr: bool,
    /// Keeps the domain open for registrations (endpoints hold it too).
    domain: Arc<Domain>,
    /// The AV (endpoints hold it too).
    #[allow(dead_code)]
    av: Arc<AddressVector>,
    /// Tests: the watcher stays in its pass while set, as one caught inside libfabric...
    #[cfg(test)]
    stall_watcher: AtomicBool,
    /// ... and says so here once it is there.
    #[cfg(test)]
    watcher_stalled: AtomicBool,
    /// Tests: the watcher's passes (each wake-up of its loop).
    #[cfg(test)]
    watcher_passes: AtomicU64,
    /// Tests: when not 0, the watcher's every block on the CQs' wait fds and its longest
    /// sleep while the waiter blocks on them, in milliseconds (`idle_waits`).
    #[cfg(test)]
    idle_wait_ms: AtomicU64,
    /// Tests: when not 0, the watcher's sleep through the rank's activity, in milliseconds
    /// (`sleep_while_active`).
    #[cfg(test)]
    active_nap_ms: AtomicU64,
    /// Tests: one-sided posts the provider refused (`FI_EAGAIN`) and `rma_post` retried.
    #[cfg(test)]
    rma_refusals: AtomicU64,
}

impl RankInner {
    #[inline]
    fn addr(&self, rank: u32, ep: usize) -> FiAddr {
        self.peers[rank as usize * (self.k + 1) + ep]
    }

    /// Marks a refused send for the watcher (module docs) and returns the refusal.
    #[cold]
    fn refused(&self) -> SendError {
        // Release: see the watcher's swap.
        self.send_refused.store(true, Ordering::Release);
        SendError::WouldBlock
    }

    /// Records activity outside the frame path (an RMA read done).
    fn touch(&self) {
        let now = coarse_ms();
        // Written only when the millisecond changes: no shared write per call.
        if self.last_active.load(Ordering::Relaxed) != now {
            self.last_active.store(now, Ordering::Relaxed);
        }
    }

    /// Counts a frame sent or polled on `cri`. A plain load and store on the CRI's own line,
    /// no clock read: the message path stays free of both; the idle paths that ask
    /// `recently_active` turn counts into time.
    #[inline]
    fn note_activity(cri: &CriEndpoint) {
        // Relaxed, not a read-modify-write: two racing writers may lose an increment, but
        // the counter still changes, and readers only compare it with what they saw last.
        cri.activity.store(cri.activity.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
    }

    /// Whether frames moved in the last `ACTIVE_MS`: activity counted since the last call
    /// (then "now" is remembered), or remembered less than `ACTIVE_MS` ago. Asked by idle
    /// waiters and the watcher, which poll it at least every millisecond while traffic flows.
    fn recently_active(&self) -> bool {
        let now = coarse_ms();
        let sum = self.cris.iter().fold(0u64, |a, c| a.wrapping_add(c.activity.load(Ordering::Relaxed)));
        if self.seen_activity.load(Ordering::Relaxed) != sum {
            self.seen_activity.store(sum, Ordering::Relaxed);
            self.last_active.store(now, Ordering::Relaxed);
            return true;
        }
        now.saturating_sub(self.last_active.load(Ordering::Relaxed)) < ACTIVE_MS
    }

    #[inline]
    fn is_alive(&self, r: u32) -> bool {
        // Acquire: pairs with the release in `mark_lost`.
        self.alive.get(r as usize).is_some_and(|a| a.load(Ordering::Acquire))
    }

    /// Marks `r` lost because its process ended without finishing (a `LOST` from the
    /// bootstrap, a failed send, a launcher gone): only such a peer can have left an `shm`
    /// spin lock held (module docs).
    fn mark_died(&self, r: u32) {
        if let Some(d) = self.died.get(r as usize).filter(|_| r != self.rank) {
            // Release: `release_dead_peers_locks` loads `deaths` with acquire, then the flags.
            if !d.swap(true, Ordering::AcqRel) {
                self.deaths.fetch_add(1, Ordering::Release);
            }
        }
        self.mark_lost(r);
    }

    fn mark_lost(&self, r: u32) {
        if r == self.rank {
            return;
        }
        if let Some(a) = self.alive.get(r as usize) {
            // Release: whoever sees the flag cleared also sees the epoch bump below once it
            // reloads the epoch (the runtime reloads it after seeing a failure).
            if a.swap(false, Ordering::AcqRel) {
                self.lost_epoch.fetch_add(1, Ordering::Release);
                self.doorbell.ring_all();
            }
        }
    }

    /// Takes `cri`'s state lock for a caller that must not wait for it forever: at once if
    /// it is free; else, unless the CRI counts as stuck, by waiting at most [`STUCK_AFTER`]
    /// for it. `None` if it was not taken (the CRI is then stuck: module docs).
    #[inline]
    fn lock_state<'a>(&self, cri: &'a CriEndpoint) -> Option<MutexGuard<'a, CriState>> {
        // The same single compare-and-swap as `lock()` when the lock is free.
        cri.st.try_lock().or_else(|| self.lock_state_slow(cri))
    }

    #[cold]
    fn lock_state_slow<'a>(&self, cri: &'a CriEndpoint) -> Option<MutexGuard<'a, CriState>> {
        if cri.stuck.load(Ordering::Relaxed) {
            // A peer that died since the last look may be what holds the stuck thread.
            // Relaxed: `release_dead_peers_locks` reloads the count with acquire.
            if self.deaths.load(Ordering::Relaxed) != self.released_deaths.load(Ordering::Relaxed) {
                self.release_dead_peers_locks();
            }
            return None;
        }
        let st = cri.st.try_lock_for(STUCK_AFTER);
        if st.is_none() {
            // Relaxed: a hint that only shortens later waits; the lock orders the state.
            cri.stuck.store(true, Ordering::Relaxed);
            // The holder may be spinning on a lock a dead peer left held: free it.
            self.release_dead_peers_locks();
        }
        st
    }

    /// Releases the `shm` spin locks a dead peer left held (module docs): once a peer died
    /// (reported dead, and its process no longer runs), every spin lock of this rank's CRI
    /// regions and of the dead peers' CRI regions that stays held at each of
    /// [`RELEASE_SAMPLES`] tries over about 0.1 s is unlocked. Called when a CRI is stuck;
    /// does nothing while no peer died, off `shm`, or with a libfabric whose region layout
    /// weft does not know. Returns how many it released.
    #[cold]
    fn release_dead_peers_locks(&self) -> usize {
        // Acquire: pairs with the release increment in `mark_died` (the flags read below
        // are at least as new).
        let deaths = self.deaths.load(Ordering::Acquire);
        if deaths == 0 || self.peer_regions.is_empty() {
            return 0;
        }
        // One thread samples at a time; another one that finds it busy has nothing to add.
        let Some(_one) = self.releasing.try_lock() else { return 0 };
        // Relaxed: which deaths were looked at, a hint for `lock_state_slow`.
        self.released_deaths.store(deaths, Ordering::Relaxed);
        // Only a peer whose process died can hold a lock for good: one reported dead whose
        // pid (named by its regions) no longer runs — or that lives in this very process
        // (an in-process world), whose word is taken.
        let me = std::process::id();
        let dead: Vec<&[String]> = (0..self.size)
            // Relaxed: ordered by the acquire load of `deaths` above.
            .filter(|&r| r != self.rank && self.died.get(r as usize).is_some_and(|d| d.load(Ordering::Relaxed)))
            .filter_map(|r| self.peer_regions.get(r as usize).map(Vec::as_slice))
            .filter(|names| names.first().and_then(|n| region_pid(n)).is_some_and(|pid| pid == me || !process_runs(pid)))
            .collect();
        if dead.is_empty() {
            return 0;
        }
        // A dead peer's regions are mapped now (the files of a killed process stay until
        // someone removes them).
        let theirs: Vec<ShmRegionLock> = dead.iter().flat_map(|names| names.iter()).filter_map(|name| ShmRegionLock::open(name)).collect();
        let mut held: Vec<&ShmRegionLock> = self.cris.iter().filter_map(|c| c.region_lock.as_ref()).chain(theirs.iter()).collect();
        for i in 0..RELEASE_SAMPLES {
            held.retain(|l| !l.is_free());
            if held.is_empty() {
                return 0;
            }
            if i + 1 < RELEASE_SAMPLES {
                std::thread::sleep(RELEASE_SAMPLE);
            }
        }
        for l in &held {
            l.release();
        }
        held.len()
    }

    /// Posts receive slot `slot` of `cri` (or queues it for a re-post on `FI_EAGAIN`).
    fn post_recv(&self, cri: &CriEndpoint, st: &mut CriState, slot: u32) -> Result<(), Error> {
        let p = cri.recv_mem.slot(slot as usize, self.slot_size);
        // SAFETY: slot `slot` is not posted (it was just completed, or never posted) and no
        // Rust reference to it outlives this call; it stays allocated until the endpoint is
        // closed (field order of `Cri`).
        let buf = unsafe { std::slice::from_raw_parts_mut(p, self.slot_size) };
        // SAFETY: as above — libfabric owns the slot until its completion is read.
        match unsafe { cri.ep.recv(buf, None, None, CTX_RECV | slot as u64) } {
            Ok(Post::Posted) => Ok(()),
            Ok(Post::WouldBlock) => {
                st.repost.push(slot);
                Ok(())
            }
            Err(e) => Err(transport_error(&e)),
        }
    }

    /// Reads `cri`'s CQ: stages receives, frees send slots. Returns completions read.
    ///
    /// Consumed receive slots are re-posted here rather than as each frame is taken: when
    /// the CQ was empty (the thread is waiting anyway) or once a quarter of the slots wait,
    /// so a message's latency does not include the `fi_recv` that replaces its buffer.
    fn reap(&self, cri: &CriEndpoint, st: &mut CriState) -> usize {
        // Whoever holds the state lock again ends a stuck spell (a load on the CRI's own
        // line; written only when it changes).
        if cri.stuck.load(Ordering::Relaxed) {
            cri.stuck.store(false, Ordering::Relaxed);
        }
        let mut total = 0;
        for _ in 0..8 {
            match cri.ep.cq().read_each(REAP_CHUNK, |c| self.complete(st, c.context, c.len)) {
                Ok(0) => break,
                Ok(n) => {
                    total += n;
                    if n < REAP_CHUNK {
                        break;
                    }
                }
                Err(CqError::Completion(e)) => {
                    self.failed(cri, st, &e);
                    total += 1;
                }
                Err(CqError::Fatal(_)) => break,
            }
        }
        if !st.repost.is_empty() && (total == 0 || st.repost.len() >= self.repost_batch) {
            self.repost(cri, st);
        }
        cri.ready.store(!st.staged.is_empty(), Ordering::Relaxed);
        total
    }

    /// Posts every receive slot waiting in `st.repost` (slots refused with `FI_EAGAIN` are
    /// queued anew by `post_recv`).
    fn repost(&self, cri: &CriEndpoint, st: &mut CriState) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        // A slot refused again is pushed behind the ones taken here (capacity suffices:
        // every slot is in the list at most once).
        let n = st.repost.len();
        for i in 0..n {
            let slot = st.repost[i];
            let _ = self.post_recv(cri, st, slot);
        }
        st.repost.drain(..n);
    }

    fn complete(&self, st: &mut CriState, ctx: u64, len: usize) {
        let slot = (ctx & !CTX_KIND) as u32;
        match ctx & CTX_KIND {
            CTX_RECV => st.staged.push_back((slot, len as u32)),
            CTX_SEND => st.free_send.push(slot),
            _ => {}
        }
    }

    #[cold]
    fn failed(&self, cri: &CriEndpoint, st: &mut CriState, e: &CompletionError) {
        let slot = (e.context & !CTX_KIND) as u32;
        match e.context & CTX_KIND {
            CTX_RECV if !self.closed.load(Ordering::Relaxed) => {
                let _ = self.post_recv(cri, st, slot);
            }
            CTX_SEND => {
                st.free_send.push(slot);
                let dst = st.send_dst.get(slot as usize).copied().unwrap_or(u32::MAX);
                if e.error.code != crate::ofi::errno::FI_ECANCELED {
                    self.mark_died(dst);
                }
            }
            _ => {}
        }
    }

    /// The next staged frame of `cri` (reading the CQ first if `read_cq` and nothing is
    /// staged), its slot re-posted.
    /// The frame in the first `len` bytes of `slot_bytes` (a receive slot or a same-host
    /// ring slot, whose bytes past `len` are initialized too), its payload copied out;
    /// `None` for a malformed frame.
    #[inline(always)]
    fn frame_from(&self, slot_bytes: &[u8], len: usize) -> Option<Frame> {
        let bytes = &slot_bytes[..len];
        decode(bytes).map(|(header, hlen)| {
            let data = &bytes[hlen..];
            let payload = if data.is_empty() {
                Payload::Empty
            } else if data.len() <= INLINE {
                // A fixed-size copy (two vector moves, not a `memcpy` call of a variable
                // length) where the slot holds `INLINE` bytes past the header: the bytes
                // past `len` are the slot's (stale, initialized), never read through `len`.
                let b: [u8; INLINE] = match slot_bytes.get(hlen..hlen + INLINE) {
                    Some(w) => w.try_into().unwrap_or([0; INLINE]),
                    None => {
                        let mut b = [0u8; INLINE];
                        b[..data.len()].copy_from_slice(data);
                        b
                    }
                };
                Payload::Inline { len: data.len() as u8, bytes: b }
            } else {
                let mut v = self.pool.pop().unwrap_or_else(|| Vec::with_capacity(self.eager_capacity));
                v.clear();
                v.extend_from_slice(data);
                Payload::Pooled(v)
            };
            Frame { header, payload }
        })
    }

    /// Whether CRI `cri`'s same-host rings hold a frame (its state is `st`).
    #[inline]
    fn lane_has_frames(&self, cri: usize, st: &CriState) -> bool {
        self.lane.as_ref().is_some_and(|l| l.has_frames(cri, &st.heads))
    }

    /// Sends a frame to CRI `c` of `dst` through the same-host lane, where the lane
    /// reaches `dst` and carries a frame of this size; `None` where it does not.
    #[inline(always)]
    fn lane_send(&self, dst: u32, c: usize, h: &Header, data: &[u8]) -> Option<Result<(), SendError>> {
        let lane = self.lane.as_ref()?;
        let hlen = header_len(h, data.len());
        let total = hlen + data.len();
        let Some(mut claim) = lane.claim(dst, c, total) else {
            // Not reached, too large, or the ring is full: only the last is a refusal.
            return (lane.reaches(dst) && total <= lane.max_frame()).then(|| Err(self.refused()));
        };
        write_frame(h, hlen, data, claim.frame());
        claim.publish();
        RankInner::note_activity(&self.cris[c]);
        Some(Ok(()))
    }

    fn next_frame(&self, cri: &CriEndpoint, st: &mut CriState, read_cq: bool) -> Option<Frame> {
        loop {
            if st.staged.is_empty() && read_cq {
                self.reap(cri, st);
            }
            let (slot, len) = st.staged.pop_front()?;
            let p = cri.recv_mem.slot(slot as usize, self.slot_size);
            let len = (len as usize).min(self.slot_size);
            // SAFETY: the slot's completion was read, so libfabric is done writing it, and it
            // is not re-posted until the copy below is finished; the slot is `slot_size`
            // initialized bytes.
            let slot_bytes = unsafe { std::slice::from_raw_parts(p, self.slot_size) };
            let frame = self.frame_from(slot_bytes, len);
            // Re-posted by the next `reap` (see there).
            st.repost.push(slot);
            cri.ready.store(!st.staged.is_empty(), Ordering::Relaxed);
            if frame.is_some() {
                return frame;
            }
        }
    }

    /// Reads every CRI's CQ that is free (try-lock); returns whether frames are staged.
    fn reap_all(&self) -> bool {
        let mut found = false;
        for (i, cri) in self.cris.iter().enumerate() {
            // Reaped even with frames staged: reading the CQ is what drives the provider's
            // progress (`tcp;ofi_rxm` progresses manually), and peers' reads of this rank's
            // memory need it while the rank's threads are elsewhere. What it stages is
            // bounded by the receive slots.
            match cri.st.try_lock() {
                Some(mut st) => {
                    self.reap(cri, &mut st);
                    found |= !st.staged.is_empty() || self.lane_has_frames(i, &st);
                }
                None => found |= cri.ready.load(Ordering::Relaxed),
            }
        }
        found
    }

    /// The watcher thread: see the module docs.
    fn watch(self: Arc<Self>) {
        let fds: Option<Vec<i32>> = self.cris.iter().map(|c| c.ep.cq().wait_fd()).collect();
        // Short sleeps must be short: the default timer slack (50 us) would round them up.
        // SAFETY: PR_SET_TIMERSLACK only changes this thread's timer slack (in ns).
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
        let mut sleep_us = MIN_SLEEP_US;
        // The watcher's next nap while frames wait in the same-host rings for the rank's
        // threads, doubling while they keep waiting.
        let mut lane_nap_us = MIN_SLEEP_US;
        // The next block on the CQs' wait fds: `CQ_WAIT_MS` after the rank went quiet,
        // doubling up to `IDLE_WAIT_MS` while the blocks time out.
        let mut block_ms = CQ_WAIT_MS;
        // Per CRI, since when its state lock was found held at every pass (`watch_stuck`).
        let mut held_since: Vec<Option<Instant>> = vec![None; self.cris.len()];
        let mut released_at: Option<Instant> = None;
        // The death count last seen changing, and when.
        let mut death_seen: Option<(u64, Instant)> = None;
        // Acquire: pairs with the release store in `close`.
        while !self.closed.load(Ordering::Acquire) {
            #[cfg(test)]
            self.watcher_passes.fetch_add(1, Ordering::Relaxed);
            let (first_block_ms, idle_wait_ms) = self.idle_waits();
            // A peer that died may have left an `shm` spin lock held, which catches whatever
            // thread takes it next — in a CQ read, a send or a read (module docs): look once,
            // `STUCK_AFTER` after the death was reported (its process has ended by then),
            // busy or not. Relaxed: `release_dead_peers_locks` reloads with acquire.
            let deaths = self.deaths.load(Ordering::Relaxed);
            if deaths != self.released_deaths.load(Ordering::Relaxed) {
                match death_seen {
                    Some((d, at)) if d == deaths => {
                        if at.elapsed() >= STUCK_AFTER {
                            self.release_dead_peers_locks();
                        }
                    }
                    _ => death_seen = Some((deaths, Instant::now())),
                }
            }
            if self.recently_active() {
                // Progress threads poll the CQs themselves while the rank is active (they
                // spin rather than park, see `any_frames`): stay out of their way, and poll
                // fast again as soon as the rank goes quiet (a thread may park then).
                self.sleep_while_active();
                sleep_us = MIN_SLEEP_US;
                block_ms = first_block_ms;
                held_since.fill(None);
                continue;
            }
            // Acquire: pairs with the Release in `refused` (whoever retries after the ring
            // sees what the refusal saw, and its waker registered before it).
            let refused = self.send_refused.swap(false, Ordering::Acquire);
            #[cfg(test)]
            while self.stall_watcher.load(Ordering::Relaxed) {
                self.watcher_stalled.store(true, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(1));
            }
            let staged = self.reap_all();
            // Reads in flight while every thread may be parked: advanced here, and a read
            // that is over wakes a thread to report it.
            let reading = self.reads.any();
            let read_done = reading && self.reads.advance(&self.rma_ep, |r| self.is_alive(r));
            // A CRI whose state lock this pass found held is looked at again within
            // `CQ_WAIT_MS`: it counts as stuck only when held at every look for
            // `STUCK_AFTER`, and two looks a long sleep apart would catch a lock that is
            // merely taken often (a thread spinning in `flush` takes it at every turn).
            let watching = self.watch_stuck(&mut held_since, &mut released_at);
            if refused {
                // A retry may succeed now: room, which also wakes the waiters for frames.
                self.doorbell.ring_room();
            } else if staged || read_done {
                self.doorbell.ring();
            }
            if staged || read_done {
                // Refusals alone keep backing off: a destination that stays full is retried
                // at most every millisecond, not every 10 µs.
                sleep_us = MIN_SLEEP_US;
                block_ms = first_block_ms;
            }
            // The rank's waiter, while a thread holds the role, sleeps on the lane's and the
            // CQs' descriptors itself (`waiter` module): the watcher then only keeps what
            // has no descriptor, on a timer.
            let waiter = self.waiter.is_taken();
            // Same-host senders wake this sleep through the lane's eventfd (lane docs,
            // *Waking the receiver*) unless the waiter sleeps on the lane: say so, then look
            // at the rings once more.
            let on_lane = !waiter && self.lane.as_ref().is_some_and(lane::Lane::fall_asleep);
            if on_lane && self.lane_waiting() {
                // The ring wakes the rank's parked threads, and a thread about to park looks
                // at the rings first: frames still there at the next pass wait for a thread
                // that is busy or not running. Ringing again at once would only take the
                // core it needs (each pass issues the lane's sleeper barrier, an IPI to every
                // CPU, module docs): the watcher naps, backing off to a millisecond while
                // frames keep waiting; a new frame ends the nap (its sender writes the
                // eventfd of a watcher that said it sleeps).
                self.doorbell.ring();
                poll_fds(std::iter::once(self.waiter.watcher_fd()), Duration::from_micros(lane_nap_us));
                lane_nap_us = (lane_nap_us * 2).min(LANE_WAITING_NAP_US);
                sleep_us = MIN_SLEEP_US;
            } else {
                lane_nap_us = MIN_SLEEP_US;
                let watcher_fd = self.waiter.watcher_fd();
                match &fds {
                    Some(fds) if !waiter && !refused && !reading && self.all_may_block() => {
                        if self.waiter.nap(false) {
                            let all = fds.iter().copied().chain(std::iter::once(watcher_fd));
                            // Everything a peer needs of this rank's progress is signalled
                            // on these after `fi_trywait` (module docs): the timeout is a
                            // safety net, which backs off while nothing comes.
                            let timeout = if watching { block_ms.min(CQ_WAIT_MS) } else { block_ms };
                            if !poll_fds(all, Duration::from_millis(timeout)) {
                                block_ms = (block_ms * 2).min(idle_wait_ms);
                            }
                        }
                    }
                    _ => {
                        // Whatever needs this rank's progress wakes the sleep where the lane
                        // reaches every rank (a push, or a nudge after a libfabric post): the
                        // timer is only a safety net then, except while sends are refused or
                        // reads are in flight, which nothing wakes; likewise where the waiter
                        // sleeps on the CQs' wait fds (module docs).
                        let longest = if refused || reading {
                            1000
                        } else if waiter && fds.is_some() {
                            idle_wait_ms * 1000
                        } else if self.lane.as_ref().is_some_and(lane::Lane::reaches_all) {
                            LANE_SLEEP_US
                        } else {
                            1000
                        };
                        let nap_us = if watching { sleep_us.min(CQ_WAIT_MS * 1000) } else { sleep_us };
                        if nap_us <= 1000 || self.waiter.nap(waiter) {
                            poll_fds(std::iter::once(watcher_fd), Duration::from_micros(nap_us));
                        }
                        sleep_us = (sleep_us * 2).min(longest);
                    }
                }
            }
            if let Some(l) = &self.lane {
                l.wake_up();
            }
            self.waiter.woke();
        }
    }

    /// The watcher's sleep while the rank is active: until the rank may first count as quiet
    /// ([`ACTIVE_MS`] after its last frame), or until a thread finds it quiet before then
    /// (`any_frames` ends the sleep through the watcher's `eventfd`: a thread may park
    /// next). Not a sleep of a millisecond at a time: on a host with more rank processes than
    /// cores, every rank's watcher waking each millisecond (8,000 wake-ups a second for 8
    /// ranks) put its waking thread on a CPU at each turn, and the kernel's load balancer,
    /// among those comings and goings, left the busy ranks unevenly spread (up to 7 of 8 on
    /// one of 2 cores, where the job's collectives wait for the slowest).
    ///
    /// The flag is set before the rank's activity is looked at again, and a thread reads it
    /// after it found the rank quiet: a thread that misses the flag found the rank quiet
    /// before the watcher looked, which then finds it quiet too (unless frames came between,
    /// and the rank is active again). At worst the sleep runs its [`ACTIVE_MS`].
    fn sleep_while_active(&self) {
        self.active_nap.store(true, Ordering::SeqCst);
        let watcher_fd = self.waiter.watcher_fd();
        if self.recently_active() {
            poll_fds(std::iter::once(watcher_fd), Duration::from_millis(self.active_nap_ms()));
        }
        self.active_nap.store(false, Ordering::Relaxed);
        // What ended the sleep, or a same-host sender's write from before the rank was active
        // (lane docs, *Waking the receiver*): drained, so that the next sleep sleeps.
        lane::drain(watcher_fd);
    }

    /// Ends the watcher's [`sleep_while_active`](Self::sleep_while_active), if it sleeps so:
    /// called by a thread that found the rank quiet.
    #[inline]
    fn end_active_nap(&self) {
        // A load first: the common answer (no such sleep) costs no read-modify-write.
        if self.active_nap.load(Ordering::SeqCst) && self.active_nap.swap(false, Ordering::SeqCst) {
            self.waiter.wake_watcher();
        }
    }

    /// How long the watcher sleeps through the rank's activity, in milliseconds:
    /// [`ACTIVE_MS`]; tests may set it longer.
    fn active_nap_ms(&self) -> u64 {
        #[cfg(test)]
        if let ms @ 1.. = self.active_nap_ms.load(Ordering::Relaxed) {
            return ms;
        }
        ACTIVE_MS
    }

    /// The watcher's first and longest block on the CQs' wait fds, in milliseconds:
    /// [`CQ_WAIT_MS`] and [`IDLE_WAIT_MS`]; tests may set both longer.
    fn idle_waits(&self) -> (u64, u64) {
        #[cfg(test)]
        if let ms @ 1.. = self.idle_wait_ms.load(Ordering::Relaxed) {
            return (ms, ms);
        }
        (CQ_WAIT_MS, IDLE_WAIT_MS)
    }

    /// The sleep of the rank's waiter (`waiter` module), for at most `timeout`: on its
    /// `eventfd` (its waker, same-host senders) and, where every CQ has a wait fd and
    /// `fi_trywait` allows, on those. Returns whether a wake-up source ended it (or frames
    /// were found before it began) rather than the timeout: the caller then progresses.
    fn waiter_sleep(&self, held: &waiter::Held<'_>, timeout: Duration) -> bool {
        // Say so to same-host senders, then look once more (lane docs, *Waking the
        // receiver*): at the rings, and at the CQs, whose read also serves what a same-host
        // peer posted to libfabric for this rank before it saw the waiter asleep (its nudge
        // woke nobody), as the watcher's pass before its sleep does. A CRI another thread
        // holds is that thread's to look at (it looks again before it parks).
        if let Some(l) = &self.lane {
            l.waiter_falls_asleep();
        }
        let waiting = self.cris.iter().enumerate().any(|(i, cri)| {
            cri.st.try_lock().is_some_and(|mut st| {
                self.reap(cri, &mut st);
                !st.staged.is_empty() || self.lane_has_frames(i, &st)
            })
        });
        if waiting {
            if let Some(l) = &self.lane {
                l.waiter_wakes_up();
            }
            return true;
        }
        let woke = if !self.cris.iter().all(|c| c.ep.cq().wait_fd().is_some()) {
            poll_fds(std::iter::once(held.fd()), timeout)
        } else if self.all_may_block() {
            let cqs = self.cris.iter().filter_map(|c| c.ep.cq().wait_fd());
            poll_fds(cqs.chain(std::iter::once(held.fd())), timeout)
        } else {
            // Completions wait in a CQ: the caller's progress pass reads them. A CQ that
            // keeps answering "poll" costs a pass per millisecond at most.
            poll_fds(std::iter::once(held.fd()), timeout.min(Duration::from_millis(1)));
            true
        };
        if let Some(l) = &self.lane {
            l.waiter_wakes_up();
        }
        lane::drain(held.fd());
        woke
    }

    /// Reads the CQ of the endpoint peers' one-sided operations target ([`RMA_TARGET_EP`]),
    /// if no other thread holds it: a software RMA of `shm` (atomics, small puts) waits in
    /// that endpoint's queue until a read of its CQ applies it, and the CRI's own thread may
    /// be computing, parked or off its core meanwhile. An idle poll of any other CRI of a rank
    /// with a window calls this, so whichever thread polls serves the rank's RMA; the frames
    /// the read stages stay for the CRI's next poll (its `ready` flag says so).
    #[cold]
    #[inline(never)]
    fn serve_rma_target(&self) {
        let c = &self.cris[RMA_TARGET_EP];
        if let Some(mut st) = c.st.try_lock() {
            self.reap(c, &mut st);
        }
    }

    /// Wakes `dst`'s watcher if it sleeps and the lane reaches it (see `lane::Lane::nudge`).
    #[inline]
    fn nudge(&self, dst: u32) {
        if let Some(l) = &self.lane {
            l.nudge(dst);
        }
    }

    /// Whether a same-host ring of a CRI nobody holds has a frame (the watcher's last look
    /// before it sleeps); a CRI someone holds is being polled.
    fn lane_waiting(&self) -> bool {
        self.cris.iter().enumerate().any(|(i, cri)| cri.st.try_lock().map_or(true, |st| self.lane_has_frames(i, &st)))
    }

    /// The watcher's look for stuck CRIs (module docs), once per pass while the rank is
    /// quiet: a CRI whose state lock was held at every pass for [`STUCK_AFTER`] — a thread
    /// caught inside libfabric holds it, perhaps one no other thread waits for — counts as
    /// stuck, and the spin locks a dead peer may have left held are released (at most once
    /// per [`STUCK_AFTER`]). A pass comes at most [`LANE_SLEEP_US`] or [`IDLE_WAIT_MS`] after
    /// the last, and within [`CQ_WAIT_MS`] while a CRI's lock was found held, so that a lock
    /// merely taken often is seen free at some look.
    /// Returns whether a CRI's state lock was found held (the watcher then looks again
    /// soon).
    fn watch_stuck(&self, held_since: &mut [Option<Instant>], released_at: &mut Option<Instant>) -> bool {
        let now = Instant::now();
        let mut stuck = false;
        for (cri, since) in self.cris.iter().zip(held_since.iter_mut()) {
            if !cri.st.is_locked() {
                *since = None;
            } else if now.duration_since(*since.get_or_insert(now)) >= STUCK_AFTER {
                // Relaxed: a hint, as in `lock_state_slow`.
                cri.stuck.store(true, Ordering::Relaxed);
                stuck = true;
            }
        }
        if stuck && released_at.map_or(true, |t| now.duration_since(t) >= STUCK_AFTER) {
            *released_at = Some(now);
            self.release_dead_peers_locks();
        }
        held_since.iter().any(Option::is_some)
    }

    /// Before closing: keeps reading the CQs until every send slot is free (bounded by
    /// [`DRAIN_LIMIT`]), then a few more passes, so frames a provider still buffers (rxm's
    /// queued injects) leave before the endpoints close.
    fn drain_sends(&self) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let deadline = Instant::now() + DRAIN_LIMIT;
        let mut quiet = 0;
        while quiet < 20 && Instant::now() < deadline {
            let mut busy = false;
            for cri in self.cris.iter() {
                // A stuck CRI is given up: its sends never complete.
                let Some(mut st) = self.lock_state(cri) else { continue };
                self.reap(cri, &mut st);
                busy |= st.free_send.len() < st.send_dst.len();
            }
            if busy {
                quiet = 0;
                std::thread::yield_now();
            } else {
                quiet += 1;
            }
        }
    }

    /// `fi_trywait` on every CRI CQ: whether blocking on the wait fds is safe now.
    fn all_may_block(&self) -> bool {
        self.cris.iter().all(|c| matches!(c.ep.cq().try_wait(), Ok(TryWait::Block)))
    }

    /// Progress for this rank while it waits on its own RMA: reads the CRIs' CQs (try-lock)
    /// so peers' reads of this rank complete, and rings the doorbell for staged frames.
    fn progress_while_waiting(&self) {
        if self.reap_all() {
            self.doorbell.ring();
        }
    }

    /// Removes the `/dev/shm` names of this rank's `shm` regions (one per endpoint) while
    /// the endpoints stay open: for a rank whose endpoints may not be closed (its launcher
    /// is gone, it is closed while the program keeps it, or its watcher is caught in
    /// libfabric), so that no file is left behind whenever the process ends. Mappings are unaffected; only a peer that has not mapped
    /// a region yet could not find it. Returns how many were removed.
    fn unlink_shm_regions(&self) -> usize {
        if self.provider != "shm" {
            return 0;
        }
        let pid = std::process::id();
        let names = self.cris.iter().map(|c| &c.ep).chain(std::iter::once(&self.rma_ep)).filter_map(|ep| shm_region_name(ep.name(), pid));
        names.filter(|n| std::fs::remove_file(format!("/dev/shm/{n}")).is_ok()).count()
    }
}

/// Blocks until one of `fds` is readable or `timeout` passes; returns whether one was.
/// Without allocating for up to [`POLL_FDS`] descriptors (a parked thread's sleep).
fn poll_fds(fds: impl Iterator<Item = i32>, timeout: Duration) -> bool {
    let mut local = [libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 }; POLL_FDS];
    let mut more = Vec::new();
    let mut n = 0;
    for fd in fds {
        match local.get_mut(n) {
            Some(p) => p.fd = fd,
            None => more.push(libc::pollfd { fd, events: libc::POLLIN, revents: 0 }),
        }
        n += 1;
    }
    let pfds = if more.is_empty() {
        &mut local[..n]
    } else {
        more.splice(0..0, local);
        &mut more[..]
    };
    let ts = libc::timespec { tv_sec: timeout.as_secs() as libc::time_t, tv_nsec: timeout.subsec_nanos() as libc::c_long };
    // SAFETY: `pfds` is a valid array of `len` pollfds (descriptors the caller keeps open
    // meanwhile) and `ts` a valid timeout.
    unsafe { libc::ppoll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, &ts, std::ptr::null()) > 0 }
}

/// The `/dev/shm` file name of an `shm` endpoint named `addr` (its `fi_getname`:
/// `fi_shm://<pid>:<uid>:<endpoint index>`, NUL-terminated) — only if it is a region of
/// process `pid`.
fn shm_region_name(addr: &[u8], pid: u32) -> Option<&str> {
    region_name_of(addr).filter(|n| is_region_of(n, pid))
}

/// The `/dev/shm` file name of the `shm` endpoint named `addr` (see [`shm_region_name`]),
/// whichever process it belongs to; `None` for any other address.
fn region_name_of(addr: &[u8]) -> Option<&str> {
    let end = addr.iter().position(|&b| b == 0).unwrap_or(addr.len());
    let name = std::str::from_utf8(&addr[..end]).ok()?;
    let name = name.strip_prefix("fi_shm://").unwrap_or(name);
    region_pid(name).map(|_| name)
}

/// Whether `name` is the name of an `shm` region of process `pid`: `<pid>:` followed by
/// one or more `:`-separated numbers (libfabric 1.17: `<pid>:<uid>:<endpoint index>`).
fn is_region_of(name: &str, pid: u32) -> bool {
    region_pid(name) == Some(pid)
}

/// The process an `shm` region file is named after (see [`is_region_of`]); `None` for a
/// file of any other shape.
fn region_pid(name: &str) -> Option<u32> {
    let mut parts = name.split(':');
    let pid = parts.next()?;
    let digits = |x: &str| !x.is_empty() && x.bytes().all(|b| b.is_ascii_digit());
    let mut rest = parts.peekable();
    if !digits(pid) || rest.peek().is_none() {
        return None;
    }
    rest.all(digits).then(|| pid.parse().ok()).flatten()
}

/// Removes the shared-memory regions libfabric's `shm` provider left in `/dev/shm` for
/// process `pid` — files named `<pid>:<uid>:<endpoint index>` (libfabric 1.17) — and
/// returns how many. A process killed by a signal cannot unlink its regions, and a later
/// process that gets the same pid then fails to enable its endpoints (`fi_enable`:
/// `EBUSY`). Call it only for a pid whose process is gone, or for the calling process before
/// it opens any region (`Opened::open` does, once per process) or as it exits (its `atexit`
/// hook; module docs, *Region names*); `weftrun` does for its ranks at the end.
pub fn remove_stale_shm_regions(pid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return 0 };
    dir.filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|n| is_region_of(n, pid)))
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Run by `exit`: removes the names of this process's `shm` regions still in `/dev/shm`.
/// Its ranks end with it: a peer that maps a region from then on would reach nobody.
extern "C" fn unlink_regions_at_exit() {
    remove_stale_shm_regions(std::process::id());
}

/// Removes every `shm` region in `/dev/shm` (named as in [`remove_stale_shm_regions`])
/// that belongs to this user and is named after a process that no longer runs — left by
/// processes killed before they could unlink them — and returns how many. A region whose
/// process still runs (a zombie does not: its memory is gone) is never touched, nor is
/// another user's, nor any other file. (`weftrun` calls it at start-up.)
///
/// The pid is looked up just before each removal; a new process that got the pid of a
/// dead one meanwhile would first remove its predecessor's regions itself (`Opened::open`)
/// and only then create its own, so the window in which this could remove a live region
/// is the few microseconds between that lookup and the removal. Processes of another pid
/// namespace that share this `/dev/shm` are invisible here and would count as gone: do not
/// run `weftrun` in a pid namespace of its own over a `/dev/shm` shared with other jobs.
pub fn remove_dead_shm_regions() -> usize {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/dev/shm") else { return 0 };
    // SAFETY: `geteuid` has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    dir.filter_map(Result::ok)
        .filter(|e| {
            let Some(pid) = e.file_name().to_str().and_then(region_pid) else { return false };
            let mine = e.metadata().is_ok_and(|m| m.uid() == me && m.is_file());
            mine && !process_runs(pid)
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Whether process `pid` exists in this pid namespace and is not a zombie.
fn process_runs(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let exists = unsafe { libc::kill(p, 0) } == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !exists {
        return false;
    }
    // `/proc/<pid>/stat`: `pid (comm) S ...`; the state follows the last `)`.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next()), Some('Z' | 'X')),
        // Reaped meanwhile, or no /proc: trust `kill`, which just saw it.
        Err(e) => e.kind() != std::io::ErrorKind::NotFound || !std::path::Path::new("/proc/self").exists(),
    }
}

/// One rank on libfabric. Created by [`Opened::connect`] or [`world`].
pub struct OfiRank {
    /// State shared with the watcher thread.
    inner: Arc<RankInner>,
    /// The watcher; joined by `close`.
    watcher: Mutex<Option<JoinHandle<()>>>,
    /// The bootstrap connection watching for lost peers; dropped (saying `BYE`) by `close`.
    monitor: Mutex<Option<crate::bootstrap::Monitor>>,
    /// The other ranks of an in-process [`world`], told by `close` that this one finished
    /// (the bootstrap's `FINISHED` between processes).
    siblings: Mutex<Vec<LossNotifier>>,
    /// The ranks on this host as the launcher told them ([`Opened::connect_on_host`]).
    host_ranks: Option<Box<[u32]>>,
}

impl std::fmt::Debug for OfiRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ofi_provider::OfiRank")
            .field("provider", &self.inner.provider)
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .field("cris", &self.inner.k)
            .finish_non_exhaustive()
    }
}

/// Where a transport-level RMA operation goes: a peer's registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteMem {
    /// The rank that registered the memory.
    pub rank: u32,
    /// Its address and key, as its [`OfiRank::register_window`] returned them.
    pub region: RemoteRegion,
}

impl OfiRank {
    /// The ranks on this host as the launcher told them (PMIx's `PMIX_LOCAL_PEERS`),
    /// ascending, this one included; `None` where it did not (the same-host lane then goes
    /// by the published host identities alone).
    pub fn host_ranks(&self) -> Option<&[u32]> {
        self.host_ranks.as_deref()
    }

    /// This rank.
    #[inline]
    pub fn rank(&self) -> u32 {
        self.inner.rank
    }

    /// Ranks of the job.
    #[inline]
    pub fn size(&self) -> u32 {
        self.inner.size
    }

    /// CRIs per rank.
    #[inline]
    pub fn num_cris(&self) -> usize {
        self.inner.k
    }

    /// Largest eager payload.
    pub fn eager_capacity(&self) -> usize {
        self.inner.eager_capacity
    }

    /// libfabric provider name.
    pub fn provider_name(&self) -> &str {
        &self.inner.provider
    }

    /// Whether this rank has the same-host lane (module docs): `false` when it was switched
    /// off (`OfiOptions::same_host_lane`).
    pub fn same_host_lane(&self) -> bool {
        self.inner.lane.is_some()
    }

    /// Ranks (this one included) this rank sends small frames to through the same-host
    /// lane (module docs); 0 without one.
    pub fn same_host_peers(&self) -> usize {
        self.inner.lane.as_ref().map_or(0, lane::Lane::peers)
    }

    /// Per rank of the job, a key of the host it runs on (its kernel's boot id and host
    /// name, hashed: equal on ranks of one host), as the ranks published them for the
    /// same-host lane (module docs); `None` where a rank published none (the lane switched
    /// off, or no segment could be made). The same on every rank of the job.
    pub fn host_keys(&self) -> Option<&[u64]> {
        self.inner.hosts.as_deref()
    }

    /// Sends one frame to CRI `dst_cri` of rank `dst`, from this rank's CRI of the same
    /// index. The payload is copied (the same-host lane's slot, inject, or a send slot):
    /// the caller's buffer is free when this returns.
    #[inline]
    pub fn send(&self, dst: u32, dst_cri: usize, header: &Header, data: &[u8]) -> Result<(), SendError> {
        let s = &*self.inner;
        if !s.is_alive(dst) {
            return Err(SendError::PeerLost);
        }
        // The eager capacity bounds the payload whatever header it travels behind.
        if data.len() > s.slot_size - WIRE_HEADER {
            return Err(SendError::Invalid("frame larger than the provider's eager capacity"));
        }
        // A CRI index is below the CRI count but for a peer with more CRIs than this rank:
        // no division on the common path.
        let c = if dst_cri < s.k { dst_cri } else { dst_cri % s.k };
        // A frame to a rank of this host that needs no address of a registration: the lane
        // alone, inlined into the caller. The rest (libfabric, and an `Rts` whatever its way)
        // out of line.
        if header.kind != FrameKind::Rts {
            if let Some(sent) = s.lane_send(dst, c, header, data) {
                return sent;
            }
        }
        self.send_frame(dst, c, *header, data)
    }

    /// [`send`](Self::send) past its checks: to CRI `c` (below the CRI count) of `dst`
    /// through the lane or libfabric, an `Rts` given its buffer's address first.
    #[inline(never)]
    fn send_frame(&self, dst: u32, c: usize, header: Header, data: &[u8]) -> Result<(), SendError> {
        let s = &*self.inner;
        let cri = &s.cris[c];
        let mut h = header;
        if h.kind == FrameKind::Rts {
            match s.regions.lock().get(&h.key) {
                // To a rank of this host, the address in this process even where libfabric
                // addresses by offset: the receiver may copy from it directly (module docs,
                // *Same-host lane*), and reads through libfabric by offset then.
                Some(mr) if !s.virt_addr && s.lane.as_ref().is_some_and(|l| l.reaches(dst)) => h.addr = mr.addr(),
                Some(mr) => h.addr = mr.remote().base,
                None => return Err(SendError::Invalid("rendezvous buffer is not registered")),
            }
            if let Some(sent) = s.lane_send(dst, c, &h, data) {
                return sent;
            }
        }
        let hlen = header_len(&h, data.len());
        let total = hlen + data.len();
        let to = s.addr(dst, c);
        // The CRI state lock, held only for a slot send: an inject copies the frame before it
        // returns and completes nothing, so the CRI's state (send slots, staging) is not
        // touched — the endpoint is thread-safe, and the runtime's CRI lock already orders a
        // thread's frames.
        let mut held = None;
        let res = if total <= SMALL_FRAME.min(s.inject_limit) {
            // Most frames (protocol frames, small messages): a buffer that costs nothing to
            // zero, rather than 4 KiB of memset per message.
            let mut buf = [0u8; SMALL_FRAME];
            write_frame(&h, hlen, data, &mut buf[..total]);
            cri.ep.inject(&buf[..total], to)
        } else if total <= s.inject_limit {
            let mut buf = [0u8; INJECT_MAX];
            write_frame(&h, hlen, data, &mut buf[..total]);
            cri.ep.inject(&buf[..total], to)
        } else {
            let Some(st) = s.lock_state(cri) else {
                // Stuck (module docs): refused, as when every slot is in use.
                return Err(s.refused());
            };
            let st = held.insert(st);
            let slot = match st.free_send.pop() {
                Some(slot) => slot,
                None => {
                    s.reap(cri, st);
                    match st.free_send.pop() {
                        Some(slot) => slot,
                        None => return Err(s.refused()),
                    }
                }
            };
            let p = cri.send_mem.slot(slot as usize, s.slot_size);
            // SAFETY: the slot is free (no send posted on it), so nothing else uses it.
            let buf = unsafe { std::slice::from_raw_parts_mut(p, total) };
            write_frame(&h, hlen, data, buf);
            // SAFETY: the slot stays untouched until the send's completion frees it
            // (`complete`/`failed`), and allocated until the endpoint closes.
            let r = unsafe { cri.ep.send(buf, None, to, CTX_SEND | slot as u64) };
            match r {
                Ok(Post::Posted) => st.send_dst[slot as usize] = dst,
                _ => st.free_send.push(slot),
            }
            r
        };
        match res {
            Ok(Post::Posted) => {
                RankInner::note_activity(cri);
                s.nudge(dst);
                Ok(())
            }
            Ok(Post::WouldBlock) => {
                // Drive the provider (and free send slots) before the caller retries.
                if let Some(mut st) = held.or_else(|| cri.st.try_lock()) {
                    s.reap(cri, &mut st);
                }
                Err(s.refused())
            }
            Err(_) => {
                drop(held);
                s.mark_died(dst);
                Err(SendError::PeerLost)
            }
        }
    }

    /// Hands up to `max` received frames of CRI `cri` to `f`; returns how many. `f` runs
    /// under the CRI's state lock (one acquisition per call, not per frame): it must not
    /// send or poll on this rank — the runtime only collects the frames in it.
    #[inline]
    pub fn poll(&self, cri: usize, max: usize, f: impl FnMut(Frame)) -> usize {
        self.poll_with(cri, max, f)
    }

    /// [`poll`](Self::poll) appending the frames to `frames`, each decoded where it will
    /// lie (room for the batch is made first: nothing is allocated once `frames` has it).
    #[inline]
    pub fn poll_into(&self, cri: usize, max: usize, frames: &mut Vec<Frame>) -> usize {
        frames.reserve(max);
        // SAFETY: `reserve` made room for `max` more and `poll_with` hands out at most `max`.
        self.poll_with(cri, max, |frame| unsafe { Frame::append_in_place(frames, |slot| slot.write(frame)) })
    }

    /// [`poll`](Self::poll), inlined into each caller with its `f`: the same-host rings'
    /// frames are decoded straight into what `f` does with them.
    #[inline(always)]
    fn poll_with(&self, cri: usize, max: usize, mut f: impl FnMut(Frame)) -> usize {
        let s = &*self.inner;
        let c = &s.cris[cri];
        let mut n = 0;
        // Read the CQ at most once, and only when nothing was staged for this call (by
        // `has_frames` or the watcher): a poll that drains what it found leaves later
        // arrivals to the next pass, which saves one `fi_cq_read` (~40 ns on shm) per
        // message on the latency path.
        let mut read_cq = !c.ready.load(Ordering::Relaxed);
        let Some(mut st) = s.lock_state(c) else {
            // Stuck (module docs): nothing can be taken from this CRI now.
            return 0;
        };
        // The same-host rings first. While they deliver, the CQ (whose read costs about as
        // much as the rest of a message's receive path) is read only every `LANE_CQ_EVERY`th
        // poll: frames through libfabric (larger frames, other hosts) then wait a few polls,
        // and the provider's progress runs at that pace.
        if let Some(lane) = &s.lane {
            n += lane.poll(cri, &mut st.heads, max, |slot, len| {
                if let Some(frame) = s.frame_from(slot, len) {
                    f(frame);
                }
            });
            if n > 0 {
                st.lane_polls = st.lane_polls.wrapping_add(1);
                read_cq &= st.lane_polls % LANE_CQ_EVERY == 0;
            }
        }
        while n < max {
            let read = std::mem::replace(&mut read_cq, false);
            match s.next_frame(c, &mut st, read) {
                Some(frame) => {
                    f(frame);
                    n += 1;
                }
                None => break,
            }
        }
        if n > 0 {
            RankInner::note_activity(c);
        }
        drop(st);
        if n == 0 && cri != RMA_TARGET_EP && s.rma_exposed.load(Ordering::Relaxed) {
            s.serve_rma_target();
        }
        n
    }

    /// Whether CRI `cri` has frames (reads its CQ; `true` if another thread is on it).
    #[inline]
    pub fn has_frames(&self, cri: usize) -> bool {
        let s = &*self.inner;
        let c = &s.cris[cri];
        if c.ready.load(Ordering::Relaxed) {
            return true;
        }
        match c.st.try_lock() {
            Some(mut st) => {
                s.lane_has_frames(cri, &st) || {
                    s.reap(c, &mut st);
                    !st.staged.is_empty()
                }
            }
            // Another thread is on it, and will stage what it finds — unless it is stuck
            // (module docs): then nothing will come from this CRI, and a waiter may park.
            None => !c.stuck.load(Ordering::Relaxed),
        }
    }

    /// Whether any CRI has frames, or rendezvous reads that are over wait to be reported
    /// ([`poll_reads`](Self::poll_reads)) — or the rank was active in the last few
    /// milliseconds, so that progress threads keep polling instead of parking while traffic
    /// flows.
    pub fn any_frames(&self) -> bool {
        // The clock first: during traffic it answers without reading any CQ.
        if self.inner.recently_active() {
            return true;
        }
        // Quiet: the caller may park next, and the watcher, asleep through the activity,
        // covers the rank's descriptors again from now on.
        self.inner.end_active_nap();
        self.inner.reads.any_finished() || (0..self.inner.k).any(|k| self.has_frames(k))
    }

    /// Gives a consumed payload's buffer back to this rank's pool.
    #[inline]
    pub fn recycle(&self, payload: Payload) {
        if let Payload::Pooled(buf) = payload {
            let _ = self.inner.pool.push(buf);
        }
    }

    /// Rung when the watcher finds frames while threads may be parked.
    pub fn doorbell(&self) -> &Doorbell {
        &self.inner.doorbell
    }

    /// The rank's waiter role, if no other thread holds it: its holder sleeps on what wakes
    /// the rank itself (module docs, *Polling, staging and parking*).
    #[inline]
    pub fn take_waiter(&self) -> Option<FdWaiter<'_>> {
        self.inner.waiter.take().map(|held| FdWaiter { rank: &self.inner, held })
    }

    /// Registers `len` bytes at `ptr` for remote reads; returns the key for `Rts` frames.
    ///
    /// # Safety
    /// The memory must stay valid and unmodified until [`deregister`](Self::deregister).
    pub unsafe fn register(&self, ptr: *const u8, len: usize) -> Result<u64, Error> {
        let ptr = NonNull::new(ptr.cast_mut()).ok_or(Error::InvalidArgument("cannot register a null buffer"))?;
        // SAFETY: forwarded contract: valid until deregistered; peers only read it.
        let mr = unsafe { MemoryRegion::register(&self.inner.domain, ptr, len, MrAccess::REMOTE_READ) }.map_err(|e| transport_error(&e))?;
        let key = mr.key();
        self.inner.regions.lock().insert(key, mr);
        Ok(key)
    }

    /// Registers memory for transport-level RMA (read, write, atomics by peers) and returns
    /// what peers need to target it.
    ///
    /// # Safety
    /// The memory must stay valid until [`deregister`](Self::deregister), and Rust code must
    /// not hold references into it while peers may write it.
    pub unsafe fn register_window(&self, ptr: *mut u8, len: usize) -> Result<RemoteRegion, Error> {
        let ptr = NonNull::new(ptr).ok_or(Error::InvalidArgument("cannot register a null buffer"))?;
        // SAFETY: forwarded contract.
        let mr = unsafe { MemoryRegion::register(&self.inner.domain, ptr, len, MrAccess::ALL) }.map_err(|e| transport_error(&e))?;
        let remote = mr.remote();
        self.inner.regions.lock().insert(remote.key, mr);
        self.inner.rma_exposed.store(true, Ordering::Relaxed);
        Ok(remote)
    }

    /// Ends the registration `key` of a window whose owner ended its part (module docs, *A
    /// window's end*): kept, with `memory` (the window's own), among the rank's retired
    /// registrations, so that a peer's access racing with the end lands in memory nobody
    /// uses; beyond [`RETIRED_BYTES`] the oldest are deregistered and freed. Without
    /// `memory` (the window borrowed it) the registration is removed at once.
    pub fn retire_window(&self, key: u64, memory: Option<Box<[u64]>>) {
        let s = &*self.inner;
        let mr = s.regions.lock().remove(&key);
        let (Some(mr), Some(memory)) = (mr, memory) else { return };
        let mut r = s.retired.lock();
        r.bytes += memory.len() * 8;
        r.kept.push_back((mr, memory));
        while r.bytes > RETIRED_BYTES {
            let Some((old_mr, old)) = r.kept.pop_front() else { break };
            r.bytes -= old.len() * 8;
            // Deregistered before its memory is freed.
            drop(old_mr);
            drop(old);
        }
    }

    /// Removes a registration (by key).
    pub fn deregister(&self, key: u64) {
        self.inner.regions.lock().remove(&key);
    }

    /// Copies `data` straight to address `to` in the process of rank `dst`, where the
    /// same-host lane reaches it (`process_vm_writev`). `None`: it does not (or the kernel
    /// refused), nothing was written: the caller sends the data instead.
    ///
    /// # Safety
    /// `to..to + data.len()` in `dst`'s process must be memory that rank lent for this write
    /// and neither reads nor writes meanwhile.
    pub unsafe fn write_direct(&self, dst: u32, to: u64, data: &[u8]) -> Option<Result<(), Error>> {
        let s = &*self.inner;
        if dst >= s.size || !s.is_alive(dst) {
            return None;
        }
        // SAFETY: forwarded contract.
        unsafe { s.lane.as_ref()?.write(dst, to, data) }
    }

    /// Starts the rendezvous read of the buffer the `Rts` header `h` names into the `len`
    /// bytes at `dst` (module docs, *Rendezvous*): posts the chunks that fit and returns.
    /// [`ReadStart::InFlight`]: a later [`poll_reads`](Self::poll_reads) reports its end
    /// with `token`; [`ReadStart::Done`]: nothing to read (`len` 0). An error here (the rank
    /// out of range, already lost) means nothing was posted.
    ///
    /// # Safety
    /// `dst..dst + len` must be valid for writes and neither read nor written by anyone else
    /// until the read is reported (or this rank is dropped); `token` must differ from that
    /// of every other read not yet reported.
    pub unsafe fn start_read(&self, h: &Header, dst: *mut u8, len: usize, token: u64) -> Result<ReadStart, Error> {
        let s = &*self.inner;
        let src = h.source;
        if src >= s.size {
            return Err(Error::RankOutOfRange { rank: src, size: s.size });
        }
        if len == 0 {
            return Ok(ReadStart::Done);
        }
        if !s.is_alive(src) {
            return Err(Error::PeerLost { rank: src });
        }
        if h.addr != 0 {
            if let Some(lane) = &s.lane {
                // SAFETY: forwarded contract (`dst..dst + len` is ours until the read is over,
                // which it is when this returns `Some`).
                if let Some(r) = unsafe { lane.read(src, h.addr, dst, len) } {
                    return r.map(|()| ReadStart::Done);
                }
            }
        }
        let from = reads::ReadFrom {
            token,
            src,
            // The sender's CRI endpoint: the one it progresses while it waits for the `Fin`.
            target: s.addr(src, h.src_cri as usize % s.k),
            // With offset addressing a non-zero address is the sender's own, for the lane.
            remote: RemoteRegion { base: if s.virt_addr { h.addr } else { 0 }, key: h.key, len: len as u64 },
            chunk: s.max_msg.min(READ_CHUNK),
        };
        // SAFETY: forwarded contract; the RMA endpoint is closed before `RankInner` is freed.
        unsafe { s.reads.start(&s.rma_ep, from, dst, len) };
        s.nudge(src);
        Ok(ReadStart::InFlight)
    }

    /// Advances the rendezvous reads in flight (reads the RMA endpoint's completions, posts
    /// the chunks that now fit: bounded work) and hands up to `max` of those that are over to
    /// `f` — their token and `Ok`, or the error: `PeerLost` when the peer was lost, or is
    /// found lost within 3 s of the failure — after every lock is
    /// released; returns how many. One atomic load when no read is in flight. Never waits:
    /// a pass another thread is making is left to it.
    #[inline]
    pub fn poll_reads(&self, max: usize, f: impl FnMut(u64, Result<(), Error>)) -> usize {
        let s = &*self.inner;
        let n = s.reads.poll(&s.rma_ep, |r| s.is_alive(r), max, f);
        if n > 0 {
            s.touch();
        }
        n
    }

    /// Transport-level RMA write of `data` to `offset` of `to`'s region, posted on CRI
    /// `cri` and counted by its counter; completes at the next [`flush`](Self::flush).
    ///
    /// # Safety
    /// `data` must stay valid and unmodified until `flush(cri)` returned.
    pub unsafe fn put(&self, cri: usize, to: &RemoteMem, offset: u64, data: &[u8]) -> Result<(), Error> {
        let delivered = self.inner.rma_delivered;
        self.rma_post(cri, to, |ep, dest| {
            // SAFETY: forwarded contract of `put`.
            unsafe { ep.write(data, None, dest, &to.region, offset, 0, delivered) }
        })
    }

    /// Transport-level RMA read into `out` from `offset` of `from`'s region, on CRI `cri`;
    /// the data is there after the next [`flush`](Self::flush).
    ///
    /// # Safety
    /// `out` must stay valid and untouched until `flush(cri)` returned.
    pub unsafe fn get(&self, cri: usize, from: &RemoteMem, offset: u64, out: &mut [u8]) -> Result<(), Error> {
        self.rma_post(cri, from, |ep, src| {
            // SAFETY: forwarded contract of `get`.
            unsafe { ep.read(out, None, src, &from.region, offset, 0) }
        })
    }

    /// Atomic fetch-and-op on the `u64` at `offset` of `at`'s region; returns the old value.
    /// Blocking (the result is needed).
    pub fn fetch_op(&self, cri: usize, at: &RemoteMem, offset: u64, op: FetchOp, operand: u64) -> Result<u64, Error> {
        self.atomic(cri, at, operand, |ep, dest, operand, r| {
            // SAFETY: the operand and the result's slot live until the operation completed
            // (`atomic`).
            unsafe { ep.fetch_atomic_u64(op, operand, &mut *r, dest, &at.region, offset, 0) }
        })
    }

    /// Atomic compare-and-swap on the `u64` at `offset` of `at`'s region; returns the old
    /// value (the swap happened if it equals `compare`). Blocking.
    pub fn compare_swap(&self, cri: usize, at: &RemoteMem, offset: u64, compare: u64, swap: u64) -> Result<u64, Error> {
        self.atomic(cri, at, [compare, swap], |ep, dest, [compare, swap], r| {
            // SAFETY: as in `fetch_op`.
            unsafe { ep.compare_swap_u64(compare, swap, &mut *r, dest, &at.region, offset, 0) }
        })
    }

    /// Posts on CRI `cri` the atomic that `post` makes of `operands` and a slot for its
    /// result, and waits for it. Operands and slot are on the heap: a flush that failed
    /// leaves the operation in flight, where libfabric may still read the operands and write
    /// the result (the answer of a rank lost after it served the operation, read by a later
    /// progress), so they are then kept, never freed.
    fn atomic<O>(
        &self,
        cri: usize,
        at: &RemoteMem,
        operands: O,
        post: impl Fn(&Endpoint, FiAddr, &O, *mut u64) -> Result<Post, OfiError>,
    ) -> Result<u64, Error> {
        let slots = Box::into_raw(Box::new((operands, 0u64)));
        // SAFETY: `slots` is valid until freed below, and only libfabric writes the result
        // until the operation completed.
        let (operands, result) = unsafe { (&(*slots).0, &raw mut (*slots).1) };
        if let Err(e) = self.rma_post(cri, at, |ep, dest| post(ep, dest, operands, result)) {
            // Nothing posted.
            // SAFETY: from `Box::into_raw` above, no longer used.
            drop(unsafe { Box::from_raw(slots) });
            return Err(e);
        }
        self.flush(cri)?;
        // SAFETY: from `Box::into_raw` above; the operation completed.
        Ok(unsafe { Box::from_raw(slots) }.1)
    }

    fn rma_post(&self, cri: usize, to: &RemoteMem, mut post: impl FnMut(&Endpoint, FiAddr) -> Result<Post, OfiError>) -> Result<(), Error> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.rma_try_post(cri, to, &mut post)? {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Transport { op: "rma", code: crate::ofi::errno::FI_EAGAIN });
            }
            std::thread::yield_now();
        }
    }

    /// One try of [`rma_post`](Self::rma_post): whether `post` posted the operation on CRI
    /// `cri` (counted for its flush); `false` if the CRI counts as stuck or the provider
    /// refused for now (the CRI's CQ is read then, which progresses what the refusal waits
    /// for: on `shm` a handshake, on `tcp;ofi_rxm` a connection).
    fn rma_try_post(
        &self,
        cri: usize,
        to: &RemoteMem,
        post: &mut impl FnMut(&Endpoint, FiAddr) -> Result<Post, OfiError>,
    ) -> Result<bool, Error> {
        let s = &*self.inner;
        let c = s.cris.get(cri).ok_or(Error::InvalidArgument("CRI index out of range"))?;
        if to.rank >= s.size {
            return Err(Error::RankOutOfRange { rank: to.rank, size: s.size });
        }
        if c.ep.rma_counter().is_none() {
            return Err(Error::Transport { op: "rma", code: crate::ofi::errno::FI_EOPNOTSUPP });
        }
        if !s.is_alive(to.rank) {
            return Err(Error::PeerLost { rank: to.rank });
        }
        let Some(mut st) = s.lock_state(c) else { return Ok(false) };
        if let Some(rank) = st.rma_blocked_by {
            return Err(Error::PeerLost { rank });
        }
        match post(&c.ep, s.addr(to.rank, RMA_TARGET_EP)) {
            Ok(Post::Posted) => {
                st.rma_issued += 1;
                if !st.rma_targets.contains(&to.rank) {
                    st.rma_targets.push(to.rank);
                }
                drop(st);
                // The target's progress serves `shm` atomics.
                s.nudge(to.rank);
                Ok(true)
            }
            Ok(Post::WouldBlock) => {
                #[cfg(test)]
                s.rma_refusals.fetch_add(1, Ordering::Relaxed);
                s.reap(c, &mut st);
                Ok(false)
            }
            Err(e) => Err(transport_error(&e)),
        }
    }

    /// Reaches the RMA target endpoint of each rank of `ranks` from every CRI of this rank,
    /// once per rank: a one-byte read of each rank's probe (module docs) from each CRI, then
    /// a flush of it. For window creation, while every rank progresses (its collective): an
    /// endpoint's first operation to a peer's endpoint waits for the peer's progress of that
    /// endpoint — on `shm` it is refused (`FI_EAGAIN`) until the peer answered a handshake,
    /// on `tcp;ofi_rxm` it waits until the peer accepted the connection — and a rank's
    /// threads attend their own CRIs, which are mostly not the RMA target endpoint (CRI 0):
    /// a first one-sided operation from such a CRI to a peer busy elsewhere (spinning on a
    /// lock) waits for the peer's watcher. The pairs are posted side by side (on `shm`, 2-3
    /// ranks of 2 CRIs: 0.3 ms median where one pair after the other took 17 ms). The
    /// probe, not the window being created: a peer may drop its part of that window as soon
    /// as it has left the collective (an error right after the creation); a read of a
    /// removed registration fails on `shm`, leaving the pair unreached, and is never
    /// answered on `tcp;ofi_rxm` (the peer's provider drops the connection: the flush waited
    /// out its deadline). Lost ranks are skipped; a failure (a peer lost meanwhile) leaves
    /// the ranks unreached, and their operations report it.
    ///
    /// Only on `shm`. On `tcp;ofi_rxm` each (CRI, rank) pair is a connection set up through
    /// both ranks' connection managers: reaching took 30-100 ms per rank at a job's first
    /// window (2 ranks of 2 CRIs, 2 loaded cores; up to 0.3 s where two ranks connected to
    /// each other at once), and would hold `2 x ranks x CRIs` sockets per rank whether or
    /// not its threads ever target those ranks. A first operation to a parked `tcp` rank is
    /// served without it: the rank's waiter or watcher blocks on its CQs' wait fds, which
    /// hold the connection manager's listening socket (module docs).
    pub fn reach_rma_targets(&self, ranks: &[u32]) -> Result<(), Error> {
        let s = &*self.inner;
        if s.provider != "shm" {
            return Ok(());
        }
        let mut reached = s.rma_reached.lock();
        reached.resize(s.size as usize, false);
        let new: Vec<RemoteMem> = ranks
            .iter()
            .filter(|&&r| s.is_alive(r) && !reached.get(r as usize).copied().unwrap_or(true))
            .map(|&rank| RemoteMem { rank, region: s.probes[rank as usize] })
            .filter(|t| t.region.len > 0)
            .collect();
        if new.is_empty() || s.cris[0].ep.rma_counter().is_none() {
            return Ok(());
        }
        // A byte per (CRI, rank) pair, pair `i` = CRI `i / n`, rank `new[i % n]`; the pairs
        // not posted yet. Each pass tries every pair once: the first posts of the pairs
        // (connections on `tcp;ofi_rxm`, handshakes on `shm`) proceed side by side instead of
        // one after the other.
        let n = new.len();
        let mut out = vec![0u8; n * s.cris.len()];
        let mut pending: Vec<usize> = (0..out.len()).collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        let posted = loop {
            let mut failed = None;
            let base = out.as_mut_ptr();
            pending.retain(|&i| {
                if failed.is_some() {
                    return true;
                }
                let t = &new[i % n];
                // SAFETY: `i < out.len()`, and each pair's byte is handed to one read only.
                let b = unsafe { std::slice::from_raw_parts_mut(base.add(i), 1) };
                // SAFETY: `out` lives until the flushes below returned (or is leaked).
                let read = &mut |ep: &Endpoint, src| unsafe { ep.read(b, None, src, &t.region, 0, 0) };
                match self.rma_try_post(i / n, t, read) {
                    Ok(done) => !done,
                    Err(e) => {
                        failed = Some(e);
                        true
                    }
                }
            });
            if let Some(e) = failed {
                break Err(e);
            }
            if pending.is_empty() {
                break Ok(());
            }
            if Instant::now() > deadline {
                break Err(Error::Transport { op: "rma", code: crate::ofi::errno::FI_EAGAIN });
            }
            // Peers reach this rank meanwhile: their connections and handshakes need its
            // progress too.
            s.progress_while_waiting();
            std::thread::yield_now();
        };
        if let Err(e) = posted.and_then(|()| (0..s.cris.len()).try_for_each(|k| self.flush(k))) {
            // Reads may still be in flight: their buffer is never freed.
            std::mem::forget(out);
            return Err(e);
        }
        for t in new {
            reached[t.rank as usize] = true;
        }
        Ok(())
    }

    /// Waits until every transport-level RMA operation posted on CRI `cri` has completed
    /// (its counter reached the number issued). Fails if one of them failed, and with
    /// `PeerLost` if one of them went to a rank lost since, which libfabric never completes
    /// (module docs, *A one-sided operation to a lost rank*).
    pub fn flush(&self, cri: usize) -> Result<(), Error> {
        let s = &*self.inner;
        let c = s.cris.get(cri).ok_or(Error::InvalidArgument("CRI index out of range"))?;
        let Some(counter) = c.ep.rma_counter() else { return Ok(()) };
        let deadline = Instant::now() + Duration::from_secs(60);
        // A CRI counted stuck may only be slow (its holder descheduled on a loaded machine):
        // as the posts, the flush retries until its deadline rather than failing at once —
        // an operation it reported failed may still have been applied at its target.
        let (issued, written_off) = loop {
            if let Some(st) = s.lock_state(c) {
                break (st.rma_issued, st.rma_written_off);
            }
            if Instant::now() > deadline {
                return Err(Error::Transport { op: "rma flush", code: crate::ofi::errno::FI_EAGAIN });
            }
            std::thread::yield_now();
        };
        let awaited = issued - written_off;
        // Once a target is known lost: the count then, and since when it has not moved.
        let mut lost: Option<(u32, u64, Instant)> = None;
        // The lost epoch at the last look for a lost target: the targets are looked at again
        // only when a rank is newly lost (none can be added while this flush waits: a post
        // to a lost rank is refused).
        let mut looked = 0;
        loop {
            let errs = counter.read_err();
            let done = counter.read() + errs;
            if done >= awaited {
                // Unless another thread posted since the flush began, every operation
                // counted is complete: none can be at a rank lost later. Only if the state
                // is free at once (the list is only looked at once a rank is lost).
                if let Some(mut st) = c.st.try_lock() {
                    if done >= st.rma_issued - st.rma_written_off {
                        st.rma_targets.clear();
                    }
                }
                return if errs > 0 { Err(Error::Transport { op: "rma", code: crate::ofi::errno::FI_EINVAL }) } else { Ok(()) };
            }
            let epoch = s.lost_epoch.load(Ordering::Acquire);
            lost = match lost {
                Some((rank, at, since)) if at == done => {
                    if since.elapsed() >= LOST_RMA_SETTLED {
                        return Err(self.write_off_rma(c, rank, awaited - done));
                    }
                    Some((rank, at, since))
                }
                Some((rank, ..)) => Some((rank, done, Instant::now())),
                None if epoch != looked => s.lock_state(c).and_then(|st| {
                    looked = epoch;
                    st.rma_targets.iter().copied().find(|&r| !s.is_alive(r)).map(|r| (r, done, Instant::now()))
                }),
                None => None,
            };
            s.progress_while_waiting();
            if Instant::now() > deadline {
                return Err(Error::Transport { op: "rma flush", code: crate::ofi::errno::FI_EAGAIN });
            }
            std::thread::yield_now();
        }
    }

    /// Gives up on the `outstanding` operations of CRI `c` that a flush waited for once a
    /// target of them, `rank`, is lost and the count settled (module docs, *A one-sided
    /// operation to a lost rank*): later flushes wait for the operations after them only.
    /// Returns the flush's error.
    #[cold]
    fn write_off_rma(&self, c: &CriEndpoint, rank: u32, outstanding: u64) -> Error {
        let s = &*self.inner;
        if let Some(mut st) = s.lock_state(c) {
            st.rma_written_off += outstanding;
            st.rma_targets.retain(|&r| s.is_alive(r));
            if s.provider == "shm" {
                st.rma_blocked_by.get_or_insert(rank);
                // Relaxed: a hint for choosing a CRI; the state lock orders the refusal.
                c.rma_blocked.store(true, Ordering::Relaxed);
            }
        }
        Error::PeerLost { rank }
    }

    /// Whether CRI `cri` refuses one-sided operations: on `shm`, since operations of it
    /// to a lost rank were given up (module docs, *A one-sided operation to a lost rank*).
    pub fn rma_blocked(&self, cri: usize) -> bool {
        self.inner.cris.get(cri).is_some_and(|c| c.rma_blocked.load(Ordering::Relaxed))
    }

    /// Whether rank `r` is not known to be lost.
    pub fn is_alive(&self, r: u32) -> bool {
        self.inner.is_alive(r)
    }

    /// Marks rank `r` lost: sends and reads to it fail with `PeerLost` from now on, the
    /// lost epoch changes and every parked thread is woken.
    pub fn mark_lost(&self, r: u32) {
        self.inner.mark_lost(r);
    }

    /// Changes whenever a peer is newly lost.
    #[inline]
    pub fn lost_epoch(&self) -> u64 {
        // Acquire: pairs with the release increment in `mark_lost`.
        self.inner.lost_epoch.load(Ordering::Acquire)
    }

    /// A handle the bootstrap's monitor uses to mark peers lost without owning the rank.
    pub fn loss_notifier(&self) -> LossNotifier {
        LossNotifier { inner: Arc::downgrade(&self.inner) }
    }

    /// Keeps the job's bootstrap monitor (see [`crate::bootstrap::Job::monitor`]) until
    /// [`close`](Self::close).
    pub fn set_monitor(&self, m: crate::bootstrap::Monitor) {
        *self.monitor.lock() = Some(m);
    }

    /// Tests: takes the spin lock of CRI `cri`'s `shm` region and keeps it, as a peer
    /// killed while it queues a command for that endpoint leaves it (module docs, *A CRI
    /// stuck in libfabric*): the next thread that reads the CRI's CQ is caught spinning.
    /// `false` (nothing done) off `shm` or with a libfabric whose region layout weft does
    /// not know.
    #[doc(hidden)]
    pub fn wedge_cri_as_a_dead_peer(&self, cri: usize) -> bool {
        match &self.inner.cris[cri % self.inner.k].region_lock {
            Some(l) => {
                l.hold_as_a_dead_peer();
                true
            }
            None => false,
        }
    }

    /// Tests: holds CRI `cri`'s state lock from a thread of its own, as a thread caught
    /// inside `fi_cq_read` does (module docs, *A CRI stuck in libfabric*), until the
    /// returned guard is dropped. Returns once the lock is held.
    #[doc(hidden)]
    pub fn hold_cri_state(&self, cri: usize) -> CriStateHold {
        let inner = self.inner.clone();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let _st = inner.cris[cri % inner.k].st.lock();
            let _ = held_tx.send(());
            // Until the guard is dropped (its sender with it).
            let _ = wait.recv();
        });
        let _ = held_rx.recv();
        CriStateHold { release: Some(release), thread: Some(thread) }
    }

    /// Stops the watcher and says `BYE` to the job (or, in an in-process [`world`], tells
    /// the other ranks directly): their receives that only this rank could match fail once
    /// they have what it sent. Endpoints close when the rank is dropped.
    ///
    /// Bounded whatever libfabric does: stuck CRIs are not drained, and a watcher that has
    /// not stopped [`STUCK_AFTER`] after it was told to is caught inside libfabric (module
    /// docs) and left behind, keeping the rank's endpoints and buffers (it shares them)
    /// until the process exits. The rank's `shm` region names are removed in any case.
    pub fn close(&self) {
        self.inner.drain_sends();
        drop(self.monitor.lock().take());
        // After the last frames left, as `BYE` is.
        for s in self.siblings.lock().drain(..) {
            s.lost(self.inner.rank);
        }
        // Release: pairs with the watcher's acquire load.
        self.inner.closed.store(true, Ordering::Release);
        self.inner.waiter.wake_watcher();
        if let Some(w) = self.watcher.lock().take() {
            if w.thread().id() != std::thread::current().id() {
                // It checks `closed` at least every 10 ms between CQ reads (its eventfd,
                // written above, ends a longer sleep).
                let deadline = Instant::now() + STUCK_AFTER;
                while !w.is_finished() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                if w.is_finished() {
                    let _ = w.join();
                } else {
                    // Detached: it owns a reference to `inner`, which is never freed while
                    // it may still be inside libfabric.
                    drop(w);
                }
            }
        }
        // The names of the rank's `shm` regions go now, not when its endpoints close: a
        // closed rank is gone to its peers (they have mapped what they use of it), and its
        // endpoints may never close — a watcher caught in libfabric keeps them, as does a
        // handle of the rank the program keeps (a lost rank's lock in the tests) — so that no
        // file stays behind in `/dev/shm` when the process ends.
        self.inner.unlink_shm_regions();
        self.inner.doorbell.ring_all();
    }
}

/// The rank's waiter role, held ([`OfiRank::take_waiter`]); given back when dropped.
pub struct FdWaiter<'a> {
    rank: &'a RankInner,
    held: waiter::Held<'a>,
}

impl std::fmt::Debug for FdWaiter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdWaiter").field("rank", &self.rank.rank).finish_non_exhaustive()
    }
}

impl FdWaiter<'_> {
    /// The waker that ends [`sleep`](Self::sleep): poll the listeners the sleep is to end
    /// for with it (it writes the waiter's `eventfd`).
    #[inline]
    pub fn waker(&self) -> &std::task::Waker {
        self.held.waker()
    }

    /// Sleeps until the waker is woken, a same-host sender pushes a frame, a CQ has a
    /// completion (where every CQ has a wait fd), or `timeout` passes. Returns `false` for
    /// the timeout alone; `true` means progress may find work.
    pub fn sleep(&self, timeout: Duration) -> bool {
        self.rank.waiter_sleep(&self.held, timeout)
    }
}

impl Drop for OfiRank {
    fn drop(&mut self) {
        self.close();
    }
}

/// A CRI state lock held by [`OfiRank::hold_cri_state`] (tests); released when dropped.
#[doc(hidden)]
#[derive(Debug)]
pub struct CriStateHold {
    /// Dropped to release the lock.
    release: Option<std::sync::mpsc::Sender<()>>,
    /// The thread holding it.
    thread: Option<JoinHandle<()>>,
}

impl Drop for CriStateHold {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Marks peers of a rank lost from another thread (the bootstrap monitor); does nothing
/// once the rank is gone.
#[derive(Clone, Debug)]
pub struct LossNotifier {
    /// The rank, if still alive.
    inner: std::sync::Weak<RankInner>,
}

impl std::fmt::Debug for RankInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ofi_provider::RankInner").field("rank", &self.rank).finish_non_exhaustive()
    }
}

impl LossNotifier {
    /// Marks `rank` lost (see [`OfiRank::mark_lost`]): it finished, or is gone for a reason not
    /// known.
    pub fn lost(&self, rank: u32) {
        if let Some(i) = self.inner.upgrade() {
            i.mark_lost(rank);
        }
    }

    /// Marks `rank` lost because its process died without finishing (the bootstrap's
    /// `LOST`): as [`lost`](Self::lost), and the `shm` spin locks it may have left held
    /// can be released (module docs, *A CRI stuck in libfabric*).
    pub fn died(&self, rank: u32) {
        if let Some(i) = self.inner.upgrade() {
            i.mark_died(rank);
        }
    }

    /// The job's launcher is gone (the bootstrap's
    /// [`PeerEvent::ServerLost`]): removes the
    /// names of this rank's `shm` regions from `/dev/shm` — first, since the process may be
    /// killed any moment now and nothing else would remove them — then marks every peer
    /// lost, so that whatever this rank still waits for fails with `PeerLost` instead of
    /// waiting for peers that are being torn down, with nobody left to report their loss.
    /// The regions stay mapped by this rank and its peers; only their names go (no new
    /// peer can join a job whose launcher is gone).
    pub fn launcher_lost(&self) {
        if let Some(i) = self.inner.upgrade() {
            i.unlink_shm_regions();
            for r in 0..i.size {
                i.mark_died(r);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job whose endpoints libfabric's `shm` cannot address (16 ranks of 16 CRIs, the
    /// default on a 16-core host) is refused with an error that says what to change, not
    /// libfabric's bare FI_ENOSYS from `fi_av_open`; one that fits opens.
    #[test]
    fn too_many_shm_endpoints_is_a_clear_error() {
        let opts = OfiOptions { cris: 16, ..OfiOptions::default() };
        let err = Opened::open(&opts, 16).map(drop).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(m) if m.contains("at most 256 endpoints") && m.contains("WEFT_CRIS")), "{err}");
        let fits = OfiOptions { cris: 3, ..OfiOptions::default() };
        assert!(Opened::open(&fits, 64).is_ok());
    }

    #[test]
    fn wire_header_round_trips() {
        let h = Header {
            kind: FrameKind::Rts,
            src_cri: 3,
            context: 7,
            source: 9,
            tag: -1,
            seq: 42,
            gseq: 0x0bad_cafe,
            chan: 5,
            len: 1 << 40,
            cookie: 0xdead_beef,
            key: 77,
            addr: 0x7fff_0000_1234,
        };
        assert_eq!(header_len(&h, 0), WIRE_HEADER);
        let mut b = [0u8; WIRE_HEADER];
        encode(&h, WIRE_HEADER, &mut b);
        assert_eq!(decode(&b), Some((h, WIRE_HEADER)));
        // An eager frame with rendezvous fields keeps the full header.
        let odd = Header { kind: FrameKind::Eager, len: 3, ..h };
        assert_eq!(header_len(&odd, 3), WIRE_HEADER);
        b[0] = 9;
        assert_eq!(decode(&b), None);
        assert_eq!(decode(&b[..10]), None);
        b[0] = 1;
        assert_eq!(decode(&b[..48]), None, "a full header cut short");
    }

    /// An eager frame that is its whole message travels behind the 24-byte header, its
    /// length taken from the bytes received and without `src_cri` (read as 0).
    #[test]
    fn eager_frames_use_the_compact_header() {
        let h = Header {
            kind: FrameKind::Eager,
            src_cri: 2,
            context: 7,
            source: 9,
            tag: 1 << 30,
            seq: 42,
            gseq: 0x0bad_cafe,
            chan: 5,
            len: 5,
            cookie: 0,
            key: 0,
            addr: 0,
        };
        assert_eq!(header_len(&h, 5), COMPACT_HEADER);
        let mut b = [0u8; COMPACT_HEADER + 5];
        write_frame(&h, COMPACT_HEADER, b"hello", &mut b);
        let h = Header { src_cri: 0, ..h };
        assert_eq!(decode(&b), Some((h, COMPACT_HEADER)));
        let empty = Header { len: 0, ..h };
        assert_eq!(decode(&b[..COMPACT_HEADER]), Some((empty, COMPACT_HEADER)), "a 0-byte message is the header alone");
        assert_eq!(decode(&b[..COMPACT_HEADER - 1]), None);
    }

    /// Receive slots consumed by `poll` are re-posted by a later `reap` (when the CQ is
    /// empty, or in batches while it is busy): after a stream several times the slot count,
    /// every frame arrived in order, and one idle pass leaves every slot posted again.
    #[test]
    fn consumed_receive_slots_are_reposted() {
        std::env::set_var("FI_TCP_IFACE", "lo");
        let opts = OfiOptions { recv_slots: 16, ..OfiOptions::default() };
        let ranks = match world(&opts, 2) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped: shm not available here ({e})");
                return;
            }
        };
        let header = |seq: u32| Header {
            kind: FrameKind::Eager,
            src_cri: 0,
            context: 1,
            source: 0,
            tag: 5,
            seq,
            gseq: seq.wrapping_mul(3),
            chan: 0,
            len: 4,
            cookie: 0,
            key: 0,
            addr: 0,
        };
        let total = 16 * 20;
        let (mut sent, mut got) = (0u32, 0u32);
        let deadline = Instant::now() + Duration::from_secs(20);
        while got < total && Instant::now() < deadline {
            // Up to 8 frames ahead: more than the repost batch (4), fewer than the slots.
            while sent < total && sent < got + 8 {
                match ranks[0].send(1, 0, &header(sent), &sent.to_le_bytes()) {
                    Ok(()) => sent += 1,
                    Err(SendError::WouldBlock) => break,
                    Err(e) => panic!("send: {e:?}"),
                }
            }
            ranks[1].poll(0, 64, |f| {
                assert_eq!((f.header.seq, f.header.gseq), (got, got.wrapping_mul(3)), "frames in order, header intact");
                assert_eq!(f.payload.as_slice(), &got.to_le_bytes());
                got += 1;
            });
            let st = ranks[1].inner.cris[0].st.lock();
            assert!(st.repost.len() <= 16, "a slot is never queued twice");
        }
        assert_eq!(got, total, "every frame arrived within 20 s");
        // One idle pass re-posts whatever the last polls consumed.
        assert!(!ranks[1].has_frames(0));
        let st = ranks[1].inner.cris[0].st.lock();
        assert!(st.repost.is_empty(), "slots left unposted: {:?}", st.repost);
        assert!(st.staged.is_empty());
    }

    /// `poll_into` appends what was sent, on the same-host lane and on libfabric alike:
    /// every header (full and compact) and payload (empty, inline, pooled) unchanged, in
    /// order, after the frames already in the vector, at most `max` a call.
    #[test]
    fn poll_into_appends_frames_unchanged_on_both_paths() {
        std::env::set_var("FI_TCP_IFACE", "lo");
        for lane in [true, false] {
            let opts = OfiOptions { recv_slots: 16, same_host_lane: lane, ..OfiOptions::default() };
            let ranks = match world(&opts, 2) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("skipped: shm not available here ({e})");
                    return;
                }
            };
            assert_eq!(ranks[0].same_host_lane(), lane);
            let fin = Header { kind: FrameKind::Fin, src_cri: 0, cookie: 0xdead_beef_0000_0001, ..eager(7, 0) };
            let cases: Vec<(Header, Vec<u8>)> = vec![
                (fin, vec![]),
                (eager(1, 0), vec![]),
                (eager(2, 20), (0..20).collect()),
                (eager(3, 200), (0..200u32).map(|i| i as u8).collect()),
            ];
            let deadline = Instant::now() + Duration::from_secs(10);
            for (h, data) in &cases {
                // libfabric may refuse a first frame while it connects: retried.
                while let Err(e) = ranks[0].send(1, 0, h, data) {
                    assert!(e == SendError::WouldBlock && Instant::now() < deadline, "send (lane {lane}): {e:?}");
                    ranks[0].has_frames(0);
                }
            }
            let already = Frame { header: eager(0, 0), payload: Payload::Empty };
            let mut got = vec![already];
            while got.len() < 1 + cases.len() && Instant::now() < deadline {
                let before = got.len();
                let n = ranks[1].poll_into(0, 3, &mut got);
                assert!(n <= 3, "at most max a call");
                assert_eq!(got.len(), before + n);
            }
            assert_eq!(got.len(), 1 + cases.len(), "every frame arrived within 10 s (lane {lane})");
            assert_eq!(got[0].header.seq, 0, "the frame already there stays first");
            for (f, (h, data)) in got[1..].iter().zip(&cases) {
                assert_eq!(f.header, *h, "lane {lane}");
                assert_eq!(f.payload.as_slice(), &data[..], "lane {lane}");
            }
            for f in got.drain(..) {
                ranks[1].recycle(f.payload);
            }
        }
    }

    /// Runs `scenario` on a thread of its own and returns its result, failing with `what`
    /// if it takes longer than `secs` (the stuck thread is left behind).
    fn within<T: Send + 'static>(secs: u64, what: &str, scenario: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let _ = tx.send(scenario());
        });
        match rx.recv_timeout(Duration::from_secs(secs)) {
            Ok(v) => v,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hang: {what} (not done after {secs} s)"),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match t.join() {
                Err(p) => std::panic::resume_unwind(p),
                Ok(()) => unreachable!("the scenario ended without a result or a panic"),
            },
        }
    }

    /// Two ranks of an in-process `shm` world, or `None` (skipped) where `shm` is not
    /// available.
    fn shm_pair() -> Option<Arc<Vec<OfiRank>>> {
        shm_world(1, 2)
    }

    /// `n` ranks of `cris` CRIs each on libfabric's own paths (the same-host lane would
    /// carry the frames these tests need to go through a CRI's libfabric state), or `None`
    /// where shm is not available.
    fn shm_world(cris: usize, n: u32) -> Option<Arc<Vec<OfiRank>>> {
        let opts = OfiOptions { cris, recv_slots: 16, send_slots: 8, same_host_lane: false, ..OfiOptions::default() };
        match world(&opts, n) {
            Ok(r) => Some(Arc::new(r)),
            Err(e) => {
                eprintln!("skipped: shm not available here ({e})");
                None
            }
        }
    }

    /// Holds the watcher of `inner`'s rank in its pass, as one caught inside libfabric,
    /// once it comes there (the rank is idle after `ACTIVE_MS`).
    fn catch_watcher(inner: &RankInner) {
        inner.stall_watcher.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !inner.watcher_stalled.load(Ordering::Relaxed) {
            assert!(Instant::now() < deadline, "the watcher did not come to its pass");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// An eager frame of `len` bytes on tag 5.
    fn eager(seq: u32, len: usize) -> Header {
        Header {
            kind: FrameKind::Eager,
            src_cri: 0,
            context: 1,
            source: 0,
            tag: 5,
            seq,
            gseq: seq,
            chan: 0,
            len: len as u64,
            cookie: 0,
            key: 0,
            addr: 0,
        }
    }

    /// The `/dev/shm` names of `r`'s regions, one per endpoint.
    fn region_names(r: &OfiRank) -> Vec<String> {
        let pid = std::process::id();
        let eps = r.inner.cris.iter().map(|c| &c.ep).chain(std::iter::once(&r.inner.rma_ep));
        eps.filter_map(|ep| shm_region_name(ep.name(), pid)).map(|n| format!("/dev/shm/{n}")).collect()
    }

    /// A CRI whose state lock is held for good — by a thread caught inside `fi_cq_read` on a
    /// lock a dead `shm` peer held (module docs) — is given up after `STUCK_AFTER`: `poll`
    /// finds nothing, then does not wait again, `has_frames` says none and a send that
    /// needs a send slot is refused; once the lock is free the CRI works as before; and a
    /// rank with a stuck CRI closes in bounded time.
    #[test]
    fn a_stuck_cri_is_given_up_in_bounded_time() {
        let Some(ranks) = shm_pair() else { return };
        let r = ranks.clone();
        let (first, again) = within(20, "operations on a CRI whose state lock is held for good", move || {
            let hold = r[1].hold_cri_state(0);
            let t0 = Instant::now();
            assert_eq!(r[1].poll(0, 64, |_| panic!("a frame from a stuck CRI")), 0);
            let first = t0.elapsed();
            let t1 = Instant::now();
            assert_eq!(r[1].poll(0, 64, |_| panic!("a frame from a stuck CRI")), 0);
            assert!(!r[1].has_frames(0), "a stuck CRI has no frames to wait for");
            // Above the inject size: the frame needs a send slot.
            let big = vec![7u8; 8192];
            assert_eq!(r[1].send(0, 0, &eager(0, big.len()), &big), Err(SendError::WouldBlock));
            let again = t1.elapsed();
            drop(hold);
            (first, again)
        });
        assert!(first >= STUCK_AFTER / 2 && first < Duration::from_secs(5), "first poll took {first:?}");
        // Two calls that would each have waited `STUCK_AFTER`.
        assert!(again < STUCK_AFTER, "a stuck CRI was waited for again: {again:?}");
        // Free again: a frame goes through, and the CRI is no longer stuck.
        a_frame_goes_through(&ranks);
        // Closing drains the other CRIs' sends and skips the stuck one.
        let hold = ranks[1].hold_cri_state(0);
        let r = ranks.clone();
        let took = within(20, "close of a rank with a stuck CRI", move || {
            let t0 = Instant::now();
            r[1].close();
            t0.elapsed()
        });
        assert!(took < Duration::from_secs(3), "close took {took:?}");
        drop(hold);
    }

    /// A flush whose CRI's state lock is held longer than `STUCK_AFTER` (by a thread
    /// descheduled on a loaded machine) waits for it until its deadline, as the posts do,
    /// instead of failing while the operations it covers may still be applied; the put it
    /// covers is then at its target.
    #[test]
    fn a_flush_waits_for_a_slow_cri_instead_of_failing() {
        let Some(ranks) = shm_pair() else { return };
        let mut mem = vec![0u64; 1];
        // SAFETY: `mem` outlives the registration (removed below) and is read only after the
        // flush returned.
        let region = unsafe { ranks[1].register_window(mem.as_mut_ptr().cast(), 8) }.unwrap();
        let key = region.key;
        let to = RemoteMem { rank: 1, region };
        let value = 0x5eed_u64.to_le_bytes();
        // SAFETY: `value` lives until the flush below returned.
        unsafe { ranks[0].put(0, &to, 0, &value) }.unwrap();
        let hold = ranks[0].hold_cri_state(0);
        let slow = std::thread::spawn(move || {
            std::thread::sleep(STUCK_AFTER * 2);
            drop(hold);
        });
        let r = ranks.clone();
        let (flushed, took) = within(20, "a flush of a CRI held for a while", move || {
            let t0 = Instant::now();
            (r[0].flush(0), t0.elapsed())
        });
        slow.join().unwrap();
        assert!(flushed.is_ok(), "a flush failed while its CRI was only slow: {flushed:?} after {took:?}");
        assert!(took >= STUCK_AFTER, "the flush did not wait for the CRI: {took:?}");
        ranks[1].deregister(key);
        assert_eq!(mem[0], 0x5eed, "the flushed put is not at its target");
    }

    /// A watcher caught inside libfabric does not hold `close` up: after `STUCK_AFTER` it
    /// is left behind with the rank's shared state (freed only once it returns), and the
    /// rank's `shm` region names are removed, since no endpoint close will remove them.
    #[test]
    fn close_leaves_a_watcher_caught_in_libfabric_behind() {
        let Some(ranks) = shm_pair() else { return };
        let inner = ranks[1].inner.clone();
        let names = region_names(&ranks[1]);
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.iter().all(|n| std::path::Path::new(n).exists()), "{names:?}");
        catch_watcher(&inner);
        let r = ranks.clone();
        let took = within(20, "close of a rank whose watcher is caught in libfabric", move || {
            let t0 = Instant::now();
            r[1].close();
            t0.elapsed()
        });
        assert!(took < STUCK_AFTER + Duration::from_secs(2), "close took {took:?}");
        // The rank, this test and the watcher.
        assert_eq!(Arc::strong_count(&inner), 3, "the caught watcher's state was not kept");
        assert!(names.iter().all(|n| !std::path::Path::new(n).exists()), "region names left: {names:?}");
        // Once it returns, it sees the rank closed and goes, dropping its share.
        inner.stall_watcher.store(false, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&inner) > 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(Arc::strong_count(&inner), 2, "the watcher did not finish");
    }

    /// A closed rank that the program keeps (in the tests, a lost rank's lock forgotten
    /// with its runtime) leaves no `shm` region name behind: `close` removes them, not the
    /// endpoints' close, which may never come. Its peer's stay, and the rank still drops.
    #[test]
    fn a_closed_rank_kept_alive_leaves_no_region_names() {
        let Some(ranks) = shm_pair() else { return };
        let (mine, theirs) = (region_names(&ranks[0]), region_names(&ranks[1]));
        assert_eq!((mine.len(), theirs.len()), (2, 2), "{mine:?} {theirs:?}");
        ranks[1].close();
        assert!(theirs.iter().all(|n| !std::path::Path::new(n).exists()), "left by the closed rank: {theirs:?}");
        assert!(mine.iter().all(|n| std::path::Path::new(n).exists()), "the open rank's removed: {mine:?}");
        assert!(!ranks[0].is_alive(1), "the peer does not count the closed rank lost");
        drop(ranks);
        assert!(mine.iter().all(|n| !std::path::Path::new(n).exists()), "left by a dropped rank: {mine:?}");
    }

    /// A thread parked as the rank's waiter is woken by the network itself, not by the
    /// watcher: with the watcher caught (stalled in its pass), a frame from the peer still
    /// ends the waiter's sleep at once — through the same-host lane's eventfd on `shm`, and
    /// through the CQ's wait fd on `tcp` with the lane off. Parked on the doorbell instead,
    /// whose only ringer for a frame is the watcher, the thread slept its whole timeout.
    #[test]
    fn a_parked_waiter_is_woken_by_the_network_not_the_watcher() {
        for (provider, lane) in [("shm", true), ("tcp;ofi_rxm", false)] {
            let opts =
                OfiOptions { provider: provider.into(), recv_slots: 16, send_slots: 8, same_host_lane: lane, ..OfiOptions::default() };
            let ranks = match world(&opts, 2) {
                Ok(r) => Arc::new(r),
                Err(e) => {
                    eprintln!("skipped {provider}: not available here ({e})");
                    continue;
                }
            };
            a_frame_goes_through(&ranks);
            let inner = ranks[1].inner.clone();
            catch_watcher(&inner);
            let r = ranks.clone();
            let (slept, woke, got) = within(20, "a waiter's sleep", move || {
                let waiter = r[1].take_waiter().expect("the role is free");
                assert!(r[1].take_waiter().is_none(), "one waiter at a time");
                std::thread::scope(|s| {
                    s.spawn(|| {
                        std::thread::sleep(Duration::from_millis(20));
                        r[0].send(1, 0, &eager(2, 3), b"def").expect("send");
                    });
                    let t0 = Instant::now();
                    let mut woke = false;
                    let mut got = Vec::new();
                    // A sleep may end early for a completion that is not a frame (a CQ fd).
                    while got.is_empty() && t0.elapsed() < Duration::from_secs(3) {
                        woke = waiter.sleep(Duration::from_secs(3));
                        r[1].poll(0, 64, |f| got.push(f.payload.as_slice().to_vec()));
                    }
                    (t0.elapsed(), woke, got)
                })
            });
            inner.stall_watcher.store(false, Ordering::Relaxed);
            assert!(woke, "{provider}: the network ended the sleep");
            assert_eq!(got, vec![b"def".to_vec()], "{provider}");
            assert!(slept < Duration::from_secs(1), "{provider}: woken after {slept:?}");
            assert!(ranks[1].take_waiter().is_some(), "{provider}: the role was given back");
        }
    }

    /// A window's end keeps its registration with its memory, retired: a peer's put, atomic
    /// and flush after it land there and succeed (a removed key made a `shm` fetch-and-op wait
    /// out its flush's deadline). Retired registrations stay within `RETIRED_BYTES`, the
    /// oldest out first.
    #[test]
    fn retired_windows_take_late_accesses_within_their_bound() {
        let Some(ranks) = shm_world(1, 2) else { return };
        let mut keys = Vec::new();
        for round in 0..3 {
            let mut memory = vec![0u64; RETIRED_BYTES / 8 / 2].into_boxed_slice();
            // SAFETY: `memory` goes to the transport with the registration (its heap storage
            // does not move with the box), which deregisters it before freeing it.
            let region = unsafe { ranks[1].register_window(memory.as_mut_ptr().cast(), RETIRED_BYTES / 2) }.unwrap();
            keys.push(region.key);
            ranks[1].retire_window(region.key, Some(memory));
            if round == 0 {
                let to = RemoteMem { rank: 1, region };
                let value = 7u64.to_le_bytes();
                // SAFETY: `value` lives until the flush below returned.
                unsafe { ranks[0].put(0, &to, 8, &value) }.unwrap();
                ranks[0].flush(0).unwrap();
                assert_eq!(ranks[0].fetch_op(0, &to, 8, FetchOp::Sum, 1).unwrap(), 7, "the late put landed");
            }
            let r = ranks[1].inner.retired.lock();
            assert!(r.bytes <= RETIRED_BYTES, "{} bytes retired", r.bytes);
        }
        let r = ranks[1].inner.retired.lock();
        let kept: Vec<u64> = r.kept.iter().map(|(mr, _)| mr.key()).collect();
        assert_eq!(kept, keys[1..], "the last two kept, the oldest out");
        assert!(ranks[1].inner.regions.lock().is_empty(), "no live registration is left");
    }

    /// A peer's atomic on this rank's window waits in the queue of the endpoint one-sided
    /// operations target (`RMA_TARGET_EP`, CRI 0) until a read of that endpoint's CQ applies
    /// it. With CRI 0's thread away and the watcher held, the only thread of the target
    /// polling its own CRI 1 serves the atomic within a bounded number of its polls.
    #[test]
    fn polls_of_another_cri_serve_the_rma_target_endpoint() {
        let Some(ranks) = shm_world(2, 2) else { return };
        /// The target's polls of CRI 1, a tenth of a millisecond apart at least.
        const POLLS: u32 = 5_000;
        let mut mem = vec![0u64; 1];
        // SAFETY: `mem` outlives the registration (removed below) and is read only after the
        // atomic completed.
        let region = unsafe { ranks[1].register_window(mem.as_mut_ptr().cast(), 8) }.unwrap();
        let key = region.key;
        let to = RemoteMem { rank: 1, region };
        let inner = ranks[1].inner.clone();
        catch_watcher(&inner);
        let done = Arc::new(AtomicBool::new(false));
        let (r, d) = (ranks.clone(), done.clone());
        let initiator = std::thread::spawn(move || {
            let old = r[0].fetch_op(1, &to, 0, FetchOp::Sum, 5);
            d.store(true, Ordering::Release);
            old
        });
        let mut polls = 0;
        let mut frames = Vec::new();
        while !done.load(Ordering::Acquire) && polls < POLLS {
            ranks[1].poll_into(1, 16, &mut frames);
            polls += 1;
            std::thread::sleep(Duration::from_micros(100));
        }
        let served = done.load(Ordering::Acquire);
        // Before any assertion: the watcher, free again, serves the atomic otherwise.
        inner.stall_watcher.store(false, Ordering::Relaxed);
        let old = initiator.join().unwrap();
        assert!(served, "the atomic waited for CRI 0's CQ through {polls} polls of CRI 1");
        assert_eq!(old.unwrap(), 0);
        assert!(frames.is_empty());
        ranks[1].deregister(key);
        assert_eq!(mem[0], 5, "the atomic is applied at its target");
    }

    /// On `shm` an endpoint's first one-sided operation to a peer's endpoint is refused until
    /// the peer's progress of that endpoint answered a handshake. After
    /// `reach_rma_targets` (window creation), a peer's first atomic from its CRI 1 is posted
    /// at once; from a rank that did not reach the target, it is refused first. The reach
    /// reads the target's probe: it needs no window of the target (here it comes before
    /// the target registered one).
    #[test]
    fn reached_rma_targets_take_a_first_atomic_without_refusal() {
        let Some(ranks) = shm_world(2, 3) else { return };
        // Rank 1's watcher serves the handshakes and the reads.
        ranks[0].reach_rma_targets(&[1]).unwrap();
        let mut mem = vec![0u64; 1];
        // SAFETY: `mem` outlives the registration (removed below) and is read only after the
        // atomics completed.
        let region = unsafe { ranks[1].register_window(mem.as_mut_ptr().cast(), 8) }.unwrap();
        let key = region.key;
        let to = RemoteMem { rank: 1, region };
        let inner = ranks[1].inner.clone();
        catch_watcher(&inner);
        // The first atomic of `from` on its CRI 1, served by rank 1's polls of its CRI 1;
        // returns the refusals it met.
        let first_atomic = |from: usize| {
            ranks[from].inner.rma_refusals.store(0, Ordering::Relaxed);
            let done = Arc::new(AtomicBool::new(false));
            let (r, d) = (ranks.clone(), done.clone());
            let initiator = std::thread::spawn(move || {
                let old = r[from].fetch_op(1, &to, 0, FetchOp::Sum, 1);
                d.store(true, Ordering::Release);
                old
            });
            let mut frames = Vec::new();
            for _ in 0..5_000 {
                if done.load(Ordering::Acquire) {
                    break;
                }
                ranks[1].poll_into(1, 16, &mut frames);
                std::thread::sleep(Duration::from_micros(100));
            }
            (initiator.join().unwrap(), ranks[from].inner.rma_refusals.load(Ordering::Relaxed))
        };
        let (reached, unreached) = (first_atomic(0), first_atomic(2));
        inner.stall_watcher.store(false, Ordering::Relaxed);
        ranks[1].deregister(key);
        assert_eq!(reached.0.unwrap(), 0);
        assert_eq!(reached.1, 0, "the reached target refused the first atomic");
        assert_eq!(unreached.0.unwrap(), 1);
        assert!(unreached.1 > 0, "an unreached target took a first atomic at once: the handshake is gone");
        assert_eq!(mem[0], 2, "both atomics are applied at their target");
    }

    /// A peer killed while it held the spin lock of this rank's CRI region (as one queueing
    /// a command is) catches the next thread that reads the CRI's CQ inside `fi_cq_read`;
    /// once the peer is reported dead (not merely finished), the lock is released (by the
    /// watcher, which sees the CRI's state lock held for `STUCK_AFTER`, or by a thread that
    /// waited that long for it) and the caught thread comes back — within seconds, where it
    /// used to spin for ever.
    #[test]
    fn a_spin_lock_a_dead_peer_left_held_is_released() {
        let Some(ranks) = shm_pair() else { return };
        if !ranks[1].wedge_cri_as_a_dead_peer(0) {
            eprintln!("skipped: this libfabric's shm region layout is not known to weft");
            return;
        }
        let r = ranks.clone();
        let caught = std::thread::spawn(move || r[1].poll(0, 64, |_| {}));
        std::thread::sleep(Duration::from_millis(100));
        assert!(!caught.is_finished(), "a poll of the wedged CRI returned before the peer was lost");
        // A peer that finished normally cannot hold a lock for good: nothing is released.
        ranks[1].loss_notifier().lost(0);
        std::thread::sleep(STUCK_AFTER * 3);
        assert!(!caught.is_finished(), "a lock was released for a peer that only finished");
        let t0 = Instant::now();
        ranks[1].loss_notifier().died(0);
        within(20, "a thread caught on a spin lock a dead peer left held", move || caught.join().unwrap());
        let took = t0.elapsed();
        assert!(took < Duration::from_secs(10), "took {took:?}");
        // The CRI works again: frames of the peer (which does not know it was given up)
        // still arrive, and nothing is stuck.
        a_frame_goes_through(&ranks);
    }

    /// Two ranks of an in-process `tcp;ofi_rxm` world without the same-host lane (whose
    /// nudges would wake the watcher), or `None` (skipped) where tcp is not available.
    fn tcp_pair() -> Option<Arc<Vec<OfiRank>>> {
        std::env::set_var("FI_TCP_IFACE", "lo");
        let opts =
            OfiOptions { provider: "tcp;ofi_rxm".into(), recv_slots: 16, send_slots: 8, same_host_lane: false, ..OfiOptions::default() };
        match world(&opts, 2) {
            Ok(r) => Some(Arc::new(r)),
            Err(e) => {
                eprintln!("skipped: tcp not available here ({e})");
                None
            }
        }
    }

    /// On `tcp;ofi_rxm` the watcher of a quiet rank backs off from one pass every
    /// [`CQ_WAIT_MS`] to one every [`IDLE_WAIT_MS`], both while it blocks on the CQs' wait fds
    /// itself (rank 0) and while a parked thread, the rank's waiter, blocks on them (rank 1):
    /// over half a second of quiet a few passes each, where passes every 10 ms made 50.
    #[test]
    fn an_idle_tcp_rank_wakes_its_watcher_rarely() {
        let Some(ranks) = tcp_pair() else { return };
        a_frame_goes_through(&ranks);
        let stop = Arc::new(AtomicBool::new(false));
        let (r, st) = (ranks.clone(), stop.clone());
        let parked = std::thread::spawn(move || {
            let waiter = r[1].take_waiter().expect("the role is free");
            while !st.load(Ordering::Relaxed) {
                waiter.sleep(Duration::from_millis(200));
                r[1].poll(0, 64, |_| panic!("no frame was sent"));
            }
        });
        let passes = || ranks.iter().map(|r| r.inner.watcher_passes.load(Ordering::Relaxed)).collect::<Vec<_>>();
        // Quiet for good: past `ACTIVE_MS` and the first steps of the backoff.
        std::thread::sleep(Duration::from_millis(300));
        let before = passes();
        std::thread::sleep(Duration::from_millis(500));
        let after = passes();
        stop.store(true, Ordering::Relaxed);
        parked.join().unwrap();
        for (rank, (b, a)) in before.iter().zip(&after).enumerate() {
            assert!(a - b < 10, "rank {rank}: the watcher woke {} times in 500 ms of quiet", a - b);
        }
    }

    /// A frame that waits in the same-host rings for a thread of its rank that does not come
    /// (busy, or not running on a host whose cores are all taken) makes the watcher ring
    /// the doorbell and nap, backing off to [`LANE_WAITING_NAP_US`]: over 300 ms a few
    /// hundred passes at most, where a watcher that rang again at once made thousands, each
    /// with the lane's sleeper barrier (an IPI to every CPU). The frame is still there for
    /// the thread that comes.
    #[test]
    fn a_frame_left_in_the_lane_does_not_spin_the_watcher() {
        let opts = OfiOptions { provider: "shm".into(), recv_slots: 16, send_slots: 8, same_host_lane: true, ..OfiOptions::default() };
        let ranks = match world(&opts, 2) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("skipped: shm not available here ({e})");
                return;
            }
        };
        if !ranks[1].same_host_lane() {
            eprintln!("skipped: no same-host lane here");
            return;
        }
        a_frame_goes_through(&ranks);
        // Quiet: past `ACTIVE_MS`, the watcher asleep on the lane.
        std::thread::sleep(Duration::from_millis(50));
        ranks[0].send(1, 0, &eager(2, 3), b"def").expect("send");
        let inner = &ranks[1].inner;
        let before = inner.watcher_passes.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        let passes = inner.watcher_passes.load(Ordering::Relaxed) - before;
        let mut got = Vec::new();
        ranks[1].poll(0, 64, |f| got.push(f.payload.as_slice().to_vec()));
        assert_eq!(got, vec![b"def".to_vec()]);
        assert!(passes < 600, "the watcher made {passes} passes in 300 ms while a frame waited in the lane");
    }

    /// A pair of ranks on `shm` with the same-host lane, or `None` (said) where there is none.
    fn lane_pair() -> Option<Vec<OfiRank>> {
        let opts = OfiOptions { provider: "shm".into(), recv_slots: 16, send_slots: 8, same_host_lane: true, ..OfiOptions::default() };
        match world(&opts, 2) {
            Ok(r) if r[1].same_host_lane() => Some(r),
            Ok(_) => {
                eprintln!("skipped: no same-host lane here");
                None
            }
            Err(e) => {
                eprintln!("skipped: shm not available here ({e})");
                None
            }
        }
    }

    /// While frames flow, the watcher sleeps through the rank's activity [`ACTIVE_MS`] at a
    /// time: over 300 ms of traffic a few tens of passes, where a watcher that looked every
    /// millisecond made about 300 (on a host with more rank processes than cores, those
    /// wake-ups left the kernel spreading the busy ranks unevenly).
    #[test]
    fn an_active_rank_wakes_its_watcher_rarely() {
        let Some(ranks) = lane_pair() else { return };
        a_frame_goes_through(&ranks);
        let inner = &ranks[1].inner;
        let (mut before, mut seq) = (None, 2);
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(350) {
            // The first 50 ms make the rank active and let a watcher's sleep begun while
            // it was quiet come to its end.
            if before.is_none() && start.elapsed() >= Duration::from_millis(50) {
                before = Some((inner.watcher_passes.load(Ordering::Relaxed), Instant::now()));
            }
            ranks[0].send(1, 0, &eager(seq, 3), b"abc").expect("send");
            seq += 1;
            let (mut got, sent) = (0, Instant::now());
            while got == 0 {
                assert!(sent.elapsed() < Duration::from_secs(10), "a frame did not arrive");
                ranks[1].poll(0, 64, |_| got += 1);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let (b, t) = before.expect("a start");
        let (passes, took) = (inner.watcher_passes.load(Ordering::Relaxed) - b, t.elapsed());
        assert!(passes < 100, "the watcher made {passes} passes in {took:?} of traffic");
    }

    /// A thread that finds the rank quiet (`any_frames` answering `false`: it may park
    /// next) ends the watcher's sleep through the activity at once, so that the watcher
    /// covers the rank's descriptors from then on: here with that sleep 10 s long, the
    /// watcher's next pass comes within a second of the thread's look.
    #[test]
    fn a_thread_that_finds_the_rank_quiet_wakes_the_watcher() {
        let Some(rr) = lane_pair() else { return };
        within(60, "the watcher's wake-up by a quiet look", move || {
            let inner = &rr[1].inner;
            inner.active_nap_ms.store(10_000, Ordering::Relaxed);
            a_frame_goes_through(&rr);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !inner.active_nap.load(Ordering::Relaxed) {
                assert!(Instant::now() < deadline, "the watcher did not sleep through the activity");
                std::thread::sleep(Duration::from_millis(1));
            }
            // Quiet `ACTIVE_MS` after the activity was last counted (the first look may
            // count the frame's poll, after the watcher's).
            let (before, t0) = loop {
                let (before, t0) = (inner.watcher_passes.load(Ordering::Relaxed), Instant::now());
                if !rr[1].any_frames() {
                    break (before, t0);
                }
                assert!(Instant::now() < deadline, "the rank did not go quiet");
                std::thread::sleep(Duration::from_millis(1));
            };
            while inner.watcher_passes.load(Ordering::Relaxed) == before {
                assert!(t0.elapsed() < Duration::from_secs(5), "the watcher slept on after a thread found the rank quiet");
                std::thread::sleep(Duration::from_millis(1));
            }
            assert!(t0.elapsed() < Duration::from_secs(1), "the watcher came {:?} after the look", t0.elapsed());
        });
    }

    /// The watcher of an idle rank that finds a CRI's state lock held looks again within
    /// [`CQ_WAIT_MS`], not after its long idle sleep: a CRI counts as stuck only if its lock
    /// was held at every look for [`STUCK_AFTER`], and two looks far apart would count one
    /// whose lock is merely taken often (a thread spinning in `flush` takes it at every
    /// turn; the asynchronous lock tests on tcp failed so). Over a hold of 450 ms (shorter
    /// than `STUCK_AFTER`) the watcher looks many times, and the CRI is not stuck.
    #[test]
    fn an_idle_watcher_looks_again_soon_at_a_held_cri_lock() {
        let Some(ranks) = tcp_pair() else { return };
        a_frame_goes_through(&ranks);
        // Quiet: the watcher's blocks are long by now.
        std::thread::sleep(Duration::from_millis(300));
        let inner = &ranks[1].inner;
        let hold = ranks[1].hold_cri_state(0);
        let before = inner.watcher_passes.load(Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(450));
        let looks = inner.watcher_passes.load(Ordering::Relaxed) - before;
        drop(hold);
        assert!(looks >= 8, "the watcher looked {looks} times at a lock held for 450 ms");
        assert!(!inner.cris[0].stuck.load(Ordering::Relaxed), "a lock held shorter than STUCK_AFTER counted stuck");
    }

    /// Whatever a peer needs of an idle `tcp;ofi_rxm` rank's progress wakes the rank's
    /// watcher through the CQs' wait fds: with the watcher blocking on them for 10 s at a
    /// time and no thread of the rank awake, the peer's connection, its one-sided operations
    /// on the rank's window and its rendezvous read of the rank's registered buffer are all
    /// served at once, not at the watcher's timeout.
    #[test]
    fn an_idle_tcp_rank_serves_its_peers_through_the_wait_fds() {
        let Some(ranks) = tcp_pair() else { return };
        let r = ranks.clone();
        let took = within(60, "a peer's operations on an idle tcp rank", move || {
            r[1].inner.idle_wait_ms.store(10_000, Ordering::Relaxed);
            let mut window = vec![0u64; 3];
            // SAFETY: `window` outlives the registration and is read after the operations
            // completed (flushed or blocking), once it is deregistered.
            let region = unsafe { r[1].register_window(window.as_mut_ptr().cast(), 24) }.unwrap();
            let to = RemoteMem { rank: 1, region };
            let data: Vec<u8> = (0..(1usize << 20)).map(|i| (i * 7) as u8).collect();
            // SAFETY: `data` is not modified and outlives the registration.
            let key = unsafe { r[1].register(data.as_ptr(), data.len()) }.unwrap();
            // Rank 1's watcher in its long block.
            std::thread::sleep(Duration::from_millis(50));
            let t0 = Instant::now();
            let value = 7u64.to_le_bytes();
            // SAFETY: `value` lives until the flush.
            unsafe { r[0].put(0, &to, 0, &value) }.unwrap();
            r[0].flush(0).unwrap();
            let mut back = [0u8; 8];
            // SAFETY: `back` is untouched until the flush.
            unsafe { r[0].get(0, &to, 0, &mut back) }.unwrap();
            r[0].flush(0).unwrap();
            assert_eq!(back, value);
            assert_eq!(r[0].fetch_op(0, &to, 8, FetchOp::Sum, 5).unwrap(), 0);
            assert_eq!(r[0].compare_swap(0, &to, 16, 0, 9).unwrap(), 0);
            let mut rts = eager(0, data.len());
            (rts.kind, rts.key, rts.source) = (FrameKind::Rts, key, 1);
            let mut dst = vec![0u8; data.len()];
            // SAFETY: `dst` is not touched until the read is reported below.
            assert_eq!(unsafe { r[0].start_read(&rts, dst.as_mut_ptr(), dst.len(), 3) }, Ok(ReadStart::InFlight));
            let mut reported = None;
            while reported.is_none() {
                r[0].poll_reads(4, |token, outcome| reported = Some((token, outcome)));
            }
            let took = t0.elapsed();
            assert_eq!(reported, Some((3, Ok(()))));
            assert!(dst == data, "rendezvous data");
            r[1].deregister(region.key);
            r[1].deregister(key);
            assert_eq!(window, vec![u64::from_le_bytes(value), 5, 9]);
            took
        });
        assert!(took < Duration::from_secs(5), "served after {took:?}: at the watcher's timeout, not by the wait fds");
    }

    /// A frame from rank 0 reaches CRI 0 of rank 1 within 10 s, and that CRI is not stuck.
    fn a_frame_goes_through(ranks: &[OfiRank]) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let (mut sent, mut got) = (false, Vec::new());
        while got.is_empty() && Instant::now() < deadline {
            // The first frame may be refused while the provider sets up the connection.
            if !sent {
                match ranks[0].send(1, 0, &eager(1, 3), b"abc") {
                    Ok(()) => sent = true,
                    Err(SendError::WouldBlock) => {}
                    Err(e) => panic!("send: {e:?}"),
                }
            }
            ranks[1].poll(0, 64, |f| got.push(f.payload.as_slice().to_vec()));
        }
        assert_eq!(got, vec![b"abc".to_vec()]);
        assert!(!ranks[1].inner.cris[0].stuck.load(Ordering::Relaxed));
    }

    /// When the job's launcher is gone, a rank removes the names of its own `shm` regions
    /// (and no other's) and marks every peer lost.
    #[test]
    fn a_rank_whose_launcher_is_gone_unlinks_its_regions_and_loses_its_peers() {
        let Some(ranks) = shm_pair() else { return };
        let (mine, theirs) = (region_names(&ranks[0]), region_names(&ranks[1]));
        assert_eq!((mine.len(), theirs.len()), (2, 2), "{mine:?} {theirs:?}");
        assert!(mine.iter().chain(&theirs).all(|n| std::path::Path::new(n).exists()));
        let epoch = ranks[0].lost_epoch();
        ranks[0].loss_notifier().launcher_lost();
        assert!(mine.iter().all(|n| !std::path::Path::new(n).exists()), "left: {mine:?}");
        assert!(theirs.iter().all(|n| std::path::Path::new(n).exists()), "another rank's removed: {theirs:?}");
        assert!(ranks[0].is_alive(0) && !ranks[0].is_alive(1));
        assert_ne!(ranks[0].lost_epoch(), epoch);
        assert_eq!(ranks[0].send(1, 0, &eager(0, 3), b"abc"), Err(SendError::PeerLost));
    }

    /// Marks the output line of [`exit_child`]: its pid and its ranks' region names.
    const EXIT_MARK: &str = "REGIONS-AT-EXIT";

    /// Set by [`a_process_that_exits_with_ranks_open_leaves_no_region_names`] for its child.
    const EXIT_CHILD_ENV: &str = "WEFT_TEST_EXIT_CHILD";

    /// Run by [`a_process_that_exits_with_ranks_open_leaves_no_region_names`] in a process
    /// of its own: two ranks on `shm` exchange a frame, are kept open (never closed or
    /// dropped) and the process exits. Run any other way (`--ignored`), it does nothing: its
    /// `exit` would end the other tests' process.
    #[test]
    #[ignore = "run by a_process_that_exits_with_ranks_open_leaves_no_region_names"]
    fn exit_child() {
        if std::env::var_os(EXIT_CHILD_ENV).is_none() {
            return;
        }
        let Some(ranks) = shm_pair() else {
            println!("{EXIT_MARK} unavailable");
            return;
        };
        a_frame_goes_through(&ranks);
        let names: Vec<String> = ranks.iter().flat_map(region_names).collect();
        assert!(names.iter().all(|n| std::path::Path::new(n).exists()), "{names:?}");
        println!("{EXIT_MARK} {} {}", std::process::id(), names.join(" "));
        std::mem::forget(ranks);
        std::process::exit(0);
    }

    /// A process that ends with ranks still open (a runtime kept to the end, `exit` called,
    /// a handle forgotten) leaves no `shm` region name in `/dev/shm`: libfabric removes a
    /// name only when its endpoint closes, which such a process never does, and each name
    /// holds a 16 MiB region of memory until the next reboot.
    #[test]
    fn a_process_that_exits_with_ranks_open_leaves_no_region_names() {
        let out = std::process::Command::new(std::env::current_exe().expect("test binary path"))
            .args(["ofi_provider::tests::exit_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env(EXIT_CHILD_ENV, "1")
            .output()
            .expect("run the child test");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "child failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let line = stdout.lines().find_map(|l| l.split_once(EXIT_MARK).map(|(_, r)| r.trim().to_string())).expect("child's result");
        if line == "unavailable" {
            eprintln!("skipped: shm not available here");
            return;
        }
        let mut words = line.split(' ');
        let pid: u32 = words.next().and_then(|p| p.parse().ok()).expect("child's pid");
        let names: Vec<&str> = words.collect();
        assert_eq!(names.len(), 4, "two ranks, a CRI and an RMA endpoint each: {names:?}");
        assert!(names.iter().all(|n| n.starts_with(&format!("/dev/shm/{pid}:"))), "{names:?}");
        let left: Vec<&&str> = names.iter().filter(|n| std::path::Path::new(n).exists()).collect();
        assert!(left.is_empty(), "region names left by a process that exited: {left:?}");
    }

    /// Only names of the shape libfabric gives `shm` regions count as one process's.
    #[test]
    fn shm_region_names_are_recognised_strictly() {
        assert_eq!(region_pid("123:0:4"), Some(123));
        assert_eq!(region_pid("123:1000:17"), Some(123));
        for other in ["123", "123:", "123:x", "123::4", ":0:4", "12a:0:4", "123:+1:4", "sem.123:0:4"] {
            assert_eq!(region_pid(other), None, "{other}");
        }
        assert!(is_region_of("77:0:1", 77) && !is_region_of("770:0:1", 77) && !is_region_of("7:0:1", 77));
        assert_eq!(shm_region_name(b"fi_shm://77:0:1\0\0", 77), Some("77:0:1"));
        assert_eq!(shm_region_name(b"fi_shm://78:0:1\0", 77), None, "another process's");
        assert_eq!(shm_region_name(b"fi_shm://../77:0:1\0", 77), None);
        assert_eq!(shm_region_name(&[0x02, 0x00, 0x1f, 0x90, 127, 0, 0, 1], 77), None, "a tcp address");
    }

    /// Stale `shm` regions of a dead pid are removed, nothing else is.
    #[test]
    fn stale_shm_regions_of_a_pid_are_removed() {
        if !std::path::Path::new("/dev/shm").is_dir() {
            eprintln!("skipped: no /dev/shm");
            return;
        }
        // A pid above any real one (Linux pid_max is at most 2^22).
        let pid = 4_999_999u32;
        let mine = [format!("/dev/shm/{pid}:0:0"), format!("/dev/shm/{pid}:1:2")];
        let others = [format!("/dev/shm/{}:0:0", pid + 1), format!("/dev/shm/{pid}:x"), format!("/dev/shm/{pid}0:0:0")];
        for f in mine.iter().chain(&others) {
            std::fs::write(f, b"").unwrap();
        }
        assert_eq!(remove_stale_shm_regions(pid), 2);
        assert!(mine.iter().all(|f| !std::path::Path::new(f).exists()));
        for f in &others {
            assert!(std::path::Path::new(f).exists(), "{f} removed");
            std::fs::remove_file(f).unwrap();
        }
    }
}
