/*
 * test_nvrtc.c - the CUDA target's compiler works here without a GPU: load
 * NVRTC with dlopen (no link-time dependency), compile a kernel using
 * cuda_fp16.h and an mma.sync for sm_80 and sm_90, and check the CUBIN is
 * a non-empty CUDA ELF. Skips (77) when NVRTC is not installed.
 */
#define _GNU_SOURCE
#include "testutil.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef int (*create_fn)(void **, const char *, const char *, int,
                         const char *const *, const char *const *);
typedef int (*compile_fn)(void *, int, const char *const *);
typedef int (*size_fn)(void *, size_t *);
typedef int (*get_fn)(void *, char *);
typedef int (*destroy_fn)(void **);

static const char *const source =
    "#include <cuda_fp16.h>\n"
    "extern \"C\" __global__ void wna16_probe(const __half *a, float *out) {\n"
    "  unsigned r0 = 0, r1 = 0, r2 = 0, r3 = 0, b0 = 0, b1 = 0;\n"
    "  float c0 = 0, c1 = 0, c2 = 0, c3 = 0;\n"
    "  asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
    "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n"
    "    : \"+f\"(c0), \"+f\"(c1), \"+f\"(c2), \"+f\"(c3)\n"
    "    : \"r\"(r0), \"r\"(r1), \"r\"(r2), \"r\"(r3), \"r\"(b0), \"r\"(b1));\n"
    "  out[threadIdx.x] = __half2float(a[threadIdx.x]) + c0 + c1 + c2 + c3;\n"
    "}\n";

int main(void)
{
    void *lib = NULL;
    static const char *const names[] = {"libnvrtc.so.13", "libnvrtc.so.12",
                                        "libnvrtc.so"};
    for (size_t i = 0; i < 3 && !lib; i++)
        lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        char why[512];
        snprintf(why, sizeof why, "NVRTC not found (%s)", dlerror());
        tu_skip(why);
    }
    create_fn create = (create_fn)(uintptr_t)dlsym(lib, "nvrtcCreateProgram");
    compile_fn compile = (compile_fn)(uintptr_t)dlsym(lib, "nvrtcCompileProgram");
    size_fn cubin_size = (size_fn)(uintptr_t)dlsym(lib, "nvrtcGetCUBINSize");
    get_fn cubin = (get_fn)(uintptr_t)dlsym(lib, "nvrtcGetCUBIN");
    size_fn log_size = (size_fn)(uintptr_t)dlsym(lib, "nvrtcGetProgramLogSize");
    get_fn get_log = (get_fn)(uintptr_t)dlsym(lib, "nvrtcGetProgramLog");
    destroy_fn destroy = (destroy_fn)(uintptr_t)dlsym(lib, "nvrtcDestroyProgram");
    TU_CHECK(create && compile && cubin_size && cubin && log_size && get_log &&
             destroy);
    if (!(create && compile && cubin_size && cubin && log_size && get_log &&
          destroy))
        return tu_finish("test_nvrtc");
    static const char *const archs[] = {"-arch=sm_80", "-arch=sm_90"};
    for (int a = 0; a < 2; a++) {
        void *prog = NULL;
        TU_CHECK(create(&prog, source, "probe.cu", 0, NULL, NULL) == 0);
        const char *opts[] = {archs[a], "-std=c++17",
                              "--include-path=" WNA16_CUDA_INCLUDE};
        int rc = compile(prog, 3, opts);
        size_t n = 0;
        log_size(prog, &n);
        char log[8192] = "";
        if (n > 1 && n < sizeof log)
            get_log(prog, log);
        TU_CHECK_MSG(rc == 0, "%s: NVRTC error %d: %s", archs[a], rc, log);
        size_t size = 0;
        TU_CHECK(cubin_size(prog, &size) == 0 && size > 64);
        if (rc == 0 && size > 64) {
            char *bin = malloc(size);
            TU_CHECK(bin && cubin(prog, bin) == 0);
            /* ELF, machine EM_CUDA (190) */
            TU_CHECK(bin && memcmp(bin, "\x7f" "ELF", 4) == 0 &&
                     (unsigned char)bin[18] == 190);
            free(bin);
        }
        destroy(&prog);
    }
    return tu_finish("test_nvrtc");
}
