/*
 * request_key.c - kernel keys by request (see request_key.h). The fields
 * are hashed one by one with the keyer of base/hash.h, so a key never
 * depends on struct padding or on where a spec happens to live (a spec
 * enters by the hash of its JSON).
 */
#include "gen/request_key.h"

#include <stdint.h>
#include <string.h>

/* Written at configure time by cmake/gen_fingerprint.cmake: a hash of the
 * generator's sources (gen/, templates/ and the files that set the
 * compilers' options). */
extern const char w16_gen_fingerprint[];

const char *w16_generator_version(void)
{
    static const char *v;
    static char buf[96];
    if (!v) { /* idempotent: every thread writes the same bytes */
        size_t n = strlen(WNA16_VERSION_STRING);
        memcpy(buf, WNA16_VERSION_STRING, n);
        memcpy(buf + n, "+gen.", 5);
        size_t f = strlen(w16_gen_fingerprint);
        if (f > sizeof buf - n - 6)
            f = sizeof buf - n - 6;
        memcpy(buf + n + 5, w16_gen_fingerprint, f);
        buf[n + 5 + f] = 0;
        v = buf;
    }
    return v;
}

/* Tripwires: every field a builder reads is hashed below, so a field
 * added to one of these structs must be added here too, or two requests
 * that differ only in it would share a pack entry (and a memo slot). The
 * sizes are the structs' as hashed here (LP64); a change that fails one
 * extends the put_* lines and the size together. */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(w16_problem_t) == 64, "w16_problem_t changed: hash "
               "the new field in put_problem (gen/request_key.c)");
_Static_assert(sizeof(w16_repack_request_t) == 136, "w16_repack_request_t "
               "changed: hash the new field in w16_repack_request_key");
_Static_assert(sizeof(w16_moe_request_t) == 216, "w16_moe_request_t "
               "changed: hash the new field in w16_moe_request_key");
_Static_assert(sizeof(wna16_moe_params_t) == 48, "wna16_moe_params_t "
               "changed: hash the new field in w16_moe_request_key if the "
               "builder reads it");
#endif

/* The fields go into one array of u64 hashed in one call (a keyer field
 * per value costs several times more): the array's layout is fixed here,
 * so equal requests give equal bytes. */
typedef struct fields {
    uint64_t v[96];
    int n;
} fields_t;

static void put(fields_t *f, uint64_t x) { f->v[f->n++] = x; }

static void put_spec(fields_t *f, const wna16_spec_t *s)
{
    put(f, s ? s->content_hash[0] : 0);
    put(f, s ? s->content_hash[1] : 0);
}

static void put_problem(fields_t *f, const w16_problem_t *p)
{
    const int64_t dims[] = {p->E, p->H, p->I, p->BITS, p->GS, p->zp,
                            p->act_order, p->bias, p->zeros_stored,
                            p->g_idx_stored, p->a8, p->ungated,
                            p->model_dtype};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        put(f, (uint64_t)dims[i]);
}

static w16_key_t done(const char *what, const fields_t *f)
{
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, what);
    w16_keyer_str(&kr, w16_generator_version());
    w16_keyer_bytes(&kr, f->v, sizeof f->v[0] * (size_t)f->n);
    return w16_keyer_done(&kr);
}

w16_key_t w16_repack_request_key(const w16_repack_request_t *r, bool sums)
{
    fields_t f = {.n = 0};
    put(&f, sums);
    put_spec(&f, r->src);
    put_spec(&f, r->dst);
    put_problem(&f, &r->problem);
    put(&f, (uint64_t)r->gemm);
    put(&f, (uint64_t)r->role);
    for (int i = 0; i < W16_ROLE_COUNT; i++)
        put(&f, (uint64_t)r->src_dtype[i]);
    put(&f, (uint64_t)r->dst_dtype);
    put(&f, (uint64_t)r->lanes);
    put(&f, r->sort_k);
    put(&f, r->word_blocks);
    put(&f, r->staged_tiles);
    return done("wna16 repack request", &f);
}

/* Tripwire as above: a field added to the CUDA GEMM configuration is
 * hashed in w16_moe_cuda_gemm_key too. */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(w16_moe_gemm_cfg_t) == 84, "w16_moe_gemm_cfg_t "
               "changed: hash the new field in w16_moe_cuda_gemm_key");
#endif

w16_key_t w16_moe_cuda_gemm_key(const w16_moe_gemm_cfg_t *c)
{
    fields_t f = {.n = 0};
    const int64_t v[] = {
        c->gemm, c->bits, c->zp, c->act_order, c->grouped, c->scales,
        c->act_dtype, c->scale_dtype, c->bias_dtype, c->activation,
        c->block_m, c->block_n, c->block_k, c->warps_n, c->warps_k,
        c->stages, c->min_ctas, c->wgmma, c->scales_in_b, c->ws,
        c->acc_scales, c->wgmma_groups, c->split_codes, c->group_stages,
        c->split_sums, c->self_route, c->group_size, c->tail_m,
        c->persistent};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        put(&f, (uint64_t)v[i]);
    return done("wna16 cuda moe gemm unit", &f);
}

w16_key_t w16_moe_cuda_aux_key(wna16_dtype_t act_dtype, int piece)
{
    fields_t f = {.n = 0};
    put(&f, (uint64_t)act_dtype);
    put(&f, (uint64_t)piece);
    return done("wna16 cuda moe aux unit", &f);
}

/* Tripwire as above, for the decode unit's configuration. */
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(w16_moe_decode_cfg_t) == 36, "w16_moe_decode_cfg_t "
               "changed: hash the new field in w16_moe_cuda_decode_key");
#endif

w16_key_t w16_moe_cuda_decode_key(const w16_moe_decode_cfg_t *c)
{
    fields_t f = {.n = 0};
    const int64_t v[] = {c->bits,      c->zp,          c->grouped,
                         c->group_size, c->scales[0],  c->scales[1],
                         c->act_dtype, c->scale_dtype, c->bias_dtype,
                         c->activation};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        put(&f, (uint64_t)v[i]);
    return done("wna16 cuda moe decode unit", &f);
}

static uint64_t f32_bits(float x)
{
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    return bits;
}

w16_key_t w16_moe_request_key(const w16_moe_request_t *r,
                              w16_moe_stage_t stage)
{
    fields_t f = {.n = 0};
    put(&f, (uint64_t)stage);
    put_spec(&f, r->backend);
    put_problem(&f, &r->problem);
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < W16_ROLE_COUNT; i++)
            put(&f, (uint64_t)r->dtype[g][i]);
    const wna16_moe_params_t *p = &r->params;
    put(&f, (uint64_t)p->activation);
    bool limit = p->activation == WNA16_ACT_SWIGLUOAI ||
                 p->activation == WNA16_ACT_SWIGLUSTEP;
    bool ab = p->activation == WNA16_ACT_SWIGLUOAI;
    put(&f, f32_bits(limit ? p->swiglu_limit : 0.0f));
    put(&f, f32_bits(ab ? p->swiglu_alpha : 0.0f));
    put(&f, f32_bits(ab ? p->swiglu_beta : 0.0f));
    put(&f, p->apply_router_weight_on_input);
    put(&f, (uint64_t)p->act_dtype);
    put(&f, p->round_gemm_outputs);
    put(&f, r->batched);
    put(&f, r->batched_weights);
    put(&f, (uint64_t)r->topk);
    put(&f, (uint64_t)r->block_m);
    put(&f, (uint64_t)r->lanes);
    put(&f, (uint64_t)r->qweight_align);
    put(&f, r->device_route);
    /* only where it changes the kernel: the f32 keys, those kernel packs
     * and the gen snapshot hold, stay as they were */
    if (r->numerics != WNA16_NUMERICS_F32 &&
        (stage == W16_MOE_GEMM1 || stage == W16_MOE_GEMM2))
        put(&f, (uint64_t)r->numerics);
    return done("wna16 moe request", &f);
}
