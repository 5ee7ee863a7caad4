/*
 * probe.c - finds the best device present without linking any driver: the
 * CUDA driver and the Level Zero loader are opened with dlopen, so a machine
 * without them gets a clear note instead of a link or load error. Rules
 * from the toolchain notes: treat any cuInit result but 0 as "no GPU", and
 * after a failed zeInit make no other ze* call (the loader may crash).
 */
#define _GNU_SOURCE
#include "base/base.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void note(wna16_device_info_t *d, const char *fmt, ...)
    W16_PRINTF(2, 3);

static void note(wna16_device_info_t *d, const char *fmt, ...)
{
    size_t used = strlen(d->notes);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->notes + used, sizeof d->notes - used, fmt, ap);
    va_end(ap);
}

static bool probe_cuda(wna16_device_info_t *d)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        note(d, "CUDA: %s. ", dlerror());
        return false;
    }
    typedef int (*init_fn)(unsigned);
    typedef int (*count_fn)(int *);
    typedef int (*get_fn)(int *, int);
    typedef int (*attr_fn)(int *, int, int);
    typedef int (*name_fn)(char *, int, int);
    init_fn cu_init = (init_fn)(uintptr_t)dlsym(lib, "cuInit");
    count_fn cu_count = (count_fn)(uintptr_t)dlsym(lib, "cuDeviceGetCount");
    get_fn cu_get = (get_fn)(uintptr_t)dlsym(lib, "cuDeviceGet");
    attr_fn cu_attr = (attr_fn)(uintptr_t)dlsym(lib, "cuDeviceGetAttribute");
    name_fn cu_name = (name_fn)(uintptr_t)dlsym(lib, "cuDeviceGetName");
    int rc, n = 0, dev = 0, major = 0, minor = 0;
    bool ok = false;
    if (!cu_init || !cu_count || !cu_get || !cu_attr || !cu_name)
        note(d, "CUDA: the driver lacks a needed entry point. ");
    else if ((rc = cu_init(0)) != 0)
        note(d, "CUDA: cuInit failed with error %d. ", rc);
    else if ((rc = cu_count(&n)) != 0 || n < 1)
        note(d, "CUDA: no device (error %d). ", rc);
    else if (cu_get(&dev, 0) == 0 &&
             cu_attr(&major, 75 /* COMPUTE_CAPABILITY_MAJOR */, dev) == 0 &&
             cu_attr(&minor, 76 /* COMPUTE_CAPABILITY_MINOR */, dev) == 0) {
        d->platform = WNA16_PLATFORM_CUDA;
        d->cc_major = major;
        d->cc_minor = minor;
        if (cu_name(d->name, (int)sizeof d->name, dev) != 0)
            snprintf(d->name, sizeof d->name, "CUDA device 0");
        ok = true;
    }
    dlclose(lib);
    return ok;
}

static bool probe_level_zero(wna16_device_info_t *d)
{
    void *lib = dlopen("libze_loader.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        note(d, "Level Zero: %s. ", dlerror());
        return false;
    }
    typedef int (*init_fn)(unsigned);
    typedef int (*drv_fn)(uint32_t *, void **);
    init_fn ze_init = (init_fn)(uintptr_t)dlsym(lib, "zeInit");
    drv_fn ze_drivers = (drv_fn)(uintptr_t)dlsym(lib, "zeDriverGet");
    int rc;
    uint32_t n = 0;
    bool ok = false;
    if (!ze_init || !ze_drivers)
        note(d, "Level Zero: the loader lacks zeInit. ");
    else if ((rc = ze_init(1 /* ZE_INIT_FLAG_GPU_ONLY */)) != 0)
        note(d, "Level Zero: zeInit failed with 0x%x (no driver). ", (unsigned)rc);
    else if ((rc = ze_drivers(&n, NULL)) != 0 || n == 0)
        note(d, "Level Zero: no driver (0x%x). ", (unsigned)rc);
    else {
        d->platform = WNA16_PLATFORM_XPU;
        snprintf(d->name, sizeof d->name, "Level Zero GPU");
        ok = true;
    }
    /* The loader is left loaded: unloading it after zeInit is not safe. */
    if (!ok)
        dlclose(lib);
    return ok;
}

void wna16_probe_device(wna16_device_info_t *out)
{
    memset(out, 0, sizeof *out);
    out->platform = WNA16_PLATFORM_CPU;
    if (probe_cuda(out) || probe_level_zero(out))
        return;
    snprintf(out->name, sizeof out->name, "host CPU");
}
