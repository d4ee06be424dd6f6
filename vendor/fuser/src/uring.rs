//! FUSE over io_uring (Linux 6.14+, protocol 7.42): FerriteFS's addition to fuser 0.18.0.
//!
//! After the classic `FUSE_INIT` handshake has negotiated `FUSE_OVER_IO_URING`,
//! two threads per possible CPU (one above `MANY_CPUS`) each register one ring entry
//! with the kernel's queue of that CPU (`FUSE_IO_URING_CMD_REGISTER`, 128-byte SQEs on the
//! `/dev/fuse` fd) and pin themselves to that CPU. Once every queue holds an entry, the
//! kernel sends each request to the queue of the CPU its caller runs on: the request
//! arrives as a completion, a thread serves it on the same CPU, and one submission
//! (`FUSE_IO_URING_CMD_COMMIT_AND_FETCH`) both returns the reply and waits for the next
//! request. The classic path costs a `read` and a `writev` per request. Two threads
//! per queue, so that one slow request (a large copy_file_range) does not hold up
//! every other request made on its CPU.
//!
//! Invariants:
//! - An entry's buffers belong to the kernel from its submission until its completion;
//!   this module reads or writes them only in between, on the queue's own thread.
//! - Buffers are never freed: the kernel may write into a registered entry until the
//!   ring's teardown, which finishes asynchronously after the ring's fd is closed.
//!   A mount owns one or two entries per CPU for the life of the process
//!   (each a 288-byte header and a payload of the largest request, 1 MiB for
//!   FerriteFS; memory is touched only as requests fill it).
//! - A request is rebuilt in the classic layout (in header, op header, payload) and
//!   dispatched exactly as a request read from `/dev/fuse`; the reply's body is written
//!   straight into the entry's payload buffer (`ChannelSender::capturing`), only while
//!   the slot is armed for that request, and committed before the entry is used again.
//!   A request whose handler sent no reply (or one too large) is answered EIO, so no
//!   entry is ever lost.
//! - FORGET, INTERRUPT and notifications still travel through `/dev/fuse`: the classic
//!   threads keep running beside the queues.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use io_uring::{IoUring, cqueue, opcode, squeue, types};
use log::{error, warn};
use zerocopy::IntoBytes;

use crate::Filesystem;
use crate::channel::{Channel, ReplySlot};
use crate::ll::Operation;
use crate::reply::ReplyEmpty;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

/// Requests served over io_uring in this process (all sessions).
static SERVED: AtomicU64 = AtomicU64::new(0);

/// Requests served over io_uring in this process so far, over all sessions.
pub fn requests_served() -> u64 {
    SERVED.load(Ordering::Relaxed)
}

/// Request-serving threads run under `SCHED_IDLE` ([`set_idle_serving`]).
static IDLE_SERVING: AtomicBool = AtomicBool::new(false);

/// Serve requests from threads of the `SCHED_IDLE` policy (the ring threads and the
/// classic ones), from the next thread started on. A reply wakes the caller while the
/// serving thread still runs on the caller's CPU; the scheduler then counts that CPU
/// busy and moves the caller to another, idle one, and on a VM whose idle CPUs halt
/// that wakeup costs more than the request (a 4 KiB `pwrite` on the mount: 18 us
/// with caller and daemon pinned to one CPU, 50-75 us free to move, a migration per
/// request). A CPU that runs only `SCHED_IDLE` threads counts as idle, so the caller
/// wakes where it slept and its serving thread yields to it at once. docs/FUSE.md.
pub fn set_idle_serving(on: bool) {
    IDLE_SERVING.store(on, Ordering::Relaxed);
}

/// Put the calling thread under `SCHED_IDLE` if [`set_idle_serving`] asked for it.
pub(crate) fn apply_serving_policy() {
    if !IDLE_SERVING.load(Ordering::Relaxed) {
        return;
    }
    let p = libc::sched_param { sched_priority: 0 };
    // SAFETY: `p` is a valid sched_param; pid 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) } != 0 {
        // Still correct, only slower: the thread keeps the normal policy.
        warn!("fuser: cannot use SCHED_IDLE: {}", io::Error::last_os_error());
    }
}

/// Threads, each with one ring entry, per queue (per CPU). A request finding every
/// entry of its CPU's queue busy waits in the kernel for one.
const THREADS_PER_QUEUE: usize = 2;
/// Above this many CPUs, one thread per queue: there are threads enough, and each
/// holds a payload buffer.
const MANY_CPUS: usize = 16;
const ENTRIES_PER_THREAD: usize = 1;
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_in_header` and `struct fuse_out_header`.
const IN_HDR: usize = 40;
const OUT_HDR: usize = 16;
/// `struct fuse_uring_req_header`: in/out header (128), op header (128),
/// `struct fuse_uring_ent_in_out` (32).
const OP_IN: usize = 128;
const ENT_IN_OUT: usize = 256;
const REQ_HEADER: usize = 288;

/// One ring entry's buffers, shared with the kernel (see the module invariants).
struct Ent {
    hdr: *mut u8,
    payload: *mut u8,
    payload_len: usize,
    iov: Box<[libc::iovec; 2]>,
    registered: bool,
}

fn leak(len: usize) -> *mut u8 {
    Box::leak(vec![0u8; len].into_boxed_slice()).as_mut_ptr()
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// The SQE of `cmd` for entry `idx` of queue `qid`.
fn sqe(fd: i32, cmd: u32, qid: u16, commit_id: u64, idx: usize, ent: &Ent) -> squeue::Entry128 {
    // struct fuse_uring_cmd_req: flags u64, commit_id u64, qid u16, padding.
    let mut req = [0u8; 80];
    req[8..16].copy_from_slice(&commit_id.to_le_bytes());
    req[16..18].copy_from_slice(&qid.to_le_bytes());
    let mut op = opcode::UringCmd80::new(types::Fd(fd), cmd).cmd(req);
    if cmd == CMD_REGISTER {
        op = op.addr(Some(ent.iov.as_ptr() as u64));
    }
    let e = op.build().user_data(idx as u64);
    if cmd != CMD_REGISTER {
        return e;
    }
    // The register command names two iovecs in the SQE's `len`, which io-uring's
    // builder does not set: patch the 32-bit field at byte 24 of the SQE.
    // SAFETY: `Entry128` is `#[repr(C)]` over the kernel's 128-byte SQE layout
    // (`io_uring_sqe` + 64 command bytes); both types are plain old data.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&2u32.to_le_bytes());
    // SAFETY: as above; every bit pattern of the SQE bytes is a valid `Entry128`.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// Number of queues the kernel keeps: one per possible CPU (`num_possible_cpus()`).
/// Every one needs an entry before the kernel uses the ring, so this must not count
/// only present or online CPUs (hot-pluggable machines have more possible ones).
fn possible_cpus() -> usize {
    if let Ok(list) = std::fs::read_to_string("/sys/devices/system/cpu/possible") {
        if let Some(n) = count_cpu_list(list.trim()) {
            return n;
        }
    }
    // SAFETY: sysconf has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
    if n > 0 { n as usize } else { 1 }
}

/// CPUs in a kernel CPU list such as `0-3,5,8-9`.
fn count_cpu_list(list: &str) -> Option<usize> {
    let mut n = 0;
    for part in list.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n += b.checked_sub(a)? + 1;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_lists_count() {
        assert_eq!(super::count_cpu_list("0-1"), Some(2));
        assert_eq!(super::count_cpu_list("0"), Some(1));
        assert_eq!(super::count_cpu_list("0-3,5,8-9"), Some(7));
        assert_eq!(super::count_cpu_list(""), None);
        assert_eq!(super::count_cpu_list("3-1"), None);
    }
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET bounds-checks `cpu`.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            // Still correct, only slower: requests of this CPU are served elsewhere.
            warn!(
                "fuse-uring: cannot pin queue {cpu}: {}",
                io::Error::last_os_error()
            );
        }
    }
}

type Ring = IoUring<squeue::Entry128, cqueue::Entry>;

/// Whether this process can make the rings the transport needs (io_uring may be off:
/// `kernel.io_uring_disabled`, a seccomp filter). Asked before `FUSE_OVER_IO_URING` is
/// accepted at INIT: once it is, the kernel holds every request until each CPU's queue
/// has an entry, so a transport that cannot start would hang the mount.
pub fn usable() -> bool {
    Ring::builder().build(2).is_ok()
}

/// Start the queue threads; each returns when the connection ends or `stop` is set.
/// `max_payload` is the kernel's largest request or reply body. If the rings cannot be
/// made (io_uring turned off by `kernel.io_uring_disabled`, a seccomp filter), no entry
/// is registered, and the kernel keeps sending every request through `/dev/fuse`.
pub(crate) fn start<FS: Filesystem + Send + Sync + 'static>(
    ch: &Channel,
    event_loop: impl Fn(usize) -> SessionEventLoop<FS>,
    max_payload: usize,
    stop: Arc<AtomicBool>,
) -> io::Result<Vec<JoinHandle<io::Result<()>>>> {
    let mut threads = Vec::new();
    let cpus = possible_cpus();
    let per_queue = if cpus > MANY_CPUS {
        1
    } else {
        THREADS_PER_QUEUE
    };
    let mut rings = Vec::new();
    for qid in 0..cpus {
        for _ in 0..per_queue {
            match Ring::builder().build((ENTRIES_PER_THREAD * 2) as u32) {
                Ok(ring) => rings.push((qid, ring)),
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("FUSE over io_uring: making a ring: {e}"),
                    ));
                }
            }
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let n = rings.len();
    for (qid, ring) in rings {
        let se = event_loop(qid);
        let fd = ch.as_fd().as_raw_fd();
        let stop = stop.clone();
        let tx = tx.clone();
        threads.push(
            std::thread::Builder::new()
                .name(format!("fuse-ring-{qid}"))
                .spawn(move || serve_queue(fd, qid, ring, se, max_payload, &stop, tx))?,
        );
    }
    // Every queue must hold an entry, or the kernel holds every request: a failure
    // here ends the session (the daemon exits and the kernel fails the requests).
    for _ in 0..n {
        match rx.recv_timeout(std::time::Duration::from_secs(10)) {
            Ok(Ok(())) => {}
            // Unmounted while the queues registered (a SIGINT right after the mount):
            // the session simply ended, as when a request finds the connection gone.
            Ok(Err(e)) if e.kind() == io::ErrorKind::NotConnected => {
                stop.store(true, Ordering::Relaxed);
                return Ok(threads);
            }
            Ok(Err(e)) => {
                stop.store(true, Ordering::Relaxed);
                return Err(io::Error::new(e.kind(), format!("FUSE over io_uring: {e}")));
            }
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                return Err(io::Error::other(
                    "FUSE over io_uring: a queue did not register within 10 s",
                ));
            }
        }
    }
    Ok(threads)
}

fn serve_queue<FS: Filesystem>(
    fd: i32,
    qid: usize,
    mut ring: Ring,
    se: SessionEventLoop<FS>,
    max_payload: usize,
    stop: &AtomicBool,
    registered: std::sync::mpsc::Sender<io::Result<()>>,
) -> io::Result<()> {
    pin_to(qid);
    apply_serving_policy();
    let q = u16::try_from(qid).map_err(|_| io::Error::other("too many CPUs"))?;
    let mut ents: Vec<Ent> = (0..ENTRIES_PER_THREAD)
        .map(|_| {
            let hdr = leak(REQ_HEADER);
            let payload = leak(max_payload);
            let iov = Box::new([
                libc::iovec {
                    iov_base: hdr.cast(),
                    iov_len: REQ_HEADER,
                },
                libc::iovec {
                    iov_base: payload.cast(),
                    iov_len: max_payload,
                },
            ]);
            Ent {
                hdr,
                payload,
                payload_len: max_payload,
                iov,
                registered: false,
            }
        })
        .collect();
    let mut pending = match register(&mut ring, fd, q, &ents) {
        Ok(p) => {
            let _ = registered.send(Ok(()));
            p
        }
        Err(e) => {
            let err = io::Error::new(e.kind(), format!("registering queue {qid}: {e}"));
            let _ = registered.send(Err(io::Error::new(e.kind(), err.to_string())));
            // The connection is gone (unmounted meanwhile): an end, not a failure.
            if e.kind() == io::ErrorKind::NotConnected {
                return Ok(());
            }
            return Err(err);
        }
    };
    let slot = Arc::new(parking_lot::Mutex::new(ReplySlot {
        body: std::ptr::null_mut(),
        cap: 0,
        len: None,
        hdr: [0; 16],
    }));
    let sender = se.ch.sender().capturing(slot.clone());
    // Requests are parsed in place: 8-byte aligned, as `fuse_in_header` needs.
    let mut req = vec![0u64; (IN_HDR + OP_IN + max_payload).div_ceil(8)];
    let wait = types::Timespec::new().nsec(100_000_000);
    while !stop.load(Ordering::Relaxed) {
        let args = types::SubmitArgs::new().timespec(&wait);
        // Wait for a request unless some are already at hand (from registration).
        let want = usize::from(pending.is_empty());
        match ring.submitter().submit_with_args(want, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOMEM)) => {
                // The kernel is short of memory for the submission: try again soon.
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Err(e) => return Err(e),
        }
        pending.extend(ring.completion().map(|c| (c.user_data(), c.result())));
        for (idx, res) in std::mem::take(&mut pending) {
            let i = idx as usize;
            let Some(e) = ents.get_mut(i) else { continue };
            if res == -libc::EAGAIN || res == -libc::EINTR {
                // Not taken: submit the same command again.
                let cmd = if e.registered {
                    CMD_COMMIT_AND_FETCH
                } else {
                    CMD_REGISTER
                };
                let commit = if e.registered { last_commit_id(e) } else { 0 };
                let s = sqe(fd, cmd, q, commit, i, e);
                // SAFETY: as at registration.
                unsafe { ring.submission().push(&s) }.map_err(|_| io::Error::other("ring full"))?;
                continue;
            }
            if res < 0 {
                let err = io::Error::from_raw_os_error(-res);
                if matches!(
                    -res,
                    libc::ENOTCONN | libc::ECONNABORTED | libc::ENODEV | libc::ECANCELED
                ) {
                    return Ok(()); // the connection or the ring ended
                }
                error!("fuse-uring queue {qid}: entry {i}: {err}");
                return Err(err);
            }
            e.registered = true;
            SERVED.fetch_add(1, Ordering::Relaxed);
            let commit_id = serve_one(e, &se, &sender, &slot, &mut req);
            let s = sqe(fd, CMD_COMMIT_AND_FETCH, q, commit_id, i, e);
            // SAFETY: commit-and-fetch names the entry registered before.
            unsafe { ring.submission().push(&s) }.map_err(|_| io::Error::other("ring full"))?;
        }
    }
    // Leave the entries registered: the ring's teardown cancels them.
    std::mem::forget(ents);
    Ok(())
}

/// Register `ents` with queue `q`; returns completions that already came (requests:
/// the queue may be in use as soon as every queue has an entry). A register that the
/// kernel answers EAGAIN (INIT not processed yet) is sent again.
fn register(ring: &mut Ring, fd: i32, q: u16, ents: &[Ent]) -> io::Result<Vec<(u64, i32)>> {
    let mut todo: Vec<usize> = (0..ents.len()).collect();
    let mut came = Vec::new();
    for _attempt in 0..1000 {
        for &i in &todo {
            let s = sqe(fd, CMD_REGISTER, q, 0, i, &ents[i]);
            // SAFETY: the SQE points at `ents[i].iov`, which is never freed.
            unsafe { ring.submission().push(&s) }.map_err(|_| io::Error::other("ring full"))?;
        }
        todo.clear();
        ring.submit()?;
        // A refused register completes at once; an accepted one completes only when a
        // request arrives.
        for (ud, res) in ring.completion().map(|c| (c.user_data(), c.result())) {
            match res {
                r if r == -libc::EAGAIN || r == -libc::EINTR => todo.push(ud as usize),
                r if r < 0 => return Err(io::Error::from_raw_os_error(-r)),
                _ => came.push((ud, res)),
            }
        }
        if todo.is_empty() {
            return Ok(came);
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Err(io::Error::other(
        "the kernel kept refusing the registration (EAGAIN)",
    ))
}

fn last_commit_id(e: &Ent) -> u64 {
    // SAFETY: called between the entry's completion and its next submission.
    let hdr = unsafe { std::slice::from_raw_parts(e.hdr, REQ_HEADER) };
    le64(hdr, ENT_IN_OUT + 8)
}

/// Serve the request in entry `e` and write its reply there; returns its commit id.
fn serve_one<FS: Filesystem>(
    e: &mut Ent,
    se: &SessionEventLoop<FS>,
    sender: &crate::channel::ChannelSender,
    slot: &parking_lot::Mutex<ReplySlot>,
    req: &mut [u64],
) -> u64 {
    // SAFETY: the kernel completed this entry: its buffers are ours until the next
    // submission (module invariants). The header is only touched through `hdr`; the
    // payload is read through a slice that ends before the reply is written into it
    // through the slot's pointer.
    let hdr = unsafe { std::slice::from_raw_parts_mut(e.hdr, REQ_HEADER) };
    let commit_id = le64(hdr, ENT_IN_OUT + 8);
    let unique = le64(hdr, 8);
    let len = le32(hdr, 0) as usize;
    let payload_sz = le32(hdr, ENT_IN_OUT + 16) as usize;
    // The in header's length counts the op header, which sits in its own area.
    let op_sz = len.checked_sub(IN_HDR + payload_sz).filter(|&n| n <= OP_IN);
    let req = match op_sz {
        Some(op_sz) if payload_sz <= e.payload_len => {
            // SAFETY: as above; `payload` is dropped at the end of this block.
            let payload = unsafe { std::slice::from_raw_parts(e.payload, payload_sz) };
            let req = &mut req.as_mut_bytes()[..len];
            req[..IN_HDR].copy_from_slice(&hdr[..IN_HDR]);
            req[IN_HDR..IN_HDR + op_sz].copy_from_slice(&hdr[OP_IN..OP_IN + op_sz]);
            req[IN_HDR + op_sz..].copy_from_slice(payload);
            Some(&*req)
        }
        _ => {
            error!("fuse-uring: request {unique}: bad lengths {len} / {payload_sz}");
            None
        }
    };
    {
        // Arm the slot: the reply's body goes straight into the payload buffer.
        let mut s = slot.lock();
        s.body = e.payload;
        s.cap = e.payload_len;
        s.len = None;
    }
    if let Some(req) = req {
        match RequestWithSender::new(sender.clone(), req) {
            Some(r) => {
                if let Ok(Operation::Destroy(_)) = r.request.operation() {
                    r.reply::<ReplyEmpty>().ok();
                } else {
                    r.dispatch(se);
                }
            }
            None => error!("fuse-uring: request {unique} does not parse"),
        }
    }
    let (error, body_len) = {
        // Disarm: a reply sent from now on is dropped (see `ReplySlot`).
        let mut s = slot.lock();
        s.body = std::ptr::null_mut();
        match s.len {
            Some(n) => (
                i32::from_le_bytes([s.hdr[4], s.hdr[5], s.hdr[6], s.hdr[7]]),
                n,
            ),
            _ => (-libc::EIO, 0),
        }
    };
    hdr[..OUT_HDR].fill(0);
    hdr[0..4].copy_from_slice(&((OUT_HDR + body_len) as u32).to_le_bytes());
    hdr[4..8].copy_from_slice(&error.to_le_bytes());
    hdr[8..16].copy_from_slice(&unique.to_le_bytes());
    hdr[ENT_IN_OUT + 16..ENT_IN_OUT + 20].copy_from_slice(&(body_len as u32).to_le_bytes());
    commit_id
}
