/* Direct access to a mounted pool through the C API.
 *
 * FERRITE_MOUNT names a FerriteFS mount (`ferrite mount POOL DIR`). The program
 * attaches to its daemon, then writes, reads and renames files: names go through
 * the mount, data goes straight to the pool through this process's mapping. It
 * checks every result, including that a plain read through the mount sees what it
 * wrote, and exits 0 only when all of it worked.
 *
 *   cc direct_client.c $(pkg-config --cflags --libs ferrite) -o direct_client
 *   FERRITE_MOUNT=/mnt/ferrite ./direct_client
 */
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include <ferrite.h>

#include "common.h"

int main(void) {
  const char *mount = need_env("FERRITE_MOUNT");
  char dir[64], path[96], moved[96], plain[512];
  snprintf(dir, sizeof dir, "/direct-client-%d", (int)getpid());
  snprintf(path, sizeof path, "%s/data.bin", dir);
  snprintf(moved, sizeof moved, "%s/moved.bin", dir);

  struct ferrite *f = ferrite_attach(mount);
  CHECK(f != NULL, "ferrite_attach");
  CHECK(ferrite_mkdir(f, dir, 0755) == 0, "ferrite_mkdir");

  int fd = ferrite_open(f, path, O_CREAT | O_RDWR | O_EXCL, 0644);
  CHECK(fd >= 0, "ferrite_open");
  const char hello[] = "hello, persistent memory";
  CHECK(ferrite_write(f, fd, hello, sizeof hello) == (ptrdiff_t)sizeof hello, "ferrite_write");
  char page[4096];
  memset(page, 'p', sizeof page);
  CHECK(ferrite_pwrite(f, fd, page, sizeof page, 8192) == (ptrdiff_t)sizeof page, "ferrite_pwrite");
  CHECK(ferrite_fsync(f, fd) == 0, "ferrite_fsync");

  struct ferrite_stat st;
  CHECK(ferrite_fstat(f, fd, &st) == 0, "ferrite_fstat");
  CHECK(st.size == 8192 + sizeof page, "size after the writes");

  char back[sizeof hello];
  CHECK(ferrite_pread(f, fd, back, sizeof back, 0) == (ptrdiff_t)sizeof back, "ferrite_pread");
  CHECK(memcmp(back, hello, sizeof hello) == 0, "data read back");
  CHECK(ferrite_lseek(f, fd, 8192, SEEK_SET) == 8192, "ferrite_lseek");
  CHECK(ferrite_read(f, fd, back, 4) == 4 && memcmp(back, "pppp", 4) == 0, "ferrite_read");

  /* A plain process (here: plain POSIX calls of this one) sees the data at once. */
  snprintf(plain, sizeof plain, "%s%s", mount, path);
  int pfd = open(plain, O_RDONLY);
  CHECK(pfd >= 0, "open through the mount");
  CHECK(pread(pfd, back, sizeof back, 0) == (ssize_t)sizeof back, "pread through the mount");
  CHECK(memcmp(back, hello, sizeof hello) == 0, "the mount sees the direct write");
  close(pfd);

  int found = 0;
  CHECK(ferrite_readdir(f, dir, count_entry, &found) == 0 && found == 1, "ferrite_readdir");
  CHECK(ferrite_close(f, fd) == 0, "ferrite_close");
  CHECK(ferrite_rename(f, path, moved) == 0, "ferrite_rename");
  CHECK(ferrite_stat(f, moved, &st) == 0 && st.size == 8192 + sizeof page, "ferrite_stat");
  CHECK(ferrite_unlink(f, moved) == 0, "ferrite_unlink");
  CHECK(ferrite_rmdir(f, dir) == 0, "ferrite_rmdir");
  CHECK(ferrite_stat(f, moved, &st) == -1 && errno == ENOENT, "removed");
  CHECK(ferrite_release(f) == 0, "ferrite_release");
  printf("direct client: ok (libferrite %s)\n", ferrite_version());
  return 0;
}
