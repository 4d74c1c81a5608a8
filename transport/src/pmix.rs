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
//! then. `fence` stays the default: at 2 to 16 ranks on one host (`weft-bench startup
//! --launcher mpirun,mpirun-lazy`, docs/BENCHMARKS.md) neither was faster beyond the noise,
//! and a fence costs the servers one collective where the gets cost a request per pair of
//! ranks, which grows with the job across hosts.
//!
//! The raw calls are bindgen output over the installed `pmix.h` (`build.rs`).

use std::ffi::{c_char, c_void, CStr};
use std::ptr;

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
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("rank", &self.rank).field("size", &self.size).finish_non_exhaustive()
    }
}

impl Client {
    /// `PMIx_Init`, then this process's rank and its job's size (a malformed
    /// `WEFT_JOIN_TIMEOUT` is refused first).
    pub(crate) fn init() -> Result<Client, Error> {
        let fence_timeout = fence_timeout()?;
        let mode = exchange_mode(std::env::var("WEFT_PMIX_EXCHANGE").ok().as_deref())?;
        let mut me = sys::pmix_proc_t::default();
        // SAFETY: `me` receives this process's name; no info.
        let status = unsafe { sys::PMIx_Init(&mut me, ptr::null_mut(), 0) };
        check("PMIx_Init (the PMIx server the PMIX_* variables name cannot be reached, or refused)", status)?;
        // From here on a failure drops the client, which finalizes.
        let mut client = Client { me, rank: me.rank, size: 0, fence_timeout, mode, host_ranks: None };
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

        let infos = [info(sys::PMIX_COLLECT_DATA, &true, sys::PMIX_BOOL)?, info(sys::PMIX_TIMEOUT, &self.fence_timeout, sys::PMIX_INT)?];
        // SAFETY: null procs with 0 count is every process of this job; `infos` are loaded
        // infos (bool and int values hold no allocation to release).
        let status = unsafe { sys::PMIx_Fence(ptr::null(), 0, infos.as_ptr(), infos.len()) };
        if status == sys::PMIX_ERR_TIMEOUT {
            return Err(Error::Transport {
                op: "PMIx_Fence of the address exchange: a rank did not join within WEFT_JOIN_TIMEOUT",
                code: status,
            });
        }
        check("PMIx_Fence of the address exchange (a rank failed before it joined)", status)?;

        (0..self.size)
            .map(|r| {
                let mut peer = self.me;
                peer.rank = r;
                Value::get(&peer, ADDRESS_KEY.to_bytes_with_nul(), "PMIx_Get of a peer's fabric addresses")?
                    .bytes()
                    .ok_or(Error::InvalidArgument("a peer's fabric addresses under PMIx are not a byte object (mixed weft versions?)"))
            })
            .collect()
    }

    /// The lazy exchange: every peer's blob by a `PMIx_Get` that waits (up to the join
    /// timeout) for the peer to commit it; this rank's own is `blob`.
    fn get_each(&self, blob: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        let wait = [info(sys::PMIX_TIMEOUT, &self.fence_timeout, sys::PMIX_INT)?];
        (0..self.size)
            .map(|r| {
                if r == self.rank {
                    return Ok(blob.to_vec());
                }
                let mut peer = self.me;
                peer.rank = r;
                Value::get_with(&peer, ADDRESS_KEY.to_bytes_with_nul(), &wait, "PMIx_Get of a peer's fabric addresses")?
                    .bytes()
                    .ok_or(Error::InvalidArgument("a peer's fabric addresses under PMIx are not a byte object (mixed weft versions?)"))
            })
            .collect()
    }
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

impl Drop for Client {
    fn drop(&mut self) {
        // SAFETY: this client called PMIx_Init successfully once; PMIx counts
        // initializations, so each client finalizes its own.
        let _ = unsafe { sys::PMIx_Finalize(ptr::null(), 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exchange_mode_is_fence_unless_lazy_is_asked_for() {
        assert_eq!(exchange_mode(None), Ok(Exchange::Fence));
        assert_eq!(exchange_mode(Some(" ")), Ok(Exchange::Fence));
        assert_eq!(exchange_mode(Some("fence")), Ok(Exchange::Fence));
        assert_eq!(exchange_mode(Some("lazy")), Ok(Exchange::Lazy));
        assert_eq!(exchange_mode(Some("eager")), Err(Error::InvalidArgument("WEFT_PMIX_EXCHANGE must be fence or lazy")));
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
