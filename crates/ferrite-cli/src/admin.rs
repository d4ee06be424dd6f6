//! mkfs, info and fsck.

use ferrite_core::{
    layout::{MOUNT_STATE_OFF, STATE_CLEAN},
    Error, Fs, MapOptions, Medium, MkfsOptions, MmapMedium, MountOptions,
};
use std::path::PathBuf;

/// Parse a size with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        Some('t' | 'T') => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size '{s}' (use e.g. 512M, 2G)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("size '{s}' too large"))
}

#[derive(clap::Args)]
pub struct MkfsArgs {
    /// Pool file to create.
    #[arg(default_value = crate::DEFAULT_POOL)]
    pool: PathBuf,
    /// Pool size (K/M/G suffixes).
    #[arg(long, short, default_value = "1G", value_parser = parse_size)]
    size: u64,
    /// Overwrite an existing pool or file.
    #[arg(long, short)]
    force: bool,
    /// Shards (per-CPU inode tables, journals and free lists).
    #[arg(long, default_value_t = 8)]
    shards: u32,
    /// Inode slots (default: one per 8 KiB of pool).
    #[arg(long, default_value_t = 0)]
    inodes: u64,
    /// Give this group (name or number) direct access: the pool file becomes mode
    /// 0660 with that group (default 0600: only the owner may map the pool).
    #[arg(long, value_name = "GROUP")]
    group: Option<String>,
    /// Keep no second copy of the journals, inode slots and checkpoint (for
    /// measuring what they cost; a damaged slot then loses its file for good).
    #[arg(long)]
    no_replicas: bool,
}

/// The pool file's permissions decide who may map it, and so read and write every
/// file in it whatever their own modes: a warning when others may.
pub fn access_warning(pool: &std::path::Path) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(pool).ok()?.permissions().mode();
    (mode & 0o007 != 0).then(|| {
        format!(
            "pool file {} is {} by others (mode {:04o}): any local user can read or change every \
             file in the pool through it, whatever the files' own modes; `chmod o-rwx` it",
            pool.display(),
            match (mode & 0o004 != 0, mode & 0o002 != 0) {
                (true, true) => "readable and writable",
                (true, false) => "readable",
                _ => "writable",
            },
            mode & 0o7777
        )
    })
}

fn group_id(g: &str) -> Result<u32, String> {
    if let Ok(n) = g.parse::<u32>() {
        return Ok(n);
    }
    let text = std::fs::read_to_string("/etc/group").map_err(|e| format!("/etc/group: {e}"))?;
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() >= 3 && f[0] == g).then(|| f[2].parse().ok()).flatten()
        })
        .next()
        .ok_or_else(|| format!("no group named {g:?}"))
}

pub fn mkfs(a: &MkfsArgs) -> i32 {
    if a.pool.exists() && !a.force {
        let what =
            match MmapMedium::open(&a.pool, &MapOptions { read_only: true, ..Default::default() })
                .and_then(|m| ferrite_core::recovery::read_superblock(&m).map(|_| ()))
            {
                Ok(()) => "a FerriteFS pool",
                Err(_) => "a file",
            };
        eprintln!(
            "ferrite mkfs: {} already exists and is {what}; use --force to overwrite",
            a.pool.display()
        );
        return 1;
    }
    let size = a.size / 4096 * 4096;
    let gid = match a.group.as_deref().map(group_id).transpose() {
        Ok(g) => g,
        Err(e) => {
            eprintln!("ferrite mkfs: --group: {e}");
            return 1;
        }
    };
    let m = match MmapMedium::create(&a.pool, size, &MapOptions::default()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("ferrite mkfs: {e}");
            return 1;
        }
    };
    let mode = m.durability();
    let opts = MkfsOptions {
        shards: a.shards,
        inodes: a.inodes,
        root_uid: current_uid(),
        root_gid: current_gid(),
        uuid: None,
        replicas: !a.no_replicas,
    };
    let striped = |fs: Fs<MmapMedium>| {
        // Several memory nodes: stripe the data area over them (docs/NUMA.md).
        match fs.bind_numa() {
            Ok(0) => {}
            Ok(n) => eprintln!("ferrite mkfs: data area striped over {n} memory nodes"),
            Err(e) => eprintln!("ferrite mkfs: warning: NUMA striping not applied: {e}"),
        }
        fs.unmount()
    };
    match Fs::mkfs(m, &opts).and_then(striped) {
        Ok(_) => {
            if let Some(g) = gid {
                use std::os::unix::fs::PermissionsExt;
                let r = std::os::unix::fs::chown(&a.pool, None, Some(g)).and_then(|_| {
                    std::fs::set_permissions(&a.pool, std::fs::Permissions::from_mode(0o660))
                });
                if let Err(e) = r {
                    eprintln!("ferrite mkfs: giving group {g} access: {e}");
                    return 1;
                }
            }
            println!(
                "formatted {} ({} bytes, {} shards, mode: {})",
                a.pool.display(),
                size,
                a.shards,
                mode.describe()
            );
            0
        }
        Err(e) => {
            eprintln!("ferrite mkfs: {e}");
            1
        }
    }
}

fn current_uid() -> u32 {
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(0)
}

fn current_gid() -> u32 {
    std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::gid(&m)).unwrap_or(0)
}

#[derive(clap::Args)]
pub struct InfoArgs {
    /// Pool file.
    #[arg(default_value = crate::DEFAULT_POOL)]
    pool: PathBuf,
    /// JSON output.
    #[arg(long)]
    json: bool,
}

#[derive(serde::Serialize)]
struct Info {
    pool: String,
    uuid: String,
    format_version: u32,
    size_bytes: u64,
    block_size: u64,
    blocks: u64,
    data_blocks: u64,
    free_blocks: u64,
    used_bytes: u64,
    shards: u32,
    inode_slots: u64,
    inodes_in_use: u64,
    log_pages: u64,
    data_pages: u64,
    /// Data blocks mapped by more than one file or place (reflinks, format version 6).
    shared_blocks: u64,
    clean: bool,
    mapping: String,
    durability: String,
    flush_instruction: String,
    nt_threshold: usize,
    data_checksum: String,
    /// Second copies of inode slots, journals and checkpoint (format feature bit 1).
    metadata_replicas: bool,
    geometry: ferrite_core::layout::Geometry,
    warnings: Vec<String>,
}

pub fn info(a: &InfoArgs) -> i32 {
    // Probe the mapping mode with a writable MAP_SYNC attempt only if nobody holds the pool.
    let mode = MmapMedium::open(&a.pool, &MapOptions::default()).map(|m| m.durability());
    let m = match MmapMedium::open(&a.pool, &MapOptions { read_only: true, ..Default::default() }) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("ferrite info: {e}");
            return 1;
        }
    };
    let clean = m.load_u64(MOUNT_STATE_OFF) & STATE_CLEAN != 0;
    let fs = match Fs::mount(m, &MountOptions { read_only: true, ..Default::default() }) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("ferrite info: {e}");
            return 1;
        }
    };
    let sb = *fs.superblock();
    let g = *fs.geometry();
    let st = fs.statfs();
    let counts = fs.fsck().map(|r| (r.inodes, r.log_pages, r.data_blocks)).unwrap_or((0, 0, 0));
    let cfg = ferrite_core::pmem::config();
    let durability = match &mode {
        Ok(d) => d.describe().to_string(),
        Err(Error::PoolInUse { holder, .. }) => {
            format!("(pool in use by {holder}; mode not probed)")
        }
        Err(e) => format!("(not probed: {e})"),
    };
    let info = Info {
        pool: a.pool.display().to_string(),
        uuid: sb.uuid.iter().map(|b| format!("{b:02x}")).collect(),
        format_version: sb.version,
        size_bytes: sb.pool_size,
        block_size: 4096,
        blocks: sb.nblocks,
        data_blocks: st.blocks,
        free_blocks: st.bfree,
        used_bytes: (st.blocks - st.bfree) * 4096,
        shards: sb.nshards,
        inode_slots: sb.ninodes,
        inodes_in_use: counts.0,
        log_pages: counts.1,
        data_pages: counts.2,
        shared_blocks: fs.shared_blocks().len() as u64,
        clean,
        mapping: match &mode {
            Ok(ferrite_core::Durability::Dax) => "MAP_SHARED_VALIDATE|MAP_SYNC (DAX)".into(),
            Ok(_) => "MAP_SHARED (page cache)".into(),
            Err(_) => "unknown".into(),
        },
        durability,
        flush_instruction: format!("{:?}", cfg.flush),
        nt_threshold: cfg.nt_threshold,
        data_checksum: format!("CRC32C ({})", ferrite_core::log::page_crc_kernel()),
        metadata_replicas: g.replicas,
        geometry: g,
        warnings: access_warning(&a.pool).into_iter().collect(),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&info).expect("serialisable"));
    } else {
        println!("pool:          {}", info.pool);
        println!("uuid:          {}", info.uuid);
        println!("format:        version {}", info.format_version);
        println!(
            "size:          {} bytes ({} blocks of 4 KiB, {} for data)",
            info.size_bytes, info.blocks, info.data_blocks
        );
        println!("used:          {} bytes; {} blocks free", info.used_bytes, info.free_blocks);
        println!("shards:        {}", info.shards);
        println!("inodes:        {} in use of {}", info.inodes_in_use, info.inode_slots);
        println!("log pages:     {}", info.log_pages);
        println!("data pages:    {}", info.data_pages);
        if info.shared_blocks > 0 {
            println!("shared:        {} data blocks (reflinks)", info.shared_blocks);
        }
        println!(
            "state:         {}",
            if clean {
                "clean (checkpoint valid)"
            } else {
                "not cleanly unmounted (next mount recovers)"
            }
        );
        println!("mapping:       {}", info.mapping);
        println!("durability:    {}", info.durability);
        println!(
            "flush:         {} (non-temporal copies from {} bytes)",
            info.flush_instruction, info.nt_threshold
        );
        println!("checksums:     {} over each data page", info.data_checksum);
        let rep = if info.metadata_replicas {
            "inode slots, journals and checkpoint have a second copy"
        } else {
            "none (inode slots, journals and checkpoint have one copy)"
        };
        println!("replicas:      {rep}");
        for w in &info.warnings {
            println!("warning:       {w}");
        }
    }
    0
}

#[derive(clap::Args)]
pub struct UpgradeArgs {
    /// Pool file (not mounted).
    #[arg(default_value = crate::DEFAULT_POOL)]
    pool: PathBuf,
}

/// Convert a pool of an older format version to this build's, in place.
pub fn upgrade(a: &UpgradeArgs) -> i32 {
    let m = match MmapMedium::open(&a.pool, &MapOptions::default()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("ferrite upgrade: {e}");
            return 8;
        }
    };
    match ferrite_core::recovery::upgrade(&m) {
        Ok(v) if v == ferrite_core::layout::VERSION => {
            println!("{}: already format version {v}", a.pool.display());
            0
        }
        Ok(v) => {
            let now = ferrite_core::layout::VERSION;
            println!("{}: format version {v} -> {now}", a.pool.display());
            // Metadata replicas came with version 5: older pools do not get them.
            if v < 5 {
                println!(
                    "  without metadata replicas (second copies of inode slots, journals and the \
                     checkpoint): copy the files to a pool made by `ferrite mkfs` to get them"
                );
            }
            0
        }
        Err(e) => {
            eprintln!("ferrite upgrade: {}: {e}", a.pool.display());
            4
        }
    }
}
