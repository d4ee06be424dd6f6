use ferrite_core::*;
use std::time::Instant;
fn main() -> Result<()> {
    let size: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(4096);
    let n: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let pool = "/dev/shm/scratch_w.pool";
    let _ = std::fs::remove_file(pool);
    let m = MmapMedium::create(pool.as_ref(), 1 << 30, &MapOptions::default())?;
    m.zero_nt(0, m.len());
    m.fence();
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0)?;
    let big = vec![1u8; 1 << 20];
    let file = 64u64 << 20;
    for off in (0..file).step_by(big.len()) {
        fs.write(a.ino, off, &big)?;
    }
    let buf = vec![3u8; size as usize];
    let slots = file / size;
    let mut x = 88172645463325252u64;
    eprintln!("go");
    let t = Instant::now();
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        fs.write(a.ino, (x % slots) * size, &buf)?;
        fs.fsync(a.ino, false)?;
    }
    println!("write {size} B: {:.0} ns/op", t.elapsed().as_nanos() as f64 / n as f64);
    let _ = std::fs::remove_file(pool);
    Ok(())
}
