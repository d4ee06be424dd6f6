//! Probe: the hardware's time for the persistence shape of one durable small write,
//! against `ferrite bench`'s hw-ntstore target (64 non-temporal bytes at a random
//! line of 64 MiB, one fence). Each shape runs 400,000 times a round; the best of
//! seven rounds, ns per write. The shapes:
//!
//! - the floor: 64 B streamed to a random line, fence (hw-ntstore);
//! - a log entry alone: 128 B streamed at the log's end (a sequential 4 KiB page
//!   after another), fence;
//! - the entry and the tail the way a commit stores it: 8 bytes streamed into the
//!   inode slot's line (a partial line), fence;
//! - the entry, then the tail stored to the cache and flushed, fence;
//! - the entry, then the tail's whole line streamed (64 B), fence;
//! - the 64 B of data at a random line and the tail's partial line, fence;
//! - 4 KiB streamed to a random page (a copy-on-write page's data): alone (no fence
//!   in the loop), with a fence, and with a locked add to a DRAM word instead of the
//!   fence (what a lock's release does on x86): whether a locked instruction waits
//!   for the streamed stores as a fence does, which decides whether a commit can
//!   let its inode's lock go before its fence (docs/CONSISTENCY.md);
//! - 4 KiB streamed with its CRC32C taken from the same loads (`write_nt_crc`, a
//!   copy-on-write page's copy), fence: what the checksum adds to the copy;
//! - that, a 128 B entry and the 8 B streamed tail, fence: the persistence of a
//!   whole 4 KiB copy-on-write commit, the floor of `ferrite bench`'s 4 KiB random
//!   write, against "4 KiB random page, fence" (hw-ntstore's).
//!
//!     cargo run --release -p ferrite-core --example commit_floor
use ferrite_core::{MapOptions, Medium, MmapMedium};
use std::time::Instant;

const SHAPES: [&str; 11] = [
    "64 B random line, fence (hw-ntstore)",
    "128 B log entry, fence",
    "128 B entry + 8 B streamed tail, fence",
    "128 B entry + tail stored, flushed, fence",
    "128 B entry + 64 B streamed tail line, fence",
    "64 B random line + 8 B streamed tail, fence",
    "4 KiB random page, no fence",
    "4 KiB random page, fence",
    "4 KiB random page, locked add, no fence",
    "4 KiB random page + its CRC32C, fence",
    "4 KiB + CRC32C, 128 B entry, 8 B tail, fence",
];

fn main() {
    let path = format!("/dev/shm/commit_floor-{}.pool", std::process::id());
    let data_len: u64 = 64 << 20;
    let log_at = data_len;
    let log_len: u64 = 64 << 20;
    let slot = data_len + log_len;
    let m =
        MmapMedium::create(path.as_ref(), slot + (1 << 20), &MapOptions::default()).expect("pool");
    // Every page touched once first: no page fault is timed.
    for off in (0..slot + (1 << 20)).step_by(4096) {
        m.store_u64(off, 0);
    }
    let iters = 400_000u64;
    let line = [0x5au8; 64];
    let entry = [0xa5u8; 128];
    let page = [0x3cu8; 4096];
    let word = std::sync::atomic::AtomicU64::new(0);
    let mut best = [f64::MAX; SHAPES.len()];
    let mut x = 0x9e37_79b9u64;
    for _round in 0..7 {
        for (v, b) in best.iter_mut().enumerate() {
            let mut log = 0u64;
            let t = Instant::now();
            for i in 0..iters {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let rnd = x % (data_len / 64) * 64;
                // The data (a line, or a page with or without its checksum),
                // then the log entry, then the tail, as each shape has them.
                match v {
                    0 | 5 => m.write_nt(rnd, &line),
                    6..=8 => m.write_nt(rnd / 4096 * 4096, &page),
                    9 | 10 => {
                        std::hint::black_box(m.write_nt_crc(rnd / 4096 * 4096, &page));
                    }
                    _ => {}
                }
                if matches!(v, 1..=4 | 10) {
                    m.write_nt(log_at + log, &entry);
                    log = (log + 128) % log_len;
                }
                match v {
                    2 | 5 | 10 => m.store_u64_nt(slot + 8, i),
                    3 => {
                        m.store_u64(slot + 8, i);
                        m.flush(slot + 8, 8);
                    }
                    4 => m.write_nt(slot, &line),
                    8 => {
                        word.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                    }
                    _ => {}
                }
                if v != 6 && v != 8 {
                    m.fence();
                }
            }
            m.fence();
            *b = b.min(t.elapsed().as_nanos() as f64 / iters as f64);
        }
    }
    println!("flush instruction: {:?}", ferrite_core::pmem::config().flush);
    for (shape, b) in SHAPES.iter().zip(&best) {
        println!("{shape:<48} {b:>6.1} ns  ({:.2}x the first)", b / best[0]);
    }
    drop(m);
    std::fs::remove_file(path).ok();
}
