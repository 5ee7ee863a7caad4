/*
 * names.c - the name tables of the public enums that every layer prints or
 * parses: activations, numeric contracts, platforms, 8-bit input
 * variants, targets (the
 * dtype and status tables are in dtype.c). One table per enum, generated
 * from the X-macro lists in wna16.h where one exists.
 */
#include "base/base.h"

#include <string.h>

/* ---- activations --------------------------------------------------- */

static const struct {
    const char *name;
    bool gated;
} act_table[WNA16_ACT_COUNT_] = {
#define X(n, s, g) [WNA16_ACT_##n] = {s, g},
    WNA16_ACTIVATION_LIST(X)
#undef X
};

static bool act_valid(wna16_activation_t act)
{
    return (int)act >= 0 && act < WNA16_ACT_COUNT_;
}

const char *wna16_activation_name(wna16_activation_t act)
{
    return act_valid(act) ? act_table[act].name : NULL;
}

wna16_activation_t wna16_activation_from_name(const char *name)
{
    if (!name)
        return WNA16_ACT_INVALID;
    for (int a = 0; a < WNA16_ACT_COUNT_; a++)
        if (strcmp(act_table[a].name, name) == 0)
            return (wna16_activation_t)a;
    return WNA16_ACT_INVALID;
}

bool wna16_activation_is_gated(wna16_activation_t act)
{
    return act_valid(act) && act_table[act].gated;
}

/* ---- numeric contracts ------------------------------------------------------- */

/* ORDER NUMERICS: indexed by wna16_numerics_t. */
static const char *const numerics_names[WNA16_NUMERICS_COUNT_] = {
    "f32", "int8-dynamic", "bf16-exact"};

const char *wna16_numerics_name(wna16_numerics_t n)
{
    return (int)n >= 0 && n < WNA16_NUMERICS_COUNT_ ? numerics_names[n] : NULL;
}

wna16_numerics_t wna16_numerics_from_name(const char *name)
{
    for (int i = 0; name && i < WNA16_NUMERICS_COUNT_; i++)
        if (strcmp(name, numerics_names[i]) == 0)
            return (wna16_numerics_t)i;
    return WNA16_NUMERICS_INVALID;
}

/* ---- platforms and input variants ---------------------------------------- */

static const char *const platform_names[WNA16_PLATFORM_COUNT_] = {
    "cuda", "rocm", "cpu", "xpu"};

const char *wna16_platform_name(wna16_platform_t p)
{
    return (unsigned)p < WNA16_PLATFORM_COUNT_ ? platform_names[p] : "unknown";
}

/* ORDER INPUT: indexed by wna16_input_dtype_t (the A8 values). */
static const char *const input_dtype_names[WNA16_INPUT_COUNT_] = {
    "16bit", "int8", "fp8"};

const char *wna16_input_dtype_name(wna16_input_dtype_t d)
{
    return (unsigned)d < WNA16_INPUT_COUNT_ ? input_dtype_names[d] : NULL;
}

wna16_input_dtype_t wna16_input_dtype_from_name(const char *name)
{
    for (int i = 0; name && i < WNA16_INPUT_COUNT_; i++)
        if (strcmp(input_dtype_names[i], name) == 0)
            return (wna16_input_dtype_t)i;
    return (wna16_input_dtype_t)-1;
}

int w16_platform_from_name(const char *s)
{
    for (int i = 0; i < WNA16_PLATFORM_COUNT_; i++)
        if (strcmp(platform_names[i], s) == 0)
            return i;
    return -1;
}

/* Activation functions wna16 knows (vLLM's MoEActivation spellings). */
static const char *const known_activations[] = {
    "silu", "gelu", "gelu_tanh", "swigluoai", "swiglustep", "silu_no_mul",
    "gelu_no_mul", "gelu_tanh_no_mul", "relu2_no_mul", NULL};

bool w16_activation_known(const char *s)
{
    for (const char *const *a = known_activations; *a; a++)
        if (strcmp(*a, s) == 0)
            return true;
    return false;
}

/* ---- targets ------------------------------------------------------------- */

/* ORDER TARGET: indexed by wna16_target_t. */
static const char *const target_names[WNA16_TARGET_COUNT_] = {
    "reference", "cpu", "cuda", "xpu", "ocl"};

const char *wna16_target_name(wna16_target_t t)
{
    return (unsigned)t < WNA16_TARGET_COUNT_ ? target_names[t] : "unknown";
}
