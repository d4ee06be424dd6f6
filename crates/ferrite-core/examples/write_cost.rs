//! Write throughput by write size (docs/INTEGRITY.md): overwrites of a 64 MiB range
//! of one file in a pool on /dev/shm, best of 7 rounds.
//! `cargo run --release -p ferrite-core --example write_cost`
use ferrite_core::*;
use std::time::Instant;
fn main() {
    let path = format!("/dev/shm/ferrite-write-cost-{}.pool", std::process::id());
    let path = std::path::Path::new(&path);
    let m = MmapMedium::create(path, 192 << 20, &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions::default()).unwrap();
    let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    for size in [16u64 << 10, 64 << 10, 1 << 20] {
        let chunk: Vec<u8> = (0..size as u32).map(|k| (k * 31 % 251) as u8).collect();
        let mut best = f64::MAX;
        for _round in 0..7 {
            let t = Instant::now();
            for k in 0..(64 << 20) / size {
                fs.write(ino, k * size, &chunk).unwrap();
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("{:>8} B writes: {:.0} MiB/s (best of 7, 64 MiB each)", size, 64.0 / best);
    }
    drop(fs.unmount().unwrap());
    std::fs::remove_file(path).unwrap();
}
