//! Typed errors. They become errno values only at the FUSE / C / LD_PRELOAD
//! boundary, through [`Error::errno`].

use std::path::{Path, PathBuf};

/// A FerriteFS error.
#[derive(Debug)]
pub enum Error {
    /// ENOENT
    NotFound,
    /// EEXIST
    Exists,
    /// ENOTDIR
    NotDir,
    /// EISDIR
    IsDir,
    /// ENOTEMPTY
    NotEmpty,
    /// EINVAL, with what was invalid.
    Invalid(String),
    /// ENOSPC: the pool (blocks, inodes or log space) is full.
    NoSpace,
    /// ENAMETOOLONG
    NameTooLong,
    /// EFBIG
    FileTooBig,
    /// ELOOP
    Loop,
    /// EPERM
    NotPermitted,
    /// EACCES
    AccessDenied,
    /// ENODATA: no such extended attribute.
    NoAttr,
    /// E2BIG: extended attribute value too large.
    TooBig,
    /// ERANGE: caller's buffer too small.
    Range,
    /// EROFS
    ReadOnly,
    /// EBUSY
    Busy,
    /// EBUSY: the operation would free or move blocks of a file some process has
    /// mapped with DAX (see `mapping`).
    DaxMapped,
    /// EXDEV
    CrossDevice,
    /// EMLINK: a data block is shared by as many files as its count holds.
    TooManyLinks,
    /// EBADF
    BadHandle,
    /// ENXIO: no data (SEEK_DATA) or hole (SEEK_HOLE) at or after the offset.
    NoOffset,
    /// ENXIO: a FIFO, socket or device node opened without the kernel (the C API
    /// or a path open in the library): only the kernel can run one.
    SpecialFile,
    /// EOPNOTSUPP
    NotSupported(&'static str),
    /// The pool is mounted by another process (or this one).
    PoolInUse {
        /// Pool file.
        path: PathBuf,
        /// Who holds it.
        holder: String,
    },
    /// The pool is not a FerriteFS pool, or a different version.
    Foreign(String),
    /// A FerriteFS pool of a format version this build does not read.
    Version {
        /// The pool's format version.
        found: u32,
        /// The version this build reads and writes.
        supported: u32,
    },
    /// The pool's contents are damaged (checksum mismatch, bad pointer, log cycle...).
    Corrupt(String),
    /// EIO: a read touched a data block whose checksum does not match (the block
    /// was damaged on media after it was written).
    DataCorrupt {
        /// Inode read.
        ino: u64,
        /// File offset of the damaged page.
        offset: u64,
        /// Pool block holding it.
        block: u64,
    },
    /// ENOTCONN: the mount daemon this direct-access client used is gone, or it
    /// took direct access back.
    Disconnected(String),
    /// An I/O error on the pool file.
    Io {
        /// Pool file.
        path: PathBuf,
        /// Underlying error.
        err: std::io::Error,
    },
}

/// Result alias.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An I/O error about `path`.
    pub fn io(path: &Path, err: std::io::Error) -> Self {
        Error::Io { path: path.to_path_buf(), err }
    }

    /// A corruption error.
    pub fn corrupt(msg: impl Into<String>) -> Self {
        Error::Corrupt(msg.into())
    }

    /// An EINVAL with a reason.
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }

    /// The errno value for this error (Linux numbering).
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound => libc::ENOENT,
            Error::Exists => libc::EEXIST,
            Error::NotDir => libc::ENOTDIR,
            Error::IsDir => libc::EISDIR,
            Error::NotEmpty => libc::ENOTEMPTY,
            Error::Invalid(_) => libc::EINVAL,
            Error::NoSpace => libc::ENOSPC,
            Error::NameTooLong => libc::ENAMETOOLONG,
            Error::FileTooBig => libc::EFBIG,
            Error::Loop => libc::ELOOP,
            Error::NotPermitted => libc::EPERM,
            Error::AccessDenied => libc::EACCES,
            Error::NoAttr => libc::ENODATA,
            Error::TooBig => libc::E2BIG,
            Error::Range => libc::ERANGE,
            Error::ReadOnly => libc::EROFS,
            Error::Busy | Error::DaxMapped | Error::PoolInUse { .. } => libc::EBUSY,
            Error::CrossDevice => libc::EXDEV,
            Error::TooManyLinks => libc::EMLINK,
            Error::BadHandle => libc::EBADF,
            Error::NoOffset | Error::SpecialFile => libc::ENXIO,
            Error::NotSupported(_) => libc::EOPNOTSUPP,
            Error::Foreign(_) | Error::Corrupt(_) | Error::Version { .. } => libc::EUCLEAN,
            Error::Disconnected(_) => libc::ENOTCONN,
            Error::DataCorrupt { .. } => libc::EIO,
            Error::Io { err, .. } => err.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NotFound => write!(f, "no such file or directory"),
            Error::Exists => write!(f, "file exists"),
            Error::NotDir => write!(f, "not a directory"),
            Error::IsDir => write!(f, "is a directory"),
            Error::NotEmpty => write!(f, "directory not empty"),
            Error::Invalid(m) => write!(f, "invalid argument: {m}"),
            Error::NoSpace => write!(f, "no space left in the pool"),
            Error::NameTooLong => write!(f, "file name too long (255 bytes at most)"),
            Error::FileTooBig => write!(f, "file too large"),
            Error::Loop => write!(f, "too many levels of symbolic links"),
            Error::NotPermitted => write!(f, "operation not permitted"),
            Error::AccessDenied => write!(f, "permission denied"),
            Error::NoAttr => write!(f, "no such extended attribute"),
            Error::TooBig => write!(f, "extended attribute value too large"),
            Error::Range => write!(f, "result too large for the buffer"),
            Error::ReadOnly => write!(f, "pool is mounted read-only"),
            Error::Busy => write!(f, "resource busy"),
            Error::DaxMapped => write!(
                f,
                "the file is DAX-mapped by a live process: its blocks cannot be freed \
                 until every mapping of it is gone"
            ),
            Error::CrossDevice => write!(f, "cross-device link"),
            Error::TooManyLinks => write!(f, "a data block is shared too many times"),
            Error::BadHandle => write!(f, "bad file handle"),
            Error::NoOffset => write!(f, "no data or hole at or after that offset"),
            Error::SpecialFile => {
                write!(f, "a FIFO, socket or device node opens only through the mount")
            }
            Error::NotSupported(m) => write!(f, "not supported: {m}"),
            Error::PoolInUse { path, holder } => {
                write!(f, "pool {} is in use by {holder}", path.display())
            }
            Error::Foreign(m) => write!(f, "not a FerriteFS pool: {m}"),
            Error::Corrupt(m) => write!(f, "pool is corrupt: {m}"),
            Error::Version { found, supported } if found < supported => write!(
                f,
                "pool has format version {found}, this build reads version {supported}: \
                 `ferrite upgrade POOL` converts it in place (a cleanly unmounted pool)"
            ),
            Error::Version { found, supported } => write!(
                f,
                "pool has format version {found}, written by a newer FerriteFS; \
                 this build reads version {supported}"
            ),
            Error::Disconnected(m) => write!(f, "direct access ended: {m}"),
            Error::DataCorrupt { ino, offset, block } => write!(
                f,
                "input/output error: data of inode {ino} at byte {offset} (pool block {block}) \
                 does not match its checksum"
            ),
            Error::Io { path, err } => write!(f, "{}: {err}", path.display()),
        }
    }
}

impl std::error::Error for Error {}
