//! Attach to a mount as a direct-access client and time durable writes of one file:
//! `attach MOUNTPOINT FILE [COUNT] [SIZE]` (FILE relative to the mount).
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let mnt = Path::new(&a[1]);
    let path = mnt.join(&a[2]);
    let count: usize = a.get(3).and_then(|v| v.parse().ok()).unwrap_or(10000);
    let size: usize = a.get(4).and_then(|v| v.parse().ok()).unwrap_or(4096);
    let c = ferrite_direct::Client::attach(mnt).unwrap_or_else(|e| panic!("{e}"));
    let f =
        std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(&path).unwrap();
    let ino = f.metadata().unwrap().ino();
    let data = vec![0x5au8; size];
    let t0 = std::time::Instant::now();
    for i in 0..count {
        let off = ((i * 7919) % 4096) as u64 * size as u64;
        c.fs().write(ino, off, &data).unwrap();
    }
    let dt = t0.elapsed();
    println!("{count} writes of {size} B: {:.3} us each", dt.as_secs_f64() * 1e6 / count as f64);
    let mut buf = vec![0u8; size];
    let t0 = std::time::Instant::now();
    for i in 0..count {
        let off = ((i * 7919) % 4096) as u64 * size as u64;
        c.fs().read(ino, off, &mut buf).unwrap();
    }
    println!("{count} reads: {:.3} us each", t0.elapsed().as_secs_f64() * 1e6 / count as f64);
    println!("size seen by the client: {}", c.fs().getattr(ino).unwrap().size);
    c.detach();
}
