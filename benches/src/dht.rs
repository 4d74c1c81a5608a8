//! `weft-bench dht`: the distributed hash table of the seed's case study [Schmid 2016,
//! §5.3] (`weft::dlock::Dht`) under each volume lock, on `--ranks` ranks in this process
//! (embedded provider by default; `shm` and `tcp` with the `ofi` feature).
//!
//! The table holds `--keys` keys, half of them inserted before the clock starts. Each
//! measured operation draws a key of the key set at random and is an insert (a new key, or
//! a new value for a present one) with probability `--writers` (`F_W`), else a lookup.
//! `--access one` is the seed's setup: the keys are ones that the table places in rank 0's
//! volume, and ranks 1 to `P - 1` access it; `--access spread` draws keys of every volume,
//! and every rank takes part.
//!
//! Columns: `lock,provider,ranks,access,writers_fraction,keys,ops_per_rank,seconds,ops_per_sec`
//! (`seconds`: the slowest rank's time for its operations; `ops_per_sec`: the operations of
//! all ranks per second of it).

use std::time::Instant;

use weft::dlock::{Dht, DhtConfig, Levels, Thresholds, VolumeLock};
use weft::{Provider, Runtime};

use crate::dlock::{draws_write, parse_levels, Kind, Rng};
use crate::report::{parse_list, Output, Table};

/// Options of `weft-bench dht`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Volume locks to sweep (comma list of `rma-rw`, `fompi-rw`, `fompi-spin`).
    #[arg(long, default_value = "rma-rw,fompi-rw,fompi-spin")]
    lock: String,
    /// Rank counts to sweep (comma list; ranks are in this process).
    #[arg(short = 'r', long, default_value = "4")]
    ranks: String,
    /// Providers to sweep (comma list of `embedded`, `shm`, `tcp`).
    #[arg(long, default_value = "embedded")]
    provider: String,
    /// Fractions of inserts `F_W` to sweep (comma list; the seed's default is 0.2%).
    #[arg(long, default_value = "0.002")]
    writers: String,
    /// Which volumes the operations go to: `one` (rank 0's, accessed by the other ranks, as
    /// the seed) or `spread` (every rank's, from every rank); a comma list sweeps.
    #[arg(long, default_value = "one")]
    access: String,
    /// Keys in the key set.
    #[arg(long, default_value_t = 1024)]
    keys: u64,
    /// Buckets per volume.
    #[arg(long, default_value_t = 256)]
    buckets: usize,
    /// Operations per rank in one measurement.
    #[arg(long, default_value_t = 2000)]
    ops: u64,
    /// Simulated machine levels of RMA-RW, innermost first (`2` is 2 ranks per node;
    /// `flat` is one level).
    #[arg(long, default_value = "2")]
    levels: String,
    /// `T_R` of RMA-RW.
    #[arg(long, default_value_t = 1000)]
    t_r: u64,
    #[command(flatten)]
    out: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    One,
    Spread,
}

impl std::str::FromStr for Access {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "one" => Ok(Access::One),
            "spread" => Ok(Access::Spread),
            _ => Err(format!("unknown access {s:?} (one, spread)")),
        }
    }
}

/// One configuration.
struct Point {
    kind: Kind,
    provider: Provider,
    ranks: u32,
    access: Access,
    writers: f64,
}

/// The volume lock of `kind`.
fn volume_lock(kind: Kind, levels: &Levels, t_r: u64) -> Result<VolumeLock, String> {
    match kind {
        Kind::RmaRw => Ok(VolumeLock::RmaRw(levels.clone(), Thresholds { t_r, ..Thresholds::default() })),
        Kind::FompiRw => Ok(VolumeLock::FompiRw),
        Kind::FompiSpin => Ok(VolumeLock::Spin),
        other => Err(format!("{} cannot guard a hash table volume (rma-rw, fompi-rw, fompi-spin)", other.name())),
    }
}

/// The slowest rank's time for its operations, in seconds.
fn measure(p: &Point, args: &Args, lock: &VolumeLock) -> Result<f64, String> {
    let rts = Runtime::builder().provider(p.provider).build_local(p.ranks).map_err(|e| e.to_string())?;
    let config = DhtConfig { buckets: args.buckets, heap: args.keys as usize, lock: lock.clone() };
    let times: Vec<Result<f64, weft::Error>> = std::thread::scope(|s| {
        let hs: Vec<_> = rts
            .iter()
            .map(|rt| {
                let config = &config;
                s.spawn(move || {
                    let c = rt.world();
                    let table = Dht::new(c, config)?;
                    let set: Vec<u64> = match p.access {
                        Access::Spread => (0..args.keys).collect(),
                        Access::One => (0..).filter(|&k| table.volume_of(k) == 0).take(args.keys as usize).collect(),
                    };
                    for (i, &k) in set.iter().enumerate().filter(|(i, _)| i % 2 == 0) {
                        if i / 2 % c.size() as usize == c.rank() as usize {
                            table.insert(k, 0)?;
                        }
                    }
                    let active = p.access == Access::Spread || c.rank() != 0 || c.size() == 1;
                    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (u64::from(c.rank()) + 1));
                    c.barrier()?;
                    let t0 = Instant::now();
                    if active {
                        for i in 0..args.ops {
                            let k = set[(rng.next() % set.len() as u64) as usize];
                            if draws_write(rng.next(), p.writers) {
                                table.insert(k, i)?;
                            } else {
                                table.get(k)?;
                            }
                        }
                    }
                    let elapsed = t0.elapsed().as_secs_f64();
                    c.barrier()?;
                    Ok(elapsed)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("a rank panicked")).collect()
    });
    let times = times.into_iter().collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    Ok(times.into_iter().fold(0.0, f64::max))
}

pub fn run(args: &Args) -> Result<(), String> {
    let kinds: Vec<Kind> = parse_list(&args.lock)?;
    let ranks: Vec<u32> = parse_list(&args.ranks)?;
    let providers: Vec<Provider> = parse_list(&args.provider)?;
    let writers: Vec<f64> = parse_list(&args.writers)?;
    let accesses: Vec<Access> = parse_list(&args.access)?;
    let levels = parse_levels(&args.levels)?;
    if ranks.contains(&0) || args.ops == 0 || args.keys == 0 || args.buckets == 0 || args.t_r == 0 {
        return Err("ranks, ops, keys, buckets and t_r must be at least 1".into());
    }
    if writers.iter().any(|f| !(0.0..=1.0).contains(f)) {
        return Err("a fraction of writers is outside 0..=1".into());
    }
    let locks = kinds.iter().map(|&k| volume_lock(k, &levels, args.t_r)).collect::<Result<Vec<_>, _>>()?;
    let mut points = Vec::new();
    for (&kind, lock) in kinds.iter().zip(&locks) {
        for &provider in &providers {
            for &r in &ranks {
                for &access in &accesses {
                    for &writers in &writers {
                        points.push((Point { kind, provider, ranks: r, access, writers }, lock));
                    }
                }
            }
        }
    }
    let columns = ["lock", "provider", "ranks", "access", "writers_fraction", "keys", "ops_per_rank", "seconds", "ops_per_sec"];
    let mut table = Table::new(&columns, &args.out);
    args.out.note(&format!(
        "# {} buckets per volume; RMA-RW levels: {} (simulated, innermost first), T_R {}",
        args.buckets, args.levels, args.t_r
    ));
    table.progress(points.len());
    table.print_header();
    for (p, lock) in &points {
        table.step(|| format!("{} {} ranks {:?}", p.kind.name(), p.ranks, p.access));
        let seconds = measure(p, args, lock)?;
        let active = if p.access == Access::One && p.ranks > 1 { p.ranks - 1 } else { p.ranks };
        let ops = f64::from(active) * args.ops as f64;
        table.row(vec![
            p.kind.name().into(),
            p.provider.to_string(),
            p.ranks.to_string(),
            format!("{:?}", p.access).to_lowercase(),
            format!("{}", p.writers),
            args.keys.to_string(),
            args.ops.to_string(),
            format!("{seconds:.6}"),
            format!("{:.0}", ops / seconds.max(1e-9)),
        ]);
    }
    table.finish();
    Ok(())
}
