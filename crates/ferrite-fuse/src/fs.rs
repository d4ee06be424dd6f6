//! The FUSE request handlers: every kernel request becomes one core operation.
//!
//! Invariants:
//! - The kernel caches entries, negative entries ("no such name") and attributes for
//!   `CACHE_TTL` (an hour) and is never shown a stale one. Every change to names and
//!   attributes that a plain process can make reaches the daemon through this kernel,
//!   which updates or drops its own caches as part of that request (the dentry moves
//!   or goes, the link count drops, the directory's and the file's attributes are
//!   marked stale after create, link, unlink, rename, write, fallocate, setxattr);
//!   direct-access clients create, rename and remove through the mount too. The only
//!   changes the kernel cannot see are the data writes and truncates of direct-access
//!   clients, and only through a handle they opened for writing (O_DIRECT, counted
//!   in [`DirectState`]). So: while a client has an inode open for writing, every
//!   reply carries a zero attribute time-to-live for it, and the kernel's cached
//!   attributes are dropped (notify_inval_inode, attributes only) when such a handle
//!   is opened (after counting it, before the reply) and when it is released. The
//!   coordination table's WRITERS flag says the same to clients: set with the first
//!   such handle (before the reply), cleared at the last release only after the
//!   kernel's attributes were dropped, under the lock of the counts.
//!   `-o nocache` gives every reply a zero time-to-live instead.
//! - Attributes of a reply that the kernel may cache are the core's caught-up ones
//!   (`Fs::getattr`, and `Fs::open` for lookups), never the daemon's possibly lagging
//!   view of an inode shared with direct-access clients.
//! - Invalidations are sent from inside handlers only for attributes: that takes no
//!   inode or page lock in the kernel (an entry invalidation takes the parent's
//!   lock and could deadlock against the request being served; none is needed).
//! - Durability is the core's: a reply is sent only after the core operation returned,
//!   and every core operation is durable when it returns. `flush` and `fsync` have
//!   nothing left to write: they answer ENOSYS, which the kernel treats as success
//!   and remembers, so later calls cost no round trip (the kernel still writes back
//!   its own dirty pages before, in writeback-cache mode and for mmap).
//! - Lookup counts follow [`crate::nodes`]: one core `open` pin per counted lookup and
//!   one per open file handle; `forget` and `release` drop them, so an unlinked file or
//!   removed directory stays usable while the kernel or a process still holds it, and
//!   is freed by the core at the last drop. Directory handles take no pin (the kernel
//!   keeps an open directory's inode, so its lookup count); where the kernel offers
//!   FUSE_NO_OPENDIR_SUPPORT, OPENDIR is answered ENOSYS once and never sent again.
//! - A panic inside a handler is caught: the request gets EIO, the core commits
//!   nothing more (later writes get EROFS; reads go on), and the final unmount skips
//!   the clean checkpoint (the next mount recovers from the logs instead of trusting
//!   DRAM state that a panic may have left half-updated).

use crate::nodes::{Node, NodeTable};
use ferrite_core::privs;
use ferrite_core::{
    Attr, DirEntry, Error, FallocMode, FileType, Fs, MmapMedium, NewNode, RenameFlags, SetAttr,
    SetTime, Ts, XattrSet,
};
use fuser::Notifier;
use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyCreate,
    ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long the kernel may keep an entry (name to node id), a negative entry (no such
/// name) or the attributes of an inode without asking. Exact invalidation makes any
/// length safe (see the module docs); an hour bounds the harm of a bug in that rule.
const CACHE_TTL: Duration = Duration::from_secs(3600);
/// Time-to-live of replies that must not be cached (`-o nocache`, and the attributes
/// of files a direct-access client may be writing).
const NO_TTL: Duration = Duration::ZERO;
/// Largest write the kernel may send (and copy_file_range chunk).
pub const MAX_WRITE: u32 = 1 << 20;
/// Directory entries read from the core per readdir batch.
const DIR_BATCH: usize = 256;

/// Behaviour switches of a mount.
#[derive(Clone, Copy, Debug, Default)]
pub struct FuseConfig {
    /// Offer FUSE_WRITEBACK_CACHE (writes buffered by the kernel until fsync/close).
    pub writeback_cache: bool,
    /// Open files with FOPEN_DIRECT_IO (no kernel page cache for data).
    pub direct_io: bool,
    /// Zero time-to-live for every entry and attribute reply (`-o nocache`).
    pub no_cache: bool,
    /// The kernel-daemon transport (`-o uring`, `-o nouring`).
    pub transport: crate::options::Transport,
}

/// The request kinds counted by [`Health`], in report order.
pub const OPS: &[&str] = &[
    "lookup",
    "forget",
    "getattr",
    "setattr",
    "readlink",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "symlink",
    "rename",
    "link",
    "open",
    "read",
    "write",
    "flush",
    "release",
    "fsync",
    "opendir",
    "readdir",
    "readdirplus",
    "releasedir",
    "fsyncdir",
    "statfs",
    "setxattr",
    "getxattr",
    "listxattr",
    "removexattr",
    "access",
    "create",
    "fallocate",
    "lseek",
    "copy_file_range",
];

/// Counters shared with the daemon: how the session ended and what it served.
#[derive(Debug)]
pub struct Health {
    /// A handler panicked: do not write the clean-unmount checkpoint.
    pub poisoned: AtomicBool,
    /// Requests served, per kind (indexed like [`OPS`]).
    pub counts: Vec<AtomicU64>,
    /// Attribute invalidations sent to the kernel (`inval=N` in the summary).
    pub invalidations: AtomicU64,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            poisoned: AtomicBool::new(false),
            counts: OPS.iter().map(|_| AtomicU64::new(0)).collect(),
            invalidations: AtomicU64::new(0),
        }
    }
}

impl Health {
    /// "kind=count" for every kind served at least once.
    pub fn summary(&self) -> String {
        let inval = [("inval", &self.invalidations)];
        OPS.iter()
            .zip(&self.counts)
            .chain(inval.iter().map(|(n, c)| (n, *c)))
            .filter_map(|(name, c)| {
                let n = c.load(Ordering::Relaxed);
                (n > 0).then(|| format!("{name}={n}"))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A FerriteFS pool served over FUSE.
pub struct FerriteFuse {
    fs: Arc<Fs<MmapMedium>>,
    nodes: NodeTable,
    handles: Mutex<HashMap<u64, Handle>>,
    next_fh: AtomicU64,
    cfg: FuseConfig,
    health: Arc<Health>,
    direct: Option<DirectState>,
    notifier: Arc<OnceLock<Notifier>>,
    /// The kernel takes ENOSYS from OPENDIR as "directory handles need nothing" and
    /// sends no more OPENDIR or RELEASEDIR (FUSE_NO_OPENDIR_SUPPORT, Linux 5.1).
    zero_message_opendir: bool,
    /// Set at INIT when requests will travel over io_uring (see [`Self::uring_slot`]).
    uring: Arc<AtomicBool>,
}

/// An open file or directory handle.
#[derive(Clone, Copy)]
struct Handle {
    /// Core inode.
    ino: u64,
    /// The kernel's node id of it (for invalidations).
    nodeid: u64,
    kind: OpenKind,
}

/// How a file handle uses the kernel's page cache (see [`DirectState`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum OpenKind {
    /// A directory, or no direct access on this mount.
    Untracked,
    /// A plain open served through the page cache.
    Cached,
    /// An open that bypasses the page cache (O_DIRECT, or FOPEN_DIRECT_IO).
    Uncached,
    /// A direct-access client's open for writing (marked with O_DIRECT).
    DirectWriter,
}

/// Open handles of a file, by kind.
#[derive(Default)]
struct OpenCount {
    total: u32,
    cached: u32,
    direct_writers: u32,
}

/// Direct access served beside the mount: what a client reads from the root's
/// [`ferrite_direct::INFO_XATTR`], and the rule that keeps the kernel's page cache
/// true while clients write the pool themselves. A file is never both cached by the
/// kernel and written directly: a plain open gets the page cache only while no
/// client has the file open for writing (else FOPEN_DIRECT_IO), and while plain
/// cached opens exist the table's NO_DIRECT flag sends clients' writes through the
/// mount. Clients mark their write opens with O_DIRECT (which also keeps their own
/// kernel handle out of the page cache).
pub struct DirectState {
    info: Vec<u8>,
    table: Arc<ferrite_core::Table>,
    opens: Mutex<HashMap<u64, OpenCount>>,
}

impl DirectState {
    /// For a server's offer and table.
    pub fn new(info: String, table: Arc<ferrite_core::Table>) -> DirectState {
        DirectState { info: info.into_bytes(), table, opens: Mutex::new(HashMap::new()) }
    }
}

fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

fn ts_to_system(t: Ts) -> SystemTime {
    if t.sec >= 0 {
        UNIX_EPOCH + Duration::new(t.sec as u64, t.nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.sec.unsigned_abs()) + Duration::from_nanos(t.nsec as u64)
    }
}

fn system_to_ts(t: SystemTime) -> Ts {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Ts { sec: d.as_secs() as i64, nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let (mut sec, mut nsec) = (-(d.as_secs() as i64), 0u32);
            if d.subsec_nanos() > 0 {
                sec -= 1;
                nsec = 1_000_000_000 - d.subsec_nanos();
            }
            Ts { sec, nsec }
        }
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(s) => SetTime::At(system_to_ts(s)),
    }
}

fn kind(t: FileType) -> fuser::FileType {
    match t {
        FileType::Regular => fuser::FileType::RegularFile,
        FileType::Directory => fuser::FileType::Directory,
        FileType::Symlink => fuser::FileType::Symlink,
        FileType::Fifo => fuser::FileType::NamedPipe,
        FileType::CharDevice => fuser::FileType::CharDevice,
        FileType::BlockDevice => fuser::FileType::BlockDevice,
        FileType::Socket => fuser::FileType::Socket,
    }
}

fn file_attr(nodeid: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(nodeid),
        size: a.size,
        blocks: a.blocks,
        atime: ts_to_system(a.atime),
        mtime: ts_to_system(a.mtime),
        ctime: ts_to_system(a.ctime),
        crtime: ts_to_system(a.ctime),
        kind: kind(a.ftype),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

/// Debug builds only (tests): `FERRITE_TEST_PANIC_IN=OP` makes every request of kind
/// OP panic inside its handler, to exercise the panic path end to end.
#[cfg(debug_assertions)]
fn injected_panic(what: &str) -> bool {
    static AT: OnceLock<Option<String>> = OnceLock::new();
    AT.get_or_init(|| std::env::var("FERRITE_TEST_PANIC_IN").ok()).as_deref() == Some(what)
}

/// The attributes of a negative entry reply (node id 0: "no such name").
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: fuser::FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

type R<T> = std::result::Result<T, Errno>;

impl FerriteFuse {
    /// Serve `fs`.
    pub fn new(fs: Arc<Fs<MmapMedium>>, cfg: FuseConfig, health: Arc<Health>) -> FerriteFuse {
        let root_gen = fs.getattr(fs.root()).map(|a| a.generation).unwrap_or(0);
        FerriteFuse {
            fs,
            nodes: NodeTable::new(root_gen),
            handles: Mutex::new(HashMap::new()),
            next_fh: AtomicU64::new(1),
            cfg,
            health,
            direct: None,
            notifier: Arc::new(OnceLock::new()),
            zero_message_opendir: false,
            uring: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Whether the session serves requests over io_uring (known after INIT).
    pub fn uring_slot(&self) -> Arc<AtomicBool> {
        self.uring.clone()
    }

    /// Where the daemon puts the session's notifier once the session exists
    /// (invalidations are sent through it; before it is set there is nothing cached).
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// Time-to-live of entries and negative entries.
    fn entry_ttl(&self) -> Duration {
        if self.cfg.no_cache {
            NO_TTL
        } else {
            CACHE_TTL
        }
    }

    /// Time-to-live of the attributes of core inode `ino`: zero while a direct-access
    /// client has it open for writing (its writes change size and times without the
    /// kernel seeing them).
    fn attr_ttl(&self, ino: u64) -> Duration {
        if self.cfg.no_cache || self.direct_writing(ino) {
            return NO_TTL;
        }
        CACHE_TTL
    }

    /// [`Self::attr_ttl`] of the inode a node id names.
    fn node_attr_ttl(&self, nodeid: u64) -> Duration {
        match self.nodes.get(nodeid) {
            Some(n) => self.attr_ttl(n.ino),
            None => NO_TTL,
        }
    }

    /// Answer an entry request (lookup, mknod, mkdir, symlink, link) for `fa`.
    fn reply_entry(&self, reply: ReplyEntry, fa: &FileAttr, generation: u64) {
        let attr_ttl = self.node_attr_ttl(fa.ino.0);
        reply.entry_with_ttls(&attr_ttl, &self.entry_ttl(), fa, Generation(generation))
    }

    /// Does a direct-access client have `ino` open for writing?
    fn direct_writing(&self, ino: u64) -> bool {
        self.direct
            .as_ref()
            .is_some_and(|d| d.opens.lock().get(&ino).is_some_and(|c| c.direct_writers > 0))
    }

    /// Make the kernel drop its cached attributes of `nodeid` (not its page cache),
    /// before the reply to the request being served. Safe inside a handler: an
    /// attribute-only invalidation takes no inode lock or page lock in the kernel; it
    /// bumps the inode's attribute version, so a reply computed earlier and delivered
    /// later cannot bring old attributes back.
    fn inval_attrs(&self, nodeid: u64) {
        if self.cfg.no_cache {
            return;
        }
        if let Some(n) = self.notifier.get() {
            self.health.invalidations.fetch_add(1, Ordering::Relaxed);
            // ENOENT (the kernel does not hold the inode) is no error for fuser.
            if let Err(e) = n.inval_inode(INodeNo(nodeid), -1, 0) {
                eprintln!("ferrite: invalidating the attributes of node {nodeid}: {e}");
            }
        }
    }

    /// Serve direct access beside the mount.
    pub fn with_direct(mut self, d: DirectState) -> FerriteFuse {
        self.direct = Some(d);
        self
    }

    /// Page-cache use of a new handle of file `ino` opened with `flags`: its kind
    /// and the FOPEN flags of the reply. `created`: the handle comes with a
    /// CREATE reply, whose entry is a lookup the kernel has not seen yet.
    fn open_kind(
        &self,
        ino: u64,
        nodeid: u64,
        flags: i32,
        created: bool,
    ) -> (OpenKind, FopenFlags) {
        let Some(d) = &self.direct else { return (OpenKind::Untracked, self.open_flags()) };
        let mut opens = d.opens.lock();
        let c = opens.entry(ino).or_default();
        c.total += 1;
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if flags & libc::O_DIRECT != 0 {
            if write {
                c.direct_writers += 1;
                if c.direct_writers == 1 {
                    // Before the reply: clients stat it from the pool from now on.
                    d.table.set_flag(ino, ferrite_core::share::WRITERS, true);
                }
                drop(opens);
                // Counted first, so replies from now on carry no attribute TTL; then
                // what the kernel cached before goes (it will change under it). A
                // create whose own entry is the node's only lookup, counted after
                // the writer, has nothing cached to drop: the kernel holds no inode
                // of the node (each entry reply counts one lookup, and one counted
                // from now on carries no TTL), so the notification would only come
                // back ENOENT (one system call per direct create).
                if !(created && self.nodes.lookups(nodeid) == 1) {
                    self.inval_attrs(nodeid);
                }
                return (OpenKind::DirectWriter, FopenFlags::empty());
            }
            return (OpenKind::Uncached, FopenFlags::empty());
        }
        if self.cfg.direct_io || c.direct_writers > 0 {
            return (OpenKind::Uncached, FopenFlags::FOPEN_DIRECT_IO);
        }
        c.cached += 1;
        if c.cached == 1 {
            d.table.set_flag(ino, ferrite_core::share::NO_DIRECT, true);
        }
        (OpenKind::Cached, FopenFlags::empty())
    }

    /// The handle `h` is gone.
    fn close_kind(&self, h: Handle) {
        let Some(d) = &self.direct else { return };
        if h.kind == OpenKind::Untracked {
            return;
        }
        let mut opens = d.opens.lock();
        let Some(c) = opens.get_mut(&h.ino) else { return };
        c.total -= 1;
        match h.kind {
            OpenKind::Cached => {
                c.cached -= 1;
                if c.cached == 0 {
                    d.table.set_flag(h.ino, ferrite_core::share::NO_DIRECT, false);
                }
            }
            OpenKind::DirectWriter => c.direct_writers -= 1,
            _ => {}
        }
        let last_writer = h.kind == OpenKind::DirectWriter && c.direct_writers == 0;
        if c.total == 0 {
            // No handle left: no shared mapping of it is left either.
            d.table.set_flag(h.ino, ferrite_core::share::MAPPED, false);
            opens.remove(&h.ino);
        }
        if h.kind == OpenKind::DirectWriter {
            // The client may have written through this handle: whatever the kernel
            // holds (replies carried no TTL meanwhile, but a late one may) is dropped.
            // The last writer's flag goes only after that, and under the lock, so a
            // writer opening meanwhile keeps it: while it is clear, a stat through
            // the kernel is current.
            self.inval_attrs(h.nodeid);
            if last_writer {
                d.table.set_flag(h.ino, ferrite_core::share::WRITERS, false);
            }
        }
    }

    /// Run a handler, turning a panic into EIO (the reply, dropped unsent, says EIO)
    /// and marking the session poisoned.
    fn guard(&self, what: &str, f: impl FnOnce()) {
        debug_assert!(OPS.contains(&what), "{what} is not counted");
        if let Some(i) = OPS.iter().position(|o| *o == what) {
            self.health.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        let run = || {
            #[cfg(debug_assertions)]
            if injected_panic(what) {
                panic!("panic injected in {what} (FERRITE_TEST_PANIC_IN)");
            }
            f()
        };
        if catch_unwind(AssertUnwindSafe(run)).is_err() {
            self.health.poisoned.store(true, Ordering::SeqCst);
            eprintln!("ferrite: internal error (panic) in {what}; answered EIO, pool will be recovered at next mount");
            // DRAM state may be half-updated: commit nothing more on it.
            self.fs.stop_commits(&format!("internal error (panic) in {what}"));
        }
    }

    fn log_corrupt(&self, what: &str, e: &Error) {
        if matches!(e, Error::Corrupt(_) | Error::Io { .. }) {
            eprintln!("ferrite: {what}: {e}");
        }
    }

    fn err(&self, what: &str, e: Error) -> Errno {
        self.log_corrupt(what, &e);
        errno(&e)
    }

    /// The core inode a node id names (pinned, so it still exists).
    fn node(&self, nodeid: INodeNo) -> R<Node> {
        self.nodes.get(nodeid.0).ok_or(Errno::ENOENT)
    }

    fn ino(&self, nodeid: INodeNo) -> R<u64> {
        self.node(nodeid).map(|n| n.ino)
    }

    /// Count a lookup of `a` for the kernel (pinning the inode); returns the reply
    /// attributes. `a` must describe an inode that existed a moment ago.
    fn remember(&self, a: Attr) -> R<FileAttr> {
        let pinned = self.fs.open(a.ino).map_err(|e| self.err("open", e))?;
        if pinned.generation != a.generation {
            // Freed and reused between the operation and the pin.
            let _ = self.fs.release(a.ino);
            return Err(Errno::ENOENT);
        }
        let id = self.nodes.add(a.ino, a.generation);
        Ok(file_attr(id, &pinned))
    }

    /// Look `name` up in `dir` and count the lookup.
    fn lookup_entry(&self, dir: u64, name: &[u8]) -> R<FileAttr> {
        for _ in 0..16 {
            let ino = self.fs.lookup_ino(dir, name).map_err(|e| self.err("lookup", e))?;
            let pinned = match self.fs.open(ino) {
                Ok(p) => p,
                Err(Error::NotFound) => continue,
                Err(e) => return Err(self.err("open", e)),
            };
            // Pinned now: if the name still leads here, the pair is a valid answer.
            if self.fs.lookup_ino(dir, name).ok() != Some(ino) {
                let _ = self.fs.release(ino);
                continue;
            }
            let id = self.nodes.add(ino, pinned.generation);
            return Ok(file_attr(id, &pinned));
        }
        Err(Errno::EAGAIN)
    }

    fn add_handle(&self, ino: u64, nodeid: u64) -> u64 {
        self.add_handle_kind(ino, nodeid, OpenKind::Untracked)
    }

    fn add_handle_kind(&self, ino: u64, nodeid: u64, kind: OpenKind) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Handle { ino, nodeid, kind });
        fh
    }

    /// FSYNC / FSYNCDIR: everything is durable already (the core fences now). ENOSYS
    /// counts as success and the kernel stops sending these requests, after writing
    /// back its own dirty pages each time (the same as the reply would have been).
    fn sync_reply(&self, ino: INodeNo, datasync: bool, reply: ReplyEmpty) {
        match self
            .ino(ino)
            .and_then(|i| self.fs.fsync(i, datasync).map_err(|e| self.err("fsync", e)))
        {
            Ok(()) => reply.error(Errno::ENOSYS),
            Err(e) => reply.error(e),
        }
    }

    /// RELEASE / RELEASEDIR: drop the handle and its core open pin.
    fn close_handle(&self, what: &str, fh: FileHandle, reply: ReplyEmpty) {
        let h = self.handles.lock().remove(&fh.0);
        if let Some(h) = h {
            self.close_kind(h);
        }
        match h.map(|h| h.ino) {
            Some(i) => match self.fs.release(i) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(self.err(what, e)),
            },
            None => reply.error(Errno::EBADF),
        }
    }

    fn open_flags(&self) -> FopenFlags {
        if self.cfg.direct_io {
            FopenFlags::FOPEN_DIRECT_IO
        } else {
            FopenFlags::empty()
        }
    }

    /// Directory entries after `offset`, collected without holding core locks while
    /// replying.
    fn dir_batch(&self, ino: u64, offset: u64) -> R<Vec<DirEntry>> {
        let mut v = Vec::new();
        self.fs
            .readdir(ino, offset, |e| {
                v.push(e);
                v.len() < DIR_BATCH
            })
            .map_err(|e| self.err("readdir", e))?;
        Ok(v)
    }

    fn create_file(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
    ) -> R<(FileAttr, Attr)> {
        let dir = self.ino(parent)?;
        // The core applies a set-group-id directory's group, and the umask or the
        // directory's default ACL (FUSE_DONT_MASK: the kernel leaves both to us).
        let node = NewNode {
            parent: dir,
            name: name.as_bytes(),
            dir: false,
            uid: req.uid(),
            gid: req.gid(),
        };
        match self.fs.make_masked(node, mode & 0o7777, umask) {
            Ok(a) => Ok((self.remember(a)?, a)),
            Err(Error::Exists) if flags & libc::O_EXCL == 0 => {
                // Created by someone else since the kernel's lookup: open it instead.
                let fa = self.lookup_entry(dir, name.as_bytes())?;
                let node = self.nodes.get(fa.ino.0).ok_or(Errno::ENOENT)?;
                let forget = |this: &Self| this.drop_lookups(fa.ino.0, 1);
                if fa.kind == fuser::FileType::Directory {
                    forget(self);
                    return Err(Errno::EISDIR);
                }
                if flags & libc::O_TRUNC != 0 {
                    let lacks = || privs::lacks_cap_fsetid(req.pid());
                    let ch = SetAttr { size: Some(0), ..Default::default() };
                    if let Err(e) = self.fs.setattr_as(node.ino, &ch, lacks) {
                        forget(self);
                        return Err(self.err("truncate", e));
                    }
                }
                let a = self.fs.getattr(node.ino).map_err(|e| self.err("getattr", e))?;
                Ok((file_attr(fa.ino.0, &a), a))
            }
            Err(e) => Err(self.err("create", e)),
        }
    }

    fn do_setattr(
        &self,
        nodeid: INodeNo,
        ch: &SetAttr,
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> R<(FileAttr, Duration)> {
        let n = self.node(nodeid)?;
        let a = self.fs.setattr_as(n.ino, ch, lacks_fsetid).map_err(|e| self.err("setattr", e))?;
        Ok((file_attr(nodeid.0, &a), self.attr_ttl(n.ino)))
    }

    fn do_read(&self, nodeid: INodeNo, offset: u64, size: u32) -> R<Vec<u8>> {
        let ino = self.ino(nodeid)?;
        let mut buf = vec![0u8; size.min(MAX_WRITE * 4) as usize];
        let n = self.fs.read(ino, offset, &mut buf).map_err(|e| self.err("read", e))?;
        buf.truncate(n);
        Ok(buf)
    }

    fn readdir_plus(&self, dir: u64, offset: u64, reply: &mut ReplyDirectoryPlus) -> R<()> {
        let mut after = offset;
        loop {
            let batch = self.dir_batch(dir, after)?;
            if batch.is_empty() {
                return Ok(());
            }
            for e in &batch {
                after = e.cookie;
                let name = OsStr::from_bytes(&e.name);
                if e.name == b"." || e.name == b".." {
                    // The kernel takes no lookup count for these.
                    let Ok(a) = self.fs.getattr(e.ino) else { continue };
                    let id = self.nodes.nodeid_of(a.ino, a.generation).unwrap_or(a.ino);
                    let fa = file_attr(id, &a);
                    let ttl = self.attr_ttl(a.ino);
                    if reply.add(INodeNo(id), e.cookie, name, &ttl, &fa, Generation(a.generation)) {
                        return Ok(());
                    }
                    continue;
                }
                // By name, like a lookup: pinned, and still under that name.
                let fa = match self.lookup_entry(dir, &e.name) {
                    Ok(fa) => fa,
                    Err(_) => continue, // removed meanwhile
                };
                let generation = self.gen_of(fa.ino.0);
                // One time-to-live for the entry and the attributes here: the shorter.
                let ttl = self.node_attr_ttl(fa.ino.0).min(self.entry_ttl());
                if reply.add(fa.ino, e.cookie, name, &ttl, &fa, Generation(generation)) {
                    // Did not fit: the kernel never saw it, so undo the count.
                    self.drop_lookups(fa.ino.0, 1);
                    return Ok(());
                }
            }
        }
    }

    fn drop_lookups(&self, nodeid: u64, n: u64) {
        if let Some((node, k)) = self.nodes.forget(nodeid, n) {
            for _ in 0..k {
                let _ = self.fs.release(node.ino);
            }
        }
    }
}

impl Filesystem for FerriteFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_background(64);
        for f in [
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_READDIRPLUS_AUTO,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_ASYNC_DIO,
            // A symlink's target never changes: the kernel may keep it.
            InitFlags::FUSE_CACHE_SYMLINKS,
            // POSIX ACLs: the kernel enforces them from system.posix_acl_access;
            // the core keeps the mode in step and makes new nodes inherit default
            // ACLs, which needs the umask unapplied (FUSE_DONT_MASK).
            InitFlags::FUSE_POSIX_ACL,
            InitFlags::FUSE_DONT_MASK,
            // The core clears set-user-id, set-group-id and file capabilities on
            // write, truncate and chown (`ferrite_core::privs`): the kernel stops
            // asking for security.capability before every write (SB_NOSEC).
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ] {
            let _ = config.add_capabilities(f);
        }
        self.zero_message_opendir =
            config.add_capabilities(InitFlags::FUSE_NO_OPENDIR_SUPPORT).is_ok();
        // FUSE over io_uring (fuser patched in vendor/fuser): the kernel offers it
        // only with the fuse module's enable_uring on.
        if self.cfg.transport != crate::options::Transport::Classic {
            // An io_uring that this process may not use (kernel.io_uring_disabled,
            // seccomp) must not be asked for: the kernel would wait for its rings.
            let usable = fuser::uring_usable();
            let offered = usable && config.add_capabilities(InitFlags::FUSE_OVER_IO_URING).is_ok();
            if !offered && self.cfg.transport == crate::options::Transport::Uring {
                return Err(std::io::Error::other(if usable {
                    "the kernel does not offer FUSE over io_uring (needs Linux 6.14+ \
                     built with CONFIG_FUSE_IO_URING and the fuse module's enable_uring \
                     on; mount without -o uring to use /dev/fuse)"
                } else {
                    "io_uring is not usable by this process (kernel.io_uring_disabled or \
                     a seccomp filter); mount without -o uring to use /dev/fuse"
                }));
            }
            self.uring.store(offered, Ordering::Relaxed);
        }
        if self.direct.is_some() || self.cfg.direct_io {
            // Plain processes given FOPEN_DIRECT_IO may still map files shared.
            let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        }
        if self.cfg.writeback_cache {
            config.add_capabilities(InitFlags::FUSE_WRITEBACK_CACHE).map_err(|_| {
                std::io::Error::other("the kernel does not offer FUSE_WRITEBACK_CACHE")
            })?;
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.guard("lookup", || {
            match self.ino(parent).and_then(|d| self.lookup_entry(d, name.as_bytes())) {
                Ok(fa) => self.reply_entry(reply, &fa, self.gen_of(fa.ino.0)),
                Err(Errno::ENOENT) if !self.cfg.no_cache => {
                    // A negative entry the kernel may keep: every name is made through
                    // this kernel (direct-access clients create through the mount too),
                    // which turns its negative dentry positive itself.
                    reply.entry_with_ttls(
                        &NO_TTL,
                        &self.entry_ttl(),
                        &negative_attr(),
                        Generation(0),
                    )
                }
                Err(e) => reply.error(e),
            }
        })
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.guard("forget", || self.drop_lookups(ino.0, nlookup))
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.guard("getattr", || {
            let r = self.nodes.get(ino.0).ok_or(Errno::ENOENT).and_then(|n| {
                match self.fs.getattr(n.ino) {
                    Ok(a) if a.generation == n.generation => {
                        Ok((file_attr(ino.0, &a), self.attr_ttl(n.ino)))
                    }
                    Ok(_) | Err(Error::NotFound) => Err(Errno::ENOENT),
                    Err(e) => Err(self.err("getattr", e)),
                }
            });
            match r {
                Ok((fa, ttl)) => reply.attr(&ttl, &fa),
                Err(e) => reply.error(e),
            }
        })
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        self.guard("setattr", || {
            // Under FUSE_HANDLE_KILLPRIV_V2 set-user-id and set-group-id are cleared
            // by the core (`Fs::setattr_as`), which asks whether the caller lacks
            // CAP_FSETID only of a truncate or an empty change to a file with such a
            // bit. A truncate: the kernel says so with FATTR_KILL_SUIDGID, which fuser
            // 0.18 does not pass on, so the caller's capabilities are read. An empty
            // SETATTR is chown(-1, -1), which clears them for any caller, or the
            // kernel's remove-privileges request before a buffered write, sent when
            // the writer lacks CAP_FSETID or the file has capabilities (which the
            // kernel has removed by then): the two cannot be told apart, so the bits
            // go. (Left: a root write to a set-user-id file with capabilities
            // clears set-user-id, where Linux keeps it.)
            let ch = SetAttr {
                perm: mode.map(|m| m & 0o7777),
                uid,
                gid,
                size,
                atime: atime.map(set_time),
                mtime: mtime.map(set_time),
            };
            let empty = ch == SetAttr::default();
            let lacks = move || empty || privs::lacks_cap_fsetid(req.pid());
            match self.do_setattr(ino, &ch, lacks) {
                Ok((fa, ttl)) => reply.attr(&ttl, &fa),
                Err(e) => reply.error(e),
            }
        })
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.guard("readlink", || {
            match self
                .ino(ino)
                .and_then(|i| self.fs.readlink(i).map_err(|e| self.err("readlink", e)))
            {
                Ok(t) => reply.data(&t),
                Err(e) => reply.error(e),
            }
        })
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        self.guard("mknod", || {
            if mode & libc::S_IFMT == libc::S_IFREG || mode & libc::S_IFMT == 0 {
                return match self.create_file(req, parent, name, mode, umask, libc::O_EXCL) {
                    Ok((fa, a)) => self.reply_entry(reply, &fa, a.generation),
                    Err(e) => reply.error(e),
                };
            }
            // A FIFO, socket or device node: the daemon stores it, the kernel runs it.
            let Some(t) = FileType::from_mode(mode) else { return reply.error(Errno::EINVAL) };
            let r = self.ino(parent).and_then(|dir| {
                let (uid, gid) = (req.uid(), req.gid());
                let node = NewNode { parent: dir, name: name.as_bytes(), dir: false, uid, gid };
                let a = self
                    .fs
                    .mknod(node, t, mode & 0o7777, rdev, umask)
                    .map_err(|e| self.err("mknod", e))?;
                Ok((self.remember(a)?, a))
            });
            match r {
                Ok((fa, a)) => self.reply_entry(reply, &fa, a.generation),
                Err(e) => reply.error(e),
            }
        })
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        self.guard("mkdir", || {
            let r = self.ino(parent).and_then(|dir| {
                let (uid, gid) = (req.uid(), req.gid());
                let node = NewNode { parent: dir, name: name.as_bytes(), dir: true, uid, gid };
                let a = self
                    .fs
                    .make_masked(node, mode & 0o7777, umask)
                    .map_err(|e| self.err("mkdir", e))?;
                Ok((self.remember(a)?, a))
            });
            match r {
                Ok((fa, a)) => self.reply_entry(reply, &fa, a.generation),
                Err(e) => reply.error(e),
            }
        })
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("unlink", || {
            match self
                .ino(parent)
                .and_then(|d| self.fs.unlink(d, name.as_bytes()).map_err(|e| self.err("unlink", e)))
            {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("rmdir", || {
            match self
                .ino(parent)
                .and_then(|d| self.fs.rmdir(d, name.as_bytes()).map_err(|e| self.err("rmdir", e)))
            {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        self.guard("symlink", || {
            let r = self.ino(parent).and_then(|dir| {
                let gid = req.gid();
                let a = self
                    .fs
                    .symlink(
                        dir,
                        link_name.as_bytes(),
                        target.as_os_str().as_bytes(),
                        req.uid(),
                        gid,
                    )
                    .map_err(|e| self.err("symlink", e))?;
                Ok((self.remember(a)?, a))
            });
            match r {
                Ok((fa, a)) => self.reply_entry(reply, &fa, a.generation),
                Err(e) => reply.error(e),
            }
        })
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: fuser::RenameFlags,
        reply: ReplyEmpty,
    ) {
        self.guard("rename", || {
            let known = fuser::RenameFlags::RENAME_NOREPLACE | fuser::RenameFlags::RENAME_EXCHANGE;
            if !known.contains(flags) {
                // RENAME_WHITEOUT needs character-device whiteouts, not in the format.
                return reply.error(Errno::EINVAL);
            }
            let f = RenameFlags {
                noreplace: flags.contains(fuser::RenameFlags::RENAME_NOREPLACE),
                exchange: flags.contains(fuser::RenameFlags::RENAME_EXCHANGE),
            };
            let r = self.ino(parent).and_then(|sp| {
                let dp = self.ino(newparent)?;
                self.fs
                    .rename(sp, name.as_bytes(), dp, newname.as_bytes(), f)
                    .map_err(|e| self.err("rename", e))
            });
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.guard("link", || {
            let r = self.ino(ino).and_then(|i| {
                let dir = self.ino(newparent)?;
                let a =
                    self.fs.link(i, dir, newname.as_bytes()).map_err(|e| self.err("link", e))?;
                Ok((self.remember(a)?, a))
            });
            match r {
                Ok((fa, a)) => self.reply_entry(reply, &fa, a.generation),
                Err(e) => reply.error(e),
            }
        })
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        self.guard("open", || {
            let r = self.node(ino).and_then(|n| {
                let a = self.fs.open(n.ino).map_err(|e| self.err("open", e))?;
                if a.ftype == FileType::Directory {
                    let _ = self.fs.release(n.ino);
                    return Err(Errno::EISDIR);
                }
                let (kind, fl) = self.open_kind(n.ino, ino.0, flags.0, false);
                Ok((self.add_handle_kind(n.ino, ino.0, kind), fl))
            });
            match r {
                Ok((fh, fl)) => reply.opened(FileHandle(fh), fl),
                Err(e) => reply.error(e),
            }
        })
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.guard("read", || match self.do_read(ino, offset, size) {
            Ok(buf) => reply.data(&buf),
            Err(e) => reply.error(e),
        })
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.guard("write", || {
            let r = self.ino(ino).and_then(|i| {
                let append = flags.0 & libc::O_APPEND != 0
                    && !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
                // FUSE_HANDLE_KILLPRIV_V2: the kernel says whether the writer lacks
                // CAP_FSETID; the core clears what that takes away.
                let kill = || write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
                if append {
                    self.fs.append_as(i, data, kill).map(|_| data.len())
                } else {
                    self.fs.write_as(i, offset, data, kill)
                }
                .map_err(|e| self.err("write", e))
            });
            match r {
                Ok(n) => reply.written(n as u32),
                Err(e) => reply.error(e),
            }
        })
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Every write is durable when it returned: nothing to flush. ENOSYS tells the
        // kernel so; it counts as success and the kernel stops sending FLUSH (it still
        // writes back its own dirty pages first, in writeback-cache mode).
        self.guard("flush", || reply.error(Errno::ENOSYS))
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.guard("release", || self.close_handle("release", fh, reply))
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.guard("fsync", || self.sync_reply(ino, datasync, reply))
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        self.guard("opendir", || {
            if self.zero_message_opendir {
                // A directory handle holds nothing here: readdir and fsyncdir name the
                // directory by node id, and the kernel's lookup count (one core pin,
                // see `nodes`) keeps an open directory alive after rmdir until its
                // last close. ENOSYS: the kernel opens directories without asking.
                return match self.node(ino) {
                    Ok(_) => reply.error(Errno::ENOSYS),
                    Err(e) => reply.error(e),
                };
            }
            let r = self.node(ino).and_then(|n| {
                let a = self.fs.open(n.ino).map_err(|e| self.err("open", e))?;
                if a.ftype != FileType::Directory {
                    let _ = self.fs.release(n.ino);
                    return Err(Errno::ENOTDIR);
                }
                Ok(self.add_handle(n.ino, ino.0))
            });
            match r {
                Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
                Err(e) => reply.error(e),
            }
        })
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.guard("releasedir", || self.close_handle("releasedir", fh, reply))
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        self.guard("readdir", || {
            let dir = match self.ino(ino) {
                Ok(d) => d,
                Err(e) => return reply.error(e),
            };
            let mut after = offset;
            loop {
                let batch = match self.dir_batch(dir, after) {
                    Ok(b) => b,
                    Err(e) => return reply.error(e),
                };
                if batch.is_empty() {
                    break;
                }
                for e in &batch {
                    let name = OsStr::from_bytes(&e.name);
                    if reply.add(INodeNo(e.ino), e.cookie, kind(e.ftype), name) {
                        return reply.ok();
                    }
                    after = e.cookie;
                }
            }
            reply.ok()
        })
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        self.guard("readdirplus", || {
            match self.ino(ino).and_then(|d| self.readdir_plus(d, offset, &mut reply)) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.guard("fsyncdir", || self.sync_reply(ino, datasync, reply))
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.guard("statfs", || {
            let s = self.fs.statfs();
            reply.statfs(
                s.blocks,
                s.bfree,
                s.bavail,
                s.files,
                s.ffree,
                s.bsize as u32,
                s.namelen as u32,
                s.bsize as u32,
            )
        })
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        self.guard("setxattr", || {
            if position != 0 {
                return reply.error(Errno::EINVAL);
            }
            let how = match flags {
                0 => XattrSet::Any,
                libc::XATTR_CREATE => XattrSet::Create,
                libc::XATTR_REPLACE => XattrSet::Replace,
                _ => return reply.error(Errno::EINVAL),
            };
            let r = self.ino(ino).and_then(|i| {
                self.fs
                    .setxattr(i, name.as_bytes(), value, how)
                    .map_err(|e| self.err("setxattr", e))
            });
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        self.guard("getxattr", || {
            let r = self.ino(ino).and_then(|i| {
                if let Some(d) = self.direct.as_ref().filter(|_| i == self.fs.root()) {
                    if name.as_bytes() == ferrite_direct::INFO_XATTR.as_bytes() {
                        return Ok(d.info.clone());
                    }
                }
                self.fs.getxattr(i, name.as_bytes()).map_err(|e| self.err("getxattr", e))
            });
            match r {
                Ok(v) if size == 0 => reply.size(v.len() as u32),
                Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
                Ok(v) => reply.data(&v),
                Err(e) => reply.error(e),
            }
        })
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        self.guard("listxattr", || {
            let r = self
                .ino(ino)
                .and_then(|i| self.fs.listxattr(i).map_err(|e| self.err("listxattr", e)));
            match r {
                Ok(names) => {
                    let mut buf = Vec::new();
                    for n in names {
                        buf.extend_from_slice(&n);
                        buf.push(0);
                    }
                    if size == 0 {
                        reply.size(buf.len() as u32)
                    } else if buf.len() > size as usize {
                        reply.error(Errno::ERANGE)
                    } else {
                        reply.data(&buf)
                    }
                }
                Err(e) => reply.error(e),
            }
        })
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.guard("removexattr", || {
            let r = self.ino(ino).and_then(|i| {
                self.fs.removexattr(i, name.as_bytes()).map_err(|e| self.err("removexattr", e))
            });
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // Only reached without default_permissions, which is always set; existence is
        // all there is to check here.
        self.guard("access", || match self.ino(ino) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(e),
        })
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        self.guard("create", || {
            let r = self.create_file(req, parent, name, mode, umask, flags).and_then(|(fa, a)| {
                match self.fs.open(a.ino) {
                    Ok(_) => {
                        let (kind, fl) = self.open_kind(a.ino, fa.ino.0, flags, true);
                        Ok((fa, a, self.add_handle_kind(a.ino, fa.ino.0, kind), fl))
                    }
                    Err(e) => {
                        self.drop_lookups(fa.ino.0, 1);
                        Err(self.err("open", e))
                    }
                }
            });
            match r {
                Ok((fa, a, fh, fl)) => {
                    // The entry lives as long as any other (names change only
                    // through this kernel); the attributes not at all while a
                    // direct-access client writes the file. One time-to-live for
                    // both gave a direct create an entry that expired at once, so
                    // the next path walk to it asked the daemon again (LOOKUP).
                    let (attr_ttl, entry_ttl) = (self.attr_ttl(a.ino), self.entry_ttl());
                    let g = Generation(a.generation);
                    reply.created_with_ttls(&attr_ttl, &entry_ttl, &fa, g, FileHandle(fh), fl)
                }
                Err(e) => reply.error(e),
            }
        })
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        self.guard("fallocate", || {
            let r = self.ino(ino).and_then(|i| {
                let m = FallocMode::from_flags(mode).map_err(|e| self.err("fallocate", e))?;
                self.fs.fallocate(i, m, offset, length).map_err(|e| self.err("fallocate", e))
            });
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(e),
            }
        })
    }

    /// Only SEEK_DATA and SEEK_HOLE reach the daemon (the kernel moves offsets
    /// itself); holes come from the core's extent map.
    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        self.guard("lseek", || {
            if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
                return reply.error(Errno::EINVAL);
            }
            if offset < 0 {
                return reply.error(Errno::ENXIO);
            }
            let hole = whence == libc::SEEK_HOLE;
            let r = self.ino(ino).and_then(|i| {
                self.fs.seek_data(i, offset as u64, hole).map_err(|e| self.err("lseek", e))
            });
            match r {
                Ok(o) => reply.offset(o as i64),
                Err(e) => reply.error(e),
            }
        })
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        self.guard("copy_file_range", || {
            if !flags.is_empty() {
                return reply.error(Errno::EINVAL);
            }
            let r = self.ino(ino_in).and_then(|src| {
                let dst = self.ino(ino_out)?;
                let len = len.min(u32::MAX as u64);
                // The kernel removed set-id bits first (file_modified: a SETATTR);
                // the core clears any left by the same rules as a write.
                let lacks = || privs::lacks_cap_fsetid(req.pid());
                let r = self.fs.copy_range_as(src, offset_in, dst, offset_out, len, lacks);
                r.map_err(|e| self.err("copy_file_range", e))
            });
            match r {
                Ok(n) => reply.written(n as u32),
                Err(e) => reply.error(e),
            }
        })
    }
}

impl FerriteFuse {
    fn gen_of(&self, nodeid: u64) -> u64 {
        self.nodes.get(nodeid).map_or(0, |n| n.generation)
    }

    /// Node ids the kernel currently holds (root included).
    pub fn known_nodes(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_conversions_round_trip() {
        for t in [
            Ts { sec: 0, nsec: 0 },
            Ts { sec: 1_700_000_000, nsec: 123_456_789 },
            Ts { sec: -1, nsec: 500_000_000 },
            Ts { sec: -86_400, nsec: 0 },
        ] {
            assert_eq!(system_to_ts(ts_to_system(t)), t, "{t:?}");
        }
    }
}
