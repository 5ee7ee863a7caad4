/*
 * cpu_desc.c - the CPU target's descriptor (see runtime/target/target.h):
 * kernel IR compiled by LLVM (cpu_target.c) into a relocatable object, the
 * artifact the kernel cache keeps, and linked into the JIT under a symbol
 * derived from the key, so an object read back from disk (by this or
 * another process) links under the same name. Kernels address host
 * memory, so a stream copies nothing: its buffers are the host's own.
 */
#include "runtime/cpu/cpu.h"
#include "runtime/target/target.h"
#include "runtime/cache/pack.h"
#include "gen/emit_llvm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static wna16_status_t cpu_probe(wna16_context_t *ctx, void **inst,
                                wna16_error_t *err)
{
#ifndef WNA16_HAVE_LLVM
    /* without a compiler the target runs only what packs hold */
    if (!w16_packs_have(ctx, "cpu")) {
        *inst = NULL;
        return w16_err(err, WNA16_EUNAVAILABLE, "cpu target unavailable: "
                       "built without LLVM 19 (install llvm-19-dev and "
                       "reconfigure), and no kernel pack of this context "
                       "holds CPU kernels (WNA16_PACK_PATH)");
    }
#endif
    w16_cpu_t *cpu = NULL;
    wna16_status_t st = w16_cpu_get(ctx, &cpu, err);
    *inst = cpu;
    return st;
}

static void cpu_describe(void *inst, w16_target_device_t *out)
{
    *out = (w16_target_device_t){.threads = w16_cpu_threads(inst),
                                 .cpu_features = w16_cpu_features(inst)};
    snprintf(out->text, sizeof out->text, "host CPU (%s, %d threads)",
             w16_cpu_name(inst), w16_cpu_threads(inst));
}

static void cpu_release(wna16_context_t *ctx)
{
    w16_cpu_destroy(ctx->targets[WNA16_TARGET_CPU]);
    ctx->targets[WNA16_TARGET_CPU] = NULL;
}

/* The emitter's version, then the CPU: name and features decide the code
 * LLVM writes, and LLVM's version how. */
static void cpu_key(void *inst, w16_keyer_t *kr)
{
    w16_cpu_t *cpu = inst;
    w16_keyer_u64(kr, W16_LLVM_EMITTER_VERSION);
    w16_keyer_str(kr, "cpu");
    w16_keyer_str(kr, w16_cpu_name(cpu));
    w16_keyer_str(kr, w16_cpu_features(cpu));
    w16_keyer_str(kr, w16_cpu_compiler_version());
}

/* The kernel IR as printed: everything its builder decided (the LLVM IR
 * follows from it and the emitter's version). */
static wna16_status_t cpu_source(void *inst, const kir_kernel_t *k,
                                 w16_buf_t *out, wna16_error_t *err)
{
    (void)inst;
    (void)err;
    kir_print(out, k);
    return WNA16_OK;
}

static wna16_status_t cpu_compile(void *inst, wna16_context_t *ctx,
                                  const kir_kernel_t *k, const char *source,
                                  const char *symbol, void **blob,
                                  size_t *size, wna16_error_t *err)
{
    (void)source;
    void *obj = NULL;
    size_t n = 0;
    wna16_status_t st = w16_cpu_compile_object(inst, k, symbol, &obj, &n, err);
    if (st != WNA16_OK)
        return st;
    /* the cache frees blobs with the context's allocator */
    *blob = w16_alloc(ctx, n);
    if (!*blob) {
        free(obj);
        return w16_err_nomem(err, "keeping a compiled kernel");
    }
    memcpy(*blob, obj, n);
    *size = n;
    free(obj);
    return WNA16_OK;
}

/* A relocatable object (compiled here, or read from the disk cache) is
 * linked into the JIT; a pack's shared object is loaded by the dynamic
 * linker (cpu_so.c), which needs no LLVM. */
static wna16_status_t cpu_load(void *inst, const void *blob, size_t size,
                               const char *symbol, void **fn,
                               wna16_error_t *err)
{
    w16_cpu_fn f = NULL;
    wna16_status_t st =
        w16_cpu_elf_type(blob, size) == W16_CPU_ELF_SHARED
            ? w16_cpu_so_load(w16_cpu_sos(inst), blob, size, symbol, &f, err)
            : w16_cpu_load_object(inst, blob, size, symbol, &f, err);
    if (st == WNA16_OK)
        *fn = (void *)(uintptr_t)f;
    return st;
}

/* ---- kernel packs ------------------------------------------------------------ */

static int cpu_pack_arches(void *inst, const char **out, int max)
{
    (void)inst;
    return w16_cpu_host_arches(out, max);
}

static wna16_status_t cpu_pack_compile(wna16_context_t *ctx,
                                       const kir_kernel_t *k, const char *arch,
                                       const char *symbol, void **blob,
                                       size_t *size, wna16_error_t *err)
{
#ifdef WNA16_HAVE_LLVM
    return w16_cpu_pack_compile(ctx, k, arch, symbol, blob, size, err);
#else
    (void)ctx; (void)arch; (void)symbol; (void)blob; (void)size;
    return w16_err(err, WNA16_EUNAVAILABLE, "kernel %s: this build has no "
                   "LLVM to compile CPU pack entries with", k->name);
#endif
}

static const char *cpu_pack_compiler(void)
{
#ifdef WNA16_HAVE_LLVM
    return w16_cpu_pack_compiler();
#else
    return "none";
#endif
}

/* ---- streams: host memory, launches that return when done ---------------- */

struct w16_stream {
    wna16_context_t *ctx;
    w16_cpu_t *cpu;
};

static wna16_status_t cpu_stream_open(void *inst, wna16_context_t *ctx,
                                      w16_stream_t **out, wna16_error_t *err)
{
    w16_stream_t *s = w16_calloc(ctx, 1, sizeof *s);
    if (!s)
        return w16_err_nomem(err, "opening a CPU stream");
    *s = (w16_stream_t){.ctx = ctx, .cpu = inst};
    *out = s;
    return WNA16_OK;
}

static wna16_status_t cpu_put(w16_stream_t *s, const void *host, size_t bytes,
                              uint64_t *addr, wna16_error_t *err)
{
    (void)s; (void)bytes; (void)err;
    *addr = (uint64_t)(uintptr_t)host;
    return WNA16_OK;
}

/* The caller's array of host addresses is the table itself. */
static wna16_status_t cpu_put_table(w16_stream_t *s, int n,
                                    const uint64_t *hosts, const size_t *bytes,
                                    uint64_t *table, wna16_error_t *err)
{
    (void)s; (void)n; (void)bytes; (void)err;
    *table = (uint64_t)(uintptr_t)hosts;
    return WNA16_OK;
}

static wna16_status_t cpu_output(w16_stream_t *s, void *host, size_t bytes,
                                 uint64_t *addr, wna16_error_t *err)
{
    (void)s; (void)bytes; (void)err;
    *addr = (uint64_t)(uintptr_t)host;
    return WNA16_OK;
}

static wna16_status_t cpu_output_done(w16_stream_t *s, uint64_t addr,
                                      wna16_error_t *err)
{
    (void)s; (void)addr; (void)err;
    return WNA16_OK;
}

/* The workgroups over the thread pool, or on the calling thread for a
 * small launch; the lanes are a loop inside each workgroup's code. */
static wna16_status_t cpu_launch(w16_stream_t *s, void *fn,
                                 const uint64_t *args, int n_args,
                                 int64_t n_groups, int lanes, unsigned flags,
                                 wna16_error_t *err)
{
    (void)n_args; (void)lanes; (void)err;
    w16_cpu_fn f = (w16_cpu_fn)(uintptr_t)fn;
    if (flags & W16_LAUNCH_SMALL)
        f(args, 0, n_groups, n_groups);
    else
        w16_cpu_launch(s->cpu, f, args, n_groups);
    return WNA16_OK;
}

static wna16_status_t cpu_stream_close(w16_stream_t *s, wna16_status_t st,
                                       wna16_error_t *err)
{
    (void)err;
    if (s)
        w16_free(s->ctx, s, sizeof *s);
    return st;
}

const w16_target_t w16_target_cpu = {
    .id = WNA16_TARGET_CPU,
    .name = "cpu",
#ifdef WNA16_HAVE_LLVM
    .compiler = "LLVM JIT",
#else
    .compiler = "kernel packs (no LLVM)",
#endif
    .platform = WNA16_PLATFORM_CPU,
    .host_memory = true,
    .word_blocks = true,
    .key_symbols = true,
    .moe_orch = W16_MOE_ORCH_HOST, /* host routing: the fastest here */
    .probe = cpu_probe,
    .describe = cpu_describe,
    .release = cpu_release,
    .key = cpu_key,
    .source = cpu_source,
    .compile = cpu_compile,
    .load = cpu_load,
    .unload = NULL, /* the JIT frees its code with the target */
    .stream_open = cpu_stream_open,
    .put = cpu_put,
    .put_table = cpu_put_table,
    .output = cpu_output,
    .output_done = cpu_output_done,
    .launch = cpu_launch,
    .stream_close = cpu_stream_close,
    .pack_arches = cpu_pack_arches,
    .pack_compile = cpu_pack_compile,
    .pack_compiler = cpu_pack_compiler,
};
