/*
 * emit_spirv.h - lowers a kernel IR kernel to a SPIR-V 1.2 module of the
 * OpenCL flavour (Kernel and Addresses capabilities, Physical64 addressing,
 * the OpenCL memory model, OpenCL.std for math), as binary words emitted
 * directly from the IR, for Level Zero (zeModuleCreate with
 * ZE_MODULE_FORMAT_IL_SPIRV) and any OpenCL 2.1+ driver. Capabilities
 * Int8, Int16, Int64 and Float16Buffer as the kernel uses them (f16 is
 * moved as bits and converted by OpenCL.std: no Float16, which needs
 * cl_khr_fp16 and fails OpenCL validation).
 *
 * Launch model, as the CUDA emitter's: one entry point NAME, a 1-D grid of
 * workgroups of `lanes` work-items (LocalSize execution mode = lanes x 1 x
 * 1); the workgroup is WorkgroupId.x, the lane LocalInvocationId.x.
 * Parameters in kernel-parameter order: buffers as CrossWorkgroup pointers
 * to their elements, buffer tables as CrossWorkgroup pointers to 64-bit
 * device addresses (what every target's put_table writes), scalars by
 * value. f16 and bf16 travel as their 16 bits (an i16), so their
 * buffers are pointers to i16.
 *
 * Every module passes SPIRV-Tools' validator (spirv_validate.h) before it
 * leaves w16_emit_spirv: a module that fails is an error naming the kernel
 * and the validator's message. Builds without SPIRV-Tools or the SPIR-V
 * headers answer WNA16_EUNAVAILABLE.
 */
#ifndef W16_EMIT_SPIRV_H
#define W16_EMIT_SPIRV_H

#include "gen/kir.h"

/* Part of a SPIR-V kernel's cache key (and the low half of the module's
 * generator word): bump it whenever the lowering of the same IR changes. */
#define W16_SPIRV_EMITTER_VERSION 1

/* ---- a growable, bounds-checked buffer of 32-bit words ------------------- */

typedef struct w16_words {
    wna16_context_t *ctx;
    uint32_t *data;
    size_t len, cap; /* in words */
    bool failed;     /* sticky: an allocation failed; contents truncated */
} w16_words_t;

void w16_words_init(w16_words_t *w, wna16_context_t *ctx);
void w16_words_free(w16_words_t *w);
void w16_words_reset(w16_words_t *w);
void w16_words_push(w16_words_t *w, uint32_t word);
void w16_words_append(w16_words_t *w, const uint32_t *src, size_t n);

/* ---- the emitter --------------------------------------------------------- */

/* Appends the kernel's module (header and all) to out, validated. The
 * module holds one entry point, named as the kernel; its OpNames are the
 * IR's own identifiers. Out of memory, an IR construct the emitter does
 * not lower (bf16 float conversions, which the builders lower with integer
 * operations; non-f32 float constants) or a failed validation is an error
 * naming the kernel; out then holds what it held before. */
wna16_status_t w16_emit_spirv(const kir_kernel_t *k, w16_words_t *out,
                              wna16_error_t *err);

/* Appends the disassembly of the kernel's (validated) module to out, after
 * a comment line with the kernel's documentation (`wna16 gen --target
 * spirv`). */
wna16_status_t w16_emit_spirv_text(const kir_kernel_t *k, w16_buf_t *out,
                                   wna16_error_t *err);

#endif
