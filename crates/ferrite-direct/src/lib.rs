//! FerriteFS direct access: the mount daemon owns the pool, its namespace and its
//! allocator; processes started with the preload library (or using the C API)
//! open files through the mount and then read and write their data themselves,
//! through the core's own write path over their own mapping of the pool.
//!
//! - [`server`]: the daemon's side (the coordination table, a liveness sentinel, a
//!   socket serving block grants, death and revocation of clients).
//! - [`client`]: the client's side (attach, blocks, a watcher for the daemon's end).
//! - `wire`: the messages; `shm` and `alive`: the two fenced unsafe modules.
//!
//! The protocol and its proof sketch are in docs/DIRECT-ACCESS.md.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod alive;
pub mod client;
pub mod server;
mod shm;
pub mod wire;

pub use client::{info_of, preload_library, AttachError, Client, Info};

/// First FUSE node id the mount hands out when a file's inode number is still
/// held by the kernel for an older file; ids below it are core inode numbers.
/// Shared by the mount (which hands them out) and the preload library (which
/// must not take one for an inode number).
pub const ALT_NODE_BASE: u64 = 1 << 56;
pub use server::{share, Server, Shared, INFO_XATTR};

pub(crate) use shm::own_fd;
