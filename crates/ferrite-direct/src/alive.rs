//! The daemon's liveness, readable by clients without a system call: a sentinel
//! thread of the daemon stores its thread id in the table's alive word and registers
//! that word in its robust-futex list. However the daemon ends (exit, SIGKILL, a
//! crash), the kernel then sets `FUTEX_OWNER_DIED` in the word, and every client's
//! next lock acquisition sees it (`Table::daemon_alive`). Fenced unsafe module.
//!
//! Invariants:
//! - The list head and entry are leaked: the kernel reads them when the thread
//!   exits, which is when the process ends; they must outlive it.
//! - The sentinel thread takes no pthread robust mutex (its robust list is ours,
//!   replacing glibc's for that thread only).
#![allow(unsafe_code)]

use ferrite_core::share::Table;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[repr(C)]
struct RobustList {
    next: *mut RobustList,
}

#[repr(C)]
struct RobustListHead {
    list: RobustList,
    futex_offset: libc::c_long,
    list_op_pending: *mut RobustList,
}

/// Start the sentinel; returns once the alive word is armed.
pub fn start(table: Arc<Table>) -> io::Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new().name("ferrite-alive".into()).spawn(move || {
        let word = table.alive_word();
        let entry: *mut RobustList =
            Box::into_raw(Box::new(RobustList { next: std::ptr::null_mut() }));
        let head: *mut RobustListHead = Box::into_raw(Box::new(RobustListHead {
            list: RobustList { next: entry },
            futex_offset: (word.as_ptr() as isize - entry as isize) as libc::c_long,
            list_op_pending: std::ptr::null_mut(),
        }));
        // SAFETY: both boxes are leaked (never freed); the entry's next closes the
        // circular list at the head, as the kernel's robust-list ABI requires.
        unsafe { (*entry).next = &mut (*head).list };
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
        word.store(tid, Ordering::Release);
        // SAFETY: `head` points to a valid, leaked robust_list_head of the size given.
        let r = unsafe {
            libc::syscall(libc::SYS_set_robust_list, head, std::mem::size_of::<RobustListHead>())
        };
        let _ = tx.send(if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) });
        loop {
            std::thread::park();
        }
    })?;
    rx.recv().map_err(|_| io::Error::other("liveness sentinel did not start"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_core::share::{Table, OWNER_DIED};

    /// The kernel marks the word when the owning process dies (a forked child here).
    #[test]
    fn word_is_marked_when_the_daemon_dies() {
        let (fd, region) = crate::shm::create(8, 64).unwrap();
        let t = Arc::new(Table::create(Box::new(region), 8, 64, &[1; 16]));
        // SAFETY: the child starts one thread and ends with _exit; glibc resets its
        // malloc locks in the child, so allocating there is safe.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = if start(t.clone()).is_ok() { 0 } else { 1 };
            // SAFETY: _exit ends the child at once.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(libc::WEXITSTATUS(status), 0);
        let w = t.alive_word().load(Ordering::Acquire);
        assert!(w & OWNER_DIED != 0, "word {w:#x} not marked");
        assert!(!t.daemon_alive());
        drop(fd);
    }
}
