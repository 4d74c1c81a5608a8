//! The distributed hash table of [Schmid 2016, §5.3] (`weft::dlock::Dht`): ranks in this
//! process, simulated as nodes of two, insert and look up keys of one key set; each volume
//! is guarded by RMA-RW, a lookup takes it as a reader and an insert as a writer. An
//! operation is an insert with probability `F_W` (the first argument; 0.002, the seed's,
//! by default), else a lookup. Every rank checks at the end that it finds every key it
//! inserted with a value some rank wrote for it.
//!
//! `cargo run --release -p weft-examples --example dht -- 0.2`
use weft::dlock::{Dht, DhtConfig, Levels, Thresholds, VolumeLock};
use weft::Runtime;

const RANKS: u32 = 4;
const KEYS: u64 = 512;
const OPS: u64 = 5000;

fn main() -> Result<(), weft::Error> {
    let f_w: f64 = match std::env::args().nth(1) {
        Some(a) => {
            a.parse().ok().filter(|f| (0.0..=1.0).contains(f)).ok_or(weft::Error::InvalidArgument("F_W must be a number in 0..=1"))?
        }
        None => 0.002,
    };
    let ranks = Runtime::builder().build_local(RANKS)?;
    let lock = VolumeLock::RmaRw(Levels::simulated(&[2]), Thresholds::default());
    let config = DhtConfig { buckets: 64, heap: KEYS as usize, lock };
    let results: Vec<Result<(u64, u64, u64), weft::Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|rt| {
                let config = &config;
                s.spawn(move || {
                    let c = rt.world();
                    let table = Dht::new(c, config)?;
                    // Values encode the key, so any rank's insert of a key is recognized.
                    let value = |k: u64, i: u64| k << 32 | i;
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(c.rank() + 1);
                    let mut rand = move || {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x
                    };
                    let (mut inserted, mut hits, mut lookups) = (Vec::new(), 0, 0);
                    c.barrier()?;
                    for i in 0..OPS {
                        let k = rand() % KEYS;
                        if (rand() % 1_000_000) as f64 / 1e6 < f_w {
                            table.insert(k, value(k, i))?;
                            inserted.push(k);
                        } else {
                            lookups += 1;
                            if let Some(v) = table.get(k)? {
                                assert_eq!(v >> 32, k, "a lookup found another key's value");
                                hits += 1;
                            }
                        }
                    }
                    c.barrier()?;
                    for &k in &inserted {
                        let v = table.get(k)?.expect("an inserted key is found");
                        assert_eq!(v >> 32, k);
                    }
                    c.barrier()?;
                    Ok((inserted.len() as u64, lookups, hits))
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        let (inserts, lookups, hits) = res?;
        println!("rank {r}: {inserts} inserts, {lookups} lookups ({hits} found)");
    }
    println!("F_W {f_w}: every rank found every key it inserted");
    Ok(())
}
