//! NUMA placement of file data (the ASPLOS '19 paper's finding that placement
//! matters; issue 13). The pool's data area is striped by node: its shards are
//! split into as many contiguous groups as there are memory nodes, group k on node
//! k (the pool file's pages are bound there where the kernel can: see
//! docs/NUMA.md). New data goes to the shards of the writer's node, or of the node
//! a file's policy names (`user.ferrite.numa` = "local" or a node number); a node
//! whose shards are full spills to the others, as the allocator always does.
//!
//! Invariants:
//! - With one node (or fewer shards than nodes) placement is exactly the per-thread
//!   shard choice of before: nothing changes on a one-node machine.
//! - The topology is read once per process: from `FERRITE_NUMA_NODES` (a simulated
//!   topology, with CPU c on node c mod n unless a thread names its node with
//!   [`set_thread_node`]) or from /sys/devices/system/node.
//! - A policy names a node below the topology's count; any other value is refused
//!   when it is set (EINVAL), and one read from media that no longer fits (a pool
//!   moved to a smaller machine) falls back to the writer's node.
#![allow(unsafe_code)]

use std::cell::Cell;

/// The extended attribute that holds a file's placement policy.
pub const POLICY_XATTR: &[u8] = b"user.ferrite.numa";

/// Where new data of a file goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// The node of the thread that writes (the default).
    Local,
    /// A fixed node.
    Node(u32),
}

impl Policy {
    /// Parse a policy value: "local" or a node number (trailing newline allowed).
    pub fn parse(v: &[u8]) -> Option<Policy> {
        let s = std::str::from_utf8(v).ok()?.trim_end_matches('\n');
        if s == "local" {
            return Some(Policy::Local);
        }
        s.parse().ok().map(Policy::Node)
    }
}

/// The memory nodes of this machine, as placement sees them.
#[derive(Clone, Debug)]
pub struct Topology {
    nodes: u32,
    simulated: bool,
    /// Node of each CPU (real topologies).
    cpu_node: Vec<u32>,
}

thread_local! {
    static THREAD_NODE: Cell<Option<u32>> = const { Cell::new(None) };
}

/// The numbers of a kernel list ("0-3,8,10-11\n", as sysfs writes CPU and node
/// sets); None when malformed or longer than 65,536 numbers.
fn parse_list(t: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in t.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let a = part.parse::<u32>().ok()?;
                (a, a)
            }
        };
        if a > b || out.len() as u64 + (b - a) as u64 >= 1 << 16 {
            return None;
        }
        out.extend(a..=b);
    }
    Some(out)
}

/// In a simulated topology: the node this thread runs on (None: by its CPU).
pub fn set_thread_node(node: Option<u32>) {
    THREAD_NODE.with(|n| n.set(node));
}

fn current_cpu() -> u32 {
    // SAFETY: sched_getcpu takes no arguments and only reads the CPU number.
    let c = unsafe { libc::sched_getcpu() };
    c.max(0) as u32
}

impl Topology {
    /// One node.
    pub fn single() -> Topology {
        Topology { nodes: 1, simulated: false, cpu_node: Vec::new() }
    }

    /// `n` simulated nodes.
    pub fn simulated(n: u32) -> Topology {
        Topology { nodes: n.max(1), simulated: true, cpu_node: Vec::new() }
    }

    /// This machine's topology (or the simulated one `FERRITE_NUMA_NODES` asks for),
    /// read once per process: mounts do not walk /sys again.
    pub fn detect() -> Topology {
        static T: std::sync::OnceLock<Topology> = std::sync::OnceLock::new();
        T.get_or_init(Topology::read).clone()
    }

    fn read() -> Topology {
        if let Some(n) = std::env::var("FERRITE_NUMA_NODES").ok().and_then(|v| v.parse().ok()) {
            return Topology::simulated(n);
        }
        Topology::read_sysfs()
    }

    fn read_sysfs() -> Topology {
        // The online nodes, then each one's CPUs: one small file on a one-node
        // machine. Every preloaded process reads this when it attaches, and the
        // listing of a node's directory (a link per CPU and per memory block) took
        // about 0.2 ms of each on a 2-CPU VM (estimated from perf's share of samples).
        const SYS: &str = "/sys/devices/system/node";
        if let Some(online) =
            std::fs::read_to_string(format!("{SYS}/online")).ok().and_then(|t| parse_list(&t))
        {
            let cpus = |k: u32| {
                std::fs::read_to_string(format!("{SYS}/node{k}/cpulist"))
                    .ok()
                    .and_then(|t| parse_list(&t))
            };
            if let Some(t) = Topology::from_lists(&online, cpus) {
                return t;
            }
        }
        Topology::walk()
    }

    /// From the online node numbers and each node's CPU list; None when a list
    /// cannot be read (the caller walks the directory instead).
    fn from_lists(online: &[u32], cpus: impl Fn(u32) -> Option<Vec<u32>>) -> Option<Topology> {
        let nodes = online.iter().max().map_or(0, |&k| k + 1);
        if nodes <= 1 {
            return Some(Topology::single());
        }
        let mut cpu_node = Vec::new();
        for &k in online {
            for c in cpus(k)? {
                let c = c as usize;
                if cpu_node.len() <= c {
                    cpu_node.resize(c + 1, 0);
                }
                cpu_node[c] = k;
            }
        }
        Some(Topology { nodes, simulated: false, cpu_node })
    }

    /// From the node directories and the CPU links in each.
    fn walk() -> Topology {
        let mut cpu_node = Vec::new();
        let mut nodes = 0u32;
        let Ok(dir) = std::fs::read_dir("/sys/devices/system/node") else {
            return Topology::single();
        };
        for e in dir.flatten() {
            let name = e.file_name();
            let Some(k) = name.to_str().and_then(|s| s.strip_prefix("node")) else { continue };
            let Ok(k) = k.parse::<u32>() else { continue };
            nodes = nodes.max(k + 1);
            for c in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                let cn = c.file_name();
                if let Some(cpu) = cn.to_str().and_then(|s| s.strip_prefix("cpu")) {
                    if let Ok(cpu) = cpu.parse::<usize>() {
                        if cpu_node.len() <= cpu {
                            cpu_node.resize(cpu + 1, 0);
                        }
                        cpu_node[cpu] = k;
                    }
                }
            }
        }
        if nodes <= 1 {
            return Topology::single();
        }
        Topology { nodes, simulated: false, cpu_node }
    }

    /// Number of nodes.
    pub fn nodes(&self) -> u32 {
        self.nodes
    }

    /// Is this a simulated topology?
    pub fn is_simulated(&self) -> bool {
        self.simulated
    }

    /// The node the calling thread runs on.
    pub fn current_node(&self) -> u32 {
        if self.nodes <= 1 {
            return 0;
        }
        if let Some(n) = THREAD_NODE.with(|n| n.get()) {
            return n % self.nodes;
        }
        let cpu = current_cpu();
        if self.simulated {
            return cpu % self.nodes;
        }
        self.cpu_node.get(cpu as usize).copied().unwrap_or(0)
    }

    /// The shards `[a, b)` of node `k` among `nshards` (contiguous groups).
    pub fn node_shards(&self, k: u32, nshards: u32) -> (u32, u32) {
        if self.nodes <= 1 || nshards < self.nodes {
            return (0, nshards);
        }
        let k = k.min(self.nodes - 1);
        let a = (k as u64 * nshards as u64 / self.nodes as u64) as u32;
        let b = ((k as u64 + 1) * nshards as u64 / self.nodes as u64) as u32;
        (a, b)
    }

    /// The node whose shards hold shard `s`.
    pub fn shard_node(&self, s: u32, nshards: u32) -> u32 {
        if self.nodes <= 1 || nshards < self.nodes {
            return 0;
        }
        // The group whose range holds `s` (the inverse of `node_shards`).
        (0..self.nodes).find(|&k| s < self.node_shards(k, nshards).1).unwrap_or(self.nodes - 1)
    }
}

impl<M: crate::pmem::Medium> crate::fs::Fs<M> {
    /// Use topology `t` for placement from now on (tests, tools).
    pub fn with_topology(mut self, t: Topology) -> Self {
        self.topo = t;
        self.group_shards();
        self
    }

    /// Tell the block allocator which shards share a node: a single-block data
    /// allocation may reuse a block just freed into any shard of its node.
    pub(crate) fn group_shards(&self) {
        let (t, ns) = (&self.topo, self.geo.nshards);
        self.balloc.set_groups(|s| {
            if t.nodes() <= 1 || ns < t.nodes() {
                (0, ns)
            } else {
                t.node_shards(t.shard_node(s, ns), ns)
            }
        });
    }

    /// The placement topology.
    pub fn topology(&self) -> &Topology {
        &self.topo
    }

    /// The shard new data of inode `i` comes from: a shard of its policy's node or
    /// of the writer's node (a per-thread choice among that node's shards).
    pub(crate) fn data_shard(&self, i: &crate::fs::Inode, st: &crate::index::InodeState) -> u32 {
        if self.topo.nodes() <= 1 {
            return self.shard();
        }
        let node = match self.policy_of(i, st) {
            Some(Policy::Node(n)) if n < self.topo.nodes() => n,
            _ => self.topo.current_node(),
        };
        self.node_shard(node)
    }

    /// A shard of node `node`, chosen per thread.
    pub(crate) fn node_shard(&self, node: u32) -> u32 {
        let (a, b) = self.topo.node_shards(node, self.geo.nshards);
        a + crate::fs::shard_hint(b - a)
    }

    /// A shard of the writer's node (data not yet of any file: buffers).
    pub(crate) fn local_shard(&self) -> u32 {
        if self.topo.nodes() <= 1 {
            return self.shard();
        }
        self.node_shard(self.topo.current_node())
    }

    fn policy_of(&self, i: &crate::fs::Inode, st: &crate::index::InodeState) -> Option<Policy> {
        let r = st.xattrs.get(POLICY_XATTR)?;
        let v = crate::log::read_xattr(&self.m, i.seed, r).ok()?;
        Policy::parse(&v)
    }

    /// Check a policy value before it is stored: EINVAL unless it parses and
    /// names a node of this topology.
    pub(crate) fn check_policy(&self, value: &[u8]) -> crate::Result<()> {
        match Policy::parse(value) {
            Some(Policy::Local) => Ok(()),
            Some(Policy::Node(n)) if n < self.topo.nodes() => Ok(()),
            _ => Err(crate::Error::invalid("NUMA policy: \"local\" or a node of this machine")),
        }
    }

    /// The node of data block `b`.
    pub fn block_node(&self, b: u64) -> u32 {
        self.topo.shard_node(self.geo.block_shard(b), self.geo.nshards)
    }

    /// How many of regular file `ino`'s data pages live on each node.
    pub fn placement(&self, ino: u64) -> crate::Result<Vec<u64>> {
        let i = self.inode(ino)?;
        self.check_regular(&i)?;
        let mut per = vec![0u64; self.topo.nodes() as usize];
        let st = i.st.read();
        if let Some(f) = st.file() {
            for (_, e) in f.ext.iter() {
                for k in 0..e.len as u64 {
                    per[self.block_node(e.block + k) as usize] += 1;
                }
            }
        }
        Ok(per)
    }
}

impl crate::fs::Fs<crate::dax::MmapMedium> {
    /// Stripe the pool's data area over this machine's memory nodes: each node's
    /// shard group is bound to the node ([`crate::MmapMedium::bind_node`]; pages
    /// already allocated move). Nothing to do on one node or a simulated topology.
    /// Returns the nodes bound.
    pub fn bind_numa(&self) -> crate::Result<u32> {
        let t = &self.topo;
        if t.nodes() <= 1 || t.is_simulated() || self.geo.nshards < t.nodes() {
            return Ok(0);
        }
        for k in 0..t.nodes() {
            let (a, b) = t.node_shards(k, self.geo.nshards);
            let start = self.geo.shard_range(a).0;
            let end = self.geo.shard_range(b - 1).1;
            self.m
                .bind_node(start * crate::layout::BLOCK, (end - start) * crate::layout::BLOCK, k)
                .map_err(|err| crate::Error::Io {
                    path: format!("binding to node {k}").into(),
                    err,
                })?;
        }
        Ok(t.nodes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_and_cpu_lists_are_read_as_sysfs_writes_them() {
        assert_eq!(parse_list("0\n"), Some(vec![0]));
        assert_eq!(parse_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_list("\n"), Some(vec![]));
        for bad in ["3-1", "a", "1-", "0-4294967295", "-2"] {
            assert_eq!(parse_list(bad), None, "{bad}");
        }
        let one = Topology::from_lists(&[0], |_| None).unwrap();
        assert_eq!(one.nodes(), 1);
        let lists = |k: u32| Some(if k == 0 { vec![0, 1, 4] } else { vec![2, 3, 5] });
        let two = Topology::from_lists(&[0, 1], lists).unwrap();
        assert_eq!((two.nodes(), two.cpu_node.clone()), (2, vec![0, 0, 1, 1, 0, 1]));
        assert!(Topology::from_lists(&[0, 1], |_| None).is_none());
        // This machine: the lists and the directory walk agree.
        let (a, b) = (Topology::read_sysfs(), Topology::walk());
        assert_eq!((a.nodes(), a.cpu_node), (b.nodes(), b.cpu_node));
    }

    #[test]
    fn shards_split_into_contiguous_groups_per_node() {
        let t = Topology::simulated(2);
        assert_eq!(t.node_shards(0, 4), (0, 2));
        assert_eq!(t.node_shards(1, 4), (2, 4));
        assert_eq!(t.node_shards(1, 5), (2, 5));
        for s in 0..5 {
            let n = t.shard_node(s, 5);
            let (a, b) = t.node_shards(n, 5);
            assert!(a <= s && s < b, "shard {s} node {n}");
        }
        assert_eq!(Topology::single().node_shards(0, 4), (0, 4));
        assert_eq!(t.node_shards(1, 1), (0, 1), "fewer shards than nodes: no split");
    }

    #[test]
    fn policies_parse() {
        assert_eq!(Policy::parse(b"local"), Some(Policy::Local));
        assert_eq!(Policy::parse(b"1\n"), Some(Policy::Node(1)));
        assert_eq!(Policy::parse(b"near"), None);
        assert_eq!(Policy::parse(b"-1"), None);
    }

    #[test]
    fn a_thread_names_its_simulated_node() {
        let t = Topology::simulated(2);
        set_thread_node(Some(1));
        assert_eq!(t.current_node(), 1);
        set_thread_node(Some(0));
        assert_eq!(t.current_node(), 0);
        set_thread_node(None);
        assert!(t.current_node() < 2);
    }
}
