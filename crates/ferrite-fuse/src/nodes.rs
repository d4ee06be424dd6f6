//! FUSE node ids and the kernel's lookup counts.
//!
//! The kernel names inodes by a 64-bit node id and keeps a lookup count per node id:
//! every entry reply (lookup, create, mkdir, symlink, link, readdirplus) adds one, and
//! `forget(n)` takes `n` away. A node id must keep naming the same object until its
//! count drops to zero, even if that object was unlinked or removed meanwhile.
//!
//! Invariants:
//! - A node is the pair (core inode number, slot generation). Its node id is the core
//!   inode number (so `st_ino` is stable across remounts), unless that number is still
//!   held by the kernel for an older generation; then a fresh id from [`ALT_BASE`]
//!   upwards is used. Node ids are therefore never shared by two objects.
//! - Every lookup counted here holds one core `open` pin (taken by the caller before
//!   [`NodeTable::add`], released by the caller for the count returned by
//!   [`NodeTable::forget`]), so the core never frees or reuses an inode while the kernel
//!   can still name it: an unlinked file or removed directory lives until its last
//!   forget or release. (With pins an older generation cannot linger, so alternate ids
//!   are a safety net, not a normal path.) An open directory needs no pin of its own:
//!   the kernel keeps its inode, and so its lookup count, while a file is open on it.
//! - The root (node id 1) is never removed and never pinned.

use parking_lot::Mutex;
use std::collections::HashMap;

/// FUSE node id of the root directory.
pub const ROOT_NODE: u64 = 1;
/// First node id handed out when an inode number is still taken by an older node.
pub const ALT_BASE: u64 = ferrite_direct::ALT_NODE_BASE;

/// What a node id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    /// Core inode number.
    pub ino: u64,
    /// Slot generation of that inode when the node was made.
    pub generation: u64,
}

struct Entry {
    node: Node,
    nlookup: u64,
}

#[derive(Default)]
struct Inner {
    nodes: HashMap<u64, Entry>,
    by_key: HashMap<(u64, u64), u64>,
    next_alt: u64,
}

/// Node ids known to the kernel.
pub struct NodeTable {
    inner: Mutex<Inner>,
}

impl NodeTable {
    /// A table holding only the root, with its generation.
    pub fn new(root_generation: u64) -> NodeTable {
        let mut inner = Inner { next_alt: ALT_BASE, ..Default::default() };
        let node = Node { ino: ROOT_NODE, generation: root_generation };
        inner.nodes.insert(ROOT_NODE, Entry { node, nlookup: 1 });
        inner.by_key.insert((ROOT_NODE, root_generation), ROOT_NODE);
        NodeTable { inner: Mutex::new(inner) }
    }

    /// The node a node id names.
    pub fn get(&self, nodeid: u64) -> Option<Node> {
        self.inner.lock().nodes.get(&nodeid).map(|e| e.node)
    }

    /// The node id of (ino, generation), if the kernel knows it.
    pub fn nodeid_of(&self, ino: u64, generation: u64) -> Option<u64> {
        self.inner.lock().by_key.get(&(ino, generation)).copied()
    }

    /// Count one lookup of (ino, generation); returns its node id.
    pub fn add(&self, ino: u64, generation: u64) -> u64 {
        let mut g = self.inner.lock();
        if let Some(&id) = g.by_key.get(&(ino, generation)) {
            if let Some(e) = g.nodes.get_mut(&id) {
                e.nlookup += 1;
                return id;
            }
        }
        let id = if g.nodes.contains_key(&ino) {
            let id = g.next_alt;
            g.next_alt += 1;
            id
        } else {
            ino
        };
        g.nodes.insert(id, Entry { node: Node { ino, generation }, nlookup: 1 });
        g.by_key.insert((ino, generation), id);
        id
    }

    /// Take `n` lookups away from a node id. Returns the node and how many lookups
    /// were actually dropped (the caller releases that many pins).
    /// The node is removed when its count reaches zero; the root never is.
    pub fn forget(&self, nodeid: u64, n: u64) -> Option<(Node, u64)> {
        if nodeid == ROOT_NODE {
            return None;
        }
        let mut g = self.inner.lock();
        let e = g.nodes.get_mut(&nodeid)?;
        let dropped = n.min(e.nlookup);
        e.nlookup -= dropped;
        let node = e.node;
        if e.nlookup == 0 {
            g.nodes.remove(&nodeid);
            if g.by_key.get(&(node.ino, node.generation)) == Some(&nodeid) {
                g.by_key.remove(&(node.ino, node.generation));
            }
        }
        Some((node, dropped))
    }

    /// Number of node ids known (the root included).
    pub fn len(&self) -> usize {
        self.inner.lock().nodes.len()
    }

    /// Only the root is known?
    pub fn is_empty(&self) -> bool {
        self.len() <= 1
    }

    /// Lookup count of a node id (0 if unknown).
    pub fn lookups(&self, nodeid: u64) -> u64 {
        self.inner.lock().nodes.get(&nodeid).map_or(0, |e| e.nlookup)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_id_is_the_inode_number_and_counts_lookups() {
        let t = NodeTable::new(1);
        assert_eq!(t.add(7, 3), 7);
        assert_eq!(t.add(7, 3), 7);
        assert_eq!(t.lookups(7), 2);
        assert_eq!(t.forget(7, 1).map(|(_, d)| d), Some(1));
        assert_eq!(t.get(7), Some(Node { ino: 7, generation: 3 }));
        assert_eq!(t.forget(7, 5).map(|(_, d)| d), Some(1), "only what was counted is dropped");
        assert_eq!(t.get(7), None);
        assert_eq!(t.nodeid_of(7, 3), None);
        assert!(t.forget(7, 1).is_none());
    }

    #[test]
    fn reused_inode_number_gets_a_fresh_node_id() {
        let t = NodeTable::new(1);
        // An object the kernel still knows is gone and the core reused its number.
        assert_eq!(t.add(9, 1), 9);
        let alt = t.add(9, 3);
        assert!(alt >= ALT_BASE);
        assert_eq!(t.get(9).map(|n| n.generation), Some(1));
        assert_eq!(t.get(alt).map(|n| n.generation), Some(3));
        assert_eq!(t.add(9, 3), alt, "same object, same node id");
        t.forget(9, 1);
        assert_eq!(t.add(9, 3), alt, "still known under its alternate id");
        t.forget(alt, 3);
        assert_eq!(t.get(alt), None);
        assert_eq!(t.add(9, 3), 9, "number free again: the id is the number");
    }

    #[test]
    fn root_is_never_forgotten() {
        let t = NodeTable::new(5);
        assert!(t.forget(ROOT_NODE, 10).is_none());
        assert_eq!(t.get(ROOT_NODE), Some(Node { ino: 1, generation: 5 }));
        assert_eq!(t.add(1, 5), ROOT_NODE);
        assert!(t.is_empty());
    }
}
