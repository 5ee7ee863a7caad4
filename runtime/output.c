/*
 * output.c - opening, completing and discarding an output path (output.h
 * says what each kind of path gets), the registry of live temporaries that
 * lets a signal handler remove them, and the sweep of stale temporaries
 * left by processes that are gone (a SIGKILL, a power cut). The registry is
 * the library's one piece of process-wide state, on purpose: a signal
 * handler has no context to reach. It is a fixed array of paths whose slots
 * change hands through lock-free atomics only, so w16_output_cleanup() may
 * run in a handler that interrupted a registration on any thread.
 */
#define _POSIX_C_SOURCE 200809L
#include "runtime/output.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* Attempts at a fresh temporary name before giving up. */
#define OUT_TMP_ATTEMPTS 1000
/* Symbolic links followed before giving up (Linux's own limit). */
#define OUT_MAX_LINKS 40
/* A registered temporary's path, NUL included. */
#define OUT_SLOT_PATH 4096

/* ---- the registry of live temporaries ------------------------------------ */

/* A slot's life: FREE -> FILLING (the path is copied) -> LIVE -> FREE when
 * its writer is done with it; a handler takes LIVE -> CLEANING (unlink) ->
 * CLEANED, which only the writer frees. */
enum { SLOT_FREE, SLOT_FILLING, SLOT_LIVE, SLOT_CLEANING, SLOT_CLEANED };

_Static_assert(ATOMIC_INT_LOCK_FREE == 2,
               "the registry needs lock-free atomics to be signal-safe");

static struct out_slot {
    atomic_int state;
    char path[OUT_SLOT_PATH];
} g_live[W16_OUTPUT_MAX_LIVE];

/* Registers `path`; its slot, or -1 when the registry is full or the path
 * too long (the file is then only removed by its writer or a later run). */
static int registry_add(const char *path)
{
    size_t n = strlen(path);
    if (n >= OUT_SLOT_PATH)
        return -1;
    for (int i = 0; i < W16_OUTPUT_MAX_LIVE; i++) {
        int expect = SLOT_FREE;
        if (atomic_compare_exchange_strong(&g_live[i].state, &expect,
                                           SLOT_FILLING)) {
            memcpy(g_live[i].path, path, n + 1);
            atomic_store(&g_live[i].state, SLOT_LIVE);
            return i;
        }
    }
    return -1;
}

/* Frees `slot` once no handler is reading its path. */
static void registry_drop(int slot)
{
    if (slot < 0)
        return;
    atomic_int *state = &g_live[slot].state;
    for (;;) {
        int s = atomic_load(state);
        if (s == SLOT_CLEANING)
            continue; /* a handler on another thread is unlinking it */
        if (atomic_compare_exchange_strong(state, &s, SLOT_FREE))
            return;
    }
}

void w16_output_cleanup(void)
{
    for (int i = 0; i < W16_OUTPUT_MAX_LIVE; i++) {
        int expect = SLOT_LIVE;
        if (atomic_compare_exchange_strong(&g_live[i].state, &expect,
                                           SLOT_CLEANING)) {
            unlink(g_live[i].path);
            atomic_store(&g_live[i].state, SLOT_CLEANED);
        }
    }
}

void w16_output_on_signal(int sig)
{
    int saved = errno;
    w16_output_cleanup();
    signal(sig, SIG_DFL);
    raise(sig); /* delivered with the default action once this returns */
    errno = saved;
}

/* ---- paths --------------------------------------------------------------- */

/* The directory part of `path`: "." when it has none. */
static const char *dir_of(w16_arena_t *a, const char *path)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        return w16_arena_strdup(a, ".");
    if (slash == path)
        return w16_arena_strdup(a, "/");
    return w16_arena_strndup(a, path, (size_t)(slash - path));
}

static const char *base_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* "a directory" etc.: what st_mode names, for messages. */
static const char *kind_name(mode_t m)
{
    if (S_ISREG(m))
        return "a regular file";
    if (S_ISDIR(m))
        return "a directory";
    if (S_ISLNK(m))
        return "a symbolic link";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISSOCK(m))
        return "a socket";
    return "a file of unknown kind";
}

/* The link's text: NULL (err filled) when it cannot be read. */
static char *read_link(w16_arena_t *a, const char *link, const char *path,
                       wna16_error_t *err)
{
    for (size_t cap = 256; cap <= 65536; cap *= 2) {
        char *buf = w16_arena_alloc(a, cap);
        if (!buf) {
            w16_err_nomem(err, "following a symbolic link");
            return NULL;
        }
        ssize_t n = readlink(link, buf, cap);
        if (n < 0) {
            w16_err(err, WNA16_EIO, "%s: cannot read the symbolic link %s: "
                    "%s", path, link, strerror(errno));
            return NULL;
        }
        if ((size_t)n < cap) {
            buf[n] = '\0';
            return buf;
        }
    }
    w16_err(err, WNA16_ELIMIT, "%s: the symbolic link %s is too long", path,
            link);
    return NULL;
}

/* Follows `path` through symbolic links (a relative one from the link's
 * directory) to the first name that is not a link: *dest, with *exists and,
 * when it exists, its lstat in *st. */
static wna16_status_t follow_links(w16_arena_t *a, const char *path,
                                   const char **dest, bool *exists,
                                   struct stat *st, wna16_error_t *err)
{
    const char *cur = path;
    for (int hop = 0;; hop++) {
        if (lstat(cur, st) != 0) {
            if (errno != ENOENT)
                return w16_err(err, WNA16_EIO, "%s: cannot look at %s: %s",
                               path, cur, strerror(errno));
            *exists = false;
            *dest = cur;
            return WNA16_OK;
        }
        if (!S_ISLNK(st->st_mode)) {
            *exists = true;
            *dest = cur;
            return WNA16_OK;
        }
        if (hop == OUT_MAX_LINKS)
            return w16_err(err, WNA16_ELIMIT, "%s: more than %d symbolic "
                           "links to follow", path, OUT_MAX_LINKS);
        char *to = read_link(a, cur, path, err);
        if (!to)
            return err ? err->status : WNA16_EIO;
        const char *slash = strrchr(cur, '/');
        if (to[0] != '/' && slash) {
            size_t dl = (size_t)(slash - cur) + 1, tl = strlen(to);
            char *j = w16_arena_alloc(a, dl + tl + 1);
            if (!j)
                return w16_err_nomem(err, "following a symbolic link");
            memcpy(j, cur, dl);
            memcpy(j + dl, to, tl + 1);
            to = j;
        }
        cur = to;
    }
}

/* ---- stale temporaries --------------------------------------------------- */

/* Reads "<pid>.<n>" (digits only, nothing after): the pid, or 0. */
static long tmp_suffix_pid(const char *s)
{
    long pid = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (pid > (INT_MAX - 9) / 10)
            return 0;
        pid = pid * 10 + (*p - '0');
    }
    if (p == s || *p != '.' || !p[1])
        return 0;
    for (p++; *p; p++)
        if (*p < '0' || *p > '9')
            return 0;
    return pid;
}

/* Removes "<dest>.tmp.<pid>.<n>" files whose process is gone: a run that
 * died of SIGKILL (or a crash) could not remove its own. A process that
 * exists, or that we may not signal, keeps its files. */
static void sweep_stale(wna16_context_t *ctx, w16_arena_t *a,
                        const char *dest)
{
    const char *dir = dir_of(a, dest), *base = base_of(dest);
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d)
        return;
    size_t bl = strlen(base);
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    const struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, base, bl) != 0 || strncmp(n + bl, ".tmp.", 5) != 0)
            continue;
        long pid = tmp_suffix_pid(n + bl + 5);
        if (pid <= 0 || pid == (long)getpid() ||
            kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        w16_buf_reset(&b);
        if (strcmp(dir, ".") != 0 || strchr(dest, '/'))
            w16_buf_printf(&b, "%s/", strcmp(dir, "/") ? dir : "");
        w16_buf_puts(&b, n);
        struct stat st;
        if (b.failed || lstat(b.data, &st) != 0 || !S_ISREG(st.st_mode))
            continue; /* only ever a regular file of ours */
        if (unlink(b.data) == 0)
            wna16_log(ctx, WNA16_LOG_WARN, "removed stale temporary %s "
                      "(process %ld is gone)", b.data, pid);
    }
    closedir(d);
    w16_buf_free(&b);
}

/* ---- opening ------------------------------------------------------------- */

/* What every refusal adds: the kinds of output there are. */
#define OUT_KINDS                                                            \
    "an output is a regular file (written to a temporary and renamed "      \
    "over it), a symbolic link to one, a FIFO, a character device or - "    \
    "(standard output)"

static wna16_status_t open_stdout(w16_output_t *o, wna16_error_t *err)
{
    struct stat st;
    if (fstat(STDOUT_FILENO, &st) != 0)
        return w16_err(err, WNA16_EIO, "-: standard output is not open: %s",
                       strerror(errno));
    if (isatty(STDOUT_FILENO))
        return w16_err(err, WNA16_EINVAL, "-: standard output is a "
                       "terminal; not writing binary safetensors to it "
                       "(redirect it or name a file)");
    o->kind = W16_OUTPUT_STDOUT;
    o->fd = STDOUT_FILENO;
    return WNA16_OK;
}

/* `st` is what `path` names, links followed: a FIFO or a character device
 * is streamed to, anything else (not a regular file) refused. */
static wna16_status_t open_special(w16_output_t *o, const struct stat *st,
                                   wna16_error_t *err)
{
    struct stat ls;
    bool link = lstat(o->path, &ls) == 0 && S_ISLNK(ls.st_mode);
    const char *via = link ? "a symbolic link to " : "";
    if (!S_ISFIFO(st->st_mode) && !S_ISCHR(st->st_mode))
        return w16_err(err, WNA16_EINVAL, "%s: is %s%s, not an output file "
                       "(%s)", o->path, via, kind_name(st->st_mode),
                       OUT_KINDS);
    int fd; /* a FIFO's open waits for a reader */
    do
        fd = open(o->path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return w16_err(err, WNA16_EIO, "%s: cannot open %s%s for writing: %s",
                       o->path, via, kind_name(st->st_mode), strerror(errno));
    struct stat now;
    const char *why = NULL;
    if (fstat(fd, &now) != 0 || (!S_ISFIFO(now.st_mode) &&
                                 !S_ISCHR(now.st_mode)))
        why = "it changed while it was opened";
    else if (isatty(fd))
        why = "it is a terminal; not writing binary safetensors to it";
    if (why) {
        close(fd);
        return w16_err(err, WNA16_EINVAL, "%s: %s", o->path, why);
    }
    o->kind = W16_OUTPUT_STREAM;
    o->fd = fd;
    return WNA16_OK;
}

/* A file that does not exist yet needs its directory. */
static wna16_status_t check_dir(const w16_output_t *o, w16_arena_t *a,
                                wna16_error_t *err)
{
    const char *dir = dir_of(a, o->dest);
    if (!dir)
        return w16_err_nomem(err, "opening an output");
    struct stat st;
    if (stat(dir, &st) == 0 && S_ISDIR(st.st_mode))
        return WNA16_OK;
    const char *what = stat(dir, &st) != 0 ? "does not exist"
                                           : "is not a directory";
    if (strcmp(o->dest, o->path) != 0)
        return w16_err(err, WNA16_EIO, "%s: a symbolic link to %s, whose "
                       "directory %s %s; not following it", o->path,
                       o->dest, dir, what);
    return w16_err(err, WNA16_EIO, "%s: cannot create temporary file: the "
                   "directory %s %s", o->path, dir, what);
}

/* Opens "<dest>.tmp.<pid>.<n>" exclusively, trying successive n so that
 * concurrent writers (threads or processes) never share a file. The name is
 * registered before the file exists, so a signal cannot come between. */
static wna16_status_t open_tmp(w16_output_t *o, wna16_context_t *ctx,
                               w16_arena_t *a, wna16_error_t *err)
{
    w16_buf_t b;
    w16_buf_init(&b, ctx);
    int e = 0;
    for (unsigned n = 0; n < OUT_TMP_ATTEMPTS; n++) {
        w16_buf_reset(&b);
        w16_buf_printf(&b, "%s.tmp.%ld.%u", o->dest, (long)getpid(), n);
        if (b.failed)
            break;
        o->slot = registry_add(b.data);
        o->fd = open(b.data, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        e = errno;
        if (o->fd >= 0)
            break;
        registry_drop(o->slot); /* not ours: never remove it */
        o->slot = -1;
        if (e != EEXIST)
            break;
    }
    if (b.failed) {
        w16_buf_free(&b);
        return w16_err_nomem(err, "naming a temporary file");
    }
    if (o->fd < 0) {
        w16_err(err, WNA16_EIO, "%s: cannot create temporary file %s: %s",
                o->path, b.data, strerror(e));
        w16_buf_free(&b);
        return WNA16_EIO;
    }
    o->tmp = w16_arena_strdup(a, b.data);
    if (!o->tmp) {
        /* without the name it could not be removed later: remove it now */
        close(o->fd);
        o->fd = -1;
        unlink(b.data);
        registry_drop(o->slot);
        o->slot = -1;
    }
    w16_buf_free(&b);
    return o->tmp ? WNA16_OK : w16_err_nomem(err, "naming a temporary file");
}

/* A regular file, a new one, or a link (dangling or not) to either. */
static wna16_status_t open_file(w16_output_t *o, wna16_context_t *ctx,
                                w16_arena_t *a, const struct stat *target,
                                wna16_error_t *err)
{
    bool exists = false;
    struct stat st;
    wna16_status_t s = follow_links(a, o->path, &o->dest, &exists, &st, err);
    if (s != WNA16_OK)
        return s;
    if (exists && !S_ISREG(st.st_mode))
        return w16_err(err, WNA16_EINVAL, "%s: is %s, not an output file "
                       "(%s)", o->dest, kind_name(st.st_mode), OUT_KINDS);
    /* stat saw the file through the links: the walk must end on it (a
     * /proc/<pid>/fd link names no path the walk can follow) */
    if (target && (!exists || st.st_dev != target->st_dev ||
                   st.st_ino != target->st_ino))
        return w16_err(err, WNA16_EINVAL, "%s: cannot follow its symbolic "
                       "links to the file they name", o->path);
    if (!exists && (s = check_dir(o, a, err)) != WNA16_OK)
        return s;
    sweep_stale(ctx, a, o->dest);
    return open_tmp(o, ctx, a, err);
}

wna16_status_t w16_output_open(wna16_context_t *ctx, w16_arena_t *arena,
                               const char *path, w16_output_t *o,
                               wna16_error_t *err)
{
    *o = (w16_output_t){.kind = W16_OUTPUT_FILE, .fd = -1, .slot = -1};
    if (!path || !*path)
        return w16_err(err, WNA16_EINVAL, "an output needs a path");
    if (!(o->path = w16_arena_strdup(arena, path)))
        return w16_err_nomem(err, "opening an output");
    if (strcmp(path, "-") == 0)
        return open_stdout(o, err);
    struct stat st;
    if (stat(path, &st) == 0)
        return S_ISREG(st.st_mode) ? open_file(o, ctx, arena, &st, err)
                                   : open_special(o, &st, err);
    return open_file(o, ctx, arena, NULL, err);
}

const char *w16_output_name(const w16_output_t *o)
{
    return o->tmp ? o->tmp : o->path;
}

/* ---- completing ---------------------------------------------------------- */

void w16_output_discard(w16_output_t *o)
{
    if (o->fd >= 0 && o->kind != W16_OUTPUT_STDOUT)
        close(o->fd);
    o->fd = -1;
    if (o->tmp) {
        unlink(o->tmp); /* before the slot goes: a signal may come between */
        registry_drop(o->slot);
        o->slot = -1;
        o->tmp = NULL;
    }
}

/* Failure after err was filled: the temporary goes. */
static wna16_status_t fail(w16_output_t *o, wna16_status_t s)
{
    w16_output_discard(o);
    return s;
}

/* fsync of the directory makes the rename itself durable; failure is not
 * an error (some file systems refuse fsync on directories). */
static void sync_dir_of(const char *dest)
{
    const char *slash = strrchr(dest, '/');
    char dir[OUT_SLOT_PATH];
    int n = !slash ? snprintf(dir, sizeof dir, ".")
            : slash == dest ? snprintf(dir, sizeof dir, "/")
                            : snprintf(dir, sizeof dir, "%.*s",
                                       (int)(slash - dest), dest);
    if (n < 0 || (size_t)n >= sizeof dir)
        return;
    int fd = open(dir, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

wna16_status_t w16_output_commit(w16_output_t *o, wna16_error_t *err)
{
    if (o->fd < 0)
        return w16_err(err, WNA16_EINVAL, "%s: the output is not open",
                       o->path ? o->path : "(none)");
    if (o->kind == W16_OUTPUT_STDOUT) {
        o->fd = -1;
        return WNA16_OK;
    }
    if (o->kind == W16_OUTPUT_STREAM) {
        int rc = close(o->fd);
        o->fd = -1;
        return rc == 0 ? WNA16_OK
                       : w16_err(err, WNA16_EIO, "%s: close failed: %s",
                                 o->path, strerror(errno));
    }
    if (fsync(o->fd) != 0)
        return fail(o, w16_err(err, WNA16_EIO, "%s: fsync failed: %s",
                               o->tmp, strerror(errno)));
    int rc = close(o->fd);
    o->fd = -1;
    if (rc != 0)
        return fail(o, w16_err(err, WNA16_EIO, "%s: close failed: %s",
                               o->tmp, strerror(errno)));
    /* never rename over what is not a regular file, even one that appeared
     * while the temporary was written */
    struct stat st;
    if (lstat(o->dest, &st) == 0 && !S_ISREG(st.st_mode))
        return fail(o, w16_err(err, WNA16_EINVAL, "%s: became %s while it "
                               "was written; not replacing it", o->dest,
                               kind_name(st.st_mode)));
    if (rename(o->tmp, o->dest) != 0)
        return fail(o, w16_err(err, WNA16_EIO, "%s: cannot move %s into "
                               "place: %s", o->dest, o->tmp,
                               strerror(errno)));
    registry_drop(o->slot); /* renamed: nothing left to remove */
    o->slot = -1;
    o->tmp = NULL;
    sync_dir_of(o->dest);
    return WNA16_OK;
}
