/* A pool opened by the process alone, with no daemon and no mount (containers
 * without /dev/fuse): FERRITE_POOL names the pool file, created with 64 MiB if it
 * does not exist. The program writes a file, closes the pool, opens it again and
 * checks the file is there; it exits 0 only when all of it worked.
 *
 *   cc own_pool.c $(pkg-config --cflags --libs ferrite) -o own_pool
 *   FERRITE_POOL=/dev/shm/mine.pool ./own_pool
 */
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include <ferrite.h>

#include "common.h"

int main(void) {
  const char *pool = need_env("FERRITE_POOL");
  struct ferrite *f = ferrite_open_pool(pool, 64u << 20);
  CHECK(f != NULL, "ferrite_open_pool");
  /* A second handle on a pool in use is refused. */
  CHECK(ferrite_open_pool(pool, 0) == NULL && errno == EBUSY, "second open refused");

  CHECK(ferrite_mkdir(f, "/own", 0755) == 0 || errno == EEXIST, "ferrite_mkdir");
  int fd = ferrite_open(f, "/own/data.bin", O_CREAT | O_WRONLY | O_TRUNC, 0600);
  CHECK(fd >= 0, "ferrite_open");
  char rec[100];
  for (int i = 0; i < 1000; i++) {
    memset(rec, 'a' + i % 26, sizeof rec);
    CHECK(ferrite_write(f, fd, rec, sizeof rec) == (ptrdiff_t)sizeof rec, "ferrite_write");
  }
  CHECK(ferrite_close(f, fd) == 0, "ferrite_close");
  CHECK(ferrite_release(f) == 0, "ferrite_release");

  f = ferrite_open_pool(pool, 0);
  CHECK(f != NULL, "ferrite_open_pool again");
  struct ferrite_stat st;
  CHECK(ferrite_stat(f, "/own/data.bin", &st) == 0 && st.size == 100000, "size after reopen");
  fd = ferrite_open(f, "/own/data.bin", O_RDONLY, 0);
  CHECK(fd >= 0, "ferrite_open for reading");
  CHECK(ferrite_pread(f, fd, rec, sizeof rec, 999 * 100) == (ptrdiff_t)sizeof rec, "ferrite_pread");
  CHECK(rec[0] == 'a' + 999 % 26 && rec[99] == rec[0], "last record");
  int found = 0;
  CHECK(ferrite_readdir(f, "/own", count_entry, &found) == 0 && found == 1, "ferrite_readdir");
  CHECK(ferrite_close(f, fd) == 0, "ferrite_close");
  CHECK(ferrite_unlink(f, "/own/data.bin") == 0 && ferrite_rmdir(f, "/own") == 0, "cleanup");
  CHECK(ferrite_release(f) == 0, "ferrite_release");
  printf("own pool: ok\n");
  return 0;
}
