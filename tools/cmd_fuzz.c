/*
 * cmd_fuzz.c - `wna16 fuzz`: generated repack kernels against the
 * reference on random problems drawn from the specs. A case is a (source,
 * destination) pair of specs, a layer shape and a quantization (bits,
 * group size, zero points, act order, bias, 8-bit activation variants,
 * scale dtype) plus the seed of the layer's values. Each case writes a
 * random layer in the source layout with the reference encoder, repacks
 * it with the reference and with the generated kernels of the target, and
 * requires the same bytes, tensor by tensor, or the same refusal. A
 * failing case is shrunk (fewer experts, smaller shapes, fewer options)
 * while it still fails, and printed as a one-line reproducer that
 * `wna16 fuzz --case` reads back. `--kind moe` runs the fused-MoE kind
 * instead (fuzz_moe.c); this file parses the command line for both.
 */
#define _POSIX_C_SOURCE 200809L
#include "fuzz.h"
#include "runtime/targets.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CMD "fuzz"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: wna16 fuzz [--kind repack|moe] [--count N] [--seed S]\n"
        "                  [--target cpu|cuda|ocl] [--from SPEC] [--to SPEC]\n"
        "                  [--backend SPEC] [--no-shrink] [--verbose]\n"
        "                  [--inject-fault] [--json]\n"
        "       wna16 fuzz [--kind repack|moe] --case 'CASE'\n"
        "                  [--target cpu|cuda|ocl] [--no-shrink] [--inject-fault]\n"
        "                  [--json]\n\n"
        "--json prints one object on stdout when the run ends (ok, kind,\n"
        "target, seed, the count of each outcome, seconds, and the failure:\n"
        "the case as drawn and as shrunk, the message, the reproducer); the\n"
        "lines above then go to stderr.\n\n"
        "--kind repack (the default):\n"
        "Draws N random repack problems (default 100) and checks that the\n"
        "generated kernels of the target (default cpu) write exactly the\n"
        "bytes the reference writes, or refuse with the same reason. Sources\n"
        "are the checkpoint formats and the stacked layouts that hold codes,\n"
        "destinations the backends and moe_wna16; --from and --to fix one.\n"
        "Shapes, bit widths, group sizes, zero points, act order, bias, the\n"
        "8-bit activation variants and the scale dtype vary within each\n"
        "pair's rules. --seed (default 1) makes a run repeatable.\n\n"
        "A failure is shrunk (fewer experts, smaller shapes, fewer options)\n"
        "while it still fails, then printed as CASE, e.g.\n"
        "  gptq->marlin E=2 H=64 I=128 bits=4 group=32 zp=1 actorder=0\n"
        "  bias=0 input=16bit scales=F16 positive=0 data=0x1f\n"
        "(one line); --case runs that one problem again.\n\n"
        "--inject-fault checks the checker: it flips a bit of the generated\n"
        "output of every case with two experts or more, so each such case\n"
        "must fail and shrink to E=2 (exit status 1).\n\n"
        "--kind moe: draws N random fused-MoE problems and checks the\n"
        "target's fused MoE against the reference MoE: on cpu and ocl the\n"
        "generated fused MoE over any stacked layout with codes and scales\n"
        "(ocl: the xpu target's SPIR-V, run by OpenCL), on cuda\n"
        "the tensor-core kernels over marlin and batched_marlin (--backend\n"
        "fixes one). Bits, group sizes, zero points, act order (cuda), bias,\n"
        "every activation (gated ones on cuda) and the swiglu constants,\n"
        "activation and scale dtypes, GEMM output rounding, router weights\n"
        "on the input, expert maps with absent experts, the batched format,\n"
        "M from 1 to hundreds, ragged I, experts without tokens and top-k\n"
        "vary; one case in 16 passes one bad argument, which both must\n"
        "refuse with the same status and message. Outputs must agree within\n"
        "a bound carried through both GEMMs from each target's numerics.\n"
        "A failure shrinks (fewer experts, tokens and slots, smaller H and\n"
        "I, fewer options) and prints its CASE, e.g.\n"
        "  cpu E=2 H=64 I=48 M=3 topk=2 bits=4 group=-1 zp=0 actorder=0\n"
        "  bias=1 act=gelu swiglu=7/1.702/1 dtype=BF16 scales=F16 round=0\n"
        "  oninput=0 map=3 active=3 batched=0 weights=1 bad=none data=0x2a\n"
        "(one line; map=G: G global experts, E of them here; active=A:\n"
        "tokens go to A of the experts; M is max_tokens when batched;\n"
        "bad=none|id|map|topk|count|dtype|limit|gating). --inject-fault\n"
        "makes one output element wrong in every case with M >= 2: each\n"
        "such case fails and shrinks to M=2.\n\n"
        "Progress goes to stderr, the summary and failures to stdout. Exit\n"
        "status: 0 every case passed, 1 a case failed, 2 usage error.\n");
}

/* ---- cases ----------------------------------------------------------------- */

typedef struct fz_case {
    const wna16_spec_t *src, *dst;
    int32_t E, H, I;
    wna16_quant_desc_t q;
    wna16_dtype_t scales; /* scale and bias dtype */
    bool positive;        /* positive scales only (int8 activations) */
    uint64_t data;        /* seed of the layer's values */
} fz_case_t;

static void case_text(const fz_case_t *c, char *buf, size_t n)
{
    snprintf(buf, n, "%s->%s E=%" PRId32 " H=%" PRId32 " I=%" PRId32
             " bits=%" PRId32 " group=%" PRId32 " zp=%d actorder=%d bias=%d "
             "input=%s scales=%s positive=%d data=%#" PRIx64,
             wna16_spec_name(c->src), wna16_spec_name(c->dst), c->E, c->H, c->I,
             c->q.bits, c->q.group_size, c->q.zero_point, c->q.act_order,
             c->q.bias, wna16_input_dtype_name(c->q.input_dtype),
             wna16_dtype_name(c->scales), c->positive, c->data);
}

/* What may be a source: checkpoint formats and stacked layouts holding
 * codes; a destination: backends and moe_wna16 (a format vLLM also runs). */
static bool can_be(const wna16_spec_t *s, bool source)
{
    const char *n = wna16_spec_name(s);
    if (source)
        return strcmp(n, "emulation") && strcmp(n, "cpu") &&
               strcmp(n, "flashinfer_trtllm");
    return wna16_spec_kind(s) == WNA16_SPEC_BACKEND ||
           strcmp(n, "moe_wna16") == 0;
}

static const wna16_spec_t *find_any(wna16_context_t *ctx, const char *name)
{
    const wna16_spec_t *s = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, name);
    return s ? s : wna16_spec_find(ctx, WNA16_SPEC_BACKEND, name);
}

static const wna16_spec_t *pick(wna16_context_t *ctx, fz_rng_t *r, bool source)
{
    for (;;) {
        const wna16_spec_t *s = wna16_spec_at(
            ctx, fz_below(r, (uint32_t)wna16_spec_count(ctx)));
        if (can_be(s, source))
            return s;
    }
}

static bool groups_divide(const fz_case_t *c)
{
    int32_t g = c->q.group_size;
    return g <= 0 || (c->H % g == 0 && c->I % g == 0);
}

/* A random case. The 8-bit activation variants go into the Marlin layouts
 * that hold them: a quarter of the draws go there when --to is free, and
 * half of the Marlin draws use them (a few elsewhere: refused alike). */
static void draw(wna16_context_t *ctx, fz_rng_t *r, const wna16_spec_t *from,
                 const wna16_spec_t *to, fz_case_t *c)
{
    static const int32_t gss[] = {-1, 32, 64, 128};
    static const int32_t sizes[] = {32, 64, 96, 128, 160, 192, 256};
    memset(c, 0, sizeof *c);
    c->src = from ? from : pick(ctx, r, true);
    c->dst = to ? to : pick(ctx, r, false);
    if (!to && fz_below(r, 4) == 0)
        c->dst = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                 fz_below(r, 2) ? "marlin" : "batched_marlin");
    bool marlin = strstr(wna16_spec_name(c->dst), "marlin") != NULL;
    if (marlin ? fz_below(r, 2) == 0 : fz_below(r, 20) == 0)
        c->q.input_dtype = fz_below(r, 2) ? WNA16_INPUT_INT8 : WNA16_INPUT_FP8;
    bool a8 = c->q.input_dtype != WNA16_INPUT_16BIT;
    c->q.bits = fz_below(r, a8 ? 8 : 3) ? 4 : 8;
    c->q.group_size = gss[fz_below(r, 4)];
    c->q.zero_point = fz_below(r, 2);
    c->q.act_order = c->q.group_size > 0 && fz_below(r, a8 ? 12 : 6) == 0;
    c->q.bias = fz_below(r, 5) == 0;
    c->positive = c->q.input_dtype == WNA16_INPUT_INT8 && fz_below(r, 5) != 0;
    c->E = 1 + (int32_t)fz_below(r, 3);
    c->H = sizes[fz_below(r, 7)];
    c->I = sizes[fz_below(r, 7)];
    if (fz_below(r, 4) == 0)
        c->I = 8 * (1 + (int32_t)fz_below(r, 40));
    if (fz_below(r, 4) == 0)
        c->H = c->I = 256;
    c->scales = fz_below(r, 2) ? WNA16_DTYPE_F16 : WNA16_DTYPE_BF16;
    c->data = fz_next(r);
}

/* ---- one case ---------------------------------------------------------------- */

/* Scales exact in fp16 and bf16 (m * 2^-i), some negative unless
 * `positive`, and a third fp16 values bf16 cannot hold (rounding). */
static float draw_scale(fz_rng_t *r, bool positive)
{
    if (fz_below(r, 3) == 0)
        return wna16_f16_to_f32((uint16_t)(0x2000 + fz_below(r, 0x3000)));
    float v = (float)(1 + fz_below(r, 127));
    for (int i = (int)fz_below(r, 10); i > 0; i--)
        v *= 0.5f;
    return !positive && fz_below(r, 4) == 0 ? -v : v;
}

static void fill(wna16_qweight_t *w, fz_rng_t *r, bool positive)
{
    size_t n = (size_t)w->E * w->N * w->K, ng = (size_t)w->E * w->G * w->N;
    for (size_t i = 0; i < n; i++)
        w->codes[i] = (uint8_t)fz_below(r, 1u << w->bits);
    for (size_t i = 0; i < ng; i++) {
        w->scales[i] = draw_scale(r, positive);
        if (w->zeros)
            w->zeros[i] = (uint8_t)fz_below(r, 1u << w->bits);
    }
    if (w->bias)
        for (size_t i = 0; i < (size_t)w->E * w->N; i++)
            w->bias[i] = draw_scale(r, positive);
    if (w->g_idx) /* every group used, the rest at random */
        for (int32_t e = 0; e < w->E; e++)
            for (int32_t k = 0; k < w->K; k++)
                w->g_idx[(size_t)e * w->K + k] =
                    k < w->G ? k : (int32_t)fz_below(r, (uint32_t)w->G);
}

/* First difference between the reference's tensors and the generated
 * ones, described in msg; true when they are the same. */
static bool same_sets(const wna16_tensor_set_t *a, const wna16_tensor_set_t *b,
                      char *msg, size_t n)
{
    if (wna16_tensor_set_count(a) != wna16_tensor_set_count(b)) {
        snprintf(msg, n, "%zu tensors from the reference, %zu generated",
                 wna16_tensor_set_count(a), wna16_tensor_set_count(b));
        return false;
    }
    for (size_t i = 0; i < wna16_tensor_set_count(a); i++) {
        const wna16_tensor_t *x = wna16_tensor_set_at(a, i);
        const wna16_tensor_t *y = wna16_tensor_set_find(b, x->name);
        if (!y) {
            snprintf(msg, n, "%s: not generated", x->name);
            return false;
        }
        bool ok = x->dtype == y->dtype && x->ndim == y->ndim &&
                  x->nbytes == y->nbytes;
        for (int d = 0; ok && d < x->ndim; d++)
            ok = x->shape[d] == y->shape[d];
        if (!ok) {
            snprintf(msg, n, "%s: dtype or shape differs", x->name);
            return false;
        }
        const uint8_t *p = x->data, *q = y->data;
        for (size_t at = 0; at < x->nbytes; at++)
            if (p[at] != q[at]) {
                snprintf(msg, n, "%s differs at byte %zu of %zu (reference "
                         "%02x, generated %02x)", x->name, at, x->nbytes,
                         p[at], q[at]);
                return false;
            }
    }
    return true;
}

/* --inject-fault: a bit of the generated output flipped in every case
 * with two experts or more (the checker and the shrinker must see it) */
static bool inject_fault;

static fz_outcome_t run_case(wna16_context_t *ctx, const fz_case_t *c,
                             wna16_target_t target, char *msg, size_t n)
{
    *msg = '\0';
    if (c->E < 1 || c->H < 1 || c->I < 1 || !groups_divide(c))
        return FZ_INVALID;
    fz_rng_t r = {c->data};
    wna16_qlayer_t L = {.E = c->E, .H = c->H, .I = c->I};
    wna16_error_t err;
    const wna16_quant_desc_t *q = &c->q;
    if (wna16_qweight_alloc(&L.w13, c->E, 2 * c->I, c->H, q->bits,
                            q->group_size, q->zero_point, q->act_order,
                            q->bias, &err) ||
        wna16_qweight_alloc(&L.w2, c->E, c->H, c->I, q->bits, q->group_size,
                            q->zero_point, q->act_order, q->bias, &err)) {
        wna16_qlayer_free(&L);
        return FZ_INVALID;
    }
    L.w13.scale_dtype = L.w2.scale_dtype = c->scales;
    L.w13.bias_dtype = L.w2.bias_dtype = c->scales;
    fill(&L.w13, &r, c->positive);
    fill(&L.w2, &r, c->positive);
    wna16_tensor_set_t *s = NULL, *ref = NULL, *gen = NULL;
    fz_outcome_t out = FZ_INVALID;
    if (wna16_tensor_set_create(ctx, &s, &err) ||
        wna16_tensor_set_create(ctx, &ref, &err) ||
        wna16_tensor_set_create(ctx, &gen, &err)) {
        snprintf(msg, n, "%s", err.message);
        out = FZ_FAILED;
        goto done;
    }
    /* the source in the 8-bit variant where its layout holds one (Marlin
     * sources), otherwise as it always is */
    wna16_status_t st = wna16_ref_encode_input(ctx, c->src, &L,
                                               q->input_dtype, "m.experts", s,
                                               &err);
    if (st == WNA16_EUNSUPPORTED && q->input_dtype != WNA16_INPUT_16BIT) {
        wna16_tensor_set_destroy(s);
        s = NULL;
        if (wna16_tensor_set_create(ctx, &s, &err) == WNA16_OK)
            st = wna16_ref_encode(ctx, c->src, &L, "m.experts", s, &err);
    }
    if (st != WNA16_OK)
        goto done; /* the source cannot hold this layer */
    wna16_error_t e1, e2;
    wna16_status_t r1 = wna16_repack_layer(ctx, c->src, s, "m.experts", c->E,
                                           c->H, c->I, q, c->dst,
                                           WNA16_TARGET_REFERENCE, ref, &e1);
    wna16_status_t r2 = wna16_repack_layer(ctx, c->src, s, "m.experts", c->E,
                                           c->H, c->I, q, c->dst, target, gen,
                                           &e2);
    if (r1 != r2) {
        snprintf(msg, n, "reference %s%s%s, generated %s%s%s",
                 wna16_status_name(r1), r1 ? ": " : "", r1 ? e1.message : "",
                 wna16_status_name(r2), r2 ? ": " : "", r2 ? e2.message : "");
        out = FZ_FAILED;
    } else if (r1 != WNA16_OK) {
        out = strcmp(e1.message, e2.message) == 0 ? FZ_REFUSED : FZ_FAILED;
        if (out == FZ_FAILED)
            snprintf(msg, n, "refusals differ: reference \"%s\", generated "
                     "\"%s\"", e1.message, e2.message);
    } else {
        if (inject_fault && c->E >= 2 && wna16_tensor_set_count(gen) > 0) {
            const wna16_tensor_t *t = wna16_tensor_set_at(gen, 0);
            if (t->nbytes)
                ((uint8_t *)t->data)[t->nbytes / 2] ^= 1u;
        }
        out = same_sets(ref, gen, msg, n) ? FZ_SAME : FZ_FAILED;
    }
done:
    wna16_tensor_set_destroy(s);
    wna16_tensor_set_destroy(ref);
    wna16_tensor_set_destroy(gen);
    wna16_qlayer_free(&L);
    return out;
}

/* ---- shrinking ------------------------------------------------------------- */

enum { MAX_CANDIDATES = 24, MAX_SHRINK_STEPS = 64 };
_Static_assert((int)MAX_CANDIDATES <= (int)FZ_MAX_CANDIDATES, "candidates");

/* Smaller versions of c, the biggest cuts first: one expert, half or a
 * quarter of a dimension, one option off. */
static bool same_case(const fz_case_t *a, const fz_case_t *b)
{
    return a->src == b->src && a->dst == b->dst && a->E == b->E &&
           a->H == b->H && a->I == b->I && a->q.bits == b->q.bits &&
           a->q.group_size == b->q.group_size &&
           a->q.zero_point == b->q.zero_point &&
           a->q.act_order == b->q.act_order && a->q.bias == b->q.bias &&
           a->q.input_dtype == b->q.input_dtype && a->scales == b->scales &&
           a->positive == b->positive && a->data == b->data;
}

static int candidates(const fz_case_t *c, fz_case_t *out)
{
    int n = 0;
#define CAND(stmt)                                                           \
    do {                                                                     \
        fz_case_t t = *c;                                                    \
        stmt;                                                                \
        if (!same_case(&t, c) && n < MAX_CANDIDATES)                         \
            out[n++] = t;                                                    \
    } while (0)
    CAND(t.E = 1);
    CAND(t.E = c->E - 1);
    static const int32_t cuts[] = {4, 2};
    for (int i = 0; i < 2; i++) {
        if (c->H / cuts[i] >= 16 && (c->H / cuts[i]) % 16 == 0)
            CAND(t.H = c->H / cuts[i]);
        if (c->I / cuts[i] >= 8 && (c->I / cuts[i]) % 8 == 0)
            CAND(t.I = c->I / cuts[i]);
    }
    CAND(t.q.bias = false);
    CAND(t.q.act_order = false);
    CAND(t.q.zero_point = false);
    CAND(t.q.input_dtype = WNA16_INPUT_16BIT; t.positive = false);
    CAND(t.q.bits = 4);
    CAND(t.q.group_size = -1; t.q.act_order = false);
    CAND(t.positive = false);
#undef CAND
    return n;
}

/* ---- the case text ------------------------------------------------------ */

/* keys[k] of a case's text into the case (fz_parse_fields). */
static bool set_field(void *user, int k, const char *v)
{
    fz_case_t *c = user;
    long x = 0;
    bool ok = true;
    switch (k) {
    case 0: ok = cli_parse_int(v, 1, 4096, &x); c->E = (int32_t)x; break;
    case 1: ok = cli_parse_int(v, 1, 65536, &x); c->H = (int32_t)x; break;
    case 2: ok = cli_parse_int(v, 1, 65536, &x); c->I = (int32_t)x; break;
    case 3: ok = cli_parse_int(v, 4, 8, &x) && (x == 4 || x == 8);
            c->q.bits = (int32_t)x; break;
    case 4: /* -1: channelwise */
            if (strcmp(v, "-1") == 0)
                x = -1;
            else
                ok = cli_parse_int(v, 1, 65536, &x);
            c->q.group_size = (int32_t)x; break;
    case 5: ok = fz_parse_bool(v, &c->q.zero_point); break;
    case 6: ok = fz_parse_bool(v, &c->q.act_order); break;
    case 7: ok = fz_parse_bool(v, &c->q.bias); break;
    case 8: c->q.input_dtype = wna16_input_dtype_from_name(v);
            ok = (int)c->q.input_dtype >= 0 &&
                 c->q.input_dtype < WNA16_INPUT_COUNT_; break;
    case 9: c->scales = wna16_dtype_from_name(v, strlen(v));
            ok = c->scales == WNA16_DTYPE_F16 ||
                 c->scales == WNA16_DTYPE_BF16; break;
    case 10: ok = fz_parse_bool(v, &c->positive); break;
    default: {
        char *end = NULL;
        c->data = strtoull(v, &end, 0);
        ok = *v && end && *end == '\0';
    }
    }
    return ok;
}

/* Reads what case_text writes; every key must be present. Returns NULL or
 * the reason, naming the token. */
static const char *parse_case(wna16_context_t *ctx, const char *text,
                              fz_case_t *c, char *why, size_t n)
{
    char buf[1024];
    if (strlen(text) >= sizeof buf)
        return "too long";
    snprintf(buf, sizeof buf, "%s", text);
    memset(c, 0, sizeof *c);
    static const char *const keys[] = {"E", "H", "I", "bits", "group", "zp",
                                       "actorder", "bias", "input", "scales",
                                       "positive", "data"};
    char *save = NULL;
    char *tok = strtok_r(buf, " \t\n", &save);
    char *arrow = tok ? strstr(tok, "->") : NULL;
    if (!arrow) {
        snprintf(why, n, "expected SRC->DST first, found '%s'", tok ? tok : "");
        return why;
    }
    *arrow = '\0';
    c->src = find_any(ctx, tok);
    c->dst = find_any(ctx, arrow + 2);
    if (!c->src || !can_be(c->src, true) || !c->dst || !can_be(c->dst, false)) {
        snprintf(why, n, "'%s->%s': not a source and destination spec", tok,
                 arrow + 2);
        return why;
    }
    return fz_parse_fields(&save, keys, (int)(sizeof keys / sizeof keys[0]),
                           set_field, c, why, n);
}

/* ---- the command ------------------------------------------------------------ */

/* The repack kind for the shared pieces (fuzz_case.c). */
static void kind_text(const void *c, char *buf, size_t n)
{
    case_text(c, buf, n);
}
static fz_outcome_t kind_run(wna16_context_t *ctx, const void *c,
                             wna16_target_t target, char *msg, size_t n)
{
    return run_case(ctx, c, target, msg, n);
}
static int kind_candidates(const void *c, void *out)
{
    return candidates(c, out);
}
static const fz_cases_t repack_kind = {
    .case_size = sizeof(fz_case_t), .max_steps = MAX_SHRINK_STEPS,
    .options = "", .text = kind_text, .run = kind_run,
    .candidates = kind_candidates};

static int parse_opts(int argc, char **argv, fz_opts_t *o)
{
    *o = (fz_opts_t){.kind = FZ_KIND_REPACK, .count = 100, .seed = 1,
                     .target = WNA16_TARGET_CPU, .shrink = true};
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        long x;
        if (cli_is_help(argv[i])) {
            usage(stdout);
            return -1;
        } else if (cli_opt_value(argc, argv, &i, "--kind", &v)) {
            if (v && strcmp(v, "repack") == 0)
                o->kind = FZ_KIND_REPACK;
            else if (v && strcmp(v, "moe") == 0)
                o->kind = FZ_KIND_MOE;
            else
                return cli_usage_error(CMD, "--kind: expected repack or moe");
        } else if (cli_opt_value(argc, argv, &i, "--count", &v)) {
            if (!v || !cli_parse_int(v, 1, 1000000, &x))
                return cli_usage_error(CMD, "--count: expected 1 to 1000000");
            o->count = x;
        } else if (cli_opt_value(argc, argv, &i, "--seed", &v)) {
            char *end = NULL;
            if (v)
                o->seed = strtoull(v, &end, 0);
            if (!v || !*v || *end)
                return cli_usage_error(CMD, "--seed: expected an integer");
        } else if (cli_opt_value(argc, argv, &i, "--target", &v)) {
            if (cli_target(CMD, v, false, &o->target) != CLI_OK)
                return CLI_USAGE;
        } else if (cli_opt_value(argc, argv, &i, "--from", &v)) {
            if (!v)
                return cli_usage_error(CMD, "--from: expected a spec name");
            o->from = v;
        } else if (cli_opt_value(argc, argv, &i, "--to", &v)) {
            if (!v)
                return cli_usage_error(CMD, "--to: expected a spec name");
            o->to = v;
        } else if (cli_opt_value(argc, argv, &i, "--backend", &v)) {
            if (!v)
                return cli_usage_error(CMD, "--backend: expected a spec name");
            o->backend = v;
        } else if (cli_opt_value(argc, argv, &i, "--case", &v)) {
            if (!v)
                return cli_usage_error(CMD, "--case: expected a case (see "
                                       "--help)");
            o->one = v;
        } else if (strcmp(argv[i], "--no-shrink") == 0) {
            o->shrink = false;
        } else if (strcmp(argv[i], "--verbose") == 0) {
            o->verbose = true;
        } else if (strcmp(argv[i], "--json") == 0) {
            o->json = true;
        } else if (strcmp(argv[i], "--inject-fault") == 0) {
            o->inject_fault = true;
        } else {
            return cli_usage_error(CMD, "unknown option '%s'", argv[i]);
        }
    }
    if (o->kind == FZ_KIND_MOE && (o->from || o->to))
        return cli_usage_error(CMD, "--from and --to are the repack kind's; "
                               "--kind moe takes --backend");
    if (o->kind == FZ_KIND_REPACK && o->backend)
        return cli_usage_error(CMD, "--backend is the moe kind's; --kind "
                               "repack takes --from and --to");
    if (o->one && (o->from || o->to || o->backend))
        return cli_usage_error(CMD, "--case names its own specs: no --from, "
                               "--to or --backend with it");
    inject_fault = o->inject_fault;
    return CLI_OK;
}

/* The target must be able to run kernels here: this build has it and its
 * probe finds what it needs (a GPU and NVRTC, or LLVM). Otherwise no case
 * runs: the message says why (exit status 1). */
static int check_target(wna16_context_t *ctx, const fz_opts_t *o)
{
    wna16_error_t err;
    void *inst;
    if (w16_target_probe(ctx, o->target, NULL, &inst, &err) != WNA16_OK) {
        fprintf(stderr, "wna16 fuzz: %s; no case run\n", err.message);
        return o->json ? cli_json_fail(stdout, &err) : CLI_FAIL;
    }
    return CLI_OK;
}

static int fuzz_one(wna16_context_t *ctx, const fz_opts_t *o,
                    fz_report_t *rep)
{
    fz_case_t c;
    char why[512], msg[1024], text[FZ_TEXT];
    if (parse_case(ctx, o->one, &c, why, sizeof why))
        return cli_usage_error(CMD, "--case: %s", why);
    case_text(&c, text, sizeof text);
    fz_outcome_t out = run_case(ctx, &c, o->target, msg, sizeof msg);
    rep->tally[out]++;
    switch (out) {
    case FZ_SAME:
        fprintf(o->out, "ok   %s: same bytes\n", text);
        return CLI_OK;
    case FZ_REFUSED:
        fprintf(o->out, "ok   %s: refused alike\n", text);
        return CLI_OK;
    case FZ_INVALID:
        fprintf(stderr, "wna16 fuzz: %s: the source cannot hold this layer "
                "(group size, shapes or options)\n", text);
        return CLI_FAIL;
    case FZ_FAILED:
    case FZ_UNSUPPORTED: /* not a repack outcome */
        break;
    }
    return fz_report_failure(&repack_kind, ctx, o, &c, msg, sizeof msg, rep);
}

static int fuzz_many(wna16_context_t *ctx, const fz_opts_t *o,
                     fz_report_t *rep)
{
    const wna16_spec_t *from = NULL, *to = NULL;
    if (o->from && !((from = find_any(ctx, o->from)) && can_be(from, true)))
        return cli_usage_error(CMD, "--from: '%s' is not a source spec (a "
                               "checkpoint format or a stacked layout that "
                               "holds codes)", o->from);
    if (o->to && !((to = find_any(ctx, o->to)) && can_be(to, false)))
        return cli_usage_error(CMD, "--to: '%s' is not a destination spec (a "
                               "backend or moe_wna16)", o->to);
    fz_rng_t r = {o->seed};
    long *tally = rep->tally, tries = 0;
    bool tty = isatty(STDERR_FILENO);
    char msg[1024];
    for (long done = 0; done < o->count;) {
        fz_case_t c;
        draw(ctx, &r, from, to, &c);
        tries++;
        fz_outcome_t out = run_case(ctx, &c, o->target, msg, sizeof msg);
        if (out == FZ_INVALID && tries < 50 * o->count)
            continue; /* not a problem: draw again */
        tally[out]++;
        done++;
        if (o->verbose) {
            char text[FZ_TEXT];
            case_text(&c, text, sizeof text);
            static const char *const what[] = {"same bytes", "refused alike",
                                               "skipped", "FAILED"};
            fprintf(stderr, "[%ld/%ld] %s: %s\n", done, o->count, text,
                    what[out]);
        } else {
            fz_progress(o, done, tty);
        }
        if (out == FZ_FAILED) {
            if (tty && !o->verbose)
                fputc('\n', stderr);
            fz_report_failure(&repack_kind, ctx, o, &c, msg, sizeof msg,
                              rep);
            break;
        }
    }
    fprintf(o->out, "wna16 fuzz: %ld cases (seed %#" PRIx64 ", target %s): "
           "%ld same "
           "bytes, %ld refused alike, %ld skipped, %ld failed%s\n",
           tally[FZ_SAME] + tally[FZ_REFUSED] + tally[FZ_INVALID] +
               tally[FZ_FAILED],
           o->seed, wna16_target_name(o->target), tally[FZ_SAME],
           tally[FZ_REFUSED], tally[FZ_INVALID], tally[FZ_FAILED],
           tally[FZ_FAILED] ? " (stopped at the first failure)" : "");
    return tally[FZ_FAILED] ? CLI_FAIL : CLI_OK;
}

void fz_report_json(const fz_opts_t *o, const fz_report_t *r)
{
    static const char *const keys[] = {
        [FZ_SAME] = "passed", [FZ_REFUSED] = "refused_alike",
        [FZ_INVALID] = "skipped", [FZ_FAILED] = "failed",
        [FZ_UNSUPPORTED] = "unsupported"};
    long cases = 0;
    for (int i = 0; i < 5; i++)
        cases += r->tally[i];
    printf("{\"ok\": %s, \"kind\": \"%s\", \"target\": ",
           r->tally[FZ_FAILED] ? "false" : "true",
           o->kind == FZ_KIND_MOE ? "moe" : "repack");
    cli_json_string(stdout, wna16_target_name(o->target));
    printf(", \"seed\": %" PRIu64 ", \"cases\": %ld", o->seed, cases);
    for (int i = 0; i < 5; i++)
        printf(", \"%s\": %ld", keys[i], r->tally[i]);
    printf(", \"seconds\": %.3f, \"failure\": ", r->seconds);
    if (!r->tally[FZ_FAILED]) {
        printf("null}\n");
        return;
    }
    printf("{\"case\": ");
    cli_json_string(stdout, r->failed);
    printf(", \"shrunk\": ");
    cli_json_string(stdout, r->shrunk);
    printf(", \"message\": ");
    cli_json_string(stdout, r->message);
    printf(", \"reproduce\": ");
    cli_json_string(stdout, r->reproduce);
    printf("}}\n");
}

int cmd_fuzz(int argc, char **argv)
{
    fz_opts_t o;
    int rc = parse_opts(argc, argv, &o);
    if (rc < 0)
        return CLI_OK;
    if (rc != CLI_OK)
        return rc;
    wna16_context_t *ctx = cli_context();
    if (!ctx)
        return CLI_FAIL;
    o.out = o.json ? stderr : stdout;
    fz_report_t rep;
    memset(&rep, 0, sizeof rep);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    rc = check_target(ctx, &o);
    if (rc == CLI_OK && o.kind == FZ_KIND_MOE)
        rc = o.one ? fuzz_moe_one(ctx, &o, &rep) : fuzz_moe_many(ctx, &o, &rep);
    else if (rc == CLI_OK)
        rc = o.one ? fuzz_one(ctx, &o, &rep) : fuzz_many(ctx, &o, &rep);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    rep.seconds = (double)(t1.tv_sec - t0.tv_sec) +
                  1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    if (o.json && rc != CLI_USAGE && (rc == CLI_OK || rep.tally[FZ_FAILED]))
        fz_report_json(&o, &rep);
    wna16_context_destroy(ctx);
    return rc;
}
