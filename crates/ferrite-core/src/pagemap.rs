//! A hash map from file page numbers to values (a file's per-page overlay lists),
//! built so that a lookup costs one cache line and can be asked for early.
//!
//! A standard hash table reads a control group first, then the slot it points to:
//! two dependent misses for a page whose entry is cold, which is every page a
//! random sub-page write lands on (`profile_op randwrite64`: the lookup of the
//! page's overlays held 21% of the samples, a fifth of a 64 B write). Here the key
//! sits in its slot beside its value, slots are probed in order from the key's
//! home, and [`PageMap::hint`] gives a word from which a thread that does not hold
//! the map (no lock taken) can ask the cache for a page's home slot
//! ([`prefetch_hinted`]) long before it looks the page up.
//!
//! Invariants:
//! - Slots are aligned to 32 bytes: a slot of a page's op list (32 bytes) lies in
//!   one cache line, the line a lookup loads (and a hint prefetches).
//! - The slot count is 0 (no allocation: most files never have overlays) or a
//!   power of two of at least `MIN_SLOTS`; at most three quarters of the slots
//!   are full.
//! - An empty slot holds `EMPTY` (never a page number: pages are below 2^52)
//!   and `V::default()`.
//! - Linear probing without tombstones: every key lies in the run of full slots
//!   that starts at its home slot (wrapping around). Removal shifts the keys after
//!   the removed one back toward their homes (Knuth's algorithm R), so lookups stop
//!   at the first empty slot.
//! - A hint is only ever used for a prefetch, which never faults and reads nothing
//!   into the program: a stale hint (the map grew or was dropped since) costs a
//!   useless prefetch, nothing else.

use std::ops::Index;

/// The key of an empty slot.
const EMPTY: u64 = u64::MAX;
/// The fewest slots an allocated map has.
const MIN_SLOTS: usize = 8;
/// The multiplier of the hash (Fibonacci hashing: the top bits of the product).
const MUL: u64 = 0x9e37_79b9_7f4a_7c15;

/// Aligned to 32 bytes: a slot of up to 32 bytes (a page's op list's is exactly
/// that) lies in one cache line, so a lookup loads one line.
#[derive(Clone)]
#[repr(align(32))]
struct Slot<V> {
    key: u64,
    val: V,
}

/// A map from page numbers to `V` (see the module's invariants).
#[derive(Clone)]
pub struct PageMap<V> {
    slots: Box<[Slot<V>]>,
    len: usize,
    /// 64 minus the base-2 log of the slot count (unused while there are none).
    shift: u32,
}

impl<V> Default for PageMap<V> {
    fn default() -> Self {
        PageMap { slots: Box::default(), len: 0, shift: 64 }
    }
}

impl<V: std::fmt::Debug> std::fmt::Debug for PageMap<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[inline]
fn home(key: u64, shift: u32) -> usize {
    (key.wrapping_mul(MUL) >> shift) as usize
}

impl<V> PageMap<V> {
    /// Pages in the map.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No page in the map.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: u64) -> Option<usize> {
        debug_assert!(key != EMPTY, "page number out of range");
        if self.slots.is_empty() {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = home(key, self.shift);
        // The map is never full, so an empty slot ends every probe.
        loop {
            let k = self.slots[i].key;
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// The value of `key`.
    #[inline]
    pub fn get(&self, key: &u64) -> Option<&V> {
        self.find(*key).map(|i| &self.slots[i].val)
    }

    /// The pages, in no particular order.
    pub fn keys(&self) -> impl Iterator<Item = &u64> + '_ {
        self.slots.iter().filter(|s| s.key != EMPTY).map(|s| &s.key)
    }

    /// The values, in no particular order.
    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.slots.iter().filter(|s| s.key != EMPTY).map(|s| &s.val)
    }

    /// (page, value), in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &V)> + '_ {
        self.slots.iter().filter(|s| s.key != EMPTY).map(|s| (&s.key, &s.val))
    }

    /// A word that locates `key`'s home slot for [`prefetch_hinted`], for threads
    /// that will look a page up without holding the map yet (0: no slots).
    pub fn hint(&self) -> u64 {
        if self.slots.is_empty() {
            return 0;
        }
        let p = self.slots.as_ptr() as u64;
        // (An address above 2^56, possible only where the kernel gives user space
        // 57 bits and the process asked for such mappings, would make the hint
        // point elsewhere: a useless prefetch, nothing more.)
        debug_assert!(p >> 56 == 0, "user-space addresses fit in 56 bits");
        p | u64::from(self.shift) << 56
    }
}

impl<V: Default> PageMap<V> {
    /// The value of `key`, to change.
    pub fn get_mut(&mut self, key: &u64) -> Option<&mut V> {
        self.find(*key).map(|i| &mut self.slots[i].val)
    }

    /// Whether `key` is in the map.
    pub fn contains_key(&self, key: &u64) -> bool {
        self.find(*key).is_some()
    }

    /// The value of `key`, inserted from `f` when absent.
    pub fn get_or_insert_with(&mut self, key: u64, f: impl FnOnce() -> V) -> &mut V {
        let i = match self.find(key) {
            Some(i) => i,
            None => self.insert_new(key, f()),
        };
        &mut self.slots[i].val
    }

    /// Set `key`'s value; returns the one it replaced.
    pub fn insert(&mut self, key: u64, val: V) -> Option<V> {
        match self.find(key) {
            Some(i) => Some(std::mem::replace(&mut self.slots[i].val, val)),
            None => {
                self.insert_new(key, val);
                None
            }
        }
    }

    /// Put `key`, absent from the map, in its first free slot; returns the slot.
    fn insert_new(&mut self, key: u64, val: V) -> usize {
        assert!(key != EMPTY, "page number out of range");
        if (self.len + 1) * 4 > self.slots.len() * 3 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = home(key, self.shift);
        while self.slots[i].key != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = Slot { key, val };
        self.len += 1;
        i
    }

    /// Twice the slots (or the first ones), every key placed again.
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(MIN_SLOTS);
        let old = std::mem::replace(
            &mut self.slots,
            (0..n).map(|_| Slot { key: EMPTY, val: V::default() }).collect(),
        );
        self.shift = 64 - n.trailing_zeros();
        let mask = n - 1;
        for s in old.into_vec() {
            if s.key != EMPTY {
                let mut i = home(s.key, self.shift);
                while self.slots[i].key != EMPTY {
                    i = (i + 1) & mask;
                }
                self.slots[i] = s;
            }
        }
    }

    /// Take `key` out of the map; returns its value.
    pub fn remove(&mut self, key: &u64) -> Option<V> {
        let mut hole = self.find(*key)?;
        let out = std::mem::take(&mut self.slots[hole].val);
        self.slots[hole].key = EMPTY;
        self.len -= 1;
        // Algorithm R: a key after the hole moves into it unless its home lies
        // cyclically in (hole, j], where it is still reachable from its home.
        let mask = self.slots.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.slots[j].key;
            if k == EMPTY {
                return Some(out);
            }
            let h = home(k, self.shift);
            let stays = if hole <= j { hole < h && h <= j } else { hole < h || h <= j };
            if !stays {
                let s =
                    std::mem::replace(&mut self.slots[j], Slot { key: EMPTY, val: V::default() });
                self.slots[hole] = s;
                hole = j;
            }
        }
    }
}

/// Ask the cache for the line(s) of `key`'s home slot in the map `hint` came from
/// ([`PageMap::hint`] of a `PageMap<V>`). Only a hint: a stale or zero `hint`
/// prefetches nothing useful and never faults.
#[inline]
pub fn prefetch_hinted<V>(hint: u64, key: u64) {
    if hint == 0 {
        return;
    }
    let base = (hint & ((1 << 56) - 1)) as usize;
    let shift = (hint >> 56) as u32;
    let size = std::mem::size_of::<Slot<V>>();
    let at = base.wrapping_add(home(key, shift).wrapping_mul(size));
    crate::pmem::prefetch_dram(at as *const u8);
    crate::pmem::prefetch_dram(at.wrapping_add(size - 1) as *const u8);
}

impl<V> Index<&u64> for PageMap<V> {
    type Output = V;
    fn index(&self, key: &u64) -> &V {
        self.get(key).expect("page in the map")
    }
}

impl<'a, V> IntoIterator for &'a PageMap<V> {
    type Item = (&'a u64, &'a V);
    type IntoIter = Box<dyn Iterator<Item = (&'a u64, &'a V)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, u32),
        Remove(u64),
        GetOrInsert(u64, u32),
    }

    fn op(keys: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..keys, any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            (0..keys).prop_map(Op::Remove),
            (0..keys, any::<u32>()).prop_map(|(k, v)| Op::GetOrInsert(k, v)),
        ]
    }

    fn check(m: &PageMap<u32>, model: &HashMap<u64, u32>, keys: u64) {
        assert_eq!(m.len(), model.len());
        assert_eq!(m.is_empty(), model.is_empty());
        for k in 0..keys {
            assert_eq!(m.get(&k), model.get(&k), "key {k}");
            assert_eq!(m.contains_key(&k), model.contains_key(&k));
        }
        let mut got: Vec<(u64, u32)> = m.iter().map(|(&k, &v)| (k, v)).collect();
        got.sort();
        let mut want: Vec<(u64, u32)> = model.iter().map(|(&k, &v)| (k, v)).collect();
        want.sort();
        assert_eq!(got, want);
        if !m.slots.is_empty() {
            assert!(m.len * 4 <= m.slots.len() * 3, "at most three quarters full");
            // Every key is reachable from its home without crossing an empty slot.
            let mask = m.slots.len() - 1;
            for (i, s) in m.slots.iter().enumerate() {
                if s.key == EMPTY {
                    continue;
                }
                let mut j = home(s.key, m.shift);
                while j != i {
                    assert_ne!(m.slots[j].key, EMPTY, "key {} cut off from its home", s.key);
                    j = (j + 1) & mask;
                }
            }
        }
    }

    proptest! {
        // Against std's map, over few keys (long probe runs, removals in the middle
        // of runs and across the wrap) and over many (growth).
        #[test]
        fn behaves_as_a_hash_map(
            keys in prop_oneof![Just(12u64), Just(40), Just(5000)],
            ops in proptest::collection::vec(op(5000), 1..400),
        ) {
            let mut m = PageMap::<u32>::default();
            let mut model = HashMap::new();
            for o in ops {
                match o {
                    Op::Insert(k, v) => {
                        let k = k % keys;
                        prop_assert_eq!(m.insert(k, v), model.insert(k, v));
                    }
                    Op::Remove(k) => {
                        let k = k % keys;
                        prop_assert_eq!(m.remove(&k), model.remove(&k));
                    }
                    Op::GetOrInsert(k, v) => {
                        let k = k % keys;
                        let got = *m.get_or_insert_with(k, || v);
                        prop_assert_eq!(got, *model.entry(k).or_insert(v));
                    }
                }
                check(&m, &model, keys);
            }
        }
    }

    #[test]
    fn a_slot_is_a_key_and_a_value() {
        // 32 bytes for a page's overlay list, aligned: the one line a lookup loads.
        assert_eq!(std::mem::size_of::<Slot<crate::index::PageOps>>(), 32);
        assert_eq!(std::mem::align_of::<Slot<crate::index::PageOps>>(), 32);
        let m: PageMap<crate::index::PageOps> = {
            let mut m = PageMap::default();
            m.get_or_insert_with(1, Default::default);
            m
        };
        assert_eq!(m.slots.as_ptr() as usize % 32, 0, "a slot never spans two lines");
    }

    #[test]
    fn an_empty_map_allocates_nothing_and_hints_nothing() {
        let m = PageMap::<Vec<u8>>::default();
        assert!(m.slots.is_empty());
        assert_eq!(m.hint(), 0);
        assert_eq!(m.get(&7), None);
        prefetch_hinted::<Vec<u8>>(0, 7);
    }

    #[test]
    fn a_hint_names_the_home_slot() {
        let mut m = PageMap::<u64>::default();
        for k in 0..100 {
            m.insert(k * 4096, k);
        }
        let h = m.hint();
        let base = (h & ((1 << 56) - 1)) as usize;
        assert_eq!(base, m.slots.as_ptr() as usize);
        assert_eq!(h >> 56, u64::from(m.shift));
        // A stale hint (the map grew since) only prefetches: no fault.
        for k in 100..1000 {
            m.insert(k * 4096, k);
        }
        prefetch_hinted::<u64>(h, 5);
        prefetch_hinted::<u64>(u64::MAX >> 8 | 10 << 56, 5);
    }
}
