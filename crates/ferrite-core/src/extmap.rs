//! The extent map of a file: first page -> run of consecutive blocks, with the log
//! entry that mapped it. DRAM-only, rebuilt from the log.
//!
//! Layout: sorted leaves of at most [`LEAF`] packed 24-byte runs, found by a search
//! of their first pages (`Leaves`). A file written 4 KiB at a time in random order
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

/// The leaves in key order, their first pages beside them, in chunks of at most
/// [`CHUNK`] leaves; the first key of each chunk is kept in one more vector. A
/// search is two searches (`upto`) of keys that lie in a few cache lines, where a
/// `BTreeMap` of the leaves walked a node per level and both edges of a range:
/// `profile_op randwrite4k` (a 64 MiB file of one-page runs) spent 6.9% of its
/// samples in `BTreeMap::range`, and 2.5% in `upto` after (its time per write moved
/// less than the host's spread: 0.57-0.66 -> 0.58-0.60 µs, four alternating
/// pairs). The chunks bound what a leaf's insertion or removal shifts (one chunk's
/// vectors and the firsts), where one sorted vector of all leaves would shift
/// megabytes for a file of millions of runs.
///
/// Invariants: chunks are non-empty, `firsts[c]` is chunk `c`'s first key, and
/// keys increase strictly through the chunks in order. A chunk that shrinks is not
/// merged with its neighbour: at worst (removals that leave one leaf a chunk) the
/// firsts hold a key per leaf, as one sorted vector of all leaves would.
#[derive(Clone, Debug, Default)]
struct Leaves {
    firsts: Vec<u64>,
    chunks: Vec<Chunk>,
}

/// Consecutive leaves and their keys.
#[derive(Clone, Debug, Default)]
struct Chunk {
    keys: Vec<u64>,
    vals: Vec<Vec<Packed>>,
}

/// Leaves a chunk holds at most (smaller in tests, so that their small maps span
/// several chunks).
const CHUNK: usize = if cfg!(test) { 4 } else { 512 };

/// A leaf's place: (chunk, index in it).
type Pos = (usize, usize);

impl Leaves {
    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// The place of the last leaf whose key is at or below `pg`.
    fn floor(&self, pg: u64) -> Option<Pos> {
        let c = upto(&self.firsts, pg).checked_sub(1)?;
        let i = upto(&self.chunks[c].keys, pg);
        debug_assert!(i >= 1, "a chunk's first key is in its firsts");
        Some((c, i - 1))
    }

    fn key(&self, (c, i): Pos) -> u64 {
        self.chunks[c].keys[i]
    }

    fn leaf(&self, (c, i): Pos) -> &Vec<Packed> {
        &self.chunks[c].vals[i]
    }

    fn leaf_mut(&mut self, (c, i): Pos) -> &mut Vec<Packed> {
        &mut self.chunks[c].vals[i]
    }

    fn is_last(&self, (c, i): Pos) -> bool {
        c + 1 == self.chunks.len() && i + 1 == self.chunks[c].keys.len()
    }

    /// Leaves from `from` on, in key order, with their keys.
    fn iter_from(&self, (c, i): Pos) -> impl Iterator<Item = (u64, &Vec<Packed>)> {
        let rest = self.chunks.get(c..).unwrap_or(&[]);
        rest.iter().enumerate().flat_map(move |(k, ch)| {
            let skip = if k == 0 { i } else { 0 };
            ch.keys.iter().copied().zip(&ch.vals).skip(skip)
        })
    }

    /// Every leaf, in key order.
    fn iter(&self) -> impl Iterator<Item = &Vec<Packed>> {
        self.chunks.iter().flat_map(|c| c.vals.iter())
    }

    fn last(&self) -> Option<&Vec<Packed>> {
        self.chunks.last().and_then(|c| c.vals.last())
    }

    fn last_mut(&mut self) -> Option<&mut Vec<Packed>> {
        self.chunks.last_mut().and_then(|c| c.vals.last_mut())
    }

    /// Add `leaf` under `key` (no leaf has that key).
    fn insert(&mut self, key: u64, leaf: Vec<Packed>) {
        let Some(c) = upto(&self.firsts, key).checked_sub(1).or(
            // Before every leaf: into the first chunk, unless there is none.
            (!self.chunks.is_empty()).then_some(0),
        ) else {
            self.firsts.push(key);
            self.chunks.push(Chunk { keys: vec![key], vals: vec![leaf] });
            return;
        };
        let ch = &mut self.chunks[c];
        let i = upto(&ch.keys, key);
        debug_assert!(i == 0 || ch.keys[i - 1] != key, "leaf key {key} twice");
        ch.keys.insert(i, key);
        ch.vals.insert(i, leaf);
        if i == 0 {
            self.firsts[c] = key;
        }
        if ch.keys.len() > CHUNK {
            let right =
                Chunk { keys: ch.keys.split_off(CHUNK / 2), vals: ch.vals.split_off(CHUNK / 2) };
            self.firsts.insert(c + 1, right.keys[0]);
            self.chunks.insert(c + 1, right);
        }
    }

    fn remove(&mut self, (c, i): Pos) -> Vec<Packed> {
        let ch = &mut self.chunks[c];
        ch.keys.remove(i);
        let leaf = ch.vals.remove(i);
        if ch.keys.is_empty() {
            self.firsts.remove(c);
            self.chunks.remove(c);
        } else if i == 0 {
            self.firsts[c] = ch.keys[0];
        }
        leaf
    }

    /// Key leaf `p` by its first page again (after that page changed; the order
    /// holds, as the new first page lies between the neighbours' keys).
    fn rekey(&mut self, (c, i): Pos) {
        let k = self.chunks[c].vals[i][0].pg;
        self.chunks[c].keys[i] = k;
        if i == 0 {
            self.firsts[c] = k;
        }
        debug_assert!(
            self.prev_key((c, i)).is_none_or(|p| p < k)
                && self.next_key((c, i)).is_none_or(|n| k < n),
            "leaf ({c}, {i}) out of order"
        );
    }

    fn prev_key(&self, (c, i): Pos) -> Option<u64> {
        match i {
            0 => c.checked_sub(1).map(|b| *self.chunks[b].keys.last().expect("non-empty")),
            _ => Some(self.chunks[c].keys[i - 1]),
        }
    }

    fn next_key(&self, (c, i): Pos) -> Option<u64> {
        self.chunks[c].keys.get(i + 1).or_else(|| self.firsts.get(c + 1)).copied()
    }

    /// The invariants (for tests).
    #[cfg(test)]
    fn check_order(&self) -> bool {
        let mut prev = None;
        self.chunks.len() == self.firsts.len()
            && self.chunks.iter().zip(&self.firsts).all(|(ch, &f)| {
                !ch.keys.is_empty() && ch.keys[0] == f && ch.keys.len() == ch.vals.len()
            })
            && self.chunks.iter().flat_map(|c| &c.keys).all(|&k| {
                let ok = prev.is_none_or(|p| p < k);
                prev = Some(k);
                ok
            })
    }
}

/// How many of the sorted, distinct `keys` are at or below `pg`
/// (`keys.partition_point(|&k| k <= pg)`), found from where `pg` would lie if the
/// keys were evenly spread, then by doubling steps and a binary search between
/// the last two. The leaves of a file overwritten at random are about evenly
/// spread, and the guess lands on or next to the answer: two or three loads,
/// where a binary search of some hundreds of keys is eight or nine dependent ones
/// (in `profile_op randwrite4k`, the leaf search holding it had 5.6% of the
/// samples, most on one compare of the search).
pub(crate) fn upto(keys: &[u64], pg: u64) -> usize {
    let n = keys.len();
    let (Some(&lo), Some(&hi)) = (keys.first(), keys.last()) else { return 0 };
    if pg < lo {
        return 0;
    }
    if pg >= hi {
        return n;
    }
    // lo <= pg < hi, so n >= 2 and the guess is below n - 1.
    let g = ((pg - lo) as u128 * (n - 1) as u128 / (hi - lo) as u128) as usize;
    debug_assert!(g < n - 1);
    // Bracket the answer a in (l, r]: keys[l] <= pg < keys[r].
    let (mut l, mut r);
    if keys[g] <= pg {
        (l, r) = (g, g + 1);
        let mut step = 1;
        while keys[r] <= pg {
            l = r;
            r = (r + step).min(n - 1);
            step *= 2;
        }
    } else {
        (l, r) = (g.saturating_sub(1), g);
        let mut step = 1;
        while keys[l] > pg {
            r = l;
            l = l.saturating_sub(step);
            step *= 2;
        }
    }
    // keys[l] <= pg < keys[r]: the answer is in l + 1..=r.
    l + 1 + keys[l + 1..r].partition_point(|&k| k <= pg)
}

/// Runs keyed by first page.
#[derive(Clone, Debug, Default)]
pub struct ExtMap {
    leaves: Leaves,
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
        let leaf = self.leaves.leaf(self.leaves.floor(pg)?);
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
        if let Some(j) = self.leaves.floor(pg) {
            let leaf = self.leaves.leaf(j);
            let slot = guess(self.leaves.key(j), pg).min(leaf.len().saturating_sub(1));
            crate::pmem::prefetch_dram(leaf.as_ptr());
            crate::pmem::prefetch_dram(leaf.as_ptr().wrapping_add(slot));
        }
    }

    /// The run with the greatest first page below `pg`.
    pub fn below(&self, pg: u64) -> Option<(u64, Ext)> {
        self.floor(pg.checked_sub(1)?)
    }

    /// The leaves that may hold runs overlapping or starting in `[a, b)`.
    fn leaves_in(&self, a: u64, b: u64) -> impl Iterator<Item = &Vec<Packed>> {
        let from = self.leaves.floor(a).unwrap_or((0, 0));
        let to = if a < b { b } else { 0 };
        self.leaves.iter_from(from).take_while(move |&(k, _)| k < to).map(|(_, l)| l)
    }

    /// First pages of the runs starting in `[a, b)`.
    pub fn starts_in(&self, a: u64, b: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for leaf in self.leaves_in(a, b) {
            out.extend(leaf.iter().map(|p| p.pg).filter(|&pg| pg >= a && pg < b));
        }
        out
    }

    /// Runs that overlap pages `[a, b)`, in page order (a walk of those runs only).
    pub fn runs_in(&self, a: u64, b: u64) -> impl Iterator<Item = (u64, Ext)> + '_ {
        self.leaves_in(a, b)
            .flat_map(|l| l.iter().map(|p| (p.pg, p.ext())))
            .filter(move |&(pg, e)| pg < b && pg + e.len as u64 > a)
    }

    /// Runs in page order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, Ext)> + '_ {
        self.leaves.iter().flat_map(|l| l.iter().map(|p| (p.pg, p.ext())))
    }

    /// The page after the last run (0 when empty).
    pub fn end(&self) -> u64 {
        self.leaves.last().map_or(0, |l| {
            let p = l.last().expect("leaves are not empty");
            p.pg + p.ext().len as u64
        })
    }

    /// Add a run after every other (`pg >= self.end()`): one search, as log replay
    /// and thorough GC add the runs of a file in page order.
    pub fn push_back(&mut self, pg: u64, e: Ext) {
        assert!(pg >= self.end(), "push_back of page {pg} before the end {}", self.end());
        let p = Packed::new(pg, e);
        match self.leaves.last_mut() {
            Some(l) if l.len() < LEAF => l.push(p),
            _ => self.leaves.insert(pg, vec![p]),
        }
        self.len += 1;
    }

    /// Set the run starting at `pg` (replacing one that starts there).
    pub fn insert(&mut self, pg: u64, e: Ext) {
        let p = Packed::new(pg, e);
        // The leaf whose range takes `pg`: the last one starting at or below it, or
        // the first leaf when `pg` precedes every run.
        let j = match self.leaves.floor(pg) {
            Some(j) => j,
            None if !self.leaves.is_empty() => (0, 0),
            None => {
                self.leaves.insert(pg, vec![p]);
                self.len += 1;
                return;
            }
        };
        let leaf = self.leaves.leaf_mut(j);
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
                self.leaves.rekey(j);
            }
            return;
        }
        if i == leaf.len() && self.leaves.is_last(j) {
            // Appending past the last run: start a new leaf, leaving this one full
            // (sequentially written files fill their leaves).
            self.leaves.insert(pg, vec![p]);
            return;
        }
        // Split the full leaf in halves, then insert into the half that takes `pg`.
        let leaf = self.leaves.leaf_mut(j);
        let mut right = leaf.split_off(LEAF / 2);
        right.reserve_exact(LEAF - right.len());
        if i <= LEAF / 2 {
            leaf.insert(i, p);
            if i == 0 {
                self.leaves.rekey(j);
            }
        } else {
            right.insert(i - LEAF / 2, p);
        }
        self.leaves.insert(right[0].pg, right);
    }

    /// If a run of `e.len` pages starts at `pg`, put `e` in its place and return it
    /// (an overwrite of the same pages: one search instead of a remove and insert).
    pub fn replace_same(&mut self, pg: u64, e: Ext) -> Option<Ext> {
        // The file's last run first, without a search: appends remap the last page
        // (an in-place append's every commit, the merge of an appended page).
        if let Some(p) = self.leaves.last_mut().and_then(|l| l.last_mut()) {
            if p.pg == pg {
                let old = p.ext();
                if old.len != e.len {
                    return None;
                }
                *p = Packed::new(pg, e);
                return Some(old);
            }
        }
        let j = self.leaves.floor(pg)?;
        let leaf = self.leaves.leaf_mut(j);
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
        let j = self.leaves.floor(s).expect("the run's leaf");
        let leaf = self.leaves.leaf_mut(j);
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
        let j = self.leaves.floor(pg)?;
        let leaf = self.leaves.leaf_mut(j);
        let i = find(leaf, pg).ok()?;
        let p = leaf.remove(i);
        self.len -= 1;
        if leaf.is_empty() {
            self.leaves.remove(j);
        } else if i == 0 {
            self.leaves.rekey(j);
        }
        Some(p.ext())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn ext(block: u64) -> Ext {
        Ext { len: 1 + (block % 3) as u32, block, loc: block * 7 }
    }

    #[test]
    fn sequential_inserts_fill_leaves() {
        let mut m = ExtMap::default();
        for pg in 0..(10 * LEAF as u64) {
            m.insert(pg, ext(pg));
        }
        assert_eq!(m.leaves.iter().count(), 10);
        assert!(m.leaves.iter().all(|l| l.len() == LEAF));
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
        assert_eq!(m.leaves.iter().count(), 1);
        assert_eq!(m.split_replace(31, new(1)), Some(Ext { len: 1, block: 31, loc: 10 }));
        assert_eq!(m.len(), LEAF + 2);
        assert_eq!(m.floor(30), Some((30, Ext { len: 1, block: 30, loc: 10 })));
        assert_eq!(m.floor(31), Some((31, new(1))));
        assert_eq!(m.floor(32), Some((32, Ext { len: 1, block: 32, loc: 10 })));
        assert_eq!(m.floor(33), Some((33, Ext { len: 3, block: 33, loc: 11 })));
        for (k, l) in m.leaves.iter_from((0, 0)) {
            assert!(!l.is_empty() && l.len() <= LEAF && l[0].pg == k);
        }
    }

    #[test]
    fn chunks_split_and_empty_in_step_with_a_btreemap() {
        // Enough one-page runs, in a scattered order, for leaves to split into many
        // chunks (of `CHUNK` = 4 in tests); then all removed in another order, so
        // chunks empty and go, from the front, the middle and the end.
        let n = 40 * LEAF as u64;
        let order = |mul: u64| (0..n).map(move |k| (k * mul) % n);
        let mut m = ExtMap::default();
        let mut r = BTreeMap::new();
        for pg in order(7919) {
            m.insert(pg, ext(pg * 3));
            r.insert(pg, ext(pg * 3));
        }
        assert!(m.leaves.chunks.len() > 4 && m.leaves.check_order());
        for (k, pg) in order(104_729).enumerate() {
            assert_eq!(m.remove(pg), r.remove(&pg));
            if k % 97 == 0 {
                assert!(m.leaves.check_order());
                assert_eq!(m.floor(pg), r.range(..=pg).next_back().map(|(&k, &e)| (k, e)));
                assert!(m.iter().eq(r.iter().map(|(&k, &e)| (k, e))));
            }
        }
        assert!(m.is_empty() && m.leaves.chunks.is_empty() && m.leaves.check_order());
    }

    proptest! {
        /// `upto` is `partition_point` for keys spread evenly or not.
        #[test]
        fn upto_is_a_partition_point(
            mut keys in proptest::collection::vec(0u64..1 << 40, 0..300),
            skew in 0u32..3,
            probes in proptest::collection::vec(0u64..1 << 40, 1..50),
        ) {
            for k in &mut keys {
                *k >>= 13 * skew; // skewed sets crowd near 0
            }
            keys.sort_unstable();
            keys.dedup();
            for &p in probes.iter().chain(&keys) {
                for q in [p.saturating_sub(1), p, p + 1] {
                    prop_assert_eq!(upto(&keys, q), keys.partition_point(|&k| k <= q));
                }
            }
            prop_assert_eq!(upto(&keys, u64::MAX), keys.len());
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
            for (k, l) in m.leaves.iter_from((0, 0)) {
                prop_assert!(!l.is_empty() && l.len() <= LEAF && l[0].pg == k);
            }
            prop_assert!(m.leaves.check_order());
        }
    }
}
