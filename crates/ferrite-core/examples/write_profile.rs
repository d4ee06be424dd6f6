//! Profile target on a prefaulted pool, timed against a peer in the same run.
//! `cargo run --release --example write_profile -- MODE [N] [SIZE]`
//! - `write`: N random overwrites of SIZE bytes (+fsync) in a 64 MiB file, against
//!   the hardware floor (a non-temporal copy of the same bytes plus one fence);
//! - `append`: N appends of SIZE bytes (+fsync), against tmpfs;
//! - `meta`: N creates then N unlinks in one directory, against tmpfs.
use ferrite_core::*;
use std::io::Write;
use std::time::Instant;

fn per_op(t: Instant, n: u64) -> f64 {
    t.elapsed().as_nanos() as f64 / n as f64
}

/// Bytes of the file the write modes overwrite.
const FILE: u64 = 64 << 20;

/// A file of [`FILE`] bytes written in 1 MiB pieces (overwrites find it allocated).
fn written_file<M: Medium>(fs: &Fs<M>) -> Result<Attr> {
    let a = fs.create(fs.root(), b"a", 0o644, 0, 0)?;
    let big = vec![1u8; 1 << 20];
    for off in (0..FILE).step_by(big.len()) {
        fs.write(a.ino, off, &big)?;
    }
    Ok(a)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "write".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let size: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(4096);
    let pool_dir = std::env::var("POOL_DIR").unwrap_or_else(|_| "/dev/shm".into());
    let pool = &format!("{pool_dir}/write_profile.pool");
    let _ = std::fs::remove_file(pool);
    let m = MmapMedium::create(pool.as_ref(), 1 << 30, &MapOptions::default())?;
    // Touch every page first (as the benchmark does): no first-touch faults timed.
    m.zero_nt(0, m.len());
    m.fence();
    let fs = Fs::mkfs(m, &MkfsOptions::default())?;
    let dir = "/dev/shm/write_profile.tmpfs";
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir(dir).expect("tmpfs directory");
    let buf = vec![3u8; size as usize];
    let (lib, peer, name) = match mode.as_str() {
        "write" => {
            let (a, file) = (written_file(&fs)?, FILE);
            let slots = file / size;
            let mut x = 88172645463325252u64;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x % slots
            };
            let t = Instant::now();
            for _ in 0..n {
                fs.write(a.ino, next() * size, &buf)?;
                fs.fsync(a.ino, false)?;
            }
            let lib = per_op(t, n);
            // The floor: the same bytes into the pool's last 64 MiB, one fence each.
            let base = fs.medium().len() - file;
            let t = Instant::now();
            for _ in 0..n {
                fs.medium().write_nt(base + next() * size, &buf);
                fs.medium().fence();
            }
            (lib, per_op(t, n), "hw-ntstore")
        }
        "shared" => {
            // Two threads on disjoint halves of one file against one thread.
            let (a, file) = (written_file(&fs)?, FILE);
            let run = |half: u64, halves: u64, n: u64| -> Result<()> {
                let slots = file / size / halves;
                let mut x = 88172645463325252u64 ^ half;
                for _ in 0..n {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let off = (half * slots + x % slots) * size;
                    fs.write(a.ino, off, &buf)?;
                }
                Ok(())
            };
            let t = Instant::now();
            run(0, 1, n)?;
            let one = per_op(t, n);
            let t = Instant::now();
            std::thread::scope(|s| {
                let h = s.spawn(|| run(1, 2, n / 2));
                run(0, 2, n / 2).expect("writer");
                h.join().expect("thread").expect("writer");
            });
            (per_op(t, n), one, "one thread")
        }
        "circular" => {
            // Appends that wrap in a 4 MiB region (the benchmark's circular log).
            let a = fs.create(fs.root(), b"a", 0o644, 0, 0)?;
            let region = 4u64 << 20;
            let t = Instant::now();
            for k in 0..n {
                fs.write(a.ino, (k * size) % region, &buf)?;
                fs.fsync(a.ino, false)?;
            }
            let lib = per_op(t, n);
            let t = Instant::now();
            for k in 0..n {
                fs.medium().write_nt(fs.medium().len() - region + (k * size) % region, &buf);
                fs.medium().fence();
            }
            (lib, per_op(t, n), "hw-ntstore")
        }
        "append" => {
            let a = fs.create(fs.root(), b"a", 0o644, 0, 0)?;
            let t = Instant::now();
            for _ in 0..n {
                fs.append(a.ino, &buf)?;
                fs.fsync(a.ino, false)?;
            }
            let lib = per_op(t, n);
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(format!("{dir}/a"))
                .expect("tmpfs file");
            let t = Instant::now();
            for _ in 0..n {
                f.write_all(&buf).expect("tmpfs write");
                f.sync_all().expect("tmpfs fsync");
            }
            (lib, per_op(t, n), "tmpfs")
        }
        _ => {
            let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0)?;
            let names: Vec<String> = (0..n).map(|i| format!("f{i}")).collect();
            let t = Instant::now();
            let f0 = fs.medium().stats().snapshot().fences;
            for nm in &names {
                fs.create(d.ino, nm.as_bytes(), 0o644, 0, 0)?;
            }
            let (create, f1) = (per_op(t, n), fs.medium().stats().snapshot().fences);
            let t2 = Instant::now();
            for nm in &names {
                fs.unlink(d.ino, nm.as_bytes())?;
            }
            let f2 = fs.medium().stats().snapshot().fences;
            println!(
                "create {create:.0} ns ({:.2} fences), unlink {:.0} ns ({:.2} fences)",
                (f1 - f0) as f64 / n as f64,
                per_op(t2, n),
                (f2 - f1) as f64 / n as f64
            );
            let lib = per_op(t, 2 * n);
            std::fs::create_dir(format!("{dir}/d")).expect("tmpfs directory");
            let t = Instant::now();
            for nm in &names {
                std::fs::File::create(format!("{dir}/d/{nm}")).expect("tmpfs create");
            }
            for nm in &names {
                std::fs::remove_file(format!("{dir}/d/{nm}")).expect("tmpfs unlink");
            }
            (lib, per_op(t, 2 * n), "tmpfs")
        }
    };
    println!(
        "{mode} {size} B: lib {lib:.0} ns/op, {name} {peer:.0} ns/op, lib speed / {name} {:.2}",
        peer / lib
    );
    fs.unmount()?;
    std::fs::remove_file(pool).ok();
    std::fs::remove_dir_all(dir).ok();
    Ok(())
}
