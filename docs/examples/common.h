/* Helpers shared by the examples: fail loudly with the call and errno. */
#ifndef FERRITE_EXAMPLE_COMMON_H
#define FERRITE_EXAMPLE_COMMON_H
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond, what)                                                        \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, (what),      \
              strerror(errno));                                                  \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

static const char *need_env(const char *name) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') {
    fprintf(stderr, "set %s\n", name);
    exit(2);
  }
  return v;
}

static inline int count_entry(void *ctx, const char *name, uint64_t ino, uint8_t type) {
  (void)ino;
  (void)type;
  if (strcmp(name, "data.bin") == 0) {
    ++*(int *)ctx;
  }
  return 0;
}
#endif
