/*
 * model_dtype.c - the model's dtype, as vLLM's --dtype resolves it. vLLM
 * creates a MoE layer's scale and bias parameters in this dtype (its
 * params_dtype) and the weight loader casts the checkpoint's values into
 * them, so it decides the dtype a repacked layout holds its scales in and
 * the activations its kernels take (wna16_quant_desc_t.model_dtype). The
 * rule is vLLM's _get_and_verify_dtype / _resolve_auto_dtype for a
 * platform whose first supported dtype is bfloat16 (GPUs from sm_80, CPUs,
 * XPUs): an explicit float16 or bfloat16 wins; "auto" takes config.json's
 * torch_dtype (newer configs: dtype), downcasting float32 (also what vLLM
 * assumes when the config names none) to bfloat16.
 */
#include "base/base.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    wna16_dtype_t dtype;
} names[] = {
    {"auto", WNA16_DTYPE_INVALID}, {"float16", WNA16_DTYPE_F16},
    {"half", WNA16_DTYPE_F16},     {"fp16", WNA16_DTYPE_F16},
    {"bfloat16", WNA16_DTYPE_BF16}, {"bf16", WNA16_DTYPE_BF16},
};

bool wna16_model_dtype_from_name(const char *name, wna16_dtype_t *out)
{
    for (size_t i = 0; name && i < W16_ARRAY_LEN(names); i++)
        if (strcmp(name, names[i].name) == 0) {
            if (out)
                *out = names[i].dtype;
            return true;
        }
    return false;
}

const char *wna16_model_dtype_name(wna16_dtype_t dtype)
{
    return dtype == WNA16_DTYPE_INVALID ? "auto"
           : dtype == WNA16_DTYPE_F16   ? "float16"
           : dtype == WNA16_DTYPE_BF16  ? "bfloat16"
                                        : NULL;
}

/* ASCII case-insensitive equality (config values are plain ASCII). */
static bool ieq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = *a >= 'A' && *a <= 'Z' ? (char)(*a + 32) : *a;
        char y = *b >= 'A' && *b <= 'Z' ? (char)(*b + 32) : *b;
        if (x != y)
            return false;
    }
    return *a == *b;
}

/* Copies the chosen line into why (may be NULL). */
static void say(char *why, size_t n, const char *line)
{
    if (why && n)
        snprintf(why, n, "%s", line);
}

wna16_status_t wna16_model_dtype(const wna16_model_config_t *cfg,
                                 wna16_dtype_t requested, wna16_dtype_t *out,
                                 char *why, size_t why_len,
                                 wna16_error_t *err)
{
    if (!out)
        return w16_err(err, WNA16_EINVAL, "wna16_model_dtype: out is "
                       "required");
    *out = WNA16_DTYPE_INVALID;
    const char *cd = cfg && cfg->torch_dtype[0] ? cfg->torch_dtype : NULL;
    if (requested != WNA16_DTYPE_INVALID) {
        if (requested != WNA16_DTYPE_F16 && requested != WNA16_DTYPE_BF16)
            return w16_err(err, WNA16_EINVAL, "model dtype %s: expected "
                           "float16 or bfloat16 (or auto)",
                           wna16_dtype_name(requested)
                               ? wna16_dtype_name(requested) : "(invalid)");
        *out = requested;
        char line[160];
        snprintf(line, sizeof line, "requested (--dtype %s; config.json "
                 "says %s)", wna16_model_dtype_name(requested),
                 cd ? cd : "nothing");
        say(why, why_len, line);
        return WNA16_OK;
    }
    if (!cfg) {
        say(why, why_len, "unknown: no config.json names the model's dtype, "
            "so scales and biases keep the checkpoint's dtype (--dtype "
            "float16|bfloat16 sets it)");
        return WNA16_OK;
    }
    if (!cd || ieq(cd, "float32") || ieq(cd, "float")) {
        *out = WNA16_DTYPE_BF16;
        char line[200];
        snprintf(line, sizeof line, "config.json %s%s: vLLM's auto dtype "
                 "downcasts a float32 model to bfloat16 (the first dtype GPUs "
                 "from sm_80, CPUs and XPUs support)",
                 cd ? "torch_dtype " : "names no torch_dtype", cd ? cd : "");
        say(why, why_len, line);
        return WNA16_OK;
    }
    if (ieq(cd, "float16") || ieq(cd, "half"))
        *out = WNA16_DTYPE_F16;
    else if (ieq(cd, "bfloat16"))
        *out = WNA16_DTYPE_BF16;
    else
        return w16_err(err, WNA16_EINVAL, "config.json torch_dtype \"%s\": "
                       "wna16 runs float16 and bfloat16 models (--dtype "
                       "chooses one)", cd);
    char line[80];
    snprintf(line, sizeof line, "config.json torch_dtype %s", cd);
    say(why, why_len, line);
    return WNA16_OK;
}
