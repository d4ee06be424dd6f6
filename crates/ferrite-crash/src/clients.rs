//! Direct-client workloads (`client-*`): a mount daemon and one or two direct-access
//! clients, each its own [`Fs`] with its own DRAM indexes, allocator and leases,
//! over one simulated medium and one DRAM share table (as `share_parties.rs` runs
//! them), so crash states are taken at every fence of every party.
//!
//! Invariants:
//! - Party `p` (0: the daemon, 1..: clients) is simulated thread `p + 1`; thread 0
//!   is the driver (mkfs, mount, checks). Its stores, flushes and fences are its own
//!   (per-thread persistence of `SimMedium`).
//! - Steps run in explicit rounds. A round holds one step, or file operations of
//!   different parties on different files, which the step scheduler
//!   ([`crate::sched`]) interleaves at every store, flush and fence. No round has
//!   a step that waits for a cross-process lock another party of the round holds,
//!   and a lease is given back (a keeper tick) before the daemon touches its file.
//! - A client dies at a medium step: the step hook unwinds its thread before the
//!   store, flush or fence happens (`resume_unwind`: no destructor writes to the
//!   pool; the core's guards release DRAM locks only). The cross-process locks it
//!   held are taken again in its name, as a killed process leaves them. Its
//!   operation stays in flight until the daemon has resolved the client: a crash
//!   before that may recover with or without it, after it only as the daemon saw it.
//! - Clients do file operations only, by inode number (they open through the
//!   mount; the driver resolves paths with the daemon). The daemon does the
//!   namespace. A client revoked before its operation must fail with ENOTCONN.
//! - The live tree is read from the daemon when no cross-process lock is held,
//!   else from a mount of the pool's current image (a reader would wait for a lease).
//! - After a round that leaves no client attached (every one detached or resolved)
//!   and no cross-process lock held, the daemon's fsck must be clean, with the
//!   extra-reference counts of the coordination table: the one error accepted is
//!   the documented leak of a client that died between a commit and the drop of a
//!   reference (or a clone's references and its commit), a count too high on a
//!   block that had an extra reference when a client died (or the block that count
//!   then kept from being freed); each is reported (`Driven::leaks`).
//! - A clone (two inodes) never shares a round: it could wait for the other
//!   party's lock on its source.

use crate::drive::{
    apply_subset, check_outcome, describe, end_point, finish, group_by_tag, lock, make_hook, merge,
    push_distinct, shared_files, tag_states, with_shared, Capture, Driven, Expect, Fault, FenceRec,
    Functional, HookState, STALL, UUID,
};
use crate::exec::{exec, live_canon, sync_from_live, Handles};
use crate::model::{pattern, Canon, Model, Op};
use crate::rng::Rng;
use crate::sched::Sched;
use crate::workloads::{w, Workload};
use ferrite_core::share::{HeapRegion, P_REVOKED};
use ferrite_core::sim::{set_sim_thread, set_wait_hook, step_kind, Step as SimStep};
use ferrite_core::{
    AtimeMode, DaemonGrants, Error, FallocMode, Fs, MkfsOptions, MountOptions, Party, SetAttr,
    Shift, SimMedium, Table,
};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Med = Arc<SimMedium>;

/// Largest block grant a simulated client asks for (a real one asks 256 and more:
/// small pools keep crash images cheap, so grants are capped).
const GRANT_CAP: u64 = 40;

/// One step of a client workload.
#[derive(Clone, Debug)]
pub enum Step {
    /// A file operation by party `p` (0: the daemon, which may also do namespace
    /// operations).
    Op(u32, Op),
    /// Client `p` attaches (claims a party slot; optionally keeps leases).
    Attach(u32),
    /// Client `p`'s lease keeper ticks (`true`: gives back every lease).
    Tick(u32, bool),
    /// Client `p` runs a file operation and dies at its `n`-th medium step (after
    /// the operation, if it has fewer).
    Die(u32, Op, u64),
    /// The daemon revokes client `p` (its next lock acquisition or lease use fails);
    /// it takes nothing back yet.
    Revoke(u32),
    /// The daemon resolves client `p`: takes its locks, makes what it left
    /// durable, adopts its logs and takes its unused blocks back.
    Resolve(u32),
    /// Client `p` detaches in order: its unused blocks go back to the daemon.
    Detach(u32),
}

impl Step {
    fn party(&self) -> u32 {
        match self {
            Step::Op(p, _) | Step::Die(p, _, _) => *p,
            Step::Attach(p) | Step::Tick(p, _) | Step::Detach(p) => *p,
            Step::Revoke(_) | Step::Resolve(_) => 0,
        }
    }

    /// The file a file operation changes (a clone: its destination).
    fn file(&self) -> Option<&str> {
        match self {
            Step::Op(_, Op::Clone { dst, .. }) | Step::Die(_, Op::Clone { dst, .. }, _) => {
                Some(dst)
            }
            Step::Op(_, op) | Step::Die(_, op, _) => crate::workloads::groupable(op),
            _ => None,
        }
    }

    /// The files a file operation names, in the order [`exec_client`] takes their
    /// inode numbers (a clone: source, destination).
    fn paths(&self) -> Vec<&str> {
        match self {
            Step::Op(_, Op::Clone { src, dst, .. })
            | Step::Die(_, Op::Clone { src, dst, .. }, _) => vec![src, dst],
            _ => self.file().into_iter().collect(),
        }
    }

    /// The operation the model applies.
    fn model_op(&self) -> Op {
        match self {
            Step::Op(_, op) | Step::Die(_, op, _) => op.clone(),
            _ => Op::Fsync { path: "/".into() },
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = |p: u32| if p == 0 { "daemon".to_string() } else { format!("client {p}") };
        match self {
            Step::Op(p, op) => write!(f, "{op} [{}]", who(*p)),
            Step::Attach(p) => write!(f, "attach [{}]", who(*p)),
            Step::Tick(p, all) => {
                write!(f, "lease tick{} [{}]", if *all { " (all)" } else { "" }, who(*p))
            }
            Step::Die(p, op, n) => write!(f, "{op}, dying at its step {n} [{}]", who(*p)),
            Step::Revoke(p) => write!(f, "revoke client {p} [daemon]"),
            Step::Resolve(p) => write!(f, "resolve client {p} [daemon]"),
            Step::Detach(p) => write!(f, "detach [{}]", who(*p)),
        }
    }
}

/// How a client workload runs.
#[derive(Clone, Debug)]
pub struct ClientPlan {
    /// Clients (parties 1..=clients).
    pub clients: u32,
    /// The step of each operation (`Workload::ops` holds what the model applies).
    pub steps: Vec<Step>,
    /// Rounds of 1-based step indices, in order.
    pub rounds: Vec<Vec<usize>>,
    /// Seed of the step scheduler.
    pub seed: u64,
    /// Clients keep leases between their operations (given back by `Tick`).
    pub leases: bool,
}

/// Builds a plan round by round.
struct Plan {
    steps: Vec<Step>,
    rounds: Vec<Vec<usize>>,
}

impl Plan {
    fn new() -> Plan {
        Plan { steps: Vec::new(), rounds: Vec::new() }
    }
    fn one(&mut self, s: Step) -> &mut Plan {
        self.par(vec![s])
    }
    fn par(&mut self, v: Vec<Step>) -> &mut Plan {
        assert!(
            v.len() == 1 || !v.iter().any(|s| matches!(s.model_op(), Op::Clone { .. })),
            "a clone takes two inodes' locks: it never shares a round"
        );
        let mut r = Vec::new();
        for s in v {
            self.steps.push(s);
            r.push(self.steps.len());
        }
        self.rounds.push(r);
        self
    }
    fn build(&self, name: &str, about: &str, clients: u32, seed: u64, leases: bool) -> Workload {
        let ops = self.steps.iter().map(Step::model_op).collect();
        let mut x = w(name, about, 2 << 20, ops);
        x.clients = Some(ClientPlan {
            clients,
            steps: self.steps.clone(),
            rounds: self.rounds.clone(),
            seed: seed ^ 0xc11e_7700,
            leases,
        });
        x
    }
}

/// A client workload of explicit rounds (for tests and regression cases).
pub fn client_workload(
    name: &str,
    clients: u32,
    leases: bool,
    seed: u64,
    rounds: Vec<Vec<Step>>,
) -> Workload {
    let mut p = Plan::new();
    for r in rounds {
        p.par(r);
    }
    p.build(name, "a client workload built by a test", clients, seed, leases)
}

fn op(p: u32, o: Op) -> Step {
    Step::Op(p, o)
}
fn create(p: &str) -> Op {
    Op::Create { path: p.into(), perm: 0o644 }
}
fn write(p: &str, off: u64, len: u64, pat: u8) -> Op {
    Op::Write { path: p.into(), off, len, pat }
}
fn append(p: &str, len: u64, pat: u8) -> Op {
    Op::Append { path: p.into(), len, pat }
}
fn truncate(p: &str, size: u64) -> Op {
    Op::Truncate { path: p.into(), size }
}

/// The direct-client workloads, seeded by `seed` (interleavings, death points).
pub fn client_suite(seed: u64) -> Vec<Workload> {
    let mut rng = Rng::derive(seed, 0xc11e);
    let mut v = Vec::new();

    // Handover of one file between the daemon and a client keeping leases.
    let mut p = Plan::new();
    p.one(op(0, create("/h")))
        .one(op(0, create("/o")))
        .one(op(0, write("/h", 0, 5000, 1)))
        .one(Step::Attach(1))
        .one(op(1, write("/h", 100, 300, 2)))
        .one(op(1, append("/h", 700, 3)))
        .one(Step::Tick(1, false))
        .par(vec![op(1, write("/h", 8192, 4096, 4)), op(0, write("/o", 0, 3000, 5))])
        .one(Step::Tick(1, false))
        .one(Step::Tick(1, false))
        .one(op(0, write("/h", 50, 100, 6)))
        .one(op(0, truncate("/h", 6000)))
        .par(vec![op(1, write("/h", 0, 4096, 7)), op(0, append("/o", 500, 8))])
        .one(op(1, Op::Punch { path: "/h".into(), off: 4096, len: 1000 }))
        .one(op(1, Op::Fallocate { path: "/h".into(), off: 0, len: 12288, keep_size: false }))
        .one(Step::Tick(1, true))
        .one(op(0, append("/h", 300, 9)))
        .one(op(1, write("/h", 20, 30, 10)))
        .one(Step::Detach(1))
        .one(op(0, write("/h", 0, 8192, 11)));
    v.push(p.build(
        "client-handover",
        "a file handed between the daemon and a client keeping leases (lease kept, used, \
         given back idle and all at once; catch-up on both sides)",
        1,
        seed,
        true,
    ));

    // Two clients and the daemon write disjoint ranges of one file in the same
    // rounds: each takes the file's cross-process lock in turn (a waiting party
    // gives the scheduler's token away), catches up with the others' commits and
    // commits its own; neighbours in one page, a write past the end, a compaction.
    let mut p = Plan::new();
    p.one(op(0, create("/s")))
        .one(op(0, write("/s", 0, 20000, 1)))
        .one(Step::Attach(1))
        .one(Step::Attach(2))
        .par(vec![op(1, write("/s", 0, 4096, 2)), op(2, write("/s", 8192, 4096, 3))])
        .par(vec![
            op(1, write("/s", 100, 200, 4)),
            op(2, write("/s", 400, 300, 5)),
            op(0, write("/s", 12288, 4096, 6)),
        ])
        .par(vec![op(1, write("/s", 16384, 8192, 7)), op(2, write("/s", 4096, 100, 8))])
        .par(vec![
            op(0, write("/s", 1000, 50, 9)),
            op(1, write("/s", 2000, 3000, 10)),
            op(2, write("/s", 30000, 500, 11)),
        ])
        .par(vec![op(2, Op::Compact { path: "/s".into() }), op(1, write("/s", 6000, 100, 12))])
        .one(Step::Detach(1))
        .one(Step::Detach(2))
        .one(op(0, write("/s", 0, 100, 13)));
    v.push(p.build(
        "client-shared-file",
        "two clients and the daemon write disjoint ranges of one file in shared rounds, \
         taking its cross-process lock in turn",
        2,
        seed,
        false,
    ));

    // Clients die in the middle of operations; the daemon takes their files back.
    // A lone two-page copy-on-write write takes 5 medium steps (two pages, entry
    // and tail streamed, the fence), a one-page one 4, an embedded append 5, a
    // fallocate of two blocks more than 8, an embedded overwrite 3: the death
    // points are drawn inside them (tests/crash_clients.rs checks that each one
    // dies; dying at a fence's step is dying before that fence).
    let mut p = Plan::new();
    let (d1, d2, d3) = (1 + rng.below(5), 1 + rng.below(5), 1 + rng.below(8));
    let d4 = 1 + (d1 + 2) % 4;
    // An embedded overwrite off the file's last page (its entry and tail streamed,
    // then the fence) takes 3 steps: it dies at one of them, before its fence.
    let d5 = 1 + d2 % 3;
    p.one(op(0, create("/d")))
        .one(op(0, create("/e")))
        .one(op(0, write("/d", 0, 3000, 1)))
        .one(Step::Attach(1))
        .one(op(1, write("/d", 0, 4096, 2)))
        .one(op(1, append("/d", 500, 3)))
        .par(vec![Step::Die(1, write("/d", 4096, 8192, 4), d1), op(0, write("/e", 0, 2000, 5))])
        .one(Step::Resolve(1))
        .one(op(0, write("/d", 100, 200, 6)))
        .one(op(0, append("/d", 300, 7)))
        .one(Step::Attach(2))
        .one(op(2, append("/e", 900, 8)))
        .one(Step::Die(2, append("/e", 150, 9), d2))
        .one(Step::Resolve(2))
        .one(op(0, append("/e", 40, 10)))
        .one(op(0, write("/e", 0, 4096, 11)))
        .one(Step::Attach(1))
        .one(Step::Die(
            1,
            Op::Fallocate { path: "/d".into(), off: 16384, len: 8192, keep_size: false },
            d3,
        ))
        .one(Step::Resolve(1))
        .one(op(0, append("/d", 100, 12)))
        .one(Step::Attach(1))
        .one(Step::Die(1, write("/d", 100, 200, 16), d5))
        .one(Step::Resolve(1))
        .one(Step::Attach(2))
        .par(vec![Step::Die(2, write("/e", 8192, 4096, 13), d4), op(0, append("/d", 64, 14))])
        .one(Step::Resolve(2))
        .one(op(0, write("/e", 8000, 300, 15)));
    v.push(p.build(
        "client-death",
        &format!(
            "clients die inside a copy-on-write write (steps {d1}, {d4}), an embedded append \
             (step {d2}), a fallocate (step {d3}) and an embedded overwrite (step {d5}); the \
             daemon resolves each and writes on"
        ),
        2,
        seed,
        false,
    ));

    // A client dies inside an in-place append (a run of them goes on in a file
    // other processes write): its bytes streamed past the end of file must be
    // gone once the daemon takes the file back. The append that starts the run's
    // page, then one that continues it; the dying one continues it as well (the
    // bytes, the entry, the tail, the fence: 4 steps; it dies before the entry or
    // the tail, once its bytes are streamed: before the fence it has committed,
    // as a process's stores outlive it).
    // After the resolution the daemon continues the run, writes past the end in
    // the page and truncates up: zeros must show between.
    let mut p = Plan::new();
    let d6 = 2 + rng.below(2);
    p.one(op(0, create("/t")))
        .one(op(0, write("/t", 0, 4096, 1)))
        .one(Step::Attach(1))
        .one(op(1, append("/t", 300, 2)))
        .one(op(1, append("/t", 200, 3)))
        .one(Step::Die(1, append("/t", 150, 4), d6))
        .one(Step::Resolve(1))
        .one(op(0, append("/t", 40, 5)))
        .one(op(0, write("/t", 4096 + 900, 10, 6)))
        .one(op(0, truncate("/t", 4096 + 3000)))
        .one(Step::Attach(1))
        .one(op(1, append("/t", 100, 7)));
    v.push(p.build(
        "client-death-in-place",
        &format!(
            "a client dies inside an in-place append (step {d6}) of a run it continues; the \
             daemon resolves it, continues the run, writes past the end and truncates up"
        ),
        1,
        seed,
        false,
    ));

    // The daemon revokes a client's lease while the client writes.
    let mut p = Plan::new();
    p.one(op(0, create("/r")))
        .one(op(0, write("/r", 0, 1000, 1)))
        .one(Step::Attach(1))
        .one(op(1, write("/r", 0, 2000, 2)))
        .par(vec![op(1, write("/r", 3000, 5000, 3)), Step::Revoke(1)])
        .one(Step::Resolve(1))
        .one(op(0, write("/r", 0, 100, 4)))
        .one(op(1, write("/r", 10, 20, 5)))
        .one(op(0, append("/r", 200, 6)));
    v.push(p.build(
        "client-revoke",
        "the daemon revokes a client's lease while the client writes, then takes the file \
         back; the client's later write must fail",
        1,
        seed,
        true,
    ));

    // A client's unused blocks returned; GC beside a client's appends.
    let mut p = Plan::new();
    p.one(op(0, create("/g"))).one(op(0, create("/k"))).one(Step::Attach(1));
    p.one(op(1, write("/g", 0, 8192, 1)));
    for i in 0..6u8 {
        p.par(vec![op(1, append("/g", 300 + 50 * i as u64, 10 + i)), {
            op(0, write("/k", 0, 2000 + 400 * i as u64, 20 + i))
        }]);
        p.par(vec![op(1, write("/g", 0, 1500, 30 + i)), op(0, write("/k", 100, 1800, 40 + i))]);
    }
    p.one(op(1, Op::Compact { path: "/g".into() }));
    p.par(vec![op(0, Op::Compact { path: "/k".into() }), op(1, append("/g", 700, 50))]);
    p.one(Step::Detach(1));
    p.one(op(0, write("/k", 0, 40960, 51)));
    p.one(op(0, Op::Unlink { path: "/g".into() }));
    p.one(op(0, write("/k", 40960, 40960, 52)));
    v.push(p.build(
        "client-gc",
        "a client's overwrites feed its fast GC beside the daemon's, both compact, the \
         client's unused blocks go back and are reused",
        1,
        seed,
        false,
    ));

    // Clients on files that share blocks (reflinks): the daemon clones, clients
    // overwrite, punch, truncate, append to, unshare and clone them (the counts
    // live in the coordination table), some beside a daemon operation on the
    // other file mapping the same blocks, and die in the middle of five of them.
    // In this workload a copy-on-write write of two pages takes 5 medium steps
    // (two pages, entry and tail streamed, the fence), a punch 5, a truncate 5, an
    // unshare of two shared pages 12 and a clone of two blocks and a copied partial
    // page 10 (tests/crash_clients.rs checks that each dies): a death after the
    // commit's tail store (a write's last step, a punch's or truncate's last 2, the
    // unshare's 6th and 7th) or between the clone's references and its tail store
    // (its steps 2-8) leaves the documented leak.
    v.push(client_reflink(&mut rng, seed));

    // Two clients on different files beside daemon operations.
    let mut p = Plan::new();
    p.one(op(0, create("/p1")))
        .one(op(0, create("/p2")))
        .one(op(0, create("/q")))
        .one(Step::Attach(1))
        .one(Step::Attach(2));
    for i in 0..3u8 {
        let b = 10 * i;
        p.par(vec![
            op(1, write("/p1", 1000 * i as u64, 5000, b + 1)),
            op(2, append("/p2", 600, b + 2)),
            op(0, write("/q", 0, 300, b + 3)),
        ]);
        p.par(vec![
            op(1, append("/p1", 4096, b + 4)),
            op(2, write("/p2", 0, 8192, b + 5)),
            op(0, Op::Chmod { path: "/q".into(), perm: 0o600 + i as u32 }),
        ]);
    }
    p.one(op(0, create("/q2")));
    p.par(vec![
        op(1, truncate("/p1", 3000)),
        op(2, Op::Punch { path: "/p2".into(), off: 100, len: 5000 }),
        op(0, write("/q2", 0, 5000, 40)),
    ]);
    p.par(vec![Step::Detach(1), op(2, append("/p2", 100, 41))]);
    p.one(Step::Detach(2));
    v.push(p.build(
        "client-parallel",
        "two clients write different files beside the daemon's writes, chmods and creates",
        2,
        seed,
        false,
    ));
    v
}

/// The `client-reflink` workload (see `client_suite`).
fn client_reflink(rng: &mut Rng, seed: u64) -> Workload {
    const P: u64 = 4096;
    let clone = |src: &str, off_in: u64, dst: &str, off_out: u64, len: u64| Op::Clone {
        src: src.into(),
        off_in,
        dst: dst.into(),
        off_out,
        len,
    };
    let punch = |p: &str, off: u64, len: u64| Op::Punch { path: p.into(), off, len };
    let unshare = |p: &str, off: u64, len: u64, keep_size: bool| Op::Unshare {
        path: p.into(),
        off,
        len,
        keep_size,
    };
    let (d1, d2, d3) = (1 + rng.below(5), 1 + rng.below(5), 1 + rng.below(5));
    let (d4, d5) = (1 + rng.below(12), 1 + rng.below(10));
    let mut p = Plan::new();
    p.one(op(0, create("/a")))
        .one(op(0, create("/b")))
        .one(op(0, create("/c")))
        // Six whole pages and a partial seventh; /b maps all of /a, /c its first
        // two pages (three files on those blocks).
        .one(op(0, write("/a", 0, 6 * P + 1000, 1)))
        .one(op(0, clone("/a", 0, "/b", 0, 0)))
        .one(op(0, clone("/a", 0, "/c", 0, 2 * P)))
        .one(Step::Attach(1))
        .one(op(1, write("/b", P, P, 2)))
        // Both unmap the block of page 2 at once: one drops its reference, the
        // other frees it.
        .par(vec![op(1, punch("/b", 2 * P, P)), op(0, write("/a", 2 * P, P, 3))])
        .one(op(1, truncate("/b", 5 * P + 1500)))
        .one(op(1, append("/b", 3000, 4)))
        .one(op(1, unshare("/b", 0, 4 * P, true)))
        .one(op(1, clone("/a", 4 * P, "/c", 2 * P, 0)))
        .one(Step::Die(1, write("/c", 0, 2 * P, 5), d1))
        .one(Step::Resolve(1))
        .one(op(0, clone("/a", 0, "/b", 0, 2 * P)))
        .one(Step::Attach(2))
        .one(Step::Die(2, punch("/b", 0, 2 * P), d2))
        .one(Step::Resolve(2))
        .one(op(0, write("/a", 0, 2 * P, 6)))
        .one(op(0, clone("/a", 4 * P, "/b", 4 * P, 0)))
        .one(Step::Attach(1))
        .one(Step::Die(1, truncate("/b", 4 * P + 100), d3))
        .one(Step::Resolve(1))
        .one(op(0, clone("/c", 0, "/b", 0, 2 * P)))
        .one(Step::Attach(2))
        .one(Step::Die(2, unshare("/b", 0, 2 * P, true), d4))
        .one(Step::Resolve(2))
        .one(Step::Attach(1))
        .one(Step::Die(1, clone("/a", 4 * P, "/b", 8 * P, 0), d5))
        .one(Step::Resolve(1))
        .one(Step::Attach(2))
        .par(vec![op(2, unshare("/b", 0, 12 * P, false)), op(0, write("/a", 4 * P, P, 7))])
        .one(op(2, append("/c", 5000, 8)))
        .one(Step::Detach(2))
        .one(op(0, Op::Unlink { path: "/a".into() }))
        .one(op(0, write("/b", 0, 4 * P, 9)))
        .one(op(0, truncate("/c", 0)));
    p.build(
        "client-reflink",
        &format!(
            "the daemon clones, clients overwrite, punch, truncate, append to, unshare and \
             clone the shared files (beside the daemon on the other file), and die inside a \
             copy-on-write write (step {d1}), a punch (step {d2}), a truncate (step {d3}), an \
             unshare (step {d4}) and a clone (step {d5}); the daemon resolves each"
        ),
        2,
        seed,
        false,
    )
}

#[derive(Default)]
struct Client {
    pid: u32,
    fs: Option<Arc<Fs<Med>>>,
    /// Revoked (or resolved) by the daemon: its operations must fail.
    revoked: bool,
    dead: bool,
    /// Holds a party slot (and may own blocks): attached, not yet detached or
    /// resolved. A dead client stays attached until the daemon resolves it.
    attached: bool,
}

/// The unwinding payload of a client that dies at a medium step.
struct Died;

/// A death armed on this thread: steps left, and where to record held locks.
struct Dying {
    left: u64,
    table: Arc<Table>,
    pid: u32,
    ninodes: u64,
    held: Arc<Mutex<Vec<u64>>>,
}

thread_local! {
    static DYING: RefCell<Option<Dying>> = const { RefCell::new(None) };
}

/// Called at every medium step before the scheduler: kill the thread if its death
/// is due (the step does not happen).
fn maybe_die() {
    let die = DYING.with(|d| {
        let mut d = d.borrow_mut();
        let x = d.as_mut()?;
        x.left -= 1;
        if x.left > 0 {
            return None;
        }
        let x = d.take().expect("armed");
        let held: Vec<u64> =
            (1..=x.ninodes).filter(|&i| x.table.holder(i) == Some(x.pid)).collect();
        *lock(&x.held) = held;
        Some(())
    });
    if die.is_some() {
        std::panic::resume_unwind(Box::new(Died));
    }
}

/// A file operation of a client, by inode number: `inos` holds those of the
/// files [`Step::paths`] names.
fn exec_client(fs: &Fs<Med>, inos: &[u64], op: &Op) -> Result<(), Error> {
    let ino = inos.first().copied().unwrap_or(0);
    match op {
        Op::Write { off, len, pat, .. } => {
            fs.write(ino, *off, &pattern(*pat, *off, *len)).map(drop)
        }
        Op::Append { len, pat, .. } => {
            let off = fs.getattr(ino)?.size;
            let at = fs.append(ino, &pattern(*pat, off, *len))?;
            if at != off {
                return Err(Error::invalid(format!("append landed at {at}, size was {off}")));
            }
            Ok(())
        }
        Op::Truncate { size, .. } => {
            fs.setattr(ino, &SetAttr { size: Some(*size), ..Default::default() }).map(drop)
        }
        Op::Fallocate { off, len, keep_size, .. } => fs.fallocate(
            ino,
            FallocMode { keep_size: *keep_size, ..Default::default() },
            *off,
            *len,
        ),
        Op::Punch { off, len, .. } => fs.fallocate(
            ino,
            FallocMode { keep_size: true, punch_hole: true, ..Default::default() },
            *off,
            *len,
        ),
        Op::Unshare { off, len, keep_size, .. } => fs.fallocate(
            ino,
            FallocMode { unshare: true, keep_size: *keep_size, ..Default::default() },
            *off,
            *len,
        ),
        Op::Clone { off_in, off_out, len, .. } => {
            let &[src, dst] = inos else {
                return Err(Error::invalid("a clone needs two inodes"));
            };
            // As `exec` (one party runs at a time on these files: a clone never
            // shares a round).
            crate::exec::clone_checked(fs, src, *off_in, dst, *off_out, *len)
        }
        Op::Shift { off, len, insert, .. } => {
            let shift = if *insert { Shift::Insert } else { Shift::Collapse };
            fs.fallocate(ino, FallocMode { shift: Some(shift), ..Default::default() }, *off, *len)
        }
        Op::Compact { .. } => fs.compact(ino),
        other => Err(Error::invalid(format!("not a client operation: {other}"))),
    }
}

/// What a step did.
enum Outcome {
    Done(Result<(), Error>),
    /// The client died inside the operation.
    Died,
}

/// Shared state of a running client workload.
struct World {
    m: Med,
    table: Arc<Table>,
    d: Arc<Fs<Med>>,
    clients: Mutex<Vec<Client>>,
    leases: bool,
    fault: Option<ferrite_core::CoreFault>,
}

impl World {
    fn any_lock(&self) -> bool {
        let n = self.d.geometry().ninodes;
        (1..=n).any(|i| self.table.holder(i).is_some())
            || (0..self.d.geometry().nshards).any(|s| self.table.journal_holder(s).is_some())
    }

    fn client_fs(&self, c: u32) -> Result<Arc<Fs<Med>>, Error> {
        let v = lock(&self.clients);
        v.get(c as usize)
            .and_then(|x| x.fs.clone())
            .ok_or_else(|| Error::invalid(format!("client {c} is not attached")))
    }

    /// Run one step on the calling (simulated) thread. `inos`: the files of a
    /// client's operation, resolved by the daemon before the round.
    fn run(&self, step: &Step, inos: &[u64]) -> Outcome {
        let r = match step {
            Step::Op(0, op) => exec(&*self.d, op, &mut Handles::new()),
            Step::Op(c, op) => self.client_fs(*c).and_then(|fs| exec_client(&fs, inos, op)),
            Step::Attach(c) => self.attach(*c),
            Step::Tick(c, all) => self.client_fs(*c).map(|fs| {
                fs.tick_leases(*all);
            }),
            Step::Die(c, op, n) => return self.die(*c, op, *n, inos),
            Step::Revoke(c) => {
                let pid = lock(&self.clients)[*c as usize].pid;
                self.table.set_party_state(pid, P_REVOKED);
                Ok(())
            }
            Step::Resolve(c) => {
                let pid = lock(&self.clients)[*c as usize].pid;
                let r = self.d.resolve_party(pid).map(drop);
                lock(&self.clients)[*c as usize].attached = false;
                r
            }
            Step::Detach(c) => {
                let fs = {
                    let mut v = lock(&self.clients);
                    v[*c as usize].attached = false;
                    v[*c as usize].fs.take()
                };
                match fs.map(Arc::try_unwrap) {
                    Some(Ok(fs)) => {
                        drop(fs.detach());
                        Ok(())
                    }
                    _ => Err(Error::invalid(format!("client {c} is not attached alone"))),
                }
            }
        };
        Outcome::Done(r)
    }

    fn attach(&self, c: u32) -> Result<(), Error> {
        let pid = self.table.claim_party(1000 + c).ok_or(Error::NoSpace)?;
        let src = Arc::new(DaemonGrants { daemon: self.d.clone(), party: pid, cap: GRANT_CAP });
        let party = Arc::new(Party::client(self.table.clone(), pid, src));
        let mut fs = Fs::attach(self.m.clone(), party)?;
        fs.set_core_fault(self.fault);
        fs.set_atime_mode(AtimeMode::Off);
        if self.leases {
            fs.keep_leases(Box::new(|| {}));
        }
        let mut v = lock(&self.clients);
        if v.len() <= c as usize {
            v.resize_with(c as usize + 1, Client::default);
        }
        v[c as usize] =
            Client { pid, fs: Some(Arc::new(fs)), revoked: false, dead: false, attached: true };
        Ok(())
    }

    fn die(&self, c: u32, op: &Op, n: u64, inos: &[u64]) -> Outcome {
        let (fs, pid) = {
            let v = lock(&self.clients);
            (v[c as usize].fs.clone(), v[c as usize].pid)
        };
        let Some(fs) = fs else {
            return Outcome::Done(Err(Error::invalid(format!("client {c} is not attached"))));
        };
        let held = Arc::new(Mutex::new(Vec::new()));
        DYING.with(|d| {
            *d.borrow_mut() = Some(Dying {
                left: n.max(1),
                table: self.table.clone(),
                pid,
                ninodes: self.d.geometry().ninodes,
                held: held.clone(),
            })
        });
        let r =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| exec_client(&fs, inos, op)));
        DYING.with(|d| d.borrow_mut().take());
        {
            let mut v = lock(&self.clients);
            v[c as usize].fs = None;
            v[c as usize].dead = true;
        }
        drop(fs);
        match r {
            Ok(r) => Outcome::Done(r),
            Err(p) if p.is::<Died>() => {
                // A killed process leaves its locks held.
                for ino in lock(&held).iter() {
                    if self.table.holder(*ino).is_none() {
                        self.table.try_lock(*ino, pid);
                    }
                }
                Outcome::Died
            }
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

/// Sync `model` from `fs` and read its tree.
fn observe<M: ferrite_core::Medium>(fs: &Fs<M>, model: &mut Model) -> Result<Canon, String> {
    sync_from_live(model, fs)?;
    live_canon(fs, true)
}

/// Drive a client workload (see the module comment); otherwise as
/// [`crate::drive::drive_mt`].
pub fn drive_clients(
    wl: &Workload,
    fault: Option<Fault>,
    capture: Capture,
    sink: &mut dyn FnMut(Vec<FenceRec>, Arc<Expect>) -> bool,
) -> Result<Driven, Functional> {
    let plan = wl.clients.as_ref().expect("client workload");
    let fail = |op: usize, message: String| Functional { op, message };
    let sched = Arc::new(Sched::new(Rng::new(plan.seed)));
    let st = Arc::new(Mutex::new(HookState {
        op: 0,
        sched: Some(sched.clone()),
        fence: 0,
        capture,
        recs: Vec::new(),
        survey: Vec::new(),
    }));
    let mkfs = MkfsOptions { shards: 1, inodes: wl.inodes, uuid: Some(UUID), ..Default::default() };
    let core_fault = match fault {
        Some(Fault::Core(c)) => Some(c),
        _ => None,
    };
    let opts =
        MountOptions { fault: core_fault, workers: 1, atime: AtimeMode::Off, ..Default::default() };
    let m: Med = Arc::new(SimMedium::new(wl.pool));
    let mut fs = Fs::mkfs(m.clone(), &mkfs).map_err(|e| fail(0, format!("mkfs: {e}")))?;
    if core_fault.is_some() {
        let m2 = fs.unmount().map_err(|e| fail(0, format!("unmount after mkfs: {e}")))?;
        fs = Fs::mount(m2, &opts).map_err(|e| fail(0, format!("mount with fault: {e}")))?;
    }
    fs.set_atime_mode(AtimeMode::Off);
    let (ni, nb) = (fs.geometry().ninodes, fs.geometry().nblocks);
    let t = Table::create(Box::new(HeapRegion::new(ni, nb)), ni, nb, &fs.superblock().uuid);
    t.alive_word().store(1, std::sync::atomic::Ordering::Release);
    let table = Arc::new(t);
    let d = Arc::new(fs.share_with(Arc::new(Party::daemon(table.clone()))));
    let world = World {
        m: m.clone(),
        table,
        d,
        clients: Mutex::new(Vec::new()),
        leases: plan.leases,
        fault: core_fault,
    };
    m.set_fence_hook(Some(make_hook(st.clone())));
    let setup_flushes = m.flush_count();
    let setup_fences = m.fence_count();
    let sim_fault = match fault {
        Some(Fault::SkipFlush(n)) => Some(ferrite_core::sim::SimFault::SkipFlush(n)),
        Some(Fault::SkipFence(n)) => Some(ferrite_core::sim::SimFault::SkipFence(n)),
        Some(Fault::SkipThreadFence(thread, n)) => {
            Some(ferrite_core::sim::SimFault::SkipThreadFence { thread, n })
        }
        _ => None,
    };
    if sim_fault.is_some() {
        m.set_fault(sim_fault);
    }
    let sc = sched.clone();
    // A turn of a wait for another party (its lock, its fence) gives the token away
    // and is no medium step of the waiter's (no death point).
    m.set_step_hook(Some(Arc::new(move || match step_kind() {
        SimStep::Wait => sc.wait(),
        _ => {
            maybe_die();
            sc.step()
        }
    })));
    let cleanup = |m: &SimMedium| {
        m.set_fence_hook(None);
        m.set_step_hook(None);
    };
    let mut model = Model::new();
    let s0 = Arc::new(observe(&*world.d, &mut model).map_err(|e| fail(0, e))?);
    let mut states = vec![s0.clone()];
    let recs = std::mem::take(&mut lock(&st).recs);
    let exp = Arc::new(Expect { nofs_ok: true, states: vec![s0], op: 0, op_desc: "mkfs".into() });
    if !sink(recs, exp) {
        cleanup(&m);
        return Ok(finish(st, states, setup_flushes, 0, setup_fences, 0, None));
    }
    // A dead client's operation the live tree shows applied, until its resolution:
    // (client, file, the state without it).
    let mut pending: Option<(u32, String, Arc<Canon>)> = None;
    let desc = |k: usize| plan.steps[k - 1].to_string();
    let mut ino_of: BTreeMap<String, u64> = BTreeMap::new();
    let mut deaths = 0;
    // Live fsck of the daemon: runs, the blocks whose counts a client's death may
    // have left too high (with the first such death), and the leaks accepted.
    let mut live_fscks = 0;
    let mut suspects: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut leak_seen: BTreeSet<String> = BTreeSet::new();
    let mut leaks: Vec<String> = Vec::new();
    let mut shared: Vec<(usize, u64)> = Vec::new();
    for round in &plan.rounds {
        let pairs: Vec<(u32, usize)> =
            round.iter().map(|&k| (plan.steps[k - 1].party() + 1, k)).collect();
        let solo = round.len() == 1;
        // Revoked before the round: its operations must fail.
        let revoked: Vec<bool> = lock(&world.clients).iter().map(|c| c.revoked).collect();
        let mut inos: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        for &k in round {
            if plan.steps[k - 1].party() == 0 {
                continue;
            }
            for f in plan.steps[k - 1].paths() {
                // Resolved once, before a client leases the file (a lookup reads
                // the file's attributes and would wait for the lease).
                let ino = match ino_of.get(f) {
                    Some(&i) => i,
                    None => world
                        .d
                        .resolve(f.as_bytes(), false)
                        .map_err(|e| fail(k, format!("resolve {f}: {e}")))?,
                };
                ino_of.insert(f.to_string(), ino);
                inos.entry(k).or_default().push(ino);
            }
        }
        // Blocks whose count a client dying in this round may leave too high:
        // those with an extra reference before the round and after it.
        let shared_before: Vec<u64> =
            if round.iter().any(|&k| matches!(plan.steps[k - 1], Step::Die(..))) {
                world.d.shared_blocks().into_iter().map(|(b, _)| b).collect()
            } else {
                Vec::new()
            };
        let results: Mutex<BTreeMap<usize, Outcome>> = Mutex::new(BTreeMap::new());
        let panicked: Mutex<Option<(usize, String)>> = Mutex::new(None);
        sched.begin_round(&pairs);
        std::thread::scope(|s| {
            for &(t, k) in &pairs {
                let (world, sched, results, panicked) = (&world, &sched, &results, &panicked);
                let step = &plan.steps[k - 1];
                let step_inos: &[u64] = inos.get(&k).map_or(&[], Vec::as_slice);
                s.spawn(move || {
                    set_sim_thread(t);
                    // Waits for another party's lock of a file both write in this
                    // round give the token away instead of sleeping.
                    let s2 = Arc::clone(sched);
                    set_wait_hook(Some(Arc::new(move || s2.wait())));
                    sched.arrive(t);
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        world.run(step, step_inos)
                    }));
                    set_wait_hook(None);
                    match r {
                        Ok(Outcome::Died) => {
                            lock(results).insert(k, Outcome::Died);
                            sched.died(t);
                            return;
                        }
                        Ok(o) => {
                            lock(results).insert(k, o);
                        }
                        Err(p) => {
                            let msg = p
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            *lock(panicked) = Some((k, msg));
                        }
                    }
                    sched.done(t);
                });
            }
            let mut last = (sched.steps.load(std::sync::atomic::Ordering::Relaxed), Instant::now());
            // Polled from 20 us up to 2 ms: a short round ends without waiting long.
            let mut nap = Duration::from_micros(20);
            while sched.live() > 0 {
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(2));
                let now = sched.steps.load(std::sync::atomic::Ordering::Relaxed);
                if now != last.0 {
                    last = (now, Instant::now());
                } else if last.1.elapsed() > STALL {
                    eprintln!(
                        "crashtest: workload {} stalled in round {round:?}: a party waits for a \
                         lock another one holds (see clients.rs); aborting",
                        wl.name
                    );
                    std::process::abort();
                }
            }
        });
        if let Some((k, msg)) = lock(&panicked).take() {
            cleanup(&m);
            return Err(fail(k, format!("op {k} ({}) panicked: {msg}", desc(k))));
        }
        let before = states.last().expect("state 0").clone();
        let model_before = model.clone();
        let results = std::mem::take(&mut *lock(&results));
        let succeeded: Vec<usize> = results
            .iter()
            .filter(|(k, r)| {
                matches!(r, Outcome::Done(Ok(()))) && matches!(plan.steps[**k - 1], Step::Op(..))
            })
            .map(|(&k, _)| k)
            .collect();
        let mut dead_op: Option<usize> = None;
        for &k in round {
            let step = &plan.steps[k - 1];
            let res = results.get(&k).expect("every step of the round ended");
            match (step, res) {
                (_, Outcome::Died) => {
                    dead_op = Some(k);
                    deaths += 1;
                    let after = world.d.shared_blocks().into_iter().map(|(b, _)| b);
                    for b in shared_before.iter().copied().chain(after) {
                        let v: &mut Vec<usize> = suspects.entry(b).or_default();
                        if v.last() != Some(&k) {
                            v.push(k);
                        }
                    }
                }
                (Step::Op(c, op) | Step::Die(c, op, _), Outcome::Done(live)) => {
                    let rev = *c != 0 && revoked.get(*c as usize).copied().unwrap_or(false);
                    let in_round_revoke = round.iter().any(|&j| {
                        matches!(plan.steps[j - 1], Step::Revoke(x) | Step::Resolve(x) if x == *c)
                    });
                    match live {
                        Err(Error::Disconnected(_)) if rev || in_round_revoke => {}
                        Ok(()) if rev => {
                            cleanup(&m);
                            return Err(fail(
                                k,
                                format!(
                                    "op {k} ({}): a revoked client's operation succeeded",
                                    desc(k)
                                ),
                            ));
                        }
                        _ => check_outcome(k, op, live, &mut model, wl.nospc)?,
                    }
                }
                (_, Outcome::Done(Err(e))) => {
                    cleanup(&m);
                    return Err(fail(k, format!("op {k} ({}) failed: {e}", desc(k))));
                }
                (_, Outcome::Done(Ok(()))) => {}
            }
            if let Step::Revoke(c) | Step::Resolve(c) = step {
                lock(&world.clients)[*c as usize].revoked = true;
            }
        }
        // The live tree (and the dead client's operation: applied or not).
        let snapshot;
        let view: Option<&Fs<SimMedium>> = if world.any_lock() {
            let img = SimMedium::from_image(m.current_image());
            snapshot = Fs::mount(img, &opts)
                .map_err(|e| fail(round[0], format!("mount of the live image: {e}")))?;
            Some(&snapshot)
        } else {
            None
        };
        let obs = |model: &mut Model| match view {
            Some(f) => observe(f, model),
            None => observe(&*world.d, model),
        };
        let last_k = *round.last().expect("non-empty round");
        let mut dead_applied = false;
        let after = match dead_op {
            None => obs(&mut model).map_err(|e| fail(last_k, format!("round {round:?}: {e}")))?,
            Some(k) => {
                let mut with = model.clone();
                let w_ok = with.apply(&wl.ops[k - 1]).is_ok();
                let mut without = model.clone();
                let cw = if w_ok { obs(&mut with).ok() } else { None };
                let cwo = obs(&mut without).map_err(|e| fail(k, e))?;
                let mw = with.canon(true);
                if cw.as_ref().is_some_and(|c| mw.diff(c).is_none()) {
                    dead_applied = true;
                    model = with;
                    cw.expect("checked")
                } else {
                    model = without;
                    cwo
                }
            }
        };
        let after_m = Arc::new(model.canon(true));
        if let Some(dif) = after_m.diff(&after) {
            cleanup(&m);
            let ops: Vec<String> = round.iter().map(|&k| desc(k)).collect();
            return Err(fail(last_k, format!("after round {round:?} ({}) the file system differs from the model (model left, fs right): {dif}", ops.join("; "))));
        }
        let after = after_m;
        shared.push((last_k, world.d.shared_blocks().len() as u64));
        // The daemon's own view (caught up by `observe`) when no client holds a
        // party slot: fsck must be clean, the extra-reference counts of the
        // coordination table included, but for the leak a dead client may leave.
        if view.is_none() && !lock(&world.clients).iter().any(|c| c.attached) {
            live_fscks += 1;
            let r = world.d.fsck().map_err(|e| fail(last_k, format!("fsck of the daemon: {e}")))?;
            let mut bad = Vec::new();
            for e in &r.errors {
                match documented_leak(e).and_then(|b| suspects.get(&b)) {
                    Some(deaths) => {
                        if leak_seen.insert(e.clone()) {
                            // The latest death it had an extra reference at: the
                            // first report follows the culprit's resolution.
                            let last = *deaths.last().expect("a death");
                            let more = match deaths.len() - 1 {
                                0 => String::new(),
                                n => format!(", and {n} earlier one(s)"),
                            };
                            leaks.push(format!(
                                "after op {last_k} ({}): {e} (shared when a client died in op \
                                 {last}: {}{more})",
                                desc(last_k),
                                desc(last)
                            ));
                        }
                    }
                    None => bad.push(e.as_str()),
                }
            }
            if !bad.is_empty() {
                cleanup(&m);
                return Err(fail(
                    last_k,
                    format!(
                        "after round {round:?} ({}) fsck of the live daemon found {} error(s): {}",
                        round.iter().map(|&k| desc(k)).collect::<Vec<_>>().join("; "),
                        bad.len(),
                        bad.join("; ")
                    ),
                ));
            }
        }
        // A file several operations of the round changed (parties writing disjoint
        // ranges of it) is composed from the model, as in drive_mt.
        let round_files: Vec<&str> =
            round.iter().filter_map(|&k| plan.steps[k - 1].file()).collect();
        let shared = shared_files(&round_files);
        let op_of = |k: usize| plan.steps[k - 1].model_op();
        let files = |set: &[usize]| -> Vec<&str> {
            set.iter()
                .filter_map(|&k| plan.steps[k - 1].file())
                .filter(|f| !shared.contains(f))
                .collect()
        };
        let with = |set: &[usize]| -> Result<Arc<Canon>, Functional> {
            if solo {
                return Ok(if set.is_empty() { before.clone() } else { after.clone() });
            }
            if set.len() == round.len() {
                return Ok(after.clone());
            }
            let c = merge(&before, &after, &files(set)).map_err(|e| fail(last_k, e))?;
            if shared.is_empty() {
                return Ok(Arc::new(c));
            }
            let composed = apply_subset(&model_before, set, &succeeded, &op_of, &[])?;
            with_shared(c, &composed, &shared).map(Arc::new).map_err(|e| fail(last_k, e))
        };
        for (i, _) in round.iter().enumerate() {
            states.push(with(&round[..=i])?);
        }
        let recs = std::mem::take(&mut lock(&st).recs);
        for (tag, op, recs) in group_by_tag(recs) {
            let mut exp_states = tag_states(&tag, &with)?;
            // A dead client's applied operation may still be lost until resolved.
            if let Some((_, f, without)) = &pending {
                let extra: Vec<Arc<Canon>> = exp_states
                    .iter()
                    .filter_map(|s| merge(s, without, &[f.as_str()]).ok().map(Arc::new))
                    .collect();
                for c in extra {
                    push_distinct(&mut exp_states, c);
                }
            }
            let mut op_desc = describe(op, &tag, &desc);
            if let Some((c, _, _)) = &pending {
                op_desc.push_str(&format!("; client {c} died, not resolved yet"));
            }
            let exp = Arc::new(Expect { nofs_ok: false, states: exp_states, op, op_desc });
            if !sink(recs, exp) {
                cleanup(&m);
                return Ok(finish(st, states, setup_flushes, 0, setup_fences, 0, None));
            }
        }
        // Resolution ends a pending death; a new death starts one.
        if let Some((c, _, _)) = &pending {
            if round.iter().any(|&k| matches!(plan.steps[k - 1], Step::Resolve(x) if x == *c)) {
                pending = None;
            }
        }
        if let (Some(k), true) = (dead_op, dead_applied) {
            let f = plan.steps[k - 1].file().expect("a file operation").to_string();
            let others: Vec<usize> = round.iter().copied().filter(|&j| j != k).collect();
            let without = if solo { before.clone() } else { with(&others)? };
            pending = Some((plan.steps[k - 1].party(), f, without));
        }
    }
    let end_fence = end_point(&st, &m, &states[wl.ops.len()], wl.ops.len(), sink);
    let trace = sim_fault.map(|_| m.fault_trace());
    let (tf, tfe) = (m.flush_count(), m.fence_count());
    let thread_fences = (1..=plan.clients + 1).map(|t| m.thread_fence_count(t)).collect();
    cleanup(&m);
    let mut dr = finish(st, states, setup_flushes, tf, setup_fences, tfe, trace);
    dr.end_fence = end_fence;
    dr.geo = Some(*world.d.geometry());
    dr.thread_fences = thread_fences;
    dr.switches = sched.switches.load(std::sync::atomic::Ordering::Relaxed);
    dr.waits = sched.waits.load(std::sync::atomic::Ordering::Relaxed);
    dr.deaths = deaths;
    dr.live_fscks = live_fscks;
    dr.leaks = leaks;
    dr.shared = shared;
    Ok(dr)
}

/// The block an fsck error names if it is the documented trace of a party that
/// died between adding or keeping an extra reference and the commit that should
/// have gone with it (`ferrite_core::refs`): a count one too high, either on a
/// block mapped once ("counted with N extra references but mapped once") or on one
/// mapped several times (counted with as many extra references as mappings or
/// more), or the block that count kept from being freed when its last mapping went
/// ("marked used but nobody owns it"). A count too low is never one.
fn documented_leak(e: &str) -> Option<u64> {
    let num = |t: &str| t.parse::<u64>().ok();
    let w: Vec<&str> = e.split_whitespace().collect();
    if w.len() < 2 || w[0] != "block" {
        return None;
    }
    let b = num(w[1])?;
    if e.ends_with("extra references but mapped once")
        || e.ends_with("is marked used but nobody owns it")
    {
        return Some(b);
    }
    // "block B is mapped M times but counted with C extra references"
    if let ["block", _, "is", "mapped", m, "times", "but", "counted", "with", c, "extra", "references"] =
        w.as_slice()
    {
        if num(c)? >= num(m)? {
            return Some(b);
        }
    }
    None
}
