//! Machine topology for [`super::Hmcs`]: which CPUs share a core, a cache, a package.
//!
//! Read from Linux sysfs (`/sys/devices/system/cpu/cpu*/topology/{core_id,
//! physical_package_id}` and `cpu*/cache/index*/{level,type,shared_cpu_list}`). The `hwloc`
//! cargo feature of `weft` is declared for a future hwloc-based reader; today the sysfs path is
//! used in every build. Where sysfs cannot be read the topology is flat (one level, HMCS then
//! behaves as MCS).
//!
//! Levels are stored finest first (core, then each shared cache, then package); a level that
//! groups CPUs exactly as the next coarser one, or that has a single group, is dropped, and the
//! root (all CPUs) is implicit. Groups are nested by construction: a group at level `l` is the
//! intersection of its partition key with its group at level `l + 1`.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::Path;

/// CPU grouping per memory-hierarchy level, finest first; the root level is implicit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Number of CPU ids covered (highest id + 1).
    ncpus: usize,
    /// `levels[l][cpu]`: group of `cpu` at level `l` (0 = finest), numbered from 0.
    levels: Vec<Vec<usize>>,
}

impl Topology {
    /// This machine's topology from sysfs, or [`Topology::flat`] over the available
    /// parallelism when sysfs cannot be read.
    pub fn detect() -> Topology {
        Topology::from_sysfs(Path::new("/sys/devices/system/cpu")).unwrap_or_else(|_| {
            Topology::flat(std::thread::available_parallelism().map_or(1, |n| n.get()))
        })
    }

    /// One level: every CPU directly under the root.
    pub fn flat(ncpus: usize) -> Topology {
        Topology { ncpus: ncpus.max(1), levels: Vec::new() }
    }

    /// A topology from explicit partitions, finest first: `levels[l][cpu]` is the group of
    /// `cpu` at level `l`. Groups are made nested and redundant levels dropped, as for sysfs.
    ///
    /// # Panics
    ///
    /// If the partitions do not all have `ncpus` entries.
    pub fn from_levels(ncpus: usize, levels: Vec<Vec<usize>>) -> Topology {
        assert!(levels.iter().all(|l| l.len() == ncpus), "every level needs one entry per CPU");
        Topology { ncpus: ncpus.max(1), levels: normalize(ncpus, levels) }
    }

    /// Reads the topology under `root` (normally `/sys/devices/system/cpu`).
    pub fn from_sysfs(root: &Path) -> io::Result<Topology> {
        let mut cpus = Vec::new();
        for e in fs::read_dir(root)? {
            let name = e?.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name.strip_prefix("cpu").and_then(|s| s.parse::<usize>().ok()) {
                cpus.push(id);
            }
        }
        if cpus.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "no cpu* entries"));
        }
        cpus.sort_unstable();
        let ncpus = cpus[cpus.len() - 1] + 1;
        let read = |cpu: usize, rel: &str| -> Option<String> {
            fs::read_to_string(root.join(format!("cpu{cpu}")).join(rel)).ok().map(|s| s.trim().to_owned())
        };
        // Partition keys per candidate level: core, each cache level >= 2, package.
        let mut core = vec![String::new(); ncpus];
        let mut package = vec![String::new(); ncpus];
        let mut caches: Vec<(u32, Vec<String>)> = Vec::new();
        for &cpu in &cpus {
            let pkg = read(cpu, "topology/physical_package_id").unwrap_or_default();
            let cid = read(cpu, "topology/core_id").unwrap_or_else(|| cpu.to_string());
            core[cpu] = format!("{pkg}/{cid}");
            package[cpu] = pkg;
            for idx in 0.. {
                let base = format!("cache/index{idx}");
                let Some(level) = read(cpu, &format!("{base}/level")) else { break };
                let level: u32 = level.parse().unwrap_or(0);
                let kind = read(cpu, &format!("{base}/type")).unwrap_or_default();
                if level < 2 || kind == "Instruction" {
                    continue;
                }
                let shared = read(cpu, &format!("{base}/shared_cpu_list")).unwrap_or_default();
                let slot = match caches.iter().position(|(l, _)| *l == level) {
                    Some(p) => p,
                    None => {
                        caches.push((level, vec![String::new(); ncpus]));
                        caches.len() - 1
                    }
                };
                caches[slot].1[cpu] = shared;
            }
        }
        caches.sort_by_key(|(l, _)| *l);
        let mut keyed = vec![core];
        keyed.extend(caches.into_iter().map(|(_, k)| k));
        keyed.push(package);
        let levels = keyed.into_iter().map(|keys| number(&keys)).collect();
        Ok(Topology::from_levels(ncpus, levels))
    }

    /// Number of CPU ids covered.
    pub fn cpus(&self) -> usize {
        self.ncpus
    }

    /// Number of levels, root included (1 for a flat topology).
    pub fn depth(&self) -> usize {
        self.levels.len() + 1
    }

    /// Number of groups at `level` (0 = finest; `depth() - 1` is the root, 1 group).
    pub fn groups(&self, level: usize) -> usize {
        self.levels.get(level).map_or(1, |l| l.iter().max().map_or(1, |m| m + 1))
    }

    /// Group of `cpu` at `level` (root: 0).
    pub fn group_of(&self, level: usize, cpu: usize) -> usize {
        self.levels.get(level).map_or(0, |l| l[cpu % self.ncpus])
    }
}

/// Numbers the distinct keys 0, 1, ... in order of first appearance.
fn number<K: std::hash::Hash + Eq + Clone>(keys: &[K]) -> Vec<usize> {
    let mut ids = HashMap::new();
    keys.iter()
        .map(|k| {
            let n = ids.len();
            *ids.entry(k.clone()).or_insert(n)
        })
        .collect()
}

/// Nests each level inside the next coarser one and drops levels that add nothing.
fn normalize(ncpus: usize, levels: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
    // Compose from the coarsest: a group is (own key, group one level up).
    let mut composed: Vec<Vec<usize>> = Vec::new();
    let mut above = vec![0usize; ncpus];
    for lvl in levels.iter().rev() {
        let keys: Vec<(usize, usize)> = (0..ncpus).map(|c| (lvl[c], above[c])).collect();
        let ids = number(&keys);
        composed.push(ids.clone());
        above = ids;
    }
    composed.reverse();
    // Drop a level with one group, or with as many groups as the next coarser one (the same
    // partition, since it refines it).
    let count = |l: &Vec<usize>| l.iter().max().map_or(1, |m| m + 1);
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (i, l) in composed.iter().enumerate() {
        let n = count(l);
        let next = composed.get(i + 1).map_or(1, count);
        if n > 1 && n != next {
            out.push(l.clone());
        }
    }
    out
}

/// The CPU the calling thread runs on right now (0 where unknown).
#[inline]
pub(crate) fn current_cpu() -> usize {
    #[cfg(all(target_os = "linux", not(loom)))]
    {
        // SAFETY: `sched_getcpu` takes no arguments and only reads the calling thread's CPU;
        // it returns -1 on error, handled below.
        let c = unsafe { libc::sched_getcpu() };
        if c >= 0 {
            return c as usize;
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_nests_and_drops_redundant_levels() {
        // 8 CPUs: cores of 2, a level identical to cores, sockets of 4, one package.
        let t = Topology::from_levels(
            8,
            vec![
                vec![0, 0, 1, 1, 2, 2, 3, 3],
                vec![0, 0, 1, 1, 2, 2, 3, 3],
                vec![0, 0, 0, 0, 1, 1, 1, 1],
                vec![0; 8],
            ],
        );
        assert_eq!(t.depth(), 3);
        assert_eq!(t.groups(0), 4);
        assert_eq!(t.groups(1), 2);
        assert_eq!(t.group_of(1, 5), t.group_of(1, 7));
        assert_ne!(t.group_of(1, 1), t.group_of(1, 5));
    }

    #[test]
    fn detect_covers_every_cpu() {
        let t = Topology::detect();
        assert!(t.cpus() >= 1);
        assert!(t.depth() >= 1);
        for cpu in 0..t.cpus() {
            for l in 0..t.depth() {
                assert!(t.group_of(l, cpu) < t.groups(l));
            }
        }
    }
}
