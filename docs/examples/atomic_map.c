/* An atomic mapping (NOVA's atomic-mmap) through the C API, on a pool of the
 * process's own: FERRITE_POOL names the pool file, created with 64 MiB if it does
 * not exist. The program keeps two 4 KiB records of an account file in one
 * mapping, moves an amount from one to the other with plain stores, and commits
 * both pages with one ferrite_persist: after a crash the file shows both records
 * before the transfer or both after, never one without the other. It checks that
 * nothing reaches the file before the commit and everything after it, and exits 0
 * only when all of it worked.
 *
 *   cc atomic_map.c $(pkg-config --cflags --libs ferrite) -o atomic_map
 *   FERRITE_POOL=/dev/shm/mine.pool ./atomic_map
 */
#include <fcntl.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ferrite.h>

#include "common.h"

enum { PAGE = 4096, PAGES = 8 };

struct account {
  char name[16];
  int64_t balance;
};

int main(void) {
  const char *pool = need_env("FERRITE_POOL");
  struct ferrite *f = ferrite_open_pool(pool, 64u << 20);
  CHECK(f != NULL, "ferrite_open_pool");
  int fd = ferrite_open(f, "/accounts", O_CREAT | O_RDWR | O_TRUNC, 0600);
  CHECK(fd >= 0, "ferrite_open");
  static char init[PAGES * PAGE];
  struct account a = {"alice", 100}, b = {"bob", 0};
  memcpy(init, &a, sizeof a);
  memcpy(init + 5 * PAGE, &b, sizeof b);
  CHECK(ferrite_pwrite(f, fd, init, sizeof init, 0) == (ptrdiff_t)sizeof init, "ferrite_pwrite");

  char *m = ferrite_mmap_atomic(f, fd, sizeof init, PROT_READ | PROT_WRITE, 0);
  CHECK(m != NULL, "ferrite_mmap_atomic");
  struct account *alice = (struct account *)m, *bob = (struct account *)(m + 5 * PAGE);
  alice->balance -= 30;
  bob->balance += 30;
  struct account back;
  CHECK(ferrite_pread(f, fd, &back, sizeof back, 5 * PAGE) == (ptrdiff_t)sizeof back, "pread");
  CHECK(back.balance == 0, "nothing reaches the file before the commit");
  CHECK(ferrite_persist(f, m, sizeof init) == 0, "ferrite_persist (the atomic commit)");
  CHECK(ferrite_pread(f, fd, &back, sizeof back, 0) == (ptrdiff_t)sizeof back, "pread");
  CHECK(back.balance == 70, "alice after the commit");
  CHECK(ferrite_pread(f, fd, &back, sizeof back, 5 * PAGE) == (ptrdiff_t)sizeof back, "pread");
  CHECK(back.balance == 30, "bob after the commit");

  CHECK(ferrite_munmap(f, m, PAGE) == -1 && errno == EINVAL, "no partial unmap");
  CHECK(ferrite_munmap(f, m, sizeof init) == 0, "ferrite_munmap");
  CHECK(ferrite_close(f, fd) == 0, "ferrite_close");
  CHECK(ferrite_unlink(f, "/accounts") == 0, "ferrite_unlink");
  CHECK(ferrite_release(f) == 0, "ferrite_release");
  printf("atomic map: ok\n");
  return 0;
}
