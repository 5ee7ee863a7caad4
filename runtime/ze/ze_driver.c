/*
 * ze_driver.c - Level Zero for the XPU target (see ze.h): the loader
 * opened with dlopen and bound with dlsym; every function pointer takes
 * its type from the header's own declaration (__typeof__), so a wrong
 * hand-written prototype cannot creep in. Discovery takes the first driver
 * with a GPU device; work goes through one immediate command list in
 * synchronous mode (each append returns when the device is done), which
 * keeps the streams of ze_desc.c simple and correct; overlapping copies
 * with kernels is left to when an Intel GPU is at hand to measure it.
 */
#define _GNU_SOURCE
#include "runtime/ze/ze.h"

#include <level_zero/ze_api.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZE_FUNCS(X)                                                          \
    X(zeInit)                                                                \
    X(zeDriverGet)                                                           \
    X(zeDriverGetApiVersion)                                                 \
    X(zeDriverGetProperties)                                                 \
    X(zeDeviceGet)                                                           \
    X(zeDeviceGetProperties)                                                 \
    X(zeContextCreate)                                                       \
    X(zeContextDestroy)                                                      \
    X(zeCommandListCreateImmediate)                                          \
    X(zeCommandListDestroy)                                                  \
    X(zeCommandListAppendMemoryCopy)                                         \
    X(zeCommandListAppendLaunchKernel)                                       \
    X(zeMemAllocDevice)                                                      \
    X(zeMemFree)                                                             \
    X(zeModuleCreate)                                                        \
    X(zeModuleDestroy)                                                       \
    X(zeModuleBuildLogGetString)                                             \
    X(zeModuleBuildLogDestroy)                                               \
    X(zeKernelCreate)                                                        \
    X(zeKernelDestroy)                                                       \
    X(zeKernelSetGroupSize)                                                  \
    X(zeKernelSetArgumentValue)

typedef struct ze_api {
#define W16_X_(name) __typeof__(name) *name;
    ZE_FUNCS(W16_X_)
#undef W16_X_
} ze_api_t;

struct w16_ze {
    wna16_context_t *ctx;
    void *lib;
    ze_api_t z;
    ze_driver_handle_t driver;
    ze_device_handle_t device;
    ze_context_handle_t context;
    ze_command_list_handle_t list; /* immediate, synchronous */
    pthread_mutex_t mu;            /* the command list, one user at a time */
    char name[ZE_MAX_DEVICE_NAME];
    char driver_version[96];
};

struct w16_ze_kernel {
    w16_ze_t *ze;
    ze_module_handle_t module;
    ze_kernel_handle_t kernel;
};

static const char *ze_resolve(void *lib, ze_api_t *z)
{
#define W16_X_(name)                                                         \
    if (!(z->name = (__typeof__(z->name))(uintptr_t)dlsym(lib, #name)))      \
        return #name;
    ZE_FUNCS(W16_X_)
#undef W16_X_
    return NULL;
}

static wna16_status_t ze_fail(wna16_error_t *err, wna16_status_t st,
                              ze_result_t r, const char *what)
{
    return w16_err(err, st, "%s: Level Zero error 0x%x", what, (unsigned)r);
}

/* The first driver that has a GPU device. */
static wna16_status_t find_gpu(w16_ze_t *c, wna16_error_t *err)
{
    uint32_t nd = 0;
    ze_result_t r = c->z.zeDriverGet(&nd, NULL);
    if (r != ZE_RESULT_SUCCESS || nd == 0)
        return w16_err(err, WNA16_EUNAVAILABLE, "xpu target unavailable: no "
                       "Level Zero driver (zeDriverGet: 0x%x, %u drivers)",
                       (unsigned)r, nd);
    ze_driver_handle_t drivers[16];
    if (nd > 16)
        nd = 16;
    if ((r = c->z.zeDriverGet(&nd, drivers)) != ZE_RESULT_SUCCESS)
        return ze_fail(err, WNA16_EUNAVAILABLE, r, "xpu target unavailable: "
                       "zeDriverGet");
    for (uint32_t d = 0; d < nd; d++) {
        uint32_t nv = 0;
        if (c->z.zeDeviceGet(drivers[d], &nv, NULL) != ZE_RESULT_SUCCESS)
            continue;
        ze_device_handle_t devs[64];
        if (nv > 64)
            nv = 64;
        if (c->z.zeDeviceGet(drivers[d], &nv, devs) != ZE_RESULT_SUCCESS)
            continue;
        for (uint32_t v = 0; v < nv; v++) {
            ze_device_properties_t p = {.stype =
                                            ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
            if (c->z.zeDeviceGetProperties(devs[v], &p) != ZE_RESULT_SUCCESS ||
                p.type != ZE_DEVICE_TYPE_GPU)
                continue;
            c->driver = drivers[d];
            c->device = devs[v];
            snprintf(c->name, sizeof c->name, "%s", p.name);
            return WNA16_OK;
        }
    }
    return w16_err(err, WNA16_EUNAVAILABLE, "xpu target unavailable: the "
                   "Level Zero drivers (%u) have no GPU", nd);
}

static void describe_driver(w16_ze_t *c)
{
    ze_api_version_t api = 0;
    ze_driver_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES};
    c->z.zeDriverGetApiVersion(c->driver, &api);
    c->z.zeDriverGetProperties(c->driver, &p);
    snprintf(c->driver_version, sizeof c->driver_version,
             "Level Zero %u.%u, driver 0x%x", ZE_MAJOR_VERSION(api),
             ZE_MINOR_VERSION(api), p.driverVersion);
}

static wna16_status_t ze_create(wna16_context_t *ctx, w16_ze_t **out,
                                wna16_error_t *err)
{
    void *lib = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return w16_err(err, WNA16_EUNAVAILABLE, "xpu target unavailable: %s",
                       dlerror());
    w16_ze_t *c = w16_calloc(ctx, 1, sizeof *c);
    if (!c) {
        dlclose(lib);
        return w16_err_nomem(err, "creating the XPU target");
    }
    c->ctx = ctx;
    c->lib = lib;
    pthread_mutex_init(&c->mu, NULL);
    const char *missing = ze_resolve(lib, &c->z);
    wna16_status_t st = WNA16_OK;
    ze_result_t r = ZE_RESULT_SUCCESS;
    if (missing)
        st = w16_err(err, WNA16_EUNAVAILABLE, "xpu target unavailable: "
                     "libze_loader.so.1 has no %s (loader too old)", missing);
    else if ((r = c->z.zeInit(ZE_INIT_FLAG_GPU_ONLY)) != ZE_RESULT_SUCCESS)
        /* no further call: the loader may already have unloaded a driver
         * that failed, and the next call would run into it */
        st = w16_err(err, WNA16_EUNAVAILABLE, "xpu target unavailable: "
                     "zeInit failed (0x%x%s)", (unsigned)r,
                     r == ZE_RESULT_ERROR_UNINITIALIZED
                         ? ": no Level Zero GPU driver or device" : "");
    else
        st = find_gpu(c, err);
    if (st == WNA16_OK) {
        ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
        if ((r = c->z.zeContextCreate(c->driver, &cd, &c->context)) !=
            ZE_RESULT_SUCCESS)
            st = ze_fail(err, WNA16_EUNAVAILABLE, r, "xpu target "
                         "unavailable: zeContextCreate");
    }
    if (st == WNA16_OK) {
        ze_command_queue_desc_t qd = {
            .stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
            .mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS,
            .priority = ZE_COMMAND_QUEUE_PRIORITY_NORMAL};
        if ((r = c->z.zeCommandListCreateImmediate(c->context, c->device, &qd,
                                                   &c->list)) !=
            ZE_RESULT_SUCCESS)
            st = ze_fail(err, WNA16_EUNAVAILABLE, r, "xpu target "
                         "unavailable: zeCommandListCreateImmediate");
    }
    if (st != WNA16_OK) {
        bool initialized = !missing && r == ZE_RESULT_SUCCESS;
        if (initialized)
            w16_ze_destroy(c); /* keeps the loader: see w16_ze_destroy */
        else {
            pthread_mutex_destroy(&c->mu);
            w16_free(ctx, c, sizeof *c);
            dlclose(lib);
        }
        return st;
    }
    describe_driver(c);
    *out = c;
    return WNA16_OK;
}

static pthread_mutex_t get_mu = PTHREAD_MUTEX_INITIALIZER;

wna16_status_t w16_ze_get(wna16_context_t *ctx, w16_ze_t **out,
                          wna16_error_t *err)
{
    pthread_mutex_lock(&get_mu);
    wna16_status_t st = WNA16_OK;
    w16_ze_t *c = ctx->targets[WNA16_TARGET_XPU];
    if (!c && (st = ze_create(ctx, &c, err)) == WNA16_OK)
        ctx->targets[WNA16_TARGET_XPU] = c;
    pthread_mutex_unlock(&get_mu);
    *out = c;
    return st;
}

/* The loader stays mapped once zeInit succeeded (its drivers keep threads
 * that outlive a context), as the CUDA driver does. */
void w16_ze_destroy(w16_ze_t *c)
{
    if (!c)
        return;
    if (c->list)
        c->z.zeCommandListDestroy(c->list);
    if (c->context)
        c->z.zeContextDestroy(c->context);
    pthread_mutex_destroy(&c->mu);
    w16_free(c->ctx, c, sizeof *c);
}

const char *w16_ze_device_name(const w16_ze_t *c) { return c ? c->name : ""; }
const char *w16_ze_driver_version(const w16_ze_t *c)
{
    return c ? c->driver_version : "";
}

/* ---- modules and kernels ------------------------------------------------- */

wna16_status_t w16_ze_kernel_load(w16_ze_t *c, const uint32_t *words,
                                  size_t n_words, const char *name,
                                  w16_ze_kernel_t **out, wna16_error_t *err)
{
    w16_ze_kernel_t *k = calloc(1, sizeof *k);
    if (!k)
        return w16_err_nomem(err, "loading an XPU kernel");
    k->ze = c;
    ze_module_desc_t md = {.stype = ZE_STRUCTURE_TYPE_MODULE_DESC,
                           .format = ZE_MODULE_FORMAT_IL_SPIRV,
                           .inputSize = n_words * 4,
                           .pInputModule = (const uint8_t *)words,
                           .pBuildFlags = ""};
    ze_module_build_log_handle_t log = NULL;
    ze_result_t r = c->z.zeModuleCreate(c->context, c->device, &md, &k->module,
                                        &log);
    if (r != ZE_RESULT_SUCCESS) {
        char text[1024] = "";
        size_t n = sizeof text;
        if (log && c->z.zeModuleBuildLogGetString(log, &n, text) !=
                       ZE_RESULT_SUCCESS)
            text[0] = 0;
        text[sizeof text - 1] = 0;
        if (log)
            c->z.zeModuleBuildLogDestroy(log);
        free(k);
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: zeModuleCreate "
                       "failed (0x%x): %s", name, (unsigned)r,
                       text[0] ? text : "(no build log)");
    }
    if (log)
        c->z.zeModuleBuildLogDestroy(log);
    ze_kernel_desc_t kd = {.stype = ZE_STRUCTURE_TYPE_KERNEL_DESC,
                           .pKernelName = name};
    if ((r = c->z.zeKernelCreate(k->module, &kd, &k->kernel)) !=
        ZE_RESULT_SUCCESS) {
        c->z.zeModuleDestroy(k->module);
        free(k);
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: zeKernelCreate "
                       "failed (0x%x)", name, (unsigned)r);
    }
    *out = k;
    return WNA16_OK;
}

void w16_ze_kernel_free(w16_ze_kernel_t *k)
{
    if (!k)
        return;
    k->ze->z.zeKernelDestroy(k->kernel);
    k->ze->z.zeModuleDestroy(k->module);
    free(k);
}

/* ---- memory and launches ------------------------------------------------- */

wna16_status_t w16_ze_alloc(w16_ze_t *c, size_t bytes, uint64_t *addr,
                            wna16_error_t *err)
{
    *addr = 0;
    if (!bytes)
        return WNA16_OK;
    ze_device_mem_alloc_desc_t d = {
        .stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
    void *p = NULL;
    ze_result_t r = c->z.zeMemAllocDevice(c->context, &d, bytes, 256,
                                          c->device, &p);
    if (r != ZE_RESULT_SUCCESS)
        return w16_err(err, r == ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY
                                ? WNA16_ENOMEM : WNA16_EINTERNAL,
                       "zeMemAllocDevice of %zu bytes failed (0x%x)", bytes,
                       (unsigned)r);
    *addr = (uint64_t)(uintptr_t)p;
    return WNA16_OK;
}

void w16_ze_free(w16_ze_t *c, uint64_t addr)
{
    if (c && addr)
        c->z.zeMemFree(c->context, (void *)(uintptr_t)addr);
}

wna16_status_t w16_ze_copy(w16_ze_t *c, void *dst, const void *src,
                           size_t bytes, wna16_error_t *err)
{
    if (!bytes)
        return WNA16_OK;
    pthread_mutex_lock(&c->mu);
    ze_result_t r = c->z.zeCommandListAppendMemoryCopy(c->list, dst, src,
                                                       bytes, NULL, 0, NULL);
    pthread_mutex_unlock(&c->mu);
    return r == ZE_RESULT_SUCCESS
               ? WNA16_OK
               : ze_fail(err, WNA16_EINTERNAL, r, "zeCommandListAppendMemoryCopy");
}

wna16_status_t w16_ze_launch(w16_ze_t *c, w16_ze_kernel_t *k,
                             const uint64_t *args, const uint8_t *sizes,
                             int n_args, uint32_t groups, uint32_t lanes,
                             wna16_error_t *err)
{
    pthread_mutex_lock(&c->mu); /* arguments live in the kernel object */
    ze_result_t r = c->z.zeKernelSetGroupSize(k->kernel, lanes, 1, 1);
    for (int i = 0; r == ZE_RESULT_SUCCESS && i < n_args; i++)
        r = c->z.zeKernelSetArgumentValue(k->kernel, (uint32_t)i, sizes[i],
                                          &args[i]);
    ze_group_count_t g = {groups, 1, 1};
    if (r == ZE_RESULT_SUCCESS)
        r = c->z.zeCommandListAppendLaunchKernel(c->list, k->kernel, &g, NULL,
                                                 0, NULL);
    pthread_mutex_unlock(&c->mu);
    return r == ZE_RESULT_SUCCESS
               ? WNA16_OK
               : ze_fail(err, WNA16_EINTERNAL, r, "launching an XPU kernel");
}
