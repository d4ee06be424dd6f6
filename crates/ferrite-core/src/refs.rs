//! Shared data blocks (reflinks, issue 11): blocks that the logs of several files,
//! or several places of one file, map. Each block has a count of *extra*
//! references: the live mappings of it minus one.
//!
//! Invariants:
//! - The logs are the truth; no count is persisted per block. Recovery counts the
//!   references while it rebuilds the free map; a clean unmount records a summary
//!   in the checkpoint (shared blocks, extra references, a CRC32C of the list), and
//!   a clean mount of a pool whose summary is not empty counts again by walking
//!   every log, and compares.
//! - A reference is added *before* the commit that maps the block again, and
//!   dropped *after* the commit that unmaps it. A party that dies between the two
//!   leaves a count one too high: the block leaks (until the next recount), it is
//!   never freed while a log maps it.
//! - A block is freed only by the commit that drops its last reference: a free of
//!   a block with an extra reference drops the reference instead (`Fs::free_run`).
//! - A reference to a block of file A is added while A's hold and state lock are
//!   held, so no commit of A can drop A's reference meanwhile: a count is never
//!   raised on a block that is already free.
//! - Where the counts live: in the coordination table when the pool is shared, so
//!   every party sees the same words; else in this process's memory, allocated at
//!   the first share. Either way 4 bytes per pool block of zero-filled memory that
//!   the kernel backs a page (1,024 blocks) at a time as blocks get shared. A flag
//!   word says whether any block ever had one, so a pool that never shared pays
//!   one load per free.
//! - Shared blocks are never DAX pages (`mapping`): a mapping copies them first,
//!   since stores through it would change every file that maps them.

use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::layout::CkptShared;
use crate::pmem::Medium;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The counts of a pool nobody else shares.
#[derive(Default)]
pub(crate) struct LocalRefs {
    any: AtomicU32,
    words: OnceLock<Box<[AtomicU32]>>,
}

/// The summary a clean unmount records of the shared blocks `list` ((block,
/// extra references), ascending) in the checkpoint (format version 6; all zero
/// when the list is empty): their number, the extra references in all and a
/// CRC32C of the list, 12 bytes per pair, little-endian. Its own checksum is
/// made by `CkptShared::encode`.
pub fn summary(list: &[(u64, u32)]) -> CkptShared {
    let mut crc = 0u32;
    let mut extra = 0u64;
    for &(b, n) in list {
        let mut e = [0u8; 12];
        e[..8].copy_from_slice(&b.to_le_bytes());
        e[8..].copy_from_slice(&n.to_le_bytes());
        crc = crc32c::crc32c_append(crc, &e);
        extra += n as u64;
    }
    CkptShared { blocks: list.len() as u64, extra, list_crc: crc, csum: 0 }
}

/// Count a list of block numbers, one entry per extra reference, into
/// (block, extra references), ascending.
pub(crate) fn tally(mut extra: Vec<u64>) -> Vec<(u64, u32)> {
    extra.sort_unstable();
    let mut out: Vec<(u64, u32)> = Vec::new();
    for b in extra {
        match out.last_mut() {
            Some((x, n)) if *x == b => *n = n.saturating_add(1),
            _ => out.push((b, 1)),
        }
    }
    out
}

impl<M: Medium> Fs<M> {
    /// The flag word and, when allocated, the count words.
    fn ref_words(&self) -> (&AtomicU32, Option<&[AtomicU32]>) {
        match &self.share {
            Some(p) => {
                let (any, w) = p.table().refs();
                (any, Some(w))
            }
            None => (&self.refs.any, self.refs.words.get().map(|b| &**b)),
        }
    }

    /// The count words, allocated if need be, with the flag set.
    fn ref_words_mut(&self) -> &[AtomicU32] {
        let w = match &self.share {
            Some(p) => p.table().refs().1,
            None => self
                .refs
                .words
                .get_or_init(|| (0..self.geo.nblocks).map(|_| AtomicU32::new(0)).collect()),
        };
        self.ref_words().0.store(1, Ordering::SeqCst);
        w
    }

    /// Has any block of this pool had an extra reference since mount?
    #[inline]
    pub(crate) fn any_shared(&self) -> bool {
        self.ref_words().0.load(Ordering::Acquire) != 0
    }

    /// Extra references of block `b` (0: one file maps it, or none).
    #[inline]
    pub(crate) fn extra_refs(&self, b: u64) -> u32 {
        match self.ref_words() {
            (any, Some(w)) if any.load(Ordering::Acquire) != 0 => {
                w.get(b as usize).map_or(0, |x| x.load(Ordering::Acquire))
            }
            _ => 0,
        }
    }

    /// Add a reference to each of `blocks` (before the commit that maps them
    /// again). EMLINK when a block has as many as a count holds (nothing added).
    pub(crate) fn add_refs(&self, blocks: &[u64]) -> Result<()> {
        let w = self.ref_words_mut();
        for (k, &b) in blocks.iter().enumerate() {
            assert!(self.geo.is_data_block(b), "a reference to block {b}, not data");
            let r = w[b as usize]
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_add(1));
            if r.is_err() {
                for &x in &blocks[..k] {
                    self.drop_ref(x);
                }
                return Err(Error::TooManyLinks);
            }
        }
        Ok(())
    }

    /// Drop one extra reference of block `b` if it has one: true when it did (the
    /// block stays mapped elsewhere and must not be freed).
    pub(crate) fn drop_ref(&self, b: u64) -> bool {
        let (any, Some(w)) = self.ref_words() else { return false };
        if any.load(Ordering::Acquire) == 0 {
            return false;
        }
        let Some(x) = w.get(b as usize) else { return false };
        x.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok()
    }

    /// Every block with an extra reference: (block, extra references), ascending.
    pub fn shared_blocks(&self) -> Vec<(u64, u32)> {
        let (any, Some(w)) = self.ref_words() else { return Vec::new() };
        if any.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        w.iter()
            .enumerate()
            .filter_map(|(b, x)| {
                let n = x.load(Ordering::Acquire);
                (n > 0).then_some((b as u64, n))
            })
            .collect()
    }

    /// Before a commit that unmaps `[b, b + n)`: mark this party the owner of the
    /// blocks it will free (see `share`), not of those another file still maps: a
    /// party that died after the commit must not have them freed as its own. A
    /// block without an extra reference now keeps none (the committer holds the
    /// only file that maps it, so nobody can share it meanwhile).
    pub(crate) fn own_unshared(&self, p: &crate::share::Party, b: u64, n: u64) {
        if !self.any_shared() {
            p.own(b, n);
            return;
        }
        for x in b..b + n {
            if self.extra_refs(x) == 0 {
                p.own(x, 1);
            }
        }
    }

    /// Set the counts found by a mount's walk of the logs.
    pub(crate) fn load_refs(&self, list: &[(u64, u32)]) {
        if list.is_empty() {
            return;
        }
        let w = self.ref_words_mut();
        for &(b, n) in list {
            w[b as usize].store(n, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_each_extra_reference() {
        assert_eq!(tally(vec![9, 3, 9, 9, 4]), vec![(3, 1), (4, 1), (9, 3)]);
        assert!(tally(Vec::new()).is_empty());
    }

    #[test]
    fn summary_names_blocks_references_and_their_list() {
        let s = summary(&[(3, 1), (9, 3)]);
        assert_eq!((s.blocks, s.extra), (2, 4));
        assert_ne!(s.list_crc, summary(&[(3, 1), (9, 2)]).list_crc, "the list is in the CRC");
        assert_eq!(summary(&[]), CkptShared::default());
    }

    #[test]
    fn zeroed_words_are_zero_and_writable() {
        let w = crate::region::zeroed_words(1 << 20);
        assert!(w.iter().step_by(4099).all(|x| x.load(Ordering::Relaxed) == 0));
        w[(1 << 20) - 1].store(7, Ordering::Relaxed);
        assert_eq!(w[(1 << 20) - 1].load(Ordering::Relaxed), 7);
    }
}
