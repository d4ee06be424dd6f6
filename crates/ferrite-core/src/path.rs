//! Path resolution and whole-file helpers for the CLI, tests and tools.

use crate::error::{Error, Result};
use crate::fs::{Attr, Fs};
use crate::index::FileType;
use crate::pmem::Medium;

/// Symlinks followed before ELOOP.
pub const MAX_SYMLINKS: usize = 40;

impl<M: Medium> Fs<M> {
    /// Resolve an absolute (or root-relative) path. `follow`: follow a final symlink.
    /// A trailing slash names a directory, as in Linux's path walk: the final
    /// symlink is then followed, and anything but a directory is `NotDir`.
    pub fn resolve(&self, path: &[u8], follow: bool) -> Result<u64> {
        let mut budget = MAX_SYMLINKS;
        let slash = trailing_slash(path);
        let (ino, ftype) = self.resolve_from(self.root(), path, follow || slash, &mut budget)?;
        if slash && self.walked_type(ino, ftype)? != FileType::Directory {
            return Err(Error::NotDir);
        }
        Ok(ino)
    }

    /// The type of `ino`, which a walk reached: as the walk's last directory entry
    /// recorded it (`ftype`), or, after a walk without one (the root, a link to
    /// "/"), the inode's.
    fn walked_type(&self, ino: u64, ftype: Option<FileType>) -> Result<FileType> {
        match ftype {
            Some(t) => Ok(t),
            None => Ok(self.inode(ino)?.ftype_now()),
        }
    }

    /// What a trailing slash on the name a call acts on (`path`, whose last
    /// component is `name` in `parent`) makes of the call, before it runs: "x/"
    /// names a directory, as in Linux. Nothing without a slash.
    pub fn check_slash(
        &self,
        path: &[u8],
        parent: u64,
        name: &[u8],
        call: SlashCall,
    ) -> Result<()> {
        if !trailing_slash(path) {
            return Ok(());
        }
        let found = match self.lookup_ino(parent, name) {
            Ok(ino) => Some(ino),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        match (call, found) {
            // mknod, symlink, link: the name exists, or a directory was asked for.
            (SlashCall::Make, Some(_)) => Err(Error::Exists),
            (SlashCall::Make, None) => Err(Error::NotFound),
            (SlashCall::Unlink, None) => Err(Error::NotFound),
            // unlink: a directory (a symlink to one too: the slash follows it) is
            // EISDIR, anything else ENOTDIR.
            (SlashCall::Unlink, Some(_)) => self.resolve(path, true).and(Err(Error::IsDir)),
        }
    }

    /// What trailing slashes make of rename(`from`, `to`), whose source is `sn` in
    /// `sp` and whose destination's name is `dn`, before it runs: a slash on either
    /// path asks for a directory, so the source must be one itself (not followed).
    /// "." and ".." are left to the rename, which refuses them with EBUSY first.
    pub fn check_rename_slash(
        &self,
        from: &[u8],
        to: &[u8],
        sp: u64,
        sn: &[u8],
        dn: &[u8],
    ) -> Result<()> {
        let dots = |n: &[u8]| n == b"." || n == b"..";
        if dots(sn) || dots(dn) || !(trailing_slash(from) || trailing_slash(to)) {
            return Ok(());
        }
        let ino = self.lookup_ino(sp, sn)?;
        if self.getattr(ino)?.ftype == FileType::Directory {
            Ok(())
        } else {
            Err(Error::NotDir)
        }
    }

    /// The walk of [`Fs::resolve`] from `start`: the inode, and its type as the
    /// directory entry of the walk's last step records it (`None` for a path
    /// without a component, which names `start` or the root).
    fn resolve_from(
        &self,
        start: u64,
        path: &[u8],
        follow: bool,
        budget: &mut usize,
    ) -> Result<(u64, Option<FileType>)> {
        let mut cur = if path.first() == Some(&b'/') { self.root() } else { start };
        let mut ftype = None;
        let mut comps = path.split(|&c| c == b'/').filter(|c| !c.is_empty()).peekable();
        while let Some(c) = comps.next() {
            let last = comps.peek().is_none();
            // A step reads the directory once: the entry gives the inode and its type
            // (`NotDir` when `cur` is not a directory).
            let (next, t) = self.lookup_entry(cur, c)?;
            if t == Some(FileType::Symlink) && (!last || follow) {
                if *budget == 0 {
                    return Err(Error::Loop);
                }
                *budget -= 1;
                let target = self.readlink(next)?;
                (cur, ftype) = self.resolve_from(cur, &target, true, budget)?;
            } else {
                (cur, ftype) = (next, t);
            }
        }
        Ok((cur, ftype))
    }

    /// Split a path into (parent inode, final name).
    pub fn resolve_parent<'p>(&self, path: &'p [u8]) -> Result<(u64, &'p [u8])> {
        let trimmed = {
            let mut p = path;
            while p.len() > 1 && p.last() == Some(&b'/') {
                p = &p[..p.len() - 1];
            }
            p
        };
        let (dir, name) = match trimmed.iter().rposition(|&c| c == b'/') {
            Some(i) => (&trimmed[..i.max(1)], &trimmed[i + 1..]),
            None => (&b"/"[..], trimmed),
        };
        if name.is_empty() {
            return Err(Error::invalid("path names the root"));
        }
        // The walk to the parent fails as Linux's does: "f/x" with f a file is
        // ENOTDIR before anything about x (or another path of the call) is asked.
        let mut budget = MAX_SYMLINKS;
        let (parent, ftype) = self.resolve_from(self.root(), dir, true, &mut budget)?;
        if self.walked_type(parent, ftype)? != FileType::Directory {
            return Err(Error::NotDir);
        }
        Ok((parent, name))
    }

    /// Attributes at a path (following symlinks).
    pub fn stat_path(&self, path: &[u8]) -> Result<Attr> {
        self.getattr(self.resolve(path, true)?)
    }

    /// Create directories along `path` as needed.
    pub fn mkdir_all(&self, path: &[u8], perm: u32) -> Result<u64> {
        let mut cur = self.root();
        for c in path.split(|&c| c == b'/').filter(|c| !c.is_empty()) {
            cur = match self.lookup_ino(cur, c) {
                Ok(i) => i,
                Err(Error::NotFound) => self.mkdir(cur, c, perm, 0, 0)?.ino,
                Err(e) => return Err(e),
            };
        }
        Ok(cur)
    }

    /// Whole contents of the file at `ino`.
    pub fn read_all(&self, ino: u64) -> Result<Vec<u8>> {
        let a = self.getattr(ino)?;
        // A (sparse) file can be far larger than memory: fail, do not abort.
        let mut v = Vec::new();
        usize::try_from(a.size)
            .ok()
            .and_then(|n| v.try_reserve_exact(n).ok().map(|_| n))
            .map(|n| v.resize(n, 0))
            .ok_or(Error::FileTooBig)?;
        let n = self.read(ino, 0, &mut v)?;
        v.truncate(n);
        Ok(v)
    }

    /// Create (or truncate) the file at `path` and write `data` to it.
    pub fn write_file(&self, path: &[u8], data: &[u8], perm: u32) -> Result<u64> {
        let (p, name) = self.resolve_parent(path)?;
        let ino = match self.lookup_ino(p, name) {
            Ok(i) => {
                self.setattr(i, &crate::fs::SetAttr { size: Some(0), ..Default::default() })?;
                i
            }
            Err(Error::NotFound) => self.create(p, name, perm, 0, 0)?.ino,
            Err(e) => return Err(e),
        };
        const CHUNK: usize = 1 << 20;
        let mut off = 0;
        while off < data.len() {
            let n = (data.len() - off).min(CHUNK);
            self.write(ino, off as u64, &data[off..off + n])?;
            off += n;
        }
        Ok(ino)
    }
}

/// A path ends in a slash after a name ("d/", not "/").
fn trailing_slash(path: &[u8]) -> bool {
    path.last() == Some(&b'/') && path.iter().any(|&c| c != b'/')
}

/// The calls [`Fs::check_slash`] judges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlashCall {
    /// mknod, symlink, link (mkdir takes a trailing slash).
    Make,
    /// unlink (rmdir takes one).
    Unlink,
}

/// open(2) flags understood by [`Fs::open_path`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpenFlags {
    /// O_CREAT
    pub create: bool,
    /// O_EXCL (with create)
    pub excl: bool,
    /// O_TRUNC
    pub truncate: bool,
    /// O_DIRECTORY
    pub directory: bool,
    /// O_NOFOLLOW
    pub nofollow: bool,
    /// The caller will write (O_WRONLY / O_RDWR).
    pub write: bool,
    /// Owner of a file O_CREAT makes (the caller's effective user; default root).
    pub uid: u32,
    /// Group of a file O_CREAT makes (the caller's effective group, unless the
    /// directory is set-group-id).
    pub gid: u32,
}

impl<M: Medium> Fs<M> {
    /// open(2) on a path: resolve (creating with `perm` under O_CREAT), apply
    /// O_EXCL / O_TRUNC / O_DIRECTORY / O_NOFOLLOW, and take an open handle
    /// (release it with [`Fs::release`]). Returns the file's attributes.
    pub fn open_path(&self, path: &[u8], flags: OpenFlags, perm: u32) -> Result<Attr> {
        // With O_CREAT, open(2) either creates the name or opens what it names, so a
        // name another thread creates or removes between our steps is looked up
        // again (bounded) instead of failing with EEXIST or ENOENT.
        for _ in 0..1024 {
            if let Some(a) = self.open_path_once(path, flags, perm)? {
                return Ok(a);
            }
            std::thread::yield_now(); // let the other side finish its operation
        }
        Err(Error::Busy)
    }

    /// One attempt of [`Fs::open_path`]; `None`: with O_CREAT, the name changed
    /// under us.
    fn open_path_once(&self, path: &[u8], flags: OpenFlags, perm: u32) -> Result<Option<Attr>> {
        let raced = flags.create;
        let found = if flags.create {
            // O_CREAT with a trailing slash is EISDIR, whatever the name is (Linux).
            if trailing_slash(path) {
                return Err(Error::IsDir);
            }
            let (p, name) = self.resolve_parent(path)?;
            // The entry's type says whether it is a symlink; an inode freed after
            // the lookup fails `open` below, and the attempt is repeated.
            match self.lookup_typed(p, name) {
                Ok((ino, symlink)) => {
                    if flags.excl {
                        return Err(Error::Exists);
                    }
                    if symlink && !flags.nofollow {
                        // O_CREAT follows a final symlink to an existing target.
                        self.resolve(path, true)?
                    } else {
                        ino
                    }
                }
                Err(Error::NotFound) => match self.create(p, name, perm, flags.uid, flags.gid) {
                    Ok(a) => a.ino,
                    Err(Error::Exists) if !flags.excl => return Ok(None),
                    Err(e) => return Err(e),
                },
                Err(e) => return Err(e),
            }
        } else {
            self.resolve(path, !flags.nofollow)?
        };
        // The handle first: `open` returns the attributes the checks below need (a
        // `getattr` before it looked the inode up a second time), and a refusal
        // gives the handle back.
        let a = match self.open(found) {
            Err(Error::NotFound) if raced => return Ok(None),
            r => r?,
        };
        // A refusal reports the refusal, not an error of the release behind it.
        let refuse = |e: Error| {
            let _ = self.release(found);
            Err(e)
        };
        match a.ftype {
            FileType::Symlink if flags.nofollow => return refuse(Error::Loop),
            FileType::Directory if flags.write || flags.truncate => return refuse(Error::IsDir),
            FileType::Directory => {}
            _ if flags.directory => return refuse(Error::NotDir),
            // The kernel runs FIFOs, sockets and devices: a process that opens one
            // through the mount gets them; the library has none to give.
            t if t.is_special() => return refuse(Error::SpecialFile),
            _ => {}
        }
        // O_TRUNC truncates whatever the access mode, as Linux's open(2) does (it
        // asks for write permission instead; POSIX leaves O_RDONLY | O_TRUNC open).
        if flags.truncate && a.ftype == FileType::Regular && a.size > 0 {
            let t = crate::fs::SetAttr { size: Some(0), ..Default::default() };
            return match self.setattr(found, &t) {
                Ok(a) => Ok(Some(a)),
                Err(Error::NotFound) if raced => {
                    self.release(found)?;
                    Ok(None)
                }
                Err(e) => refuse(e),
            };
        }
        Ok(Some(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::MkfsOptions;
    use crate::sim::SimMedium;

    /// `resolve_parent` and a trailing slash in `resolve` take the type from the
    /// walk's last directory entry (since 2026-12-02; they read the inode
    /// before). This pins the behaviour that must keep, not where the type comes
    /// from: a symlink to a directory is followed to it, one to a file or to
    /// nothing is refused, and a walk without an entry (the root, a link to "/")
    /// is a directory.
    #[test]
    fn resolve_parent_types_the_parent_as_the_walk_finds_it() {
        let fs = Fs::mkfs(SimMedium::new(32 << 20), &MkfsOptions::default()).unwrap();
        let root = fs.root();
        let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
        fs.create(root, b"f", 0o644, 0, 0).unwrap();
        fs.symlink(root, b"ld", b"d", 0, 0).unwrap();
        fs.symlink(root, b"lf", b"/f", 0, 0).unwrap();
        fs.symlink(root, b"lr", b"/", 0, 0).unwrap();
        fs.symlink(root, b"dangling", b"nothing", 0, 0).unwrap();
        let ok = |p: &[u8], want: u64| {
            let (parent, name) = fs.resolve_parent(p).unwrap();
            assert_eq!((parent, name), (want, &b"x"[..]), "{}", String::from_utf8_lossy(p));
        };
        ok(b"/x", root);
        ok(b"x", root);
        ok(b"/d/x", d);
        ok(b"/d//x", d);
        ok(b"/ld/x", d);
        ok(b"/lr/x", root);
        ok(b"/d/../x", root);
        ok(b"/d/./x", d);
        let err = |p: &[u8]| fs.resolve_parent(p).unwrap_err();
        assert!(matches!(err(b"/f/x"), Error::NotDir));
        assert!(matches!(err(b"/lf/x"), Error::NotDir));
        assert!(matches!(err(b"/dangling/x"), Error::NotFound));
        assert!(matches!(err(b"/none/x"), Error::NotFound));
        assert!(matches!(err(b"/f/y/x"), Error::NotDir));
        // A trailing slash asks for a directory the same way.
        assert_eq!(fs.resolve(b"/ld/", false).unwrap(), d);
        assert_eq!(fs.resolve(b"/lr/", false).unwrap(), root);
        assert!(matches!(fs.resolve(b"/lf/", false).unwrap_err(), Error::NotDir));
        assert!(matches!(fs.resolve(b"/f/", false).unwrap_err(), Error::NotDir));
        assert_eq!(fs.resolve(b"/lf", false).unwrap(), fs.lookup_ino(root, b"lf").unwrap());
    }
}
