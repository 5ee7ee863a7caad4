/*
 * test_nvrtc_runtime.c - the NVRTC half of the CUDA target, which needs no
 * GPU: a kernel using cuda_fp16.h / cuda_bf16.h compiles for sm_80 and
 * sm_90 into a CUBIN that is a 64-bit ELF for EM_CUDA and PTX naming the
 * entry, with an empty log; a syntax error is EINTERNAL naming the kernel
 * and quoting NVRTC; a long error log is cut to fit the message; warnings
 * (#warning, an unused variable) come back in the image's log; an
 * architecture NVRTC does not know is refused with the list it does;
 * bad arguments; and threads compiling at once (the one-time load races).
 * Skips (exit 77) when NVRTC cannot be loaded.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "runtime/cuda/cuda.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define EM_CUDA_MACHINE 190

static const char *const MIX_SRC =
    "#include <cuda_fp16.h>\n"
    "#include <cuda_bf16.h>\n"
    "extern \"C\" __global__ void w16_test_mix(const __half *a,\n"
    "                                          const __nv_bfloat16 *b,\n"
    "                                          float *out, int n)\n"
    "{\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < n)\n"
    "        out[i] = __half2float(a[i]) * __bfloat162float(b[i]);\n"
    "}\n";

static unsigned elf_machine(const unsigned char *p)
{
    return (unsigned)p[18] | (unsigned)p[19] << 8; /* e_machine, little end */
}

static void check_image(const w16_cuda_image_t *img, int major, int minor)
{
    TU_CHECK(img->cubin && img->cubin_size > 64);
    if (img->cubin && img->cubin_size > 64) {
        const unsigned char *p = img->cubin;
        TU_CHECK(memcmp(p, "\177ELF", 4) == 0);
        TU_CHECK(p[4] == 2 /* ELFCLASS64 */ && p[5] == 1 /* little endian */);
        TU_CHECK_MSG(elf_machine(p) == EM_CUDA_MACHINE, "e_machine %u",
                     elf_machine(p));
    }
    TU_CHECK(img->ptx && img->ptx_size > 0 &&
             img->ptx_size == strlen(img->ptx));
    if (img->ptx) {
        TU_CHECK(strstr(img->ptx, ".entry w16_test_mix") != NULL);
        char target[32];
        snprintf(target, sizeof target, ".target sm_%d%d", major, minor);
        TU_CHECK_MSG(strstr(img->ptx, target) != NULL, "no '%s'", target);
    }
    TU_CHECK_MSG(img->log == NULL, "log: %s", img->log ? img->log : "");
    TU_CHECK(img->cc_major == major && img->cc_minor == minor);
}

static void test_compile(wna16_context_t *ctx)
{
    static const int archs[][2] = {{8, 0}, {9, 0}};
    for (size_t i = 0; i < W16_ARRAY_LEN(archs); i++) {
        wna16_error_t err;
        w16_cuda_image_t img;
        TU_OK(w16_nvrtc_compile(ctx, MIX_SRC, "w16_test_mix", archs[i][0],
                                archs[i][1], &img, &err), &err);
        check_image(&img, archs[i][0], archs[i][1]);
        w16_cuda_image_free(&img);
        TU_CHECK(img.cubin == NULL && img.ptx == NULL && img.log == NULL);
        w16_cuda_image_free(&img); /* twice is fine */
    }
}

static void test_syntax_error(wna16_context_t *ctx)
{
    const char *src = "extern \"C\" __global__ void w16_bad(int *x)\n"
                      "{\n"
                      "    x[0] = 1\n"
                      "}\n";
    wna16_error_t err;
    w16_cuda_image_t img;
    wna16_status_t st = w16_nvrtc_compile(ctx, src, "w16_bad", 8, 0, &img,
                                          &err);
    TU_CHECK(st == WNA16_EINTERNAL && err.status == WNA16_EINTERNAL);
    TU_CHECK_MSG(strstr(err.message, "w16_bad") != NULL, "%s", err.message);
    TU_CHECK_MSG(strstr(err.message, "expected a \";\"") != NULL, "%s",
                 err.message);
    TU_CHECK_MSG(strstr(err.message, "sm_80") != NULL, "%s", err.message);
    TU_CHECK(img.cubin == NULL && img.ptx == NULL && img.log == NULL);
}

/* Hundreds of errors: the message keeps whole lines from the start and
 * says how much was cut. */
static void test_long_log(wna16_context_t *ctx)
{
    size_t cap = 64 * 1024, len = 0;
    char *src = malloc(cap);
    TU_CHECK(src != NULL);
    if (!src)
        return;
    len += (size_t)snprintf(src, cap, "extern \"C\" __global__ void "
                            "w16_noisy(int *x)\n{\n");
    for (int i = 0; i < 200 && len + 64 < cap; i++)
        len += (size_t)snprintf(src + len, cap - len,
                                "    x[%d] = undeclared_%d;\n", i, i);
    snprintf(src + len, cap - len, "}\n");
    wna16_error_t err;
    w16_cuda_image_t img;
    TU_CHECK(w16_nvrtc_compile(ctx, src, "w16_noisy", 8, 0, &img, &err) ==
             WNA16_EINTERNAL);
    TU_CHECK(strlen(err.message) < WNA16_ERROR_MESSAGE_MAX);
    TU_CHECK_MSG(strstr(err.message, "w16_noisy") != NULL, "%s", err.message);
    TU_CHECK_MSG(strstr(err.message, "undeclared_0") != NULL, "%s",
                 err.message);
    TU_CHECK_MSG(strstr(err.message, "more bytes of NVRTC log") != NULL, "%s",
                 err.message);
    free(src);
}

static void expect_warning(wna16_context_t *ctx, const char *src,
                           const char *name, const char *needle)
{
    wna16_error_t err;
    w16_cuda_image_t img;
    TU_OK(w16_nvrtc_compile(ctx, src, name, 8, 0, &img, &err), &err);
    TU_CHECK(img.cubin_size > 0 && img.ptx_size > 0);
    TU_CHECK_MSG(img.log && strstr(img.log, needle), "%s: log %s", name,
                 img.log ? img.log : "(none)");
    TU_CHECK(img.log && img.log[strlen(img.log) - 1] != '\n');
    w16_cuda_image_free(&img);
}

static void test_warnings(wna16_context_t *ctx)
{
    expect_warning(ctx,
                   "#warning generated code should never do this\n"
                   "extern \"C\" __global__ void w16_warn(int *x) { x[0] = 1; }\n",
                   "w16_warn", "#warning directive");
    expect_warning(ctx,
                   "extern \"C\" __global__ void w16_unused(int *x)\n"
                   "{\n    int y = 3;\n    x[0] = 1;\n}\n",
                   "w16_unused", "declared but never referenced");
}

static void test_bad_arguments(wna16_context_t *ctx)
{
    wna16_error_t err;
    w16_cuda_image_t img;
    TU_CHECK(w16_nvrtc_compile(ctx, NULL, "k", 8, 0, &img, &err) ==
             WNA16_EINVAL);
    TU_CHECK(w16_nvrtc_compile(ctx, MIX_SRC, "", 8, 0, &img, &err) ==
             WNA16_EINVAL);
    TU_CHECK(w16_nvrtc_compile(ctx, MIX_SRC, "k", 8, 0, NULL, &err) ==
             WNA16_EINVAL);
    TU_CHECK(w16_nvrtc_compile(ctx, MIX_SRC, "k", 8, 12, &img, &err) ==
             WNA16_EINVAL);
    /* NVRTC 13 starts at sm_75: refused before compiling, with the list */
    wna16_status_t st = w16_nvrtc_compile(ctx, MIX_SRC, "w16_test_mix", 5, 0,
                                          &img, &err);
    TU_CHECK_MSG(st == WNA16_EUNSUPPORTED || st == WNA16_EINTERNAL, "%s",
                 wna16_status_name(st));
    TU_CHECK_MSG(strstr(err.message, "sm_50") && strstr(err.message,
                                                          "w16_test_mix"),
                 "%s", err.message);
    if (st == WNA16_EUNSUPPORTED)
        TU_CHECK_MSG(strstr(err.message, "80") != NULL, "%s", err.message);
}

typedef struct job {
    wna16_context_t *ctx;
    int arch;
    wna16_status_t st;
    size_t cubin_size;
} job_t;

static void *compile_job(void *arg)
{
    job_t *j = arg;
    wna16_error_t err;
    w16_cuda_image_t img;
    j->st = w16_nvrtc_compile(j->ctx, MIX_SRC, "w16_test_mix", j->arch / 10,
                              j->arch % 10, &img, &err);
    j->cubin_size = img.cubin_size;
    w16_cuda_image_free(&img);
    return NULL;
}

/* The first compiles of the process, from four threads at once (so the
 * one-time load races too), give the same result. False when NVRTC is
 * not there. */
static bool test_threads(wna16_context_t *ctx)
{
    job_t jobs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        jobs[i] = (job_t){ctx, i % 2 ? 90 : 80, WNA16_EINTERNAL, 0};
        TU_CHECK(pthread_create(&th[i], NULL, compile_job, &jobs[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    if (jobs[0].st == WNA16_EUNAVAILABLE)
        return false;
    for (int i = 0; i < 4; i++) {
        TU_CHECK(jobs[i].st == WNA16_OK && jobs[i].cubin_size > 0);
        TU_CHECK(jobs[i].cubin_size == jobs[i % 2].cubin_size);
    }
    return true;
}

int main(void)
{
    wna16_error_t err;
    wna16_context_t *ctx = tu_context();
    bool present = test_threads(ctx);
    if (!w16_nvrtc_available(ctx, &err)) {
        TU_CHECK(!present && strcmp(w16_nvrtc_version(), "none") == 0);
        wna16_context_destroy(ctx);
        tu_skip(err.message);
    }
    TU_CHECK(present);
    const char *v = w16_nvrtc_version();
    printf("%s, include dir %s\n", v, w16_nvrtc_include_dir());
    TU_CHECK(strcmp(v, "none") != 0 && strncmp(v, "NVRTC ", 6) == 0);
    TU_CHECK(w16_nvrtc_include_dir()[0] != '\0');
    test_compile(ctx);
    test_syntax_error(ctx);
    test_long_log(ctx);
    test_warnings(ctx);
    test_bad_arguments(ctx);
    wna16_context_destroy(ctx);
    return tu_finish("test_nvrtc_runtime");
}
