//! The file system object: inode cache, commit paths and public types.
//!
//! Invariants:
//! - An inode's [`InodeState`] is guarded by its state lock (`locks::StateLock`); the log of an inode is
//!   appended only under the write lock. Operations on several inodes take their
//!   locks in ascending inode order (a rename between two directories first takes the
//!   global rename lock).
//! - A single-inode operation commits with one 8-byte tail store and one fence when
//!   every byte it wrote is covered by a checksum: inside checksummed log entries, or
//!   in data blocks whose WRITE entries carry the data's checksum (recovery checks
//!   a log's last operation): every copy-on-write write, whatever its size. Data
//!   blocks without one (fallocate's zeroed blocks) take two fences (data and
//!   entries, fence, tail, fence).
//! - A one-fence write may let the inode's write lock go before its fence
//!   ([`Fs::commit_release`]); then at most that one commit is unfenced, and every
//!   later tail store, journal commit, GC or free of the inode first waits for it
//!   ([`Fs::await_fenced`]): a crash finds at most a log's last operation
//!   unfenced, the one recovery checks.
//! - A multi-inode operation commits through the shard journal (see `journal`).
//! - After a commit, the same entries are applied to the DRAM state with
//!   [`InodeState::apply`]; blocks they release are freed only then.

use crate::alloc::{BlockAlloc, InodeAlloc, Place};
use crate::error::{Error, Result};
use crate::index::{FileType, Freed, InodeState};
use crate::journal::{self, Record};
use crate::layout::{logptr, Geometry, InodeSlot, Superblock, BLOCK, SLOT_STATE, SLOT_TAIL};
use crate::locks::{RangeLock, StateLock, StepMutex};
use crate::log::{self, AttrRec, EntryBuf, Ts};
use crate::pmem::{persist_u64, Medium};
use crate::share::Party;
use crate::sharing::Hold;
use parking_lot::{Condvar, Mutex, RwLock, RwLockWriteGuard};
use rustc_hash::FxHashMap as HashMap;
use smallvec::SmallVec;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Test-only faults in the core's persist order, for proving that the crash
/// simulator detects them. Never set outside tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreFault {
    /// Commit the log tail before the entries and unchecksummed data it covers are
    /// persistent (the tail store joins the first fence window of a two-fence
    /// commit, as fallocate's).
    TailBeforeData,
    /// Commit copy-on-write pages with one fence but without their data checksums,
    /// so recovery cannot tell torn data from written data.
    UncheckedData,
    /// Apply journaled words before the journal is written and fenced.
    JournalOutOfOrder,
    /// Fast GC unlinks dead log pages before the operation that killed their
    /// entries is durable.
    EarlyGc,
    /// A direct client uses a lease without checking that it was not revoked, so it
    /// can commit after the daemon took the file back (`client-stale-lease`).
    StaleLease,
    /// The daemon's resolution of a dead client neither flushes the data of the
    /// client's last operation nor clears what it left past its tail: the daemon's
    /// next tail covers another party's unpersisted data (`tail-before-other-data`).
    AdoptUnflushed,
    /// The daemon's resolution of a dead client leaves the bytes an in-place append
    /// the client never committed streamed past the end of file in the run's block:
    /// the next append, a write past the end or a truncate up shows them
    /// (`past-tail-kept`).
    AdoptKeepsPastTail,
    /// Fast GC also unlinks and frees a log page that still holds live entries, which
    /// the file's index (and later appends) still reference (`gc-referenced-page`).
    GcReferenced,
    /// A commit stores its tail without waiting for the inode's previous commit,
    /// which let the write lock go before its fence, to fence: a crash can then keep
    /// the later operation and tear the earlier one (`tail-before-prev-fence`).
    NoFenceWait,
    /// Fast GC and the paths that free an inode do not flush the journal headers a
    /// lazily finished transaction left active on media, so a word it names can
    /// come back to its old value while recovery would still undo it
    /// (`unsettled-journal-mark`).
    UnsettledMarks,
}

/// Attributes of an inode, as `stat` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Attr {
    /// Inode number.
    pub ino: u64,
    /// Generation (slot state); changes when an inode number is reused.
    pub generation: u64,
    /// Type.
    pub ftype: FileType,
    /// Permission bits (07777).
    pub perm: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Links.
    pub nlink: u32,
    /// Size.
    pub size: u64,
    /// 512-byte blocks.
    pub blocks: u64,
    /// Access time.
    pub atime: Ts,
    /// Modification time.
    pub mtime: Ts,
    /// Change time.
    pub ctime: Ts,
    /// Device number of a character or block device (0 otherwise).
    pub rdev: u32,
}

impl Attr {
    /// Full st_mode (type and permission bits).
    pub fn mode(&self) -> u32 {
        self.ftype.mode_bits() | self.perm
    }
    /// The device number's major and minor parts (`rdev` is in the kernel's 32-bit
    /// `new_encode_dev` form, which FUSE's mknod carries).
    pub fn rdev_parts(&self) -> (u32, u32) {
        let d = self.rdev;
        ((d >> 8) & 0xfff, (d & 0xff) | ((d >> 12) & 0xfff00))
    }
}

/// A device number in the kernel's 32-bit `new_encode_dev` form (majors below
/// 4096, minors below 2^20: what Linux itself allocates).
pub fn encode_rdev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// A time to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetTime {
    /// The current time.
    Now,
    /// A given time.
    At(Ts),
}

/// Attribute changes (`None` leaves a field alone).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits.
    pub perm: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate).
    pub size: Option<u64>,
    /// New atime.
    pub atime: Option<SetTime>,
    /// New mtime.
    pub mtime: Option<SetTime>,
}

/// What [`Fs::make_masked`] makes: a file or a directory `name` in `parent`, owned
/// by `uid` and `gid` (a set-group-id directory's group wins).
#[derive(Clone, Copy, Debug)]
pub struct NewNode<'a> {
    /// Directory to make it in.
    pub parent: u64,
    /// Its name.
    pub name: &'a [u8],
    /// A directory (else a regular file).
    pub dir: bool,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
}

/// One directory entry from `readdir`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    /// Name.
    pub name: Vec<u8>,
    /// Inode.
    pub ino: u64,
    /// Type.
    pub ftype: FileType,
    /// Offset to resume after this entry.
    pub cookie: u64,
}

/// File system statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StatFs {
    /// Block size.
    pub bsize: u64,
    /// Total data blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Free blocks for ordinary allocations (minus the reserve).
    pub bavail: u64,
    /// Inode slots.
    pub files: u64,
    /// Free inode slots.
    pub ffree: u64,
    /// Longest name.
    pub namelen: u64,
}

/// Rename flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RenameFlags {
    /// RENAME_NOREPLACE.
    pub noreplace: bool,
    /// RENAME_EXCHANGE.
    pub exchange: bool,
}

/// fallocate modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FallocMode {
    /// FALLOC_FL_KEEP_SIZE.
    pub keep_size: bool,
    /// FALLOC_FL_PUNCH_HOLE (requires keep_size).
    pub punch_hole: bool,
    /// FALLOC_FL_ZERO_RANGE: the range reads as zeros and is allocated.
    pub zero_range: bool,
    /// FALLOC_FL_COLLAPSE_RANGE / FALLOC_FL_INSERT_RANGE: the pages from the
    /// range's end (collapse) or start (insert) move by its length, down or up.
    pub shift: Option<Shift>,
    /// FALLOC_FL_UNSHARE_RANGE: pages of the range that share their block with
    /// another file (a reflink) get a copy of their own (one commit), then the
    /// range is allocated as by a plain fallocate (which may still fail with
    /// ENOSPC: the copies, which change no content, stay).
    pub unshare: bool,
}

/// Which way FALLOC_FL_COLLAPSE_RANGE / INSERT_RANGE moves a file's pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shift {
    /// COLLAPSE_RANGE: the range is removed, what follows moves down.
    Collapse,
    /// INSERT_RANGE: a hole is inserted, what follows moves up.
    Insert,
}

impl FallocMode {
    /// fallocate(2)'s mode bits, as Linux checks them: EOPNOTSUPP for a mode that is
    /// not valid (punch without keep-size, punch with zero-range), EINVAL for
    /// collapse or insert with any other bit, and for unshare with any bit but
    /// keep-size.
    pub fn from_flags(mode: i32) -> Result<FallocMode> {
        use libc::{
            FALLOC_FL_COLLAPSE_RANGE as COLLAPSE, FALLOC_FL_INSERT_RANGE as INSERT,
            FALLOC_FL_KEEP_SIZE as KEEP, FALLOC_FL_PUNCH_HOLE as PUNCH,
            FALLOC_FL_UNSHARE_RANGE as UNSHARE, FALLOC_FL_ZERO_RANGE as ZERO,
        };
        // vfs_fallocate's order of checks.
        let known = KEEP | PUNCH | COLLAPSE | ZERO | INSERT | UNSHARE;
        let has = |bit: i32| mode & bit != 0;
        if mode & !known != 0 {
            return Err(Error::NotSupported("unknown fallocate mode bits"));
        }
        if has(PUNCH) && has(ZERO) {
            return Err(Error::NotSupported("PUNCH_HOLE with ZERO_RANGE"));
        }
        if has(PUNCH) && !has(KEEP) {
            return Err(Error::NotSupported("PUNCH_HOLE requires KEEP_SIZE"));
        }
        if (has(COLLAPSE) && mode != COLLAPSE) || (has(INSERT) && mode != INSERT) {
            return Err(Error::invalid("COLLAPSE_RANGE and INSERT_RANGE take no other flag"));
        }
        if has(UNSHARE) && mode & !(UNSHARE | KEEP) != 0 {
            return Err(Error::invalid("UNSHARE_RANGE takes no other flag but KEEP_SIZE"));
        }
        let shift = match mode {
            COLLAPSE => Some(Shift::Collapse),
            INSERT => Some(Shift::Insert),
            _ => None,
        };
        Ok(FallocMode {
            keep_size: has(KEEP),
            punch_hole: has(PUNCH),
            zero_range: has(ZERO),
            shift,
            unshare: has(UNSHARE),
        })
    }
}

/// setxattr flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum XattrSet {
    /// Create or replace.
    #[default]
    Any,
    /// XATTR_CREATE: fail with EEXIST if present.
    Create,
    /// XATTR_REPLACE: fail with ENODATA if absent.
    Replace,
}

/// mkfs options.
#[derive(Clone, Debug)]
pub struct MkfsOptions {
    /// Shards (per-CPU inode tables, journals, free lists).
    pub shards: u32,
    /// Inode slots (0: one per 8 KiB of pool).
    pub inodes: u64,
    /// Owner of the root directory.
    pub root_uid: u32,
    /// Group of the root directory.
    pub root_gid: u32,
    /// Pool identity (None: derived from time and pid).
    pub uuid: Option<[u8; 16]>,
    /// Keep second copies of the journals, inode slots and checkpoint
    /// ([`crate::layout::FEATURE_REPLICAS`]; on by default).
    pub replicas: bool,
}

impl Default for MkfsOptions {
    fn default() -> Self {
        MkfsOptions { shards: 8, inodes: 0, root_uid: 0, root_gid: 0, uuid: None, replicas: true }
    }
}

/// Mount options.
#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    /// Refuse all changes.
    pub read_only: bool,
    /// Test-only fault in the persist order.
    pub fault: Option<CoreFault>,
    /// Recovery workers (0: one per core).
    pub workers: usize,
    /// When reads update access times.
    pub atime: AtimeMode,
    /// When reads verify data blocks against their checksums.
    pub verify: crate::verify::VerifyMode,
}

/// When reads and directory listings update an inode's access time (the mount
/// options `relatime`, `noatime`, `strictatime`). An update is kept in DRAM and
/// persisted lazily (see [`Fs::read`]): with the inode's next attribute change, when
/// its last handle is released, when it is read with no handle open, and at unmount.
/// A crash loses updates not yet persisted, as Linux's `lazytime` does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum AtimeMode {
    /// Linux's default: update when the access time is not after the modification
    /// or change time, or is a day old.
    #[default]
    Relative,
    /// Never update (`noatime`).
    Off,
    /// Update on every access (`strictatime`).
    Strict,
}

impl AtimeMode {
    pub(crate) fn code(self) -> u8 {
        match self {
            AtimeMode::Relative => 0,
            AtimeMode::Off => 1,
            AtimeMode::Strict => 2,
        }
    }

    fn from_code(c: u8) -> AtimeMode {
        match c {
            1 => AtimeMode::Off,
            2 => AtimeMode::Strict,
            _ => AtimeMode::Relative,
        }
    }

    /// Parse a mount option: `relatime`, `noatime` or `strictatime`.
    pub fn parse(s: &str) -> Option<AtimeMode> {
        match s {
            "relatime" => Some(AtimeMode::Relative),
            "noatime" => Some(AtimeMode::Off),
            "strictatime" => Some(AtimeMode::Strict),
            _ => None,
        }
    }
}

/// How the last mount found the pool.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct MountReport {
    /// The pool had been cleanly unmounted and its checkpoint was used.
    pub clean: bool,
    /// Journals rolled back.
    pub journals_rolled_back: u32,
    /// Inodes whose torn last operation was cut off.
    pub torn_logs: u32,
    /// Unlinked-but-open inodes freed.
    pub orphans_freed: u32,
    /// Inodes scanned.
    pub inodes_scanned: u64,
    /// Mount time in microseconds.
    pub micros: u64,
    /// Superblock copy used (0 primary, 1 replica).
    pub superblock_copy: u32,
    /// Checkpoint copy used on a clean mount (0 primary, 1 second copy).
    pub checkpoint_copy: u32,
    /// Data blocks that several files share (reflinks), counted from the logs.
    pub shared_blocks: u64,
    /// The logs were walked to count shared blocks (a crash, or a clean pool whose
    /// checkpoint recorded some).
    pub refs_counted: bool,
    /// A clean pool's logs share other blocks than its checkpoint recorded: a block
    /// mapped by two files that no clone made (damage); the logs' count is used.
    pub refs_mismatch: Option<String>,
}

/// An inode in the cache.
pub struct Inode {
    pub(crate) ino: u64,
    pub(crate) state_word: u64,
    pub(crate) seed: u32,
    pub(crate) st: StateLock<InodeState>,
    pub(crate) open: AtomicU32,
    pub(crate) ranges: RangeLock,
    /// Other processes may write this inode (a regular file on a shared pool): its
    /// state is checked against the log tail and written under the table's lock.
    pub(crate) shared: bool,
    /// This process's hold on the inode's cross-process lock (see `sharing`).
    pub(crate) xh: Mutex<crate::sharing::XHold>,
    pub(crate) xh_cv: Condvar,
    /// Its times were handed out (an `Attr` was made of it) since its last data
    /// change: the next one stamps the fine clock (`Fs::stamp`).
    pub(crate) times_seen: AtomicBool,
    /// An access time later than the committed one, not yet persisted (nanoseconds
    /// since the epoch; 0: none). See [`AtimeMode`].
    pub(crate) atime_lazy: AtomicU64,
    /// This process's live DAX mappings of the inode (see `mapping`).
    pub(crate) dax: AtomicU32,
    /// Its type (an inode number keeps its type for as long as the `Inode` lives).
    pub(crate) ftype: FileType,
    /// A commit of this inode stored its tail and let the write lock go before its
    /// fence ([`Fs::commit_release`]), and has not fenced yet. At most one commit is
    /// in that state: anything that makes a later log state durable waits for it
    /// first ([`Fs::await_fenced`]).
    pub(crate) unfenced: AtomicBool,
    /// A client's last proof that this is the incarnation the slot holds: the
    /// daemon's count of freed inodes ([`crate::share::Table::inode_frees`]) read
    /// before a load of the slot's state word found it unchanged (`u64::MAX`: none
    /// yet). While the count stays, so does the incarnation.
    pub(crate) frees_seen: AtomicU64,
    /// Where the file's overlay lists were at its last sub-page write
    /// ([`crate::pagemap::PageMap::hint`]; 0: none), read without the state lock so
    /// that the next one asks for its page's list before its checks and locks. Only
    /// ever used for a prefetch: a stale value costs a useless one.
    pub(crate) ops_hint: AtomicU64,
}

impl Inode {
    /// Its type. An inode only this process writes keeps its type for the
    /// `Inode`'s life: no lock (a write takes the inode's lock once, to commit).
    /// Another process's reload of a shared one is read under the lock.
    pub(crate) fn ftype_now(&self) -> FileType {
        if self.shared {
            self.st.read().ftype
        } else {
            self.ftype
        }
    }

    pub(crate) fn new(ino: u64, state_word: u64, seed: u32, st: InodeState, shared: bool) -> Inode {
        let st_ftype = st.ftype;
        Inode {
            ino,
            state_word,
            seed,
            st: StateLock::new(st),
            open: AtomicU32::new(0),
            ranges: RangeLock::default(),
            shared,
            xh: Mutex::new(Default::default()),
            xh_cv: Condvar::new(),
            times_seen: AtomicBool::new(true),
            atime_lazy: AtomicU64::new(0),
            dax: AtomicU32::new(0),
            ftype: st_ftype,
            unfenced: AtomicBool::new(false),
            frees_seen: AtomicU64::new(u64::MAX),
            ops_hint: AtomicU64::new(0),
        }
    }
}

const CACHE_SHARDS: usize = 64;
/// Inodes a cache shard holds before idle ones are dropped (their DRAM state is
/// rebuilt from the log on next access): 64 Ki inodes in all.
const CACHE_SHARD_CAP: usize = 1024;

/// `committed`, or the DRAM-only access time of `inode` when that is later.
pub(crate) fn later_atime(committed: Ts, inode: &Inode) -> Ts {
    let v = inode.atime_lazy.load(Ordering::Relaxed);
    if v == 0 {
        return committed;
    }
    let lazy = Ts { sec: (v / 1_000_000_000) as i64, nsec: (v % 1_000_000_000) as u32 };
    committed.max(lazy)
}

fn ts_nanos(t: Ts) -> u64 {
    (t.sec.max(0) as u64).saturating_mul(1_000_000_000).saturating_add(u64::from(t.nsec))
}

/// Drop idle inodes (not open, not referenced outside the cache) until the shard is
/// at three quarters of its cap. `keep` is the inode just loaded.
fn evict_some(c: &mut HashMap<u64, Arc<Inode>>, keep: u64) {
    let target = CACHE_SHARD_CAP * 3 / 4;
    let victims: Vec<u64> = c
        .iter()
        .filter(|(&k, i)| {
            k != keep
                && i.open.load(Ordering::Acquire) == 0
                && Arc::strong_count(i) == 1
                && i.atime_lazy.load(Ordering::Relaxed) == 0
        })
        .map(|(&k, _)| k)
        .take(c.len().saturating_sub(target))
        .collect();
    for k in victims {
        c.remove(&k);
    }
}

/// The file this thread last wrote, for [`Fs::fsync`]: every operation is durable
/// when it returns, so an fsync only has to tell whether the inode exists, and a
/// write + fsync loop asked the inode cache twice per write (a shard's read lock,
/// two locked instructions, and a hash: about 80 of a 64 B append's 2,000
/// instructions). The memo holds the `Fs`'s number, the inode and the `Fs`'s count
/// of freed inodes at the write: while that count is unchanged, the inode has not
/// been freed since (a free that races the fsync is ordered after it).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteMemo {
    pub fs: u64,
    pub ino: u64,
    pub frees: u64,
}

thread_local! {
    /// See [`WriteMemo`]; `fs` 0 is no `Fs`.
    pub(crate) static LAST_WRITTEN: std::cell::Cell<WriteMemo> =
        const { std::cell::Cell::new(WriteMemo { fs: 0, ino: 0, frees: 0 }) };
}

/// A number for a new `Fs`, never 0 and never repeated within the process.
pub(crate) fn next_fs_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A mounted FerriteFS pool.
pub struct Fs<M: Medium> {
    pub(crate) m: M,
    pub(crate) sb: Superblock,
    pub(crate) geo: Geometry,
    pub(crate) balloc: BlockAlloc,
    pub(crate) ialloc: InodeAlloc,
    pub(crate) cache: Vec<RwLock<HashMap<u64, Arc<Inode>>>>,
    pub(crate) txids: Vec<StepMutex<u64>>,
    /// Journals whose last transaction's inactive mark may still be in flight
    /// (`journal::finish_lazy`; a pool this process alone uses).
    pub(crate) marks: crate::journal::LazyMarks,
    pub(crate) rename_lock: StepMutex<()>,
    pub(crate) read_only: bool,
    pub(crate) fault: Option<CoreFault>,
    pub(crate) generation: u64,
    pub(crate) report: MountReport,
    pub(crate) unmounted: AtomicBool,
    pub(crate) gc_stats: GcStats,
    /// The latest fine-grained timestamp handed out (nanoseconds since the epoch): a
    /// coarse stamp is never below it, so times never run backwards (`Fs::stamp`).
    pub(crate) time_floor: AtomicU64,
    /// The coordination table, when other processes share this pool (the daemon of
    /// a mount with direct access, or a direct-access client).
    pub(crate) share: Option<Arc<Party>>,
    /// A client's next block grant size.
    pub(crate) grant_size: AtomicU64,
    /// A client's blocks whose pages it has asked the kernel to map (one bit a
    /// block; `None` elsewhere): a grant of blocks it had before is not populated
    /// again (a hint; a page the kernel unmapped meanwhile just faults).
    pub(crate) populated: Option<crate::alloc::AtomicBitmap>,
    /// A client's leases on inode locks (see `sharing`).
    pub(crate) leases: crate::sharing::Leases,
    /// Set when damage was found at run time: nothing is committed after it.
    pub(crate) poisoned: std::sync::OnceLock<String>,
    /// [`AtimeMode`] code.
    pub(crate) atime: std::sync::atomic::AtomicU8,
    /// This `Fs`'s number among those of the process (see [`WriteMemo`]).
    pub(crate) id: u64,
    /// Inodes this `Fs` has freed (see [`WriteMemo`]).
    pub(crate) inode_frees: AtomicU64,
    /// Read verification policy.
    pub(crate) verify: crate::verify::VerifyMode,
    /// Blocks verified since mount (see `verify`).
    pub(crate) verified: crate::verify::Verified,
    /// This process's atomic mappings of the pool's files (`filemap`).
    pub(crate) atomics: crate::filemap::AtomicMaps,
    /// This process's persistent buffers (`pbuf`).
    pub(crate) pbufs: crate::pbuf::PBufs,
    /// The memory nodes data is placed on (`numa`).
    pub(crate) topo: crate::numa::Topology,
    /// Extra references of shared blocks, when the pool is not shared (`refs`).
    pub(crate) refs: crate::refs::LocalRefs,
}

/// GC counters.
#[derive(Default, Debug)]
pub struct GcStats {
    /// Log pages freed by fast GC.
    pub fast_pages: AtomicU64,
    /// Thorough GC runs.
    pub thorough_runs: AtomicU64,
    /// Measures of a log's live state, each to decide on a thorough GC (a walk of
    /// the inode's whole DRAM state).
    pub thorough_checks: AtomicU64,
    /// Log pages freed by thorough GC.
    pub thorough_pages: AtomicU64,
}

thread_local! {
    static SHARD_HINT: u32 = {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        NEXT.fetch_add(1, Ordering::Relaxed)
    };
}

/// Per-thread shard choice (the per-CPU structures of NOVA, by thread).
pub(crate) fn shard_hint(n: u32) -> u32 {
    SHARD_HINT.with(|s| *s % n)
}

/// The entries of one inode in one operation: inline for up to three (a create's
/// SETATTR and ACLs, a directory's DENTRY and SETATTR), so a commit allocates nothing.
pub(crate) type Entries = SmallVec<[EntryBuf; 3]>;

/// One inode's part of a commit.
pub(crate) struct Part {
    pub ino: u64,
    pub entries: Entries,
}

/// A new inode created by a multi-inode commit.
pub(crate) struct NewInode {
    pub ino: u64,
    pub ftype: FileType,
    pub state_word: u64,
    pub seed: u32,
    pub head_page: u64,
    pub entries: Entries,
    /// Data blocks written for it (a long symlink target).
    pub data: Vec<(u64, u64)>,
}

/// Which fence of a journal transaction is about to drain (see `Fs::journal_run`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drain {
    /// The first: entries, a created inode's page and slot, the journal's records.
    Records,
    /// The second: the journaled words.
    Words,
}

/// A journal taken for one transaction ([`Fs::journal_open`]): this process's
/// mutex of the shard, or (a shared pool) the table's lock, held until the value
/// drops. A transaction dropped unrun wrote nothing.
pub(crate) struct JournalTx<'a> {
    shard: u32,
    held: Held<'a>,
}

/// What a [`JournalTx`] holds.
enum Held<'a> {
    /// This process's mutex of the shard (its value: the last transaction id).
    Local(parking_lot::MutexGuard<'a, u64>),
    /// The coordination table's lock of the shard, for this party.
    Shared(&'a crate::share::Table, u32),
}

impl Drop for JournalTx<'_> {
    fn drop(&mut self) {
        if let Held::Shared(t, p) = self.held {
            t.unlock_journal(self.shard, p);
        }
    }
}

/// Inodes locked for writing by one operation, in ascending order.
pub(crate) struct Locked<'a, M: Medium> {
    pub guards: SmallVec<[(u64, &'a Inode, RwLockWriteGuard<'a, InodeState>); 4]>,
    /// Cross-process holds of the shared ones, taken first (released last).
    _holds: SmallVec<[Hold<'a, M>; 1]>,
}

impl<'a, M: Medium> Locked<'a, M> {
    /// Lock `inodes` (up to four: a rename's) in ascending order; no allocation.
    pub(crate) fn new(fs: &'a Fs<M>, inodes: &[&'a Arc<Inode>]) -> Result<Locked<'a, M>> {
        let mut inodes: SmallVec<[&'a Arc<Inode>; 4]> = inodes.iter().copied().collect();
        inodes.sort_unstable_by_key(|i| i.ino);
        inodes.dedup_by_key(|i| i.ino);
        let mut holds = SmallVec::new();
        for i in &inodes {
            if let Some(h) = fs.hold(i)? {
                holds.push(h);
            }
        }
        let guards = inodes.into_iter().map(|i| (i.ino, &**i, i.st.write())).collect();
        Ok(Locked { guards, _holds: holds })
    }
    pub(crate) fn st(&self, ino: u64) -> &InodeState {
        &self.guards.iter().find(|g| g.0 == ino).expect("inode locked").2
    }
    pub(crate) fn st_mut(&mut self, ino: u64) -> &mut InodeState {
        &mut self.guards.iter_mut().find(|g| g.0 == ino).expect("inode locked").2
    }
    pub(crate) fn inode(&self, ino: u64) -> &'a Inode {
        self.guards.iter().find(|g| g.0 == ino).expect("inode locked").1
    }
}

impl<M: Medium> Fs<M> {
    /// The medium.
    pub fn medium(&self) -> &M {
        &self.m
    }

    /// Change when reads verify data blocks (a mount option; see `verify`).
    pub fn set_verify_mode(&mut self, v: crate::VerifyMode) {
        self.verify = v;
    }

    /// When reads verify data blocks.
    pub fn verify_mode(&self) -> crate::VerifyMode {
        self.verify
    }

    /// The superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// What mount found and did.
    pub fn mount_report(&self) -> &MountReport {
        &self.report
    }

    /// GC counters.
    pub fn gc_stats(&self) -> &GcStats {
        &self.gc_stats
    }

    /// Root inode number.
    pub fn root(&self) -> u64 {
        crate::layout::ROOT_INO
    }

    /// A read-only mount of a pool that was not cleanly unmounted: recovery ran in
    /// a DRAM view only, so torn last operations are still on media.
    pub(crate) fn unrepaired(&self) -> bool {
        self.read_only && !self.report.clean
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.read_only || self.poisoned.get().is_some() {
            Err(Error::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Give inode number `ino` back to the allocator: a freed inode's, whose slot's
    /// state word changed already, or a failed create's, whose slot never changed.
    /// On a shared pool it is counted first for the clients' caches (see
    /// `Inode::frees_seen`), since a new file may take the number right after (a
    /// failed create's count costs a client one slot load, nothing more).
    pub(crate) fn free_ino(&self, ino: u64) {
        self.inode_frees.fetch_add(1, Ordering::AcqRel);
        if let Some(p) = &self.share {
            debug_assert!(!p.is_client(), "a client frees no inode number");
            p.table().bump_inode_frees();
        }
        self.poison_on(self.ialloc.free(ino));
    }

    /// An inconsistency found while running (the allocators and the logs
    /// disagree): from now on this `Fs` commits nothing (writes fail with
    /// EROFS), and the reason is told once on stderr and kept for `poisoned`.
    pub(crate) fn poison_on(&self, r: Result<()>) {
        if let Err(e) = r {
            self.stop_commits(&format!("the pool is damaged: {e}"));
        }
    }

    /// Commit nothing more (writes fail with EROFS): DRAM state may be wrong (a
    /// front end caught a panic inside an operation, or damage was found). The
    /// first reason is told on stderr and kept for [`Self::poisoned`].
    pub fn stop_commits(&self, why: &str) {
        if self.poisoned.set(why.to_string()).is_ok() {
            eprintln!(
                "ferrite: {why}; the pool is read-only from now on (unmount, then run \
                 `ferrite fsck`)"
            );
        }
    }

    /// Why this `Fs` stopped committing (a damage found at run time), if it did.
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.get().map(|s| s.as_str())
    }

    pub(crate) fn shard(&self) -> u32 {
        shard_hint(self.geo.nshards)
    }

    /// Is inode `ino` in this process's DRAM cache (its index built)? A hint: it
    /// may be loaded or evicted right after.
    pub fn is_loaded(&self, ino: u64) -> bool {
        self.cache_shard(ino).read().contains_key(&ino)
    }

    pub(crate) fn cache_shard(&self, ino: u64) -> &RwLock<HashMap<u64, Arc<Inode>>> {
        &self.cache[(ino as usize) % CACHE_SHARDS]
    }

    pub(crate) fn new_cache() -> Vec<RwLock<HashMap<u64, Arc<Inode>>>> {
        (0..CACHE_SHARDS).map(|_| RwLock::new(HashMap::default())).collect()
    }

    pub(crate) fn read_slot(&self, ino: u64) -> InodeSlot {
        let mut b = [0u8; 64];
        self.m.read(self.geo.slot_off(ino), &mut b);
        InodeSlot::decode(&b)
    }

    /// Replay an inode's log from media. `Ok(None)` if the slot is free.
    pub(crate) fn load_state(
        &self,
        ino: u64,
    ) -> Result<Option<(InodeSlot, InodeState, log::Walk)>> {
        if ino == 0 || ino > self.geo.ninodes {
            return Ok(None);
        }
        let slot = self.read_slot(ino);
        if !slot.in_use() {
            return Ok(None);
        }
        let ftype = FileType::from_code(slot.ftype).ok_or_else(|| {
            Error::corrupt(format!("inode {ino} has unknown type {}", slot.ftype))
        })?;
        let seed = log::seed(&self.sb.uuid, ino, slot.state);
        let mut st = InodeState::new(ftype);
        let mut freed = crate::index::Freed::new();
        let (head, tail) = (logptr::addr(slot.head), logptr::addr(slot.tail));
        let mut apply = |loc, e: log::Entry| st.apply(loc, &e, &mut freed);
        // A read-only mount of a crashed pool repaired nothing: each log is checked
        // as recovery would have checked it.
        let check = self.unrepaired();
        let walk =
            log::walk_apply_checking(&self.m, &self.geo, seed, head, tail, check, &mut apply)?;
        if st.setattr_loc.is_none() {
            return Err(Error::corrupt(format!("inode {ino} has no attributes in its log")));
        }
        st.log = log::LogState {
            head: slot.head,
            tail: logptr::make(logptr::epoch(slot.tail), walk.end),
            next_seq: walk.next_seq,
            pages: walk.pages.clone().into(),
        };
        st.gc_check_at = (st.log.pages.len() * 2).max(4);
        Ok(Some((slot, st, walk)))
    }

    /// A direct-access client's cached `i` is of an earlier incarnation of its
    /// number: the daemon freed that file and may have made a new one with the
    /// number. (The daemon frees inodes itself, so its cache never holds one.) The
    /// caller asks on behalf of a descriptor open through the mount, which keeps the
    /// incarnation it names alive: a state word that moved means the cached one is
    /// the stale one.
    fn stale_incarnation(&self, i: &Inode) -> bool {
        self.m.load_u64(self.geo.slot_off(i.ino) + SLOT_STATE) != i.state_word
    }

    /// Uncache `ino` if it is of an earlier incarnation (see `stale_incarnation`).
    fn drop_stale(&self, ino: u64) {
        let mut c = self.cache_shard(ino).write();
        if c.get(&ino).is_some_and(|i| self.stale_incarnation(i)) {
            c.remove(&ino);
        }
    }

    /// The cached inode `ino`, loading it from its log on first access.
    pub(crate) fn inode(&self, ino: u64) -> Result<Arc<Inode>> {
        let slot_now =
            |ino: u64| (ino >= 1 && ino <= self.geo.ninodes).then(|| self.read_slot(ino));
        let client = self.is_client();
        loop {
            if let Some(i) = self.cache_shard(ino).read().get(&ino) {
                if !client {
                    return Ok(i.clone());
                }
                // The count first: a free after it changes it (see `frees_seen`).
                let frees = self.share.as_ref().and_then(|p| p.table().inode_frees());
                if frees.is_some_and(|f| i.frees_seen.load(Ordering::Acquire) == f) {
                    return Ok(i.clone());
                }
                if !self.stale_incarnation(i) {
                    if let Some(f) = frees {
                        i.frees_seen.store(f, Ordering::Release);
                    }
                    return Ok(i.clone());
                }
            }
            if client {
                self.drop_stale(ino);
            }
            // The log is walked without locks. Meanwhile another thread may load this
            // inode, commit through it and see it evicted again: this walk then saw an
            // older (or half rewritten) log, and inserting it would lose commits. With
            // the inode uncached under the shard's write lock nobody can change its
            // slot, and slot words never return to an old value, so an unchanged slot
            // proves the walk current; otherwise walk again.
            let before = slot_now(ino);
            // Another party's GC may free log pages while we walk without its lock:
            // an unchanged chain generation proves the walk read live pages.
            let gen = self.share.as_ref().map(|p| p.table().chain_gen(ino));
            let loaded = self.load_state(ino);
            let mut c = self.cache_shard(ino).write();
            if let Some(i) = c.get(&ino) {
                return Ok(i.clone());
            }
            if slot_now(ino) != before
                || self.share.as_ref().map(|p| p.table().chain_gen(ino)) != gen
            {
                continue;
            }
            let Some((slot, mut st, walk)) = loaded? else {
                return Err(Error::NotFound);
            };
            st.chain_gen = gen.unwrap_or(0);
            if walk.torn && !self.unrepaired() {
                return Err(Error::corrupt(format!(
                    "inode {ino}: log has a torn entry on a pool that was recovered"
                )));
            }
            let shared = self.share.is_some() && st.ftype == FileType::Regular;
            let seed = log::seed(&self.sb.uuid, ino, slot.state);
            let inode = Arc::new(Inode::new(ino, slot.state, seed, st, shared));
            let got = c.entry(ino).or_insert(inode).clone();
            if c.len() > CACHE_SHARD_CAP {
                evict_some(&mut c, ino);
            }
            return Ok(got);
        }
    }

    /// The cached inode `ino`, if cached.
    pub(crate) fn cached_only(&self, ino: u64) -> Option<Arc<Inode>> {
        self.cache_shard(ino).read().get(&ino).cloned()
    }

    pub(crate) fn cache_insert(&self, inode: Arc<Inode>) {
        self.cache_shard(inode.ino).write().insert(inode.ino, inode);
    }

    /// Drop `inode` from the cache, if the cached copy of its number is this one.
    pub(crate) fn cache_remove(&self, inode: &Inode) {
        let mut c = self.cache_shard(inode.ino).write();
        if c.get(&inode.ino).is_some_and(|i| std::ptr::eq(&**i, inode)) {
            c.remove(&inode.ino);
        }
    }

    pub(crate) fn cached_inodes(&self) -> Vec<Arc<Inode>> {
        self.cache.iter().flat_map(|c| c.read().values().cloned().collect::<Vec<_>>()).collect()
    }

    /// Drop cached inodes that are not open (their DRAM indexes are rebuilt from
    /// the log on next access). Returns how many were dropped.
    pub fn evict_idle(&self) -> usize {
        let mut n = 0;
        for c in &self.cache {
            c.write().retain(|_, i| {
                let keep = i.open.load(Ordering::Acquire) > 0
                    || Arc::strong_count(i) > 1
                    || i.atime_lazy.load(Ordering::Relaxed) != 0;
                n += !keep as usize;
                keep
            });
        }
        n
    }

    pub(crate) fn attr_of(&self, inode: &Inode, st: &InodeState) -> Attr {
        // Under the state lock, which a data change holds to stamp its time.
        if !inode.times_seen.load(Ordering::Relaxed) {
            inode.times_seen.store(true, Ordering::Relaxed);
        }
        let a = &st.attr;
        Attr {
            ino: inode.ino,
            generation: inode.state_word,
            ftype: st.ftype,
            perm: a.mode & 0o7777,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size: st.size(),
            blocks: st.blocks(),
            atime: later_atime(a.atime, inode),
            mtime: a.mtime,
            ctime: a.ctime,
            rdev: a.rdev,
        }
    }

    /// The access-time mode in force.
    pub fn atime_mode(&self) -> AtimeMode {
        AtimeMode::from_code(self.atime.load(Ordering::Relaxed))
    }

    /// Change the access-time mode (a front end's mount option).
    pub fn set_atime_mode(&self, mode: AtimeMode) {
        self.atime.store(mode.code(), Ordering::Relaxed);
    }

    /// Note an access to `inode` (a read or a listing, under its state lock) as the
    /// access-time mode says: in DRAM only. True when the caller should persist it
    /// at once ([`Fs::persist_atime`]): nobody holds the inode open, so no release
    /// would.
    pub(crate) fn touch_atime(&self, inode: &Inode, st: &InodeState) -> bool {
        let mode = self.atime_mode();
        if mode == AtimeMode::Off || self.read_only {
            return false;
        }
        let a = &st.attr;
        let cur = later_atime(a.atime, inode);
        let now = self.m.now_coarse();
        let due = match mode {
            AtimeMode::Strict => now > cur,
            _ => cur <= a.mtime || cur <= a.ctime || now.sec >= cur.sec.saturating_add(86_400),
        };
        if !due {
            return false;
        }
        // Never before the times it is compared with (a coarse clock can lag a fine
        // stamp): a later read would find the update due again.
        let t = now.max(a.mtime).max(a.ctime).max(cur);
        if t == cur {
            return false;
        }
        inode.atime_lazy.fetch_max(ts_nanos(t), Ordering::Relaxed);
        inode.open.load(Ordering::Acquire) == 0
    }

    /// [`Fs::persist_atime`] where a failure must not fail the caller (a read, a
    /// release, an unmount): on a full pool or after damage the access time stays in
    /// DRAM, retried at the next of these points, and is lost at unmount.
    pub(crate) fn persist_atime_best_effort(&self, inode: &Arc<Inode>) {
        let _ = self.persist_atime(inode);
    }

    /// Persist `inode`'s DRAM-only access time, if it has one: a SETATTR entry that
    /// changes nothing else (not the change time).
    pub(crate) fn persist_atime(&self, inode: &Arc<Inode>) -> Result<()> {
        let v = inode.atime_lazy.load(Ordering::Relaxed);
        if v == 0 || self.read_only || self.check_writable().is_err() {
            return Ok(());
        }
        let _h = self.hold(inode)?;
        let mut st = inode.st.write();
        if st.log.pages.is_empty() {
            return Ok(()); // freed meanwhile
        }
        let t = later_atime(st.attr.atime, inode);
        if t > st.attr.atime {
            let (e, _) = Self::setattr_entry(&st, |a| a.atime = t);
            self.commit_single(inode, &mut st, &mut [e], false, false)?;
        }
        // Readers raise it under the read lock only: nothing was raised meanwhile.
        inode.atime_lazy.store(0, Ordering::Relaxed);
        Ok(())
    }

    /// The modification time of a data change to `inode`, whose state lock the
    /// caller holds (write). As the kernel's multigrain timestamps: the coarse clock
    /// (a tick's resolution, a third of the fine clock's cost) while nobody has
    /// looked at the inode's times since its last change, so two changes in one tick
    /// may share a time nobody could tell apart; the fine clock once somebody has, so
    /// a change after a stat always shows. A coarse stamp is raised to the latest
    /// fine one handed out, so times never run backwards. Inodes other processes
    /// write (direct access) always take the fine clock: their readers' stats are
    /// not seen here. The caller clears `times_seen` once the change is committed.
    pub(crate) fn stamp(&self, inode: &Inode) -> (Ts, bool) {
        let as_nanos = |t: Ts| t.sec.max(0) as u64 * 1_000_000_000 + u64::from(t.nsec);
        if inode.shared || inode.times_seen.load(Ordering::Relaxed) {
            let t = self.m.now();
            self.time_floor.fetch_max(as_nanos(t), Ordering::Relaxed);
            return (t, true);
        }
        let c = self.m.now_coarse();
        let floor = self.time_floor.load(Ordering::Relaxed);
        if as_nanos(c) >= floor {
            return (c, false);
        }
        let t = Ts { sec: (floor / 1_000_000_000) as i64, nsec: (floor % 1_000_000_000) as u32 };
        (t, false)
    }

    /// A log page (from the top of the free space: see [`Place::High`]).
    pub(crate) fn alloc_log_page(&self, shard: u32, reserve: bool) -> Result<u64> {
        Ok(self.alloc_blocks_placed(shard, 1, reserve, Place::High)?[0].0 * BLOCK)
    }

    /// Allocate `n` blocks for file data; a direct-access client asks the daemon for
    /// more when its own allocator runs dry. Inline, so that a request for none (an
    /// embedded write's) costs its callers no call: callgrind, 200,000 64 B random
    /// writes: 2,735 instructions a write with it out of line, 2,701 inline.
    #[inline]
    pub(crate) fn alloc_blocks(
        &self,
        shard: u32,
        n: u64,
        reserve: bool,
    ) -> Result<crate::alloc::Runs> {
        self.alloc_blocks_placed(shard, n, reserve, Place::Low)
    }

    /// [`Fs::alloc_blocks`] from the part of the free space `place` names.
    #[inline]
    pub(crate) fn alloc_blocks_placed(
        &self,
        shard: u32,
        n: u64,
        reserve: bool,
        place: Place,
    ) -> Result<crate::alloc::Runs> {
        if n == 0 {
            return Ok(crate::alloc::Runs::new());
        }
        self.alloc_some(shard, n, reserve, place)
    }

    /// [`Fs::alloc_blocks_placed`] of at least one block.
    #[inline(never)]
    fn alloc_some(
        &self,
        shard: u32,
        n: u64,
        reserve: bool,
        place: Place,
    ) -> Result<crate::alloc::Runs> {
        match self.balloc.alloc_placed(shard, n, reserve, place) {
            Err(Error::NoSpace) if self.is_client() => {
                self.refill(n)?;
                self.balloc.alloc_placed(shard, n, reserve, place)
            }
            r => r,
        }
    }

    pub(crate) fn free_pages(&self, pages: &[u64]) {
        for &p in pages {
            self.free_run(p / BLOCK, 1, false);
        }
        self.after_free();
    }

    pub(crate) fn free_runs(&self, runs: &[(u64, u64)]) {
        for &(b, n) in runs {
            self.free_run(b, n, true);
        }
        self.after_free();
    }

    /// Free blocks `[b, b + n)`: file data (`data`), or log pages.
    fn free_run(&self, b: u64, n: u64, data: bool) {
        if self.any_shared() {
            // A block mapped elsewhere too loses a reference instead (`refs`).
            let mut s = b;
            for x in b..b + n {
                if self.drop_ref(x) {
                    if s < x {
                        self.free_unshared(s, x - s, data);
                    }
                    s = x + 1;
                }
            }
            if s < b + n {
                self.free_unshared(s, b + n - s, data);
            }
            return;
        }
        self.free_unshared(b, n, data);
    }

    fn free_unshared(&self, b: u64, n: u64, data: bool) {
        self.verified.clear(b, n);
        if let Some(p) = &self.share {
            // This party owns what it frees (see `share`): a client must have marked
            // blocks freed by a commit before that commit; marking again is harmless.
            p.own(b, n);
        }
        let r = if data { self.balloc.free_data(b, n) } else { self.balloc.free(b, n) };
        self.poison_on(r);
    }

    /// Append `entries` to `st`'s log (not committed). On error nothing is left
    /// allocated.
    pub(crate) fn append_entries(
        &self,
        seed: u32,
        st: &InodeState,
        entries: &mut [EntryBuf],
        reserve: bool,
    ) -> Result<log::Appended> {
        let shard = self.shard();
        let mut taken = log::Pages::new();
        let mut alloc = || self.alloc_log_page(shard, reserve);
        match log::append(&self.m, &st.log, seed, entries, &mut alloc, &mut taken) {
            Ok(a) => Ok(a),
            Err(e) => {
                self.free_pages(&taken);
                Err(e)
            }
        }
    }

    /// Apply committed entries to the DRAM state; returns the blocks they released.
    pub(crate) fn apply_committed(
        st: &mut InodeState,
        a: &log::Appended,
        entries: &[EntryBuf],
    ) -> Freed {
        Self::advance_log(st, a);
        Self::apply_decoded(st, &a.locs, entries)
    }

    /// Move the log of `st` to where an append of its entries left it.
    fn advance_log(st: &mut InodeState, a: &log::Appended) {
        debug_assert!(a.next_seq > st.log.next_seq, "sequence numbers only move forward");
        st.log.tail = a.new_tail;
        st.log.next_seq = a.next_seq;
        st.log.pages.extend(&a.new_pages);
    }

    /// Apply committed `entries`, at `locs`, to the DRAM state, each decoded from
    /// its bytes (as a replay would); the blocks they released are returned.
    pub(crate) fn apply_decoded(st: &mut InodeState, locs: &[u64], entries: &[EntryBuf]) -> Freed {
        let mut freed = Freed::new();
        for (loc, e) in locs.iter().zip(entries) {
            let entry = log::decode_entry(&e.bytes).expect("entry we just encoded decodes");
            st.apply(*loc, &entry, &mut freed);
        }
        freed
    }

    /// Test-only: inject a persist-order fault into this `Fs` (a direct client is
    /// attached without mount options). Never called outside tests.
    pub fn set_core_fault(&mut self, fault: Option<CoreFault>) {
        self.fault = fault;
    }

    /// Commit entries of one inode. `data_written`: data blocks that no checksum
    /// covers were written for them (two-fence commit). Returns after the
    /// operation is durable.
    pub(crate) fn commit_single(
        &self,
        inode: &Inode,
        st: &mut InodeState,
        entries: &mut [EntryBuf],
        data_written: bool,
        reserve: bool,
    ) -> Result<()> {
        if st.log.pages.is_empty() {
            return Err(Error::NotFound); // freed by a concurrent unlink/release
        }
        let a = self.append_entries(inode.seed, st, entries, reserve)?;
        let tail_off = self.geo.slot_off(inode.ino) + SLOT_TAIL;
        // The DRAM state moves first (nobody sees it: the write lock is held), so the
        // blocks the commit frees are known, and marked ours, before it is durable: a
        // client that dies after the tail store leaves them to the daemon, not leaked.
        let freed = self.apply_owned(st, &a, entries);
        self.await_fenced(inode);
        if data_written {
            if self.fault == Some(CoreFault::TailBeforeData) {
                persist_u64(&self.m, tail_off, a.new_tail);
            }
            self.m.fence();
        }
        // The replica's tail is not kept in step here (a second written and
        // flushed line per commit): `replica` says when it is.
        persist_u64(&self.m, tail_off, a.new_tail);
        self.m.fence();
        self.release_freed(inode.ino, &freed);
        self.after_commit(inode, st, !a.new_pages.is_empty());
        Ok(())
    }

    /// A one-fence commit of `entries` (every byte they cover is checksummed, see
    /// [`Fs::commit_single`]) that lets the write lock go before its flushes and its
    /// fence, so the next writer of the inode appends and applies while this one's
    /// lines drain: under the lock the entries and the tail are stored (cached, not
    /// flushed: the unlock's locked instruction would wait for flushes) and
    /// `inode.unfenced` is set; then the guard is dropped, the entries' lines and the
    /// tail's are flushed, and the fence issued; the blocks the commit replaced are
    /// freed after it, as always. `on_commit` runs under the lock once the tail is
    /// stored. Entries that need a new log page, or a commit that GC must follow,
    /// commit as [`Fs::commit_single`] does. Another process cannot commit to the
    /// inode inside the window: the caller's hold on its cross-process lock
    /// (`Fs::hold`) is dropped only after the fence; a client that dies inside it
    /// leaves entries and tail visible, which the daemon's resolution flushes.
    /// `fence_locked` keeps the lock through the flushes and the fence: a writer
    /// that took the lock before its non-temporal data copy (see `Fs::write_cow`)
    /// drains data and entries with one fence, where an unlock between them would
    /// drain the data alone first. `nt` (only with `fence_locked`) stores the
    /// entries by non-temporal stores instead of cached ones and flushes only the
    /// tail's line: see `Fs::write_cow` for who asks. `on_fail` runs under the lock
    /// when nothing was committed (an error), before the lock goes. `apply` applies
    /// the appended entries (at the addresses given) to the DRAM state, returning
    /// the blocks they freed: [`Fs::apply_decoded`], or a caller's equivalent that
    /// knows them without a decode (entries that take a new log page are always
    /// decoded).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn commit_release(
        &self,
        inode: &Inode,
        mut st: RwLockWriteGuard<'_, InodeState>,
        entries: &mut [EntryBuf],
        on_commit: impl FnOnce(),
        on_fail: impl FnOnce(),
        fence_locked: bool,
        nt: bool,
        apply: impl FnOnce(&mut InodeState, &[u64], &[EntryBuf]) -> Freed,
    ) -> Result<()> {
        assert!(!nt || fence_locked, "non-temporal entries are fenced under the lock");
        if !log::fits_in_page(&st.log, entries) {
            if let Err(e) = self.commit_single(inode, &mut st, entries, false, false) {
                on_fail();
                return Err(e);
            }
            on_commit();
            return Ok(());
        }
        if st.log.pages.is_empty() {
            on_fail();
            return Err(Error::NotFound); // freed by a concurrent unlink/release
        }
        let from = logptr::addr(st.log.tail);
        let a = log::append_in_page(&self.m, &st.log, inode.seed, entries, nt);
        Self::advance_log(&mut st, &a);
        let freed = apply(&mut st, &a.locs, entries);
        self.own_freed(&freed);
        let tail_off = self.geo.slot_off(inode.ino) + SLOT_TAIL;
        self.await_fenced(inode);
        // With the entries streamed, the tail is too: a flushed line held the fence
        // longer than the streamed ones did (see `Medium::store_u64_nt`). An unlock
        // before the fence would wait for a streamed tail, so only under the lock.
        // Not when this process reads the tail back at its next operation on the
        // file, to see whether another process committed meanwhile (it takes the
        // cross-process lock again: `Fs::rereads_tail`): a streamed line is not in
        // the cache then, and that load went to memory (`examples/flush_reload`:
        // 141 ns against 30 for a line flushed by `clwb`).
        let stream_tail = nt && !self.rereads_tail(inode);
        if stream_tail {
            self.m.store_u64_nt(tail_off, a.new_tail);
        } else {
            self.m.store_u64(tail_off, a.new_tail);
        }
        on_commit();
        // Streamed entries and tail need no flush; cached ones flush their lines.
        let persist = || {
            if !nt {
                let to = logptr::addr(a.new_tail);
                self.m.flush(from, to - from);
                self.prefetch_log_lines(to, to - from);
            }
            if !stream_tail {
                self.m.flush(tail_off, 8);
            }
            self.m.fence();
        };
        if fence_locked || self.gc_due(&st, false) {
            persist();
            self.after_commit(inode, &mut st, false);
            // The blocks the commit released are unreachable since `apply`, and
            // durably so since the fence: freeing them (a shard's lock, the free
            // map and counter, reference counts where blocks are shared) needs no
            // lock of the inode, as below, so a reader or a newly arrived writer of
            // the file waits less for this one.
            drop(st);
            self.release_freed(inode.ino, &freed);
            return Ok(());
        }
        inode.unfenced.store(true, Ordering::Relaxed);
        drop(st);
        persist();
        inode.unfenced.store(false, Ordering::Release);
        self.release_freed(inode.ino, &freed);
        Ok(())
    }

    /// Apply committed entries to the DRAM state; the blocks they released are
    /// marked ours (see `commit_single`) and returned, to free after the fence.
    fn apply_owned(&self, st: &mut InodeState, a: &log::Appended, entries: &[EntryBuf]) -> Freed {
        let freed = Self::apply_committed(st, a, entries);
        self.own_freed(&freed);
        freed
    }

    /// Mark blocks a commit released ours (see `commit_single`).
    fn own_freed(&self, freed: &Freed) {
        if let Some(p) = &self.share {
            for &(b, n) in freed {
                self.own_unshared(p, b, n);
            }
        }
    }

    /// Ask the cache for the log lines the inode's next commit of `len` bytes will
    /// write past `tail` (at most four, none past the page's entry area). Issued
    /// before a commit's fence, their misses overlap with its drain instead of
    /// stalling the next commit's first stores. A hint only: nothing is stored.
    fn prefetch_log_lines(&self, tail: u64, len: u64) {
        use crate::pmem::CACHE_LINE;
        // The tail's own line, if partly written, is in the cache already.
        let first = tail.next_multiple_of(CACHE_LINE);
        let end = (tail + len.min(4 * CACHE_LINE)).min((tail & !(BLOCK - 1)) + log::LOG_DATA_END);
        let mut off = first;
        while off < end {
            self.m.prefetch(off);
            off += CACHE_LINE;
        }
    }

    /// Wait until no commit of `inode` is between its tail store and its fence
    /// (unless a test skips it: `CoreFault::NoFenceWait`). Called under the write
    /// lock before every store that could make a later state of the log durable (a
    /// tail store, a journal commit, GC's unlinks, freeing the inode), so that a
    /// crash finds at most the log's last operation unfenced: recovery checks that
    /// one's data. The commit waited for holds no lock and only has its flushes and
    /// fence left, so the wait is short.
    pub(crate) fn await_fenced(&self, inode: &Inode) {
        if self.fault == Some(CoreFault::NoFenceWait) {
            return;
        }
        let mut spins = 0u32;
        while inode.unfenced.load(Ordering::Acquire) {
            self.m.wait_point();
            if spins < 256 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now(); // its thread lost the CPU
            }
        }
    }

    /// Free the blocks a commit of `ino` released, once it fenced.
    fn release_freed(&self, ino: u64, freed: &Freed) {
        if !freed.is_empty() {
            self.note_free(ino);
            self.free_runs(freed);
        }
    }

    /// Commit entries of several inodes (and create / free inodes) atomically
    /// through the journal.
    pub(crate) fn commit_multi(
        &self,
        locked: &mut Locked<'_, M>,
        parts: &mut [Part],
        mut new: Option<&mut NewInode>,
        free: &[u64],
        reserve: bool,
    ) -> Result<Option<Arc<Inode>>> {
        if parts
            .iter()
            .map(|p| p.ino)
            .chain(free.iter().copied())
            .any(|i| locked.st(i).log.pages.is_empty())
        {
            return Err(Error::NotFound); // freed by a concurrent operation
        }
        // The journal is taken before the entries are written (see `journal_open`),
        // except by a direct-access client, which takes it only at the commit:
        // writing may ask the daemon for blocks, and a client must not wait on the
        // daemon while it holds a lock the daemon may need.
        // The journal reads each touched slot (its replica's bytes) after the first
        // fence; asked for now, a cold slot arrives while the entries are written.
        // `profile_op metapath` with 5,000 files a directory, five alternating runs:
        // unlink 1.71-1.95 -> 1.52-1.62 us (with 300 files, within the noise).
        for &ino in parts.iter().map(|p| &p.ino).chain(free) {
            self.m.prefetch(self.geo.slot_off(ino));
        }
        let early = if self.is_client() { None } else { Some(self.journal_open()?) };
        // Inline vectors: a create, unlink or rename (up to four inodes) allocates
        // nothing here.
        let mut appended: SmallVec<[log::Appended; 4]> = SmallVec::new();
        let mut new_app: Option<log::Appended> = None;
        let mut cleanup_pages: SmallVec<[u64; 4]> = SmallVec::new();
        let res = (|| -> Result<()> {
            for p in parts.iter_mut() {
                let inode = locked.inode(p.ino);
                let a =
                    self.append_entries(inode.seed, locked.st(p.ino), &mut p.entries, reserve)?;
                cleanup_pages.extend_from_slice(&a.new_pages);
                appended.push(a);
            }
            Ok(())
        })();
        if let Err(e) = res {
            self.free_pages(&cleanup_pages);
            return Err(e);
        }
        let mut recs: SmallVec<[Record; 6]> = SmallVec::new();
        if let Some(n) = new.as_deref_mut() {
            let shard = self.shard();
            let mut taken = log::Pages::new();
            let mut alloc = || self.alloc_log_page(shard, reserve);
            let r = log::write_fresh(
                &self.m,
                0,
                1,
                n.head_page,
                n.seed,
                &mut n.entries,
                &mut alloc,
                &mut taken,
            );
            let a = match r {
                Ok(a) => a,
                Err(e) => {
                    self.free_pages(&taken);
                    self.free_pages(&cleanup_pages);
                    return Err(e);
                }
            };
            let slot = InodeSlot {
                state: n.state_word,
                head: logptr::make(0, n.head_page),
                tail: a.new_tail,
                ftype: n.ftype.code() as u32,
                ..Default::default()
            };
            let off = self.geo.slot_off(n.ino);
            let bytes = slot.encode();
            self.m.write(off + 8, &bytes[8..]);
            self.m.flush(off, 64);
            recs.push(Record { addr: off + SLOT_STATE, old: n.state_word, new: n.state_word + 1 });
            new_app = Some(a);
        }
        for (p, a) in parts.iter().zip(&appended) {
            let old = locked.st(p.ino).log.tail;
            recs.push(Record { addr: self.geo.slot_off(p.ino) + SLOT_TAIL, old, new: a.new_tail });
        }
        for &ino in free {
            let w = locked.inode(ino).state_word;
            recs.push(Record { addr: self.geo.slot_off(ino) + SLOT_STATE, old: w, new: w + 1 });
        }
        for &ino in parts.iter().map(|p| &p.ino).chain(free) {
            self.await_fenced(locked.inode(ino));
        }
        let tx = match early {
            Some(tx) => Ok(tx),
            None => self.journal_open(),
        };
        let tx = match tx {
            Ok(tx) => tx,
            Err(e) => {
                // Nothing was applied: the new entries and pages are unreachable.
                self.free_pages(&cleanup_pages);
                if let Some(a) = &new_app {
                    self.free_pages(&a.new_pages);
                }
                return Err(e);
            }
        };
        // DRAM side, in two parts while the journal's two fences drain: the inodes
        // are locked, so nobody sees the new state before the operation is durable,
        // and nothing is freed or published before it (below). Work before each
        // fence overlaps its drain. `profile_op metapath` (a create by path and its
        // close, an unlink by path; four alternating runs): split so, 1.27-1.32 and
        // 1.23-1.30 us; all of it before the second fence, 1.34-1.40 and 1.25-1.31;
        // all after it (before 2026-11-30), 1.48-1.54 and 1.56-1.59.
        let mut all_freed = Freed::new();
        let mut created: Option<Arc<Inode>> = None;
        let mut freed_from: SmallVec<[u64; 2]> = SmallVec::new();
        let mut freed_logs: SmallVec<[SmallVec<[u64; 4]>; 1]> = SmallVec::new();
        // Freed slots and their log pages: no lazily finished transaction may stay
        // active on media once they can be reused (`journal::LazyMarks`); this
        // transaction's begin rewrites its own shard's header.
        let settling =
            if free.is_empty() { Default::default() } else { self.settle_marks(Some(tx.shard)) };
        let lazy = parts.iter().all(|p| !free.contains(&p.ino));
        self.journal_run(tx, &recs, lazy, |at| match at {
            Drain::Records => {
                for (p, a) in parts.iter().zip(&appended) {
                    let f = Self::apply_committed(locked.st_mut(p.ino), a, &p.entries);
                    if !f.is_empty() {
                        freed_from.push(p.ino);
                    }
                    all_freed.extend(f);
                }
            }
            Drain::Words => {
                if let (Some(n), Some(a)) = (new.as_deref(), &new_app) {
                    let mut st = InodeState::new(n.ftype);
                    st.log.head = logptr::make(0, n.head_page);
                    st.log.pages.push(n.head_page);
                    let freed = Self::apply_committed(&mut st, a, &n.entries);
                    debug_assert!(freed.is_empty());
                    st.chain_gen = self.share.as_ref().map_or(0, |p| p.table().chain_gen(n.ino));
                    let shared = self.share.is_some() && n.ftype == FileType::Regular;
                    let (ino, state) = (n.ino, n.state_word + 1);
                    created = Some(Arc::new(Inode::new(ino, state, n.seed, st, shared)));
                }
                for &ino in free {
                    let st = locked.st_mut(ino);
                    all_freed.extend(st.data_runs());
                    freed_logs.push(std::mem::take(&mut st.log.pages).into_pages());
                    let ftype = st.ftype;
                    *st = InodeState::new(ftype); // nothing of the freed inode stays reachable
                }
            }
        });
        self.marks.settled(&settling);
        for &ino in &freed_from {
            self.note_free(ino);
        }
        assert_eq!(freed_logs.len(), free.len(), "every freed inode's log was taken");
        for (&ino, pages) in free.iter().zip(&freed_logs) {
            self.note_free(ino);
            self.free_pages(pages);
            // Uncache before the number is free again: after `ialloc.free` another
            // thread may create a new inode with this number and cache it.
            self.cache_remove(locked.inode(ino));
            self.free_ino(ino);
        }
        self.free_runs(&all_freed);
        for p in parts.iter() {
            let inode = locked.inode(p.ino);
            if !free.contains(&p.ino) {
                let st = locked.st_mut(p.ino);
                self.after_commit(inode, st, true);
            }
        }
        if let Some(inode) = &created {
            self.cache_insert(inode.clone());
        }
        Ok(created)
    }

    /// The journal protocol for `recs` (see `journal`): begin, fence, apply, fence,
    /// finish. Also used by thorough GC.
    pub(crate) fn journal_commit(&self, recs: &[Record]) -> Result<()> {
        let tx = self.journal_open()?;
        self.journal_run(tx, recs, true, |_| {});
        Ok(())
    }

    /// Take this CPU's journal for one transaction. `commit_multi` takes it before
    /// it writes and flushes its entries (a client excepted): the lock is a locked
    /// instruction, which on x86 waits for the core's flushes in flight.
    pub(crate) fn journal_open(&self) -> Result<JournalTx<'_>> {
        let shard = self.shard();
        // On a shared pool a journal is locked across processes and its transaction
        // ids live in the table; otherwise this process's mutex and counter do.
        match &self.share {
            Some(p) => {
                let t = p.table();
                t.lock_journal(shard, p.id(), None, &|slept| {
                    if slept == crate::share::LONG_WAIT {
                        p.report_wait(&format!("journal {shard}"), t.journal_holder(shard));
                    }
                    p.check()
                })?;
                if let Err(e) = p.check() {
                    t.unlock_journal(shard, p.id());
                    return Err(e);
                }
                Ok(JournalTx { shard, held: Held::Shared(t, p.id()) })
            }
            None => Ok(JournalTx { shard, held: Held::Local(self.txids[shard as usize].lock()) }),
        }
    }

    /// Run the transaction of `recs` in the journal `tx` holds, then let it go.
    /// `dram` runs right before each of the two fences, told which one: work on
    /// DRAM state only, which overlaps the drain of the flushes before it.
    pub(crate) fn journal_run(
        &self,
        mut tx: JournalTx<'_>,
        recs: &[Record],
        lazy: bool,
        mut dram: impl FnMut(Drain),
    ) {
        let shard = tx.shard;
        let txid = match &mut tx.held {
            Held::Local(g) => {
                **g += 1;
                **g
            }
            Held::Shared(t, _) => t.next_txid(shard),
        };
        if self.fault == Some(CoreFault::JournalOutOfOrder) {
            dram(Drain::Records);
            dram(Drain::Words);
            journal::apply(&self.m, &self.geo, recs);
            self.m.fence();
            journal::begin(&self.m, &self.geo, shard, txid, recs);
            self.m.fence();
        } else {
            journal::begin(&self.m, &self.geo, shard, txid, recs);
            dram(Drain::Records);
            self.m.fence();
            journal::apply(&self.m, &self.geo, recs);
            dram(Drain::Words);
            self.m.fence();
        }
        // A pool this process alone uses leaves the inactive mark in the cache (see
        // `journal::LazyMarks`): the release of the locks below no longer waits for
        // its flush. A shared pool's parties cannot see each other's marks, and a
        // transaction that names a slot it also frees would leave a word free to
        // come back under its own mark: both flush it, as before.
        match &tx.held {
            Held::Local(_) if lazy => {
                journal::finish_lazy(&self.m, &self.geo, shard, txid);
                self.marks.stored(shard, txid);
            }
            _ => journal::finish(&self.m, &self.geo, shard, txid),
        }
        drop(tx);
    }

    /// Flush the journal headers whose lazy marks may not be on media (but
    /// `skip`'s): called before the fence that precedes freeing a log page or an
    /// inode slot, holding the inode's lock; pass the result to
    /// `self.marks.settled` after that fence.
    pub(crate) fn settle_marks(&self, skip: Option<u32>) -> crate::journal::Settling {
        if self.fault == Some(CoreFault::UnsettledMarks) {
            return crate::journal::Settling::new();
        }
        self.marks.settle(&self.m, &self.geo, skip)
    }

    /// Fence, with every lazy mark settled by it (`settle_marks`, then the fence).
    pub(crate) fn fence_settled(&self) {
        let settling = self.settle_marks(None);
        self.m.fence();
        self.marks.settled(&settling);
    }

    /// Free an inode whose last link is gone and that is no longer open: one
    /// 8-byte state store, one fence.
    pub(crate) fn free_inode_now(&self, inode: &Inode, st: &mut InodeState) {
        self.await_fenced(inode);
        let off = self.geo.slot_off(inode.ino) + SLOT_STATE;
        persist_u64(&self.m, off, inode.state_word + 1);
        crate::replica::sync_slot(&self.m, &self.geo, inode.ino);
        self.fence_settled(); // the slot and its log pages go
        self.note_free(inode.ino);
        let runs = st.data_runs();
        self.free_runs(&runs);
        let pages = std::mem::take(&mut st.log.pages).to_vec();
        *st = InodeState::new(st.ftype); // nothing of the freed inode stays reachable
        self.free_pages(&pages);
        self.cache_remove(inode); // before the number can be reused (see commit_multi)
        self.free_ino(inode.ino);
    }

    /// Build a SETATTR entry for `st` with changes from `f`.
    pub(crate) fn setattr_entry(
        st: &InodeState,
        f: impl FnOnce(&mut AttrRec),
    ) -> (EntryBuf, AttrRec) {
        let (a, shrink) = Self::attr_change(st, f);
        (EntryBuf::setattr(&a, shrink), a)
    }

    /// [`Fs::setattr_entry`], encoded where it stays: at the end of `entries`.
    pub(crate) fn push_setattr(
        entries: &mut Entries,
        st: &InodeState,
        f: impl FnOnce(&mut AttrRec),
    ) -> AttrRec {
        let (a, shrink) = Self::attr_change(st, f);
        EntryBuf::push(entries).set_setattr(&a, shrink);
        a
    }

    /// `st`'s attributes changed by `f`, and whether that shrinks a file.
    fn attr_change(st: &InodeState, f: impl FnOnce(&mut AttrRec)) -> (AttrRec, bool) {
        let mut a = st.attr;
        f(&mut a);
        (a, a.size < st.attr.size && st.ftype != FileType::Directory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Fs<crate::dax::MmapMedium>>();
        check::<Fs<crate::sim::SimMedium>>();
    }

    /// Renames within one directory took the global rename lock until 2026-11-30,
    /// so two threads renaming in their own directories ran no faster than one.
    /// With the lock held elsewhere, a rename inside a directory completes and a
    /// rename between directories waits for it.
    #[test]
    fn only_renames_between_directories_take_the_rename_lock() {
        use std::sync::mpsc;
        use std::time::Duration;
        let m = crate::sim::SimMedium::new(64 << 20);
        let fs = Fs::mkfs(m, &MkfsOptions { shards: 2, ..Default::default() }).unwrap();
        let root = fs.root();
        let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        let e = fs.mkdir(root, b"e", 0o755, 0, 0).unwrap().ino;
        fs.create(d, b"a", 0o644, 0, 0).unwrap();
        fs.create(d, b"b", 0o644, 0, 0).unwrap();
        let held = fs.rename_lock.lock();
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let (fs, tx2) = (&fs, tx.clone());
            s.spawn(move || {
                tx.send(("within", fs.rename(d, b"a", d, b"c", RenameFlags::default()))).unwrap();
            });
            let (what, r) = rx.recv_timeout(Duration::from_secs(60)).expect("rename inside d");
            assert_eq!(what, "within");
            r.unwrap();
            s.spawn(move || {
                tx2.send(("between", fs.rename(d, b"b", e, b"b", RenameFlags::default()))).unwrap();
            });
            // It cannot finish while the lock is held here.
            assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
            drop(held);
            let (what, r) = rx.recv_timeout(Duration::from_secs(60)).expect("rename d to e");
            assert_eq!(what, "between");
            r.unwrap();
        });
        assert!(fs.lookup_ino(d, b"c").is_ok() && fs.lookup_ino(d, b"a").is_err());
        assert!(fs.lookup_ino(e, b"b").is_ok() && fs.lookup_ino(d, b"b").is_err());
    }
}
