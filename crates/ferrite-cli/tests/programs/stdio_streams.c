/* C library streams (FILE) on files of one directory: fopen modes, fdopen, seeks,
 * reads after writes, fork with buffered data, exit without fclose, freopen, and
 * writes from an atexit handler, dprintf, and a descriptor passed to another
 * process.
 * Prints a transcript that must be the same on tmpfs, on the mount, and on the
 * mount under the preload library (tests/direct_stdio.rs). Usage: stdio_streams DIR */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <pthread.h>
#include <wchar.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *dir;
static char *at(const char *name) {
    static char buf[4][4096];
    static int i;
    char *b = buf[i++ % 4];
    snprintf(b, 4096, "%s/%s", dir, name);
    return b;
}

static uint32_t sum(const char *name) {
    FILE *f = fopen(at(name), "r");
    if (!f) return 0;
    uint32_t h = 2166136261u;
    int c;
    while ((c = fgetc(f)) != EOF) h = (h ^ (uint32_t)c) * 16777619u;
    fclose(f);
    return h;
}

static long size_of(const char *name) {
    struct stat st;
    return stat(at(name), &st) == 0 ? (long)st.st_size : -errno;
}

/* An atexit handler's writes: a descriptor's last line and a stream's, neither
 * flushed nor closed before exit (both opened after the last fork, so the
 * descriptions stay private to the process). */
static int exit_fd = -1;
static FILE *exit_stream;
static void at_end(void) {
    if (exit_fd >= 0) write(exit_fd, "END\n", 4);
    if (exit_stream) fputs("the stream's last line\n", exit_stream);
}

#define SAY(...) do { printf(__VA_ARGS__); fflush(stdout); } while (0)

/* `exit-writer FILE`: a thread writes numbered records to FILE while main
 * returns; every record that was written must stand where it was written. */
static int records_fd;
static void *write_records(void *arg) {
    (void)arg;
    char rec[32];
    for (long i = 0;; i++) {
        int n = snprintf(rec, sizeof rec, "%015ld\n", i);
        if (write(records_fd, rec, n) != n) return NULL;
    }
}

static void *write_one(void *arg) {
    (void)arg;
    write(records_fd, "record\n", 7);
    return NULL;
}

/* The standard streams (run with them redirected to files): `print N` prints N
 * lines on stdout with some on stderr between; `head N` copies N lines of stdin;
 * `wide` prints with the wide-character functions. And `temp DIR`: files made by
 * mkstemp and its relatives. */
static int standard(int argc, char **argv) {
    if (!strcmp(argv[1], "print") && argc == 3) {
        int n = atoi(argv[2]);
        for (int i = 0; i < n; i++) {
            printf("line %d of stdout\n", i);
            if (i % 10000 == 0) {
                fprintf(stderr, "stderr at %d\n", i);
                errno = ENOENT;
                perror("perror");
            }
        }
        puts("puts");
        putchar('!');
        fflush(stdout);
        write(1, "\nraw write\n", 11);
        printf("after the raw write, tell %ld\n", ftell(stdout));
        return 0;
    }
    if (!strcmp(argv[1], "head") && argc == 3) {
        /* Reads N lines of stdin, copies them, then puts the descriptor's offset
         * where it stopped reading (fflush of an input stream), for the next
         * program that reads the same description. */
        char line[256];
        for (int i = atoi(argv[2]); i > 0 && fgets(line, sizeof line, stdin); i--)
            fputs(line, stdout);
        fflush(stdin);
        printf("stdin at %ld, descriptor at %ld\n", ftell(stdin), (long)lseek(0, 0, SEEK_CUR));
        return 0;
    }
    if (!strcmp(argv[1], "threads") && argc == 4) {
        /* N threads one after another, each writing one record (the preload's
         * per-thread counters of finished threads are folded, not kept). */
        records_fd = open(argv[3], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        for (int i = atoi(argv[2]); i > 0; i--) {
            pthread_t t;
            pthread_create(&t, NULL, write_one, NULL);
            pthread_join(t, NULL);
        }
        return 0;
    }
    if (!strcmp(argv[1], "exit-writer") && argc == 3) {
        records_fd = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
        pthread_t t;
        pthread_create(&t, NULL, write_records, NULL);
        usleep(200000);
        return 0;
    }
    if (!strcmp(argv[1], "temp") && argc == 3) {
        /* mkstemp and its relatives in directory argv[2]. */
        dir = argv[2];
        char t[4096], t2[4096], bad[4096];
        snprintf(t, sizeof t, "%s/tmpXXXXXX", dir);
        int fd = mkstemp(t);
        struct stat st;
        fstat(fd, &st);
        printf("mkstemp: %d, name made %d, mode %o\n", fd >= 0,
               strcmp(t + strlen(t) - 6, "XXXXXX") != 0, st.st_mode & 0777);
        for (int i = 0; i < 300; i++) write(fd, "0123456789abcdef", 16);
        FILE *f = fdopen(fd, "w");
        for (int i = 0; i < 3000; i++) fprintf(f, "%d;", i);
        fclose(f);
        printf("rename: %d\n", rename(t, at("temp_renamed")));
        snprintf(t2, sizeof t2, "%s/tmpXXXXXX.suf", dir);
        fd = mkostemps(t2, 4, O_APPEND | O_CLOEXEC);
        printf("mkostemps: %d, suffix kept %d, append %d, cloexec %d\n", fd >= 0,
               strcmp(t2 + strlen(t2) - 4, ".suf") == 0, (fcntl(fd, F_GETFL) & O_APPEND) != 0,
               (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
        close(fd);
        unlink(t2);
        snprintf(bad, sizeof bad, "%s/tmpXXXXX", dir);
        errno = 0;
        fd = mkstemp(bad);
        int e = errno;
        printf("five X: %d errno %d\n", fd, e);
        return 0;
    }
    if (!strcmp(argv[1], "wide") && argc == 2) {
        setlocale(LC_ALL, "C.UTF-8");
        for (int i = 0; i < 3000; i++) wprintf(L"wide %d %ls\n", i, L"t\u00e9xt");
        fwprintf(stderr, L"wide on stderr %ls\n", L"\u00e9");
        return 0;
    }
    return 2;
}

int main(int argc, char **argv) {
    if (argc >= 3 || (argc == 2 && !strcmp(argv[1], "wide"))) return standard(argc, argv);
    if (argc != 2) return 2;
    dir = argv[1];
    char line[256];
    atexit(at_end);
    size_t got;

    /* "w": formatted lines, positions, close; "r": read them back. */
    FILE *f = fopen(at("lines"), "w");
    for (int i = 0; i < 20000; i++) fprintf(f, "line %d of the file\n", i);
    SAY("w: tell %ld\n", ftell(f));
    SAY("w: fclose %d\n", fclose(f));
    f = fopen(at("lines"), "r");
    long n = 0, bytes = 0;
    while (fgets(line, sizeof line, f)) n++, bytes += (long)strlen(line);
    SAY("r: %ld lines %ld bytes eof %d error %d\n", n, bytes, feof(f), ferror(f));
    SAY("r: fgetc after eof %d\n", fgetc(f));
    rewind(f);
    char *gl = NULL;
    size_t cap = 0;
    ssize_t k = getline(&gl, &cap, f);
    SAY("r: getline %zd '%.*s'\n", k, (int)(k > 0 ? k - 1 : 0), gl);
    free(gl);
    SAY("r: ungetc %c, then %c\n", ungetc('Z', f), fgetc(f));
    got = fwrite("x", 1, 1, f);
    SAY("r: fwrite on a read stream %zu error %d\n", got, ferror(f));
    fclose(f);
    SAY("sizes: lines %ld sum %08x\n", size_of("lines"), sum("lines"));

    /* "a": starts at the end; writes append. */
    f = fopen(at("lines"), "a");
    SAY("a: tell at open %ld\n", ftell(f));
    fputs("appended\n", f);
    SAY("a: tell %ld\n", ftell(f));
    fclose(f);
    SAY("a: size %ld sum %08x\n", size_of("lines"), sum("lines"));

    /* "r+": overwrite in the middle, read what follows without closing. */
    f = fopen(at("lines"), "r+");
    fseek(f, 1000, SEEK_SET);
    fputs("OVERWRITTEN", f);
    fseek(f, 995, SEEK_SET);
    got = fread(line, 1, 30, f);
    SAY("r+: read %zu '%.30s'\n", got, line);
    fseek(f, 0, SEEK_END);
    SAY("r+: end %ld\n", ftell(f));
    fflush(f);
    struct stat st;
    fstat(fileno(f), &st);
    SAY("r+: fileno's size %ld\n", (long)st.st_size);
    fclose(f);

    /* "w+": write, rewind, read back; seek past the end makes a hole. */
    f = fopen(at("wplus"), "w+");
    for (int i = 0; i < 3000; i++) fprintf(f, "%05d|", i);
    rewind(f);
    got = fread(line, 1, 18, f);
    SAY("w+: read %zu '%.18s'\n", got, line);
    fseek(f, 100000, SEEK_SET);
    fputs("past the end", f);
    fseek(f, 50000, SEEK_SET);
    int zeros = 0;
    for (int i = 0; i < 100; i++) zeros += fgetc(f) == 0;
    SAY("w+: zeros in the hole %d\n", zeros);
    fclose(f);
    SAY("w+: size %ld sum %08x\n", size_of("wplus"), sum("wplus"));

    /* "a+": reads from anywhere, writes at the end. */
    f = fopen(at("wplus"), "a+");
    got = fread(line, 1, 6, f);
    SAY("a+: read at open %zu '%.6s'\n", got, line);
    fputs("tail", f);
    fseek(f, -4, SEEK_END);
    got = fread(line, 1, 4, f);
    fflush(f);
    SAY("a+: last %zu '%.4s' size %ld\n", got, line, size_of("wplus"));
    fclose(f);

    /* Unbuffered: every fputc is a write. */
    f = fopen(at("unbuf"), "w");
    setvbuf(f, NULL, _IONBF, 0);
    for (int i = 0; i < 500; i++) fputc('a' + i % 26, f);
    SAY("unbuffered: size before fclose %ld\n", size_of("unbuf"));
    fclose(f);

    /* Large blocks pass the buffer. */
    char *big = malloc(1 << 20);
    for (int i = 0; i < 1 << 20; i++) big[i] = (char)(i * 7 + i / 4096);
    f = fopen(at("big"), "w");
    for (int r = 0; r < 4; r++) fwrite(big, 1, 1 << 20, f);
    fwrite(big, 1, 777, f);
    fclose(f);
    f = fopen(at("big"), "r");
    fseek(f, (3 << 20) + 12345, SEEK_SET);
    got = fread(big, 1, 1 << 20, f);
    SAY("big: size %ld sum %08x read %zu eof %d\n", size_of("big"), sum("big"), got, feof(f));
    fclose(f);
    free(big);

    /* Errors: exclusive create of an existing name, a missing file, a bad mode. */
    const char *tries[][2] = {{"lines", "wx"}, {"nope", "r"}, {"lines", "q"}, {"nope/x", "w"}};
    for (int i = 0; i < 4; i++) {
        errno = 0;
        FILE *g = fopen(at(tries[i][0]), tries[i][1]);
        int e = errno;
        SAY("fopen %s %s: %s errno %d\n", tries[i][0], tries[i][1], g ? "opened" : "null", e);
    }
    f = fopen(at("fresh"), "wx");
    SAY("wx fresh: %s\n", f ? "opened" : "null");
    if (f) fclose(f);

    /* fdopen: mode against the descriptor's access; "a" adds O_APPEND. */
    int fd = open(at("lines"), O_RDONLY);
    errno = 0;
    f = fdopen(fd, "w");
    int e = errno;
    SAY("fdopen w on O_RDONLY: %s errno %d\n", f ? "opened" : "null", e);
    f = fdopen(fd, "r");
    got = fread(line, 1, 10, f);
    SAY("fdopen r: %zu '%.10s' fileno same %d\n", got, line, fileno(f) == fd);
    fclose(f);
    int r = fcntl(fd, F_GETFD);
    e = errno;
    SAY("fdopen r: fd closed %d\n", r == -1 && e == EBADF);
    fd = open(at("fd_a"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    write(fd, "0123456789", 10);
    lseek(fd, 2, SEEK_SET);
    f = fdopen(fd, "a");
    SAY("fdopen a: O_APPEND %d tell %ld\n", (fcntl(fd, F_GETFL) & O_APPEND) != 0, ftell(f));
    fputs("end", f);
    fclose(f);
    SAY("fdopen a: size %ld sum %08x\n", size_of("fd_a"), sum("fd_a"));
    fd = open(at("fd_plus"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    write(fd, "abcdef", 6);
    f = fdopen(fd, "r+");
    SAY("fdopen r+: tell %ld\n", ftell(f));
    fputs("GH", f);
    fflush(f);
    SAY("fdopen r+: descriptor at %ld\n", (long)lseek(fd, 0, SEEK_CUR));
    rewind(f);
    got = fread(line, 1, 8, f);
    SAY("fdopen r+: %zu '%.8s'\n", got, line);
    fclose(f);

    /* fork with buffered data: both flush it (the C library's rule), at the
     * offset they share. */
    f = fopen(at("forked"), "w");
    fputs("before|", f);
    pid_t pid = fork();
    if (pid == 0) {
        fputs("child|", f);
        exit(0); /* flushes "before|child|" */
    }
    int status;
    waitpid(pid, &status, 0);
    fputs("parent|", f);
    fclose(f);
    SAY("fork: child %d size %ld sum %08x\n", WEXITSTATUS(status), size_of("forked"),
        sum("forked"));

    /* exit without fclose writes the buffers; _exit drops them (the grandchild's
     * copies: written twice otherwise). */
    pid = fork();
    if (pid == 0) {
        FILE *g = fopen(at("at_exit"), "w");
        for (int i = 0; i < 1000; i++) fprintf(g, "%d,", i);
        FILE *h = fopen(at("at_underscore_exit"), "w");
        fputs("once", h);
        if (fork() == 0) _exit(0); /* its copy of both buffers goes nowhere */
        wait(NULL);
        exit(0);
    }
    waitpid(pid, &status, 0);
    SAY("exit: %d sizes %ld %ld sum %08x\n", WEXITSTATUS(status), size_of("at_exit"),
        size_of("at_underscore_exit"), sum("at_exit"));

    /* freopen of a stream to another file. */
    f = fopen(at("reopen_a"), "w");
    fputs("first file", f);
    f = freopen(at("reopen_b"), "w", f);
    fputs("second file", f);
    fclose(f);
    SAY("freopen: a %ld b %ld\n", size_of("reopen_a"), size_of("reopen_b"));

    /* A stream and the descriptor under it, used in turns. */
    f = fopen(at("mixed"), "w+");
    fputs("stream", f);
    fflush(f);
    write(fileno(f), "+fd", 3);
    fputs("+stream", f);
    fflush(f);
    ftruncate(fileno(f), 12);
    fseek(f, 0, SEEK_END);
    long end = ftell(f);
    SAY("mixed: end %ld sum %08x\n", end, sum("mixed"));
    fclose(f);

    /* dprintf on a descriptor written with write(2) (more integer and floating
     * arguments than registers carry, and a text longer than a stream buffer). */
    fd = open(at("dprintf"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    write(fd, "first line\n", 11);
    int n1 = dprintf(fd, "%d %s %.3f %d %d %d %d %d %.2f %.2f %.2f %.2f %.2f %.2f %.2f %.2f %.2f %c\n",
                     1, "two", 3.0, 4, 5, 6, 7, 8, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0,
                     17.5, 'z');
    char *longer = malloc(10001);
    memset(longer, 'y', 10000);
    longer[10000] = 0;
    int n2 = dprintf(fd, "%s|%ld\n", longer, 1234567890123L);
    free(longer);
    write(fd, "third\n", 6);
    close(fd);
    SAY("dprintf: %d %d size %ld sum %08x\n", n1, n2, size_of("dprintf"), sum("dprintf"));

    /* A descriptor passed to another process (SCM_RIGHTS) after this one wrote
     * it: the receiver writes on where the sender stopped. */
    int sv[2];
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    char ctl[CMSG_SPACE(sizeof(int))], one = 'x';
    struct iovec io = {&one, 1};
    struct msghdr msg = {0};
    msg.msg_iov = &io;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = sizeof ctl;
    pid = fork();
    if (pid == 0) {
        recvmsg(sv[1], &msg, 0);
        int passed;
        memcpy(&passed, CMSG_DATA(CMSG_FIRSTHDR(&msg)), sizeof passed);
        write(passed, "|the receiver's", 15);
        _exit(0);
    }
    fd = open(at("passed"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    write(fd, "the sender's", 12);
    struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    sendmsg(sv[0], &msg, 0);
    waitpid(pid, NULL, 0);
    write(fd, "|the sender's again", 19);
    close(fd);
    SAY("passed: size %ld sum %08x\n", size_of("passed"), sum("passed"));

    exit_fd = open(at("atexit_fd"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    for (int i = 0; i < 10; i++) write(exit_fd, "0123456789\n", 11);
    exit_stream = fopen(at("atexit_stream"), "w");
    for (int i = 0; i < 3000; i++) fprintf(exit_stream, "%d,", i);
    return 0;
}
