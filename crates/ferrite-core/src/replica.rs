//! The inode table's replica: a second copy of every slot's state, head, tail
//! and type, in its own region (docs/FORMAT.md, "Metadata replicas"). The
//! journals and the checkpoint keep their second copies themselves (`journal`,
//! `recovery`).
//!
//! Invariants:
//! - The primary slot is authoritative. A replica slot is a function of its
//!   primary ([`replica_of`]). Every store of a state or a head, and every
//!   journaled store, is followed by [`sync_slot`] before the fence that makes it
//!   durable; a commit's tail store is not (it would write and flush a second line
//!   per commit), and the clean unmount rewrites every replica ([`resync_slot`]). So on a cleanly unmounted pool every replica equals
//!   its primary's image and a difference is damage.
//! - After a crash or the death of a direct-access client, a replica's tail (and
//!   so its head) may be behind its primary's, and a head or state stored in the
//!   last fence window may be on either side ([`crash_consistent`]): recovery
//!   rewrites the replica from the primary, unless the primary no longer validates
//!   or differs in a way no crash explains, which is damage the replica repairs
//!   (its tail then found by walking the log on from the replica's).
//! - A replica is believed only when its checksum matches ([`replica_valid`]).

use crate::layout::{replica_of, replica_valid, Geometry, InodeSlot, INODE_SLOT, REPLICA_COVERED};
use crate::pmem::Medium;

/// The primary slot's bytes.
pub fn read_primary<M: Medium + ?Sized>(m: &M, geo: &Geometry, ino: u64) -> [u8; 64] {
    let mut b = [0u8; INODE_SLOT as usize];
    m.read(geo.slot_off(ino), &mut b);
    b
}

/// The replica slot's bytes, if the pool has replicas.
pub fn read_replica<M: Medium + ?Sized>(m: &M, geo: &Geometry, ino: u64) -> Option<[u8; 64]> {
    let off = geo.slot_replica_off(ino)?;
    let mut b = [0u8; INODE_SLOT as usize];
    m.read(off, &mut b);
    Some(b)
}

/// Rewrite `ino`'s replica from its primary as it is now: all 64 bytes, with
/// non-temporal stores (persistent after the caller's fence). Called after every
/// store to a primary slot word.
pub fn sync_slot<M: Medium + ?Sized>(m: &M, geo: &Geometry, ino: u64) {
    if geo.slot_replica_off(ino).is_none() {
        return;
    }
    let mut p = [0u8; REPLICA_COVERED];
    m.read(geo.slot_off(ino), &mut p);
    write_replica(m, geo, ino, &p);
}

/// Write `ino`'s replica from `covered`, the bytes of its primary a replica copies
/// (nothing on a pool without replicas; persistent after the caller's fence).
pub fn write_replica<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    ino: u64,
    covered: &[u8; REPLICA_COVERED],
) {
    let Some(off) = geo.slot_replica_off(ino) else { return };
    // The whole line with non-temporal stores: a new inode's replica line is cold,
    // and a cached store would first read it from memory.
    m.write_nt(off, &replica_of(covered));
}

/// Rewrite `ino`'s replica (all 64 bytes) if it is not its primary's image;
/// returns whether it wrote (flushed; the caller fences).
pub fn resync_slot<M: Medium + ?Sized>(m: &M, geo: &Geometry, ino: u64) -> bool {
    let Some(have) = read_replica(m, geo, ino) else { return false };
    let want = replica_of(&read_primary(m, geo, ino));
    if have == want {
        return false;
    }
    let off = geo.slot_replica_off(ino).expect("replicas");
    m.write(off, &want);
    m.flush(off, INODE_SLOT);
    true
}

/// Does `ino`'s replica disagree with its primary while being valid itself? Then
/// it holds the slot as it was last made durable, and the primary is damaged
/// (on a cleanly unmounted pool) or one step away (after a crash).
pub fn valid_replica_differs<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    ino: u64,
) -> Option<[u8; 64]> {
    let r = read_replica(m, geo, ino)?;
    (replica_valid(&r) && replica_of(&read_primary(m, geo, ino)) != r).then_some(r)
}

/// Could a crash (or a client's death) alone have left `replica` different from
/// `primary`, once the journals are recovered? Commits move a slot's tail without
/// its replica, and fast GC's head and a free's state are stored in the same
/// fence window as the replica's copy of them: so the head and tail may differ
/// freely and the state by one step from in use to free, never the type. Any
/// other difference (the type, a state from or to zero, or by more than one) is
/// damage to the primary.
pub fn crash_consistent(primary: &[u8], replica: &[u8]) -> bool {
    let (p, r) = (InodeSlot::decode(primary), InodeSlot::decode(replica));
    let (lo, hi) = (p.state.min(r.state), p.state.max(r.state));
    p.ftype == r.ftype && (lo == hi || (lo & 1 == 1 && hi == lo + 1))
}

/// Write the replica of a never-used slot into every replica slot (mkfs; the
/// caller fences).
pub fn format_table<M: Medium + ?Sized>(m: &M, geo: &Geometry) {
    let Some(start) = geo.ritable_start() else { return };
    let one = replica_of(&[0u8; INODE_SLOT as usize]);
    let per = crate::layout::BLOCK / INODE_SLOT;
    let mut page = vec![0u8; crate::layout::BLOCK as usize];
    for k in 0..per as usize {
        page[k * 64..(k + 1) * 64].copy_from_slice(&one);
    }
    for blk in 0..geo.itable_blocks {
        let first = blk * per + 1;
        let n = (geo.ninodes + 1 - first).min(per) as usize;
        // Bytes past the last slot stay zero.
        m.write_nt((start + blk) * crate::layout::BLOCK, &page[..n * 64]);
    }
}

/// Write the slot a valid replica holds into the primary: bytes 0..28 from it,
/// 28..64 zero (flushed; the caller fences). For repair only: the caller holds
/// the pool exclusively.
pub fn restore_primary<M: Medium + ?Sized>(m: &M, geo: &Geometry, ino: u64, replica: &[u8; 64]) {
    debug_assert!(replica_valid(replica), "restoring from a damaged replica");
    let mut p = [0u8; INODE_SLOT as usize];
    p[..REPLICA_COVERED].copy_from_slice(&replica[..REPLICA_COVERED]);
    let off = geo.slot_off(ino);
    m.write(off, &p);
    m.flush(off, INODE_SLOT);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::BLOCK;
    use crate::pmem::persist_u64;
    use crate::sim::SimMedium;

    #[test]
    fn replica_follows_primary_and_restores_it() {
        let g = Geometry::compute(256, 2, 64).unwrap();
        let m = SimMedium::new(256 * BLOCK);
        // Never used: the zero replica is not valid until mkfs writes it.
        assert!(crate::layout::replica_valid(&replica_of(&[0; 64])));
        assert!(!crate::layout::replica_valid(&[0; 64]));
        assert!(resync_slot(&m, &g, 5));
        assert!(valid_replica_differs(&m, &g, 5).is_none());
        let s = InodeSlot {
            state: 3,
            head: 4096 * 40,
            tail: 4096 * 40 + 64,
            ftype: 2,
            ..Default::default()
        };
        m.write(g.slot_off(5), &s.encode());
        sync_slot(&m, &g, 5);
        assert!(valid_replica_differs(&m, &g, 5).is_none());
        let before = read_replica(&m, &g, 5).unwrap();
        persist_u64(&m, g.slot_off(5) + 8, 0xdead_beef); // damage the head
        let r = valid_replica_differs(&m, &g, 5).expect("the replica disagrees");
        assert_eq!(r, before);
        restore_primary(&m, &g, 5, &r);
        assert_eq!(InodeSlot::decode(&read_primary(&m, &g, 5)), s);
        // A damaged replica is never believed.
        let off = g.slot_replica_off(5).unwrap();
        persist_u64(&m, off + 16, 7);
        assert!(valid_replica_differs(&m, &g, 5).is_none());
        assert!(resync_slot(&m, &g, 5));
        assert!(valid_replica_differs(&m, &g, 5).is_none());
    }

    #[test]
    fn crash_consistent_is_what_stores_outside_the_journal_make() {
        let s = InodeSlot {
            state: 3,
            head: 1 << 20,
            tail: (1 << 20) + 88,
            ftype: 1,
            ..Default::default()
        };
        let step = |f: &dyn Fn(&mut InodeSlot)| {
            let mut t = s;
            f(&mut t);
            crash_consistent(&s.encode(), &t.encode())
        };
        assert!(step(&|_| {}));
        assert!(step(&|t| t.tail += 640)); // commits
        assert!(step(&|t| {
            t.head += 4096; // fast GC after commits
            t.tail += 64;
        }));
        assert!(step(&|t| t.state += 1)); // a free
        assert!(!step(&|t| t.state = 0)); // a zeroed state
        assert!(!step(&|t| t.state += 2));
        assert!(!step(&|t| t.ftype = 2));
        let free = InodeSlot { state: 4, ..s };
        let mut t = free;
        t.state = 5; // even to odd is a create: journaled, never a single store
        assert!(!crash_consistent(&free.encode(), &t.encode()));
    }

    #[test]
    fn pools_without_replicas_have_no_replica_slots() {
        let g = Geometry::compute_with(256, 2, 64, false).unwrap();
        let m = SimMedium::new(256 * BLOCK);
        assert!(read_replica(&m, &g, 1).is_none());
        sync_slot(&m, &g, 1);
        assert!(!resync_slot(&m, &g, 1));
        assert_eq!(g.journal_offs(0)[1], None);
        assert_eq!(g.ckpt_starts()[1], None);
        let r = Geometry::compute(256, 2, 64).unwrap();
        assert_eq!(r.data_start, g.data_start + g.journal_blocks + g.itable_blocks + g.ckpt_blocks);
    }
}
