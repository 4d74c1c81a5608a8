//! `weft-bench pack`: datatype packing bandwidth versus threads ([Patinyasakdikul 2019, §4.6.2], Fig. 4.8).
//!
//! `threads` counts the threads that copy: the calling thread plus `threads - 1` pool
//! workers (`threads = 1` is the sequential pack). Packs of at least the pack threshold are
//! split into pool tasks; the caller packs a piece and helps with the rest.
//!
//! Datatypes (`f64` elements; `bytes` is the packed size):
//! `vector` — blocks of 16 elements (128 B) every 32; `indexed` — blocks of 8..=23 elements
//! with gaps of 8; `contiguous` — one block.
//!
//! Columns: `datatype,bytes,threads,seconds,gbps` (median over `--runs` samples of the mean
//! time of one pack; a sample repeats the pack for ~20 ms; thread counts alternate).

use std::time::Instant;

use weft::{Datatype, Runtime};

use crate::plot::Chart;
use crate::report::{median, parse_list, Output, PlotTo, Table};

/// Options of `weft-bench pack`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Packed sizes in bytes (comma list).
    #[arg(short = 's', long, default_value = "65536,1048576,16777216")]
    bytes: String,
    /// Thread counts (comma list; the caller plus `threads - 1` workers).
    #[arg(short = 't', long, default_value = "1,2")]
    threads: String,
    /// Datatypes (comma list of `vector`, `indexed`, `contiguous`).
    #[arg(short = 'd', long, default_value = "vector,indexed,contiguous")]
    datatype: String,
    /// Pack threshold in bytes (smaller packs are not split).
    #[arg(long, default_value_t = 256 * 1024)]
    threshold: usize,
    /// Repetitions (the median is reported).
    #[arg(long, default_value_t = 15)]
    runs: usize,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
}

fn make(kind: &str, bytes: usize) -> Result<Datatype<f64>, String> {
    let elems = (bytes / 8).max(1);
    let ty = match kind {
        "vector" => Datatype::vector(elems.div_ceil(16), 16, 32),
        "contiguous" => Datatype::contiguous(elems),
        "indexed" => {
            let (mut lens, mut displs, mut at, mut total, mut i) = (Vec::new(), Vec::new(), 0usize, 0usize, 0usize);
            while total < elems {
                let l = 8 + i % 16;
                lens.push(l);
                displs.push(at);
                at += l + 8;
                total += l;
                i += 1;
            }
            Datatype::indexed(&lens, &displs)
        }
        other => return Err(format!("unknown datatype {other:?} (vector, indexed, contiguous)")),
    };
    ty.map_err(|e| e.to_string())
}

/// Runs the sweep.
pub fn run(args: &Args) -> Result<(), String> {
    let sizes: Vec<usize> = parse_list(&args.bytes)?;
    let threads: Vec<usize> = parse_list(&args.threads)?;
    let kinds: Vec<String> = parse_list(&args.datatype)?;
    if threads.contains(&0) {
        return Err("thread counts must be at least 1".into());
    }
    let mut table = Table::new(&["datatype", "bytes", "threads", "seconds", "gbps"], &args.out);
    table.progress(kinds.len() * sizes.len());
    table.print_header();
    let runtimes: Vec<(usize, Runtime)> = threads
        .iter()
        .map(|&t| Runtime::builder().workers(t - 1).pack_threshold(args.threshold).build().map(|r| (t, r)))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    for kind in &kinds {
        for &bytes in &sizes {
            table.step(|| format!("{kind}, {bytes} B"));
            let ty = make(kind, bytes)?;
            let src: Vec<f64> = (0..ty.extent()).map(|i| i as f64).collect();
            let mut dst = vec![0.0f64; ty.size()];
            let want = ty.pack_to_vec(&src).map_err(|e| e.to_string())?;
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); runtimes.len()];
            let mut one = f64::MAX;
            for (_, rt) in &runtimes {
                let t0 = Instant::now();
                rt.pack(&ty, &src, &mut dst).map_err(|e| e.to_string())?; // warm-up (starts the pool)
                one = one.min(t0.elapsed().as_secs_f64());
                if dst != want {
                    return Err(format!("{kind}: parallel pack differs from the sequential one"));
                }
            }
            // Enough repetitions per sample for ~20 ms.
            let reps = ((0.02 / one.max(1e-9)) as usize).clamp(1, 100_000);
            for _ in 0..args.runs.max(1) {
                for (i, (_, rt)) in runtimes.iter().enumerate() {
                    let t0 = Instant::now();
                    for _ in 0..reps {
                        rt.pack(&ty, &src, &mut dst).map_err(|e| e.to_string())?;
                    }
                    samples[i].push(t0.elapsed().as_secs_f64() / reps as f64);
                }
            }
            for (i, (t, _)) in runtimes.iter().enumerate() {
                let s = median(&samples[i]);
                let packed = ty.size_bytes();
                table.row(vec![
                    kind.clone(),
                    packed.to_string(),
                    t.to_string(),
                    format!("{s:.9}"),
                    format!("{:.3}", packed as f64 / s / 1e9),
                ]);
            }
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chart = Chart::new(
        format!("pack: f64 datatypes, split from {} KiB, {cores} cores", args.threshold / 1024),
        "threads",
        "threads (caller + pool workers)",
    )
    .y("gbps", "")
    .y_axis("packed bandwidth (GB/s)", 1.0)
    .series("datatype", "{}")
    .series("bytes", "{} B")
    .log2_x();
    table.finish_with_plot(&chart, &args.plot)
}
