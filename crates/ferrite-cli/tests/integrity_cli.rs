//! Exit codes and output of `ferrite fsck` (-n, default, --repair), `ferrite scrub`,
//! `ferrite bmap` and `ferrite blocks` on damaged pools (docs/INTEGRITY.md).

use ferrite_core::layout::Superblock;
use ferrite_core::{MapOptions, Medium, MmapMedium};
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn ferrite() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
}

struct Pool(PathBuf);
impl Pool {
    fn new(tag: &str) -> Pool {
        let p = PathBuf::from(format!("/dev/shm/ferrite-integ-{tag}-{}.pool", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Pool(p)
    }
    fn s(&self) -> &str {
        self.0.to_str().unwrap()
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

/// A pool with /x (10,000 bytes: two data pages and an embedded tail) and /d/y.
fn pool(tag: &str) -> (Pool, Vec<u8>) {
    let p = Pool::new(tag);
    assert_eq!(run(ferrite().args(["mkfs", p.s(), "--size", "16M"])).0, 0);
    let data: Vec<u8> = (0..10_000u32).map(|k| (k * 7 % 251) as u8).collect();
    let host = p.0.with_extension("src");
    std::fs::write(&host, &data).unwrap();
    let (c, o, e) = run(ferrite().args(["put", "--pool", p.s(), host.to_str().unwrap(), "/x"]));
    assert_eq!(c, 0, "{o}{e}");
    assert_eq!(run(ferrite().args(["mkdir", "--pool", p.s(), "/d"])).0, 0);
    let (c, _, e) = run(ferrite().args(["put", "--pool", p.s(), host.to_str().unwrap(), "/d/y"]));
    assert_eq!(c, 0, "{e}");
    std::fs::remove_file(host).unwrap();
    (p, data)
}

/// Raw access to the pool file (through the persistence module).
fn medium(p: &Pool) -> MmapMedium {
    MmapMedium::open(&p.0, &MapOptions::default()).unwrap()
}

fn poke(p: &Pool, off: u64, bytes: &[u8]) {
    let m = medium(p);
    m.write(off, bytes);
    m.flush(off, bytes.len() as u64);
    m.fence();
}

fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn bmap_and_blocks_describe_where_bytes_live() {
    let (p, _) = pool("bmap");
    let (c, out, e) = run(ferrite().args(["bmap", "/x", "--pool", p.s(), "--json"]));
    assert_eq!(c, 0, "{e}");
    let v = json(&out);
    let ext = v.as_array().unwrap();
    let data: Vec<_> = ext.iter().filter(|x| x["kind"] == "data").collect();
    let emb: Vec<_> = ext.iter().filter(|x| x["kind"] == "embedded").collect();
    assert_eq!(data.len(), 1, "{out}");
    assert_eq!((data[0]["file_offset"].as_u64(), data[0]["len"].as_u64()), (Some(0), Some(8192)));
    assert_eq!(emb.len(), 1, "{out}");
    assert_eq!((emb[0]["file_offset"].as_u64(), emb[0]["len"].as_u64()), (Some(8192), Some(1808)));
    let (c, out, _) = run(ferrite().args(["blocks", p.s(), "--json"]));
    assert_eq!(c, 0);
    let v = json(&out);
    let owners: Vec<&str> =
        v.as_array().unwrap().iter().map(|r| r["owner"].as_str().unwrap()).collect();
    for o in ["superblock", "journal", "inode-table", "checkpoint", "log", "data"] {
        assert!(owners.contains(&o), "{o} missing: {out}");
    }
    let pool_block = data[0]["pool_offset"].as_u64().unwrap() / 4096;
    assert!(
        v.as_array().unwrap().iter().any(|r| r["owner"] == "data"
            && r["start"].as_u64() == Some(pool_block)
            && r["len"].as_u64() == Some(2)),
        "{out}"
    );
    assert_eq!(run(ferrite().args(["bmap", "/nope", "--pool", p.s()])).0, 1);
}

#[test]
fn a_damaged_superblock_copy_is_reported_then_rewritten_from_its_twin() {
    let (p, _) = pool("sb");
    assert_eq!(run(ferrite().args(["fsck", p.s()])).0, 0);
    assert_eq!(run(ferrite().args(["scrub", p.s()])).0, 0);
    poke(&p, 40, &[0xff; 8]);
    let (c, out, _) = run(ferrite().args(["fsck", "-n", p.s()]));
    assert_eq!(c, 4, "{out}");
    assert!(out.contains("copy 0 is damaged"), "{out}");
    assert_eq!(run(ferrite().args(["scrub", p.s()])).0, 4, "-n changed nothing");
    let (c, out, _) = run(ferrite().args(["fsck", p.s()]));
    assert_eq!(c, 1, "{out}");
    assert_eq!(run(ferrite().args(["fsck", p.s()])).0, 0);
    // A stale copy (valid, but different) is reported too.
    let m = medium(&p);
    let mut b = [0u8; 256];
    m.read(4096, &mut b);
    let sb = Superblock::decode(&b).unwrap();
    let stale = Superblock { mkfs_time_ns: sb.mkfs_time_ns + 1, ..sb }.encode();
    drop(m);
    poke(&p, 4096, &stale);
    let (c, out, _) = run(ferrite().args(["fsck", "-y", p.s()]));
    assert_eq!(c, 1, "{out}");
    assert!(out.contains("differs"), "{out}");
    assert_eq!(run(ferrite().args(["fsck", "-y", p.s()])).0, 0, "idempotent");
}

/// Put the root's log tail back to `old_tail` in its slot and in the slot's
/// replica: a lost update, as a bug would make it, not damage a copy reveals.
fn lose_root_update(p: &Pool, geo: &ferrite_core::layout::Geometry, old_tail: u64) {
    poke(p, geo.slot_off(1) + 16, &old_tail.to_le_bytes());
    let m = medium(p);
    let mut slot = [0u8; 64];
    m.read(geo.slot_off(1), &mut slot);
    drop(m);
    let rep = ferrite_core::layout::replica_of(&slot);
    poke(p, geo.slot_replica_off(1).unwrap(), &rep);
}

#[test]
fn repair_links_orphans_into_lost_and_found() {
    let p = Pool::new("orphan");
    assert_eq!(run(ferrite().args(["mkfs", p.s(), "--size", "16M"])).0, 0);
    assert_eq!(run(ferrite().args(["mkdir", "--pool", p.s(), "/a"])).0, 0);
    // Remember the root's log tail, create /b, then put the old tail back: /b's
    // inode is in use and nothing names it (a lost update of the root's log).
    let m = medium(&p);
    let mut b = [0u8; 256];
    m.read(0, &mut b);
    let geo = Superblock::decode(&b).unwrap().geometry();
    let tail_off = geo.slot_off(1) + 16;
    let old_tail = m.load_u64(tail_off);
    drop(m);
    let (c, _, e) = run(ferrite().args(["mkdir", "--pool", p.s(), "/b"]));
    assert_eq!(c, 0, "{e}");
    let new_tail = medium(&p).load_u64(tail_off);
    // Put back in the slot alone, the old tail is damage its replica undoes.
    poke(&p, tail_off, &old_tail.to_le_bytes());
    let (c, out, _) = run(ferrite().args(["fsck", p.s()]));
    assert_eq!(c, 1, "{out}");
    assert!(out.contains("inode 1: slot restored from its replica"), "{out}");
    assert_eq!(medium(&p).load_u64(tail_off), new_tail);
    // Put back in both copies, it is a lost update: fsck cannot tell.
    lose_root_update(&p, &geo, old_tail);
    let (c, out, _) = run(ferrite().args(["fsck", p.s()]));
    assert_eq!(c, 4, "{out}");
    assert!(out.contains("unreachable") || out.contains("link count"), "{out}");
    // The orphan directory is adopted by /lost+found; a second repair finds nothing.
    let (c, out, _) = run(ferrite().args(["fsck", "--repair", p.s()]));
    assert_eq!(c, 1, "{out}");
    assert!(out.contains("linked as /lost+found/#"), "{out}");
    let (c, out, _) = run(ferrite().args(["fsck", "--repair", p.s()]));
    assert_eq!(c, 0, "second repair: {out}");
    assert_eq!(run(ferrite().args(["mkdir", "--pool", p.s(), "/lost+found/x"])).0, 0);
    let (c, out, _) = run(ferrite().args(["ls", "--pool", p.s(), "/lost+found"]));
    assert_eq!(c, 0);
    assert!(out.contains('#') && out.contains('x'), "{out}");
    assert_eq!(run(ferrite().args(["fsck", p.s()])).0, 0);

    // A file: linked into /lost+found, and a second repair finds nothing.
    let p = Pool::new("orphan-file");
    assert_eq!(run(ferrite().args(["mkfs", p.s(), "--size", "16M"])).0, 0);
    let m = medium(&p);
    let old_tail = m.load_u64(tail_off);
    drop(m);
    let (c, _, e) = run(ferrite().args(["put", "--pool", p.s(), "/etc/hostname", "/f"]));
    assert_eq!(c, 0, "{e}");
    lose_root_update(&p, &geo, old_tail);
    assert_eq!(run(ferrite().args(["fsck", p.s()])).0, 4);
    let (c, out, _) = run(ferrite().args(["fsck", "-y", p.s()]));
    assert_eq!(c, 1, "{out}");
    assert!(out.contains("/lost+found/#"), "{out}");
    let (c, out, _) = run(ferrite().args(["fsck", "-y", p.s()]));
    assert_eq!(c, 0, "second repair: {out}");
    let (c, out, _) = run(ferrite().args(["ls", "--pool", p.s(), "/lost+found"]));
    assert_eq!(c, 0);
    assert!(out.contains('#'), "{out}");
}

#[test]
fn scrub_names_damaged_data_and_repair_keeps_it() {
    let (p, data) = pool("data");
    let (_, out, _) = run(ferrite().args(["bmap", "/d/y", "--pool", p.s(), "--json"]));
    let v = json(&out);
    let off = v[0]["pool_offset"].as_u64().unwrap();
    poke(&p, off + 4096 + 100, b"\x00\x01\x02");
    let (c, out, _) = run(ferrite().args(["scrub", p.s(), "--json"]));
    assert_eq!(c, 4, "{out}");
    let v = json(&out);
    let d = &v["damage"][0];
    assert_eq!(d["path"], "/d/y", "{out}");
    assert_eq!(d["range"], serde_json::json!([4096, 8192]), "{out}");
    // Reads of the damaged page fail with EIO; the others work.
    let (c, _, e) = run(ferrite().args(["cat", "--pool", p.s(), "/d/y"]));
    assert_ne!(c, 0);
    assert!(e.contains("input/output error"), "{e}");
    let o = ferrite().args(["cat", "--pool", p.s(), "/x"]).output().unwrap();
    assert!(o.status.success());
    assert!(o.stdout == data, "undamaged file reads back");
    // Repair cannot fix data without a copy: errors left, the file kept as it is.
    let (c, out, _) = run(ferrite().args(["fsck", "--repair", p.s()]));
    assert_eq!(c, 4, "{out}");
    assert!(out.contains("/d/y") && out.contains("4096..8192"), "{out}");
    let m = medium(&p);
    let mut b = [0u8; 3];
    m.read(off + 4096 + 100, &mut b);
    assert_eq!(&b, b"\x00\x01\x02", "never zeroed");
    drop(m);
    assert_eq!(run(ferrite().args(["fsck", "-y", p.s()])).0, 4);
}

#[test]
fn scrub_of_a_pool_in_use_is_an_operational_error() {
    let (p, _) = pool("busy");
    let mut holder =
        ferrite().args(["put", "--pool", p.s(), "-", "/z"]).stdin(Stdio::piped()).spawn().unwrap();
    let t0 = std::time::Instant::now();
    let mut last = (0, String::new(), String::new());
    while t0.elapsed() < std::time::Duration::from_secs(120) {
        last = run(ferrite().args(["scrub", p.s()]));
        if last.0 != 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(last.0, 8, "{:?}", last);
    assert!(last.2.contains("in use"), "{}", last.2);
    assert_eq!(run(ferrite().args(["fsck", p.s()])).0, 8);
    drop(holder.stdin.take());
    holder.wait().unwrap();
    assert_eq!(run(ferrite().args(["scrub", p.s()])).0, 0);
}
