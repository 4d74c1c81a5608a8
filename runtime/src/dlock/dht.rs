//! The distributed hash table of the seed's case study [Schmid 2016, §5.3]: 64-bit keys
//! (with a 64-bit value each) spread over the ranks' parts of one window, each rank's part a
//! *local volume* of fixed-size arrays: a table of buckets and an overflow heap for the
//! entries whose bucket is taken. Each volume has its own distributed lock: a lookup takes
//! it as a reader, an insert as a writer, so lookups of one volume run beside each other
//! and inserts are alone in it (with [`VolumeLock::Spin`] every access is alone).
//!
//! # Layout
//!
//! A key's volume is `h(key) mod P` (`P` ranks), its bucket `h'(key) mod buckets` (`h`,
//! `h'`: two fixed 64-bit mixers, the same on every rank). A volume is, in `u64` words: the
//! number of heap entries in use, then `buckets` entries, then `heap` entries, each entry
//! `[STATE, KEY, VALUE, NEXT]` (STATE 1 when the entry holds a key; NEXT the heap index
//! plus 1 of the next entry of the bucket's overflow list, 0 at its end). An insert whose
//! bucket is taken takes the next free heap entry and links it at the end of the bucket's
//! list. The seed's table does this with compare-and-swap and fetch-and-add, since one of
//! its variants (foMPI-A) has no lock; under a volume's write lock the insert is alone in
//! the volume, so plain gets and puts (each put flushed before the next step depends on it)
//! do the same here.
//!
//! # Cost
//!
//! Creating a table is collective and creates one lock per volume, each with a window of
//! its own: a few words per rank per lock, `O(P)` words per rank in all, and `P + 1`
//! window exchanges.
//!
//! # Example
//!
//! ```
//! use weft::dlock::{Dht, DhtConfig, VolumeLock};
//! use weft::Runtime;
//!
//! let ranks = Runtime::builder().build_local(3).unwrap();
//! std::thread::scope(|s| {
//!     for rt in &ranks {
//!         s.spawn(move || {
//!             let c = rt.world();
//!             let table = Dht::new(c, &DhtConfig { buckets: 8, heap: 16, lock: VolumeLock::FompiRw }).unwrap();
//!             // Each rank inserts its own keys; every rank then finds all of them.
//!             for k in 0..5 {
//!                 table.insert(u64::from(c.rank()) * 100 + k, k * 2).unwrap();
//!             }
//!             c.barrier().unwrap();
//!             assert_eq!(table.get(204).unwrap(), Some(8));
//!             assert_eq!(table.get(7).unwrap(), None);
//!             c.barrier().unwrap();
//!         });
//!     }
//! });
//! ```

use weft_sync::Error;

use super::wait::block_on;
use super::{FompiRw, Levels, RmaRw, SpinLock, Thresholds};
use crate::comm::Communicator;
use crate::rma::Window;

/// Which lock guards each volume of a [`Dht`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeLock {
    /// [`RmaRw`] over these levels and thresholds: lookups are readers, inserts writers.
    RmaRw(Levels, Thresholds),
    /// [`FompiRw`], its counter on the volume's rank: lookups are readers, inserts writers.
    FompiRw,
    /// [`SpinLock`], its word on the volume's rank: every access is exclusive.
    Spin,
}

/// The shape of a [`Dht`]: the same on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DhtConfig {
    /// Buckets per volume (at least 1).
    pub buckets: usize,
    /// Overflow heap entries per volume: how many keys of one volume may find their bucket
    /// taken.
    pub heap: usize,
    /// The lock of each volume.
    pub lock: VolumeLock,
}

/// Words per entry: STATE, KEY, VALUE, NEXT.
const ENTRY: usize = 4;
const STATE: usize = 0;
const KEY: usize = 1;
const VALUE: usize = 2;
const NEXT: usize = 3;
/// The word that counts the heap entries in use.
const HEAP_USED: usize = 0;

/// Where a walk of a bucket's list ended: the word of an entry and the entry.
enum Walk {
    /// At the entry holding the key.
    Found(usize, [u64; ENTRY]),
    /// At the list's last entry (the bucket itself when it is free): the key is not there.
    End(usize, [u64; ENTRY]),
}

/// One lock per volume.
enum Locks {
    RmaRw(Vec<RmaRw>),
    FompiRw(Vec<FompiRw>),
    Spin(Vec<SpinLock>),
}

/// A distributed hash table of `u64` keys and values over the ranks of a communicator (module
/// docs). Every method may be called from any thread of any rank, concurrently.
pub struct Dht {
    window: Window<'static, u64>,
    locks: Locks,
    buckets: usize,
    heap: usize,
}

impl std::fmt::Debug for Dht {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let lock = match self.locks {
            Locks::RmaRw(_) => "rma-rw",
            Locks::FompiRw(_) => "fompi-rw",
            Locks::Spin(_) => "fompi-spin",
        };
        f.debug_struct("Dht")
            .field("rank", &self.window.rank())
            .field("buckets", &self.buckets)
            .field("heap", &self.heap)
            .field("lock", &lock)
            .finish()
    }
}

/// A 64-bit mixer (splitmix64's finalizer).
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// An error's first: `r`'s, else the release's.
fn first<R>(r: Result<R, Error>, released: Result<(), Error>) -> Result<R, Error> {
    let r = r?;
    released.map(|()| r)
}

impl Dht {
    /// Creates the table on every rank of `comm` (collective; `config` the same on all):
    /// each rank's volume, zeroed, and one lock per volume.
    pub fn new(comm: &Communicator, config: &DhtConfig) -> Result<Self, Error> {
        if config.buckets == 0 {
            return Err(Error::InvalidArgument("a hash table needs at least one bucket per volume"));
        }
        let words = config
            .buckets
            .checked_add(config.heap)
            .and_then(|e| e.checked_mul(ENTRY))
            .and_then(|w| w.checked_add(1))
            .filter(|&w| w <= isize::MAX as usize / 8)
            .ok_or(Error::InvalidArgument("a hash table volume of this many entries does not fit in memory"))?;
        let window = comm.window(words)?;
        let volumes = 0..comm.size();
        let locks = match &config.lock {
            VolumeLock::RmaRw(levels, thresholds) => {
                Locks::RmaRw(volumes.map(|_| RmaRw::new(comm, levels, thresholds)).collect::<Result<_, _>>()?)
            }
            VolumeLock::FompiRw => Locks::FompiRw(volumes.map(|v| FompiRw::new(comm, v)).collect::<Result<_, _>>()?),
            VolumeLock::Spin => Locks::Spin(volumes.map(|v| SpinLock::new(comm, v)).collect::<Result<_, _>>()?),
        };
        Ok(Dht { window, locks, buckets: config.buckets, heap: config.heap })
    }

    /// The rank whose volume holds `key`.
    pub fn volume_of(&self, key: u64) -> u32 {
        (mix(key) % u64::from(self.window.size())) as u32
    }

    /// The first word of `key`'s bucket in its volume.
    fn bucket_of(&self, key: u64) -> usize {
        1 + ENTRY * (mix(mix(key) ^ 0x9e37_79b9_7f4a_7c15) % self.buckets as u64) as usize
    }

    /// The first word of heap entry `i`.
    fn heap_entry(&self, i: usize) -> usize {
        1 + ENTRY * (self.buckets + i)
    }

    /// Runs `f` under volume `v`'s lock (as a writer if `write`), then releases it.
    async fn locked<R>(&self, v: u32, write: bool, f: impl FnOnce() -> Result<R, Error>) -> Result<R, Error> {
        let v = v as usize;
        match &self.locks {
            Locks::RmaRw(l) => {
                let g = if write { l[v].write_async().await? } else { l[v].read_async().await? };
                let r = f();
                first(r, g.unlock_async().await)
            }
            Locks::FompiRw(l) => {
                let g = if write { l[v].write_async().await? } else { l[v].read_async().await? };
                let r = f();
                first(r, g.unlock_async().await)
            }
            Locks::Spin(l) => {
                let g = l[v].lock_async().await?;
                let r = f();
                first(r, g.unlock_async().await)
            }
        }
    }

    /// The entry at word `at` of volume `v`.
    fn entry(&self, v: u32, at: usize) -> Result<[u64; ENTRY], Error> {
        let mut e = [0u64; ENTRY];
        self.window.get(v, at, &mut e)?;
        Ok(e)
    }

    /// Walks `key`'s bucket list in volume `v`.
    fn find(&self, v: u32, key: u64) -> Result<Walk, Error> {
        let mut at = self.bucket_of(key);
        // A list is at most the whole heap long; a longer walk means a corrupted volume.
        for _ in 0..=self.heap {
            let e = self.entry(v, at)?;
            if e[STATE] == 1 && e[KEY] == key {
                return Ok(Walk::Found(at, e));
            }
            if e[STATE] == 0 || e[NEXT] == 0 {
                return Ok(Walk::End(at, e));
            }
            let next = (e[NEXT] - 1) as usize;
            if next >= self.heap {
                break;
            }
            at = self.heap_entry(next);
        }
        Err(Error::InvalidArgument("a hash table volume's overflow list is corrupted (written outside the table?)"))
    }

    /// Looks `key` up: its value, if inserted. Takes the volume's lock as a reader.
    pub fn get(&self, key: u64) -> Result<Option<u64>, Error> {
        block_on(self.get_async(key))
    }

    /// [`get`](Self::get), parking the task (not the thread) while it waits for the lock.
    pub async fn get_async(&self, key: u64) -> Result<Option<u64>, Error> {
        let v = self.volume_of(key);
        self.locked(v, false, || {
            Ok(match self.find(v, key)? {
                Walk::Found(_, e) => Some(e[VALUE]),
                Walk::End(..) => None,
            })
        })
        .await
    }

    /// Inserts `key` with `value`, or replaces its value; returns the value it replaced.
    /// Takes the volume's lock as a writer. When the key's bucket is taken and the volume's
    /// overflow heap is full, nothing is written and the insert fails with
    /// [`Error::InvalidArgument`].
    pub fn insert(&self, key: u64, value: u64) -> Result<Option<u64>, Error> {
        block_on(self.insert_async(key, value))
    }

    /// [`insert`](Self::insert), parking the task (not the thread) while it waits for the
    /// lock.
    pub async fn insert_async(&self, key: u64, value: u64) -> Result<Option<u64>, Error> {
        let v = self.volume_of(key);
        self.locked(v, true, || self.insert_locked(v, key, value)).await
    }

    /// The insert, under volume `v`'s write lock.
    fn insert_locked(&self, v: u32, key: u64, value: u64) -> Result<Option<u64>, Error> {
        let w = &self.window;
        let at = match self.find(v, key)? {
            Walk::Found(at, e) => {
                w.put(v, at + VALUE, &[value])?;
                w.flush(v)?;
                return Ok(Some(e[VALUE]));
            }
            Walk::End(at, e) if e[STATE] == 0 => at,
            Walk::End(last, _) => {
                // The bucket is taken: the next free heap entry, linked after `last` once
                // it is written.
                let mut used = [0u64];
                w.get(v, HEAP_USED, &mut used)?;
                let i = used[0] as usize;
                if i >= self.heap {
                    return Err(Error::InvalidArgument("the hash table volume's overflow heap is full"));
                }
                let at = self.heap_entry(i);
                w.put(v, at, &[1, key, value, 0])?;
                w.put(v, HEAP_USED, &[used[0] + 1])?;
                w.flush(v)?;
                w.put(v, last + NEXT, &[used[0] + 1])?;
                w.flush(v)?;
                return Ok(None);
            }
        };
        w.put(v, at, &[1, key, value, 0])?;
        w.flush(v)?;
        Ok(None)
    }

    /// The keys this rank's volume holds (taken under its lock as a reader, so inserts
    /// finished before the call are counted).
    pub fn local_len(&self) -> Result<usize, Error> {
        let v = self.window.rank();
        block_on(self.locked(v, false, || {
            let mut words = vec![0u64; ENTRY * (self.buckets + self.heap)];
            self.window.get(v, 1, &mut words)?;
            Ok(words.chunks(ENTRY).filter(|e| e[STATE] == 1).count())
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use super::super::{Guard, Release};
    use super::*;
    use crate::Runtime;

    /// Runs `access` on another thread while this one holds `g`: whether it finished while
    /// `g` was held. Held for 100 ms where it should not finish; where it should (`shares`),
    /// held until it did, for up to 10 s (a loaded machine may not run the thread for a
    /// while). It finishes after the release.
    fn finishes_while_held<L: Release>(g: Guard<'_, L>, shares: bool, access: impl FnOnce() -> Result<Option<u64>, Error> + Send) -> bool {
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                access().unwrap();
                done.store(true, Ordering::SeqCst);
            });
            let deadline = Instant::now() + if shares { Duration::from_secs(10) } else { Duration::from_millis(100) };
            while !done.load(Ordering::SeqCst) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            let finished = done.load(Ordering::SeqCst);
            g.unlock().unwrap();
            finished
        })
    }

    /// [`finishes_while_held`] with volume 0's lock held (as a writer if `write`).
    fn beside(t: &Dht, write: bool, shares: bool, access: impl FnOnce() -> Result<Option<u64>, Error> + Send) -> bool {
        match &t.locks {
            Locks::RmaRw(l) => finishes_while_held(if write { l[0].write() } else { l[0].read() }.unwrap(), shares, access),
            Locks::FompiRw(l) => finishes_while_held(if write { l[0].write() } else { l[0].read() }.unwrap(), shares, access),
            Locks::Spin(l) => finishes_while_held(l[0].lock().unwrap(), shares, access),
        }
    }

    /// An insert waits for the volume's readers, a lookup for its writer; lookups run
    /// beside each other (under the spin lock every access is alone).
    #[test]
    fn inserts_exclude_and_lookups_share_a_volume() {
        let rts = Runtime::builder().env(false).build_local(1).unwrap();
        let c = rts[0].world();
        for lock in [VolumeLock::FompiRw, VolumeLock::RmaRw(Levels::flat(), Thresholds::default()), VolumeLock::Spin] {
            let t = Dht::new(c, &DhtConfig { buckets: 4, heap: 4, lock: lock.clone() }).unwrap();
            assert!(!beside(&t, false, false, || t.insert(1, 2)), "{lock:?}: an insert beside a lookup");
            assert!(!beside(&t, true, false, || t.get(1)), "{lock:?}: a lookup beside an insert");
            let shared = lock != VolumeLock::Spin;
            assert_eq!(beside(&t, false, shared, || t.get(1)), shared, "{lock:?}: lookups share a volume (not under the spin lock)");
            assert_eq!(t.get(1).unwrap(), Some(2));
        }
    }

    /// The async forms can be spawned on a multi-threaded executor.
    #[test]
    fn async_forms_are_send() {
        fn send<T: Send>(_: &T) {}
        let rts = Runtime::builder().env(false).build_local(1).unwrap();
        let t = Dht::new(rts[0].world(), &DhtConfig { buckets: 1, heap: 1, lock: VolumeLock::FompiRw }).unwrap();
        let (insert, get) = (t.insert_async(3, 4), t.get_async(3));
        send(&insert);
        send(&get);
        assert_eq!((block_on(insert).unwrap(), block_on(get).unwrap()), (None, Some(4)));
    }

    #[test]
    fn keys_spread_over_volumes_and_buckets_alike_on_every_rank() {
        let rts = Runtime::builder().env(false).build_local(1).unwrap();
        let t = Dht::new(rts[0].world(), &DhtConfig { buckets: 16, heap: 0, lock: VolumeLock::Spin }).unwrap();
        let mut hits = [0u32; 16];
        for k in 0..1600u64 {
            hits[(t.bucket_of(k) - 1) / ENTRY] += 1;
        }
        assert!(hits.iter().all(|&h| (50..=150).contains(&h)), "consecutive keys spread over the buckets: {hits:?}");
    }
}
