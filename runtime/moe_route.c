/*
 * moe_route.c - MoE routing for block kernels: the M x topk routed slots
 * sorted by expert and each expert's run padded to the kernel's block size
 * (vLLM's moe_align_block_size), and the batched form for expert-major
 * inputs (batched_moe_align_block_size). A block kernel then takes one
 * block of block_size slots at a time, all of one expert, and skips the
 * padding slots (the sentinel). Plain C and deterministic: a stable
 * counting sort keeps the slot order inside each expert, which vLLM's CUDA
 * kernel (atomics) does not promise but its torch reference does. The
 * array sizes are vLLM's, so results can be compared with it entry by
 * entry.
 */
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

void wna16_moe_alignment_free(wna16_moe_alignment_t *a)
{
    if (!a)
        return;
    free(a->sorted_token_ids);
    free(a->expert_ids);
    memset(a, 0, sizeof *a);
}

static int64_t round_up64(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Allocates the two arrays for `cap` slots (at least one element each so
 * the pointers are never NULL), filled with the sentinel and -1. */
static wna16_status_t alloc_arrays(wna16_moe_alignment_t *a, int64_t cap,
                                   wna16_error_t *err)
{
    a->max_num_tokens_padded = (int32_t)cap;
    a->max_num_blocks = (int32_t)((cap + a->block_size - 1) / a->block_size);
    size_t ns = cap > 0 ? (size_t)cap : 1;
    size_t nb = a->max_num_blocks > 0 ? (size_t)a->max_num_blocks : 1;
    a->sorted_token_ids = malloc(ns * sizeof(int32_t));
    a->expert_ids = malloc(nb * sizeof(int32_t));
    if (!a->sorted_token_ids || !a->expert_ids) {
        wna16_moe_alignment_free(a);
        return w16_err_nomem(err, "the MoE alignment arrays");
    }
    for (size_t i = 0; i < ns; i++)
        a->sorted_token_ids[i] = a->sentinel;
    for (size_t i = 0; i < nb; i++)
        a->expert_ids[i] = -1;
    return WNA16_OK;
}

/* ---- standard form ------------------------------------------------------ */

static wna16_status_t check_align_args(const int32_t *ids, int32_t M,
                                       int32_t topk, int32_t num_experts,
                                       int32_t block_size, wna16_error_t *err)
{
    if (M < 0)
        return w16_err(err, WNA16_EINVAL, "moe align: M = %d tokens (must "
                       "be >= 0)", M);
    if (num_experts < 1)
        return w16_err(err, WNA16_EINVAL, "moe align: num_experts = %d "
                       "(must be >= 1)", num_experts);
    if (topk < 1 || topk > num_experts)
        return w16_err(err, WNA16_EINVAL, "moe align: topk = %d is outside "
                       "[1, num_experts = %d]", topk, num_experts);
    if (block_size < 1)
        return w16_err(err, WNA16_EINVAL, "moe align: block_size = %d (must "
                       "be >= 1)", block_size);
    if (M > 0 && !ids)
        return w16_err(err, WNA16_EINVAL, "moe align: topk_ids is NULL");
    return WNA16_OK;
}

/* vLLM's max_num_tokens_padded; fails past INT32_MAX (the sentinel and the
 * indices are int32). */
static wna16_status_t align_capacity(int32_t M, int32_t topk,
                                     int32_t num_experts, int32_t block_size,
                                     int64_t *cap, wna16_error_t *err)
{
    int64_t numel = (int64_t)M * topk;
    int64_t c = numel + (int64_t)num_experts * (block_size - 1);
    /* At most numel experts have slots, each padded to <= its count
     * times block_size. */
    if (numel < num_experts && numel * block_size < c)
        c = numel * block_size;
    if (numel > INT32_MAX || c > INT32_MAX)
        return w16_err(err, WNA16_EINVAL, "moe align: %d tokens x top-%d "
                       "with %d experts and block size %d needs %lld slots "
                       "(more than INT32_MAX)", M, topk, num_experts,
                       block_size, (long long)c);
    *cap = c;
    return WNA16_OK;
}

static wna16_status_t check_ids(const int32_t *ids, int32_t M, int32_t topk,
                                int32_t num_experts, const int32_t *map,
                                wna16_error_t *err)
{
    if (map)
        for (int32_t g = 0; g < num_experts; g++)
            if (map[g] < -1 || map[g] >= num_experts)
                return w16_err(err, WNA16_EINVAL, "moe align: expert_map[%d] "
                               "= %d is neither -1 nor an expert in [0, %d)",
                               g, map[g], num_experts);
    for (int32_t m = 0; m < M; m++)
        for (int32_t j = 0; j < topk; j++) {
            int32_t g = ids[(size_t)m * topk + j];
            if (g < 0 || g >= num_experts)
                return w16_err(err, WNA16_EINVAL, "moe align: "
                               "topk_ids[%d][%d] = %d is not an expert id in "
                               "[0, %d)", m, j, g, num_experts);
        }
    return WNA16_OK;
}

/* Places the slots: counts per expert, each expert's padded start, then a
 * stable pass in slot order. `start` has num_experts entries. */
static void align_fill(const int32_t *ids, int32_t numel, const int32_t *map,
                       wna16_moe_alignment_t *a, int32_t *start)
{
    int32_t E = a->num_experts, bs = a->block_size;
    memset(start, 0, (size_t)E * sizeof *start);
    for (int32_t t = 0; t < numel; t++) {
        int32_t e = map ? map[ids[t]] : ids[t];
        if (e >= 0)
            start[e]++;
    }
    int32_t pos = 0;
    for (int32_t e = 0; e < E; e++) {
        int32_t padded = (int32_t)round_up64(start[e], bs);
        for (int32_t b = pos / bs; b < (pos + padded) / bs; b++)
            a->expert_ids[b] = e;
        start[e] = pos; /* from now on: the next free slot of expert e */
        pos += padded;
    }
    a->num_tokens_post_padded = pos;
    for (int32_t t = 0; t < numel; t++) {
        int32_t e = map ? map[ids[t]] : ids[t];
        if (e >= 0)
            a->sorted_token_ids[start[e]++] = t;
    }
}

wna16_status_t wna16_moe_align(const int32_t *topk_ids, int32_t M,
                               int32_t topk, int32_t num_experts,
                               const int32_t *expert_map, int32_t block_size,
                               wna16_moe_alignment_t *out, wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "moe align: out is NULL");
    memset(out, 0, sizeof *out);
    int64_t cap = 0;
    wna16_status_t st = check_align_args(topk_ids, M, topk, num_experts,
                                         block_size, err);
    if (st == WNA16_OK)
        st = align_capacity(M, topk, num_experts, block_size, &cap, err);
    if (st == WNA16_OK)
        st = check_ids(topk_ids, M, topk, num_experts, expert_map, err);
    if (st != WNA16_OK)
        return st;
    int32_t *start = malloc((size_t)num_experts * sizeof *start);
    if (!start)
        return w16_err_nomem(err, "the MoE alignment counts");
    out->block_size = block_size;
    out->num_experts = num_experts;
    out->sentinel = M * topk;
    st = alloc_arrays(out, cap, err);
    if (st == WNA16_OK)
        align_fill(topk_ids, M * topk, expert_map, out, start);
    free(start);
    return st;
}

/* ---- batched form ------------------------------------------------------- */

static wna16_status_t check_batched(const int32_t *counts, int32_t E,
                                    int32_t max_tokens, int32_t block_size,
                                    int64_t *cap, wna16_error_t *err)
{
    if (!counts)
        return w16_err(err, WNA16_EINVAL, "moe align batched: "
                       "expert_num_tokens is NULL");
    if (E < 1 || max_tokens < 0 || block_size < 1)
        return w16_err(err, WNA16_EINVAL, "moe align batched: num_experts = "
                       "%d, max_tokens = %d, block_size = %d (need >= 1, >= "
                       "0, >= 1)", E, max_tokens, block_size);
    *cap = (int64_t)E * round_up64(max_tokens, block_size);
    if (*cap > INT32_MAX)
        return w16_err(err, WNA16_EINVAL, "moe align batched: %d experts x "
                       "%d rows (block size %d) is more than INT32_MAX "
                       "slots", E, max_tokens, block_size);
    for (int32_t e = 0; e < E; e++)
        if (counts[e] < 0 || counts[e] > max_tokens)
            return w16_err(err, WNA16_EINVAL, "moe align batched: "
                           "expert_num_tokens[%d] = %d is outside [0, %d]", e,
                           counts[e], max_tokens);
    return WNA16_OK;
}

wna16_status_t wna16_moe_align_batched(const int32_t *expert_num_tokens,
                                       int32_t num_experts, int32_t max_tokens,
                                       int32_t block_size,
                                       wna16_moe_alignment_t *out,
                                       wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "moe align batched: out is NULL");
    memset(out, 0, sizeof *out);
    int64_t cap = 0;
    wna16_status_t st = check_batched(expert_num_tokens, num_experts,
                                      max_tokens, block_size, &cap, err);
    if (st != WNA16_OK)
        return st;
    out->block_size = block_size;
    out->num_experts = num_experts;
    out->sentinel = num_experts * max_tokens;
    st = alloc_arrays(out, cap, err);
    if (st != WNA16_OK)
        return st;
    int32_t pos = 0;
    for (int32_t e = 0; e < num_experts; e++) {
        int32_t n = expert_num_tokens[e];
        for (int32_t r = 0; r < n; r++)
            out->sorted_token_ids[pos + r] = e * max_tokens + r;
        int32_t padded = (int32_t)round_up64(n, block_size);
        for (int32_t b = pos / block_size; b < (pos + padded) / block_size;
             b++)
            out->expert_ids[b] = e;
        pos += padded;
    }
    out->num_tokens_post_padded = pos;
    return WNA16_OK;
}
