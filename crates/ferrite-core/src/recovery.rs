//! mkfs, mount (clean or after a crash) and clean unmount.
//!
//! Invariants:
//! - A clean unmount writes the checkpoint (used-block and used-inode bitmaps with a
//!   checksummed header carrying a generation), fences, then sets the mount-state
//!   word to `generation << 2 | CLEAN`. Mount trusts the checkpoint only when the
//!   word says clean *and* the header's generation and checksums match; otherwise it
//!   recovers from the logs. Either way mount stores a new, dirty state word and
//!   fences before any operation can run.
//! - Crash recovery: journals first (undo unfinished transactions), then every inode
//!   log is walked in parallel (one worker per core); torn last operations are cut
//!   off, unlinked-but-open inodes freed, and every reachable block claimed exactly
//!   once (a block claimed twice is corruption, reported, never "fixed" silently).

use crate::alloc::{AtomicBitmap, Bitmap, BlockAlloc, InodeAlloc};
use crate::error::{Error, Result};
use crate::fs::{Fs, GcStats, MkfsOptions, MountOptions, MountReport};
use crate::index::{FileType, InodeState};
use crate::journal::{self, JournalOutcome};
use crate::layout::*;
use crate::log::{self, AttrRec, EntryBuf};
use crate::pmem::{persist_u64, Medium};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

fn uuid_now() -> [u8; 16] {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&(t as u64).to_le_bytes());
    let x = crc32c::crc32c(&t.to_le_bytes()) as u64;
    b[8..].copy_from_slice(&((std::process::id() as u64) << 32 | x).to_le_bytes());
    b
}

/// Read and validate the superblock: primary, else replica.
pub fn read_superblock<M: Medium + ?Sized>(m: &M) -> Result<(Superblock, u32)> {
    if m.len() < 2 * BLOCK {
        return Err(Error::Foreign(format!("pool is only {} bytes", m.len())));
    }
    let mut errs = Vec::new();
    for copy in 0..2u32 {
        let mut b = [0u8; SB_SIZE];
        m.read(copy as u64 * BLOCK, &mut b);
        match Superblock::decode(&b) {
            Ok(sb) => {
                if sb.pool_size != m.len() {
                    return Err(Error::corrupt(format!(
                        "pool file is {} bytes but was formatted as {} bytes (truncated or grown)",
                        m.len(),
                        sb.pool_size
                    )));
                }
                return Ok((sb, copy));
            }
            Err(e) => errs.push(e),
        }
    }
    if let Some(i) = errs.iter().position(|e| matches!(e, Error::Version { .. })) {
        return Err(errs.swap_remove(i));
    }
    let foreign = errs.iter().all(|e| matches!(e, Error::Foreign(_)));
    let e = errs.swap_remove(0);
    if foreign {
        Err(e)
    } else {
        Err(Error::corrupt(format!("both superblock copies are damaged: {e}")))
    }
}

/// Convert a pool of format version 1 to 6 to version 7 in place; returns the
/// version it had. Version 2 added a WRITE flag (data checksums); version 3 added
/// page checksums (a WRITE flag), file type codes 4-7 (FIFOs, devices, sockets), a
/// device number in SETATTR's last word and spilled XATTR values; version 4 the
/// SHIFT entry; version 6 the checkpoint's summary of shared blocks, which reads
/// as "none" where an older checkpoint has zero padding; version 7 the in-place
/// append (a WRITE flag); none of which an older pool holds. So an older log reads
/// the same under version 7 rules, torn tails included: the superblock copies get
/// the new version number and nothing else changes. Version 5's metadata replicas are a feature bit the upgraded pool does
/// not get (they need the space its first data blocks hold): such a pool works as
/// before, without second copies. The caller holds the pool exclusively (not
/// mounted).
pub fn upgrade<M: Medium + ?Sized>(m: &M) -> Result<u32> {
    if m.len() < 2 * BLOCK {
        return Err(Error::Foreign(format!("pool is only {} bytes", m.len())));
    }
    let mut copies = Vec::new();
    for copy in 0..2u64 {
        let mut b = [0u8; SB_SIZE];
        m.read(copy * BLOCK, &mut b);
        copies.push((copy, Superblock::decode_any_version(&b)));
    }
    let from = match copies.iter().find_map(|(_, r)| r.as_ref().ok()) {
        Some(sb) => sb.version,
        None => return read_superblock(m).map(|_| VERSION),
    };
    match from {
        VERSION => return Ok(VERSION),
        // Version 1 to 6 logs read the same under version 7 rules (version 1 and 2
        // WRITE entries carry no page checksums: reads and scrub cannot check those
        // pages; version 4 added the SHIFT entry, version 7 the in-place append,
        // which older logs do not hold).
        1..=6 => {}
        v => return Err(Error::Version { found: v, supported: VERSION }),
    }
    for (copy, r) in &copies {
        // A damaged copy is left for the next mount to repair from the good one.
        if let Ok(sb) = r {
            let new = Superblock { version: VERSION, ..*sb };
            crate::pmem::persist_copy(m, copy * BLOCK, &new.encode());
        }
    }
    m.fence();
    Ok(from)
}

impl<M: Medium> Fs<M> {
    /// Format `m` and mount it.
    pub fn mkfs(m: M, opts: &MkfsOptions) -> Result<Fs<M>> {
        let len = m.len();
        if len < MIN_POOL {
            return Err(Error::invalid(format!("pool must be at least {MIN_POOL} bytes")));
        }
        let nblocks = len / BLOCK;
        let nshards = opts.shards.clamp(1, 1024);
        let mut ninodes = if opts.inodes == 0 { (len / 8192).max(64) } else { opts.inodes };
        ninodes = ninodes.div_ceil(nshards as u64) * nshards as u64;
        let geo = Geometry::compute_with(nblocks, nshards, ninodes, opts.replicas)?;
        let uuid = opts.uuid.unwrap_or_else(uuid_now);
        let now = m.now();
        let sb = Superblock {
            magic: MAGIC,
            version: VERSION,
            block_size: BLOCK as u32,
            uuid,
            pool_size: nblocks * BLOCK,
            nblocks,
            nshards,
            inode_size: INODE_SLOT as u32,
            ninodes,
            journal_start: geo.journal_start,
            journal_blocks: geo.journal_blocks,
            itable_start: geo.itable_start,
            itable_blocks: geo.itable_blocks,
            ckpt_start: geo.ckpt_start,
            ckpt_blocks: geo.ckpt_blocks,
            data_start: geo.data_start,
            root_ino: ROOT_INO,
            mkfs_time_ns: now.sec as u64 * 1_000_000_000 + now.nsec as u64,
            features: if opts.replicas { FEATURE_REPLICAS } else { 0 },
            reserved: [0; 108],
            csum: 0,
        };
        if sb.pool_size != len {
            return Err(Error::invalid("pool size must be a multiple of 4096"));
        }
        // Invalidate any earlier superblock first, then clear all metadata.
        m.zero_nt(0, 2 * BLOCK);
        m.fence();
        m.zero_nt(geo.journal_start * BLOCK, (geo.data_start - geo.journal_start) * BLOCK);
        crate::replica::format_table(&m, &geo);
        // Root directory: first data block is its log.
        let root_page = geo.data_start * BLOCK;
        let seed = log::seed(&uuid, ROOT_INO, 1);
        let attr = AttrRec {
            mode: FileType::Directory.mode_bits() | 0o755,
            uid: opts.root_uid,
            gid: opts.root_gid,
            nlink: 2,
            size: 0,
            parent: ROOT_INO,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
        };
        let mut entries = vec![EntryBuf::setattr(&attr, false)];
        let mut none = || Err(Error::NoSpace);
        let a = log::write_fresh(
            &m,
            0,
            1,
            root_page,
            seed,
            &mut entries,
            &mut none,
            &mut log::Pages::new(),
        )?;
        let slot = InodeSlot {
            state: 1,
            head: logptr::make(0, root_page),
            tail: a.new_tail,
            ftype: FileType::Directory.code() as u32,
            ..Default::default()
        };
        let so = geo.slot_off(ROOT_INO);
        m.write(so, &slot.encode());
        m.flush(so, INODE_SLOT);
        crate::replica::sync_slot(&m, &geo, ROOT_INO);
        persist_u64(&m, MOUNT_STATE_OFF, 0);
        m.fence();
        let enc = sb.encode();
        m.write(BLOCK, &enc);
        m.flush(BLOCK, SB_SIZE as u64);
        m.write(0, &enc);
        m.flush(0, SB_SIZE as u64);
        m.fence();
        Fs::mount(m, &MountOptions::default())
    }

    /// Mount a formatted pool: from its checkpoint when it was cleanly unmounted,
    /// else by crash recovery.
    pub fn mount(m: M, opts: &MountOptions) -> Result<Fs<M>> {
        let t0 = Instant::now();
        let (sb, copy) = read_superblock(&m)?;
        let geo = sb.geometry();
        let state = m.load_u64(MOUNT_STATE_OFF);
        let generation = state >> 2;
        let mut report = MountReport { superblock_copy: copy, ..Default::default() };
        let ckpt =
            if state & STATE_CLEAN != 0 { load_checkpoint(&m, &geo, generation) } else { None };
        let (used_blocks, used_inodes, refs) = match ckpt {
            Some(((blocks, inodes, shared), copy)) => {
                report.clean = true;
                report.checkpoint_copy = copy;
                // Shared blocks are counted from the logs, never stored: walk them
                // (read only) and compare with the summary the unmount recorded.
                let refs = if shared == CkptShared::default() {
                    Vec::new()
                } else {
                    let mut r = MountReport::default();
                    let s = scan_all(&m, &sb, &geo, opts, &mut r, false, true)?;
                    report.refs_counted = true;
                    let got = crate::refs::summary(&s.refs);
                    if (got.blocks, got.extra, got.list_crc)
                        != (shared.blocks, shared.extra, shared.list_crc)
                    {
                        report.refs_mismatch = Some(format!(
                            "the logs share {} blocks ({} extra references), the checkpoint \
                             recorded {} ({})",
                            got.blocks, got.extra, shared.blocks, shared.extra
                        ));
                    }
                    s.refs
                };
                (blocks, inodes, refs)
            }
            None => {
                let clean_word = state & STATE_CLEAN != 0;
                // Read-only mounts never write; recover in DRAM view only.
                let s = scan_all(&m, &sb, &geo, opts, &mut report, !opts.read_only, clean_word)?;
                report.refs_counted = true;
                (s.blocks, s.inodes, s.refs)
            }
        };
        report.shared_blocks = refs.len() as u64;
        let txids = (0..geo.nshards)
            .map(|s| crate::locks::StepMutex::new(journal::read(&m, &geo, s).0))
            .collect();
        if !opts.read_only {
            repair_superblock_copies(&m, &sb);
            persist_u64(&m, MOUNT_STATE_OFF, (generation + 1) << 2);
            m.fence();
        }
        let verified = crate::verify::Verified::new(geo.nblocks);
        let fs = Fs {
            balloc: BlockAlloc::from_used(&geo, &used_blocks),
            ialloc: InodeAlloc::from_used(&geo, &used_inodes),
            m,
            sb,
            geo,
            cache: Fs::<M>::new_cache(),
            txids,
            marks: crate::journal::LazyMarks::new(geo.nshards),
            rename_lock: crate::locks::StepMutex::new(()),
            read_only: opts.read_only,
            fault: opts.fault,
            generation: generation + 1,
            report,
            unmounted: AtomicBool::new(false),
            gc_stats: GcStats::default(),
            share: None,
            grant_size: AtomicU64::new(0),
            populated: None,
            leases: Default::default(),
            poisoned: Default::default(),
            atime: std::sync::atomic::AtomicU8::new(opts.atime.code()),
            time_floor: Default::default(),
            id: crate::fs::next_fs_id(),
            inode_frees: AtomicU64::new(0),
            verify: opts.verify,
            verified,
            atomics: Default::default(),
            pbufs: Default::default(),
            topo: crate::numa::Topology::detect(),
            refs: Default::default(),
        };
        fs.group_shards();
        let root = match fs.inode(ROOT_INO) {
            Ok(r) => r,
            // A checkpoint can say the root is in use while its slot says free.
            Err(Error::NotFound) => return Err(Error::corrupt("root inode slot is not in use")),
            Err(e) => return Err(e),
        };
        if root.st.read().ftype != FileType::Directory {
            return Err(Error::corrupt("root inode is not a directory"));
        }
        drop(root);
        fs.load_refs(&refs);
        let mut fs = fs;
        fs.report.micros = t0.elapsed().as_micros() as u64;
        Ok(fs)
    }

    /// Clean unmount: free unlinked-but-open inodes, checkpoint the allocators,
    /// mark the pool clean. Returns the medium.
    pub fn unmount(self) -> Result<M> {
        if self.read_only {
            self.unmounted.store(true, Ordering::Release);
            return Ok(self.into_medium());
        }
        // Buffers are free space: the saved free map must say so.
        self.pbuf_free_all();
        self.unmounted.store(true, Ordering::Release);
        for i in self.cached_inodes() {
            self.persist_atime_best_effort(&i);
            let mut st = i.st.write();
            if st.attr.nlink == 0 && !st.log.pages.is_empty() {
                self.free_inode_now(&i, &mut st);
            }
        }
        // Every replica equal to its slot before the pool is marked clean (commits
        // leave replica tails behind); persisted by the checkpoint's fence.
        for ino in 1..=self.geo.ninodes {
            crate::replica::resync_slot(&self.m, &self.geo, ino);
        }
        // No journal stays active on media past a clean unmount: a clean mount does
        // not recover journals, and the next crash would find it.
        self.fence_settled();
        let blocks = self.balloc.used_bitmap();
        let inodes = self.ialloc.used_bitmap();
        let shared = crate::refs::summary(&self.shared_blocks());
        write_checkpoint(&self.m, &self.geo, self.generation, &blocks, &inodes, &shared);
        persist_u64(&self.m, MOUNT_STATE_OFF, (self.generation << 2) | STATE_CLEAN);
        self.m.fence();
        Ok(self.into_medium())
    }

    /// Drop without a clean unmount (what a crash of the process leaves).
    pub fn crash(self) -> M {
        self.into_medium()
    }

    fn into_medium(self) -> M {
        let Fs { m, .. } = self;
        m
    }
}

/// Rewrite a superblock copy that does not match the one in use (flushed; the
/// caller fences). mkfs writes both copies in its last fence window, so a crash there
/// can leave one copy unwritten; without this, fsck of such a pool reports the damaged
/// copy forever.
fn repair_superblock_copies<M: Medium + ?Sized>(m: &M, sb: &Superblock) {
    let enc = sb.encode();
    for copy in 0..2u64 {
        let mut b = [0u8; SB_SIZE];
        m.read(copy * BLOCK, &mut b);
        if Superblock::decode(&b).ok().as_ref() != Some(sb) {
            m.write(copy * BLOCK, &enc);
            m.flush(copy * BLOCK, SB_SIZE as u64);
        }
    }
}

/// Offsets of the checkpoint copy starting at block `start`: (block bitmap,
/// inode bitmap, inode bitmap bytes).
fn bitmaps_bytes(geo: &Geometry, start: u64) -> (u64, u64, u64) {
    let base = (start + 1) * BLOCK;
    let blen = geo.nblocks.div_ceil(8);
    let ioff = base + blen.div_ceil(BLOCK) * BLOCK;
    (base, ioff, geo.ninodes.div_ceil(8))
}

/// Write the checkpoint: bitmaps, then header, into every copy; one fence.
fn write_checkpoint<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    gen: u64,
    blocks: &Bitmap,
    inodes: &Bitmap,
    shared: &CkptShared,
) {
    let bb = blocks.to_bytes();
    let ib = inodes.to_bytes();
    let mut c = crc32c::crc32c(&bb);
    c = crc32c::crc32c_append(c, &ib);
    let h = CkptHeader {
        magic: CKPT_MAGIC,
        generation: gen,
        nblocks: geo.nblocks,
        ninodes: geo.ninodes,
        used_blocks: blocks.count(),
        used_inodes: inodes.count(),
        bitmap_csum: c,
        csum: 0,
    };
    // Whole blocks: the bytes past each bitmap's last bit and past the header
    // are rewritten as zero too, so a clean unmount leaves no stale damage.
    let whole = |v: &[u8]| {
        let mut b = v.to_vec();
        b.resize(v.len().div_ceil(BLOCK as usize).max(1) * BLOCK as usize, 0);
        b
    };
    let mut hb = whole(&h.encode());
    hb[CKPT_SHARED_OFF..CKPT_SHARED_OFF + 24].copy_from_slice(&shared.encode());
    let (bb, ib) = (whole(&bb), whole(&ib));
    for start in geo.ckpt_starts().into_iter().flatten() {
        let (boff, ioff, _) = bitmaps_bytes(geo, start);
        m.write_nt(boff, &bb);
        m.write_nt(ioff, &ib);
        m.write_nt(start * BLOCK, &hb);
    }
    m.fence();
}

/// Why the checkpoint copy at block `start` of generation `gen` would not be
/// used by a clean mount (`Err`), checked as `load_checkpoint` does, plus the
/// padding bits past the bitmaps' last bit and the header block's padding.
pub(crate) fn checkpoint_ok<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    start: u64,
    gen: u64,
) -> std::result::Result<(), String> {
    let mut hb = [0u8; 56];
    m.read(start * BLOCK, &mut hb);
    let Some(h) = CkptHeader::decode(&hb) else {
        return Err("header magic or checksum is wrong".into());
    };
    if h.generation != gen || h.nblocks != geo.nblocks || h.ninodes != geo.ninodes {
        return Err(format!(
            "header is of generation {} ({} blocks, {} inodes), the pool of {gen}",
            h.generation, h.nblocks, h.ninodes
        ));
    }
    if load_copy(m, geo, start, gen).is_none() {
        return Err("bitmaps do not match their checksum or miss metadata blocks".into());
    }
    let (boff, ioff, ilen) = bitmaps_bytes(geo, start);
    for (off, bits, len) in
        [(boff, geo.nblocks, geo.nblocks.div_ceil(8)), (ioff, geo.ninodes, ilen)]
    {
        // Bits past the last block or inode, and the rest of their last block.
        let end = (off + len).div_ceil(BLOCK) * BLOCK;
        let mut tail = vec![0u8; (end - (off + len) + 1) as usize];
        m.read(off + len - 1, &mut tail);
        let spare = if bits % 8 == 0 { 0 } else { 0xffu8 << (bits % 8) };
        if tail[0] & spare != 0 || tail[1..].iter().any(|&x| x != 0) {
            return Err("bits past the last block or inode are set".into());
        }
    }
    let mut blk = vec![0u8; BLOCK as usize];
    m.read(start * BLOCK, &mut blk);
    let summary = CKPT_SHARED_OFF..CKPT_SHARED_OFF + 24;
    if blk[56..summary.start].iter().chain(&blk[summary.end..]).any(|&x| x != 0) {
        return Err("header block padding is not zero".into());
    }
    if CkptShared::decode(&blk[summary]).is_none() {
        return Err("summary of shared blocks does not match its checksum".into());
    }
    Ok(())
}

/// The checkpoint of generation `gen`: the first copy that validates, and which
/// copy it was.
fn load_checkpoint<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    gen: u64,
) -> Option<((Bitmap, Bitmap, CkptShared), u32)> {
    let starts = geo.ckpt_starts();
    starts
        .iter()
        .enumerate()
        .find_map(|(k, s)| s.and_then(|s| load_copy(m, geo, s, gen)).map(|c| (c, k as u32)))
}

fn load_copy<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    start: u64,
    gen: u64,
) -> Option<(Bitmap, Bitmap, CkptShared)> {
    let mut hb = [0u8; CKPT_SHARED_OFF + 24];
    m.read(start * BLOCK, &mut hb);
    let h = CkptHeader::decode(&hb)?;
    let shared = CkptShared::decode(&hb[CKPT_SHARED_OFF..])?;
    if h.generation != gen || h.nblocks != geo.nblocks || h.ninodes != geo.ninodes {
        return None;
    }
    let (boff, ioff, ilen) = bitmaps_bytes(geo, start);
    let mut bb = vec![0u8; geo.nblocks.div_ceil(8) as usize];
    let mut ib = vec![0u8; ilen as usize];
    m.read(boff, &mut bb);
    m.read(ioff, &mut ib);
    let c = crc32c::crc32c_append(crc32c::crc32c(&bb), &ib);
    if c != h.bitmap_csum {
        return None;
    }
    let blocks = Bitmap::from_bytes(geo.nblocks, &bb);
    let inodes = Bitmap::from_bytes(geo.ninodes, &ib);
    // Metadata blocks must be marked used, the root in use.
    if (0..geo.data_start).any(|b| !blocks.get(b)) || !inodes.get(ROOT_INO - 1) {
        return None;
    }
    Some((blocks, inodes, shared))
}

/// Walk every in-use inode's log; repair torn tails and orphans when `repair`.
fn scan_all<M: Medium>(
    m: &M,
    sb: &Superblock,
    geo: &Geometry,
    opts: &MountOptions,
    report: &mut MountReport,
    repair: bool,
    clean_word: bool,
) -> Result<Scanned> {
    if repair {
        for s in 0..geo.nshards {
            if journal::recover(m, geo, s)? == JournalOutcome::RolledBack {
                report.journals_rolled_back += 1;
            }
        }
        m.fence();
    }
    let blocks = AtomicBitmap::new(geo.nblocks);
    for b in 0..geo.data_start {
        blocks.claim(b);
    }
    let inodes = AtomicBitmap::new(geo.ninodes);
    let logs = AtomicBitmap::new(geo.nblocks);
    let extra: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let claims = Claims { blocks: &blocks, logs: &logs, extra: &extra };
    let workers = if opts.workers > 0 {
        opts.workers
    } else {
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
    }
    .min(geo.ninodes as usize)
    .max(1);
    let next = AtomicU64::new(1);
    let torn = AtomicU32::new(0);
    let orphans = AtomicU32::new(0);
    let scanned = AtomicU64::new(0);
    let err: Mutex<Option<Error>> = Mutex::new(None);
    const CHUNK: u64 = 256;
    std::thread::scope(|sc| {
        for _ in 0..workers {
            sc.spawn(|| loop {
                if err.lock().is_some() {
                    return;
                }
                let start = next.fetch_add(CHUNK, Ordering::Relaxed);
                if start > geo.ninodes {
                    return;
                }
                for ino in start..(start + CHUNK).min(geo.ninodes + 1) {
                    let r = scan_one(m, sb, geo, ino, repair, clean_word, &claims);
                    if repair && r.is_ok() {
                        // After a crash a replica may be a step ahead of or behind
                        // its primary, which recovery has just settled.
                        crate::replica::resync_slot(m, geo, ino);
                    }
                    match r {
                        Ok(Scan::Free) => {}
                        Ok(Scan::Live { torn: t }) => {
                            inodes.claim(ino - 1);
                            scanned.fetch_add(1, Ordering::Relaxed);
                            torn.fetch_add(t as u32, Ordering::Relaxed);
                        }
                        Ok(Scan::Orphan) => {
                            orphans.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            *err.lock() = Some(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = err.into_inner() {
        return Err(e);
    }
    if repair {
        m.fence();
    }
    report.torn_logs = torn.into_inner();
    report.orphans_freed = orphans.into_inner();
    report.inodes_scanned = scanned.into_inner();
    let inodes = inodes.into_bitmap();
    if !inodes.get(ROOT_INO - 1) {
        return Err(Error::corrupt("root inode is not in use"));
    }
    let refs = crate::refs::tally(extra.into_inner());
    // A block mapped as data twice is shared (a clone); a log page is never data.
    if let Some(&(b, _)) = refs.iter().find(|&&(b, _)| logs.get(b)) {
        return Err(Error::corrupt(format!("data block {b} is also a log page")));
    }
    Ok(Scanned { blocks: blocks.into_bitmap(), inodes, refs })
}

/// What a walk of every log found.
struct Scanned {
    blocks: Bitmap,
    inodes: Bitmap,
    /// Shared data blocks: (block, extra references), ascending.
    refs: Vec<(u64, u32)>,
}

/// The claims of a walk: every block, the log pages, the extra references.
struct Claims<'a> {
    blocks: &'a AtomicBitmap,
    logs: &'a AtomicBitmap,
    extra: &'a Mutex<Vec<u64>>,
}

enum Scan {
    Free,
    Live { torn: bool },
    Orphan,
}

fn scan_one<M: Medium>(
    m: &M,
    sb: &Superblock,
    geo: &Geometry,
    ino: u64,
    repair: bool,
    clean_word: bool,
    claims: &Claims<'_>,
) -> Result<Scan> {
    let blocks = claims.blocks;
    let so = geo.slot_off(ino);
    if repair {
        // Cleanly unmounted, every replica equals its primary's image; after a
        // crash (journals recovered) they can be one single-word step apart. A
        // valid replica further away means a damaged primary.
        if let Some(r) = crate::replica::valid_replica_differs(m, geo, ino) {
            let p = crate::replica::read_primary(m, geo, ino);
            if clean_word || !crate::replica::crash_consistent(&p, &r) {
                restore_from_replica(m, sb, geo, ino, &p, &r, clean_word);
            }
        }
    }
    let loaded = match load_slot(m, sb, geo, ino, clean_word) {
        // A primary slot that does not lead to a valid log while its replica is
        // valid and says otherwise is damage: the replica holds the slot as it was
        // last made durable (after a crash, possibly without the last operation).
        Err(e) if repair => match crate::replica::valid_replica_differs(m, geo, ino) {
            Some(r) => {
                let p = crate::replica::read_primary(m, geo, ino);
                restore_from_replica(m, sb, geo, ino, &p, &r, clean_word);
                load_slot(m, sb, geo, ino, clean_word).map_err(|e2| {
                    Error::corrupt(format!("{e}; its replica does not validate either: {e2}"))
                })?
            }
            None => return Err(e),
        },
        r => r?,
    };
    let Some((slot, st, w)) = loaded else {
        // A create torn before its journal's fence can leave the new head, tail
        // and type in a slot whose state never left zero: cleared.
        let p = crate::replica::read_primary(m, geo, ino);
        if repair && p[..8] == [0; 8] && p[8..].iter().any(|&b| b != 0) {
            m.write(so, &[0u8; INODE_SLOT as usize]);
            m.flush(so, INODE_SLOT);
        }
        return Ok(Scan::Free);
    };
    if w.torn && repair {
        persist_u64(m, so + SLOT_TAIL, logptr::make(logptr::epoch(slot.tail), w.end));
    }
    if let (Some(t), true) = (w.last_tail, repair) {
        // An in-place append that never committed may have left bytes past the
        // end of the last one's block.
        log::clear_past_tail(m, t);
    }
    if st.attr.nlink == 0 && ino != ROOT_INO && repair {
        persist_u64(m, so + SLOT_STATE, slot.state + 1);
        return Ok(Scan::Orphan);
    }
    for &p in &w.pages {
        claims.logs.claim(p / BLOCK);
        if !blocks.claim(p / BLOCK) {
            return Err(Error::corrupt(format!(
                "inode {ino}: log page {} is owned twice",
                p / BLOCK
            )));
        }
    }
    let mut again = Vec::new();
    for (start, n) in st.data_runs() {
        if n == 0 {
            continue;
        }
        // The data area is one contiguous range: checking the ends checks the run.
        let last = start.checked_add(n - 1).filter(|&l| geo.is_data_block(l));
        if !geo.is_data_block(start) || last.is_none() {
            let bad = if geo.is_data_block(start) { geo.nblocks.max(start) } else { start };
            return Err(Error::corrupt(format!("inode {ino}: data block {bad} outside the pool")));
        }
        again.clear();
        blocks.claim_range_counting(start, n, &mut again);
        if !again.is_empty() {
            claims.extra.lock().extend_from_slice(&again);
        }
    }
    Ok(Scan::Live { torn: w.torn })
}

/// Restore inode `ino`'s damaged slot `primary` from its valid `replica`
/// (flushed; the caller fences). On a cleanly unmounted pool the replica is the
/// slot. After a crash its tail may be behind: the primary's tail is kept if the
/// log walks to it from the replica's head, else the tail is left where the log's
/// valid entries end, walking on from the replica's (the scan then cuts it to
/// the last complete operation whose data checks out).
fn restore_from_replica<M: Medium>(
    m: &M,
    sb: &Superblock,
    geo: &Geometry,
    ino: u64,
    primary: &[u8; 64],
    replica: &[u8; 64],
    clean_word: bool,
) {
    crate::replica::restore_primary(m, geo, ino, replica);
    let r = InodeSlot::decode(replica);
    if clean_word || !r.in_use() {
        return;
    }
    let tail_off = geo.slot_off(ino) + SLOT_TAIL;
    let p_tail = InodeSlot::decode(primary).tail;
    if p_tail != r.tail && logptr::epoch(p_tail) == logptr::epoch(r.tail) {
        persist_u64(m, tail_off, p_tail);
        if matches!(load_slot(m, sb, geo, ino, false), Ok(Some((_, _, w))) if !w.torn) {
            return;
        }
    }
    // A tail the walk never meets (no entry ends at a page's last word): the walk
    // stops where the valid entries do.
    let page = logptr::addr(r.tail) & !(BLOCK - 1);
    persist_u64(m, tail_off, logptr::make(logptr::epoch(r.tail), page + log::LOG_DATA_END));
}

/// Read inode `ino`'s slot and walk its log: `None` for a free slot.
fn load_slot<M: Medium>(
    m: &M,
    sb: &Superblock,
    geo: &Geometry,
    ino: u64,
    clean_word: bool,
) -> Result<Option<(InodeSlot, InodeState, log::Walk)>> {
    let mut b = [0u8; 64];
    m.read(geo.slot_off(ino), &mut b);
    let slot = InodeSlot::decode(&b);
    if !slot.in_use() {
        return Ok(None);
    }
    let ftype = FileType::from_code(slot.ftype)
        .ok_or_else(|| Error::corrupt(format!("inode {ino} has unknown type {}", slot.ftype)))?;
    let seed = log::seed(&sb.uuid, ino, slot.state);
    let mut st = InodeState::new(ftype);
    let mut freed = crate::index::Freed::new();
    let (head, tail) = (logptr::addr(slot.head), logptr::addr(slot.tail));
    let w = log::walk_apply_checking(m, geo, seed, head, tail, true, &mut |loc, e| {
        st.apply(loc, &e, &mut freed)
    })
    .map_err(|e| Error::corrupt(format!("inode {ino}: {e}")))?;
    if st.setattr_loc.is_none() {
        return Err(Error::corrupt(format!("inode {ino} has no attributes in its log")));
    }
    // A cleanly unmounted pool has no torn operation: an entry that does not
    // validate before the tail (or a last operation whose data does not match) is
    // damage, and cutting the log would drop committed operations silently. (Its
    // checkpoint was not usable, or the pool would not be scanned.)
    if w.torn && clean_word {
        return Err(Error::corrupt(format!(
            "inode {ino}: its log does not validate up to its tail on a cleanly unmounted pool \
             (damage, not a torn write; nothing was cut)"
        )));
    }
    Ok(Some((slot, st, w)))
}
