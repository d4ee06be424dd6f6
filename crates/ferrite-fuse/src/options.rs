//! Mount options: `-o a,b=c` lists as `ferrite mount`, mount(8) and fstab pass them.
//!
//! Invariants:
//! - Every option is either understood, deliberately ignored (options mount(8) and
//!   fstab use for themselves, such as `noauto` or `_netdev`), or rejected with a
//!   clear error; nothing is silently dropped.
//! - `default_permissions` is always in force: the core does no permission checks, so
//!   the kernel must.

use fuser::{MountOption, SessionACL};

/// Parsed `-o` options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// `ro`: refuse all changes (the pool is mapped read-only).
    pub read_only: bool,
    /// `allow_other` / `allow_root`.
    pub acl: SessionACL,
    /// `auto_unmount`: fusermount3 unmounts when the daemon dies.
    pub auto_unmount: bool,
    /// `fsname=`: the mount's source (default: the pool path).
    pub fsname: Option<String>,
    /// `subtype=` (default `ferrite`).
    pub subtype: String,
    /// Generic kernel flags (`nodev`, `noexec`, `noatime`, ...).
    pub flags: Vec<MountOption>,
    /// `writeback_cache`: let the kernel buffer writes (weaker durability, see docs).
    pub writeback_cache: bool,
    /// `direct_io`: bypass the kernel page cache for file data.
    pub direct_io: bool,
    /// `nodirect`: offer no direct access to processes started with `ferrite run`.
    pub no_direct_access: bool,
    /// `msync`: msync at every commit (power-loss durability on non-DAX pool files).
    pub msync: bool,
    /// `nocache`: zero time-to-live for entries and attributes (the kernel asks the
    /// daemon for every path component and `stat`, as before the caches existed).
    pub no_cache: bool,
    /// `threads=N`: request-serving threads.
    pub threads: Option<usize>,
    /// `create=SIZE`: format the pool with this size if it does not exist.
    pub create: Option<u64>,
    /// `relatime` (default), `noatime`, `strictatime`: when reads update access
    /// times (the core keeps them; the kernel does not for a FUSE mount).
    pub atime: ferrite_core::AtimeMode,
    /// `verify=first-touch` (default), `verify=always`, `verify=off`: when reads
    /// check data blocks against their checksums (docs/INTEGRITY.md).
    pub verify: ferrite_core::VerifyMode,
    /// How requests travel between the kernel and the daemon (`uring`, `nouring`).
    pub transport: Transport,
    /// `sched_idle` (default) / `nosched_idle`: request-serving threads run under
    /// the `SCHED_IDLE` policy, so a caller wakes on its own CPU (docs/FUSE.md,
    /// "Where a caller wakes").
    pub idle_serving: bool,
}

/// The kernel-daemon transport (docs/FUSE.md, "FUSE over io_uring").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Transport {
    /// io_uring when the kernel offers it (Linux 6.14+ with the fuse module's
    /// `enable_uring` on), else `/dev/fuse` reads and writes.
    #[default]
    Auto,
    /// `uring`: turn the fuse module's `enable_uring` on if it is off (root only; it
    /// lets every new FUSE mount that asks use io_uring), and fail the mount if the
    /// kernel still does not offer io_uring.
    Uring,
    /// `nouring`: `/dev/fuse` reads and writes only.
    Classic,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            read_only: false,
            acl: SessionACL::Owner,
            auto_unmount: false,
            fsname: None,
            subtype: "ferrite".into(),
            flags: Vec::new(),
            writeback_cache: false,
            direct_io: false,
            no_direct_access: false,
            msync: false,
            no_cache: false,
            threads: None,
            create: None,
            atime: ferrite_core::AtimeMode::Relative,
            verify: ferrite_core::VerifyMode::FirstTouch,
            transport: Transport::Auto,
            idle_serving: true,
        }
    }
}

/// Options used by mount(8), fstab or mount.fuse3 themselves; accepted and ignored.
const IGNORED: &[&str] = &[
    "defaults",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "_netdev",
    "nofail",
    "norelatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "diratime",
    "nodiratime",
    "silent",
    "loud",
    "default_permissions",
    "nonempty",
];

/// Parse a size: bytes with an optional K, M, G or T suffix (powers of 1024; `KiB`,
/// `KB` and `k` accepted too).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(digits);
    if num.is_empty() {
        return Err(format!("bad size '{s}' (use e.g. 512M, 2G)"));
    }
    let n: u64 = num.parse().map_err(|_| format!("bad size '{s}'"))?;
    let mult: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("bad size suffix in '{s}' (use K, M, G or T)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size '{s}' is too large"))
}

/// Parse `-o` arguments (each may be a comma-separated list).
pub fn parse(lists: &[String]) -> Result<Options, String> {
    let mut o = Options::default();
    for opt in lists.iter().flat_map(|l| l.split(',')).map(str::trim).filter(|s| !s.is_empty()) {
        let (key, val) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let need = |v: Option<&str>| -> Result<String, String> {
            match v {
                Some(v) if !v.is_empty() => Ok(v.to_string()),
                _ => Err(format!("mount option '{key}' needs a value ({key}=...)")),
            }
        };
        let novalue = || -> Result<(), String> {
            match val {
                Some(_) => Err(format!("mount option '{key}' takes no value")),
                None => Ok(()),
            }
        };
        let flag = |m: MountOption| -> Result<MountOption, String> { novalue().map(|()| m) };
        match key {
            "ro" => {
                novalue()?;
                o.read_only = true;
            }
            "rw" => {
                novalue()?;
                o.read_only = false;
            }
            "allow_other" => {
                novalue()?;
                o.acl = SessionACL::All;
            }
            "allow_root" => {
                novalue()?;
                if o.acl != SessionACL::All {
                    o.acl = SessionACL::RootAndOwner;
                }
            }
            "auto_unmount" => {
                novalue()?;
                o.auto_unmount = true;
            }
            "fsname" => o.fsname = Some(need(val)?),
            "subtype" => o.subtype = need(val)?,
            "dev" => o.flags.push(flag(MountOption::Dev)?),
            "nodev" => o.flags.push(flag(MountOption::NoDev)?),
            "suid" => o.flags.push(flag(MountOption::Suid)?),
            "nosuid" => o.flags.push(flag(MountOption::NoSuid)?),
            "exec" => o.flags.push(flag(MountOption::Exec)?),
            "noexec" => o.flags.push(flag(MountOption::NoExec)?),
            "atime" | "relatime" => {
                novalue()?;
                o.atime = ferrite_core::AtimeMode::Relative;
            }
            "noatime" => {
                o.flags.push(flag(MountOption::NoAtime)?);
                o.atime = ferrite_core::AtimeMode::Off;
            }
            "strictatime" => {
                novalue()?;
                o.atime = ferrite_core::AtimeMode::Strict;
            }
            "verify" => {
                let v = need(val)?;
                o.verify = ferrite_core::VerifyMode::parse(&v)
                    .ok_or_else(|| format!("verify={v}: expected always, first-touch or off"))?;
            }
            "sync" => o.flags.push(flag(MountOption::Sync)?),
            "async" => o.flags.push(flag(MountOption::Async)?),
            "dirsync" => o.flags.push(flag(MountOption::DirSync)?),
            "writeback_cache" => {
                novalue()?;
                o.writeback_cache = true;
            }
            "direct_io" => {
                novalue()?;
                o.direct_io = true;
            }
            "nodirect" => {
                novalue()?;
                o.no_direct_access = true;
            }
            "msync" => {
                novalue()?;
                o.msync = true;
            }
            "nocache" => {
                novalue()?;
                o.no_cache = true;
            }
            "threads" => {
                let v = need(val)?;
                let n: usize = v.parse().map_err(|_| format!("bad thread count '{v}'"))?;
                if n == 0 || n > 256 {
                    return Err(format!("threads={n}: use 1 to 256"));
                }
                o.threads = Some(n);
            }
            "uring" => {
                novalue()?;
                o.transport = Transport::Uring;
            }
            "nouring" => {
                novalue()?;
                o.transport = Transport::Classic;
            }
            "sched_idle" => {
                novalue()?;
                o.idle_serving = true;
            }
            "nosched_idle" => {
                novalue()?;
                o.idle_serving = false;
            }
            "create" => o.create = Some(parse_size(&need(val)?)?),
            k if IGNORED.contains(&k) => {}
            k if k.starts_with("x-") || k == "comment" => {}
            _ => {
                return Err(format!(
                    "unknown mount option '{opt}' (see `ferrite mount --help` and docs/FUSE.md)"
                ))
            }
        }
    }
    // Keep the last of conflicting generic flags (mount(8) semantics: later wins).
    let mut seen: Vec<MountOption> = Vec::new();
    for f in o.flags.iter().rev() {
        let clash = |a: &MountOption, b: &MountOption| {
            use MountOption::*;
            matches!(
                (a, b),
                (Dev, NoDev)
                    | (NoDev, Dev)
                    | (Suid, NoSuid)
                    | (NoSuid, Suid)
                    | (Exec, NoExec)
                    | (NoExec, Exec)
                    | (Atime, NoAtime)
                    | (NoAtime, Atime)
                    | (Sync, Async)
                    | (Async, Sync)
            ) || a == b
        };
        if !seen.iter().any(|s| clash(s, f)) {
            seen.push(f.clone());
        }
    }
    seen.reverse();
    o.flags = seen;
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Options, String> {
        parse(&[s.to_string()])
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2g"), Ok(2 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn standard_options() {
        let o = p("ro,allow_other,default_permissions,auto_unmount,fsname=mypool").unwrap();
        assert!(o.read_only);
        assert_eq!(o.acl, SessionACL::All);
        assert!(o.auto_unmount);
        assert_eq!(o.fsname.as_deref(), Some("mypool"));
        let o = parse(&["rw,nodev".into(), "noexec,threads=3,create=1G".into()]).unwrap();
        assert!(!o.read_only);
        assert_eq!(o.flags, vec![MountOption::NoDev, MountOption::NoExec]);
        assert_eq!(o.threads, Some(3));
        assert_eq!(o.create, Some(1 << 30));
        assert!(!o.no_cache, "the kernel caches by default");
        assert!(p("nocache").unwrap().no_cache);
        assert!(p("nocache=1").is_err());
    }

    #[test]
    fn verify_takes_a_policy() {
        assert_eq!(p("rw").unwrap().verify, ferrite_core::VerifyMode::FirstTouch);
        assert_eq!(p("verify=always").unwrap().verify, ferrite_core::VerifyMode::Always);
        assert_eq!(p("verify=off").unwrap().verify, ferrite_core::VerifyMode::Off);
        assert_eq!(p("verify=first-touch").unwrap().verify, ferrite_core::VerifyMode::FirstTouch);
        assert!(p("verify").unwrap_err().contains("needs a value"));
        assert!(p("verify=sometimes").unwrap_err().contains("always, first-touch or off"));
    }

    #[test]
    fn transport_is_auto_unless_asked() {
        assert_eq!(p("").unwrap().transport, Transport::Auto);
        assert_eq!(p("uring").unwrap().transport, Transport::Uring);
        assert_eq!(p("nouring").unwrap().transport, Transport::Classic);
        assert_eq!(p("uring,nouring").unwrap().transport, Transport::Classic);
        assert!(p("rw").unwrap().idle_serving);
        assert!(!p("nosched_idle").unwrap().idle_serving);
        assert!(p("nosched_idle,sched_idle").unwrap().idle_serving);
        assert!(p("sched_idle=1").is_err());
        assert!(p("uring=1").is_err());
    }

    #[test]
    fn mount8_noise_is_ignored_and_later_flags_win() {
        let o = p("defaults,noauto,_netdev,x-systemd.automount,relatime,dev,nodev").unwrap();
        assert_eq!(o.flags, vec![MountOption::NoDev]);
        assert_eq!(o, Options { flags: vec![MountOption::NoDev], ..Options::default() });
    }

    #[test]
    fn bad_options_are_errors() {
        assert!(p("bogus").unwrap_err().contains("unknown mount option 'bogus'"));
        assert!(p("fsname").unwrap_err().contains("needs a value"));
        assert!(p("ro=1").unwrap_err().contains("takes no value"));
        assert!(p("threads=0").is_err());
        assert!(p("threads=x").is_err());
        assert!(p("create=lots").is_err());
    }
}
