//! The hardware limit: raw copies into a shared mapping of a /dev/shm file, with no
//! file system at all. A "file" is a fixed-size region of the mapping.
//!
//! Four flavours:
//! - `hw-memcpy`: cached stores (a plain memcpy), `fsync` does nothing: the speed of
//!   light for moving bytes, with no durability.
//! - `hw-ntstore`: non-temporal stores, `fsync` is a store fence: the least work that
//!   makes a write persistent on real persistent memory.
//! - `hw-clwb`: cached stores, each written line flushed (the persistence module's
//!   flush instruction, `clwb` where the CPU has it), `fsync` is a store fence: the
//!   least work that makes a program's *own* stores persistent, which is what a
//!   store into a DAX mapping followed by msync, or the filling of a persistent
//!   buffer, must pay. A cached store needs its line in the cache (read from memory
//!   when it is not there) and then a flush; a non-temporal store needs neither, so
//!   this floor sits above `hw-ntstore`'s.
//! - `hw-msync` (the mmap experiment only): as `hw-clwb`, but each write's flushes
//!   start at the beginning of its first page. That is what persisting a program's
//!   store with `msync` costs at least: msync takes a page-aligned address, and no
//!   instruction tells which lines of the page the program changed, so a DAX msync
//!   of `[page start, end of the store)` flushes every line of it (a 64 B store at a
//!   random place: 32 lines on average).
//!
//! Invariants: every store goes through `MmapMedium` (bounds-checked, counted); a
//! write past a region's capacity fails with `NoSpace`; metadata operations are
//! `Unsupported`.

use super::{Handle, Kind, TResult, Target, TargetError};
use ferrite_core::pmem::{Medium, StatsSnapshot};
use ferrite_core::{MapOptions, MmapMedium};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One "file": a region of the mapping.
pub struct Region {
    base: u64,
    cap: u64,
    len: AtomicU64,
}

/// How a hardware-limit target stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HwMode {
    /// Plain memcpy, no flush, no fence (`hw-memcpy`).
    Memcpy,
    /// Non-temporal stores, a fence per fsync (`hw-ntstore`).
    NtStore,
    /// Plain stores, each written line flushed, a fence per fsync (`hw-clwb`).
    Flush,
    /// As `Flush`, the flushes starting at the write's page start (`hw-msync`).
    FlushFromPage,
}

impl HwMode {
    /// The flavours every experiment runs, in report order (`FlushFromPage` is the
    /// mmap experiment's own).
    pub const ALL: [HwMode; 3] = [HwMode::Memcpy, HwMode::NtStore, HwMode::Flush];

    /// The target's name.
    pub fn name(self) -> &'static str {
        match self {
            HwMode::Memcpy => "hw-memcpy",
            HwMode::NtStore => "hw-ntstore",
            HwMode::Flush => "hw-clwb",
            HwMode::FlushFromPage => "hw-msync",
        }
    }
}

/// The hardware-limit target.
pub struct HwTarget {
    mode: HwMode,
    path: PathBuf,
    region: u64,
    nregions: u64,
    m: Option<MmapMedium>,
    files: Mutex<HashMap<String, Arc<Region>>>,
}

impl HwTarget {
    /// A mapping of `nregions` regions of `region` bytes at `path`, stored to as
    /// `mode` says.
    pub fn new(path: PathBuf, region: u64, nregions: u64, mode: HwMode) -> TResult<Self> {
        let region = region.div_ceil(4096) * 4096;
        let mut t =
            HwTarget { mode, path, region, nregions, m: None, files: Mutex::new(HashMap::new()) };
        t.reset()?;
        Ok(t)
    }

    fn m(&self) -> TResult<&MmapMedium> {
        self.m.as_ref().ok_or_else(|| TargetError::Other("mapping missing".into()))
    }

    fn region(h: &Handle) -> TResult<&Region> {
        match h {
            Handle::Region(r) => Ok(r),
            _ => Err(TargetError::Other("handle of another target".into())),
        }
    }

    fn get(&self, path: &str, create: bool) -> TResult<Handle> {
        let mut files = self.files.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = files.get(path) {
            if create {
                r.len.store(0, Ordering::Release);
            }
            return Ok(Handle::Region(r.clone()));
        }
        if !create {
            return Err(TargetError::Other(format!("{path}: no such region")));
        }
        let idx = files.len() as u64;
        if idx >= self.nregions {
            return Err(TargetError::NoSpace(format!("all {} regions in use", self.nregions)));
        }
        let r =
            Arc::new(Region { base: idx * self.region, cap: self.region, len: AtomicU64::new(0) });
        files.insert(path.to_string(), r.clone());
        Ok(Handle::Region(r))
    }

    fn store(&self, r: &Region, off: u64, data: &[u8]) -> TResult<()> {
        let end = off + data.len() as u64;
        if end > r.cap {
            return Err(TargetError::NoSpace(format!("region holds {} bytes", r.cap)));
        }
        let m = self.m()?;
        match self.mode {
            HwMode::NtStore => m.write_nt(r.base + off, data),
            HwMode::Memcpy => m.write(r.base + off, data),
            HwMode::Flush => {
                m.write(r.base + off, data);
                m.flush(r.base + off, data.len() as u64);
            }
            HwMode::FlushFromPage => {
                m.write(r.base + off, data);
                // Regions start on page boundaries (`new`).
                let page = super::mapped::PAGE as u64;
                let at = (r.base + off) / page * page;
                m.flush(at, r.base + end - at);
            }
        }
        r.len.fetch_max(end, Ordering::AcqRel);
        Ok(())
    }
}

impl Drop for HwTarget {
    fn drop(&mut self) {
        self.m = None;
        let _ = std::fs::remove_file(&self.path);
    }
}

impl Target for HwTarget {
    fn name(&self) -> &str {
        self.mode.name()
    }

    fn describe(&self) -> String {
        // Mapped as a pool is (`MmapMedium`), so with the pool's page size.
        let map = "a /dev/shm mapping (2 MiB pages where the kernel allows, as the pool's)";
        let flush = ferrite_core::pmem::config().flush;
        match self.mode {
            HwMode::NtStore => {
                format!("hardware limit: non-temporal stores into {map}, fsync = sfence")
            }
            HwMode::Memcpy => {
                format!("hardware limit: memcpy into {map}, no flush, fsync does nothing")
            }
            HwMode::Flush => format!(
                "hardware limit of a program's own stores: memcpy into {map}, each written \
                 line flushed ({flush:?}), fsync = sfence"
            ),
            HwMode::FlushFromPage => format!(
                "hardware limit of a program's own stores made durable by msync: memcpy \
                 into {map}, every line from the write's page start to its end flushed \
                 ({flush:?}), fsync = sfence"
            ),
        }
    }

    fn kind(&self) -> Kind {
        Kind::Hardware
    }

    fn reset(&mut self) -> TResult<()> {
        self.files.lock().unwrap_or_else(|p| p.into_inner()).clear();
        if self.m.is_none() {
            let _ = std::fs::remove_file(&self.path);
            let m = MmapMedium::create(
                &self.path,
                self.region * self.nregions,
                &MapOptions::default(),
            )?;
            super::lib::prefault(&m);
            self.m = Some(m);
        }
        Ok(())
    }

    fn create(&self, path: &str, _append: bool) -> TResult<Handle> {
        self.get(path, true)
    }

    fn open(&self, path: &str, _append: bool) -> TResult<Handle> {
        self.get(path, false)
    }

    fn close(&self, _h: Handle) -> TResult<()> {
        Ok(())
    }

    fn write_at(&self, h: &Handle, off: u64, data: &[u8]) -> TResult<()> {
        self.store(Self::region(h)?, off, data)
    }

    fn append(&self, h: &Handle, data: &[u8]) -> TResult<()> {
        let r = Self::region(h)?;
        let off = r.len.load(Ordering::Acquire);
        self.store(r, off, data)
    }

    fn read_at(&self, h: &Handle, off: u64, buf: &mut [u8]) -> TResult<usize> {
        let r = Self::region(h)?;
        let len = r.len.load(Ordering::Acquire);
        if off >= len {
            return Ok(0);
        }
        let n = (buf.len() as u64).min(len - off) as usize;
        self.m()?.read(r.base + off, &mut buf[..n]);
        Ok(n)
    }

    fn fsync(&self, _h: &Handle) -> TResult<()> {
        if self.mode != HwMode::Memcpy {
            self.m()?.fence();
        }
        Ok(())
    }

    fn size(&self, h: &Handle) -> TResult<u64> {
        Ok(Self::region(h)?.len.load(Ordering::Acquire))
    }

    fn mkdir(&self, _path: &str) -> TResult<()> {
        Ok(()) // directories are free: regions are named by full path
    }

    fn stat(&self, _path: &str) -> TResult<u64> {
        Err(TargetError::Unsupported("stat"))
    }

    fn rename(&self, _from: &str, _to: &str) -> TResult<()> {
        Err(TargetError::Unsupported("rename"))
    }

    fn unlink(&self, _path: &str) -> TResult<()> {
        Err(TargetError::Unsupported("unlink"))
    }

    fn rmdir(&self, _path: &str) -> TResult<()> {
        Err(TargetError::Unsupported("rmdir"))
    }

    fn readdir_count(&self, _path: &str) -> TResult<usize> {
        Err(TargetError::Unsupported("readdir"))
    }

    fn persist_counters(&self) -> Option<StatsSnapshot> {
        // Plain memcpy is neither flushed nor fenced: nothing to count.
        self.m.as_ref().filter(|_| self.mode != HwMode::Memcpy).map(|m| m.stats().snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_write_read_append_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        for mode in HwMode::ALL.into_iter().chain([HwMode::FlushFromPage]) {
            let t = HwTarget::new(dir.path().join(mode.name()), 8192, 2, mode).unwrap();
            let persists = mode != HwMode::Memcpy;
            let f0 = t.persist_counters().map(|c| c.fences);
            let h = t.create("a", false).unwrap();
            t.write_at(&h, 100, b"xyz").unwrap();
            t.append(&h, b"!").unwrap();
            t.fsync(&h).unwrap();
            assert_eq!(t.size(&h).unwrap(), 104);
            let mut b = [0u8; 10];
            assert_eq!(t.read_at(&h, 100, &mut b).unwrap(), 4);
            assert_eq!(&b[..4], b"xyz!");
            assert!(matches!(t.write_at(&h, 8190, b"abc"), Err(TargetError::NoSpace(_))));
            let _b = t.create("b", false).unwrap();
            assert!(matches!(t.create("c", false), Err(TargetError::NoSpace(_))));
            assert!(matches!(t.rename("a", "b"), Err(TargetError::Unsupported(_))));
            let f1 = t.persist_counters().map(|c| c.fences);
            assert_eq!(f1.zip(f0).map(|(a, b)| a - b), persists.then_some(1));
            // The flushing flavour flushed the lines it wrote (4 bytes in one line,
            // then one more byte in the same line), the msync-shaped one every line
            // from the page start each time (lines 0 and 1, twice), the others none.
            let flushed = t.persist_counters().map(|c| c.flushed_bytes);
            match mode {
                HwMode::Flush => assert_eq!(flushed, Some(128)),
                HwMode::FlushFromPage => assert_eq!(flushed, Some(256)),
                HwMode::NtStore => assert_eq!(flushed, Some(0)),
                HwMode::Memcpy => assert_eq!(flushed, None),
            }
        }
    }
}
