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
mod quiet;
pub mod server;
mod shm;
pub mod wire;

pub use client::{info_of, preload_library, AttachError, Client, Info};

/// First FUSE node id the mount hands out when a file's inode number is still
/// held by the kernel for an older file; ids below it are core inode numbers.
/// Shared by the mount (which hands them out) and the preload library (which
/// must not take one for an inode number).
pub const ALT_NODE_BASE: u64 = 1 << 56;

/// The most bytes Linux moves in one read or write (`MAX_RW_COUNT`).
pub const MAX_RW_COUNT: usize = 0x7fff_f000;

/// The length a front end (the preload library, the C API) takes of a caller's
/// buffer of `n` bytes at address `p`, as read(2) and write(2) take it: `None`
/// (EFAULT) for a null buffer or one that reaches past the user address space (a
/// count above `isize::MAX` does, which Rust could not hold as a slice; the end is
/// x86-64's with 5-level paging, and with 4 levels the kernel's answer for a buffer
/// between the two is EFAULT), else at most `MAX_RW_COUNT` bytes of it (Linux moves
/// no more per call). `n` is not 0.
pub fn user_len(p: usize, n: usize) -> Option<usize> {
    const USER_END: usize = 0x00ff_ffff_ffff_f000;
    let inside = p != 0 && p.checked_add(n).is_some_and(|end| end <= USER_END);
    inside.then(|| n.min(MAX_RW_COUNT))
}
pub use server::{share, Server, Shared, INFO_XATTR};

pub(crate) use shm::own_fd;
