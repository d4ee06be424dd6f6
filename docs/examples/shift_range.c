/* Collapse and insert ranges of a file (fallocate's FALLOC_FL_COLLAPSE_RANGE and
 * FALLOC_FL_INSERT_RANGE), which the kernel's FUSE client refuses but a direct
 * client gets from the core: the pages after the range move by reference, in one
 * atomic commit, with no data copied.
 *
 * FERRITE_MOUNT names a FerriteFS mount. The program writes pages 'a'..'h',
 * collapses pages 2-3, inserts a hole at page 1, checks every page through the
 * C API and through the mount, and exits 0 only when all of it worked.
 *
 *   cc shift_range.c $(pkg-config --cflags --libs ferrite) -o shift_range
 *   FERRITE_MOUNT=/mnt/ferrite ./shift_range
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdint.h>
#include <unistd.h>

#include <ferrite.h>

#include "common.h"

#define PAGE 4096

int main(void) {
  const char *mount = need_env("FERRITE_MOUNT");
  char path[64], plain[512];
  snprintf(path, sizeof path, "/shift-%d.bin", (int)getpid());
  snprintf(plain, sizeof plain, "%s%s", mount, path);

  struct ferrite *f = ferrite_attach(mount);
  CHECK(f != NULL, "ferrite_attach");
  int fd = ferrite_open(f, path, O_CREAT | O_RDWR | O_EXCL, 0644);
  CHECK(fd >= 0, "ferrite_open");
  char page[PAGE];
  for (int i = 0; i < 8; i++) {
    memset(page, 'a' + i, PAGE);
    CHECK(ferrite_pwrite(f, fd, page, PAGE, (int64_t)i * PAGE) == PAGE, "ferrite_pwrite");
  }
  /* Unaligned ranges and a collapse reaching EOF are refused, as on ext4. */
  CHECK(ferrite_fallocate(f, fd, FALLOC_FL_COLLAPSE_RANGE, 100, PAGE) == -1 && errno == EINVAL,
        "unaligned collapse refused");
  CHECK(ferrite_fallocate(f, fd, FALLOC_FL_COLLAPSE_RANGE, PAGE, 7 * PAGE) == -1 &&
            errno == EINVAL,
        "collapse to EOF refused");
  /* a b c d e f g h -> a b e f g h -> a _ b e f g h */
  CHECK(ferrite_fallocate(f, fd, FALLOC_FL_COLLAPSE_RANGE, 2 * PAGE, 2 * PAGE) == 0,
        "collapse");
  CHECK(ferrite_fallocate(f, fd, FALLOC_FL_INSERT_RANGE, PAGE, PAGE) == 0, "insert");
  const char want[] = "a\0befgh";
  struct ferrite_stat st;
  CHECK(ferrite_fstat(f, fd, &st) == 0 && st.size == 7 * PAGE, "size after the shifts");
  int kfd = open(plain, O_RDONLY);
  CHECK(kfd >= 0, "open through the mount");
  for (int i = 0; i < 7; i++) {
    CHECK(ferrite_pread(f, fd, page, PAGE, (int64_t)i * PAGE) == PAGE, "ferrite_pread");
    CHECK(page[0] == want[i] && page[PAGE - 1] == want[i], "page content (C API)");
    CHECK(pread(kfd, page, PAGE, (off_t)i * PAGE) == PAGE, "pread through the mount");
    CHECK(page[0] == want[i] && page[PAGE - 1] == want[i], "page content (mount)");
  }
  close(kfd);
  CHECK(ferrite_close(f, fd) == 0, "ferrite_close");
  CHECK(ferrite_unlink(f, path) == 0, "ferrite_unlink");
  CHECK(ferrite_release(f) == 0, "ferrite_release");
  printf("shift range: ok\n");
  return 0;
}
