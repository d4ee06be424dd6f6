//! Profile target: N small appends (+fsync) to one file on a simulated-free real pool.
use ferrite_core::*;
fn main() -> Result<()> {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let sz: usize = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(64);
    let pool = "/dev/shm/append_profile.pool";
    let _ = std::fs::remove_file(pool);
    let m = MmapMedium::create(pool.as_ref(), 256 << 20, &MapOptions::default())?;
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0)?;
    let small = vec![1u8; sz];
    for _ in 0..n {
        fs.append(a.ino, &small)?;
        fs.fsync(a.ino, false)?;
    }
    fs.unmount()?;
    std::fs::remove_file(pool).ok();
    Ok(())
}
