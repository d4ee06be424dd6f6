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
//! A cookie below the vectors' last that they do not hold (which no valid log has,
//! but a damaged or crafted one may) goes to a small ordered map beside them
//! (`late`), not into the middle of the vectors: a log of many such entries costs
//! what the tree cost, never a shift of the vectors per entry.
//!
//! Invariants:
//! - `keys` is strictly increasing and as long as `names`; `late` holds no cookie
//!   that `keys` holds.
//! - A name is empty exactly where its entry was removed (a hole); names are never
//!   empty otherwise. `live` counts the names that are not holes, and `late`'s.
//! - After a removal, holes are at most `max(live, HOLES_KEPT)`: compaction keeps
//!   the vectors within about twice the live entries, at an amortized constant
//!   cost per removal.

use crate::extmap::upto;
use crate::index::DirName;
use std::collections::BTreeMap;

/// Holes a directory may keep whatever its size (no compaction below this).
const HOLES_KEPT: usize = 64;

/// Names in cookie order (see the module's invariants).
#[derive(Clone, Debug, Default)]
pub struct CookieOrder {
    keys: Vec<u64>,
    names: Vec<DirName>,
    /// Cookies that came out of order (see the module's comment).
    late: BTreeMap<u64, DirName>,
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
            // A compaction may have dropped the holes above a late cookie.
            if !self.late.is_empty() && self.late.remove(&cookie).is_some() {
                self.live -= 1;
            }
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
            Err(_) => {
                if self.late.insert(cookie, name).is_none() {
                    self.live += 1;
                }
            }
        }
    }

    /// Remove `cookie`'s entry; whether it was live.
    pub fn remove(&mut self, cookie: u64) -> bool {
        let Ok(i) = self.find(cookie) else {
            let gone = self.late.remove(&cookie).is_some();
            self.live -= gone as usize;
            return gone;
        };
        if self.names[i].is_empty() {
            return false;
        }
        self.names[i] = DirName::new();
        self.live -= 1;
        let in_keys = self.live - self.late.len();
        if self.keys.len() - in_keys > in_keys.max(HOLES_KEPT) {
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
            debug_assert_eq!(self.keys.len(), in_keys);
        }
        true
    }

    /// Live entries from cookie `from` on, in cookie order.
    pub fn from(&self, from: u64) -> impl Iterator<Item = (u64, &DirName)> + '_ {
        let start = match from.checked_sub(1) {
            Some(below) => upto(&self.keys, below),
            None => 0,
        };
        let mut a = self.keys[start..]
            .iter()
            .zip(&self.names[start..])
            .filter(|(_, n)| !n.is_empty())
            .map(|(&k, n)| (k, n))
            .peekable();
        let mut b = self.late.range(from..).map(|(&k, n)| (k, n)).peekable();
        std::iter::from_fn(move || match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if y.0 < x.0 => b.next(),
            (Some(_), _) => a.next(),
            (None, _) => b.next(),
        })
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

    #[test]
    fn a_late_cookie_above_the_compacted_vectors_is_pushed_once() {
        // The state a compaction leaves when it drops the holes above a late cookie
        // (vectors 3 and 4, cookie 10 late): its next insertion is a push, which
        // must take it out of the map, or it would be listed and counted twice.
        let mut o = CookieOrder {
            keys: vec![3, 4],
            names: vec![name(0), name(1)],
            late: BTreeMap::from([(10, name(2))]),
            live: 3,
        };
        o.insert(10, name(3));
        assert!(o.late.is_empty());
        assert_eq!(o.len(), 3);
        let all: Vec<(u64, DirName)> = o.iter().map(|(k, n)| (k, n.clone())).collect();
        assert_eq!(all, vec![(3, name(0)), (4, name(1)), (10, name(3))]);
    }

    #[test]
    fn cookies_out_of_order_never_shift_the_vectors() {
        // A log whose cookies fall (only a damaged or crafted one) goes to the map
        // beside the vectors: each insertion costs a tree's, not a shift of all.
        let mut o = CookieOrder::default();
        for c in (3..20_003u64).rev() {
            o.insert(c, name(c as u8));
        }
        assert_eq!(o.keys.len(), 1);
        assert_eq!(o.len(), 20_000);
        assert!(o.iter().map(|(k, _)| k).eq(3..20_003));
        assert!(o.remove(5) && !o.remove(5));
        assert!(o.from(4).map(|(k, _)| k).take(2).eq([4, 6]));
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
                let in_keys = o.live - o.late.len();
                prop_assert!(o.keys.len() - in_keys <= in_keys.max(HOLES_KEPT));
                prop_assert!(o.late.keys().all(|k| o.keys.binary_search(k).is_err()));
                prop_assert!(o.iter().map(|(k, n)| (k, n.clone())).eq(
                    m.iter().map(|(&k, n)| (k, n.clone()))
                ));
            }
        }
    }
}
