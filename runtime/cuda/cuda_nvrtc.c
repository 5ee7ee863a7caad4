/*
 * cuda_nvrtc.c - the CUDA target's compiler half (see cuda.h): NVRTC opened
 * with dlopen and bound with dlsym, never linked, so the library runs where
 * the toolkit is absent and compiles where the driver is (CI compiles every
 * generated kernel on machines without a GPU). <nvrtc.h> is used for its
 * types and enum values only, and every function pointer takes its type
 * from the header's own declaration (__typeof__), so a wrong hand-written
 * prototype cannot creep in. NVRTC's state is process-wide: loaded once,
 * never unloaded.
 */
#define _GNU_SOURCE
#include "runtime/cuda/cuda.h"

#include <nvrtc.h>

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void w16_cuda_image_free(w16_cuda_image_t *img)
{
    if (!img)
        return;
    free(img->cubin);
    free(img->ptx);
    free(img->log);
    memset(img, 0, sizeof *img);
}

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
                                         bool ptx_only, w16_cuda_image_t *out,
                                         wna16_error_t *err)
{
    size_t n = 0;
    if (ptx_only) /* -arch=compute_XX: NVRTC says success with size 0 */
        goto ptx;
    if (nv.api.nvrtcGetCUBINSize(prog, &n) != NVRTC_SUCCESS || n == 0)
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: NVRTC produced no "
                       "CUBIN for sm_%d", kernel, arch);
    if (!(out->cubin = malloc(n)))
        return w16_err_nomem(err, "copying a CUBIN");
    out->cubin_size = n;
    if (nv.api.nvrtcGetCUBIN(prog, out->cubin) != NVRTC_SUCCESS)
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: nvrtcGetCUBIN failed",
                       kernel);
ptx:
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

/* Compiles for `arch_opt` ("-arch=sm_90a", "-arch=compute_80"); cc is the
 * compute capability it names, ptx_only for compute_XX. */
static wna16_status_t compile_for(wna16_context_t *ctx, const char *source,
                                  const char *kernel_name, int n_kernels,
                                  int cc_major, int cc_minor,
                                  const char *arch_opt, bool ptx_only,
                                  w16_cuda_image_t *out, wna16_error_t *err)
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
    char unit[300], inc_opt[PATH_MAX + 32];
    snprintf(unit, sizeof unit, "%s.cu", kernel_name);
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
        st = nvrtc_take_outputs(prog, kernel_name, arch, ptx_only, out, err);
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

wna16_status_t w16_nvrtc_compile_unit(wna16_context_t *ctx,
                                      const char *source,
                                      const char *kernel_name, int n_kernels,
                                      int cc_major, int cc_minor,
                                      w16_cuda_image_t *out,
                                      wna16_error_t *err)
{
    int arch = cc_major * 10 + cc_minor;
    char arch_opt[32];
    /* sm_90 compiles as sm_90a: the fused MoE's wgmma kernels need the
     * arch-specific instructions, and a CUBIN for sm_90a runs on exactly
     * the devices an sm_90 one does (compute capability 9.0) */
    snprintf(arch_opt, sizeof arch_opt, "-arch=sm_%d%s", arch,
             arch == 90 ? "a" : "");
    return compile_for(ctx, source, kernel_name, n_kernels, cc_major,
                       cc_minor, arch_opt, false, out, err);
}

wna16_status_t w16_nvrtc_compile_arch(wna16_context_t *ctx,
                                      const char *source,
                                      const char *kernel_name,
                                      const char *arch, w16_cuda_image_t *out,
                                      wna16_error_t *err)
{
    int cc = 0;
    bool ptx = false;
    char suffix[4] = "";
    if (arch && (sscanf(arch, "sm_%d%3s", &cc, suffix) >= 1 ||
                 (ptx = sscanf(arch, "compute_%d%3s", &cc, suffix) >= 1)) &&
        cc >= 10 && cc <= 999 && (!suffix[0] || strcmp(suffix, "a") == 0)) {
        char arch_opt[40];
        snprintf(arch_opt, sizeof arch_opt, "-arch=%s", arch);
        return compile_for(ctx, source, kernel_name, 1, cc / 10, cc % 10,
                           arch_opt, ptx, out, err);
    }
    if (out)
        memset(out, 0, sizeof *out);
    return w16_err(err, WNA16_EINVAL, "kernel %s: '%s' is not a CUDA "
                   "architecture (sm_XY, sm_XYa for a CUBIN, compute_XY for "
                   "PTX)", kernel_name ? kernel_name : "", arch ? arch : "");
}
