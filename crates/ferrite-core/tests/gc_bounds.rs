//! Log garbage collection keeps logs bounded, and a nearly full pool keeps working:
//! - one 4 KiB page overwritten over and over (whole-page copy-on-write writes and
//!   sub-page writes embedded in the log) keeps the file's log at a few pages;
//! - creates + deletes in one directory keep the directory's log bounded (every
//!   removal is a pinned entry until thorough GC);
//! - a pool written to 95% and then overwritten steadily never reports ENOSPC;
//! - an append stream's log is compacted at the sparse slack, under 8% of its data.
//!
//! Regression note: the 95% test found that a nearly full pool reported ENOSPC
//! although its live data fit: sub-page writes embedded in logs, and partly dead log
//! pages (thorough GC waited for a log to be twice its live size), ate the last free
//! blocks. Fixed in `ops.rs` (`write_locked_range`: merge instead of embedding when
//! space is low) and `gc.rs` (`after_commit`: tighter compaction bound when low).
//!
//! CI runs 50 000 iterations; the 1 000 000-iteration variants are `#[ignore]`d, for
//! runs by hand in release mode:
//! `cargo test --release -p ferrite-core --test gc_bounds -- --ignored --nocapture`
//! (they print the page counts they measure). The pools are files in /dev/shm.

mod common;
use common::*;
use ferrite_core::*;

fn shm_pool(size: u64) -> (tempfile::TempDir, Fs<MmapMedium>) {
    let dir = tempfile::Builder::new().prefix("ferrite-gc").tempdir_in("/dev/shm").unwrap();
    let m = MmapMedium::create(&dir.path().join("pool"), size, &MapOptions::default()).unwrap();
    let fs = Fs::mkfs(m, &MkfsOptions { shards: 2, ..Default::default() }).unwrap();
    (dir, fs)
}

/// Overwrite page 0 of a file `n` times; returns (max log pages seen, final pages).
fn overwrite_one_page(n: u64) -> (usize, usize) {
    let (_dir, fs) = shm_pool(64 << 20);
    let f = fs.create(fs.root(), b"page", 0o644, 0, 0).unwrap().ino;
    let mut page = vec![0u8; 4096];
    fs.write(f, 0, &page).unwrap();
    let free0 = fs.statfs().bfree;
    let mut max_pages = 0;
    let mut rng = Rng(1);
    for i in 0..n {
        if i % 2 == 0 {
            // Whole page: a copy-on-write block and a WRITE entry.
            page.copy_from_slice(&pattern(i, 0, 4096));
            fs.write(f, 0, &page).unwrap();
        } else {
            // A few bytes: an entry with the data inside the log.
            let off = rng.below(4000) as usize;
            let d = (i as u32).to_le_bytes();
            fs.write(f, off as u64, &d).unwrap();
            page[off..off + 4].copy_from_slice(&d);
        }
        if i % 997 == 0 {
            max_pages = max_pages.max(fs.log_pages(f).unwrap());
            // No block leaks either: the free count stays where it started.
            let free = fs.statfs().bfree;
            assert!(free + 8 >= free0, "iteration {i}: free blocks {free0} -> {free}");
        }
    }
    assert_eq!(fs.read_all(f).unwrap(), page);
    let final_pages = fs.log_pages(f).unwrap();
    assert_fsck_clean(&fs, "after the overwrites");
    let s = fs.gc_stats();
    eprintln!(
        "{n} overwrites of one page: log pages max {max_pages}, final {final_pages}; fast GC freed {} pages, thorough GC ran {} times",
        s.fast_pages.load(std::sync::atomic::Ordering::Relaxed),
        s.thorough_runs.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(max_pages <= 4, "log grew to {max_pages} pages");
    (max_pages, final_pages)
}

/// Create and delete `n` files in one directory (with `live` other files present);
/// returns (max directory log pages seen, final pages).
fn create_delete_churn(n: u64, live: u64) -> (usize, usize) {
    let (_dir, fs) = shm_pool(64 << 20);
    let d = fs.mkdir(fs.root(), b"d", 0o755, 0, 0).unwrap().ino;
    for i in 0..live {
        fs.create(d, format!("live-{i}").as_bytes(), 0o644, 0, 0).unwrap();
    }
    let free0 = fs.statfs().bfree;
    let pages0 = fs.log_pages(d).unwrap() as u64;
    let mut max_pages = 0;
    for i in 0..n {
        let name = format!("churn-file-number-{i}");
        let a = fs.create(d, name.as_bytes(), 0o644, 0, 0).unwrap();
        if i % 10 == 0 {
            fs.write(a.ino, 0, name.as_bytes()).unwrap();
        }
        fs.unlink(d, name.as_bytes()).unwrap();
        if i % 997 == 0 {
            let pages = fs.log_pages(d).unwrap();
            max_pages = max_pages.max(pages);
            // No leaks: blocks in use beyond the start are the directory log's growth.
            let free = fs.statfs().bfree;
            let grown = (pages as u64).saturating_sub(pages0);
            assert!(free + grown + 16 >= free0, "iteration {i}: free blocks {free0} -> {free}");
        }
    }
    let final_pages = fs.log_pages(d).unwrap();
    assert_eq!(fs.list_dir(d).unwrap().len() as u64, live);
    assert_eq!(fs.statfs().ffree, fs.statfs().files - 2 - live);
    assert_fsck_clean(&fs, "after the churn");
    eprintln!("{n} creates+deletes beside {live} live files: directory log pages max {max_pages}, final {final_pages}");
    // Thorough GC compacts a log once it is over GC_SLACK times its live size,
    // checked each time the log has grown by half since the last check (and just
    // past the bound after a compaction): about GC_SLACK + 1 times the live size at
    // most. A live entry "live-N" takes at most 72 bytes.
    let need = (live * 72).div_ceil(4056) as usize + 1;
    assert!(
        max_pages <= (ferrite_core::gc::GC_SLACK + 1) * need + 8,
        "directory log grew to {max_pages} pages (live set needs {need})"
    );
    (max_pages, final_pages)
}

#[test]
fn one_page_overwritten_50k_times() {
    overwrite_one_page(50_000);
}

#[test]
#[ignore = "1M iterations: run by hand in release mode"]
fn one_page_overwritten_1m_times() {
    overwrite_one_page(1_000_000);
}

#[test]
fn create_delete_50k_in_one_directory() {
    create_delete_churn(50_000, 0);
    create_delete_churn(10_000, 500);
}

#[test]
#[ignore = "1M iterations: run by hand in release mode"]
fn create_delete_1m_in_one_directory() {
    create_delete_churn(1_000_000, 0);
    create_delete_churn(1_000_000, 1000);
}

/// Write the pool to 95% with files, then overwrite random ranges (three times the
/// pool's size in total): never ENOSPC while the live data fits.
fn steady_overwrites_at_95_percent(pool: u64, factor: u64) {
    let (_dir, fs) = shm_pool(pool);
    let root = fs.root();
    let s0 = fs.statfs();
    let target_used = s0.blocks * 95 / 100;
    let mut files: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut k = 0u64;
    loop {
        let s = fs.statfs();
        let used = s.blocks - s.bfree;
        if used >= target_used {
            break;
        }
        let want = ((target_used - used) * 4096).min(700_000) as usize;
        let a = fs.create(root, format!("f{k}").as_bytes(), 0o644, 0, 0).unwrap();
        let data = pattern(k, 0, want.max(4096));
        fs.write(a.ino, 0, &data).unwrap_or_else(|e| panic!("filling to 95%: {e} at {s:?}"));
        files.push((a.ino, data));
        k += 1;
    }
    let s = fs.statfs();
    let used_pct = 100.0 * (s.blocks - s.bfree) as f64 / s.blocks as f64;
    let seed: u64 = std::env::var("FERRITE_GC_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(9);
    let mut rng = Rng(seed);
    let mut written = 0u64;
    let mut ops = 0u64;
    while written < factor * pool {
        let (ino, data) = &mut files[rng.below(k) as usize];
        let len = match rng.below(3) {
            0 => rng.below(300) + 1,
            1 => 4096,
            _ => rng.below(64 << 10) + 1,
        }
        .min(data.len() as u64);
        let off = rng.below(data.len() as u64 - len + 1);
        let buf = pattern(1_000_000 + ops, off, len as usize);
        if let Err(e) = fs.write(*ino, off, &buf) {
            let r = fs.fsck().unwrap();
            panic!(
                "overwrite {ops} ({len} bytes at {off}) at {used_pct:.1}% full: {e}; {:?}; \
                 log pages {}, data blocks {}",
                fs.statfs(),
                r.log_pages,
                r.data_blocks
            );
        }
        data[off as usize..(off + len) as usize].copy_from_slice(&buf);
        written += len;
        ops += 1;
    }
    for (ino, data) in &files {
        assert!(fs.read_all(*ino).unwrap() == *data);
    }
    assert_fsck_clean(&fs, "after steady overwrites at 95%");
    let s = fs.statfs();
    eprintln!(
        "pool {} MiB filled to {used_pct:.1}%, {ops} overwrites ({} MiB) later: {:.1}% used",
        pool >> 20,
        written >> 20,
        100.0 * (s.blocks - s.bfree) as f64 / s.blocks as f64
    );
}

#[test]
fn pool_at_95_percent_keeps_taking_overwrites() {
    let factor = std::env::var("FERRITE_GC_FACTOR").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    steady_overwrites_at_95_percent(16 << 20, factor);
}

#[test]
#[ignore = "large: run by hand in release mode"]
fn pool_at_95_percent_keeps_taking_overwrites_large() {
    steady_overwrites_at_95_percent(256 << 20, 4);
}

/// Regression note: appends to one file of a nearly full pool (under 1/16 free) ran
/// thorough GC about once every 20 appends, each rewriting the whole compacted log,
/// and a 256 B append took 14-26 us instead of 0.6 (a probe filling a 256 MiB pool).
/// The low-space bound was an estimate of the live state's pages plus an eighth; for
/// a large file the compacted log came out longer than that (its entries do not
/// pack its pages tightly), so every new log page went over the bound. Fixed in
/// `gc.rs` (`after_commit`): the bound starts from what the last compaction gave,
/// and its slack shrinks with the free space instead of dropping to an eighth at
/// once. Counts, not time: thorough GC runs per append while low, to ENOSPC.
#[test]
fn appends_near_a_full_pool_do_not_compact_at_every_page() {
    let (_dir, fs) = shm_pool(256 << 20);
    let f = fs.create(fs.root(), b"grow", 0o644, 0, 0).unwrap().ino;
    // A large file first (its log's live state is tens of pages), written until
    // the pool is just short of free space (gc.rs, `low_space`: under 1/16 free).
    let chunk = vec![5u8; 1 << 20];
    let mut size = 0u64;
    while fs.statfs().bfree > fs.statfs().blocks / 15 {
        fs.write(f, size, &chunk).unwrap();
        size += chunk.len() as u64;
    }
    let buf = vec![7u8; 256];
    let runs = || fs.gc_stats().thorough_runs.load(std::sync::atomic::Ordering::Relaxed);
    let (mut appends_low, mut runs_low) = (0u64, 0u64);
    loop {
        let s = fs.statfs();
        let low = s.bfree < s.blocks / 17;
        let before = runs();
        match fs.append(f, &buf) {
            Ok(_) => size += 256,
            Err(Error::NoSpace) => break,
            Err(e) => panic!("append: {e}"),
        }
        if low {
            appends_low += 1;
            runs_low += runs() - before;
        }
    }
    eprintln!("{appends_low} appends with space low ran thorough GC {runs_low} times");
    assert!(appends_low > 1000, "only {appends_low} appends while space was low");
    // At least an eighth of growth between compactions: at most one per ~100
    // appends here (before the fix: one per 15).
    assert!(runs_low * 60 < appends_low, "{runs_low} thorough GCs in {appends_low} appends");
    assert_eq!(fs.getattr(f).unwrap().size, size);
}

/// An append stream's log (a WRITE entry per merged run of pages among dead
/// embedded appends) is compacted at `SPARSE_SLACK` times its live state, not
/// `GC_SLACK`: it stays under 8% of the data, and compactions are rarer than the
/// smaller slack would make them.
#[test]
fn an_append_stream_is_compacted_at_the_sparse_slack() {
    let (_dir, fs) = shm_pool(256 << 20);
    let f = fs.create(fs.root(), b"stream", 0o644, 0, 0).unwrap().ino;
    let buf = vec![3u8; 256];
    let runs = || fs.gc_stats().thorough_runs.load(std::sync::atomic::Ordering::Relaxed);
    let mut max_pages = 0usize;
    let n = 120_000u64;
    for _ in 0..n {
        fs.append(f, &buf).unwrap();
        max_pages = max_pages.max(fs.log_pages(f).unwrap());
    }
    let data_pages = (n * 256 / 4096) as usize;
    eprintln!("{n} appends: log at most {max_pages} pages, {} thorough GCs", runs());
    assert!(runs() > 0, "the log was never compacted");
    assert!(max_pages * 100 <= data_pages * 8 + 1600, "log {max_pages} pages for {data_pages}");
    // Each compaction rewrites the live state; the log then grows by (slack - 1)
    // times it before the next. Measured here: at SPARSE_SLACK = 8, 158 compactions
    // (about 58 pages of the appends' entries per compaction) and a log of at most
    // 122 pages; with 4 in its place, 338 (about 27) and 62. At least 40 are asked
    // for. The appends' entries: an INLINE header (56 bytes) and 256 bytes each.
    let log_entries_pages = (n as usize * (56 + 256)).div_ceil(4080);
    assert!(
        (runs() as usize) * 40 <= log_entries_pages,
        "{} thorough GCs for {log_entries_pages} log pages appended",
        runs()
    );
    assert_fsck_clean(&fs, "after the append stream");
}

/// Regression note: in a pool over 15/16 full, every new log page of a file made GC
/// measure the file's whole live state (every run and overlay) to decide on a
/// compaction, and sub-page writes were merged into copy-on-write pages instead of
/// embedded: 64 B random overwrites of a 16 MiB file took 2,781 ns at 95% full
/// against 476 at 50% (a probe on a 256 MiB pool). Fixed in `gc.rs`
/// (`after_commit`: no new measure before the log is halfway to the last bound)
/// and `ops.rs` (merging only from 1/64 free). Counts, not time.
#[test]
fn small_overwrites_at_95_percent_neither_measure_nor_merge_at_every_page() {
    let (_dir, fs) = shm_pool(128 << 20);
    let f = fs.create(fs.root(), b"victim", 0o644, 0, 0).unwrap().ino;
    let chunk = vec![1u8; 1 << 20];
    for k in 0..16u64 {
        fs.write(f, k << 20, &chunk).unwrap();
    }
    let filler = fs.create(fs.root(), b"filler", 0o644, 0, 0).unwrap().ino;
    let mut off = 0u64;
    while fs.statfs().bfree > fs.statfs().blocks / 20 {
        fs.write(filler, off, &chunk[..256 << 10]).unwrap();
        off += 256 << 10;
    }
    let stats = fs.gc_stats();
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let checks0 = get(&stats.thorough_checks);
    let pages0 = fs.log_pages(f).unwrap();
    let free0 = fs.statfs().bfree;
    let mut rng = Rng(7);
    let n = 20_000;
    for i in 0..n {
        let o = rng.below((16 << 20) - 64);
        fs.write(f, o, &(i as u64).to_le_bytes().repeat(8)).unwrap();
    }
    let checks = get(&stats.thorough_checks) - checks0;
    let grown = fs.log_pages(f).unwrap().saturating_sub(pages0);
    let used = free0.saturating_sub(fs.statfs().bfree);
    eprintln!(
        "{n} 64 B overwrites at 95% full: log +{grown} pages, {checks} GC measures, \
         {used} blocks taken"
    );
    // Embedded, the writes grow the log by about one page per 30; merged, each
    // would take a data block and leave the log nearly unchanged.
    assert!(grown > 100, "the log grew {grown} pages: writes were merged, not embedded");
    assert!(checks * 10 < grown as u64, "{checks} live-state measures for {grown} new log pages");
    assert_fsck_clean(&fs, "after the overwrites");
}
