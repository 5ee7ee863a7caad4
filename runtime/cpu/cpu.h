/*
 * cpu.h - the CPU target: generated kernels compiled by LLVM 19 (O3 with
 * the host's features, vectorized), loaded into an ORC LLJIT as object
 * files (so compiled kernels can come from the disk cache), and run over a
 * pool of threads, one per core, that split the workgroups.
 */
#ifndef W16_CPU_H
#define W16_CPU_H

#include "gen/kir.h"

#include <pthread.h>

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

/* ---- kernels from packs (cpu_so.c; with or without LLVM) ---- */

/* Shared objects loaded from packs, closed with the target. */
typedef struct w16_cpu_sos {
    pthread_mutex_t mu;
    void **handles; /* dlopen handles */
    int *fds;       /* and their memory files, open while loaded */
    int n, cap;
} w16_cpu_sos_t;

void w16_cpu_sos_init(w16_cpu_sos_t *l);
/* dlcloses every object, newest first. */
void w16_cpu_sos_fini(w16_cpu_sos_t *l);
/* The CPU target's list (cpu_target.c, or cpu_nojit.c without LLVM). */
w16_cpu_sos_t *w16_cpu_sos(w16_cpu_t *cpu);

/* What an artifact is: W16_CPU_ELF_OBJECT (a relocatable object: the JIT
 * links it), W16_CPU_ELF_SHARED (a pack's shared object), else 0. */
enum { W16_CPU_ELF_OBJECT = 1, W16_CPU_ELF_SHARED = 2 };
int w16_cpu_elf_type(const void *blob, size_t size);

/* Loads a pack's shared object from memory and returns `symbol`; the
 * object stays loaded until w16_cpu_sos_fini. The blob stays the
 * caller's. */
wna16_status_t w16_cpu_so_load(w16_cpu_sos_t *l, const void *blob,
                               size_t size, const char *symbol,
                               w16_cpu_fn *fn, wna16_error_t *err);

/* The x86-64 levels this CPU runs, best first ("x86-64-v4", "x86-64-v3",
 * "x86-64-v2", "x86-64"); returns how many (0 on other CPUs). */
int w16_cpu_host_arches(const char **out, int max);
/* Is `arch` one of the levels above? */
bool w16_cpu_pack_arch_known(const char *arch);

#ifdef WNA16_HAVE_LLVM
/* Compiles `k` for the x86-64 level `arch` (LLVM, as the JIT does, for
 * that CPU rather than the host) and links it into a shared object with
 * the system's linker ($WNA16_LD, else ld): *blob (w16_alloc on ctx)
 * exports `symbol`. Needs no CPU instance. (cpu_pack.c) */
wna16_status_t w16_cpu_pack_compile(wna16_context_t *ctx,
                                    const kir_kernel_t *k, const char *arch,
                                    const char *symbol, void **blob,
                                    size_t *size, wna16_error_t *err);
/* "LLVM 19.1.7 + GNU ld (GNU Binutils for Debian) 2.40". */
const char *w16_cpu_pack_compiler(void);
#endif

/* "znver4" and the feature string: part of every cache key. */
const char *w16_cpu_name(const w16_cpu_t *cpu);
const char *w16_cpu_features(const w16_cpu_t *cpu);
int w16_cpu_threads(const w16_cpu_t *cpu);

#endif
