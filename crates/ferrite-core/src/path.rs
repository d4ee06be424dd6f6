//! Path resolution and whole-file helpers for the CLI, tests and tools.

use crate::error::{Error, Result};
use crate::fs::{Attr, Fs};
use crate::index::FileType;
use crate::pmem::Medium;

/// Symlinks followed before ELOOP.
pub const MAX_SYMLINKS: usize = 40;

impl<M: Medium> Fs<M> {
    /// Resolve an absolute (or root-relative) path. `follow`: follow a final symlink.
    pub fn resolve(&self, path: &[u8], follow: bool) -> Result<u64> {
        let mut budget = MAX_SYMLINKS;
        self.resolve_from(self.root(), path, follow, &mut budget)
    }

    fn resolve_from(
        &self,
        start: u64,
        path: &[u8],
        follow: bool,
        budget: &mut usize,
    ) -> Result<u64> {
        let mut cur = if path.first() == Some(&b'/') { self.root() } else { start };
        let comps: Vec<&[u8]> = path.split(|&c| c == b'/').filter(|c| !c.is_empty()).collect();
        for (k, c) in comps.iter().enumerate() {
            let last = k + 1 == comps.len();
            let a = self.getattr(cur)?;
            if a.ftype != FileType::Directory {
                return Err(Error::NotDir);
            }
            let next = self.lookup_ino(cur, c)?;
            let na = self.getattr(next)?;
            if na.ftype == FileType::Symlink && (!last || follow) {
                if *budget == 0 {
                    return Err(Error::Loop);
                }
                *budget -= 1;
                let target = self.readlink(next)?;
                cur = self.resolve_from(cur, &target, true, budget)?;
            } else {
                cur = next;
            }
        }
        Ok(cur)
    }

    /// Split a path into (parent inode, final name).
    pub fn resolve_parent<'p>(&self, path: &'p [u8]) -> Result<(u64, &'p [u8])> {
        let trimmed = {
            let mut p = path;
            while p.len() > 1 && p.last() == Some(&b'/') {
                p = &p[..p.len() - 1];
            }
            p
        };
        let (dir, name) = match trimmed.iter().rposition(|&c| c == b'/') {
            Some(i) => (&trimmed[..i.max(1)], &trimmed[i + 1..]),
            None => (&b"/"[..], trimmed),
        };
        if name.is_empty() {
            return Err(Error::invalid("path names the root"));
        }
        Ok((self.resolve(dir, true)?, name))
    }

    /// Attributes at a path (following symlinks).
    pub fn stat_path(&self, path: &[u8]) -> Result<Attr> {
        self.getattr(self.resolve(path, true)?)
    }

    /// Create directories along `path` as needed.
    pub fn mkdir_all(&self, path: &[u8], perm: u32) -> Result<u64> {
        let mut cur = self.root();
        for c in path.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
            cur = match self.lookup_ino(cur, c) {
                Ok(i) => i,
                Err(Error::NotFound) => self.mkdir(cur, c, perm, 0, 0)?.ino,
                Err(e) => return Err(e),
            };
        }
        Ok(cur)
    }

    /// Whole contents of the file at `ino`.
    pub fn read_all(&self, ino: u64) -> Result<Vec<u8>> {
        let a = self.getattr(ino)?;
        let mut v = vec![0u8; a.size as usize];
        let n = self.read(ino, 0, &mut v)?;
        v.truncate(n);
        Ok(v)
    }

    /// Create (or truncate) the file at `path` and write `data` to it.
    pub fn write_file(&self, path: &[u8], data: &[u8], perm: u32) -> Result<u64> {
        let (p, name) = self.resolve_parent(path)?;
        let ino = match self.lookup_ino(p, name) {
            Ok(i) => {
                self.setattr(i, &crate::fs::SetAttr { size: Some(0), ..Default::default() })?;
                i
            }
            Err(Error::NotFound) => self.create(p, name, perm, 0, 0)?.ino,
            Err(e) => return Err(e),
        };
        const CHUNK: usize = 1 << 20;
        let mut off = 0;
        while off < data.len() {
            let n = (data.len() - off).min(CHUNK);
            self.write(ino, off as u64, &data[off..off + n])?;
            off += n;
        }
        Ok(ino)
    }
}
