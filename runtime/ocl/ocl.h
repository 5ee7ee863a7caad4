/*
 * ocl.h - the OpenCL target's device half: the SPIR-V words of
 * gen/emit_spirv.c run on any OpenCL 2.0 device whose kernels can address
 * host memory (fine-grained system SVM: PoCL's CPU device on these
 * machines). OpenCL drivers of Debian 12 take no SPIR-V (PoCL was built
 * without it, rusticl refuses it), so a module goes through the route of
 * shared/reference/toolchain.md section 3:
 *
 *   SPIR-V 1.2 words --llvm-spirv-15 -r --spirv-target-env=CL1.2--> SPIR 1.2
 *   bitcode --clCreateProgramWithBinary + clBuildProgram("-x spir ...")-->
 *   a program with the one kernel
 *
 * The translator is spawned (its library is C++ only); $WNA16_LLVM_SPIRV
 * names another binary. libOpenCL.so.1 (the ICD loader) is opened with
 * dlopen, never linked; where it, the translator or a suitable device is
 * missing the target is unavailable with the reason and nothing is kept.
 * The instance is per wna16 context: one device, a context and an
 * in-order queue; launches return when the kernel has run.
 */
#ifndef W16_OCL_H
#define W16_OCL_H

#include "base/base.h"

typedef struct w16_ocl w16_ocl_t;
/* A built program with its one kernel and how its arguments are passed. */
typedef struct w16_ocl_kernel w16_ocl_kernel_t;

/* Argument kinds of w16_ocl_launch: a pointer (passed as an SVM pointer)
 * or a scalar of 1, 2, 4 or 8 bytes. */
enum { W16_OCL_ARG_POINTER = 0x80 };

/* The context's OpenCL instance, created on first use; EUNAVAILABLE with
 * "ocl target unavailable: <why>" where the route cannot run. Nothing is
 * kept on failure, so a later call tries again. */
wna16_status_t w16_ocl_get(wna16_context_t *ctx, w16_ocl_t **out,
                           wna16_error_t *err);
void w16_ocl_destroy(w16_ocl_t *ocl);

/* "pthread-skylake-avx512-AMD EPYC (Portable Computing Language, OpenCL
 * 3.0 PoCL 3.1 ...)" and the translator's version line: part of every
 * cache key and of reports. */
const char *w16_ocl_device_name(const w16_ocl_t *ocl);
const char *w16_ocl_versions(const w16_ocl_t *ocl);
/* The device's compute units. */
int w16_ocl_units(const w16_ocl_t *ocl);

/* SPIR-V words -> SPIR 1.2 bitcode (*bc malloc'd, the caller's) by the
 * translator; its output in the error on failure, naming `name`. */
wna16_status_t w16_ocl_translate(w16_ocl_t *ocl, const uint32_t *words,
                                 size_t n_words, const char *name, void **bc,
                                 size_t *bc_size, wna16_error_t *err);

/* Builds bitcode into a program (the build log in the error on failure)
 * and creates its kernel `name`, whose arguments are `kinds` (n_args of
 * them, copied): W16_OCL_ARG_POINTER or a scalar's byte size. */
wna16_status_t w16_ocl_kernel_load(w16_ocl_t *ocl, const void *bc,
                                   size_t bc_size, const char *name,
                                   const uint8_t *kinds, int n_args,
                                   w16_ocl_kernel_t **out, wna16_error_t *err);
void w16_ocl_kernel_free(w16_ocl_kernel_t *k);

/* Runs groups workgroups of lanes work-items with the kernel's n_args
 * arguments (each a 64-bit value: a host address, or a scalar in its low
 * bytes, little-endian). Returns when the kernel has run. */
wna16_status_t w16_ocl_launch(w16_ocl_t *ocl, w16_ocl_kernel_t *k,
                              const uint64_t *args, int n_args, int64_t groups,
                              int lanes, wna16_error_t *err);

#endif /* W16_OCL_H */
