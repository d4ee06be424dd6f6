//! Lightweight journal for operations that change several inodes at once.
//!
//! Each shard owns a 512-byte journal: a 64-byte header and up to [`MAX_RECORDS`]
//! records `(address, old value, new value)` of 8-byte inode-slot words (log tails,
//! log heads, slot states). Protocol of a transaction:
//!
//! 1. the new log entries of every inode are written beyond their tails and flushed;
//!    the records and the header (`active`, txid, count, checksum) are written and
//!    flushed; **fence**;
//! 2. each word is set to its new value with an 8-byte atomic store and flushed;
//!    **fence** — the operation is now durable;
//! 3. the header is marked inactive. On a shared pool (and for a transaction that
//!    names a slot it also frees) the mark is stored and flushed, no fence: the
//!    locked instructions that release the operation's inode locks wait for the
//!    flush. On a pool this process alone uses it is only stored ([`finish_lazy`]):
//!    it reaches media with the shard's next `begin` or with a [`LazyMarks::settle`].
//!
//! Recovery of an active, checksum-valid journal: if some record's word still holds
//! its *old* value (and old != new) the transaction did not finish step 2: every word
//! that holds its *new* value is set back to its old value, and **fence** before the
//! journal is marked inactive (else a crash could keep "inactive" and lose the
//! rollback). Otherwise it finished and nothing is done. This is sound because a
//! later operation changes a word only after step 2 (inode locks), and while a
//! finished transaction is still active on media no word it names comes back to its
//! old value. Words only move forward but in two ways: a reused slot's new log starts
//! at epoch 0 again, and fast GC frees a dead log page without a new epoch, which the
//! same log may take again. Both free something first (a slot, a log page), and every
//! path that frees one settles the lazy marks — flushes the headers whose mark may be
//! in flight — before the fence that precedes the free, holding the inode's lock (so
//! every mark of a transaction that named the inode is visible to it). A flushed
//! mark is on media once its locks are released. A transaction left active on media
//! across a reuse would be undone over later operations (docs/CONSISTENCY.md, step 6;
//! the crash simulator's `unsettled-journal-mark` fault shows it).

use crate::error::{Error, Result};
use crate::layout::{Geometry, Reader, JOURNAL_SIZE};
use crate::pmem::{persist_u64, Medium};
use std::ops::Not;

/// Records a transaction can hold.
pub const MAX_RECORDS: usize = 18;
const HDR_LEN: u64 = 64;
const REC_LEN: u64 = 24;
const _: () = assert!(HDR_LEN + REC_LEN * MAX_RECORDS as u64 <= JOURNAL_SIZE);

/// One journaled word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// Byte address of the 8-byte word (inside the inode table).
    pub addr: u64,
    /// Value before the transaction.
    pub old: u64,
    /// Value after it.
    pub new: u64,
}

/// Bytes a transaction's checksum covers at most: txid and count words, then the
/// records' words.
const TX_MAX: usize = 16 + MAX_RECORDS * REC_LEN as usize;

/// The checksummed bytes of a transaction in an array of the largest size, and how
/// many of them are used: encoded once per commit, for the checksum and the body.
fn tx_bytes(txid: u64, recs: &[Record]) -> ([u8; TX_MAX], usize) {
    assert!(recs.len() <= MAX_RECORDS, "journal record count");
    let mut b = [0u8; TX_MAX];
    b[..8].copy_from_slice(&txid.to_le_bytes());
    b[8..16].copy_from_slice(&(recs.len() as u64).to_le_bytes());
    let mut k = 16;
    for r in recs {
        for v in [r.addr, r.old, r.new] {
            b[k..k + 8].copy_from_slice(&v.to_le_bytes());
            k += 8;
        }
    }
    (b, k)
}

fn csum(txid: u64, recs: &[Record]) -> u32 {
    let (b, n) = tx_bytes(txid, recs);
    crate::pmem::crc32c_append(0, &b[..n])
}

/// Header words: state (txid << 1 | active), count, checksum.
fn encode_header(txid: u64, active: bool, count: usize, sum: u32) -> [u8; 24] {
    let mut h = [0u8; 24];
    h[0..8].copy_from_slice(&((txid << 1) | active as u64).to_le_bytes());
    h[8..16].copy_from_slice(&(count as u64).to_le_bytes());
    h[16..20].copy_from_slice(&sum.to_le_bytes());
    h
}

/// The journal copies of shard `shard`: the primary, then the replica (pools with
/// metadata replicas). Both always hold the same bytes except during a step, or
/// after a crash inside one.
fn copies(geo: &Geometry, shard: u32) -> impl Iterator<Item = u64> {
    geo.journal_offs(shard).into_iter().flatten()
}

/// Step 1: write the records and the active header to every copy (flushed; the
/// caller fences).
pub fn begin<M: Medium + ?Sized>(m: &M, geo: &Geometry, shard: u32, txid: u64, recs: &[Record]) {
    assert!(!recs.is_empty() && recs.len() <= MAX_RECORDS, "journal record count");
    debug_assert!(recs.iter().all(|r| geo.is_slot_word(r.addr)), "record outside the inode table");
    // The records are encoded once, for the checksum and the body.
    let (tx, n) = tx_bytes(txid, recs);
    let body = &tx[16..n];
    let h = encode_header(txid, true, recs.len(), crate::pmem::crc32c_append(0, &tx[..n]));
    for base in copies(geo, shard) {
        m.write(base + HDR_LEN, body);
        m.flush(base + HDR_LEN, body.len() as u64);
        m.write(base, &h);
        m.flush(base, h.len() as u64);
    }
}

/// Step 2: apply the new values, then bring the touched slots' replicas in step
/// (flushed; the caller fences).
pub fn apply<M: Medium + ?Sized>(m: &M, geo: &Geometry, recs: &[Record]) {
    use crate::layout::REPLICA_COVERED;
    // The bytes each replica copies are read before the words are stored, and the
    // new words patched into the copy: read back right after its word's store and
    // flush, a primary stalled the commit there (perf put 7% of a create's samples
    // on that load; alternating runs of a create probe: 2,159 -> 1,986 ns).
    let mut slots: smallvec::SmallVec<[(u64, [u8; REPLICA_COVERED]); MAX_RECORDS]> =
        smallvec::SmallVec::new();
    for r in recs {
        let ino = geo.slot_word_ino(r.addr);
        if geo.slot_replica_off(ino).is_some() && slots.iter().all(|s| s.0 != ino) {
            let mut p = [0u8; REPLICA_COVERED];
            m.read(geo.slot_off(ino), &mut p);
            slots.push((ino, p));
        }
    }
    for r in recs {
        persist_u64(m, r.addr, r.new);
        if let Some((ino, p)) = slots.iter_mut().find(|s| s.0 == geo.slot_word_ino(r.addr)) {
            let at = (r.addr - geo.slot_off(*ino)) as usize;
            if let Some(w) = p.get_mut(at..at + 8) {
                w.copy_from_slice(&r.new.to_le_bytes());
            }
        }
    }
    for (ino, p) in &slots {
        crate::replica::write_replica(m, geo, *ino, p);
    }
}

/// The replicas of the slots `recs` name, rewritten from their primaries.
fn sync_slots<M: Medium + ?Sized>(m: &M, geo: &Geometry, recs: &[Record]) {
    for (k, r) in recs.iter().enumerate() {
        let ino = geo.slot_word_ino(r.addr);
        if recs[..k].iter().all(|x| geo.slot_word_ino(x.addr) != ino) {
            crate::replica::sync_slot(m, geo, ino);
        }
    }
}

/// Step 3 of a shared pool: mark every copy inactive (flushed, not fenced: see the
/// module comment; `the_inactive_mark_is_on_media_after_the_next_fence` pins the
/// flush).
pub fn finish<M: Medium + ?Sized>(m: &M, geo: &Geometry, shard: u32, txid: u64) {
    for base in copies(geo, shard) {
        persist_u64(m, base, txid << 1);
    }
}

/// Step 3 of a pool this process alone uses: mark every copy inactive with a plain
/// store, neither flushed nor fenced. The mark reaches media with the shard's next
/// `begin` (which rewrites the header) or with a [`LazyMarks::settle`] before any
/// word of the transaction can come back to an old value; until then recovery
/// finds the transaction active and finished (no word holds its old value).
pub fn finish_lazy<M: Medium + ?Sized>(m: &M, geo: &Geometry, shard: u32, txid: u64) {
    for base in copies(geo, shard) {
        m.store_u64(base, txid << 1);
    }
}

/// Which shards' last transaction was marked inactive by [`finish_lazy`] and may
/// not have its mark on media (DRAM only).
///
/// Invariants: `stored` is the id of the shard's last lazily finished transaction,
/// set by the journal's holder before it lets the journal and the operation's inode
/// locks go; `durable` only grows and never passes a mark that some thread flushed
/// and fenced (or that a later `begin` of the shard overwrote and fenced). A word a
/// transaction names can come back to an old value only when a log page or an
/// inode slot is freed (module comment); each such path calls
/// [`LazyMarks::settle`] before the fence that precedes the free, holding the
/// locks of the inode it frees from, so every mark of a transaction that named
/// that inode is visible to it.
pub(crate) struct LazyMarks {
    shards: Box<[Mark]>,
}

/// One shard's marks, on a line of its own (the holder stores, GC reads).
#[repr(align(64))]
#[derive(Default)]
struct Mark {
    stored: std::sync::atomic::AtomicU64,
    durable: std::sync::atomic::AtomicU64,
}

/// Marks [`LazyMarks::settle`] flushed: `(shard, txid)`, durable after the
/// caller's next fence ([`LazyMarks::settled`]).
pub(crate) type Settling = smallvec::SmallVec<[(u32, u64); 2]>;

impl LazyMarks {
    /// No lazy mark in any of `nshards` shards.
    pub fn new(nshards: u32) -> LazyMarks {
        LazyMarks { shards: (0..nshards).map(|_| Mark::default()).collect() }
    }

    /// Shard `shard`'s transaction `txid` was finished by [`finish_lazy`] (called
    /// by the journal's holder, right after it).
    pub fn stored(&self, shard: u32, txid: u64) {
        use std::sync::atomic::Ordering;
        let k = &self.shards[shard as usize];
        debug_assert!(txid > k.stored.load(Ordering::Relaxed), "txids only grow");
        k.stored.store(txid, Ordering::Release);
    }

    /// Flush the header of every shard whose last lazy mark may not be on media
    /// (but `skip`'s, whose header the caller's own `begin` rewrites before its
    /// fence). The caller fences, then passes the result to [`LazyMarks::settled`].
    pub fn settle<M: Medium + ?Sized>(&self, m: &M, geo: &Geometry, skip: Option<u32>) -> Settling {
        use std::sync::atomic::Ordering;
        let mut out = Settling::new();
        for (s, k) in self.shards.iter().enumerate() {
            let s = s as u32;
            let stored = k.stored.load(Ordering::Acquire);
            if Some(s) == skip || stored <= k.durable.load(Ordering::Acquire) {
                continue;
            }
            // A flush writes the line back whole, with the mark another thread
            // stored: this thread's fence then makes it durable.
            for base in copies(geo, s) {
                m.flush(base, 8);
            }
            out.push((s, stored));
        }
        out
    }

    /// The caller fenced after [`LazyMarks::settle`]: those marks are durable.
    pub fn settled(&self, done: &Settling) {
        use std::sync::atomic::Ordering;
        for &(s, txid) in done {
            self.shards[s as usize].durable.fetch_max(txid, Ordering::Release);
        }
    }
}

/// Rewrite shard `shard`'s journal copies as idle with no records (txid kept):
/// the words after the state first, then the state (flushed; the caller fences).
/// Only for a journal with no transaction to undo.
pub fn reset<M: Medium + ?Sized>(m: &M, geo: &Geometry, shard: u32, txid: u64) {
    let zero = [0u8; JOURNAL_SIZE as usize - 8];
    for base in copies(geo, shard) {
        m.write(base + 8, &zero);
        m.flush(base + 8, zero.len() as u64);
    }
    finish(m, geo, shard, txid);
}

/// Copy the journal at `from` over the one at `to` (flushed; the caller fences).
/// For repair: a well-formed idle copy replaces a damaged one.
fn copy_over<M: Medium + ?Sized>(m: &M, from: u64, to: u64) {
    let mut b = [0u8; JOURNAL_SIZE as usize];
    m.read(from, &mut b);
    m.write(to, &b);
    m.flush(to, JOURNAL_SIZE);
}

/// Is shard `shard`'s journal well formed? `None` if so, else what is wrong. An
/// idle journal is all zero after its state word (never used, or reset) or holds
/// the checksum-valid records of its last transaction; bytes 20..64 are zero; an
/// active one (`allow_active`: a crashed pool) may be a begin torn before its fence.
/// With replicas, each copy must be well formed and, on a pool with no transaction
/// in flight (`!allow_active`), both copies must hold the same bytes.
pub fn check<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    shard: u32,
    allow_active: bool,
) -> Option<String> {
    let offs: Vec<u64> = copies(geo, shard).collect();
    for (k, &base) in offs.iter().enumerate() {
        if let Some(w) = check_copy(m, base, geo, allow_active) {
            return Some(if offs.len() > 1 { format!("copy {k}: {w}") } else { w });
        }
    }
    if let [a, b] = offs[..] {
        if !allow_active && raw(m, a) != raw(m, b) {
            return Some("the replica differs from the primary".into());
        }
    }
    None
}

fn raw<M: Medium + ?Sized>(m: &M, base: u64) -> [u8; JOURNAL_SIZE as usize] {
    let mut b = [0u8; JOURNAL_SIZE as usize];
    m.read(base, &mut b);
    b
}

/// One copy's check (see [`check`]).
fn check_copy<M: Medium + ?Sized>(
    m: &M,
    base: u64,
    geo: &Geometry,
    allow_active: bool,
) -> Option<String> {
    let b = raw(m, base);
    let mut r = Reader::new(&b);
    let state = r.u64();
    let count = r.u64();
    let sum = r.u32();
    let (txid, active) = (state >> 1, state & 1 == 1);
    if active && !allow_active {
        return Some("a transaction is active on a cleanly unmounted pool".into());
    }
    if b[20..HDR_LEN as usize].iter().any(|&x| x != 0) {
        return Some("header padding (bytes 20..64) is not zero".into());
    }
    if count == 0 {
        if b[8..].iter().any(|&x| x != 0) {
            return Some("no records, but bytes after the state word are not zero".into());
        }
        return None;
    }
    if count > MAX_RECORDS as u64 {
        return Some(format!("record count {count} (at most {MAX_RECORDS})"));
    }
    let mut rr = Reader::new(&b[HDR_LEN as usize..]);
    let recs: Vec<Record> =
        (0..count).map(|_| Record { addr: rr.u64(), old: rr.u64(), new: rr.u64() }).collect();
    if csum(txid, &recs) != sum {
        if active {
            return None; // a begin torn before its fence: recovery clears it
        }
        return Some(format!("checksum mismatch over {count} record(s) of txid {txid}"));
    }
    if let Some(x) = recs.iter().find(|x| !geo.is_slot_word(x.addr)) {
        return Some(format!("record names {:#x}, outside the inode table", x.addr));
    }
    None
}

/// Can [`repair`] fix shard `shard`'s journal on a cleanly unmounted pool? Yes
/// when one copy is well formed and idle (it replaces the other), or when no copy
/// is active (both are reset: idle records are history); an active transaction
/// with no good copy may hold words to undo.
pub fn repairable<M: Medium + ?Sized>(m: &M, geo: &Geometry, shard: u32) -> bool {
    let offs: Vec<u64> = copies(geo, shard).collect();
    offs.iter().any(|&b| check_copy(m, b, geo, false).is_none())
        || offs.iter().all(|&b| read_copy(m, b).1.not())
}

/// Repair shard `shard`'s journal copies on a pool with no transaction in flight
/// (`fsck --repair`): a damaged copy is replaced by the other when that one is
/// well formed and idle, else both are reset. Returns what was done (flushed; the
/// caller fences), `None` when nothing was wrong or nothing can be done safely
/// ([`repairable`]).
pub fn repair<M: Medium + ?Sized>(m: &M, geo: &Geometry, shard: u32) -> Option<String> {
    let w = check(m, geo, shard, false)?;
    if !repairable(m, geo, shard) {
        return None;
    }
    let offs: Vec<u64> = copies(geo, shard).collect();
    let good: Vec<bool> = offs.iter().map(|&b| check_copy(m, b, geo, false).is_none()).collect();
    if let ([a, b], [ga, gb]) = (&offs[..], &good[..]) {
        if *ga {
            copy_over(m, *a, *b);
            return Some(format!(
                "journal of shard {shard}: replica rewritten from the primary ({w})"
            ));
        }
        if *gb {
            copy_over(m, *b, *a);
            return Some(format!(
                "journal of shard {shard}: primary rewritten from the replica ({w})"
            ));
        }
    }
    let (txid, _, _) = read(m, geo, shard);
    reset(m, geo, shard, txid);
    Some(format!("journal of shard {shard} reset ({w})"))
}

/// What recovery did with one shard's journal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum JournalOutcome {
    /// Nothing active.
    Idle,
    /// An active transaction had finished: nothing to undo.
    Finished,
    /// An unfinished transaction was rolled back.
    RolledBack,
    /// The header was active but its checksum did not match: a transaction that
    /// never reached its first fence (nothing of it was applied).
    TornBegin,
}

/// Read one copy: (txid, active, records if active and checksum-valid).
fn read_copy<M: Medium + ?Sized>(m: &M, base: u64) -> (u64, bool, Option<Vec<Record>>) {
    let mut h = [0u8; 24];
    m.read(base, &mut h);
    let mut r = Reader::new(&h);
    let state = r.u64();
    let count = r.u64();
    let sum = r.u32();
    let (txid, active) = (state >> 1, state & 1 == 1);
    if !active || count == 0 || count > MAX_RECORDS as u64 {
        return (txid, active, None);
    }
    let mut body = vec![0u8; (count * REC_LEN) as usize];
    m.read(base + HDR_LEN, &mut body);
    let mut rr = Reader::new(&body);
    let recs: Vec<Record> =
        (0..count).map(|_| Record { addr: rr.u64(), old: rr.u64(), new: rr.u64() }).collect();
    if csum(txid, &recs) != sum {
        return (txid, active, None);
    }
    (txid, active, Some(recs))
}

/// Read shard `s`'s journal: (the highest txid of its copies, whether a copy is
/// active, the records of a checksum-valid active copy).
pub fn read<M: Medium + ?Sized>(
    m: &M,
    geo: &Geometry,
    shard: u32,
) -> (u64, bool, Option<Vec<Record>>) {
    let mut out = (0, false, None);
    for base in copies(geo, shard) {
        let (t, a, r) = read_copy(m, base);
        out.0 = out.0.max(t);
        out.1 |= a;
        if out.2.is_none() {
            out.2 = r;
        }
    }
    out
}

/// Recover shard `s`'s journal (see the module comment). Stores are flushed; the
/// caller fences once for all shards. With replicas, every checksum-valid active
/// copy is a transaction that was begun (a damaged or torn copy is outvoted by
/// the other), recovered oldest first; the copies end idle and identical.
pub fn recover<M: Medium + ?Sized>(m: &M, geo: &Geometry, shard: u32) -> Result<JournalOutcome> {
    let offs: Vec<u64> = copies(geo, shard).collect();
    let read: Vec<_> = offs.iter().map(|&b| read_copy(m, b)).collect();
    let top = read.iter().map(|r| r.0).max().unwrap_or(0);
    let mut txs: Vec<(u64, Vec<Record>)> = Vec::new();
    for (t, _, r) in &read {
        if let Some(recs) = r {
            if !txs.iter().any(|(x, xr)| x == t && xr == recs) {
                txs.push((*t, recs.clone()));
            }
        }
    }
    txs.sort_by_key(|(t, _)| *t);
    let mut outcome =
        if read.iter().any(|r| r.1) { JournalOutcome::TornBegin } else { JournalOutcome::Idle };
    for (_, recs) in &txs {
        if let Some(r) = recs.iter().find(|r| !geo.is_slot_word(r.addr)) {
            return Err(Error::corrupt(format!(
                "journal of shard {shard} names address {:#x} outside the inode table",
                r.addr
            )));
        }
    }
    for (_, recs) in &txs {
        let unfinished = recs.iter().any(|r| r.old != r.new && m.load_u64(r.addr) == r.old);
        if unfinished {
            for r in recs {
                if m.load_u64(r.addr) == r.new {
                    persist_u64(m, r.addr, r.old);
                }
            }
            sync_slots(m, geo, recs);
            // The rollback must be durable before the journal stops asking for it: a
            // crash that persisted "inactive" but not the old values would leave the
            // transaction half applied with nothing left to undo it.
            m.fence();
            outcome = JournalOutcome::RolledBack;
        } else {
            // Finished, but the replicas of its slots may not have reached media
            // with the words themselves (they share the apply's fence window).
            // Durable before the journal stops naming the slots: otherwise a crash
            // could keep "inactive" and a stale replica that a later recovery would
            // take for the slot (found by the simulator, crashing recovery).
            sync_slots(m, geo, recs);
            m.fence();
            if outcome != JournalOutcome::RolledBack {
                outcome = JournalOutcome::Finished;
            }
        }
    }
    if outcome != JournalOutcome::Idle {
        finish(m, geo, shard, top);
    }
    // A begin torn before its fence leaves words that do not checksum (idle or
    // active), and a crash between the copies' writes leaves them different:
    // cleared, so that a checker can tell damage from history.
    let torn = outcome == JournalOutcome::TornBegin
        || offs.iter().any(|&b| check_copy(m, b, geo, false).is_some())
        || offs.windows(2).any(|w| raw(m, w[0]) != raw(m, w[1]));
    if torn {
        reset(m, geo, shard, top);
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::BLOCK;
    use crate::sim::SimMedium;

    /// The bytes `begin` leaves are those of docs/FORMAT.md's journal table, built
    /// here field by field (the encoder was rewritten to encode once; the format
    /// must not move with it).
    #[test]
    fn begin_writes_the_documented_bytes() {
        let g = Geometry::compute(256, 2, 64).unwrap();
        let m = SimMedium::new(256 * BLOCK);
        let recs = [
            Record { addr: g.slot_off(1) + 16, old: 0x1111, new: 0x2222 },
            Record { addr: g.slot_off(2), old: 3, new: 4 },
        ];
        let txid = 0x0123_4567_89ab;
        begin(&m, &g, 1, txid, &recs);
        let base = g.journal_offs(1)[0].expect("primary journal");
        let mut got = [0u8; JOURNAL_SIZE as usize];
        m.read(base, &mut got);
        let mut want = [0u8; JOURNAL_SIZE as usize];
        let mut summed = Vec::new();
        summed.extend_from_slice(&txid.to_le_bytes());
        summed.extend_from_slice(&2u64.to_le_bytes());
        for (k, r) in recs.iter().enumerate() {
            for (j, v) in [r.addr, r.old, r.new].into_iter().enumerate() {
                let at = 64 + 24 * k + 8 * j;
                want[at..at + 8].copy_from_slice(&v.to_le_bytes());
                summed.extend_from_slice(&v.to_le_bytes());
            }
        }
        want[0..8].copy_from_slice(&(txid << 1 | 1).to_le_bytes());
        want[8..16].copy_from_slice(&2u64.to_le_bytes());
        want[16..20].copy_from_slice(&crc32c::crc32c(&summed).to_le_bytes());
        assert_eq!(got[..], want[..]);
        assert_eq!(csum(txid, &recs), crc32c::crc32c(&summed));
    }

    #[test]
    fn rollback_of_half_applied_tx() {
        let g = Geometry::compute(256, 2, 64).unwrap();
        let m = SimMedium::new(256 * BLOCK);
        let a = g.slot_off(1);
        let b = g.slot_off(2) + 16;
        m.store_u64(a, 10);
        m.store_u64(b, 20);
        let recs = [Record { addr: a, old: 10, new: 11 }, Record { addr: b, old: 20, new: 21 }];
        begin(&m, &g, 1, 7, &recs);
        m.store_u64(a, 11); // only the first applied
        assert_eq!(recover(&m, &g, 1).unwrap(), JournalOutcome::RolledBack);
        assert_eq!((m.load_u64(a), m.load_u64(b)), (10, 20));
        assert_eq!(recover(&m, &g, 1).unwrap(), JournalOutcome::Idle);
    }

    /// The inactive mark must be flushed, not only stored: a test build without the
    /// flush made unlinks faster (docs/BENCHMARKS.md, "Sixth stop") but could leave a
    /// finished transaction active on media until the journal's next use. A reused
    /// slot's log restarts at epoch 0, so one of its words can hold an old record's
    /// value again, and recovery would then undo the finished transaction over later
    /// operations (shown below on the image a crash could leave). Pinned: the mark is
    /// on media after the thread's next fence.
    #[test]
    fn the_inactive_mark_is_on_media_after_the_next_fence() {
        let g = Geometry::compute(256, 2, 64).unwrap();
        let m = SimMedium::new(256 * BLOCK);
        let (tail, state) = (g.slot_off(1) + 16, g.slot_off(2));
        m.store_u64(tail, 0x10);
        m.store_u64(state, 1);
        m.fence();
        // An unlink: the parent's tail moves, the child's slot is freed.
        let recs =
            [Record { addr: tail, old: 0x10, new: 0x20 }, Record { addr: state, old: 1, new: 2 }];
        begin(&m, &g, 0, 1, &recs);
        m.fence();
        apply(&m, &g, &recs);
        m.fence();
        finish(&m, &g, 0, 1);
        m.fence(); // the thread's next operation fences
        let base = g.journal_offs(0)[0].expect("primary journal");
        let durable = m.durable_image();
        let mark = u64::from_le_bytes(durable[base as usize..][..8].try_into().unwrap());
        assert_eq!(mark, 1 << 1, "the inactive mark of txid 1 is durable");
        // What recovery would do with the mark lost, once the parent's slot was reused
        // and its new log's tail reached the old value: undo a finished unlink.
        let stale = SimMedium::from_image(durable.clone());
        begin(&stale, &g, 0, 1, &recs);
        stale.store_u64(tail, 0x10);
        assert_eq!(recover(&stale, &g, 0).unwrap(), JournalOutcome::RolledBack);
        assert_eq!(stale.load_u64(state), 1, "the freed slot in use again");
    }

    /// A lazy mark is not on media after its own thread's fences; another thread's
    /// settle (a flush of the header) and fence put it there, once, and the shard
    /// a settle skips keeps its mark in flight.
    #[test]
    fn a_lazy_mark_is_durable_after_a_settle_and_its_fence() {
        let g = Geometry::compute(256, 2, 64).unwrap();
        let m = SimMedium::new(256 * BLOCK);
        let marks = LazyMarks::new(2);
        let tail = g.slot_off(1) + 16;
        let recs = [Record { addr: tail, old: 0x10, new: 0x20 }];
        let mark_of = |img: &[u8], shard: u32| {
            let base = g.journal_offs(shard)[0].expect("primary journal") as usize;
            u64::from_le_bytes(img[base..][..8].try_into().unwrap())
        };
        for shard in 0..2 {
            begin(&m, &g, shard, 1, &recs);
            m.fence();
            apply(&m, &g, &recs);
            m.fence();
            finish_lazy(&m, &g, shard, 1);
            marks.stored(shard, 1);
        }
        m.fence(); // the thread's next operation
        assert_eq!(mark_of(&m.durable_image(), 0), (1 << 1) | 1, "still active on media");
        let done = std::thread::scope(|s| {
            s.spawn(|| {
                crate::sim::set_sim_thread(7);
                let done = marks.settle(&m, &g, Some(1));
                m.fence();
                marks.settled(&done);
                done
            })
            .join()
            .unwrap()
        });
        assert_eq!(done.as_slice(), &[(0, 1)], "shard 1 was skipped");
        let img = m.durable_image();
        assert_eq!(mark_of(&img, 0), 1 << 1, "the settled mark is durable");
        assert_eq!(mark_of(&img, 1), (1 << 1) | 1, "the skipped one is not");
        assert_eq!(marks.settle(&m, &g, Some(1)).len(), 0, "a settled mark is not flushed again");
        assert_eq!(marks.settle(&m, &g, None).as_slice(), &[(1, 1)]);
    }

    #[test]
    fn finished_tx_left_alone_even_after_later_change() {
        let g = Geometry::compute(256, 2, 64).unwrap();
        let m = SimMedium::new(256 * BLOCK);
        let a = g.slot_off(3);
        let recs = [Record { addr: a, old: 0, new: 5 }];
        begin(&m, &g, 0, 1, &recs);
        apply(&m, &g, &recs);
        m.store_u64(a, 9); // a later single-inode commit
        assert_eq!(recover(&m, &g, 0).unwrap(), JournalOutcome::Finished);
        assert_eq!(m.load_u64(a), 9);
    }
}
