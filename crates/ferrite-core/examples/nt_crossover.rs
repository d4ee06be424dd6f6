//! Measure the crossover between store+clwb and non-temporal copy for a persisted
//! copy followed by a fence, per size. Prints ns per persisted copy for both paths.
//! This is how `pmem::DEFAULT_NT_THRESHOLD` was chosen.
use ferrite_core::pmem::{self, FlushInstr};
use ferrite_core::{MapOptions, Medium, MmapMedium};
use std::time::Instant;

fn main() {
    let path = "/dev/shm/nt_crossover.pool";
    let len: u64 = 64 << 20;
    let m = MmapMedium::create(path.as_ref(), len, &MapOptions::default()).expect("pool");
    let src = vec![0x5au8; 65536];
    println!("flush instruction: {:?}", pmem::config().flush);
    if pmem::config().flush == FlushInstr::None {
        println!("no flush instruction: crossover meaningless");
    }
    println!("{:>7} {:>12} {:>12}", "bytes", "store+flush", "nt copy");
    for size in [64usize, 128, 256, 512, 1024, 2048, 4096, 16384, 65536] {
        let iters = (64 << 20) / size.max(4096) * 4;
        let span = len - size as u64;
        let mut best = [f64::MAX; 2];
        for _round in 0..5 {
            for (k, nt) in [false, true].into_iter().enumerate() {
                let mut off = 0u64;
                let t = Instant::now();
                for _ in 0..iters {
                    if nt {
                        m.write_nt(off, &src[..size]);
                    } else {
                        m.write(off, &src[..size]);
                        m.flush(off, size as u64);
                    }
                    m.fence();
                    off = (off + size as u64 + 4096) % span / 64 * 64;
                }
                let ns = t.elapsed().as_nanos() as f64 / iters as f64;
                best[k] = best[k].min(ns);
            }
        }
        println!("{size:>7} {:>10.0}ns {:>10.0}ns", best[0], best[1]);
    }
    drop(m);
    std::fs::remove_file(path).ok();
}
