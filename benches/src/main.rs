//! `weft-bench`: contended throughput sweeps against baselines.
//!
//! Every subcommand prints a readable table, or with `--csv` one header line and one row per
//! configuration. Sweep options take comma lists (`-t 1,2,4,8`).

mod alltoall;
mod coll;
mod continuations;
mod ctxid;
mod dht;
mod dlock;
mod idle;
mod lock_regimes;
mod locks;
mod mpi_peer;
mod msgcost;
mod multirate;
mod neighbor;
mod pack;
mod partitioned;
mod pingpong;
mod plot;
mod report;
mod spawn;
mod startup;
mod sync_pingpong;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "weft-bench", about = "weft benchmark sweeps")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The Multirate benchmark ([Patinyasakdikul 2019, §3.5], Appendix A).
    // Boxed: its many options make it the one large variant.
    Multirate(Box<multirate::Args>),
    /// CPU cost of one message, both sides, one thread driving two ranks (no waiting).
    Msgcost(msgcost::Args),
    /// One-way latency on libfabric (shm, tcp) against fi_pingpong, in real processes.
    Pingpong(pingpong::Args),
    /// Lock acquisition throughput and latency versus threads, every protocol vs std/parking_lot.
    Locks(locks::Args),
    /// Executor overheads: spawn+join of empty tasks and a two-task yield ping-pong, weft vs tokio.
    Spawn(spawn::Args),
    /// CPU time used by an idle runtime with a started pool.
    Idle(idle::Args),
    /// Datatype packing bandwidth versus threads (parallel packing on the pool).
    Pack(pack::Args),
    /// Ping-pong whose receiver completes through a sync object vs testing every request.
    SyncPingpong(sync_pingpong::Args),
    /// All-to-all rounds (isend/irecv to every other rank) in real processes on shm and tcp.
    Alltoall(alltoall::Args),
    /// Collective latency per collective, ranks and size: embedded (threads) and shm/tcp (processes), Open MPI beside.
    Coll(coll::Args),
    /// Communicator creation from many threads per rank: eager vs base context id allocation ([Dinan 2012]).
    Ctxid(ctxid::Args),
    /// Job start-up at 2-64 ranks under weftrun and mpirun (PMIx), beside MPI_Init.
    Startup(startup::Args),
    /// [Amer 2019, §3.4]'s latency- and throughput-oriented regimes, sweeping the progress-path lock.
    LockRegimes(lock_regimes::Args),
    /// Distributed RMA locks under the seed's benchmarks ([Schmid 2016, §5.1]): LB, ECSB, SOB, WCSB, WARB.
    Dlock(dlock::Args),
    /// The seed's distributed hash table ([Schmid 2016, §5.3]) under RMA-RW, foMPI-RW and the spin lock.
    Dht(dht::Args),
    /// Completions of many receives in flight: continuations inline or on the pool, tasks awaiting requests, a sync object ([Schuchart 2021]).
    Continuations(continuations::Args),
    /// One message filled by many threads: partitioned send vs a send per thread vs one send after a join (MPI 4.0 ch. 4).
    Partitioned(partitioned::Args),
    /// Neighbor message rate ([Goodell 2010, §VI-B]): requests that borrow the communicator vs a reference count per message.
    Neighbor(neighbor::Args),
}

/// Set by `weftrun` in every rank's environment.
const UNDER_WEFTRUN: &str = "WEFT_KVS";

/// The hidden flags with which the benchmarks start their own ranks under weftrun.
const WORKER_FLAGS: [&str; 2] = ["--rank-worker", "--transport-worker"];

fn main() {
    // The benchmarks that run real jobs launch themselves through weftrun (with the hidden
    // `--rank-worker`): started under weftrun by hand, each rank would start a sweep of its
    // own jobs, nested in the outer one.
    if std::env::var_os(UNDER_WEFTRUN).is_some() && !std::env::args().any(|a| WORKER_FLAGS.contains(&a.as_str())) {
        eprintln!(
            "weft-bench: started under weftrun ({UNDER_WEFTRUN} is set): run weft-bench directly; it launches its own jobs \
             through weftrun where a benchmark needs several processes (--provider shm|tcp)"
        );
        std::process::exit(2);
    }
    let cli = Cli::parse();
    let res = match cli.cmd {
        Cmd::Multirate(a) => multirate::run(&a),
        Cmd::Msgcost(a) => msgcost::run(&a),
        Cmd::Spawn(a) => spawn::run(&a),
        Cmd::Idle(a) => idle::run(&a),
        Cmd::Pack(a) => pack::run(&a),
        Cmd::SyncPingpong(a) => sync_pingpong::run(&a),
        Cmd::Pingpong(a) => pingpong::run(&a),
        Cmd::LockRegimes(a) => lock_regimes::run(&a),
        Cmd::Alltoall(a) => alltoall::run(&a),
        Cmd::Locks(a) => locks::run(&a),
        Cmd::Ctxid(a) => ctxid::run(&a),
        Cmd::Startup(a) => startup::run(&a),
        Cmd::Dlock(a) => dlock::run(&a),
        Cmd::Dht(a) => dht::run(&a),
        Cmd::Coll(a) => coll::run(&a),
        Cmd::Continuations(a) => continuations::run(&a),
        Cmd::Partitioned(a) => partitioned::run(&a),
        Cmd::Neighbor(a) => neighbor::run(&a),
    };
    if let Err(e) = res {
        eprintln!("weft-bench: {e}");
        std::process::exit(2);
    }
}
