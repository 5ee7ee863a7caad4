/*
 * spirv_validate.h - SPIRV-Tools behind two calls: the validator every
 * emitted SPIR-V module must pass (OpenCL 2.2 environment, which accepts
 * SPIR-V up to 1.2) and the disassembler that prints a module for people
 * (`wna16 gen --target spirv`). Builds without SPIRV-Tools answer
 * WNA16_EUNAVAILABLE, so no module leaves wna16 unvalidated.
 */
#ifndef W16_SPIRV_VALIDATE_H
#define W16_SPIRV_VALIDATE_H

#include "base/base.h"

/* Validates a module of n words (header included). A failure is
 * WNA16_EINTERNAL with "kernel KERNEL: SPIR-V validation failed at
 * instruction I: <the validator's message>" (I counts from the first
 * instruction after the header). Allocates nothing of wna16's; the
 * validator's own memory is freed before it returns. */
wna16_status_t w16_spirv_validate(const uint32_t *words, size_t n,
                                  const char *kernel, wna16_error_t *err);

/* Appends the module's disassembly to out, ids shown by their OpName
 * (SPIRV-Tools' friendly names). The module is not validated here. */
wna16_status_t w16_spirv_disassemble(const uint32_t *words, size_t n,
                                     const char *kernel, w16_buf_t *out,
                                     wna16_error_t *err);

/* "SPIRV-Tools v2023.1 ..." (the library's own words), or "none". */
const char *w16_spirv_tools_version(void);

#endif
