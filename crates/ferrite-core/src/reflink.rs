//! Reflinks (FICLONE / FICLONERANGE, and the aligned middle of copy_file_range):
//! a range of one file made to map the same data blocks as a range of another (or
//! of the same file), copy-on-write, without copying the data.
//!
//! Invariants:
//! - A clone is one commit of the destination's log: WRITE entries that name the
//!   source's blocks (with page checksums under the destination's seed), PUNCH
//!   entries where the source has holes, copies of the pages whose content lives
//!   in the source's log (small writes embedded over a page), and one SETATTR of
//!   size and times. After a crash the destination has all of the clone or none.
//! - One fence: every shared block's data was durable before the clone began (the
//!   source's commits), and a copied page is covered by its checksum.
//! - The references are added (`refs`) before the commit, under the source's
//!   hold and state lock, and dropped again if the commit fails.
//! - Lock order: both inodes' holds, then their range locks, then their state
//!   locks, each in ascending inode order (one of each for a clone within a file).
//! - A DAX-mapped source is copied, not shared (its blocks change in place); a
//!   DAX-mapped destination refuses (EBUSY), as collapse and insert do.

use crate::error::{Error, Result};
use crate::fs::{Fs, Inode};
use crate::index::InodeState;
use crate::layout::{BLOCK, MAX_FILE_SIZE};
use crate::log::{self, EntryBuf};
use crate::pmem::Medium;
use smallvec::SmallVec;
use std::sync::Arc;

/// What a clone does to each destination page.
#[derive(Default)]
struct Plan {
    /// (destination page, block, checksum under the destination's seed): the
    /// source's blocks, and fresh copies of the pages whose content lives in the
    /// source's log, ascending.
    cow: Vec<(u64, u64, u32)>,
    /// The source's blocks among them (they get a reference each).
    shared: Vec<u64>,
    /// The fresh blocks of the copies (freed if the clone fails).
    fresh: Vec<(u64, u64)>,
    /// The destination range (offset, whole pages) to unmap first, when it holds
    /// data somewhere.
    punch: Option<(u64, u64)>,
}

impl<M: Medium> Fs<M> {
    /// FICLONERANGE: make `[off_out, off_out + len)` of regular file `dst` share
    /// the data of `[off_in, off_in + len)` of `src` (`len` 0: to the source's end
    /// of file); durable and atomic when it returns. Returns the bytes cloned.
    /// Linux's rules (`generic_remap_checks`): page-aligned offsets, a length that
    /// is page-aligned unless it reaches the source's end of file, a source range
    /// inside the source, no overlap within one file (all EINVAL); a source end of
    /// file that is not page-aligned may not land inside the destination (EINVAL,
    /// as btrfs); EFBIG past the largest file; EBUSY while `dst` is DAX-mapped.
    pub fn clone_range(
        &self,
        src: u64,
        off_in: u64,
        dst: u64,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        self.clone_range_as(src, off_in, dst, off_out, len, || false)
    }

    /// [`Fs::clone_range`] by a writer that may lack `CAP_FSETID` (see
    /// [`Fs::write_as`]): the destination loses its set-id bits as on a write.
    pub fn clone_range_as(
        &self,
        src: u64,
        off_in: u64,
        dst: u64,
        off_out: u64,
        len: u64,
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<u64> {
        self.check_writable()?;
        let (si, di) = self.range_pair(src, off_in, dst, off_out)?;
        if !off_in.is_multiple_of(BLOCK) || !off_out.is_multiple_of(BLOCK) {
            return Err(Error::invalid("clone offsets must be page-aligned"));
        }
        let same = src == dst;
        let (lo, hi) = if src <= dst { (&si, &di) } else { (&di, &si) };
        let _h1 = self.hold(lo)?;
        let _h2 = if same { None } else { self.hold(hi)? };
        let (p_in, p_out) = (off_in / BLOCK, off_out / BLOCK);
        let _r1;
        let _r2;
        if same {
            _r1 = lo.ranges.lock(p_in.min(p_out), u64::MAX);
            _r2 = None;
        } else {
            let first = |i: &Arc<Inode>| if i.ino == src { p_in } else { p_out };
            _r1 = lo.ranges.lock(first(lo), u64::MAX);
            _r2 = Some(hi.ranges.lock(first(hi), u64::MAX));
        }
        if same {
            let mut st = si.st.write();
            // The source's blocks become shared: none may take bytes in place.
            st.end_tail_run();
            let (plan, len, size) = self.clone_plan(&si, &st, off_in, &di, &st, off_out, len)?;
            self.clone_commit(&di, &mut st, plan, len, size, lacks_fsetid)
        } else {
            let mut g1 = lo.st.write();
            let mut g2 = hi.st.write();
            let (sst, dst_st) = if lo.ino == src { (&mut g1, &mut g2) } else { (&mut g2, &mut g1) };
            sst.end_tail_run();
            let (plan, len, size) = self.clone_plan(&si, sst, off_in, &di, dst_st, off_out, len)?;
            self.clone_commit(&di, dst_st, plan, len, size, lacks_fsetid)
        }
    }

    /// Check a clone against both files' state and decide each page's fate;
    /// returns the plan, the byte length and the destination's new size.
    #[allow(clippy::too_many_arguments)]
    fn clone_plan(
        &self,
        si: &Inode,
        sst: &InodeState,
        off_in: u64,
        di: &Inode,
        dst_st: &InodeState,
        off_out: u64,
        len: u64,
    ) -> Result<(Plan, u64, u64)> {
        let ssize = sst.attr.size;
        if len == 0 && off_in == ssize {
            return Ok((Plan::default(), 0, dst_st.attr.size));
        }
        if off_in >= ssize {
            return Err(Error::invalid("clone source range starts at or past its end of file"));
        }
        let len = if len == 0 { ssize - off_in } else { len.min(ssize - off_in) };
        let to_eof = off_in + len == ssize;
        if !to_eof && !len.is_multiple_of(BLOCK) {
            return Err(Error::invalid("clone length must be page-aligned before end of file"));
        }
        let end_out = off_out.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE);
        let end_out = end_out.ok_or(Error::FileTooBig)?;
        let bcount = len.next_multiple_of(BLOCK);
        if si.ino == di.ino && off_out < off_in + bcount && off_in < off_out + bcount {
            return Err(Error::invalid("clone ranges overlap within one file"));
        }
        if !len.is_multiple_of(BLOCK) && end_out < dst_st.attr.size {
            return Err(Error::invalid("a partial last page would land inside the destination"));
        }
        if self.pinned(di) {
            return Err(Error::DaxMapped);
        }
        let copy_all = self.pinned(si);
        let mut plan = Plan::default();
        let Some(sf) = sst.file() else { return Err(Error::invalid("clone of a non-file")) };
        let (s0, s1) = (off_in / BLOCK, (off_in + bcount) / BLOCK);
        let to_dst = |spg: u64| off_out / BLOCK + (spg - s0);
        // Walk the source's runs and overlays, not its pages: the work is bounded by
        // what the pool holds, whatever the range's length (a sparse file).
        let mut copy: Vec<(u64, u64)> = Vec::new(); // (destination page, source page)
        let mut page = vec![0u8; BLOCK as usize];
        for (pg, e) in sf.ext.runs_in(s0, s1) {
            for spg in pg.max(s0)..(pg + e.len as u64).min(s1) {
                if copy_all || sst.page_ops(spg).0 > 0 {
                    copy.push((to_dst(spg), spg));
                    continue;
                }
                let blk = e.block + (spg - pg);
                let crc = match log::write_page_crc(&self.m, e.loc, blk)? {
                    Some(c) => c ^ si.seed ^ di.seed,
                    None => {
                        // No stored checksum (a DAX page once mapped): its content
                        // is flushed (the commit's fence orders it) and checksummed
                        // as it is.
                        self.m.flush(blk * BLOCK, BLOCK);
                        self.m.read(blk * BLOCK, &mut page);
                        log::page_crc(di.seed, &page)
                    }
                };
                plan.cow.push((to_dst(spg), blk, crc));
                plan.shared.push(blk);
            }
        }
        // Overlays on pages no run maps (data embedded over a hole).
        for (&spg, _) in sf.ops.iter() {
            if spg >= s0 && spg < s1 && sf.lookup(spg).is_none() {
                copy.push((to_dst(spg), spg));
            }
        }
        // The destination range is unmapped first where it holds anything (the
        // source's holes stay holes); the WRITE entries then map the rest.
        let (d0, d1) = (off_out / BLOCK, off_out / BLOCK + bcount / BLOCK);
        if dst_st.file().and_then(|f| f.next_data(d0)).is_some_and(|p| p < d1) {
            plan.punch = Some((off_out, bcount));
        }
        if !copy.is_empty() {
            let shard = self.data_shard(di, dst_st);
            plan.fresh = self.copy_to_fresh(si, sst, &copy, di.seed, shard, &mut plan.cow)?;
            plan.cow.sort_unstable_by_key(|c| c.0);
        }
        Ok((plan, len, dst_st.attr.size.max(end_out)))
    }

    /// The clone's one commit (both files locked; `st` is the destination's).
    fn clone_commit(
        &self,
        di: &Inode,
        st: &mut InodeState,
        plan: Plan,
        len: u64,
        size: u64,
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<u64> {
        if len == 0 {
            return Ok(0);
        }
        if let Err(e) = self.add_refs(&plan.shared) {
            self.free_runs(&plan.fresh);
            return Err(e);
        }
        if let Some(p) = &self.share {
            // Committed blocks of the source: no party's own any more (see `refs`).
            for &b in &plan.shared {
                p.table().set_owner(b, 1, crate::share::DAEMON);
            }
        }
        let now = self.stamp(di).0;
        let mut entries: SmallVec<[EntryBuf; 4]> = SmallVec::new();
        Self::data_change_entries(st, size, now, lacks_fsetid, &mut entries);
        if let Some((off, n)) = plan.punch {
            entries.push(EntryBuf::punch(off, n, now));
        }
        crate::ops::cow_entries(di.seed, &plan.cow, size, now, true, &mut entries);
        if let Err(e) = self.commit_single(di, st, &mut entries, false, false) {
            for &b in &plan.shared {
                self.drop_ref(b);
            }
            self.free_runs(&plan.fresh);
            return Err(e);
        }
        Ok(len)
    }

    /// Copy pages of `src` (state `sst`) into fresh blocks of `shard`, each
    /// `(to page, from page)` of `pairs` pushed onto `cow` as (to page, block,
    /// checksum under `seed`); returns the blocks (freed again on an error, when
    /// nothing is pushed). Content is checked first where reads check.
    fn copy_to_fresh(
        &self,
        src: &Inode,
        sst: &InodeState,
        pairs: &[(u64, u64)],
        seed: u32,
        shard: u32,
        cow: &mut Vec<(u64, u64, u32)>,
    ) -> Result<Vec<(u64, u64)>> {
        let runs = self.alloc_blocks(shard, pairs.len() as u64, false)?.to_vec();
        let mut page = vec![0u8; BLOCK as usize];
        let at = cow.len();
        for (&(to, from), b) in pairs.iter().zip(runs.iter().flat_map(|&(s, n)| s..s + n)) {
            let len = sst.attr.size.saturating_sub(from * BLOCK).min(BLOCK) as usize;
            if let Err(e) = self.read_page_verified(src, sst, from, &mut page, len) {
                cow.truncate(at);
                self.free_runs(&runs);
                return Err(e);
            }
            cow.push((to, b, self.m.write_nt_crc(b * BLOCK, &page) ^ seed));
        }
        Ok(runs)
    }

    /// FALLOC_FL_UNSHARE_RANGE's part: every page of `[off, end)` below the end of
    /// file whose block another file (or place) also maps gets a copy of its own,
    /// all in one commit (the caller holds the hold, range and state locks).
    pub(crate) fn unshare_locked(
        &self,
        i: &Inode,
        st: &mut InodeState,
        off: u64,
        end: u64,
    ) -> Result<()> {
        if !self.any_shared() {
            return Ok(());
        }
        let size = st.attr.size;
        let last = end.min(size).div_ceil(BLOCK);
        let Some(f) = st.file() else { return Ok(()) };
        // The runs of the range, not its pages (bounded by what the pool holds).
        let mut pages: Vec<u64> = Vec::new();
        for (pg, e) in f.ext.runs_in(off / BLOCK, last) {
            let from = pg.max(off / BLOCK);
            let to = (pg + e.len as u64).min(last);
            pages.extend((from..to).filter(|&p| self.extra_refs(e.block + (p - pg)) > 0));
        }
        if pages.is_empty() {
            return Ok(());
        }
        let pairs: Vec<(u64, u64)> = pages.iter().map(|&pg| (pg, pg)).collect();
        let mut cow: Vec<(u64, u64, u32)> = Vec::with_capacity(pages.len());
        let runs = self.copy_to_fresh(i, st, &pairs, i.seed, self.data_shard(i, st), &mut cow)?;
        let mut entries: SmallVec<[EntryBuf; 4]> = SmallVec::new();
        // Same content, size and times: only the blocks change.
        crate::ops::cow_entries(i.seed, &cow, size, st.attr.mtime, true, &mut entries);
        if let Err(e) = self.commit_single(i, st, &mut entries, false, false) {
            self.free_runs(&runs);
            return Err(e);
        }
        Ok(())
    }
}
