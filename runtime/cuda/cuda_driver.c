/*
 * cuda_driver.c - the CUDA target's device half (see cuda.h): the CUDA
 * driver opened with dlopen and bound with dlsym, never linked (a binary
 * linked with -lcuda does not even start on a machine without the driver,
 * and the toolkit's stub libcuda.so only answers CUDA_ERROR_STUB_LIBRARY).
 * <cuda.h> is used for its types and enum values only, and every function
 * pointer takes its type from the header's own declaration (__typeof__).
 * Driver symbols are looked up by their versioned names (cuMemAlloc_v2,
 * ...): the unversioned exports are the old 32-bit-size ABI kept for old
 * binaries, and calling them through a new prototype corrupts arguments.
 * The driver state is per wna16 context (w16_cuda_t): the device, its
 * primary context, modules, launches, memory, streams, events and graphs.
 */
#define _GNU_SOURCE
#include "runtime/cuda/cuda.h"

/* Legacy default-stream semantics: the plain symbol names below. */
#undef CUDA_API_PER_THREAD_DEFAULT_STREAM
#include <cuda.h>

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
    int cc_major, cc_minor, sm_count, l2_bytes;
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
        st = read_attribute(c, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
                            "L2 cache size", &c->l2_bytes, err);
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
size_t w16_cuda_l2_bytes(const w16_cuda_t *c)
{
    return c && c->l2_bytes > 0 ? (size_t)c->l2_bytes : 0;
}
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
