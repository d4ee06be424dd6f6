#ifndef FERRITE_H
#define FERRITE_H

/* Generated from crates/ferrite-capi/src by cbindgen (build.rs); do not edit. */

#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>

// A FerriteFS handle: a direct-access client of a mounted pool, or a pool the
// process opened alone.
struct ferrite;

// File attributes as the C API reports them.
struct ferrite_stat {
  // Inode number.
  uint64_t ino;
  // Type and permission bits (st_mode).
  uint32_t mode;
  // Links.
  uint32_t nlink;
  // Owner.
  uint32_t uid;
  // Group.
  uint32_t gid;
  // Size in bytes.
  uint64_t size;
  // 512-byte blocks.
  uint64_t blocks;
  // Access time, seconds.
  int64_t atime_sec;
  // Modification time, seconds.
  int64_t mtime_sec;
  // Change time, seconds.
  int64_t ctime_sec;
  // Access time, nanoseconds.
  uint32_t atime_nsec;
  // Modification time, nanoseconds.
  uint32_t mtime_nsec;
  // Change time, nanoseconds.
  uint32_t ctime_nsec;
  // Device number of a character or block device (0 otherwise), in the
  // kernel's 32-bit encoding: major `(rdev >> 8) & 0xfff`, minor
  // `(rdev & 0xff) | ((rdev >> 12) & 0xfff00)`.
  uint32_t rdev;
};

// Called by `ferrite_readdir` for each entry; return non-zero to stop.
typedef int (*ferrite_dirent_fn)(void *ctx, const char *name, uint64_t ino, uint8_t dtype);

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// Attach to the FerriteFS mount at `mount` as a direct-access client: names go
// through the mount, file data through this process's own mapping of the pool.
// NULL and errno on failure (EACCES: this process may not open the pool file;
// ENOTSUP: the mount offers no direct access).
struct ferrite *ferrite_attach(const char *mount);

// Open the pool file `pool` in this process alone (no daemon, no mount), formatting
// it with `create_size` bytes if it does not exist and `create_size` is not 0.
// NULL and errno on failure (EBUSY: another process holds the pool).
struct ferrite *ferrite_open_pool(const char *pool, uint64_t create_size);

// End a handle: a client detaches; a pool opened alone is unmounted cleanly. Its
// open files are closed. 0, or -1 and errno.
int ferrite_release(struct ferrite *f);

// Open a regular file (`flags` and `mode` as open(2), with open(2)'s errors; O_CREAT,
// O_EXCL, O_TRUNC, O_APPEND and the access mode are understood; the process's
// umask applies to a file it creates). A directory fails with EISDIR, a FIFO,
// socket or device with ENXIO (without blocking). A descriptor of this handle, or -1.
int ferrite_open(struct ferrite *f, const char *path, int flags, unsigned int mode);

// Close a descriptor.
int ferrite_close(struct ferrite *f, int fd);

// read(2): bytes read (0 at the end), or -1.
ptrdiff_t ferrite_read(struct ferrite *f, int fd, void *b, size_t n);

// write(2): durable when it returns.
ptrdiff_t ferrite_write(struct ferrite *f, int fd, const void *b, size_t n);

// pread(2).
ptrdiff_t ferrite_pread(struct ferrite *f, int fd, void *b, size_t n, int64_t off);

// pwrite(2): durable when it returns.
ptrdiff_t ferrite_pwrite(struct ferrite *f, int fd, const void *b, size_t n, int64_t off);

// lseek(2) with SEEK_SET, SEEK_CUR, SEEK_END, SEEK_DATA or SEEK_HOLE (holes at page
// granularity, as tmpfs): the new offset, or -1.
int64_t ferrite_lseek(struct ferrite *f, int fd, int64_t off, int whence);

// Map `len` bytes of open file `fd` from `off` (a multiple of 4096) into this
// process, shared: loads and stores are the file's pool blocks, with no kernel
// on the way (DAX). `prot`: PROT_READ, optionally PROT_WRITE (the file must be
// open for reading, and for writing without O_APPEND, to store). Stores are
// durable after `ferrite_persist`. Pages past the end of the file at mapping
// time fault. While a file is mapped it cannot shrink (EBUSY). The address, or
// NULL and errno (EACCES, EINVAL, ENOSPC; EBUSY: a plain process holds the file
// in the kernel's page cache).
void *ferrite_mmap(struct ferrite *f, int fd, size_t len, int prot, int64_t off);

// Map `len` bytes of open file `fd` from `off` (a multiple of 4096, inside the
// file's pages) **atomically** (NOVA's atomic-mmap): the process gets its own copy,
// and `ferrite_persist` of a range of it commits every page of the range changed
// since the last commit as one atomic update: after a crash the file shows all of
// those pages or none. Others' writes after the mapping are not seen in it; a
// commit writes whole changed pages. EBUSY at commit while the file is DAX-mapped.
// `ferrite_munmap` of the whole mapping ends it. The address, or NULL and errno.
void *ferrite_mmap_atomic(struct ferrite *f, int fd, size_t len, int prot, int64_t off);

// NUMA placement of open file `fd` (like the ASPLOS '19 paper's ioctl): its new
// data goes to memory node `node`, or to the writing thread's node when `node` is
// negative (the default). Stored as the `user.ferrite.numa` attribute. 0, or -1
// and errno (EINVAL: no such node on this machine).
int ferrite_set_numa_node(struct ferrite *f, int fd, int node);

// A persistent buffer of `len` bytes (Libpubl's idea): memory that is pool
// blocks, for the program to fill with its own stores and then write into files
// with `ferrite_buf_write`. Its content starts undefined. NULL and errno on
// failure (ENOSPC).
void *ferrite_buf_alloc(struct ferrite *f, size_t len);

// pwrite(2) of `len` bytes at `buf` (inside a persistent buffer) into open file
// `fd` at `off`, durable and atomic when it returns. The buffer's whole pages that
// fall on whole file pages (`buf` and `off` at the same offset within a page)
// become the file's without a copy, and the buffer gets fresh memory for them at
// once (their content undefined); the rest is copied. No need to persist the
// buffer first. Bytes written, or -1 and errno.
ptrdiff_t ferrite_buf_write(struct ferrite *f, int fd, const void *buf, size_t len, int64_t off);

// Free the persistent buffer that starts at `buf`. 0, or -1 and errno.
int ferrite_buf_free(struct ferrite *f, void *buf);

// Unmap (part of) a mapping of `ferrite_mmap` (the whole of an atomic one); the
// file may shrink again once none of its mappings is left. 0, or -1 and errno.
int ferrite_munmap(struct ferrite *f, void *addr, size_t len);

// Make the stores to `[addr, addr + len)` of mappings of `ferrite_mmap` durable
// (cache-line flushes and one fence: no system call on a DAX or /dev/shm pool);
// of a mapping of `ferrite_mmap_atomic`, commit its changed pages atomically.
// Any address and length; 0, or -1 and EINVAL when part of the range is not
// such a mapping.
int ferrite_persist(struct ferrite *f, const void *addr, size_t len);

// fsync(2): every write was durable already; 0.
int ferrite_fsync(struct ferrite *f, int fd);

// ftruncate(2).
int ferrite_ftruncate(struct ferrite *f, int fd, int64_t len);

// fallocate(2) with its mode bits (FALLOC_FL_*): allocation, KEEP_SIZE, PUNCH_HOLE,
// ZERO_RANGE, COLLAPSE_RANGE and INSERT_RANGE.
int ferrite_fallocate(struct ferrite *f, int fd, int mode, int64_t off, int64_t len);

// FICLONERANGE between two open files of the pool: `len` bytes (0: to the
// source's end) of `dst_fd` from `off_out` share the blocks of `src_fd` from
// `off_in`, copy-on-write (a reflink: no data copied), durable and atomic when it
// returns. Offsets page-aligned; errors as Linux's ioctl.
int ferrite_clone_range(struct ferrite *f,
                        int src_fd,
                        int64_t off_in,
                        int dst_fd,
                        int64_t off_out,
                        int64_t len);

// fstat(2) into `st`.
int ferrite_fstat(struct ferrite *f, int fd, struct ferrite_stat *st);

// stat(2) of a path inside the pool into `st`.
int ferrite_stat(struct ferrite *f, const char *path, struct ferrite_stat *st);

// mknod(2): a FIFO, socket, character or block device (`dev` as makedev
// gives it) or a regular file; the process's umask applies. Only a process that
// opens the node through a mount gets the pipe, socket or device; ferrite_open of
// one fails with ENXIO.
int ferrite_mknod(struct ferrite *f, const char *path, unsigned int mode, uint64_t dev);

// mkdir(2) (the process's umask applies).
int ferrite_mkdir(struct ferrite *f, const char *path, unsigned int mode);

// unlink(2).
int ferrite_unlink(struct ferrite *f, const char *path);

// rmdir(2).
int ferrite_rmdir(struct ferrite *f, const char *path);

// rename(2).
int ferrite_rename(struct ferrite *f, const char *from, const char *to);

// Call `cb` for each entry of a directory (without "." and ".."), with its name,
// inode and d_type (DT_REG, DT_DIR, DT_LNK); stops early when `cb` returns
// non-zero. 0, or -1 and errno.
int ferrite_readdir(struct ferrite *f, const char *path, ferrite_dirent_fn cb, void *ctx);

// The library's version, a static string.
const char *ferrite_version(void);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* FERRITE_H */
