//! FerriteFS through the library API: `Fs<M>` over a pool file in /dev/shm.
//!
//! Invariants:
//! - The target owns its pool file; `reset` unmounts and formats the same file again
//!   (its pages stay allocated); the file is removed when the target drops.
//! - Every page of the pool is written through the current mapping before mkfs, so
//!   measurements never take first-touch page faults.
//! - Every operation is durable and atomic when the library returns; `fsync` is the
//!   library's `fsync` (a fence), which is what an application would call.
//! - Handles count as opens (`Fs::open` / `Fs::release`), as a FUSE or C API user would.

use super::{Handle, Kind, TResult, Target, TargetError, Usage};
use crate::emu::CountedMedium;
use ferrite_core::pmem::StatsSnapshot;
use ferrite_core::{Fs, MkfsOptions, RenameFlags, SetAttr};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Builds the medium for a pool file: `(path, size, create)`; `create` false opens the
/// existing file.
pub type MediumFactory<M> = Box<dyn Fn(&Path, u64, bool) -> ferrite_core::Result<M> + Send + Sync>;

/// Write every page of a fresh pool once, so measurements never pay the first-touch
/// page allocation of /dev/shm (a long-lived pool on a DAX device has none either).
pub fn prefault<M: ferrite_core::Medium>(m: &M) {
    const CHUNK: u64 = 64 << 20;
    let mut off = 0;
    while off < m.len() {
        let n = CHUNK.min(m.len() - off);
        m.zero_nt(off, n);
        off += n;
    }
    m.fence();
}

/// FerriteFS through the library API.
pub struct LibTarget<M: CountedMedium> {
    name: String,
    desc: String,
    pool: PathBuf,
    size: u64,
    make: MediumFactory<M>,
    fs: Option<Fs<M>>,
    created: bool,
    /// A persistent buffer for `buf_write` (id, pages), made on first use.
    buf: parking_lot::Mutex<Option<(u64, u64)>>,
}

impl<M: CountedMedium> LibTarget<M> {
    /// Format a new pool of `size` bytes at `pool`.
    pub fn new(
        name: &str,
        desc: &str,
        pool: PathBuf,
        size: u64,
        make: MediumFactory<M>,
    ) -> TResult<Self> {
        let mut t = LibTarget {
            name: name.into(),
            desc: desc.into(),
            pool,
            size,
            make,
            fs: None,
            created: false,
            buf: parking_lot::Mutex::new(None),
        };
        t.reset()?;
        Ok(t)
    }

    /// Replace the description.
    pub fn with_description(mut self, d: String) -> Self {
        self.desc = d;
        self
    }

    /// The mounted file system.
    pub fn fs(&self) -> TResult<&Fs<M>> {
        self.fs.as_ref().ok_or_else(|| TargetError::Other("pool is not mounted".into()))
    }

    fn ino(h: &Handle) -> TResult<u64> {
        match h {
            Handle::Ino(i) => Ok(*i),
            _ => Err(TargetError::Other("handle of another target".into())),
        }
    }

    fn abs(path: &str) -> Vec<u8> {
        let mut v = Vec::with_capacity(path.len() + 1);
        v.push(b'/');
        v.extend_from_slice(path.trim_start_matches('/').as_bytes());
        v
    }
}

impl<M: CountedMedium> Drop for LibTarget<M> {
    fn drop(&mut self) {
        if let Some(fs) = self.fs.take() {
            let _ = fs.unmount();
        }
        let _ = std::fs::remove_file(&self.pool);
    }
}

impl<M: CountedMedium> Target for LibTarget<M> {
    fn name(&self) -> &str {
        &self.name
    }

    fn describe(&self) -> String {
        self.desc.clone()
    }

    fn kind(&self) -> Kind {
        Kind::Ferrite
    }

    fn reset(&mut self) -> TResult<()> {
        *self.buf.get_mut() = None; // freed by the unmount
        if let Some(fs) = self.fs.take() {
            fs.unmount()?;
        }
        // The first time, create the pool; afterwards reopen the same file (its pages
        // stay allocated). Either way write every page through this mapping before
        // formatting, so no measurement takes a page fault on the pool.
        let m = if self.created {
            (self.make)(&self.pool, self.size, false)?
        } else {
            let _ = std::fs::remove_file(&self.pool);
            let m = (self.make)(&self.pool, self.size, true)?;
            self.created = true;
            m
        };
        prefault(&m);
        // FERRITE_BENCH_REPLICAS=0 formats without metadata replicas, to measure
        // what they cost (docs/BENCHMARKS.md).
        let replicas = std::env::var("FERRITE_BENCH_REPLICAS").map_or(true, |v| v != "0");
        self.fs = Some(Fs::mkfs(m, &MkfsOptions { replicas, ..Default::default() })?);
        Ok(())
    }

    fn create(&self, path: &str, _append: bool) -> TResult<Handle> {
        let fs = self.fs()?;
        let p = Self::abs(path);
        let (parent, name) = fs.resolve_parent(&p)?;
        let ino = match fs.lookup_ino(parent, name) {
            Ok(i) => {
                fs.setattr(i, &SetAttr { size: Some(0), ..Default::default() })?;
                i
            }
            Err(ferrite_core::Error::NotFound) => fs.create(parent, name, 0o644, 0, 0)?.ino,
            Err(e) => return Err(e.into()),
        };
        fs.open(ino)?;
        Ok(Handle::Ino(ino))
    }

    fn open(&self, path: &str, _append: bool) -> TResult<Handle> {
        let fs = self.fs()?;
        let ino = fs.resolve(&Self::abs(path), true)?;
        fs.open(ino)?;
        Ok(Handle::Ino(ino))
    }

    fn close(&self, h: Handle) -> TResult<()> {
        Ok(self.fs()?.release(Self::ino(&h)?)?)
    }

    fn buf_write(&self, h: &Handle, off: u64, data: &[u8]) -> Option<TResult<()>> {
        let r = (|| {
            let fs = self.fs()?;
            let pages = (data.len() as u64).div_ceil(4096);
            let mut b = self.buf.lock();
            let id = match *b {
                Some((id, n)) if n >= pages => id,
                old => {
                    if let Some((id, _)) = old {
                        fs.pbuf_free(id)?;
                    }
                    let (id, _) = fs.pbuf_alloc(pages)?;
                    *b = Some((id, pages));
                    id
                }
            };
            // The program's stores into the buffer (the medium's plain writes).
            let blocks = fs.pbuf_blocks(id)?;
            for (k, chunk) in data.chunks(4096).enumerate() {
                fs.medium().write(blocks[k] * 4096, chunk);
            }
            fs.pbuf_write(Self::ino(h)?, off, id, 0, data.len() as u64)?;
            Ok(())
        })();
        Some(r)
    }

    fn map_atomic<'a>(
        &'a self,
        h: &Handle,
        len: usize,
    ) -> Option<TResult<Box<dyn super::mapped::Region + 'a>>> {
        let r = (|| {
            let fs = self.fs()?;
            let rw = libc::PROT_READ | libc::PROT_WRITE;
            let a = fs.mmap_atomic(Self::ino(h)?, len, rw, 0)?;
            let raw = super::mapped::RawRegion::new(a, len);
            Ok(Box::new(AtomicRegion { fs, raw }) as Box<dyn super::mapped::Region + 'a>)
        })();
        Some(r)
    }

    fn write_at(&self, h: &Handle, off: u64, data: &[u8]) -> TResult<()> {
        self.fs()?.write(Self::ino(h)?, off, data)?;
        Ok(())
    }

    fn append(&self, h: &Handle, data: &[u8]) -> TResult<()> {
        self.fs()?.append(Self::ino(h)?, data)?;
        Ok(())
    }

    fn read_at(&self, h: &Handle, off: u64, buf: &mut [u8]) -> TResult<usize> {
        Ok(self.fs()?.read(Self::ino(h)?, off, buf)?)
    }

    fn fsync(&self, h: &Handle) -> TResult<()> {
        Ok(self.fs()?.fsync(Self::ino(h)?, false)?)
    }

    fn size(&self, h: &Handle) -> TResult<u64> {
        Ok(self.fs()?.getattr(Self::ino(h)?)?.size)
    }

    fn mkdir(&self, path: &str) -> TResult<()> {
        let fs = self.fs()?;
        let p = Self::abs(path);
        let (parent, name) = fs.resolve_parent(&p)?;
        fs.mkdir(parent, name, 0o755, 0, 0)?;
        Ok(())
    }

    fn stat(&self, path: &str) -> TResult<u64> {
        Ok(self.fs()?.stat_path(&Self::abs(path))?.size)
    }

    fn rename(&self, from: &str, to: &str) -> TResult<()> {
        let fs = self.fs()?;
        let (f, t) = (Self::abs(from), Self::abs(to));
        let (sp, sn) = fs.resolve_parent(&f)?;
        let (dp, dn) = fs.resolve_parent(&t)?;
        fs.rename(sp, sn, dp, dn, RenameFlags::default())?;
        Ok(())
    }

    fn unlink(&self, path: &str) -> TResult<()> {
        let fs = self.fs()?;
        let p = Self::abs(path);
        let (parent, name) = fs.resolve_parent(&p)?;
        fs.unlink(parent, name)?;
        Ok(())
    }

    fn rmdir(&self, path: &str) -> TResult<()> {
        let fs = self.fs()?;
        let p = Self::abs(path);
        let (parent, name) = fs.resolve_parent(&p)?;
        fs.rmdir(parent, name)?;
        Ok(())
    }

    fn readdir_count(&self, path: &str) -> TResult<usize> {
        let fs = self.fs()?;
        let ino = fs.resolve(&Self::abs(path), true)?;
        let mut n = 0usize;
        fs.readdir(ino, 2, |e| {
            n += !e.name.is_empty() as usize;
            true
        })?;
        Ok(n)
    }

    fn usage(&self) -> TResult<Usage> {
        let s = self.fs()?.statfs();
        Ok(Usage { total: s.blocks * s.bsize, used: (s.blocks - s.bfree) * s.bsize })
    }

    fn persist_counters(&self) -> Option<StatsSnapshot> {
        self.fs.as_ref().map(|f| f.medium().counters())
    }

    fn gc_counters(&self) -> Option<(u64, u64, u64)> {
        self.fs.as_ref().map(|f| {
            let g = f.gc_stats();
            (
                g.fast_pages.load(Ordering::Relaxed),
                g.thorough_runs.load(Ordering::Relaxed),
                g.thorough_pages.load(Ordering::Relaxed),
            )
        })
    }
}

/// An atomic mapping of the library: persist is the atomic commit.
struct AtomicRegion<'a, M: CountedMedium> {
    fs: &'a Fs<M>,
    raw: super::mapped::RawRegion,
}

impl<M: CountedMedium> super::mapped::Region for AtomicRegion<'_, M> {
    fn store(&mut self, off: usize, data: &[u8]) {
        self.raw.store(off, data)
    }
    fn persist(&mut self, off: usize, len: usize) -> TResult<()> {
        match self.fs.persist_atomic(self.raw.addr() + off, len) {
            Some(r) => Ok(r?),
            None => Err(TargetError::Other("not an atomic mapping".into())),
        }
    }
}

impl<M: CountedMedium> Drop for AtomicRegion<'_, M> {
    fn drop(&mut self) {
        let _ = self.fs.munmap_atomic(self.raw.addr(), self.raw.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_core::{MapOptions, MmapMedium};

    #[test]
    fn lib_target_file_and_dir_ops() {
        let dir = tempfile::tempdir().unwrap();
        let make: MediumFactory<MmapMedium> = Box::new(|p, n, c| {
            if c {
                MmapMedium::create(p, n, &MapOptions::default())
            } else {
                MmapMedium::open(p, &MapOptions::default())
            }
        });
        let mut t = LibTarget::new("l", "d", dir.path().join("p.pool"), 16 << 20, make).unwrap();
        t.mkdir("a").unwrap();
        let h = t.create("a/f", false).unwrap();
        t.write_at(&h, 0, b"hello").unwrap();
        t.append(&h, b" world").unwrap();
        t.fsync(&h).unwrap();
        let mut b = [0u8; 11];
        assert_eq!(t.read_at(&h, 0, &mut b).unwrap(), 11);
        assert_eq!(&b, b"hello world");
        assert_eq!(t.size(&h).unwrap(), 11);
        t.close(h).unwrap();
        assert_eq!(t.stat("a/f").unwrap(), 11);
        t.rename("a/f", "a/g").unwrap();
        assert!(t.stat("a/f").is_err());
        assert_eq!(t.readdir_count("a").unwrap(), 1);
        t.unlink("a/g").unwrap();
        t.rmdir("a").unwrap();
        let u = t.usage().unwrap();
        assert!(u.used > 0 && u.used < u.total);
        assert!(t.persist_counters().unwrap().fences > 0);
        t.reset().unwrap();
        assert!(t.stat("a").is_err());
    }
}
