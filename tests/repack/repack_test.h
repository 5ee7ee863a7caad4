/*
 * repack_test.h - helpers shared by the checkpoint repack tests: random MoE
 * layers in logical form, Hugging Face checkpoints built from them through
 * a format spec (one file or shards with an index, config.json, extra
 * non-expert tensors, renamed projections), and checks on the result
 * (tensor bytes, error messages, leftover temporary files).
 */
#ifndef WNA16_REPACK_TEST_H
#define WNA16_REPACK_TEST_H

#include "testutil.h"

#include <stdbool.h>
#include <stddef.h>

/* A random layer: codes, f16-exact scales, zeros when zp, a permuted
 * g_idx when act_order (else none), f16-exact biases when bias. */
/* What the reference repack makes of L once written in `format` and read
 * back (the checkpoint may carry tensors the math does not use, e.g.
 * symmetric GPTQ's zero words, which Marlin keeps). */
wna16_tensor_set_t *rt_encode_as_read(wna16_context_t *ctx, const char *format,
                                      const char *backend,
                                      const wna16_qlayer_t *L,
                                      const char *prefix);

void rt_make_layer(wna16_qlayer_t *L, int32_t E, int32_t H, int32_t I,
                   int32_t bits, int32_t gs, bool zp, bool act_order,
                   bool bias, uint64_t seed);

/* wna16_ref_encode of L into spec `name` under prefix, in a fresh set;
 * NULL (after a failed check) on error. */
wna16_tensor_set_t *rt_encode(wna16_context_t *ctx, const char *name,
                              const wna16_qlayer_t *L, const char *prefix);

/* A checkpoint under construction: tensors (views, kept alive by the
 * caller or owned here), each assigned to a shard. */
typedef struct rt_ckpt {
    wna16_context_t *ctx;
    wna16_tensor_set_t *owned; /* data of extra tensors */
    wna16_tensor_set_t *shard[4];
    int nshards;
} rt_ckpt_t;

void rt_ckpt_init(rt_ckpt_t *c, wna16_context_t *ctx, int nshards);
void rt_ckpt_free(rt_ckpt_t *c);
/* Adds every tensor of `set` to shard s (s < 0: tensor i to shard
 * i % nshards, splitting the layer over the shards), renaming "{from[i]}"
 * parts of the names to "{to[i]}" (e.g. ".gate_proj." -> ".w1.") and
 * leaving out the tensor (after renaming) named `skip` (may be NULL). */
void rt_ckpt_add_set(rt_ckpt_t *c, int s, const wna16_tensor_set_t *set,
                     const char *const *from, const char *const *to, int nren,
                     const char *skip);
/* Adds a non-expert tensor of random bytes to shard s; returns it. */
const wna16_tensor_t *rt_ckpt_add_random(rt_ckpt_t *c, int s,
                                         const char *name, wna16_dtype_t dt,
                                         int64_t rows, int64_t cols,
                                         uint64_t seed);
/* Writes the shards into dir: model.safetensors for one shard, else
 * model-0000i-of-0000n.safetensors + model.safetensors.index.json. */
void rt_ckpt_write(rt_ckpt_t *c, const char *dir);

/* Writes dir/config.json for a qwen3_moe-like model with the given
 * quantization_config (a JSON object text). */
void rt_write_config(const char *dir, int32_t E, int32_t H, int32_t I,
                     int layers, const char *quant_json);

/* A fresh empty directory (malloc'd path). */
char *rt_tempdir(const char *tag);
/* dir/name (malloc'd). */
char *rt_path(const char *dir, const char *name);
/* Entries of dir whose name holds ".tmp." (the writer's temporaries). */
int rt_count_tmp(const char *dir);
/* Removes a directory tree of plain files and directories. */
void rt_rmtree(const char *dir);

/* Checks the status and that the message holds `needle`. */
#define RT_EXPECT_ERR(st, err, want, needle)                                 \
    rt_expect_err_at(__FILE__, __LINE__, (st), (err), (want), (needle))
void rt_expect_err_at(const char *file, int line, wna16_status_t st,
                      const wna16_error_t *err, wna16_status_t want,
                      const char *needle);

/* Compares tensor `want` with the tensor of the same name in `got`
 * (dtype, shape, bytes); reports `what` on a difference. */
bool rt_same_tensor(const char *what, const wna16_tensor_t *want,
                    const wna16_tensor_t *got);
/* Every tensor of `want` is in the file `st` with equal bytes. */
int rt_compare_set(const char *what, const wna16_tensor_set_t *want,
                   const wna16_safetensors_t *st);

#endif
