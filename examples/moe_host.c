/*
 * moe_host.c - wna16 used the way an inference engine uses it, JIT: open a
 * Hugging Face checkpoint (one file or sharded), find the device, let
 * backend selection pick the kernel layout for it, repack every MoE layer
 * on that device with generated kernels, and run the fused MoE of each
 * layer for several batch sizes. The first run of a batch size compiles
 * (or loads from the kernel cache) what it needs; the next runs reuse it.
 * Prints one line per layer with the times.
 *
 *   moe_host CHECKPOINT [--backend NAME] [--batches 1,8,64] [--threads N]
 *                       [--cache DIR] [--repeat R]
 *
 * The backend is vLLM's choice for the device (wna16_select); --backend
 * names another. On the CPU, vLLM picks its CPU backend, whose VNNI
 * blocks the generated kernels read code by code: --backend triton (codes
 * in k order) is the fast layout there for real model sizes.
 *
 * Build: cc moe_host.c $(pkg-config --cflags --libs wna16), or CMake's
 * find_package(wna16) and wna16::wna16 (examples/CMakeLists.txt).
 */
#define _POSIX_C_SOURCE 200809L
#include <wna16.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* An example may exit on the first error; a library never does. */
#define CHECK(call)                                                          \
    do {                                                                     \
        if ((call) != WNA16_OK) {                                            \
            fprintf(stderr, "moe_host: %s: %s\n",                            \
                    wna16_status_name(err.status), err.message);             \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The fused MoE of one layer on the device: the CPU's generated kernels
 * or the CUDA tensor-core kernels, behind one run function. */
typedef struct {
    wna16_moe_layer_t *cpu;
    wna16_cuda_moe_t *gpu;
} moe_t;

static wna16_status_t moe_run(moe_t *m, const wna16_moe_params_t *p,
                              const void *hidden, int32_t M,
                              const int32_t *ids, const float *w, int32_t topk,
                              void *out, wna16_error_t *err)
{
    if (m->gpu)
        return wna16_cuda_moe_run(m->gpu, p, hidden, M, ids, w, topk, out, err);
    return wna16_moe_layer_run(m->cpu, p, hidden, M, ids, w, topk, out, err);
}

int main(int argc, char **argv)
{
    const char *path = NULL, *backend_name = NULL, *cache = NULL;
    char batches[256] = "1,8,64";
    int threads = 0, repeat = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backend") && i + 1 < argc)
            backend_name = argv[++i];
        else if (!strcmp(argv[i], "--batches") && i + 1 < argc)
            snprintf(batches, sizeof batches, "%s", argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--cache") && i + 1 < argc)
            cache = argv[++i];
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc)
            repeat = atoi(argv[++i]);
        else if (argv[i][0] != '-' && !path)
            path = argv[i];
        else {
            fprintf(stderr, "usage: moe_host CHECKPOINT [--backend NAME] "
                    "[--batches 1,8,64] [--threads N] [--cache DIR] "
                    "[--repeat R]\n");
            return 2;
        }
    }
    if (!path || repeat < 1) {
        fprintf(stderr, "usage: moe_host CHECKPOINT [options]\n");
        return 2;
    }
    wna16_error_t err = {0};

    /* 1. a context: the kernel cache and the CPU threads are the host's */
    wna16_context_options_t opts = {.cpu_threads = threads,
                                    .cache_dir = cache};
    wna16_context_t *ctx;
    CHECK(wna16_context_create(&opts, &ctx, &err));

    /* 2. the checkpoint, its format and its MoE layers */
    wna16_checkpoint_t *ck;
    CHECK(wna16_checkpoint_open(ctx, path, &ck, &err));
    const wna16_model_config_t *cfg = wna16_checkpoint_config(ck);
    if (!cfg) {
        fprintf(stderr, "moe_host: %s has no config.json\n", path);
        return 1;
    }
    const wna16_spec_t *format =
        wna16_spec_find(ctx, WNA16_SPEC_FORMAT, cfg->format_name);
    if (!format) {
        fprintf(stderr, "moe_host: no format spec for quant_method '%s'\n",
                cfg->quant_method);
        return 1;
    }
    wna16_moe_layers_t layers;
    CHECK(wna16_checkpoint_moe_layers(ctx, ck, format, &layers, &err));
    if (!layers.count) {
        fprintf(stderr, "moe_host: %s has no MoE layer\n", path);
        return 1;
    }

    /* 3. the device, and the backend selection picks for it */
    wna16_device_info_t dev;
    wna16_probe_device(&dev);
    bool gpu = dev.platform == WNA16_PLATFORM_CUDA;
    wna16_target_t target = gpu ? WNA16_TARGET_CUDA : WNA16_TARGET_CPU;
    wna16_checkpoint_layer_t L;
    CHECK(wna16_checkpoint_layer_open(ctx, ck, NULL, format,
                                      layers.prefixes[0], &L, &err));
    wna16_select_query_t q = {
        .platform = dev.platform, .cc_major = dev.cc_major,
        .cc_minor = dev.cc_minor, .format = format ? wna16_spec_name(format)
                                                   : NULL,
        .quant = L.quant, .hidden_size = L.H, .intermediate_size = L.I,
        .num_experts = L.E, .top_k = L.topk, .backend = backend_name};
    wna16_select_result_t sel;
    CHECK(wna16_select(ctx, &q, &sel, &err));
    wna16_checkpoint_layer_close(&L);
    printf("device: %s (%s); backend: %s; %zu MoE layers, %d experts, "
           "hidden %d, intermediate %d, top-%d, %d-bit\n", dev.name,
           wna16_platform_name(dev.platform), wna16_spec_name(sel.backend),
           layers.count, cfg->num_experts, cfg->hidden_size,
           cfg->moe_intermediate_size, cfg->num_experts_per_tok, cfg->bits);

    /* 4. every layer: repack on the device, then the fused MoE for each
     * batch size (first run: compile or cache load; then cached runs) */
    int32_t Ms[16], nM = 0;
    for (char *s = strtok(batches, ","); s && nM < 16; s = strtok(NULL, ","))
        Ms[nM++] = atoi(s);
    for (size_t l = 0; l < layers.count; l++) {
        CHECK(wna16_checkpoint_layer_open(ctx, ck, NULL, format,
                                          layers.prefixes[l], &L, &err));
        wna16_tensor_set_t *packed;
        CHECK(wna16_tensor_set_create(ctx, &packed, &err));
        double t0 = now_ms();
        CHECK(wna16_repack_layer(ctx, L.format, L.tensors, L.prefix, L.E, L.H,
                                 L.I, &L.quant, sel.backend, target, packed,
                                 &err));
        double repack_ms = now_ms() - t0;
        moe_t moe = {0};
        if (gpu)
            CHECK(wna16_cuda_moe_create(ctx, sel.backend, packed, L.prefix,
                                        L.E, L.H, L.I, &L.quant, false,
                                        &moe.gpu, &err));
        else
            CHECK(wna16_moe_layer_create(ctx, sel.backend, packed, L.prefix,
                                         L.E, L.H, L.I, &L.quant, target,
                                         &moe.cpu, &err));
        printf("%s: repack %.1f ms", L.prefix, repack_ms);
        wna16_moe_params_t p;
        wna16_moe_params_init(&p);
        p.act_dtype = L.act_dtype;
        int32_t topk = L.topk > 0 ? L.topk : 1;
        for (int b = 0; b < nM; b++) {
            int32_t M = Ms[b];
            uint16_t *x = malloc((size_t)M * L.H * 2);
            uint16_t *y = malloc((size_t)M * L.H * 2);
            int32_t *ids = malloc((size_t)M * topk * sizeof *ids);
            float *w = malloc((size_t)M * topk * sizeof *w);
            if (!x || !y || !ids || !w) {
                fprintf(stderr, "moe_host: out of memory\n");
                return 1;
            }
            for (int64_t i = 0; i < (int64_t)M * L.H; i++) {
                float v = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
                x[i] = p.act_dtype == WNA16_DTYPE_F16 ? wna16_f32_to_f16(v)
                                                      : wna16_f32_to_bf16(v);
            }
            for (int32_t m = 0; m < M; m++)
                for (int32_t k = 0; k < topk; k++) {
                    ids[m * topk + k] = (m * 31 + k) % L.E; /* distinct */
                    w[m * topk + k] = 1.0f / (float)topk;
                }
            double first = 0, best = 1e30;
            for (int r = 0; r <= repeat; r++) {
                t0 = now_ms();
                CHECK(moe_run(&moe, &p, x, M, ids, w, topk, y, &err));
                double t = now_ms() - t0;
                if (r == 0)
                    first = t;
                else if (t < best)
                    best = t;
            }
            printf("; M=%d first %.2f ms, cached %.3f ms", M, first, best);
            free(x);
            free(y);
            free(ids);
            free(w);
        }
        printf("\n");
        wna16_moe_layer_destroy(moe.cpu);
        wna16_cuda_moe_destroy(moe.gpu);
        wna16_tensor_set_destroy(packed);
        wna16_checkpoint_layer_close(&L);
    }
    wna16_moe_layers_free(&layers);
    wna16_checkpoint_close(ck);
    wna16_context_destroy(ctx);
    return 0;
}
