//! The extent map of a file: first page -> run of consecutive blocks, with the log
//! entry that mapped it. DRAM-only, rebuilt from the log.
//!
//! Layout: sorted leaves of at most [`LEAF`] packed 24-byte runs under a `BTreeMap`
//! keyed by each leaf's first page. A file written 4 KiB at a time in random order
//! has one run per page, so bytes per run are bytes of DRAM per 4 KiB of data (the
//! goal is under 41: 1% of the data). `ferrite bench` measured 63 B per page with a
//! `BTreeMap<u64, Ext>` (and a replay that collected the whole log), 45 B with these
//! leaves, and 37 B once replay streamed its entries.
//!
//! Invariants:
//! - Leaves are non-empty, sorted by first page, and keyed by their first page;
//!   every key of a leaf is below the next leaf's key.
//! - A run's block fits in [`BLOCK_BITS`] bits (blocks of a pool are below
//!   `MAX_BLOCKS` = 2^36) and its length is 1..=[`MAX_RUN`]; callers split longer
//!   runs. Runs never overlap (the file index removes before it inserts).

use crate::layout::MAX_BLOCKS;
use std::collections::BTreeMap;

/// Runs per leaf at most.
pub const LEAF: usize = 64;
/// Bits of a packed block number.
pub const BLOCK_BITS: u32 = 36;
/// Longest run one entry holds (pages).
pub const MAX_RUN: u32 = (1 << (64 - BLOCK_BITS)) - 1;
const _: () = assert!(MAX_BLOCKS <= 1 << BLOCK_BITS);

/// A run of file pages in consecutive blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ext {
    /// Pages in the run.
    pub len: u32,
    /// First block number.
    pub block: u64,
    /// Address of the WRITE entry that mapped it.
    pub loc: u64,
}

/// A run as stored: first page, block and length in one word, entry address.
#[derive(Clone, Copy, Debug)]
struct Packed {
    pg: u64,
    block_len: u64,
    loc: u64,
}
const _: () = assert!(std::mem::size_of::<Packed>() == 24);

impl Packed {
    fn new(pg: u64, e: Ext) -> Packed {
        assert!(e.block < 1 << BLOCK_BITS, "block {} beyond the packed range", e.block);
        assert!(e.len >= 1 && e.len <= MAX_RUN, "run of {} pages", e.len);
        Packed { pg, block_len: e.block | (e.len as u64) << BLOCK_BITS, loc: e.loc }
    }
    fn ext(&self) -> Ext {
        Ext {
            len: (self.block_len >> BLOCK_BITS) as u32,
            block: self.block_len & ((1 << BLOCK_BITS) - 1),
            loc: self.loc,
        }
    }
}

/// The index of the run starting at `pg` in `leaf` (`Ok`), or where it would go
/// (`Err`), as `binary_search`. A leaf of one-page runs in page order (a file
/// overwritten page by page at random ends up so) holds page `leaf[0].pg + i` at
/// `i`: that slot is tried first, two cache lines where the search reads six.
fn find(leaf: &[Packed], pg: u64) -> Result<usize, usize> {
    let guess = leaf.first().map_or(usize::MAX, |f| guess(f.pg, pg));
    if leaf.get(guess).is_some_and(|p| p.pg == pg) {
        return Ok(guess);
    }
    leaf.binary_search_by_key(&pg, |q| q.pg)
}

/// The slot of page `pg` in a leaf of one-page runs in page order that starts at
/// page `first` (past the end, or `usize::MAX`, when `pg` is not in such a leaf).
fn guess(first: u64, pg: u64) -> usize {
    usize::try_from(pg.wrapping_sub(first)).unwrap_or(usize::MAX)
}

/// Runs keyed by first page.
#[derive(Clone, Debug, Default)]
pub struct ExtMap {
    leaves: BTreeMap<u64, Vec<Packed>>,
    len: usize,
}

impl ExtMap {
    /// Number of runs.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No runs.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The run with the greatest first page at or below `pg`.
    pub fn floor(&self, pg: u64) -> Option<(u64, Ext)> {
        let (_, leaf) = self.leaves.range(..=pg).next_back()?;
        let i = match find(leaf, pg) {
            Ok(i) => i,
            Err(i) => {
                debug_assert!(i >= 1, "a leaf's first page is its key");
                i - 1
            }
        };
        let p = &leaf[i];
        Some((p.pg, p.ext()))
    }

    /// Ask the cache for the lines where a search for `pg` will look in its leaf
    /// (the leaf's start and the slot `find` tries first), so that an update of
    /// the map after a data copy finds them there.
    pub fn prefetch(&self, pg: u64) {
        if let Some((&k, leaf)) = self.leaves.range(..=pg).next_back() {
            let slot = guess(k, pg).min(leaf.len().saturating_sub(1));
            crate::pmem::prefetch_dram(leaf.as_ptr());
            crate::pmem::prefetch_dram(leaf.as_ptr().wrapping_add(slot));
        }
    }

    /// The run with the greatest first page below `pg`.
    pub fn below(&self, pg: u64) -> Option<(u64, Ext)> {
        self.floor(pg.checked_sub(1)?)
    }

    /// First pages of the runs starting in `[a, b)`.
    pub fn starts_in(&self, a: u64, b: u64) -> Vec<u64> {
        let mut out = Vec::new();
        if a >= b {
            return out;
        }
        let from = self.leaves.range(..=a).next_back().map_or(a, |(&k, _)| k);
        for leaf in self.leaves.range(from..b).map(|(_, l)| l) {
            out.extend(leaf.iter().map(|p| p.pg).filter(|&pg| pg >= a && pg < b));
        }
        out
    }

    /// Runs that overlap pages `[a, b)`, in page order (a walk of those runs only).
    pub fn runs_in(&self, a: u64, b: u64) -> impl Iterator<Item = (u64, Ext)> + '_ {
        let from = self.leaves.range(..=a).next_back().map_or(a, |(&k, _)| k);
        let leaves = if a < b { Some(self.leaves.range(from..b)) } else { None };
        leaves
            .into_iter()
            .flatten()
            .flat_map(|(_, l)| l.iter().map(|p| (p.pg, p.ext())))
            .filter(move |&(pg, e)| pg < b && pg + e.len as u64 > a)
    }

    /// Runs in page order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Ext)> + '_ {
        self.leaves.values().flat_map(|l| l.iter().map(|p| (p.pg, p.ext())))
    }

    /// The page after the last run (0 when empty).
    pub fn end(&self) -> u64 {
        self.leaves.last_key_value().map_or(0, |(_, l)| {
            let p = l.last().expect("leaves are not empty");
            p.pg + p.ext().len as u64
        })
    }

    /// Add a run after every other (`pg >= self.end()`): one search, as log replay
    /// and thorough GC add the runs of a file in page order.
    pub fn push_back(&mut self, pg: u64, e: Ext) {
        assert!(pg >= self.end(), "push_back of page {pg} before the end {}", self.end());
        let p = Packed::new(pg, e);
        match self.leaves.last_entry() {
            Some(mut l) if l.get().len() < LEAF => l.get_mut().push(p),
            _ => {
                self.leaves.insert(pg, vec![p]);
            }
        }
        self.len += 1;
    }

    /// Set the run starting at `pg` (replacing one that starts there).
    pub fn insert(&mut self, pg: u64, e: Ext) {
        let p = Packed::new(pg, e);
        // The leaf whose range takes `pg`: the last one starting at or below it, or
        // the first leaf when `pg` precedes every run.
        let key = match self.leaves.range(..=pg).next_back() {
            Some((&k, _)) => k,
            None => match self.leaves.keys().next() {
                Some(&k) => k,
                None => {
                    self.leaves.insert(pg, vec![p]);
                    self.len += 1;
                    return;
                }
            },
        };
        let leaf = self.leaves.get_mut(&key).expect("leaf just found");
        let i = match find(leaf, pg) {
            Ok(i) => {
                leaf[i] = p;
                return;
            }
            Err(i) => i,
        };
        self.len += 1;
        if leaf.len() < LEAF {
            leaf.insert(i, p);
            if i == 0 {
                // A new first page: the leaf's key follows it.
                let l = self.leaves.remove(&key).expect("leaf");
                self.leaves.insert(pg, l);
            }
            return;
        }
        let appending = i == leaf.len();
        if appending && self.leaves.last_key_value().is_some_and(|(&k, _)| k == key) {
            // Appending past the last run: start a new leaf, leaving this one full
            // (sequentially written files fill their leaves).
            self.leaves.insert(pg, vec![p]);
            return;
        }
        // Split the full leaf in halves, then insert into the half that takes `pg`.
        let leaf = self.leaves.get_mut(&key).expect("leaf just found");
        let mut right = leaf.split_off(LEAF / 2);
        right.reserve_exact(LEAF - right.len());
        if i <= LEAF / 2 {
            leaf.insert(i, p);
            if i == 0 {
                let l = self.leaves.remove(&key).expect("leaf");
                self.leaves.insert(pg, l);
            }
        } else {
            right.insert(i - LEAF / 2, p);
        }
        self.leaves.insert(right[0].pg, right);
    }

    /// If a run of `e.len` pages starts at `pg`, put `e` in its place and return it
    /// (an overwrite of the same pages: one search instead of a remove and insert).
    pub fn replace_same(&mut self, pg: u64, e: Ext) -> Option<Ext> {
        let (_, leaf) = self.leaves.range_mut(..=pg).next_back()?;
        let i = find(leaf, pg).ok()?;
        let old = leaf[i].ext();
        if old.len != e.len {
            return None;
        }
        leaf[i] = Packed::new(pg, e);
        Some(old)
    }

    /// If one run holds all of pages `[pg, pg + e.len)`, map them to `e` instead
    /// and return what they were (the middle of the run; the parts before and after
    /// stay runs of their own): an overwrite inside a longer run with a few searches
    /// in the leaves, no walk and no allocation.
    pub fn split_replace(&mut self, pg: u64, e: Ext) -> Option<Ext> {
        let (s, run) = self.floor(pg)?;
        let end = s + run.len as u64;
        let new_end = pg.checked_add(e.len as u64)?;
        if new_end > end {
            return None;
        }
        let old = Ext { len: e.len, block: run.block + (pg - s), loc: run.loc };
        let after = (new_end < end).then(|| {
            let block = run.block + (new_end - s);
            Packed::new(new_end, Ext { len: (end - new_end) as u32, block, loc: run.loc })
        });
        // In place when the leaf has room: the run's slot shrinks to the part before
        // `pg` (or becomes the new run), the rest go right after it.
        let (_, leaf) = self.leaves.range_mut(..=s).next_back().expect("the run's leaf");
        let extra = usize::from(pg > s) + usize::from(after.is_some());
        if leaf.len() + extra <= LEAF {
            let i = find(leaf, s).expect("the run starts here");
            let mut at = i;
            if pg > s {
                leaf[i] = Packed::new(s, Ext { len: (pg - s) as u32, ..run });
                at += 1;
                leaf.insert(at, Packed::new(pg, e));
            } else {
                leaf[i] = Packed::new(pg, e);
            }
            if let Some(a) = after {
                leaf.insert(at + 1, a);
            }
            self.len += extra;
            return Some(old);
        }
        if pg > s {
            self.insert(s, Ext { len: (pg - s) as u32, ..run });
        }
        self.insert(pg, e);
        if let Some(a) = after {
            self.insert(a.pg, a.ext());
        }
        Some(old)
    }

    /// Remove the run starting at `pg`.
    pub fn remove(&mut self, pg: u64) -> Option<Ext> {
        let (&key, _) = self.leaves.range(..=pg).next_back()?;
        let leaf = self.leaves.get_mut(&key).expect("leaf just found");
        let i = find(leaf, pg).ok()?;
        let p = leaf.remove(i);
        self.len -= 1;
        if leaf.is_empty() {
            self.leaves.remove(&key);
        } else if i == 0 {
            let l = self.leaves.remove(&key).expect("leaf");
            self.leaves.insert(l[0].pg, l);
        }
        Some(p.ext())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ext(block: u64) -> Ext {
        Ext { len: 1 + (block % 3) as u32, block, loc: block * 7 }
    }

    #[test]
    fn sequential_inserts_fill_leaves() {
        let mut m = ExtMap::default();
        for pg in 0..(10 * LEAF as u64) {
            m.insert(pg, ext(pg));
        }
        assert_eq!(m.leaves.len(), 10);
        assert!(m.leaves.values().all(|l| l.len() == LEAF));
        assert_eq!(m.floor(5 * LEAF as u64 + 3).unwrap().0, 5 * LEAF as u64 + 3);
        assert_eq!(m.below(0), None);
    }

    #[test]
    fn packing_keeps_the_widest_values() {
        let mut m = ExtMap::default();
        let e = Ext { len: MAX_RUN, block: (1 << BLOCK_BITS) - 1, loc: u64::MAX };
        m.insert(u64::MAX / 4096, e);
        assert_eq!(m.floor(u64::MAX), Some((u64::MAX / 4096, e)));
    }

    #[test]
    fn split_replace_cuts_a_run_in_up_to_three() {
        let run = Ext { len: 10, block: 1000, loc: 7 };
        let new = |len| Ext { len, block: 50, loc: 9 };
        let mut m = ExtMap::default();
        m.insert(100, run);
        // The middle: a run before, the new one, a run after.
        assert_eq!(m.split_replace(103, new(2)), Some(Ext { len: 2, block: 1003, loc: 7 }));
        let got: Vec<_> = m.iter().collect();
        let after = Ext { len: 5, block: 1005, loc: 7 };
        assert_eq!(got, [(100, Ext { len: 3, ..run }), (103, new(2)), (105, after)]);
        // The start and the end of a run: two pieces.
        assert_eq!(m.split_replace(105, new(1)), Some(Ext { len: 1, block: 1005, loc: 7 }));
        assert_eq!(m.split_replace(102, new(1)), Some(Ext { len: 1, block: 1002, loc: 7 }));
        assert_eq!(m.len(), 5);
        assert_eq!(m.floor(106), Some((106, Ext { len: 4, block: 1006, loc: 7 })));
        // Not inside one run: nothing changes.
        assert_eq!(m.split_replace(108, new(3)), None);
        assert_eq!(m.split_replace(99, new(1)), None);
        assert_eq!(m.len(), 5);
        assert_eq!(m.iter().map(|(_, e)| e.len).sum::<u32>(), 10);
        // A full leaf: the pieces go in through `insert`, which splits it.
        let mut m = ExtMap::default();
        for k in 0..LEAF as u64 {
            m.push_back(3 * k, Ext { len: 3, block: 3 * k, loc: k });
        }
        assert_eq!(m.leaves.len(), 1);
        assert_eq!(m.split_replace(31, new(1)), Some(Ext { len: 1, block: 31, loc: 10 }));
        assert_eq!(m.len(), LEAF + 2);
        assert_eq!(m.floor(30), Some((30, Ext { len: 1, block: 30, loc: 10 })));
        assert_eq!(m.floor(31), Some((31, new(1))));
        assert_eq!(m.floor(32), Some((32, Ext { len: 1, block: 32, loc: 10 })));
        assert_eq!(m.floor(33), Some((33, Ext { len: 3, block: 33, loc: 11 })));
        for (k, l) in &m.leaves {
            assert!(!l.is_empty() && l.len() <= LEAF && l[0].pg == *k);
        }
    }

    proptest! {
        /// Against a `BTreeMap`: inserts, replacements and removals anywhere, then
        /// floor, below, starts_in and iteration agree.
        #[test]
        fn matches_a_btreemap(ops in proptest::collection::vec((0u8..4, 0u64..600), 1..1500)) {
            let mut m = ExtMap::default();
            let mut r: BTreeMap<u64, Ext> = BTreeMap::new();
            for (op, x) in ops {
                if op < 2 {
                    m.insert(x, ext(x + op as u64));
                    r.insert(x, ext(x + op as u64));
                } else if op == 2 {
                    let pg = m.end() + x % 5;
                    prop_assert_eq!(m.end(), r.iter().next_back().map_or(0, |(k, e)| k + e.len as u64));
                    m.push_back(pg, ext(x));
                    r.insert(pg, ext(x));
                } else {
                    prop_assert_eq!(m.remove(x), r.remove(&x));
                }
                prop_assert_eq!(m.len(), r.len());
                let e = ext(x + 7);
                let same = r.get(&x).filter(|o| o.len == e.len).copied();
                prop_assert_eq!(m.replace_same(x, e), same);
                if same.is_some() {
                    r.insert(x, e);
                }
                prop_assert_eq!(m.floor(x), r.range(..=x).next_back().map(|(&k, &e)| (k, e)));
                prop_assert_eq!(m.below(x), r.range(..x).next_back().map(|(&k, &e)| (k, e)));
                let (a, b) = (x.saturating_sub(40), x + 25);
                prop_assert_eq!(m.starts_in(a, b), r.range(a..b).map(|(&k, _)| k).collect::<Vec<_>>());
            }
            prop_assert_eq!(m.iter().collect::<Vec<_>>(), r.into_iter().collect::<Vec<_>>());
            for (k, l) in &m.leaves {
                prop_assert!(!l.is_empty() && l.len() <= LEAF && l[0].pg == *k);
            }
        }
    }
}
