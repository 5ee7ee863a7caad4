/*
 * test_moe_align.c - MoE routing (wna16_moe_align, wna16_moe_align_batched)
 * against brute force: for each expert in turn, scan every slot, so the
 * expected arrays are built in the most direct way (O(E * M * topk)) and
 * compared entry by entry, padding and tails included. Random routings
 * cover block sizes 1, 16 and 64 (and odd ones), M * topk not a multiple of
 * the block size, experts with no tokens, skewed routings, M = 0 and expert
 * maps with absent experts (non-monotonic maps too). vLLM's own worked
 * examples (the moe_align_block_size and batched_moe_align_block_size
 * docstrings) are checked literally.
 */
#include "moe_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The expected result, built by brute force. */
typedef struct expect {
    int32_t cap, blocks, post, sentinel;
    int32_t *sorted, *experts;
} expect_t;

static int32_t cdiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

static void expect_alloc(expect_t *x, int32_t cap, int32_t bs, int32_t sent)
{
    x->cap = cap;
    x->blocks = cdiv(cap, bs);
    x->sentinel = sent;
    x->post = 0;
    x->sorted = malloc((size_t)(cap > 0 ? cap : 1) * sizeof(int32_t));
    x->experts = malloc((size_t)(x->blocks > 0 ? x->blocks : 1) *
                        sizeof(int32_t));
    for (int32_t i = 0; i < cap; i++)
        x->sorted[i] = sent;
    for (int32_t b = 0; b < x->blocks; b++)
        x->experts[b] = -1;
}

static void expect_free(expect_t *x)
{
    free(x->sorted);
    free(x->experts);
}

/* Appends expert e's slots (in order) and pads its run. */
static void expect_run(expect_t *x, int32_t e, const int32_t *slots,
                       int32_t n, int32_t bs)
{
    if (n == 0)
        return;
    for (int32_t i = 0; i < n; i++)
        x->sorted[x->post + i] = slots[i];
    for (int32_t b = 0; b < cdiv(n, bs); b++)
        x->experts[x->post / bs + b] = e;
    x->post += cdiv(n, bs) * bs;
}

static void brute_align(const int32_t *ids, int32_t M, int32_t topk,
                        int32_t E, const int32_t *map, int32_t bs,
                        expect_t *x)
{
    int32_t numel = M * topk;
    int32_t cap = numel + E * (bs - 1);
    if (numel < E && numel * bs < cap)
        cap = numel * bs;
    expect_alloc(x, cap, bs, numel);
    int32_t *slots = malloc((size_t)(numel > 0 ? numel : 1) * sizeof *slots);
    for (int32_t e = 0; e < E; e++) {
        int32_t n = 0;
        for (int32_t t = 0; t < numel; t++)
            if ((map ? map[ids[t]] : ids[t]) == e)
                slots[n++] = t;
        expect_run(x, e, slots, n, bs);
    }
    free(slots);
}

static void brute_batched(const int32_t *counts, int32_t E, int32_t maxt,
                          int32_t bs, expect_t *x)
{
    expect_alloc(x, E * cdiv(maxt, bs) * bs, bs, E * maxt);
    int32_t *slots = malloc((size_t)(maxt > 0 ? maxt : 1) * sizeof *slots);
    for (int32_t e = 0; e < E; e++) {
        for (int32_t r = 0; r < counts[e]; r++)
            slots[r] = e * maxt + r;
        expect_run(x, e, slots, counts[e], bs);
    }
    free(slots);
}

static void compare(const wna16_moe_alignment_t *a, const expect_t *x,
                    int32_t bs, const char *what)
{
    TU_CHECK_MSG(a->block_size == bs, "%s", what);
    TU_CHECK_MSG(a->sentinel == x->sentinel, "%s: sentinel %d vs %d", what,
                 a->sentinel, x->sentinel);
    TU_CHECK_MSG(a->max_num_tokens_padded == x->cap, "%s: cap %d vs %d",
                 what, a->max_num_tokens_padded, x->cap);
    TU_CHECK_MSG(a->max_num_blocks == x->blocks, "%s: blocks %d vs %d", what,
                 a->max_num_blocks, x->blocks);
    TU_CHECK_MSG(a->num_tokens_post_padded == x->post, "%s: post %d vs %d",
                 what, a->num_tokens_post_padded, x->post);
    TU_CHECK_MSG(x->post <= x->cap, "%s: the bound", what);
    if (a->max_num_tokens_padded != x->cap || a->max_num_blocks != x->blocks)
        return;
    for (int32_t i = 0; i < x->cap; i++)
        if (a->sorted_token_ids[i] != x->sorted[i]) {
            TU_CHECK_MSG(0, "%s: sorted_token_ids[%d] = %d, want %d", what,
                         i, a->sorted_token_ids[i], x->sorted[i]);
            break;
        }
    for (int32_t b = 0; b < x->blocks; b++)
        if (a->expert_ids[b] != x->experts[b]) {
            TU_CHECK_MSG(0, "%s: expert_ids[%d] = %d, want %d", what, b,
                         a->expert_ids[b], x->experts[b]);
            break;
        }
}

/* vLLM's docstring: topk_ids [[2,3,4],[1,2,4],[1,3,4],[1,2,3]], block 4;
 * ids go up to 4, so 5 experts (expert 0 has none). */
static void test_vllm_example(void)
{
    const int32_t ids[12] = {2, 3, 4, 1, 2, 4, 1, 3, 4, 1, 2, 3};
    const int32_t sorted[16] = {3, 6, 9, 12, 0, 4, 10, 12,
                                1, 7, 11, 12, 2, 5, 8, 12};
    wna16_moe_alignment_t a;
    wna16_error_t err;
    TU_OK(wna16_moe_align(ids, 4, 3, 5, NULL, 4, &a, &err), &err);
    TU_CHECK(a.num_tokens_post_padded == 16);
    TU_CHECK(a.sentinel == 12);
    TU_CHECK(a.max_num_tokens_padded == 12 + 5 * 3);
    TU_CHECK(a.max_num_blocks == 7);
    TU_CHECK(memcmp(a.sorted_token_ids, sorted, sizeof sorted) == 0);
    for (int32_t i = 16; i < a.max_num_tokens_padded; i++)
        TU_CHECK(a.sorted_token_ids[i] == 12);
    const int32_t experts[7] = {1, 2, 3, 4, -1, -1, -1};
    TU_CHECK(memcmp(a.expert_ids, experts, sizeof experts) == 0);
    wna16_moe_alignment_free(&a);
    TU_CHECK(a.sorted_token_ids == NULL && a.expert_ids == NULL);
    wna16_moe_alignment_free(&a); /* twice is fine */
    wna16_moe_alignment_free(NULL);
}

/* vLLM's batched docstring: 5 experts, 8 rows each, block 4, counts
 * [2, 3, 0, 6, 8]; sentinel 40. (The docstring's expert_ids list has a
 * typo; vLLM's test reference gives [0, 1, 3, 3, 4, 4, -1, ...].) */
static void test_vllm_batched_example(void)
{
    const int32_t counts[5] = {2, 3, 0, 6, 8};
    const int32_t sorted[24] = {0,  1,  40, 40, 8,  9,  10, 40,
                                24, 25, 26, 27, 28, 29, 40, 40,
                                32, 33, 34, 35, 36, 37, 38, 39};
    const int32_t experts[10] = {0, 1, 3, 3, 4, 4, -1, -1, -1, -1};
    wna16_moe_alignment_t a;
    wna16_error_t err;
    TU_OK(wna16_moe_align_batched(counts, 5, 8, 4, &a, &err), &err);
    TU_CHECK(a.num_tokens_post_padded == 24);
    TU_CHECK(a.sentinel == 40);
    TU_CHECK(a.max_num_tokens_padded == 40 && a.max_num_blocks == 10);
    TU_CHECK(memcmp(a.sorted_token_ids, sorted, sizeof sorted) == 0);
    for (int32_t i = 24; i < 40; i++)
        TU_CHECK(a.sorted_token_ids[i] == 40);
    TU_CHECK(memcmp(a.expert_ids, experts, sizeof experts) == 0);
    wna16_moe_alignment_free(&a);
}

/* A map over G globals: E of them map to local ids in a scrambled,
 * non-monotonic order (two globals may share a local id when 7 and E are
 * not coprime), the rest are absent. */
static void random_map(tu_rng_t *r, int32_t G, int32_t E, int32_t *map)
{
    for (int32_t g = 0; g < G; g++)
        map[g] = -1;
    for (int32_t i = 0; i < E; i++) {
        int32_t g;
        do
            g = (int32_t)tu_rng_below(r, (uint32_t)G);
        while (map[g] != -1);
        map[g] = (i * 7 + 1) % E;
    }
}

static void random_ids(tu_rng_t *r, int32_t *ids, int32_t n, int32_t G)
{
    /* Skewed half the time: most slots on the first few experts, so many
     * experts get none and some get many. */
    bool skew = tu_rng_below(r, 2);
    for (int32_t i = 0; i < n; i++) {
        uint32_t lim = skew && tu_rng_below(r, 4) ? (G < 3 ? (uint32_t)G : 3)
                                                  : (uint32_t)G;
        ids[i] = (int32_t)tu_rng_below(r, lim);
    }
}

static void test_random(void)
{
    static const int32_t block_sizes[] = {1, 16, 64, 3, 7};
    tu_rng_t r;
    tu_rng_seed(&r, 0xa119);
    int cases = 0;
    for (int it = 0; it < 600; it++) {
        int32_t G = 1 + (int32_t)tu_rng_below(&r, 16);
        int32_t M = (int32_t)tu_rng_below(&r, 51); /* 0 .. 50 */
        int32_t kmax = G < 4 ? G : 4;
        int32_t topk = 1 + (int32_t)tu_rng_below(&r, (uint32_t)kmax);
        int32_t bs = block_sizes[it % 5];
        bool use_map = tu_rng_below(&r, 2);
        int32_t E = use_map ? 1 + (int32_t)tu_rng_below(&r, (uint32_t)G) : G;
        int32_t *ids = malloc((size_t)(M * topk + 1) * sizeof *ids);
        int32_t *map = malloc((size_t)G * sizeof *map);
        random_ids(&r, ids, M * topk, G);
        if (use_map)
            random_map(&r, G, E, map);
        char what[160];
        snprintf(what, sizeof what, "M=%d topk=%d E=%d bs=%d map=%d", M, topk,
                 G, bs, use_map);
        wna16_moe_alignment_t a;
        wna16_error_t err;
        expect_t x;
        TU_OK(wna16_moe_align(M ? ids : NULL, M, topk, G,
                              use_map ? map : NULL, bs, &a, &err), &err);
        brute_align(ids, M, topk, G, use_map ? map : NULL, bs, &x);
        compare(&a, &x, bs, what);
        expect_free(&x);
        wna16_moe_alignment_free(&a);
        free(ids);
        free(map);
        cases++;
    }
    printf("align: %d random routings match brute force\n", cases);
}

static void test_random_batched(void)
{
    static const int32_t block_sizes[] = {1, 16, 64, 5};
    tu_rng_t r;
    tu_rng_seed(&r, 0xba7c);
    for (int it = 0; it < 200; it++) {
        int32_t E = 1 + (int32_t)tu_rng_below(&r, 12);
        int32_t maxt = (int32_t)tu_rng_below(&r, 70);
        int32_t bs = block_sizes[it % 4];
        int32_t *counts = malloc((size_t)E * sizeof *counts);
        for (int32_t e = 0; e < E; e++) {
            uint32_t n = tu_rng_below(&r, (uint32_t)maxt + 1);
            counts[e] = tu_rng_below(&r, 3) == 0 ? 0 : (int32_t)n;
        }
        char what[96];
        snprintf(what, sizeof what, "batched E=%d max=%d bs=%d", E, maxt, bs);
        wna16_moe_alignment_t a;
        wna16_error_t err;
        expect_t x;
        TU_OK(wna16_moe_align_batched(counts, E, maxt, bs, &a, &err), &err);
        brute_batched(counts, E, maxt, bs, &x);
        compare(&a, &x, bs, what);
        expect_free(&x);
        wna16_moe_alignment_free(&a);
        free(counts);
    }
}

/* Filtering with a map equals aligning only the kept slots by their local
 * ids (the dropped slots simply vanish), and vLLM's other mode is the
 * unmapped alignment with expert_ids mapped afterwards. */
static void test_map_modes(void)
{
    const int32_t ids[8] = {0, 3, 1, 3, 2, 0, 1, 2}; /* M 4, top-2 */
    const int32_t map[4] = {1, -1, -1, 0};           /* g3 -> 0, g0 -> 1 */
    wna16_moe_alignment_t a, b;
    wna16_error_t err;
    TU_OK(wna16_moe_align(ids, 4, 2, 4, map, 2, &a, &err), &err);
    /* local 0 (g3): slots 1, 3; local 1 (g0): slots 0, 5 */
    const int32_t sorted[4] = {1, 3, 0, 5};
    TU_CHECK(a.num_tokens_post_padded == 4);
    TU_CHECK(memcmp(a.sorted_token_ids, sorted, sizeof sorted) == 0);
    TU_CHECK(a.expert_ids[0] == 0 && a.expert_ids[1] == 1);
    TU_CHECK(a.expert_ids[2] == -1);
    TU_OK(wna16_moe_align(ids, 4, 2, 4, NULL, 2, &b, &err), &err);
    TU_CHECK(b.num_tokens_post_padded == 8);
    int32_t mapped[4];
    for (int32_t i = 0; i < 4; i++)
        mapped[i] = map[b.expert_ids[i]];
    const int32_t vllm_keep[4] = {1, -1, -1, 0};
    TU_CHECK(memcmp(mapped, vllm_keep, sizeof mapped) == 0);
    wna16_moe_alignment_free(&a);
    wna16_moe_alignment_free(&b);
}

int main(void)
{
    test_vllm_example();
    test_vllm_batched_example();
    test_map_modes();
    test_random();
    test_random_batched();
    return tu_finish("test_moe_align");
}
