//! `Inbox`: the bounded frame queue of one embedded CRI — many producers (peers sending to
//! the CRI), one consumer at a time (whoever holds the CRI).
//!
//! A CRI is a network context: whoever progresses it is serialized (the runtime's CRI lock),
//! and anyone may send to it. crossbeam's `ArrayQueue` serves many consumers too, which costs
//! the single consumer twice per frame: its `pop` takes the head with a compare-exchange, and
//! an emptiness check reads the producers' tail index, the one line every push writes (the
//! line then travels between the cores on every frame). Here the consumer owns the head (a
//! plain store) and never reads the tail: a slot's stamp alone says whether it holds the
//! next frame (Vyukov's bounded queue, with the consumer side reduced to one thread), and
//! each slot has a cache line of its own, so a producer filling the next position does not
//! steal the line the consumer reads the current one from. `tests::stream_versus_array_queue`
//! measures the difference against crossbeam's queue (docs/BENCHMARKS.md, "Inbox").
//!
//! # Where positions lie
//!
//! Position `p` lies in slot `p * SPREAD % cap` (`SPREAD` odd, so each lap fills every
//! slot once): consecutive positions are `SPREAD` lines apart, not adjacent. A consumer
//! that keeps up with its producer waits at the position the producer is about to write.
//! With adjacent slots, the prefetchers of the consumer's core (the line pair, the stream
//! ahead) may pull in the lines of the next positions before the producer wrote them,
//! which then cross between the cores twice. Spread out, thread-mode multirate
//! (`weft-bench multirate -t 1,2 --mode thread`, alternating builds, `chrt -r 1`, other
//! jobs running; medians of per-run ratios) took 1.02x the rate at 1 pair with the two
//! vCPUs close (18 of 21 runs faster) and 1.07x with them apart (21 of 21), 0.99x and
//! 1.00x at 2 pairs, for 6 more instructions a message (`benches/stages.sh`) and about
//! 1.05x the time an item in `stream_versus_array_queue`.
//!
//! What the stream prefetcher did for a consumer behind its producer, the consumer does
//! itself: once a batch has taken `PREFETCH_AFTER` values, it prefetches the slot
//! `PREFETCH_AHEAD` positions past the next with each value it takes (a consumer that keeps
//! up takes fewer, and pulls in no line still to be written). That prefetch with adjacent
//! slots: 1.00x at 1 and 2 pairs. A spread of 65 lines (a page and a
//! line) with it: 1.07-1.11x and 1.35x at 1 pair, but 0.83-0.85x and 0.70x at 2; without
//! it, 1.03x and 1.22x at 1 pair.
//!
//! # Stamps
//!
//! Counters `head` and `tail` only grow (64-bit, never wrap in practice; the arithmetic
//! wraps anyway). The slot of position `p` (lap `p / cap`; module docs, "Where positions
//! lie") has stamp
//!
//! * `p`: free for the producer that claims position `p`;
//! * `p + 1`: written, ready for the consumer at head `p`;
//! * `p + cap`: read, free for position `p + cap` (the next lap).
//!
//! A producer at tail `t` finding stamp `t + 1 - cap` sees last lap's frame still unread:
//! the queue is full. Stamps are stored with Release after the slot's value is written (or
//! read) and loaded with Acquire before it is read (or overwritten).
//!
//! # Refusals
//!
//! A producer refused by a full queue must learn when there is room again, without polling
//! for it: it marks itself in `refused` ([`refuse`](Inbox::refuse)) and tries once more;
//! the consumer, after taking values, reads the marks ([`take_refused`](Inbox::take_refused))
//! and wakes whom it finds. A store-buffering handshake, with a `SeqCst` fence on each side
//! between the write and the read: either the producer's second try sees the slot the
//! consumer freed, or the consumer sees the producer's mark.

use std::fmt;
use std::mem::MaybeUninit;

use crossbeam_utils::CachePadded;

use crate::loom::cell::UnsafeCell;
use crate::loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// One position of the ring: its stamp and the value it carries, on one 64-byte line (a
/// packed embedded frame is 56 bytes). Not `CachePadded` (128 bytes on x86-64): the ring
/// of a deep inbox takes half the memory, and the line beside a slot holds a position
/// `SPREAD`'s inverse away (module docs, "Where positions lie"), not the next one.
#[repr(align(64))]
struct Slot<T> {
    stamp: AtomicUsize,
    value: UnsafeCell<MaybeUninit<T>>,
}

/// Lines between the slots of consecutive positions (module docs, "Where positions lie");
/// odd, so that `p * SPREAD % cap` is a permutation of the slots for any power-of-two `cap`.
const SPREAD: usize = 5;

/// `SPREAD`'s inverse modulo 2^64: the first position slot `i` holds is `i * SPREAD_INV % cap`.
const SPREAD_INV: usize = {
    // Newton's iteration doubles the correct low bits each step; an odd number is its own
    // inverse modulo 8 (3 bits), so 5 steps make 96 > 64.
    let mut inv = SPREAD;
    let mut k = 0;
    while k < 5 {
        inv = inv.wrapping_mul(2usize.wrapping_sub(SPREAD.wrapping_mul(inv)));
        k += 1;
    }
    inv
};
const _: () = assert!(SPREAD % 2 == 1 && SPREAD.wrapping_mul(SPREAD_INV) == 1);

/// Values a batch takes before the consumer prefetches ahead (module docs, "Where positions
/// lie").
const PREFETCH_AFTER: usize = 4;

/// Positions past the next one to take whose slot the consumer prefetches.
const PREFETCH_AHEAD: usize = 8;

/// The slot of position `p` in a ring of `mask + 1` slots.
#[inline(always)]
fn slot_of(p: usize, mask: usize) -> usize {
    p.wrapping_mul(SPREAD) & mask
}

/// A bounded many-producer, single-consumer queue; see the [module docs](self).
pub(crate) struct Inbox<T> {
    /// Next position to read; written only by the consumer.
    head: CachePadded<AtomicUsize>,
    /// Next position to claim; compare-exchanged by producers.
    tail: CachePadded<AtomicUsize>,
    /// Held by the consumer while it pops (a second consumer backs off instead of racing).
    consuming: CachePadded<AtomicBool>,
    /// Producers refused since the consumer last looked, one bit per producer class (see
    /// [`refuse`](Self::refuse)). Written only on refusals: the consumer's line-local read
    /// of it costs nothing while nobody is refused.
    refused: CachePadded<AtomicU64>,
    slots: Box<[Slot<T>]>,
    /// `slots.len() - 1` (the length is a power of two).
    mask: usize,
}

// SAFETY: values move from producers to the consumer through the stamp protocol (each slot
// is accessed by one side at a time, handed over with Release/Acquire on its stamp), so the
// queue is as thread-safe as a channel of `T: Send`.
unsafe impl<T: Send> Send for Inbox<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for Inbox<T> {}

impl<T> fmt::Debug for Inbox<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inbox").field("capacity", &self.slots.len()).finish_non_exhaustive()
    }
}

impl<T> Inbox<T> {
    /// A queue holding at least `capacity` values (rounded up to a power of two, and to at
    /// least 2: with one slot, "written" (`p + 1`) and "read, free for the next lap"
    /// (`p + cap`) would be the same stamp, and a second producer would overwrite an unread
    /// value).
    pub(crate) fn new(capacity: usize) -> Self {
        let cap = capacity.max(2).next_power_of_two();
        Inbox {
            head: CachePadded::new(AtomicUsize::new(0)),
            tail: CachePadded::new(AtomicUsize::new(0)),
            consuming: CachePadded::new(AtomicBool::new(false)),
            refused: CachePadded::new(AtomicU64::new(0)),
            // Stamp `p` for the first position `p` each slot holds (free for its producer).
            slots: (0..cap)
                .map(|i| Slot {
                    stamp: AtomicUsize::new(i.wrapping_mul(SPREAD_INV) & (cap - 1)),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                })
                .collect(),
            mask: cap - 1,
        }
    }

    /// Appends `value`, or hands it back if the queue is full.
    #[cfg(test)]
    pub(crate) fn push(&self, value: T) -> Result<(), T> {
        self.push_with(move || value).map_err(|make| make())
    }

    /// Appends the value `make` gives, built in its slot once the slot is claimed (not on
    /// the producer's stack, then copied in); hands `make` back, not called, if the queue
    /// is full. `make` must not panic: the slot it was to fill would never be published,
    /// and the consumer would wait at it for ever.
    #[inline]
    pub(crate) fn push_with<F: FnOnce() -> T>(&self, make: F) -> Result<(), F> {
        let cap = self.mask + 1;
        // Relaxed: the tail only allocates positions; the slot's stamp carries the data.
        let mut t = self.tail.load(Ordering::Relaxed);
        loop {
            let slot = &self.slots[slot_of(t, self.mask)];
            // Acquire: pairs with the consumer's Release after it read last lap's value.
            let stamp = slot.stamp.load(Ordering::Acquire);
            if stamp == t {
                match self.tail.compare_exchange_weak(t, t.wrapping_add(1), Ordering::Relaxed, Ordering::Relaxed) {
                    Ok(_) => {
                        // SAFETY: position `t` is ours (the CAS), and stamp `t` says the slot
                        // is free: the consumer finished reading its previous value.
                        slot.value.with_mut(|p| unsafe { (*p).write(make()) });
                        // Release: publishes the value to the consumer's Acquire.
                        slot.stamp.store(t.wrapping_add(1), Ordering::Release);
                        return Ok(());
                    }
                    Err(now) => t = now,
                }
            } else if stamp.wrapping_add(cap) == t.wrapping_add(1) {
                // Last lap's value is still unread.
                return Err(make);
            } else {
                // Another producer took `t` meanwhile.
                t = self.tail.load(Ordering::Relaxed);
            }
        }
    }

    /// After `push` refused `value`: marks the producer with `bits` for the consumer's next
    /// [`take_refused`](Self::take_refused), then tries once more. An `Err` means the
    /// consumer will see the mark after it next frees a slot (module docs, "Refusals").
    #[cfg(test)]
    pub(crate) fn refuse(&self, bits: u64, value: T) -> Result<(), T> {
        self.refuse_with(bits, move || value).map_err(|make| make())
    }

    /// [`refuse`](Self::refuse) after [`push_with`](Self::push_with) refused `make`.
    #[cold]
    pub(crate) fn refuse_with<F: FnOnce() -> T>(&self, bits: u64, make: F) -> Result<(), F> {
        self.refused.fetch_or(bits, Ordering::Relaxed);
        // SeqCst: orders the mark before the second try's stamp loads (the handshake).
        fence(Ordering::SeqCst);
        self.push_with(make)
    }

    /// The marks of producers refused since the last call, cleared; for the consumer after
    /// it took values (module docs, "Refusals"). A fence and a load while nobody is marked.
    pub(crate) fn take_refused(&self) -> u64 {
        // SeqCst: orders the consumer's stamp stores before the load of the marks.
        fence(Ordering::SeqCst);
        if self.refused.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.refused.swap(0, Ordering::Relaxed)
    }

    /// Whether the next value is ready (a racy snapshot, for any thread).
    #[inline]
    pub(crate) fn has_next(&self) -> bool {
        let h = self.head.load(Ordering::Relaxed);
        // Acquire: a `true` is followed by a pop that reads the value.
        self.slots[slot_of(h, self.mask)].stamp.load(Ordering::Acquire) == h.wrapping_add(1)
    }

    /// Takes up to `max` values in order, handing each to `f`; returns how many. Another
    /// thread consuming at the same moment makes this return 0 (callers serialize consumers;
    /// this only keeps a mistake from being unsound).
    pub(crate) fn pop_batch(&self, max: usize, mut f: impl FnMut(T)) -> usize {
        // Acquire: the previous consumer's head store and slot reads happen before ours.
        if self.consuming.swap(true, Ordering::Acquire) {
            return 0;
        }
        // In registers for the loop: through `&self` the compiler would load them again after
        // every value `f` takes (`f` might write them, for all it knows).
        let (slots, mask) = (&*self.slots, self.mask);
        let cap = mask + 1;
        // Relaxed: only consumers write `head`, and the flag orders them.
        let mut h = self.head.load(Ordering::Relaxed);
        let mut n = 0;
        while n < max {
            // SAFETY: `slot_of(h, mask) <= mask < slots.len()` (`new`).
            let slot = unsafe { slots.get_unchecked(slot_of(h, mask)) };
            // Acquire: pairs with the producer's Release after it wrote the value.
            if slot.stamp.load(Ordering::Acquire) != h.wrapping_add(1) {
                break;
            }
            // SAFETY: stamp `h + 1` says a producer wrote this slot for position `h` and
            // nobody touches it until we store the next stamp; we are the only consumer.
            let value = slot.value.with(|p| unsafe { (*p).assume_init_read() });
            // Release: our read of the value happens before the next lap's producer writes.
            slot.stamp.store(h.wrapping_add(cap), Ordering::Release);
            h = h.wrapping_add(1);
            // Relaxed: for `has_next` readers; kept fresh per value, so a thread that checks
            // for frames while we consume never reads a slot we already emptied as "no
            // more frames" while later ones wait.
            self.head.store(h, Ordering::Relaxed);
            n += 1;
            if n >= PREFETCH_AFTER {
                // SAFETY: as above.
                prefetch(unsafe { slots.get_unchecked(slot_of(h.wrapping_add(PREFETCH_AHEAD), mask)) });
            }
            f(value);
        }
        // Release: pairs with the next consumer's Acquire swap.
        self.consuming.store(false, Ordering::Release);
        n
    }
}

/// Asks for `slot`'s line in the cache (a hint: no access, whatever the slot holds).
#[inline(always)]
fn prefetch<T>(slot: &Slot<T>) {
    // Not under Miri: a cache hint means nothing to an interpreter.
    #[cfg(all(target_arch = "x86_64", not(loom), not(miri)))]
    // SAFETY: a prefetch reads nothing architecturally and never faults.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((slot as *const Slot<T>).cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(loom), not(miri))))]
    let _ = slot;
}

impl<T> Drop for Inbox<T> {
    fn drop(&mut self) {
        // Values still queued are dropped with the queue.
        while self.pop_batch(usize::MAX, drop) > 0 {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One slot cannot tell "written" from "free for the next lap": a capacity of 1 is
    /// rounded up to 2, and a full queue refuses instead of overwriting an unread value.
    #[test]
    fn one_slot_is_two() {
        let q = Inbox::new(1);
        assert_eq!(q.push(1u32), Ok(()));
        assert_eq!(q.push(2), Ok(()));
        assert_eq!(q.push(3), Err(3));
        let mut got = Vec::new();
        assert_eq!(q.pop_batch(8, |v| got.push(v)), 2);
        assert_eq!(got, [1, 2]);
    }

    /// A producer refused by a full queue is reported to the consumer once, after it took
    /// values; a producer that gets in on its second try is not.
    #[test]
    fn refusals_reach_the_consumer_once() {
        let q = Inbox::new(2);
        q.push(1u32).unwrap();
        q.push(2).unwrap();
        assert_eq!(q.push(3), Err(3));
        assert_eq!(q.refuse(1 << 5, 3), Err(3));
        assert_eq!(q.pop_batch(1, drop), 1);
        assert_eq!(q.take_refused(), 1 << 5);
        assert_eq!(q.take_refused(), 0);
        assert_eq!(q.refuse(1 << 6, 3), Ok(()), "room again: the second try gets in");
    }

    #[test]
    fn fifo_full_and_wrap() {
        let q = Inbox::new(3); // rounded up to 4
        for round in 0..5u32 {
            for i in 0..4 {
                assert_eq!(q.push(round * 10 + i), Ok(()));
            }
            assert_eq!(q.push(99), Err(99), "full at capacity");
            assert!(q.has_next());
            let mut got = Vec::new();
            assert_eq!(q.pop_batch(3, |v| got.push(v)), 3);
            assert_eq!(q.pop_batch(10, |v| got.push(v)), 1);
            assert_eq!(got, (0..4).map(|i| round * 10 + i).collect::<Vec<_>>());
            assert!(!q.has_next());
            assert_eq!(q.pop_batch(10, |_| panic!("empty")), 0);
        }
    }

    /// Each lap fills every slot once, consecutive positions `SPREAD` lines apart, and a
    /// slot's initial stamp is the first position it holds.
    #[test]
    fn positions_spread_over_every_slot() {
        // Up to 4,096 slots natively; Miri, which interprets every access, checks up to 256.
        let largest = if cfg!(miri) { 8 } else { 12 };
        for cap in (0..=largest).map(|k| 1usize << k) {
            let q: Inbox<u8> = Inbox::new(cap);
            let mask = cap - 1;
            let mut seen = vec![false; cap];
            for p in 0..cap {
                let i = slot_of(p, mask);
                assert!(!seen[i], "slot {i} twice in a lap of {cap}");
                seen[i] = true;
                assert_eq!(q.slots[i].stamp.load(Ordering::Relaxed), p, "slot {i} of {cap}");
                assert_eq!(slot_of(p + cap, mask), i, "the next lap's position shares the slot");
                if cap > SPREAD {
                    assert_eq!(slot_of(p + 1, mask), (i + SPREAD) & mask);
                }
            }
        }
    }

    /// FIFO order, fullness and the refusal marks through many laps of rings whose
    /// positions do not lie in slot order.
    #[test]
    fn spread_rings_stay_fifo() {
        for cap in [8usize, 16, 64] {
            let q = Inbox::new(cap);
            let mut next = 0u32;
            let mut expect = 0u32;
            for round in 0..10 {
                while q.push(next).is_ok() {
                    next += 1;
                }
                assert_eq!(next - expect, cap as u32, "full at capacity {cap}");
                assert_eq!(q.refuse(1, next), Err(next));
                let take = 1 + round % cap;
                let mut got = Vec::new();
                assert_eq!(q.pop_batch(take, |v| got.push(v)), take);
                assert_eq!(got, (expect..expect + take as u32).collect::<Vec<_>>());
                expect += take as u32;
                assert_eq!(q.take_refused(), 1);
            }
            let mut got = Vec::new();
            q.pop_batch(usize::MAX, |v| got.push(v));
            assert_eq!(got, (expect..next).collect::<Vec<_>>());
            assert!(!q.has_next());
        }
    }

    #[test]
    fn queued_values_are_dropped_with_the_queue() {
        let marker = std::sync::Arc::new(());
        let q = Inbox::new(8);
        for _ in 0..5 {
            q.push(marker.clone()).unwrap();
        }
        q.pop_batch(2, drop);
        drop(q);
        assert_eq!(std::sync::Arc::strong_count(&marker), 1);
    }

    /// Four producers, one consumer, a small ring (constant wrapping and full refusals):
    /// every value arrives exactly once and each producer's values in order.
    #[test]
    fn many_producers_one_consumer() {
        // Sized down under Miri, which interprets every access (still wrapping a 16-slot
        // ring many times).
        const PER: u64 = if cfg!(miri) { 300 } else { 200_000 };
        let q = std::sync::Arc::new(Inbox::new(16));
        let producers: Vec<_> = (0..4u64)
            .map(|p| {
                let q = q.clone();
                std::thread::spawn(move || {
                    for i in 0..PER {
                        let mut v = (p << 32) | i;
                        while let Err(back) = q.push(v) {
                            v = back;
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut next = [0u64; 4];
        let mut total = 0;
        while total < 4 * PER {
            let n = q.pop_batch(7, |v| {
                let (p, i) = ((v >> 32) as usize, v & 0xffff_ffff);
                assert_eq!(i, next[p], "producer {p} out of order");
                next[p] += 1;
            });
            total += n as u64;
            if n == 0 {
                std::thread::yield_now();
            }
        }
        for p in producers {
            p.join().unwrap();
        }
        assert_eq!(next, [PER; 4]);
        assert!(!q.has_next());
    }

    /// Streams frame-sized items from one thread to another through an `Inbox` and through
    /// crossbeam's `ArrayQueue` with the emptiness check the embedded provider used before,
    /// and prints ns per item (docs/BENCHMARKS.md, "Inbox"). A measurement, not a check:
    /// `cargo test -p weft-transport --release --lib ring::tests::stream -- --ignored --nocapture`
    #[test]
    #[ignore = "a benchmark; run by hand"]
    fn stream_versus_array_queue() {
        use crossbeam_queue::ArrayQueue;
        #[derive(Clone, Copy)]
        struct Item([u64; 7]); // 56 bytes, the size of an embedded inbox's packed frame
        const N: u64 = 10_000_000;
        fn run<Q: Send + Sync + 'static>(q: Q, push: fn(&Q, Item) -> bool, drain: fn(&Q, &mut dyn FnMut(Item)) -> usize) -> f64 {
            let q = std::sync::Arc::new(q);
            let q2 = q.clone();
            let t0 = std::time::Instant::now();
            let p = std::thread::spawn(move || {
                let mut i = 0;
                while i < N {
                    if push(&q2, Item([i; 7])) {
                        i += 1;
                    } else {
                        std::hint::spin_loop();
                    }
                }
            });
            let (mut got, mut sum) = (0u64, 0u64);
            while got < N {
                let n = drain(&q, &mut |x| sum = sum.wrapping_add(x.0[0]));
                got += n as u64;
                if n == 0 {
                    std::hint::spin_loop();
                }
            }
            p.join().unwrap();
            assert_eq!(sum, N * (N - 1) / 2);
            t0.elapsed().as_nanos() as f64 / N as f64
        }
        for round in 0..3 {
            let inbox = run(Inbox::new(1024), |q, v| q.push(v).is_ok(), |q, f| q.pop_batch(64, f));
            let aq = run(
                ArrayQueue::new(1024),
                |q, v| q.push(v).is_ok(),
                |q, f| {
                    if q.is_empty() {
                        return 0;
                    }
                    let mut n = 0;
                    while n < 64 {
                        match q.pop() {
                            Some(v) => f(v),
                            None => break,
                        }
                        n += 1;
                    }
                    n
                },
            );
            println!("round {round}: Inbox {inbox:.1} ns/item, ArrayQueue {aq:.1} ns/item ({:.2}x)", aq / inbox);
        }
    }
}

/// Loom models: producers race for the slots of a two-slot ring while the consumer drains;
/// nothing is lost, duplicated or reordered per producer.
/// `RUSTFLAGS="--cfg loom" cargo test -p weft-transport --release --lib ring::model`
#[cfg(all(test, loom))]
mod model {
    use super::*;
    use loom::sync::Arc;

    fn check(producers: u32, per: u32) {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(move || {
            let q = Arc::new(Inbox::new(2));
            let ps: Vec<_> = (0..producers)
                .map(|p| {
                    let q = q.clone();
                    loom::thread::spawn(move || {
                        for i in 0..per {
                            let mut v = p * 10 + i;
                            while let Err(back) = q.push(v) {
                                v = back;
                                loom::thread::yield_now();
                            }
                        }
                    })
                })
                .collect();
            let mut got = Vec::new();
            while got.len() < (producers * per) as usize {
                if q.pop_batch(4, |v| got.push(v)) == 0 {
                    loom::thread::yield_now();
                }
            }
            for p in ps {
                p.join().unwrap();
            }
            for p in 0..producers {
                let mine: Vec<u32> = got.iter().copied().filter(|v| v / 10 == p).collect();
                assert_eq!(mine, (0..per).map(|i| p * 10 + i).collect::<Vec<_>>());
            }
        });
    }

    /// Two producers claim slots concurrently.
    #[test]
    fn two_producers_one_consumer() {
        check(2, 1);
    }

    /// One producer laps a two-slot ring (full refusals, stamp reuse).
    #[test]
    fn one_producer_laps_the_ring() {
        check(1, 3);
    }

    /// The refusal handshake: a producer refused by a full queue either gets in on its
    /// second try or is seen by the consumer that freed the slot (no lost wake-up).
    #[test]
    fn a_refused_producer_is_seen_or_gets_in() {
        loom::model(|| {
            let q = Arc::new(Inbox::new(2));
            q.push(0u32).unwrap();
            q.push(0u32).unwrap();
            let p = {
                let q = q.clone();
                loom::thread::spawn(move || match q.push(1) {
                    Ok(()) => true,
                    Err(v) => q.refuse(1, v).is_ok(),
                })
            };
            let mut got = 0;
            q.pop_batch(1, |_| got += 1);
            let seen = got == 1 && q.take_refused() == 1;
            let got_in = p.join().unwrap();
            assert!(got_in || seen, "the refused producer was neither let in nor seen");
        });
    }

    /// Two producers refused by a full ring while the consumer empties it: each one left
    /// out was seen, or the ring holds the other's value (the consumer's next pop, then its
    /// look at the marks, sees it). No refused producer waits on an empty ring unseen.
    #[test]
    fn two_refused_producers_are_seen_or_a_value_waits() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let q = Arc::new(Inbox::new(2));
            q.push(0u32).unwrap();
            q.push(0u32).unwrap();
            let ps: Vec<_> = (0..2u32)
                .map(|p| {
                    let q = q.clone();
                    loom::thread::spawn(move || match q.push(1 + p) {
                        Ok(()) => true,
                        Err(v) => q.refuse(1 << p, v).is_ok(),
                    })
                })
                .collect();
            assert_eq!(q.pop_batch(2, |v| assert_eq!(v, 0)), 2);
            let seen = q.take_refused();
            let got_in: Vec<bool> = ps.into_iter().map(|p| p.join().unwrap()).collect();
            for p in 0..2 {
                assert!(got_in[p] || seen & (1 << p) != 0 || q.has_next(), "producer {p} refused, unseen, with nothing queued");
            }
        });
    }
}
