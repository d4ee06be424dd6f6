//! Probe: what persisting one small log entry and an 8-byte tail costs, per way of
//! storing them (best of five rounds of 400,000 persists, ns each). Entries go to
//! consecutive positions in 4 KiB pages as a log's do; the tail is one word of a
//! fixed line, as an inode slot's; each persist ends with one fence. An optional
//! copy-on-write page is streamed before each entry.
//!
//!     cargo run --release -p ferrite-core --example entry_persist -- [ENTRY_BYTES] [DATA_BYTES]
//!
//! ENTRY_BYTES: 120 (a 64 B embedded write's entry) unless given; DATA_BYTES: 0.
//! Used to choose how `Fs::commit_release` stores entries (docs/CONSISTENCY.md).
use ferrite_core::{MapOptions, Medium, MmapMedium};
use std::time::Instant;

/// Ways of storing an entry and the tail.
const WAYS: [&str; 5] = [
    "cached entry + tail, both flushed",
    "streamed entry (8-aligned), tail flushed",
    "streamed entry (16-aligned), tail flushed",
    "streamed entry (16-aligned), tail unflushed",
    "cached entry flushed, tail unflushed",
];

fn main() {
    let arg =
        |k: usize, d: usize| std::env::args().nth(k).and_then(|s| s.parse().ok()).unwrap_or(d);
    let esz = arg(1, 120);
    let data = arg(2, 0).min(4096);
    let path = format!("/dev/shm/entry_persist-{}.pool", std::process::id());
    let len: u64 = 64 << 20;
    let m = MmapMedium::create(path.as_ref(), len, &MapOptions::default()).expect("pool");
    let tail_off = 8u64 << 20;
    let src = vec![0x5au8; 4096];
    let iters = 400_000u64;
    let mut best = [f64::MAX; WAYS.len()];
    for _round in 0..5 {
        for (v, b) in best.iter_mut().enumerate() {
            let mut pos = 16u64 << 20;
            let mut dpos = 32u64 << 20;
            let align = if v == 2 || v == 3 { 16 } else { 8 };
            let l = (esz as u64).next_multiple_of(align).min(4000);
            let t = Instant::now();
            for _ in 0..iters {
                if pos % 4096 + l > 4088 {
                    pos = pos.next_multiple_of(4096);
                    if pos >= (32 << 20) - 4096 {
                        pos = 16 << 20;
                    }
                }
                if data > 0 {
                    m.write_nt(dpos, &src[..data]);
                    dpos = if dpos + 8192 > (48 << 20) { 32 << 20 } else { dpos + 4096 };
                }
                let e = &src[..l as usize];
                if v == 0 || v == 4 {
                    m.write(pos, e);
                } else {
                    m.write_nt(pos, e);
                }
                m.store_u64(tail_off, pos);
                if v == 0 || v == 4 {
                    m.flush(pos, l);
                }
                if v <= 2 {
                    m.flush(tail_off, 8);
                }
                m.fence();
                pos += l;
            }
            *b = b.min(t.elapsed().as_nanos() as f64 / iters as f64);
        }
    }
    for (way, b) in WAYS.iter().zip(&best) {
        println!("{data:>5} B data, {esz:>5} B entry: {way:<44} {b:>6.0} ns");
    }
    drop(m);
    std::fs::remove_file(path).ok();
}
