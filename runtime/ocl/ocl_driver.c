/*
 * ocl_driver.c - OpenCL for the ocl target (see ocl.h): the ICD loader
 * opened with dlopen and bound with dlsym, each pointer typed from the
 * header's own declaration (__typeof__, as runtime/ze/ze_driver.c); the
 * SPIR-V reverse-translated by a spawned llvm-spirv-15 in a private
 * temporary directory; programs built from the SPIR 1.2 bitcode.
 *
 * Discovery takes the first device, over every platform, with OpenCL 2.0
 * whose kernels address this process's memory: fine-grained system SVM,
 * or a CPU device with fine-grained buffer SVM (PoCL's CPU device: its
 * kernels run on threads of this process, its SVM allocations are plain
 * host memory, yet it does not claim system SVM). Kernels then take host
 * addresses as they are (clSetKernelArgSVMPointer), tables of host
 * addresses included (CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM), which is
 * what the target's host_memory promises. A device without either is
 * named in the reason (a GPU would need streams that copy: not yet).
 * Launches go through one in-order queue and clFinish under a mutex (a
 * kernel object's arguments are shared state).
 */
#define _GNU_SOURCE
#define CL_TARGET_OPENCL_VERSION 200
#include "runtime/ocl/ocl.h"

#include <CL/cl.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* Options of every build: SPIR 1.2 bitcode in; divisions and square roots
 * correctly rounded, as the reference computes them. */
#define BUILD_OPTIONS                                                        \
    "-x spir -spir-std=1.2 -cl-fp32-correctly-rounded-divide-sqrt"

#define CL_FUNCS(X)                                                          \
    X(clGetPlatformIDs)                                                      \
    X(clGetPlatformInfo)                                                     \
    X(clGetDeviceIDs)                                                        \
    X(clGetDeviceInfo)                                                       \
    X(clCreateContext)                                                       \
    X(clReleaseContext)                                                      \
    X(clCreateCommandQueueWithProperties)                                    \
    X(clReleaseCommandQueue)                                                 \
    X(clCreateProgramWithBinary)                                             \
    X(clBuildProgram)                                                        \
    X(clGetProgramBuildInfo)                                                 \
    X(clReleaseProgram)                                                      \
    X(clCreateKernel)                                                        \
    X(clReleaseKernel)                                                       \
    X(clSetKernelArg)                                                        \
    X(clSetKernelArgSVMPointer)                                              \
    X(clSetKernelExecInfo)                                                   \
    X(clEnqueueNDRangeKernel)                                                \
    X(clFinish)

typedef struct cl_api {
#define W16_X_(name) __typeof__(name) *name;
    CL_FUNCS(W16_X_)
#undef W16_X_
} cl_api_t;

enum { MAX_ARGS = 32 };

struct w16_ocl {
    wna16_context_t *ctx;
    void *lib;
    cl_api_t c;
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    pthread_mutex_t mu; /* the queue and kernel arguments, one user at a time */
    const char *translator; /* the llvm-spirv binary */
    int units;
    char name[256];
    char versions[512];
};

struct w16_ocl_kernel {
    w16_ocl_t *ocl;
    cl_program program;
    cl_kernel kernel;
    int n_args;
    uint8_t kind[MAX_ARGS];
};

static const char *cl_resolve(void *lib, cl_api_t *c)
{
#define W16_X_(name)                                                         \
    if (!(c->name = (__typeof__(c->name))(uintptr_t)dlsym(lib, #name)))      \
        return #name;
    CL_FUNCS(W16_X_)
#undef W16_X_
    return NULL;
}

/* ---- spawning the translator ---------------------------------------------- */

/* Runs argv with stdout and stderr into `log` (a file path); *code is its
 * exit status, or -1 when it died of a signal. */
static wna16_status_t spawn_wait(char *const argv[], const char *log,
                                 int *code, wna16_error_t *err)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC,
                                     0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        return w16_err(err, WNA16_EUNAVAILABLE, "cannot run %s: %s", argv[0],
                       strerror(rc));
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return w16_err(err, WNA16_EIO, "waiting for %s: %s", argv[0],
                           strerror(errno));
    *code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return WNA16_OK;
}

/* The whole file at path, malloc'd (NUL-terminated past *size). */
static void *slurp(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *p = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 4096) {
            char *q = realloc(p, cap = cap ? 2 * cap : 65536);
            if (!q) {
                free(p);
                fclose(f);
                return NULL;
            }
            p = q;
        }
        size_t r = fread(p + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    p[n] = 0;
    *size = n;
    return p;
}

/* The last line of a tool's output that says something (for errors). */
static void tail_of(const char *text, char *out, size_t n)
{
    size_t len = strlen(text);
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' '))
        len--;
    size_t b = len > n - 1 ? len - (n - 1) : 0;
    snprintf(out, n, "%.*s", (int)(len - b), text + b);
    for (char *c = out; *c; c++)
        if (*c == '\n')
            *c = ' ';
}

typedef struct scratch_dir {
    char dir[256], in[300], out[300], log[300];
} scratch_dir_t;

static wna16_status_t scratch_open(scratch_dir_t *d, wna16_error_t *err)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(d->dir, sizeof d->dir, "%s/wna16-ocl-XXXXXX",
             tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(d->dir))
        return w16_err(err, WNA16_EIO, "cannot create a temporary directory "
                       "%s for llvm-spirv: %s", d->dir, strerror(errno));
    snprintf(d->in, sizeof d->in, "%s/k.spv", d->dir);
    snprintf(d->out, sizeof d->out, "%s/k.bc", d->dir);
    snprintf(d->log, sizeof d->log, "%s/log", d->dir);
    return WNA16_OK;
}

static void scratch_close(scratch_dir_t *d)
{
    unlink(d->in);
    unlink(d->out);
    unlink(d->log);
    rmdir(d->dir);
}

/* The translator's version line, or the reason it cannot run. */
static wna16_status_t translator_version(const char *bin, char *out, size_t n,
                                         wna16_error_t *err)
{
    scratch_dir_t d;
    wna16_status_t st = scratch_open(&d, err);
    if (st != WNA16_OK)
        return st;
    char *argv[] = {(char *)bin, "--version", NULL};
    int code = 0;
    st = spawn_wait(argv, d.log, &code, err);
    size_t sz = 0;
    char *text = st == WNA16_OK ? slurp(d.log, &sz) : NULL;
    if (st == WNA16_OK && (code != 0 || !text))
        st = w16_err(err, WNA16_EUNAVAILABLE, "%s --version failed (exit %d)",
                     bin, code);
    if (st == WNA16_OK) {
        const char *line = strstr(text, "LLVM version");
        line = line ? line : text;
        snprintf(out, n, "%s %.*s", bin, (int)strcspn(line, "\n"), line);
    }
    free(text);
    scratch_close(&d);
    return st;
}

wna16_status_t w16_ocl_translate(w16_ocl_t *c, const uint32_t *words,
                                 size_t n_words, const char *name, void **bc,
                                 size_t *bc_size, wna16_error_t *err)
{
    *bc = NULL;
    scratch_dir_t d;
    wna16_status_t st = scratch_open(&d, err);
    if (st != WNA16_OK)
        return st;
    FILE *f = fopen(d.in, "wb");
    if (!f || fwrite(words, 4, n_words, f) != n_words || fclose(f) != 0) {
        st = w16_err(err, WNA16_EIO, "kernel %s: cannot write %s: %s", name,
                     d.in, strerror(errno));
        f = NULL;
    }
    char *argv[] = {(char *)c->translator, "-r", "--spirv-target-env=CL1.2",
                    d.in, "-o", d.out, NULL};
    int code = 0;
    if (st == WNA16_OK)
        st = spawn_wait(argv, d.log, &code, err);
    if (st == WNA16_OK && code != 0) {
        size_t sz = 0;
        char *text = slurp(d.log, &sz), last[400] = "";
        tail_of(text ? text : "", last, sizeof last);
        free(text);
        st = w16_err(err, WNA16_EINTERNAL, "kernel %s: %s -r failed (exit "
                     "%d): %s", name, c->translator, code,
                     last[0] ? last : "(no output)");
    }
    if (st == WNA16_OK && !(*bc = slurp(d.out, bc_size)))
        st = w16_err(err, WNA16_EIO, "kernel %s: %s wrote no bitcode to %s",
                     name, c->translator, d.out);
    scratch_close(&d);
    return st;
}

/* ---- discovery ------------------------------------------------------------ */

static void device_str(w16_ocl_t *c, cl_device_id d, cl_device_info what,
                       char *out, size_t n)
{
    out[0] = 0;
    if (c->c.clGetDeviceInfo(d, what, n, out, NULL) != CL_SUCCESS)
        out[0] = 0;
    out[n - 1] = 0;
}

/* The first device with OpenCL 2.0+ and fine-grained system SVM; `why`
 * collects the devices passed over. */
static wna16_status_t find_device(w16_ocl_t *c, wna16_error_t *err)
{
    cl_uint np = 0;
    cl_int r = c->c.clGetPlatformIDs(0, NULL, &np);
    if (r != CL_SUCCESS || np == 0)
        return w16_err(err, WNA16_EUNAVAILABLE, "ocl target unavailable: no "
                       "OpenCL platform (clGetPlatformIDs: %d; install "
                       "pocl-opencl-icd, or check OCL_ICD_VENDORS)", (int)r);
    cl_platform_id plats[8];
    np = np > 8 ? 8 : np;
    if (c->c.clGetPlatformIDs(np, plats, NULL) != CL_SUCCESS)
        return w16_err(err, WNA16_EUNAVAILABLE, "ocl target unavailable: "
                       "clGetPlatformIDs failed");
    char why[600] = "";
    for (cl_uint p = 0; p < np; p++) {
        cl_uint nd = 0;
        cl_device_id devs[16];
        if (c->c.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 16, devs, &nd) !=
            CL_SUCCESS)
            continue;
        for (cl_uint v = 0; v < nd && v < 16; v++) {
            char name[256], version[128];
            device_str(c, devs[v], CL_DEVICE_NAME, name, sizeof name);
            device_str(c, devs[v], CL_DEVICE_VERSION, version, sizeof version);
            int major = 0;
            sscanf(version, "OpenCL %d", &major);
            cl_device_svm_capabilities svm = 0;
            if (major < 2 ||
                c->c.clGetDeviceInfo(devs[v], CL_DEVICE_SVM_CAPABILITIES,
                                     sizeof svm, &svm, NULL) != CL_SUCCESS)
                svm = 0;
            cl_device_type type = 0;
            c->c.clGetDeviceInfo(devs[v], CL_DEVICE_TYPE, sizeof type, &type,
                                 NULL);
            bool system = svm & CL_DEVICE_SVM_FINE_GRAIN_SYSTEM;
            bool in_process = (type & CL_DEVICE_TYPE_CPU) &&
                              (svm & CL_DEVICE_SVM_FINE_GRAIN_BUFFER);
            if (system || in_process) {
                char pname[128], pversion[128], driver[128];
                c->c.clGetPlatformInfo(plats[p], CL_PLATFORM_NAME,
                                       sizeof pname, pname, NULL);
                pname[sizeof pname - 1] = 0;
                c->c.clGetPlatformInfo(plats[p], CL_PLATFORM_VERSION,
                                       sizeof pversion, pversion, NULL);
                pversion[sizeof pversion - 1] = 0;
                device_str(c, devs[v], CL_DRIVER_VERSION, driver,
                           sizeof driver);
                cl_uint units = 0;
                c->c.clGetDeviceInfo(devs[v], CL_DEVICE_MAX_COMPUTE_UNITS,
                                     sizeof units, &units, NULL);
                c->platform = plats[p];
                c->device = devs[v];
                c->units = (int)units;
                snprintf(c->name, sizeof c->name, "%s", name);
                snprintf(c->versions, sizeof c->versions, "%s, %s, driver %s",
                         pname, pversion, driver);
                return WNA16_OK;
            }
            size_t n = strlen(why);
            snprintf(why + n, sizeof why - n, "%s%s (%s: %s)", n ? "; " : "",
                     name, version, major < 2 ? "OpenCL 2.0 needed"
                                              : "no fine-grained system SVM, "
                                                "not a CPU device");
        }
    }
    return w16_err(err, WNA16_EUNAVAILABLE, "ocl target unavailable: no "
                   "OpenCL device whose kernels can address host memory "
                   "(fine-grained system SVM, or a CPU device with "
                   "fine-grained buffer SVM)%s%s", why[0] ? ": " : "", why);
}

static wna16_status_t ocl_create(wna16_context_t *ctx, w16_ocl_t **out,
                                 wna16_error_t *err)
{
    void *lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return w16_err(err, WNA16_EUNAVAILABLE, "ocl target unavailable: %s "
                       "(install ocl-icd-libopencl1 and an OpenCL driver: "
                       "pocl-opencl-icd)", dlerror());
    w16_ocl_t *c = w16_calloc(ctx, 1, sizeof *c);
    if (!c) {
        dlclose(lib);
        return w16_err_nomem(err, "creating the ocl target");
    }
    c->ctx = ctx;
    c->lib = lib;
    pthread_mutex_init(&c->mu, NULL);
    const char *bin = getenv("WNA16_LLVM_SPIRV");
    c->translator = bin && *bin ? bin : "llvm-spirv-15";
    const char *missing = cl_resolve(lib, &c->c);
    char tv[200] = "";
    wna16_status_t st = WNA16_OK;
    if (missing)
        st = w16_err(err, WNA16_EUNAVAILABLE, "ocl target unavailable: "
                     "libOpenCL.so.1 has no %s (an OpenCL 2.0 loader is "
                     "needed)", missing);
    else if ((st = translator_version(c->translator, tv, sizeof tv, err)) !=
             WNA16_OK) {
        char why[300];
        snprintf(why, sizeof why, "%s", err->message);
        st = w16_err(err, WNA16_EUNAVAILABLE, "ocl target unavailable: the "
                     "SPIR-V translator: %s (install llvm-spirv-15, or set "
                     "WNA16_LLVM_SPIRV)", why);
    } else
        st = find_device(c, err);
    cl_int r = CL_SUCCESS;
    if (st == WNA16_OK) {
        cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                         (cl_context_properties)c->platform,
                                         0};
        c->context = c->c.clCreateContext(props, 1, &c->device, NULL, NULL, &r);
        if (!c->context)
            st = w16_err(err, WNA16_EUNAVAILABLE, "ocl target unavailable: "
                         "clCreateContext on %s failed (%d)", c->name, (int)r);
    }
    if (st == WNA16_OK) {
        c->queue = c->c.clCreateCommandQueueWithProperties(c->context,
                                                           c->device, NULL, &r);
        if (!c->queue)
            st = w16_err(err, WNA16_EUNAVAILABLE, "ocl target unavailable: "
                         "clCreateCommandQueueWithProperties failed (%d)",
                         (int)r);
    }
    if (st != WNA16_OK) {
        w16_ocl_destroy(c);
        return st;
    }
    size_t n = strlen(c->versions);
    snprintf(c->versions + n, sizeof c->versions - n, "; %s", tv);
    *out = c;
    return WNA16_OK;
}

static pthread_mutex_t get_mu = PTHREAD_MUTEX_INITIALIZER;

wna16_status_t w16_ocl_get(wna16_context_t *ctx, w16_ocl_t **out,
                           wna16_error_t *err)
{
    pthread_mutex_lock(&get_mu);
    wna16_status_t st = WNA16_OK;
    w16_ocl_t *c = ctx->targets[WNA16_TARGET_OCL];
    if (!c && (st = ocl_create(ctx, &c, err)) == WNA16_OK)
        ctx->targets[WNA16_TARGET_OCL] = c;
    pthread_mutex_unlock(&get_mu);
    *out = st == WNA16_OK ? c : NULL;
    return st;
}

/* The ICD loader stays mapped: drivers (PoCL's worker threads, LLVM's
 * static state) are not made to be unloaded while a process runs. */
void w16_ocl_destroy(w16_ocl_t *c)
{
    if (!c)
        return;
    if (c->queue)
        c->c.clReleaseCommandQueue(c->queue);
    if (c->context)
        c->c.clReleaseContext(c->context);
    pthread_mutex_destroy(&c->mu);
    w16_free(c->ctx, c, sizeof *c);
}

const char *w16_ocl_device_name(const w16_ocl_t *c) { return c ? c->name : ""; }
const char *w16_ocl_versions(const w16_ocl_t *c) { return c ? c->versions : ""; }
int w16_ocl_units(const w16_ocl_t *c) { return c ? c->units : 0; }

/* ---- programs and kernels ------------------------------------------------- */

wna16_status_t w16_ocl_kernel_load(w16_ocl_t *c, const void *bc,
                                   size_t bc_size, const char *name,
                                   const uint8_t *kinds, int n_args,
                                   w16_ocl_kernel_t **out, wna16_error_t *err)
{
    if (n_args < 0 || n_args > MAX_ARGS)
        return w16_err(err, WNA16_ELIMIT, "kernel %s: %d parameters (at most "
                       "%d on the ocl target)", name, n_args, MAX_ARGS);
    w16_ocl_kernel_t *k = calloc(1, sizeof *k);
    if (!k)
        return w16_err_nomem(err, "loading an ocl kernel");
    k->ocl = c;
    k->n_args = n_args;
    memcpy(k->kind, kinds, (size_t)n_args);
    const unsigned char *bin = bc;
    cl_int r = CL_SUCCESS, status = CL_SUCCESS;
    k->program = c->c.clCreateProgramWithBinary(c->context, 1, &c->device,
                                                &bc_size, &bin, &status, &r);
    if (!k->program) {
        free(k);
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: "
                       "clCreateProgramWithBinary failed (%d, binary status "
                       "%d)", name, (int)r, (int)status);
    }
    r = c->c.clBuildProgram(k->program, 1, &c->device, BUILD_OPTIONS, NULL,
                            NULL);
    if (r != CL_SUCCESS) {
        char log[2048] = "", last[600];
        c->c.clGetProgramBuildInfo(k->program, c->device, CL_PROGRAM_BUILD_LOG,
                                   sizeof log, log, NULL);
        log[sizeof log - 1] = 0;
        tail_of(log, last, sizeof last);
        c->c.clReleaseProgram(k->program);
        free(k);
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: clBuildProgram "
                       "failed (%d): %s", name, (int)r,
                       last[0] ? last : "(no build log)");
    }
    k->kernel = c->c.clCreateKernel(k->program, name, &r);
    if (!k->kernel) {
        c->c.clReleaseProgram(k->program);
        free(k);
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: clCreateKernel "
                       "failed (%d)", name, (int)r);
    }
    /* tables of host addresses are read through them */
    cl_bool yes = CL_TRUE;
    c->c.clSetKernelExecInfo(k->kernel, CL_KERNEL_EXEC_INFO_SVM_FINE_GRAIN_SYSTEM,
                             sizeof yes, &yes);
    *out = k;
    return WNA16_OK;
}

void w16_ocl_kernel_free(w16_ocl_kernel_t *k)
{
    if (!k)
        return;
    k->ocl->c.clReleaseKernel(k->kernel);
    k->ocl->c.clReleaseProgram(k->program);
    free(k);
}

wna16_status_t w16_ocl_launch(w16_ocl_t *c, w16_ocl_kernel_t *k,
                              const uint64_t *args, int n_args, int64_t groups,
                              int lanes, wna16_error_t *err)
{
    if (n_args != k->n_args)
        return w16_err(err, WNA16_EINTERNAL, "ocl launch: %d arguments for %d "
                       "parameters", n_args, k->n_args);
    if (groups <= 0)
        return WNA16_OK;
    size_t local = (size_t)lanes, global = (size_t)groups * local;
    pthread_mutex_lock(&c->mu);
    cl_int r = CL_SUCCESS;
    const char *what = "clSetKernelArg";
    for (int i = 0; r == CL_SUCCESS && i < n_args; i++)
        r = k->kind[i] == W16_OCL_ARG_POINTER
                ? c->c.clSetKernelArgSVMPointer(k->kernel, (cl_uint)i,
                                                (void *)(uintptr_t)args[i])
                : c->c.clSetKernelArg(k->kernel, (cl_uint)i, k->kind[i],
                                      &args[i]);
    if (r == CL_SUCCESS) {
        what = "clEnqueueNDRangeKernel";
        r = c->c.clEnqueueNDRangeKernel(c->queue, k->kernel, 1, NULL, &global,
                                        &local, 0, NULL, NULL);
    }
    if (r == CL_SUCCESS) {
        what = "clFinish";
        r = c->c.clFinish(c->queue);
    }
    pthread_mutex_unlock(&c->mu);
    return r == CL_SUCCESS
               ? WNA16_OK
               : w16_err(err, WNA16_EINTERNAL, "ocl launch of %lld x %d: %s "
                         "failed (%d)", (long long)groups, lanes, what, (int)r);
}
