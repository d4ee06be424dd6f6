//! The locks held across medium steps: an inode's state lock ([`StateLock`], held
//! through a commit's log appends and tail store), its page-range lock
//! ([`RangeLock`], held through a write's data copy), and the process's journal
//! and rename locks ([`StepMutex`], held through a multi-inode commit).
//!
//! Invariants:
//! - All of them behave as plain blocking locks for every thread without a wait
//!   hook ([`crate::sim::set_wait_hook`]): the uncontended path is one try of the
//!   lock (the same atomic operation a blocking acquire starts with), and a
//!   contended one spins a few microseconds ([`SPINS`]), then blocks.
//! - A thread with a wait hook never blocks on them: while the lock is held it runs
//!   its hook (holding no internal mutex of the lock) and tries again. The crash
//!   simulator's token scheduler gives its token to another thread in the hook, so
//!   operations on one file or one directory can run in one round, interleaved at
//!   every store, flush and fence, and the run stays a function of the seed
//!   (whether a try succeeds depends only on what the threads did before it). The
//!   cross-process lock of a file on a shared pool does the same (`share.rs`,
//!   `lock_word`).
//! - Locks that are never held across a medium step (the allocators', the inode
//!   cache's) need no hook: a thread parked at a step never holds one.

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A reader-writer lock whose waits are scheduling points for a thread with a wait
/// hook (see the module's invariants).
pub(crate) struct StateLock<T>(RwLock<T>);

impl<T> StateLock<T> {
    pub(crate) fn new(v: T) -> StateLock<T> {
        StateLock(RwLock::new(v))
    }

    #[inline]
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, T> {
        acquire(|| self.0.try_read(), || self.0.is_locked_exclusive(), || self.0.read())
    }

    #[inline]
    pub(crate) fn write(&self) -> RwLockWriteGuard<'_, T> {
        acquire(|| self.0.try_write(), || self.0.is_locked(), || self.0.write())
    }

    #[inline]
    pub(crate) fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        self.0.try_write()
    }
}

/// A mutex whose waits are scheduling points for a thread with a wait hook (see the
/// module's invariants).
pub(crate) struct StepMutex<T>(Mutex<T>);

impl<T> StepMutex<T> {
    pub(crate) fn new(v: T) -> StepMutex<T> {
        StepMutex(Mutex::new(v))
    }

    #[inline]
    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        acquire(|| self.0.try_lock(), || self.0.is_locked(), || self.0.lock())
    }
}

/// Spins of a contended acquire before it blocks: about 3 us here (26 ns a
/// `pause` on this machine's EPYC), longer than a whole 4 KiB write + fsync
/// (1.0-1.6 us in this machine's `profile_op randwrite4k` runs), of which the
/// state lock is held a part. Blocking costs a futex sleep and a wake-up, and
/// parking_lot's own short spin yields the CPU (a system call) after a few
/// tries. (Random write + fsync, 2 threads on one file, 8 alternating pairs of
/// `profile_op`, medians: 4 KiB 746K -> 768K ops/s, 64 B 561K -> 664K.)
const SPINS: u32 = 128;

/// Take a lock: one try; then, for a thread with a wait hook, its hook and another
/// try until one succeeds; for any other thread, a bounded spin while `busy`
/// says the lock is held (a load, which leaves the holder's line alone), trying
/// again when it looks free; then `block`.
#[inline(always)]
fn acquire<G>(
    try_once: impl Fn() -> Option<G>,
    busy: impl Fn() -> bool,
    block: impl FnOnce() -> G,
) -> G {
    match try_once() {
        Some(g) => g,
        None => contended(try_once, busy, block),
    }
}

/// [`acquire`] after its first try failed: out of line, so the uncontended path
/// stays one inlined try.
#[cold]
#[inline(never)]
fn contended<G>(
    try_once: impl Fn() -> Option<G>,
    busy: impl Fn() -> bool,
    block: impl FnOnce() -> G,
) -> G {
    while crate::sim::wait_turn() {
        if let Some(g) = try_once() {
            return g;
        }
    }
    // (No wait hook here: a hooked thread left the loop above with the lock.)
    for _ in 0..SPINS {
        std::hint::spin_loop();
        if !busy() {
            if let Some(g) = try_once() {
                return g;
            }
        }
    }
    block()
}

/// Byte-range (page-range) lock for writers of one file.
#[derive(Default)]
pub(crate) struct RangeLock {
    held: Mutex<Vec<(u64, u64)>>,
    cv: Condvar,
    /// Ranges held, as last stored under `held`'s mutex (a plain store): a hint
    /// for a writer choosing how to commit, read without the mutex.
    count: AtomicUsize,
    /// Locks to go before the file counts as written by one writer at a time
    /// again: set to [`CONTENDED_LOCKS`] by a lock taken beside another range, one
    /// less at each lock taken alone (stored under the mutex, read without it).
    contended: AtomicUsize,
}

/// See `RangeLock::contended`.
const CONTENDED_LOCKS: usize = 64;

pub(crate) struct RangeGuard<'a> {
    lock: &'a RangeLock,
    r: (u64, u64),
}

impl RangeLock {
    pub(crate) fn lock(&self, a: u64, b: u64) -> RangeGuard<'_> {
        let mut h = self.held.lock();
        while h.iter().any(|&(x, y)| x < b && a < y) {
            // A thread with a wait hook runs it with the mutex let go, then looks
            // again; any other thread sleeps until a range is given back. (The
            // mutex is let go only for a hook: a range given back while it was let
            // go notifies nobody, and a sleep after that would never end.)
            if crate::sim::has_wait_hook() {
                MutexGuard::unlocked(&mut h, crate::sim::wait_turn);
            } else {
                self.cv.wait(&mut h);
            }
        }
        h.push((a, b));
        self.count.store(h.len(), Ordering::Relaxed);
        let c = self.contended.load(Ordering::Relaxed);
        if h.len() > 1 {
            self.contended.store(CONTENDED_LOCKS, Ordering::Relaxed);
        } else if c > 0 {
            self.contended.store(c - 1, Ordering::Relaxed);
        }
        RangeGuard { lock: self, r: (a, b) }
    }

    /// Ranges held at the last lock or unlock (the caller's own among them, if it
    /// holds one); may be stale by the time it is used.
    pub(crate) fn held_hint(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// No lock of the file's last [`CONTENDED_LOCKS`] was taken beside another
    /// range (a hint, as `held_hint`): its writers have not overlapped lately.
    pub(crate) fn alone_lately(&self) -> bool {
        self.contended.load(Ordering::Relaxed) == 0
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut h = self.lock.held.lock();
        if let Some(i) = h.iter().position(|&r| r == self.r) {
            h.swap_remove(i);
        }
        self.lock.count.store(h.len(), Ordering::Relaxed);
        self.lock.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::sync::Arc;

    /// A lock taken beside another range marks the file as written by several
    /// writers for the next `CONTENDED_LOCKS` locks taken alone, and only those.
    #[test]
    fn overlapping_writers_are_remembered_for_a_while() {
        let r = RangeLock::default();
        assert!(r.alone_lately(), "a fresh file");
        drop(r.lock(0, 1));
        assert!(r.alone_lately(), "one writer at a time");
        {
            let _a = r.lock(0, 1);
            let _b = r.lock(5, 6);
            assert!(!r.alone_lately(), "two ranges held at once");
        }
        for k in 0..CONTENDED_LOCKS {
            assert!(!r.alone_lately(), "after {k} locks taken alone");
            drop(r.lock(2, 3));
        }
        assert!(r.alone_lately(), "after {CONTENDED_LOCKS} locks taken alone");
    }

    /// A thread with a wait hook runs it (and does not block) while another
    /// thread holds the lock, and takes the lock once it is free.
    #[test]
    fn a_hooked_waiter_runs_its_hook_instead_of_blocking() {
        let st = Arc::new(StateLock::new(0u32));
        let ranges = Arc::new(RangeLock::default());
        let turns = Arc::new(AtomicU32::new(0));
        let held = st.write();
        let r = ranges.lock(0, 4);
        std::thread::scope(|s| {
            let (st2, ranges2, turns2) = (st.clone(), ranges.clone(), turns.clone());
            let h = s.spawn(move || {
                let t = turns2.clone();
                crate::sim::set_wait_hook(Some(Arc::new(move || {
                    t.fetch_add(1, Ordering::SeqCst);
                    std::thread::yield_now();
                })));
                *st2.write() += 1;
                let _g = ranges2.lock(2, 3);
                crate::sim::set_wait_hook(None);
            });
            while turns.load(Ordering::SeqCst) < 3 {
                std::thread::yield_now();
            }
            drop(held);
            let seen = turns.load(Ordering::SeqCst);
            while turns.load(Ordering::SeqCst) < seen + 3 {
                std::thread::yield_now();
            }
            drop(r);
            h.join().unwrap();
        });
        assert_eq!(*st.read(), 1);
        assert!(turns.load(Ordering::SeqCst) >= 6);
        assert_eq!(ranges.held_hint(), 0);
    }

    /// Bug (found when CI hung in the benchmark's smoke run: a direct-access
    /// client's append waited on the range lock of a file nobody held): a waiter
    /// let the mutex go to ask for a wait hook, took it back and went to sleep
    /// without looking again; a range given back in that window had notified nobody,
    /// so the waiter slept forever with no range held (unless another range came
    /// and went). Each trial here has exactly one give-back, at a varying moment
    /// after the waiter starts: a lost wakeup stops the trials, which the watchdog
    /// reports (its limit detects a hang; a run takes about a second).
    #[test]
    fn a_range_given_back_while_a_waiter_looks_for_a_hook_wakes_it() {
        const TRIALS: u64 = 20_000;
        let ranges = Arc::new(RangeLock::default());
        let trials = Arc::new(AtomicU32::new(0));
        let go = Arc::new(std::sync::Barrier::new(2));
        let (r2, t2, g2) = (ranges.clone(), trials.clone(), go.clone());
        let holder = std::thread::spawn(move || {
            for i in 0..TRIALS {
                let g = r2.lock(0, 8);
                g2.wait(); // the waiter starts now
                for _ in 0..(i * 7919) % 600 {
                    std::hint::spin_loop();
                }
                drop(g);
                g2.wait(); // the waiter got its range
            }
        });
        let waiter = std::thread::spawn(move || {
            for _ in 0..TRIALS {
                go.wait();
                drop(ranges.lock(4, 5));
                t2.fetch_add(1, Ordering::SeqCst);
                go.wait();
            }
        });
        let (mut last, mut since) = (0, std::time::Instant::now());
        while trials.load(Ordering::SeqCst) < TRIALS as u32 {
            let now = trials.load(Ordering::SeqCst);
            if now != last {
                (last, since) = (now, std::time::Instant::now());
            }
            assert!(
                since.elapsed() < std::time::Duration::from_secs(60),
                "the waiter of trial {last} never woke although the range was given back"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        holder.join().unwrap();
        waiter.join().unwrap();
    }
}
