//! `ferrite fsck`, `ferrite scrub`, `ferrite bmap` and `ferrite blocks`
//! (docs/INTEGRITY.md).
//!
//! Exit codes follow e2fsck: 0 clean, 1 errors corrected, 4 errors left, 8 an
//! operational error (no pool file, pool in use, I/O). Checks never write: fsck
//! checks a read-only view first, then (unless `-n`) mounts read-write, which
//! recovers a crash and rewrites a bad superblock copy from its twin, applies
//! `--repair`'s fixes, unmounts (a checkpoint rebuilt from the logs) and checks
//! again to decide between 1 and 4.

use ferrite_core::integrity::{check_pool, Finding, PoolReport};
use ferrite_core::{Error, Fs, MapOptions, MmapMedium, MountOptions};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct FsckArgs {
    /// Pool file.
    #[arg(default_value = crate::DEFAULT_POOL)]
    pool: PathBuf,
    /// JSON output.
    #[arg(long)]
    json: bool,
    /// Change nothing: check the pool as it is, read-only (a crashed pool is
    /// recovered in DRAM only).
    #[arg(long, short = 'n', conflicts_with = "repair")]
    no_repair: bool,
    /// Also repair what needs more than a mount: link counts, orphan inodes (to
    /// /lost+found), garbled idle journals, non-zero padding.
    #[arg(long, short = 'y')]
    repair: bool,
}

#[derive(clap::Args)]
pub struct ScrubArgs {
    /// Pool file (not in use; for a mounted pool, --mount).
    #[arg(default_value = crate::DEFAULT_POOL)]
    pool: PathBuf,
    /// Scrub the pool mounted at this directory, while it stays in use: the data
    /// pages and log entries of every file, checked as a direct-access client of
    /// the daemon (under each file's lock).
    #[arg(long, value_name = "DIR")]
    mount: Option<PathBuf>,
    /// JSON output.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct BmapArgs {
    /// File in the pool.
    path: String,
    #[command(flatten)]
    pool: crate::PoolArg,
    /// JSON output.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
pub struct BlocksArgs {
    /// Pool file.
    #[arg(default_value = crate::DEFAULT_POOL)]
    pool: PathBuf,
    /// JSON output.
    #[arg(long)]
    json: bool,
}

/// Open `pool` read-only, or say why not (exit 8).
fn open_ro(cmd: &str, pool: &Path) -> Result<MmapMedium, i32> {
    MmapMedium::open(pool, &MapOptions { read_only: true, ..Default::default() }).map_err(|e| {
        match e {
            Error::PoolInUse { holder, .. } => eprintln!(
                "ferrite {cmd}: {} is in use ({holder}); a mounted pool is checked through its \
                 mount (reads verify every block they touch: mount with -o verify=always), \
                 `ferrite scrub --mount` is not implemented; unmount it to check it here",
                pool.display()
            ),
            e => eprintln!("ferrite {cmd}: {}: {e}", pool.display()),
        }
        8
    })
}

/// A progress callback: an indicatif bar on a terminal, nothing otherwise.
fn progress(what: &str) -> (Option<ProgressBar>, impl FnMut(u64, u64)) {
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::new(1);
        b.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} inodes")
                .expect("valid template"),
        );
        b.set_message(what.to_string());
        b
    });
    let b2 = bar.clone();
    (bar, move |done: u64, total: u64| {
        if let Some(b) = &b2 {
            b.set_length(total);
            b.set_position(done);
        }
    })
}

/// Findings a crash explains (the mount recovers them), on a pool not cleanly
/// unmounted.
fn drop_crash_states(r: &mut PoolReport) {
    if !r.clean_unmount {
        r.findings.retain(|f| !f.what.contains("torn") && !f.what.contains("unreachable"));
    }
}

fn check(cmd: &str, pool: &Path) -> Result<PoolReport, i32> {
    let m = open_ro(cmd, pool)?;
    let (_bar, mut cb) = progress(cmd);
    let (mut r, _) = check_pool(m, &mut cb);
    drop_crash_states(&mut r);
    Ok(r)
}

fn print_findings(prefix: &str, f: &[Finding]) {
    for x in f {
        println!("{prefix}: {x}");
    }
}

pub fn fsck(a: &FsckArgs) -> i32 {
    let first = match check("fsck", &a.pool) {
        Ok(r) => r,
        Err(c) => return c,
    };
    if let Some(w) = crate::admin::access_warning(&a.pool) {
        eprintln!("ferrite fsck: warning: {w}");
    }
    // A cleanly unmounted pool's damaged inode slots come back from their replicas
    // before anything mounts it (a damaged root slot would stop the mount).
    let mut done = Vec::new();
    let mut now = None;
    if !a.no_repair && !first.is_clean() {
        match MmapMedium::open(&a.pool, &MapOptions::default()) {
            Ok(m) => done = ferrite_core::integrity::repair_replicas_raw(&m),
            Err(e) => {
                eprintln!("ferrite fsck: {}: {e}", a.pool.display());
                return 8;
            }
        }
        if !done.is_empty() {
            now = match check("fsck", &a.pool) {
                Ok(r) => Some(r),
                Err(c) => return c,
            };
        }
    }
    let now = now.as_ref().unwrap_or(&first);
    let fatal = now.findings.iter().any(|f| !f.repairable) && !now.mounted;
    if a.no_repair || fatal {
        let code = if first.is_clean() { 0 } else { 4 };
        report(a, &first, &done, &now.findings, code);
        if fatal && !a.json {
            for f in &now.findings {
                eprintln!("ferrite fsck: {}: {f}", a.pool.display());
            }
        }
        return code;
    }
    // Read-write: the mount recovers a crash and rewrites a bad superblock copy.
    let m = match MmapMedium::open(&a.pool, &MapOptions::default()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("ferrite fsck: {}: {e}", a.pool.display());
            return 8;
        }
    };
    let fs = match Fs::mount(m, &MountOptions::default()) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("ferrite fsck: {}: {e}", a.pool.display());
            report(a, &first, &[], &first.findings, 4);
            return if matches!(e, Error::Io { .. }) { 8 } else { 4 };
        }
    };
    let mount = fs.mount_report().clone();
    if !mount.clean {
        done.push(format!(
            "recovered after a crash: {} journal(s) rolled back, {} torn log(s) cut, {} orphan(s) \
             freed",
            mount.journals_rolled_back, mount.torn_logs, mount.orphans_freed
        ));
    }
    if a.repair {
        match fs.repair() {
            Ok(d) => done.extend(d),
            Err(e) => {
                eprintln!("ferrite fsck: repair: {e}");
                let _ = fs.unmount();
                return 8;
            }
        }
    }
    if let Err(e) = fs.unmount() {
        eprintln!("ferrite fsck: unmount: {e}");
        return 8;
    }
    let second = match check("fsck", &a.pool) {
        Ok(r) => r,
        Err(c) => return c,
    };
    let code = match (first.is_clean(), second.is_clean()) {
        (true, true) => 0,
        (false, true) => 1,
        _ => 4,
    };
    report(a, &first, &done, &second.findings, code);
    if code == 4 && !a.repair && second.findings.iter().any(|f| f.region.name() == "tree") {
        eprintln!("ferrite fsck: run `ferrite fsck --repair` to fix link counts and orphans");
    }
    code
}

fn report(a: &FsckArgs, first: &PoolReport, done: &[String], left: &[Finding], code: i32) {
    if a.json {
        let v = serde_json::json!({
            "clean": code == 0,
            "exit": code,
            "found": first.findings,
            "repaired": done,
            "left": left,
            "report": first.fsck,
            "data_pages_checked": first.pages_checked,
            "data_pages_unchecked": first.pages_unchecked,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("serialisable"));
        return;
    }
    print_findings("error", &first.findings);
    for d in done {
        println!("repaired: {d}");
    }
    if code != 0 && !done.is_empty() {
        print_findings("left", left);
    }
    let r = first.fsck.clone().unwrap_or_default();
    println!(
        "{}: {} inodes ({} files, {} dirs, {} symlinks, {} special), {} log entries in {} pages, \
         {} data blocks ({} pages checked): {}",
        a.pool.display(),
        r.inodes,
        r.files,
        r.dirs,
        r.symlinks,
        r.special,
        r.entries,
        r.log_pages,
        r.data_blocks,
        first.pages_checked,
        match code {
            0 => "clean".to_string(),
            1 => format!("{} error(s) corrected", first.findings.len()),
            _ => format!("{} error(s) left", left.len().max(1)),
        }
    );
}

/// The live data check of the pool mounted at `dir`, as a direct-access client.
fn check_mounted(dir: &Path) -> Result<PoolReport, i32> {
    let client = ferrite_direct::Client::attach(dir).map_err(|e| {
        eprintln!("ferrite scrub: {}: {e}", dir.display());
        if matches!(e, ferrite_direct::AttachError::NotOffered(_)) {
            eprintln!(
                "ferrite scrub: --mount needs a FerriteFS mount that offers direct access                  (not -o nodirect, read-only or writeback_cache); otherwise unmount and run                  `ferrite scrub POOL`"
            );
        }
        8
    })?;
    let (_bar, mut cb) = progress("scrub");
    let mut d = client.fs().check_data_live(&mut cb);
    if let Ok(d) = &mut d {
        for fd in &mut d.findings {
            fd.path = fd.ino.and_then(|i| client.fs().path_of(i));
        }
    }
    client.detach();
    let d = d.map_err(|e| {
        eprintln!("ferrite scrub: {}: {e}", dir.display());
        8
    })?;
    Ok(PoolReport {
        findings: d.findings,
        mounted: true,
        pages_checked: d.pages_checked,
        pages_unchecked: d.pages_unchecked,
        ..Default::default()
    })
}

pub fn scrub(a: &ScrubArgs) -> i32 {
    let (r, name) = match &a.mount {
        Some(dir) => (check_mounted(dir), dir),
        None => (check("scrub", &a.pool), &a.pool),
    };
    let r = match r {
        Ok(r) => r,
        Err(c) => return c,
    };
    let code = if r.is_clean() { 0 } else { 4 };
    if a.json {
        let v = serde_json::json!({
            "clean": r.is_clean(),
            "damage": r.findings,
            "data_pages_checked": r.pages_checked,
            "data_pages_unchecked": r.pages_unchecked,
        });
        println!("{}", serde_json::to_string_pretty(&v).expect("serialisable"));
    } else {
        print_findings("damage", &r.findings);
        println!(
            "{}: {} data pages checked, {} without checksums: {}",
            name.display(),
            r.pages_checked,
            r.pages_unchecked,
            if r.is_clean() { "clean".into() } else { format!("{} damaged", r.findings.len()) }
        );
    }
    code
}

fn mount_ro(cmd: &str, pool: &Path) -> Result<Fs<MmapMedium>, i32> {
    let m = open_ro(cmd, pool)?;
    Fs::mount(m, &MountOptions { read_only: true, ..Default::default() }).map_err(|e| {
        eprintln!("ferrite {cmd}: {}: {e}", pool.display());
        4
    })
}

pub fn bmap(a: &BmapArgs) -> i32 {
    let fs = match mount_ro("bmap", &a.pool.pool) {
        Ok(fs) => fs,
        Err(c) => return c,
    };
    let ext = fs.resolve(a.path.as_bytes(), true).and_then(|ino| Ok((ino, fs.bmap(ino)?)));
    let (ino, ext) = match ext {
        Ok(x) => x,
        Err(e) => {
            eprintln!("ferrite bmap: {}: {e}", a.path);
            return 1;
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&ext).expect("serialisable"));
    } else {
        let numa = fs.topology().nodes() > 1;
        println!("{:>14} {:>14} {:>10}  kind", "file_offset", "pool_offset", "len");
        for e in &ext {
            let kind = match e.kind {
                ferrite_core::inspect::ExtentKind::Data => "data",
                ferrite_core::inspect::ExtentKind::Embedded => "embedded",
            };
            let node = match e.kind {
                ferrite_core::inspect::ExtentKind::Data if numa => {
                    format!(" (node {})", fs.block_node(e.pool_offset / 4096))
                }
                _ => String::new(),
            };
            println!("{:>14} {:>14} {:>10}  {kind}{node}", e.file_offset, e.pool_offset, e.len);
        }
        println!("{}: {} extent(s)", a.path, ext.len());
        if numa {
            // NUMA placement: data pages per node (FERRITE_NUMA_NODES simulates).
            if let Ok(per) = fs.placement(ino) {
                println!("{}: data pages per node: {per:?}", a.path);
            }
        }
    }
    0
}

pub fn blocks(a: &BlocksArgs) -> i32 {
    let fs = match mount_ro("blocks", &a.pool) {
        Ok(fs) => fs,
        Err(c) => return c,
    };
    let list = fs.block_owners();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&list).expect("serialisable"));
    } else {
        for r in &list {
            let who = match (r.ino, r.file_offset) {
                (Some(i), Some(o)) => format!(" inode {i} at byte {o}"),
                (Some(i), None) => format!(" inode {i}"),
                _ => String::new(),
            };
            println!("{:>10}+{:<8} {}{who}", r.start, r.len, r.owner);
        }
    }
    0
}
