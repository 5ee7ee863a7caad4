/*
 * test_cache_api.c - wna16_cache_info and wna16_cache_clear (test
 * host_cache): a context whose options name a fresh cache directory
 * reports it before anything is compiled (empty), then the compiles, disk
 * writes and files of a repack with generated CPU kernels; a second
 * context on the same directory loads them (disk hits, no compile); clear
 * removes exactly the files info counted, and the kernels already loaded
 * still run; a directory writable by others is refused, the cache stays
 * in memory, info says so and clear is EUNAVAILABLE; NULL arguments are
 * refused naming them. Needs the CPU target and WNA16_GOLDEN_DIR (77).
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include <string.h>
#include <sys/stat.h>

static const char *PREFIX = "model.layers.0.mlp.experts";

static void quiet(void *u, wna16_log_level_t l, const char *m)
{
    (void)u, (void)l, (void)m;
}

/* Repacks the golden layer into Triton's layout with CPU kernels. */
static wna16_status_t repack(wna16_context_t *ctx, const char *golden,
                             wna16_error_t *err)
{
    wna16_checkpoint_t *ck = NULL;
    wna16_checkpoint_layer_t L = {0};
    wna16_tensor_set_t *out = NULL;
    wna16_status_t st = wna16_checkpoint_open(ctx, golden, &ck, err);
    if (st == WNA16_OK)
        st = wna16_checkpoint_layer_open(ctx, ck, NULL, NULL, PREFIX, &L, err);
    if (st == WNA16_OK)
        st = wna16_tensor_set_create(ctx, &out, err);
    if (st == WNA16_OK)
        st = wna16_repack_layer(
            ctx, L.format, L.tensors, L.prefix, L.E, L.H, L.I, &L.quant,
            wna16_spec_find(ctx, WNA16_SPEC_BACKEND, "triton"),
            WNA16_TARGET_CPU, out, err);
    wna16_tensor_set_destroy(out);
    wna16_checkpoint_layer_close(&L);
    wna16_checkpoint_close(ck);
    return st;
}

int main(void)
{
    char golden[4096];
    snprintf(golden, sizeof golden, "%s/gptq_b4_g128", WNA16_GOLDEN_DIR);
    struct stat sb;
    if (stat(golden, &sb) != 0)
        tu_skip("no golden checkpoint gptq_b4_g128 (WNA16_GOLDEN_DIR)");
#ifndef WNA16_HAVE_LLVM
    tu_skip("this build cannot compile CPU kernels (LLVM 19)");
#endif
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/kernels", tu_tempdir("host_cache"));
    wna16_context_options_t o = {.cache_dir = dir, .log = quiet};
    wna16_error_t err;
    wna16_context_t *ctx = NULL;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (!ctx)
        return tu_finish("host_cache");

    wna16_cache_info_t info;
    TU_OK(wna16_cache_info(ctx, &info, &err), &err);
    TU_CHECK_MSG(strcmp(info.dir, dir) == 0, "dir '%s'", info.dir);
    TU_CHECK(info.disk_readable && info.disk_writable);
    TU_CHECK(info.files == 0 && info.bytes == 0 && info.compiles == 0);
    TU_CHECK(info.max_bytes == WNA16_CACHE_DEFAULT_MAX_BYTES);

    TU_OK(repack(ctx, golden, &err), &err);
    TU_OK(wna16_cache_info(ctx, &info, &err), &err);
    TU_CHECK_MSG(info.compiles > 0 && info.disk_writes == info.compiles,
                 "%llu compiles, %llu writes",
                 (unsigned long long)info.compiles,
                 (unsigned long long)info.disk_writes);
    TU_CHECK_MSG(info.files == info.disk_writes && info.bytes > 0,
                 "%zu files", info.files);
    TU_CHECK(info.entries >= info.compiles);
    size_t files = info.files;

    /* another context, same directory: loaded, not compiled */
    wna16_context_t *ctx2 = NULL;
    TU_OK(wna16_context_create(&o, &ctx2, &err), &err);
    if (ctx2) {
        TU_OK(repack(ctx2, golden, &err), &err);
        wna16_cache_info_t i2;
        TU_OK(wna16_cache_info(ctx2, &i2, &err), &err);
        TU_CHECK_MSG(i2.compiles == 0 && i2.disk_hits == files,
                     "%llu compiles, %llu disk hits",
                     (unsigned long long)i2.compiles,
                     (unsigned long long)i2.disk_hits);
        wna16_context_destroy(ctx2);
    }

    size_t removed = 0;
    TU_OK(wna16_cache_clear(ctx, &removed, &err), &err);
    TU_CHECK_MSG(removed == files, "removed %zu of %zu", removed, files);
    TU_OK(wna16_cache_info(ctx, &info, &err), &err);
    TU_CHECK(info.files == 0 && info.bytes == 0);
    TU_OK(repack(ctx, golden, &err), &err); /* loaded kernels still run */
    TU_OK(wna16_cache_info(ctx, &info, &err), &err);
    TU_CHECK(info.files == 0); /* from memory: nothing compiled again */
    wna16_context_destroy(ctx);

    /* a directory others may write: refused, memory only */
    char open_dir[4200];
    snprintf(open_dir, sizeof open_dir, "%s", tu_tempdir("host_cache_open"));
    chmod(open_dir, 0777);
    o.cache_dir = open_dir;
    TU_OK(wna16_context_create(&o, &ctx, &err), &err);
    if (ctx) {
        TU_OK(wna16_cache_info(ctx, &info, &err), &err);
        TU_CHECK_MSG(info.dir[0] == 0 && !info.disk_writable, "dir '%s'",
                     info.dir);
        TU_CHECK(wna16_cache_clear(ctx, &removed, &err) ==
                 WNA16_EUNAVAILABLE);
        TU_CHECK_MSG(strstr(err.message, "memory only"), "%s", err.message);
        wna16_context_destroy(ctx);
    }

    TU_CHECK(wna16_cache_info(NULL, &info, &err) == WNA16_EINVAL);
    TU_CHECK_MSG(strstr(err.message, "ctx is NULL"), "%s", err.message);
    TU_CHECK(wna16_cache_info(ctx, NULL, &err) == WNA16_EINVAL);
    TU_CHECK(wna16_cache_clear(NULL, NULL, &err) == WNA16_EINVAL);
    return tu_finish("host_cache");
}
