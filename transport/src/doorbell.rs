//! The doorbell: how a parked progress owner (a thread) or an idle async poller (a task)
//! learns that frames arrived, and how a rank with frames refused by a full destination
//! learns that the destination has room again.
//!
//! # The ring's fence
//!
//! A ring is a store-buffering handshake with whoever is about to wait: the ringer pushed a
//! frame, then loads the count of listeners (and the flag of registered tasks); a listener
//! counts itself (or raises the flag), then looks for frames once more. Each side needs a
//! full fence between its store and its load, and the ringer's — on every frame sent —
//! stalls it until its push's stores drained (the slot's line is in the receiver's cache:
//! a round trip between cores per frame). Where the kernel has
//! `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)` ([`crate::membarrier`]), the handshake is
//! asymmetric: every listener, after its fence, has a full barrier run on every CPU that
//! runs a thread of this process before its last look, and the ringer needs only a compiler
//! fence. Ringers and listeners are threads of one process (the ranks of the embedded
//! provider, the libfabric provider's watcher and its rank's threads), so the private
//! command suffices. Where it is missing (and under loom, which cannot model it) both sides
//! fence.
//!
//! A thread parks rarely (after spinning), but an async poller registers its waker each
//! time it finds nothing, which may be every few frames: a system call that interrupts
//! every CPU of the process each time costs far more than the fences it saves. The first
//! registration of a task therefore turns the doorbell's rings back to fencing, for good
//! ([`Mode`]): it says so ([`Mode::Switching`]), has the barrier run once (a ringer that
//! read the old mode pushed before its CPU's barrier, so the push is seen), then says the
//! switch is done ([`Mode::Fenced`]); until then, every listener runs the barrier itself.

use std::fmt;
use std::task::Waker;

use parking_lot::Mutex;
use weft_sync::{Signal, SignalListener};

use crate::loom::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use crate::membarrier;

/// Rung on every frame pushed to a rank. Threads listen through [`listen`](Self::listen);
/// async tasks register a waker with [`register`](Self::register), woken (and dropped) at the
/// next ring.
///
/// A second channel carries only *room*: [`ring_room`](Self::ring_room) says that a
/// destination which refused a send of this rank may take frames again (and
/// [`ring_all`](Self::ring_all), a lost peer, counts as room too: the refused frames then
/// fail instead). It rings as [`ring`](Self::ring) does and also wakes the wakers registered
/// with [`register_room`](Self::register_room) — a waiter for room alone, which the frames
/// rung for on every push would wake for nothing (and whose wake-up a `ring` to one parked
/// thread would take from a thread waiting for frames).
pub struct Doorbell {
    /// Parked threads.
    event: Signal,
    /// Async pollers waiting for the next ring.
    wakers: Mutex<Vec<Waker>>,
    /// `wakers` is non-empty: the ring path checks this one flag before taking the lock.
    has_wakers: AtomicBool,
    /// Waiters for the next ring of room (`register_room`), woken and dropped by it.
    room: Mutex<Vec<Waker>>,
    /// `room` is non-empty: `ring_room` checks this one flag before taking the lock.
    has_room: AtomicBool,
    /// Whether rings go without a fence, listeners running `membarrier` for them instead
    /// (module docs, "The ring's fence"): a [`Mode`].
    mode: AtomicU8,
}

/// How a doorbell's rings order their push before their loads (module docs, "The ring's
/// fence"); it only moves down the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
enum Mode {
    /// Rings go without a fence; listeners run `membarrier` before their last look.
    Fenceless = 0,
    /// Rings fence; a switch from `Fenceless` is under way (its barrier not yet done), so
    /// listeners still run `membarrier`.
    Switching = 1,
    /// Rings fence, and so do listeners: the symmetric handshake.
    Fenced = 2,
}

impl Default for Doorbell {
    fn default() -> Self {
        Self::with_fence(!membarrier::private_registered())
    }
}

impl fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Doorbell").finish_non_exhaustive()
    }
}

impl Doorbell {
    /// A silent doorbell.
    pub fn new() -> Self {
        Self::default()
    }

    /// A silent doorbell whose rings fence (`fenced`) or go without a fence, which only a
    /// process registered for `membarrier` may choose (module docs, "The ring's fence").
    fn with_fence(fenced: bool) -> Self {
        Doorbell {
            event: Signal::new(),
            wakers: Mutex::default(),
            has_wakers: AtomicBool::new(false),
            room: Mutex::default(),
            has_room: AtomicBool::new(false),
            mode: AtomicU8::new(if fenced { Mode::Fenced } else { Mode::Fenceless } as u8),
        }
    }

    /// Wakes one parked thread and every registered task.
    #[inline]
    pub fn ring(&self) {
        // Orders the frame push that preceded this ring before the loads of the count and
        // the flag: a full fence, or where the listeners run a barrier for it, the
        // compiler's order (module docs, "The ring's fence").
        if self.mode.load(Ordering::Relaxed) == Mode::Fenceless as u8 {
            std::sync::atomic::compiler_fence(Ordering::SeqCst);
        } else {
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        self.event.notify_unfenced(1);
        if self.has_wakers.load(Ordering::Relaxed) {
            self.wake_tasks();
        }
    }

    /// Wakes every parked thread and task, and the waiters for room (a lost peer: what
    /// was refused by it fails now instead of waiting for room).
    pub fn ring_all(&self) {
        // As in `ring`: `notify` begins with a full fence, which orders the flag loads after
        // what preceded this call; a task registering concurrently re-checks after its own
        // fence (`register`), so checking the flag before taking the lock loses no wake-up.
        self.event.notify(usize::MAX);
        if self.has_wakers.load(Ordering::Relaxed) {
            self.wake_tasks();
        }
        if self.has_room.load(Ordering::Relaxed) {
            Self::wake(&self.room, &self.has_room);
        }
    }

    /// Rings for room: a destination that refused a send of this rank may take frames again.
    /// Wakes what [`ring`](Self::ring) wakes, and every waker registered with
    /// [`register_room`](Self::register_room). Rare (a full inbox drained, a refusal seen):
    /// the fence it costs is off the frame path.
    pub fn ring_room(&self) {
        self.ring();
        // SeqCst: orders what announced the room (the drained inbox, the refusal taken)
        // before the flag load, pairing with the fence in `register_room` (Dekker-style).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.has_room.load(Ordering::Relaxed) {
            Self::wake(&self.room, &self.has_room);
        }
    }

    #[cold]
    fn wake_tasks(&self) {
        Self::wake(&self.wakers, &self.has_wakers);
    }

    /// Takes the wakers of one channel and wakes them outside its lock.
    #[cold]
    fn wake(list: &Mutex<Vec<Waker>>, flag: &AtomicBool) {
        let wakers = {
            let mut w = list.lock();
            flag.store(false, Ordering::Relaxed);
            std::mem::take(&mut *w)
        };
        for w in wakers {
            w.wake();
        }
    }

    /// A listener for the next ring (check -> listen -> re-check -> wait), boxed: one that
    /// outlives the caller's frame. A thread that parks before it returns takes
    /// [`listen_scoped`](Self::listen_scoped).
    pub fn listen(&self) -> SignalListener<'_> {
        let l = self.event.listen();
        self.sleeper_barrier();
        l
    }

    /// A listener for the next ring on this stack frame, handed to `f`, which re-checks and
    /// waits (check -> listen -> re-check -> wait): allocates nothing
    /// ([`Signal::listen_scoped`]).
    pub fn listen_scoped<R>(&self, f: impl FnOnce(SignalListener<'_>) -> R) -> R {
        self.event.listen_scoped(|l| {
            self.sleeper_barrier();
            f(l)
        })
    }

    /// After a listener counted itself (and fenced) or a waker's flag was raised and fenced,
    /// before the caller's last look: the barrier that stands for the fenceless rings'
    /// fences, unless the rings fence again (module docs, "The ring's fence").
    fn sleeper_barrier(&self) {
        // Acquire: pairs with the Release of a switch's end, after its barrier.
        if self.mode.load(Ordering::Acquire) != Mode::Fenced as u8 {
            membarrier::private_barrier();
        }
    }

    /// Registers `waker` to be woken at the next ring. The caller re-checks for frames
    /// afterwards (a ring may have come before the registration). The first registration
    /// turns the rings to fencing (module docs, "The ring's fence").
    pub fn register(&self, waker: &Waker) {
        Self::add(&self.wakers, &self.has_wakers, waker);
        if self.mode.load(Ordering::Acquire) != Mode::Fenced as u8 {
            self.fence_rings();
        }
    }

    /// Turns the rings to fencing for good (module docs, "The ring's fence").
    #[cold]
    fn fence_rings(&self) {
        // SeqCst: the new mode is visible before the barrier, which every later ring's
        // mode load then follows.
        let won = self.mode.compare_exchange(Mode::Fenceless as u8, Mode::Switching as u8, Ordering::SeqCst, Ordering::Relaxed).is_ok();
        // Our own look, and for a switch, every ringer that read `Fenceless`: its push
        // came before its CPU's barrier.
        membarrier::private_barrier();
        if won {
            // Release: a listener that reads `Fenced` sees what the barrier made visible.
            self.mode.store(Mode::Fenced as u8, Ordering::Release);
        }
    }

    /// Registers `waker` to be woken at the next ring of room
    /// ([`ring_room`](Self::ring_room) or [`ring_all`](Self::ring_all)), not by frames. The
    /// caller retries its refused sends afterwards (room may have come before the
    /// registration).
    pub fn register_room(&self, waker: &Waker) {
        Self::add(&self.room, &self.has_room, waker);
    }

    /// Adds `waker` to one channel (once) and raises its flag.
    fn add(list: &Mutex<Vec<Waker>>, flag: &AtomicBool, waker: &Waker) {
        let mut w = list.lock();
        if !w.iter().any(|x| x.will_wake(waker)) {
            w.push(waker.clone());
        }
        flag.store(true, Ordering::Relaxed);
        drop(w);
        // Full fence: the flag store must be visible before the caller re-checks (the
        // inboxes, or its refused sends), pairing with the fence of the ring (a Dekker-style
        // handshake).
        std::sync::atomic::fence(Ordering::SeqCst);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ring::Inbox;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::{Duration, Instant};

    impl Doorbell {
        fn fenceless(&self) -> bool {
            self.mode.load(Ordering::Relaxed) == Mode::Fenceless as u8
        }
    }

    /// Rings go without a fence only where this process registered for
    /// `MEMBARRIER_CMD_PRIVATE_EXPEDITED`, whose barrier the listeners then run; a doorbell
    /// asked to fence does so whatever the kernel has.
    #[test]
    fn rings_skip_the_fence_only_where_membarrier_registered() {
        let registered = membarrier::private_registered();
        assert_eq!(Doorbell::new().fenceless(), registered);
        assert!(!Doorbell::with_fence(true).fenceless());
    }

    /// The doorbells a test runs in each mode: fenced, and fenceless where this process
    /// could register (a fenceless ring with listeners that run no barrier would lose
    /// wake-ups).
    fn both_modes() -> Vec<Doorbell> {
        let mut bells = vec![Doorbell::with_fence(true)];
        if membarrier::private_registered() {
            bells.push(Doorbell::with_fence(false));
        }
        bells
    }

    /// A thread parked on the doorbell (check -> listen -> re-check -> wait) is woken by
    /// every frame pushed and rung, in both modes: a lost wake-up leaves it waiting past
    /// the deadline.
    #[test]
    fn a_parked_receiver_is_woken_by_each_send() {
        const ROUNDS: u32 = 300;
        for bell in both_modes() {
            let fenceless = bell.fenceless();
            let shared = Arc::new((Inbox::new(4), bell, AtomicU32::new(0)));
            let sender = {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let (inbox, bell, taken) = &*shared;
                    let deadline = Instant::now() + Duration::from_secs(20);
                    for i in 0..ROUNDS {
                        while taken.load(Ordering::Acquire) != i {
                            assert!(Instant::now() < deadline, "the receiver stopped taking frames");
                            std::thread::yield_now();
                        }
                        inbox.push(i).unwrap();
                        bell.ring();
                    }
                })
            };
            let (inbox, bell, taken) = &*shared;
            let (mut parked, mut next) = (0, 0);
            while next < ROUNDS {
                if inbox.pop_batch(1, |v| assert_eq!(v, next)) == 1 {
                    next += 1;
                    taken.store(next, Ordering::Release);
                    continue;
                }
                bell.listen_scoped(|l| {
                    if !inbox.has_next() {
                        parked += 1;
                        let woke = l.wait_deadline(Instant::now() + Duration::from_secs(10));
                        assert!(woke, "frame {next} pushed but the parked receiver not woken (fenceless: {fenceless})");
                    }
                });
            }
            sender.join().unwrap();
            assert!(parked > 0, "the receiver never parked: nothing was checked");
        }
    }

    /// A task registered on the doorbell is woken by the next frame's ring, in both modes;
    /// its registration turns a fenceless doorbell's rings to fencing.
    #[test]
    fn a_registered_task_is_woken_by_a_send() {
        struct Flag(AtomicU32);
        impl Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::Release);
            }
        }
        for bell in both_modes() {
            let inbox = Inbox::new(4);
            let flag = Arc::new(Flag(AtomicU32::new(0)));
            let waker = std::task::Waker::from(flag.clone());
            for i in 0..3 {
                bell.register(&waker);
                assert!(!bell.fenceless(), "a task's registration turns the rings to fencing");
                assert!(!inbox.has_next(), "the re-check after registering");
                inbox.push(i).unwrap();
                bell.ring();
                assert_eq!(flag.0.load(Ordering::Acquire), i + 1, "fenceless: {}", bell.fenceless());
                assert_eq!(inbox.pop_batch(1, drop), 1);
            }
            inbox.push(9).unwrap();
            bell.ring();
            assert_eq!(flag.0.load(Ordering::Acquire), 3, "a waker is woken once per registration");
        }
    }
}
