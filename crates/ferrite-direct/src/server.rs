//! The daemon's side of direct access: the table, the liveness sentinel, a listening
//! socket and one thread per client connection, taken from a few spare threads kept
//! waiting (a client's attach then does not wait for a thread to be made: about 65-100
//! us of its HELLO round trip on the development VM).
//!
//! Invariants:
//! - A connection becomes a party only after HELLO proved the peer holds the pool
//!   file open for reading and writing (the pool file's permissions are the access
//!   control) and a party slot was free.
//! - When a connection ends for any reason (BYE, the client's death, a protocol
//!   error, the daemon's stop), its party is resolved (`Fs::resolve_party`) before the
//!   slot can be reused; resolutions run one at a time.
//! - The connection threads never take an inode lock (grants and returns need none),
//!   so a client that holds a lock while it asks for blocks is always answered.

use crate::wire::{self, In, Out};
use ferrite_core::share::{Party, Table};
use ferrite_core::{Fs, MmapMedium};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, sockopt, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// The name of the extended attribute of a mount's root that tells clients how to
/// attach (the daemon answers it; it is not stored).
pub const INFO_XATTR: &str = "user.ferrite.direct";

/// A table made for a mounted pool, not yet serving.
pub struct Shared {
    table: Arc<Table>,
    memfd: OwnedFd,
}

/// Make the coordination table for `fs`, arm the liveness sentinel and return `fs`
/// sharing its pool through the table.
pub fn share(fs: Fs<MmapMedium>) -> io::Result<(Fs<MmapMedium>, Shared)> {
    let (ni, nb) = (fs.geometry().ninodes, fs.geometry().nblocks);
    let (memfd, region) = crate::shm::create(ni, nb)?;
    let table = Arc::new(Table::create(Box::new(region), ni, nb, &fs.superblock().uuid));
    crate::alive::start(table.clone())?;
    let fs = fs.share_with(Arc::new(Party::daemon(table.clone())));
    Ok((fs, Shared { table, memfd }))
}

/// Counters of the direct-access server.
#[derive(Default, Debug)]
pub struct ServerStats {
    /// Clients that attached.
    pub attached: AtomicU64,
    /// Clients whose connection ended without BYE (death).
    pub died: AtomicU64,
    /// Blocks returned by resolving ended clients.
    pub reclaimed: AtomicU64,
    /// Blocks granted.
    pub granted: AtomicU64,
}

struct Inner {
    fs: Arc<Fs<MmapMedium>>,
    table: Arc<Table>,
    memfd: OwnedFd,
    listener: OwnedFd,
    name: String,
    pool: PathBuf,
    pool_id: (u64, u64),
    stop: AtomicBool,
    conns: Mutex<HashMap<u64, RawFd>>,
    resolving: Mutex<()>,
    stats: ServerStats,
}

/// The running server.
pub struct Server {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Server {
    /// Listen for clients of `fs` (which must have been made by [`share`]).
    pub fn start(fs: Arc<Fs<MmapMedium>>, shared: Shared, pool: &Path) -> io::Result<Server> {
        let pool_id = fs.medium().file_id()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let name = format!("ferrite-direct.{}.{now:x}", std::process::id());
        let listener =
            socket::socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)?;
        let addr = UnixAddr::new_abstract(name.as_bytes())?;
        socket::bind(listener.as_raw_fd(), &addr)?;
        socket::listen(&listener, Backlog::new(64)?)?;
        let inner = Arc::new(Inner {
            fs,
            table: shared.table,
            memfd: shared.memfd,
            listener,
            name,
            pool: pool.to_path_buf(),
            pool_id,
            stop: AtomicBool::new(false),
            conns: Mutex::new(HashMap::new()),
            resolving: Mutex::new(()),
            stats: ServerStats::default(),
        });
        let mut threads = Vec::new();
        let me = inner.clone();
        threads.push(
            std::thread::Builder::new()
                .name("ferrite-direct".into())
                .spawn(move || accept_loop(me))?,
        );
        Ok(Server { inner, threads: Mutex::new(threads) })
    }

    /// The value of [`INFO_XATTR`]: what a client needs to attach.
    pub fn info(&self) -> String {
        format!(
            "ferrite-direct {}\nsocket=@{}\npool={}\n",
            wire::VERSION,
            self.inner.name,
            self.inner.pool.display()
        )
    }

    /// Counters.
    pub fn stats(&self) -> &ServerStats {
        &self.inner.stats
    }

    /// The table (the FUSE layer keeps the per-inode page-cache flags in it).
    pub fn table(&self) -> &Arc<Table> {
        &self.inner.table
    }

    /// Stop: refuse new clients, revoke every client (each finishes the operation it
    /// is in, then commits nothing more), take their blocks back, close their
    /// connections and join the threads. Idempotent.
    pub fn stop(&self) {
        let i = &self.inner;
        if i.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        {
            let _g = i.resolving.lock();
            if let Err(e) = i.fs.resolve_all_clients() {
                eprintln!("ferrite: taking direct access back: {e}");
            }
        }
        for (_, fd) in i.conns.lock().iter() {
            let _ = socket::shutdown(*fd, socket::Shutdown::Both);
        }
        let hs: Vec<_> = std::mem::take(&mut *self.threads.lock());
        for h in hs {
            let _ = h.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Connection threads kept waiting for the next clients once their own ended.
const SPARE_THREADS: usize = 4;

/// A connection to serve: its id (in `Inner::conns`) and socket.
type Job = (u64, OwnedFd);

/// The connection threads: `idle` counts those committed to take the next job from
/// the channel (each job sent was counted out of it first, so one of them takes it).
struct Workers {
    me: Arc<Inner>,
    tx: Option<mpsc::Sender<Job>>,
    rx: Arc<Mutex<mpsc::Receiver<Job>>>,
    idle: Arc<AtomicUsize>,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    fn new(me: Arc<Inner>) -> Workers {
        let (tx, rx) = mpsc::channel();
        let rx = Arc::new(Mutex::new(rx));
        Workers { me, tx: Some(tx), rx, idle: Arc::new(AtomicUsize::new(0)), handles: Vec::new() }
    }

    /// Serve `job` on a waiting thread, or on a new one when none waits.
    fn dispatch(&mut self, job: Job) {
        let taken =
            self.idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
        match (taken, &self.tx) {
            (Ok(_), Some(tx)) => {
                // A counted thread is waiting on (or about to wait on) the channel.
                let _ = tx.send(job);
            }
            _ => self.spawn(Some(job)),
        }
        self.handles.retain(|h| !h.is_finished());
    }

    /// Keep one thread waiting for the next client.
    fn keep_spare(&mut self) {
        if self.idle.load(Ordering::Acquire) == 0 {
            self.idle.fetch_add(1, Ordering::AcqRel);
            self.spawn(None);
        }
    }

    fn spawn(&mut self, first: Option<Job>) {
        let spare = first.is_none();
        let id = first.as_ref().map(|j| j.0);
        let (me, rx, idle) = (self.me.clone(), self.rx.clone(), self.idle.clone());
        match std::thread::Builder::new()
            .name("ferrite-client".into())
            .spawn(move || worker(me, rx, idle, first))
        {
            Ok(h) => self.handles.push(h),
            Err(e) => {
                if spare {
                    self.idle.fetch_sub(1, Ordering::AcqRel);
                } else {
                    eprintln!("ferrite: cannot serve a direct-access client: {e}");
                }
                if let Some(id) = id {
                    self.me.conns.lock().remove(&id);
                }
            }
        }
    }

    /// No more jobs: the waiting threads end, the busy ones after their connection.
    fn finish(mut self) {
        drop(self.tx.take());
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
    }
}

/// A connection thread: serve `first`, then wait for more while fewer than
/// [`SPARE_THREADS`] others wait.
fn worker(
    me: Arc<Inner>,
    rx: Arc<Mutex<mpsc::Receiver<Job>>>,
    idle: Arc<AtomicUsize>,
    first: Option<Job>,
) {
    let mut job = first;
    loop {
        if let Some((id, fd)) = job.take() {
            serve_conn(me.clone(), id, fd);
            let back = idle.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < SPARE_THREADS).then_some(n + 1)
            });
            if back.is_err() {
                return;
            }
        }
        // Counted in `idle`: the next job sent is this thread's or another waiter's.
        let next = rx.lock().recv();
        match next {
            Ok(j) => job = Some(j),
            Err(_) => return, // the server is stopping
        }
    }
}

fn accept_loop(me: Arc<Inner>) {
    let mut next_id = 0u64;
    let mut workers = Workers::new(me.clone());
    workers.keep_spare();
    while !me.stop.load(Ordering::Acquire) {
        let mut pfd = [PollFd::new(me.listener.as_fd(), PollFlags::POLLIN)];
        // Wake up now and then to notice a stop.
        match poll(&mut pfd, PollTimeout::from(200u16)) {
            Ok(n) if n > 0 => {}
            _ => continue,
        }
        let fd = match socket::accept4(me.listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            Ok(fd) => fd,
            Err(_) => continue,
        };
        let fd = crate::own_fd(fd);
        next_id += 1;
        let id = next_id;
        me.conns.lock().insert(id, fd.as_raw_fd());
        workers.dispatch((id, fd));
        // After the hand-over: the client is served meanwhile.
        workers.keep_spare();
    }
    workers.finish();
}

fn refuse(fd: RawFd, errno: i32, msg: &str) {
    let body = Out::default().u32(errno as u32).bytes(msg.as_bytes());
    let _ = wire::send(fd, wire::REFUSE, &body.0, &[], false);
}

/// Check HELLO and make the peer a party.
fn hello(me: &Inner, sock: &OwnedFd, m: &wire::Msg) -> Result<u32, (i32, String)> {
    let v = In::new(&m.body).u32().map_err(|e| (libc::EPROTO, e.to_string()))?;
    if v != wire::VERSION {
        return Err((
            libc::EPROTO,
            format!("protocol version {v}, the daemon speaks {}", wire::VERSION),
        ));
    }
    if me.stop.load(Ordering::Acquire) {
        return Err((libc::ESHUTDOWN, "the mount is ending".into()));
    }
    let Some(pool) = m.fds.first() else {
        return Err((libc::EPROTO, "HELLO without the pool file".into()));
    };
    let st = nix::sys::stat::fstat(pool).map_err(|e| (e as i32, e.to_string()))?;
    if (st.st_dev, st.st_ino) != me.pool_id {
        return Err((libc::EACCES, "the descriptor sent is not this mount's pool file".into()));
    }
    let fl = nix::fcntl::fcntl(pool, nix::fcntl::FcntlArg::F_GETFL)
        .map_err(|e| (e as i32, e.to_string()))?;
    if fl & libc::O_ACCMODE != libc::O_RDWR {
        return Err((libc::EACCES, "the pool file must be open for reading and writing".into()));
    }
    let pid =
        socket::getsockopt(sock, sockopt::PeerCredentials).map(|c| c.pid() as u32).unwrap_or(0);
    me.table
        .claim_party(pid)
        .ok_or((libc::EAGAIN, "too many direct-access clients attached".into()))
}

fn serve_conn(me: Arc<Inner>, id: u64, fd: OwnedFd) {
    let raw = fd.as_raw_fd();
    let mut party: Option<u32> = None;
    let mut clean = false;
    loop {
        let mut m = match wire::recv(raw) {
            Ok(Some(m)) => m,
            _ => break,
        };
        match (party, m.kind) {
            (None, wire::HELLO) => match hello(&me, &fd, &m).inspect(|_| {
                drop(std::mem::take(&mut m.fds));
                me.fs.medium().renew_holder_lock();
            }) {
                Ok(p) => {
                    party = Some(p);
                    me.stats.attached.fetch_add(1, Ordering::Relaxed);
                    let g = me.fs.geometry();
                    let body = Out::default()
                        .u32(p)
                        .u32(0)
                        .u64(g.ninodes)
                        .u64(g.nblocks)
                        .bytes(&me.fs.superblock().uuid);
                    if wire::send(raw, wire::WELCOME, &body.0, &[me.memfd.as_raw_fd()], false)
                        .is_err()
                    {
                        break;
                    }
                }
                Err((errno, msg)) => {
                    refuse(raw, errno, &msg);
                    break;
                }
            },
            (Some(p), wire::GRANT) => {
                let want = match In::new(&m.body).u64() {
                    Ok(w) => w,
                    Err(_) => break,
                };
                match me.fs.grant_blocks(p, want) {
                    Ok(runs) => {
                        let n: u64 = runs.iter().map(|r| r.1).sum();
                        me.stats.granted.fetch_add(n, Ordering::Relaxed);
                        let body = Out::default().runs(&runs[..runs.len().min(wire::MAX_RUNS)]);
                        if runs.len() > wire::MAX_RUNS {
                            let _ = me.fs.take_back(p, &runs[wire::MAX_RUNS..]);
                        }
                        if wire::send(raw, wire::GRANTED, &body.0, &[], false).is_err() {
                            break;
                        }
                    }
                    Err(e) => refuse(raw, e.errno(), &e.to_string()),
                }
            }
            (Some(p), wire::RETURN) => {
                let Ok(runs) = In::new(&m.body).runs() else { break };
                if let Err(e) = me.fs.take_back(p, &runs) {
                    eprintln!("ferrite: direct-access client (party {p}): {e}; disconnecting it");
                    break;
                }
            }
            (Some(_), wire::BYE) => {
                clean = true;
                break;
            }
            _ => break, // protocol error: end the connection
        }
    }
    if let Some(p) = party {
        if !clean && !me.stop.load(Ordering::Acquire) {
            me.stats.died.fetch_add(1, Ordering::Relaxed);
        }
        let _g = me.resolving.lock();
        match me.fs.resolve_party(p) {
            Ok(r) => {
                me.stats.reclaimed.fetch_add(r.blocks_returned, Ordering::Relaxed);
                if !clean && r.inodes + r.blocks_returned > 0 && !me.stop.load(Ordering::Acquire) {
                    eprintln!(
                        "ferrite: direct-access client (party {p}) ended without detaching: \
                         {} inodes checked, {} blocks returned",
                        r.inodes, r.blocks_returned
                    );
                }
            }
            Err(e) => eprintln!("ferrite: resolving direct-access client (party {p}): {e}"),
        }
    }
    me.conns.lock().remove(&id);
    drop(fd);
    // A refused HELLO closed the pool descriptor it carried.
    me.fs.medium().renew_holder_lock();
}
