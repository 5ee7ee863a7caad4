/*
 * test_spec_load.c - loading and validating specs. (i) Every built-in spec
 * passes the full layout check on all its samples, and every JSON file in
 * specs/formats and specs/backends passes wna16_spec_validate_file. (ii) A
 * layout written only as JSON (tests/data/specs/backends/kmajor_i8.json: int8
 * codes K-major with an interleave table on N, float32 scales, uint8 zeros)
 * loads, validates and round-trips a random layer through the reference
 * (wna16_ref_encode then wna16_ref_decode give back the same codes, scales
 * and zeros) with no C change, and its stored bytes match the layout's
 * definition computed here by hand. (iii) A table of malformed specs, each a
 * small valid spec with one edit, must fail with WNA16_ESPEC and a message
 * that starts with the origin and names the JSON path and the problem.
 * Known bugs of gen/ found here are reported ("KNOWN BUG"), not failed.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "spec/spec.h"

#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int known_bug_hits;

#define KNOWN_BUG(cond, ...)                                                  \
    do {                                                                      \
        if (cond)                                                             \
            known_bug_hits++;                                                 \
        TU_CHECK_MSG(!(cond), __VA_ARGS__);                                   \
    } while (0)

/* ---- (i) built-in specs and the spec files ------------------------------- */

static void test_builtin_specs(void)
{
    wna16_context_t *ctx = tu_context();
    size_t n = wna16_spec_count(ctx);
    int formats = 0, backends = 0;
    TU_CHECK_MSG(n >= 12, "only %zu built-in specs", n);
    for (size_t i = 0; i < n; i++) {
        const wna16_spec_t *s = wna16_spec_at(ctx, i);
        wna16_error_t err = {0};
        TU_CHECK(s != NULL);
        if (!s)
            continue;
        TU_CHECK_MSG(strncmp(wna16_spec_origin(s), "builtin:specs/", 14) == 0,
                     "%s", wna16_spec_origin(s));
        TU_CHECK(s->n_samples >= 1);
        TU_OK(w16_spec_check_layouts(s, true, &err), &err);
        TU_CHECK(wna16_spec_find(ctx, wna16_spec_kind(s), wna16_spec_name(s))
                 == s);
        formats += wna16_spec_kind(s) == WNA16_SPEC_FORMAT;
        backends += wna16_spec_kind(s) == WNA16_SPEC_BACKEND;
    }
    TU_CHECK(wna16_spec_at(ctx, n) == NULL);
    TU_CHECK(formats >= 4 && backends >= 8);
    printf("built-in specs: %zu (%d formats, %d backends) pass the full "
           "layout check\n", n, formats, backends);

    int files = 0;
    static const char *const dirs[] = {"formats", "backends"};
    for (int d = 0; d < 2; d++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/specs/%s", WNA16_SOURCE_DIR, dirs[d]);
        DIR *dh = opendir(dir);
        TU_CHECK_MSG(dh != NULL, "cannot open %s", dir);
        if (!dh)
            continue;
        struct dirent *de;
        while ((de = readdir(dh))) {
            size_t l = strlen(de->d_name);
            if (l < 6 || strcmp(de->d_name + l - 5, ".json") != 0)
                continue;
            char path[2048];
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            wna16_error_t err = {0};
            TU_OK(wna16_spec_validate_file(ctx, path, &err), &err);
            files++;
        }
        closedir(dh);
    }
    TU_CHECK(files == (int)n);
    printf("spec files: %d pass wna16_spec_validate_file\n", files);

    /* file API errors */
    wna16_error_t err = {0};
    TU_CHECK(wna16_spec_load_file(ctx, WNA16_TEST_DATA "/no/such.json", NULL,
                                  &err) == WNA16_EIO &&
             strstr(err.message, "no/such.json"));
    TU_CHECK(wna16_spec_validate_file(ctx, WNA16_TEST_DATA, &err) == WNA16_EIO
             && strstr(err.message, "not a regular file"));
    TU_CHECK(wna16_spec_load_file(NULL, "x", NULL, &err) == WNA16_EINVAL);
    TU_CHECK(wna16_spec_load_file(ctx, NULL, NULL, &err) == WNA16_EINVAL);
    TU_CHECK(wna16_spec_load_text(ctx, "o", NULL, 0, NULL, &err) ==
             WNA16_EINVAL);
    TU_CHECK(wna16_spec_validate_file(ctx, NULL, &err) == WNA16_EINVAL);
    TU_CHECK(wna16_spec_count(ctx) == n); /* nothing registered */
    wna16_context_destroy(ctx);
}

/* ---- (ii) a layout written only as JSON --------------------------------- */

#define KMAJOR WNA16_TEST_DATA "/specs/backends/kmajor_i8.json"

static const int nperm[4] = {2, 0, 3, 1};

static void fill_random(wna16_qweight_t *qw, tu_rng_t *r)
{
    size_t enk = (size_t)qw->E * qw->N * qw->K;
    size_t egn = (size_t)qw->E * qw->G * qw->N;
    for (size_t i = 0; i < enk; i++)
        qw->codes[i] = (uint8_t)tu_rng_below(r, 256);
    for (size_t i = 0; i < egn; i++) {
        /* exactly representable in fp16: m * 2^-10, |m| < 2048 */
        float m = (float)(1 + tu_rng_below(r, 2047));
        qw->scales[i] = (tu_rng_below(r, 2) ? m : -m) / 1024.0f;
        if (qw->zeros)
            qw->zeros[i] = (uint8_t)tu_rng_below(r, 256);
    }
    qw->scale_dtype = WNA16_DTYPE_F32;
}

static bool same_qweight(const wna16_qweight_t *a, const wna16_qweight_t *b)
{
    if (a->E != b->E || a->N != b->N || a->K != b->K || a->G != b->G ||
        a->bits != b->bits || a->group_size != b->group_size ||
        !a->zeros != !b->zeros)
        return false;
    size_t enk = (size_t)a->E * a->N * a->K, egn = (size_t)a->E * a->G * a->N;
    if (memcmp(a->codes, b->codes, enk) != 0)
        return false;
    for (size_t i = 0; i < egn; i++)
        if (a->scales[i] != b->scales[i] ||
            (a->zeros && a->zeros[i] != b->zeros[i]))
            return false;
    return true;
}

/* Checks the stored tensors of one operand against the layout by hand:
 * qweight[e][k][4*(n/4) + NPERM[n%4]] = (int8)(code - 128), scales and
 * zeros [e][g][n]. Returns the number of bytes checked. */
static long check_stored(const wna16_tensor_set_t *ts, const char *op,
                         const wna16_qweight_t *qw)
{
    char name[128];
    long checked = 0;
    snprintf(name, sizeof name, "model.layers.0.mlp.experts.%s_qweight", op);
    const wna16_tensor_t *t = wna16_tensor_set_find(ts, name);
    TU_CHECK_MSG(t != NULL, "%s missing", name);
    if (!t)
        return 0;
    TU_CHECK(t->dtype == WNA16_DTYPE_I8 && t->ndim == 3 &&
             t->shape[0] == qw->E && t->shape[1] == qw->K &&
             t->shape[2] == qw->N);
    const int8_t *q = t->data;
    int bad = 0;
    for (int32_t e = 0; e < qw->E; e++)
        for (int32_t n = 0; n < qw->N; n++)
            for (int32_t k = 0; k < qw->K; k++) {
                int32_t pos = 4 * (n / 4) + nperm[n % 4];
                int8_t got = q[((size_t)e * qw->K + k) * qw->N + pos];
                int want = (int)qw->codes[((size_t)e * qw->N + n) * qw->K + k]
                           - 128;
                bad += got != want;
                checked++;
            }
    TU_CHECK_MSG(bad == 0, "%s: %d bytes differ from the definition", name,
                 bad);
    snprintf(name, sizeof name, "model.layers.0.mlp.experts.%s_scales", op);
    t = wna16_tensor_set_find(ts, name);
    TU_CHECK(t && t->dtype == WNA16_DTYPE_F32 && t->ndim == 3 &&
             t->shape[1] == qw->G && t->shape[2] == qw->N);
    if (t)
        TU_CHECK(memcmp(t->data, qw->scales,
                        sizeof(float) * (size_t)qw->E * qw->G * qw->N) == 0);
    snprintf(name, sizeof name, "model.layers.0.mlp.experts.%s_qzeros", op);
    t = wna16_tensor_set_find(ts, name);
    TU_CHECK(!qw->zeros == !t);
    if (t && qw->zeros)
        TU_CHECK(t->dtype == WNA16_DTYPE_U8 &&
                 memcmp(t->data, qw->zeros, (size_t)qw->E * qw->G * qw->N) ==
                     0);
    return checked;
}

static void test_json_only_layout(void)
{
    wna16_context_t *ctx = tu_context();
    wna16_error_t err = {0};
    size_t before = wna16_spec_count(ctx);
    TU_OK(wna16_spec_validate_file(ctx, KMAJOR, &err), &err);
    const wna16_spec_t *spec = NULL;
    TU_OK(wna16_spec_load_file(ctx, KMAJOR, &spec, &err), &err);
    if (!spec) {
        wna16_context_destroy(ctx);
        return;
    }
    TU_CHECK(wna16_spec_count(ctx) == before + 1);
    TU_CHECK(wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "kmajor_i8") == spec);
    TU_CHECK(strcmp(wna16_spec_origin(spec), KMAJOR) == 0);
    TU_OK(w16_spec_check_layouts(spec, true, &err), &err);

    /* A few stored bytes by hand, from the definition in the JSON. */
    {
        wna16_qlayer_t L = {.E = 1, .H = 4, .I = 4};
        TU_OK(wna16_qweight_alloc(&L.w13, 1, 8, 4, 8, -1, false, false, false,
                                  &err), &err);
        TU_OK(wna16_qweight_alloc(&L.w2, 1, 4, 4, 8, -1, false, false, false,
                                  &err), &err);
        for (int n = 0; n < 8; n++)
            for (int k = 0; k < 4; k++)
                L.w13.codes[n * 4 + k] = (uint8_t)(16 * n + k);
        L.w13.scales[0] = 1.0f;
        L.w2.scales[0] = 1.0f;
        wna16_tensor_set_t *ts = NULL;
        TU_OK(wna16_tensor_set_create(ctx, &ts, &err), &err);
        TU_OK(wna16_ref_encode(ctx, spec, &L, "", ts, &err), &err);
        const wna16_tensor_t *t = wna16_tensor_set_find(ts, "w13_qweight");
        TU_CHECK(t && t->shape[1] == 4 && t->shape[2] == 8);
        if (t) {
            const uint8_t *b = t->data;
            /* (k=0, n=0) -> position NPERM[0] = 2: code 0 stored as 0x80 */
            TU_CHECK(b[2] == 0x80);
            /* (k=0, n=1) -> position 0: code 16 -> 0x90 (int8 -112) */
            TU_CHECK(b[0] == 0x90);
            /* (k=0, n=2) -> position 3: code 32 -> 0xa0 */
            TU_CHECK(b[3] == 0xa0);
            /* (k=0, n=3) -> position 1: code 48 -> 0xb0 */
            TU_CHECK(b[1] == 0xb0);
            /* (k=1, n=5) -> row 1, position 4 + 0 = 4: code 81 -> 0xd1 */
            TU_CHECK(b[8 + 4] == 0xd1);
            /* (k=3, n=7) -> row 3, position 4 + 1 = 5: code 115 -> 0xf3 */
            TU_CHECK(b[24 + 5] == 0xf3);
        }
        wna16_tensor_set_destroy(ts);
        wna16_qlayer_free(&L);
    }

    /* Random layers round-trip exactly. */
    static const struct { int32_t E, H, I, gs; bool zp; } cases[] = {
        {3, 64, 48, 16, true}, {2, 32, 20, -1, false}, {1, 128, 64, 64, true},
        {2, 16, 8, 8, true},   {1, 4, 2, -1, true},
    };
    tu_rng_t r;
    tu_rng_seed(&r, 7);
    long bytes = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        wna16_qlayer_t L = {.E = cases[c].E, .H = cases[c].H, .I = cases[c].I};
        TU_OK(wna16_qweight_alloc(&L.w13, L.E, 2 * L.I, L.H, 8, cases[c].gs,
                                  cases[c].zp, false, false, &err), &err);
        TU_OK(wna16_qweight_alloc(&L.w2, L.E, L.H, L.I, 8, cases[c].gs,
                                  cases[c].zp, false, false, &err), &err);
        fill_random(&L.w13, &r);
        fill_random(&L.w2, &r);
        wna16_tensor_set_t *ts = NULL;
        TU_OK(wna16_tensor_set_create(ctx, &ts, &err), &err);
        const char *prefix = "model.layers.0.mlp.experts";
        TU_OK(wna16_ref_encode(ctx, spec, &L, prefix, ts, &err), &err);
        TU_CHECK(wna16_tensor_set_count(ts) == (cases[c].zp ? 6u : 4u));
        bytes += check_stored(ts, "w13", &L.w13);
        bytes += check_stored(ts, "w2", &L.w2);
        wna16_quant_desc_t q = {.bits = 8, .group_size = cases[c].gs,
                                .zero_point = cases[c].zp};
        wna16_qlayer_t back = {0};
        TU_OK(wna16_ref_decode(ctx, spec, ts, prefix, L.E, L.H, L.I, &q, &back,
                               &err), &err);
        TU_CHECK_MSG(same_qweight(&L.w13, &back.w13) &&
                     same_qweight(&L.w2, &back.w2), "case %zu does not "
                     "round-trip", c);
        TU_CHECK(back.w13.scale_dtype == WNA16_DTYPE_F32);
        wna16_qlayer_free(&back);
        wna16_tensor_set_destroy(ts);
        wna16_qlayer_free(&L);
    }
    printf("kmajor_i8 (JSON only): %zu random layers round-trip, %ld stored "
           "codes checked by hand\n", sizeof cases / sizeof cases[0], bytes);

    /* What the layout cannot hold is refused with the spec's reasons. */
    {
        wna16_qlayer_t L = {.E = 1, .H = 30, .I = 8};
        TU_OK(wna16_qweight_alloc(&L.w13, 1, 16, 30, 8, -1, false, false,
                                  false, &err), &err);
        TU_OK(wna16_qweight_alloc(&L.w2, 1, 30, 8, 8, -1, false, false, false,
                                  &err), &err);
        wna16_tensor_set_t *ts = NULL;
        TU_OK(wna16_tensor_set_create(ctx, &ts, &err), &err);
        TU_CHECK(wna16_ref_encode(ctx, spec, &L, "", ts, &err) ==
                     WNA16_EUNSUPPORTED &&
                 strstr(err.message, "interleaved in groups of four"));
        wna16_qlayer_free(&L);
        TU_OK(wna16_qweight_alloc(&L.w13, 1, 16, 32, 4, -1, false, false,
                                  false, &err), &err);
        TU_OK(wna16_qweight_alloc(&L.w2, 1, 32, 8, 4, -1, false, false, false,
                                  &err), &err);
        L.H = 32;
        TU_CHECK(wna16_ref_encode(ctx, spec, &L, "", ts, &err) ==
                     WNA16_EUNSUPPORTED &&
                 strstr(err.message, "4-bit"));
        wna16_qlayer_free(&L);
        wna16_tensor_set_destroy(ts);
    }
    wna16_context_destroy(ctx);

    /* The same file is found through a spec directory. */
    wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR,
                                 .spec_dir = WNA16_TEST_DATA "/specs",
                                 .no_builtin_specs = true};
    ctx = NULL;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (ctx) {
        TU_CHECK(wna16_spec_count(ctx) >= 1 &&
                 wna16_spec_find(ctx, 0, "kmajor_i8") != NULL);
        wna16_context_destroy(ctx);
    }
}

/* ---- (iii) malformed specs ------------------------------------------------ */

static const char base_backend[] =
    "{\n"
    "  \"wna16_spec\": 1,\n"
    "  \"kind\": \"backend\",\n"
    "  \"name\": \"tiny\",\n"
    "  \"title\": \"Tiny\",\n"
    "  \"tables\": { \"P\": [1, 0] },\n"
    "  \"capabilities\": {\n"
    "    \"bits\": [4],\n"
    "    \"group_sizes\": [32, -1],\n"
    "    \"zero_points\": true,\n"
    "    \"bias\": false,\n"
    "    \"act_order\": false,\n"
    "    \"activations\": [\"silu\"],\n"
    "    \"platforms\": [\"cuda\"],\n"
    "    \"min_cc\": 75\n"
    "  },\n"
    "  \"layouts\": {\n"
    "    \"qweight\": {\n"
    "      \"dtype\": \"I32\",\n"
    "      \"shape\": [\"E\", \"N\", \"K / PF\"],\n"
    "      \"let\": { \"w\": \"k / PF\" },\n"
    "      \"index\": [\"e\", \"n\", \"w\"],\n"
    "      \"bit\": \"(k % PF) * BITS\",\n"
    "      \"coord\": { \"e\": \"i0\", \"n\": \"i1\", \"k\": \"i2 * PF + slot\" }\n"
    "    },\n"
    "    \"scales\": {\n"
    "      \"dtype\": [\"F16\", \"BF16\"],\n"
    "      \"shape\": [\"E\", \"G\", \"N\"],\n"
    "      \"index\": [\"e\", \"g\", \"n\"],\n"
    "      \"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"i2\" }\n"
    "    },\n"
    "    \"qzeros\": {\n"
    "      \"when\": \"ZP\",\n"
    "      \"dtype\": \"U8\",\n"
    "      \"code_bits\": \"8\",\n"
    "      \"shape\": [\"E\", \"G\", \"N\"],\n"
    "      \"index\": [\"e\", \"g\", \"2 * (n / 2) + P[n % 2]\"],\n"
    "      \"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"2 * (i2 / 2) + P[i2 % 2]\" }\n"
    "    }\n"
    "  },\n"
    "  \"rules\": [\n"
    "    { \"if\": \"K % PF != 0\", \"reason\": \"K packs in whole words\" }\n"
    "  ],\n"
    "  \"selection\": {\n"
    "    \"vllm_name\": \"TINY\",\n"
    "    \"by_name\": \"tiny\",\n"
    "    \"priority\": { \"cuda\": 3 },\n"
    "    \"gate\": [ { \"if\": \"MAY_BIAS\", \"reason\": \"no bias on {platform}\" } ],\n"
    "    \"kernels\": [\n"
    "      { \"name\": \"TinyExperts\",\n"
    "        \"rules\": [ { \"activation_not_in\": [\"silu\"], \"reason\": \"kernel does not support {activation} activation\" } ] }\n"
    "    ],\n"
    "    \"kernel_platforms\": [\"cuda\"]\n"
    "  },\n"
    "  \"samples\": [\n"
    "    { \"E\": 2, \"H\": 64, \"I\": 32, \"BITS\": 4, \"GS\": 32, \"ZP\": 1 }\n"
    "  ]\n"
    "}\n";

static const char base_format[] =
    "{\n"
    "  \"wna16_spec\": 1,\n"
    "  \"kind\": \"format\",\n"
    "  \"name\": \"tinyfmt\",\n"
    "  \"config\": { \"quant_method\": [\"tinyfmt\"] },\n"
    "  \"projections\": { \"gate\": [\"gate_proj\"], \"up\": [\"up_proj\"], \"down\": [\"down_proj\"] },\n"
    "  \"capabilities\": { \"bits\": [4, 8], \"group_sizes\": \"any\", \"zero_points\": false, \"bias\": false, \"act_order\": false },\n"
    "  \"layouts\": {\n"
    "    \"qweight\": {\n"
    "      \"dtype\": \"I32\",\n"
    "      \"shape\": [\"K / PF\", \"N\"],\n"
    "      \"index\": [\"k / PF\", \"n\"],\n"
    "      \"bit\": \"(k % PF) * BITS\",\n"
    "      \"coord\": { \"n\": \"i1\", \"k\": \"i0 * PF + slot\" }\n"
    "    },\n"
    "    \"scales\": {\n"
    "      \"dtype\": \"F16\",\n"
    "      \"shape\": [\"G\", \"N\"],\n"
    "      \"index\": [\"g\", \"n\"],\n"
    "      \"coord\": { \"g\": \"i0\", \"n\": \"i1\" }\n"
    "    }\n"
    "  },\n"
    "  \"selection\": {\n"
    "    \"integration\": \"Tiny\",\n"
    "    \"errors\": [ { \"if\": \"BITS != 4\", \"reason\": \"4-bit only\" } ],\n"
    "    \"may_have_zp\": \"ZP\",\n"
    "    \"may_have_bias\": \"0\",\n"
    "    \"allow_tile_padding\": \"1\",\n"
    "    \"weight_key\": { \"bits\": \"BITS\", \"group32\": \"GS == 32\", \"asym\": \"0\" },\n"
    "    \"fallback\": { \"format\": \"moe_wna16\", \"if\": \"H % 128 != 0\", \"reason\": \"falls back\" }\n"
    "  },\n"
    "  \"samples\": [ { \"E\": 1, \"H\": 64, \"I\": 32, \"BITS\": 4, \"GS\": 32 } ]\n"
    "}\n";

enum { B, F };

/* One edit of a base spec: replace the only occurrence of `find` by
 * `repl` (find "*" replaces the whole text; NULL appends; "A\001B"
 * replaces from the only A through the first B after it). The load must
 * fail with WNA16_ESPEC and a message holding `path` and `want`. */
typedef struct bad_case {
    const char *name;
    int base;
    const char *find, *repl;
    const char *path, *want;
} bad_case_t;

#define DEEP40 "((((((((((((((((((((((((((((((((((((((((w))))))))))))))))))))))))))))))))))))))))"

static const bad_case_t bad_cases[] = {
    /* JSON syntax */
    {"json_missing_comma", B, "\"kind\": \"backend\",", "\"kind\": \"backend\"",
     "line 4", "not valid JSON"},
    {"json_trailing_comma", B, "\"min_cc\": 75", "\"min_cc\": 75,", "line 16",
     "not valid JSON"},
    {"json_empty", B, "*", "", "line 1", "not valid JSON"},
    /* bytes cJSON would take: a control character between tokens (not a
     * JSON space), one inside a string, invalid UTF-8, "01", \u0000 */
    {"json_control_between", B, "\"kind\": \"backend\",",
     "\"kind\":\v\"backend\",", "line 3", "(0x0b) is not valid in JSON "
     "text"},
    {"json_control_in_string", B, "\"kind\": \"backend\",",
     "\"kind\": \"back\x01" "end\",", "line 3", "(0x01) is not valid in JSON "
     "text"},
    {"json_bad_utf8", B, "\"kind\": \"backend\",",
     "\"kind\": \"back\xc0\xaf" "end\",", "line 3", "(0xc0) is not valid"},
    {"json_leading_zero", B, "\"min_cc\": 75", "\"min_cc\": 075", "line 15",
     "malformed JSON number"},
    {"json_nul_escape", B, "\"kind\": \"backend\",",
     "\"kind\": \"back\\u0000end\",", "line 3", "\\u0000 is not allowed"},
    {"json_text_after", B, NULL, " {}", NULL, "text after the JSON document"},
    {"json_root_array", B, "*", "[1, 2]", "$:", "expected an object, found an "
     "array"},
    {"json_root_null", B, "*", "null", "$:", "expected an object, found null"},
    /* unknown and duplicate keys */
    {"unknown_top_key", B, "\"title\": \"Tiny\",",
     "\"title\": \"Tiny\", \"colour\": \"red\",", "$.colour",
     "unknown key (expected one of: wna16_spec, kind, name"},
    {"unknown_layout_key", B, "\"dtype\": \"I32\",",
     "\"dtype\": \"I32\", \"stride\": 1,", "$.layouts.qweight.stride",
     "unknown key"},
    {"unknown_role", B, "\"layouts\": {", "\"layouts\": { \"zeros\": {},",
     "$.layouts.zeros", "unknown key"},
    {"unknown_caps_key", B, "\"min_cc\": 75", "\"min_cc\": 75, \"fp8\": true",
     "$.capabilities.fp8", "unknown key"},
    {"unknown_rule_key", B, "\"reason\": \"K packs in whole words\" }",
     "\"reason\": \"K packs in whole words\", \"severity\": 1 }",
     "$.rules[0].severity", "unknown key"},
    {"unknown_selection_key", B, "\"vllm_name\": \"TINY\",",
     "\"vllm_name\": \"TINY\", \"fallback\": {},", "$.selection.fallback",
     "unknown key"},
    {"unknown_kernel_key", B, "{ \"name\": \"TinyExperts\",",
     "{ \"name\": \"TinyExperts\", \"priority\": 1,",
     "$.selection.kernels[0].priority", "unknown key"},
    {"unknown_kernel_rule_key", B, "\"activation_not_in\": [\"silu\"],",
     "\"activation_not_in\": [\"silu\"], \"unless\": \"1\",",
     "$.selection.kernels[0].rules[0].unless", "unknown key"},
    {"unknown_sample_key", B, "\"ZP\": 1 }", "\"ZP\": 1, \"TOPK\": 2 }",
     "$.samples[0].TOPK", "unknown key"},
    {"unknown_format_selection_key", F, "\"integration\": \"Tiny\",",
     "\"integration\": \"Tiny\", \"kernels\": [],", "$.selection.kernels",
     "unknown key"},
    {"duplicate_top_key", B, "\"wna16_spec\": 1,",
     "\"wna16_spec\": 1, \"wna16_spec\": 1,", "$.wna16_spec",
     "duplicate key"},
    {"duplicate_layout_key", B, "\"bit\": \"(k % PF) * BITS\",",
     "\"bit\": \"(k % PF) * BITS\", \"bit\": \"0\",",
     "$.layouts.qweight.bit", "duplicate key"},
    /* wrong types */
    {"string_for_number", B, "\"wna16_spec\": 1,", "\"wna16_spec\": \"1\",",
     "$.wna16_spec", "expected an integer, found a string"},
    {"number_for_string", B, "\"name\": \"tiny\",", "\"name\": 7,", "$.name",
     "expected a string, found a number"},
    {"array_for_object", B,
     "\"coord\": { \"e\": \"i0\", \"n\": \"i1\", \"k\": \"i2 * PF + slot\" }",
     "\"coord\": [\"i0\", \"i1\", \"i2 * PF + slot\"]",
     "$.layouts.qweight.coord", "expected an object"},
    {"object_for_array", B, "\"shape\": [\"E\", \"N\", \"K / PF\"],",
     "\"shape\": { \"d0\": \"E\" },", "$.layouts.qweight.shape",
     "expected an array of expressions, found an object"},
    {"array_for_priority", B, "\"priority\": { \"cuda\": 3 },",
     "\"priority\": [3],", "$.selection.priority",
     "expected an object, found an array"},
    {"string_for_bool", B, "\"zero_points\": true,",
     "\"zero_points\": \"yes\",", "$.capabilities.zero_points",
     "expected true or false, found a string"},
    {"array_for_expression", B, "\"when\": \"ZP\",", "\"when\": [\"ZP\"],",
     "$.layouts.qzeros.when", "expected an expression (a string), found an "
     "array"},
    {"group_sizes_word", B, "\"group_sizes\": [32, -1],",
     "\"group_sizes\": \"some\",", "$.capabilities.group_sizes",
     "expected \"any\" or an array of group sizes"},
    {"bad_kind", B, "\"kind\": \"backend\",", "\"kind\": \"model\",", "$.kind",
     "expected \"format\" or \"backend\""},
    /* out-of-range and non-integer numbers */
    {"version_2", B, "\"wna16_spec\": 1,", "\"wna16_spec\": 2,",
     "$.wna16_spec", "2 is out of range [1, 1]"},
    {"bits_3", B, "\"bits\": [4],", "\"bits\": [3],", "$.capabilities.bits",
     "wna16 handles 4- and 8-bit weights, not 3"},
    {"bits_16", B, "\"bits\": [4],", "\"bits\": [16],",
     "$.capabilities.bits[0]", "16 is out of range [1, 8]"},
    {"group_size_48", B, "\"group_sizes\": [32, -1],",
     "\"group_sizes\": [48, -1],", "$.capabilities.group_sizes",
     "group size 48: expected -1 or a power of two"},
    {"group_size_0", B, "\"group_sizes\": [32, -1],",
     "\"group_sizes\": [0, -1],", "$.capabilities.group_sizes",
     "group size 0"},
    {"min_cc_500", B, "\"min_cc\": 75", "\"min_cc\": 500",
     "$.capabilities.min_cc", "500 is out of range [0, 200]"},
    {"min_cc_1e18", B, "\"min_cc\": 75", "\"min_cc\": 1e18",
     "$.capabilities.min_cc", "is out of range [0, 200]"},
    {"priority_0", B, "\"priority\": { \"cuda\": 3 },",
     "\"priority\": { \"cuda\": 0 },", "$.selection.priority.cuda",
     "0 is out of range [1, 100]"},
    {"non_integer_sample", B, "{ \"E\": 2, \"H\": 64,", "{ \"E\": 2.5, \"H\": 64,",
     "$.samples[0].E", "expected an integer, found 2.5"},
    {"non_integer_table", B, "\"P\": [1, 0]", "\"P\": [1, 0.5]",
     "$.tables.P[1]", "expected an integer, found 0.5"},
    {"sample_E_0", B, "{ \"E\": 2, \"H\": 64,", "{ \"E\": 0, \"H\": 64,",
     "$.samples[0].E", "0 is out of range [1, 16]"},
    {"expression_int_too_big", B, "\"shape\": [\"E\", \"N\", \"K / PF\"],",
     "\"shape\": [\"E\", \"N\", 4294967296],", "$.layouts.qweight.shape[2]",
     "is out of range"},
    {"expression_number_too_large", B, "\"bit\": \"(k % PF) * BITS\",",
     "\"bit\": \"(k % PF) * 99999999999999999999\",",
     "$.layouts.qweight.bit", "number too large"},
    /* dtypes */
    {"unknown_dtype", B, "\"dtype\": \"I32\",", "\"dtype\": \"I33\",",
     "$.layouts.qweight.dtype", "unknown dtype \"I33\""},
    {"f16_qweight", B, "\"dtype\": \"I32\",", "\"dtype\": \"F16\",",
     "$.layouts.qweight.dtype", "dtype F16 cannot hold quantized weight codes"},
    {"i32_scales", B, "\"dtype\": [\"F16\", \"BF16\"],",
     "\"dtype\": [\"F16\", \"I32\"],", "$.layouts.scales.dtype[1]",
     "dtype I32 cannot hold per-group scales (it takes F16 BF16 F32)"},
    {"f8_qweight", B, "\"dtype\": \"I32\",", "\"dtype\": \"F8_E4M3\",",
     "$.layouts.qweight.dtype", "dtype F8_E4M3 cannot hold quantized weight "
     "codes (it takes U8 I8 U16 I16 U32 I32 U64 I64)"},
    {"bool_qweight", B, "\"dtype\": \"I32\",", "\"dtype\": \"BOOL\",",
     "$.layouts.qweight.dtype", "dtype BOOL cannot hold quantized weight"},
    {"f64_scales", B, "\"dtype\": [\"F16\", \"BF16\"],",
     "\"dtype\": [\"F16\", \"F64\"],", "$.layouts.scales.dtype[1]",
     "dtype F64 cannot hold per-group scales"},
    {"no_dtypes", B, "\"dtype\": [\"F16\", \"BF16\"],", "\"dtype\": [],",
     "$.layouts.scales.dtype", "expected 1 to 4 dtypes"},
    {"missing_dtype", B, "\"dtype\": \"I32\",", "", "$.layouts.qweight",
     "\"dtype\" is required"},
    /* shapes and maps */
    {"index_arity", B, "\"index\": [\"e\", \"n\", \"w\"],",
     "\"index\": [\"e\", \"n\"],", "$.layouts.qweight.index",
     "2 index expressions for a 3-dimensional shape"},
    {"too_many_dims", B, "\"shape\": [\"E\", \"N\", \"K / PF\"],",
     "\"shape\": [\"E\", \"N\", \"K / PF\", \"1\", \"1\", \"1\", \"1\"],",
     "$.layouts.qweight.shape", "expected 1 to 6 dimensions, found 7"},
    {"unknown_identifier", B, "\"index\": [\"e\", \"n\", \"w\"],",
     "\"index\": [\"e\", \"nn\", \"w\"],", "$.layouts.qweight.index[1]",
     "unknown identifier 'nn'"},
    {"store_var_in_forward_map", B, "\"index\": [\"e\", \"n\", \"w\"],",
     "\"index\": [\"e\", \"i0\", \"w\"],", "$.layouts.qweight.index[1]",
     "'i0' cannot be used here"},
    {"coord_var_in_shape", B, "\"shape\": [\"E\", \"N\", \"K / PF\"],",
     "\"shape\": [\"E\", \"n\", \"K / PF\"],", "$.layouts.qweight.shape[1]",
     "'n' cannot be used here"},
    {"coord_var_in_when", B, "\"when\": \"ZP\",", "\"when\": \"ZP && n\",",
     "$.layouts.qzeros.when", "'n' cannot be used here"},
    {"value_var_in_bit", B, "\"bit\": \"(k % PF) * BITS\",", "\"bit\": \"c\",",
     "$.layouts.qweight.bit", "'c' cannot be used here"},
    {"select_var_in_layout", B, "\"shape\": [\"E\", \"N\", \"K / PF\"],",
     "\"shape\": [\"E\", \"N\", \"K / PF + CUDA\"],",
     "$.layouts.qweight.shape[2]", "'CUDA' cannot be used here"},
    {"layout_var_in_selection", B, "\"gate\": [ { \"if\": \"MAY_BIAS\",",
     "\"gate\": [ { \"if\": \"K > 0\",", "$.selection.gate[0].if",
     "'K' cannot be used here"},
    {"chained_comparison", B, "\"if\": \"K % PF != 0\"",
     "\"if\": \"K < N < E\"", "$.rules[0].if", "comparisons do not chain"},
    {"nested_too_deeply", B, "\"index\": [\"e\", \"n\", \"w\"],",
     "\"index\": [\"e\", \"n\", \"" DEEP40 "\"],",
     "$.layouts.qweight.index[2]", "expression nested too deeply"},
    {"missing_coord", B,
     "\"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"i2\" }",
     "\"coord\": { \"e\": \"i0\", \"n\": \"i2\" }", "$.layouts.scales.coord",
     "missing coordinate \"g\""},
    {"extra_coord_e_per_expert", F,
     "\"coord\": { \"n\": \"i1\", \"k\": \"i0 * PF + slot\" }",
     "\"coord\": { \"e\": \"0\", \"n\": \"i1\", \"k\": \"i0 * PF + slot\" }",
     "$.layouts.qweight.coord.e", "unknown key (expected one of: n, k)"},
    {"extra_coord_g_qweight", B, "\"k\": \"i2 * PF + slot\" }",
     "\"k\": \"i2 * PF + slot\", \"g\": \"0\" }", "$.layouts.qweight.coord.g",
     "unknown key"},
    {"coord_beyond_shape", B, "\"k\": \"i2 * PF + slot\"",
     "\"k\": \"i3 * PF + slot\"", "$.layouts.qweight.coord.k",
     "uses i3 but the shape has 3 dimensions"},
    {"missing_index", B, "\"index\": [\"e\", \"n\", \"w\"],", "",
     "$.layouts.qweight", "\"index\" (the forward map) is required"},
    {"missing_coord_object", B,
     "\"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"i2\" }",
     "\"when\": \"1\"", "$.layouts.scales", "\"coord\" (the inverse map) is "
     "required"},
    /* value transforms and per-role keys */
    {"encode_without_decode", B, "\"bit\": \"(k % PF) * BITS\",",
     "\"bit\": \"(k % PF) * BITS\", \"encode\": \"c ^ 8\",",
     "$.layouts.qweight", "\"encode\" and \"decode\" come together"},
    {"bit_on_scales", B, "\"index\": [\"e\", \"g\", \"n\"],",
     "\"index\": [\"e\", \"g\", \"n\"], \"bit\": \"0\",",
     "$.layouts.scales.bit", "only packed codes (qweight, qzeros) have a bit "
     "offset"},
    {"encode_on_scales", B, "\"index\": [\"e\", \"g\", \"n\"],",
     "\"index\": [\"e\", \"g\", \"n\"], \"encode\": \"c\", \"decode\": \"c\",",
     "$.layouts.scales.encode", "value transforms apply to codes only"},
    {"code_bits_on_scales", B, "\"index\": [\"e\", \"g\", \"n\"],",
     "\"index\": [\"e\", \"g\", \"n\"], \"code_bits\": \"16\",",
     "$.layouts.scales.code_bits", "only codes (qweight, qzeros) have "
     "code_bits"},
    {"sums_on_scales", B, "\"index\": [\"e\", \"g\", \"n\"],",
     "\"index\": [\"e\", \"g\", \"n\"], \"sums\": { \"block_k\": \"32\", "
     "\"index\": [\"e\", \"g\", \"n\"] },",
     "$.layouts.scales.sums", "only qweight carries block sums"},
    {"sums_on_int32", B, "\"bit\": \"(k % PF) * BITS\",",
     "\"bit\": \"(k % PF) * BITS\", \"sums\": { \"block_k\": \"32\", "
     "\"index\": [\"e\", \"n\", \"g\"] },",
     "$.layouts.qweight.sums", "block sums are written into a byte tensor"},
    {"dequant_scale_dtype_on_qweight", B, "\"dtype\": \"I32\",",
     "\"dtype\": \"I32\", \"dequant_scale_dtype\": \"BF16\",",
     "$.layouts.qweight.dequant_scale_dtype",
     "only the dequantized weight role has it"},
    /* 8-bit activations: scale transforms, z, input_global_scale */
    {"multiply_on_qweight", B, "\"dtype\": \"I32\",",
     "\"dtype\": \"I32\", \"multiply\": \"512\",", "$.layouts.qweight.multiply",
     "only scales have scale transforms"},
    {"multiply_not_power_of_two", B, "\"index\": [\"e\", \"g\", \"n\"],",
     "\"index\": [\"e\", \"g\", \"n\"], \"multiply\": \"3\",",
     "$.layouts.scales.multiply", "is 3: expected a power of two"},
    {"int16_codes_out_of_range", B, "\"index\": [\"e\", \"g\", \"n\"],",
     "\"index\": [\"e\", \"g\", \"n\"], \"int16_codes\": \"40000\",",
     "$.layouts.scales.int16_codes", "is 40000: expected 0 to 32767"},
    {"multiply_and_int16_codes", B, "\"index\": [\"e\", \"g\", \"n\"],",
     "\"index\": [\"e\", \"g\", \"n\"], \"multiply\": \"2\", "
     "\"int16_codes\": \"4096\",", "$.layouts.scales",
     "multiply and int16_codes apply together"},
    {"z_in_qzeros", B, "\"code_bits\": \"8\",",
     "\"code_bits\": \"8\", \"encode\": \"c ^ z\", \"decode\": \"c ^ z\",",
     "$.layouts.qzeros.encode", "z (the zero point of a code's group) exists "
     "for qweight codes only"},
    {"transforms_not_inverse", B, "\"bit\": \"(k % PF) * BITS\",",
     "\"bit\": \"(k % PF) * BITS\", \"encode\": \"c / 2\", "
     "\"decode\": \"c * 2\",", "$.layouts.qweight",
     "decode(encode(1)) = 0 (z = 0): the value transforms are not inverse"},
    {"transforms_with_z_not_inverse", B, "\"bit\": \"(k % PF) * BITS\",",
     "\"bit\": \"(k % PF) * BITS\", \"encode\": \"c >= z ? c - z : MASK - c\", "
     "\"decode\": \"c + z\",", "$.layouts.qweight",
     "the value transforms are not inverse"},
    {"global_scale_without_codes", B, "\"qzeros\": {",
     "\"input_global_scale\": { \"dtype\": \"F32\", \"shape\": [], "
     "\"index\": [], \"coord\": {} }, \"qzeros\": {", "$.layouts",
     "it comes with a \"scales\" layout that has \"int16_codes\""},
    {"global_scale_where_no_codes", B, "\"index\": [\"e\", \"g\", \"n\"],\n"
     "      \"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"i2\" }\n    },",
     "\"index\": [\"e\", \"g\", \"n\"], \"int16_codes\": \"G > 1 ? 4096 : 0\",\n"
     "      \"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"i2\" }\n    },"
     " \"input_global_scale\": { \"dtype\": \"F32\", \"shape\": [], "
     "\"index\": [], \"coord\": {} },", "$.layouts.input_global_scale",
     "input_global_scale must exist exactly where the scales are int16 codes"},
    {"global_scale_f16", B, "\"qzeros\": {",
     "\"input_global_scale\": { \"dtype\": \"F16\", \"shape\": [], "
     "\"index\": [], \"coord\": {} }, \"qzeros\": {",
     "$.layouts.input_global_scale.dtype", "dtype F16 cannot hold global "
     "activation scale"},
    {"qweight_zero_dims", B, "\"shape\": [\"E\", \"N\", \"K / PF\"],",
     "\"shape\": [],", "$.layouts.qweight.shape",
     "expected 1 to 6 dimensions, found 0"},
    {"unknown_input_dtype", B, "\"min_cc\": 75", "\"min_cc\": 75, "
     "\"input_dtypes\": [\"int4\"]", "$.capabilities.input_dtypes",
     "unknown 8-bit input dtype \"int4\" (int8, fp8)"},
    {"tensor_name_clash", B, "\"dtype\": [\"F16\", \"BF16\"],",
     "\"name\": \"qweight\", \"dtype\": [\"F16\", \"BF16\"],",
     "$.layouts.scales", "tensor name \"qweight\" is already used by qweight"},
    {"layout_name_not_identifier", B, "\"dtype\": \"I32\",",
     "\"name\": \"q-weight\", \"dtype\": \"I32\",", "$.layouts.qweight.name",
     "is not a name"},
    {"missing_scales", B,
     "\"scales\": {\n      \"dtype\": [\"F16\", \"BF16\"],\n"
     "      \"shape\": [\"E\", \"G\", \"N\"],\n"
     "      \"index\": [\"e\", \"g\", \"n\"],\n"
     "      \"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"i2\" }\n"
     "    },\n", "", "$.layouts",
     "quantized weights need a \"scales\" layout"},
    /* tables and lets */
    {"duplicate_table", B, "\"P\": [1, 0]", "\"P\": [1, 0], \"P\": [0, 1]",
     "$.tables.P", "duplicate table"},
    {"table_named_like_variable", B, "\"P\": [1, 0]",
     "\"K\": [1, 0], \"P\": [1, 0]", "$.tables.K",
     "table name clashes with the variable K"},
    {"empty_table", B, "\"P\": [1, 0]", "\"Q\": [], \"P\": [1, 0]",
     "$.tables.Q", "expected a non-empty array"},
    {"let_uses_later_let", B, "\"let\": { \"w\": \"k / PF\" },",
     "\"let\": { \"w\": \"u\", \"u\": \"k / PF\" },",
     "$.layouts.qweight.let.w", "unknown identifier 'u'"},
    {"let_named_like_variable", B, "\"let\": { \"w\": \"k / PF\" },",
     "\"let\": { \"k\": \"0\", \"w\": \"k / PF\" },",
     "$.layouts.qweight.let.k", "'k' is a variable"},
    {"let_uppercase", B, "\"let\": { \"w\": \"k / PF\" },",
     "\"let\": { \"W\": \"k / PF\", \"w\": \"k / PF\" },",
     "$.layouts.qweight.let.W", "let names are lowercase identifiers"},
    {"let_named_like_table", B, "\"tables\": { \"P\": [1, 0] },",
     "\"tables\": { \"P\": [1, 0], \"w\": [0] },", "$.layouts.qweight.let.w",
     "'w' is a table"},
    /* the sample check */
    {"not_bijective", B, "\"index\": [\"e\", \"n\", \"w\"],",
     "\"index\": [\"e\", \"n\", \"0\"],", "$.layouts.qweight",
     "map to the same place"},
    {"inverse_disagrees", B, "\"k\": \"i2 * PF + slot\"",
     "\"k\": \"i2 * PF + 7 - slot\"", "$.layouts.qweight",
     "is stored where the inverse map (coord) reads"},
    {"index_outside_shape", B, "\"index\": [\"e\", \"n\", \"w\"],",
     "\"index\": [\"e + 2\", \"n\", \"w\"],", "$.layouts.qweight",
     "outside the shape"},
    {"padding_decodes_inside", B,
     "\"shape\": [\"E\", \"G\", \"N\"],\n"
     "      \"index\": [\"e\", \"g\", \"n\"],\n"
     "      \"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"i2\" }",
     "\"shape\": [\"E\", \"G\", \"N + 2\"],\n"
     "      \"index\": [\"e\", \"g\", \"n\"],\n"
     "      \"coord\": { \"e\": \"i0\", \"g\": \"i1\", \"n\": \"i2 % N\" }",
     "$.layouts.scales", "is stored elsewhere"},
    {"values_do_not_fit", B, "\"shape\": [\"E\", \"N\", \"K / PF\"],",
     "\"shape\": [\"E\", \"N\", \"K / PF / 2\"],", "$.layouts.qweight",
     "logical values do not fit"},
    {"bit_not_a_slot", B, "\"bit\": \"(k % PF) * BITS\",",
     "\"bit\": \"(k % PF) * BITS + 1\",", "$.layouts.qweight",
     "not a 4-bit slot of a I32 element"},
    {"code_bits_do_not_fill", B, "\"code_bits\": \"8\",",
     "\"code_bits\": \"3\",", "$.layouts.qzeros",
     "3-bit codes do not fill U8 elements"},
    {"shape_negative", B, "\"shape\": [\"E\", \"N\", \"K / PF\"],",
     "\"shape\": [\"E\", \"N\", \"K / PF - 1000\"],",
     "$.layouts.qweight.shape[2]", "evaluates to -992"},
    {"forward_map_error", B, "\"index\": [\"e\", \"n\", \"w\"],",
     "\"index\": [\"e\", \"n\", \"w / (k - k)\"],", "$.layouts.qweight",
     "forward map of (e=0, n=0, k=0): division by zero"},
    {"table_index_out_of_range", B, "\"2 * (n / 2) + P[n % 2]\"",
     "\"2 * (n / 2) + P[n % 3]\"", "$.layouts.qzeros",
     "table index out of range"},
    {"sample_breaks_rule", B,
     "{ \"E\": 2, \"H\": 64, \"I\": 32, \"BITS\": 4, \"GS\": 32, \"ZP\": 1 }",
     "{ \"E\": 2, \"H\": 68, \"I\": 32, \"BITS\": 4, \"GS\": -1, \"ZP\": 1 }",
     "$.samples[0]", "breaks the spec's own rule $.rules[0] (K packs in whole "
     "words)"},
    {"sample_group_not_dividing", B, "\"GS\": 32, \"ZP\": 1 }",
     "\"GS\": 48, \"ZP\": 1 }", "$.samples[0]",
     "group size 48 does not divide the w13 input size 64"},
    {"sample_group_0", B, "\"GS\": 32, \"ZP\": 1 }", "\"GS\": 0, \"ZP\": 1 }",
     "$.samples[0]", "group size 0: expected -1 or a positive size"},
    {"missing_samples", B,
     ",\n  \"samples\": [\n    { \"E\": 2, \"H\": 64, \"I\": 32, \"BITS\": 4, "
     "\"GS\": 32, \"ZP\": 1 }\n  ]", "", "$:", "\"samples\" (problems the "
     "layouts are checked on) is required"},
    {"empty_samples", B,
     "[\n    { \"E\": 2, \"H\": 64, \"I\": 32, \"BITS\": 4, \"GS\": 32, "
     "\"ZP\": 1 }\n  ]", "[]", "$.samples",
     "expected an array of 1 to 16 sample problems"},
    {"sample_without_H", B, "\"H\": 64, \"I\": 32, \"BITS\": 4, \"GS\": 32, "
     "\"ZP\": 1", "\"I\": 32, \"BITS\": 4, \"GS\": 32, \"ZP\": 1",
     "$.samples[0]", "\"H\" is required"},
    /* padding */
    {"pad_in_format", F, "\"name\": \"tinyfmt\",",
     "\"name\": \"tinyfmt\", \"pad\": { \"intermediate\": \"I\" },", "$.pad",
     "not allowed in a format spec"},
    {"pad_uses_K", B, "\"title\": \"Tiny\",",
     "\"title\": \"Tiny\", \"pad\": { \"intermediate\": \"K\" },",
     "$.pad.intermediate", "padding is computed before K is known"},
    {"pad_division_by_zero", B, "\"title\": \"Tiny\",",
     "\"title\": \"Tiny\", \"pad\": { \"intermediate\": \"I / (GS - GS)\" },",
     "$.samples[0]", "$.pad.intermediate: division by zero"},
    {"pad_too_large", B, "\"title\": \"Tiny\",",
     "\"title\": \"Tiny\", \"pad\": { \"intermediate\": \"I * 1000\" },",
     "$.pad.intermediate", "gives 32000 for I = 32"},
    /* names */
    {"name_not_identifier", B, "\"name\": \"tiny\",", "\"name\": \"Marlin!\",",
     "$.name", "\"Marlin!\" is not a name"},
    {"name_uppercase", B, "\"name\": \"tiny\",", "\"name\": \"Tiny\",",
     "$.name", "is not a name"},
    {"name_too_long", B, "\"name\": \"tiny\",",
     "\"name\": \"a234567890123456789012345678901234567890123456789012345678901234\",",
     "$.name", "string longer than 63 characters"},
    {"missing_name", B, "\"name\": \"tiny\",", "", "$:", "\"name\" is required"},
    /* kinds */
    {"config_in_backend", B, "\"title\": \"Tiny\",",
     "\"title\": \"Tiny\", \"config\": { \"quant_method\": [\"x\"] },",
     "$.config", "not allowed in a backend spec"},
    {"backend_not_stacked", B, "\"title\": \"Tiny\",",
     "\"title\": \"Tiny\", \"stacked\": false,", "$.stacked",
     "backend layouts are stacked per layer"},
    {"format_missing_config", F,
     "\"config\": { \"quant_method\": [\"tinyfmt\"] },", "", "$:",
     "a format needs \"config\""},
    {"format_missing_projections", F,
     "\"projections\": { \"gate\": [\"gate_proj\"], \"up\": [\"up_proj\"], "
     "\"down\": [\"down_proj\"] },", "", "$:",
     "a per-expert format needs \"projections\""},
    {"format_projection_missing_up", F, "\"up\": [\"up_proj\"], ", "",
     "$.projections", "\"up\" is required"},
    /* capabilities */
    {"missing_bits", B, "\"bits\": [4],", "", "$.capabilities",
     "\"bits\" is required"},
    {"unknown_platform", B, "\"platforms\": [\"cuda\"],",
     "\"platforms\": [\"cuda\", \"tpu\"],", "$.capabilities.platforms",
     "unknown platform \"tpu\""},
    {"unknown_activation", B, "\"activations\": [\"silu\"],",
     "\"activations\": [\"silu\", \"swish\"],", "$.capabilities.activations",
     "unknown activation \"swish\""},
    {"unknown_activation_format", B, "\"activations\": [\"silu\"],",
     "\"activations\": [\"silu\"], \"activation_formats\": [\"ragged\"],",
     "$.capabilities.activation_formats",
     "unknown activation format \"ragged\""},
    {"activation_listed_twice", B, "\"activations\": [\"silu\"],",
     "\"activations\": [\"silu\", \"silu\"],",
     "$.capabilities.activations[1]", "\"silu\" is listed twice"},
    /* rules and selection */
    {"layout_rule_without_if", B, "{ \"if\": \"K % PF != 0\", \"reason\"",
     "{ \"reason\"", "$.rules[0]", "a layout rule needs an \"if\""},
    {"layout_rule_with_format", B, "\"reason\": \"K packs in whole words\" }",
     "\"reason\": \"K packs in whole words\", \"format\": [\"gptq\"] }",
     "$.rules[0]", "\"format\" applies only to selection rules"},
    {"rule_without_reason", B,
     "{ \"if\": \"MAY_BIAS\", \"reason\": \"no bias on {platform}\" }",
     "{ \"if\": \"MAY_BIAS\" }", "$.selection.gate[0]",
     "a rule needs a \"reason\""},
    {"rule_format_not_a_name", B, "\"reason\": \"no bias on {platform}\" }",
     "\"reason\": \"no bias on {platform}\", \"format\": [\"GPTQ\"] }",
     "$.selection.gate[0].format[0]", "\"GPTQ\" is not a name"},
    {"unknown_platform_in_priority", B, "\"priority\": { \"cuda\": 3 },",
     "\"priority\": { \"cuda\": 3, \"tpu\": 1 },",
     "$.selection.priority.tpu", "unknown key (expected one of: cuda, rocm, "
     "cpu, xpu)"},
    {"unknown_kernel_platform", B, "\"kernel_platforms\": [\"cuda\"]",
     "\"kernel_platforms\": [\"gpu\"]", "$.selection.kernel_platforms",
     "unknown platform \"gpu\""},
    {"missing_kernels", B, "\"kernels\": [\001\n    ],\n", "", "$.selection",
     "\"kernels\" (vLLM's experts classes) is required"},
    {"empty_kernels", B,
     "[\n      { \"name\": \"TinyExperts\",\n        \"rules\": [ { "
     "\"activation_not_in\": [\"silu\"], \"reason\": \"kernel does not "
     "support {activation} activation\" } ] }\n    ]", "[]",
     "$.selection.kernels", "expected an array of 1 to 8 kernel classes"},
    {"missing_vllm_name", B, "\"vllm_name\": \"TINY\",", "", "$.selection",
     "\"vllm_name\" is required"},
    {"missing_kernel_platforms", B, ",\n    \"kernel_platforms\": [\"cuda\"]",
     "", "$.selection", "\"kernel_platforms\""},
    {"missing_selection", B, "  \"selection\": {\001\n  },\n", "", "$:",
     "\"selection\" is required"},
    {"missing_layouts", B, "  \"layouts\": {\001\n    }\n  },\n", "", "$:",
     "\"layouts\" is required"},
    {"missing_capabilities", B, "  \"capabilities\": {\001\n  },\n", "",
     "$:", "\"capabilities\" is required"},
    {"format_missing_weight_key", F,
     "\"weight_key\": { \"bits\": \"BITS\", \"group32\": \"GS == 32\", "
     "\"asym\": \"0\" },", "", "$.selection", "\"weight_key\" is required"},
    {"format_weight_key_missing_asym", F, ", \"asym\": \"0\" }", " }",
     "$.selection.weight_key", "\"asym\" is required"},
    {"format_fallback_missing_reason", F, ", \"reason\": \"falls back\" }",
     " }", "$.selection.fallback", "\"reason\" is required"},
    {"format_fallback_bad_format", F, "\"format\": \"moe_wna16\"",
     "\"format\": \"MoE WNA16\"", "$.selection.fallback.format",
     "is not a name"},
    {"format_missing_integration", F, "\"integration\": \"Tiny\",", "",
     "$.selection", "\"integration\" is required"},
    {"format_error_rule_layout_var", F, "\"if\": \"BITS != 4\"",
     "\"if\": \"PF != 8\"", "$.selection.errors[0].if",
     "'PF' cannot be used here"},
    /* the model's dtype (issue 28): scales and bias only, both 16-bit
     * dtypes listed, a boolean; g_idx_parameters: formats, a boolean */
    {"model_dtype_on_qweight", B, "\"dtype\": \"I32\",",
     "\"dtype\": \"I32\", \"model_dtype\": true,",
     "$.layouts.qweight.model_dtype",
     "only scales and bias follow the model's dtype"},
    {"model_dtype_not_bool", B, "\"dtype\": [\"F16\", \"BF16\"],",
     "\"dtype\": [\"F16\", \"BF16\"], \"model_dtype\": 1,",
     "$.layouts.scales.model_dtype", "expected true or false"},
    {"model_dtype_one_dtype", B, "\"dtype\": [\"F16\", \"BF16\"],",
     "\"dtype\": [\"F16\", \"F32\"], \"model_dtype\": true,",
     "$.layouts.scales.model_dtype", "must list F16 and BF16"},
    {"g_idx_parameters_on_backend", B, "\"kind\": \"backend\",",
     "\"kind\": \"backend\", \"g_idx_parameters\": true,",
     "$.g_idx_parameters", "not allowed in a backend spec"},
    {"g_idx_parameters_not_bool", F, "\"kind\": \"format\",",
     "\"kind\": \"format\", \"g_idx_parameters\": \"yes\",",
     "$.g_idx_parameters", "expected true or false"},
};

/* Applies one edit; returns malloc'd text or NULL when `find` does not
 * occur exactly once. */
static char *apply_edit(const bad_case_t *c)
{
    const char *base = c->base == B ? base_backend : base_format;
    size_t lb = strlen(base), lr = strlen(c->repl);
    if (!c->find) {
        char *s = malloc(lb + lr + 1);
        memcpy(s, base, lb);
        memcpy(s + lb, c->repl, lr + 1);
        return s;
    }
    if (strcmp(c->find, "*") == 0) {
        char *s = malloc(lr + 1);
        memcpy(s, c->repl, lr + 1);
        return s;
    }
    const char *sep = strchr(c->find, '\001');
    char first[512];
    size_t lfirst = sep ? (size_t)(sep - c->find) : strlen(c->find);
    if (lfirst >= sizeof first)
        return NULL;
    memcpy(first, c->find, lfirst);
    first[lfirst] = '\0';
    const char *at = strstr(base, first);
    if (!at || strstr(at + 1, first))
        return NULL;
    size_t lf = lfirst, pre = (size_t)(at - base);
    if (sep) {
        const char *end = strstr(at + lfirst, sep + 1);
        if (!end)
            return NULL;
        lf = (size_t)(end - at) + strlen(sep + 1);
    }
    char *s = malloc(lb - lf + lr + 1);
    memcpy(s, base, pre);
    memcpy(s + pre, c->repl, lr);
    memcpy(s + pre + lr, at + lf, lb - pre - lf + 1);
    return s;
}

/* Parses and fully checks a text; returns the status. */
static wna16_status_t load_full(wna16_context_t *ctx, const char *origin,
                                const char *text, wna16_error_t *err)
{
    wna16_spec_t *s = NULL;
    wna16_status_t st = w16_spec_parse(ctx, origin, text, strlen(text), &s,
                                       err);
    if (st == WNA16_OK) {
        st = w16_spec_check_layouts(s, true, err);
        w16_spec_free(s);
    }
    return st;
}

static void test_malformed(void)
{
    wna16_context_options_t o = {.log_level = WNA16_LOG_ERROR,
                                 .no_builtin_specs = true};
    wna16_context_t *ctx = NULL;
    wna16_error_t err = {0};
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (!ctx)
        return;
    /* Both bases are valid. */
    TU_OK(load_full(ctx, "base:backend", base_backend, &err), &err);
    TU_OK(load_full(ctx, "base:format", base_format, &err), &err);
    const wna16_spec_t *sp = NULL;
    TU_OK(wna16_spec_load_text(ctx, "base:backend", base_backend,
                               strlen(base_backend), &sp, &err), &err);
    TU_CHECK(sp && sp->n_samples == 1 && sp->n_tables == 1 &&
             sp->caps.min_cc == 75 && sp->bsel.priority[WNA16_PLATFORM_CUDA]
             == 3 && sp->layouts[W16_ROLE_QZEROS] &&
             sp->layouts[W16_ROLE_QZEROS]->code_bits);

    size_t n = sizeof bad_cases / sizeof bad_cases[0];
    int passed = 0;
    bool verbose = getenv("WNA16_TEST_VERBOSE") != NULL;
    for (size_t i = 0; i < n; i++) {
        const bad_case_t *c = &bad_cases[i];
        char *text = apply_edit(c);
        TU_CHECK_MSG(text != NULL, "%s: the edit's text does not occur "
                     "exactly once in the base", c->name);
        if (!text)
            continue;
        char origin[128];
        snprintf(origin, sizeof origin, "mal:%s", c->name);
        wna16_error_t e = {0};
        /* Alternate the two entry points: parse + full check, and
         * wna16_spec_load_text (first sample) on a fresh context. */
        wna16_status_t st;
        if (i % 2 == 0) {
            st = load_full(ctx, origin, text, &e);
        } else {
            wna16_context_t *fresh = NULL;
            TU_OK(wna16_context_create(&o, &fresh, &err), &err);
            st = wna16_spec_load_text(fresh, origin, text, strlen(text), NULL,
                                      &e);
            TU_CHECK(wna16_spec_count(fresh) == 0);
            wna16_context_destroy(fresh);
        }
        char prefix[160];
        snprintf(prefix, sizeof prefix, "%s: ", origin);
        bool ok = st == WNA16_ESPEC &&
                  strncmp(e.message, prefix, strlen(prefix)) == 0 &&
                  (!c->path || strstr(e.message, c->path)) &&
                  strstr(e.message, c->want);
        TU_CHECK_MSG(ok, "%s: status %s, message \"%s\"; want ESPEC, \"%s\" "
                     "and \"%s\"", c->name, wna16_status_name(st), e.message,
                     c->path ? c->path : "", c->want);
        passed += ok;
        if (verbose)
            printf("  %-32s %s\n", c->name, e.message);
        free(text);
    }
    printf("malformed specs: %d of %zu rejected with origin, JSON path and "
           "reason\n", passed, n);
    TU_CHECK(n >= 40);

    /* An expression longer than 1000 characters. */
    {
        size_t len = 1200;
        char *expr = malloc(len + 1);
        for (size_t k = 0; k < len; k += 4)
            memcpy(expr + k, "1 + ", 4);
        expr[len - 1] = '1';
        expr[len] = '\0';
        const char *find = "\"bit\": \"(k % PF) * BITS\",";
        const char *at = strstr(base_backend, find);
        size_t pre = (size_t)(at - base_backend);
        char *text = malloc(strlen(base_backend) + len + 64);
        sprintf(text, "%.*s\"bit\": \"%s\",%s", (int)pre, base_backend, expr,
                at + strlen(find));
        wna16_error_t e = {0};
        TU_CHECK(load_full(ctx, "mal:long", text, &e) == WNA16_ESPEC &&
                 strstr(e.message, "mal:long: $.layouts.qweight.bit: "
                                   "expression longer than 1000 characters"));
        free(text);
        free(expr);
    }

    /* A JSON document nested deeper than cJSON allows. */
    {
        size_t depth = 3000;
        char *text = malloc(2 * depth + 1);
        memset(text, '[', depth);
        memset(text + depth, ']', depth);
        text[2 * depth] = '\0';
        wna16_error_t e = {0};
        TU_CHECK(load_full(ctx, "mal:deep", text, &e) == WNA16_ESPEC &&
                 strstr(e.message, "mal:deep: line 1: not valid JSON"));
        free(text);
    }

    /* KNOWN BUG (gen/spec_layout.c w16_layout_present): a "when" whose
     * evaluation fails (here a division by zero) makes the layout silently
     * absent instead of being reported; the spec below is accepted. */
    {
        bad_case_t c = {"when_eval_error", B, "\"when\": \"ZP\",",
                        "\"when\": \"ZP / (ZP - ZP)\",", NULL, NULL};
        char *text = apply_edit(&c);
        wna16_error_t e = {0};
        wna16_status_t st = text ? load_full(ctx, "mal:when", text, &e)
                                 : WNA16_EINTERNAL;
        KNOWN_BUG(st == WNA16_OK, "a layout whose \"when\" fails to evaluate "
                  "(\"ZP / (ZP - ZP)\") is treated as absent and the spec is "
                  "accepted (gen/spec_layout.c w16_layout_present)");
        free(text);
    }
    wna16_context_destroy(ctx);
}

int main(void)
{
    test_builtin_specs();
    test_json_only_layout();
    test_malformed();
    if (known_bug_hits)
        printf("%d known bug(s) reported above\n", known_bug_hits);
    return tu_finish("test_spec_load");
}
