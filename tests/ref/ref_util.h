/*
 * ref_util.h - helpers shared by the reference tests: encode one operand of
 * one layout with hand-bound variables, and read storage words back.
 */
#ifndef WNA16_REF_UTIL_H
#define WNA16_REF_UTIL_H

#include "runtime/ref/ref.h"
#include "testutil.h"

/* A bound operand of a spec: its variables and a logical qweight of the
 * operand's (padded) shape, ready to fill. */
typedef struct ru_operand {
    const wna16_spec_t *spec;
    int64_t vars[W16_VAR_COUNT];
    wna16_qweight_t qw;
    wna16_tensor_set_t *set;
} ru_operand_t;

/* Binds `spec` (by name) to the problem and allocates the operand; exits on
 * failure (these are fixture errors, not checks). */
void ru_operand_init(ru_operand_t *o, wna16_context_t *ctx, const char *spec,
                     wna16_gemm_t gemm, w16_problem_t p);
void ru_operand_free(ru_operand_t *o);
/* Encodes role `r` for expert e_off = 0 into a fresh tensor; NULL (after a
 * failed check) on error. */
const wna16_tensor_t *ru_encode(ru_operand_t *o, w16_role_t r);
/* Little-endian 32-bit word i / byte i of a tensor. */
uint32_t ru_word(const wna16_tensor_t *t, size_t i);
uint8_t ru_byte(const wna16_tensor_t *t, size_t i);

#endif
