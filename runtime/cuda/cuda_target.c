/*
 * cuda_target.c - the CUDA target (see cuda.h): NVRTC and the CUDA driver,
 * both opened with dlopen and bound with dlsym, never linked (a binary
 * linked with -lcuda does not even start on a machine without the driver,
 * and the toolkit's stub libcuda.so only answers CUDA_ERROR_STUB_LIBRARY).
 * <cuda.h> and <nvrtc.h> are used for their types and enum values only, and
 * every function pointer takes its type from the header's own declaration
 * (__typeof__), so a wrong hand-written prototype cannot creep in. Driver
 * symbols are looked up by their versioned names (cuMemAlloc_v2, ...):
 * the unversioned exports are the old 32-bit-size ABI kept for old
 * binaries, and calling them through a new prototype corrupts arguments.
 * NVRTC state is process-wide (loaded once, never unloaded); the driver
 * state is per wna16 context (w16_cuda_t).
 */
#define _GNU_SOURCE
#include "runtime/cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void w16_cuda_image_free(w16_cuda_image_t *img)
{
    if (!img)
        return;
    free(img->cubin);
    free(img->ptx);
    free(img->log);
    memset(img, 0, sizeof *img);
}

#ifdef WNA16_HAVE_CUDA

/* Legacy default-stream semantics: the plain symbol names below. */
#undef CUDA_API_PER_THREAD_DEFAULT_STREAM
#include <cuda.h>
#include <nvrtc.h>

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>

/* ==== NVRTC ============================================================== */

#define NVRTC_FUNCS(X)                                                       \
    X(nvrtcGetErrorString)                                                   \
    X(nvrtcVersion)                                                          \
    X(nvrtcCreateProgram)                                                    \
    X(nvrtcDestroyProgram)                                                   \
    X(nvrtcCompileProgram)                                                   \
    X(nvrtcGetProgramLogSize)                                                \
    X(nvrtcGetProgramLog)                                                    \
    X(nvrtcGetPTXSize)                                                       \
    X(nvrtcGetPTX)                                                           \
    X(nvrtcGetCUBINSize)                                                     \
    X(nvrtcGetCUBIN)

typedef struct nvrtc_api {
#define W16_X_(name) __typeof__(name) *name;
    NVRTC_FUNCS(W16_X_)
#undef W16_X_
    /* optional (NVRTC 11.2+): the architectures this NVRTC accepts */
    __typeof__(nvrtcGetNumSupportedArchs) *nvrtcGetNumSupportedArchs;
    __typeof__(nvrtcGetSupportedArchs) *nvrtcGetSupportedArchs;
} nvrtc_api_t;

/* The only process-wide state of the target. NVRTC is a stateless compiler
 * whose loading costs a few milliseconds and whose handle can be shared by
 * every context and thread, so it is loaded once (pthread_once: no lock on
 * the compile path afterwards) and never unloaded. Written only inside
 * nvrtc_load, read-only after. */
static pthread_once_t nvrtc_once = PTHREAD_ONCE_INIT;
static struct {
    bool ok;
    void *lib;
    nvrtc_api_t api;
    char why[512];          /* why NVRTC is unavailable */
    char version[32];       /* "NVRTC 13.0" */
    int major, minor;
    char include_dir[PATH_MAX + 16];
    int archs[64];          /* supported sm_XY as XY; n_archs 0 = unknown */
    int n_archs;
} nv;

static const char *nvrtc_resolve(void *lib, nvrtc_api_t *api)
{
#define W16_X_(name)                                                         \
    if (!(api->name = (__typeof__(api->name))(uintptr_t)dlsym(lib, #name)))  \
        return #name;
    NVRTC_FUNCS(W16_X_)
#undef W16_X_
    api->nvrtcGetNumSupportedArchs = (__typeof__(api->nvrtcGetNumSupportedArchs))
        (uintptr_t)dlsym(lib, "nvrtcGetNumSupportedArchs");
    api->nvrtcGetSupportedArchs = (__typeof__(api->nvrtcGetSupportedArchs))
        (uintptr_t)dlsym(lib, "nvrtcGetSupportedArchs");
    return NULL;
}

static bool dir_has_cuda_headers(const char *dir)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/cuda_fp16.h", dir);
    return access(path, R_OK) == 0;
}

/* cuda_fp16.h and friends are not built into NVRTC: it needs the toolkit's
 * include directory, and the toolkit may live anywhere. */
static void nvrtc_find_include_dir(void)
{
    char dir[PATH_MAX + 16];
    const char *home = getenv("CUDA_HOME");
    if (home && *home) {
        snprintf(dir, sizeof dir, "%s/include", home);
        if (dir_has_cuda_headers(dir))
            goto found;
    }
    snprintf(dir, sizeof dir, "/usr/local/cuda/include");
    if (dir_has_cuda_headers(dir))
        goto found;
    char origin[PATH_MAX] = "";
    if (dlinfo(nv.lib, RTLD_DI_ORIGIN, origin) == 0 && origin[0]) {
        snprintf(dir, sizeof dir, "%s/../include", origin);
        if (dir_has_cuda_headers(dir))
            goto found;
    }
    nv.include_dir[0] = '\0';
    return;
found:
    snprintf(nv.include_dir, sizeof nv.include_dir, "%s", dir);
}

static void nvrtc_query_archs(void)
{
    int n = 0;
    nv.n_archs = 0;
    if (!nv.api.nvrtcGetNumSupportedArchs || !nv.api.nvrtcGetSupportedArchs ||
        nv.api.nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 ||
        n > (int)W16_ARRAY_LEN(nv.archs))
        return;
    if (nv.api.nvrtcGetSupportedArchs(nv.archs) == NVRTC_SUCCESS)
        nv.n_archs = n;
}

static void nvrtc_load(void)
{
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12",
                                        "libnvrtc.so"};
    char first[256] = "";
    for (size_t i = 0; i < W16_ARRAY_LEN(names) && !nv.lib; i++) {
        nv.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        if (!nv.lib && !first[0])
            snprintf(first, sizeof first, "%s", dlerror());
    }
    if (!nv.lib) {
        snprintf(nv.why, sizeof nv.why, "NVRTC unavailable: %s (also tried "
                 "libnvrtc.so.12 and libnvrtc.so)", first);
        return;
    }
    const char *missing = nvrtc_resolve(nv.lib, &nv.api);
    int major = 0, minor = 0;
    if (missing) {
        snprintf(nv.why, sizeof nv.why, "NVRTC unavailable: the NVRTC library "
                 "has no %s", missing);
    } else if (nv.api.nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) {
        snprintf(nv.why, sizeof nv.why, "NVRTC unavailable: nvrtcVersion "
                 "failed");
    } else {
        snprintf(nv.version, sizeof nv.version, "NVRTC %d.%d", major, minor);
        nv.major = major;
        nv.minor = minor;
        nvrtc_find_include_dir();
        nvrtc_query_archs();
        nv.ok = true;
        return;
    }
    dlclose(nv.lib);
    nv.lib = NULL;
}

static wna16_status_t nvrtc_ready(wna16_error_t *err)
{
    pthread_once(&nvrtc_once, nvrtc_load);
    if (!nv.ok)
        return w16_err(err, WNA16_EUNAVAILABLE, "%s", nv.why);
    return WNA16_OK;
}

bool w16_nvrtc_available(wna16_context_t *ctx, wna16_error_t *err)
{
    (void)ctx;
    return nvrtc_ready(err) == WNA16_OK;
}

const char *w16_nvrtc_version(void)
{
    return nvrtc_ready(NULL) == WNA16_OK ? nv.version : "none";
}

const char *w16_nvrtc_include_dir(void)
{
    return nvrtc_ready(NULL) == WNA16_OK ? nv.include_dir : "";
}

/* Refuses an architecture this NVRTC does not know, listing those it does
 * (NVRTC's own answer is a bare "invalid value for --gpu-architecture"). */
static wna16_status_t nvrtc_check_arch(const char *kernel, int major,
                                       int minor, wna16_error_t *err)
{
    if (major < 1 || major > 99 || minor < 0 || minor > 9)
        return w16_err(err, WNA16_EINVAL, "kernel %s: invalid compute "
                       "capability %d.%d", kernel, major, minor);
    if (nv.n_archs == 0)
        return WNA16_OK; /* unknown list: let NVRTC decide */
    int arch = major * 10 + minor;
    char list[256] = "";
    size_t used = 0;
    for (int i = 0; i < nv.n_archs; i++) {
        if (nv.archs[i] == arch)
            return WNA16_OK;
        int n = snprintf(list + used, sizeof list - used, "%s%d",
                         i ? " " : "", nv.archs[i]);
        if (n > 0 && (size_t)n < sizeof list - used)
            used += (size_t)n;
    }
    return w16_err(err, WNA16_EUNSUPPORTED, "kernel %s: %s cannot compile for "
                   "sm_%d (it supports %s)", kernel, nv.version, arch, list);
}

/* NVRTC's log without trailing blank space; NULL when empty. */
static char *nvrtc_take_log(nvrtcProgram prog)
{
    size_t n = 0;
    if (nv.api.nvrtcGetProgramLogSize(prog, &n) != NVRTC_SUCCESS || n <= 1)
        return NULL;
    char *log = malloc(n);
    if (!log || nv.api.nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS) {
        free(log);
        return NULL;
    }
    log[n - 1] = '\0';
    size_t len = strlen(log);
    while (len > 0 && (log[len - 1] == '\n' || log[len - 1] == ' ' ||
                       log[len - 1] == '\r' || log[len - 1] == '\t'))
        log[--len] = '\0';
    if (len == 0) {
        free(log);
        return NULL;
    }
    return log;
}

/* The start of a log for an error message: whole lines, at most `max`
 * bytes (the first errors are the ones that matter; the rest is counted). */
static void log_excerpt(const char *log, char *out, size_t max)
{
    size_t len = strlen(log);
    if (len < max) {
        memcpy(out, log, len + 1);
        return;
    }
    size_t cut = max - 64; /* room for the note below */
    while (cut > 0 && log[cut] != '\n')
        cut--;
    if (cut == 0)
        cut = max - 64;
    snprintf(out, max, "%.*s\n[... %zu more bytes of NVRTC log]", (int)cut,
             log, len - cut);
}

static wna16_status_t nvrtc_compile_failed(wna16_context_t *ctx,
                                           nvrtcResult r, nvrtcProgram prog,
                                           const char *kernel, int arch,
                                           wna16_error_t *err)
{
    char *log = nvrtc_take_log(prog);
    char excerpt[720] = "";
    if (log) {
        log_excerpt(log, excerpt, sizeof excerpt);
        wna16_log(ctx, WNA16_LOG_DEBUG, "kernel %s: NVRTC log:\n%s", kernel,
                  log);
    }
    free(log);
    return w16_err(err, WNA16_EINTERNAL, "kernel %s: %s failed to compile for "
                   "sm_%d: %s%s%s%s", kernel, nv.version, arch,
                   nv.api.nvrtcGetErrorString(r), excerpt[0] ? ":\n" : "",
                   excerpt, nv.include_dir[0] ? "" : "\n(no CUDA include "
                   "directory was found: set CUDA_HOME)");
}

/* Copies the CUBIN and the PTX out of a compiled program. NVRTC reports
 * success with a 0-byte CUBIN for virtual (compute_XX) architectures, so
 * the size is checked, not trusted. */
static wna16_status_t nvrtc_take_outputs(nvrtcProgram prog,
                                         const char *kernel, int arch,
                                         w16_cuda_image_t *out,
                                         wna16_error_t *err)
{
    size_t n = 0;
    if (nv.api.nvrtcGetCUBINSize(prog, &n) != NVRTC_SUCCESS || n == 0)
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: NVRTC produced no "
                       "CUBIN for sm_%d", kernel, arch);
    if (!(out->cubin = malloc(n)))
        return w16_err_nomem(err, "copying a CUBIN");
    out->cubin_size = n;
    if (nv.api.nvrtcGetCUBIN(prog, out->cubin) != NVRTC_SUCCESS)
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: nvrtcGetCUBIN failed",
                       kernel);
    n = 0;
    if (nv.api.nvrtcGetPTXSize(prog, &n) != NVRTC_SUCCESS || n <= 1)
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: NVRTC produced no "
                       "PTX for sm_%d", kernel, arch);
    if (!(out->ptx = malloc(n)))
        return w16_err_nomem(err, "copying PTX");
    if (nv.api.nvrtcGetPTX(prog, out->ptx) != NVRTC_SUCCESS)
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: nvrtcGetPTX failed",
                       kernel);
    out->ptx[n - 1] = '\0';
    out->ptx_size = strlen(out->ptx);
    return WNA16_OK;
}

static void nvrtc_report_warnings(wna16_context_t *ctx, const char *kernel,
                                  const char *log)
{
    char key[300];
    snprintf(key, sizeof key, "nvrtc-warning:%s", kernel);
    w16_log_once(ctx, WNA16_LOG_WARN, key, "kernel %s: NVRTC warnings:\n%s",
                 kernel, log);
}

/* Whether NVRTC may optimize a unit's kernels in parallel threads
 * (--split-compile: NVVM's and ptxas's per-function work, then one image).
 * It leaves every kernel's code as it is: on NVRTC 13.0 the CUBIN's .text
 * sections of the fused-MoE units are byte for byte the same with and
 * without it (only the ELF's symbol order and the toolkit note, which
 * records the options, differ; test_moe_cuda_compile compares the
 * .text sections). A unit of one kernel
 * gains nothing and pays the threads' start (about 10 ms), so it is asked
 * for units of several kernels only, and from NVRTC 12.4 on (older ones
 * may not know the option: they compile as before). */
static bool nvrtc_split_ok(int n_kernels)
{
    return n_kernels > 1 &&
           (nv.major > 12 || (nv.major == 12 && nv.minor >= 4));
}

wna16_status_t w16_nvrtc_compile(wna16_context_t *ctx, const char *source,
                                 const char *kernel_name, int cc_major,
                                 int cc_minor, w16_cuda_image_t *out,
                                 wna16_error_t *err)
{
    return w16_nvrtc_compile_unit(ctx, source, kernel_name, 1, cc_major,
                                  cc_minor, out, err);
}

wna16_status_t w16_nvrtc_compile_unit(wna16_context_t *ctx,
                                      const char *source,
                                      const char *kernel_name, int n_kernels,
                                      int cc_major, int cc_minor,
                                      w16_cuda_image_t *out,
                                      wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "w16_nvrtc_compile: out is NULL");
    memset(out, 0, sizeof *out);
    if (!source || !kernel_name || !*kernel_name)
        return w16_err(err, WNA16_EINVAL, "w16_nvrtc_compile: source and "
                       "kernel name are required");
    wna16_status_t st = nvrtc_ready(err);
    if (st == WNA16_OK)
        st = nvrtc_check_arch(kernel_name, cc_major, cc_minor, err);
    if (st != WNA16_OK)
        return st;
    int arch = cc_major * 10 + cc_minor;
    char unit[300], arch_opt[32], inc_opt[PATH_MAX + 32];
    snprintf(unit, sizeof unit, "%s.cu", kernel_name);
    /* sm_90 compiles as sm_90a: the fused MoE's wgmma kernels need the
     * arch-specific instructions, and a CUBIN for sm_90a runs on exactly
     * the devices an sm_90 one does (compute capability 9.0) */
    snprintf(arch_opt, sizeof arch_opt, "-arch=sm_%d%s", arch,
             arch == 90 ? "a" : "");
    snprintf(inc_opt, sizeof inc_opt, "--include-path=%s", nv.include_dir);
    const char *opts[5] = {arch_opt, "-std=c++17", "-default-device"};
    int n_opts = 3;
    if (nv.include_dir[0])
        opts[n_opts++] = inc_opt;
    if (nvrtc_split_ok(n_kernels))
        opts[n_opts++] = "--split-compile=0"; /* 0: one thread per CPU */

    nvrtcProgram prog = NULL;
    nvrtcResult r = nv.api.nvrtcCreateProgram(&prog, source, unit, 0, NULL,
                                              NULL);
    if (r != NVRTC_SUCCESS)
        return w16_err(err, r == NVRTC_ERROR_OUT_OF_MEMORY ? WNA16_ENOMEM
                                                           : WNA16_EINTERNAL,
                       "kernel %s: nvrtcCreateProgram failed: %s",
                       kernel_name, nv.api.nvrtcGetErrorString(r));
    r = nv.api.nvrtcCompileProgram(prog, n_opts, opts);
    if (r != NVRTC_SUCCESS)
        st = nvrtc_compile_failed(ctx, r, prog, kernel_name, arch, err);
    else
        st = nvrtc_take_outputs(prog, kernel_name, arch, out, err);
    if (st == WNA16_OK) {
        out->cc_major = cc_major;
        out->cc_minor = cc_minor;
        out->log = nvrtc_take_log(prog);
        if (out->log)
            nvrtc_report_warnings(ctx, kernel_name, out->log);
    } else {
        w16_cuda_image_free(out);
    }
    nv.api.nvrtcDestroyProgram(&prog);
    return st;
}

/* ==== the driver ========================================================= */

/* Versioned names only (see the top of the file): each is the symbol the
 * CUDA 13 header maps the plain name to. cuEventElapsedTime_v2 is new in
 * 12.8, so older drivers get the plain export (same signature). */
#define CU_FUNCS(X)                                                          \
    X(cuInit)                                                                \
    X(cuGetErrorName)                                                        \
    X(cuGetErrorString)                                                      \
    X(cuDriverGetVersion)                                                    \
    X(cuDeviceGetCount)                                                      \
    X(cuDeviceGet)                                                           \
    X(cuDeviceGetAttribute)                                                  \
    X(cuDeviceGetName)                                                       \
    X(cuDevicePrimaryCtxRetain)                                              \
    X(cuDevicePrimaryCtxRelease_v2)                                          \
    X(cuCtxSetCurrent)                                                       \
    X(cuModuleLoadData)                                                      \
    X(cuModuleLoadDataEx)                                                    \
    X(cuModuleUnload)                                                        \
    X(cuModuleGetFunction)                                                   \
    X(cuFuncSetAttribute)                                                    \
    X(cuFuncGetAttribute)                                                    \
    X(cuLaunchKernel)                                                        \
    X(cuMemAlloc_v2)                                                         \
    X(cuMemFree_v2)                                                          \
    X(cuMemsetD8_v2)                                                         \
    X(cuMemsetD8Async)                                                       \
    X(cuMemcpyHtoD_v2)                                                       \
    X(cuMemcpyDtoH_v2)                                                       \
    X(cuMemcpyDtoD_v2)                                                       \
    X(cuMemcpyHtoDAsync_v2)                                                  \
    X(cuMemcpyDtoHAsync_v2)                                                  \
    X(cuMemAllocHost_v2)                                                     \
    X(cuMemFreeHost)                                                         \
    X(cuStreamCreate)                                                        \
    X(cuStreamDestroy_v2)                                                    \
    X(cuStreamSynchronize)                                                   \
    X(cuEventCreate)                                                         \
    X(cuEventDestroy_v2)                                                     \
    X(cuEventRecord)                                                         \
    X(cuStreamWaitEvent)                                                     \
    X(cuEventSynchronize)                                                    \
    X(cuStreamBeginCapture_v2)                                               \
    X(cuStreamEndCapture)                                                    \
    X(cuGraphInstantiateWithFlags)                                           \
    X(cuGraphLaunch)                                                         \
    X(cuGraphExecDestroy)                                                    \
    X(cuGraphDestroy)

typedef struct cu_api {
#define W16_X_(name) __typeof__(name) *name;
    CU_FUNCS(W16_X_)
#undef W16_X_
    __typeof__(cuEventElapsedTime_v2) *cuEventElapsedTime_v2;
    /* optional (CUDA 11.8+): launches with attributes, for programmatic
     * dependent launch (w16_cuda_launch_chained); NULL when absent */
    __typeof__(cuLaunchKernelEx) *cuLaunchKernelEx;
} cu_api_t;

struct w16_cuda {
    wna16_context_t *ctx;
    void *lib;
    cu_api_t cu;
    CUdevice dev;
    CUcontext cuctx; /* the device's primary context, retained */
    int cc_major, cc_minor, sm_count;
    size_t max_shared;
    char name[256];
    char driver[96];
};

struct w16_cuda_module {
    w16_cuda_t *cuda;
    CUmodule mod;
    bool from_ptx;
};

/* A driver handle in and out of its opaque wna16 spelling. */
static CUstream cu_stream(w16_cuda_stream_t *s) { return (CUstream)s; }
static CUevent cu_event(w16_cuda_event_t *e) { return (CUevent)e; }
static CUfunction cu_function(w16_cuda_function_t *f) { return (CUfunction)f; }

static pthread_mutex_t cuda_get_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *cu_resolve(void *lib, cu_api_t *api)
{
#define W16_X_(name)                                                         \
    if (!(api->name = (__typeof__(api->name))(uintptr_t)dlsym(lib, #name)))  \
        return #name;
    CU_FUNCS(W16_X_)
#undef W16_X_
    void *p = dlsym(lib, "cuEventElapsedTime_v2");
    if (!p)
        p = dlsym(lib, "cuEventElapsedTime");
    if (!p)
        return "cuEventElapsedTime";
    api->cuEventElapsedTime_v2 =
        (__typeof__(api->cuEventElapsedTime_v2))(uintptr_t)p;
    api->cuLaunchKernelEx = (__typeof__(api->cuLaunchKernelEx))(uintptr_t)
        dlsym(lib, "cuLaunchKernelEx");
    return NULL;
}

/* "CUDA_ERROR_OUT_OF_MEMORY: out of memory (error 2)". The name and text
 * calls can fail themselves (the stub library answers everything with
 * CUDA_ERROR_STUB_LIBRARY), hence the fallbacks. */
static void cu_describe(const cu_api_t *cu, CUresult r, char *buf, size_t n)
{
    const char *name = NULL, *text = NULL;
    if (!cu->cuGetErrorName || cu->cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = NULL;
    if (!cu->cuGetErrorString || cu->cuGetErrorString(r, &text) != CUDA_SUCCESS)
        text = NULL;
    if (r == CUDA_ERROR_STUB_LIBRARY && !name) {
        name = "CUDA_ERROR_STUB_LIBRARY";
        text = "libcuda.so.1 is the CUDA toolkit's stub, not a driver";
    }
    snprintf(buf, n, "%s: %s (error %d)", name ? name : "CUDA error",
             text ? text : "no description", (int)r);
}

/* Fills err with "<what>: <driver error>"; out of memory is ENOMEM, any
 * other failure `st`. */
static wna16_status_t cu_fail(const w16_cuda_t *c, wna16_error_t *err,
                              wna16_status_t st, CUresult r,
                              const char *fmt, ...) W16_PRINTF(5, 6);

static wna16_status_t cu_fail(const w16_cuda_t *c, wna16_error_t *err,
                              wna16_status_t st, CUresult r,
                              const char *fmt, ...)
{
    char what[512], why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    cu_describe(&c->cu, r, why, sizeof why);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        st = WNA16_ENOMEM;
    return w16_err(err, st, "%s: %s", what, why);
}

/* For the void functions (free, destroy): a failure is logged. */
static void cu_warn(const w16_cuda_t *c, CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return;
    char why[256];
    cu_describe(&c->cu, r, why, sizeof why);
    wna16_log(c->ctx, WNA16_LOG_WARN, "CUDA: %s: %s", what, why);
}

/* The current context is per thread: every entry point makes the target's
 * current first, so any thread may call any function (a TLS store inside
 * the driver; cheap next to any real work). */
static wna16_status_t bind(const w16_cuda_t *c, wna16_error_t *err)
{
    CUresult r = c->cu.cuCtxSetCurrent(c->cuctx);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "making the CUDA context "
                       "current");
    return WNA16_OK;
}

/* The kernel module's version ("580.95.05") from the first line of
 * /proc/driver/nvidia/version: the first token made of digits and dots
 * ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  ..."). */
static bool kernel_module_version(char *out, size_t n)
{
    FILE *f = fopen("/proc/driver/nvidia/version", "r");
    if (!f)
        return false;
    char line[512];
    bool found = false;
    if (fgets(line, sizeof line, f)) {
        for (char *save = NULL, *t = strtok_r(line, " \t\n", &save); t;
             t = strtok_r(NULL, " \t\n", &save)) {
            if (t[0] >= '0' && t[0] <= '9' && strchr(t, '.') &&
                strspn(t, "0123456789.") == strlen(t)) {
                snprintf(out, n, "%s", t);
                found = true;
                break;
            }
        }
    }
    fclose(f);
    return found;
}

static void describe_driver(w16_cuda_t *c)
{
    int v = 0;
    if (c->cu.cuDriverGetVersion(&v) != CUDA_SUCCESS)
        v = 0;
    char km[64];
    if (kernel_module_version(km, sizeof km))
        snprintf(c->driver, sizeof c->driver, "CUDA driver %d.%d (%s)",
                 v / 1000, (v % 1000) / 10, km);
    else
        snprintf(c->driver, sizeof c->driver, "CUDA driver %d.%d", v / 1000,
                 (v % 1000) / 10);
}

static wna16_status_t read_attribute(w16_cuda_t *c, CUdevice_attribute a,
                                     const char *what, int *out,
                                     wna16_error_t *err)
{
    CUresult r = c->cu.cuDeviceGetAttribute(out, a, c->dev);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EUNAVAILABLE, r, "CUDA target "
                       "unavailable: reading the %s of device 0", what);
    return WNA16_OK;
}

/* Device 0: its properties, then its primary context, retained and made
 * current (CUDA 13 changed cuCtxCreate's signature; the primary context
 * is also what the CUDA runtime and other libraries in the process use). */
static wna16_status_t open_device(w16_cuda_t *c, wna16_error_t *err)
{
    int count = 0, smem = 0;
    CUresult r = c->cu.cuDeviceGetCount(&count);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EUNAVAILABLE, r, "CUDA target "
                       "unavailable: counting devices");
    if (count < 1)
        return w16_err(err, WNA16_EUNAVAILABLE, "CUDA target unavailable: the "
                       "driver sees no device");
    if ((r = c->cu.cuDeviceGet(&c->dev, 0)) != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EUNAVAILABLE, r, "CUDA target "
                       "unavailable: getting device 0");
    wna16_status_t st = read_attribute(
        c, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability",
        &c->cc_major, err);
    if (st == WNA16_OK)
        st = read_attribute(c, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                            "compute capability", &c->cc_minor, err);
    if (st == WNA16_OK)
        st = read_attribute(c, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                            "multiprocessor count", &c->sm_count, err);
    if (st == WNA16_OK)
        st = read_attribute(c, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                            "shared memory size", &smem, err);
    if (st != WNA16_OK)
        return st;
    c->max_shared = smem > 0 ? (size_t)smem : 0;
    if (c->cu.cuDeviceGetName(c->name, (int)sizeof c->name, c->dev) !=
        CUDA_SUCCESS)
        snprintf(c->name, sizeof c->name, "CUDA device 0");
    if ((r = c->cu.cuDevicePrimaryCtxRetain(&c->cuctx, c->dev)) != CUDA_SUCCESS) {
        c->cuctx = NULL;
        return cu_fail(c, err, WNA16_EUNAVAILABLE, r, "CUDA target "
                       "unavailable: retaining the primary context of %s",
                       c->name);
    }
    return bind(c, err);
}

static wna16_status_t cuda_create(wna16_context_t *ctx, w16_cuda_t **out,
                                  wna16_error_t *err)
{
    /* libcuda.so.1 only: it is what the driver installs. The toolkit's
     * libcuda.so is a link-time stub that fails every call. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return w16_err(err, WNA16_EUNAVAILABLE, "CUDA target unavailable: %s",
                       dlerror());
    w16_cuda_t *c = w16_calloc(ctx, 1, sizeof *c);
    if (!c) {
        dlclose(lib);
        return w16_err_nomem(err, "creating the CUDA target");
    }
    c->ctx = ctx;
    c->lib = lib;
    const char *missing = cu_resolve(lib, &c->cu);
    CUresult r = missing ? CUDA_SUCCESS : c->cu.cuInit(0);
    wna16_status_t st;
    if (missing) /* a driver older than these entry points */
        st = w16_err(err, WNA16_EUNAVAILABLE, "CUDA target unavailable: "
                     "libcuda.so.1 has no %s (driver too old)", missing);
    else if (r != CUDA_SUCCESS) /* any failure here means "no usable GPU" */
        st = cu_fail(c, err, WNA16_EUNAVAILABLE, r, "CUDA target "
                     "unavailable: cuInit failed");
    else
        st = open_device(c, err);
    if (st != WNA16_OK) {
        /* Only a driver that never initialized is unloaded; see destroy. */
        bool initialized = !missing && r == CUDA_SUCCESS;
        w16_cuda_destroy(c);
        if (!initialized)
            dlclose(lib);
        return st;
    }
    describe_driver(c);
    *out = c;
    return WNA16_OK;
}

wna16_status_t w16_cuda_get(wna16_context_t *ctx, w16_cuda_t **out,
                            wna16_error_t *err)
{
    if (!ctx || !out)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_get: context and out are "
                       "required");
    /* Guards the creation only (one target per context); holds no state. */
    pthread_mutex_lock(&cuda_get_mu);
    wna16_status_t st = WNA16_OK;
    w16_cuda_t *c = ctx->targets[WNA16_TARGET_CUDA];
    if (!c && (st = cuda_create(ctx, &c, err)) == WNA16_OK)
        ctx->targets[WNA16_TARGET_CUDA] = c;
    pthread_mutex_unlock(&cuda_get_mu);
    *out = c;
    return st;
}

/* The driver library is never dlclose'd once cuInit succeeded: it keeps
 * threads and atexit handlers that outlive any context, and unloading it
 * under them is not supported. dlopen counts references, so the next
 * target reuses the same mapping. */
void w16_cuda_destroy(w16_cuda_t *c)
{
    if (!c)
        return;
    if (c->cuctx) {
        /* leave no dangling current context on this thread */
        c->cu.cuCtxSetCurrent(NULL);
        cu_warn(c, c->cu.cuDevicePrimaryCtxRelease_v2(c->dev),
                "releasing the primary context");
    }
    w16_free(c->ctx, c, sizeof *c);
}

int w16_cuda_cc_major(const w16_cuda_t *c) { return c ? c->cc_major : 0; }
int w16_cuda_cc_minor(const w16_cuda_t *c) { return c ? c->cc_minor : 0; }
const char *w16_cuda_device_name(const w16_cuda_t *c) { return c ? c->name : ""; }
const char *w16_cuda_driver_version(const w16_cuda_t *c)
{
    return c ? c->driver : "";
}
int w16_cuda_sm_count(const w16_cuda_t *c) { return c ? c->sm_count : 0; }
size_t w16_cuda_max_shared(const w16_cuda_t *c) { return c ? c->max_shared : 0; }

/* ---- modules ------------------------------------------------------------- */

/* SASS runs on devices of the same major version and an equal or higher
 * minor (an sm_80 CUBIN runs on sm_86, not on sm_90). */
static bool cubin_runs_on(const w16_cuda_t *c, const w16_cuda_image_t *img)
{
    return img->cubin && img->cubin_size > 0 &&
           img->cc_major == c->cc_major && img->cc_minor <= c->cc_minor;
}

/* The driver parses what it is given without a length: check the ELF
 * magic so a damaged buffer is an error, not a crash. */
static bool looks_like_elf(const w16_cuda_image_t *img)
{
    return img->cubin_size >= 64 && memcmp(img->cubin, "\177ELF", 4) == 0;
}

static wna16_status_t load_ptx(w16_cuda_t *c, const w16_cuda_image_t *img,
                               const char *cubin_note, CUmodule *mod,
                               wna16_error_t *err)
{
    if (img->ptx[img->ptx_size] != '\0')
        return w16_err(err, WNA16_EINVAL, "CUDA module load: the PTX is not "
                       "NUL-terminated at ptx_size");
    char log[2048] = "";
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER,
                           CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {log, (void *)(uintptr_t)sizeof log};
    CUresult r = c->cu.cuModuleLoadDataEx(mod, img->ptx, 2, opts, vals);
    if (r == CUDA_SUCCESS)
        return WNA16_OK;
    log[sizeof log - 1] = '\0';
    if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION)
        return cu_fail(c, err, WNA16_EUNSUPPORTED, r, "JIT-compiling the PTX "
                       "for %s (sm_%d%d)%s: the driver (%s) is older than the "
                       "compiler that wrote it (%s PTX needs a driver of "
                       "that CUDA version or newer)", c->name, c->cc_major,
                       c->cc_minor, cubin_note, c->driver, w16_nvrtc_version());
    return cu_fail(c, err, WNA16_EINTERNAL, r, "JIT-compiling the PTX for %s "
                   "(sm_%d%d)%s%s%s", c->name, c->cc_major, c->cc_minor,
                   cubin_note, log[0] ? ": " : "", log);
}

/* Tries the CUBIN when it can run here; `note` then says why it was not
 * used, for the PTX path's messages. */
static CUresult try_cubin(w16_cuda_t *c, const w16_cuda_image_t *img,
                          CUmodule *mod, char *note, size_t n)
{
    if (!img->cubin || img->cubin_size == 0) {
        snprintf(note, n, " (no CUBIN)");
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    if (!cubin_runs_on(c, img)) {
        snprintf(note, n, " (the CUBIN is for sm_%d%d)", img->cc_major,
                 img->cc_minor);
        return CUDA_ERROR_NO_BINARY_FOR_GPU;
    }
    if (!looks_like_elf(img)) {
        snprintf(note, n, " (the CUBIN is not an ELF file)");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    CUresult r = c->cu.cuModuleLoadData(mod, img->cubin);
    if (r != CUDA_SUCCESS) {
        char why[256];
        cu_describe(&c->cu, r, why, sizeof why);
        snprintf(note, n, " (the sm_%d%d CUBIN was rejected: %s)",
                 img->cc_major, img->cc_minor, why);
    }
    return r;
}

wna16_status_t w16_cuda_module_load(w16_cuda_t *c, const w16_cuda_image_t *img,
                                    w16_cuda_module_t **out,
                                    wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_module_load: out is NULL");
    *out = NULL;
    if (!c || !img)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_module_load: target and "
                       "image are required");
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUmodule mod = NULL;
    char note[400] = "";
    CUresult r = try_cubin(c, img, &mod, note, sizeof note);
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
        return cu_fail(c, err, WNA16_ENOMEM, r, "loading a CUBIN on %s",
                       c->name);
    bool from_ptx = r != CUDA_SUCCESS;
    if (from_ptx && !img->ptx)
        return w16_err(err, WNA16_EUNSUPPORTED, "CUDA module load: nothing in "
                       "the image runs on %s (sm_%d%d)%s and it has no PTX",
                       c->name, c->cc_major, c->cc_minor, note);
    if (from_ptx) {
        wna16_log(c->ctx, WNA16_LOG_DEBUG, "CUDA: loading PTX on sm_%d%d%s",
                  c->cc_major, c->cc_minor, note);
        if ((st = load_ptx(c, img, note, &mod, err)) != WNA16_OK)
            return st;
    }
    w16_cuda_module_t *m = w16_calloc(c->ctx, 1, sizeof *m);
    if (!m) {
        cu_warn(c, c->cu.cuModuleUnload(mod), "unloading a module");
        return w16_err_nomem(err, "loading a CUDA module");
    }
    m->cuda = c;
    m->mod = mod;
    m->from_ptx = from_ptx;
    *out = m;
    return WNA16_OK;
}

bool w16_cuda_module_from_ptx(const w16_cuda_module_t *m)
{
    return m && m->from_ptx;
}

void w16_cuda_module_unload(w16_cuda_module_t *m)
{
    if (!m)
        return;
    w16_cuda_t *c = m->cuda;
    if (bind(c, NULL) == WNA16_OK)
        cu_warn(c, c->cu.cuModuleUnload(m->mod), "unloading a module");
    w16_free(c->ctx, m, sizeof *m);
}

wna16_status_t w16_cuda_function(w16_cuda_module_t *m, const char *name,
                                 w16_cuda_function_t **fn, wna16_error_t *err)
{
    if (!m || !name || !fn)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_function: module, name "
                       "and fn are required");
    *fn = NULL;
    wna16_status_t st = bind(m->cuda, err);
    if (st != WNA16_OK)
        return st;
    CUfunction f = NULL;
    CUresult r = m->cuda->cu.cuModuleGetFunction(&f, m->mod, name);
    if (r == CUDA_ERROR_NOT_FOUND)
        return w16_err(err, WNA16_ENOTFOUND, "CUDA module has no kernel named "
                       "'%s' (kernels must be extern \"C\")", name);
    if (r != CUDA_SUCCESS)
        return cu_fail(m->cuda, err, WNA16_EINTERNAL, r, "looking up kernel "
                       "'%s'", name);
    *fn = (w16_cuda_function_t *)f;
    return WNA16_OK;
}

/* ---- launches ------------------------------------------------------------ */

#define STATIC_SHARED_LIMIT (48u * 1024u) /* usable without opting in */

static wna16_status_t opt_in_shared(w16_cuda_t *c, CUfunction f,
                                    unsigned bytes, wna16_error_t *err)
{
    if (bytes > c->max_shared)
        return w16_err(err, WNA16_ELIMIT, "CUDA launch: %u bytes of shared "
                       "memory requested, %s allows at most %zu", bytes,
                       c->name, c->max_shared);
    CUresult r = c->cu.cuFuncSetAttribute(
        f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)bytes);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "CUDA launch: allowing %u "
                       "bytes of dynamic shared memory", bytes);
    /* A kernel that asks for this much shared memory is tiled around it:
     * prefer the largest shared-memory carveout, so that as many CTAs fit
     * as registers allow (without the hint the driver may pick a carveout
     * that holds fewer). A hint: failure only costs occupancy. */
    cu_warn(c, c->cu.cuFuncSetAttribute(
                   f, CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                   CU_SHAREDMEM_CARVEOUT_MAX_SHARED),
            "preferring the shared-memory carveout");
    return WNA16_OK;
}

/* Programmatic dependent launch: sm_90 and later (griddepcontrol), and a
 * driver with cuLaunchKernelEx. Otherwise chained launches are plain ones,
 * which is logged once per context. */
static bool pdl_usable(w16_cuda_t *c)
{
    if (w16_cuda_chained_overlaps(c))
        return true;
    w16_log_once(c->ctx, WNA16_LOG_INFO, "cuda-pdl",
                 "CUDA: %s: kernels of a chain launch one after the other "
                 "(programmatic dependent launch needs %s)", c->name,
                 c->cc_major < 9 ? "sm_90 or later"
                                 : "cuLaunchKernelEx (CUDA 11.8+ driver)");
    return false;
}

static wna16_status_t launch(w16_cuda_t *c, w16_cuda_function_t *fn,
                             unsigned grid_x, unsigned block_x,
                             unsigned shared_bytes, w16_cuda_stream_t *stream,
                             void **args, bool chained, wna16_error_t *err)
{
    if (!c || !fn)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_launch: target and "
                       "function are required");
    if (grid_x == 0 || grid_x > INT32_MAX || block_x == 0 || block_x > 1024)
        return w16_err(err, WNA16_EINVAL, "CUDA launch: invalid shape: %u "
                       "blocks of %u threads", grid_x, block_x);
    wna16_status_t st = bind(c, err);
    CUfunction f = cu_function(fn);
    /* the 48 KiB default covers static and dynamic shared memory
     * together: past it, the dynamic part needs the opt-in */
    int static_bytes = 0;
    if (st == WNA16_OK && shared_bytes &&
        c->cu.cuFuncGetAttribute(&static_bytes,
                                 CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                 f) != CUDA_SUCCESS)
        static_bytes = STATIC_SHARED_LIMIT; /* unknown: opt in */
    if (st == WNA16_OK && shared_bytes &&
        (size_t)shared_bytes + (size_t)static_bytes > STATIC_SHARED_LIMIT) {
        if ((size_t)shared_bytes + (size_t)static_bytes > c->max_shared)
            return w16_err(err, WNA16_ELIMIT, "CUDA launch: %u bytes of "
                           "dynamic and %d of static shared memory, %s "
                           "allows at most %zu", shared_bytes, static_bytes,
                           c->name, c->max_shared);
        st = opt_in_shared(c, f, shared_bytes, err);
    }
    if (st != WNA16_OK)
        return st;
    CUresult r;
    if (chained && pdl_usable(c)) {
        /* the kernel may start while the previous one on the stream runs
         * its tail; its griddepcontrol.wait orders its reads after it */
        CUlaunchAttribute at[1];
        memset(at, 0, sizeof at);
        at[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        at[0].value.programmaticStreamSerializationAllowed = 1;
        CUlaunchConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        cfg.gridDimX = grid_x;
        cfg.gridDimY = cfg.gridDimZ = 1;
        cfg.blockDimX = block_x;
        cfg.blockDimY = cfg.blockDimZ = 1;
        cfg.sharedMemBytes = shared_bytes;
        cfg.hStream = cu_stream(stream);
        cfg.attrs = at;
        cfg.numAttrs = 1;
        r = c->cu.cuLaunchKernelEx(&cfg, f, args, NULL);
    } else {
        r = c->cu.cuLaunchKernel(f, grid_x, 1, 1, block_x, 1, 1, shared_bytes,
                                 cu_stream(stream), args, NULL);
    }
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "launching %u blocks of %u "
                       "threads (%u bytes shared%s) on %s", grid_x, block_x,
                       shared_bytes, chained ? ", chained" : "", c->name);
    return WNA16_OK;
}

wna16_status_t w16_cuda_launch(w16_cuda_t *c, w16_cuda_function_t *fn,
                               unsigned grid_x, unsigned block_x,
                               unsigned shared_bytes,
                               w16_cuda_stream_t *stream, void **args,
                               wna16_error_t *err)
{
    return launch(c, fn, grid_x, block_x, shared_bytes, stream, args, false,
                  err);
}

wna16_status_t w16_cuda_launch_chained(w16_cuda_t *c, w16_cuda_function_t *fn,
                                       unsigned grid_x, unsigned block_x,
                                       unsigned shared_bytes,
                                       w16_cuda_stream_t *stream, void **args,
                                       wna16_error_t *err)
{
    return launch(c, fn, grid_x, block_x, shared_bytes, stream, args, true,
                  err);
}

bool w16_cuda_chained_overlaps(w16_cuda_t *c)
{
    return c && c->cc_major >= 9 && c->cu.cuLaunchKernelEx;
}

/* ---- memory -------------------------------------------------------------- */

wna16_status_t w16_cuda_alloc(w16_cuda_t *c, size_t bytes, uint64_t *dptr,
                              wna16_error_t *err)
{
    if (!c || !dptr)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_alloc: target and dptr "
                       "are required");
    *dptr = 0;
    if (bytes == 0)
        return WNA16_OK;
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUdeviceptr p = 0;
    CUresult r = c->cu.cuMemAlloc_v2(&p, bytes);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "allocating %zu bytes on %s",
                       bytes, c->name);
    *dptr = (uint64_t)p;
    return WNA16_OK;
}

void w16_cuda_free(w16_cuda_t *c, uint64_t dptr)
{
    if (!c || dptr == 0)
        return;
    if (bind(c, NULL) == WNA16_OK)
        cu_warn(c, c->cu.cuMemFree_v2((CUdeviceptr)dptr), "freeing device "
                "memory");
}

/* Waits for the default stream: makes an asynchronous driver call behave
 * as the synchronous API promises. */
static wna16_status_t sync_default(w16_cuda_t *c, const char *what,
                                   wna16_error_t *err)
{
    CUresult r = c->cu.cuStreamSynchronize(NULL);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "%s: waiting for the "
                       "device", what);
    return WNA16_OK;
}

wna16_status_t w16_cuda_memset(w16_cuda_t *c, uint64_t dptr, uint8_t value,
                               size_t bytes, wna16_error_t *err)
{
    wna16_status_t st = w16_cuda_memset_async(c, dptr, value, bytes, NULL,
                                              err);
    if (st == WNA16_OK && bytes > 0)
        st = sync_default(c, "memset", err);
    return st;
}

wna16_status_t w16_cuda_memset_async(w16_cuda_t *c, uint64_t dptr,
                                     uint8_t value, size_t bytes,
                                     w16_cuda_stream_t *stream,
                                     wna16_error_t *err)
{
    if (!c)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_memset: no target");
    if (bytes == 0)
        return WNA16_OK;
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUresult r = stream ? c->cu.cuMemsetD8Async((CUdeviceptr)dptr, value,
                                                bytes, cu_stream(stream))
                        : c->cu.cuMemsetD8_v2((CUdeviceptr)dptr, value, bytes);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "setting %zu bytes at "
                       "0x%llx", bytes, (unsigned long long)dptr);
    return WNA16_OK;
}

/* The common head of every copy: arguments, nothing to do, binding. */
static wna16_status_t copy_begin(w16_cuda_t *c, bool ok, size_t bytes,
                                 const char *what, bool *skip,
                                 wna16_error_t *err)
{
    *skip = true;
    if (!c || !ok)
        return w16_err(err, WNA16_EINVAL, "%s: invalid arguments", what);
    if (bytes == 0)
        return WNA16_OK;
    *skip = false;
    return bind(c, err);
}

static wna16_status_t copy_end(w16_cuda_t *c, CUresult r, const char *what,
                               size_t bytes, wna16_error_t *err)
{
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "%s of %zu bytes", what,
                       bytes);
    return WNA16_OK;
}

wna16_status_t w16_cuda_copy_h2d(w16_cuda_t *c, uint64_t dst, const void *src,
                                 size_t bytes, wna16_error_t *err)
{
    bool skip;
    const char *what = "copying host to device";
    wna16_status_t st = copy_begin(c, src || !bytes, bytes, what, &skip, err);
    if (st != WNA16_OK || skip)
        return st;
    return copy_end(c, c->cu.cuMemcpyHtoD_v2((CUdeviceptr)dst, src, bytes),
                    what, bytes, err);
}

wna16_status_t w16_cuda_copy_d2h(w16_cuda_t *c, void *dst, uint64_t src,
                                 size_t bytes, wna16_error_t *err)
{
    bool skip;
    const char *what = "copying device to host";
    wna16_status_t st = copy_begin(c, dst || !bytes, bytes, what, &skip, err);
    if (st != WNA16_OK || skip)
        return st;
    return copy_end(c, c->cu.cuMemcpyDtoH_v2(dst, (CUdeviceptr)src, bytes),
                    what, bytes, err);
}

/* cuMemcpyDtoD returns before the copy is done; wait, as promised. */
wna16_status_t w16_cuda_copy_d2d(w16_cuda_t *c, uint64_t dst, uint64_t src,
                                 size_t bytes, wna16_error_t *err)
{
    bool skip;
    const char *what = "copying device to device";
    wna16_status_t st = copy_begin(c, true, bytes, what, &skip, err);
    if (st != WNA16_OK || skip)
        return st;
    st = copy_end(c, c->cu.cuMemcpyDtoD_v2((CUdeviceptr)dst, (CUdeviceptr)src,
                                           bytes), what, bytes, err);
    return st == WNA16_OK ? sync_default(c, what, err) : st;
}

wna16_status_t w16_cuda_copy_h2d_async(w16_cuda_t *c, uint64_t dst,
                                       const void *src, size_t bytes,
                                       w16_cuda_stream_t *stream,
                                       wna16_error_t *err)
{
    bool skip;
    const char *what = "queueing a host to device copy";
    wna16_status_t st = copy_begin(c, src || !bytes, bytes, what, &skip, err);
    if (st != WNA16_OK || skip)
        return st;
    return copy_end(c, c->cu.cuMemcpyHtoDAsync_v2((CUdeviceptr)dst, src, bytes,
                                                  cu_stream(stream)),
                    what, bytes, err);
}

wna16_status_t w16_cuda_copy_d2h_async(w16_cuda_t *c, void *dst, uint64_t src,
                                       size_t bytes, w16_cuda_stream_t *stream,
                                       wna16_error_t *err)
{
    bool skip;
    const char *what = "queueing a device to host copy";
    wna16_status_t st = copy_begin(c, dst || !bytes, bytes, what, &skip, err);
    if (st != WNA16_OK || skip)
        return st;
    return copy_end(c, c->cu.cuMemcpyDtoHAsync_v2(dst, (CUdeviceptr)src, bytes,
                                                  cu_stream(stream)),
                    what, bytes, err);
}

wna16_status_t w16_cuda_host_alloc(w16_cuda_t *c, size_t bytes, void **out,
                                   wna16_error_t *err)
{
    if (!c || !out)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_host_alloc: target and "
                       "out are required");
    *out = NULL;
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUresult r = c->cu.cuMemAllocHost_v2(out, bytes ? bytes : 1);
    if (r != CUDA_SUCCESS) {
        *out = NULL;
        return cu_fail(c, err, WNA16_EINTERNAL, r, "allocating %zu bytes of "
                       "pinned host memory", bytes);
    }
    return WNA16_OK;
}

void w16_cuda_host_free(w16_cuda_t *c, void *p)
{
    if (!c || !p)
        return;
    if (bind(c, NULL) == WNA16_OK)
        cu_warn(c, c->cu.cuMemFreeHost(p), "freeing pinned host memory");
}

/* ---- streams and events -------------------------------------------------- */

static wna16_status_t stream_create(w16_cuda_t *c, unsigned flags,
                                    const char *fn, w16_cuda_stream_t **out,
                                    wna16_error_t *err)
{
    if (!c || !out)
        return w16_err(err, WNA16_EINVAL, "%s: target and out are required",
                       fn);
    *out = NULL;
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUstream s = NULL;
    CUresult r = c->cu.cuStreamCreate(&s, flags);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "creating a stream");
    *out = (w16_cuda_stream_t *)s;
    return WNA16_OK;
}

wna16_status_t w16_cuda_stream_create(w16_cuda_t *c, w16_cuda_stream_t **out,
                                      wna16_error_t *err)
{
    return stream_create(c, CU_STREAM_DEFAULT, "w16_cuda_stream_create", out,
                         err);
}

void w16_cuda_stream_destroy(w16_cuda_t *c, w16_cuda_stream_t *s)
{
    if (!c || !s)
        return;
    if (bind(c, NULL) == WNA16_OK)
        cu_warn(c, c->cu.cuStreamDestroy_v2(cu_stream(s)), "destroying a "
                "stream");
}

wna16_status_t w16_cuda_stream_sync(w16_cuda_t *c, w16_cuda_stream_t *s,
                                    wna16_error_t *err)
{
    if (!c)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_stream_sync: no target");
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUresult r = c->cu.cuStreamSynchronize(cu_stream(s));
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "waiting for a %s stream",
                       s ? "CUDA" : "the default");
    return WNA16_OK;
}

wna16_status_t w16_cuda_event_create(w16_cuda_t *c, w16_cuda_event_t **out,
                                     wna16_error_t *err)
{
    if (!c || !out)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_event_create: target and "
                       "out are required");
    *out = NULL;
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUevent e = NULL;
    CUresult r = c->cu.cuEventCreate(&e, CU_EVENT_DEFAULT); /* timed */
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "creating an event");
    *out = (w16_cuda_event_t *)e;
    return WNA16_OK;
}

void w16_cuda_event_destroy(w16_cuda_t *c, w16_cuda_event_t *ev)
{
    if (!c || !ev)
        return;
    if (bind(c, NULL) == WNA16_OK)
        cu_warn(c, c->cu.cuEventDestroy_v2(cu_event(ev)), "destroying an "
                "event");
}

wna16_status_t w16_cuda_event_record(w16_cuda_t *c, w16_cuda_event_t *ev,
                                     w16_cuda_stream_t *stream,
                                     wna16_error_t *err)
{
    if (!c || !ev)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_event_record: target and "
                       "event are required");
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUresult r = c->cu.cuEventRecord(cu_event(ev), cu_stream(stream));
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "recording an event");
    return WNA16_OK;
}

wna16_status_t w16_cuda_stream_wait_event(w16_cuda_t *c,
                                          w16_cuda_stream_t *stream,
                                          w16_cuda_event_t *ev,
                                          wna16_error_t *err)
{
    if (!c || !ev)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_stream_wait_event: "
                       "target and event are required");
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUresult r = c->cu.cuStreamWaitEvent(cu_stream(stream), cu_event(ev), 0);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "ordering a stream after "
                       "an event");
    return WNA16_OK;
}

wna16_status_t w16_cuda_event_sync(w16_cuda_t *c, w16_cuda_event_t *ev,
                                   wna16_error_t *err)
{
    if (!c || !ev)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_event_sync: target and "
                       "event are required");
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUresult r = c->cu.cuEventSynchronize(cu_event(ev));
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "waiting for an event");
    return WNA16_OK;
}

wna16_status_t w16_cuda_event_elapsed_ms(w16_cuda_t *c,
                                         w16_cuda_event_t *start,
                                         w16_cuda_event_t *end, float *ms,
                                         wna16_error_t *err)
{
    if (!c || !start || !end || !ms)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_event_elapsed_ms: "
                       "invalid arguments");
    *ms = 0.0f;
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUresult r = c->cu.cuEventElapsedTime_v2(ms, cu_event(start),
                                             cu_event(end));
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "timing two events");
    return WNA16_OK;
}

/* ---- graphs ---- */

struct w16_cuda_graph {
    CUgraph graph;
    CUgraphExec exec;
};

wna16_status_t w16_cuda_stream_create_async(w16_cuda_t *c,
                                            w16_cuda_stream_t **out,
                                            wna16_error_t *err)
{
    return stream_create(c, CU_STREAM_NON_BLOCKING,
                         "w16_cuda_stream_create_async", out, err);
}

wna16_status_t w16_cuda_capture_begin(w16_cuda_t *c, w16_cuda_stream_t *s,
                                      wna16_error_t *err)
{
    if (!c || !s)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_capture_begin: target "
                       "and a stream are required");
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUresult r = c->cu.cuStreamBeginCapture_v2(
        cu_stream(s), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "starting a stream capture");
    return WNA16_OK;
}

wna16_status_t w16_cuda_capture_end(w16_cuda_t *c, w16_cuda_stream_t *s,
                                    w16_cuda_graph_t **out, wna16_error_t *err)
{
    if (!c || !s || !out)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_capture_end: target, "
                       "stream and out are required");
    *out = NULL;
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUgraph g = NULL;
    CUresult r = c->cu.cuStreamEndCapture(cu_stream(s), &g);
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "ending a stream capture");
    CUgraphExec x = NULL;
    r = c->cu.cuGraphInstantiateWithFlags(&x, g, 0);
    if (r != CUDA_SUCCESS) {
        c->cu.cuGraphDestroy(g);
        return cu_fail(c, err, WNA16_EINTERNAL, r, "instantiating a graph");
    }
    w16_cuda_graph_t *G = w16_calloc(c->ctx, 1, sizeof *G);
    if (!G) {
        c->cu.cuGraphExecDestroy(x);
        c->cu.cuGraphDestroy(g);
        return w16_err_nomem(err, "keeping a CUDA graph");
    }
    G->graph = g;
    G->exec = x;
    *out = G;
    return WNA16_OK;
}

wna16_status_t w16_cuda_graph_launch(w16_cuda_t *c, w16_cuda_graph_t *g,
                                     w16_cuda_stream_t *s, wna16_error_t *err)
{
    if (!c || !g)
        return w16_err(err, WNA16_EINVAL, "w16_cuda_graph_launch: target and "
                       "graph are required");
    wna16_status_t st = bind(c, err);
    if (st != WNA16_OK)
        return st;
    CUresult r = c->cu.cuGraphLaunch(g->exec, cu_stream(s));
    if (r != CUDA_SUCCESS)
        return cu_fail(c, err, WNA16_EINTERNAL, r, "launching a graph");
    return WNA16_OK;
}

void w16_cuda_graph_destroy(w16_cuda_t *c, w16_cuda_graph_t *g)
{
    if (!c || !g)
        return;
    if (bind(c, NULL) == WNA16_OK) {
        cu_warn(c, c->cu.cuGraphExecDestroy(g->exec), "destroying a graph");
        cu_warn(c, c->cu.cuGraphDestroy(g->graph), "destroying a graph");
    }
    w16_free(c->ctx, g, sizeof *g);
}

#else /* no CUDA headers: every entry point reports the target unavailable */

#define W16_NO_CUDA "CUDA target unavailable: built without CUDA headers"

struct w16_cuda {
    int unused;
};

static wna16_status_t no_cuda(wna16_error_t *err)
{
    return w16_err(err, WNA16_EUNAVAILABLE, W16_NO_CUDA);
}

wna16_status_t w16_nvrtc_compile(wna16_context_t *ctx, const char *source,
                                 const char *kernel_name, int cc_major,
                                 int cc_minor, w16_cuda_image_t *out,
                                 wna16_error_t *err)
{
    (void)ctx; (void)source; (void)kernel_name; (void)cc_major; (void)cc_minor;
    if (out)
        memset(out, 0, sizeof *out);
    return no_cuda(err);
}
wna16_status_t w16_nvrtc_compile_unit(wna16_context_t *ctx,
                                      const char *source,
                                      const char *kernel_name, int n_kernels,
                                      int cc_major, int cc_minor,
                                      w16_cuda_image_t *out,
                                      wna16_error_t *err)
{
    (void)n_kernels;
    return w16_nvrtc_compile(ctx, source, kernel_name, cc_major, cc_minor, out,
                             err);
}
bool w16_nvrtc_available(wna16_context_t *ctx, wna16_error_t *err)
{
    (void)ctx;
    no_cuda(err);
    return false;
}
const char *w16_nvrtc_version(void) { return "none"; }
const char *w16_nvrtc_include_dir(void) { return ""; }

wna16_status_t w16_cuda_get(wna16_context_t *ctx, w16_cuda_t **out,
                            wna16_error_t *err)
{
    (void)ctx;
    if (out)
        *out = NULL;
    return no_cuda(err);
}
void w16_cuda_destroy(w16_cuda_t *c) { (void)c; }
int w16_cuda_cc_major(const w16_cuda_t *c) { (void)c; return 0; }
int w16_cuda_cc_minor(const w16_cuda_t *c) { (void)c; return 0; }
const char *w16_cuda_device_name(const w16_cuda_t *c) { (void)c; return ""; }
const char *w16_cuda_driver_version(const w16_cuda_t *c) { (void)c; return ""; }
int w16_cuda_sm_count(const w16_cuda_t *c) { (void)c; return 0; }
size_t w16_cuda_max_shared(const w16_cuda_t *c) { (void)c; return 0; }

wna16_status_t w16_cuda_module_load(w16_cuda_t *c, const w16_cuda_image_t *img,
                                    w16_cuda_module_t **out,
                                    wna16_error_t *err)
{
    (void)c; (void)img;
    if (out)
        *out = NULL;
    return no_cuda(err);
}
bool w16_cuda_module_from_ptx(const w16_cuda_module_t *m) { (void)m; return false; }
void w16_cuda_module_unload(w16_cuda_module_t *m) { (void)m; }
wna16_status_t w16_cuda_function(w16_cuda_module_t *m, const char *name,
                                 w16_cuda_function_t **fn, wna16_error_t *err)
{
    (void)m; (void)name;
    if (fn)
        *fn = NULL;
    return no_cuda(err);
}
wna16_status_t w16_cuda_launch(w16_cuda_t *c, w16_cuda_function_t *fn,
                               unsigned gx, unsigned bx, unsigned sh,
                               w16_cuda_stream_t *s, void **args,
                               wna16_error_t *err)
{
    (void)c; (void)fn; (void)gx; (void)bx; (void)sh; (void)s; (void)args;
    return no_cuda(err);
}
wna16_status_t w16_cuda_launch_chained(w16_cuda_t *c, w16_cuda_function_t *fn,
                                       unsigned gx, unsigned bx, unsigned sh,
                                       w16_cuda_stream_t *s, void **args,
                                       wna16_error_t *err)
{
    (void)c; (void)fn; (void)gx; (void)bx; (void)sh; (void)s; (void)args;
    return no_cuda(err);
}
bool w16_cuda_chained_overlaps(w16_cuda_t *c) { (void)c; return false; }
wna16_status_t w16_cuda_alloc(w16_cuda_t *c, size_t bytes, uint64_t *dptr,
                              wna16_error_t *err)
{
    (void)c; (void)bytes;
    if (dptr)
        *dptr = 0;
    return no_cuda(err);
}
void w16_cuda_free(w16_cuda_t *c, uint64_t dptr) { (void)c; (void)dptr; }
wna16_status_t w16_cuda_memset(w16_cuda_t *c, uint64_t d, uint8_t v, size_t n,
                               wna16_error_t *err)
{
    (void)c; (void)d; (void)v; (void)n;
    return no_cuda(err);
}
wna16_status_t w16_cuda_memset_async(w16_cuda_t *c, uint64_t d, uint8_t v,
                                     size_t n, w16_cuda_stream_t *s,
                                     wna16_error_t *err)
{
    (void)c; (void)d; (void)v; (void)n; (void)s;
    return no_cuda(err);
}
wna16_status_t w16_cuda_copy_h2d(w16_cuda_t *c, uint64_t d, const void *s,
                                 size_t n, wna16_error_t *err)
{
    (void)c; (void)d; (void)s; (void)n;
    return no_cuda(err);
}
wna16_status_t w16_cuda_copy_d2h(w16_cuda_t *c, void *d, uint64_t s, size_t n,
                                 wna16_error_t *err)
{
    (void)c; (void)d; (void)s; (void)n;
    return no_cuda(err);
}
wna16_status_t w16_cuda_copy_d2d(w16_cuda_t *c, uint64_t d, uint64_t s,
                                 size_t n, wna16_error_t *err)
{
    (void)c; (void)d; (void)s; (void)n;
    return no_cuda(err);
}
wna16_status_t w16_cuda_copy_h2d_async(w16_cuda_t *c, uint64_t d,
                                       const void *s, size_t n,
                                       w16_cuda_stream_t *st,
                                       wna16_error_t *err)
{
    (void)c; (void)d; (void)s; (void)n; (void)st;
    return no_cuda(err);
}
wna16_status_t w16_cuda_copy_d2h_async(w16_cuda_t *c, void *d, uint64_t s,
                                       size_t n, w16_cuda_stream_t *st,
                                       wna16_error_t *err)
{
    (void)c; (void)d; (void)s; (void)n; (void)st;
    return no_cuda(err);
}
wna16_status_t w16_cuda_host_alloc(w16_cuda_t *c, size_t n, void **out,
                                   wna16_error_t *err)
{
    (void)c; (void)n;
    if (out)
        *out = NULL;
    return no_cuda(err);
}
void w16_cuda_host_free(w16_cuda_t *c, void *p) { (void)c; (void)p; }
wna16_status_t w16_cuda_stream_create(w16_cuda_t *c, w16_cuda_stream_t **out,
                                      wna16_error_t *err)
{
    (void)c;
    if (out)
        *out = NULL;
    return no_cuda(err);
}
void w16_cuda_stream_destroy(w16_cuda_t *c, w16_cuda_stream_t *s)
{
    (void)c; (void)s;
}
wna16_status_t w16_cuda_stream_sync(w16_cuda_t *c, w16_cuda_stream_t *s,
                                    wna16_error_t *err)
{
    (void)c; (void)s;
    return no_cuda(err);
}
wna16_status_t w16_cuda_event_create(w16_cuda_t *c, w16_cuda_event_t **out,
                                     wna16_error_t *err)
{
    (void)c;
    if (out)
        *out = NULL;
    return no_cuda(err);
}
void w16_cuda_event_destroy(w16_cuda_t *c, w16_cuda_event_t *e)
{
    (void)c; (void)e;
}
wna16_status_t w16_cuda_event_record(w16_cuda_t *c, w16_cuda_event_t *e,
                                     w16_cuda_stream_t *s, wna16_error_t *err)
{
    (void)c; (void)e; (void)s;
    return no_cuda(err);
}
wna16_status_t w16_cuda_stream_wait_event(w16_cuda_t *c,
                                          w16_cuda_stream_t *s,
                                          w16_cuda_event_t *e,
                                          wna16_error_t *err)
{
    (void)c; (void)s; (void)e;
    return no_cuda(err);
}
wna16_status_t w16_cuda_event_sync(w16_cuda_t *c, w16_cuda_event_t *e,
                                   wna16_error_t *err)
{
    (void)c; (void)e;
    return no_cuda(err);
}
wna16_status_t w16_cuda_event_elapsed_ms(w16_cuda_t *c, w16_cuda_event_t *a,
                                         w16_cuda_event_t *b, float *ms,
                                         wna16_error_t *err)
{
    (void)c; (void)a; (void)b;
    if (ms)
        *ms = 0.0f;
    return no_cuda(err);
}

wna16_status_t w16_cuda_stream_create_async(w16_cuda_t *c,
                                            w16_cuda_stream_t **out,
                                            wna16_error_t *err)
{
    (void)c;
    if (out)
        *out = NULL;
    return no_cuda(err);
}
wna16_status_t w16_cuda_capture_begin(w16_cuda_t *c, w16_cuda_stream_t *s,
                                      wna16_error_t *err)
{
    (void)c; (void)s;
    return no_cuda(err);
}
wna16_status_t w16_cuda_capture_end(w16_cuda_t *c, w16_cuda_stream_t *s,
                                    w16_cuda_graph_t **out, wna16_error_t *err)
{
    (void)c; (void)s;
    if (out)
        *out = NULL;
    return no_cuda(err);
}
wna16_status_t w16_cuda_graph_launch(w16_cuda_t *c, w16_cuda_graph_t *g,
                                     w16_cuda_stream_t *s, wna16_error_t *err)
{
    (void)c; (void)g; (void)s;
    return no_cuda(err);
}
void w16_cuda_graph_destroy(w16_cuda_t *c, w16_cuda_graph_t *g)
{
    (void)c; (void)g;
}

#endif
