/*
 * run_checkpoint.c - `wna16 run CHECKPOINT`: one MoE layer of a Hugging
 * Face checkpoint directory, or a .safetensors file with the model's
 * config.json next to it. config.json gives the format, quantization,
 * sizes and top-k; the layer is the first MoE layer the format spec's
 * tensor names find, or --layer PREFIX. Also what both layer sources
 * share: what the tensors present say about the layer, and freeing it.
 */
#include "run.h"
#include "spec/spec.h"

#include <stdlib.h>
#include <string.h>

/* Is the first w13 tensor of role r present ("{prefix}.0.{gate}.{name}"
 * for per-expert formats, every spelling of the gate projection, or
 * "{prefix}.w13_{name}" for stacked ones)? */
static const wna16_tensor_t *first_of_role(const run_layer_t *L, w16_role_t r)
{
    const w16_layout_t *l = L->format->layouts[r];
    if (!l)
        return NULL;
    char name[1200];
    if (L->format->stacked) {
        snprintf(name, sizeof name, "%s.w13_%s", L->prefix, l->name);
        return wna16_tensor_set_find(L->tensors, name);
    }
    const w16_spec_proj_t *gate = &L->format->proj_gate;
    for (int i = 0; i < gate->n_names; i++) {
        snprintf(name, sizeof name, "%s.0.%s.%s", L->prefix, gate->names[i],
                 l->name);
        const wna16_tensor_t *t = wna16_tensor_set_find(L->tensors, name);
        if (t)
            return t;
    }
    return NULL;
}

void run_layer_finish(run_layer_t *L)
{
    /* as wna16_repack_checkpoint plans a layer: bias from the tensors;
     * tensors carried but unused (a symmetric checkpoint's zeros, g_idx
     * without act-order) are kept by layouts that keep them (Marlin) */
    L->quant.bias = first_of_role(L, W16_ROLE_BIAS) != NULL;
    L->quant.zeros_stored = !L->quant.zero_point &&
                            first_of_role(L, W16_ROLE_QZEROS) != NULL;
    L->quant.g_idx_stored = L->quant.act_order ||
                            first_of_role(L, W16_ROLE_G_IDX) != NULL;
    size_t pn = strlen(L->prefix);
    L->n_tensors = 0;
    L->bytes = 0;
    for (size_t i = 0; i < wna16_tensor_set_count(L->tensors); i++) {
        const wna16_tensor_t *t = wna16_tensor_set_at(L->tensors, i);
        if (strncmp(t->name, L->prefix, pn) == 0 && t->name[pn] == '.') {
            L->n_tensors++;
            L->bytes += t->nbytes;
        }
    }
}

void run_layer_free(run_layer_t *L)
{
    wna16_tensor_set_destroy(L->tensors);
    for (size_t i = 0; i < L->n_parts; i++)
        wna16_tensor_set_destroy(L->parts[i]);
    free(L->parts);
    if (L->has_logical)
        wna16_qlayer_free(&L->logical);
    wna16_checkpoint_close(L->ck);
    memset(L, 0, sizeof *L);
}

/* --layer PREFIX, checked against the layers the format spec finds; else
 * the first of them. */
static wna16_status_t pick_layer(wna16_context_t *ctx, const char *path,
                                 const char *want, run_layer_t *L,
                                 wna16_error_t *err)
{
    wna16_moe_layers_t layers;
    wna16_status_t st = wna16_checkpoint_moe_layers(ctx, L->ck, L->format,
                                                    &layers, err);
    if (st != WNA16_OK)
        return st;
    const char *found = NULL;
    for (size_t i = 0; i < layers.count && !found; i++)
        if (!want || strcmp(layers.prefixes[i], want) == 0)
            found = layers.prefixes[i];
    if (found && strlen(found) < sizeof L->prefix)
        snprintf(L->prefix, sizeof L->prefix, "%s", found);
    else if (found)
        st = w16_err(err, WNA16_ELIMIT, "%s: layer prefix too long", path);
    else if (!layers.count)
        st = w16_err(err, WNA16_ENOTFOUND, "%s: no MoE layer: no expert "
                     "tensors named as the %s format spec says (e.g. "
                     "'<prefix>.0.%s.%s')", path, L->format->name,
                     L->format->proj_gate.names[0],
                     L->format->layouts[W16_ROLE_QWEIGHT]->name);
    else
        st = w16_err(err, WNA16_ENOTFOUND, "--layer %s: %s has no such MoE "
                     "layer (%zu found, the first '%s')", want, path,
                     layers.count, layers.prefixes[0]);
    wna16_moe_layers_free(&layers);
    return st;
}

/* A size config.json must give. */
static wna16_status_t need(const char *path, const char *key, int32_t v,
                           wna16_error_t *err)
{
    if (v > 0)
        return WNA16_OK;
    return w16_err(err, WNA16_EFORMAT, "%s/config.json: no %s (wna16 run "
                   "reads the layer's sizes from it)", path, key);
}

/* The model's config.json: the checkpoint directory's, or for a lone
 * .safetensors file (one shard or a whole small checkpoint) the one next
 * to it, read into `own`. */
static wna16_status_t find_config(const char *path, const wna16_checkpoint_t *ck,
                                  wna16_model_config_t *own,
                                  const wna16_model_config_t **cfg,
                                  wna16_error_t *err)
{
    if ((*cfg = wna16_checkpoint_config(ck)))
        return WNA16_OK;
    char cj[4200];
    const char *slash = strrchr(path, '/');
    int n = slash ? snprintf(cj, sizeof cj, "%.*s/config.json",
                             (int)(slash - path), path)
                  : snprintf(cj, sizeof cj, "config.json");
    if (n < 0 || (size_t)n >= sizeof cj)
        return w16_err(err, WNA16_ELIMIT, "%s: path too long", path);
    FILE *f = fopen(cj, "r");
    if (!f)
        return w16_err(err, WNA16_EFORMAT, "%s: no config.json (wna16 run "
                       "reads the quantization and the layer's sizes from "
                       "it; for a .safetensors file, from %s)", path, cj);
    fclose(f);
    wna16_status_t st = wna16_model_config_load(cj, own, err);
    if (st == WNA16_OK)
        *cfg = own;
    return st;
}

int run_checkpoint_open(wna16_context_t *ctx, const run_opts_t *o,
                        run_layer_t *L, run_log_t *log)
{
    wna16_error_t err;
    const char *path = o->checkpoint;
    memset(L, 0, sizeof *L);
    run_log_step(log, "layer: reading %s", path);
    wna16_status_t st = wna16_checkpoint_open(ctx, path, &L->ck, &err);
    const wna16_model_config_t *cfg = NULL;
    wna16_model_config_t own;
    if (st == WNA16_OK)
        st = find_config(path, L->ck, &own, &cfg, &err);
    if (st == WNA16_OK)
        st = wna16_model_config_quant(cfg, &L->quant, &err);
    if (st == WNA16_OK &&
        !(L->format = wna16_spec_find(ctx, WNA16_SPEC_FORMAT,
                                      cfg->format_name)))
        st = w16_err(&err, WNA16_EUNSUPPORTED, "%s/config.json: no format "
                     "spec '%s'", path, cfg->format_name);
    if (st == WNA16_OK)
        st = need(path, "hidden_size", cfg->hidden_size, &err);
    if (st == WNA16_OK)
        st = need(path, "moe_intermediate_size (or intermediate_size)",
                  cfg->moe_intermediate_size, &err);
    if (st == WNA16_OK)
        st = need(path, "num_experts", cfg->num_experts, &err);
    if (st == WNA16_OK)
        st = need(path, "num_experts_per_tok", cfg->num_experts_per_tok, &err);
    if (st == WNA16_OK)
        st = pick_layer(ctx, path, o->layer, L, &err);
    if (st == WNA16_OK)
        st = wna16_tensor_set_create(ctx, &L->tensors, &err);
    for (size_t i = 0;
         st == WNA16_OK && i < wna16_checkpoint_tensor_count(L->ck); i++)
        st = wna16_tensor_set_add_view(L->tensors,
                                       wna16_checkpoint_tensor_at(L->ck, i),
                                       &err);
    if (st != WNA16_OK)
        return cli_fail(&err);
    L->E = cfg->num_experts;
    L->H = cfg->hidden_size;
    L->I = cfg->moe_intermediate_size;
    L->topk = cfg->num_experts_per_tok;
    /* the model's dtype (vLLM's --dtype): the activations', and the one
     * the repack casts scales and biases to and the fused MoE holds to */
    char why[256];
    if (wna16_model_dtype(cfg, o->dtype, &L->act_dtype, why, sizeof why,
                          &err) != WNA16_OK)
        return cli_fail(&err);
    L->quant.model_dtype = L->act_dtype;
    run_layer_finish(L);
    snprintf(L->source, sizeof L->source, "%s", path);
    run_log_more(log, "%s through the %s format spec: %d experts, hidden %d, "
                 "intermediate %d, top-%d, %d-bit, group %d%s%s%s; %zu "
                 "tensors, %.1f MB (%.2f s)", L->prefix, L->format->name,
                 L->E, L->H, L->I, L->topk, L->quant.bits,
                 L->quant.group_size,
                 L->quant.zero_point ? ", zero points" : "",
                 L->quant.act_order ? ", act-order" : "",
                 L->quant.bias ? ", bias" : "", L->n_tensors,
                 (double)L->bytes / 1e6, run_log_elapsed(log));
    run_log_more(log, "dtype: %s: %s", wna16_model_dtype_name(L->act_dtype),
                 why);
    return CLI_OK;
}
