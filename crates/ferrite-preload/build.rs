//! Link the unwinder into `libferrite_preload.so` instead of loading `libgcc_s.so.1`.
//!
//! The Rust standard library links `libgcc_s` for unwinding (`-lgcc_s`), so every
//! process the library is preloaded into loaded it and ran its start, whose CPU
//! detection leaves a virtual machine for the hypervisor at each `CPUID`: 0.32 ms of
//! CPU per process here (`perf stat` of 500 spawns of `/bin/true`, an empty
//! preloaded library that links it against none), where the rest of this library
//! cost 0.16 ms more; linked in, the library's cost per process went from 0.61 to
//! 0.37 ms of CPU (1000 spawns). GCC ships the same unwinder as a static archive for
//! `-static-libgcc` (`libgcc_eh.a`, position independent): a directory that names
//! it `libgcc_s.a`, searched first, makes `-lgcc_s` take it. Its symbols stay
//! local to the library (rustc's version script exports only the hooks), so a
//! program's own `libgcc_s` is not interposed. Where the compiler does not have the
//! archive, the library links `libgcc_s` as before.
use std::path::{Path, PathBuf};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CC");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let Ok(out) = std::process::Command::new(cc).arg("-print-file-name=libgcc_eh.a").output()
    else {
        return;
    };
    let found = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let archive = Path::new(&found);
    // Without the archive the compiler prints the bare name back.
    if !out.status.success() || !archive.is_absolute() || !archive.is_file() {
        return;
    }
    let dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("static-gcc-s");
    std::fs::create_dir_all(&dir).expect("OUT_DIR is writable");
    let link = dir.join("libgcc_s.a");
    let _ = std::fs::remove_file(&link);
    std::fs::copy(archive, &link).expect("copy libgcc_eh.a");
    println!("cargo:rustc-cdylib-link-arg=-L{}", dir.display());
}
