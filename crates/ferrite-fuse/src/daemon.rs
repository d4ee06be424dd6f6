//! `ferrite mount` and `ferrite umount`: open the pool, mount, serve, unmount cleanly.
//!
//! Invariants:
//! - Without `-f`, the command re-executes itself as a detached daemon (a process
//!   group of its own in the caller's session, so it shares the scheduler autogroup
//!   of the programs that use the mount; cwd `/`) and returns only when the mount is
//!   live (exit 0) or has failed (exit 1 with the daemon's error), so mount(8), fstab
//!   and scripts can use the mount point at once. The daemon reports readiness on its
//!   stdout pipe and never writes there again.
//! - SIGINT, SIGTERM and SIGHUP are blocked in every serving thread and taken by one
//!   signal thread, which asks the kernel to unmount (lazily if busy). The session then
//!   ends like after `fusermount3 -u` or `ferrite umount`, and the daemon writes the
//!   allocator checkpoint (`Fs::unmount`) so the next mount is fast. A second signal
//!   aborts the FUSE connection (or exits without a checkpoint if fusectl is absent);
//!   the pool is then recovered from its logs by the next mount, as after SIGKILL.
//! - A daemon whose handlers panicked does not write a checkpoint (see `fs`).

use crate::fs::{DirectState, FerriteFuse, FuseConfig, Health};
use crate::options::{self, Options, Transport};
use crate::umount;
use crate::{MountArgs, UmountArgs, DEFAULT_POOL};
use ferrite_core::{Fs, MapOptions, Medium, MkfsOptions, MmapMedium, MountOptions};
use fuser::{Config, MountOption, Session, SessionACL};
use nix::sys::signal::{SigSet, Signal};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Set in the environment of the re-executed daemon.
const DAEMON_ENV: &str = "FERRITE_MOUNT_DAEMON";
/// How long the starting command waits for the daemon to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Everything a mount needs, resolved.
#[derive(Debug, Clone)]
struct Plan {
    pool: PathBuf,
    mountpoint: PathBuf,
    opts: Options,
    create: Option<u64>,
    threads: usize,
}

fn plan(a: &MountArgs) -> Result<Plan, String> {
    let (pool, mp) = match a.paths.as_slice() {
        [mp] => {
            let pool = std::env::var_os("FERRITE_POOL")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(DEFAULT_POOL));
            (pool, mp.clone())
        }
        [pool, mp] => (pool.clone(), mp.clone()),
        _ => return Err("give [POOL] MOUNTPOINT".into()),
    };
    let mut opts = options::parse(&a.options)?;
    if a.msync {
        opts.msync = true;
    }
    if a.read_only {
        opts.read_only = true;
    }
    let create = match &a.create {
        Some(s) => Some(options::parse_size(s)?),
        None => opts.create,
    };
    let threads = if a.single_threaded {
        // One thread means one: the io_uring transport runs threads per CPU.
        if opts.transport == options::Transport::Auto {
            opts.transport = options::Transport::Classic;
        }
        1
    } else {
        a.threads.or(opts.threads).unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
            (2 * n).clamp(2, 16)
        })
    };
    if threads == 0 {
        return Err("--threads must be at least 1".into());
    }
    Ok(Plan {
        pool: umount::absolute(&pool),
        mountpoint: umount::absolute(&mp),
        opts,
        create,
        threads,
    })
}

/// Where the daemon reports its start.
enum Notify {
    /// Foreground: messages on stderr.
    Stderr,
    /// Re-executed daemon: one line on stdout for the waiting parent.
    Parent,
}

impl Notify {
    fn ready(&self, msg: &str) {
        match self {
            Notify::Stderr => eprintln!("ferrite: {msg}"),
            Notify::Parent => {
                let mut o = std::io::stdout();
                let _ = writeln!(o, "ready {msg}");
                let _ = o.flush();
                eprintln!("ferrite: {msg}");
            }
        }
    }

    fn fail(&self, msg: &str) -> i32 {
        match self {
            Notify::Stderr => eprintln!("ferrite mount: {msg}"),
            Notify::Parent => {
                let mut o = std::io::stdout();
                let _ = writeln!(o, "error: {}", msg.replace('\n', " "));
                let _ = o.flush();
                eprintln!("ferrite mount: {msg}");
            }
        }
        1
    }
}

/// `ferrite mount`. Returns the process exit code.
pub fn run_mount(a: &MountArgs) -> i32 {
    let p = match plan(a) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("ferrite mount: {e}");
            return 2;
        }
    };
    let daemon = std::env::var_os(DAEMON_ENV).is_some();
    if !a.foreground && !daemon {
        return start_background(a);
    }
    if daemon {
        // Detach from the caller's job (a process group of its own, which no
        // terminal signal reaches: only the foreground group and the session leader
        // get SIGINT, SIGTSTP and a hangup's SIGHUP) and from its cwd, but stay in
        // its session. A new session is a new scheduler autogroup (Linux's
        // sched_autogroup, on by default), and the programs that use the mount run
        // in the caller's: every round trip then crossed groups, which doubled the
        // time of `cp -a` of /usr/include/linux onto the mount on a 2-CPU VM (0.35-
        // 0.57 s against 0.20-0.29 s for a daemon in the shell's session, alternated;
        // the same daemon under `setsid` was as slow again: 0.47-0.51 s).
        let _ = nix::unistd::setpgid(nix::unistd::Pid::from_raw(0), nix::unistd::Pid::from_raw(0));
        let _ = std::env::set_current_dir("/");
        serve(&p, Notify::Parent)
    } else {
        serve(&p, Notify::Stderr)
    }
}

/// Re-execute this command as a detached daemon and wait until it is mounted.
fn start_background(a: &MountArgs) -> i32 {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("ferrite mount: cannot find this program to start the daemon: {e}");
            return 1;
        }
    };
    let stderr = match &a.log {
        Some(path) => match std::fs::OpenOptions::new().create(true).append(true).open(path) {
            Ok(f) => Stdio::from(f),
            Err(e) => {
                eprintln!("ferrite mount: log file {}: {e}", path.display());
                return 1;
            }
        },
        None => Stdio::null(),
    };
    let mut child = match Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(DAEMON_ENV, "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ferrite mount: cannot start the daemon: {e}");
            return 1;
        }
    };
    let Some(out) = child.stdout.take() else {
        eprintln!("ferrite mount: no pipe to the daemon");
        return 1;
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(line) if line.starts_with("ready") => 0,
        Ok(line) if line.starts_with("error: ") => {
            eprintln!("ferrite mount: {}", line["error: ".len()..].trim_end());
            let _ = child.wait();
            1
        }
        Ok(_) => {
            let st = child.wait().map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
            eprintln!("ferrite mount: the daemon exited ({st}) before the mount was ready");
            1
        }
        Err(_) => {
            eprintln!(
                "ferrite mount: the daemon (pid {}) is not ready after {:?}; see its log",
                child.id(),
                READY_TIMEOUT
            );
            1
        }
    }
}

fn open_pool(p: &Plan) -> Result<Fs<MmapMedium>, String> {
    let map = MapOptions {
        msync_each_commit: p.opts.msync,
        read_only: p.opts.read_only,
        require_dax: false,
    };
    if !p.pool.exists() {
        let Some(size) = p.create else {
            return Err(format!(
                "pool {} does not exist (format it with `ferrite mkfs`, or mount with --create SIZE)",
                p.pool.display()
            ));
        };
        if p.opts.read_only {
            return Err("cannot create a pool for a read-only mount".into());
        }
        let size = size / 4096 * 4096;
        let m = MmapMedium::create(&p.pool, size, &map).map_err(|e| e.to_string())?;
        let mk = MkfsOptions {
            root_uid: nix::unistd::getuid().as_raw(),
            root_gid: nix::unistd::getgid().as_raw(),
            ..Default::default()
        };
        let fs = Fs::mkfs(m, &mk).map_err(|e| {
            let _ = std::fs::remove_file(&p.pool);
            format!("formatting {}: {e}", p.pool.display())
        })?;
        if let Err(e) = fs.bind_numa() {
            eprintln!("ferrite: warning: NUMA striping not applied: {e}");
        }
        fs.set_atime_mode(p.opts.atime);
        let mut fs = fs;
        fs.set_verify_mode(p.opts.verify);
        return Ok(fs);
    }
    let m = MmapMedium::open(&p.pool, &map).map_err(|e| e.to_string())?;
    let mo = MountOptions {
        read_only: p.opts.read_only,
        atime: p.opts.atime,
        verify: p.opts.verify,
        ..Default::default()
    };
    Fs::mount(m, &mo).map_err(|e| format!("{}: {e}", p.pool.display()))
}

fn fuser_config(p: &Plan) -> Config {
    let o = &p.opts;
    let fsname = o.fsname.clone().unwrap_or_else(|| p.pool.display().to_string());
    let mut mo = vec![
        MountOption::FSName(fsname),
        MountOption::Subtype(o.subtype.clone()),
        MountOption::DefaultPermissions,
    ];
    if o.read_only {
        mo.push(MountOption::RO);
    }
    if o.auto_unmount {
        mo.push(MountOption::AutoUnmount);
    }
    mo.extend(o.flags.iter().cloned());
    let mut c = Config::default();
    c.mount_options = mo;
    // auto_unmount goes through fusermount3, which fuser only allows with a wider ACL;
    // allow_root is the narrowest (and the same as the default when root mounts).
    c.acl =
        if o.auto_unmount && o.acl == SessionACL::Owner { SessionACL::RootAndOwner } else { o.acl };
    c.n_threads = Some(p.threads);
    c.clone_fd = p.threads > 1;
    c
}

/// The fuse module's switch for FUSE over io_uring (Linux 6.14+).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// `-o uring`: turn the module's switch on if it is off. Failing here is not fatal:
/// INIT then finds io_uring not offered and fails the mount with the reason.
fn enable_uring() {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(v) if v.trim() == "Y" || v.trim() == "1" => {}
        Ok(_) => {
            if let Err(e) = std::fs::write(ENABLE_URING, "1") {
                eprintln!("ferrite mount: cannot turn on {ENABLE_URING}: {e}");
            }
        }
        Err(e) => eprintln!("ferrite mount: {ENABLE_URING}: {e}"),
    }
}

/// Close the pool after the session: a clean unmount (checkpoint) unless poisoned.
/// A panic anywhere in the daemon may leave DRAM state half-updated: stop committing
/// at the panic itself. (The handler's own catch is too late: the unwinding drops
/// the request's reply, which answers EIO, and the caller's next request could
/// commit before the catch ran.) The hook holds the `Fs` weakly, so the final
/// unmount still owns it alone.
fn stop_commits_at_any_panic(fs: &Arc<Fs<MmapMedium>>) {
    let weak = Arc::downgrade(fs);
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if let Some(fs) = weak.upgrade() {
            fs.stop_commits(&format!("internal error (panic) {info}"));
        }
        prev(info);
    }));
}

fn close_pool(fs: Arc<Fs<MmapMedium>>, health: &Health, mp: &Path) -> i32 {
    let fs = match Arc::try_unwrap(fs) {
        Ok(fs) => fs,
        Err(_) => {
            eprintln!("ferrite: the pool is still referenced after the session; not checkpointing");
            return 1;
        }
    };
    if health.poisoned.load(Ordering::SeqCst) {
        drop(fs.crash());
        eprintln!(
            "ferrite: unmounted {} after an internal error; no checkpoint written, the next \
             mount recovers the pool from its logs",
            mp.display()
        );
        return 1;
    }
    match fs.unmount() {
        Ok(_) => {
            eprintln!("ferrite: unmounted {} cleanly", mp.display());
            0
        }
        Err(e) => {
            eprintln!("ferrite: clean unmount failed: {e}");
            1
        }
    }
}

fn signal_thread(set: SigSet, mp: PathBuf) {
    std::thread::Builder::new()
        .name("ferrite-signals".into())
        .spawn(move || {
            let mut conn = None;
            let mut count = 0u32;
            while let Ok(sig) = set.wait() {
                count += 1;
                if count == 1 {
                    eprintln!("ferrite: {sig}: unmounting {}", mp.display());
                    conn = umount::connection_of(&mp);
                    if let Err(e) = umount::detach(&mp, false) {
                        eprintln!("ferrite: {e}; detaching lazily");
                        if let Err(e) = umount::detach(&mp, true) {
                            eprintln!("ferrite: {e}");
                        }
                    }
                } else {
                    if let Some(c) = conn {
                        if umount::abort_connection(c) {
                            eprintln!("ferrite: {sig} again: connection aborted");
                            continue;
                        }
                    }
                    eprintln!(
                        "ferrite: {sig} again: exiting without a checkpoint; the next mount \
                         recovers the pool"
                    );
                    std::process::exit(130);
                }
            }
        })
        .expect("spawn the signal thread");
}

fn serve(p: &Plan, notify: Notify) -> i32 {
    let mut set = SigSet::empty();
    for s in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(s);
    }
    if let Err(e) = set.thread_block() {
        return notify.fail(&format!("cannot block signals: {e}"));
    }
    if umount::clear_stale(&p.mountpoint) {
        eprintln!("ferrite: removed a dead mount at {}", p.mountpoint.display());
    }
    let mut p = p;
    let canonical;
    if let Ok(c) = p.mountpoint.canonicalize() {
        // The mount table names mount points by their canonical path.
        canonical = Plan { mountpoint: c, ..p.clone() };
        p = &canonical;
    }
    if let Some(m) = umount::fuse_mount_at(&p.mountpoint) {
        return notify.fail(&format!(
            "{} is already mounted (from {}); unmount it first",
            p.mountpoint.display(),
            m.source
        ));
    }
    match std::fs::metadata(&p.mountpoint) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return notify
                .fail(&format!("mount point {} is not a directory", p.mountpoint.display()))
        }
        Err(e) => return notify.fail(&format!("mount point {}: {e}", p.mountpoint.display())),
    }
    let created = !p.pool.exists();
    let fs = match open_pool(p) {
        Ok(fs) => fs,
        Err(e) => return notify.fail(&e),
    };
    // Direct access: processes started with `ferrite run` read and write the pool
    // themselves (docs/DIRECT-ACCESS.md). Not for read-only mounts, nor with the
    // kernel buffering writes (its dirty pages would be invisible to clients).
    let offer = !p.opts.read_only && !p.opts.writeback_cache && !p.opts.no_direct_access;
    let (fs, shared) = if offer {
        match ferrite_direct::share(fs) {
            Ok((fs, sh)) => (Arc::new(fs), Some(sh)),
            Err(e) => return notify.fail(&format!("setting up direct access: {e}")),
        }
    } else {
        (Arc::new(fs), None)
    };
    stop_commits_at_any_panic(&fs);
    let report = fs.mount_report().clone();
    let durability = fs.medium().durability();
    let health = Arc::new(Health::default());
    let cfg = FuseConfig {
        writeback_cache: p.opts.writeback_cache,
        direct_io: p.opts.direct_io,
        no_cache: p.opts.no_cache,
        transport: p.opts.transport,
    };
    if p.opts.transport == Transport::Uring {
        enable_uring();
    }
    let mut fuse = FerriteFuse::new(fs.clone(), cfg, health.clone());
    let server = match shared {
        Some(sh) => match ferrite_direct::Server::start(fs.clone(), sh, &p.pool) {
            Ok(srv) => {
                fuse = fuse.with_direct(DirectState::new(srv.info(), srv.table().clone()));
                Some(srv)
            }
            Err(e) => return notify.fail(&format!("starting direct access: {e}")),
        },
        None => None,
    };
    let notifier = fuse.notifier_slot();
    let uring = fuse.uring_slot();
    let session = match Session::new(fuse, &p.mountpoint, &fuser_config(p)) {
        Ok(s) => {
            // Before any request is served: nothing is cached yet.
            let _ = notifier.set(s.notifier());
            s
        }
        Err(e) => {
            if let Some(srv) = server {
                srv.stop();
            }
            close_pool(fs, &health, &p.mountpoint);
            return notify.fail(&format!("mounting at {}: {e}", p.mountpoint.display()));
        }
    };
    signal_thread(set, p.mountpoint.clone());
    let how = if created {
        "created".to_string()
    } else if report.clean {
        "clean".to_string()
    } else {
        format!(
            "recovered: {} journals rolled back, {} torn logs cut, {} orphans freed",
            report.journals_rolled_back, report.torn_logs, report.orphans_freed
        )
    };
    notify.ready(&format!(
        "mounted {} at {} ({}; pool {how} in {} us; {}; direct access {})",
        p.pool.display(),
        p.mountpoint.display(),
        // Over io_uring one classic thread takes the forgets beside the ring threads.
        if uring.load(Ordering::Relaxed) {
            "requests over io_uring".to_string()
        } else {
            format!("{} threads, requests over /dev/fuse", p.threads)
        },
        report.micros,
        durability.describe(),
        if server.is_some() { "offered" } else { "off" }
    ));
    // Serving threads under SCHED_IDLE, so that a caller wakes on its own CPU
    // (docs/FUSE.md, "Where a caller wakes").
    fuser::set_idle_serving(p.opts.idle_serving);
    let mut res = session.run();
    // After an unmount (a lazy one ends when the last file closes) the kernel may
    // end the session with ECONNABORTED instead of ENODEV: with the mount gone that
    // is the normal end, not an error.
    if let Err(e) = &res {
        let aborted = e.raw_os_error() == Some(nix::errno::Errno::ECONNABORTED as i32);
        if aborted && umount::fuse_mount_at(&p.mountpoint).is_none() {
            res = Ok(());
        } else {
            eprintln!("ferrite: session ended with an error: {e}");
        }
    }
    // `uring=N`: how many of them came over io_uring (the rest over /dev/fuse);
    // `forget_wakeups=N`: reads of forgets after which the /dev/fuse thread lingered.
    eprintln!(
        "ferrite: requests served: {} uring={} forget_wakeups={}",
        health.summary(),
        fuser::uring_requests_served(),
        fuser::forget_lingers()
    );
    if let Some(srv) = server {
        // Every client finishes the operation it is in and commits nothing more;
        // their blocks come back before the checkpoint.
        srv.stop();
        let st = srv.stats();
        eprintln!(
            "ferrite: direct access: {} clients attached, {} ended without detaching, {} \
             blocks granted, {} reclaimed, {} waits for a client's inode lock",
            st.attached.load(Ordering::Relaxed),
            st.died.load(Ordering::Relaxed),
            st.granted.load(Ordering::Relaxed),
            st.reclaimed.load(Ordering::Relaxed),
            fs.party().map_or(0, |p| p.lock_waits())
        );
        drop(srv);
    }
    let code = close_pool(fs, &health, &p.mountpoint);
    if res.is_err() {
        1
    } else {
        code
    }
}

/// `ferrite umount`. Returns the process exit code.
pub fn run_umount(a: &UmountArgs) -> i32 {
    match umount::umount(&a.mountpoint, a.lazy, Duration::from_secs(a.timeout)) {
        Ok(msg) => {
            if a.verbose {
                eprintln!("ferrite: {msg}");
            }
            0
        }
        Err(e) => {
            eprintln!("ferrite umount: {e}");
            1
        }
    }
}
