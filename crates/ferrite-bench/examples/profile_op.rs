//! Profile one FerriteFS library operation in a loop, with `perf record` attached only
//! while the loop runs (setup and pool pre-faulting excluded).
//!
//!     cargo run --release -p ferrite-bench --example profile_op -- OP [SECONDS] [PERF_OUT]
//!
//! OP: create | unlink | randwrite4k | randwrite64 | rewrite64 (one 64 B range rewritten) |
//! append64 | append128 | append256 | append4k | seqwrite1k | seqwrite1m |
//! randread4k (FERRITE_PROFILE_OVERLAYS=K: after K random 64 B writes per page) | shared4k | private4k | shared64 | private64 (the last four: 2 threads of
//! random writes + fsync, on one shared file or a file each; ops/s are the sum) |
//! metapath (the metadata benchmark's library target: rounds of FERRITE_PROFILE_FILES
//! (300) creates by path, each an O_CREAT open and a release, then as many unlinks by
//! path, each round in a fresh directory, by FERRITE_PROFILE_THREADS threads in
//! directories of their own; prints the time of each phase).
//! Prints operations per second; with PERF_OUT, writes a perf.data there
//! (`perf report -i PERF_OUT --no-children`).
#![forbid(unsafe_code)]

use ferrite_core::{Fs, MapOptions, MkfsOptions, MmapMedium};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let op = args.get(1).cloned().unwrap_or_else(|| "create".into());
    let secs: f64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3.0);
    let perf_out = args.get(3).cloned();
    let pool = format!("/dev/shm/ferrite-profile-{}.pool", std::process::id());
    // Removes the pool also when an operation fails and the example panics.
    struct Rm(String);
    impl Drop for Rm {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _rm = Rm(pool.clone());
    // FERRITE_PROFILE_POOL_MB: a smaller pool for valgrind (prefaulting 2 GiB under
    // callgrind takes minutes); FERRITE_PROFILE_OPS: exactly this many operations.
    let env_u64 = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let size = env_u64("FERRITE_PROFILE_POOL_MB").map_or(2u64 << 30, |mb| mb << 20);
    let max_ops = env_u64("FERRITE_PROFILE_OPS").unwrap_or(u64::MAX);
    // FERRITE_PROFILE_PAGES: the random writes' span in pages (16384, the prefilled
    // 64 MiB), smaller to see what the DRAM indexes' cache misses cost.
    let span = env_u64("FERRITE_PROFILE_PAGES").unwrap_or(16384).clamp(1, 16384);
    let m = MmapMedium::create(pool.as_ref(), size, &MapOptions::default()).expect("pool");
    ferrite_bench::target::lib::prefault(&m);
    let mut fs = Fs::mkfs(m, &MkfsOptions::default()).expect("mkfs");
    // FERRITE_PROFILE_VERIFY: the read verification mode (always, first-touch, off).
    if let Ok(v) = std::env::var("FERRITE_PROFILE_VERIFY") {
        fs.set_verify_mode(ferrite_core::VerifyMode::parse(&v).expect("verify mode"));
    }
    let fs = fs;
    let root = fs.root();
    let dir = fs.mkdir(root, b"d", 0o755, 0, 0).expect("mkdir").ino;
    let f = fs.create(root, b"f", 0o644, 0, 0).expect("create").ino;
    let buf = vec![0x5au8; 1 << 20];
    if op.contains("4k")
        || op.starts_with("seqwrite")
        || op == "randwrite64"
        || op == "rewrite64"
        || op.starts_with("shared")
        || op.starts_with("private")
    {
        for off in (0..(64u64 << 20)).step_by(1 << 20) {
            fs.write(f, off, &buf).expect("prefill");
        }
    }
    let n_unlink = 200_000u64;
    if op == "unlink" {
        for i in 0..n_unlink {
            fs.create(dir, format!("u{i}").as_bytes(), 0o644, 0, 0).expect("create");
        }
    }
    // FERRITE_PROFILE_OVERLAYS=K (randread4k): K random 64 B writes per page of the
    // prefilled file first, so that the reads compose pages that carry overlays.
    if op == "randread4k" {
        let k = env_u64("FERRITE_PROFILE_OVERLAYS").unwrap_or(0);
        let mut x = 0x2545_f491u64;
        for _ in 0..k * 16384 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            fs.write(f, x % (16384 * 64) * 64, &buf[..64]).expect("overlay");
        }
    }
    let perf: Option<Child> = perf_out.as_ref().map(|o| {
        let c = Command::new("perf")
            .args([
                "record",
                "--call-graph",
                "dwarf,16384",
                "-o",
                o,
                "-p",
                &std::process::id().to_string(),
            ])
            .spawn()
            .expect("perf");
        std::thread::sleep(Duration::from_millis(500));
        c
    });
    // Two writers' rounds follow where the host has the two CPUs (`xcore`): the line
    // transfer time before and after says which kind of round this was.
    let two = op.starts_with("shared") || op.starts_with("private");
    let transfer = || {
        ferrite_bench::xcore::line_transfer_ns().map_or_else(|| "-".into(), |ns| format!("{ns:.0}"))
    };
    let before = if two { transfer() } else { String::new() };
    let t0 = Instant::now();
    let cap = Duration::from_secs_f64(secs);
    let mut n = 0u64;
    let mut x = 0x9e37_79b9u64;
    let mut rnd = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let mut rbuf = vec![0u8; 4096];
    if let Some(k) = op.strip_prefix("shared").or_else(|| op.strip_prefix("private")) {
        let size: u64 = match k {
            "4k" => 4096,
            "64" => 64,
            _ => panic!("unknown op {op}"),
        };
        let g = if op.starts_with("private") {
            fs.create(root, b"g", 0o644, 0, 0).expect("create").ino
        } else {
            f
        };
        if op.starts_with("private") {
            for off in (0..(64u64 << 20)).step_by(1 << 20) {
                fs.write(g, off, &buf).expect("prefill");
            }
        }
        let total = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for (tid, file) in [(1u64, f), (2, g)] {
                let (fs, buf, total, op) = (&fs, &buf, &total, &op);
                s.spawn(move || {
                    let mut x = 0x9e37_79b9u64 * tid;
                    let slots = (64u64 << 20) / size;
                    let mut k = 0u64;
                    while t0.elapsed() < cap {
                        for _ in 0..64 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            fs.write(file, x % slots * size, &buf[..size as usize]).expect("write");
                            fs.fsync(file, false).expect("fsync");
                        }
                        k += 64;
                    }
                    total.fetch_add(k, std::sync::atomic::Ordering::Relaxed);
                    // Each thread's share: a slow round (two writers of one file are
                    // bimodal on this host type; docs/BENCHMARKS.md) shows whether
                    // one writer starved or both slowed.
                    println!("{op} thread {tid}: {k} operations");
                });
            }
        });
        n = total.into_inner();
    }
    if op == "metapath" {
        // The metadata benchmark's sequence (`target::lib`): open(O_CREAT) by path
        // and release, then unlink by path; 300 files a round unless told (the smoke
        // preset's count; --quick takes 5,000), in a directory of each thread's own
        // (FERRITE_PROFILE_THREADS, default 1).
        let flags = ferrite_core::OpenFlags { create: true, write: true, ..Default::default() };
        let files = env_u64("FERRITE_PROFILE_FILES").unwrap_or(300);
        let threads = env_u64("FERRITE_PROFILE_THREADS").unwrap_or(1);
        // FERRITE_PROFILE_RENAME=1: stat, open and rename each file between the
        // creates and the unlinks, as the benchmark does (the unlinks then take the
        // new names).
        let rename = env_u64("FERRITE_PROFILE_RENAME").unwrap_or(0) != 0;
        let one = |tid: u64| {
            let (mut tc, mut tu, mut round, mut k) = (Duration::ZERO, Duration::ZERO, 0u64, 0);
            while t0.elapsed() < cap && k < max_ops {
                let d = format!("/m{round}t{tid}");
                fs.mkdir(root, &d.as_bytes()[1..], 0o755, 0, 0).expect("mkdir");
                let names: Vec<String> = (0..files).map(|i| format!("{d}/f{i}")).collect();
                let c0 = Instant::now();
                for p in &names {
                    let a = fs.open_path(p.as_bytes(), flags, 0o644).expect("create");
                    fs.release(a.ino).expect("release");
                }
                let cc = Instant::now();
                let renamed: Vec<String> = if rename {
                    // The benchmark's stat, open and rename phases (untimed here), so
                    // that the unlinks meet the directory and inodes the benchmark's do.
                    let news: Vec<String> = (0..files).map(|i| format!("{d}/g{i}")).collect();
                    for (p, q) in names.iter().zip(&news) {
                        fs.stat_path(p.as_bytes()).expect("stat");
                        let a = fs.open_path(p.as_bytes(), Default::default(), 0).expect("open");
                        fs.release(a.ino).expect("release");
                        let (sd, sn) = fs.resolve_parent(p.as_bytes()).expect("resolve");
                        let (dd, dn) = fs.resolve_parent(q.as_bytes()).expect("resolve");
                        fs.rename(sd, sn, dd, dn, Default::default()).expect("rename");
                    }
                    news
                } else {
                    names.clone()
                };
                let c1 = Instant::now();
                for p in &renamed {
                    let (dir, name) = fs.resolve_parent(p.as_bytes()).expect("resolve");
                    fs.unlink(dir, name).expect("unlink");
                }
                let c2 = Instant::now();
                tu += c2 - c1;
                tc += cc - c0;
                if tid == 0 && (round < 4 || round.is_power_of_two()) {
                    // The first rounds take new inode slots, log pages and DRAM;
                    // later ones reuse what the unlinks freed.
                    let (c, u) = ((cc - c0).as_secs_f64(), (c2 - c1).as_secs_f64());
                    let per = files as f64 * 1e-6;
                    println!(
                        "round {round}: create+close {:.2} us, unlink {:.2} us",
                        c / per,
                        u / per
                    );
                }
                fs.rmdir(root, &d.as_bytes()[1..]).expect("rmdir");
                k += files;
                round += 1;
            }
            (k, tc, tu)
        };
        let outs: Vec<(u64, Duration, Duration)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads).map(|t| s.spawn(move || one(t))).collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        for (t, (k, tc, tu)) in outs.iter().enumerate() {
            n += k;
            println!(
                "metapath thread {t}: create+close {:.2} us, unlink {:.2} us ({k} files)",
                tc.as_secs_f64() / *k as f64 * 1e6,
                tu.as_secs_f64() / *k as f64 * 1e6
            );
        }
    }
    while t0.elapsed() < cap && n < max_ops {
        for _ in 0..64 {
            match op.as_str() {
                "create" => {
                    if n >= n_unlink {
                        break;
                    }
                    fs.create(dir, format!("c{n}").as_bytes(), 0o644, 0, 0).expect("create");
                }
                "unlink" => {
                    if n >= n_unlink {
                        break;
                    }
                    fs.unlink(dir, format!("u{n}").as_bytes()).expect("unlink");
                }
                "randwrite4k" => {
                    fs.write(f, rnd(span) * 4096, &buf[..4096]).expect("write");
                    fs.fsync(f, false).expect("fsync");
                }
                "randwrite64" => {
                    fs.write(f, rnd(span * 64) * 64, &buf[..64]).expect("write");
                    fs.fsync(f, false).expect("fsync");
                }
                "rewrite64" => {
                    // One 64 B range of a page in the middle of the file, rewritten
                    // in place (a header or a counter).
                    fs.write(f, (8192 << 12) + 128, &buf[..64]).expect("write");
                    fs.fsync(f, false).expect("fsync");
                }
                "randread4k" => {
                    fs.read(f, rnd(16384) * 4096, &mut rbuf).expect("read");
                }
                "append64" | "append128" | "append256" | "append4k" => {
                    let k = match op.as_str() {
                        "append64" => 64,
                        "append128" => 128,
                        "append256" => 256,
                        _ => 4096,
                    };
                    fs.append(f, &buf[..k]).expect("append");
                    fs.fsync(f, false).expect("fsync");
                }
                "seqwrite1k" => {
                    fs.write(f, (n % 65536) << 10, &buf[..1024]).expect("write");
                    fs.fsync(f, false).expect("fsync");
                }
                "seqwrite1m" => {
                    fs.write(f, (n % 64) << 20, &buf).expect("write");
                    fs.fsync(f, false).expect("fsync");
                }
                other => panic!("unknown op {other}"),
            }
            n += 1;
        }
        if (op == "unlink" || op == "create") && n >= n_unlink {
            break;
        }
    }
    let el = t0.elapsed().as_secs_f64();
    if let Some(mut p) = perf {
        let _ = Command::new("kill").args(["-INT", &p.id().to_string()]).status();
        let _ = p.wait();
    }
    let c = fs.medium().stats().snapshot();
    println!(
        "{op}: {n} ops in {el:.2} s = {:.0} ops/s ({:.2} us/op); fences so far {}, \
         bytes flushed {} and streamed {}; \
         file log {} pages; fast GC {} pages, thorough GC {} runs; {} MiB of the pool \
         in 2 MiB pages",
        n as f64 / el,
        el / n as f64 * 1e6,
        c.fences,
        c.flushed_bytes,
        c.nt_bytes,
        fs.log_pages(f).unwrap_or(0),
        fs.gc_stats().fast_pages.load(std::sync::atomic::Ordering::Relaxed),
        fs.gc_stats().thorough_runs.load(std::sync::atomic::Ordering::Relaxed),
        fs.medium().huge_mapped() >> 20,
    );
    if two {
        println!("cross-core line transfer before and after: {before} {} ns", transfer());
    }
    drop(fs);
}
