//! DAX mappings of files: a process maps a file's own pool blocks into its address
//! space, and its stores change the file in place (issue 13; NOVA's DAX-mmap, FLEX's
//! user-space mapping). This module keeps the blocks under a live mapping where
//! they are; `dax` maps them into the process (the address-space side).
//!
//! Invariants:
//! - A *DAX page* is a file page backed by a whole block of its own, mapped by a
//!   WRITE entry that carries no checksum, with no data embedded over it in the log.
//!   Only DAX pages are ever mapped: stores through a mapping change the block in
//!   place, so no checksum may cover it (a read would call it corrupt) and recovery
//!   never checks (and so never rolls back) the WRITE that mapped it.
//! - [`Fs::dax_pin`] makes every page of a range below the end of file a DAX page
//!   (copy-on-write into fresh blocks, committed with a fence between the data and
//!   the tail, content unchanged) *after* it pinned the file, under the inode's
//!   lock: a writer that takes the lock later sees the pin.
//! - While a file is pinned (this process's count in [`Inode`], or any party's bit
//!   in the coordination table), no block of it is freed or replaced: writes go in
//!   place into its DAX pages (copy-on-write elsewhere), and truncation below its
//!   size, hole punching, zeroing and collapsing fail with [`Error::DaxMapped`]. A
//!   pin holds an open handle ([`Fs::open`]), so an unlinked mapped file lives on.
//! - A pinned page therefore stays the file's page for as long as any mapping of it
//!   lives: a mapping never writes into a block that belongs to something else.
//! - The daemon clears a dead party's table bit when it resolves it (`sharing`).
//! - A block another file also maps (`refs`) is never a DAX page: pinning copies it
//!   into a block of the file's own first, and a clone from a pinned file copies.

use crate::error::{Error, Result};
use crate::fs::{Fs, Inode};
use crate::index::InodeState;
use crate::layout::BLOCK;
use crate::log::{self, EntryBuf};
use crate::pmem::{persist_copy, Medium};
use smallvec::SmallVec;
use std::sync::atomic::Ordering;

/// Runs of DAX pages a pin returns: (first file page, first block, pages).
pub type DaxRuns = Vec<(u64, u64, u64)>;

/// WRITE entries one materializing commit carries at most.
const MATERIALIZE_BATCH: usize = 64;

impl<M: Medium> Fs<M> {
    /// Pin regular file `ino` for a DAX mapping of `[off, off + len)` (`off` a
    /// multiple of the page size) and return the blocks of its pages below the end
    /// of file, each a DAX page. Holds an open handle until [`Fs::dax_unpin`].
    pub fn dax_pin(&self, ino: u64, off: u64, len: u64) -> Result<DaxRuns> {
        self.check_writable()?;
        if !off.is_multiple_of(BLOCK) || len == 0 {
            return Err(Error::invalid("DAX mapping offset not page aligned, or empty"));
        }
        let pg0 = off / BLOCK;
        let pgn = off
            .checked_add(len)
            .filter(|&e| e <= crate::layout::MAX_FILE_SIZE)
            .ok_or(Error::FileTooBig)?
            .div_ceil(BLOCK);
        self.open(ino)?;
        let r = self.pin_locked(ino, pg0, pgn);
        if r.is_err() {
            let _ = self.release(ino);
        }
        r
    }

    fn pin_locked(&self, ino: u64, pg0: u64, pgn: u64) -> Result<DaxRuns> {
        let i = self.inode(ino)?;
        self.check_regular(&i)?;
        let _h = self.hold(&i)?;
        let _r = i.ranges.lock(pg0, pgn);
        self.pin(&i);
        // Stores through the mapping may land past the end of file.
        i.st.write().end_tail_run();
        match self.materialize(&i, pg0, pgn) {
            Ok(runs) => Ok(runs),
            Err(e) => {
                self.unpin(&i);
                Err(e)
            }
        }
    }

    /// End a pin taken with [`Fs::dax_pin`] (after the mapping is gone).
    pub fn dax_unpin(&self, ino: u64) -> Result<()> {
        let i = self.inode(ino)?;
        {
            let _h = self.hold(&i)?;
            if !self.unpin(&i) {
                return Err(Error::BadHandle);
            }
        }
        self.release(ino)
    }

    /// Replace whole pages of regular file `ino` in one commit (NOVA's atomic
    /// mmap: an atomic mapping's msync): each `(file page, 4096 bytes)` is copied
    /// into a fresh block with its page checksum, and one WRITE entry per run of
    /// them commits with one tail store, so after a crash the file shows all of
    /// them or none. Pages ascending and distinct, below the end of file (the size
    /// does not change). EBUSY (`DaxMapped`) while the file is DAX-mapped: its
    /// blocks may not move.
    pub fn write_pages_atomic(&self, ino: u64, pages: &[(u64, &[u8])]) -> Result<()> {
        self.check_writable()?;
        let i = self.inode(ino)?;
        self.check_regular(&i)?;
        let (Some(first), Some(last)) = (pages.first(), pages.last()) else {
            return Ok(());
        };
        let ordered = pages.windows(2).all(|w| w[0].0 < w[1].0);
        if !ordered || pages.iter().any(|p| p.1.len() != BLOCK as usize) {
            return Err(Error::invalid("pages not ascending, or not whole"));
        }
        let _h = self.hold(&i)?;
        let _r = i.ranges.lock(first.0, last.0 + 1);
        if self.pinned(&i) {
            return Err(Error::DaxMapped);
        }
        let past_end = |size: u64| last.0 >= size.div_ceil(BLOCK);
        if past_end(i.st.read().attr.size) {
            return Err(Error::invalid("atomic page write past the end of file"));
        }
        let shard = self.data_shard(&i, &i.st.read());
        let runs = self.alloc_blocks(shard, pages.len() as u64, false)?;
        let mut blocks = runs.iter().flat_map(|&(s, n)| s..s + n);
        let mut cow: Vec<(u64, u64, u32)> = Vec::with_capacity(pages.len());
        for &(pg, data) in pages {
            let b = blocks.next().expect("allocated");
            cow.push((pg, b, self.m.write_nt_crc(b * BLOCK, data) ^ i.seed));
        }
        let mut st = i.st.write();
        let size = st.attr.size;
        if past_end(size) {
            // Truncated meanwhile (outside this range lock).
            drop(st);
            self.free_runs(&runs);
            return Err(Error::invalid("atomic page write past the end of file"));
        }
        let (now, _) = self.stamp(&i);
        let mut entries: SmallVec<[EntryBuf; 2]> = SmallVec::new();
        crate::ops::cow_entries(i.seed, &cow, size, now, true, &mut entries);
        // Checksummed pages: data, entries and tail under one fence.
        if let Err(e) = self.commit_single(&i, &mut st, &mut entries, false, false) {
            drop(st);
            self.free_runs(&runs);
            return Err(e);
        }
        Ok(())
    }

    /// Does some process (this one, or a party of the pool) have a live DAX mapping
    /// of `i`?
    pub(crate) fn pinned(&self, i: &Inode) -> bool {
        if i.dax.load(Ordering::Acquire) > 0 {
            return true;
        }
        match (&self.share, i.shared) {
            (Some(p), true) => p.table().dax_pinned(i.ino),
            _ => false,
        }
    }

    /// Is `ino` pinned by a DAX mapping (of any process)?
    pub fn dax_pinned(&self, ino: u64) -> Result<bool> {
        Ok(self.pinned(&*self.inode(ino)?))
    }

    fn pin(&self, i: &Inode) {
        if i.dax.fetch_add(1, Ordering::AcqRel) == 0 {
            if let (Some(p), true) = (&self.share, i.shared) {
                p.table().set_dax(i.ino, p.id(), true);
            }
        }
    }

    /// Drop one pin; false when `i` had none.
    fn unpin(&self, i: &Inode) -> bool {
        let dec = |n: u32| n.checked_sub(1);
        let Ok(prev) = i.dax.fetch_update(Ordering::AcqRel, Ordering::Acquire, dec) else {
            return false;
        };
        if prev == 1 {
            if let (Some(p), true) = (&self.share, i.shared) {
                p.table().set_dax(i.ino, p.id(), false);
            }
        }
        true
    }

    /// The block of page `pg` when it is a DAX page.
    pub(crate) fn dax_page(&self, st: &InodeState, pg: u64) -> Result<Option<u64>> {
        let Some((blk, loc)) = st.file().and_then(|f| f.lookup(pg)) else { return Ok(None) };
        // A shared block is no DAX page: stores would change every file of it.
        if st.page_ops(pg).0 > 0 || self.extra_refs(blk) > 0 || log::write_is_checked(&self.m, loc)?
        {
            return Ok(None);
        }
        Ok(Some(blk))
    }

    /// Make pages `[pg0, pgn)` below the end of file DAX pages; the caller holds the
    /// inode's hold and the range lock. Returns their runs.
    fn materialize(&self, i: &Inode, pg0: u64, pgn: u64) -> Result<DaxRuns> {
        let todo: Vec<u64> = {
            let st = i.st.read();
            let last = st.attr.size.div_ceil(BLOCK).min(pgn);
            let mut v = Vec::new();
            for pg in pg0..last.max(pg0) {
                if self.dax_page(&st, pg)?.is_none() {
                    v.push(pg);
                }
            }
            v
        };
        // Blocks for every hole, or none: a mapping that cannot have them all must
        // not leave the pool full of the ones it got (a 2 GiB sparse file mapped in
        // a 512 MiB pool took every free block, and failed).
        if !self.room_for(todo.len() as u64) {
            return Err(Error::NoSpace);
        }
        for chunk in todo.chunks(MATERIALIZE_BATCH) {
            self.materialize_pages(i, chunk)?;
        }
        let st = i.st.read();
        let last = st.attr.size.div_ceil(BLOCK).min(pgn);
        let mut runs: DaxRuns = Vec::new();
        for pg in pg0..last.max(pg0) {
            let blk = self.dax_page(&st, pg)?.expect("materialized under the range lock");
            match runs.last_mut() {
                Some((p, b, n)) if *p + *n == pg && *b + *n == blk => *n += 1,
                _ => runs.push((pg, blk, 1)),
            }
        }
        Ok(runs)
    }

    /// Copy pages `pgs` (ascending) into fresh blocks and commit WRITE entries
    /// without checksums for them: same content, same size and times.
    fn materialize_pages(&self, i: &Inode, pgs: &[u64]) -> Result<()> {
        let shard = self.data_shard(i, &i.st.read());
        let runs = self.alloc_blocks(shard, pgs.len() as u64, false)?;
        let blocks: SmallVec<[u64; MATERIALIZE_BATCH]> =
            runs.iter().flat_map(|&(s, n)| s..s + n).collect();
        {
            let st = i.st.read();
            let mut page = vec![0u8; BLOCK as usize];
            for (&pg, &b) in pgs.iter().zip(&blocks) {
                // Damaged content must not lose its checksum silently.
                let end = (st.attr.size - pg * BLOCK).min(BLOCK) as usize;
                if let Err(e) = self.read_page_verified(i, &st, pg, &mut page, end) {
                    drop(st);
                    self.free_runs(&runs);
                    return Err(e);
                }
                self.m.write_nt(b * BLOCK, &page);
            }
        }
        let mut st = i.st.write();
        let (size, mtime) = (st.attr.size, st.attr.mtime);
        let mut entries: SmallVec<[EntryBuf; 4]> = SmallVec::new();
        let cow: SmallVec<[(u64, u64, u32); MATERIALIZE_BATCH]> =
            pgs.iter().zip(&blocks).map(|(&pg, &b)| (pg, b, 0)).collect();
        // No checksums: these are DAX pages.
        crate::ops::cow_entries(i.seed, &cow, size, mtime, false, &mut entries);
        // No checksum covers the data: it is fenced before the tail.
        let r = self.commit_single(i, &mut st, &mut entries, true, false);
        if r.is_err() {
            drop(st);
            self.free_runs(&runs);
        }
        r
    }

    /// A write to a pinned file (the caller holds the hold and the range lock):
    /// in place into its DAX pages, copy-on-write elsewhere, then one commit of
    /// the size, times and privileges. Durable when it returns; a crash during it
    /// may leave the DAX pages' part of it torn, as a store through a mapping.
    pub(crate) fn write_pinned(
        &self,
        i: &Inode,
        off: u64,
        data: &[u8],
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<()> {
        let end = off + data.len() as u64;
        // Segments of the write: (start, end, DAX block of its page if any).
        let mut segs: SmallVec<[(u64, u64, Option<u64>); 4]> = SmallVec::new();
        let size = {
            let st = i.st.read();
            let mut pos = off;
            while pos < end {
                let pg = pos / BLOCK;
                let to = ((pg + 1) * BLOCK).min(end);
                let dax = self.dax_page(&st, pg)?;
                match segs.last_mut() {
                    Some((_, e, None)) if dax.is_none() => *e = to,
                    _ => segs.push((pos, to, dax)),
                }
                pos = to;
            }
            st.attr.size
        };
        for &(a, b, dax) in &segs {
            let src = &data[(a - off) as usize..(b - off) as usize];
            match dax {
                Some(blk) => {
                    let base = blk * BLOCK;
                    let pg_start = a / BLOCK * BLOCK;
                    // Bytes between the old end of file and the write read as zeros.
                    let z0 = size.max(pg_start);
                    if a > z0 {
                        let z = [0u8; BLOCK as usize];
                        persist_copy(&self.m, base + (z0 - pg_start), &z[..(a - z0) as usize]);
                    }
                    persist_copy(&self.m, base + (a - pg_start), src);
                }
                None => self.write_cow(i, a, src, || false)?,
            }
        }
        let mut st = i.st.write();
        let now = self.m.now();
        let mut entries: SmallVec<[EntryBuf; 2]> = SmallVec::new();
        let size = st.attr.size.max(end);
        Self::data_change_entries(&st, size, now, lacks_fsetid, &mut entries);
        // The in-place stores are flushed: fence them before the tail.
        self.commit_single(i, &mut st, &mut entries, true, false)
    }
}
