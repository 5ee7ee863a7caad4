/*
 * fuzz.h - what the kinds of `wna16 fuzz` share: the command's options,
 * the random numbers that make a case reproducible from one 64-bit seed
 * (splitmix64), the outcome of a case and the kinds' entry points.
 * cmd_fuzz.c parses the command line and runs the repack kind;
 * fuzz_moe.c is the fused-MoE kind; fuzz_case.c what they do alike with
 * their cases (fz_cases_t).
 */
#ifndef WNA16_TOOLS_FUZZ_H
#define WNA16_TOOLS_FUZZ_H

#include "cli.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* ---- random numbers (splitmix64: one 64-bit seed reproduces a case) ------ */

typedef struct fz_rng {
    uint64_t s;
} fz_rng_t;

static inline uint64_t fz_next(fz_rng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint32_t fz_below(fz_rng_t *r, uint32_t n)
{
    return (uint32_t)(fz_next(r) % n);
}

/* Uniform in [0, 1). */
static inline double fz_unit(fz_rng_t *r)
{
    return (double)(fz_next(r) >> 11) * 0x1p-53;
}

/* ---- the command ------------------------------------------------------------ */

typedef enum fz_kind {
    FZ_KIND_REPACK,
    FZ_KIND_MOE,
} fz_kind_t;

typedef struct fz_opts {
    fz_kind_t kind;
    long count;
    uint64_t seed;
    wna16_target_t target;
    const char *from, *to, *one; /* --from, --to (repack), --case */
    const char *backend;         /* --backend (moe) */
    bool shrink, verbose, inject_fault;
    bool json;  /* --json: one object on stdout, the lines on stderr */
    FILE *out;  /* where the human lines go: stdout, or stderr with --json */
} fz_opts_t;

/* How a case ended. */
typedef enum fz_outcome {
    FZ_SAME,        /* same bytes (repack), within the tolerance (moe) */
    FZ_REFUSED,     /* both refused, with the same reason */
    FZ_INVALID,     /* not a problem the layout can hold (drawn again) */
    FZ_FAILED,
    FZ_UNSUPPORTED, /* moe: the kernel path refuses the layer, as its
                       documentation says it does (act-order on the CPU,
                       ...); counted, not a failure */
} fz_outcome_t;

/* What a run reports with --json: the tally by outcome, the time, and
 * the first failure (as drawn, as shrunk, the message, the reproducer). */
typedef struct fz_report {
    long tally[5];
    double seconds;
    char failed[640], shrunk[640], message[1024], reproduce[1024];
} fz_report_t;

/* ---- a kind's cases (fuzz_case.c) ------------------------------------------ */

enum { FZ_TEXT = 640, FZ_MAX_CANDIDATES = 48 }; /* a case's text; a step's
                                                  shrink candidates */

/* What the shared pieces need of a kind's case type (a plain struct of
 * case_size bytes). */
typedef struct fz_cases {
    size_t case_size;
    int max_steps;              /* of shrinking */
    const char *options;        /* the reproducer's options before
                                   --target: "" or " --kind moe" */
    void (*text)(const void *c, char *buf, size_t n); /* --case reads it */
    fz_outcome_t (*run)(wna16_context_t *ctx, const void *c,
                        wna16_target_t target, char *msg, size_t n);
    /* the smaller variants of c to try, at most FZ_MAX_CANDIDATES, into
     * out (an array of cases); returns how many */
    int (*candidates)(const void *c, void *out);
} fz_cases_t;

/* "0" or "1". */
bool fz_parse_bool(const char *v, bool *out);

/* set(user, k, value): keys[k]'s value into the case; false: bad value. */
typedef bool (*fz_field_fn)(void *user, int k, const char *v);
/* The KEY=VALUE tokens left in strtok_r's *save (after the case's first
 * token), each through set; every key must be present (at most 32).
 * Returns NULL, or `why` naming the token, the bad value or the missing
 * key. */
const char *fz_parse_fields(char **save, const char *const *keys, int nkeys,
                            fz_field_fn set, void *user, char *why, size_t n);

/* Replaces *c by the smallest failing case reached by accepting, again
 * and again, the first candidate that still fails; msg gets its failure.
 * Returns the steps taken. */
int fz_shrink(const fz_cases_t *kind, wna16_context_t *ctx, void *c,
              wna16_target_t target, char *msg, size_t n, bool verbose);

/* Prints the failure of *c (message msg), shrunk unless --no-shrink (*c
 * and msg then hold the shrunk case), and its reproducer; fills rep.
 * Returns CLI_FAIL. */
int fz_report_failure(const fz_cases_t *kind, wna16_context_t *ctx,
                      const fz_opts_t *o, void *c, char *msg, size_t n,
                      fz_report_t *rep);

/* The progress line after `done` of o->count cases (every tenth; on a
 * terminal rewritten in place). */
void fz_progress(const fz_opts_t *o, long done, bool tty);

/* Prints the report as one JSON object on stdout (cmd_fuzz.c). */
void fz_report_json(const fz_opts_t *o, const fz_report_t *r);

/* The fused-MoE kind (fuzz_moe.c): --case, or --count random cases.
 * Exit status as cmd_fuzz. */
int fuzz_moe_one(wna16_context_t *ctx, const fz_opts_t *o, fz_report_t *rep);
int fuzz_moe_many(wna16_context_t *ctx, const fz_opts_t *o, fz_report_t *rep);

#endif
