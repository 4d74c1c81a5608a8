//! `weft-bench msgcost`: the CPU cost of one message through the whole path, both sides,
//! with no waiting in it. One thread drives two ranks of an embedded fabric: rank 1 posts
//! `w` receives, rank 0 sends `w` messages, rank 1 waits for them (every frame is already
//! in its inbox, so the wait only progresses and matches). Wall time per message is then
//! the sender's plus the receiver's CPU time per message — an upper bound on what one core
//! can sustain, independent of scheduling (the multirate benchmark measures that part).
//!
//! `--provider shm|tcp` runs the two ranks on libfabric in the same way (one process): with
//! `-w 1` that is one hop of a ping-pong with both sides' CPU time and no waiting, to set
//! against the transport layer alone (`transport/tests/ofi_pingpong.rs`).
//!
//! `--late-receives` turns the round around: rank 0 sends the window first, rank 1
//! progresses until every frame is in (each queued as unexpected), then posts its receives,
//! each finding its frame queued, and waits: the unexpected path of matching.
//!
//! Columns: `progress,size,window,ns_per_message` (median of `--runs`).

use std::time::Instant;

use weft::{Communicator, ProgressMode, Request, Runtime, Source, Tag};

use crate::report::{median, parse_list, Output, Table};

/// Options of `weft-bench msgcost`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Progress modes: global, owner, concurrent.
    #[arg(long, default_value = "global,owner,concurrent")]
    progress: String,
    /// Message sizes in bytes.
    #[arg(short = 's', long, default_value = "0")]
    size: String,
    /// Messages per round (receives posted before the sends).
    #[arg(short = 'w', long, default_value_t = 128)]
    window: usize,
    /// Rounds per run.
    #[arg(short = 'i', long, default_value_t = 20_000)]
    iterations: usize,
    /// Runs (the median is reported).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// Provider of the two in-process ranks: embedded, or shm / tcp (feature `ofi`).
    #[arg(long, default_value = "embedded")]
    provider: weft::Provider,
    /// On shm / tcp: every frame through libfabric, none through the same-host lane
    /// (`Builder::same_host_lane(false)`).
    #[arg(long)]
    no_same_host_lane: bool,
    /// Sends first, receives posted once every frame has arrived (each queued as
    /// unexpected, then found by its receive).
    #[arg(long)]
    late_receives: bool,
    /// Calls `isend` and `irecv` through functions of their own, which the library inlines
    /// into its callers otherwise: for `benches/stages.sh`, which counts each stage as a
    /// function's inclusive cost.
    #[arg(long, hide = true, conflicts_with = "into")]
    outlined: bool,
    /// Puts the requests into their vectors with `isend_into` and `irecv_into` (written in
    /// place, as multirate does) instead of `push(isend(..))`.
    #[arg(long)]
    into: bool,
    #[command(flatten)]
    out: Output,
}

/// Runs the measurement.
pub fn run(a: &Args) -> Result<(), String> {
    let modes: Vec<ProgressMode> = a.progress.split(',').map(|s| s.parse().map_err(|e| format!("{e}"))).collect::<Result<_, _>>()?;
    let sizes: Vec<usize> = parse_list(&a.size)?;
    if a.window == 0 || a.iterations == 0 || a.runs == 0 {
        return Err("window, iterations and runs must be positive".into());
    }
    let mut table = Table::new(&["progress", "size", "window", "ns_per_message"], &a.out);
    a.out.note(&format!(
        "# weft-bench msgcost: one thread drives both ranks; provider={} same_host_lane={} late_receives={} iterations={} runs={} (median)",
        a.provider, !a.no_same_host_lane, a.late_receives, a.iterations, a.runs
    ));
    table.progress(modes.len() * sizes.len() * a.runs);
    table.print_header();
    for &mode in &modes {
        for &size in &sizes {
            // The inbox holds a whole window: one thread drives both ranks and waits on one at a
            // time, so frames beyond it would wait for progress of the other rank.
            let rts = Runtime::builder()
                .env(false)
                .provider(a.provider)
                .same_host_lane(!a.no_same_host_lane)
                .progress(mode)
                .inbox_capacity(a.window.max(1024))
                .build_local(2)
                .map_err(|e| e.to_string())?;
            // A first run warms the request pools, buffers and inboxes; it is not counted.
            let rounds = match (a.outlined, a.into) {
                (true, _) => rounds::<OUTLINED>,
                (false, true) => rounds::<INTO>,
                (false, false) => rounds::<PUSHED>,
            };
            rounds(&rts, size, a.window, a.iterations / 10 + 1, a.late_receives)?;
            let mut ns = Vec::with_capacity(a.runs);
            for run in 0..a.runs {
                table.step(|| format!("{mode}, {size} B, run {}", run + 1));
                let t0 = Instant::now();
                rounds(&rts, size, a.window, a.iterations, a.late_receives)?;
                ns.push(t0.elapsed().as_nanos() as f64 / (a.iterations * a.window) as f64);
            }
            table.row(vec![mode.to_string(), size.to_string(), a.window.to_string(), format!("{:.1}", median(&ns))]);
        }
    }
    table.finish();
    Ok(())
}

/// How the loop makes its requests: `push(isend(..))`, ...
const PUSHED: u8 = 0;
/// ... the same through [`isend_call`] and [`irecv_call`] (`--outlined`), ...
const OUTLINED: u8 = 1;
/// ... or `isend_into` and `irecv_into` (`--into`).
const INTO: u8 = 2;

/// `n` rounds of `w` messages of `size` bytes from rank 0 to rank 1, checked; with `late`,
/// the receives posted after every frame has arrived; `HOW`: how the requests are made.
fn rounds<const HOW: u8>(rts: &[Runtime], size: usize, w: usize, n: usize, late: bool) -> Result<(), String> {
    let e = |e: weft::Error| e.to_string();
    let (a, b) = (rts[0].world(), rts[1].world());
    let mut rbufs: Vec<Vec<u8>> = (0..w).map(|_| Vec::with_capacity(size)).collect();
    let mut sbufs: Vec<Vec<u8>> = (0..w).map(|_| vec![5u8; size]).collect();
    let mut recvs = Vec::with_capacity(w);
    let mut sends = Vec::with_capacity(w);
    for _ in 0..n {
        if late {
            for buf in sbufs.drain(..) {
                send::<HOW>(a, &mut sends, buf).map_err(e)?;
            }
            weft::wait_all(&mut sends).map_err(e)?;
            // Every frame is in rank 1's inbox: a pass at most per frame queues them all.
            for _ in 0..=w {
                if !rts[1].progress() {
                    break;
                }
            }
        }
        for buf in rbufs.drain(..) {
            match HOW {
                OUTLINED => recvs.push(irecv_call(b, buf).map_err(e)?),
                INTO => b.irecv_into(&mut recvs, buf, Source::Rank(0), Tag::Is(1)).map_err(e)?,
                _ => recvs.push(b.irecv(buf, Source::Rank(0), Tag::Is(1)).map_err(e)?),
            }
        }
        for buf in sbufs.drain(..) {
            send::<HOW>(a, &mut sends, buf).map_err(e)?;
        }
        if !late {
            weft::wait_all(&mut sends).map_err(e)?;
        }
        weft::wait_all(&mut recvs).map_err(e)?;
        for r in recvs.iter_mut() {
            let (buf, st) = r.take().ok_or("receive not complete after wait_all")?.map_err(e)?;
            if st.bytes != size {
                return Err(format!("received {} bytes, expected {size}", st.bytes));
            }
            rbufs.push(buf);
        }
        for r in sends.iter_mut() {
            sbufs.push(r.take().ok_or("send not complete after wait_all")?.map_err(e)?.0);
        }
        if rbufs.len() != w || sbufs.len() != w {
            return Err(format!("{} receives and {} sends came back of {w} each", rbufs.len(), sbufs.len()));
        }
        recvs.clear();
        sends.clear();
    }
    Ok(())
}

/// One send of the measured loop to rank 1 with tag 1, its request made as `HOW` says.
#[inline(always)]
fn send<'c, const HOW: u8>(a: &'c Communicator, sends: &mut Vec<Request<'c, Vec<u8>>>, buf: Vec<u8>) -> Result<(), weft::Error> {
    match HOW {
        OUTLINED => sends.push(isend_call(a, buf)?),
        INTO => a.isend_into(sends, buf, 1, 1)?,
        _ => sends.push(a.isend(buf, 1, 1)?),
    }
    Ok(())
}

/// `isend` of the measured loop, as a function of its own (`--outlined`).
#[inline(never)]
fn isend_call(c: &Communicator, buf: Vec<u8>) -> Result<Request<'_, Vec<u8>>, weft::Error> {
    c.isend(buf, 1, 1)
}

/// `irecv` of the measured loop, as a function of its own (`--outlined`).
#[inline(never)]
fn irecv_call(c: &Communicator, buf: Vec<u8>) -> Result<Request<'_, Vec<u8>>, weft::Error> {
    c.irecv(buf, Source::Rank(0), Tag::Is(1))
}
