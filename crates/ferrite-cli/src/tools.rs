//! Small tools for scripting and debugging: ls, stat, cat, put, mkdir, rm,
//! import and export of whole trees.

use crate::PoolArg;
use ferrite_core::{
    encode_rdev, Error, FileType, Fs, MapOptions, MmapMedium, MountOptions, NewNode, SetAttr,
    SetTime, Ts,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

type PoolFs = Fs<MmapMedium>;

fn open(pool: &PoolArg, read_only: bool) -> Result<PoolFs, String> {
    let m = MmapMedium::open(&pool.pool, &MapOptions { read_only, ..Default::default() })
        .map_err(|e| format!("{e} (format one with `ferrite mkfs {}`)", pool.pool.display()))?;
    Fs::mount(m, &MountOptions { read_only, ..Default::default() }).map_err(|e| e.to_string())
}

fn close(fs: PoolFs) -> Result<(), String> {
    fs.unmount().map(|_| ()).map_err(|e| e.to_string())
}

/// Run `f` on a mounted pool and unmount cleanly; map errors to exit code 1.
fn with_fs(
    cmd: &str,
    pool: &PoolArg,
    read_only: bool,
    f: impl FnOnce(&PoolFs) -> Result<(), String>,
) -> i32 {
    let fs = match open(pool, read_only) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("ferrite {cmd}: {e}");
            return 1;
        }
    };
    let r = f(&fs);
    let c = close(fs);
    match r.and(c) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ferrite {cmd}: {e}");
            1
        }
    }
}

fn err(path: &str) -> impl Fn(Error) -> String + '_ {
    move |e| format!("{path}: {e}")
}

#[derive(clap::Args)]
pub struct PathArgs {
    #[command(flatten)]
    pool: PoolArg,
    /// Path inside the pool.
    path: String,
}

#[derive(clap::Args)]
pub struct LsArgs {
    #[command(flatten)]
    pool: PoolArg,
    /// Long listing.
    #[arg(short)]
    long: bool,
    /// Directory inside the pool.
    #[arg(default_value = "/")]
    path: String,
}

fn type_char(t: FileType) -> char {
    match t {
        FileType::Regular => '-',
        FileType::Directory => 'd',
        FileType::Symlink => 'l',
        FileType::Fifo => 'p',
        FileType::CharDevice => 'c',
        FileType::BlockDevice => 'b',
        FileType::Socket => 's',
    }
}

fn perm_string(p: u32) -> String {
    let mut s = String::new();
    for shift in [6, 3, 0] {
        let b = (p >> shift) & 7;
        s.push(if b & 4 != 0 { 'r' } else { '-' });
        s.push(if b & 2 != 0 { 'w' } else { '-' });
        s.push(if b & 1 != 0 { 'x' } else { '-' });
    }
    s
}

pub fn ls(a: &LsArgs) -> i32 {
    with_fs("ls", &a.pool, true, |fs| {
        let ino = fs.resolve(a.path.as_bytes(), true).map_err(err(&a.path))?;
        let entries = fs.list_dir(ino).map_err(err(&a.path))?;
        let mut out = std::io::stdout().lock();
        for e in entries {
            let name = String::from_utf8_lossy(&e.name);
            if a.long {
                let at = fs.getattr(e.ino).map_err(err(&name))?;
                let target = if at.ftype == FileType::Symlink {
                    format!(
                        " -> {}",
                        String::from_utf8_lossy(&fs.readlink(e.ino).unwrap_or_default())
                    )
                } else {
                    String::new()
                };
                let _ = writeln!(
                    out,
                    "{}{} {:>3} {:>5} {:>5} {:>12} {}{}",
                    type_char(at.ftype),
                    perm_string(at.perm),
                    at.nlink,
                    at.uid,
                    at.gid,
                    at.size,
                    name,
                    target
                );
            } else {
                let _ = writeln!(out, "{name}");
            }
        }
        Ok(())
    })
}

pub fn stat(a: &PathArgs) -> i32 {
    with_fs("stat", &a.pool, true, |fs| {
        let ino = fs.resolve(a.path.as_bytes(), false).map_err(err(&a.path))?;
        let at = fs.getattr(ino).map_err(err(&a.path))?;
        let pages = fs.log_pages(ino).unwrap_or(0);
        println!("  File: {}", a.path);
        println!("  Type: {:?}   Inode: {}   Generation: {}", at.ftype, at.ino, at.generation);
        println!(
            "  Size: {}   Blocks: {}   Links: {}   Log pages: {}",
            at.size, at.blocks, at.nlink, pages
        );
        println!(
            "Access: ({:04o}/{}{})  Uid: {}  Gid: {}",
            at.perm,
            type_char(at.ftype),
            perm_string(at.perm),
            at.uid,
            at.gid
        );
        for (n, t) in [("Access", at.atime), ("Modify", at.mtime), ("Change", at.ctime)] {
            println!("{n}: {}.{:09}", t.sec, t.nsec);
        }
        Ok(())
    })
}

pub fn cat(a: &PathArgs) -> i32 {
    with_fs("cat", &a.pool, true, |fs| {
        let ino = fs.resolve(a.path.as_bytes(), true).map_err(err(&a.path))?;
        let mut out = std::io::stdout().lock();
        let mut buf = vec![0u8; 1 << 20];
        let mut off = 0u64;
        loop {
            let n = fs.read(ino, off, &mut buf).map_err(err(&a.path))?;
            if n == 0 {
                break;
            }
            out.write_all(&buf[..n]).map_err(|e| e.to_string())?;
            off += n as u64;
        }
        Ok(())
    })
}

#[derive(clap::Args)]
pub struct PutArgs {
    #[command(flatten)]
    pool: PoolArg,
    /// Host file ("-" for standard input).
    host: PathBuf,
    /// Destination path inside the pool.
    path: String,
}

pub fn put(a: &PutArgs) -> i32 {
    with_fs("put", &a.pool, false, |fs| {
        let mut data = Vec::new();
        if a.host.as_os_str() == "-" {
            std::io::stdin().read_to_end(&mut data).map_err(|e| e.to_string())?;
        } else {
            data = std::fs::read(&a.host).map_err(|e| format!("{}: {e}", a.host.display()))?;
        }
        fs.write_file(a.path.as_bytes(), &data, 0o644).map_err(err(&a.path))?;
        Ok(())
    })
}

pub fn mkdir(a: &PathArgs) -> i32 {
    with_fs("mkdir", &a.pool, false, |fs| {
        fs.mkdir_all(a.path.as_bytes(), 0o755).map_err(err(&a.path))?;
        Ok(())
    })
}

pub fn rm(a: &PathArgs) -> i32 {
    with_fs("rm", &a.pool, false, |fs| {
        let (p, name) = fs.resolve_parent(a.path.as_bytes()).map_err(err(&a.path))?;
        let ino = fs.lookup_ino(p, name).map_err(err(&a.path))?;
        let r = if fs.getattr(ino).map_err(err(&a.path))?.ftype == FileType::Directory {
            fs.rmdir(p, name)
        } else {
            fs.unlink(p, name)
        };
        r.map_err(err(&a.path))
    })
}

#[derive(clap::Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pool: PoolArg,
    /// Host directory to copy in.
    host: PathBuf,
    /// Destination directory in the pool (created).
    #[arg(default_value = "/")]
    path: String,
}

#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pool: PoolArg,
    /// Directory in the pool to copy out.
    path: String,
    /// Host directory to create / fill.
    host: PathBuf,
}

fn progress(total: u64, what: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn host_tree_bytes(p: &Path) -> u64 {
    let Ok(md) = std::fs::symlink_metadata(p) else { return 0 };
    if md.is_dir() {
        std::fs::read_dir(p)
            .map(|rd| rd.flatten().map(|e| host_tree_bytes(&e.path())).sum())
            .unwrap_or(0)
    } else {
        md.len()
    }
}

fn ts(sec: i64, nsec: i64) -> Ts {
    Ts { sec, nsec: nsec as u32 }
}

fn import_tree(fs: &PoolFs, host: &Path, dir: u64, pb: &ProgressBar) -> Result<u64, String> {
    let mut n = 0;
    let mut entries: Vec<_> = std::fs::read_dir(host)
        .map_err(|e| format!("{}: {e}", host.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", host.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let hp = e.path();
        let name = e.file_name();
        let name = name.as_bytes();
        let md = std::fs::symlink_metadata(&hp).map_err(|e| format!("{}: {e}", hp.display()))?;
        let ft = md.file_type();
        let herr = |e: Error| format!("{}: {e}", hp.display());
        let ino = if ft.is_dir() {
            let a = fs.mkdir(dir, name, md.mode() & 0o7777, md.uid(), md.gid()).map_err(herr)?;
            n += import_tree(fs, &hp, a.ino, pb)?;
            a.ino
        } else if ft.is_symlink() {
            let t = std::fs::read_link(&hp).map_err(|e| format!("{}: {e}", hp.display()))?;
            fs.symlink(dir, name, t.as_os_str().as_bytes(), md.uid(), md.gid()).map_err(herr)?.ino
        } else if ft.is_file() {
            let a = fs.create(dir, name, md.mode() & 0o7777, md.uid(), md.gid()).map_err(herr)?;
            let mut f = std::fs::File::open(&hp).map_err(|e| format!("{}: {e}", hp.display()))?;
            let mut buf = vec![0u8; 1 << 20];
            let mut off = 0u64;
            loop {
                let k = f.read(&mut buf).map_err(|e| format!("{}: {e}", hp.display()))?;
                if k == 0 {
                    break;
                }
                fs.write(a.ino, off, &buf[..k]).map_err(herr)?;
                off += k as u64;
                pb.inc(k as u64);
            }
            a.ino
        } else {
            // A FIFO, socket or device node.
            let Some(t) = FileType::from_mode(md.mode()) else {
                eprintln!("ferrite import: skipping {} (unknown type)", hp.display());
                continue;
            };
            let dev = md.rdev();
            let rdev = encode_rdev(rustix::fs::major(dev), rustix::fs::minor(dev));
            let (uid, gid) = (md.uid(), md.gid());
            let node = NewNode { parent: dir, name, dir: false, uid, gid };
            fs.mknod(node, t, md.mode() & 0o7777, rdev, 0).map_err(herr)?.ino
        };
        if !ft.is_symlink() {
            let ch = SetAttr {
                atime: Some(SetTime::At(ts(md.atime(), md.atime_nsec()))),
                mtime: Some(SetTime::At(ts(md.mtime(), md.mtime_nsec()))),
                ..Default::default()
            };
            fs.setattr(ino, &ch).map_err(|e| format!("{}: {e}", hp.display()))?;
        }
        n += 1;
    }
    Ok(n)
}

pub fn import(a: &ImportArgs) -> i32 {
    with_fs("import", &a.pool, false, |fs| {
        let dir = fs.mkdir_all(a.path.as_bytes(), 0o755).map_err(err(&a.path))?;
        let pb = progress(host_tree_bytes(&a.host), "import");
        let n = import_tree(fs, &a.host, dir, &pb)?;
        pb.finish_and_clear();
        println!("imported {n} entries from {} into {}", a.host.display(), a.path);
        Ok(())
    })
}

fn set_host_times(p: &Path, atime: Ts, mtime: Ts) -> std::io::Result<()> {
    let f = std::fs::File::options().write(true).open(p).or_else(|_| std::fs::File::open(p))?;
    let to = |t: Ts| std::time::UNIX_EPOCH + std::time::Duration::new(t.sec.max(0) as u64, t.nsec);
    f.set_times(std::fs::FileTimes::new().set_accessed(to(atime)).set_modified(to(mtime)))
}

fn export_tree(fs: &PoolFs, dir: u64, host: &Path, pb: &ProgressBar) -> Result<u64, String> {
    let mut n = 0;
    for e in fs.list_dir(dir).map_err(|e| e.to_string())? {
        let hp = host.join(std::ffi::OsStr::from_bytes(&e.name));
        let at = fs.getattr(e.ino).map_err(|e| e.to_string())?;
        let herr = |x: std::io::Error| format!("{}: {x}", hp.display());
        match at.ftype {
            FileType::Directory => {
                std::fs::create_dir(&hp).map_err(herr)?;
                n += export_tree(fs, e.ino, &hp, pb)?;
                std::fs::set_permissions(&hp, std::fs::Permissions::from_mode(at.perm))
                    .map_err(herr)?;
            }
            FileType::Symlink => {
                let t = fs.readlink(e.ino).map_err(|e| e.to_string())?;
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&t), &hp).map_err(herr)?;
            }
            FileType::Regular => {
                let mut f = std::fs::File::create(&hp).map_err(herr)?;
                let mut buf = vec![0u8; 1 << 20];
                let mut off = 0u64;
                loop {
                    let k = fs.read(e.ino, off, &mut buf).map_err(|e| e.to_string())?;
                    if k == 0 {
                        break;
                    }
                    f.write_all(&buf[..k]).map_err(herr)?;
                    off += k as u64;
                    pb.inc(k as u64);
                }
                drop(f);
                std::fs::set_permissions(&hp, std::fs::Permissions::from_mode(at.perm))
                    .map_err(herr)?;
            }
            t => {
                // A FIFO, socket or device node is made on the host as it is
                // (a device node needs CAP_MKNOD there, as cp -a would).
                use rustix::fs::FileType as H;
                let ht = match t {
                    FileType::Fifo => H::Fifo,
                    FileType::CharDevice => H::CharacterDevice,
                    FileType::BlockDevice => H::BlockDevice,
                    _ => H::Socket,
                };
                let (major, minor) = at.rdev_parts();
                let mode = rustix::fs::Mode::from_raw_mode(at.perm);
                rustix::fs::mknodat(
                    rustix::fs::CWD,
                    &hp,
                    ht,
                    mode,
                    rustix::fs::makedev(major, minor),
                )
                .map_err(|x| herr(x.into()))?;
                std::fs::set_permissions(&hp, std::fs::Permissions::from_mode(at.perm))
                    .map_err(herr)?;
            }
        }
        if at.ftype != FileType::Symlink {
            set_host_times(&hp, at.atime, at.mtime).map_err(herr)?;
        }
        n += 1;
    }
    Ok(n)
}

fn pool_tree_bytes(fs: &PoolFs, dir: u64) -> u64 {
    fs.list_dir(dir)
        .map(|v| {
            v.iter()
                .map(|e| match fs.getattr(e.ino) {
                    Ok(a) if a.ftype == FileType::Directory => pool_tree_bytes(fs, e.ino),
                    Ok(a) if a.ftype == FileType::Regular => a.size,
                    _ => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

pub fn export(a: &ExportArgs) -> i32 {
    with_fs("export", &a.pool, true, |fs| {
        let dir = fs.resolve(a.path.as_bytes(), true).map_err(err(&a.path))?;
        match std::fs::create_dir(&a.host) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && a.host.is_dir() => {}
            Err(e) => return Err(format!("{}: {e}", a.host.display())),
        }
        let pb = progress(pool_tree_bytes(fs, dir), "export");
        let n = export_tree(fs, dir, &a.host, &pb)?;
        pb.finish_and_clear();
        println!("exported {n} entries from {} to {}", a.path, a.host.display());
        Ok(())
    })
}
