//! Compare the library alone and a direct-access client on the same operation:
//! `cmp MOUNTPOINT SCRATCH_POOL N SIZE append|rand` (`CMP_CLIENT_ONLY=1`: the client
//! alone).
use ferrite_core::{Fs, MapOptions, MkfsOptions, MmapMedium};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

fn run<M: ferrite_core::Medium>(fs: &Fs<M>, ino: u64, n: usize, size: usize, append: bool) -> f64 {
    let data = vec![7u8; size];
    let t0 = std::time::Instant::now();
    for i in 0..n {
        if append {
            fs.append(ino, &data).unwrap();
        } else {
            fs.write(ino, ((i * 7919) % 4096) as u64 * size as u64, &data).unwrap();
        }
    }
    t0.elapsed().as_secs_f64() * 1e6 / n as f64
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (mnt, scratch) = (Path::new(&a[1]), Path::new(&a[2]));
    let n: usize = a[3].parse().unwrap();
    let size: usize = a[4].parse().unwrap();
    let append = a[5] == "append";
    let _ = std::fs::remove_file(scratch);
    let m = MmapMedium::create(scratch, 1 << 30, &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions::default()).unwrap();
    let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    // CMP_CLIENT_ONLY=1: the client alone (a profile of its path, e.g. under callgrind).
    let client_only = std::env::var_os("CMP_CLIENT_ONLY").is_some();
    if !client_only {
        run(&fs, ino, n / 10, size, append);
        println!("library: {:.3} us", run(&fs, ino, n, size, append));
    }
    let g = fs.gc_stats();
    use std::sync::atomic::Ordering::Relaxed;
    println!(
        "  gc: fast pages {} thorough runs {} log pages {}",
        g.fast_pages.load(Relaxed),
        g.thorough_runs.load(Relaxed),
        fs.log_pages(ino).unwrap()
    );
    let c = ferrite_direct::Client::attach(mnt).unwrap_or_else(|e| panic!("{e}"));
    let p = mnt.join(format!("cmp-{}", std::process::id()));
    let f = std::fs::File::create(&p).unwrap();
    let ino = f.metadata().unwrap().ino();
    run(c.fs(), ino, n / 10, size, append);
    println!("client:  {:.3} us", run(c.fs(), ino, n, size, append));
    c.detach();
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_file(scratch);
}
