//! The `ferrite` command end to end: mkfs safety, import/export round trip, fsck exit
//! codes, pool ownership across processes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn ferrite() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
}

struct Pool(PathBuf);
impl Pool {
    fn new(tag: &str) -> Pool {
        let p =
            PathBuf::from(format!("/dev/shm/ferrite-cli-test-{tag}-{}.pool", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Pool(p)
    }
}
impl Drop for Pool {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn run(c: &mut Command) -> (i32, String, String) {
    let o = c.output().expect("spawn ferrite");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn diff_trees(a: &Path, b: &Path) {
    let mut ea: Vec<_> = std::fs::read_dir(a).unwrap().map(|e| e.unwrap().file_name()).collect();
    let mut eb: Vec<_> = std::fs::read_dir(b).unwrap().map(|e| e.unwrap().file_name()).collect();
    ea.sort();
    eb.sort();
    assert_eq!(ea, eb, "entries of {} and {}", a.display(), b.display());
    for n in ea {
        let (pa, pb) = (a.join(&n), b.join(&n));
        let (ma, mb) =
            (std::fs::symlink_metadata(&pa).unwrap(), std::fs::symlink_metadata(&pb).unwrap());
        assert_eq!(ma.file_type(), mb.file_type(), "{}", pa.display());
        if ma.is_dir() {
            diff_trees(&pa, &pb);
        } else if ma.file_type().is_symlink() {
            assert_eq!(std::fs::read_link(&pa).unwrap(), std::fs::read_link(&pb).unwrap());
        } else {
            assert_eq!(
                std::fs::read(&pa).unwrap(),
                std::fs::read(&pb).unwrap(),
                "{}",
                pa.display()
            );
            use std::os::unix::fs::MetadataExt;
            assert_eq!(ma.mode(), mb.mode(), "{}", pa.display());
            assert_eq!(ma.mtime(), mb.mtime(), "{}", pa.display());
        }
    }
}

#[test]
fn mkfs_refuses_overwrite_and_import_export_round_trips() {
    let pool = Pool::new("rt");
    let p = pool.0.to_str().unwrap();
    assert_eq!(run(ferrite().args(["mkfs", p, "--size", "64M"])).0, 0);
    let (code, _, err) = run(ferrite().args(["mkfs", p, "--size", "64M"]));
    assert_eq!(code, 1);
    assert!(err.contains("already exists and is a FerriteFS pool"), "{err}");
    // A tree with a symlink, an empty file, a sparse-ish file and nested dirs.
    let src = tempfile::tempdir().unwrap();
    let core = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ferrite-core/src");
    for e in std::fs::read_dir(&core).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), src.path().join(e.file_name())).unwrap();
    }
    std::fs::create_dir_all(src.path().join("a/b/c")).unwrap();
    std::fs::write(src.path().join("a/b/c/empty"), b"").unwrap();
    let mut big = vec![0u8; 3 * 1024 * 1024 + 17];
    for (i, b) in big.iter_mut().enumerate() {
        *b = (i * 31 % 251) as u8;
    }
    std::fs::write(src.path().join("a/big"), &big).unwrap();
    std::os::unix::fs::symlink("../big", src.path().join("a/b/link")).unwrap();
    let (code, out, err) =
        run(ferrite().args(["import", "--pool", p, src.path().to_str().unwrap(), "/tree"]));
    assert_eq!(code, 0, "{out}{err}");
    let dst = tempfile::tempdir().unwrap();
    let out_dir = dst.path().join("out");
    let (code, out, err) =
        run(ferrite().args(["export", "--pool", p, "/tree", out_dir.to_str().unwrap()]));
    assert_eq!(code, 0, "{out}{err}");
    diff_trees(src.path(), &out_dir);
    let o = ferrite().args(["cat", "--pool", p, "/tree/a/b/link"]).output().unwrap();
    assert!(o.status.success());
    assert!(o.stdout == big, "cat through a symlink returns the target's bytes");
    let (code, out, _) = run(ferrite().args(["fsck", p]));
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = run(ferrite().args(["info", p, "--json"]));
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["clean"], true);
    assert!(v["inodes_in_use"].as_u64().unwrap() > 10);
}

#[test]
fn fsck_exit_codes() {
    let pool = Pool::new("fsck");
    let p = pool.0.to_str().unwrap();
    assert_eq!(run(ferrite().args(["fsck", "/dev/shm/does-not-exist.pool"])).0, 8);
    assert_eq!(run(ferrite().args(["mkfs", p, "--size", "8M"])).0, 0);
    assert_eq!(run(ferrite().args(["fsck", p])).0, 0);
    // Zero both superblock copies: a foreign pool, errors left.
    let mut f = std::fs::OpenOptions::new().write(true).open(&pool.0).unwrap();
    f.write_all(&vec![0u8; 8192]).unwrap();
    drop(f);
    let (code, _, err) = run(ferrite().args(["fsck", p]));
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("not a FerriteFS pool"), "{err}");
}

#[test]
fn second_process_is_told_who_holds_the_pool() {
    let pool = Pool::new("own");
    let p = pool.0.to_str().unwrap();
    assert_eq!(run(ferrite().args(["mkfs", p, "--size", "8M"])).0, 0);
    // `put -` holds the pool mounted while it waits for standard input.
    let mut holder =
        ferrite().args(["put", "--pool", p, "-", "/x"]).stdin(Stdio::piped()).spawn().unwrap();
    // Until the holder has the pool (on a loaded machine it may take seconds to
    // start: a fixed number of short tries once ran out).
    let mut seen = String::new();
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_secs(120) {
        let (code, _, err) = run(ferrite().args(["ls", "--pool", p]));
        if code != 0 {
            seen = err;
            break;
        }
        // Our `ls` may have held the pool when the holder started: then the holder
        // was the one refused. Start it again.
        if holder.try_wait().unwrap().is_some() {
            holder = ferrite()
                .args(["put", "--pool", p, "-", "/x"])
                .stdin(Stdio::piped())
                .spawn()
                .unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(seen.contains("in use by pid"), "{seen}");
    assert!(seen.contains(&holder.id().to_string()), "{seen}");
    holder.stdin.take().unwrap().write_all(b"hello").unwrap();
    assert!(holder.wait().unwrap().success());
    let (code, out, _) = run(ferrite().args(["cat", "--pool", p, "/x"]));
    assert_eq!((code, out.as_str()), (0, "hello"));
}
