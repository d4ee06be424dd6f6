//! Threads of this library that never run a program's signal handlers. Fenced
//! unsafe module.
//!
//! A client lives inside someone else's program (the preload library, the C API):
//! a process-directed signal goes to any thread that does not block it, and a
//! program's handler running on a thread of this library would surprise it (it may
//! expect its own threads, or wait for the signal with sigwait in one of them).
//!
//! Invariants:
//! - A thread started by [`spawn`] blocks every signal from its first instruction:
//!   the mask is set in the spawning thread around the spawn (a new thread inherits
//!   it) and restored right after, so there is no window.
#![allow(unsafe_code)]

use std::io;
use std::thread::JoinHandle;

/// Spawn a named thread with every signal blocked.
pub fn spawn<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<JoinHandle<T>> {
    // SAFETY: local signal sets, filled before use; pthread_sigmask of this thread.
    let old = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    };
    let r = std::thread::Builder::new().name(name.into()).spawn(f);
    // SAFETY: restores this thread's mask as it was.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    r
}

#[cfg(test)]
mod tests {
    /// The new thread blocks SIGUSR1; the spawning thread's mask is unchanged.
    #[test]
    fn the_thread_blocks_signals_and_the_spawner_keeps_its_mask() {
        let blocked = |sig| {
            // SAFETY: reads this thread's mask into a local set.
            unsafe {
                let mut cur: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut cur);
                libc::sigismember(&cur, sig) == 1
            }
        };
        let before = blocked(libc::SIGUSR1);
        let h = super::spawn("quiet-test", move || blocked(libc::SIGUSR1)).unwrap();
        assert!(h.join().unwrap(), "the new thread must block SIGUSR1");
        assert_eq!(blocked(libc::SIGUSR1), before);
    }
}
