/*
 * select_test.h - the row format shared by the selection tests: one row is
 * one deployment (fields left 0 take the defaults below) and what
 * wna16_select must answer for it: the backend chosen or the failure
 * status, substrings of the error and of the fallback note, the effective
 * format, and (backend, reason) pairs that must appear, reasons matching
 * exactly, among the backends passed over (in exactly that order and number
 * when `exact`).
 */
#ifndef SELECT_TEST_H
#define SELECT_TEST_H

#include "testutil.h"

#include <stdbool.h>

#define ST_BIT(p) (1u << WNA16_PLATFORM_##p)
/* Default kernel mask: everything wna16 has a target for (never ROCm). */
#define ST_KM_DEFAULT (ST_BIT(CUDA) | ST_BIT(CPU) | ST_BIT(XPU))
#define ST_KM_ALL (ST_KM_DEFAULT | ST_BIT(ROCM))

typedef struct st_po {
    const char *backend; /* spec name */
    const char *reason;  /* the whole reason, exactly */
} st_po_t;

typedef struct st_row {
    const char *name;
    /* query; 0 / NULL fields take the defaults */
    const char *fmt;         /* required */
    int bits;                /* 0: 4 */
    int gs;                  /* 0: 128 */
    bool zp, ao, bias, batched;
    const char *actorder;
    const char *act;         /* NULL: "silu" (the library's default) */
    const char *backend;     /* NULL: auto */
    wna16_platform_t plat;   /* 0: CUDA */
    int cc;                  /* 10*major+minor; 0: 90 */
    int H, I, E, K;          /* 0: 256, 256, 8, 2 */
    uint32_t km;             /* 0: ST_KM_DEFAULT */
    /* expectations */
    const char *want;        /* backend spec name; NULL: a failure */
    wna16_status_t st;       /* expected status when want == NULL */
    const char *err;         /* substring of the error message */
    const char *note;        /* substring of res.note; NULL: no note */
    const char *eff_fmt;     /* effective format; NULL: the query's */
    bool exact;              /* po lists every backend passed over */
    st_po_t po[7];
} st_row_t;

/* Builds the query of a row (strings point into the row). */
void st_query(const st_row_t *r, wna16_select_query_t *q);

/* Runs one row against ctx and checks every expectation. */
void st_run(wna16_context_t *ctx, const st_row_t *r);

/* Runs rows[n]. */
void st_run_all(wna16_context_t *ctx, const st_row_t *rows, size_t n);

/* A quiet context holding the built-in specs with one built-in spec file
 * (relative to the source tree, e.g. "specs/backends/triton.json") loaded
 * again after replacing each from[i] by to[i] (each must occur). Returns
 * NULL (after a failed check) on error. */
wna16_context_t *st_context_mutated(const char *rel, const char *const *from,
                                    const char *const *to, int n);

#endif
