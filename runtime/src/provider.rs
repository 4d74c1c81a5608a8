//! Choosing the provider (`Builder::provider`, `WEFT_PROVIDER`) and joining a job: the
//! bootstrap (`weft_transport::bootstrap`) tells this process its rank and size and
//! exchanges every rank's fabric addresses; a process started plainly is rank 0 of 1.

use weft_transport::bootstrap::Job;
use weft_transport::embedded;
use weft_transport::{Provider, Transport};

use crate::config::Config;
use weft_sync::Error;

/// `ranks` transports of one job inside this process.
pub(crate) fn local(config: &Config, ranks: u32) -> Result<Vec<Transport>, Error> {
    if ranks == 0 {
        // One answer for every provider (libfabric's world of none used to be an empty `Ok`).
        return Err(Error::InvalidArgument("build_local needs at least 1 rank"));
    }
    // Refused before anything is allocated: a failed allocation aborts the process.
    if available_memory().is_some_and(|avail| local_footprint(config, ranks) > avail) {
        return Err(Error::InvalidArgument(
            "build_local: the ranks would need more memory than this machine has available \
             (each rank costs about 128 KiB, 128 bytes per other rank and its inboxes: \
             CRIs x inbox capacity x 64 bytes on the embedded provider)",
        ));
    }
    match config.provider {
        Provider::Embedded => Ok(embedded::fabric_with_cost(
            embedded::EmbeddedOptions {
                ranks,
                cris: config.cris,
                inbox_capacity: config.inbox_capacity,
                eager_capacity: config.eager_threshold.max(64),
            },
            config.level_cost,
        )?
        .into_iter()
        .map(Transport::Embedded)
        .collect()),
        #[cfg(feature = "ofi")]
        Provider::Shm | Provider::OfiShm | Provider::Tcp => {
            let opts = ofi::options(config);
            Ok(weft_transport::ofi_provider::world(&opts, ranks)?.into_iter().map(Transport::Ofi).collect())
        }
        #[cfg(not(feature = "ofi"))]
        p => {
            p.check_available()?;
            Err(Error::InvalidArgument("provider not available in this build"))
        }
    }
}

/// Bytes per rank that do not depend on the job's size: the context tables (4,096 slots),
/// the world's two communicators (matching states and locks), the CRIs' locks and scratch
/// lists, the embedded rank's pools. Measured at about 90 KiB; counted with a margin.
const RANK_FIXED_BYTES: u64 = 128 << 10;

/// Bytes per rank and other rank of the job: the world's send sequence numbers (one row per
/// tag partition and one over all tags, and one for the collective context: 72 bytes), the
/// deferred-send queue and count per destination (36 bytes), and the loss flag. Measured at
/// about 109 bytes; counted with a margin.
const RANK_PER_PEER_BYTES: u64 = 128;

/// Bytes of one embedded inbox slot (a frame of one cache line and its stamp).
const EMBEDDED_SLOT_BYTES: u64 = 64;

/// An upper estimate of what `ranks` ranks of `config` allocate in this process
/// ([`local`]): grows with `ranks²` (every rank keeps per-peer state), so a world of tens of
/// thousands of ranks does not fit one machine.
pub(crate) fn local_footprint(config: &Config, ranks: u32) -> u64 {
    let n = u64::from(ranks);
    let cris = config.cris as u64;
    let buffers = match config.provider {
        Provider::Embedded => cris.saturating_mul(config.inbox_capacity as u64).saturating_mul(EMBEDDED_SLOT_BYTES),
        // Posted receive and send slots of an eager frame each, per CRI (libfabric's own
        // memory comes on top).
        _ => {
            let slots = config.inbox_capacity.clamp(16, 256) as u64 + 128;
            cris.saturating_mul(slots).saturating_mul(config.eager_threshold.max(64) as u64 + 128)
        }
    };
    let per_rank = RANK_FIXED_BYTES.saturating_add(buffers).saturating_add(n.saturating_mul(RANK_PER_PEER_BYTES));
    n.saturating_mul(per_rank)
}

/// Memory this process may still allocate, where the system says: the kernel's
/// `MemAvailable`, and below it the room left under the process's cgroup limit (a
/// container's). `None` where neither is known (no estimate refuses anything then).
pub(crate) fn available_memory() -> Option<u64> {
    fn meminfo() -> Option<u64> {
        let text = std::fs::read_to_string("/proc/meminfo").ok()?;
        let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib.saturating_mul(1024))
    }
    fn cgroup() -> Option<u64> {
        // cgroup v2, the process's own group (`0::/path`).
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
        let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok().and_then(|v| v.trim().parse::<u64>().ok());
        // "max" (no limit) does not parse: no cgroup bound.
        let max = read("memory.max")?;
        Some(max.saturating_sub(read("memory.current").unwrap_or(0)))
    }
    match (meminfo(), cgroup()) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Why the embedded provider refuses a job of several processes.
const EMBEDDED_ALONE: &str = "the embedded provider cannot span processes: set WEFT_PROVIDER=shm or tcp (weftrun sets it)";

/// This process's transport: its rank of the job the environment describes.
pub(crate) fn open_process(config: &Config) -> Result<Transport, Error> {
    // The provider is checked against the job's size before connecting to anything: the
    // embedded provider cannot join a job of several processes, and connecting first would
    // make an unreachable key-value server cost the connect timeout before saying so.
    if config.provider == Provider::Embedded && Job::size_from_env()?.is_some_and(|n| n > 1) {
        return Err(Error::InvalidArgument(EMBEDDED_ALONE));
    }
    let job = Job::from_env()?;
    // A PMIx launcher tells the size only once joined.
    if config.provider == Provider::Embedded && job.size > 1 {
        return Err(Error::InvalidArgument(EMBEDDED_ALONE));
    }
    match config.provider {
        Provider::Embedded => {
            // A job of one: nothing to exchange; saying BYE when `job` drops here is right,
            // no peer exists to be told anything.
            Ok(local(config, 1)?.remove(0))
        }
        #[cfg(feature = "ofi")]
        Provider::Shm | Provider::OfiShm | Provider::Tcp => ofi::join(config, job),
        #[cfg(not(feature = "ofi"))]
        p => {
            drop(job);
            p.check_available()?;
            Err(Error::InvalidArgument("provider not available in this build"))
        }
    }
}

#[cfg(feature = "ofi")]
mod ofi {
    use weft_transport::bootstrap::Job;
    use weft_transport::ofi_provider::OfiOptions;
    use weft_transport::Transport;

    use crate::config::Config;
    use weft_sync::Error;

    /// Send buffers per CRI, for frames above the provider's inject size.
    const SEND_SLOTS: usize = 128;

    pub(super) fn options(config: &Config) -> OfiOptions {
        OfiOptions {
            provider: config.provider.ofi_name().unwrap_or("shm").to_string(),
            cris: config.cris,
            eager_capacity: config.eager_threshold.max(64),
            // The inbox capacity bounds the posted receive buffers; 256 x (16 KiB + 64 B)
            // = 4 MiB per CRI at the default threshold.
            recv_slots: config.inbox_capacity.clamp(16, 256),
            send_slots: SEND_SLOTS,
            // How senders number frames (their ordering channels): a receiver that numbers
            // differently would never match them.
            terms: vec![(
                u64::from(config.per_thread_order),
                "the ranks of the job disagree on per-thread order (WEFT_PER_THREAD_ORDER / Builder::per_thread_order)",
            )],
            // `ofi-shm` is libfabric's `shm` alone.
            same_host_lane: config.same_host_lane && config.provider != weft_transport::Provider::OfiShm,
        }
    }

    /// This process's rank of `job` ([`weft_transport::ofi_provider::join`]).
    pub(super) fn join(config: &Config, job: Job) -> Result<Transport, Error> {
        weft_transport::ofi_provider::join(&options(config), job).map(Transport::Ofi)
    }
}

#[cfg(all(test, feature = "ofi"))]
mod tests {
    use weft_transport::Provider;

    use crate::config::Config;

    /// `ofi-shm` is libfabric's `shm` with no same-host lane; `shm` has the lane (unless
    /// switched off), and each says which it is.
    #[test]
    fn ofi_shm_is_libfabric_shm_without_the_lane() {
        std::env::set_var("FI_TCP_IFACE", "lo");
        for (p, lane_setting, want) in
            [(Provider::Shm, true, Provider::Shm), (Provider::Shm, false, Provider::OfiShm), (Provider::OfiShm, true, Provider::OfiShm)]
        {
            let config = Config { provider: p, same_host_lane: lane_setting, ..Config::default() };
            let ts = super::local(&config, 2).unwrap();
            for t in &ts {
                assert_eq!(t.provider(), want, "{p} with same_host_lane {lane_setting}");
                let weft_transport::Transport::Ofi(r) = t else { panic!("{p}: not a libfabric transport") };
                assert_eq!(r.same_host_lane(), want == Provider::Shm, "{p}");
                assert_eq!(r.same_host_peers(), if want == Provider::Shm { 2 } else { 0 }, "{p}");
            }
        }
        assert_eq!("ofi-shm".parse::<Provider>().unwrap(), Provider::OfiShm);
        assert_eq!(Provider::OfiShm.to_string(), "ofi-shm");
        assert_eq!(Provider::OfiShm.ofi_name(), Some("shm"));
    }
}
