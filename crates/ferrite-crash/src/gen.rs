//! The model-based workload generator: seeded random operations chosen from the
//! current model state, so most of them are valid and the invalid ones are the
//! interesting kind (names that exist, directories that are not empty, renames into
//! a subtree).
//!
//! Invariants: the sequence depends only on the seed and the configuration; it is
//! generated against the model alone (the model predicts every outcome), so a parent
//! process can regenerate exactly what a child process ran.

use crate::model::{join, Model, Op, RenameKind, XattrHow};
use crate::rng::Rng;

/// Limits of a generated workload.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// Largest file offset written.
    pub max_file: u64,
    /// Stop creating when the tree has this many paths.
    pub max_nodes: usize,
    /// Stop growing files when the model holds this many bytes.
    pub max_bytes: u64,
    /// Generate clean unmount + mount.
    pub remount: bool,
    /// Generate crash + recover (simulated media only).
    pub crash_remount: bool,
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            max_file: 48 * 1024,
            max_nodes: 40,
            max_bytes: 400 * 1024,
            remount: true,
            crash_remount: true,
        }
    }
}

const NAMES: [&str; 8] = ["a", "b", "c", "d", "e", "f", "g", "h"];

/// A generator of operations.
pub struct Gen {
    rng: Rng,
    cfg: GenConfig,
    next_handle: u32,
}

fn size_choice(rng: &mut Rng) -> u64 {
    match rng.below(6) {
        0 => rng.range(1, 64),
        1 => rng.range(65, 2048),
        2 => 4096,
        3 => rng.range(2049, 4095),
        4 => 4096 * rng.range(2, 4),
        _ => rng.range(4097, 14000),
    }
}

impl Gen {
    /// A generator for `seed`.
    pub fn new(seed: u64, cfg: GenConfig) -> Gen {
        Gen { rng: Rng::new(seed), cfg, next_handle: 1 }
    }

    fn name(&mut self) -> &'static str {
        NAMES[self.rng.below(NAMES.len() as u64) as usize]
    }

    fn offset(&mut self, size: u64) -> u64 {
        let max = self.cfg.max_file;
        let o = match self.rng.below(5) {
            0 => 0,
            1 => size,
            2 => (self.rng.below(max / 4096) + 1).min(max / 4096) * 4096,
            3 => self.rng.below(size.max(1) + 1),
            _ => self.rng.below(max),
        };
        o.min(max)
    }

    fn new_path(&mut self, m: &Model) -> String {
        let dirs = m.dirs();
        let d = self.rng.pick(&dirs).clone();
        join(&d, self.name())
    }

    fn any_path(&mut self, m: &Model) -> Option<String> {
        let paths: Vec<String> = m.paths().into_iter().skip(1).map(|(p, _)| p).collect();
        (!paths.is_empty()).then(|| self.rng.pick(&paths).clone())
    }

    fn file(&mut self, m: &Model) -> Option<String> {
        let f = m.files();
        (!f.is_empty()).then(|| self.rng.pick(&f).clone())
    }

    /// The next operation for model state `m`.
    pub fn next(&mut self, m: &Model) -> Op {
        loop {
            if let Some(op) = self.try_next(m) {
                return op;
            }
        }
    }

    fn try_next(&mut self, m: &Model) -> Option<Op> {
        let full = m.paths().len() >= self.cfg.max_nodes;
        let heavy = m.total_bytes() >= self.cfg.max_bytes;
        let pat = self.rng.below(256) as u8;
        let k = self.rng.below(105);
        Some(match k {
            0..=17 => {
                let path = self.file(m)?;
                let size = m.size_of(&path);
                let off = self.offset(size);
                let len = size_choice(&mut self.rng).min(self.cfg.max_file + 4096 - off);
                if heavy && off + len > size {
                    return None;
                }
                Op::Write { path, off, len, pat }
            }
            18..=23 => {
                let path = self.file(m)?;
                let len = size_choice(&mut self.rng);
                if heavy || m.size_of(&path) + len > self.cfg.max_file {
                    return None;
                }
                Op::Append { path, len, pat }
            }
            24..=29 => {
                let path = self.file(m)?;
                let size = m.size_of(&path);
                let to = match self.rng.below(4) {
                    0 => 0,
                    1 => self.rng.below(size + 1),
                    2 => size / 4096 * 4096,
                    _ => size + self.rng.below(9000),
                };
                if heavy && to > size {
                    return None;
                }
                Op::Truncate { path, size: to.min(self.cfg.max_file) }
            }
            30..=32 => {
                let path = self.file(m)?;
                let size = m.size_of(&path);
                let off = self.offset(size);
                let len = self.rng.range(1, 12000);
                if heavy {
                    return None;
                }
                let keep_size = self.rng.chance(1, 3);
                // One in four is FALLOC_FL_UNSHARE_RANGE, decided by the pattern byte
                // a fallocate does not use: the random stream (and so every other
                // operation generated) stays as it was without unshares.
                if pat < 64 {
                    return Some(Op::Unshare { path, off, len, keep_size });
                }
                Op::Fallocate { path, off, len, keep_size }
            }
            33..=35 => {
                let path = self.file(m)?;
                let size = m.size_of(&path);
                let off = self.rng.below(size + 100);
                if self.rng.chance(1, 3) {
                    // Collapse or insert whole pages; some ranges are refused (EINVAL).
                    let off = self.rng.below(size / 4096 + 1) * 4096;
                    let len = self.rng.range(1, 4) * 4096;
                    let insert = self.rng.chance(1, 2);
                    if heavy || (insert && size + len > self.cfg.max_file) {
                        return None;
                    }
                    return Some(Op::Shift { path, off, len, insert });
                }
                Op::Punch { path, off, len: self.rng.range(1, 10000) }
            }
            36..=45 => {
                if full {
                    return None;
                }
                Op::Create { path: self.new_path(m), perm: 0o600 + self.rng.below(0o200) as u32 }
            }
            46..=50 => {
                if full {
                    return None;
                }
                Op::Mkdir { path: self.new_path(m), perm: 0o700 + self.rng.below(0o100) as u32 }
            }
            51..=53 => {
                if full {
                    return None;
                }
                let long = self.rng.chance(1, 4);
                let target = if long {
                    "t/".repeat(self.rng.range(1100, 2000) as usize)
                } else {
                    format!("../{}", self.rng.pick(&NAMES))
                };
                Op::Symlink { path: self.new_path(m), target }
            }
            54..=57 => {
                if full {
                    return None;
                }
                let from = self.any_path(m)?;
                Op::Link { from, to: self.new_path(m) }
            }
            58..=65 => Op::Unlink { path: self.any_path(m)? },
            66..=69 => Op::Rmdir { path: self.any_path(m)? },
            70..=79 => {
                let from = self.any_path(m)?;
                let to = if self.rng.chance(1, 2) { self.any_path(m)? } else { self.new_path(m) };
                let kind = match self.rng.below(5) {
                    0 => RenameKind::NoReplace,
                    1 => RenameKind::Exchange,
                    _ => RenameKind::Plain,
                };
                Op::Rename { from, to, kind }
            }
            80..=81 => Op::Chmod { path: self.any_path(m)?, perm: self.rng.below(0o1000) as u32 },
            82 => Op::Chown {
                path: self.any_path(m)?,
                uid: self.rng.below(3) as u32 * 500,
                gid: self.rng.below(3) as u32 * 100,
            },
            83..=84 => {
                let t = |r: &mut Rng| {
                    r.chance(2, 3).then(|| ferrite_core::Ts {
                        sec: 1_600_000_000 + r.below(100_000_000) as i64,
                        nsec: r.below(1_000_000_000) as u32,
                    })
                };
                let (atime, mtime) = (t(&mut self.rng), t(&mut self.rng));
                Op::Utimens { path: self.any_path(m)?, atime, mtime }
            }
            85..=87 => {
                let how = *self.rng.pick(&[
                    XattrHow::Any,
                    XattrHow::Any,
                    XattrHow::Create,
                    XattrHow::Replace,
                ]);
                let len = if self.rng.chance(1, 5) {
                    self.rng.range(1000, 3000)
                } else {
                    self.rng.range(0, 100)
                };
                Op::SetXattr {
                    path: self.any_path(m)?,
                    name: format!("user.{}", self.rng.pick(&NAMES)),
                    len,
                    pat,
                    how,
                }
            }
            88 => Op::RemoveXattr {
                path: self.any_path(m)?,
                name: format!("user.{}", self.rng.pick(&NAMES)),
            },
            89..=91 => {
                // Open, or use / close a handle.
                if let Some((&h, _)) = m.handles.iter().next() {
                    if self.rng.chance(1, 2) {
                        return Some(Op::Release { handle: h });
                    }
                    if heavy {
                        return None;
                    }
                    let off = self.rng.below(self.cfg.max_file / 2);
                    return Some(Op::WriteHandle {
                        handle: h,
                        off,
                        len: size_choice(&mut self.rng),
                        pat,
                    });
                }
                let path = self.file(m)?;
                let handle = self.next_handle;
                self.next_handle += 1;
                Op::Open { path, handle }
            }
            92..=93 => Op::Compact { path: self.any_path(m).unwrap_or_else(|| "/".into()) },
            94 => Op::Fsync { path: self.any_path(m).unwrap_or_else(|| "/".into()) },
            95..=96 => {
                if !self.cfg.remount {
                    return None;
                }
                Op::Remount
            }
            97 => {
                if !self.cfg.crash_remount {
                    return None;
                }
                Op::CrashRemount
            }
            98..=99 => {
                // Rename a directory somewhere (possibly into itself: EINVAL).
                let dirs = m.dirs();
                if dirs.len() < 2 {
                    return None;
                }
                let from = self.rng.pick(&dirs[1..]).clone();
                let d: String = self.rng.pick(&dirs).clone();
                let to = join(&d, self.name());
                Op::Rename { from, to, kind: RenameKind::Plain }
            }
            _ => return self.clone_op(m, heavy),
        })
    }

    /// A clone (FICLONERANGE): mostly page-aligned ranges inside the source, to its
    /// end of file or whole pages, into another file or past the range in the same
    /// file (sometimes overlapping it); sometimes unaligned offsets or lengths and
    /// source ranges at or past the end of file (EINVAL, or nothing at exactly EOF).
    fn clone_op(&mut self, m: &Model, heavy: bool) -> Option<Op> {
        const P: u64 = 4096;
        let src = self.file(m)?;
        let dst = if self.rng.chance(1, 4) { src.clone() } else { self.file(m)? };
        let (ssize, dsize) = (m.size_of(&src), m.size_of(&dst));
        let mut off_in = self.rng.below(ssize.div_ceil(P).max(1)) * P;
        let mut len = match self.rng.below(4) {
            0 => 0,
            1 => ssize.saturating_sub(off_in),
            _ => self.rng.range(1, 4) * P,
        };
        let eff = |off_in: u64, len: u64| {
            let left = ssize.saturating_sub(off_in);
            if len == 0 {
                left
            } else {
                len.min(left)
            }
        };
        let mut off_out = match self.rng.below(4) {
            0 => off_in,
            1 => dsize.next_multiple_of(P),
            _ => self.rng.below(self.cfg.max_file / P) * P,
        };
        if src == dst && self.rng.chance(3, 4) {
            // Past the source range (whole pages): no overlap.
            off_out = (off_in + eff(off_in, len)).next_multiple_of(P) + self.rng.below(3) * P;
        }
        if self.rng.chance(1, 6) {
            match self.rng.below(4) {
                0 => off_in += self.rng.range(1, P - 1),
                1 => off_out += self.rng.range(1, P - 1),
                2 => len = self.rng.range(1, 3 * P) | 1,
                _ => off_in = ssize.next_multiple_of(P) + self.rng.below(2) * P,
            }
        }
        let end = off_out + eff(off_in, len);
        if end > self.cfg.max_file + P || (heavy && end > dsize) {
            return None;
        }
        Some(Op::Clone { src, off_in, dst, off_out, len })
    }
}

/// `n` operations from `seed`, generated against a scratch model (every outcome
/// predicted by the model).
pub fn generate(seed: u64, n: usize, cfg: GenConfig) -> Vec<Op> {
    let mut g = Gen::new(seed, cfg);
    let mut m = Model::new();
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let op = g.next(&m);
        let _ = m.apply(&op);
        ops.push(op);
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_deterministic_and_varied() {
        let a = generate(5, 300, GenConfig::default());
        let b = generate(5, 300, GenConfig::default());
        assert_eq!(a, b);
        assert_ne!(a, generate(6, 300, GenConfig::default()));
        let kinds: std::collections::HashSet<_> = a.iter().map(std::mem::discriminant).collect();
        assert!(kinds.len() >= 18, "only {} kinds of operation", kinds.len());
        let mut m = Model::new();
        let ok = a.iter().filter(|o| m.apply(o).is_ok()).count();
        assert!(ok * 2 > a.len(), "most generated operations should be valid ({ok}/{})", a.len());
    }
}
