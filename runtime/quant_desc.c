/*
 * quant_desc.c - turns what config.json says (wna16_model_config_t) into the
 * quantization description the reference and selection use. Each format's
 * config spells symmetric/zero-point and act-order differently; this is the
 * one place that knows those spellings.
 */
#include "base/base.h"

#include <string.h>

wna16_status_t wna16_model_config_quant(const wna16_model_config_t *cfg,
                                        wna16_quant_desc_t *out,
                                        wna16_error_t *err)
{
    if (!cfg || !out)
        return w16_err(err, WNA16_EINVAL, "wna16_model_config_quant: cfg and "
                       "out are required");
    memset(out, 0, sizeof *out);
    const char *f = cfg->format_name;
    if (!*f)
        return w16_err(err, WNA16_EUNSUPPORTED, "config.json: "
                       "$.quantization_config.quant_method \"%s\" is not a "
                       "format wna16 reads (gptq, awq, compressed-tensors, "
                       "moe_wna16); --format overrides it",
                       cfg->quant_method);
    out->bits = cfg->bits;
    out->group_size = cfg->group_size ? cfg->group_size : -1;
    if (strcmp(f, "gptq") == 0) {
        out->zero_point = cfg->has_sym && !cfg->sym;
        /* vLLM's AutoGPTQConfig turns desc_act off for channelwise groups. */
        out->act_order = cfg->desc_act && out->group_size != -1;
    } else if (strcmp(f, "awq") == 0) {
        out->zero_point = cfg->has_zero_point ? cfg->zero_point : true;
    } else if (strcmp(f, "compressed_tensors") == 0) {
        out->zero_point = cfg->has_sym && !cfg->sym;
        out->act_order = strcmp(cfg->actorder, "group") == 0;
    } else if (strcmp(f, "moe_wna16") == 0) {
        out->zero_point = cfg->zero_point;
    }
    if (out->bits != 4 && out->bits != 8)
        return w16_err(err, WNA16_EUNSUPPORTED, "config.json: %d-bit weights: "
                       "wna16 handles 4 and 8 bits", out->bits);
    return WNA16_OK;
}
