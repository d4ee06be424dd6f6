//! Time of an atomic mapping's commit (`Fs::persist_atomic`) of a 1 MiB mapping
//! after storing 8 bytes into N of its pages, with the kernel's write tracking
//! (default) or comparison (`FERRITE_WRITE_TRACKING=0`).
//! `cargo run --release -p ferrite-core --example atomic_commit -- [N...]`
#![allow(unsafe_code)]
use ferrite_core::*;
use std::time::Instant;

fn main() -> Result<()> {
    let ns: Vec<usize> = std::env::args().skip(1).filter_map(|s| s.parse().ok()).collect();
    let ns = if ns.is_empty() { vec![1, 16, 256] } else { ns };
    let pool = format!("/dev/shm/atomic-commit-{}.pool", std::process::id());
    let m = MmapMedium::create(pool.as_ref(), 256 << 20, &MapOptions::default())?;
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    let f = fs.create(fs.root(), b"f", 0o644, 0, 0)?.ino;
    let len = 1 << 20;
    fs.write(f, 0, &vec![7u8; len])?;
    for (round_base, &n) in ns.iter().enumerate() {
        let round_base = round_base as u64 + 1;
        let a = fs.mmap_atomic(f, len, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let stride = len / 4096 / n * 4096;
        let rounds: u64 = std::env::var("ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
        let t = Instant::now();
        for i in 0..rounds {
            // Values no earlier mapping stored (a store of the same bytes changes nothing).
            let v = (n as u64) << 48 | (round_base << 24) | i;
            for k in 0..n {
                let off = k * stride + (i as usize % 500) * 8;
                // SAFETY: an aligned 8-byte store into the live mapping.
                unsafe { std::ptr::write_volatile((a + off) as *mut u64, v) };
            }
            fs.persist_atomic(a, len).expect("an atomic mapping")?;
        }
        let per = t.elapsed().as_nanos() as f64 / rounds as f64 / 1000.0;
        let tracked = fs.atomic_tracked(a).unwrap_or(false);
        println!(
            "{n:>4} pages: {per:.1} us per store round + commit (tracked at the end: {tracked})"
        );
        fs.munmap_file(a, len).expect("mapped")?;
    }
    drop(fs.unmount()?);
    std::fs::remove_file(&pool).ok();
    Ok(())
}
