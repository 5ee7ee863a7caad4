/*
 * select_test.c - the row runner and the spec-mutation helper shared by the
 * selection tests (see select_test.h). A row failing prints its name with
 * the result actually obtained, so a broken table entry is easy to find.
 */
#include "select_test.h"

#include <stdlib.h>
#include <string.h>

void st_query(const st_row_t *r, wna16_select_query_t *q)
{
    memset(q, 0, sizeof *q);
    q->platform = r->plat;
    int cc = r->cc ? r->cc : 90;
    q->cc_major = cc / 10;
    q->cc_minor = cc % 10;
    q->format = r->fmt;
    q->quant.bits = r->bits ? r->bits : 4;
    q->quant.group_size = r->gs ? r->gs : 128;
    q->quant.zero_point = r->zp;
    q->quant.act_order = r->ao;
    q->quant.bias = r->bias;
    q->actorder = r->actorder;
    q->hidden_size = r->H ? r->H : 256;
    q->intermediate_size = r->I ? r->I : 256;
    q->num_experts = r->E ? r->E : 8;
    q->top_k = r->K ? r->K : 2;
    q->activation_format = r->batched ? WNA16_ACT_FORMAT_BATCHED
                                      : WNA16_ACT_FORMAT_STANDARD;
    q->activation = r->act;
    q->backend = r->backend;
    q->kernel_platforms = r->km ? r->km : ST_KM_DEFAULT;
}

static void dump(const st_row_t *r, wna16_status_t st,
                 const wna16_select_result_t *res, const wna16_error_t *err)
{
    fprintf(stderr, "  [%s] status %s, backend %s, error \"%s\", note \"%s\"\n",
            r->name, wna16_status_name(st),
            res->backend ? wna16_spec_name(res->backend) : "(none)",
            err->message, res->note);
    for (size_t i = 0; i < res->n_passed_over; i++)
        fprintf(stderr, "    passed over %s: %s\n",
                wna16_spec_name(res->passed_over[i].backend),
                res->passed_over[i].reason);
}

static int find_po(const wna16_select_result_t *res, const char *backend)
{
    for (size_t i = 0; i < res->n_passed_over; i++)
        if (strcmp(wna16_spec_name(res->passed_over[i].backend), backend) == 0)
            return (int)i;
    return -1;
}

/* Checks the passed-over list; returns the number of failed checks. */
static int check_po(const st_row_t *r, const wna16_select_result_t *res)
{
    int bad = 0;
    size_t n = 0;
    for (; n < sizeof r->po / sizeof r->po[0] && r->po[n].backend; n++) {
        int at = find_po(res, r->po[n].backend);
        bool ok = at >= 0 && (!r->exact || at == (int)n) &&
                  strcmp(res->passed_over[at].reason, r->po[n].reason) == 0;
        TU_CHECK_MSG(ok, "[%s] %s passed over with \"%s\"", r->name,
                     r->po[n].backend, r->po[n].reason);
        bad += !ok;
    }
    if (r->exact) {
        TU_CHECK_MSG(res->n_passed_over == n, "[%s] %zu passed over, want %zu",
                     r->name, res->n_passed_over, n);
        bad += res->n_passed_over != n;
    }
    return bad;
}

static int check_outcome(const st_row_t *r, wna16_status_t st,
                         const wna16_select_result_t *res,
                         const wna16_error_t *err)
{
    int before = tu_failures;
    if (r->want) {
        TU_CHECK_MSG(st == WNA16_OK && res->backend &&
                         strcmp(wna16_spec_name(res->backend), r->want) == 0,
                     "[%s] want backend %s", r->name, r->want);
    } else {
        TU_CHECK_MSG(st == r->st && !res->backend, "[%s] want status %s",
                     r->name, wna16_status_name(r->st));
    }
    if (r->err)
        TU_CHECK_MSG(strstr(err->message, r->err), "[%s] error lacks \"%s\"",
                     r->name, r->err);
    if (r->note)
        TU_CHECK_MSG(strstr(res->note, r->note), "[%s] note lacks \"%s\"",
                     r->name, r->note);
    else
        TU_CHECK_MSG(res->note[0] == '\0', "[%s] unexpected note", r->name);
    if (st != WNA16_EINVAL) {
        const char *f = r->eff_fmt ? r->eff_fmt : r->fmt;
        TU_CHECK_MSG(res->format && strcmp(wna16_spec_name(res->format), f) == 0,
                     "[%s] effective format, want %s", r->name, f);
    }
    return tu_failures - before;
}

void st_run(wna16_context_t *ctx, const st_row_t *r)
{
    wna16_select_query_t q;
    wna16_select_result_t res;
    wna16_error_t err;
    wna16_error_clear(&err);
    st_query(r, &q);
    wna16_status_t st = wna16_select(ctx, &q, &res, &err);
    int bad = check_outcome(r, st, &res, &err) + check_po(r, &res);
    if (bad)
        dump(r, st, &res, &err);
}

void st_run_all(wna16_context_t *ctx, const st_row_t *rows, size_t n)
{
    for (size_t i = 0; i < n; i++)
        st_run(ctx, &rows[i]);
}

/* text with each from[i] replaced once by to[i]; NULL if one is absent. */
static char *mutate(const char *text, const char *const *from,
                    const char *const *to, int n)
{
    size_t len = strlen(text);
    char *cur = malloc(len + 1);
    if (cur)
        memcpy(cur, text, len + 1);
    for (int i = 0; cur && i < n; i++) {
        const char *at = strstr(cur, from[i]);
        TU_CHECK_MSG(at != NULL, "spec text lacks \"%s\"", from[i]);
        if (!at) {
            free(cur);
            return NULL;
        }
        size_t pre = (size_t)(at - cur), fl = strlen(from[i]);
        size_t tl = strlen(to[i]), rest = strlen(at + fl);
        char *next = malloc(pre + tl + rest + 1);
        if (next) {
            memcpy(next, cur, pre);
            memcpy(next + pre, to[i], tl);
            memcpy(next + pre + tl, at + fl, rest + 1);
        }
        free(cur);
        cur = next;
    }
    return cur;
}

wna16_context_t *st_context_mutated(const char *rel, const char *const *from,
                                    const char *const *to, int n)
{
    char path[4096];
    size_t size = 0;
    snprintf(path, sizeof path, "%s/%s", WNA16_SOURCE_DIR, rel);
    char *text = tu_read_file(path, &size);
    TU_CHECK_MSG(text != NULL, "cannot read %s", path);
    if (!text)
        return NULL;
    char *m = mutate(text, from, to, n);
    free(text);
    if (!m)
        return NULL;
    wna16_context_t *ctx = tu_context();
    wna16_error_t err;
    char origin[256];
    snprintf(origin, sizeof origin, "mutated:%s", rel);
    wna16_status_t st = wna16_spec_load_text(ctx, origin, m, strlen(m), NULL,
                                             &err);
    free(m);
    TU_CHECK_MSG(st == WNA16_OK, "loading mutated %s: %s", rel, err.message);
    if (st != WNA16_OK) {
        wna16_context_destroy(ctx);
        return NULL;
    }
    return ctx;
}
