//! Persistence primitives: the only code that stores to a pool.
//!
//! Invariants:
//! - Every store to the pool goes through a [`Medium`]; the file system core never
//!   holds a raw pointer into the pool. A simulated medium can therefore see every
//!   store, flush and fence (the crash simulator depends on this).
//! - A cached store ([`Medium::write`], [`Medium::store_u64`]) is persistent only after
//!   a flush of its cache lines *and* a later [`Medium::fence`]. A non-temporal store
//!   ([`Medium::write_nt`]) is persistent after the next fence.
//! - [`Medium::store_u64`] is an aligned 8-byte atomic store: after a crash the word
//!   holds the old or the new value, never a mix.
//! - The cache-line flush instruction (clwb, else clflushopt, else clflush) is detected
//!   once per process; `FERRITE_FLUSH`, `FERRITE_NT` and `FERRITE_NT_THRESHOLD` force
//!   each path so tests can cover all of them.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Cache line size assumed by the format and the flush loops.
pub const CACHE_LINE: u64 = 64;

/// What survives what on a medium, reported by `ferrite info`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Durability {
    /// MAP_SYNC DAX mapping: every fenced store survives power loss.
    Dax,
    /// Plain shared mapping with msync at every fence: survives power loss, slowly.
    MsyncEachCommit,
    /// Plain shared mapping of a page-cache file: a fenced store survives a crash of
    /// the process at once, and power loss only after the kernel writes it back.
    ProcessCrashOnly,
    /// Simulated medium (tests and the crash simulator).
    Simulated,
}

impl Durability {
    /// One-line human description.
    pub fn describe(self) -> &'static str {
        match self {
            Durability::Dax => "DAX (MAP_SYNC): every completed operation survives power loss",
            Durability::MsyncEachCommit => {
                "shared mapping, msync at every commit: every completed operation \
                 survives power loss (slow)"
            }
            Durability::ProcessCrashOnly => {
                "shared mapping of a page-cache file: completed operations survive a \
                 process crash; power loss only after msync/writeback (mount with \
                 --msync for full durability)"
            }
            Durability::Simulated => "simulated persistent memory (testing)",
        }
    }
}

/// A byte-addressable persistent medium. Offsets are bytes from the pool start.
///
/// Implementations: [`crate::dax::MmapMedium`] (a real mapping) and
/// [`crate::sim::SimMedium`] (tracks what was written, flushed and fenced).
/// Callers guarantee that concurrent writers touch disjoint ranges and that no
/// reader reads a range while it is being written (the core's locks ensure this).
pub trait Medium: Send + Sync + 'static {
    /// Pool length in bytes.
    fn len(&self) -> u64;
    /// Always false for a formatted pool; present for clippy's `len_without_is_empty`.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy bytes out of the pool.
    fn read(&self, off: u64, dst: &mut [u8]);
    /// Aligned atomic 8-byte load.
    fn load_u64(&self, off: u64) -> u64;
    /// Cached stores: persistent only after `flush` of the range and a later `fence`.
    fn write(&self, off: u64, src: &[u8]);
    /// Non-temporal stores: persistent after the next `fence`.
    fn write_nt(&self, off: u64, src: &[u8]);
    /// As [`Medium::write_nt`] for a copy-on-write page, returning the CRC32C of
    /// `src` ([`crc32c_page`]); a real mapping takes both from one pass.
    fn write_nt_crc(&self, off: u64, src: &[u8]) -> u32 {
        self.write_nt(off, src);
        crc32c_page(src)
    }
    /// Non-temporal zero fill: persistent after the next `fence`.
    fn zero_nt(&self, off: u64, len: u64);
    /// Aligned 8-byte atomic cached store (needs `flush` + `fence` to persist).
    fn store_u64(&self, off: u64, val: u64);
    /// Aligned 8-byte atomic non-temporal store: persistent after the next `fence`,
    /// as [`Medium::write_nt`], with no flush. A commit whose other stores are all
    /// non-temporal stores its tail this way: in a probe of back-to-back commits on
    /// this AMD EPYC (two streamed lines, then the tail, `sfence`, one locked
    /// instruction) a commit took 182-188 ns with the tail stored and `clwb`ed and
    /// 125-129 ns with it streamed. The default stores and flushes, which persists
    /// at the same fence.
    fn store_u64_nt(&self, off: u64, val: u64) {
        self.store_u64(off, val);
        self.flush(off, 8);
    }
    /// Write back the cache lines covering `[off, off + len)`.
    fn flush(&self, off: u64, len: u64);
    /// Store fence: earlier flushes and non-temporal stores are persistent after it.
    fn fence(&self);
    /// What a completed, fenced operation survives on this medium.
    fn durability(&self) -> Durability;
    /// The time stamped on what is written now (entries' mtime and ctime): the real
    /// clock, unless the medium simulates one (a crash-simulator run must be a
    /// function of its seed, timestamps included).
    fn now(&self) -> crate::log::Ts {
        crate::log::Ts::now()
    }
    /// The time at the clock tick's resolution, as the kernel stamps files whose
    /// times nobody looked at since their last change (`Fs::stamp` decides): the
    /// real coarse clock, or the simulated one.
    fn now_coarse(&self) -> crate::log::Ts {
        coarse_now()
    }
    /// One turn of a wait for another thread's fence (`Fs::await_fenced`): nothing
    /// on real memory; a simulated medium makes it a scheduling point, so a
    /// deterministic scheduler can run the thread waited for.
    fn wait_point(&self) {}
    /// Ask the cache for the pool line at `off`, about to be written: a fresh log
    /// page's lines are cold, and the first store to one waits for the line to come
    /// from memory. Only a hint (no store, nothing for a simulated medium to see).
    fn prefetch(&self, _off: u64) {}
    /// Map `[off, off + len)` into this process now, writable, in one step (blocks
    /// about to be written, such as a client's new grant): each first touch of a
    /// page would otherwise take a page fault of its own. Only a hint: no byte
    /// changes, and a medium that cannot do it does nothing.
    fn populate(&self, _off: u64, _len: u64) {}
}

/// Ask the cache for the line holding `p` (DRAM state about to be written: a
/// miss taken early overlaps with the work before the write). Only a hint: it
/// never faults, whatever `p` is.
#[inline]
pub fn prefetch_dram<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; it reads nothing into the program and never
    // faults, whatever the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
}

/// CLOCK_REALTIME, read from the vDSO straight into a `Ts`: 22.7 ns a call here,
/// against 33-34 ns for `SystemTime::now` and its `duration_since` the epoch (a
/// probe, 5,000,000 calls each, three rounds).
pub fn fine_now() -> crate::log::Ts {
    clock_now(libc::CLOCK_REALTIME)
}

/// CLOCK_REALTIME_COARSE: the time of the last clock tick (a few milliseconds'
/// resolution), read from the vDSO without the TSC, a third of the fine clock's cost.
pub fn coarse_now() -> crate::log::Ts {
    clock_now(libc::CLOCK_REALTIME_COARSE)
}

fn clock_now(id: libc::clockid_t) -> crate::log::Ts {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill; both clock ids are
    // valid on Linux (a failure leaves zeros: the epoch, which a coarse stamp's
    // floor raises).
    unsafe { libc::clock_gettime(id, &mut t) };
    crate::log::Ts { sec: t.tv_sec, nsec: t.tv_nsec as u32 }
}

/// Several parties (a daemon and its clients in one test process) may share one
/// medium.
impl<T: Medium> Medium for std::sync::Arc<T> {
    fn len(&self) -> u64 {
        (**self).len()
    }
    fn now(&self) -> crate::log::Ts {
        (**self).now()
    }
    fn now_coarse(&self) -> crate::log::Ts {
        (**self).now_coarse()
    }
    fn wait_point(&self) {
        (**self).wait_point()
    }
    fn populate(&self, off: u64, len: u64) {
        (**self).populate(off, len)
    }
    fn prefetch(&self, off: u64) {
        (**self).prefetch(off)
    }
    fn read(&self, off: u64, dst: &mut [u8]) {
        (**self).read(off, dst)
    }
    fn load_u64(&self, off: u64) -> u64 {
        (**self).load_u64(off)
    }
    fn write(&self, off: u64, src: &[u8]) {
        (**self).write(off, src)
    }
    fn write_nt(&self, off: u64, src: &[u8]) {
        (**self).write_nt(off, src)
    }
    fn write_nt_crc(&self, off: u64, src: &[u8]) -> u32 {
        (**self).write_nt_crc(off, src)
    }
    fn zero_nt(&self, off: u64, len: u64) {
        (**self).zero_nt(off, len)
    }
    fn store_u64(&self, off: u64, val: u64) {
        (**self).store_u64(off, val)
    }
    fn store_u64_nt(&self, off: u64, val: u64) {
        (**self).store_u64_nt(off, val)
    }
    fn flush(&self, off: u64, len: u64) {
        (**self).flush(off, len)
    }
    fn fence(&self) {
        (**self).fence()
    }
    fn durability(&self) -> Durability {
        (**self).durability()
    }
}

/// The cache-line write-back instruction in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum FlushInstr {
    /// `clwb`: write back, keep the line cached.
    Clwb,
    /// `clflushopt`: write back and invalidate, weakly ordered.
    ClflushOpt,
    /// `clflush`: write back and invalidate, serialising (no fence needed after it).
    Clflush,
    /// No flush (non-x86 builds, or forced by `FERRITE_FLUSH=none` for experiments):
    /// only process-crash durability.
    None,
}

/// The persistence configuration chosen once per process.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct PersistConfig {
    /// Flush instruction.
    pub flush: FlushInstr,
    /// Use non-temporal stores for large copies.
    pub nt_stores: bool,
    /// Copies of at least this many bytes use non-temporal stores; smaller ones use
    /// cached stores and a flush. Measured with `examples/nt_crossover.rs` (table in
    /// README.md): on the development machine (DRAM behind /dev/shm, clwb) the two
    /// paths cost the same at 512 bytes; store+clwb wins below, non-temporal above.
    pub nt_threshold: usize,
    /// Copy-on-write pages are copied and checksummed in one pass (wide loads,
    /// non-temporal stores, carry-less-multiply folding of the CRC32C:
    /// [`copy_nt_crc_raw`]), with 512-bit registers where the CPU has AVX-512, else
    /// 256-bit ones where it has AVX2 and VPCLMULQDQ (AMD Zen 3 and later).
    /// `FERRITE_CRC=portable` forces the copy followed by the `crc-fast` kernel, which
    /// CPUs with neither use anyway; `FERRITE_CRC=avx2` forces the 256-bit kernel.
    pub fused_page_crc: Option<FusedCrc>,
}

/// The fused copy-and-checksum kernel in use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum FusedCrc {
    /// AVX-512F + VPCLMULQDQ: four 512-bit accumulators, 256 bytes per round.
    Avx512,
    /// AVX2 + VPCLMULQDQ: four 256-bit accumulators, 128 bytes per round.
    Avx2,
}

/// Default crossover between store+flush and non-temporal copy (bytes).
pub const DEFAULT_NT_THRESHOLD: usize = 512;

fn detect() -> PersistConfig {
    let forced = std::env::var("FERRITE_FLUSH").ok();
    let flush = match forced.as_deref() {
        Some("clwb") => FlushInstr::Clwb,
        Some("clflushopt") => FlushInstr::ClflushOpt,
        Some("clflush") => FlushInstr::Clflush,
        Some("none") => FlushInstr::None,
        _ => detect_flush(),
    };
    let nt_stores = !matches!(std::env::var("FERRITE_NT").as_deref(), Ok("0"));
    let nt_threshold = std::env::var("FERRITE_NT_THRESHOLD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_NT_THRESHOLD);
    let fused_page_crc = match (std::env::var("FERRITE_CRC").as_deref(), fused_crc_cpu()) {
        (Ok("portable"), _) | (_, None) => None,
        (Ok("avx2"), Some(_)) => Some(FusedCrc::Avx2),
        (_, k) => k,
    };
    PersistConfig { flush, nt_stores, nt_threshold, fused_page_crc }
}

#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)]
fn detect_flush() -> FlushInstr {
    // CPUID leaf 7, sub-leaf 0: EBX bit 24 = CLWB, bit 23 = CLFLUSHOPT.
    // SAFETY: CPUID is available on every x86_64 processor.
    let max = unsafe { std::arch::x86_64::__cpuid(0) }.eax;
    let ebx = if max >= 7 {
        // SAFETY: leaf 7 exists (checked against the maximum leaf above).
        unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.ebx
    } else {
        0
    };
    if ebx & (1 << 24) != 0 {
        FlushInstr::Clwb
    } else if ebx & (1 << 23) != 0 {
        FlushInstr::ClflushOpt
    } else {
        FlushInstr::Clflush
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_flush() -> FlushInstr {
    FlushInstr::None
}

/// The process-wide persistence configuration (detected on first use).
pub fn config() -> &'static PersistConfig {
    static CFG: OnceLock<PersistConfig> = OnceLock::new();
    CFG.get_or_init(detect)
}

/// Counters of persistence work, for write-amplification measurements.
#[derive(Default, Debug)]
pub struct PersistStats {
    /// Bytes covered by flushed cache lines.
    pub flushed_bytes: AtomicU64,
    /// Bytes written with non-temporal stores.
    pub nt_bytes: AtomicU64,
    /// Fences issued.
    pub fences: AtomicU64,
}

/// A snapshot of [`PersistStats`].
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StatsSnapshot {
    /// Bytes covered by flushed cache lines.
    pub flushed_bytes: u64,
    /// Bytes written with non-temporal stores.
    pub nt_bytes: u64,
    /// Fences issued.
    pub fences: u64,
}

impl PersistStats {
    /// Read the counters.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            flushed_bytes: self.flushed_bytes.load(Ordering::Relaxed),
            nt_bytes: self.nt_bytes.load(Ordering::Relaxed),
            fences: self.fences.load(Ordering::Relaxed),
        }
    }
}

/// Round `off..off+len` out to whole cache lines: (first line start, end).
pub fn line_span(off: u64, len: u64) -> (u64, u64) {
    let start = off & !(CACHE_LINE - 1);
    let end = (off + len).div_ceil(CACHE_LINE) * CACHE_LINE;
    (start, end)
}

// ---------------------------------------------------------------------------
// Raw primitives over a mapped address range (used by the DAX medium only).

/// Write back the cache lines of `[p, p + len)`.
///
/// # Safety
/// `p..p+len` must lie within one live mapping.
pub unsafe fn flush_raw(p: *const u8, len: usize, how: FlushInstr) {
    if len == 0 {
        return;
    }
    let start = (p as usize) & !(CACHE_LINE as usize - 1);
    let end = p as usize + len;
    let mut a = start;
    while a < end {
        // SAFETY: `a` is within the caller's mapping (rounded down to its line,
        // which shares the page); flush instructions do not modify memory.
        unsafe { flush_line(a as *const u8, how) };
        a += CACHE_LINE as usize;
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn flush_line(p: *const u8, how: FlushInstr) {
    use std::arch::asm;
    // SAFETY: the caller guarantees `p` points into a live mapping; these
    // instructions only write back (and maybe invalidate) the line.
    unsafe {
        match how {
            FlushInstr::Clwb => {
                asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags))
            }
            FlushInstr::ClflushOpt => {
                asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
            }
            FlushInstr::Clflush => {
                asm!("clflush [{0}]", in(reg) p, options(nostack, preserves_flags))
            }
            FlushInstr::None => {}
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
unsafe fn flush_line(_p: *const u8, _how: FlushInstr) {}

/// Store fence ordering earlier flushes and non-temporal stores.
#[inline]
pub fn sfence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no memory operands and no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// The widest fused page copy and checksum ([`copy_nt_crc_raw`]) the CPU runs.
fn fused_crc_cpu() -> Option<FusedCrc> {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        let base = has!("vpclmulqdq") && has!("pclmulqdq") && has!("sse4.2");
        if base && has!("avx512f") {
            return Some(FusedCrc::Avx512);
        }
        if base && has!("avx2") {
            return Some(FusedCrc::Avx2);
        }
    }
    None
}

/// The fused kernel of `k` over a page (`dst` null: checksum only).
///
/// # Safety
/// The CPU has `k`'s features (it came from [`config`]); `src` and `dst` as
/// [`fold_page_avx512`] requires.
#[cfg(target_arch = "x86_64")]
unsafe fn fold_page(k: FusedCrc, src: *const u8, dst: *mut u8) -> u32 {
    // SAFETY: forwarded from the caller.
    unsafe {
        match k {
            FusedCrc::Avx512 => fold_page_avx512(src, dst),
            FusedCrc::Avx2 => fold_page_avx2(src, dst),
        }
    }
}

/// Bytes of a page, the unit the fused kernel copies and checksums.
pub const PAGE: usize = 4096;

/// x^e mod P for CRC32C's polynomial P (bit-normal, x^32 implicit).
const fn xpow_mod(e: u32) -> u32 {
    let mut r: u32 = 1;
    let mut i = 0;
    while i < e {
        let top = r & 0x8000_0000 != 0;
        r <<= 1;
        if top {
            r ^= 0x1EDC_6F41;
        }
        i += 1;
    }
    r
}

/// Folding constants that move a 128-bit lane `bits` forward in the bit-reflected
/// domain: (multiplier of its low quadword, of its high quadword). A lane's low
/// quadword holds the earlier bytes; the exponents were found by checking every
/// candidate against the crc32 instruction (see the tests).
const fn fold_k(bits: u32) -> (u64, u64) {
    (xpow_mod(bits + 31).reverse_bits() as u64, xpow_mod(bits - 33).reverse_bits() as u64)
}

/// [`crc32c_page`] of a page of zeros (a unit test computes it).
pub const ZERO_PAGE_CRC: u32 = 0x98f9_4189;

/// CRC32C (init and final xor all ones: `crc32c::crc32c`) of a page.
pub fn crc32c_page(page: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(k) = config().fused_page_crc.filter(|_| page.len() == PAGE) {
        // SAFETY: the CPU has the features (checked by `config`); no destination.
        return unsafe { fold_page(k, page.as_ptr(), std::ptr::null_mut()) };
    }
    crc_fast::crc32_iscsi(page) as u32
}

/// Copy a page to `dst` with non-temporal stores and return its CRC32C (as
/// [`crc32c_page`]) from the same loads: the checksum of a copy-on-write page costs
/// a few folds per cache line instead of a second pass over the page. Other sizes,
/// or CPUs without the kernel, copy then checksum. Persistent after the next fence.
///
/// # Safety
/// As [`copy_nt_raw`].
pub unsafe fn copy_nt_crc_raw(dst: *mut u8, src: &[u8], how: FlushInstr) -> u32 {
    #[cfg(target_arch = "x86_64")]
    let aligned = src.len() == PAGE && (dst as usize).is_multiple_of(64);
    if let Some(k) = config().fused_page_crc.filter(|_| aligned) {
        // SAFETY: the CPU has the features; `dst` is 64-byte aligned and the caller
        // guarantees a writable page there, apart from `src`.
        return unsafe { fold_page(k, src.as_ptr(), dst) };
    }
    // SAFETY: forwarded from the caller.
    unsafe { copy_nt_raw(dst, src, how) };
    crc32c_page(src)
}

/// The page kernel: four 512-bit accumulators (16 lanes of 128 bits) fold 256
/// bytes per round, then fold into one lane, whose 16 bytes have the page's CRC
/// (folding keeps the message's residue modulo P), taken with two crc32
/// instructions. With a destination, every loaded cache line is also streamed there.
///
/// # Safety
/// The CPU must have AVX-512F, VPCLMULQDQ, PCLMULQDQ and SSE4.2; `src` must be
/// readable for [`PAGE`] bytes; `dst` null, or 64-byte aligned and writable for
/// [`PAGE`] bytes not overlapping `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn fold_page_avx512(src: *const u8, dst: *mut u8) -> u32 {
    use std::arch::x86_64::*;
    const K256B: (u64, u64) = fold_k(256 * 8);
    const K64B: (u64, u64) = fold_k(64 * 8);
    const K48B: (u64, u64) = fold_k(48 * 8);
    const K32B: (u64, u64) = fold_k(32 * 8);
    const K16B: (u64, u64) = fold_k(16 * 8);
    let lane = |k: (u64, u64)| _mm512_broadcast_i32x4(_mm_set_epi64x(k.1 as i64, k.0 as i64));
    let fold = |x: __m512i, k: __m512i, y: __m512i| {
        // x.lo * k.lo ^ x.hi * k.hi ^ y, lane by lane (0x96: a ^ b ^ c).
        _mm512_ternarylogic_epi64::<0x96>(
            _mm512_clmulepi64_epi128::<0x00>(x, k),
            _mm512_clmulepi64_epi128::<0x11>(x, k),
            y,
        )
    };
    // SAFETY (all loads and stores below): `src + o` and `dst + o` for o < PAGE, in
    // 64-byte steps, lie within the caller's ranges; `dst + o` is 64-byte aligned.
    let load = |o: usize| unsafe { _mm512_loadu_si512(src.add(o) as *const __m512i) };
    let copy = |o: usize| {
        let v = load(o);
        if !dst.is_null() {
            unsafe { _mm512_stream_si512(dst.add(o) as *mut __m512i, v) };
        }
        v
    };
    // The initial all-ones register enters as the first 32 bits of the message.
    let init = _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, 0xFFFF_FFFF);
    let mut a0 = _mm512_xor_si512(copy(0), init);
    let mut a1 = copy(64);
    let mut a2 = copy(128);
    let mut a3 = copy(192);
    let k256 = lane(K256B);
    let mut o = 256;
    while o < PAGE {
        a0 = fold(a0, k256, copy(o));
        a1 = fold(a1, k256, copy(o + 64));
        a2 = fold(a2, k256, copy(o + 128));
        a3 = fold(a3, k256, copy(o + 192));
        o += 256;
    }
    let k64 = lane(K64B);
    a1 = fold(a0, k64, a1);
    a2 = fold(a1, k64, a2);
    a3 = fold(a2, k64, a3);
    // Lanes 0..2 of a3 move 48, 32 and 16 bytes forward onto lane 3.
    let k = _mm512_set_epi64(
        0,
        0,
        K16B.1 as i64,
        K16B.0 as i64,
        K32B.1 as i64,
        K32B.0 as i64,
        K48B.1 as i64,
        K48B.0 as i64,
    );
    let t = _mm512_xor_si512(
        _mm512_clmulepi64_epi128::<0x00>(a3, k),
        _mm512_clmulepi64_epi128::<0x11>(a3, k),
    );
    let last = _mm512_extracti32x4_epi32::<3>(a3);
    let r = _mm_xor_si128(
        _mm_xor_si128(_mm512_extracti32x4_epi32::<0>(t), _mm512_extracti32x4_epi32::<1>(t)),
        _mm_xor_si128(_mm512_extracti32x4_epi32::<2>(t), last),
    );
    let lo = _mm_cvtsi128_si64(r) as u64;
    let hi = _mm_extract_epi64::<1>(r) as u64;
    !(_mm_crc32_u64(_mm_crc32_u64(0, lo), hi) as u32)
}

/// [`fold_page_avx512`] with 256-bit registers: four accumulators fold 128 bytes per
/// round, then fold into one register, whose low lane moves 16 bytes onto its high
/// lane; that lane's 16 bytes have the page's CRC, taken with two crc32 instructions.
///
/// # Safety
/// The CPU must have AVX2, VPCLMULQDQ, PCLMULQDQ and SSE4.2; `src` must be readable
/// for [`PAGE`] bytes; `dst` null, or 32-byte aligned and writable for [`PAGE`] bytes
/// not overlapping `src`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,vpclmulqdq,pclmulqdq,sse4.2")]
unsafe fn fold_page_avx2(src: *const u8, dst: *mut u8) -> u32 {
    use std::arch::x86_64::*;
    const K128B: (u64, u64) = fold_k(128 * 8);
    const K32B: (u64, u64) = fold_k(32 * 8);
    const K16B: (u64, u64) = fold_k(16 * 8);
    let lane = |k: (u64, u64)| _mm256_broadcastsi128_si256(_mm_set_epi64x(k.1 as i64, k.0 as i64));
    let fold = |x: __m256i, k: __m256i, y: __m256i| {
        // x.lo * k.lo ^ x.hi * k.hi ^ y, lane by lane.
        _mm256_xor_si256(
            _mm256_xor_si256(
                _mm256_clmulepi64_epi128::<0x00>(x, k),
                _mm256_clmulepi64_epi128::<0x11>(x, k),
            ),
            y,
        )
    };
    // SAFETY (all loads and stores below): `src + o` and `dst + o` for o < PAGE, in
    // 32-byte steps, lie within the caller's ranges; `dst + o` is 32-byte aligned.
    let load = |o: usize| unsafe { _mm256_loadu_si256(src.add(o) as *const __m256i) };
    let copy = |o: usize| {
        let v = load(o);
        if !dst.is_null() {
            unsafe { _mm256_stream_si256(dst.add(o) as *mut __m256i, v) };
        }
        v
    };
    // The initial all-ones register enters as the first 32 bits of the message.
    let init = _mm256_set_epi64x(0, 0, 0, 0xFFFF_FFFF);
    let mut a0 = _mm256_xor_si256(copy(0), init);
    let mut a1 = copy(32);
    let mut a2 = copy(64);
    let mut a3 = copy(96);
    let k128 = lane(K128B);
    let mut o = 128;
    while o < PAGE {
        a0 = fold(a0, k128, copy(o));
        a1 = fold(a1, k128, copy(o + 32));
        a2 = fold(a2, k128, copy(o + 64));
        a3 = fold(a3, k128, copy(o + 96));
        o += 128;
    }
    let k32 = lane(K32B);
    a1 = fold(a0, k32, a1);
    a2 = fold(a1, k32, a2);
    a3 = fold(a2, k32, a3);
    let low = _mm256_castsi256_si128(a3);
    let high = _mm256_extracti128_si256::<1>(a3);
    let k16 = _mm_set_epi64x(K16B.1 as i64, K16B.0 as i64);
    let r = _mm_xor_si128(
        _mm_xor_si128(
            _mm_clmulepi64_si128::<0x00>(low, k16),
            _mm_clmulepi64_si128::<0x11>(low, k16),
        ),
        high,
    );
    let lo = _mm_cvtsi128_si64(r) as u64;
    let hi = _mm_extract_epi64::<1>(r) as u64;
    !(_mm_crc32_u64(_mm_crc32_u64(0, lo), hi) as u32)
}

/// Non-temporal copy of `src` to `dst`. 16-byte chunks use `movntdq`; an 8-byte
/// aligned word before or after them `movnti`, so a copy whose ends are 8-byte
/// aligned (a log entry) is non-temporal throughout; other unaligned head and tail
/// bytes use cached stores that are flushed. (With its first 8 bytes a cached store
/// and a flush inside a line the rest streamed into, a 120-byte entry and its tail
/// took 367 ns to persist in `examples/entry_persist.rs` on this AMD EPYC, against
/// 169 ns streamed whole.) Persistent after the next fence.
///
/// # Safety
/// `dst..dst+src.len()` must lie within one live writable mapping and not overlap `src`.
pub unsafe fn copy_nt_raw(dst: *mut u8, src: &[u8], how: FlushInstr) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128, _mm_stream_si64};
        let len = src.len();
        let mut i = 0usize;
        // An 8-byte aligned destination 8 bytes short of 16-byte alignment.
        if dst as usize & 15 == 8 && len >= 8 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&src[..8]);
            // SAFETY: dst is 8-byte aligned and dst+8 <= dst+len.
            unsafe { _mm_stream_si64(dst as *mut i64, i64::from_le_bytes(w)) };
            i = 8;
        }
        let head = ((16 - (dst as usize & 15)) & 15).saturating_sub(i);
        if head > 0 {
            let h = head.min(len);
            // SAFETY: within the caller's ranges; flushing the written span.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), dst, h);
                flush_raw(dst, h, how);
            }
            i = h;
        }
        while i + 16 <= len {
            // SAFETY: dst+i is 16-byte aligned and dst+i+16 <= dst+len; src+i+16 <= len.
            unsafe {
                let v = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
                _mm_stream_si128(dst.add(i) as *mut __m128i, v);
            }
            i += 16;
        }
        if i + 8 <= len && (dst as usize + i) & 7 == 0 {
            let mut w = [0u8; 8];
            w.copy_from_slice(&src[i..i + 8]);
            // SAFETY: dst+i is 8-byte aligned and dst+i+8 <= dst+len.
            unsafe { _mm_stream_si64(dst.add(i) as *mut i64, i64::from_le_bytes(w)) };
            i += 8;
        }
        if i < len {
            // SAFETY: the remaining tail lies within both ranges.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr().add(i), dst.add(i), len - i);
                flush_raw(dst.add(i), len - i, how);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller guarantees the ranges are valid and disjoint.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len());
    }
}

/// Non-temporal atomic store of the 8-byte word at `dst` (`movnti`; a plain
/// atomic store where there is none). Persistent after the next fence.
///
/// # Safety
/// `dst` must be 8-byte aligned and lie within one live writable mapping.
pub unsafe fn store_u64_nt_raw(dst: *mut u8, val: u64) {
    debug_assert_eq!(dst as usize % 8, 0, "unaligned atomic store");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: aligned and writable (the caller's promise); an aligned `movnti` is
    // one atomic store.
    unsafe {
        std::arch::x86_64::_mm_stream_si64(dst as *mut i64, val.to_le() as i64)
    };
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: aligned and writable (the caller's promise).
    unsafe {
        (*(dst as *const std::sync::atomic::AtomicU64))
            .store(val.to_le(), std::sync::atomic::Ordering::Release)
    };
}

/// Non-temporal zero fill of `[dst, dst + len)`. Persistent after the next fence.
///
/// # Safety
/// The range must lie within one live writable mapping.
pub unsafe fn zero_nt_raw(dst: *mut u8, len: usize, how: FlushInstr) {
    const ZEROS: [u8; 4096] = [0u8; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(ZEROS.len());
        // SAFETY: forwarded from the caller.
        unsafe { copy_nt_raw(dst.add(done), &ZEROS[..n], how) };
        done += n;
    }
}

/// Copy `src` to the pool so that it is persistent after the next fence: a
/// non-temporal copy at or above the crossover, cached stores and a flush below it.
pub fn persist_copy<M: Medium + ?Sized>(m: &M, off: u64, src: &[u8]) {
    let cfg = config();
    if cfg.nt_stores && src.len() >= cfg.nt_threshold {
        m.write_nt(off, src);
    } else {
        m.write(off, src);
        m.flush(off, src.len() as u64);
    }
}

/// Store an 8-byte word atomically and flush it (persistent after the next fence).
pub fn persist_u64<M: Medium + ?Sized>(m: &M, off: u64, val: u64) {
    m.store_u64(off, val);
    m.flush(off, 8);
}

/// Input length from which [`crc32c_append`] uses the carry-less kernel.
pub const CRC_FOLD_FROM: usize = 448;

/// CRC32C of `data` continuing from `crc`: the value of `crc32c::crc32c_append`.
/// Log entries are checksummed with it (sealed at every commit, verified at every
/// walk), and they are short (32 to a few hundred bytes): eight bytes per SSE4.2
/// `crc32` in one loop took 75 instructions per entry of a 64-byte append (callgrind)
/// where the crc32c crate's general kernel (alignment prologue, three-way split for
/// long inputs, feature check) took 175. One chain of `crc32` is bound by its
/// latency (3 cycles per 8 bytes), so from [`CRC_FOLD_FROM`] bytes (an embedded
/// write of 448 B to 2 KiB) `crc-fast`'s carry-less kernel takes over: 2 KiB in 60
/// ns against 204 (medians of one probe run on this AMD EPYC; 256 B: 21 against
/// 16). Pages go through `log::page_crc`'s carry-less kernel.
///
/// From [`CRC_3WAY_FROM`] bytes, three chains of `crc32` run at once over thirds of
/// the input and are joined by two carry-less multiplies (`crc32c_3way`): 304
/// bytes (a 256-byte append's entry checksums 308) took 17 ns against 32 in one
/// chain, 112 bytes (a 64-byte write's: 116) 10 against 12 (one probe run on this
/// AMD EPYC, each checksum chained to the last as a log's are).
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    if data.len() >= CRC_FOLD_FROM {
        return crc32c_append_long(crc, data);
    }
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2") {
        if data.len() >= CRC_3WAY_FROM && std::arch::is_x86_feature_detected!("pclmulqdq") {
            // SAFETY: the CPU has SSE4.2 and PCLMULQDQ (checked just above).
            return unsafe { crc32c_3way(crc, data) };
        }
        // SAFETY: the CPU has SSE4.2 (checked just above; std caches the answer).
        return unsafe { crc32c_sse42(crc, data) };
    }
    crc32c::crc32c_append(crc, data)
}

/// Input length from which [`crc32c_append`] runs three chains (below it, the
/// join costs more than the chains save: 64 bytes took 8.4 ns against 7.4).
pub const CRC_3WAY_FROM: usize = 96;

/// Words (8 bytes) a chain of `crc32c_3way` takes, at most.
#[cfg(target_arch = "x86_64")]
const CRC_3WAY_WORDS: usize = CRC_FOLD_FROM / 24;

/// Joining constants of `crc32c_3way` for `k` words a chain: multipliers that
/// move a chain's register `8k` and `16k` bytes forward (x^(64k-33) and
/// x^(128k-33) mod P, bit-reflected, for the `crc32` of their carry-less product;
/// the exponents were found by checking candidates against the instruction, as
/// [`fold_k`]'s, and the tests compare every length with the crate).
#[cfg(target_arch = "x86_64")]
const CRC_3WAY_K: [(u64, u64); CRC_3WAY_WORDS + 1] = {
    let mut t = [(0u64, 0u64); CRC_3WAY_WORDS + 1];
    let mut k = 1;
    while k <= CRC_3WAY_WORDS {
        let bits = 64 * k as u32;
        t[k] = (
            xpow_mod(bits - 33).reverse_bits() as u64,
            xpow_mod(2 * bits - 33).reverse_bits() as u64,
        );
        k += 1;
    }
    t
};

/// [`crc32c_append`] by three `crc32` chains over the input's first three equal
/// runs of whole words (one chain is bound by the instruction's latency, three
/// fill its throughput), joined by shifting the first two forward with one
/// carry-less multiply each; the rest (under 24 bytes) continues in one chain.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2,pclmulqdq")]
unsafe fn crc32c_3way(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::*;
    let k = data.len() / 24;
    debug_assert!((1..=CRC_3WAY_WORDS).contains(&k));
    let (sa, rest) = data.split_at(8 * k);
    let (sb, rest) = rest.split_at(8 * k);
    let (sc, tail) = rest.split_at(8 * k);
    let word = |w: &[u8]| u64::from_le_bytes(w.try_into().expect("8 bytes"));
    let (mut a, mut b, mut c) = (u64::from(!crc), 0u64, 0u64);
    for ((x, y), z) in sa.chunks_exact(8).zip(sb.chunks_exact(8)).zip(sc.chunks_exact(8)) {
        a = _mm_crc32_u64(a, word(x));
        b = _mm_crc32_u64(b, word(y));
        c = _mm_crc32_u64(c, word(z));
    }
    let (k1, k2) = CRC_3WAY_K[k];
    let lane = |v: u64| _mm_cvtsi64_si128(v as i64);
    let m = _mm_xor_si128(
        _mm_clmulepi64_si128(lane(a), lane(k2), 0),
        _mm_clmulepi64_si128(lane(b), lane(k1), 0),
    );
    let mut r = c ^ _mm_crc32_u64(0, _mm_cvtsi128_si64(m) as u64);
    let mut words = tail.chunks_exact(8);
    for w in &mut words {
        r = _mm_crc32_u64(r, word(w));
    }
    let mut r = r as u32;
    for &x in words.remainder() {
        r = _mm_crc32_u8(r, x);
    }
    !r
}

/// Multipliers that move a CRC32C register `n` zero bytes forward, for `n` in
/// 5..=[`PAGE`]: x^(8n-33) mod P bit-reflected, for the `crc32` of a carry-less
/// product, as [`CRC_3WAY_K`]'s (entries below 5 are unused).
#[cfg(target_arch = "x86_64")]
static ZERO_EXTEND_K: [u32; PAGE + 1] = {
    let mut t = [0u32; PAGE + 1];
    // x^7 for n = 5, then times x^8 per byte.
    let mut r = xpow_mod(7);
    let mut n = 5;
    while n <= PAGE {
        t[n] = r.reverse_bits();
        let mut i = 0;
        while i < 8 {
            let top = r & 0x8000_0000 != 0;
            r <<= 1;
            if top {
                r ^= 0x1EDC_6F41;
            }
            i += 1;
        }
        n += 1;
    }
    t
};

/// The CRC32C ([`crc32c_append`]'s form) of a message whose CRC is `crc`, followed
/// by `n` zero bytes (at most [`PAGE`]), without reading them: one carry-less
/// multiply. An in-place append's page checksum is its bytes' CRC extended by the
/// zeros past them ([`crate::log::FLAG_TAIL`]).
pub fn crc32c_zero_extend(crc: u32, n: usize) -> u32 {
    assert!(n <= PAGE, "zero extension by {n} bytes");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("sse4.2")
        && std::arch::is_x86_feature_detected!("pclmulqdq")
    {
        // SAFETY: the CPU has SSE4.2 and PCLMULQDQ (checked just above).
        return unsafe { crc32c_zero_extend_clmul(crc, n) };
    }
    static ZEROS: [u8; PAGE] = [0; PAGE];
    crc32c::crc32c_append(crc, &ZEROS[..n])
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2,pclmulqdq")]
unsafe fn crc32c_zero_extend_clmul(crc: u32, n: usize) -> u32 {
    use std::arch::x86_64::*;
    let mut r = !crc;
    if n < 5 {
        for _ in 0..n {
            r = _mm_crc32_u8(r, 0);
        }
        return !r;
    }
    let lane = |v: u64| _mm_cvtsi64_si128(v as i64);
    let p = _mm_clmulepi64_si128(lane(u64::from(r)), lane(u64::from(ZERO_EXTEND_K[n])), 0);
    !(_mm_crc32_u64(0, _mm_cvtsi128_si64(p) as u64) as u32)
}

/// [`crc32c_append`] of a long input, out of line so that the short path stays
/// small enough to inline into its callers.
#[inline(never)]
fn crc32c_append_long(crc: u32, data: &[u8]) -> u32 {
    let alg = crc_fast::CrcAlgorithm::Crc32Iscsi;
    let mut d = crc_fast::Digest::new_with_init_state(alg, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(crc: u32, data: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = u64::from(!crc);
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let mut b = [0u8; 8];
        b.copy_from_slice(w);
        c = _mm_crc32_u64(c, u64::from_le_bytes(b));
    }
    let mut c = c as u32;
    for &b in words.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_page_crc_is_the_crc_of_a_page_of_zeros() {
        let zeros = vec![0u8; PAGE];
        assert_eq!(crc32c_page(&zeros), ZERO_PAGE_CRC);
        assert_eq!(crc32c::crc32c(&zeros), ZERO_PAGE_CRC);
        assert_eq!(crc32c_zero_extend(0, PAGE), ZERO_PAGE_CRC);
    }

    #[test]
    fn page_kernel_matches_the_crate_and_copies() {
        // Pages of every kind: zeros, ones, one bit set anywhere, random.
        let mut pages: Vec<Vec<u8>> = vec![vec![0; PAGE], vec![0xff; PAGE]];
        for bit in [0usize, 1, 31, 32, 63, 64, 127, 128, 511, 512, 2047, 2048, 32767] {
            let mut p = vec![0u8; PAGE];
            p[bit / 8] |= 1 << (bit % 8);
            pages.push(p);
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..64 {
            pages.push(
                (0..PAGE)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x as u8
                    })
                    .collect(),
            );
        }
        // A 64-byte aligned destination inside a larger buffer.
        let mut buf = vec![0u8; 2 * PAGE];
        let at = (64 - buf.as_ptr() as usize % 64) % 64;
        for p in &pages {
            let want = crc32c::crc32c(p);
            assert_eq!(crc32c_page(p), want);
            buf.iter_mut().for_each(|b| *b = 0x33);
            // SAFETY: buf[at..at + PAGE] is writable and apart from `p`.
            let got = unsafe { copy_nt_crc_raw(buf.as_mut_ptr().add(at), p, config().flush) };
            sfence();
            assert_eq!(got, want);
            assert_eq!(&buf[at..at + PAGE], &p[..]);
            assert!(buf[..at].iter().chain(&buf[at + PAGE..]).all(|&b| b == 0x33));
        }
        // Unaligned destinations and other sizes take the copy-then-checksum path.
        // SAFETY: as above, one byte further.
        let got =
            unsafe { copy_nt_crc_raw(buf.as_mut_ptr().add(at + 1), &pages[5], config().flush) };
        sfence();
        assert_eq!(got, crc32c::crc32c(&pages[5]));
        assert_eq!(&buf[at + 1..at + 1 + PAGE], &pages[5][..]);
        eprintln!("fused page kernel in use: {:?}", config().fused_page_crc);
    }

    /// The folding exponents of `fold_k`, checked directly: a 128-bit lane moved
    /// forward by `bits` with its two multipliers leaves the message's residue
    /// (the crc32 instruction's result from a zero register) unchanged.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fold_constants_keep_the_residue() {
        if fused_crc_cpu().is_none() {
            return;
        }
        fn residue(b: &[u8]) -> u32 {
            let mut c = 0u64;
            for w in b.chunks_exact(8) {
                // SAFETY: the CPU has SSE4.2 (fused_crc_cpu).
                c = unsafe {
                    std::arch::x86_64::_mm_crc32_u64(c, u64::from_le_bytes(w.try_into().unwrap()))
                };
            }
            c as u32
        }
        fn clmul(a: u64, b: u64) -> u128 {
            use std::arch::x86_64::*;
            // SAFETY: the CPU has PCLMULQDQ (fused_crc_cpu); plain register math.
            unsafe {
                let x = _mm_clmulepi64_si128(
                    _mm_set_epi64x(0, a as i64),
                    _mm_set_epi64x(0, b as i64),
                    0,
                );
                (_mm_extract_epi64::<1>(x) as u64 as u128) << 64
                    | _mm_cvtsi128_si64(x) as u64 as u128
            }
        }
        let mut x = 7u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for bytes in [16usize, 32, 48, 64, 128, 256] {
            let (klo, khi) = fold_k(bytes as u32 * 8);
            for _ in 0..32 {
                let mut m: Vec<u8> = (0..bytes + 16).map(|_| rnd() as u8).collect();
                let want = residue(&m);
                let lo = u64::from_le_bytes(m[..8].try_into().unwrap());
                let hi = u64::from_le_bytes(m[8..16].try_into().unwrap());
                m[..16].fill(0);
                let t = u128::from_le_bytes(m[bytes..].try_into().unwrap())
                    ^ clmul(lo, klo)
                    ^ clmul(hi, khi);
                m[bytes..].copy_from_slice(&t.to_le_bytes());
                assert_eq!(residue(&m), want, "fold by {bytes} bytes");
            }
        }
    }

    #[test]
    fn crc32c_append_matches_the_crate() {
        // Every kernel: one crc32 chain, three joined ones from CRC_3WAY_FROM, the
        // carry-less one from CRC_FOLD_FROM.
        let data: Vec<u8> = (0..2100u32).map(|i| ((i * 37) ^ (i >> 3)) as u8).collect();
        let f = CRC_FOLD_FROM;
        for seed in [0u32, 1, 0xdead_beef, u32::MAX] {
            for start in 0..9 {
                for len in [0usize, 1, 7, 8, 9, 15, 16, 31, 100, 255, f - 1, f, f + 9, 2048] {
                    let d = &data[start..start + len];
                    assert_eq!(crc32c_append(seed, d), crc32c::crc32c_append(seed, d));
                }
                // Every length of the three-chain kernel, and either side of it.
                for len in CRC_3WAY_FROM - 9..f + 2 {
                    let d = &data[start..start + len];
                    assert_eq!(crc32c_append(seed, d), crc32c::crc32c_append(seed, d), "{len}");
                }
            }
        }
    }

    #[test]
    fn zero_extension_matches_appending_zeros() {
        let zeros = [0u8; PAGE];
        for crc in [0u32, 1, 0xdead_beef, u32::MAX, crc32c::crc32c(b"ferrite")] {
            for n in (0..40).chain([255, 256, 1000, 4000, 4095, 4096]) {
                let want = crc32c::crc32c_append(crc, &zeros[..n]);
                assert_eq!(crc32c_zero_extend(crc, n), want, "crc {crc:#x}, {n} zeros");
            }
        }
    }

    #[test]
    fn line_span_rounds_out() {
        assert_eq!(line_span(0, 1), (0, 64));
        assert_eq!(line_span(63, 2), (0, 128));
        assert_eq!(line_span(64, 64), (64, 128));
    }

    #[test]
    fn nt_copy_all_alignments() {
        let cfg = config();
        let mut buf = vec![0u8; 512];
        let src: Vec<u8> = (0..200u32).map(|i| i as u8 ^ 0x5a).collect();
        for off in 0..20 {
            for len in [0usize, 1, 7, 8, 9, 15, 16, 17, 24, 100, 120, 200] {
                buf.iter_mut().for_each(|b| *b = 0);
                // SAFETY: buf is a live Vec with room for off + len bytes.
                unsafe { copy_nt_raw(buf.as_mut_ptr().add(off), &src[..len], cfg.flush) };
                sfence();
                assert_eq!(&buf[off..off + len], &src[..len]);
                assert!(buf[..off].iter().all(|&b| b == 0));
                assert!(buf[off + len..].iter().all(|&b| b == 0));
            }
        }
    }
}
