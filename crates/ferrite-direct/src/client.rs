//! A direct-access client: attach to a mount's daemon, map the pool and the
//! coordination table, and run the core's own read and write paths in this process.
//!
//! Invariants:
//! - A process attaches only if it can open the pool file for reading and writing
//!   itself; otherwise [`AttachError::NoAccess`] (callers then use the mount, quietly).
//! - The client holds a shared lock on the pool file's byte 1 while it may store to
//!   the pool. A watcher thread notices the daemon's end (the connection hangs up):
//!   it waits until no inode lock of this client is held (no operation of it is
//!   half-committed), then drops that lock, so the pool can be mounted again.
//! - The watcher is also the keeper of the client's inode-lock leases (see
//!   `ferrite_core`'s sharing module): while leases exist it wakes every
//!   `LEASE_TICK` and gives back the ones another party waits for or nobody used;
//!   some 0.5 s after the last one went it sleeps until the core's waker (an
//!   eventfd) says one was taken.
//!   Before the watcher waits for this client's locks to be released at the
//!   daemon's end, it gives every lease back.
//! - After `fork`, the child must call [`Client::abandon`] (never detach): the
//!   allocator and the connection it inherited are the parent's.

use crate::wire::{self, In, Out};
use ferrite_core::share::{BlockSource, Party, Table, P_ACTIVE, P_REVOKED};
use ferrite_core::{Error, Fs, MapOptions, MmapMedium};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// The preload library installed with the `ferrite` binary `exe`: beside it, or in
/// `../lib` (an install prefix), or `../lib/ferrite`.
pub fn preload_library(exe: &Path) -> Option<PathBuf> {
    const LIB: &str = "libferrite_preload.so";
    let dir = exe.parent()?;
    [dir.join(LIB), dir.join("../lib").join(LIB), dir.join("../lib/ferrite").join(LIB)]
        .into_iter()
        .find(|p| p.is_file())
        .and_then(|p| p.canonicalize().ok())
}

/// What a mount says about its direct access.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// Abstract socket name of the daemon (without the leading '@').
    pub socket: String,
    /// The pool file.
    pub pool: PathBuf,
}

/// Why a process cannot attach.
#[derive(Debug)]
pub enum AttachError {
    /// The mount offers no direct access (not FerriteFS, or mounted without it).
    NotOffered(String),
    /// This process may not open the pool file: it keeps using the mount.
    NoAccess(String),
    /// The daemon refused, or something failed on the way.
    Failed(String),
}

impl std::fmt::Display for AttachError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttachError::NotOffered(m) => write!(f, "no direct access offered: {m}"),
            AttachError::NoAccess(m) => write!(f, "no access to the pool file: {m}"),
            AttachError::Failed(m) => write!(f, "direct access failed: {m}"),
        }
    }
}

/// Read and parse the mount's [`crate::INFO_XATTR`].
pub fn info_of(mount: &Path) -> Result<Info, AttachError> {
    let v =
        xattr_get(mount, crate::INFO_XATTR).map_err(|e| AttachError::NotOffered(e.to_string()))?;
    let text = String::from_utf8_lossy(&v);
    let mut lines = text.lines();
    let head = lines.next().unwrap_or("");
    if head != format!("ferrite-direct {}", wire::VERSION) {
        return Err(AttachError::NotOffered(format!("unknown direct-access offer {head:?}")));
    }
    let (mut socket, mut pool) = (None, None);
    for l in lines {
        if let Some(s) = l.strip_prefix("socket=@") {
            socket = Some(s.to_string());
        } else if let Some(p) = l.strip_prefix("pool=") {
            pool = Some(PathBuf::from(p));
        }
    }
    match (socket, pool) {
        (Some(socket), Some(pool)) => Ok(Info { socket, pool }),
        _ => Err(AttachError::NotOffered("incomplete direct-access offer".into())),
    }
}

fn xattr_get(path: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    let n = rustix::fs::getxattr(path, name, &mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// The client's end of the connection: the block source of its allocator.
struct Conn {
    fd: OwnedFd,
    /// One request waiting for its answer at a time.
    ask: Mutex<()>,
    detaching: AtomicBool,
}

impl Conn {
    fn request(&self, kind: u32, body: &[u8]) -> ferrite_core::Result<wire::Msg> {
        let _g = self.ask.lock();
        let gone = |e: std::io::Error| Error::Disconnected(format!("daemon connection: {e}"));
        wire::send(self.fd.as_raw_fd(), kind, body, &[], false).map_err(gone)?;
        match wire::recv(self.fd.as_raw_fd()).map_err(gone)? {
            Some(m) => Ok(m),
            None => Err(Error::Disconnected("the mount daemon closed the connection".into())),
        }
    }
}

fn refusal(m: &wire::Msg) -> (i32, String) {
    let mut r = In::new(&m.body);
    let errno = r.u32().unwrap_or(libc::EIO as u32) as i32;
    (errno, String::from_utf8_lossy(r.rest()).into_owned())
}

impl BlockSource for Conn {
    fn grant(&self, want: u64) -> ferrite_core::Result<Vec<(u64, u64)>> {
        let m = self.request(wire::GRANT, &Out::default().u64(want).0)?;
        match m.kind {
            wire::GRANTED => {
                In::new(&m.body).runs().map_err(|e| Error::Disconnected(format!("bad grant: {e}")))
            }
            wire::REFUSE => match refusal(&m) {
                (libc::ENOSPC, _) => Err(Error::NoSpace),
                (_, msg) => Err(Error::Disconnected(msg)),
            },
            k => Err(Error::Disconnected(format!("unexpected answer {k} to a grant"))),
        }
    }

    fn give_back(&self, runs: &[(u64, u64)]) {
        for chunk in runs.chunks(wire::MAX_RUNS) {
            let _ = wire::send(
                self.fd.as_raw_fd(),
                wire::RETURN,
                &Out::default().runs(chunk).0,
                &[],
                false,
            );
        }
    }
}

/// An attached client.
pub struct Client {
    fs: Option<Arc<Fs<MmapMedium>>>,
    conn: Arc<Conn>,
    watcher: Option<JoinHandle<()>>,
    /// Wakes the watcher when the first lease is taken (an eventfd).
    waker: Arc<OwnedFd>,
    dead: Arc<AtomicBool>,
    mount: PathBuf,
    info: Info,
}

/// The lowest number a client's own descriptors take: half the process's soft
/// limit of open files, at most 512 (a shell's `exec 3>file`, or any program's
/// `dup2` to a number it picked, found the library's descriptors in the low
/// numbers and failed with EBUSY). Not so high that the kernel grows the
/// process's descriptor table much.
fn high_fd_base() -> i32 {
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    soft.map_or(512, |s| (s / 2).min(512) as i32)
}

/// `fd` moved to the lowest free number at or above `min` (close-on-exec).
fn raised(fd: OwnedFd, min: i32) -> std::io::Result<OwnedFd> {
    Ok(rustix::io::fcntl_dupfd_cloexec(&fd, min)?)
}

impl Client {
    /// Attach to the daemon serving the FerriteFS mount at `mount`.
    pub fn attach(mount: &Path) -> Result<Client, AttachError> {
        let info = info_of(mount)?;
        let fail =
            |what: &str, e: &dyn std::fmt::Display| AttachError::Failed(format!("{what}: {e}"));
        let mut medium =
            MmapMedium::attach(&info.pool, &MapOptions::default()).map_err(|e| {
                match e.raw_os_error() {
                    Some(libc::EACCES) | Some(libc::EPERM) | Some(libc::EROFS) => {
                        AttachError::NoAccess(format!("{}: {e}", info.pool.display()))
                    }
                    _ => fail(&info.pool.display().to_string(), &e),
                }
            })?;
        let low = high_fd_base();
        medium.raise_fd(low).map_err(|e| fail("moving the pool's descriptor", &e))?;
        let sock =
            socket::socket(AddressFamily::Unix, SockType::SeqPacket, SockFlag::SOCK_CLOEXEC, None)
                .map_err(|e| fail("socket", &e))?;
        let sock = raised(sock, low).map_err(|e| fail("socket", &e))?;
        let addr =
            UnixAddr::new_abstract(info.socket.as_bytes()).map_err(|e| fail("socket name", &e))?;
        socket::connect(sock.as_raw_fd(), &addr)
            .map_err(|e| fail("connecting to the daemon", &e))?;
        let hello = Out::default().u32(wire::VERSION).u32(std::process::id());
        wire::send(sock.as_raw_fd(), wire::HELLO, &hello.0, &[medium.raw_fd()], false)
            .map_err(|e| fail("HELLO", &e))?;
        let m = wire::recv(sock.as_raw_fd())
            .map_err(|e| fail("waiting for the daemon", &e))?
            .ok_or_else(|| AttachError::Failed("the daemon closed the connection".into()))?;
        if m.kind == wire::REFUSE {
            let (errno, msg) = refusal(&m);
            return Err(if errno == libc::EACCES {
                AttachError::NoAccess(msg)
            } else {
                AttachError::Failed(format!("the daemon refused: {msg}"))
            });
        }
        if m.kind != wire::WELCOME || m.fds.len() != 1 {
            return Err(AttachError::Failed(format!("unexpected answer {} to HELLO", m.kind)));
        }
        let mut r = In::new(&m.body);
        let parse = |r: &mut In<'_>| -> std::io::Result<(u32, u64, u64, [u8; 16])> {
            let party = r.u32()?;
            r.u32()?;
            let (ni, nb) = (r.u64()?, r.u64()?);
            let uuid: [u8; 16] = r.bytes(16)?.try_into().expect("16 bytes");
            Ok((party, ni, nb, uuid))
        };
        let (party, ni, nb, uuid) = parse(&mut r).map_err(|e| fail("WELCOME", &e))?;
        let region =
            crate::shm::map(&m.fds[0], ni, nb).map_err(|e| fail("mapping the table", &e))?;
        drop(m); // the memfd: the mapping keeps the memory
        let table = Arc::new(Table::open(Box::new(region), &uuid).map_err(|e| fail("table", &e))?);
        let conn =
            Arc::new(Conn { fd: sock, ask: Mutex::new(()), detaching: AtomicBool::new(false) });
        let p = Arc::new(Party::client(table.clone(), party, conn.clone()));
        let fs = match Fs::attach(medium, p) {
            Ok(fs) => Arc::new(fs),
            Err(e) => {
                let _ = wire::send(conn.fd.as_raw_fd(), wire::BYE, &[], &[], false);
                return Err(fail("attaching", &e));
            }
        };
        let dead = Arc::new(AtomicBool::new(false));
        let waker =
            EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .map(OwnedFd::from)
                .map_err(|e| fail("eventfd", &e))?;
        let waker = Arc::new(raised(waker, low).map_err(|e| fail("eventfd", &e))?);
        let w = waker.clone();
        fs.keep_leases(Box::new(move || {
            let _ = rustix::io::write(&*w, &1u64.to_ne_bytes());
        }));
        let watcher = {
            let (fs, conn, dead, waker) = (fs.clone(), conn.clone(), dead.clone(), waker.clone());
            crate::quiet::spawn("ferrite-watch", move || watch(fs, conn, waker, dead, party))
                .map_err(|e| fail("watcher thread", &e))?
        };
        Ok(Client {
            fs: Some(fs),
            conn,
            watcher: Some(watcher),
            waker,
            dead,
            mount: mount.to_path_buf(),
            info,
        })
    }

    /// The core, in this process.
    pub fn fs(&self) -> &Fs<MmapMedium> {
        self.fs.as_ref().expect("client attached")
    }

    /// The mount this client serves.
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// What the mount offered.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// This client's party.
    pub fn party(&self) -> &Arc<Party> {
        self.fs().party().expect("a client has a party")
    }

    /// Still attached to a live daemon?
    pub fn usable(&self) -> bool {
        !self.dead.load(Ordering::Acquire) && self.party().check().is_ok()
    }

    /// May this process write `ino` directly now? False while kernel page-cache
    /// users of it exist (plain processes, shared mappings): writes then go through
    /// the mount so their caches stay true.
    pub fn may_write_direct(&self, ino: u64) -> bool {
        !self.party().no_direct(ino)
    }

    /// Mark `ino` as mapped through the kernel by this process: every client sends
    /// its writes of `ino` through the mount until the daemon sees it closed.
    pub fn note_kernel_mapping(&self, ino: u64) {
        self.party().table().set_flag(ino, ferrite_core::share::MAPPED, true);
    }

    /// The descriptors this client keeps open (its connection, the pool file and
    /// the lease keeper's eventfd).
    pub fn fds(&self) -> [std::os::fd::RawFd; 3] {
        [self.conn.fd.as_raw_fd(), self.fs().medium().raw_fd(), self.waker.as_raw_fd()]
    }

    /// The process is exiting (other threads may still run): tell the daemon this is
    /// an orderly end, and let it take the blocks back itself.
    pub fn exiting(&self) {
        self.fs().tick_leases(true);
        if self.fs().file_map_count() > 0 {
            // Other threads may still store through DAX mappings: the daemon must
            // not drop their pins (and let the blocks go) before the process is
            // gone, which it sees when the connection closes with the process.
            return;
        }
        let _ = wire::send(self.conn.fd.as_raw_fd(), wire::BYE, &[], &[], true);
    }

    /// Orderly end: blocks back to the daemon, then BYE.
    pub fn detach(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        let Some(fs) = self.fs.take() else { return };
        self.conn.detaching.store(true, Ordering::Release);
        let _ = socket::shutdown(self.conn.fd.as_raw_fd(), socket::Shutdown::Read);
        if let Some(w) = self.watcher.take() {
            let _ = w.join();
        }
        // Stores through DAX mappings end before the daemon may hand their
        // blocks to anyone else.
        fs.revoke_file_maps();
        if let Ok(fs) = Arc::try_unwrap(fs) {
            if !self.dead.load(Ordering::Acquire) {
                let m = fs.detach();
                let _ = wire::send(self.conn.fd.as_raw_fd(), wire::BYE, &[], &[], false);
                m.release_client_lock();
            }
        }
    }

    /// In a child after `fork`: close this process's copies of the connection and
    /// of the pool file without telling the daemon anything (they are the parent's),
    /// and forget the rest.
    pub fn abandon(self) {
        for fd in self.fds() {
            // A plain close of our copy: the parent's connection and lock stay.
            let _ = nix::unistd::close(fd);
        }
        std::mem::forget(self);
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Wait for the connection to hang up. Unless we are detaching, the daemon is gone
/// (or took direct access back): stop committing, wait for operations in flight,
/// release the pool.
fn watch(
    fs: Arc<Fs<MmapMedium>>,
    conn: Arc<Conn>,
    waker: Arc<OwnedFd>,
    dead: Arc<AtomicBool>,
    party: u32,
) {
    // The program's signal handlers must run on its own threads, not on this one.
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&nix::sys::signal::SigSet::all()),
        None,
    );
    let tick = rustix::event::Timespec::try_from(ferrite_core::LEASE_TICK).expect("a short tick");
    // Ticks without a lease before the keeper sleeps until woken: a program that
    // writes file after file (tar, cp) takes a lease per file, and each wake-up
    // was an eventfd write and two switches to this thread.
    const LINGER: u32 = 250;
    let mut idle = LINGER;
    loop {
        use rustix::event::{PollFd, PollFlags};
        let sleep = idle >= LINGER && fs.lease_keeper_may_sleep();
        let mut p = [PollFd::new(&conn.fd, PollFlags::RDHUP), PollFd::new(&*waker, PollFlags::IN)];
        let r = rustix::event::poll(&mut p, if sleep { None } else { Some(&tick) });
        if conn.detaching.load(Ordering::Acquire) {
            return;
        }
        if p[1].revents().contains(PollFlags::IN) {
            let _ = rustix::io::read(&*waker, &mut [0u8; 8]);
        }
        idle = if fs.tick_leases(false) { 0 } else { idle.saturating_add(1) };
        // Regression: nix's poll flags know no POLLRDHUP, so its `revents()` was
        // None whenever the kernel reported a hang-up; the watcher never saw the
        // daemon go and spun on a poll that returned at once, a core at 100%.
        let gone = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL;
        let hup = p[0].revents().intersects(gone);
        if !hup && !matches!(r, Err(e) if e != rustix::io::Errno::INTR) {
            continue;
        }
        break;
    }
    let table = fs.party().expect("party").table().clone();
    if !table.daemon_alive() && table.party_state(party) == P_ACTIVE {
        // Nobody can reuse our slot now: revoke ourselves, give our leases back,
        // then let every operation that holds one of our locks finish.
        table.set_party_state(party, P_REVOKED);
        fs.tick_leases(true);
        let n = table.ninodes();
        for ino in 1..=n {
            while table.holder(ino) == Some(party) {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
    }
    // The daemon takes our pins back once it holds our lock: no store through a
    // DAX mapping may reach the pool after that.
    fs.revoke_file_maps();
    dead.store(true, Ordering::Release);
    fs.medium().release_client_lock();
}
