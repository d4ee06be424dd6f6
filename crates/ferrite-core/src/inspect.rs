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
                        pool_offset: loc + data_off as u64,
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
