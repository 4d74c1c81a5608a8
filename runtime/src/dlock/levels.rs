//! The machine levels of the topology-aware locks [Schmid 2016, §3.2.2-3.2.3]: level 1 is
//! the whole machine, each further level splits every element of the one above (racks,
//! then nodes, ...), and level `N` is the one whose elements hold the ranks directly.
//! `e(p, i)` is the element of rank `p` at level `i`, and `tail_rank[i, j]` (the rank that
//! holds the tail of element `j`'s queue) is the element's first rank.

use weft_sync::Error;

use crate::comm::Communicator;

/// Where the machine levels come from.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Spec {
    /// One level: every rank in one element (no locality).
    Flat,
    /// Consecutive ranks grouped: `sizes[0]` ranks per node, `sizes[1]` nodes per rack, ...
    Simulated(Vec<u32>),
    /// Ranks grouped by the host they run on (one level of nodes under the machine).
    Hosts,
}

/// A description of the machine levels a lock is built over; resolved against the
/// communicator when the lock is created.
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

    /// The ranks that run on one host form a node (two levels: machine and nodes). Resolving
    /// it is collective: the ranks exchange a digest of their host name.
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
                let mine = [host_digest()];
                let mut all = vec![0u64; n as usize];
                comm.allgather(&mine, &mut all)?;
                Ok(Machine::from_keys(vec![vec![0; n as usize], all]))
            }
        }
    }
}

/// The keys of [`Levels::simulated`]: per level, outermost first, each rank's element.
fn simulated_keys(sizes: &[u32], n: u32) -> Vec<Vec<u64>> {
    let mut keys = vec![vec![0u64; n as usize]];
    // From the outermost level in: the span of ranks of one element at each.
    for k in 0..sizes.len() {
        let span: u64 = sizes[..sizes.len() - k].iter().map(|&s| u64::from(s)).product();
        keys.push((0..u64::from(n)).map(|r| r / span).collect());
    }
    keys
}

/// A digest of this host's name (FNV-1a): equal on ranks of one host.
fn host_digest() -> u64 {
    let mut name = [0u8; 256];
    // SAFETY: `name` is writable for its length; gethostname NUL-terminates or truncates.
    let len = if unsafe { libc::gethostname(name.as_mut_ptr().cast(), name.len()) } == 0 {
        name.iter().position(|&b| b == 0).unwrap_or(name.len())
    } else {
        0
    };
    name[..len].iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Resolved levels: per level (index 0 = level 1, the machine), each rank's element and
/// each element's first rank.
#[derive(Clone, Debug)]
pub(crate) struct Machine {
    element: Vec<Vec<u32>>,
    home: Vec<Vec<u32>>,
}

impl Machine {
    /// Numbers the distinct keys of each level in order of their first rank.
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
            element.push(ids);
            home.push(homes);
        }
        Machine { element, home }
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
    }

    #[test]
    fn keys_are_numbered_by_first_rank() {
        let t = Machine::from_keys(vec![vec![0; 5], vec![9, 4, 9, 7, 4]]);
        assert_eq!(t.element[1], [0, 1, 0, 2, 1]);
        assert_eq!((t.tail_rank(1, 4), t.tail_rank(1, 3)), (1, 3));
        assert_eq!(t.leaf_size(), 2);
    }
}
