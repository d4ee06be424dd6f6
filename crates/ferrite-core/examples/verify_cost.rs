//! Cost of read verification (docs/INTEGRITY.md): 4 KiB reads at random page
//! offsets of a 128 MiB file in a pool on /dev/shm, under verify=off,
//! first-touch (the first read of every page, then reads of verified pages) and
//! always. `cargo run --release -p ferrite-core --example verify_cost [POOL]`.

use ferrite_core::*;
use std::time::Instant;

const FILE: u64 = 128 << 20;
const READS: usize = 200_000;

fn rng(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

fn main() {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("/dev/shm/ferrite-verify-cost-{}.pool", std::process::id()));
    let path = std::path::Path::new(&path);
    let _ = std::fs::remove_file(path);
    let m = MmapMedium::create(path, FILE + (64 << 20), &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions::default()).unwrap();
    let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    let chunk: Vec<u8> = (0..1 << 20).map(|k: u32| (k * 31 % 251) as u8).collect();
    let t = Instant::now();
    for k in 0..FILE >> 20 {
        fs.write(ino, k << 20, &chunk).unwrap();
    }
    let s = t.elapsed().as_secs_f64();
    println!("setup: 1 MiB writes (one fence each) at {:.0} MiB/s", (FILE >> 20) as f64 / s);
    println!("page CRC kernel: {}", ferrite_core::log::page_crc_kernel());
    let pg = vec![7u8; 4096];
    let t = Instant::now();
    let mut x = 0u32;
    for _ in 0..100_000 {
        x ^= ferrite_core::log::page_crc(x, std::hint::black_box(&pg));
    }
    println!("page CRC: {:.0} ns per 4 KiB ({x:x})", t.elapsed().as_nanos() as f64 / 1e5);
    let mut m = fs.unmount().unwrap();
    let pages = FILE / 4096;
    let mut buf = vec![0u8; 4096];
    // Rounds alternate the modes (the machine may be shared): min and median.
    let mut res: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for round in 0..7u64 {
        for mode in [VerifyMode::Off, VerifyMode::FirstTouch, VerifyMode::Always] {
            let fs = Fs::mount(m, &MountOptions { verify: mode, ..Default::default() }).unwrap();
            if mode == VerifyMode::FirstTouch {
                // Every page once, in a random order: each read verifies.
                let mut order: Vec<u64> = (0..pages).collect();
                let mut r = rng(7 + round);
                for i in (1..order.len()).rev() {
                    order.swap(i, (r() % (i as u64 + 1)) as usize);
                }
                let t = Instant::now();
                for &p in &order {
                    fs.read(ino, p * 4096, &mut buf).unwrap();
                }
                let ns = t.elapsed().as_nanos() as f64 / pages as f64;
                res.entry("first-touch, first read of a page").or_default().push(ns);
            }
            let mut r = rng(42 + round);
            let t = Instant::now();
            for _ in 0..READS {
                fs.read(ino, (r() % pages) * 4096, &mut buf).unwrap();
            }
            let name = match mode {
                VerifyMode::Off => "off",
                VerifyMode::FirstTouch => "first-touch, page already verified",
                VerifyMode::Always => "always",
            };
            res.entry(name).or_default().push(t.elapsed().as_nanos() as f64 / READS as f64);
            m = fs.unmount().unwrap();
        }
    }
    for (name, mut v) in res {
        v.sort_by(f64::total_cmp);
        println!(
            "{name:<36} min {:>6.0} ns, median {:>6.0} ns per 4 KiB read",
            v[0],
            v[v.len() / 2]
        );
    }
    drop(m);
    std::fs::remove_file(path).unwrap();
}
