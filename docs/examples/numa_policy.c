/* NUMA placement through the C API, on a pool of the process's own: FERRITE_POOL
 * names the pool file (created with 64 MiB if it does not exist). The program
 * pins a file's new data to memory node 1 and writes 256 KiB to it; a node this
 * machine does not have is refused. On a one-node machine, run it with
 * FERRITE_NUMA_NODES=2 (a simulated topology), then see where the data went:
 *
 *   cc numa_policy.c $(pkg-config --cflags --libs ferrite) -o numa_policy
 *   FERRITE_NUMA_NODES=2 FERRITE_POOL=/dev/shm/mine.pool ./numa_policy
 *   FERRITE_NUMA_NODES=2 ferrite bmap --pool /dev/shm/mine.pool /placed
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
  int fd = ferrite_open(f, "/placed", O_CREAT | O_RDWR | O_TRUNC, 0644);
  CHECK(fd >= 0, "ferrite_open");
  CHECK(ferrite_set_numa_node(f, fd, 1) == 0, "ferrite_set_numa_node(1)");
  CHECK(ferrite_set_numa_node(f, fd, 64) == -1 && errno == EINVAL, "no node 64");
  static char data[256 * 1024];
  memset(data, 'n', sizeof data);
  CHECK(ferrite_pwrite(f, fd, data, sizeof data, 0) == (ptrdiff_t)sizeof data, "ferrite_pwrite");
  CHECK(ferrite_close(f, fd) == 0, "ferrite_close");
  CHECK(ferrite_release(f) == 0, "ferrite_release");
  printf("numa policy: ok\n");
  return 0;
}
