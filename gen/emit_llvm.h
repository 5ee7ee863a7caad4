/*
 * emit_llvm.h - lowers a kernel IR kernel to an LLVM IR function (LLVM 19 C
 * API), for the CPU target.
 *
 * CPU calling convention: one entry point
 *     void NAME(const uint64_t *args, int64_t group_begin,
 *               int64_t group_end, int64_t num_groups)
 * runs workgroups [group_begin, group_end); args[i] holds parameter i (a
 * pointer, a pointer to a table of pointers, or a scalar's bits). The lanes
 * of a workgroup are an inner loop around the inlined lane body, which is
 * what LLVM's loop vectorizer turns into SIMD code; threads split the
 * workgroups. Barriers are not supported on the CPU yet (the repack kernels
 * do not use them); a kernel with one is refused with a reason.
 */
#ifndef W16_EMIT_LLVM_H
#define W16_EMIT_LLVM_H

#include "gen/kir.h"

/* Part of every CPU kernel's cache key: bump it whenever the LLVM lowering
 * of the same kernel IR changes (the IR itself is keyed by its text). */
#define W16_LLVM_EMITTER_VERSION 12

/* The LLVM pass pipeline the CPU target runs on an emitted module: O3,
 * then the inlining of the vector helpers the loop vectorizer put in
 * (see lut_call in emit_llvm.c). */
#define W16_LLVM_PASSES "default<O3>,always-inline"

#ifdef WNA16_HAVE_LLVM
#include <llvm-c/Core.h>

/* Adds the kernel's entry point, named `symbol`, to module m. */
wna16_status_t w16_emit_llvm(const kir_kernel_t *k, LLVMModuleRef m,
                             const char *symbol, wna16_error_t *err);
/* w16_emit_llvm for code compiled with the LLVM feature string `features`
 * rather than the host's (NULL: the host's): the emitter picks vector
 * helpers by what the code may use (AVX-512 or not). */
wna16_status_t w16_emit_llvm_for(const kir_kernel_t *k, LLVMModuleRef m,
                                 const char *symbol, const char *features,
                                 wna16_error_t *err);
#endif

/* Writes the kernel as textual LLVM IR (unoptimized) into out; available
 * only in builds with LLVM (otherwise WNA16_EUNAVAILABLE). */
wna16_status_t w16_emit_llvm_text(const kir_kernel_t *k, w16_buf_t *out,
                                  wna16_error_t *err);

#endif
