//! Simulated persistent memory: tracks what was written, flushed and fenced.
//!
//! The x86 persistence model, at 8-byte granularity:
//! - a cached store makes its words *dirty*: they may reach media at any moment,
//!   in any order, or not at all before a crash;
//! - a flush of a line moves its dirty words to *flushing*, holding the value at the
//!   time of the flush; a non-temporal store puts its words there directly;
//! - a fence makes every flushing word durable.
//!
//! A crash image at a fence point is the durable image plus any subset of the words
//! still in flight (dirty or flushing). [`SimMedium::set_fence_hook`] lets the crash
//! simulator see every fence point with the in-flight words, before the fence takes
//! effect. Torn stores inside an aligned 8-byte word are not modelled (x86 makes them
//! atomic), nor are media errors.

use crate::pmem::{line_span, Durability, Medium, PersistStats, CACHE_LINE};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One word still in flight at a fence point: its offset and the value it would
/// have if it reached media.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InFlight {
    /// Byte offset of the aligned word.
    pub off: u64,
    /// Value the word would hold on media.
    pub val: u64,
}

/// What a fence hook sees: the durable bytes, and what is in flight.
pub struct FencePoint<'a> {
    /// Number of fences before this one.
    pub index: u64,
    /// Bytes certainly on media.
    pub durable: &'a [u8],
    /// Words that may or may not be on media.
    pub in_flight: &'a [InFlight],
}

/// Hook called at every fence, before it takes effect.
pub type FenceHook = Box<dyn FnMut(&FencePoint<'_>) + Send>;

/// Test-only faults of the persistence path itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// Ignore the n-th flush call (0-based).
    SkipFlush(u64),
    /// Ignore the n-th fence call (0-based): it neither persists nor is seen by the hook.
    SkipFence(u64),
}

/// What an injected [`SimFault`] did, so a crash tester can explain a fault it did
/// not detect.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultTrace {
    /// The faulty flush or fence was reached.
    pub fired: bool,
    /// Words the fault left behind: the dirty words the skipped flush did not write
    /// back, or the words the skipped fence did not make durable.
    pub words: Vec<u64>,
    /// Skip-flush: later fences at which some of those words were still dirty (not
    /// written back when the code believed they were). Skip-fence: 1 if it left words.
    pub exposed_fences: u64,
}

struct State {
    cur: Vec<u8>,
    durable: Vec<u8>,
    dirty: BTreeSet<u64>,
    flushing: BTreeMap<u64, u64>,
    fences: u64,
    flushes: u64,
    hook: Option<FenceHook>,
    fault: Option<SimFault>,
    trace: FaultTrace,
    pending: Vec<u64>,
}

/// A simulated pool.
pub struct SimMedium {
    st: Mutex<State>,
    len: u64,
    stats: Arc<PersistStats>,
}

fn word(buf: &[u8], off: u64) -> u64 {
    let o = off as usize;
    u64::from_le_bytes(buf[o..o + 8].try_into().expect("8 bytes"))
}

impl SimMedium {
    /// A zero-filled simulated pool of `len` bytes (rounded up to 8).
    pub fn new(len: u64) -> Self {
        Self::from_image(vec![0; len.div_ceil(8) as usize * 8])
    }

    /// A simulated pool whose media holds `image` (e.g. a crash image).
    pub fn from_image(image: Vec<u8>) -> Self {
        assert!(image.len() % 8 == 0, "image length must be a multiple of 8");
        let len = image.len() as u64;
        SimMedium {
            st: Mutex::new(State {
                cur: image.clone(),
                durable: image,
                dirty: BTreeSet::new(),
                flushing: BTreeMap::new(),
                fences: 0,
                flushes: 0,
                hook: None,
                fault: None,
                trace: FaultTrace::default(),
                pending: Vec::new(),
            }),
            len,
            stats: Arc::new(PersistStats::default()),
        }
    }

    /// Install (or remove) the fence hook.
    pub fn set_fence_hook(&self, hook: Option<FenceHook>) {
        self.st.lock().hook = hook;
    }

    /// Inject a persistence fault.
    pub fn set_fault(&self, fault: Option<SimFault>) {
        self.st.lock().fault = fault;
    }

    /// The bytes as the running program sees them.
    pub fn current_image(&self) -> Vec<u8> {
        self.st.lock().cur.clone()
    }

    /// The bytes certainly on media (what a crash right now, with nothing in flight
    /// reaching media, would leave).
    pub fn durable_image(&self) -> Vec<u8> {
        self.st.lock().durable.clone()
    }

    /// Words in flight right now.
    pub fn in_flight(&self) -> Vec<InFlight> {
        collect_in_flight(&self.st.lock())
    }

    /// Fences issued so far.
    pub fn fence_count(&self) -> u64 {
        self.st.lock().fences
    }

    /// Flush calls issued so far (the `n` of [`SimFault::SkipFlush`]).
    pub fn flush_count(&self) -> u64 {
        self.st.lock().flushes
    }

    /// What the injected fault did so far.
    pub fn fault_trace(&self) -> FaultTrace {
        self.st.lock().trace.clone()
    }

    /// Persistence counters.
    pub fn stats(&self) -> &Arc<PersistStats> {
        &self.stats
    }

    fn mark_dirty(st: &mut State, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut w = off & !7;
        while w < off + len {
            st.dirty.insert(w);
            w += 8;
        }
    }
}

fn collect_in_flight(st: &State) -> Vec<InFlight> {
    let mut v: Vec<InFlight> = st
        .flushing
        .iter()
        .filter(|(w, _)| !st.dirty.contains(w))
        .map(|(&off, &val)| InFlight { off, val })
        .collect();
    v.extend(st.dirty.iter().map(|&off| InFlight { off, val: word(&st.cur, off) }));
    v.sort_by_key(|f| f.off);
    // Words whose in-flight value equals the durable one change nothing.
    v.retain(|f| word(&st.durable, f.off) != f.val);
    v
}

/// Build a crash image: `durable` plus the chosen in-flight words.
pub fn crash_image<'a>(durable: &[u8], chosen: impl IntoIterator<Item = &'a InFlight>) -> Vec<u8> {
    let mut img = durable.to_vec();
    for f in chosen {
        let o = f.off as usize;
        img[o..o + 8].copy_from_slice(&f.val.to_le_bytes());
    }
    img
}

impl Medium for SimMedium {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, off: u64, dst: &mut [u8]) {
        let st = self.st.lock();
        let o = off as usize;
        dst.copy_from_slice(&st.cur[o..o + dst.len()]);
    }

    fn load_u64(&self, off: u64) -> u64 {
        assert_eq!(off % 8, 0, "unaligned atomic load");
        word(&self.st.lock().cur, off)
    }

    fn write(&self, off: u64, src: &[u8]) {
        let mut st = self.st.lock();
        let o = off as usize;
        st.cur[o..o + src.len()].copy_from_slice(src);
        Self::mark_dirty(&mut st, off, src.len() as u64);
    }

    fn write_nt(&self, off: u64, src: &[u8]) {
        let mut st = self.st.lock();
        let o = off as usize;
        st.cur[o..o + src.len()].copy_from_slice(src);
        let mut w = off & !7;
        while w < off + src.len() as u64 {
            st.dirty.remove(&w);
            let v = word(&st.cur, w);
            st.flushing.insert(w, v);
            w += 8;
        }
        self.stats.nt_bytes.fetch_add(src.len() as u64, Ordering::Relaxed);
    }

    fn zero_nt(&self, off: u64, len: u64) {
        let zeros = vec![0u8; len as usize];
        self.write_nt(off, &zeros);
    }

    fn store_u64(&self, off: u64, val: u64) {
        assert_eq!(off % 8, 0, "unaligned atomic store");
        self.write(off, &val.to_le_bytes());
    }

    fn flush(&self, off: u64, len: u64) {
        let mut st = self.st.lock();
        let n = st.flushes;
        st.flushes += 1;
        let (s, e) = line_span(off, len);
        if st.fault == Some(SimFault::SkipFlush(n)) {
            let words: Vec<u64> = st.dirty.range(s..e).copied().collect();
            st.trace.fired = true;
            st.trace.words = words.clone();
            st.pending = words;
            return;
        }
        self.stats.flushed_bytes.fetch_add(e - s, Ordering::Relaxed);
        let words: Vec<u64> = st.dirty.range(s..e).copied().collect();
        for w in words {
            st.dirty.remove(&w);
            let v = word(&st.cur, w);
            st.flushing.insert(w, v);
        }
        debug_assert!(e - s >= CACHE_LINE || len == 0);
    }

    fn fence(&self) {
        let mut st = self.st.lock();
        let n = st.fences;
        st.fences += 1;
        self.stats.fences.fetch_add(1, Ordering::Relaxed);
        if st.fault == Some(SimFault::SkipFence(n)) {
            st.trace.fired = true;
            st.trace.words = collect_in_flight(&st)
                .iter()
                .filter(|f| st.flushing.contains_key(&f.off))
                .map(|f| f.off)
                .collect();
            st.trace.exposed_fences = !st.trace.words.is_empty() as u64;
            return;
        }
        if !st.pending.is_empty() {
            let State { pending, dirty, trace, .. } = &mut *st;
            if pending.iter().any(|w| dirty.contains(w)) {
                trace.exposed_fences += 1;
            }
            pending.retain(|w| dirty.contains(w));
        }
        if st.hook.is_some() {
            let inflight = collect_in_flight(&st);
            let mut hook = st.hook.take().expect("checked");
            let point = FencePoint { index: n, durable: &st.durable, in_flight: &inflight };
            hook(&point);
            st.hook = Some(hook);
        }
        let flushing = std::mem::take(&mut st.flushing);
        for (w, v) in flushing {
            let o = w as usize;
            st.durable[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
    }

    fn durability(&self) -> Durability {
        Durability::Simulated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_needs_flush_and_fence() {
        let m = SimMedium::new(4096);
        m.store_u64(64, 7);
        assert_eq!(word(&m.durable_image(), 64), 0);
        m.fence();
        assert_eq!(word(&m.durable_image(), 64), 0, "fence without flush persists nothing");
        assert_eq!(m.in_flight(), vec![InFlight { off: 64, val: 7 }]);
        m.flush(64, 8);
        m.fence();
        assert_eq!(word(&m.durable_image(), 64), 7);
        assert!(m.in_flight().is_empty());
    }

    #[test]
    fn nt_store_persists_at_fence_and_flush_keeps_flush_time_value() {
        let m = SimMedium::new(4096);
        m.write_nt(128, &[1u8; 16]);
        m.fence();
        assert_eq!(&m.durable_image()[128..144], &[1u8; 16]);
        m.store_u64(0, 1);
        m.flush(0, 8);
        m.store_u64(0, 2);
        m.fence();
        assert_eq!(word(&m.durable_image(), 0), 1);
        assert_eq!(m.in_flight(), vec![InFlight { off: 0, val: 2 }]);
    }

    #[test]
    fn skip_flush_fault_leaves_word_in_flight() {
        let m = SimMedium::new(4096);
        m.set_fault(Some(SimFault::SkipFlush(0)));
        m.store_u64(8, 3);
        m.flush(8, 8);
        m.fence();
        assert_eq!(word(&m.durable_image(), 8), 0);
        let t = m.fault_trace();
        assert!(t.fired);
        assert_eq!(t.words, vec![8]);
        assert_eq!(t.exposed_fences, 1);
        assert_eq!(m.flush_count(), 1);
        // Written back by a later flush: no longer exposed.
        m.flush(8, 8);
        m.fence();
        m.fence();
        assert_eq!(m.fault_trace().exposed_fences, 1);
        assert_eq!(word(&m.durable_image(), 8), 3);
    }

    #[test]
    fn skip_fence_trace_names_the_flushing_words() {
        let m = SimMedium::new(4096);
        m.set_fault(Some(SimFault::SkipFence(0)));
        m.store_u64(16, 5);
        m.flush(16, 8);
        m.fence();
        assert_eq!(word(&m.durable_image(), 16), 0);
        assert_eq!(m.fault_trace().words, vec![16]);
        m.fence();
        assert_eq!(word(&m.durable_image(), 16), 5);
    }
}
