//! Protocols by name, chosen at start-up: [`LockKind`] (parsed from `"mcs"`, `"p-hmcs-mcs"`,
//! or a `WEFT_LOCK_*` variable) and [`DynLock`], one type for every protocol, so that the
//! runtime can pick the lock of each path (progress, CRI, matching) without generics.
//!
//! A `DynLock` dispatches with one `match` per operation (a well-predicted branch: the variant
//! never changes); its node [`DynNode`] holds the nodes of every protocol (about 100 bytes).

use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::time::Duration;

use super::{
    Clh, ClhNode, Hmcs, Mcs, McsNode, ParkingLot, Priority, RawLock, RawPriorityLock, RawTimedLock, StdLock, StdNode, Tas, TasPark, Ticket,
    Topology, DEFAULT_HMCS_THRESHOLD,
};

/// A flat (single-class) protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FlatKind {
    /// [`Tas`]: test-and-set with exponential backoff.
    Tas,
    /// [`Ticket`].
    Ticket,
    /// [`Mcs`].
    Mcs,
    /// [`Clh`].
    Clh,
    /// [`Hmcs`] over the detected topology.
    Hmcs,
    /// [`StdLock`]: `std::sync::Mutex`.
    Std,
    /// [`ParkingLot`]: `parking_lot::RawMutex`.
    ParkingLot,
    /// [`TasPark`]: test-and-set released by a plain store, whose waiters sleep.
    TasPark,
}

impl FlatKind {
    /// Every flat protocol, in documentation order.
    pub const ALL: [FlatKind; 8] = [
        FlatKind::Tas,
        FlatKind::Ticket,
        FlatKind::Mcs,
        FlatKind::Clh,
        FlatKind::Hmcs,
        FlatKind::Std,
        FlatKind::ParkingLot,
        FlatKind::TasPark,
    ];

    /// The name [`LockKind`] parses (`"tas"`, ..., `"parking_lot"`).
    pub fn name(self) -> &'static str {
        match self {
            FlatKind::Tas => "tas",
            FlatKind::Ticket => "ticket",
            FlatKind::Mcs => "mcs",
            FlatKind::Clh => "clh",
            FlatKind::Hmcs => "hmcs",
            FlatKind::Std => "std",
            FlatKind::ParkingLot => "parking_lot",
            FlatKind::TasPark => "tas_park",
        }
    }

    fn parse(s: &str) -> Option<FlatKind> {
        Some(match s {
            "tas" => FlatKind::Tas,
            "ticket" => FlatKind::Ticket,
            "mcs" => FlatKind::Mcs,
            "clh" => FlatKind::Clh,
            "hmcs" => FlatKind::Hmcs,
            "std" | "mutex" => FlatKind::Std,
            "parking_lot" | "parking-lot" | "parkinglot" => FlatKind::ParkingLot,
            "tas_park" | "tas-park" => FlatKind::TasPark,
            _ => return None,
        })
    }
}

/// A lock protocol by name: flat, or the two-level priority lock `P-X-Y` of [Amer 2019, §4.2]
/// (X for the high class / main path, Y for the low class / progress path).
///
/// ```
/// use weft::lock::{FlatKind, LockKind};
/// assert_eq!("MCS".parse::<LockKind>(), Ok(LockKind::Flat(FlatKind::Mcs)));
/// assert_eq!("p-hmcs-mcs".parse(), Ok(LockKind::P_HMCS_MCS));
/// assert_eq!(LockKind::P_HMCS_MCS.to_string(), "p-hmcs-mcs");
/// assert!("mcs2".parse::<LockKind>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// One protocol for everyone.
    Flat(FlatKind),
    /// [`Priority`] with a `high` and a `low` class protocol.
    Priority {
        /// Protocol of the high-priority class (`high_p`).
        high: FlatKind,
        /// Protocol of the low-priority class (`low_p`).
        low: FlatKind,
    },
}

impl LockKind {
    /// `p-hmcs-mcs`: the seed's best overall (§4.2, §5).
    pub const P_HMCS_MCS: LockKind = LockKind::Priority { high: FlatKind::Hmcs, low: FlatKind::Mcs };
    /// `p-mcs-mcs`.
    pub const P_MCS_MCS: LockKind = LockKind::Priority { high: FlatKind::Mcs, low: FlatKind::Mcs };
    /// `p-ticket-ticket`.
    pub const P_TICKET_TICKET: LockKind = LockKind::Priority { high: FlatKind::Ticket, low: FlatKind::Ticket };

    /// Reads the protocol from environment variable `var` (e.g. [`LockPath::env_var`]):
    /// `Ok(None)` when unset or empty, an error when set to an unknown name.
    pub fn from_env(var: &str) -> Result<Option<LockKind>, ParseLockKindError> {
        match std::env::var(var) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => v.parse().map(Some).map_err(|e: ParseLockKindError| e.in_var(var)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(ParseLockKindError { input: v.to_string_lossy().into_owned(), var: Some(var.to_owned()) })
            }
        }
    }

    /// Whether `flat` is this protocol or one of its two classes.
    pub fn uses(&self, flat: FlatKind) -> bool {
        match *self {
            LockKind::Flat(k) => k == flat,
            LockKind::Priority { high, low } => high == flat || low == flat,
        }
    }

    /// Whether this is a two-level priority lock.
    pub fn is_priority(&self) -> bool {
        matches!(self, LockKind::Priority { .. })
    }
}

impl fmt::Display for LockKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockKind::Flat(k) => f.write_str(k.name()),
            LockKind::Priority { high, low } => write!(f, "p-{}-{}", high.name(), low.name()),
        }
    }
}

impl FromStr for LockKind {
    type Err = ParseLockKindError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let norm = s.trim().to_ascii_lowercase();
        if let Some(k) = FlatKind::parse(&norm) {
            return Ok(LockKind::Flat(k));
        }
        if let Some(rest) = norm.strip_prefix("p-") {
            for (i, _) in rest.match_indices('-') {
                if let (Some(high), Some(low)) = (FlatKind::parse(&rest[..i]), FlatKind::parse(&rest[i + 1..])) {
                    return Ok(LockKind::Priority { high, low });
                }
            }
        }
        Err(ParseLockKindError { input: s.to_owned(), var: None })
    }
}

/// An unknown lock protocol name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseLockKindError {
    /// The rejected text.
    input: String,
    /// The environment variable it came from, if any.
    var: Option<String>,
}

impl ParseLockKindError {
    fn in_var(mut self, var: &str) -> Self {
        self.var = Some(var.to_owned());
        self
    }

    /// The rejected text.
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for ParseLockKindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(v) = &self.var {
            write!(f, "{v}: ")?;
        }
        write!(f, "unknown lock protocol {:?}; expected one of ", self.input)?;
        for (i, k) in FlatKind::ALL.iter().enumerate() {
            write!(f, "{}{}", if i == 0 { "" } else { ", " }, k.name())?;
        }
        f.write_str(", or p-<high>-<low> with two of those (e.g. p-hmcs-mcs, p-mcs-mcs, p-ticket-ticket)")
    }
}

impl std::error::Error for ParseLockKindError {}

/// The runtime paths whose lock protocol is chosen per path, and their variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockPath {
    /// The progress engine (`WEFT_LOCK_PROGRESS`).
    Progress,
    /// A communication resource instance (`WEFT_LOCK_CRI`).
    Cri,
    /// A matching engine (`WEFT_LOCK_MATCHING`).
    Matching,
}

impl LockPath {
    /// The environment variable overriding this path's protocol.
    pub fn env_var(self) -> &'static str {
        match self {
            LockPath::Progress => "WEFT_LOCK_PROGRESS",
            LockPath::Cri => "WEFT_LOCK_CRI",
            LockPath::Matching => "WEFT_LOCK_MATCHING",
        }
    }

    /// [`LockKind::from_env`] of this path's variable.
    pub fn kind_from_env(self) -> Result<Option<LockKind>, ParseLockKindError> {
        LockKind::from_env(self.env_var())
    }
}

/// Construction options of a [`DynLock`].
#[derive(Debug, Clone)]
pub struct LockOptions {
    /// Topology for HMCS (`None`: [`Topology::detect`] when an HMCS is built).
    pub topology: Option<Topology>,
    /// HMCS hand-offs per level before going up.
    pub hmcs_threshold: u64,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions { topology: None, hmcs_threshold: DEFAULT_HMCS_THRESHOLD }
    }
}

impl LockOptions {
    /// Environment variable overriding [`LockOptions::hmcs_threshold`]: an integer in
    /// `1..=2^32` (hand-offs within a level before HMCS goes up).
    pub const HMCS_THRESHOLD_VAR: &'static str = "WEFT_LOCK_HMCS_THRESHOLD";

    /// Applies [`LockOptions::HMCS_THRESHOLD_VAR`] when it is set and not empty;
    /// [`Error::InvalidArgument`](weft_sync::Error::InvalidArgument) when it is not an integer in
    /// `1..=2^32` (the options are then unchanged).
    pub fn apply_env(&mut self) -> Result<(), weft_sync::Error> {
        const BAD: &str = "WEFT_LOCK_HMCS_THRESHOLD must be an integer in 1..=4294967296";
        match std::env::var(Self::HMCS_THRESHOLD_VAR) {
            Ok(v) if v.trim().is_empty() => Ok(()),
            Ok(v) => match v.trim().parse::<u64>() {
                Ok(n) if (1..=1 << 32).contains(&n) => {
                    self.hmcs_threshold = n;
                    Ok(())
                }
                _ => Err(weft_sync::Error::InvalidArgument(BAD)),
            },
            Err(std::env::VarError::NotPresent) => Ok(()),
            Err(std::env::VarError::NotUnicode(_)) => Err(weft_sync::Error::InvalidArgument(BAD)),
        }
    }
}

/// A flat protocol chosen at run time.
#[derive(Debug)]
enum Flat {
    Tas(Tas),
    Ticket(Ticket),
    Mcs(Mcs),
    Clh(Clh),
    Hmcs(Hmcs),
    Std(StdLock),
    ParkingLot(ParkingLot),
    TasPark(TasPark),
}

impl Flat {
    fn new(k: FlatKind, opts: &LockOptions, topo: &mut Option<Topology>) -> Flat {
        match k {
            FlatKind::Tas => Flat::Tas(Tas::new()),
            FlatKind::Ticket => Flat::Ticket(Ticket::new()),
            FlatKind::Mcs => Flat::Mcs(Mcs::new()),
            FlatKind::Clh => Flat::Clh(Clh::new()),
            FlatKind::Hmcs => {
                let t = topo.get_or_insert_with(|| opts.topology.clone().unwrap_or_else(Topology::detect));
                Flat::Hmcs(Hmcs::with_topology(t, opts.hmcs_threshold))
            }
            FlatKind::Std => Flat::Std(StdLock::new()),
            FlatKind::ParkingLot => Flat::ParkingLot(ParkingLot::new()),
            FlatKind::TasPark => Flat::TasPark(TasPark::new()),
        }
    }
}

/// Node of [`DynLock`]: a node for each protocol (only the chosen one is used).
#[derive(Debug, Default)]
pub struct DynNode {
    /// MCS and HMCS.
    q: McsNode,
    /// CLH.
    clh: ClhNode,
    /// std.
    std: StdNode,
}

impl DynNode {
    /// A node that enters HMCS at the leaf of `cpu` (see [`McsNode::with_cpu`]).
    pub fn with_cpu(cpu: usize) -> Self {
        DynNode { q: McsNode::with_cpu(cpu), ..DynNode::default() }
    }
}

/// Projects a pinned [`DynNode`] to one field.
macro_rules! field {
    ($node:expr, $f:ident) => {
        // SAFETY: structural pinning: `DynNode` never moves its fields out and has no `Drop`
        // of its own.
        unsafe { $node.map_unchecked(|n| &n.$f) }
    };
}

/// Calls `$m` on the flat protocol with the matching node field.
macro_rules! dispatch {
    ($flat:expr, $node:expr, |$l:ident, $n:ident| $e:expr) => {
        match $flat {
            Flat::Tas($l) => {
                let $n = Pin::new(&());
                $e
            }
            Flat::Ticket($l) => {
                let $n = Pin::new(&());
                $e
            }
            Flat::ParkingLot($l) => {
                let $n = Pin::new(&());
                $e
            }
            Flat::TasPark($l) => {
                let $n = Pin::new(&());
                $e
            }
            Flat::Mcs($l) => {
                let $n = field!($node, q);
                $e
            }
            Flat::Hmcs($l) => {
                let $n = field!($node, q);
                $e
            }
            Flat::Clh($l) => {
                let $n = field!($node, clh);
                $e
            }
            Flat::Std($l) => {
                let $n = field!($node, std);
                $e
            }
        }
    };
}

// SAFETY: each call forwards to the chosen protocol with the node field that protocol uses;
// the variant never changes, so `unlock` reaches the protocol and node `lock` used.
unsafe impl RawLock for Flat {
    type Node = DynNode;

    #[inline]
    fn lock(&self, node: Pin<&DynNode>) {
        dispatch!(self, node, |l, n| l.lock(n))
    }

    #[inline]
    fn try_lock(&self, node: Pin<&DynNode>) -> bool {
        dispatch!(self, node, |l, n| l.try_lock(n))
    }

    #[inline]
    unsafe fn unlock(&self, node: Pin<&DynNode>) {
        // SAFETY: forwarded contract, same protocol and node field as the acquisition.
        dispatch!(self, node, |l, n| unsafe { l.unlock(n) })
    }

    #[inline]
    fn no_waiters(&self, node: Pin<&DynNode>) -> bool {
        dispatch!(self, node, |l, n| l.no_waiters(n))
    }
}

// SAFETY: forwards to the chosen protocol's timed acquisition.
unsafe impl RawTimedLock for Flat {
    fn try_lock_for(&self, node: Pin<&DynNode>, timeout: Duration) -> bool {
        dispatch!(self, node, |l, n| l.try_lock_for(n, timeout))
    }
}

/// The chosen protocol, inline: boxing the larger `Priority` variant would add a pointer
/// chase to every acquisition of the progress path.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum DynImp {
    Flat(Flat),
    Priority(Priority<Flat, Flat>),
}

/// Any protocol of this module, chosen at run time from a [`LockKind`]. Node: [`DynNode`].
///
/// `lock` is high priority; [`RawPriorityLock::lock_low`] is low priority for `P-X-Y` kinds
/// and plain `lock` for flat ones. A priority lock uses one [`DynNode`] for either class (a
/// thread is in one class at a time).
#[derive(Debug)]
pub struct DynLock {
    /// The protocol name it was built from.
    kind: LockKind,
    /// The protocol.
    imp: DynImp,
}

impl DynLock {
    /// Builds `kind` with default options (HMCS over [`Topology::detect`]).
    pub fn new(kind: LockKind) -> Self {
        DynLock::with_options(kind, &LockOptions::default())
    }

    /// Builds `kind` with `opts`.
    pub fn with_options(kind: LockKind, opts: &LockOptions) -> Self {
        let mut topo = None;
        let imp = match kind {
            LockKind::Flat(k) => DynImp::Flat(Flat::new(k, opts, &mut topo)),
            LockKind::Priority { high, low } => {
                DynImp::Priority(Priority::new(Flat::new(high, opts, &mut topo), Flat::new(low, opts, &mut topo)))
            }
        };
        DynLock { kind, imp }
    }

    /// The protocol it runs.
    pub fn kind(&self) -> LockKind {
        self.kind
    }
}

impl Default for DynLock {
    /// MCS: fair and cheap uncontended.
    fn default() -> Self {
        DynLock::new(LockKind::Flat(FlatKind::Mcs))
    }
}

// SAFETY: forwards to the chosen protocol (`Flat` or `Priority<Flat, Flat>`), which never
// changes after construction.
unsafe impl RawLock for DynLock {
    type Node = DynNode;

    #[inline]
    fn lock(&self, node: Pin<&DynNode>) {
        match &self.imp {
            DynImp::Flat(l) => l.lock(node),
            DynImp::Priority(p) => p.acquire_high(node),
        }
    }

    #[inline]
    fn try_lock(&self, node: Pin<&DynNode>) -> bool {
        match &self.imp {
            DynImp::Flat(l) => l.try_lock(node),
            DynImp::Priority(p) => p.try_acquire_high(node),
        }
    }

    #[inline]
    unsafe fn unlock(&self, node: Pin<&DynNode>) {
        match &self.imp {
            // SAFETY: forwarded contract.
            DynImp::Flat(l) => unsafe { l.unlock(node) },
            // SAFETY: forwarded contract (`lock` of a priority kind is `lock_high`).
            DynImp::Priority(p) => unsafe { p.release_high(node) },
        }
    }

    fn no_waiters(&self, node: Pin<&DynNode>) -> bool {
        match &self.imp {
            DynImp::Flat(l) => l.no_waiters(node),
            DynImp::Priority(p) => p.high().no_waiters(node),
        }
    }
}

// SAFETY: flat kinds: both classes are the protocol's `lock`; priority kinds: [Amer 2019, Fig. 5].
unsafe impl RawPriorityLock for DynLock {
    #[inline]
    fn lock_low(&self, node: Pin<&DynNode>) {
        match &self.imp {
            DynImp::Flat(l) => l.lock(node),
            DynImp::Priority(p) => p.acquire_low(node),
        }
    }

    #[inline]
    fn try_lock_low(&self, node: Pin<&DynNode>) -> bool {
        match &self.imp {
            DynImp::Flat(l) => l.try_lock(node),
            DynImp::Priority(p) => p.try_acquire_low(node),
        }
    }

    #[inline]
    unsafe fn unlock_low(&self, node: Pin<&DynNode>) {
        match &self.imp {
            // SAFETY: forwarded contract.
            DynImp::Flat(l) => unsafe { l.unlock(node) },
            // SAFETY: forwarded contract.
            DynImp::Priority(p) => unsafe { p.release_low(node) },
        }
    }
}

// SAFETY: flat kinds forward; priority kinds poll the high-priority `try_lock`.
unsafe impl RawTimedLock for DynLock {
    fn try_lock_for(&self, node: Pin<&DynNode>, timeout: Duration) -> bool {
        match &self.imp {
            DynImp::Flat(l) => l.try_lock_for(node, timeout),
            DynImp::Priority(_) => super::poll_try_lock_for(self, node, timeout),
        }
    }
}
