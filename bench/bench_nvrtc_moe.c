/*
 * bench_nvrtc_moe.c - the cold NVRTC compile time of the CUDA fused MoE's
 * translation units (templates/ specialized by gen/moe_cuda.c), per unit
 * and per variant, and what a layer's first call waits for: its GEMM
 * units and the routing/gather/finalize kernels. Each unit is compiled as
 * the runtime compiles it (w16_nvrtc_compile_unit: the kernels of a unit
 * of several optimized in parallel threads), alone, one after another
 * (the per-unit figures); then a first call's units all at once in
 * parallel threads (wall time), two ways, interleaved in every round so
 * that both see the same machine:
 *   before  the routing kernels in one unit (the runtime until they were
 *           split): aux, GEMM 1, GEMM 2 in three threads;
 *   after   the routing kernels in the runtime's three pieces
 *           (gen/moe_cuda.h): the GEMMs, the route piece and the piece
 *           of w16_finalize_small in four threads (what a run with few
 *           outputs and GEMM 2 split along K compiles; a run with another
 *           finalize compiles the gather_finalize piece instead, which is
 *           faster), and all five units in five threads (a bound).
 * Calls NVRTC directly, so the kernel cache plays no part: every compile
 * is cold. Needs NVRTC and the toolkit's headers, no GPU (compiling for
 * sm_90 runs on the CPU).
 *
 *   bench_nvrtc_moe [reps] [arch]     (defaults: 3, 90)
 *
 * Variants: the layer `wna16 run` uses (E 128, H 2048, I 768, top-8,
 * int4 group-128 GPTQ, bf16 activations, fp16 scales, the marlin spec's
 * tiling table) at several token counts (each picks its routing block
 * and tiles), then the other quantization families at 16 tokens. Each
 * figure is the median of `reps` compiles.
 */
#define _POSIX_C_SOURCE 200809L
#include "wna16.h"
#include "bench/bench_util.h"
#include "gen/moe_cuda.h"
#include "runtime/cuda/cuda.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { E = 128, H = 2048, I = 768, TOPK = 8, MAX_REPS = 15 };

static int arch = 90;

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct unit {
    char name[176];
    w16_buf_t src;
    int n_kernels;
    double ms; /* of the last compile */
    wna16_status_t st;
    wna16_error_t err;
} unit_t;

static wna16_context_t *ctx;

static void *compile_thread(void *arg)
{
    unit_t *u = arg;
    w16_cuda_image_t img;
    double t0 = (bench_seconds() * 1e3);
    u->st = w16_nvrtc_compile_unit(ctx, u->src.data, u->name, u->n_kernels,
                                   arch / 10, arch % 10, &img, &u->err);
    u->ms = (bench_seconds() * 1e3) - t0;
    if (u->st == WNA16_OK)
        w16_cuda_image_free(&img);
    return NULL;
}

/* The units of one first call: [0] the routing kernels in one unit,
 * [1 .. W16_AUX_PIECES] in the runtime's pieces, then GEMM 1 and GEMM 2. */
enum { U_WHOLE = 0, U_GEMM1 = 1 + W16_AUX_PIECES, U_GEMM2, N_UNITS };
typedef struct variant {
    const char *what;
    int tokens;
    int bits;
    int group; /* -1: channelwise */
    bool zp, act_order;
    wna16_dtype_t act, scale;
} variant_t;

static wna16_status_t make_units(const wna16_spec_t *spec, const variant_t *v,
                                 unit_t u[N_UNITS], wna16_error_t *err)
{
    wna16_quant_desc_t q = {.bits = v->bits, .group_size = v->group,
                            .zero_point = v->zp, .act_order = v->act_order};
    w16_problem_t p = {E, H, I, q.bits, q.group_size, q.zero_point,
                       q.act_order, q.bias, q.zeros_stored, q.g_idx_stored};
    w16_moe_operand_t op[2];
    int64_t tpe = ((int64_t)v->tokens * TOPK + E - 1) / E;
    int bm;
    bool wgmma = false;
    wna16_status_t st = w16_moe_cuda_block_m(spec, tpe, arch == 90 &&
                                             !v->act_order, &bm, &wgmma, err);
    for (int i = 0; i < N_UNITS; i++)
        w16_buf_init(&u[i].src, ctx);
    for (int piece = 0; piece <= W16_AUX_WHOLE && st == WNA16_OK; piece++) {
        unit_t *a = &u[piece == W16_AUX_WHOLE ? U_WHOLE : 1 + piece];
        int first;
        w16_moe_aux_range(piece, &first, &a->n_kernels);
        snprintf(a->name, sizeof a->name, "%s",
                 w16_moe_aux_unit(v->act, piece));
        st = w16_moe_aux_source(v->act, piece, &a->src, err);
    }
    u[U_GEMM1].n_kernels = 2; /* GEMM 1 and its split-K reduce */
    u[U_GEMM2].n_kernels = 1;
    for (int g = 0; g < 2 && st == WNA16_OK; g++) {
        st = w16_moe_cuda_contract(spec, &p, (wna16_gemm_t)g, &op[g], err);
        w16_moe_gemm_cfg_t c;
        memset(&c, 0, sizeof c);
        if (st == WNA16_OK)
            st = w16_moe_cuda_tile(spec, bm, wgmma, (wna16_gemm_t)g, op[g].N,
                                   op[g].K,
                                   &c, NULL, err);
        c.bits = v->bits;
        c.zp = v->zp;
        c.act_order = v->act_order;
        w16_moe_cfg_groups(&c, op[g].G, p.GS);
        c.scales = op[g].scales;
        c.act_dtype = v->act;
        c.scale_dtype = v->scale;
        c.bias_dtype = WNA16_DTYPE_F16;
        c.activation = g == 0 ? WNA16_ACT_SILU : WNA16_ACT_INVALID;
        if (st == WNA16_OK)
            st = w16_moe_gemm_source(&c, &u[U_GEMM1 + g].src, err);
        w16_moe_gemm_name(&c, u[U_GEMM1 + g].name, sizeof u[U_GEMM1 + g].name);
    }
    for (int i = 0; i < N_UNITS && st == WNA16_OK; i++)
        if (u[i].src.failed)
            st = w16_err_nomem(err, "writing a unit");
    return st;
}

/* The units pick[0 .. n) one after another (each unit's time in its ms)
 * or in n threads; returns the wall time, or a negative value on
 * failure. */
static double compile_units(unit_t *u, const int *pick, int n, bool threads)
{
    pthread_t th[N_UNITS];
    double t0 = (bench_seconds() * 1e3);
    for (int i = 0; i < n; i++) {
        if (!threads)
            compile_thread(&u[pick[i]]);
        else if (pthread_create(&th[i], NULL, compile_thread, &u[pick[i]])) {
            fprintf(stderr, "pthread_create failed\n");
            return -1;
        }
    }
    for (int i = 0; threads && i < n; i++)
        pthread_join(th[i], NULL);
    double wall = (bench_seconds() * 1e3) - t0;
    for (int i = 0; i < n; i++)
        if (u[pick[i]].st != WNA16_OK) {
            fprintf(stderr, "%s: %s\n", u[pick[i]].name,
                    u[pick[i]].err.message);
            return -1;
        }
    return wall;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 3;
    if (argc > 2)
        arch = atoi(argv[2]);
    if (reps < 1 || reps > MAX_REPS || arch < 50) {
        fprintf(stderr, "usage: bench_nvrtc_moe [reps 1..%d] [arch, e.g. "
                "90]\n", MAX_REPS);
        return 2;
    }
    wna16_error_t err;
    if (!w16_nvrtc_available(NULL, &err)) {
        printf("SKIP: %s\n", err.message);
        return 0;
    }
    if (wna16_context_create(NULL, &ctx, &err) != WNA16_OK) {
        fprintf(stderr, "%s\n", err.message);
        return 1;
    }
    const wna16_spec_t *spec = wna16_spec_find(ctx, WNA16_SPEC_BACKEND,
                                               "marlin");
    if (!spec) {
        fprintf(stderr, "no built-in marlin spec\n");
        return 1;
    }
    const wna16_dtype_t F16 = WNA16_DTYPE_F16, BF16 = WNA16_DTYPE_BF16;
    const variant_t variants[] = {
        {"default layer", 1, 4, 128, false, false, BF16, F16},
        {"default layer", 16, 4, 128, false, false, BF16, F16},
        {"default layer", 64, 4, 128, false, false, BF16, F16},
        {"default layer", 512, 4, 128, false, false, BF16, F16},
        {"default layer", 4096, 4, 128, false, false, BF16, F16},
        {"fp16, fp16 scales", 16, 4, 128, false, false, F16, F16},
        {"zero points (AWQ)", 16, 4, 128, true, false, F16, F16},
        {"act-order", 16, 4, 128, false, true, BF16, BF16},
        {"8-bit", 16, 8, 128, false, false, BF16, BF16},
        {"channelwise", 16, 4, -1, false, false, BF16, BF16},
    };
    /* a warm-up compile: loads NVRTC's builtins, so the first figure is
     * not the library's load time */
    unit_t warm[N_UNITS];
    memset(warm, 0, sizeof warm);
    if (make_units(spec, &variants[0], warm, &err) == WNA16_OK)
        compile_thread(&warm[1]);
    for (int i = 0; i < N_UNITS; i++)
        w16_buf_free(&warm[i].src);

    printf("%s, sm_%d, median of %d rounds, every compile cold (no kernel "
           "cache)\n", w16_nvrtc_version(), arch, reps);
    printf("per unit: alone, as the runtime compiles it; first call, units "
           "in parallel threads: before (routing in one unit: 3 units) -> "
           "after (GEMMs, route and finalize_small pieces: 4 units) / (all "
           "%d units)\n", N_UNITS - 1);
    static const int before_units[] = {U_WHOLE, U_GEMM1, U_GEMM2};
    static const int after_units[] = {U_GEMM1, U_GEMM2,
                                      1 + W16_AUX_PIECE_ROUTE,
                                      1 + W16_AUX_PIECE_FINALIZE_SMALL};
    int all_units[N_UNITS - 1];
    for (int i = 0; i < N_UNITS - 1; i++)
        all_units[i] = 1 + i;
    double worst_gemm = 0, worst_piece = 0, worst_whole = 0;
    double worst_call[3] = {0, 0, 0};
    for (size_t vi = 0; vi < sizeof variants / sizeof variants[0]; vi++) {
        const variant_t *v = &variants[vi];
        unit_t u[N_UNITS];
        memset(u, 0, sizeof u);
        if (make_units(spec, v, u, &err) != WNA16_OK) {
            fprintf(stderr, "%s: %s\n", v->what, err.message);
            return 1;
        }
        /* each unit alone, then the two first calls */
        double t[N_UNITS][MAX_REPS], call[3][MAX_REPS];
        for (int r = 0; r < reps; r++) {
            for (int i = 0; i < N_UNITS; i++) {
                int one = i;
                if (compile_units(u, &one, 1, false) < 0)
                    return 1;
                t[i][r] = u[i].ms;
            }
            call[0][r] = compile_units(u, before_units, 3, true);
            call[1][r] = compile_units(u, after_units, 4, true);
            call[2][r] = compile_units(u, all_units, N_UNITS - 1, true);
            if (call[0][r] < 0 || call[1][r] < 0 || call[2][r] < 0)
                return 1;
        }
        printf("%s, %d tokens:\n", v->what, v->tokens);
        for (int i = 0; i < N_UNITS; i++) {
            double a = median(t[i], reps);
            double *worst = i == U_WHOLE ? &worst_whole
                            : i < U_GEMM1 ? &worst_piece : &worst_gemm;
            *worst = a > *worst ? a : *worst;
            printf("  %6.1f ms  %s (%d kernel%s)%s\n", a, u[i].name,
                   u[i].n_kernels, u[i].n_kernels > 1 ? "s" : "",
                   i == U_WHOLE ? ", before" : "");
        }
        double c[3];
        for (int k = 0; k < 3; k++) {
            c[k] = median(call[k], reps);
            worst_call[k] = c[k] > worst_call[k] ? c[k] : worst_call[k];
        }
        printf("  first call: %.1f -> %.1f / %.1f ms\n", c[0], c[1], c[2]);
        for (int i = 0; i < N_UNITS; i++)
            w16_buf_free(&u[i].src);
    }
    printf("slowest unit: GEMM %.1f ms, routing %.1f ms in one unit -> %.1f "
           "ms the slowest piece; slowest first call: %.1f -> %.1f / %.1f "
           "ms\n", worst_gemm, worst_whole, worst_piece, worst_call[0],
           worst_call[1], worst_call[2]);
    wna16_context_destroy(ctx);
    return 0;
}
