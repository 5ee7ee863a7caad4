/*
 * test_cuda_runtime.c - the driver half of the CUDA target, on a GPU.
 * Without one, w16_cuda_get must answer EUNAVAILABLE with "CUDA target
 * unavailable: <why>" and the test skips (exit 77): that is what CI sees.
 * With one: device facts; allocation, copies (h2d, d2h, d2d) and memset
 * round trips, zero-byte cases; a kernel compiled by NVRTC for the
 * device's own architecture loaded from its CUBIN and launched over an odd
 * number of elements with exact integer results; a missing kernel name;
 * dynamic shared memory above 48 KiB (the opt-in) and above the device's
 * limit; async copies and launches on two streams with pinned memory and
 * timing events; and the PTX fallback: an image built for a lower major
 * architecture loads through its PTX, a CUBIN-only one is refused naming
 * the architecture, and a damaged CUBIN falls back to the PTX. Threads
 * other than the creator's use the target (each call binds the context),
 * and two wna16 contexts share the primary context: destroying one leaves
 * the other working. Chained launches (programmatic dependent launch on
 * sm_90): a chain of kernels that each start early, wait, and read the
 * previous one's output or overwrite its input, gives the serialized
 * results, on a stream and replayed from a captured graph.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "runtime/cuda/cuda.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define N_ELEMS 300007u /* odd: the last block is partial */
#define BLOCK 256u

static const char *const KERNELS =
    "extern \"C\" __global__ void w16_saxpy(unsigned *y, const unsigned *x,\n"
    "                                       unsigned a, unsigned n)\n"
    "{\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        y[i] = a * x[i] + y[i];\n"
    "}\n"
    "extern \"C\" __global__ void w16_shared_sum(unsigned *out, unsigned words)\n"
    "{\n"
    "    extern __shared__ unsigned s[];\n"
    "    for (unsigned i = threadIdx.x; i < words; i += blockDim.x)\n"
    "        s[i] = i * 3u + blockIdx.x;\n"
    "    __syncthreads();\n"
    "    if (threadIdx.x == 0) {\n"
    "        unsigned t = 0;\n"
    "        for (unsigned i = 0; i < words; i++)\n"
    "            t += s[i];\n"
    "        out[blockIdx.x] = t;\n"
    "    }\n"
    "}\n";

static unsigned grid_for(unsigned n) { return (n + BLOCK - 1) / BLOCK; }

static unsigned x_at(unsigned i) { return i * 2654435761u + 7u; }
static unsigned y_at(unsigned i) { return i ^ 0x5bd1e995u; }

/* x and y filled with the patterns above. */
static void fill(unsigned *x, unsigned *y, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        x[i] = x_at(i);
        y[i] = y_at(i);
    }
}

static size_t count_saxpy_errors(const unsigned *y, unsigned a, unsigned n)
{
    size_t bad = 0;
    for (unsigned i = 0; i < n; i++)
        bad += y[i] != a * x_at(i) + y_at(i); /* unsigned: wraps as on GPU */
    return bad;
}

static void test_memory(w16_cuda_t *cuda)
{
    wna16_error_t err;
    size_t bytes = N_ELEMS * sizeof(unsigned);
    unsigned *h = malloc(bytes), *back = malloc(bytes), *y = malloc(bytes);
    uint64_t d1 = 0, d2 = 0, dz = 1;
    TU_CHECK(h && back && y);
    if (!h || !back || !y)
        goto out;
    fill(h, y, N_ELEMS);
    TU_OK(w16_cuda_alloc(cuda, bytes, &d1, &err), &err);
    TU_OK(w16_cuda_alloc(cuda, bytes, &d2, &err), &err);
    TU_CHECK(d1 != 0 && d2 != 0 && d1 != d2);
    TU_OK(w16_cuda_copy_h2d(cuda, d1, h, bytes, &err), &err);
    TU_OK(w16_cuda_copy_d2h(cuda, back, d1, bytes, &err), &err);
    TU_CHECK(memcmp(h, back, bytes) == 0);

    TU_OK(w16_cuda_copy_d2d(cuda, d2, d1, bytes, &err), &err);
    memset(back, 0, bytes);
    TU_OK(w16_cuda_copy_d2h(cuda, back, d2, bytes, &err), &err);
    TU_CHECK(memcmp(h, back, bytes) == 0);

    /* whole buffer, then a byte range at an odd offset */
    TU_OK(w16_cuda_memset(cuda, d2, 0xab, bytes, &err), &err);
    TU_OK(w16_cuda_memset(cuda, d2 + 13, 0x11, 1001, &err), &err);
    TU_OK(w16_cuda_copy_d2h(cuda, back, d2, bytes, &err), &err);
    const unsigned char *b = (const unsigned char *)back;
    size_t bad = 0;
    for (size_t i = 0; i < bytes; i++)
        bad += b[i] != ((i >= 13 && i < 13 + 1001) ? 0x11 : 0xab);
    TU_CHECK_MSG(bad == 0, "%zu bytes wrong after memset", bad);

    /* zero bytes: no allocation, copies and memsets do nothing */
    TU_OK(w16_cuda_alloc(cuda, 0, &dz, &err), &err);
    TU_CHECK(dz == 0);
    TU_OK(w16_cuda_copy_h2d(cuda, d1, NULL, 0, &err), &err);
    TU_OK(w16_cuda_copy_d2h(cuda, NULL, d1, 0, &err), &err);
    TU_OK(w16_cuda_memset(cuda, d1, 0, 0, &err), &err);
    w16_cuda_free(cuda, 0);

    /* an impossible allocation is ENOMEM naming the size */
    uint64_t huge = 0;
    wna16_status_t st = w16_cuda_alloc(cuda, (size_t)1 << 50, &huge, &err);
    TU_CHECK_MSG(st == WNA16_ENOMEM && huge == 0, "%s: %s",
                 wna16_status_name(st), err.message);
    TU_CHECK_MSG(strstr(err.message, "1125899906842624") != NULL, "%s",
                 err.message);
out:
    w16_cuda_free(cuda, d1);
    w16_cuda_free(cuda, d2);
    free(h);
    free(back);
    free(y);
}

/* Compiles KERNELS for sm_<major><minor> and loads the module. */
static w16_cuda_module_t *build(wna16_context_t *ctx, w16_cuda_t *cuda,
                                int major, int minor, w16_cuda_image_t *img)
{
    wna16_error_t err;
    w16_cuda_module_t *m = NULL;
    TU_OK(w16_nvrtc_compile(ctx, KERNELS, "w16_test_kernels", major, minor,
                            img, &err), &err);
    TU_CHECK_MSG(img->log == NULL, "NVRTC log: %s", img->log);
    if (img->cubin)
        TU_OK(w16_cuda_module_load(cuda, img, &m, &err), &err);
    return m;
}

/* y = a*x + y over N_ELEMS on `stream`, checked exactly. */
static void run_saxpy(w16_cuda_t *cuda, w16_cuda_module_t *m,
                      const char *what)
{
    wna16_error_t err;
    w16_cuda_function_t *fn = NULL;
    TU_OK(w16_cuda_function(m, "w16_saxpy", &fn, &err), &err);
    size_t bytes = N_ELEMS * sizeof(unsigned);
    unsigned *x = malloc(bytes), *y = malloc(bytes);
    uint64_t dx = 0, dy = 0;
    if (!fn || !x || !y)
        goto out;
    fill(x, y, N_ELEMS);
    TU_OK(w16_cuda_alloc(cuda, bytes, &dx, &err), &err);
    TU_OK(w16_cuda_alloc(cuda, bytes, &dy, &err), &err);
    TU_OK(w16_cuda_copy_h2d(cuda, dx, x, bytes, &err), &err);
    TU_OK(w16_cuda_copy_h2d(cuda, dy, y, bytes, &err), &err);
    unsigned a = 0x9e3779b9u, n = N_ELEMS;
    void *args[] = {&dy, &dx, &a, &n};
    TU_OK(w16_cuda_launch(cuda, fn, grid_for(n), BLOCK, 0, NULL, args, &err),
          &err);
    TU_OK(w16_cuda_stream_sync(cuda, NULL, &err), &err);
    memset(y, 0, bytes);
    TU_OK(w16_cuda_copy_d2h(cuda, y, dy, bytes, &err), &err);
    size_t bad = count_saxpy_errors(y, a, n);
    TU_CHECK_MSG(bad == 0, "%s: %zu of %u results wrong", what, bad, n);
out:
    w16_cuda_free(cuda, dx);
    w16_cuda_free(cuda, dy);
    free(x);
    free(y);
}

static void test_kernel(wna16_context_t *ctx, w16_cuda_t *cuda)
{
    w16_cuda_image_t img;
    w16_cuda_module_t *m = build(ctx, cuda, w16_cuda_cc_major(cuda),
                                 w16_cuda_cc_minor(cuda), &img);
    TU_CHECK(m != NULL);
    if (m) {
        TU_CHECK(!w16_cuda_module_from_ptx(m)); /* its own CUBIN */
        run_saxpy(cuda, m, "own CUBIN");
        wna16_error_t err;
        w16_cuda_function_t *fn = (w16_cuda_function_t *)&err;
        TU_CHECK(w16_cuda_function(m, "w16_nope", &fn, &err) ==
                 WNA16_ENOTFOUND);
        TU_CHECK(fn == NULL && strstr(err.message, "w16_nope") != NULL);
        /* an invalid shape is refused before the driver sees it */
        TU_OK(w16_cuda_function(m, "w16_saxpy", &fn, &err), &err);
        TU_CHECK(w16_cuda_launch(cuda, fn, 1, 2048, 0, NULL, NULL, &err) ==
                 WNA16_EINVAL);
    }
    w16_cuda_module_unload(m);
    w16_cuda_image_free(&img);
}

static unsigned shared_sum(unsigned words, unsigned block)
{
    unsigned t = 0;
    for (unsigned i = 0; i < words; i++)
        t += i * 3u + block;
    return t;
}

/* 64 KiB of dynamic shared memory needs the opt-in attribute; more than
 * the device allows is ELIMIT. */
static void test_shared(wna16_context_t *ctx, w16_cuda_t *cuda)
{
    unsigned shared = 64u * 1024u, words = shared / 4, blocks = 3;
    if (w16_cuda_max_shared(cuda) < shared) {
        printf("skipping the shared-memory opt-in: %zu bytes at most\n",
               w16_cuda_max_shared(cuda));
        return;
    }
    wna16_error_t err;
    w16_cuda_image_t img;
    w16_cuda_module_t *m = build(ctx, cuda, w16_cuda_cc_major(cuda),
                                 w16_cuda_cc_minor(cuda), &img);
    w16_cuda_function_t *fn = NULL;
    uint64_t d = 0;
    if (m)
        TU_OK(w16_cuda_function(m, "w16_shared_sum", &fn, &err), &err);
    TU_OK(w16_cuda_alloc(cuda, blocks * sizeof(unsigned), &d, &err), &err);
    if (fn && d) {
        void *args[] = {&d, &words};
        TU_OK(w16_cuda_launch(cuda, fn, blocks, 128, shared, NULL, args, &err),
              &err);
        unsigned out[3] = {0};
        TU_OK(w16_cuda_copy_d2h(cuda, out, d, sizeof out, &err), &err);
        for (unsigned b = 0; b < blocks; b++)
            TU_CHECK_MSG(out[b] == shared_sum(words, b), "block %u: %u", b,
                         out[b]);
        unsigned too_much = (unsigned)w16_cuda_max_shared(cuda) + 1024u;
        TU_CHECK(w16_cuda_launch(cuda, fn, 1, 128, too_much, NULL, args,
                                 &err) == WNA16_ELIMIT);
    }
    w16_cuda_free(cuda, d);
    w16_cuda_module_unload(m);
    w16_cuda_image_free(&img);
}

typedef struct lane {
    w16_cuda_stream_t *stream;
    w16_cuda_event_t *start, *end;
    unsigned *hx, *hy; /* pinned */
    uint64_t dx, dy;
    unsigned a;
} lane_t;

static void lane_open(w16_cuda_t *cuda, lane_t *l, unsigned a, size_t bytes)
{
    wna16_error_t err;
    memset(l, 0, sizeof *l);
    l->a = a;
    TU_OK(w16_cuda_stream_create(cuda, &l->stream, &err), &err);
    TU_OK(w16_cuda_event_create(cuda, &l->start, &err), &err);
    TU_OK(w16_cuda_event_create(cuda, &l->end, &err), &err);
    TU_OK(w16_cuda_host_alloc(cuda, bytes, (void **)&l->hx, &err), &err);
    TU_OK(w16_cuda_host_alloc(cuda, bytes, (void **)&l->hy, &err), &err);
    TU_OK(w16_cuda_alloc(cuda, bytes, &l->dx, &err), &err);
    TU_OK(w16_cuda_alloc(cuda, bytes, &l->dy, &err), &err);
}

static void lane_close(w16_cuda_t *cuda, lane_t *l)
{
    w16_cuda_free(cuda, l->dx);
    w16_cuda_free(cuda, l->dy);
    w16_cuda_host_free(cuda, l->hx);
    w16_cuda_host_free(cuda, l->hy);
    w16_cuda_event_destroy(cuda, l->start);
    w16_cuda_event_destroy(cuda, l->end);
    w16_cuda_stream_destroy(cuda, l->stream);
}

/* Everything of one lane queued on its stream, bracketed by its events. */
static void lane_queue(w16_cuda_t *cuda, w16_cuda_function_t *fn, lane_t *l,
                       size_t bytes)
{
    wna16_error_t err;
    unsigned n = N_ELEMS;
    void *args[] = {&l->dy, &l->dx, &l->a, &n};
    TU_OK(w16_cuda_event_record(cuda, l->start, l->stream, &err), &err);
    TU_OK(w16_cuda_copy_h2d_async(cuda, l->dx, l->hx, bytes, l->stream, &err),
          &err);
    TU_OK(w16_cuda_copy_h2d_async(cuda, l->dy, l->hy, bytes, l->stream, &err),
          &err);
    TU_OK(w16_cuda_launch(cuda, fn, grid_for(n), BLOCK, 0, l->stream, args,
                          &err), &err);
    TU_OK(w16_cuda_memset_async(cuda, l->dx, 0, bytes, l->stream, &err), &err);
    TU_OK(w16_cuda_copy_d2h_async(cuda, l->hy, l->dy, bytes, l->stream, &err),
          &err);
    TU_OK(w16_cuda_event_record(cuda, l->end, l->stream, &err), &err);
}

static void test_streams(wna16_context_t *ctx, w16_cuda_t *cuda)
{
    wna16_error_t err;
    w16_cuda_image_t img;
    w16_cuda_module_t *m = build(ctx, cuda, w16_cuda_cc_major(cuda),
                                 w16_cuda_cc_minor(cuda), &img);
    w16_cuda_function_t *fn = NULL;
    if (m)
        TU_OK(w16_cuda_function(m, "w16_saxpy", &fn, &err), &err);
    size_t bytes = N_ELEMS * sizeof(unsigned);
    lane_t lanes[2];
    lane_open(cuda, &lanes[0], 3u, bytes);
    lane_open(cuda, &lanes[1], 0xdeadbeefu, bytes);
    bool ready = fn && lanes[0].hx && lanes[0].hy && lanes[1].hx &&
                 lanes[1].hy && lanes[0].dy && lanes[1].dy;
    for (int i = 0; ready && i < 2; i++)
        fill(lanes[i].hx, lanes[i].hy, N_ELEMS);
    for (int i = 0; ready && i < 2; i++)
        lane_queue(cuda, fn, &lanes[i], bytes);
    for (int i = 0; ready && i < 2; i++) {
        TU_OK(w16_cuda_event_sync(cuda, lanes[i].end, &err), &err);
        TU_OK(w16_cuda_stream_sync(cuda, lanes[i].stream, &err), &err);
        float ms = -1.0f;
        TU_OK(w16_cuda_event_elapsed_ms(cuda, lanes[i].start, lanes[i].end,
                                        &ms, &err), &err);
        TU_CHECK_MSG(ms >= 0.0f && ms < 10000.0f, "lane %d: %f ms", i,
                     (double)ms);
        size_t bad = count_saxpy_errors(lanes[i].hy, lanes[i].a, N_ELEMS);
        TU_CHECK_MSG(bad == 0, "lane %d: %zu results wrong", i, bad);
    }
    for (int i = 0; i < 2; i++)
        lane_close(cuda, &lanes[i]);
    w16_cuda_module_unload(m);
    w16_cuda_image_free(&img);
}

/* Chained launches. w16_chain_fill lets its dependents start at once,
 * spins, then writes src; w16_chain_copy waits, then reads src into its
 * slice of dst. A chain fill(0), copy(0), fill(1), copy(1), ... gives
 * dst[k][i] = 3 * (k + i) + 1 only if every copy waits for its fill (read
 * after write) and every fill for the copy before it (write after read):
 * without the waits, the early start (on sm_90) makes the copies read
 * stale or newer values. Before sm_90 the same code runs serialized. */
static const char *const CHAIN_KERNELS =
    "__device__ void pdl_wait()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.wait;\" ::: \"memory\");\n"
    "#endif\n"
    "}\n"
    "__device__ void pdl_launch()\n"
    "{\n"
    "#if __CUDA_ARCH__ >= 900\n"
    "    asm volatile(\"griddepcontrol.launch_dependents;\" :::);\n"
    "#endif\n"
    "}\n"
    "extern \"C\" __global__ void w16_chain_fill(unsigned *src, unsigned n,\n"
    "                                           unsigned k)\n"
    "{\n"
    "    pdl_launch(); /* the next kernel may start now */\n"
    "    pdl_wait();\n"
    "    long long t0 = clock64();\n"
    "    while (clock64() - t0 < 200000) {}\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        src[i] = k + i;\n"
    "}\n"
    "extern \"C\" __global__ void w16_chain_copy(unsigned *dst,\n"
    "                                           const unsigned *src,\n"
    "                                           unsigned n)\n"
    "{\n"
    "    pdl_launch();\n"
    "    pdl_wait();\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        dst[i] = 3u * src[i] + 1u;\n"
    "}\n";

enum { CHAIN_LINKS = 6, CHAIN_N = 70001 };

/* The chain on `stream`; dst holds CHAIN_LINKS slices of CHAIN_N. */
static void chain_queue(w16_cuda_t *cuda, w16_cuda_function_t *fill_fn,
                        w16_cuda_function_t *copy_fn, uint64_t src,
                        uint64_t dst, w16_cuda_stream_t *stream)
{
    wna16_error_t err;
    unsigned n = CHAIN_N;
    for (unsigned k = 0; k < CHAIN_LINKS; k++) {
        uint64_t d = dst + (uint64_t)k * CHAIN_N * sizeof(unsigned);
        void *af[] = {&src, &n, &k};
        void *ac[] = {&d, &src, &n};
        TU_OK(w16_cuda_launch_chained(cuda, fill_fn, grid_for(n), BLOCK, 0,
                                      stream, af, &err), &err);
        TU_OK(w16_cuda_launch_chained(cuda, copy_fn, grid_for(n), BLOCK, 0,
                                      stream, ac, &err), &err);
    }
}

static size_t chain_errors(w16_cuda_t *cuda, uint64_t dst, unsigned *h)
{
    wna16_error_t err;
    size_t bytes = (size_t)CHAIN_LINKS * CHAIN_N * sizeof(unsigned), bad = 0;
    TU_OK(w16_cuda_copy_d2h(cuda, h, dst, bytes, &err), &err);
    for (unsigned k = 0; k < CHAIN_LINKS; k++)
        for (unsigned i = 0; i < CHAIN_N; i++)
            bad += h[(size_t)k * CHAIN_N + i] != 3u * (k + i) + 1u;
    return bad;
}

static void test_chained(wna16_context_t *ctx, w16_cuda_t *cuda)
{
    wna16_error_t err;
    w16_cuda_image_t img;
    w16_cuda_module_t *m = NULL;
    w16_cuda_function_t *fill_fn = NULL, *copy_fn = NULL;
    w16_cuda_stream_t *stream = NULL;
    w16_cuda_graph_t *graph = NULL;
    size_t bytes = (size_t)CHAIN_LINKS * CHAIN_N * sizeof(unsigned);
    unsigned *h = malloc(bytes);
    uint64_t src = 0, dst = 0;
    TU_OK(w16_nvrtc_compile(ctx, CHAIN_KERNELS, "w16_test_chain",
                            w16_cuda_cc_major(cuda), w16_cuda_cc_minor(cuda),
                            &img, &err), &err);
    TU_CHECK_MSG(img.log == NULL, "NVRTC log: %s", img.log);
    if (img.cubin)
        TU_OK(w16_cuda_module_load(cuda, &img, &m, &err), &err);
    if (m) {
        TU_OK(w16_cuda_function(m, "w16_chain_fill", &fill_fn, &err), &err);
        TU_OK(w16_cuda_function(m, "w16_chain_copy", &copy_fn, &err), &err);
    }
    TU_OK(w16_cuda_alloc(cuda, CHAIN_N * sizeof(unsigned), &src, &err), &err);
    TU_OK(w16_cuda_alloc(cuda, bytes, &dst, &err), &err);
    TU_OK(w16_cuda_stream_create_async(cuda, &stream, &err), &err);
    if (!h || !fill_fn || !copy_fn || !src || !dst || !stream)
        goto out;
    printf("chained launches %s\n", w16_cuda_chained_overlaps(cuda)
                                        ? "overlap (programmatic dependent "
                                          "launch)"
                                        : "run one after the other");
    /* on a stream */
    TU_OK(w16_cuda_memset(cuda, dst, 0, bytes, &err), &err);
    chain_queue(cuda, fill_fn, copy_fn, src, dst, stream);
    TU_OK(w16_cuda_stream_sync(cuda, stream, &err), &err);
    size_t bad = chain_errors(cuda, dst, h);
    TU_CHECK_MSG(bad == 0, "chained on a stream: %zu of %u results wrong",
                 bad, CHAIN_LINKS * CHAIN_N);
    /* captured into a graph, replayed twice */
    TU_OK(w16_cuda_memset(cuda, dst, 0, bytes, &err), &err);
    TU_OK(w16_cuda_capture_begin(cuda, stream, &err), &err);
    chain_queue(cuda, fill_fn, copy_fn, src, dst, stream);
    TU_OK(w16_cuda_capture_end(cuda, stream, &graph, &err), &err);
    for (int r = 0; graph && r < 2; r++) {
        TU_OK(w16_cuda_graph_launch(cuda, graph, stream, &err), &err);
        TU_OK(w16_cuda_stream_sync(cuda, stream, &err), &err);
        bad = chain_errors(cuda, dst, h);
        TU_CHECK_MSG(bad == 0, "chained in a graph, replay %d: %zu of %u "
                     "results wrong", r, bad, CHAIN_LINKS * CHAIN_N);
        TU_OK(w16_cuda_memset(cuda, dst, 0, bytes, &err), &err);
    }
out:
    w16_cuda_graph_destroy(cuda, graph);
    w16_cuda_stream_destroy(cuda, stream);
    w16_cuda_free(cuda, src);
    w16_cuda_free(cuda, dst);
    w16_cuda_module_unload(m);
    w16_cuda_image_free(&img);
    free(h);
}

/* An architecture below the device's major that NVRTC still supports. */
static bool lower_arch(const w16_cuda_t *cuda, int *major, int *minor)
{
    int dev = w16_cuda_cc_major(cuda);
    if (dev >= 9) {
        *major = 8, *minor = 0;
        return true;
    }
    if (dev == 8) {
        *major = 7, *minor = 5;
        return true;
    }
    return false;
}

static void test_ptx_fallback(wna16_context_t *ctx, w16_cuda_t *cuda)
{
    int major, minor;
    if (!lower_arch(cuda, &major, &minor)) {
        printf("skipping the PTX fallback: no lower architecture\n");
        return;
    }
    wna16_error_t err;
    w16_cuda_image_t img;
    w16_cuda_module_t *m = build(ctx, cuda, major, minor, &img);
    TU_CHECK(m && w16_cuda_module_from_ptx(m));
    if (m)
        run_saxpy(cuda, m, "PTX fallback");
    w16_cuda_module_unload(m);

    /* CUBIN only: nothing can run, and the message says why */
    char *ptx = img.ptx;
    img.ptx = NULL;
    m = (w16_cuda_module_t *)&err;
    wna16_status_t st = w16_cuda_module_load(cuda, &img, &m, &err);
    TU_CHECK_MSG(st == WNA16_EUNSUPPORTED && m == NULL, "%s",
                 wna16_status_name(st));
    char arch[16];
    snprintf(arch, sizeof arch, "sm_%d%d", major, minor);
    TU_CHECK_MSG(strstr(err.message, arch) && strstr(err.message, "no PTX"),
                 "%s", err.message);
    img.ptx = ptx;
    w16_cuda_image_free(&img);

    /* the device's own architecture with a damaged CUBIN: PTX again */
    m = build(ctx, cuda, w16_cuda_cc_major(cuda), w16_cuda_cc_minor(cuda),
              &img);
    w16_cuda_module_unload(m);
    if (img.cubin) {
        memset(img.cubin, 0, 16);
        m = NULL;
        TU_OK(w16_cuda_module_load(cuda, &img, &m, &err), &err);
        TU_CHECK(m && w16_cuda_module_from_ptx(m));
        if (m)
            run_saxpy(cuda, m, "damaged CUBIN, PTX");
        w16_cuda_module_unload(m);
    }
    w16_cuda_image_free(&img);
}

typedef struct worker {
    wna16_context_t *ctx;
    w16_cuda_t *cuda;
} worker_t;

/* A thread that never made the context current: every call must bind it. */
static void *worker_main(void *arg)
{
    worker_t *w = arg;
    w16_cuda_image_t img;
    w16_cuda_module_t *m = build(w->ctx, w->cuda, w16_cuda_cc_major(w->cuda),
                                 w16_cuda_cc_minor(w->cuda), &img);
    TU_CHECK(m != NULL);
    if (m)
        run_saxpy(w->cuda, m, "second thread");
    w16_cuda_module_unload(m);
    w16_cuda_image_free(&img);
    return NULL;
}

static void test_threads(wna16_context_t *ctx, w16_cuda_t *cuda)
{
    /* one after the other: the test's counters are not atomic */
    worker_t w = {ctx, cuda};
    for (int i = 0; i < 2; i++) {
        pthread_t th;
        TU_CHECK(pthread_create(&th, NULL, worker_main, &w) == 0);
        pthread_join(th, NULL);
    }
}

/* Both contexts retain device 0's primary context; it outlives the first
 * one's destruction. */
static void test_two_contexts(w16_cuda_t *cuda)
{
    wna16_context_t *other = tu_context();
    wna16_error_t err;
    w16_cuda_t *c2 = NULL;
    TU_OK(w16_cuda_get(other, &c2, &err), &err);
    TU_CHECK(c2 && c2 != cuda);
    uint64_t d = 0;
    TU_OK(w16_cuda_alloc(cuda, 4096, &d, &err), &err);
    wna16_context_destroy(other);
    unsigned v[4] = {1, 2, 3, 4}, back[4] = {0};
    TU_OK(w16_cuda_copy_h2d(cuda, d, v, sizeof v, &err), &err);
    TU_OK(w16_cuda_copy_d2h(cuda, back, d, sizeof back, &err), &err);
    TU_CHECK(memcmp(v, back, sizeof v) == 0);
    w16_cuda_free(cuda, d);
}

int main(void)
{
    wna16_context_t *ctx = tu_context();
    wna16_error_t err;
    w16_cuda_t *cuda = NULL;
    wna16_status_t st = w16_cuda_get(ctx, &cuda, &err);
    if (st != WNA16_OK) {
        wna16_context_destroy(ctx);
        if (st != WNA16_EUNAVAILABLE || cuda != NULL ||
            strncmp(err.message, "CUDA target unavailable: ", 25) != 0) {
            fprintf(stderr, "w16_cuda_get: %s: %s\n", wna16_status_name(st),
                    err.message);
            return 1;
        }
        tu_skip(err.message);
    }
    if (!w16_nvrtc_available(ctx, &err)) {
        wna16_context_destroy(ctx);
        tu_skip(err.message);
    }
    w16_cuda_t *again = NULL;
    TU_OK(w16_cuda_get(ctx, &again, &err), &err);
    TU_CHECK(again == cuda);
    printf("%s, sm_%d%d, %d SMs, %zu bytes shared, %s, %s\n",
           w16_cuda_device_name(cuda), w16_cuda_cc_major(cuda),
           w16_cuda_cc_minor(cuda), w16_cuda_sm_count(cuda),
           w16_cuda_max_shared(cuda), w16_cuda_driver_version(cuda),
           w16_nvrtc_version());
    TU_CHECK(w16_cuda_cc_major(cuda) >= 3 && w16_cuda_sm_count(cuda) > 0);
    TU_CHECK(w16_cuda_device_name(cuda)[0] != '\0');
    TU_CHECK(strncmp(w16_cuda_driver_version(cuda), "CUDA driver ", 12) == 0);
    test_memory(cuda);
    test_kernel(ctx, cuda);
    test_shared(ctx, cuda);
    test_streams(ctx, cuda);
    test_chained(ctx, cuda);
    test_ptx_fallback(ctx, cuda);
    test_threads(ctx, cuda);
    test_two_contexts(cuda);
    wna16_context_destroy(ctx); /* releases the primary context */
    return tu_finish("test_cuda_runtime");
}
