/*
 * checkpoint.c - Hugging Face checkpoints: a directory holding config.json
 * and either model.safetensors or model.safetensors.index.json plus the
 * shards it names, or a lone .safetensors file. Every shard is opened and
 * validated by the safetensors reader, and the index is cross-checked
 * against the shards in both directions (a tensor the index places in a
 * shard must be there; a tensor in a shard must be listed for that shard)
 * because repacking a checkpoint with a silently missing or shadowed
 * tensor would produce a wrong model, not an error. config.json is reduced
 * to wna16_model_config_t: the model dimensions and the quantization
 * settings of GPTQ, AWQ, compressed-tensors and MoeWNA16 checkpoints, with
 * the key spellings real checkpoints use. Unknown keys are ignored (real
 * configs carry dozens), but the keys read are type-checked and a wrong
 * type is reported with the file and its JSON path; a JSON null counts as
 * absent, as Hugging Face writes null for unset options.
 */
#define _POSIX_C_SOURCE 200809L
#include "base/base.h"
#include "base/json_text.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* config.json and index files are small; anything bigger is not one. */
#define CK_MAX_JSON_FILE ((size_t)64 * 1024 * 1024)

struct wna16_checkpoint {
    wna16_context_t *ctx;
    w16_arena_t arena;             /* the tables below */
    bool has_config;
    wna16_model_config_t config;
    wna16_safetensors_t **shards;
    size_t nshards;
    const wna16_tensor_t **tensors; /* shard order, then data-offset order */
    size_t count;
};

/* ---- reading small JSON files -------------------------------------------- */

static wna16_status_t read_fd(int fd, const char *path, char *buf,
                              size_t size, size_t *got, wna16_error_t *err)
{
    *got = 0;
    while (*got < size) {
        ssize_t k = read(fd, buf + *got, size - *got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return w16_err(err, WNA16_EIO, "%s: read failed: %s", path,
                           strerror(errno));
        if (k == 0)
            break; /* shrank while we read: parse what is there */
        *got += (size_t)k;
    }
    return WNA16_OK;
}

/* Reads a whole regular file (NUL-terminated, w16_free with *cap). */
static wna16_status_t read_text(wna16_context_t *ctx, const char *path,
                                char **out, size_t *len, size_t *cap,
                                wna16_error_t *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return w16_err(err, errno == ENOENT ? WNA16_ENOTFOUND : WNA16_EIO,
                       "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    wna16_status_t s = WNA16_OK;
    if (fstat(fd, &sb) != 0)
        s = w16_err(err, WNA16_EIO, "%s: cannot stat: %s", path,
                    strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        s = w16_err(err, WNA16_EIO, "%s: not a regular file", path);
    else if ((uint64_t)sb.st_size > CK_MAX_JSON_FILE)
        s = w16_err(err, WNA16_ELIMIT, "%s: %lld bytes is too large for a "
                    "JSON file (limit %zu)", path, (long long)sb.st_size,
                    CK_MAX_JSON_FILE);
    if (s == WNA16_OK) {
        *cap = (size_t)sb.st_size + 1;
        *out = w16_alloc(ctx, *cap);
        if (!*out)
            s = w16_err_nomem(err, "reading a JSON file");
    }
    if (s == WNA16_OK)
        s = read_fd(fd, path, *out, *cap - 1, len, err);
    if (s == WNA16_OK)
        (*out)[*len] = '\0';
    else if (*out) {
        w16_free(ctx, *out, *cap);
        *out = NULL;
    }
    close(fd);
    return s;
}

/* Parses JSON text that must hold one object and nothing but whitespace
 * after it. */
static wna16_status_t parse_object(const char *path, const char *text,
                                   size_t len, cJSON **out,
                                   wna16_error_t *err)
{
    *out = NULL;
    size_t at = 0;
    char why[96];
    w16_json_fault_t f = w16_json_text_check(text, len, &at);
    if (f != W16_JSON_OK)
        return w16_err(err, WNA16_EFORMAT, "%s: not valid JSON: %s", path,
                       w16_json_fault_str(f, text, at, why, sizeof why));
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!*out)
        return w16_err(err, WNA16_EFORMAT, "%s: not valid JSON", path);
    bool trailing = !end || end < text || end > text + len;
    for (const char *q = end; !trailing && q < text + len; q++)
        trailing = !(*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r');
    if (trailing || !cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return w16_err(err, WNA16_EFORMAT, trailing
                       ? "%s: not valid JSON (bytes after the value)"
                       : "%s: $: expected an object", path);
    }
    return WNA16_OK;
}

static wna16_status_t load_json(wna16_context_t *ctx, const char *path,
                                cJSON **out, wna16_error_t *err)
{
    char *text;
    size_t len = 0, cap = 0;
    wna16_status_t s = read_text(ctx, path, &text, &len, &cap, err);
    if (s != WNA16_OK)
        return s;
    s = parse_object(path, text, len, out, err);
    w16_free(ctx, text, cap);
    return s;
}

/* ---- typed config values ------------------------------------------------- */

/* Where a key lives, for messages: "<file>: <prefix>[.<group><suffix>].key".
 * group is a config group's name (untrusted, so never formatted into a
 * buffer of ours, only into the error record). */
typedef struct cfg_scope {
    const char *file;
    const char *prefix;
    const char *group;
    const char *suffix;
    wna16_error_t *err;
} cfg_scope_t;

static wna16_status_t cfg_err(const cfg_scope_t *sc, const char *key,
                              const char *what)
{
    return w16_err(sc->err, WNA16_EFORMAT, "%s: %s%s%s%s.%s: %s", sc->file,
                   sc->prefix, sc->group ? "." : "",
                   sc->group ? sc->group : "", sc->suffix ? sc->suffix : "",
                   key, what);
}

/* The value of `key` in obj; NULL when absent or JSON null. A key given
 * twice is an error: which one a reader honours is not defined. */
static wna16_status_t cfg_get(const cfg_scope_t *sc, const cJSON *obj,
                              const char *key, const cJSON **out)
{
    const cJSON *found = NULL;
    *out = NULL;
    for (const cJSON *c = obj->child; c; c = c->next) {
        if (!c->string || strcmp(c->string, key) != 0)
            continue;
        if (found)
            return cfg_err(sc, key, "duplicate key");
        found = c;
    }
    if (found && !cJSON_IsNull(found))
        *out = found;
    return WNA16_OK;
}

/* An integer in [min, INT32_MAX]; *present says whether it was given. */
static wna16_status_t cfg_int(const cfg_scope_t *sc, const cJSON *obj,
                              const char *key, int32_t min, int32_t *out,
                              bool *present)
{
    const cJSON *v;
    wna16_status_t s = cfg_get(sc, obj, key, &v);
    *present = v != NULL;
    if (s != WNA16_OK || !v)
        return s;
    double d = v->valuedouble;
    if (!cJSON_IsNumber(v) || !(d >= -2147483648.0 && d <= 2147483647.0) ||
        (double)(int32_t)d != d)
        return cfg_err(sc, key, "expected an integer");
    if (d < (double)min)
        return min == 0 ? cfg_err(sc, key, "expected a non-negative integer")
                        : cfg_err(sc, key, "integer out of range");
    *out = (int32_t)d;
    return WNA16_OK;
}

/* The first of `keys` (NULL-terminated) that is present. */
static wna16_status_t cfg_int_any(const cfg_scope_t *sc, const cJSON *obj,
                                  const char *const *keys, int32_t min,
                                  int32_t *out)
{
    bool present = false;
    for (; *keys && !present; keys++) {
        wna16_status_t s = cfg_int(sc, obj, *keys, min, out, &present);
        if (s != WNA16_OK)
            return s;
    }
    return WNA16_OK;
}

static wna16_status_t cfg_bool(const cfg_scope_t *sc, const cJSON *obj,
                               const char *key, bool *out, bool *present)
{
    const cJSON *v;
    wna16_status_t s = cfg_get(sc, obj, key, &v);
    if (present)
        *present = v != NULL;
    if (s != WNA16_OK || !v)
        return s;
    if (!cJSON_IsBool(v))
        return cfg_err(sc, key, "expected true or false");
    *out = cJSON_IsTrue(v);
    return WNA16_OK;
}

static wna16_status_t cfg_copy(const cfg_scope_t *sc, const char *key,
                               const char *value, char *dst, size_t cap)
{
    size_t n = strlen(value);
    if (n >= cap) {
        char what[96];
        snprintf(what, sizeof what, "string of %zu bytes is longer than the "
                 "%zu allowed", n, cap - 1);
        return cfg_err(sc, key, what);
    }
    memcpy(dst, value, n + 1);
    return WNA16_OK;
}

static wna16_status_t cfg_str(const cfg_scope_t *sc, const cJSON *obj,
                              const char *key, char *dst, size_t cap,
                              bool *present)
{
    const cJSON *v;
    wna16_status_t s = cfg_get(sc, obj, key, &v);
    if (present)
        *present = v != NULL;
    if (s != WNA16_OK || !v)
        return s;
    if (!cJSON_IsString(v) || !v->valuestring)
        return cfg_err(sc, key, "expected a string");
    return cfg_copy(sc, key, v->valuestring, dst, cap);
}

/* An object (or absent/null: *out = NULL). */
static wna16_status_t cfg_obj(const cfg_scope_t *sc, const cJSON *obj,
                              const char *key, const cJSON **out)
{
    wna16_status_t s = cfg_get(sc, obj, key, out);
    if (s == WNA16_OK && *out && !cJSON_IsObject(*out))
        return cfg_err(sc, key, "expected an object");
    return s;
}

static bool ascii_ieq(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char x = (*a >= 'A' && *a <= 'Z') ? (char)(*a + 32) : *a;
        char y = (*b >= 'A' && *b <= 'Z') ? (char)(*b + 32) : *b;
        if (x != y)
            return false;
    }
    return *a == *b;
}

/* ---- quantization_config, per method ------------------------------------- */

typedef wna16_status_t (*quant_parse_fn)(const cfg_scope_t *sc,
                                         const cJSON *q,
                                         wna16_model_config_t *out);

/* GPTQ (AutoGPTQ / GPTQModel): bits, group_size, desc_act, sym. */
static wna16_status_t parse_gptq(const cfg_scope_t *sc, const cJSON *q,
                                 wna16_model_config_t *out)
{
    bool p;
    wna16_status_t s = cfg_int(sc, q, "bits", 0, &out->bits, &p);
    if (s == WNA16_OK)
        s = cfg_int(sc, q, "group_size", INT32_MIN, &out->group_size, &p);
    if (s == WNA16_OK)
        s = cfg_bool(sc, q, "desc_act", &out->desc_act, NULL);
    if (s == WNA16_OK)
        s = cfg_bool(sc, q, "sym", &out->sym, &out->has_sym);
    return s;
}

/* AutoAWQ spells bits and group size two ways (w_bit, q_group_size). */
static wna16_status_t parse_awq(const cfg_scope_t *sc, const cJSON *q,
                                wna16_model_config_t *out)
{
    static const char *const bits[] = {"bits", "w_bit", NULL};
    static const char *const gs[] = {"group_size", "q_group_size", NULL};
    wna16_status_t s = cfg_int_any(sc, q, bits, 0, &out->bits);
    if (s == WNA16_OK)
        s = cfg_int_any(sc, q, gs, INT32_MIN, &out->group_size);
    if (s == WNA16_OK)
        s = cfg_bool(sc, q, "zero_point", &out->zero_point,
                     &out->has_zero_point);
    if (s == WNA16_OK)
        s = cfg_str(sc, q, "version", out->version, sizeof out->version,
                    NULL);
    return s;
}

/* MoeWNA16: its own bits/group_size/has_zp plus the layout of the linear
 * layers it was converted from. */
static wna16_status_t parse_moe_wna16(const cfg_scope_t *sc, const cJSON *q,
                                      wna16_model_config_t *out)
{
    bool p;
    wna16_status_t s = cfg_int(sc, q, "bits", 0, &out->bits, &p);
    if (s == WNA16_OK)
        s = cfg_int(sc, q, "group_size", INT32_MIN, &out->group_size, &p);
    if (s == WNA16_OK)
        s = cfg_bool(sc, q, "has_zp", &out->zero_point,
                     &out->has_zero_point);
    if (s == WNA16_OK)
        s = cfg_str(sc, q, "linear_quant_method", out->linear_quant_method,
                    sizeof out->linear_quant_method, NULL);
    return s;
}

/* compressed-tensors actorder: a string (any case), null, or a legacy
 * boolean (true = "group"), as the compressed-tensors validator accepts. */
static wna16_status_t parse_actorder(const cfg_scope_t *sc, const cJSON *w,
                                     wna16_model_config_t *out)
{
    const cJSON *v;
    wna16_status_t s = cfg_get(sc, w, "actorder", &v);
    if (s != WNA16_OK || !v)
        return s;
    if (cJSON_IsBool(v)) {
        strcpy(out->actorder, cJSON_IsTrue(v) ? "group" : "");
    } else if (cJSON_IsString(v) && v->valuestring) {
        s = cfg_copy(sc, "actorder", v->valuestring, out->actorder,
                     sizeof out->actorder);
        for (char *c = out->actorder; *c; c++)
            if (*c >= 'A' && *c <= 'Z')
                *c = (char)(*c + 32);
    } else {
        return cfg_err(sc, "actorder", "expected a string or null");
    }
    out->desc_act = strcmp(out->actorder, "group") == 0;
    return s;
}

/* One config group's "weights" quantization arguments. */
static wna16_status_t parse_ct_weights(const cfg_scope_t *sc, const cJSON *w,
                                       wna16_model_config_t *out)
{
    bool p, has_gs;
    int32_t gs = 0;
    char strategy[32] = "";
    wna16_status_t s = cfg_int(sc, w, "num_bits", 0, &out->bits, &p);
    if (s == WNA16_OK)
        s = cfg_int(sc, w, "group_size", INT32_MIN, &gs, &has_gs);
    if (s == WNA16_OK)
        s = cfg_str(sc, w, "strategy", strategy, sizeof strategy, NULL);
    if (s == WNA16_OK)
        s = cfg_bool(sc, w, "symmetric", &out->sym, &out->has_sym);
    if (s == WNA16_OK)
        s = parse_actorder(sc, w, out);
    if (s != WNA16_OK)
        return s;
    if (strcmp(strategy, "channel") == 0)
        out->group_size = -1;
    else if (has_gs)
        out->group_size = gs;
    return WNA16_OK;
}

/* compressed-tensors: the first config group describes the experts (MoE
 * checkpoints quantize all linear layers alike). */
static wna16_status_t parse_ct(const cfg_scope_t *sc, const cJSON *q,
                               wna16_model_config_t *out)
{
    const cJSON *groups;
    wna16_status_t s = cfg_obj(sc, q, "config_groups", &groups);
    if (s != WNA16_OK || !groups || !groups->child)
        return s;
    const cJSON *g = groups->child;
    const char *name = g->string ? g->string : "";
    cfg_scope_t gsc = {sc->file, "$.quantization_config.config_groups", NULL,
                       NULL, sc->err};
    if (!cJSON_IsObject(g))
        return cfg_err(&gsc, name, "expected an object");
    gsc.group = name;
    const cJSON *w;
    if ((s = cfg_obj(&gsc, g, "weights", &w)) != WNA16_OK || !w)
        return s;
    gsc.suffix = ".weights";
    return parse_ct_weights(&gsc, w, out);
}

/* quant_method -> the wna16 format spec and the parser of its keys. */
static const struct {
    const char *method;
    const char *format;
    quant_parse_fn parse;
} quant_methods[] = {
    {"gptq", "gptq", parse_gptq},
    {"awq", "awq", parse_awq},
    {"compressed-tensors", "compressed_tensors", parse_ct},
    {"moe_wna16", "moe_wna16", parse_moe_wna16},
};

static wna16_status_t parse_quant(const char *file, const cJSON *root,
                                  wna16_model_config_t *out,
                                  wna16_error_t *err)
{
    cfg_scope_t sc = {file, "$", NULL, NULL, err};
    const cJSON *q;
    bool p;
    wna16_status_t s = cfg_obj(&sc, root, "quantization_config", &q);
    if (s != WNA16_OK || !q)
        return s;
    sc.prefix = "$.quantization_config";
    s = cfg_str(&sc, q, "quant_method", out->quant_method,
                sizeof out->quant_method, &p);
    for (size_t i = 0; s == WNA16_OK && i < W16_ARRAY_LEN(quant_methods);
         i++) {
        if (!ascii_ieq(out->quant_method, quant_methods[i].method))
            continue;
        strcpy(out->format_name, quant_methods[i].format);
        return quant_methods[i].parse(&sc, q, out);
    }
    return s; /* other methods: not ours to judge here */
}

/* The model dimensions, with the alternative key names models use. */
static wna16_status_t parse_model(const char *file, const cJSON *root,
                                  wna16_model_config_t *out,
                                  wna16_error_t *err)
{
    static const char *const inter[] = {"moe_intermediate_size",
                                        "intermediate_size", NULL};
    static const char *const experts[] = {"num_experts", "num_local_experts",
                                          "n_routed_experts", NULL};
    static const char *const dtype[] = {"torch_dtype", "dtype", NULL};
    static const char *const hidden[] = {"hidden_size", NULL};
    static const char *const topk[] = {"num_experts_per_tok", NULL};
    static const char *const layers[] = {"num_hidden_layers", NULL};
    cfg_scope_t sc = {file, "$", NULL, NULL, err};
    bool p = false;
    wna16_status_t s = cfg_str(&sc, root, "model_type", out->model_type,
                               sizeof out->model_type, NULL);
    if (s == WNA16_OK)
        s = cfg_int_any(&sc, root, hidden, 0, &out->hidden_size);
    if (s == WNA16_OK)
        s = cfg_int_any(&sc, root, inter, 0, &out->moe_intermediate_size);
    if (s == WNA16_OK)
        s = cfg_int_any(&sc, root, experts, 0, &out->num_experts);
    if (s == WNA16_OK)
        s = cfg_int_any(&sc, root, topk, 0, &out->num_experts_per_tok);
    if (s == WNA16_OK)
        s = cfg_int_any(&sc, root, layers, 0, &out->num_hidden_layers);
    for (const char *const *k = dtype; s == WNA16_OK && *k && !p; k++)
        s = cfg_str(&sc, root, *k, out->torch_dtype, sizeof out->torch_dtype,
                    &p);
    return s;
}

static wna16_status_t config_load(wna16_context_t *ctx, const char *path,
                                  wna16_model_config_t *out,
                                  wna16_error_t *err)
{
    if (!path || !out)
        return w16_err(err, WNA16_EINVAL,
                       "wna16_model_config_load: path and out are required");
    memset(out, 0, sizeof *out);
    cJSON *root;
    wna16_status_t s = load_json(ctx, path, &root, err);
    if (s != WNA16_OK)
        return s;
    wna16_model_config_t c = {0};
    s = parse_model(path, root, &c, err);
    if (s == WNA16_OK)
        s = parse_quant(path, root, &c, err);
    cJSON_Delete(root);
    if (s == WNA16_OK)
        *out = c;
    return s;
}

wna16_status_t wna16_model_config_load(const char *path,
                                       wna16_model_config_t *out,
                                       wna16_error_t *err)
{
    return config_load(NULL, path, out, err);
}

/* ---- paths --------------------------------------------------------------- */

/* dir + "/" + name in b; false when out of memory. */
static bool join_path(w16_buf_t *b, const char *dir, const char *name)
{
    w16_buf_reset(b);
    w16_buf_puts(b, dir);
    if (b->len && b->data[b->len - 1] != '/')
        w16_buf_putc(b, '/');
    w16_buf_puts(b, name);
    return !b->failed;
}

/* 0: absent, 1: present, -1: stat failed for another reason (reported). */
static int path_exists(const char *path, wna16_error_t *err)
{
    struct stat sb;
    if (stat(path, &sb) == 0)
        return 1;
    if (errno == ENOENT || errno == ENOTDIR)
        return 0;
    w16_err(err, WNA16_EIO, "%s: cannot access: %s", path, strerror(errno));
    return -1;
}

/* A shard name from the index must be a plain file name in the checkpoint
 * directory: no path separators, no parent references. */
static bool shard_name_ok(const char *name)
{
    return *name && !strchr(name, '/') && !strchr(name, '\\') &&
           !strstr(name, "..");
}

/* ---- the checkpoint ------------------------------------------------------ */

static wna16_status_t add_shard(wna16_checkpoint_t *ck, const char *path,
                                wna16_error_t *err)
{
    wna16_safetensors_t *st;
    wna16_status_t s = wna16_safetensors_open(ck->ctx, path, &st, err);
    if (s == WNA16_OK)
        ck->shards[ck->nshards++] = st;
    return s;
}

typedef struct ck_entry {
    const char *name;  /* tensor name (in the index JSON) */
    const char *file;  /* shard file name (in the index JSON) */
    size_t shard;      /* index into the sorted shard list */
} ck_entry_t;

static int cmp_entry_name(const void *a, const void *b)
{
    return strcmp(((const ck_entry_t *)a)->name, ((const ck_entry_t *)b)->name);
}

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The sharded form, after the index has been reduced to entries: the
 * distinct shard files (sorted) and their cross-check. */
typedef struct ck_index {
    const char *path; /* of the index file, for messages */
    const char *dir;
    ck_entry_t *entries;
    size_t n;
    const char **files; /* distinct, sorted */
    size_t nfiles;
} ck_index_t;

/* Reads weight_map into ix->entries, checking types, names and
 * duplicates. Strings stay owned by the cJSON tree. */
static wna16_status_t index_entries(wna16_checkpoint_t *ck, const cJSON *root,
                                    ck_index_t *ix, wna16_error_t *err)
{
    cfg_scope_t sc = {ix->path, "$", NULL, NULL, err};
    const cJSON *map, *meta;
    wna16_status_t s = cfg_obj(&sc, root, "metadata", &meta);
    if (s == WNA16_OK)
        s = cfg_obj(&sc, root, "weight_map", &map);
    if (s != WNA16_OK)
        return s;
    if (!map)
        return w16_err(err, WNA16_EFORMAT, "%s: $.weight_map: missing",
                       ix->path);
    for (const cJSON *c = map->child; c; c = c->next)
        ix->n++;
    ix->entries = w16_arena_alloc(&ck->arena, ix->n * sizeof *ix->entries);
    ix->files = w16_arena_alloc(&ck->arena, ix->n * sizeof *ix->files);
    if (!ix->entries || !ix->files)
        return w16_err_nomem(err, "reading a checkpoint index");
    size_t i = 0;
    sc.prefix = "$.weight_map";
    for (const cJSON *c = map->child; c; c = c->next, i++) {
        const char *name = c->string ? c->string : "";
        if (!cJSON_IsString(c) || !c->valuestring)
            return cfg_err(&sc, name, "expected a shard file name");
        if (!shard_name_ok(c->valuestring))
            return w16_err(err, WNA16_EFORMAT, "%s: $.weight_map.%s: shard "
                           "'%s' is not a plain file name in the checkpoint "
                           "directory", ix->path, name, c->valuestring);
        ix->entries[i] = (ck_entry_t){name, c->valuestring, 0};
        ix->files[i] = c->valuestring;
    }
    qsort(ix->entries, ix->n, sizeof *ix->entries, cmp_entry_name);
    for (i = 1; i < ix->n; i++)
        if (strcmp(ix->entries[i - 1].name, ix->entries[i].name) == 0)
            return w16_err(err, WNA16_EFORMAT, "%s: $.weight_map: duplicate "
                           "tensor '%s'", ix->path, ix->entries[i].name);
    return WNA16_OK;
}

/* Sorts and deduplicates the shard file names; maps entries to them. */
static void index_files(ck_index_t *ix)
{
    qsort(ix->files, ix->n, sizeof *ix->files, cmp_str_ptr);
    for (size_t i = 0; i < ix->n; i++)
        if (!ix->nfiles || strcmp(ix->files[ix->nfiles - 1], ix->files[i]))
            ix->files[ix->nfiles++] = ix->files[i];
    for (size_t i = 0; i < ix->n; i++) {
        const char **f = bsearch(&ix->entries[i].file, ix->files, ix->nfiles,
                                 sizeof *ix->files, cmp_str_ptr);
        ix->entries[i].shard = (size_t)(f - ix->files); /* always found */
    }
}

static wna16_status_t open_shards(wna16_checkpoint_t *ck, const ck_index_t *ix,
                                  wna16_error_t *err)
{
    ck->shards = w16_arena_alloc(&ck->arena, ix->nfiles * sizeof *ck->shards);
    if (!ck->shards)
        return w16_err_nomem(err, "opening checkpoint shards");
    w16_buf_t b;
    w16_buf_init(&b, ck->ctx);
    wna16_status_t s = WNA16_OK;
    for (size_t i = 0; i < ix->nfiles && s == WNA16_OK; i++)
        s = join_path(&b, ix->dir, ix->files[i]) ? add_shard(ck, b.data, err)
                                                 : w16_err_nomem(err, "a path");
    w16_buf_free(&b);
    return s;
}

/* Both directions: every index entry is in its shard, and every tensor of
 * every shard is listed in the index for that shard. */
static wna16_status_t cross_check(const wna16_checkpoint_t *ck,
                                  const ck_index_t *ix, wna16_error_t *err)
{
    for (size_t i = 0; i < ix->n; i++) {
        const ck_entry_t *e = &ix->entries[i];
        if (!wna16_safetensors_find(ck->shards[e->shard], e->name))
            return w16_err(err, WNA16_EFORMAT, "%s: tensor '%s' is listed "
                           "in shard '%s', which does not hold it", ix->path,
                           e->name, e->file);
    }
    for (size_t sh = 0; sh < ck->nshards; sh++) {
        const wna16_safetensors_t *st = ck->shards[sh];
        for (size_t t = 0; t < wna16_safetensors_count(st); t++) {
            ck_entry_t key = {wna16_safetensors_at(st, t)->name, NULL, 0};
            const ck_entry_t *e = bsearch(&key, ix->entries, ix->n,
                                          sizeof *ix->entries, cmp_entry_name);
            if (!e || e->shard != sh)
                return w16_err(err, WNA16_EFORMAT, "%s: tensor '%s' of shard "
                               "'%s' is %s", ix->path, key.name,
                               ix->files[sh], e ? "listed for another shard"
                                                : "not listed in the index");
        }
    }
    return WNA16_OK;
}

static wna16_status_t open_index(wna16_checkpoint_t *ck, const char *dir,
                                 const char *index_path, wna16_error_t *err)
{
    cJSON *root;
    wna16_status_t s = load_json(ck->ctx, index_path, &root, err);
    if (s != WNA16_OK)
        return s;
    ck_index_t ix = {.path = index_path, .dir = dir};
    s = index_entries(ck, root, &ix, err);
    if (s == WNA16_OK) {
        index_files(&ix);
        s = open_shards(ck, &ix, err);
    }
    if (s == WNA16_OK)
        s = cross_check(ck, &ix, err);
    cJSON_Delete(root);
    return s;
}

/* Joins dir/name into b and says whether that path exists (1), does not
 * (0) or could not be checked (negative status, in err). */
static int probe(w16_buf_t *b, const char *dir, const char *name,
                 wna16_error_t *err)
{
    if (!join_path(b, dir, name))
        return w16_err_nomem(err, "building a path");
    int have = path_exists(b->data, err);
    return have < 0 ? WNA16_EIO : have;
}

static wna16_status_t open_single(wna16_checkpoint_t *ck, const char *path,
                                  wna16_error_t *err)
{
    ck->shards = w16_arena_alloc(&ck->arena, sizeof *ck->shards);
    if (!ck->shards)
        return w16_err_nomem(err, "opening a checkpoint");
    return add_shard(ck, path, err);
}

/* A directory: config.json, then model.safetensors (preferred, as
 * transformers does) or the index and its shards. */
static wna16_status_t open_dir(wna16_checkpoint_t *ck, const char *dir,
                               wna16_error_t *err)
{
    w16_buf_t b;
    w16_buf_init(&b, ck->ctx);
    wna16_status_t s;
    int have = probe(&b, dir, "config.json", err);
    if (have <= 0) {
        s = have < 0 ? (wna16_status_t)have
                     : w16_err(err, WNA16_ENOTFOUND, "%s: no config.json in "
                               "the checkpoint directory", dir);
        goto done;
    }
    if ((s = config_load(ck->ctx, b.data, &ck->config, err)) != WNA16_OK)
        goto done;
    ck->has_config = true;
    if ((have = probe(&b, dir, "model.safetensors", err)) != 0) {
        s = have < 0 ? (wna16_status_t)have : open_single(ck, b.data, err);
        goto done;
    }
    have = probe(&b, dir, "model.safetensors.index.json", err);
    if (have < 0)
        s = (wna16_status_t)have;
    else if (have == 0)
        s = w16_err(err, WNA16_ENOTFOUND, "%s: neither model.safetensors nor "
                    "model.safetensors.index.json in the checkpoint "
                    "directory", dir);
    else
        s = open_index(ck, dir, b.data, err);
done:
    w16_buf_free(&b);
    return s;
}

static int cmp_tensor_ptr(const void *a, const void *b)
{
    const wna16_tensor_t *x = *(const wna16_tensor_t *const *)a;
    const wna16_tensor_t *y = *(const wna16_tensor_t *const *)b;
    return strcmp(x->name, y->name);
}

/* The flat tensor table (shard order, then data-offset order). Names must
 * be unique across shards: the index cross-check implies it, but a sorted
 * copy makes it a property of the table whatever the source. */
static wna16_status_t build_table(wna16_checkpoint_t *ck, const char *path,
                                  wna16_error_t *err)
{
    size_t n = 0;
    for (size_t i = 0; i < ck->nshards; i++)
        n += wna16_safetensors_count(ck->shards[i]);
    ck->tensors = w16_arena_alloc(&ck->arena, n * sizeof *ck->tensors);
    const wna16_tensor_t **sorted = w16_calloc(ck->ctx, n, sizeof *sorted);
    if (!ck->tensors || !sorted) {
        w16_free(ck->ctx, sorted, n * sizeof *sorted);
        return w16_err_nomem(err, "indexing checkpoint tensors");
    }
    for (size_t i = 0; i < ck->nshards; i++)
        for (size_t t = 0; t < wna16_safetensors_count(ck->shards[i]); t++)
            ck->tensors[ck->count++] = wna16_safetensors_at(ck->shards[i], t);
    memcpy(sorted, ck->tensors, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, cmp_tensor_ptr);
    wna16_status_t s = WNA16_OK;
    for (size_t i = 1; i < n && s == WNA16_OK; i++)
        if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0)
            s = w16_err(err, WNA16_EFORMAT, "%s: tensor '%s' appears in "
                        "more than one shard", path, sorted[i]->name);
    w16_free(ck->ctx, sorted, n * sizeof *sorted);
    return s;
}

wna16_status_t wna16_checkpoint_open(wna16_context_t *ctx, const char *path,
                                     wna16_checkpoint_t **out,
                                     wna16_error_t *err)
{
    if (!out || !path)
        return w16_err(err, WNA16_EINVAL,
                       "wna16_checkpoint_open: path and out are required");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0)
        return w16_err(err, errno == ENOENT ? WNA16_ENOTFOUND : WNA16_EIO,
                       "%s: cannot open checkpoint: %s", path,
                       strerror(errno));
    wna16_checkpoint_t *ck = w16_calloc(ctx, 1, sizeof *ck);
    if (!ck)
        return w16_err_nomem(err, "opening a checkpoint");
    ck->ctx = ctx;
    w16_arena_init(&ck->arena, ctx);
    wna16_status_t s;
    if (S_ISDIR(sb.st_mode)) {
        s = open_dir(ck, path, err);
    } else {
        s = open_single(ck, path, err);
    }
    if (s == WNA16_OK)
        s = build_table(ck, path, err);
    if (s != WNA16_OK) {
        wna16_checkpoint_close(ck);
        return s;
    }
    *out = ck;
    return WNA16_OK;
}

void wna16_checkpoint_close(wna16_checkpoint_t *ck)
{
    if (!ck)
        return;
    for (size_t i = 0; i < ck->nshards; i++)
        wna16_safetensors_close(ck->shards[i]);
    w16_arena_free(&ck->arena);
    w16_free(ck->ctx, ck, sizeof *ck);
}

const wna16_model_config_t *
wna16_checkpoint_config(const wna16_checkpoint_t *ck)
{
    return ck && ck->has_config ? &ck->config : NULL;
}

size_t wna16_checkpoint_tensor_count(const wna16_checkpoint_t *ck)
{
    return ck ? ck->count : 0;
}

const wna16_tensor_t *wna16_checkpoint_tensor_at(const wna16_checkpoint_t *ck,
                                                 size_t index)
{
    return ck && index < ck->count ? ck->tensors[index] : NULL;
}

const wna16_tensor_t *wna16_checkpoint_find(const wna16_checkpoint_t *ck,
                                            const char *name)
{
    if (!ck || !name)
        return NULL;
    for (size_t i = 0; i < ck->nshards; i++) {
        const wna16_tensor_t *t = wna16_safetensors_find(ck->shards[i], name);
        if (t)
            return t;
    }
    return NULL;
}
