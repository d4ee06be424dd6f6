//! C library streams (`fopen`, `fdopen`, `FILE`) in a program started with the
//! preload library: their buffers go to the pool directly (docs/DIRECT-ACCESS.md,
//! "C library streams"), and the program sees what it sees on tmpfs and on the
//! plain mount. The program is tests/programs/stdio_streams.c, compiled here; it
//! prints a transcript of what each call returned, and leaves its files behind.
//!
//! Regression (found with this program): a write made at exit, after the main
//! thread's thread-locals were destroyed (an atexit handler, a C++ static
//! destructor, the flush of a stream), went to the kernel with the kernel's
//! offset, stale for a description private to the process: an atexit handler's
//! last line overwrote the first bytes of its file.

mod fuse_util;

use fuse_util::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn compile(out: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/stdio_streams.c");
    run(Command::new("cc").args(["-Wall", "-Werror", "-O1"]).arg(&src).arg("-o").arg(out));
}

/// Every file of `dir` (flat) and its bytes, read by this (plain) process.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| {
            let e = e.expect("entry");
            (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).expect("read"))
        })
        .collect()
}

fn transcript(mut c: Command) -> String {
    String::from_utf8(run(&mut c).stdout).expect("utf-8")
}

#[test]
fn streams_on_direct_files_behave_as_on_tmpfs_and_write_directly() {
    let m = Mount::new("direct-stdio", "256M", "");
    let bin = m.scratch().join("stdio_streams");
    compile(&bin);
    let tmpfs = tempfile::Builder::new().prefix("ferrite-stdio-").tempdir_in("/dev/shm").unwrap();
    let plain: PathBuf = m.path("plain");
    let direct: PathBuf = m.path("direct");
    std::fs::create_dir(&plain).unwrap();
    std::fs::create_dir(&direct).unwrap();

    let mut c = Command::new(&bin);
    c.arg(tmpfs.path());
    let want = transcript(c);
    let mut c = Command::new(&bin);
    c.arg(&plain);
    assert_eq!(transcript(c), want, "the plain mount against tmpfs");
    let stats = m.scratch().join("stats");
    let mut c = Command::new(ferrite());
    c.arg("run").arg("--mount").arg(&m.mnt).arg("--stats").arg(&stats).arg("--").arg(&bin);
    c.arg(&direct);
    assert_eq!(transcript(c), want, "under the preload library against tmpfs");

    let want = files(tmpfs.path());
    assert!(want["atexit_fd"].ends_with(b"9\nEND\n"), "the program's own check");
    for (dir, what) in [(&plain, "the plain mount"), (&direct, "the preload library")] {
        let got = files(dir);
        assert_eq!(got.keys().collect::<Vec<_>>(), want.keys().collect::<Vec<_>>(), "{what}");
        for (name, bytes) in &want {
            assert!(got[name] == *bytes, "{what}: {name} differs from tmpfs's");
        }
    }

    // The streams' buffers went to the pool, not through the kernel: the program's
    // own system calls on these files are a few dozen; its streams flush and fill
    // hundreds of buffers.
    let s = direct_stats(&stats);
    let main = s.iter().max_by_key(|x| x.direct).expect("stats lines");
    assert!(main.direct > 400, "the streams wrote directly: {s:?}");
    // Children flush at exit what their copies of the streams buffer.
    assert!(s.iter().filter(|x| x.pid != main.pid && x.direct > 0).count() >= 2, "{s:?}");
}
