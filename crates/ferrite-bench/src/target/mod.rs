//! Benchmark targets: one trait, one plug-in per file system (or hardware path).
//!
//! Every workload is written once against [`Target`]; a target is FerriteFS through
//! the library API ([`lib::LibTarget`]), a directory reached through ordinary syscalls
//! (tmpfs, ext4 on a loop device, the FerriteFS FUSE mount: [`dir::DirTarget`]), or a
//! raw mapping that measures the hardware limit ([`hw::HwTarget`]). A C API or
//! LD_PRELOAD target is one more implementation of the trait.
//!
//! Invariants:
//! - Paths are relative to the target's root, `/`-separated, without `..`.
//! - A target is `Sync`: the workloads call it from several threads at once, each
//!   thread with its own handles.
//! - `fsync` asks for the durability the workload's paper asks for; what that means on
//!   each target is stated by [`Target::describe`].
//! - An operation a target cannot do returns [`TargetError::Unsupported`]; the
//!   workload then records the cell as not applicable, never as a number.

pub mod dir;
pub mod hw;
pub mod lib;
pub mod mapped;

use std::sync::Arc;

/// Errors from a target operation.
#[derive(Debug)]
pub enum TargetError {
    /// The target has no such operation (e.g. `rename` on the hardware target).
    Unsupported(&'static str),
    /// Out of space (ENOSPC).
    NoSpace(String),
    /// Any other failure, with context.
    Other(String),
}

impl std::fmt::Display for TargetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TargetError::Unsupported(what) => write!(f, "not supported by this target: {what}"),
            TargetError::NoSpace(m) => write!(f, "no space: {m}"),
            TargetError::Other(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for TargetError {}

impl From<std::io::Error> for TargetError {
    fn from(e: std::io::Error) -> Self {
        if e.raw_os_error() == Some(28) {
            TargetError::NoSpace(e.to_string())
        } else {
            TargetError::Other(e.to_string())
        }
    }
}

impl From<ferrite_core::Error> for TargetError {
    fn from(e: ferrite_core::Error) -> Self {
        match e {
            ferrite_core::Error::NoSpace => TargetError::NoSpace(e.to_string()),
            other => TargetError::Other(other.to_string()),
        }
    }
}

/// Result of a target operation.
pub type TResult<T> = Result<T, TargetError>;

/// An open file on some target.
pub enum Handle {
    /// A kernel file descriptor; `append`: opened with O_APPEND.
    File {
        /// The file.
        f: std::fs::File,
        /// Opened with O_APPEND.
        append: bool,
    },
    /// A FerriteFS inode opened through the library.
    Ino(u64),
    /// A region of the hardware target's mapping.
    Region(Arc<hw::Region>),
    /// A handle of a target added later (C API, LD_PRELOAD, ...).
    Other(Box<dyn std::any::Any + Send + Sync>),
}

/// What kind of thing a target measures (for ratio columns and plots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Kind {
    /// FerriteFS (library, FUSE, emulated media).
    Ferrite,
    /// A kernel file system peer.
    Kernel,
    /// The hardware limit (raw copies).
    Hardware,
}

/// Space use of a target, in bytes.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Usage {
    /// Capacity.
    pub total: u64,
    /// Used.
    pub used: u64,
}

/// A file system under test. See the module documentation for the invariants.
pub trait Target: Send + Sync {
    /// Short name, used as a table column (`ferrite-lib`, `tmpfs`, ...).
    fn name(&self) -> &str;
    /// One line: what this target is and what `fsync` means on it.
    fn describe(&self) -> String;
    /// What kind of target this is.
    fn kind(&self) -> Kind;
    /// Remove everything (and release the memory it used where possible).
    fn reset(&mut self) -> TResult<()>;

    /// Create (or truncate) and open a file for reading and writing; `append`: the
    /// handle will be used for appends (O_APPEND where the target has it).
    fn create(&self, path: &str, append: bool) -> TResult<Handle>;
    /// Open an existing file for reading and writing (`append` as for `create`).
    fn open(&self, path: &str, append: bool) -> TResult<Handle>;
    /// Close a handle.
    fn close(&self, h: Handle) -> TResult<()>;
    /// Write all of `data` at `off`.
    fn write_at(&self, h: &Handle, off: u64, data: &[u8]) -> TResult<()>;
    /// Append all of `data` at the end of the file.
    fn append(&self, h: &Handle, data: &[u8]) -> TResult<()>;
    /// Read up to `buf.len()` bytes at `off`; returns the count.
    fn read_at(&self, h: &Handle, off: u64, buf: &mut [u8]) -> TResult<usize>;
    /// Make the file's completed writes durable (fsync).
    fn fsync(&self, h: &Handle) -> TResult<()>;
    /// Current file size.
    fn size(&self, h: &Handle) -> TResult<u64>;

    /// Create a directory.
    fn mkdir(&self, path: &str) -> TResult<()>;
    /// Size of the file at `path` (stat).
    fn stat(&self, path: &str) -> TResult<u64>;
    /// Rename `from` to `to`.
    fn rename(&self, from: &str, to: &str) -> TResult<()>;
    /// Remove a file.
    fn unlink(&self, path: &str) -> TResult<()>;
    /// Remove an empty directory.
    fn rmdir(&self, path: &str) -> TResult<()>;
    /// Number of entries in a directory (without `.` and `..`), by reading it all.
    fn readdir_count(&self, path: &str) -> TResult<usize>;

    /// Space in use, for targets with a bounded capacity.
    /// The descriptor of a handle's file, for targets whose files can be mapped
    /// with mmap(2) (the kernel's file systems and FerriteFS mounts).
    fn map_fd<'a>(&self, _h: &'a Handle) -> Option<std::os::fd::BorrowedFd<'a>> {
        None
    }
    /// An atomic mapping of the first `len` bytes of a handle's file (FerriteFS's
    /// library targets): stores, then an atomic commit of the changed pages.
    fn map_atomic<'a>(
        &'a self,
        _h: &Handle,
        _len: usize,
    ) -> Option<TResult<Box<dyn mapped::Region + 'a>>> {
        None
    }
    /// Write `data` into a handle's file at `off` through a persistent buffer
    /// (FerriteFS's library targets): fill the buffer with stores, then write it
    /// by reference.
    fn buf_write(&self, _h: &Handle, _off: u64, _data: &[u8]) -> Option<TResult<()>> {
        None
    }
    /// The directory a file-system target works in (for the experiments that run
    /// real programs: fio, sqlite3).
    fn dir(&self) -> Option<&std::path::Path> {
        None
    }

    /// Space use.
    fn usage(&self) -> TResult<Usage> {
        Err(TargetError::Unsupported("usage"))
    }
    /// Persistence counters (flushed bytes, non-temporal bytes, fences) when the target
    /// can see them.
    fn persist_counters(&self) -> Option<ferrite_core::pmem::StatsSnapshot> {
        None
    }
    /// GC counters `(fast GC pages, thorough runs, thorough pages)` for FerriteFS.
    fn gc_counters(&self) -> Option<(u64, u64, u64)> {
        None
    }
}

/// `ENOSPC`-style failure check.
pub fn is_nospace(e: &TargetError) -> bool {
    matches!(e, TargetError::NoSpace(_))
}
