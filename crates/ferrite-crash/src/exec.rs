//! Running workload operations against a mounted FerriteFS, and reading a mounted
//! pool back as a canonical tree.
//!
//! Invariants:
//! - [`exec`] performs exactly one file system call for every operation except the
//!   lifecycle ones ([`Op::Remount`], [`Op::CrashRemount`]), which the driver owns.
//! - [`live_canon`] never panics on a damaged tree: a directory reachable twice, an
//!   unreadable inode or a runaway walk is an `Err` with a description.

use crate::model::{
    hash_bytes, hash_xattrs, pattern, split_path, CNode, Canon, MKind, Model, Op, RenameKind,
    XattrHow,
};
use ferrite_core::{
    Error, FallocMode, FileType, Fs, Medium, RenameFlags, SetAttr, SetTime, Shift, XattrSet,
};
use std::collections::{HashMap, HashSet};

/// Open handles of a running workload: handle number to inode.
pub type Handles = HashMap<u32, u64>;

fn resolve<M: Medium>(fs: &Fs<M>, path: &str) -> Result<u64, Error> {
    fs.resolve(path.as_bytes(), false)
}

fn parent<'p, M: Medium>(fs: &Fs<M>, path: &'p str) -> Result<(u64, &'p [u8]), Error> {
    let (d, n) = split_path(path);
    Ok((fs.resolve(d.as_bytes(), true)?, n.as_bytes()))
}

/// Run one non-lifecycle operation.
/// `Fs::clone_range`, with the byte count it returns checked: it is part of the
/// call's result, predicted from the source's size first (one operation runs at a
/// time on these files).
pub(crate) fn clone_checked<M: Medium>(
    fs: &Fs<M>,
    src: u64,
    off_in: u64,
    dst: u64,
    off_out: u64,
    len: u64,
) -> Result<(), Error> {
    let ssize = fs.getattr(src).map(|a| a.size).unwrap_or(0);
    let n = fs.clone_range(src, off_in, dst, off_out, len)?;
    let want = match len {
        0 => ssize.saturating_sub(off_in),
        l => l.min(ssize.saturating_sub(off_in)),
    };
    if n != want {
        return Err(Error::invalid(format!("clone returned {n} bytes, expected {want}")));
    }
    Ok(())
}

pub fn exec<M: Medium>(fs: &Fs<M>, op: &Op, handles: &mut Handles) -> Result<(), Error> {
    match op {
        Op::Create { path, perm } => {
            let (p, n) = parent(fs, path)?;
            fs.create(p, n, *perm, 0, 0).map(drop)
        }
        Op::Mkdir { path, perm } => {
            let (p, n) = parent(fs, path)?;
            fs.mkdir(p, n, *perm, 0, 0).map(drop)
        }
        Op::Symlink { path, target } => {
            let (p, n) = parent(fs, path)?;
            fs.symlink(p, n, target.as_bytes(), 0, 0).map(drop)
        }
        Op::Link { from, to } => {
            let s = resolve(fs, from)?;
            let (p, n) = parent(fs, to)?;
            fs.link(s, p, n).map(drop)
        }
        Op::Unlink { path } => {
            let (p, n) = parent(fs, path)?;
            fs.unlink(p, n)
        }
        Op::Rmdir { path } => {
            let (p, n) = parent(fs, path)?;
            fs.rmdir(p, n)
        }
        Op::Rename { from, to, kind } => {
            let (sp, sn) = parent(fs, from)?;
            let (dp, dn) = parent(fs, to)?;
            let flags = RenameFlags {
                noreplace: *kind == RenameKind::NoReplace,
                exchange: *kind == RenameKind::Exchange,
            };
            fs.rename(sp, sn, dp, dn, flags)
        }
        Op::Write { path, off, len, pat } => {
            let ino = resolve(fs, path)?;
            fs.write(ino, *off, &pattern(*pat, *off, *len)).map(drop)
        }
        Op::WriteHandle { handle, off, len, pat } => {
            let ino = *handles.get(handle).ok_or(Error::BadHandle)?;
            fs.write(ino, *off, &pattern(*pat, *off, *len)).map(drop)
        }
        Op::Append { path, len, pat } => {
            let ino = resolve(fs, path)?;
            // The offset is only known inside the call; the pattern depends on it, so
            // read the size first (workloads are single-threaded).
            let off = fs.getattr(ino)?.size;
            let at = fs.append(ino, &pattern(*pat, off, *len))?;
            if at != off {
                return Err(Error::invalid(format!("append landed at {at}, size was {off}")));
            }
            Ok(())
        }
        Op::Truncate { path, size } => {
            let ino = resolve(fs, path)?;
            fs.setattr(ino, &SetAttr { size: Some(*size), ..Default::default() }).map(drop)
        }
        Op::Fallocate { path, off, len, keep_size } => {
            let ino = resolve(fs, path)?;
            fs.fallocate(
                ino,
                FallocMode { keep_size: *keep_size, ..Default::default() },
                *off,
                *len,
            )
        }
        Op::Unshare { path, off, len, keep_size } => {
            let ino = resolve(fs, path)?;
            fs.fallocate(
                ino,
                FallocMode { unshare: true, keep_size: *keep_size, ..Default::default() },
                *off,
                *len,
            )
        }
        Op::Punch { path, off, len } => {
            let ino = resolve(fs, path)?;
            fs.fallocate(
                ino,
                FallocMode { keep_size: true, punch_hole: true, ..Default::default() },
                *off,
                *len,
            )
        }
        Op::Shift { path, off, len, insert } => {
            let ino = resolve(fs, path)?;
            let shift = if *insert { Shift::Insert } else { Shift::Collapse };
            fs.fallocate(ino, FallocMode { shift: Some(shift), ..Default::default() }, *off, *len)
        }
        Op::Clone { src, off_in, dst, off_out, len } => {
            let s = resolve(fs, src)?;
            let d = resolve(fs, dst)?;
            clone_checked(fs, s, *off_in, d, *off_out, *len)
        }
        Op::Chmod { path, perm } => {
            let ino = resolve(fs, path)?;
            fs.setattr(ino, &SetAttr { perm: Some(*perm), ..Default::default() }).map(drop)
        }
        Op::Chown { path, uid, gid } => {
            let ino = resolve(fs, path)?;
            fs.setattr(ino, &SetAttr { uid: Some(*uid), gid: Some(*gid), ..Default::default() })
                .map(drop)
        }
        Op::Utimens { path, atime, mtime } => {
            let ino = resolve(fs, path)?;
            let t = |x: &Option<ferrite_core::Ts>| Some(x.map_or(SetTime::Now, SetTime::At));
            fs.setattr(ino, &SetAttr { atime: t(atime), mtime: t(mtime), ..Default::default() })
                .map(drop)
        }
        Op::SetXattr { path, name, len, pat, how } => {
            let ino = resolve(fs, path)?;
            let how = match how {
                XattrHow::Any => XattrSet::Any,
                XattrHow::Create => XattrSet::Create,
                XattrHow::Replace => XattrSet::Replace,
            };
            fs.setxattr(ino, name.as_bytes(), &pattern(*pat, 0, *len), how)
        }
        Op::RemoveXattr { path, name } => {
            let ino = resolve(fs, path)?;
            fs.removexattr(ino, name.as_bytes())
        }
        Op::Open { path, handle } => {
            let ino = resolve(fs, path)?;
            fs.open(ino)?;
            handles.insert(*handle, ino);
            Ok(())
        }
        Op::Release { handle } => {
            let ino = handles.remove(handle).ok_or(Error::BadHandle)?;
            fs.release(ino)
        }
        Op::Fsync { path } => {
            let ino = resolve(fs, path)?;
            fs.fsync(ino, false)
        }
        Op::Compact { path } => {
            let ino = resolve(fs, path)?;
            fs.compact(ino)
        }
        Op::Remount | Op::CrashRemount => {
            Err(Error::invalid("lifecycle operation passed to exec (the driver runs it)"))
        }
    }
}

/// Most entries a canonical walk visits before it calls the tree runaway.
const WALK_LIMIT: usize = 100_000;

/// The visible tree of a mounted pool in canonical form.
pub fn live_canon<M: Medium>(fs: &Fs<M>, with_times: bool) -> Result<Canon, String> {
    let root = fs.root();
    let mut nodes = Vec::new();
    let mut first: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut dirs_seen: HashSet<u64> = HashSet::new();
    let mut stack: Vec<(Vec<u8>, u64)> = vec![(b"/".to_vec(), root)];
    while let Some((path, ino)) = stack.pop() {
        if nodes.len() >= WALK_LIMIT {
            return Err(format!("tree walk passed {WALK_LIMIT} entries (runaway tree)"));
        }
        let show = String::from_utf8_lossy(&path).into_owned();
        let a = fs.getattr(ino).map_err(|e| format!("getattr {show} (inode {ino}): {e}"))?;
        let mut xs = Vec::new();
        for name in fs.listxattr(ino).map_err(|e| format!("listxattr {show}: {e}"))? {
            let v = fs.getxattr(ino, &name).map_err(|e| format!("getxattr {show}: {e}"))?;
            xs.push((name, v));
        }
        xs.sort();
        let xattrs = hash_xattrs(xs.iter().map(|(k, v)| (k.as_slice(), v.as_slice())));
        let (kind, size, data) = match a.ftype {
            FileType::Directory => {
                if !dirs_seen.insert(ino) {
                    return Err(format!("directory inode {ino} reachable twice (at {show})"));
                }
                let mut ents = fs.list_dir(ino).map_err(|e| format!("readdir {show}: {e}"))?;
                ents.sort_by(|x, y| x.name.cmp(&y.name));
                for e in ents.into_iter().rev() {
                    let mut p = if path == b"/" { Vec::new() } else { path.clone() };
                    p.push(b'/');
                    p.extend_from_slice(&e.name);
                    stack.push((p, e.ino));
                }
                ('d', 0, hash_bytes(&[]))
            }
            FileType::Regular => {
                let d = fs.read_all(ino).map_err(|e| format!("read {show}: {e}"))?;
                if d.len() as u64 != a.size {
                    return Err(format!("{show}: read {} bytes but size is {}", d.len(), a.size));
                }
                ('f', a.size, hash_bytes(&d))
            }
            FileType::Symlink => {
                let t = fs.readlink(ino).map_err(|e| format!("readlink {show}: {e}"))?;
                ('l', t.len() as u64, hash_bytes(&t))
            }
            FileType::Fifo => ('p', 0, hash_bytes(&[])),
            FileType::Socket => ('s', 0, hash_bytes(&[])),
            FileType::CharDevice => ('c', 0, hash_bytes(&a.rdev.to_le_bytes())),
            FileType::BlockDevice => ('b', 0, hash_bytes(&a.rdev.to_le_bytes())),
        };
        let link_of = if kind == 'd' {
            None
        } else {
            match first.get(&ino) {
                Some(p) => Some(p.clone()),
                None => {
                    first.insert(ino, path.clone());
                    None
                }
            }
        };
        nodes.push(CNode {
            path,
            kind,
            perm: a.perm,
            uid: a.uid,
            gid: a.gid,
            nlink: a.nlink,
            size,
            data,
            xattrs,
            times: with_times.then_some([a.atime, a.mtime, a.ctime]),
            link_of,
        });
    }
    Ok(Canon { nodes })
}

/// Bind model nodes to inode numbers and copy their times from the running file
/// system (after an operation succeeded). An inode number that changed under a path
/// is a functional failure.
pub fn sync_from_live<M: Medium>(model: &mut Model, fs: &Fs<M>) -> Result<(), String> {
    let paths = model.paths();
    let mut inos: HashMap<u64, u64> = HashMap::new();
    for (path, id) in &paths {
        let ino = fs.resolve(path.as_bytes(), false).map_err(|e| format!("resolve {path}: {e}"))?;
        let n = model.nodes.get_mut(id).expect("model node");
        if n.ino == 0 {
            n.ino = ino;
        } else if n.ino != ino {
            return Err(format!("{path} is inode {ino} but the model bound it to {}", n.ino));
        }
        inos.insert(*id, ino);
    }
    let ids: Vec<u64> = model.nodes.keys().copied().collect();
    for id in ids {
        let n = model.nodes.get_mut(&id).expect("model node");
        if n.ino == 0 {
            return Err(format!("model node {id} was never bound to an inode"));
        }
        let a = fs.getattr(n.ino).map_err(|e| format!("getattr inode {}: {e}", n.ino))?;
        n.times = Some([a.atime, a.mtime, a.ctime]);
        if matches!(n.kind, MKind::File(_)) && a.ftype != FileType::Regular {
            return Err(format!("inode {} should be a regular file", n.ino));
        }
    }
    Ok(())
}
