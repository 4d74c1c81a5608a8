//! The distributed tree of queues (DT) of D-MCS, RMA-MCS and RMA-RW [Schmid 2016, §3.2],
//! with RMA-RW's distributed counter (DC), as the seed's listings:
//!
//! - writer acquire, levels `N` to 2: [Schmid 2016, Listing 4]; level 1: Listing 7
//!   (RMA-RW) or Listing 4 without a parent (RMA-MCS, §3.5; with one level this is D-MCS,
//!   Listing 2);
//! - writer release, levels `N` to 2: Listing 5; level 1: Listing 8 (RMA-RW) or Listing 3
//!   (RMA-MCS, D-MCS);
//! - the counters: Listing 6; reader acquire and release: Listings 9 and 10.
//!
//! Where the listings leave a step out, or would break mutual exclusion as written, this
//! module does the following (each marked "Beyond the listing" below):
//!
//! 1. **Inherited queue nodes.** A writer that gets the lock passed within its element at
//!    level `i` did not enter the queues above `i`: the writer that did (at each level) is
//!    still in them, and the listings' `Get(p, NEXT)` at those levels would read the wrong
//!    node. The passer therefore writes, before the STATUS that passes the lock, the ranks
//!    whose nodes hold the levels above `i` into the successor's OWNER words, and a release
//!    uses those nodes. A node is reused by its owner only after the release of its level
//!    returned (its owner must first be told to acquire the parent level, which Listing 5
//!    does after releasing the parent).
//! 2. **Readers drain before a writer enters.** Listing 7 only marks the counters WRITE;
//!    §3.3.3 says the writer checks each counter for active readers. After marking, the
//!    writer waits at each counter until ARRIVE (less the WRITE mark) equals DEPART.
//! 3. **A reader's reset never clears the WRITE mark.** Listing 6 clears it in every reset,
//!    but a reader's reset (Listing 9, line 20) can run just after a writer marked the
//!    counter; clearing the mark there would let readers in beside the writer. Readers
//!    reset with the mark kept; the writer's release (Listing 8) clears it. A reset subtracts
//!    from DEPART before ARRIVE, so a writer that reads ARRIVE then DEPART never counts
//!    fewer active readers than there are (see 6); the mark is recognized from `WRITE / 2`
//!    up, since two resets that read the same DEPART leave ARRIVE a little below its mark.
//! 4. **Listing 9's loop ends** when the reader's increment finds the count below `T_R`
//!    (the listing never sets `done`).
//! 5. **Readers do not wait for a writer that left.** A reader that finds `T_R` reached
//!    while a writer is queued waits for that writer's reset; but the writer may be
//!    releasing (it reset the counters, then readers reached `T_R` again before it left the
//!    queue), and then nobody would reset. A waiting reader that finds the count unmarked
//!    and no writer queued resets it itself. A reader that reset the counter backs off once
//!    before its next increment, so the readers inside (perhaps tasks of the same thread)
//!    get to leave.
//! 6. **A reset takes nothing from a DEPART below zero.** Two resets that read the same
//!    DEPART both subtract it, which leaves DEPART below zero (and ARRIVE as far below, so
//!    ARRIVE - DEPART still counts the readers). A third reset that read the negative value
//!    and subtracted it would *raise* DEPART before it raises ARRIVE, and a writer reading
//!    ARRIVE then DEPART between the two would count fewer readers than are inside: it
//!    entered beside one, about once in 10^5 acquisitions of 8 ranks. A reset therefore
//!    subtracts `max(DEPART, 0)`; the departures still to come bring DEPART back above zero.
//! 7. **The parked mark is in the predecessor's NEXT.** Where the window signals no writes
//!    (libfabric), a waiter that is about to park on the hand-off's wake frame says so where
//!    the passer reads it: in the NEXT word it linked itself into (Listing 4, line 9;
//!    Listing 2, line 9), not in its own STATUS. Listing 3's (and Listing 5's, Listing 8's)
//!    `Put(status, succ, STATUS); Flush(succ)` stays a put, which on `shm` completes when
//!    queued, without waiting for the successor's process; the passer then sets NEXT's
//!    PASSED mark with one atomic on the node's word (its own memory where it owns the node)
//!    and sends the frame only if that found the PARKED mark. The waiter marks with a
//!    compare-and-swap of NEXT from its node to its node and PARKED, after its receive of
//!    the frame is posted. Mark and claim are atomics on one word, so one comes first: if
//!    the mark does, the claim finds it and the frame comes (exactly one, to a wait that
//!    waits for it); if the claim does, the mark fails, no frame comes, and the waiter
//!    polls STATUS, which the put before the claim wrote. See [`Queues::wait_status`],
//!    [`Queues::pass`].
//!
//! Each rank's part of the window: for each level `l` (0 is level 1, the machine) NEXT,
//! STATUS, TAIL at `3l..3l+3` (NEXT's two high bits are the marks of 7); the OWNER words at `3N..4N`; ARRIVE and DEPART at `4N` and
//! `4N + 1`. Ranks are stored as `rank + 1` (0 is the listings' `∅`). Then the watchers
//! words of the wake frames where the window signals no writes (libfabric; [`Wakes`]: not
//! the listings' words, and the protocol never reads them): a counter's waiting readers at
//! `4N + 2`, a writer waiting for its readers at `4N + 3`, each level's NEXT at `4N + 4 + l`.

use parking_lot::Mutex;
use weft_sync::Error;

use super::levels::Machine;
use super::wait::{arm, block_on, checked, Armed, Backoff, LocalLock, Wakes, Watching};
use super::LOCK_ENDED;
use crate::comm::Communicator;
use crate::rma::{Op, Window};

/// Waits until `$check`, an expression that reads the words `$words` of `$q`'s window (with
/// `.await` and `?`), gives `Some(value)`; evaluates to the value. Before each check the
/// wait is armed (a listener for the words registered where the window has one), then, if
/// the check gave `None`, waited on ([`Armed`]): the listings' local spin, parked where the
/// transport signals writes.
///
/// A check that failed while a rank of the lock's communicator is gone (lost or finished)
/// ends the wait with `PeerLost` naming it: the write the wait is for may never come (the
/// rank may have held the lock, or a place in a queue ahead), and a write that landed
/// before its writer went was seen by the check, which is made after the loss was known
/// (a loss learnt after a check that failed leads to one more check). So does a check
/// that failed after a rank ended its part of the lock's window (dropped the lock), with
/// [`LOCK_ENDED`]: that rank writes nothing more, and every write it made landed before
/// its notice of the end left it ([`Window::ended_peer`]), so a check made after the notice
/// was seen (the end is sampled before the check) sees them all. A successor passed the lock by a rank that
/// then at once dropped it therefore takes the lock, whichever of the hand-off's put
/// (libfabric RMA) and the notice (a message, on `shm` through the same-host lane) reached
/// it first. Every park ends within
/// [`WAKE_ALARM`](super::WAKE_ALARM) of a loss: at once where the rank's doorbell or the
/// written words' signals wake it (a task, the embedded provider), at its alarm where a
/// thread waits for a wake frame as a blocked receive.
macro_rules! until {
    ($q:expr, $words:expr, $check:expr) => {
        until!($q, backoff => $q.window.arm(&backoff, $words), $check)
    };
    // Armed by `$arm`, an expression of the polls so far, `$backoff`.
    ($q:expr, $backoff:ident => $arm:expr, $check:expr) => {{
        let mut _woken = false;
        until!($q, $backoff => $arm, $check, _woken)
    }};
    // `$woken` is set after each wait: whether a wake frame ended it ([`Armed::wait`]).
    ($q:expr, $backoff:ident => $arm:expr, $check:expr, $woken:ident) => {{
        let mut $backoff = Backoff::new();
        loop {
            let armed = $arm;
            // Before the check: a rank that ended its part did so after its writes landed,
            // and a rank known lost wrote nothing after: a check made after either was
            // known sees every write it made. (A check made before a loss was known may
            // have missed a write that landed just before it: it is made again.)
            let ended = $q.window.ended(&$backoff).is_some();
            let lost = $q.window.lost();
            checked();
            if let Some(v) = $check {
                break v;
            }
            if let Some(rank) = lost {
                return Err(Error::PeerLost { rank });
            }
            if ended {
                return Err(LOCK_ENDED);
            }
            $woken = armed.wait(&mut $backoff).await;
        }
    }};
}

/// The one-sided operations the protocols make on the words of a lock's window, each one
/// complete (at its target) when its future is: the listings' `Get`, `Put` + `Flush`,
/// `Accumulate`/`FAO` + `Flush`, `CAS` + `Flush`, and their waits. The lock's RMA window
/// does them; the protocols' model (tests) does them on memory of its own, each one a step
/// its scheduler interleaves with the other processes' steps, so that it runs this module's
/// code itself.
pub(super) trait Words: Send + Sync {
    /// This process's rank.
    fn rank(&self) -> u32;
    /// The processes.
    fn size(&self) -> u32;
    /// Reads `out.len()` words at `offset` of `rank`'s part.
    async fn get(&self, rank: u32, offset: usize, out: &mut [u64]) -> Result<(), Error>;
    /// Writes `data` at `offset` of `rank`'s part, complete at the next [`put`](Self::put)
    /// to `rank` (a `Put` whose `Flush` comes with the next one).
    async fn put_unflushed(&self, rank: u32, offset: usize, data: &[u64]) -> Result<(), Error>;
    /// Writes `data` at `offset` of `rank`'s part, complete on return.
    async fn put(&self, rank: u32, offset: usize, data: &[u64]) -> Result<(), Error>;
    /// Atomic read-modify-write of one word; returns its old value.
    async fn fetch_and_op(&self, rank: u32, offset: usize, operand: u64, op: Op) -> Result<u64, Error>;
    /// Atomic compare-and-swap of one word; returns its old value.
    async fn compare_and_swap(&self, rank: u32, offset: usize, compare: u64, swap: u64) -> Result<u64, Error>;
    /// Arms the next wait for the `N` words `words` after the polls `backoff` counted
    /// ([`Armed`]; see `until!`).
    fn arm<const N: usize>(&self, backoff: &Backoff, words: [(u32, usize); N]) -> Armed<'_, N>;
    /// A short pause before trying again.
    async fn pause(&self);
    /// The window itself, where these are a window's words (wake frames need one).
    fn as_window(&self) -> Option<&Window<'_, u64>>;
    /// Whether a hand-off's waiter parks on a wake frame (and marks its predecessor's NEXT first,
    /// [`Queues::wait_status`]): where the queues have wake frames, `wakes`.
    fn frames(&self, wakes: Option<&Wakes>) -> bool;
    /// Arms the next wait for the wake frame with tag `tag` after the polls `backoff`
    /// counted (a receive posted before the check, [`Wakes::arm`]); `None` while the
    /// waiter still polls.
    fn arm_frame<'a>(&'a self, wakes: Option<&'a Wakes>, backoff: &Backoff, tag: usize) -> Option<Armed<'a, 1>>;
    /// Sends `rank` the wake frame with tag `tag` ([`Wakes::wake`]).
    fn wake(&self, wakes: Option<&Wakes>, rank: u32, tag: usize) -> Result<(), Error>;
    /// Consumes the wake frames with tag `tag` that came to this process and that no wait
    /// took ([`Wakes::drain`]).
    fn drain(&self, wakes: Option<&Wakes>, tag: usize);
    /// A process that is gone (lost or finished), if any: a wait for a word it may have
    /// been about to write fails with `PeerLost` naming it.
    fn lost(&self) -> Option<u32>;
    /// Whether process `rank` ended its part of the words, as far as this one knows.
    fn ended_rank(&self, rank: u32) -> bool;
    /// A process that ended its part of the words (dropped its lock), if any, as far as
    /// this one knows, every write it made complete at its target: a wait whose check,
    /// made after this said so, failed, fails with [`LOCK_ENDED`]. Once `backoff` passed
    /// the first polls (the waiter may park next), this process first makes progress (the
    /// notices of the ends are messages).
    fn ended(&self, backoff: &Backoff) -> Option<u32>;
}

impl Words for Window<'_, u64> {
    fn rank(&self) -> u32 {
        Window::rank(self)
    }

    fn size(&self) -> u32 {
        Window::size(self)
    }

    async fn get(&self, rank: u32, offset: usize, out: &mut [u64]) -> Result<(), Error> {
        Window::get(self, rank, offset, out)
    }

    async fn put_unflushed(&self, rank: u32, offset: usize, data: &[u64]) -> Result<(), Error> {
        Window::put(self, rank, offset, data)
    }

    async fn put(&self, rank: u32, offset: usize, data: &[u64]) -> Result<(), Error> {
        Window::put(self, rank, offset, data)?;
        self.flush(rank)
    }

    async fn fetch_and_op(&self, rank: u32, offset: usize, operand: u64, op: Op) -> Result<u64, Error> {
        Window::fetch_and_op(self, rank, offset, operand, op)
    }

    async fn compare_and_swap(&self, rank: u32, offset: usize, compare: u64, swap: u64) -> Result<u64, Error> {
        Window::compare_and_swap(self, rank, offset, compare, swap)
    }

    fn arm<const N: usize>(&self, backoff: &Backoff, words: [(u32, usize); N]) -> Armed<'_, N> {
        arm(self, backoff, words)
    }

    async fn pause(&self) {
        Backoff::new().snooze().await;
    }

    fn lost(&self) -> Option<u32> {
        self.lost_peer()
    }

    fn ended_rank(&self, rank: u32) -> bool {
        self.has_ended(rank)
    }

    #[inline(never)]
    fn ended(&self, backoff: &Backoff) -> Option<u32> {
        if backoff.parking() {
            self.progress();
        }
        self.ended_peer()
    }

    fn as_window(&self) -> Option<&Window<'_, u64>> {
        Some(self)
    }

    fn frames(&self, wakes: Option<&Wakes>) -> bool {
        wakes.is_some()
    }

    fn arm_frame<'a>(&'a self, wakes: Option<&'a Wakes>, backoff: &Backoff, tag: usize) -> Option<Armed<'a, 1>> {
        wakes?.arm(backoff, tag)
    }

    fn wake(&self, wakes: Option<&Wakes>, rank: u32, tag: usize) -> Result<(), Error> {
        wakes.map_or(Ok(()), |w| w.wake(rank, tag))
    }

    fn drain(&self, wakes: Option<&Wakes>, tag: usize) {
        if let Some(w) = wakes {
            w.drain(tag);
        }
    }
}

/// The watchers slots ([`Wakes`]) of the waits of one rank: readers at their counter, a
/// writer at a counter, a releaser for NEXT.
const READERS_SLOT: usize = 0;
const WRITER_SLOT: usize = 1;
const NEXT_SLOT: usize = 2;

/// STATUS: spin (the listings' `WAIT`).
pub(super) const WAIT: u64 = u64::MAX;
/// NEXT: the successor it names parks on the hand-off's wake frame (where the window
/// signals no writes; [`Queues::pass`] sends the frame only then). Not the listings'.
pub(super) const NEXT_PARKED: u64 = 1 << 62;
/// NEXT: the lock was passed to the successor it names (its STATUS written). Not the
/// listings'.
pub(super) const NEXT_PASSED: u64 = 1 << 63;
/// The rank's node in a NEXT word, without the marks.
pub(super) const NEXT_NODE: u64 = NEXT_PARKED - 1;
/// STATUS: acquire the parent level (§3.2.3).
pub(super) const ACQUIRE_PARENT: u64 = u64::MAX - 1;
/// STATUS at level 1: the lock went to the readers; take it back from them (§3.3.3).
pub(super) const MODE_CHANGE: u64 = u64::MAX - 2;
/// STATUS of a writer that acquired a level itself: no passings within the element yet.
pub(super) const ACQUIRE_START: u64 = 0;
/// The WRITE mark added to an ARRIVE counter (`INT64_MAX/2`, Listing 6).
pub(super) const WRITE: i64 = i64::MAX / 2;

/// `rank + 1`: the encoding of a rank in a queue word (0 is "nobody", the paper's `∅`).
pub(super) fn node(rank: u32) -> u64 {
    u64::from(rank) + 1
}

fn rank_of(node: u64) -> u32 {
    (node - 1) as u32
}

/// RMA-RW's distributed counter and thresholds [Schmid 2016, §3.2.1, §3.2.3].
#[derive(Clone, Copy, Debug)]
pub(super) struct Counters {
    /// One physical counter on every `t_dc`-th rank.
    pub(super) t_dc: u32,
    /// Readers that may enter consecutively while a writer waits.
    pub(super) t_r: i64,
    /// Writer acquisitions at level 1 before the lock goes to the readers.
    pub(super) t_w: u64,
}

/// What one pass of a reader's acquire loop found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Attempt {
    /// In the CS.
    Entered,
    /// This reader reset the counter: try again at once.
    Again,
    /// A writer has the lock or `T_R` was reached: wait until the counter is reset.
    Wait,
}

/// Where a hand-off's waiter stands with its parked mark ([`Queues::wait_status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mark {
    /// Not marked (still polling, or the receive of the frame not yet posted).
    Unmarked,
    /// Marked by this check.
    JustMarked,
    /// Marked before the passer's claim: the frame comes, and the wait takes it.
    Marked,
    /// The mark found the word claimed (or reset), or the frame came: STATUS is written,
    /// and polled.
    Passed,
}

/// Where a lock's words are in each rank's part of its window, for `N` levels (module
/// docs): NEXT, STATUS, TAIL per level, the OWNER words, ARRIVE and DEPART.
#[derive(Clone, Copy, Debug)]
pub(super) struct Layout(pub(super) usize);

impl Layout {
    /// Words per rank.
    pub(super) fn words(self) -> usize {
        5 * self.0 + 4
    }

    pub(super) fn next(l: usize) -> usize {
        3 * l
    }

    pub(super) fn status(l: usize) -> usize {
        3 * l + 1
    }

    pub(super) fn tail(l: usize) -> usize {
        3 * l + 2
    }

    pub(super) fn owners(self) -> usize {
        3 * self.0
    }

    pub(super) fn arrive(self) -> usize {
        4 * self.0
    }

    pub(super) fn depart(self) -> usize {
        4 * self.0 + 1
    }

    /// The watchers word of a counter's waiting readers ([`Wakes`]).
    pub(super) fn readers_watch(self) -> usize {
        4 * self.0 + 2
    }

    /// The watchers word of a writer waiting for a counter's readers to leave.
    pub(super) fn writer_watch(self) -> usize {
        4 * self.0 + 3
    }

    /// The watchers word of a node's NEXT at level `l` (a releaser waiting for it).
    pub(super) fn next_watch(self, l: usize) -> usize {
        4 * self.0 + 4 + l
    }
}

/// The queues of one lock on one rank (and, for RMA-RW, its counters), on the words `W`
/// (the lock's window).
pub(super) struct Queues<W = Window<'static, u64>> {
    pub(super) window: W,
    machine: Machine,
    /// `T_L,i` per level index (index 0, level 1, is not used: RMA-MCS passes there
    /// without limit, RMA-RW counts to `T_W`).
    t_l: Vec<u64>,
    pub(super) counters: Option<Counters>,
    /// Orders the writers of this rank (one queue node per level).
    pub(super) local: LocalLock,
    /// While this rank holds the lock as a writer: per level, the rank whose node holds it.
    held: Mutex<Vec<u32>>,
    /// Where the window signals no writes (libfabric): the wake frames of its waits.
    wakes: Option<Wakes>,
}

impl<W: Words> std::fmt::Debug for Queues<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queues").field("rank", &self.window.rank()).field("levels", &self.machine.depth()).field("t_l", &self.t_l).finish()
    }
}

impl Queues {
    /// Creates the window (collective). `t_l` has one threshold per level.
    pub(super) fn new(comm: &Communicator, machine: Machine, t_l: Vec<u64>, counters: Option<Counters>) -> Result<Self, Error> {
        let window = comm.window(Layout(machine.depth()).words())?;
        let wakes = Wakes::new(comm, &window)?;
        let mut q = Queues::on(window, machine, t_l, counters)?;
        q.wakes = wakes;
        Ok(q)
    }
}

impl<W: Words> Queues<W> {
    /// The queues on `window`, which holds [`Layout::words`] words per rank, zeroed.
    pub(super) fn on(window: W, machine: Machine, t_l: Vec<u64>, counters: Option<Counters>) -> Result<Self, Error> {
        let n = machine.depth();
        debug_assert_eq!(t_l.len(), n);
        if t_l.contains(&0) {
            return Err(Error::InvalidArgument("a locality threshold T_L,i is 0"));
        }
        Ok(Queues { window, machine, t_l, counters, local: LocalLock::new(), held: Mutex::new(vec![0; n]), wakes: None })
    }

    fn depth(&self) -> usize {
        self.machine.depth()
    }

    fn owners(&self) -> usize {
        Layout(self.depth()).owners()
    }

    fn arrive(&self) -> usize {
        Layout(self.depth()).arrive()
    }

    fn depart(&self) -> usize {
        Layout(self.depth()).depart()
    }

    fn me(&self) -> u32 {
        self.window.rank()
    }

    /// One word of `rank`'s part, read with a get (the listings' `Get` and `Flush`).
    async fn get(&self, rank: u32, offset: usize) -> Result<u64, Error> {
        let mut v = [0u64];
        self.window.get(rank, offset, &mut v).await?;
        Ok(v[0])
    }

    /// `rank`'s NEXT at level `l` (`Get(rank, NEXT)`): the node it names, without the marks
    /// of the hand-off (beyond the listing, 7).
    async fn get_next(&self, rank: u32, l: usize) -> Result<u64, Error> {
        Ok(self.get(rank, Layout::next(l)).await? & NEXT_NODE)
    }

    /// The listings' `Put(value, rank, offset); Flush(rank)`.
    async fn put(&self, rank: u32, offset: usize, value: u64) -> Result<(), Error> {
        self.window.put(rank, offset, &[value]).await
    }

    /// A counter word, read atomically (it is only ever changed by atomics).
    async fn read_atomic(&self, rank: u32, offset: usize) -> Result<i64, Error> {
        Ok(self.window.fetch_and_op(rank, offset, 0, Op::NoOp).await? as i64)
    }

    /// `Accumulate(value, rank, offset, SUM); Flush(rank)`.
    async fn add(&self, rank: u32, offset: usize, value: i64) -> Result<i64, Error> {
        Ok(self.window.fetch_and_op(rank, offset, value as u64, Op::Sum).await? as i64)
    }

    /// The wake frames queued unreceived at this rank, consumed (tests; 0 where the window
    /// signals writes).
    #[cfg(all(test, feature = "ofi"))]
    pub(super) fn take_queued_wakes(&self) -> usize {
        self.wakes.as_ref().map_or(0, Wakes::take_queued)
    }

    /// Waits until `rank`'s NEXT at level `l` names a successor (Listing 3, line 8; Listing
    /// 5, line 18); returns it. Parks until the word is written where the transport says
    /// so ([`until`]), else on the wake frame of the successor, which reads the watchers
    /// word of the NEXT it wrote ([`Self::notify`]).
    async fn wait_next(&self, l: usize, rank: u32) -> Result<u64, Error> {
        let (offset, mut watching) = (Layout::next(l), None);
        let watch = (rank, Layout(self.depth()).next_watch(l), NEXT_SLOT);
        let next = until!(
            self,
            backoff => self.arm_watched(&backoff, &mut watching, watch, [(rank, offset)])?,
            Some(self.get(rank, offset).await? & NEXT_NODE).filter(|&v| v != 0)
        );
        drop(watching);
        Ok(next)
    }

    /// Arms the next wait for words `words` that other ranks change, watched at `(home,
    /// watchers word, slot)` ([`Wakes::arm_watched`]); as [`Words::arm`] where the window
    /// signals writes, while the waiter spins, or with more than 64 ranks.
    fn arm_watched<'a, const N: usize>(
        &'a self,
        backoff: &Backoff,
        watching: &mut Option<Watching<'a>>,
        watch: (u32, usize, usize),
        words: [(u32, usize); N],
    ) -> Result<Armed<'a, N>, Error> {
        if let (Some(wakes), Some(window)) = (self.wakes.as_ref(), self.window.as_window()) {
            if let Some(armed) = wakes.arm_watched(window, backoff, watching, watch)? {
                return Ok(armed);
            }
        }
        Ok(self.window.arm(backoff, words))
    }

    /// After a change of words watched at `home`'s watchers word `word` (complete there):
    /// wakes the ranks waiting on them, where the window signals no writes.
    fn notify(&self, home: u32, word: usize) -> Result<(), Error> {
        match (self.wakes.as_ref(), self.window.as_window()) {
            (Some(wakes), Some(window)) => wakes.notify(window, home, word),
            _ => Ok(()),
        }
    }

    /// Waits until this rank's STATUS at level `l` is no longer `WAIT` (the listings' spin
    /// for the hand-off); returns it. `pred` is the rank whose NEXT at `l` this rank linked
    /// itself into. Where the window signals no writes, the waiter, once its first polls
    /// failed, posts the receive of the hand-off's wake frame and *marks* that NEXT parked
    /// (beyond the listing, 7): a compare-and-swap of its node to its node and
    /// [`NEXT_PARKED`]. If the word still held its node, the passer has not claimed it yet,
    /// and its claim will find the mark and send the frame: the waiter waits until the frame
    /// came (a check of the word that ends its park, a task's every `WAKE_CHECK`, a thread's
    /// every `WAKE_ALARM`, waits on), then reads STATUS, so the frame is never left for a
    /// later wait. Otherwise the lock was passed (the word has [`NEXT_PASSED`], or its owner
    /// reset it for a later acquisition) and no frame comes: the waiter polls STATUS, which
    /// the passer wrote before its claim. A hand-off its polls saw sends no frame.
    async fn wait_status(&self, l: usize, pred: u32) -> Result<u64, Error> {
        let (p, offset) = (self.me(), Layout::status(l));
        // Whether the receive of the frame is posted (the next check marks, while `mark`
        // is `Unmarked`), where the mark stands, and whether a frame ended the last wait.
        let (mut receiving, mut mark, mut woken);
        (mark, woken) = (Mark::Unmarked, false);
        let status = until!(self, backoff => {
            if mark == Mark::Marked && woken {
                mark = Mark::Passed;
            }
            let frame = if mark == Mark::Passed { None } else { self.window.arm_frame(self.wakes.as_ref(), &backoff, offset) };
            receiving = frame.is_some();
            frame.unwrap_or_else(|| self.window.arm(&backoff, [(p, offset)]))
        }, {
            let me = node(p);
            if receiving && mark == Mark::Unmarked {
                let old = match self.window.compare_and_swap(pred, Layout::next(l), me, me | NEXT_PARKED).await {
                    Ok(old) => old,
                    // The predecessor ended its part (it may have passed the lock, then
                    // dropped it at once), or is lost (it may have passed the lock before):
                    // no claim of its NEXT will send a frame. STATUS says whether it
                    // passed, and, if not, the wait fails (`until!`).
                    Err(_) if self.window.ended_rank(pred) => 0,
                    Err(Error::PeerLost { rank }) if rank == pred => 0,
                    Err(e) => return Err(e),
                };
                mark = if old == me { Mark::JustMarked } else { Mark::Passed };
            }
            match mark {
                // Its frame comes after STATUS is written.
                Mark::JustMarked => {
                    mark = Mark::Marked;
                    None
                }
                // A park that ended without the frame: STATUS may be written (the passer
                // not yet at its claim, or lost before it). Then the mark is taken back,
                // and if the claim came first, its frame is consumed.
                Mark::Marked => match self.get(p, offset).await? {
                    WAIT => None,
                    status => {
                        // A failure (the passer lost) leaves no frame to come.
                        let taken_back = self.window.compare_and_swap(pred, Layout::next(l), me | NEXT_PARKED, me).await;
                        if taken_back.is_ok_and(|old| old != me | NEXT_PARKED) {
                            self.window.drain(self.wakes.as_ref(), offset);
                        }
                        Some(status)
                    }
                },
                _ => Some(self.get(p, offset).await?).filter(|&s| s != WAIT),
            }
        }, woken);
        Ok(status)
    }

    /// Passes level `l`, held on `o`'s node, to the waiting `to`: the listings' `Put(status,
    /// to, STATUS); Flush(to)`. Where the window signals no writes, the passer then claims
    /// `o`'s NEXT (an atomic or of [`NEXT_PASSED`]) and sends the wake frame `to` parks on
    /// only if the claim found [`NEXT_PARKED`] (beyond the listing, 7). No wake-up is lost:
    /// the waiter posts its receive before it marks, and its mark and this claim are atomics
    /// on one word, so one of them comes first. If the mark does, the claim finds it and
    /// sends the frame, which the posted receive (or a later one of that wait) takes; if the
    /// claim does, the mark's compare-and-swap fails, and the waiter polls STATUS, written
    /// before the claim, and does not park. One frame at most goes to a wait (it marks
    /// once), and a wait that marked in time waits for it.
    /// The put does not wait for `to`'s process (on `shm`, it completes when queued); the
    /// claim is on `o`'s word, this rank's own unless the node was inherited. (The embedded
    /// provider's put wakes the word's listeners itself.)
    async fn pass(&self, o: u32, to: u32, l: usize, status: u64) -> Result<(), Error> {
        let offset = Layout::status(l);
        self.put(to, offset, status).await?;
        if !self.window.frames(self.wakes.as_ref()) {
            return Ok(());
        }
        if self.window.fetch_and_op(o, Layout::next(l), NEXT_PASSED, Op::BitOr).await? & NEXT_PARKED != 0 {
            self.window.wake(self.wakes.as_ref(), to, offset)?;
        }
        Ok(())
    }

    /// Acquires the lock as a writer: Listing 4 from level `N` up, Listing 7 at level 1 for
    /// RMA-RW (Listing 4 there for RMA-MCS). The caller holds `local`.
    pub(super) async fn writer_acquire(&self) -> Result<(), Error> {
        let p = self.me();
        let n = self.depth();
        let mut held = vec![p; n];
        for l in (0..n).rev() {
            let tail_rank = self.machine.tail_rank(l, p);
            // Listing 4, lines 2-6: prepare the node, enter the DQ of e(p, i).
            self.window.put_unflushed(p, Layout::next(l), &[0]).await?;
            self.put(p, Layout::status(l), WAIT).await?;
            let pred = self.window.fetch_and_op(tail_rank, Layout::tail(l), node(p), Op::Replace).await?;
            if pred != 0 {
                // Lines 8-12: make pred see us, wait until it passes the lock.
                self.put(rank_of(pred), Layout::next(l), node(p)).await?;
                // A predecessor that ended its part since (it may have seen NEXT, passed
                // the lock and dropped it at once) has no watchers left to wake.
                match self.notify(rank_of(pred), Layout(n).next_watch(l)) {
                    Err(_) if self.window.ended_rank(rank_of(pred)) => {}
                    r => r?,
                }
                let status = self.wait_status(l, rank_of(pred)).await?;
                if l == 0 {
                    // Listing 7, lines 14-17: the readers have the lock; take it back.
                    if status == MODE_CHANGE {
                        self.counters_to_write().await?;
                        self.put(p, Layout::status(0), ACQUIRE_START).await?;
                    }
                    break;
                }
                if status != ACQUIRE_PARENT {
                    // Lines 15-18: passed within the element. Beyond the listing (1): the
                    // nodes above this level are the ones the passer named.
                    let mut owners = vec![0u64; l];
                    self.window.get(p, self.owners(), &mut owners).await?;
                    held[..l].iter_mut().zip(&owners).for_each(|(h, &o)| *h = rank_of(o));
                    break;
                }
            } else if l == 0 {
                // Listing 7, lines 19-22: no predecessor; the lock is taken from the readers.
                if self.counters.is_some() {
                    self.counters_to_write().await?;
                    self.put(p, Layout::status(0), ACQUIRE_START).await?;
                }
                break;
            }
            // Lines 22-23: acquire the parent level.
            self.put(p, Layout::status(l), ACQUIRE_START).await?;
        }
        *self.held.lock() = held;
        Ok(())
    }

    /// Acquires the lock as a writer if no writer holds or waits for it at any level (and,
    /// for RMA-RW, no reader holds it): one compare-and-swap of each tail from level `N`
    /// up. The caller holds `local`.
    pub(super) fn try_writer_acquire(&self) -> Result<bool, Error> {
        block_on(self.try_writer_acquire_async())
    }

    async fn try_writer_acquire_async(&self) -> Result<bool, Error> {
        let p = self.me();
        let n = self.depth();
        for l in (0..n).rev() {
            self.window.put_unflushed(p, Layout::next(l), &[0]).await?;
            self.put(p, Layout::status(l), ACQUIRE_START).await?;
            if self.window.compare_and_swap(self.machine.tail_rank(l, p), Layout::tail(l), 0, node(p)).await? != 0 {
                // Leave the levels below, from the top down (as Listing 5 does).
                for j in l + 1..n {
                    let next = self.get_next(p, j).await?;
                    self.leave(j, p, next, ACQUIRE_PARENT).await?;
                }
                return Ok(false);
            }
        }
        if let Some(c) = self.counters {
            let ranks = (0..self.window.size()).step_by(c.t_dc as usize);
            for r in ranks.clone() {
                self.add(r, self.arrive(), WRITE).await?;
            }
            let mut drained = true;
            for r in ranks {
                drained &= self.active_readers(r).await? == 0;
            }
            if !drained {
                // Give the lock back to the readers (Listing 8 with the counters reset).
                self.reset_counters().await?;
                let next = self.get_next(p, 0).await?;
                self.leave(0, p, next, MODE_CHANGE).await?;
                for j in 1..n {
                    let next = self.get_next(p, j).await?;
                    self.leave(j, p, next, ACQUIRE_PARENT).await?;
                }
                return Ok(false);
            }
        }
        *self.held.lock() = vec![p; n];
        Ok(true)
    }

    /// Releases the lock this rank holds as a writer: Listing 5 from level `N` up, Listing 8
    /// (RMA-RW) or Listing 3 (RMA-MCS) at level 1. The recursion of Listing 5 runs as two
    /// loops: up to the level that passes the lock (or level 1), then each level below it
    /// is left from the top down.
    pub(super) async fn writer_release(&self) -> Result<(), Error> {
        let held = self.held.lock().clone();
        let n = self.depth();
        let mut succ = vec![0u64; n];
        let mut top = 0;
        for l in (1..n).rev() {
            // Listing 5, lines 3-9.
            let o = held[l];
            succ[l] = self.get_next(o, l).await?;
            let status = self.get(o, Layout::status(l)).await?;
            if succ[l] != 0 && status < self.t_l[l] {
                // Beyond the listing (1): name the nodes of the levels above first.
                let to = rank_of(succ[l]);
                let owners: Vec<u64> = held[..l].iter().map(|&r| node(r)).collect();
                self.window.put(to, self.owners(), &owners).await?;
                self.pass(o, to, l, status + 1).await?;
                top = l;
                break;
            }
        }
        if top == 0 {
            self.root_release(held[0]).await?;
        }
        for l in top + 1..n {
            // Listing 5, lines 13-23.
            self.leave(l, held[l], succ[l], ACQUIRE_PARENT).await?;
        }
        Ok(())
    }

    /// Releases level 1 on `o`'s node: Listing 8 (RMA-RW) or Listing 3 (RMA-MCS).
    async fn root_release(&self, o: u32) -> Result<(), Error> {
        let Some(c) = self.counters else {
            let succ = self.get_next(o, 0).await?;
            return self.leave(0, o, succ, ACQUIRE_START + 1).await;
        };
        // Listing 8, lines 2-8.
        let mut counters_reset = false;
        let mut next_stat = self.get(o, Layout::status(0)).await?.wrapping_add(1);
        if next_stat >= c.t_w {
            self.reset_counters().await?;
            next_stat = MODE_CHANGE;
            counters_reset = true;
        }
        // Lines 9-13.
        let succ = self.get_next(o, 0).await?;
        if succ == 0 && !counters_reset {
            self.reset_counters().await?;
            next_stat = MODE_CHANGE;
        }
        // Lines 14-23.
        self.leave(0, o, succ, next_stat).await
    }

    /// Hands level `l` of `o`'s node to `succ` with `status`; with no known successor,
    /// first leaves the DQ if nobody entered it since (Listing 5, lines 13-23; Listing 8,
    /// lines 14-23; Listing 3).
    async fn leave(&self, l: usize, o: u32, succ: u64, status: u64) -> Result<(), Error> {
        let mut succ = succ;
        if succ == 0 {
            if self.window.compare_and_swap(self.machine.tail_rank(l, o), Layout::tail(l), node(o), 0).await? == node(o) {
                return Ok(());
            }
            succ = self.wait_next(l, o).await?;
        }
        self.pass(o, rank_of(succ), l, status).await
    }

    /// `set_counters_to_WRITE` (Listing 6, lines 2-7), then (beyond the listing, 2) the wait
    /// at each counter until its readers left.
    async fn counters_to_write(&self) -> Result<(), Error> {
        let Some(c) = self.counters else { return Ok(()) };
        let ranks = (0..self.window.size()).step_by(c.t_dc as usize);
        for r in ranks.clone() {
            self.add(r, self.arrive(), WRITE).await?;
        }
        for r in ranks {
            // The count falls with a reader's departure (DEPART) or back-off (ARRIVE); each
            // notifies the watchers of the counter's writer.
            let words = [(r, self.arrive()), (r, self.depart())];
            let (watch, mut watching) = ((r, Layout(self.depth()).writer_watch(), WRITER_SLOT), None);
            until!(
                self,
                backoff => self.arm_watched(&backoff, &mut watching, watch, words)?,
                (self.active_readers(r).await? == 0).then_some(())
            );
        }
        Ok(())
    }

    /// Readers in the CS or on their way in or out at counter `r` (ARRIVE less its WRITE
    /// mark, less DEPART; ARRIVE read first).
    async fn active_readers(&self, r: u32) -> Result<i64, Error> {
        let arrive = self.read_atomic(r, self.arrive()).await?;
        let depart = self.read_atomic(r, self.depart()).await?;
        let unmarked = if arrive >= WRITE / 2 { arrive.wrapping_sub(WRITE) } else { arrive };
        Ok(unmarked.wrapping_sub(depart))
    }

    /// `reset_counter` (Listing 6, lines 10-24); a reader's keeps the WRITE mark (beyond the
    /// listing, 3).
    async fn reset_counter(&self, r: u32, clear_write: bool) -> Result<(), Error> {
        let arr_cnt = self.read_atomic(r, self.arrive()).await?;
        // Beyond the listing (6): nothing is taken from a DEPART below zero.
        let dep_cnt = self.read_atomic(r, self.depart()).await?.max(0);
        let mut sub_arr_cnt = dep_cnt.wrapping_neg();
        if clear_write && arr_cnt >= WRITE / 2 {
            sub_arr_cnt = sub_arr_cnt.wrapping_sub(WRITE);
        }
        if dep_cnt != 0 {
            self.add(r, self.depart(), dep_cnt.wrapping_neg()).await?;
        }
        if sub_arr_cnt != 0 {
            self.add(r, self.arrive(), sub_arr_cnt).await?;
        }
        self.notify(r, Layout(self.depth()).readers_watch())
    }

    /// `reset_counters` (Listing 6, lines 27-28), by the writer that holds the lock.
    async fn reset_counters(&self) -> Result<(), Error> {
        let c = self.counters.expect("RMA-RW");
        for r in (0..self.window.size()).step_by(c.t_dc as usize) {
            self.reset_counter(r, true).await?;
        }
        Ok(())
    }

    /// `c(p)`: this rank's physical counter.
    fn counter(&self, c: &Counters) -> u32 {
        self.me() / c.t_dc * c.t_dc
    }

    /// One pass of Listing 9's loop (lines 11-24) at counter `r`.
    async fn reader_attempt(&self, c: &Counters, r: u32) -> Result<Attempt, Error> {
        let curr_stat = self.add(r, self.arrive(), 1).await?;
        if curr_stat < c.t_r {
            return Ok(Attempt::Entered);
        }
        let mut next = Attempt::Wait;
        if curr_stat == c.t_r {
            // The first to reach T_R: to the writers if there are any, else reset.
            if !self.writers_queued().await? {
                self.reset_counter(r, false).await?;
                next = Attempt::Again;
            }
        }
        // Line 24: back off.
        self.add(r, self.arrive(), -1).await?;
        self.notify(r, Layout(self.depth()).writer_watch())?;
        Ok(next)
    }

    /// Acquires the lock as a reader (Listing 9).
    pub(super) async fn reader_acquire(&self) -> Result<(), Error> {
        let c = self.counters.expect("RMA-RW");
        let r = self.counter(&c);
        let mut barrier = false;
        loop {
            if barrier {
                // Lines 5-9: wait until the counter is reset. Beyond the listing (5): with no
                // WRITE mark and no writer at level 1, nobody else will reset it.
                // A reset writes ARRIVE; a writer leaving the queue, the TAIL of level 1.
                // A reset notifies the watchers of the counter's readers (a writer's leaving
                // the queue does not: a reader that waits only for that checks its words
                // every `WAKE_CHECK` or `WAKE_ALARM`).
                let words = [(r, self.arrive()), (self.machine.tail_rank(0, self.me()), Layout::tail(0))];
                let (watch, mut watching) = ((r, Layout(self.depth()).readers_watch(), READERS_SLOT), None);
                until!(self, backoff => self.arm_watched(&backoff, &mut watching, watch, words)?, {
                    let curr_stat = self.read_atomic(r, self.arrive()).await?;
                    if curr_stat < c.t_r {
                        Some(())
                    } else if curr_stat < WRITE / 2 && !self.writers_queued().await? {
                        self.reset_counter(r, false).await?;
                        Some(())
                    } else {
                        None
                    }
                });
            }
            match self.reader_attempt(&c, r).await? {
                Attempt::Entered => return Ok(()),
                Attempt::Again => {
                    // Beyond the listing (5): the readers inside must get to leave first.
                    barrier = false;
                    self.window.pause().await;
                }
                Attempt::Wait => barrier = true,
            }
        }
    }

    /// Whether a writer is in the queue of level 1 (its TAIL is set).
    async fn writers_queued(&self) -> Result<bool, Error> {
        let tail_rank = self.machine.tail_rank(0, self.me());
        Ok(self.window.fetch_and_op(tail_rank, Layout::tail(0), 0, Op::NoOp).await? != 0)
    }

    /// One attempt of Listing 9, and a second at once when this reader reset the counter.
    pub(super) fn try_reader_acquire(&self) -> Result<bool, Error> {
        let c = self.counters.expect("RMA-RW");
        let r = self.counter(&c);
        block_on(async {
            Ok(match self.reader_attempt(&c, r).await? {
                Attempt::Entered => true,
                Attempt::Again => self.reader_attempt(&c, r).await? == Attempt::Entered,
                Attempt::Wait => false,
            })
        })
    }

    /// Releases the lock as a reader (Listing 10).
    pub(super) async fn reader_release(&self) -> Result<(), Error> {
        let c = self.counters.expect("RMA-RW");
        let r = self.counter(&c);
        self.add(r, self.depart(), 1).await?;
        self.notify(r, Layout(self.depth()).writer_watch())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;
    #[cfg(feature = "ofi")]
    use crate::dlock::wait::waits_here;
    use crate::dlock::{Levels, RmaRw, Thresholds};
    use crate::Runtime;

    /// One rank's RMA-RW with `T_R` 2 and its counter words, on a thread bounded in time.
    fn one_rank(what: &'static str, f: fn(&RmaRw, &Queues)) {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let rt = Runtime::builder().env(false).build_local(1).unwrap().pop().unwrap();
            let lock = RmaRw::new(rt.world(), &Levels::flat(), &Thresholds { t_r: 2, ..Thresholds::default() }).unwrap();
            f(&lock, &lock.q);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("hang: {what}"));
    }

    /// ARRIVE and DEPART of rank 0's counter.
    fn counts(q: &Queues) -> (i64, i64) {
        block_on(async { Ok::<_, Error>((q.read_atomic(0, q.arrive()).await?, q.read_atomic(0, q.depart()).await?)) }).unwrap()
    }

    /// A counter past `T_R` with no WRITE mark and no writer queued (a writer reset it and
    /// left the queue only after readers reached `T_R` again): a reader resets it itself
    /// (beyond the listing, 5) instead of waiting for a writer that is gone.
    #[test]
    fn a_reader_resets_a_counter_no_writer_will_reset() {
        one_rank("a counter nobody resets", |lock, q| {
            block_on(q.add(0, q.arrive(), 3)).unwrap();
            block_on(q.add(0, q.depart(), 3)).unwrap();
            let g = lock.read().unwrap();
            assert_eq!(counts(q), (1, 0), "reset, then this reader");
            g.unlock().unwrap();
        });
    }

    /// A reader's reset keeps a writer's WRITE mark (beyond the listing, 3); the writer's
    /// clears it; both keep ARRIVE - DEPART.
    #[test]
    fn only_a_writers_reset_clears_the_write_mark() {
        one_rank("resets", |_, q| {
            block_on(q.add(0, q.arrive(), WRITE + 5)).unwrap();
            block_on(q.add(0, q.depart(), 4)).unwrap();
            block_on(q.reset_counter(0, false)).unwrap();
            assert_eq!(counts(q), (WRITE + 1, 0));
            assert_eq!(block_on(q.active_readers(0)).unwrap(), 1);
            block_on(q.reset_counter(0, true)).unwrap();
            assert_eq!(counts(q), (1, 0));
        });
    }

    /// A reset that reads a DEPART below zero (two resets took the same departures) takes
    /// nothing from it (beyond the listing, 6): raising DEPART before ARRIVE would let a
    /// writer count fewer readers than are inside.
    #[test]
    fn a_reset_takes_nothing_from_a_depart_below_zero() {
        one_rank("a negative DEPART", |_, q| {
            block_on(q.add(0, q.arrive(), -1)).unwrap();
            block_on(q.add(0, q.depart(), -2)).unwrap();
            block_on(q.reset_counter(0, false)).unwrap();
            assert_eq!(counts(q), (-1, -2));
            assert_eq!(block_on(q.active_readers(0)).unwrap(), 1);
        });
    }

    /// A rank's words whose first check of its STATUS at level 1 (reading `WAIT`) races
    /// with the hand-off and the passer's loss: right after the read, the passer's put of
    /// STATUS lands and the passer (rank 1) counts as lost. With `at_mark`, the words have
    /// wake frames (as on libfabric), and the race is with the waiter's mark of the
    /// passer's NEXT instead: the put lands, the passer is lost, and the mark's
    /// compare-and-swap fails with `PeerLost`.
    struct RacedCheck<'a> {
        window: Window<'a, u64>,
        at_mark: bool,
        /// The race is still to come.
        armed: std::sync::atomic::AtomicBool,
        lost: std::sync::atomic::AtomicBool,
    }

    impl RacedCheck<'_> {
        /// The passer's put of this rank's STATUS (Listing 3: passed, the count 1), then its
        /// loss.
        async fn passed_then_lost(&self) -> Result<(), Error> {
            Words::put(&self.window, self.rank(), Layout::status(0), &[1]).await?;
            self.lost.store(true, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }

    impl Words for RacedCheck<'_> {
        fn rank(&self) -> u32 {
            Words::rank(&self.window)
        }

        fn size(&self) -> u32 {
            Words::size(&self.window)
        }

        async fn get(&self, rank: u32, offset: usize, out: &mut [u64]) -> Result<(), Error> {
            Words::get(&self.window, rank, offset, out).await?;
            let mine = rank == self.rank() && offset == Layout::status(0);
            if !self.at_mark && mine && out.first() == Some(&WAIT) && self.armed.swap(false, std::sync::atomic::Ordering::Relaxed) {
                self.passed_then_lost().await?;
            }
            Ok(())
        }

        async fn put_unflushed(&self, rank: u32, offset: usize, data: &[u64]) -> Result<(), Error> {
            Words::put_unflushed(&self.window, rank, offset, data).await
        }

        async fn put(&self, rank: u32, offset: usize, data: &[u64]) -> Result<(), Error> {
            Words::put(&self.window, rank, offset, data).await
        }

        async fn fetch_and_op(&self, rank: u32, offset: usize, operand: u64, op: Op) -> Result<u64, Error> {
            Words::fetch_and_op(&self.window, rank, offset, operand, op).await
        }

        async fn compare_and_swap(&self, rank: u32, offset: usize, compare: u64, swap: u64) -> Result<u64, Error> {
            let mark = rank == 1 && offset == Layout::next(0) && swap & NEXT_PARKED != 0;
            if self.at_mark && mark && self.armed.swap(false, std::sync::atomic::Ordering::Relaxed) {
                self.passed_then_lost().await?;
                return Err(Error::PeerLost { rank: 1 });
            }
            Words::compare_and_swap(&self.window, rank, offset, compare, swap).await
        }

        fn arm<const N: usize>(&self, backoff: &Backoff, words: [(u32, usize); N]) -> Armed<'_, N> {
            Words::arm(&self.window, backoff, words)
        }

        async fn pause(&self) {
            Words::pause(&self.window).await;
        }

        fn as_window(&self) -> Option<&Window<'_, u64>> {
            Some(&self.window)
        }

        fn lost(&self) -> Option<u32> {
            self.lost.load(std::sync::atomic::Ordering::Relaxed).then_some(1)
        }

        fn ended_rank(&self, rank: u32) -> bool {
            Words::ended_rank(&self.window, rank)
        }

        fn ended(&self, backoff: &Backoff) -> Option<u32> {
            Words::ended(&self.window, backoff)
        }

        fn frames(&self, wakes: Option<&Wakes>) -> bool {
            self.at_mark || Words::frames(&self.window, wakes)
        }

        fn arm_frame<'a>(&'a self, wakes: Option<&'a Wakes>, backoff: &Backoff, tag: usize) -> Option<Armed<'a, 1>> {
            // A receive of the frame "posted": the waiter goes on to mark.
            if self.at_mark {
                return Some(Armed::Snooze);
            }
            Words::arm_frame(&self.window, wakes, backoff, tag)
        }

        fn wake(&self, wakes: Option<&Wakes>, rank: u32, tag: usize) -> Result<(), Error> {
            Words::wake(&self.window, wakes, rank, tag)
        }

        fn drain(&self, wakes: Option<&Wakes>, tag: usize) {
            Words::drain(&self.window, wakes, tag);
        }
    }

    /// Rank 0 waits for the lock rank 1 holds, on [`RacedCheck`] words (`at_mark` as given),
    /// the race armed once rank 1 holds it; what the acquisition gave.
    fn raced_acquisition(at_mark: bool) -> Result<(), Error> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let rts = Runtime::builder().env(false).build_local(2).unwrap();
            let machine = |c: &Communicator| Levels::flat().resolve(c).unwrap().with_root_tail(1);
            let outcome = std::thread::scope(|s| {
                let (held_tx, held_rx) = mpsc::channel();
                let (done_tx, done_rx) = mpsc::channel::<()>();
                let rts = &rts;
                s.spawn(move || {
                    let c = rts[1].world();
                    let q = Queues::new(c, machine(c), vec![1], None).unwrap();
                    c.barrier().unwrap();
                    block_on(q.writer_acquire()).unwrap();
                    held_tx.send(()).unwrap();
                    let _ = done_rx.recv();
                });
                let c = rts[0].world();
                let window = c.window(Layout(1).words()).unwrap();
                let wakes = Wakes::new(c, &window).unwrap();
                assert!(wakes.is_none(), "the embedded window signals writes");
                let raced = RacedCheck { window, at_mark, armed: false.into(), lost: false.into() };
                let q = Queues::on(raced, machine(c), vec![1], None).unwrap();
                c.barrier().unwrap();
                held_rx.recv().unwrap();
                q.window.armed.store(true, std::sync::atomic::Ordering::Relaxed);
                let outcome = block_on(q.writer_acquire());
                assert!(!q.window.armed.load(std::sync::atomic::Ordering::Relaxed), "the race never came");
                done_tx.send(()).unwrap();
                outcome
            });
            let _ = tx.send(outcome);
        });
        rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| panic!("hang: a wait raced with a hand-off and a loss"))
    }

    /// A waiter whose check of its STATUS read `WAIT` just before the hand-off's put landed,
    /// the passer lost right after the put and before the waiter's look for losses, takes
    /// the lock: the write landed before its writer went, and the wait looks for losses
    /// before each check, so it checks once more. (It looked after the check, and failed
    /// with `PeerLost` though the lock was passed to it.)
    #[test]
    fn a_check_that_raced_with_the_hand_off_and_the_loss_takes_the_lock() {
        assert_eq!(raced_acquisition(false), Ok(()), "the lock passed before the passer's loss was not taken");
    }

    /// A waiter about to park whose mark of its predecessor's NEXT fails because the
    /// predecessor was lost after passing it the lock reads STATUS and takes the lock. (It
    /// failed with the mark's `PeerLost`.)
    #[test]
    fn a_mark_that_failed_with_the_passers_loss_takes_the_lock() {
        assert_eq!(raced_acquisition(true), Ok(()), "the lock passed before the passer's loss was not taken");
    }

    /// Runs `f` on `ranks` ranks of `shm` in this process, on a thread bounded in time.
    #[cfg(feature = "ofi")]
    fn on_shm<R: Send + 'static>(ranks: u32, what: &'static str, f: impl FnOnce(&[Runtime]) -> R + Send + 'static) -> R {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let rts = Runtime::builder().env(false).provider(crate::Provider::Shm).cris(1).build_local(ranks).unwrap();
            let _ = tx.send(f(&rts));
        });
        rx.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|_| panic!("hang: {what}"))
    }

    /// A hand-off its waiter saw while it polled sends no wake frame (the waiter never
    /// marked its word parked), and leaves none to consume: one rank on `shm` hands itself
    /// its level 50 times, each time before its wait looks.
    #[cfg(feature = "ofi")]
    #[test]
    fn a_hand_off_seen_while_polling_sends_no_wake_frame() {
        let (sent, queued) = on_shm(1, "hand-offs to oneself", |rts| {
            let lock = crate::dlock::DMcs::new(rts[0].world(), 0).unwrap();
            let q = &lock.q;
            let before = waits_here();
            for _ in 0..50 {
                block_on(q.put(0, Layout::status(0), WAIT)).unwrap();
                block_on(q.pass(0, 0, 0, ACQUIRE_START)).unwrap();
                assert_eq!(block_on(q.wait_status(0, 0)).unwrap(), ACQUIRE_START);
            }
            (waits_here().since(before).frames, q.take_queued_wakes())
        });
        assert_eq!((sent, queued), (0, 0), "wake frames sent and queued after 50 hand-offs seen while polling");
    }

    /// A waiter that parked (its predecessor's NEXT marked) gets exactly one wake frame
    /// from the hand-off, which ends its park, and none is left queued: on `shm`, rank 1,
    /// linked into rank 0's NEXT, waits for its STATUS; rank 0 passes it once its NEXT is
    /// marked, reading its own word.
    #[cfg(feature = "ofi")]
    #[test]
    fn a_parked_waiter_gets_one_wake_frame() {
        let (sent, status, waits, queued) = on_shm(2, "a hand-off to a parked waiter", |rts| {
            std::thread::scope(|s| {
                let waiter = s.spawn(|| {
                    let lock = crate::dlock::DMcs::new(rts[1].world(), 0).unwrap();
                    block_on(lock.q.put(1, Layout::status(0), WAIT)).unwrap();
                    block_on(lock.q.put(0, Layout::next(0), node(1))).unwrap();
                    rts[1].world().barrier().unwrap();
                    let before = waits_here();
                    let status = block_on(lock.q.wait_status(0, 0)).unwrap();
                    let waits = waits_here().since(before);
                    rts[1].world().barrier().unwrap();
                    (status, waits, lock.q.take_queued_wakes())
                });
                let lock = crate::dlock::DMcs::new(rts[0].world(), 0).unwrap();
                rts[0].world().barrier().unwrap();
                let deadline = std::time::Instant::now() + Duration::from_secs(10);
                while block_on(lock.q.get(0, Layout::next(0))).unwrap() != node(1) | NEXT_PARKED && std::time::Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let before = waits_here();
                block_on(lock.q.pass(0, 1, 0, ACQUIRE_START)).unwrap();
                let sent = waits_here().since(before).frames;
                rts[0].world().barrier().unwrap();
                let (status, waits, queued) = waiter.join().unwrap();
                (sent, status, waits, queued)
            })
        });
        assert_eq!(status, ACQUIRE_START);
        assert_eq!(sent, 1, "frames sent to the parked waiter");
        assert!(waits.parks >= 1 && waits.wakes >= 1, "the frame did not end a park: {waits:?}");
        assert_eq!(queued, 0, "frames left queued");
    }

    /// The locks of a rank share one stand-in (one thread a rank, whatever the number of
    /// locks: a hash table has one a volume), and a rank has its own.
    #[cfg(feature = "ofi")]
    #[test]
    fn the_locks_of_a_rank_share_one_stand_in() {
        let shared = on_shm(2, "stand-ins", |rts| {
            std::thread::scope(|s| {
                let other = s.spawn(|| {
                    let locks = [crate::dlock::DMcs::new(rts[1].world(), 0).unwrap(), crate::dlock::DMcs::new(rts[1].world(), 1).unwrap()];
                    locks.map(|l| std::sync::Arc::as_ptr(l.q.wakes.as_ref().unwrap().stand_in()) as usize)
                });
                let locks = [crate::dlock::DMcs::new(rts[0].world(), 0).unwrap(), crate::dlock::DMcs::new(rts[0].world(), 1).unwrap()];
                let here = locks.each_ref().map(|l| std::sync::Arc::as_ptr(l.q.wakes.as_ref().unwrap().stand_in()) as usize);
                (here, other.join().unwrap())
            })
        });
        let (here, other) = shared;
        assert_eq!(here[0], here[1], "the locks of rank 0");
        assert_eq!(other[0], other[1], "the locks of rank 1");
        assert_ne!(here[0], other[0], "ranks 0 and 1");
    }

    /// Hand-offs to a parked task, one after another: on `shm`, rank 0 passes rank 1's
    /// STATUS 30 times, each time once rank 1's task (under an executor of its own) marked
    /// rank 0's NEXT parked; every hand-off ends one of the task's parks, by the frame (the
    /// rank's stand-in progresses while the task is parked and the frame's delivery wakes
    /// it) or by the task's own pass (before it parks, or at a check when the machine is so
    /// loaded that a hand-off outlasts a check's 10 ms). Which of the two, and whether the
    /// task's polls before it marks NEXT reach the backoff's sleeps, is timing, not asserted
    /// here: `a_hand_off_waits_for_no_progress_of_the_parked_successor` shows the frame's
    /// part deterministically.
    #[cfg(feature = "ofi")]
    #[test]
    fn hand_offs_to_a_parked_task_each_end_a_park() {
        const HAND_OFFS: u64 = 30;
        let waits = on_shm(2, "hand-offs to a parked task", |rts| {
            std::thread::scope(|s| {
                let waiter = s.spawn(|| {
                    let lock = crate::dlock::DMcs::new(rts[1].world(), 0).unwrap();
                    rts[1].world().barrier().unwrap();
                    let before = waits_here();
                    futures::executor::block_on(async {
                        for _ in 0..HAND_OFFS {
                            lock.q.put(1, Layout::status(0), WAIT).await.unwrap();
                            lock.q.put(0, Layout::next(0), node(1)).await.unwrap();
                            assert_eq!(lock.q.wait_status(0, 0).await.unwrap(), ACQUIRE_START);
                        }
                    });
                    let waits = waits_here().since(before);
                    rts[1].world().barrier().unwrap();
                    waits
                });
                let lock = crate::dlock::DMcs::new(rts[0].world(), 0).unwrap();
                rts[0].world().barrier().unwrap();
                let deadline = std::time::Instant::now() + Duration::from_secs(20);
                for _ in 0..HAND_OFFS {
                    while block_on(lock.q.get(0, Layout::next(0))).unwrap() != node(1) | NEXT_PARKED && std::time::Instant::now() < deadline
                    {
                        std::thread::yield_now();
                    }
                    block_on(lock.q.pass(0, 1, 0, ACQUIRE_START)).unwrap();
                }
                rts[0].world().barrier().unwrap();
                waiter.join().unwrap()
            })
        });
        assert!(waits.parks >= HAND_OFFS, "hand-offs waited for without a park: {waits:?}");
        assert!(waits.wakes + waits.passes >= HAND_OFFS, "parks neither woken nor checked: {waits:?}");
    }

    /// A hand-off to a parked waiter waits for no progress of the waiter's process (beyond
    /// the listing, 7): on `shm`, rank 1 links itself into rank 0's NEXT, marks it parked,
    /// and makes no progress until rank 0's pass returned; the pass writes its STATUS and
    /// sends it one frame.
    #[cfg(feature = "ofi")]
    #[test]
    fn a_hand_off_waits_for_no_progress_of_the_parked_successor() {
        let (passed, status, queued) = on_shm(2, "a hand-off to a successor that makes no progress", |rts| {
            let (tx, rx) = mpsc::channel();
            std::thread::scope(|s| {
                let waiter = s.spawn(move || {
                    let lock = crate::dlock::DMcs::new(rts[1].world(), 0).unwrap();
                    block_on(lock.q.put(1, Layout::status(0), WAIT)).unwrap();
                    block_on(lock.q.put(0, Layout::next(0), node(1) | NEXT_PARKED)).unwrap();
                    rts[1].world().barrier().unwrap();
                    // No progress of rank 1 until the pass returned (or 10 s went by).
                    let passed = rx.recv_timeout(Duration::from_secs(10)).is_ok();
                    let status = block_on(lock.q.get(1, Layout::status(0))).unwrap();
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    let mut queued = 0;
                    while queued == 0 && std::time::Instant::now() < deadline {
                        queued = lock.q.take_queued_wakes();
                    }
                    rts[1].world().barrier().unwrap();
                    (passed, status, queued)
                });
                let lock = crate::dlock::DMcs::new(rts[0].world(), 0).unwrap();
                rts[0].world().barrier().unwrap();
                block_on(lock.q.pass(0, 1, 0, ACQUIRE_START)).unwrap();
                let _ = tx.send(());
                rts[0].world().barrier().unwrap();
                waiter.join().unwrap()
            })
        });
        assert!(passed, "the pass waited for the successor's progress");
        assert_eq!(status, ACQUIRE_START);
        assert_eq!(queued, 1, "frames to the parked successor");
    }
}
