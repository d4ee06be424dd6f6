//! Shared helpers of the FUSE integration tests (`tests/fuse_*.rs`): mount a fresh pool
//! with the real `ferrite` binary, run programs on it, and always release the mount.
//!
//! Invariants:
//! - Every pool lives under /dev/shm and every mount point under a fresh temporary
//!   directory, with names unique to the process and the test.
//! - A [`Mount`] is released when dropped, also when the test fails: a lazy
//!   `fusermount3 -u -z`, then the daemon is waited for (or killed), then the pool file
//!   is removed. No stale mounts are left behind.
#![allow(dead_code)]

use ferrite_core::{Fs, FsckReport, MapOptions, MmapMedium, MountOptions, MountReport};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The binary under test.
pub fn ferrite() -> &'static str {
    env!("CARGO_BIN_EXE_ferrite")
}

/// A name unique to this process and call.
pub fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!("ferrite-test-{}-{}-{tag}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Run a command; panic with its output if it fails.
pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "{cmd:?} failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    out
}

/// Is there a FUSE mount at `mnt`?
pub fn is_mounted(mnt: &Path) -> bool {
    ferrite_fuse::umount::fuse_mount_at(mnt).is_some()
}

/// Wait until `f` holds, at most `secs` seconds.
pub fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// Abort the FUSE connection of the mount at `mnt` (fusectl), so that processes
/// stuck in its requests get ENOTCONN: how a test that finds a deadlock between a
/// client and the daemon gets its processes back.
pub fn abort_connection(mnt: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = std::fs::metadata(mnt) else { return };
    let ctl = Path::new("/sys/fs/fuse/connections");
    if std::fs::read_dir(ctl).map_or(true, |mut d| d.next().is_none()) {
        let _ = Command::new("mount").args(["-t", "fusectl", "none"]).arg(ctl).status();
    }
    let minor = rustix::fs::minor(m.dev());
    let _ = std::fs::write(ctl.join(minor.to_string()).join("abort"), "1");
}

/// A pool mounted by a `ferrite mount` daemon for one test.
pub struct Mount {
    /// Pool file.
    pub pool: PathBuf,
    /// Mount point.
    pub mnt: PathBuf,
    /// Daemon log.
    pub log: PathBuf,
    /// Foreground daemon, when started with [`Mount::foreground`].
    pub child: Option<Child>,
    dir: tempfile::TempDir,
    size: String,
}

impl Mount {
    /// Create a pool of `size` and mount it in the background with `opts` (`-o` list).
    pub fn new(tag: &str, size: &str, opts: &str) -> Mount {
        let mut m = Mount::unmounted(tag, size);
        m.mount(opts);
        m
    }

    /// A pool path and mount point, nothing mounted yet.
    pub fn unmounted(tag: &str, size: &str) -> Mount {
        let name = unique(tag);
        let dir = tempfile::Builder::new().prefix(&name).tempdir_in("/tmp").expect("tempdir");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mount point");
        let mnt = mnt.canonicalize().expect("canonical mount point");
        Mount {
            pool: PathBuf::from(format!("/dev/shm/{name}.pool")),
            log: dir.path().join("daemon.log"),
            mnt,
            child: None,
            dir,
            size: size.to_string(),
        }
    }

    /// Mount (creating the pool if needed) in the background.
    pub fn mount(&mut self, opts: &str) {
        self.mount_with_env(opts, &[]);
    }

    /// [`Self::mount`] with extra environment variables for the daemon.
    pub fn mount_with_env(&mut self, opts: &str, env: &[(&str, &str)]) {
        let mut c = Command::new(ferrite());
        c.envs(env.iter().copied());
        c.arg("mount").arg(&self.pool).arg(&self.mnt).arg("--create").arg(&self.size);
        c.arg("--log").arg(&self.log);
        if !opts.is_empty() {
            c.arg("-o").arg(opts);
        }
        let out = c.output().expect("run ferrite mount");
        assert!(
            out.status.success(),
            "ferrite mount failed: {}\n{}\nlog:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        assert!(is_mounted(&self.mnt), "ferrite mount returned but nothing is mounted");
    }

    /// Create a pool and mount it with a foreground daemon (`-f`) whose pid we hold.
    pub fn foreground(tag: &str, size: &str, opts: &str) -> Mount {
        let mut m = Mount::unmounted(tag, size);
        m.start_foreground(opts);
        m
    }

    /// Start a foreground daemon on this pool and wait until it serves.
    pub fn start_foreground(&mut self, opts: &str) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut c = Command::new(ferrite());
        c.arg("mount").arg(&self.pool).arg(&self.mnt).arg("-f").arg("--create").arg(&self.size);
        if !opts.is_empty() {
            c.arg("-o").arg(opts);
        }
        let child =
            c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log).spawn().expect("spawn");
        self.child = Some(child);
        // A dead mount left by a killed daemon is listed too, but does not answer. A
        // read of the root is the probe: a `stat` may come from the kernel's attribute
        // cache (the mount lets it cache), a READDIR always reaches the daemon.
        let mnt = self.mnt.clone();
        let live = |p: &Path| is_mounted(p) && ferrite_fuse::umount::answers(p).is_ok();
        let up = wait_for(60, || live(&mnt) || self.child_exited());
        assert!(up && live(&self.mnt), "foreground daemon did not mount:\n{}", self.log_text());
    }

    fn child_exited(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(Some(_))))
    }

    /// Pid of the foreground daemon.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("foreground daemon").id() as i32
    }

    /// Send `sig` to the foreground daemon.
    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.pid()).expect("pid");
        rustix::process::kill_process(pid, sig).expect("kill");
    }

    /// Wait for the foreground daemon to exit; returns its exit code (None if killed).
    pub fn wait_child(&mut self, secs: u64) -> Option<i32> {
        let mut c = self.child.take().expect("foreground daemon");
        let t0 = Instant::now();
        loop {
            if let Some(st) = c.try_wait().expect("wait") {
                return st.code();
            }
            if t0.elapsed() > Duration::from_secs(secs) {
                let _ = c.kill();
                let _ = c.wait();
                panic!("daemon did not exit within {secs} s:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A path inside the mount.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// A scratch directory outside the mount, removed with the test.
    pub fn scratch(&self) -> PathBuf {
        let p = self.dir.path().join("scratch");
        std::fs::create_dir_all(&p).expect("scratch");
        p
    }

    /// The daemon's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many requests of `kind` the last daemon served (from its final log line).
    pub fn served(&self, kind: &str) -> u64 {
        let log = self.log_text();
        let line = log.lines().rev().find(|l| l.contains("requests served:")).unwrap_or("");
        line.split_whitespace()
            .filter_map(|w| w.split_once('='))
            .find(|(k, _)| *k == kind)
            .map_or(0, |(_, v)| v.parse().unwrap_or(0))
    }

    /// `ferrite umount`: must succeed, and the daemon must have released the pool.
    pub fn umount(&mut self) {
        let out = Command::new(ferrite()).arg("umount").arg(&self.mnt).output().expect("umount");
        assert!(
            out.status.success(),
            "ferrite umount failed: {}\nlog:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        assert!(!is_mounted(&self.mnt), "still mounted after ferrite umount");
        assert!(
            !ferrite_fuse::umount::pool_in_use(&self.pool),
            "pool still held after ferrite umount"
        );
        if self.child.is_some() {
            assert_eq!(self.wait_child(90), Some(0), "daemon exit code\n{}", self.log_text());
        }
    }

    /// Open the (unmounted) pool with the library: how mount found it, and fsck.
    pub fn check_pool(&self) -> (MountReport, FsckReport) {
        check_pool(&self.pool)
    }
}

/// Mount `pool` with the library (recovering it if needed) and fsck it.
pub fn check_pool(pool: &Path) -> (MountReport, FsckReport) {
    let m = MmapMedium::open(pool, &MapOptions::default()).expect("open pool");
    let fs = Fs::mount(m, &MountOptions::default()).expect("mount pool");
    let report = fs.mount_report().clone();
    let fsck = fs.fsck().expect("fsck runs");
    fs.unmount().expect("clean unmount");
    (report, fsck)
}

impl Drop for Mount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ =
                Command::new("fusermount3").arg("-u").arg("-z").arg("-q").arg(&self.mnt).status();
            if is_mounted(&self.mnt) {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
            }
        }
        if let Some(mut c) = self.child.take() {
            if !wait_for(10, || matches!(c.try_wait(), Ok(Some(_)))) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        wait_for(10, || !ferrite_fuse::umount::pool_in_use(&self.pool));
        if std::thread::panicking() {
            eprintln!("--- daemon log ({}):\n{}", self.log.display(), self.log_text());
        }
        let _ = std::fs::remove_file(&self.pool);
    }
}

/// A small deterministic random generator (SplitMix64) for seeded test sequences.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// Next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True with probability `p` percent.
    pub fn pct(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
    /// A random element.
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
    /// Deterministic bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// The preload library built beside the `ferrite` binary under test (scripts/test.sh
/// builds the workspace first). A library older than the binary is refused: it
/// would test old code.
pub fn preload_lib() -> PathBuf {
    let bin = Path::new(ferrite());
    let lib = bin.with_file_name("libferrite_preload.so");
    let age = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match (age(&lib), age(bin)) {
        (Some(l), Some(b)) if l + Duration::from_secs(600) >= b => lib,
        (Some(_), _) => panic!(
            "{} is older than {}: run `cargo build --workspace`",
            lib.display(),
            bin.display()
        ),
        (None, _) => panic!("{} is missing: run `cargo build --workspace`", lib.display()),
    }
}

/// One process's line of FERRITE_DIRECT_STATS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectStats {
    /// Process id.
    pub pid: u64,
    /// Calls served by the library.
    pub direct: u64,
    /// Calls on FerriteFS files passed to the kernel.
    pub kernel: u64,
    /// System calls the library made to decide where a call goes.
    pub looks: u64,
}

/// Every line of a FERRITE_DIRECT_STATS file.
pub fn direct_stats(path: &Path) -> Vec<DirectStats> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("stats line {l:?}: {e}"));
            DirectStats {
                pid: v["pid"].as_u64().expect("pid"),
                direct: v["direct_calls"].as_u64().expect("direct_calls"),
                kernel: v["kernel_calls"].as_u64().expect("kernel_calls"),
                looks: v["looks"].as_u64().expect("looks"),
            }
        })
        .collect()
}

/// A range of seeds `a..b` from the environment variable `name`, else `default`.
pub fn env_range(name: &str, default: std::ops::Range<u64>) -> std::ops::Range<u64> {
    let Ok(v) = std::env::var(name) else { return default };
    let (a, b) = v.split_once("..").unwrap_or_else(|| panic!("{name}: a..b"));
    a.parse().expect("start")..b.parse().expect("end")
}
