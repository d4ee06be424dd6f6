//! fallocate(2) modes through the mount: FALLOC_FL_ZERO_RANGE (with and without
//! KEEP_SIZE) zeroes and allocates as the core does (tests/fallocate_modes.rs in the
//! core holds the model and crash tests); collapse and insert are EOPNOTSUPP, as
//! docs/FUSE.md says. tmpfs has no zero range, so this is not in the differential test.

mod fuse_util;

use fuse_util::Mount;
use rustix::fs::{fallocate, FallocateFlags};
use std::os::unix::fs::MetadataExt;

#[test]
fn zero_range_through_the_mount() {
    let mut m = Mount::new("falloc", "64M", "");
    let p = m.mnt.join("f");
    let mut want = vec![0xabu8; 3 * 4096];
    std::fs::write(&p, &want).unwrap();
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&p).unwrap();
    fallocate(&f, FallocateFlags::ZERO_RANGE, 100, 5000).unwrap();
    want[100..5100].fill(0);
    assert!(std::fs::read(&p).unwrap() == want, "zero range inside the file");
    let blocks = f.metadata().unwrap().blocks();
    fallocate(&f, FallocateFlags::ZERO_RANGE | FallocateFlags::KEEP_SIZE, 12_288, 8192).unwrap();
    let md = f.metadata().unwrap();
    assert_eq!(md.len(), 12_288, "KEEP_SIZE keeps the size");
    assert!(md.blocks() > blocks, "the range past the end is allocated");
    fallocate(&f, FallocateFlags::ZERO_RANGE, 12_000, 8192).unwrap();
    want.truncate(12_000);
    want.resize(20_192, 0);
    assert!(std::fs::read(&p).unwrap() == want, "zero range past the end grows the file");
    for flags in [FallocateFlags::COLLAPSE_RANGE, FallocateFlags::INSERT_RANGE] {
        let e = fallocate(&f, flags, 0, 4096).unwrap_err();
        assert_eq!(e, rustix::io::Errno::OPNOTSUPP, "{flags:?}");
    }
    drop(f);
    m.umount();
    let (report, fsck) = m.check_pool();
    assert!(report.clean && fsck.is_clean(), "{fsck:?}");
}
