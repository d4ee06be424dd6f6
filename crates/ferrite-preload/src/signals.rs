//! A program's signal handlers run after a hook, as the kernel runs them after a
//! system call. Fenced unsafe module.
//!
//! A hook of this library is a system call done in user space: while it runs, the
//! thread may hold the inode's locks, the cross-process lock of a file, or be midway
//! through an offset update. A handler that ran in the middle and called a hook
//! again (a `write` to a log file from a SIGALRM handler) could not be served
//! directly (the reentrancy guard sends it to the kernel, which has neither this
//! process's offset nor its size) and could deadlock: the kernel asks the daemon,
//! and the daemon waits for the cross-process lock that the interrupted hook holds.
//!
//! Invariants:
//! - A handler a program installs with `sigaction`, `signal` or `bsd_signal` for an
//!   asynchronous signal (everything but the synchronous SIGSEGV, SIGBUS, SIGFPE,
//!   SIGILL, SIGTRAP and SIGSYS) is installed in the kernel as [`wrapper`], with the
//!   program's mask and flags (plus SA_SIGINFO); the program's own action is kept
//!   here and is what `sigaction` reports back. SA_RESETHAND actions are installed
//!   unchanged (the kernel resets the action on delivery, so a deferred signal
//!   would meet the default action).
//! - A signal that arrives while its thread is inside a hook is sent
//!   again to the same thread with the same `siginfo` (rt_tgsigqueueinfo), and the
//!   signal stays blocked when the wrapper returns (its bit is added to the mask the
//!   kernel restores). When the thread leaves the outermost hook ([`hook_done`]) it
//!   unblocks what it deferred, and the kernel delivers it there, before the call
//!   returns to the program: the handler sees the call's effects whole.
//! - The thread's state ([`STATE`]) is a constant-initialised thread-local without
//!   a destructor: the wrapper reads it with no allocation and no lock.
//! - Not covered: `sigset`, `sysv_signal` and `siginterrupt` (the C library calls
//!   its internal sigaction), and a blocking open of a FIFO on a mount, which runs
//!   inside the open's hook (a handler waits for the open to return).
#![allow(unsafe_code)]

use libc::{c_int, c_void, siginfo_t};
use std::cell::Cell;
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};

/// A thread's hook state (one thread-local: one address computation per use).
struct HookState {
    /// Is this thread inside a hook?
    in_hook: Cell<bool>,
    /// Signals deferred while inside the current hook (bit `sig - 1`).
    deferred: Cell<u64>,
}

thread_local! {
    static STATE: HookState =
        const { HookState { in_hook: Cell::new(false), deferred: Cell::new(0) } };
}

/// Signal numbers the kernel knows (1..=64).
const NSIG: usize = 65;

/// A program's action for one signal, as it gave it.
struct UserAct {
    handler: usize,
    flags: c_int,
}

/// The program's action for each wrapped signal (null: not wrapped).
static ACTIONS: [AtomicPtr<UserAct>; NSIG] = [const { AtomicPtr::new(std::ptr::null_mut()) }; NSIG];

/// Owner (thread id) of the lock that orders changes of [`ACTIONS`] with the
/// kernel's actions; 0 when free.
static OWNER: AtomicI32 = AtomicI32::new(0);

/// Mark this thread inside a hook (`true`) or not; returns the previous value.
pub fn set_in_hook(v: bool) -> bool {
    STATE.with(|s| s.in_hook.replace(v))
}

/// Is this thread inside a hook?
pub fn in_hook() -> bool {
    STATE.with(|s| s.in_hook.get())
}

/// The thread leaves its outermost hook: deliver what was deferred meanwhile.
pub fn hook_done() {
    // In that order: a signal that arrives in between runs at once.
    let d = STATE.with(|s| {
        s.in_hook.set(false);
        s.deferred.replace(0)
    });
    if d == 0 {
        return;
    }
    // SAFETY: a local signal set, filled and passed to pthread_sigmask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in 1..NSIG as c_int {
            if d & (1 << (sig - 1)) != 0 {
                libc::sigaddset(&mut set, sig);
            }
        }
        // The re-sent signals are pending: the kernel runs their handlers on the
        // way out of this call.
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// May a handler of `sig` wait for the end of a hook?
fn deferrable(sig: c_int) -> bool {
    !matches!(
        sig,
        libc::SIGSEGV | libc::SIGBUS | libc::SIGFPE | libc::SIGILL | libc::SIGTRAP | libc::SIGSYS
    ) && (1..NSIG as c_int).contains(&sig)
}

/// The handler the kernel calls for a wrapped signal.
extern "C" fn wrapper(sig: c_int, info: *mut siginfo_t, uc: *mut c_void) {
    let Some(slot) = ACTIONS.get(sig as usize) else { return };
    let act = slot.load(Ordering::Acquire);
    if act.is_null() {
        return; // unwrapped by a sigaction racing with this delivery
    }
    if in_hook() && defer(sig, info, uc) {
        return;
    }
    // SAFETY: `act` was leaked by `remember` and is never freed; its handler is the
    // program's, of the kind its flags say.
    unsafe {
        let a = &*act;
        if a.flags & libc::SA_SIGINFO != 0 {
            let h: extern "C" fn(c_int, *mut siginfo_t, *mut c_void) =
                std::mem::transmute(a.handler);
            h(sig, info, uc);
        } else {
            let h: extern "C" fn(c_int) = std::mem::transmute(a.handler);
            h(sig);
        }
    }
}

/// Send `sig` again to this thread and keep it blocked until [`hook_done`];
/// false when the kernel refused (the handler then runs now, as before).
fn defer(sig: c_int, info: *mut siginfo_t, uc: *mut c_void) -> bool {
    // SAFETY: `info` and `uc` are the kernel's for this delivery; the system calls
    // are async-signal-safe.
    unsafe {
        let errno = *libc::__errno_location();
        let r =
            libc::syscall(libc::SYS_rt_tgsigqueueinfo, libc::getpid(), libc::gettid(), sig, info);
        *libc::__errno_location() = errno;
        if r != 0 || uc.is_null() {
            return false;
        }
        let uc = &mut *(uc as *mut libc::ucontext_t);
        libc::sigaddset(&mut uc.uc_sigmask, sig);
    }
    STATE.with(|s| s.deferred.set(s.deferred.get() | 1 << (sig - 1)));
    true
}

/// The same (handler, flags) leaked once: a program that calls sigaction in a loop
/// does not grow the heap.
fn remember(handler: usize, flags: c_int) -> *mut UserAct {
    static KNOWN: parking_lot::Mutex<Vec<usize>> = parking_lot::Mutex::new(Vec::new());
    let mut k = KNOWN.lock();
    for &p in k.iter() {
        // SAFETY: every pointer in KNOWN is a leaked UserAct.
        let a = unsafe { &*(p as *const UserAct) };
        if a.handler == handler && a.flags == flags {
            return p as *mut UserAct;
        }
    }
    let p = Box::into_raw(Box::new(UserAct { handler, flags }));
    k.push(p as usize);
    p
}

/// Holds [`OWNER`]; re-entered by its own thread (a handler that calls sigaction
/// while its thread is inside this library's sigaction) without waiting.
struct Ordered(bool);

fn order() -> Ordered {
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::gettid() };
    if OWNER.load(Ordering::Acquire) == me {
        return Ordered(false);
    }
    while OWNER.compare_exchange(0, me, Ordering::AcqRel, Ordering::Acquire).is_err() {
        std::thread::yield_now();
    }
    Ordered(true)
}

impl Drop for Ordered {
    fn drop(&mut self) {
        if self.0 {
            OWNER.store(0, Ordering::Release);
        }
    }
}

/// `sigaction` through `real`: the program's action `act` is installed wrapped
/// when it can wait for a hook's end, and `old` gets the program's previous action.
///
/// # Safety
/// `act` and `old` are null or valid, as for sigaction(2).
pub unsafe fn sigaction(
    real: unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int,
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    if !deferrable(sig) {
        // SAFETY: the caller's arguments.
        return unsafe { real(sig, act, old) };
    }
    // Inside a hook meanwhile: a wrapped handler that arrives now (and might call
    // sigaction itself, reaching `remember`'s lock on this thread) waits for the end.
    struct Out(bool);
    impl Drop for Out {
        fn drop(&mut self) {
            if !self.0 {
                hook_done();
            }
        }
    }
    let _in = Out(set_in_hook(true));
    let _o = order();
    let slot = &ACTIONS[sig as usize];
    let prev = slot.load(Ordering::Acquire);
    // SAFETY (whole block): `act` and `old` are the caller's; a zeroed sigaction is
    // valid; leaked UserActs live for the process.
    unsafe {
        let r = match act.as_ref() {
            None => real(sig, act, old),
            Some(a) => {
                let h = a.sa_sigaction;
                let plain = h == libc::SIG_DFL || h == libc::SIG_IGN || h == libc::SIG_ERR;
                if plain || a.sa_flags & libc::SA_RESETHAND != 0 {
                    let r = real(sig, act, old);
                    if r == 0 {
                        slot.store(std::ptr::null_mut(), Ordering::Release);
                    }
                    r
                } else {
                    let mine = remember(h, a.sa_flags);
                    // Stored before the kernel's action changes: the wrapper always
                    // finds the program's handler.
                    slot.store(mine, Ordering::Release);
                    let mut w: libc::sigaction = *a;
                    w.sa_sigaction = wrapper as *const () as usize;
                    w.sa_flags |= libc::SA_SIGINFO;
                    let r = real(sig, &w, old);
                    if r != 0 {
                        slot.store(prev, Ordering::Release);
                    }
                    r
                }
            }
        };
        if r == 0 {
            if let (Some(o), Some(p)) = (old.as_mut(), prev.as_ref()) {
                if o.sa_sigaction == wrapper as *const () as usize {
                    o.sa_sigaction = p.handler;
                    o.sa_flags = p.flags;
                }
            }
        }
        r
    }
}

/// `signal` (BSD semantics, as the C library's: SA_RESTART, the signal itself
/// blocked in its handler) through [`sigaction`].
///
/// # Safety
/// As `signal(2)`.
pub unsafe fn signal(
    real: unsafe extern "C" fn(c_int, *const libc::sigaction, *mut libc::sigaction) -> c_int,
    sig: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    if handler == libc::SIG_ERR || !(1..NSIG as c_int).contains(&sig) {
        crate::real::set_errno(libc::EINVAL);
        return libc::SIG_ERR;
    }
    // SAFETY: local sigaction values passed to sigaction.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaddset(&mut act.sa_mask, sig);
        act.sa_flags = libc::SA_RESTART;
        let mut old: libc::sigaction = std::mem::zeroed();
        if sigaction(real, sig, &act, &mut old) != 0 {
            return libc::SIG_ERR;
        }
        old.sa_sigaction
    }
}
