/*
 * cpu_pack.c - CPU kernels for kernel packs: the JIT's pipeline (emit_llvm,
 * the same O3 passes, an object file) run for a named x86-64 level
 * instead of the host CPU, then linked by the system's linker into a
 * one-kernel shared object that cpu_so.c loads with no compiler present:
 *
 *   kernel IR --emit_llvm--> module --O3 (x86-64-vN)--> object
 *   --ld -shared--> shared object (the pack entry)
 *
 * The linker runs as a child process on temporary files (its only
 * interface); nothing here needs a CPU instance, so packs for other
 * levels than the host's are built anywhere LLVM and binutils are.
 */
#define _GNU_SOURCE /* mkstemps */
#include "runtime/cpu/cpu.h"
#include "gen/emit_llvm.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <llvm-c/Core.h>
#include <llvm-c/Error.h>
#include <llvm-c/Target.h>
#include <llvm-c/TargetMachine.h>
#include <llvm-c/Transforms/PassBuilder.h>

extern char **environ;

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static bool init_ok;

static void init_llvm(void)
{
    init_ok = !LLVMInitializeNativeTarget() && !LLVMInitializeNativeAsmPrinter();
}

static void quiet(LLVMDiagnosticInfoRef di, void *user)
{
    (void)di;
    (void)user;
}

/* The object file of `k` for x86-64 level `arch` (malloc'd). */
static wna16_status_t compile_object(const kir_kernel_t *k, const char *arch,
                                     const char *symbol, void **obj,
                                     size_t *size, wna16_error_t *err)
{
    const char *triple = "x86_64-pc-linux-gnu";
    LLVMTargetRef target;
    char *msg = NULL;
    if (LLVMGetTargetFromTriple(triple, &target, &msg)) {
        wna16_status_t st = w16_err(err, WNA16_EUNAVAILABLE, "kernel %s: "
                                    "LLVM cannot build x86-64 code here: %s",
                                    k->name, msg ? msg : "");
        LLVMDisposeMessage(msg);
        return st;
    }
    /* the JIT's feature choice (cpu_target.c: host_features); the level's
     * own features follow from its name, but the emitter reads whether
     * AVX-512 is there from the string */
    const char *features = strcmp(arch, "x86-64-v4") == 0
                               ? "+avx512f,+prefer-no-gather"
                               : "+prefer-no-gather";
    LLVMTargetMachineRef tm = LLVMCreateTargetMachine(
        target, triple, arch, features, LLVMCodeGenLevelAggressive,
        LLVMRelocPIC, LLVMCodeModelDefault);
    if (!tm)
        return w16_err(err, WNA16_EINTERNAL, "kernel %s: no LLVM target "
                       "machine for %s", k->name, arch);
    LLVMContextRef lc = LLVMContextCreate();
    LLVMContextSetDiagnosticHandler(lc, quiet, NULL);
    LLVMModuleRef m = LLVMModuleCreateWithNameInContext(k->name, lc);
    LLVMSetTarget(m, triple);
    LLVMTargetDataRef td = LLVMCreateTargetDataLayout(tm);
    char *layout = LLVMCopyStringRepOfTargetData(td);
    LLVMSetDataLayout(m, layout);
    LLVMDisposeMessage(layout);
    LLVMDisposeTargetData(td);
    wna16_status_t st = w16_emit_llvm_for(k, m, symbol, features, err);
    if (st == WNA16_OK) {
        LLVMPassBuilderOptionsRef po = LLVMCreatePassBuilderOptions();
        LLVMPassBuilderOptionsSetLoopVectorization(po, 1);
        LLVMPassBuilderOptionsSetSLPVectorization(po, 1);
        LLVMPassBuilderOptionsSetLoopUnrolling(po, 1);
        LLVMErrorRef e = LLVMRunPasses(m, W16_LLVM_PASSES, tm, po);
        LLVMDisposePassBuilderOptions(po);
        if (e) {
            char *em = LLVMGetErrorMessage(e);
            st = w16_err(err, WNA16_EINTERNAL, "kernel %s: %s", k->name, em);
            LLVMDisposeErrorMessage(em);
        }
    }
    LLVMMemoryBufferRef mb = NULL;
    if (st == WNA16_OK &&
        LLVMTargetMachineEmitToMemoryBuffer(tm, m, LLVMObjectFile, &msg, &mb)) {
        st = w16_err(err, WNA16_EINTERNAL, "kernel %s: code generation for %s "
                     "failed: %s", k->name, arch, msg ? msg : "");
        LLVMDisposeMessage(msg);
        mb = NULL;
    }
    if (st == WNA16_OK) {
        *size = LLVMGetBufferSize(mb);
        *obj = malloc(*size ? *size : 1);
        if (!*obj)
            st = w16_err_nomem(err, "copying an object file");
        else
            memcpy(*obj, LLVMGetBufferStart(mb), *size);
    }
    if (mb)
        LLVMDisposeMemoryBuffer(mb);
    LLVMDisposeModule(m);
    LLVMContextDispose(lc);
    LLVMDisposeTargetMachine(tm);
    return st;
}

static const char *linker(void)
{
    const char *ld = getenv("WNA16_LD");
    return ld && *ld ? ld : "ld";
}

static bool write_all(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        b += w;
        n -= (size_t)w;
    }
    return true;
}

/* Runs argv; its output (and error) into the file at log_fd. The exit
 * status, or -1 when it could not run. */
static int run(char *const argv[], int log_fd)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, log_fd, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void read_log(int fd, char *out, size_t n)
{
    out[0] = 0;
    if (lseek(fd, 0, SEEK_SET) != 0)
        return;
    ssize_t r = read(fd, out, n - 1);
    out[r > 0 ? r : 0] = 0;
    for (char *p = out; *p; p++)
        if (*p == '\n')
            *p = ' ';
}

static wna16_status_t link_shared(wna16_context_t *ctx, const char *name,
                                  const void *obj, size_t obj_size,
                                  void **blob, size_t *size,
                                  wna16_error_t *err)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    char o_path[4096], so_path[4096], log_path[4096];
    snprintf(o_path, sizeof o_path, "%s/wna16-pack-XXXXXX.o", tmp);
    snprintf(so_path, sizeof so_path, "%s/wna16-pack-XXXXXX.so", tmp);
    snprintf(log_path, sizeof log_path, "%s/wna16-pack-XXXXXX.log", tmp);
    int ofd = mkstemps(o_path, 2), sfd = mkstemps(so_path, 3),
        lfd = mkstemps(log_path, 4);
    wna16_status_t st = WNA16_OK;
    if (ofd < 0 || sfd < 0 || lfd < 0)
        st = w16_err(err, WNA16_EIO, "kernel %s: temporary files in %s: %s",
                     name, tmp, strerror(errno));
    else if (!write_all(ofd, obj, obj_size))
        st = w16_err(err, WNA16_EIO, "kernel %s: writing %s: %s", name,
                     o_path, strerror(errno));
    if (st == WNA16_OK) {
        /* no build id, no dependencies: the same object links to the same
         * bytes; libc's and libm's symbols resolve in the loading process */
        char *argv[] = {(char *)linker(), "-shared", "--build-id=none",
                        "--hash-style=gnu", "-z", "noexecstack", "-z", "now",
                        "-o", so_path, o_path, NULL};
        int rc = run(argv, lfd);
        if (rc != 0) {
            char log[600];
            read_log(lfd, log, sizeof log);
            st = w16_err(err, WNA16_EUNAVAILABLE, "kernel %s: linking its "
                         "shared object with '%s' %s%s%s (set WNA16_LD to "
                         "the linker; binutils' ld)", name, linker(),
                         rc < 0 ? "failed: " : "failed",
                         rc < 0 ? strerror(errno) : log[0] ? ": " : "",
                         rc < 0 ? "" : log);
        }
    }
    if (st == WNA16_OK) {
        struct stat sb;
        unsigned char *b = NULL;
        if (fstat(sfd, &sb) != 0 || sb.st_size <= 0 ||
            !(b = w16_alloc(ctx, (size_t)sb.st_size)))
            st = b ? st : w16_err_nomem(err, "reading a linked kernel");
        size_t got = 0;
        while (st == WNA16_OK && got < (size_t)sb.st_size) {
            ssize_t r = pread(sfd, b + got, (size_t)sb.st_size - got,
                              (off_t)got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                st = w16_err(err, WNA16_EIO, "kernel %s: reading %s", name,
                             so_path);
            else
                got += (size_t)r;
        }
        if (st == WNA16_OK) {
            *blob = b;
            *size = got;
        } else if (b) {
            w16_free(ctx, b, (size_t)sb.st_size);
        }
    }
    if (ofd >= 0) {
        close(ofd);
        unlink(o_path);
    }
    if (sfd >= 0) {
        close(sfd);
        unlink(so_path);
    }
    if (lfd >= 0) {
        close(lfd);
        unlink(log_path);
    }
    return st;
}

wna16_status_t w16_cpu_pack_compile(wna16_context_t *ctx,
                                    const kir_kernel_t *k, const char *arch,
                                    const char *symbol, void **blob,
                                    size_t *size, wna16_error_t *err)
{
    if (!w16_cpu_pack_arch_known(arch))
        return w16_err(err, WNA16_EINVAL, "cpu: no pack architecture '%s' "
                       "(x86-64, x86-64-v2, x86-64-v3, x86-64-v4)",
                       arch ? arch : "");
    pthread_once(&init_once, init_llvm);
    if (!init_ok)
        return w16_err(err, WNA16_EUNAVAILABLE, "cpu target unavailable: "
                       "LLVM has no native target for this host");
    void *obj = NULL;
    size_t n = 0;
    wna16_status_t st = compile_object(k, arch, symbol, &obj, &n, err);
    if (st == WNA16_OK)
        st = link_shared(ctx, k->name, obj, n, blob, size, err);
    free(obj);
    return st;
}

/* Thread safe: the first caller fills the text under a mutex. */
const char *w16_cpu_pack_compiler(void)
{
    static char v[160];
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&mu);
    if (!v[0]) {
        char ld[100] = "ld";
        const char *tmp = getenv("TMPDIR");
        char tmpl[4096];
        snprintf(tmpl, sizeof tmpl, "%s/wna16-ld-XXXXXX",
                 tmp && *tmp ? tmp : "/tmp");
        int fd = mkstemp(tmpl);
        if (fd >= 0) {
            char *argv[] = {(char *)linker(), "--version", NULL};
            char out[400];
            if (run(argv, fd) == 0 && lseek(fd, 0, SEEK_SET) == 0) {
                ssize_t r = read(fd, out, sizeof out - 1);
                out[r > 0 ? r : 0] = 0;
                out[strcspn(out, "\n")] = 0;
                if (out[0])
                    snprintf(ld, sizeof ld, "%s", out);
            }
            close(fd);
            unlink(tmpl);
        }
        snprintf(v, sizeof v, "%s + %s", w16_cpu_compiler_version(), ld);
    }
    pthread_mutex_unlock(&mu);
    return v;
}
