//! Read verification through the FUSE mount: a damaged data page reads as EIO
//! (`-o verify=always` at every read, the default `first-touch` after a remount),
//! the file's other pages read, and nothing reaches the reader as good data.

mod fuse_util;

use fuse_util::{ferrite, Mount};
use std::io::{Read, Seek, SeekFrom, Write};
use std::process::Command;

fn page(k: u8) -> Vec<u8> {
    (0..4096u32).map(|i| (i as u8).wrapping_mul(13).wrapping_add(k)).collect()
}

/// Read 4 KiB at page `pg` of `path`.
fn read_page(path: &std::path::Path, pg: u64) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    f.seek(SeekFrom::Start(pg * 4096))?;
    let mut b = vec![0u8; 4096];
    f.read_exact(&mut b)?;
    Ok(b)
}

fn damage(pool: &std::path::Path, off: u64) {
    let mut f = std::fs::OpenOptions::new().write(true).open(pool).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(b"\xde\xad").unwrap();
}

#[test]
fn a_damaged_page_reads_as_eio_through_the_mount() {
    let mut m = Mount::new("integrity", "32M", "");
    let data: Vec<u8> = (0..3).flat_map(page).collect();
    std::fs::write(m.path("f"), &data).unwrap();
    m.umount();
    let out = Command::new(ferrite())
        .args(["bmap", "/f", "--json", "--pool"])
        .arg(&m.pool)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let base = v[0]["pool_offset"].as_u64().unwrap();
    assert_eq!(v[0]["len"].as_u64(), Some(3 * 4096));

    // verify=always: a page read before the damage fails after it.
    m.mount("verify=always,direct_io");
    assert_eq!(read_page(&m.path("f"), 1).unwrap(), page(1));
    damage(&m.pool, base + 4096 + 10);
    let e = read_page(&m.path("f"), 1).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(read_page(&m.path("f"), 0).unwrap(), page(0));
    assert_eq!(read_page(&m.path("f"), 2).unwrap(), page(2));
    m.umount();

    // The default (first-touch) after a remount: the first read checks.
    m.mount("");
    let e = std::fs::read(m.path("f")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(read_page(&m.path("f"), 2).unwrap(), page(2));
    m.umount();
    let out = Command::new(ferrite()).arg("scrub").arg(&m.pool).output().unwrap();
    assert_eq!(out.status.code(), Some(4));
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("/f") && s.contains("4096..8192"), "{s}");
    let _ = std::fs::remove_file(&m.pool);
}

/// `ferrite scrub --mount DIR` checks a pool in use: clean while writers change files
/// beside it (no false alarm from a page mid-change), then names the damaged file
/// and range, exit 4, and the mount keeps serving.
#[test]
fn scrub_of_a_mounted_pool_finds_damage_without_downtime() {
    let mut m = Mount::new("scrub-live", "64M", "");
    for k in 0..20u8 {
        std::fs::write(m.path(&format!("f{k}")), page(k).repeat(4)).unwrap();
    }
    std::fs::create_dir(m.path("d")).unwrap();
    std::fs::write(m.path("d/victim"), (0..3).flat_map(page).collect::<Vec<_>>()).unwrap();
    m.umount();
    let out = Command::new(ferrite())
        .args(["bmap", "/d/victim", "--json", "--pool"])
        .arg(&m.pool)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let base = v[0]["pool_offset"].as_u64().unwrap();
    m.mount("");
    let scrub = || {
        let o = Command::new(ferrite()).args(["scrub", "--json", "--mount"]).arg(&m.mnt).output();
        let o = o.unwrap();
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
        (o.status.code(), v)
    };
    // Writers overwrite and replace files while three scrubs run.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let k = n % 20;
                std::fs::write(m.path(&format!("f{k}")), page(n as u8).repeat(1 + n as usize % 5))
                    .unwrap();
                n += 1;
            }
        });
        for _ in 0..3 {
            let (code, v) = scrub();
            assert_eq!(code, Some(0), "clean pool in use: {v}");
            assert!(v["data_pages_checked"].as_u64().unwrap() >= 3, "{v}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    damage(&m.pool, base + 2 * 4096 + 7);
    let (code, v) = scrub();
    assert_eq!(code, Some(4), "{v}");
    let d = &v["damage"][0];
    assert_eq!(d["path"], "/d/victim", "{v}");
    assert_eq!(d["range"], serde_json::json!([8192, 12288]), "{v}");
    assert_eq!(v["damage"].as_array().unwrap().len(), 1, "{v}");
    // The mount kept serving.
    assert_eq!(read_page(&m.path("d/victim"), 0).unwrap(), page(0));
    m.umount();
}

/// A mount without direct access cannot be scrubbed live: exit 8 and a message
/// that says what to do, and the mount is untouched.
#[test]
fn scrub_of_a_mount_without_direct_access_is_an_operational_error() {
    let mut m = Mount::new("scrub-nodirect", "32M", "nodirect");
    std::fs::write(m.path("a"), b"kept").unwrap();
    let o = Command::new(ferrite()).args(["scrub", "--mount"]).arg(&m.mnt).output().unwrap();
    assert_eq!(o.status.code(), Some(8));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("offers direct access") && err.contains("ferrite scrub POOL"), "{err}");
    assert_eq!(std::fs::read(m.path("a")).unwrap(), b"kept");
    m.umount();
}
