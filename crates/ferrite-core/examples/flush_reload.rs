//! Probe: what the next access to a line costs after the line was made durable,
//! per way of making it durable (best of five rounds, ns per round trip). One
//! 8-byte word of one fixed line is stored, persisted and fenced, then read back
//! (or stored again), over and over, as a commit does to its inode slot's tail and
//! a namespace operation to its journal's header.
//!
//!     cargo run --release -p ferrite-core --example flush_reload
//!
//! Where the flush instruction writes the line back and keeps it (what `clwb` is
//! for), a persisted line reads back from the cache; where it also evicts the
//! line, every access after a persist misses to memory, whatever the flush
//! instruction is called. The persistence module's choice (`FERRITE_FLUSH`)
//! applies here as everywhere.
use ferrite_core::{MapOptions, Medium, MmapMedium};
use std::time::Instant;

/// Ways of persisting the word, and what comes after the fence.
const WAYS: [&str; 6] = [
    "store, fence (not flushed); load",
    "store, flush, fence; load",
    "store, flush, fence; store",
    "streamed store, fence; load",
    "store, flush, fence; 8 other lines' work; load",
    "store, fence (not flushed); 8 other lines' work; load",
];

/// Ways that time the load alone, 2 µs after the fence (the write-back is long
/// done): a hit means the flush kept the line, a miss that it evicted it.
const LATE: [&str; 6] = [
    "load 2 us after store, fence (not flushed)",
    "load 2 us after store, flush, fence",
    "load 2 us after streamed store, fence",
    "load at once after store, fence (not flushed)",
    "load at once after store, flush, fence",
    "load at once after streamed store, fence",
];

fn main() {
    let path = format!("/dev/shm/flush_reload-{}.pool", std::process::id());
    let len: u64 = 16 << 20;
    let m = MmapMedium::create(path.as_ref(), len, &MapOptions::default()).expect("pool");
    let line = 8u64 << 20;
    let other = 12u64 << 20;
    let iters = 200_000u64;
    let mut best = [f64::MAX; WAYS.len()];
    let mut sink = 0u64;
    for _round in 0..5 {
        for (v, b) in best.iter_mut().enumerate() {
            let t = Instant::now();
            for i in 0..iters {
                match v {
                    3 => m.store_u64_nt(line, i),
                    _ => m.store_u64(line, i),
                }
                if matches!(v, 1 | 2 | 4) {
                    m.flush(line, 8);
                }
                m.fence();
                if v >= 4 {
                    // Work on lines that stay cached (what a commit does between two
                    // touches of its tail), so that a miss can overlap with it.
                    for k in 0..8 {
                        sink = sink.wrapping_add(m.load_u64(other + k * 64));
                    }
                }
                if v == 2 {
                    m.store_u64(line, i + 1);
                } else {
                    sink = sink.wrapping_add(m.load_u64(line));
                }
            }
            *b = b.min(t.elapsed().as_nanos() as f64 / iters as f64);
        }
    }
    let mut late = [0f64; LATE.len()];
    for (v, l) in late.iter_mut().enumerate() {
        let mut times: Vec<u128> = Vec::with_capacity(20_000);
        for i in 0..20_000u64 {
            match v % 3 {
                2 => m.store_u64_nt(line, i),
                _ => m.store_u64(line, i),
            }
            if v % 3 == 1 {
                m.flush(line, 8);
            }
            m.fence();
            let t = Instant::now();
            while v < 3 && t.elapsed().as_nanos() < 2_000 {
                std::hint::spin_loop();
            }
            let t = Instant::now();
            sink = sink.wrapping_add(std::hint::black_box(m.load_u64(line)));
            times.push(t.elapsed().as_nanos());
        }
        times.sort_unstable();
        *l = times[times.len() / 2] as f64;
    }
    println!("flush instruction: {:?}", ferrite_core::pmem::config().flush);
    for (way, b) in WAYS.iter().zip(&best) {
        println!("{way:<52} {b:>6.1} ns");
    }
    println!("(median of 20,000 timed loads, each timed with the clock's own cost)");
    for (way, l) in LATE.iter().zip(&late) {
        println!("{way:<52} {l:>6.1} ns");
    }
    std::hint::black_box(sink);
    drop(m);
    std::fs::remove_file(path).ok();
}
