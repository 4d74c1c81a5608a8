// The distributed hash table (`weft::dlock::Dht`). Included by `rma.rs` (embedded
// provider) and `p2p_ofi.rs` (libfabric shm and tcp) beside `rma_suite`, whose helpers it
// uses.

use std::collections::BTreeMap;

use weft::dlock::{Dht, DhtConfig, Levels, Thresholds, VolumeLock};
use weft::{Communicator, Error};

use super::rma_suite::{barrier, on_ranks};

/// The value every rank inserts for `key`: the final table is the same in any order.
fn value_of(key: u64) -> u64 {
    key.wrapping_mul(3).wrapping_add(1)
}

/// The indices of the keys rank `r` of `n` inserts from thread `t` (into [`hot_keys`]): a
/// range shared with the next rank (so ranks replace each other's entries), and one that is
/// the same for every rank.
fn keys(r: u32, t: u64, n: u32) -> impl Iterator<Item = usize> {
    let base = (u64::from(r) * 30 + t * 15) as usize;
    (base..base + 45).chain([7 * n as usize])
}

/// Keys that `table` places in rank 0's volume (every insert contends for one volume's lock
/// and its heap), enough for [`keys`] of `n` ranks, and `u64::MAX` first.
fn hot_keys(table: &Dht, n: u32) -> Vec<u64> {
    let want = 30 * n as usize + 60;
    [u64::MAX].into_iter().chain((0..).filter(|&k| table.volume_of(k) == 0)).take(want).collect()
}

/// Two threads per rank insert their keys while a third looks up keys as they go in (a
/// lookup finds nothing or the right value, never a torn entry); then every rank checks
/// every key of the union, and some keys nobody inserted, against a sequential map. The
/// keys are all in one volume, with far fewer buckets than keys: most keys go through the
/// overflow list, and the inserts of every rank contend for the volume.
fn against_a_map(c: &Communicator, lock: VolumeLock) {
    let n = c.size();
    let table = Dht::new(c, &DhtConfig { buckets: 16, heap: 400, lock }).unwrap();
    let hot = hot_keys(&table, n);
    barrier(c);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (table, hot) = (&table, &hot);
            s.spawn(move || {
                for k in keys(c.rank(), t, n).map(|i| hot[i]) {
                    let old = table.insert(k, value_of(k)).unwrap();
                    assert!(old.is_none() || old == Some(value_of(k)), "key {k} held {old:?}");
                }
            });
        }
        s.spawn(|| {
            for k in keys((c.rank() + 1) % n, 0, n).map(|i| hot[i]) {
                let v = table.get(k).unwrap();
                assert!(v.is_none() || v == Some(value_of(k)), "key {k} read as {v:?}");
            }
        });
    });
    barrier(c);
    let mut reference = BTreeMap::new();
    for r in 0..n {
        for t in 0..2 {
            reference.extend(keys(r, t, n).map(|i| (hot[i], value_of(hot[i]))));
        }
    }
    for (&k, &v) in &reference {
        assert_eq!(table.get(k).unwrap(), Some(v), "key {k}");
    }
    for k in [hot[hot.len() - 1], 1 << 40, u64::MAX - 1] {
        assert_eq!(table.get(k).unwrap(), None, "key {k} was never inserted");
    }
    // Every key is in exactly one volume.
    let mut mine = [table.local_len().unwrap() as u64];
    let mut all = [0u64];
    c.allreduce(&mine, &mut all, weft::Op::Sum).unwrap();
    mine[0] = all[0];
    assert_eq!(mine[0], reference.len() as u64, "keys stored twice or lost");
    barrier(c);
}

#[test]
fn dht_under_rma_rw_matches_a_sequential_map() {
    on_ranks(3, "DHT under RMA-RW", |_, c| {
        against_a_map(c, VolumeLock::RmaRw(Levels::simulated(&[2]), Thresholds { t_l: vec![2], t_r: 3, t_dc: 0 }));
    });
}

#[test]
fn dht_under_fompi_rw_matches_a_sequential_map() {
    on_ranks(3, "DHT under foMPI-RW", |_, c| against_a_map(c, VolumeLock::FompiRw));
}

#[test]
fn dht_under_the_spin_lock_matches_a_sequential_map() {
    on_ranks(3, "DHT under the spin lock", |_, c| against_a_map(c, VolumeLock::Spin));
}

/// A volume whose overflow heap is full refuses the insert and stays whole; a bad shape is
/// refused on creation.
#[test]
fn dht_full_volume_and_bad_shapes() {
    on_ranks(2, "DHT bad input", |_, c| {
        let bad = DhtConfig { buckets: 0, heap: 4, lock: VolumeLock::Spin };
        assert!(matches!(Dht::new(c, &bad), Err(Error::InvalidArgument(_))));
        let huge = DhtConfig { buckets: usize::MAX / 2, heap: usize::MAX / 2, lock: VolumeLock::Spin };
        assert!(matches!(Dht::new(c, &huge), Err(Error::InvalidArgument(_))));
        let bad_t =
            DhtConfig { buckets: 1, heap: 1, lock: VolumeLock::RmaRw(Levels::flat(), Thresholds { t_r: 0, ..Thresholds::default() }) };
        assert!(matches!(Dht::new(c, &bad_t), Err(Error::InvalidArgument(_))));

        // One bucket and two heap entries per volume: three keys fit in each.
        let table = Dht::new(c, &DhtConfig { buckets: 1, heap: 2, lock: VolumeLock::FompiRw }).unwrap();
        barrier(c);
        if c.rank() == 0 {
            let mut stored = Vec::new();
            let mut refused = 0;
            for k in 0..40u64 {
                match table.insert(k, k + 10) {
                    Ok(None) => stored.push(k),
                    Err(Error::InvalidArgument(_)) => refused += 1,
                    other => panic!("insert {k}: {other:?}"),
                }
            }
            assert_eq!(stored.len(), 6, "three keys per volume, two volumes");
            assert_eq!(refused, 34);
            for k in 0..40u64 {
                let want = stored.contains(&k).then_some(k + 10);
                assert_eq!(table.get(k).unwrap(), want, "key {k}");
            }
            // A full volume still replaces the value of a key it holds.
            assert_eq!(table.insert(stored[0], 1).unwrap(), Some(stored[0] + 10));
            assert_eq!(table.get(stored[0]).unwrap(), Some(1));
        }
        barrier(c);
        assert_eq!(table.local_len().unwrap(), 3);
        barrier(c);
    });
}

/// Lookups and inserts as tasks on one thread of each rank (tokio's current-thread
/// runtime): waiting for a volume's lock parks the task, so the others go on.
#[test]
fn dht_async_tasks_on_one_thread() {
    on_ranks(2, "DHT async", |me, c| {
        let table =
            Dht::new(c, &DhtConfig { buckets: 4, heap: 64, lock: VolumeLock::RmaRw(Levels::flat(), Thresholds::default()) }).unwrap();
        barrier(c);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            let table = &table;
            let tasks = (0..8u64).map(|t| async move {
                for i in 0..5 {
                    let k = u64::from(me) * 1000 + t * 10 + i;
                    assert_eq!(table.insert_async(k, value_of(k)).await.unwrap(), None);
                    assert_eq!(table.get_async(k).await.unwrap(), Some(value_of(k)));
                }
            });
            futures::future::join_all(tasks).await;
        });
        barrier(c);
        assert_eq!(table.get((1 - u64::from(me)) * 1000 + 74).unwrap(), Some(value_of((1 - u64::from(me)) * 1000 + 74)));
        barrier(c);
    });
}
