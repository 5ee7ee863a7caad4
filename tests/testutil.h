/*
 * testutil.h - tiny helpers for the C tests: checks that report file:line
 * and keep going, a deterministic RNG, skip (exit 77) and temp directories.
 */
#ifndef WNA16_TESTUTIL_H
#define WNA16_TESTUTIL_H

#include "wna16.h"

#include <stdint.h>
#include <stdio.h>

extern int tu_failures;
extern int tu_checks;

#define TU_CHECK(cond)                                                        \
    do {                                                                      \
        tu_checks++;                                                          \
        if (!(cond)) {                                                        \
            tu_failures++;                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__,  \
                    #cond);                                                   \
        }                                                                     \
    } while (0)

#define TU_CHECK_MSG(cond, ...)                                               \
    do {                                                                      \
        tu_checks++;                                                          \
        if (!(cond)) {                                                        \
            tu_failures++;                                                    \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__,  \
                    #cond);                                                   \
            fprintf(stderr, __VA_ARGS__);                                     \
            fputc('\n', stderr);                                              \
        }                                                                     \
    } while (0)

/* Checks a status is OK, printing the error message otherwise. */
#define TU_OK(expr, errp)                                                     \
    do {                                                                      \
        tu_checks++;                                                          \
        wna16_status_t tu_st_ = (expr);                                       \
        if (tu_st_ != WNA16_OK) {                                             \
            tu_failures++;                                                    \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, \
                    #expr, wna16_status_name(tu_st_), (errp)->message);       \
        }                                                                     \
    } while (0)

/* Prints a summary; returns the process exit code (0 or 1). */
int tu_finish(const char *suite);

/* Prints why and exits 77 (CTest: skipped). */
_Noreturn void tu_skip(const char *why);

/* xorshift64* */
typedef struct tu_rng {
    uint64_t s;
} tu_rng_t;
void tu_rng_seed(tu_rng_t *r, uint64_t seed);
uint64_t tu_rng_next(tu_rng_t *r);
/* Uniform in [0, n). */
uint32_t tu_rng_below(tu_rng_t *r, uint32_t n);

/* Creates a fresh directory under the build tree or $TMPDIR; returns a
 * static path buffer valid until the next call. */
const char *tu_tempdir(const char *tag);
/* Reads a whole file into malloc'd memory (size out); NULL on error. */
void *tu_read_file(const char *path, size_t *size);
int tu_write_file(const char *path, const void *data, size_t size);
/* Does the directory/file exist? */
int tu_exists(const char *path);
/* A context with built-in specs, quiet logging; exits 1 on failure. */
wna16_context_t *tu_context(void);

#endif
