//! PMIx client (feature `pmix`): how a process started by a PMIx launcher (`srun --mpi=pmix`,
//! Open MPI's or PRRTE's `mpirun`) learns its rank, the job's size and every peer's fabric
//! addresses, the way an MPI library bootstraps.
//!
//! [`Client::init`] calls `PMIx_Init` (the launcher's server is named by the `PMIX_*`
//! variables it sets), reads the rank from the process's name and the size from the job's
//! `PMIX_JOB_SIZE`, and the ranks of this host from `PMIX_LOCAL_PEERS` (with this rank's
//! place among them, `PMIX_LOCAL_RANK`); [`Client::exchange`] puts this rank's blob under one key, commits, and
//! a fence that collects data makes every rank's blob readable locally (one collective, no
//! request per peer at first contact); dropping the client calls `PMIx_Finalize`.
//!
//! `WEFT_PMIX_EXCHANGE=lazy` skips the fence: each peer's blob is fetched by a `PMIx_Get`
//! that waits for that peer to commit (the server asks the peer's server: a direct modex),
//! bounded by `WEFT_JOIN_TIMEOUT` as the fence is. The gets are made as the rank connects,
//! not at each peer's first message: libfabric's address vector takes every peer's address
//! then. `fence` stays the default: at 2 to 32 ranks on one host (`weft-bench startup
//! --launcher mpirun,mpirun-lazy`, docs/BENCHMARKS.md) neither was faster beyond the noise,
//! and a fence costs the servers one collective where the gets cost a request per pair of
//! ranks, which grows with the job across hosts.
//!
//! # Lost peers and a lost server
//!
//! [`Client::watch`] registers a PMIx event handler that turns what the launcher reports into
//! the bootstrap's [`PeerEvent`]s, as `weftrun`'s monitor does: a process of the job that
//! aborted, was killed or terminated without finalizing (`PMIX_ERR_PROC_ABORTED`,
//! `PMIX_ERR_PROC_TERM_WO_SYNC`, `PMIX_EVENT_PROC_TERMINATED` with a non-zero exit code, ...)
//! is [`PeerEvent::Lost`], one that terminated with exit code 0 [`PeerEvent::Finished`]; the
//! connection to the server ending (`PMIX_ERR_LOST_CONNECTION`: the launcher was killed) is
//! [`PeerEvent::ServerLost`]. The process concerned is the event's `PMIX_EVENT_AFFECTED_PROC`
//! (or `PMIX_EVENT_AFFECTED_PROCS`), else its source.
//!
//! What arrives depends on the launcher. Open MPI 4.1's `mpirun` (ORTE) over PMIx 4.2
//! delivers the lost connection, but not the loss of a rank: with `--enable-recovery` its
//! notification of an aborted process names its targets without the custom range PMIx 4.2
//! requires for them, and the server drops it (`PMIX ERROR: BAD-PARAM` in
//! `pmix_event_notification.c`); without that flag it tears the whole job down instead.
//! PRRTE (Open MPI 5) and Slurm send the process events as PMIx 4 defines them.
//!
//! # A rank gone before the fence
//!
//! The events above are delivered from the moment the rank has joined: during the address
//! fence, a process of the job that ends first would leave the others waiting out the
//! fence's time limit (`WEFT_JOIN_TIMEOUT`), where the launcher does not end the job itself.
//! Open MPI 4.1's `mpirun` ends it when a process exits with a non-zero status or a signal,
//! or with status 0 after another one reached PMIx, but not for one that exited with status 0
//! before any did (say a rank that is not a weft program, or one that decided to do nothing).
//! So the fence is waited for while the job's process table (`PMIX_QUERY_PROC_TABLE`) is
//! read every half second: a process listed as terminated or failed, or (as that `mpirun`
//! lists an exited process) with no state but a pid in two readings in a row, fails the
//! start, naming it. A server that does not answer the query leaves the fence its limit.
//!
//! PMIx passes a handler no pointer of its own but the `PMIX_EVENT_RETURN_OBJECT` given at
//! registration, in the event's info: that is how the handler finds the watch it reports to,
//! without state global to the process.
//!
//! The raw calls are bindgen output over the installed `pmix.h` (`build.rs`).

use std::ffi::{c_char, c_void, CStr};
use std::ptr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::bootstrap::PeerEvent;
use crate::Error;

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    clippy::all,
    clippy::undocumented_unsafe_blocks
)]
mod sys {
    include!(concat!(env!("OUT_DIR"), "/pmix_bindings.rs"));
}

/// The key each rank's address blob is put under.
const ADDRESS_KEY: &CStr = c"weft.addr";

/// Seconds the address fence may take before the server fails it (a rank that never
/// reaches it, on a server that honours `PMIX_TIMEOUT`), unless `WEFT_JOIN_TIMEOUT` says.
const FENCE_TIMEOUT_S: i32 = 60;

/// The fence's time limit: `WEFT_JOIN_TIMEOUT` (whole seconds, 1 to 86400) or
/// [`FENCE_TIMEOUT_S`].
fn fence_timeout() -> Result<i32, Error> {
    match std::env::var("WEFT_JOIN_TIMEOUT").ok().filter(|v| !v.trim().is_empty()) {
        None => Ok(FENCE_TIMEOUT_S),
        Some(v) => v
            .trim()
            .parse()
            .ok()
            .filter(|s| (1..=86_400).contains(s))
            .ok_or(Error::InvalidArgument("WEFT_JOIN_TIMEOUT must be a whole number of seconds in 1..=86400")),
    }
}

/// How the ranks' addresses are exchanged under PMIx (`WEFT_PMIX_EXCHANGE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exchange {
    /// One fence with data collection, then local reads (the default).
    Fence,
    /// No fence: one `PMIx_Get` per peer, waiting for it to commit (direct modex).
    Lazy,
}

/// `WEFT_PMIX_EXCHANGE`: `fence` (or unset) or `lazy`.
pub(crate) fn exchange_mode(value: Option<&str>) -> Result<Exchange, Error> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None | Some("fence") => Ok(Exchange::Fence),
        Some("lazy") => Ok(Exchange::Lazy),
        Some(_) => Err(Error::InvalidArgument("WEFT_PMIX_EXCHANGE must be fence or lazy")),
    }
}

/// `PMIX_RANK_WILDCARD` (`UINT32_MAX-1`, which bindgen does not evaluate): the job itself.
const RANK_WILDCARD: u32 = u32::MAX - 1;

/// A status that is not `PMIX_SUCCESS`, as an error naming the call.
fn check(op: &'static str, status: sys::pmix_status_t) -> Result<(), Error> {
    if status == sys::PMIX_SUCCESS as sys::pmix_status_t {
        Ok(())
    } else {
        Err(Error::Transport { op, code: status })
    }
}

/// A `pmix_info_t` holding `value` of PMIx type `ty` under `key`.
fn info<T>(key: &[u8], value: &T, ty: u32) -> Result<sys::pmix_info_t, Error> {
    let mut i = sys::pmix_info_t::default();
    // SAFETY: `i` is a zeroed (PMIX_UNDEF) info; `key` is a NUL-terminated PMIx key constant;
    // `value` points to a value of the C type PMIx type `ty` names, which PMIx copies.
    let status = unsafe { sys::PMIx_Info_load(&mut i, key.as_ptr().cast(), ptr::from_ref(value).cast(), ty as sys::pmix_data_type_t) };
    check("PMIx_Info_load", status)?;
    Ok(i)
}

/// A value `PMIx_Get` returned, destructed and freed on drop.
struct Value(*mut sys::pmix_value_t);

impl Value {
    /// `PMIx_Get` of `key` of `proc_`; `op` names the lookup in the error.
    fn get(proc_: &sys::pmix_proc_t, key: &[u8], op: &'static str) -> Result<Value, Error> {
        Self::get_with(proc_, key, &[], op)
    }

    /// [`get`](Self::get) with qualifiers `infos` (loaded infos that hold no allocation).
    fn get_with(proc_: &sys::pmix_proc_t, key: &[u8], infos: &[sys::pmix_info_t], op: &'static str) -> Result<Value, Error> {
        let mut v: *mut sys::pmix_value_t = ptr::null_mut();
        // SAFETY: `proc_` is a valid process name, `key` a NUL-terminated key; `infos` is
        // `infos.len()` loaded infos (or none: a null array); `v` receives a value PMIx
        // allocates (or stays null on failure).
        let status = unsafe {
            let p = if infos.is_empty() { ptr::null() } else { infos.as_ptr() };
            sys::PMIx_Get(proc_, key.as_ptr().cast(), p, infos.len(), &mut v)
        };
        if status == sys::PMIX_ERR_TIMEOUT {
            return Err(Error::Transport {
                op: "PMIx_Get of a peer's fabric addresses: the peer did not publish them within WEFT_JOIN_TIMEOUT",
                code: status,
            });
        }
        let v = Value(v);
        check(op, status)?;
        if v.0.is_null() {
            return Err(Error::Transport { op, code: sys::PMIX_ERR_NOT_FOUND as sys::pmix_status_t });
        }
        Ok(v)
    }

    fn ty(&self) -> u32 {
        // SAFETY: a non-null value from `PMIx_Get` (checked in `get`).
        u32::from(unsafe { (*self.0).type_ })
    }

    /// The value as a 32-bit unsigned integer (`PMIX_UINT32`), `None` for another type.
    fn u32(&self) -> Option<u32> {
        // SAFETY: the union member read is the one the type says is set.
        (self.ty() == sys::PMIX_UINT32).then(|| unsafe { (*self.0).data.uint32 })
    }

    /// The value as a 16-bit unsigned integer (`PMIX_UINT16`), `None` for another type.
    fn u16(&self) -> Option<u16> {
        // SAFETY: the union member read is the one the type says is set.
        (self.ty() == sys::PMIX_UINT16).then(|| unsafe { (*self.0).data.uint16 })
    }

    /// The value as a string (`PMIX_STRING`), `None` for another type or one not UTF-8.
    fn string(&self) -> Option<String> {
        if self.ty() != sys::PMIX_STRING {
            return None;
        }
        // SAFETY: the type says the string member is set: a NUL-terminated string PMIx
        // allocated (or null), valid until the value is dropped.
        let p = unsafe { (*self.0).data.string };
        // SAFETY: as above.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_str().ok().map(str::to_string)).flatten()
    }

    /// The value's bytes (`PMIX_BYTE_OBJECT`), `None` for another type.
    fn bytes(&self) -> Option<Vec<u8>> {
        if self.ty() != sys::PMIX_BYTE_OBJECT {
            return None;
        }
        // SAFETY: the type says the byte-object member is set; `bytes` holds `size` bytes
        // (or is null when empty).
        unsafe {
            let bo = (*self.0).data.bo;
            if bo.bytes.is_null() || bo.size == 0 {
                return Some(Vec::new());
            }
            Some(std::slice::from_raw_parts(bo.bytes.cast::<u8>(), bo.size).to_vec())
        }
    }
}

impl Drop for Value {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: `PMIx_Get` allocated the value with malloc (`PMIX_VALUE_RELEASE`:
            // destruct, then free); it is dropped once.
            unsafe {
                sys::PMIx_Value_destruct(self.0);
                libc::free(self.0.cast::<c_void>());
            }
        }
    }
}

/// This process's connection to its launcher's PMIx server; `PMIx_Finalize` on drop.
pub(crate) struct Client {
    me: sys::pmix_proc_t,
    /// This rank.
    pub(crate) rank: u32,
    /// Ranks of the job (`PMIX_JOB_SIZE`).
    pub(crate) size: u32,
    /// Seconds the address fence (or a lazy get) may take.
    fence_timeout: i32,
    /// How the addresses are exchanged.
    mode: Exchange,
    /// The ranks of this job on this host, ascending, this one included (`PMIX_LOCAL_PEERS`);
    /// `None` where the server does not say.
    pub(crate) host_ranks: Option<Vec<u32>>,
    /// The event handler [`watch`](Self::watch) registered, deregistered before finalizing.
    watch: Option<Registration>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("rank", &self.rank).field("size", &self.size).finish_non_exhaustive()
    }
}

/// `PMIx_Init`, on a thread of its own so that a server that accepts the connection but
/// never answers the handshake (PMIx waits for it without a limit) fails the start within
/// `limit` instead of hanging it; this process's name.
fn init_within(limit: Duration) -> Result<sys::pmix_proc_t, Error> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("weft-pmix-init".into())
        .spawn(move || {
            let mut me = sys::pmix_proc_t::default();
            // SAFETY: `me` receives this process's name; no info.
            let status = unsafe { sys::PMIx_Init(&mut me, ptr::null_mut(), 0) };
            if tx.send((status, me)).is_err() && status == sys::PMIX_SUCCESS as sys::pmix_status_t {
                // The caller gave up on it: nobody else will finalize this initialization.
                // SAFETY: PMIx_Init succeeded on this thread.
                let _ = unsafe { sys::PMIx_Finalize(ptr::null(), 0) };
            }
        })
        .map_err(|_| Error::InvalidArgument("could not start a thread to join the PMIx server"))?;
    let Ok((status, me)) = rx.recv_timeout(limit) else {
        return Err(Error::Transport {
            op: "PMIx_Init: the PMIx server the PMIX_* variables name accepted the connection but did not answer within WEFT_JOIN_TIMEOUT",
            code: sys::PMIX_ERR_TIMEOUT,
        });
    };
    check("PMIx_Init (the PMIx server the PMIX_* variables name cannot be reached, or refused)", status)?;
    Ok(me)
}

impl Client {
    /// `PMIx_Init`, then this process's rank and its job's size (a malformed
    /// `WEFT_JOIN_TIMEOUT` is refused first).
    pub(crate) fn init() -> Result<Client, Error> {
        let fence_timeout = fence_timeout()?;
        let mode = exchange_mode(std::env::var("WEFT_PMIX_EXCHANGE").ok().as_deref())?;
        let me = init_within(Duration::from_secs(fence_timeout.unsigned_abs().into()))?;
        // From here on a failure drops the client, which finalizes.
        let mut client = Client { me, rank: me.rank, size: 0, fence_timeout, mode, host_ranks: None, watch: None };
        let mut job = me;
        job.rank = RANK_WILDCARD;
        let size = Value::get(&job, sys::PMIX_JOB_SIZE, "PMIx_Get of the job size (PMIX_JOB_SIZE)")?
            .u32()
            .ok_or(Error::InvalidArgument("the PMIx server gave a job size (PMIX_JOB_SIZE) that is not a 32-bit integer"))?;
        if size == 0 || client.rank >= size {
            return Err(Error::InvalidArgument("the PMIx server gave a rank outside its job's size (PMIX_RANK, PMIX_JOB_SIZE)"));
        }
        client.size = size;
        client.host_ranks = client.host_ranks()?;
        Ok(client)
    }

    /// The ranks of this host as the server tells them (`PMIX_LOCAL_PEERS` of the job, and
    /// `PMIX_LOCAL_RANK`, which must name this rank's place among them): `None` where the
    /// server has neither key; an error where what it says does not add up.
    fn host_ranks(&self) -> Result<Option<Vec<u32>>, Error> {
        let mut job = self.me;
        job.rank = RANK_WILDCARD;
        let Ok(peers) = Value::get(&job, sys::PMIX_LOCAL_PEERS, "PMIx_Get of the ranks on this host (PMIX_LOCAL_PEERS)") else {
            return Ok(None);
        };
        let peers = peers
            .string()
            .ok_or(Error::InvalidArgument("the PMIx server gave the ranks on this host (PMIX_LOCAL_PEERS) not as a string"))?;
        let peers = parse_host_ranks(&peers, self.rank, self.size)?;
        if let Ok(local) = Value::get(&self.me, sys::PMIX_LOCAL_RANK, "PMIx_Get of this rank's local rank (PMIX_LOCAL_RANK)") {
            let local = local
                .u16()
                .ok_or(Error::InvalidArgument("the PMIx server gave a local rank (PMIX_LOCAL_RANK) that is not a 16-bit integer"))?;
            if peers.get(usize::from(local)) != Some(&self.rank) {
                return Err(Error::InvalidArgument(
                    "the PMIx server's local rank (PMIX_LOCAL_RANK) is not this rank's place among the ranks on its host (PMIX_LOCAL_PEERS)",
                ));
            }
        }
        Ok(Some(peers))
    }

    /// Puts `blob` under this rank's address key, commits, fences with data collection and
    /// returns every rank's blob, rank `i` at index `i`.
    pub(crate) fn exchange(&self, blob: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        let mut value = sys::pmix_value_t::default();
        let bo = sys::pmix_byte_object_t { bytes: blob.as_ptr().cast_mut().cast::<c_char>(), size: blob.len() };
        // SAFETY: `value` is zeroed (PMIX_UNDEF); `bo` describes `blob`, which PMIx copies
        // into the value.
        check("PMIx_Value_load", unsafe { sys::PMIx_Value_load(&mut value, ptr::from_ref(&bo).cast(), sys::PMIX_BYTE_OBJECT as u16) })?;
        // SAFETY: `value` holds a loaded byte object; PMIx_Put copies it.
        let put = unsafe { sys::PMIx_Put(sys::PMIX_GLOBAL as sys::pmix_scope_t, ADDRESS_KEY.as_ptr(), &mut value) };
        // SAFETY: `value` owns the copy `PMIx_Value_load` made; it is released once.
        unsafe { sys::PMIx_Value_destruct(&mut value) };
        check("PMIx_Put of this rank's fabric addresses", put)?;
        // SAFETY: no arguments; pushes what this process put to its server.
        check("PMIx_Commit", unsafe { sys::PMIx_Commit() })?;
        if self.mode == Exchange::Lazy {
            return self.get_each(blob);
        }

        let infos =
            vec![info(sys::PMIX_COLLECT_DATA, &true, sys::PMIX_BOOL)?, info(sys::PMIX_TIMEOUT, &self.fence_timeout, sys::PMIX_INT)?];
        let status = self.fence_watching_departures(infos)?;
        if status == sys::PMIX_ERR_TIMEOUT {
            return Err(Error::Transport {
                op: "PMIx_Fence of the address exchange: a rank did not join within WEFT_JOIN_TIMEOUT",
                code: status,
            });
        }
        check("PMIx_Fence of the address exchange (a rank failed before it joined)", status)?;

        // After a fence that collected data every blob is local: look nowhere else
        // (`PMIX_OPTIONAL`), so that a rank that joined without publishing one fails at once.
        let local = [info(sys::PMIX_OPTIONAL, &true, sys::PMIX_BOOL)?];
        (0..self.size)
            .map(|r| {
                let mut peer = self.me;
                peer.rank = r;
                let value = Value::get_with(&peer, ADDRESS_KEY.to_bytes_with_nul(), &local, "PMIx_Get of a peer's fabric addresses")
                    .map_err(|e| match e {
                        Error::Transport { code, .. } => Error::Transport { op: missing_key(r), code },
                        e => e,
                    })?;
                value
                    .bytes()
                    .ok_or(Error::InvalidArgument("a peer's fabric addresses under PMIx are not a byte object (mixed weft versions?)"))
            })
            .collect()
    }

    /// The address fence (`PMIx_Fence_nb` with `infos`, over every process of the job), its
    /// status once it completes; while it does not, the job's process table is read every
    /// [`DEPARTURE_POLL`] (`PMIX_QUERY_PROC_TABLE`), and a process that ended before the
    /// fence completed fails the start at once, naming it (module docs, *A rank gone before
    /// the fence*). The fence is bounded as before by its `PMIX_TIMEOUT`, and here by the
    /// same limit again should the server not honour it.
    fn fence_watching_departures(&self, infos: Vec<sys::pmix_info_t>) -> Result<sys::pmix_status_t, Error> {
        let (tx, rx) = mpsc::sync_channel::<sys::pmix_status_t>(1);
        let tx = Box::into_raw(Box::new(tx)).cast::<c_void>();
        // SAFETY: null procs with 0 count is every process of this job; `infos` are loaded
        // infos (bool and int values hold no allocation), kept alive until the fence is done
        // (or for good, below); `op_done` takes `tx` back when PMIx calls it, which it does
        // only when the call returned success.
        let status = unsafe { sys::PMIx_Fence_nb(ptr::null(), 0, infos.as_ptr(), infos.len(), Some(op_done), tx) };
        if status != sys::PMIX_SUCCESS as sys::pmix_status_t {
            // SAFETY: PMIx did not take `tx`: free it here, once.
            drop(unsafe { Box::from_raw(tx.cast::<mpsc::SyncSender<sys::pmix_status_t>>()) });
            return Ok(if status == sys::PMIX_OPERATION_SUCCEEDED { sys::PMIX_SUCCESS as sys::pmix_status_t } else { status });
        }
        let deadline = Instant::now() + Duration::from_secs(self.fence_timeout.unsigned_abs().into());
        let mut departures = Departures::default();
        loop {
            match rx.recv_timeout(DEPARTURE_POLL) {
                Ok(status) => return Ok(status),
                // `op_done` sends before it drops the sender: not seen, but not a reason to wait.
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(sys::PMIX_ERROR),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
            }
            let gone = self.process_table().and_then(|table| departures.observe(&table, self.rank));
            let out_of_time = Instant::now() >= deadline;
            if gone.is_some() || out_of_time {
                // The fence is still under way in PMIx, which reads `infos` until it completes.
                std::mem::forget(infos);
                return match gone {
                    Some(rank) => Err(Error::Transport { op: departed(rank), code: sys::PMIX_ERR_PROC_TERM_WO_SYNC }),
                    None => Ok(sys::PMIX_ERR_TIMEOUT),
                };
            }
        }
    }

    /// The job's processes as the server lists them (`PMIX_QUERY_PROC_TABLE`): `None` where
    /// it does not answer within [`DEPARTURE_POLL`] or does not support the query.
    fn process_table(&self) -> Option<Vec<ProcState>> {
        let (tx, rx) = mpsc::sync_channel(1);
        let q = Box::into_raw(TableQuery::new(&self.me, tx)?);
        // SAFETY: `q` holds one query whose keys (a NULL-terminated list of PMIx's own
        // constants, never written) and qualifier live as long as it; `table_done` takes it
        // back (and frees it) when PMIx calls it, which it does only when the call returned
        // success.
        let status = unsafe { sys::PMIx_Query_info_nb(&mut (*q).query, 1, Some(table_done), q.cast()) };
        if status != sys::PMIX_SUCCESS as sys::pmix_status_t {
            // SAFETY: PMIx did not take `q`: free it here, once.
            drop(unsafe { Box::from_raw(q) });
            return None;
        }
        rx.recv_timeout(DEPARTURE_POLL).ok().flatten()
    }

    /// The lazy exchange: every peer's blob by a `PMIx_Get` that waits (up to the join
    /// timeout) for the peer to commit it; this rank's own is `blob`.
    ///
    /// Open MPI 4.1's server sometimes answers such a get with `PMIX_ERR_NOT_FOUND` at once
    /// instead of waiting (about one job of 8 ranks in 5, the peers still starting): the get
    /// is made again, after 1 ms doubling up to 50 ms, until the join timeout.
    fn get_each(&self, blob: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        let wait = [info(sys::PMIX_TIMEOUT, &self.fence_timeout, sys::PMIX_INT)?];
        let deadline = Instant::now() + Duration::from_secs(self.fence_timeout.unsigned_abs().into());
        (0..self.size)
            .map(|r| {
                if r == self.rank {
                    return Ok(blob.to_vec());
                }
                let mut peer = self.me;
                peer.rank = r;
                let mut pause = Duration::from_millis(1);
                let value = loop {
                    match Value::get_with(&peer, ADDRESS_KEY.to_bytes_with_nul(), &wait, "PMIx_Get of a peer's fabric addresses") {
                        Err(Error::Transport { code: sys::PMIX_ERR_NOT_FOUND, .. }) if Instant::now() < deadline => {
                            std::thread::sleep(pause);
                            pause = (pause * 2).min(Duration::from_millis(50));
                        }
                        other => break other?,
                    }
                };
                value
                    .bytes()
                    .ok_or(Error::InvalidArgument("a peer's fabric addresses under PMIx are not a byte object (mixed weft versions?)"))
            })
            .collect()
    }
}

/// The error's text for rank `rank`, which ended before the address fence completed. The
/// text is leaked: a start fails with it once.
fn departed(rank: u32) -> &'static str {
    Box::leak(
        format!("PMIx_Fence of the address exchange: rank {rank} of the job ended before it joined (the launcher lists it as no longer running)")
            .into_boxed_str(),
    )
}

/// How often a rank waiting in the address fence reads the job's process table.
const DEPARTURE_POLL: Duration = Duration::from_millis(500);

/// One process of the job as the server's process table lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProcState {
    /// Its rank.
    rank: u32,
    /// Its process id; 0 before the launcher started it.
    pid: i32,
    /// Its `pmix_proc_state_t`.
    state: u8,
}

impl ProcState {
    /// Whether the table says the process has ended: a terminated or failed state, for sure;
    /// `UNDEF` for a process that was started, maybe (Open MPI 4.1's `mpirun` lists an exited
    /// process so, and also, for a moment, one it has just forked and not yet marked running).
    fn ended(&self) -> Ended {
        if u32::from(self.state) >= sys::PMIX_PROC_STATE_TERMINATED {
            Ended::Yes
        } else if u32::from(self.state) == sys::PMIX_PROC_STATE_UNDEF && self.pid != 0 {
            Ended::Maybe
        } else {
            Ended::No
        }
    }
}

/// What one row of the process table says of a process's end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// Running, or not started yet.
    No,
    /// Ended, or just started: ended if the next reading says so again.
    Maybe,
    /// Ended.
    Yes,
}

/// The readings of the process table a rank has taken while waiting in the fence.
#[derive(Debug, Default)]
struct Departures {
    /// Ranks the last reading said may have ended.
    maybe: Vec<u32>,
}

impl Departures {
    /// Takes one reading; the lowest rank other than `me` that has ended, if any: listed as
    /// ended, or as maybe ended in this reading and the one before.
    fn observe(&mut self, table: &[ProcState], me: u32) -> Option<u32> {
        let mut maybe = Vec::new();
        let mut gone = None;
        for p in table.iter().filter(|p| p.rank != me) {
            let ended = match p.ended() {
                Ended::Yes => true,
                Ended::Maybe => {
                    maybe.push(p.rank);
                    self.maybe.contains(&p.rank)
                }
                Ended::No => false,
            };
            if ended {
                gone = Some(gone.map_or(p.rank, |g: u32| g.min(p.rank)));
            }
        }
        self.maybe = maybe;
        gone
    }
}

/// The rows of a `PMIX_QUERY_PROC_TABLE` answer: an array of `pmix_proc_info_t`, directly or
/// each in an info of its own (Open MPI 4.1).
///
/// # Safety
///
/// `info` are infos PMIx passed to a query's callback, valid for the call.
unsafe fn proc_table_rows(info: &[sys::pmix_info_t]) -> Vec<ProcState> {
    let row = |p: &sys::pmix_proc_info_t| ProcState { rank: p.proc_.rank, pid: p.pid, state: p.state };
    let mut rows = Vec::new();
    for i in info {
        // SAFETY: PMIx NUL-terminates every key in its fixed-size array.
        let key = unsafe { CStr::from_ptr(i.key.as_ptr()) }.to_bytes_with_nul();
        if key != sys::PMIX_QUERY_PROC_TABLE || u32::from(i.value.type_) != sys::PMIX_DATA_ARRAY {
            continue;
        }
        // SAFETY: the type says the darray member is set: null or an array of `size`
        // elements of its own type.
        let Some(a) = (unsafe { i.value.data.darray.as_ref() }) else { continue };
        if a.array.is_null() {
            continue;
        }
        match u32::from(a.type_) {
            sys::PMIX_PROC_INFO => {
                // SAFETY: `size` process infos at `array`.
                rows.extend(unsafe { std::slice::from_raw_parts(a.array.cast::<sys::pmix_proc_info_t>(), a.size) }.iter().map(row));
            }
            sys::PMIX_INFO => {
                // SAFETY: `size` infos at `array`.
                for e in unsafe { std::slice::from_raw_parts(a.array.cast::<sys::pmix_info_t>(), a.size) } {
                    if u32::from(e.value.type_) == sys::PMIX_PROC_INFO {
                        // SAFETY: the type says the pinfo member is set: null or one process info.
                        rows.extend(unsafe { e.value.data.pinfo.as_ref() }.map(row));
                    }
                }
            }
            _ => {}
        }
    }
    rows
}

/// One `PMIX_QUERY_PROC_TABLE` query in flight: what PMIx reads until it answers, and where
/// the answer goes. Boxed, so that the query's pointers into it stay put.
struct TableQuery {
    /// The key list the query points to: the key and the terminating NULL.
    keys: [*mut c_char; 2],
    /// The query's one qualifier: this job's namespace (`PMIX_NSPACE`).
    qualifier: sys::pmix_info_t,
    /// The query itself.
    query: sys::pmix_query_t,
    /// Where [`table_done`] sends the rows.
    done: mpsc::SyncSender<Option<Vec<ProcState>>>,
}

impl TableQuery {
    /// The query for the process table of `me`'s job; `None` where the qualifier cannot be made.
    fn new(me: &sys::pmix_proc_t, done: mpsc::SyncSender<Option<Vec<ProcState>>>) -> Option<Box<TableQuery>> {
        let mut q = Box::new(TableQuery {
            keys: [sys::PMIX_QUERY_PROC_TABLE.as_ptr().cast::<c_char>().cast_mut(), ptr::null_mut()],
            qualifier: sys::pmix_info_t::default(),
            query: sys::pmix_query_t { keys: ptr::null_mut(), qualifiers: ptr::null_mut(), nqual: 0 },
            done,
        });
        // SAFETY: `qualifier` is zeroed; a PMIX_STRING info takes the string's address (the
        // namespace, NUL-terminated) and keeps a copy, released in `drop`.
        let status = unsafe {
            sys::PMIx_Info_load(
                &mut q.qualifier,
                sys::PMIX_NSPACE.as_ptr().cast(),
                me.nspace.as_ptr().cast(),
                sys::PMIX_STRING as sys::pmix_data_type_t,
            )
        };
        if status != sys::PMIX_SUCCESS as sys::pmix_status_t {
            return None;
        }
        q.query = sys::pmix_query_t { keys: q.keys.as_mut_ptr(), qualifiers: &mut q.qualifier, nqual: 1 };
        Some(q)
    }
}

impl Drop for TableQuery {
    fn drop(&mut self) {
        // SAFETY: the namespace's copy `PMIx_Info_load` made (or a zeroed value), released once.
        unsafe { sys::PMIx_Value_destruct(&mut self.qualifier.value) };
    }
}

/// `pmix_info_cbfunc_t` of a process-table query: sends the rows (`None` for a failed
/// query) down the channel of the [`TableQuery`] `cbdata` is, frees it, then lets PMIx
/// release its answer.
///
/// # Safety
///
/// `cbdata` is a `Box<TableQuery>` leaked for this one call; `info` is null or `ninfo` infos
/// valid for the call.
unsafe extern "C" fn table_done(
    status: sys::pmix_status_t,
    info: *mut sys::pmix_info_t,
    ninfo: usize,
    cbdata: *mut c_void,
    release: sys::pmix_release_cbfunc_t,
    release_cbdata: *mut c_void,
) {
    // SAFETY: as the contract says; taken back once, when PMIx is done with the query.
    let q = unsafe { Box::from_raw(cbdata.cast::<TableQuery>()) };
    let ok = status == sys::PMIX_SUCCESS as sys::pmix_status_t || status == sys::PMIX_ERR_PARTIAL_SUCCESS;
    let rows = (ok && !info.is_null()).then(|| {
        // SAFETY: `ninfo` infos at `info`, valid for this call.
        unsafe { proc_table_rows(std::slice::from_raw_parts(info, ninfo)) }
    });
    let _ = q.done.try_send(rows);
    drop(q);
    if let Some(f) = release {
        // SAFETY: PMIx's own release of its answer, called once, after the last read of it.
        unsafe { f(release_cbdata) };
    }
}

/// The error's text for rank `rank`, which joined the address fence but has no address key:
/// it names the rank and the key. The text is leaked: a start fails with it once.
fn missing_key(rank: u32) -> &'static str {
    let key = ADDRESS_KEY.to_str().unwrap_or("weft.addr");
    Box::leak(
        format!("PMIx_Get of rank {rank}'s fabric addresses: the key {key} is missing (rank {rank} joined the fence without publishing it: not a weft program of this version?)")
            .into_boxed_str(),
    )
}

/// The ranks of `PMIX_LOCAL_PEERS` ("0,1,5"), ascending: each below `size`, none twice,
/// `rank` (the caller's) among them.
pub(crate) fn parse_host_ranks(list: &str, rank: u32, size: u32) -> Result<Vec<u32>, Error> {
    let bad =
        Error::InvalidArgument("the PMIx server's ranks on this host (PMIX_LOCAL_PEERS) are not a comma-separated list of the job's ranks");
    let mut ranks = list.split(',').map(|r| r.trim().parse::<u32>().ok().filter(|&r| r < size)).collect::<Option<Vec<u32>>>().ok_or(bad)?;
    ranks.sort_unstable();
    if ranks.windows(2).any(|w| w[0] == w[1]) {
        return Err(Error::InvalidArgument("the PMIx server names a rank twice among the ranks on this host (PMIX_LOCAL_PEERS)"));
    }
    if ranks.binary_search(&rank).is_err() {
        return Err(Error::InvalidArgument("the PMIx server's ranks on this host (PMIX_LOCAL_PEERS) leave out this rank"));
    }
    Ok(ranks)
}

/// The events that say a process is gone or finished (module docs). The deprecated codes
/// (`PMIX_ERR_PROC_ABORTED`, `_ABORTING`, `PMIX_PROC_TERMINATED`) are what launchers built
/// against PMIx 3 still send.
const PROCESS_EVENTS: [i32; 10] = [
    sys::PMIX_ERR_PROC_ABORTED,
    sys::PMIX_ERR_PROC_ABORTING,
    sys::PMIX_ERR_PROC_REQUESTED_ABORT,
    sys::PMIX_ERR_PROC_TERM_WO_SYNC,
    sys::PMIX_ERR_PROC_KILLED_BY_CMD,
    sys::PMIX_ERR_PROC_FAILED_TO_START,
    sys::PMIX_ERR_PROC_ABORTED_BY_SIG,
    sys::PMIX_ERR_PROC_SENSOR_BOUND_EXCEEDED,
    sys::PMIX_EVENT_PROC_TERMINATED,
    sys::PMIX_PROC_TERMINATED,
];

/// How long registering or deregistering the handler may take (the server answers a
/// registration; a deregistration runs on PMIx's own thread).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a registered handler reports to: the job it watches and the callback.
struct Watch {
    /// The job's namespace (a proc name whose rank is ignored).
    job: sys::pmix_proc_t,
    /// This rank (never reported).
    me: u32,
    /// Ranks of the job.
    size: u32,
    /// Where the events go. Called only on PMIx's progress thread; the mutex makes the watch
    /// `Sync` for a callback that is only `Send`, and is never contended.
    on_event: std::sync::Mutex<Box<dyn Fn(PeerEvent) + Send>>,
}

impl Watch {
    /// The peer events one PMIx event `status` means, with `source` and `info` as PMIx gave
    /// them (module docs); none for an event that is not about this job's other ranks.
    fn translate(&self, status: sys::pmix_status_t, source: Option<&sys::pmix_proc_t>, info: &[sys::pmix_info_t]) -> Vec<PeerEvent> {
        if status == sys::PMIX_ERR_LOST_CONNECTION || status == sys::PMIX_ERR_LOST_CONNECTION_TO_SERVER {
            return vec![PeerEvent::ServerLost];
        }
        if !PROCESS_EVENTS.contains(&status) {
            return Vec::new();
        }
        let mut procs = Vec::new();
        let mut exit_code = None;
        for i in info {
            // SAFETY: PMIx NUL-terminates every key in its fixed-size array.
            let key = unsafe { CStr::from_ptr(i.key.as_ptr()) }.to_bytes_with_nul();
            let ty = u32::from(i.value.type_);
            if key == sys::PMIX_EVENT_AFFECTED_PROC && ty == sys::PMIX_PROC {
                // SAFETY: the type says the proc member is set: a pointer to one name (or null).
                procs.extend(unsafe { i.value.data.proc_.as_ref() }.copied());
            } else if key == sys::PMIX_EVENT_AFFECTED_PROCS && ty == sys::PMIX_DATA_ARRAY {
                // SAFETY: the type says the darray member is set: a pointer to an array of
                // `size` elements of its own type (or null).
                if let Some(a) = unsafe { i.value.data.darray.as_ref() } {
                    if u32::from(a.type_) == sys::PMIX_PROC && !a.array.is_null() {
                        // SAFETY: `size` names of type PMIX_PROC at `array`.
                        procs.extend_from_slice(unsafe { std::slice::from_raw_parts(a.array.cast::<sys::pmix_proc_t>(), a.size) });
                    }
                }
            } else if key == sys::PMIX_EXIT_CODE && ty == sys::PMIX_INT {
                // SAFETY: the type says the integer member is set.
                exit_code = Some(unsafe { i.value.data.integer });
            }
        }
        if procs.is_empty() {
            procs.extend(source.copied());
        }
        let finished = (status == sys::PMIX_EVENT_PROC_TERMINATED || status == sys::PMIX_PROC_TERMINATED) && exit_code == Some(0);
        let mut events: Vec<PeerEvent> = procs
            .iter()
            .filter(|p| same_nspace(p, &self.job) && p.rank < self.size && p.rank != self.me)
            .map(|p| if finished { PeerEvent::Finished(p.rank) } else { PeerEvent::Lost(p.rank) })
            .collect();
        events.sort_unstable();
        events.dedup();
        events
    }
}

/// Whether `a` and `b` name the same namespace.
fn same_nspace(a: &sys::pmix_proc_t, b: &sys::pmix_proc_t) -> bool {
    // SAFETY: PMIx NUL-terminates namespaces within their fixed-size arrays (and a name
    // built here is zeroed first).
    unsafe { CStr::from_ptr(a.nspace.as_ptr()) == CStr::from_ptr(b.nspace.as_ptr()) }
}

/// A registered event handler: its PMIx reference and the watch its return object points to.
struct Registration {
    id: usize,
    watch: Box<Watch>,
}

/// The event handler (`pmix_notification_fn_t`): finds its [`Watch`] in the info
/// (`PMIX_EVENT_RETURN_OBJECT`), reports what the event means, and lets the chain go on.
///
/// # Safety
///
/// Called by PMIx with `ninfo` infos at `info` (or null), a source name (or null) and the
/// chain's continuation.
unsafe extern "C" fn on_pmix_event(
    _id: usize,
    status: sys::pmix_status_t,
    source: *const sys::pmix_proc_t,
    info: *mut sys::pmix_info_t,
    ninfo: usize,
    _results: *mut sys::pmix_info_t,
    _nresults: usize,
    cbfunc: sys::pmix_event_notification_cbfunc_fn_t,
    cbdata: *mut c_void,
) {
    let info: &[sys::pmix_info_t] = if info.is_null() {
        &[]
    } else {
        // SAFETY: PMIx passes `ninfo` infos at `info`, valid for this call.
        unsafe { std::slice::from_raw_parts(info, ninfo) }
    };
    let watch = info.iter().find_map(|i| {
        // SAFETY: PMIx NUL-terminates every key.
        let key = unsafe { CStr::from_ptr(i.key.as_ptr()) }.to_bytes_with_nul();
        if key == sys::PMIX_EVENT_RETURN_OBJECT && u32::from(i.value.type_) == sys::PMIX_POINTER {
            // SAFETY: the type says the pointer member is set.
            Some(unsafe { i.value.data.ptr })
        } else {
            None
        }
    });
    // SAFETY: the return object is the `Watch` the registration holds, which lives until
    // the handler is deregistered (`Client::drop`); deregistering runs on this same PMIx
    // thread, so no call is under way then.
    if let Some(watch) = watch.and_then(|w| unsafe { w.cast::<Watch>().as_ref() }) {
        // SAFETY: `source` is null or a name valid for this call.
        let events = watch.translate(status, unsafe { source.as_ref() }, info);
        // A panic must not unwind into C.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let on_event = watch.on_event.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for e in events {
                on_event(e);
            }
        }));
    }
    if let Some(f) = cbfunc {
        // SAFETY: PMIx's continuation with its own `cbdata`: success lets the handlers after
        // this one see the event too.
        unsafe { f(sys::PMIX_SUCCESS as sys::pmix_status_t, ptr::null_mut(), 0, None, ptr::null_mut(), cbdata) };
    }
}

/// `pmix_op_cbfunc_t` of a deregistration: sends the status down the channel `cbdata` owns.
///
/// # Safety
///
/// `cbdata` is a `Box<mpsc::SyncSender<i32>>` leaked for this one call.
unsafe extern "C" fn op_done(status: sys::pmix_status_t, cbdata: *mut c_void) {
    // SAFETY: as the contract says; taken back once.
    let tx = unsafe { Box::from_raw(cbdata.cast::<mpsc::SyncSender<sys::pmix_status_t>>()) };
    let _ = tx.send(status);
}

impl Client {
    /// Registers the event handler that reports lost and finished peers and a lost server to
    /// `on_event` (module docs), until the client is dropped.
    pub(crate) fn watch(&mut self, on_event: Box<dyn Fn(PeerEvent) + Send>) -> Result<(), Error> {
        let watch = Box::new(Watch { job: self.me, me: self.rank, size: self.size, on_event: std::sync::Mutex::new(on_event) });
        let mut codes = PROCESS_EVENTS.to_vec();
        codes.extend([sys::PMIX_ERR_LOST_CONNECTION, sys::PMIX_ERR_LOST_CONNECTION_TO_SERVER]);
        let name = *b"weft\0";
        // A `PMIX_POINTER` info holds the address `info` passes (here the watch's), a
        // `PMIX_STRING` one a copy of the string there.
        let mut infos =
            [info(sys::PMIX_EVENT_RETURN_OBJECT, &*watch, sys::PMIX_POINTER)?, info(sys::PMIX_EVENT_HDLR_NAME, &name, sys::PMIX_STRING)?];
        // SAFETY: `codes` and `infos` are valid for the call; no callback: the call blocks
        // until the server has the registration and returns its reference (>= 0) or an
        // error. The return object stays valid until the handler is deregistered.
        let id = unsafe {
            sys::PMIx_Register_event_handler(
                codes.as_mut_ptr(),
                codes.len(),
                infos.as_mut_ptr(),
                infos.len(),
                Some(on_pmix_event),
                None,
                ptr::null_mut(),
            )
        };
        // SAFETY: the name's string is PMIx's copy, released once.
        unsafe { sys::PMIx_Value_destruct(&mut infos[1].value) };
        let id =
            usize::try_from(id).map_err(|_| Error::Transport { op: "PMIx_Register_event_handler of the lost-process events", code: id })?;
        self.watch = Some(Registration { id, watch });
        Ok(())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        if let Some(reg) = self.watch.take() {
            let (tx, rx) = mpsc::sync_channel::<sys::pmix_status_t>(1);
            let tx = Box::into_raw(Box::new(tx)).cast::<c_void>();
            // SAFETY: `reg.id` is this client's registration; `op_done` takes `tx` back
            // when PMIx calls it, which it does only when the call returned success.
            let status = unsafe { sys::PMIx_Deregister_event_handler(reg.id, Some(op_done), tx) };
            let done = if status == sys::PMIX_SUCCESS as sys::pmix_status_t {
                rx.recv_timeout(REGISTER_TIMEOUT).is_ok()
            } else {
                // SAFETY: PMIx did not take `tx`: free it here, once.
                drop(unsafe { Box::from_raw(tx.cast::<mpsc::SyncSender<sys::pmix_status_t>>()) });
                false
            };
            if !done {
                // The handler may still run: its watch must outlive it.
                std::mem::forget(reg.watch);
            }
        }
        // SAFETY: this client called PMIx_Init successfully once; PMIx counts
        // initializations, so each client finalizes its own.
        let _ = unsafe { sys::PMIx_Finalize(ptr::null(), 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process table's rows read in turn while waiting in the fence: a terminated or
    /// failed process is named at once, one listed as `UNDEF` with a pid (Open MPI 4.1's
    /// exited process, or one just forked) only when two readings in a row say so; running,
    /// connected and not yet started processes, and this rank itself, never.
    #[test]
    fn a_process_that_ended_before_the_fence_is_named() {
        let row = |rank: u32, pid: i32, state: u32| ProcState { rank, pid, state: state as u8 };
        let (undef, running, connected) = (sys::PMIX_PROC_STATE_UNDEF, sys::PMIX_PROC_STATE_RUNNING, sys::PMIX_PROC_STATE_CONNECTED);
        let mut d = Departures::default();
        assert_eq!(d.observe(&[row(0, 10, connected), row(1, 11, running), row(2, 0, undef)], 0), None);
        assert_eq!(d.observe(&[row(0, 10, connected), row(1, 11, sys::PMIX_PROC_STATE_TERM_NON_ZERO), row(2, 12, running)], 0), Some(1));
        assert_eq!(d.observe(&[row(0, 10, sys::PMIX_PROC_STATE_TERMINATED), row(1, 11, running)], 0), None, "this rank itself");
        assert_eq!(d.observe(&[row(3, 13, sys::PMIX_PROC_STATE_TERMINATED), row(2, 12, sys::PMIX_PROC_STATE_ABORTED)], 0), Some(2));

        let mut d = Departures::default();
        assert_eq!(d.observe(&[row(0, 10, connected), row(2, 12, undef)], 0), None, "once may be a process just forked");
        assert_eq!(d.observe(&[row(0, 10, connected), row(2, 12, undef)], 0), Some(2));

        let mut d = Departures::default();
        for state in [undef, running, undef, connected] {
            assert_eq!(d.observe(&[row(2, 12, state)], 0), None, "not twice in a row");
        }
    }

    #[test]
    fn the_exchange_mode_is_fence_unless_lazy_is_asked_for() {
        assert_eq!(exchange_mode(None), Ok(Exchange::Fence));
        assert_eq!(exchange_mode(Some(" ")), Ok(Exchange::Fence));
        assert_eq!(exchange_mode(Some("fence")), Ok(Exchange::Fence));
        assert_eq!(exchange_mode(Some("lazy")), Ok(Exchange::Lazy));
        assert_eq!(exchange_mode(Some("eager")), Err(Error::InvalidArgument("WEFT_PMIX_EXCHANGE must be fence or lazy")));
    }

    /// A process name of namespace `ns`.
    fn name(ns: &str, rank: u32) -> sys::pmix_proc_t {
        let mut p = sys::pmix_proc_t::default();
        for (d, s) in p.nspace.iter_mut().zip(ns.bytes()) {
            *d = s as c_char;
        }
        p.rank = rank;
        p
    }

    /// What a watch of rank 0 of a job of 4 in namespace "job" makes of event `status` from
    /// `source` with `infos` (released after).
    fn translated(status: i32, source: Option<sys::pmix_proc_t>, mut infos: Vec<sys::pmix_info_t>) -> Vec<PeerEvent> {
        let watch = Watch { job: name("job", 0), me: 0, size: 4, on_event: std::sync::Mutex::new(Box::new(|_| {})) };
        let events = watch.translate(status, source.as_ref(), &infos);
        for i in &mut infos {
            // SAFETY: a value `PMIx_Info_load` loaded, released once.
            unsafe { sys::PMIx_Value_destruct(&mut i.value) };
        }
        events
    }

    /// The events the launchers send become the bootstrap's peer events, for this job's
    /// other ranks only: the affected process (or processes, or else the source) is lost,
    /// or finished where it terminated with exit code 0; a lost connection to the server is
    /// `ServerLost`; other events mean nothing here.
    #[test]
    fn pmix_events_become_peer_events() {
        let affected = |r| info(sys::PMIX_EVENT_AFFECTED_PROC, &name("job", r), sys::PMIX_PROC).unwrap();
        let exit = |c: i32| info(sys::PMIX_EXIT_CODE, &c, sys::PMIX_INT).unwrap();
        assert_eq!(translated(sys::PMIX_ERR_PROC_ABORTED, None, vec![affected(2)]), vec![PeerEvent::Lost(2)]);
        assert_eq!(translated(sys::PMIX_ERR_PROC_ABORTED_BY_SIG, Some(name("job", 2)), vec![affected(3)]), vec![PeerEvent::Lost(3)]);
        assert_eq!(translated(sys::PMIX_EVENT_PROC_TERMINATED, None, vec![affected(1), exit(0)]), vec![PeerEvent::Finished(1)]);
        assert_eq!(translated(sys::PMIX_EVENT_PROC_TERMINATED, None, vec![affected(1), exit(3)]), vec![PeerEvent::Lost(1)]);
        assert_eq!(translated(sys::PMIX_EVENT_PROC_TERMINATED, None, vec![affected(1)]), vec![PeerEvent::Lost(1)]);
        // The source where no process is named; never this rank, another job or a rank
        // outside the job.
        assert_eq!(translated(sys::PMIX_ERR_PROC_TERM_WO_SYNC, Some(name("job", 3)), vec![]), vec![PeerEvent::Lost(3)]);
        for source in [name("job", 0), name("other", 3), name("job", 4)] {
            assert_eq!(translated(sys::PMIX_ERR_PROC_ABORTING, Some(source), vec![]), vec![]);
        }
        let procs = [name("job", 3), name("other", 2), name("job", 0), name("job", 1), name("job", 9), name("job", 3)];
        let array = sys::pmix_data_array_t {
            type_: sys::PMIX_PROC as sys::pmix_data_type_t,
            size: procs.len(),
            array: procs.as_ptr().cast_mut().cast(),
        };
        let many = info(sys::PMIX_EVENT_AFFECTED_PROCS, &array, sys::PMIX_DATA_ARRAY).unwrap();
        assert_eq!(translated(sys::PMIX_ERR_PROC_KILLED_BY_CMD, None, vec![many]), vec![PeerEvent::Lost(1), PeerEvent::Lost(3)]);
        assert_eq!(translated(sys::PMIX_ERR_LOST_CONNECTION, None, vec![]), vec![PeerEvent::ServerLost]);
        assert_eq!(translated(sys::PMIX_ERR_JOB_ABORTED, None, vec![affected(2)]), vec![]);
    }

    #[test]
    fn host_ranks_parse_and_bad_lists_are_refused() {
        assert_eq!(parse_host_ranks("0,1,2", 1, 4), Ok(vec![0, 1, 2]));
        assert_eq!(parse_host_ranks("5, 3,4", 3, 8), Ok(vec![3, 4, 5]));
        assert_eq!(parse_host_ranks("2", 2, 3), Ok(vec![2]));
        for (list, why) in [("0,1,x", "not a comma"), ("", "not a comma"), ("0,4", "not a comma"), ("0,1,1", "twice"), ("0,2", "leave out")]
        {
            match parse_host_ranks(list, 1, 4) {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(why), "{list:?}: {m}"),
                other => panic!("{list:?}: {other:?}"),
            }
        }
    }
}
