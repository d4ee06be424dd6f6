//! `ferrite`: format, inspect, check and use FerriteFS pools.
#![forbid(unsafe_code)]

mod admin;
mod integrity;
mod run;
mod tools;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// Default pool, so a first run needs no setup.
pub const DEFAULT_POOL: &str = "/dev/shm/ferrite.pool";

#[derive(Parser)]
#[command(
    name = "ferrite",
    version,
    about = "FerriteFS: a persistent-memory file system in user space"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where the path tools find their pool.
#[derive(clap::Args, Clone, Debug)]
pub struct PoolArg {
    /// Pool file.
    #[arg(long, env = "FERRITE_POOL", default_value = DEFAULT_POOL)]
    pub pool: PathBuf,
}

#[derive(Subcommand)]
enum Cmd {
    /// Format a pool file.
    Mkfs(admin::MkfsArgs),
    /// Show a pool's geometry, durability mode, usage and state.
    Info(admin::InfoArgs),
    /// Check every invariant and checksum of a pool; repair with --repair (exit 0 clean,
    /// 1 errors corrected, 4 errors left, 8 operational error).
    Fsck(integrity::FsckArgs),
    /// Verify every checksum of an unmounted pool (superblocks, journals, checkpoint,
    /// inode slots, log entries, data); names damaged files (exit 0 clean, 4 damage
    /// found, 8 operational error).
    Scrub(integrity::ScrubArgs),
    /// Print a file's extents: data blocks and bytes embedded in log entries.
    Bmap(integrity::BmapArgs),
    /// List every used block range of a pool with its owner.
    Blocks(integrity::BlocksArgs),
    /// Convert a pool of an older format version (1 to 6) to this build's (7), in place
    /// (a pool older than version 5 stays without metadata replicas: those need a new
    /// pool).
    Upgrade(admin::UpgradeArgs),
    /// List a directory.
    Ls(tools::LsArgs),
    /// Show attributes of a path.
    Stat(tools::PathArgs),
    /// Print a file.
    Cat(tools::PathArgs),
    /// Copy a host file into the pool.
    Put(tools::PutArgs),
    /// Make a directory (and parents).
    Mkdir(tools::PathArgs),
    /// Remove a file, symlink or empty directory.
    Rm(tools::PathArgs),
    /// Copy a host directory tree into the pool.
    Import(tools::ImportArgs),
    /// Copy a pool directory tree out to the host.
    Export(tools::ExportArgs),
    /// Mount a pool with FUSE (creating it with --create SIZE); see docs/FUSE.md.
    Mount(ferrite_fuse::MountArgs),
    /// Run a command with direct access to FerriteFS mounts (the preload library);
    /// see docs/DIRECT-ACCESS.md.
    Run(run::RunArgs),
    /// Unmount a FUSE mount and wait until its daemon has released the pool.
    Umount(ferrite_fuse::UmountArgs),
    /// Benchmark FerriteFS against tmpfs, ext4, its FUSE mount and the hardware limit;
    /// see docs/BENCHMARKS.md.
    Bench(Box<ferrite_bench::BenchArgs>),
    /// Crash-consistency simulator: crash states at every fence, recovered and checked
    /// against a model; fault injection; real process kills. See docs/CRASH-SIMULATOR.md.
    Crashtest(ferrite_crash::CrashArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse_from(rewrite_mount_helper_args(std::env::args_os().collect()));
    let code = match cli.cmd {
        Cmd::Mkfs(a) => admin::mkfs(&a),
        Cmd::Info(a) => admin::info(&a),
        Cmd::Fsck(a) => integrity::fsck(&a),
        Cmd::Scrub(a) => integrity::scrub(&a),
        Cmd::Bmap(a) => integrity::bmap(&a),
        Cmd::Blocks(a) => integrity::blocks(&a),
        Cmd::Upgrade(a) => admin::upgrade(&a),
        Cmd::Ls(a) => tools::ls(&a),
        Cmd::Stat(a) => tools::stat(&a),
        Cmd::Cat(a) => tools::cat(&a),
        Cmd::Put(a) => tools::put(&a),
        Cmd::Mkdir(a) => tools::mkdir(&a),
        Cmd::Rm(a) => tools::rm(&a),
        Cmd::Import(a) => tools::import(&a),
        Cmd::Export(a) => tools::export(&a),
        Cmd::Mount(a) => ferrite_fuse::run_mount(&a),
        Cmd::Run(a) => run::run(&a),
        Cmd::Umount(a) => ferrite_fuse::run_umount(&a),
        Cmd::Bench(a) => ferrite_bench::run(&a),
        Cmd::Crashtest(a) => ferrite_crash::run(&a),
    };
    ExitCode::from(code as u8)
}

/// mount(8) runs `ferrite SOURCE MOUNTPOINT -o OPTS` (through mount.fuse3 for type
/// `fuse.ferrite`); turn that into `ferrite mount SOURCE MOUNTPOINT -o OPTS`.
fn rewrite_mount_helper_args(args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    use clap::CommandFactory;
    let cmd = Cli::command();
    ferrite_fuse::rewrite_mount_helper_args(args, |s| {
        cmd.get_subcommands().any(|c| c.get_name() == s || c.get_all_aliases().any(|a| a == s))
    })
}
