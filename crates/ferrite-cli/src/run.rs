//! `ferrite run [--mount DIR]... -- CMD [ARGS]`: run a command with the preload
//! library, so it reads and writes files on FerriteFS mounts without the kernel
//! (docs/DIRECT-ACCESS.md).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

/// `ferrite run`.
#[derive(clap::Args, Debug)]
#[command(trailing_var_arg = true)]
pub struct RunArgs {
    /// Give direct access on this mount only (may be repeated; default: every
    /// FerriteFS mount).
    #[arg(long = "mount", value_name = "DIR")]
    mounts: Vec<PathBuf>,
    /// Append each process's counts of direct and kernel calls to FILE (JSON lines).
    #[arg(long, value_name = "FILE")]
    stats: Option<PathBuf>,
    /// The preload library (default: found beside this program, or in ../lib).
    #[arg(long, env = "FERRITE_PRELOAD", value_name = "SO")]
    preload: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(required = true, value_name = "CMD")]
    cmd: Vec<std::ffi::OsString>,
}

const LIB: &str = "libferrite_preload.so";

/// Where the preload library is: beside this executable, or in ../lib of it.
pub fn find_preload() -> Option<PathBuf> {
    ferrite_direct::preload_library(&std::env::current_exe().ok()?)
}

pub fn run(a: &RunArgs) -> i32 {
    let lib = match a.preload.clone().or_else(find_preload) {
        Some(l) if l.is_file() => l,
        Some(l) => {
            eprintln!("ferrite run: {} is not a file", l.display());
            return 127;
        }
        None => {
            eprintln!(
                "ferrite run: {LIB} not found beside {} nor in ../lib (set FERRITE_PRELOAD)",
                std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default()
            );
            return 127;
        }
    };
    let mut mounts = Vec::new();
    for m in &a.mounts {
        let c = m.canonicalize().unwrap_or_else(|_| m.clone());
        if let Err(e) = ferrite_direct::info_of(&c) {
            eprintln!("ferrite run: {}: {e}; it will be used through the kernel", c.display());
        }
        mounts.push(c);
    }
    let preload = match std::env::var_os("LD_PRELOAD") {
        Some(old) if !old.is_empty() => {
            let mut v = lib.clone().into_os_string();
            v.push(":");
            v.push(old);
            v
        }
        _ => lib.clone().into_os_string(),
    };
    let mut cmd = std::process::Command::new(&a.cmd[0]);
    cmd.args(&a.cmd[1..]).env("LD_PRELOAD", preload);
    if !mounts.is_empty() {
        let joined = std::env::join_paths(&mounts).unwrap_or_default();
        cmd.env("FERRITE_MOUNTS", joined);
    }
    if let Some(s) = &a.stats {
        cmd.env("FERRITE_DIRECT_STATS", absolute(s));
    }
    let e = cmd.exec();
    eprintln!("ferrite run: {}: {e}", Path::new(&a.cmd[0]).display());
    if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf())
    }
}
