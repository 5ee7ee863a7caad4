/*
 * run_io.c - the activations `wna16 run` feeds the layer and the output it
 * writes: random ones from a seed, or a safetensors file (--input) holding
 * hidden_states [M, H] (F16 or BF16), topk_ids [M, topk] (I32 or I64) and
 * topk_weights [M, topk] (F32, F16 or BF16), as vLLM's fused_moe receives
 * them; -o writes `output` [M, H] in the dtype of hidden_states, as
 * runtime/output.h says for each kind of path, with SIGINT, SIGTERM and
 * SIGHUP removing the temporary file while it is written.
 */
#define _POSIX_C_SOURCE 200809L
#include "run.h"
#include "runtime/output.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

static uint64_t next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

/* Uniform in [0, 1) with 24 bits. */
static float unit(uint64_t *s)
{
    return (float)(next(s) >> 40) * 0x1p-24f;
}

static uint16_t to_act(wna16_dtype_t d, float v)
{
    return d == WNA16_DTYPE_F16 ? wna16_f32_to_f16(v) : wna16_f32_to_bf16(v);
}

static int alloc_input(run_input_t *in, int32_t M, int32_t topk, int32_t H)
{
    size_t n = (size_t)M * (size_t)H, P = (size_t)M * (size_t)topk;
    in->M = M;
    in->topk = topk;
    in->hidden = malloc(n * sizeof *in->hidden);
    in->ids = malloc(P * sizeof *in->ids);
    in->weights = malloc(P * sizeof *in->weights);
    if (in->hidden && in->ids && in->weights)
        return CLI_OK;
    fprintf(stderr, "wna16: out of memory for %d tokens\n", M);
    return CLI_FAIL;
}

int run_input_random(const run_layer_t *L, int32_t M, uint64_t seed,
                     run_input_t *in)
{
    memset(in, 0, sizeof *in);
    if (L->topk > L->E) {
        fprintf(stderr, "wna16: top-%d routing needs at least %d experts; "
                "the layer has %d\n", L->topk, L->topk, L->E);
        return CLI_FAIL;
    }
    if (alloc_input(in, M, L->topk, L->H) != CLI_OK)
        return CLI_FAIL;
    in->dtype = L->act_dtype;
    snprintf(in->source, sizeof in->source, "random (seed %llu)",
             (unsigned long long)seed);
    uint64_t s = (seed + 1) * 0x9E3779B97F4A7C15ull | 1;
    for (size_t i = 0; i < (size_t)M * (size_t)L->H; i++)
        in->hidden[i] = to_act(in->dtype, 2.0f * unit(&s) - 1.0f);
    /* top-k distinct experts per token, weights positive, summing to 1
     * (a normalized top-k softmax, as Qwen3's norm_topk_prob) */
    for (int32_t m = 0; m < M; m++) {
        int32_t *ids = in->ids + (size_t)m * L->topk;
        float *w = in->weights + (size_t)m * L->topk, sum = 0.0f;
        for (int32_t j = 0; j < L->topk; j++) {
            bool dup;
            do {
                ids[j] = (int32_t)(next(&s) % (uint64_t)L->E);
                dup = false;
                for (int32_t i = 0; i < j; i++)
                    dup |= ids[i] == ids[j];
            } while (dup);
            w[j] = 0.1f + 0.9f * unit(&s);
            sum += w[j];
        }
        for (int32_t j = 0; j < L->topk; j++)
            w[j] /= sum;
    }
    return CLI_OK;
}

void run_input_free(run_input_t *in)
{
    free(in->hidden);
    free(in->ids);
    free(in->weights);
    memset(in, 0, sizeof *in);
}

int32_t run_input_experts(const run_input_t *in, int32_t E)
{
    bool *seen = calloc((size_t)E, 1);
    int32_t n = 0;
    if (!seen)
        return 0;
    for (size_t i = 0; i < (size_t)in->M * (size_t)in->topk; i++) {
        int32_t e = in->ids[i];
        if (e >= 0 && e < E && !seen[e]) {
            seen[e] = true;
            n++;
        }
    }
    free(seen);
    return n;
}

/* ---- --input ----------------------------------------------------------------- */

static const char want_text[] = "--input needs hidden_states [M, H] (F16 or "
                                "BF16), topk_ids [M, topk] (I32 or I64) and "
                                "topk_weights [M, topk] (F32, F16 or BF16)";

static void shape_text(const wna16_tensor_t *t, char *out, size_t n)
{
    size_t used = (size_t)snprintf(out, n, "%s [", wna16_dtype_name(t->dtype));
    for (int d = 0; d < t->ndim && used < n; d++)
        used += (size_t)snprintf(out + used, n - used, "%s%lld", d ? ", " : "",
                                 (long long)t->shape[d]);
    if (used < n)
        snprintf(out + used, n - used, "]");
}

/* The tensor `name`, 2-D, of one of `dtypes`, with rows and cols as given
 * (-1: any); names the file, the tensor and what it should be. */
static const wna16_tensor_t *find_2d(const wna16_safetensors_t *st,
                                     const char *path, const char *name,
                                     const wna16_dtype_t *dtypes, int n_dtypes,
                                     int64_t rows, int64_t cols,
                                     const char *want)
{
    const wna16_tensor_t *t = wna16_safetensors_find(st, name);
    if (!t) {
        fprintf(stderr, "wna16: %s: no tensor '%s' (%s)\n", path, name,
                want_text);
        return NULL;
    }
    bool dt = false;
    for (int i = 0; i < n_dtypes; i++)
        dt |= t->dtype == dtypes[i];
    if (!dt || t->ndim != 2 || (rows >= 0 && t->shape[0] != rows) ||
        (cols >= 0 && t->shape[1] != cols) || t->shape[0] < 1 ||
        t->shape[1] < 1 || t->shape[0] > (1 << 24)) {
        char have[160];
        shape_text(t, have, sizeof have);
        fprintf(stderr, "wna16: %s: tensor '%s' is %s; want %s\n", path, name,
                have, want);
        return NULL;
    }
    return t;
}

static int read_input(const wna16_safetensors_t *st, const char *path,
                      const run_layer_t *L, run_input_t *in)
{
    static const wna16_dtype_t act[] = {WNA16_DTYPE_F16, WNA16_DTYPE_BF16};
    static const wna16_dtype_t idt[] = {WNA16_DTYPE_I32, WNA16_DTYPE_I64};
    static const wna16_dtype_t wdt[] = {WNA16_DTYPE_F32, WNA16_DTYPE_F16,
                                        WNA16_DTYPE_BF16};
    char want[160];
    snprintf(want, sizeof want, "F16 or BF16 [M, %d] (M tokens, hidden %d)",
             L->H, L->H);
    const wna16_tensor_t *h = find_2d(st, path, "hidden_states", act, 2, -1,
                                      L->H, want);
    if (!h)
        return CLI_FAIL;
    /* vLLM runs a layer in its model's dtype; the library refuses the
     * other one, so say here what the command line can do about it. */
    if (L->act_dtype && h->dtype != L->act_dtype) {
        bool bf = h->dtype == WNA16_DTYPE_BF16;
        fprintf(stderr, "wna16: %s: tensor 'hidden_states' is %s, the model's "
                "dtype is %s (the layer runs in it, as vLLM's does): give %s "
                "activations, or run the layer in %s with --dtype %s\n", path,
                wna16_dtype_name(h->dtype), wna16_dtype_name(L->act_dtype),
                wna16_dtype_name(L->act_dtype), bf ? "bfloat16" : "float16",
                bf ? "bfloat16" : "float16");
        return CLI_FAIL;
    }
    int32_t M = (int32_t)h->shape[0];
    snprintf(want, sizeof want, "I32 or I64 [%d, topk] with topk 1 to %d "
             "(the layer's experts)", M, L->E);
    const wna16_tensor_t *ids = find_2d(st, path, "topk_ids", idt, 2, M, -1,
                                        want);
    if (!ids)
        return CLI_FAIL;
    if (ids->shape[1] > L->E) {
        fprintf(stderr, "wna16: %s: tensor 'topk_ids' routes each token to "
                "%lld experts; the layer has %d\n", path,
                (long long)ids->shape[1], L->E);
        return CLI_FAIL;
    }
    int32_t topk = (int32_t)ids->shape[1];
    snprintf(want, sizeof want, "F32, F16 or BF16 [%d, %d] (as topk_ids)", M,
             topk);
    const wna16_tensor_t *w = find_2d(st, path, "topk_weights", wdt, 3, M, topk,
                                      want);
    if (!w || alloc_input(in, M, topk, L->H) != CLI_OK)
        return CLI_FAIL;
    in->dtype = h->dtype;
    memcpy(in->hidden, h->data, h->nbytes); /* the map may be unaligned */
    const uint8_t *ib = ids->data, *wb = w->data;
    for (size_t i = 0; i < (size_t)M * (size_t)topk; i++) {
        int64_t v;
        if (ids->dtype == WNA16_DTYPE_I64) {
            memcpy(&v, ib + 8 * i, 8);
        } else {
            int32_t v32;
            memcpy(&v32, ib + 4 * i, 4);
            v = v32;
        }
        if (v < 0 || v >= L->E) {
            fprintf(stderr, "wna16: %s: topk_ids[%zu][%zu] = %lld is not an "
                    "expert of the layer (0 to %d)\n", path,
                    i / (size_t)topk, i % (size_t)topk, (long long)v, L->E - 1);
            return CLI_FAIL;
        }
        in->ids[i] = (int32_t)v;
        uint16_t u;
        switch (w->dtype) {
        case WNA16_DTYPE_F32: memcpy(&in->weights[i], wb + 4 * i, 4); break;
        case WNA16_DTYPE_F16:
            memcpy(&u, wb + 2 * i, 2);
            in->weights[i] = wna16_f16_to_f32(u);
            break;
        default:
            memcpy(&u, wb + 2 * i, 2);
            in->weights[i] = wna16_bf16_to_f32(u);
            break;
        }
    }
    return CLI_OK;
}

int run_input_read(wna16_context_t *ctx, const char *path,
                   const run_layer_t *L, run_input_t *in)
{
    wna16_error_t err;
    wna16_safetensors_t *st = NULL;
    memset(in, 0, sizeof *in);
    if (wna16_safetensors_open(ctx, path, &st, &err) != WNA16_OK)
        return cli_fail(&err);
    int rc = read_input(st, path, L, in);
    wna16_safetensors_close(st);
    if (rc != CLI_OK)
        run_input_free(in);
    else
        snprintf(in->source, sizeof in->source, "%s", path);
    return rc;
}

/* ---- -o ---------------------------------------------------------------------- */

/* SIGINT, SIGTERM and SIGHUP remove the output's temporary, then end the
 * process as they would have; a signal ignored when we started stays
 * ignored. */
static void catch_signals(void)
{
    static const int sigs[] = {SIGINT, SIGTERM, SIGHUP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction old, sa = {.sa_handler = w16_output_on_signal,
                                    .sa_flags = SA_RESETHAND};
        sigemptyset(&sa.sa_mask);
        if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN)
            sigaction(sigs[i], &sa, NULL);
    }
}

int run_output_write(wna16_context_t *ctx, const char *path,
                     const run_input_t *in, int32_t H, const void *out,
                     const char *backend, const char *target)
{
    wna16_error_t err;
    wna16_tensor_set_t *set = NULL;
    wna16_tensor_t t = {.name = "output", .dtype = in->dtype, .ndim = 2,
                        .shape = {in->M, H}, .data = (void *)(uintptr_t)out,
                        .nbytes = (size_t)in->M * (size_t)H * 2};
    static const char *const keys[] = {"format", "generator", "backend",
                                       "target"};
    const char *vals[] = {"pt", "wna16 run", backend, target};
    wna16_status_t st = wna16_tensor_set_create(ctx, &set, &err);
    if (st == WNA16_OK)
        st = wna16_tensor_set_add_view(set, &t, &err);
    if (st == WNA16_OK) {
        catch_signals();
        st = wna16_safetensors_write_set(ctx, path, set, 4, keys, vals, &err);
    }
    wna16_tensor_set_destroy(set);
    return st == WNA16_OK ? CLI_OK : cli_fail(&err);
}
