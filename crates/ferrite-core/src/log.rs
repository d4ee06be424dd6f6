//! Per-inode logs: linked 4 KiB pages of checksummed entries.
//!
//! Invariants:
//! - A log page holds entries in `[0, LOG_DATA_END)` and the next-page pointer in its
//!   last 8 bytes. An entry never spans pages; an `End` entry sends the walk to the
//!   next page, and [`END_RESERVE`] bytes are always left for it.
//! - Every entry carries a CRC32C seeded with the inode's incarnation (inode number
//!   and slot state) and a sequence number one above the previous entry's, so stale
//!   bytes from an earlier use of a page never validate.
//! - The committed tail is always just after an entry with [`FLAG_TXEND`]. Recovery
//!   walks from the head; an invalid entry before the tail means the last operation
//!   was torn (its entries and tail were in flight together) and the log is cut back
//!   to the last `TXEND` boundary.
//! - A WRITE with [`FLAG_DCRC`] was committed with one fence for its data, entries
//!   and tail: its data may be torn even when the tail and entries are not. Only a
//!   log's last operation can be in that state (the next tail store waits for its
//!   fence), so recovery checks that one's data ([`walk_apply_checking`]).
//! - A WRITE with [`FLAG_PCRC`] carries each page's [`page_crc`] after its body, so
//!   a page stays checkable when later writes replace others of its extent.
//! - Walks are bounded by the pool's block count and detect cycles; corrupt media is
//!   an `Error::Corrupt`, never a panic.

use crate::error::{Error, Result};
use crate::layout::{Geometry, Reader, BLOCK};
use crate::pmem::{persist_copy, Medium};
use rustc_hash::FxHashSet as HashSet;

/// End of the entry area of a log page (the next pointer follows).
pub const LOG_DATA_END: u64 = BLOCK - 8;
/// Room always kept free in a page for the `End` entry.
pub const END_RESERVE: u64 = 16;
/// Largest entry.
pub const MAX_ENTRY: usize = (LOG_DATA_END - END_RESERVE) as usize;
/// Entry header size.
pub const HDR: usize = 16;
/// Flag: last entry of an operation (a valid commit point).
pub const FLAG_TXEND: u8 = 1;
/// Flag: this SETATTR shrank the file (it stays pinned until thorough GC).
pub const FLAG_SHRINK: u8 = 2;
/// Flag: this WRITE carries a checksum of its data (format v2). Its commit had one
/// fence for data, entries and tail together, so recovery checks the data of a
/// log's last operation before it keeps it.
pub const FLAG_DCRC: u8 = 4;
/// Flag: this WRITE is followed by the checksum of each of its pages (format v3),
/// which reads and scrub verify page by page ([`write_page_crc`]).
pub const FLAG_PCRC: u8 = 8;
/// Flag: this SHIFT moves pages up (insert range); without it, down (collapse).
pub const FLAG_INSERT: u8 = 16;
/// Flag: this WRITE (one page, with [`FLAG_PCRC`]; format v7) is an append written
/// in place past the file's end into the block its page already had, or a new
/// block: the block's bytes from the file size after it on (within the page) are
/// not the page's and read as zero; the page's checksum takes them as zero.
pub const FLAG_TAIL: u8 = 32;
/// Pages a WRITE with [`FLAG_PCRC`] covers at most (its entry is then 1,088 bytes);
/// writers split longer extents.
pub const PCRC_MAX_PAGES: u32 = 256;

/// Entry type codes.
pub mod etype {
    /// Full attribute snapshot.
    pub const SETATTR: u8 = 1;
    /// Copy-on-write page extent.
    pub const WRITE: u8 = 2;
    /// Sub-page write with its data embedded in the entry.
    pub const INLINE: u8 = 3;
    /// Zero a byte range (punch hole).
    pub const PUNCH: u8 = 4;
    /// Directory entry add (ino != 0) or remove (ino == 0).
    pub const DENTRY: u8 = 5;
    /// Extended attribute set or remove.
    pub const XATTR: u8 = 6;
    /// Continue on the next page.
    pub const END: u8 = 7;
    /// Move a file's pages from a page on by a page count (collapse or insert range;
    /// format v4).
    pub const SHIFT: u8 = 8;
}

/// A timestamp.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Ts {
    /// Seconds since the epoch.
    pub sec: i64,
    /// Nanoseconds.
    pub nsec: u32,
}

impl Ts {
    /// The current time, to the nanosecond (tmpfs and ext4 stamp files that finely
    /// once their times were looked at; so must we, or a stat after a write can show
    /// the old time). The clock reads the TSC in an ordered way, which waits for
    /// stores in flight: take it before copying data, not after.
    pub fn now() -> Ts {
        crate::pmem::fine_now()
    }
}

/// Attribute snapshot carried by SETATTR (72-byte body).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttrRec {
    /// Mode including the type bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Link count.
    pub nlink: u32,
    /// Size in bytes.
    pub size: u64,
    /// Parent directory (directories only; 0 otherwise).
    pub parent: u64,
    /// Access time.
    pub atime: Ts,
    /// Modification time.
    pub mtime: Ts,
    /// Change time.
    pub ctime: Ts,
    /// Device number of a character or block device (Linux's encoding, as
    /// `new_encode_dev`); 0 for every other type.
    pub rdev: u32,
}

/// Names decoded from DENTRY entries held inline up to this many bytes.
pub const NAME_INLINE: usize = 32;
/// A decoded entry name.
pub type Name = smallvec::SmallVec<[u8; NAME_INLINE]>;

/// A decoded log entry. Variable parts are referenced by offset into the entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    /// Attribute snapshot, and whether it carries `FLAG_SHRINK` (it shrank the file
    /// when committed, so it stays pinned until thorough GC).
    SetAttr(AttrRec, bool),
    /// Pages `[pgoff, pgoff + npages)` now live in blocks `[block, block + npages)`.
    Write {
        /// First file page.
        pgoff: u64,
        /// First data block number.
        block: u64,
        /// Page count.
        npages: u32,
        /// File size after the write.
        size: u64,
        /// Modification time.
        mtime: Ts,
        /// Checksum of the extent's data ([`data_crc`]), if it was committed
        /// without a fence between data and tail.
        dcrc: Option<u32>,
        /// The entry carries its pages' checksums ([`FLAG_PCRC`]), at
        /// [`WRITE_LEN`] + 4 k for page k.
        pcrc: bool,
        /// An in-place append ([`FLAG_TAIL`]): its page's checksum ([`page_crc`],
        /// the bytes past its size taken as zero).
        tail: Option<u32>,
    },
    /// `dlen` bytes at file offset `off`, stored at `data_off` inside the entry.
    Inline {
        /// File offset.
        off: u64,
        /// File size after the write.
        size: u64,
        /// Modification time.
        mtime: Ts,
        /// Data length.
        dlen: u32,
        /// Offset of the data inside the entry.
        data_off: u32,
    },
    /// Zero `[off, off + len)`.
    Punch {
        /// Start.
        off: u64,
        /// Length.
        len: u64,
        /// Modification time.
        mtime: Ts,
    },
    /// COLLAPSE_RANGE (`insert` false): pages `[pg, pg + pages)` go, those after
    /// move down by `pages`; INSERT_RANGE: pages from `pg` on move up by `pages`.
    Shift {
        /// First page of the range.
        pg: u64,
        /// Pages in the range.
        pages: u64,
        /// Insert (up) rather than collapse (down).
        insert: bool,
        /// File size after the move.
        size: u64,
        /// Modification time.
        mtime: Ts,
    },
    /// Name `name` now refers to `ino` (0: removed).
    Dentry {
        /// Target inode, 0 for removal.
        ino: u64,
        /// Stable readdir cookie of an added entry.
        cookie: u64,
        /// Directory mtime/ctime after the change.
        time: Ts,
        /// File type code of the target.
        ftype: u8,
        /// Name (inline up to [`NAME_INLINE`] bytes: applying a namespace
        /// operation's own entry, or replaying a directory's log, allocates nothing
        /// for a typical name).
        name: Name,
    },
    /// Extended attribute set (value at `value_off`, or in data blocks) or removal.
    Xattr {
        /// Removal?
        remove: bool,
        /// Attribute name.
        name: Vec<u8>,
        /// Value length.
        value_len: u32,
        /// Offset of the value inside the entry (of the block list when spilled).
        value_off: u32,
        /// A value larger than an entry holds: its CRC32C (seeded with the log's
        /// seed) and the data blocks it fills, in order.
        spill: Option<Spill>,
        /// ctime after the change.
        time: Ts,
    },
    /// Continue at the next page.
    End,
}

/// Sizes of fixed bodies.
pub const SETATTR_LEN: usize = HDR + 72;
/// WRITE entry size.
pub const WRITE_LEN: usize = HDR + 48;
/// Bytes of a one-page in-place append's WRITE ([`EntryBuf::set_tail_write`]):
/// [`WRITE_LEN`] and one page checksum, padded.
pub const TAIL_WRITE_LEN: usize = (WRITE_LEN + 4).next_multiple_of(8);
/// INLINE header size (data follows).
pub const INLINE_HDR: usize = HDR + 40;
/// PUNCH entry size.
pub const PUNCH_LEN: usize = HDR + 32;
/// SHIFT entry size.
pub const SHIFT_LEN: usize = HDR + 40;
/// DENTRY header size (name follows).
pub const DENTRY_HDR: usize = HDR + 40;
/// XATTR header size (name and value follow).
pub const XATTR_HDR: usize = HDR + 24;
/// Largest extended attribute value (Linux's XATTR_SIZE_MAX). Values that do not fit
/// in an entry live in data blocks named by the entry (kind 2, "spilled").
pub const XATTR_SIZE_MAX: usize = 65536;
/// Data blocks of the largest spilled value.
pub const XATTR_SPILL_BLOCKS: usize = XATTR_SIZE_MAX / BLOCK as usize;
const XATTR_SET: u8 = 0;
const XATTR_REMOVE: u8 = 1;
const XATTR_SPILLED: u8 = 2;

/// Where a spilled extended attribute value lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spill {
    /// CRC32C of the value, seeded with the log's seed.
    pub crc: u32,
    /// Its data blocks, in order (the last one zero-padded).
    pub blocks: smallvec::SmallVec<[u64; 2]>,
}

impl Spill {
    /// The body an XATTR entry carries for it: crc u32, block count u32, blocks.
    fn encoded_len(nblocks: usize) -> usize {
        8 + 8 * nblocks
    }
}

fn pad8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// Bytes an [`EntryBytes`] holds without a heap allocation.
pub const ENTRY_INLINE: usize = 128;
/// Bytes of an encoded entry: inline up to 128 bytes (SETATTR, WRITE, PUNCH, a DENTRY
/// of a name up to 72 bytes), so building one allocates nothing.
pub type EntryBytes = smallvec::SmallVec<[u8; ENTRY_INLINE]>;

/// Log pages an append took (inline: a commit that starts a page allocates nothing
/// for the list; one took two `Vec`s, a third of a 64 B write's allocations).
pub type Pages = smallvec::SmallVec<[u64; 2]>;

/// An encoded entry waiting to be appended (seq and crc are filled in then).
#[derive(Clone, Debug)]
pub struct EntryBuf {
    /// Whole entry bytes (header included).
    pub bytes: EntryBytes,
}

/// Encoder of one entry: the bytes are sized (and zeroed) once, then each field is
/// stored at its offset through one borrowed slice (no growth checks per field,
/// and no inline-or-heap test of the `SmallVec` per field). It fills an entry in
/// place (`Enc::at`), or builds one it returns (`Enc::build`).
struct Enc<'a>(&'a mut [u8], usize);
impl<'a> Enc<'a> {
    /// Encode into `v` (its old bytes dropped): an entry built where it will stay.
    fn at(v: &'a mut EntryBytes, t: u8, flags: u8, len: usize) -> Self {
        header(v, t, flags, len);
        Enc(&mut v[..], HDR)
    }
}
impl Enc<'_> {
    /// A new entry of type `t`, its body stored by `body`.
    fn build(t: u8, flags: u8, len: usize, body: impl FnOnce(&mut Enc<'_>)) -> EntryBuf {
        let mut bytes = EntryBytes::new();
        body(&mut Enc::at(&mut bytes, t, flags, len));
        EntryBuf { bytes }
    }
}
/// Size `v` to the padded `len`, zeroed, and store the header's type, flags and
/// length.
fn header(v: &mut EntryBytes, t: u8, flags: u8, len: usize) {
    let len = pad8(len);
    assert!(len <= MAX_ENTRY, "entry of {len} bytes too large");
    if !v.spilled() && len <= v.inline_size() {
        // An entry that fits inline: one zeroed buffer moved in, where
        // `extend_from_slice` takes `insert_from_slice`'s generic path (callgrind:
        // 2,719 -> 2,687 instructions a 64 B random write, 8,397 -> 8,339 a 4 KiB one).
        *v = EntryBytes::from_buf_and_len([0u8; ENTRY_INLINE], len);
    } else {
        v.clear();
        // From a zeroed slice: `SmallVec::resize` stores the zeros one byte at a time.
        static ZEROS: [u8; MAX_ENTRY] = [0; MAX_ENTRY];
        v.extend_from_slice(&ZEROS[..len]);
    }
    v[4] = t;
    v[5] = flags;
    v[6..8].copy_from_slice(&(len as u16).to_le_bytes());
}
impl Enc<'_> {
    #[inline]
    fn put(&mut self, b: &[u8]) -> &mut Self {
        let end = self.1 + b.len();
        assert!(end <= self.0.len(), "entry body overran its declared length");
        self.0[self.1..end].copy_from_slice(b);
        self.1 = end;
        self
    }
    fn u8(&mut self, x: u8) -> &mut Self {
        self.put(&[x])
    }
    fn u16(&mut self, x: u16) -> &mut Self {
        self.put(&x.to_le_bytes())
    }
    #[inline]
    fn u32(&mut self, x: u32) -> &mut Self {
        self.put(&x.to_le_bytes())
    }
    #[inline]
    fn u64(&mut self, x: u64) -> &mut Self {
        self.put(&x.to_le_bytes())
    }
    #[inline]
    fn i64(&mut self, x: i64) -> &mut Self {
        self.u64(x as u64)
    }
    #[inline(always)]
    fn ts(&mut self, t: Ts) -> &mut Self {
        self.i64(t.sec).u32(t.nsec).u32(0)
    }
    #[inline]
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.put(b)
    }
}

impl EntryBuf {
    /// SETATTR.
    pub fn setattr(a: &AttrRec, shrink: bool) -> EntryBuf {
        let mut e = EntryBuf { bytes: EntryBytes::new() };
        e.set_setattr(a, shrink);
        e
    }

    /// Make this entry a SETATTR, in place (see [`EntryBuf::push`]).
    pub fn set_setattr(&mut self, a: &AttrRec, shrink: bool) {
        let f = if shrink { FLAG_SHRINK } else { 0 };
        Enc::at(&mut self.bytes, etype::SETATTR, f, SETATTR_LEN)
            .u32(a.mode)
            .u32(a.uid)
            .u32(a.gid)
            .u32(a.nlink)
            .u64(a.size)
            .u64(a.parent)
            .i64(a.atime.sec)
            .i64(a.mtime.sec)
            .i64(a.ctime.sec)
            .u32(a.atime.nsec)
            .u32(a.mtime.nsec)
            .u32(a.ctime.nsec)
            .u32(a.rdev);
    }

    /// WRITE; `dcrc`: the extent's [`data_crc`] when its commit does not fence the
    /// data before the tail.
    pub fn write(
        pgoff: u64,
        block: u64,
        npages: u32,
        size: u64,
        mtime: Ts,
        dcrc: Option<u32>,
    ) -> EntryBuf {
        let f = if dcrc.is_some() { FLAG_DCRC } else { 0 };
        Enc::build(etype::WRITE, f, WRITE_LEN, |e| {
            e.u64(pgoff).u64(block).u32(npages).u32(dcrc.unwrap_or(0)).u64(size).ts(mtime);
        })
    }

    /// WRITE of `crcs.len()` pages (at most [`PCRC_MAX_PAGES`]) carrying each
    /// page's [`page_crc`]; `dcrc` as for [`EntryBuf::write`].
    pub fn write_crcs(
        pgoff: u64,
        block: u64,
        size: u64,
        mtime: Ts,
        dcrc: Option<u32>,
        crcs: &[u32],
    ) -> EntryBuf {
        let mut e = EntryBuf { bytes: EntryBytes::new() };
        e.set_write_crcs(pgoff, block, size, mtime, dcrc, crcs);
        e
    }

    /// Make this entry an [`EntryBuf::write_crcs`], in place (no move of its bytes).
    pub fn set_write_crcs(
        &mut self,
        pgoff: u64,
        block: u64,
        size: u64,
        mtime: Ts,
        dcrc: Option<u32>,
        crcs: &[u32],
    ) {
        let n = crcs.len();
        assert!(n >= 1 && n <= PCRC_MAX_PAGES as usize, "WRITE of {n} checksummed pages");
        let f = FLAG_PCRC | if dcrc.is_some() { FLAG_DCRC } else { 0 };
        let mut e = Enc::at(&mut self.bytes, etype::WRITE, f, WRITE_LEN + 4 * n);
        e.u64(pgoff).u64(block).u32(n as u32).u32(dcrc.unwrap_or(0)).u64(size).ts(mtime);
        for &c in crcs {
            e.u32(c);
        }
    }

    /// Make this entry a one-page in-place append ([`FLAG_TAIL`]): page `pg` lives
    /// in `block`, whose bytes up to `size` (within the page) are the page's;
    /// `crc` is the page's [`page_crc`] with the rest taken as zero; `dcrc` as for
    /// [`EntryBuf::write`].
    pub fn set_tail_write(
        &mut self,
        pg: u64,
        block: u64,
        size: u64,
        mtime: Ts,
        dcrc: Option<u32>,
        crc: u32,
    ) {
        debug_assert!(size > pg * crate::layout::BLOCK, "an in-place append's size");
        // [`EntryBuf::set_write_crcs`] of one page, with FLAG_TAIL, stored through
        // a fixed-size array (no per-field bounds checks; the hot path of small
        // appends: `set_tail_write_is_a_flagged_write_crcs` pins the equivalence).
        let f = FLAG_PCRC | FLAG_TAIL | if dcrc.is_some() { FLAG_DCRC } else { 0 };
        header(&mut self.bytes, etype::WRITE, f, WRITE_LEN + 4);
        let b: &mut [u8; TAIL_WRITE_LEN] =
            (&mut self.bytes[..]).try_into().expect("header sized the entry");
        b[HDR..HDR + 8].copy_from_slice(&pg.to_le_bytes());
        b[HDR + 8..HDR + 16].copy_from_slice(&block.to_le_bytes());
        b[HDR + 16..HDR + 20].copy_from_slice(&1u32.to_le_bytes());
        b[HDR + 20..HDR + 24].copy_from_slice(&dcrc.unwrap_or(0).to_le_bytes());
        b[HDR + 24..HDR + 32].copy_from_slice(&size.to_le_bytes());
        b[HDR + 32..HDR + 40].copy_from_slice(&(mtime.sec as u64).to_le_bytes());
        b[HDR + 40..HDR + 44].copy_from_slice(&mtime.nsec.to_le_bytes());
        b[WRITE_LEN..WRITE_LEN + 4].copy_from_slice(&crc.to_le_bytes());
    }

    /// INLINE.
    pub fn inline(off: u64, size: u64, mtime: Ts, data: &[u8]) -> EntryBuf {
        let mut e = EntryBuf { bytes: EntryBytes::new() };
        e.set_inline(off, size, mtime, data);
        e
    }

    /// Make this entry an INLINE, in place: an embedded write's entry is mostly its
    /// data, and building it where it stays moves none of it.
    pub fn set_inline(&mut self, off: u64, size: u64, mtime: Ts, data: &[u8]) {
        Enc::at(&mut self.bytes, etype::INLINE, 0, INLINE_HDR + data.len())
            .u64(off)
            .u64(size)
            .ts(mtime)
            .u32(data.len() as u32)
            .u32(0)
            .bytes(data);
    }

    /// PUNCH.
    pub fn punch(off: u64, len: u64, mtime: Ts) -> EntryBuf {
        Enc::build(etype::PUNCH, 0, PUNCH_LEN, |e| {
            e.u64(off).u64(len).ts(mtime);
        })
    }

    /// SHIFT (collapse or insert range).
    pub fn shift(pg: u64, pages: u64, insert: bool, size: u64, mtime: Ts) -> EntryBuf {
        let f = if insert { FLAG_INSERT } else { 0 };
        Enc::build(etype::SHIFT, f, SHIFT_LEN, |e| {
            e.u64(pg).u64(pages).u64(size).ts(mtime);
        })
    }

    /// DENTRY.
    pub fn dentry(ino: u64, cookie: u64, time: Ts, ftype: u8, name: &[u8]) -> EntryBuf {
        let mut e = EntryBuf { bytes: EntryBytes::new() };
        e.set_dentry(ino, cookie, time, ftype, name);
        e
    }

    /// Make this entry a DENTRY, in place (see [`EntryBuf::push`]).
    pub fn set_dentry(&mut self, ino: u64, cookie: u64, time: Ts, ftype: u8, name: &[u8]) {
        assert!(name.len() <= crate::layout::NAME_MAX);
        Enc::at(&mut self.bytes, etype::DENTRY, 0, DENTRY_HDR + name.len())
            .u64(ino)
            .u64(cookie)
            .ts(time)
            .u8(ftype)
            .u8(name.len() as u8)
            .u16(0)
            .u32(0)
            .bytes(name);
    }

    /// A new, empty entry at the end of `v`, for a `set_*` to encode where it stays.
    /// An entry built elsewhere and pushed is copied twice on the way (it is
    /// 136 bytes); `profile_op metapath` spent about a tenth of its time in such
    /// copies before creates and unlinks built their entries in place.
    pub fn push<A: smallvec::Array<Item = EntryBuf>>(v: &mut smallvec::SmallVec<A>) -> &mut Self {
        v.push(EntryBuf { bytes: EntryBytes::new() });
        v.last_mut().expect("just pushed")
    }

    /// XATTR whose value lives in data blocks (see [`Spill`]).
    pub fn xattr_spilled(name: &[u8], value_len: u32, spill: &Spill, time: Ts) -> EntryBuf {
        assert!(name.len() <= 255 && spill.blocks.len() <= XATTR_SPILL_BLOCKS);
        let len = XATTR_HDR + name.len() + Spill::encoded_len(spill.blocks.len());
        Enc::build(etype::XATTR, 0, len, |e| {
            e.u8(name.len() as u8)
                .u8(XATTR_SPILLED)
                .u16(0)
                .u32(value_len)
                .ts(time)
                .bytes(name)
                .u32(spill.crc)
                .u32(spill.blocks.len() as u32);
            for &b in &spill.blocks {
                e.u64(b);
            }
        })
    }

    /// XATTR.
    pub fn xattr(remove: bool, name: &[u8], value: &[u8], time: Ts) -> EntryBuf {
        assert!(name.len() <= 255);
        Enc::build(etype::XATTR, 0, XATTR_HDR + name.len() + value.len(), |e| {
            e.u8(name.len() as u8)
                .u8(if remove { XATTR_REMOVE } else { XATTR_SET })
                .u16(0)
                .u32(value.len() as u32)
                .ts(time)
                .bytes(name)
                .bytes(value);
        })
    }

    fn end() -> EntryBuf {
        Enc::build(etype::END, 0, HDR, |_| {})
    }

    /// Entry length.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Never true (an entry has a header).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn seal(&mut self, seq: u64, txend: bool, seed: u32) {
        if txend {
            self.bytes[5] |= FLAG_TXEND;
        }
        self.bytes[8..16].copy_from_slice(&seq.to_le_bytes());
        let c = crate::pmem::crc32c_append(seed, &self.bytes[4..]);
        self.bytes[0..4].copy_from_slice(&c.to_le_bytes());
    }
}

/// CRC seed of an inode incarnation in a pool: the pool's uuid, the inode number
/// and its slot state, so entries of an earlier incarnation (or an earlier pool
/// formatted over the same file) never validate.
pub fn seed(uuid: &[u8; 16], ino: u64, state: u64) -> u32 {
    let mut b = [0u8; 32];
    b[..16].copy_from_slice(uuid);
    b[16..24].copy_from_slice(&ino.to_le_bytes());
    b[24..].copy_from_slice(&state.to_le_bytes());
    crate::pmem::crc32c_append(0, &b)
}

/// Checksum of one data page: its CRC32C, XORed with the log's seed. The kernel is
/// the persistence module's AVX-512 folding one where the CPU has it (also fused
/// into the copy of a copy-on-write page: `Medium::write_nt_crc`), else
/// `crc-fast`'s (carry-less multiply or SSE4.2 `crc32`, chosen once at first use).
pub fn page_crc(seed: u32, page: &[u8]) -> u32 {
    crate::pmem::crc32c_page(page) ^ seed
}

/// Which CRC32C kernel [`page_crc`] runs on this CPU (chosen once, at first use),
/// e.g. `x86_64-avx512-vpclmulqdq`.
pub fn page_crc_kernel() -> &'static str {
    static K: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    K.get_or_init(|| {
        if let Some(k) = crate::pmem::config().fused_page_crc {
            format!("x86_64 {k:?} VPCLMULQDQ folding, fused with the copy")
        } else {
            crc_fast::get_calculator_target(crc_fast::CrcAlgorithm::Crc32Iscsi)
        }
    })
}

/// Fold the next page's [`page_crc`] into an extent's data checksum (start from
/// the log's seed): the extent's checksum is a CRC32C over its pages' checksums, so
/// a writer computes each page's while it copies the page, and merges runs freely.
pub fn data_crc(acc: u32, page_crc: u32) -> u32 {
    crate::pmem::crc32c_append(acc, &page_crc.to_le_bytes())
}

/// Does the data of WRITE `e` on media match its checksum? (True for entries
/// without one.) Reads `npages` pages; the caller has bounds-checked the extent.
pub fn data_matches<M: Medium + ?Sized>(m: &M, seed: u32, e: &Entry) -> bool {
    let &Entry::Write { block, npages, dcrc: Some(want), .. } = e else { return true };
    let mut page = [0u8; BLOCK as usize];
    let mut acc = seed;
    let valid = tail_valid(e);
    for b in block..block + npages as u64 {
        m.read(b * BLOCK, &mut page);
        // An in-place append's page: what lies past the file's end is not its.
        page[valid..].fill(0);
        acc = data_crc(acc, page_crc(seed, &page));
    }
    acc == want
}

/// Bytes of the page of an in-place append ([`FLAG_TAIL`]) that are the page's
/// (the rest of its block is not); a whole page for any other entry.
pub fn tail_valid(e: &Entry) -> usize {
    match *e {
        Entry::Write { pgoff, size, tail: Some(_), .. } => {
            size.saturating_sub(pgoff.saturating_mul(BLOCK)).min(BLOCK) as usize
        }
        _ => BLOCK as usize,
    }
}

/// After a crash, clear what an in-place append that never committed left in the
/// block of the log's last operation, an in-place append ([`FLAG_TAIL`];
/// [`Walk::last_tail`]): the bytes past its size, which its page checksum takes as
/// zero, must read as zero again (scrub, and a file grown by truncate). No store
/// when they already are. The walk has bounds-checked the block.
pub fn clear_past_tail<M: Medium + ?Sized>(m: &M, (block, valid): (u64, u64)) {
    if valid >= BLOCK {
        return;
    }
    let mut rest = [0u8; BLOCK as usize];
    let rest = &mut rest[..(BLOCK - valid) as usize];
    m.read(block * BLOCK + valid, rest);
    if rest.iter().any(|&b| b != 0) {
        m.zero_nt(block * BLOCK + valid, BLOCK - valid);
        m.fence();
    }
}

/// The stored [`page_crc`] of data block `block`, mapped by the WRITE entry at
/// `loc`: `None` when the entry carries no page checksums (format v2, or a
/// fallocate of a version 2 build). The entry was validated when its log was
/// replayed; damage to it since makes this a corruption error or a mismatch,
/// never a panic.
pub fn write_page_crc<M: Medium + ?Sized>(m: &M, loc: u64, block: u64) -> Result<Option<u32>> {
    Ok(write_page_crcs_in(m, loc, block, 1)?.map(|c| c[0]))
}

/// The stored checksums of blocks `[block, block + n)` (1 to `PCRC_MAX_PAGES`)
/// mapped by the WRITE at `loc`, read with one read of the entry's header and one
/// of its checksum array; `None` when it carries none. The bounds of
/// [`write_page_crc`]: damage is an error, never a panic.
fn write_page_crcs_in<M: Medium + ?Sized>(
    m: &M,
    loc: u64,
    block: u64,
    n: u64,
) -> Result<Option<smallvec::SmallVec<[u32; 8]>>> {
    let bad = || Error::corrupt(format!("WRITE entry at {loc:#x} does not map block {block}"));
    let in_page = loc % BLOCK;
    let h = write_header(m, loc).ok_or_else(bad)?;
    if h[5] & FLAG_PCRC == 0 {
        return Ok(None);
    }
    let first = u64::from_le_bytes(h[HDR + 8..HDR + 16].try_into().expect("8"));
    let count = u32::from_le_bytes(h[HDR + 16..HDR + 20].try_into().expect("4"));
    let k = block.wrapping_sub(first);
    if count > PCRC_MAX_PAGES
        || n == 0
        || k >= count as u64
        || n > count as u64 - k
        || in_page + (WRITE_LEN + 4 * count as usize) as u64 > LOG_DATA_END
    {
        return Err(bad());
    }
    // A page's checksum (reads verify page by page) fills no more than it needs.
    let (mut small, mut big) = ([0u8; 32], Vec::new());
    let raw: &mut [u8] = if n <= 8 {
        &mut small[..4 * n as usize]
    } else {
        big.resize(4 * n as usize, 0);
        &mut big
    };
    m.read(loc + WRITE_LEN as u64 + 4 * k, raw);
    let crcs = raw.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
    Ok(Some(crcs))
}

/// The bytes that are the page's in the block of the in-place append
/// ([`FLAG_TAIL`]) at `loc`, as [`tail_valid`] gives them; `None` for any other
/// entry, or one that is not there (damage: the caller's check fails as it was).
pub fn tail_valid_at<M: Medium + ?Sized>(m: &M, loc: u64) -> Option<usize> {
    let h = write_header(m, loc).filter(|h| h[5] & FLAG_TAIL != 0)?;
    let pgoff = u64::from_le_bytes(h[HDR..HDR + 8].try_into().expect("8"));
    let size = u64::from_le_bytes(h[HDR + 24..HDR + 32].try_into().expect("8"));
    Some(size.saturating_sub(pgoff.saturating_mul(BLOCK)).min(BLOCK) as usize)
}

/// Does the WRITE entry at `loc` carry a checksum of its data (page checksums
/// or a whole-extent one)? A page mapped by one that does not is a DAX page (see
/// `mapping`): it may change in place. Damage to the entry is an error.
pub fn write_is_checked<M: Medium + ?Sized>(m: &M, loc: u64) -> Result<bool> {
    let h = write_header(m, loc)
        .ok_or_else(|| Error::corrupt(format!("no WRITE entry at {loc:#x}")))?;
    Ok(h[5] & (FLAG_PCRC | FLAG_DCRC) != 0)
}

/// The fixed part of the WRITE entry at `loc` (header and body), read once its
/// place is checked: `None` when no WRITE entry fits there or the bytes there are
/// not one (damage, for the callers' errors).
fn write_header<M: Medium + ?Sized>(m: &M, loc: u64) -> Option<[u8; WRITE_LEN]> {
    let in_page = loc % BLOCK;
    if in_page + WRITE_LEN as u64 > LOG_DATA_END || (loc - in_page).saturating_add(BLOCK) > m.len()
    {
        return None;
    }
    let mut h = [0u8; WRITE_LEN];
    m.read(loc, &mut h);
    (h[4] == etype::WRITE).then_some(h)
}

/// The stored checksums of blocks `[block, block + n)` mapped by the WRITE at
/// `loc` (see [`write_page_crc`]); `None` when it carries none.
pub fn write_page_crcs<M: Medium + ?Sized>(
    m: &M,
    loc: u64,
    block: u64,
    n: u64,
) -> Result<Option<Vec<u32>>> {
    if n == 0 {
        return Ok(Some(Vec::new()));
    }
    Ok(write_page_crcs_in(m, loc, block, n)?.map(|c| c.to_vec()))
}

/// The [`page_crc`] of an all-zero page (fallocate's blocks) under `seed`.
pub fn zero_page_crc(seed: u32) -> u32 {
    crate::pmem::ZERO_PAGE_CRC ^ seed
}

/// Decode a sealed entry buffer (as produced by [`append`]).
pub fn decode_entry(bytes: &[u8]) -> Result<Entry> {
    decode_body(bytes[4], bytes)
}

/// Decode the body of a checksum-valid entry. A malformed body is corruption.
fn decode_body(t: u8, b: &[u8]) -> Result<Entry> {
    let len = b.len();
    let bad = || Error::corrupt(format!("malformed log entry of type {t}"));
    let mut r = Reader::new(&b[HDR..]);
    let ts = |r: &mut Reader| {
        let sec = r.i64();
        let nsec = r.u32();
        r.u32();
        Ts { sec, nsec }
    };
    Ok(match t {
        etype::SETATTR if len == SETATTR_LEN => {
            let (mode, uid, gid, nlink) = (r.u32(), r.u32(), r.u32(), r.u32());
            let (size, parent) = (r.u64(), r.u64());
            let (a, m, c) = (r.i64(), r.i64(), r.i64());
            let (an, mn, cn) = (r.u32(), r.u32(), r.u32());
            let rdev = r.u32();
            Entry::SetAttr(
                AttrRec {
                    mode,
                    uid,
                    gid,
                    nlink,
                    size,
                    parent,
                    atime: Ts { sec: a, nsec: an },
                    mtime: Ts { sec: m, nsec: mn },
                    ctime: Ts { sec: c, nsec: cn },
                    rdev,
                },
                b[5] & FLAG_SHRINK != 0,
            )
        }
        etype::WRITE if len >= WRITE_LEN => {
            let pgoff = r.u64();
            let block = r.u64();
            let npages = r.u32();
            let crc = r.u32();
            let size = r.u64();
            let mtime = ts(&mut r);
            let pcrc = b[5] & FLAG_PCRC != 0;
            let tail = (b[5] & FLAG_TAIL != 0 && len > WRITE_LEN).then(|| r.u32());
            let want = if pcrc { pad8(WRITE_LEN + 4 * npages as usize) } else { WRITE_LEN };
            if npages == 0
                || (pcrc && npages > PCRC_MAX_PAGES)
                || len != want
                || (b[5] & FLAG_TAIL != 0 && (npages != 1 || !pcrc))
            {
                return Err(bad());
            }
            let dcrc = (b[5] & FLAG_DCRC != 0).then_some(crc);
            Entry::Write { pgoff, block, npages, size, mtime, dcrc, pcrc, tail }
        }
        etype::INLINE if len >= INLINE_HDR => {
            let off = r.u64();
            let size = r.u64();
            let mtime = ts(&mut r);
            let dlen = r.u32();
            if INLINE_HDR + dlen as usize > len || dlen == 0 || (off % BLOCK) + dlen as u64 > BLOCK
            {
                return Err(bad());
            }
            Entry::Inline { off, size, mtime, dlen, data_off: INLINE_HDR as u32 }
        }
        etype::PUNCH if len == PUNCH_LEN => {
            let off = r.u64();
            let plen = r.u64();
            let mtime = ts(&mut r);
            Entry::Punch { off, len: plen, mtime }
        }
        etype::SHIFT if len == SHIFT_LEN => {
            let pg = r.u64();
            let pages = r.u64();
            let size = r.u64();
            let mtime = ts(&mut r);
            let max_pg = crate::layout::MAX_FILE_SIZE / BLOCK + 1;
            if pages == 0 || pg.checked_add(pages).is_none_or(|e| e > max_pg) {
                return Err(bad());
            }
            Entry::Shift { pg, pages, insert: b[5] & FLAG_INSERT != 0, size, mtime }
        }
        etype::DENTRY if len >= DENTRY_HDR => {
            let ino = r.u64();
            let cookie = r.u64();
            let time = ts(&mut r);
            let ftype = r.u8();
            let nl = r.u8() as usize;
            // Cookies are handed out from 3 upward, one per added entry: one past
            // 2^62 can only come from damage (and would overflow the next cookie).
            if DENTRY_HDR + nl > len || nl == 0 || (ino != 0 && !(3..1 << 62).contains(&cookie)) {
                return Err(bad());
            }
            let name = Name::from_slice(&b[DENTRY_HDR..DENTRY_HDR + nl]);
            Entry::Dentry { ino, cookie, time, ftype, name }
        }
        etype::XATTR if len >= XATTR_HDR => {
            let nl = r.u8() as usize;
            let kind = r.u8();
            r.u16();
            let vl = r.u32();
            let time = ts(&mut r);
            let at = XATTR_HDR + nl;
            let spill = if kind == XATTR_SPILLED {
                // A spilled value is larger than an entry holds and fills its blocks.
                let word = |o: usize| {
                    b.get(o..o + 4).map(|w| u32::from_le_bytes(w.try_into().expect("4")))
                };
                let (Some(crc), Some(n)) = (word(at), word(at + 4)) else { return Err(bad()) };
                let n = n as usize;
                let fits =
                    (vl as usize).div_ceil(BLOCK as usize) == n && vl as usize <= XATTR_SIZE_MAX;
                if !fits || at + Spill::encoded_len(n) > len || vl == 0 {
                    return Err(bad());
                }
                let blocks = (0..n)
                    .map(|k| {
                        let o = at + 8 + 8 * k;
                        u64::from_le_bytes(b[o..o + 8].try_into().expect("8"))
                    })
                    .collect();
                Some(Spill { crc, blocks })
            } else if kind > XATTR_SPILLED || at + vl as usize > len {
                return Err(bad());
            } else {
                None
            };
            if nl == 0 {
                return Err(bad());
            }
            let name = b[XATTR_HDR..at].to_vec();
            let remove = kind == XATTR_REMOVE;
            Entry::Xattr { remove, name, value_len: vl, value_off: at as u32, spill, time }
        }
        etype::END if len == HDR => Entry::End,
        _ => return Err(bad()),
    })
}

/// Outcome of parsing the bytes at one log position.
enum Parsed {
    Valid { entry: Entry, len: u64, seq: u64, txend: bool },
    Invalid,
}

/// What sequence number the next entry must carry.
#[derive(Clone, Copy)]
enum SeqRule {
    /// First entry of the log: any.
    Any,
    /// Inside a page: exactly this.
    Exact(u64),
    /// First entry after a page link: above this (fast GC may have unlinked pages).
    Above(u64),
}

fn parse_at<M: Medium + ?Sized>(m: &M, pos: u64, seed: u32, rule: SeqRule) -> Result<Parsed> {
    let in_page = pos % BLOCK;
    if in_page + HDR as u64 > LOG_DATA_END {
        return Ok(Parsed::Invalid);
    }
    let mut hdr = [0u8; HDR];
    m.read(pos, &mut hdr);
    let len = u16::from_le_bytes([hdr[6], hdr[7]]) as u64;
    if len < HDR as u64 || !len.is_multiple_of(8) || in_page + len > LOG_DATA_END {
        return Ok(Parsed::Invalid);
    }
    let mut buf = vec![0u8; len as usize];
    m.read(pos, &mut buf);
    let crc = u32::from_le_bytes(buf[0..4].try_into().expect("4"));
    if crate::pmem::crc32c_append(seed, &buf[4..]) != crc {
        return Ok(Parsed::Invalid);
    }
    let seq = u64::from_le_bytes(buf[8..16].try_into().expect("8"));
    let ok = match rule {
        SeqRule::Any => true,
        SeqRule::Exact(e) => seq == e,
        SeqRule::Above(e) => seq > e,
    };
    if !ok {
        return Ok(Parsed::Invalid);
    }
    let entry = decode_body(buf[4], &buf)?;
    Ok(Parsed::Valid { entry, len, seq, txend: buf[5] & FLAG_TXEND != 0 })
}

/// Read the `[data_off, data_off + len)` payload of the entry at `loc`.
pub fn read_payload<M: Medium + ?Sized>(m: &M, loc: u64, data_off: u32, dst: &mut [u8]) {
    m.read(loc + data_off as u64, dst);
}

/// The value of an extended attribute, from its entry or its data blocks (whose
/// checksum is verified: a damaged value is an error, never returned).
pub fn read_xattr<M: Medium + ?Sized>(
    m: &M,
    seed: u32,
    r: &crate::index::XattrRef,
) -> Result<Vec<u8>> {
    let mut v = vec![0u8; r.value_len as usize];
    let Some(sp) = &r.spill else {
        read_payload(m, r.loc, r.value_off, &mut v);
        return Ok(v);
    };
    for (chunk, &b) in v.chunks_mut(BLOCK as usize).zip(&sp.blocks) {
        m.read(b * BLOCK, chunk);
    }
    if crate::pmem::crc32c_append(seed, &v) != sp.crc {
        return Err(Error::corrupt(format!(
            "extended attribute value in blocks {:?} does not match its checksum",
            sp.blocks
        )));
    }
    Ok(v)
}

/// Flags of the entry at `loc` (for GC: is it a pinned SETATTR?).
pub fn entry_flags<M: Medium + ?Sized>(m: &M, loc: u64) -> u8 {
    let mut b = [0u8; 8];
    m.read(loc, &mut b);
    b[5]
}

/// A walked log.
#[derive(Debug, Default)]
pub struct Walk {
    /// Valid committed entries with their byte addresses, oldest first (empty
    /// after [`walk_apply`], which hands them out instead).
    pub entries: Vec<(u64, Entry)>,
    /// Committed entries walked.
    pub committed: usize,
    /// Log pages in chain order (up to the page holding the end).
    pub pages: Vec<u64>,
    /// Address just after the last committed entry (the true tail).
    pub end: u64,
    /// Sequence number for the next entry.
    pub next_seq: u64,
    /// The stored tail pointed past `end` (the last operation was torn).
    pub torn: bool,
    /// Bytes between `end` and the stored tail that were discarded.
    pub discarded_entries: usize,
    /// The block and valid bytes ([`tail_valid`]) of the in-place append
    /// ([`FLAG_TAIL`]) in the last operation kept, if it is one: after a crash, or
    /// the death of the client that wrote last, its block may hold a later,
    /// uncommitted append's bytes past them ([`clear_past_tail`]).
    pub last_tail: Option<(u64, u64)>,
}

/// The in-place append among one operation's entries, as [`Walk::last_tail`].
fn tail_of(op: &[(u64, Entry)]) -> Option<(u64, u64)> {
    op.iter().rev().find_map(|(_, e)| match e {
        &Entry::Write { block, tail: Some(_), .. } => Some((block, tail_valid(e) as u64)),
        _ => None,
    })
}

/// Walk a log from `head` to `tail` (byte addresses), validating every entry;
/// the committed entries are collected in [`Walk::entries`].
pub fn walk<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    seed: u32,
    head: u64,
    tail: u64,
) -> Result<Walk> {
    let mut entries = Vec::new();
    let mut w = walk_apply(m, geo, seed, head, tail, &mut |loc, e| entries.push((loc, e)))?;
    w.entries = entries;
    Ok(w)
}

/// Walk a log as [`walk`] does, handing each committed entry to `f` in log order
/// once the next operation's TXEND is seen (the last operation's at the end): memory
/// stays bounded by the two largest operations, not the log (a file written page by
/// page has one entry per page).
/// On an error some entries may have been handed out already.
pub fn walk_apply<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    seed: u32,
    head: u64,
    tail: u64,
    f: &mut dyn FnMut(u64, Entry),
) -> Result<Walk> {
    walk_apply_checking(m, geo, seed, head, tail, false, f)
}

/// [`walk_apply`]; with `check_data` (recovery after a crash), the data of the log's
/// last operation is checked against the checksums its WRITE entries carry (its
/// commit had a single fence, so data may not have reached media with the entries
/// and the tail), and on a mismatch the operation is cut off like a torn one.
pub fn walk_apply_checking<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    seed: u32,
    head: u64,
    tail: u64,
    check_data: bool,
    f: &mut dyn FnMut(u64, Entry),
) -> Result<Walk> {
    if !geo.is_data_block_addr(head) {
        return Err(Error::corrupt(format!("log head {head:#x} is not a data block")));
    }
    walk_span(m, geo, seed, head, SeqRule::Any, tail, check_data, f)
}

/// Walk the entries committed after `from` (a committed tail whose next entry has
/// sequence number `next_seq`) up to `tail`: how a party catches its DRAM index up
/// with entries another party appended. `Walk::pages` starts with `from`'s page.
pub fn walk_apply_from<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    seed: u32,
    from: u64,
    next_seq: u64,
    tail: u64,
    f: &mut dyn FnMut(u64, Entry),
) -> Result<Walk> {
    let page = from & !(BLOCK - 1);
    if !geo.is_data_block_addr(page) || !from.is_multiple_of(8) || from % BLOCK > LOG_DATA_END {
        return Err(Error::corrupt(format!("log position {from:#x} is not inside a log page")));
    }
    walk_span(m, geo, seed, from, SeqRule::Exact(next_seq), tail, false, f)
}

#[allow(clippy::too_many_arguments)]
fn walk_span<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    seed: u32,
    head: u64,
    first_rule: SeqRule,
    tail: u64,
    verify_last: bool,
    f: &mut dyn FnMut(u64, Entry),
) -> Result<Walk> {
    let tail_page = tail & !(BLOCK - 1);
    if !geo.is_data_block_addr(tail_page) || !tail.is_multiple_of(8) || tail % BLOCK > LOG_DATA_END
    {
        return Err(Error::corrupt(format!("log tail {tail:#x} is not inside a log page")));
    }
    let max_pages = geo.nblocks as usize;
    let mut w = Walk::default();
    let mut visited: HashSet<u64> = HashSet::default();
    visited.insert(head & !(BLOCK - 1));
    w.pages.push(head & !(BLOCK - 1));
    let mut pos = head;
    let mut rule = first_rule;
    let mut pending: Vec<(u64, Entry)> = Vec::new();
    // The last committed operation, handed out once another commits after it or,
    // at the end, once its data checked out (`verify_last`).
    let mut held: Vec<(u64, Entry)> = Vec::new();
    // (pos, pages, next seq) of the last commit point; a resumed walk starts at one.
    let mut last_commit: Option<(u64, usize, u64)> = match first_rule {
        SeqRule::Exact(n) => Some((head, 1, n)),
        _ => None,
    };
    // The commit point before `held`.
    let mut prev_commit = last_commit;
    // The in-place append of the operation before the last one (`Walk::last_tail`).
    let mut prev_tail: Option<(u64, u64)> = None;
    // Fast GC unlinked pages right before the entries in `pending`; `held` may be
    // cut on a data mismatch (it does not follow such a gap).
    let mut gap_in_pending = false;
    let mut held_cuttable = true;
    loop {
        if pos == tail {
            break;
        }
        match parse_at(m, pos, seed, rule)? {
            Parsed::Invalid => {
                w.torn = true;
                break;
            }
            Parsed::Valid { entry, len, seq: s, txend } => {
                if matches!(rule, SeqRule::Above(e) if s != e + 1) {
                    // Fast GC unlinked the pages between the link and this entry. The
                    // entries still pending belong to an operation whose TXEND was on
                    // one of them: it committed, and its entries are all dead (fast GC
                    // unlinks a page only once an operation that killed everything on
                    // it is durable). They are handed out as before, but they are not
                    // part of the operation that follows, whose data is checked.
                    w.committed += pending.len();
                    for (loc, e) in held.drain(..).chain(pending.drain(..)) {
                        f(loc, e);
                    }
                    // (GC ends an in-place append run: nothing follows it.)
                    prev_tail = None;
                    gap_in_pending = true;
                }
                rule = SeqRule::Exact(s + 1);
                if let Entry::Xattr { spill: Some(sp), .. } = &entry {
                    if let Some(&b) = sp.blocks.iter().find(|&&b| !geo.is_data_block(b)) {
                        return Err(Error::corrupt(format!(
                            "log entry at {pos:#x} names xattr block {b} outside the data area"
                        )));
                    }
                }
                if let Entry::Write { block, npages, pgoff, .. } = entry {
                    let last = block.checked_add(npages as u64);
                    let max_pg = crate::layout::MAX_FILE_SIZE / BLOCK + 1;
                    if !geo.is_data_block(block)
                        || last.is_none_or(|l| l > geo.nblocks)
                        || pgoff.checked_add(npages as u64).is_none_or(|e| e > max_pg)
                    {
                        return Err(Error::corrupt(format!(
                            "log entry at {pos:#x} names blocks {block}+{npages} outside the data area"
                        )));
                    }
                }
                if entry == Entry::End {
                    rule = SeqRule::Above(s);
                    let mut nb = [0u8; 8];
                    m.read((pos & !(BLOCK - 1)) + LOG_DATA_END, &mut nb);
                    let next = u64::from_le_bytes(nb);
                    if !geo.is_data_block_addr(next) {
                        w.torn = true;
                        break;
                    }
                    if !visited.insert(next) {
                        return Err(Error::corrupt(format!("log cycle at page {next:#x}")));
                    }
                    if visited.len() > max_pages {
                        return Err(Error::corrupt("log longer than the pool"));
                    }
                    w.pages.push(next);
                    pos = next;
                } else {
                    pending.push((pos, entry));
                    pos += len;
                }
                if txend {
                    w.committed += pending.len();
                    if verify_last {
                        prev_tail = tail_of(&held);
                    }
                    for (loc, e) in held.drain(..) {
                        f(loc, e);
                    }
                    std::mem::swap(&mut held, &mut pending);
                    // The first operation after a gap killed what GC unlinked and was
                    // durable before GC ran: never cut (the commit before it is gone).
                    held_cuttable = !gap_in_pending;
                    gap_in_pending = false;
                    prev_commit = last_commit;
                    last_commit = Some((pos, w.pages.len(), s + 1));
                }
            }
        }
    }
    if w.torn {
        w.discarded_entries = pending.len();
    } else if !pending.is_empty() {
        // The stored tail is not at a commit boundary: torn as well.
        w.torn = true;
        w.discarded_entries = pending.len();
    }
    if verify_last && held_cuttable && !held.iter().all(|(_, e)| data_matches(m, seed, e)) {
        // Data of the last operation did not all reach media: it never returned.
        w.torn = true;
        w.discarded_entries += held.len();
        w.committed -= held.len();
        held.clear();
        last_commit = prev_commit;
        w.last_tail = prev_tail;
    } else {
        w.last_tail = tail_of(&held);
    }
    for (loc, e) in held.drain(..) {
        f(loc, e);
    }
    match last_commit {
        Some((p, npages, next)) => {
            w.end = p;
            w.pages.truncate(npages);
            w.next_seq = next;
        }
        None => return Err(Error::corrupt("log holds no committed entry")),
    }
    Ok(w)
}

/// Log state kept in DRAM for an inode.
#[derive(Clone, Debug, Default)]
pub struct LogState {
    /// Head pointer value (with epoch).
    pub head: u64,
    /// Tail pointer value (with epoch).
    pub tail: u64,
    /// Next entry sequence number.
    pub next_seq: u64,
    /// Pages in chain order.
    pub pages: crate::chain::LogPages,
}

/// Entries appended beyond the tail, not yet committed.
#[derive(Debug, Default)]
pub struct Appended {
    /// New tail pointer value.
    pub new_tail: u64,
    /// Next sequence number after these entries.
    pub next_seq: u64,
    /// Log pages allocated for them.
    pub new_pages: Pages,
    /// Address of each appended entry (same order as given).
    pub locs: smallvec::SmallVec<[u64; 4]>,
}

/// Write `entries` after the tail of `st` (flushed, not fenced; the tail is not
/// moved). The last entry gets `FLAG_TXEND`. `alloc_page` supplies zero-or-more new
/// log pages; on error the caller frees `Appended::new_pages` it never saw, so this
/// function frees nothing itself and returns the pages it took through `taken`.
pub fn append<M: Medium + ?Sized>(
    m: &M,
    st: &LogState,
    seed: u32,
    entries: &mut [EntryBuf],
    alloc_page: &mut dyn FnMut() -> Result<u64>,
    taken: &mut Pages,
) -> Result<Appended> {
    use crate::layout::logptr;
    let epoch = logptr::epoch(st.tail);
    let mut pos = logptr::addr(st.tail);
    let mut seq = st.next_seq;
    let mut locs = smallvec::SmallVec::with_capacity(entries.len());
    let n = entries.len();
    for (i, e) in entries.iter_mut().enumerate() {
        let len = e.len() as u64;
        debug_assert!(len as usize <= MAX_ENTRY);
        if pos % BLOCK + len > LOG_DATA_END - END_RESERVE {
            let page = alloc_page()?;
            taken.push(page);
            // New page: its next pointer starts null.
            crate::pmem::persist_u64(m, page + LOG_DATA_END, 0);
            let mut end = EntryBuf::end();
            end.seal(seq, false, seed);
            seq += 1;
            persist_copy(m, pos, &end.bytes);
            crate::pmem::persist_u64(m, (pos & !(BLOCK - 1)) + LOG_DATA_END, page);
            pos = page;
        }
        e.seal(seq, i + 1 == n, seed);
        seq += 1;
        persist_copy(m, pos, &e.bytes);
        locs.push(pos);
        pos += len;
    }
    Ok(Appended {
        new_tail: logptr::make(epoch, pos),
        next_seq: seq,
        new_pages: taken.clone(),
        locs,
    })
}

/// Do `entries` fit after the tail of `st` in its current page (no new page, so
/// [`append_in_page`] can take them)?
pub fn fits_in_page(st: &LogState, entries: &[EntryBuf]) -> bool {
    fits_in_page_len(st, entries.iter().map(|e| e.len()).sum())
}

/// Do `len` bytes of entries fit after the tail of `st` in its current page?
pub fn fits_in_page_len(st: &LogState, len: usize) -> bool {
    let pos = crate::layout::logptr::addr(st.tail);
    pos % BLOCK + len as u64 <= LOG_DATA_END - END_RESERVE
}

/// [`append`] of entries that [`fits_in_page`], with no flush. With `nt`, by
/// non-temporal stores (entries are 8-byte aligned, so wholly non-temporal),
/// persistent after the caller's next fence: for a caller that fences before a
/// locked instruction (an unlock would wait for them to drain). Without it, by
/// cached stores: the caller flushes `[tail, new tail)` (one range) before its
/// fence, and can issue the flushes after it lets the inode's lock go.
pub fn append_in_page<M: Medium + ?Sized>(
    m: &M,
    st: &LogState,
    seed: u32,
    entries: &mut [EntryBuf],
    nt: bool,
) -> Appended {
    use crate::layout::logptr;
    debug_assert!(fits_in_page(st, entries), "append_in_page needs room in the page");
    let mut pos = logptr::addr(st.tail);
    let mut seq = st.next_seq;
    let mut locs = smallvec::SmallVec::with_capacity(entries.len());
    let n = entries.len();
    for (i, e) in entries.iter_mut().enumerate() {
        e.seal(seq, i + 1 == n, seed);
        seq += 1;
        if nt {
            m.write_nt(pos, &e.bytes);
        } else {
            m.write(pos, &e.bytes);
        }
        locs.push(pos);
        pos += e.len() as u64;
    }
    Appended {
        new_tail: logptr::make(logptr::epoch(st.tail), pos),
        next_seq: seq,
        new_pages: Pages::new(),
        locs,
    }
}

/// Start a fresh log in `page` holding `entries` (for a new inode or thorough GC).
/// Returns the pages used (first = head) and the appended result.
#[allow(clippy::too_many_arguments)]
pub fn write_fresh<M: Medium + ?Sized>(
    m: &M,
    epoch: u16,
    first_seq: u64,
    page: u64,
    seed: u32,
    entries: &mut [EntryBuf],
    alloc_page: &mut dyn FnMut() -> Result<u64>,
    taken: &mut Pages,
) -> Result<Appended> {
    use crate::layout::logptr;
    crate::pmem::persist_u64(m, page + LOG_DATA_END, 0);
    let st = LogState {
        head: logptr::make(epoch, page),
        tail: logptr::make(epoch, page),
        next_seq: first_seq,
        pages: Default::default(), // `append` reads only the tail and sequence
    };
    append(m, &st, seed, entries, alloc_page, taken)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimMedium;

    fn geo() -> Geometry {
        Geometry::compute(256, 2, 64).unwrap()
    }

    #[test]
    fn set_tail_write_is_a_flagged_write_crcs() {
        let t = Ts { sec: 1_700_000_123, nsec: 456_789 };
        for dcrc in [None, Some(0xdead_beef)] {
            let mut fast = EntryBuf { bytes: EntryBytes::new() };
            fast.set_tail_write(7, 1234, 7 * BLOCK + 100, t, dcrc, 0x1234_5678);
            let mut slow = EntryBuf { bytes: EntryBytes::new() };
            slow.set_write_crcs(7, 1234, 7 * BLOCK + 100, t, dcrc, &[0x1234_5678]);
            slow.bytes[5] |= FLAG_TAIL;
            assert_eq!(fast.bytes.as_slice(), slow.bytes.as_slice());
            assert_eq!(fast.len(), TAIL_WRITE_LEN);
        }
    }

    #[test]
    fn append_walk_roundtrip_across_pages() {
        let g = geo();
        let m = SimMedium::new(256 * BLOCK);
        let first = g.data_start * BLOCK;
        let mut next = g.data_start + 1;
        let mut alloc = || {
            next += 1;
            Ok((next - 1) * BLOCK)
        };
        let s = seed(&[0; 16], 5, 1);
        let mut taken = Pages::new();
        let mut es: Vec<EntryBuf> = (0..200)
            .map(|i| EntryBuf::dentry(i + 10, i + 3, Ts::default(), 1, format!("f{i}").as_bytes()))
            .collect();
        let a = write_fresh(&m, 0, 1, first, s, &mut es, &mut alloc, &mut taken).unwrap();
        assert!(!a.new_pages.is_empty());
        let w = walk(&m, &g, s, first, crate::layout::logptr::addr(a.new_tail)).unwrap();
        assert!(!w.torn);
        assert_eq!(w.entries.len(), 200);
        assert_eq!(w.pages.len(), 1 + a.new_pages.len());
        // Wrong seed: nothing validates.
        assert!(walk(&m, &g, seed(&[0; 16], 5, 3), first, a.new_tail).is_err());
    }

    #[test]
    fn last_operation_with_torn_data_is_cut_by_recovery_only() {
        let g = geo();
        let m = SimMedium::new(256 * BLOCK);
        let first = g.data_start * BLOCK;
        let s = seed(&[0; 16], 9, 1);
        let (b0, b1) = (g.data_start + 10, g.data_start + 11);
        let page = |v: u8| vec![v; BLOCK as usize];
        let crc_of =
            |pages: &[Vec<u8>]| pages.iter().fold(s, |acc, p| data_crc(acc, page_crc(s, p)));
        m.write(b0 * BLOCK, &page(1));
        m.write(b1 * BLOCK, &page(2));
        let mut none = || Err(Error::NoSpace);
        let mut es = [
            EntryBuf::write(0, b0, 1, BLOCK, Ts::default(), Some(crc_of(&[page(1)]))),
            EntryBuf::write(1, b1, 1, 2 * BLOCK, Ts::default(), Some(crc_of(&[page(2)]))),
        ];
        let a =
            write_fresh(&m, 0, 1, first, s, &mut es[..1], &mut none, &mut Pages::new()).unwrap();
        let st = LogState { tail: a.new_tail, next_seq: a.next_seq, ..Default::default() };
        let b = append(&m, &st, s, &mut es[1..], &mut none, &mut Pages::new()).unwrap();
        let tail = crate::layout::logptr::addr(b.new_tail);
        // Both operations' data is on media: everything is kept.
        let w = walk_apply_checking(&m, &g, s, first, tail, true, &mut |_, _| {}).unwrap();
        assert!(!w.torn);
        assert_eq!((w.committed, w.end), (2, tail));
        // The second write's data did not reach media (one cache line differs).
        m.write(b1 * BLOCK + 64, &[0u8; 64]);
        let mut seen = vec![];
        let w =
            walk_apply_checking(&m, &g, s, first, tail, true, &mut |_, e| seen.push(e)).unwrap();
        assert!(w.torn);
        assert_eq!((w.committed, w.discarded_entries), (1, 1));
        assert_eq!(w.end, a.new_tail);
        assert_eq!(w.next_seq, a.next_seq);
        assert!(matches!(seen[..], [Entry::Write { pgoff: 0, dcrc: Some(_), .. }]));
        // A live walk (no crash happened) does not read data.
        let w = walk_apply(&m, &g, s, first, tail, &mut |_, _| {}).unwrap();
        assert!(!w.torn && w.committed == 2);
        // Damage in an operation that is not the last one is not a torn commit.
        m.write(b1 * BLOCK + 64, &page(2)[..64]);
        m.write(b0 * BLOCK, &[9u8; 8]);
        let w = walk_apply_checking(&m, &g, s, first, tail, true, &mut |_, _| {}).unwrap();
        assert!(!w.torn && w.committed == 2);
    }

    /// Regression: `threads_on_a_pool_file_in_dev_shm` failed about one run in
    /// fifteen with "log page ... is owned twice" after this stop's data checks went
    /// in. Fast GC had unlinked the pages after an operation's first entry (its TXEND
    /// was on an unlinked page); the walk glued that dead entry to the next operation,
    /// the last one, checked its long-reused blocks and cut a durable operation.
    #[test]
    fn entries_before_a_gc_gap_are_not_checked_with_the_last_operation() {
        let g = geo();
        let m = SimMedium::new(256 * BLOCK);
        let s = seed(&[0; 16], 9, 1);
        let (a, c) = (g.data_start * BLOCK, (g.data_start + 2) * BLOCK);
        let (reused, live) = (g.data_start + 10, g.data_start + 11);
        m.write(live * BLOCK, &[5u8; BLOCK as usize]);
        let good = data_crc(s, page_crc(s, &[5u8; BLOCK as usize]));
        let put = |pos: u64, mut e: EntryBuf, seq: u64, txend: bool| {
            e.seal(seq, txend, s);
            persist_copy(&m, pos, &e.bytes);
            pos + e.len() as u64
        };
        let attr = AttrRec { mode: 0o100644, nlink: 1, ..Default::default() };
        let mut pos = put(a, EntryBuf::setattr(&attr, false), 1, true);
        // The first entry of an operation whose TXEND was on the unlinked page; its
        // block went to someone else since (the checksum no longer matches).
        pos = put(pos, EntryBuf::write(0, reused, 1, BLOCK, Ts::default(), Some(1)), 2, false);
        put(pos, EntryBuf::end(), 3, false);
        crate::pmem::persist_u64(&m, a + LOG_DATA_END, c); // page a -> c: b was unlinked
        crate::pmem::persist_u64(&m, c + LOG_DATA_END, 0);
        let tail = put(c, EntryBuf::write(0, live, 1, BLOCK, Ts::default(), Some(good)), 90, true);
        let mut seen = 0;
        let w = walk_apply_checking(&m, &g, s, a, tail, true, &mut |_, _| seen += 1).unwrap();
        assert!(!w.torn, "a durable operation after a GC gap was cut");
        assert_eq!((w.end, w.committed, seen), (tail, 3, 3));
        // Damage in that operation's own data is not a torn commit either (the
        // commit before it is gone): it is kept.
        m.write(live * BLOCK, &[6u8; 64]);
        let w = walk_apply_checking(&m, &g, s, a, tail, true, &mut |_, _| {}).unwrap();
        assert!(!w.torn && w.end == tail);
    }

    #[test]
    fn torn_tail_cut_back_to_commit() {
        let g = geo();
        let m = SimMedium::new(256 * BLOCK);
        let first = g.data_start * BLOCK;
        let s = seed(&[0; 16], 9, 1);
        let mut none = || Err(Error::NoSpace);
        let mut es = vec![EntryBuf::punch(0, 1, Ts::default())];
        let a = write_fresh(&m, 0, 1, first, s, &mut es, &mut none, &mut Pages::new()).unwrap();
        // Claim a tail 64 bytes further than anything written.
        let w = walk(&m, &g, s, first, a.new_tail + 64).unwrap();
        assert!(w.torn);
        assert_eq!(w.end, a.new_tail);
        assert_eq!(w.entries.len(), 1);
    }
}
