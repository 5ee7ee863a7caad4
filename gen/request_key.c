/*
 * request_key.c - kernel keys by request (see request_key.h). The fields
 * are hashed one by one with the keyer of base/hash.h, so a key never
 * depends on struct padding or on where a spec happens to live (a spec
 * enters by the hash of its JSON).
 */
#include "gen/request_key.h"

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

static void key_spec(w16_keyer_t *kr, const wna16_spec_t *s)
{
    w16_keyer_u64(kr, s ? s->content_hash[0] : 0);
    w16_keyer_u64(kr, s ? s->content_hash[1] : 0);
}

static void key_problem(w16_keyer_t *kr, const w16_problem_t *p)
{
    const int64_t dims[] = {p->E, p->H, p->I, p->BITS, p->GS, p->zp,
                            p->act_order, p->bias, p->zeros_stored,
                            p->g_idx_stored, p->a8, p->ungated};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        w16_keyer_u64(kr, (uint64_t)dims[i]);
}

w16_key_t w16_repack_request_key(const w16_repack_request_t *r, bool sums)
{
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 repack request");
    w16_keyer_str(&kr, w16_generator_version());
    w16_keyer_u64(&kr, sums);
    key_spec(&kr, r->src);
    key_spec(&kr, r->dst);
    key_problem(&kr, &r->problem);
    w16_keyer_u64(&kr, (uint64_t)r->gemm);
    w16_keyer_u64(&kr, (uint64_t)r->role);
    for (int i = 0; i < W16_ROLE_COUNT; i++)
        w16_keyer_u64(&kr, (uint64_t)r->src_dtype[i]);
    w16_keyer_u64(&kr, (uint64_t)r->dst_dtype);
    w16_keyer_u64(&kr, (uint64_t)r->lanes);
    w16_keyer_u64(&kr, r->sort_k);
    w16_keyer_u64(&kr, r->word_blocks);
    w16_keyer_u64(&kr, r->staged_tiles);
    return w16_keyer_done(&kr);
}

static void key_f32(w16_keyer_t *kr, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    w16_keyer_u64(kr, bits);
}

w16_key_t w16_moe_request_key(const w16_moe_request_t *r,
                              w16_moe_stage_t stage)
{
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_str(&kr, "wna16 moe request");
    w16_keyer_str(&kr, w16_generator_version());
    w16_keyer_u64(&kr, (uint64_t)stage);
    key_spec(&kr, r->backend);
    key_problem(&kr, &r->problem);
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < W16_ROLE_COUNT; i++)
            w16_keyer_u64(&kr, (uint64_t)r->dtype[g][i]);
    const wna16_moe_params_t *p = &r->params;
    w16_keyer_u64(&kr, (uint64_t)p->activation);
    bool limit = p->activation == WNA16_ACT_SWIGLUOAI ||
                 p->activation == WNA16_ACT_SWIGLUSTEP;
    bool ab = p->activation == WNA16_ACT_SWIGLUOAI;
    key_f32(&kr, limit ? p->swiglu_limit : 0.0f);
    key_f32(&kr, ab ? p->swiglu_alpha : 0.0f);
    key_f32(&kr, ab ? p->swiglu_beta : 0.0f);
    w16_keyer_u64(&kr, p->apply_router_weight_on_input);
    w16_keyer_u64(&kr, (uint64_t)p->act_dtype);
    w16_keyer_u64(&kr, p->round_gemm_outputs);
    w16_keyer_u64(&kr, r->batched);
    w16_keyer_u64(&kr, r->batched_weights);
    w16_keyer_u64(&kr, (uint64_t)r->topk);
    w16_keyer_u64(&kr, (uint64_t)r->block_m);
    w16_keyer_u64(&kr, (uint64_t)r->lanes);
    w16_keyer_u64(&kr, (uint64_t)r->qweight_align);
    return w16_keyer_done(&kr);
}
