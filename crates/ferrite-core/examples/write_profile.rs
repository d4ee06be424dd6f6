//! Profile target: N random 4 KiB overwrites (+fsync) in a 64 MiB file.
use ferrite_core::*;
fn main() -> Result<()> {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let pool = "/dev/shm/write_profile.pool";
    let _ = std::fs::remove_file(pool);
    let m = MmapMedium::create(pool.as_ref(), 512 << 20, &MapOptions::default())?;
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0)?;
    fs.fallocate(a.ino, FallocMode::default(), 0, 64 << 20)?;
    let buf = vec![3u8; 4096];
    let mut x = 88172645463325252u64;
    for _ in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        fs.write(a.ino, (x % 16384) * 4096, &buf)?;
        fs.fsync(a.ino, false)?;
    }
    fs.unmount()?;
    std::fs::remove_file(pool).ok();
    Ok(())
}
