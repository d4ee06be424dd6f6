//! Write-latency emulation: a [`Medium`] wrapper that spins for a fixed time per fence,
//! per flushed or non-temporally written cache line and per read, so results can be
//! read against slower persistent memory than the DRAM under /dev/shm.
//!
//! Invariants:
//! - Every call is delegated to the inner medium unchanged; the wrapper only adds
//!   delay *after* it, so durability and ordering are those of the inner medium.
//! - The default benchmark path never uses this wrapper (zero cost when off).
//! - Delays are busy-waits measured with a monotonic clock, one clock pair per call.

use ferrite_core::pmem::{Durability, Medium, StatsSnapshot, CACHE_LINE};
use ferrite_core::MmapMedium;
use serde::Serialize;
use std::time::{Duration, Instant};

/// A latency profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Profile {
    /// Short name used in target names (`ferrite-lib[optane]`).
    pub name: String,
    /// Extra nanoseconds per fence (the persist barrier).
    pub fence_ns: u64,
    /// Extra nanoseconds per cache line flushed or written with non-temporal stores
    /// (a write-bandwidth throttle).
    pub line_ns: u64,
    /// Extra nanoseconds per read call (media read latency).
    pub read_ns: u64,
    /// Where the numbers come from.
    pub source: &'static str,
}

/// The built-in profiles.
pub fn profiles() -> Vec<Profile> {
    vec![
        Profile {
            name: "stt-ram".into(),
            fence_ns: 200,
            line_ns: 40,
            read_ns: 0,
            source: "NOVA (FAST '16) PMEP STT-RAM: DRAM read latency, PCOMMIT 200 ns, clwb 40 ns",
        },
        Profile {
            name: "pcm".into(),
            fence_ns: 500,
            line_ns: 50,
            read_ns: 300,
            source: "NOVA (FAST '16) PMEP PCM: +300 ns reads, 1/8 DRAM write bandwidth \
                     (~50 ns per line), PCOMMIT 500 ns",
        },
        Profile {
            name: "optane".into(),
            fence_ns: 90,
            line_ns: 28,
            read_ns: 200,
            source: "Yang et al. (FAST '20): reads 2-3x DRAM latency, 2.3 GB/s write bandwidth \
                     per DIMM (~28 ns per line), ~90 ns store+fence round trip (approximate)",
        },
    ]
}

/// Look up a profile by name.
pub fn profile(name: &str) -> Option<Profile> {
    profiles().into_iter().find(|p| p.name == name)
}

/// A medium whose persistence counters can be read (write amplification).
pub trait CountedMedium: Medium {
    /// Current persistence counters.
    fn counters(&self) -> StatsSnapshot;
}

impl CountedMedium for MmapMedium {
    fn counters(&self) -> StatsSnapshot {
        self.stats().snapshot()
    }
}

/// A medium that adds the delays of a [`Profile`] to an inner medium.
pub struct EmuMedium<M: Medium> {
    inner: M,
    p: Profile,
}

impl<M: Medium> EmuMedium<M> {
    /// Wrap `inner`.
    pub fn new(inner: M, p: Profile) -> Self {
        EmuMedium { inner, p }
    }

    /// The inner medium.
    pub fn inner(&self) -> &M {
        &self.inner
    }
}

/// Busy-wait for `ns` nanoseconds.
#[inline]
pub fn spin(ns: u64) {
    if ns == 0 {
        return;
    }
    let t = Instant::now();
    let d = Duration::from_nanos(ns);
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn lines(off: u64, len: u64) -> u64 {
    if len == 0 {
        return 0;
    }
    let (s, e) = ferrite_core::pmem::line_span(off, len);
    (e - s) / CACHE_LINE
}

impl<M: Medium> Medium for EmuMedium<M> {
    fn len(&self) -> u64 {
        self.inner.len()
    }
    fn read(&self, off: u64, dst: &mut [u8]) {
        self.inner.read(off, dst);
        spin(self.p.read_ns);
    }
    fn load_u64(&self, off: u64) -> u64 {
        self.inner.load_u64(off)
    }
    fn write(&self, off: u64, src: &[u8]) {
        self.inner.write(off, src);
    }
    fn write_nt(&self, off: u64, src: &[u8]) {
        self.inner.write_nt(off, src);
        spin(self.p.line_ns * lines(off, src.len() as u64));
    }
    fn write_nt_crc(&self, off: u64, src: &[u8]) -> u32 {
        let crc = self.inner.write_nt_crc(off, src);
        spin(self.p.line_ns * lines(off, src.len() as u64));
        crc
    }
    fn zero_nt(&self, off: u64, len: u64) {
        self.inner.zero_nt(off, len);
        spin(self.p.line_ns * lines(off, len));
    }
    fn store_u64(&self, off: u64, val: u64) {
        self.inner.store_u64(off, val);
    }
    fn store_u64_nt(&self, off: u64, val: u64) {
        self.inner.store_u64_nt(off, val);
        spin(self.p.line_ns);
    }
    fn flush(&self, off: u64, len: u64) {
        self.inner.flush(off, len);
        spin(self.p.line_ns * lines(off, len));
    }
    fn fence(&self) {
        self.inner.fence();
        spin(self.p.fence_ns);
    }
    fn durability(&self) -> Durability {
        self.inner.durability()
    }
}

impl<M: CountedMedium> CountedMedium for EmuMedium<M> {
    fn counters(&self) -> StatsSnapshot {
        self.inner.counters()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_core::SimMedium;

    #[test]
    fn delegates_and_delays() {
        let p =
            Profile { name: "t".into(), fence_ns: 200_000, line_ns: 0, read_ns: 0, source: "test" };
        let m = EmuMedium::new(SimMedium::new(1 << 16), p);
        m.write_nt(64, b"hello");
        let t = Instant::now();
        m.fence();
        // A lower bound on a busy-wait is a property of the code, not of the machine.
        assert!(t.elapsed() >= Duration::from_micros(200));
        let mut b = [0u8; 5];
        m.read(64, &mut b);
        assert_eq!(&b, b"hello");
        assert_eq!(m.len(), 1 << 16);
        assert_eq!(lines(60, 8), 2);
        assert_eq!(lines(0, 0), 0);
    }

    #[test]
    fn profiles_by_name() {
        assert!(profile("optane").is_some());
        assert!(profile("pcm").is_some());
        assert!(profile("stt-ram").is_some());
        assert!(profile("nope").is_none());
    }
}
