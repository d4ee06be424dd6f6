//! Model-based property tests: random sequences of every operation run against a
//! FerriteFS pool and an in-memory reference file system at once.
//!
//! The reference (`Model`) implements Linux's semantics as measured on tmpfs,
//! including which error wins when several apply (see `errno_linux.rs`). Each
//! operation's result must match exactly (errno included); after every operation the
//! touched inodes' attributes are compared, and at remounts, cache evictions, every
//! `FULL_CHECK_EVERY` operations and at the end the whole tree is compared (names,
//! types, link counts, sizes, block counts within bounds, times, file bytes, symlink
//! targets, xattrs, statfs inode counts) and fsck must be clean.
//!
//! Remounts are interleaved: clean unmount, a process crash (`crash()` then the
//! current image: everything stored is kept, open handles are lost, so unlinked-open
//! files vanish), and the same from the durable image. The `durable_after_every_op`
//! property mounts the durable image after *every* operation in a second pool and
//! compares it with the model: every operation is durable when it returns. The
//! `tiny_pool_enospc_changes_nothing` property runs on a 320 KiB pool where ENOSPC
//! is frequent and compares the whole pool after each one.
//!
//! Invariants of the harness: the model is only changed after the pool returned
//! success (or the model predicted an error and the pool returned that error); ENOSPC
//! is accepted only when the pool is nearly full, and then the model is left
//! unchanged, so the next comparison checks that the failed operation changed nothing.
//!
//! PROPTEST_CASES raises the case count by hand (the default keeps this file well
//! under a minute in CI).

mod common;
use common::*;
use ferrite_core::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use std::collections::{BTreeMap, BTreeSet};

const PAGE: u64 = 4096;
const MAX: u64 = i64::MAX as u64;
const ROOT: u64 = 1;
/// Any "now" time is after this (2001); explicit times are always before it.
const NOW_FLOOR: i64 = 1_000_000_000;
const FULL_CHECK_EVERY: usize = 16;
const NAMES: [&[u8]; 6] = [b"a", b"b", b"c", b"dd", b"e", b"f"];

// ---------------------------------------------------------------------- model

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum T {
    Exact(Ts),
    Now,
    Any,
}

#[derive(Clone, Debug, Default)]
struct FileData {
    pages: BTreeMap<u64, Vec<u8>>,
    size: u64,
    /// Pages that may hold a block or overlay in the pool (upper bound for st_blocks).
    maybe: BTreeSet<u64>,
}

impl FileData {
    fn write(&mut self, off: u64, data: &[u8]) {
        let mut pos = off;
        let mut i = 0;
        while i < data.len() {
            let pg = pos / PAGE;
            let a = (pos % PAGE) as usize;
            let n = (PAGE as usize - a).min(data.len() - i);
            let p = self.pages.entry(pg).or_insert_with(|| vec![0; PAGE as usize]);
            p[a..a + n].copy_from_slice(&data[i..i + n]);
            self.maybe.insert(pg);
            pos += n as u64;
            i += n;
        }
        self.size = self.size.max(off + data.len() as u64);
    }

    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        if off >= self.size || len == 0 {
            return vec![];
        }
        let n = (len as u64).min(self.size - off);
        let mut out = vec![0u8; n as usize];
        let end = off + n;
        for (&pg, p) in self.pages.range(off / PAGE..=(end - 1) / PAGE) {
            let ps = pg * PAGE;
            let a = ps.max(off);
            let b = (ps + PAGE).min(end);
            out[(a - off) as usize..(b - off) as usize]
                .copy_from_slice(&p[(a - ps) as usize..(b - ps) as usize]);
        }
        out
    }

    fn zero(&mut self, off: u64, end: u64) {
        if off >= end {
            return;
        }
        for (&pg, p) in self.pages.range_mut(off / PAGE..=(end - 1) / PAGE) {
            let ps = pg * PAGE;
            let a = ps.max(off);
            let b = (ps + PAGE).min(end);
            p[(a - ps) as usize..(b - ps) as usize].fill(0);
        }
    }

    fn truncate(&mut self, size: u64) {
        if size < self.size {
            self.zero(size, self.size);
        }
        let keep = size.div_ceil(PAGE);
        self.pages.retain(|&p, _| p < keep);
        if size < self.size {
            self.maybe.retain(|&p| p < keep);
        }
        self.size = size;
    }

    fn nonzero_pages(&self) -> u64 {
        self.pages.values().filter(|p| p.iter().any(|&b| b != 0)).count() as u64
    }
}

#[derive(Clone, Debug)]
enum Kind {
    File(FileData),
    Dir(BTreeMap<Vec<u8>, u64>),
    Symlink(Vec<u8>),
}

#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    perm: u32,
    uid: u32,
    gid: u32,
    /// Directories only.
    parent: u64,
    atime: T,
    mtime: T,
    ctime: T,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    open: u32,
}

impl Node {
    fn new(kind: Kind, perm: u32, uid: u32, gid: u32, parent: u64) -> Node {
        Node {
            kind,
            perm: perm & 0o7777,
            uid,
            gid,
            parent,
            atime: T::Now,
            mtime: T::Now,
            ctime: T::Now,
            xattrs: BTreeMap::new(),
            open: 0,
        }
    }
    fn ftype(&self) -> FileType {
        match self.kind {
            Kind::File(_) => FileType::Regular,
            Kind::Dir(_) => FileType::Directory,
            Kind::Symlink(_) => FileType::Symlink,
        }
    }
    fn is_dir(&self) -> bool {
        matches!(self.kind, Kind::Dir(_))
    }
    fn dir(&self) -> Option<&BTreeMap<Vec<u8>, u64>> {
        match &self.kind {
            Kind::Dir(d) => Some(d),
            _ => None,
        }
    }
    fn dir_mut(&mut self) -> &mut BTreeMap<Vec<u8>, u64> {
        match &mut self.kind {
            Kind::Dir(d) => d,
            _ => panic!("model: not a directory"),
        }
    }
    fn file_mut(&mut self) -> &mut FileData {
        match &mut self.kind {
            Kind::File(f) => f,
            _ => panic!("model: not a file"),
        }
    }
    fn touch_mc(&mut self) {
        self.mtime = T::Now;
        self.ctime = T::Now;
    }
}

#[derive(Clone, Debug)]
struct Model {
    nodes: BTreeMap<u64, Node>,
    /// Inode numbers freed so far and not reused (lookups must give ENOENT).
    graveyard: BTreeSet<u64>,
}

type Expect<V> = std::result::Result<V, i32>;

fn is_dot(n: &[u8]) -> bool {
    n == b"." || n == b".."
}

impl Model {
    fn new(root_perm: u32) -> Model {
        let mut nodes = BTreeMap::new();
        nodes.insert(ROOT, Node::new(Kind::Dir(BTreeMap::new()), root_perm, 0, 0, ROOT));
        Model { nodes, graveyard: BTreeSet::new() }
    }

    /// Mode bits and group of a node made in `dir`: a set-group-id directory hands
    /// down its group, and the bit to subdirectories.
    fn new_owner(&self, dir: u64, perm: u32, gid: u32, is_dir: bool) -> (u32, u32) {
        let d = &self.nodes[&dir];
        if d.perm & 0o2000 != 0 {
            (perm | if is_dir { 0o2000 } else { 0 }, d.gid)
        } else {
            (perm, gid)
        }
    }

    fn node(&self, ino: u64) -> Expect<&Node> {
        self.nodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn links(&self, ino: u64) -> u32 {
        let n = &self.nodes[&ino];
        if let Kind::Dir(d) = &n.kind {
            return 2 + d.values().filter(|c| self.nodes[c].is_dir()).count() as u32;
        }
        self.nodes
            .values()
            .filter_map(|n| n.dir())
            .map(|d| d.values().filter(|&&c| c == ino).count() as u32)
            .sum()
    }

    fn free(&mut self, ino: u64) {
        self.nodes.remove(&ino).expect("model frees a live inode");
        self.graveyard.insert(ino);
    }

    /// Drop an inode if it has no name and no open handle.
    fn maybe_free(&mut self, ino: u64) {
        if self.nodes.contains_key(&ino)
            && !self.nodes[&ino].is_dir()
            && self.links(ino) == 0
            && self.nodes[&ino].open == 0
        {
            self.free(ino);
        }
    }

    /// What a remount leaves: open handles are gone, unlinked-open files freed.
    fn after_remount(&mut self) {
        let inos: Vec<u64> = self.nodes.keys().copied().collect();
        for ino in inos {
            self.nodes.get_mut(&ino).unwrap().open = 0;
            self.maybe_free(ino);
        }
    }

    /// A new name in `parent`: Linux's checks for mknod/mkdir/symlink/link targets.
    fn check_new_name(&self, parent: u64, name: &[u8]) -> Expect<()> {
        let p = self.node(parent)?;
        let d = p.dir().ok_or(libc::ENOTDIR)?;
        if is_dot(name) {
            return Err(libc::EEXIST);
        }
        if name.len() > 255 {
            return Err(libc::ENAMETOOLONG);
        }
        if d.contains_key(name) {
            return Err(libc::EEXIST);
        }
        Ok(())
    }

    fn lookup(&self, parent: u64, name: &[u8]) -> Expect<u64> {
        let p = self.node(parent)?;
        let d = p.dir().ok_or(libc::ENOTDIR)?;
        if name.len() > 255 {
            return Err(libc::ENAMETOOLONG);
        }
        match name {
            b"." => Ok(parent),
            b".." => Ok(p.parent),
            _ => d.get(name).copied().ok_or(libc::ENOENT),
        }
    }

    fn resolve(&self, path: &[u8], follow: bool) -> Expect<u64> {
        let mut budget = 40;
        self.resolve_from(ROOT, path, follow, &mut budget)
    }

    fn resolve_from(&self, start: u64, path: &[u8], follow: bool, budget: &mut u32) -> Expect<u64> {
        let mut cur = if path.first() == Some(&b'/') { ROOT } else { start };
        let comps: Vec<&[u8]> = path.split(|&c| c == b'/').filter(|c| !c.is_empty()).collect();
        for (k, c) in comps.iter().enumerate() {
            let last = k + 1 == comps.len();
            let next = self.lookup(cur, c)?;
            if let Kind::Symlink(t) = &self.nodes[&next].kind {
                if !last || follow {
                    if *budget == 0 {
                        return Err(libc::ELOOP);
                    }
                    *budget -= 1;
                    cur = self.resolve_from(cur, t, true, budget)?;
                    continue;
                }
            }
            cur = next;
        }
        Ok(cur)
    }

    /// Is directory `a` equal to `b` or an ancestor of it?
    fn is_ancestor(&self, a: u64, b: u64) -> bool {
        let mut cur = b;
        loop {
            if cur == a {
                return true;
            }
            if cur == ROOT {
                return false;
            }
            cur = self.nodes[&cur].parent;
        }
    }

    /// Absolute path of a directory (for resolve tests).
    fn path_of(&self, dir: u64) -> Option<Vec<u8>> {
        let mut parts: Vec<Vec<u8>> = Vec::new();
        let mut cur = dir;
        while cur != ROOT {
            let n = self.nodes.get(&cur)?;
            if !n.is_dir() {
                return None; // only directories have a parent pointer
            }
            let parent = n.parent;
            let name = self.nodes.get(&parent)?.dir()?.iter().find(|(_, &c)| c == cur)?.0.clone();
            parts.push(name);
            cur = parent;
        }
        let mut p = Vec::new();
        for n in parts.iter().rev() {
            p.push(b'/');
            p.extend_from_slice(n);
        }
        if p.is_empty() {
            p.push(b'/');
        }
        Some(p)
    }
}

// ------------------------------------------------------------------ operations

/// Which inode an operation works on, resolved against the model at run time.
#[derive(Clone, Copy, Debug)]
struct Pick {
    kind: u8,
    idx: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Dir,
    /// A directory with entries (falls back to any directory).
    Parent,
    File,
    Open,
    Any,
}

#[derive(Clone, Copy, Debug)]
enum Off {
    Small(u16),
    Page(u8),
    NearPage(u8, u8),
    Sparse(u32),
    Huge(u32),
    NearMax(u16),
    Eof(u16),
    Neg,
}

#[derive(Clone, Copy, Debug)]
enum Len {
    Zero,
    Tiny(u8),
    Sub(u16),
    Inline(u8),
    Page,
    Pages(u8, u16),
    Big(u32),
    Neg,
}

#[derive(Clone, Copy, Debug)]
enum TimeSel {
    Omit,
    Now,
    At(u32),
}

#[derive(Clone, Debug)]
enum Op {
    Create { dir: Pick, name: u8, perm: u16 },
    Mkdir { dir: Pick, name: u8, perm: u16 },
    Symlink { dir: Pick, name: u8, target: u8 },
    Link { src: Pick, dir: Pick, name: u8 },
    Unlink { dir: Pick, name: u8 },
    Rmdir { dir: Pick, name: u8 },
    Rename { sdir: Pick, sname: u8, ddir: Pick, dname: u8, flags: u8 },
    OpenAt { dir: Pick, name: u8, creat: bool, excl: bool, trunc: bool },
    Release { file: Pick },
    Write { file: Pick, off: Off, len: Len },
    Append { file: Pick, len: Len },
    Read { file: Pick, off: Off, len: Len },
    Truncate { file: Pick, size: Off },
    Fallocate { file: Pick, mode: u8, off: Off, len: Len },
    Chmod { ino: Pick, perm: u16 },
    Chown { ino: Pick, uid: Option<u8>, gid: Option<u8> },
    Utimens { ino: Pick, atime: TimeSel, mtime: TimeSel },
    SetXattr { ino: Pick, name: u8, vlen: u8, how: u8 },
    GetXattr { ino: Pick, name: u8 },
    RemoveXattr { ino: Pick, name: u8 },
    ListXattr { ino: Pick },
    Readlink { ino: Pick },
    Lookup { dir: Pick, name: u8 },
    Getattr { ino: Pick },
    ListDir { dir: Pick },
    ReaddirStart { dir: Pick, take: u8 },
    ReaddirMore { stream: u8, take: u8 },
    Resolve { start: Pick, comps: Vec<u8>, follow: bool },
    Statfs,
    Evict,
    Compact { ino: Pick },
    Remount(Remount),
}

fn name_of(sel: u8) -> Vec<u8> {
    match sel % 16 {
        0..=11 => NAMES[(sel % 16 % 6) as usize].to_vec(),
        12 => b".".to_vec(),
        13 => b"..".to_vec(),
        14 => vec![b'n'; 256],
        _ => vec![b'm'; 255],
    }
}

fn xattr_name(sel: u8) -> Vec<u8> {
    match sel % 16 {
        0..=3 => b"user.a".to_vec(),
        4 | 5 => b"user.b".to_vec(),
        6 => b"trusted.t".to_vec(),
        7 => b"security.s".to_vec(),
        8 => b"user.".to_vec(),
        9 => b"trusted.".to_vec(),
        10 => b"os2.x".to_vec(),
        11 => Vec::new(),
        12 => {
            let mut v = b"user.".to_vec();
            v.resize(256, b'q');
            v
        }
        13 => {
            let mut v = b"user.".to_vec();
            v.resize(255, b'q');
            v
        }
        _ => b"trusted.u".to_vec(),
    }
}

fn xattr_len(sel: u8) -> usize {
    match sel % 16 {
        0 => 0,
        1..=9 => (sel as usize * 7) % 100 + 1,
        10 | 11 => 2000,
        12 => XATTR_VALUE_MAX + 1 + sel as usize * 97, // in data blocks
        13 => XATTR_SIZE_MAX + 1,
        _ => 300,
    }
}

fn symlink_target(sel: u8) -> Vec<u8> {
    match sel % 20 {
        0 => b"a".to_vec(),
        1 => b"b/c".to_vec(),
        2 => b"../a".to_vec(),
        3 => b"./dd".to_vec(),
        4 => b"/a".to_vec(),
        5 => b"/b/a/..".to_vec(),
        6 => b"/".to_vec(),
        7 => b".".to_vec(),
        8 => b"..".to_vec(),
        9 => b"e".to_vec(), // often a symlink to itself or a loop through others
        10 => b"f/../e".to_vec(),
        11 => b"/c/e".to_vec(),
        12 => {
            // Longer than INLINE_MAX: stored in a data block.
            let mut t = b"./".repeat(1400);
            t.extend_from_slice(b"a");
            t
        }
        13 => Vec::new(),
        14 => vec![b'z'; 4096],
        15 => {
            let mut t = b"/".repeat(4094);
            t.push(b'a');
            t
        }
        16 => b"nowhere".to_vec(),
        17 => b"a/b/c/dd".to_vec(),
        18 => b"dd/..".to_vec(),
        _ => b"c".to_vec(),
    }
}

fn pick_strategy() -> impl Strategy<Value = Pick> {
    (any::<u8>(), any::<u16>()).prop_map(|(kind, idx)| Pick { kind, idx })
}

fn off_strategy() -> impl Strategy<Value = Off> {
    prop_oneof![
        4 => any::<u16>().prop_map(|x| Off::Small(x % 9000)),
        3 => any::<u8>().prop_map(|x| Off::Page(x % 24)),
        3 => (any::<u8>(), any::<u8>()).prop_map(|(p, d)| Off::NearPage(p % 24, d)),
        2 => any::<u32>().prop_map(|x| Off::Sparse(x % (1 << 20))),
        1 => any::<u32>().prop_map(Off::Huge),
        1 => any::<u16>().prop_map(|x| Off::NearMax(x % 9000)),
        3 => any::<u16>().prop_map(|x| Off::Eof(x % 5000)),
        1 => Just(Off::Neg),
    ]
}

fn len_strategy() -> impl Strategy<Value = Len> {
    prop_oneof![
        1 => Just(Len::Zero),
        3 => any::<u8>().prop_map(|x| Len::Tiny(x % 64 + 1)),
        4 => any::<u16>().prop_map(|x| Len::Sub(x % 4095 + 1)),
        2 => any::<u8>().prop_map(|x| Len::Inline(x % 4)),
        2 => Just(Len::Page),
        3 => (any::<u8>(), any::<u16>()).prop_map(|(p, x)| Len::Pages(p % 6 + 1, x % 4096)),
        1 => any::<u32>().prop_map(|x| Len::Big(x % (64 << 10) + 1)),
        1 => Just(Len::Neg),
    ]
}

fn time_strategy() -> impl Strategy<Value = TimeSel> {
    prop_oneof![1 => Just(TimeSel::Omit), 1 => Just(TimeSel::Now), 2 => any::<u32>().prop_map(TimeSel::At)]
}

fn op_strategy(with_remounts: bool) -> impl Strategy<Value = Op> {
    let p = pick_strategy;
    let n = || any::<u8>();
    let core = prop_oneof![
        6 => (p(), n(), any::<u16>()).prop_map(|(dir, name, perm)| Op::Create { dir, name, perm }),
        4 => (p(), n(), any::<u16>()).prop_map(|(dir, name, perm)| Op::Mkdir { dir, name, perm }),
        3 => (p(), n(), n()).prop_map(|(dir, name, target)| Op::Symlink { dir, name, target }),
        3 => (p(), p(), n()).prop_map(|(src, dir, name)| Op::Link { src, dir, name }),
        4 => (p(), n()).prop_map(|(dir, name)| Op::Unlink { dir, name }),
        3 => (p(), n()).prop_map(|(dir, name)| Op::Rmdir { dir, name }),
        6 => (p(), n(), p(), n(), n()).prop_map(|(sdir, sname, ddir, dname, flags)| Op::Rename {
            sdir, sname, ddir, dname, flags
        }),
        3 => (p(), n(), any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(dir, name, creat, excl, trunc)| Op::OpenAt { dir, name, creat, excl, trunc }),
        2 => p().prop_map(|file| Op::Release { file }),
        2 => (p(), n(), Just(false), Just(false), any::<bool>())
            .prop_map(|(dir, name, creat, excl, trunc)| Op::OpenAt { dir, name, creat, excl, trunc }),
        10 => (p(), off_strategy(), len_strategy()).prop_map(|(file, off, len)| Op::Write { file, off, len }),
        3 => (p(), len_strategy()).prop_map(|(file, len)| Op::Append { file, len }),
        5 => (p(), off_strategy(), len_strategy()).prop_map(|(file, off, len)| Op::Read { file, off, len }),
        4 => (p(), off_strategy()).prop_map(|(file, size)| Op::Truncate { file, size }),
        3 => (p(), n(), off_strategy(), len_strategy())
            .prop_map(|(file, mode, off, len)| Op::Fallocate { file, mode, off, len }),
    ];
    let more = prop_oneof![
        2 => (p(), any::<u16>()).prop_map(|(ino, perm)| Op::Chmod { ino, perm }),
        1 => (p(), any::<Option<u8>>(), any::<Option<u8>>()).prop_map(|(ino, uid, gid)| Op::Chown { ino, uid, gid }),
        2 => (p(), time_strategy(), time_strategy()).prop_map(|(ino, atime, mtime)| Op::Utimens { ino, atime, mtime }),
        4 => (p(), n(), n(), n()).prop_map(|(ino, name, vlen, how)| Op::SetXattr { ino, name, vlen, how }),
        2 => (p(), n()).prop_map(|(ino, name)| Op::GetXattr { ino, name }),
        2 => (p(), n()).prop_map(|(ino, name)| Op::RemoveXattr { ino, name }),
        1 => p().prop_map(|ino| Op::ListXattr { ino }),
        1 => p().prop_map(|ino| Op::Readlink { ino }),
        2 => (p(), n()).prop_map(|(dir, name)| Op::Lookup { dir, name }),
        1 => p().prop_map(|ino| Op::Getattr { ino }),
        1 => p().prop_map(|dir| Op::ListDir { dir }),
        2 => (p(), n()).prop_map(|(dir, take)| Op::ReaddirStart { dir, take }),
        3 => (n(), n()).prop_map(|(stream, take)| Op::ReaddirMore { stream, take }),
        3 => (p(), proptest::collection::vec(n(), 1..6), any::<bool>())
            .prop_map(|(start, comps, follow)| Op::Resolve { start, comps, follow }),
        1 => Just(Op::Statfs),
        1 => Just(Op::Evict),
        1 => p().prop_map(|ino| Op::Compact { ino }),
    ];
    let remount_w = if with_remounts { 1 } else { 0 };
    prop_oneof![
        12 => core,
        6 => more,
        remount_w => prop_oneof![
            Just(Op::Remount(Remount::Clean)),
            Just(Op::Remount(Remount::CrashCurrent)),
            Just(Op::Remount(Remount::CrashDurable)),
        ],
    ]
}

// --------------------------------------------------------------------- harness

struct Stream {
    dir: u64,
    cookie: u64,
    /// Names returned so far (without "." and "..").
    seen: Vec<Vec<u8>>,
    /// Names present at the start and neither removed nor replaced since.
    survivors: BTreeSet<Vec<u8>>,
    done: bool,
}

struct Harness {
    fs: Option<Fs<SimMedium>>,
    m: Model,
    streams: Vec<Stream>,
    counter: u64,
    ninodes: u64,
    durable_each_op: bool,
    log: Vec<String>,
    /// Set when an operation failed with ENOSPC: the whole pool is compared next.
    nospc: std::cell::Cell<bool>,
}

fn ts_of(x: u32) -> Ts {
    Ts { sec: (x % 900_000_000) as i64 + 1, nsec: x % 1_000_000_000 }
}

impl Harness {
    fn new(durable_each_op: bool, pool: u64, inodes: u64) -> Harness {
        let fs = Fs::mkfs(
            SimMedium::new(pool),
            &MkfsOptions { shards: 4, inodes, ..Default::default() },
        )
        .expect("mkfs");
        // The model has no access times of reads (tests/atime_relatime.rs has them).
        fs.set_atime_mode(AtimeMode::Off);
        let ninodes = fs.statfs().files;
        Harness {
            fs: Some(fs),
            m: Model::new(0o755),
            streams: Vec::new(),
            counter: 0,
            ninodes,
            durable_each_op,
            log: Vec::new(),
            nospc: std::cell::Cell::new(false),
        }
    }

    fn fs(&self) -> &Fs<SimMedium> {
        self.fs.as_ref().expect("mounted")
    }

    fn pick(&self, p: Pick, class: Class) -> u64 {
        let sel = p.kind % 16;
        if sel == 15 {
            // A dead inode number: freed earlier, or out of range.
            let g: Vec<u64> = self.m.graveyard.iter().copied().collect();
            if g.is_empty() {
                return self.ninodes + 1 + (p.idx as u64 % 3);
            }
            return g[p.idx as usize % g.len()];
        }
        let all: Vec<u64> = self.m.nodes.keys().copied().collect();
        let cands: Vec<u64> = if sel >= 13 || class == Class::Any {
            all.clone()
        } else {
            self.m
                .nodes
                .iter()
                .filter(|(_, n)| match class {
                    Class::Dir => n.is_dir(),
                    Class::Parent => n.dir().is_some_and(|d| !d.is_empty()),
                    Class::File => matches!(n.kind, Kind::File(_)),
                    Class::Open => n.open > 0,
                    Class::Any => true,
                })
                .map(|(&i, _)| i)
                .collect()
        };
        if cands.is_empty() && class == Class::Parent {
            return self.pick(p, Class::Dir);
        }
        let c = if cands.is_empty() { &all } else { &cands };
        c[p.idx as usize % c.len()]
    }

    /// A name for an operation on existing entries: usually one that exists in
    /// `dir`, else any name (missing ones, dots, overlong ones).
    fn existing_name(&self, dir: u64, sel: u8) -> Vec<u8> {
        self.existing_name_where(dir, sel, |_| true)
    }

    /// As `existing_name`, preferring entries whose inode satisfies `pred`.
    fn existing_name_where(&self, dir: u64, sel: u8, pred: impl Fn(&Node) -> bool) -> Vec<u8> {
        if let Some(Some(d)) = self.m.nodes.get(&dir).map(|n| n.dir()) {
            let mut c: Vec<&Vec<u8>> =
                d.iter().filter(|(_, i)| pred(&self.m.nodes[i])).map(|(n, _)| n).collect();
            if c.is_empty() {
                c = d.keys().collect();
            }
            if sel % 8 < 6 && !c.is_empty() {
                return c[(sel / 8) as usize % c.len()].clone();
            }
        }
        name_of(sel)
    }

    fn offset(&self, o: Off, file: u64) -> u64 {
        let eof = match self.m.nodes.get(&file).map(|n| &n.kind) {
            Some(Kind::File(f)) => f.size,
            _ => 0,
        };
        match o {
            Off::Small(x) => x as u64,
            Off::Page(p) => p as u64 * PAGE,
            Off::NearPage(p, d) => (p as u64 * PAGE + d as u64).saturating_sub(128),
            Off::Sparse(x) => x as u64,
            Off::Huge(x) => (1u64 << 40) + x as u64,
            Off::NearMax(x) => MAX - x as u64,
            Off::Eof(x) => eof.saturating_add(x as u64).min(MAX),
            Off::Neg => u64::MAX - 7,
        }
    }

    fn length(l: Len) -> u64 {
        match l {
            Len::Zero => 0,
            Len::Tiny(x) => x as u64,
            Len::Sub(x) => x as u64,
            Len::Inline(x) => [2047, 2048, 2049, 4095][x as usize % 4],
            Len::Page => PAGE,
            Len::Pages(p, x) => p as u64 * PAGE + x as u64,
            Len::Big(x) => x as u64,
            Len::Neg => u64::MAX - 3,
        }
    }

    fn data(&mut self, off: u64, len: usize) -> Vec<u8> {
        self.counter += 1;
        pattern(self.counter, off, len)
    }

    /// ENOSPC is acceptable only when the pool is nearly out of blocks or inodes.
    fn nospc_ok(&self, blocks_needed: u64, needs_inode: bool) -> bool {
        let s = self.fs().statfs();
        s.bavail < blocks_needed + 48 || (needs_inode && s.ffree == 0)
    }

    /// Compare `r` with the model's prediction `want`. Returns true when the
    /// operation succeeded (and the model must now be updated).
    #[track_caller]
    fn outcome<V: std::fmt::Debug>(
        &self,
        op: &Op,
        r: &Result<V>,
        want: Expect<()>,
        blocks_needed: u64,
        needs_inode: bool,
    ) -> bool {
        match (r, want) {
            (Ok(_), Ok(())) => true,
            (Err(Error::NoSpace), Ok(())) => {
                assert!(
                    self.nospc_ok(blocks_needed, needs_inode),
                    "{op:?}: ENOSPC with {:?} free\n{}",
                    self.fs().statfs(),
                    self.log.join("\n")
                );
                self.nospc.set(true);
                false
            }
            (r, want) => {
                let got = errno(r);
                let w = want.err().unwrap_or(0);
                assert_eq!(
                    got,
                    w,
                    "{op:?}: pool gave {r:?}, model expects errno {w}\nops:\n{}",
                    self.log.join("\n")
                );
                false
            }
        }
    }

    fn drop_survivor(&mut self, dir: u64, name: &[u8]) {
        for s in &mut self.streams {
            if s.dir == dir {
                s.survivors.remove(name);
            }
        }
    }

    fn run(&mut self, op: &Op, step: usize) {
        self.log.push(format!("{step}: {op:?}"));
        let mut touched: Vec<u64> = Vec::new();
        match op {
            Op::Create { dir, name, perm } | Op::Mkdir { dir, name, perm } => {
                let is_dir = matches!(op, Op::Mkdir { .. });
                let p = self.pick(*dir, Class::Dir);
                let name = name_of(*name);
                let perm = *perm as u32 & 0o7777;
                let (uid, gid) = (step as u32 % 3, step as u32 % 5);
                let want = self.m.check_new_name(p, &name);
                let r = if is_dir {
                    self.fs().mkdir(p, &name, perm, uid, gid)
                } else {
                    self.fs().create(p, &name, perm, uid, gid)
                };
                if self.outcome(op, &r, want, 2, true) {
                    let a = r.unwrap();
                    assert!(
                        !self.m.nodes.contains_key(&a.ino),
                        "{op:?}: inode {} reused while live",
                        a.ino
                    );
                    let kind = if is_dir {
                        Kind::Dir(BTreeMap::new())
                    } else {
                        Kind::File(FileData::default())
                    };
                    let (perm, gid) = self.m.new_owner(p, perm, gid, is_dir);
                    self.m.nodes.insert(a.ino, Node::new(kind, perm, uid, gid, p));
                    self.m.graveyard.remove(&a.ino);
                    let pn = self.m.nodes.get_mut(&p).unwrap();
                    pn.dir_mut().insert(name, a.ino);
                    pn.touch_mc();
                    touched.extend([p, a.ino]);
                }
            }
            Op::Symlink { dir, name, target } => {
                let p = self.pick(*dir, Class::Dir);
                let name = name_of(*name);
                let t = symlink_target(*target);
                let want = if t.is_empty() {
                    Err(libc::ENOENT)
                } else if t.len() > 4095 {
                    Err(libc::ENAMETOOLONG)
                } else {
                    self.m.check_new_name(p, &name)
                };
                let r = self.fs().symlink(p, &name, &t, 7, 8);
                if self.outcome(op, &r, want, 3, true) {
                    let a = r.unwrap();
                    assert!(!self.m.nodes.contains_key(&a.ino));
                    let (_, gid) = self.m.new_owner(p, 0o777, 8, false);
                    self.m.nodes.insert(a.ino, Node::new(Kind::Symlink(t), 0o777, 7, gid, p));
                    self.m.graveyard.remove(&a.ino);
                    let pn = self.m.nodes.get_mut(&p).unwrap();
                    pn.dir_mut().insert(name, a.ino);
                    pn.touch_mc();
                    touched.extend([p, a.ino]);
                }
            }
            Op::Link { src, dir, name } => {
                let s = self.pick(*src, Class::File);
                let p = self.pick(*dir, Class::Dir);
                let name = name_of(*name);
                let want = (|| {
                    let sn = self.m.node(s)?;
                    self.m.check_new_name(p, &name)?;
                    if sn.is_dir() {
                        return Err(libc::EPERM);
                    }
                    if self.m.links(s) == 0 {
                        return Err(libc::ENOENT);
                    }
                    Ok(())
                })();
                let r = self.fs().link(s, p, &name);
                if self.outcome(op, &r, want, 2, false) {
                    let pn = self.m.nodes.get_mut(&p).unwrap();
                    pn.dir_mut().insert(name, s);
                    pn.touch_mc();
                    self.m.nodes.get_mut(&s).unwrap().ctime = T::Now;
                    touched.extend([p, s]);
                }
            }
            Op::Unlink { dir, name } | Op::Rmdir { dir, name } => {
                let rm_dir = matches!(op, Op::Rmdir { .. });
                let p = self.pick(*dir, Class::Parent);
                let name = self.existing_name_where(p, *name, |n| n.is_dir() == rm_dir);
                let want = (|| {
                    let pn = self.m.node(p)?;
                    let d = pn.dir().ok_or(libc::ENOTDIR)?;
                    if name.len() > 255 {
                        return Err(libc::ENAMETOOLONG);
                    }
                    if rm_dir && name == b"." {
                        return Err(libc::EINVAL);
                    }
                    if rm_dir && name == b".." {
                        return Err(libc::ENOTEMPTY);
                    }
                    if is_dot(&name) {
                        return Err(libc::EISDIR);
                    }
                    let c = *d.get(&name).ok_or(libc::ENOENT)?;
                    let cn = &self.m.nodes[&c];
                    match (rm_dir, cn.is_dir()) {
                        (true, false) => Err(libc::ENOTDIR),
                        (false, true) => Err(libc::EISDIR),
                        (true, true) if !cn.dir().unwrap().is_empty() => Err(libc::ENOTEMPTY),
                        _ => Ok(()),
                    }
                })();
                let r = if rm_dir { self.fs().rmdir(p, &name) } else { self.fs().unlink(p, &name) };
                if self.outcome(op, &r, want, 0, false) {
                    let pn = self.m.nodes.get_mut(&p).unwrap();
                    let c = pn.dir_mut().remove(&name).unwrap();
                    pn.touch_mc();
                    touched.push(p);
                    self.drop_survivor(p, &name);
                    if rm_dir {
                        self.m.free(c);
                        self.streams.retain(|s| s.dir != c);
                    } else {
                        self.m.nodes.get_mut(&c).unwrap().ctime = T::Now;
                        self.m.maybe_free(c);
                        if self.m.nodes.contains_key(&c) {
                            touched.push(c);
                        }
                    }
                }
            }
            Op::Rename { sdir, sname, ddir, dname, flags } => {
                self.rename(op, *sdir, *sname, *ddir, *dname, *flags, &mut touched)
            }
            Op::OpenAt { dir, name, creat, excl, trunc } => {
                let p = self.pick(*dir, Class::Dir);
                let name = if *name % 3 != 0 {
                    self.existing_name_where(p, *name / 3, |n| matches!(n.kind, Kind::File(_)))
                } else {
                    name_of(*name / 3)
                };
                // Model: O_NOFOLLOW open of `name` in `p` with the given flags.
                let want: Expect<Option<u64>> = (|| match self.m.lookup(p, &name) {
                    Ok(i) => {
                        if *creat && *excl {
                            return Err(libc::EEXIST);
                        }
                        match self.m.nodes[&i].kind {
                            Kind::Dir(_) if *creat || *trunc => Err(libc::EISDIR),
                            Kind::Dir(_) => Ok(None),
                            Kind::Symlink(_) => Err(libc::ELOOP),
                            Kind::File(_) => Ok(Some(i)),
                        }
                    }
                    Err(libc::ENOENT) if *creat => {
                        self.m.check_new_name(p, &name)?;
                        Ok(None)
                    }
                    Err(e) => Err(e),
                })();
                // Pool: the calls the FUSE layer makes for open(2)/creat(2).
                let fs = self.fs();
                let r: Result<(u64, bool)> = (|| match fs.lookup_ino(p, &name) {
                    Ok(i) => {
                        if *creat && *excl {
                            return Err(Error::Exists);
                        }
                        let a = fs.getattr(i)?;
                        match a.ftype {
                            FileType::Directory if *creat || *trunc => Err(Error::IsDir),
                            FileType::Directory => Ok((i, false)),
                            FileType::Symlink => Err(Error::Loop),
                            FileType::Regular => {
                                if *trunc {
                                    fs.setattr(
                                        i,
                                        &SetAttr { size: Some(0), ..Default::default() },
                                    )?;
                                }
                                fs.open(i)?;
                                Ok((i, false))
                            }
                            t => unreachable!("the model makes no {t:?}"),
                        }
                    }
                    Err(Error::NotFound) if *creat => {
                        let a = fs.create(p, &name, 0o640, 1, 1)?;
                        fs.open(a.ino)?;
                        Ok((a.ino, true))
                    }
                    Err(e) => Err(e),
                })();
                let w = want.map(|_| ());
                if self.outcome(op, &r, w, 2, true) {
                    let (ino, created) = r.unwrap();
                    if created {
                        assert!(!self.m.nodes.contains_key(&ino));
                        let (perm, gid) = self.m.new_owner(p, 0o640, 1, false);
                        let mut n = Node::new(Kind::File(FileData::default()), perm, 1, gid, p);
                        n.open = 1;
                        self.m.nodes.insert(ino, n);
                        self.m.graveyard.remove(&ino);
                        let pn = self.m.nodes.get_mut(&p).unwrap();
                        pn.dir_mut().insert(name, ino);
                        pn.touch_mc();
                        touched.extend([p, ino]);
                    } else if let Some(Kind::File(_)) = self.m.nodes.get(&ino).map(|n| &n.kind) {
                        let n = self.m.nodes.get_mut(&ino).unwrap();
                        if *trunc {
                            n.file_mut().truncate(0);
                            n.touch_mc();
                        }
                        n.open += 1;
                        touched.push(ino);
                    }
                }
            }
            Op::Release { file } => {
                let f = self.pick(*file, Class::Open);
                let want = match self.m.node(f) {
                    Err(e) => Err(e),
                    Ok(n) if n.open == 0 => Err(libc::EBADF),
                    Ok(_) => Ok(()),
                };
                let r = self.fs().release(f);
                if self.outcome(op, &r, want, 0, false) {
                    self.m.nodes.get_mut(&f).unwrap().open -= 1;
                    self.m.maybe_free(f);
                }
            }
            Op::Write { file, off, len } => {
                let f = self.pick(*file, Class::File);
                let off = self.offset(*off, f);
                let len = Self::length(*len).min(256 << 10) as usize;
                let want = self.check_rw(f, true).and_then(|_| {
                    if off > MAX || (len > 0 && off + len as u64 > MAX) {
                        Err(libc::EINVAL)
                    } else {
                        Ok(())
                    }
                });
                let data = self.data(off, len);
                let r = self.fs().write(f, off, &data);
                if self.outcome(op, &r, want, len as u64 / PAGE + 3, false) {
                    assert_eq!(r.unwrap(), len, "{op:?}: short write");
                    if len > 0 {
                        let n = self.m.nodes.get_mut(&f).unwrap();
                        n.file_mut().write(off, &data);
                        n.touch_mc();
                    }
                    touched.push(f);
                }
            }
            Op::Append { file, len } => {
                let f = self.pick(*file, Class::File);
                let len = Self::length(*len).min(256 << 10) as usize;
                let size = match self.m.nodes.get(&f).map(|n| &n.kind) {
                    Some(Kind::File(fd)) => fd.size,
                    _ => 0,
                };
                let want = self.check_rw(f, true).and_then(|_| {
                    if len > 0 && size + len as u64 > MAX {
                        Err(libc::EFBIG)
                    } else {
                        Ok(())
                    }
                });
                let data = self.data(size, len);
                let r = self.fs().append(f, &data);
                if self.outcome(op, &r, want, len as u64 / PAGE + 3, false) {
                    assert_eq!(r.unwrap(), size, "{op:?}: append offset");
                    if len > 0 {
                        let n = self.m.nodes.get_mut(&f).unwrap();
                        n.file_mut().write(size, &data);
                        n.touch_mc();
                    }
                    touched.push(f);
                }
            }
            Op::Read { file, off, len } => {
                let f = self.pick(*file, Class::File);
                let off = self.offset(*off, f);
                let len = Self::length(*len).min(256 << 10) as usize;
                let want = self.check_rw(f, false);
                let mut buf = vec![0xa5u8; len];
                let r = self.fs().read(f, off, &mut buf);
                if self.outcome(op, &r, want, 0, false) {
                    let Kind::File(fd) = &self.m.nodes[&f].kind else { unreachable!() };
                    let exp = fd.read(off, len);
                    let n = r.unwrap();
                    assert_eq!(n, exp.len(), "{op:?}: read length");
                    assert!(
                        buf[..n] == exp[..],
                        "{op:?}: read bytes differ\n{}",
                        self.log.join("\n")
                    );
                    touched.push(f);
                }
            }
            Op::Truncate { file, size } => {
                let f = self.pick(*file, Class::File);
                let size = self.offset(*size, f);
                let want = if size > MAX {
                    Err(libc::EINVAL)
                } else {
                    match self.m.node(f) {
                        Err(e) => Err(e),
                        Ok(n) => match n.kind {
                            Kind::Dir(_) => Err(libc::EISDIR),
                            Kind::Symlink(_) => Err(libc::EINVAL),
                            Kind::File(_) => Ok(()),
                        },
                    }
                };
                let r = self.fs().setattr(f, &SetAttr { size: Some(size), ..Default::default() });
                if self.outcome(op, &r, want, 2, false) {
                    let n = self.m.nodes.get_mut(&f).unwrap();
                    n.file_mut().truncate(size);
                    n.touch_mc();
                    touched.push(f);
                }
            }
            Op::Fallocate { file, mode, off, len } => {
                let f = self.pick(*file, Class::File);
                let off = self.offset(*off, f);
                let len = Self::length(*len);
                let mode = match mode % 8 {
                    0..=2 => FallocMode::default(),
                    3 | 4 => FallocMode {
                        keep_size: true,
                        punch_hole: false,
                        zero_range: false,
                        shift: None,
                        unshare: false,
                    },
                    5 | 6 => FallocMode {
                        keep_size: true,
                        punch_hole: true,
                        zero_range: false,
                        shift: None,
                        unshare: false,
                    },
                    _ => FallocMode {
                        keep_size: false,
                        punch_hole: true,
                        zero_range: false,
                        shift: None,
                        unshare: false,
                    },
                };
                let want = (|| {
                    if len == 0 || off > MAX || len > MAX {
                        return Err(libc::EINVAL);
                    }
                    if mode.punch_hole && !mode.keep_size {
                        return Err(libc::EOPNOTSUPP);
                    }
                    self.check_rw(f, true)?;
                    if off + len > MAX {
                        return Err(libc::EFBIG);
                    }
                    Ok(())
                })();
                let need = if mode.punch_hole { 2 } else { len.min(1 << 30) / PAGE + 3 };
                let r = self.fs().fallocate(f, mode, off, len);
                if self.outcome(op, &r, want, need, false) {
                    let n = self.m.nodes.get_mut(&f).unwrap();
                    let fd = n.file_mut();
                    if mode.punch_hole {
                        let end = (off + len).min(fd.size);
                        if off < end {
                            fd.zero(off, end);
                            let (a, b) = (off.div_ceil(PAGE), end / PAGE);
                            fd.maybe.retain(|&p| p < a || p >= b);
                        }
                    } else {
                        for pg in off / PAGE..(off + len).div_ceil(PAGE) {
                            fd.maybe.insert(pg);
                        }
                        if !mode.keep_size {
                            fd.size = fd.size.max(off + len);
                        }
                    }
                    n.mtime = T::Any;
                    n.ctime = T::Any;
                    touched.push(f);
                }
            }
            Op::Chmod { ino, perm } => {
                let i = self.pick(*ino, Class::Any);
                let perm = *perm as u32 & 0o777;
                let want = self.m.node(i).map(|_| ());
                let r = self.fs().setattr(i, &SetAttr { perm: Some(perm), ..Default::default() });
                if self.outcome(op, &r, want, 2, false) {
                    let n = self.m.nodes.get_mut(&i).unwrap();
                    n.perm = perm;
                    n.ctime = T::Now;
                    touched.push(i);
                }
            }
            Op::Chown { ino, uid, gid } => {
                let i = self.pick(*ino, Class::Any);
                let want = self.m.node(i).map(|_| ());
                let ch = SetAttr {
                    uid: uid.map(|u| u as u32 + 1000),
                    gid: gid.map(|g| g as u32 + 2000),
                    ..Default::default()
                };
                let r = self.fs().setattr(i, &ch);
                if self.outcome(op, &r, want, 2, false) {
                    let n = self.m.nodes.get_mut(&i).unwrap();
                    if let Some(u) = ch.uid {
                        n.uid = u;
                    }
                    if let Some(g) = ch.gid {
                        n.gid = g;
                    }
                    // chown clears set-user-id, and set-group-id with group execute.
                    if !n.is_dir() && (ch.uid.is_some() || ch.gid.is_some()) {
                        n.perm &= !0o4000;
                        if n.perm & 0o2010 == 0o2010 {
                            n.perm &= !0o2000;
                        }
                    }
                    n.ctime = T::Now;
                    touched.push(i);
                }
            }
            Op::Utimens { ino, atime, mtime } => {
                let i = self.pick(*ino, Class::Any);
                let conv = |t: TimeSel| match t {
                    TimeSel::Omit => None,
                    TimeSel::Now => Some(SetTime::Now),
                    TimeSel::At(x) => Some(SetTime::At(ts_of(x))),
                };
                let (a, mt) = (conv(*atime), conv(*mtime));
                if a.is_none() && mt.is_none() {
                    return; // utimensat with both omitted changes nothing and is not sent
                }
                let want = self.m.node(i).map(|_| ());
                let r =
                    self.fs().setattr(i, &SetAttr { atime: a, mtime: mt, ..Default::default() });
                if self.outcome(op, &r, want, 2, false) {
                    let n = self.m.nodes.get_mut(&i).unwrap();
                    let to_t = |s: SetTime| match s {
                        SetTime::Now => T::Now,
                        SetTime::At(ts) => T::Exact(ts),
                    };
                    if let Some(a) = a {
                        n.atime = to_t(a);
                    }
                    if let Some(m) = mt {
                        n.mtime = to_t(m);
                    }
                    n.ctime = T::Now;
                    touched.push(i);
                }
            }
            Op::SetXattr { ino, name, vlen, how } => {
                let i = self.pick(*ino, Class::Any);
                let name = xattr_name(*name);
                let vlen = xattr_len(*vlen);
                let how = match how % 4 {
                    0 | 1 => XattrSet::Any,
                    2 => XattrSet::Create,
                    _ => XattrSet::Replace,
                };
                let want = (|| {
                    Self::xattr_name_check(&name)?;
                    if vlen > XATTR_SIZE_MAX {
                        return Err(libc::E2BIG);
                    }
                    let n = self.m.node(i)?;
                    Self::xattr_target_check(&name, n, true)?;
                    let exists = n.xattrs.contains_key(&name);
                    match how {
                        XattrSet::Create if exists => Err(libc::EEXIST),
                        XattrSet::Replace if !exists => Err(libc::ENODATA),
                        _ => Ok(()),
                    }
                })();
                let value = self.data(0, vlen);
                let r = self.fs().setxattr(i, &name, &value, how);
                if self.outcome(op, &r, want, 2, false) {
                    let n = self.m.nodes.get_mut(&i).unwrap();
                    n.xattrs.insert(name, value);
                    n.ctime = T::Now;
                    touched.push(i);
                }
            }
            Op::GetXattr { ino, name } => {
                let i = self.pick(*ino, Class::Any);
                let name = xattr_name(*name);
                let want = (|| {
                    Self::xattr_name_check(&name)?;
                    let n = self.m.node(i)?;
                    Self::xattr_target_check(&name, n, false)?;
                    n.xattrs.get(&name).cloned().ok_or(libc::ENODATA)
                })();
                let r = self.fs().getxattr(i, &name);
                if self.outcome(op, &r, want.clone().map(|_| ()), 0, false) {
                    assert_eq!(r.unwrap(), want.unwrap(), "{op:?}: xattr value");
                }
            }
            Op::RemoveXattr { ino, name } => {
                let i = self.pick(*ino, Class::Any);
                let name = xattr_name(*name);
                let want = (|| {
                    Self::xattr_name_check(&name)?;
                    let n = self.m.node(i)?;
                    Self::xattr_target_check(&name, n, true)?;
                    n.xattrs.get(&name).map(|_| ()).ok_or(libc::ENODATA)
                })();
                let r = self.fs().removexattr(i, &name);
                if self.outcome(op, &r, want, 0, false) {
                    let n = self.m.nodes.get_mut(&i).unwrap();
                    n.xattrs.remove(&name);
                    n.ctime = T::Now;
                    touched.push(i);
                }
            }
            Op::ListXattr { ino } => {
                let i = self.pick(*ino, Class::Any);
                let want = self.m.node(i).map(|_| ());
                let r = self.fs().listxattr(i);
                if self.outcome(op, &r, want, 0, false) {
                    let got: BTreeSet<Vec<u8>> = r.unwrap().into_iter().collect();
                    let exp: BTreeSet<Vec<u8>> = self.m.nodes[&i].xattrs.keys().cloned().collect();
                    assert_eq!(got, exp, "{op:?}: xattr names");
                }
            }
            Op::Readlink { ino } => {
                let i = self.pick(*ino, Class::Any);
                let want = self.m.node(i).and_then(|n| match &n.kind {
                    Kind::Symlink(t) => Ok(t.clone()),
                    _ => Err(libc::EINVAL),
                });
                let r = self.fs().readlink(i);
                if self.outcome(op, &r, want.clone().map(|_| ()), 0, false) {
                    assert_eq!(r.unwrap(), want.unwrap(), "{op:?}: symlink target");
                }
            }
            Op::Lookup { dir, name } => {
                let p = self.pick(*dir, Class::Parent);
                let name = self.existing_name(p, *name);
                let want = self.m.lookup(p, &name);
                let r = self.fs().lookup(p, &name);
                if self.outcome(op, &r, want.map(|_| ()), 0, false) {
                    assert_eq!(r.unwrap().ino, want.unwrap(), "{op:?}: looked-up inode");
                }
            }
            Op::Getattr { ino } => {
                let i = self.pick(*ino, Class::Any);
                let want = self.m.node(i).map(|_| ());
                let r = self.fs().getattr(i);
                if self.outcome(op, &r, want, 0, false) {
                    touched.push(i);
                }
            }
            Op::ListDir { dir } => {
                let d = self.pick(*dir, Class::Dir);
                let want = self.m.node(d).and_then(|n| n.dir().map(|_| ()).ok_or(libc::ENOTDIR));
                let r = self.fs().list_dir(d);
                if self.outcome(op, &r, want, 0, false) {
                    check_dir_listing(&self.m, d, &r.unwrap(), &format!("{op:?}"));
                }
            }
            Op::ReaddirStart { dir, take } => {
                let d = self.pick(*dir, Class::Dir);
                let want = self.m.node(d).and_then(|n| n.dir().map(|_| ()).ok_or(libc::ENOTDIR));
                let take = *take as usize % 6 + 1;
                let mut got = Vec::new();
                let r = self.fs().readdir(d, 0, |e| {
                    got.push(e);
                    got.len() < take
                });
                if self.outcome(op, &r, want, 0, false) {
                    assert_eq!(got[0].name, b".");
                    assert_eq!(got[0].ino, d);
                    if got.len() > 1 {
                        assert_eq!(got[1].name, b"..");
                        assert_eq!(got[1].ino, self.m.nodes[&d].parent);
                    }
                    let dm = self.m.nodes[&d].dir().unwrap().clone();
                    let mut st = Stream {
                        dir: d,
                        cookie: got.last().unwrap().cookie,
                        seen: Vec::new(),
                        survivors: dm.keys().cloned().collect(),
                        done: got.len() < take,
                    };
                    for e in got.iter().skip(2) {
                        assert_eq!(dm.get(&e.name), Some(&e.ino), "{op:?}: entry {:?}", e.name);
                        st.seen.push(e.name.clone());
                    }
                    if st.done {
                        assert_eq!(st.seen.len(), dm.len(), "{op:?}: short listing");
                    }
                    if self.streams.len() >= 4 {
                        self.streams.remove(0);
                    }
                    self.streams.push(st);
                }
            }
            Op::ReaddirMore { stream, take } => {
                if self.streams.is_empty() {
                    return;
                }
                let k = *stream as usize % self.streams.len();
                let take = if take % 3 == 0 { usize::MAX } else { *take as usize % 4 + 1 };
                let (d, cookie, done) =
                    (self.streams[k].dir, self.streams[k].cookie, self.streams[k].done);
                if done {
                    return;
                }
                let mut got = Vec::new();
                self.fs()
                    .readdir(d, cookie, |e| {
                        got.push(e);
                        got.len() < take
                    })
                    .unwrap_or_else(|e| panic!("{op:?}: readdir of live directory {d}: {e}"));
                let dm = self.m.nodes[&d].dir().unwrap().clone();
                let s = &mut self.streams[k];
                let mut last = s.cookie;
                for e in &got {
                    assert!(
                        e.cookie > last,
                        "{op:?}: cookies not increasing ({} after {last})",
                        e.cookie
                    );
                    last = e.cookie;
                    if e.cookie <= 2 {
                        assert_eq!((e.cookie, &e.name[..]), (2, &b".."[..]), "{op:?}: dot entries");
                        continue;
                    }
                    assert_eq!(
                        dm.get(&e.name),
                        Some(&e.ino),
                        "{op:?}: resumed entry {:?} not current",
                        e.name
                    );
                    if s.survivors.contains(&e.name) {
                        assert!(
                            !s.seen.contains(&e.name),
                            "{op:?}: survivor {:?} repeated",
                            e.name
                        );
                    }
                    s.seen.push(e.name.clone());
                }
                s.cookie = last;
                if got.len() < take {
                    s.done = true;
                    for n in &s.survivors {
                        assert!(
                            s.seen.contains(n),
                            "{op:?}: survivor {n:?} skipped\n{}",
                            self.log.join("\n")
                        );
                    }
                }
            }
            Op::Resolve { start, comps, follow } => {
                let s = self.pick(*start, Class::Dir);
                let mut path = self.m.path_of(s).unwrap_or_else(|| b"/".to_vec());
                let mut cur = Some(s);
                for &c in comps {
                    if path.last() != Some(&b'/') {
                        path.push(b'/');
                    }
                    let n = match cur {
                        Some(d) => self.existing_name(d, c),
                        None => name_of(c),
                    };
                    cur = cur.and_then(|d| self.m.lookup(d, &n).ok());
                    path.extend_from_slice(&n);
                }
                let want = self.m.resolve(&path, *follow);
                let r = self.fs().resolve(&path, *follow);
                if self.outcome(op, &r, want.map(|_| ()), 0, false) {
                    assert_eq!(
                        r.unwrap(),
                        want.unwrap(),
                        "{op:?}: resolved {}",
                        String::from_utf8_lossy(&path)
                    );
                }
            }
            Op::Statfs => check_statfs(self.fs(), &self.m, self.ninodes),
            Op::Evict => {
                self.fs().evict_idle();
                check_all(self.fs(), &self.m, self.ninodes, "after evict_idle");
            }
            Op::Compact { ino } => {
                let i = self.pick(*ino, Class::Any);
                let want = self.m.node(i).map(|_| ());
                let r = self.fs().compact(i);
                if self.outcome(op, &r, want, 4, false) {
                    touched.push(i);
                }
            }
            Op::Remount(how) => {
                let fs = self.fs.take().unwrap();
                let fs = remount(fs, *how);
                fs.set_atime_mode(AtimeMode::Off);
                self.fs = Some(fs);
                self.m.after_remount();
                check_all(self.fs(), &self.m, self.ninodes, &format!("after {how:?}"));
            }
        }
        for i in touched {
            if self.m.nodes.contains_key(&i) {
                check_node(self.fs(), &self.m, i, &format!("{op:?}"));
            }
        }
        if self.durable_each_op {
            let img = self.fs().medium().durable_image();
            let fs2 = Fs::mount(
                SimMedium::from_image(img),
                &MountOptions { workers: 1, atime: AtimeMode::Off, ..Default::default() },
            )
            .unwrap_or_else(|e| {
                panic!("durable image after {op:?} does not mount: {e}\n{}", self.log.join("\n"))
            });
            let mut m2 = self.m.clone();
            m2.after_remount();
            check_all(&fs2, &m2, self.ninodes, &format!("durable image after step {step} {op:?}"));
        }
        if self.nospc.replace(false) {
            // A failed operation must have changed nothing at all.
            check_all(
                self.fs(),
                &self.m,
                self.ninodes,
                &format!("after ENOSPC at step {step} {op:?}"),
            );
        } else if step % FULL_CHECK_EVERY == FULL_CHECK_EVERY - 1 {
            check_all(self.fs(), &self.m, self.ninodes, &format!("step {step}"));
        }
    }

    fn check_rw(&self, f: u64, _write: bool) -> Expect<()> {
        match self.m.node(f)?.kind {
            Kind::Dir(_) => Err(libc::EISDIR),
            Kind::Symlink(_) => Err(libc::EINVAL),
            Kind::File(_) => Ok(()),
        }
    }

    fn xattr_name_check(name: &[u8]) -> Expect<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(libc::ERANGE);
        }
        Ok(())
    }

    fn xattr_target_check(name: &[u8], n: &Node, write: bool) -> Expect<()> {
        if name.starts_with(b"user.") && matches!(n.kind, Kind::Symlink(_)) {
            return Err(if write { libc::EPERM } else { libc::ENODATA });
        }
        for p in [&b"user."[..], b"trusted.", b"security."] {
            if name.starts_with(p) {
                return if name.len() == p.len() { Err(libc::EINVAL) } else { Ok(()) };
            }
        }
        Err(libc::EOPNOTSUPP)
    }

    #[allow(clippy::too_many_arguments)]
    fn rename(
        &mut self,
        op: &Op,
        sdir: Pick,
        sname: u8,
        ddir: Pick,
        dname: u8,
        flags: u8,
        touched: &mut Vec<u64>,
    ) {
        let sp = self.pick(sdir, Class::Parent);
        let dp = self.pick(ddir, Class::Dir);
        let sname = self.existing_name(sp, sname);
        let dname = if dname.is_multiple_of(2) {
            self.existing_name(dp, dname / 2)
        } else {
            name_of(dname / 2)
        };
        let flags = match flags % 8 {
            0..=4 => RenameFlags::default(),
            5 => RenameFlags { noreplace: true, exchange: false },
            6 => RenameFlags { noreplace: false, exchange: true },
            _ => RenameFlags { noreplace: true, exchange: true },
        };
        let m = &self.m;
        // Linux's order of checks (do_renameat2, vfs_rename, shmem_rename2).
        let want: Expect<Option<(u64, Option<u64>)>> = (|| {
            if flags.noreplace && flags.exchange {
                return Err(libc::EINVAL);
            }
            m.node(sp)?.dir().ok_or(libc::ENOTDIR)?;
            m.node(dp)?.dir().ok_or(libc::ENOTDIR)?;
            if is_dot(&sname) {
                return Err(libc::EBUSY);
            }
            if is_dot(&dname) {
                return Err(if flags.noreplace { libc::EEXIST } else { libc::EBUSY });
            }
            let s = m.lookup(sp, &sname)?;
            let d = match m.lookup(dp, &dname) {
                Ok(d) => Some(d),
                Err(libc::ENOENT) => None,
                Err(e) => return Err(e),
            };
            if flags.noreplace && d.is_some() {
                return Err(libc::EEXIST);
            }
            if flags.exchange && d.is_none() {
                return Err(libc::ENOENT);
            }
            let s_dir = m.nodes[&s].is_dir();
            let d_dir = d.map(|d| m.nodes[&d].is_dir());
            if sp != dp {
                if s_dir && m.is_ancestor(s, dp) {
                    return Err(libc::EINVAL);
                }
                if let (Some(d), Some(true)) = (d, d_dir) {
                    if m.is_ancestor(d, sp) {
                        return Err(if flags.exchange { libc::EINVAL } else { libc::ENOTEMPTY });
                    }
                }
            }
            if d == Some(s) {
                return Ok(None);
            }
            if !flags.exchange {
                match d_dir {
                    Some(true) if !s_dir => return Err(libc::EISDIR),
                    Some(false) if s_dir => return Err(libc::ENOTDIR),
                    Some(true) if !m.nodes[&d.unwrap()].dir().unwrap().is_empty() => {
                        return Err(libc::ENOTEMPTY)
                    }
                    _ => {}
                }
            }
            Ok(Some((s, d)))
        })();
        let r = self.fs().rename(sp, &sname, dp, &dname, flags);
        if !self.outcome(op, &r, want.map(|_| ()), 4, false) {
            return;
        }
        let Some((s, d)) = want.unwrap() else { return };
        if flags.exchange {
            let d = d.unwrap();
            self.m.nodes.get_mut(&sp).unwrap().dir_mut().insert(sname.clone(), d);
            self.m.nodes.get_mut(&dp).unwrap().dir_mut().insert(dname.clone(), s);
            for (i, newp) in [(s, dp), (d, sp)] {
                let n = self.m.nodes.get_mut(&i).unwrap();
                if n.is_dir() {
                    n.parent = newp;
                }
                n.ctime = T::Now;
            }
            touched.extend([s, d]);
        } else {
            self.m.nodes.get_mut(&sp).unwrap().dir_mut().remove(&sname);
            self.m.nodes.get_mut(&dp).unwrap().dir_mut().insert(dname.clone(), s);
            let n = self.m.nodes.get_mut(&s).unwrap();
            if n.is_dir() {
                n.parent = dp;
            }
            n.ctime = T::Now;
            touched.push(s);
            if let Some(d) = d {
                if self.m.nodes[&d].is_dir() {
                    self.m.free(d);
                    self.streams.retain(|st| st.dir != d);
                } else {
                    self.m.nodes.get_mut(&d).unwrap().ctime = T::Now;
                    self.m.maybe_free(d);
                    if self.m.nodes.contains_key(&d) {
                        touched.push(d);
                    }
                }
            }
        }
        for p in [sp, dp] {
            self.m.nodes.get_mut(&p).unwrap().touch_mc();
            touched.push(p);
        }
        self.drop_survivor(sp, &sname);
        self.drop_survivor(dp, &dname);
    }
}

// -------------------------------------------------------------------- checking

fn check_time(what: &str, got: Ts, want: T) {
    match want {
        T::Exact(ts) => assert_eq!(got, ts, "{what}"),
        T::Now => {
            assert!(got.sec >= NOW_FLOOR, "{what}: {got:?} was not updated to the current time")
        }
        T::Any => {}
    }
}

fn check_node(fs: &Fs<SimMedium>, m: &Model, ino: u64, ctx: &str) {
    let n = &m.nodes[&ino];
    let a = fs.getattr(ino).unwrap_or_else(|e| panic!("{ctx}: getattr {ino}: {e}"));
    let w = |f: &str| format!("{ctx}: inode {ino} {f}");
    assert_eq!(a.ino, ino);
    assert_eq!(a.ftype, n.ftype(), "{}", w("type"));
    assert_eq!(a.perm, n.perm, "{}", w("perm"));
    assert_eq!((a.uid, a.gid), (n.uid, n.gid), "{}", w("owner"));
    assert_eq!(a.nlink, m.links(ino), "{}", w("nlink"));
    match &n.kind {
        Kind::File(f) => {
            assert_eq!(a.size, f.size, "{}", w("size"));
            assert_eq!(a.blocks % 8, 0, "{}", w("blocks in whole pages"));
            let pages = a.blocks / 8;
            assert!(
                pages >= f.nonzero_pages() && pages <= f.maybe.len() as u64,
                "{}: {pages} pages, model {}..={}",
                w("st_blocks"),
                f.nonzero_pages(),
                f.maybe.len()
            );
        }
        Kind::Dir(d) => {
            assert_eq!(a.size, 40 + 20 * d.len() as u64, "{}", w("directory size"));
            assert_eq!(a.blocks, 0, "{}", w("directory blocks"));
        }
        Kind::Symlink(t) => {
            assert_eq!(a.size, t.len() as u64, "{}", w("symlink size"));
            assert_eq!(a.blocks, 0, "{}", w("symlink blocks"));
        }
    }
    check_time(&w("atime"), a.atime, n.atime);
    check_time(&w("mtime"), a.mtime, n.mtime);
    check_time(&w("ctime"), a.ctime, n.ctime);
}

fn check_dir_listing(m: &Model, d: u64, got: &[DirEntry], ctx: &str) {
    let dm = m.nodes[&d].dir().unwrap();
    let mut names = BTreeSet::new();
    let mut cookies = BTreeSet::new();
    for e in got {
        assert!(names.insert(e.name.clone()), "{ctx}: {:?} listed twice", e.name);
        assert!(cookies.insert(e.cookie) && e.cookie > 2, "{ctx}: bad cookie {}", e.cookie);
        assert_eq!(
            dm.get(&e.name),
            Some(&e.ino),
            "{ctx}: entry {:?}",
            String::from_utf8_lossy(&e.name)
        );
        assert_eq!(e.ftype, m.nodes[&e.ino].ftype(), "{ctx}: entry type of {:?}", e.name);
    }
    assert_eq!(
        names.len(),
        dm.len(),
        "{ctx}: directory {d} lists {names:?}, model has {:?}",
        dm.keys()
    );
}

fn check_statfs(fs: &Fs<SimMedium>, m: &Model, ninodes: u64) {
    let s = fs.statfs();
    assert_eq!(s.files, ninodes);
    assert_eq!(s.ffree, ninodes - m.nodes.len() as u64, "statfs free inodes");
    assert_eq!((s.bsize, s.namelen), (4096, 255));
    assert!(s.bavail <= s.bfree && s.bfree <= s.blocks, "{s:?}");
}

fn check_file_bytes(fs: &Fs<SimMedium>, ino: u64, f: &FileData, ctx: &str) {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    if f.size <= (1 << 20) {
        ranges.push((0, f.size + 100));
    } else {
        for &pg in f.pages.keys() {
            ranges.push((pg.saturating_sub(1) * PAGE, 3 * PAGE));
        }
        ranges.push((0, 2 * PAGE));
        ranges.push((f.size - 1 - (f.size - 1) % PAGE, PAGE + 10));
        ranges.push((f.size / 2, PAGE));
    }
    for (off, len) in ranges {
        let mut buf = vec![0x5au8; len as usize];
        let n = fs.read(ino, off, &mut buf).unwrap_or_else(|e| panic!("{ctx}: read {ino}: {e}"));
        let exp = f.read(off, len as usize);
        assert_eq!(n, exp.len(), "{ctx}: inode {ino} read length at {off}");
        assert!(
            buf[..n] == exp[..],
            "{ctx}: inode {ino} bytes differ in [{off}, {})",
            off + n as u64
        );
    }
}

/// Compare the whole pool with the model.
fn check_all(fs: &Fs<SimMedium>, m: &Model, ninodes: u64, ctx: &str) {
    assert_fsck_clean(fs, ctx);
    // Every name, from the root down.
    let mut reached = BTreeSet::from([ROOT]);
    let mut queue = vec![ROOT];
    while let Some(d) = queue.pop() {
        let got = fs.list_dir(d).unwrap_or_else(|e| panic!("{ctx}: list_dir {d}: {e}"));
        check_dir_listing(m, d, &got, ctx);
        for e in got {
            if reached.insert(e.ino) && m.nodes[&e.ino].is_dir() {
                queue.push(e.ino);
            }
        }
    }
    // Every inode, named or open.
    for (&ino, n) in &m.nodes {
        assert!(
            reached.contains(&ino) || n.open > 0,
            "{ctx}: model inode {ino} unreachable and not open"
        );
        check_node(fs, m, ino, ctx);
        match &n.kind {
            Kind::File(f) => check_file_bytes(fs, ino, f, ctx),
            Kind::Symlink(t) => assert_eq!(&fs.readlink(ino).unwrap(), t, "{ctx}: symlink {ino}"),
            Kind::Dir(_) => {}
        }
        let names: BTreeSet<Vec<u8>> = fs.listxattr(ino).unwrap().into_iter().collect();
        assert_eq!(
            names,
            n.xattrs.keys().cloned().collect::<BTreeSet<_>>(),
            "{ctx}: xattrs of {ino}"
        );
        for (k, v) in &n.xattrs {
            assert_eq!(&fs.getxattr(ino, k).unwrap(), v, "{ctx}: xattr {k:?} of {ino}");
        }
        assert_eq!(fs.open_count(ino), n.open, "{ctx}: open handles of {ino}");
    }
    for &g in m.graveyard.iter().take(8) {
        assert!(
            matches!(fs.getattr(g), Err(Error::NotFound)),
            "{ctx}: freed inode {g} still answers"
        );
    }
    check_statfs(fs, m, ninodes);
}

fn run_sequence(ops: &[Op], durable_each_op: bool, pool: u64, inodes: u64) {
    let mut h = Harness::new(durable_each_op, pool, inodes);
    for (step, op) in ops.iter().enumerate() {
        h.run(op, step);
    }
    check_all(h.fs(), &h.m, h.ninodes, "end of sequence");
    let fs = remount(h.fs.take().unwrap(), Remount::Clean);
    fs.set_atime_mode(AtimeMode::Off);
    h.m.after_remount();
    check_all(&fs, &h.m, h.ninodes, "end, after a clean remount");
}

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run_prop(
    default_cases: u32,
    max_ops: usize,
    remounts: bool,
    durable_each_op: bool,
    (pool, inodes): (u64, u64),
) {
    let cfg =
        Config { cases: cases(default_cases), failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new(cfg);
    let strat = proptest::collection::vec(op_strategy(remounts), 1..max_ops);
    if let Err(e) = runner.run(&strat, |ops| {
        run_sequence(&ops, durable_each_op, pool, inodes);
        Ok(())
    }) {
        panic!("{e}");
    }
}

#[test]
fn random_ops_with_remounts_match_the_model() {
    run_prop(320, 120, true, false, (6 << 20, 256));
}

#[test]
fn durable_after_every_op() {
    run_prop(64, 60, false, true, (6 << 20, 256));
}

/// A pool of 320 KiB and 64 inodes: ENOSPC is frequent, and after each one the
/// whole pool must still equal the model (a failed operation changes nothing).
#[test]
fn tiny_pool_enospc_changes_nothing() {
    run_prop(200, 150, true, false, (320 << 10, 64));
}
