//! Where a file's bytes live: the extents `ferrite bmap` prints (data blocks and
//! bytes embedded in log entries), from the DRAM index of a mounted pool.
//!
//! Invariant: read-only; the lists are built under the inode's read lock, so they
//! describe one committed state.

use crate::error::Result;
use crate::fs::Fs;
use crate::index::PageOp;
use crate::layout::BLOCK;
use crate::pmem::Medium;

/// Where a piece of a file lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ExtentKind {
    /// Whole pages in data blocks (copy on write).
    Data,
    /// Bytes embedded in a log entry (a sub-page write), laid over the page.
    Embedded,
}

/// One extent of a file, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MapExtent {
    /// Offset in the file.
    pub file_offset: u64,
    /// Offset in the pool.
    pub pool_offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Data block or embedded.
    pub kind: ExtentKind,
}

impl<M: Medium> Fs<M> {
    /// The extents of file `ino` in file order (embedded pieces after the data
    /// extent they overlay). Data extents are whole blocks, also past the size's
    /// last byte; a hole has no extent.
    pub fn bmap(&self, ino: u64) -> Result<Vec<MapExtent>> {
        let i = self.inode(ino)?;
        let st = i.st.read();
        let mut out = Vec::new();
        let Some(f) = st.file() else { return Ok(out) };
        for (pg, e) in f.ext.iter() {
            out.push(MapExtent {
                file_offset: pg * BLOCK,
                pool_offset: e.block * BLOCK,
                len: e.len as u64 * BLOCK,
                kind: ExtentKind::Data,
            });
        }
        for (&pg, ops) in &f.ops {
            for op in ops {
                if let PageOp::Overlay { loc, data_off, off, len } = *op {
                    out.push(MapExtent {
                        file_offset: pg * BLOCK + off as u64,
                        pool_offset: loc.get() + data_off as u64,
                        len: len as u64,
                        kind: ExtentKind::Embedded,
                    });
                }
            }
        }
        out.sort_by_key(|x| (x.file_offset, x.kind == ExtentKind::Embedded));
        Ok(out)
    }
}

/// Who owns a range of pool blocks.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BlockRange {
    /// First block.
    pub start: u64,
    /// Blocks in the range.
    pub len: u64,
    /// `superblock`, `journal`, `inode-table`, `checkpoint`, `log`, `data` or `xattr` (a large extended attribute value).
    pub owner: &'static str,
    /// Inode, for log and data blocks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ino: Option<u64>,
    /// File offset of the first block, for data.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_offset: Option<u64>,
}

impl<M: Medium> Fs<M> {
    /// Every used block range and its owner, in block order: the metadata regions,
    /// then each in-use inode's log pages and data runs, read from the logs on
    /// media. Inodes whose logs do not replay are left out (fsck names them).
    pub fn block_owners(&self) -> Vec<BlockRange> {
        let g = self.geo;
        let mut out = vec![
            BlockRange { start: 0, len: 2, owner: "superblock", ino: None, file_offset: None },
            BlockRange {
                start: g.journal_start,
                len: g.journal_blocks,
                owner: "journal",
                ino: None,
                file_offset: None,
            },
            BlockRange {
                start: g.itable_start,
                len: g.itable_blocks,
                owner: "inode-table",
                ino: None,
                file_offset: None,
            },
            BlockRange {
                start: g.ckpt_start,
                len: g.ckpt_blocks,
                owner: "checkpoint",
                ino: None,
                file_offset: None,
            },
        ];
        if g.replicas {
            // The replicas of the three regions above, in the same order.
            out.push(BlockRange {
                start: g.ckpt_start + g.ckpt_blocks,
                len: g.data_start - (g.ckpt_start + g.ckpt_blocks),
                owner: "replicas",
                ino: None,
                file_offset: None,
            });
        }
        for ino in 1..=g.ninodes {
            let Ok(Some((_, st, _))) = self.load_state(ino) else { continue };
            let mut pages: Vec<u64> = st.log.pages.iter().map(|p| p / BLOCK).collect();
            pages.sort_unstable();
            let mut k = 0;
            while k < pages.len() {
                let mut n = 1;
                while k + n < pages.len() && pages[k + n] == pages[k] + n as u64 {
                    n += 1;
                }
                out.push(BlockRange {
                    start: pages[k],
                    len: n as u64,
                    owner: "log",
                    ino: Some(ino),
                    file_offset: None,
                });
                k += n;
            }
            if let Some(f) = st.file() {
                for (pg, e) in f.ext.iter() {
                    out.push(BlockRange {
                        start: e.block,
                        len: e.len as u64,
                        owner: "data",
                        ino: Some(ino),
                        file_offset: Some(pg * BLOCK),
                    });
                }
            }
            for sp in st.xattrs.values().filter_map(|x| x.spill.as_ref()) {
                for &b in &sp.blocks {
                    let r = BlockRange {
                        start: b,
                        len: 1,
                        owner: "xattr",
                        ino: Some(ino),
                        file_offset: None,
                    };
                    out.push(r);
                }
            }
        }
        out.sort_by_key(|r| r.start);
        out
    }
}
