//! The process's direct descriptors, the fork gate, and the reentrancy guard.
//!
//! Invariants:
//! - A descriptor is in the table only while it refers to a regular file of a
//!   FerriteFS mount that this process opened (or inherited across exec: taken when
//!   the image starts); every call that can end or repoint a descriptor (close, dup2,
//!   close_range, fclose, ...) updates the table first.
//! - A [`Desc`] is one open file description: dup'ed descriptors share it. Its
//!   offset lives here while the description is private to this process; once
//!   another process may share it (fork, exec, spawn) the kernel's offset is the
//!   truth and is used under the inode's cross-process lock.
//! - The fork gate: a thread inside a hook that touches the table is *busy*; fork
//!   waits until no thread is busy (and new hooks wait for the fork), so the child
//!   never inherits a lock held by a vanished thread.
//! - Inside a hook, calls this library makes to the C library go straight to it
//!   (the reentrancy guard), so internal opens and reads are never intercepted.

use crate::mounts::Mount;
use parking_lot::Mutex;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

/// An open file description served directly.
pub struct Desc {
    /// The mount.
    pub mount: &'static Mount,
    /// Inode number.
    pub ino: u64,
    /// Device number (st_dev).
    pub dev: u64,
    /// O_RDONLY, O_WRONLY or O_RDWR.
    pub access: i32,
    /// Status flags as the program set them (O_APPEND, O_NONBLOCK, its own O_DIRECT).
    pub flags: AtomicI32,
    /// This library added O_DIRECT to the kernel's description (the marker that
    /// tells the daemon a direct-access client opened it).
    pub marker: bool,
    /// The kernel's description was opened for writing with O_DIRECT (the marker
    /// or the program's own): the daemon counted it as a direct writer, so the
    /// file's attributes are not cached by the kernel while it lives. Without it
    /// (a writable description inherited from a plain process) a direct write
    /// would leave the kernel's cached size stale: such a description writes
    /// directly only while another one holds the file's WRITERS flag.
    pub writer_registered: bool,
    /// The offset, while the description is private.
    pub pos: Mutex<u64>,
    /// Another process may share the description: the kernel's offset is the truth.
    pub shared: AtomicBool,
    /// Some I/O of it went through the kernel (fsync then goes there too).
    pub kernel_io: AtomicBool,
    /// What only the kernel knows of its statx, from the kernel's answer at open.
    pub look: KernelLook,
}

/// What only the kernel knows of a file's statx (the pool knows the rest): its
/// mount's id, the attribute flags and which of them the file system reports. A
/// statx this library answers from the pool takes these from the kernel's cached
/// answer, so that it says what the kernel says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelLook {
    /// `STATX_MNT_ID` when the kernel gave `mnt_id`.
    pub mask: u32,
    /// stx_attributes
    pub attributes: u64,
    /// stx_attributes_mask
    pub attributes_mask: u64,
    /// stx_mnt_id
    pub mnt_id: u64,
}

impl KernelLook {
    /// From a statx the kernel answered.
    pub fn of(s: &libc::statx) -> KernelLook {
        KernelLook {
            mask: s.stx_mask & libc::STATX_MNT_ID,
            attributes: s.stx_attributes,
            attributes_mask: s.stx_attributes_mask,
            mnt_id: s.stx_mnt_id,
        }
    }
}

impl Desc {
    /// The private offset, locked; `None` once the description is shared (the
    /// kernel's offset is then the truth). Checked under the lock that
    /// `sync_desc` takes to hand the offset over: a caller that saw the
    /// description private before the hand-over and moved the private offset
    /// after it would leave the kernel's behind (a thread writing while `main`
    /// returned: `exit` hands offsets over, and the thread's next write landed on
    /// its last one).
    pub fn private_pos(&self) -> Option<parking_lot::MutexGuard<'_, u64>> {
        let p = self.pos.lock();
        (!self.shared.load(Ordering::Acquire)).then_some(p)
    }

    /// O_APPEND?
    pub fn append(&self) -> bool {
        self.flags.load(Ordering::Relaxed) & libc::O_APPEND != 0
    }
    /// Open for reading?
    pub fn readable(&self) -> bool {
        self.access != libc::O_WRONLY
    }
    /// Open for writing?
    pub fn writable(&self) -> bool {
        self.access != libc::O_RDONLY
    }
}

const CHUNK: usize = 1024;
const CHUNKS: usize = 4096;

type Slots = [Mutex<Option<Arc<Desc>>>; CHUNK];

static TABLE: [AtomicPtr<Slots>; CHUNKS] = [const { AtomicPtr::new(std::ptr::null_mut()) }; CHUNKS];

/// One past the highest chunk ever installed (chunks are never removed): what
/// [`all`] scans. Scanning all of [`TABLE`] read its 32 KiB, 8 page faults in
/// every process at exit (of about 35 that this library adds to `/bin/true`).
static CHUNKS_USED: AtomicUsize = AtomicUsize::new(0);

/// Descriptors in the table: while zero, every hook passes straight through.
pub static TRACKED: AtomicUsize = AtomicUsize::new(0);

fn slot(fd: i32, create: bool) -> Option<&'static Mutex<Option<Arc<Desc>>>> {
    if fd < 0 || fd as usize >= CHUNK * CHUNKS {
        return None;
    }
    let (c, i) = (fd as usize / CHUNK, fd as usize % CHUNK);
    let chunk = if create {
        let ch = crate::statics::install_chunk(&TABLE[c], || {
            Box::new(std::array::from_fn(|_| Mutex::new(None)))
        });
        // A load first: an open in a chunk already counted takes no atomic write.
        if CHUNKS_USED.load(Ordering::Acquire) <= c {
            CHUNKS_USED.fetch_max(c + 1, Ordering::AcqRel);
        }
        ch
    } else {
        crate::statics::chunk(&TABLE[c])?
    };
    Some(&chunk[i])
}

/// The description of `fd`, if it is direct.
pub fn get(fd: i32) -> Option<Arc<Desc>> {
    slot(fd, false)?.lock().clone()
}

/// Register (or clear) `fd`; returns what was there.
pub fn set(fd: i32, d: Option<Arc<Desc>>) -> Option<Arc<Desc>> {
    let s = match (&d, slot(fd, d.is_some())) {
        (_, Some(s)) => s,
        (None, None) => return None,
        (Some(_), None) => return None, // beyond the table: stays a kernel descriptor
    };
    let new = d.is_some();
    let old = {
        let mut g = s.lock();
        let old = std::mem::replace(&mut *g, d);
        GEN.fetch_add(1, Ordering::AcqRel);
        old
    };
    match (old.is_some(), new) {
        (false, true) => {
            TRACKED.fetch_add(1, Ordering::AcqRel);
        }
        (true, false) => {
            TRACKED.fetch_sub(1, Ordering::AcqRel);
        }
        _ => {}
    }
    old
}

/// Every direct descriptor.
pub fn all() -> Vec<(i32, Arc<Desc>)> {
    let mut v = Vec::new();
    for (c, p) in TABLE[..CHUNKS_USED.load(Ordering::Acquire)].iter().enumerate() {
        let Some(chunk) = crate::statics::chunk(p) else { continue };
        for (i, s) in chunk.iter().enumerate() {
            if let Some(d) = s.lock().clone() {
                v.push(((c * CHUNK + i) as i32, d));
            }
        }
    }
    v
}

// ------------------------------------------------- closed write descriptors

/// Slots of [`note_closed_writer`]'s hint (a direct-mapped set of inode numbers).
const CLOSED_SLOTS: usize = 65536;
static CLOSED_WRITERS: [AtomicU64; CLOSED_SLOTS] = [const { AtomicU64::new(0) }; CLOSED_SLOTS];

fn closed_slot(ino: u64) -> &'static AtomicU64 {
    // Fibonacci hashing: consecutive inode numbers (files made in a row) spread.
    &CLOSED_WRITERS[(ino.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 48) as usize % CLOSED_SLOTS]
}

/// This process closed a descriptor of `ino` that it had opened for writing with
/// the marker. The daemon dropped the kernel's cached attributes of the file at
/// that release (a client's writes change them unseen), so the kernel's answer to
/// the next stat by path is a round trip to the daemon; the pool answers it in
/// this process instead (`hooks::pool_serves`). A hint only: a slot holds the
/// last inode number hashed to it, and a wrong answer costs time, never
/// correctness (the pool's attributes are current either way).
pub fn note_closed_writer(ino: u64) {
    closed_slot(ino).store(ino, Ordering::Relaxed);
}

/// Did this process lately close a marked write descriptor of `ino`?
pub fn closed_writer(ino: u64) -> bool {
    ino != 0 && closed_slot(ino).load(Ordering::Relaxed) == ino
}

// ------------------------------------------------------------------ the gate

/// What a thread keeps for the hooks: one thread-local, reached once per call.
pub struct Ctx {
    busy: Arc<AtomicBool>,
    /// This thread's call counters.
    pub counters: Arc<crate::stats::Counters>,
    /// The last descriptor this thread looked up, valid while [`GEN`] is unchanged.
    cache: RefCell<Cached>,
    /// The working directory as this thread last asked (getcwd), with the
    /// [`CWD_GEN`] it was asked under.
    cwd: RefCell<(u64, Vec<u8>)>,
    /// Was this thread's last stat by path of a file the pool serves (one this
    /// process loaded, or one a client has open for writing)? Then the next one
    /// looks first (see `hooks::stat_path_pool`).
    pub pool_stat: Cell<bool>,
}

struct Cached {
    fd: i32,
    gen: u64,
    desc: Option<Arc<Desc>>,
}

impl Ctx {
    fn new() -> Ctx {
        let busy = Arc::new(AtomicBool::new(false));
        let mut t = THREADS.lock();
        if t.len() >= 64 && t.len().is_power_of_two() {
            // Threads that are gone, dropped now and then (not only at fork).
            t.retain(|w| w.strong_count() > 0);
        }
        t.push(Arc::downgrade(&busy));
        drop(t);
        Ctx {
            busy,
            counters: crate::stats::register(),
            cache: RefCell::new(Cached { fd: -1, gen: 0, desc: None }),
            cwd: RefCell::new((0, Vec::new())),
            pool_stat: Cell::new(false),
        }
    }

    /// The working directory: asked of the kernel (getcwd) once per thread and per
    /// change through `chdir` or `fchdir`, which move [`CWD_GEN`]. Relative opens
    /// (tar, git and make work in their target directory) used to ask every time.
    /// A directory renamed since stays on the same mount (a rename never crosses
    /// one), and only the mount of a path is decided from it: the device of what
    /// an open finds is checked against the mount's (`open_direct`).
    pub fn cwd(&self) -> Option<Vec<u8>> {
        use std::os::unix::ffi::OsStrExt;
        let gen = CWD_GEN.load(Ordering::Acquire);
        let mut c = self.cwd.borrow_mut();
        if c.0 != gen {
            // Read the generation before asking: a change after the answer moves it.
            let d = std::env::current_dir().ok()?;
            *c = (gen, d.as_os_str().as_bytes().to_vec());
        }
        Some(c.1.clone())
    }

    /// Wait at the fork gate, then mark this thread busy.
    fn gate_in(&self) {
        let b = &self.busy;
        b.store(true, Ordering::SeqCst);
        while FORKING.load(Ordering::SeqCst) {
            b.store(false, Ordering::SeqCst);
            while FORKING.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            b.store(true, Ordering::SeqCst);
        }
    }

    fn gate_out(&self) {
        self.busy.store(false, Ordering::Release);
    }
}

thread_local! {
    static CTX: Ctx = Ctx::new();
    /// This thread's context after [`CTX`] was destroyed (see [`with_ctx`]): made
    /// on first need and never freed. No destructor, so it outlives the thread's
    /// other thread-locals.
    static LATE: Cell<Option<&'static Ctx>> = const { Cell::new(None) };
}

/// Run `f` on this thread's context. While the thread is torn down, after its
/// context was destroyed (the main thread's, before the atexit handlers and C++
/// static destructors run at exit; any thread's, before the destructors of the
/// thread-locals registered before it, which run last), a second one serves,
/// leaked: such a late call used to pass to the kernel, which wrote a direct
/// descriptor's data at the kernel's offset, stale for a description private to
/// the process (an atexit handler's last line overwrote the start of its log).
/// `None` only if even that cannot be reached.
pub fn with_ctx<T>(f: impl FnOnce(&Ctx) -> T) -> Option<T> {
    let mut f = Some(f);
    if let Ok(v) = CTX.try_with(|cx| f.take().map(|f| f(cx))) {
        return v;
    }
    let late = LATE
        .try_with(|l| {
            if l.get().is_none() {
                l.set(Some(Box::leak(Box::new(Ctx::new()))));
            }
            l.get()
        })
        .ok()
        .flatten()?;
    f.take().map(|f| f(late))
}

/// Bumped by every change of the table: a thread's cached lookup is valid while
/// this has not moved since.
static GEN: AtomicU64 = AtomicU64::new(1);

/// Moved after every `chdir` and `fchdir` of the process (even failed ones), so
/// that a thread's cached working directory is asked for again; never 0.
pub static CWD_GEN: AtomicU64 = AtomicU64::new(1);

static FORKING: AtomicBool = AtomicBool::new(false);
static THREADS: Mutex<Vec<Weak<AtomicBool>>> = Mutex::new(Vec::new());

/// The hot path of every data call: enter the hook (unless this thread is inside
/// one already), find `fd`'s description and run `f` on it, with one thread-local
/// access and, while the thread keeps using one descriptor, no lock.
pub fn with_desc<T>(fd: i32, f: impl FnOnce(&Desc, &Ctx) -> T) -> Option<T> {
    with_ctx(|cx| {
        if crate::signals::set_in_hook(true) {
            return None;
        }
        struct Out<'a>(&'a Ctx);
        impl Drop for Out<'_> {
            fn drop(&mut self) {
                self.0.gate_out();
                crate::signals::hook_done();
            }
        }
        cx.gate_in();
        let _out = Out(cx);
        // Nothing else borrows the cache: only this function does, and never
        // inside a hook.
        let mut c = cx.cache.try_borrow_mut().ok()?;
        // The generation is read before the slot: a change after it is seen next time.
        let gen = GEN.load(Ordering::Acquire);
        if c.fd != fd || c.gen != gen {
            *c = Cached { fd, gen, desc: get(fd) };
        }
        let d = c.desc.as_ref()?;
        Some(f(d, cx))
    })
    .flatten()
}

/// Inside a hook (and inside the fork gate) while this lives.
pub struct Entered(());

/// Enter a hook. `None` when this thread is already inside one (the call comes from
/// this library itself and must go straight to the C library).
pub fn enter() -> Option<Entered> {
    // A thread being torn down (its context gone) passes straight through too.
    with_ctx(|cx| {
        if crate::signals::set_in_hook(true) {
            return None;
        }
        cx.gate_in();
        Some(Entered(()))
    })
    .flatten()
}

impl Drop for Entered {
    fn drop(&mut self) {
        with_ctx(|cx| cx.gate_out());
        crate::signals::hook_done();
    }
}

/// Marks this thread inside a hook (without the fork gate) while it lives: for this
/// library's own work outside any hook (fork handlers).
pub struct Inside(bool);

/// See [`Inside`].
pub fn inside_guard() -> Inside {
    Inside(crate::signals::set_in_hook(true))
}

impl Drop for Inside {
    fn drop(&mut self) {
        if self.0 {
            crate::signals::set_in_hook(true);
        } else {
            crate::signals::hook_done();
        }
    }
}

/// Is `fd` a descriptor this library serves (asked from outside any hook)?
pub fn is_direct(fd: i32) -> bool {
    TRACKED.load(Ordering::Acquire) > 0 && enter().is_some_and(|_e| get(fd).is_some())
}

/// Is this thread inside a hook (or torn down past reaching any context)?
pub fn inside() -> bool {
    crate::signals::in_hook() || with_ctx(|_| ()).is_none()
}

/// Before fork: close the gate and wait until no thread is inside a hook.
pub fn fork_prepare() {
    FORKING.store(true, Ordering::SeqCst);
    let flags: Vec<Arc<AtomicBool>> = {
        let mut t = THREADS.lock();
        t.retain(|w| w.strong_count() > 0);
        t.iter().filter_map(|w| w.upgrade()).collect()
    };
    for f in flags {
        while f.load(Ordering::SeqCst) {
            std::thread::yield_now();
        }
    }
}

/// After fork, in both processes: open the gate.
pub fn fork_done(child: bool) {
    if child {
        crate::statics::unlock_after_fork(&THREADS);
        let mine = with_ctx(|cx| Arc::downgrade(&cx.busy));
        let mut t = THREADS.lock();
        t.clear();
        t.extend(mine);
    }
    FORKING.store(false, Ordering::SeqCst);
}
