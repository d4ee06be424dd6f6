//! Simulated persistent memory: tracks what was written, flushed and fenced, per
//! simulated thread.
//!
//! The x86 persistence model, at 8-byte granularity:
//! - a cached store makes its words *dirty*: they may reach media at any moment,
//!   in any order, or not at all before a crash. Dirty words belong to no thread
//!   (a cache line is shared by coherence; any core's flush writes it back);
//! - a flush of a line by thread T moves the line's dirty words (whoever stored
//!   them) to T's *flushing* set, holding the value at the time of the flush, and
//!   adds the line's words other threads flushed and did not fence yet (a line is
//!   written back whole; T's fence then persists them); a non-temporal store by T
//!   puts its words in T's flushing set directly (T's write-combining buffers);
//! - a fence by T makes T's flushing words durable, and only T's: a real `sfence`
//!   orders the issuing core's `clwb`s and non-temporal stores, not another core's.
//!   When two threads have the same word in flight, the later flush wins: a fence
//!   never replaces a durable word by an older write-back of it.
//!
//! The simulated thread is a per-OS-thread number ([`set_sim_thread`], 0 unless
//! set), so every thread that never sets it — a single-threaded workload, recovery
//! workers, the test harness — is thread 0 and behaves exactly like the original
//! single-thread model. [`SimMedium::set_global_fence`] restores the old rule (any
//! fence persists every thread's flushing words), to show what per-thread fences
//! catch that a global fence hides.
//!
//! A crash image at a fence point (of any thread) is the durable image plus any
//! subset of the words still in flight (dirty, or flushing in any thread), each word
//! with its latest value. [`SimMedium::set_fence_hook`] lets the crash simulator see
//! every fence point with the in-flight words, before the fence takes effect.
//! Torn stores inside an aligned 8-byte word are not modelled (x86 makes them
//! atomic), nor are media errors, nor older values of a word that was stored or
//! flushed again before the crash. Locked read-modify-write instructions, which on
//! x86 also order a core's earlier flushes, are not fences here: only
//! [`Medium::fence`] is (the simulator is stricter than the hardware there).

use crate::pmem::{line_span, Durability, Medium, PersistStats, CACHE_LINE};
use parking_lot::Mutex;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

thread_local! {
    static SIM_THREAD: Cell<u32> = const { Cell::new(0) };
    static STEP: Cell<Step> = const { Cell::new(Step::Store) };
    static WAIT_HOOK: RefCell<Option<WaitHook>> = const { RefCell::new(None) };
}

/// What a thread scheduled by a simulator does instead of blocking on a lock
/// another thread holds (see [`set_wait_hook`]).
pub type WaitHook = Arc<dyn Fn() + Send + Sync>;

/// Make the calling thread's waits for the locks held across medium steps (an
/// inode's state and page-range locks, the journal and rename locks, the
/// cross-process lock of a file on a shared pool: see `locks`) scheduling points:
/// where the lock is taken, the thread calls `hook` and tries again instead of
/// blocking, so a deterministic scheduler that parks threads at medium steps can
/// run the holder meanwhile (the crash simulator's token scheduler hands its token
/// to another thread in it). `None` restores blocking. Threads that never call
/// this block as usual; nothing else changes for them.
pub fn set_wait_hook(hook: Option<WaitHook>) {
    WAIT_HOOK.with(|h| *h.borrow_mut() = hook);
}

/// Has the calling thread a wait hook ([`set_wait_hook`])?
pub(crate) fn has_wait_hook() -> bool {
    WAIT_HOOK.with(|h| h.borrow().is_some())
}

/// The calling thread wants a lock another thread holds: run its wait hook and
/// return true (the caller tries the lock again), or return false at once when it
/// has none (the caller blocks). The hook runs with [`step_kind`] = [`Step::Wait`].
pub(crate) fn wait_turn() -> bool {
    let Some(h) = WAIT_HOOK.with(|h| h.borrow().clone()) else {
        return false;
    };
    STEP.with(|c| c.set(Step::Wait));
    h();
    true
}

/// What a simulated thread is doing at a step (see [`StepHook`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A cached or non-temporal store.
    Store,
    /// A cache-line flush.
    Flush,
    /// A fence.
    Fence,
    /// A turn of a wait for another thread: for its fence ([`Medium::wait_point`]),
    /// or for a lock it holds (a thread's wait hook, [`set_wait_hook`]).
    Wait,
}

/// The kind of step the calling thread is at; meaningful inside a [`StepHook`].
pub fn step_kind() -> Step {
    STEP.with(|c| c.get())
}

/// Make the calling OS thread simulated thread `t` for every [`SimMedium`] (its
/// flushes and fences are `t`'s). Threads that never call this are thread 0.
pub fn set_sim_thread(t: u32) {
    SIM_THREAD.with(|c| c.set(t));
}

/// The simulated thread of the calling OS thread.
pub fn sim_thread() -> u32 {
    SIM_THREAD.with(|c| c.get())
}

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
    /// Number of fences before this one (of every thread).
    pub index: u64,
    /// Simulated thread issuing the fence.
    pub thread: u32,
    /// Bytes certainly on media.
    pub durable: &'a [u8],
    /// Words that may or may not be on media.
    pub in_flight: &'a [InFlight],
}

/// Hook called at every fence, before it takes effect.
pub type FenceHook = Box<dyn FnMut(&FencePoint<'_>) + Send>;

/// Hook called at the start of every store, flush and fence, and at every turn of a
/// wait for another thread's fence (a *step*, of the kind [`step_kind`] tells), by
/// the calling thread, before the medium's state is locked: a scheduler may block
/// the caller there to interleave simulated threads deterministically.
pub type StepHook = Arc<dyn Fn() + Send + Sync>;

/// Test-only faults of the persistence path itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// Ignore the n-th flush call (0-based).
    SkipFlush(u64),
    /// Ignore the n-th fence call (0-based): it neither persists nor is seen by the hook.
    SkipFence(u64),
    /// Ignore the n-th fence (0-based) of simulated thread `thread` only.
    SkipThreadFence {
        /// The simulated thread.
        thread: u32,
        /// Its fence number.
        n: u64,
    },
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

/// A word in a thread's flushing set: its value and when it was flushed.
#[derive(Clone, Copy)]
struct Pend {
    val: u64,
    seq: u64,
}

struct State {
    cur: Vec<u8>,
    durable: Vec<u8>,
    dirty: BTreeSet<u64>,
    /// Flushing words per simulated thread.
    flushing: BTreeMap<u32, BTreeMap<u64, Pend>>,
    /// Next flush sequence number.
    seq: u64,
    /// Fences issued per simulated thread.
    thread_fences: HashMap<u32, u64>,
    /// Legacy rule: a fence persists every thread's flushing words.
    global_fence: bool,
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
    step: parking_lot::RwLock<Option<StepHook>>,
    len: u64,
    stats: Arc<PersistStats>,
    /// The simulated clock (nanoseconds): each reading advances it by a microsecond,
    /// so timestamps depend only on the order of operations.
    clock: std::sync::atomic::AtomicU64,
    /// Bytes callers asked to populate ([`Medium::populate`]: a hint, counted only).
    populated: std::sync::atomic::AtomicU64,
}

/// Where every simulated clock starts (2027-01-15, in nanoseconds).
const SIM_EPOCH_NS: u64 = 1_800_000_000 * 1_000_000_000;

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
        assert!(image.len().is_multiple_of(8), "image length must be a multiple of 8");
        let len = image.len() as u64;
        SimMedium {
            st: Mutex::new(State {
                cur: image.clone(),
                durable: image,
                dirty: BTreeSet::new(),
                flushing: BTreeMap::new(),
                seq: 1,
                thread_fences: HashMap::new(),
                global_fence: false,
                fences: 0,
                flushes: 0,
                hook: None,
                fault: None,
                trace: FaultTrace::default(),
                pending: Vec::new(),
            }),
            step: parking_lot::RwLock::new(None),
            len,
            stats: Arc::new(PersistStats::default()),
            clock: std::sync::atomic::AtomicU64::new(SIM_EPOCH_NS),
            populated: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Bytes callers asked to populate so far (the hint does nothing here).
    pub fn populated_bytes(&self) -> u64 {
        self.populated.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Install (or remove) the step hook.
    pub fn set_step_hook(&self, hook: Option<StepHook>) {
        *self.step.write() = hook;
    }

    fn step(&self, kind: Step) {
        STEP.with(|c| c.set(kind));
        let h = self.step.read().clone();
        if let Some(h) = h {
            h();
        }
    }

    /// Install (or remove) the fence hook.
    pub fn set_fence_hook(&self, hook: Option<FenceHook>) {
        self.st.lock().hook = hook;
    }

    /// Use the legacy global fence (any thread's fence persists every thread's
    /// flushing words) instead of per-thread fences. Only meaningful with several
    /// simulated threads; for comparisons in tests.
    pub fn set_global_fence(&self, on: bool) {
        self.st.lock().global_fence = on;
    }

    /// Fences issued so far by simulated thread `t`.
    pub fn thread_fence_count(&self, t: u32) -> u64 {
        self.st.lock().thread_fences.get(&t).copied().unwrap_or(0)
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

/// Move `w` (holding `val`) into thread `t`'s flushing set as its newest write-back.
fn push_flushing(st: &mut State, t: u32, w: u64, val: u64) {
    let seq = st.seq;
    st.seq += 1;
    st.flushing.entry(t).or_default().insert(w, Pend { val, seq });
}

/// The newest flushing value of every word, over all threads.
fn newest_flushing(st: &State) -> BTreeMap<u64, Pend> {
    let mut out: BTreeMap<u64, Pend> = BTreeMap::new();
    for set in st.flushing.values() {
        for (&w, &p) in set {
            match out.get(&w) {
                Some(q) if q.seq > p.seq => {}
                _ => {
                    out.insert(w, p);
                }
            }
        }
    }
    out
}

fn collect_in_flight(st: &State) -> Vec<InFlight> {
    let mut v: Vec<InFlight> = newest_flushing(st)
        .into_iter()
        .filter(|(w, _)| !st.dirty.contains(w))
        .map(|(off, p)| InFlight { off, val: p.val })
        .collect();
    v.extend(st.dirty.iter().map(|&off| InFlight { off, val: word(&st.cur, off) }));
    v.sort_by_key(|f| f.off);
    // Words whose in-flight value equals the durable one change nothing.
    v.retain(|f| word(&st.durable, f.off) != f.val);
    v
}

/// Make the flushing words of thread `t` (every thread's with the global rule)
/// durable. Invariant kept: every word still flushing in some thread was flushed
/// after the write-back its durable value came from, so a later fence never puts an
/// older value back (other threads' older write-backs of a word made durable here
/// are dropped).
fn persist(st: &mut State, t: u32) {
    let sets: Vec<BTreeMap<u64, Pend>> = if st.global_fence {
        std::mem::take(&mut st.flushing).into_values().collect()
    } else {
        st.flushing.remove(&t).into_iter().collect()
    };
    // With one set and no other thread in flight (the single-thread case) there is
    // nothing to order against.
    let track = sets.len() > 1 || !st.flushing.is_empty();
    let mut written: BTreeMap<u64, u64> = BTreeMap::new();
    for set in sets {
        for (w, p) in set {
            if track {
                if written.get(&w).is_some_and(|&q| q > p.seq) {
                    continue;
                }
                written.insert(w, p.seq);
            }
            let o = w as usize;
            st.durable[o..o + 8].copy_from_slice(&p.val.to_le_bytes());
        }
    }
    if st.flushing.is_empty() {
        return;
    }
    for set in st.flushing.values_mut() {
        set.retain(|w, p| written.get(w).is_none_or(|&d| p.seq > d));
    }
    st.flushing.retain(|_, set| !set.is_empty());
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

    fn populate(&self, _off: u64, len: u64) {
        self.populated.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
    }

    fn now(&self) -> crate::log::Ts {
        let t = self.clock.fetch_add(1_000, std::sync::atomic::Ordering::Relaxed);
        crate::log::Ts { sec: (t / 1_000_000_000) as i64, nsec: (t % 1_000_000_000) as u32 }
    }

    fn now_coarse(&self) -> crate::log::Ts {
        self.now()
    }

    fn wait_point(&self) {
        self.step(Step::Wait);
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
        self.step(Step::Store);
        let mut st = self.st.lock();
        let o = off as usize;
        st.cur[o..o + src.len()].copy_from_slice(src);
        Self::mark_dirty(&mut st, off, src.len() as u64);
    }

    fn write_nt(&self, off: u64, src: &[u8]) {
        self.step(Step::Store);
        let mut st = self.st.lock();
        let o = off as usize;
        st.cur[o..o + src.len()].copy_from_slice(src);
        let t = sim_thread();
        let mut w = off & !7;
        while w < off + src.len() as u64 {
            st.dirty.remove(&w);
            let v = word(&st.cur, w);
            push_flushing(&mut st, t, w, v);
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

    /// One word in flight, as a non-temporal store of it: whole or not at all.
    fn store_u64_nt(&self, off: u64, val: u64) {
        assert_eq!(off % 8, 0, "unaligned atomic store");
        self.write_nt(off, &val.to_le_bytes());
    }

    fn flush(&self, off: u64, len: u64) {
        self.step(Step::Flush);
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
        let t = sim_thread();
        for w in words {
            st.dirty.remove(&w);
            let v = word(&st.cur, w);
            push_flushing(&mut st, t, w, v);
        }
        // A line is written back whole: words of it another thread flushed and has
        // not fenced (not stored since, or they would be dirty) are T's to persist
        // too. This is how a daemon makes what a dead client flushed durable.
        let others: Vec<u64> = st
            .flushing
            .iter()
            .filter(|(&u, _)| u != t)
            .flat_map(|(_, set)| set.range(s..e).map(|(&w, _)| w))
            .collect();
        for w in others {
            let v = word(&st.cur, w);
            push_flushing(&mut st, t, w, v);
        }
        debug_assert!(e - s >= CACHE_LINE || len == 0);
    }

    fn fence(&self) {
        self.step(Step::Fence);
        let mut st = self.st.lock();
        let n = st.fences;
        st.fences += 1;
        let t = sim_thread();
        let tn = {
            let c = st.thread_fences.entry(t).or_insert(0);
            *c += 1;
            *c - 1
        };
        self.stats.fences.fetch_add(1, Ordering::Relaxed);
        let skip = match st.fault {
            Some(SimFault::SkipFence(k)) => k == n,
            Some(SimFault::SkipThreadFence { thread, n: k }) => thread == t && k == tn,
            _ => false,
        };
        if skip {
            let mine: BTreeSet<u64> = if st.global_fence {
                st.flushing.values().flat_map(|m| m.keys().copied()).collect()
            } else {
                st.flushing.get(&t).map(|m| m.keys().copied().collect()).unwrap_or_default()
            };
            st.trace.fired = true;
            st.trace.words = collect_in_flight(&st)
                .iter()
                .filter(|f| mine.contains(&f.off))
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
            let point =
                FencePoint { index: n, thread: t, durable: &st.durable, in_flight: &inflight };
            hook(&point);
            st.hook = Some(hook);
        }
        persist(&mut st, t);
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
    fn a_flush_writes_the_line_back_whole_for_the_fencing_thread() {
        let m = SimMedium::new(4096);
        set_sim_thread(1);
        m.store_u64(64, 7);
        m.flush(64, 8);
        // Thread 1 never fences (a client that died); thread 2 flushes the line.
        set_sim_thread(2);
        m.fence();
        assert_eq!(word(&m.durable_image(), 64), 0, "another thread's fence alone");
        m.flush(64, 8);
        m.fence();
        set_sim_thread(0);
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

    /// Runs `f` as simulated thread `t` on a fresh OS thread.
    fn as_thread(t: u32, f: impl FnOnce() + Send) {
        std::thread::scope(|s| {
            s.spawn(|| {
                set_sim_thread(t);
                f()
            });
        });
    }

    #[test]
    fn a_fence_persists_only_its_own_threads_flushes() {
        let m = SimMedium::new(4096);
        // Thread 1 stores and flushes; thread 2 fences: nothing of thread 1 persists.
        as_thread(1, || {
            m.store_u64(64, 11);
            m.flush(64, 8);
        });
        as_thread(2, || m.fence());
        assert_eq!(word(&m.durable_image(), 64), 0, "thread 2's fence persisted thread 1's flush");
        assert_eq!(m.in_flight(), vec![InFlight { off: 64, val: 11 }]);
        // Thread 1's own fence does.
        as_thread(1, || m.fence());
        assert_eq!(word(&m.durable_image(), 64), 11);
        assert!(m.in_flight().is_empty());
        assert_eq!((m.thread_fence_count(1), m.thread_fence_count(2)), (1, 1));
    }

    #[test]
    fn non_temporal_stores_belong_to_the_storing_thread() {
        let m = SimMedium::new(4096);
        as_thread(1, || m.write_nt(128, &[5u8; 8]));
        m.fence(); // thread 0
        assert_eq!(word(&m.durable_image(), 128), 0);
        as_thread(1, || m.fence());
        assert_eq!(word(&m.durable_image(), 128), u64::from_le_bytes([5; 8]));
    }

    #[test]
    fn a_flush_writes_back_another_threads_store_and_its_fence_persists_it() {
        let m = SimMedium::new(4096);
        as_thread(1, || m.store_u64(0, 3));
        as_thread(2, || {
            m.flush(0, 8);
            m.fence();
        });
        assert_eq!(word(&m.durable_image(), 0), 3, "B's flush + fence persists the line");
    }

    #[test]
    fn an_older_write_back_never_replaces_a_newer_durable_value() {
        let m = SimMedium::new(4096);
        as_thread(1, || {
            m.store_u64(0, 1);
            m.flush(0, 8);
        });
        as_thread(2, || {
            m.store_u64(0, 2);
            m.flush(0, 8);
            m.fence();
        });
        assert_eq!(word(&m.durable_image(), 0), 2);
        as_thread(1, || m.fence());
        assert_eq!(word(&m.durable_image(), 0), 2, "thread 1's stale write-back won");
        assert!(m.in_flight().is_empty());
        // The other order: the older write-back is fenced first, the newer one stays
        // in flight until its own fence.
        as_thread(1, || {
            m.store_u64(8, 1);
            m.flush(8, 8);
        });
        as_thread(2, || {
            m.store_u64(8, 2);
            m.flush(8, 8);
        });
        as_thread(1, || m.fence());
        assert_eq!(word(&m.durable_image(), 8), 1);
        assert_eq!(m.in_flight(), vec![InFlight { off: 8, val: 2 }]);
        as_thread(2, || m.fence());
        assert_eq!(word(&m.durable_image(), 8), 2);
    }

    #[test]
    fn global_fence_mode_is_the_old_rule() {
        let m = SimMedium::new(4096);
        m.set_global_fence(true);
        as_thread(1, || {
            m.store_u64(64, 9);
            m.flush(64, 8);
        });
        as_thread(2, || m.fence());
        assert_eq!(word(&m.durable_image(), 64), 9);
    }

    #[test]
    fn fence_hook_names_the_fencing_thread_and_sees_every_threads_words() {
        let m = SimMedium::new(4096);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s2 = seen.clone();
        m.set_fence_hook(Some(Box::new(move |p: &FencePoint<'_>| {
            s2.lock().push((p.index, p.thread, p.in_flight.len()));
        })));
        as_thread(1, || {
            m.store_u64(0, 1);
            m.flush(0, 8);
        });
        as_thread(2, || {
            m.store_u64(64, 1);
            m.fence();
        });
        as_thread(1, || m.fence());
        assert_eq!(*seen.lock(), vec![(0, 2, 2), (1, 1, 2)]);
    }

    #[test]
    fn skip_thread_fence_drops_one_threads_fence_only() {
        let m = SimMedium::new(4096);
        m.set_fault(Some(SimFault::SkipThreadFence { thread: 1, n: 0 }));
        as_thread(2, || {
            m.store_u64(8, 2);
            m.flush(8, 8);
            m.fence();
        });
        as_thread(1, || {
            m.store_u64(16, 1);
            m.flush(16, 8);
            m.fence();
        });
        let d = m.durable_image();
        assert_eq!((word(&d, 8), word(&d, 16)), (2, 0));
        assert_eq!(m.fault_trace().words, vec![16]);
        as_thread(1, || m.fence());
        assert_eq!(word(&m.durable_image(), 16), 1);
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
