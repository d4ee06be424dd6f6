//! A pool shared with other processes (see `share` for the table): how a party
//! keeps its DRAM indexes true to the logs, and the daemon's side of blocks and of a
//! client's end.
//!
//! Invariants:
//! - A party appends to a shared inode's log only while this process *holds* the
//!   inode's cross-process lock. The hold is per process: the first local writer
//!   takes the lock (and catches the DRAM state up with the log), the last one
//!   releases it; local writers keep their own byte-range locks under it. A hold is
//!   taken before any local `st` lock, never while one is held.
//! - While a process holds the lock, its DRAM state is current: the lock excludes
//!   other writers, the acquisition caught up, and local commits apply themselves.
//! - A reader without the hold first checks that its state is current (the slot's
//!   tail and state word, and the chain generation, equal what the state was built
//!   from); a stale state is caught up under a hold. Data is then copied without any
//!   cross-process lock and the copy is kept only if the inode's free sequence did
//!   not move meanwhile.
//! - Catching up never frees anything: blocks that other parties' commits released
//!   were freed by those parties.
//! - A client keeps an inode's lock after its last local writer is done (a
//!   *lease*, `XHold::leased`) while nobody else waits for it: the next local
//!   writer then needs neither the lock nor a catch-up, since nothing else could
//!   commit meanwhile. Every lease is listed in `Fs::leases` (holding its `Inode`,
//!   so it is never evicted); the client's lease keeper (`Fs::tick_leases`, run
//!   by its watcher thread every `LEASE_TICK`) gives back each lease that another
//!   party waits for or that no local writer used since the previous tick. An idle
//!   lease is marked in the lock word (`share::Table::set_idle`): any other party
//!   takes it over with one CAS instead of waiting for the keeper, so a stopped
//!   client (Ctrl-Z, a debugger) keeps nobody waiting on a lease; the holder claims
//!   it back with a CAS before each use and, if it was taken, locks and catches up
//!   as without a lease. A lease is used only after `Party::check` passes (a
//!   revoked client's leases were taken over by the daemon). Only a client with a
//!   keeper (`Fs::keep_leases`) keeps leases. Lock order: `xh`, then the lease list.
//! - Clients do no namespace operation. Their journaled commits (thorough GC) take
//!   the journal's cross-process lock; a client that dies holding it leaves the
//!   journal to the daemon, which finishes or rolls it back as recovery would.

use crate::alloc::{BlockAlloc, InodeAlloc};
use crate::error::{Error, Result};
use crate::fs::{Fs, GcStats, Inode, MountReport};
use crate::index::InodeState;
use crate::layout::{logptr, BLOCK, MOUNT_STATE_OFF, SLOT_STATE, SLOT_TAIL};
use crate::log;
use crate::pmem::Medium;
use crate::share::{Party, DAEMON, P_ACTIVE, P_FREE, P_REVOKED};
use parking_lot::{Mutex, RwLockReadGuard};
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// First and largest block grant a client asks for.
const GRANT_MIN: u64 = 256;
const GRANT_MAX: u64 = 4096;

/// A process's hold count on one inode's cross-process lock.
#[derive(Default)]
pub(crate) struct XHold {
    count: u32,
    /// A party in another process waits: let the local holders finish, then
    /// compete again for the lock (no starvation by overlapping local writers).
    draining: bool,
    /// The lock is kept with no local holder (a lease; `count` is 0).
    leased: bool,
    /// A local writer used the lease since the keeper's last tick.
    used: bool,
    /// The inode is in `Fs::leases`.
    listed: bool,
}

thread_local! {
    /// The inode whose hold this thread keeps around nested operations
    /// ([`Fs::locked`]), or 0.
    static OUTER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How often a client's lease keeper looks at its leases: the longest another
/// party waits for an idle client's lease, and the shortest idle time after
/// which a lease is given back unasked.
pub const LEASE_TICK: std::time::Duration = std::time::Duration::from_millis(2);

/// A client's leases (see the module comment).
#[derive(Default)]
pub(crate) struct Leases {
    list: Mutex<Vec<Arc<Inode>>>,
    /// Called when a lease is listed while the keeper sleeps.
    waker: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// The keeper sleeps until woken (`Fs::lease_keeper_may_sleep`).
    asleep: AtomicBool,
}

/// This process holds an inode's cross-process lock while this lives.
pub(crate) struct Hold<'a, M: Medium> {
    fs: &'a Fs<M>,
    inode: &'a Arc<Inode>,
    /// A client's operation in progress (dropped after the lock is let go).
    _busy: Option<Busy<'a>>,
}

/// A client's count of operations in progress ([`crate::share::Table::busy`]),
/// taken before it checks that it may still commit, given back when dropped.
pub(crate) struct Busy<'a> {
    party: &'a crate::share::Party,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.party.table().busy_exit(self.party.id());
    }
}

impl<M: Medium> Drop for Hold<'_, M> {
    fn drop(&mut self) {
        let i = self.inode;
        let mut g = i.xh.lock();
        debug_assert!(g.count > 0, "hold count underflow");
        debug_assert!(!g.leased, "a lease while a local writer holds the lock");
        g.count -= 1;
        if g.count == 0 {
            if let Some(p) = &self.fs.share {
                let keep = p.is_client()
                    && self.fs.leases.waker.get().is_some()
                    && !g.draining
                    && !p.table().waiters(i.ino);
                if keep {
                    p.table().set_idle(i.ino, p.id());
                    g.leased = true;
                    g.used = true;
                    if !g.listed {
                        g.listed = true;
                        self.fs.list_lease(i);
                    }
                } else {
                    p.unlock(i.ino);
                }
            }
            if g.draining {
                g.draining = false;
                i.xh_cv.notify_all();
            }
        }
    }
}

/// Blocks for a client party that lives in the daemon's own process (the crash
/// simulator's clients, tests, probes): each grant straight from the daemon's `Fs`, at
/// most `cap` blocks. Runs the daemon refuses to take back stay where they are (fsck
/// then reports them leaked).
pub struct DaemonGrants<M: Medium> {
    /// The daemon's `Fs`.
    pub daemon: Arc<Fs<M>>,
    /// The client's party id.
    pub party: u32,
    /// Largest grant.
    pub cap: u64,
}

impl<M: Medium> crate::share::BlockSource for DaemonGrants<M>
where
    Fs<M>: Send + Sync,
{
    fn grant(&self, want: u64) -> Result<Vec<(u64, u64)>> {
        self.daemon.grant_blocks(self.party, want.min(self.cap))
    }
    fn give_back(&self, runs: &[(u64, u64)]) {
        let _ = self.daemon.take_back(self.party, runs);
    }
}

/// What a client's end gave back to the daemon.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Resolved {
    /// Inodes the party had written or locked, checked again.
    pub inodes: u64,
    /// Blocks it held that went back to the daemon's allocator.
    pub blocks_returned: u64,
    /// Inode entries of the table looked at (the party's span of inodes).
    pub inodes_scanned: u64,
    /// Block owners looked at (the party's span of blocks in the data area).
    pub blocks_scanned: u64,
}

impl<M: Medium> Fs<M> {
    /// The coordination handle, when the pool is shared.
    pub fn party(&self) -> Option<&Arc<Party>> {
        self.share.as_ref()
    }

    /// Is this `Fs` a direct-access client of a mount daemon?
    pub fn is_client(&self) -> bool {
        self.share.as_ref().is_some_and(|p| p.is_client())
    }

    /// Does this process read `i`'s committed tail back at its next operation on
    /// it? It does when it takes the file's cross-process lock anew for each
    /// operation (the daemon, a client that keeps no leases), to see whether
    /// another process committed meanwhile ([`Fs::catch_up`]); a client's lease
    /// kept between its operations needs no look.
    pub(crate) fn rereads_tail(&self, i: &Inode) -> bool {
        i.shared
            && self
                .share
                .as_ref()
                .is_some_and(|p| !p.is_client() || self.leases.waker.get().is_none())
    }

    /// Namespace operations belong to the daemon.
    pub(crate) fn check_namespace(&self) -> Result<()> {
        if self.is_client() {
            return Err(Error::NotSupported("namespace operation in a direct-access client"));
        }
        Ok(())
    }

    /// Take (or join) this process's hold on `i`'s cross-process lock. `None` when
    /// nothing else can write `i` (no sharing, or not a regular file).
    pub(crate) fn hold<'a>(&'a self, i: &'a Arc<Inode>) -> Result<Option<Hold<'a, M>>> {
        let Some(p) = &self.share else { return Ok(None) };
        if !i.shared {
            return Ok(None);
        }
        // Counted before the state checks below, so a daemon that revokes this
        // client meanwhile waits for the operation instead of taking its lock.
        let busy = p.is_client().then(|| {
            p.table().busy_enter(p.id());
            Busy { party: p }
        });
        let mut g = i.xh.lock();
        loop {
            if g.count > 0 && !g.draining && p.table().waiters(i.ino) {
                g.draining = true;
            }
            // A join nested in this thread's own hold (`locked`) must not wait for
            // the drain: the outer hold it would wait for is its own.
            if !g.draining || OUTER.with(|o| o.get()) == i.ino {
                break;
            }
            i.xh_cv.wait(&mut g);
        }
        let lock = || -> Result<()> {
            p.lock(i.ino)?;
            let r = {
                let mut st = i.st.write();
                self.catch_up(i, &mut st)
            };
            if let Err(e) = r {
                p.unlock(i.ino);
                return Err(e);
            }
            Ok(())
        };
        if g.count == 0 && g.leased {
            g.leased = false;
            if self.fault != Some(crate::fs::CoreFault::StaleLease) {
                if let Err(e) = p.check() {
                    // Revoked: the daemon takes (or took) the lock over.
                    p.table().release_if_held(i.ino, p.id());
                    return Err(e);
                }
                if p.table().claim_lease(i.ino, p.id()) {
                    debug_assert!(self.is_fresh(i, &i.st.read()), "a lease's state went stale");
                } else {
                    // Another party took the idle lease over: lock and catch up.
                    lock()?;
                }
            }
        } else if g.count == 0 {
            lock()?;
        }
        g.count += 1;
        Ok(Some(Hold { fs: self, inode: i, _busy: busy }))
    }

    /// Run `f` while this process holds `ino`'s cross-process lock (operations of
    /// `f` on `ino` join the hold). A direct client reads and moves an offset that
    /// other processes share under it, so a `write(2)` stays atomic across them.
    pub fn locked<T>(&self, ino: u64, f: impl FnOnce() -> T) -> Result<T> {
        let i = self.inode(ino)?;
        let _h = self.hold(&i)?;
        struct Outer(u64);
        impl Drop for Outer {
            fn drop(&mut self) {
                OUTER.with(|o| o.set(self.0));
            }
        }
        let _outer = Outer(OUTER.with(|o| o.replace(ino)));
        Ok(f())
    }

    /// List a new lease (under its `xh`; lock order `xh`, then the list).
    fn list_lease(&self, i: &Arc<Inode>) {
        self.leases.list.lock().push(i.clone());
        // After the push (the keeper marks itself asleep, then looks at the list):
        // either it sees this lease or this sees it asleep.
        if self.leases.asleep.swap(false, Ordering::SeqCst) {
            if let Some(w) = self.leases.waker.get() {
                w();
            }
        }
    }

    /// The lease keeper is about to sleep until woken: true (and marked asleep, so
    /// the next listed lease wakes it) when no lease is listed; false when one is
    /// (tick on). A keeper that lingers a while after its last lease before it
    /// sleeps spares a program that writes file after file a wake-up per file.
    pub fn lease_keeper_may_sleep(&self) -> bool {
        self.leases.asleep.store(true, Ordering::SeqCst);
        if self.leases.list.lock().is_empty() {
            return true;
        }
        self.leases.asleep.store(false, Ordering::SeqCst);
        false
    }

    /// Let this client keep leases: the caller promises a keeper that calls
    /// [`Self::tick_leases`] within every [`LEASE_TICK`] unless
    /// [`Self::lease_keeper_may_sleep`] said it may sleep, and then soon after
    /// `wake` is called (when a lease is listed while it sleeps).
    /// Without a keeper no lease is kept. Set once; later calls are ignored.
    pub fn keep_leases(&self, wake: Box<dyn Fn() + Send + Sync>) {
        let _ = self.leases.waker.set(wake);
    }

    /// Give back this client's lease on `ino` now, if it holds one. The preload
    /// library calls it when the program closes a descriptor of the file that
    /// could write, and before the descriptor calls the daemon serves (`futimens`,
    /// `fchmod`, ...): the daemon's next operation on a file just written (the
    /// `utimensat` that `git` issues after closing each file, `cp -a`'s times and
    /// mode) would wait for the keeper's next tick, up to [`LEASE_TICK`]: 2.1 ms
    /// per `utimensat` in a `git clone`. The keeper unlists it on its next tick.
    pub fn give_back_lease(&self, ino: u64) {
        let Some(p) = self.share.as_ref().filter(|p| p.is_client()) else { return };
        let Some(i) = self.cache_shard(ino).read().get(&ino).cloned() else { return };
        let mut g = i.xh.lock();
        if g.leased {
            debug_assert_eq!(g.count, 0, "a lease while a local writer holds the lock");
            g.leased = false;
            p.table().release_if_held(i.ino, p.id());
        }
    }

    /// The lease keeper: give back every lease another party waits for or that no
    /// local writer used since the last tick (with `all`, every lease). Returns
    /// whether leases remain (tick again within [`LEASE_TICK`]).
    pub fn tick_leases(&self, all: bool) -> bool {
        let Some(p) = self.share.as_ref().filter(|p| p.is_client()) else { return false };
        // A revoked client's leases are the daemon's to take over: drop them all.
        let all = all || p.check().is_err();
        let snapshot: Vec<Arc<Inode>> = self.leases.list.lock().clone();
        for i in &snapshot {
            let mut g = i.xh.lock();
            if g.leased && (all || !g.used || p.table().waiters(i.ino)) {
                g.leased = false;
                p.table().release_if_held(i.ino, p.id());
            }
            g.used = false;
            if !g.leased && g.count == 0 && g.listed {
                g.listed = false;
                self.leases.list.lock().retain(|x| !Arc::ptr_eq(x, i));
            }
        }
        !self.leases.list.lock().is_empty()
    }

    /// Does `st` describe the committed log of `i` as it is now?
    fn is_fresh(&self, i: &Inode, st: &InodeState) -> bool {
        let Some(p) = &self.share else { return true };
        let slot = self.geo.slot_off(i.ino);
        self.m.load_u64(slot + SLOT_TAIL) == st.log.tail
            && self.m.load_u64(slot + SLOT_STATE) == i.state_word
            && p.table().chain_gen(i.ino) == st.chain_gen
    }

    /// Bring `st` up to the committed log of `i`. The caller holds the inode's
    /// cross-process lock and `st`'s write lock.
    pub(crate) fn catch_up(&self, i: &Inode, st: &mut InodeState) -> Result<()> {
        self.catch_up_as(i, st, false)
    }

    /// [`Self::catch_up`]; with `replay`, rebuild from the head whatever changed.
    fn catch_up_as(&self, i: &Inode, st: &mut InodeState, replay: bool) -> Result<()> {
        let Some(p) = &self.share else { return Ok(()) };
        let gen = p.table().chain_gen(i.ino);
        if !replay && gen == st.chain_gen {
            // The common case, nobody else committed: two loads, no slot decode.
            let off = self.geo.slot_off(i.ino);
            if self.m.load_u64(off + SLOT_STATE) == i.state_word
                && self.m.load_u64(off + SLOT_TAIL) == st.log.tail
            {
                return Ok(());
            }
        }
        let slot = self.read_slot(i.ino);
        if slot.state != i.state_word || !slot.in_use() {
            return Err(Error::NotFound); // freed (and maybe reused) meanwhile
        }
        if slot.tail == st.log.tail && gen == st.chain_gen && !replay {
            return Ok(());
        }
        let same_chain = !replay
            && gen == st.chain_gen
            && !st.log.pages.is_empty()
            && slot.head == st.log.head
            && logptr::epoch(slot.tail) == logptr::epoch(st.log.tail);
        if same_chain {
            let from = logptr::addr(st.log.tail);
            let next_seq = st.log.next_seq;
            let mut freed = crate::index::Freed::new();
            let w = log::walk_apply_from(
                &self.m,
                &self.geo,
                i.seed,
                from,
                next_seq,
                logptr::addr(slot.tail),
                &mut |loc, e| st.apply(loc, &e, &mut freed),
            )?;
            if w.torn {
                return Err(Error::corrupt(format!(
                    "inode {}: entries after another party's commit do not validate",
                    i.ino
                )));
            }
            // The blocks in `freed` were freed by the party that committed.
            st.log.tail = logptr::make(logptr::epoch(slot.tail), w.end);
            st.log.next_seq = w.next_seq;
            if let Err(pg) = st.log.pages.try_extend(&w.pages[1..]) {
                return Err(Error::corrupt(format!(
                    "inode {}: log page {pg:#x} is linked into the chain twice",
                    i.ino
                )));
            }
        } else {
            let Some((_, fresh, walk)) = self.load_state(i.ino)? else {
                return Err(Error::NotFound);
            };
            if walk.torn {
                return Err(Error::corrupt(format!("inode {}: torn log while shared", i.ino)));
            }
            let check_at = st.gc_check_at;
            *st = fresh;
            st.gc_check_at = st.gc_check_at.max(check_at.min(2 * st.log.pages.len() + 4));
        }
        st.chain_gen = gen;
        Ok(())
    }

    /// Run `f` on `i`'s current state. With `data`, `f` copies data out of the pool
    /// and is repeated until no block was freed under it (see the module comment).
    pub(crate) fn read_fresh<T>(
        &self,
        i: &Arc<Inode>,
        data: bool,
        mut f: impl FnMut(&InodeState) -> T,
    ) -> Result<T> {
        let Some(p) = self.share.as_ref().filter(|_| i.shared) else {
            let st = i.st.read();
            return Ok(f(&st));
        };
        p.check()?;
        let t = p.table();
        for attempt in 0..64 {
            let s1 = t.free_seq(i.ino);
            let st: RwLockReadGuard<'_, InodeState> = i.st.read();
            if !self.is_fresh(i, &st) {
                drop(st);
                let _h = self.hold(i)?;
                continue;
            }
            let v = f(&st);
            if !data {
                return Ok(v);
            }
            fence(Ordering::Acquire);
            if t.free_seq(i.ino) == s1 {
                return Ok(v);
            }
            if attempt >= 8 {
                // Writers keep freeing under us: read under the hold, where nothing
                // of this inode can be freed.
                drop(st);
                let _h = self.hold(i)?;
                let st = i.st.read();
                return Ok(f(&st));
            }
        }
        Err(Error::Busy)
    }

    /// Before anything `ino` referenced is freed (see `share`).
    pub(crate) fn note_free(&self, ino: u64) {
        if let Some(p) = &self.share {
            p.table().bump_free_seq(ino);
        }
    }

    /// Log pages are about to leave `ino`'s chain; returns the new generation.
    pub(crate) fn note_chain_change(&self, ino: u64) -> u32 {
        match &self.share {
            Some(p) => p.table().bump_chain_gen(ino),
            None => 0,
        }
    }

    /// Map the pages of granted blocks `[b, b + n)` that this process has not
    /// touched: one call maps a run, where each first store would take a page
    /// fault. Blocks it had before (given back and granted again) are skipped: a
    /// populate walked their page tables again for nothing (4 KiB appends + fsync
    /// through the preload library into blocks granted before: medians about 1,070
    /// -> 820 ns, four alternating pairs).
    fn populate_new(&self, b: u64, n: u64) {
        let fresh = |x| self.populated.as_ref().is_some_and(|p| p.claim(x));
        crate::alloc::runs_where(b, b + n, fresh, |s, k| self.m.populate(s * BLOCK, k * BLOCK));
    }

    /// A client's allocator is dry: ask the daemon for at least `need` blocks.
    pub(crate) fn refill(&self, need: u64) -> Result<()> {
        let p = self.share.as_ref().expect("refill on a client");
        let size = self.grant_size.load(Ordering::Relaxed).max(GRANT_MIN);
        let runs = p.grant(need.max(size))?;
        for &(b, n) in &runs {
            // Owned by us already (the daemon marked them).
            self.poison_on(self.balloc.free(b, n));
            self.populate_new(b, n);
        }
        self.grant_size.store((size * 2).min(GRANT_MAX), Ordering::Relaxed);
        p.publish_pool(self.balloc.free_blocks());
        if self.balloc.free_blocks() < need {
            return Err(Error::NoSpace);
        }
        Ok(())
    }

    /// After blocks went back to this party's allocator: a client returns what it
    /// does not need to the daemon.
    pub(crate) fn after_free(&self) {
        let Some(p) = self.share.as_ref().filter(|p| p.is_client()) else { return };
        let free = self.balloc.free_blocks();
        if free > 4 * GRANT_MAX {
            if let Ok(runs) = self.balloc.alloc(0, free - 2 * GRANT_MAX, true) {
                p.give_back(&runs);
            }
        }
        p.publish_pool(self.balloc.free_blocks());
    }

    // ------------------------------------------------------------ clients

    /// Open a pool as a direct-access client of the daemon that mounted it: no
    /// recovery (the daemon did it), an empty allocator (blocks come from grants).
    pub fn attach(m: M, party: Arc<Party>) -> Result<Fs<M>> {
        assert!(party.is_client(), "attach needs a client party");
        let (sb, copy) = crate::recovery::read_superblock(&m)?;
        let geo = sb.geometry();
        let state = m.load_u64(MOUNT_STATE_OFF);
        if state & crate::layout::STATE_CLEAN != 0 {
            return Err(Error::Disconnected("the pool is not mounted".into()));
        }
        party.check()?;
        let verified = crate::verify::Verified::new(geo.nblocks);
        let fs = Fs {
            balloc: BlockAlloc::empty(&geo),
            ialloc: InodeAlloc::full(&geo),
            m,
            sb,
            geo,
            cache: Fs::<M>::new_cache(),
            txids: Vec::new(),
            marks: crate::journal::LazyMarks::new(0),
            rename_lock: crate::locks::StepMutex::new(()),
            read_only: false,
            fault: None,
            generation: state >> 2,
            report: MountReport { superblock_copy: copy, ..Default::default() },
            unmounted: AtomicBool::new(false),
            gc_stats: GcStats::default(),
            share: Some(party),
            grant_size: AtomicU64::new(GRANT_MIN),
            populated: Some(crate::alloc::AtomicBitmap::new(geo.nblocks)),
            leases: Default::default(),
            poisoned: Default::default(),
            atime: Default::default(),
            time_floor: Default::default(),
            id: crate::fs::next_fs_id(),
            inode_frees: AtomicU64::new(0),
            verify: Default::default(),
            verified,
            atomics: Default::default(),
            pbufs: Default::default(),
            topo: crate::numa::Topology::detect(),
            refs: Default::default(),
        };
        fs.group_shards();
        Ok(fs)
    }

    /// A client's orderly end: its free blocks go back to the daemon.
    pub fn detach(self) -> M {
        self.pbuf_free_all();
        self.tick_leases(true);
        if let Some(p) = self.share.as_ref().filter(|p| p.is_client()) {
            let free = self.balloc.free_blocks();
            if free > 0 {
                if let Ok(runs) = self.balloc.alloc(0, free, true) {
                    p.give_back(&runs);
                }
            }
            p.publish_pool(0);
        }
        let Fs { m, .. } = self;
        m
    }

    // ------------------------------------------------------------- daemon

    /// Share this mounted pool with direct-access clients through `party` (the
    /// daemon's handle on a table made for this pool).
    pub fn share_with(mut self, party: Arc<Party>) -> Fs<M> {
        assert!(!party.is_client() && party.table().ninodes() == self.geo.ninodes);
        assert!(self.geo.nshards as usize <= crate::share::MAX_JOURNALS);
        assert!(self.cache.iter().all(|c| c.read().is_empty() || c.read().len() <= 1));
        // Cached inodes (the root after mount) were loaded before sharing; drop them.
        for c in &self.cache {
            c.write().clear();
        }
        for (shard, txid) in self.txids.iter().enumerate() {
            party.table().set_txid(shard as u32, *txid.lock());
        }
        // From now on marks are flushed at each commit; the lazy ones of this
        // process's own commits so far reach media first.
        self.fence_settled();
        // The counts of shared blocks move into the table, where clients see them.
        let list = self.shared_blocks();
        self.share = Some(party);
        self.load_refs(&list);
        self.publish_free();
        self
    }

    fn publish_free(&self) {
        if let Some(p) = &self.share {
            p.table().set_global_free(self.balloc.free_blocks());
        }
    }

    /// Blocks for client `party`: about `want` (fewer when space is short).
    pub fn grant_blocks(&self, party: u32, want: u64) -> Result<Vec<(u64, u64)>> {
        let p = self.share.as_ref().ok_or(Error::NotSupported("pool not shared"))?;
        if party == DAEMON || p.table().party_state(party) != P_ACTIVE {
            return Err(Error::invalid("grant to a party that is not an active client"));
        }
        let avail = self.balloc.free_blocks().saturating_sub(self.balloc.reserve());
        let n = want.clamp(1, GRANT_MAX * 4).min(avail);
        if n == 0 {
            return Err(Error::NoSpace);
        }
        let runs = self.balloc.alloc(self.shard(), n, false)?;
        for &(b, len) in &runs {
            p.table().set_owner(b, len, party);
        }
        self.publish_free();
        Ok(runs.to_vec())
    }

    /// Blocks client `party` gives back. Runs it does not own are refused whole
    /// (a buggy client must not free what a file uses).
    pub fn take_back(&self, party: u32, runs: &[(u64, u64)]) -> Result<()> {
        let p = self.share.as_ref().ok_or(Error::NotSupported("pool not shared"))?;
        let t = p.table();
        for &(b, n) in runs {
            let ok = n > 0
                && b.checked_add(n).is_some_and(|e| e <= self.geo.nblocks)
                && self.geo.is_data_block(b)
                && (b..b + n).all(|x| t.owner(x) == party);
            if !ok {
                return Err(Error::invalid(format!(
                    "party {party} returned blocks {b}+{n} it does not own"
                )));
            }
        }
        for &(b, n) in runs {
            t.set_owner(b, n, DAEMON);
            self.poison_on(self.balloc.free(b, n));
        }
        self.publish_free();
        Ok(())
    }

    /// Take back everything of client `party` (it died, or the mount ends): after
    /// this it commits nothing more, the locks it held are free, every inode it
    /// wrote is current in this daemon's DRAM and durable as seen, and the blocks
    /// it held but no log references are free again.
    pub fn resolve_party(&self, party: u32) -> Result<Resolved> {
        let p = self.share.as_ref().ok_or(Error::NotSupported("pool not shared"))?.clone();
        assert!(party != DAEMON);
        let t = p.table();
        if t.party_state(party) == P_FREE {
            return Ok(Resolved::default());
        }
        t.set_party_state(party, P_REVOKED);
        wait_for_operations(t, party);
        let mut out = Resolved::default();
        // A journaled commit (a thorough GC) the party was in the middle of: finish
        // or roll it back as crash recovery would, before its inode is looked at.
        for shard in 0..self.geo.nshards {
            if t.journal_holder(shard) == Some(party) {
                t.lock_journal(shard, DAEMON, Some(party), &|_| Ok(()))?;
                let r = crate::journal::recover(&self.m, &self.geo, shard);
                self.m.fence();
                t.unlock_journal(shard, DAEMON);
                r?;
            }
        }
        // Only inside the party's span (share.rs): it was widened before each mark,
        // so nothing outside it is the party's. A client that only read has none.
        let (inos, blocks) = t.touched(party);
        let (first, last) = inos.unwrap_or((1, 0));
        out.inodes_scanned = (last + 1).saturating_sub(first);
        for ino in first..=last {
            if !t.is_dirty(ino, party) && t.holder(ino) != Some(party) && !t.has_dax(ino, party) {
                continue;
            }
            out.inodes += 1;
            // Wait for (or take over) the party's lock: after this, nothing of it runs
            // on this inode.
            t.lock(ino, DAEMON, Some(party), &|_| Ok(()))?;
            let r = self.adopt_inode(ino, party);
            t.clear_dirty(ino, party);
            // Its mappings died with it: the file's blocks may move again.
            t.set_dax(ino, party, false);
            t.unlock(ino, DAEMON);
            r?;
        }
        // The data area: what the party still owns, no log references.
        let (start, end) = blocks.map_or((0, 0), |(a, b)| (a.max(self.geo.data_start), b));
        out.blocks_scanned = end.saturating_sub(start);
        let runs = if start < end { t.owned_runs(party, start, end) } else { Vec::new() };
        for &(b, n) in &runs {
            t.set_owner(b, n, DAEMON);
            self.poison_on(self.balloc.free(b, n));
            out.blocks_returned += n;
        }
        t.clear_span(party);
        t.set_party_state(party, P_FREE);
        self.publish_free();
        Ok(out)
    }

    /// Under `ino`'s lock (held by the daemon): make what `party` left visible
    /// durable, rebuild the daemon's state from the log and take ownership of every
    /// block the log references.
    fn adopt_inode(&self, ino: u64, party: u32) -> Result<()> {
        let t = self.share.as_ref().expect("shared").table().clone();
        let slot = self.read_slot(ino);
        // The party's last stores (a tail, a GC unlink) may be visible but not yet
        // flushed: make the chain as seen the chain on media.
        self.m.flush(self.geo.slot_off(ino), 64);
        // It may also have died between a slot store and its replica's.
        crate::replica::resync_slot(&self.m, &self.geo, ino);
        if !slot.in_use() {
            self.m.fence();
            return Ok(());
        }
        let seed = log::seed(&self.sb.uuid, ino, slot.state);
        let mut refs: Vec<(u64, u64)> = Vec::new();
        let mut st = InodeState::new(crate::index::FileType::Regular);
        let mut sink = crate::index::Freed::new();
        // Data blocks of the operation being walked, and of the last one committed.
        let mut cur: Vec<(u64, u64)> = Vec::new();
        let mut last: Vec<(u64, u64)> = Vec::new();
        let walk = log::walk_apply(
            &self.m,
            &self.geo,
            seed,
            logptr::addr(slot.head),
            logptr::addr(slot.tail),
            &mut |loc, e| {
                if let log::Entry::Write { block, npages, .. } = e {
                    cur.push((block, npages as u64));
                }
                if log::entry_flags(&self.m, loc) & log::FLAG_TXEND != 0 {
                    last = std::mem::take(&mut cur);
                }
                st.apply(loc, &e, &mut sink)
            },
        )?;
        // An in-place append the party never committed left its bytes past the end
        // of file in the block of the run the last operation left (only that one
        // continues a run): they must read as zero again, as after a crash
        // (`log::clear_past_tail`; a run's next append, a truncate up or a write
        // past the end would show them).
        if let Some(t) = walk.last_tail {
            if self.fault != Some(crate::fs::CoreFault::AdoptKeepsPastTail) {
                log::clear_past_tail(&self.m, t);
            }
        }
        // The party's last operation may have stored its tail after flushing its
        // entries and data, and died before its fence: flush them again (a line is
        // written back whole, so this fence makes them durable), with every page
        // of the chain (entries and next pointers).
        for &pg in &walk.pages {
            self.m.flush(pg, BLOCK);
            refs.push((pg / BLOCK, 1));
        }
        for &(b, n) in &last {
            if self.fault != Some(crate::fs::CoreFault::AdoptUnflushed) {
                self.m.flush(b * BLOCK, n * BLOCK);
            }
        }
        // Entries it wrote past the committed tail (an operation it never
        // committed) must go: they carry the next sequence numbers, so the next
        // commit's entries, in flight with its tail, could be read as them after a
        // crash. Zero the rest of the tail page.
        let end = walk.end;
        let page_end = (end & !(BLOCK - 1)) + log::LOG_DATA_END;
        if end < page_end && self.fault != Some(crate::fs::CoreFault::AdoptUnflushed) {
            self.m.zero_nt(end, page_end - end);
        }
        self.m.fence();
        refs.extend(st.data_runs());
        for (b, n) in refs {
            for x in b..b + n {
                if t.owner(x) == party {
                    t.set_owner(x, 1, DAEMON);
                }
            }
        }
        // The cached copy, if any, catches up from the log (the chain may have
        // changed in any way: replay from the head).
        if let Some(i) = self.cached_only(ino) {
            let mut st = i.st.write();
            match self.catch_up_as(&i, &mut st, true) {
                Ok(()) | Err(Error::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Revoke every client (the mount is ending) and take their blocks back.
    pub fn resolve_all_clients(&self) -> Result<Resolved> {
        let p = self.share.as_ref().ok_or(Error::NotSupported("pool not shared"))?.clone();
        p.table().set_shutdown();
        let mut total = Resolved::default();
        for party in p.table().active_parties() {
            if party != DAEMON {
                let r = self.resolve_party(party)?;
                total.inodes += r.inodes;
                total.blocks_returned += r.blocks_returned;
            }
        }
        Ok(total)
    }
}

/// How long the daemon waits for a live client's operations to end before it takes
/// the client's locks over anyway (a stopped or hung client).
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// After revoking `party`: wait while it has operations in progress and its process
/// lives (a dead one's count stays where its death left it), at most [`BUSY_WAIT`].
/// An operation that began before the revocation commits and lets its lock go; one
/// that begins after sees the revocation and commits nothing.
fn wait_for_operations(t: &crate::share::Table, party: u32) {
    let alive = || {
        let pid = t.party_pid(party);
        pid != 0 && std::path::Path::new(&format!("/proc/{pid}")).exists()
    };
    let t0 = std::time::Instant::now();
    while t.busy(party) > 0 && alive() {
        if t0.elapsed() >= BUSY_WAIT {
            eprintln!(
                "ferrite: client {party} (pid {}) still in an operation after {:?}: taking its \
                 locks over",
                t.party_pid(party),
                BUSY_WAIT
            );
            return;
        }
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
}
