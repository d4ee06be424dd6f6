//! On-media layout: superblock, geometry, inode slots and log-pointer encoding.
//! docs/FORMAT.md describes every byte defined here.
//!
//! Invariants:
//! - All multi-byte fields are little-endian and fixed width; structures are
//!   `#[repr(C)]` with explicit padding and a compile-time size assertion.
//! - The superblock is immutable after mkfs (two copies, blocks 0 and 1, each with a
//!   CRC32C). The only mutable word of block 0 is the mount-state word at
//!   [`MOUNT_STATE_OFF`], written with one 8-byte atomic store.
//! - Every region boundary is a whole number of 4 KiB blocks.

use crate::error::{Error, Result};

/// Block (and log page) size.
pub const BLOCK: u64 = 4096;
/// Format magic.
pub const MAGIC: [u8; 8] = *b"FERRITE1";
/// Format version described by docs/FORMAT.md.
pub const VERSION: u32 = 7;
/// Feature bit (version 5): the journals, the inode table and the checkpoint have a
/// second copy ([`Geometry::replicas`]). Set by mkfs; pools upgraded from version 4
/// or older do not have it.
pub const FEATURE_REPLICAS: u64 = 1;
/// Every feature bit this build knows.
pub const KNOWN_FEATURES: u64 = FEATURE_REPLICAS;
/// Size of one inode slot.
pub const INODE_SLOT: u64 = 64;
/// Bytes of journal per shard.
pub const JOURNAL_SIZE: u64 = 512;
/// Offset of the mutable mount-state word inside block 0.
pub const MOUNT_STATE_OFF: u64 = 2048;
/// Mount-state bit: the pool was cleanly unmounted and its checkpoint is valid.
pub const STATE_CLEAN: u64 = 1;
/// Root directory inode number.
pub const ROOT_INO: u64 = 1;
/// Longest file name.
pub const NAME_MAX: usize = 255;
/// Largest file size (as tmpfs: 2^63 - 1).
pub const MAX_FILE_SIZE: u64 = i64::MAX as u64;
/// Largest pool: log pointers hold 48-bit addresses.
pub const MAX_BLOCKS: u64 = (1 << 48) / BLOCK;
/// Smallest pool mkfs accepts.
pub const MIN_POOL: u64 = 256 * 1024;

/// The superblock as stored (256 bytes, then 0-padding to the block end).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// `FERRITE1`
    pub magic: [u8; 8],
    /// Format version.
    pub version: u32,
    /// Block size (4096).
    pub block_size: u32,
    /// Pool identity.
    pub uuid: [u8; 16],
    /// Pool size in bytes at mkfs.
    pub pool_size: u64,
    /// Number of 4 KiB blocks.
    pub nblocks: u64,
    /// Number of shards (per-CPU inode tables, journals, free lists).
    pub nshards: u32,
    /// Inode slot size (64).
    pub inode_size: u32,
    /// Inode slots in all shards.
    pub ninodes: u64,
    /// First journal block.
    pub journal_start: u64,
    /// Journal blocks.
    pub journal_blocks: u64,
    /// First inode-table block.
    pub itable_start: u64,
    /// Inode-table blocks.
    pub itable_blocks: u64,
    /// First checkpoint (recovery area) block.
    pub ckpt_start: u64,
    /// Checkpoint blocks.
    pub ckpt_blocks: u64,
    /// First log/data block.
    pub data_start: u64,
    /// Root inode number.
    pub root_ino: u64,
    /// mkfs time, ns since the epoch.
    pub mkfs_time_ns: u64,
    /// Feature bits (none defined in version 1).
    pub features: u64,
    /// Zero.
    pub reserved: [u8; 108],
    /// CRC32C of bytes 0..252.
    pub csum: u32,
}
const _: () = assert!(std::mem::size_of::<Superblock>() == 256);

/// Bytes of the encoded superblock.
pub const SB_SIZE: usize = 256;

struct Writer<'a> {
    b: &'a mut [u8],
    o: usize,
}
impl Writer<'_> {
    fn put(&mut self, v: &[u8]) {
        self.b[self.o..self.o + v.len()].copy_from_slice(v);
        self.o += v.len();
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes())
    }
}

/// Little-endian field reader over a byte slice; the caller checks the length.
pub(crate) struct Reader<'a> {
    b: &'a [u8],
    o: usize,
}
impl<'a> Reader<'a> {
    pub(crate) fn new(b: &'a [u8]) -> Self {
        Reader { b, o: 0 }
    }
    pub(crate) fn take(&mut self, n: usize) -> &'a [u8] {
        let s = &self.b[self.o..self.o + n];
        self.o += n;
        s
    }
    pub(crate) fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().expect("2"))
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4"))
    }
    pub(crate) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8"))
    }
    pub(crate) fn i64(&mut self) -> i64 {
        self.u64() as i64
    }
}

impl Superblock {
    /// Encode to 256 bytes, computing the checksum.
    pub fn encode(&self) -> [u8; SB_SIZE] {
        let mut b = [0u8; SB_SIZE];
        let mut w = Writer { b: &mut b, o: 0 };
        w.put(&self.magic);
        w.u32(self.version);
        w.u32(self.block_size);
        w.put(&self.uuid);
        for v in [self.pool_size, self.nblocks] {
            w.u64(v);
        }
        w.u32(self.nshards);
        w.u32(self.inode_size);
        for v in [
            self.ninodes,
            self.journal_start,
            self.journal_blocks,
            self.itable_start,
            self.itable_blocks,
            self.ckpt_start,
            self.ckpt_blocks,
            self.data_start,
            self.root_ino,
            self.mkfs_time_ns,
            self.features,
        ] {
            w.u64(v);
        }
        w.put(&self.reserved);
        debug_assert_eq!(w.o, 252);
        let c = crc32c::crc32c(&b[..252]);
        b[252..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decode and validate one copy.
    pub fn decode(b: &[u8]) -> Result<Superblock> {
        let sb = Self::decode_any_version(b)?;
        if sb.version != VERSION {
            return Err(Error::Version { found: sb.version, supported: VERSION });
        }
        Ok(sb)
    }

    /// Decode and validate one copy of any format version (for `upgrade`).
    pub fn decode_any_version(b: &[u8]) -> Result<Superblock> {
        if b.len() < SB_SIZE {
            return Err(Error::Foreign("superblock truncated".into()));
        }
        let mut r = Reader::new(&b[..SB_SIZE]);
        let magic: [u8; 8] = r.take(8).try_into().expect("8");
        if magic != MAGIC {
            return Err(Error::Foreign("bad magic (not formatted with ferrite mkfs?)".into()));
        }
        let version = r.u32();
        let block_size = r.u32();
        let uuid: [u8; 16] = r.take(16).try_into().expect("16");
        let pool_size = r.u64();
        let nblocks = r.u64();
        let nshards = r.u32();
        let inode_size = r.u32();
        let mut f = [0u64; 11];
        for v in f.iter_mut() {
            *v = r.u64();
        }
        let reserved: [u8; 108] = r.take(108).try_into().expect("108");
        let csum = r.u32();
        if crc32c::crc32c(&b[..252]) != csum {
            return Err(Error::corrupt("superblock checksum mismatch"));
        }
        let sb = Superblock {
            magic,
            version,
            block_size,
            uuid,
            pool_size,
            nblocks,
            nshards,
            inode_size,
            ninodes: f[0],
            journal_start: f[1],
            journal_blocks: f[2],
            itable_start: f[3],
            itable_blocks: f[4],
            ckpt_start: f[5],
            ckpt_blocks: f[6],
            data_start: f[7],
            root_ino: f[8],
            mkfs_time_ns: f[9],
            features: f[10],
            reserved,
            csum,
        };
        sb.validate()?;
        Ok(sb)
    }

    /// Check that the geometry is self-consistent (a checksum-valid superblock
    /// written by a buggy or hostile tool must not lead to out-of-bounds access).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::corrupt(format!("superblock geometry: {m}")));
        if self.block_size as u64 != BLOCK || self.inode_size as u64 != INODE_SLOT {
            return bad("block or inode size");
        }
        if self.nshards == 0 || self.nshards > 1024 {
            return bad("shard count");
        }
        if self.nblocks > MAX_BLOCKS
            || self.nblocks * BLOCK != self.pool_size
            || self.nblocks < MIN_POOL / BLOCK
        {
            return bad("pool size");
        }
        if self.ninodes == 0 || !self.ninodes.is_multiple_of(self.nshards as u64) {
            return bad("inode count");
        }
        if self.features & !KNOWN_FEATURES != 0 {
            return bad("unknown feature bits");
        }
        let g = Geometry::compute_with(
            self.nblocks,
            self.nshards,
            self.ninodes,
            self.features & FEATURE_REPLICAS != 0,
        )?;
        if g.journal_start != self.journal_start
            || g.itable_start != self.itable_start
            || g.ckpt_start != self.ckpt_start
            || g.data_start != self.data_start
            || g.journal_blocks != self.journal_blocks
            || g.itable_blocks != self.itable_blocks
            || g.ckpt_blocks != self.ckpt_blocks
            || self.root_ino != ROOT_INO
        {
            return bad("region layout");
        }
        Ok(())
    }

    /// The DRAM geometry of this superblock.
    pub fn geometry(&self) -> Geometry {
        let replicas = self.features & FEATURE_REPLICAS != 0;
        Geometry::compute_with(self.nblocks, self.nshards, self.ninodes, replicas)
            .expect("validated")
    }
}

/// Region layout derived from (nblocks, nshards, ninodes). DRAM only.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Geometry {
    /// Blocks in the pool.
    pub nblocks: u64,
    /// Shards.
    pub nshards: u32,
    /// Inode slots.
    pub ninodes: u64,
    /// First journal block.
    pub journal_start: u64,
    /// Journal blocks.
    pub journal_blocks: u64,
    /// First inode table block.
    pub itable_start: u64,
    /// Inode table blocks.
    pub itable_blocks: u64,
    /// First checkpoint block.
    pub ckpt_start: u64,
    /// Checkpoint blocks.
    pub ckpt_blocks: u64,
    /// First data block.
    pub data_start: u64,
    /// The metadata replicas exist ([`FEATURE_REPLICAS`]): a second journal per
    /// shard, a replica inode table and a second checkpoint, in that order between
    /// the checkpoint and the first data block, each as large as its primary.
    pub replicas: bool,
}

impl Geometry {
    /// Lay out the regions of a pool with metadata replicas (what mkfs makes).
    pub fn compute(nblocks: u64, nshards: u32, ninodes: u64) -> Result<Geometry> {
        Self::compute_with(nblocks, nshards, ninodes, true)
    }

    /// Lay out the regions, with or without the metadata replicas.
    pub fn compute_with(
        nblocks: u64,
        nshards: u32,
        ninodes: u64,
        replicas: bool,
    ) -> Result<Geometry> {
        // Bounds that keep every product below 2^64 and addresses below 2^48.
        if nblocks > MAX_BLOCKS || ninodes > nblocks * (BLOCK / INODE_SLOT) || nshards == 0 {
            return Err(Error::invalid(format!(
                "geometry out of range: {nblocks} blocks, {ninodes} inodes, {nshards} shards"
            )));
        }
        let journal_start = 2;
        let journal_blocks = (nshards as u64 * JOURNAL_SIZE).div_ceil(BLOCK);
        let itable_start = journal_start + journal_blocks;
        let itable_blocks = (ninodes * INODE_SLOT).div_ceil(BLOCK);
        let ckpt_start = itable_start + itable_blocks;
        // header block + block bitmap + inode bitmap
        let ckpt_blocks =
            1 + nblocks.div_ceil(8).div_ceil(BLOCK) + ninodes.div_ceil(8).div_ceil(BLOCK);
        let primaries_end = ckpt_start + ckpt_blocks;
        let data_start = if replicas {
            primaries_end + journal_blocks + itable_blocks + ckpt_blocks
        } else {
            primaries_end
        };
        if data_start + 16 > nblocks {
            return Err(Error::invalid(format!(
                "pool too small: metadata needs {data_start} blocks of {nblocks}"
            )));
        }
        Ok(Geometry {
            nblocks,
            nshards,
            ninodes,
            journal_start,
            journal_blocks,
            itable_start,
            itable_blocks,
            ckpt_start,
            ckpt_blocks,
            data_start,
            replicas,
        })
    }

    /// First block of the replica journals (the replica inode table and the
    /// second checkpoint follow), when the pool has replicas.
    fn replicas_start(&self) -> Option<u64> {
        self.replicas.then_some(self.ckpt_start + self.ckpt_blocks)
    }

    /// Byte offset of inode `ino`'s replica slot.
    pub fn slot_replica_off(&self, ino: u64) -> Option<u64> {
        debug_assert!(ino >= 1 && ino <= self.ninodes);
        let r = self.replicas_start()? + self.journal_blocks;
        Some(r * BLOCK + (ino - 1) * INODE_SLOT)
    }

    /// First block of the replica inode table.
    pub fn ritable_start(&self) -> Option<u64> {
        Some(self.replicas_start()? + self.journal_blocks)
    }

    /// Byte offsets of shard `s`'s journal copies: the primary, then the replica.
    pub fn journal_offs(&self, s: u32) -> [Option<u64>; 2] {
        let r = self.replicas_start().map(|r| r * BLOCK + s as u64 * JOURNAL_SIZE);
        [Some(self.journal_off(s)), r]
    }

    /// First block of each journal region: the primary, then the replica.
    pub fn journal_starts(&self) -> [Option<u64>; 2] {
        [Some(self.journal_start), self.replicas_start()]
    }

    /// First block of each checkpoint copy: the primary, then the second copy.
    pub fn ckpt_starts(&self) -> [Option<u64>; 2] {
        let r = self.replicas_start().map(|r| r + self.journal_blocks + self.itable_blocks);
        [Some(self.ckpt_start), r]
    }

    /// Inode number of the slot word at `off` (an address [`Self::is_slot_word`] accepts).
    pub fn slot_word_ino(&self, off: u64) -> u64 {
        debug_assert!(self.is_slot_word(off));
        (off - self.itable_start * BLOCK) / INODE_SLOT + 1
    }

    /// Byte offset of inode `ino`'s slot.
    pub fn slot_off(&self, ino: u64) -> u64 {
        debug_assert!(ino >= 1 && ino <= self.ninodes);
        self.itable_start * BLOCK + (ino - 1) * INODE_SLOT
    }

    /// Shard of an inode number.
    pub fn ino_shard(&self, ino: u64) -> u32 {
        ((ino - 1) % self.nshards as u64) as u32
    }

    /// Byte offset of shard `s`'s journal.
    pub fn journal_off(&self, s: u32) -> u64 {
        self.journal_start * BLOCK + s as u64 * JOURNAL_SIZE
    }

    /// Is `addr` the start of a block in the log/data area?
    pub fn is_data_block_addr(&self, addr: u64) -> bool {
        addr.is_multiple_of(BLOCK) && addr / BLOCK >= self.data_start && addr / BLOCK < self.nblocks
    }

    /// Is block number `b` in the data area?
    pub fn is_data_block(&self, b: u64) -> bool {
        b >= self.data_start && b < self.nblocks
    }

    /// Is `off` an aligned word inside the inode table?
    pub fn is_slot_word(&self, off: u64) -> bool {
        off.is_multiple_of(8)
            && off >= self.itable_start * BLOCK
            && off < (self.itable_start + self.itable_blocks) * BLOCK
    }

    /// Data blocks in shard `s`'s allocation range: [start, end).
    pub fn shard_range(&self, s: u32) -> (u64, u64) {
        let n = self.nblocks - self.data_start;
        let per = n / self.nshards as u64;
        let start = self.data_start + per * s as u64;
        let end = if s + 1 == self.nshards { self.nblocks } else { start + per };
        (start, end)
    }

    /// Shard owning data block `b`.
    pub fn block_shard(&self, b: u64) -> u32 {
        let n = self.nblocks - self.data_start;
        let per = (n / self.nshards as u64).max(1);
        (((b - self.data_start) / per) as u32).min(self.nshards - 1)
    }
}

// Inode slot word offsets (within the 64-byte slot).
/// State counter: odd while the inode is in use; bumped on create and on free.
pub const SLOT_STATE: u64 = 0;
/// Log head pointer (epoch << 48 | byte address of the first log page).
pub const SLOT_HEAD: u64 = 8;
/// Log tail pointer (epoch << 48 | byte address after the last committed entry).
pub const SLOT_TAIL: u64 = 16;
/// File type code (u32) and padding.
pub const SLOT_TYPE: u64 = 24;

/// The inode slot as stored.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InodeSlot {
    /// State counter (odd = in use).
    pub state: u64,
    /// Log head pointer.
    pub head: u64,
    /// Log tail pointer.
    pub tail: u64,
    /// File type code: 1 regular, 2 directory, 3 symlink.
    pub ftype: u32,
    /// Zero.
    pub pad: u32,
    /// Zero.
    pub reserved: [u64; 4],
}
const _: () = assert!(std::mem::size_of::<InodeSlot>() == INODE_SLOT as usize);

impl InodeSlot {
    /// Decode a slot from 64 bytes.
    pub fn decode(b: &[u8]) -> InodeSlot {
        let mut r = Reader::new(b);
        InodeSlot {
            state: r.u64(),
            head: r.u64(),
            tail: r.u64(),
            ftype: r.u32(),
            pad: r.u32(),
            reserved: [r.u64(), r.u64(), r.u64(), r.u64()],
        }
    }

    /// Encode to 64 bytes.
    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        let mut w = Writer { b: &mut b, o: 0 };
        w.u64(self.state);
        w.u64(self.head);
        w.u64(self.tail);
        w.u32(self.ftype);
        w.u32(self.pad);
        for v in self.reserved {
            w.u64(v);
        }
        b
    }

    /// In use?
    pub fn in_use(&self) -> bool {
        self.state & 1 == 1
    }
}

/// Bytes of a slot a replica copies: state, head, tail and type.
pub const REPLICA_COVERED: usize = 28;
/// Bytes of a replica slot that are ever non-zero (the copy and its CRC).
pub const REPLICA_USED: usize = 32;

/// The replica of a primary slot's bytes: bytes 0..28 copied, then the CRC32C
/// of those 28 bytes at 28..32, then zeros. A never-used slot's replica carries
/// the CRC of 28 zero bytes (mkfs writes them all), so a zeroed replica page is
/// damage, never a valid copy.
pub fn replica_of(primary: &[u8]) -> [u8; INODE_SLOT as usize] {
    let mut r = [0u8; INODE_SLOT as usize];
    let covered = &primary[..REPLICA_COVERED];
    r[..REPLICA_COVERED].copy_from_slice(covered);
    r[REPLICA_COVERED..REPLICA_USED]
        .copy_from_slice(&crate::pmem::crc32c_append(0, covered).to_le_bytes());
    r
}

/// Is `replica` a well-formed replica slot (its CRC matches and bytes 32..64 are
/// zero)? Then it is the slot it copies.
pub fn replica_valid(replica: &[u8]) -> bool {
    let covered = &replica[..REPLICA_COVERED];
    let sum = u32::from_le_bytes(replica[REPLICA_COVERED..REPLICA_USED].try_into().expect("4"));
    replica[REPLICA_USED..].iter().all(|&b| b == 0) && crate::pmem::crc32c_append(0, covered) == sum
}

/// Log pointers: the low 48 bits are a byte address, the high 16 an epoch that
/// thorough GC bumps, so a pointer value never repeats for an inode (the journal's
/// recovery rule relies on this).
pub mod logptr {
    /// Address mask.
    pub const ADDR_MASK: u64 = (1 << 48) - 1;
    /// Byte address.
    pub fn addr(p: u64) -> u64 {
        p & ADDR_MASK
    }
    /// Epoch.
    pub fn epoch(p: u64) -> u16 {
        (p >> 48) as u16
    }
    /// Compose.
    pub fn make(epoch: u16, addr: u64) -> u64 {
        debug_assert!(addr <= ADDR_MASK);
        ((epoch as u64) << 48) | addr
    }
}

/// Checkpoint header (first block of the recovery area).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CkptHeader {
    /// `FRRTCKPT`
    pub magic: [u8; 8],
    /// Generation; must equal the mount-state word's generation.
    pub generation: u64,
    /// Blocks covered by the block bitmap.
    pub nblocks: u64,
    /// Inodes covered by the inode bitmap.
    pub ninodes: u64,
    /// Used data blocks.
    pub used_blocks: u64,
    /// Used inodes.
    pub used_inodes: u64,
    /// CRC32C of the two bitmaps.
    pub bitmap_csum: u32,
    /// CRC32C of bytes 0..52 of this header.
    pub csum: u32,
}
const _: () = assert!(std::mem::size_of::<CkptHeader>() == 56);

/// Checkpoint magic.
pub const CKPT_MAGIC: [u8; 8] = *b"FRRTCKPT";

/// Offset of [`CkptShared`] in the checkpoint's header block.
pub const CKPT_SHARED_OFF: usize = 64;

/// The checkpoint's summary of shared data blocks (format version 6; `refs`): at
/// [`CKPT_SHARED_OFF`] of the header block. All zero: no block is shared (a
/// version 5 checkpoint reads so).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CkptShared {
    /// Blocks with an extra reference.
    pub blocks: u64,
    /// Extra references in all.
    pub extra: u64,
    /// CRC32C of the (block u64, extra u32) list, ascending.
    pub list_crc: u32,
    /// CRC32C of bytes 0..20.
    pub csum: u32,
}
const _: () = assert!(std::mem::size_of::<CkptShared>() == 24);

impl CkptShared {
    /// Encode (24 bytes); all zero when no block is shared.
    pub fn encode(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        if self.blocks == 0 && self.extra == 0 && self.list_crc == 0 {
            return b;
        }
        b[..8].copy_from_slice(&self.blocks.to_le_bytes());
        b[8..16].copy_from_slice(&self.extra.to_le_bytes());
        b[16..20].copy_from_slice(&self.list_crc.to_le_bytes());
        let c = crc32c::crc32c(&b[..20]);
        b[20..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decode; None when the checksum is wrong.
    pub fn decode(b: &[u8]) -> Option<CkptShared> {
        let b = &b[..24];
        if b.iter().all(|&x| x == 0) {
            return Some(CkptShared::default());
        }
        let u = |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8"));
        let w = |r: std::ops::Range<usize>| u32::from_le_bytes(b[r].try_into().expect("4"));
        let h =
            CkptShared { blocks: u(0..8), extra: u(8..16), list_crc: w(16..20), csum: w(20..24) };
        (crc32c::crc32c(&b[..20]) == h.csum && h.blocks > 0 && h.extra >= h.blocks).then_some(h)
    }
}

impl CkptHeader {
    /// Encode (56 bytes) with its checksum.
    pub fn encode(&self) -> [u8; 56] {
        let mut b = [0u8; 56];
        let mut w = Writer { b: &mut b, o: 0 };
        w.put(&self.magic);
        for v in [self.generation, self.nblocks, self.ninodes, self.used_blocks, self.used_inodes] {
            w.u64(v);
        }
        w.u32(self.bitmap_csum);
        let c = crc32c::crc32c(&b[..52]);
        b[52..].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decode; None when the magic or checksum is wrong.
    pub fn decode(b: &[u8]) -> Option<CkptHeader> {
        let mut r = Reader::new(&b[..56]);
        let magic: [u8; 8] = r.take(8).try_into().ok()?;
        let h = CkptHeader {
            magic,
            generation: r.u64(),
            nblocks: r.u64(),
            ninodes: r.u64(),
            used_blocks: r.u64(),
            used_inodes: r.u64(),
            bitmap_csum: r.u32(),
            csum: r.u32(),
        };
        (magic == CKPT_MAGIC && crc32c::crc32c(&b[..52]) == h.csum).then_some(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        let g = Geometry::compute(1024, 4, 1024).unwrap();
        Superblock {
            magic: MAGIC,
            version: VERSION,
            block_size: BLOCK as u32,
            uuid: [7; 16],
            pool_size: 1024 * BLOCK,
            nblocks: 1024,
            nshards: 4,
            inode_size: INODE_SLOT as u32,
            ninodes: 1024,
            journal_start: g.journal_start,
            journal_blocks: g.journal_blocks,
            itable_start: g.itable_start,
            itable_blocks: g.itable_blocks,
            ckpt_start: g.ckpt_start,
            ckpt_blocks: g.ckpt_blocks,
            data_start: g.data_start,
            root_ino: ROOT_INO,
            mkfs_time_ns: 5,
            features: FEATURE_REPLICAS,
            reserved: [0; 108],
            csum: 0,
        }
    }

    #[test]
    fn superblock_roundtrip_and_bitflips() {
        let sb = sample();
        let b = sb.encode();
        let d = Superblock::decode(&b).unwrap();
        assert_eq!(d.geometry(), sb.geometry());
        for bit in 0..(SB_SIZE * 8) {
            let mut c = b;
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(Superblock::decode(&c).is_err(), "bit {bit} flip accepted");
        }
    }

    #[test]
    fn slot_roundtrip() {
        let s = InodeSlot {
            state: 3,
            head: 4096 * 9,
            tail: 4096 * 9 + 88,
            ftype: 1,
            ..Default::default()
        };
        assert_eq!(InodeSlot::decode(&s.encode()), s);
    }
}
