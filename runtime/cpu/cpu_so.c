/*
 * cpu_so.c - CPU kernels from kernel packs, with no compiler: a pack's CPU
 * entry is a small shared object (one kernel, linked by the pack builder:
 * cpu_pack.c), loaded from the pack's bytes through an anonymous memory
 * file (memfd_create, then dlopen of /proc/self/fd/N, the descriptor
 * open while the object is loaded), so nothing is written to disk and the dynamic linker does the relocations (why shared
 * objects rather than a relocatable-object loader of our own:
 * docs/design-notes.md, "CPU kernels in packs"). Also which x86-64
 * architecture levels this CPU runs, best first. Built with or without
 * LLVM.
 */
#define _GNU_SOURCE /* memfd_create */
#include "runtime/cpu/cpu.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ELF64 header fields read here (the System V ABI's numbers). */
enum {
    ELF_CLASS = 4, ELF_DATA = 5, ELF_TYPE = 16, ELF_MACHINE = 18,
    ELFCLASS64 = 2, ELFDATA2LSB = 1, ET_REL = 1, ET_DYN = 3,
    EM_X86_64 = 62,
};

int w16_cpu_elf_type(const void *blob, size_t size)
{
    const unsigned char *b = blob;
    if (size < 64 || memcmp(b, "\177ELF", 4) != 0 || b[ELF_CLASS] != ELFCLASS64 ||
        b[ELF_DATA] != ELFDATA2LSB)
        return 0;
    int type = b[ELF_TYPE] | b[ELF_TYPE + 1] << 8;
    return type == ET_REL ? W16_CPU_ELF_OBJECT
         : type == ET_DYN ? W16_CPU_ELF_SHARED : 0;
}

void w16_cpu_sos_init(w16_cpu_sos_t *l)
{
    memset(l, 0, sizeof *l);
    pthread_mutex_init(&l->mu, NULL);
}

void w16_cpu_sos_fini(w16_cpu_sos_t *l)
{
    for (int i = l->n - 1; i >= 0; i--) {
        dlclose(l->handles[i]);
        close(l->fds[i]);
    }
    free(l->handles);
    free(l->fds);
    pthread_mutex_destroy(&l->mu);
    memset(l, 0, sizeof *l);
}

wna16_status_t w16_cpu_so_load(w16_cpu_sos_t *l, const void *blob,
                               size_t size, const char *symbol,
                               w16_cpu_fn *fn, wna16_error_t *err)
{
    const unsigned char *b = blob;
    if (w16_cpu_elf_type(blob, size) != W16_CPU_ELF_SHARED ||
        (b[ELF_MACHINE] | b[ELF_MACHINE + 1] << 8) != EM_X86_64)
        return w16_err(err, WNA16_EFORMAT, "kernel %s: not an x86-64 shared "
                       "object", symbol);
    int fd = memfd_create(symbol, MFD_CLOEXEC);
    if (fd < 0)
        return w16_err(err, WNA16_EIO, "kernel %s: memfd_create: %s", symbol,
                       strerror(errno));
    for (size_t done = 0; done < size;) {
        ssize_t w = write(fd, b + done, size - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            return w16_err(err, WNA16_EIO, "kernel %s: writing its memory "
                           "file: %s", symbol, strerror(e));
        }
        done += (size_t)w;
    }
    /* The dynamic linker knows a loaded object by the name it was opened
     * under and would hand back an earlier object for a name reused, so
     * the descriptor (and with it its /proc name) stays open as long as
     * the object is loaded. */
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        close(fd);
        return w16_err(err, WNA16_EFORMAT, "kernel %s: the dynamic linker "
                       "refused its shared object: %s", symbol,
                       why ? why : "unknown error");
    }
    void *f = dlsym(h, symbol);
    if (!f) {
        dlclose(h);
        close(fd);
        return w16_err(err, WNA16_EFORMAT, "kernel %s: its shared object has "
                       "no symbol %s", symbol, symbol);
    }
    pthread_mutex_lock(&l->mu);
    if (l->n == l->cap) {
        int nc = l->cap ? 2 * l->cap : 16;
        void **nh = realloc(l->handles, sizeof *nh * (size_t)nc);
        int *nf = nh ? realloc(l->fds, sizeof *nf * (size_t)nc) : NULL;
        if (nh)
            l->handles = nh;
        if (nf)
            l->fds = nf;
        if (!nh || !nf) {
            pthread_mutex_unlock(&l->mu);
            dlclose(h);
            close(fd);
            return w16_err_nomem(err, "keeping a loaded kernel");
        }
        l->cap = nc;
    }
    l->handles[l->n] = h;
    l->fds[l->n++] = fd;
    pthread_mutex_unlock(&l->mu);
    *fn = (w16_cpu_fn)(uintptr_t)f;
    return WNA16_OK;
}

/* x86-64 microarchitecture levels (the psABI's), best first; found once
 * (every lookup of a packed kernel asks). */
static const char *host_levels[4];
static int n_host_levels;
static pthread_once_t levels_once = PTHREAD_ONCE_INIT;

static void find_levels(void)
{
    n_host_levels = 0;
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool v2 = __builtin_cpu_supports("sse4.2") &&
              __builtin_cpu_supports("popcnt") &&
              __builtin_cpu_supports("ssse3");
    bool v3 = v2 && __builtin_cpu_supports("avx2") &&
              __builtin_cpu_supports("fma") &&
              __builtin_cpu_supports("bmi") &&
              __builtin_cpu_supports("bmi2") &&
              __builtin_cpu_supports("avx");
    bool v4 = v3 && __builtin_cpu_supports("avx512f") &&
              __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512cd") &&
              __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx512vl");
    const char *levels[4] = {v4 ? "x86-64-v4" : NULL, v3 ? "x86-64-v3" : NULL,
                             v2 ? "x86-64-v2" : NULL, "x86-64"};
    for (int i = 0; i < 4; i++)
        if (levels[i])
            host_levels[n_host_levels++] = levels[i];
#endif
}

int w16_cpu_host_arches(const char **out, int max)
{
    pthread_once(&levels_once, find_levels);
    int n = 0;
    for (; n < n_host_levels && n < max; n++)
        out[n] = host_levels[n];
    return n;
}

bool w16_cpu_pack_arch_known(const char *arch)
{
    static const char *const known[] = {"x86-64", "x86-64-v2", "x86-64-v3",
                                        "x86-64-v4"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (arch && strcmp(arch, known[i]) == 0)
            return true;
    return false;
}
