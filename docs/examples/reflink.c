/* Reflinks (FICLONERANGE) through the C API: a clone shares the source's pool
 * blocks copy-on-write, in one atomic commit, with no data copied; each file keeps
 * its own view after either is written. The kernel's FUSE client has no reflinks
 * (the mount answers EOPNOTSUPP); a direct client gets them from the core.
 *
 * FERRITE_MOUNT names a FerriteFS mount. The program writes 64 pages, clones them
 * into a second file, overwrites a page of the source, and checks both files
 * through the C API and through the mount; it exits 0 only when all of it worked.
 *
 *   cc reflink.c $(pkg-config --cflags --libs ferrite) -o reflink
 *   FERRITE_MOUNT=/mnt/ferrite ./reflink
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include <ferrite.h>

#include "common.h"

#define PAGE 4096
#define PAGES 64

int main(void) {
  const char *mount = need_env("FERRITE_MOUNT");
  char src[64], dst[64], plain[512];
  snprintf(src, sizeof src, "/reflink-src-%d", (int)getpid());
  snprintf(dst, sizeof dst, "/reflink-dst-%d", (int)getpid());
  snprintf(plain, sizeof plain, "%s%s", mount, dst);

  struct ferrite *f = ferrite_attach(mount);
  CHECK(f != NULL, "ferrite_attach");
  int a = ferrite_open(f, src, O_CREAT | O_RDWR | O_EXCL, 0644);
  int b = ferrite_open(f, dst, O_CREAT | O_RDWR | O_EXCL, 0644);
  CHECK(a >= 0 && b >= 0, "ferrite_open");
  char page[PAGE];
  for (int i = 0; i < PAGES; i++) {
    memset(page, 'A' + i % 26, PAGE);
    CHECK(ferrite_pwrite(f, a, page, PAGE, (int64_t)i * PAGE) == PAGE, "ferrite_pwrite");
  }
  /* Linux's rules: page-aligned offsets. */
  CHECK(ferrite_clone_range(f, a, 100, b, 0, PAGE) == -1 && errno == EINVAL,
        "unaligned clone refused");
  /* The whole source (length 0: to its end). */
  CHECK(ferrite_clone_range(f, a, 0, b, 0, 0) == 0, "ferrite_clone_range");
  memset(page, '!', PAGE);
  CHECK(ferrite_pwrite(f, a, page, PAGE, 5 * PAGE) == PAGE, "overwrite the source");
  struct ferrite_stat st;
  CHECK(ferrite_fstat(f, b, &st) == 0 && st.size == PAGES * PAGE, "clone size");
  int kfd = open(plain, O_RDONLY);
  CHECK(kfd >= 0, "open the clone through the mount");
  for (int i = 0; i < PAGES; i++) {
    char want = 'A' + i % 26;
    CHECK(ferrite_pread(f, b, page, PAGE, (int64_t)i * PAGE) == PAGE, "ferrite_pread");
    CHECK(page[0] == want && page[PAGE - 1] == want, "clone content (C API)");
    CHECK(pread(kfd, page, PAGE, (off_t)i * PAGE) == PAGE, "pread through the mount");
    CHECK(page[0] == want && page[PAGE - 1] == want, "clone content (mount)");
  }
  close(kfd);
  CHECK(ferrite_pread(f, a, page, PAGE, 5 * PAGE) == PAGE && page[0] == '!',
        "the source has its own write");
  CHECK(ferrite_close(f, a) == 0 && ferrite_close(f, b) == 0, "ferrite_close");
  CHECK(ferrite_unlink(f, src) == 0 && ferrite_unlink(f, dst) == 0, "ferrite_unlink");
  CHECK(ferrite_release(f) == 0, "ferrite_release");
  printf("reflink: ok\n");
  return 0;
}
