/*
 * run_io_check.c - the files around `wna16 run --input X -o Y`, for the
 * CLI tests (tests/cli/CMakeLists.txt):
 *
 *   run_io_check make X.safetensors H E TOPK M F16|BF16 [VARIANT]
 *       writes hidden_states [M, H], topk_ids [M, TOPK] (I32; I64 with
 *       VARIANT i64) and topk_weights [M, TOPK] F32 from a fixed seed;
 *       the other VARIANTs break one thing: no_ids (topk_ids missing),
 *       wide (hidden_states [M, H + 1]), bad_id (topk_ids[0][1] = E),
 *       nan (hidden_states[2][5] = NaN), inf_weight (topk_weights[1][0] =
 *       +Inf)
 *   run_io_check check CHECKPOINT X.safetensors Y.safetensors
 *       reads Y's `output` and checks it has X's dtype and shape [M, H]
 *       and matches the reference MoE of the checkpoint's first layer on
 *       X (decoded here with the reference, independently of wna16 run):
 *       max |output - reference| <= 2^-5 max |reference|
 *   run_io_check json OUT.json
 *       checks that OUT.json (stdout of `wna16 run --json`) is exactly one
 *       JSON object with the figures: "ok" true, the finite numbers
 *       max_abs_error, max_rel_error, cached_ms and bandwidth_gbs (the
 *       errors within the run's tolerance 2^-5, the time and bandwidth
 *       positive), cold_compile_ms (a number, or null on a kernel cache
 *       hit), "target" and "backend" strings and a "passed_over" array
 *
 * Prints what it did; exits 0 on success, 1 otherwise.
 */
#include "wna16.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static int fail(const char *what, const wna16_error_t *err)
{
    printf("run_io_check: %s: %s\n", what, err ? err->message : "");
    return 1;
}

static int make(wna16_context_t *ctx, int argc, char **argv)
{
    if (argc < 8)
        return fail("make X H E TOPK M F16|BF16 [VARIANT]", NULL);
    const char *path = argv[2], *variant = argc > 8 ? argv[8] : "ok";
    int64_t H = atoi(argv[3]), E = atoi(argv[4]), K = atoi(argv[5]),
            M = atoi(argv[6]);
    wna16_dtype_t dt = strcmp(argv[7], "F16") == 0 ? WNA16_DTYPE_F16
                                                    : WNA16_DTYPE_BF16;
    bool i64 = strcmp(variant, "i64") == 0;
    int64_t HW = strcmp(variant, "wide") == 0 ? H + 1 : H;
    wna16_tensor_set_t *set = NULL;
    wna16_tensor_t *h, *ids, *w;
    wna16_error_t err;
    int64_t hs[2] = {M, HW}, ks[2] = {M, K};
    if (wna16_tensor_set_create(ctx, &set, &err) ||
        wna16_tensor_set_add_new(set, "hidden_states", dt, 2, hs, &h, &err) ||
        wna16_tensor_set_add_new(set, "topk_weights", WNA16_DTYPE_F32, 2, ks,
                                 &w, &err) ||
        (strcmp(variant, "no_ids") != 0 &&
         wna16_tensor_set_add_new(set, "topk_ids",
                                  i64 ? WNA16_DTYPE_I64 : WNA16_DTYPE_I32, 2,
                                  ks, &ids, &err)))
        return fail("make", &err);
    uint64_t s = 42;
    uint16_t *hv = h->data;
    for (int64_t i = 0; i < M * HW; i++) {
        float v = (float)(next(&s) >> 40) * 0x1p-23f - 1.0f;
        hv[i] = dt == WNA16_DTYPE_F16 ? wna16_f32_to_f16(v)
                                      : wna16_f32_to_bf16(v);
    }
    if (strcmp(variant, "nan") == 0 && M > 2 && HW > 5)
        hv[2 * HW + 5] = dt == WNA16_DTYPE_F16 ? 0x7e00 : 0x7fc0;
    float *wv = w->data;
    for (int64_t m = 0; m < M; m++)
        for (int64_t j = 0; j < K; j++) {
            int64_t id = (m + j) % E; /* distinct per token for K <= E */
            if (strcmp(variant, "bad_id") == 0 && m == 0 && j == 1)
                id = E;
            wv[m * K + j] = strcmp(variant, "inf_weight") == 0 && m == 1 &&
                                    j == 0
                                ? INFINITY
                                : 1.0f / (float)K;
            if (strcmp(variant, "no_ids") == 0)
                continue;
            if (i64)
                ((int64_t *)ids->data)[m * K + j] = id;
            else
                ((int32_t *)ids->data)[m * K + j] = (int32_t)id;
        }
    if (wna16_safetensors_write_set(ctx, path, set, 0, NULL, NULL, &err))
        return fail("make", &err);
    wna16_tensor_set_destroy(set);
    printf("run_io_check: wrote %s (%s)\n", path, variant);
    return 0;
}

/* The first MoE layer of the checkpoint in logical form. */
static int load_layer(wna16_context_t *ctx, const char *path,
                      wna16_qlayer_t *L)
{
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    wna16_tensor_set_t *set = NULL;
    wna16_moe_layers_t layers = {0};
    wna16_quant_desc_t q;
    if (wna16_checkpoint_open(ctx, path, &ck, &err))
        return fail("check", &err);
    const wna16_model_config_t *cfg = wna16_checkpoint_config(ck);
    const wna16_spec_t *fmt =
        cfg ? wna16_spec_find(ctx, WNA16_SPEC_FORMAT, cfg->format_name) : NULL;
    int rc = 1;
    if (!fmt || wna16_model_config_quant(cfg, &q, &err) ||
        wna16_checkpoint_moe_layers(ctx, ck, fmt, &layers, &err) ||
        layers.count == 0 || wna16_tensor_set_create(ctx, &set, &err)) {
        fail("check: reading the checkpoint", &err);
        goto out;
    }
    for (size_t i = 0; i < wna16_checkpoint_tensor_count(ck); i++)
        if (wna16_tensor_set_add_view(set, wna16_checkpoint_tensor_at(ck, i),
                                      &err)) {
            fail("check", &err);
            goto out;
        }
    q.bias = wna16_checkpoint_layer_has_bias(ck, fmt, layers.prefixes[0]);
    if (wna16_ref_decode(ctx, fmt, set, layers.prefixes[0], cfg->num_experts,
                         cfg->hidden_size, cfg->moe_intermediate_size, &q, L,
                         &err)) {
        fail("check: decoding", &err);
        goto out;
    }
    rc = 0;
out:
    wna16_moe_layers_free(&layers);
    wna16_tensor_set_destroy(set);
    wna16_checkpoint_close(ck);
    return rc;
}

static double act(wna16_dtype_t d, const void *p, size_t i)
{
    uint16_t v;
    memcpy(&v, (const uint8_t *)p + 2 * i, 2);
    return d == WNA16_DTYPE_F16 ? wna16_f16_to_f32(v) : wna16_bf16_to_f32(v);
}

static int check(wna16_context_t *ctx, int argc, char **argv)
{
    if (argc < 5)
        return fail("check CHECKPOINT X Y", NULL);
    wna16_error_t err;
    wna16_qlayer_t L;
    if (load_layer(ctx, argv[2], &L))
        return 1;
    wna16_safetensors_t *x = NULL, *y = NULL;
    if (wna16_safetensors_open(ctx, argv[3], &x, &err) ||
        wna16_safetensors_open(ctx, argv[4], &y, &err))
        return fail("check", &err);
    const wna16_tensor_t *h = wna16_safetensors_find(x, "hidden_states");
    const wna16_tensor_t *ids = wna16_safetensors_find(x, "topk_ids");
    const wna16_tensor_t *w = wna16_safetensors_find(x, "topk_weights");
    const wna16_tensor_t *o = wna16_safetensors_find(y, "output");
    if (!h || !ids || !w || !o)
        return fail("check: a tensor is missing", NULL);
    int32_t M = (int32_t)h->shape[0], K = (int32_t)ids->shape[1];
    if (o->dtype != h->dtype || o->ndim != 2 || o->shape[0] != M ||
        o->shape[1] != L.H) {
        printf("run_io_check: output is %s [%lld, %lld]; want %s [%d, %d]\n",
               wna16_dtype_name(o->dtype), (long long)o->shape[0],
               (long long)(o->ndim > 1 ? o->shape[1] : 0),
               wna16_dtype_name(h->dtype), M, L.H);
        return 1;
    }
    size_t P = (size_t)M * (size_t)K, n = (size_t)M * (size_t)L.H;
    int32_t *id32 = malloc(P * 4);
    float *wf = malloc(P * 4);
    void *hid = malloc(n * 2), *ref = malloc(n * 2);
    for (size_t i = 0; i < P; i++) {
        int64_t v = 0;
        memcpy(&v, (const uint8_t *)ids->data + i * wna16_dtype_size(ids->dtype),
               wna16_dtype_size(ids->dtype));
        id32[i] = (int32_t)v;
        memcpy(&wf[i], (const uint8_t *)w->data + 4 * i, 4);
    }
    memcpy(hid, h->data, n * 2);
    wna16_moe_params_t p;
    wna16_moe_params_init(&p);
    p.act_dtype = h->dtype;
    if (wna16_ref_moe(&L, &p, hid, M, id32, wf, K, ref, &err))
        return fail("check: reference", &err);
    double dmax = 0, rmax = 0;
    for (size_t i = 0; i < n; i++) {
        double r = act(h->dtype, ref, i);
        dmax = fmax(dmax, fabs(act(o->dtype, o->data, i) - r));
        rmax = fmax(rmax, fabs(r));
    }
    bool ok = rmax > 0 && dmax <= rmax * 0x1p-5;
    printf("run_io_check: output %s [%d, %d] %s the reference: max |output - "
           "reference| %.3g of max |reference| %.3g\n",
           wna16_dtype_name(o->dtype), M, L.H, ok ? "matches" : "DIFFERS FROM",
           dmax, rmax);
    free(id32);
    free(wf);
    free(hid);
    free(ref);
    wna16_safetensors_close(x);
    wna16_safetensors_close(y);
    wna16_qlayer_free(&L);
    return ok ? 0 : 1;
}

/* ---- json ---------------------------------------------------------------- */

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *b = realloc(buf, 2 * cap + 1);
            if (!b) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = b;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    return buf;
}

/* A finite number under `key`, above `lo` (exclusive when `strict`). */
static bool number(const cJSON *o, const char *key, double lo, bool strict,
                   double *v)
{
    const cJSON *n = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(n) || !isfinite(n->valuedouble) ||
        (strict ? n->valuedouble <= lo : n->valuedouble < lo)) {
        printf("run_io_check: \"%s\" is not a number %s %g\n", key,
               strict ? ">" : ">=", lo);
        return false;
    }
    *v = n->valuedouble;
    return true;
}

/* cold_compile_ms: a number when kernels were compiled, null on a kernel
 * cache hit (-1 then). */
static bool cold_compile(const cJSON *o, double *v)
{
    const cJSON *hit = cJSON_GetObjectItemCaseSensitive(o, "cache_hit");
    if (!cJSON_IsBool(hit)) {
        printf("run_io_check: \"cache_hit\" is not a boolean\n");
        return false;
    }
    if (!cJSON_IsTrue(hit))
        return number(o, "cold_compile_ms", 0, false, v);
    *v = -1;
    if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(o, "cold_compile_ms")))
        return true;
    printf("run_io_check: \"cold_compile_ms\" is not null on a cache hit\n");
    return false;
}

static int json(int argc, char **argv)
{
    if (argc < 3)
        return fail("json OUT.json", NULL);
    char *text = slurp(argv[2]);
    if (!text)
        return fail("json: cannot read the file", NULL);
    const char *end = NULL;
    cJSON *o = cJSON_ParseWithOpts(text, &end, 1);
    int rc = 1;
    double abs_e, rel_e, cold, cached, gbs;
    const cJSON *target = cJSON_GetObjectItemCaseSensitive(o, "target");
    const cJSON *backend = cJSON_GetObjectItemCaseSensitive(o, "backend");
    if (!cJSON_IsObject(o)) {
        printf("run_io_check: %s is not one JSON object (parse stops at "
               "offset %td)\n", argv[2], end ? end - text : (ptrdiff_t)-1);
    } else if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "ok"))) {
        printf("run_io_check: \"ok\" is not true\n");
    } else if (!cJSON_IsString(target) || !cJSON_IsString(backend) ||
               !cJSON_IsArray(cJSON_GetObjectItemCaseSensitive(o,
                                                              "passed_over"))) {
        printf("run_io_check: \"target\", \"backend\" (strings) or "
               "\"passed_over\" (an array) missing\n");
    } else if (number(o, "max_abs_error", 0, false, &abs_e) &&
               number(o, "max_rel_error", 0, false, &rel_e) &&
               cold_compile(o, &cold) &&
               number(o, "cached_ms", 0, true, &cached) &&
               number(o, "bandwidth_gbs", 0, true, &gbs)) {
        if (rel_e > 0x1p-5) {
            printf("run_io_check: max_rel_error %g above 2^-5\n", rel_e);
        } else {
            char cc[64] = "none (kernel cache hit)";
            if (cold >= 0)
                snprintf(cc, sizeof cc, "%g ms", cold);
            printf("run_io_check: one JSON object: target %s, backend %s, "
                   "max abs error %g, max rel error %g, cold compile %s, "
                   "cached %g ms, %g GB/s\n", target->valuestring,
                   backend->valuestring, abs_e, rel_e, cc, cached, gbs);
            rc = 0;
        }
    }
    cJSON_Delete(o);
    free(text);
    return rc;
}

int main(int argc, char **argv)
{
    wna16_context_t *ctx = NULL;
    wna16_error_t err;
    if (wna16_context_create(NULL, &ctx, &err))
        return fail("context", &err);
    int rc = argc > 1 && strcmp(argv[1], "make") == 0    ? make(ctx, argc, argv)
             : argc > 1 && strcmp(argv[1], "check") == 0 ? check(ctx, argc, argv)
             : argc > 1 && strcmp(argv[1], "json") == 0  ? json(argc, argv)
                                                  : fail("make, check or json", NULL);
    wna16_context_destroy(ctx);
    return rc;
}
