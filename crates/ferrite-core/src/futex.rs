//! Futex wait and wake on a 32-bit word that may live in memory shared between
//! processes (the coordination table of `share`).
//!
//! Invariants:
//! - Only the address of the atomic is passed to the kernel; the kernel compares the
//!   word with the expected value itself, so a wake between our load and the wait is
//!   never lost.
//! - Waits are always bounded by a timeout: a caller re-checks why it waits (the
//!   holder may have died) at least that often, so nothing here can hang forever.
//! - The futexes are not `FUTEX_PRIVATE`: waiters and wakers may be different
//!   processes mapping the same shared memory.
#![allow(unsafe_code)]

use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// Sleep while `*word == expected`, at most `timeout`. Spurious returns are allowed.
pub fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    #[cfg(target_os = "linux")]
    {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: `word` is a live, aligned 32-bit atomic; the kernel only reads it
        // (FUTEX_WAIT) and `ts` outlives the call.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT,
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (word, expected);
        std::thread::sleep(timeout.min(Duration::from_millis(1)));
    }
}

/// Wake every waiter on `word`.
pub fn wake_all(word: &AtomicU32) {
    #[cfg(target_os = "linux")]
    // SAFETY: `word` is a live, aligned 32-bit atomic; FUTEX_WAKE does not touch it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
    #[cfg(not(target_os = "linux"))]
    let _ = word;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;
    use std::sync::Arc;

    #[test]
    fn wait_returns_on_wake_and_on_timeout() {
        let w = Arc::new(AtomicU32::new(1));
        let t0 = std::time::Instant::now();
        wait(&w, 1, Duration::from_millis(20));
        assert!(t0.elapsed() >= Duration::from_millis(10));
        // Value differs: returns at once.
        wait(&w, 2, Duration::from_secs(10));
        let w2 = w.clone();
        let h = std::thread::spawn(move || {
            while w2.load(Ordering::Acquire) == 1 {
                wait(&w2, 1, Duration::from_secs(5));
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        w.store(0, Ordering::Release);
        wake_all(&w);
        h.join().unwrap();
    }
}
