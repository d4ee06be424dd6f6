/* A file of a mounted pool mapped into the process (DAX) through the C API.
 *
 * FERRITE_MOUNT names a FerriteFS mount (`ferrite mount POOL DIR`). The program
 * maps a file, appends 64-byte records to it with plain stores, each made durable
 * with ferrite_persist (cache-line flushes and one fence, no system call), and
 * checks that a plain read through the mount sees them, that the file cannot
 * shrink while mapped, and that the mapping refuses what mmap(2) refuses. It
 * exits 0 only when all of it worked.
 *
 *   cc dax_map.c $(pkg-config --cflags --libs ferrite) -o dax_map
 *   FERRITE_MOUNT=/mnt/ferrite ./dax_map
 */
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ferrite.h>

#include "common.h"

enum { RECORD = 64, RECORDS = 1000, SIZE = 65536 };

int main(void) {
  const char *mount = need_env("FERRITE_MOUNT");
  char path[64], plain[512];
  snprintf(path, sizeof path, "/dax-map-%d.log", (int)getpid());
  snprintf(plain, sizeof plain, "%s%s", mount, path);

  struct ferrite *f = ferrite_attach(mount);
  CHECK(f != NULL, "ferrite_attach");
  int fd = ferrite_open(f, path, O_CREAT | O_RDWR | O_EXCL, 0644);
  CHECK(fd >= 0, "ferrite_open");
  CHECK(ferrite_ftruncate(f, fd, SIZE) == 0, "ferrite_ftruncate");
  char *log = ferrite_mmap(f, fd, SIZE, PROT_READ | PROT_WRITE, 0);
  CHECK(log != NULL, "ferrite_mmap");

  /* Records appended with stores: each is durable once ferrite_persist returns. */
  for (int i = 0; i < RECORDS; i++) {
    char *r = log + (size_t)i * RECORD;
    snprintf(r, RECORD, "record %04d", i);
    CHECK(ferrite_persist(f, r, RECORD) == 0, "ferrite_persist");
  }

  /* A plain process (here: plain POSIX calls of this one) reads them. */
  int pfd = open(plain, O_RDONLY);
  CHECK(pfd >= 0, "open through the mount");
  char back[RECORD];
  CHECK(pread(pfd, back, RECORD, 777 * RECORD) == RECORD, "pread through the mount");
  CHECK(strcmp(back, "record 0777") == 0, "the mount sees the stores");
  close(pfd);
  /* Writes land in the mapped blocks: the mapping sees them. */
  CHECK(ferrite_pwrite(f, fd, "written", 7, 64000) == 7, "ferrite_pwrite");
  CHECK(memcmp(log + 64000, "written", 7) == 0, "the mapping sees the write");

  /* Refusals, as mmap(2) and truncate(2) give them. */
  CHECK(ferrite_ftruncate(f, fd, 100) == -1 && errno == EBUSY, "no shrinking while mapped");
  int ro = ferrite_open(f, path, O_RDONLY, 0);
  CHECK(ro >= 0, "ferrite_open read-only");
  CHECK(ferrite_mmap(f, ro, 4096, PROT_READ | PROT_WRITE, 0) == NULL && errno == EACCES,
        "no writable mapping of a read-only descriptor");
  CHECK(ferrite_mmap(f, fd, 4096, PROT_READ, 100) == NULL && errno == EINVAL,
        "no mapping at an unaligned offset");
  CHECK(ferrite_persist(f, &back, sizeof back) == -1 && errno == EINVAL,
        "ferrite_persist of memory that is not a mapping");
  CHECK(ferrite_close(f, ro) == 0, "ferrite_close");

  CHECK(ferrite_munmap(f, log, SIZE) == 0, "ferrite_munmap");
  CHECK(ferrite_ftruncate(f, fd, 100) == 0, "shrinking once unmapped");
  CHECK(ferrite_close(f, fd) == 0, "ferrite_close");
  CHECK(ferrite_unlink(f, path) == 0, "ferrite_unlink");
  CHECK(ferrite_release(f) == 0, "ferrite_release");
  printf("dax map: ok (%d records)\n", RECORDS);
  return 0;
}
