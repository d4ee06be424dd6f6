//! Integrity checks beyond the invariants `fsck` proves on a mounted pool: every
//! checksum and every byte the format says is zero, read from media (`ferrite
//! fsck`, `ferrite scrub`; docs/INTEGRITY.md).
//!
//! Invariants:
//! - [`check_raw`] reads an unmounted pool and writes nothing; it is what a
//!   mount would silently work around (a damaged superblock copy, a checkpoint
//!   that no longer checksums, garbled journal words, non-zero padding).
//! - [`Fs::check_data`] reads every data page a file maps and compares it with
//!   the page checksum of its WRITE entry, naming the file by path and range.
//! - Nothing read from media panics here: lengths are bounded by the geometry of
//!   a validated superblock, and damage is a [`Finding`].

use crate::error::Result;
use crate::fs::Fs;
use crate::index::{Body, FileType};
use crate::layout::{
    replica_of, replica_valid, CkptHeader, Geometry, InodeSlot, Superblock, BLOCK, INODE_SLOT,
    MOUNT_STATE_OFF, ROOT_INO, SB_SIZE, STATE_CLEAN,
};
use crate::pmem::Medium;
use std::collections::HashMap;

/// Which part of the pool a finding is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Region {
    /// A superblock copy.
    Superblock,
    /// Bytes of blocks 0 and 1 outside the superblocks and the mount-state word.
    Padding,
    /// The mount-state word against the checkpoint.
    MountState,
    /// A shard's journal.
    Journal,
    /// The allocator checkpoint.
    Checkpoint,
    /// An inode slot.
    InodeSlot,
    /// A log (entries, pointers, pages).
    Log,
    /// File data.
    Data,
    /// The tree (names, link counts, reachability) or allocator agreement.
    Tree,
}

impl Region {
    /// The name used in reports (as in JSON).
    pub fn name(self) -> &'static str {
        match self {
            Region::Superblock => "superblock",
            Region::Padding => "padding",
            Region::MountState => "mount-state",
            Region::Journal => "journal",
            Region::Checkpoint => "checkpoint",
            Region::InodeSlot => "inode-slot",
            Region::Log => "log",
            Region::Data => "data",
            Region::Tree => "tree",
        }
    }
}

/// One thing found wrong.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Finding {
    /// Region.
    pub region: Region,
    /// What is wrong.
    pub what: String,
    /// Inode concerned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ino: Option<u64>,
    /// Its path, when reachable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Damaged byte range of the file, `[start, end)`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<(u64, u64)>,
    /// A repair can fix it (a second copy exists, or it can be rebuilt).
    pub repairable: bool,
}

impl Finding {
    fn new(region: Region, what: impl Into<String>, repairable: bool) -> Finding {
        Finding { region, what: what.into(), ino: None, path: None, range: None, repairable }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ", self.region.name())?;
        if let Some(p) = &self.path {
            write!(f, "{p}: ")?;
        } else if let Some(i) = self.ino {
            write!(f, "inode {i}: ")?;
        }
        write!(f, "{}", self.what)?;
        if let Some((a, b)) = self.range {
            write!(f, " (bytes {a}..{b})")?;
        }
        Ok(())
    }
}

/// Is `b` all zero?
fn zero(b: &[u8]) -> bool {
    b.iter().all(|&x| x == 0)
}

/// Check an unmounted pool's fixed regions (see the module comment). Returns the
/// superblock in use (if any copy is valid) and the findings.
pub fn check_raw<M: Medium + ?Sized>(m: &M) -> (Option<Superblock>, Vec<Finding>) {
    let mut out = Vec::new();
    if m.len() < 2 * BLOCK {
        out.push(Finding::new(Region::Superblock, "pool is shorter than two blocks", false));
        return (None, out);
    }
    let mut copies = Vec::new();
    for copy in 0..2u64 {
        let mut b = [0u8; SB_SIZE];
        m.read(copy * BLOCK, &mut b);
        copies.push(Superblock::decode(&b));
    }
    let sb = match (&copies[0], &copies[1]) {
        (Ok(a), Ok(b)) => {
            if a != b {
                out.push(Finding::new(
                    Region::Superblock,
                    "copy 1 differs from copy 0 (stale)",
                    true,
                ));
            }
            *a
        }
        (Ok(a), Err(e)) | (Err(e), Ok(a)) => {
            let which = if copies[0].is_err() { 0 } else { 1 };
            out.push(Finding::new(
                Region::Superblock,
                format!("copy {which} is damaged: {e}"),
                true,
            ));
            *a
        }
        (Err(e), Err(_)) => {
            out.push(Finding::new(Region::Superblock, format!("both copies damaged: {e}"), false));
            return (None, out);
        }
    };
    if sb.pool_size != m.len() {
        out.push(Finding::new(
            Region::Superblock,
            format!("pool file is {} bytes, formatted as {}", m.len(), sb.pool_size),
            false,
        ));
        return (Some(sb), out);
    }
    let geo = sb.geometry();
    // Padding of blocks 0 and 1.
    let mut blk = vec![0u8; BLOCK as usize];
    m.read(0, &mut blk);
    let ms = MOUNT_STATE_OFF as usize;
    if !zero(&blk[SB_SIZE..ms]) || !zero(&blk[ms + 8..]) {
        out.push(Finding::new(Region::Padding, "block 0 has non-zero padding", true));
    }
    m.read(BLOCK, &mut blk);
    if !zero(&blk[SB_SIZE..]) {
        out.push(Finding::new(Region::Padding, "block 1 has non-zero padding", true));
    }
    let state = m.load_u64(MOUNT_STATE_OFF);
    let clean = state & STATE_CLEAN != 0;
    let gen = state >> 2;
    if state & 2 != 0 {
        out.push(Finding::new(Region::MountState, format!("reserved bit set ({state:#x})"), true));
    }
    // Journals.
    for s in 0..geo.nshards {
        if let Some(w) = crate::journal::check(m, &geo, s, !clean) {
            let mut f = Finding::new(Region::Journal, format!("shard {s}: {w}"), true);
            // An active transaction on a clean pool may hold words to undo, unless
            // the other copy shows it idle.
            f.repairable = crate::journal::repairable(m, &geo, s);
            out.push(f);
        }
    }
    // The journal blocks past the last shard's journal, in each copy.
    for (k, start) in geo.journal_starts().into_iter().enumerate() {
        let Some(start) = start else { continue };
        let jend = (start + geo.journal_blocks) * BLOCK;
        let mut at = start * BLOCK + geo.nshards as u64 * crate::layout::JOURNAL_SIZE;
        while at < jend {
            let n = (jend - at).min(BLOCK);
            m.read(at, &mut blk[..n as usize]);
            if !zero(&blk[..n as usize]) {
                let what = format!("bytes past the last journal of copy {k}");
                out.push(Finding::new(Region::Journal, what, true));
                break;
            }
            at += n;
        }
    }
    // Checkpoint copies: valid, and of this generation, on a clean pool.
    let starts = geo.ckpt_starts();
    let copies = starts.iter().flatten().count();
    for (k, start) in starts.into_iter().enumerate() {
        let Some(start) = start else { continue };
        let name = |w: String| if copies > 1 { format!("copy {k}: {w}") } else { w };
        let mut hb = [0u8; 56];
        m.read(start * BLOCK, &mut hb);
        if clean {
            if let Err(w) = crate::recovery::checkpoint_ok(m, &geo, start, gen) {
                out.push(Finding::new(Region::Checkpoint, name(w), true));
            }
        } else if let Some(h) = CkptHeader::decode(&hb) {
            // A generation is dirty from its mount on; its checkpoint is written
            // only at its clean unmount, so it cannot be as new as a dirty word.
            if h.generation >= gen && gen > 0 {
                out.push(Finding::new(
                    Region::MountState,
                    name(format!(
                        "mount state says generation {gen} is running, but the checkpoint is \
                         of generation {}",
                        h.generation
                    )),
                    true,
                ));
            }
        }
    }
    // Inode slots.
    check_slots(m, &geo, &mut out);
    check_slot_replicas(m, &geo, clean, &mut out);
    (Some(sb), out)
}

/// The replica inode table: every replica slot well formed, equal to its
/// primary's image on a cleanly unmounted pool (after a crash recovery settles
/// them), and zero past the last slot.
fn check_slot_replicas<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    clean: bool,
    out: &mut Vec<Finding>,
) {
    let Some(start) = geo.ritable_start() else { return };
    let (mut p, mut r) = (vec![0u8; BLOCK as usize], vec![0u8; BLOCK as usize]);
    let per = BLOCK / INODE_SLOT;
    for blk in 0..geo.itable_blocks {
        m.read((geo.itable_start + blk) * BLOCK, &mut p);
        m.read((start + blk) * BLOCK, &mut r);
        for k in 0..per as usize {
            let ino = blk * per + k as u64 + 1;
            let rs = &r[k * 64..(k + 1) * 64];
            if ino > geo.ninodes {
                if !zero(rs) {
                    let mut f =
                        Finding::new(Region::Padding, "bytes after the last replica slot", true);
                    f.ino = Some(ino);
                    out.push(f);
                }
                continue;
            }
            let what = if !replica_valid(rs) {
                "its replica is damaged (checksum or padding)"
            } else if clean && replica_of(&p[k * 64..(k + 1) * 64])[..] != *rs {
                "the slot differs from its replica"
            } else {
                continue;
            };
            let mut f = Finding::new(Region::InodeSlot, what, true);
            f.ino = Some(ino);
            out.push(f);
        }
    }
}

/// Repair the inode table from its replica on a cleanly unmounted pool, before
/// it is mounted (`ferrite fsck`, not `-n`): a slot that differs from its valid
/// replica is damage and is restored from it, and a damaged replica is rewritten
/// from its slot. Other pools are left to the mount, whose recovery settles
/// replicas itself. Returns what was done.
pub fn repair_replicas_raw<M: Medium + ?Sized>(m: &M) -> Vec<String> {
    let mut done = Vec::new();
    let Ok((sb, _)) = crate::recovery::read_superblock(m) else { return done };
    let geo = sb.geometry();
    if !geo.replicas || m.load_u64(MOUNT_STATE_OFF) & STATE_CLEAN == 0 {
        return done;
    }
    for ino in 1..=geo.ninodes {
        if let Some(r) = crate::replica::valid_replica_differs(m, &geo, ino) {
            crate::replica::restore_primary(m, &geo, ino, &r);
            done.push(format!("inode {ino}: slot restored from its replica"));
        } else if crate::replica::resync_slot(m, &geo, ino) {
            done.push(format!("inode {ino}: replica rewritten from the slot"));
        }
    }
    let start = geo.ritable_start().expect("replicas");
    let from = start * BLOCK + geo.ninodes * INODE_SLOT;
    let end = (start + geo.itable_blocks) * BLOCK;
    let mut b = vec![0u8; (end - from) as usize];
    m.read(from, &mut b);
    if !zero(&b) {
        crate::pmem::persist_copy(m, from, &vec![0u8; b.len()]);
        done.push("bytes after the last replica slot zeroed".into());
    }
    m.fence();
    done
}

fn check_slots<M: Medium + ?Sized>(m: &M, geo: &Geometry, out: &mut Vec<Finding>) {
    let mut b = vec![0u8; BLOCK as usize];
    let per = (BLOCK / INODE_SLOT) as usize;
    for blk in 0..geo.itable_blocks {
        m.read((geo.itable_start + blk) * BLOCK, &mut b);
        for k in 0..per {
            let ino = blk * per as u64 + k as u64 + 1;
            let raw = &b[k * INODE_SLOT as usize..(k + 1) * INODE_SLOT as usize];
            if ino > geo.ninodes {
                if !zero(raw) {
                    let mut f = Finding::new(Region::Padding, "bytes after the last slot", true);
                    f.ino = Some(ino);
                    out.push(f);
                }
                continue;
            }
            let s = InodeSlot::decode(raw);
            let bad = |what: &str| {
                let mut f = Finding::new(Region::InodeSlot, what.to_string(), false);
                f.ino = Some(ino);
                f
            };
            if s.pad != 0 || s.reserved != [0; 4] {
                let mut f = bad("slot padding (bytes 28..64) is not zero");
                f.repairable = true;
                out.push(f);
            }
            if s.in_use() {
                if FileType::from_code(s.ftype).is_none() {
                    out.push(bad(&format!("file type code {}", s.ftype)));
                }
                // Head and tail carry the epoch of the log's last thorough GC,
                // which sets both (commits and fast GC keep it).
                let (eh, et) =
                    (crate::layout::logptr::epoch(s.head), crate::layout::logptr::epoch(s.tail));
                if eh != et {
                    out.push(bad(&format!("head epoch {eh} differs from tail epoch {et}")));
                }
            } else if s.state == 0 && (s.head != 0 || s.tail != 0 || s.ftype != 0) {
                out.push(bad("never used, but its pointers are not zero"));
            }
            if ino == ROOT_INO && !s.in_use() {
                out.push(bad("the root inode is not in use"));
            }
        }
    }
}

/// Paths of the inodes reachable from the root, from loaded states.
fn paths_of(states: &HashMap<u64, crate::index::InodeState>) -> HashMap<u64, String> {
    let mut paths = HashMap::from([(ROOT_INO, "/".to_string())]);
    let mut queue = std::collections::VecDeque::from([ROOT_INO]);
    while let Some(d) = queue.pop_front() {
        let Some(Body::Dir(dir)) = states.get(&d).map(|s| &s.body) else { continue };
        let base = if d == ROOT_INO { String::new() } else { paths[&d].clone() };
        for (name, e) in &dir.names {
            if paths.contains_key(&e.ino) {
                continue;
            }
            paths.insert(e.ino, format!("{base}/{}", String::from_utf8_lossy(name)));
            if e.ftype == FileType::Directory.code() {
                queue.push_back(e.ino);
            }
        }
    }
    paths
}

/// What [`Fs::check_data`] covered.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DataReport {
    /// Damaged pages, one finding per run of adjacent pages of one file.
    pub findings: Vec<Finding>,
    /// Pages compared with a checksum.
    pub pages_checked: u64,
    /// Pages whose entries carry no checksum (version 2 pools, and pages that were
    /// DAX-mapped since they were last written).
    pub pages_unchecked: u64,
}

impl<M: Medium> Fs<M> {
    /// Compare every data page of every file with its checksum; `progress` gets
    /// (inodes done, inodes in the pool). Reads media, never the DRAM cache.
    pub fn check_data(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<DataReport> {
        let mut rep = DataReport::default();
        let mut states = HashMap::new();
        let mut seeds = HashMap::new();
        let n = self.geo.ninodes;
        for ino in 1..=n {
            if let Ok(Some((slot, st, _))) = self.load_state(ino) {
                states.insert(ino, st);
                seeds.insert(ino, crate::log::seed(&self.sb.uuid, ino, slot.state));
            }
            if ino % 256 == 0 {
                progress(ino / 2, n);
            }
        }
        let paths = paths_of(&states);
        let mut page = vec![0u8; BLOCK as usize];
        let mut done = 0;
        for (&ino, st) in &states {
            done += 1;
            if done % 256 == 0 {
                progress(n / 2 + done / 2, n);
            }
            let at = rep.findings.len();
            self.check_inode_data(ino, seeds[&ino], st, &mut page, &mut rep);
            for fd in &mut rep.findings[at..] {
                fd.path = paths.get(&ino).cloned();
            }
        }
        progress(n, n);
        rep.findings.sort_by_key(|a| (a.ino, a.range));
        Ok(rep)
    }

    /// Check the data of one file (state `st`, checksum seed `seed`) into `rep`:
    /// spilled extended attribute values and every data page with a checksum.
    /// Findings carry no path.
    fn check_inode_data(
        &self,
        ino: u64,
        seed: u32,
        st: &crate::index::InodeState,
        page: &mut [u8],
        rep: &mut DataReport,
    ) {
        // Extended attribute values kept in data blocks carry one CRC each.
        for (name, x) in st.xattrs.iter().filter(|(_, x)| x.spill.is_some()) {
            rep.pages_checked += x.spill.as_ref().map_or(0, |sp| sp.blocks.len() as u64);
            if crate::log::read_xattr(&self.m, seed, x).is_err() {
                let what = format!(
                    "extended attribute {} does not match its checksum; kept as it is",
                    String::from_utf8_lossy(name)
                );
                let mut fd = Finding::new(Region::Data, what, false);
                fd.ino = Some(ino);
                rep.findings.push(fd);
            }
        }
        let Some(f) = st.file() else { return };
        let mut bad: Vec<(u64, u64)> = Vec::new(); // (page, block)
        for (pg, e) in f.ext.iter() {
            for k in 0..e.len as u64 {
                let blk = e.block + k;
                self.m.read(blk * BLOCK, page);
                match crate::log::write_page_crc(&self.m, e.loc, blk) {
                    Ok(Some(c)) => {
                        rep.pages_checked += 1;
                        if crate::log::page_crc(seed, page) != c {
                            bad.push((pg + k, blk));
                        }
                    }
                    Ok(None) => rep.pages_unchecked += 1,
                    Err(_) => bad.push((pg + k, blk)),
                }
            }
        }
        bad.sort_unstable();
        let mut k = 0;
        while k < bad.len() {
            let mut j = k + 1;
            while j < bad.len() && bad[j].0 == bad[j - 1].0 + 1 {
                j += 1;
            }
            let (a, b) = (bad[k].0 * BLOCK, (bad[j - 1].0 + 1) * BLOCK);
            let end = b.min(st.attr.size.max(a + 1));
            let mut fd = Finding::new(
                Region::Data,
                format!(
                    "{} page(s) do not match their checksums (first in pool block {}); \
                     no second copy: kept as they are",
                    j - k,
                    bad[k].1
                ),
                false,
            );
            fd.ino = Some(ino);
            fd.range = Some((a, end));
            rep.findings.push(fd);
            k = j;
        }
    }

    /// [`Fs::check_data`] on a mounted pool, from a party of it (a direct-access
    /// client, as `ferrite scrub --mount`): each file is loaded (its log entries
    /// checked) and its pages verified under its lock, with the coordination's
    /// freshness rules, so no writer, GC or other party shows a page mid-change.
    /// Reads media, and holds one file's lock at a time.
    pub fn check_data_live(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<DataReport> {
        let mut rep = DataReport::default();
        let mut page = vec![0u8; BLOCK as usize];
        let n = self.geo.ninodes;
        for ino in 1..=n {
            if ino % 256 == 0 {
                progress(ino, n);
            }
            if !self.read_slot(ino).in_use() {
                continue;
            }
            let i = match self.inode(ino) {
                Ok(i) => i,
                // Freed since the slot was read.
                Err(crate::Error::NotFound) => continue,
                Err(e) => {
                    let mut fd = Finding::new(Region::Log, format!("inode {ino}: {e}"), false);
                    fd.ino = Some(ino);
                    rep.findings.push(fd);
                    continue;
                }
            };
            let one = self.read_fresh(&i, true, |st| {
                let mut r = DataReport::default();
                self.check_inode_data(ino, i.seed, st, &mut page, &mut r);
                r
            })?;
            rep.pages_checked += one.pages_checked;
            rep.pages_unchecked += one.pages_unchecked;
            rep.findings.extend(one.findings);
        }
        progress(n, n);
        rep.findings.sort_by_key(|a| (a.ino, a.range));
        Ok(rep)
    }

    /// Path of inode `ino` if reachable from the root (a walk of the tree).
    pub fn path_of(&self, ino: u64) -> Option<String> {
        let mut states = HashMap::new();
        for i in 1..=self.geo.ninodes {
            if let Ok(Some((_, st, _))) = self.load_state(i) {
                if st.ftype == FileType::Directory || i == ino {
                    states.insert(i, st);
                }
            }
        }
        paths_of(&states).remove(&ino)
    }
}

/// Everything [`check_pool`] found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PoolReport {
    /// Findings, fixed regions first.
    pub findings: Vec<Finding>,
    /// The pool mounted (read-only) for the log, tree and data checks.
    pub mounted: bool,
    /// The pool had been cleanly unmounted.
    pub clean_unmount: bool,
    /// Data pages compared with a checksum.
    pub pages_checked: u64,
    /// Data pages without a stored checksum (version 2 entries).
    pub pages_unchecked: u64,
    /// What fsck counted (inodes, entries...), when it ran.
    pub fsck: Option<crate::fsck::FsckReport>,
}

impl PoolReport {
    /// Nothing found.
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// The region an fsck message is about.
fn fsck_region(msg: &str) -> Region {
    if msg.contains("log") || msg.contains("entry at") || msg.contains("torn") {
        Region::Log
    } else if msg.contains("slot") {
        Region::InodeSlot
    } else if msg.contains("superblock") {
        Region::Superblock
    } else if msg.contains("journal") {
        Region::Journal
    } else {
        Region::Tree
    }
}

/// Check an unmounted pool completely without writing to it: fixed regions
/// ([`check_raw`]), then a read-only mount's [`Fs::fsck`] (logs, tree, link
/// counts, allocator) and [`Fs::check_data`]. Returns the medium back when the
/// mount succeeded.
pub fn check_pool<M: Medium>(m: M, progress: &mut dyn FnMut(u64, u64)) -> (PoolReport, Option<M>) {
    let (sb, raw) = check_raw(&m);
    let mut rep = PoolReport { findings: raw, ..Default::default() };
    rep.clean_unmount = m.len() >= BLOCK && m.load_u64(MOUNT_STATE_OFF) & STATE_CLEAN != 0;
    if sb.is_none() {
        return (rep, Some(m));
    }
    let opts = crate::fs::MountOptions {
        read_only: true,
        workers: 1,
        verify: crate::VerifyMode::Off,
        ..Default::default()
    };
    let fs = match Fs::mount(m, &opts) {
        Ok(fs) => fs,
        Err(e) => {
            let msg = format!("the pool does not mount: {e}");
            rep.findings.push(Finding::new(fsck_region(&msg), msg, false));
            return (rep, None);
        }
    };
    rep.mounted = true;
    match fs.fsck() {
        Ok(r) => {
            // Superblock copies were checked above, from media.
            for e in r.errors.iter().filter(|e| !e.starts_with("superblock copy")) {
                rep.findings.push(Finding::new(fsck_region(e), e.clone(), false));
            }
            rep.fsck = Some(r);
        }
        Err(e) => rep.findings.push(Finding::new(Region::Log, format!("fsck: {e}"), false)),
    }
    match fs.check_data(progress) {
        Ok(d) => {
            rep.pages_checked = d.pages_checked;
            rep.pages_unchecked = d.pages_unchecked;
            rep.findings.extend(d.findings);
        }
        Err(e) => rep.findings.push(Finding::new(Region::Data, format!("data: {e}"), false)),
    }
    (rep, fs.unmount().ok())
}

impl<M: Medium> Fs<M> {
    /// Give orphan directory `ino` the name `name` in directory `lf`, one journaled
    /// commit as `link` (which refuses directories): a DENTRY and the link count in
    /// `lf`, the parent pointer in `ino`.
    fn adopt_dir(&self, ino: u64, lf: u64, name: &[u8]) -> Result<()> {
        use crate::fs::{Locked, Part};
        use crate::log::EntryBuf;
        let c = self.inode(ino)?;
        let p = self.inode(lf)?;
        let mut locked = Locked::new(self, &[&p, &c])?;
        if locked.st(lf).dir().is_none_or(|d| d.names.contains_key(name)) {
            return Err(crate::Error::Exists);
        }
        let now = self.m.now();
        let cookie = locked.st(lf).dir().map_or(3, |d| d.next_cookie);
        let de = EntryBuf::dentry(ino, cookie, now, FileType::Directory.code(), name);
        let (pe, _) = Self::setattr_entry(locked.st(lf), |a| {
            a.nlink += 1;
            a.mtime = now;
            a.ctime = now;
        });
        let (ce, _) = Self::setattr_entry(locked.st(ino), |a| {
            a.parent = lf;
            a.ctime = now;
        });
        let mut parts = [
            Part { ino: lf, entries: smallvec::smallvec![de, pe] },
            Part { ino, entries: smallvec::smallvec![ce] },
        ];
        self.commit_multi(&mut locked, &mut parts, None, &[], false)?;
        Ok(())
    }

    /// Repair what can be rebuilt on a writable mount (`ferrite fsck --repair`):
    /// idle journals reset, padding zeroed, orphan inodes (directories too) linked into
    /// /lost+found as `#INODE`, link counts set to the links found. The mount
    /// itself has already rewritten a damaged or stale superblock copy from its
    /// twin, and its unmount writes a checkpoint rebuilt from the logs when the
    /// old one was not usable. Damaged file data is never touched. Returns what
    /// was done.
    pub fn repair(&self) -> Result<Vec<String>> {
        self.check_writable()?;
        let mut done = Vec::new();
        let geo = self.geo;
        for s in 0..geo.nshards {
            done.extend(crate::journal::repair(&self.m, &geo, s));
        }
        let zeros = vec![0u8; BLOCK as usize];
        for (k, start) in geo.journal_starts().into_iter().enumerate() {
            let Some(start) = start else { continue };
            let jend = (start + geo.journal_blocks) * BLOCK;
            let jlast = start * BLOCK + geo.nshards as u64 * crate::layout::JOURNAL_SIZE;
            if jlast < jend {
                let mut b = vec![0u8; (jend - jlast) as usize];
                self.m.read(jlast, &mut b);
                if !zero(&b) {
                    crate::pmem::persist_copy(&self.m, jlast, &vec![0u8; b.len()]);
                    done.push(format!("bytes past the last journal of copy {k} zeroed"));
                }
            }
        }
        let ms = MOUNT_STATE_OFF as usize;
        let mut blk = vec![0u8; BLOCK as usize];
        self.m.read(0, &mut blk);
        if !zero(&blk[SB_SIZE..ms]) || !zero(&blk[ms + 8..]) {
            crate::pmem::persist_copy(&self.m, SB_SIZE as u64, &zeros[..ms - SB_SIZE]);
            crate::pmem::persist_copy(&self.m, MOUNT_STATE_OFF + 8, &zeros[ms + 8..]);
            done.push("block 0 padding zeroed".into());
        }
        self.m.read(BLOCK, &mut blk);
        if !zero(&blk[SB_SIZE..]) {
            crate::pmem::persist_copy(&self.m, BLOCK + SB_SIZE as u64, &zeros[SB_SIZE..]);
            done.push("block 1 padding zeroed".into());
        }
        for ino in 1..=geo.ninodes {
            let off = geo.slot_off(ino);
            let mut raw = [0u8; INODE_SLOT as usize];
            self.m.read(off, &mut raw);
            if !zero(&raw[28..]) {
                // Never part of a transaction: no operation reads or writes them.
                crate::pmem::persist_copy(&self.m, off + 28, &zeros[..36]);
                done.push(format!("inode {ino}: slot padding zeroed"));
            }
        }
        self.m.fence();
        // Adopt the roots of orphan subtrees only (an orphan directory's children
        // come along); a cycle of orphans naming each other stays reported.
        for _ in 0..geo.ninodes {
            let r = self.fsck()?;
            if r.orphans.is_empty() {
                break;
            }
            let mut named = std::collections::HashSet::new();
            for &o in &r.orphans {
                if let Some(d) = self.inode(o)?.st.read().dir() {
                    named.extend(d.names.values().map(|e| e.ino));
                }
            }
            let roots: Vec<u64> =
                r.orphans.iter().copied().filter(|o| !named.contains(o)).collect();
            if roots.is_empty() {
                break;
            }
            let lf = match self.lookup_ino(ROOT_INO, b"lost+found") {
                Ok(i) => i,
                Err(_) => self.mkdir(ROOT_INO, b"lost+found", 0o700, 0, 0)?.ino,
            };
            for ino in roots {
                let ft = self.inode(ino)?.st.read().ftype;
                let name = format!("#{ino}");
                if ft == FileType::Directory {
                    self.adopt_dir(ino, lf, name.as_bytes())?;
                } else {
                    self.link(ino, lf, name.as_bytes())?;
                }
                done.push(format!("inode {ino} linked as /lost+found/#{ino}"));
            }
        }
        let r = self.fsck()?;
        for &(ino, want) in &r.link_fixes {
            let i = self.inode(ino)?;
            let _h = self.hold(&i)?;
            let mut st = i.st.write();
            let (e, _) = Self::setattr_entry(&st, |a| a.nlink = want);
            self.commit_single(&i, &mut st, &mut [e], false, false)?;
            done.push(format!("inode {ino}: link count set to {want}"));
        }
        Ok(done)
    }
}
