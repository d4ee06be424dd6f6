//! NUMA placement on a simulated two-node topology (this machine has one node):
//! new data goes to the writer's node, or to the node a file's policy
//! (`user.ferrite.numa`) names; a full node spills to the other; a policy survives
//! a remount; one node changes nothing.
mod common;
use common::*;
use ferrite_core::numa::{set_thread_node, Topology, POLICY_XATTR};
use ferrite_core::*;

const MB: u64 = 1 << 20;
const PG: usize = 4096;

fn two_nodes(size: u64) -> Fs<SimMedium> {
    fresh_sim(size, 4).with_topology(Topology::simulated(2))
}

fn file(fs: &Fs<SimMedium>, name: &[u8]) -> u64 {
    fs.create(fs.root(), name, 0o644, 0, 0).unwrap().ino
}

#[test]
fn data_goes_to_the_writers_node() {
    let fs = two_nodes(64 * MB);
    let a = file(&fs, b"a");
    let b = file(&fs, b"b");
    set_thread_node(Some(1));
    fs.write(a, 0, &pattern(1, 0, 64 * PG)).unwrap();
    set_thread_node(Some(0));
    fs.write(b, 0, &pattern(2, 0, 64 * PG)).unwrap();
    fs.fallocate(b, FallocMode::default(), 64 * PG as u64, 16 * PG as u64).unwrap();
    set_thread_node(None);
    assert_eq!(fs.placement(a).unwrap(), vec![0, 64]);
    assert_eq!(fs.placement(b).unwrap(), vec![80, 0]);
    assert_fsck_clean(&fs, "after placed writes");
}

#[test]
fn a_files_policy_wins_over_the_writers_node_and_survives_a_remount() {
    let fs = two_nodes(64 * MB);
    let f = file(&fs, b"f");
    fs.setxattr(f, POLICY_XATTR, b"1", XattrSet::Any).unwrap();
    set_thread_node(Some(0));
    fs.write(f, 0, &pattern(1, 0, 32 * PG)).unwrap();
    assert_eq!(fs.placement(f).unwrap(), vec![0, 32]);
    assert_eq!(errno(&fs.setxattr(f, POLICY_XATTR, b"2", XattrSet::Any)), libc::EINVAL);
    assert_eq!(errno(&fs.setxattr(f, POLICY_XATTR, b"near", XattrSet::Any)), libc::EINVAL);
    let fs = remount(fs, Remount::Clean).with_topology(Topology::simulated(2));
    fs.write(f, 32 * PG as u64, &pattern(2, 0, 16 * PG)).unwrap();
    assert_eq!(fs.placement(f).unwrap(), vec![0, 48], "the policy is on media");
    fs.setxattr(f, POLICY_XATTR, b"local", XattrSet::Any).unwrap();
    fs.write(f, 48 * PG as u64, &pattern(3, 0, 16 * PG)).unwrap();
    assert_eq!(fs.placement(f).unwrap(), vec![16, 48], "local: the writer's node again");
    set_thread_node(None);
}

#[test]
fn a_full_node_spills_to_the_other() {
    let fs = two_nodes(32 * MB);
    let f = file(&fs, b"big");
    set_thread_node(Some(1));
    let free = fs.statfs().bfree as usize;
    // More than node 1's half of the data area.
    let n = free * 3 / 4;
    let chunk = pattern(4, 0, 64 * PG);
    let mut at = 0;
    while at < n {
        let k = (n - at).min(64);
        fs.write(f, (at * PG) as u64, &chunk[..k * PG]).unwrap();
        at += k;
    }
    set_thread_node(None);
    let p = fs.placement(f).unwrap();
    assert_eq!(p.iter().sum::<u64>(), n as u64);
    assert!(p[1] > p[0] && p[0] > 0, "node 1 first, the rest spilled to node 0: {p:?}");
    assert_fsck_clean(&fs, "after spilling");
}

#[test]
fn one_node_changes_nothing() {
    let fs = fresh_sim(64 * MB, 4).with_topology(Topology::single());
    let f = file(&fs, b"f");
    fs.write(f, 0, &pattern(1, 0, 8 * PG)).unwrap();
    assert_eq!(fs.placement(f).unwrap(), vec![8]);
    assert_eq!(errno(&fs.setxattr(f, POLICY_XATTR, b"1", XattrSet::Any)), libc::EINVAL);
    fs.setxattr(f, POLICY_XATTR, b"0", XattrSet::Any).unwrap();
}

#[test]
fn binding_pool_pages_to_a_node_works_where_the_node_exists() {
    let dir = tempfile::Builder::new().prefix("ferrite-numa").tempdir_in("/dev/shm").unwrap();
    let m = MmapMedium::create(&dir.path().join("pool"), 16 * MB, &MapOptions::default()).unwrap();
    m.bind_node(MB, 4 * MB, 0).expect("node 0 exists on every machine");
    assert!(m.bind_node(MB, 4 * MB, 64).is_err(), "past the node mask");
    let fs = Fs::mkfs(m, &MkfsOptions { shards: 2, ..Default::default() }).unwrap();
    // One real node (or a simulated topology): nothing to stripe.
    let fs = fs.with_topology(Topology::single());
    assert_eq!(fs.bind_numa().unwrap(), 0);
    let fs = fs.with_topology(Topology::simulated(2));
    assert_eq!(fs.bind_numa().unwrap(), 0, "a simulated topology binds nothing");
    fs.unmount().unwrap();
}
