//! Bootstrap: how a process learns its rank, the job size and every peer's fabric addresses,
//! and how it learns that a peer died.
//!
//! # Environment
//!
//! | variables | who sets them | what happens |
//! |---|---|---|
//! | none | — | rank 0 of a job of size 1, no exchange |
//! | `WEFT_RANK`, `WEFT_SIZE`, `WEFT_KVS=host:port`, `WEFT_TOKEN` | `weftrun` | connect to the KVS `weftrun` serves |
//! | `PMIX_NAMESPACE`, `PMIX_RANK` (and the server's address) | `srun --mpi=pmix`, `mpirun` | feature `pmix`: join through the launcher's PMIx server |
//! | `SLURM_PROCID`, `SLURM_NTASKS`, `WEFT_KVS=host:port`, `WEFT_TOKEN` | `srun` + the user | rank 0 *serves* the KVS on `WEFT_KVS`, every rank (0 too) connects to it |
//!
//! They are read in the table's order: `weftrun`'s variables first, then PMIx's, then
//! Slurm's. Under a PMIx launcher (feature `pmix`) the rank is the process's PMIx rank, the
//! size the job's `PMIX_JOB_SIZE`, and the addresses are exchanged by a PMIx fence that
//! collects data (the same collective MPI libraries bootstrap from); `PMIx_Finalize` runs
//! when the rank's [`Monitor`] is dropped. A PMIx launcher without the feature is refused
//! with an error (the ranks would each run as a job of one), unless the Slurm variables
//! below make today's path usable.
//!
//! Under Slurm the user exports `WEFT_KVS` (an address of the node of task 0 that every node
//! can reach) and a random `WEFT_TOKEN` before `srun`, which passes both to every task.
//! weft launches nothing remotely itself.
//!
//! # Protocol (one line per message, over TCP)
//!
//! ```text
//! client -> server   HELLO <token> <rank>      refused (ERR ..., closed) on a wrong token
//! client -> server   PUT <hex blob>            this rank's fabric addresses
//! client -> server   GET                       answered once every rank has PUT:
//! server -> client   ALL <hex 0> ... <hex n-1>
//! server -> client   ERR rank <r> lost ...     instead, if a rank died before it PUT
//! server -> client   LOST <rank>               a rank's connection closed without BYE
//! client -> server   BYE                       this rank finishes normally
//! server -> client   FINISHED <rank>           a rank said BYE
//! ```
//!
//! # Lost and finished peers
//!
//! Every rank keeps its connection open for the whole run ([`Monitor`]). When a process
//! dies, the kernel closes its socket; the server sees EOF without a `BYE` and sends
//! `LOST <rank>` to every other rank, whose monitor marks the peer lost in the transport —
//! within milliseconds, with no heartbeat traffic. A rank that finishes normally says `BYE`
//! (after its last frames left), and the server sends `FINISHED <rank>` to the others: a
//! receive that only that rank could match will never match either, and the runtime fails
//! it once the frames the rank sent before finishing are delivered ([`PeerEvent`]). A rank lost once every rank has published
//! does not fail the exchange (the others still get `ALL`, then `LOST`); a server that is
//! dropped while it still owes a rank its `ALL` lingers, bounded, until that rank has it. (CQ errors on a send to the dead peer also
//! mark it lost, as a second path.)
//!
//! The connection itself ending while the rank is still in the job (its [`Monitor`] did not
//! close it) says that the server is gone. Under `weftrun` that means `weftrun` was killed:
//! the monitor reports [`PeerEvent::ServerLost`], and the rank acts as the job being over
//! (it cleans up what would otherwise outlive it, and fails what waits for its peers).
//! Under Slurm the server is rank 0's: its connections end normally after `FINISHED 0`, and
//! without it rank 0 died, which the monitor reports as `Lost(0)`.
//!
//! Under a PMIx launcher there is no connection of weft's own: the monitor registers a PMIx
//! event handler instead, which reports the same [`PeerEvent`]s from the launcher's
//! process-termination events and the end of the connection to its server (`crate::pmix`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::Error;

/// How long a client waits for the KVS (connecting, and for every rank to publish).
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a server that is dropped waits for ranks still owed the exchange's answer.
const LINGER: Duration = Duration::from_secs(10);

/// Longest line accepted (addresses of up to 65535 CRIs are far below this).
const MAX_LINE: usize = 1 << 24;

fn bootstrap_error(op: &'static str, e: &std::io::Error) -> Error {
    Error::Transport { op, code: e.raw_os_error().unwrap_or(0) }
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(HEX[(b >> 4) as usize] as char);
        s.push(HEX[(b & 15) as usize] as char);
    }
    s
}

/// Decodes [`to_hex`]; `None` if malformed.
pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if s.len() % 2 != 0 {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    s.chunks(2).map(|p| Some(nib(p[0])? << 4 | nib(p[1])?)).collect()
}

/// A random job token: 16 bytes of `/dev/urandom`, hex.
pub fn random_token() -> Result<String, Error> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).map_err(|e| bootstrap_error("read /dev/urandom", &e))?;
    Ok(to_hex(&b))
}

// ----------------------------------------------------------------------------------------
// Server

/// What a rank's [`Monitor`] learns of its peers and its job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PeerEvent {
    /// The peer's connection closed without `BYE`: it died (or exited without finishing).
    Lost(u32),
    /// The peer finished normally (`BYE`): it sends nothing more.
    Finished(u32),
    /// The key-value server, run by a launcher outside the job (`weftrun`), closed this
    /// rank's connection while the rank was still in the job: the launcher is gone (killed),
    /// its other ranks are being torn down, and nothing will report lost peers any more.
    ServerLost,
}

impl PeerEvent {
    /// The rank concerned (none for [`ServerLost`](Self::ServerLost)).
    pub fn rank(self) -> Option<u32> {
        match self {
            PeerEvent::Lost(r) | PeerEvent::Finished(r) => Some(r),
            PeerEvent::ServerLost => None,
        }
    }

    /// Parses a `LOST <rank>` or `FINISHED <rank>` line.
    fn parse(line: &str) -> Option<PeerEvent> {
        let (word, rank) = line.split_once(' ')?;
        let rank = rank.trim().parse().ok()?;
        match word {
            "LOST" => Some(PeerEvent::Lost(rank)),
            "FINISHED" => Some(PeerEvent::Finished(rank)),
            _ => None,
        }
    }
}

/// What the server knows of the job.
#[derive(Default)]
struct Table {
    /// Published blobs by rank.
    blobs: HashMap<u32, String>,
    /// A write handle on every connected rank (for `LOST` and `FINISHED`).
    conns: HashMap<u32, TcpStream>,
    /// Ranks whose connection closed without `BYE`.
    lost: Vec<u32>,
    /// Ranks that said `BYE`.
    finished: Vec<u32>,
    /// Ranks whose `GET` has been answered.
    answered: Vec<u32>,
}

impl Table {
    /// Whether a rank that published is still owed the answer to the exchange (it may not
    /// have asked yet): the server must not go away before it has it.
    fn owes_an_answer(&self) -> bool {
        self.blobs.keys().any(|r| !self.answered.contains(r) && !self.lost.contains(r) && !self.finished.contains(r))
    }
}

struct ServerState {
    size: u32,
    token: String,
    table: Mutex<Table>,
    /// Signalled on every publish and every loss.
    changed: Condvar,
    /// Set when the server is dropped.
    stop: AtomicBool,
    /// The rank of the process that runs the server (rank 0 under Slurm), if it is one of
    /// the job's: its `BYE` is the last thing it says before it drops the server.
    host: Option<u32>,
    /// Tests: how long a connection's thread waits before it handles a `BYE` (a thread the
    /// OS runs late).
    #[cfg(test)]
    bye_delay: std::sync::Mutex<Duration>,
}

/// The key-value server of one job (run by `weftrun`, or by rank 0 under Slurm).
#[derive(Debug)]
pub struct KvsServer {
    addr: SocketAddr,
    state: Arc<ServerState>,
    accept: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ServerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerState").field("size", &self.size).finish_non_exhaustive()
    }
}

impl KvsServer {
    /// Serves a job of `size` ranks on `addr` (e.g. `127.0.0.1:0`), accepting only clients
    /// that present `token`.
    pub fn bind(addr: &str, size: u32, token: &str) -> Result<Self, Error> {
        Self::bind_hosted(addr, size, token, None)
    }

    /// [`bind`](Self::bind) for a server run by rank `host` of the job itself (rank 0 under
    /// Slurm): dropped, it lingers (bounded) until that rank's `BYE` is handled, so the
    /// others hear `FINISHED <host>` before the server closes their connections.
    pub fn bind_hosted(addr: &str, size: u32, token: &str, host: Option<u32>) -> Result<Self, Error> {
        if size == 0 {
            return Err(Error::InvalidArgument("a job needs at least one rank"));
        }
        let listener = TcpListener::bind(addr).map_err(|e| bootstrap_error("bind the key-value server", &e))?;
        let addr = listener.local_addr().map_err(|e| bootstrap_error("local_addr", &e))?;
        let state = Arc::new(ServerState {
            size,
            token: token.to_string(),
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
            host,
            #[cfg(test)]
            bye_delay: std::sync::Mutex::new(Duration::ZERO),
        });
        let st = state.clone();
        let accept = std::thread::Builder::new()
            .name("weft-kvs".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if st.stop.load(Ordering::Acquire) {
                        break;
                    }
                    if let Ok(conn) = conn {
                        let st = st.clone();
                        let _ = std::thread::Builder::new().name("weft-kvs-conn".into()).spawn(move || serve(&st, conn));
                    }
                }
            })
            .map_err(|e| bootstrap_error("spawn", &e))?;
        Ok(KvsServer { addr, state, accept: Some(accept) })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Ranks whose connection closed without `BYE` so far.
    pub fn lost(&self) -> Vec<u32> {
        self.state.table.lock().map(|t| t.lost.clone()).unwrap_or_default()
    }

    /// Ranks that finished normally (`BYE`) so far.
    pub fn finished(&self) -> Vec<u32> {
        self.state.table.lock().map(|t| t.finished.clone()).unwrap_or_default()
    }

    /// Marks `rank` lost as if its connection had closed (`weftrun` calls it when it reaps a
    /// rank that died before connecting).
    pub fn report_lost(&self, rank: u32) {
        lose(&self.state, rank);
    }

    /// Tells the server that `rank`'s process exited with status 0 (`weftrun` calls it when
    /// it reaps such a rank); `true` if that made the rank lost.
    ///
    /// A rank still connected is left to its connection, whose end the server is about to
    /// read: `BYE` (a normal finish, possibly still in flight when the process is reaped)
    /// or EOF without it (lost). A rank that never connected, or never said `BYE`, never
    /// will: it is lost, so that the others fail at once instead of waiting out the
    /// exchange's timeout for it.
    pub fn report_exited(&self, rank: u32) -> bool {
        let connected = self.state.table.lock().is_ok_and(|t| t.conns.contains_key(&rank));
        if connected {
            return false;
        }
        lose(&self.state, rank)
    }
}

impl Drop for KvsServer {
    fn drop(&mut self) {
        // The rank hosting the server (rank 0 under Slurm) may be done with the exchange, and
        // failing at start, before the server has answered every other rank's `GET`: linger
        // (bounded) so that they get the addresses and reach the same verdict instead of EOF.
        // And the host rank's own `BYE`, written just before it drops the server, may not
        // have been read yet: the others would get EOF instead of `FINISHED`.
        let host = self.state.host;
        let host_pending = |t: &Table| host.is_some_and(|h| t.conns.contains_key(&h) && !t.finished.contains(&h) && !t.lost.contains(&h));
        if let Ok(mut t) = self.state.table.lock() {
            let deadline = Instant::now() + LINGER;
            while t.owes_an_answer() || host_pending(&t) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                t = match self.state.changed.wait_timeout(t, left) {
                    Ok((t, _)) => t,
                    Err(_) => break,
                };
            }
        }
        self.state.stop.store(true, Ordering::Release);
        // Unblock `accept` with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
        if let Ok(mut t) = self.state.table.lock() {
            for (_, c) in t.conns.drain() {
                let _ = c.shutdown(Shutdown::Both);
            }
        }
        self.state.changed.notify_all();
    }
}

/// Marks `rank` lost and tells every connected rank; `false` if it already was lost or had
/// finished (`BYE`).
fn lose(st: &ServerState, rank: u32) -> bool {
    let Ok(mut t) = st.table.lock() else { return false };
    if t.lost.contains(&rank) || t.finished.contains(&rank) {
        return false;
    }
    t.lost.push(rank);
    t.conns.remove(&rank);
    let line = format!("LOST {rank}\n");
    for c in t.conns.values_mut() {
        let _ = c.write_all(line.as_bytes());
    }
    drop(t);
    st.changed.notify_all();
    true
}

/// One client connection.
fn serve(st: &ServerState, conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    // An unauthenticated client gets 10 s to say HELLO.
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(mut w) = conn.try_clone() else { return };
    let mut r = BufReader::new(conn);
    let mut line = String::new();
    if read_line(&mut r, &mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let rank = match (parts.next(), parts.next(), parts.next().and_then(|r| r.parse::<u32>().ok())) {
        (Some("HELLO"), Some(tok), Some(rank)) if tok == st.token && rank < st.size => rank,
        (Some("HELLO"), Some(tok), _) if tok != st.token => {
            let _ = w.write_all(b"ERR bad token\n");
            let _ = w.shutdown(Shutdown::Both);
            return;
        }
        _ => {
            let _ = w.write_all(b"ERR bad hello\n");
            let _ = w.shutdown(Shutdown::Both);
            return;
        }
    };
    {
        let Ok(mut t) = st.table.lock() else { return };
        if t.conns.contains_key(&rank) || t.lost.contains(&rank) {
            drop(t);
            let _ = w.write_all(b"ERR rank already connected\n");
            return;
        }
        if let Ok(c) = w.try_clone() {
            t.conns.insert(rank, c);
        }
        // Peers lost (or finished) before this rank connected.
        for l in t.lost.clone() {
            let _ = w.write_all(format!("LOST {l}\n").as_bytes());
        }
        for f in t.finished.clone() {
            let _ = w.write_all(format!("FINISHED {f}\n").as_bytes());
        }
    }
    let _ = r.get_ref().set_read_timeout(None);
    let mut said_bye = false;
    loop {
        line.clear();
        if read_line(&mut r, &mut line).is_err() {
            break;
        }
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("PUT") => {
                let blob = parts.next().unwrap_or("").to_string();
                if let Ok(mut t) = st.table.lock() {
                    t.blobs.insert(rank, blob);
                }
                st.changed.notify_all();
            }
            Some("GET") => {
                let reply = {
                    let Ok(mut t) = st.table.lock() else { break };
                    loop {
                        // Once every rank has published, the exchange is complete: a rank
                        // lost after that (one that failed at start after reading its
                        // answer, say) is reported by `LOST`, not by failing the others.
                        if t.blobs.len() == st.size as usize {
                            let mut s = String::from("ALL");
                            for i in 0..st.size {
                                s.push(' ');
                                s.push_str(&t.blobs[&i]);
                            }
                            s.push('\n');
                            break s;
                        }
                        if let Some(&l) = t.lost.first() {
                            break format!("ERR rank {l} lost during the exchange\n");
                        }
                        if st.stop.load(Ordering::Acquire) {
                            break "ERR server stopped\n".to_string();
                        }
                        t = match st.changed.wait_timeout(t, Duration::from_millis(200)) {
                            Ok((t, _)) => t,
                            Err(_) => return,
                        };
                    }
                };
                let sent = w.write_all(reply.as_bytes());
                if let Ok(mut t) = st.table.lock() {
                    t.answered.push(rank);
                }
                st.changed.notify_all();
                if sent.is_err() {
                    break;
                }
            }
            Some("BYE") => {
                #[cfg(test)]
                std::thread::sleep(*st.bye_delay.lock().unwrap());
                said_bye = true;
                if let Ok(mut t) = st.table.lock() {
                    t.finished.push(rank);
                    t.conns.remove(&rank);
                    // The others' receives from this rank can no longer match (module docs).
                    let line = format!("FINISHED {rank}\n");
                    for c in t.conns.values_mut() {
                        let _ = c.write_all(line.as_bytes());
                    }
                }
                st.changed.notify_all();
                break;
            }
            _ => {
                let _ = w.write_all(b"ERR unknown command\n");
            }
        }
    }
    if !said_bye && !st.stop.load(Ordering::Acquire) {
        let _ = lose(st, rank);
    }
}

/// Reads one line (without the newline), bounded in length.
fn read_line(r: &mut BufReader<TcpStream>, line: &mut String) -> std::io::Result<()> {
    line.clear();
    let n = r.by_ref().take(MAX_LINE as u64).read_line(line)?;
    if n == 0 || !line.ends_with('\n') {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed"));
    }
    line.pop();
    Ok(())
}

// ----------------------------------------------------------------------------------------
// Client

/// Where this process stands in its job, as the environment says.
#[derive(Debug)]
pub struct Job {
    /// This rank.
    pub rank: u32,
    /// Ranks of the job.
    pub size: u32,
    /// Connection to the KVS (none for a job of one started without variables).
    conn: Option<BufReader<TcpStream>>,
    /// The server this process hosts (rank 0 under Slurm).
    server: Option<KvsServer>,
    /// The rank whose process serves the KVS (rank 0 under Slurm); `None` when a launcher
    /// outside the job serves it (`weftrun`).
    host: Option<u32>,
    /// Peers reported `LOST` or `FINISHED` while the exchange was answered, for the
    /// monitor.
    early: Vec<PeerEvent>,
    /// The ranks on this rank's host, as the launcher tells them (PMIx's
    /// `PMIX_LOCAL_PEERS`), ascending, this one included; `None` where it does not.
    host_ranks: Option<Vec<u32>>,
    /// The launcher's PMIx server (feature `pmix`), finalized with the monitor (boxed: the
    /// process name it holds is 260 bytes, which every rank's monitor would carry).
    #[cfg(feature = "pmix")]
    pmix: Option<Box<crate::pmix::Client>>,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

fn env_u32(name: &'static str) -> Result<Option<u32>, Error> {
    match env(name) {
        None => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| Error::InvalidArgument(name)),
    }
}

/// Which launcher started this process, as the environment says (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
    /// Started plainly: rank 0 of 1, nothing to exchange.
    Plain,
    /// `weftrun`, or a launcher that sets its variables.
    Weftrun { rank: u32, size: u32 },
    /// A PMIx launcher: rank and size come from its server.
    #[cfg(feature = "pmix")]
    Pmix,
    /// Slurm with `WEFT_KVS`: rank 0 serves the KVS.
    Slurm { rank: u32, size: u32 },
}

/// Where the environment places this process, checked, without connecting to anything
/// (see the module docs for the order).
fn layout_from_env() -> Result<Layout, Error> {
    let layout = match (env_u32("WEFT_RANK")?, env_u32("WEFT_SIZE")?) {
        (Some(rank), Some(size)) => Layout::Weftrun { rank, size },
        (None, None) => {
            let pmix = env("PMIX_NAMESPACE").is_some() && env("PMIX_RANK").is_some();
            #[cfg(feature = "pmix")]
            if pmix {
                return Ok(Layout::Pmix);
            }
            match (env_u32("SLURM_PROCID")?, env_u32("SLURM_NTASKS")?) {
                (Some(rank), Some(size)) if size > 1 && env("WEFT_KVS").is_some() => Layout::Slurm { rank, size },
                // Each rank would run as a job of one.
                _ if pmix => {
                    return Err(Error::InvalidArgument(
                        "started by a PMIx launcher (PMIX_NAMESPACE and PMIX_RANK are set) but built without the `pmix` \
                         feature: build with it, or start the job with weftrun",
                    ))
                }
                (Some(_), Some(size)) if size > 1 => {
                    return Err(Error::InvalidArgument("under Slurm, export WEFT_KVS=host:port and WEFT_TOKEN before srun"))
                }
                _ => Layout::Plain,
            }
        }
        _ => return Err(Error::InvalidArgument("WEFT_RANK and WEFT_SIZE must be set together")),
    };
    if let Layout::Weftrun { rank, size } | Layout::Slurm { rank, size } = layout {
        if size == 0 || rank >= size {
            return Err(Error::InvalidArgument("rank must be below size (WEFT_RANK/WEFT_SIZE or SLURM_PROCID/SLURM_NTASKS)"));
        }
    }
    Ok(layout)
}

impl Job {
    /// Rank `rank` of `size` with nothing to exchange through (the other fields are set by
    /// the constructors that have them).
    fn alone(rank: u32, size: u32) -> Job {
        Job {
            rank,
            size,
            conn: None,
            server: None,
            host: None,
            early: Vec::new(),
            host_ranks: None,
            #[cfg(feature = "pmix")]
            pmix: None,
        }
    }

    /// The ranks that run on this rank's host, ascending, this one included, where the
    /// launcher tells them (a PMIx server's `PMIX_LOCAL_PEERS`); `None` under `weftrun`,
    /// Slurm without PMIx and a plain start, where ranks find out by comparing host
    /// identities instead.
    pub fn host_ranks(&self) -> Option<&[u32]> {
        self.host_ranks.as_deref()
    }

    /// The size of the job the environment describes, without connecting to anything (what
    /// [`from_env`](Self::from_env) would find, and its errors for a bad environment);
    /// `None` under a PMIx launcher, whose server tells the size only once joined.
    pub fn size_from_env() -> Result<Option<u32>, Error> {
        Ok(match layout_from_env()? {
            Layout::Plain => Some(1),
            Layout::Weftrun { size, .. } | Layout::Slurm { size, .. } => Some(size),
            #[cfg(feature = "pmix")]
            Layout::Pmix => None,
        })
    }

    /// Reads the environment (see the module docs) and connects to the KVS or the PMIx
    /// server if there is one.
    pub fn from_env() -> Result<Job, Error> {
        let (rank, size, slurm) = match layout_from_env()? {
            Layout::Plain => return Ok(Job::alone(0, 1)),
            Layout::Weftrun { rank, size } => (rank, size, false),
            Layout::Slurm { rank, size } => (rank, size, true),
            #[cfg(feature = "pmix")]
            Layout::Pmix => {
                let mut client = crate::pmix::Client::init()?;
                let (rank, size, host_ranks) = (client.rank, client.size, client.host_ranks.take());
                return Ok(Job { pmix: Some(Box::new(client)), host_ranks, ..Job::alone(rank, size) });
            }
        };
        let kvs = env("WEFT_KVS");
        let token = env("WEFT_TOKEN");
        let host = slurm.then_some(0);
        match (kvs, token) {
            (None, _) if size == 1 => Ok(Job { host, ..Job::alone(rank, size) }),
            (None, _) => Err(Error::InvalidArgument("WEFT_KVS=host:port is needed for a job of more than one rank")),
            (Some(_), None) => Err(Error::InvalidArgument("WEFT_TOKEN is needed with WEFT_KVS")),
            (Some(kvs), Some(token)) => {
                let server = if slurm && rank == 0 { Some(KvsServer::bind_hosted(&kvs, size, &token, Some(rank))?) } else { None };
                let conn = connect(&kvs, &token, rank)?;
                Ok(Job { conn: Some(conn), server, host, ..Job::alone(rank, size) })
            }
        }
    }

    /// Connects rank `rank` of `size` to the KVS at `kvs` with `token` (what `from_env`
    /// does under `weftrun`: a server outside the job; exposed for tests and launchers).
    pub fn connect(kvs: &str, token: &str, rank: u32, size: u32) -> Result<Job, Error> {
        if rank >= size {
            return Err(Error::RankOutOfRange { rank, size });
        }
        Ok(Job { conn: Some(connect(kvs, token, rank)?), ..Job::alone(rank, size) })
    }

    /// Publishes this rank's `blob` and returns every rank's, rank `i` at index `i`.
    ///
    /// Fails with [`Error::PeerLost`] naming the rank if one was lost (died, or exited
    /// without joining) before every rank published.
    pub fn exchange(&mut self, blob: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        #[cfg(feature = "pmix")]
        if let Some(client) = &self.pmix {
            return client.exchange(blob);
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(vec![blob.to_vec()]);
        };
        let io = |e: std::io::Error| bootstrap_error("key-value exchange", &e);
        let msg = format!("PUT {}\nGET\n", to_hex(blob));
        conn.get_mut().write_all(msg.as_bytes()).map_err(io)?;
        conn.get_ref().set_read_timeout(Some(EXCHANGE_TIMEOUT)).map_err(io)?;
        let mut line = String::new();
        loop {
            read_line(conn, &mut line).map_err(io)?;
            if line.starts_with("LOST ") || line.starts_with("FINISHED ") {
                // A rank lost before publishing fails the exchange (the answer says so); one
                // lost after it, or one that already finished (it had every address; its
                // `BYE` can overtake our answer), is passed on to the monitor.
                self.early.extend(PeerEvent::parse(&line));
                continue;
            }
            break;
        }
        conn.get_ref().set_read_timeout(None).map_err(io)?;
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("ALL") => {}
            // `ERR rank <r> lost during the exchange`: name the rank, so that the error says
            // which process to look at.
            Some("ERR") if parts.next() == Some("rank") => {
                if let Some(rank) = parts.next().and_then(|r| r.parse::<u32>().ok()) {
                    return Err(Error::PeerLost { rank });
                }
                return Err(Error::InvalidArgument("the key-value exchange failed (a rank was lost before it finished)"));
            }
            _ => return Err(Error::InvalidArgument("the key-value exchange failed (a rank was lost before it finished)")),
        }
        let blobs =
            parts.map(from_hex).collect::<Option<Vec<_>>>().ok_or(Error::InvalidArgument("malformed reply from the key-value server"))?;
        if blobs.len() != self.size as usize {
            return Err(Error::InvalidArgument("the key-value server returned the wrong number of ranks"));
        }
        Ok(blobs)
    }

    /// Keeps the connection open to learn of lost and finished peers: `on_event` runs on a
    /// monitor thread for every `LOST` and `FINISHED` line, and once more if the connection
    /// ends before the monitor is dropped (module docs): [`PeerEvent::ServerLost`], or under
    /// Slurm `Lost(0)` unless rank 0 had finished. Dropping the monitor says `BYE` (a normal
    /// finish).
    // `mut` for the PMIx client's event handler.
    #[cfg_attr(not(feature = "pmix"), allow(unused_mut))]
    pub fn monitor(mut self, on_event: impl Fn(PeerEvent) + Send + 'static) -> Monitor {
        let host = self.host;
        // The hosting rank finished (or was lost): its server may go away normally.
        let mut host_gone = false;
        for &e in &self.early {
            host_gone |= host.is_some() && e.rank() == host;
            on_event(e);
        }
        let closing = Arc::new(AtomicBool::new(false));
        // Under PMIx the launcher's events say what the KVS's lines say (`crate::pmix`); a
        // server that refuses the handler leaves the transport's own signs of a loss.
        #[cfg(feature = "pmix")]
        let on_event = match self.pmix.as_mut() {
            Some(client) => {
                let _ = client.watch(Box::new(on_event));
                None
            }
            None => Some(on_event),
        };
        #[cfg(not(feature = "pmix"))]
        let on_event = Some(on_event);
        let (Some(conn), Some(on_event)) = (self.conn, on_event) else {
            return Monitor {
                conn: None,
                reader: None,
                closing,
                _server: self.server,
                #[cfg(feature = "pmix")]
                _pmix: self.pmix,
            };
        };
        let writer = conn.get_ref().try_clone().ok();
        let mut r = conn;
        let ours = closing.clone();
        let reader = std::thread::Builder::new()
            .name("weft-kvs-monitor".into())
            .spawn(move || {
                let mut line = String::new();
                while read_line(&mut r, &mut line).is_ok() {
                    if let Some(e) = PeerEvent::parse(&line) {
                        host_gone |= host.is_some() && e.rank() == host;
                        on_event(e);
                    }
                }
                // Acquire: pairs with the release store in `Monitor::drop`, made before it
                // closes the connection: an end it caused is not the server's.
                if !ours.load(Ordering::Acquire) {
                    match host {
                        None => on_event(PeerEvent::ServerLost),
                        Some(h) if !host_gone => on_event(PeerEvent::Lost(h)),
                        Some(_) => {}
                    }
                }
            })
            .ok();
        Monitor {
            conn: writer,
            reader,
            closing,
            _server: self.server,
            #[cfg(feature = "pmix")]
            _pmix: self.pmix,
        }
    }
}

fn connect(kvs: &str, token: &str, rank: u32) -> Result<BufReader<TcpStream>, Error> {
    let addrs: Vec<SocketAddr> = kvs.to_socket_addrs().map_err(|_| Error::InvalidArgument("WEFT_KVS must be host:port"))?.collect();
    let deadline = Instant::now() + EXCHANGE_TIMEOUT;
    let mut last = None;
    loop {
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(2)) {
                Ok(c) => {
                    let _ = c.set_nodelay(true);
                    let mut c2 = c.try_clone().map_err(|e| bootstrap_error("connect to the key-value server", &e))?;
                    c2.write_all(format!("HELLO {token} {rank}\n").as_bytes())
                        .map_err(|e| bootstrap_error("connect to the key-value server", &e))?;
                    return Ok(BufReader::new(c));
                }
                Err(e) => last = Some(e),
            }
        }
        if Instant::now() > deadline {
            return Err(match last {
                Some(e) => bootstrap_error("connect to the key-value server", &e),
                None => Error::InvalidArgument("WEFT_KVS resolves to no address"),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Watches a job's KVS connection for lost and finished peers; says `BYE` when dropped.
#[derive(Debug)]
pub struct Monitor {
    /// Write side of the connection.
    conn: Option<TcpStream>,
    /// The thread reading `LOST` and `FINISHED` lines.
    reader: Option<JoinHandle<()>>,
    /// Set by `drop` before it closes the connection (then its end is not news).
    closing: Arc<AtomicBool>,
    /// The server this process hosts, kept alive with the monitor.
    _server: Option<KvsServer>,
    /// The PMIx client (feature `pmix`): `PMIx_Finalize` once the rank is done.
    #[cfg(feature = "pmix")]
    _pmix: Option<Box<crate::pmix::Client>>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        // Release: pairs with the reader's acquire load once the connection ends.
        self.closing.store(true, Ordering::Release);
        if let Some(mut c) = self.conn.take() {
            let _ = c.write_all(b"BYE\n");
            let _ = c.shutdown(Shutdown::Both);
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_rejects_garbage() {
        let b = [0u8, 1, 0x7f, 0x80, 0xff];
        assert_eq!(from_hex(&to_hex(&b)).as_deref(), Some(&b[..]));
        assert_eq!(from_hex("abc"), None);
        assert_eq!(from_hex("zz"), None);
    }

    #[test]
    fn exchange_between_three_ranks_and_lost_peer() {
        let token = random_token().unwrap();
        let server = KvsServer::bind("127.0.0.1:0", 3, &token).unwrap();
        let addr = server.local_addr().to_string();
        let handles: Vec<_> = (0..3u32)
            .map(|r| {
                let (addr, token) = (addr.clone(), token.clone());
                std::thread::spawn(move || {
                    let mut job = Job::connect(&addr, &token, r, 3).unwrap();
                    let all = job.exchange(format!("rank{r}").as_bytes()).unwrap();
                    (job, all)
                })
            })
            .collect();
        let mut jobs = Vec::new();
        for h in handles {
            let (job, all) = h.join().unwrap();
            assert_eq!(all, vec![b"rank0".to_vec(), b"rank1".to_vec(), b"rank2".to_vec()]);
            jobs.push(job);
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let mut monitors: Vec<Monitor> = jobs
            .into_iter()
            .map(|j| {
                let tx = tx.clone();
                let me = j.rank;
                j.monitor(move |e| {
                    let _ = tx.send((me, e));
                })
            })
            .collect();
        // Rank 2 "dies": its connection closes without BYE (and its own monitor, which
        // would report the end as the server's, with it).
        let m2 = monitors.pop().unwrap();
        m2.closing.store(true, Ordering::Release);
        if let Some(c) = &m2.conn {
            c.shutdown(Shutdown::Both).unwrap();
        }
        let mut seen = vec![rx.recv_timeout(Duration::from_secs(5)).unwrap(), rx.recv_timeout(Duration::from_secs(5)).unwrap()];
        seen.sort();
        assert_eq!(seen, vec![(0, PeerEvent::Lost(2)), (1, PeerEvent::Lost(2))]);
        assert_eq!(server.lost(), vec![2]);
        drop(m2);
        // A normal finish is not a loss: the others learn it as such.
        let m1 = monitors.pop().unwrap();
        drop(m1);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok((0, PeerEvent::Finished(1))));
        drop(monitors);
        // Rank 0's `BYE` reaches the server after the drop: wait for it (a hang guard, not a
        // timing), then nothing else may have changed.
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.finished().len() < 2 {
            assert!(Instant::now() < deadline, "rank 0's BYE never counted: {:?}", server.finished());
            std::thread::yield_now();
        }
        assert_eq!(server.lost(), vec![2]);
        assert_eq!(server.finished(), vec![1, 0]);
    }

    /// A raw client of rank `rank`: connected and greeted, nothing published yet.
    fn raw_client(server: &KvsServer, token: &str, rank: u32) -> (TcpStream, BufReader<TcpStream>) {
        let mut c = TcpStream::connect(server.local_addr()).unwrap();
        c.write_all(format!("HELLO {token} {rank}\n").as_bytes()).unwrap();
        let r = BufReader::new(c.try_clone().unwrap());
        (c, r)
    }

    /// A rank that published and then died (as one does that fails at start on reading the
    /// answer) does not fail the exchange of the others: they get every address, and the
    /// loss through the monitor.
    #[test]
    fn a_rank_lost_after_publishing_is_reported_not_fatal() {
        let token = random_token().unwrap();
        let server = KvsServer::bind("127.0.0.1:0", 2, &token).unwrap();
        let mut job = Job::connect(&server.local_addr().to_string(), &token, 0, 2).unwrap();
        let (mut c, _r) = raw_client(&server, &token, 1);
        c.write_all(b"PUT 6f6e65\n").unwrap();
        c.shutdown(Shutdown::Both).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.lost().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(server.lost(), vec![1]);
        let all = job.exchange(b"zero").unwrap();
        assert_eq!(all, vec![b"zero".to_vec(), b"one".to_vec()]);
        let (tx, rx) = std::sync::mpsc::channel();
        let _m = job.monitor(move |e| {
            let _ = tx.send(e);
        });
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(PeerEvent::Lost(1)));
    }

    /// Under Slurm rank 0 runs the server, and dropping its monitor says `BYE` and then drops
    /// the server at once: the others must hear `FINISHED 0` before the server closes their
    /// connections (they used to get EOF first, and a receive from rank 0 then waited for
    /// ever), also when the server's thread handles the `BYE` late.
    #[test]
    fn the_host_ranks_finish_reaches_the_others_before_its_server_closes() {
        for round in 0..10 {
            let token = random_token().unwrap();
            let server = KvsServer::bind_hosted("127.0.0.1:0", 2, &token, Some(0)).unwrap();
            // The server's thread handles the host's `BYE` late.
            *server.state.bye_delay.lock().unwrap() = Duration::from_millis(if round % 2 == 0 { 0 } else { 50 });
            let addr = server.local_addr().to_string();
            let other = {
                let (addr, token) = (addr.clone(), token.clone());
                std::thread::spawn(move || {
                    let mut job = Job::connect(&addr, &token, 1, 2).unwrap();
                    job.exchange(b"one").unwrap();
                    job
                })
            };
            let mut host = Job::connect(&addr, &token, 0, 2).unwrap();
            host.exchange(b"zero").unwrap();
            host.server = Some(server);
            let (tx, rx) = std::sync::mpsc::channel();
            let _m1 = other.join().unwrap().monitor(move |e| {
                let _ = tx.send(e);
            });
            // BYE, then the server goes with the monitor.
            drop(host.monitor(|_| {}));
            assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(PeerEvent::Finished(0)), "round {round}");
        }
    }

    /// A server dropped as soon as its own rank has the answer (rank 0 under Slurm, failing
    /// at start) still answers a rank that asks later, instead of closing on it.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_dropped_server_answers_the_ranks_it_owes() {
        let token = random_token().unwrap();
        let server = KvsServer::bind("127.0.0.1:0", 2, &token).unwrap();
        let mut job = Job::connect(&server.local_addr().to_string(), &token, 0, 2).unwrap();
        let (mut c, mut r) = raw_client(&server, &token, 1);
        c.write_all(b"PUT 6f6e65\n").unwrap();
        assert_eq!(job.exchange(b"zero").unwrap().len(), 2);
        drop(job);
        // The server is dropped on a thread of its own, which lingers there for the answer it
        // owes; rank 1 asks only once that thread sleeps in the drop.
        let (tx, rx) = std::sync::mpsc::channel();
        let dropper = std::thread::spawn(move || {
            tx.send(std::fs::read_link("/proc/thread-self").unwrap()).unwrap();
            drop(server);
        });
        let stat = std::path::Path::new("/proc").join(rx.recv().unwrap()).join("stat");
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&stat).is_ok_and(|st| st.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S'))) {
            assert!(Instant::now() < deadline, "the dropping thread never waited");
            std::thread::yield_now();
        }
        c.write_all(b"GET\n").unwrap();
        // Rank 0 went away without `BYE` (a failed start): `LOST 0` may come first.
        let mut line = String::new();
        loop {
            read_line(&mut r, &mut line).expect("the answer, not EOF");
            if !line.starts_with("LOST ") {
                break;
            }
        }
        assert_eq!(line, "ALL 7a65726f 6f6e65");
        dropper.join().unwrap();
    }

    /// `report_exited` (weftrun reaped a rank with status 0): a rank that never connected is
    /// lost at once, and the others' exchange fails naming it (it used to wait out the
    /// 60 s exchange timeout); a connected rank is left to its connection, so that a `BYE`
    /// still in flight is a normal finish and EOF without one a loss.
    #[test]
    fn a_rank_that_exited_is_lost_unless_its_connection_says_otherwise() {
        let token = random_token().unwrap();
        let server = KvsServer::bind("127.0.0.1:0", 3, &token).unwrap();
        let addr = server.local_addr().to_string();
        let mut job = Job::connect(&addr, &token, 0, 3).unwrap();
        let (mut c, _r) = raw_client(&server, &token, 1);
        c.write_all(b"PUT 6f6e65\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !server.state.table.lock().unwrap().blobs.contains_key(&1) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!server.report_exited(1), "a connected rank is left to its connection");
        assert!(server.lost().is_empty());
        // Rank 2 exits without ever connecting.
        let t = Instant::now();
        assert!(server.report_exited(2));
        assert_eq!(job.exchange(b"zero"), Err(Error::PeerLost { rank: 2 }));
        assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
        assert!(!server.report_exited(2), "lost once");
        // Rank 1's connection ends without BYE: lost.
        c.shutdown(Shutdown::Both).unwrap();
        while server.lost().len() < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(server.lost(), vec![2, 1]);
    }

    /// Ranks 0 and 1 of a job of two at the server at `addr`, both past the exchange.
    fn join_two(addr: &str, token: &str) -> (Job, Job) {
        let other = {
            let (addr, token) = (addr.to_string(), token.to_string());
            std::thread::spawn(move || {
                let mut j = Job::connect(&addr, &token, 1, 2).unwrap();
                j.exchange(b"one").unwrap();
                j
            })
        };
        let mut job = Job::connect(addr, token, 0, 2).unwrap();
        job.exchange(b"zero").unwrap();
        (job, other.join().unwrap())
    }

    /// A rank that finished (`BYE`) and is reaped right away is not reported lost.
    #[test]
    fn a_finished_rank_that_exited_is_not_lost() {
        let token = random_token().unwrap();
        let server = KvsServer::bind("127.0.0.1:0", 2, &token).unwrap();
        let addr = server.local_addr().to_string();
        let (job, other) = join_two(&addr, &token);
        let m1 = other.monitor(|_| {});
        let _m0 = job.monitor(|_| {});
        drop(m1);
        // Reaped before or after the server read the `BYE`: not lost either way.
        assert!(!server.report_exited(1));
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.finished().is_empty() {
            assert!(Instant::now() < deadline, "rank 1's BYE never counted");
            std::thread::yield_now();
        }
        assert!(!server.report_exited(1));
        assert!(server.lost().is_empty());
        assert_eq!(server.finished(), vec![1]);
    }

    /// `LOST` and `FINISHED` lines that come before the exchange's answer (a fast peer that
    /// already finished, say) do not fail it, and reach the monitor first. A scripted
    /// server fixes the order of the lines.
    #[test]
    fn peer_events_before_the_answer_reach_the_monitor() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (c, _) = listener.accept().unwrap();
            let mut w = c.try_clone().unwrap();
            let mut r = BufReader::new(c);
            let mut line = String::new();
            for want in ["HELLO", "PUT", "GET"] {
                read_line(&mut r, &mut line).unwrap();
                assert!(line.starts_with(want), "{line}");
            }
            w.write_all(b"FINISHED 1\nLOST 2\nALL 00 01 02\n").unwrap();
            // Keep the connection until the client says BYE.
            let _ = read_line(&mut r, &mut line);
        });
        let mut job = Job::connect(&addr, "t", 0, 3).unwrap();
        assert_eq!(job.exchange(&[0]).unwrap(), vec![vec![0], vec![1], vec![2]]);
        let (tx, rx) = std::sync::mpsc::channel();
        let m = job.monitor(move |e| {
            let _ = tx.send(e);
        });
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(PeerEvent::Finished(1)));
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)), Ok(PeerEvent::Lost(2)));
        drop(m);
        server.join().unwrap();
    }

    /// A scripted server for one client of a job of 2: answers the exchange, writes
    /// `then`, and closes the connection — at once, or after the client's `BYE` when
    /// `wait_bye`. Returns its address and its thread.
    fn scripted_server(then: &'static [u8], wait_bye: bool) -> (String, JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let t = std::thread::spawn(move || {
            let (c, _) = listener.accept().unwrap();
            let mut w = c.try_clone().unwrap();
            let mut r = BufReader::new(c);
            let mut line = String::new();
            for want in ["HELLO", "PUT", "GET"] {
                read_line(&mut r, &mut line).unwrap();
                assert!(line.starts_with(want), "{line}");
            }
            w.write_all(b"ALL 00 01\n").unwrap();
            w.write_all(then).unwrap();
            if wait_bye {
                let _ = read_line(&mut r, &mut line);
            }
            let _ = w.shutdown(Shutdown::Both);
        });
        (addr, t)
    }

    /// The events a monitor of rank 1 reports — `expected` of them (waiting up to 10 s for
    /// each), and any that follows within 200 ms — with `host` as the rank serving the job
    /// (`None`: a launcher outside it), against a server that writes `then` after the
    /// exchange and closes (after `BYE` if `wait_bye`, which the monitor says when dropped).
    fn monitor_events(host: Option<u32>, then: &'static [u8], wait_bye: bool, expected: usize) -> Vec<PeerEvent> {
        let (addr, server) = scripted_server(then, wait_bye);
        let mut job = Job::connect(&addr, "t", 1, 2).unwrap();
        job.host = host;
        job.exchange(&[1]).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let m = job.monitor(move |e| {
            let _ = tx.send(e);
        });
        let mut seen = Vec::new();
        while seen.len() < expected {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(e) => seen.push(e),
                Err(_) => break,
            }
        }
        seen.extend(rx.recv_timeout(Duration::from_millis(200)));
        drop(m);
        server.join().unwrap();
        seen.extend(rx.try_iter());
        seen
    }

    /// The server ending a rank's connection while the rank is still in the job is news: a
    /// launcher outside the job (`weftrun`) is gone — `ServerLost`; under Slurm rank 0,
    /// which serves the job, died — `Lost(0)`, unless it finished (or was reported lost)
    /// first. The end a monitor causes itself, by saying `BYE`, reports nothing.
    #[test]
    fn the_end_of_the_servers_connection_is_reported() {
        assert_eq!(monitor_events(None, b"", false, 1), vec![PeerEvent::ServerLost]);
        assert_eq!(monitor_events(None, b"", true, 0), vec![]);
        assert_eq!(monitor_events(Some(0), b"", false, 1), vec![PeerEvent::Lost(0)]);
        assert_eq!(monitor_events(Some(0), b"FINISHED 0\n", false, 1), vec![PeerEvent::Finished(0)]);
        assert_eq!(monitor_events(Some(0), b"LOST 0\n", false, 1), vec![PeerEvent::Lost(0)]);
        assert_eq!(monitor_events(Some(0), b"", true, 0), vec![]);
        // A real server going away (weftrun killed) ends every rank's connection.
        let token = random_token().unwrap();
        let server = KvsServer::bind("127.0.0.1:0", 2, &token).unwrap();
        let addr = server.local_addr().to_string();
        let (job, other) = join_two(&addr, &token);
        let (tx, rx) = std::sync::mpsc::channel();
        let monitors: Vec<Monitor> = [job, other]
            .into_iter()
            .map(|j| {
                let (tx, me) = (tx.clone(), j.rank);
                j.monitor(move |e| {
                    let _ = tx.send((me, e));
                })
            })
            .collect();
        drop(server);
        let mut seen = vec![rx.recv_timeout(Duration::from_secs(5)).unwrap(), rx.recv_timeout(Duration::from_secs(5)).unwrap()];
        seen.sort();
        assert_eq!(seen, vec![(0, PeerEvent::ServerLost), (1, PeerEvent::ServerLost)]);
        drop(monitors);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
    }

    #[test]
    fn wrong_token_is_refused() {
        let server = KvsServer::bind("127.0.0.1:0", 2, "secret").unwrap();
        let mut job = Job::connect(&server.local_addr().to_string(), "guess", 0, 2).unwrap();
        assert!(job.exchange(b"x").is_err());
        assert!(server.lost().is_empty());
    }
}
