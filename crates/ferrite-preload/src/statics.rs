//! Process-lifetime objects handed around as `&'static`: attached clients (leaked
//! boxes) and the descriptor table's chunks. Fenced unsafe module.
//!
//! Invariants:
//! - A client pointer stored in a mount is a `Box::into_raw` that is never freed;
//!   only [`abandon`] takes it back, in a child after fork, where no other thread
//!   exists, and it then forgets the client without running its destructor.
//! - A chunk pointer, once stored, is never changed or freed.
#![allow(unsafe_code)]

use ferrite_direct::Client;
use parking_lot::Mutex;

/// The client behind a leaked pointer.
pub fn leaked(p: *mut Client) -> &'static Client {
    assert!(!p.is_null());
    // SAFETY: `p` came from Box::into_raw and is never freed while reachable
    // (see the module comment), so the reference is valid for the process.
    unsafe { &*p }
}

/// In a child after fork: close the child's copies of a parent's client's
/// descriptors and forget the rest.
pub fn abandon(p: *mut Client) {
    // SAFETY: `p` came from Box::into_raw; in the child nothing else uses it.
    let c = unsafe { Box::from_raw(p) };
    c.abandon();
}

/// In a child after fork: a mutex held by another thread of the parent (which does
/// not exist here) is released.
pub fn unlock_after_fork<T>(m: &Mutex<T>) {
    if m.is_locked() {
        // SAFETY: only the forking thread runs in the child, and it does not hold
        // the mutex (fork is not called with our locks held), so no guard exists.
        unsafe { m.force_unlock() };
    }
}

/// Store a chunk for the descriptor table, or return the one another thread stored.
pub fn install_chunk<T>(
    slot: &std::sync::atomic::AtomicPtr<T>,
    make: impl FnOnce() -> Box<T>,
) -> &'static T {
    use std::sync::atomic::Ordering;
    let p = slot.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: chunks are never freed once stored (module comment).
        return unsafe { &*p };
    }
    let new = Box::into_raw(make());
    match slot.compare_exchange(std::ptr::null_mut(), new, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: just stored, never freed.
        Ok(_) => unsafe { &*new },
        Err(cur) => {
            // SAFETY: `new` was never shared; `cur` is a stored chunk.
            unsafe {
                drop(Box::from_raw(new));
                &*cur
            }
        }
    }
}

/// A stored chunk, if any.
pub fn chunk<T>(slot: &std::sync::atomic::AtomicPtr<T>) -> Option<&'static T> {
    let p = slot.load(std::sync::atomic::Ordering::Acquire);
    // SAFETY: chunks are never freed once stored.
    (!p.is_null()).then(|| unsafe { &*p })
}
