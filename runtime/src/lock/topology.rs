//! Machine topology for [`super::Hmcs`]: which CPUs share a core, a cache, a package.
//!
//! Two readers build the same level structure:
//!
//! * `Topology::from_hwloc` (cargo feature `hwloc` of `weft`; Debian `libhwloc-dev` and
//!   `pkg-config` at build time): cores, data/unified caches L1 to L5, NUMA nodes (CPUs with
//!   the same set of local NUMA nodes) and packages, from hwloc's object tree.
//! * [`Topology::from_sysfs`] (always built): `/sys/devices/system/cpu/cpu*/topology/{core_id,
//!   physical_package_id}` and `cpu*/cache/index*/{level,type,shared_cpu_list}`.
//!
//! [`Topology::detect`] tries hwloc first when the feature is on, then sysfs; where neither can
//! be read the topology is flat (one level, HMCS then behaves as MCS).
//!
//! Levels are stored finest first (core, then each shared cache, then NUMA node (hwloc only)
//! and package); a level that groups CPUs exactly as the next coarser one, or that has a single
//! group, is dropped, and the root (all CPUs) is implicit. Groups are nested by construction: a group at level `l` is the
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
    /// This machine's topology: from hwloc when the `hwloc` feature is on and hwloc can load
    /// it (read once per process, then cloned), else from sysfs, else [`Topology::flat`] over
    /// the available parallelism.
    pub fn detect() -> Topology {
        #[cfg(feature = "hwloc")]
        {
            static HWLOC: std::sync::OnceLock<Option<Topology>> = std::sync::OnceLock::new();
            if let Some(t) = HWLOC.get_or_init(|| Topology::from_hwloc().ok()) {
                return t.clone();
            }
        }
        Topology::from_sysfs(Path::new("/sys/devices/system/cpu"))
            .unwrap_or_else(|_| Topology::flat(std::thread::available_parallelism().map_or(1, |n| n.get())))
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

    /// Reads the topology through hwloc (feature `hwloc`): the partitions of the OS CPU ids by
    /// core, by each data/unified cache level, by NUMA locality and by package, ordered finest
    /// first and then nested and reduced as for [`Topology::from_levels`]. CPUs that the process
    /// may not run on (cgroups) are included, as in sysfs. A CPU id that no object of a kind
    /// covers (e.g. offline) gets a group of its own at that level.
    ///
    /// Errors when hwloc cannot load the topology or reports no CPU. hwloc is never allowed to
    /// unwind into the caller: a panic inside the binding becomes an error as well.
    #[cfg(feature = "hwloc")]
    pub fn from_hwloc() -> io::Result<Topology> {
        std::panic::catch_unwind(hwloc_reader::read)
            .unwrap_or_else(|_| Err(io::Error::other("hwloc: the binding panicked while reading the topology")))
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

/// The hwloc reader. Only calls of `hwloc2` that cannot panic for the arguments given are used:
/// depths come from `depth()` and are only passed back below it, and no NUMA-node query by type
/// is made (hwloc2 2.2 maps hwloc 2's virtual NUMA depth to its bridge depth and panics in
/// `objects_with_type(&ObjectType::NUMANode)`); NUMA locality is each core's `nodeset` instead.
/// Fields of hwloc objects read: `cpuset`, `complete_cpuset`, `nodeset`, which hwloc2 2.2 lays
/// out as hwloc 2.x does.
#[cfg(feature = "hwloc")]
mod hwloc_reader {
    use std::io;

    use hwloc2::{ObjectType, TopologyFlag, TopologyObject};

    use super::{number, Topology};

    /// A candidate level: CPU id -> identity of the object covering it (`None`: not covered).
    type Keys = Vec<Option<(u32, usize)>>;

    pub(super) fn read() -> io::Result<Topology> {
        // Disallowed CPUs are included so that CPU ids and groups match sysfs.
        let hw = hwloc2::Topology::with_flags(vec![TopologyFlag::IncludeDisallowed])
            .ok_or_else(|| io::Error::other("hwloc: cannot load the topology"))?;
        let depth = hw.depth();
        // Objects of each kind of interest, by depth (a kind may sit at several depths on
        // asymmetric machines).
        let mut cores: Vec<&TopologyObject> = Vec::new();
        let mut pus: Vec<&TopologyObject> = Vec::new();
        let mut packages: Vec<(u32, &TopologyObject)> = Vec::new();
        let mut caches: Vec<(u32, Vec<(u32, &TopologyObject)>)> = Vec::new();
        for d in 0..depth {
            let objs = hw.objects_at_depth(d);
            let cache_level = match hw.type_at_depth(d) {
                ObjectType::Core => {
                    cores.extend(objs);
                    continue;
                }
                ObjectType::PU => {
                    pus.extend(objs);
                    continue;
                }
                ObjectType::Package => {
                    packages.extend(objs.into_iter().map(|o| (d, o)));
                    continue;
                }
                ObjectType::L1Cache => 1,
                ObjectType::L2Cache => 2,
                ObjectType::L3Cache => 3,
                ObjectType::L4Cache => 4,
                ObjectType::L5Cache => 5,
                _ => continue,
            };
            match caches.iter_mut().find(|(l, _)| *l == cache_level) {
                Some((_, v)) => v.extend(objs.into_iter().map(|o| (d, o))),
                None => caches.push((cache_level, objs.into_iter().map(|o| (d, o)).collect())),
            }
        }
        let highest_pu = pus.iter().flat_map(|o| cpus_of(o)).max();
        let highest_complete = hw
            .objects_at_depth(0)
            .first()
            .and_then(|root| root.complete_cpuset())
            .map(|s| s.last())
            .filter(|&l| l >= 0)
            .map(|l| l as usize);
        let ncpus = match (highest_pu, highest_complete) {
            (None, _) => return Err(io::Error::other("hwloc: no processing unit in the topology")),
            (Some(a), b) => a.max(b.unwrap_or(0)) + 1,
        };

        let partition = |objs: &[(u32, &TopologyObject)]| -> Keys {
            let mut keys = vec![None; ncpus];
            for (i, (d, o)) in objs.iter().enumerate() {
                for cpu in cpus_of(o).filter(|&c| c < ncpus) {
                    keys[cpu] = Some((*d, i));
                }
            }
            keys
        };
        // Without core objects every PU is its own core.
        let core_objs: Vec<(u32, &TopologyObject)> =
            if cores.is_empty() { pus.iter().map(|&o| (0, o)).collect() } else { cores.iter().map(|&o| (0, o)).collect() };
        let mut candidates: Vec<Keys> = vec![partition(&core_objs)];
        caches.sort_by_key(|(l, _)| *l);
        candidates.extend(caches.iter().map(|(_, objs)| partition(objs)));
        // NUMA locality: CPUs of cores with the same set of local NUMA nodes.
        let mut numa: Vec<Option<Vec<u32>>> = vec![None; ncpus];
        for (_, o) in &core_objs {
            let nodes: Vec<u32> = o.nodeset().map(|s| s.into_iter().collect()).unwrap_or_default();
            for cpu in cpus_of(o).filter(|&c| c < ncpus) {
                numa[cpu] = Some(nodes.clone());
            }
        }
        let numa_ids = number(&numa);
        candidates.push(numa_ids.iter().zip(&numa).map(|(&id, k)| k.as_ref().map(|_| (0, id))).collect());
        candidates.push(partition(&packages));

        // Finest first: a stable sort by group count keeps core < caches < NUMA < package
        // where counts tie, and puts e.g. sub-NUMA clusters below a package-wide L3.
        let mut levels: Vec<Vec<usize>> = candidates.iter().map(own_groups).collect();
        levels.sort_by_key(|l| std::cmp::Reverse(l.iter().max().map_or(0, |m| m + 1)));
        Ok(Topology::from_levels(ncpus, levels))
    }

    /// OS ids of the CPUs in `o`'s cpuset (empty when it has none).
    fn cpus_of(o: &TopologyObject) -> impl Iterator<Item = usize> {
        o.cpuset().into_iter().flatten().map(|c| c as usize)
    }

    /// Group numbers for a candidate level; every uncovered CPU is a group of its own.
    fn own_groups(keys: &Keys) -> Vec<usize> {
        let keyed: Vec<Result<(u32, usize), usize>> = keys.iter().enumerate().map(|(cpu, k)| k.ok_or(cpu)).collect();
        number(&keyed)
    }
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

/// The CPUs the calling thread may run on (its affinity mask), in increasing order; empty
/// where that cannot be read. `weftrun --bind-to core` and `weft-bench pingpong --bind core`
/// hand these out, one per process.
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(all(target_os = "linux", not(loom)))]
    {
        // SAFETY: a zeroed `cpu_set_t` is a valid empty set; `sched_getaffinity` writes at
        // most `size_of::<cpu_set_t>()` bytes into it (pid 0: the calling thread).
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
            return Vec::new();
        }
        // SAFETY: `CPU_ISSET` reads the set initialized above, below its capacity.
        (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
    }
    #[cfg(not(all(target_os = "linux", not(loom))))]
    {
        Vec::new()
    }
}

/// Makes the process `cmd` starts run on CPU `cpu` only, with every thread it starts (the
/// CPU set is built here, before the fork; the child only makes the `sched_setaffinity`
/// call). `weftrun --bind-to core` and `weft-bench pingpong --bind core` bind with it, one
/// CPU of [`allowed_cpus`] per process. A CPU beyond the set's capacity, or a platform
/// other than Linux, leaves `cmd` unbound.
pub fn bind_to_cpu(cmd: &mut std::process::Command, cpu: usize) {
    #[cfg(all(target_os = "linux", not(loom)))]
    {
        use std::os::unix::process::CommandExt;
        let Some(set) = one_cpu_set(cpu) else {
            return;
        };
        // SAFETY: the closure runs in the child between fork and exec and only makes the
        // async-signal-safe `sched_setaffinity` system call on data copied before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
    }
    #[cfg(not(all(target_os = "linux", not(loom))))]
    {
        let _ = (cmd, cpu);
    }
}

/// The CPU set holding `cpu` alone; `None` for a CPU beyond the set's capacity.
#[cfg(all(target_os = "linux", not(loom)))]
fn one_cpu_set(cpu: usize) -> Option<libc::cpu_set_t> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return None;
    }
    // SAFETY: a zeroed `cpu_set_t` is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below the set's capacity (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    Some(set)
}

/// Makes the calling thread run on CPU `cpu` only (`sched_setaffinity` of the calling
/// thread, not the process; threads it starts later inherit the binding).
/// `weft-bench multirate --bind core` places its workers with it. Fails where the CPU is
/// beyond the set's capacity, outside the process's allowed CPUs, or the platform is not
/// Linux.
pub fn bind_thread_to_cpu(cpu: usize) -> std::io::Result<()> {
    #[cfg(all(target_os = "linux", not(loom)))]
    {
        let set = one_cpu_set(cpu)
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("CPU {cpu} is beyond the CPU set's capacity")))?;
        // SAFETY: pid 0 is the calling thread; the set is initialized and its size given.
        if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
    #[cfg(not(all(target_os = "linux", not(loom))))]
    {
        let _ = cpu;
        Err(std::io::Error::new(std::io::ErrorKind::Unsupported, "binding threads to CPUs needs Linux"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn a_bound_thread_runs_on_its_cpu_only() {
        let cpus = allowed_cpus();
        let last = *cpus.last().expect("the process may run somewhere");
        std::thread::spawn(move || {
            bind_thread_to_cpu(last).expect("binding to an allowed CPU");
            assert_eq!(allowed_cpus(), vec![last]);
            assert_eq!(current_cpu(), last);
        })
        .join()
        .expect("bound thread");
        // Only the bound thread changed.
        assert_eq!(allowed_cpus(), cpus);
        assert!(bind_thread_to_cpu(libc::CPU_SETSIZE as usize).is_err(), "a CPU beyond the set is refused");
    }

    #[test]
    fn allowed_cpus_include_the_current_one() {
        let cpus = allowed_cpus();
        if cfg!(target_os = "linux") {
            assert!(!cpus.is_empty());
            assert!(cpus.windows(2).all(|w| w[0] < w[1]), "{cpus:?} not in increasing order");
            assert!(cpus.contains(&current_cpu()), "running on CPU {} outside {cpus:?}", current_cpu());
        }
    }

    #[test]
    fn normalize_nests_and_drops_redundant_levels() {
        // 8 CPUs: cores of 2, a level identical to cores, sockets of 4, one package.
        let t = Topology::from_levels(
            8,
            vec![vec![0, 0, 1, 1, 2, 2, 3, 3], vec![0, 0, 1, 1, 2, 2, 3, 3], vec![0, 0, 0, 0, 1, 1, 1, 1], vec![0; 8]],
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
