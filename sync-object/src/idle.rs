//! What a waiter does between two polls that found nothing: spin, or give the core away.
//!
//! A short spin (the schedule of crossbeam's `Backoff`) is the cheapest wait while the thread
//! has a core to itself: the next completion is usually a few hundred nanoseconds away, and
//! a `sched_yield` costs about 0.5 µs on a KVM guest. With more threads than cores ([Patinyasakdikul 2019,
//! §4.5]: a 2-core machine running 16 communicating threads), spinning is the worst choice:
//! the spinner burns the time slice of the thread whose send it waits for. [`IdleBackoff`]
//! spins only while it holds one of a process-wide budget of spin slots, one per core, and
//! the budget is empty while the machine has more runnable threads than cores (every
//! process of a job has a budget of its own); without a slot every idle step yields at
//! once. A slot is taken at a waiter's first idle step and given back when its spin phase
//! ends or the waiter is dropped (once per wait, not per message). The runtime's blocking
//! waits hold theirs for the whole wait, so the sync-object wait nested inside (whose
//! backoff spins longer) spins only with a second slot, while another core is idle — or, in
//! a process bound to one CPU (a budget of one slot), on its thread's own slot.
//!
//! Measured (when the spin budget was introduced):
//! multirate on 2 cores, process mode at 4 and 8 pairs 5.3-5.6 -> 6.5-7.5 M msg/s, thread
//! mode 4.7-4.9 -> 5.3-5.6 M; 1 pair unchanged within noise.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

/// A process-wide budget of spinning waiters. (Not loom-checked: a count that guards no
/// data; waits under loom never spin.)
#[derive(Debug)]
struct SpinSlots {
    /// Waiters spinning now.
    spinning: AtomicUsize,
    /// How many may (`usize::MAX`: the cores this process may run on, read on first use).
    slots: AtomicUsize,
    /// The machine's occupancy a slot is also subject to (the process's budget: [`OCCUPANCY`]),
    /// once [`watching`](Self::watching).
    machine: Option<&'static Occupancy>,
    /// Whether `machine` decides too: other processes this one waits for share its cores
    /// ([`IdleBackoff::share_cores`]).
    watching: AtomicBool,
}

impl SpinSlots {
    const fn new(slots: usize) -> Self {
        SpinSlots { spinning: AtomicUsize::new(0), slots: AtomicUsize::new(slots), machine: None, watching: AtomicBool::new(false) }
    }

    /// A budget of `slots` that, once `watching`, is empty while `machine` has no core to
    /// spare.
    const fn on_machine(slots: usize, machine: &'static Occupancy, watching: bool) -> Self {
        SpinSlots { machine: Some(machine), watching: AtomicBool::new(watching), ..Self::new(slots) }
    }

    fn slots(&self) -> usize {
        // Relaxed: a configuration value, written once (racing writers store the same value).
        match self.slots.load(Ordering::Relaxed) {
            usize::MAX => {
                let n = process_cpus();
                self.slots.store(n, Ordering::Relaxed);
                n
            }
            n => n,
        }
    }

    /// Takes a slot if one is free (and the machine has a core to spare, where the budget
    /// watches it).
    fn enter(&self) -> bool {
        // Relaxed: a switch set once, before the waits it concerns matter.
        if self.machine.is_some_and(|m| self.watching.load(Ordering::Relaxed) && !m.spare_lately()) {
            return false;
        }
        let slots = self.slots();
        // Relaxed: a count, not a guard of data; a stale read costs one spin or one yield.
        if self.spinning.load(Ordering::Relaxed) >= slots {
            return false;
        }
        if self.spinning.fetch_add(1, Ordering::Relaxed) >= slots {
            self.spinning.fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    fn leave(&self) {
        self.spinning.fetch_sub(1, Ordering::Relaxed);
    }

    /// Watches the machine from now on, `ranks` ranks of the job sharing its `cpus` CPUs:
    /// more ranks than CPUs start it busy as of `now` ([`IdleBackoff::share_cores`]).
    fn share_among(&self, ranks: usize, cpus: usize, now: u64) {
        if ranks > cpus {
            if let Some(m) = self.machine {
                m.assume_busy(now);
            }
        }
        // Relaxed: see `enter`.
        self.watching.store(true, Ordering::Relaxed);
    }
}

/// Whether the machine has a core for every runnable thread, sampled at most once per
/// `SAMPLE_EVERY_US`: the oversubscription test of Open MPI's `mpi_yield_when_idle` and
/// MPICH's `MPIR_CVAR_..._YIELD`, made at run time instead of by the launcher, since
/// threads oversubscribe as easily as processes ([Patinyasakdikul 2019, §4.5]).
///
/// On Linux the count is `/proc/loadavg`'s "runnable" field (threads running or waiting for
/// a CPU, the reader included) against the machine's online CPUs. A spinning or
/// yielding waiter is runnable, so two busy-polling ranks on two cores read 2 (spare), a
/// 16-thread job on two cores reads 16 (not spare). Elsewhere, or if the file cannot be
/// read, the answer is always "not spare" (waiters keep yielding as before).
#[derive(Debug)]
struct Occupancy {
    /// Microseconds since `EPOCH` of the last sample ([`epoch_us`]: never 0), `0` before
    /// the first, `u64::MAX` while one is taken.
    stamp_us: AtomicU64,
    /// The last sample's answer.
    spare: AtomicBool,
    /// Samples in a row that found no core to spare ([`spare_lately`](Self::spare_lately)).
    busy_in_a_row: AtomicU32,
}

/// How old a sample may be, in microseconds.
const SAMPLE_EVERY_US: u64 = 2000;

static OCCUPANCY: Occupancy = Occupancy::sampled(false);

/// Samples in a row that must find no core to spare before waiters stop spinning (the short
/// spin of a process that shares its cores, and every long spin): one runnable thread more
/// at one instant (a watcher woken, a kernel thread) does not make a host of two
/// busy-polling ranks on two cores oversubscribed.
const BUSY_SAMPLES: u32 = 2;

impl Occupancy {
    /// No sample taken yet: the first question takes one (the answer `spare` is read only
    /// by a question that races that first sample).
    const fn sampled(spare: bool) -> Self {
        Occupancy { stamp_us: AtomicU64::new(0), spare: AtomicBool::new(spare), busy_in_a_row: AtomicU32::new(0) }
    }

    /// The answer, sampled anew if there is none yet or the last sample is older than its
    /// period at `now` ([`epoch_us`]). The first question samples at once: a process's
    /// first waits would otherwise get the initial answer for a whole period, which is all
    /// of a short job (200 collectives of a few microseconds each).
    fn spare(&self, now: u64) -> bool {
        // Relaxed: a hint; a stale answer costs one wait its long spin or one yield.
        let stamp = self.stamp_us.load(Ordering::Relaxed);
        if stamp != u64::MAX
            && (stamp == 0 || now.saturating_sub(stamp) >= SAMPLE_EVERY_US)
            && self.stamp_us.compare_exchange(stamp, u64::MAX, Ordering::Relaxed, Ordering::Relaxed).is_ok()
        {
            let runnable = runnable_threads();
            let spare = runnable.is_some_and(|r| r <= machine_cpus());
            self.spare.store(spare, Ordering::Relaxed);
            // An unknown count is no core to spare, at once.
            let busy = match runnable {
                _ if spare => 0,
                Some(_) => self.busy_in_a_row.load(Ordering::Relaxed).saturating_add(1),
                None => BUSY_SAMPLES,
            };
            self.busy_in_a_row.store(busy, Ordering::Relaxed);
            self.stamp_us.store(now, Ordering::Relaxed);
        }
        self.spare.load(Ordering::Relaxed)
    }

    /// Records, as of `now` ([`epoch_us`]), the answer of [`BUSY_SAMPLES`] samples in a row
    /// that found no core to spare; the next sample is taken a period on.
    fn assume_busy(&self, now: u64) {
        // Relaxed: a hint, as in `spare`. A sample racing this store leaves either answer,
        // and the next one a period on corrects it.
        self.spare.store(false, Ordering::Relaxed);
        self.busy_in_a_row.store(BUSY_SAMPLES, Ordering::Relaxed);
        self.stamp_us.store(now, Ordering::Relaxed);
    }

    /// The answer for a waiter about to take a spin slot: no only after [`BUSY_SAMPLES`]
    /// samples in a row found no core to spare; sampled anew (if old) by the thread's
    /// [`clock_lately`]. Where the count is unknown (not Linux), yes: the slots alone
    /// decide, as they did before the machine was watched.
    fn spare_lately(&self) -> bool {
        !cfg!(target_os = "linux") || self.spare_at(clock_lately())
    }

    /// The answer for a waiter about to poll on past its short spin, sampled anew (if old)
    /// at `now` ([`clock_lately`]): no only after [`BUSY_SAMPLES`] samples in a row found no core to spare, as
    /// for a spin slot (one busy sample used to make a rank of two on two cores yield at
    /// every idle pass of its collectives for a whole period), and no where the count is
    /// unknown.
    fn spare_at(&self, now: u64) -> bool {
        self.spare(now);
        self.not_busy()
    }

    /// Whether fewer than [`BUSY_SAMPLES`] samples in a row found no core to spare.
    fn not_busy(&self) -> bool {
        // Relaxed: a hint, as above.
        self.busy_in_a_row.load(Ordering::Relaxed) < BUSY_SAMPLES
    }
}

/// A thread's waiters read the clock at one question in this many about the machine or
/// their CPU ([`clock_lately`]).
const SPARE_CLOCK_EVERY: u32 = 8;

thread_local! {
    /// The clock as this thread's waiters last read it ([`epoch_us`]; 0: not yet), and the
    /// questions asked since, counted for [`SPARE_CLOCK_EVERY`].
    static CLOCK: std::cell::Cell<(u64, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// The time by which a thread's waiter judges the age of the machine's sample and of its
/// CPU's probe ([`epoch_us`]): read anew at the thread's first question and at one in
/// [`SPARE_CLOCK_EVERY`] after, so that a question, asked at a wait's idle pass (a
/// collective's first, a blocking wait's slot request), does not read the clock each time
/// (a clock read is about 90 instructions, more than the rest of the question). The samples
/// are taken every millisecond or two, where a thread that asks often asks every few
/// microseconds; one that asks seldom judges by an older time, which costs a wait its spin
/// or a yield, and never blocks it.
fn clock_lately() -> u64 {
    CLOCK
        .try_with(|c| match c.get() {
            (now, asked) if now != 0 && asked + 1 < SPARE_CLOCK_EVERY => {
                c.set((now, asked + 1));
                now
            }
            _ => {
                let now = epoch_us();
                c.set((now, 0));
                now
            }
        })
        .unwrap_or_else(|_| epoch_us())
}

/// How often a thread checks that its CPU is its own (`cpu_is_ours`).
const PROBE_EVERY_US: u64 = 1000;

/// How soon a thread that found its CPU shared checks again. Such an answer is often the
/// moment's (a process of the job still starting, a watcher woken, the load balancer about
/// to move a thread), and while it holds every idle pass of the thread's collectives yields
/// (about a microsecond on a KVM guest, where the partner's frame is a few hundred
/// nanoseconds away): a 2-rank job of 2,000 small allreduces, whose first probe found the
/// CPU shared, spent its whole millisecond so (0.36-0.49 µs a call against 0.25-0.28 once
/// probed again). Where the CPU is shared for good the probe is the yield its waiter makes
/// anyway.
const PROBE_AGAIN_US: u64 = 100;

/// A `sched_yield` that returns later than this ran another thread meanwhile (alone it
/// returns in about 0.5 µs on a KVM guest; handing the CPU to a yielding thread and back
/// takes 2.5 µs and more).
const SHARED_YIELD: std::time::Duration = std::time::Duration::from_nanos(1500);

thread_local! {
    /// (Microseconds since `EPOCH` + 1 of this thread's last probe, 0 before the first; its
    /// answer.)
    static PROBE: std::cell::Cell<(u64, bool)> = const { std::cell::Cell::new((0, false)) };
}

fn epoch_us() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_micros() as u64 + 1
}

/// Whether no other runnable thread shares this thread's CPU, judged at most every
/// millisecond by timing one `sched_yield`: the machine-wide count (`Occupancy`) can read
/// "spare" while two busy threads sit on one CPU and another idles (the load balancer moves
/// one within milliseconds); spinning long there would hold the CPU from the very thread
/// the spinner waits for. The probe's yield costs about 0.5 µs once per millisecond (once
/// per [`PROBE_AGAIN_US`] after it found the CPU shared); a thread's first question probes
/// at once. `now`: [`epoch_us`].
fn cpu_is_ours(now: u64) -> bool {
    PROBE
        .try_with(|p| {
            let (stamp, ours) = p.get();
            if !probe_due(stamp, ours, now) {
                return ours;
            }
            let t = Instant::now();
            std::thread::yield_now();
            let ours = t.elapsed() < SHARED_YIELD;
            p.set((now, ours));
            ours
        })
        .unwrap_or(false)
}

/// Whether a thread whose last probe was stamped `stamp` (0: none yet) and found its CPU
/// `ours` probes again at `now`.
fn probe_due(stamp: u64, ours: bool, now: u64) -> bool {
    stamp == 0 || now.saturating_sub(stamp) >= if ours { PROBE_EVERY_US } else { PROBE_AGAIN_US }
}

/// Threads runnable on the machine now (`/proc/loadavg`'s fourth field, before the `/`).
#[cfg(target_os = "linux")]
fn runnable_threads() -> Option<usize> {
    use std::io::Read;
    let mut buf = [0u8; 128];
    let n = std::fs::File::open("/proc/loadavg").and_then(|mut f| f.read(&mut buf)).ok()?;
    parse_runnable(std::str::from_utf8(&buf[..n]).ok()?)
}

#[cfg(not(target_os = "linux"))]
fn runnable_threads() -> Option<usize> {
    None
}

/// The machine's online CPUs (the count `/proc/loadavg` is to be set against: it counts
/// runnable threads machine-wide), or the CPUs this process may use if that is unknown. A
/// process bound to one CPU still compares with the machine; `cpu_is_ours` then checks its
/// own CPU.
fn machine_cpus() -> usize {
    static CPUS: OnceLock<usize> = OnceLock::new();
    *CPUS.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/cpu/online").ok().and_then(|s| parse_cpu_list(&s)).unwrap_or_else(|| PROCESS.slots())
    })
}

/// The number of CPUs in a kernel CPU list ("0-1", "0,2-5,7").
fn parse_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.trim().split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse::<usize>().ok()?)? + 1,
            None => {
                part.parse::<usize>().ok()?;
                1
            }
        };
    }
    (n > 0).then_some(n)
}

/// The CPUs this process may run on, as a spin budget counts them. The budget is made at
/// the first wait of any thread, and `available_parallelism` reads the calling thread's
/// own affinity: a first waiter pinned to one core (each thread of a benchmark or of an
/// application bound to its own CPU) would leave the whole process one slot, and every
/// other waiter yielding at each idle pass while a core sits idle. On Linux the process's
/// mask is its main thread's (`/proc/self/status`); a thread narrower than it is counted
/// as the process, unless a CPU quota (which `available_parallelism` also reads) binds
/// below the thread's own mask.
fn process_cpus() -> usize {
    let ours = std::thread::available_parallelism().map_or(1, |n| n.get());
    #[cfg(target_os = "linux")]
    {
        let mask = |path: &str| {
            let status = std::fs::read_to_string(path).ok()?;
            status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).and_then(parse_cpu_list)
        };
        if let (Some(process), Some(thread)) = (mask("/proc/self/status"), mask("/proc/thread-self/status")) {
            return budget_of(ours, process, thread);
        }
    }
    ours
}

/// The spin budget of a process whose CPUs number `process` (its mask), asked from a thread
/// whose own mask holds `thread` and whose `available_parallelism` reads `ours` (the
/// smaller of its mask and a CPU quota).
fn budget_of(ours: usize, process: usize, thread: usize) -> usize {
    if thread < process && ours >= thread {
        // The thread's own mask, not a quota, is what bounds `ours`.
        process
    } else {
        ours
    }
}

/// The runnable count of a `/proc/loadavg` line ("0.25 0.32 0.15 2/78 27954").
fn parse_runnable(line: &str) -> Option<usize> {
    line.split_whitespace().nth(3)?.split('/').next()?.parse().ok()
}

/// Idle steps that spin (`2^step` `PAUSE`s each), as crossbeam's `Backoff`.
const SPIN_LIMIT: u32 = 6;
/// Idle steps after which the backoff [completes](IdleBackoff::is_completed).
const YIELD_LIMIT: u32 = 10;

/// The process's spin budget: one spinner per core, and, once other processes it waits for
/// share the host ([`IdleBackoff::share_cores`]), none while the machine has no core to
/// spare ([`Occupancy`]): a budget of its own in every process of a job would let each
/// spin while the rank it waits for sits on the same core.
///
/// Process-wide state, against the habit of hanging everything off a `Runtime`: the cores
/// are the process's, not a runtime's, and the ranks of an embedded job (several runtimes in
/// one process) share them — a budget per runtime would let each spin on every core. It is
/// written when a waiter starts and stops spinning (once per blocking wait, not per message
/// of a window).
static PROCESS: SpinSlots = SpinSlots::on_machine(usize::MAX, &OCCUPANCY, false);

/// A waiter's idle step: spin while a core is free for it, else yield. A process-wide budget
/// of spin slots, one per core, decides: a slot is taken at the first idle step and given
/// back when the spin phase ends or the waiter is dropped.
///
/// ```
/// let mut idle = weft_sync::IdleBackoff::new();
/// for _ in 0..10 {
///     // ... a poll that found nothing ...
///     idle.snooze();
/// }
/// idle.reset(); // after a poll that found something
/// ```
#[derive(Debug)]
pub struct IdleBackoff {
    /// Idle steps so far, up to `YIELD_LIMIT + 1` (crossbeam's `Backoff` schedule).
    step: u32,
    budget: &'static SpinSlots,
    /// Whether this waiter spins: on a slot of its own, or (see `may_spin`) on its thread's.
    spinning: bool,
    /// Whether `spinning` is on a slot this waiter took (and gives back).
    own_slot: bool,
}

thread_local! {
    /// Spin slots the waiters of this thread hold (at most a couple: a wait nested in one).
    static HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl Default for IdleBackoff {
    fn default() -> Self {
        Self::new()
    }
}

impl IdleBackoff {
    /// A waiter that has not idled yet.
    pub fn new() -> Self {
        Self::with_budget(&PROCESS)
    }

    fn with_budget(budget: &'static SpinSlots) -> Self {
        IdleBackoff { step: 0, budget, spinning: false, own_slot: false }
    }

    /// One idle step: a spin of `2^step` `PAUSE`s for the first seven steps if a spin slot
    /// is free (the schedule of crossbeam's `Backoff::snooze`), else `yield_now` — or, while
    /// the machine has a core for every runnable thread
    /// ([`may_spin_long`](Self::may_spin_long)), another spin of `2^6`. Every step counts
    /// towards [`is_completed`](Self::is_completed), spun or yielded, so a caller that parks
    /// once the backoff completes does park.
    pub fn snooze(&mut self) {
        if self.step <= SPIN_LIMIT && self.may_spin() {
            for _ in 0..1u32 << self.step {
                std::hint::spin_loop();
            }
        } else if self.step <= YIELD_LIMIT && self.may_spin_long() {
            // No thread on the machine waits for a core: a yield would only add its system
            // call (and up to its length) to the wait.
            for _ in 0..1u32 << SPIN_LIMIT {
                std::hint::spin_loop();
            }
        } else {
            // Past the spin phase (or no core free for it): the slot is not needed.
            self.leave();
            std::thread::yield_now();
        }
        if self.step <= YIELD_LIMIT {
            self.step += 1;
        }
    }

    /// Whether this waiter may spin now: it holds a spin slot, or takes a free one. A caller
    /// with its own spin loop asks this before each spin and yields when told no. A second
    /// `IdleBackoff` of the same thread takes a slot of its own: a wait nested in another
    /// (the sync-object wait inside a runtime wait, which keeps its slot) spins only while
    /// yet another core is free — except with a budget of one slot (a process bound to one
    /// CPU, as `weftrun --bind-to core` does): there is no second slot to wait for, and no
    /// other thread could spin meanwhile, so the nested wait spins on its thread's slot.
    pub fn may_spin(&mut self) -> bool {
        if !self.spinning {
            if self.budget.enter() {
                self.spinning = true;
                self.own_slot = true;
                let _ = HELD.try_with(|h| h.set(h.get() + 1));
            } else if self.budget.slots() == 1 && HELD.try_with(|h| h.get() > 0).unwrap_or(false) {
                self.spinning = true;
                self.own_slot = false;
            }
        }
        self.spinning
    }

    /// Whether this waiter may go on polling without yielding past its short spin: it
    /// [may spin](Self::may_spin), every runnable thread on the machine has had a core
    /// lately (sampled at most every 2 ms; on Linux from `/proc/loadavg`, elsewhere never;
    /// no once [`BUSY_SAMPLES`] samples in a row found none to spare) and its CPU is its own.
    /// A busy-polling rank of a two-process ping-pong on two cores gets a yes; a waiter among
    /// more runnable threads than cores (threads or processes) gets a no and yields, since
    /// the thread it waits for may be the one without a core. One clock read: both samples'
    /// ages are taken from it.
    pub fn may_spin_long(&mut self) -> bool {
        let now = clock_lately();
        self.budget.machine.unwrap_or(&OCCUPANCY).spare_at(now) && self.may_spin() && cpu_is_ours(now)
    }

    /// Says that processes this one waits for (ranks of its job, `ranks` of them on this
    /// host, this process's included) run on the same host: from then on no waiter of the
    /// process spins while the machine has more runnable threads than cores. Each process's
    /// budget counts only its own spinners, so otherwise every process of a job on an
    /// oversubscribed host would spin on the core the rank it waits for needs (measured:
    /// multirate across 4-8 processes on 2 cores, 1.67-1.71x the process-mode rate; 1 pair,
    /// 2 processes on 2 cores, unchanged). In one process the budget alone already bounds
    /// the spinners, and is left so: the sync-object waits of threads in one process lose by
    /// yielding there. weft's same-host lane calls it when it meets ranks of other
    /// processes; a job on one host with the lane switched off counts each process's
    /// spinners alone.
    ///
    /// More ranks than the machine has CPUs oversubscribe it by themselves while they poll:
    /// the process's waiters then start without spinning, as two busy samples in a row
    /// would have left them, until a sample one period on finds a core to spare. Otherwise
    /// the first samples, taken while the other ranks still start, read a machine with
    /// cores to spare, and the job's first milliseconds (all of a short job) go to spinning
    /// on the cores the awaited ranks need: an all-to-all of 1 KiB messages among 4
    /// processes on 2 cores took 13-19 µs a round over its first hundred rounds and 6-8
    /// after; started busy, 6-8 from its second round on.
    pub fn share_cores(ranks: usize) {
        PROCESS.share_among(ranks, machine_cpus(), epoch_us());
    }

    /// Whether [`share_cores`](Self::share_cores) was called in this process.
    pub fn cores_shared() -> bool {
        PROCESS.watching.load(Ordering::Relaxed)
    }

    /// Whether the spin phase is over (every further step yields).
    pub fn is_completed(&self) -> bool {
        self.step > YIELD_LIMIT
    }

    /// After a productive poll: the next idle step starts a fresh (short) spin.
    pub fn reset(&mut self) {
        self.step = 0;
    }

    fn leave(&mut self) {
        if std::mem::take(&mut self.spinning) && std::mem::take(&mut self.own_slot) {
            let _ = HELD.try_with(|h| h.set(h.get().saturating_sub(1)));
            self.budget.leave();
        }
    }
}

impl Drop for IdleBackoff {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread of its own (each thread holds at most one slot).
    fn on_thread<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        std::thread::scope(|s| s.spawn(f).join().unwrap())
    }

    /// A budget made by a thread pinned to one CPU counts the process's CPUs, not the
    /// thread's one: multirate pins its sender and receiver, and with the first waiter's
    /// one CPU as the budget they would share one slot, one of them yielding at each idle
    /// pass while the other core is its own.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_pinned_thread_makes_the_process_budget() {
        let process = process_cpus();
        let pinned = on_thread(|| {
            // SAFETY: a zeroed `cpu_set_t` is an empty set; the call pins this thread only.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return None;
                }
            }
            assert_eq!(std::thread::available_parallelism().map_or(1, |n| n.get()), 1, "the thread is pinned");
            let budget = SpinSlots::new(usize::MAX);
            Some(budget.slots())
        });
        if let Some(slots) = pinned {
            assert_eq!(slots, process, "the process's CPUs, whichever thread asks first");
        }
    }

    /// The budget's arithmetic: a narrower thread counts as its process, a quota below the
    /// thread's mask still binds.
    #[test]
    fn the_budget_follows_the_process_mask_and_the_quota() {
        assert_eq!(budget_of(1, 16, 1), 16, "a thread pinned to one of 16 CPUs");
        assert_eq!(budget_of(16, 16, 16), 16);
        assert_eq!(budget_of(2, 16, 16), 2, "a quota of 2 CPUs");
        assert_eq!(budget_of(2, 16, 4), 2, "a quota below the thread's own 4");
        assert_eq!(budget_of(1, 1, 1), 1, "a process bound to one CPU");
    }

    /// Two slots: two threads spin, a third yields; a slot comes back when its holder's spin
    /// phase ends or the holder is dropped.
    #[test]
    fn spin_slots_are_bounded_and_given_back() {
        static TWO: SpinSlots = SpinSlots::new(2);
        let count = || TWO.spinning.load(Ordering::Relaxed);
        let (go, hold) = (std::sync::Barrier::new(3), std::sync::Barrier::new(3));
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mut w = IdleBackoff::with_budget(&TWO);
                    w.snooze();
                    assert!(w.spinning, "a free slot is taken");
                    go.wait();
                    hold.wait();
                });
            }
            go.wait();
            assert_eq!(count(), 2);
            on_thread(|| {
                let mut c = IdleBackoff::with_budget(&TWO);
                c.snooze();
                assert!(!c.spinning, "with both slots held, a third thread yields");
            });
            hold.wait();
        });
        assert_eq!(count(), 0, "dropped holders give their slots back");
        on_thread(|| {
            let mut a = IdleBackoff::with_budget(&TWO);
            while !a.is_completed() {
                a.snooze();
            }
            a.snooze();
            assert!(!a.spinning, "the slot is given back once the spin phase is over");
            assert_eq!(count(), 0);
            a.reset();
            a.snooze();
            assert!(a.spinning, "after a productive poll the waiter spins again");
        });
        assert_eq!(count(), 0);
    }

    /// Once the process shares its cores with peers' processes, its budget is empty while
    /// the machine has no core to spare, whatever slots are free (its waiter would spin on
    /// the core the peer it waits for needs); before, its slots alone decide.
    #[test]
    fn no_slot_while_the_machine_has_no_core_to_spare() {
        // Never sampled anew (`u64::MAX`: a sample under way): the answer stays as set.
        static BUSY: Occupancy =
            Occupancy { stamp_us: AtomicU64::new(u64::MAX), spare: AtomicBool::new(false), busy_in_a_row: AtomicU32::new(BUSY_SAMPLES) };
        static ONCE_BUSY: Occupancy =
            Occupancy { stamp_us: AtomicU64::new(u64::MAX), spare: AtomicBool::new(false), busy_in_a_row: AtomicU32::new(1) };
        static IDLE: Occupancy =
            Occupancy { stamp_us: AtomicU64::new(u64::MAX), spare: AtomicBool::new(true), busy_in_a_row: AtomicU32::new(0) };
        static ON_BUSY: SpinSlots = SpinSlots::on_machine(2, &BUSY, true);
        static ON_IDLE: SpinSlots = SpinSlots::on_machine(2, &IDLE, true);
        static ALONE: SpinSlots = SpinSlots::on_machine(2, &BUSY, false);
        static ON_ONCE_BUSY: SpinSlots = SpinSlots::on_machine(2, &ONCE_BUSY, true);
        on_thread(|| {
            for _ in 0..2 * SPARE_CLOCK_EVERY {
                let mut w = IdleBackoff::with_budget(&ON_BUSY);
                w.snooze();
                assert!(!w.spinning, "no slot while the machine is busy");
                assert_eq!(ON_BUSY.spinning.load(Ordering::Relaxed), 0);
            }
            let mut w = IdleBackoff::with_budget(&ON_IDLE);
            w.snooze();
            assert!(w.spinning, "a free slot is taken while the machine has a core to spare");
            let mut w = IdleBackoff::with_budget(&ON_ONCE_BUSY);
            w.snooze();
            assert!(w.spinning, "one busy sample is not yet a busy machine");
            let mut w = IdleBackoff::with_budget(&ALONE);
            w.snooze();
            assert!(w.spinning, "a process that shares its cores with no peer's process counts its slots alone");
        });
    }

    /// A process told that more ranks of its job than CPUs share the host starts without
    /// spinning, before any sample of the machine (which, taken while the other ranks still
    /// start, would read it spare), and samples it again a period on; one told of no more
    /// ranks than CPUs lets the samples decide from the first.
    #[test]
    fn more_ranks_than_cpus_start_without_spinning() {
        static CROWDED: Occupancy = Occupancy::sampled(true);
        static ON_CROWDED: SpinSlots = SpinSlots::on_machine(2, &CROWDED, false);
        static FITTING: Occupancy = Occupancy::sampled(true);
        static ON_FITTING: SpinSlots = SpinSlots::on_machine(2, &FITTING, false);
        // A second on: the waits below judge by an earlier clock, so however slowly this
        // test runs, none of them is a period past the assumption.
        let now = epoch_us() + 1_000_000;
        ON_CROWDED.share_among(3, 2, now);
        assert!(ON_CROWDED.watching.load(Ordering::Relaxed));
        on_thread(|| {
            for _ in 0..2 * SPARE_CLOCK_EVERY {
                let mut w = IdleBackoff::with_budget(&ON_CROWDED);
                w.snooze();
                assert!(!w.spinning, "no slot for the ranks' first waits");
            }
        });
        assert_eq!(CROWDED.stamp_us.load(Ordering::Relaxed), now, "no sample taken within the period");
        CROWDED.spare(now + SAMPLE_EVERY_US);
        assert_eq!(CROWDED.stamp_us.load(Ordering::Relaxed), now + SAMPLE_EVERY_US, "sampled again a period on");
        ON_FITTING.share_among(2, 2, now);
        assert!(ON_FITTING.watching.load(Ordering::Relaxed));
        assert_eq!(FITTING.stamp_us.load(Ordering::Relaxed), 0, "the first question samples");
        assert_eq!(FITTING.busy_in_a_row.load(Ordering::Relaxed), 0);
    }

    /// A wait nested in another on the same thread needs a second slot — unless the budget
    /// has only one (a process bound to one CPU): then it spins on its thread's slot, and
    /// other threads still do not spin.
    #[test]
    fn nested_waits_share_the_only_slot() {
        static ONE: SpinSlots = SpinSlots::new(1);
        static TWO: SpinSlots = SpinSlots::new(2);
        on_thread(|| {
            let mut outer = IdleBackoff::with_budget(&ONE);
            assert!(outer.may_spin());
            let mut inner = IdleBackoff::with_budget(&ONE);
            assert!(inner.may_spin(), "one slot: the nested wait spins on its thread's");
            on_thread(|| assert!(!IdleBackoff::with_budget(&ONE).may_spin(), "another thread does not"));
            drop(inner);
            assert_eq!(ONE.spinning.load(Ordering::Relaxed), 1, "the nested wait gave back nothing it did not take");
            drop(outer);
            assert_eq!(ONE.spinning.load(Ordering::Relaxed), 0);
        });
        on_thread(|| {
            let mut outer = IdleBackoff::with_budget(&TWO);
            assert!(outer.may_spin());
            let mut inner = IdleBackoff::with_budget(&TWO);
            assert!(inner.may_spin(), "two slots: the nested wait takes the second");
            assert_eq!(TWO.spinning.load(Ordering::Relaxed), 2);
            let mut third = IdleBackoff::with_budget(&TWO);
            assert!(!third.may_spin(), "and a third waiter of the thread finds none");
        });
        assert_eq!(TWO.spinning.load(Ordering::Relaxed), 0);
    }

    /// A waiter that never gets a slot still completes its backoff (callers park on it).
    #[test]
    fn backoff_completes_without_a_slot() {
        static NONE: SpinSlots = SpinSlots::new(0);
        let mut w = IdleBackoff::with_budget(&NONE);
        let mut steps = 0;
        while !w.is_completed() {
            w.snooze();
            assert!(!w.spinning);
            steps += 1;
            assert!(steps <= YIELD_LIMIT + 1, "never completes");
        }
        assert_eq!(steps, YIELD_LIMIT + 1);
    }

    /// A thread reads the clock at its first question and at one in `SPARE_CLOCK_EVERY`
    /// after; between, it judges by the time it read last.
    #[test]
    fn clock_is_read_at_one_question_in_so_many() {
        on_thread(|| {
            let first = clock_lately();
            assert_ne!(first, 0, "the first question reads the clock");
            std::thread::sleep(std::time::Duration::from_millis(2));
            for _ in 1..SPARE_CLOCK_EVERY {
                assert_eq!(clock_lately(), first, "the clock read again before its turn");
            }
            assert!(clock_lately() > first, "the clock not read at its turn");
        });
    }

    /// One busy sample does not stop a long spin (a blip: a watcher woken at that instant);
    /// two in a row do.
    #[test]
    fn long_spin_stops_after_busy_samples_in_a_row() {
        static ONCE_BUSY: Occupancy =
            Occupancy { stamp_us: AtomicU64::new(u64::MAX), spare: AtomicBool::new(false), busy_in_a_row: AtomicU32::new(1) };
        static BUSY: Occupancy =
            Occupancy { stamp_us: AtomicU64::new(u64::MAX), spare: AtomicBool::new(false), busy_in_a_row: AtomicU32::new(BUSY_SAMPLES) };
        static ON_ONCE_BUSY: SpinSlots = SpinSlots::on_machine(2, &ONCE_BUSY, true);
        static ON_BUSY: SpinSlots = SpinSlots::on_machine(2, &BUSY, false);
        on_thread(|| {
            // The thread's CPU is its own, and stays so (a probe stamped in the future).
            PROBE.with(|p| p.set((u64::MAX, true)));
            assert!(IdleBackoff::with_budget(&ON_ONCE_BUSY).may_spin_long(), "one busy sample stopped the long spin");
            assert!(!IdleBackoff::with_budget(&ON_BUSY).may_spin_long(), "two busy samples in a row did not");
        });
    }

    /// The first question about the machine samples it, and a thread's first question about
    /// its CPU probes it, at once, however soon after the clock's start (1 µs here): the
    /// initial answers ("no core to spare", "not ours") would otherwise hold for a whole
    /// period, and a job of 200 collectives of a few microseconds each ran all its waits
    /// on them, yielding at every idle pass.
    #[test]
    fn first_questions_sample_at_once() {
        static FRESH: Occupancy = Occupancy::sampled(false);
        FRESH.spare(1);
        assert_eq!(FRESH.stamp_us.load(Ordering::Relaxed), 1, "no sample taken by the first question");
        FRESH.spare(2);
        assert_eq!(FRESH.stamp_us.load(Ordering::Relaxed), 1, "a sample is reused within its period");
        on_thread(|| {
            cpu_is_ours(1);
            assert_eq!(PROBE.with(std::cell::Cell::get).0, 1, "no probe made by the thread's first question");
        });
    }

    /// A probe that found the CPU shared is made again ten times sooner than one that found
    /// it the thread's own.
    #[test]
    fn a_shared_cpu_is_probed_again_sooner() {
        assert!(probe_due(0, false, 1), "the first question probes");
        assert!(!probe_due(10, true, 10 + PROBE_AGAIN_US), "an own CPU keeps its answer");
        assert!(probe_due(10, true, 10 + PROBE_EVERY_US));
        assert!(!probe_due(10, false, 10 + PROBE_AGAIN_US - 1));
        assert!(probe_due(10, false, 10 + PROBE_AGAIN_US), "a shared CPU is probed again soon");
        on_thread(|| {
            // Found shared just now: the answer holds within the shorter period, then a
            // probe replaces it.
            PROBE.with(|p| p.set((50, false)));
            cpu_is_ours(50 + PROBE_AGAIN_US - 1);
            assert_eq!(PROBE.with(std::cell::Cell::get).0, 50, "probed again too soon");
            cpu_is_ours(50 + PROBE_AGAIN_US);
            assert_eq!(PROBE.with(std::cell::Cell::get).0, 50 + PROBE_AGAIN_US, "not probed again after its period");
        });
    }

    #[test]
    fn runnable_count_is_read_from_loadavg() {
        assert_eq!(parse_runnable("0.25 0.32 0.15 2/78 27954\n"), Some(2));
        assert_eq!(parse_runnable("0.25 0.32 0.15 17/301 5"), Some(17));
        assert_eq!(parse_runnable("garbage"), None);
        assert_eq!(parse_runnable("1 2 3 x/4 5"), None);
        assert_eq!(parse_cpu_list("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list("0,2-5,7"), Some(6));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), None);
        assert!(machine_cpus() >= 1);
        #[cfg(target_os = "linux")]
        assert!(runnable_threads().is_some_and(|r| r >= 1), "the reader itself is runnable");
    }

    /// With more runnable threads than cores, no waiter spins long; a sample is reused
    /// within its period.
    #[test]
    fn busy_machine_has_no_spare_core() {
        let cores = machine_cpus();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..cores + 2 {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            // The busy threads are runnable now: at least cores + 2 of them (+ this one).
            let deadline = Instant::now() + std::time::Duration::from_secs(5);
            let mut spare = true;
            while spare && Instant::now() < deadline {
                spare = OCCUPANCY.spare(epoch_us());
                std::thread::sleep(std::time::Duration::from_micros(SAMPLE_EVERY_US));
            }
            stop.store(true, Ordering::Relaxed);
            assert!(!spare, "more runnable threads than cores read as spare");
        });
    }

    /// The process budget is the number of cores.
    #[test]
    fn process_budget_is_the_core_count() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(PROCESS.slots(), cores);
    }
}
