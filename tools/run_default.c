/*
 * run_default.c - the embedded default layer of `wna16 run`: one real MoE
 * layer shape, Qwen3-30B-A3B's (hidden 2048, intermediate 768, 128
 * experts, top-8), with random int4 group-128 weights, made in memory as
 * the tensors of a symmetric AutoGPTQ checkpoint.
 *
 * The weights are made in the logical form (codes and fp16 scales; that
 * form is the truth the reference later reads) and encoded into GPTQ
 * tensors by the reference encoder through the gptq format spec, so the
 * tensors are exactly what the spec says a GPTQ checkpoint holds (qweight,
 * scales, the z-1 qzeros words of a symmetric checkpoint, g_idx). The
 * encoder is scalar; experts are independent, so each expert is encoded
 * as a layer of one on its own thread and its tensors are then named as
 * expert e of the whole layer.
 */
#include "run.h"
#include "spec/spec.h"
#include "runtime/ref/ref.h" /* the loader's cast to the model dtype */

#include <stdlib.h>
#include <string.h>

/* Qwen3-30B-A3B's MoE layer (config.json of Qwen/Qwen3-30B-A3B-GPTQ-Int4:
 * hidden_size 2048, moe_intermediate_size 768, num_experts 128,
 * num_experts_per_tok 8, bits 4, group_size 128, sym, no desc_act). */
enum {
    DEFAULT_E = 128, DEFAULT_H = 2048, DEFAULT_I = 768, DEFAULT_TOPK = 8,
    DEFAULT_BITS = 4, DEFAULT_GROUP = 128
};
static const char default_prefix[] = "model.layers.0.mlp.experts";

/* splitmix64: decorrelates the per-expert seeds. */
static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static uint64_t next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

/* Expert e of operand q: uniform random codes, scales uniform in
 * [0.005, 0.025] rounded to fp16 (the checkpoint's scale dtype, so the
 * encoded tensors hold exactly these values). With H = 2048 and I = 768
 * the layer's outputs for activations in [-1, 1] are of order 1. The
 * stream depends only on (seed, operand, e): any thread order gives the
 * same layer. */
static void fill_expert(wna16_qweight_t *q, int op, int32_t e, uint64_t seed)
{
    uint64_t s = mix(mix(seed) ^ mix((uint64_t)op << 32 | (uint32_t)e)) | 1;
    size_t n = (size_t)q->N * q->K, per = 64 / (size_t)q->bits;
    uint8_t *c = q->codes + (size_t)e * n;
    unsigned mask = (1u << q->bits) - 1;
    for (size_t j = 0; j < n; j += per) {
        uint64_t r = next(&s);
        for (size_t b = 0; b < per && j + b < n; b++)
            c[j + b] = (uint8_t)((r >> (b * (size_t)q->bits)) & mask);
    }
    size_t ng = (size_t)q->G * q->N;
    float *sc = q->scales + (size_t)e * ng;
    for (size_t j = 0; j < ng; j++) {
        float v = 0.005f + (float)(next(&s) >> 40) * 0x1p-24f * 0.02f;
        sc[j] = wna16_f16_to_f32(wna16_f32_to_f16(v));
    }
}

/* Expert e of operand q as an operand of one expert (a view). */
static wna16_qweight_t expert_view(const wna16_qweight_t *q, int32_t e)
{
    wna16_qweight_t v = *q;
    v.E = 1;
    v.codes += (size_t)e * q->N * q->K;
    v.scales += (size_t)e * q->G * q->N;
    return v;
}

typedef struct make_job {
    wna16_context_t *ctx;
    run_layer_t *L;
    uint64_t seed;
} make_job_t;

static wna16_status_t make_expert(void *user, size_t i, wna16_error_t *err)
{
    make_job_t *j = user;
    run_layer_t *L = j->L;
    int32_t e = (int32_t)i;
    fill_expert(&L->logical.w13, 0, e, j->seed);
    fill_expert(&L->logical.w2, 1, e, j->seed);
    wna16_qlayer_t one = {.E = 1, .H = L->H, .I = L->I,
                          .w13 = expert_view(&L->logical.w13, e),
                          .w2 = expert_view(&L->logical.w2, e)};
    wna16_status_t st = wna16_tensor_set_create(j->ctx, &L->parts[i], err);
    if (st == WNA16_OK)
        st = wna16_ref_encode(j->ctx, L->format, &one, L->prefix, L->parts[i],
                              err);
    return st;
}

/* Adds expert e's tensors ("{prefix}.0.{rest}" in its own layer of one)
 * to the layer's set as "{prefix}.{e}.{rest}". */
static wna16_status_t gather_expert(run_layer_t *L, int32_t e,
                                    wna16_error_t *err)
{
    char head[600];
    snprintf(head, sizeof head, "%s.0.", L->prefix);
    size_t hn = strlen(head);
    const wna16_tensor_set_t *part = L->parts[e];
    for (size_t i = 0; i < wna16_tensor_set_count(part); i++) {
        wna16_tensor_t t = *wna16_tensor_set_at(part, i);
        if (strncmp(t.name, head, hn) != 0)
            return w16_err(err, WNA16_EINTERNAL, "the %s encoder wrote '%s', "
                           "not a tensor of expert 0 under '%s'",
                           wna16_spec_name(L->format), t.name, L->prefix);
        char name[WNA16_TENSOR_NAME_MAX];
        int n = snprintf(name, sizeof name, "%s.%d.%s", L->prefix, e,
                         t.name + hn);
        if (n < 0 || (size_t)n >= sizeof name)
            return w16_err(err, WNA16_ELIMIT, "tensor name '%s' too long",
                           t.name);
        t.name = name;
        wna16_status_t st = wna16_tensor_set_add_view(L->tensors, &t, err);
        if (st != WNA16_OK)
            return st;
    }
    return WNA16_OK;
}

int run_default_shape(wna16_context_t *ctx, const run_opts_t *o,
                      run_layer_t *L)
{
    memset(L, 0, sizeof *L);
    L->format = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq");
    if (!L->format || L->format->stacked) {
        fprintf(stderr, "wna16: the embedded default needs the per-expert "
                "'gptq' format spec\n");
        return CLI_FAIL;
    }
    snprintf(L->prefix, sizeof L->prefix, "%s", default_prefix);
    L->E = o->experts ? (int32_t)o->experts : DEFAULT_E;
    L->H = DEFAULT_H;
    L->I = DEFAULT_I;
    L->topk = L->E < DEFAULT_TOPK ? L->E : DEFAULT_TOPK;
    /* Qwen3's torch_dtype, or --dtype */
    L->act_dtype = o->dtype ? o->dtype : WNA16_DTYPE_BF16;
    L->quant = (wna16_quant_desc_t){.bits = DEFAULT_BITS,
                                    .group_size = DEFAULT_GROUP,
                                    .model_dtype = L->act_dtype};
    snprintf(L->source, sizeof L->source, "Qwen3-30B-A3B's MoE layer shape (hidden %d, intermediate %d, "
             "%d%s experts, top-%d), random int4 group-%d GPTQ weights "
             "(seed %ld)", L->H, L->I, L->E, L->E == DEFAULT_E ? "" : " of 128",
             L->topk, DEFAULT_GROUP, o->seed);
    return CLI_OK;
}

int run_default_make(wna16_context_t *ctx, const run_opts_t *o,
                     run_layer_t *L, run_log_t *log)
{
    wna16_error_t err;
    run_log_step(log, "layer: %s", L->source);
    run_log_more(log, "codes and fp16 scales made in memory, encoded as GPTQ "
                 "tensors through the gptq format spec (reference encoder, %d "
                 "threads)", run_threads());

    wna16_status_t st = wna16_qweight_alloc(&L->logical.w13, L->E, 2 * L->I,
                                            L->H, DEFAULT_BITS, DEFAULT_GROUP,
                                            false, false, false, &err);
    if (st == WNA16_OK)
        st = wna16_qweight_alloc(&L->logical.w2, L->E, L->H, L->I,
                                 DEFAULT_BITS, DEFAULT_GROUP, false, false,
                                 false, &err);
    L->logical.E = L->E;
    L->logical.H = L->H;
    L->logical.I = L->I;
    L->logical.w13.scale_dtype = L->logical.w2.scale_dtype = WNA16_DTYPE_F16;
    L->has_logical = true;
    L->n_parts = (size_t)L->E;
    L->parts = calloc(L->n_parts, sizeof *L->parts);
    if (st == WNA16_OK && !L->parts)
        st = w16_err(&err, WNA16_ENOMEM, "out of memory");
    if (st == WNA16_OK)
        st = wna16_tensor_set_create(ctx, &L->tensors, &err);
    make_job_t job = {ctx, L, (uint64_t)o->seed};
    if (st == WNA16_OK)
        st = run_parallel(L->n_parts, make_expert, &job, &err);
    for (int32_t e = 0; st == WNA16_OK && e < L->E; e++)
        st = gather_expert(L, e, &err);
    if (st != WNA16_OK)
        return cli_fail(&err);
    /* the truth the kernels run: f16 GPTQ scales as vLLM loads them into
     * parameters of the model's dtype (the repack casts them alike) */
    w16_qweight_cast(&L->logical.w13, L->quant.model_dtype);
    w16_qweight_cast(&L->logical.w2, L->quant.model_dtype);
    run_layer_finish(L);
    run_log_more(log, "%zu tensors, %.1f MB (%.2f s)", L->n_tensors,
                 (double)L->bytes / 1e6, run_log_elapsed(log));
    return CLI_OK;
}
