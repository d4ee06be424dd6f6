//! Command-line arguments and the resolved configuration of a run (presets `full`,
//! `--quick` and `--smoke`, with individual flags overriding them).
//!
//! Invariants: every size and count in a [`Config`] is positive and consistent (a
//! micro file holds at least four of the largest I/O), checked by [`Config::from_args`]
//! so workloads never divide by zero or run out of their regions.

use std::path::PathBuf;

/// Experiments, in the order they run.
pub const EXPERIMENTS: [&str; 10] = [
    "micro",
    "append",
    "mmap",
    "meta",
    "filebench",
    "programs",
    "real-work",
    "recovery",
    "gc",
    "memory",
];
/// Target selectors.
pub const TARGETS: [&str; 6] = ["lib", "fuse", "direct", "tmpfs", "ext4", "hw"];
/// Micro access patterns.
pub const PATTERNS: [&str; 4] = ["randwrite", "seqwrite", "randread", "seqread"];

/// `ferrite bench`: FerriteFS against tmpfs, ext4, its FUSE mount and the hardware
/// limit, in one run; JSON samples, a Markdown report and SVG plots.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BenchArgs {
    /// A first look in under 3 minutes (fewer sizes, smaller data, 3 repetitions).
    #[arg(long, conflicts_with = "smoke")]
    pub quick: bool,
    /// The tiny configuration CI runs: every experiment and target, seconds in all;
    /// its numbers mean nothing.
    #[arg(long)]
    pub smoke: bool,
    /// Experiments to run, comma-separated: micro, append, mmap (stores into
    /// shared mappings: DAX through the direct target), meta, filebench, programs
    /// (real fio and sqlite3), real-work (cp, tar, git, find, stat, rm of a source
    /// tree), recovery, gc, memory [default: all]. Write amplification
    /// is measured with micro and append.
    #[arg(long, value_delimiter = ',')]
    pub experiments: Vec<String>,
    /// Targets, comma-separated: lib, fuse, direct (the mount through the preload
    /// library), tmpfs, ext4, hw [default: all available].
    #[arg(long, value_delimiter = ',')]
    pub targets: Vec<String>,
    /// Extra library targets on emulated slower media, comma-separated:
    /// stt-ram, pcm, optane (delays per fence, per written line and per read).
    #[arg(long, value_delimiter = ',')]
    pub emulate: Vec<String>,
    /// Output directory [default: bench-results/<UTC date-time>].
    #[arg(long, short)]
    pub out: Option<PathBuf>,
    /// Scratch directory for pools, images and mount points (must be on tmpfs)
    /// [default: /dev/shm/ferrite-bench-<pid>].
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// The `ferrite` binary whose `mount` subcommand serves the FUSE target
    /// [default: this binary if it is `ferrite`, else `ferrite` beside it].
    #[arg(long)]
    pub ferrite_bin: Option<PathBuf>,
    /// I/O sizes of the micro workloads, e.g. 64,4K,1M.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub sizes: Vec<u64>,
    /// Micro access patterns: randwrite, seqwrite, randread, seqread [default: all].
    #[arg(long, value_delimiter = ',')]
    pub patterns: Vec<String>,
    /// Append sizes, e.g. 64,256,4K.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    pub append_sizes: Vec<u64>,
    /// Thread counts (1 and/or 2).
    #[arg(long, value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Measured repetitions per cell (after one warm-up).
    #[arg(long)]
    pub reps: Option<usize>,
    /// Time cap of one micro repetition, seconds.
    #[arg(long)]
    pub rep_secs: Option<f64>,
    /// Bytes of each micro file (per thread), e.g. 64M.
    #[arg(long, value_parser = parse_size)]
    pub file_size: Option<u64>,
    /// Files of the metadata experiment.
    #[arg(long)]
    pub files: Option<usize>,
    /// Seconds of each filebench repetition.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Scale of the filebench file sets (1.0 = 10k-20k files).
    #[arg(long)]
    pub fileset_scale: Option<f64>,
    /// Data per recovery data set, e.g. 2G.
    #[arg(long, value_parser = parse_size)]
    pub recovery_data: Option<u64>,
    /// Seconds of the GC-under-pressure run.
    #[arg(long)]
    pub gc_secs: Option<f64>,
    /// Pool size of the GC run (filled to 95%), e.g. 1G.
    #[arg(long, value_parser = parse_size)]
    pub gc_pool: Option<u64>,
    /// Library and FUSE pool size, and the ext4 image size, e.g. 4G.
    #[arg(long, value_parser = parse_size)]
    pub pool_size: Option<u64>,
    /// Source tree of the real-work jobs [default: /usr/include; /usr/include/linux
    /// with --quick and --smoke].
    #[arg(long)]
    pub real_src: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

/// Parse `4096`, `4K`, `4KiB`, `1M`, `2G` (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: u64 =
        num.trim().parse().map_err(|_| format!("bad size {s:?} (use e.g. 64, 4K, 1M, 2G)"))?;
    let v = n.checked_mul(mult).ok_or_else(|| format!("size {s:?} too large"))?;
    if v == 0 {
        return Err(format!("size {s:?} must be positive"));
    }
    Ok(v)
}

/// Human size: 64 B, 4 KiB, 1 MiB.
pub fn fmt_size(n: u64) -> String {
    if n >= 1 << 30 && n.is_multiple_of(1 << 30) {
        format!("{} GiB", n >> 30)
    } else if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// The resolved configuration.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Config {
    /// `full`, `quick` or `smoke`.
    pub preset: &'static str,
    /// Experiments to run.
    pub experiments: Vec<String>,
    /// Target selectors.
    pub targets: Vec<String>,
    /// Emulation profile names.
    pub emulate: Vec<String>,
    /// Micro I/O sizes.
    pub sizes: Vec<u64>,
    /// Micro access patterns.
    pub patterns: Vec<String>,
    /// Sizes also run with 2 threads.
    pub t2_sizes: Vec<u64>,
    /// Append sizes.
    pub append_sizes: Vec<u64>,
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Measured repetitions.
    pub reps: usize,
    /// Time cap per micro/append repetition (s).
    pub rep_secs: f64,
    /// Bytes per micro file per thread.
    pub file_size: u64,
    /// Target bytes moved per micro repetition (before the time cap).
    pub rep_bytes: u64,
    /// Most operations per repetition (micro runs are ended by the time cap first).
    pub max_ops: u64,
    /// Circular-append region.
    pub circ_region: u64,
    /// Metadata files.
    pub files: usize,
    /// Filebench seconds per repetition.
    pub duration: f64,
    /// Filebench repetitions.
    pub fb_reps: usize,
    /// Filebench file-set scale.
    pub fileset_scale: f64,
    /// Recovery data per data set.
    pub recovery_data: u64,
    /// GC run seconds.
    pub gc_secs: f64,
    /// GC pool size.
    pub gc_pool: u64,
    /// Memory experiment: file data bytes.
    pub mem_data: u64,
    /// Memory experiment: small files.
    pub mem_files: usize,
    /// Pool size (library, FUSE) and ext4 image size.
    pub pool_size: u64,
    /// Source tree of the real-work jobs.
    pub real_src: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// Scratch directory.
    pub work_dir: PathBuf,
    /// `ferrite` binary for FUSE.
    pub ferrite_bin: Option<PathBuf>,
    /// Show progress bars.
    pub progress: bool,
}

impl Config {
    /// Resolve presets and overrides; errors name the bad flag.
    pub fn from_args(a: &BenchArgs) -> Result<Config, String> {
        const K: u64 = 1 << 10;
        const M: u64 = 1 << 20;
        const G: u64 = 1 << 30;
        let mut c = if a.smoke {
            Config {
                preset: "smoke",
                experiments: vec![],
                targets: vec![],
                emulate: vec![],
                patterns: vec![],
                sizes: vec![64, 4 * K, M],
                t2_sizes: vec![4 * K],
                append_sizes: vec![64, 256, 4 * K],
                threads: vec![1, 2],
                reps: 2,
                rep_secs: 0.02,
                file_size: M,
                rep_bytes: M,
                max_ops: 2000,
                circ_region: 256 * K,
                files: 300,
                duration: 0.2,
                fb_reps: 2,
                fileset_scale: 0.01,
                recovery_data: 16 * M,
                gc_secs: 0.6,
                gc_pool: 32 * M,
                mem_data: 16 * M,
                mem_files: 1000,
                pool_size: 256 * M,
                real_src: PathBuf::from("/usr/include/linux"),
                out: PathBuf::new(),
                work_dir: PathBuf::new(),
                ferrite_bin: None,
                progress: true,
            }
        } else if a.quick {
            Config {
                preset: "quick",
                experiments: vec![],
                targets: vec![],
                emulate: vec![],
                patterns: vec![],
                sizes: vec![64, 4 * K, M],
                t2_sizes: vec![4 * K],
                append_sizes: vec![64, 256, 4 * K],
                threads: vec![1, 2],
                reps: 3,
                rep_secs: 0.1,
                file_size: 16 * M,
                rep_bytes: 32 * M,
                max_ops: 1_000_000,
                circ_region: 2 * M,
                files: 5_000,
                duration: 1.0,
                fb_reps: 2,
                fileset_scale: 0.1,
                recovery_data: 256 * M,
                gc_secs: 5.0,
                gc_pool: 128 * M,
                mem_data: 128 * M,
                mem_files: 20_000,
                pool_size: G,
                real_src: PathBuf::from("/usr/include/linux"),
                out: PathBuf::new(),
                work_dir: PathBuf::new(),
                ferrite_bin: None,
                progress: true,
            }
        } else {
            Config {
                preset: "full",
                experiments: vec![],
                targets: vec![],
                emulate: vec![],
                patterns: vec![],
                sizes: vec![64, 256, K, 4 * K, 16 * K, 64 * K, M],
                t2_sizes: vec![64, 256, K, 4 * K, 16 * K, 64 * K, M],
                append_sizes: vec![64, 256, K, 4 * K, 16 * K, 64 * K],
                threads: vec![1, 2],
                reps: 5,
                rep_secs: 0.3,
                file_size: 64 * M,
                rep_bytes: 256 * M,
                max_ops: 2_000_000,
                circ_region: 2 * M,
                files: 100_000,
                duration: 5.0,
                fb_reps: 3,
                fileset_scale: 1.0,
                recovery_data: 2 * G,
                gc_secs: 60.0,
                gc_pool: G,
                mem_data: G,
                mem_files: 100_000,
                pool_size: 3 * G,
                real_src: PathBuf::from("/usr/include"),
                out: PathBuf::new(),
                work_dir: PathBuf::new(),
                ferrite_bin: None,
                progress: true,
            }
        };
        let pick = |given: &[String], all: &[&str], what: &str| -> Result<Vec<String>, String> {
            if given.is_empty() {
                return Ok(all.iter().map(|s| s.to_string()).collect());
            }
            for g in given {
                if !all.contains(&g.as_str()) {
                    return Err(format!("unknown {what} {g:?} (known: {})", all.join(", ")));
                }
            }
            Ok(all
                .iter()
                .filter(|a| given.iter().any(|g| g == *a))
                .map(|s| s.to_string())
                .collect())
        };
        c.experiments = pick(&a.experiments, &EXPERIMENTS, "experiment")?;
        c.targets = pick(&a.targets, &TARGETS, "target")?;
        c.patterns = pick(&a.patterns, &PATTERNS, "pattern")?;
        for e in &a.emulate {
            if crate::emu::profile(e).is_none() {
                let known: Vec<String> =
                    crate::emu::profiles().into_iter().map(|p| p.name).collect();
                return Err(format!(
                    "unknown emulation profile {e:?} (known: {})",
                    known.join(", ")
                ));
            }
        }
        c.emulate = a.emulate.clone();
        if !a.sizes.is_empty() {
            c.sizes = a.sizes.clone();
            c.t2_sizes.retain(|s| c.sizes.contains(s));
            if c.t2_sizes.is_empty() {
                c.t2_sizes = c.sizes.clone();
            }
        }
        if !a.append_sizes.is_empty() {
            c.append_sizes = a.append_sizes.clone();
        }
        if !a.threads.is_empty() {
            if a.threads.iter().any(|&t| t == 0 || t > 64) {
                return Err("--threads must be between 1 and 64".into());
            }
            c.threads = a.threads.clone();
        }
        if let Some(r) = a.reps {
            if r == 0 {
                return Err("--reps must be at least 1".into());
            }
            c.reps = r;
            c.fb_reps = r.min(c.fb_reps.max(1));
        }
        let pos = |v: Option<f64>, flag: &str| -> Result<Option<f64>, String> {
            match v {
                Some(x) if !(x.is_finite() && x > 0.0) => Err(format!("{flag} must be positive")),
                v => Ok(v),
            }
        };
        if let Some(x) = pos(a.rep_secs, "--rep-secs")? {
            c.rep_secs = x;
        }
        if let Some(x) = pos(a.duration, "--duration")? {
            c.duration = x;
        }
        if let Some(x) = pos(a.gc_secs, "--gc-secs")? {
            c.gc_secs = x;
        }
        if let Some(x) = pos(a.fileset_scale, "--fileset-scale")? {
            c.fileset_scale = x;
        }
        if let Some(x) = a.file_size {
            c.file_size = x;
        }
        if let Some(x) = &a.real_src {
            c.real_src = x.clone();
        }
        if let Some(x) = a.files {
            if x == 0 {
                return Err("--files must be positive".into());
            }
            c.files = x;
        }
        if let Some(x) = a.recovery_data {
            c.recovery_data = x;
        }
        if let Some(x) = a.gc_pool {
            if x < 16 * M {
                return Err("--gc-pool must be at least 16M".into());
            }
            c.gc_pool = x;
        }
        if let Some(x) = a.pool_size {
            if x < 64 * M {
                return Err("--pool-size must be at least 64M".into());
            }
            c.pool_size = x;
        }
        let largest = c.sizes.iter().chain(&c.append_sizes).copied().max().unwrap_or(4 * K);
        c.file_size = c.file_size.max(4 * largest).div_ceil(4 * K) * 4 * K;
        c.circ_region = c.circ_region.max(4 * largest).div_ceil(4 * K) * 4 * K;
        c.rep_bytes = c.rep_bytes.max(largest);
        let maxt = c.threads.iter().copied().max().unwrap_or(1) as u64;
        if c.file_size * maxt * 4 > c.pool_size {
            return Err(format!(
                "micro files ({} x {maxt} threads) do not fit comfortably in the {} pool; \
                 raise --pool-size or lower --file-size",
                fmt_size(c.file_size),
                fmt_size(c.pool_size)
            ));
        }
        c.ferrite_bin = a.ferrite_bin.clone();
        c.progress = !a.no_progress;
        c.work_dir = a.work_dir.clone().unwrap_or_else(|| {
            PathBuf::from(format!("/dev/shm/ferrite-bench-{}", std::process::id()))
        });
        // The preloaded re-run of a bench with the direct target writes where its
        // parent decided.
        let out_env = std::env::var_os("FERRITE_BENCH_OUT").map(PathBuf::from);
        c.out = a.out.clone().or(out_env).unwrap_or_else(|| {
            PathBuf::from("bench-results")
                .join(crate::report::utc_stamp(std::time::SystemTime::now()))
        });
        Ok(c)
    }

    /// Whether experiment `e` runs.
    pub fn runs(&self, e: &str) -> bool {
        self.experiments.iter().any(|x| x == e)
    }

    /// Whether target selector `t` is on.
    pub fn wants(&self, t: &str) -> bool {
        self.targets.iter().any(|x| x == t)
    }

    /// Bytes of each region ("file") of a hardware target: room for every file an
    /// experiment writes there.
    pub fn hw_region(&self) -> u64 {
        (2 * self.file_size).max(self.rep_bytes).max(self.circ_region)
    }

    /// Operations per micro repetition for I/O size `size` (before the time cap).
    pub fn ops_for(&self, size: u64) -> u64 {
        (self.rep_bytes / size).clamp(16, self.max_ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("64").unwrap(), 64);
        assert_eq!(parse_size("4K").unwrap(), 4096);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999G").is_err());
        assert_eq!(fmt_size(64), "64 B");
        assert_eq!(fmt_size(4096), "4 KiB");
        assert_eq!(fmt_size(1 << 20), "1 MiB");
        assert_eq!(fmt_size(1000), "1000 B");
    }

    #[test]
    fn presets_and_overrides() {
        let c = Config::from_args(&BenchArgs { quick: true, ..Default::default() }).unwrap();
        assert_eq!(c.preset, "quick");
        assert_eq!(c.experiments.len(), EXPERIMENTS.len());
        assert!(c.file_size >= 4 << 20);
        let a = BenchArgs {
            smoke: true,
            experiments: vec!["meta".into()],
            targets: vec!["tmpfs".into(), "lib".into()],
            sizes: vec![512],
            ..Default::default()
        };
        let c = Config::from_args(&a).unwrap();
        assert_eq!(c.experiments, vec!["meta"]);
        assert_eq!(c.targets, vec!["lib", "tmpfs"]);
        assert_eq!(c.t2_sizes, vec![512]);
        let bad = BenchArgs { experiments: vec!["nope".into()], ..Default::default() };
        assert!(Config::from_args(&bad).unwrap_err().contains("unknown experiment"));
        let bad = BenchArgs { reps: Some(0), ..Default::default() };
        assert!(Config::from_args(&bad).is_err());
        let bad = BenchArgs { emulate: vec!["dram9".into()], ..Default::default() };
        assert!(Config::from_args(&bad).is_err());
        let bad = BenchArgs { smoke: true, file_size: Some(1 << 30), ..Default::default() };
        assert!(Config::from_args(&bad).is_err());
    }
}
