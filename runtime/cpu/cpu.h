/*
 * cpu.h - the CPU target: generated kernels compiled by LLVM 19 (O3 with
 * the host's features, vectorized), loaded into an ORC LLJIT as object
 * files (so compiled kernels can come from the disk cache), and run over a
 * pool of threads, one per core, that split the workgroups.
 */
#ifndef W16_CPU_H
#define W16_CPU_H

#include "gen/kir.h"

typedef struct w16_cpu w16_cpu_t;

/* The entry point of a compiled kernel (see gen/emit_llvm.h). */
typedef void (*w16_cpu_fn)(const uint64_t *args, int64_t group_begin,
                           int64_t group_end, int64_t num_groups);

/* The context's CPU target, created on first use. (Builds without LLVM
 * do not compile this target; runtime/targets.c does not list it.) */
wna16_status_t w16_cpu_get(wna16_context_t *ctx, w16_cpu_t **out,
                           wna16_error_t *err);
void w16_cpu_destroy(w16_cpu_t *cpu);

/* Emits, optimizes and codegens the kernel to a relocatable object. The
 * object bytes are malloc'd (free with free()). */
wna16_status_t w16_cpu_compile_object(w16_cpu_t *cpu, const kir_kernel_t *k,
                                      const char *symbol, void **obj,
                                      size_t *size, wna16_error_t *err);
/* Links an object into the JIT and returns its entry point `symbol`. */
wna16_status_t w16_cpu_load_object(w16_cpu_t *cpu, const void *obj,
                                   size_t size, const char *symbol,
                                   w16_cpu_fn *fn, wna16_error_t *err);
/* compile_object + load_object, with a fresh unique symbol. */
wna16_status_t w16_cpu_compile(w16_cpu_t *cpu, const kir_kernel_t *k,
                               w16_cpu_fn *fn, wna16_error_t *err);

/* Runs workgroups [0, num_groups) over the thread pool and waits. */
void w16_cpu_launch(w16_cpu_t *cpu, w16_cpu_fn fn, const uint64_t *args,
                    int64_t num_groups);

/* "LLVM 19.1.7" (or "none"). */
const char *w16_cpu_compiler_version(void);

/* "znver4" and the feature string: part of every cache key. */
const char *w16_cpu_name(const w16_cpu_t *cpu);
const char *w16_cpu_features(const w16_cpu_t *cpu);
int w16_cpu_threads(const w16_cpu_t *cpu);

#endif
