//! C library streams (`fopen`, `fdopen`, `FILE`, and `stdout` / `stderr`
//! redirected to files) in a program started with the preload library: their
//! buffers go to the pool directly (docs/DIRECT-ACCESS.md, "C library streams"),
//! and the program sees what it sees on tmpfs and on the plain mount. The program
//! is tests/programs/stdio_streams.c, compiled here; it prints a transcript of what
//! each call returned, and leaves its files behind.
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
    run(Command::new("cc")
        .args(["-Wall", "-Werror", "-O1", "-pthread"])
        .arg(&src)
        .arg("-o")
        .arg(out));
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

/// A mount with `opts`, the program compiled in its scratch directory, and a
/// path there for the preload library's exit reports.
fn mounted(tag: &str, opts: &str) -> (Mount, PathBuf, PathBuf) {
    let m = Mount::new(tag, "256M", opts);
    let bin = m.scratch().join("stdio_streams");
    compile(&bin);
    let stats = m.scratch().join("stats");
    (m, bin, stats)
}

/// [`mounted`] (without its report path), a tmpfs directory to compare with,
/// and a directory `d` on the mount.
fn setup(tag: &str) -> (Mount, PathBuf, tempfile::TempDir, PathBuf) {
    let (m, bin, _) = mounted(tag, "");
    let tmpfs = tempfile::Builder::new().prefix("ferrite-stdio-").tempdir_in("/dev/shm").unwrap();
    let dir = m.path("d");
    std::fs::create_dir(&dir).unwrap();
    (m, bin, tmpfs, dir)
}

/// `sh`, under `pre` (a command prefix) if given.
fn shell(pre: Option<Command>) -> Command {
    match pre {
        Some(mut c) => {
            c.arg("sh");
            c
        }
        None => Command::new("sh"),
    }
}

fn transcript(mut c: Command) -> String {
    String::from_utf8(run(&mut c).stdout).expect("utf-8")
}

#[test]
fn streams_on_direct_files_behave_as_on_tmpfs_and_write_directly() {
    let (m, bin, tmpfs, direct) = setup("direct-stdio");
    let plain: PathBuf = m.path("plain");
    std::fs::create_dir(&plain).unwrap();

    let mut c = Command::new(&bin);
    c.arg(tmpfs.path());
    let want = transcript(c);
    let mut c = Command::new(&bin);
    c.arg(&plain);
    assert_eq!(transcript(c), want, "the plain mount against tmpfs");
    let stats = m.scratch().join("stats");
    let mut c = preloaded(&m, &stats);
    c.arg(&bin).arg(&direct);
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

/// Run `pre` (a command prefix, or none) with `bin args`, stdout and stderr
/// redirected by a shell to `dir`/out and `dir`/err (under the preload library,
/// the shell opens them directly, as a user's shell started with `ferrite run`
/// would); their bytes.
fn redirected(pre: Option<Command>, bin: &Path, args: &[&str], dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let (out, err) = (dir.join("out"), dir.join("err"));
    let mut cmd = shell(pre);
    cmd.args(["-c", "out=$1 err=$2; shift 2; exec \"$@\" > \"$out\" 2> \"$err\"", "sh"]);
    cmd.arg(&out).arg(&err).arg(bin).args(args);
    let st = cmd.status().expect("spawn");
    assert!(st.success(), "{cmd:?}: {st}");
    (std::fs::read(out).unwrap(), std::fs::read(err).unwrap())
}

fn preloaded(m: &Mount, stats: &Path) -> Command {
    let mut c = Command::new(ferrite());
    c.arg("run").arg("--mount").arg(&m.mnt).arg("--stats").arg(stats).arg("--");
    c
}

/// `{ head N; head N; cat; } < input` with stdout and stderr redirected: each
/// program reads on from where the one before stopped.
fn heads(pre: Option<Command>, bin: &Path, input: &Path, dir: &Path) -> Vec<u8> {
    let out = dir.join("heads");
    let mut cmd = shell(pre);
    cmd.args(["-c", "{ \"$1\" head 3; \"$1\" head 5000; cat; } < \"$2\" > \"$3\"", "sh"]);
    cmd.arg(bin).arg(input).arg(&out);
    let st = cmd.status().expect("spawn");
    assert!(st.success(), "{cmd:?}: {st}");
    std::fs::read(out).unwrap()
}

#[test]
fn standard_streams_redirected_to_direct_files_read_and_write_directly() {
    let (m, bin, tmpfs, dir) = setup("direct-stdout");
    for args in [&["print", "100000"][..], &["wide"]] {
        let want = redirected(None, &bin, args, tmpfs.path());
        let stats = m.scratch().join(format!("stats-{}", args[0]));
        let got = redirected(Some(preloaded(&m, &stats)), &bin, args, &dir);
        assert!(got.0 == want.0, "{args:?}: stdout differs from tmpfs's");
        assert_eq!(String::from_utf8_lossy(&got.1), String::from_utf8_lossy(&want.1), "{args:?}");
        let s = direct_stats(&stats);
        if args[0] == "print" {
            // 2.1 MB of printf output in 4 KiB buffers: hundreds of direct writes
            // (none before: glibc's stdout wrote through the kernel).
            assert!(s.iter().map(|x| x.direct).sum::<u64>() > 400, "{s:?}");
        }
    }
    // stdin: the output of `print` read back by three programs in turn.
    std::fs::copy(tmpfs.path().join("out"), dir.join("input")).unwrap();
    let want = heads(None, &bin, &tmpfs.path().join("out"), tmpfs.path());
    let stats = m.scratch().join("stats-heads");
    // The input (about 2 MB) is below the size a process attaches for to read an
    // inherited descriptor (docs/DIRECT-ACCESS.md, "When a process attaches"):
    // attach at once, so the three read it directly and share its offset.
    let mut pre = preloaded(&m, &stats);
    pre.env("FERRITE_LAZY_ATTACH", "0");
    let got = heads(Some(pre), &bin, &dir.join("input"), &dir);
    assert!(got == want, "stdin: differs from tmpfs's");
    let s = direct_stats(&stats);
    // The second head reads 5000 lines (about 100 KiB) in 4 KiB buffers.
    assert!(s.iter().any(|x| x.direct >= 25), "stdin was read directly: {s:?}");
}

/// A C++ program's `printf` and `std::cout` share glibc's `stdout` buffer; the
/// library must leave that stream alone there, or the lines would come out of
/// order.
#[test]
fn cxx_streams_and_printf_stay_in_order() {
    assert!(
        Command::new("c++").arg("--version").output().is_ok(),
        "c++ is needed (scripts/apt-packages.txt)"
    );
    let m = Mount::new("direct-cxx", "256M", "");
    let src = m.scratch().join("order.cc");
    std::fs::write(
        &src,
        "#include <cstdio>\n#include <iostream>\nint main() {\n  for (int i = 0; i < 3000; i++) {\n    \
         std::printf(\"printf %d\\n\", i);\n    std::cout << \"cout \" << i << \"\\n\";\n  }\n}\n",
    )
    .unwrap();
    let bin = m.scratch().join("order");
    run(Command::new("c++").arg("-O1").arg(&src).arg("-o").arg(&bin));
    let want: String = (0..3000).map(|i| format!("printf {i}\ncout {i}\n")).collect();
    let stats = m.scratch().join("stats");
    let (out, _) = redirected(Some(preloaded(&m, &stats)), &bin, &[], &m.mnt);
    assert!(String::from_utf8_lossy(&out) == want, "C++ output out of order");
}

/// Files made by mkstemp (sed -i, sort, perl -i, git make theirs so) on a mount
/// are direct: created through the library, not by the C library's own open.
#[test]
fn temp_files_from_mkstemp_are_direct() {
    let (m, bin, tmpfs, dir) = setup("direct-mkstemp");
    let mut c = Command::new(&bin);
    c.arg("temp").arg(tmpfs.path());
    let want = transcript(c);
    assert!(want.contains("mkstemp: 1, name made 1, mode 600"), "{want}");
    let stats = m.scratch().join("stats");
    let mut c = preloaded(&m, &stats);
    c.arg(&bin).arg("temp").arg(&dir);
    assert_eq!(transcript(c), want);
    assert_eq!(files(&dir), files(tmpfs.path()));
    // 300 writes to the mkstemp descriptor, then its stream's.
    let s = direct_stats(&stats);
    assert!(s.iter().any(|x| x.direct >= 300), "mkstemp's file was direct: {s:?}");
}

/// Regression: at exit, a thread that kept writing a file while `main` returned
/// lost records. The library hands the offsets of private descriptions to the
/// kernel before it tells the daemon goodbye (after which calls go to the
/// kernel); without that, the thread's last records went over its first ones
/// (about one run in five). And a write that had read the description as
/// private before the hand-over moved the private offset after it, so the next
/// write landed on it (one run in four): the offset is now checked under its lock.
#[test]
fn a_thread_writing_while_main_returns_loses_no_record() {
    let (m, bin, stats) = mounted("direct-exit-writer", "");
    let f = m.path("records");
    for round in 0..12 {
        let mut c = preloaded(&m, &stats);
        c.arg(&bin).arg("exit-writer").arg(&f);
        run(&mut c);
        let data = std::fs::read(&f).unwrap();
        let recs: Vec<&[u8]> = data.split(|&b| b == b'\n').collect();
        let whole = &recs[..recs.len() - 1];
        assert!(!whole.is_empty(), "round {round}: no record");
        for (i, r) in whole.iter().enumerate() {
            assert!(*r == format!("{i:015}").as_bytes(), "round {round}: record {i} is {r:?}");
        }
    }
}

/// The exit report counts the calls of every thread, also of threads long gone
/// (their counters are folded into one total as threads come and go, not kept
/// one per thread for the life of the process).
#[test]
fn calls_of_threads_that_are_gone_still_count() {
    let (m, bin, stats) = mounted("direct-threads", "");
    let f = m.path("records");
    let mut c = preloaded(&m, &stats);
    c.arg(&bin).arg("threads").arg("1000").arg(&f);
    run(&mut c);
    assert_eq!(std::fs::read(&f).unwrap().len(), 7000);
    let s = direct_stats(&stats);
    assert!(s.iter().any(|x| x.direct >= 1000), "{s:?}");
}

/// Regression: a writable description inherited from a plain process that the
/// daemon did not count as a direct writer (on a `-o direct_io` mount, a plain
/// shell's redirection is such an open) was written directly, and the kernel kept
/// the file's attributes it had cached: `stat` said 0 bytes for a written file.
/// Such a description now writes through the kernel (unless a direct writer holds
/// the file's attributes uncached); one opened by a process with the library
/// writes directly.
#[test]
fn output_redirected_by_a_plain_process_keeps_stat_current() {
    let (m, bin, stats) = mounted("direct-plain-redirect", "direct_io");
    let want = {
        let t =
            tempfile::Builder::new().prefix("ferrite-redirect-").tempdir_in("/dev/shm").unwrap();
        redirected(None, &bin, &["print", "20000"], t.path()).0
    };
    // Redirected by this (plain) process.
    let out = m.path("plain-out");
    let mut c = preloaded(&m, &stats);
    c.arg(&bin).args(["print", "20000"]);
    c.stdout(std::fs::File::create(&out).unwrap()).stderr(std::process::Stdio::null());
    assert!(c.status().unwrap().success());
    assert_eq!(std::fs::metadata(&out).unwrap().len(), want.len() as u64, "stat of plain-out");
    assert!(std::fs::read(&out).unwrap() == want);
    // Redirected by a shell with the library: direct, and stat is current too.
    let stats2 = m.scratch().join("stats2");
    let dir = m.path("d");
    std::fs::create_dir(&dir).unwrap();
    let (got, _) = redirected(Some(preloaded(&m, &stats2)), &bin, &["print", "20000"], &dir);
    assert!(got == want);
    assert_eq!(std::fs::metadata(dir.join("out")).unwrap().len(), want.len() as u64);
    let s = direct_stats(&stats2);
    assert!(s.iter().any(|x| x.direct >= 50), "{s:?}");
}

/// A shell under the library juggling descriptors. Regressions: `exec 3>f` failed
/// with EBUSY (the library's own descriptors took the lowest free numbers, 3 and
/// up, and a program's `dup2` onto one of them is refused); and `echo one >&3`
/// (bash's builtin writes through glibc's `stdout`, with the kernel's offset, after
/// `dup2(3, 1)`) followed by `seq 1 3 >&3` lost "one": the fork handed the
/// description's stale private offset to the kernel. A direct description made
/// standard input, output or error is now shared (the kernel's offset is the
/// truth), and the library's descriptors live at 512 and up.
#[test]
fn shell_redirections_to_numbered_descriptors_keep_every_line() {
    let script = r#"cd "$1" || exit 1
exec 3>f
echo one >&3
printf 'two\n' >&3
seq 1 3 >&3
{ echo four; seq 5 6; echo seven; } >&3
exec 3>&-
exec 4>>g; echo a >&4; echo b >> g; echo c >&4; exec 4>&-
exec 5<>h; echo 123456 >&5; exec 5<&-
exec 6<h; read x <&6; exec 6<&-; echo "read $x" >> h
cat f g h"#;
    let m = Mount::new("direct-shell", "256M", "");
    let tmpfs = tempfile::Builder::new().prefix("ferrite-shell-").tempdir_in("/dev/shm").unwrap();
    let plain = run(Command::new("bash").arg("-c").arg(script).arg("bash").arg(tmpfs.path()));
    let stats = m.scratch().join("stats");
    let mut c = preloaded(&m, &stats);
    c.args(["bash", "-c", script, "bash"]).arg(&m.mnt);
    let direct = run(&mut c);
    assert_eq!(String::from_utf8_lossy(&direct.stderr), "", "errors under the library");
    assert_eq!(String::from_utf8_lossy(&direct.stdout), String::from_utf8_lossy(&plain.stdout));
}
