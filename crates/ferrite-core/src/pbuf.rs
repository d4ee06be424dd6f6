//! Persistent user buffers (Libpubl's idea, made zero-copy; issue 13): blocks of
//! the pool a process fills with its own stores and then writes into files *by
//! reference*. A buffer write adopts the buffer's whole pages that line up with
//! whole file pages (its WRITE entries name the buffer's blocks, which become the
//! file's), copies the rest (the partial pages at its edges) as any write does,
//! and commits all of it as one operation; the buffer then gets fresh blocks in
//! place of the adopted ones, so it is reusable at once.
//!
//! Invariants:
//! - A buffer's blocks are allocated (no one else gets them) and referenced by no
//!   log: after a crash, recovery rebuilds the free map from the logs and they are
//!   free again, so no buffer outlives a crash. A clean unmount, a client's
//!   detach and [`Fs::pbuf_free`] free them.
//! - A buffer write commits every page it adopts or copies in one operation, with
//!   page checksums (the adopted pages' are computed from their content, which the
//!   write flushes itself): after a crash the file has all of the write or none.
//! - Replacement blocks are allocated *before* the commit, so a write that cannot
//!   get them fails with nothing changed; after the commit the adopted blocks are
//!   the file's and the buffer never names them again.

use crate::error::{Error, Result};
use crate::fs::Fs;
use crate::layout::{BLOCK, MAX_FILE_SIZE};
use crate::log::{self, EntryBuf};
use crate::pmem::Medium;
use smallvec::SmallVec;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// This mount's persistent buffers: id to blocks (one per buffer page).
#[derive(Default)]
pub struct PBufs {
    all: parking_lot::Mutex<HashMap<u64, Vec<u64>>>,
    /// Buffers a write is adopting from (one write per buffer at a time: two
    /// would adopt the same blocks into two places).
    busy: parking_lot::Mutex<std::collections::HashSet<u64>>,
    next: AtomicU64,
}

/// A buffer checked out by one write (or its free); back when this drops.
pub(crate) struct CheckedOut<'a> {
    bufs: &'a PBufs,
    id: u64,
}

impl Drop for CheckedOut<'_> {
    fn drop(&mut self) {
        self.bufs.busy.lock().remove(&self.id);
    }
}

impl PBufs {
    /// Check buffer `id` out for one write or its free: EBUSY while another has it.
    pub(crate) fn check_out(&self, id: u64) -> Result<CheckedOut<'_>> {
        if !self.busy.lock().insert(id) {
            return Err(Error::Busy);
        }
        Ok(CheckedOut { bufs: self, id })
    }
}

/// Buffer pages whose blocks a write replaced: (buffer page, new block).
pub type Replaced = Vec<(usize, u64)>;

impl<M: Medium> Fs<M> {
    /// A persistent buffer of `pages` pages: its id and its blocks (in order).
    /// Their content is whatever the blocks held.
    pub fn pbuf_alloc(&self, pages: u64) -> Result<(u64, Vec<u64>)> {
        self.check_writable()?;
        if pages == 0 || pages > self.geo.nblocks {
            return Err(Error::invalid("persistent buffer size"));
        }
        let runs = self.alloc_blocks(self.local_shard(), pages, false)?;
        let blocks: Vec<u64> = runs.iter().flat_map(|&(s, n)| s..s + n).collect();
        let id = self.pbufs.next.fetch_add(1, Ordering::Relaxed) + 1;
        self.pbufs.all.lock().insert(id, blocks.clone());
        Ok((id, blocks))
    }

    /// Free buffer `id` (its blocks go back to the allocator).
    pub fn pbuf_free(&self, id: u64) -> Result<()> {
        let c = self.pbufs.check_out(id)?;
        self.pbuf_free_out(&c)
    }

    /// [`Fs::pbuf_free`] of a buffer the caller checked out.
    pub(crate) fn pbuf_free_out(&self, c: &CheckedOut<'_>) -> Result<()> {
        let blocks = self.pbufs.all.lock().remove(&c.id).ok_or(Error::BadHandle)?;
        // Back in runs of consecutive blocks (a buffer's blocks mostly are).
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for b in blocks {
            match runs.last_mut() {
                Some((s, n)) if *s + *n == b => *n += 1,
                _ => runs.push((b, 1)),
            }
        }
        self.free_runs(&runs);
        Ok(())
    }

    /// Free every buffer (unmount, detach).
    pub(crate) fn pbuf_free_all(&self) {
        let all: Vec<u64> = self.pbufs.all.lock().keys().copied().collect();
        for id in all {
            let _ = self.pbuf_free(id);
        }
    }

    /// Every live buffer's blocks (fsck counts them as owned).
    pub(crate) fn pbuf_all_blocks(&self) -> std::collections::HashSet<u64> {
        self.pbufs.all.lock().values().flatten().copied().collect()
    }

    /// The blocks of buffer `id`.
    pub fn pbuf_blocks(&self, id: u64) -> Result<Vec<u64>> {
        self.pbufs.all.lock().get(&id).cloned().ok_or(Error::BadHandle)
    }

    /// Write `len` bytes of buffer `id` from byte `boff` into regular file `ino` at
    /// `off`, durable and atomic when it returns. Whole buffer pages that fall on
    /// whole file pages (`off` and `boff` equal modulo the page size) are adopted by
    /// reference; the rest is copied. Returns the buffer pages that got new blocks.
    /// A DAX-mapped file is written in place (copied) as any write to it.
    pub fn pbuf_write(&self, ino: u64, off: u64, id: u64, boff: u64, len: u64) -> Result<Replaced> {
        let c = self.pbufs.check_out(id)?;
        self.pbuf_write_out(ino, off, &c, boff, len)
    }

    /// [`Fs::pbuf_write`] from a buffer the caller checked out.
    pub(crate) fn pbuf_write_out(
        &self,
        ino: u64,
        off: u64,
        c: &CheckedOut<'_>,
        boff: u64,
        len: u64,
    ) -> Result<Replaced> {
        let id = c.id;
        self.check_writable()?;
        let i = self.inode(ino)?;
        self.check_regular(&i)?;
        let blocks = self.pbuf_blocks(id)?;
        let cap = blocks.len() as u64 * BLOCK;
        let end = off.checked_add(len).filter(|&e| e <= MAX_FILE_SIZE).ok_or(Error::FileTooBig)?;
        if boff.checked_add(len).is_none_or(|e| e > cap) {
            return Err(Error::invalid("range past the end of the buffer"));
        }
        if len == 0 {
            return Ok(Vec::new());
        }
        let _h = self.hold(&i)?;
        let _r = i.ranges.lock(off / BLOCK, end.div_ceil(BLOCK));
        let aligned = off % BLOCK == boff % BLOCK;
        let (first, last) = (off.div_ceil(BLOCK), end / BLOCK);
        if !aligned || first >= last || self.pinned(&i) {
            // Nothing to adopt: a plain write of the buffer's bytes.
            let mut data = vec![0u8; len as usize];
            self.read_buffer(&blocks, boff, &mut data);
            self.write_locked_range(&i, off, &data, || false)?;
            return Ok(Vec::new());
        }
        // Buffer page of file page `pg`.
        let bpage = |pg: u64| ((pg * BLOCK - off + boff) / BLOCK) as usize;
        let adopt: Vec<u64> = (first..last).collect();
        let fresh = self.alloc_blocks(self.local_shard(), adopt.len() as u64, false)?;
        let mut edges: SmallVec<[(u64, u64, u64); 2]> = SmallVec::new(); // (pg, from, to)
        if off < first * BLOCK {
            edges.push((off / BLOCK, off, first * BLOCK));
        }
        if last * BLOCK < end {
            edges.push((last, last * BLOCK, end));
        }
        let edge_runs = match self.alloc_blocks(self.local_shard(), edges.len() as u64, false) {
            Ok(r) => r,
            Err(e) => {
                self.free_runs(&fresh);
                return Err(e);
            }
        };
        let r = self.pbuf_commit(&i, (off, end), boff, &blocks, &adopt, &edges, &edge_runs, bpage);
        if let Err(e) = r {
            self.free_runs(&fresh);
            self.free_runs(&edge_runs);
            return Err(e);
        }
        // The adopted blocks are the file's now: the buffer takes the fresh ones.
        let mut replaced = Vec::with_capacity(adopt.len());
        let mut nb = fresh.iter().flat_map(|&(s, n)| s..s + n);
        {
            let mut all = self.pbufs.all.lock();
            let v = all.get_mut(&id).expect("the buffer lives through its write");
            for &pg in &adopt {
                let k = bpage(pg);
                let b = nb.next().expect("allocated");
                v[k] = b;
                replaced.push((k, b));
            }
        }
        Ok(replaced)
    }

    /// Copy `dst.len()` bytes of a buffer from byte `boff`.
    fn read_buffer(&self, blocks: &[u64], boff: u64, dst: &mut [u8]) {
        let mut at = 0usize;
        while at < dst.len() {
            let b = boff + at as u64;
            let n = ((BLOCK - b % BLOCK) as usize).min(dst.len() - at);
            self.m.read(blocks[(b / BLOCK) as usize] * BLOCK + b % BLOCK, &mut dst[at..at + n]);
            at += n;
        }
    }

    /// The adopting write's one commit; the caller holds the hold and range lock.
    #[allow(clippy::too_many_arguments)]
    fn pbuf_commit(
        &self,
        i: &crate::fs::Inode,
        (off, end): (u64, u64),
        boff: u64,
        blocks: &[u64],
        adopt: &[u64],
        edges: &[(u64, u64, u64)],
        edge_runs: &[(u64, u64)],
        bpage: impl Fn(u64) -> usize,
    ) -> Result<()> {
        let seed = i.seed;
        let mut cow: SmallVec<[(u64, u64, u32); 4]> = SmallVec::with_capacity(adopt.len() + 2);
        let mut page = crate::ops::spare_page();
        // The inode lock and the time stamp come first. On x86 an atomic
        // read-modify-write (a lock, an unlock, a shared pool's stamp) waits for the
        // core's earlier cache-line flushes: taken after the adopted pages' flushes,
        // it would drain them alone, and the commit's fence would make a second
        // round trip to memory (the lock's hold grows by the pages' checksums and
        // flushes, as a lone copy-on-write writer's does by its copy).
        let mut st = i.st.write();
        let (now, _) = self.stamp(i);
        let mut eb = edge_runs.iter().flat_map(|&(s, n)| s..s + n);
        for &(pg, from, to) in edges {
            self.read_page_verified(i, &st, pg, &mut page[..], BLOCK as usize)?;
            let a = (from % BLOCK) as usize;
            let n = (to - from) as usize;
            self.read_buffer(blocks, boff + (from - off), &mut page[a..a + n]);
            let b = eb.next().expect("allocated");
            cow.push((pg, b, self.m.write_nt_crc(b * BLOCK, &page[..]) ^ seed));
        }
        for &pg in adopt {
            let b = blocks[bpage(pg)];
            // Checksum the page while the program's stores are still in the cache,
            // then flush them (the commit's fence orders them before the tail).
            self.m.read(b * BLOCK, &mut page[..]);
            cow.push((pg, b, log::page_crc(seed, &page[..])));
            self.m.flush(b * BLOCK, BLOCK);
        }
        crate::ops::keep_spare_page(page);
        cow.sort_unstable_by_key(|c| c.0);
        let size = st.attr.size.max(end);
        let mut entries: SmallVec<[EntryBuf; 2]> = SmallVec::new();
        Self::remove_privs_entries(&st, now, || false, &mut entries);
        crate::ops::cow_entries(seed, &cow, size, now, true, &mut entries);
        self.commit_single(i, &mut st, &mut entries, false, false)
    }
}
