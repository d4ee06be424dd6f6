//! `dprintf` and `vdprintf` on direct descriptors. Fenced unsafe module.
//!
//! glibc's `dprintf` formats into a stream of its own on the descriptor, which
//! asks the kernel for the offset and writes with the internal `write`: on a
//! direct descriptor whose description is private to the process, the kernel's
//! offset is stale (the library keeps the offset), so the text landed there,
//! over earlier bytes (`write` of a line, `dprintf` of the next: the second
//! overwrote the first). Here the text is formatted by glibc (`vasprintf`) and
//! written with the library's `write`, at the description's offset, in one
//! write. Any other descriptor: glibc's own.
//!
//! Invariants:
//! - `dprintf` is variadic, which stable Rust cannot define: it is a naked
//!   function that builds the x86-64 System V `va_list` of its arguments (their
//!   registers saved in a register save area, the rest on the caller's stack) and
//!   calls [`dprintf_va`], as a C compiler builds one for `va_start`.
//! - Nothing here panics across `dprintf`'s asm frame; it carries call-frame
//!   information (an unwinder, a debugger or a thread's cancellation can walk
//!   through it) and starts with `endbr64` (a no-op without CET).
#![allow(unsafe_code)]

use crate::real::{real, set_errno};
use crate::{hooks, table};
use libc::{c_char, c_int, c_void};

/// An element of the x86-64 System V `va_list` (an array of one of these, which
/// a function receives as a pointer).
#[repr(C)]
pub struct VaListTag {
    gp_offset: u32,
    fp_offset: u32,
    overflow_arg_area: *mut c_void,
    reg_save_area: *mut c_void,
}
const _: () = assert!(std::mem::size_of::<VaListTag>() == 24);

extern "C" {
    fn vasprintf(out: *mut *mut c_char, fmt: *const c_char, ap: *mut VaListTag) -> c_int;
}

/// vdprintf: formatted by glibc, written by the library's `write` (see the
/// module comment).
#[no_mangle]
pub unsafe extern "C" fn vdprintf(fd: c_int, fmt: *const c_char, ap: *mut VaListTag) -> c_int {
    // SAFETY: the caller's arguments, as for vdprintf(3).
    unsafe { dprintf_va(fd, fmt, ap) }
}

/// Both entry points' work.
unsafe extern "C" fn dprintf_va(fd: c_int, fmt: *const c_char, ap: *mut VaListTag) -> c_int {
    if table::inside() || !table::is_direct(fd) {
        return match real().vdprintf {
            // SAFETY: the caller's arguments, passed on unchanged.
            Some(f) => unsafe { f(fd, fmt, ap.cast()) },
            None => {
                set_errno(libc::ENOSYS);
                -1
            }
        };
    }
    let mut text: *mut c_char = std::ptr::null_mut();
    // SAFETY: the caller's format and arguments; glibc allocates the text.
    let n = unsafe { vasprintf(&mut text, fmt, ap) };
    if n < 0 {
        return -1;
    }
    // SAFETY: the n bytes vasprintf made.
    let failed = unsafe { hooks::write_all(fd, text.cast(), n as usize) } < n as usize;
    // SAFETY: allocated by vasprintf, freed once; errno is kept across free.
    let e = crate::real::errno();
    unsafe { libc::free(text.cast()) };
    if failed {
        set_errno(e);
        return -1;
    }
    n
}

/// dprintf(fd, fmt, ...): the `va_list` of `...`, then [`dprintf_va`].
///
/// Frame (rsp 16-byte aligned after the push and the 208 bytes): the register
/// save area at rsp+0 (rdi, rsi, rdx, rcx, r8, r9 at 0..48; xmm0-7 at 48..176,
/// saved only when al, the caller's count of vector registers used, is not zero),
/// the `va_list` element at rsp+176: gp_offset 16 (fd and fmt are named),
/// fp_offset 48, the stacked arguments at rbp+16, the save area.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dprintf() -> c_int {
    core::arch::naked_asm!(
        ".cfi_startproc",
        "endbr64",
        "push rbp",
        ".cfi_def_cfa_offset 16",
        ".cfi_offset rbp, -16",
        "mov rbp, rsp",
        ".cfi_def_cfa_register rbp",
        "sub rsp, 208",
        "mov [rsp], rdi",
        "mov [rsp + 8], rsi",
        "mov [rsp + 16], rdx",
        "mov [rsp + 24], rcx",
        "mov [rsp + 32], r8",
        "mov [rsp + 40], r9",
        "test al, al",
        "je 2f",
        "movaps [rsp + 48], xmm0",
        "movaps [rsp + 64], xmm1",
        "movaps [rsp + 80], xmm2",
        "movaps [rsp + 96], xmm3",
        "movaps [rsp + 112], xmm4",
        "movaps [rsp + 128], xmm5",
        "movaps [rsp + 144], xmm6",
        "movaps [rsp + 160], xmm7",
        "2:",
        "mov dword ptr [rsp + 176], 16",
        "mov dword ptr [rsp + 180], 48",
        "lea rax, [rbp + 16]",
        "mov [rsp + 184], rax",
        "mov [rsp + 192], rsp",
        "lea rdx, [rsp + 176]",
        "call {va}",
        "leave",
        ".cfi_def_cfa rsp, 8",
        "ret",
        ".cfi_endproc",
        va = sym dprintf_va,
    )
}
