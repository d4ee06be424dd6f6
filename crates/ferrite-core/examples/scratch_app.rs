use ferrite_core::*;
use std::time::Instant;
fn main() -> Result<()> {
    let size: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(64);
    let n: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(2_000_000);
    let pool = "/dev/shm/scratch_app.pool";
    let _ = std::fs::remove_file(pool);
    let m = MmapMedium::create(pool.as_ref(), 1 << 30, &MapOptions::default())?;
    m.zero_nt(0, m.len());
    m.fence();
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0)?;
    let buf = vec![3u8; size];
    eprintln!("go");
    let t = Instant::now();
    for _ in 0..n {
        do_op(&fs, a.ino, &buf)?;
    }
    println!("append {size} B: {:.0} ns/op", t.elapsed().as_nanos() as f64 / n as f64);
    Ok(())
}

#[inline(never)]
fn do_op(fs: &Fs<MmapMedium>, ino: u64, buf: &[u8]) -> Result<()> {
    fs.append(ino, buf)?;
    fs.fsync(ino, false)
}
