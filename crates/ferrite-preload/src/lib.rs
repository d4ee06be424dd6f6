//! `libferrite_preload.so`: started with it (`ferrite run -- CMD`), a program opens,
//! creates, renames, stats and lists files on FerriteFS mounts through the kernel
//! as before, and reads and writes their data itself: through the core's own write
//! path over its own mapping of the pool, coordinated with the mount daemon
//! (ferrite-direct). Every call it does not take stays correct through the mount.
//!
//! Modules: `hooks` (the interposed C functions; unsafe), `real` (the C library's
//! functions; unsafe), `statics` (process-lifetime objects; unsafe), `table` (direct
//! descriptors, the fork gate, reentrancy), `signals` (handlers deferred to the end of
//! a hook), `streams` (C library streams on direct files; unsafe), `printf`
//! (dprintf on direct descriptors; unsafe), `ops` (the direct data path, safe),
//! `mounts`, `stats`. What is intercepted and what is not: docs/DIRECT-ACCESS.md.

mod hooks;
pub mod mounts;
mod ops;
#[cfg(all(target_arch = "x86_64", target_env = "gnu"))]
mod printf;
mod real;
mod signals;
mod statics;
mod stats;
mod streams;
mod table;

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};

pub(crate) use statics::{abandon, leaked};

/// Set up once per process image: find the mounts, take inherited descriptors,
/// register the fork and exit handlers, make the standard streams streams of this
/// library when they are on direct files.
pub(crate) fn init() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(|| {
        {
            let Some(_e) = table::enter() else { return };
            let ms = mounts::mounts();
            if !ms.is_empty() {
                adopt_inherited();
            }
            hooks::register_handlers();
        }
        // Outside the hook: making a stream asks the hooks (fstat).
        streams::adopt_std();
    });
}

/// Descriptors this image inherited (across exec) that name regular files of a
/// mount: direct from now on, with the kernel's offset (the previous image, or
/// another process, may share them).
fn adopt_inherited() {
    for fd in real::open_fds() {
        let Ok(st) = real::statx_cached(fd) else { continue };
        let dev = libc::makedev(st.stx_dev_major, st.stx_dev_minor);
        if st.stx_mode as u32 & libc::S_IFMT != libc::S_IFREG {
            continue;
        }
        let Some(m) = mounts::for_dev(dev) else { continue };
        let Ok(fl) = real::fcntl(fd, libc::F_GETFL, 0) else { continue };
        if fl & libc::O_ACCMODE == libc::O_RDONLY && !hooks::attach_for_read(st.stx_size) {
            // A small file to read (`sh -c 'cat < f'`): the kernel's, as a file this
            // process opens to read before it attaches (`hooks::open_direct`).
            continue;
        }
        table::set(
            fd,
            Some(Arc::new(table::Desc {
                mount: m,
                ino: st.stx_ino,
                dev,
                access: fl & libc::O_ACCMODE,
                flags: (fl & (libc::O_APPEND | libc::O_NONBLOCK | libc::O_DIRECT)).into(),
                marker: false,
                writer_registered: fl & libc::O_DIRECT != 0
                    && fl & libc::O_ACCMODE != libc::O_RDONLY,
                pos: Default::default(),
                shared: true.into(),
                kernel_io: false.into(),
                look: table::KernelLook::of(&st),
            })),
        );
    }
}

/// Give the kernel a private description's offset and make the kernel's the truth
/// (another process may share the description from now on).
pub(crate) fn sync_desc(fd: i32, d: &table::Desc) {
    let p = d.pos.lock();
    if !d.shared.load(Ordering::Acquire) {
        let _ = real::lseek(fd, *p as i64, libc::SEEK_SET);
        d.shared.store(true, Ordering::Release);
        if mounts::debug() {
            eprintln!("ferrite-preload: fd {fd} (inode {}) may now be shared", d.ino);
        }
    }
}

/// [`sync_desc`] for every direct descriptor (before fork: the child has them all).
pub(crate) fn sync_all() {
    for (fd, d) in table::all() {
        sync_desc(fd, &d);
    }
}

/// [`sync_desc`] for the direct descriptors a new program image inherits: those
/// without close-on-exec (a descriptor whose flags cannot be read counts as
/// inherited).
pub(crate) fn sync_inherited() {
    for (fd, d) in table::all() {
        let cloexec = real::fcntl(fd, libc::F_GETFD, 0).is_ok_and(|f| f & libc::FD_CLOEXEC != 0);
        if !cloexec {
            sync_desc(fd, &d);
        }
    }
}

/// An environment switch that is on unless set to `0` (`FERRITE_DAX`,
/// `FERRITE_COPY_MAPS`, `FERRITE_LAZY_ATTACH`), read once into `cell`.
pub(crate) fn switch_on(cell: &OnceLock<bool>, name: &str) -> bool {
    *cell.get_or_init(|| std::env::var_os(name).is_none_or(|v| v != "0"))
}

extern "C" fn constructor() {
    init();
}

/// Run `init` when the library is loaded (before the program's main).
#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;
