/* Persistent user buffers (Libpubl's idea, zero-copy) through the C API.
 *
 * FERRITE_MOUNT names a FerriteFS mount (`ferrite mount POOL DIR`). The program
 * gets a buffer that is pool memory, fills it with its own stores, and writes it
 * into a file: the buffer's whole pages become the file's without a copy, and the
 * buffer is ready for the next fill at once. It checks what a plain read through
 * the mount sees, and exits 0 only when all of it worked.
 *
 *   cc pbuf_write.c $(pkg-config --cflags --libs ferrite) -o pbuf_write
 *   FERRITE_MOUNT=/mnt/ferrite ./pbuf_write
 */
#include <fcntl.h>
#include <stdint.h>
#include <unistd.h>

#include <ferrite.h>

#include "common.h"

enum { SIZE = 65536 };

static void fill(char *b, char c) {
  for (int i = 0; i < SIZE; i++) b[i] = (char)(c + i % 7);
}

static int same(const char *plain, off_t off, char c) {
  static char back[SIZE];
  int fd = open(plain, O_RDONLY);
  CHECK(fd >= 0, "open through the mount");
  CHECK(pread(fd, back, SIZE, off) == SIZE, "pread through the mount");
  close(fd);
  for (int i = 0; i < SIZE; i++)
    if (back[i] != (char)(c + i % 7)) return 0;
  return 1;
}

int main(void) {
  const char *mount = need_env("FERRITE_MOUNT");
  char path[64], plain[512];
  snprintf(path, sizeof path, "/pbuf-%d.dat", (int)getpid());
  snprintf(plain, sizeof plain, "%s%s", mount, path);

  struct ferrite *f = ferrite_attach(mount);
  CHECK(f != NULL, "ferrite_attach");
  int fd = ferrite_open(f, path, O_CREAT | O_RDWR | O_EXCL, 0644);
  CHECK(fd >= 0, "ferrite_open");
  char *buf = ferrite_buf_alloc(f, SIZE);
  CHECK(buf != NULL, "ferrite_buf_alloc");

  /* Fill, write by reference (page-aligned: every page adopted), fill again. */
  fill(buf, 'a');
  CHECK(ferrite_buf_write(f, fd, buf, SIZE, 0) == SIZE, "ferrite_buf_write");
  fill(buf, 'k');
  CHECK(ferrite_buf_write(f, fd, buf, SIZE, SIZE) == SIZE, "ferrite_buf_write (reused)");
  CHECK(same(plain, 0, 'a'), "the first write, untouched by the refill");
  CHECK(same(plain, SIZE, 'k'), "the second write");
  /* After a write the buffer's adopted pages are fresh memory (their content is
   * undefined): fill it again. An offset that does not line up with the buffer's
   * pages is copied. */
  fill(buf, 'u');
  CHECK(ferrite_buf_write(f, fd, buf, SIZE, 2 * SIZE + 100) == SIZE, "ferrite_buf_write (copied)");
  CHECK(same(plain, 2 * SIZE + 100, 'u'), "the copied write");

  char other[16];
  CHECK(ferrite_buf_write(f, fd, other, sizeof other, 0) == -1 && errno == EINVAL,
        "memory that is not a buffer is refused");
  CHECK(ferrite_buf_free(f, buf) == 0, "ferrite_buf_free");
  CHECK(ferrite_close(f, fd) == 0, "ferrite_close");
  CHECK(ferrite_unlink(f, path) == 0, "ferrite_unlink");
  CHECK(ferrite_release(f) == 0, "ferrite_release");
  printf("pbuf write: ok\n");
  return 0;
}
