/*
 * test_checkpoint.c - Hugging Face checkpoints: every golden case directory
 * (config.json + model.safetensors) with its config values, a sharded
 * checkpoint built here (index + two shards), every index error (missing
 * shard, tensor missing from its shard or from the index, unsafe shard
 * names), config.json parsing for compressed-tensors, MoeWNA16 and the AWQ
 * key spellings, and the messages for malformed configs.
 */
#define _POSIX_C_SOURCE 200809L
#include "st_test.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- golden cases --------------------------------------------------------- */

typedef struct golden_case {
    const char *name;
    int32_t hidden, inter, bits, group;
    bool desc_act;
    const char *format;
} golden_case_t;

static const golden_case_t golden[] = {
    {"gptq_b4_g128", 256, 256, 4, 128, false, "gptq"},
    {"gptq_b4_gm1", 128, 64, 4, -1, false, "gptq"},
    {"gptq_b8_g128", 256, 256, 8, 128, false, "gptq"},
    {"gptq_b4_g128_actorder", 256, 256, 4, 128, true, "gptq"},
    {"awq_b4_g128", 256, 256, 4, 128, false, "awq"},
    {"gptq_b4_g32_pad", 128, 160, 4, 32, false, "gptq"},
    {"gptq_b4_gm1_pad", 128, 96, 4, -1, false, "gptq"},
    {"awq_b4_g32_pad", 128, 96, 4, 32, false, "awq"},
};

static void check_golden_case(wna16_context_t *ctx, const golden_case_t *g)
{
    char *dir = stt_path(WNA16_GOLDEN_DIR, g->name);
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    TU_OK(wna16_checkpoint_open(ctx, dir, &ck, &err), &err);
    free(dir);
    if (!ck)
        return;
    const wna16_model_config_t *c = wna16_checkpoint_config(ck);
    TU_CHECK(c != NULL);
    if (c) {
        TU_CHECK_MSG(c->hidden_size == g->hidden, "%s", g->name);
        TU_CHECK_MSG(c->moe_intermediate_size == g->inter, "%s", g->name);
        TU_CHECK(c->num_experts == 2 && c->num_experts_per_tok == 2);
        TU_CHECK(c->num_hidden_layers == 1);
        TU_CHECK(strcmp(c->model_type, "qwen3_moe") == 0);
        TU_CHECK(strcmp(c->torch_dtype, "float16") == 0);
        TU_CHECK(c->bits == g->bits && c->group_size == g->group);
        TU_CHECK_MSG(strcmp(c->format_name, g->format) == 0, "%s: %s",
                     g->name, c->format_name);
        TU_CHECK(strcmp(c->quant_method, g->format) == 0);
        if (strcmp(g->format, "gptq") == 0) {
            TU_CHECK(c->desc_act == g->desc_act);
            TU_CHECK(c->has_sym && c->sym);
            TU_CHECK(!c->has_zero_point);
        } else {
            TU_CHECK(c->has_zero_point && c->zero_point);
            TU_CHECK(!c->has_sym);
            TU_CHECK(strcmp(c->version, "gemm") == 0);
        }
    }
    /* E experts x 3 projections x (qweight, qzeros, scales [, g_idx]) */
    size_t roles = strcmp(g->format, "gptq") == 0 ? 4 : 3;
    TU_CHECK_MSG(wna16_checkpoint_tensor_count(ck) == 2 * 3 * roles, "%s: %zu",
                 g->name, wna16_checkpoint_tensor_count(ck));
    const wna16_tensor_t *t =
        wna16_checkpoint_find(ck, "model.layers.0.mlp.experts.1.up_proj.qweight");
    TU_CHECK(t && t->dtype == WNA16_DTYPE_I32 && t->ndim == 2);
    if (t && strcmp(g->format, "gptq") == 0)
        TU_CHECK(t->shape[0] == g->hidden * g->bits / 32 &&
                 t->shape[1] == g->inter);
    for (size_t i = 0; i < wna16_checkpoint_tensor_count(ck); i++) {
        const wna16_tensor_t *a = wna16_checkpoint_tensor_at(ck, i);
        TU_CHECK(wna16_checkpoint_find(ck, a->name) == a);
    }
    TU_CHECK(wna16_checkpoint_tensor_at(ck, 1000) == NULL);
    TU_CHECK(wna16_checkpoint_find(ck, "nope") == NULL);
    wna16_checkpoint_close(ck);
}

static void test_golden(wna16_context_t *ctx)
{
    if (!tu_exists(WNA16_GOLDEN_DIR)) {
        printf("note: %s is absent; golden checkpoints not checked\n",
               WNA16_GOLDEN_DIR);
        return;
    }
    for (size_t i = 0; i < sizeof golden / sizeof golden[0]; i++)
        check_golden_case(ctx, &golden[i]);
    /* the same file alone: no config */
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    TU_OK(wna16_checkpoint_open(ctx, WNA16_GOLDEN_DIR
                                "/gptq_b4_g32_pad/model.safetensors", &ck,
                                &err), &err);
    TU_CHECK(ck && wna16_checkpoint_config(ck) == NULL);
    TU_CHECK(ck && wna16_checkpoint_tensor_count(ck) == 24);
    wna16_checkpoint_close(ck);
}

/* ---- a sharded checkpoint ------------------------------------------------- */

static const char *config_text =
    "{\"model_type\":\"mixtral\",\"hidden_size\":64,\"intermediate_size\":32,"
    "\"num_local_experts\":4,\"num_experts_per_tok\":2,"
    "\"num_hidden_layers\":2,\"torch_dtype\":\"bfloat16\"}";

/* Writes a shard holding tensors `names` (each U8 [n]) to dir/file. */
static void write_shard(wna16_context_t *ctx, const char *dir,
                        const char *file, const char *const *names, int n)
{
    char *path = stt_path(dir, file);
    wna16_error_t err;
    wna16_safetensors_writer_t *w = NULL;
    TU_OK(wna16_safetensors_writer_create(ctx, path, &w, &err), &err);
    for (int i = 0; i < n; i++) {
        int64_t shape[] = {i + 1};
        TU_OK(wna16_safetensors_writer_declare(w, names[i], WNA16_DTYPE_U8, 1,
                                               shape, &err), &err);
    }
    unsigned char bytes[16];
    for (int i = 0; i < n; i++) {
        memset(bytes, 'a' + i, sizeof bytes);
        TU_OK(wna16_safetensors_writer_write(w, bytes, (size_t)i + 1, &err),
              &err);
    }
    TU_OK(wna16_safetensors_writer_finish(w, &err), &err);
    free(path);
}

static const char *shard1[] = {"layer.0.a", "layer.0.b"};
static const char *shard2[] = {"layer.1.a", "layer.1.b", "lm_head"};

static const char *good_index =
    "{\"metadata\":{\"total_size\":9},\"weight_map\":{"
    "\"layer.0.a\":\"model-00001-of-00002.safetensors\","
    "\"layer.1.a\":\"model-00002-of-00002.safetensors\","
    "\"layer.0.b\":\"model-00001-of-00002.safetensors\","
    "\"lm_head\":\"model-00002-of-00002.safetensors\","
    "\"layer.1.b\":\"model-00002-of-00002.safetensors\"}}";

static char *make_sharded(wna16_context_t *ctx, const char *tag)
{
    char *dir = stt_tempdir(tag);
    TU_CHECK(stt_write_text(dir, "config.json", config_text) == 0);
    write_shard(ctx, dir, "model-00001-of-00002.safetensors", shard1, 2);
    write_shard(ctx, dir, "model-00002-of-00002.safetensors", shard2, 3);
    TU_CHECK(stt_write_text(dir, "model.safetensors.index.json",
                            good_index) == 0);
    return dir;
}

static void test_sharded(wna16_context_t *ctx)
{
    char *dir = make_sharded(ctx, "ckshard");
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    TU_OK(wna16_checkpoint_open(ctx, dir, &ck, &err), &err);
    if (ck) {
        TU_CHECK(wna16_checkpoint_tensor_count(ck) == 5);
        const wna16_tensor_t *a = wna16_checkpoint_find(ck, "layer.0.b");
        const wna16_tensor_t *b = wna16_checkpoint_find(ck, "lm_head");
        TU_CHECK(a && a->nbytes == 2 && memcmp(a->data, "bb", 2) == 0);
        TU_CHECK(b && b->nbytes == 3 && memcmp(b->data, "ccc", 3) == 0);
        /* shard order (sorted file names), then data-offset order */
        const char *order[] = {"layer.0.a", "layer.0.b", "layer.1.a",
                               "layer.1.b", "lm_head"};
        for (size_t i = 0; i < 5; i++) {
            const wna16_tensor_t *t = wna16_checkpoint_tensor_at(ck, i);
            TU_CHECK(t && strcmp(t->name, order[i]) == 0);
        }
        const wna16_model_config_t *c = wna16_checkpoint_config(ck);
        TU_CHECK(c && c->hidden_size == 64 && c->moe_intermediate_size == 32 &&
                 c->num_experts == 4 && c->num_hidden_layers == 2);
        TU_CHECK(c && strcmp(c->torch_dtype, "bfloat16") == 0 &&
                 c->format_name[0] == '\0' && c->bits == 0);
        wna16_checkpoint_close(ck);
    }
    stt_rmtree(dir);
    free(dir);
}

/* Every allocation failure while opening a sharded checkpoint is ENOMEM
 * and frees everything. */
static void test_alloc_failures(wna16_context_t *plain)
{
    char *dir = make_sharded(plain, "ckalloc");
    stt_alloc_t al;
    stt_alloc_init(&al);
    wna16_context_t *ctx = stt_alloc_context(&al);
    long base = al.live;
    int failures = 0;
    wna16_status_t s = WNA16_ENOMEM;
    for (long n = 0; n < 10000 && s != WNA16_OK; n++) {
        wna16_error_t err;
        wna16_checkpoint_t *ck = NULL;
        al.countdown = n;
        s = wna16_checkpoint_open(ctx, dir, &ck, &err);
        al.countdown = -1;
        if (s == WNA16_OK) {
            TU_CHECK(wna16_checkpoint_tensor_count(ck) == 5);
            wna16_checkpoint_close(ck);
        } else {
            failures++;
            STT_EXPECT_ERR(s, &err, WNA16_ENOMEM, "out of memory");
        }
        TU_CHECK_MSG(al.live == base, "failing at %ld: %ld blocks leaked", n,
                     al.live - base);
    }
    TU_CHECK(s == WNA16_OK && failures > 5);
    TU_CHECK(al.size_mismatch == 0);
    wna16_context_destroy(ctx);
    TU_CHECK(al.live == 0);
    stt_rmtree(dir);
    free(dir);
}

typedef struct index_case {
    const char *index;
    wna16_status_t status;
    const char *needle;
} index_case_t;

#define S1 "\"model-00001-of-00002.safetensors\""
#define S2 "\"model-00002-of-00002.safetensors\""

static const index_case_t index_cases[] = {
    /* lm_head is in shard 2 but the index leaves it out */
    {"{\"weight_map\":{\"layer.0.a\":" S1 ",\"layer.0.b\":" S1
     ",\"layer.1.a\":" S2 ",\"layer.1.b\":" S2 "}}",
     WNA16_EFORMAT, "tensor 'lm_head' of shard "
     "'model-00002-of-00002.safetensors' is not listed in the index"},
    /* the index lists a tensor no shard holds */
    {"{\"weight_map\":{\"layer.0.a\":" S1 ",\"layer.0.b\":" S1
     ",\"layer.1.a\":" S2 ",\"layer.1.b\":" S2 ",\"lm_head\":" S2
     ",\"ghost\":" S1 "}}",
     WNA16_EFORMAT, "tensor 'ghost' is listed in shard "
     "'model-00001-of-00002.safetensors', which does not hold it"},
    /* a tensor placed in the wrong shard */
    {"{\"weight_map\":{\"layer.0.a\":" S2 ",\"layer.0.b\":" S1
     ",\"layer.1.a\":" S2 ",\"layer.1.b\":" S2 ",\"lm_head\":" S2 "}}",
     WNA16_EFORMAT, "tensor 'layer.0.a' is listed in shard "
     "'model-00002-of-00002.safetensors'"},
    /* a shard that does not exist */
    {"{\"weight_map\":{\"layer.0.a\":\"model-00003-of-00003.safetensors\"}}",
     WNA16_EIO, "model-00003-of-00003.safetensors: cannot open"},
    {"{\"weight_map\":{\"x\":\"../model-00001-of-00002.safetensors\"}}",
     WNA16_EFORMAT, "$.weight_map.x: shard "
     "'../model-00001-of-00002.safetensors' is not a plain file name"},
    {"{\"weight_map\":{\"x\":\"sub/model.safetensors\"}}", WNA16_EFORMAT,
     "is not a plain file name"},
    {"{\"weight_map\":{\"x\":\"/etc/passwd\"}}", WNA16_EFORMAT,
     "is not a plain file name"},
    {"{\"weight_map\":{\"x\":\"..\"}}", WNA16_EFORMAT, "not a plain file"},
    {"{\"weight_map\":{\"x\":\"\"}}", WNA16_EFORMAT, "not a plain file"},
    {"{\"weight_map\":{\"x\":3}}", WNA16_EFORMAT,
     "$.weight_map.x: expected a shard file name"},
    {"{\"weight_map\":{\"layer.0.a\":" S1 ",\"layer.0.a\":" S1 "}}",
     WNA16_EFORMAT, "$.weight_map: duplicate tensor 'layer.0.a'"},
    {"{\"metadata\":{}}", WNA16_EFORMAT, "$.weight_map: missing"},
    {"{\"weight_map\":[]}", WNA16_EFORMAT, "$.weight_map: expected an object"},
    {"{\"metadata\":1,\"weight_map\":{}}", WNA16_EFORMAT,
     "$.metadata: expected an object"},
    {"[1]", WNA16_EFORMAT, "$: expected an object"},
    {"{\"weight_map\":{}", WNA16_EFORMAT, "not valid JSON"},
    {"{\"weight_map\":{}} x", WNA16_EFORMAT, "bytes after the value"},
};

static void test_index_errors(wna16_context_t *ctx)
{
    char *dir = make_sharded(ctx, "ckindex");
    char *index = stt_path(dir, "model.safetensors.index.json");
    for (size_t i = 0; i < sizeof index_cases / sizeof index_cases[0]; i++) {
        const index_case_t *c = &index_cases[i];
        TU_CHECK(stt_write_text(dir, "model.safetensors.index.json",
                                c->index) == 0);
        wna16_error_t err;
        wna16_checkpoint_t *ck = (wna16_checkpoint_t *)1;
        STT_EXPECT_ERR(wna16_checkpoint_open(ctx, dir, &ck, &err), &err,
                       c->status, c->needle);
        TU_CHECK(ck == NULL);
    }
    /* a tensor held by two shards: the index can list it for only one */
    const char *dup[] = {"layer.0.a", "layer.0.b", "lm_head"};
    write_shard(ctx, dir, "model-00001-of-00002.safetensors", dup, 3);
    TU_CHECK(stt_write_text(dir, "model.safetensors.index.json",
                            good_index) == 0);
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    STT_EXPECT_ERR(wna16_checkpoint_open(ctx, dir, &ck, &err), &err,
                   WNA16_EFORMAT, "tensor 'lm_head' of shard "
                   "'model-00001-of-00002.safetensors' is listed for another "
                   "shard");
    /* an invalid shard is reported with its own file name */
    char *bad = stt_path(dir, "model-00002-of-00002.safetensors");
    TU_CHECK(tu_write_file(bad, "\x04\0\0\0\0\0\0\0{}x ", 12) == 0);
    TU_CHECK(stt_write_text(dir, "model.safetensors.index.json",
                            "{\"weight_map\":{}}") == 0);
    /* an empty weight_map names no shard: nothing to open, no tensors */
    TU_OK(wna16_checkpoint_open(ctx, dir, &ck, &err), &err);
    TU_CHECK(ck && wna16_checkpoint_tensor_count(ck) == 0);
    wna16_checkpoint_close(ck);
    TU_CHECK(stt_write_text(dir, "model.safetensors.index.json",
                            "{\"weight_map\":{\"a\":"
                            "\"model-00002-of-00002.safetensors\"}}") == 0);
    STT_EXPECT_ERR(wna16_checkpoint_open(ctx, dir, &ck, &err), &err,
                   WNA16_EFORMAT, "model-00002-of-00002.safetensors: header "
                   "has trailing bytes");
    free(bad);
    stt_rmtree(dir);
    free(dir);
    free(index);
}

static void test_layout_errors(wna16_context_t *ctx)
{
    wna16_error_t err;
    wna16_checkpoint_t *ck = NULL;
    char *dir = stt_tempdir("cklayout");
    STT_EXPECT_ERR(wna16_checkpoint_open(ctx, dir, &ck, &err), &err,
                   WNA16_ENOTFOUND, "no config.json");
    TU_CHECK(stt_write_text(dir, "config.json", config_text) == 0);
    STT_EXPECT_ERR(wna16_checkpoint_open(ctx, dir, &ck, &err), &err,
                   WNA16_ENOTFOUND, "neither model.safetensors nor "
                   "model.safetensors.index.json");
    /* model.safetensors wins over an index when both are present */
    write_shard(ctx, dir, "model.safetensors", shard1, 2);
    TU_CHECK(stt_write_text(dir, "model.safetensors.index.json", "junk") == 0);
    TU_OK(wna16_checkpoint_open(ctx, dir, &ck, &err), &err);
    TU_CHECK(ck && wna16_checkpoint_tensor_count(ck) == 2 &&
             wna16_checkpoint_config(ck) != NULL);
    wna16_checkpoint_close(ck);
    /* a bad config.json fails the open */
    TU_CHECK(stt_write_text(dir, "config.json", "{\"hidden_size\":\"x\"}") == 0);
    STT_EXPECT_ERR(wna16_checkpoint_open(ctx, dir, &ck, &err), &err,
                   WNA16_EFORMAT, "config.json: $.hidden_size: expected an "
                   "integer");
    char *missing = stt_path(dir, "missing");
    STT_EXPECT_ERR(wna16_checkpoint_open(ctx, missing, &ck, &err), &err,
                   WNA16_ENOTFOUND, "cannot open checkpoint");
    STT_EXPECT_ERR(wna16_checkpoint_open(ctx, NULL, &ck, &err), &err,
                   WNA16_EINVAL, NULL);
    /* a config.json that is a directory */
    char *cfg = stt_path(dir, "config.json");
    unlink(cfg);
    TU_CHECK(mkdir(cfg, 0700) == 0);
    STT_EXPECT_ERR(wna16_checkpoint_open(ctx, dir, &ck, &err), &err, WNA16_EIO,
                   "not a regular file");
    rmdir(cfg);
    free(cfg);
    free(missing);
    stt_rmtree(dir);
    free(dir);
}

/* ---- config.json parsing -------------------------------------------------- */

static wna16_status_t load_text(const char *dir, const char *text,
                                wna16_model_config_t *c, wna16_error_t *err)
{
    TU_CHECK(stt_write_text(dir, "config.json", text) == 0);
    char *p = stt_path(dir, "config.json");
    wna16_status_t s = wna16_model_config_load(p, c, err);
    free(p);
    return s;
}

static void test_config_formats(const char *dir)
{
    wna16_model_config_t c;
    wna16_error_t err;

    /* compressed-tensors, group strategy with act order */
    TU_OK(load_text(dir,
        "{\"model_type\":\"qwen3_moe\",\"hidden_size\":2048,"
        "\"moe_intermediate_size\":768,\"num_experts\":128,"
        "\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
        "\"format\":\"pack-quantized\",\"config_groups\":{\"group_0\":{"
        "\"targets\":[\"Linear\"],\"weights\":{\"num_bits\":4,"
        "\"type\":\"int\",\"symmetric\":true,\"strategy\":\"group\","
        "\"group_size\":128,\"actorder\":\"group\",\"dynamic\":false}},"
        "\"group_1\":{\"weights\":{\"num_bits\":8}}},\"ignore\":[\"lm_head\"]}}",
        &c, &err), &err);
    TU_CHECK(strcmp(c.format_name, "compressed_tensors") == 0);
    TU_CHECK(strcmp(c.quant_method, "compressed-tensors") == 0);
    TU_CHECK(c.bits == 4 && c.group_size == 128);
    TU_CHECK(c.has_sym && c.sym && strcmp(c.actorder, "group") == 0);
    TU_CHECK(c.desc_act && !c.has_zero_point);
    TU_CHECK(c.hidden_size == 2048 && c.moe_intermediate_size == 768 &&
             c.num_experts == 128);

    /* channel strategy, asymmetric, actorder null */
    TU_OK(load_text(dir,
        "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
        "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":8,"
        "\"symmetric\":false,\"strategy\":\"channel\",\"group_size\":null,"
        "\"actorder\":null}}}}}", &c, &err), &err);
    TU_CHECK(c.bits == 8 && c.group_size == -1);
    TU_CHECK(c.has_sym && !c.sym && c.actorder[0] == '\0' && !c.desc_act);

    /* actorder "weight" (static reorder: no g_idx at run time), mixed case */
    TU_OK(load_text(dir,
        "{\"quantization_config\":{\"quant_method\":\"Compressed-Tensors\","
        "\"config_groups\":{\"g\":{\"weights\":{\"num_bits\":4,"
        "\"strategy\":\"group\",\"group_size\":32,\"actorder\":\"WEIGHT\"}}}}}",
        &c, &err), &err);
    TU_CHECK(strcmp(c.actorder, "weight") == 0 && !c.desc_act &&
             c.group_size == 32 && !c.has_sym);
    TU_CHECK(strcmp(c.format_name, "compressed_tensors") == 0);

    /* legacy boolean actorder */
    TU_OK(load_text(dir,
        "{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
        "\"config_groups\":{\"g\":{\"weights\":{\"actorder\":true}}}}}",
        &c, &err), &err);
    TU_CHECK(strcmp(c.actorder, "group") == 0 && c.desc_act);

    /* moe_wna16 */
    TU_OK(load_text(dir,
        "{\"model_type\":\"deepseek_v3\",\"hidden_size\":7168,"
        "\"moe_intermediate_size\":2048,\"n_routed_experts\":256,"
        "\"num_experts_per_tok\":8,\"num_hidden_layers\":61,"
        "\"quantization_config\":{\"quant_method\":\"moe_wna16\",\"bits\":4,"
        "\"group_size\":64,\"has_zp\":true,\"linear_quant_method\":\"awq\","
        "\"lm_head\":false,\"modules_to_not_convert\":null}}", &c, &err), &err);
    TU_CHECK(strcmp(c.format_name, "moe_wna16") == 0);
    TU_CHECK(c.bits == 4 && c.group_size == 64);
    TU_CHECK(c.has_zero_point && c.zero_point);
    TU_CHECK(strcmp(c.linear_quant_method, "awq") == 0);
    TU_CHECK(c.num_experts == 256 && c.num_experts_per_tok == 8 &&
             c.num_hidden_layers == 61);

    /* AutoAWQ spellings */
    TU_OK(load_text(dir,
        "{\"quantization_config\":{\"quant_method\":\"awq\",\"w_bit\":4,"
        "\"q_group_size\":64,\"zero_point\":false,\"version\":\"gemv\"}}",
        &c, &err), &err);
    TU_CHECK(strcmp(c.format_name, "awq") == 0 && c.bits == 4 &&
             c.group_size == 64 && c.has_zero_point && !c.zero_point &&
             strcmp(c.version, "gemv") == 0);

    /* fallbacks: intermediate_size, num_local_experts; dtype spelling */
    TU_OK(load_text(dir,
        "{\"intermediate_size\":14336,\"num_local_experts\":8,"
        "\"moe_intermediate_size\":null,\"dtype\":\"bfloat16\"}", &c, &err),
        &err);
    TU_CHECK(c.moe_intermediate_size == 14336 && c.num_experts == 8);
    TU_CHECK(strcmp(c.torch_dtype, "bfloat16") == 0);
    TU_CHECK(c.quant_method[0] == '\0' && c.format_name[0] == '\0');
    TU_OK(load_text(dir,
        "{\"moe_intermediate_size\":1,\"intermediate_size\":2,"
        "\"num_experts\":3,\"num_local_experts\":4}", &c, &err), &err);
    TU_CHECK(c.moe_intermediate_size == 1 && c.num_experts == 3);

    /* an unknown method is not an error here; its keys are not read */
    TU_OK(load_text(dir,
        "{\"quantization_config\":{\"quant_method\":\"fp8\",\"bits\":\"x\"}}",
        &c, &err), &err);
    TU_CHECK(strcmp(c.quant_method, "fp8") == 0 && c.format_name[0] == '\0');
    /* GPTQ without sym: has_sym says so */
    TU_OK(load_text(dir,
        "{\"quantization_config\":{\"quant_method\":\"GPTQ\",\"bits\":8,"
        "\"group_size\":-1}}", &c, &err), &err);
    TU_CHECK(strcmp(c.format_name, "gptq") == 0 && c.bits == 8 &&
             c.group_size == -1 && !c.has_sym && !c.desc_act);
    /* strings exactly as long as the fields allow */
    TU_OK(load_text(dir, "{\"torch_dtype\":\"123456789012345\"}", &c, &err),
          &err);
    TU_CHECK(strlen(c.torch_dtype) == 15);
}

typedef struct bad_config {
    const char *text;
    const char *needle; /* after "<path>: " */
} bad_config_t;

static const bad_config_t bad_configs[] = {
    {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":\"4\"}}",
     "$.quantization_config.bits: expected an integer"},
    {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":4.5}}",
     "$.quantization_config.bits: expected an integer"},
    {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"bits\":-4}}",
     "$.quantization_config.bits: expected a non-negative integer"},
    {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"group_size\":"
     "1e10}}", "$.quantization_config.group_size: expected an integer"},
    {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"desc_act\":"
     "\"false\"}}", "$.quantization_config.desc_act: expected true or false"},
    {"{\"quantization_config\":{\"quant_method\":\"gptq\",\"sym\":1}}",
     "$.quantization_config.sym: expected true or false"},
    {"{\"quantization_config\":{\"quant_method\":\"awq\",\"w_bit\":[4]}}",
     "$.quantization_config.w_bit: expected an integer"},
    {"{\"quantization_config\":{\"quant_method\":\"awq\",\"version\":1}}",
     "$.quantization_config.version: expected a string"},
    {"{\"quantization_config\":{\"quant_method\":\"moe_wna16\",\"has_zp\":"
     "\"yes\"}}", "$.quantization_config.has_zp: expected true or false"},
    {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
     "\"config_groups\":{\"group_0\":{\"weights\":{\"num_bits\":\"4\"}}}}}",
     "$.quantization_config.config_groups.group_0.weights.num_bits: "
     "expected an integer"},
    {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
     "\"config_groups\":{\"g\":{\"weights\":{\"actorder\":3}}}}}",
     "$.quantization_config.config_groups.g.weights.actorder: expected a "
     "string or null"},
    {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
     "\"config_groups\":{\"g\":{\"weights\":{\"actorder\":"
     "\"a-very-long-actorder\"}}}}}",
     "$.quantization_config.config_groups.g.weights.actorder: string of 20 "
     "bytes is longer than the 15 allowed"},
    {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
     "\"config_groups\":{\"g\":[]}}}",
     "$.quantization_config.config_groups.g: expected an object"},
    {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
     "\"config_groups\":{\"g\":{\"weights\":4}}}}",
     "$.quantization_config.config_groups.g.weights: expected an object"},
    {"{\"quantization_config\":{\"quant_method\":\"compressed-tensors\","
     "\"config_groups\":[]}}",
     "$.quantization_config.config_groups: expected an object"},
    {"{\"quantization_config\":\"gptq\"}",
     "$.quantization_config: expected an object"},
    {"{\"quantization_config\":{\"quant_method\":4}}",
     "$.quantization_config.quant_method: expected a string"},
    {"{\"quantization_config\":{\"quant_method\":"
     "\"a-quantization-method-name-of-40-bytes\"}}",
     "$.quantization_config.quant_method: string of 38 bytes is longer than "
     "the 31 allowed"},
    {"{\"hidden_size\":1.5}", "$.hidden_size: expected an integer"},
    {"{\"hidden_size\":-1}", "$.hidden_size: expected a non-negative integer"},
    {"{\"hidden_size\":3000000000}", "$.hidden_size: expected an integer"},
    {"{\"hidden_size\":true}", "$.hidden_size: expected an integer"},
    {"{\"num_experts\":{}}", "$.num_experts: expected an integer"},
    {"{\"num_local_experts\":\"8\"}", "$.num_local_experts: expected an integer"},
    {"{\"model_type\":[]}", "$.model_type: expected a string"},
    {"{\"model_type\":\"" /* 64 bytes: one too many */
     "0123456789012345678901234567890123456789012345678901234567890123\"}",
     "$.model_type: string of 64 bytes is longer than the 63 allowed"},
    {"{\"torch_dtype\":\"1234567890123456\"}",
     "$.torch_dtype: string of 16 bytes is longer than the 15 allowed"},
    {"{\"hidden_size\":1,\"hidden_size\":2}", "$.hidden_size: duplicate key"},
    {"[]", "$: expected an object"},
    {"{\"a\":1} {}", "not valid JSON (bytes after the value)"},
    {"{\"a\":", "not valid JSON"},
    {"", "not valid JSON"},
    /* what cJSON would take and JSON does not (base/json_text.c) */
    {"{\"a\":\x01" "1}", "not valid JSON: byte 5 (0x01) is not valid in "
     "JSON text"},
    {"{\"a\":\f1}", "not valid JSON: byte 5 (0x0c) is not valid"},
    {"{\"a\":\"x\ty\"}", "not valid JSON: byte 7 (0x09) is not valid"},
    {"{\"a\":\"\xff\"}", "not valid JSON: byte 6 (0xff) is not valid"},
    {"{\"a\":01}", "not valid JSON: byte 5: malformed JSON number"},
    {"{\"model_type\":\"a\\u0000b\"}",
     "not valid JSON: byte 16: \\u0000 is not allowed"},
};

static void test_config_errors(const char *dir)
{
    char *path = stt_path(dir, "config.json");
    for (size_t i = 0; i < sizeof bad_configs / sizeof bad_configs[0]; i++) {
        wna16_model_config_t c;
        memset(&c, 0x5a, sizeof c);
        wna16_error_t err;
        wna16_status_t s = load_text(dir, bad_configs[i].text, &c, &err);
        STT_EXPECT_ERR(s, &err, WNA16_EFORMAT, bad_configs[i].needle);
        TU_CHECK_MSG(strncmp(err.message, path, strlen(path)) == 0,
                     "%s", err.message);
        TU_CHECK(c.hidden_size == 0 && c.format_name[0] == '\0');
    }
    /* the message from the documentation, exactly */
    wna16_model_config_t c;
    wna16_error_t err;
    char want[4200];
    load_text(dir, "{\"quantization_config\":{\"quant_method\":\"gptq\","
                   "\"bits\":\"4\"}}", &c, &err);
    snprintf(want, sizeof want, "%s: $.quantization_config.bits: expected an "
             "integer", path);
    TU_CHECK_MSG(strcmp(err.message, want) == 0, "%s", err.message);
    /* file errors */
    char *missing = stt_path(dir, "missing.json");
    STT_EXPECT_ERR(wna16_model_config_load(missing, &c, &err), &err,
                   WNA16_ENOTFOUND, "missing.json: cannot open");
    STT_EXPECT_ERR(wna16_model_config_load(dir, &c, &err), &err, WNA16_EIO,
                   "not a regular file");
    STT_EXPECT_ERR(wna16_model_config_load(NULL, &c, &err), &err,
                   WNA16_EINVAL, NULL);
    char *fifo = stt_path(dir, "fifo.json");
    TU_CHECK(mkfifo(fifo, 0600) == 0);
    STT_EXPECT_ERR(wna16_model_config_load(fifo, &c, &err), &err, WNA16_EIO,
                   "not a regular file");
    unlink(fifo);
    free(fifo);
    free(missing);
    free(path);
}

int main(void)
{
    wna16_context_t *ctx = tu_context();
    test_golden(ctx);
    test_sharded(ctx);
    test_alloc_failures(ctx);
    test_index_errors(ctx);
    test_layout_errors(ctx);
    char *dir = stt_tempdir("ckconfig");
    test_config_formats(dir);
    test_config_errors(dir);
    stt_rmtree(dir);
    free(dir);
    wna16_context_destroy(ctx);
    return tu_finish("test_checkpoint");
}
