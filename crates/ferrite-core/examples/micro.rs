//! Quick micro-measurements against tmpfs (same run): 4 KiB random write + fsync,
//! 64 B append + fsync, create+unlink, 4 KiB random read. Prints ops/s and ratios.
use ferrite_core::*;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::time::Instant;

fn rate(n: u64, t: std::time::Duration) -> f64 {
    n as f64 / t.as_secs_f64()
}

fn main() -> Result<()> {
    let n: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(100_000);
    let pool = "/dev/shm/micro.pool";
    let _ = std::fs::remove_file(pool);
    let msync = std::env::var("FERRITE_MSYNC").is_ok_and(|v| v == "1");
    let opts = MapOptions { msync_each_commit: msync, ..Default::default() };
    let m = MmapMedium::create(pool.as_ref(), 1 << 30, &opts)?;
    println!("durability: {:?}", m.durability());
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    let dir = "/dev/shm/micro_tmpfs";
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir(dir).unwrap();
    let file_pages = 16384u64; // 64 MiB file
    let buf = vec![7u8; 4096];
    let mut rng = 0x12345678u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    // 4K random write + fsync
    let f = fs.create(fs.root(), b"rw", 0o644, 0, 0)?;
    fs.fallocate(f.ino, FallocMode::default(), 0, file_pages * 4096)?;
    let t = Instant::now();
    for _ in 0..n {
        let pg = next() % file_pages;
        fs.write(f.ino, pg * 4096, &buf)?;
        fs.fsync(f.ino, false)?;
    }
    let lib_w = rate(n, t.elapsed());
    let tf = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .read(true)
        .open(format!("{dir}/rw"))
        .unwrap();
    tf.set_len(file_pages * 4096).unwrap();
    let t = Instant::now();
    for _ in 0..n {
        let pg = next() % file_pages;
        tf.write_all_at(&buf, pg * 4096).unwrap();
        tf.sync_all().unwrap();
    }
    let tmp_w = rate(n, t.elapsed());
    println!("4K randwrite+fsync: lib {lib_w:.0}/s tmpfs {tmp_w:.0}/s ratio {:.2}", lib_w / tmp_w);
    // 4K random read
    let mut rb = vec![0u8; 4096];
    let t = Instant::now();
    for _ in 0..n {
        let pg = next() % file_pages;
        fs.read(f.ino, pg * 4096, &mut rb)?;
    }
    let lib_r = rate(n, t.elapsed());
    let t = Instant::now();
    for _ in 0..n {
        let pg = next() % file_pages;
        tf.read_exact_at(&mut rb, pg * 4096).unwrap();
    }
    let tmp_r = rate(n, t.elapsed());
    println!("4K randread:        lib {lib_r:.0}/s tmpfs {tmp_r:.0}/s ratio {:.2}", lib_r / tmp_r);
    // 64 B append + fsync
    for sz in [64usize, 256] {
        let a = fs.create(fs.root(), format!("ap{sz}").as_bytes(), 0o644, 0, 0)?;
        let small = vec![1u8; sz];
        let t = Instant::now();
        for _ in 0..n {
            fs.append(a.ino, &small)?;
            fs.fsync(a.ino, false)?;
        }
        let lib_a = rate(n, t.elapsed());
        let mut ta = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(format!("{dir}/ap{sz}"))
            .unwrap();
        let t = Instant::now();
        for _ in 0..n {
            ta.write_all(&small).unwrap();
            ta.sync_all().unwrap();
        }
        let tmp_a = rate(n, t.elapsed());
        let _ = ta.seek(SeekFrom::Start(0));
        println!(
            "{sz}B append+fsync:  lib {lib_a:.0}/s tmpfs {tmp_a:.0}/s ratio {:.2}",
            lib_a / tmp_a
        );
    }
    // create + unlink
    let d = fs.mkdir(fs.root(), b"cu", 0o755, 0, 0)?;
    let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
    let t = Instant::now();
    for nm in &names {
        fs.create(d.ino, nm.as_bytes(), 0o644, 0, 0)?;
    }
    for nm in &names {
        fs.unlink(d.ino, nm.as_bytes())?;
    }
    let lib_c = rate(2 * n, t.elapsed());
    std::fs::create_dir(format!("{dir}/cu")).unwrap();
    let t = Instant::now();
    for nm in &names {
        std::fs::File::create(format!("{dir}/cu/{nm}")).unwrap();
    }
    for nm in &names {
        std::fs::remove_file(format!("{dir}/cu/{nm}")).unwrap();
    }
    let tmp_c = rate(2 * n, t.elapsed());
    println!("create+unlink:      lib {lib_c:.0}/s tmpfs {tmp_c:.0}/s ratio {:.2}", lib_c / tmp_c);
    let s = fs.medium().stats().snapshot();
    println!("persist stats: {s:?}");
    fs.unmount()?;
    std::fs::remove_file(pool).ok();
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}
