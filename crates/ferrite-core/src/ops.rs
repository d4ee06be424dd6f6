//! POSIX operations on a mounted pool.

use crate::acl;
use crate::error::{Error, Result};
use crate::fs::{
    Attr, DirEntry, Entries, FallocMode, Fs, Inode, Locked, NewInode, NewNode, Part, RenameFlags,
    SetAttr, SetTime, StatFs, XattrSet,
};
use crate::index::{self, Body, FileType, InodeState, PageOps};
use crate::layout::{BLOCK, MAX_FILE_SIZE, NAME_MAX};
use crate::log::{self, AttrRec, EntryBuf, EntryBytes, Ts, MAX_ENTRY, XATTR_HDR};
use crate::pmem::Medium;
use parking_lot::{RwLockReadGuard, RwLockWriteGuard};
use smallvec::SmallVec;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What a shortcut of the write path returns ([`Fs::append_run`],
/// [`Fs::write_embedded`]): the commit's result, or the inode's lock handed back
/// when the write is not its case.
type Shortcut<'a> = std::result::Result<Result<()>, RwLockWriteGuard<'a, InodeState>>;

/// Sub-page writes up to this many bytes are embedded in the log (NOVA-datalog).
pub const INLINE_MAX: usize = 2048;
/// A page with this many overlays is merged into a new page at its next write.
/// (A merge writes a whole page: with 16, a 64 B random write cost 5.8-5.9 pool
/// bytes per byte written in `ferrite bench --quick`, a merge's 4 KiB every 17
/// writes over an entry and a tail each; with 32, 3.8-4.2, issue 9's budget of
/// about 4. The price: a page's log entries take up to twice the log space before
/// its merge, and a 4 KiB read of a page with 32 overlays took 1.16 µs against
/// 0.88 µs with at most 16: `profile_op randread4k`, FERRITE_PROFILE_OVERLAYS=32.)
pub const MAX_PAGE_OPS: usize = 32;
/// Embedded bytes a page may carry before its next sub-page write merges it into a
/// new page (bounds DRAM per page and the cost of reading a page).
pub const PAGE_INLINE_BYTES: usize = 2048;
/// Overlays the file's last page may carry (appends land there; the append that
/// completes the page merges them, so appended pages are written once).
pub const TAIL_PAGE_OPS: usize = 64;
/// Appends of at least this many bytes by a file's only writer go in place into
/// the last page's block past the end of file ([`log::FLAG_TAIL`]) rather than
/// into the log: data written once, a small entry, no merge. (At 64 bytes, with
/// the in-place path trimmed, `ferrite bench --quick`'s 64 B appends + fsync went
/// from 146-148 MB/s embedded to 161-168 in place, pool bytes per user byte from
/// 4.91 to 3.39 in pairs of its append experiment alone; a mixed run with the
/// micro experiment first measured them slower, see docs/BENCHMARKS.md. Shorter
/// appends were not measured and stay embedded.)
pub const IN_PLACE_MIN: usize = 64;
/// Largest extended attribute value kept inside its log entry; larger ones, up to
/// [`log::XATTR_SIZE_MAX`], live in data blocks the entry names.
pub const XATTR_VALUE_MAX: usize = MAX_ENTRY - XATTR_HDR - 255;
/// Longest symlink target.
pub const SYMLINK_MAX: usize = 4095;

/// What a new node carries besides its attributes.
#[derive(Clone, Copy)]
enum NodeData<'a> {
    None,
    /// A symlink's target.
    Target(&'a [u8]),
    /// A device node's number.
    Rdev(u32),
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() {
        return Err(Error::NotFound);
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    if name.contains(&b'/') || name.contains(&0) {
        return Err(Error::invalid("name contains '/' or NUL"));
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

fn resolve_time(t: SetTime, now: Ts) -> Ts {
    match t {
        SetTime::Now => now,
        SetTime::At(ts) => ts,
    }
}

thread_local! {
    /// A page buffer kept for this thread's next merge (`Piece::Merged`): reused,
    /// not allocated and zeroed per merge, as `read_page_verified` writes all of it.
    static SPARE_PAGE: std::cell::Cell<Option<Box<[u8; BLOCK as usize]>>> =
        const { std::cell::Cell::new(None) };
    /// The heap buffer of this thread's last embedded write whose entry did not fit
    /// an `EntryBytes`'s inline bytes, kept for the next one (no allocation and
    /// free per 256-byte append).
    static SPARE_ENTRY: std::cell::Cell<Option<Vec<u8>>> = const { std::cell::Cell::new(None) };
}

/// Data bytes of an embedded write whose INLINE entry fits `EntryBytes`'s inline
/// capacity (longer ones take `SPARE_ENTRY`).
const INLINE_IN_PLACE: usize = log::ENTRY_INLINE - log::INLINE_HDR;

/// This thread's spare page buffer, or a new one. Its content is stale: the caller
/// overwrites all of it.
pub(crate) fn spare_page() -> Box<[u8; BLOCK as usize]> {
    // try_with: a write made while the thread is torn down (a destructor of
    // another thread-local, an atexit handler after the main thread's were
    // destroyed) finds its spare gone and allocates.
    SPARE_PAGE
        .try_with(|c| c.take())
        .ok()
        .flatten()
        .unwrap_or_else(|| Box::new([0u8; BLOCK as usize]))
}

/// Keep `page` as this thread's spare page buffer (see [`spare_page`]).
pub(crate) fn keep_spare_page(page: Box<[u8; BLOCK as usize]>) {
    let _ = SPARE_PAGE.try_with(|c| c.set(Some(page)));
}

/// The state lock a write plans under: read, or write for a lone writer, which
/// keeps it (see `Fs::write_cow`).
enum Plan<'a> {
    R(RwLockReadGuard<'a, InodeState>),
    W(RwLockWriteGuard<'a, InodeState>),
}

impl std::ops::Deref for Plan<'_> {
    type Target = InodeState;
    fn deref(&self) -> &InodeState {
        match self {
            Plan::R(g) => g,
            Plan::W(g) => g,
        }
    }
}

/// A planned piece of a write inside one page.
enum Piece {
    /// Whole new page content comes from the caller's buffer at this offset.
    Full { pg: u64, src: usize },
    /// Page rebuilt in DRAM (read-modify-write), then copied on write.
    Merged { pg: u64, page: Box<[u8; BLOCK as usize]> },
    /// Embedded in the log.
    Inline { off: u64, src: usize, len: usize },
    /// An append written in place past the end of file into the last page's
    /// block (`run`), or into a new block for a page it starts (`run` None).
    InPlace { pg: u64, src: usize, len: usize, run: Option<index::TailRun> },
}

impl Piece {
    /// Does it need a new block?
    fn needs_block(&self) -> bool {
        !matches!(self, Piece::Inline { .. } | Piece::InPlace { run: Some(_), .. })
    }
}

/// The parts of a rename (at most four inodes), each built where it stays.
struct Parts {
    parts: [Part; 4],
    n: usize,
}

impl Parts {
    fn new() -> Self {
        let part = || Part { ino: 0, entries: Entries::new() };
        Parts { parts: [part(), part(), part(), part()], n: 0 }
    }

    /// The entries of `ino`'s part, a new part after the others if it has none.
    fn of(&mut self, ino: u64) -> &mut Entries {
        let k = match self.parts[..self.n].iter().position(|p| p.ino == ino) {
            Some(k) => k,
            None => {
                assert!(self.n < self.parts.len(), "a rename touches at most four inodes");
                self.parts[self.n].ino = ino;
                self.n += 1;
                self.n - 1
            }
        };
        &mut self.parts[k].entries
    }
}

impl<M: Medium> Fs<M> {
    // ----------------------------------------------------------------- lookup

    /// Look up `name` in directory `parent`.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let ino = self.lookup_ino(parent, name)?;
        self.getattr(ino)
    }

    /// Inode number of `name` in `parent` ("." and ".." included).
    pub fn lookup_ino(&self, parent: u64, name: &[u8]) -> Result<u64> {
        self.lookup_typed(parent, name).map(|(ino, _)| ino)
    }

    /// Inode number of `name` in `parent` and whether it is a symbolic link (as
    /// its directory entry records the type): one step of a path walk.
    pub(crate) fn lookup_typed(&self, parent: u64, name: &[u8]) -> Result<(u64, bool)> {
        let (ino, t) = self.lookup_entry(parent, name)?;
        Ok((ino, t == Some(FileType::Symlink)))
    }

    /// Inode number of `name` in `parent` and its type as the directory entry
    /// records it (`None` for a type code this build does not know).
    pub(crate) fn lookup_entry(&self, parent: u64, name: &[u8]) -> Result<(u64, Option<FileType>)> {
        self.lookup_in(&*self.inode(parent)?, name)
    }

    /// [`Fs::lookup_entry`] in a directory whose `Inode` the caller holds.
    fn lookup_in(&self, p: &Inode, name: &[u8]) -> Result<(u64, Option<FileType>)> {
        let parent = p.ino;
        let st = p.st.read();
        let Some(d) = st.dir() else { return Err(Error::NotDir) };
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        let dir = Some(FileType::Directory);
        match name {
            b"." => Ok((parent, dir)),
            b".." => Ok((if st.attr.parent == 0 { parent } else { st.attr.parent }, dir)),
            // A match, not `ok_or`: an error built eagerly is dropped on success.
            _ => match d.names.get(name) {
                Some(e) => Ok((e.ino, FileType::from_code(u32::from(e.ftype)))),
                None => Err(Error::NotFound),
            },
        }
    }

    /// Attributes of `ino`.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let i = self.inode(ino)?;
        self.read_fresh(&i, false, |st| self.attr_of(&i, st))
    }

    // ------------------------------------------------------------ open/close

    /// Note an open handle: an unlinked file stays readable until its last release.
    pub fn open(&self, ino: u64) -> Result<Attr> {
        let i = self.inode(ino)?;
        // Count the handle first: an unlink or release frees the inode only when it
        // sees no handle under the write lock, so once we hold the read lock the
        // inode is either freed already (an empty log: ENOENT) or kept for us.
        i.open.fetch_add(1, Ordering::AcqRel);
        if i.st.read().log.pages.is_empty() {
            i.open.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::NotFound);
        }
        // The attributes as committed (another process's direct writes included): a
        // front end may let the kernel cache them.
        let a = self.read_fresh(&i, false, |st| self.attr_of(&i, st));
        if a.is_err() {
            i.open.fetch_sub(1, Ordering::AcqRel);
        }
        a
    }

    /// Release a handle taken with [`Fs::open`].
    pub fn release(&self, ino: u64) -> Result<()> {
        let i = self.inode(ino)?;
        let prev = i.open.fetch_sub(1, Ordering::AcqRel);
        if prev == 0 {
            i.open.fetch_add(1, Ordering::AcqRel);
            return Err(Error::BadHandle);
        }
        if prev == 1 && !self.read_only {
            // The last handle: persist an access time kept in DRAM.
            self.persist_atime_best_effort(&i);
        }
        if prev == 1 && !self.read_only && !self.is_client() {
            let _h = self.hold(&i)?;
            let mut st = i.st.write();
            // An empty log: freed already (a handle on a stale copy must not free
            // the number a second time).
            let live = !st.log.pages.is_empty();
            if live && st.attr.nlink == 0 && i.open.load(Ordering::Acquire) == 0 {
                self.free_inode_now(&i, &mut st);
            }
        }
        Ok(())
    }

    // ------------------------------------------------------------------ read

    /// Read up to `buf.len()` bytes at `off`; returns the count (0 at EOF).
    pub fn read(&self, ino: u64, off: u64, buf: &mut [u8]) -> Result<usize> {
        let i = self.inode(ino)?;
        match i.st.read().ftype {
            FileType::Directory => return Err(Error::IsDir),
            FileType::Symlink => return Err(Error::invalid("read of a symlink")),
            t if t.is_special() => return Err(Error::invalid("read of a special file")),
            _ => {}
        }
        let (n, persist) = self.read_fresh(&i, true, |st| {
            let n = self.read_locked(&i, st, off, buf);
            (n, self.touch_atime(&i, st))
        })?;
        let n = n?;
        if persist {
            self.persist_atime_best_effort(&i);
        }
        Ok(n)
    }

    /// Read under the inode's lock, verifying each data block the read touches as
    /// the mount's [`VerifyMode`](crate::VerifyMode) says (see `verify`).
    fn read_locked(&self, i: &Inode, st: &InodeState, off: u64, buf: &mut [u8]) -> Result<usize> {
        let size = st.attr.size;
        if off >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(size - off) as usize;
        let mut done = 0usize;
        while done < n {
            let pos = off + done as u64;
            let pg = pos / BLOCK;
            let a = (pos % BLOCK) as usize;
            let b = (a + (n - done)).min(BLOCK as usize);
            let dst = &mut buf[done..done + (b - a)];
            match self.block_to_verify(st, pg) {
                None => st.read_page(&self.m, pg, a, b, dst),
                Some((blk, loc)) if b - a == BLOCK as usize && st.page_ops(pg).0 == 0 => {
                    // A whole page without overlays: check the bytes read.
                    self.m.read(blk * BLOCK, dst);
                    self.verify_page(i, pg, blk, loc, dst)?;
                }
                Some((blk, loc)) => {
                    // The base read once: checked, then the overlays laid on it.
                    let mut page = [0u8; BLOCK as usize];
                    let ops = st.page_op_list(pg);
                    index::prefetch_ops(&self.m, ops);
                    self.m.read(blk * BLOCK, &mut page);
                    self.verify_page(i, pg, blk, loc, &page)?;
                    index::lay_ops(&self.m, ops, &mut page);
                    dst.copy_from_slice(&page[a..b]);
                }
            }
            done += b - a;
        }
        Ok(n)
    }

    /// Page `pg`'s content into `page` (a whole page): checked first where reads
    /// check (damaged content must not be copied under a fresh checksum), then the
    /// bytes below `len` as the file shows them and zeros after.
    pub(crate) fn read_page_verified(
        &self,
        i: &Inode,
        st: &InodeState,
        pg: u64,
        page: &mut [u8],
        len: usize,
    ) -> Result<()> {
        debug_assert!(page.len() == BLOCK as usize && len <= page.len());
        let ops = st.page_op_list(pg);
        index::prefetch_ops(&self.m, ops);
        // The base block read once (it was read twice: to check it, then to
        // compose), checked where reads check, then the overlays laid on it.
        match st.file().and_then(|f| f.lookup(pg)) {
            Some((blk, loc)) => {
                self.m.read(blk * BLOCK, page);
                if self.must_verify(blk) {
                    self.verify_page(i, pg, blk, loc, page)?;
                }
            }
            None => page.fill(0),
        }
        index::lay_ops(&self.m, ops, page);
        page[len..].fill(0);
        Ok(())
    }

    /// The block of page `pg` and its WRITE entry, when a read must check it.
    pub(crate) fn block_to_verify(&self, st: &InodeState, pg: u64) -> Option<(u64, u64)> {
        if self.verify == crate::VerifyMode::Off {
            return None;
        }
        let (blk, loc) = st.file()?.lookup(pg)?;
        self.must_verify(blk).then_some((blk, loc))
    }

    /// Whether a read of block `blk` must check it (reads check every time, or
    /// the first time after a mount, or never).
    fn must_verify(&self, blk: u64) -> bool {
        match self.verify {
            crate::VerifyMode::Off => false,
            crate::VerifyMode::FirstTouch => !self.verified.get(blk),
            crate::VerifyMode::Always => true,
        }
    }

    /// Blocks this process has just filled and committed (merged pages) need no
    /// check at their first read: their content and its checksum came from the
    /// same loads of a DRAM page, and [`crate::VerifyMode::FirstTouch`] checks what
    /// was on the media before the mount, once. A merged page is the one read
    /// again soonest: its next sub-page writes merge it again, and each merge read
    /// its page checked, a 4 KiB checksum and a cold load of the WRITE entry for a
    /// page written moments before (`profile_op randwrite64`: about 1.5% of the
    /// time). Whole-page writes are not marked: a bit set per write is a locked
    /// instruction per write, for pages that may never be read. Nor are blocks of a
    /// pool shared with direct-access clients, whose frees this process does not
    /// see (a bit left set would skip the check of another process's data).
    fn mark_written(&self, blocks: &[u64]) {
        if self.verify != crate::VerifyMode::FirstTouch || self.share.is_some() {
            return;
        }
        for &b in blocks {
            self.verified.set(b);
        }
    }

    /// Compare `page` (the content of block `blk`, file page `pg`) with the checksum
    /// its WRITE entry at `loc` carries; mark the block verified when it matches or
    /// cannot be checked (no checksum stored).
    pub(crate) fn verify_page(
        &self,
        i: &Inode,
        pg: u64,
        blk: u64,
        loc: u64,
        page: &[u8],
    ) -> Result<()> {
        let want = log::write_page_crc(&self.m, loc, blk);
        let ok = match want {
            Ok(Some(c)) => log::page_crc(i.seed, page) == c || self.past_tail_only(i, loc, page, c),
            Ok(None) => true,
            Err(_) => false,
        };
        if !ok {
            return Err(Error::DataCorrupt { ino: i.ino, offset: pg * BLOCK, block: blk });
        }
        self.verified.set(blk);
        Ok(())
    }

    /// Does `page`, the block of the in-place append at `loc` in a file other
    /// processes write, match checksum `want` once the bytes past the size that
    /// append gave the page are taken as zero, as its checksum takes them? Another
    /// process's append in flight, or one committed after this process's view of
    /// the file, streams its bytes there while this one reads (no lock of the
    /// other process is held for a read). A file only this process writes keeps
    /// those bytes zero (appends run under the state lock a read takes), so a
    /// mismatch there stays one.
    fn past_tail_only(&self, i: &Inode, loc: u64, page: &[u8], want: u32) -> bool {
        if !i.shared {
            return false;
        }
        let Some(valid) = log::tail_valid_at(&self.m, loc) else { return false };
        let mut masked = [0u8; BLOCK as usize];
        masked[..valid].copy_from_slice(&page[..valid]);
        log::page_crc(i.seed, &masked) == want
    }

    /// Target of a symlink.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.inode(ino)?;
        let st = i.st.read();
        if st.ftype != FileType::Symlink {
            return Err(Error::invalid("not a symlink"));
        }
        // The size comes from the log: never allocate what no symlink can hold.
        if st.attr.size == 0 || st.attr.size > SYMLINK_MAX as u64 {
            return Err(Error::corrupt(format!("symlink {ino} has size {}", st.attr.size)));
        }
        let mut v = vec![0u8; st.attr.size as usize];
        let n = self.read_locked(&i, &st, 0, &mut v)?;
        v.truncate(n);
        Ok(v)
    }

    // ----------------------------------------------------------------- write

    /// Write `data` at `off`, as a writer with `CAP_FSETID` (set-user-id and
    /// set-group-id bits stay; a `security.capability` attribute goes, see
    /// [`crate::privs`]). Durable and atomic when it returns.
    pub fn write(&self, ino: u64, off: u64, data: &[u8]) -> Result<usize> {
        self.write_as(ino, off, data, || false)
    }

    /// [`Fs::write`] by a writer that may lack `CAP_FSETID`: `lacks_fsetid` is asked
    /// (under the inode's lock) only if the file has a set-user-id or set-group-id
    /// bit, which the write then clears in the same commit.
    pub fn write_as(
        &self,
        ino: u64,
        off: u64,
        data: &[u8],
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<usize> {
        self.check_writable()?;
        let i = self.inode(ino)?;
        if data.len() < BLOCK as usize {
            // The page's overlay list, asked for now, arrives while the checks and
            // locks below run (see `Inode::ops_hint`).
            crate::pagemap::prefetch_hinted::<PageOps>(
                i.ops_hint.load(Ordering::Relaxed),
                off / BLOCK,
            );
        }
        self.check_regular(&i)?;
        // As pwrite(2): a negative offset, or one whose end is past the largest
        // loff_t, is EINVAL (rw_verify_area), even for an empty write.
        if off > MAX_FILE_SIZE {
            return Err(Error::invalid("negative offset"));
        }
        if data.is_empty() {
            return Ok(0);
        }
        let end =
            off.checked_add(data.len() as u64).ok_or_else(|| Error::invalid("offset overflow"))?;
        if end > MAX_FILE_SIZE {
            return Err(Error::invalid("offset + length overflows loff_t"));
        }
        let _h = self.hold(&i)?;
        let _r = i.ranges.lock(off / BLOCK, end.div_ceil(BLOCK));
        self.write_locked_range(&i, off, data, lacks_fsetid)?;
        self.note_written(ino);
        Ok(data.len())
    }

    /// Remember `ino` as the file this thread last wrote (see [`crate::fs::WriteMemo`]).
    fn note_written(&self, ino: u64) {
        let frees = self.inode_frees.load(Ordering::Acquire);
        let memo = crate::fs::WriteMemo { fs: self.id, ino, frees };
        let _ = crate::fs::LAST_WRITTEN.try_with(|c| c.set(memo));
    }

    /// copy_file_range(2) between two files of this pool (or within one): up to
    /// `len` bytes from `src` at `off_in` to `dst` at `off_out`; returns the bytes
    /// copied (0 at or past the source's end). The kernel's checks: both regular
    /// files (EISDIR, EINVAL), no overlap within one file (EINVAL), EFBIG past the
    /// largest file. Whole pages that line up in both files (offsets equal modulo
    /// the page size) are shared, not copied (a reflink, [`Fs::clone_range`]: one
    /// commit for all of them); the bytes before and after them are copied in
    /// commits of up to 1 MiB. Each commit is durable and atomic, as writes by
    /// `lacks_fsetid` (see [`Fs::write_as`]); a failure after some progress
    /// returns what was done, as the system call does.
    pub fn copy_range_as(
        &self,
        src: u64,
        off_in: u64,
        dst: u64,
        off_out: u64,
        len: u64,
        lacks_fsetid: impl Fn() -> bool,
    ) -> Result<u64> {
        self.range_pair(src, off_in, dst, off_out)?;
        let size = self.getattr(src)?.size;
        let len = len.min(size.saturating_sub(off_in));
        if len == 0 {
            return Ok(0);
        }
        if off_out.checked_add(len).is_none_or(|e| e > MAX_FILE_SIZE) {
            return Err(Error::FileTooBig);
        }
        if src == dst && off_in < off_out + len && off_out < off_in + len {
            return Err(Error::invalid("copy ranges overlap within one file"));
        }
        self.check_writable()?;
        let head = (BLOCK - off_in % BLOCK) % BLOCK;
        let pages = len.saturating_sub(head) / BLOCK * BLOCK;
        if off_in % BLOCK != off_out % BLOCK || pages == 0 {
            return self.copy_bytes(src, off_in, dst, off_out, len, &lacks_fsetid);
        }
        let mut done = self.copy_bytes(src, off_in, dst, off_out, head.min(len), &lacks_fsetid)?;
        if done < head {
            return Ok(done);
        }
        let (a, b) = (off_in + head, off_out + head);
        let cloned = match self.clone_range_as(src, a, dst, b, pages, &lacks_fsetid) {
            Ok(n) => n,
            // A DAX-mapped destination takes the bytes in place.
            Err(Error::DaxMapped) => self.copy_bytes(src, a, dst, b, pages, &lacks_fsetid)?,
            Err(e) if done == 0 => return Err(e),
            Err(_) => return Ok(done),
        };
        done += cloned;
        if cloned < pages {
            return Ok(done);
        }
        let rest = len - head - pages;
        match self.copy_bytes(src, a + pages, dst, b + pages, rest, &lacks_fsetid) {
            Ok(n) => Ok(done + n),
            Err(_) => Ok(done),
        }
    }

    /// The checks copy_file_range and a clone share: both files regular (EISDIR,
    /// EINVAL), neither offset negative as an `loff_t` (EINVAL). Returns the two.
    pub(crate) fn range_pair(
        &self,
        src: u64,
        off_in: u64,
        dst: u64,
        off_out: u64,
    ) -> Result<(Arc<Inode>, Arc<Inode>)> {
        let si = self.inode(src)?;
        self.check_regular(&si)?;
        let di = self.inode(dst)?;
        self.check_regular(&di)?;
        if off_in > MAX_FILE_SIZE || off_out > MAX_FILE_SIZE {
            return Err(Error::invalid("negative offset"));
        }
        Ok((si, di))
    }

    /// Copy `len` bytes from `src` to `dst` through reads and writes, in commits
    /// of up to 1 MiB (see [`Fs::copy_range_as`]).
    fn copy_bytes(
        &self,
        src: u64,
        off_in: u64,
        dst: u64,
        off_out: u64,
        len: u64,
        lacks_fsetid: &impl Fn() -> bool,
    ) -> Result<u64> {
        const CHUNK: u64 = 1 << 20;
        let mut buf = vec![0u8; len.min(CHUNK) as usize];
        let mut done = 0u64;
        while done < len {
            let want = (len - done).min(CHUNK) as usize;
            let n = match self.read(src, off_in + done, &mut buf[..want]) {
                Ok(n) => n,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            };
            if n == 0 {
                break;
            }
            match self.write_as(dst, off_out + done, &buf[..n], lacks_fsetid) {
                Ok(_) => done += n as u64,
                Err(e) if done == 0 => return Err(e),
                Err(_) => break,
            }
            if n < want {
                break;
            }
        }
        Ok(done)
    }

    /// Append `data` at the end of the file (O_APPEND); returns the offset written.
    /// Privileges as [`Fs::write`].
    pub fn append(&self, ino: u64, data: &[u8]) -> Result<u64> {
        self.append_as(ino, data, || false)
    }

    /// [`Fs::append`] by a writer that may lack `CAP_FSETID`, as [`Fs::write_as`].
    pub fn append_as(
        &self,
        ino: u64,
        data: &[u8],
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<u64> {
        self.check_writable()?;
        let i = self.inode(ino)?;
        self.check_regular(&i)?;
        let _h = self.hold(&i)?;
        let _r = i.ranges.lock(0, u64::MAX);
        let off = i.st.read().attr.size;
        if data.is_empty() {
            return Ok(off);
        }
        // Not `ok_or`: an error built eagerly is dropped on every write.
        let Some(end) = off.checked_add(data.len() as u64) else { return Err(Error::FileTooBig) };
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        self.write_locked_range(&i, off, data, lacks_fsetid)?;
        self.note_written(ino);
        Ok(off)
    }

    pub(crate) fn check_regular(&self, i: &Inode) -> Result<()> {
        match i.ftype_now() {
            FileType::Regular => Ok(()),
            FileType::Directory => Err(Error::IsDir),
            FileType::Symlink => Err(Error::invalid("write to a symlink")),
            _ => Err(Error::invalid("write to a special file")),
        }
    }

    /// Plan, copy and commit a write; the caller holds the range lock.
    pub(crate) fn write_locked_range(
        &self,
        i: &Inode,
        off: u64,
        data: &[u8],
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<()> {
        if self.pinned(i) {
            return self.write_pinned(i, off, data, lacks_fsetid);
        }
        self.write_cow(i, off, data, lacks_fsetid)
    }

    /// A copy-on-write write (embedded in the log when small).
    pub(crate) fn write_cow(
        &self,
        i: &Inode,
        off: u64,
        data: &[u8],
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<()> {
        let end = off + data.len() as u64;
        // Embedded writes keep up to PAGE_INLINE_BYTES per page in the log; when free
        // space runs very low, a sub-page write to a page that already has content
        // is merged into a copy-on-write page instead (net zero blocks, and the
        // page's overlays die), so log overhead cannot eat the last free blocks.
        // (From the low-space limit on, 1/16 free, it cost a 64 B overwrite 3.3x
        // its time at 95% full; from a quarter of it, the last 1.6%, it keeps the
        // pool as full as before.)
        let low_space = self.very_low_space();
        let mut merged = false;
        let mut on_last_page = false;
        // This is the file's only writer in flight (a hint: see below).
        let lone = i.ranges.held_hint() <= 1;
        // The hot case of small appends first: one that continues the file's run of
        // in-place appends commits without the general planning.
        // So is a short write inside a page that is not the file's last one (a
        // small random overwrite): it is embedded in the log.
        // (Both take the lock the general planning would: it keeps it if neither
        // applies.) Both serve files other processes write as well: their writes
        // wait for this process's cross-process hold, and a run goes on from the
        // state each caught up to.
        let mut pre = None;
        let run = Self::may_continue_run(off, data.len());
        let embed = Self::may_embed(off, data.len());
        if lone && (run || embed) {
            let mut g = i.st.write();
            if run {
                match self.append_run(i, g, off, data) {
                    Ok(r) => return r,
                    Err(back) => g = back,
                }
            }
            if embed {
                match self.write_embedded(i, g, off, data) {
                    Ok(r) => return r,
                    Err(back) => g = back,
                }
            }
            pre = Some(g);
        }
        let (shard, pieces, planned) = {
            // Whole pages need nothing of the file's state to plan (on one memory
            // node): the state lock is taken only for a partial page. A lone writer
            // takes it for writing at once and keeps it: it would take it for
            // writing anyway (before its copy, or for its commit), and a read lock
            // let go first is two more locked instructions, each waiting for the
            // planning's loads (the page's overlay list, a cache miss for a random
            // page).
            let lock = || if lone { Plan::W(i.st.write()) } else { Plan::R(i.st.read()) };
            let mut st = pre.map(Plan::W).or_else(|| (self.topo.nodes() > 1).then(lock));
            let shard = match &st {
                Some(st) => self.data_shard(i, st),
                None => self.shard(),
            };
            let mut pieces: SmallVec<[Piece; 2]> = SmallVec::new();
            let mut pos = off;
            while pos < end {
                let pg = pos / BLOCK;
                let a = pos % BLOCK;
                let b = (a + (end - pos)).min(BLOCK);
                let src = (pos - off) as usize;
                let len = (b - a) as usize;
                if len == BLOCK as usize {
                    pieces.push(Piece::Full { pg, src });
                } else {
                    let st = st.get_or_insert_with(lock);
                    let (mut nops, mut bytes) = st.page_ops(pg);
                    // A write that completes the file's last page (an append reaching
                    // a page end) folds the page's overlays into a copy-on-write page:
                    // no later write would, and stranded overlays would cost log space
                    // and DRAM for as long as the file lives.
                    let last = (pg + 1) * BLOCK >= st.attr.size;
                    on_last_page |= last;
                    let completes_last = b == BLOCK && last;
                    // The last page may embed a whole page of bytes: appends fill it
                    // and the one that completes it merges them.
                    let (max_ops, max_bytes) = if last {
                        (TAIL_PAGE_OPS, BLOCK as usize)
                    } else {
                        (MAX_PAGE_OPS, PAGE_INLINE_BYTES)
                    };
                    // A full list of another page first loses the ops its newest one
                    // hides, when the state is locked for writing (a lone writer's
                    // plan): a range rewritten in place never merges.
                    let full = nops >= max_ops || bytes + len > max_bytes;
                    if full && !last && len <= INLINE_MAX {
                        if let Plan::W(g) = st {
                            if g.drop_hidden_by_newest(pg) > 0 {
                                (nops, bytes) = g.page_ops(pg);
                            }
                        }
                    }
                    // (Asked only when space is low: a page with no ops needs a search
                    // of the extent map to tell.)
                    let has_content =
                        || nops > 0 || st.file().is_some_and(|f| f.lookup(pg).is_some());
                    let append = off == st.attr.size && data.len() >= IN_PLACE_MIN;
                    let record = data.len() < BLOCK as usize;
                    if let Some(run) = self.in_place(i, st, append, record, pos, low_space) {
                        pieces.push(Piece::InPlace { pg, src, len, run });
                    } else if len <= INLINE_MAX
                        && nops < max_ops
                        && bytes + len <= max_bytes
                        && !(low_space && has_content())
                        && !(completes_last && nops > 0)
                    {
                        pieces.push(Piece::Inline { off: pos, src, len });
                    } else {
                        merged = true;
                        let mut page = spare_page();
                        self.read_page_verified(i, st, pg, &mut page[..], BLOCK as usize)?;
                        page[a as usize..b as usize].copy_from_slice(&data[src..src + len]);
                        pieces.push(Piece::Merged { pg, page });
                    }
                }
                pos += b - a;
            }
            if let Some(f) = st.as_ref().and_then(|st| st.file()) {
                let h = f.ops.hint();
                if i.ops_hint.load(Ordering::Relaxed) != h {
                    i.ops_hint.store(h, Ordering::Relaxed);
                }
            }
            let planned = match st {
                Some(Plan::W(g)) => Some(g),
                _ => None,
            };
            (shard, pieces, planned)
        };
        let ncow = pieces.iter().filter(|p| p.needs_block()).count() as u64;
        let in_place = pieces.iter().any(|p| matches!(p, Piece::InPlace { .. }));
        let runs = self.alloc_blocks(shard, ncow, false)?;
        // The lock before the copy, when this is the file's only writer in flight.
        // On x86 an atomic read-modify-write (a lock or an unlock) waits for the
        // core's earlier non-temporal stores: a lock taken after the copy drains the
        // data alone, and the entries' flushes and fence make a second round trip
        // to memory; taken before it and kept through the fence, one drain covers
        // both (`commit_release`'s `fence_locked`). With other writers of the file
        // in flight (a range lock besides ours) the copy stays outside the lock, so
        // that their copies overlap and the lock is held only to append.
        // (`planned`: the lock a lone writer took to plan.)
        let (early, held) = match planned {
            Some(g) if ncow > 0 || in_place => (Some(g), None),
            Some(g) => (None, Some(g)),
            None => ((ncow > 0 && lone).then(|| i.st.try_write()).flatten(), None),
        };
        // A lone embedded overwrite (no piece on the file's last page) keeps the lock
        // through its fence as well, and its entries go by non-temporal stores
        // (`commit_release`'s `nt`; an unlock before the fence would wait for them):
        // they are read back only when their page is merged, long after, and a
        // cached store would first read a cold log line in (`ferrite bench`'s pool
        // bytes per user byte of 64 B random writes: 7.59-7.62 -> 6.76-6.78). Appends keep
        // cached entries: the append that completes the page reads all of its
        // page's entries back (64 and 256 B appends + fsync took 4-10% and 1-8%
        // longer with non-temporal ones; docs/BENCHMARKS.md; with the tail streamed
        // as well, six alternating pairs showed no gain either). A copy-on-write
        // write holding the lock from before its copy streams its entries and tail
        // too: its data already goes that way, and a flushed line held the fence
        // longer (`profile_op randwrite4k`, ten alternating pairs, the fast-mode
        // runs: 0.64-0.66 -> 0.61-0.68 µs a write, six of seven at 0.61-0.62).
        //
        // Only when the file's writers have not overlapped lately: two writers of one
        // file, one streaming and one flushing, would each find the log's and the
        // inode slot's lines the other had just sent to memory (4 KiB random writes
        // + fsync by two threads on one file fell from 5,300-7,200 to 3,100-6,300
        // MB/s in `ferrite bench`'s quick runs when a lone writer streamed anyway).
        let stream = lone && i.ranges.alone_lately();
        let nt = stream && ((ncow == 0 && !on_last_page) || early.is_some());
        let fence_locked = early.is_some() || nt;
        // With the lock taken before the copy, the write's time is taken now too: on
        // a shared pool `stamp` is an atomic read-modify-write, which after the copy
        // would drain the data alone (a direct-access client's 4 KiB write +
        // fsync, six alternating pairs: medians about 925 -> 851 ns).
        let early_stamp = early.as_ref().map(|_| self.stamp(i));
        if let Some(f) = early.as_ref().and_then(|st| st.file()) {
            // The extent map's lines for the pages, asked for now, arrive during the copy.
            for p in &pieces {
                if let Piece::Full { pg, .. } | Piece::Merged { pg, .. } = p {
                    f.ext.prefetch(*pg);
                }
            }
        }
        // Copy data into the new blocks (outside the inode lock unless it was taken
        // above), each page's checksum computed right after its copy, from the
        // source still in cache: the WRITE entries carry them, so data, entries and
        // tail persist under one fence.
        let seed = i.seed;
        let mut blocks = runs.iter().flat_map(|&(s, n)| s..s + n);
        // Page, block and checksum of each copy-on-write page.
        let mut cow: SmallVec<[(u64, u64, u32); 4]> = SmallVec::new();
        // The in-place pieces' (page, block, page checksum, bytes written past the
        // end of file: cleared again if the commit fails); at most two, the write's
        // first page and its last.
        let mut tail_pieces: SmallVec<[_; 2]> = SmallVec::new();
        // The merged pages' new blocks (see `mark_written`).
        let mut merged_blocks: SmallVec<[u64; 2]> = SmallVec::new();
        for p in &pieces {
            let (pg, src) = match p {
                Piece::Full { pg, src } => (*pg, &data[*src..*src + BLOCK as usize]),
                Piece::Merged { pg, page } => (*pg, &page[..]),
                Piece::Inline { .. } => continue,
                &Piece::InPlace { pg, src, len, run } => {
                    let src = &data[src..src + len];
                    tail_pieces.push(match run {
                        Some(run) => {
                            let v = run.valid as usize;
                            self.m.write_nt(run.block * BLOCK + v as u64, src);
                            let crc = tail_page_crc(run.crc ^ seed, v, src) ^ seed;
                            (pg, run.block, crc, Some((v, len)))
                        }
                        None => {
                            // A page the append starts: its block gets the bytes and
                            // zeros after them, streamed; the page's checksum is the
                            // bytes' extended by the zeros (no page built in DRAM).
                            // Whole lines only: the line the bytes end in goes with
                            // its zeros (a line part cached and part streamed holds
                            // the fence longer; see `pmem::copy_nt_raw`).
                            debug_assert!(len < BLOCK as usize, "a page started by a record");
                            let b = blocks.next().expect("allocated");
                            let full = len / 64 * 64;
                            if full > 0 {
                                self.m.write_nt(b * BLOCK, &src[..full]);
                            }
                            let mut line = [0u8; 64];
                            line[..len - full].copy_from_slice(&src[full..]);
                            let at = b * BLOCK + full as u64;
                            self.m.write_nt(at, &line);
                            if full + 64 < BLOCK as usize {
                                self.m.zero_nt(at + 64, BLOCK - full as u64 - 64);
                            }
                            // (A page of zeros written at 0: as a run's next append.)
                            let crc = tail_page_crc(crate::pmem::ZERO_PAGE_CRC, 0, src);
                            (pg, b, crc ^ seed, None)
                        }
                    });
                    continue;
                }
            };
            let b = blocks.next().expect("allocated");
            // The page's checksum comes from the loads of its copy: every
            // copy-on-write page is checksummed, whatever the write's size.
            let crc = self.m.write_nt_crc(b * BLOCK, src) ^ seed;
            cow.push((pg, b, crc));
            if matches!(p, Piece::Merged { .. }) {
                merged_blocks.push(b);
            }
        }
        let checked = self.fault != Some(crate::fs::CoreFault::UncheckedData);
        let st = early.or(held).unwrap_or_else(|| i.st.write());
        let (now, fine) = early_stamp.unwrap_or_else(|| self.stamp(i));
        let size = st.attr.size.max(end);
        let mut entries: SmallVec<[EntryBuf; 2]> = SmallVec::new();
        // Privileges the write takes away go first, in the same commit.
        Self::remove_privs_entries(&st, now, lacks_fsetid, &mut entries);
        let privs = entries.len();
        if !cow.is_empty() {
            cow_entries(seed, &cow, size, now, checked, &mut entries);
        }
        let cow_writes = entries.len() - privs;
        for &(pg, b, crc, _) in &tail_pieces {
            entries.push(EntryBuf { bytes: Default::default() });
            let dcrc = checked.then(|| log::data_crc(seed, crc));
            entries.last_mut().expect("just pushed").set_tail_write(pg, b, size, now, dcrc, crc);
        }
        let mut long = false;
        for p in &pieces {
            if let Piece::Inline { off, src, len } = *p {
                let bytes = if len > INLINE_IN_PLACE {
                    long = true;
                    SPARE_ENTRY
                        .try_with(|c| c.take())
                        .ok()
                        .flatten()
                        .map_or_else(EntryBytes::new, EntryBytes::from_vec)
                } else {
                    EntryBytes::new()
                };
                entries.push(EntryBuf { bytes });
                let e = entries.last_mut().expect("just pushed");
                e.set_inline(off, size, now, &data[src..src + len]);
            }
        }
        if merged {
            for p in pieces {
                if let Piece::Merged { page, .. } = p {
                    keep_spare_page(page);
                }
            }
        }
        // Data pages covered by checksums need no fence between data and tail.
        // (The UncheckedData fault drops the checksums and keeps one fence: the crash
        // simulator must catch the torn data it lets through.) Unless it was taken
        // before the copy, the lock goes before the fence: another writer of the file
        // commits meanwhile.
        let seen = || {
            if fine && !i.shared {
                i.times_seen.store(false, Ordering::Relaxed);
            }
            // Called on commit under the state lock, as the blocks join the file: a
            // free of them (a truncate, the inode's own free) takes the lock after
            // this and clears the marks.
            self.mark_written(&merged_blocks);
        };
        // Past the end of file an in-place append's block must read as zero again
        // when its commit fails: cleared before the lock goes, as the next append
        // may write there.
        let unwrite = || {
            let mut zeroed = false;
            for &(_, b, _, w) in &tail_pieces {
                if let Some((v, len)) = w {
                    self.m.zero_nt(b * BLOCK + v as u64, len as u64);
                    zeroed = true;
                }
            }
            if zeroed {
                self.m.fence();
            }
        };
        // A write of whole copy-on-write pages only (no privileges taken, no
        // in-place or embedded piece), the common 4 KiB case, applies its WRITE
        // entries from the pages it planned instead of decoding what it encoded
        // (`profile_op randwrite4k`: decode and generic apply were 3-4% of a write).
        let plain = privs == 0 && entries.len() == cow_writes;
        let apply = |st: &mut InodeState, locs: &[u64], entries: &[EntryBuf]| {
            if !plain {
                return Self::apply_decoded(st, locs, entries);
            }
            debug_assert!(
                entries.iter().zip(cow_runs(&cow)).all(|(e, run)| matches!(
                    log::decode_entry(&e.bytes),
                    Ok(log::Entry::Write { pgoff, block, npages, size: s, mtime, .. })
                        if (pgoff, block, npages as usize, s, mtime)
                            == (run[0].0, run[0].1, run.len(), size, now)
                )),
                "each entry holds the pages planned"
            );
            st.apply_cow_writes(locs, &cow, size, now)
        };
        let r = self
            .commit_release(i, st, &mut entries, seen, unwrite, fence_locked, nt, apply)
            .inspect_err(|_| self.free_runs(&runs));
        // An embedded write too long for an entry's inline bytes (a 256-byte
        // append) keeps its heap buffer for this thread's next one.
        if long {
            if let Some(e) = entries.iter_mut().rev().find(|e| e.bytes.spilled()) {
                let v = std::mem::take(&mut e.bytes).into_vec();
                let _ = SPARE_ENTRY.try_with(|c| c.set(Some(v)));
            }
        }
        r
    }

    /// Might a write of `len` bytes at `off` continue the file's run of in-place
    /// appends ([`Fs::append_run`])? The checks that need no lock (besides the
    /// caller's: a file no other process writes): a record (at least
    /// [`IN_PLACE_MIN`] bytes, less than a page) that starts inside a page and ends
    /// in it.
    fn may_continue_run(off: u64, len: usize) -> bool {
        let v = off % BLOCK;
        (IN_PLACE_MIN..BLOCK as usize).contains(&len) && v != 0 && v + len as u64 <= BLOCK
    }

    /// Commit a write that continues the file's run of in-place appends within the
    /// run's page, the piece [`Fs::in_place`] would plan (`Some(run)`) and the
    /// commit `write_cow` would make of it: its bytes streamed into the run's block
    /// past the end of file, the page's checksum extended over them, one WRITE
    /// ([`log::FLAG_TAIL`]) appended and applied without a decode
    /// ([`InodeState::apply_run_append`]), one fence. Without the general
    /// planning's piece lists, block allocation and entry lists, the hot case of
    /// small appends. `Err(st)` hands the lock back when the write is not such an
    /// append (the end of file or the run moved, a DAX mapping pins the file, the
    /// write must take privileges away, or its entry needs a new log page).
    fn append_run<'a>(
        &self,
        i: &'a Inode,
        st: RwLockWriteGuard<'a, InodeState>,
        off: u64,
        data: &[u8],
    ) -> Shortcut<'a> {
        debug_assert!(Self::may_continue_run(off, data.len()));
        let (pg, v) = (off / BLOCK, off % BLOCK);
        let run = match st.file().and_then(|f| f.tail) {
            Some(r) if r.pg == pg && u64::from(r.valid) == v => r,
            _ => return Err(st),
        };
        if st.attr.size != off
            || !crate::privs::write_keeps_privs(&st)
            || st.log.pages.is_empty()
            || !log::fits_in_page_len(&st.log, log::TAIL_WRITE_LEN)
            || self.pinned(i)
            || self.run_block_shared(i, run.block)
        {
            return Err(st);
        }
        let seed = i.seed;
        // The time first: see `write_cow`'s `early_stamp`.
        let (now, fine) = self.stamp(i);
        let at = run.block * BLOCK + v;
        self.m.write_nt(at, data);
        let crc = tail_page_crc(run.crc ^ seed, v as usize, data) ^ seed;
        let size = off + data.len() as u64;
        let checked = self.fault != Some(crate::fs::CoreFault::UncheckedData);
        let dcrc = checked.then(|| log::data_crc(seed, crc));
        let mut entries = [EntryBuf { bytes: EntryBytes::new() }];
        entries[0].set_tail_write(pg, run.block, size, now, dcrc, crc);
        debug_assert_eq!(entries[0].len(), log::TAIL_WRITE_LEN);
        let seen = || {
            if fine && !i.shared {
                i.times_seen.store(false, Ordering::Relaxed);
            }
        };
        // Past the end of file, its bytes must read as zero again if it fails.
        let unwrite = || {
            self.m.zero_nt(at, data.len() as u64);
            self.m.fence();
        };
        let valid = (v + data.len() as u64) as u32;
        let next = index::TailRun { pg, block: run.block, valid, crc };
        let apply = |st: &mut InodeState, locs: &[u64], _: &[EntryBuf]| {
            st.apply_run_append(locs[0], next, size, now);
            index::Freed::new()
        };
        // Entries and tail streamed as `write_cow` streams a lone writer's.
        let nt = i.ranges.alone_lately();
        Ok(self.commit_release(i, st, &mut entries, seen, unwrite, true, nt, apply))
    }

    /// Has another process's reflink shared the block of `i`'s run of in-place
    /// appends since this process's state learned of the run? The reflink ends
    /// the run only in its own process's state (it appends nothing to the source's
    /// log); the coordination table's count, raised before its commit and under
    /// the source's cross-process lock, which this writer holds now, tells the
    /// others. (In one process the reflink ends the run itself.)
    fn run_block_shared(&self, i: &Inode, block: u64) -> bool {
        i.shared && self.extra_refs(block) > 0
    }

    /// Might a write of `len` bytes at `off` be a short embedded one
    /// ([`Fs::write_embedded`])? The checks that need no lock: at most
    /// [`INLINE_IN_PLACE`] bytes (its entry needs no heap buffer), inside one page.
    fn may_embed(off: u64, len: usize) -> bool {
        (1..=INLINE_IN_PLACE).contains(&len) && off % BLOCK + len as u64 <= BLOCK
    }

    /// Commit a short write inside a page before the file's last one as the one
    /// embedded piece `write_cow` would plan for it (`Piece::Inline`) and commit
    /// as it would: one INLINE entry, applied without a decode
    /// ([`InodeState::apply_inline`]), streamed with the tail and fenced under
    /// the lock when the file's writers have not overlapped lately. Without the
    /// general planning, the hot case of small random writes. `Err(st)` hands the
    /// lock back for any other case (the page's overlay list is full, free space
    /// is low, the write must take privileges away, or its entry needs a new log
    /// page): `write_cow` plans it under that lock.
    fn write_embedded<'a>(
        &self,
        i: &'a Inode,
        st: RwLockWriteGuard<'a, InodeState>,
        off: u64,
        data: &[u8],
    ) -> Shortcut<'a> {
        debug_assert!(Self::may_embed(off, data.len()));
        let pg = off / BLOCK;
        let len = data.len();
        let Some(f) = st.file() else { return Err(st) };
        let (nops, bytes) = st.page_ops(pg);
        let elen = (log::INLINE_HDR + len).next_multiple_of(8);
        if (pg + 1) * BLOCK >= st.attr.size
            || nops >= MAX_PAGE_OPS
            || bytes + len > PAGE_INLINE_BYTES
            || !crate::privs::write_keeps_privs(&st)
            || st.log.pages.is_empty()
            || !log::fits_in_page_len(&st.log, elen)
            || self.very_low_space()
        {
            return Err(st);
        }
        // The overlay lists' place, for the next write's prefetch (as `write_cow`).
        let h = f.ops.hint();
        if i.ops_hint.load(Ordering::Relaxed) != h {
            i.ops_hint.store(h, Ordering::Relaxed);
        }
        let (now, fine) = self.stamp(i);
        let size = st.attr.size;
        let mut entries = [EntryBuf { bytes: EntryBytes::new() }];
        entries[0].set_inline(off, size, now, data);
        debug_assert_eq!(entries[0].len(), elen);
        let seen = || {
            if fine && !i.shared {
                i.times_seen.store(false, Ordering::Relaxed);
            }
        };
        let dlen = len as u32;
        let apply = |st: &mut InodeState, locs: &[u64], _: &[EntryBuf]| {
            st.apply_inline(locs[0], off, dlen, log::INLINE_HDR as u32, size, now);
            index::Freed::new()
        };
        // Streamed and fenced under the lock as `write_cow` does a lone embedded
        // overwrite's (no piece on the last page).
        let nt = i.ranges.alone_lately();
        Ok(self.commit_release(i, st, &mut entries, seen, || {}, nt, nt, apply))
    }

    /// May this piece of a write of at least [`IN_PLACE_MIN`] bytes that starts at
    /// the end of file (`append`), at `pos` and within its page, go in place
    /// past the end of file ([`Piece::InPlace`])? `Some(run)` to continue the
    /// file's run of in-place appends into its block (the write's first page),
    /// `Some(None)` to start one on a new page: a piece that starts its page, of a
    /// write shorter than a page (`record`), past the file's first page (a file
    /// written once keeps its short last page embedded in the log, where it takes
    /// less room than a block). Only for the file's only writer in this process,
    /// planning under the state lock held for writing (other processes' writers
    /// wait for this one's cross-process hold): its in-place bytes stay invisible
    /// until the commit moves the end of file over them; a crash leaves them past
    /// the end, where recovery clears them ([`log::clear_past_tail`]), and so does
    /// the daemon when it takes the file back from a client that died
    /// (`Fs::adopt_inode`). A reader in another process, which takes no lock of
    /// this one, may meet them past the size its entry gave the page: the page
    /// check takes them as zero there (`Fs::verify_page`).
    fn in_place(
        &self,
        i: &Inode,
        st: &Plan<'_>,
        append: bool,
        record: bool,
        pos: u64,
        low_space: bool,
    ) -> Option<Option<index::TailRun>> {
        if !append || !matches!(st, Plan::W(_)) {
            return None;
        }
        // A DAX mapping taken since the write was routed here (its pin ends the
        // run once it gets the state lock; asked under it, so no run starts after).
        if self.pinned(i) {
            return None;
        }
        let pg = pos / BLOCK;
        let v = pos % BLOCK;
        let f = st.file()?;
        if v == 0 {
            // A page the append starts: nothing maps it (fallocate may have, past
            // the end of file) and it has no ops.
            let fresh =
                record && pg > 0 && !low_space && st.page_ops(pg).0 == 0 && f.lookup(pg).is_none();
            return fresh.then_some(None);
        }
        let run = f.tail.filter(|r| r.pg == pg && u64::from(r.valid) == v)?;
        if self.run_block_shared(i, run.block) {
            return None;
        }
        debug_assert_eq!(f.lookup(pg).map(|(b, _)| b), Some(run.block), "a run's block");
        debug_assert_eq!(st.page_ops(pg).0, 0, "a run's page has no ops");
        Some(Some(run))
    }

    /// Everything is durable when an operation returns (its commit fenced), so
    /// fsync and fdatasync only check that the inode exists: no fence, no store.
    /// (Stores into a DAX mapping of a file are the mapping's to persist; this
    /// build maps pools only through its own commits.)
    pub fn fsync(&self, ino: u64, _datasync: bool) -> Result<()> {
        // The file this thread wrote last, with no inode freed since (the common
        // write + fsync), exists without a look at the cache; so does an inode in
        // this process's cache (no reference to it is taken). Not for a
        // direct-access client: other processes free its inodes, and its cache
        // entry may be stale (`inode` checks it).
        if !self.is_client() {
            let memo = crate::fs::LAST_WRITTEN.try_with(|c| c.get()).ok();
            if memo.is_some_and(|m| {
                m.fs == self.id
                    && m.ino == ino
                    && m.frees == self.inode_frees.load(Ordering::Acquire)
            }) || self.is_loaded(ino)
            {
                return Ok(());
            }
        }
        self.inode(ino)?;
        Ok(())
    }

    // --------------------------------------------------------------- setattr

    /// chmod / chown / truncate / utimens, as a caller with `CAP_FSETID` (see
    /// [`Fs::setattr_as`]).
    pub fn setattr(&self, ino: u64, ch: &SetAttr) -> Result<Attr> {
        self.setattr_as(ino, ch, || false)
    }

    /// [`Fs::setattr`] by a caller that may lack `CAP_FSETID`. A truncate clears
    /// set-user-id, and set-group-id where it means "set group", when
    /// `lacks_fsetid` says so (asked under the inode's lock, only of a file with such
    /// a bit; a `perm` in the same change wins), as Linux does; so does an empty
    /// change, which is `chown(file, -1, -1)`. A truncate, a chown and an empty change
    /// remove file capabilities, whoever asks (see [`crate::privs`]).
    pub fn setattr_as(
        &self,
        ino: u64,
        ch: &SetAttr,
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<Attr> {
        let r = self.setattr_gated(ino, ch, lacks_fsetid, |_, _| true)?;
        Ok(r.expect("an open gate"))
    }

    /// [`Fs::setattr_as`] of a change to mode, owner or times that `caller` makes
    /// without the kernel (the preload library on a descriptor it writes
    /// directly): made only when [`crate::privs::owner_may`] allows it, judged
    /// against the attributes under the inode's lock; `Ok(None)` when only the
    /// kernel can judge it (nothing changed).
    pub fn setattr_owned(
        &self,
        ino: u64,
        ch: &SetAttr,
        caller: crate::privs::Caller,
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<Option<Attr>> {
        self.setattr_gated(ino, ch, lacks_fsetid, |st, ch| Self::owner_may(caller, st, ch))
    }

    /// Setting the access ACL `value` through a descriptor that `caller` writes
    /// without the kernel (the preload library; `cp -a` and `rsync -A` set one on
    /// every file they copy): made here only when the ACL says no more than a mode
    /// (it is then not stored, `acl`; the file's permission bits become its),
    /// the file has no access ACL (the kernel may cache the one it has), and
    /// [`crate::privs::owner_may`] allows that chmod. `Ok(None)`: the kernel's.
    pub fn set_mode_acl_owned(
        &self,
        ino: u64,
        value: &[u8],
        caller: crate::privs::Caller,
    ) -> Result<Option<Attr>> {
        let Ok(Some(a)) = acl::parse(value) else { return Ok(None) };
        if !a.is_mode_only() {
            return Ok(None);
        }
        let ch = SetAttr { perm: Some(0), ..Default::default() };
        self.setattr_gated(
            ino,
            &ch,
            || true,
            |st, ch| {
                ch.perm = Some(a.apply_to_mode(st.attr.mode) & 0o7777);
                st.ftype == FileType::Regular && Self::owner_may(caller, st, ch)
            },
        )
    }

    fn owner_may(caller: crate::privs::Caller, st: &InodeState, ch: &SetAttr) -> bool {
        let a = &st.attr;
        let acl = !st.xattrs.is_empty() && st.xattrs.contains_key(acl::ACCESS);
        crate::privs::owner_may(caller, a.mode, a.uid, a.gid, acl, ch)
    }

    /// [`Fs::setattr_as`], made only if `gate` passes on the locked state; it may
    /// complete the change from that state (the fields it sets are not checked
    /// before the lock: only size and times are).
    fn setattr_gated(
        &self,
        ino: u64,
        ch: &SetAttr,
        lacks_fsetid: impl FnOnce() -> bool,
        gate: impl FnOnce(&InodeState, &mut SetAttr) -> bool,
    ) -> Result<Option<Attr>> {
        self.check_writable()?;
        // A size above 2^63 - 1 is a negative off_t: EINVAL before anything else,
        // as truncate(2).
        if ch.size.is_some_and(|sz| sz > MAX_FILE_SIZE) {
            return Err(Error::invalid("negative size"));
        }
        // As utimensat(2): nanoseconds must be below one second.
        let bad_ns =
            |t: Option<SetTime>| matches!(t, Some(SetTime::At(ts)) if ts.nsec >= 1_000_000_000);
        if bad_ns(ch.atime) || bad_ns(ch.mtime) {
            return Err(Error::invalid("nanoseconds out of range"));
        }
        let i = self.inode(ino)?;
        let _h = self.hold(&i)?;
        let _r = ch.size.map(|_| i.ranges.lock(0, u64::MAX));
        let mut st = i.st.write();
        if ch.size.is_some() {
            match st.ftype {
                FileType::Directory => return Err(Error::IsDir),
                FileType::Symlink => return Err(Error::invalid("truncate of a symlink")),
                t if t.is_special() => {
                    return Err(Error::invalid("truncate of a special file"));
                }
                _ => {}
            }
            if ch.size.is_some_and(|sz| sz < st.attr.size) && self.pinned(&i) {
                // The pages past the new end would be freed under a live mapping.
                return Err(Error::DaxMapped);
            }
        }
        let mut gated = *ch;
        if !gate(&st, &mut gated) {
            return Ok(None);
        }
        debug_assert!(gated.size == ch.size && gated.atime == ch.atime && gated.mtime == ch.mtime);
        let ch = &gated;
        let now = self.m.now();
        let ftype = st.ftype;
        // An empty change is chown(file, -1, -1) (the FUSE kernel's request to remove
        // privileges looks the same).
        let empty = *ch == SetAttr::default();
        let kill =
            if ch.perm.is_none() && (ch.size.is_some() || empty) && ftype != FileType::Directory {
                let bits = crate::privs::suidgid_to_kill(st.attr.mode);
                if bits != 0 && lacks_fsetid() {
                    bits
                } else {
                    0
                }
            } else {
                0
            };
        let (e, _) = Self::setattr_entry(&st, |a| {
            if let Some(p) = ch.perm {
                a.mode = (a.mode & !0o7777) | (p & 0o7777);
            } else if (ch.uid.is_some() || ch.gid.is_some()) && ftype != FileType::Directory {
                // chown(2) clears set-user-id, and set-group-id where it means
                // "set group" (group-executable), as Linux's VFS does for any caller.
                a.mode &= !0o4000;
                if a.mode & 0o2010 == 0o2010 {
                    a.mode &= !0o2000;
                }
            }
            if let Some(u) = ch.uid {
                a.uid = u;
            }
            if let Some(g) = ch.gid {
                a.gid = g;
            }
            if let Some(s) = ch.size {
                a.size = s;
                a.mtime = now;
            }
            a.mode &= !kill;
            if let Some(t) = ch.atime {
                a.atime = resolve_time(t, now);
            } else {
                a.atime = crate::fs::later_atime(a.atime, &i); // persisted with it
            }
            if let Some(t) = ch.mtime {
                a.mtime = resolve_time(t, now);
            }
            a.ctime = now;
        });
        let shrink = ch.size.is_some_and(|s| s < st.attr.size);
        let mut entries = vec![e];
        // A truncate, and a chown of anything but a directory, remove file
        // capabilities (Linux's ATTR_KILL_PRIV), whoever asks.
        let chown = (ch.uid.is_some() || ch.gid.is_some() || empty) && ftype != FileType::Directory;
        if ch.size.is_some() || chown {
            entries.extend(crate::privs::capability_removal(&st, now));
        }
        if let Some(p) = ch.perm {
            // chmod rewrites the access ACL's owner, mask (or group) and other.
            let access = self.xattr_value(i.seed, &st, acl::ACCESS);
            if let Some(a) = access.and_then(|v| acl::parse(&v).ok().flatten()) {
                entries.push(EntryBuf::xattr(false, acl::ACCESS, &a.chmod(p).encode(), now));
            }
        }
        self.commit_single(&i, &mut st, &mut entries, false, shrink)?;
        // The entry holds the access time (set, or the DRAM-only one).
        i.atime_lazy.store(0, Ordering::Relaxed);
        Ok(Some(self.attr_of(&i, &st)))
    }

    // ------------------------------------------------------------- fallocate

    /// lseek's SEEK_DATA (`hole` false) and SEEK_HOLE (`hole` true), at page
    /// granularity from the extent map: a page with any content is data, the end of
    /// the file is a hole. `NoOffset` (ENXIO) at or past the end.
    pub fn seek_data(&self, ino: u64, off: u64, hole: bool) -> Result<u64> {
        let i = self.inode(ino)?;
        self.check_regular(&i)?;
        self.read_fresh(&i, false, |st| {
            let size = st.attr.size;
            if off >= size {
                return Err(Error::NoOffset);
            }
            let Some(f) = st.file() else { return Err(Error::IsDir) };
            let pg = off / BLOCK;
            if hole {
                Ok((f.next_hole(pg) * BLOCK).clamp(off, size))
            } else {
                match f.next_data(pg) {
                    Some(p) if p * BLOCK < size => Ok((p * BLOCK).max(off)),
                    _ => Err(Error::NoOffset),
                }
            }
        })?
    }

    /// fallocate: allocate (zeroed) blocks for holes, or punch a hole. Privileges as
    /// [`Fs::write`].
    pub fn fallocate(&self, ino: u64, mode: FallocMode, off: u64, len: u64) -> Result<()> {
        self.fallocate_as(ino, mode, off, len, || false)
    }

    /// [`Fs::fallocate`] by a caller that may lack `CAP_FSETID`, as [`Fs::write_as`]:
    /// what it clears is committed first, on its own (as Linux's `file_modified`).
    pub fn fallocate_as(
        &self,
        ino: u64,
        mode: FallocMode,
        off: u64,
        len: u64,
        lacks_fsetid: impl FnOnce() -> bool,
    ) -> Result<()> {
        self.check_writable()?;
        // vfs_fallocate's order: EINVAL (negative offset, length <= 0), EOPNOTSUPP,
        // the file type, then EFBIG past the largest file.
        if len == 0 || off > MAX_FILE_SIZE || len > MAX_FILE_SIZE {
            return Err(Error::invalid("fallocate offset or length out of range"));
        }
        if mode.punch_hole && !mode.keep_size {
            return Err(Error::NotSupported("PUNCH_HOLE requires KEEP_SIZE"));
        }
        if mode.punch_hole && mode.zero_range {
            return Err(Error::NotSupported("PUNCH_HOLE with ZERO_RANGE"));
        }
        let i = self.inode(ino)?;
        self.check_regular(&i)?;
        let end = off + len;
        if end > MAX_FILE_SIZE {
            return Err(Error::FileTooBig);
        }
        let _h = self.hold(&i)?;
        let _r = i.ranges.lock(0, u64::MAX);
        if (mode.punch_hole || mode.zero_range || mode.shift.is_some()) && self.pinned(&i) {
            // Each would free, replace or move blocks under a live mapping.
            return Err(Error::DaxMapped);
        }
        let mut st = i.st.write();
        let now = self.m.now();
        let mut privs: SmallVec<[EntryBuf; 2]> = SmallVec::new();
        Self::remove_privs_entries(&st, now, lacks_fsetid, &mut privs);
        if !privs.is_empty() {
            self.commit_single(&i, &mut st, &mut privs, false, false)?;
        }
        if let Some(shift) = mode.shift {
            return self.shift_pages(&i, &mut st, shift, off, len, now);
        }
        if mode.unshare {
            self.unshare_locked(&i, &mut st, off, end)?;
        }
        if mode.punch_hole {
            let size = st.attr.size;
            if off >= size {
                // Nothing to zero, but the call still modifies the file (mtime, ctime),
                // as on tmpfs and ext4.
                let (e, _) = Self::setattr_entry(&st, |a| {
                    a.mtime = now;
                    a.ctime = now;
                });
                return self.commit_single(&i, &mut st, &mut [e], false, false);
            }
            let plen = len.min(size - off);
            return self.commit_single(
                &i,
                &mut st,
                &mut [EntryBuf::punch(off, plen, now)],
                false,
                true,
            );
        }
        let Some(f) = st.file() else { return Err(Error::IsDir) };
        // Count the holes from the extent map before touching a page: a range far
        // larger than the pool fails at once (not after a walk of 2^50 pages).
        let room = if self.is_client() { self.geo.nblocks } else { self.balloc.free_blocks() };
        let holes = if mode.zero_range {
            Self::zero_range_pages(f, off, end, room).ok_or(Error::NoSpace)?
        } else {
            f.holes(off / BLOCK, end.div_ceil(BLOCK), room).ok_or(Error::NoSpace)?
        };
        let runs = self.alloc_blocks(self.data_shard(&i, &st), holes.len() as u64, false)?;
        let size = if mode.keep_size { st.attr.size } else { st.attr.size.max(end) };
        let mut entries = Vec::new();
        if mode.zero_range && off < st.attr.size {
            // Zero what the file holds in the range first: whole pages are unmapped
            // (the fresh zeroed blocks below replace them), the partial pages at the
            // edges get zero overlays.
            entries.push(EntryBuf::punch(off, len.min(st.attr.size - off), now));
        }
        let mut blocks = runs.iter().flat_map(|&(s, n)| s..s + n);
        let mut k = 0;
        let mut pairs = Vec::new();
        let dax = self.pinned(&i);
        for &pg in &holes {
            let b = blocks.next().expect("allocated");
            self.m.zero_nt(b * BLOCK, BLOCK);
            pairs.push((pg, b));
        }
        while k < pairs.len() {
            let (pg0, b0) = pairs[k];
            let mut n = 1;
            while k + n < pairs.len()
                && n < log::PCRC_MAX_PAGES as usize
                && pairs[k + n] == (pg0 + n as u64, b0 + n as u64)
            {
                n += 1;
            }
            if dax {
                // A DAX-mapped file grows by DAX pages (no checksums: stores
                // will change them), which its mappings take as they are.
                entries.push(EntryBuf::write(pg0, b0, n as u32, size, now, None));
            } else {
                // Zeroed blocks: their checksums are known without reading them.
                let crcs = vec![log::zero_page_crc(i.seed); n];
                entries.push(EntryBuf::write_crcs(pg0, b0, size, now, None, &crcs));
            }
            k += n;
        }
        if pairs.is_empty() {
            // Nothing allocated: still a modification (mtime, ctime), as on tmpfs.
            let (e, _) = Self::setattr_entry(&st, |a| {
                a.size = size;
                a.mtime = now;
                a.ctime = now;
            });
            entries.push(e);
        }
        let data = !pairs.is_empty();
        if let Err(e) = self.commit_single(&i, &mut st, &mut entries, data, false) {
            self.free_runs(&runs);
            return Err(e);
        }
        Ok(())
    }

    /// FALLOC_FL_COLLAPSE_RANGE / INSERT_RANGE, as ext4 checks them (page-aligned
    /// offset and length, a collapse ending before EOF, an insert starting before
    /// it). One SHIFT entry, one fence: replay and DRAM move the file's runs and
    /// page operations after the range (no data copied, no entry per page).
    fn shift_pages(
        &self,
        i: &Inode,
        st: &mut InodeState,
        shift: crate::fs::Shift,
        off: u64,
        len: u64,
        now: Ts,
    ) -> Result<()> {
        let collapse = shift == crate::fs::Shift::Collapse;
        let size = st.attr.size;
        if !off.is_multiple_of(BLOCK) || !len.is_multiple_of(BLOCK) {
            return Err(Error::invalid("collapse and insert ranges must be page-aligned"));
        }
        if collapse && off + len >= size {
            return Err(Error::invalid("a collapsed range must end before the end of file"));
        }
        if !collapse && off >= size {
            return Err(Error::invalid("an inserted range must start before the end of file"));
        }
        let Some(f) = st.file() else { return Err(Error::IsDir) };
        if !collapse {
            // Pages reserved past EOF move too: none may leave the largest file.
            let max_pg = MAX_FILE_SIZE / BLOCK + 1;
            let last = f.ext.end().max(f.ops.keys().max().map_or(0, |p| p + 1));
            if len > MAX_FILE_SIZE - size || last + len / BLOCK > max_pg {
                return Err(Error::FileTooBig);
            }
        }
        let new_size = if collapse { size - len } else { size + len };
        let e = EntryBuf::shift(off / BLOCK, len / BLOCK, !collapse, new_size, now);
        self.commit_single(i, st, &mut [e], false, false)
    }

    /// Pages of [off, end) that FALLOC_FL_ZERO_RANGE gives fresh zeroed blocks:
    /// every whole page, and a partial edge page that is a hole (a partial page with
    /// content is zeroed by the PUNCH entry instead). `None` past `limit` pages,
    /// decided before any page is listed.
    fn zero_range_pages(
        f: &crate::index::FileIndex,
        off: u64,
        end: u64,
        limit: u64,
    ) -> Option<Vec<u64>> {
        let (first_full, end_full) = (off.div_ceil(BLOCK), end / BLOCK);
        let full = end_full.saturating_sub(first_full);
        let mut edges: SmallVec<[u64; 2]> = SmallVec::new();
        for pg in [off / BLOCK, (end - 1) / BLOCK] {
            let partial = pg < first_full || pg >= end_full;
            if partial && !edges.contains(&pg) && f.lookup(pg).is_none() && !f.ops.contains_key(&pg)
            {
                edges.push(pg);
            }
        }
        if full + edges.len() as u64 > limit {
            return None;
        }
        let mut pages: Vec<u64> = (first_full..end_full.max(first_full)).collect();
        pages.extend(edges);
        pages.sort_unstable();
        Some(pages)
    }

    // -------------------------------------------------------------- create

    fn new_attr(
        &self,
        ftype: FileType,
        perm: u32,
        uid: u32,
        gid: u32,
        parent: u64,
        now: Ts,
    ) -> AttrRec {
        AttrRec {
            mode: ftype.mode_bits() | (perm & 0o7777),
            uid,
            gid,
            nlink: if ftype == FileType::Directory { 2 } else { 1 },
            size: 0,
            parent: if ftype == FileType::Directory { parent } else { 0 },
            atime: now,
            mtime: now,
            ctime: now,
            rdev: 0,
        }
    }

    /// Create a regular file. EEXIST if the name exists. `perm` is taken as it is
    /// (the caller applied its umask), unless the directory has a default ACL.
    pub fn create(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.make_node(parent, name, FileType::Regular, perm, 0, uid, gid, NodeData::None)
    }

    /// Create a directory (`perm` as for [`Fs::create`]).
    pub fn mkdir(&self, parent: u64, name: &[u8], perm: u32, uid: u32, gid: u32) -> Result<Attr> {
        self.make_node(parent, name, FileType::Directory, perm, 0, uid, gid, NodeData::None)
    }

    /// [`Fs::create`] or [`Fs::mkdir`] with the caller's `umask` still to apply: as
    /// open(2) and mkdir(2) on a file system with POSIX ACLs, a default ACL of the
    /// directory replaces the umask.
    pub fn make_masked(&self, node: NewNode<'_>, perm: u32, umask: u32) -> Result<Attr> {
        let ftype = if node.dir { FileType::Directory } else { FileType::Regular };
        self.make_node(
            node.parent,
            node.name,
            ftype,
            perm,
            umask,
            node.uid,
            node.gid,
            NodeData::None,
        )
    }

    /// mknod(2): a FIFO, socket, character or block device (`rdev` its device
    /// number in Linux's 32-bit encoding), or a regular file, with the caller's
    /// `umask` still to apply (see [`Fs::make_masked`]). The node holds no data:
    /// whoever opens it through the mount gets the kernel's pipe, socket or device.
    /// EINVAL for a directory or symlink type (mkdir and symlink make those), as
    /// mknod(2) answers. Who may make a device node is the kernel's check
    /// (CAP_MKNOD), made before a request reaches the daemon.
    pub fn mknod(
        &self,
        node: NewNode<'_>,
        ftype: FileType,
        perm: u32,
        rdev: u32,
        umask: u32,
    ) -> Result<Attr> {
        let extra = match ftype {
            FileType::Regular => NodeData::None,
            FileType::CharDevice | FileType::BlockDevice => NodeData::Rdev(rdev),
            t if t.is_special() => NodeData::None,
            _ => return Err(Error::invalid("mknod of a directory or symlink")),
        };
        self.make_node(node.parent, node.name, ftype, perm, umask, node.uid, node.gid, extra)
    }

    /// Create a symbolic link.
    pub fn symlink(
        &self,
        parent: u64,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Attr> {
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        self.make_node(
            parent,
            name,
            FileType::Symlink,
            0o777,
            0,
            uid,
            gid,
            NodeData::Target(target),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn make_node(
        &self,
        parent: u64,
        name: &[u8],
        ftype: FileType,
        perm: u32,
        umask: u32,
        uid: u32,
        gid: u32,
        extra: NodeData<'_>,
    ) -> Result<Attr> {
        self.check_writable()?;
        self.check_namespace()?;
        let p = self.inode(parent)?;
        let mut locked = Locked::new(self, &[&p])?;
        let (mut perm, mut gid) = (perm, gid);
        {
            let st = locked.st(parent);
            // A set-group-id directory hands its group to what is made in it, and
            // its set-group-id bit to subdirectories (BSD group semantics, as Linux
            // file systems do; Linux's clearing of the bit on a new file whose
            // creator is outside the group needs the creator's groups: absent).
            if st.attr.mode & 0o2000 != 0 {
                gid = st.attr.gid;
                if ftype == FileType::Directory {
                    perm |= 0o2000;
                }
            }
        }
        // A default ACL of the directory is inherited (and replaces the umask).
        let mut acl_entries: SmallVec<[(&[u8], Vec<u8>); 2]> = SmallVec::new();
        let pseed = locked.inode(parent).seed;
        match self.default_acl(pseed, locked.st(parent)).filter(|_| ftype != FileType::Symlink) {
            Some(d) => {
                let (access, mode) = d.create_masq(perm);
                perm = mode;
                if let Some(a) = access {
                    acl_entries.push((acl::ACCESS, a.encode()));
                }
                if ftype == FileType::Directory {
                    acl_entries.push((acl::DEFAULT, d.encode()));
                }
            }
            None => perm &= !umask,
        }
        {
            let st = locked.st(parent);
            let Some(d) = st.dir() else { return Err(Error::NotDir) };
            if st.attr.nlink == 0 {
                return Err(Error::NotFound);
            }
            if is_dot(name) {
                return Err(Error::Exists);
            }
            check_name(name)?;
            if d.names.contains_key(name) {
                return Err(Error::Exists);
            }
        }
        let shard = self.shard();
        let ino = self.ialloc.alloc(shard)?;
        let head = match self.balloc.alloc_placed(shard, 1, false, crate::alloc::Place::High) {
            Ok(r) => r[0].0 * BLOCK,
            Err(e) => {
                self.free_ino(ino);
                return Err(e);
            }
        };
        // The new log page's first lines and its next pointer are written below:
        // asked for now, they arrive while the entries are built.
        for off in [head, head + crate::pmem::CACHE_LINE, head + crate::log::LOG_DATA_END] {
            self.m.prefetch(off);
        }
        let old_state = self.read_slot(ino).state;
        debug_assert!(old_state & 1 == 0, "allocated inode {ino} is in use on media");
        let seed = log::seed(&self.sb.uuid, ino, old_state + 1);
        let now = self.m.now();
        let mut attr = self.new_attr(ftype, perm, uid, gid, parent, now);
        // Built where they stay: an `Entries` is a few hundred bytes, and each move
        // of it is a copy.
        let mut new = NewInode {
            ino,
            ftype,
            state_word: old_state,
            seed,
            head_page: head,
            entries: Entries::new(),
            data: Vec::new(),
        };
        let (entries, data) = (&mut new.entries, &mut new.data);
        if let NodeData::Rdev(rdev) = extra {
            attr.rdev = rdev;
        }
        if let NodeData::Target(t) = extra {
            attr.size = t.len() as u64;
            if t.len() <= INLINE_MAX {
                entries.push(EntryBuf::inline(0, t.len() as u64, now, t));
            } else {
                let b = match self.balloc.alloc_one(shard, false) {
                    Ok(b) => b,
                    Err(e) => {
                        self.free_pages(&[head]);
                        self.free_ino(ino);
                        return Err(e);
                    }
                };
                let mut page = vec![0u8; BLOCK as usize];
                page[..t.len()].copy_from_slice(t);
                let crc = self.m.write_nt_crc(b * BLOCK, &page) ^ seed;
                data.push((b, 1));
                entries.push(EntryBuf::write_crcs(0, b, t.len() as u64, now, None, &[crc]));
            }
        }
        EntryBuf::push(entries).set_setattr(&attr, false);
        for (name, v) in &acl_entries {
            entries.push(EntryBuf::xattr(false, name, v, now));
        }
        let mut parts = [Part { ino: parent, entries: Entries::new() }];
        let pentries = &mut parts[0].entries;
        EntryBuf::push(pentries).set_dentry(
            ino,
            locked.st(parent).dir().expect("dir").next_cookie,
            now,
            ftype.code(),
            name,
        );
        if ftype == FileType::Directory {
            Self::push_setattr(pentries, locked.st(parent), |a| {
                a.nlink += 1;
                a.mtime = now;
                a.ctime = now;
            });
        }
        match self.commit_multi(&mut locked, &mut parts, Some(&mut new), &[], false) {
            Ok(Some(inode)) => {
                let st = inode.st.read();
                Ok(self.attr_of(&inode, &st))
            }
            Ok(None) => unreachable!("commit_multi returns the new inode"),
            Err(e) => {
                self.free_pages(&[head]);
                self.free_runs(&new.data);
                self.free_ino(ino);
                Err(e)
            }
        }
    }

    // ---------------------------------------------------------------- link

    /// Hard link `ino` as `name` in `parent`.
    pub fn link(&self, ino: u64, parent: u64, name: &[u8]) -> Result<Attr> {
        self.check_writable()?;
        self.check_namespace()?;
        let c = self.inode(ino)?;
        let p = self.inode(parent)?;
        let mut locked = Locked::new(self, &[&p, &c])?;
        {
            let st = locked.st(parent);
            let Some(d) = st.dir() else { return Err(Error::NotDir) };
            if st.attr.nlink == 0 {
                return Err(Error::NotFound);
            }
            if is_dot(name) {
                return Err(Error::Exists);
            }
            check_name(name)?;
            if d.names.contains_key(name) {
                return Err(Error::Exists);
            }
        }
        if locked.st(ino).ftype == FileType::Directory {
            return Err(Error::NotPermitted);
        }
        if locked.st(ino).attr.nlink == 0 {
            return Err(Error::NotFound);
        }
        if locked.st(ino).attr.nlink >= u32::MAX - 1 {
            return Err(Error::invalid("too many links"));
        }
        let now = self.m.now();
        let cookie = locked.st(parent).dir().expect("dir").next_cookie;
        let ft = locked.st(ino).ftype;
        let mut parts =
            [Part { ino: parent, entries: Entries::new() }, Part { ino, entries: Entries::new() }];
        EntryBuf::push(&mut parts[0].entries).set_dentry(ino, cookie, now, ft.code(), name);
        Self::push_setattr(&mut parts[1].entries, locked.st(ino), |a| {
            a.nlink += 1;
            a.ctime = now;
        });
        self.commit_multi(&mut locked, &mut parts, None, &[], false)?;
        Ok(self.attr_of(locked.inode(ino), locked.st(ino)))
    }

    // -------------------------------------------------------- unlink/rmdir

    /// Remove a non-directory name.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, false)
    }

    /// Remove an empty directory.
    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: u64, name: &[u8], dir: bool) -> Result<()> {
        self.check_writable()?;
        self.check_namespace()?;
        let p = self.inode(parent)?;
        if p.ftype_now() != FileType::Directory {
            return Err(Error::NotDir);
        }
        if name.len() > NAME_MAX {
            return Err(Error::NameTooLong);
        }
        if dir && name == b"." {
            return Err(Error::invalid("rmdir of '.'"));
        }
        if dir && name == b".." {
            return Err(Error::NotEmpty);
        }
        if is_dot(name) {
            return Err(Error::IsDir);
        }
        for _ in 0..64 {
            let (cino, _) = self.lookup_in(&p, name)?;
            let c = self.inode(cino)?;
            let mut locked = Locked::new(self, &[&p, &c])?;
            match locked.st(parent).dir().and_then(|d| d.names.get(name)) {
                Some(e) if e.ino == cino => {}
                _ => continue, // changed under us: retry
            }
            let cst = locked.st(cino);
            match (dir, cst.ftype == FileType::Directory) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) if !cst.dir().expect("dir").names.is_empty() => {
                    return Err(Error::NotEmpty);
                }
                _ => {}
            }
            let now = self.m.now();
            // Built where they stay (see `EntryBuf::push`): a part is 424 bytes.
            let mut parts = [
                Part { ino: parent, entries: Entries::new() },
                Part { ino: cino, entries: Entries::new() },
            ];
            EntryBuf::push(&mut parts[0].entries).set_dentry(0, 0, now, 0, name);
            if dir {
                Self::push_setattr(&mut parts[0].entries, locked.st(parent), |a| {
                    a.nlink -= 1;
                    a.mtime = now;
                    a.ctime = now;
                });
            }
            let last = dir || cst.attr.nlink <= 1;
            let open = locked.inode(cino).open.load(Ordering::Acquire) > 0;
            let mut free: SmallVec<[u64; 1]> = SmallVec::new();
            // An open inode (a directory too) outlives its last name: it is freed at
            // its last release, or by recovery.
            let n = if last && !open {
                free.push(cino);
                1
            } else {
                Self::push_setattr(&mut parts[1].entries, cst, |a| {
                    a.nlink = if dir { 0 } else { a.nlink - 1 };
                    a.ctime = now;
                });
                2
            };
            self.commit_multi(&mut locked, &mut parts[..n], None, &free, true)?;
            return Ok(());
        }
        Err(Error::Busy)
    }

    // --------------------------------------------------------------- rename

    /// rename(2) / renameat2(2).
    pub fn rename(
        &self,
        sp: u64,
        sname: &[u8],
        dp: u64,
        dname: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.check_writable()?;
        self.check_namespace()?;
        if flags.noreplace && flags.exchange {
            return Err(Error::invalid("RENAME_NOREPLACE with RENAME_EXCHANGE"));
        }
        // Checks in Linux's order (do_renameat2, then vfs_rename): parents are
        // directories, "." and "..", the source name, the target name, flags,
        // ancestry, then types.
        // The rename lock orders renames that move a name between directories: their
        // ancestry checks read parent links that only such renames change. A rename
        // within one directory changes no parent link and checks no ancestry, so it
        // takes only the inode locks, as Linux's `lock_rename` takes only the
        // directory's lock when both parents are one (two threads renaming in their
        // own directories ran no faster together than one alone).
        let _g = (sp != dp).then(|| self.rename_lock.lock());
        // The old parent is resolved completely before the new one.
        let spi = self.inode(sp)?;
        if spi.st.read().ftype != FileType::Directory {
            return Err(Error::NotDir);
        }
        let dpi = self.inode(dp)?;
        if dpi.st.read().ftype != FileType::Directory {
            return Err(Error::NotDir);
        }
        if is_dot(sname) {
            return Err(Error::Busy);
        }
        if is_dot(dname) {
            return Err(if flags.noreplace { Error::Exists } else { Error::Busy });
        }
        // The lookups are repeated (rarely) when a name changed before the lock.
        for _ in 0..64 {
            let s = self.lookup_ino(sp, sname)?;
            check_name(dname)?;
            let d = match self.lookup_ino(dp, dname) {
                Ok(d) => Some(d),
                Err(Error::NotFound) => None,
                Err(e) => return Err(e),
            };
            let si = self.inode(s)?;
            let di = match d {
                Some(d) => Some(self.inode(d)?),
                None => None,
            };
            let s_dir = si.st.read().ftype == FileType::Directory;
            let d_dir = di.as_ref().map(|i| i.st.read().ftype == FileType::Directory);
            if flags.noreplace && d.is_some() {
                return Err(Error::Exists);
            }
            if flags.exchange && d.is_none() {
                return Err(Error::NotFound);
            }
            // Is directory `a` the directory `b` or one of its ancestors?
            let is_ancestor = |a: u64, b: u64| -> Result<bool> {
                let mut cur = b;
                for _ in 0..=self.geo.ninodes {
                    if cur == a {
                        return Ok(true);
                    }
                    if cur == self.root() {
                        return Ok(false);
                    }
                    let c = self.inode(cur)?;
                    let par = c.st.read().attr.parent;
                    if par == 0 || par == cur {
                        return Ok(false);
                    }
                    cur = par;
                }
                Err(Error::corrupt("directory parent chain does not reach the root"))
            };
            if sp != dp {
                if s_dir && is_ancestor(s, dp)? {
                    return Err(Error::invalid("move a directory into its own subtree"));
                }
                if let (Some(d), Some(true)) = (d, d_dir) {
                    if is_ancestor(d, sp)? {
                        return Err(if flags.exchange {
                            Error::invalid("exchange a directory with its own ancestor")
                        } else {
                            Error::NotEmpty
                        });
                    }
                }
            }
            if d == Some(s) {
                return Ok(());
            }
            if !flags.exchange {
                match d_dir {
                    Some(true) if !s_dir => return Err(Error::IsDir),
                    Some(false) if s_dir => return Err(Error::NotDir),
                    _ => {}
                }
            }
            let mut all: SmallVec<[&Arc<Inode>; 4]> = smallvec::smallvec![&spi, &dpi, &si];
            if let Some(di) = &di {
                all.push(di);
            }
            let mut locked = Locked::new(self, &all)?;
            // Names were looked up before the parents were locked: a create, unlink or
            // link, or a rename within one directory (they do not take the rename lock)
            // may have changed them meanwhile.
            let now_at = |l: &Locked<'_, M>, p: u64, n: &[u8]| {
                l.st(p).dir().and_then(|x| x.names.get(n)).map(|e| e.ino)
            };
            if now_at(&locked, sp, sname) != Some(s) || now_at(&locked, dp, dname) != d {
                continue;
            }
            // A removed (but still open) directory takes no new names, as in Linux.
            if locked.st(sp).attr.nlink == 0 || locked.st(dp).attr.nlink == 0 {
                return Err(Error::NotFound);
            }
            if let (Some(d), Some(true)) = (d, d_dir) {
                if !flags.exchange && !locked.st(d).dir().expect("dir").names.is_empty() {
                    return Err(Error::NotEmpty);
                }
            }
            let now = self.m.now();
            let s_ft = locked.st(s).ftype.code();
            if s == sp || s == dp {
                return Err(Error::invalid("rename of a directory onto its parent"));
            }
            // Entries are built where they stay (see `EntryBuf::push`), each inode's
            // in one part, the parts in the order sp, dp, s, d.
            let mut parts = Parts::new();
            let mut sp_nlink: i64 = 0;
            let mut dp_nlink: i64 = 0;
            let mut free: SmallVec<[u64; 1]> = SmallVec::new();
            if flags.exchange {
                let d = d.expect("exchange target");
                let d_ft = locked.st(d).ftype.code();
                let dd = d_dir == Some(true);
                let sc = locked.st(sp).dir().expect("dir").next_cookie;
                EntryBuf::push(parts.of(sp)).set_dentry(d, sc, now, d_ft, sname);
                let dc =
                    if sp == dp { sc + 1 } else { locked.st(dp).dir().expect("dir").next_cookie };
                EntryBuf::push(parts.of(dp)).set_dentry(s, dc, now, s_ft, dname);
                if sp != dp {
                    sp_nlink += dd as i64 - s_dir as i64;
                    dp_nlink += s_dir as i64 - dd as i64;
                }
                Self::push_setattr(parts.of(s), locked.st(s), |a| {
                    if s_dir {
                        a.parent = dp;
                    }
                    a.ctime = now;
                });
                if d != sp && d != dp {
                    Self::push_setattr(parts.of(d), locked.st(d), |a| {
                        if dd {
                            a.parent = sp;
                        }
                        a.ctime = now;
                    });
                }
            } else {
                EntryBuf::push(parts.of(sp)).set_dentry(0, 0, now, 0, sname);
                let dc = locked.st(dp).dir().expect("dir").next_cookie;
                EntryBuf::push(parts.of(dp)).set_dentry(s, dc, now, s_ft, dname);
                if s_dir && sp != dp {
                    sp_nlink -= 1;
                    dp_nlink += 1;
                }
                Self::push_setattr(parts.of(s), locked.st(s), |a| {
                    if s_dir {
                        a.parent = dp;
                    }
                    a.ctime = now;
                });
                if let Some(d) = d {
                    let dst = locked.st(d);
                    let dd = dst.ftype == FileType::Directory;
                    if dd {
                        dp_nlink -= 1;
                    }
                    let open = locked.inode(d).open.load(Ordering::Acquire) > 0;
                    if (dd || dst.attr.nlink <= 1) && !open {
                        free.push(d);
                    } else if d != sp && d != dp {
                        Self::push_setattr(parts.of(d), dst, |a| {
                            a.nlink = if dd { 0 } else { a.nlink - 1 };
                            a.ctime = now;
                        });
                    }
                }
            }
            // Parent attribute changes (link counts, times), after their entries.
            let bumps: [(u64, i64); 2] = if sp == dp {
                [(sp, sp_nlink + dp_nlink), (dp, 0)]
            } else {
                [(sp, sp_nlink), (dp, dp_nlink)]
            };
            for (ino, dn) in bumps {
                if dn != 0 {
                    Self::push_setattr(parts.of(ino), locked.st(ino), |a| {
                        a.nlink = (a.nlink as i64 + dn) as u32;
                        a.mtime = now;
                        a.ctime = now;
                    });
                }
            }
            let n = parts.n;
            self.commit_multi(&mut locked, &mut parts.parts[..n], None, &free, true)?;
            return Ok(());
        }
        Err(Error::Busy)
    }

    // -------------------------------------------------------------- readdir

    /// Entries of directory `ino` after cookie `after` ("." is 1, ".." is 2);
    /// `f` returns false to stop.
    pub fn readdir(&self, ino: u64, after: u64, f: impl FnMut(DirEntry) -> bool) -> Result<()> {
        let i = self.inode(ino)?;
        let persist = self.readdir_locked(&i, ino, after, f)?;
        if persist {
            self.persist_atime_best_effort(&i);
        }
        Ok(())
    }

    /// [`Fs::readdir`] under the state lock; true when the access time should be
    /// persisted now.
    fn readdir_locked(
        &self,
        i: &Inode,
        ino: u64,
        after: u64,
        mut f: impl FnMut(DirEntry) -> bool,
    ) -> Result<bool> {
        let st = i.st.read();
        let Some(d) = st.dir() else { return Err(Error::NotDir) };
        // A listing is an access (at its start, with or without "." and "..").
        let persist = after <= 2 && self.touch_atime(i, &st);
        let parent = if st.attr.parent == 0 { ino } else { st.attr.parent };
        if after < 1
            && !f(DirEntry { name: b".".to_vec(), ino, ftype: FileType::Directory, cookie: 1 })
        {
            return Ok(persist);
        }
        if after < 2
            && !f(DirEntry {
                name: b"..".to_vec(),
                ino: parent,
                ftype: FileType::Directory,
                cookie: 2,
            })
        {
            return Ok(persist);
        }
        for (cookie, name) in d.order.from(after.max(2).saturating_add(1)) {
            let e = &d.names[name];
            let ftype = FileType::from_code(e.ftype as u32).unwrap_or(FileType::Regular);
            if !f(DirEntry { name: name.to_vec(), ino: e.ino, ftype, cookie }) {
                break;
            }
        }
        Ok(persist)
    }

    /// All entries of a directory (without "." and "..").
    pub fn list_dir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        let mut v = Vec::new();
        self.readdir(ino, 2, |e| {
            v.push(e);
            true
        })?;
        Ok(v)
    }

    // --------------------------------------------------------------- statfs

    /// File system statistics.
    pub fn statfs(&self) -> StatFs {
        let free = self.balloc.free_blocks();
        StatFs {
            bsize: BLOCK,
            blocks: self.geo.nblocks - self.geo.data_start,
            bfree: free,
            bavail: free.saturating_sub(self.balloc.reserve()),
            files: self.geo.ninodes,
            ffree: self.ialloc.free_inodes(),
            namelen: NAME_MAX as u64,
        }
    }

    // --------------------------------------------------------------- xattrs

    /// Linux's order for xattr calls: name length (ERANGE), value size (E2BIG),
    /// the inode, [`Self::check_xattr_target`], then this namespace check.
    fn check_xattr_name(name: &[u8]) -> Result<()> {
        if name.is_empty() {
            return Err(Error::Range);
        }
        if name.len() > 255 {
            return Err(Error::Range);
        }
        Ok(())
    }

    fn check_xattr_ns(name: &[u8]) -> Result<()> {
        if acl::is_acl_name(name) {
            return Ok(());
        }
        let prefixes = [&b"user."[..], b"trusted.", b"security."];
        match prefixes.iter().find(|p| name.starts_with(p)) {
            // A bare prefix names no attribute: EINVAL, as Linux.
            Some(p) if name.len() == p.len() => Err(Error::invalid("empty attribute name")),
            Some(_) => Ok(()),
            None => Err(Error::NotSupported("extended attribute namespace")),
        }
    }

    /// Linux allows `user.*` attributes only on regular files and directories
    /// (xattr_permission): EPERM for a change on anything else, ENODATA for a read.
    fn check_xattr_target(name: &[u8], st: &InodeState, write: bool) -> Result<()> {
        if name.starts_with(b"user.") && st.ftype == FileType::Symlink {
            return Err(if write { Error::NotPermitted } else { Error::NoAttr });
        }
        if acl::is_acl_name(name) && st.ftype == FileType::Symlink {
            return Err(Error::NotSupported("POSIX ACLs on a symlink"));
        }
        Self::check_xattr_ns(name)
    }

    /// Value of extended attribute `name`.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        Self::check_xattr_name(name)?;
        let i = self.inode(ino)?;
        self.read_fresh(&i, true, |st| {
            Self::check_xattr_target(name, st, false)?;
            let r = st.xattrs.get(name).ok_or(Error::NoAttr)?;
            log::read_xattr(&self.m, i.seed, r)
        })?
    }

    /// Set extended attribute `name`.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], how: XattrSet) -> Result<()> {
        self.check_writable()?;
        Self::check_xattr_name(name)?;
        if name == crate::numa::POLICY_XATTR {
            self.check_policy(value)?;
        }
        if value.len() > log::XATTR_SIZE_MAX {
            return Err(Error::TooBig);
        }
        self.check_namespace()?;
        let i = self.inode(ino)?;
        let _h = self.hold(&i)?;
        let mut st = i.st.write();
        Self::check_xattr_target(name, &st, true)?;
        if value.len() > XATTR_VALUE_MAX && acl::is_acl_name(name) {
            return Err(Error::invalid("ACL too large"));
        }
        let exists = st.xattrs.contains_key(name);
        match how {
            XattrSet::Create if exists => return Err(Error::Exists),
            XattrSet::Replace if !exists => return Err(Error::NoAttr),
            _ => {}
        }
        let now = self.m.now();
        if acl::is_acl_name(name) {
            let mut entries = self.acl_set_entries(&st, name, value, now)?;
            if entries.is_empty() {
                return Ok(());
            }
            return self.commit_single(&i, &mut st, &mut entries, false, false);
        }
        if value.len() <= XATTR_VALUE_MAX {
            let e = EntryBuf::xattr(false, name, value, now);
            return self.commit_single(&i, &mut st, &mut [e], false, false);
        }
        // Too large for an entry: the value goes to fresh data blocks, which are
        // fenced before the entry that names them is committed.
        let n = value.len().div_ceil(BLOCK as usize) as u64;
        let runs = self.alloc_blocks(self.shard(), n, false)?;
        let blocks: SmallVec<[u64; 2]> = runs.iter().flat_map(|&(s, l)| s..s + l).collect();
        let mut page = [0u8; BLOCK as usize];
        for (chunk, &b) in value.chunks(BLOCK as usize).zip(&blocks) {
            page[..chunk.len()].copy_from_slice(chunk);
            page[chunk.len()..].fill(0);
            self.m.write_nt(b * BLOCK, &page);
        }
        let spill = log::Spill { crc: crate::pmem::crc32c_append(i.seed, value), blocks };
        let e = EntryBuf::xattr_spilled(name, value.len() as u32, &spill, now);
        let r = self.commit_single(&i, &mut st, &mut [e], true, false);
        if r.is_err() {
            self.free_runs(&runs);
        }
        r
    }

    /// The value of extended attribute `name` of a locked inode.
    fn xattr_value(&self, seed: u32, st: &InodeState, name: &[u8]) -> Option<Vec<u8>> {
        log::read_xattr(&self.m, seed, st.xattrs.get(name)?).ok()
    }

    /// The inode's default ACL, if it has a valid one.
    fn default_acl(&self, seed: u32, st: &InodeState) -> Option<acl::Acl> {
        self.xattr_value(seed, st, acl::DEFAULT).and_then(|v| acl::parse(&v).ok().flatten())
    }

    /// Entries that set POSIX ACL attribute `name` to `value` (see `acl`): an access
    /// ACL sets the mode's permission bits and is stored only when it says more than
    /// they do; an empty value removes the ACL; a default ACL only on a directory.
    fn acl_set_entries(
        &self,
        st: &InodeState,
        name: &[u8],
        value: &[u8],
        now: Ts,
    ) -> Result<Vec<EntryBuf>> {
        let parsed = acl::parse(value)?;
        let exists = st.xattrs.contains_key(name);
        let mut entries = Vec::new();
        if name == acl::DEFAULT {
            if st.ftype != FileType::Directory {
                // As Linux: EACCES for a default ACL on anything but a directory,
                // and removing none is no error.
                return if parsed.is_some() { Err(Error::AccessDenied) } else { Ok(entries) };
            }
            match parsed {
                Some(a) => entries.push(EntryBuf::xattr(false, name, &a.encode(), now)),
                None if exists => entries.push(EntryBuf::xattr(true, name, &[], now)),
                None => {}
            }
            return Ok(entries);
        }
        match parsed {
            Some(a) => {
                let mode = a.apply_to_mode(st.attr.mode);
                if a.is_mode_only() {
                    if exists {
                        entries.push(EntryBuf::xattr(true, name, &[], now));
                    }
                } else {
                    entries.push(EntryBuf::xattr(false, name, &a.encode(), now));
                }
                let (e, _) = Self::setattr_entry(st, |at| {
                    at.mode = mode;
                    at.ctime = now;
                });
                entries.push(e);
            }
            None if exists => entries.push(EntryBuf::xattr(true, name, &[], now)),
            None => {}
        }
        Ok(entries)
    }

    /// Names of all extended attributes.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let i = self.inode(ino)?;
        let st = i.st.read();
        Ok(st.xattrs.keys().cloned().collect())
    }

    /// Remove extended attribute `name`.
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        Self::check_xattr_name(name)?;
        self.check_namespace()?;
        let i = self.inode(ino)?;
        let _h = self.hold(&i)?;
        let mut st = i.st.write();
        Self::check_xattr_target(name, &st, true)?;
        if !st.xattrs.contains_key(name) {
            return Err(Error::NoAttr);
        }
        let e = EntryBuf::xattr(true, name, &[], self.m.now());
        self.commit_single(&i, &mut st, &mut [e], false, true)
    }

    /// Number of open handles on `ino` (0 if not cached).
    pub fn open_count(&self, ino: u64) -> u32 {
        self.inode(ino).map(|i| i.open.load(Ordering::Acquire)).unwrap_or(0)
    }

    /// Log pages of an inode (for tests and `ferrite stat`).
    pub fn log_pages(&self, ino: u64) -> Result<usize> {
        let i = self.inode(ino)?;
        self.read_fresh(&i, false, |st| st.log.pages.len())
    }

    pub(crate) fn inode_arc(&self, ino: u64) -> Result<Arc<Inode>> {
        self.inode(ino)
    }

    #[allow(dead_code)]
    pub(crate) fn body_is_dir(st: &InodeState) -> bool {
        matches!(st.body, Body::Dir(_))
    }
}

/// The raw CRC32C (no seed) of a page whose raw CRC was `old`, with zeros from
/// byte `v` on, once `data` is written at `v`: by linearity, the old CRC, the
/// CRC of `data` alone at its place in a page of zeros, and that of a page of
/// zeros; no pass over the page.
fn tail_page_crc(old: u32, v: usize, data: &[u8]) -> u32 {
    use crate::pmem::{crc32c_append, crc32c_zero_extend as zeros};
    let page = BLOCK as usize;
    let alone = zeros(crc32c_append(zeros(0, v), data), page - v - data.len());
    old ^ alone ^ crate::pmem::ZERO_PAGE_CRC
}

/// The runs of `cow` that [`cow_entries`] makes one WRITE entry each of: consecutive
/// file pages in consecutive blocks, at most [`log::PCRC_MAX_PAGES`] pages.
pub(crate) fn cow_runs(cow: &[(u64, u64, u32)]) -> impl Iterator<Item = &[(u64, u64, u32)]> {
    cow.chunk_by(|a, b| (b.0, b.1) == (a.0 + 1, a.1 + 1))
        .flat_map(|run| run.chunks(log::PCRC_MAX_PAGES as usize))
}

/// WRITE entries for copy-on-write pages `cow` (file page, block, page checksum;
/// ascending pages), one per run of consecutive pages in consecutive blocks (at
/// most `PCRC_MAX_PAGES` each), with page checksums unless `checked` is false.
pub(crate) fn cow_entries<A: smallvec::Array<Item = EntryBuf>>(
    seed: u32,
    cow: &[(u64, u64, u32)],
    size: u64,
    now: Ts,
    checked: bool,
    entries: &mut SmallVec<A>,
) {
    let mut crcs: SmallVec<[u32; 4]> = SmallVec::new();
    for run in cow_runs(cow) {
        let (pg0, b0, _) = run[0];
        crcs.clear();
        crcs.extend(run.iter().map(|c| c.2));
        let acc = crcs.iter().fold(seed, |a, &c| log::data_crc(a, c));
        if checked {
            // Built where it stays, as `set_inline`.
            entries.push(EntryBuf { bytes: Default::default() });
            let e = entries.last_mut().expect("just pushed");
            e.set_write_crcs(pg0, b0, size, now, Some(acc), &crcs);
        } else {
            entries.push(EntryBuf::write(pg0, b0, run.len() as u32, size, now, None));
        }
    }
}
