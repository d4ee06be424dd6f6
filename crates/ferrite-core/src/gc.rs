//! Log garbage collection.
//!
//! Fast GC: a log page whose live-reference count is zero (see `index`) holds only
//! dead entries; it is unlinked from the chain by one 8-byte store (the previous
//! page's next pointer, or the inode's head) *after* the operation that killed its
//! last entry is durable, then a fence, then the page is freed.
//!
//! Thorough GC: when a log holds more than [`GC_SLACK`] times the pages its live
//! state needs ([`SPARSE_SLACK`] times for a file whose live state is at most 1% of
//! its data, less in a nearly full pool), the live state is written as a fresh
//! log (a snapshot: extents, overlays, zero ranges, directory entries, extended
//! attributes, then one SETATTR) in new pages, and the head and tail are swapped
//! through the journal with a bumped epoch. Pinned entries (removals, shrinks)
//! disappear there. Sequence numbers and readdir cookies carry over, so cookies
//! stay stable.

use crate::error::Result;
use crate::fs::{CoreFault, Fs, Inode};
use crate::index::{Body, InodeState, PageOp};
use crate::journal::Record;
use crate::layout::{logptr, BLOCK, SLOT_HEAD, SLOT_TAIL};
use crate::log::{self, AttrRec, EntryBuf, LOG_DATA_END};
use crate::pmem::{persist_u64, Medium};
use std::sync::atomic::Ordering;

/// A log is compacted when it holds more than this many times the pages its live
/// state needs. Compaction rewrites the live state, so with slack `r` it writes
/// `1 / (r - 1)` log pages per page appended: with 2, an append stream whose live
/// entries are spread thinly (a WRITE entry per merged page among dead embedded
/// writes) spent a fifth of its instructions rewriting its log, and as many log
/// bytes as it appended; with 4, a third of that. Logs stay small beside their data
/// (a live WRITE entry is 48 bytes per 4 KiB page), and a nearly full pool compacts
/// sooner, at an eighth to twice the live state as its free space shrinks (see
/// `after_commit`).
pub const GC_SLACK: usize = 4;

/// The slack of a regular file's log whose live state is at most 1% of the file's
/// data (an append stream's log holds about a WRITE entry per merged run of pages):
/// compacting it at [`GC_SLACK`] times rewrote a third of a page for every page
/// appended (256 B appends + fsync, `profile_op`, three alternating pairs: 0.61-0.62
/// µs a write at slack 4, 0.57-0.60 at 8); at this slack its log stays under 8% of
/// the data. Logs whose live state is larger (embedded overwrites' overlays, which
/// can hold a quarter of the data) keep [`GC_SLACK`].
pub const SPARSE_SLACK: usize = 8;

/// The slack of `st`'s log given the pages its live state needs.
fn log_slack(st: &InodeState, need: usize) -> usize {
    let sparse = (need as u64).saturating_mul(crate::layout::BLOCK * 100) <= st.attr.size;
    if sparse && st.ftype == crate::index::FileType::Regular {
        SPARSE_SLACK
    } else {
        GC_SLACK
    }
}

impl<M: Medium> Fs<M> {
    /// GC work after a committed operation on `inode`.
    pub(crate) fn after_commit(&self, inode: &Inode, st: &mut InodeState, grew: bool) {
        if !self.gc_due(st, grew) {
            return;
        }
        if !st.dead.is_empty() {
            self.fast_gc(inode, st);
        }
        // With free space low, logs are compacted as soon as they hold a little
        // more than their live state needs (instead of GC_SLACK times): partly dead
        // log pages must not eat the last free blocks of a nearly full pool. The
        // slack shrinks with the free space, from the live state's size itself at
        // the low-space threshold to an eighth of it in an empty pool (`low_slack`).
        // What the live state needs is at least what the last compaction gave: the
        // estimate can fall short of it, and a bound under a compacted log's own
        // size compacts it again at nearly every new page (an append near a full
        // pool ran thorough GC once every 20 appends and took 25x its time).
        let low = if grew { self.low_slack() } else { None };
        if grew && (st.log.pages.len() >= st.gc_check_at || low.is_some()) {
            let pages = st.log.pages.len();
            let floor = st.gc_floor;
            let slack = |need: usize, l: (u64, u64)| {
                need / 8 + (need as u64 * l.0 / l.1.max(1)) as usize + 1
            };
            if let Some(l) = low.filter(|_| pages < st.gc_check_at) {
                if pages <= st.gc_low_at.max(floor + slack(floor, l)) {
                    return; // the log grew too little since its last look
                }
            }
            let need = snapshot_pages(&self.m, st);
            self.gc_stats.thorough_checks.fetch_add(1, Ordering::Relaxed);
            let bound = match low {
                Some(l) => {
                    let need = need.max(floor);
                    need + slack(need, l)
                }
                None => log_slack(st, need) * need + 1,
            };
            if st.log.pages.len() > bound && self.thorough_gc(inode, st).is_ok() {
                // Next look just past the bound the compacted log has to reach.
                let s = log_slack(st, st.log.pages.len());
                st.gc_check_at = (st.log.pages.len() * s + 2).max(4);
            } else {
                st.gc_check_at = st.log.pages.len() + (st.log.pages.len() / 2).max(2);
                if low.is_some() {
                    // The estimate walks the whole live state (every run and
                    // overlay): not again before the log is halfway to the bound (a
                    // 64 B overwrite of a 16 MiB file spent 18% of its time here).
                    st.gc_low_at = pages + bound.saturating_sub(pages) / 2;
                }
            }
        }
    }

    /// With the pool short of free blocks: (free blocks, the low-space limit).
    fn low_slack(&self) -> Option<(u64, u64)> {
        Some(self.free_and_limit()).filter(|(free, limit)| free < limit)
    }

    /// Has `after_commit` work to do after a commit of `st` (`grew`: its log took a
    /// new page)?
    pub(crate) fn gc_due(&self, st: &InodeState, grew: bool) -> bool {
        !st.dead.is_empty() || (grew && (st.log.pages.len() >= st.gc_check_at || self.low_space()))
    }

    /// Is the pool short of free blocks (under 1/16 of its data blocks, or four
    /// times the reserve)? Writes and GC then favour space over speed.
    pub(crate) fn low_space(&self) -> bool {
        let (free, limit) = self.free_and_limit();
        free < limit
    }

    /// Is the pool very short of free blocks (under a quarter of the low-space
    /// limit: 1/64 of its data blocks)? Sub-page writes then merge into
    /// copy-on-write pages instead of growing logs (see `write_locked_range`).
    pub(crate) fn very_low_space(&self) -> bool {
        let (free, limit) = self.free_and_limit();
        free < limit / 4
    }

    /// Could the pool give `n` blocks at once and stay above the very-low-space
    /// mark (where merges start to trade speed for space)?
    pub(crate) fn room_for(&self, n: u64) -> bool {
        let (free, limit) = self.free_and_limit();
        n.saturating_add(limit / 4) <= free
    }

    /// Free blocks, and the count under which the pool is short of them.
    fn free_and_limit(&self) -> (u64, u64) {
        let data_blocks = self.geo.nblocks - self.geo.data_start;
        // A client's allocator holds only its grants: the pool's free space is the
        // daemon's (as it publishes it) plus that.
        let free = match self.share.as_ref().filter(|p| p.is_client()) {
            Some(p) => p.table().global_free() + self.balloc.free_blocks(),
            None => self.balloc.free_blocks(),
        };
        let reserve = (self.geo.nblocks / 512).clamp(8, 1024);
        (free, (data_blocks / 16).max(4 * reserve))
    }

    /// Unlink and free the dead pages of `st`'s log.
    pub(crate) fn fast_gc(&self, inode: &Inode, st: &mut InodeState) {
        self.await_fenced(inode); // an unlink is durable only after what killed the page
        let mut dead = st.dead_pages();
        let tail_page = logptr::addr(st.log.tail) & !(BLOCK - 1);
        // Test-only fault: a page with live entries goes too.
        let mut live_victim = None;
        if self.fault == Some(CoreFault::GcReferenced) && !dead.is_empty() {
            live_victim = st
                .log
                .pages
                .iter()
                .find(|p| *p != tail_page && !dead.contains(p) && st.refs.get(*p) > 0);
            if let Some(v) = live_victim {
                dead.push(v);
                st.log.pages.sort_in_chain_order(&mut dead);
            }
        }
        // Keep only candidates that may still die later: the current tail page.
        st.dead.retain(|p| *p == tail_page && st.refs.get(*p) == 0);
        if dead.is_empty() {
            return;
        }
        let slot = self.geo.slot_off(inode.ino);
        // Ours from now on (see `share`): if this process dies after an unlink, the
        // page is found unreferenced and returned.
        if let Some(p) = &self.share {
            for &d in &dead {
                p.own(d / BLOCK, 1);
            }
        }
        // In chain order: each unlink sees the chain as the previous ones left it.
        for &d in &dead {
            let (prev, next) = st.log.pages.neighbours(d).expect("dead page is in the chain");
            // The tail page is never dead, so a successor exists.
            let next = next.expect("a dead page is not the tail page");
            match prev {
                None => {
                    let h = logptr::make(logptr::epoch(st.log.head), next);
                    persist_u64(&self.m, slot + SLOT_HEAD, h);
                    crate::replica::sync_slot(&self.m, &self.geo, inode.ino);
                    st.log.head = h;
                }
                Some(p) => persist_u64(&self.m, p + LOG_DATA_END, next),
            }
            st.log.pages.remove(d);
        }
        // The pages can come back to this log with its epoch (module comment of
        // `journal`): lazily finished transactions that named its tail are settled.
        let settling = self.settle_marks(None);
        if self.fault != Some(CoreFault::EarlyGc) {
            self.m.fence();
            self.marks.settled(&settling);
        }
        for d in dead.iter().filter(|&&d| Some(d) != live_victim) {
            st.refs.remove(*d);
        }
        st.chain_gen = self.note_chain_change(inode.ino);
        self.note_free(inode.ino);
        self.free_pages(&dead);
        self.gc_stats.fast_pages.fetch_add(dead.len() as u64, Ordering::Relaxed);
    }

    /// Rewrite `st`'s log as a compact snapshot (see the module comment).
    pub(crate) fn thorough_gc(&self, inode: &Inode, st: &mut InodeState) -> Result<()> {
        self.await_fenced(inode);
        let mut entries = snapshot_entries(&self.m, st);
        let shard = self.shard();
        let first = self.alloc_log_page(shard, true)?;
        let mut taken = log::Pages::new();
        let epoch = logptr::epoch(st.log.tail).wrapping_add(1);
        let mut alloc = || self.alloc_log_page(shard, true);
        let a = match log::write_fresh(
            &self.m,
            epoch,
            st.log.next_seq,
            first,
            inode.seed,
            &mut entries,
            &mut alloc,
            &mut taken,
        ) {
            Ok(a) => a,
            Err(e) => {
                self.free_pages(&taken);
                self.free_pages(&[first]);
                return Err(e);
            }
        };
        let slot = self.geo.slot_off(inode.ino);
        let new_head = logptr::make(epoch, first);
        let recs = [
            Record { addr: slot + SLOT_HEAD, old: st.log.head, new: new_head },
            Record { addr: slot + SLOT_TAIL, old: st.log.tail, new: a.new_tail },
        ];
        // The old pages are ours once the switch commits (see `share`): marked first.
        if let Some(p) = &self.share {
            for pg in st.log.pages.iter() {
                p.own(pg / BLOCK, 1);
            }
        }
        // The old pages are freed below: settled by the commit's fences.
        let settling = self.settle_marks(None);
        if let Err(e) = self.journal_commit(&recs) {
            self.free_pages(&taken);
            self.free_pages(&[first]);
            return Err(e);
        }
        self.marks.settled(&settling);
        let old_pages = std::mem::take(&mut st.log.pages).to_vec();
        let mut fresh = InodeState::new(st.ftype);
        fresh.log.head = new_head;
        fresh.log.pages.push(first);
        let freed = Self::apply_committed(&mut fresh, &a, &entries);
        debug_assert!(freed.is_empty(), "a snapshot releases no data");
        fresh.gc_check_at = st.gc_check_at;
        fresh.gc_floor = fresh.log.pages.len();
        fresh.chain_gen = self.note_chain_change(inode.ino);
        *st = fresh;
        self.note_free(inode.ino);
        self.free_pages(&old_pages);
        self.gc_stats.thorough_runs.fetch_add(1, Ordering::Relaxed);
        self.gc_stats.thorough_pages.fetch_add(
            old_pages.len().saturating_sub(st.log.pages.len()) as u64,
            Ordering::Relaxed,
        );
        Ok(())
    }

    /// Run thorough GC on `ino` now (tests and `ferrite gc`).
    pub fn compact(&self, ino: u64) -> Result<()> {
        self.check_writable()?;
        let i = self.inode_arc(ino)?;
        let _h = self.hold(&i)?;
        let _r = i.ranges.lock(0, u64::MAX);
        let mut st = i.st.write();
        self.fast_gc(&i, &mut st);
        self.thorough_gc(&i, &mut st)
    }
}

fn snapshot_pages<M: Medium>(m: &M, st: &InodeState) -> usize {
    let bytes: usize = snapshot_entries_sizes(m, st);
    bytes.div_ceil((LOG_DATA_END - log::END_RESERVE) as usize - 64) + 1
}

fn snapshot_entries_sizes<M: Medium>(_m: &M, st: &InodeState) -> usize {
    let mut n = log::SETATTR_LEN;
    match &st.body {
        Body::File(f) => {
            // Runs keep their page checksums: 4 bytes a page, split as writers do.
            // Counted per run, as DRAM holds them, although the snapshot writes runs
            // that continue each other as one entry: the bound is what a GC costs
            // (a checksum read and an entry per run), so a log whose runs would
            // merge is not compacted more often than one whose runs would not (a
            // 4 MiB file overwritten in order: counted merged, its bound shrank to a
            // few pages, GC ran that much more often, and a write took 13% more
            // instructions by callgrind).
            n += f
                .ext
                .iter()
                .map(|(_, e)| {
                    let chunks = (e.len as usize).div_ceil(log::PCRC_MAX_PAGES as usize);
                    chunks * (log::WRITE_LEN + 4) + 4 * e.len as usize
                })
                .sum::<usize>();
            for ops in f.ops.values() {
                for op in ops {
                    n += match op {
                        PageOp::Overlay { len, .. } => {
                            (log::INLINE_HDR + *len as usize).div_ceil(8) * 8
                        }
                        PageOp::Zero { .. } => log::PUNCH_LEN,
                    };
                }
            }
        }
        Body::Dir(d) => {
            n += d.names.keys().map(|k| (log::DENTRY_HDR + k.len()).div_ceil(8) * 8).sum::<usize>();
        }
    }
    n += st
        .xattrs
        .iter()
        .map(|(k, v)| {
            let body = match &v.spill {
                Some(sp) => 8 + 8 * sp.blocks.len(),
                None => v.value_len as usize,
            };
            (log::XATTR_HDR + k.len() + body).div_ceil(8) * 8
        })
        .sum::<usize>();
    n
}

/// File pages in consecutive blocks, as a snapshot writes them.
struct Run {
    pg: u64,
    block: u64,
    len: u64,
    /// Each page's checksum, or none for an unchecked run.
    crcs: Option<Vec<u32>>,
}

impl Run {
    /// Does the run of `len` pages at `pg` in blocks from `block` (`checked`: with
    /// page checksums) continue this one, so that one entry can map both?
    fn continued_by(&self, pg: u64, block: u64, len: u32, checked: bool) -> bool {
        self.pg + self.len == pg
            && self.block + self.len == block
            && self.crcs.is_some() == checked
            // An unchecked WRITE maps at most what one extent holds.
            && (checked || self.len + u64::from(len) <= u64::from(crate::extmap::MAX_RUN))
    }

    /// Its WRITE entries (checked ones hold up to `PCRC_MAX_PAGES` pages each).
    fn emit(self, a: &AttrRec, out: &mut Vec<EntryBuf>) {
        match self.crcs {
            Some(c) => {
                for (k, part) in c.chunks(log::PCRC_MAX_PAGES as usize).enumerate() {
                    let off = (k * log::PCRC_MAX_PAGES as usize) as u64;
                    let (pg, block) = (self.pg + off, self.block + off);
                    out.push(EntryBuf::write_crcs(pg, block, a.size, a.mtime, None, part));
                }
            }
            None => {
                let len = u32::try_from(self.len).expect("unchecked runs stay within MAX_RUN");
                out.push(EntryBuf::write(self.pg, self.block, len, a.size, a.mtime, None));
            }
        }
    }
}

/// The live state of an inode as a list of entries that replay to it.
pub(crate) fn snapshot_entries<M: Medium>(m: &M, st: &InodeState) -> Vec<EntryBuf> {
    let a = &st.attr;
    let mut out = Vec::new();
    let mut tail: Option<crate::index::TailRun> = None;
    match &st.body {
        Body::File(f) => {
            // A run that continues the one before it in pages and blocks (pages of
            // a file written in order, each from its own entry) joins it: one entry
            // for both, so the compacted log and the extent map shrink.
            let mut pend: Option<Run> = None;
            // A run of in-place appends goes on after GC: its page's entry, an
            // in-place append again, comes last (after the SETATTR, which would
            // end the run), so recovery still finds it as the log's last operation's.
            for (pg, e) in f.ext.iter() {
                if let Some(r) = f.tail.filter(|r| (r.pg, r.block, 1) == (pg, e.block, e.len)) {
                    tail = Some(r);
                    continue;
                }
                // The pages' checksums move with them (the seed does not change);
                // entries without any, or damaged since replay, stay unchecked.
                let crcs = log::write_page_crcs(m, e.loc, e.block, e.len as u64).ok().flatten();
                if let Some(p) =
                    pend.as_mut().filter(|p| p.continued_by(pg, e.block, e.len, crcs.is_some()))
                {
                    p.len += u64::from(e.len);
                    if let (Some(v), Some(c)) = (p.crcs.as_mut(), crcs) {
                        v.extend(c);
                    }
                    continue;
                }
                if let Some(p) = pend.take() {
                    p.emit(a, &mut out);
                }
                pend = Some(Run { pg, block: e.block, len: u64::from(e.len), crcs });
            }
            if let Some(p) = pend {
                p.emit(a, &mut out);
            }
            let mut pages: Vec<&u64> = f.ops.keys().collect();
            pages.sort();
            for pg in pages {
                for op in &f.ops[pg] {
                    match *op {
                        PageOp::Overlay { loc, data_off, off, len } => {
                            let mut d = vec![0u8; len as usize];
                            log::read_payload(m, loc.get(), data_off, &mut d);
                            out.push(EntryBuf::inline(
                                pg * BLOCK + off as u64,
                                a.size,
                                a.mtime,
                                &d,
                            ));
                        }
                        PageOp::Zero { off, len } => {
                            out.push(EntryBuf::punch(pg * BLOCK + off as u64, len as u64, a.mtime));
                        }
                    }
                }
            }
        }
        Body::Dir(d) => {
            for (cookie, name) in d.order.iter() {
                let e = &d.names[name];
                out.push(EntryBuf::dentry(e.ino, cookie, a.mtime, e.ftype, name));
            }
        }
    }
    for (name, r) in &st.xattrs {
        if let Some(sp) = &r.spill {
            // The value stays in its blocks; the new entry names them again.
            out.push(EntryBuf::xattr_spilled(name, r.value_len, sp, a.ctime));
            continue;
        }
        let mut v = vec![0u8; r.value_len as usize];
        log::read_payload(m, r.loc, r.value_off, &mut v);
        out.push(EntryBuf::xattr(false, name, &v, a.ctime));
    }
    out.push(EntryBuf::setattr(a, false));
    if let Some(r) = tail {
        debug_assert_eq!(r.pg * BLOCK + u64::from(r.valid), a.size, "a run ends the file");
        let mut e = EntryBuf { bytes: Default::default() };
        e.set_tail_write(r.pg, r.block, a.size, a.mtime, None, r.crc);
        out.push(e);
    }
    out
}
