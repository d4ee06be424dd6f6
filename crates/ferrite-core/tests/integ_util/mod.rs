//! Shared by the integrity tests: small seeded pools with known contents, and a
//! reader that compares every file with them.
#![allow(dead_code)]

use crate::common::Rng;
use ferrite_core::*;
use std::collections::BTreeMap;

/// Expected contents: path -> bytes (files), or the target (symlinks).
pub type Model = BTreeMap<String, Vec<u8>>;

/// A cleanly unmounted pool of `size` bytes built by a seeded workload: files of
/// whole pages and of embedded pieces, a subdirectory, a long symlink, an xattr,
/// a hard link, an overwrite and a truncate. Returns the image and the model.
pub fn build(seed: u64, size: u64) -> (Vec<u8>, Model) {
    let mut rng = Rng(seed);
    let m = SimMedium::new(size);
    let fs = Fs::mkfs(m, &MkfsOptions { shards: 2, inodes: 64, ..Default::default() }).unwrap();
    let root = fs.root();
    let mut model = Model::new();
    let d = fs.mkdir(root, b"d", 0o755, 0, 0).unwrap().ino;
    let nfiles = 3 + rng.below(4);
    for k in 0..nfiles {
        let (dir, dname) = if k % 2 == 0 { (root, "") } else { (d, "/d") };
        let name = format!("f{k}");
        let ino = fs.create(dir, name.as_bytes(), 0o644, 0, 0).unwrap().ino;
        let len = match rng.below(4) {
            0 => 1 + rng.below(2000) as usize,
            1 => 4096 * (1 + rng.below(3) as usize),
            _ => 1 + rng.below(20_000) as usize,
        };
        let mut data = rng.bytes(len);
        fs.write(ino, 0, &data).unwrap();
        if len > 5000 && rng.below(2) == 0 {
            // An overwrite inside the file (embedded or copy on write).
            let off = rng.below(len as u64 - 100) as usize;
            let n = (1 + rng.below(4500) as usize).min(len - off);
            let patch = rng.bytes(n);
            fs.write(ino, off as u64, &patch).unwrap();
            data[off..off + n].copy_from_slice(&patch);
        }
        if rng.below(4) == 0 {
            let n = rng.below(len as u64) as usize;
            fs.setattr(ino, &SetAttr { size: Some(n as u64), ..Default::default() }).unwrap();
            data.truncate(n);
        }
        if rng.below(3) == 0 {
            fs.setxattr(ino, b"user.k", &rng.bytes(40), XattrSet::Any).unwrap();
        }
        if rng.below(3) == 0 {
            fs.compact(ino).unwrap(); // thorough GC: a new log, a new epoch
        }
        model.insert(format!("{dname}/{name}"), data.clone());
        if k == 0 {
            fs.link(ino, d, b"hard").unwrap();
            model.insert("/d/hard".into(), data);
        }
    }
    let target: Vec<u8> = (0..3000).map(|k| b'a' + (k % 26) as u8).collect();
    fs.symlink(root, b"long", &target, 0, 0).unwrap();
    model.insert("/long".into(), target);
    fs.symlink(d, b"short", b"f0", 0, 0).unwrap();
    model.insert("/d/short".into(), b"f0".to_vec());
    let img = fs.unmount().unwrap().current_image();
    (img, model)
}

/// Read every path of `model` through `fs`: Ok(true) when all match, Ok(false)
/// when some read failed with an error, Err(path) when a read returned bytes
/// that differ from the model (damage returned as good).
pub fn read_all<M: Medium>(fs: &Fs<M>, model: &Model) -> std::result::Result<bool, String> {
    let mut all_ok = true;
    for (path, want) in model {
        let ino = match fs.resolve(path.as_bytes(), false) {
            Ok(i) => i,
            Err(_) => {
                all_ok = false;
                continue;
            }
        };
        let got = match fs.getattr(ino) {
            Ok(a) if a.ftype == FileType::Symlink => fs.readlink(ino),
            Ok(a) if a.ftype == FileType::Regular => {
                let mut buf = vec![0u8; want.len() + 1];
                fs.read(ino, 0, &mut buf).map(|n| {
                    buf.truncate(n);
                    buf
                })
            }
            Ok(_) => Err(Error::corrupt("type changed")),
            Err(e) => Err(e),
        };
        match got {
            Ok(b) if &b == want => {}
            // A different length or type is visible damage only if no error
            // says so; a name resolving to other content is damage as good.
            Ok(_) => return Err(path.clone()),
            Err(_) => all_ok = false,
        }
    }
    Ok(all_ok)
}
