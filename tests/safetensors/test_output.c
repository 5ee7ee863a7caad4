/*
 * test_output.c - where the safetensors writer puts its bytes
 * (runtime/output.c): a FIFO, "-" on a pipe and /dev/null are streamed to
 * and keep what they are, with the same bytes as a regular file; a symbolic
 * link's target is written and the link kept (a chain of relative links
 * too); a directory, a link to one, a socket and a dangling link into a
 * missing directory are refused with the path and the reason; a FIFO that
 * appears at the path while the temporary is written is not renamed over;
 * w16_output_cleanup() removes live temporaries (beyond the registry's
 * capacity too: those are only left, never lost track of by their writer);
 * stale temporaries of dead processes are removed with one message each,
 * everything else of a similar name is kept.
 */
#define _XOPEN_SOURCE 700 /* mknod: to put /dev/null back */
#include "st_test.h"
#include "runtime/output.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

/* 2 tensors, 160 kB: more than a pipe holds, so streaming needs a reader. */
#define OT_N 40960
static float ot_a[OT_N], ot_b[OT_N];

static wna16_status_t write_small(wna16_context_t *ctx, const char *path,
                                  wna16_error_t *err)
{
    wna16_tensor_set_t *set = NULL;
    wna16_tensor_t a = {.name = "a", .dtype = WNA16_DTYPE_F32, .ndim = 1,
                        .shape = {OT_N}, .data = ot_a, .nbytes = sizeof ot_a};
    wna16_tensor_t b = a;
    b.name = "b";
    b.data = ot_b;
    wna16_status_t s = wna16_tensor_set_create(ctx, &set, err);
    if (s == WNA16_OK)
        s = wna16_tensor_set_add_view(set, &a, err);
    if (s == WNA16_OK)
        s = wna16_tensor_set_add_view(set, &b, err);
    if (s == WNA16_OK)
        s = wna16_safetensors_write_set(ctx, path, set, 0, NULL, NULL, err);
    wna16_tensor_set_destroy(set);
    return s;
}

/* Does the file at `path` hold the same bytes as `ref`? */
static bool same_bytes(const char *path, const char *ref)
{
    size_t n1 = 0, n2 = 0;
    void *p1 = tu_read_file(path, &n1), *p2 = tu_read_file(ref, &n2);
    bool same = p1 && p2 && n1 == n2 && memcmp(p1, p2, n1) == 0;
    free(p1);
    free(p2);
    return same;
}

/* Entries of `dir` named like a temporary. */
static int count_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    const struct dirent *e;
    while ((e = readdir(d)))
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

/* A child that copies everything it reads from `fd` (or opens `path` for
 * reading) into `copy`, then exits; it closes `other` (the pipe's write
 * end, or -1), or it would never see the end. */
static pid_t reader(int fd, int other, const char *path, const char *copy)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    if (other >= 0)
        close(other);
    if (path)
        fd = open(path, O_RDONLY);
    int out = open(copy, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char buf[65536];
    ssize_t n;
    while (fd >= 0 && out >= 0 && (n = read(fd, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            _exit(1);
    _exit(fd >= 0 && out >= 0 ? 0 : 1);
}

static bool reader_ok(pid_t pid)
{
    int status;
    return waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}

/* ---- streams --------------------------------------------------------------- */

static void test_fifo(wna16_context_t *ctx, const char *dir, const char *ref)
{
    wna16_error_t err;
    char *fifo = stt_path(dir, "f"), *copy = stt_path(dir, "copy");
    TU_CHECK(mkfifo(fifo, 0644) == 0);
    pid_t pid = reader(-1, -1, fifo, copy);
    TU_CHECK(pid > 0);
    TU_OK(write_small(ctx, fifo, &err), &err);
    struct stat st;
    bool fifo_kept = lstat(fifo, &st) == 0 && S_ISFIFO(st.st_mode);
    TU_CHECK_MSG(fifo_kept, "the FIFO was replaced");
    if (!fifo_kept && pid > 0)
        kill(pid, SIGKILL); /* it waits on the old FIFO for ever */
    TU_CHECK(reader_ok(pid));
    TU_CHECK_MSG(same_bytes(copy, ref), "the FIFO's reader got other bytes");
    TU_CHECK(count_tmp(dir) == 0);
    unlink(fifo);
    unlink(copy);
    free(fifo);
    free(copy);
}

static void test_stdout_pipe(wna16_context_t *ctx, const char *dir,
                             const char *ref)
{
    wna16_error_t err;
    char *copy = stt_path(dir, "copy");
    int p[2];
    TU_CHECK(pipe(p) == 0);
    pid_t pid = reader(p[0], p[1], NULL, copy);
    fflush(stdout);
    int saved = dup(STDOUT_FILENO);
    TU_CHECK(saved >= 0 && dup2(p[1], STDOUT_FILENO) == STDOUT_FILENO);
    close(p[0]);
    close(p[1]);
    wna16_status_t s = write_small(ctx, "-", &err);
    dup2(saved, STDOUT_FILENO); /* the pipe's last writer goes: EOF */
    close(saved);
    TU_OK(s, &err);
    TU_CHECK(reader_ok(pid));
    TU_CHECK_MSG(same_bytes(copy, ref), "stdout's reader got other bytes");
    TU_CHECK(!tu_exists("-"));
    unlink(copy);
    free(copy);
}

static void test_devnull(wna16_context_t *ctx)
{
    wna16_error_t err;
    TU_OK(write_small(ctx, "/dev/null", &err), &err);
    struct stat st;
    bool chr = lstat("/dev/null", &st) == 0 && S_ISCHR(st.st_mode);
    TU_CHECK_MSG(chr, "/dev/null is no longer a character device");
    if (!chr && getuid() == 0) { /* put it back */
        unlink("/dev/null");
        mknod("/dev/null", S_IFCHR | 0666, makedev(1, 3));
        chmod("/dev/null", 0666);
    }
    TU_CHECK(count_tmp("/dev") == 0);
}

/* ---- links ----------------------------------------------------------------- */

static void test_links(wna16_context_t *ctx, const char *dir, const char *ref)
{
    wna16_error_t err;
    char *target = stt_path(dir, "target.st"), *link = stt_path(dir, "link");
    char *sub = stt_path(dir, "sub"), *l2 = stt_path(dir, "sub/l2");
    char buf[64];
    /* dangling into an existing directory: the target is created */
    TU_CHECK(symlink("target.st", link) == 0);
    TU_OK(write_small(ctx, link, &err), &err);
    ssize_t n = readlink(link, buf, sizeof buf - 1);
    TU_CHECK(n == 9 && memcmp(buf, "target.st", 9) == 0);
    TU_CHECK(same_bytes(target, ref));
    /* a relative link in a subdirectory to that link: resolved from where
     * each link lives; the existing target is replaced */
    TU_CHECK(mkdir(sub, 0755) == 0 && symlink("../link", l2) == 0);
    TU_CHECK(tu_write_file(target, "old", 3) == 0);
    TU_OK(write_small(ctx, l2, &err), &err);
    struct stat st;
    TU_CHECK(lstat(l2, &st) == 0 && S_ISLNK(st.st_mode));
    TU_CHECK(lstat(link, &st) == 0 && S_ISLNK(st.st_mode));
    TU_CHECK(same_bytes(target, ref));
    TU_CHECK(count_tmp(dir) == 0 && count_tmp(sub) == 0);
    /* a dangling link into a missing directory */
    char *dang = stt_path(dir, "dang"), *nodir = stt_path(dir, "nodir");
    TU_CHECK(symlink("nodir/x.st", dang) == 0);
    STT_EXPECT_ERR(write_small(ctx, dang, &err), &err, WNA16_EIO,
                   "dang: a symbolic link to ");
    TU_CHECK(strstr(err.message, "nodir/x.st, whose directory ") &&
             strstr(err.message, "nodir does not exist"));
    TU_CHECK(!tu_exists(nodir) && count_tmp(dir) == 0);
    /* a loop */
    char *loop = stt_path(dir, "loop");
    TU_CHECK(symlink("loop", loop) == 0);
    STT_EXPECT_ERR(write_small(ctx, loop, &err), &err, WNA16_ELIMIT,
                   "symbolic links to follow");
    unlink(loop);
    unlink(dang);
    unlink(l2);
    rmdir(sub);
    unlink(link);
    unlink(target);
    free(loop);
    free(dang);
    free(nodir);
    free(l2);
    free(sub);
    free(link);
    free(target);
}

/* ---- refusals -------------------------------------------------------------- */

static void test_refused(wna16_context_t *ctx, const char *dir)
{
    wna16_error_t err;
    char *d = stt_path(dir, "outdir"), *dl = stt_path(dir, "dlink");
    char *sock = stt_path(dir, "sock");
    TU_CHECK(mkdir(d, 0755) == 0 && symlink("outdir", dl) == 0);
    int before = stt_count_entries(dir);
    STT_EXPECT_ERR(write_small(ctx, d, &err), &err, WNA16_EINVAL,
                   "outdir: is a directory, not an output file (an output "
                   "is a regular file");
    STT_EXPECT_ERR(write_small(ctx, dl, &err), &err, WNA16_EINVAL,
                   "dlink: is a symbolic link to a directory");
    TU_CHECK(stt_count_entries(d) == 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd >= 0 && strlen(sock) < sizeof sa.sun_path) {
        strcpy(sa.sun_path, sock);
        TU_CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
        before++;
        STT_EXPECT_ERR(write_small(ctx, sock, &err), &err, WNA16_EINVAL,
                       "sock: is a socket");
        struct stat st;
        TU_CHECK(lstat(sock, &st) == 0 && S_ISSOCK(st.st_mode));
    }
    if (fd >= 0)
        close(fd);
    STT_EXPECT_ERR(write_small(ctx, "", &err), &err, WNA16_EINVAL, NULL);
    TU_CHECK(stt_count_entries(dir) == before);
    unlink(sock);
    unlink(dl);
    rmdir(d);
    free(sock);
    free(dl);
    free(d);
}

/* The rename re-checks the path: a FIFO that appeared meanwhile stays. */
static void test_replaced_meanwhile(wna16_context_t *ctx, const char *dir)
{
    wna16_error_t err;
    char *path = stt_path(dir, "late.st");
    wna16_safetensors_writer_t *w = NULL;
    int64_t shape[] = {4};
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    TU_OK(wna16_safetensors_writer_declare(w, "t", WNA16_DTYPE_U8, 1, shape,
                                           &err), &err);
    TU_OK(wna16_safetensors_writer_write(w, "abcd", 4, &err), &err);
    TU_CHECK(mkfifo(path, 0644) == 0);
    STT_EXPECT_ERR(wna16_safetensors_writer_finish(w, &err), &err,
                   WNA16_EINVAL, "late.st: became a FIFO while it was "
                   "written; not replacing it");
    struct stat st;
    TU_CHECK(lstat(path, &st) == 0 && S_ISFIFO(st.st_mode));
    TU_CHECK(count_tmp(dir) == 0);
    unlink(path);
    free(path);
}

/* ---- the registry ---------------------------------------------------------- */

static wna16_safetensors_writer_t *open_writer(wna16_context_t *ctx,
                                               const char *dir, int i)
{
    char name[32];
    snprintf(name, sizeof name, "w%d.st", i);
    char *path = stt_path(dir, name);
    wna16_safetensors_writer_t *w = NULL;
    wna16_error_t err;
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    free(path);
    return w;
}

static void test_cleanup(wna16_context_t *ctx, const char *dir)
{
    wna16_error_t err;
    /* one writer: its temporary goes, and finishing then fails */
    wna16_safetensors_writer_t *w = open_writer(ctx, dir, 0);
    TU_CHECK(count_tmp(dir) == 1);
    w16_output_cleanup();
    TU_CHECK(count_tmp(dir) == 0);
    if (w)
        STT_EXPECT_ERR(wna16_safetensors_writer_finish(w, &err), &err,
                       WNA16_EIO, "cannot move");
    TU_CHECK(stt_count_entries(dir) == 0);

    /* more writers than slots: the registered ones go, the rest stay until
     * their writers remove them */
    enum { N = W16_OUTPUT_MAX_LIVE + 3 };
    wna16_safetensors_writer_t *ws[N];
    for (int i = 0; i < N; i++)
        ws[i] = open_writer(ctx, dir, i);
    TU_CHECK(count_tmp(dir) == N);
    w16_output_cleanup();
    TU_CHECK_MSG(count_tmp(dir) == N - W16_OUTPUT_MAX_LIVE, "%d left",
                 count_tmp(dir));
    for (int i = 0; i < N; i++)
        wna16_safetensors_writer_abort(ws[i]);
    TU_CHECK(stt_count_entries(dir) == 0);
    /* the slots came back */
    for (int i = 0; i < W16_OUTPUT_MAX_LIVE; i++)
        ws[i] = open_writer(ctx, dir, i);
    w16_output_cleanup();
    TU_CHECK(count_tmp(dir) == 0);
    for (int i = 0; i < W16_OUTPUT_MAX_LIVE; i++)
        wna16_safetensors_writer_abort(ws[i]);
    TU_CHECK(stt_count_entries(dir) == 0);
}

/* ---- stale temporaries ----------------------------------------------------- */

static char ot_log[4096];

static void capture(void *user, wna16_log_level_t level, const char *msg)
{
    (void)user;
    (void)level;
    size_t n = strlen(ot_log);
    snprintf(ot_log + n, sizeof ot_log - n, "%s\n", msg);
}

static void touch(const char *dir, const char *name)
{
    char *p = stt_path(dir, name);
    TU_CHECK(tu_write_file(p, "x", 1) == 0);
    free(p);
}

static bool here(const char *dir, const char *name)
{
    char *p = stt_path(dir, name);
    bool e = tu_exists(p);
    free(p);
    return e;
}

static void test_stale(const char *dir)
{
    wna16_context_options_t o = {.log = capture, .log_level = WNA16_LOG_WARN,
                                 .log_level_set = true,
                                 .no_builtin_specs = true};
    wna16_context_t *ctx = NULL;
    wna16_error_t err;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (!ctx)
        return;
    pid_t dead = fork();
    if (dead == 0)
        _exit(0);
    waitpid(dead, NULL, 0);
    if (kill(dead, 0) == 0) {
        printf("note: pid %ld was reused at once; stale test skipped\n",
               (long)dead);
        wna16_context_destroy(ctx);
        return;
    }
    char stale[64], live[64], other[64], odd[64], sub[64], want[160];
    snprintf(stale, sizeof stale, "out.st.tmp.%ld.0", (long)dead);
    snprintf(live, sizeof live, "out.st.tmp.%ld.0", (long)getppid());
    snprintf(other, sizeof other, "other.st.tmp.%ld.0", (long)dead);
    snprintf(odd, sizeof odd, "out.st.tmp.%ld.0x", (long)dead);
    snprintf(sub, sizeof sub, "out.st.tmp.%ld.1", (long)dead);
    touch(dir, stale);
    touch(dir, live);
    touch(dir, other);
    touch(dir, odd);
    char *subp = stt_path(dir, sub), *out = stt_path(dir, "out.st");
    TU_CHECK(mkdir(subp, 0755) == 0);
    ot_log[0] = '\0';
    TU_OK(write_small(ctx, out, &err), &err);
    snprintf(want, sizeof want, "removed stale temporary %s/%s (process %ld "
             "is gone)\n", dir, stale, (long)dead);
    TU_CHECK_MSG(strcmp(ot_log, want) == 0, "logged \"%s\", expected \"%s\"",
                 ot_log, want);
    TU_CHECK(!here(dir, stale));
    TU_CHECK(here(dir, live) && here(dir, other) && here(dir, odd) &&
             here(dir, sub) && here(dir, "out.st"));
    rmdir(subp);
    free(subp);
    free(out);
    wna16_context_destroy(ctx);
}

int main(void)
{
    for (int i = 0; i < OT_N; i++) {
        ot_a[i] = (float)i;
        ot_b[i] = (float)-i;
    }
    wna16_context_t *ctx = tu_context();
    char *dir = stt_tempdir("output");
    char *ref = stt_path(dir, "ref.st");
    wna16_error_t err;
    TU_OK(write_small(ctx, ref, &err), &err);
    test_fifo(ctx, dir, ref);
    test_stdout_pipe(ctx, dir, ref);
    test_devnull(ctx);
    test_links(ctx, dir, ref);
    test_refused(ctx, dir);
    test_replaced_meanwhile(ctx, dir);
    unlink(ref);
    TU_CHECK(stt_count_entries(dir) == 0);
    test_cleanup(ctx, dir);
    test_stale(dir);
    stt_rmtree(dir);
    free(ref);
    free(dir);
    wna16_context_destroy(ctx);
    return tu_finish("test_output");
}
