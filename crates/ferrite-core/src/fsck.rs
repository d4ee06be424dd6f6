//! Consistency checking of a mounted pool: every invariant the format promises.

use crate::error::Result;
use crate::fs::Fs;
use crate::index::{Body, FileType};
use crate::layout::{Superblock, BLOCK, ROOT_INO, SB_SIZE};
use crate::pmem::Medium;
use std::collections::{HashMap, VecDeque};

/// What fsck found.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct FsckReport {
    /// Invariant violations.
    pub errors: Vec<String>,
    /// Oddities that are not errors.
    pub warnings: Vec<String>,
    /// In-use inodes.
    pub inodes: u64,
    /// Directories.
    pub dirs: u64,
    /// Regular files.
    pub files: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// FIFOs, device nodes and sockets.
    pub special: u64,
    /// Log pages.
    pub log_pages: u64,
    /// Data blocks referenced.
    pub data_blocks: u64,
    /// Bytes of file data (sum of sizes).
    pub data_bytes: u64,
    /// Log entries checked.
    pub entries: u64,
    /// Reachable inodes whose link count is wrong: (inode, links found).
    #[serde(skip)]
    pub link_fixes: Vec<(u64, u32)>,
    /// In-use inodes no name reaches (and no handle holds open).
    #[serde(skip)]
    pub orphans: Vec<u64>,
}

impl FsckReport {
    /// No errors?
    pub fn is_clean(&self) -> bool {
        self.errors.is_empty()
    }
}

impl<M: Medium> Fs<M> {
    /// Check every invariant of the pool. Errors in the report, not `Err`; `Err` only
    /// for operational failures.
    pub fn fsck(&self) -> Result<FsckReport> {
        let mut r = FsckReport::default();
        let geo = self.geo;
        // Superblock copies.
        for copy in 0..2u64 {
            let mut b = [0u8; SB_SIZE];
            self.m.read(copy * BLOCK, &mut b);
            match Superblock::decode(&b) {
                Ok(sb) if sb == self.sb => {}
                Ok(_) => {
                    r.errors.push(format!("superblock copy {copy} differs from the one in use"))
                }
                Err(e) => r.errors.push(format!("superblock copy {copy}: {e}")),
            }
        }
        // Journals idle.
        for s in 0..geo.nshards {
            if crate::journal::read(&self.m, &geo, s).1 {
                r.errors.push(format!("journal of shard {s} is active on a mounted pool"));
            }
        }
        // Every inode.
        let mut owner: HashMap<u64, u64> = HashMap::new(); // block -> ino
        let mut logs: std::collections::HashSet<u64> = Default::default();
        // Data blocks mapped more than once (reflinks): block -> extra mappings.
        let mut again: HashMap<u64, u32> = HashMap::new();
        let mut types: HashMap<u64, FileType> = HashMap::new();
        let mut states = HashMap::new();
        let used_inodes = self.ialloc.used_bitmap();
        for ino in 1..=geo.ninodes {
            let slot = self.read_slot(ino);
            if slot.in_use() != used_inodes.get(ino - 1) {
                r.errors.push(format!(
                    "inode {ino}: slot says in use={} but the inode allocator disagrees",
                    slot.in_use()
                ));
            }
            let loaded = match self.load_state(ino) {
                Ok(Some(x)) => x,
                Ok(None) => continue,
                Err(e) => {
                    r.errors.push(format!("inode {ino}: {e}"));
                    continue;
                }
            };
            let (_slot, st, walk) = loaded;
            if walk.torn {
                r.errors.push(format!("inode {ino}: log tail points past a torn entry"));
            }
            r.inodes += 1;
            r.entries += walk.committed as u64;
            r.log_pages += st.log.pages.len() as u64;
            for p in st.log.pages.iter() {
                let b = p / BLOCK;
                logs.insert(b);
                if let Some(o) = owner.insert(b, ino) {
                    r.errors.push(format!(
                        "block {b} (log page of inode {ino}) is also owned by inode {o}"
                    ));
                }
            }
            for (s, n) in st.data_runs() {
                r.data_blocks += n;
                for b in s..s + n {
                    if let Some(o) = owner.insert(b, ino) {
                        if logs.contains(&b) {
                            r.errors.push(format!(
                                "block {b} (data block of inode {ino}) is also a log page of inode {o}"
                            ));
                        } else {
                            *again.entry(b).or_default() += 1;
                        }
                    }
                }
            }
            for (name, x) in st.xattrs.iter() {
                let n = String::from_utf8_lossy(name);
                if crate::acl::is_acl_name(name) && x.spill.is_some() {
                    r.errors.push(format!("inode {ino}: {n} is an ACL stored in data blocks"));
                    continue;
                }
                if crate::acl::is_acl_name(name) {
                    let mut v = vec![0u8; x.value_len as usize];
                    crate::log::read_payload(&self.m, x.loc, x.value_off, &mut v);
                    if let Err(e) = crate::acl::parse(&v) {
                        r.errors.push(format!("inode {ino}: {n} is not a valid ACL: {e}"));
                    }
                    continue;
                }
                let known = [&b"user."[..], b"trusted.", b"security."]
                    .iter()
                    .any(|p| name.starts_with(p) && name.len() > p.len() && name.len() <= 255);
                if !known {
                    r.errors
                        .push(format!("inode {ino}: extended attribute {n:?} has no valid name"));
                }
            }
            match st.ftype {
                FileType::Directory => r.dirs += 1,
                FileType::Regular => {
                    r.files += 1;
                    // Sparse files may each be close to 2^63 bytes.
                    r.data_bytes = r.data_bytes.saturating_add(st.attr.size);
                    if st.attr.size > crate::layout::MAX_FILE_SIZE {
                        r.errors.push(format!("file {ino} has size {}", st.attr.size));
                    }
                }
                FileType::Symlink => {
                    r.symlinks += 1;
                    if st.attr.size == 0 || st.attr.size > 4095 {
                        r.errors.push(format!("symlink {ino} has size {}", st.attr.size));
                    }
                }
                t => {
                    r.special += 1;
                    if st.attr.size != 0 {
                        r.errors.push(format!("{t:?} {ino} has size {}", st.attr.size));
                    }
                    if st.file().is_some_and(|f| f.content_pages() != 0) {
                        r.errors.push(format!("{t:?} {ino} holds data"));
                    }
                }
            }
            let devnode = matches!(st.ftype, FileType::CharDevice | FileType::BlockDevice);
            if !devnode && st.attr.rdev != 0 {
                r.errors.push(format!("inode {ino}: device number on a {:?}", st.ftype));
            }
            if (st.attr.mode & libc::S_IFMT) != st.ftype.mode_bits() {
                r.errors
                    .push(format!("inode {ino}: mode {:o} disagrees with its type", st.attr.mode));
            }
            // A cached inode's DRAM state must equal what its log replays to.
            if let Ok(cached) = self.cached(ino) {
                let c = cached.st.read();
                if c.attr != st.attr || c.size() != st.size() || c.blocks() != st.blocks() {
                    r.errors.push(format!("inode {ino}: DRAM attributes differ from the log"));
                }
                if c.refs.iter().filter(|&(_, v)| v > 0).count()
                    != st.refs.iter().filter(|&(_, v)| v > 0).count()
                {
                    r.errors
                        .push(format!("inode {ino}: DRAM live-entry counts differ from the log"));
                }
                if c.log.pages != st.log.pages {
                    r.errors.push(format!("inode {ino}: DRAM log page list differs from the log"));
                }
            }
            types.insert(ino, st.ftype);
            states.insert(ino, st);
        }
        // A data block mapped twice is shared (`refs`): the counts must say so.
        for (&b, &n) in &again {
            if logs.contains(&b) {
                r.errors.push(format!("block {b} is a log page and mapped as data"));
            } else if self.extra_refs(b) != n {
                r.errors.push(format!(
                    "block {b} is mapped {} times but counted with {} extra references",
                    n + 1,
                    self.extra_refs(b)
                ));
            }
        }
        for (b, n) in self.shared_blocks() {
            if !again.contains_key(&b) {
                r.errors.push(format!(
                    "block {b} is counted with {n} extra references but mapped once"
                ));
            }
        }
        if let Some(m) = &self.report.refs_mismatch {
            r.errors.push(format!("shared blocks differ from the checkpoint's summary: {m}"));
        }
        // Live persistent buffers own their blocks (no log names them).
        let bufs = self.pbuf_all_blocks();
        // Allocator agrees with ownership.
        let used = self.balloc.used_bitmap();
        for b in geo.data_start..geo.nblocks {
            match (used.get(b), owner.contains_key(&b) || bufs.contains(&b)) {
                (false, true) => r.errors.push(format!("block {b} is owned but on a free list")),
                (true, false) => {
                    r.errors.push(format!("block {b} is marked used but nobody owns it"))
                }
                _ => {}
            }
        }
        // Tree: reachability, link counts, parents, types.
        let mut links: HashMap<u64, u32> = HashMap::new();
        let mut subdirs: HashMap<u64, u32> = HashMap::new();
        let mut seen_dir_parent: HashMap<u64, u64> = HashMap::new();
        let mut queue = VecDeque::from([ROOT_INO]);
        let mut reached = std::collections::HashSet::from([ROOT_INO]);
        while let Some(d) = queue.pop_front() {
            let Some(st) = states.get(&d) else {
                r.errors.push(format!("directory {d} is not a valid inode"));
                continue;
            };
            let Body::Dir(dir) = &st.body else { continue };
            for (name, e) in &dir.names {
                let nm = String::from_utf8_lossy(name);
                let Some(t) = types.get(&e.ino) else {
                    r.errors
                        .push(format!("entry '{nm}' in directory {d} names free inode {}", e.ino));
                    continue;
                };
                if t.code() != e.ftype {
                    r.errors.push(format!("entry '{nm}' in directory {d}: type code mismatch"));
                }
                *links.entry(e.ino).or_default() += 1;
                if *t == FileType::Directory {
                    *subdirs.entry(d).or_default() += 1;
                    if let Some(p) = seen_dir_parent.insert(e.ino, d) {
                        r.errors
                            .push(format!("directory {} has two names (in {p} and {d})", e.ino));
                    }
                    if states[&e.ino].attr.parent != d {
                        r.errors.push(format!(
                            "directory {} lives in {d} but its parent pointer says {}",
                            e.ino, states[&e.ino].attr.parent
                        ));
                    }
                }
                if reached.insert(e.ino) && *t == FileType::Directory {
                    queue.push_back(e.ino);
                }
            }
            if dir.order.len() != dir.names.len() {
                r.errors.push(format!("directory {d}: cookie index out of step with names"));
            }
        }
        for (&ino, st) in &states {
            let want = match st.ftype {
                FileType::Directory => 2 + subdirs.get(&ino).copied().unwrap_or(0),
                _ => links.get(&ino).copied().unwrap_or(0),
            };
            if !reached.contains(&ino) {
                if st.attr.nlink == 0 && self.open_count(ino) > 0 {
                    continue; // unlinked but open
                }
                r.errors.push(format!("inode {ino} is in use but unreachable from the root"));
                r.orphans.push(ino);
                continue;
            }
            if st.attr.nlink != want {
                r.errors.push(format!(
                    "inode {ino}: link count {} but {want} links found",
                    st.attr.nlink
                ));
                r.link_fixes.push((ino, want));
            }
        }
        Ok(r)
    }

    fn cached(&self, ino: u64) -> Result<std::sync::Arc<crate::fs::Inode>> {
        self.cached_inodes().into_iter().find(|i| i.ino == ino).ok_or(crate::error::Error::NotFound)
    }
}
