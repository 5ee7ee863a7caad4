/*
 * output.h - how wna16 opens an output path, the one place that decides it
 * (the safetensors writer is its user), and the process-wide registry of
 * live temporary files that a signal handler may clean up.
 *
 * What a path names decides how it is written:
 *   - a regular file, or nothing yet: "<path>.tmp.<pid>.<n>" beside it,
 *     fsync, then an atomic rename over the path: never a partial file;
 *     stale temporaries of that naming whose process is gone are removed
 *     first (logged once per file at WNA16_LOG_WARN);
 *   - a symbolic link: followed (every hop) to its target, which is then
 *     written by these same rules; the link itself stays. A dangling link is
 *     followed to the file it names, which is created, unless that file's
 *     directory is missing: refused;
 *   - "-": standard output, streamed (refused when it is a terminal);
 *   - a FIFO or a character device (/dev/null): opened and streamed to
 *     directly, no temporary, no rename; a failure part way leaves what was
 *     already written (a safetensors reader refuses the truncated file);
 *   - a directory, a block device or a socket: refused, naming the path and
 *     what it is.
 * Nothing that is not a regular file is ever renamed over: the destination
 * is looked at again (lstat) right before the rename.
 *
 * Signals: the library installs no handler. w16_output_cleanup() is
 * async-signal-safe and removes every temporary still registered; a program
 * that wants its temporaries gone on SIGINT or SIGTERM installs a handler
 * that calls it (w16_output_on_signal is such a handler: it cleans up, then
 * dies of the signal with its default action). The registry holds
 * W16_OUTPUT_MAX_LIVE temporaries at a time; one that finds it full is still
 * written and removed on every error path, only not by a signal handler
 * (the next run removes it as stale).
 */
#ifndef W16_RUNTIME_OUTPUT_H
#define W16_RUNTIME_OUTPUT_H

#include "base/base.h"

/* Temporaries the registry tracks at once (more are still written). */
#define W16_OUTPUT_MAX_LIVE 64

typedef enum w16_output_kind {
    W16_OUTPUT_FILE,   /* temporary, fsync, atomic rename over dest */
    W16_OUTPUT_STDOUT, /* "-": fd 1, left open */
    W16_OUTPUT_STREAM, /* a FIFO or a character device, written in place */
} w16_output_kind_t;

/* An open output. Strings live in the arena given to w16_output_open. */
typedef struct w16_output {
    w16_output_kind_t kind;
    int fd;           /* -1 once closed */
    const char *path; /* as the caller named it (messages) */
    const char *dest; /* FILE: what the rename replaces (a link's target) */
    const char *tmp;  /* FILE: the temporary, NULL otherwise */
    int slot;         /* the temporary's registry slot, -1 if none */
} w16_output_t;

/* Decides what `path` names and opens it as the rules above say. On
 * failure `o` holds nothing to discard (no file was created) and err names
 * the path and the reason. */
wna16_status_t w16_output_open(wna16_context_t *ctx, w16_arena_t *arena,
                               const char *path, w16_output_t *o,
                               wna16_error_t *err);
/* The name write errors should cite: the temporary, else the path. */
const char *w16_output_name(const w16_output_t *o);
/* Completes the output: FILE: fsync, close, lstat check, rename, directory
 * fsync; STREAM: close; STDOUT: nothing to do. On failure the temporary is
 * removed. Either way `o` is closed afterwards. */
wna16_status_t w16_output_commit(w16_output_t *o, wna16_error_t *err);
/* Closes `o` and removes its temporary; idempotent. */
void w16_output_discard(w16_output_t *o);

/* wna16_safetensors_writer_finish in two steps (runtime/safetensors_write.c),
 * for files that must appear together (a sharded checkpoint directory):
 * _complete writes the whole file into its temporary, which stays (still
 * registered for w16_output_cleanup); _commit renames it into place and
 * frees the writer, which wna16_safetensors_writer_abort frees instead
 * (removing the temporary) when another file of the set failed. */
wna16_status_t w16_safetensors_writer_complete(wna16_safetensors_writer_t *w,
                                               wna16_error_t *err);
wna16_status_t w16_safetensors_writer_commit(wna16_safetensors_writer_t *w,
                                             wna16_error_t *err);

/* Async-signal-safe: removes every registered temporary. */
void w16_output_cleanup(void);
/* A signal handler: w16_output_cleanup(), then the signal again with its
 * default action (install it with SA_RESETHAND, or it resets it itself). */
void w16_output_on_signal(int sig);

#endif
