/*
 * ref.h - the reference semantics (internal): plain scalar C that reads and
 * writes any spec layout element by element through the spec's maps. It is
 * deliberately simple; it is the oracle every generated kernel is checked
 * against, and is itself checked against the facts sheet's worked examples
 * and vLLM's golden tensors.
 */
#ifndef W16_REF_H
#define W16_REF_H

#include "spec/spec.h"

/* Where one layout's tensor sits in the logical layer: experts from e_off
 * and output channels from n_off (the gate/up shards of a per-expert
 * format). */
typedef struct w16_place {
    int64_t e_off, n_off;
    /* codes are read/written as stored, without the layout's value
     * transforms (unused zero-point words passed through) */
    bool raw;
    /* act-order sorted layouts: the permutation [E][K] written to the
     * g_idx_sort_indices layout, or filled from it when decoding */
    const int32_t *perm;
    int32_t *perm_out;
} w16_place_t;

/* Stable per-expert argsort of g_idx ([E][K], groups in [0, G)) into perm:
 * ties keep ascending k, as CUDA torch's argsort does for rows longer than
 * 32 (the golden files). */
void w16_sort_g_idx(const int32_t *g_idx, int32_t E, int32_t K, int32_t G,
                    int32_t *perm);
/* A copy of src with K in act-order: codes and g_idx read through the
 * per-expert permutation (returned in *perm, malloc'd [E][K]). */
wna16_status_t w16_qweight_sorted(const wna16_qweight_t *src,
                                  wna16_qweight_t *dst, int32_t **perm,
                                  wna16_error_t *err);
/* The inverse, in place: codes and g_idx back to checkpoint order. */
wna16_status_t w16_qweight_unsort(wna16_qweight_t *qw, const int32_t *perm,
                                  wna16_error_t *err);

/* vLLM's weight loader: the scales and biases of qw rounded (nearest
 * even; overflow to inf) to `model` (F16 or BF16), as the parameters of
 * the model's dtype it copies them into hold them; scale_dtype and
 * bias_dtype become `model`. WNA16_DTYPE_INVALID: nothing changes. */
void w16_qweight_cast(wna16_qweight_t *qw, wna16_dtype_t model);
/* One value so cast. */
float w16_model_round(wna16_dtype_t model, float v);

/* Decodes tensor t (in layout l, vars bound to the operand) into qw. */
wna16_status_t w16_layout_decode(const wna16_spec_t *spec,
                                 const w16_layout_t *l, int64_t *vars,
                                 const wna16_tensor_t *t,
                                 wna16_qweight_t *qw, w16_place_t at,
                                 wna16_error_t *err);

/* Encodes qw into tensor t (allocated by the caller with the layout's shape
 * and dtype, zero-filled). Places outside the logical domain stay zero. */
wna16_status_t w16_layout_encode(const wna16_spec_t *spec,
                                 const w16_layout_t *l, int64_t *vars,
                                 const wna16_qweight_t *qw,
                                 wna16_tensor_t *t, w16_place_t at,
                                 wna16_error_t *err);

/* Copies `src` into a zero-filled operand whose N (w13: each of the
 * `shards` shards of width I becomes IP wide) or K (w2: I becomes IP) is
 * padded; scales of padded outputs and padded groups are 0, as vLLM pads. */
wna16_status_t w16_qweight_pad(wna16_context_t *ctx, const wna16_qweight_t *src,
                               wna16_gemm_t gemm, int32_t I, int32_t IP,
                               wna16_qweight_t *dst, wna16_error_t *err);
/* The inverse: keeps the unpadded rows/columns. */
wna16_status_t w16_qweight_unpad(wna16_context_t *ctx,
                                 const wna16_qweight_t *src, wna16_gemm_t gemm,
                                 int32_t I, int32_t IP, wna16_qweight_t *dst,
                                 wna16_error_t *err);

/* Decodes only role r of operand g into qw, whose arrays for that role
 * (and dims E, N, K, G, bits, group_size) the caller set up. */
wna16_status_t w16_decode_role(const wna16_spec_t *spec,
                               const wna16_tensor_set_t *ts,
                               const char *prefix, const w16_problem_t *p,
                               wna16_gemm_t g, w16_role_t r, bool raw,
                               wna16_qweight_t *qw, wna16_error_t *err);

/* Reads the act-order permutation [E][K] a sorted stacked layout stores. */
wna16_status_t w16_decode_sort_indices(const wna16_spec_t *spec,
                                       const wna16_tensor_set_t *ts,
                                       const char *prefix,
                                       const w16_problem_t *p, wna16_gemm_t g,
                                       int32_t *perm, wna16_error_t *err);

/* Refuses, with the reason, what `spec`'s layouts cannot hold for problem
 * p (bits, group size, zero points, act-order, bias, layout rules, padding
 * with act-order), and layouts that are not bijections inside their shapes
 * at p's sizes (w16_spec_check_problem: the spec file and JSON path). IP is
 * the padded intermediate size. */
wna16_status_t w16_check_holds(const wna16_spec_t *spec,
                               const w16_problem_t *p, int32_t IP,
                               wna16_error_t *err);

/* The dtype a float role's layout stores for data of dtype `have`: `have`
 * when the layout lists it, else its first (scale and bias precision is
 * kept where the backend allows). */
wna16_dtype_t w16_layout_float_dtype(const w16_layout_t *l, wna16_dtype_t have);

/* Refuses, with the reason, layouts of `spec` that cannot be decoded for
 * problem p (int16 scale codes of int8 activations are lossy). */
wna16_status_t w16_check_decodable(const wna16_spec_t *spec,
                                   const w16_problem_t *p, wna16_error_t *err);

/* ---- scale transforms of 8-bit activations (scale_xform.c) -------------- */

/* f rounded to dtype d (F16, BF16; F32 unchanged), nearest even. */
float w16_round_to_dtype(wna16_dtype_t d, float f);
/* int16(round_half_even(s / max * range)) with every step rounded to d, as
 * torch computes it on a d tensor; false when it is not finite or outside
 * int16. s and max are values of d. */
bool w16_scale_int16_code(wna16_dtype_t d, float s, float max, int64_t range,
                          int32_t *code);
/* The operand's input_global_scale: fp32(max) / range, as vLLM's fp32
 * product 1/range * max. */
float w16_scale_global(float max, int64_t range);
/* The stored bits (dtype d) of logical scale s under transform x; max is
 * w16_scale_prepare's (int16 codes only). */
uint64_t w16_scale_store(const w16_scale_xform_t *x, wna16_dtype_t d, float s,
                         float max);
/* Checks one operand's n logical scales for transform x in dtype d and
 * returns the largest stored value in *max_out (padded_zero: the stored
 * tensor also holds padding zeros, which vLLM's max sees). Refuses, naming
 * the operand, scales that overflow when multiplied, and sets int16 codes
 * cannot hold (a non-positive or non-finite maximum, a scale below
 * -32768/range of it). Messages depend only on the set of values, so every
 * path that checks the same scales words its refusal alike. */
wna16_status_t w16_scale_prepare(const wna16_spec_t *spec,
                                 const w16_scale_xform_t *x, wna16_dtype_t d,
                                 wna16_gemm_t g, const float *scales, size_t n,
                                 bool padded_zero, float *max_out,
                                 wna16_error_t *err);
/* w16_scale_prepare for the generated repack path, on operand g's scales
 * read from the source `set` (through the reference decoder: they are a
 * group size's fraction of the codes) against `dst`'s scale transform;
 * *max_out is 0 when dst has none. int16 codes are relative to the
 * operand's largest scale, a reduction over every expert: the host takes it
 * once here and the kernels receive it as a parameter, so one compiled
 * kernel serves every layer. */
wna16_status_t w16_scale_prepare_source(const wna16_spec_t *src,
                                        const wna16_spec_t *dst,
                                        const wna16_tensor_set_t *set,
                                        const char *prefix,
                                        const w16_problem_t *p, wna16_gemm_t g,
                                        float *max_out, wna16_error_t *err);

#endif
