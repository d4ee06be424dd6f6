//! Measure mount time of a pool holding N files / B bytes, after a clean unmount and
//! after a crash. Usage: mount_time [files] [bytes_per_file] [pool]
use ferrite_core::*;
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let files: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let per: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(20 * 1024);
    let pool = args.get(3).cloned().unwrap_or("/dev/shm/mount_time.pool".into());
    let size = ((files * per as u64) * 5 / 4 + (files * 16 * 1024) + (256 << 20)) / 4096 * 4096;
    let _ = std::fs::remove_file(&pool);
    let m = MmapMedium::create(pool.as_ref(), size, &MapOptions::default())?;
    let fs = Fs::mkfs(m, &MkfsOptions { inodes: files * 2 + 1024, ..Default::default() })?;
    let data = vec![0xabu8; per];
    let t = Instant::now();
    let mut dir = fs.root();
    for i in 0..files {
        if i % 1000 == 0 {
            dir = fs.mkdir(fs.root(), format!("d{}", i / 1000).as_bytes(), 0o755, 0, 0)?.ino;
        }
        let f = fs.create(dir, format!("f{i}").as_bytes(), 0o644, 0, 0)?;
        fs.write(f.ino, 0, &data)?;
    }
    let fill = t.elapsed();
    println!("filled {files} files x {per} bytes in {:.2?}", fill);
    let m = fs.unmount()?;
    let t = Instant::now();
    let fs = Fs::mount(m, &MountOptions::default())?;
    println!("mount after clean unmount: {:.2?} (clean={})", t.elapsed(), fs.mount_report().clean);
    let m = fs.crash();
    let t = Instant::now();
    let fs = Fs::mount(m, &MountOptions::default())?;
    let r = fs.mount_report().clone();
    println!(
        "mount after crash: {:.2?} ({} inodes scanned, clean={})",
        t.elapsed(),
        r.inodes_scanned,
        r.clean
    );
    let rep = fs.fsck()?;
    println!("fsck: clean={} inodes={} data_bytes={}", rep.is_clean(), rep.inodes, rep.data_bytes);
    fs.unmount()?;
    std::fs::remove_file(&pool).ok();
    Ok(())
}
