//! What sharing a pool costs one writer: small appends + fsync on a private `Fs`,
//! on the daemon's `Fs` of a shared pool, and on a direct-access client's `Fs`
//! attached beside it (threads of one process over one real mapping, no preload
//! library, no socket; the client keeps leases with a keeper thread, as a real
//! client's watcher does), alternated round by round.
//!
//!     cargo run --release -p ferrite-bench --example share_cost -- [OPS] [ROUNDS] [SIZE]
//!
//! Prints ns per operation for each round and the medians.
//! `FERRITE_SHARE_COST_OP=overwrite`: writes of SIZE bytes at random offsets of a
//! 16 MiB file instead of appends.
//! `FERRITE_SHARE_COST_ONLY=private|daemon|client` runs only that one (to profile it).
use ferrite_core::share::HeapRegion;
use ferrite_core::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

type Med = Arc<MmapMedium>;

fn pool(name: &str) -> Result<(Med, String)> {
    let p = format!("/dev/shm/share_cost_{}_{name}.pool", std::process::id());
    let _ = std::fs::remove_file(&p);
    let m = MmapMedium::create(p.as_ref(), 1 << 30, &MapOptions::default())?;
    // As the benchmark's library target: the rounds time the file system, not the
    // first touch of tmpfs pages.
    ferrite_bench::target::lib::prefault(&m);
    Ok((Arc::new(m), p))
}

/// Pages of the file random overwrites go to (`FERRITE_SHARE_COST_OP=overwrite`).
const SPAN_PAGES: u64 = 4096;

/// `ops` appends + fsync by `fs` to a new file `name` that `ns` makes (a client
/// makes no names); with `overwrite`, writes + fsync at random offsets of a
/// 16 MiB file written first (none on its last page).
fn run(
    ns: &Fs<Med>,
    fs: &Fs<Med>,
    name: &[u8],
    ops: u64,
    data: &[u8],
    overwrite: bool,
) -> Result<f64> {
    let _ = ns.unlink(ns.root(), name);
    let a = ns.create(ns.root(), name, 0o644, 0, 0)?;
    if overwrite {
        let page = vec![1u8; 1 << 20];
        for k in 0..SPAN_PAGES / 256 {
            fs.write(a.ino, k << 20, &page)?;
        }
    }
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let t = Instant::now();
    for _ in 0..ops {
        if overwrite {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let pg = x % (SPAN_PAGES - 1);
            let at = (x >> 32) % (4096 - data.len() as u64 + 1);
            fs.write(a.ino, pg * 4096 + at, data)?;
        } else {
            fs.append(a.ino, data)?;
        }
        fs.fsync(a.ino, false)?;
    }
    Ok(t.elapsed().as_nanos() as f64 / ops as f64)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let arg = |k: usize, d: u64| std::env::args().nth(k).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (ops, rounds, size) = (arg(1, 200_000), arg(2, 5), arg(3, 64) as usize);
    let data = vec![7u8; size];

    let (pm, pp) = pool("private")?;
    let private = Fs::mkfs(pm, &MkfsOptions::default())?;

    let (sm, sp) = pool("shared")?;
    let fs = Fs::mkfs(sm.clone(), &MkfsOptions::default())?;
    let (ni, nb) = (fs.geometry().ninodes, fs.geometry().nblocks);
    let t = Table::create(Box::new(HeapRegion::new(ni, nb)), ni, nb, &fs.superblock().uuid);
    t.alive_word().store(1, Ordering::Release);
    let table = Arc::new(t);
    let daemon = Arc::new(fs.share_with(Arc::new(Party::daemon(table.clone()))));
    let pid = table.claim_party(std::process::id()).expect("a party slot");
    let src = Arc::new(DaemonGrants { daemon: daemon.clone(), party: pid, cap: u64::MAX });
    let client = Arc::new(Fs::attach(sm, Arc::new(Party::client(table.clone(), pid, src)))?);
    client.keep_leases(Box::new(|| {}));
    let stop = Arc::new(AtomicBool::new(false));
    let keeper = {
        let (c, s) = (client.clone(), stop.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Acquire) {
                c.tick_leases(false);
                std::thread::sleep(LEASE_TICK);
            }
            c.tick_leases(true);
        })
    };

    // FERRITE_SHARE_COST_ONLY=private|daemon|client: time only that one (for a
    // profile); the others print 0.
    let only = std::env::var("FERRITE_SHARE_COST_ONLY").ok();
    let on = |k: &str| only.as_deref().is_none_or(|o| o == k);
    // FERRITE_SHARE_COST_OP=overwrite: random overwrites instead of appends.
    let ow = std::env::var("FERRITE_SHARE_COST_OP").is_ok_and(|v| v == "overwrite");
    let mut res: [Vec<f64>; 3] = Default::default();
    for r in 0..rounds {
        let a = if on("private") { run(&private, &private, b"p", ops, &data, ow)? } else { 0.0 };
        let b = if on("daemon") { run(&daemon, &daemon, b"d", ops, &data, ow)? } else { 0.0 };
        let c = if on("client") { run(&daemon, &client, b"c", ops, &data, ow)? } else { 0.0 };
        println!("round {r}: private {a:.0} ns, daemon {b:.0} ns, client {c:.0} ns");
        for (v, x) in res.iter_mut().zip([a, b, c]) {
            v.push(x);
        }
    }
    let [a, b, c] = res.each_mut().map(|v| median(v));
    println!(
        "medians: private {a:.0} ns, daemon {b:.0} ns ({:.2}x), client {c:.0} ns ({:.2}x)",
        b / a,
        c / a
    );
    stop.store(true, Ordering::Release);
    keeper.join().expect("lease keeper");
    drop(client);
    drop(private);
    let _ = std::fs::remove_file(pp);
    let _ = std::fs::remove_file(sp);
    Ok(())
}
