use ferrite_core::*;
use std::time::Instant;
fn main() -> Result<()> {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let rounds: u64 = std::env::args().nth(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    let pool = "/dev/shm/scratch_meta2.pool";
    let _ = std::fs::remove_file(pool);
    let m = MmapMedium::create(pool.as_ref(), 1 << 30, &MapOptions::default())?;
    m.zero_nt(0, m.len());
    m.fence();
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    fs.mkdir(fs.root(), b"b", 0o755, 0, 0)?;
    let b = fs.resolve_parent(b"/b/x")?.0;
    fs.mkdir(b, b"d", 0o755, 0, 0)?;
    let names: Vec<String> = (0..n).map(|i| format!("/b/d/f0_{i}")).collect();
    let (mut cs, mut us) = (vec![], vec![]);
    for _ in 0..rounds {
        let t = Instant::now();
        for nm in &names {
            do_create(&fs, nm.as_bytes())?;
        }
        cs.push(t.elapsed().as_nanos() as f64 / n as f64);
        let t = Instant::now();
        for nm in &names {
            do_unlink(&fs, nm.as_bytes())?;
        }
        us.push(t.elapsed().as_nanos() as f64 / n as f64);
    }
    cs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    us.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("create {:.0} ns, unlink {:.0} ns", cs[cs.len() / 2], us[us.len() / 2]);
    drop(fs);
    let _ = std::fs::remove_file(pool);
    Ok(())
}

#[inline(never)]
fn do_create(fs: &Fs<MmapMedium>, nm: &[u8]) -> Result<()> {
    let (p, name) = fs.resolve_parent(nm)?;
    let ino = match fs.lookup_ino(p, name) {
        Ok(i) => i,
        Err(Error::NotFound) => fs.create(p, name, 0o644, 0, 0)?.ino,
        Err(e) => return Err(e),
    };
    fs.open(ino)?;
    fs.release(ino)
}
#[inline(never)]
fn do_unlink(fs: &Fs<MmapMedium>, nm: &[u8]) -> Result<()> {
    let (p, name) = fs.resolve_parent(nm)?;
    fs.unlink(p, name)
}
