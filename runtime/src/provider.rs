//! Choosing the provider (`Builder::provider`, `WEFT_PROVIDER`) and joining a job: the
//! bootstrap (`weft_transport::bootstrap`) tells this process its rank and size and
//! exchanges every rank's fabric addresses; a process started plainly is rank 0 of 1.

use weft_transport::bootstrap::Job;
use weft_transport::embedded;
use weft_transport::{Provider, Transport};

use crate::config::Config;
use crate::Error;

/// `ranks` transports of one job inside this process.
pub(crate) fn local(config: &Config, ranks: u32) -> Result<Vec<Transport>, Error> {
    if ranks == 0 {
        // One answer for every provider (libfabric's world of none used to be an empty `Ok`).
        return Err(Error::InvalidArgument("build_local needs at least 1 rank"));
    }
    match config.provider {
        Provider::Embedded => Ok(embedded::fabric(embedded::EmbeddedOptions {
            ranks,
            cris: config.cris,
            inbox_capacity: config.inbox_capacity,
            eager_capacity: config.eager_threshold.max(64),
        })?
        .into_iter()
        .map(Transport::Embedded)
        .collect()),
        #[cfg(feature = "ofi")]
        Provider::Shm | Provider::Tcp => {
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

/// This process's transport: its rank of the job the environment describes.
pub(crate) fn open_process(config: &Config) -> Result<Transport, Error> {
    // The provider is checked against the job's size before connecting to anything: the
    // embedded provider cannot join a job of several processes, and connecting first would
    // make an unreachable key-value server cost the connect timeout before saying so.
    if config.provider == Provider::Embedded && Job::size_from_env()? > 1 {
        return Err(Error::InvalidArgument("the embedded provider cannot span processes: set WEFT_PROVIDER=shm or tcp (weftrun sets it)"));
    }
    let job = Job::from_env()?;
    match config.provider {
        Provider::Embedded => {
            // A job of one: nothing to exchange; saying BYE when `job` drops here is right,
            // no peer exists to be told anything.
            Ok(local(config, 1)?.remove(0))
        }
        #[cfg(feature = "ofi")]
        Provider::Shm | Provider::Tcp => ofi::join(config, job),
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
    use crate::Error;

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
        }
    }

    /// This process's rank of `job` ([`weft_transport::ofi_provider::join`]).
    pub(super) fn join(config: &Config, job: Job) -> Result<Transport, Error> {
        weft_transport::ofi_provider::join(&options(config), job).map(Transport::Ofi)
    }
}
