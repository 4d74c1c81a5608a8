//! The point-to-point suite of `p2p.rs`, the one-sided suite of `rma.rs` and the collectives
//! suite of `collectives.rs` on libfabric:
//! `shm` (and the point-to-point suite on `ofi-shm`, libfabric's `shm` without the
//! same-host lane) and `tcp;ofi_rxm`, every rank in this process (each with its own domain), traffic
//! pinned to loopback.
#![cfg(feature = "ofi")]

mod common;

fn loopback() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // libfabric reads these once, at its first fi_getinfo.
    ONCE.call_once(|| {
        std::env::set_var("FI_TCP_IFACE", "lo");
        std::env::set_var("FI_SOCKETS_IFACE", "lo");
    });
}

mod shm {
    fn builder() -> weft::Builder {
        super::loopback();
        weft::Runtime::builder().env(false).provider(weft::Provider::Shm)
    }
    mod p2p_suite {
        include!("p2p_suite/mod.rs");
    }
    mod rma_suite {
        include!("rma_suite/mod.rs");
    }
    mod dlock_suite {
        include!("dlock_suite/mod.rs");
    }
    mod dht_suite {
        include!("dht_suite/mod.rs");
    }
    mod coll_suite {
        include!("coll_suite/mod.rs");
    }
}

/// libfabric's `shm` alone (`ofi-shm`: no same-host lane).
mod ofi_shm {
    fn builder() -> weft::Builder {
        super::loopback();
        weft::Runtime::builder().env(false).provider(weft::Provider::OfiShm)
    }
    mod p2p_suite {
        include!("p2p_suite/mod.rs");
    }
}

mod tcp {
    fn builder() -> weft::Builder {
        super::loopback();
        weft::Runtime::builder().env(false).provider(weft::Provider::Tcp)
    }
    mod p2p_suite {
        include!("p2p_suite/mod.rs");
    }
    mod rma_suite {
        include!("rma_suite/mod.rs");
    }
    mod dlock_suite {
        include!("dlock_suite/mod.rs");
    }
    mod dht_suite {
        include!("dht_suite/mod.rs");
    }
    mod coll_suite {
        include!("coll_suite/mod.rs");
    }
}
