//! The named workload suite: every mutating operation and its edge cases, plus
//! seeded random workloads from the model-based generator.
//!
//! Invariant: a workload is a fixed list of operations (random ones are generated
//! up front from their seed), so running it twice issues the same stores, flushes
//! and fences (the pool has one shard and a fixed uuid; nothing depends on time but
//! the timestamp values themselves).
//!
//! Concurrent workloads (`mt-*`) add an [`MtPlan`]: each operation belongs to a
//! simulated thread, and the operations run in *rounds* fixed up front from the
//! seed. A round holds either one operation (any kind) or several operations of
//! different threads that may share it ([`may_share`]): single-inode operations
//! ([`groupable`]) on different files, or on one file when they commute ([`commute`]),
//! and, in a workload that groups names (`mt-dir`), namespace operations
//! ([`names_of`]) none of whose names is another's or above it. The step scheduler
//! ([`crate::sched`]) interleaves them at every store, flush and fence; a thread
//! that wants a lock another thread of the round holds across medium steps (an
//! inode's state or range lock, the journal or rename lock) gives the scheduler's
//! token away instead of blocking (`ferrite_core::sim::set_wait_hook`). Operations
//! whose crash states would depend on the order of their commits never share a
//! round: they interleave with the others at operation boundaries only.

use crate::gen::{generate, GenConfig};
use crate::model::{Op, RenameKind, XattrHow};
use crate::rng::Rng;
use ferrite_core::Ts;

/// How a concurrent workload runs.
#[derive(Clone, Debug)]
pub struct MtPlan {
    /// Simulated threads (numbered 1..=threads; thread 0 is the driver: mkfs, mount).
    pub threads: u32,
    /// Simulated thread of each operation.
    pub thread_of: Vec<u32>,
    /// Rounds of 1-based operation indices, in order; together they list every
    /// operation once, in increasing order.
    pub rounds: Vec<Vec<usize>>,
    /// Seed of the step scheduler.
    pub seed: u64,
    /// Simulate the old global fence (any thread's fence persists every thread's
    /// flushes): only to show what per-thread fences catch.
    pub global_fence: bool,
}

/// The file a single-inode operation changes, if it may share a round with
/// operations of other threads on other files.
pub fn groupable(op: &Op) -> Option<&str> {
    match op {
        Op::Write { path, .. }
        | Op::Append { path, .. }
        | Op::Truncate { path, .. }
        | Op::Fallocate { path, .. }
        | Op::Punch { path, .. }
        | Op::Unshare { path, .. }
        | Op::Shift { path, .. }
        | Op::Chmod { path, .. }
        | Op::Chown { path, .. }
        | Op::SetXattr { path, .. }
        | Op::RemoveXattr { path, .. }
        | Op::Fsync { path }
        | Op::Compact { path } => Some(path),
        _ => None,
    }
}

/// May `a` and `b` (of different threads, on one file) share a round: writes of
/// disjoint byte ranges, whose result is the same in either order (contents, and a
/// size that is the largest end), or any single-inode operation beside a
/// compaction or an fsync (which change nothing visible), so a crash state is the
/// state before the round with any subset of them applied. Neighbours in one page
/// serialize on the page lock; others copy their data in parallel and commit one
/// after the other.
pub fn commute(a: &Op, b: &Op) -> bool {
    let visible = |o: &Op| !matches!(o, Op::Compact { .. } | Op::Fsync { .. });
    if groupable(a).is_some() && groupable(b).is_some() && (!visible(a) || !visible(b)) {
        // Compaction (thorough GC of the log) and fsync change nothing visible.
        return true;
    }
    match (a, b) {
        (Op::Write { path: p, off: o, len: l, .. }, Op::Write { path: q, off: x, len: n, .. }) => {
            p == q && (o + l <= *x || x + n <= *o)
        }
        _ => false,
    }
}

/// The names a namespace operation may share a round by (with a workload that
/// groups them, `mt-dir`): creates, mkdirs, unlinks, rmdirs and renames.
pub fn names_of(op: &Op) -> Option<Vec<&str>> {
    match op {
        Op::Create { path, .. } | Op::Mkdir { path, .. } => Some(vec![path]),
        Op::Unlink { path } | Op::Rmdir { path } => Some(vec![path]),
        Op::Rename { from, to, .. } => Some(vec![from, to]),
        _ => None,
    }
}

/// Paths an operation that may share a round names (its file, or its names).
fn touched(op: &Op) -> Vec<&str> {
    names_of(op).unwrap_or_else(|| groupable(op).into_iter().collect())
}

/// `a` is `b` or one of its ancestors.
fn covers(a: &str, b: &str) -> bool {
    b.strip_prefix(a).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// May operations `a` and `b` of different threads share a round? Single-inode
/// operations of different files, or of one file when they [`commute`]; namespace
/// operations ([`names_of`]) when no name of either is a name of the other or
/// above it (their results then do not depend on their order: each changes its own
/// names, and the link counts they move add up).
pub fn may_share(a: &Op, b: &Op) -> bool {
    if names_of(a).is_none() && names_of(b).is_none() {
        return groupable(a) != groupable(b) || commute(a, b);
    }
    let (x, y) = (touched(a), touched(b));
    x.iter().all(|p| y.iter().all(|q| !covers(p, q) && !covers(q, p)))
}

/// A concurrent workload: the operations of each thread, in its order, interleaved
/// into rounds drawn from `seed` (with `group`, operations of different threads
/// that [`may_share`] share rounds, namespace operations only with `names`;
/// without `group`, every round is one operation).
fn mt(
    name: &str,
    about: &str,
    per_thread: Vec<Vec<Op>>,
    seed: u64,
    group: bool,
    names: bool,
) -> Workload {
    let mut rng = Rng::derive(seed, name.bytes().fold(0u64, |h, b| h.wrapping_mul(131) ^ b as u64));
    let n = per_thread.len();
    let mut next = vec![0usize; n];
    let mut ops = Vec::new();
    let mut thread_of = Vec::new();
    let mut rounds = Vec::new();
    loop {
        let mut avail: Vec<usize> = (0..n).filter(|&t| next[t] < per_thread[t].len()).collect();
        if avail.is_empty() {
            break;
        }
        for i in (1..avail.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            avail.swap(i, j);
        }
        let mut round: Vec<usize> = Vec::new(); // threads
        let mut taken: Vec<&Op> = Vec::new();
        for t in avail {
            let op = &per_thread[t][next[t]];
            let shareable = group && (groupable(op).is_some() || (names && names_of(op).is_some()));
            if round.is_empty() {
                round.push(t);
                taken.push(op);
                if !shareable {
                    break;
                }
            } else if shareable {
                let fits = taken.iter().all(|o| may_share(o, op));
                if fits && rng.chance(3, 4) {
                    round.push(t);
                    taken.push(op);
                }
            }
        }
        let mut r = Vec::new();
        for t in round {
            ops.push(per_thread[t][next[t]].clone());
            thread_of.push(t as u32 + 1);
            next[t] += 1;
            r.push(ops.len());
        }
        rounds.push(r);
    }
    let mut x = w(name, about, MB, ops);
    x.mt = Some(MtPlan {
        threads: n as u32,
        thread_of,
        rounds,
        seed: seed ^ 0x5c4e_d01e,
        global_fence: false,
    });
    x
}

/// The concurrent workloads (`mt-*`), seeded by `seed`.
pub fn mt_suite(seed: u64) -> Vec<Workload> {
    let private = (1..=3u8)
        .map(|t| {
            let f = format!("/p{t}");
            let p = |x: u8| t * 40 + x;
            vec![
                create(&f),
                write(&f, 0, 100, p(1)),
                write(&f, 0, 4096, p(2)),
                write(&f, 5000, 3000, p(3)),
                append(&f, 700, p(4)),
                write(&f, 50, 200, p(5)),
                write(&f, 0, 24 * KB, p(6)),
                append(&f, 5000, p(7)),
                truncate(&f, 2000),
                Op::Fallocate { path: f.clone(), off: 0, len: 16 * KB, keep_size: false },
                Op::Punch { path: f.clone(), off: 4096, len: 4096 },
                chmod(&f, 0o600),
                setx(&f, "user.t", 60, p(8), XattrHow::Any),
                write(&f, 8192, 8192, p(9)),
            ]
        })
        .collect();
    let shared = (1..=3u8)
        .map(|t| {
            let mut o = Vec::new();
            if t == 1 {
                o.push(create("/s"));
            }
            let base = t as u64 * 16 * KB;
            o.push(write("/s", base, 4096, t));
            o.push(write("/s", 2000, 7000, 10 + t));
            o.push(append("/s", 300 + t as u64 * 100, 20 + t));
            o.push(write("/s", base + 100, 200, 30 + t));
            // Neighbours in page 0: embedded writes that wait for each other's
            // page lock when they share a round.
            o.push(write("/s", 64 + t as u64 * 500, 300, 70 + t));
            o.push(write("/s", base + 4096, 4096, 80 + t));
            o.push(write("/s", base + 8192 + 100, 1000, 90 + t));
            o.push(append("/s", 4096, 40 + t));
            if t == 3 {
                o.push(truncate("/s", 40 * KB));
            }
            o.push(write("/s", base, 12 * KB, 50 + t));
            o.push(append("/s", 50, 60 + t));
            o
        })
        .collect();
    let dir = (1..=3u8)
        .map(|t| {
            let mut o = Vec::new();
            if t == 1 {
                o.push(mkdir("/d"));
            }
            for i in 0..4 {
                o.push(create(&format!("/d/a{t}{i}")));
                o.push(rename(&format!("/d/a{t}{i}"), &format!("/d/b{i}")));
                if i % 2 == 1 {
                    o.push(unlink(&format!("/d/b{}", i - 1)));
                    o.push(mkdir(&format!("/d/s{t}")));
                } else {
                    o.push(rmdir(&format!("/d/s{t}")));
                }
            }
            o.push(rename("/d/b1", &format!("/d/c{t}")));
            o.push(unlink(&format!("/d/c{t}")));
            o
        })
        .collect();
    let gc = (1..=3u8)
        .map(|t| {
            let mut o = Vec::new();
            if t < 3 {
                let f = format!("/g{t}");
                o.push(create(&f));
                for i in 0..24u64 {
                    o.push(write(&f, (i % 2) * 100, 300, t * 50 + i as u8));
                    if i % 6 == 5 {
                        o.push(chmod(&f, 0o600 + i as u32));
                        o.push(write(&f, 4096, 4096, i as u8));
                    }
                }
            } else {
                o.push(create("/g3"));
                for i in 0..4u64 {
                    o.push(write("/g3", 0, 4096, 200 + i as u8));
                    o.push(Op::Compact { path: s("/g1") });
                    o.push(Op::Compact { path: s("/g2") });
                    o.push(write("/g3", 100, 50, 210 + i as u8));
                }
            }
            o
        })
        .collect();
    let mut random = generate(seed.wrapping_add(200), 90, GenConfig::default());
    random.retain(|op| !matches!(op, Op::Remount | Op::CrashRemount));
    // The generated order is kept (each operation is its own round); the threads
    // are drawn per operation, a handle's operations staying on one thread.
    let mut rng = Rng::derive(seed, 0x3a7d);
    let thread_of: Vec<u32> = random
        .iter()
        .map(|op| match op {
            Op::Open { handle, .. } | Op::Release { handle } | Op::WriteHandle { handle, .. } => {
                *handle % 3 + 1
            }
            _ => rng.below(3) as u32 + 1,
        })
        .collect();
    let mut rnd = w(
        "mt-random",
        &format!(
            "90 generated operations (seed {}) spread over 3 threads, one per round",
            seed.wrapping_add(200)
        ),
        MB,
        random,
    );
    rnd.mt = Some(MtPlan {
        threads: 3,
        rounds: (1..=thread_of.len()).map(|k| vec![k]).collect(),
        thread_of,
        seed: seed ^ 0x5c4e_d01e,
        global_fence: false,
    });
    vec![
        mt("mt-private", "3 threads on private files, interleaved at every store/flush/fence", private, seed, true, false),
        mt("mt-shared-file", "3 threads on one file: disjoint writes in shared rounds, overlapping ones, O_APPEND appends, truncate", shared, seed, true, false),
        mt("mt-dir", "3 threads in one directory: create / rename-over / unlink / mkdir / rmdir storms, those of distinct names in shared rounds", dir, seed, true, true),
        mt("mt-gc", "2 writers whose overwrites feed fast GC, a third thread compacting their logs beside them", gc, seed, true, false),
        rnd,
    ]
}

/// A named workload.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Name (`--workload NAME`).
    pub name: String,
    /// What it exercises.
    pub about: String,
    /// Pool bytes.
    pub pool: u64,
    /// Inode slots (0: the mkfs default).
    pub inodes: u64,
    /// ENOSPC is an expected outcome of any operation (the model then expects no change).
    pub nospc: bool,
    /// Explore the fences of mkfs itself.
    pub mkfs_points: bool,
    /// The operations.
    pub ops: Vec<Op>,
    /// Concurrent workloads: threads and rounds (None: one thread, the driver's).
    pub mt: Option<MtPlan>,
    /// Direct-client workloads: parties, steps and rounds (see `clients`).
    pub clients: Option<crate::clients::ClientPlan>,
}

fn s(x: &str) -> String {
    x.to_string()
}
fn create(p: &str) -> Op {
    Op::Create { path: s(p), perm: 0o644 }
}
fn mkdir(p: &str) -> Op {
    Op::Mkdir { path: s(p), perm: 0o755 }
}
fn write(p: &str, off: u64, len: u64, pat: u8) -> Op {
    Op::Write { path: s(p), off, len, pat }
}
fn append(p: &str, len: u64, pat: u8) -> Op {
    Op::Append { path: s(p), len, pat }
}
fn truncate(p: &str, size: u64) -> Op {
    Op::Truncate { path: s(p), size }
}
fn unlink(p: &str) -> Op {
    Op::Unlink { path: s(p) }
}
fn rmdir(p: &str) -> Op {
    Op::Rmdir { path: s(p) }
}
fn rename(a: &str, b: &str) -> Op {
    Op::Rename { from: s(a), to: s(b), kind: RenameKind::Plain }
}
fn exchange(a: &str, b: &str) -> Op {
    Op::Rename { from: s(a), to: s(b), kind: RenameKind::Exchange }
}
fn noreplace(a: &str, b: &str) -> Op {
    Op::Rename { from: s(a), to: s(b), kind: RenameKind::NoReplace }
}
fn link(a: &str, b: &str) -> Op {
    Op::Link { from: s(a), to: s(b) }
}
fn symlink(p: &str, t: &str) -> Op {
    Op::Symlink { path: s(p), target: s(t) }
}
fn clone(src: &str, off_in: u64, dst: &str, off_out: u64, len: u64) -> Op {
    Op::Clone { src: s(src), off_in, dst: s(dst), off_out, len }
}
fn unshare(p: &str, off: u64, len: u64, keep_size: bool) -> Op {
    Op::Unshare { path: s(p), off, len, keep_size }
}
fn chmod(p: &str, perm: u32) -> Op {
    Op::Chmod { path: s(p), perm }
}
fn setx(p: &str, name: &str, len: u64, pat: u8, how: XattrHow) -> Op {
    Op::SetXattr { path: s(p), name: s(name), len, pat, how }
}

const KB: u64 = 1024;
const MB: u64 = 1024 * 1024;

pub(crate) fn w(name: &str, about: &str, pool: u64, ops: Vec<Op>) -> Workload {
    Workload {
        name: name.into(),
        about: about.into(),
        pool,
        inodes: 0,
        nospc: false,
        mkfs_points: false,
        ops,
        mt: None,
        clients: None,
    }
}

/// Number of seeded random workloads in the suite.
pub const RANDOM_WORKLOADS: u64 = 4;

/// The whole suite. `seed` seeds the random workloads.
pub fn suite(seed: u64) -> Vec<Workload> {
    let mut v = vec![
        {
            let mut x = w(
                "mkfs",
                "crash during mkfs, then a first file",
                512 * KB,
                vec![create("/a"), write("/a", 0, 300, 1)],
            );
            x.mkfs_points = true;
            x
        },
        w("write-small", "sub-page writes embedded in the log, overlays, merge after MAX_PAGE_OPS", MB, {
            let mut o = vec![
                create("/f"),
                write("/f", 0, 100, 1),
                write("/f", 50, 100, 2),
                write("/f", 4000, 200, 3),
                write("/f", 8202, 3000, 4),
                write("/f", 1, 1, 5),
            ];
            // More overlays on page 0 than a page may carry: the last ones merge the
            // page into a new block (copy-on-write).
            for i in 0..ferrite_core::MAX_PAGE_OPS as u64 + 2 {
                o.push(write("/f", 200 + i * 200, 100, 10 + i as u8));
            }
            o.push(write("/f", 6000, 2048, 30));
            o.push(Op::Fsync { path: s("/f") });
            o
        }),
        w("rewrite-in-place", "one sub-page range rewritten in place past a full overlay list: the hidden overlays dropped, their log pages freed by fast GC", MB, {
            // Three pages, so that page 0 is not the file's last (whose list is longer).
            let mut o = vec![create("/r"), write("/r", 0, 12288, 1)];
            for i in 0..3 * ferrite_core::MAX_PAGE_OPS as u64 {
                o.push(write("/r", 128, 64, 2 + i as u8));
                if i % 7 == 3 {
                    // A partial overlap (kept) and a write that covers two older ones.
                    o.push(write("/r", 160, 64, 100 + i as u8));
                    o.push(write("/r", 64, 256, 150 + i as u8));
                }
            }
            o.push(Op::Fsync { path: s("/r") });
            o
        }),
        w("append-in-place", "appends of 64 B and more written in place past the end of file (format v7): runs across pages, through GC, a remount, a crash, a truncate up, a reflink and a chmod that end them", MB, vec![
            create("/a"),
            append("/a", 256, 1),
            append("/a", 300, 2),
            append("/a", 128, 3),
            append("/a", 3000, 4),
            // Crosses a page end (not in place), then starts a page.
            append("/a", 900, 5),
            append("/a", 3584, 6),
            append("/a", 200, 7),
            Op::Compact { path: s("/a") },
            append("/a", 200, 8),
            Op::Remount,
            append("/a", 200, 9),
            Op::CrashRemount,
            append("/a", 200, 10),
            // Zeros must show past the old end, not what the block held.
            truncate("/a", 12000),
            append("/a", 256, 11),
            // 64 B appends: across a page end (the page's part embedded, the next
            // page started in place, its bytes less than a line), then a run.
            append("/a", 64, 16),
            append("/a", 64, 17),
            append("/a", 64, 18),
            create("/b"),
            append("/b", 1000, 12),
            create("/c"),
            clone("/b", 0, "/c", 0, 0),
            append("/b", 500, 13),
            truncate("/c", 4000),
            chmod("/b", 0o600),
            append("/b", 500, 14),
            append("/b", 64, 15),
        ]),
        w("write-pages", "page-aligned copy-on-write writes, holes, extent splits", MB, vec![
            create("/p"),
            write("/p", 0, 4096, 1),
            write("/p", 8192, 8192, 2),
            write("/p", 0, 4096, 3),
            write("/p", 0, 16384, 4),
            write("/p", 4096, 4096, 5),
            write("/p", 20480, 12288, 6),
            write("/p", 8192, 4096, 7),
        ]),
        w("write-unaligned", "unaligned multi-page and extending writes (read-modify-write pages)", MB, vec![
            create("/u"),
            write("/u", 100, 10000, 1),
            write("/u", 4000, 200, 2),
            write("/u", 6000, 9000, 3),
            write("/u", 30000, 5000, 4),
            write("/u", 12287, 2, 5),
            write("/u", 2049, 4095, 6),
            write("/u", 0, 40000, 7),
        ]),
        w("append-holes", "appends of every size, sparse files, writes past EOF", MB, vec![
            create("/a"),
            append("/a", 100, 1),
            append("/a", 100, 2),
            append("/a", 3900, 3),
            append("/a", 5000, 4),
            append("/a", 4096, 5),
            append("/a", 1, 6),
            create("/h"),
            write("/h", 40000, 10, 7),
            write("/h", 8192, 4096, 8),
            append("/h", 3000, 9),
        ]),
        w("truncate", "truncate down (mid-page, page boundary, zero) and up (zeros must show)", MB, vec![
            create("/t"),
            write("/t", 0, 20000, 1),
            truncate("/t", 10000),
            truncate("/t", 12288),
            write("/t", 11000, 100, 2),
            truncate("/t", 4096),
            truncate("/t", 0),
            truncate("/t", 9000),
            write("/t", 0, 10, 3),
            truncate("/t", 5),
            write("/t", 100, 5000, 4),
            truncate("/t", 3000),
            truncate("/t", 16384),
        ]),
        w("fallocate", "fallocate (extend, keep size) and punch hole (partial, whole, spanning)", MB, vec![
            create("/x"),
            write("/x", 0, 5000, 1),
            Op::Fallocate { path: s("/x"), off: 0, len: 20000, keep_size: false },
            Op::Punch { path: s("/x"), off: 100, len: 200 },
            Op::Punch { path: s("/x"), off: 4096, len: 4096 },
            write("/x", 9000, 3000, 2),
            Op::Punch { path: s("/x"), off: 3000, len: 8000 },
            Op::Fallocate { path: s("/x"), off: 20000, len: 8192, keep_size: true },
            truncate("/x", 30000),
            Op::Punch { path: s("/x"), off: 0, len: 100000 },
            write("/x", 5, 5, 3),
            Op::Punch { path: s("/x"), off: 50000, len: 10 },
        ]),
        w("fallocate-shift", "collapse and insert ranges over full pages, embedded writes, holes and a partial last page", MB, vec![
            create("/x"),
            write("/x", 0, 40000, 1),
            write("/x", 5000, 40, 2),
            Op::Punch { path: s("/x"), off: 16384, len: 8192 },
            Op::Shift { path: s("/x"), off: 4096, len: 8192, insert: false },
            Op::Shift { path: s("/x"), off: 0, len: 4096, insert: true },
            write("/x", 30000, 100, 3),
            Op::Shift { path: s("/x"), off: 8192, len: 12288, insert: true },
            Op::Shift { path: s("/x"), off: 20480, len: 4096, insert: false },
            Op::Shift { path: s("/x"), off: 100, len: 4096, insert: false },
        ]),
        w("reflink", "clones (FICLONERANGE): whole files with holes, embedded data and a partial last page, ranges back into the source, within one file; copy-on-write of shared pages by writes, punches, truncates and unshares (FALLOC_FL_UNSHARE_RANGE); errors; unlink, orphan and truncate frees of shared blocks, reference counts over a clean remount and a crash", MB, vec![
            create("/a"),
            create("/b"),
            write("/a", 0, 20 * KB, 1),
            // Page 1 gets log-embedded data (the clone copies it), page 2 a hole,
            // page 5 a block with bytes past the end of file after the truncate.
            write("/a", 4196, 100, 2),
            Op::Punch { path: s("/a"), off: 8 * KB, len: 4 * KB },
            write("/a", 20 * KB, 4 * KB, 3),
            truncate("/a", 22000),
            clone("/a", 0, "/b", 0, 0),
            // Copy-on-write of shared pages: a whole page, and an embedded write.
            write("/a", 0, 4 * KB, 4),
            write("/a", 12388, 60, 5),
            // A range of the destination back into the source past its end of file
            // (the partial page and the gap must read as zeros).
            clone("/b", 4 * KB, "/a", 28 * KB, 8 * KB),
            // Within one file, to a range that does not overlap; twice (the second
            // time over the blocks the first one mapped).
            clone("/a", 0, "/a", 40 * KB, 12 * KB),
            clone("/a", 0, "/a", 40 * KB, 12 * KB),
            // Refused: overlap, unaligned offset, unaligned length before the end of
            // file, a source range past its end, a partial last page inside the
            // destination; and nothing to do at exactly the end of file.
            clone("/a", 0, "/a", 8 * KB, 12 * KB),
            clone("/b", 100, "/a", 0, 4 * KB),
            clone("/b", 0, "/a", 0, 5000),
            clone("/b", 24 * KB, "/a", 0, 0),
            clone("/b", 16 * KB, "/a", 0, 0),
            clone("/a", 52 * KB, "/b", 0, 0),
            // Punch and truncate shared pages of the destination (partial pages
            // must not change the source).
            Op::Punch { path: s("/b"), off: 12000, len: 6000 },
            truncate("/b", 17000),
            truncate("/b", 30000),
            // A clean unmount records the shared blocks; the mount counts again.
            Op::Remount,
            // The source goes: its own blocks are freed, the shared ones stay.
            unlink("/a"),
            write("/b", 4 * KB, 4 * KB, 6),
            write("/b", 20000, 200, 7),
            create("/c"),
            clone("/b", 0, "/c", 0, 0),
            clone("/b", 0, "/c", 32 * KB, 8 * KB),
            create("/d"),
            clone("/b", 0, "/d", 0, 16 * KB),
            // Again: the destination pages already map the very blocks it adds.
            clone("/b", 0, "/d", 0, 16 * KB),
            Op::Compact { path: s("/b") },
            // FALLOC_FL_UNSHARE_RANGE: page 0 of /d (whose block /b and /c map too)
            // gets a block of its own (same contents, size kept); writes into it
            // must leave /b and /c as they were. Then pages 2-3 without keep_size
            // inside the file (no shared block there: a plain fallocate, the size
            // stays). Page 1 of /d stays shared with /b (after the crash below too).
            unshare("/d", 0, 4 * KB, true),
            write("/d", 1000, 3000, 11),
            write("/d", 100, 50, 12),
            unshare("/d", 8 * KB, 8 * KB, false),
            // Past the end of file of /c, over its last shared page (page 9, a page
            // of /b): it is copied and /c grows to off + len as a fallocate grows it.
            unshare("/c", 36 * KB, 8 * KB, false),
            // An open clone unlinked, then a crash: recovery frees the orphan,
            // dropping its references, and counts the rest from the logs.
            Op::Open { path: s("/c"), handle: 1 },
            unlink("/c"),
            Op::WriteHandle { handle: 1, off: 36 * KB, len: 4 * KB, pat: 8 },
            Op::CrashRemount,
            write("/b", 0, 8 * KB, 9),
            truncate("/b", 0),
            write("/d", 4 * KB, 100, 10),
            unlink("/d"),
        ]),
        w("fallocate-reuse", "fallocate zeroes blocks that a deleted file's data held", MB, vec![
            create("/y"),
            write("/y", 0, 16384, 9),
            unlink("/y"),
            create("/x"),
            Op::Fallocate { path: s("/x"), off: 0, len: 16384, keep_size: false },
            write("/x", 4096, 100, 1),
        ]),
        w("namespace", "create, mkdir, symlink (short and long), link, unlink (incl. last link), rmdir", MB, {
            let mut o = vec![
                mkdir("/d"),
                mkdir("/d/e"),
                create("/d/f"),
                create("/d/e/g"),
                write("/d/e/g", 0, 5000, 1),
                symlink("/d/s", "f"),
                Op::Symlink { path: s("/long"), target: "x/".repeat(1500) },
                link("/d/f", "/h"),
                link("/d/e/g", "/d/g2"),
                create("/d/f"),
                unlink("/d/f"),
                unlink("/h"),
                rmdir("/d/e"),
                unlink("/d/e/g"),
                rmdir("/d/e"),
                unlink("/d/g2"),
                unlink("/d/s"),
                unlink("/long"),
                rmdir("/d"),
            ];
            for i in 0..12 {
                o.push(create(&format!("/d/n{i}")));
            }
            for i in 0..12 {
                o.push(unlink(&format!("/d/n{i}")));
            }
            o.push(rmdir("/d"));
            o
        }),
        w("unlink-open", "unlink and rename over files that are still open; writes to unlinked files", MB, vec![
            create("/o"),
            write("/o", 0, 6000, 1),
            Op::Open { path: s("/o"), handle: 1 },
            unlink("/o"),
            Op::WriteHandle { handle: 1, off: 100, len: 50, pat: 2 },
            Op::WriteHandle { handle: 1, off: 8192, len: 4096, pat: 3 },
            Op::Release { handle: 1 },
            create("/p"),
            Op::Open { path: s("/p"), handle: 2 },
            Op::Open { path: s("/p"), handle: 3 },
            unlink("/p"),
            Op::Release { handle: 2 },
            Op::Release { handle: 3 },
            create("/q"),
            write("/q", 0, 100, 4),
            Op::Open { path: s("/q"), handle: 4 },
            create("/r"),
            rename("/r", "/q"),
            Op::WriteHandle { handle: 4, off: 0, len: 10, pat: 5 },
            Op::Release { handle: 4 },
        ]),
        w("rename", "rename in all its forms: same dir, across, over file, over empty dir, exchange, noreplace", MB, vec![
            mkdir("/a"),
            mkdir("/b"),
            create("/a/x"),
            write("/a/x", 0, 3000, 1),
            rename("/a/x", "/a/y"),
            rename("/a/y", "/b/y"),
            create("/b/z"),
            rename("/b/y", "/b/z"),
            mkdir("/a/d1"),
            mkdir("/b/d2"),
            rename("/a/d1", "/b/d2"),
            create("/b/d2/k"),
            mkdir("/a/d3"),
            rename("/a/d3", "/b/d2"),
            rename("/b", "/b/d2/sub"),
            exchange("/a/d3", "/b/z"),
            create("/a/p"),
            create("/a/q"),
            write("/a/q", 0, 10, 2),
            exchange("/a/p", "/a/q"),
            noreplace("/a/p", "/a/q"),
            noreplace("/a/p", "/a/new"),
            link("/a/q", "/a/q2"),
            rename("/a/q", "/a/q2"),
            mkdir("/a/m"),
            create("/a/m/c"),
            rename("/a/m", "/b/m"),
            exchange("/b/m", "/a"),
            exchange("/a", "/b"),
            rename("/b/z", "/z"),
            rename("/a/q2", "/b/d2/k"),
        ]),
        w("attrs", "chmod, chown, utimens, extended attributes (set, create, replace, remove)", MB, vec![
            create("/f"),
            chmod("/f", 0o600),
            Op::Chown { path: s("/f"), uid: 1000, gid: 100 },
            Op::Utimens {
                path: s("/f"),
                atime: Some(Ts { sec: 1_000_000_000, nsec: 5 }),
                mtime: Some(Ts { sec: 1_200_000_000, nsec: 7 }),
            },
            Op::Utimens { path: s("/f"), atime: None, mtime: None },
            setx("/f", "user.a", 10, 1, XattrHow::Any),
            setx("/f", "user.a", 20, 2, XattrHow::Create),
            setx("/f", "user.b", 20, 2, XattrHow::Replace),
            setx("/f", "user.big", 3000, 3, XattrHow::Any),
            setx("/f", "user.a", 0, 4, XattrHow::Replace),
            Op::RemoveXattr { path: s("/f"), name: s("user.a") },
            Op::RemoveXattr { path: s("/f"), name: s("user.a") },
            mkdir("/d"),
            chmod("/d", 0o700),
            setx("/d", "user.dir", 50, 5, XattrHow::Any),
            Op::Chown { path: s("/d"), uid: 7, gid: 8 },
            symlink("/s", "f"),
            Op::Chown { path: s("/s"), uid: 9, gid: 9 },
            truncate("/d", 0),
            chmod("/", 0o711),
        ]),
        w("gc", "fast GC (dead log pages) and thorough GC (compaction) while files change", MB, {
            let mut o = vec![create("/g"), mkdir("/d")];
            for i in 0..40u64 {
                o.push(write("/g", 100, 300, i as u8));
                if i % 5 == 0 {
                    o.push(chmod("/g", 0o600 + (i as u32 % 64)));
                }
            }
            o.push(Op::Compact { path: s("/g") });
            for i in 0..12u64 {
                o.push(write("/g", (i % 3) * 4096, 4096, 100 + i as u8));
            }
            for i in 0..30 {
                o.push(create(&format!("/d/f{i}")));
                if i >= 3 {
                    o.push(unlink(&format!("/d/f{}", i - 3)));
                }
            }
            o.push(Op::Compact { path: s("/d") });
            o.push(Op::Compact { path: s("/") });
            for i in 0..20u64 {
                o.push(setx("/g", "user.k", 200, i as u8, XattrHow::Any));
            }
            o
        }),
        w("gc-reuse", "fast GC frees a log page that the very next operation reuses as a log page", MB, {
            // 70 whole-page overwrites fill the first log page with WRITE entries that
            // each kill the previous one; the chmod kills the create's SETATTR from the
            // second page, so the first page is dead and fast GC unlinks and frees it.
            // Log pages come from the top of the free space and it was the highest
            // block taken, so the next create's first log page is that block.
            let mut o = vec![create("/g")];
            for i in 0..70u64 {
                o.push(write("/g", 0, 4096, i as u8));
            }
            o.push(chmod("/g", 0o600));
            o.push(create("/h"));
            o.push(write("/g", 0, 4096, 200));
            o.push(write("/h", 4096, 4096, 201));
            o
        }),
        w("journal-linger", "a log tail comes back to the old value of a lazily finished journal record", MB, {
            // The link is the last journaled operation: its record holds /g's tail
            // right after the create's SETATTR, and its inactive mark is left in the
            // cache. The overwrites kill every WRITE entry but the last, the first
            // chmod kills both SETATTRs of the first log page, so fast GC frees that
            // page; the chmods then fill the tail page, and the next log page is the
            // freed one (log pages come from the top), whose first entry is a
            // SETATTR: the tail holds the record's old value again. Recovery must not
            // undo the link (its mark was settled before the page was freed).
            let mut o = vec![create("/g"), link("/g", "/h")];
            for i in 0..100u64 {
                o.push(write("/g", 0, 4096, i as u8));
            }
            for i in 0..80u32 {
                o.push(chmod("/g", 0o600 + i % 64));
            }
            o
        }),
        w("remount", "clean unmount and mount, crash and recover, work continuing after both", MB, vec![
            create("/a"),
            write("/a", 0, 6000, 1),
            Op::Remount,
            write("/a", 3000, 5000, 2),
            mkdir("/d"),
            rename("/a", "/d/a"),
            Op::CrashRemount,
            create("/b"),
            Op::Open { path: s("/b"), handle: 1 },
            unlink("/b"),
            Op::Remount,
            unlink("/d/a"),
            write("/d/c", 0, 10, 3),
            create("/d/c"),
            Op::Open { path: s("/d/c"), handle: 2 },
            unlink("/d/c"),
            Op::CrashRemount,
            rmdir("/d"),
            Op::Remount,
        ]),
        {
            let mut o = Vec::new();
            for i in 0..14 {
                o.push(create(&format!("/f{i}")));
                o.push(write(&format!("/f{i}"), 0, 16 * KB, i as u8));
            }
            o.push(unlink("/f0"));
            o.push(unlink("/f1"));
            o.push(write("/f2", 0, 40 * KB, 50));
            o.push(truncate("/f3", 0));
            o.push(write("/f4", 0, 8 * KB, 51));
            for i in 0..20 {
                o.push(create(&format!("/e{i}")));
            }
            for i in 5..14 {
                o.push(unlink(&format!("/f{i}")));
            }
            o.push(mkdir("/d"));
            o.push(write("/f2", 0, 4096, 52));
            o.push(Op::Remount);
            let mut x = w("enospc", "fill the pool (blocks and inode slots) to ENOSPC, free, continue", 256 * KB, o);
            x.inodes = 24;
            x.nospc = true;
            x
        },
    ];
    for i in 0..RANDOM_WORKLOADS {
        let seed_i = seed.wrapping_add(i);
        v.push(w(
            &format!("random-{i}"),
            &format!("60 operations from the model-based generator (seed {seed_i})"),
            MB,
            generate(seed_i, 60, GenConfig::default()),
        ));
    }
    let seed_s = seed.wrapping_add(100);
    let mut small = w(
        "random-small",
        &format!("150 generated operations in a 256 KiB pool: ENOSPC anywhere (seed {seed_s})"),
        256 * KB,
        generate(seed_s, 150, GenConfig::default()),
    );
    small.nospc = true;
    v.push(small);
    v.extend(mt_suite(seed));
    v.extend(crate::clients::client_suite(seed));
    v
}

/// A generated workload named `random:SEED:OPS[:POOL_KIB]`.
fn parametric(name: &str) -> Result<Option<Workload>, String> {
    let Some(rest) = name.strip_prefix("random:") else { return Ok(None) };
    let parts: Vec<&str> = rest.split(':').collect();
    let num =
        |t: &str| t.parse::<u64>().map_err(|_| format!("bad number '{t}' in workload '{name}'"));
    if !(2..=3).contains(&parts.len()) {
        return Err(format!("workload '{name}': expected random:SEED:OPS[:POOL_KIB]"));
    }
    let (seed, ops) = (num(parts[0])?, num(parts[1])?);
    let pool_kib = parts.get(2).map(|p| num(p)).transpose()?.unwrap_or(1024);
    if ops == 0 || ops > 100_000 {
        return Err(format!("workload '{name}': 1 to 100000 operations"));
    }
    if !(256..=1 << 20).contains(&pool_kib) || pool_kib % 4 != 0 {
        return Err(format!("workload '{name}': pool of 256 KiB to 1 GiB, a multiple of 4 KiB"));
    }
    let mut x = w(
        name,
        &format!("{ops} operations from the model-based generator (seed {seed})"),
        pool_kib * KB,
        generate(seed, ops as usize, GenConfig::default()),
    );
    // Small pools fill up: ENOSPC is then an expected outcome.
    x.nospc = pool_kib < 1024;
    Ok(Some(x))
}

/// The workloads named by `sel`: "all", or a comma-separated list of suite names
/// and generated workloads `random:SEED:OPS[:POOL_KIB]`.
pub fn select(sel: &str, seed: u64) -> Result<Vec<Workload>, String> {
    let all = suite(seed);
    if sel == "all" {
        return Ok(all);
    }
    let mut out = Vec::new();
    for name in sel.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if let Some(w) = parametric(name)? {
            out.push(w);
            continue;
        }
        match all.iter().find(|w| w.name == name) {
            Some(w) => out.push(w.clone()),
            None => {
                let names: Vec<&str> = all.iter().map(|w| w.name.as_str()).collect();
                return Err(format!("unknown workload '{name}' (known: {})", names.join(", ")));
            }
        }
    }
    if out.is_empty() {
        return Err("no workload selected".into());
    }
    Ok(out)
}
