/*
 * test_nvrtc_repack_all.c - every generated CUDA repack kernel compiles
 * with NVRTC, for sm_80 and sm_90, without an error or a warning. No GPU
 * is needed: CI runs it wherever the CUDA toolkit is.
 *
 * The kernels are the ones the runtime builds (runtime/repack_gen.c), for
 * every (source, destination) pair: each checkpoint format, and each
 * stacked layout that holds codes, into each stacked destination (the
 * backends and moe_wna16), x bits {4, 8} x group size {-1, 32, 64, 128} x
 * zero point x act-order x bias x input dtype (16-bit, int8, fp8) x the
 * source's scale dtypes, on one small layer that every layout accepts; per operand (w13, w2) one kernel per
 * destination tensor present, plus the block-sums kernel where the qweight
 * layout has sums. What a layout cannot hold is refused by the
 * reference's own checks (w16_check_holds, on both sides) or by the
 * builder, and counted with its reason (-v prints each). A kernel name
 * means one kernel: the same name with another text fails the test, the
 * same name and text is built once. The kernels go into translation units
 * of up to KERNELS_PER_UNIT kernels behind one prelude, each compiled for
 * both architectures; an error prints the unit's kernels and NVRTC's log,
 * and a warning in the log fails too. --dump DIR writes the units as .cu
 * files (nvcc compiles them as they are).
 *
 * Usage: test_nvrtc_repack_all [-v] [-j THREADS] [--dump DIR]
 * (-j: NVRTC compilations at once, default 2)
 * Skips (exit 77) when NVRTC cannot be loaded.
 */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"
#include "repack_matrix.h"
#include "gen/build_repack.h"
#include "gen/emit_cuda.h"
#include "runtime/cache/cache.h"
#include "runtime/cuda/cuda.h"
#include "runtime/ref/ref.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

/* Big enough that the prelude and NVRTC's start-up are paid rarely, small
 * enough that a failing unit names a short list of kernels. */
enum { KERNELS_PER_UNIT = 64 };

/* The layers (E, H, I). The first fits every layout's tiles (Marlin N % 64
 * and K % 16, the CPU layout's N % 32, FlashInfer's K % 256) with every
 * group size; the second has a ragged I, which Marlin pads (to 128 for
 * group sizes -1 and 32; 64 and 128 do not divide it). Names are unique
 * within one layer: the shape is not part of a kernel's name. */
static const int32_t LAYERS[][3] = {{2, 256, 256}, {2, 256, 96}};

static const int ARCHS[][2] = {{8, 0}, {9, 0}};

/* A hash table entry: a kernel name with the hash of its text, or a
 * kernel body (the text with the name masked) with the name it was first
 * compiled under. */
typedef struct seen {
    char *key;
    w16_key_t text;
    char *origin; /* names: the combination that built it first;
                     bodies: the kernel compiled for it */
    struct seen *next;
} seen_t;

typedef struct table {
    seen_t *buckets[8192];
} table_t;

typedef struct unit {
    char *text;
    size_t len;
    char *names; /* the unit's kernel names, one a line */
    int kernels;
} unit_t;

typedef struct run {
    wna16_context_t *ctx;
    bool verbose;
    table_t names, bodies;
    unit_t *units;
    int n_units, cap_units;
    w16_buf_t text, unit_names; /* the unit being filled */
    int in_unit;
    w16_buf_t kernel;           /* one kernel's text */
    long combos, refused;
    long builder_refused; /* kernels of accepted combinations */
    long kernels, repeated, mismatched, compiled;
} run_t;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

static seen_t **bucket(table_t *t, const char *key)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *c = key; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    return &t->buckets[h % W16_ARRAY_LEN(t->buckets)];
}

static seen_t *find(table_t *t, const char *key)
{
    for (seen_t *s = *bucket(t, key); s; s = s->next)
        if (strcmp(s->key, key) == 0)
            return s;
    return NULL;
}

static void insert(table_t *t, const char *key, w16_key_t text,
                   const char *origin)
{
    seen_t **b = bucket(t, key), *s = xmalloc(sizeof *s);
    *s = (seen_t){dup_str(key), text, dup_str(origin), *b};
    *b = s;
}

static void table_free(table_t *t)
{
    for (size_t b = 0; b < W16_ARRAY_LEN(t->buckets); b++)
        for (seen_t *s = t->buckets[b], *next; s; s = next) {
            next = s->next;
            free(s->key);
            free(s->origin);
            free(s);
        }
}

/* The hash of a kernel's text with every occurrence of its name (the
 * function and its constant tables) replaced by one placeholder, so
 * kernels that differ only in name hash alike. */
static w16_key_t body_hash(const char *text, const char *name)
{
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    size_t n = strlen(name);
    for (const char *at; (at = strstr(text, name)) != NULL; text = at + n) {
        w16_keyer_bytes(&kr, text, (size_t)(at - text));
        w16_keyer_str(&kr, "<name>");
    }
    w16_keyer_bytes(&kr, text, strlen(text));
    return w16_keyer_done(&kr);
}

static bool is_identifier(const char *s)
{
    if (!(*s == '_' || (*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
        return false;
    for (; *s; s++)
        if (!(*s == '_' || (*s >= 'a' && *s <= 'z') ||
              (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9')))
            return false;
    return true;
}

static void close_unit(run_t *R)
{
    if (!R->in_unit)
        return;
    TU_CHECK(!R->text.failed && !R->unit_names.failed);
    if (R->n_units == R->cap_units) {
        R->cap_units = R->cap_units ? 2 * R->cap_units : 64;
        R->units = realloc(R->units, sizeof *R->units * (size_t)R->cap_units);
        if (!R->units) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
    }
    unit_t *u = &R->units[R->n_units++];
    u->len = R->text.len;
    u->text = dup_str(R->text.data);
    u->names = dup_str(R->unit_names.data);
    u->kernels = R->in_unit;
    w16_buf_reset(&R->text);
    w16_buf_reset(&R->unit_names);
    R->in_unit = 0;
}

/* Emits a built kernel. A name met before must come with the same text; a
 * new name whose text differs from every kernel's but in the name joins
 * the current unit; the others are as good as compiled once that one is
 * (their names are checked to be identifiers, the one thing that differs). */
static void add_kernel(run_t *R, const kir_kernel_t *k, const char *origin)
{
    wna16_error_t err;
    w16_buf_reset(&R->kernel);
    wna16_status_t st = w16_emit_cuda(k, false, &R->kernel, &err);
    TU_CHECK_MSG(st == WNA16_OK && !R->kernel.failed, "%s: %s: %s", origin,
                 k->name, st ? err.message : "out of memory");
    if (st != WNA16_OK || R->kernel.failed)
        return;
    w16_keyer_t kr;
    w16_keyer_init(&kr);
    w16_keyer_bytes(&kr, R->kernel.data, R->kernel.len);
    w16_key_t key = w16_keyer_done(&kr);
    seen_t *s = find(&R->names, k->name);
    if (s) {
        bool same = w16_key_equal(s->text, key);
        TU_CHECK_MSG(same, "kernel %s: two different texts under one name "
                     "(from %s and from %s)", k->name, s->origin, origin);
        R->repeated += same;
        R->mismatched += !same;
        return;
    }
    insert(&R->names, k->name, key, origin);
    R->kernels++;
    TU_CHECK_MSG(is_identifier(k->name), "kernel name '%s' (from %s) is not "
                 "an identifier", k->name, origin);
    char hex[W16_KEY_HEX_SIZE];
    w16_key_hex(body_hash(R->kernel.data, k->name), hex);
    if ((s = find(&R->bodies, hex)) != NULL) {
        if (R->verbose)
            printf("same text as %s: %s\n", s->origin, k->name);
        return;
    }
    insert(&R->bodies, hex, key, k->name);
    R->compiled++;
    if (!R->in_unit) {
        w16_emit_cuda_prelude(&R->text);
        w16_buf_printf(&R->text, "/* unit %d of test_nvrtc_repack_all */\n",
                       R->n_units);
    }
    w16_buf_printf(&R->text, "\n/* %s */\n", origin);
    w16_buf_append(&R->text, R->kernel.data, R->kernel.len);
    w16_buf_printf(&R->unit_names, "  %s\n", k->name);
    if (++R->in_unit == KERNELS_PER_UNIT)
        close_unit(R);
}

/* The dtype a source tensor of `role` has in a checkpoint whose float
 * tensors are `fd` (where the layout allows it). */
static wna16_dtype_t source_dtype(const w16_layout_t *l, wna16_dtype_t fd)
{
    for (int i = 0; i < l->n_dtypes; i++)
        if (l->dtypes[i] == fd)
            return fd;
    return l->dtypes[0];
}

/* Builds the kernels of one operand, as repack_operand does. */
static void build_operand(void *user, const wna16_spec_t *src,
                          const wna16_spec_t *dst, const w16_problem_t *p,
                          wna16_gemm_t g, wna16_dtype_t fd, const char *what)
{
    run_t *R = user;
    wna16_error_t err;
    int64_t dv[W16_VAR_COUNT];
    wna16_status_t st = w16_spec_bind(dst, p, g, dv, &err);
    TU_CHECK_MSG(st == WNA16_OK, "%s: %s", what, err.message);
    if (st != WNA16_OK)
        return;
    for (int r = 0; r < W16_ROLE_COUNT; r++) {
        const w16_layout_t *l = dst->layouts[r];
        if (!w16_layout_present(l, dv))
            continue;
        int64_t shape[W16_MAX_STORE_DIMS], elems = 1;
        st = w16_layout_shape(l, dv, shape, &err);
        TU_CHECK_MSG(st == WNA16_OK, "%s: %s", what, err.message);
        for (int d = 0; st == WNA16_OK && d < l->ndim; d++)
            elems *= shape[d];
        if (st != WNA16_OK || elems == 0)
            continue; /* an empty tensor: no kernel (e.g. g_idx, no act-order) */
        w16_repack_request_t req = {.src = src, .dst = dst, .problem = *p,
                                    .gemm = g, .role = (w16_role_t)r,
                                    .sort_k = dst->act_order_sort &&
                                              p->act_order};
        char origin[300];
        snprintf(origin, sizeof origin, "%s %s_%s", what,
                 g == WNA16_GEMM_W13 ? "w13" : "w2", l->name);
        w16_role_t need[W16_REPACK_MAX_SOURCES];
        int nn = w16_repack_source_roles((w16_role_t)r, p, need);
        const char *missing = NULL;
        for (int i = 0; i < nn; i++) {
            const w16_layout_t *sl = src->layouts[need[i]];
            if (!sl)
                missing = w16_role_key(need[i]);
            else
                req.src_dtype[need[i]] = source_dtype(sl, fd);
        }
        if (missing) { /* the runtime finds no such source tensor */
            R->builder_refused++;
            if (R->verbose)
                printf("refused: %s: %s has no %s layout\n", origin,
                       src->name, missing);
            continue;
        }
        req.dst_dtype = w16_repack_dst_dtype(l, nn ? req.src_dtype[need[0]]
                                                   : WNA16_DTYPE_INVALID);
        /* the last pass: the CPU's word blocks, where the builder forms them
         * (the same IR constructs; their names end in _wb) */
        for (int pass = 0; pass < (l->sums_block_k ? 2 : 1) + 1; pass++) {
            w16_repack_kernel_t rk;
            bool blocks = pass == (l->sums_block_k ? 2 : 1);
            req.word_blocks = blocks;
            req.staged_tiles = !blocks; /* what the CUDA target builds */
            st = pass && !blocks ? w16_build_repack_sums(R->ctx, &req, &rk, &err)
                                 : w16_build_repack(R->ctx, &req, &rk, &err);
            if (blocks && st == WNA16_OK && !strstr(rk.kernel->name, "_wb")) {
                w16_repack_kernel_free(&rk); /* no blocks: built already */
                continue;
            }
            if (st != WNA16_OK && blocks)
                continue; /* refused and counted in pass 0 */
            if (st != WNA16_OK) {
                R->builder_refused++;
                if (R->verbose)
                    printf("refused by the builder: %s%s: %s\n", origin,
                           pass ? " (sums)" : "", err.message);
                continue;
            }
            add_kernel(R, rk.kernel, origin);
            w16_repack_kernel_free(&rk);
        }
    }
}

/* Every combination of the walk (tests/repack_matrix.h), on one layer. */
static void enumerate(run_t *R, const int32_t *layer)
{
    static const int gss[] = {-1, 32, 64, 128};
    rm_walk_t w = {.ctx = R->ctx, .E = layer[0], .H = layer[1],
                   .I = layer[2], .group_sizes = gss,
                   .n_group_sizes = (int)W16_ARRAY_LEN(gss),
                   .verbose = R->verbose, .operand = build_operand,
                   .user = R};
    rm_walk(&w);
    R->combos += w.combos;
    R->refused += w.refused;
}

/* A failed compile leaves NVRTC's whole log in a debug message: print
 * those, and errors. (Warnings are the images' logs, which the test
 * prints itself.) */
static void log_sink(void *user, wna16_log_level_t level, const char *msg)
{
    (void)user;
    if (level >= WNA16_LOG_ERROR || strstr(msg, ": NVRTC log:"))
        fprintf(stderr, "%s\n", msg);
}

/* One unit for one architecture. */
typedef struct job {
    const unit_t *u;
    int unit, arch;
    wna16_status_t st;
    wna16_error_t err;
    char *log; /* NVRTC's warnings, or NULL */
    double seconds;
} job_t;

typedef struct pool {
    wna16_context_t *ctx;
    job_t *jobs;
    int n, next;
    pthread_mutex_t mu;
} pool_t;

static void *worker(void *arg)
{
    pool_t *P = arg;
    for (;;) {
        pthread_mutex_lock(&P->mu);
        int i = P->next++;
        pthread_mutex_unlock(&P->mu);
        if (i >= P->n)
            return NULL;
        job_t *j = &P->jobs[i];
        char label[64];
        snprintf(label, sizeof label, "repack_unit_%03d", j->unit);
        w16_cuda_image_t img;
        double t0 = now_s();
        j->st = w16_nvrtc_compile(P->ctx, j->u->text, label, j->arch / 10,
                                  j->arch % 10, &img, &j->err);
        j->seconds = now_s() - t0;
        j->log = img.log; /* kept: the test reports it */
        img.log = NULL;
        w16_cuda_image_free(&img);
    }
}

/* Compiles every unit for every architecture on `threads` threads (NVRTC
 * is thread safe); checks and reports in the main thread. */
static void compile_all(run_t *R, int threads)
{
    pool_t P = {.ctx = R->ctx, .n = R->n_units * (int)W16_ARRAY_LEN(ARCHS)};
    P.jobs = xmalloc(sizeof *P.jobs * (size_t)P.n);
    for (int i = 0; i < P.n; i++) {
        int a = i / R->n_units, u = i % R->n_units;
        P.jobs[i] = (job_t){.u = &R->units[u], .unit = u,
                            .arch = 10 * ARCHS[a][0] + ARCHS[a][1]};
    }
    pthread_mutex_init(&P.mu, NULL);
    pthread_t th[16];
    int started = 0;
    double t0 = now_s();
    while (started < threads && started < (int)W16_ARRAY_LEN(th) &&
           pthread_create(&th[started], NULL, worker, &P) == 0)
        started++;
    if (started == 0)
        worker(&P);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    double wall = now_s() - t0;
    pthread_mutex_destroy(&P.mu);
    double per_arch[W16_ARRAY_LEN(ARCHS)] = {0};
    for (int i = 0; i < P.n; i++) {
        const job_t *j = &P.jobs[i];
        per_arch[i / R->n_units] += j->seconds;
        TU_CHECK_MSG(j->st == WNA16_OK, "unit %d (%d kernels) for sm_%d:\n%s"
                     "%s", j->unit, j->u->kernels, j->arch, j->u->names,
                     j->st ? j->err.message : "");
        TU_CHECK_MSG(j->st != WNA16_OK || j->log == NULL, "unit %d (%d "
                     "kernels) for sm_%d: NVRTC warned:\n%s%s", j->unit,
                     j->u->kernels, j->arch, j->u->names, j->log ? j->log : "");
        free(j->log);
    }
    for (size_t a = 0; a < W16_ARRAY_LEN(ARCHS); a++)
        printf("sm_%d%d: %d units compiled in %.2f s (sum over units)\n",
               ARCHS[a][0], ARCHS[a][1], R->n_units, per_arch[a]);
    printf("%d compilations on %d threads in %.2f s\n", P.n,
           started ? started : 1, wall);
    free(P.jobs);
}

static void dump(const run_t *R, const char *dir)
{
    if (mkdir(dir, 0777) != 0 && errno != EEXIST) {
        TU_CHECK_MSG(false, "--dump: cannot create %s: %s", dir,
                     strerror(errno));
        return;
    }
    for (int i = 0; i < R->n_units; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/repack_unit_%03d.cu", dir, i);
        TU_CHECK_MSG(tu_write_file(path, R->units[i].text, R->units[i].len) == 0,
                     "--dump: cannot write %s", path);
    }
    printf("%d units written to %s\n", R->n_units, dir);
}

int main(int argc, char **argv)
{
    run_t R = {0};
    const char *dump_dir = NULL;
    int threads = 2; /* CI machines have two cores */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0)
            R.verbose = true;
        else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc)
            dump_dir = argv[++i];
        else if (strcmp(argv[i], "-j") == 0 && i + 1 < argc &&
                 (threads = atoi(argv[++i])) >= 1 && threads <= 16)
            continue;
        else {
            fprintf(stderr, "usage: %s [-v] [-j THREADS (1-16)] [--dump DIR]\n",
                    argv[0]);
            return 2;
        }
    }
    wna16_context_options_t o = {.log = log_sink,
                                 .log_level = WNA16_LOG_DEBUG,
                                 .log_level_set = true};
    wna16_error_t err;
    if (wna16_context_create(&o, &R.ctx, &err) != WNA16_OK) {
        fprintf(stderr, "context: %s\n", err.message);
        return 1;
    }
    if (!w16_nvrtc_available(R.ctx, &err)) {
        wna16_context_destroy(R.ctx);
        tu_skip(err.message);
    }
    w16_buf_init(&R.text, R.ctx);
    w16_buf_init(&R.unit_names, R.ctx);
    w16_buf_init(&R.kernel, R.ctx);
    double t0 = now_s();
    for (size_t i = 0; i < W16_ARRAY_LEN(LAYERS); i++) {
        enumerate(&R, LAYERS[i]);
        table_free(&R.names); /* names are unique within a layer */
        memset(&R.names, 0, sizeof R.names);
    }
    close_unit(&R);
    double t_gen = now_s() - t0;
    printf("%ld combinations: %ld refused by the reference's checks, %ld "
           "built (%ld of their kernels refused by the builder or for want "
           "of a source tensor)\n", R.combos, R.refused, R.combos - R.refused,
           R.builder_refused);
    printf("%ld kernels (%ld more built again with the same text, %ld name "
           "clashes); %ld distinct texts up to the name, in %d units of up "
           "to %d; generated in %.2f s\n", R.kernels, R.repeated,
           R.mismatched, R.compiled, R.n_units, KERNELS_PER_UNIT, t_gen);
    if (dump_dir)
        dump(&R, dump_dir);
    printf("%s, include dir %s\n", w16_nvrtc_version(), w16_nvrtc_include_dir());
    compile_all(&R, threads);
    TU_CHECK(R.compiled > 0 && R.n_units > 0);
    table_free(&R.bodies);
    for (int i = 0; i < R.n_units; i++) {
        free(R.units[i].text);
        free(R.units[i].names);
    }
    free(R.units);
    w16_buf_free(&R.text);
    w16_buf_free(&R.unit_names);
    w16_buf_free(&R.kernel);
    wna16_context_destroy(R.ctx);
    return tu_finish("test_nvrtc_repack_all");
}
