//! The C API as a C programmer meets it: `scripts/install.sh` into a fresh prefix,
//! the programs of docs/examples/ compiled with `pkg-config --cflags --libs
//! ferrite` and -Wall -Werror, then run against a mounted pool (direct access) and
//! against a pool of their own; each exits 0 only when everything it shows worked.

mod fuse_util;

use fuse_util::*;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("workspace root")
}

/// Install the build under test (debug, already built) into a temporary prefix.
fn install(prefix: &Path) {
    let bin = Path::new(ferrite());
    for lib in ["libferrite.so", "libferrite.a", "libferrite_preload.so"] {
        let p = bin.with_file_name(lib);
        let fresh = std::fs::metadata(&p)
            .and_then(|m| m.modified())
            .ok()
            .zip(std::fs::metadata(bin).and_then(|m| m.modified()).ok());
        assert!(
            matches!(fresh, Some((l, b)) if l + std::time::Duration::from_secs(600) >= b),
            "{} missing or older than {}: run `cargo build --workspace`",
            p.display(),
            bin.display()
        );
    }
    let profile = bin.parent().and_then(|d| d.file_name()).expect("profile dir");
    run(Command::new(root().join("scripts/install.sh"))
        .arg(prefix)
        .env("FERRITE_PROFILE", profile)
        .env("FERRITE_NO_BUILD", "1"));
}

fn compile(prefix: &Path, example: &str, out: &Path) {
    let pc = prefix.join("lib/pkgconfig");
    let flags = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "ferrite"])
        .env("PKG_CONFIG_PATH", &pc));
    let flags = String::from_utf8(flags.stdout).expect("utf-8");
    let src = root().join("docs/examples").join(format!("{example}.c"));
    run(Command::new("cc")
        .args(["-Wall", "-Werror", "-O1"])
        .arg(&src)
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(out));
}

#[test]
fn c_examples_build_with_pkg_config_and_run() {
    let m = Mount::new("capi", "256M", "");
    let prefix = m.scratch().join("prefix");
    install(&prefix);
    for f in [
        "bin/ferrite",
        "lib/libferrite.so",
        "lib/libferrite.a",
        "lib/libferrite_preload.so",
        "include/ferrite.h",
    ] {
        assert!(prefix.join(f).exists(), "{f} not installed");
    }
    let direct = m.scratch().join("direct_client");
    let own = m.scratch().join("own_pool");
    compile(&prefix, "direct_client", &direct);
    compile(&prefix, "own_pool", &own);
    let dax = m.scratch().join("dax_map");
    compile(&prefix, "dax_map", &dax);
    let out = run(Command::new(&dax).env("FERRITE_MOUNT", &m.mnt));
    assert!(String::from_utf8_lossy(&out.stdout).contains("dax map: ok"));
    let pbuf = m.scratch().join("pbuf_write");
    compile(&prefix, "pbuf_write", &pbuf);
    let out = run(Command::new(&pbuf).env("FERRITE_MOUNT", &m.mnt));
    assert!(String::from_utf8_lossy(&out.stdout).contains("pbuf write: ok"));
    let out = run(Command::new(&direct).env("FERRITE_MOUNT", &m.mnt));
    assert!(String::from_utf8_lossy(&out.stdout).contains("direct client: ok"));
    let shift = m.scratch().join("shift_range");
    compile(&prefix, "shift_range", &shift);
    let out = run(Command::new(&shift).env("FERRITE_MOUNT", &m.mnt));
    assert!(String::from_utf8_lossy(&out.stdout).contains("shift range: ok"));
    let reflink = m.scratch().join("reflink");
    compile(&prefix, "reflink", &reflink);
    let out = run(Command::new(&reflink).env("FERRITE_MOUNT", &m.mnt));
    assert!(String::from_utf8_lossy(&out.stdout).contains("reflink: ok"));
    let pool = m.scratch().join("own.pool");
    let out = run(Command::new(&own).env("FERRITE_POOL", &pool));
    assert!(String::from_utf8_lossy(&out.stdout).contains("own pool: ok"));
    let atomic = m.scratch().join("atomic_map");
    compile(&prefix, "atomic_map", &atomic);
    let out = run(Command::new(&atomic).env("FERRITE_POOL", &pool));
    assert!(String::from_utf8_lossy(&out.stdout).contains("atomic map: ok"));
    // NUMA placement on a simulated two-node topology: the policy put the data on
    // node 1, as `ferrite bmap` shows.
    let numa = m.scratch().join("numa_policy");
    compile(&prefix, "numa_policy", &numa);
    let out = run(Command::new(&numa).env("FERRITE_POOL", &pool).env("FERRITE_NUMA_NODES", "2"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("numa policy: ok"));
    let out = run(Command::new(ferrite())
        .args(["bmap", "--pool"])
        .arg(&pool)
        .arg("/placed")
        .env("FERRITE_NUMA_NODES", "2"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("data pages per node: [0, 64]"), "{text}");
    let (_, fsck) = check_pool(&pool);
    assert!(fsck.is_clean(), "{:?}", fsck.errors);
    // The installed `ferrite run` finds the installed preload library.
    let out = run(Command::new(prefix.join("bin/ferrite")).args([
        "run",
        "--",
        "sh",
        "-c",
        "echo $LD_PRELOAD",
    ]));
    let lib = String::from_utf8_lossy(&out.stdout);
    assert!(lib.trim_end().ends_with("lib/libferrite_preload.so"), "{lib}");
}
