//! A directory's names in readdir-cookie order (`DirIndex::order`): the cookies,
//! sorted, in one vector and their names in another, where a removal leaves a
//! hole (an empty name) until holes outnumber names.
//!
//! It replaced a `BTreeMap<u64, DirName>`. Cookies are handed out in increasing
//! order and a log replays them so (thorough GC writes a directory's entries in
//! cookie order), so an insertion is a push at the end; a removal finds its cookie
//! by [`crate::extmap::upto`] (a directory's live cookies are close to evenly
//! spread) and only empties the name, where the tree rebalanced nodes (`profile_op
//! unlink`, 200,000 names in one directory: 4.5% of the samples in
//! `BTreeMap::remove`; five alternating pairs, 1.89-2.21 -> 1.74-2.12 µs an unlink,
//! and 1.58-2.03 -> 1.47-1.56 in the metadata path's rounds of 5,000 files). DRAM
//! per idle file did not move (191 bytes in two quick runs of each, 193 and 194 in
//! a full one).
//!
//! Invariants:
//! - `keys` is strictly increasing and as long as `names`.
//! - A name is empty exactly where its entry was removed (a hole); names are never
//!   empty otherwise. `live` counts the names that are not holes.
//! - After a removal, holes are at most `max(live, HOLES_KEPT)`: compaction keeps
//!   the vectors within about twice the live entries, at an amortized constant
//!   cost per removal.

use crate::extmap::upto;
use crate::index::DirName;

/// Holes a directory may keep whatever its size (no compaction below this).
const HOLES_KEPT: usize = 64;

/// Names in cookie order (see the module's invariants).
#[derive(Clone, Debug, Default)]
pub struct CookieOrder {
    keys: Vec<u64>,
    names: Vec<DirName>,
    live: usize,
}

impl CookieOrder {
    /// Live entries.
    pub fn len(&self) -> usize {
        self.live
    }

    /// No live entry.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The index of `cookie`'s entry (live or a hole), or where it would go.
    fn find(&self, cookie: u64) -> Result<usize, usize> {
        let i = upto(&self.keys, cookie);
        if i > 0 && self.keys[i - 1] == cookie {
            Ok(i - 1)
        } else {
            Err(i)
        }
    }

    /// Name `cookie` `name` (not empty), replacing what it named.
    pub fn insert(&mut self, cookie: u64, name: DirName) {
        assert!(!name.is_empty(), "a directory entry has a name");
        if self.keys.last().is_none_or(|&last| cookie > last) {
            self.keys.push(cookie);
            self.names.push(name);
            self.live += 1;
            return;
        }
        match self.find(cookie) {
            Ok(i) => {
                if self.names[i].is_empty() {
                    self.live += 1;
                }
                self.names[i] = name;
            }
            Err(i) => {
                self.keys.insert(i, cookie);
                self.names.insert(i, name);
                self.live += 1;
            }
        }
    }

    /// Remove `cookie`'s entry; whether it was live.
    pub fn remove(&mut self, cookie: u64) -> bool {
        let Ok(i) = self.find(cookie) else { return false };
        if self.names[i].is_empty() {
            return false;
        }
        self.names[i] = DirName::new();
        self.live -= 1;
        if self.keys.len() - self.live > self.live.max(HOLES_KEPT) {
            let mut names = std::mem::take(&mut self.names).into_iter();
            let mut kept = Vec::with_capacity(self.live);
            self.keys.retain(|_| {
                let n = names.next().expect("as many names as keys");
                let keep = !n.is_empty();
                if keep {
                    kept.push(n);
                }
                keep
            });
            self.names = kept;
            debug_assert_eq!(self.keys.len(), self.live);
        }
        true
    }

    /// Live entries from cookie `from` on, in cookie order.
    pub fn from(&self, from: u64) -> impl Iterator<Item = (u64, &DirName)> + '_ {
        let start = match from.checked_sub(1) {
            Some(below) => upto(&self.keys, below),
            None => 0,
        };
        self.keys[start..]
            .iter()
            .zip(&self.names[start..])
            .filter(|(_, n)| !n.is_empty())
            .map(|(&k, n)| (k, n))
    }

    /// Live entries in cookie order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &DirName)> + '_ {
        self.from(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone)]
    enum Op {
        /// A new cookie past every other (as a create hands out).
        Push(u8),
        /// Any cookie (a replayed or re-added entry).
        Insert(u64, u8),
        Remove(u64),
        From(u64),
    }

    fn name(b: u8) -> DirName {
        DirName::from_slice(&[b'a' + b % 26; 3])
    }

    proptest! {
        // Against the `BTreeMap` it replaced, through runs of removals (which
        // compact) and insertions into holes and between entries.
        #[test]
        fn behaves_as_the_ordered_map(ops in proptest::collection::vec(
            prop_oneof![
                4 => any::<u8>().prop_map(Op::Push),
                1 => (0..600u64, any::<u8>()).prop_map(|(c, b)| Op::Insert(c, b)),
                4 => (0..600u64).prop_map(Op::Remove),
                1 => (0..600u64).prop_map(Op::From),
            ],
            1..600,
        )) {
            let mut o = CookieOrder::default();
            let mut m: BTreeMap<u64, DirName> = BTreeMap::new();
            let mut next = 3u64;
            for op in ops {
                match op {
                    Op::Push(b) => {
                        o.insert(next, name(b));
                        m.insert(next, name(b));
                        next += 1;
                    }
                    Op::Insert(c, b) => {
                        o.insert(c, name(b));
                        m.insert(c, name(b));
                        next = next.max(c + 1);
                    }
                    Op::Remove(c) => {
                        prop_assert_eq!(o.remove(c), m.remove(&c).is_some());
                    }
                    Op::From(c) => {
                        let got: Vec<(u64, DirName)> =
                            o.from(c).map(|(k, n)| (k, n.clone())).collect();
                        let want: Vec<(u64, DirName)> =
                            m.range(c..).map(|(&k, n)| (k, n.clone())).collect();
                        prop_assert_eq!(got, want);
                    }
                }
                prop_assert_eq!(o.len(), m.len());
                prop_assert!(o.keys.windows(2).all(|w| w[0] < w[1]));
                prop_assert_eq!(o.keys.len(), o.names.len());
                prop_assert!(o.keys.len() - o.live <= o.live.max(HOLES_KEPT));
                prop_assert!(o.iter().map(|(k, n)| (k, n.clone())).eq(
                    m.iter().map(|(&k, n)| (k, n.clone()))
                ));
            }
        }
    }
}
