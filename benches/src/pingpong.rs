//! `weft-bench pingpong`: one-way small-message latency of weft on libfabric, in real
//! processes (`weftrun -n 2`), against `fi_pingpong -e rdm -m tagged` (package
//! `libfabric-bin`) on the same provider, measured alternately in the same run; both on
//! 127.0.0.1 (`FI_TCP_IFACE=lo`).
//!
//! weft's number is (round-trip time) / 2 over `-i` round trips after 1000 warm-up ones,
//! blocking `send`/`recv` with reused buffers, one thread per rank; `fi_pingpong`'s is its
//! `usec/xfer` column, which is the same one-way time. Medians over `--runs`; `ratio` is
//! the ratio of the two medians, `pair_ratio` the median of each run's own ratio (weft and
//! `fi_pingpong` measured back to back, so a slow phase of the machine, which slows both,
//! cancels out).
//!
//! `transport_us` is the same ping-pong one layer down, through `weft-transport`'s
//! libfabric ranks alone (`Rank::send`, `Rank::poll`: frames with weft's wire header, no
//! matching, requests or progress engine), also in `weftrun -n 2` processes: it splits
//! weft's distance from `fi_pingpong` into what the transport layer adds and what the
//! runtime adds.
//!
//! `--bind core` pins both sides the same way: weft's ranks by `weftrun --bind-to core`,
//! `fi_pingpong`'s server and client to the first and second CPU this process may use.
//! Unpinned (the default), two busy-polling processes on a 2-vCPU VM sometimes share a CPU
//! for a whole run, which makes single runs of either side 2-4x slow; pinned, `fi_pingpong`
//! is steadier, weft about as fast as unpinned (docs/BENCHMARKS.md).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args as ClapArgs;
use weft::{Provider, Runtime};

use crate::plot::Chart;
use crate::report::{median, parse_list, Output, PlotTo, Table};

/// Options of `weft-bench pingpong`.
#[derive(Debug, ClapArgs)]
pub struct Args {
    /// Providers: shm, tcp.
    #[arg(long, default_value = "shm,tcp")]
    provider: String,
    /// Message sizes in bytes.
    #[arg(short = 's', long = "size", default_value = "8")]
    size: String,
    /// Round trips per run.
    #[arg(short = 'i', long = "iterations", default_value_t = 20_000)]
    iterations: usize,
    /// Runs per configuration (alternating weft and fi_pingpong); the median is reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[command(flatten)]
    out: Output,
    #[command(flatten)]
    plot: PlotTo,
    /// Binding of both sides' processes: none, or core (one CPU each).
    #[arg(long, default_value = "none", value_parser = ["none", "core"])]
    bind: String,
    /// Every frame through libfabric, none through the same-host lane (both sides;
    /// `Builder::same_host_lane(false)`), for comparison.
    #[arg(long)]
    no_same_host_lane: bool,
    /// Internal: one rank of the weft side.
    #[arg(long, hide = true)]
    rank_worker: bool,
    /// Internal: one rank of the transport-layer side.
    #[arg(long, hide = true)]
    transport_worker: bool,
}

/// Runs the comparison.
pub fn run(a: &Args) -> Result<(), String> {
    let providers: Vec<Provider> = a.provider.split(',').map(|p| p.parse().map_err(|e| format!("{e}"))).collect::<Result<_, _>>()?;
    let sizes: Vec<usize> = parse_list(&a.size)?;
    if a.iterations == 0 || a.runs == 0 || providers.contains(&Provider::Embedded) {
        return Err("iterations and runs must be positive; providers are shm and tcp".into());
    }
    if a.rank_worker {
        return worker(providers[0], sizes[0], a.iterations, !a.no_same_host_lane);
    }
    if a.transport_worker {
        return transport_worker(providers[0], sizes[0], a.iterations, !a.no_same_host_lane);
    }
    let bind = a.bind == "core";
    let mut table = Table::new(&["provider", "size", "bind", "weft_us", "fi_pingpong_us", "ratio", "pair_ratio", "transport_us"], &a.out);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    a.out.note(&format!(
        "# weft-bench pingpong: one-way latency, iterations={} runs={} (median) cores={cores} bind={}",
        a.iterations, a.runs, a.bind
    ));
    table.progress(providers.len() * sizes.len() * a.runs);
    table.print_header();
    for &p in &providers {
        for &size in &sizes {
            let (mut weft, mut fi, mut transport) = (Vec::new(), Vec::new(), Vec::new());
            for run in 0..a.runs {
                table.step(|| format!("{p}, {size} B, run {}", run + 1));
                weft.push(weftrun_latency(Side::Runtime, p, size, a.iterations, bind, !a.no_same_host_lane)?);
                fi.push(fi_pingpong(p, size, a.iterations, run, bind)?);
                transport.push(weftrun_latency(Side::Transport, p, size, a.iterations, bind, !a.no_same_host_lane)?);
            }
            let (w, f) = (median(&weft), median(&fi));
            // Each run's two numbers were taken back to back: their ratio cancels the
            // machine's slow phases (a noisy VM slows both sides for seconds at a time),
            // which the ratio of the two medians does not when the phases fall unevenly.
            let pairs: Vec<f64> = weft.iter().zip(&fi).map(|(w, f)| w / f).collect();
            table.row(vec![
                p.to_string(),
                size.to_string(),
                a.bind.clone(),
                format!("{w:.2}"),
                format!("{f:.2}"),
                format!("{:.2}", w / f),
                format!("{:.2}", median(&pairs)),
                format!("{:.2}", median(&transport)),
            ]);
        }
    }
    let chart =
        Chart::new(format!("pingpong: one-way latency, 2 processes, bind {}, {cores} cores", a.bind), "size", "message size (bytes)")
            .y("weft_us", "weft")
            .y("fi_pingpong_us", "fi_pingpong")
            .y("transport_us", "weft-transport alone")
            .y_axis("one-way latency (µs)", 1.0)
            .panels("provider", "provider {}")
            .log_x();
    table.finish_with_plot(&chart, &a.plot)
}

/// Which layer a `weftrun` ping-pong measures.
#[derive(Clone, Copy)]
enum Side {
    /// The runtime: `Communicator::send` / `recv`.
    Runtime,
    /// `weft-transport`'s libfabric ranks alone.
    Transport,
}

fn weftrun_latency(side: Side, p: Provider, size: usize, iterations: usize, bind: bool, lane: bool) -> Result<f64, String> {
    let (exe, weftrun) = crate::report::self_and_weftrun()?;
    let out = Command::new(&weftrun)
        .args(["-n", "2", "--provider", &p.to_string(), "--timeout", "300", "--bind-to", if bind { "core" } else { "none" }])
        .arg(&exe)
        .args([
            "pingpong",
            match side {
                Side::Runtime => "--rank-worker",
                Side::Transport => "--transport-worker",
            },
        ])
        .args(["--provider", &p.to_string(), "-s", &size.to_string(), "-i", &iterations.to_string()])
        .args(if lane { &[][..] } else { &["--no-same-host-lane"][..] })
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("weftrun: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("pingpong ranks failed ({}):\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr)));
    }
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("[0] LATENCY_US ").and_then(|v| v.trim().parse().ok()))
        .ok_or_else(|| format!("no latency in:\n{stdout}"))
}

/// One rank of the weft side.
fn worker(p: Provider, size: usize, iterations: usize, lane: bool) -> Result<(), String> {
    let e = |e: weft::Error| e.to_string();
    let rt = Runtime::builder().env(false).provider(p).cris(1).same_host_lane(lane).build().map_err(e)?;
    if rt.size() != 2 {
        return Err("pingpong needs 2 ranks".into());
    }
    let c = rt.world();
    let me = rt.rank();
    let other = 1 - me;
    // Rank 0 sends with tag 1 and receives tag 2; rank 1 the other way round.
    let (out_tag, in_tag) = if me == 0 { (1, 2) } else { (2, 1) };
    let mut sbuf = vec![1u8; size];
    let mut rbuf = Vec::<u8>::with_capacity(size);
    hops(
        me,
        iterations,
        || {
            sbuf = c.send(std::mem::take(&mut sbuf), other, out_tag).map_err(e)?.0;
            Ok(())
        },
        || {
            rbuf = c.recv(std::mem::take(&mut rbuf), other, in_tag).map_err(e)?.0;
            Ok(())
        },
    )
}

/// The ping-pong loop of both sides: 1000 warm-up round trips, then `iterations` timed
/// ones; rank 0 starts each and prints the one-way time (`LATENCY_US`).
fn hops(
    me: u32,
    iterations: usize,
    mut send: impl FnMut() -> Result<(), String>,
    mut recv: impl FnMut() -> Result<(), String>,
) -> Result<(), String> {
    let warmup = 1000;
    let mut t0 = Instant::now();
    for i in 0..warmup + iterations {
        if i == warmup {
            t0 = Instant::now();
        }
        if me == 0 {
            send()?;
            recv()?;
        } else {
            recv()?;
            send()?;
        }
    }
    let el = t0.elapsed();
    if me == 0 {
        println!("LATENCY_US {}", el.as_secs_f64() * 1e6 / (2.0 * iterations as f64));
    }
    Ok(())
}

/// One rank of the transport-layer side: the ping-pong loop of [`worker`] on a
/// `weft-transport` libfabric rank (one CRI, default options), with the frames weft's eager
/// path sends (an `Eager` header, the payload behind it). Every frame's length and first
/// byte are checked.
#[cfg(feature = "ofi")]
fn transport_worker(p: Provider, size: usize, iterations: usize, lane: bool) -> Result<(), String> {
    use weft_transport::bootstrap::Job;
    use weft_transport::ofi_provider::{join, OfiOptions};
    use weft_transport::SendError;

    let e = |e: weft::Error| e.to_string();
    let job = Job::from_env().map_err(e)?;
    if job.size != 2 {
        return Err("pingpong needs 2 ranks".into());
    }
    let opts = OfiOptions {
        provider: p.ofi_name().ok_or("the transport side needs shm or tcp")?.to_string(),
        same_host_lane: lane,
        ..OfiOptions::default()
    };
    let rank = join(&opts, job).map_err(e)?;
    let me = rank.rank();
    if size > rank.eager_capacity() {
        return Err(format!("the transport side sends single frames: at most {} bytes", rank.eager_capacity()));
    }
    let other = 1 - me;
    let data = vec![me as u8 + 1; size];
    let header = eager_header(me, 1, size);
    // Bounded: a lost peer or a stuck provider ends the run with an error, not a hang.
    let deadline = Instant::now() + Duration::from_secs(120);
    let send = || loop {
        match rank.send(other, 0, &header, &data) {
            Ok(()) => return Ok(()),
            Err(SendError::WouldBlock) if Instant::now() < deadline => {}
            Err(err) => return Err(format!("transport send: {err:?}")),
        }
    };
    let recv = || loop {
        let mut got = None;
        rank.poll(0, 1, |f| got = Some(f));
        if let Some(f) = got {
            let ok = f.header.source == other
                && f.payload.as_slice().len() == size
                && f.payload.as_slice().first().is_none_or(|&b| b == other as u8 + 1);
            rank.recycle(f.payload);
            return if ok { Ok(()) } else { Err("transport ping-pong: unexpected frame".to_string()) };
        }
        if Instant::now() > deadline {
            return Err("transport ping-pong: no frame for 120 s".to_string());
        }
    };
    let r = hops(me, iterations, send, recv);
    rank.close();
    r
}

/// The header weft's eager path puts in front of `len` bytes from `source` with `tag`
/// (context 1, no sequence): what the transport-layer benchmarks send.
#[cfg(feature = "ofi")]
pub(crate) fn eager_header(source: u32, tag: i32, len: usize) -> weft_transport::Header {
    weft_transport::Header::eager(1, source, tag, 0, len)
}

#[cfg(not(feature = "ofi"))]
fn transport_worker(_p: Provider, _size: usize, _iterations: usize, _lane: bool) -> Result<(), String> {
    Err("the transport-layer ping-pong needs the ofi feature".into())
}

/// `fi_pingpong` server + client on 127.0.0.1; the client's `usec/xfer`. The client is
/// retried (new port, longer head start) when it finds no server yet (a loaded machine).
fn fi_pingpong(p: Provider, size: usize, iterations: usize, run: usize, bind: bool) -> Result<f64, String> {
    let mut last = String::new();
    for attempt in 0..4 {
        match fi_pingpong_once(p, size, iterations, run * 4 + attempt, Duration::from_millis(300 << attempt), bind) {
            Ok(v) => return Ok(v),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn fi_pingpong_once(p: Provider, size: usize, iterations: usize, salt: usize, head_start: Duration, bind: bool) -> Result<f64, String> {
    let cpus = if bind { weft::lock::allowed_cpus() } else { Vec::new() };
    let prov = p.ofi_name().unwrap_or("shm");
    let port = (40_000 + (std::process::id() as usize % 10_000) + salt * 7 + size % 5).to_string();
    let common = ["-e", "rdm", "-m", "tagged", "-p", prov, "-I", &iterations.to_string(), "-S", &size.to_string()];
    let mut server = Command::new("timeout");
    server
        .args(["120", "fi_pingpong"])
        .args(common)
        .args(["-B", &port])
        .env("FI_TCP_IFACE", "lo")
        .env("FI_SOCKETS_IFACE", "lo")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut client = Command::new("timeout");
    client
        .args(["120", "fi_pingpong"])
        .args(common)
        .args(["-P", &port, "127.0.0.1"])
        .env("FI_TCP_IFACE", "lo")
        .env("FI_SOCKETS_IFACE", "lo");
    if !cpus.is_empty() {
        weft::lock::bind_to_cpu(&mut server, cpus[0]);
        weft::lock::bind_to_cpu(&mut client, cpus[1 % cpus.len()]);
    }
    let mut server = server.spawn().map_err(|e| format!("fi_pingpong (package libfabric-bin): {e}"))?;
    std::thread::sleep(head_start);
    let client = client.output();
    let _ = server.kill();
    let _ = server.wait();
    let client = client.map_err(|e| format!("fi_pingpong: {e}"))?;
    let text = String::from_utf8_lossy(&client.stdout);
    // Header "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec", then one row.
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("bytes"))
        .nth(1)
        .and_then(|row| row.split_whitespace().nth(6))
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("could not read fi_pingpong's output:\n{text}{}", String::from_utf8_lossy(&client.stderr)))
}
