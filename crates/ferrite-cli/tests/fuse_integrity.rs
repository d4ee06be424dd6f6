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
