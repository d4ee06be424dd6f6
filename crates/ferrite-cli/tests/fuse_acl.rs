//! POSIX ACLs on the mount, against tmpfs: the same shell script (setfacl, getfacl,
//! chmod, chown, umask, default-ACL inheritance, and reads and creates as another
//! user, whom only the ACL lets in) runs in a tmpfs directory and on a FerriteFS
//! mount; every line of output must match. The kernel enforces the ACLs it reads
//! from `system.posix_acl_access`; the core keeps the mode in step, applies chmod to
//! the ACL and makes new nodes inherit default ACLs (tests/atime_relatime.rs and the
//! core's `acl` unit tests hold the rules).

mod fuse_util;

use fuse_util::Mount;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/acl_script.sh");

fn run_script(dir: &Path) -> String {
    let out = Command::new("bash").arg(SCRIPT).arg(dir).output().expect("bash runs");
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    s
}

#[test]
fn acls_behave_as_on_tmpfs() {
    for tool in ["setfacl", "getfacl", "setpriv"] {
        let ok = Command::new("sh").arg("-c").arg(format!("command -v {tool}")).status();
        assert!(ok.is_ok_and(|s| s.success()), "{tool} is missing: scripts/install-deps.sh");
    }
    // Another user must reach both directories.
    let reference = tempfile::Builder::new().prefix("ferrite-acl").tempdir_in("/dev/shm").unwrap();
    std::fs::set_permissions(reference.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let want = run_script(reference.path());
    let mut m = Mount::new("acl", "64M", "allow_other");
    let parent = m.mnt.parent().unwrap();
    std::fs::set_permissions(parent, std::fs::Permissions::from_mode(0o755)).unwrap();
    let got = run_script(&m.mnt);
    m.umount();
    assert!(want.contains("user:1000:r--"), "the reference run set no ACL:\n{want}");
    assert!(want.contains("secret"), "the ACL let the other user read on tmpfs:\n{want}");
    for (k, (w, g)) in want.lines().zip(got.lines()).enumerate() {
        assert_eq!(g, w, "line {} differs\ntmpfs:\n{want}\nferrite:\n{got}", k + 1);
    }
    assert_eq!(want.lines().count(), got.lines().count(), "tmpfs:\n{want}\nferrite:\n{got}");
    let (report, fsck) = m.check_pool();
    assert!(report.clean && fsck.is_clean(), "{fsck:?}");
}
