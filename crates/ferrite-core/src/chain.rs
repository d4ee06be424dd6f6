//! The pages of one inode's log in chain order, as DRAM keeps them.
//!
//! Invariants:
//! - The order is the on-media chain (head first) and a page appears once.
//! - A short chain is a plain vector (an idle file's log is one page, and DRAM per
//!   idle file is a goal). Past [`SMALL`] pages every page also gets an order key,
//!   so fast GC finds a dead page's neighbours and unlinks it in O(log n): overwrite
//!   workloads kill the *oldest* pages of long logs, and a scan of the chain per GC
//!   made each write cost time proportional to the log's length.
//! - Pages read from media join a chain through [`LogPages::try_extend`], which
//!   refuses a page already linked: a corrupt log is an error, never a panic.
//! - A large chain that shrinks under half of [`SMALL`] becomes a vector again
//!   (hysteresis: no flapping at the boundary).

use rustc_hash::FxHashMap;
use smallvec::SmallVec;
use std::collections::BTreeMap;

/// Longest chain kept as a plain vector.
pub const SMALL: usize = 32;

/// Log pages in chain order.
#[derive(Clone, Debug)]
pub enum LogPages {
    /// Up to [`SMALL`] pages, in order.
    Small(SmallVec<[u64; 4]>),
    /// Pages by order key, and each page's key.
    Large {
        /// order key -> page.
        order: BTreeMap<u64, u64>,
        /// page -> order key.
        key: FxHashMap<u64, u64>,
        /// Key for the next page pushed.
        next: u64,
    },
}

impl Default for LogPages {
    fn default() -> Self {
        LogPages::Small(SmallVec::new())
    }
}

impl PartialEq for LogPages {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl From<Vec<u64>> for LogPages {
    fn from(v: Vec<u64>) -> Self {
        if v.len() <= SMALL {
            return LogPages::Small(SmallVec::from_vec(v));
        }
        let mut p = LogPages::Small(SmallVec::new());
        p.extend(&v);
        p
    }
}

impl LogPages {
    /// Pages in the chain.
    pub fn len(&self) -> usize {
        match self {
            LogPages::Small(v) => v.len(),
            LogPages::Large { order, .. } => order.len(),
        }
    }

    /// No pages (a freed inode).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pages in chain order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = u64> + '_> {
        match self {
            LogPages::Small(v) => Box::new(v.iter().copied()),
            LogPages::Large { order, .. } => Box::new(order.values().copied()),
        }
    }

    /// Pages in chain order, as a vector.
    pub fn to_vec(&self) -> Vec<u64> {
        self.iter().collect()
    }

    /// The pages in chain order, taken out (a freed inode's): a short chain's own
    /// vector, no heap (an unlink spent 300 instructions here, boxing an iterator
    /// into a new vector).
    pub fn into_pages(self) -> SmallVec<[u64; 4]> {
        match self {
            LogPages::Small(v) => v,
            LogPages::Large { order, .. } => order.into_values().collect(),
        }
    }

    /// Is `page` in the chain?
    pub fn contains(&self, page: u64) -> bool {
        match self {
            LogPages::Small(v) => v.contains(&page),
            LogPages::Large { key, .. } => key.contains_key(&page),
        }
    }

    /// Link `page` after the last page.
    pub fn push(&mut self, page: u64) {
        debug_assert!(!self.contains(page), "log page {page:#x} linked twice");
        match self {
            LogPages::Small(v) if v.len() < SMALL => v.push(page),
            LogPages::Small(v) => {
                let mut order = BTreeMap::new();
                let mut key = FxHashMap::default();
                for (k, &p) in v.iter().chain(std::iter::once(&page)).enumerate() {
                    order.insert(k as u64, p);
                    key.insert(p, k as u64);
                }
                let next = order.len() as u64;
                *self = LogPages::Large { order, key, next };
            }
            LogPages::Large { order, key, next } => {
                order.insert(*next, page);
                key.insert(page, *next);
                *next += 1;
            }
        }
    }

    /// Link `pages` after the last page, in order.
    pub fn extend(&mut self, pages: &[u64]) {
        for &p in pages {
            self.push(p);
        }
    }

    /// Link `pages` after the last page, in order, unless one of them is in the
    /// chain already (a corrupt next pointer leading back into the chain): then
    /// nothing is linked and that page is returned.
    pub fn try_extend(&mut self, pages: &[u64]) -> Result<(), u64> {
        let mut seen = rustc_hash::FxHashSet::default();
        if let Some(&p) = pages.iter().find(|&&p| self.contains(p) || !seen.insert(p)) {
            return Err(p);
        }
        self.extend(pages);
        Ok(())
    }

    /// The pages before and after `page`, or `None` if it is not in the chain.
    pub fn neighbours(&self, page: u64) -> Option<(Option<u64>, Option<u64>)> {
        match self {
            LogPages::Small(v) => {
                let i = v.iter().position(|&p| p == page)?;
                Some((i.checked_sub(1).map(|j| v[j]), v.get(i + 1).copied()))
            }
            LogPages::Large { order, key, .. } => {
                let k = *key.get(&page)?;
                let prev = order.range(..k).next_back().map(|(_, &p)| p);
                let next = order.range(k + 1..).next().map(|(_, &p)| p);
                Some((prev, next))
            }
        }
    }

    /// Unlink `page`; false if it was not in the chain.
    pub fn remove(&mut self, page: u64) -> bool {
        let removed = match self {
            LogPages::Small(v) => match v.iter().position(|&p| p == page) {
                Some(i) => {
                    v.remove(i);
                    true
                }
                None => false,
            },
            LogPages::Large { order, key, .. } => match key.remove(&page) {
                Some(k) => order.remove(&k).is_some(),
                None => false,
            },
        };
        if let LogPages::Large { order, .. } = self {
            if order.len() < SMALL / 2 {
                *self = LogPages::Small(order.values().copied().collect());
            }
        }
        removed
    }

    /// `pages` (all in the chain) sorted into chain order.
    pub fn sort_in_chain_order(&self, pages: &mut [u64]) {
        match self {
            LogPages::Small(v) => {
                pages.sort_by_key(|p| v.iter().position(|q| q == p).unwrap_or(usize::MAX))
            }
            LogPages::Large { key, .. } => {
                pages.sort_by_key(|p| key.get(p).copied().unwrap_or(u64::MAX))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn grows_large_and_shrinks_back() {
        let mut c = LogPages::default();
        for p in 0..100u64 {
            c.push(p * 4096);
        }
        assert!(matches!(c, LogPages::Large { .. }));
        assert_eq!(c.neighbours(0), Some((None, Some(4096))));
        assert_eq!(c.neighbours(99 * 4096), Some((Some(98 * 4096), None)));
        assert_eq!(c.neighbours(7), None);
        for p in 0..90u64 {
            assert!(c.remove(p * 4096));
        }
        assert!(!c.remove(0));
        assert_eq!(c.try_extend(&[5, 95 * 4096]), Err(95 * 4096), "a page linked twice");
        assert_eq!(c.try_extend(&[5, 5]), Err(5), "a page given twice");
        assert_eq!(c.len(), 10, "nothing linked by a refused extend");
        assert!(matches!(c, LogPages::Small(_)));
        assert_eq!(c.to_vec(), (90..100).map(|p| p * 4096).collect::<Vec<_>>());
        assert_eq!(c, LogPages::from(c.to_vec()));
    }

    proptest! {
        /// Against a plain vector: pushes, removals anywhere, neighbours, order.
        #[test]
        fn matches_a_vector(ops in proptest::collection::vec((0u8..3, 0u64..200), 1..400)) {
            let mut c = LogPages::default();
            let mut v: Vec<u64> = Vec::new();
            let mut fresh = 1000u64;
            for (op, x) in ops {
                match op {
                    0 | 1 => {
                        fresh += 1;
                        c.push(fresh);
                        v.push(fresh);
                    }
                    _ if !v.is_empty() => {
                        let p = v[(x as usize) % v.len()];
                        let i = v.iter().position(|&q| q == p).unwrap();
                        let want = (i.checked_sub(1).map(|j| v[j]), v.get(i + 1).copied());
                        prop_assert_eq!(c.neighbours(p), Some(want));
                        prop_assert!(c.remove(p));
                        v.remove(i);
                    }
                    _ => {}
                }
                prop_assert_eq!(c.len(), v.len());
                prop_assert_eq!(c.to_vec(), v.clone());
                let mut some: Vec<u64> = v.iter().rev().step_by(3).copied().collect();
                c.sort_in_chain_order(&mut some);
                let mut sorted = some.clone();
                sorted.sort_by_key(|p| v.iter().position(|q| q == p));
                prop_assert_eq!(some, sorted);
            }
        }
    }
}
