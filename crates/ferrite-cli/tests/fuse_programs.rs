//! Real programs nobody here wrote, on a mounted pool: fio with data verification,
//! sqlite3 in WAL and DELETE journal modes, git (commit, clone, fsck), and tar / diff /
//! cp -a / rm -rf of a real source tree. Every test ends with a clean unmount and an
//! fsck of the pool; the mounts are released even when a test fails.

mod fuse_util;

use fuse_util::{run, Mount};
use std::fmt::Write as _;
use std::fs;
use std::path::Path;
use std::process::Command;

fn sh(dir: &Path, script: &str) -> String {
    let out = run(Command::new("bash")
        .arg("-euo")
        .arg("pipefail")
        .arg("-c")
        .arg(script)
        .current_dir(dir));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn finish(mut m: Mount) {
    m.umount();
    let (report, fsck) = m.check_pool();
    assert!(report.clean, "clean unmount expected");
    assert!(fsck.is_clean(), "fsck: {:?}", fsck.errors);
}

fn fio(dir: &Path, name: &str, args: &[&str]) -> String {
    let mut c = Command::new("fio");
    c.arg(format!("--name={name}"))
        .arg(format!("--directory={}", dir.display()))
        .args(["--ioengine=psync", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1"])
        .args(["--group_reporting", "--minimal", "--verify_state_save=0"])
        .args(args);
    let out = run(&mut c);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn fio_verified_random_and_sequential_writes() {
    let mut m = Mount::new("fio", "768M", "");
    let d = m.path("fio");
    fs::create_dir(&d).unwrap();
    // Random 4 KiB writes, four jobs, then every block read back and checked.
    fio(&d, "rand4k", &["--rw=randwrite", "--bs=4k", "--size=24M", "--numjobs=4"]);
    // Random sizes at unaligned offsets, with periodic fsync.
    fio(
        &d,
        "randmix",
        &[
            "--rw=randwrite",
            "--bsrange=512-96k",
            "--bs_unaligned=1",
            "--size=16M",
            "--numjobs=3",
            "--fsync=8",
        ],
    );
    // Sequential 1 MiB writes (the mount's max_write), two jobs.
    let seq = ["--rw=write", "--bs=1M", "--size=96M", "--numjobs=2"];
    fio(&d, "seq1m", &seq);
    // Survives a remount: verify the sequential files again without rewriting them.
    m.umount();
    m.mount("");
    let mut again: Vec<&str> = seq.to_vec();
    again.push("--verify_only=1");
    fio(&d, "seq1m", &again);
    finish(m);
}

fn sqlite(db: &Path, sql: &str) -> String {
    let out = run(Command::new("sqlite3").arg("-batch").arg("-bail").arg(db).arg(sql));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn sqlite_inserts(m: &Mount, mode: &str) {
    let db = m.path(&format!("{mode}.db"));
    let mut sql = format!("PRAGMA journal_mode={mode};\n");
    sql += "CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT UNIQUE, v BLOB, n INTEGER);\n";
    for i in 0..10_000u32 {
        // One transaction per insert: each one journals and syncs.
        writeln!(
            sql,
            "INSERT INTO t(k, v, n) VALUES('key-{i:05}', zeroblob({}), {i});",
            50 + i % 700
        )
        .unwrap();
    }
    let script = m.scratch().join(format!("{mode}.sql"));
    fs::write(&script, sql).unwrap();
    let out = run(Command::new("sqlite3")
        .arg("-batch")
        .arg("-bail")
        .arg(&db)
        .stdin(fs::File::open(&script).unwrap()));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), mode.to_lowercase());
    assert_eq!(sqlite(&db, "PRAGMA integrity_check;"), "ok");
    assert_eq!(sqlite(&db, "SELECT count(*), sum(n), sum(length(v)) FROM t;"), {
        let s: u64 = (0..10_000u64).map(|i| 50 + i % 700).sum();
        format!("10000|49995000|{s}")
    });
    // Updates and deletes in one big transaction, then a VACUUM.
    sqlite(&db, "BEGIN; UPDATE t SET n = n + 1 WHERE id % 3 = 0; DELETE FROM t WHERE id % 7 = 0; COMMIT; VACUUM;");
    assert_eq!(sqlite(&db, "PRAGMA integrity_check;"), "ok");
}

#[test]
fn sqlite3_wal_and_delete_journal_modes() {
    let mut m = Mount::new("sqlite", "512M", "");
    sqlite_inserts(&m, "WAL");
    sqlite_inserts(&m, "DELETE");
    m.umount();
    m.mount("");
    for mode in ["WAL", "DELETE"] {
        let db = m.path(&format!("{mode}.db"));
        assert_eq!(sqlite(&db, "PRAGMA integrity_check;"), "ok", "{mode} after remount");
        let left = 10_000 - 10_000 / 7;
        assert_eq!(
            sqlite(&db, "SELECT count(*) FROM t;"),
            left.to_string(),
            "{mode} rows after remount"
        );
    }
    finish(m);
}

/// A deterministic tree of `n` files in nested directories (some executable, some
/// symlinks, some empty).
fn make_tree(root: &Path, n: usize) {
    for i in 0..n {
        let dir = root.join(format!("src/mod{:02}/sub{}", i % 37, i % 5));
        fs::create_dir_all(&dir).unwrap();
        let p = dir.join(format!("file{i:04}.txt"));
        let mut body = String::new();
        for line in 0..(i % 60) {
            writeln!(body, "line {line} of file {i}: {}", "abcdefghij".repeat(line % 9)).unwrap();
        }
        fs::write(&p, body).unwrap();
        if i % 50 == 0 {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
        if i % 97 == 0 {
            std::os::unix::fs::symlink(format!("file{i:04}.txt"), dir.join(format!("link{i:04}")))
                .unwrap();
        }
    }
}

#[test]
fn git_commit_clone_fsck() {
    let m = Mount::new("git", "512M", "");
    let home = m.scratch();
    let repo = m.path("repo");
    fs::create_dir(&repo).unwrap();
    make_tree(&repo, 1200);
    let git = |dir: &Path, args: &[&str]| -> String {
        let out = run(Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("HOME", &home)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "Ferrite Test")
            .env("GIT_AUTHOR_EMAIL", "test@ferrite.invalid")
            .env("GIT_COMMITTER_NAME", "Ferrite Test")
            .env("GIT_COMMITTER_EMAIL", "test@ferrite.invalid"));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "a tree of 1200 files"]);
    // Second commit touching a tenth of the files, then repack everything.
    for i in (0..1200).step_by(10) {
        let p = repo.join(format!("src/mod{:02}/sub{}/file{i:04}.txt", i % 37, i % 5));
        let mut s = fs::read_to_string(&p).unwrap();
        s.push_str("changed\n");
        fs::write(&p, s).unwrap();
    }
    git(&repo, &["commit", "-q", "-a", "-m", "change a tenth"]);
    git(&repo, &["gc", "-q"]);
    assert_eq!(git(&repo, &["status", "--porcelain"]), "", "work tree clean after commit");
    let files = git(&repo, &["ls-files"]).lines().count();
    assert!(files >= 1200, "{files} files tracked");
    git(&repo, &["fsck", "--full", "--strict"]);
    git(m.mnt.as_path(), &["clone", "-q", "--no-hardlinks", "repo", "clone"]);
    let clone = m.path("clone");
    git(&clone, &["fsck", "--full", "--strict"]);
    assert_eq!(git(&clone, &["rev-parse", "HEAD"]), git(&repo, &["rev-parse", "HEAD"]));
    assert_eq!(git(&clone, &["status", "--porcelain"]), "");
    sh(&m.mnt, "diff -r --exclude=.git repo clone");
    finish(m);
}

#[test]
fn tar_diff_cp_rm_of_a_source_tree() {
    let m = Mount::new("tar", "1G", "");
    let scratch = m.scratch();
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    // A snapshot of this project's sources plus entries tar must get right: symlinks,
    // hard links, odd modes, an empty directory, a sparse file, long names.
    let extra = scratch.join("extra");
    fs::create_dir_all(extra.join("empty/dir")).unwrap();
    sh(
        &extra,
        "printf 'x%.0s' $(seq 1 5000) > hard1 && ln hard1 hard2 && ln -s hard1 sym && \
                ln -s /nonexistent/target dangling && chmod 4750 hard1 && \
                touch -d 2001-02-03 hard2 && truncate -s 50M sparse && printf tail >> sparse && \
                touch \"$(printf 'n%.0s' $(seq 1 200))\" && mkdir -m 1777 sticky",
    );
    let tarball = scratch.join("src.tar");
    let t = tarball.display();
    sh(
        &ws,
        &format!(
            "tar --exclude=./target --exclude=./.git -cf {t} . && tar -C {} -rf {t} --sparse extra",
            scratch.display()
        ),
    );
    let reference = scratch.join("ref");
    fs::create_dir(&reference).unwrap();
    sh(&reference, &format!("tar -xpf {t}"));
    let src = m.path("src");
    fs::create_dir(&src).unwrap();
    sh(&src, &format!("tar -xpf {t}"));
    let files: usize = sh(&src, "find . -type f | wc -l").trim().parse().unwrap();
    assert!(files > 50, "only {files} files extracted");
    // Contents, then metadata (mode, owner, mtime, size, link targets) against the archive.
    sh(&m.mnt, &format!("diff -r --no-dereference {} src", reference.display()));
    sh(&src, &format!("tar -df {t}"));
    // cp -a keeps modes, times, links; rm -rf removes everything.
    sh(&m.mnt, "cp -a src copy && diff -r --no-dereference src copy");
    let meta = "find . -printf '%P %y %m %s %T@ %l %n\\n' | sort";
    assert_eq!(sh(&src, meta), sh(&m.path("copy"), meta), "cp -a metadata");
    sh(&m.mnt, "rm -rf src copy");
    assert_eq!(fs::read_dir(&m.mnt).unwrap().count(), 0);
    finish(m);
}
