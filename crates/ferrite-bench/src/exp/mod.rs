//! The experiments and the harness they share: a context, a start gate for threads,
//! progress bars.
//!
//! Invariants:
//! - Every thread of a measured phase passes the start gate exactly once (also when it
//!   fails before starting), so a failing thread never deadlocks the others.
//! - A phase's time runs from the earliest start to the latest stop over its threads;
//!   setup (opening files, creating directories) happens before the gate.
//! - Targets are measured in interleaved order within each repetition (warm-up first,
//!   never recorded), so slow drift of the machine hits every target alike.

pub mod append;
pub mod filebench;
pub mod gc;
pub mod memory;
pub mod meta;
pub mod micro;
pub mod mmap;
pub mod programs;
pub mod realwork;
pub mod recovery;

use crate::config::Config;
use crate::results::{Results, Sample};
use crate::target::{TResult, Target, TargetError};
use ferrite_core::pmem::StatsSnapshot;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Barrier;
use std::time::Instant;

/// What an experiment works with.
pub struct Ctx<'a> {
    /// Configuration.
    pub cfg: &'a Config,
    /// The shared targets (library, FUSE, tmpfs, ext4, hardware, emulated).
    pub targets: &'a mut Vec<Box<dyn Target>>,
    /// Where results go.
    pub res: &'a mut Results,
}

impl Ctx<'_> {
    /// A progress bar of `len` steps for `name` (hidden when not on a terminal).
    pub fn bar(&self, name: &str, len: u64) -> ProgressBar {
        let pb = if self.cfg.progress {
            ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        pb.set_style(
            ProgressStyle::with_template(
                "{prefix:>10} [{bar:30}] {pos}/{len} {wide_msg} {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        pb.set_prefix(name.to_string());
        pb
    }
}

/// Print a line without breaking a progress bar.
pub fn say(pb: &ProgressBar, msg: &str) {
    if pb.is_hidden() {
        eprintln!("{msg}");
    } else {
        pb.println(msg);
    }
}

/// A thread's start gate and clock.
pub struct Gate<'a> {
    barrier: &'a Barrier,
    start: Cell<Option<Instant>>,
    stop: Cell<Option<Instant>>,
}

impl Gate<'_> {
    /// Wait for every thread, then start the clock (idempotent).
    pub fn start(&self) -> Instant {
        if let Some(t) = self.start.get() {
            return t;
        }
        self.barrier.wait();
        let t = Instant::now();
        self.start.set(Some(t));
        t
    }

    /// Stop the clock (idempotent: the first stop counts).
    pub fn stop(&self) {
        if self.stop.get().is_none() {
            self.stop.set(Some(Instant::now()));
        }
    }
}

/// What one measured phase did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Phase {
    /// Operations over all threads.
    pub ops: u64,
    /// User bytes over all threads.
    pub bytes: u64,
    /// Seconds from the first start to the last stop.
    pub secs: f64,
}

impl Phase {
    /// Operations per second.
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.secs.max(1e-9)
    }
    /// Megabytes (10^6) per second.
    pub fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.secs.max(1e-9)
    }
}

/// Run `f(thread, gate)` on `threads` threads; `f` does its setup, calls
/// `gate.start()`, works, calls `gate.stop()` and returns `(ops, bytes)`.
pub fn parallel<F>(threads: usize, f: F) -> TResult<Phase>
where
    F: Fn(usize, &Gate<'_>) -> TResult<(u64, u64)> + Sync,
{
    let barrier = Barrier::new(threads);
    let outs: Vec<TResult<(u64, u64, Instant, Instant)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                let barrier = &barrier;
                s.spawn(move || {
                    let gate = Gate { barrier, start: Cell::new(None), stop: Cell::new(None) };
                    let r = f(t, &gate);
                    let start = gate.start(); // no-op if the thread started
                    gate.stop();
                    let stop = gate.stop.get().unwrap_or_else(Instant::now);
                    r.map(|(o, b)| (o, b, start, stop))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|p| {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "unknown panic".into());
                    Err(TargetError::Other(format!("worker thread panicked: {msg}")))
                })
            })
            .collect()
    });
    let mut ph = Phase::default();
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    for o in outs {
        let (ops, bytes, s, e) = o?;
        ph.ops += ops;
        ph.bytes += bytes;
        first = Some(first.map_or(s, |f| f.min(s)));
        last = Some(last.map_or(e, |l| l.max(e)));
    }
    if let (Some(f), Some(l)) = (first, last) {
        ph.secs = l.duration_since(f).as_secs_f64();
    }
    Ok(ph)
}

/// The measured loop of a one-thread cell: start the gate, run `op(i)` for `i` in
/// `0..ops` until `cap` has passed (checked every `every` operations, a power of
/// two), stop the gate; returns (operations, bytes at `size` each).
pub fn timed_ops(
    gate: &Gate<'_>,
    ops: u64,
    cap: std::time::Duration,
    every: u64,
    size: u64,
    mut op: impl FnMut(u64) -> TResult<()>,
) -> TResult<(u64, u64)> {
    debug_assert!(every.is_power_of_two());
    let t0 = gate.start();
    let mut done = 0;
    for i in 0..ops {
        op(i)?;
        done += 1;
        if i & (every - 1) == every - 1 && t0.elapsed() >= cap {
            break;
        }
    }
    gate.stop();
    Ok((done, done * size))
}

/// A sample of an I/O phase (value in MB/s) with ops/s, mean latency and, where the
/// target counts them, persistence counters (write amplification, fences per op).
pub fn io_sample(
    exp: &str,
    case: &str,
    t: &dyn Target,
    rep: usize,
    ph: Phase,
    threads: usize,
    before: Option<StatsSnapshot>,
) -> Sample {
    let mut extra = BTreeMap::new();
    extra.insert("ops_per_sec".into(), ph.ops_per_sec());
    extra.insert("latency_us".into(), ph.secs * threads as f64 / ph.ops.max(1) as f64 * 1e6);
    if let (Some(a), Some(b)) = (before, t.persist_counters()) {
        let fl = b.flushed_bytes.saturating_sub(a.flushed_bytes) as f64;
        let nt = b.nt_bytes.saturating_sub(a.nt_bytes) as f64;
        let fe = b.fences.saturating_sub(a.fences) as f64;
        extra.insert("flushed_bytes".into(), fl);
        extra.insert("nt_bytes".into(), nt);
        extra.insert("fences".into(), fe);
        if ph.bytes > 0 {
            extra.insert("pool_bytes_per_user_byte".into(), (fl + nt) / ph.bytes as f64);
        }
        extra.insert("fences_per_op".into(), fe / ph.ops.max(1) as f64);
    }
    Sample {
        experiment: exp.into(),
        case: case.into(),
        target: t.name().into(),
        rep,
        ops: ph.ops,
        bytes: ph.bytes,
        secs: ph.secs,
        value: ph.mb_per_sec(),
        extra,
    }
}

/// Indices of targets that can do file I/O (all of them) or metadata (not hardware).
pub fn with_metadata(targets: &[Box<dyn Target>]) -> Vec<usize> {
    targets
        .iter()
        .enumerate()
        .filter(|(_, t)| t.kind() != crate::target::Kind::Hardware)
        .map(|(i, _)| i)
        .collect()
}

/// A buffer of `n` bytes with a recognisable, non-zero pattern.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

/// Create `path` with `size` bytes written in 1 MiB chunks, fsynced, and close it.
pub fn prefill(t: &dyn Target, path: &str, size: u64) -> TResult<()> {
    let chunk = pattern(1 << 20, 7);
    let h = t.create(path, false)?;
    let mut off = 0;
    while off < size {
        let n = (size - off).min(chunk.len() as u64) as usize;
        t.write_at(&h, off, &chunk[..n])?;
        off += n as u64;
    }
    t.fsync(&h)?;
    t.close(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn parallel_sums_and_survives_early_errors() {
        let n = AtomicU64::new(0);
        let ph = parallel(3, |t, g| {
            g.start();
            n.fetch_add(1, Ordering::Relaxed);
            g.stop();
            Ok((t as u64 + 1, 10))
        })
        .unwrap();
        assert_eq!((ph.ops, ph.bytes), (6, 30));
        assert_eq!(n.load(Ordering::Relaxed), 3);
        // One thread fails before its gate: the others must not hang.
        let r = parallel(2, |t, g| {
            if t == 0 {
                return Err(TargetError::Other("setup failed".into()));
            }
            g.start();
            g.stop();
            Ok((1, 1))
        });
        assert!(matches!(r, Err(TargetError::Other(m)) if m == "setup failed"));
        let r = parallel(2, |t, g| {
            g.start();
            if t == 1 {
                panic!("boom");
            }
            Ok((1, 1))
        });
        assert!(matches!(r, Err(TargetError::Other(m)) if m.contains("boom")));
    }
}
