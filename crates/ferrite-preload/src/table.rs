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
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering};
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
    /// The offset, while the description is private.
    pub pos: Mutex<u64>,
    /// Another process may share the description: the kernel's offset is the truth.
    pub shared: AtomicBool,
    /// Some I/O of it went through the kernel (fsync then goes there too).
    pub kernel_io: AtomicBool,
}

impl Desc {
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

/// Descriptors in the table: while zero, every hook passes straight through.
pub static TRACKED: AtomicUsize = AtomicUsize::new(0);

fn slot(fd: i32, create: bool) -> Option<&'static Mutex<Option<Arc<Desc>>>> {
    if fd < 0 || fd as usize >= CHUNK * CHUNKS {
        return None;
    }
    let (c, i) = (fd as usize / CHUNK, fd as usize % CHUNK);
    let chunk = if create {
        crate::statics::install_chunk(&TABLE[c], || {
            Box::new(std::array::from_fn(|_| Mutex::new(None)))
        })
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
    let old = std::mem::replace(&mut *s.lock(), d);
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
    for (c, p) in TABLE.iter().enumerate() {
        let Some(chunk) = crate::statics::chunk(p) else { continue };
        for (i, s) in chunk.iter().enumerate() {
            if let Some(d) = s.lock().clone() {
                v.push(((c * CHUNK + i) as i32, d));
            }
        }
    }
    v
}

// ------------------------------------------------------------------ the gate

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
    static BUSY: Arc<AtomicBool> = {
        let b = Arc::new(AtomicBool::new(false));
        THREADS.lock().push(Arc::downgrade(&b));
        b
    };
}

static FORKING: AtomicBool = AtomicBool::new(false);
static THREADS: Mutex<Vec<Weak<AtomicBool>>> = Mutex::new(Vec::new());

/// Inside a hook (and inside the fork gate) while this lives.
pub struct Entered {
    gated: bool,
}

/// Enter a hook. `None` when this thread is already inside one (the call comes from
/// this library itself and must go straight to the C library).
pub fn enter() -> Option<Entered> {
    let inside = IN_HOOK.try_with(|c| c.replace(true)).unwrap_or(true);
    if inside {
        return None;
    }
    let gated = BUSY
        .try_with(|b| {
            b.store(true, Ordering::SeqCst);
            while FORKING.load(Ordering::SeqCst) {
                b.store(false, Ordering::SeqCst);
                while FORKING.load(Ordering::SeqCst) {
                    std::thread::yield_now();
                }
                b.store(true, Ordering::SeqCst);
            }
        })
        .is_ok();
    Some(Entered { gated })
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.gated {
            let _ = BUSY.try_with(|b| b.store(false, Ordering::Release));
        }
        let _ = IN_HOOK.try_with(|c| c.set(false));
    }
}

/// Marks this thread inside a hook (without the fork gate) while it lives: for this
/// library's own work outside any hook (fork handlers).
pub struct Inside(bool);

/// See [`Inside`].
pub fn inside_guard() -> Inside {
    Inside(IN_HOOK.try_with(|c| c.replace(true)).unwrap_or(true))
}

impl Drop for Inside {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|c| c.set(self.0));
    }
}

/// Is this thread inside a hook?
pub fn inside() -> bool {
    IN_HOOK.try_with(|c| c.get()).unwrap_or(true)
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
        let mine = BUSY.try_with(Arc::downgrade).ok();
        let mut t = THREADS.lock();
        t.clear();
        t.extend(mine);
    }
    FORKING.store(false, Ordering::SeqCst);
}
