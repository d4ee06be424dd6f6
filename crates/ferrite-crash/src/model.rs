//! The reference model: workload operations and an in-memory file tree that says
//! what each operation must do, plus the canonical form the oracle compares.
//!
//! Invariants:
//! - [`Model::apply`] is a pure function of the model and the operation: it returns
//!   the errno FerriteFS must return, and on success changes the model exactly as the
//!   operation must change the file system. It never looks at the file system, so a
//!   crash state is judged against an independent reference (times, which only the
//!   running file system knows, are copied in from it after each operation).
//! - Link counts are derived from the structure (a file's names, a directory's
//!   subdirectories), never counted incrementally.
//! - [`Canon`] is the visible tree: every path in name order with its type, mode,
//!   owner, link count, size, a hash of its contents or target, a hash of its extended
//!   attributes, optionally its times, and which earlier path it is a hard link of.
//!   Two trees are the same state exactly when their canonical forms are equal.

use ferrite_core::Ts;
use libc::{EEXIST, EINVAL, EISDIR, ENODATA, ENOENT, ENOTDIR, ENOTEMPTY, EPERM};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};

/// Which rename.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RenameKind {
    /// rename(2): replace the target if any.
    Plain,
    /// RENAME_NOREPLACE.
    NoReplace,
    /// RENAME_EXCHANGE.
    Exchange,
}

/// setxattr flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XattrHow {
    /// Create or replace.
    Any,
    /// Fail if present.
    Create,
    /// Fail if absent.
    Replace,
}

/// One workload operation, by path. Data is generated from `pat` and the file
/// offset (see [`pattern`]), so misplaced bytes are caught.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Create a regular file.
    Create { path: String, perm: u32 },
    /// Make a directory.
    Mkdir { path: String, perm: u32 },
    /// Make a symbolic link.
    Symlink { path: String, target: String },
    /// Hard link `from` as `to`.
    Link { from: String, to: String },
    /// Remove a non-directory.
    Unlink { path: String },
    /// Remove an empty directory.
    Rmdir { path: String },
    /// Rename.
    Rename { from: String, to: String, kind: RenameKind },
    /// Write `len` bytes at `off`.
    Write { path: String, off: u64, len: u64, pat: u8 },
    /// Append `len` bytes.
    Append { path: String, len: u64, pat: u8 },
    /// Set the size.
    Truncate { path: String, size: u64 },
    /// fallocate (allocate zeroed blocks for holes).
    Fallocate { path: String, off: u64, len: u64, keep_size: bool },
    /// fallocate(PUNCH_HOLE | KEEP_SIZE).
    Punch { path: String, off: u64, len: u64 },
    /// fallocate(UNSHARE_RANGE [| KEEP_SIZE]): every page of the range that shares
    /// its block with another file (or place) gets a copy of its own, then the range
    /// is allocated as by a plain fallocate. The contents do not change; the size
    /// grows to `off + len` unless `keep_size`.
    Unshare { path: String, off: u64, len: u64, keep_size: bool },
    /// fallocate(COLLAPSE_RANGE), or INSERT_RANGE when `insert`.
    Shift { path: String, off: u64, len: u64, insert: bool },
    /// FICLONERANGE (`Fs::clone_range`): `[off_out, off_out + len)` of `dst` shares
    /// the blocks of `[off_in, off_in + len)` of `src` (`len` 0: to the source's end
    /// of file).
    Clone { src: String, off_in: u64, dst: String, off_out: u64, len: u64 },
    /// chmod.
    Chmod { path: String, perm: u32 },
    /// chown.
    Chown { path: String, uid: u32, gid: u32 },
    /// utimens (`None`: now).
    Utimens { path: String, atime: Option<Ts>, mtime: Option<Ts> },
    /// setxattr with a generated value.
    SetXattr { path: String, name: String, len: u64, pat: u8, how: XattrHow },
    /// removexattr.
    RemoveXattr { path: String, name: String },
    /// Open a handle numbered `handle`.
    Open { path: String, handle: u32 },
    /// Close a handle (frees an unlinked inode on its last close).
    Release { handle: u32 },
    /// Write through a handle (the file may be unlinked).
    WriteHandle { handle: u32, off: u64, len: u64, pat: u8 },
    /// fsync.
    Fsync { path: String },
    /// Thorough GC of one inode's log now.
    Compact { path: String },
    /// Clean unmount and mount.
    Remount,
    /// Crash (drop everything in flight) and recover.
    CrashRemount,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Create { path, perm } => write!(f, "create {path} {perm:o}"),
            Op::Mkdir { path, perm } => write!(f, "mkdir {path} {perm:o}"),
            Op::Symlink { path, target } => {
                if target.len() > 40 {
                    write!(f, "symlink {path} -> {}... ({} bytes)", &target[..32], target.len())
                } else {
                    write!(f, "symlink {path} -> {target}")
                }
            }
            Op::Link { from, to } => write!(f, "link {from} {to}"),
            Op::Unlink { path } => write!(f, "unlink {path}"),
            Op::Rmdir { path } => write!(f, "rmdir {path}"),
            Op::Rename { from, to, kind } => write!(
                f,
                "rename{} {from} {to}",
                match kind {
                    RenameKind::Plain => "",
                    RenameKind::NoReplace => "(noreplace)",
                    RenameKind::Exchange => "(exchange)",
                }
            ),
            Op::Write { path, off, len, pat } => {
                write!(f, "write {path} off={off} len={len} pat={pat}")
            }
            Op::Append { path, len, pat } => write!(f, "append {path} len={len} pat={pat}"),
            Op::Truncate { path, size } => write!(f, "truncate {path} {size}"),
            Op::Fallocate { path, off, len, keep_size } => {
                write!(
                    f,
                    "fallocate {path} off={off} len={len}{}",
                    if *keep_size { " keep_size" } else { "" }
                )
            }
            Op::Punch { path, off, len } => write!(f, "punch {path} off={off} len={len}"),
            Op::Unshare { path, off, len, keep_size } => {
                write!(
                    f,
                    "unshare {path} off={off} len={len}{}",
                    if *keep_size { " keep_size" } else { "" }
                )
            }
            Op::Shift { path, off, len, insert } => {
                let what = if *insert { "insert" } else { "collapse" };
                write!(f, "{what} {path} off={off} len={len}")
            }
            Op::Clone { src, off_in, dst, off_out, len } => {
                write!(f, "clone {src} off={off_in} -> {dst} off={off_out} len={len}")
            }
            Op::Chmod { path, perm } => write!(f, "chmod {path} {perm:o}"),
            Op::Chown { path, uid, gid } => write!(f, "chown {path} {uid}:{gid}"),
            Op::Utimens { path, atime, mtime } => {
                let t = |x: &Option<Ts>| {
                    x.map_or("now".to_string(), |t| format!("{}.{:09}", t.sec, t.nsec))
                };
                write!(f, "utimens {path} atime={} mtime={}", t(atime), t(mtime))
            }
            Op::SetXattr { path, name, len, pat, how } => {
                write!(f, "setxattr {path} {name} len={len} pat={pat} {how:?}")
            }
            Op::RemoveXattr { path, name } => write!(f, "removexattr {path} {name}"),
            Op::Open { path, handle } => write!(f, "open {path} as #{handle}"),
            Op::Release { handle } => write!(f, "release #{handle}"),
            Op::WriteHandle { handle, off, len, pat } => {
                write!(f, "write #{handle} off={off} len={len} pat={pat}")
            }
            Op::Fsync { path } => write!(f, "fsync {path}"),
            Op::Compact { path } => write!(f, "compact {path}"),
            Op::Remount => write!(f, "unmount+mount"),
            Op::CrashRemount => write!(f, "crash+recover"),
        }
    }
}

/// The bytes an operation with pattern `pat` writes at file offset `off`: never
/// zero (so holes and lost writes show), and different at every offset and pattern.
pub fn pattern(pat: u8, off: u64, len: u64) -> Vec<u8> {
    (off..off + len)
        .map(|x| {
            let h = x.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((pat as u64) << 29) ^ (x >> 12);
            let h = h ^ (h >> 31);
            (h % 255) as u8 + 1
        })
        .collect()
}

/// Split "/a/b/c" into ("/a/b", "c").
pub fn split_path(path: &str) -> (&str, &str) {
    let t = path.trim_end_matches('/');
    match t.rfind('/') {
        Some(0) => ("/", &t[1..]),
        Some(i) => (&t[..i], &t[i + 1..]),
        None => ("/", t),
    }
}

/// Join a directory path and a name.
pub fn join(dir: &str, name: &str) -> String {
    if dir == "/" {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

/// What a model node is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MKind {
    /// Directory: names to node ids.
    Dir(BTreeMap<Vec<u8>, u64>),
    /// Regular file contents.
    File(Vec<u8>),
    /// Symlink target.
    Symlink(Vec<u8>),
}

/// One inode of the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MNode {
    /// Type and contents.
    pub kind: MKind,
    /// Permission bits.
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Names referring to it (non-directories).
    pub links: u32,
    /// Parent (directories).
    pub parent: u64,
    /// Extended attributes.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The file system's inode number (0 until bound after the creating operation).
    pub ino: u64,
    /// (atime, mtime, ctime) copied from the file system after each operation.
    pub times: Option<[Ts; 3]>,
}

impl MNode {
    fn new(kind: MKind, perm: u32, parent: u64) -> MNode {
        MNode {
            kind,
            perm,
            uid: 0,
            gid: 0,
            links: 1,
            parent,
            xattrs: BTreeMap::new(),
            ino: 0,
            times: None,
        }
    }

    /// Is this a directory?
    pub fn is_dir(&self) -> bool {
        matches!(self.kind, MKind::Dir(_))
    }

    fn entries(&self) -> Option<&BTreeMap<Vec<u8>, u64>> {
        match &self.kind {
            MKind::Dir(e) => Some(e),
            _ => None,
        }
    }
}

/// Id of the root node.
pub const ROOT: u64 = 1;

/// The reference file tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Model {
    /// Nodes by id.
    pub nodes: BTreeMap<u64, MNode>,
    /// Open handles: handle number to node id.
    pub handles: BTreeMap<u32, u64>,
    next_id: u64,
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

type R<T> = std::result::Result<T, i32>;

impl Model {
    /// An empty file system: a root directory (0755, uid 0, gid 0).
    pub fn new() -> Model {
        let mut root = MNode::new(MKind::Dir(BTreeMap::new()), 0o755, ROOT);
        root.ino = ferrite_core::layout::ROOT_INO;
        let mut nodes = BTreeMap::new();
        nodes.insert(ROOT, root);
        Model { nodes, handles: BTreeMap::new(), next_id: ROOT + 1 }
    }

    fn node(&self, id: u64) -> &MNode {
        &self.nodes[&id]
    }

    fn node_mut(&mut self, id: u64) -> &mut MNode {
        self.nodes.get_mut(&id).expect("model node")
    }

    /// Resolve a path, following symlinks in the middle (and at the end when
    /// `follow`), as `Fs::resolve` does: relative targets from the symlink's directory,
    /// "." and "..", ELOOP after 40 symlinks.
    pub fn resolve(&self, path: &str, follow: bool) -> R<u64> {
        let mut budget = 40;
        self.resolve_from(ROOT, path.as_bytes(), follow, &mut budget)
    }

    fn resolve_from(&self, start: u64, path: &[u8], follow: bool, budget: &mut usize) -> R<u64> {
        let mut cur = if path.first() == Some(&b'/') { ROOT } else { start };
        let comps: Vec<&[u8]> = path.split(|&c| c == b'/').filter(|c| !c.is_empty()).collect();
        for (k, c) in comps.iter().enumerate() {
            let last = k + 1 == comps.len();
            let e = self.node(cur).entries().ok_or(ENOTDIR)?;
            let next = match *c {
                b"." => cur,
                b".." => self.node(cur).parent,
                name => *e.get(name).ok_or(ENOENT)?,
            };
            match &self.node(next).kind {
                MKind::Symlink(t) if !last || follow => {
                    if *budget == 0 {
                        return Err(libc::ELOOP);
                    }
                    *budget -= 1;
                    cur = self.resolve_from(cur, t, true, budget)?;
                }
                _ => cur = next,
            }
        }
        Ok(cur)
    }

    /// Resolve a path without following a final symlink.
    pub fn lookup(&self, path: &str) -> R<u64> {
        self.resolve(path, false)
    }

    /// Resolve a parent directory path (following symlinks): ENOTDIR if it is not one.
    fn dir(&self, path: &str) -> R<u64> {
        let id = self.resolve(path, true)?;
        if self.node(id).is_dir() {
            Ok(id)
        } else {
            Err(ENOTDIR)
        }
    }

    fn child(&self, dir: u64, name: &str) -> Option<u64> {
        self.node(dir).entries().and_then(|e| e.get(name.as_bytes()).copied())
    }

    fn entries_mut(&mut self, dir: u64) -> &mut BTreeMap<Vec<u8>, u64> {
        match &mut self.node_mut(dir).kind {
            MKind::Dir(e) => e,
            _ => panic!("model node {dir} is not a directory"),
        }
    }

    /// Number of open handles on a node.
    pub fn open_count(&self, id: u64) -> usize {
        self.handles.values().filter(|&&h| h == id).count()
    }

    /// Drop a node if nothing refers to it any more.
    fn maybe_free(&mut self, id: u64) {
        let n = self.node(id);
        if !n.is_dir() && n.links == 0 && self.open_count(id) == 0 {
            self.nodes.remove(&id);
        }
    }

    fn add(&mut self, dir: u64, name: &str, node: MNode) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(id, node);
        self.entries_mut(dir).insert(name.as_bytes().to_vec(), id);
        id
    }

    /// Is `a` equal to `b` or an ancestor of it?
    fn is_ancestor_or_self(&self, a: u64, mut b: u64) -> bool {
        for _ in 0..=self.nodes.len() {
            if a == b {
                return true;
            }
            if b == ROOT {
                return false;
            }
            b = self.node(b).parent;
        }
        false
    }

    fn file_data(&mut self, id: u64) -> R<&mut Vec<u8>> {
        match &mut self.node_mut(id).kind {
            MKind::File(d) => Ok(d),
            MKind::Dir(_) => Err(EISDIR),
            MKind::Symlink(_) => Err(EINVAL),
        }
    }

    /// The errno of a data operation on a node that is not a regular file.
    fn regular(&self, id: u64) -> R<()> {
        match &self.node(id).kind {
            MKind::File(_) => Ok(()),
            MKind::Dir(_) => Err(EISDIR),
            MKind::Symlink(_) => Err(EINVAL),
        }
    }

    /// FICLONERANGE with the core's (Linux's `generic_remap_checks`) order of
    /// checks: both paths, both types (source first), offsets (EINVAL past the
    /// largest file or not page-aligned), then against the sizes: `len` 0 at exactly
    /// the source's end of file does nothing; a source range starting at or past
    /// its end is EINVAL; the length is clamped to the source's end of file and
    /// must be page-aligned unless it reaches it; EFBIG past the largest file;
    /// overlapping ranges of one file (whole pages) EINVAL; a partial last page
    /// landing inside the destination EINVAL. The destination then reads as the
    /// source range (holes as zeros) and grows to cover it.
    fn clone_range(&mut self, src: &str, off_in: u64, dst: &str, off_out: u64, len: u64) -> R<()> {
        const PAGE: u64 = 4096;
        const MAX: u64 = ferrite_core::layout::MAX_FILE_SIZE;
        let s = self.lookup(src)?;
        let d = self.lookup(dst)?;
        self.regular(s)?;
        self.regular(d)?;
        if off_in > MAX
            || off_out > MAX
            || !off_in.is_multiple_of(PAGE)
            || !off_out.is_multiple_of(PAGE)
        {
            return Err(EINVAL);
        }
        let size_of = |m: &Model, id: u64| match &m.node(id).kind {
            MKind::File(x) => x.len() as u64,
            _ => 0,
        };
        let (ssize, dsize) = (size_of(self, s), size_of(self, d));
        if len == 0 && off_in == ssize {
            return Ok(());
        }
        if off_in >= ssize {
            return Err(EINVAL);
        }
        let len = if len == 0 { ssize - off_in } else { len.min(ssize - off_in) };
        let to_eof = off_in + len == ssize;
        if !to_eof && !len.is_multiple_of(PAGE) {
            return Err(EINVAL);
        }
        let end_out = off_out.checked_add(len).filter(|&e| e <= MAX).ok_or(libc::EFBIG)?;
        let whole = len.next_multiple_of(PAGE);
        if s == d && off_out < off_in + whole && off_in < off_out + whole {
            return Err(EINVAL);
        }
        if !len.is_multiple_of(PAGE) && end_out < dsize {
            return Err(EINVAL);
        }
        let bytes = match &self.node(s).kind {
            MKind::File(x) => x[off_in as usize..(off_in + len) as usize].to_vec(),
            _ => unreachable!("checked above"),
        };
        write_at(self.file_data(d)?, off_out, &bytes);
        Ok(())
    }

    fn new_name_ok(&self, dir_path: &str, name: &str) -> R<u64> {
        let d = self.dir(dir_path)?;
        if self.child(d, name).is_some() {
            return Err(EEXIST);
        }
        Ok(d)
    }

    /// Linux allows `user.*` attributes only on regular files and directories.
    fn xattr_allowed(&self, id: u64, name: &str) -> R<()> {
        if name.starts_with("user.") && matches!(self.node(id).kind, MKind::Symlink(_)) {
            return Err(EPERM);
        }
        Ok(())
    }

    /// Apply `op`: the errno FerriteFS must return, or the change it must make.
    pub fn apply(&mut self, op: &Op) -> R<()> {
        match op {
            Op::Create { path, perm } | Op::Mkdir { path, perm } => {
                let (dp, name) = split_path(path);
                let d = self.new_name_ok(dp, name)?;
                let kind = if matches!(op, Op::Mkdir { .. }) {
                    MKind::Dir(BTreeMap::new())
                } else {
                    MKind::File(Vec::new())
                };
                self.add(d, name, MNode::new(kind, perm & 0o7777, d));
            }
            Op::Symlink { path, target } => {
                let (dp, name) = split_path(path);
                let d = self.new_name_ok(dp, name)?;
                self.add(d, name, MNode::new(MKind::Symlink(target.as_bytes().to_vec()), 0o777, d));
            }
            Op::Link { from, to } => {
                let s = self.lookup(from)?;
                let (dp, name) = split_path(to);
                let d = self.dir(dp)?;
                if self.child(d, name).is_some() {
                    return Err(EEXIST);
                }
                if self.node(s).is_dir() {
                    return Err(EPERM);
                }
                self.entries_mut(d).insert(name.as_bytes().to_vec(), s);
                self.node_mut(s).links += 1;
            }
            Op::Unlink { path } | Op::Rmdir { path } => {
                let rmdir = matches!(op, Op::Rmdir { .. });
                let (dp, name) = split_path(path);
                let d = self.dir(dp)?;
                let c = self.child(d, name).ok_or(ENOENT)?;
                match (rmdir, self.node(c).is_dir()) {
                    (true, false) => return Err(ENOTDIR),
                    (false, true) => return Err(EISDIR),
                    (true, true) if !self.node(c).entries().expect("dir").is_empty() => {
                        return Err(ENOTEMPTY)
                    }
                    _ => {}
                }
                self.entries_mut(d).remove(name.as_bytes());
                if rmdir {
                    self.nodes.remove(&c);
                } else {
                    self.node_mut(c).links -= 1;
                    self.maybe_free(c);
                }
            }
            Op::Rename { from, to, kind } => self.rename(from, to, *kind)?,
            Op::Write { path, off, len, pat } => {
                let id = self.lookup(path)?;
                write_at(self.file_data(id)?, *off, &pattern(*pat, *off, *len));
            }
            Op::WriteHandle { handle, off, len, pat } => {
                let id = *self.handles.get(handle).ok_or(libc::EBADF)?;
                write_at(self.file_data(id)?, *off, &pattern(*pat, *off, *len));
            }
            Op::Append { path, len, pat } => {
                let id = self.lookup(path)?;
                let d = self.file_data(id)?;
                let off = d.len() as u64;
                write_at(d, off, &pattern(*pat, off, *len));
            }
            Op::Truncate { path, size } => {
                let id = self.lookup(path)?;
                self.file_data(id)?.resize(*size as usize, 0);
            }
            // An unshare is a plain fallocate as far as anything visible goes: which
            // blocks back the pages is not part of the tree.
            Op::Fallocate { path, off, len, keep_size }
            | Op::Unshare { path, off, len, keep_size } => {
                let id = self.lookup(path)?;
                if *len == 0 {
                    return Err(EINVAL);
                }
                let d = self.file_data(id)?;
                let end = (off + len) as usize;
                if !keep_size && end > d.len() {
                    d.resize(end, 0);
                }
            }
            Op::Punch { path, off, len } => {
                let id = self.lookup(path)?;
                if *len == 0 {
                    return Err(EINVAL);
                }
                let d = self.file_data(id)?;
                let a = (*off as usize).min(d.len());
                let b = ((off + len) as usize).min(d.len());
                d[a..b].fill(0);
            }
            Op::Shift { path, off, len, insert } => {
                let id = self.lookup(path)?;
                if *len == 0 {
                    return Err(EINVAL);
                }
                let d = self.file_data(id)?;
                let (off, len, size) = (*off as usize, *len as usize, d.len());
                if off % 4096 != 0 || len % 4096 != 0 {
                    return Err(EINVAL);
                }
                if *insert {
                    if off >= size {
                        return Err(EINVAL);
                    }
                    let tail = d.split_off(off);
                    d.resize(off + len, 0);
                    d.extend(tail);
                } else {
                    if off + len >= size {
                        return Err(EINVAL);
                    }
                    d.drain(off..off + len);
                }
            }
            Op::Clone { src, off_in, dst, off_out, len } => {
                self.clone_range(src, *off_in, dst, *off_out, *len)?
            }
            Op::Chmod { path, perm } => {
                let id = self.lookup(path)?;
                self.node_mut(id).perm = perm & 0o7777;
            }
            Op::Chown { path, uid, gid } => {
                let id = self.lookup(path)?;
                let n = self.node_mut(id);
                n.uid = *uid;
                n.gid = *gid;
            }
            Op::Utimens { path, .. } => {
                self.lookup(path)?;
            }
            Op::SetXattr { path, name, len, pat, how } => {
                let id = self.lookup(path)?;
                self.xattr_allowed(id, name)?;
                let n = self.node_mut(id);
                let exists = n.xattrs.contains_key(name.as_bytes());
                match how {
                    XattrHow::Create if exists => return Err(EEXIST),
                    XattrHow::Replace if !exists => return Err(ENODATA),
                    _ => {}
                }
                n.xattrs.insert(name.as_bytes().to_vec(), pattern(*pat, 0, *len));
            }
            Op::RemoveXattr { path, name } => {
                let id = self.lookup(path)?;
                self.xattr_allowed(id, name)?;
                if self.node_mut(id).xattrs.remove(name.as_bytes()).is_none() {
                    return Err(ENODATA);
                }
            }
            Op::Open { path, handle } => {
                let id = self.lookup(path)?;
                assert!(
                    !self.handles.contains_key(handle),
                    "workload reuses open handle #{handle}"
                );
                self.handles.insert(*handle, id);
            }
            Op::Release { handle } => {
                let id = self.handles.remove(handle).ok_or(libc::EBADF)?;
                self.maybe_free(id);
            }
            Op::Fsync { path } | Op::Compact { path } => {
                self.lookup(path)?;
            }
            Op::Remount | Op::CrashRemount => self.close_all(),
        }
        Ok(())
    }

    /// Unmount or crash: every handle closes (unlinked open files disappear).
    pub fn close_all(&mut self) {
        let ids: Vec<u64> = std::mem::take(&mut self.handles).into_values().collect();
        for id in ids {
            if self.nodes.contains_key(&id) {
                self.maybe_free(id);
            }
        }
    }

    /// rename(2) with Linux's order of checks (do_renameat2, then vfs_rename).
    fn rename(&mut self, from: &str, to: &str, kind: RenameKind) -> R<()> {
        let (sp_path, sname) = split_path(from);
        let (dp_path, dname) = split_path(to);
        // Both parents are resolved before either is checked (the executor resolves
        // the paths, then rename checks the inodes).
        let sp = self.resolve(sp_path, true)?;
        let dp = self.resolve(dp_path, true)?;
        if !self.node(sp).is_dir() || !self.node(dp).is_dir() {
            return Err(ENOTDIR);
        }
        let s = self.child(sp, sname).ok_or(ENOENT)?;
        let d = self.child(dp, dname);
        if kind == RenameKind::NoReplace && d.is_some() {
            return Err(EEXIST);
        }
        if kind == RenameKind::Exchange && d.is_none() {
            return Err(ENOENT);
        }
        let s_dir = self.node(s).is_dir();
        let d_dir = d.map(|d| self.node(d).is_dir());
        if sp != dp {
            if s_dir && self.is_ancestor_or_self(s, dp) {
                return Err(EINVAL);
            }
            if let (Some(d), Some(true)) = (d, d_dir) {
                if self.is_ancestor_or_self(d, sp) {
                    return Err(if kind == RenameKind::Exchange { EINVAL } else { ENOTEMPTY });
                }
            }
        }
        if d == Some(s) {
            return Ok(());
        }
        if kind != RenameKind::Exchange {
            match d_dir {
                Some(true) if !s_dir => return Err(EISDIR),
                Some(false) if s_dir => return Err(ENOTDIR),
                _ => {}
            }
        }
        if let (Some(d), Some(true)) = (d, d_dir) {
            if kind != RenameKind::Exchange && !self.node(d).entries().expect("dir").is_empty() {
                return Err(ENOTEMPTY);
            }
        }
        if kind == RenameKind::Exchange {
            let d = d.expect("target");
            self.entries_mut(sp).insert(sname.as_bytes().to_vec(), d);
            self.entries_mut(dp).insert(dname.as_bytes().to_vec(), s);
            if s_dir {
                self.node_mut(s).parent = dp;
            }
            if d_dir == Some(true) {
                self.node_mut(d).parent = sp;
            }
            return Ok(());
        }
        self.entries_mut(sp).remove(sname.as_bytes());
        self.entries_mut(dp).insert(dname.as_bytes().to_vec(), s);
        if s_dir {
            self.node_mut(s).parent = dp;
        }
        if let Some(d) = d {
            if d_dir == Some(true) {
                self.nodes.remove(&d);
            } else {
                self.node_mut(d).links -= 1;
                self.maybe_free(d);
            }
        }
        Ok(())
    }

    /// Every (path, node id) reachable from the root, parents before children, names
    /// in byte order.
    pub fn paths(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut stack = vec![("/".to_string(), ROOT)];
        while let Some((p, id)) = stack.pop() {
            out.push((p.clone(), id));
            if let Some(e) = self.node(id).entries() {
                for (name, &c) in e.iter().rev() {
                    stack.push((join(&p, &String::from_utf8_lossy(name)), c));
                }
            }
        }
        out
    }

    /// Paths of every directory.
    pub fn dirs(&self) -> Vec<String> {
        self.paths().into_iter().filter(|(_, id)| self.node(*id).is_dir()).map(|(p, _)| p).collect()
    }

    /// Paths of every regular file.
    pub fn files(&self) -> Vec<String> {
        self.paths()
            .into_iter()
            .filter(|(_, id)| matches!(self.node(*id).kind, MKind::File(_)))
            .map(|(p, _)| p)
            .collect()
    }

    /// Size of the file at `path` (0 if not a file).
    pub fn size_of(&self, path: &str) -> u64 {
        match self.lookup(path).map(|id| &self.node(id).kind) {
            Ok(MKind::File(d)) => d.len() as u64,
            _ => 0,
        }
    }

    /// Total bytes of file data.
    pub fn total_bytes(&self) -> u64 {
        self.nodes
            .values()
            .map(|n| match &n.kind {
                MKind::File(d) => d.len() as u64,
                _ => 0,
            })
            .sum()
    }

    /// The canonical visible tree.
    pub fn canon(&self, with_times: bool) -> Canon {
        let mut first: HashMap<u64, Vec<u8>> = HashMap::new();
        let mut nodes = Vec::new();
        for (path, id) in self.paths() {
            let n = self.node(id);
            let (kind, size, data, nlink) = match &n.kind {
                MKind::Dir(e) => {
                    let subdirs = e.values().filter(|c| self.node(**c).is_dir()).count() as u32;
                    ('d', 0, hash_bytes(&[]), 2 + subdirs)
                }
                MKind::File(d) => ('f', d.len() as u64, hash_bytes(d), n.links),
                MKind::Symlink(t) => ('l', t.len() as u64, hash_bytes(t), n.links),
            };
            let link_of = if kind == 'd' {
                None
            } else {
                match first.get(&id) {
                    Some(p) => Some(p.clone()),
                    None => {
                        first.insert(id, path.as_bytes().to_vec());
                        None
                    }
                }
            };
            nodes.push(CNode {
                path: path.into_bytes(),
                kind,
                perm: n.perm,
                uid: n.uid,
                gid: n.gid,
                nlink,
                size,
                data,
                xattrs: hash_xattrs(n.xattrs.iter().map(|(k, v)| (k.as_slice(), v.as_slice()))),
                times: if with_times { n.times } else { None },
                link_of,
            });
        }
        Canon { nodes }
    }
}

fn write_at(d: &mut Vec<u8>, off: u64, data: &[u8]) {
    let end = off as usize + data.len();
    if d.len() < end {
        d.resize(end, 0);
    }
    d[off as usize..end].copy_from_slice(data);
}

/// Hash of a byte string (SipHash with fixed keys: stable within a build).
pub fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// Hash of a sorted list of extended attributes.
pub fn hash_xattrs<'a>(it: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> u64 {
    let mut h = DefaultHasher::new();
    for (k, v) in it {
        k.hash(&mut h);
        v.hash(&mut h);
    }
    h.finish()
}

/// One visible path in canonical form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CNode {
    /// Absolute path.
    pub path: Vec<u8>,
    /// 'd', 'f' or 'l'.
    pub kind: char,
    /// Permission bits.
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Link count.
    pub nlink: u32,
    /// Size (files and symlinks; 0 for directories).
    pub size: u64,
    /// Hash of the contents or the target.
    pub data: u64,
    /// Hash of the extended attributes.
    pub xattrs: u64,
    /// (atime, mtime, ctime), when compared. In an expected state, `None` admits any
    /// times ([`Canon::admits`]): a file two operations of one round change, whose
    /// times at a crash inside the round depend on the order of their commits.
    pub times: Option<[Ts; 3]>,
    /// Earlier path of the same inode (hard links).
    pub link_of: Option<Vec<u8>>,
}

impl CNode {
    /// An expected node without times, equal to `got` but for its times.
    fn admits_node(&self, got: &CNode) -> bool {
        self.times.is_none() && *self == CNode { times: None, ..got.clone() }
    }
}

/// A visible tree in canonical form.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Canon {
    /// Paths in walk order (parents first, names in byte order).
    pub nodes: Vec<CNode>,
}

impl Canon {
    /// The same tree without times.
    pub fn without_times(&self) -> Canon {
        Canon { nodes: self.nodes.iter().map(|n| CNode { times: None, ..n.clone() }).collect() }
    }

    /// Does this expected state admit the recovered tree `got`: equal, except that
    /// an expected node without times takes any times?
    pub fn admits(&self, got: &Canon) -> bool {
        self.nodes.len() == got.nodes.len()
            && self.nodes.iter().zip(&got.nodes).all(|(e, g)| e == g || e.admits_node(g))
    }

    /// A description of the first difference from `other`, or None when equal.
    pub fn diff(&self, other: &Canon) -> Option<String> {
        let show = |p: &[u8]| String::from_utf8_lossy(p).into_owned();
        let mut i = 0;
        let mut j = 0;
        while i < self.nodes.len() || j < other.nodes.len() {
            match (self.nodes.get(i), other.nodes.get(j)) {
                (Some(a), Some(b)) if a == b || a.admits_node(b) => {
                    i += 1;
                    j += 1;
                }
                (Some(a), Some(b)) if a.path == b.path => {
                    let mut what = Vec::new();
                    if a.kind != b.kind {
                        what.push(format!("type {} vs {}", a.kind, b.kind));
                    }
                    if a.perm != b.perm {
                        what.push(format!("mode {:o} vs {:o}", a.perm, b.perm));
                    }
                    if (a.uid, a.gid) != (b.uid, b.gid) {
                        what.push(format!("owner {}:{} vs {}:{}", a.uid, a.gid, b.uid, b.gid));
                    }
                    if a.nlink != b.nlink {
                        what.push(format!("nlink {} vs {}", a.nlink, b.nlink));
                    }
                    if a.size != b.size {
                        what.push(format!("size {} vs {}", a.size, b.size));
                    }
                    if a.data != b.data {
                        what.push("contents differ".into());
                    }
                    if a.xattrs != b.xattrs {
                        what.push("xattrs differ".into());
                    }
                    if a.times != b.times {
                        what.push(format!("times {:?} vs {:?}", a.times, b.times));
                    }
                    if a.link_of != b.link_of {
                        what.push(format!(
                            "hard link of {:?} vs {:?}",
                            a.link_of.as_deref().map(show),
                            b.link_of.as_deref().map(show)
                        ));
                    }
                    return Some(format!("{}: {}", show(&a.path), what.join(", ")));
                }
                (Some(a), Some(b)) => {
                    return Some(if a.path < b.path {
                        format!("{} present only on the left", show(&a.path))
                    } else {
                        format!("{} present only on the right", show(&b.path))
                    });
                }
                (Some(a), None) => {
                    return Some(format!("{} present only on the left", show(&a.path)))
                }
                (None, Some(b)) => {
                    return Some(format!("{} present only on the right", show(&b.path)))
                }
                (None, None) => unreachable!(),
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> String {
        s.to_string()
    }

    #[test]
    fn namespace_semantics_and_link_counts() {
        let mut m = Model::new();
        m.apply(&Op::Mkdir { path: p("/a"), perm: 0o755 }).unwrap();
        m.apply(&Op::Mkdir { path: p("/a/b"), perm: 0o700 }).unwrap();
        m.apply(&Op::Create { path: p("/a/f"), perm: 0o644 }).unwrap();
        assert_eq!(m.apply(&Op::Create { path: p("/a/f"), perm: 0o644 }), Err(EEXIST));
        assert_eq!(m.apply(&Op::Create { path: p("/a/f/x"), perm: 0o644 }), Err(ENOTDIR));
        assert_eq!(m.apply(&Op::Rmdir { path: p("/a") }), Err(ENOTEMPTY));
        assert_eq!(m.apply(&Op::Unlink { path: p("/a/b") }), Err(EISDIR));
        m.apply(&Op::Link { from: p("/a/f"), to: p("/g") }).unwrap();
        assert_eq!(m.apply(&Op::Link { from: p("/a"), to: p("/h") }), Err(EPERM));
        let c = m.canon(false);
        let g = c.nodes.iter().find(|n| n.path == b"/g").unwrap();
        assert_eq!((g.nlink, g.link_of.as_deref()), (2, Some(&b"/a/f"[..])));
        let root = &c.nodes[0];
        assert_eq!(root.nlink, 3);
        assert_eq!(
            m.apply(&Op::Rename { from: p("/a"), to: p("/a/b/c"), kind: RenameKind::Plain }),
            Err(EINVAL)
        );
        m.apply(&Op::Rename { from: p("/a/b"), to: p("/b2"), kind: RenameKind::Plain }).unwrap();
        assert_eq!(m.canon(false).nodes[0].nlink, 4);
        m.apply(&Op::Rename { from: p("/g"), to: p("/a/f"), kind: RenameKind::Plain }).unwrap();
        let c = m.canon(false);
        assert_eq!(c.nodes.iter().find(|n| n.path == b"/a/f").unwrap().nlink, 2);
        assert!(c.nodes.iter().any(|n| n.path == b"/g"));
    }

    #[test]
    fn paths_follow_symlinks_like_the_file_system() {
        let mut m = Model::new();
        m.apply(&Op::Mkdir { path: p("/d"), perm: 0o755 }).unwrap();
        m.apply(&Op::Symlink { path: p("/d/up"), target: p("..") }).unwrap();
        m.apply(&Op::Symlink { path: p("/s"), target: p("d") }).unwrap();
        m.apply(&Op::Symlink { path: p("/loop"), target: p("loop") }).unwrap();
        m.apply(&Op::Symlink { path: p("/gone"), target: p("nowhere") }).unwrap();
        m.apply(&Op::Create { path: p("/s/f"), perm: 0o644 }).unwrap();
        assert_eq!(m.resolve("/d/up/d/f", true), m.resolve("/d/f", true));
        assert_eq!(m.resolve("/s", false).unwrap(), m.lookup("/s").unwrap());
        assert_ne!(m.resolve("/s", true).unwrap(), m.lookup("/s").unwrap());
        assert_eq!(m.apply(&Op::Create { path: p("/loop/x"), perm: 0o644 }), Err(libc::ELOOP));
        assert_eq!(m.apply(&Op::Create { path: p("/gone/x"), perm: 0o644 }), Err(ENOENT));
        assert_eq!(m.apply(&Op::Create { path: p("/d/f/x"), perm: 0o644 }), Err(ENOTDIR));
    }

    #[test]
    fn data_ops_and_unlinked_open_files() {
        let mut m = Model::new();
        m.apply(&Op::Create { path: p("/f"), perm: 0o644 }).unwrap();
        m.apply(&Op::Write { path: p("/f"), off: 10, len: 5, pat: 1 }).unwrap();
        assert_eq!(m.size_of("/f"), 15);
        m.apply(&Op::Truncate { path: p("/f"), size: 12 }).unwrap();
        m.apply(&Op::Truncate { path: p("/f"), size: 20 }).unwrap();
        let MKind::File(d) = &m.nodes[&m.lookup("/f").unwrap()].kind else { panic!() };
        assert_eq!(&d[10..12], &pattern(1, 10, 2)[..]);
        assert!(d[12..].iter().all(|&b| b == 0) && d[..10].iter().all(|&b| b == 0));
        m.apply(&Op::Open { path: p("/f"), handle: 1 }).unwrap();
        m.apply(&Op::Unlink { path: p("/f") }).unwrap();
        assert_eq!(m.nodes.len(), 2);
        m.apply(&Op::WriteHandle { handle: 1, off: 0, len: 3, pat: 2 }).unwrap();
        m.apply(&Op::Release { handle: 1 }).unwrap();
        assert_eq!(m.nodes.len(), 1);
        assert!(pattern(0, 0, 10000).iter().all(|&b| b != 0));
        assert_ne!(pattern(0, 0, 64), pattern(1, 0, 64));
        assert_ne!(pattern(0, 0, 64), pattern(0, 64, 64));
    }

    #[test]
    fn clone_semantics_and_errors() {
        let clone = |src: &str, off_in, dst: &str, off_out, len| Op::Clone {
            src: p(src),
            off_in,
            dst: p(dst),
            off_out,
            len,
        };
        let data = |m: &Model, path: &str| match &m.nodes[&m.lookup(path).unwrap()].kind {
            MKind::File(d) => d.clone(),
            _ => panic!("not a file"),
        };
        let mut m = Model::new();
        m.apply(&Op::Create { path: p("/a"), perm: 0o644 }).unwrap();
        m.apply(&Op::Create { path: p("/b"), perm: 0o644 }).unwrap();
        m.apply(&Op::Mkdir { path: p("/d"), perm: 0o755 }).unwrap();
        m.apply(&Op::Symlink { path: p("/s"), target: p("a") }).unwrap();
        m.apply(&Op::Write { path: p("/a"), off: 0, len: 10000, pat: 1 }).unwrap();
        // Types first (source, then destination), then offsets, then sizes.
        assert_eq!(m.apply(&clone("/x", 0, "/b", 0, 0)), Err(ENOENT));
        assert_eq!(m.apply(&clone("/d", 0, "/b", 0, 0)), Err(EISDIR));
        assert_eq!(m.apply(&clone("/s", 0, "/d", 0, 0)), Err(EINVAL));
        assert_eq!(m.apply(&clone("/a", 0, "/d", 0, 0)), Err(EISDIR));
        assert_eq!(m.apply(&clone("/a", 1, "/b", 0, 4096)), Err(EINVAL));
        assert_eq!(m.apply(&clone("/a", 0, "/b", 4095, 4096)), Err(EINVAL));
        assert_eq!(m.apply(&clone("/a", 12288, "/b", 0, 0)), Err(EINVAL));
        assert_eq!(m.apply(&clone("/a", 0, "/b", 0, 5000)), Err(EINVAL));
        assert_eq!(m.apply(&clone("/a", 0, "/a", 4096, 8192)), Err(EINVAL));
        assert_eq!(m.apply(&clone("/a", 0, "/b", (u64::MAX / 2) & !4095, 8192)), Err(libc::EFBIG));
        // len 0 at exactly the end of file: nothing, even into a directory's place.
        m.apply(&Op::Truncate { path: p("/b"), size: 8192 }).unwrap();
        let before = m.clone();
        m.apply(&clone("/b", 8192, "/a", 0, 0)).unwrap();
        assert_eq!(m, before);
        // To the end of file (unaligned), clamped; a partial last page may not land
        // inside the destination, but may end exactly at its end or past it.
        assert_eq!(m.apply(&clone("/a", 4096, "/b", 0, 0)), Err(EINVAL));
        m.apply(&clone("/a", 4096, "/b", 4096, 1 << 20)).unwrap();
        let b = data(&m, "/b");
        assert_eq!(b.len(), 4096 + 5904);
        assert_eq!(&b[4096..], &data(&m, "/a")[4096..]);
        assert!(b[..4096].iter().all(|&x| x == 0));
        // Within one file, whole pages apart; the destination grows, holes show.
        m.apply(&clone("/a", 0, "/a", 12288, 8192)).unwrap();
        let a = data(&m, "/a");
        assert_eq!(a.len(), 12288 + 8192);
        assert_eq!(a[..8192], a[12288..]);
        assert!(a[10000..12288].iter().all(|&x| x == 0));
        // Hard links are one file: overlap is refused through them too.
        m.apply(&Op::Link { from: p("/a"), to: p("/a2") }).unwrap();
        assert_eq!(m.apply(&clone("/a", 0, "/a2", 4096, 8192)), Err(EINVAL));
        m.apply(&clone("/a", 0, "/a2", 4096 * 8, 4096)).unwrap();
    }

    #[test]
    fn canon_diff_names_the_difference() {
        let mut a = Model::new();
        a.apply(&Op::Create { path: p("/x"), perm: 0o644 }).unwrap();
        let mut b = a.clone();
        assert_eq!(a.canon(false).diff(&b.canon(false)), None);
        b.apply(&Op::Chmod { path: p("/x"), perm: 0o600 }).unwrap();
        let d = a.canon(false).diff(&b.canon(false)).unwrap();
        assert!(d.contains("/x") && d.contains("mode"), "{d}");
        b.apply(&Op::Create { path: p("/y"), perm: 0o644 }).unwrap();
        assert!(a.canon(false).diff(&b.canon(false)).is_some());
    }
}
