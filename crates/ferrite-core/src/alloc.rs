//! DRAM allocators: per-shard free-extent lists for blocks, per-shard bitmaps for
//! inode slots. Both are rebuilt at mount (from the checkpoint after a clean unmount,
//! from the logs after a crash) and never stored except in the checkpoint.
//!
//! Invariants:
//! - A block is in at most one free extent; extents never overlap or touch (freeing
//!   merges neighbours) and never cross a shard's range.
//! - Blocks freed by an operation are returned only after that operation's commit
//!   fence, so a crash never finds a committed entry naming a reused block.
//! - A small reserve is kept for operations that free space (unlink, truncate, GC),
//!   so a full pool can always be emptied.
//! - A shard's free blocks are its extents plus its `recent` blocks (single data
//!   blocks a commit replaced, kept out of the extents so that a copy-on-write
//!   overwrite frees and allocates with no extent search); a block is in one of the
//!   two at most, and `recent` is drained into the extents before they are found
//!   empty.
//! - A single-block data allocation takes a `recent` block of any shard of the
//!   preferred shard's group (the shards of one NUMA node) before it searches
//!   extents: a block goes back to the shard of its address, which need not be the
//!   writer's, and an overwrite loop would otherwise free into one shard and take
//!   fresh blocks from another.

use crate::error::{Error, Result};
use crate::layout::Geometry;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Where in the free space an allocation comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// The lowest free extents that fit: file data.
    Low,
    /// The highest free blocks: log pages, kept apart from file data, which would
    /// otherwise split every run of a file written in small appends.
    High,
}

/// Extents `(start, len)` handed out by one allocation.
pub type Runs = smallvec::SmallVec<[(u64, u64); 2]>;

/// A plain bitmap.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bitmap {
    words: Vec<u64>,
    bits: u64,
}

impl Bitmap {
    /// `bits` clear bits.
    pub fn new(bits: u64) -> Bitmap {
        Bitmap { words: vec![0; bits.div_ceil(64) as usize], bits }
    }
    /// `bits` set bits (the bits past `bits` in the last word stay clear).
    pub fn full(bits: u64) -> Bitmap {
        let mut words = vec![!0u64; bits.div_ceil(64) as usize];
        if let Some(last) = words.last_mut().filter(|_| !bits.is_multiple_of(64)) {
            *last = (1u64 << (bits % 64)) - 1;
        }
        Bitmap { words, bits }
    }
    /// From little-endian bytes.
    pub fn from_bytes(bits: u64, b: &[u8]) -> Bitmap {
        let mut bm = Bitmap::new(bits);
        for (i, w) in bm.words.iter_mut().enumerate() {
            let mut x = [0u8; 8];
            let s = i * 8;
            if s < b.len() {
                let e = (s + 8).min(b.len());
                x[..e - s].copy_from_slice(&b[s..e]);
            }
            *w = u64::from_le_bytes(x);
        }
        bm
    }
    /// To little-endian bytes (`bits.div_ceil(8)` bytes).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v: Vec<u8> = self.words.iter().flat_map(|w| w.to_le_bytes()).collect();
        v.truncate(self.bits.div_ceil(8) as usize);
        v
    }
    /// Bit count.
    pub fn len(&self) -> u64 {
        self.bits
    }
    /// No bits?
    pub fn is_empty(&self) -> bool {
        self.bits == 0
    }
    /// Test.
    pub fn get(&self, i: u64) -> bool {
        i < self.bits && self.words[(i / 64) as usize] >> (i % 64) & 1 == 1
    }
    /// Set.
    pub fn set(&mut self, i: u64) {
        self.words[(i / 64) as usize] |= 1 << (i % 64);
    }
    /// Clear.
    pub fn clear(&mut self, i: u64) {
        self.words[(i / 64) as usize] &= !(1 << (i % 64));
    }
    /// First clear bit at or after `from`, wrapping around once; None if all set.
    pub fn first_clear_from(&self, from: u64) -> Option<u64> {
        let nw = self.words.len();
        if nw == 0 {
            return None;
        }
        let from = if from >= self.bits { 0 } else { from };
        let start_w = (from / 64) as usize;
        for k in 0..=nw {
            let wi = (start_w + k) % nw;
            let mut w = self.words[wi];
            if k == 0 {
                w |= (1u64 << (from % 64)) - 1; // ignore bits before `from`
            }
            if w != u64::MAX {
                let bit = wi as u64 * 64 + w.trailing_ones() as u64;
                if bit < self.bits {
                    return Some(bit);
                }
            }
        }
        None
    }

    /// Set bits.
    pub fn count(&self) -> u64 {
        self.words.iter().map(|w| w.count_ones() as u64).sum()
    }
}

/// A bitmap that several recovery workers fill at once; detects double ownership.
pub struct AtomicBitmap {
    words: Vec<AtomicU64>,
    bits: u64,
}

impl AtomicBitmap {
    /// `bits` clear bits.
    pub fn new(bits: u64) -> Self {
        AtomicBitmap { words: (0..bits.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(), bits }
    }
    /// Set bit `i`; false if it was already set.
    pub fn claim(&self, i: u64) -> bool {
        assert!(i < self.bits);
        let m = 1u64 << (i % 64);
        self.words[(i / 64) as usize].fetch_or(m, Ordering::AcqRel) & m == 0
    }
    /// The words of bits `[start, start + n)`: (word index, mask of the range's bits).
    fn word_masks(&self, start: u64, n: u64) -> impl Iterator<Item = (usize, u64)> {
        let end = start.checked_add(n).expect("range end overflows");
        assert!(end <= self.bits);
        let mut i = start;
        std::iter::from_fn(move || {
            if i >= end {
                return None;
            }
            let w = i / 64;
            let lo = i % 64;
            let hi = (end - w * 64).min(64);
            let m = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            i = w * 64 + hi;
            Some((w as usize, m))
        })
    }
    /// Set bits `[start, start + n)` a word at a time; `Err(bit)` names the first bit
    /// that was already set. Recovery claims whole extents with it, so its cost follows
    /// the extents (metadata), not the blocks (data).
    pub fn claim_range(&self, start: u64, n: u64) -> std::result::Result<(), u64> {
        for (w, m) in self.word_masks(start, n) {
            let old = self.words[w].fetch_or(m, Ordering::AcqRel);
            if old & m != 0 {
                return Err(w as u64 * 64 + (old & m).trailing_zeros() as u64);
            }
        }
        Ok(())
    }
    /// Set bits `[start, start + n)` a word at a time, pushing each bit that was
    /// already set onto `again` (recovery counts shared data blocks with it).
    pub fn claim_range_counting(&self, start: u64, n: u64, again: &mut Vec<u64>) {
        for (w, m) in self.word_masks(start, n) {
            let mut old = self.words[w].fetch_or(m, Ordering::AcqRel) & m;
            while old != 0 {
                again.push(w as u64 * 64 + old.trailing_zeros() as u64);
                old &= old - 1;
            }
        }
    }
    /// The first set bit of `[start, start + n)`, if any.
    pub fn first_set(&self, start: u64, n: u64) -> Option<u64> {
        self.word_masks(start, n).find_map(|(w, m)| {
            let hit = self.words[w].load(Ordering::Acquire) & m;
            (hit != 0).then(|| w as u64 * 64 + hit.trailing_zeros() as u64)
        })
    }
    /// Set (`on`) or clear bits `[start, start + n)`, a word at a time.
    pub fn set_range(&self, start: u64, n: u64, on: bool) {
        for (w, m) in self.word_masks(start, n) {
            if on {
                self.words[w].fetch_or(m, Ordering::AcqRel);
            } else {
                self.words[w].fetch_and(!m, Ordering::AcqRel);
            }
        }
    }
    /// Is bit `i` set?
    pub fn get(&self, i: u64) -> bool {
        self.words[(i / 64) as usize].load(Ordering::Acquire) & (1u64 << (i % 64)) != 0
    }
    /// Into a plain bitmap.
    pub fn into_bitmap(self) -> Bitmap {
        Bitmap { words: self.words.into_iter().map(|w| w.into_inner()).collect(), bits: self.bits }
    }
}

/// Single data blocks a shard keeps apart from its extents at most (see
/// [`BlockAlloc::free_data`]).
const RECENT: usize = 32;

#[derive(Default)]
struct FreeList {
    ext: BTreeMap<u64, u64>,
    /// Single data blocks freed lately, reused first (last in, first out) by
    /// single-block data allocations: a 4 KiB overwrite frees one block and takes
    /// one, and the extent searches and updates of both were about 700 of its 8,200
    /// instructions (callgrind, 4 KiB random overwrites of a 64 MiB file).
    recent: smallvec::SmallVec<[u64; RECENT]>,
}

impl FreeList {
    /// No free block at all.
    fn is_empty(&self) -> bool {
        self.ext.is_empty() && self.recent.is_empty()
    }

    /// Add a single data block to `recent` (to the extents when `recent` is
    /// full); `Err(block)` when it is free already. (The allocator checks with its
    /// free map instead and calls [`FreeList::push_recent`].)
    #[cfg(test)]
    fn insert_recent(&mut self, b: u64) -> std::result::Result<(), u64> {
        let in_ext = self.ext.range(..=b).next_back().is_some_and(|(&s, &l)| b < s + l);
        if in_ext || self.recent.contains(&b) {
            return Err(b);
        }
        self.push_recent(b)
    }

    /// Add single data block `b`, known not to be free, to `recent` (to the
    /// extents when `recent` is full).
    fn push_recent(&mut self, b: u64) -> std::result::Result<(), u64> {
        if self.recent.len() == RECENT {
            return self.insert(b, 1);
        }
        self.recent.push(b);
        Ok(())
    }

    /// Move `recent` into the extents (merging), before they are searched for
    /// what `recent` cannot give.
    fn drain_recent(&mut self) {
        while let Some(b) = self.recent.pop() {
            let r = self.insert(b, 1);
            debug_assert!(r.is_ok(), "a recent block was also in an extent");
        }
    }

    /// Add a free extent; `Err(block)` (and nothing added) when part of it is free
    /// already (a double free: the allocator and the logs disagree).
    fn insert(&mut self, start: u64, len: u64) -> std::result::Result<(), u64> {
        if let Some(&r) = self.recent.iter().find(|&&r| r >= start && r < start + len) {
            return Err(r);
        }
        // Two searches (the neighbours), then the merge in place: a log page freed
        // next to a free extent costs no removal and re-insertion of that extent.
        let next = self.ext.range(start..).next().map(|(&s, &l)| (s, l));
        if let Some((ns, _)) = next.filter(|&(ns, _)| ns < start + len) {
            return Err(ns);
        }
        let next_len = next.filter(|&(ns, _)| ns == start + len).map(|(_, nl)| nl);
        if let Some((&ps, pl)) = self.ext.range_mut(..start).next_back() {
            if ps + *pl > start {
                return Err(start.max(ps));
            }
            if ps + *pl == start {
                *pl += len + next_len.unwrap_or(0);
                if next_len.is_some() {
                    self.ext.remove(&(start + len));
                }
                return Ok(());
            }
        }
        match next_len {
            Some(nl) => {
                self.ext.remove(&(start + len));
                self.ext.insert(start, len + nl);
            }
            None => {
                self.ext.insert(start, len);
            }
        }
        Ok(())
    }

    /// Take up to `want` blocks from the end of the highest free extent.
    fn take_high(&mut self, want: u64) -> Option<(u64, u64)> {
        if self.ext.is_empty() {
            self.drain_recent();
        }
        let mut last = self.ext.last_entry()?;
        let l = *last.get();
        let n = want.min(l);
        let start = *last.key() + l - n;
        if n == l {
            last.remove();
        } else {
            *last.get_mut() = l - n;
        }
        Some((start, n))
    }

    /// Take up to `want` blocks as one extent: the first extent at least `want`
    /// long, else the largest one.
    fn take(&mut self, want: u64) -> Option<(u64, u64)> {
        if want == 1 {
            if let Some(b) = self.recent.pop() {
                return Some((b, 1));
            }
        }
        if self.ext.is_empty() {
            self.drain_recent();
        }
        let mut best: Option<(u64, u64)> = None;
        for (&s, &l) in self.ext.iter().take(64) {
            if l >= want {
                best = Some((s, l));
                break;
            }
            if best.is_none_or(|(_, bl)| l > bl) {
                best = Some((s, l));
            }
        }
        if best.is_none_or(|(_, bl)| bl < want) {
            if let Some((&s, &l)) = self.ext.iter().find(|(_, &l)| l >= want) {
                best = Some((s, l));
            }
        }
        let (s, l) = best?;
        self.ext.remove(&s);
        let n = l.min(want);
        if l > n {
            self.ext.insert(s + n, l - n);
        }
        Some((s, n))
    }
}

/// One shard of the block allocator: its lists and the hints read without their
/// lock, on cache lines of their own (128-byte aligned: the adjacent-line
/// prefetcher pulls lines in pairs). Shards side by side shared lines: each hint
/// of all shards lay in one line, stored on every allocation and free, changed or
/// not, and a shard's lists could end in the line where the next one's mutex began.
#[repr(align(128))]
struct Shard {
    list: Mutex<FreeList>,
    /// The shard held free blocks at its last change (written under its lock, read
    /// without): `alloc` skips shards without blocks instead of locking each one. A
    /// client's grants lie in few shards, so its every allocation used to lock and
    /// search all the empty others first (1.8x the allocator's instructions).
    stocked: AtomicBool,
    /// The shard held `recent` blocks at its last change (as `stocked`).
    has_recent: AtomicBool,
    /// The shard's group (the shards of its NUMA node): `[lo, hi)`, packed as
    /// `lo << 32 | hi`. All shards until [`BlockAlloc::set_groups`].
    group: AtomicU64,
}

impl Shard {
    fn lock(&self) -> parking_lot::MutexGuard<'_, FreeList> {
        self.list.lock()
    }

    /// Record the list's state in the hints, storing only what changed: a store
    /// takes the line from the cores that read it.
    fn note(&self, fl: &FreeList) {
        set_if_changed(&self.stocked, !fl.is_empty());
        set_if_changed(&self.has_recent, !fl.recent.is_empty());
    }
}

fn set_if_changed(a: &AtomicBool, v: bool) {
    if a.load(Ordering::Relaxed) != v {
        a.store(v, Ordering::Release);
    }
}

/// The free-block counter, on a line of its own (every allocation and free
/// changes it).
#[repr(align(128))]
struct Counter(AtomicU64);

/// Block allocator.
pub struct BlockAlloc {
    geo: Geometry,
    shards: Vec<Shard>,
    /// A bit per block, set while the block is free (in its shard's extents or
    /// `recent`), changed under that shard's lock: a freed block's double-free check
    /// is a bit, not a search of the extents (a direct-access client's extents are
    /// its grants, often hundreds of single blocks; `release` took 969-1032 perf
    /// samples per 600,000 4 KiB overwrites with the search, 253-328 without), and
    /// the used-block bitmap of a checkpoint is its complement.
    free_map: AtomicBitmap,
    free: Counter,
    reserve: u64,
}

impl BlockAlloc {
    /// All data blocks free except those set in `used`.
    pub fn from_used(geo: &Geometry, used: &Bitmap) -> Self {
        let shards: Vec<Mutex<FreeList>> =
            (0..geo.nshards).map(|_| Mutex::new(FreeList::default())).collect();
        let mut free = 0;
        for s in 0..geo.nshards {
            let (a, b) = geo.shard_range(s);
            let mut fl = shards[s as usize].lock();
            let mut run: Option<u64> = None;
            for blk in a..=b {
                let is_free = blk < b && !used.get(blk);
                match (is_free, run) {
                    (true, None) => run = Some(blk),
                    (false, Some(st)) => {
                        fl.ext.insert(st, blk - st);
                        free += blk - st;
                        run = None;
                    }
                    _ => {}
                }
            }
        }
        let reserve = (geo.nblocks / 512).clamp(8, 1024);
        Self::with_lists(geo, shards, free, reserve)
    }

    /// The allocator of these per-shard lists, holding `free` blocks, all shards in
    /// one group.
    fn with_lists(geo: &Geometry, lists: Vec<Mutex<FreeList>>, free: u64, reserve: u64) -> Self {
        let ns = geo.nshards;
        let free_map = AtomicBitmap::new(geo.nblocks);
        for sh in &lists {
            let fl = sh.lock();
            for (&st, &l) in &fl.ext {
                free_map.set_range(st, l, true);
            }
            for &b in &fl.recent {
                free_map.set_range(b, 1, true);
            }
        }
        let shards = lists
            .into_iter()
            .map(|list| {
                let (stocked, has_recent) = {
                    let fl = list.lock();
                    (!fl.is_empty(), !fl.recent.is_empty())
                };
                Shard {
                    list,
                    stocked: AtomicBool::new(stocked),
                    has_recent: AtomicBool::new(has_recent),
                    group: AtomicU64::new(u64::from(ns)),
                }
            })
            .collect();
        BlockAlloc { free_map, geo: *geo, shards, free: Counter(AtomicU64::new(free)), reserve }
    }

    /// Group the shards: `group_of(s)` is the range `[lo, hi)` of shards that share
    /// shard `s`'s NUMA node (it must contain `s`).
    pub fn set_groups(&self, group_of: impl Fn(u32) -> (u32, u32)) {
        for s in 0..self.geo.nshards {
            let (lo, hi) = group_of(s);
            assert!(lo <= s && s < hi && hi <= self.geo.nshards, "shard {s} outside {lo}..{hi}");
            self.shards[s as usize]
                .group
                .store(u64::from(lo) << 32 | u64::from(hi), Ordering::Relaxed);
        }
    }

    /// No free block and no reserve: a direct-access client's allocator, filled by
    /// the daemon's grants (through [`BlockAlloc::free`]).
    pub fn empty(geo: &Geometry) -> Self {
        let shards = (0..geo.nshards).map(|_| Mutex::new(FreeList::default())).collect();
        Self::with_lists(geo, shards, 0, 0)
    }

    /// A `recent` block of shard `shard`'s group, its own first (see the module's
    /// invariants); shards without one are skipped without their lock.
    fn take_recent(&self, shard: u32) -> Option<u64> {
        let g = self.shards[shard as usize].group.load(Ordering::Relaxed);
        let (lo, hi) = ((g >> 32) as u32, g as u32);
        debug_assert!(lo <= shard && shard < hi);
        for i in 0..hi - lo {
            let s = lo + (shard - lo + i) % (hi - lo);
            let sh = &self.shards[s as usize];
            if !sh.has_recent.load(Ordering::Acquire) {
                continue;
            }
            let mut fl = sh.lock();
            let b = fl.recent.pop();
            sh.note(&fl);
            if let Some(b) = b {
                self.free_map.set_range(b, 1, false);
                return Some(b);
            }
        }
        None
    }

    /// Free blocks.
    pub fn free_blocks(&self) -> u64 {
        self.free.0.load(Ordering::Relaxed)
    }

    /// Blocks held back for space-freeing operations.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    fn debit(&self, n: u64, use_reserve: bool) -> Result<()> {
        let floor = if use_reserve { 0 } else { self.reserve };
        let mut cur = self.free.0.load(Ordering::Relaxed);
        loop {
            if cur < n + floor {
                return Err(Error::NoSpace);
            }
            match self.free.0.compare_exchange_weak(
                cur,
                cur - n,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(c) => cur = c,
            }
        }
    }

    /// Allocate `n` blocks as one or more extents `(start, len)`, preferring `shard`
    /// (inline for up to two extents: allocates nothing in the common case).
    pub fn alloc(&self, shard: u32, n: u64, use_reserve: bool) -> Result<Runs> {
        self.alloc_placed(shard, n, use_reserve, Place::Low)
    }

    /// [`BlockAlloc::alloc`] from the part of the free space `place` names.
    pub fn alloc_placed(
        &self,
        shard: u32,
        n: u64,
        use_reserve: bool,
        place: Place,
    ) -> Result<Runs> {
        if n == 0 {
            return Ok(Runs::new());
        }
        self.debit(n, use_reserve)?;
        let mut out = Runs::new();
        if n == 1 && place == Place::Low {
            if let Some(b) = self.take_recent(shard) {
                out.push((b, 1));
                return Ok(out);
            }
        }
        let mut need = n;
        let ns = self.geo.nshards;
        // The free counter never exceeds what the lists hold (free() inserts before it
        // credits), but a pass over the shards can miss blocks freed into a shard it
        // already visited while another allocator drained a later one: go round again.
        'passes: for _pass in 0..1024 {
            for i in 0..ns {
                let s = (shard + i) % ns;
                let sh = &self.shards[s as usize];
                if !sh.stocked.load(Ordering::Acquire) {
                    continue;
                }
                let mut fl = sh.lock();
                while need > 0 {
                    let got = match place {
                        Place::High => fl.take_high(need),
                        Place::Low => fl.take(need),
                    };
                    match got {
                        Some((st, l)) => {
                            self.free_map.set_range(st, l, false);
                            out.push((st, l));
                            need -= l;
                        }
                        None => break,
                    }
                }
                sh.note(&fl);
                if need == 0 {
                    break 'passes;
                }
            }
            std::thread::yield_now();
        }
        if need > 0 {
            // Not expected; give everything back rather than panic.
            let got: u64 = out.iter().map(|e| e.1).sum();
            for (st, l) in out {
                let s = self.geo.block_shard(st) as usize;
                let mut fl = self.shards[s].lock();
                let r = fl.insert(st, l);
                debug_assert!(r.is_ok(), "blocks just taken were free");
                self.free_map.set_range(st, l, true);
                self.shards[s].note(&fl);
            }
            self.free.0.fetch_add(got + need, Ordering::AcqRel);
            return Err(Error::NoSpace);
        }
        Ok(out)
    }

    /// Allocate one block.
    pub fn alloc_one(&self, shard: u32, use_reserve: bool) -> Result<u64> {
        Ok(self.alloc(shard, 1, use_reserve)?[0].0)
    }

    /// Return blocks `[start, start + len)`. A block that is not a data block or is
    /// free already is left out and reported as corruption (the logs and the
    /// allocator disagree: a damaged checkpoint or log), never a panic.
    pub fn free(&self, start: u64, len: u64) -> Result<()> {
        self.release(start, len, false)
    }

    /// [`BlockAlloc::free`] of data blocks that a commit replaced (the blocks of an
    /// overwritten or truncated file, never log pages): a single block waits in its
    /// shard's `recent` list for the next single-block data allocation, which takes
    /// it without searching the extents. Log pages stay out of it, so that data
    /// keeps to the low blocks ([`Place`]).
    pub fn free_data(&self, start: u64, len: u64) -> Result<()> {
        self.release(start, len, len == 1)
    }

    /// Return `[start, start + len)` to the shards; `recent`: a single block, into
    /// its shard's `recent` list.
    fn release(&self, start: u64, len: u64, recent: bool) -> Result<()> {
        let Some(end) = start.checked_add(len).filter(|&e| e <= self.geo.nblocks) else {
            return Err(Error::Corrupt(format!("freeing blocks {start}+{len} past the pool")));
        };
        if len > 0 && !(self.geo.is_data_block(start) && self.geo.is_data_block(end - 1)) {
            return Err(Error::Corrupt(format!("freeing metadata blocks {start}+{len}")));
        }
        debug_assert!(!recent || len == 1, "only single blocks wait in `recent`");
        let mut b = start;
        let mut bad = None;
        while b < end {
            let s = self.geo.block_shard(b);
            let (_, se) = self.geo.shard_range(s);
            let e = end.min(se);
            let sh = &self.shards[s as usize];
            let mut fl = sh.lock();
            let r = match self.free_map.first_set(b, e - b) {
                Some(x) => Err(x),
                // Checked by the map: into `recent` without a search of the extents
                // (the extents keep their own checks too: their neighbours are
                // searched anyway, to merge).
                None if recent => fl.push_recent(b),
                None => fl.insert(b, e - b),
            };
            match r {
                Ok(()) => {
                    self.free_map.set_range(b, e - b, true);
                    sh.note(&fl);
                    drop(fl);
                    self.free.0.fetch_add(e - b, Ordering::AcqRel);
                }
                Err(x) => bad = bad.or(Some(x)),
            }
            b = e;
        }
        match bad {
            None => Ok(()),
            Some(x) => Err(Error::Corrupt(format!("block {x} freed while already free"))),
        }
    }

    /// Used-block bitmap over the whole pool (metadata blocks included).
    pub fn used_bitmap(&self) -> Bitmap {
        // Every shard held at once (in order; nothing else holds two), so the map is
        // the lists' blocks at one moment: its complement, a word at a time, not a
        // bit per block of the pool.
        let _all: Vec<_> = self.shards.iter().map(|s| s.lock()).collect();
        let mut words: Vec<u64> =
            self.free_map.words.iter().map(|w| !w.load(Ordering::Acquire)).collect();
        let bits = self.geo.nblocks;
        if let Some(last) = words.last_mut().filter(|_| !bits.is_multiple_of(64)) {
            *last &= (1u64 << (bits % 64)) - 1;
        }
        Bitmap { words, bits }
    }
}

/// Inode slot allocator: one bitmap and cursor per shard.
pub struct InodeAlloc {
    geo: Geometry,
    /// Per shard: used bitmap, next bit to try, free slots (a full shard is skipped
    /// without scanning its bitmap).
    shards: Vec<Mutex<(Bitmap, u64, u64)>>,
    free: AtomicU64,
}

impl InodeAlloc {
    /// Every inode number in use: nothing to allocate (a direct-access client's,
    /// whose creates go through the mount), built without a look at each number.
    pub fn full(geo: &Geometry) -> Self {
        let per = geo.ninodes / geo.nshards as u64;
        let shards = (0..geo.nshards).map(|_| Mutex::new((Bitmap::full(per), 0, 0))).collect();
        InodeAlloc { geo: *geo, shards, free: AtomicU64::new(0) }
    }

    /// From the set of used inode numbers (bit `ino - 1`).
    pub fn from_used(geo: &Geometry, used: &Bitmap) -> Self {
        let per = geo.ninodes / geo.nshards as u64;
        let mut free = 0;
        let shards = (0..geo.nshards)
            .map(|s| {
                let mut bm = Bitmap::new(per);
                let mut sfree = 0;
                for local in 0..per {
                    let ino = local * geo.nshards as u64 + s as u64 + 1;
                    if used.get(ino - 1) {
                        bm.set(local);
                    } else {
                        sfree += 1;
                    }
                }
                free += sfree;
                Mutex::new((bm, 0, sfree))
            })
            .collect();
        InodeAlloc { geo: *geo, shards, free: AtomicU64::new(free) }
    }

    /// Free inode slots.
    pub fn free_inodes(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// Take a free inode number, preferring `shard`.
    pub fn alloc(&self, shard: u32) -> Result<u64> {
        let ns = self.geo.nshards;
        for i in 0..ns {
            let s = (shard + i) % ns;
            let mut g = self.shards[s as usize].lock();
            let (bm, cur, sfree) = &mut *g;
            if *sfree == 0 {
                continue;
            }
            if let Some(local) = bm.first_clear_from(*cur) {
                bm.set(local);
                *cur = local + 1;
                *sfree -= 1;
                self.free.fetch_sub(1, Ordering::AcqRel);
                return Ok(local * ns as u64 + s as u64 + 1);
            }
        }
        Err(Error::NoSpace)
    }

    /// Mark `ino` used (mkfs root).
    pub fn mark_used(&self, ino: u64) {
        let s = self.geo.ino_shard(ino);
        let local = (ino - 1) / self.geo.nshards as u64;
        let mut g = self.shards[s as usize].lock();
        if !g.0.get(local) {
            g.0.set(local);
            g.2 -= 1;
            self.free.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Return `ino`; an inode that is free already is reported as corruption.
    pub fn free(&self, ino: u64) -> Result<()> {
        if ino == 0 || ino > self.geo.ninodes {
            return Err(Error::Corrupt(format!("freeing inode {ino} out of range")));
        }
        let s = self.geo.ino_shard(ino);
        let local = (ino - 1) / self.geo.nshards as u64;
        let mut g = self.shards[s as usize].lock();
        if !g.0.get(local) {
            return Err(Error::Corrupt(format!("inode {ino} freed while already free")));
        }
        g.0.clear(local);
        g.2 += 1;
        self.free.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Used-inode bitmap (bit `ino - 1`).
    pub fn used_bitmap(&self) -> Bitmap {
        let ns = self.geo.nshards as u64;
        let mut bm = Bitmap::new(self.geo.ninodes);
        for (s, m) in self.shards.iter().enumerate() {
            let g = m.lock();
            for local in 0..g.0.len() {
                if g.0.get(local) {
                    bm.set(local * ns + s as u64);
                }
            }
        }
        bm
    }
}

/// Call `run(start, len)` for each maximal run of consecutive blocks in
/// `[from, to)` for which `keep` holds. `keep` is asked once per block, in order
/// (it may have effects, as a claim has).
pub(crate) fn runs_where(
    from: u64,
    to: u64,
    mut keep: impl FnMut(u64) -> bool,
    mut run: impl FnMut(u64, u64),
) {
    let mut start: Option<u64> = None;
    for b in from..=to {
        match (b < to && keep(b), start) {
            (true, None) => start = Some(b),
            (false, Some(s)) => {
                run(s, b - s);
                start = None;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_where_finds_maximal_runs_and_asks_each_block_once() {
        let mut asked = Vec::new();
        let mut runs = Vec::new();
        let keep = [false, true, true, false, true, false, false, true];
        runs_where(
            10,
            18,
            |b| {
                asked.push(b);
                keep[(b - 10) as usize]
            },
            |s, n| runs.push((s, n)),
        );
        assert_eq!(asked, (10..18).collect::<Vec<_>>());
        assert_eq!(runs, vec![(11, 2), (14, 1), (17, 1)]);
        runs.clear();
        runs_where(5, 5, |_| true, |s, n| runs.push((s, n)));
        assert!(runs.is_empty());
    }

    /// A 1024-block, 2-shard geometry and its allocator with every data block free.
    fn fresh_blocks() -> (Geometry, BlockAlloc) {
        let g = Geometry::compute(1024, 2, 64).unwrap();
        let mut used = Bitmap::new(1024);
        for b in 0..g.data_start {
            used.set(b);
        }
        let a = BlockAlloc::from_used(&g, &used);
        (g, a)
    }

    /// Regression: a block goes back to the shard of its address, and a writer on
    /// another CPU allocates from its own shard first. A direct-access client's 4
    /// KiB overwrites (its grants spread over the shards) freed into one shard and
    /// took a fresh block from another's extents every time: no block reused while
    /// its lines were hot, and extent searches on both sides (99.97% of 300,000
    /// allocations, counted). A single-block data allocation now takes a recent
    /// block of any shard of its group first, and none of another group.
    #[test]
    fn an_overwrite_reuses_the_block_it_freed_in_any_shard_of_its_node() {
        let (g, a) = fresh_blocks();
        let (lo0, _) = g.shard_range(0);
        let (lo1, _) = g.shard_range(1);
        let b = a.alloc(0, 1, false).unwrap()[0];
        assert_eq!(b, (lo0, 1));
        for _ in 0..3 {
            // Freed into shard 0; the writer now prefers shard 1, which has extents.
            a.free_data(b.0, 1).unwrap();
            assert_eq!(a.alloc(1, 1, false).unwrap()[0], b, "the block just freed");
        }
        // Two groups (two nodes): shard 1 keeps to its own extents.
        a.set_groups(|s| (s, s + 1));
        a.free_data(b.0, 1).unwrap();
        assert_eq!(a.alloc(1, 1, false).unwrap()[0], (lo1, 1));
        assert_eq!(a.alloc(0, 1, false).unwrap()[0], b, "shard 0's own recent block");
        // Larger and log allocations never look at recent blocks of other shards.
        a.set_groups(|_| (0, 2));
        a.free_data(b.0, 1).unwrap();
        assert_eq!(a.alloc(1, 2, false).unwrap()[0], (lo1 + 1, 2));
        assert_eq!(a.alloc_placed(1, 1, false, Place::High).unwrap()[0].1, 1);
        assert_eq!(a.alloc(1, 1, false).unwrap()[0], b);
    }

    #[test]
    fn log_placement_takes_the_top_and_data_the_bottom() {
        let (g, a) = fresh_blocks();
        let total = a.free_blocks();
        let (lo, hi) = g.shard_range(0);
        let mut taken = Vec::new();
        let mut take = |place: Place, n: u64| {
            let r = a.alloc_placed(0, n, false, place).unwrap().to_vec();
            taken.extend_from_slice(&r);
            r
        };
        // High: the last blocks of the shard, one run; Low: the first ones.
        assert_eq!(take(Place::High, 3), [(hi - 3, 3)]);
        assert_eq!(take(Place::Low, 2), [(lo, 2)]);
        assert_eq!(take(Place::High, 1), [(hi - 4, 1)]);
        // Data allocated between log pages stays consecutive.
        assert_eq!(take(Place::Low, 1), [(lo + 2, 1)]);
        for (s, l) in taken {
            a.free(s, l).unwrap();
        }
        assert_eq!(a.free_blocks(), total, "every placement gave back what it took");
        // Every shard, highest first: a request larger than a shard's top extent.
        let all = a.alloc_placed(1, total, true, Place::High).unwrap();
        assert_eq!(all.iter().map(|r| r.1).sum::<u64>(), total);
        assert!(a.alloc_placed(0, 1, true, Place::High).is_err());
    }

    #[test]
    fn alloc_free_merge_and_reserve() {
        let (g, a) = fresh_blocks();
        let total = a.free_blocks();
        let ex = a.alloc(0, 10, false).unwrap();
        assert_eq!(ex.iter().map(|e| e.1).sum::<u64>(), 10);
        for (s, l) in ex {
            a.free(s, l).unwrap();
        }
        assert_eq!(a.free_blocks(), total);
        assert!(a.alloc(1, total, false).is_err());
        let all = a.alloc(1, total, true).unwrap();
        assert!(a.alloc_one(0, true).is_err());
        for (s, l) in all {
            a.free(s, l).unwrap();
        }
        assert_eq!(a.used_bitmap().count(), g.data_start);
    }

    /// Bug: a double free (the logs and the allocator disagree, e.g. after a
    /// checksum-valid but wrong checkpoint) hit `assert!` and took the daemon down.
    /// It is now a corruption error, and nothing of the range is counted twice.
    #[test]
    fn double_frees_are_errors_that_change_nothing() {
        let (g, a) = fresh_blocks();
        let total = a.free_blocks();
        let ex = a.alloc(0, 8, false).unwrap();
        let (s, l) = ex[0];
        a.free(s + 2, 2).unwrap();
        for (fs, fl) in [(s, l), (s + 3, 1), (s + 1, 2), (s + 2, 2)] {
            assert!(matches!(a.free(fs, fl), Err(Error::Corrupt(_))), "{fs}+{fl}");
        }
        assert!(matches!(a.free(0, 1), Err(Error::Corrupt(_))), "metadata block");
        assert!(matches!(a.free(g.nblocks - 1, 2), Err(Error::Corrupt(_))), "past the end");
        assert_eq!(a.free_blocks(), total - l + 2);
        a.free(s, 2).unwrap();
        // A single data block waits in `recent`: freeing it again either way, or a
        // metadata block, is the same error.
        a.free_data(s + 4, 1).unwrap();
        assert!(matches!(a.free_data(s + 4, 1), Err(Error::Corrupt(_))));
        assert!(matches!(a.free(s + 4, 2), Err(Error::Corrupt(_))));
        assert!(matches!(a.free_data(0, 1), Err(Error::Corrupt(_))));
        a.free(s + 5, l - 5).unwrap();
        assert_eq!(a.free_blocks(), total);
        // And it is the next single block handed out.
        assert_eq!(a.alloc_one(g.block_shard(s + 4), false).unwrap(), s + 4);
        a.free_data(s + 4, 1).unwrap();
        assert_eq!(a.free_blocks(), total);
        let ia = InodeAlloc::from_used(&g, &Bitmap::new(64));
        let i = ia.alloc(0).unwrap();
        ia.free(i).unwrap();
        assert!(matches!(ia.free(i), Err(Error::Corrupt(_))));
        assert!(matches!(ia.free(0), Err(Error::Corrupt(_))));
        assert!(matches!(ia.free(65), Err(Error::Corrupt(_))));
    }

    #[test]
    fn a_full_inode_allocator_is_the_one_built_from_every_number_in_use() {
        for bits in [0, 1, 63, 64, 65, 130] {
            let f = Bitmap::full(bits);
            assert_eq!(f.count(), bits, "{bits} bits");
            assert!((0..bits).all(|i| f.get(i)) && !f.get(bits));
        }
        let g = Geometry::compute(4096, 4, 256).unwrap();
        let mut all = Bitmap::new(g.ninodes);
        (0..g.ninodes).for_each(|i| all.set(i));
        let (a, b) = (InodeAlloc::full(&g), InodeAlloc::from_used(&g, &all));
        for ia in [&a, &b] {
            assert_eq!(ia.free_inodes(), 0);
            assert!(matches!(ia.alloc(1), Err(Error::NoSpace)));
            ia.free(77).unwrap();
            assert_eq!(ia.alloc(0).unwrap(), 77);
            assert!(matches!(ia.free(g.ninodes + 1), Err(Error::Corrupt(_))));
        }
        assert_eq!(a.used_bitmap().to_bytes(), b.used_bitmap().to_bytes());
    }

    /// The free map holds exactly the blocks of the shards' lists.
    fn assert_free_map_matches_lists(a: &BlockAlloc) -> std::result::Result<(), String> {
        let mut listed = std::collections::BTreeSet::new();
        for sh in &a.shards {
            let fl = sh.lock();
            listed.extend(fl.ext.iter().flat_map(|(&s, &l)| s..s + l));
            listed.extend(fl.recent.iter().copied());
        }
        for b in 0..a.geo.nblocks {
            if a.free_map.get(b) != listed.contains(&b) {
                let m = a.free_map.get(b);
                return Err(format!("block {b}: in the map {m}, in the lists {}", !m));
            }
        }
        Ok(())
    }

    proptest::proptest! {
        /// The allocator against a set of free blocks, through its API: allocations
        /// of one or several blocks (data and log placement, any preferred shard),
        /// frees of extents and of single data blocks. Every double free (of a block
        /// in the extents or in `recent`) is an error that changes nothing, every
        /// other free and every allocation moves exactly its blocks, and the free
        /// map stays the lists' blocks.
        #[test]
        fn the_allocator_matches_a_block_set(
            ops in proptest::collection::vec((0u8..4, 0u32..2, 0u64..1024, 1u64..5), 1..200)
        ) {
            let (g, a) = fresh_blocks();
            let mut free: std::collections::BTreeSet<u64> =
                (0..g.nblocks).filter(|&b| g.is_data_block(b)).collect();
            for (kind, shard, at, n) in ops {
                match kind {
                    0 | 1 => {
                        let place = if kind == 0 { Place::Low } else { Place::High };
                        if let Ok(runs) = a.alloc_placed(shard, n, true, place) {
                            for (s, l) in runs {
                                for b in s..s + l {
                                    let was_free = free.remove(&b);
                                    proptest::prop_assert!(was_free, "block {} handed out twice", b);
                                }
                            }
                        }
                    }
                    _ => {
                        let len = if kind == 2 { n } else { 1 };
                        let end = (at + len).min(g.nblocks);
                        let data = (at..end).all(|b| g.is_data_block(b)) && end == at + len;
                        let r = if kind == 2 { a.free(at, len) } else { a.free_data(at, len) };
                        if !data {
                            proptest::prop_assert!(r.is_err(), "free of {}+{} accepted", at, len);
                        } else {
                            // Per shard: a part with a free block is refused whole
                            // (the call fails), the other parts are freed.
                            let mut doubled = false;
                            let mut b = at;
                            while b < end {
                                let e = end.min(g.shard_range(g.block_shard(b)).1);
                                if (b..e).any(|x| free.contains(&x)) {
                                    doubled = true;
                                } else {
                                    free.extend(b..e);
                                }
                                b = e;
                            }
                            let refused = r.is_err();
                            proptest::prop_assert_eq!(refused, doubled, "free {}+{}: {:?}", at, len, r);
                        }
                    }
                }
                proptest::prop_assert_eq!(a.free_blocks(), free.len() as u64);
                let used = a.used_bitmap();
                let wrong = (0..g.nblocks).find(|&b| used.get(b) == free.contains(&b));
                proptest::prop_assert!(wrong.is_none(), "used bitmap wrong at {:?}", wrong);
                let matches = assert_free_map_matches_lists(&a);
                matches.map_err(proptest::test_runner::TestCaseError::fail)?;
            }
        }
    }

    proptest::proptest! {
        /// The free list against a set of free blocks: every insert either adds
        /// exactly its blocks or, when one of them is free already, fails naming a
        /// free block of the range and changes nothing; the extents stay disjoint,
        /// in order and merged (no two touch).
        #[test]
        fn free_list_insert_matches_a_block_set(
            ops in proptest::collection::vec((0u64..96, 1u64..6), 1..80)
        ) {
            let mut fl = FreeList::default();
            let mut model = std::collections::BTreeSet::new();
            for (start, len) in ops {
                let before = fl.ext.clone();
                let clash = (start..start + len).find(|b| model.contains(b));
                match fl.insert(start, len) {
                    Ok(()) => {
                        proptest::prop_assert!(clash.is_none());
                        model.extend(start..start + len);
                    }
                    Err(b) => {
                        proptest::prop_assert!(clash.is_some());
                        proptest::prop_assert!(model.contains(&b) && (start..start + len).contains(&b));
                        proptest::prop_assert_eq!(&fl.ext, &before);
                    }
                }
                let blocks: std::collections::BTreeSet<u64> =
                    fl.ext.iter().flat_map(|(&s, &l)| s..s + l).collect();
                proptest::prop_assert_eq!(&blocks, &model);
                let v: Vec<(u64, u64)> = fl.ext.iter().map(|(&s, &l)| (s, l)).collect();
                for w in v.windows(2) {
                    proptest::prop_assert!(w[0].0 + w[0].1 < w[1].0, "{:?} not merged", w);
                }
            }
        }
    }

    proptest::proptest! {
        /// The free list with its `recent` blocks against a set of free blocks:
        /// extent inserts, single-block recycles, and takes from the bottom and
        /// the top. A free block is in the extents or in `recent`, never both; a
        /// double free fails and changes nothing; a take hands out free blocks only
        /// and fails only when nothing is free.
        #[test]
        fn free_list_with_recent_matches_a_block_set(
            ops in proptest::collection::vec((0u8..4, 0u64..96, 1u64..6), 1..120)
        ) {
            let mut fl = FreeList::default();
            let mut model = std::collections::BTreeSet::new();
            for (kind, start, len) in ops {
                match kind {
                    0 | 1 => {
                        let len = if kind == 0 { len } else { 1 };
                        let clash = (start..start + len).any(|b| model.contains(&b));
                        let before = (fl.ext.clone(), fl.recent.clone());
                        let r = if kind == 0 {
                            fl.insert(start, len)
                        } else {
                            fl.insert_recent(start)
                        };
                        match r {
                            Ok(()) => {
                                proptest::prop_assert!(!clash);
                                model.extend(start..start + len);
                            }
                            Err(b) => {
                                proptest::prop_assert!(clash && model.contains(&b));
                                proptest::prop_assert_eq!(&fl.ext, &before.0);
                                proptest::prop_assert_eq!(&fl.recent, &before.1);
                            }
                        }
                    }
                    _ => {
                        let got = if kind == 2 { fl.take(len) } else { fl.take_high(len) };
                        match got {
                            Some((s, n)) => {
                                proptest::prop_assert!(n >= 1 && n <= len);
                                for b in s..s + n {
                                    proptest::prop_assert!(model.remove(&b), "{} not free", b);
                                }
                            }
                            None => proptest::prop_assert!(model.is_empty()),
                        }
                    }
                }
                proptest::prop_assert!(fl.recent.len() <= RECENT);
                let in_ext: std::collections::BTreeSet<u64> =
                    fl.ext.iter().flat_map(|(&s, &l)| s..s + l).collect();
                let in_recent: std::collections::BTreeSet<u64> =
                    fl.recent.iter().copied().collect();
                proptest::prop_assert_eq!(in_recent.len(), fl.recent.len());
                proptest::prop_assert!(in_ext.is_disjoint(&in_recent));
                let all: std::collections::BTreeSet<u64> =
                    in_ext.union(&in_recent).copied().collect();
                proptest::prop_assert_eq!(&all, &model);
                proptest::prop_assert_eq!(fl.is_empty(), model.is_empty());
            }
        }
    }

    #[test]
    fn inode_alloc_roundtrip() {
        let g = Geometry::compute(1024, 4, 64).unwrap();
        let ia = InodeAlloc::from_used(&g, &Bitmap::new(64));
        ia.mark_used(1);
        let mut seen = std::collections::HashSet::new();
        while let Ok(i) = ia.alloc(2) {
            assert!(seen.insert(i) && (1..=64).contains(&i) && i != 1);
        }
        assert_eq!(seen.len(), 63);
        ia.free(5).unwrap();
        assert_eq!(ia.alloc(0).unwrap(), 5);
    }

    #[test]
    fn first_clear_wraps_and_respects_length() {
        let mut b = Bitmap::new(70);
        for i in 0..70 {
            b.set(i);
        }
        assert_eq!(b.first_clear_from(3), None);
        b.clear(1);
        assert_eq!(b.first_clear_from(3), Some(1));
        b.clear(69);
        assert_eq!(b.first_clear_from(3), Some(69));
        assert_eq!(b.first_clear_from(70), Some(1));
    }

    /// Regression guard: an allocation that passed a shard just before another thread
    /// freed blocks into it, while a third drained the later shards, found nothing
    /// although the free counter promised enough, and panicked ("free counter out of
    /// step"); seen once in the benchmark smoke test's GC-under-pressure run on a
    /// 95%-full pool. The window is narrow: this stress test exercises the path but
    /// did not reproduce the panic on the old code in a few runs here.
    #[test]
    fn concurrent_alloc_and_free_on_a_nearly_full_pool_never_panics() {
        let g = Geometry::compute(2048, 4, 64).unwrap();
        let mut used = Bitmap::new(2048);
        for b in 0..g.data_start {
            used.set(b);
        }
        let a = std::sync::Arc::new(BlockAlloc::from_used(&g, &used));
        let total = a.free_blocks();
        // Hold all but a few blocks so the threads fight over the rest.
        let held = a.alloc(0, total - 3, true).unwrap();
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let a = a.clone();
                std::thread::spawn(move || {
                    for i in 0..50_000u32 {
                        let want = 1 + ((i + t) % 3) as u64;
                        if let Ok(ex) = a.alloc(t, want, true) {
                            assert_eq!(ex.iter().map(|e| e.1).sum::<u64>(), want);
                            for (s, l) in ex {
                                a.free(s, l).unwrap();
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for (s, l) in held {
            a.free(s, l).unwrap();
        }
        assert_eq!(a.free_blocks(), total);
    }
}
