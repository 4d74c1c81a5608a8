//! `weft-bench`: contended throughput sweeps against baselines.
//!
//! Every subcommand prints a readable table, or with `--csv` one header line and one row per
//! configuration. Sweep options take comma lists (`-t 1,2,4,8`).

mod lock_regimes;
mod locks;
mod multirate;
mod pingpong;
mod report;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "weft-bench", about = "weft benchmark sweeps")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The Multirate benchmark (seed 003 §3.5, Appendix A).
    Multirate(multirate::Args),
    /// One-way latency on libfabric (shm, tcp) against fi_pingpong, in real processes.
    Pingpong(pingpong::Args),
    /// Lock acquisition throughput and latency versus threads, every protocol vs std/parking_lot.
    Locks(locks::Args),
    /// Seed 000 §3.4's latency- and throughput-oriented regimes, sweeping the progress-path lock.
    LockRegimes(lock_regimes::Args),
}

fn main() {
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Multirate(a) => multirate::run(&a),
        Cmd::Pingpong(a) => pingpong::run(&a),
        Cmd::LockRegimes(a) => lock_regimes::run(&a),
        Cmd::Locks(args) => {
            locks::run(&args);
            Ok(())
        }
    };
    if let Err(e) = res {
        eprintln!("weft-bench: {e}");
        std::process::exit(2);
    }
}
