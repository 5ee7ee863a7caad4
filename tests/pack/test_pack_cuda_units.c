/*
 * test_pack_cuda_units.c - the CUDA tensor-core fused MoE's units in a
 * kernel pack, found by request without a GPU. PACK is built by
 * `wna16 pack build tests/pack/cuda_moe.json` (pack_cli.sh cuda_moe): the
 * marlin layer E=4, H=256, I=128, 4-bit g128, bfloat16, silu, for sm_90
 * and sm_90a. The test makes the requests runtime/cuda/cuda_moe.c makes
 * for that layer, by the same steps as its run (the block_m row for the
 * routed slots per expert, wgmma rows on compute capability 9.0, the
 * tile and the configuration from gen/moe_cuda.h, GEMM 1 with and
 * without its split-K sums), for every slot count up to 4096 and both
 * kinds of device, and checks that the context's packs answer each by
 * its request key with the unit of that name, for the architecture the
 * device would load (wgmma units: sm_90a; the others: sm_90), that every
 * entry of the pack is such an answer (nothing packed that no run asks
 * for), and that other requests and other devices find nothing. With a
 * GPU, w16_cuda_unit_packed loads a unit from the pack on a 9.0 device;
 * without one it says the device is missing.
 *
 *   test_pack_cuda_units PACK
 */
#include "testutil.h"
#include "gen/moe_cuda.h"
#include "gen/request_key.h"
#include "runtime/cache/pack.h"
#include "runtime/cuda/cuda_desc.h"

#include <stdlib.h>
#include <string.h>

enum { E = 4, H = 256, I = 128, MAX_ENTRIES = 64 };

typedef struct lookup {
    wna16_context_t *ctx;
    const char *arches[16];
    int n_arches;
    bool hit[MAX_ENTRIES]; /* entries answered so far */
    int requests;
} lookup_t;

/* Looks `request` up as the runtime does on the device of `L`; checks
 * the answer's name and architecture when `want_arch` is not NULL, else
 * that there is none. */
static void expect(lookup_t *L, w16_key_t request, const char *name,
                   const char *want_arch)
{
    w16_pack_hit_t h;
    bool found = false;
    wna16_error_t err;
    TU_OK(w16_packs_find(L->ctx, request, "cuda", L->arches, L->n_arches, &h,
                         &found, &err), &err);
    L->requests++;
    if (!want_arch) {
        TU_CHECK_MSG(!found, "%s: found as %s (%s)", name,
                     found ? h.entry.name : "", found ? h.entry.arch : "");
        return;
    }
    TU_CHECK_MSG(found, "%s: no pack entry (arches from %s)", name,
                 L->arches[0]);
    if (!found)
        return;
    TU_CHECK_MSG(strcmp(h.entry.name, name) == 0, "%s: entry named %s",
                 name, h.entry.name);
    TU_CHECK_MSG(strcmp(h.entry.arch, want_arch) == 0, "%s: arch %s, want %s",
                 name, h.entry.arch, want_arch);
    TU_CHECK(strcmp(h.entry.target, "cuda") == 0);
    TU_CHECK(strcmp(h.entry.family, "marlin-moe") == 0);
    TU_CHECK(w16_pack_entry_intact(h.pack, h.index));
    /* a CUBIN entry: u64 CUBIN size, u64 PTX size (0), the ELF file */
    uint64_t sizes[2] = {0, 0};
    if (h.entry.size >= 20)
        memcpy(sizes, h.entry.data, 16);
    TU_CHECK_MSG(h.entry.size >= 20 && sizes[1] == 0 &&
                 sizes[0] + 16 == h.entry.size &&
                 memcmp((const char *)h.entry.data + 16, "\177ELF", 4) == 0,
                 "%s: not a CUBIN blob", name);
    if (h.index < MAX_ENTRIES)
        L->hit[h.index] = true;
}

/* The layer's operands and what decides its units, as wna16_cuda_moe_create
 * and a run see them for the repacked bfloat16 layer. */
typedef struct layer {
    const wna16_spec_t *spec;
    w16_moe_operand_t op[2];
    w16_moe_unit_quant_t q;
} layer_t;

/* Every GEMM unit a run on a device of `cc_90` (wgmma rows) may ask for,
 * over the routed slots per expert 1 .. 4096 (runtime/cuda/cuda_moe.c:
 * w16_moe_cuda_block_m, then w16_moe_cuda_cfg per GEMM, GEMM 1's split-K
 * sums where its row splits K), each expected in the pack (`present`) or
 * not. */
static void gemm_requests(lookup_t *L, const layer_t *ly, bool cc_90,
                          bool present)
{
    for (int64_t tpe = 1; tpe <= 4096; tpe += tpe < 200 ? 1 : 97) {
        int bm;
        bool wgmma = false;
        wna16_error_t err;
        TU_OK(w16_moe_cuda_block_m(ly->spec, tpe, cc_90 && !ly->q.act_order,
                                   &bm, &wgmma, &err), &err);
        for (int g = 0; g < 2; g++) {
            w16_moe_gemm_cfg_t c;
            TU_OK(w16_moe_cuda_cfg(ly->spec, &ly->op[g], &ly->q, bm, wgmma,
                                   (wna16_gemm_t)g, &c, NULL, &err), &err);
            int max_split, cps;
            w16_moe_cuda_split(ly->spec, bm, wgmma, (wna16_gemm_t)g,
                               ly->op[g].N, ly->op[g].K, &max_split, &cps);
            bool can_split = g == WNA16_GEMM_W13 && !wgmma &&
                             max_split > 1 && ly->op[g].K / c.block_k > 1;
            /* at most 32 routed slots: the units that route their own
             * row block (the layer's E = 4 experts: up to 8 an expert) */
            bool can_route = !wgmma && !ly->q.act_order &&
                             tpe * E <= W16_MOE_SELF_ROUTE_SLOTS;
            for (int s = 0; s < 4; s++) {
                c.split_sums = s & 1;
                c.self_route = s & 2;
                if ((c.split_sums && !can_split) ||
                    (c.self_route && !can_route))
                    continue;
                char name[160];
                w16_moe_gemm_name(&c, name, sizeof name);
                expect(L, w16_moe_cuda_gemm_key(&c), name,
                       !present ? NULL : wgmma ? "sm_90a" : "sm_90");
            }
        }
    }
}

static void aux_requests(lookup_t *L, wna16_dtype_t act, const char *arch)
{
    for (int p = 0; p < W16_AUX_PIECES; p++)
        expect(L, w16_moe_cuda_aux_key(act, p), w16_moe_aux_unit(act, p),
               arch);
}

/* With a GPU: the unit loads from the pack on a 9.0 device (and is not
 * found on others: the pack has no entry they run). Without one: the
 * device's absence, not a crash or a compile. */
static void device_lookup(wna16_context_t *ctx, const layer_t *ly)
{
    int bm;
    bool wgmma;
    wna16_error_t err;
    w16_moe_gemm_cfg_t c;
    TU_OK(w16_moe_cuda_block_m(ly->spec, 1, false, &bm, &wgmma, &err), &err);
    TU_OK(w16_moe_cuda_cfg(ly->spec, &ly->op[1], &ly->q, bm, wgmma,
                           WNA16_GEMM_W2, &c, NULL, &err), &err);
    char name[160];
    w16_moe_gemm_name(&c, name, sizeof name);
    const char *names[1] = {name};
    w16_cuda_function_t *fn = NULL;
    bool found = true;
    wna16_status_t st = w16_cuda_unit_packed(ctx, w16_moe_cuda_gemm_key(&c),
                                             name, names, 1, &fn, &found,
                                             &err);
    w16_cuda_t *cuda = NULL;
    wna16_error_t e2;
    if (w16_cuda_get(ctx, &cuda, &e2) != WNA16_OK) {
        TU_CHECK_MSG(st == WNA16_EUNAVAILABLE && !found, "no GPU: %s",
                     wna16_status_name(st));
        printf("no GPU (%s): the pack lookup alone was checked\n",
               e2.message);
        return;
    }
    TU_OK(st, &err);
    bool on_90 = w16_cuda_cc_major(cuda) == 9 && w16_cuda_cc_minor(cuda) == 0;
    TU_CHECK_MSG(found == on_90 && (!found || fn), "%s on compute capability "
                 "%d.%d: found %d", name, w16_cuda_cc_major(cuda),
                 w16_cuda_cc_minor(cuda), found);
    printf("GPU %s: %s %s from the pack\n", w16_cuda_device_name(cuda), name,
           found ? "loaded" : "not found (no entry for this device)");
}

int main(int argc, char **argv)
{
    if (argc < 2)
        tu_skip("usage: test_pack_cuda_units PACK");
    if (!tu_exists(argv[1]))
        tu_skip("no CUDA unit pack (pack_cli.sh cuda_moe skipped: no NVRTC)");
    wna16_context_t *ctx = tu_context();
    wna16_error_t err;
    TU_OK(wna16_context_add_pack(ctx, argv[1], &err), &err);
    /* a pack of another generator is skipped whole: nothing would be found */
    w16_pack_t *pk = NULL;
    TU_OK(w16_pack_open(argv[1], &pk, &err), &err);
    w16_pack_info_t info = {.generator = ""};
    if (pk)
        w16_pack_get_info(pk, &info);
    TU_CHECK_MSG(strcmp(info.generator, w16_generator_version()) == 0,
                 "%s was built by generator %s, this library is %s (rebuild "
                 "wna16 and the pack)", argv[1], info.generator,
                 w16_generator_version());
    layer_t ly = {.spec = wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "marlin")};
    TU_CHECK(ly.spec != NULL);
    if (!ly.spec)
        return tu_finish("pack_cuda_units");
    w16_problem_t p = {E, H, I, 4, 128, .model_dtype = WNA16_DTYPE_BF16};
    for (int g = 0; g < 2; g++)
        TU_OK(w16_moe_cuda_contract(ly.spec, &p, (wna16_gemm_t)g, &ly.op[g],
                                    &err), &err);
    ly.q = (w16_moe_unit_quant_t){
        .bits = 4, .group_size = 128, .act_dtype = WNA16_DTYPE_BF16,
        .scale_dtype = WNA16_DTYPE_BF16, .bias_dtype = WNA16_DTYPE_F16,
        .activation = WNA16_ACT_SILU};

    /* an H100/H200 (9.0): sm_90a, sm_90, then PTX; every unit found */
    lookup_t L = {.ctx = ctx};
    L.n_arches = w16_cuda_pack_arches_cc(9, 0, L.arches, 16);
    TU_CHECK(L.n_arches >= 3 && strcmp(L.arches[0], "sm_90a") == 0 &&
             strcmp(L.arches[1], "sm_90") == 0);
    gemm_requests(&L, &ly, true, true);
    /* the mma.sync rows an sm_80/sm_89 device picks (a 9.0 device too
     * for an act-order layer): packed for sm_90 as well, found there */
    gemm_requests(&L, &ly, false, true);
    aux_requests(&L, WNA16_DTYPE_BF16, "sm_90");
    /* every entry answers some request: the pack holds what runs ask for */
    uint32_t n = pk ? w16_pack_count(pk) : 0, answered = 0;
    TU_CHECK(n > 0 && n <= MAX_ENTRIES);
    for (uint32_t i = 0; i < n && i < MAX_ENTRIES; i++) {
        w16_pack_entry_t e;
        w16_pack_entry(pk, i, &e);
        answered += L.hit[i];
        TU_CHECK_MSG(L.hit[i], "entry %u %s (%s) answers no request", i,
                     e.name, e.arch);
    }
    if (pk)
        w16_pack_close(pk);
    printf("compute capability 9.0: %d requests, %u of %u entries answered\n",
           L.requests, answered, n);

    /* what the pack does not hold: the float16 pieces, another bit width,
     * and any unit on an sm_80 device (its CUBINs and PTX are not there) */
    aux_requests(&L, WNA16_DTYPE_F16, NULL);
    layer_t b8 = ly;
    b8.q.bits = 8;
    gemm_requests(&L, &b8, true, false);
    lookup_t L80 = {.ctx = ctx};
    L80.n_arches = w16_cuda_pack_arches_cc(8, 0, L80.arches, 16);
    TU_CHECK(L80.n_arches >= 2 && strcmp(L80.arches[0], "sm_80") == 0 &&
             strcmp(L80.arches[1], "compute_80") == 0);
    gemm_requests(&L80, &ly, false, false);
    aux_requests(&L80, WNA16_DTYPE_BF16, NULL);

    device_lookup(ctx, &ly);
    wna16_context_destroy(ctx);
    return tu_finish("pack_cuda_units");
}
