//! `weft-bench ctxid`: communicator creation from many threads at once ([Dinan 2012, Fig. 2]):
//! `--threads` threads per rank, each on a parent communicator of its own, loop
//! `dup`/`free` `--creations` times, with the eager allocation of [Dinan 2012, Listing 1.2]
//! (`eager`) or the base protocol alone (`base`), on `--ranks` ranks of the embedded provider
//! in this process.
//!
//! Columns: `threads,ranks,protocol,creations_per_sec,allreduces_per_creation`
//! (`creations_per_sec`: creations one rank completes per second over all its threads;
//! `allreduces_per_creation`: the group allreduces rank 0 ran per creation, a count that does
//! not depend on timing when the threads do not contend).

use std::time::Instant;

use weft::{Communicator, Runtime};

use crate::report::{parse_list, Output, Table};

/// Options of `weft-bench ctxid`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Threads per rank to sweep (comma list).
    #[arg(short = 't', long, default_value = "1,2,4,8")]
    threads: String,
    /// Rank counts to sweep (comma list; ranks are in this process).
    #[arg(short = 'r', long, default_value = "2")]
    ranks: String,
    /// Protocols to sweep (comma list of `eager`, `base`).
    #[arg(long, default_value = "eager,base")]
    protocol: String,
    /// `dup`/`free` cycles per thread.
    #[arg(long, default_value_t = 2000)]
    creations: usize,
    #[command(flatten)]
    out: Output,
}

/// One measurement: creations per second on one rank, and rank 0's allreduces per creation.
fn measure(ranks: u32, threads: usize, eager: bool, creations: usize) -> Result<(f64, f64), String> {
    let rts = Runtime::builder().eager_context_ids(eager).build_local(ranks).map_err(|e| e.to_string())?;
    // Each thread's parent, made on every rank at once (dup is collective).
    let parents: Vec<Vec<Communicator>> = std::thread::scope(|s| {
        let hs: Vec<_> =
            rts.iter().map(|rt| s.spawn(move || (0..threads).map(|_| rt.world().dup()).collect::<Result<Vec<_>, _>>())).collect();
        hs.into_iter().map(|h| h.join().expect("a rank's setup panicked")).collect::<Result<Vec<_>, _>>()
    })
    .map_err(|e| e.to_string())?;
    let before = rts[0].world().creation_allreduces();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        let hs: Vec<_> = parents
            .iter()
            .flatten()
            .map(|p| {
                s.spawn(move || {
                    for _ in 0..creations {
                        p.dup()?.free();
                    }
                    Ok::<(), weft::Error>(())
                })
            })
            .collect();
        hs.into_iter().try_for_each(|h| h.join().expect("a creating thread panicked"))
    })
    .map_err(|e| e.to_string())?;
    let secs = t0.elapsed().as_secs_f64();
    let per_rank = (threads * creations) as f64;
    let allreduces = (rts[0].world().creation_allreduces() - before) as f64;
    Ok((per_rank / secs, allreduces / per_rank))
}

pub fn run(args: &Args) -> Result<(), String> {
    let threads: Vec<usize> = parse_list(&args.threads)?;
    let ranks: Vec<u32> = parse_list(&args.ranks)?;
    let protocols: Vec<String> = parse_list(&args.protocol)?;
    if threads.contains(&0) || ranks.contains(&0) || args.creations == 0 {
        return Err("threads, ranks and creations must be at least 1".into());
    }
    if let Some(p) = protocols.iter().find(|p| !matches!(p.as_str(), "eager" | "base")) {
        return Err(format!("unknown protocol {p:?} (eager, base)"));
    }
    let mut table = Table::new(&["threads", "ranks", "protocol", "creations_per_sec", "allreduces_per_creation"], &args.out);
    table.progress(threads.len() * ranks.len() * protocols.len());
    table.print_header();
    for &r in &ranks {
        for &t in &threads {
            for p in &protocols {
                table.step(|| format!("{p}, {t} threads x {r} ranks"));
                let (rate, allreduces) = measure(r, t, p == "eager", args.creations)?;
                table.row(vec![t.to_string(), r.to_string(), p.clone(), format!("{rate:.0}"), format!("{allreduces:.3}")]);
            }
        }
    }
    table.finish();
    Ok(())
}
