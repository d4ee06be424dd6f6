//! Coordination between the processes that share one pool: the mount daemon
//! (party 0, the owner of the pool, its namespace and its allocator) and its
//! direct-access clients (parties 1..[`MAX_PARTIES`]), which read and write file
//! data through the same core code over their own mapping of the pool.
//!
//! The table lives in memory shared by all parties (a memfd the daemon creates, or
//! a heap region when the parties are threads of one test process). It is volatile:
//! nothing in it is persistent, and a remount starts a new one.
//!
//! Per inode:
//! - `lock`: the cross-process write lock. A party holds it while it appends to the
//!   inode's log (and while it catches its DRAM index up with the log). 0 = free,
//!   else `holder + 1`, bit 31 = waiters (futex).
//! - `free_seq`: bumped before any block or log page the inode referenced is freed.
//!   Readers copy data without the lock and retry when it moved (a seqlock: a block
//!   can only be reused after it was freed, so an unchanged counter proves the copy
//!   came from blocks that were still the file's).
//! - `chain_gen`: bumped before log pages leave the inode's chain (fast or thorough
//!   GC). A party whose index saw an older generation replays the log from the head
//!   instead of catching up from its old tail.
//! - `flags`: [`NO_DIRECT`] while kernel page-cache users of the inode exist; clients
//!   then send writes through the kernel.
//! - `dirty`: the parties that ever write-locked the inode (for death recovery).
//! - `dax`: the parties with a live DAX mapping of the inode (see `mapping`): while
//!   any bit is set, no party frees or replaces a block of it. A party sets its bit
//!   under the inode's lock before it maps anything and clears it after its last
//!   mapping is gone; the daemon clears a dead party's bit when it resolves it.
//!
//! Header: the count of inodes the daemon freed, `inode_frees` (a 64-bit value in
//! two words under a sequence word, written by the daemon alone, after each freed
//! inode's state word and before the number can be used again). A client checks
//! that a cached inode is still the incarnation its slot holds by loading the slot's
//! state word, a line each commit's streamed tail store sends to memory; an
//! unchanged count since the last such check proves it without that load.
//!
//! Per block: the owner byte. Invariant: a data block that is free in some party's
//! allocator, or allocated by a party for an operation not yet committed, is owned by
//! that party; every block a party frees into its own allocator is marked owned by it
//! *before* the commit that frees it. Blocks owned by a dead party that no log
//! references are therefore exactly the blocks it held, and go back to the daemon.
//!
//! Per block: its extra references (see `refs`), a word each after the inode
//! entries, and a header word that says whether any block ever had one. Memory the
//! kernel backs lazily: a pool without shared blocks touches none of it.
//!
//! Per party: its state ([`P_FREE`], [`P_ACTIVE`], [`P_REVOKED`]), pid, the
//! blocks in its allocator, its operations in progress on shared inodes, and its
//! *span*: the lowest and highest inode number it ever locked, marked written or
//! DAX-mapped, and the lowest and highest 64-block chunk of the blocks marked owned
//! by it. A span is widened *before* the mark it covers, so the daemon resolving a
//! party looks only inside it: a client that only read (most processes) is
//! resolved without a look at any inode or block, whatever the pool's size. A party
//! counts an operation, then checks it is still active (and the daemon alive), every
//! time it acquires a lock; the daemon revokes a party, waits while the party lives
//! and has operations in progress, then takes each of its locks once: after that, the
//! party commits nothing more.
//!
//! Lock order: inode locks in ascending inode order; a party never waits for the
//! daemon (a socket request) while it holds an inode lock, except for block grants,
//! which the daemon serves without inode locks.

use crate::error::{Error, Result};
use crate::futex;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Parties a table supports (the daemon and 63 clients).
pub const MAX_PARTIES: u32 = 64;
/// The daemon's party number.
pub const DAEMON: u32 = 0;
/// Party slot states.
pub const P_FREE: u32 = 0;
/// A live client.
pub const P_ACTIVE: u32 = 1;
/// A client the daemon took back (dead, or the mount is ending).
pub const P_REVOKED: u32 = 2;
/// Inode flag: kernel page-cache users exist (plain opens); clients must write
/// through the kernel. Kept by the daemon.
pub const NO_DIRECT: u32 = 1;
/// Inode flag: a client mapped the inode shared through the kernel; the same rule.
/// Set by that client, cleared by the daemon when no handle of the inode is left.
pub const MAPPED: u32 = 2;
/// Inode flag: a client holds a handle of the inode open for writing, so the
/// kernel's cached attributes of it may be stale (direct writes move its size and
/// times unseen). Kept by the daemon, which clears it at the last such release
/// only after the kernel dropped those attributes: while it is clear, a stat
/// through the kernel is current.
pub const WRITERS: u32 = 4;

const MAGIC: [u32; 2] = [u32::from_le_bytes(*b"FRRT"), u32::from_le_bytes(*b"SHM1")];
const VERSION: u32 = 9;
/// `FUTEX_OWNER_DIED`: set by the kernel in a robust futex word whose owner died.
pub const OWNER_DIED: u32 = 0x4000_0000;
const WAITERS: u32 = 1 << 31;
/// Lock word flag: the holder keeps the lock as an idle lease (no operation of it
/// uses the lock). Any other party takes such a lock over with one CAS instead of
/// waiting, and the holder claims it back with a CAS before it uses it again: a
/// stopped or busy client cannot keep others waiting on a lease.
const IDLE: u32 = 1 << 8;
const HOLDER_MASK: u32 = 0xff;

// Header words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 2;
const H_NINODES: usize = 3; // two words
const H_NBLOCKS: usize = 5; // two words
/// The daemon's liveness word: a robust futex holding its sentinel thread's id; the
/// kernel sets [`OWNER_DIED`] when that thread (the daemon) dies.
pub const H_ALIVE: usize = 8;
const H_FLAGS: usize = 9;
const H_FREE: usize = 10; // two words
const H_UUID: usize = 12; // four words
/// Nonzero once some block has an extra reference (`refs`).
const H_REFS: usize = 16;
/// The count of inodes the daemon freed (see the module invariants): a sequence
/// word, odd while the daemon changes the count, then the count in two words. On a
/// line of their own: clients load them on every lookup.
const H_FREES_SEQ: usize = 32;
const H_FREES: usize = 33; // two words
const _: () =
    assert!((H_FREES_SEQ * 4).is_multiple_of(64) && (H_FREES + 1) * 4 < H_FREES_SEQ * 4 + 64);
const _: () = assert!(H_REFS * 4 < H_FREES_SEQ * 4 && H_FREES + 2 <= HEADER_WORDS);
const HEADER_WORDS: usize = 64;
const F_SHUTDOWN: u32 = 1;

// Journal shards: a cross-process lock and the last transaction id of each.
/// Journal shards a table coordinates (as many as the format allows).
pub const MAX_JOURNALS: usize = 1024;
const JOURNAL_WORDS: usize = 4;
const J_LOCK: usize = 0;
const J_TXID: usize = 1; // two words

// Party slots.
const PARTY_WORDS: usize = 16;
const S_STATE: usize = 0;
const S_PID: usize = 1;
const S_POOL: usize = 2; // two words
/// Operations of the party in progress on shared inodes (a client's holds): the
/// daemon waits for them to end before it takes a live client's locks over.
const S_BUSY: usize = 4;
/// The party's span (see the module invariants): inode numbers, then chunks of
/// [`SPAN_CHUNK`] blocks, each as lowest and highest (inclusive). Empty is
/// `u32::MAX, 0`; a number from [`SPAN_END`] on reads as "to the end".
const S_INO_LO: usize = 5;
const S_INO_HI: usize = 6;
const S_CHUNK_LO: usize = 7;
const S_CHUNK_HI: usize = 8;
/// A range a party may have touched: `(first, last)` inodes or `[start, end)`
/// blocks ([`Table::touched`]); None for nothing.
pub type Span = Option<(u64, u64)>;
/// Blocks per chunk of a party's block span.
const SPAN_CHUNK: u64 = 64;
/// Span words saturate here (a pool of more than 2^32 inodes or 2^38 blocks).
const SPAN_END: u32 = u32::MAX - 1;

// Inode entries.
const ENTRY_WORDS: usize = 8;
const E_LOCK: usize = 0;
const E_FREE_SEQ: usize = 1;
const E_CHAIN: usize = 2;
const E_FLAGS: usize = 3;
const E_DIRTY: usize = 4; // two words
const E_DAX: usize = 6; // two words

/// How long a waiter sleeps before it checks again that the holder's side is alive.
const WAIT_SLICE: Duration = Duration::from_millis(20);
/// Sleeps after which a waiter says who it waits for.
pub(crate) const LONG_WAIT: u32 = 250;

use crate::region::Mem;
pub use crate::region::{HeapRegion, Region};

impl HeapRegion {
    /// A zeroed region for a table of `ninodes` inodes and `nblocks` blocks.
    pub fn new(ninodes: u64, nblocks: u64) -> HeapRegion {
        let (w, o) = Table::sizes(ninodes, nblocks);
        HeapRegion::zeroed(w, o)
    }
}

/// The coordination table.
pub struct Table {
    r: Mem,
    ninodes: u64,
    nblocks: u64,
}

fn lo_hi(v: u64) -> (u32, u32) {
    (v as u32, (v >> 32) as u32)
}

/// The 64-bit value of words `i` (low half) and `i + 1`, each loaded with `o`.
fn hi_lo(w: &[AtomicU32], i: usize, o: Ordering) -> u64 {
    w[i].load(o) as u64 | (w[i + 1].load(o) as u64) << 32
}

impl Table {
    /// Words and owner bytes a table needs.
    pub fn sizes(ninodes: u64, nblocks: u64) -> (usize, usize) {
        let words = Self::ENTRIES + ninodes as usize * ENTRY_WORDS + nblocks as usize;
        (words, nblocks as usize)
    }

    /// Bytes of the word area (the owner bytes follow it in a mapping).
    pub fn word_bytes(ninodes: u64, nblocks: u64) -> usize {
        Self::sizes(ninodes, nblocks).0 * 4
    }

    /// Initialise a zeroed region (the daemon).
    pub fn create(r: Box<dyn Region>, ninodes: u64, nblocks: u64, uuid: &[u8; 16]) -> Table {
        let (w, o) = Self::sizes(ninodes, nblocks);
        assert!(r.words().len() >= w && r.owners().len() >= o, "region too small");
        let t = Table { r: Mem::new(r), ninodes, nblocks };
        let ws = t.r.words();
        let (a, b) = lo_hi(ninodes);
        ws[H_NINODES].store(a, Ordering::Relaxed);
        ws[H_NINODES + 1].store(b, Ordering::Relaxed);
        let (a, b) = lo_hi(nblocks);
        ws[H_NBLOCKS].store(a, Ordering::Relaxed);
        ws[H_NBLOCKS + 1].store(b, Ordering::Relaxed);
        for k in 0..4 {
            let v = u32::from_le_bytes(uuid[4 * k..4 * k + 4].try_into().expect("4 bytes"));
            ws[H_UUID + k].store(v, Ordering::Relaxed);
        }
        ws[H_VERSION].store(VERSION, Ordering::Relaxed);
        ws[H_MAGIC + 1].store(MAGIC[1], Ordering::Relaxed);
        ws[H_MAGIC].store(MAGIC[0], Ordering::Release);
        t.party_words(DAEMON)[S_STATE].store(P_ACTIVE, Ordering::Release);
        t
    }

    /// Open a table another party created; checks it describes this pool.
    pub fn open(r: Box<dyn Region>, uuid: &[u8; 16]) -> Result<Table> {
        let ws = r.words();
        if ws.len() < HEADER_WORDS
            || ws[H_MAGIC].load(Ordering::Acquire) != MAGIC[0]
            || ws[H_MAGIC + 1].load(Ordering::Relaxed) != MAGIC[1]
        {
            return Err(Error::Foreign("not a FerriteFS coordination table".into()));
        }
        let v = ws[H_VERSION].load(Ordering::Relaxed);
        if v != VERSION {
            return Err(Error::Foreign(format!(
                "coordination table version {v}, this library speaks {VERSION}"
            )));
        }
        let get2 = |i: usize| hi_lo(ws, i, Ordering::Relaxed);
        let (ninodes, nblocks) = (get2(H_NINODES), get2(H_NBLOCKS));
        let mut u = [0u8; 16];
        for k in 0..4 {
            u[4 * k..4 * k + 4]
                .copy_from_slice(&ws[H_UUID + k].load(Ordering::Relaxed).to_le_bytes());
        }
        if &u != uuid {
            return Err(Error::Foreign("coordination table belongs to another pool".into()));
        }
        let (w, o) = Self::sizes(ninodes, nblocks);
        if r.words().len() < w || r.owners().len() < o {
            return Err(Error::Foreign("coordination table is truncated".into()));
        }
        Ok(Table { r: Mem::new(r), ninodes, nblocks })
    }

    /// Inodes covered.
    pub fn ninodes(&self) -> u64 {
        self.ninodes
    }

    fn journal_words(&self, shard: u32) -> &[AtomicU32] {
        assert!((shard as usize) < MAX_JOURNALS, "journal {shard} out of range");
        let s = HEADER_WORDS + shard as usize * JOURNAL_WORDS;
        &self.r.words()[s..s + JOURNAL_WORDS]
    }

    fn party_words(&self, p: u32) -> &[AtomicU32] {
        assert!(p < MAX_PARTIES, "party {p} out of range");
        let s = HEADER_WORDS + MAX_JOURNALS * JOURNAL_WORDS + p as usize * PARTY_WORDS;
        &self.r.words()[s..s + PARTY_WORDS]
    }

    /// The first word of the inode entries (after the header, journals, parties).
    const ENTRIES: usize =
        HEADER_WORDS + MAX_JOURNALS * JOURNAL_WORDS + MAX_PARTIES as usize * PARTY_WORDS;

    fn entry(&self, ino: u64) -> &[AtomicU32] {
        assert!(ino >= 1 && ino <= self.ninodes, "inode {ino} out of range");
        let s = Self::ENTRIES + (ino - 1) as usize * ENTRY_WORDS;
        &self.r.words()[s..s + ENTRY_WORDS]
    }

    /// The extra-reference words, one per block (see `refs`), and the word that
    /// says whether any is set.
    pub(crate) fn refs(&self) -> (&AtomicU32, &[AtomicU32]) {
        let s = Self::ENTRIES + self.ninodes as usize * ENTRY_WORDS;
        let w = self.r.words();
        (&w[H_REFS], &w[s..s + self.nblocks as usize])
    }

    /// The daemon's liveness word (see [`H_ALIVE`]).
    pub fn alive_word(&self) -> &AtomicU32 {
        &self.r.words()[H_ALIVE]
    }

    /// May party `p` commit: is it active and the daemon alive and not ending?
    /// ([`Party::check`]'s fast path: three loads, one slice.)
    #[inline]
    pub fn may_commit(&self, p: u32) -> bool {
        let w = self.r.words();
        let state = HEADER_WORDS + MAX_JOURNALS * JOURNAL_WORDS + p as usize * PARTY_WORDS;
        w[state + S_STATE].load(Ordering::Acquire) == P_ACTIVE && serving(w)
    }

    /// Is the daemon alive and serving (not shut down, its sentinel not dead)?
    pub fn daemon_alive(&self) -> bool {
        serving(self.r.words())
    }

    /// The daemon is ending: clients stop at their next operation.
    pub fn set_shutdown(&self) {
        self.r.words()[H_FLAGS].fetch_or(F_SHUTDOWN, Ordering::AcqRel);
    }

    /// Free blocks the daemon has (published for clients' space decisions).
    pub fn global_free(&self) -> u64 {
        let ws = self.r.words();
        hi_lo(ws, H_FREE, Ordering::Relaxed)
    }

    /// Publish the daemon's free block count.
    pub fn set_global_free(&self, n: u64) {
        let ws = self.r.words();
        let (a, b) = lo_hi(n);
        ws[H_FREE].store(a, Ordering::Relaxed);
        ws[H_FREE + 1].store(b, Ordering::Relaxed);
    }

    /// Claim a free party slot for a client with process id `pid`.
    pub fn claim_party(&self, pid: u32) -> Option<u32> {
        for p in 1..MAX_PARTIES {
            let w = self.party_words(p);
            if w[S_STATE]
                .compare_exchange(P_FREE, P_ACTIVE, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                w[S_PID].store(pid, Ordering::Relaxed);
                w[S_POOL].store(0, Ordering::Relaxed);
                w[S_POOL + 1].store(0, Ordering::Relaxed);
                self.clear_span(p);
                return Some(p);
            }
        }
        None
    }

    /// State of party `p`.
    pub fn party_state(&self, p: u32) -> u32 {
        self.party_words(p)[S_STATE].load(Ordering::Acquire)
    }

    /// Set the state of party `p`.
    pub fn set_party_state(&self, p: u32, s: u32) {
        self.party_words(p)[S_STATE].store(s, Ordering::Release);
    }

    /// Party `p` starts an operation on a shared inode; it checks its state after
    /// this (both sides order their store before their load: see `busy`).
    pub fn busy_enter(&self, p: u32) {
        self.party_words(p)[S_BUSY].fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Party `p`'s operation ended.
    pub fn busy_exit(&self, p: u32) {
        let was = self.party_words(p)[S_BUSY].fetch_sub(1, Ordering::SeqCst);
        debug_assert!(was > 0, "busy count underflow");
    }

    /// Operations party `p` has in progress. The daemon reads it after revoking
    /// the party (a store, then a SeqCst fence): an operation that began before
    /// the revocation is counted here, and one that begins after sees it.
    pub fn busy(&self, p: u32) -> u32 {
        fence(Ordering::SeqCst);
        self.party_words(p)[S_BUSY].load(Ordering::SeqCst)
    }

    /// Process id of party `p`.
    pub fn party_pid(&self, p: u32) -> u32 {
        self.party_words(p)[S_PID].load(Ordering::Relaxed)
    }

    /// Blocks free in party `p`'s allocator (as it last published).
    pub fn party_pool(&self, p: u32) -> u64 {
        let w = self.party_words(p);
        hi_lo(w, S_POOL, Ordering::Relaxed)
    }

    fn set_party_pool(&self, p: u32, n: u64) {
        let w = self.party_words(p);
        let (a, b) = lo_hi(n);
        w[S_POOL].store(a, Ordering::Relaxed);
        w[S_POOL + 1].store(b, Ordering::Relaxed);
    }

    /// Empty party `p`'s span (a new client, or one resolved).
    pub fn clear_span(&self, p: u32) {
        let w = self.party_words(p);
        for (lo, hi) in [(S_INO_LO, S_INO_HI), (S_CHUNK_LO, S_CHUNK_HI)] {
            w[lo].store(u32::MAX, Ordering::Relaxed);
            w[hi].store(0, Ordering::Release);
        }
    }

    /// Widen party `p`'s span `(lo, hi)` to cover `[a, b]`, before the mark it is
    /// for: a load when it already does, the common case.
    fn widen(&self, p: u32, (lo, hi): (usize, usize), a: u64, b: u64) {
        if p == DAEMON {
            return; // the daemon is never resolved
        }
        debug_assert!(a <= b, "span [{a}, {b}]");
        let w = self.party_words(p);
        let sat = |x: u64| x.min(SPAN_END as u64) as u32;
        let (a, b) = (sat(a), sat(b));
        if w[lo].load(Ordering::Acquire) > a {
            w[lo].fetch_min(a, Ordering::AcqRel);
        }
        if w[hi].load(Ordering::Acquire) < b {
            w[hi].fetch_max(b, Ordering::AcqRel);
        }
        // The mark that follows (a lock's compare-exchange may be Acquire only) must
        // not be seen before the span that covers it.
        fence(Ordering::Release);
    }

    /// Party `p`'s span, as `(first, last)` inclusive, with `end` for "to the end";
    /// None when empty.
    fn span(&self, p: u32, (lo, hi): (usize, usize), end: u64) -> Option<(u64, u64)> {
        let w = self.party_words(p);
        let (a, b) = (w[lo].load(Ordering::Acquire), w[hi].load(Ordering::Acquire));
        if a > b {
            return None;
        }
        let last = if b >= SPAN_END { end } else { b as u64 };
        let first = if a >= SPAN_END { end } else { a as u64 };
        Some((first, last))
    }

    /// What party `p` may have touched: the inode numbers `[first, last]` it may
    /// have locked, marked written or DAX-mapped, and the blocks `[start, end)` it
    /// may own (clipped to the table). Everything outside is certainly untouched.
    pub fn touched(&self, p: u32) -> (Span, Span) {
        let inos = self
            .span(p, (S_INO_LO, S_INO_HI), self.ninodes)
            .map(|(a, b)| (a.max(1), b.min(self.ninodes)))
            .filter(|(a, b)| a <= b);
        let last_chunk = self.nblocks.div_ceil(SPAN_CHUNK);
        let blocks = self
            .span(p, (S_CHUNK_LO, S_CHUNK_HI), last_chunk)
            .map(|(a, b)| {
                (a.saturating_mul(SPAN_CHUNK), (b + 1).saturating_mul(SPAN_CHUNK).min(self.nblocks))
            })
            .filter(|(a, b)| a < b);
        (inos, blocks)
    }

    /// Parties that are not free (the daemon included).
    pub fn active_parties(&self) -> Vec<u32> {
        (0..MAX_PARTIES).filter(|&p| self.party_state(p) != P_FREE).collect()
    }

    // ----------------------------------------------------------- inode locks

    /// Current holder of `ino`'s lock.
    pub fn holder(&self, ino: u64) -> Option<u32> {
        let v = self.entry(ino)[E_LOCK].load(Ordering::Acquire) & HOLDER_MASK;
        (v != 0).then(|| v - 1)
    }

    /// Does a party sleep waiting for `ino`'s lock?
    pub fn waiters(&self, ino: u64) -> bool {
        self.entry(ino)[E_LOCK].load(Ordering::Relaxed) & WAITERS != 0
    }

    /// Release `ino`'s lock if party `p` holds it (a lease that the daemon may
    /// have taken over after revoking `p`). Returns whether it did.
    pub fn release_if_held(&self, ino: u64, p: u32) -> bool {
        release_word(&self.entry(ino)[E_LOCK], p)
    }

    /// Try once to take `ino`'s lock for party `p` (free, or another party's idle
    /// lease).
    pub fn try_lock(&self, ino: u64, p: u32) -> bool {
        self.widen(p, (S_INO_LO, S_INO_HI), ino, ino);
        let w = &self.entry(ino)[E_LOCK];
        let cur = w.load(Ordering::Relaxed);
        let free = cur & HOLDER_MASK == 0 || (cur & IDLE != 0 && cur & HOLDER_MASK != p + 1);
        free && w
            .compare_exchange(cur, (p + 1) | (cur & WAITERS), Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Party `p`, which holds `ino`'s lock and has no operation using it, keeps it
    /// as an idle lease (see [`IDLE`]).
    pub fn set_idle(&self, ino: u64, p: u32) {
        let w = &self.entry(ino)[E_LOCK];
        let mut cur = w.load(Ordering::Relaxed);
        loop {
            if cur & HOLDER_MASK != p + 1 {
                debug_assert!(false, "party {p} idles a lock held by {}", cur & HOLDER_MASK);
                return;
            }
            // Release: whoever takes the lease over sees this party's commits.
            match w.compare_exchange_weak(cur, cur | IDLE, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(c) => cur = c,
            }
        }
    }

    /// Party `p` wants to use its idle lease on `ino` again: true if it still holds
    /// the lock (now busy), false if another party took it over meanwhile.
    pub fn claim_lease(&self, ino: u64, p: u32) -> bool {
        let w = &self.entry(ino)[E_LOCK];
        let mut cur = w.load(Ordering::Relaxed);
        loop {
            if cur & HOLDER_MASK != p + 1 {
                return false;
            }
            debug_assert!(cur & IDLE != 0, "party {p} claims a lease it did not idle");
            match w.compare_exchange_weak(cur, cur & !IDLE, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return true,
                Err(c) => cur = c,
            }
        }
    }

    /// Take `ino`'s lock for party `p`. `alive` is asked between sleeps; when it
    /// returns an error the wait ends with it. With `steal_from`, a lock held by that
    /// (dead) party is taken over.
    pub fn lock(
        &self,
        ino: u64,
        p: u32,
        steal_from: Option<u32>,
        alive: &dyn Fn(u32) -> Result<()>,
    ) -> Result<()> {
        self.widen(p, (S_INO_LO, S_INO_HI), ino, ino);
        lock_word(&self.entry(ino)[E_LOCK], p, steal_from, alive)
    }

    /// Release `ino`'s lock held by party `p`.
    pub fn unlock(&self, ino: u64, p: u32) {
        unlock_word(&self.entry(ino)[E_LOCK], p);
    }

    // --------------------------------------------------------------- journals

    /// Take journal `shard`'s lock for party `p` (as [`Table::lock`]).
    pub fn lock_journal(
        &self,
        shard: u32,
        p: u32,
        steal_from: Option<u32>,
        alive: &dyn Fn(u32) -> Result<()>,
    ) -> Result<()> {
        lock_word(&self.journal_words(shard)[J_LOCK], p, steal_from, alive)
    }

    /// Release journal `shard`'s lock.
    pub fn unlock_journal(&self, shard: u32, p: u32) {
        unlock_word(&self.journal_words(shard)[J_LOCK], p);
    }

    /// Holder of journal `shard`'s lock.
    pub fn journal_holder(&self, shard: u32) -> Option<u32> {
        let v = self.journal_words(shard)[J_LOCK].load(Ordering::Acquire) & HOLDER_MASK;
        (v != 0).then(|| v - 1)
    }

    /// The next transaction id of journal `shard` (under its lock).
    pub fn next_txid(&self, shard: u32) -> u64 {
        let w = self.journal_words(shard);
        let cur = hi_lo(w, J_TXID, Ordering::Relaxed);
        self.set_txid(shard, cur + 1);
        cur + 1
    }

    /// Set journal `shard`'s last transaction id (the daemon, from media).
    pub fn set_txid(&self, shard: u32, v: u64) {
        let w = self.journal_words(shard);
        let (a, b) = lo_hi(v);
        w[J_TXID].store(a, Ordering::Relaxed);
        w[J_TXID + 1].store(b, Ordering::Relaxed);
    }

    // ------------------------------------------------------------- counters

    /// `ino`'s free sequence (Acquire: a reader loads it before copying).
    pub fn free_seq(&self, ino: u64) -> u32 {
        self.entry(ino)[E_FREE_SEQ].load(Ordering::Acquire)
    }

    /// Bump `ino`'s free sequence before freeing anything it referenced.
    pub fn bump_free_seq(&self, ino: u64) {
        self.entry(ino)[E_FREE_SEQ].fetch_add(1, Ordering::Relaxed);
        // Later stores (a reuse of the freed blocks) are ordered after the bump.
        fence(Ordering::Release);
    }

    /// The count of inodes the daemon freed, or None while the daemon changes it.
    /// Loaded before anything it vouches for (Acquire).
    pub fn inode_frees(&self) -> Option<u64> {
        let ws = self.r.words();
        let s1 = ws[H_FREES_SEQ].load(Ordering::Acquire);
        let n = hi_lo(ws, H_FREES, Ordering::Acquire);
        fence(Ordering::Acquire);
        let s2 = ws[H_FREES_SEQ].load(Ordering::Relaxed);
        (s1 == s2 && s1.is_multiple_of(2)).then_some(n)
    }

    /// Count one more freed inode (the daemon, after the inode's state word changed
    /// and before its number can be used again). The sequence word is the writers'
    /// lock (odd while one changes the count), so that the daemon's threads, each
    /// with a handle of its own or not, never interleave their changes.
    pub fn bump_inode_frees(&self) {
        let ws = self.r.words();
        let seq = &ws[H_FREES_SEQ];
        let mut s = seq.load(Ordering::Relaxed);
        loop {
            if !s.is_multiple_of(2) {
                std::hint::spin_loop();
                s = seq.load(Ordering::Relaxed);
                continue;
            }
            // Acquire: the count is read after the lock; the state word's store,
            // before it, is ordered before the count's change (AcqRel).
            match seq.compare_exchange_weak(s, s + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => break,
                Err(x) => s = x,
            }
        }
        let n = hi_lo(ws, H_FREES, Ordering::Relaxed) + 1;
        let (a, b) = lo_hi(n);
        ws[H_FREES].store(a, Ordering::Release);
        ws[H_FREES + 1].store(b, Ordering::Release);
        seq.store(s + 2, Ordering::Release);
    }

    /// `ino`'s chain generation.
    pub fn chain_gen(&self, ino: u64) -> u32 {
        self.entry(ino)[E_CHAIN].load(Ordering::Acquire)
    }

    /// Bump `ino`'s chain generation; returns the new value.
    pub fn bump_chain_gen(&self, ino: u64) -> u32 {
        self.entry(ino)[E_CHAIN].fetch_add(1, Ordering::AcqRel).wrapping_add(1)
    }

    /// `ino`'s flags.
    pub fn flags(&self, ino: u64) -> u32 {
        self.entry(ino)[E_FLAGS].load(Ordering::Acquire)
    }

    /// Set or clear flag bits of `ino`.
    pub fn set_flag(&self, ino: u64, bit: u32, on: bool) {
        let w = &self.entry(ino)[E_FLAGS];
        if on {
            w.fetch_or(bit, Ordering::AcqRel);
        } else {
            w.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    fn dirty_word(&self, ino: u64, p: u32) -> (&AtomicU32, u32) {
        (&self.entry(ino)[E_DIRTY + (p / 32) as usize], 1 << (p % 32))
    }

    /// Record that party `p` write-locked `ino` (before it commits anything).
    pub fn mark_dirty(&self, ino: u64, p: u32) {
        let (w, bit) = self.dirty_word(ino, p);
        if w.load(Ordering::Relaxed) & bit == 0 {
            self.widen(p, (S_INO_LO, S_INO_HI), ino, ino);
            w.fetch_or(bit, Ordering::AcqRel);
        }
    }

    /// Did party `p` write-lock `ino`?
    pub fn is_dirty(&self, ino: u64, p: u32) -> bool {
        let (w, bit) = self.dirty_word(ino, p);
        w.load(Ordering::Acquire) & bit != 0
    }

    /// Forget that party `p` wrote `ino`.
    pub fn clear_dirty(&self, ino: u64, p: u32) {
        let (w, bit) = self.dirty_word(ino, p);
        w.fetch_and(!bit, Ordering::AcqRel);
    }

    fn dax_word(&self, ino: u64, p: u32) -> (&AtomicU32, u32) {
        (&self.entry(ino)[E_DAX + (p / 32) as usize], 1 << (p % 32))
    }

    /// Set or clear party `p`'s live-DAX-mapping bit of `ino`.
    pub fn set_dax(&self, ino: u64, p: u32, on: bool) {
        let (w, bit) = self.dax_word(ino, p);
        if on {
            self.widen(p, (S_INO_LO, S_INO_HI), ino, ino);
            w.fetch_or(bit, Ordering::AcqRel);
        } else {
            w.fetch_and(!bit, Ordering::AcqRel);
        }
    }

    /// Does any party have a live DAX mapping of `ino`?
    pub fn dax_pinned(&self, ino: u64) -> bool {
        let e = self.entry(ino);
        e[E_DAX].load(Ordering::Acquire) | e[E_DAX + 1].load(Ordering::Acquire) != 0
    }

    /// Does party `p` have a live DAX mapping of `ino`?
    pub fn has_dax(&self, ino: u64, p: u32) -> bool {
        let (w, bit) = self.dax_word(ino, p);
        w.load(Ordering::Acquire) & bit != 0
    }

    // ---------------------------------------------------------------- owners

    /// Owner of block `b`.
    pub fn owner(&self, b: u64) -> u32 {
        self.r.owners()[b as usize].load(Ordering::Acquire) as u32
    }

    /// Mark blocks `[start, start + len)` owned by party `p`.
    pub fn set_owner(&self, start: u64, len: u64, p: u32) {
        assert!(start + len <= self.nblocks, "owner range out of the pool");
        if len > 0 {
            let chunk = |b: u64| b / SPAN_CHUNK;
            self.widen(p, (S_CHUNK_LO, S_CHUNK_HI), chunk(start), chunk(start + len - 1));
        }
        for b in &self.r.owners()[start as usize..(start + len) as usize] {
            b.store(p as u8, Ordering::Release);
        }
    }

    /// Runs of blocks owned by `p` in `[from, to)`.
    pub fn owned_runs(&self, p: u32, from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        crate::alloc::runs_where(from, to, |b| self.owner(b) == p, |s, n| out.push((s, n)));
        out
    }
}

/// Take a lock word for party `p` (0 = free, else holder + 1, bit 31 = waiters).
/// `alive` is asked after every sleep, with the number of sleeps so far.
fn lock_word(
    w: &AtomicU32,
    p: u32,
    steal_from: Option<u32>,
    alive: &dyn Fn(u32) -> Result<()>,
) -> Result<()> {
    let me = p + 1;
    let mut want = me;
    let mut spins = 0u32;
    let mut slept = 0u32;
    // A thread the crash simulator schedules does not spin (the holder cannot run);
    // asked once, when the lock is first found held.
    let mut sim = None;
    loop {
        let cur = w.load(Ordering::Relaxed);
        if cur & HOLDER_MASK == 0 {
            // Once we have slept, others may sleep too: keep the waiters bit.
            if w.compare_exchange(cur, want | (cur & WAITERS), Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(());
            }
            continue;
        }
        // Another party's idle lease: taken over at once (its holder claims it back
        // with a CAS before any use, and finds it gone).
        if cur & IDLE != 0 && cur & HOLDER_MASK != me {
            if w.compare_exchange(cur, want | (cur & WAITERS), Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(());
            }
            continue;
        }
        // Held by this same party is normal: a party is a process, and another of its
        // threads holds the lock; wait like anyone else.
        if steal_from.is_some_and(|d| cur & HOLDER_MASK == d + 1) {
            if w.compare_exchange(cur, me | (cur & WAITERS), Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(());
            }
            continue;
        }
        spins += 1;
        if spins < 100 && !*sim.get_or_insert_with(crate::sim::has_wait_hook) {
            std::hint::spin_loop();
            continue;
        }
        if cur & WAITERS == 0
            && w.compare_exchange(cur, cur | WAITERS, Ordering::Relaxed, Ordering::Relaxed).is_err()
        {
            continue;
        }
        want = me | WAITERS;
        // A party scheduled by the crash simulator lets the holder run instead of
        // sleeping (the waiters bit is set first, as before a sleep: the holder
        // then gives the lock back at the end of its operation, lease or not).
        if !crate::sim::wait_turn() {
            futex::wait(w, cur | WAITERS, WAIT_SLICE);
        }
        slept += 1;
        alive(slept)?;
    }
}

/// The header words say the daemon is alive and not shutting down.
#[inline]
fn serving(w: &[AtomicU32]) -> bool {
    let alive = w[H_ALIVE].load(Ordering::Acquire);
    alive != 0 && alive & OWNER_DIED == 0 && w[H_FLAGS].load(Ordering::Acquire) & F_SHUTDOWN == 0
}

/// Release a lock word held by party `p`.
fn unlock_word(w: &AtomicU32, p: u32) {
    if !release_word(w, p) {
        // Never release another party's lock: that would let two parties write
        // one log. A programming error, loud in tests.
        let cur = w.load(Ordering::Relaxed);
        debug_assert!(false, "party {p} releases a lock held by {}", cur & HOLDER_MASK);
        eprintln!("ferrite: party {p} released a lock it does not hold ({cur:#x}); ignored");
    }
}

/// Release a lock word if party `p` holds it (waking its waiters); false if not.
fn release_word(w: &AtomicU32, p: u32) -> bool {
    let mut cur = w.load(Ordering::Relaxed);
    loop {
        if cur & HOLDER_MASK != p + 1 {
            return false;
        }
        match w.compare_exchange_weak(cur, 0, Ordering::Release, Ordering::Relaxed) {
            Ok(_) => break,
            Err(c) => cur = c,
        }
    }
    if cur & WAITERS != 0 {
        futex::wake_all(w);
    }
    true
}

fn debug_locks() -> bool {
    static D: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *D.get_or_init(|| std::env::var_os("FERRITE_DEBUG_LOCKS").is_some())
}

/// What a client needs from the daemon besides the table: blocks.
pub trait BlockSource: Send + Sync {
    /// Blocks for this party's allocator (now owned by it), about `want` of them.
    fn grant(&self, want: u64) -> Result<Vec<(u64, u64)>>;
    /// Give blocks back to the daemon (they must be owned by this party and unused).
    fn give_back(&self, runs: &[(u64, u64)]);
}

/// One party's handle on the table: what the core calls.
pub struct Party {
    table: Arc<Table>,
    id: u32,
    source: Option<Arc<dyn BlockSource>>,
    /// Inode lock acquisitions of this party that had to sleep (another party
    /// held the lock past the spin).
    lock_waits: std::sync::atomic::AtomicU64,
}

impl Party {
    /// The daemon's handle.
    pub fn daemon(table: Arc<Table>) -> Party {
        Party { table, id: DAEMON, source: None, lock_waits: Default::default() }
    }

    /// A client's handle (`id` from [`Table::claim_party`]).
    pub fn client(table: Arc<Table>, id: u32, source: Arc<dyn BlockSource>) -> Party {
        assert!(id != DAEMON && id < MAX_PARTIES);
        Party { table, id, source: Some(source), lock_waits: Default::default() }
    }

    /// The table.
    pub fn table(&self) -> &Arc<Table> {
        &self.table
    }

    /// This party's number.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// A client (no namespace operations, no allocator of its own)?
    pub fn is_client(&self) -> bool {
        self.id != DAEMON
    }

    /// May this party still commit? Clients: still active and the daemon alive.
    #[inline]
    pub fn check(&self) -> Result<()> {
        if self.id == DAEMON || self.table.may_commit(self.id) {
            return Ok(());
        }
        self.check_failed()
    }

    #[cold]
    fn check_failed(&self) -> Result<()> {
        if self.table.party_state(self.id) != P_ACTIVE {
            return Err(Error::Disconnected("direct access was revoked by the daemon".into()));
        }
        if !self.table.daemon_alive() {
            return Err(Error::Disconnected("the mount daemon is gone".into()));
        }
        Ok(())
    }

    /// With lock tracing on (`debug_locks`), say who takes or drops `ino`'s lock.
    fn trace_lock(&self, what: &str, ino: u64) {
        if debug_locks() {
            eprintln!(
                "{what} {} ino {ino} by party {} thread {:?}",
                std::process::id(),
                self.id,
                std::thread::current().id()
            );
        }
    }

    /// Take `ino`'s write lock (then check this party may still commit).
    pub fn lock(&self, ino: u64) -> Result<()> {
        self.trace_lock("lock", ino);
        self.table.lock(ino, self.id, None, &|slept| {
            if slept == 1 {
                self.lock_waits.fetch_add(1, Ordering::Relaxed);
            }
            if slept == LONG_WAIT {
                self.report_wait(&format!("inode {ino}"), self.table.holder(ino));
            }
            self.check()
        })?;
        if let Err(e) = self.check() {
            self.table.unlock(ino, self.id);
            return Err(e);
        }
        if self.id != DAEMON {
            self.table.mark_dirty(ino, self.id);
        }
        Ok(())
    }

    /// Inode lock acquisitions of this party that slept (waited for another party,
    /// a client's lease included).
    pub fn lock_waits(&self) -> u64 {
        self.lock_waits.load(Ordering::Relaxed)
    }

    /// Say who keeps this party waiting (once per long wait: a stopped process
    /// holding a lock is a reason a user can act on).
    pub fn report_wait(&self, what: &str, holder: Option<u32>) {
        if let Some(h) = holder {
            eprintln!(
                "ferrite: pid {} has waited {} s for {what}, held by pid {} (party {h})",
                std::process::id(),
                (WAIT_SLICE * LONG_WAIT).as_secs(),
                self.table.party_pid(h),
            );
        }
    }

    /// Release `ino`'s write lock.
    pub fn unlock(&self, ino: u64) {
        self.trace_lock("unlock", ino);
        self.table.unlock(ino, self.id);
    }

    /// Blocks `[start, start + len)` are about to be freed into this party's
    /// allocator: record that it owns them.
    pub fn own(&self, start: u64, len: u64) {
        self.table.set_owner(start, len, self.id);
    }

    /// New blocks from the daemon.
    pub fn grant(&self, want: u64) -> Result<Vec<(u64, u64)>> {
        match &self.source {
            Some(s) => s.grant(want),
            None => Err(Error::NoSpace),
        }
    }

    /// Return surplus blocks to the daemon.
    pub fn give_back(&self, runs: &[(u64, u64)]) {
        if let Some(s) = &self.source {
            s.give_back(runs);
        }
    }

    /// Publish how many blocks this party's allocator holds.
    pub fn publish_pool(&self, n: u64) {
        self.table.set_party_pool(self.id, n);
    }

    /// Must `ino` be written through the kernel (page-cache users exist)?
    pub fn no_direct(&self, ino: u64) -> bool {
        self.table.flags(ino) & (NO_DIRECT | MAPPED) != 0
    }

    /// Does a client hold `ino` open for writing ([`WRITERS`])?
    pub fn writers_open(&self, ino: u64) -> bool {
        self.table.flags(ino) & WRITERS != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Arc<Table> {
        Arc::new(Table::create(Box::new(HeapRegion::new(16, 64)), 16, 64, &[7; 16]))
    }

    struct NoBlocks;
    impl BlockSource for NoBlocks {
        fn grant(&self, _: u64) -> Result<Vec<(u64, u64)>> {
            Err(Error::NoSpace)
        }
        fn give_back(&self, _: &[(u64, u64)]) {}
    }

    /// The daemon's count of freed inodes starts at 0, carries into its high word,
    /// and reads as unknown (None) while a change is in progress, so that a client
    /// never trusts a count the daemon is writing.
    #[test]
    fn the_freed_inode_count_counts_carries_and_hides_a_change_in_progress() {
        let t = table();
        assert_eq!(t.inode_frees(), Some(0));
        t.bump_inode_frees();
        assert_eq!(t.inode_frees(), Some(1));
        let ws = t.r.words();
        ws[H_FREES].store(u32::MAX, Ordering::Relaxed);
        t.bump_inode_frees();
        assert_eq!(t.inode_frees(), Some(1 << 32));
        ws[H_FREES_SEQ].fetch_add(1, Ordering::Relaxed); // a writer in the middle
        assert_eq!(t.inode_frees(), None);
    }

    /// Threads counting freed inodes at once lose no count, and a reader meanwhile
    /// sees the count only grow.
    #[test]
    fn concurrent_counts_of_freed_inodes_add_up_and_only_grow() {
        let t = table();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut last = 0;
                while !stop.load(Ordering::Acquire) {
                    if let Some(n) = t.inode_frees() {
                        assert!(n >= last, "the count went back from {last} to {n}");
                        last = n;
                    }
                }
            })
        };
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let t = t.clone();
                std::thread::spawn(move || (0..20_000).for_each(|_| t.bump_inode_frees()))
            })
            .collect();
        writers.into_iter().for_each(|w| w.join().unwrap());
        stop.store(true, Ordering::Release);
        reader.join().unwrap();
        assert_eq!(t.inode_frees(), Some(60_000));
    }

    /// An idle lease is taken over at once by another party (lock or try_lock), and
    /// its holder's claim then fails; a claim before that keeps the lock busy.
    #[test]
    fn an_idle_lease_is_taken_over_and_its_holders_claim_fails() {
        let t = table();
        let (p, q) = (t.claim_party(1).unwrap(), t.claim_party(2).unwrap());
        t.lock(3, p, None, &|_| Ok(())).unwrap();
        t.set_idle(3, p);
        assert!(t.claim_lease(3, p), "an untouched lease is the holder's");
        // Busy again: another party must wait (its try fails).
        assert!(!t.try_lock(3, q));
        t.set_idle(3, p);
        // Idle: taken over without waiting (the waiter would sleep forever otherwise).
        t.lock(3, q, None, &|_| Err(Error::Disconnected("waited".into()))).unwrap();
        assert_eq!(t.holder(3), Some(q));
        assert!(!t.claim_lease(3, p), "the lease was taken over");
        assert!(!t.release_if_held(3, p));
        t.unlock(3, q);
        // try_lock takes an idle lease too, but never the party's own.
        t.lock(4, p, None, &|_| Ok(())).unwrap();
        t.set_idle(4, p);
        assert!(!t.try_lock(4, p));
        assert!(t.try_lock(4, q));
        assert!(!t.claim_lease(4, p));
        t.unlock(4, q);
        assert_eq!(t.holder(4), None);
    }

    #[test]
    fn a_party_span_covers_each_mark_and_only_what_it_marked() {
        let t = Arc::new(Table::create(Box::new(HeapRegion::new(64, 1000)), 64, 1000, &[7; 16]));
        let (p, q) = (t.claim_party(1).unwrap(), t.claim_party(2).unwrap());
        // A client that only reads touches nothing.
        assert_eq!(t.touched(p), (None, None));
        t.mark_dirty(9, p);
        assert_eq!(t.touched(p), (Some((9, 9)), None));
        assert!(t.try_lock(30, p));
        t.unlock(30, p);
        t.lock(4, p, None, &|_| Ok(())).unwrap();
        t.set_dax(40, p, true);
        t.set_owner(130, 3, p);
        t.set_owner(700, 1, p);
        assert_eq!(t.touched(p), (Some((4, 40)), Some((128, 704))));
        // The last chunk is clipped to the table; the daemon's marks widen nothing.
        t.set_owner(999, 1, p);
        t.set_owner(5, 1, DAEMON);
        t.lock(50, DAEMON, None, &|_| Ok(())).unwrap();
        assert_eq!(t.touched(p), (Some((4, 40)), Some((128, 1000))));
        assert_eq!(t.touched(q), (None, None));
        // A freed and claimed again slot starts empty.
        t.clear_span(p);
        t.set_party_state(p, P_FREE);
        assert_eq!(t.claim_party(3), Some(p));
        assert_eq!(t.touched(p), (None, None));
    }

    #[test]
    fn lock_excludes_and_wakes_across_parties() {
        let t = table();
        t.alive_word().store(1, Ordering::Release);
        let p = t.claim_party(42).unwrap();
        let c = Party::client(t.clone(), p, Arc::new(NoBlocks));
        let d = Party::daemon(t.clone());
        d.lock(3).unwrap();
        assert_eq!(t.holder(3), Some(DAEMON));
        let h = std::thread::spawn(move || {
            c.lock(3).unwrap();
            let held = c.table().holder(3);
            c.unlock(3);
            held
        });
        std::thread::sleep(Duration::from_millis(30));
        d.unlock(3);
        assert_eq!(h.join().unwrap(), Some(p));
        assert!(t.is_dirty(3, p));
        assert_eq!(t.holder(3), None);
    }

    #[test]
    fn waiter_ends_when_revoked_or_daemon_dies() {
        let t = table();
        t.alive_word().store(1, Ordering::Release);
        let p = t.claim_party(1).unwrap();
        let c = Party::client(t.clone(), p, Arc::new(NoBlocks));
        let d = Party::daemon(t.clone());
        d.lock(2).unwrap();
        let t2 = t.clone();
        let h = std::thread::spawn(move || c.lock(2));
        std::thread::sleep(Duration::from_millis(30));
        // The kernel marks the daemon's robust futex: the waiter gives up.
        t2.alive_word().fetch_or(OWNER_DIED, Ordering::AcqRel);
        assert!(matches!(h.join().unwrap(), Err(Error::Disconnected(_))));
    }

    #[test]
    fn steal_takes_a_dead_partys_lock() {
        let t = table();
        let p = t.claim_party(1).unwrap();
        assert!(t.try_lock(5, p));
        t.lock(5, DAEMON, Some(p), &|_| Ok(())).unwrap();
        assert_eq!(t.holder(5), Some(DAEMON));
        t.unlock(5, DAEMON);
    }

    /// Regression: the inode entries once ignored the journal section and overlapped
    /// the party slots (a client waited forever on a party state it took for a lock).
    #[test]
    fn regions_do_not_overlap() {
        let t = table();
        let base = |w: &AtomicU32| w as *const AtomicU32 as usize;
        let last_journal = base(&t.journal_words(MAX_JOURNALS as u32 - 1)[JOURNAL_WORDS - 1]);
        let first_party = base(&t.party_words(0)[0]);
        let last_party = base(&t.party_words(MAX_PARTIES - 1)[PARTY_WORDS - 1]);
        let first_entry = base(&t.entry(1)[0]);
        let last_entry = base(&t.entry(t.ninodes())[ENTRY_WORDS - 1]);
        let (_, refs) = t.refs();
        let (first_ref, last_ref) = (base(&refs[0]), base(&refs[refs.len() - 1]));
        assert!(last_journal < first_party && last_party < first_entry && last_entry < first_ref);
        let (w, _) = Table::sizes(t.ninodes(), 64);
        assert_eq!(refs.len(), 64, "a count per block");
        assert_eq!((last_ref - base(&t.r.words()[0])) / 4, w - 1, "counts end the word area");
    }

    #[test]
    fn owners_and_runs() {
        let t = table();
        t.set_owner(10, 5, 3);
        t.set_owner(12, 1, 0);
        assert_eq!(t.owned_runs(3, 0, 64), vec![(10, 2), (13, 2)]);
        assert!(Table::open(Box::new(HeapRegion::new(16, 64)), &[7; 16]).is_err());
    }
}
