/*
 * test_repack_checkpoint.c - wna16_repack_checkpoint on checkpoints built
 * here from random layers encoded through the format specs: a sharded
 * GPTQ model of three layers (split across two shards, numbered 1, 2, 10
 * so natural order matters, with non-expert tensors) to Triton and Marlin
 * with and without --all-tensors and --layer; a configless AWQ file; a
 * Mixtral-named (w1/w3/w2) and a compressed-tensors checkpoint; refusals
 * (act-order, zero points, bias, 8-bit) that must leave neither output nor
 * temporary files; errors (missing checkpoint, no MoE tensors, a missing
 * expert tensor, an expert beyond E, an unwritable directory, the output
 * being an input); and the spec-only output shapes against real encodes.
 * Every repacked layer must equal wna16_ref_encode of that layer.
 *
 * Checkpoint directories (-o DIR/): the sharded model into shards of at
 * most a few kB, index and config.json: opened again as a checkpoint it
 * holds the single-file output's tensors byte for byte, every shard says
 * the layout and dtype, each shard's data stays under the maximum unless
 * it is one tensor; a second save with another shard size replaces the
 * first's shards; a foreign .safetensors file, a regular file and the
 * checkpoint's own directory are refused; a layer failing after the first
 * was written leaves no directory (made by the run) and nothing new in an
 * existing one, no temporaries.
 *
 * The model's dtype: bfloat16 compressed-tensors scales in a float16 model
 * become float16 as torch's copy_ makes them (inf beyond 65504, zero below
 * the subnormals), on the reference and the CPU target.
 */
#define _POSIX_C_SOURCE 200809L
#include "repack_test.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static wna16_context_t *ctx;
static char *root;

enum { E = 4, H = 128, I = 96, GS = 32 };

static const char *const GPTQ_SYM =
    "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 32, "
    "\"desc_act\": false, \"sym\": true}";

/* ---- helpers --------------------------------------------------------------- */

static wna16_status_t repack(const char *ck, const char *out,
                             const wna16_repack_options_t *o,
                             wna16_repack_summary_t *sum, wna16_error_t *err)
{
    unlink(out);
    return wna16_repack_checkpoint(ctx, ck, out, o, sum, err);
}

static wna16_safetensors_t *open_out(const char *path)
{
    wna16_error_t err;
    wna16_safetensors_t *st = NULL;
    TU_OK(wna16_safetensors_open(ctx, path, &st, &err), &err);
    return st;
}

/* The file holds exactly `want`'s tensors, from position *pos on, in order
 * and byte for byte. */
static void expect_in_order(const char *what, const wna16_safetensors_t *st,
                            const wna16_tensor_set_t *want, size_t *pos)
{
    for (size_t i = 0; i < wna16_tensor_set_count(want); i++, ++*pos) {
        const wna16_tensor_t *w = wna16_tensor_set_at(want, i);
        const wna16_tensor_t *g = wna16_safetensors_at(st, *pos);
        TU_CHECK_MSG(g && strcmp(g->name, w->name) == 0, "%s: tensor %zu is "
                     "%s, want %s", what, *pos, g ? g->name : "(none)",
                     w->name);
        rt_same_tensor(what, w, wna16_safetensors_find(st, w->name));
    }
}

static const char *meta(const wna16_safetensors_t *st, const char *key)
{
    const char *v = wna16_safetensors_metadata_get(st, key);
    return v ? v : "(none)";
}

/* A refusal or failure: the status and reason, and nothing left behind. */
static void expect_nothing_written(const char *out, const char *dir)
{
    TU_CHECK_MSG(!tu_exists(out), "%s exists after a failure", out);
    TU_CHECK_MSG(rt_count_tmp(dir) == 0, "temporary files left in %s", dir);
}

/* ---- the sharded GPTQ model ---------------------------------------------- */

static const char *const prefixes[3] = {"model.layers.1.mlp.experts",
                                        "model.layers.2.mlp.experts",
                                        "model.layers.10.mlp.experts"};

typedef struct model {
    char *dir;
    wna16_qlayer_t L[3];
    wna16_tensor_set_t *src[3];
    rt_ckpt_t ck;
    const wna16_tensor_t *extra[4]; /* in checkpoint order */
} model_t;

/* Shard 1: embed_tokens, layer 10, half of layer 1, a q_proj; shard 2: the
 * other half of layer 1, layer 2, the final norm and lm_head. */
static void build_model(model_t *m)
{
    m->dir = rt_tempdir("repack-sharded");
    rt_ckpt_init(&m->ck, ctx, 2);
    for (int l = 0; l < 3; l++) {
        rt_make_layer(&m->L[l], E, H, I, 4, GS, false, false, false,
                      100 + (uint64_t)l);
        m->src[l] = rt_encode(ctx, "gptq", &m->L[l], prefixes[l]);
    }
    m->extra[0] = rt_ckpt_add_random(&m->ck, 0, "model.embed_tokens.weight",
                                     WNA16_DTYPE_F16, 64, H, 1);
    rt_ckpt_add_set(&m->ck, 0, m->src[2], NULL, NULL, 0, NULL);
    rt_ckpt_add_set(&m->ck, -1, m->src[0], NULL, NULL, 0, NULL);
    m->extra[1] = rt_ckpt_add_random(&m->ck, 0,
                                      "model.layers.1.self_attn.q_proj.weight",
                                      WNA16_DTYPE_BF16, H, H, 2);
    rt_ckpt_add_set(&m->ck, 1, m->src[1], NULL, NULL, 0, NULL);
    m->extra[2] = rt_ckpt_add_random(&m->ck, 1, "model.norm.weight",
                                     WNA16_DTYPE_F32, H, 0, 3);
    m->extra[3] = rt_ckpt_add_random(&m->ck, 1, "lm_head.weight",
                                     WNA16_DTYPE_F16, 64, H, 4);
    rt_ckpt_write(&m->ck, m->dir);
    rt_write_config(m->dir, E, H, I, 11, GPTQ_SYM);
}

static void free_model(model_t *m)
{
    for (int l = 0; l < 3; l++) {
        wna16_qlayer_free(&m->L[l]);
        wna16_tensor_set_destroy(m->src[l]);
    }
    rt_ckpt_free(&m->ck);
    rt_rmtree(m->dir);
    free(m->dir);
}

/* Records every progress report. */
typedef struct prog {
    int calls, starts, dones, copies;
    size_t last_layer;
    bool in_order;
    uint64_t written, total;
} prog_t;

static void on_progress(void *user, const wna16_repack_progress_t *p)
{
    prog_t *g = user;
    g->calls++;
    if (p->layer) {
        g->starts += !p->done;
        g->dones += p->done;
        if (p->layer < g->last_layer ||
            strcmp(p->name, prefixes[p->layer - 1]) != 0 || p->n_layers != 3)
            g->in_order = false;
        g->last_layer = p->layer;
    } else {
        g->copies++;
    }
    g->written = p->bytes_written;
    g->total = p->bytes_total;
}

static void test_layers_api(const model_t *m)
{
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    TU_OK(wna16_checkpoint_open(ctx, m->dir, &ck, &err), &err);
    wna16_moe_layers_t layers;
    const wna16_spec_t *gptq = wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq");
    TU_OK(wna16_checkpoint_moe_layers(ctx, ck, gptq, &layers, &err), &err);
    TU_CHECK(layers.count == 3);
    for (size_t i = 0; i < layers.count && i < 3; i++)
        TU_CHECK_MSG(strcmp(layers.prefixes[i], prefixes[i]) == 0,
                     "layer %zu: %s", i, layers.prefixes[i]);
    TU_CHECK(!wna16_checkpoint_layer_has_bias(ck, gptq, prefixes[0]));
    wna16_moe_layers_free(&layers);
    /* Another format's names find nothing here. */
    const wna16_spec_t *ct = wna16_spec_find(ctx, WNA16_SPEC_FORMAT,
                                             "compressed_tensors");
    TU_OK(wna16_checkpoint_moe_layers(ctx, ck, ct, &layers, &err), &err);
    TU_CHECK(layers.count == 0);
    wna16_moe_layers_free(&layers);
    wna16_checkpoint_close(ck);
}

/* Triton: the three layers in natural order, nothing else. */
static void test_sharded_triton(const model_t *m)
{
    wna16_error_t err;
    char *out = rt_path(root, "sharded.triton.safetensors");
    prog_t pg = {.in_order = true};
    wna16_repack_options_t o = {.backend = "triton", .progress = on_progress,
                                .progress_user = &pg};
    wna16_repack_summary_t sum;
    TU_OK(repack(m->dir, out, &o, &sum, &err), &err);
    wna16_safetensors_t *st = open_out(out);
    if (st) {
        TU_CHECK(wna16_safetensors_count(st) == 12);
        size_t pos = 0;
        for (int l = 0; l < 3; l++) {
            wna16_tensor_set_t *want = rt_encode_as_read(ctx, "gptq", "triton", &m->L[l],
                                                 prefixes[l]);
            if (want)
                expect_in_order("sharded -> triton", st, want, &pos);
            wna16_tensor_set_destroy(want);
        }
        TU_CHECK(!wna16_safetensors_find(st, "model.embed_tokens.weight"));
        TU_CHECK(strcmp(meta(st, "num_layers"), "3") == 0);
        TU_CHECK(strcmp(meta(st, "source_format"), "gptq") == 0);
        TU_CHECK(strcmp(meta(st, "intermediate_size_padded"), "96") == 0);
        TU_CHECK(strcmp(meta(st, "num_bits"), "4") == 0);
        TU_CHECK(strcmp(meta(st, "group_size"), "32") == 0);
        TU_CHECK(strcmp(meta(st, "bias"), "false") == 0);
        wna16_safetensors_close(st);
    }
    TU_CHECK(sum.n_layers == 3 && sum.n_tensors == 12 && sum.n_copied == 0);
    TU_CHECK(sum.E == E && sum.H == H && sum.I == I && sum.IP == I);
    TU_CHECK(pg.starts == 3 && pg.dones == 3 && pg.copies == 0 && pg.in_order);
    TU_CHECK(pg.written == pg.total && pg.total == sum.bytes && sum.bytes > 0);
    TU_CHECK(rt_count_tmp(root) == 0);
    free(out);
}

/* Marlin with --all-tensors: padded layers, then every non-expert tensor
 * unchanged in the checkpoint's order; the expert tensors are consumed. */
static void test_sharded_marlin_all(const model_t *m)
{
    wna16_error_t err;
    char *out = rt_path(root, "sharded.marlin.safetensors");
    prog_t pg = {.in_order = true};
    wna16_repack_options_t o = {.backend = "marlin", .all_tensors = true,
                                .progress = on_progress, .progress_user = &pg};
    wna16_repack_summary_t sum;
    TU_OK(repack(m->dir, out, &o, &sum, &err), &err);
    wna16_safetensors_t *st = open_out(out);
    if (st) {
        size_t pos = 0;
        for (int l = 0; l < 3; l++) {
            wna16_tensor_set_t *want = rt_encode_as_read(ctx, "gptq", "marlin", &m->L[l],
                                                 prefixes[l]);
            if (want)
                expect_in_order("sharded -> marlin", st, want, &pos);
            wna16_tensor_set_destroy(want);
        }
        for (int x = 0; x < 4; x++, pos++) {
            const wna16_tensor_t *g = wna16_safetensors_at(st, pos);
            TU_CHECK_MSG(g && strcmp(g->name, m->extra[x]->name) == 0,
                         "copy %d is %s", x, g ? g->name : "(none)");
            rt_same_tensor("copied", m->extra[x],
                           wna16_safetensors_find(st, m->extra[x]->name));
        }
        TU_CHECK(wna16_safetensors_count(st) == pos);
        TU_CHECK(!wna16_safetensors_find(
            st, "model.layers.1.mlp.experts.0.gate_proj.qweight"));
        TU_CHECK(!wna16_safetensors_find(
            st, "model.layers.2.mlp.experts.3.down_proj.qzeros"));
        TU_CHECK(strcmp(meta(st, "intermediate_size_padded"), "128") == 0);
        TU_CHECK(strcmp(meta(st, "backend"), "marlin") == 0);
        TU_CHECK(strcmp(meta(st, "vllm_backend"), "MARLIN") == 0);
        wna16_safetensors_close(st);
    }
    TU_CHECK(sum.n_copied == 4 && sum.IP == 128);
    TU_CHECK(pg.copies == 4 && pg.written == pg.total);
    free(out);
}

/* --layer: that layer only; the CPU target (when built) gives the same
 * bytes as the reference. */
static void test_one_layer_and_targets(const model_t *m)
{
    wna16_error_t err;
    char *out = rt_path(root, "one.safetensors");
    wna16_repack_options_t o = {.backend = "triton", .layer = prefixes[1]};
    TU_OK(repack(m->dir, out, &o, NULL, &err), &err);
    wna16_safetensors_t *st = open_out(out);
    wna16_tensor_set_t *want = rt_encode_as_read(ctx, "gptq", "triton", &m->L[1],
                                                 prefixes[1]);
    if (st && want) {
        size_t pos = 0;
        expect_in_order("--layer", st, want, &pos);
        TU_CHECK(wna16_safetensors_count(st) == pos);
    }
    wna16_safetensors_close(st);
    o.target = WNA16_TARGET_CPU;
    wna16_status_t s = repack(m->dir, out, &o, NULL, &err);
    if (s == WNA16_EUNAVAILABLE) {
        RT_EXPECT_ERR(s, &err, WNA16_EUNAVAILABLE, "unavailable");
        expect_nothing_written(out, root);
    } else {
        TU_CHECK_MSG(s == WNA16_OK, "cpu target: %s", err.message);
        st = s == WNA16_OK ? open_out(out) : NULL;
        if (st && want)
            TU_CHECK(rt_compare_set("cpu target", want, st) == 4);
        wna16_safetensors_close(st);
    }
    o.target = WNA16_TARGET_CUDA; /* without a GPU: refused, nothing written */
    s = repack(m->dir, out, &o, NULL, &err);
    if (s != WNA16_OK) {
        /* EUNAVAILABLE, or ENOMEM when the driver cannot start */
        TU_CHECK_MSG(strstr(err.message, "CUDA target unavailable") != NULL,
                     "cuda target: %s: %s", wna16_status_name(s), err.message);
        expect_nothing_written(out, root);
    } else {
        st = open_out(out);
        if (st && want)
            TU_CHECK(rt_compare_set("cuda target", want, st) == 4);
        wna16_safetensors_close(st);
    }
    o.layer = "model.layers.7.mlp.experts";
    RT_EXPECT_ERR(repack(m->dir, out, &o, NULL, &err), &err, WNA16_ENOTFOUND,
                  "model.layers.7.mlp.experts.0.gate_proj.qweight");
    wna16_tensor_set_destroy(want);
    free(out);
}

/* The output may not replace a file of the checkpoint; inputs stay. */
static void test_output_is_input(const model_t *m)
{
    wna16_error_t err;
    wna16_repack_options_t o = {.backend = "triton"};
    static const char *const files[] = {"model-00002-of-00002.safetensors",
                                        "model.safetensors.index.json",
                                        "config.json"};
    for (int i = 0; i < 3; i++) {
        char *in = rt_path(m->dir, files[i]);
        size_t n0 = 0, n1 = 0;
        void *before = tu_read_file(in, &n0);
        RT_EXPECT_ERR(wna16_repack_checkpoint(ctx, m->dir, in, &o, NULL, &err),
                      &err, WNA16_EINVAL, "is a file of the checkpoint");
        void *after = tu_read_file(in, &n1);
        TU_CHECK(before && after && n0 == n1 && !memcmp(before, after, n0));
        free(before);
        free(after);
        free(in);
    }
    /* A new model.safetensors beside the shards would shadow them. */
    char *shadow = rt_path(m->dir, "model.safetensors");
    RT_EXPECT_ERR(wna16_repack_checkpoint(ctx, m->dir, shadow, &o, NULL, &err),
                  &err, WNA16_EINVAL, "would shadow its shards");
    TU_CHECK(!tu_exists(shadow));
    free(shadow);
    TU_CHECK(rt_count_tmp(m->dir) == 0);
    /* a directory is a checkpoint-directory output: root holds other
     * .safetensors files, and the checkpoint's own directory is refused */
    RT_EXPECT_ERR(wna16_repack_checkpoint(ctx, m->dir, root, &o, NULL, &err),
                  &err, WNA16_EINVAL, "which this output does not write");
    RT_EXPECT_ERR(wna16_repack_checkpoint(ctx, m->dir, m->dir, &o, NULL, &err),
                  &err, WNA16_EINVAL, "is the checkpoint's own directory");
    TU_CHECK(rt_count_tmp(m->dir) == 0);
}

/* ---- checkpoint directories ------------------------------------------------- */

/* The names in `dir`, sorted, joined by '\n' (malloc'd). */
static char *listing(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "ls -A '%s' 2>/dev/null", dir);
    FILE *p = popen(cmd, "r");
    char *buf = calloc(1, 65536);
    if (p && buf)
        buf[fread(buf, 1, 65535, p)] = '\0';
    if (p)
        pclose(p);
    return buf;
}

/* Every tensor of the single-file output `file` is in the checkpoint
 * directory `dir`, byte for byte, and nothing else; each shard carries the
 * metadata; shards hold at most max bytes of data unless one tensor. */
static void expect_same_as_file(const char *what, const char *dir,
                                const char *file, uint64_t max)
{
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    wna16_safetensors_t *st = open_out(file);
    TU_OK(wna16_checkpoint_open(ctx, dir, &ck, &err), &err);
    if (!ck || !st) {
        wna16_checkpoint_close(ck);
        wna16_safetensors_close(st);
        return;
    }
    TU_CHECK_MSG(wna16_checkpoint_tensor_count(ck) ==
                     wna16_safetensors_count(st), "%s: %zu tensors, the file "
                 "has %zu", what, wna16_checkpoint_tensor_count(ck),
                 wna16_safetensors_count(st));
    for (size_t i = 0; i < wna16_safetensors_count(st); i++) {
        const wna16_tensor_t *w = wna16_safetensors_at(st, i);
        rt_same_tensor(what, w, wna16_checkpoint_find(ck, w->name));
    }
    const wna16_model_config_t *cfg = wna16_checkpoint_config(ck);
    TU_CHECK_MSG(cfg && cfg->num_experts == E && cfg->hidden_size == H,
                 "%s: config.json carried over", what);
    wna16_checkpoint_close(ck);
    wna16_safetensors_close(st);
    /* every shard: the metadata, and its size */
    char *names = listing(dir);
    int shards = 0;
    for (char *nm = names ? strtok(names, "\n") : NULL; nm;
         nm = strtok(NULL, "\n")) {
        if (strncmp(nm, "model-", 6) != 0)
            continue;
        shards++;
        char *path = rt_path(dir, nm);
        wna16_safetensors_t *sh = open_out(path);
        uint64_t data = 0;
        for (size_t i = 0; sh && i < wna16_safetensors_count(sh); i++)
            data += wna16_safetensors_at(sh, i)->nbytes;
        TU_CHECK_MSG(sh && (data <= max || wna16_safetensors_count(sh) == 1),
                     "%s: %s holds %llu bytes (max %llu)", what, nm,
                     (unsigned long long)data, (unsigned long long)max);
        TU_CHECK_MSG(sh && strcmp(meta(sh, "backend"), "marlin") == 0 &&
                         strstr(meta(sh, "layout"), "MARLIN") &&
                         strcmp(meta(sh, "dtype"), "float16") == 0,
                     "%s: %s: metadata", what, nm);
        wna16_safetensors_close(sh);
        free(path);
    }
    TU_CHECK_MSG(shards > 0, "%s: no shard", what);
    free(names);
}

static void test_directory(const model_t *m)
{
    wna16_error_t err;
    char *file = rt_path(root, "sharded.marlin.safetensors"); /* written */
    char *dir = rt_path(root, "dirout");
    char *slash = rt_path(root, "dirout/");
    wna16_repack_options_t o = {.backend = "marlin", .all_tensors = true,
                                .max_shard_size = 20000};
    wna16_repack_summary_t sum;
    TU_OK(wna16_repack_checkpoint(ctx, m->dir, slash, &o, &sum, &err), &err);
    TU_CHECK_MSG(sum.n_shards > 3, "%zu shards", sum.n_shards);
    expect_same_as_file("dir, 20 kB shards", dir, file, 20000);
    char *cfg_in = rt_path(m->dir, "config.json");
    char *cfg_out = rt_path(dir, "config.json");
    size_t n0 = 0, n1 = 0;
    void *a = tu_read_file(cfg_in, &n0), *b = tu_read_file(cfg_out, &n1);
    TU_CHECK_MSG(a && b && n0 == n1 && !memcmp(a, b, n0), "config.json "
                 "carried over unchanged");
    free(a);
    free(b);
    char sh[64];
    snprintf(sh, sizeof sh, "model-%05zu-of-%05zu.safetensors", sum.n_shards,
             sum.n_shards);
    char *last = rt_path(dir, sh);
    TU_CHECK(tu_exists(last));
    /* again, default shards, into the existing directory (no slash): the
     * first save's shards are replaced */
    o.max_shard_size = 0;
    TU_OK(wna16_repack_checkpoint(ctx, m->dir, dir, &o, &sum, &err), &err);
    TU_CHECK(sum.n_shards == 1);
    expect_same_as_file("dir, one shard", dir, file, UINT64_MAX);
    TU_CHECK_MSG(!tu_exists(last), "%s left from the first save", sh);
    char *want = listing(dir);
    TU_CHECK(want && strcmp(want, "config.json\nmodel-00001-of-00001."
                            "safetensors\nmodel.safetensors.index.json\n") == 0);
    /* a foreign weight file: refused, nothing changes */
    char *foreign = rt_path(dir, "extra.safetensors");
    FILE *f = fopen(foreign, "w");
    if (f)
        fclose(f);
    char *before = listing(dir);
    RT_EXPECT_ERR(wna16_repack_checkpoint(ctx, m->dir, dir, &o, NULL, &err),
                  &err, WNA16_EINVAL, "extra.safetensors, which this output "
                  "does not write");
    char *after = listing(dir);
    TU_CHECK(before && after && strcmp(before, after) == 0);
    unlink(foreign);
    /* a regular file named with a slash */
    char *reg = rt_path(root, "sharded.marlin.safetensors/");
    RT_EXPECT_ERR(wna16_repack_checkpoint(ctx, m->dir, reg, &o, NULL, &err),
                  &err, WNA16_EINVAL, "is not a directory");
    TU_CHECK(rt_count_tmp(dir) == 0 && rt_count_tmp(root) == 0);
    free(reg);
    free(before);
    free(after);
    free(foreign);
    free(want);
    free(last);
    free(cfg_in);
    free(cfg_out);
    free(file);
    free(dir);
    free(slash);
}

/* A layer that fails after the first layer's shards were written: the
 * directory the run made is gone, an existing one holds nothing new. */
static void test_directory_failure(void)
{
    wna16_error_t err;
    const char *p0 = "model.layers.0.mlp.experts";
    const char *p1 = "model.layers.1.mlp.experts";
    wna16_qlayer_t L0, L1;
    rt_make_layer(&L0, E, H, I, 4, GS, false, false, false, 51);
    rt_make_layer(&L1, E, H, I, 4, GS, false, false, false, 52);
    char *ck = rt_tempdir("repack-dir-fail");
    rt_ckpt_t c;
    rt_ckpt_init(&c, ctx, 1);
    wna16_tensor_set_t *s0 = rt_encode(ctx, "gptq", &L0, p0);
    wna16_tensor_set_t *s1 = rt_encode(ctx, "gptq", &L1, p1);
    if (s0 && s1) {
        rt_ckpt_add_set(&c, 0, s0, NULL, NULL, 0, NULL);
        rt_ckpt_add_set(&c, 0, s1, NULL, NULL, 0,
                        "model.layers.1.mlp.experts.2.down_proj.scales");
    }
    rt_ckpt_write(&c, ck);
    rt_write_config(ck, E, H, I, 2, GPTQ_SYM);
    wna16_repack_options_t o = {.backend = "triton", .max_shard_size = 4096};
    char *made = rt_path(root, "failed-dir/");
    char *made_dir = rt_path(root, "failed-dir");
    RT_EXPECT_ERR(wna16_repack_checkpoint(ctx, ck, made, &o, NULL, &err), &err,
                  WNA16_ENOTFOUND, "2.down_proj.scales");
    TU_CHECK_MSG(!tu_exists(made_dir), "the directory the run made is left");
    char *kept = rt_tempdir("repack-dir-kept");
    char *readme = rt_path(kept, "README");
    FILE *f = fopen(readme, "w");
    if (f)
        fclose(f);
    RT_EXPECT_ERR(wna16_repack_checkpoint(ctx, ck, kept, &o, NULL, &err), &err,
                  WNA16_ENOTFOUND, "2.down_proj.scales");
    char *names = listing(kept);
    TU_CHECK_MSG(names && strcmp(names, "README\n") == 0, "left in the "
                 "directory: %s", names ? names : "?");
    TU_CHECK(rt_count_tmp(kept) == 0 && rt_count_tmp(root) == 0);
    free(names);
    free(readme);
    rt_rmtree(kept);
    free(kept);
    free(made);
    free(made_dir);
    rt_ckpt_free(&c);
    wna16_tensor_set_destroy(s0);
    wna16_tensor_set_destroy(s1);
    wna16_qlayer_free(&L0);
    wna16_qlayer_free(&L1);
    rt_rmtree(ck);
    free(ck);
}

/* An output directory that cannot exist: a path under a regular file, so
 * the test means the same as root. */
static void test_unwritable(const model_t *m)
{
    wna16_error_t err;
    char *file = rt_path(root, "plain-file");
    TU_CHECK(tu_write_file(file, "x", 1) == 0);
    char *out = rt_path(file, "out.safetensors");
    wna16_repack_options_t o = {.backend = "triton"};
    wna16_status_t s = wna16_repack_checkpoint(ctx, m->dir, out, &o, NULL,
                                               &err);
    RT_EXPECT_ERR(s, &err, WNA16_EIO, out);
    TU_CHECK(!tu_exists(out));
    TU_CHECK(rt_count_tmp(root) == 0);
    unlink(file);
    free(out);
    free(file);
}

/* ---- other checkpoints ------------------------------------------------------ */

/* One layer of format `fmt` in a fresh directory (config when cfg != NULL),
 * renamed / with one tensor skipped as rt_ckpt_add_set does. */
static char *one_layer_ckpt(const char *tag, const char *fmt,
                            const wna16_qlayer_t *L, const char *prefix,
                            const char *cfg, const char *const *from,
                            const char *const *to, int nren, const char *skip)
{
    char *dir = rt_tempdir(tag);
    rt_ckpt_t c;
    rt_ckpt_init(&c, ctx, 1);
    wna16_tensor_set_t *set = rt_encode(ctx, fmt, L, prefix);
    if (set)
        rt_ckpt_add_set(&c, 0, set, from, to, nren, skip);
    rt_ckpt_add_random(&c, 0, "model.embed_tokens.weight", WNA16_DTYPE_F16, 8,
                       L->H, 9);
    rt_ckpt_write(&c, dir);
    if (cfg)
        rt_write_config(dir, L->E, L->H, L->I, 1, cfg);
    rt_ckpt_free(&c);
    wna16_tensor_set_destroy(set);
    return dir;
}

/* Repacks `ck` to `backend` and compares with the reference encode. */
static void expect_repack(const char *what, const char *ck, const char *fmt,
                          const wna16_repack_options_t *o,
                          const wna16_qlayer_t *L, const char *prefix)
{
    wna16_error_t err;
    char *out = rt_path(root, "check.safetensors");
    wna16_status_t s = repack(ck, out, o, NULL, &err);
    TU_CHECK_MSG(s == WNA16_OK, "%s: %s", what, err.message);
    wna16_safetensors_t *st = s == WNA16_OK ? open_out(out) : NULL;
    wna16_tensor_set_t *want = rt_encode_as_read(ctx, fmt, o->backend, L, prefix);
    if (st && want) {
        size_t pos = 0;
        expect_in_order(what, st, want, &pos);
        TU_CHECK_MSG(wna16_safetensors_count(st) == pos, "%s: extra tensors",
                     what);
    }
    wna16_tensor_set_destroy(want);
    wna16_safetensors_close(st);
    free(out);
}

static void expect_refusal(const char *what, const char *ck,
                           const wna16_repack_options_t *o, const char *needle)
{
    wna16_error_t err;
    char *out = rt_path(root, "refused.safetensors");
    wna16_status_t s = repack(ck, out, o, NULL, &err);
    TU_CHECK_MSG(s == WNA16_EUNSUPPORTED, "%s: %s", what,
                 s == WNA16_OK ? "accepted" : err.message);
    RT_EXPECT_ERR(s, &err, WNA16_EUNSUPPORTED, needle);
    expect_nothing_written(out, root);
    free(out);
}

static void test_mixtral(void)
{
    wna16_qlayer_t L;
    rt_make_layer(&L, E, H, I, 4, GS, false, false, false, 7);
    const char *prefix = "model.layers.0.block_sparse_moe.experts";
    static const char *const from[] = {".gate_proj.", ".up_proj.",
                                       ".down_proj."};
    static const char *const to[] = {".w1.", ".w3.", ".w2."};
    char *dir = one_layer_ckpt("repack-mixtral", "gptq", &L, prefix, GPTQ_SYM,
                               from, to, 3, NULL);
    wna16_repack_options_t o = {.backend = "triton"};
    expect_repack("mixtral -> triton", dir, "gptq", &o, &L, prefix);
    o.backend = "marlin";
    expect_repack("mixtral -> marlin", dir, "gptq", &o, &L, prefix);
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);
}

/* bfloat16 checkpoint scales in a float16 model (config.json torch_dtype
 * float16): the repack casts them as torch's copy_ does, nearest even,
 * overflowing to inf and through the subnormals; the reference and the
 * CPU target alike. */
static void test_bf16_to_f16(void)
{
    static const char *const sym =
        "{\"quant_method\": \"compressed-tensors\", \"format\": "
        "\"pack-quantized\", \"config_groups\": {\"group_0\": {\"targets\": "
        "[\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"int\", "
        "\"strategy\": \"group\", \"group_size\": 32, \"symmetric\": true}}}}";
    const char *prefix = "model.layers.0.mlp.experts";
    /* bf16 values: beyond f16's range, its largest finite neighbourhood, a
     * tie, subnormal and underflowing ones, negative */
    static const float special[] = {1e5f, 65280.0f, 65536.0f, 1.00390625f,
                                    3e-6f, 1e-8f, -2.5e-5f, 0.1f};
    wna16_qlayer_t L;
    rt_make_layer(&L, E, H, I, 4, GS, false, false, false, 61);
    wna16_qweight_t *q[2] = {&L.w13, &L.w2};
    for (int o = 0; o < 2; o++) {
        size_t n = (size_t)q[o]->E * q[o]->G * q[o]->N;
        for (size_t i = 0; i < n; i++)
            q[o]->scales[i] = wna16_bf16_to_f32(wna16_f32_to_bf16(
                i < 8 ? special[i] : q[o]->scales[i]));
        q[o]->scale_dtype = WNA16_DTYPE_BF16;
    }
    char *dir = one_layer_ckpt("repack-bf16-f16", "compressed_tensors", &L,
                               prefix, sym, NULL, NULL, 0, NULL);
    for (int t = WNA16_TARGET_REFERENCE; t <= WNA16_TARGET_CPU; t++) {
        wna16_error_t err;
        char name[64];
        snprintf(name, sizeof name, "bf16-to-f16.%d.safetensors", t);
        char *out = rt_path(root, name);
        wna16_repack_options_t o = {.backend = "triton",
                                    .target = (wna16_target_t)t};
        wna16_repack_summary_t sum;
        wna16_status_t st = repack(dir, out, &o, &sum, &err);
        if (t == WNA16_TARGET_CPU && st == WNA16_EUNAVAILABLE) {
            free(out);
            continue;
        }
        TU_OK(st, &err);
        TU_CHECK(sum.model_dtype == WNA16_DTYPE_F16);
        wna16_safetensors_t *f = st == WNA16_OK ? open_out(out) : NULL;
        const wna16_tensor_t *s =
            f ? wna16_safetensors_find(f, "model.layers.0.mlp.experts."
                                          "w13_scales") : NULL;
        TU_CHECK(s && s->dtype == WNA16_DTYPE_F16);
        /* triton's scales are (E, N, G): w13 scale (e, g, n) at [e][n][g] */
        size_t bad = 0, n = 0;
        for (int32_t e = 0; s && e < L.E; e++)
            for (int32_t g = 0; g < L.w13.G; g++)
                for (int32_t c = 0; c < L.w13.N; c++) {
                    float v = L.w13.scales[((size_t)e * L.w13.G + g) *
                                               L.w13.N + c];
                    uint16_t got;
                    memcpy(&got, (const char *)s->data +
                                     2 * (((size_t)e * L.w13.N + c) *
                                              L.w13.G + g), 2);
                    bad += got != wna16_f32_to_f16(v);
                    n++;
                }
        TU_CHECK_MSG(bad == 0 && n > 0, "target %d: %zu of %zu scales not "
                     "float16(bfloat16 value)", t, bad, n);
        /* the ones that matter: inf, the largest f16, 0 */
        uint16_t first[8];
        if (s)
            for (int i = 0; i < 8; i++)
                memcpy(&first[i], (const char *)s->data +
                                      2 * ((size_t)i * L.w13.G), 2);
        TU_CHECK(s && first[0] == 0x7c00 && first[1] == 0x7bf8 &&
                 first[2] == 0x7c00 && first[5] == 0x0000);
        wna16_safetensors_close(f);
        unlink(out);
        free(out);
    }
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);
}

/* --dtype bfloat16 on a float16 GPTQ checkpoint with biases: Marlin's
 * scales and biases are the bf16-rounded values, permuted as vLLM does,
 * byte for byte what encoding the rounded layer gives; reference and CPU
 * target. */
static void test_bias_bf16(void)
{
    const char *prefix = "model.layers.0.mlp.experts";
    wna16_qlayer_t L;
    rt_make_layer(&L, E, H, I, 4, GS, false, false, true, 71);
    char *dir = one_layer_ckpt("repack-bias-bf16", "gptq", &L, prefix,
                               GPTQ_SYM, NULL, NULL, 0, NULL);
    wna16_qweight_t *q[2] = {&L.w13, &L.w2};
    for (int o = 0; o < 2; o++) { /* vLLM's loader, restated */
        for (size_t i = 0; i < (size_t)q[o]->E * q[o]->G * q[o]->N; i++)
            q[o]->scales[i] = wna16_bf16_to_f32(wna16_f32_to_bf16(
                q[o]->scales[i]));
        for (size_t i = 0; i < (size_t)q[o]->E * q[o]->N; i++)
            q[o]->bias[i] = wna16_bf16_to_f32(wna16_f32_to_bf16(q[o]->bias[i]));
        q[o]->scale_dtype = q[o]->bias_dtype = WNA16_DTYPE_BF16;
    }
    for (int t = WNA16_TARGET_REFERENCE; t <= WNA16_TARGET_CPU; t++) {
        wna16_repack_options_t o = {.backend = "marlin",
                                    .target = (wna16_target_t)t,
                                    .dtype = WNA16_DTYPE_BF16};
        wna16_error_t err;
        char *probe = rt_path(root, "probe.safetensors");
        wna16_status_t st = repack(dir, probe, &o, NULL, &err);
        unlink(probe);
        free(probe);
        if (t == WNA16_TARGET_CPU && st == WNA16_EUNAVAILABLE)
            continue;
        expect_repack(t ? "gptq + bias -> marlin, bf16 (cpu)"
                        : "gptq + bias -> marlin, bf16 (reference)",
                      dir, "gptq", &o, &L, prefix);
    }
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);
}

static void test_compressed_tensors(void)
{
    static const char *const asym =
        "{\"quant_method\": \"compressed-tensors\", \"format\": "
        "\"pack-quantized\", \"config_groups\": {\"group_0\": {\"targets\": "
        "[\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"int\", "
        "\"strategy\": \"group\", \"group_size\": 32, \"symmetric\": false, "
        "\"actorder\": null}}}, \"ignore\": [\"lm_head\"]}";
    static const char *const sym =
        "{\"quant_method\": \"compressed-tensors\", \"format\": "
        "\"pack-quantized\", \"config_groups\": {\"group_0\": {\"targets\": "
        "[\"Linear\"], \"weights\": {\"num_bits\": 4, \"type\": \"int\", "
        "\"strategy\": \"group\", \"group_size\": 32, \"symmetric\": true}}}}";
    const char *prefix = "model.layers.0.mlp.experts";
    wna16_qlayer_t L;
    rt_make_layer(&L, E, H, I, 4, GS, true, false, false, 11);
    char *dir = one_layer_ckpt("repack-ct", "compressed_tensors", &L, prefix,
                               asym, NULL, NULL, 0, NULL);
    wna16_repack_options_t o = {.backend = "marlin"};
    expect_repack("compressed-tensors asym -> marlin", dir, "compressed_tensors", &o, &L, prefix);
    o.backend = "humming";
    expect_repack("compressed-tensors asym -> humming", dir, "compressed_tensors", &o, &L, prefix);
    o.backend = "xpu";
    expect_refusal("compressed-tensors asym -> xpu", dir, &o, "zero points");
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);
    rt_make_layer(&L, E, H, I, 4, GS, false, false, false, 12);
    dir = one_layer_ckpt("repack-ct-sym", "compressed_tensors", &L, prefix,
                         sym, NULL, NULL, 0, NULL);
    o.backend = "triton";
    expect_repack("compressed-tensors sym -> triton", dir, "compressed_tensors", &o, &L, prefix);
    o.backend = "emulation";
    expect_repack("compressed-tensors sym -> emulation", dir, "compressed_tensors", &o, &L, prefix);
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);
}

/* A lone AWQ .safetensors file: the options stand in for config.json. */
static void test_configless_awq(void)
{
    wna16_error_t err;
    const char *prefix = "model.layers.0.mlp.experts";
    wna16_qlayer_t L;
    rt_make_layer(&L, E, H, I, 4, GS, true, false, false, 21);
    char *dir = one_layer_ckpt("repack-awq", "awq", &L, prefix, NULL, NULL,
                               NULL, 0, NULL);
    char *file = rt_path(dir, "model.safetensors");
    /* AWQ has zero points unless told otherwise, as its configs do. */
    wna16_repack_options_t o = {.backend = "marlin", .format = "awq",
                                .bits = 4, .group_size = GS, .hidden = H,
                                .intermediate = I, .experts = E};
    expect_repack("awq file -> marlin", file, "awq", &o, &L, prefix);
    o.zero_point_set = o.zero_point = true;
    expect_repack("awq file --zero-point -> marlin", file, "awq", &o, &L, prefix);
    o.zero_point_set = false;
    o.bits = 5;
    char *bad = rt_path(root, "b5.safetensors");
    RT_EXPECT_ERR(repack(file, bad, &o, NULL, &err), &err,
                  WNA16_EUNSUPPORTED, "5-bit");
    expect_nothing_written(bad, root);
    free(bad);
    o.bits = 4;
    o.backend = "xpu";
    expect_refusal("awq -> xpu", file, &o, "zero points");
    /* Output onto the input file itself. */
    o.backend = "marlin";
    RT_EXPECT_ERR(wna16_repack_checkpoint(ctx, file, file, &o, NULL, &err),
                  &err, WNA16_EINVAL, "is a file of the checkpoint");
    /* Without the options, nothing says what the file holds. */
    wna16_repack_options_t bare = {.backend = "marlin"};
    char *out = rt_path(root, "bare.safetensors");
    RT_EXPECT_ERR(repack(file, out, &bare, NULL, &err), &err, WNA16_EINVAL,
                  "format (--format), bits (--bits)");
    expect_nothing_written(out, root);
    free(out);
    wna16_qlayer_free(&L);
    free(file);
    rt_rmtree(dir);
    free(dir);
}

/* Act-order, bias and 8-bit checkpoints where the backend cannot hold
 * them; bias does go to Marlin, found from the tensors. */
static void test_refusals(void)
{
    const char *prefix = "model.layers.0.mlp.experts";
    wna16_qlayer_t L;
    rt_make_layer(&L, E, H, 128, 4, GS, false, true, false, 31);
    char *dir = one_layer_ckpt("repack-act", "gptq", &L, prefix,
                               "{\"quant_method\": \"gptq\", \"bits\": 4, "
                               "\"group_size\": 32, \"desc_act\": true, "
                               "\"sym\": true}", NULL, NULL, 0, NULL);
    wna16_repack_options_t o = {.backend = "triton"};
    expect_refusal("act-order -> triton", dir, &o, "act-order");
    /* Marlin stores act-order sorted (codes through the permutation, sorted
     * g_idx, sort indices) */
    o.backend = "marlin";
    expect_repack("act-order -> marlin", dir, "gptq", &o, &L, prefix);
    /* padding cannot go with act-order */
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);

    /* a quantization_config wna16 does not read is named, with the
     * methods it reads; --format overrides it */
    rt_make_layer(&L, E, H, I, 4, GS, false, false, false, 33);
    dir = one_layer_ckpt("repack-fp8", "gptq", &L, prefix,
                         "{\"quant_method\": \"fp8\", \"bits\": 4, "
                         "\"group_size\": 32}", NULL, NULL, 0, NULL);
    o.backend = "triton";
    expect_refusal("quant_method fp8", dir, &o,
                   "quant_method \"fp8\" is not a format wna16 reads (gptq, "
                   "awq, compressed-tensors, moe_wna16)");
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);

    rt_make_layer(&L, E, H, I, 4, GS, false, false, true, 32);
    dir = one_layer_ckpt("repack-bias", "gptq", &L, prefix, GPTQ_SYM, NULL,
                         NULL, 0, NULL);
    o.backend = "emulation";
    expect_refusal("bias -> emulation", dir, &o, "bias");
    o.backend = "triton";
    expect_refusal("bias -> triton", dir, &o, "bias");
    o.backend = "marlin";
    expect_repack("bias -> marlin", dir, "gptq", &o, &L, prefix);
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);

    rt_make_layer(&L, E, H, I, 8, GS, false, false, false, 33);
    dir = one_layer_ckpt("repack-b8", "gptq", &L, prefix,
                         "{\"quant_method\": \"gptq\", \"bits\": 8, "
                         "\"group_size\": 32, \"desc_act\": false, "
                         "\"sym\": true}", NULL, NULL, 0, NULL);
    o.backend = "emulation";
    expect_refusal("8-bit -> emulation", dir, &o, "8-bit");
    o.backend = "triton";
    expect_repack("8-bit -> triton", dir, "gptq", &o, &L, prefix);
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);
}

static void test_errors(void)
{
    wna16_error_t err;
    char *out = rt_path(root, "err.safetensors");
    char *missing = rt_path(root, "no-such-checkpoint");
    wna16_repack_options_t o = {.backend = "triton"};
    RT_EXPECT_ERR(repack(missing, out, &o, NULL, &err), &err, WNA16_ENOTFOUND,
                  "no-such-checkpoint");
    expect_nothing_written(out, root);
    free(missing);

    /* A model with no MoE layer. */
    char *dir = rt_tempdir("repack-dense");
    rt_ckpt_t c;
    rt_ckpt_init(&c, ctx, 1);
    rt_ckpt_add_random(&c, 0, "model.embed_tokens.weight", WNA16_DTYPE_F16, 8,
                       H, 1);
    rt_ckpt_write(&c, dir);
    rt_ckpt_free(&c);
    rt_write_config(dir, E, H, I, 1, GPTQ_SYM);
    RT_EXPECT_ERR(repack(dir, out, &o, NULL, &err), &err, WNA16_ENOTFOUND,
                  "no MoE expert tensors");
    expect_nothing_written(out, root);
    wna16_repack_options_t bad = {.backend = "nope"};
    RT_EXPECT_ERR(repack(dir, out, &bad, NULL, &err), &err, WNA16_ENOTFOUND,
                  "no backend spec named 'nope'");
    rt_rmtree(dir);
    free(dir);

    /* One expert's tensor missing: the message names it. */
    const char *prefix = "model.layers.0.mlp.experts";
    const char *gone = "model.layers.0.mlp.experts.3.up_proj.scales";
    wna16_qlayer_t L;
    rt_make_layer(&L, E, H, I, 4, GS, false, false, false, 41);
    dir = one_layer_ckpt("repack-gap", "gptq", &L, prefix, GPTQ_SYM, NULL,
                         NULL, 0, gone);
    RT_EXPECT_ERR(repack(dir, out, &o, NULL, &err), &err, WNA16_ENOTFOUND,
                  gone);
    expect_nothing_written(out, root);
    rt_rmtree(dir);
    free(dir);

    /* An expert beyond num_experts would be dropped silently: refused. */
    static const char *const from[] = {".3."};
    static const char *const to[] = {".4."};
    dir = rt_tempdir("repack-extra");
    rt_ckpt_init(&c, ctx, 1);
    wna16_tensor_set_t *set = rt_encode(ctx, "gptq", &L, prefix);
    rt_ckpt_add_set(&c, 0, set, NULL, NULL, 0, NULL);
    wna16_tensor_set_t *one = NULL;
    TU_OK(wna16_tensor_set_create(ctx, &one, &err), &err);
    const wna16_tensor_t *t = wna16_tensor_set_find(
        set, "model.layers.0.mlp.experts.3.gate_proj.qweight");
    if (t && one) {
        TU_OK(wna16_tensor_set_add_view(one, t, &err), &err);
        rt_ckpt_add_set(&c, 0, one, from, to, 1, NULL);
    }
    rt_ckpt_write(&c, dir);
    rt_write_config(dir, E, H, I, 1, GPTQ_SYM);
    RT_EXPECT_ERR(repack(dir, out, &o, NULL, &err), &err, WNA16_EFORMAT,
                  "model.layers.0.mlp.experts.4.gate_proj.qweight");
    expect_nothing_written(out, root);
    rt_ckpt_free(&c);
    wna16_tensor_set_destroy(one);
    wna16_tensor_set_destroy(set);
    wna16_qlayer_free(&L);
    rt_rmtree(dir);
    free(dir);
    free(out);
}

/* ---- the spec-only output shapes ------------------------------------------ */

/* wna16_repack_layer_shapes must list exactly what the encoder makes, for
 * every backend that can hold the layer. */
static void expect_shapes(const wna16_qlayer_t *L, const char *what)
{
    wna16_error_t err;
    const char *prefix = "model.layers.5.mlp.experts";
    wna16_quant_desc_t q = {L->w13.bits, L->w13.group_size,
                            L->w13.zeros != NULL, L->w13.g_idx != NULL,
                            L->w13.bias != NULL};
    int checked = 0;
    for (size_t i = 0; i < wna16_spec_count(ctx); i++) {
        const wna16_spec_t *b = wna16_spec_at(ctx, i);
        if (wna16_spec_kind(b) != WNA16_SPEC_BACKEND)
            continue;
        wna16_tensor_set_t *set = NULL;
        TU_OK(wna16_tensor_set_create(ctx, &set, &err), &err);
        if (wna16_ref_encode(ctx, b, L, prefix, set, &err) != WNA16_OK) {
            wna16_tensor_set_destroy(set);
            continue;
        }
        wna16_tensor_decl_t d[WNA16_LAYER_MAX_TENSORS];
        size_t n = 0;
        TU_OK(wna16_repack_layer_shapes(ctx, b, prefix, L->E, L->H, L->I, &q,
                                        L->w13.scale_dtype, L->w13.bias_dtype,
                                        d, &n, &err), &err);
        TU_CHECK_MSG(n == wna16_tensor_set_count(set), "%s %s: %zu declared, "
                     "%zu encoded", what, wna16_spec_name(b), n,
                     wna16_tensor_set_count(set));
        for (size_t k = 0; k < n && k < wna16_tensor_set_count(set); k++) {
            const wna16_tensor_t *t = wna16_tensor_set_at(set, k);
            bool same = !strcmp(t->name, d[k].name) && t->dtype == d[k].dtype &&
                        t->ndim == d[k].ndim && t->nbytes == d[k].nbytes;
            for (int x = 0; same && x < t->ndim; x++)
                same = t->shape[x] == d[k].shape[x];
            TU_CHECK_MSG(same, "%s %s: %s declared as %s %s", what,
                         wna16_spec_name(b), t->name, d[k].name,
                         wna16_dtype_name(d[k].dtype));
        }
        checked++;
        wna16_tensor_set_destroy(set);
    }
    TU_CHECK_MSG(checked >= 2, "%s: only %d backends could hold it", what,
                 checked);
}

static void test_shapes(void)
{
    wna16_qlayer_t L;
    rt_make_layer(&L, E, H, I, 4, GS, false, false, false, 51);
    expect_shapes(&L, "gptq sym");
    L.w13.scale_dtype = L.w2.scale_dtype = WNA16_DTYPE_BF16;
    expect_shapes(&L, "bf16 scales");
    wna16_qlayer_free(&L);
    rt_make_layer(&L, E, 256, 128, 4, 32, true, false, true, 52);
    expect_shapes(&L, "zero points + bias");
    wna16_qlayer_free(&L);
    rt_make_layer(&L, 2, 256, 128, 8, -1, false, false, false, 53);
    expect_shapes(&L, "8-bit channelwise");
    wna16_qlayer_free(&L);
    /* A format spec is not a destination. */
    wna16_error_t err;
    wna16_tensor_decl_t d[WNA16_LAYER_MAX_TENSORS];
    size_t n;
    wna16_quant_desc_t q = {4, 32, false, false, false};
    RT_EXPECT_ERR(wna16_repack_layer_shapes(
                      ctx, wna16_spec_find(ctx, WNA16_SPEC_FORMAT, "gptq"),
                      "p", 2, 128, 64, &q, WNA16_DTYPE_INVALID,
                      WNA16_DTYPE_INVALID, d, &n, &err),
                  &err, WNA16_EINVAL, "not a backend");
}

/* A model whose other tensors use every safetensors dtype the kernels do
 * not read (FP8 attention, booleans, unsigned and 64-bit integers, the
 * sub-byte F4 and F6 formats): the experts repack, the other tensors are
 * ignored, and with all_tensors copied byte for byte in their order. */
static void test_every_dtype(void)
{
    static const struct {
        wna16_dtype_t dt;
        int64_t cols; /* F6's 6-bit and F4's 4-bit elements fill whole bytes */
    } extras[] = {
        {WNA16_DTYPE_F8_E4M3, 16},     {WNA16_DTYPE_F8_E5M2, 16},
        {WNA16_DTYPE_F8_E8M0, 4},      {WNA16_DTYPE_F8_E4M3FNUZ, 16},
        {WNA16_DTYPE_F8_E5M2FNUZ, 16}, {WNA16_DTYPE_BOOL, 8},
        {WNA16_DTYPE_U16, 8},          {WNA16_DTYPE_U32, 8},
        {WNA16_DTYPE_U64, 8},          {WNA16_DTYPE_I16, 8},
        {WNA16_DTYPE_F64, 8},          {WNA16_DTYPE_C64, 8},
        {WNA16_DTYPE_F6_E2M3, 4},      {WNA16_DTYPE_F6_E3M2, 12},
        {WNA16_DTYPE_F4, 6},
    };
    enum { N = sizeof extras / sizeof extras[0] };
    wna16_error_t err;
    char *dir = rt_tempdir("repack-dtypes");
    rt_ckpt_t ck;
    rt_ckpt_init(&ck, ctx, 1);
    wna16_qlayer_t L;
    rt_make_layer(&L, E, H, I, 4, GS, false, false, false, 7);
    wna16_tensor_set_t *src = rt_encode(ctx, "gptq", &L, prefixes[0]);
    const wna16_tensor_t *extra[N];
    for (int x = 0; x < N; x++) {
        char name[96];
        snprintf(name, sizeof name, "model.layers.1.self_attn.t%d.%s", x,
                 wna16_dtype_name(extras[x].dt));
        extra[x] = rt_ckpt_add_random(&ck, 0, name, extras[x].dt, 3,
                                      extras[x].cols, 50 + (uint64_t)x);
        TU_CHECK_MSG(extra[x]->nbytes == (size_t)(3 * extras[x].cols *
                                                  wna16_dtype_bits(extras[x].dt) / 8),
                     "%s: %zu bytes", name, extra[x]->nbytes);
    }
    rt_ckpt_add_set(&ck, 0, src, NULL, NULL, 0, NULL);
    rt_ckpt_write(&ck, dir);
    rt_write_config(dir, E, H, I, 2, GPTQ_SYM);

    /* ignored */
    char *out = rt_path(root, "dtypes.marlin.safetensors");
    wna16_repack_options_t o = {.backend = "marlin"};
    wna16_repack_summary_t sum;
    TU_OK(repack(dir, out, &o, &sum, &err), &err);
    wna16_safetensors_t *st = open_out(out);
    if (st) {
        for (int x = 0; x < N; x++)
            TU_CHECK(!wna16_safetensors_find(st, extra[x]->name));
        wna16_safetensors_close(st);
    }
    /* passed through, byte for byte, in the checkpoint's order */
    o.all_tensors = true;
    TU_OK(repack(dir, out, &o, &sum, &err), &err);
    TU_CHECK_MSG(sum.n_copied == N, "%zu copied", sum.n_copied);
    st = open_out(out);
    if (st) {
        for (int x = 0; x < N; x++) {
            const wna16_tensor_t *g = wna16_safetensors_find(st, extra[x]->name);
            TU_CHECK_MSG(g && g->dtype == extras[x].dt, "%s", extra[x]->name);
            rt_same_tensor("copied", extra[x], g);
        }
        wna16_safetensors_close(st);
    }
    free(out);
    wna16_tensor_set_destroy(src);
    wna16_qlayer_free(&L);
    rt_ckpt_free(&ck);
    rt_rmtree(dir);
    free(dir);
}

int main(void)
{
    ctx = tu_context();
    root = rt_tempdir("repack-out");
    model_t m;
    memset(&m, 0, sizeof m);
    build_model(&m);
    test_layers_api(&m);
    test_sharded_triton(&m);
    test_sharded_marlin_all(&m);
    test_one_layer_and_targets(&m);
    test_output_is_input(&m);
    test_directory(&m);
    test_unwritable(&m);
    free_model(&m);
    test_mixtral();
    test_compressed_tensors();
    test_bf16_to_f16();
    test_bias_bf16();
    test_configless_awq();
    test_refusals();
    test_errors();
    test_directory_failure();
    test_shapes();
    test_every_dtype();
    TU_CHECK(rt_count_tmp(root) == 0);
    rt_rmtree(root);
    free(root);
    wna16_context_destroy(ctx);
    return tu_finish("test_repack_checkpoint");
}
