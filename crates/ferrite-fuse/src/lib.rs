//! FerriteFS over FUSE: `ferrite mount` serves a pool through the kernel's FUSE
//! interface (the `fuser` crate, no libfuse), so every program can use it.
//!
//! Modules: [`fs`] (the request handlers), [`nodes`] (FUSE node ids and lookup
//! counts), [`options`] (`-o` options), [`umount`] (finding and detaching mounts), and
//! the mount daemon behind [`run_mount`] / [`run_umount`]. See docs/FUSE.md.
//!
//! Invariants:
//! - Durability is the core's: every reply is sent after the core operation returned,
//!   and a returned operation is durable (unless `-o writeback_cache`, off by default).
//! - The kernel caches entries, negative entries and attributes for long but never
//!   shows a stale one: every change passes through it, except direct-access clients'
//!   writes, whose files get no attribute caching while open for writing and an
//!   invalidation at open and release (see [`fs`]).
//! - Permission checks are the kernel's (`default_permissions` is always set).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod daemon;
pub mod fs;
pub mod nodes;
pub mod options;
pub mod umount;

pub use daemon::{run_mount, run_umount};
pub use fs::{FerriteFuse, FuseConfig, Health};

use std::ffi::OsString;
use std::path::PathBuf;

/// Pool used when none is named (also `$FERRITE_POOL`).
pub const DEFAULT_POOL: &str = "/dev/shm/ferrite.pool";

/// `ferrite mount [POOL] MOUNTPOINT [-f] [-o opt,...]`.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(after_help = "\
Options for -o (comma-separated; also what fstab and `mount -t fuse.ferrite` pass):
  ro, rw                 read-only / read-write (default rw)
  allow_other            let other users in (non-root: needs user_allow_other in /etc/fuse.conf)
  allow_root             let root in as well as the mounting user
  default_permissions    always on: the kernel checks permissions
  auto_unmount           unmount when the daemon dies (runs through fusermount3)
  fsname=NAME            source shown by mount/df (default: the pool path)
  subtype=NAME           type suffix (default ferrite)
  nodev,nosuid,noexec,sync,dirsync,...   generic mount flags
  relatime               reads update access times as Linux's default (persisted lazily)
  noatime, strictatime   never / on every read
  create=SIZE            format the pool with SIZE if it does not exist
  threads=N              request-serving threads on /dev/fuse
  uring                  serve requests over io_uring (Linux 6.14+; turns the fuse module's
                         enable_uring on, root only); the default when that switch is on
  nouring                serve requests over /dev/fuse only
  nosched_idle           serve requests from normal-policy threads (the default,
                         sched_idle, uses SCHED_IDLE so callers wake on their own CPU)
  msync                  msync at every commit (power-loss durability on non-DAX files)
  direct_io              no kernel page cache for file data
  nodirect               offer no direct access (processes under `ferrite run` use FUSE)
  nocache                the kernel caches no entries or attributes (every path component
                         and stat asks the daemon; slower, for comparison and debugging)
  writeback_cache        kernel buffers writes: faster, but a write is durable only after
                         fsync/close (weaker than the default; see docs/FUSE.md)
Ignored: defaults, auto, noauto, user, users, _netdev, nofail, x-*, lazytime, ...

Without -f the command returns once the mount is ready and the daemon runs detached.
Unmount with `ferrite umount MOUNTPOINT`, fusermount3 -u, umount, or SIGINT/SIGTERM.")]
pub struct MountArgs {
    /// [POOL] MOUNTPOINT. POOL defaults to $FERRITE_POOL or /dev/shm/ferrite.pool.
    #[arg(required = true, num_args = 1..=2, value_name = "PATH")]
    pub paths: Vec<PathBuf>,
    /// Mount options (comma-separated; may be repeated).
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Vec<String>,
    /// Stay in the foreground (do not detach).
    #[arg(short = 'f', long)]
    pub foreground: bool,
    /// Serve requests on one thread (over /dev/fuse, unless -o uring).
    #[arg(short = 's')]
    pub single_threaded: bool,
    /// Create (format) the pool with this size if it does not exist (K/M/G/T).
    #[arg(long, value_name = "SIZE")]
    pub create: Option<String>,
    /// Request-serving threads (default: twice the CPUs, 2 to 16).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Mount read-only (same as -o ro).
    #[arg(long)]
    pub read_only: bool,
    /// msync at every commit (same as -o msync).
    #[arg(long)]
    pub msync: bool,
    /// Daemon log file (its stderr; default: discarded). Ignored with -f.
    #[arg(long, value_name = "FILE")]
    pub log: Option<PathBuf>,
}

/// `ferrite umount MOUNTPOINT`.
#[derive(clap::Args, Debug, Clone)]
pub struct UmountArgs {
    /// Mount point.
    pub mountpoint: PathBuf,
    /// Detach now even if busy; the daemon finishes when the last file is closed.
    #[arg(short = 'l', long)]
    pub lazy: bool,
    /// Seconds to wait for the daemon to release the pool.
    #[arg(long, default_value_t = 60)]
    pub timeout: u64,
    /// Say what was done.
    #[arg(short = 'v', long)]
    pub verbose: bool,
}

/// mount(8) runs `ferrite SOURCE MOUNTPOINT -o OPTS` (through mount.fuse3, for type
/// `fuse.ferrite` or `fuse` with source `ferrite#SOURCE`); turn that into
/// `ferrite mount SOURCE MOUNTPOINT -o OPTS`. `is_command` recognises the program's
/// own subcommands, which are left alone.
pub fn rewrite_mount_helper_args(
    mut args: Vec<OsString>,
    is_command: impl Fn(&str) -> bool,
) -> Vec<OsString> {
    if args.len() >= 3 {
        let first = args[1].to_string_lossy().into_owned();
        let second = args[2].to_string_lossy().into_owned();
        if !first.starts_with('-')
            && !second.starts_with('-')
            && !is_command(&first)
            && first != "help"
        {
            args.insert(1, OsString::from("mount"));
        }
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn mount_helper_form_is_rewritten() {
        let cmd = |s: &str| ["mount", "umount", "mkfs", "ls"].contains(&s);
        assert_eq!(
            rewrite_mount_helper_args(v(&["ferrite", "/p.pool", "/mnt", "-o", "rw"]), cmd),
            v(&["ferrite", "mount", "/p.pool", "/mnt", "-o", "rw"])
        );
        for keep in [
            &["ferrite", "mount", "/p", "/m"][..],
            &["ferrite", "ls", "/x", "/y"],
            &["ferrite", "--help"],
            &["ferrite", "help", "mount"],
            &["ferrite", "x"],
            &["ferrite", "/p", "--version"],
        ] {
            assert_eq!(rewrite_mount_helper_args(v(keep), cmd), v(keep));
        }
    }

    #[test]
    fn mount_args_parse() {
        use clap::{Args, Command, FromArgMatches};
        let cmd = MountArgs::augment_args(Command::new("mount"));
        let m = cmd
            .try_get_matches_from([
                "mount",
                "/p",
                "/m",
                "-f",
                "-o",
                "ro,allow_other",
                "--create",
                "1G",
            ])
            .unwrap();
        let a = MountArgs::from_arg_matches(&m).unwrap();
        assert_eq!(a.paths, vec![PathBuf::from("/p"), PathBuf::from("/m")]);
        assert!(a.foreground);
        assert_eq!(a.options, vec!["ro,allow_other".to_string()]);
        assert_eq!(a.create.as_deref(), Some("1G"));
        let cmd = MountArgs::augment_args(Command::new("mount"));
        assert!(cmd.try_get_matches_from(["mount", "/a", "/b", "/c"]).is_err());
    }
}
