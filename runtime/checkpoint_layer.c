/*
 * checkpoint_layer.c - wna16_checkpoint_layer_open and _close: one MoE
 * layer of a checkpoint gathered for the repack and the fused MoE, as a
 * host would otherwise do by hand: the sizes and quantization from the
 * config, the format spec it names, every tensor under the layer's prefix
 * as a view, and what only the tensors tell (bias, zero points a symmetric
 * checkpoint carries, g_idx without act-order), read the way
 * wna16_repack_checkpoint reads them.
 */
#include "base/base.h"
#include "spec/spec.h"

#include <stdio.h>
#include <string.h>

/* Expert 0's (or the stacked layer's) first w13 tensor of role r: every
 * spelling of the gate projection the format lists. */
static bool has_role(const wna16_checkpoint_layer_t *L, w16_role_t r)
{
    const w16_layout_t *l = L->format->layouts[r];
    if (!l)
        return false;
    char name[WNA16_TENSOR_NAME_MAX + 256];
    if (L->format->stacked) {
        snprintf(name, sizeof name, "%s.w13_%s", L->prefix, l->name);
        return wna16_tensor_set_find(L->tensors, name) != NULL;
    }
    const w16_spec_proj_t *gate = &L->format->proj_gate;
    for (int i = 0; i < gate->n_names; i++) {
        snprintf(name, sizeof name, "%s.0.%s.%s", L->prefix, gate->names[i],
                 l->name);
        if (wna16_tensor_set_find(L->tensors, name))
            return true;
    }
    return false;
}

/* A size the config must give. */
static wna16_status_t need(const char *key, int32_t v, wna16_error_t *err)
{
    if (v > 0)
        return WNA16_OK;
    return w16_err(err, WNA16_EFORMAT, "wna16_checkpoint_layer_open: the "
                   "config has no %s", key);
}

static wna16_status_t collect(wna16_context_t *ctx,
                              const wna16_checkpoint_t *ck,
                              const wna16_model_config_t *cfg,
                              const char *prefix,
                              wna16_checkpoint_layer_t *L, wna16_error_t *err)
{
    wna16_status_t st = wna16_model_config_quant(cfg, &L->quant, err);
    if (st == WNA16_OK && !L->format &&
        !(L->format = wna16_spec_find(ctx, WNA16_SPEC_FORMAT,
                                      cfg->format_name)))
        st = w16_err(err, WNA16_EUNSUPPORTED, "wna16_checkpoint_layer_open: "
                     "no format spec '%s' (the config's quant_method %s)",
                     cfg->format_name, cfg->quant_method);
    if (st == WNA16_OK &&
        wna16_spec_kind(L->format) != WNA16_SPEC_FORMAT)
        st = w16_err(err, WNA16_EINVAL, "wna16_checkpoint_layer_open: "
                     "format '%s' is a backend spec",
                     wna16_spec_name(L->format));
    if (st == WNA16_OK)
        st = need("hidden_size", cfg->hidden_size, err);
    if (st == WNA16_OK)
        st = need("moe_intermediate_size (or intermediate_size)",
                  cfg->moe_intermediate_size, err);
    if (st == WNA16_OK)
        st = need("num_experts", cfg->num_experts, err);
    if (st == WNA16_OK &&
        strlen(prefix) >= sizeof L->prefix)
        st = w16_err(err, WNA16_ELIMIT, "wna16_checkpoint_layer_open: prefix "
                     "is longer than %d bytes", WNA16_TENSOR_NAME_MAX - 1);
    if (st != WNA16_OK)
        return st;
    snprintf(L->prefix, sizeof L->prefix, "%s", prefix);
    L->E = cfg->num_experts;
    L->H = cfg->hidden_size;
    L->I = cfg->moe_intermediate_size;
    L->topk = cfg->num_experts_per_tok;
    /* vLLM's auto dtype (wna16_model_dtype): the activations, and the dtype
     * the repack casts scales and biases to */
    if ((st = wna16_model_dtype(cfg, WNA16_DTYPE_INVALID, &L->act_dtype,
                                NULL, 0, err)) != WNA16_OK)
        return st;
    L->quant.model_dtype = L->act_dtype;
    if ((st = wna16_tensor_set_create(ctx, &L->tensors, err)) != WNA16_OK)
        return st;
    size_t pn = strlen(prefix);
    for (size_t i = 0; i < wna16_checkpoint_tensor_count(ck); i++) {
        const wna16_tensor_t *t = wna16_checkpoint_tensor_at(ck, i);
        if (strncmp(t->name, prefix, pn) == 0 && t->name[pn] == '.' &&
            (st = wna16_tensor_set_add_view(L->tensors, t, err)) != WNA16_OK)
            return st;
    }
    if (!has_role(L, W16_ROLE_QWEIGHT))
        return w16_err(err, WNA16_ENOTFOUND, "wna16_checkpoint_layer_open: "
                       "no expert tensors of the %s format under '%s' (e.g. "
                       "'%s.0.%s.%s'); wna16_checkpoint_moe_layers lists the "
                       "layers", L->format->name, prefix, prefix,
                       L->format->proj_gate.names[0],
                       L->format->layouts[W16_ROLE_QWEIGHT]->name);
    L->quant.bias = has_role(L, W16_ROLE_BIAS);
    L->quant.zeros_stored = !L->quant.zero_point &&
                            has_role(L, W16_ROLE_QZEROS);
    L->quant.g_idx_stored = L->quant.act_order || L->format->g_idx_params ||
                            has_role(L, W16_ROLE_G_IDX);
    return WNA16_OK;
}

wna16_status_t wna16_checkpoint_layer_open(wna16_context_t *ctx,
                                           const wna16_checkpoint_t *ck,
                                           const wna16_model_config_t *cfg,
                                           const wna16_spec_t *format,
                                           const char *prefix,
                                           wna16_checkpoint_layer_t *out,
                                           wna16_error_t *err)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!ctx || !ck || !prefix || !out)
        return w16_err(err, WNA16_EINVAL, "wna16_checkpoint_layer_open: %s "
                       "is NULL", !ctx ? "ctx" : !ck ? "ck"
                                       : !prefix ? "prefix" : "out");
    if (!cfg && !(cfg = wna16_checkpoint_config(ck)))
        return w16_err(err, WNA16_EINVAL, "wna16_checkpoint_layer_open: "
                       "the checkpoint has no config.json and cfg is NULL "
                       "(load one with wna16_model_config_load)");
    out->format = format;
    wna16_status_t st = collect(ctx, ck, cfg, prefix, out, err);
    if (st != WNA16_OK)
        wna16_checkpoint_layer_close(out);
    return st;
}

void wna16_checkpoint_layer_close(wna16_checkpoint_layer_t *layer)
{
    if (!layer)
        return;
    wna16_tensor_set_destroy(layer->tensors);
    memset(layer, 0, sizeof *layer);
}
