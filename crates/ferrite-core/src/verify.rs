//! Read verification: a read that touches a data block checks the block against
//! the page checksum its WRITE entry carries (format v3, `log::FLAG_PCRC`) and
//! fails with [`Error::DataCorrupt`](crate::Error::DataCorrupt) on a mismatch.
//!
//! Invariants:
//! - [`VerifyMode::FirstTouch`] (the default) checks a block the first time a read
//!   touches it after mount and records that in [`Verified`], one DRAM bit per
//!   pool block (no allocation per read). A block's bit is cleared when the block
//!   is freed, so a block reused for new data is checked again. A block that a
//!   merge of this process filled and committed is marked at its commit (its
//!   content and checksum came from one DRAM page; see `Fs::mark_written`).
//! - [`VerifyMode::Always`] checks at every read; [`VerifyMode::Off`] never does.
//! - Blocks mapped by entries without page checksums (version 2 pools, thorough GC
//!   of such entries) cannot be checked: they read as before and are marked.
//! - Only data blocks are covered here: log entries (embedded writes included)
//!   were checked when the log was replayed; scrub re-checks everything.

use std::sync::atomic::{AtomicU64, Ordering};

/// When reads verify data blocks (mount option `verify=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum VerifyMode {
    /// The first read of each block after mount (`first-touch`).
    #[default]
    FirstTouch,
    /// Every read (`always`).
    Always,
    /// Never (`off`).
    Off,
}

impl VerifyMode {
    /// Parse a mount option value: `always`, `first-touch` or `off`.
    pub fn parse(s: &str) -> Option<VerifyMode> {
        match s {
            "always" => Some(VerifyMode::Always),
            "first-touch" | "first_touch" => Some(VerifyMode::FirstTouch),
            "off" | "never" => Some(VerifyMode::Off),
            _ => None,
        }
    }

    /// The option's spelling.
    pub fn name(self) -> &'static str {
        match self {
            VerifyMode::Always => "always",
            VerifyMode::FirstTouch => "first-touch",
            VerifyMode::Off => "off",
        }
    }
}

/// One bit per pool block: verified since mount.
#[derive(Debug, Default)]
pub struct Verified {
    words: Box<[AtomicU64]>,
}

impl Verified {
    /// A map of `nblocks` clear bits.
    pub fn new(nblocks: u64) -> Verified {
        Verified { words: (0..nblocks.div_ceil(64)).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Was block `b` verified?
    pub fn get(&self, b: u64) -> bool {
        self.words
            .get((b / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (b % 64)) != 0)
    }

    /// Mark block `b` verified.
    pub fn set(&self, b: u64) {
        if let Some(w) = self.words.get((b / 64) as usize) {
            w.fetch_or(1 << (b % 64), Ordering::Relaxed);
        }
    }

    /// Clear blocks `[b, b + n)` (freed: their next content is unchecked).
    pub fn clear(&self, b: u64, n: u64) {
        let mut x = b;
        let end = b.saturating_add(n);
        while x < end {
            let Some(w) = self.words.get((x / 64) as usize) else { return };
            let lo = x % 64;
            let hi = (lo + (end - x)).min(64);
            let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            if w.load(Ordering::Relaxed) & mask != 0 {
                w.fetch_and(!mask, Ordering::Relaxed);
            }
            x += hi - lo;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_set_and_clear_in_runs() {
        let v = Verified::new(300);
        for b in [0, 63, 64, 200, 299] {
            v.set(b);
        }
        v.set(1000); // out of range: ignored
        assert!(v.get(63) && v.get(64) && !v.get(65));
        v.clear(60, 10);
        assert!(!v.get(63) && !v.get(64) && v.get(0) && v.get(200));
        v.clear(0, 1 << 40);
        assert!(!v.get(0) && !v.get(299));
    }
}
