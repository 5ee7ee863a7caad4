/*
 * fuzz_case.c - what the kinds of `wna16 fuzz` do alike with their cases
 * (fuzz.h, fz_cases_t): the KEY=VALUE fields of a case's text, shrinking a
 * failing case, reporting a failure with its reproducer, and the progress
 * line of a run. The kinds (cmd_fuzz.c: repack, fuzz_moe.c: the fused MoE)
 * keep what differs: their cases, how one is drawn, run and shrunk a step,
 * and their outcome words.
 */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"
#include "runtime/targets.h"

#include <stdlib.h>
#include <string.h>

bool fz_parse_bool(const char *v, bool *out)
{
    if (strcmp(v, "0") && strcmp(v, "1"))
        return false;
    *out = v[0] == '1';
    return true;
}

const char *fz_parse_fields(char **save, const char *const *keys, int nkeys,
                            fz_field_fn set, void *user, char *why, size_t n)
{
    unsigned seen = 0;
    char *tok;
    while ((tok = strtok_r(NULL, " \t\n", save))) {
        char *eq = strchr(tok, '=');
        int k = 0;
        if (eq) {
            *eq = '\0';
            while (k < nkeys && strcmp(tok, keys[k]))
                k++;
        }
        if (!eq || k == nkeys) {
            int at = snprintf(why, n, "'%s': expected KEY=VALUE with a key "
                              "of ", tok);
            for (int i = 0; i < nkeys && at >= 0 && (size_t)at < n; i++)
                at += snprintf(why + at, n - (size_t)at, "%s%s",
                               i ? ", " : "", keys[i]);
            return why;
        }
        const char *v = eq + 1;
        if (!set(user, k, v)) {
            snprintf(why, n, "'%s=%s': bad value", keys[k], v);
            return why;
        }
        seen |= 1u << k;
    }
    for (int k = 0; k < nkeys; k++)
        if (!(seen & (1u << k))) {
            snprintf(why, n, "%s= is missing", keys[k]);
            return why;
        }
    return NULL;
}

int fz_shrink(const fz_cases_t *kind, wna16_context_t *ctx, void *c,
              wna16_target_t target, char *msg, size_t n, bool verbose)
{
    unsigned char *cand = malloc(FZ_MAX_CANDIDATES * kind->case_size);
    if (!cand) {
        fprintf(stderr, "wna16 fuzz: out of memory: the case is not shrunk\n");
        return 0;
    }
    int steps = 0;
    char m[1024];
    while (steps < kind->max_steps) {
        int k = kind->candidates(c, cand), i = 0;
        for (; i < k; i++)
            if (kind->run(ctx, cand + (size_t)i * kind->case_size, target, m,
                          sizeof m) == FZ_FAILED)
                break;
        if (i == k)
            break;
        memcpy(c, cand + (size_t)i * kind->case_size, kind->case_size);
        snprintf(msg, n, "%s", m);
        steps++;
        if (verbose) {
            char t[FZ_TEXT];
            kind->text(c, t, sizeof t);
            fprintf(stderr, "  shrunk: %s\n", t);
        }
    }
    free(cand);
    return steps;
}

int fz_report_failure(const fz_cases_t *kind, wna16_context_t *ctx,
                      const fz_opts_t *o, void *c, char *msg, size_t n,
                      fz_report_t *rep)
{
    char text[FZ_TEXT];
    kind->text(c, text, sizeof text);
    fprintf(o->out, "FAIL %s\n     %s\n", text, msg);
    snprintf(rep->failed, sizeof rep->failed, "%s", text);
    if (o->shrink) {
        fprintf(stderr, "wna16 fuzz: shrinking the failing case...\n");
        int steps = fz_shrink(kind, ctx, c, o->target, msg, n, o->verbose);
        kind->text(c, text, sizeof text);
        if (steps)
            fprintf(o->out, "shrunk in %d step%s:\nFAIL %s\n     %s\n",
                    steps, steps == 1 ? "" : "s", text, msg);
    }
    snprintf(rep->shrunk, sizeof rep->shrunk, "%s", text);
    snprintf(rep->message, sizeof rep->message, "%s", msg);
    snprintf(rep->reproduce, sizeof rep->reproduce, "wna16 fuzz%s --target "
             "%s%s --case '%s'", kind->options, wna16_target_name(o->target),
             o->inject_fault ? " --inject-fault" : "", text);
    fprintf(o->out, "reproduce: %s\n", rep->reproduce);
    fflush(o->out);
    return CLI_FAIL;
}

void fz_progress(const fz_opts_t *o, long done, bool tty)
{
    const long every = o->count >= 10 ? o->count / 10 : 1;
    if (done % every == 0 || done == o->count)
        fprintf(stderr, "%swna16 fuzz: %ld/%ld cases%s", tty ? "\r" : "",
                done, o->count, tty && done < o->count ? "" : "\n");
}
