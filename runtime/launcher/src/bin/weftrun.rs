//! `weftrun -n N [--provider shm|ofi-shm|tcp] prog args...`: starts a weft job of `N` processes on
//! this machine.
//!
//! * Serves the job's key-value exchange on 127.0.0.1 (an ephemeral port) with a random
//!   token, and gives every process `WEFT_RANK`, `WEFT_SIZE`, `WEFT_KVS`, `WEFT_TOKEN` and
//!   `WEFT_PROVIDER`; `FI_TCP_IFACE`/`FI_SOCKETS_IFACE` default to `lo`.
//! * Forwards each process's stdout and stderr line by line, prefixed with `[rank] `.
//! * When a rank dies (non-zero exit or a signal), the others learn it at once through the
//!   exchange's connections (their pending requests on it fail with `PeerLost`); they get
//!   `--grace` seconds to finish, then SIGTERM, then SIGKILL. A rank that exits with status
//!   0 without having finished normally (before joining the job, say) is reported lost the
//!   same way, but does not start the grace period. Ctrl-C / SIGTERM to weftrun
//!   tears every rank down the same way (no grace).
//! * If weftrun itself is killed (SIGKILL: it can do nothing then), every rank gets SIGTERM
//!   from the kernel (`PR_SET_PDEATHSIG`) — not SIGKILL, so that libfabric's `shm` provider
//!   can remove the rank's regions from `/dev/shm` on its way out — and a rank that outlives
//!   it notices through its exchange connection (`PeerEvent::ServerLost`): it removes those
//!   names itself and fails whatever waits for its peers with `PeerLost`.
//! * `shm` regions left in `/dev/shm` by processes that no longer run (ranks of a job whose
//!   weftrun was killed, say) are removed at start-up; those of its own ranks, at the end.
//!   A region of a running process is never touched.
//! * Exits with the worst status: the largest exit code, `128 + signal` for a rank killed
//!   by a signal, 130 when interrupted.
//! * `--bind-to core` pins rank `i` (every thread it starts) to the `i`-th CPU weftrun may
//!   run on, round robin (`mpirun --bind-to core`); the default `none` leaves placement to
//!   the kernel.
//! * Bad arguments (`-n 0`, `-n` above [`MAX_RANKS`], `--grace -1`, `--timeout inf`, an
//!   unknown provider) are reported with exit status 2 before any rank starts. A failure to
//!   start (a rank's program, or a thread to forward its output) stops the ranks already
//!   started and exits with 127 (the program) or 1 (anything else).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use weft_transport::bootstrap::{random_token, KvsServer};
use weft_transport::Provider;

/// Most ranks one `weftrun` starts. Every rank is a process on this machine, and weftrun
/// holds two pipes and two forwarding threads for each: a few thousand ranks would run into
/// the file and thread limits of a typical machine long before they ran, so a larger `-n`
/// is refused up front (it is most likely a typo).
const MAX_RANKS: u32 = 1024;

/// Start a weft job of N processes on this machine.
#[derive(Debug, Parser)]
#[command(name = "weftrun", version, trailing_var_arg = true)]
struct Args {
    /// Number of processes (ranks), 1 to 1024.
    #[arg(short = 'n', long = "np", value_parser = ranks)]
    n: u32,
    /// Provider: shm (one node), ofi-shm (libfabric's shm alone, without the same-host lane) or
    /// tcp (tcp;ofi_rxm).
    #[arg(long, default_value = "shm")]
    provider: String,
    /// Seconds the other ranks get to finish after one died, before they are killed (a
    /// finite number >= 0).
    #[arg(long, default_value = "5", value_parser = seconds)]
    grace: Duration,
    /// Kill the whole job after this many seconds (a finite number >= 0; 0 = no limit).
    #[arg(long, default_value = "0", value_parser = seconds)]
    timeout: Duration,
    /// Binding of ranks to CPUs: none (the kernel places them), or core (rank i on the i-th
    /// CPU weftrun may use, round robin).
    #[arg(long = "bind-to", value_enum, default_value_t = Bind::None)]
    bind_to: Bind,
    /// The program and its arguments.
    #[arg(required = true, num_args = 1.., allow_hyphen_values = true)]
    command: Vec<String>,
}

/// Parses `-n`: a whole number of ranks in `1..=MAX_RANKS`.
fn ranks(s: &str) -> Result<u32, String> {
    let n: u64 = s.trim().parse().map_err(|_| "not a whole number of ranks".to_string())?;
    match n {
        0 => Err("a job needs at least 1 rank".to_string()),
        n if n > u64::from(MAX_RANKS) => Err(format!("more ranks than weftrun starts on one machine (at most {MAX_RANKS})")),
        n => Ok(n as u32),
    }
}

/// Parses a number of seconds (`--grace`, `--timeout`): finite, not negative, and within
/// what a `Duration` holds. `inf`, `NaN`, `-1` and `1e30` are refused here rather than
/// turning into a panic once the ranks run.
fn seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s.trim().parse().map_err(|_| "not a number of seconds".to_string())?;
    if v.is_nan() || v < 0.0 {
        return Err("the number of seconds must be 0 or more".to_string());
    }
    Duration::try_from_secs_f64(v).map_err(|_| "too many seconds (at most about 1.8e19)".to_string())
}

/// Where ranks run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Bind {
    /// Wherever the kernel puts them.
    None,
    /// Rank `i` on one CPU: the `i`-th (round robin) of those weftrun may run on.
    Core,
}

/// The first SIGINT/SIGTERM received (0 = none).
static SIGNALLED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    SIGNALLED.store(sig, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` is an `extern "C" fn(c_int)` that only stores to an atomic,
        // which is async-signal-safe; `signal` replaces the disposition of a valid signal.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Forwards `from` to our stdout/stderr, one `[rank] `-prefixed line at a time, on a thread
/// of its own; `Err` if that thread cannot be started (out of threads or memory).
fn forward(rank: u32, from: impl Read + Send + 'static, to_stderr: bool) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name(format!("weftrun-fwd-{rank}")).spawn(move || {
        let mut r = BufReader::new(from);
        let mut line = Vec::with_capacity(256);
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    let prefix = format!("[{rank}] ");
                    if to_stderr {
                        let mut e = std::io::stderr().lock();
                        let _ = e.write_all(prefix.as_bytes()).and_then(|_| e.write_all(&line));
                    } else {
                        let mut o = std::io::stdout().lock();
                        let _ = o.write_all(prefix.as_bytes()).and_then(|_| o.write_all(&line)).and_then(|_| o.flush());
                    }
                }
            }
        }
    })
}

/// Exit code weftrun reports for one rank's status.
fn code_of(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

fn signal_all(children: &mut [(u32, Child, Option<ExitStatus>)], sig: libc::c_int) {
    for (_, c, st) in children.iter_mut() {
        if st.is_none() {
            // SAFETY: `kill` with the pid of a child we have not reaped yet (so the pid
            // cannot have been reused) and a valid signal number.
            unsafe { libc::kill(c.id() as libc::pid_t, sig) };
        }
    }
}

/// Stops a job that could not be started completely: kills and reaps the ranks started so
/// far, waits for their output to be forwarded, and cleans up after them.
fn abandon_start(children: &mut [(u32, Child, Option<ExitStatus>)], forwarders: Vec<std::thread::JoinHandle<()>>) {
    signal_all(children, libc::SIGKILL);
    for (_, c, _) in children.iter_mut() {
        let _ = c.wait();
    }
    for f in forwarders {
        let _ = f.join();
    }
    remove_stale_shm(children);
}

/// Before any rank starts: removes the `shm` regions of processes that no longer run (a
/// job whose `weftrun` was killed before it could clean up, ranks killed since); a region
/// of a running process is never touched. Returns how many were removed.
fn remove_dead_shm() -> usize {
    #[cfg(feature = "ofi")]
    return weft_transport::ofi_provider::remove_dead_shm_regions();
    #[cfg(not(feature = "ofi"))]
    0
}

/// Every rank has exited: `shm` regions still named after one of them belong to a rank that
/// could not unlink them (killed); a later process with the same pid would fail to open its
/// own.
fn remove_stale_shm(children: &[(u32, Child, Option<ExitStatus>)]) {
    #[cfg(feature = "ofi")]
    for (_, c, _) in children {
        weft_transport::ofi_provider::remove_stale_shm_regions(c.id());
    }
    #[cfg(not(feature = "ofi"))]
    let _ = children;
}

fn main() {
    let args = Args::parse();
    std::process::exit(run(&args));
}

fn run(args: &Args) -> i32 {
    let provider: Provider = match args.provider.parse() {
        Ok(p) if p != Provider::Embedded => p,
        Ok(_) => {
            eprintln!("weftrun: the embedded provider cannot span processes; use --provider shm or tcp");
            return 2;
        }
        Err(e) => {
            eprintln!("weftrun: {e}");
            return 2;
        }
    };
    let token = match random_token() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("weftrun: {e}");
            return 1;
        }
    };
    let server = match KvsServer::bind("127.0.0.1:0", args.n, &token) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("weftrun: cannot serve the key-value exchange: {e}");
            return 1;
        }
    };
    install_signal_handlers();
    remove_dead_shm();
    let kvs = server.local_addr().to_string();
    let cpus = if args.bind_to == Bind::Core { weft::lock::allowed_cpus() } else { Vec::new() };
    if args.bind_to == Bind::Core && cpus.is_empty() {
        eprintln!("weftrun: --bind-to core: cannot read this process's CPU affinity");
        return 2;
    }
    let mut children: Vec<(u32, Child, Option<ExitStatus>)> = Vec::new();
    let mut forwarders = Vec::new();
    for rank in 0..args.n {
        let mut cmd = Command::new(&args.command[0]);
        cmd.args(&args.command[1..])
            .env("WEFT_RANK", rank.to_string())
            .env("WEFT_SIZE", args.n.to_string())
            .env("WEFT_KVS", &kvs)
            .env("WEFT_TOKEN", &token)
            .env("WEFT_PROVIDER", provider.to_string())
            .env_remove("SLURM_PROCID")
            .stdin(if rank == 0 { Stdio::inherit() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for var in ["FI_TCP_IFACE", "FI_SOCKETS_IFACE"] {
            if std::env::var_os(var).is_none() {
                cmd.env(var, "lo");
            }
        }
        // SAFETY: the closure runs in the child between fork and exec and only calls `prctl`,
        // an async-signal-safe system call: the rank is terminated if weftrun dies. SIGTERM,
        // which libfabric's `shm` provider handles by removing the process's regions from
        // `/dev/shm` before it terminates (SIGKILL would leave them behind, see the module
        // docs).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            })
        };
        if !cpus.is_empty() {
            // The rank (with every thread it starts) runs on its CPU.
            weft::lock::bind_to_cpu(&mut cmd, cpus[rank as usize % cpus.len()]);
        }
        match cmd.spawn() {
            Ok(mut child) => {
                let (out, err) = (child.stdout.take(), child.stderr.take());
                children.push((rank, child, None));
                let started = out.map(|o| forward(rank, o, false)).into_iter().chain(err.map(|e| forward(rank, e, true)));
                for f in started {
                    match f {
                        Ok(f) => forwarders.push(f),
                        Err(e) => {
                            eprintln!("weftrun: cannot start a thread to forward the output of rank {rank}: {e}; stopping every rank");
                            abandon_start(&mut children, forwarders);
                            return 1;
                        }
                    }
                }
            }
            Err(e) => {
                eprintln!("weftrun: cannot start {:?}: {e}", args.command[0]);
                abandon_start(&mut children, forwarders);
                return 127;
            }
        }
    }

    let started = Instant::now();
    let mut failed_at: Option<Instant> = None;
    let mut term_sent: Option<Instant> = None;
    let mut worst = 0;
    let grace = args.grace;
    loop {
        let mut running = 0;
        for (rank, c, st) in children.iter_mut() {
            if st.is_some() {
                continue;
            }
            match c.try_wait() {
                Ok(Some(s)) => {
                    *st = Some(s);
                    let code = code_of(s);
                    if code != 0 {
                        if term_sent.is_none() {
                            eprintln!("weftrun: rank {rank} exited with status {code}");
                            failed_at.get_or_insert_with(Instant::now);
                        }
                        server.report_lost(*rank);
                    } else if server.report_exited(*rank) && term_sent.is_none() {
                        // Status 0 without joining the job (or without `BYE`): the others
                        // learn at once that it will never publish, instead of waiting out
                        // the exchange's timeout.
                        eprintln!("weftrun: rank {rank} exited with status 0 without finishing its part of the job");
                    }
                    if term_sent.is_none() {
                        worst = worst.max(code);
                    }
                }
                Ok(None) => running += 1,
                Err(_) => {
                    *st = Some(ExitStatus::from_raw(1 << 8));
                    worst = worst.max(1);
                }
            }
        }
        if running == 0 {
            break;
        }
        let sig = SIGNALLED.load(Ordering::SeqCst);
        let timed_out = !args.timeout.is_zero() && started.elapsed() > args.timeout;
        let grace_over = failed_at.is_some_and(|t| t.elapsed() > grace);
        if term_sent.is_none() && (sig != 0 || timed_out || grace_over) {
            if sig != 0 {
                eprintln!("weftrun: interrupted; stopping every rank");
                worst = worst.max(130);
            } else if timed_out {
                eprintln!("weftrun: time limit of {} s reached; stopping every rank", args.timeout.as_secs_f64());
                worst = worst.max(124);
            } else {
                eprintln!("weftrun: stopping the remaining ranks");
            }
            signal_all(&mut children, libc::SIGTERM);
            term_sent = Some(Instant::now());
        }
        if term_sent.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
            signal_all(&mut children, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    for f in forwarders {
        let _ = f.join();
    }
    remove_stale_shm(&children);
    worst
}

#[cfg(all(test, feature = "ofi"))]
mod tests {
    use std::path::Path;
    use std::time::{Duration, Instant};

    /// The start-up cleanup removes `shm` regions named after processes that no longer run
    /// (gone, or a zombie) and leaves those of running processes and files of other shapes.
    #[test]
    fn start_up_cleanup_removes_only_regions_of_processes_that_no_longer_run() {
        if !Path::new("/dev/shm").is_dir() {
            eprintln!("skipped: no /dev/shm");
            return;
        }
        // SAFETY: `geteuid` has no preconditions.
        let uid = unsafe { libc::geteuid() };
        // A zombie: exited, not reaped yet (its pid cannot be reused meanwhile).
        let mut zombie = std::process::Command::new("true").spawn().expect("start `true`");
        let zpid = zombie.id();
        let t0 = Instant::now();
        while !std::fs::read_to_string(format!("/proc/{zpid}/stat"))
            .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')))
        {
            assert!(t0.elapsed() < Duration::from_secs(10), "`true` did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A pid above any real one (Linux pid_max is at most 2^22).
        let dead = [format!("/dev/shm/4999998:{uid}:7"), format!("/dev/shm/{zpid}:{uid}:0")];
        let alive = [format!("/dev/shm/{}:{uid}:4242", std::process::id()), format!("/dev/shm/1:{uid}:4242")];
        let other = [format!("/dev/shm/4999998:{uid}:x"), "/dev/shm/4999998".to_string()];
        for f in dead.iter().chain(&alive).chain(&other) {
            std::fs::write(f, b"").unwrap();
        }
        assert!(super::remove_dead_shm() >= dead.len());
        let _ = zombie.wait();
        for f in &dead {
            assert!(!Path::new(f).exists(), "{f} left behind");
        }
        for f in alive.iter().chain(&other) {
            assert!(Path::new(f).exists(), "{f} removed");
            std::fs::remove_file(f).unwrap();
        }
    }
}
