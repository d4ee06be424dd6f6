//! Two writers of one file overlap: a copy-on-write commit stores its entries and its
//! tail under the inode's write lock (cached stores), lets the lock go, then flushes
//! and fences (`Fs::commit_release`), so the next writer appends and applies its
//! entries meanwhile; it stores its own tail only once that fence is done
//! (`Fs::await_fenced`). So a crash still finds at most a log's last operation
//! unfenced, the one recovery checks.
//!
//! Checked on the simulated medium, whose fences are per thread (a thread's fence
//! persists its own flushes only): writer A (simulated thread 1) embeds 1 KiB in
//! the log, on the file's last page, and is held at its commit's first flush, after
//! it let the lock go, while writer B (thread 2) overwrites the other page of the
//! same file copy-on-write. (A lone copy-on-write writer takes the lock before its
//! data copy and keeps it through its fence, and so does a lone embedded write off
//! the last page, see `Fs::write_cow`; an embedded write on the last page keeps
//! cached entries and lets the lock go first, and B, with A in flight, keeps its
//! copy outside the lock.) Every fence point of both is crashed
//! with many subsets of the words in flight; each image must recover to A-then-B
//! order (B's page never without A's), keep what had returned, and pass fsck. The
//! test-only fault that skips the wait (`tail-before-prev-fence`) must be caught.

mod common;

use common::*;
use ferrite_core::sim::{crash_image, set_sim_thread, step_kind, InFlight, Step};
use ferrite_core::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

const MB: u64 = 1 << 20;
const PAGE: usize = 4096;
/// Bytes A embeds at the start of page 1, the last.
const A_LEN: usize = 1024;

/// One fence of either writer: what is durable and in flight, and which writes had
/// returned.
struct Point {
    durable: Vec<u8>,
    in_flight: Vec<InFlight>,
    a_done: bool,
    b_done: bool,
}

#[derive(Default)]
struct Flags {
    /// A reached its commit's flushes (its write lock is free unless the commit held
    /// it through them).
    a_at_fence: bool,
    /// A was let go from its fence.
    a_released: bool,
    /// B turned in the wait for A's fence.
    b_waited: bool,
    /// B's write returned.
    b_done: bool,
}

/// The interleaving: A held at its commit's flushes and fence until B waits for it
/// (or, with the fault, until B returned). Returns the fence points and whether B waited.
fn interleave(fault: bool) -> (Vec<Point>, bool) {
    let mut fs = fresh_sim(16 * MB, 1);
    let ino = fs.create(fs.root(), b"f", 0o644, 0, 0).unwrap().ino;
    fs.write(ino, 0, &[0x11u8; 2 * PAGE]).unwrap();
    if fault {
        fs.set_core_fault(Some(CoreFault::NoFenceWait));
    }
    let sync = Arc::new((Mutex::new(Flags::default()), Condvar::new()));
    let (a_done, b_done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let s = sync.clone();
    fs.medium().set_step_hook(Some(Arc::new(move || {
        let (m, cv) = &*s;
        let mut f = m.lock().unwrap();
        match (ferrite_core::sim::sim_thread(), step_kind()) {
            // A's first flush: its commit stored entries and tail under the lock
            // with cached stores, let the lock go, and now flushes and fences.
            (1, Step::Flush | Step::Fence) if !f.a_released => {
                f.a_at_fence = true;
                cv.notify_all();
                // Not a timing assertion: a commit that kept the lock through its
                // fence blocks B, and the test reports that instead of hanging.
                let (g, _) = cv
                    .wait_timeout_while(f, Duration::from_secs(20), |f| !f.b_waited && !f.b_done)
                    .unwrap();
                f = g;
                f.a_released = true;
            }
            (2, Step::Wait) => {
                f.b_waited = true;
                cv.notify_all();
            }
            _ => {}
        }
    })));
    let points = Arc::new(Mutex::new(Vec::new()));
    let (p, ad, bd) = (points.clone(), a_done.clone(), b_done.clone());
    fs.medium().set_fence_hook(Some(Box::new(move |fp| {
        p.lock().unwrap().push(Point {
            durable: fp.durable.to_vec(),
            in_flight: fp.in_flight.to_vec(),
            a_done: ad.load(Ordering::SeqCst),
            b_done: bd.load(Ordering::SeqCst),
        });
    })));
    std::thread::scope(|sc| {
        sc.spawn(|| {
            set_sim_thread(1);
            fs.write(ino, PAGE as u64, &[0xAAu8; A_LEN]).unwrap();
            a_done.store(true, Ordering::SeqCst);
        });
        sc.spawn(|| {
            set_sim_thread(2);
            let (m, cv) = &*sync;
            drop(cv.wait_while(m.lock().unwrap(), |f| !f.a_at_fence).unwrap());
            fs.write(ino, 0, &[0xBBu8; PAGE]).unwrap();
            b_done.store(true, Ordering::SeqCst);
            m.lock().unwrap().b_done = true;
            cv.notify_all();
        });
    });
    fs.medium().set_step_hook(None);
    fs.medium().set_fence_hook(None);
    let f = sync.0.lock().unwrap();
    assert!(
        f.b_waited || f.b_done,
        "B neither waited for A's fence nor finished: A's commit held the write lock through its fence"
    );
    let mut page = vec![0u8; 2 * PAGE];
    fs.read(ino, 0, &mut page).unwrap();
    let (a_page, b_page) = (&page[PAGE..], &page[..PAGE]);
    assert!(
        a_page[..A_LEN].iter().all(|&b| b == 0xAA) && a_page[A_LEN..].iter().all(|&b| b == 0x11)
    );
    assert!(b_page.iter().all(|&b| b == 0xBB));
    let b_waited = f.b_waited;
    drop(f);
    let points = std::mem::take(&mut *points.lock().unwrap());
    (points, b_waited)
}

/// Crash every point with many subsets of its words in flight; the violations found.
fn violations(points: &[Point]) -> Vec<String> {
    let mut rng = Rng(7);
    let mut bad = Vec::new();
    let word = |b: u8| u64::from_le_bytes([b; 8]);
    for (n, p) in points.iter().enumerate() {
        for k in 0..24 {
            let keep = |f: &&InFlight| match k {
                0 => false,
                1 => true,
                2 => f.val != word(0xAA), // A's data lost
                3 => f.val != word(0xBB), // B's data lost
                _ => rng.below(2) == 0,
            };
            let chosen: Vec<InFlight> = p.in_flight.iter().filter(keep).copied().collect();
            let img = crash_image(&p.durable, chosen.iter());
            let fs = Fs::mount(SimMedium::from_image(img), &MountOptions::default())
                .unwrap_or_else(|e| panic!("fence {n}, subset {k}: no mount: {e}"));
            let f = fs.lookup(fs.root(), b"f").unwrap().ino;
            let mut page = vec![0u8; 2 * PAGE];
            if let Err(e) = fs.read(f, 0, &mut page) {
                // A page checksum caught torn data that recovery kept.
                bad.push(format!("fence {n}, subset {k}: read: {e}"));
                continue;
            }
            let whole = |r: &[u8], b: u8| r.iter().all(|&x| x == b);
            let (a_page, b_page) = (&page[PAGE..], &page[..PAGE]);
            let a = whole(&a_page[..A_LEN], 0xAA);
            let b = whole(b_page, 0xBB);
            let ok = (a || whole(&a_page[..A_LEN], 0x11))
                && whole(&a_page[A_LEN..], 0x11)
                && (b || whole(b_page, 0x11))
                && (!b || a)
                && (!p.a_done || a)
                && (!p.b_done || b);
            if !ok {
                bad.push(format!(
                    "fence {n} (A returned: {}, B returned: {}), subset {k}: A's page {}, B's page {}",
                    p.a_done,
                    p.b_done,
                    if a { "new" } else { "old or torn" },
                    if b { "new" } else { "old or torn" },
                ));
            }
            let r = fs.fsck().unwrap();
            if !r.is_clean() {
                bad.push(format!("fence {n}, subset {k}: fsck: {:?}", r.errors));
            }
        }
    }
    bad
}

#[test]
fn a_writer_commits_while_the_previous_one_fences_and_a_crash_keeps_their_order() {
    let (points, b_waited) = interleave(false);
    assert!(b_waited, "B committed inside A's window between unlock and fence");
    assert!(points.len() >= 2, "both writers fenced: {} fence points", points.len());
    let bad = violations(&points);
    assert!(bad.is_empty(), "crash states out of order:\n{}", bad.join("\n"));
}

#[test]
fn a_tail_stored_before_the_previous_commit_fenced_is_caught() {
    let (points, b_waited) = interleave(true);
    assert!(!b_waited, "with the fault, B does not wait");
    let bad = violations(&points);
    assert!(!bad.is_empty(), "the crash states miss a tail stored before the previous fence");
}
