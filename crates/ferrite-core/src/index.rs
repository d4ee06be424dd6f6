//! DRAM indexes rebuilt from an inode's log: the page index of a file, the name
//! index of a directory, extended attributes, and live-reference counts per log page.
//!
//! Invariants:
//! - [`InodeState::apply`] is the only way state changes, both when a log is replayed
//!   and after an operation commits, so the DRAM state after any sequence of
//!   operations equals the state a remount rebuilds from the log.
//! - `refs[page]` counts the live references into log page `page`: one per file page
//!   mapped by a WRITE entry, one per overlay (INLINE), one for the latest SETATTR,
//!   one per live directory entry and extended attribute, and one for every *pinned*
//!   entry (a shrinking SETATTR, PUNCH, a DENTRY or XATTR removal), whose effect is
//!   needed while older entries remain. A page whose count is zero holds only dead
//!   entries and can be unlinked by fast GC; pinned entries go at thorough GC.
//! - For a file page, a WRITE replaces the base block and clears the page's ops.

use crate::cookies::CookieOrder;
use crate::layout::BLOCK;
use crate::log::{AttrRec, Entry, LogState, Ts};
use crate::pagemap::PageMap;
use crate::pmem::Medium;
use smallvec::SmallVec;
use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU64;

/// File type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum FileType {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// Named pipe (format version 3).
    Fifo,
    /// Character device (format version 3).
    CharDevice,
    /// Block device (format version 3).
    BlockDevice,
    /// Unix domain socket (format version 3).
    Socket,
}

impl FileType {
    /// On-media code.
    pub fn code(self) -> u8 {
        match self {
            FileType::Regular => 1,
            FileType::Directory => 2,
            FileType::Symlink => 3,
            FileType::Fifo => 4,
            FileType::CharDevice => 5,
            FileType::BlockDevice => 6,
            FileType::Socket => 7,
        }
    }
    /// From the on-media code.
    pub fn from_code(c: u32) -> Option<FileType> {
        match c {
            1 => Some(FileType::Regular),
            2 => Some(FileType::Directory),
            3 => Some(FileType::Symlink),
            4 => Some(FileType::Fifo),
            5 => Some(FileType::CharDevice),
            6 => Some(FileType::BlockDevice),
            7 => Some(FileType::Socket),
            _ => None,
        }
    }
    /// The S_IFMT bits.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::Fifo => libc::S_IFIFO,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::Socket => libc::S_IFSOCK,
        }
    }
    /// The type of the S_IFMT bits of `mode`, if any.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        [
            FileType::Regular,
            FileType::Directory,
            FileType::Symlink,
            FileType::Fifo,
            FileType::CharDevice,
            FileType::BlockDevice,
            FileType::Socket,
        ]
        .into_iter()
        .find(|t| t.mode_bits() == mode & libc::S_IFMT)
    }
    /// A node that holds no data and only a name, owner and mode (and a device
    /// number): the kernel runs the pipe, device or socket.
    pub fn is_special(self) -> bool {
        matches!(
            self,
            FileType::Fifo | FileType::CharDevice | FileType::BlockDevice | FileType::Socket
        )
    }
}

/// An operation layered over a page's base content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageOp {
    /// Bytes from an INLINE entry at `loc` (payload at `loc + data_off`).
    Overlay {
        /// Entry address (never 0: entries are in data blocks, which lie past the
        /// superblock; the niche keeps an op at 16 bytes, a page's list of
        /// [`crate::MAX_PAGE_OPS`] at 512).
        loc: NonZeroU64,
        /// Payload offset inside the entry.
        data_off: u32,
        /// Offset in the page.
        off: u16,
        /// Length.
        len: u16,
    },
    /// Zeroes (truncation or punch inside the page).
    Zero {
        /// Offset in the page.
        off: u16,
        /// Length.
        len: u16,
    },
}

const _: () = assert!(std::mem::size_of::<PageOp>() == 16);

pub use crate::extmap::Ext;
use crate::extmap::{ExtMap, MAX_RUN};

/// Page index of a file.
#[derive(Clone, Debug, Default)]
pub struct FileIndex {
    /// Runs keyed by first page.
    pub ext: ExtMap,
    /// Ops per page, in order.
    pub ops: PageMap<PageOps>,
    mapped: u64,
    /// Op lists of pages merged since, kept for the next pages that get ops (at most
    /// [`SPARE_OPS`]): under steady sub-page writes a page's list comes from here and
    /// goes back at its merge, so neither allocates (a list's growth held 8-15% of a
    /// 64 B write's perf samples, mostly first-touch faults of the growing heap; the
    /// time per write did not move measurably without it).
    spare: Vec<Box<[PageOp]>>,
    /// The run of in-place appends ([`crate::log::FLAG_TAIL`]) the file's last
    /// entry continues, if its last entry is one: the next append may write into
    /// the same block past its end. Any other entry ends the run (DRAM only).
    pub tail: Option<TailRun>,
}

/// The last of a file's in-place appends, when nothing came after it: page `pg`
/// lives in `block`, whose bytes from `valid` on are zero (not the file's), and
/// `crc` is the page's [`crate::log::page_crc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TailRun {
    /// File page.
    pub pg: u64,
    /// Its block.
    pub block: u64,
    /// Bytes of the page that are the file's (1..4096).
    pub valid: u32,
    /// The page's checksum.
    pub crc: u32,
}

/// Op lists a file keeps for reuse.
const SPARE_OPS: usize = 4;

/// Ops a page's list has room for at its first op.
const FIRST_OPS: usize = 16;

/// The ops of one page, in order, and the overlay bytes they carry (kept beside
/// them so that a write deciding whether to embed reads one hash slot, not the list).
///
/// 24 bytes (a boxed slice with a 32-bit length, not a `Vec`), so that a map slot
/// (key and value) is 32 bytes and, aligned to 32, never straddles two cache lines:
/// with a `Vec` a slot was 40 bytes and half of them spanned two lines (no time
/// change measured: a random sub-page write's lookup misses on the key's line
/// either way; docs/BENCHMARKS.md, stop of 2026-12-03).
#[derive(Clone, Debug, Default)]
pub struct PageOps {
    /// Room for the ops; the first `len` are the page's, the rest are filler.
    buf: Box<[PageOp]>,
    len: u32,
    bytes: u32,
}

const _: () = assert!(std::mem::size_of::<PageOps>() == 24);

/// What an op list's unused room holds.
const FILL: PageOp = PageOp::Zero { off: 0, len: 0 };

impl PageOps {
    /// An empty list in `buf` (a recycled one's room, or none).
    fn with_room(buf: Box<[PageOp]>) -> PageOps {
        PageOps { buf, len: 0, bytes: 0 }
    }

    /// Add an op at the end.
    pub fn push(&mut self, op: PageOp) {
        if let PageOp::Overlay { len, .. } = op {
            self.bytes += len as u32;
        }
        let n = self.len as usize;
        if n == self.buf.len() {
            // At once 16 ops (256 bytes): one allocation for the ops of most
            // pages, where 8 and then 16 ops of 24 bytes took two (and 384 bytes);
            // a page that reaches `MAX_PAGE_OPS` or a last page's appends double it.
            let mut grown = vec![FILL; (n * 2).max(FIRST_OPS)].into_boxed_slice();
            grown[..n].copy_from_slice(&self.buf);
            self.buf = grown;
        }
        self.buf[n] = op;
        self.len += 1;
    }

    /// Keep the ops `keep` accepts, in order (the bytes of those dropped go).
    pub fn retain(&mut self, mut keep: impl FnMut(&PageOp) -> bool) {
        let mut w = 0;
        for r in 0..self.len as usize {
            let op = self.buf[r];
            if keep(&op) {
                self.buf[w] = op;
                w += 1;
            } else if let PageOp::Overlay { len, .. } = op {
                self.bytes -= u32::from(len);
            }
        }
        self.len = w as u32;
    }

    /// Overlay bytes carried.
    pub fn bytes(&self) -> usize {
        self.bytes as usize
    }
}

impl std::ops::Deref for PageOps {
    type Target = [PageOp];
    fn deref(&self) -> &[PageOp] {
        &self.buf[..self.len as usize]
    }
}

impl<'a> IntoIterator for &'a PageOps {
    type Item = &'a PageOp;
    type IntoIter = std::slice::Iter<'a, PageOp>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for PageOps {
    type Item = PageOp;
    type IntoIter = std::iter::Take<std::vec::IntoIter<PageOp>>;
    fn into_iter(self) -> Self::IntoIter {
        let n = self.len as usize;
        self.buf.into_vec().into_iter().take(n)
    }
}

/// A removed piece of a run.
pub type Piece = (u64, Ext); // (first page, run)
/// Pieces an index change replaced (inline: an overwrite allocates nothing).
pub type Pieces = SmallVec<[Piece; 2]>;

impl FileIndex {
    /// The ops of page `pg`, an empty list (a spare one if kept) when it has none.
    fn ops_mut(&mut self, pg: u64) -> &mut PageOps {
        let FileIndex { ops, spare, .. } = self;
        ops.get_or_insert_with(pg, || PageOps::with_room(spare.pop().unwrap_or_default()))
    }

    /// Keep a removed page's op list for reuse, if it has room and there is a slot.
    fn recycle(&mut self, ops: PageOps) {
        if ops.buf.is_empty() || self.spare.len() >= SPARE_OPS {
            return;
        }
        if self.spare.capacity() == 0 {
            self.spare.reserve_exact(SPARE_OPS);
        }
        self.spare.push(ops.buf);
    }

    /// Pages mapped by runs.
    pub fn mapped_pages(&self) -> u64 {
        self.mapped
    }

    /// Pages with any content (for st_blocks).
    pub fn content_pages(&self) -> u64 {
        self.mapped + self.ops.keys().filter(|&&p| self.lookup(p).is_none()).count() as u64
    }

    /// The pages of `[a, b)` with no content (no run, no op), in order, walking
    /// runs rather than pages; `None` when there are more than `limit` (the walk
    /// then stops after counting, whatever the range's length).
    pub fn holes(&self, a: u64, b: u64, limit: u64) -> Option<Vec<u64>> {
        if a >= b {
            return Some(Vec::new());
        }
        let mapped: u64 =
            self.ext.runs_in(a, b).map(|(pg, e)| (pg + e.len as u64).min(b) - pg.max(a)).sum();
        let unmapped_ops =
            self.ops.keys().filter(|&&p| p >= a && p < b && self.lookup(p).is_none()).count();
        let holes = (b - a) - mapped - unmapped_ops as u64;
        if holes > limit {
            return None;
        }
        let mut out = Vec::with_capacity(holes as usize);
        let gap = |from: u64, to: u64, out: &mut Vec<u64>| {
            out.extend((from..to).filter(|p| !self.ops.contains_key(p)));
        };
        let mut at = a;
        for (pg, e) in self.ext.runs_in(a, b) {
            gap(at, pg.max(at), &mut out);
            at = at.max(pg + e.len as u64);
        }
        gap(at, b, &mut out);
        debug_assert_eq!(out.len() as u64, holes);
        Some(out)
    }

    /// The first page at or after `pg` with content (a run or an op), if any.
    pub fn next_data(&self, pg: u64) -> Option<u64> {
        let run = self.ext.runs_in(pg, u64::MAX).next().map(|(s, _)| s.max(pg));
        let op = self.ops.keys().copied().filter(|&p| p >= pg).min();
        match (run, op) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The first page at or after `pg` without content (walks runs and ops, not
    /// the pages of a run).
    pub fn next_hole(&self, mut pg: u64) -> u64 {
        loop {
            if let Some((s, e)) = self.ext.floor(pg) {
                if pg < s + e.len as u64 {
                    pg = s + e.len as u64;
                    continue;
                }
            }
            if self.ops.contains_key(&pg) {
                pg += 1;
                continue;
            }
            return pg;
        }
    }

    /// The block mapped at page `pg` and the entry that mapped it.
    pub fn lookup(&self, pg: u64) -> Option<(u64, u64)> {
        let (s, e) = self.ext.floor(pg)?;
        (pg < s + e.len as u64).then(|| (e.block + (pg - s), e.loc))
    }

    /// Remove the mappings of pages `[a, b)`, returning the removed pieces.
    pub fn remove_range(&mut self, a: u64, b: u64) -> Pieces {
        let mut out = Pieces::new();
        if a >= b {
            return out;
        }
        // A run starting before `a` that overlaps it: split.
        if let Some((s, e)) = self.ext.below(a) {
            let end = s + e.len as u64;
            if end > a {
                self.ext.insert(s, Ext { len: (a - s) as u32, ..e });
                let cut_end = end.min(b);
                out.push((
                    a,
                    Ext { len: (cut_end - a) as u32, block: e.block + (a - s), loc: e.loc },
                ));
                if end > b {
                    self.ext.insert(
                        b,
                        Ext { len: (end - b) as u32, block: e.block + (b - s), loc: e.loc },
                    );
                }
            }
        }
        for s in self.ext.starts_in(a, b) {
            let e = self.ext.remove(s).expect("key just listed");
            let end = s + e.len as u64;
            if end > b {
                self.ext
                    .insert(b, Ext { len: (end - b) as u32, block: e.block + (b - s), loc: e.loc });
                out.push((s, Ext { len: (b - s) as u32, ..e }));
            } else {
                out.push((s, e));
            }
        }
        for (_, e) in &out {
            self.mapped -= e.len as u64;
        }
        out
    }

    /// Map pages `[pg, pg + n)` to blocks `[block, block + n)`; returns replaced pieces.
    pub fn insert(&mut self, pg: u64, n: u32, block: u64, loc: u64) -> Pieces {
        if n <= MAX_RUN {
            if pg >= self.ext.end() {
                // Past every run (replay and snapshots map files in page order).
                self.ext.push_back(pg, Ext { len: n, block, loc });
                self.mapped += n as u64;
                return Pieces::new();
            }
            if let Some(old) = self.ext.replace_same(pg, Ext { len: n, block, loc }) {
                return smallvec::smallvec![(pg, old)];
            }
            if let Some(old) = self.ext.split_replace(pg, Ext { len: n, block, loc }) {
                return smallvec::smallvec![(pg, old)];
            }
        }
        let out = self.remove_range(pg, pg + n as u64);
        // Runs longer than the map packs are kept as several (same entry).
        let mut done = 0u32;
        while done < n {
            let len = (n - done).min(MAX_RUN);
            self.ext.insert(pg + done as u64, Ext { len, block: block + done as u64, loc });
            done += len;
        }
        self.mapped += n as u64;
        out
    }
}

/// A live directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEnt {
    /// Target inode.
    pub ino: u64,
    /// Stable readdir cookie.
    pub cookie: u64,
    /// Address of the DENTRY entry.
    pub loc: u64,
    /// Target type code.
    pub ftype: u8,
}

/// A name in a directory's index: inline up to [`DIR_NAME_INLINE`] bytes, so a
/// lookup compares it in the hash table's own slot, and adding or removing one
/// allocates nothing. They were `Arc<[u8]>`s shared by both maps: `profile_op
/// unlink` (200,000 files in one directory) spent 15% of its samples on the load
/// of the name a slot pointed to and 6% in malloc and free. A longer name spills
/// to the heap once per map (the `Arc` was shared): more DRAM for directories of
/// long names, not measured.
///
/// Measured (`ferrite bench --quick --experiments meta --targets lib,tmpfs --files
/// 100000 --reps 3`, the full preset's directories): create 491K and 331K ops/s
/// before, 619K and 568K after; unlink 458K and 348K before, 501K and 516K after
/// (tmpfs 142K-176K and 164K-205K). DRAM per idle file (the full preset's memory
/// experiment, goal at most 300 bytes; four rounds of the builds in turn): 193 bytes
/// before, 194 after; with 24 inline bytes 225 (a table of 1,000 names is then just
/// over 128 KiB, glibc's default threshold for a mapping of its own; not looked
/// into further).
pub type DirName = SmallVec<[u8; DIR_NAME_INLINE]>;

/// Bytes of a name kept inline (a [`DirName`] is 24 bytes).
pub const DIR_NAME_INLINE: usize = 16;
const _: () = assert!(std::mem::size_of::<DirName>() == 24);

/// Name index of a directory.
#[derive(Clone, Debug, Default)]
pub struct DirIndex {
    /// Name to entry. Names come from users, so the hash is keyed per process
    /// (foldhash: minimally DoS-resistant, a tenth of SipHash's instructions on a
    /// short name).
    pub names: HashMap<DirName, DirEnt, foldhash::fast::RandomState>,
    /// Cookie order for readdir.
    pub order: CookieOrder,
    /// Next cookie to hand out (cookies 1 and 2 are "." and "..").
    pub next_cookie: u64,
}

/// Where an extended attribute's value lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrRef {
    /// Entry address.
    pub loc: u64,
    /// Value offset inside the entry.
    pub value_off: u32,
    /// Value length.
    pub value_len: u32,
    /// The data blocks of a value too large for an entry.
    pub spill: Option<crate::log::Spill>,
}

/// Type-specific body.
#[derive(Clone, Debug)]
pub enum Body {
    /// Regular file or symlink data.
    File(FileIndex),
    /// Directory names.
    Dir(DirIndex),
}

/// Everything known about an inode in DRAM.
#[derive(Clone, Debug)]
pub struct InodeState {
    /// File type.
    pub ftype: FileType,
    /// Attributes.
    pub attr: AttrRec,
    /// Data or names.
    pub body: Body,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, XattrRef>,
    /// Latest SETATTR.
    pub setattr_loc: Option<u64>,
    /// Live references per log page.
    pub refs: PageRefs,
    /// Log pointers and pages.
    pub log: LogState,
    /// Log page count at which thorough GC is next considered.
    pub gc_check_at: usize,
    /// Log pages right after the last thorough GC (0 before one): what a
    /// compaction really gives, where `gc` can only estimate it.
    pub gc_floor: usize,
    /// With free space low, thorough GC is not considered again before the log
    /// holds more pages than this (see `gc::after_commit`).
    pub gc_low_at: usize,
    /// Chain generation (see `share`) this state was built at: another party's GC
    /// since then means a replay from the head, not a catch-up from the old tail.
    pub chain_gen: u32,
    /// Log pages whose count dropped to zero since fast GC last ran (candidates;
    /// inline, so the first page to die in a new inode's log allocates nothing).
    pub dead: DeadPages,
}

/// Log pages of one log (dead ones: see [`InodeState::dead`]).
pub type DeadPages = SmallVec<[u64; 4]>;

/// Live entries per log page: a sorted vector, inline for the one or two pages most
/// logs have (a new inode's costs no allocation), binary-searched up to
/// `PAGE_REFS_SMALL` pages; a hash map beyond, so a long log (a file with thousands of
/// log pages) pays no shifting of the vector on each page added or collected.
#[derive(Clone, Debug)]
pub enum PageRefs {
    /// Few pages: sorted by page.
    Small(SmallVec<[(u64, u32); 2]>),
    /// Many pages.
    Large(LargeRefs),
}

/// The counts of a long log: a hash map, and the count of the page that
/// [`PageRefs::entry`] asked for last kept apart from it. Every commit adds to the
/// count of the page its entries went to, the log's tail page, so one commit after
/// another finds it there without hashing (`profile_op randwrite64` over 4,096
/// pages under callgrind, writes 50,001-100,000: 2,044 -> 2,016 instructions a
/// write).
///
/// Invariant: the map holds no count for `hot_page`; `hot` is that page's count.
#[derive(Clone, Debug)]
pub struct LargeRefs {
    map: HashMap<u64, u32, foldhash::fast::RandomState>,
    /// The page whose count is `hot` ([`NO_PAGE`]: none).
    hot_page: u64,
    hot: u32,
}

/// No page (log pages are block-aligned addresses).
const NO_PAGE: u64 = u64::MAX;

impl LargeRefs {
    fn from_counts(counts: impl Iterator<Item = (u64, u32)>) -> Self {
        LargeRefs { map: counts.collect(), hot_page: NO_PAGE, hot: 0 }
    }

    /// The count of `page`, inserted as 0 if absent; `page` becomes the hot one.
    fn entry(&mut self, page: u64) -> &mut u32 {
        debug_assert_ne!(page, NO_PAGE);
        if self.hot_page != page {
            if self.hot_page != NO_PAGE {
                let prev = self.map.insert(self.hot_page, self.hot);
                debug_assert!(prev.is_none(), "the hot page's count is kept apart");
            }
            self.hot = self.map.remove(&page).unwrap_or(0);
            self.hot_page = page;
        }
        &mut self.hot
    }

    fn get_mut(&mut self, page: u64) -> Option<&mut u32> {
        if page == self.hot_page {
            return Some(&mut self.hot);
        }
        self.map.get_mut(&page)
    }

    fn get(&self, page: u64) -> Option<u32> {
        if page == self.hot_page {
            return Some(self.hot);
        }
        self.map.get(&page).copied()
    }

    fn remove(&mut self, page: u64) {
        if page == self.hot_page {
            self.hot_page = NO_PAGE;
            self.hot = 0;
        } else {
            self.map.remove(&page);
        }
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        let hot = (self.hot_page != NO_PAGE).then_some((self.hot_page, self.hot));
        self.map.iter().map(|(&p, &c)| (p, c)).chain(hot)
    }
}

/// Pages kept in [`PageRefs::Small`] before it becomes a map.
const PAGE_REFS_SMALL: usize = 32;

impl Default for PageRefs {
    fn default() -> Self {
        PageRefs::Small(SmallVec::new())
    }
}

impl PageRefs {
    /// The count of `page`, inserted as 0 if absent.
    pub fn entry(&mut self, page: u64) -> &mut u32 {
        if let PageRefs::Small(v) = self {
            if v.len() >= PAGE_REFS_SMALL && v.binary_search_by_key(&page, |e| e.0).is_err() {
                *self = PageRefs::Large(LargeRefs::from_counts(v.iter().copied()));
            }
        }
        match self {
            PageRefs::Small(v) => {
                let i = match v.binary_search_by_key(&page, |e| e.0) {
                    Ok(i) => i,
                    Err(i) => {
                        v.insert(i, (page, 0));
                        i
                    }
                };
                &mut v[i].1
            }
            PageRefs::Large(m) => m.entry(page),
        }
    }
    /// The count of `page`, if it is known.
    pub fn get_mut(&mut self, page: u64) -> Option<&mut u32> {
        match self {
            PageRefs::Small(v) => v.binary_search_by_key(&page, |e| e.0).ok().map(|i| &mut v[i].1),
            PageRefs::Large(m) => m.get_mut(page),
        }
    }
    /// The count of `page` (0 if unknown).
    pub fn get(&self, page: u64) -> u32 {
        match self {
            PageRefs::Small(v) => v.binary_search_by_key(&page, |e| e.0).map_or(0, |i| v[i].1),
            PageRefs::Large(m) => m.get(page).unwrap_or(0),
        }
    }
    /// Forget `page`.
    pub fn remove(&mut self, page: u64) {
        match self {
            PageRefs::Small(v) => {
                if let Ok(i) = v.binary_search_by_key(&page, |e| e.0) {
                    v.remove(i);
                }
            }
            PageRefs::Large(m) => m.remove(page),
        }
    }
    /// (page, count), in no particular order.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (u64, u32)> + '_> {
        match self {
            PageRefs::Small(v) => Box::new(v.iter().copied()),
            PageRefs::Large(m) => Box::new(m.iter()),
        }
    }
}

/// Data blocks released by applying entries: (first block, count).
pub type Freed = SmallVec<[(u64, u64); 2]>;

/// Page content from its block (zeros when none) and its overlay ops, in order.
fn compose<M: Medium + ?Sized>(m: &M, base: Option<(u64, u64)>, ops: &[PageOp], page: &mut [u8]) {
    debug_assert!(page.len() == BLOCK as usize);
    prefetch_ops(m, ops);
    match base {
        Some((blk, _)) => m.read(blk * BLOCK, page),
        None => page.fill(0),
    }
    lay_ops(m, ops, page);
}

/// Ask the cache for the log lines that `ops`' overlays carry, all at once: each
/// lies wherever its entry went in the log, so copied one after the other their
/// misses would follow one another. (`profile_op randread4k`, 4 KiB random reads of
/// a 64 MiB file after 32 random 64 B writes a page, five alternating pairs:
/// 1.06-1.15 -> 0.96-1.01 µs a read; after 4 a page, 0.84-0.88 -> 0.76-0.81.)
pub fn prefetch_ops<M: Medium + ?Sized>(m: &M, ops: &[PageOp]) {
    for op in ops {
        if let PageOp::Overlay { loc, data_off, len, .. } = *op {
            let src = loc.get() + data_off as u64;
            let last = src + len.max(1) as u64 - 1;
            let mut line = src & !(crate::pmem::CACHE_LINE - 1);
            while line <= last {
                m.prefetch(line);
                line += crate::pmem::CACHE_LINE;
            }
        }
    }
}

/// Lay `ops` over `page` (a whole page), in order.
pub fn lay_ops<M: Medium + ?Sized>(m: &M, ops: &[PageOp], page: &mut [u8]) {
    debug_assert!(page.len() == BLOCK as usize);
    for op in ops {
        match *op {
            PageOp::Overlay { loc, data_off, off, len } => {
                let o = off as usize;
                m.read(loc.get() + data_off as u64, &mut page[o..o + len as usize]);
            }
            PageOp::Zero { off, len } => page[off as usize..off as usize + len as usize].fill(0),
        }
    }
}

fn page_of(loc: u64) -> u64 {
    loc & !(BLOCK - 1)
}

impl InodeState {
    /// End the file's run of in-place appends (a reflink shares its block, a DAX
    /// mapping may store past the end of file).
    pub fn end_tail_run(&mut self) {
        if let Body::File(f) = &mut self.body {
            f.tail = None;
        }
    }

    /// Empty state of a type.
    pub fn new(ftype: FileType) -> Self {
        let body = match ftype {
            FileType::Directory => Body::Dir(DirIndex { next_cookie: 3, ..Default::default() }),
            _ => Body::File(FileIndex::default()),
        };
        InodeState {
            ftype,
            attr: AttrRec::default(),
            body,
            xattrs: BTreeMap::new(),
            setattr_loc: None,
            refs: PageRefs::default(),
            log: LogState::default(),
            gc_check_at: 4,
            gc_floor: 0,
            gc_low_at: 0,
            chain_gen: 0,
            dead: DeadPages::new(),
        }
    }

    fn inc(&mut self, loc: u64, n: u64) {
        *self.refs.entry(page_of(loc)) += n as u32;
    }

    fn dec(&mut self, loc: u64, n: u64) {
        let c = self.refs.get_mut(page_of(loc)).expect("reference into an unknown log page");
        assert!(*c as u64 >= n, "log page reference count underflow");
        *c -= n as u32;
        if *c == 0 {
            self.dead.push(page_of(loc));
        }
    }

    /// File index (files and symlinks).
    pub fn file(&self) -> Option<&FileIndex> {
        match &self.body {
            Body::File(f) => Some(f),
            Body::Dir(_) => None,
        }
    }

    /// Directory index.
    pub fn dir(&self) -> Option<&DirIndex> {
        match &self.body {
            Body::Dir(d) => Some(d),
            Body::File(_) => None,
        }
    }

    fn drop_pieces(&mut self, pieces: Pieces, freed: &mut Freed) {
        for (_, e) in pieces {
            self.dec(e.loc, e.len as u64);
            freed.push((e.block, e.len as u64));
        }
    }

    /// [`InodeState::clear_ops`] of pages `[a, a + n)`: a look-up per page, or a
    /// walk of the pages that have ops when they are fewer (a large write, and log
    /// replay and GC, whose WRITE entries come before any op).
    fn clear_ops_in(&mut self, a: u64, n: u64) {
        let Body::File(f) = &self.body else { return };
        if f.ops.is_empty() {
            return;
        }
        let end = a.saturating_add(n);
        if n <= f.ops.len() as u64 {
            for pg in a..end {
                self.clear_ops(pg);
            }
            return;
        }
        let pages: SmallVec<[u64; 8]> =
            f.ops.keys().copied().filter(|p| (a..end).contains(p)).collect();
        for pg in pages {
            self.clear_ops(pg);
        }
    }

    fn clear_ops(&mut self, pg: u64) {
        let Body::File(f) = &mut self.body else { return };
        let Some(ops) = f.ops.remove(&pg) else { return };
        for op in &ops {
            if let PageOp::Overlay { loc, .. } = *op {
                self.dec(loc.get(), 1);
            }
        }
        if let Body::File(f) = &mut self.body {
            f.recycle(ops);
        }
    }

    /// Zero `[off, off+len)` of the file: drop whole pages, add Zero ops to partial
    /// pages that have content.
    fn zero_range(&mut self, off: u64, len: u64, freed: &mut Freed) {
        if len == 0 {
            return;
        }
        let end = off.saturating_add(len);
        let first_full = off.div_ceil(BLOCK);
        let last_full = end / BLOCK; // exclusive
        if first_full < last_full {
            let pieces = match &mut self.body {
                Body::File(f) => f.remove_range(first_full, last_full),
                Body::Dir(_) => return,
            };
            self.drop_pieces(pieces, freed);
            let pages: Vec<u64> = match &self.body {
                Body::File(f) => {
                    f.ops.keys().copied().filter(|p| (first_full..last_full).contains(p)).collect()
                }
                Body::Dir(_) => vec![],
            };
            for p in pages {
                self.clear_ops(p);
            }
        }
        let mut partial = |pg: u64, a: u64, b: u64| {
            if let Body::File(f) = &mut self.body {
                if f.lookup(pg).is_some() || f.ops.contains_key(&pg) {
                    f.ops_mut(pg).push(PageOp::Zero { off: a as u16, len: (b - a) as u16 });
                }
            }
        };
        let spg = off / BLOCK;
        let epg = (end - 1) / BLOCK;
        if spg == epg {
            if !(off.is_multiple_of(BLOCK) && end - off == BLOCK) {
                partial(spg, off % BLOCK, (end - 1) % BLOCK + 1);
            }
        } else {
            if !off.is_multiple_of(BLOCK) {
                partial(spg, off % BLOCK, BLOCK);
            }
            if !end.is_multiple_of(BLOCK) {
                partial(epg, 0, end % BLOCK);
            }
        }
    }

    /// Collapse (`insert` false: pages `[pg, pg + k)` go, the later ones move down by
    /// `k`) or insert (pages from `pg` on move up by `k`): a walk of the runs and the
    /// pages with operations after `pg`, never of the file's pages. Moved runs keep
    /// their blocks and entries (a page's checksum is found by its block).
    fn shift_pages(&mut self, pg: u64, k: u64, insert: bool, freed: &mut Freed) {
        if !matches!(self.body, Body::File(_)) {
            return;
        }
        let from = if insert { pg } else { pg.saturating_add(k) };
        if !insert {
            let gone = match &mut self.body {
                Body::File(f) => f.remove_range(pg, from),
                Body::Dir(_) => unreachable!("checked above"),
            };
            self.drop_pieces(gone, freed);
            let pages: Vec<u64> = match &self.body {
                Body::File(f) => f.ops.keys().copied().filter(|p| (pg..from).contains(p)).collect(),
                Body::Dir(_) => vec![],
            };
            for p in pages {
                self.clear_ops(p);
            }
        }
        let Body::File(f) = &mut self.body else { return };
        let to = |p: u64| if insert { p + k } else { p - k };
        // Every remaining run ends at or before `pg`, and the moved ones land at or
        // after it, in order: each goes back at the end of the map.
        for (p, e) in f.remove_range(from, u64::MAX) {
            let replaced = f.insert(to(p), e.len, e.block, e.loc);
            debug_assert!(replaced.is_empty(), "a shifted run lands on free pages");
        }
        let mut moved: Vec<u64> = f.ops.keys().copied().filter(|&p| p >= from).collect();
        moved.sort_unstable();
        if insert {
            moved.reverse(); // upward: the highest first, onto free keys
        }
        for p in moved {
            let ops = f.ops.remove(&p).expect("key just listed");
            f.ops.insert(to(p), ops);
        }
    }

    /// Truncate file content to `size` bytes.
    fn truncate_to(&mut self, size: u64, freed: &mut Freed) {
        let keep = size.div_ceil(BLOCK);
        let pieces = match &mut self.body {
            Body::File(f) => f.remove_range(keep, u64::MAX),
            Body::Dir(_) => return,
        };
        self.drop_pieces(pieces, freed);
        let pages: Vec<u64> = match &self.body {
            Body::File(f) => f.ops.keys().copied().filter(|&p| p >= keep).collect(),
            Body::Dir(_) => vec![],
        };
        for p in pages {
            self.clear_ops(p);
        }
        if !size.is_multiple_of(BLOCK) {
            self.zero_range(size, BLOCK - size % BLOCK, freed);
        }
    }

    /// Apply one committed entry at `loc`. Blocks no longer referenced go to `freed`.
    pub fn apply(&mut self, loc: u64, e: &Entry, freed: &mut Freed) {
        if let Body::File(f) = &mut self.body {
            // Only an in-place append that leaves room in its page continues a run
            // of them.
            let valid = crate::log::tail_valid(e) as u32;
            f.tail = match *e {
                Entry::Write { pgoff, block, tail: Some(crc), .. } if valid < BLOCK as u32 => {
                    Some(TailRun { pg: pgoff, block, valid, crc })
                }
                _ => None,
            };
        }
        match e {
            Entry::SetAttr(a, shrink) => {
                if let Some(old) = self.setattr_loc.replace(loc) {
                    self.dec(old, 1);
                }
                self.inc(loc, 1);
                // The cut and the pin follow the entry's flag, not only the size seen
                // now: a replay may lack the pages (freed by fast GC) of the entries
                // that had made the file longer, yet older entries still in the log
                // (e.g. blocks fallocated past EOF) must be cut as DRAM cut them, and
                // the entry pinned as DRAM pinned it.
                if (*shrink || a.size < self.attr.size) && self.ftype != FileType::Directory {
                    self.truncate_to(a.size, freed);
                }
                if *shrink {
                    self.inc(loc, 1);
                }
                self.attr = *a;
            }
            &Entry::Write { pgoff, block, npages, size, mtime, .. } => {
                self.apply_write_pages(loc, pgoff, npages, block, size, mtime, freed);
            }
            &Entry::Inline { off, size, mtime, dlen, data_off } => {
                if matches!(self.body, Body::File(_)) {
                    self.apply_inline(loc, off, dlen, data_off, size, mtime);
                }
            }
            Entry::Punch { off, len, mtime } => {
                self.zero_range(*off, *len, freed);
                self.inc(loc, 1); // pinned
                self.attr.mtime = *mtime;
                self.attr.ctime = *mtime;
            }
            Entry::Shift { pg, pages, insert, size, mtime } => {
                self.shift_pages(*pg, *pages, *insert, freed);
                self.inc(loc, 1); // pinned: it moved the pages of every older entry
                self.attr.size = *size;
                self.attr.mtime = *mtime;
                self.attr.ctime = *mtime;
            }
            Entry::Dentry { ino, cookie, time, ftype, name } => {
                let Body::Dir(d) = &mut self.body else { return };
                let old = if *ino != 0 {
                    let name = DirName::from_slice(name);
                    let o = d.names.insert(
                        name.clone(),
                        DirEnt { ino: *ino, cookie: *cookie, loc, ftype: *ftype },
                    );
                    d.order.insert(*cookie, name);
                    d.next_cookie = d.next_cookie.max(cookie + 1);
                    o
                } else {
                    d.names.remove(name.as_slice())
                };
                if let Some(o) = &old {
                    if o.cookie != *cookie || *ino == 0 {
                        d.order.remove(o.cookie);
                    }
                }
                if let Some(o) = old {
                    self.dec(o.loc, 1);
                }
                self.inc(loc, 1); // live add, or pinned removal
                self.attr.mtime = *time;
                self.attr.ctime = *time;
            }
            Entry::Xattr { remove, name, value_len, value_off, spill, time } => {
                let old = if *remove {
                    self.xattrs.remove(name)
                } else {
                    let r = XattrRef {
                        loc,
                        value_off: *value_off,
                        value_len: *value_len,
                        spill: spill.clone(),
                    };
                    self.xattrs.insert(name.clone(), r)
                };
                if let Some(o) = old {
                    self.dec(o.loc, 1);
                    // A replaced or removed spilled value's blocks are free again.
                    freed.extend(o.spill.iter().flat_map(|sp| sp.blocks.iter().map(|&b| (b, 1))));
                }
                self.inc(loc, 1);
                self.attr.ctime = *time;
            }
            Entry::End => {}
        }
    }

    /// Apply a WRITE at `loc` that maps file pages `pgoff..pgoff + npages` to
    /// blocks from `block` on, the file `size` bytes long at `mtime`: the general
    /// case of [`InodeState::apply`] with such an entry, less the run bookkeeping
    /// of in-place appends, which the caller does (`apply`, and
    /// [`InodeState::apply_cow_writes`], which ends the run first).
    #[allow(clippy::too_many_arguments)]
    pub fn apply_write_pages(
        &mut self,
        loc: u64,
        pgoff: u64,
        npages: u32,
        block: u64,
        size: u64,
        mtime: Ts,
        freed: &mut Freed,
    ) {
        let mut pieces = match &mut self.body {
            Body::File(f) => f.insert(pgoff, npages, block, loc),
            Body::Dir(_) => return,
        };
        // An in-place append maps its page to the block it had: the old
        // mapping's entry dies, the block stays. (Its reference moves to
        // the new entry: when both lie in one log page, as a run's
        // entries mostly do, that page's count is left as it is.)
        let mut refs = npages as u64;
        for (pg, e) in &mut pieces {
            if e.len == 1 && *pg >= pgoff && e.block == block + (*pg - pgoff) {
                if page_of(e.loc) == page_of(loc) {
                    refs -= 1;
                } else {
                    self.dec(e.loc, 1);
                }
                e.len = 0;
            }
        }
        pieces.retain(|(_, e)| e.len > 0);
        self.drop_pieces(pieces, freed);
        self.clear_ops_in(pgoff, npages as u64);
        if refs > 0 {
            self.inc(loc, refs);
        }
        self.set_data_times(size, mtime);
    }

    /// Apply the WRITE entries [`crate::ops::cow_entries`] made of the copy-on-write
    /// pages `cow` (file page, block, checksum), committed at `locs` (one per entry),
    /// the file `size` bytes long at `mtime`: what [`InodeState::apply`] does with
    /// each decoded entry, from the plan instead of a decode of what was just encoded
    /// (`Fs::write_cow`). Returns the blocks no longer referenced.
    pub fn apply_cow_writes(
        &mut self,
        locs: &[u64],
        cow: &[(u64, u64, u32)],
        size: u64,
        mtime: Ts,
    ) -> Freed {
        let mut freed = Freed::new();
        if let Body::File(f) = &mut self.body {
            f.tail = None; // a WRITE without a tail ends the run of in-place appends
        }
        let mut n = 0;
        for (&loc, run) in locs.iter().zip(crate::ops::cow_runs(cow)) {
            let (pg, b, _) = run[0];
            self.apply_write_pages(loc, pg, run.len() as u32, b, size, mtime, &mut freed);
            n += 1;
        }
        assert_eq!(n, locs.len(), "a location per entry");
        freed
    }

    /// Apply the WRITE at `loc` of an in-place append that continued the file's
    /// run within its page, leaving the run as `run` (its page and block, the
    /// bytes now valid, the page's checksum), the file `size` bytes long at
    /// `mtime`: what [`InodeState::apply`] does with that entry, without its
    /// decode and its general case (the commit path's hot one, `Fs::append_run`).
    /// The page keeps its block; its reference moves to the new entry.
    pub fn apply_run_append(&mut self, loc: u64, run: TailRun, size: u64, mtime: Ts) {
        let Body::File(f) = &mut self.body else {
            unreachable!("a run belongs to a regular file");
        };
        debug_assert_eq!(f.tail.map(|r| (r.pg, r.block)), Some((run.pg, run.block)));
        debug_assert!(!f.ops.contains_key(&run.pg), "a run's page has no ops");
        f.tail = (run.valid < BLOCK as u32).then_some(run);
        let new = Ext { len: 1, block: run.block, loc };
        let old = f.ext.replace_same(run.pg, new).expect("a run's page is mapped");
        debug_assert_eq!((old.len, old.block), (1, run.block), "a run's page maps its block");
        if page_of(old.loc) != page_of(loc) {
            self.dec(old.loc, 1);
            self.inc(loc, 1);
        }
        self.set_data_times(size, mtime);
    }

    /// Apply the INLINE at `loc` of `dlen` bytes at file offset `off` (its data
    /// `data_off` bytes into the entry), the file `size` bytes long at `mtime`: the
    /// page gets an overlay and the file's run of in-place appends ends. The
    /// embedded-write commit calls it without decoding the entry
    /// (`Fs::write_embedded`); [`InodeState::apply`] with it.
    pub fn apply_inline(
        &mut self,
        loc: u64,
        off: u64,
        dlen: u32,
        data_off: u32,
        size: u64,
        mtime: Ts,
    ) {
        let Body::File(f) = &mut self.body else {
            unreachable!("an embedded write belongs to a regular file");
        };
        f.tail = None;
        f.ops_mut(off / BLOCK).push(PageOp::Overlay {
            loc: NonZeroU64::new(loc).expect("an entry lies in a data block"),
            data_off,
            off: (off % BLOCK) as u16,
            len: dlen as u16,
        });
        self.inc(loc, 1);
        self.set_data_times(size, mtime);
    }

    fn set_data_times(&mut self, size: u64, mtime: Ts) {
        self.attr.size = size;
        self.attr.mtime = mtime;
        self.attr.ctime = mtime;
    }

    /// Read file page `pg` bytes `[a, b)` into `dst` (length `b - a`).
    pub fn read_page<M: Medium + ?Sized>(
        &self,
        m: &M,
        pg: u64,
        a: usize,
        b: usize,
        dst: &mut [u8],
    ) {
        debug_assert!(a <= b && b <= BLOCK as usize && dst.len() == b - a);
        let Body::File(f) = &self.body else {
            dst.fill(0);
            return;
        };
        let ops = f.ops.get(&pg);
        match (f.lookup(pg), ops) {
            (Some((blk, _)), None) => m.read(blk * BLOCK + a as u64, dst),
            (None, None) => dst.fill(0),
            // A whole page is composed where it is wanted (a merge of a page's
            // overlays reads every page this way); a part, in a page on the stack.
            (base, Some(ops)) if a == 0 && b == BLOCK as usize => compose(m, base, ops, dst),
            (base, Some(ops)) => {
                let mut page = [0u8; BLOCK as usize];
                compose(m, base, ops, &mut page);
                dst.copy_from_slice(&page[a..b]);
            }
        }
    }

    /// Page `pg`'s ops, in order (none when it has none), for a caller that reads
    /// and checks the base block itself, which [`InodeState::read_page`] would read
    /// again: it asks for the overlays' lines first ([`prefetch_ops`]), so that their
    /// misses overlap with that read and with one another, then lays them over the
    /// page ([`lay_ops`]); one lookup serves both.
    pub fn page_op_list(&self, pg: u64) -> &[PageOp] {
        match &self.body {
            Body::File(f) => f.ops.get(&pg).map_or(&[], |o| &o[..]),
            Body::Dir(_) => &[],
        }
    }

    /// Drop the ops of page `pg` that its newest op covers whole (the page reads the
    /// same without them); the entries of the overlays dropped die. Asked by an
    /// embedded write that found the page's list full, whose merge would read the
    /// list anyway: a range rewritten in place then never merges its page. One pass,
    /// the newest op only: a scan of every pair cost random writes more than the
    /// merges it saved (docs/BENCHMARKS.md, eighth stop). Returns how many went.
    pub fn drop_hidden_by_newest(&mut self, pg: u64) -> usize {
        let Body::File(f) = &mut self.body else { return 0 };
        let Some(ops) = f.ops.get_mut(&pg) else { return 0 };
        let span = |op: &PageOp| match *op {
            PageOp::Overlay { off, len, .. } | PageOp::Zero { off, len } => {
                (u32::from(off), u32::from(off) + u32::from(len))
            }
        };
        let Some(newest) = ops.last() else { return 0 };
        let (c, d) = span(newest);
        let mut dead: SmallVec<[u64; 8]> = SmallVec::new();
        let n = ops.len();
        let (mut k, mut dropped) = (0, 0);
        ops.retain(|op| {
            k += 1;
            let (a, b) = span(op);
            let hidden = k < n && c <= a && b <= d;
            dropped += usize::from(hidden);
            if let (true, PageOp::Overlay { loc, .. }) = (hidden, *op) {
                dead.push(loc.get());
            }
            !hidden
        });
        for loc in &dead {
            self.dec(*loc, 1);
        }
        dropped
    }

    /// Overlay ops on page `pg` and the bytes they carry.
    pub fn page_ops(&self, pg: u64) -> (usize, usize) {
        match &self.body {
            Body::File(f) => f.ops.get(&pg).map_or((0, 0), |v| {
                debug_assert_eq!(
                    v.bytes(),
                    v.iter()
                        .map(|o| match o {
                            PageOp::Overlay { len, .. } => *len as usize,
                            PageOp::Zero { .. } => 0,
                        })
                        .sum::<usize>(),
                    "page {pg}: overlay byte count out of step"
                );
                // Where the page's next op goes: a write that asks is about to add one.
                crate::pmem::prefetch_dram(v.buf.as_ptr().wrapping_add(v.len()));
                (v.len(), v.bytes())
            }),
            Body::Dir(_) => (0, 0),
        }
    }

    /// All data blocks this inode references: (first block, count).
    pub fn data_runs(&self) -> Vec<(u64, u64)> {
        let mut runs: Vec<(u64, u64)> = match &self.body {
            Body::File(f) => f.ext.iter().map(|(_, e)| (e.block, e.len as u64)).collect(),
            Body::Dir(_) => vec![],
        };
        // Spilled extended attribute values (files and directories alike).
        for x in self.xattrs.values() {
            runs.extend(x.spill.iter().flat_map(|sp| sp.blocks.iter().map(|&b| (b, 1))));
        }
        runs
    }

    /// Log pages whose entries are all dead (excluding the tail page), in chain order.
    /// Cost: proportional to the pages that died since the last fast GC (times log n
    /// for a long chain), whatever the length of the log.
    pub fn dead_pages(&self) -> DeadPages {
        if self.dead.is_empty() {
            return DeadPages::new();
        }
        let tail_page = page_of(crate::layout::logptr::addr(self.log.tail));
        let mut out: DeadPages = self
            .dead
            .iter()
            .copied()
            .filter(|&p| p != tail_page && self.refs.get(p) == 0)
            .filter(|&p| self.log.pages.contains(p))
            .collect();
        out.sort_unstable();
        out.dedup();
        self.log.pages.sort_in_chain_order(&mut out);
        out
    }

    /// st_size as reported: directories report tmpfs's 20 bytes per entry.
    pub fn size(&self) -> u64 {
        match &self.body {
            Body::Dir(d) => (d.names.len() as u64 + 2) * 20,
            Body::File(_) => self.attr.size,
        }
    }

    /// st_blocks (512-byte units).
    pub fn blocks(&self) -> u64 {
        match (&self.body, self.ftype) {
            (Body::File(f), FileType::Regular) => f.content_pages() * (BLOCK / 512),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator: `rnd(n)` is below `n`.
    fn xorshift(mut x: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        }
    }

    /// A run of in-place appends: each entry takes its page's reference from the
    /// run's previous one. In one log page the count stays 1 (no decrement to
    /// zero that would list the page as dead); across log pages the old page's
    /// count falls to zero and it is dead, the new one's rises to one.
    #[test]
    fn a_runs_reference_moves_between_its_entries() {
        let mut st = InodeState::new(FileType::Regular);
        let mut freed = Freed::new();
        let tail = |size: u64, crc: u32| Entry::Write {
            pgoff: 1,
            block: 500,
            npages: 1,
            size,
            mtime: Ts::default(),
            dcrc: None,
            pcrc: true,
            tail: Some(crc),
        };
        let (a, c) = (40 * BLOCK, 41 * BLOCK);
        st.apply(a + 64, &tail(BLOCK + 64, 1), &mut freed);
        assert_eq!((st.refs.get(a), st.dead.len()), (1, 0));
        st.apply(a + 136, &tail(BLOCK + 128, 2), &mut freed);
        assert_eq!((st.refs.get(a), st.dead.len()), (1, 0), "same log page: count kept");
        st.apply(c, &tail(BLOCK + 192, 3), &mut freed);
        assert_eq!((st.refs.get(a), st.refs.get(c)), (0, 1), "the reference moved pages");
        assert_eq!(st.dead.as_slice(), [a], "the old log page is dead");
        assert!(freed.is_empty(), "the run's block stays mapped");
        assert_eq!(st.file().unwrap().lookup(1).map(|(b, _)| b), Some(500));
        assert_eq!(st.attr.size, BLOCK + 192);
    }

    /// `apply_run_append` (the commit path's shortcut for a run's next append) must
    /// leave the state a replay's `apply` of the same entry leaves: the mapping and
    /// its entry, the log pages' counts and dead list, the run, size and times,
    /// with the new entry in the old one's log page and in another.
    #[test]
    fn a_run_append_applies_as_its_entry_does() {
        let t = |s: i64| Ts { sec: s, nsec: 7 };
        let tail = |size: u64, crc: u32, s: i64| Entry::Write {
            pgoff: 1,
            block: 500,
            npages: 1,
            size,
            mtime: t(s),
            dcrc: None,
            pcrc: true,
            tail: Some(crc),
        };
        let (a, c) = (40 * BLOCK, 41 * BLOCK);
        let mut freed = Freed::new();
        let mut slow = InodeState::new(FileType::Regular);
        slow.apply(a + 64, &tail(BLOCK + 64, 1, 1), &mut freed);
        let mut fast = slow.clone();
        let steps = [(a + 136, 128, 2), (c, 192, 3), (c + 72, 4096, 4)];
        for (loc, v, crc) in steps {
            slow.apply(loc, &tail(BLOCK + v, crc, crc as i64), &mut freed);
            let run = TailRun { pg: 1, block: 500, valid: v as u32, crc };
            fast.apply_run_append(loc, run, BLOCK + v, t(crc as i64));
            let (sf, ff) = (slow.file().unwrap(), fast.file().unwrap());
            assert_eq!(sf.tail, ff.tail, "the run after {v} bytes");
            assert_eq!(sf.lookup(1), ff.lookup(1), "the page's block and entry");
            assert_eq!((slow.refs.get(a), slow.refs.get(c)), (fast.refs.get(a), fast.refs.get(c)));
            assert_eq!(slow.dead, fast.dead);
            assert_eq!(format!("{:?}", slow.attr), format!("{:?}", fast.attr));
        }
        assert!(freed.is_empty());
        assert_eq!(fast.file().unwrap().tail, None, "a full page ends the run");
        assert_eq!(fast.dead.as_slice(), [a]);
    }

    /// `apply_cow_writes` (a copy-on-write write's apply from its plan, without a
    /// decode) must leave the state a replay's `apply` of the entries `cow_entries`
    /// encodes leaves: over random files (extents, a run of in-place appends,
    /// overlays) and random plans (runs of consecutive pages and blocks, some longer
    /// than an entry holds), the mappings, ops, log page counts and dead list, the
    /// blocks freed, the run and the attributes.
    #[test]
    fn planned_cow_writes_apply_as_their_entries_do() {
        let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
        let t = |s: u64| Ts { sec: s as i64, nsec: 3 };
        for round in 0..300 {
            let mut st = InodeState::new(FileType::Regular);
            let mut freed = Freed::new();
            let mut loc = 40 * BLOCK + 64;
            let mut next_block = 1000;
            for _ in 0..rnd(12) {
                let (pg, n) = (rnd(40), 1 + rnd(6) as u32);
                let tail = (rnd(4) == 0).then(|| rnd(1 << 20) as u32);
                let e = Entry::Write {
                    pgoff: pg,
                    block: next_block,
                    npages: if tail.is_some() { 1 } else { n },
                    size: (pg + n as u64) * BLOCK,
                    mtime: t(1),
                    dcrc: None,
                    pcrc: true,
                    tail,
                };
                next_block += 8;
                st.apply(loc, &e, &mut freed);
                loc += 64 + rnd(3) * 4096; // sometimes another log page
            }
            if rnd(2) == 0 {
                // The file ends in a run of in-place appends: its last page partly valid.
                let pg = st.attr.size / BLOCK;
                let e = Entry::Write {
                    pgoff: pg,
                    block: next_block,
                    npages: 1,
                    size: pg * BLOCK + 1 + rnd(BLOCK - 1),
                    mtime: t(1),
                    dcrc: None,
                    pcrc: true,
                    tail: Some(rnd(1 << 20) as u32),
                };
                next_block += 8;
                st.apply(loc, &e, &mut freed);
                loc += 64;
                assert!(st.file().unwrap().tail.is_some(), "a run to end");
            }
            for _ in 0..rnd(6) {
                let off = rnd(40) * BLOCK + rnd(BLOCK - 64);
                let size = st.attr.size.max(off + 64);
                st.apply_inline(loc, off, 1 + rnd(63) as u32, 16, size, t(2));
                loc += 64;
            }
            // A plan: ascending pages, runs of consecutive pages in consecutive blocks.
            // Every tenth plan is longer than an entry holds (PCRC_MAX_PAGES).
            let len = if round % 10 == 0 { 300 + rnd(300) } else { 1 + rnd(40) };
            let mut cow = Vec::new();
            let mut pg = rnd(8);
            while (cow.len() as u64) < len {
                let long = round % 10 == 0;
                let b = if rnd(if long { 200 } else { 3 }) == 0 {
                    next_block + 100
                } else {
                    next_block
                };
                cow.push((pg, b, rnd(u32::MAX as u64) as u32));
                next_block = b + 1;
                pg += 1 + (rnd(if long { 200 } else { 4 }) == 0) as u64;
            }
            let size = st.attr.size.max((pg + 1) * BLOCK);
            let mut entries: smallvec::SmallVec<[crate::log::EntryBuf; 2]> = Default::default();
            crate::ops::cow_entries(7, &cow, size, t(9), round % 2 == 0, &mut entries);
            if round % 10 == 0 {
                assert!(entries.len() > 1, "a plan longer than an entry");
            }
            let locs: Vec<u64> = (0..entries.len() as u64).map(|k| 60 * BLOCK + 96 * k).collect();
            let (mut slow, mut fast) = (st.clone(), st);
            let mut slow_freed = Freed::new();
            for (&l, e) in locs.iter().zip(&entries) {
                let e = crate::log::decode_entry(&e.bytes).expect("an entry we encoded");
                slow.apply(l, &e, &mut slow_freed);
            }
            let mut fast_freed = fast.apply_cow_writes(&locs, &cow, size, t(9));
            slow_freed.sort_unstable();
            fast_freed.sort_unstable();
            assert_eq!(slow_freed, fast_freed, "round {round}: blocks freed");
            let (sf, ff) = (slow.file().unwrap(), fast.file().unwrap());
            for p in 0..pg + 2 {
                assert_eq!(sf.lookup(p), ff.lookup(p), "round {round}: page {p}");
                assert_eq!(slow.page_ops(p), fast.page_ops(p), "round {round}: ops of {p}");
            }
            assert_eq!(sf.tail, ff.tail, "round {round}: the run");
            let mut sr: Vec<_> = slow.refs.iter().collect();
            let mut fr: Vec<_> = fast.refs.iter().collect();
            sr.sort_unstable();
            fr.sort_unstable();
            assert_eq!(sr, fr, "round {round}: log page counts");
            assert_eq!(slow.dead, fast.dead, "round {round}: dead log pages");
            assert_eq!(format!("{:?}", slow.attr), format!("{:?}", fast.attr));
        }
    }

    /// `holes` walks runs, not pages: it must list exactly the pages a page-by-page
    /// filter lists, and refuse past its limit.
    #[test]
    fn holes_match_a_page_walk() {
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
        for _ in 0..200 {
            let mut f = FileIndex::default();
            for k in 0..rnd(12) {
                f.insert(rnd(300), 1 + rnd(20) as u32, 1000 + k * 50, k);
            }
            for _ in 0..rnd(10) {
                f.ops.get_or_insert_with(rnd(300), PageOps::default);
            }
            let (a, b) = (rnd(320), rnd(320));
            let naive: Vec<u64> =
                (a..b).filter(|&p| f.lookup(p).is_none() && !f.ops.contains_key(&p)).collect();
            assert_eq!(f.holes(a, b, u64::MAX), Some(naive.clone()));
            if !naive.is_empty() {
                assert_eq!(f.holes(a, b, naive.len() as u64 - 1), None);
            }
        }
        assert_eq!(FileIndex::default().holes(0, 1 << 50, 1000), None);
    }

    /// `next_data` and `next_hole` (lseek's SEEK_DATA / SEEK_HOLE) agree with a
    /// page-by-page scan.
    #[test]
    fn next_data_and_hole_match_a_page_walk() {
        let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
        for _ in 0..300 {
            let mut f = FileIndex::default();
            for k in 0..rnd(8) {
                f.insert(rnd(200), 1 + rnd(30) as u32, 5000 + k * 64, k);
            }
            for _ in 0..rnd(8) {
                f.ops.get_or_insert_with(rnd(220), PageOps::default);
            }
            let has = |p: u64| f.lookup(p).is_some() || f.ops.contains_key(&p);
            for pg in 0..260 {
                assert_eq!(f.next_data(pg), (pg..260).find(|&p| has(p)), "data from {pg}");
                assert_eq!(f.next_hole(pg), (pg..).find(|&p| !has(p)).unwrap(), "hole {pg}");
            }
        }
    }

    #[test]
    fn extent_split_and_replace() {
        let mut f = FileIndex::default();
        assert!(f.insert(0, 10, 100, 1).is_empty());
        let r = f.insert(3, 2, 500, 2);
        assert_eq!(r.to_vec(), vec![(3, Ext { len: 2, block: 103, loc: 1 })]);
        assert_eq!(f.lookup(2), Some((102, 1)));
        assert_eq!(f.lookup(3), Some((500, 2)));
        assert_eq!(f.lookup(5), Some((105, 1)));
        assert_eq!(f.mapped_pages(), 10);
        let r = f.remove_range(1, 9);
        assert_eq!(r.iter().map(|p| p.1.len).sum::<u32>(), 8);
        assert_eq!(f.mapped_pages(), 2);
        assert_eq!(f.lookup(9), Some((109, 1)));
    }

    #[test]
    fn page_refs_match_a_map_across_the_switch_to_a_hash_map() {
        let mut r = PageRefs::default();
        let mut model = BTreeMap::new();
        let mut x = 12345u64;
        for step in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Grow to a few hundred pages, then shrink back, and again.
            let span = if (step / 5000) % 2 == 0 { 400 } else { 40 };
            let page = (x % span) * 4096;
            if x.is_multiple_of(3) {
                r.remove(page);
                model.remove(&page);
            } else if x % 3 == 1 && model.contains_key(&page) {
                // A change through `get_mut` (the path of a decrement), of the hot
                // page or another.
                *r.get_mut(page).expect("a known page") += 1;
                *model.get_mut(&page).expect("known") += 1;
            } else {
                *r.entry(page) += 1;
                *model.entry(page).or_insert(0u32) += 1;
            }
            assert_eq!(r.get(page), model.get(&page).copied().unwrap_or(0));
        }
        let mut got: Vec<_> = r.iter().collect();
        got.sort_unstable();
        assert_eq!(got, model.into_iter().collect::<Vec<_>>());
        assert!(matches!(r, PageRefs::Large(_)), "went large");
    }

    #[test]
    fn refs_follow_overwrites_and_truncation() {
        let mut s = InodeState::new(FileType::Regular);
        let p1 = 100 * BLOCK;
        let mut freed = Freed::new();
        s.apply(
            p1,
            &Entry::Write {
                pgoff: 0,
                block: 7,
                npages: 2,
                size: 8192,
                mtime: Ts::default(),
                dcrc: None,
                pcrc: false,
                tail: None,
            },
            &mut freed,
        );
        assert_eq!(s.refs.get(p1), 2);
        s.apply(
            p1 + 64,
            &Entry::Write {
                pgoff: 1,
                block: 9,
                npages: 1,
                size: 8192,
                mtime: Ts::default(),
                dcrc: None,
                pcrc: false,
                tail: None,
            },
            &mut freed,
        );
        assert_eq!(freed[..], [(8, 1)]);
        assert_eq!(s.refs.get(p1), 2);
        let a = AttrRec { size: 100, ..Default::default() };
        s.attr.size = 8192;
        s.apply(p1 + 128, &Entry::SetAttr(a, true), &mut freed);
        assert_eq!(freed[..], [(8, 1), (9, 1)]);
        // page 0 run (1 ref) + setattr (1) + pinned shrink (1)
        assert_eq!(s.refs.get(p1), 3);
        assert_eq!(s.page_ops(0), (1, 0));
    }

    #[test]
    fn a_write_clears_the_ops_of_its_pages_by_lookup_or_by_walk() {
        let inline = |pg: u64| Entry::Inline {
            off: pg * BLOCK + 8,
            size: 1 << 30,
            mtime: Ts::default(),
            dlen: 4,
            data_off: crate::log::INLINE_HDR as u32,
        };
        let write = |pgoff: u64, npages: u32| Entry::Write {
            pgoff,
            block: 1000 + pgoff,
            npages,
            size: 1 << 30,
            mtime: Ts::default(),
            dcrc: None,
            pcrc: false,
            tail: None,
        };
        let mut s = InodeState::new(FileType::Regular);
        let mut freed = Freed::new();
        let mut loc = 100 * BLOCK;
        let mut next = || {
            loc += 64;
            loc
        };
        for pg in [3, 5, 9, 40, 41] {
            s.apply(next(), &inline(pg), &mut freed);
        }
        // Fewer pages than ops: a look-up per page (3 and 5 go, 9 stays).
        s.apply(next(), &write(2, 4), &mut freed);
        let has = |s: &InodeState, pg| s.page_ops(pg).0 > 0;
        assert!(!has(&s, 3) && !has(&s, 5) && has(&s, 9) && has(&s, 40));
        // More pages than ops: a walk of the ops (9 and 40 go, 41 stays).
        s.apply(next(), &write(6, 35), &mut freed);
        assert!(!has(&s, 9) && !has(&s, 40) && has(&s, 41));
        // The overlays' entries lost their references with them.
        assert_eq!(s.refs.get(100 * BLOCK), 1 + 4 + 35);
    }
}
