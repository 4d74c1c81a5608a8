//! The machine levels of the topology-aware locks [Schmid 2016, §3.2.2-3.2.3]: level 1 is
//! the whole machine, each further level splits every element of the one above (racks,
//! then nodes, ...), and level `N` is the one whose elements hold the ranks directly.
//! `e(p, i)` is the element of rank `p` at level `i`, and `tail_rank[i, j]` (the rank that
//! holds the tail of element `j`'s queue) is the element's first rank.

use weft_sync::Error;

use crate::comm::Communicator;
use crate::lock::Topology;

/// Where the machine levels come from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Spec {
    /// One level: every rank in one element (no locality).
    Flat,
    /// Consecutive ranks grouped: `sizes[0]` ranks per node, `sizes[1]` nodes per rack, ...
    Simulated(Vec<u32>),
    /// Ranks grouped by the host they run on, then by the part of the host they are bound to.
    Hosts,
}

/// A description of the machine levels a lock is built over; resolved against the
/// communicator when the lock is created. A level that groups the ranks exactly as the one
/// above it (one node holding every rank, say) is left out, and the thresholds
/// ([`Thresholds::t_l`](super::Thresholds::t_l)) apply to the levels that remain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Levels(Spec);

impl Default for Levels {
    /// [`Levels::hosts`].
    fn default() -> Self {
        Levels::hosts()
    }
}

impl Levels {
    /// One level: no locality (RMA-MCS then is D-MCS).
    pub fn flat() -> Self {
        Levels(Spec::Flat)
    }

    /// A simulated hierarchy of consecutive ranks, innermost first: `&[4]` puts ranks 0-3
    /// on node 0, 4-7 on node 1, ... (two levels: machine and nodes); `&[4, 2]` also puts
    /// nodes 0-1 in rack 0, 2-3 in rack 1, ... (three levels). Every size must be at least 1.
    pub fn simulated(sizes: &[u32]) -> Self {
        Levels(Spec::Simulated(sizes.to_vec()))
    }

    /// The ranks that run on one host form a node (levels: machine and nodes); below a node,
    /// the ranks bound to CPUs of one group of the host's coarsest topology level (its
    /// packages on a multi-socket host; from hwloc with the `hwloc` feature, else sysfs, as
    /// [`crate::lock::Topology::detect`]) form a third level, when that splits any node.
    ///
    /// Which ranks share a host comes from the transport where it knows: every rank of the
    /// embedded provider is in this process; libfabric ranks published their host (boot id
    /// and host name) for the same-host lane. Then only the groups are exchanged, and not
    /// even they when every rank is on one host with one group. Where the transport does not
    /// know (the same-host lane switched off), resolving is collective: the ranks exchange a
    /// digest of their host and their group, the host being the launcher's where it says
    /// which ranks share one (PMIx's `PMIX_LOCAL_PEERS`,
    /// [`Runtime::host_ranks`](crate::Runtime::host_ranks)), else the host name.
    pub fn hosts() -> Self {
        Levels(Spec::Hosts)
    }

    /// The element of every rank at every level (collective for [`Levels::hosts`]).
    pub(crate) fn resolve(&self, comm: &Communicator) -> Result<Machine, Error> {
        let n = comm.size();
        match &self.0 {
            Spec::Flat => Ok(Machine::from_keys(vec![vec![0; n as usize]])),
            Spec::Simulated(sizes) => {
                if sizes.contains(&0) {
                    return Err(Error::InvalidArgument("a simulated machine level has 0 elements per parent"));
                }
                Ok(Machine::from_keys(simulated_keys(sizes, n)))
            }
            Spec::Hosts => {
                let topo = Topology::detect();
                let socket = socket_key(&topo, &allowed_cpus());
                let (hosts, sockets) = match comm.engine().transport.host_keys() {
                    // The transport knows every rank's host: only the sockets are exchanged.
                    Some(world) => {
                        let hosts: Vec<u64> = (0..n).map(|r| world[comm.world_of(r) as usize]).collect();
                        (hosts.clone(), sockets_of(comm, &hosts, &topo, socket)?)
                    }
                    None => {
                        let mut all = vec![0u64; 2 * n as usize];
                        comm.allgather(&[host_key(comm.engine().transport.host_ranks()), socket], &mut all)?;
                        (all.chunks(2).map(|k| k[0]).collect(), all.chunks(2).map(|k| k[1]).collect())
                    }
                };
                let sockets = hosts.iter().zip(&sockets).map(|(h, s)| fnv(&[h.to_le_bytes(), s.to_le_bytes()].concat())).collect();
                Ok(Machine::from_keys(vec![vec![0; n as usize], hosts, sockets]))
            }
        }
    }
}

/// Every rank's socket key, the ranks' hosts known (`hosts`): exchanged, unless every rank
/// runs on this host and it has one group at its coarsest level (then no socket level can
/// split it, and every rank, seeing the same host, decides alike without an exchange).
fn sockets_of(comm: &Communicator, hosts: &[u64], topo: &Topology, mine: u64) -> Result<Vec<u64>, Error> {
    let one_host = hosts.iter().all(|&h| h == hosts[0]);
    if one_host && single_group(topo) {
        return Ok(vec![0; hosts.len()]);
    }
    let mut all = vec![0u64; hosts.len()];
    comm.allgather(&[mine], &mut all)?;
    Ok(all)
}

/// Whether `topo` has at most one group at its coarsest level below the root.
fn single_group(topo: &Topology) -> bool {
    topo.depth().checked_sub(2).map_or(true, |level| topo.groups(level) <= 1)
}

/// The keys of [`Levels::simulated`]: per level, outermost first, each rank's element.
fn simulated_keys(sizes: &[u32], n: u32) -> Vec<Vec<u64>> {
    let mut keys = vec![vec![0u64; n as usize]];
    // From the outermost level in: the span of ranks of one element at each.
    for k in 0..sizes.len() {
        let span = sizes[..sizes.len() - k].iter().fold(1u64, |a, &s| a.saturating_mul(u64::from(s)));
        keys.push((0..u64::from(n)).map(|r| r / span).collect());
    }
    keys
}

/// FNV-1a of `bytes`.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// This rank's host, as a key equal on the ranks of one host: where the launcher named the
/// ranks of this host (`host_ranks`, ascending, this one included; the same list on each of
/// them, disjoint from every other host's), its first rank; else a digest of the host name.
fn host_key(host_ranks: Option<&[u32]>) -> u64 {
    match host_ranks.and_then(|h| h.first()) {
        Some(&first) => fnv(&[b"launcher host ".as_slice(), &first.to_le_bytes()].concat()),
        None => host_digest(),
    }
}

/// A digest of this host's name: equal on ranks of one host.
fn host_digest() -> u64 {
    let mut name = [0u8; 256];
    // SAFETY: `name` is writable for its length; gethostname NUL-terminates or truncates.
    let len = if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
        name.iter().position(|&b| b == 0).unwrap_or(name.len())
    } else {
        0
    };
    fnv(&name[..len])
}

/// The CPUs this process may run on (empty if they cannot be read).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set; sched_getaffinity writes at most
    // its size; CPU_ISSET reads within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).collect()
    }
}

/// `group + 1` of the group at `topo`'s coarsest level below the root that holds every CPU
/// in `allowed`; 0 when they span several groups (or are unknown).
fn socket_key(topo: &Topology, allowed: &[usize]) -> u64 {
    let Some(level) = topo.depth().checked_sub(2) else { return 0 };
    let Some(&first) = allowed.first() else { return 0 };
    let group = topo.group_of(level, first);
    if allowed.iter().all(|&c| topo.group_of(level, c) == group) {
        group as u64 + 1
    } else {
        0
    }
}

/// Resolved levels: per level (index 0 = level 1, the machine), each rank's element and
/// each element's first rank.
#[derive(Clone, Debug)]
pub(crate) struct Machine {
    element: Vec<Vec<u32>>,
    home: Vec<Vec<u32>>,
}

impl Machine {
    /// Numbers the distinct keys of each level in order of their first rank; a level that
    /// groups the ranks exactly as the one above it is left out.
    fn from_keys(keys: Vec<Vec<u64>>) -> Machine {
        let mut element = Vec::with_capacity(keys.len());
        let mut home = Vec::with_capacity(keys.len());
        for level in keys {
            let mut seen: Vec<u64> = Vec::new();
            let mut homes = Vec::new();
            let ids = level
                .iter()
                .enumerate()
                .map(|(r, k)| match seen.iter().position(|s| s == k) {
                    Some(i) => i as u32,
                    None => {
                        seen.push(*k);
                        homes.push(r as u32);
                        (seen.len() - 1) as u32
                    }
                })
                .collect();
            if element.last() != Some(&ids) {
                element.push(ids);
                home.push(homes);
            }
        }
        Machine { element, home }
    }

    /// [`Levels::simulated`] over `n` ranks, without a communicator (`&[]`: one level).
    #[cfg(test)]
    pub(crate) fn simulated(sizes: &[u32], n: u32) -> Machine {
        Machine::from_keys(simulated_keys(sizes, n))
    }

    /// `N`, the number of levels.
    pub(crate) fn depth(&self) -> usize {
        self.element.len()
    }

    /// `tail_rank[i, e(p, i)]` for level index `l` (level `l + 1`).
    pub(crate) fn tail_rank(&self, l: usize, p: u32) -> u32 {
        self.home[l][self.element[l][p as usize] as usize]
    }

    /// The most ranks in one element of the innermost level.
    pub(crate) fn leaf_size(&self) -> u32 {
        let leaf = &self.element[self.depth() - 1];
        let mut counts = vec![0u32; self.home[self.depth() - 1].len()];
        leaf.iter().for_each(|&e| counts[e as usize] += 1);
        counts.into_iter().max().unwrap_or(1)
    }

    /// The same tree with the machine's queue tail on `rank`.
    pub(crate) fn with_root_tail(mut self, rank: u32) -> Machine {
        self.home[0][0] = rank;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn simulated(sizes: &[u32], n: u32) -> Machine {
        Machine::from_keys(simulated_keys(sizes, n))
    }

    /// Ranks the launcher put on one host share a key, whatever their host names; other
    /// hosts' ranks get others; without the launcher's word, the host name decides.
    #[test]
    fn the_launchers_host_ranks_make_the_host_level() {
        // Two hosts of a job of 5 as PMIx would name them: ranks 0, 2, 4 and ranks 1, 3.
        let (a, b): (&[u32], &[u32]) = (&[0, 2, 4], &[1, 3]);
        let keys: Vec<u64> = [a, b, a, b, a].iter().map(|h| host_key(Some(h))).collect();
        let t = Machine::from_keys(vec![vec![0; 5], keys]);
        assert_eq!(t.depth(), 2);
        assert_eq!(t.element[1], [0, 1, 0, 1, 0]);
        assert_eq!((t.tail_rank(1, 3), t.tail_rank(1, 4)), (1, 0));
        assert_eq!(host_key(None), host_digest());
        assert_ne!(host_key(Some(a)), host_digest());
    }

    #[test]
    fn simulated_levels_group_consecutive_ranks() {
        // 2 ranks per node, 2 nodes per rack, 10 ranks: the last rack and node are partial.
        let t = simulated(&[2, 2], 10);
        assert_eq!(t.depth(), 3);
        assert_eq!(t.element[1], [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]);
        assert_eq!(t.element[2], [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]);
        assert_eq!((t.tail_rank(0, 9), t.tail_rank(1, 7), t.tail_rank(2, 7)), (0, 4, 6));
        assert_eq!(t.leaf_size(), 2);
        assert_eq!(t.with_root_tail(3).tail_rank(0, 5), 3);
        // Spans past u64 saturate; levels whose one element holds every rank are left out.
        assert_eq!(simulated(&[u32::MAX, u32::MAX, u32::MAX], 4).depth(), 1);
    }

    #[test]
    fn a_level_that_splits_nothing_is_left_out() {
        // Sockets of two hosts: host 1's ranks are all on one socket, host 0's on two.
        let t = Machine::from_keys(vec![vec![0; 4], vec![5, 5, 6, 6], vec![1, 2, 3, 3]]);
        assert_eq!(t.depth(), 3);
        assert_eq!(t.element[2], [0, 1, 2, 2]);
        let one_socket_each = Machine::from_keys(vec![vec![0; 4], vec![5, 5, 6, 6], vec![1, 1, 3, 3]]);
        assert_eq!(one_socket_each.depth(), 2);
        assert_eq!(Machine::from_keys(vec![vec![0; 3], vec![7; 3]]).depth(), 1, "one host: the machine alone");
    }

    #[test]
    fn socket_key_is_the_group_holding_every_allowed_cpu() {
        // 4 CPUs, two packages of two cores.
        let topo = Topology::from_levels(4, vec![vec![0, 1, 2, 3], vec![0, 0, 1, 1]]);
        assert_eq!(socket_key(&topo, &[2, 3]), 2);
        assert_eq!(socket_key(&topo, &[0]), 1);
        assert_eq!(socket_key(&topo, &[1, 2]), 0, "bound across packages");
        assert_eq!(socket_key(&topo, &[]), 0);
        assert_eq!(socket_key(&Topology::flat(4), &[1]), 0, "no level below the host");
    }

    /// On the embedded provider every rank is in this process: `Levels::hosts` takes that
    /// from the transport (one node), and exchanges the ranks' groups only where the host
    /// has several; an allgather of host digests would send messages every time.
    #[test]
    fn hosts_on_the_embedded_provider_ask_the_transport() {
        let rts = crate::Runtime::builder().env(false).build_local(3).unwrap();
        let exchange = !single_group(&Topology::detect());
        std::thread::scope(|s| {
            for rt in &rts {
                s.spawn(move || {
                    let c = rt.world();
                    c.barrier().unwrap();
                    let before = rt.counters().messages_sent;
                    let m = Levels::hosts().resolve(c).unwrap();
                    let sent = rt.counters().messages_sent - before;
                    assert_eq!(sent > 0, exchange, "{sent} messages sent to resolve the hosts");
                    assert_eq!(m.element[0], [0, 0, 0], "one host");
                    c.barrier().unwrap();
                });
            }
        });
    }

    #[test]
    fn keys_are_numbered_by_first_rank() {
        let t = Machine::from_keys(vec![vec![0; 5], vec![9, 4, 9, 7, 4]]);
        assert_eq!(t.element[1], [0, 1, 0, 2, 1]);
        assert_eq!((t.tail_rank(1, 4), t.tail_rank(1, 3)), (1, 3));
        assert_eq!(t.leaf_size(), 2);
    }
}
