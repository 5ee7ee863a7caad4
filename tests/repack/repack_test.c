/*
 * repack_test.c - see repack_test.h. Checkpoints are built the way a
 * quantizer would write them: a logical layer encoded through the format
 * spec by the reference (so the bytes are the format's, whatever wna16's
 * repacker does with them), written with the library's safetensors writer,
 * with an index and config.json as Hugging Face lays them out.
 */
#define _POSIX_C_SOURCE 200809L
#include "repack_test.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void die(const char *what, const wna16_error_t *err)
{
    fprintf(stderr, "fixture: %s: %s\n", what, err ? err->message : "");
    exit(1);
}

/* ---- layers -------------------------------------------------------------- */

static float f16_exact(tu_rng_t *r, float lo, float hi)
{
    float v = lo + (hi - lo) * (float)(tu_rng_next(r) >> 40) / (float)(1 << 24);
    return wna16_f16_to_f32(wna16_f32_to_f16(v));
}

static void fill_operand(wna16_qweight_t *q, tu_rng_t *r, bool act_order)
{
    size_t nk = (size_t)q->E * q->N * q->K, ng = (size_t)q->E * q->G * q->N;
    for (size_t i = 0; i < nk; i++)
        q->codes[i] = (uint8_t)tu_rng_below(r, 1u << q->bits);
    for (size_t i = 0; i < ng; i++) {
        q->scales[i] = f16_exact(r, 0.001f, 0.02f);
        if (q->zeros)
            q->zeros[i] = (uint8_t)tu_rng_below(r, 1u << q->bits);
    }
    for (size_t i = 0; q->bias && i < (size_t)q->E * q->N; i++)
        q->bias[i] = f16_exact(r, -1.0f, 1.0f);
    if (!act_order)
        return;
    /* g_idx of a permutation: each group keeps group_size channels. */
    int32_t *perm = malloc(sizeof *perm * (size_t)q->K);
    for (int32_t e = 0; perm && e < q->E; e++) {
        for (int32_t k = 0; k < q->K; k++)
            perm[k] = k;
        for (int32_t k = q->K - 1; k > 0; k--) {
            int32_t j = (int32_t)tu_rng_below(r, (uint32_t)k + 1), t = perm[k];
            perm[k] = perm[j];
            perm[j] = t;
        }
        for (int32_t k = 0; k < q->K; k++)
            q->g_idx[(size_t)e * q->K + k] = perm[k] / q->group_size;
    }
    free(perm);
}

void rt_make_layer(wna16_qlayer_t *L, int32_t E, int32_t H, int32_t I,
                   int32_t bits, int32_t gs, bool zp, bool act_order,
                   bool bias, uint64_t seed)
{
    wna16_error_t err;
    memset(L, 0, sizeof *L);
    L->E = E;
    L->H = H;
    L->I = I;
    if (wna16_qweight_alloc(&L->w13, E, 2 * I, H, bits, gs, zp, act_order,
                            bias, &err) != WNA16_OK ||
        wna16_qweight_alloc(&L->w2, E, H, I, bits, gs, zp, act_order, bias,
                            &err) != WNA16_OK)
        die("allocating a layer", &err);
    tu_rng_t r;
    tu_rng_seed(&r, seed);
    fill_operand(&L->w13, &r, act_order);
    fill_operand(&L->w2, &r, act_order);
}

wna16_tensor_set_t *rt_encode(wna16_context_t *ctx, const char *name,
                              const wna16_qlayer_t *L, const char *prefix)
{
    wna16_error_t err;
    wna16_tensor_set_t *set = NULL;
    const wna16_spec_t *s = wna16_spec_find(ctx, 0, name);
    if (!s || wna16_tensor_set_create(ctx, &set, &err) != WNA16_OK)
        die(name, NULL);
    if (wna16_ref_encode(ctx, s, L, prefix, set, &err) != WNA16_OK) {
        TU_CHECK_MSG(false, "encode %s: %s", name, err.message);
        wna16_tensor_set_destroy(set);
        return NULL;
    }
    return set;
}

wna16_tensor_set_t *rt_encode_as_read(wna16_context_t *ctx, const char *format,
                                      const char *backend,
                                      const wna16_qlayer_t *L,
                                      const char *prefix)
{
    wna16_error_t err;
    wna16_tensor_set_t *ck = rt_encode(ctx, format, L, prefix);
    if (!ck)
        return NULL;
    const wna16_spec_t *f = wna16_spec_find(ctx, 0, format);
    wna16_quant_desc_t q = {L->w13.bits, L->w13.group_size,
                            L->w13.zeros != NULL, L->w13.g_idx != NULL,
                            L->w13.bias != NULL || L->w2.bias != NULL};
    wna16_qlayer_t read;
    wna16_tensor_set_t *out = NULL;
    if (wna16_ref_decode(ctx, f, ck, prefix, L->E, L->H, L->I, &q, &read,
                         &err) != WNA16_OK) {
        TU_CHECK_MSG(false, "decode %s: %s", format, err.message);
    } else {
        out = rt_encode(ctx, backend, &read, prefix);
        wna16_qlayer_free(&read);
    }
    wna16_tensor_set_destroy(ck);
    return out;
}

/* ---- checkpoints ----------------------------------------------------------- */

void rt_ckpt_init(rt_ckpt_t *c, wna16_context_t *ctx, int nshards)
{
    wna16_error_t err;
    memset(c, 0, sizeof *c);
    c->ctx = ctx;
    c->nshards = nshards;
    if (wna16_tensor_set_create(ctx, &c->owned, &err) != WNA16_OK)
        die("a tensor set", &err);
    for (int s = 0; s < nshards; s++)
        if (wna16_tensor_set_create(ctx, &c->shard[s], &err) != WNA16_OK)
            die("a tensor set", &err);
}

void rt_ckpt_free(rt_ckpt_t *c)
{
    for (int s = 0; s < c->nshards; s++)
        wna16_tensor_set_destroy(c->shard[s]);
    wna16_tensor_set_destroy(c->owned);
    memset(c, 0, sizeof *c);
}

/* Replaces the first occurrence of each from[i] in name by to[i]. */
static void rename_into(char *out, size_t n, const char *name,
                        const char *const *from, const char *const *to,
                        int nren)
{
    snprintf(out, n, "%s", name);
    for (int i = 0; i < nren; i++) {
        char *hit = strstr(out, from[i]);
        if (!hit)
            continue;
        char tail[512];
        snprintf(tail, sizeof tail, "%s", hit + strlen(from[i]));
        snprintf(hit, n - (size_t)(hit - out), "%s%s", to[i], tail);
    }
}

void rt_ckpt_add_set(rt_ckpt_t *c, int s, const wna16_tensor_set_t *set,
                     const char *const *from, const char *const *to, int nren,
                     const char *skip)
{
    wna16_error_t err;
    for (size_t i = 0; i < wna16_tensor_set_count(set); i++) {
        wna16_tensor_t t = *wna16_tensor_set_at(set, i);
        char name[512];
        rename_into(name, sizeof name, t.name, from, to, nren);
        if (skip && strcmp(name, skip) == 0)
            continue;
        t.name = name;
        int sh = s >= 0 ? s : (int)(i % (size_t)c->nshards);
        if (wna16_tensor_set_add_view(c->shard[sh], &t, &err) != WNA16_OK)
            die("adding a tensor", &err);
    }
}

const wna16_tensor_t *rt_ckpt_add_random(rt_ckpt_t *c, int s,
                                         const char *name, wna16_dtype_t dt,
                                         int64_t rows, int64_t cols,
                                         uint64_t seed)
{
    wna16_error_t err;
    wna16_tensor_t *t;
    int64_t shape[2] = {rows, cols};
    if (wna16_tensor_set_add_new(c->owned, name, dt, cols ? 2 : 1, shape, &t,
                                 &err) != WNA16_OK ||
        wna16_tensor_set_add_view(c->shard[s], t, &err) != WNA16_OK)
        die("adding a tensor", &err);
    tu_rng_t r;
    tu_rng_seed(&r, seed);
    for (size_t i = 0; i < t->nbytes; i++)
        ((uint8_t *)t->data)[i] = (uint8_t)tu_rng_next(&r);
    return t;
}

static void write_index(const rt_ckpt_t *c, const char *dir, char names[][64])
{
    char *path = rt_path(dir, "model.safetensors.index.json");
    FILE *f = fopen(path, "w");
    if (!f)
        die(path, NULL);
    fprintf(f, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    const char *sep = "";
    for (int s = 0; s < c->nshards; s++)
        for (size_t i = 0; i < wna16_tensor_set_count(c->shard[s]); i++) {
            fprintf(f, "%s\n  \"%s\": \"%s\"", sep,
                    wna16_tensor_set_at(c->shard[s], i)->name, names[s]);
            sep = ",";
        }
    fprintf(f, "\n}}\n");
    if (fclose(f) != 0)
        die(path, NULL);
    free(path);
}

void rt_ckpt_write(rt_ckpt_t *c, const char *dir)
{
    wna16_error_t err;
    char names[4][64];
    for (int s = 0; s < c->nshards; s++) {
        if (c->nshards == 1)
            snprintf(names[s], sizeof names[s], "model.safetensors");
        else
            snprintf(names[s], sizeof names[s],
                     "model-%05d-of-%05d.safetensors", s + 1, c->nshards);
        char *path = rt_path(dir, names[s]);
        static const char *const k[] = {"format"}, *const v[] = {"pt"};
        if (wna16_safetensors_write_set(c->ctx, path, c->shard[s], 1, k, v,
                                        &err) != WNA16_OK)
            die(path, &err);
        free(path);
    }
    if (c->nshards > 1)
        write_index(c, dir, names);
}

void rt_write_config(const char *dir, int32_t E, int32_t H, int32_t I,
                     int layers, const char *quant_json)
{
    char *path = rt_path(dir, "config.json");
    FILE *f = fopen(path, "w");
    if (!f)
        die(path, NULL);
    fprintf(f, "{\n  \"architectures\": [\"Qwen3MoeForCausalLM\"],\n"
               "  \"model_type\": \"qwen3_moe\",\n  \"hidden_size\": %d,\n"
               "  \"moe_intermediate_size\": %d,\n  \"num_experts\": %d,\n"
               "  \"num_experts_per_tok\": 2,\n  \"num_hidden_layers\": %d,\n"
               "  \"torch_dtype\": \"float16\",\n"
               "  \"quantization_config\": %s\n}\n", H, I, E, layers,
            quant_json);
    if (fclose(f) != 0)
        die(path, NULL);
    free(path);
}

/* ---- files ------------------------------------------------------------------ */

char *rt_path(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p)
        die("out of memory", NULL);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

char *rt_tempdir(const char *tag)
{
    const char *t = tu_tempdir(tag);
    char *p = malloc(strlen(t) + 1);
    if (!p)
        die("out of memory", NULL);
    strcpy(p, t);
    return p;
}

int rt_count_tmp(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return -1;
    for (struct dirent *e; (e = readdir(d));)
        n += strstr(e->d_name, ".tmp.") != NULL;
    closedir(d);
    return n;
}

void rt_rmtree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        for (struct dirent *e; (e = readdir(d));) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            char *p = rt_path(dir, e->d_name);
            struct stat st;
            if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
                rt_rmtree(p);
            else
                unlink(p);
            free(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* ---- checks ------------------------------------------------------------------ */

void rt_expect_err_at(const char *file, int line, wna16_status_t st,
                      const wna16_error_t *err, wna16_status_t want,
                      const char *needle)
{
    tu_checks++;
    bool ok = st == want && err->message[0] &&
              (!needle || strstr(err->message, needle));
    if (!ok) {
        tu_failures++;
        fprintf(stderr, "%s:%d: expected %s with \"%s\", got %s: %s\n", file,
                line, wna16_status_name(want), needle ? needle : "",
                wna16_status_name(st), err->message);
    }
}

bool rt_same_tensor(const char *what, const wna16_tensor_t *want,
                    const wna16_tensor_t *got)
{
    TU_CHECK_MSG(got != NULL, "%s: %s missing", what, want->name);
    if (!got)
        return false;
    bool same = got->dtype == want->dtype && got->ndim == want->ndim &&
                got->nbytes == want->nbytes;
    for (int d = 0; same && d < got->ndim; d++)
        same = got->shape[d] == want->shape[d];
    TU_CHECK_MSG(same, "%s: %s: dtype/shape differ", what, want->name);
    if (!same)
        return false;
    const uint8_t *a = got->data, *b = want->data;
    size_t diff = 0;
    while (diff < want->nbytes && a[diff] == b[diff])
        diff++;
    TU_CHECK_MSG(diff == want->nbytes, "%s: %s: first difference at byte %zu "
                 "of %zu (got %02x, want %02x)", what, want->name, diff,
                 want->nbytes, diff < want->nbytes ? a[diff] : 0,
                 diff < want->nbytes ? b[diff] : 0);
    return diff == want->nbytes;
}

int rt_compare_set(const char *what, const wna16_tensor_set_t *want,
                   const wna16_safetensors_t *st)
{
    int same = 0;
    for (size_t i = 0; i < wna16_tensor_set_count(want); i++) {
        const wna16_tensor_t *w = wna16_tensor_set_at(want, i);
        same += rt_same_tensor(what, w, wna16_safetensors_find(st, w->name));
    }
    return same;
}
