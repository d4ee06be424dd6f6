//! FerriteFS core: a NOVA-style log-structured file system for persistent memory,
//! running in user space over a mapped pool.
//!
//! Layers, bottom up: [`pmem`] (every store to the pool), [`dax`] / [`sim`] (the
//! media), [`layout`] (superblock, geometry, inode slots), [`log`] (per-inode logs),
//! [`journal`] (multi-inode commits), [`alloc`] (DRAM allocators), [`index`] (DRAM
//! indexes rebuilt from logs; [`pagemap`] holds a file's overlay lists), [`fs`] /
//! `ops` (operations), [`gc`], [`recovery`], [`fsck`].
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod acl;
pub mod alloc;
pub mod chain;
pub mod cookies;
pub mod dax;
pub mod error;
pub mod extmap;
pub mod filemap;
pub mod fs;
pub mod fsck;
mod futex;
pub mod gc;
pub mod index;
pub mod inspect;
pub mod integrity;
pub mod journal;
pub mod layout;
mod locks;
pub mod log;
mod mapping;
pub mod numa;
mod ops;
pub mod pagemap;
pub mod path;
pub mod pbuf;
pub mod pmem;
pub mod privs;
pub mod recovery;
mod reflink;
pub mod refs;
mod region;
pub mod replica;
pub mod share;
mod sharing;
pub mod sim;
pub mod verify;
mod wtrack;

pub use dax::{MapOptions, MmapMedium};
pub use error::{Error, Result};
pub use fs::{
    encode_rdev, AtimeMode, Attr, CoreFault, DirEntry, FallocMode, Fs, MkfsOptions, MountOptions,
    MountReport, NewNode, RenameFlags, SetAttr, SetTime, Shift, StatFs, XattrSet,
};
pub use fsck::FsckReport;
pub use index::FileType;
pub use log::{Ts, XATTR_SIZE_MAX};
pub use mapping::DaxRuns;
pub use ops::{INLINE_MAX, MAX_PAGE_OPS, SYMLINK_MAX, XATTR_VALUE_MAX};
pub use path::{OpenFlags, SlashCall};
pub use pmem::{Durability, Medium};
pub use share::{BlockSource, Party, Table};
pub use sharing::{DaemonGrants, Resolved, LEASE_TICK};
pub use sim::SimMedium;
pub use verify::VerifyMode;
