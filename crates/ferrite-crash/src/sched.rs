//! A seeded token scheduler that serializes the simulated threads of a concurrent
//! workload at every store, flush and fence.
//!
//! A concurrent workload runs in *rounds* (see [`crate::workloads::MtPlan`]): each
//! round is a set of operations of different simulated threads, each run on its own
//! OS thread. Exactly one of them holds the token and runs; the others wait at a
//! scheduling point: the start of their operation or a step of the simulated medium
//! (every store, flush and fence, through [`ferrite_core::sim::StepHook`]). At each
//! step the token holder draws from the seeded generator whether to continue or to
//! hand the token to one of the waiting threads, so a run is a deterministic
//! function of its seed and replays exactly.
//!
//! Invariants:
//! - At most one OS thread of a round runs between scheduling points; the draw
//!   sequence depends only on the sequence of steps, which therefore repeats.
//! - A thread waiting at a step may hold file system locks. The rounds guarantee it
//!   never holds one another thread of the round needs: operations of one round are
//!   single-inode operations on different files, which hold no shared lock across a
//!   medium step (the plan only puts such operations together; every other operation
//!   runs alone in its round). If that assumption were ever broken the token holder
//!   would block forever: the driver's watchdog then aborts the run with a message
//!   instead of hanging.
//! - The scheduler knows, at every fence, which operations of the round have
//!   returned and which are in flight; the driver turns that into the set of states
//!   a crash there may recover to.

use crate::rng::Rng;
use ferrite_core::sim::sim_thread;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct St {
    /// Thread holding the token (0: none).
    token: u32,
    /// Threads waiting at a scheduling point.
    parked: BTreeSet<u32>,
    /// Threads of the round that have not arrived at their operation's start yet.
    arriving: usize,
    /// Operation (1-based index) of each thread in the current round.
    op_of: BTreeMap<u32, usize>,
    /// Operations started (given the token once) and not returned.
    in_flight: BTreeSet<usize>,
    /// Operations of this round that returned, in return order.
    returned: Vec<usize>,
    /// Threads of the round not finished.
    live: usize,
    /// Waits (hand-overs by threads that cannot go on) since a thread last made
    /// progress: bounds a round whose threads all wait for each other.
    idle_waits: u64,
}

/// Waits in a row, with no thread making progress, after which a round counts as
/// deadlocked (every thread wants something another waiting thread holds).
const DEADLOCK_WAITS: u64 = 100_000;

/// The round's status at one moment: what a crash then may or must contain.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RoundTag {
    /// Operations of the round that returned (must be in any crash state).
    pub returned: Vec<usize>,
    /// Operations in flight (each may be in or out, all-or-nothing).
    pub in_flight: Vec<usize>,
}

/// The scheduler of one concurrent run.
pub struct Sched {
    st: Mutex<St>,
    cv: Condvar,
    rng: Mutex<Rng>,
    /// Scheduling points passed (the watchdog's progress counter).
    pub steps: AtomicU64,
    /// Token hand-overs between threads.
    pub switches: AtomicU64,
    /// Hand-overs by threads that waited for a lock or a fence of another thread.
    pub waits: AtomicU64,
}

fn lk(m: &Mutex<St>) -> MutexGuard<'_, St> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sched {
    /// A scheduler drawing from `rng`.
    pub fn new(rng: Rng) -> Sched {
        Sched {
            st: Mutex::new(St::default()),
            cv: Condvar::new(),
            rng: Mutex::new(rng),
            steps: AtomicU64::new(0),
            switches: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        }
    }

    /// Start a round of `(thread, op)` pairs (threads distinct, non-zero).
    pub fn begin_round(&self, ops: &[(u32, usize)]) {
        let mut s = lk(&self.st);
        assert_eq!(s.live, 0, "previous round not finished");
        *s = St {
            arriving: ops.len(),
            op_of: ops.iter().copied().collect(),
            live: ops.len(),
            ..St::default()
        };
    }

    fn draw(&self, n: usize) -> usize {
        let mut r = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        r.below(n as u64) as usize
    }

    /// Give the token to a waiting thread drawn from the generator (the parked set is
    /// ordered, so the draw is deterministic).
    fn hand_to(&self, s: &mut St, who: u32) {
        s.parked.remove(&who);
        s.token = who;
        let op = s.op_of[&who];
        s.in_flight.insert(op);
        self.switches.fetch_add(1, Ordering::Relaxed);
        self.cv.notify_all();
    }

    fn wait_for_token<'a>(&self, mut s: MutexGuard<'a, St>, t: u32) -> MutexGuard<'a, St> {
        while s.token != t {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s
    }

    /// A worker arrives at the start of its operation; returns when it holds the token.
    /// The first holder is drawn once every thread of the round has arrived, so the
    /// order in which the OS starts the workers does not matter.
    pub fn arrive(&self, t: u32) {
        let mut s = lk(&self.st);
        s.parked.insert(t);
        s.arriving -= 1;
        if s.arriving == 0 && s.token == 0 {
            let v: Vec<u32> = s.parked.iter().copied().collect();
            let who = v[self.draw(v.len())];
            self.hand_to(&mut s, who);
        }
        drop(self.wait_for_token(s, t));
    }

    /// A scheduling point of the calling thread (a medium step): continue, or hand the
    /// token to a waiting thread and wait for it to come back.
    pub fn step(&self) {
        let t = sim_thread();
        let mut s = lk(&self.st);
        if t == 0 || s.token != t {
            // Not a thread of the round (setup, the driver, checkers): no scheduling.
            return;
        }
        self.steps.fetch_add(1, Ordering::Relaxed);
        s.idle_waits = 0;
        if s.parked.is_empty() {
            return;
        }
        let v: Vec<u32> = s.parked.iter().copied().collect();
        let k = self.draw(v.len() + 1);
        if k == v.len() {
            return;
        }
        s.parked.insert(t);
        self.hand_to(&mut s, v[k]);
        drop(self.wait_for_token(s, t));
    }

    /// The calling thread holds the token and cannot go on until another thread of
    /// the round moves: it wants a lock another holds, or waits for another's fence
    /// (a [`ferrite_core::sim::Step::Wait`] step, or its wait hook,
    /// [`ferrite_core::sim::set_wait_hook`]). It hands the token to a waiting
    /// thread drawn from the generator (never keeps it, which would spin) and waits
    /// for it to come back; the caller then looks again. Panics when no other
    /// thread of the round is waiting, or after [`DEADLOCK_WAITS`] waits in a row
    /// without progress: the threads wait for each other (the worker reports it).
    pub fn wait(&self) {
        let t = sim_thread();
        let mut s = lk(&self.st);
        if t == 0 || s.token != t {
            return;
        }
        s.idle_waits += 1;
        let stuck = s.idle_waits > DEADLOCK_WAITS;
        if s.parked.is_empty() || stuck {
            let op = s.op_of[&t];
            drop(s);
            panic!(
                "deadlock in the round: op {op} (thread {t}) waits for a lock or a fence, \
                 and {}",
                if stuck {
                    "every other thread of the round waits too"
                } else {
                    "no other thread can run"
                }
            );
        }
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.waits.fetch_add(1, Ordering::Relaxed);
        let v: Vec<u32> = s.parked.iter().copied().collect();
        let who = v[self.draw(v.len())];
        s.parked.insert(t);
        self.hand_to(&mut s, who);
        drop(self.wait_for_token(s, t));
    }

    /// The token holder's operation returned: record it and pass the token on.
    pub fn done(&self, t: u32) {
        let mut s = lk(&self.st);
        debug_assert_eq!(s.token, t);
        let op = s.op_of[&t];
        s.in_flight.remove(&op);
        s.returned.push(op);
        s.live -= 1;
        s.token = 0;
        s.idle_waits = 0;
        self.steps.fetch_add(1, Ordering::Relaxed);
        if !s.parked.is_empty() {
            let v: Vec<u32> = s.parked.iter().copied().collect();
            let who = v[self.draw(v.len())];
            self.hand_to(&mut s, who);
        }
        self.cv.notify_all();
    }

    /// The token holder's process died inside its operation (a client workload):
    /// it leaves the round, but its operation stays in flight (a crash from now on
    /// may or may not contain it, until the daemon resolved what it left).
    pub fn died(&self, t: u32) {
        let mut s = lk(&self.st);
        debug_assert_eq!(s.token, t);
        s.live -= 1;
        s.token = 0;
        self.steps.fetch_add(1, Ordering::Relaxed);
        if !s.parked.is_empty() {
            let v: Vec<u32> = s.parked.iter().copied().collect();
            let who = v[self.draw(v.len())];
            self.hand_to(&mut s, who);
        }
        self.cv.notify_all();
    }

    /// Operations of the round not finished.
    pub fn live(&self) -> usize {
        lk(&self.st).live
    }

    /// The operation of simulated thread `t` in this round.
    pub fn op_of(&self, t: u32) -> Option<usize> {
        lk(&self.st).op_of.get(&t).copied()
    }

    /// The round's status now.
    pub fn tag(&self) -> RoundTag {
        let s = lk(&self.st);
        let mut returned = s.returned.clone();
        returned.sort_unstable();
        RoundTag { returned, in_flight: s.in_flight.iter().copied().collect() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_core::sim::set_sim_thread;
    use std::sync::Arc;

    /// Three threads taking 20 steps each: the interleaving is a function of the seed.
    fn trace(seed: u64) -> Vec<u32> {
        let s = Arc::new(Sched::new(Rng::new(seed)));
        let log = Arc::new(Mutex::new(Vec::new()));
        s.begin_round(&[(1, 1), (2, 2), (3, 3)]);
        std::thread::scope(|sc| {
            for t in 1..=3u32 {
                let (s, log) = (s.clone(), log.clone());
                sc.spawn(move || {
                    set_sim_thread(t);
                    s.arrive(t);
                    for _ in 0..20 {
                        s.step();
                        log.lock().unwrap().push(t);
                    }
                    s.done(t);
                });
            }
        });
        assert_eq!(s.live(), 0);
        let v = log.lock().unwrap().clone();
        v
    }

    #[test]
    fn interleaving_depends_only_on_the_seed() {
        let a = trace(7);
        assert_eq!(a.len(), 60);
        for _ in 0..5 {
            assert_eq!(trace(7), a);
        }
        assert_ne!(trace(8), a, "another seed, another interleaving");
        let switches = a.windows(2).filter(|w| w[0] != w[1]).count();
        assert!(switches > 5, "threads really interleave: {a:?}");
    }
}
