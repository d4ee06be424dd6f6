//! Counts of calls on FerriteFS files served here (`direct_calls`) and passed to the
//! kernel (`kernel_calls`), and of the system calls this library made on its own to
//! decide where a call goes (`looks`: a cached `statx`); with
//! `FERRITE_DIRECT_STATS=FILE` each process appends one JSON line to FILE when it
//! exits.
//!
//! Invariants: each thread counts in its own counters (one writer each, no locked
//! instruction on the hot path); the exit report sums every thread's, live or gone.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One thread's counts.
#[derive(Default)]
pub struct Counters {
    direct: AtomicU64,
    kernel: AtomicU64,
    looks: AtomicU64,
}

impl Counters {
    /// A call on a FerriteFS file served without the kernel.
    pub fn direct(&self) {
        bump(&self.direct);
    }
    /// A call on a FerriteFS file that went to the kernel.
    pub fn kernel(&self) {
        bump(&self.kernel);
    }
}

fn bump(a: &AtomicU64) {
    a.store(a.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

static ALL: Mutex<Vec<Arc<Counters>>> = Mutex::new(Vec::new());

/// The counts of threads that are gone, folded out of [`ALL`].
static GONE: Counters =
    Counters { direct: AtomicU64::new(0), kernel: AtomicU64::new(0), looks: AtomicU64::new(0) };

/// New counters for a thread (kept in its hook context). Whenever the list's
/// length reaches a power of two, the counters of threads that are gone (only the
/// list holds them) are folded into [`GONE`] and dropped: a process that makes a
/// thread per task no longer keeps an entry per thread it ever ran.
pub fn register() -> Arc<Counters> {
    let c = Arc::new(Counters::default());
    let mut all = ALL.lock();
    if all.len() >= 64 && all.len().is_power_of_two() {
        all.retain(|x| {
            if Arc::strong_count(x) > 1 {
                return true;
            }
            for (a, g) in
                [(&x.direct, &GONE.direct), (&x.kernel, &GONE.kernel), (&x.looks, &GONE.looks)]
            {
                g.fetch_add(a.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            false
        });
    }
    all.push(c.clone());
    c
}

/// A call on a FerriteFS file served without the kernel.
pub fn direct() {
    crate::table::with_ctx(|cx| cx.counters.direct());
}

/// A call on a FerriteFS file that went to the kernel.
pub fn kernel() {
    crate::table::with_ctx(|cx| cx.counters.kernel());
}

/// A system call made here to decide where a call goes.
pub fn look() {
    crate::table::with_ctx(|cx| bump(&cx.counters.looks));
}

/// (direct, kernel, looks) summed over every thread.
pub fn totals() -> (u64, u64, u64) {
    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let gone = (get(&GONE.direct), get(&GONE.kernel), get(&GONE.looks));
    ALL.lock()
        .iter()
        .fold(gone, |(d, k, l), c| (d + get(&c.direct), k + get(&c.kernel), l + get(&c.looks)))
}

/// After fork, in the child: the parent's counters are not ours.
pub fn reset_after_fork() {
    crate::statics::unlock_after_fork(&ALL);
    for g in [&GONE.direct, &GONE.kernel, &GONE.looks] {
        g.store(0, Ordering::Relaxed);
    }
    for c in ALL.lock().iter() {
        c.direct.store(0, Ordering::Relaxed);
        c.kernel.store(0, Ordering::Relaxed);
        c.looks.store(0, Ordering::Relaxed);
    }
}

/// The exit report line.
pub fn line() -> String {
    let (d, k, l) = totals();
    let pid = std::process::id();
    format!("{{\"pid\":{pid},\"direct_calls\":{d},\"kernel_calls\":{k},\"looks\":{l}}}\n")
}
