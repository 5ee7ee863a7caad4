/*
 * test_threads.c - what wna16.h says may be shared between threads, done
 * from several threads at once: one context (its spec registry, kernel
 * cache and CPU target, created lazily by whichever thread comes first)
 * used by threads that each repack the same layer with generated CPU
 * kernels, then one compiled fused-MoE layer run by several threads at
 * once (and a second layer beside it), every result compared with what
 * one thread computed alone. Also the per-context options a host sets:
 * cpu_threads (the CPU target's pool really has that many threads; bad
 * values and a bad $WNA16_NUM_THREADS refused), the log callback (called
 * from the library's threads), the cache directory (kernels land there).
 * Built twice: in the main build (test host_threads) and under
 * ThreadSanitizer by tests/host/tsan (test host_tsan_threads), where a
 * data race fails it. Needs the CPU target (LLVM) and the golden
 * checkpoint gptq_b4_g128 (WNA16_GOLDEN_DIR); skips (77) without them.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "runtime/cpu/cpu.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define N_THREADS 4
#define N_ROUNDS 3

static atomic_int log_calls;

static void count_log(void *user, wna16_log_level_t level, const char *msg)
{
    (void)user;
    (void)level;
    (void)msg;
    atomic_fetch_add(&log_calls, 1);
}

/* ---- shared state of the threads -------------------------------------------- */

typedef struct {
    wna16_context_t *ctx;
    const wna16_checkpoint_layer_t *L;
    const wna16_spec_t *backend;
    const wna16_tensor_set_t *expect; /* the reference target's repack */
} repack_job_t;

typedef struct {
    wna16_moe_layer_t *layer;
    wna16_moe_params_t p;
    int32_t M, topk, H;
    const uint16_t *hidden;
    const int32_t *ids;
    const float *w;
    const uint16_t *expect; /* the run of one thread alone */
} run_job_t;

typedef struct {
    int failures;
    char what[WNA16_ERROR_MESSAGE_MAX + 64];
} thread_result_t;

static void fail(thread_result_t *r, const char *what, const wna16_error_t *e)
{
    if (!r->failures++)
        snprintf(r->what, sizeof r->what, "%s%s%s", what, e ? ": " : "",
                 e ? e->message : "");
}

static bool same_sets(const wna16_tensor_set_t *a, const wna16_tensor_set_t *b)
{
    if (wna16_tensor_set_count(a) != wna16_tensor_set_count(b))
        return false;
    for (size_t i = 0; i < wna16_tensor_set_count(a); i++) {
        const wna16_tensor_t *x = wna16_tensor_set_at(a, i);
        const wna16_tensor_t *y = wna16_tensor_set_find(b, x->name);
        if (!y || y->nbytes != x->nbytes ||
            memcmp(x->data, y->data, x->nbytes) != 0)
            return false;
    }
    return true;
}

static void *repack_thread(void *arg)
{
    repack_job_t *j = arg;
    thread_result_t *r = calloc(1, sizeof *r);
    for (int round = 0; r && round < N_ROUNDS; round++) {
        wna16_error_t err;
        wna16_tensor_set_t *out = NULL;
        if (wna16_tensor_set_create(j->ctx, &out, &err) != WNA16_OK) {
            fail(r, "wna16_tensor_set_create", &err);
            break;
        }
        if (wna16_repack_layer(j->ctx, j->L->format, j->L->tensors,
                               j->L->prefix, j->L->E, j->L->H, j->L->I,
                               &j->L->quant, j->backend, WNA16_TARGET_CPU,
                               out, &err) != WNA16_OK)
            fail(r, "wna16_repack_layer", &err);
        else if (!same_sets(out, j->expect))
            fail(r, "a CPU repack differs from the reference repack", NULL);
        wna16_tensor_set_destroy(out);
    }
    return r;
}

static void *run_thread(void *arg)
{
    run_job_t *j = arg;
    thread_result_t *r = calloc(1, sizeof *r);
    size_t n = (size_t)j->M * (size_t)j->H;
    uint16_t *out = malloc(n * sizeof *out);
    if (!r || !out) {
        free(out);
        return r;
    }
    for (int round = 0; round < N_ROUNDS; round++) {
        wna16_error_t err;
        memset(out, 0xff, n * sizeof *out);
        if (wna16_moe_layer_run(j->layer, &j->p, j->hidden, j->M, j->ids,
                                j->w, j->topk, out, &err) != WNA16_OK)
            fail(r, "wna16_moe_layer_run", &err);
        else if (memcmp(out, j->expect, n * sizeof *out) != 0)
            fail(r, "a concurrent run differs from the run alone", NULL);
    }
    free(out);
    return r;
}

static void join_all(pthread_t *t, int n, const char *what)
{
    for (int i = 0; i < n; i++) {
        void *res = NULL;
        pthread_join(t[i], &res);
        thread_result_t *r = res;
        TU_CHECK_MSG(r && r->failures == 0, "%s thread %d: %s", what, i,
                     r ? r->what : "out of memory");
        free(r);
    }
}

/* ---- the options ---------------------------------------------------------------- */

static void check_thread_options(void)
{
    wna16_error_t err;
    wna16_context_t *ctx = NULL;
    wna16_context_options_t o = {.cpu_threads = -1};
    TU_CHECK(wna16_context_create(&o, &ctx, &err) == WNA16_EINVAL);
    TU_CHECK_MSG(strstr(err.message, "cpu_threads -1"), "%s", err.message);
    o.cpu_threads = WNA16_MAX_CPU_THREADS + 1;
    TU_CHECK(wna16_context_create(&o, &ctx, &err) == WNA16_EINVAL);
    setenv("WNA16_NUM_THREADS", "two", 1);
    o.cpu_threads = 0;
    TU_CHECK(wna16_context_create(&o, &ctx, &err) == WNA16_EINVAL);
    TU_CHECK_MSG(strstr(err.message, "WNA16_NUM_THREADS='two'"), "%s",
                 err.message);
    /* the option wins over the environment */
    o.cpu_threads = 3;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    w16_cpu_t *cpu = NULL;
    if (ctx && w16_cpu_get(ctx, &cpu, &err) == WNA16_OK)
        TU_CHECK_MSG(w16_cpu_threads(cpu) == 3, "%d threads",
                     w16_cpu_threads(cpu));
    wna16_context_destroy(ctx);
    ctx = NULL;
    setenv("WNA16_NUM_THREADS", "2", 1);
    o.cpu_threads = 0;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (ctx && w16_cpu_get(ctx, &cpu, &err) == WNA16_OK)
        TU_CHECK_MSG(w16_cpu_threads(cpu) == 2, "%d threads",
                     w16_cpu_threads(cpu));
    wna16_context_destroy(ctx);
    unsetenv("WNA16_NUM_THREADS");
}

/* ---- main ----------------------------------------------------------------------- */

int main(void)
{
    char ckpt[4096];
    snprintf(ckpt, sizeof ckpt, "%s/gptq_b4_g128", WNA16_GOLDEN_DIR);
    struct stat sb;
    if (stat(ckpt, &sb) != 0)
        tu_skip("no golden checkpoint gptq_b4_g128 (WNA16_GOLDEN_DIR)");
    check_thread_options();
#ifndef WNA16_HAVE_LLVM
    /* the pool is there (kernels from packs run on it), the compiler not */
    if (tu_failures)
        return tu_finish("host_threads");
    tu_skip("this build cannot compile CPU kernels (LLVM 19)");
#endif

    char cache[4200];
    snprintf(cache, sizeof cache, "%s", tu_tempdir("host_threads"));
    wna16_context_options_t o = {.cpu_threads = 2, .log = count_log,
                                 .log_level = WNA16_LOG_DEBUG,
                                 .log_level_set = true, .cache_dir = cache};
    wna16_error_t err;
    wna16_context_t *ctx = NULL;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    wna16_checkpoint_t *ck = NULL;
    TU_OK(wna16_checkpoint_open(ctx, ckpt, &ck, &err), &err);
    wna16_moe_layers_t layers = {0};
    wna16_checkpoint_layer_t L = {0};
    const wna16_spec_t *fmt = ck && wna16_checkpoint_config(ck)
        ? wna16_spec_find(ctx, WNA16_SPEC_FORMAT,
                          wna16_checkpoint_config(ck)->format_name) : NULL;
    TU_CHECK(fmt != NULL);
    if (fmt)
        TU_OK(wna16_checkpoint_moe_layers(ctx, ck, fmt, &layers, &err), &err);
    TU_CHECK(layers.count == 1);
    if (layers.count)
        TU_OK(wna16_checkpoint_layer_open(ctx, ck, NULL, NULL,
                                          layers.prefixes[0], &L, &err), &err);
    const wna16_spec_t *backend =
        wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "triton");
    if (!L.tensors || !backend)
        return tu_finish("host_threads");

    /* one context, N threads repacking with generated CPU kernels (the
     * first compiles, or all race to: the cache compiles each key once) */
    wna16_tensor_set_t *ref = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &ref, &err), &err);
    TU_OK(wna16_repack_layer(ctx, L.format, L.tensors, L.prefix, L.E, L.H,
                             L.I, &L.quant, backend, WNA16_TARGET_REFERENCE,
                             ref, &err), &err);
    pthread_t t[N_THREADS];
    repack_job_t rj = {ctx, &L, backend, ref};
    for (int i = 0; i < N_THREADS; i++)
        pthread_create(&t[i], NULL, repack_thread, &rj);
    join_all(t, N_THREADS, "repack");

    /* two compiled layers over the repacked tensors; every thread runs its
     * own batch size on one of them, at the same time */
    wna16_moe_layer_t *layer[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++)
        TU_OK(wna16_moe_layer_create(ctx, backend, ref, L.prefix, L.E, L.H,
                                     L.I, &L.quant, WNA16_TARGET_CPU,
                                     &layer[i], &err), &err);
    if (!layer[0] || !layer[1])
        return tu_finish("host_threads");
    static const int32_t Ms[N_THREADS] = {1, 3, 8, 17};
    run_job_t jobs[N_THREADS];
    tu_rng_t rng;
    tu_rng_seed(&rng, 24);
    int32_t topk = L.topk > 0 ? L.topk : 1;
    for (int i = 0; i < N_THREADS; i++) {
        run_job_t *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->layer = layer[i % 2];
        wna16_moe_params_init(&j->p);
        j->p.act_dtype = L.act_dtype;
        j->M = Ms[i];
        j->topk = topk;
        j->H = L.H;
        uint16_t *h = malloc((size_t)j->M * L.H * sizeof *h);
        int32_t *ids = malloc((size_t)j->M * topk * sizeof *ids);
        float *w = malloc((size_t)j->M * topk * sizeof *w);
        uint16_t *expect = malloc((size_t)j->M * L.H * sizeof *expect);
        for (int64_t k = 0; k < (int64_t)j->M * L.H; k++) {
            float v = ((float)tu_rng_below(&rng, 2001) - 1000.f) / 1000.f;
            h[k] = L.act_dtype == WNA16_DTYPE_F16 ? wna16_f32_to_f16(v)
                                                  : wna16_f32_to_bf16(v);
        }
        for (int32_t m = 0; m < j->M; m++)
            for (int32_t k = 0; k < topk; k++) { /* distinct experts */
                ids[m * topk + k] = (int32_t)((m + k) % L.E);
                w[m * topk + k] = 1.0f / (float)topk;
            }
        j->hidden = h;
        j->ids = ids;
        j->w = w;
        j->expect = expect;
        TU_OK(wna16_moe_layer_run(j->layer, &j->p, h, j->M, ids, w, topk,
                                  expect, &err), &err);
    }
    for (int i = 0; i < N_THREADS; i++)
        pthread_create(&t[i], NULL, run_thread, &jobs[i]);
    join_all(t, N_THREADS, "fused MoE");

    TU_CHECK_MSG(atomic_load(&log_calls) > 0, "the log callback was never "
                 "called at debug level");
    /* the kernels went to the context's cache directory */
    int entries = 0;
    DIR *d = opendir(cache);
    for (struct dirent *e; d && (e = readdir(d));)
        entries += e->d_name[0] != '.';
    if (d)
        closedir(d);
    TU_CHECK_MSG(entries > 0, "nothing in the cache directory %s", cache);

    for (int i = 0; i < N_THREADS; i++) {
        free((void *)jobs[i].hidden);
        free((void *)jobs[i].ids);
        free((void *)jobs[i].w);
        free((void *)jobs[i].expect);
    }
    wna16_moe_layer_destroy(layer[0]);
    wna16_moe_layer_destroy(layer[1]);
    wna16_tensor_set_destroy(ref);
    wna16_checkpoint_layer_close(&L);
    wna16_moe_layers_free(&layers);
    wna16_checkpoint_close(ck);
    wna16_context_destroy(ctx);
    return tu_finish("host_threads");
}
