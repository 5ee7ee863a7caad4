/*
 * targets.c - the target list. Adding a target is one folder under
 * runtime/ with its descriptor, one line here and its files in CMake
 * (docs/targets.md). A target whose toolchain headers were missing at
 * configure time is not compiled at all, so it is not listed either: the
 * WNA16_HAVE_* definitions come from cmake/components.cmake.
 */
#include "runtime/targets.h"

#include <stdio.h>
#include <string.h>

extern const w16_target_t w16_target_cpu;
extern const w16_target_t w16_target_cuda;
extern const w16_target_t w16_target_xpu;
extern const w16_target_t w16_target_ocl;

/* Preference order for running a job: a GPU first. */
static const w16_target_t *const targets[] = {
#ifdef WNA16_HAVE_CUDA
    &w16_target_cuda,
#endif
#ifdef WNA16_HAVE_LEVEL_ZERO
    &w16_target_xpu,
#endif
#ifdef WNA16_HAVE_OPENCL /* the xpu target's SPIR-V on any OpenCL device */
    &w16_target_ocl,
#endif
    /* always: without LLVM it runs kernels from packs (cpu_nojit.c) */
    &w16_target_cpu,
    NULL, /* keeps the array non-empty in a build with no target */
};

enum { N_TARGETS = (int)(sizeof targets / sizeof targets[0]) - 1 };

int w16_target_count(void) { return N_TARGETS; }

const w16_target_t *w16_target_at(int i)
{
    return i >= 0 && i < N_TARGETS ? targets[i] : NULL;
}

const w16_target_t *w16_target_find(wna16_target_t id)
{
    for (int i = 0; i < N_TARGETS; i++)
        if (targets[i]->id == id)
            return targets[i];
    return NULL;
}

const w16_target_t *w16_target_by_name(const char *name)
{
    for (int i = 0; name && i < N_TARGETS; i++)
        if (strcmp(targets[i]->name, name) == 0)
            return targets[i];
    return NULL;
}

void w16_target_names(char *out, size_t n)
{
    if (!n)
        return;
    out[0] = 0;
    for (int i = 0; i < N_TARGETS; i++)
        snprintf(out + strlen(out), n - strlen(out), "%s%s", i ? ", " : "",
                 targets[i]->name);
    if (!out[0])
        snprintf(out, n, "none");
}

/* Why a build has no such target: the component it was built without. */
static const char *const missing_component[WNA16_TARGET_COUNT_] = {
    [WNA16_TARGET_REFERENCE] = "no generated kernels run there",
    [WNA16_TARGET_CPU] = "built without LLVM 19 (install llvm-19-dev and "
                         "reconfigure)",
    [WNA16_TARGET_CUDA] = "built without CUDA headers",
    [WNA16_TARGET_XPU] = "built without the Level Zero headers (install "
                         "libze-dev and reconfigure)",
    [WNA16_TARGET_OCL] = "built without the OpenCL headers or SPIRV-Tools "
                         "(install ocl-icd-opencl-dev spirv-tools "
                         "spirv-headers and reconfigure)",
};

wna16_status_t w16_target_probe(wna16_context_t *ctx, wna16_target_t id,
                                const w16_target_t **T, void **inst,
                                wna16_error_t *err)
{
    const w16_target_t *t = w16_target_find(id);
    if (T)
        *T = t;
    *inst = NULL;
    if (!t)
        return w16_err(err, WNA16_EUNAVAILABLE, "%s target unavailable: %s",
                       wna16_target_name(id),
                       (unsigned)id < WNA16_TARGET_COUNT_
                           ? missing_component[id] : "no such target");
    return t->probe(ctx, inst, err);
}

void w16_targets_release(wna16_context_t *ctx)
{
    for (int i = 0; i < N_TARGETS; i++)
        targets[i]->release(ctx);
}
